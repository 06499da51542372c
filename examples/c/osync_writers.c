/*
 * osync_writers - the seed-000 experiment through the jbdev C library.
 *
 * The kernel test case: 64 threads share one block device opened with
 * O_DIRECT|O_SYNC, each rewriting its own 64 KiB region in a loop. Here each
 * thread rewrites its region with jbdev_write(..., JBDEV_WRITE_FUA), which
 * returns only once the data is durable: the same synchronous contract.
 * Prints MiB/s once a second and a total, then checks that every region
 * holds its thread's last pattern.
 *
 * usage: osync_writers [-t THREADS] [-d SECONDS] [-b REGION_BYTES]
 *                      [-s VOLUME_BYTES] [-c] [-B] PATH
 *   -t  writer threads (default 64)
 *   -d  run time in seconds (default 10)
 *   -b  bytes each thread rewrites per write (default 65536)
 *   -s  volume size when formatting (default: max(64 MiB, THREADS * REGION))
 *   -c  format PATH even if it exists (default: open it if it exists)
 *   -B  buffered I/O instead of O_DIRECT (for file systems without O_DIRECT)
 *   -K  kernel baseline: the seed's own loop, pwrite() on PATH opened
 *       O_DIRECT|O_SYNC (a plain file or device, NOT a jbdev volume: its
 *       contents are overwritten), for a side-by-side figure
 *
 * Exit status: 0 on success, 1 on a usage, library or verification error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jbdev.h"

/* One per thread, on its own cache line: the main thread sums them, so no
 * counter is shared by all writers (the seed-002 lesson). */
struct writer {
	_Alignas(64) _Atomic uint64_t bytes_written;
	_Atomic uint64_t writes;
	pthread_t tid;
	jbdev_volume *vol; /* NULL in kernel-baseline mode */
	int fd;            /* kernel-baseline mode: O_DIRECT|O_SYNC descriptor */
	uint64_t offset;
	size_t region_bytes;
	unsigned char pattern;
	int error; /* negative errno of the first failure, 0 if none */
	char message[256];
};

static atomic_int stop_flag;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	unsigned char *buf = aligned_alloc(4096, w->region_bytes);

	if (!buf) {
		w->error = -ENOMEM;
		snprintf(w->message, sizeof w->message, "out of memory");
		atomic_store(&stop_flag, 1);
		return NULL;
	}
	memset(buf, w->pattern, w->region_bytes);
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		if (w->vol) {
			int rc = jbdev_write(w->vol, buf, w->region_bytes, w->offset, JBDEV_WRITE_FUA);
			if (rc < 0) {
				w->error = rc;
				jbdev_last_error_copy(w->message, sizeof w->message);
				atomic_store(&stop_flag, 1);
				break;
			}
		} else {
			ssize_t n = pwrite(w->fd, buf, w->region_bytes, (off_t)w->offset);
			if (n != (ssize_t)w->region_bytes) {
				w->error = n < 0 ? -errno : -EIO;
				snprintf(w->message, sizeof w->message, "pwrite returned %zd", n);
				atomic_store(&stop_flag, 1);
				break;
			}
		}
		atomic_fetch_add_explicit(&w->bytes_written, w->region_bytes, memory_order_relaxed);
		atomic_fetch_add_explicit(&w->writes, 1, memory_order_relaxed);
	}
	free(buf);
	return NULL;
}

static uint64_t sum_bytes(struct writer *ws, int n, uint64_t *writes)
{
	uint64_t bytes = 0, count = 0;
	for (int i = 0; i < n; i++) {
		bytes += atomic_load_explicit(&ws[i].bytes_written, memory_order_relaxed);
		count += atomic_load_explicit(&ws[i].writes, memory_order_relaxed);
	}
	*writes = count;
	return bytes;
}

static int fail(const char *what, int rc)
{
	fprintf(stderr, "osync_writers: %s: %s (%s)\n", what, jbdev_last_error(), strerror(-rc));
	return 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: osync_writers [-t THREADS] [-d SECONDS] [-b REGION_BYTES] "
			"[-s VOLUME_BYTES] [-c] [-B] [-K] PATH\n");
}

