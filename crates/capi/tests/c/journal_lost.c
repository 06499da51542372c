/*
 * What a C program sees when the external journal file of an open volume
 * is deleted (built and run by crates/capi/tests/c_programs.rs):
 *  - writes fail with -EIO and a message that says what happened and what
 *    to do (`jbdev journal reset`), never "close and reopen", and tells a
 *    C program where it can see the salvage (jbdev_get_stats);
 *  - jbdev_get_stats reports the abort and the salvage (aborted,
 *    salvage_running, salvage_complete, salvaged_blocks), and a caller
 *    built against the previous struct version gets none of those bytes;
 *  - jbdev_close says how the salvage ended.
 * The harness checks stderr: the salvage's log lines with JBDEV_LOG set,
 * nothing without.
 *
 * usage: journal_lost WORKDIR   (an existing, writable directory)
 * Prints "journal_lost: N checks passed" and exits 0, or names the first
 * failed check and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define BLOCKS 64

int main(int argc, char **argv)
{
	char img[600], jnl[600], msg[8192];
	jbdev_format_options fo;
	jbdev_open_options oo;
	jbdev_volume *vol = NULL;
	jbdev_stats st;
	char buf[4096];
	int rc = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: journal_lost WORKDIR\n");
		return 2;
	}
	snprintf(img, sizeof img, "%s/v.img", argv[1]);
	snprintf(jnl, sizeof jnl, "%s/v.jnl", argv[1]);
	CHECK_OK(jbdev_format_options_init(&fo));
	CHECK_OK(jbdev_open_options_init(&oo));
	fo.size_bytes = 64ULL << 20;
	fo.journal_bytes = 16ULL << 20;
	fo.journal_path = jnl;
	oo.direct_io = 0; /* the work directory may be on tmpfs */
	CHECK_OK(jbdev_create(img, &fo, &oo, &vol));
	/* Reopened: jbdev_open watches the external journal file. */
	CHECK_OK(jbdev_close(vol));
	CHECK_OK(jbdev_open(img, &oo, &vol));

	/* Acknowledged, durable, and in the journal only (a 16 MiB journal
	 * is far from its checkpoint threshold). */
	for (int i = 0; i < BLOCKS; i++) {
		memset(buf, 'A' + i % 26, sizeof buf);
		CHECK_OK(jbdev_write(vol, buf, sizeof buf, (uint64_t)i * 4096, JBDEV_WRITE_FUA));
	}
	memset(&st, 0xee, sizeof st);
	CHECK_OK(jbdev_get_stats(vol, &st, sizeof st));
	CHECK(st.struct_size == sizeof st);
	CHECK(JBDEV_STATS_HAS(&st, store_full_attempts));
	CHECK(st.aborted == 0 && st.salvage_running == 0 && st.salvage_complete == 0);
	CHECK(st.salvaged_blocks == 0 && st.store_full == 0 && st.store_full_attempts == 0);

	CHECK(unlink(jnl) == 0);
	/* The journal watch looks every 250 ms; bounded, not timed. */
	for (int i = 0; i < 20000; i++) {
		memset(buf, 'a' + i % 26, sizeof buf);
		rc = jbdev_write(vol, buf, sizeof buf, (uint64_t)(BLOCKS + i % 64) * 4096, 0);
		if (rc != 0)
			break;
		sleep_ms(1);
	}
	CHECK(rc == -EIO);
	snprintf(msg, sizeof msg, "%s", jbdev_last_error());
	printf("write error: %s\n", msg);
	CHECK(strstr(msg, "was deleted while the volume was open") != NULL);
	CHECK(strstr(msg, "jbdev journal reset") != NULL);
	CHECK(strstr(msg, "close and reopen") == NULL);
	CHECK(strstr(msg, "cannot be reopened") == NULL);
	CHECK(strstr(msg, "salvage_complete") != NULL);
	CHECK(jbdev_flush(vol) == -EIO);

	/* The salvage ends by itself (bounded wait). */
	for (int i = 0; i < 60000; i++) {
		CHECK_OK(jbdev_get_stats(vol, &st, sizeof st));
		if (!st.salvage_running)
			break;
		sleep_ms(1);
	}
	printf("stats: aborted %u salvage_running %u salvage_complete %u salvaged_blocks %llu\n",
	       st.aborted, st.salvage_running, st.salvage_complete,
	       (unsigned long long)st.salvaged_blocks);
	CHECK(st.aborted == 1);
	CHECK(st.salvage_running == 0);
	CHECK(st.salvage_complete == 1);
	CHECK(st.salvaged_blocks >= BLOCKS);
	CHECK(st.store_full == 0);
	/* The plain writes after the unlink: no commit covered them (the
	 * commit interval is seconds away), so the salvage counts them as
	 * lost instead of calling them durable. */
	CHECK(JBDEV_STATS_HAS(&st, salvage_uncommitted_blocks));
	CHECK(st.salvage_uncommitted_blocks >= 1 && st.salvage_uncommitted_blocks <= 64);

	/* A caller built against version 2 of the struct (up to
	 * write_buffer_pool_bytes) gets only its own bytes. */
	memset(&st, 0xee, sizeof st);
	CHECK_OK(jbdev_get_stats(vol, &st, offsetof(jbdev_stats, aborted)));
	CHECK(st.struct_size == offsetof(jbdev_stats, aborted));
	CHECK(!JBDEV_STATS_HAS(&st, aborted));
	CHECK(JBDEV_STATS_HAS(&st, write_buffer_pool_bytes));
	CHECK(st.aborted == 0xeeeeeeeeu && st.salvaged_blocks == 0xeeeeeeeeeeeeeeeeULL);

	/* Close: still an error (the journal is gone), saying how the
	 * salvage ended. */
	CHECK(jbdev_close(vol) == -EIO);
	snprintf(msg, sizeof msg, "%s", jbdev_last_error());
	printf("close error: %s\n", msg);
	CHECK(strstr(msg, "at close: the salvage is complete") != NULL);
	CHECK(strstr(msg, "every write committed before the journal failed (every write a flush or "
			  "FUA acknowledged) is on the volume") != NULL);
	CHECK(strstr(msg, "block(s) of writes no commit had made durable (plain writes no flush or "
			  "FUA had covered") != NULL);
	CHECK(strstr(msg, "never acknowledged) are lost") != NULL);
	printf("journal_lost: %d checks passed\n", checks);
	return 0;
}
