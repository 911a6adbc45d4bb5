/*
 * test_copy_host.c - the host backend's copy paths (copy_host.c DESIGN):
 * memcpy, and streaming stores with SSE2 and AVX2 where the CPU has them.
 *
 * Covers, for every available kind and for AUTO:
 *   - every length from 0 to 600 and random lengths up to 300 KiB, at every
 *     source and destination offset within a 64-byte line: the bytes copied
 *     exactly, and the guard bytes before and after the destination (up to
 *     the next piece) untouched, so heads, bodies and tail bytes are right
 *     and nothing is written outside; lengths around whole 16 KiB blocks
 *     (the body streamed four 4 KiB quarters at a time) at offsets too;
 *   - calls of many pieces of mixed sizes (pieces below the streaming
 *     minimum among large ones), adjacent and scattered, none overlapping;
 *   - the kind each call reports: AUTO streams from 4 MiB up (when the CPU
 *     can) and copies smaller calls with memcpy; an unavailable kind falls
 *     back to memcpy;
 *   - copies landing while another thread reads them after the call (the
 *     sfence): a reader thread checks every byte once the writer says the
 *     call returned;
 *   - the helper that splits large calls (sel_host_lane_run): the mixed
 *     calls above through it, 200 calls in a row of a few chunks each, at
 *     least one chunk copied by the helper (not only its caller), its
 *     nice value (10 at least, as the transfer threads'), and the
 *     backend's rank 0 opening one exactly where the process has 2 CPUs.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdatomic.h>

#include "eos.h"
#include "testutil.h"
#include "transfer.h"

#define GUARD 0xa5

static const enum sel_host_copy kinds[] = {SEL_HOST_COPY_AUTO, SEL_HOST_COPY_MEMCPY,
					   SEL_HOST_COPY_STREAM_SSE2, SEL_HOST_COPY_STREAM_AVX2};
static const char *kind_name[] = {"auto", "memcpy", "sse2", "avx2"};

static void check_bytes(const uint8_t *dst, const uint8_t *src, size_t len, size_t before,
			size_t after, const char *what)
{
	for (size_t i = 0; i < before; i++)
		CHECKF(dst[(ptrdiff_t)i - (ptrdiff_t)before] == GUARD,
		       "%s: guard byte %zu before written", what, before - i);
	CHECKF(memcmp(dst, src, len) == 0, "%s: bytes differ", what);
	for (size_t i = 0; i < after; i++)
		CHECKF(dst[len + i] == GUARD, "%s: guard byte %zu after written", what, i);
}

/* One piece of len bytes at the given offsets within a line. */
static void one(uint8_t *sbuf, uint8_t *dbuf, size_t len, size_t so, size_t doff,
		enum sel_host_copy k, test_rng *rng)
{
	uint8_t *src = sbuf + 64 + so, *dst = dbuf + 64 + doff;
	test_rng_fill(rng, src, len);
	memset(dbuf, GUARD, len + 256);
	struct sel_copy c = {.dst = (uintptr_t)dst, .src = (uintptr_t)src, .len = len};
	(void)sel_host_copy_run(&c, 1, k);
	char what[96];
	snprintf(what, sizeof what, "%s: %zu bytes, source +%zu, destination +%zu", kind_name[k],
		 len, so, doff);
	check_bytes(dst, src, len, 64 + doff, 128 - doff, what);
}

