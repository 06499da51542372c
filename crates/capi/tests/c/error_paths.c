/*
 * Error paths of the jbdev C ABI, meant to run under AddressSanitizer
 * (built and run by crates/capi/tests/c_programs.rs).
 *
 * Every misuse a C caller can make without writing through a wild pointer
 * must give a negative errno and a message, never a crash, a leak or an
 * out-of-bounds access: NULL pointers, closed, forged and NULL handles,
 * out-of-range offsets, bad paths, a file that is not a volume, read-only
 * misuse, bad flags and options (zero intervals, sizes no file can have),
 * double commit, transactions too large, close racing writers, and a child
 * process opening a volume after fork().
 *
 * usage: error_paths WORKDIR   (an existing, writable directory)
 * Prints "error_paths: N checks passed" and exits 0, or names the first
 * failed check and exits 1.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define VOLUME_BYTES (64ULL << 20)

static char workdir[512];

static void path_in(char *out, size_t n, const char *name)
{
	snprintf(out, n, "%s/%s", workdir, name);
}

static void write_file(const char *path, size_t len, unsigned char byte)
{
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	CHECK(fd >= 0);
	unsigned char *buf = malloc(len);
	CHECK(buf != NULL);
	memset(buf, byte, len);
	CHECK(write(fd, buf, len) == (ssize_t)len);
	free(buf);
	close(fd);
}

static jbdev_volume *create_volume(const char *name, uint32_t read_only_after)
{
	char path[600];
	jbdev_format_options fo;
	jbdev_open_options oo;
	jbdev_volume *vol = NULL;

	path_in(path, sizeof path, name);
	CHECK_OK(jbdev_format_options_init(&fo));
	CHECK_OK(jbdev_open_options_init(&oo));
	fo.size_bytes = VOLUME_BYTES;
	/* Buffered I/O: the work directory may be on a file system without O_DIRECT. */
	oo.direct_io = 0;
	CHECK_OK(jbdev_create(path, &fo, &oo, &vol));
	CHECK(vol != NULL);
	if (read_only_after) {
		CHECK_OK(jbdev_close(vol));
		oo.read_only = 1;
		vol = NULL;
		CHECK_OK(jbdev_open(path, &oo, &vol));
		CHECK(vol != NULL);
	}
	return vol;
}

static void test_library_info(void)
{
	CHECK(jbdev_abi_version() == JBDEV_ABI_VERSION);
	CHECK(jbdev_version() != NULL && jbdev_version()[0] != '\0');
	/* The struct_size convention relies on these layouts. */
	CHECK(sizeof(jbdev_format_options) == 32);
	CHECK(sizeof(jbdev_open_options) == 64);
}

