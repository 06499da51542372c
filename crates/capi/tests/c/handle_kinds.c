/*
 * Handles of the wrong kind, and closes of handles never issued (built and
 * run by crates/capi/tests/c_programs.rs, in a process of its own, so the
 * handles are the first the library issues).
 *
 * Report 5 of session 21: volume and transaction handles were numbered
 * alike, so the first transaction handle was the first volume handle, and
 * jbdev_write() through a transaction handle wrote the volume. And a
 * jbdev_close() of a handle not issued yet (a transaction handle, garbage)
 * marked it as closing: the volume that later got it failed every call
 * with -EBADF. Bindings that keep handles as void * (ctypes c_void_p,
 * cffi, Go unsafe.Pointer) mix the two kinds up easily.
 *
 * usage: handle_kinds WORKDIR   (an existing, writable directory)
 * Prints "handle_kinds: N checks passed" and exits 0, or names the first
 * failed check and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

#define VOLUME_BYTES (8ULL << 20)

static char path[600];
static jbdev_open_options oo;

/* rc is -EBADF and the message says which kind was given and which expected. */
#define CHECK_WRONG_KIND(expr, given, expected)                                 \
	do {                                                                    \
		CHECK_ERR(expr, EBADF);                                         \
		CHECK(strstr(jbdev_last_error(), given " handle") != NULL);     \
		CHECK(strstr(jbdev_last_error(), expected " handle is expected") != NULL); \
	} while (0)

static void check_zero(jbdev_volume *vol, uint64_t offset)
{
	unsigned char back[4096];

	CHECK_OK(jbdev_read(vol, back, sizeof back, offset));
	for (size_t i = 0; i < sizeof back; i++)
		CHECK(back[i] == 0);
}

/* Formats the test volume afresh and opens it. */
static jbdev_volume *create_volume(void)
{
	jbdev_format_options fo;
	jbdev_volume *vol = NULL;

	CHECK_OK(jbdev_format_options_init(&fo));
	fo.size_bytes = VOLUME_BYTES;
	CHECK_OK(jbdev_create(path, &fo, &oo, &vol));
	return vol;
}

/* A transaction handle where a volume handle is expected, and the reverse,
 * is -EBADF and touches neither object. */
static void test_wrong_kind(void)
{
	jbdev_volume *vol = create_volume();
	jbdev_txn *txn = NULL, *other = NULL;
	jbdev_stats stats;
	unsigned char buf[4096];
	uint64_t u64;
	uint32_t u32;

	CHECK_OK(jbdev_txn_begin(vol, &txn));
	CHECK((void *)txn != (void *)vol);
	memset(buf, 0xee, sizeof buf);

	jbdev_volume *as_vol = (jbdev_volume *)(void *)txn;
	CHECK_WRONG_KIND(jbdev_write(as_vol, buf, sizeof buf, 0, 0), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_write(as_vol, buf, sizeof buf, 0, JBDEV_WRITE_FUA), "transaction",
			 "volume");
	CHECK_WRONG_KIND(jbdev_read(as_vol, buf, sizeof buf, 0), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_write_zeroes(as_vol, 0, 4096, 0), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_trim(as_vol, 0, 4096, 0), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_flush(as_vol), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_size(as_vol, &u64), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_block_size(as_vol, &u32), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_max_transaction_bytes(as_vol, &u64), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_get_stats(as_vol, &stats, sizeof stats), "transaction", "volume");
	CHECK_WRONG_KIND(jbdev_txn_begin(as_vol, &other), "transaction", "volume");
	CHECK(other == NULL);
	CHECK_WRONG_KIND(jbdev_close(as_vol), "transaction", "volume");

	jbdev_txn *as_txn = (jbdev_txn *)(void *)vol;
	memset(buf, 0xdd, sizeof buf);
	CHECK_WRONG_KIND(jbdev_txn_write(as_txn, buf, sizeof buf, 4096), "volume", "transaction");
	CHECK_WRONG_KIND(jbdev_txn_write_zeroes(as_txn, 0, 4096), "volume", "transaction");
	CHECK_WRONG_KIND(jbdev_txn_commit(as_txn, JBDEV_WRITE_FUA), "volume", "transaction");
	CHECK_WRONG_KIND(jbdev_txn_abort(as_txn), "volume", "transaction");

	/* Both objects are as they were: the volume holds nothing, and the
	 * transaction is open and commits. */
	check_zero(vol, 0);
	check_zero(vol, 4096);
	memset(buf, 0xcc, sizeof buf);
	CHECK_OK(jbdev_txn_write(txn, buf, sizeof buf, 8192));
	CHECK_OK(jbdev_txn_commit(txn, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_read(vol, buf, sizeof buf, 8192));
	CHECK(buf[0] == 0xcc && buf[sizeof buf - 1] == 0xcc);
	check_zero(vol, 0);
	CHECK_OK(jbdev_close(vol));
}

/* Opens the volume, writes through the new handle and closes it; returns
 * the handle it had. */
static uintptr_t check_open_works(int round)
{
	jbdev_volume *vol = NULL;
	uint64_t size = 0;
	unsigned char buf[16];

	memset(buf, round, sizeof buf);
	CHECK_OK(jbdev_open(path, &oo, &vol));
	CHECK_OK(jbdev_size(vol, &size));
	CHECK(size == VOLUME_BYTES);
	CHECK_OK(jbdev_write(vol, buf, sizeof buf, 0, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_flush(vol));
	CHECK_OK(jbdev_close(vol));
	return (uintptr_t)vol;
}

/* A close of a handle the library has not issued (yet) is -EBADF and
 * changes nothing: the volumes opened after it work. */
static void test_close_of_unissued_handles(void)
{
	jbdev_volume *vol = create_volume();
	jbdev_txn *txn = NULL;
	int round = 0;

	/* Transactions come and go faster than volumes: the last one's handle
	 * is one no volume has had yet. */
	for (int i = 0; i < 5; i++) {
		CHECK_OK(jbdev_txn_begin(vol, &txn));
		if (i < 4)
			CHECK_OK(jbdev_txn_abort(txn));
	}
	CHECK_OK(jbdev_close(vol));
	CHECK_ERR(jbdev_close((jbdev_volume *)(void *)txn), EBADF);
	uintptr_t prev = 0, last = 0;
	for (; round < 8; round++) {
		prev = last;
		last = check_open_works(round);
	}
	CHECK_OK(jbdev_txn_abort(txn));

	/* The next handle guessed from the last two, closed before it is
	 * issued (no volume is open, so it cannot name a live one). */
	for (; round < 16; round++) {
		uintptr_t guess = last + (last - prev);
		CHECK_ERR(jbdev_close((jbdev_volume *)guess), EBADF);
		prev = last;
		last = check_open_works(round);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: handle_kinds WORKDIR\n");
		return 2;
	}
	snprintf(path, sizeof path, "%s/handles.img", argv[1]);
	CHECK_OK(jbdev_open_options_init(&oo));
	/* Buffered I/O: the work directory may be on a file system without O_DIRECT. */
	oo.direct_io = 0;

	test_wrong_kind();
	test_close_of_unissued_handles();
	printf("handle_kinds: %d checks passed\n", checks);
	return 0;
}