static void test_pieces(test_rng *rng)
{
	size_t cap = 320 << 10;
	uint8_t *sbuf = eos_aligned_alloc(4096, cap + 256),
		*dbuf = eos_aligned_alloc(4096, cap + 512);
	CHECK(sbuf && dbuf);
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		if (!sel_host_copy_available(kinds[k])) {
			printf("%s: not on this CPU\n", kind_name[kinds[k]]);
			continue;
		}
		for (size_t len = 0; len <= 600; len++)
			for (size_t so = 0; so < 64; so += (len % 7) + 1)
				one(sbuf, dbuf, len, so, (so * 5 + len) % 64, kinds[k], rng);
		/* Bodies around whole blocks of four 4 KiB quarters (copy_host.c
		 * "Four quarters at once"): none, one, and one plus lines. */
		static const size_t quad[] = {
			16383, 16384, 16385,       16384 + 64,       16384 + 127,
			32767, 32768, 32768 + 191, 3 * 16384 + 4095, 5 * 16384 + 1};
		for (size_t q = 0; q < sizeof quad / sizeof quad[0]; q++)
			for (size_t so = 0; so < 64; so += 9)
				for (size_t doff = 0; doff < 64; doff += 13)
					one(sbuf, dbuf, quad[q], so, doff, kinds[k], rng);
		for (int i = 0; i < 300; i++) {
			size_t len = (size_t)test_rng_below(rng, cap - 128);
			one(sbuf, dbuf, len, (size_t)test_rng_below(rng, 64),
			    (size_t)test_rng_below(rng, 64), kinds[k], rng);
		}
	}
	eos_aligned_free(sbuf);
	eos_aligned_free(dbuf);
}

/* n pieces of mixed sizes into one buffer with gaps, from shuffled places;
 * through the helper when lane is not NULL (about 47 MB: 1 MiB chunks
 * begin and end inside pieces of every size). */
static void test_calls(test_rng *rng, struct sel_host_lane *lane)
{
	enum {
		N = 200
	};
	static const size_t sizes[] = {3,    100,       255,    256,         257,
				       2048, 4096 + 17, 131072, 131072 + 63, (2 << 20) + 5};
	size_t total = 0, len[N], soff[N], doff[N];
	for (int i = 0; i < N; i++) {
		len[i] = sizes[test_rng_below(rng, sizeof sizes / sizeof sizes[0])];
		total += len[i] + 128;
	}
	uint8_t *src = eos_aligned_alloc(4096, total), *dst = eos_aligned_alloc(4096, total);
	CHECK(src && dst);
	/* Destinations in order with 0..127-byte gaps (some adjacent); sources
	 * the same places, permuted. */
	size_t at = 0;
	for (int i = 0; i < N; i++) {
		at += (size_t)test_rng_below(rng, 3) == 0 ? 0 : (size_t)test_rng_below(rng, 128);
		doff[i] = at;
		at += len[i];
	}
	CHECK(at <= total);
	size_t perm[N];
	for (int i = 0; i < N; i++)
		perm[i] = (size_t)i;
	for (int i = N - 1; i > 0; i--) {
		size_t j = (size_t)test_rng_below(rng, (uint64_t)i + 1), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	at = 0;
	for (int i = 0; i < N; i++) {
		size_t p = perm[i];
		at += (size_t)test_rng_below(rng, 64);
		soff[p] = at;
		at += len[p];
	}
	CHECK(at <= total);
	struct sel_copy c[N];
	for (int i = 0; i < N; i++)
		c[i] = (struct sel_copy){.dst = (uintptr_t)(dst + doff[i]),
					 .src = (uintptr_t)(src + soff[i]),
					 .len = len[i]};
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		test_rng_fill(rng, src, total);
		memset(dst, GUARD, total);
		enum sel_host_copy used = lane ? sel_host_lane_run(lane, c, N, kinds[k])
					       : sel_host_copy_run(c, N, kinds[k]);
		if (!sel_host_copy_available(kinds[k]))
			CHECK(used == SEL_HOST_COPY_MEMCPY);
		else if (kinds[k] != SEL_HOST_COPY_AUTO)
			CHECK(used == kinds[k]);
		size_t end = 0;
		for (int i = 0; i < N; i++) {
			for (size_t g = end; g < doff[i]; g++)
				CHECKF(dst[g] == GUARD, "%s: gap byte %zu written",
				       kind_name[kinds[k]], g);
			CHECKF(memcmp(dst + doff[i], src + soff[i], len[i]) == 0,
			       "%s: piece %d of %zu bytes", kind_name[kinds[k]], i, len[i]);
			end = doff[i] + len[i];
		}
	}
	eos_aligned_free(src);
	eos_aligned_free(dst);
}

