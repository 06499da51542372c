/*
 * Checks shared by the C test programs of crates/capi/tests/c: each
 * counts its checks and, on the first that fails, names it with the
 * library's last error and exits 1.
 */
#ifndef JBDEV_TEST_CHECK_H
#define JBDEV_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jbdev.h"

static int checks;

#define CHECK(cond)                                                                  \
	do {                                                                         \
		checks++;                                                            \
		if (!(cond)) {                                                       \
			fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", \
				__FILE__, __LINE__, #cond, jbdev_last_error());      \
			exit(1);                                                     \
		}                                                                    \
	} while (0)

/* rc must be exactly -err and leave a non-empty message. */
#define CHECK_ERR(expr, err)                                                          \
	do {                                                                          \
		int rc_ = (expr);                                                     \
		checks++;                                                             \
		if (rc_ != -(err) || jbdev_last_error()[0] == '\0') {                 \
			fprintf(stderr, "%s:%d: %s returned %d (%s), expected -%s (%d); " \
					"last error: %s\n",                           \
				__FILE__, __LINE__, #expr, rc_, strerror(rc_ < 0 ? -rc_ : 0), \
				#err, -(err), jbdev_last_error());                    \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

#define CHECK_OK(expr)                                                                 \
	do {                                                                           \
		int rc_ = (expr);                                                      \
		checks++;                                                              \
		if (rc_ != 0) {                                                        \
			fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__,  \
				__LINE__, #expr, rc_, strerror(rc_ < 0 ? -rc_ : 0),    \
				jbdev_last_error());                                   \
			exit(1);                                                       \
		}                                                                      \
	} while (0)

static inline void sleep_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&t, NULL);
}

#endif