static void test_null_pointers(void)
{
	jbdev_volume *vol = (jbdev_volume *)0x1; /* must be reset to NULL on failure */
	jbdev_format_options fo;
	char path[600];

	path_in(path, sizeof path, "null.img");
	CHECK_ERR(jbdev_format_options_init(NULL), EINVAL);
	CHECK_ERR(jbdev_open_options_init(NULL), EINVAL);
	CHECK_ERR(jbdev_open(NULL, NULL, &vol), EINVAL);
	CHECK(vol == NULL);
	CHECK_ERR(jbdev_open(path, NULL, NULL), EINVAL);
	CHECK_ERR(jbdev_create(path, NULL, NULL, &vol), EINVAL);
	CHECK_OK(jbdev_format_options_init(&fo));
	fo.size_bytes = VOLUME_BYTES;
	CHECK_ERR(jbdev_create(NULL, &fo, NULL, &vol), EINVAL);
	CHECK_ERR(jbdev_create(path, &fo, NULL, NULL), EINVAL);
	CHECK(access(path, F_OK) != 0); /* nothing was created by the failed calls */

	/* NULL handles. */
	uint64_t u64;
	uint32_t u32;
	char buf[16];
	jbdev_txn *txn = NULL;
	jbdev_stats st;
	CHECK_ERR(jbdev_close(NULL), EBADF);
	CHECK_ERR(jbdev_size(NULL, &u64), EBADF);
	CHECK_ERR(jbdev_block_size(NULL, &u32), EBADF);
	CHECK_ERR(jbdev_max_transaction_bytes(NULL, &u64), EBADF);
	CHECK_ERR(jbdev_read(NULL, buf, sizeof buf, 0), EBADF);
	CHECK_ERR(jbdev_write(NULL, buf, sizeof buf, 0, 0), EBADF);
	CHECK_ERR(jbdev_flush(NULL), EBADF);
	CHECK_ERR(jbdev_trim(NULL, 0, 4096, 0), EBADF);
	CHECK_ERR(jbdev_write_zeroes(NULL, 0, 4096, 0), EBADF);
	CHECK_ERR(jbdev_get_stats(NULL, &st, sizeof st), EBADF);
	CHECK_ERR(jbdev_txn_begin(NULL, &txn), EBADF);
	CHECK(txn == NULL);
	CHECK_ERR(jbdev_txn_write(NULL, buf, sizeof buf, 0), EBADF);
	CHECK_ERR(jbdev_txn_write_zeroes(NULL, 0, 1), EBADF);
	CHECK_ERR(jbdev_txn_commit(NULL, 0), EBADF);
	CHECK_ERR(jbdev_txn_abort(NULL), EBADF);

	/* NULL out-pointers and buffers on a live volume. */
	vol = create_volume("nullargs.img", 0);
	CHECK_ERR(jbdev_size(vol, NULL), EINVAL);
	CHECK_ERR(jbdev_block_size(vol, NULL), EINVAL);
	CHECK_ERR(jbdev_max_transaction_bytes(vol, NULL), EINVAL);
	CHECK_ERR(jbdev_get_stats(vol, NULL, sizeof st), EINVAL);
	CHECK_ERR(jbdev_read(vol, NULL, 4096, 0), EINVAL);
	CHECK_ERR(jbdev_write(vol, NULL, 4096, 0, 0), EINVAL);
	CHECK_ERR(jbdev_txn_begin(vol, NULL), EINVAL);
	/* NULL is fine with length 0. */
	CHECK_OK(jbdev_read(vol, NULL, 0, 0));
	CHECK_OK(jbdev_write(vol, NULL, 0, 0, 0));
	CHECK_OK(jbdev_txn_begin(vol, &txn));
	CHECK_ERR(jbdev_txn_write(txn, NULL, 10, 0), EINVAL);
	CHECK_OK(jbdev_txn_abort(txn));
	CHECK_OK(jbdev_close(vol));
}

static void test_options(void)
{
	jbdev_format_options fo;
	jbdev_open_options oo;
	jbdev_volume *vol = NULL;
	char path[600];

	path_in(path, sizeof path, "options.img");
	CHECK_OK(jbdev_format_options_init(&fo));
	CHECK(fo.struct_size == sizeof fo);
	CHECK(fo.block_size == 4096);
	CHECK_OK(jbdev_open_options_init(&oo));
	CHECK(oo.struct_size == sizeof oo && oo.read_only == 0 && oo.direct_io == 1);

	/* size_bytes left at 0. */
	CHECK_ERR(jbdev_create(path, &fo, NULL, &vol), EINVAL);
	fo.size_bytes = VOLUME_BYTES;
	/* Not initialised: struct_size 0. */
	jbdev_format_options raw;
	memset(&raw, 0, sizeof raw);
	raw.size_bytes = VOLUME_BYTES;
	CHECK_ERR(jbdev_create(path, &raw, NULL, &vol), EINVAL);
	/* Bad enumerations and booleans. */
	oo.backend = 77;
	CHECK_ERR(jbdev_create(path, &fo, &oo, &vol), EINVAL);
	CHECK_OK(jbdev_open_options_init(&oo));
	oo.read_only = 2;
	CHECK_ERR(jbdev_open(path, &oo, &vol), EINVAL);
	CHECK_OK(jbdev_open_options_init(&oo));
	oo.batch_policy = 9;
	CHECK_ERR(jbdev_open(path, &oo, &vol), EINVAL);
	CHECK_OK(jbdev_open_options_init(&oo));
	oo.commit_mode = 9;
	CHECK_ERR(jbdev_open(path, &oo, &vol), EINVAL);

	/* A caller built against a newer header: a larger struct is accepted
	 * when the fields this library does not know are zero, refused with
	 * -E2BIG otherwise. */
	struct {
		jbdev_open_options base;
		uint64_t future_field;
	} newer;
	memset(&newer, 0, sizeof newer);
	CHECK_OK(jbdev_open_options_init(&newer.base));
	newer.base.struct_size = sizeof newer;
	newer.base.direct_io = 0;
	newer.future_field = 1;
	CHECK_ERR(jbdev_create(path, &fo, &newer.base, &vol), E2BIG);
	CHECK(vol == NULL);
	newer.future_field = 0;
	CHECK_OK(jbdev_create(path, &fo, &newer.base, &vol));
	CHECK_OK(jbdev_close(vol));

	/* A zero commit interval: refused (it used to hang the first write). */
	CHECK_OK(jbdev_open_options_init(&oo));
	oo.commit_interval_ms = 0;
	CHECK_ERR(jbdev_open(path, &oo, &vol), EINVAL);
	CHECK(vol == NULL);

	/* A size whose layout overflows: -EINVAL, the existing volume untouched
	 * (it used to grow the file and report a corrupt journal). */
	struct stat before, after;
	CHECK(stat(path, &before) == 0);
	fo.size_bytes = 0xFFFFFFFFFFFFF000ULL;
	CHECK_ERR(jbdev_create(path, &fo, NULL, &vol), EINVAL);
	fo.size_bytes = 0xFFFFFEFFFFFFF000ULL;
	CHECK_ERR(jbdev_create(path, &fo, NULL, &vol), EINVAL);
	CHECK(stat(path, &after) == 0 && after.st_size == before.st_size);
	CHECK_OK(jbdev_open(path, NULL, &vol));
	CHECK_OK(jbdev_close(vol));
}