int main(int argc, char **argv)
{
	long threads = 64, seconds = 10;
	unsigned long long region = 64 * 1024, volume_bytes = 0;
	int force_format = 0, buffered = 0, kernel = 0, opt;

	while ((opt = getopt(argc, argv, "t:d:b:s:cBKh")) != -1) {
		switch (opt) {
		case 't': threads = strtol(optarg, NULL, 10); break;
		case 'd': seconds = strtol(optarg, NULL, 10); break;
		case 'b': region = strtoull(optarg, NULL, 10); break;
		case 's': volume_bytes = strtoull(optarg, NULL, 10); break;
		case 'c': force_format = 1; break;
		case 'B': buffered = 1; break;
		case 'K': kernel = 1; break;
		default: usage(); return opt == 'h' ? 0 : 1;
		}
	}
	if (optind != argc - 1 || threads < 1 || threads > 4096 || seconds < 1 ||
	    seconds > 86400 || region < 1 || region > (64ULL << 20)) {
		usage();
		return 1;
	}
	const char *path = argv[optind];
	uint64_t needed = (uint64_t)threads * region;
	if (volume_bytes == 0)
		volume_bytes = needed > (64ULL << 20) ? needed : (64ULL << 20);
	/* Round up to the default 4 KiB block size. */
	volume_bytes = (volume_bytes + 4095) & ~4095ULL;

	jbdev_volume *vol = NULL;
	int fd = -1, rc;
	uint64_t size = 0;
	if (kernel) {
		fd = open(path, O_RDWR | O_CREAT | O_SYNC | (buffered ? 0 : O_DIRECT), 0644);
		if (fd < 0 || ftruncate(fd, (off_t)needed) != 0) {
			perror("osync_writers: open/ftruncate");
			return 1;
		}
		size = needed;
	} else {
		jbdev_open_options oo;
		jbdev_open_options_init(&oo);
		oo.direct_io = buffered ? 0 : 1;
		if (force_format || access(path, F_OK) != 0) {
			jbdev_format_options fo;
			jbdev_format_options_init(&fo);
			fo.size_bytes = volume_bytes;
			rc = jbdev_create(path, &fo, &oo, &vol);
			if (rc < 0)
				return fail("create", rc);
		} else {
			rc = jbdev_open(path, &oo, &vol);
			if (rc < 0)
				return fail("open", rc);
		}
		jbdev_size(vol, &size);
	}
	if (size < needed) {
		fprintf(stderr, "osync_writers: volume of %" PRIu64 " bytes is smaller than "
				"%ld threads x %llu bytes (use -c -s)\n", size, threads, region);
		jbdev_close(vol);
		return 1;
	}

	printf("osync_writers: %ld threads x %llu KiB regions, %s, %ld s, %s\n", threads,
	       region / 1024, kernel ? "kernel pwrite O_DIRECT|O_SYNC" : "jbdev FUA writes",
	       seconds, path);
	fflush(stdout);

	struct writer *ws = aligned_alloc(64, sizeof(*ws) * (size_t)threads);
	if (!ws)
		return 1;
	memset(ws, 0, sizeof(*ws) * (size_t)threads);
	double start = now_s();
	long started = 0;
	for (long i = 0; i < threads; i++) {
		ws[i].vol = vol;
		ws[i].fd = fd;
		ws[i].offset = (uint64_t)i * region;
		ws[i].region_bytes = region;
		ws[i].pattern = (unsigned char)(i * 7 + 1);
		if (pthread_create(&ws[i].tid, NULL, writer_main, &ws[i]) != 0) {
			fprintf(stderr, "osync_writers: pthread_create failed after %ld threads\n", i);
			atomic_store(&stop_flag, 1);
			break;
		}
		started++;
	}

	/* Sample once a second on absolute deadlines so the series does not drift. */
	uint64_t prev_bytes = 0, prev_writes = 0, writes = 0;
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (long s = 1; s <= seconds && !atomic_load(&stop_flag); s++) {
		next.tv_sec += 1;
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
		uint64_t bytes = sum_bytes(ws, (int)started, &writes);
		printf("%4lds %10.2f MiB/s %8" PRIu64 " writes/s\n", s,
		       (double)(bytes - prev_bytes) / (1024.0 * 1024.0), writes - prev_writes);
		fflush(stdout);
		prev_bytes = bytes;
		prev_writes = writes;
	}
	atomic_store(&stop_flag, 1);
	for (long i = 0; i < started; i++)
		pthread_join(ws[i].tid, NULL);
	double elapsed = now_s() - start;
	uint64_t total = sum_bytes(ws, (int)started, &writes);

	int status = 0;
	for (long i = 0; i < started; i++) {
		if (ws[i].error) {
			fprintf(stderr, "osync_writers: thread %ld: write failed: %s (%s)\n", i,
				ws[i].message, strerror(-ws[i].error));
			status = 1;
		}
	}
	printf("total: %.2f MiB in %.2f s = %.2f MiB/s, %" PRIu64 " writes, %ld threads\n",
	       (double)total / (1024.0 * 1024.0), elapsed,
	       (double)total / (1024.0 * 1024.0) / elapsed, writes, started);

	/* Every region must hold its own thread's pattern: catches lost or
	 * misplaced writes. */
	unsigned char *check = aligned_alloc(4096, (region + 4095) & ~4095ULL);
	for (long i = 0; check && status == 0 && i < started; i++) {
		if (ws[i].writes == 0)
			continue;
		if (kernel) {
			if (pread(fd, check, region, (off_t)ws[i].offset) != (ssize_t)region) {
				perror("osync_writers: pread");
				status = 1;
				break;
			}
		} else {
			rc = jbdev_read(vol, check, region, ws[i].offset);
			if (rc < 0) {
				status = fail("read back", rc);
				break;
			}
		}
		for (size_t j = 0; j < region; j++) {
			if (check[j] != ws[i].pattern) {
				fprintf(stderr, "osync_writers: region %ld byte %zu is %u, expected %u\n",
					i, j, check[j], ws[i].pattern);
				status = 1;
				break;
			}
		}
	}
	free(check);
	if (status == 0)
		printf("verify: %ld regions ok\n", started);

	if (kernel) {
		close(fd);
		free(ws);
		return status;
	}
	jbdev_stats st;
	if (jbdev_get_stats(vol, &st, sizeof st) == 0)
		printf("stats: commits %" PRIu64 " (%.1f blocks each), commit latency p50 %" PRIu64
		       " us p99 %" PRIu64 " us, checkpoints %" PRIu64 "\n",
		       st.commits, st.mean_transaction_blocks, st.commit_latency_us_p50,
		       st.commit_latency_us_p99, st.checkpoints);
	rc = jbdev_close(vol);
	if (rc < 0)
		status = fail("close", rc);
	free(ws);
	return status;
}