static void test_choice(void)
{
	bool stream = sel_host_copy_available(SEL_HOST_COPY_STREAM_SSE2);
	CHECK(sel_host_copy_available(SEL_HOST_COPY_AUTO) &&
	      sel_host_copy_available(SEL_HOST_COPY_MEMCPY));
	CHECK(sel_host_copy_choose(0) == SEL_HOST_COPY_MEMCPY);
	CHECK(sel_host_copy_choose((4u << 20) - 1) == SEL_HOST_COPY_MEMCPY);
	enum sel_host_copy big = sel_host_copy_choose(4u << 20);
	if (!stream)
		CHECK(big == SEL_HOST_COPY_MEMCPY);
	else
		CHECK(big == (sel_host_copy_available(SEL_HOST_COPY_STREAM_AVX2)
				      ? SEL_HOST_COPY_STREAM_AVX2
				      : SEL_HOST_COPY_STREAM_SSE2));
	CHECK(sel_host_copy_choose(1ull << 40) == big);
	printf("this CPU: calls of 4 MiB and more use %s\n", kind_name[big]);

	/* AUTO as the backend calls it: two pieces summing to 4 MiB stream. */
	size_t n = 2u << 20;
	uint8_t *a = eos_aligned_alloc(4096, 2 * n), *b = eos_aligned_alloc(4096, 2 * n);
	CHECK(a && b);
	memset(a, 7, 2 * n);
	struct sel_copy c[2] = {{(uintptr_t)b, (uintptr_t)a, n},
				{(uintptr_t)(b + n), (uintptr_t)(a + n), n - 1}};
	CHECK(sel_host_copy_run(c, 2, SEL_HOST_COPY_AUTO) == SEL_HOST_COPY_MEMCPY);
	c[1].len = n;
	CHECK(sel_host_copy_run(c, 2, SEL_HOST_COPY_AUTO) == big);
	CHECK(memcmp(a, b, 2 * n) == 0);
	/* No pieces at all. */
	CHECK(sel_host_copy_run(c, 0, SEL_HOST_COPY_AUTO) == SEL_HOST_COPY_MEMCPY);
	eos_aligned_free(a);
	eos_aligned_free(b);
}

/* One call of a few MiB through the lane, checked; true once the helper
 * has copied a chunk of any call. */
static bool lane_call(struct sel_host_lane *lane, uint8_t *src, uint8_t *dst, size_t cap,
		      test_rng *rng)
{
	enum {
		N = 5
	};
	struct sel_copy c[N];
	size_t at = 0;
	for (int i = 0; i < N; i++) {
		size_t len = (size_t)test_rng_below(rng, cap / N - 64);
		c[i] = (struct sel_copy){.dst = (uintptr_t)(dst + at),
					 .src = (uintptr_t)(src + cap - at - len),
					 .len = len};
		at += len + (size_t)test_rng_below(rng, 64);
	}
	test_rng_fill(rng, src, cap);
	memset(dst, GUARD, cap);
	(void)sel_host_lane_run(lane, c, N, kinds[test_rng_below(rng, 4)]);
	size_t end = 0;
	for (int i = 0; i < N; i++) {
		uint8_t *d = (uint8_t *)(uintptr_t)c[i].dst;
		for (uint8_t *g = dst + end; g < d; g++)
			CHECKF(*g == GUARD, "lane: gap byte %zu written", (size_t)(g - dst));
		CHECKF(memcmp(d, (const void *)(uintptr_t)c[i].src, c[i].len) == 0,
		       "lane: piece %d of %" PRIu64 " bytes", i, c[i].len);
		end = (size_t)(d - dst) + c[i].len;
	}
	return sel_host_lane_helped(lane) > 0;
}

/* The helper: every kind byte-exact through it (test_calls), many calls
 * in a row (each a new generation of chunks), the helper's share real,
 * and the backend's ranks get one where the CPUs allow. */