static void test_bad_paths(void)
{
	jbdev_volume *vol = NULL;
	jbdev_format_options fo;
	jbdev_open_options oo;
	char path[600];

	jbdev_format_options_init(&fo);
	jbdev_open_options_init(&oo);
	fo.size_bytes = VOLUME_BYTES;
	oo.direct_io = 0;
	CHECK_ERR(jbdev_open("", &oo, &vol), EINVAL);
	CHECK_ERR(jbdev_create("", &fo, &oo, &vol), EINVAL);
	path_in(path, sizeof path, "no/such/dir/vol.img");
	CHECK_ERR(jbdev_open(path, &oo, &vol), ENOENT);
	CHECK(vol == NULL);
	CHECK_ERR(jbdev_create(path, &fo, &oo, &vol), ENOENT);
	path_in(path, sizeof path, "missing.img");
	CHECK_ERR(jbdev_open(path, &oo, &vol), ENOENT);
	/* A directory is not a volume. */
	CHECK(jbdev_open(workdir, &oo, &vol) < 0);
	CHECK(vol == NULL && jbdev_last_error()[0] != '\0');
}

static void test_not_a_volume(void)
{
	jbdev_volume *vol = NULL;
	jbdev_open_options oo;
	char path[600];

	jbdev_open_options_init(&oo);
	oo.direct_io = 0;
	/* Shorter than any superblock. */
	path_in(path, sizeof path, "tiny.bin");
	write_file(path, 100, 0xab);
	CHECK(jbdev_open(path, &oo, &vol) < 0);
	CHECK(vol == NULL);
	/* Big enough, but garbage. */
	path_in(path, sizeof path, "garbage.bin");
	write_file(path, 4 << 20, 0xab);
	int rc = jbdev_open(path, &oo, &vol);
	if (rc == 0)
		jbdev_close(vol);
	CHECK_ERR(rc, EUCLEAN);
	CHECK(vol == NULL);
	/* All zeroes: never formatted. */
	path_in(path, sizeof path, "zeroes.bin");
	write_file(path, 4 << 20, 0);
	rc = jbdev_open(path, &oo, &vol);
	if (rc == 0)
		jbdev_close(vol);
	CHECK_ERR(rc, EUCLEAN);
}

