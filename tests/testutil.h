/*
 * testutil.h - the small harness every test program uses.
 *
 * A test is a program: exit 0 pass, 1 fail, 77 skip (STYLE.md 12).  CHECK()
 * reports the first failure with file, line and the failed expression and
 * exits 1; tests do not continue past a broken invariant.  Randomised tests
 * take their seed from $TEST_SEED (printed, so a failure can be replayed).
 */
#ifndef TESTUTIL_H
#define TESTUTIL_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "selene.h"

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
			test_fail_hook();                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define CHECKF(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);   \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			test_fail_hook();                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

/* rc must be 0 (or >= 0); otherwise print sel_strerror and sel_errmsg. */
#define CHECK_OK(expr)                                                                             \
	do {                                                                                       \
		long long rc_ = (long long)(expr);                                                 \
		if (rc_ < 0) {                                                                     \
			fprintf(stderr, "%s:%d: %s returned %lld (%s): %s\n", __FILE__, __LINE__,  \
				#expr, rc_, sel_strerror((int)rc_), sel_errmsg());                 \
			test_fail_hook();                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define CHECK_RC(expr, want)                                                                       \
	do {                                                                                       \
		long long rc_ = (long long)(expr), want_ = (long long)(want);                      \
		if (rc_ != want_) {                                                                \
			fprintf(stderr, "%s:%d: %s returned %lld (%s), want %lld: %s\n", __FILE__, \
				__LINE__, #expr, rc_, sel_strerror((int)rc_), want_,               \
				sel_errmsg());                                                     \
			test_fail_hook();                                                          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

#define SKIP(...)                                                                                  \
	do {                                                                                       \
		printf("skip: ");                                                                  \
		printf(__VA_ARGS__);                                                               \
		printf("\n");                                                                      \
		exit(77);                                                                          \
	} while (0)

/* Optional hook run before a failing exit (tests may set it to dump state). */
extern void (*test_fail_cb)(void);
void test_fail_hook(void);

/* Deterministic PRNG (xoshiro256**), seeded from $TEST_SEED or the time. */
typedef struct test_rng {
	uint64_t s[4];
} test_rng;
uint64_t test_seed(void); /* reads $TEST_SEED once, prints the seed used */
void test_rng_init(test_rng *r, uint64_t seed);
uint64_t test_rng_next(test_rng *r);
static inline uint64_t test_rng_below(test_rng *r, uint64_t n)
{
	return n ? test_rng_next(r) % n : 0;
}
void test_rng_fill(test_rng *r, void *buf, size_t len);

/* A fresh directory under $TEST_TMPDIR (or /tmp), removed by test_rmtree. */
char *test_mkdtemp(const char *tag);
int test_rmtree(const char *path);

/* The source tree: $SELENE_SRCDIR, else the first ancestor of the test
 * binary that holds cores/tiny.core. */
const char *test_srcdir(void);

/* Long runs (make soak) set SELENE_SOAK=1. */
bool test_soak(void);

/* Threads of this process named name (/proc/self/task/<tid>/comm): their
 * ids (up to cap) and count.  test_new_thread waits (up to 20 s) for one
 * not among before[0..n) and returns its id; test_wait_thread_gone waits
 * (up to 20 s) until that thread has ended: how a test knows that a thread
 * it cannot join (a detached one, say) is gone. */
int test_threads_named(const char *name, int *tids, int cap);
int test_new_thread(const char *name, const int *before, int n);
void test_wait_thread_gone(int tid);
/* TEST_UNTIL(cond, seconds): wait for cond, polled every 200 us, failing
 * the test after seconds.  The one condition wait of the C tests that have
 * no fixture of their own (storefx's SFX_UNTIL also polls a store). */
uint64_t test_deadline_ns(unsigned seconds);
bool test_wait_step(uint64_t deadline_ns); /* false once past it; else naps */
#define TEST_UNTIL(cond, seconds)                                                                  \
	do {                                                                                       \
		uint64_t tu_deadline_ = test_deadline_ns(seconds);                                 \
		while (!(cond))                                                                    \
			CHECKF(test_wait_step(tu_deadline_), "not reached in %u s: %s",            \
			       (unsigned)(seconds), #cond);                                        \
	} while (0)

/* Run fn(arg) in a child process, its stderr captured: true when the child
 * died of SIGABRT and what it wrote contains want (NULL: anything).  For
 * the builds whose module checkers abort (SEL_DEBUG_CHECKS). */
bool test_aborts(void (*fn)(void *), void *arg, const char *want);

/* What sel_store_describe says of a store's disk tier: its namespace
 * directory (NULL without one), its limit and the records its startup
 * scan kept. */
static inline const char *test_store_dir(sel_store *s)
{
	sel_store_info i;
	sel_store_describe(s, &i);
	return i.disk_dir;
}
static inline uint64_t test_store_limit(sel_store *s)
{
	sel_store_info i;
	sel_store_describe(s, &i);
	return i.disk_limit;
}
static inline uint64_t test_store_scanned(sel_store *s)
{
	sel_store_info i;
	sel_store_describe(s, &i);
	return i.scanned_records;
}

#endif