static void test_lane(test_rng *rng)
{
	struct sel_host_lane *lane;
	int tid;
	CHECK_OK(sel_host_lane_open(&lane));
	/* It runs at the transfer threads' priority (nice 10 at least). */
	TEST_UNTIL(test_threads_named("sel-xfer-lane", &tid, 1) == 1, 60);
	int nice = 0;
	TEST_UNTIL(
		(errno = 0, nice = getpriority(PRIO_PROCESS, (id_t)tid), errno == 0 && nice >= 10),
		60);
	test_calls(rng, lane);
	size_t cap = 6u << 20;
	uint8_t *src = eos_aligned_alloc(4096, cap), *dst = eos_aligned_alloc(4096, cap);
	CHECK(src && dst);
	for (int i = 0; i < 200; i++)
		(void)lane_call(lane, src, dst, cap, rng);
	/* The helper wakes at nice 10: on a loaded machine the caller may
	 * take every chunk of many calls. */
	TEST_UNTIL(lane_call(lane, src, dst, cap, rng), 60);
	printf("lane: the helper copied %" PRIu64 " chunks\n", sel_host_lane_helped(lane));
	sel_host_lane_close(lane);
	sel_host_lane_close(NULL);

	/* Through the backend: rank 0 splits where the process has 3 CPUs
	 * (two copy threads and the model worker's). */
	const struct sel_copy_backend *be = &sel_copy_backend_host;
	void *st;
	cpu_set_t set;
	CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
	CHECK_OK(be->open_rank(be->ctx, 0, &st));
	CHECK((st != NULL) == (CPU_COUNT(&set) >= 3));
	size_t big = 9u << 20;
	uint8_t *a = eos_aligned_alloc(4096, big), *b = eos_aligned_alloc(4096, big);
	CHECK(a && b);
	test_rng_fill(rng, a, big);
	struct sel_copy one = {(uintptr_t)b, (uintptr_t)a + 1, big - 1};
	CHECK_OK(be->copy(st, &one, 1, SEL_COPY_OUT));
	CHECK(memcmp(b, a + 1, big - 1) == 0);
	be->close_rank(st);
	eos_aligned_free(a);
	eos_aligned_free(b);
	eos_aligned_free(src);
	eos_aligned_free(dst);
}

/* Visibility: a second thread reads every byte as soon as the call
 * returned (the streaming stores were fenced). */
struct vis {
	uint8_t *dst;
	size_t len;
	atomic_int round, seen;
	atomic_int bad;
};

static void *reader(void *arg)
{
	struct vis *v = arg;
	for (int r = 1; r <= 20; r++) {
		uint64_t end = eos_now_ns() + 60000000000ull;
		while (atomic_load_explicit(&v->round, memory_order_acquire) < r &&
		       eos_now_ns() < end)
			sched_yield();
		for (size_t i = 0; i < v->len; i += 61)
			if (v->dst[i] != (uint8_t)r)
				atomic_fetch_add(&v->bad, 1);
		atomic_store_explicit(&v->seen, r, memory_order_release);
	}
	return NULL;
}

static void test_visibility(void)
{
	struct vis v = {.len = 8u << 20};
	uint8_t *src = eos_aligned_alloc(4096, v.len);
	v.dst = eos_aligned_alloc(4096, v.len);
	CHECK(src && v.dst);
	memset(v.dst, 0, v.len);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, reader, &v) == 0);
	for (int r = 1; r <= 20; r++) {
		memset(src, r, v.len);
		struct sel_copy c = {(uintptr_t)v.dst, (uintptr_t)src, v.len};
		(void)sel_host_copy_run(&c, 1, SEL_HOST_COPY_AUTO);
		atomic_store_explicit(&v.round, r, memory_order_release);
		uint64_t end = eos_now_ns() + 60000000000ull;
		while (atomic_load_explicit(&v.seen, memory_order_acquire) < r)
			CHECKF(eos_now_ns() < end && sched_yield() == 0, "reader stuck in round %d",
			       r);
	}
	pthread_join(t, NULL);
	CHECK(atomic_load(&v.bad) == 0);
	eos_aligned_free(src);
	eos_aligned_free(v.dst);
}

int main(void)
{
	test_rng rng;
	test_rng_init(&rng, test_seed());
	test_choice();
	test_pieces(&rng);
	test_calls(&rng, NULL);
	test_lane(&rng);
	test_visibility();
	printf("ok\n");
	return 0;
}