static void test_closed_and_forged_handles(void)
{
	jbdev_volume *vol = create_volume("closed.img", 0);
	jbdev_volume *other = create_volume("closed2.img", 0);
	jbdev_txn *txn = NULL;
	char buf[4096] = { 0 };
	uint64_t u64;

	CHECK_OK(jbdev_txn_begin(vol, &txn));
	CHECK_OK(jbdev_txn_write(txn, buf, sizeof buf, 0));
	CHECK_OK(jbdev_close(vol));
	CHECK_ERR(jbdev_close(vol), EBADF);
	CHECK_ERR(jbdev_read(vol, buf, sizeof buf, 0), EBADF);
	CHECK_ERR(jbdev_write(vol, buf, sizeof buf, 0, JBDEV_WRITE_FUA), EBADF);
	CHECK_ERR(jbdev_flush(vol), EBADF);
	CHECK_ERR(jbdev_size(vol, &u64), EBADF);
	CHECK_ERR(jbdev_trim(vol, 0, 4096, 0), EBADF);
	CHECK_ERR(jbdev_write_zeroes(vol, 0, 4096, 0), EBADF);
	/* The transaction outlives its volume only as an error. */
	CHECK_ERR(jbdev_txn_write(txn, buf, sizeof buf, 0), EBADF);
	CHECK_ERR(jbdev_txn_commit(txn, 0), EBADF);
	CHECK_ERR(jbdev_txn_abort(txn), EBADF);

	/* A new volume reusing the slot does not revive the old handle. */
	jbdev_volume *again = create_volume("closed3.img", 0);
	CHECK(again != vol);
	CHECK_ERR(jbdev_size(vol, &u64), EBADF);
	CHECK_OK(jbdev_size(again, &u64));

	/* Handles are tokens, never dereferenced: forged values are errors. */
	CHECK_ERR(jbdev_size((jbdev_volume *)(uintptr_t)0x12345, &u64), EBADF);
	CHECK_ERR(jbdev_size((jbdev_volume *)(uintptr_t)UINTPTR_MAX, &u64), EBADF);
	CHECK_ERR(jbdev_size((jbdev_volume *)buf, &u64), EBADF);
	CHECK_ERR(jbdev_txn_commit((jbdev_txn *)(uintptr_t)0x777, 0), EBADF);

	CHECK_OK(jbdev_close(again));
	CHECK_OK(jbdev_close(other));
}

