/*
 * A full backing store as a C program sees it (built and run by
 * crates/capi/tests/c_programs.rs on a small tmpfs): what jbdev.h says.
 * Writes that need space fail with -ENOSPC, the volume is not aborted
 * (jbdev_stats: store_full = 1, aborted = 0), reads and flushes work, and
 * once space is freed the same handle writes again, with no reopen.
 * Nothing acknowledged is lost: every block reads back after a reopen.
 *
 * usage: store_full DIR FILLER   (DIR on a small file system; FILLER a
 * file there whose deletion frees space)
 * Prints "store_full: N checks passed" and exits 0, or names the first
 * failed check and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define BS 4096
#define VOLUME_BYTES (64ULL << 20)

/* Block i's content: its number, then a byte of its own. */
static void fill(char *buf, uint64_t i)
{
	memset(buf, (int)(i % 251) + 1, BS);
	memcpy(buf, &i, sizeof i);
}

int main(int argc, char **argv)
{
	char img[600], buf[BS], back[BS];
	jbdev_format_options fo;
	jbdev_open_options oo;
	jbdev_volume *vol = NULL;
	jbdev_stats st;
	uint64_t acked = 0, blocks = VOLUME_BYTES / BS;
	int rc = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: store_full DIR FILLER\n");
		return 2;
	}
	snprintf(img, sizeof img, "%s/v.img", argv[1]);
	CHECK_OK(jbdev_format_options_init(&fo));
	CHECK_OK(jbdev_open_options_init(&oo));
	fo.size_bytes = VOLUME_BYTES;
	fo.journal_bytes = 4ULL << 20; /* allocated at create */
	oo.direct_io = 0;              /* tmpfs */
	CHECK_OK(jbdev_create(img, &fo, &oo, &vol));

	/* Journaled FUA writes, each acknowledged durable, until the
	 * checkpoint cannot take them home and the journal is full. */
	for (; acked < blocks; acked++) {
		fill(buf, acked);
		rc = jbdev_write(vol, buf, BS, acked * BS, JBDEV_WRITE_FUA);
		if (rc != 0)
			break;
	}
	printf("acknowledged %llu block(s), then: %d %s\n", (unsigned long long)acked, rc,
	       jbdev_last_error());
	CHECK(rc == -ENOSPC);
	CHECK(strstr(jbdev_last_error(), "backing store is full") != NULL);
	CHECK(acked > 0 && acked < blocks);
	CHECK_OK(jbdev_get_stats(vol, &st, sizeof st));
	CHECK(st.store_full == 1 && st.store_full_attempts >= 1);
	CHECK(st.aborted == 0);
	/* Reads and flushes keep working. */
	CHECK_OK(jbdev_read(vol, back, BS, 0));
	fill(buf, 0);
	CHECK(memcmp(buf, back, BS) == 0);
	CHECK_OK(jbdev_flush(vol));

	/* Space freed: the same handle writes again (the checkpoint retries
	 * by itself; bounded wait, -ENOSPC meanwhile). */
	CHECK(unlink(argv[2]) == 0);
	fill(buf, acked);
	for (int i = 0; i < 60000; i++) {
		rc = jbdev_write(vol, buf, BS, acked * BS, JBDEV_WRITE_FUA);
		if (rc != -ENOSPC)
			break;
		sleep_ms(1);
	}
	CHECK_OK(rc);
	acked++;
	for (int i = 0; i < 16 && acked < blocks; i++, acked++) {
		fill(buf, acked);
		CHECK_OK(jbdev_write(vol, buf, BS, acked * BS, JBDEV_WRITE_FUA));
	}
	CHECK_OK(jbdev_get_stats(vol, &st, sizeof st));
	CHECK(st.aborted == 0);
	CHECK_OK(jbdev_close(vol));

	/* Every acknowledged block is there after a reopen. */
	CHECK_OK(jbdev_open(img, &oo, &vol));
	for (uint64_t i = 0; i < acked; i++) {
		fill(buf, i);
		CHECK_OK(jbdev_read(vol, back, BS, i * BS));
		CHECK(memcmp(buf, back, BS) == 0);
	}
	CHECK_OK(jbdev_close(vol));
	printf("store_full: %d checks passed\n", checks);
	return 0;
}
