/*
 * A volume's life inside a C program (built and run by
 * crates/capi/tests/c_programs.rs). Session 22's adversarial pass:
 *
 * - fork: a child that used a handle it inherited wrote its own commit
 *   into the parent's journal (the parent lost a FUA-acknowledged write
 *   after a crash, 10 of 10 runs), hung, or panicked in close. Every call
 *   of a child on an inherited handle is now -EBADF, and the parent's
 *   volume is untouched.
 * - atexit: jbdev_close() from an atexit handler (the usual C way to close
 *   at exit; C++ static destructors run at the same point) found the
 *   thread's io_uring already destroyed by glibc, panicked, aborted the
 *   volume and lost every plain write its flush was to make durable.
 *
 * - grow: jbdev_grow's refusals, then a grown volume keeps its data.
 *
 * usage: lifecycle WORKDIR fork | atexit | check-atexit | grow
 * Prints "lifecycle: N checks passed" and exits 0, or names the first
 * failed check and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define VOLUME_BYTES (8ULL << 20)
#define BLOCKS 16

static char path[600];
static jbdev_volume *at_exit_vol;

static void fill(unsigned char *buf, size_t len, int seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (unsigned char)(seed * 31 + i % 251 + 1);
}

static void check_block(jbdev_volume *vol, uint64_t offset, int seed)
{
	unsigned char want[4096], got[4096];

	fill(want, sizeof want, seed);
	CHECK_OK(jbdev_read(vol, got, sizeof got, offset));
	CHECK(memcmp(want, got, sizeof got) == 0);
}

static jbdev_volume *create_volume(void)
{
	jbdev_format_options fo;
	jbdev_volume *vol = NULL;

	CHECK_OK(jbdev_format_options_init(&fo));
	fo.size_bytes = VOLUME_BYTES;
	CHECK_OK(jbdev_create(path, &fo, NULL, &vol));
	return vol;
}

/* Every call of the child on the parent's handles is -EBADF and says so. */
static void child(jbdev_volume *vol, jbdev_txn *txn)
{
	unsigned char buf[4096];
	jbdev_txn *other = NULL;
	uint64_t size;

	fill(buf, sizeof buf, 99);
#define CHILD_REFUSED(expr)                                                  \
	do {                                                                 \
		CHECK_ERR(expr, EBADF);                                      \
		CHECK(strstr(jbdev_last_error(), "parent process") != NULL); \
	} while (0)
	CHILD_REFUSED(jbdev_write(vol, buf, sizeof buf, 0, JBDEV_WRITE_FUA));
	CHILD_REFUSED(jbdev_write(vol, buf, sizeof buf, 8192, 0));
	CHILD_REFUSED(jbdev_flush(vol));
	CHILD_REFUSED(jbdev_read(vol, buf, sizeof buf, 0));
	CHILD_REFUSED(jbdev_size(vol, &size));
	CHILD_REFUSED(jbdev_txn_begin(vol, &other));
	CHILD_REFUSED(jbdev_txn_write(txn, buf, sizeof buf, 8192));
	CHILD_REFUSED(jbdev_txn_commit(txn, JBDEV_WRITE_FUA));
	CHILD_REFUSED(jbdev_close(vol));
#undef CHILD_REFUSED
	/* The child may open volumes of its own: a fresh one works. */
	char own[700];
	snprintf(own, sizeof own, "%s.child", path);
	jbdev_format_options fo;
	jbdev_volume *mine = NULL;
	CHECK_OK(jbdev_format_options_init(&fo));
	fo.size_bytes = VOLUME_BYTES;
	CHECK_OK(jbdev_create(own, &fo, NULL, &mine));
	CHECK_OK(jbdev_write(mine, buf, sizeof buf, 0, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_close(mine));
	printf("lifecycle child: %d checks passed\n", checks);
	fflush(stdout);
	_exit(0);
}

static void test_fork(void)
{
	jbdev_volume *vol = create_volume();
	jbdev_txn *txn = NULL;
	unsigned char buf[4096];
	int status = 0;

	fill(buf, sizeof buf, 1);
	CHECK_OK(jbdev_write(vol, buf, sizeof buf, 0, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_txn_begin(vol, &txn));
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0)
		child(vol, txn);
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* The parent's volume and transaction go on as if nothing happened. */
	check_block(vol, 0, 1);
	fill(buf, sizeof buf, 2);
	CHECK_OK(jbdev_txn_write(txn, buf, sizeof buf, 4096));
	CHECK_OK(jbdev_txn_commit(txn, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_close(vol));
	vol = NULL;
	CHECK_OK(jbdev_open(path, NULL, &vol));
	check_block(vol, 0, 1);
	check_block(vol, 4096, 2);
	CHECK_OK(jbdev_close(vol));
}

static void close_at_exit(void)
{
	int rc = jbdev_close(at_exit_vol);
	if (rc != 0) {
		fprintf(stderr, "lifecycle: jbdev_close in atexit returned %d: %s\n", rc,
			jbdev_last_error());
		_exit(1);
	}
}

/* Plain writes, then exit() with the close in an atexit handler. */
static void test_atexit(void)
{
	unsigned char buf[4096];

	at_exit_vol = create_volume();
	for (int i = 0; i < BLOCKS; i++) {
		fill(buf, sizeof buf, 10 + i);
		CHECK_OK(jbdev_write(at_exit_vol, buf, sizeof buf, (uint64_t)i * 4096, 0));
	}
	CHECK(atexit(close_at_exit) == 0);
}

static void check_atexit(void)
{
	jbdev_volume *vol = NULL;

	CHECK_OK(jbdev_open(path, NULL, &vol));
	for (int i = 0; i < BLOCKS; i++)
		check_block(vol, (uint64_t)i * 4096, 10 + i);
	CHECK_OK(jbdev_close(vol));
}

/*
 * jbdev_grow: refused while the volume is open (-EBUSY), for a shrink, a
 * partial block and an unknown flag (-EINVAL); then it grows the image
 * file, and the volume keeps its data and serves the added range.
 */
static void test_grow(void)
{
	jbdev_volume *vol = create_volume();
	unsigned char buf[4096], zero[4096];
	uint64_t size = 0;

	fill(buf, sizeof buf, 5);
	CHECK_OK(jbdev_write(vol, buf, sizeof buf, VOLUME_BYTES - 4096, JBDEV_WRITE_FUA));
	CHECK_ERR(jbdev_grow(path, 2 * VOLUME_BYTES, 0, &size), EBUSY);
	CHECK_OK(jbdev_close(vol));
	CHECK_ERR(jbdev_grow(path, VOLUME_BYTES / 2, 0, &size), EINVAL);
	CHECK_ERR(jbdev_grow(path, VOLUME_BYTES + 512, 0, &size), EINVAL);
	CHECK_ERR(jbdev_grow(path, 0, 0, &size), EINVAL);
	CHECK_ERR(jbdev_grow(path, 2 * VOLUME_BYTES, 0x80, &size), EINVAL);
	CHECK_ERR(jbdev_grow(NULL, 2 * VOLUME_BYTES, 0, &size), EINVAL);
	CHECK_OK(jbdev_grow(path, 2 * VOLUME_BYTES, JBDEV_GROW_PREALLOCATE, &size));
	CHECK(size == 2 * VOLUME_BYTES);
	CHECK_OK(jbdev_grow(path, 2 * VOLUME_BYTES, 0, NULL));
	vol = NULL;
	CHECK_OK(jbdev_open(path, NULL, &vol));
	CHECK_OK(jbdev_size(vol, &size));
	CHECK(size == 2 * VOLUME_BYTES);
	check_block(vol, VOLUME_BYTES - 4096, 5);
	CHECK_OK(jbdev_read(vol, buf, sizeof buf, VOLUME_BYTES));
	memset(zero, 0, sizeof zero);
	CHECK(memcmp(buf, zero, sizeof buf) == 0);
	fill(buf, sizeof buf, 6);
	CHECK_OK(jbdev_write(vol, buf, sizeof buf, 2 * VOLUME_BYTES - 4096, JBDEV_WRITE_FUA));
	CHECK_OK(jbdev_close(vol));
	vol = NULL;
	CHECK_OK(jbdev_open(path, NULL, &vol));
	check_block(vol, 2 * VOLUME_BYTES - 4096, 6);
	CHECK_OK(jbdev_close(vol));
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: lifecycle WORKDIR fork|atexit|check-atexit|grow\n");
		return 2;
	}
	snprintf(path, sizeof path, "%s/lifecycle-%s.img", argv[1],
		 strcmp(argv[2], "fork") == 0 ? "fork"
		 : strcmp(argv[2], "grow") == 0 ? "grow"
						 : "atexit");
	if (strcmp(argv[2], "fork") == 0)
		test_fork();
	else if (strcmp(argv[2], "atexit") == 0)
		test_atexit();
	else if (strcmp(argv[2], "check-atexit") == 0)
		check_atexit();
	else if (strcmp(argv[2], "grow") == 0)
		test_grow();
	else
		return 2;
	printf("lifecycle: %d checks passed\n", checks);
	return 0;
}