static void test_out_of_range(void)
{
	jbdev_volume *vol = create_volume("range.img", 0);
	uint64_t size = 0;
	char buf[8192];

	memset(buf, 0x5a, sizeof buf);
	CHECK_OK(jbdev_size(vol, &size));
	CHECK(size == VOLUME_BYTES);
	CHECK_OK(jbdev_write(vol, buf, 100, size - 100, 0)); /* ends exactly at the end */
	CHECK_OK(jbdev_read(vol, buf, 100, size - 100));
	CHECK_ERR(jbdev_read(vol, buf, 101, size - 100), ENOSPC);
	CHECK_ERR(jbdev_write(vol, buf, 101, size - 100, 0), ENOSPC);
	CHECK_ERR(jbdev_read(vol, buf, 1, size), ENOSPC);
	CHECK_ERR(jbdev_write(vol, buf, sizeof buf, UINT64_MAX - 10, 0), ENOSPC);
	CHECK_ERR(jbdev_read(vol, buf, sizeof buf, UINT64_MAX), ENOSPC);
	CHECK_ERR(jbdev_trim(vol, size, 4096, 0), ENOSPC);
	CHECK_ERR(jbdev_write_zeroes(vol, size - 4096, 8192, 0), ENOSPC);
	CHECK_ERR(jbdev_write_zeroes(vol, UINT64_MAX, 2, 0), ENOSPC);
	/* A length no buffer can have reaches past the end like any other
	 * (it used to be -EINVAL "length ... is too large"), and a refused
	 * read leaves the buffer untouched (it used to be zeroed first). */
	CHECK_ERR(jbdev_read(vol, buf, SIZE_MAX, 0), ENOSPC);
	CHECK_ERR(jbdev_write(vol, buf, SIZE_MAX, 0, 0), ENOSPC);
	CHECK_ERR(jbdev_read(vol, buf, (SIZE_MAX >> 1) + 1, 4096), ENOSPC);
	CHECK_ERR(jbdev_read(vol, buf, 101, size - 100), ENOSPC);
	CHECK(buf[0] == 0x5a && buf[100] == 0x5a);
	jbdev_txn *txn = NULL;
	CHECK_OK(jbdev_txn_begin(vol, &txn));
	CHECK_ERR(jbdev_txn_write(txn, buf, SIZE_MAX, 0), ENOSPC);
	CHECK_OK(jbdev_txn_abort(txn));
	/* Unknown flag bits. */
	CHECK_ERR(jbdev_write(vol, buf, 10, 0, 0x80), EINVAL);
	CHECK_ERR(jbdev_trim(vol, 0, 4096, 0x2), EINVAL);
	CHECK_ERR(jbdev_write_zeroes(vol, 0, 4096, 0xffffffffu), EINVAL);
	/* The failed calls changed nothing. */
	char back[100];
	CHECK_OK(jbdev_read(vol, back, sizeof back, size - 100));
	for (size_t i = 0; i < sizeof back; i++)
		CHECK(back[i] == 0x5a);
	/* NO_HOLE is a flag of write-zeroes only. */
	CHECK_ERR(jbdev_write(vol, buf, 10, 0, JBDEV_ZERO_NO_HOLE), EINVAL);
	CHECK_OK(jbdev_write(vol, buf, 10, 0, 0));
	CHECK_OK(jbdev_write_zeroes(vol, 0, 4096, JBDEV_ZERO_NO_HOLE | JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_read(vol, back, 10, 0));
	for (size_t i = 0; i < 10; i++)
		CHECK(back[i] == 0);
	CHECK_OK(jbdev_close(vol));
}

static void test_read_only(void)
{
	jbdev_volume *vol = create_volume("ro.img", 1);
	jbdev_txn *txn = (jbdev_txn *)0x1;
	char buf[4096];

	CHECK_OK(jbdev_read(vol, buf, sizeof buf, 0));
	CHECK_ERR(jbdev_write(vol, buf, sizeof buf, 0, 0), EROFS);
	CHECK_ERR(jbdev_write(vol, buf, sizeof buf, 0, JBDEV_WRITE_FUA), EROFS);
	CHECK_ERR(jbdev_trim(vol, 0, 4096, 0), EROFS);
	CHECK_ERR(jbdev_write_zeroes(vol, 0, 4096, 0), EROFS);
	CHECK_ERR(jbdev_txn_begin(vol, &txn), EROFS);
	CHECK(txn == NULL);
	CHECK_OK(jbdev_close(vol));
}

/* A journal path for a volume whose journal is internal is refused, not
 * ignored (as `jbdev` refuses --journal there); create refuses it before
 * it creates anything. */
static void test_journal_path_of_internal_volume(void)
{
	jbdev_volume *vol = create_volume("internal.img", 0);
	jbdev_format_options fo;
	jbdev_open_options oo;
	char path[600], jpath[600];
	struct stat st;

	CHECK_OK(jbdev_close(vol));
	path_in(path, sizeof path, "internal.img");
	path_in(jpath, sizeof jpath, "internal.jnl");
	CHECK_OK(jbdev_open_options_init(&oo));
	oo.direct_io = 0;
	oo.journal_path = jpath;
	vol = (jbdev_volume *)0x1;
	CHECK_ERR(jbdev_open(path, &oo, &vol), EINVAL);
	CHECK(vol == NULL);
	CHECK(strstr(jbdev_last_error(), "internal") != NULL);
	CHECK(stat(jpath, &st) != 0 && errno == ENOENT);
	CHECK_OK(jbdev_format_options_init(&fo));
	fo.size_bytes = VOLUME_BYTES;
	path_in(path, sizeof path, "internal2.img");
	CHECK_ERR(jbdev_create(path, &fo, &oo, &vol), EINVAL);
	CHECK(vol == NULL);
	CHECK(stat(path, &st) != 0 && errno == ENOENT);
	/* Without it, both work. */
	oo.journal_path = NULL;
	CHECK_OK(jbdev_create(path, &fo, &oo, &vol));
	CHECK_OK(jbdev_close(vol));
}

static void test_transactions(void)
{
	jbdev_volume *vol = create_volume("txn.img", 0);
	jbdev_txn *txn = NULL;
	uint64_t size = 0, max = 0;
	char a[5000], b[300], back[5000];

	CHECK_OK(jbdev_size(vol, &size));
	CHECK_OK(jbdev_max_transaction_bytes(vol, &max));
	CHECK(max >= 65536);
	memset(a, 'a', sizeof a);
	memset(b, 'b', sizeof b);
	CHECK_OK(jbdev_write(vol, a, sizeof a, 1 << 20, 0)); /* to be zeroed */

	CHECK_OK(jbdev_txn_begin(vol, &txn));
	CHECK_OK(jbdev_txn_write(txn, a, sizeof a, 123));
	CHECK_ERR(jbdev_txn_write(txn, b, sizeof b, size - 10), ENOSPC);
	CHECK_ERR(jbdev_txn_write_zeroes(txn, size, 1), ENOSPC);
	CHECK_OK(jbdev_txn_write(txn, b, sizeof b, 70000)); /* still usable after errors */
	CHECK_OK(jbdev_txn_write_zeroes(txn, 1 << 20, 4096));
	/* Nothing visible before commit. */
	CHECK_OK(jbdev_read(vol, back, sizeof a, 123));
	CHECK(back[0] == 0 && back[sizeof a - 1] == 0);
	CHECK_ERR(jbdev_txn_commit(txn, 0x40), EINVAL); /* bad flags leave it open */
	CHECK_OK(jbdev_txn_commit(txn, JBDEV_WRITE_FUA));
	CHECK_ERR(jbdev_txn_commit(txn, 0), EBADF);
	CHECK_ERR(jbdev_txn_abort(txn), EBADF);
	CHECK_ERR(jbdev_txn_write(txn, b, sizeof b, 0), EBADF);
	CHECK_OK(jbdev_read(vol, back, sizeof a, 123));
	CHECK(memcmp(back, a, sizeof a) == 0);
	CHECK_OK(jbdev_read(vol, back, sizeof b, 70000));
	CHECK(memcmp(back, b, sizeof b) == 0);
	CHECK_OK(jbdev_read(vol, back, 4096, 1 << 20));
	for (int i = 0; i < 4096; i++)
		CHECK(back[i] == 0);
	CHECK_OK(jbdev_read(vol, back, 1, (1 << 20) + 4096));
	CHECK(back[0] == 'a');

	/* An aborted transaction applies nothing. */
	CHECK_OK(jbdev_txn_begin(vol, &txn));
	CHECK_OK(jbdev_txn_write(txn, b, sizeof b, 123));
	CHECK_OK(jbdev_txn_abort(txn));
	CHECK_OK(jbdev_read(vol, back, sizeof b, 123));
	CHECK(memcmp(back, a, sizeof b) == 0);

	/* Larger than one atomic transaction: refused while building. */
	if (max < size && max < (256ULL << 20)) {
		char *big = calloc(1, max + 4096);
		CHECK(big != NULL);
		CHECK_OK(jbdev_txn_begin(vol, &txn));
		CHECK_OK(jbdev_txn_write(txn, big, 4096, 0));
		/* max bytes one byte past a block boundary: one block more
		 * than fits beside block 0. */
		CHECK_ERR(jbdev_txn_write(txn, big, max, 4097), EFBIG);
		CHECK_OK(jbdev_txn_abort(txn));
		free(big);
	}

	/* Blocks, not bytes, count: one byte in each of max/4096 + 1 blocks
	 * fits (max bytes at any alignment touch that many), the next block
	 * does not; a block written twice counts once; zeroes count like
	 * writes. Before, the byte count let every extent in and the commit
	 * failed, losing them all. */
	uint64_t blocks = max / 4096 + 1;
	CHECK_OK(jbdev_txn_begin(vol, &txn));
	for (uint64_t i = 0; i < blocks; i++)
		CHECK_OK(jbdev_txn_write(txn, "q", 1, (2 << 20) + i * 4096));
	CHECK_OK(jbdev_txn_write(txn, "r", 1, (2 << 20) + 4095));
	CHECK_ERR(jbdev_txn_write(txn, "s", 1, (2 << 20) + blocks * 4096), EFBIG);
	CHECK_ERR(jbdev_txn_write_zeroes(txn, 0, size), EFBIG);
	CHECK_OK(jbdev_txn_commit(txn, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_read(vol, back, 1, (2 << 20) + (blocks - 1) * 4096));
	CHECK(back[0] == 'q');
	CHECK_OK(jbdev_read(vol, back, 1, (2 << 20) + 4095));
	CHECK(back[0] == 'r');
	CHECK_OK(jbdev_read(vol, back, 1, (2 << 20) + blocks * 4096));
	CHECK(back[0] == 0);
	CHECK_OK(jbdev_close(vol));
}

/* A child made with fork() after the parent did I/O can open and use a
 * volume (the parent's closed). The forking thread's io_uring ring belongs
 * to the parent; the child used to get -EEXIST from it on every I/O. */
static void test_fork(void)
{
	char path[600];
	jbdev_volume *vol = create_volume("fork.img", 0);
	char back[6] = { 0 };
	int status = 0;
	jbdev_open_options oo;

	CHECK_OK(jbdev_open_options_init(&oo));
	oo.direct_io = 0; /* as create_volume */
	path_in(path, sizeof path, "fork.img");
	CHECK_OK(jbdev_write(vol, "parent", 6, 0, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_read(vol, back, 6, 0));
	CHECK_OK(jbdev_close(vol));
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		jbdev_volume *v = NULL;
		char got[6] = { 0 };
		int rc = jbdev_open(path, &oo, &v);
		if (rc == 0)
			rc = jbdev_read(v, got, 6, 0);
		if (rc == 0 && memcmp(got, "parent", 6) != 0)
			rc = -EILSEQ;
		if (rc == 0)
			rc = jbdev_write(v, "child!", 6, 4096, JBDEV_WRITE_FUA);
		if (rc == 0)
			rc = jbdev_close(v);
		if (rc != 0)
			fprintf(stderr, "fork child: %d: %s\n", rc, jbdev_last_error());
		_exit(rc == 0 ? 0 : 1);
	}
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* And the parent goes on with its own ring. */
	CHECK_OK(jbdev_open(path, &oo, &vol));
	CHECK_OK(jbdev_read(vol, back, 6, 4096));
	CHECK(memcmp(back, "child!", 6) == 0);
	CHECK_OK(jbdev_close(vol));
}

static void *other_thread_error(void *arg)
{
	(void)arg;
	/* Fresh thread: no message yet; its error must not leak into main's. */
	if (jbdev_last_error()[0] != '\0')
		return (void *)1;
	if (jbdev_flush(NULL) != -EBADF)
		return (void *)2;
	if (strstr(jbdev_last_error(), "handle") == NULL)
		return (void *)3;
	return NULL;
}

static void test_last_error(void)
{
	jbdev_volume *vol = NULL;
	char small[8];
	char full[512];

	CHECK_ERR(jbdev_open(NULL, NULL, &vol), EINVAL);
	CHECK(strstr(jbdev_last_error(), "path") != NULL);
	size_t len = jbdev_last_error_copy(full, sizeof full);
	CHECK(len == strlen(jbdev_last_error()) && strcmp(full, jbdev_last_error()) == 0);
	memset(small, 'x', sizeof small);
	CHECK(jbdev_last_error_copy(small, sizeof small) == len);
	CHECK(small[7] == '\0' && strncmp(small, full, 7) == 0);
	CHECK(jbdev_last_error_copy(NULL, 0) == len);

	pthread_t t;
	void *result = (void *)99;
	CHECK(pthread_create(&t, NULL, other_thread_error, NULL) == 0);
	CHECK(pthread_join(t, &result) == 0);
	CHECK(result == NULL);
	CHECK(strcmp(full, jbdev_last_error()) == 0);
}

static void test_stats(void)
{
	jbdev_volume *vol = create_volume("stats.img", 0);
	jbdev_stats st;
	char buf[4096] = { 1 };

	CHECK_OK(jbdev_write(vol, buf, sizeof buf, 0, JBDEV_WRITE_FUA));
	memset(&st, 0xee, sizeof st);
	CHECK_OK(jbdev_get_stats(vol, &st, sizeof st));
	CHECK(st.struct_size == sizeof st);
	CHECK(st.journal_fill_ratio >= 0.0 && st.journal_fill_ratio <= 1.0);
	/* Version 2 fields: the FUA write was journaled, nothing went home
	   directly, nothing waited or paused. */
	CHECK(st.commits >= 1 && st.blocks_journaled >= 1);
	CHECK(st.direct_writes == 0 && st.direct_writes_uncopied == 0);
	CHECK(st.log_space_waits == 0 && st.paced_writes == 0 && st.pace_sleep_ms == 0);
	CHECK(st.locked_reads <= st.read_retries);
	CHECK(st.write_buffers_allocated + st.write_buffers_reused >= 1);
	/* Version 3 fields: a healthy volume. */
	CHECK(JBDEV_STATS_HAS(&st, store_full_attempts));
	CHECK(st.aborted == 0 && st.salvage_running == 0 && st.salvage_complete == 0);
	CHECK(st.store_full == 0 && st.salvaged_blocks == 0 && st.store_full_attempts == 0);
	/* A version-1 struct (up to direct_writes) gets only its own bytes. */
	memset(&st, 0xee, sizeof st);
	CHECK_OK(jbdev_get_stats(vol, &st, offsetof(jbdev_stats, checkpoint_blocks_skipped)));
	CHECK(st.struct_size == offsetof(jbdev_stats, checkpoint_blocks_skipped));
	CHECK(st.commits >= 1);
	CHECK(st.checkpoint_blocks_skipped == 0xeeeeeeeeeeeeeeeeULL);
	/* An older, smaller struct gets only its own bytes. */
	memset(&st, 0xee, sizeof st);
	CHECK_OK(jbdev_get_stats(vol, &st, 8));
	CHECK(st.struct_size == 8);
	CHECK(st.commits == 0xeeeeeeeeeeeeeeeeULL);
	/* Below the struct_size field: refused, as the header says. */
	CHECK_ERR(jbdev_get_stats(vol, &st, 0), EINVAL);
	CHECK_ERR(jbdev_get_stats(vol, &st, 2), EINVAL);
	CHECK_ERR(jbdev_get_stats(vol, &st, 3), EINVAL);
	CHECK_OK(jbdev_close(vol));
}

/* Close racing writers: every call either succeeds or gets -EBADF. */
#define RACE_THREADS 4
struct racer {
	jbdev_volume *vol;
	int index;
	atomic_int result; /* 0 ok, otherwise the unexpected rc */
	atomic_long ok_writes;
};

static void *race_writer(void *arg)
{
	struct racer *r = arg;
	char buf[4096];
	memset(buf, r->index, sizeof buf);
	/* Bounded: stops at -EBADF or after 200,000 writes. */
	for (int i = 0; i < 200000; i++) {
		int rc = jbdev_write(r->vol, buf, sizeof buf, (uint64_t)r->index * 4096,
				     (i % 8 == 0) ? JBDEV_WRITE_FUA : 0);
		if (rc == -EBADF)
			return NULL;
		if (rc != 0) {
			atomic_store(&r->result, rc);
			return NULL;
		}
		atomic_fetch_add(&r->ok_writes, 1);
	}
	return NULL;
}

static void test_close_while_in_use(void)
{
	jbdev_volume *vol = create_volume("race.img", 0);
	struct racer rs[RACE_THREADS];
	pthread_t ts[RACE_THREADS];

	for (int i = 0; i < RACE_THREADS; i++) {
		rs[i].vol = vol;
		rs[i].index = i;
		atomic_init(&rs[i].result, 0);
		atomic_init(&rs[i].ok_writes, 0);
		CHECK(pthread_create(&ts[i], NULL, race_writer, &rs[i]) == 0);
	}
	/* Let every writer get going (bounded wait), then close under them. */
	for (int spins = 0; spins < 2000; spins++) {
		int all = 1;
		for (int i = 0; i < RACE_THREADS; i++)
			all &= atomic_load(&rs[i].ok_writes) > 0;
		if (all)
			break;
		struct timespec ms = { 0, 1000000 };
		nanosleep(&ms, NULL);
	}
	CHECK_OK(jbdev_close(vol));
	for (int i = 0; i < RACE_THREADS; i++) {
		CHECK(pthread_join(ts[i], NULL) == 0);
		CHECK(atomic_load(&rs[i].result) == 0);
	}
	CHECK_ERR(jbdev_close(vol), EBADF);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: error_paths WORKDIR\n");
		return 2;
	}
	snprintf(workdir, sizeof workdir, "%s", argv[1]);

	test_library_info();
	test_last_error();
	test_null_pointers();
	test_options();
	test_bad_paths();
	test_closed_and_forged_handles();
	test_out_of_range();
	test_read_only();
	test_journal_path_of_internal_volume();
	test_transactions();
	test_stats();
	test_close_while_in_use();
	test_fork();
	test_not_a_volume(); /* last: needs the journaled engine's superblock check */
	printf("error_paths: %d checks passed\n", checks);
	return 0;
}
