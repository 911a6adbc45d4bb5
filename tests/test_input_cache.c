/*
 * test_input_cache.c - the in-memory tier of CPU input records
 * (src/selene/input_cache.c, design 2.13 and design 1's one eighth of the
 * warm budget): the budget, LRU eviction within it, leases that stay
 * charged and are never evicted, records too big to retain, one
 * preparation shared by concurrent lookups of the same key, failures,
 * timeouts and the notify hook.  The checker runs after every mutation.
 */
#include <pthread.h>

#include "eos.h"
#include "input_cache.h"
#include "inpututil.h"
#include "testutil.h"

#define key_of test_input_key
#define make test_input_prepared

static void check(sel_input_cache *c) { CHECK_OK(sel_input_cache_check(c)); }

/* Look up n; on a miss build and publish it.  Returns the lookup result and
 * leaves the lease in *l. */
static int get(sel_input_cache *c, uint32_t n, uint64_t bytes, sel_input_lease **l)
{
	sel_input_key k = key_of(n);
	int rc = sel_input_cache_lookup(c, SEL_INPUT_PREPARED, &k, l);
	CHECK_OK(rc);
	check(c);
	if (rc == SEL_INPUT_MISS) {
		sel_input_rec r;
		make(&r, n, bytes);
		CHECK_OK(sel_input_cache_publish(c, *l, &r));
		CHECK(r.bytes == NULL);
		check(c);
	}
	return rc;
}

static void test_budget(void)
{
	CHECK(sel_input_budget(8ull << 30, true) == 1ull << 30);
	CHECK(sel_input_budget(100000, true) == 12288); /* 12500 rounded down to 4 KiB */
	CHECK(sel_input_budget(8ull << 30, false) == 0);
	CHECK(sel_input_budget(4095 * 8, true) == 0);
}

static void test_lru(void)
{
	const uint64_t payload = 1000;
	sel_input_rec probe;
	make(&probe, 0, payload);
	const uint64_t charge = probe.len + SEL_INPUT_ENTRY_OVERHEAD;
	sel_input_rec_free(&probe);
	sel_input_cache *c;
	CHECK_OK(sel_input_cache_create(10 * charge + charge / 2, &c));
	sel_input_lease *l;
	struct sel_input_cache_stats st;
	for (uint32_t n = 0; n < 30; n++) {
		CHECK_RC(get(c, n, payload, &l), SEL_INPUT_MISS);
		const sel_input_rec *r = sel_input_lease_rec(l);
		CHECK(r && r->h.tensors[0].bytes == payload &&
		      sel_input_data(r, 0)[7] == (uint8_t)(91 + n));
		sel_input_cache_release(c, l);
		check(c);
		/* Keep 0 recently used: it must survive everything. */
		CHECK_RC(get(c, 0, payload, &l), SEL_INPUT_HIT);
		sel_input_cache_release(c, l);
		sel_input_cache_stats(c, &st);
		CHECK(st.bytes <= st.budget && st.entries <= 10);
	}
	sel_input_cache_stats(c, &st);
	CHECK(st.entries == 10 && st.bytes == 10 * charge && st.evictions == 20);
	/* The 9 most recent others and 0 are there; older ones are gone. */
	for (uint32_t n = 21; n < 30; n++) {
		CHECK_RC(get(c, n, payload, &l), SEL_INPUT_HIT);
		sel_input_cache_release(c, l);
	}
	CHECK_RC(get(c, 0, payload, &l), SEL_INPUT_HIT);
	sel_input_cache_release(c, l);
	CHECK_RC(get(c, 5, payload, &l), SEL_INPUT_MISS); /* evicted long ago; back now */
	sel_input_cache_release(c, l);
	check(c);

	/* Leased entries are never evicted and stay charged: lease all ten,
	 * then a new record cannot be retained (but its owner gets it). */
	sel_input_lease *held[10];
	uint32_t ids[10] = {0, 5, 22, 23, 24, 25, 26, 27, 28, 29};
	for (int i = 0; i < 10; i++)
		CHECK_RC(get(c, ids[i], payload, &held[i]), SEL_INPUT_HIT);
	sel_input_cache_stats(c, &st);
	CHECK(st.leased == 10);
	CHECK_RC(get(c, 100, payload, &l), SEL_INPUT_MISS);
	CHECK(sel_input_lease_rec(l) && sel_input_data(sel_input_lease_rec(l), 0)[1] == 113);
	sel_input_cache_stats(c, &st);
	CHECK(st.not_retained == 1 && st.entries == 10 && st.bytes == 10 * charge);
	sel_input_cache_release(c, l);
	check(c);
	for (int i = 0; i < 10; i++) {
		CHECK(sel_input_lease_rec(held[i]) != NULL);
		sel_input_cache_release(c, held[i]);
	}
	check(c);
	CHECK_RC(get(c, 100, payload, &l), SEL_INPUT_MISS); /* it was not retained */
	sel_input_cache_release(c, l);

	/* A record bigger than the whole budget is handed over, not kept. */
	CHECK_RC(get(c, 200, 20 * payload, &l), SEL_INPUT_MISS);
	CHECK(sel_input_lease_rec(l) != NULL);
	sel_input_cache_release(c, l);
	sel_input_cache_stats(c, &st);
	CHECK(st.not_retained == 2 && st.bytes <= st.budget);
	check(c);

	/* put: retained if it fits; an entry already there wins. */
	sel_input_rec r;
	make(&r, 300, payload);
	CHECK_OK(sel_input_cache_put(c, &r));
	CHECK(r.bytes == NULL);
	make(&r, 300, payload);
	CHECK_OK(sel_input_cache_put(c, &r));
	CHECK_RC(get(c, 300, payload, &l), SEL_INPUT_HIT);
	sel_input_cache_release(c, l);
	check(c);
	sel_input_cache_destroy(c);

	/* Budget zero (host retention off): nothing is kept, yet concurrent
	 * lookups still share a preparation. */
	CHECK_OK(sel_input_cache_create(0, &c));
	sel_input_lease *a, *b;
	sel_input_key k = key_of(1);
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_PREPARED, &k, &a), SEL_INPUT_MISS);
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_PREPARED, &k, &b), SEL_INPUT_WAIT);
	CHECK_RC(sel_input_cache_poll(c, b), -EAGAIN);
	make(&r, 1, payload);
	CHECK_OK(sel_input_cache_publish(c, a, &r));
	CHECK_OK(sel_input_cache_poll(c, b));
	CHECK(sel_input_lease_rec(a) == sel_input_lease_rec(b));
	sel_input_cache_release(c, a);
	sel_input_cache_release(c, b);
	sel_input_cache_stats(c, &st);
	CHECK(st.entries == 0 && st.bytes == 0 && st.not_retained == 1);
	check(c);
	sel_input_cache_destroy(c);
}

static int notified;
static void on_ready(void *ctx) { __atomic_add_fetch((int *)ctx, 1, __ATOMIC_RELAXED); }

static void test_failures(void)
{
	sel_input_cache *c;
	CHECK_OK(sel_input_cache_create(1 << 20, &c));
	sel_input_cache_notify(c, on_ready, &notified);
	sel_input_key k = key_of(7), other = key_of(8);
	sel_input_lease *a, *b;
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_SOURCE, &k, &a), SEL_INPUT_MISS);
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_SOURCE, &k, &b), SEL_INPUT_WAIT);
	/* Kinds are separate maps: the same key as a prepared record misses. */
	sel_input_lease *p;
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_PREPARED, &k, &p), SEL_INPUT_MISS);
	CHECK_RC(sel_input_cache_wait(c, b, 20 * 1000000ull), -ETIMEDOUT);
	sel_input_cache_fail(c, a, -EIO);
	CHECK_RC(sel_input_cache_poll(c, b), -EIO);
	CHECK_RC(sel_input_cache_wait(c, b, 1000000000ull), -EIO);
	CHECK(sel_input_lease_rec(b) == NULL);
	sel_input_cache_release(c, b);
	check(c);
	CHECK(notified == 1);
	/* The next lookup prepares again. */
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_SOURCE, &k, &a), SEL_INPUT_MISS);
	/* Publishing a record of another key fails the entry. */
	sel_input_rec r;
	sel_input_source s = {.width = 1,
			      .height = 1,
			      .tokens = 1,
			      .grid_h = 1,
			      .grid_w = 1,
			      .prepared_bytes = 1};
	CHECK_OK(sel_input_source_init(&r, &other, &s, 1));
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_SOURCE, &k, &b), SEL_INPUT_WAIT);
	CHECK_RC(sel_input_cache_publish(c, a, &r), -EINVAL);
	CHECK(r.bytes == NULL);
	CHECK_RC(sel_input_cache_poll(c, b), -EINVAL);
	sel_input_cache_release(c, a);
	sel_input_cache_release(c, b);
	CHECK_OK(sel_input_source_init(&r, &k, &s, 1));
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_SOURCE, &k, &a), SEL_INPUT_MISS);
	CHECK_OK(sel_input_cache_publish(c, a, &r));
	CHECK(sel_input_lease_rec(a)->h.src.tokens == 1);
	sel_input_cache_release(c, a);
	sel_input_cache_fail(c, p, -ENOMEM);
	check(c);
	CHECK(notified == 4);
	struct sel_input_cache_stats st;
	sel_input_cache_stats(c, &st);
	CHECK(st.failed == 3 && st.published == 1 && st.pending == 0 && st.entries == 1);
	sel_input_cache_destroy(c);
}

/* Many threads look up one new key at once: one preparation. */
struct racer {
	sel_input_cache *c;
	pthread_barrier_t *bar;
	int *preparations;
	int result;
	uint64_t digest;
};

static void *race(void *arg)
{
	struct racer *r = arg;
	sel_input_key k = key_of(42);
	sel_input_lease *l;
	pthread_barrier_wait(r->bar);
	int rc = sel_input_cache_lookup(r->c, SEL_INPUT_PREPARED, &k, &l);
	CHECK_OK(rc);
	if (rc == SEL_INPUT_MISS) {
		__atomic_add_fetch(r->preparations, 1, __ATOMIC_RELAXED);
		sel_input_rec rec;
		make(&rec, 42, 50000);
		CHECK_OK(sel_input_cache_publish(r->c, l, &rec));
	} else if (rc == SEL_INPUT_WAIT) {
		CHECK_OK(sel_input_cache_wait(r->c, l, 30ull * 1000000000ull));
	}
	const sel_input_rec *rec = sel_input_lease_rec(l);
	CHECK(rec);
	r->digest = rec->h.tensors[0].checksum;
	r->result = rc;
	sel_input_cache_release(r->c, l);
	return NULL;
}

static void test_shared_preparation(void)
{
	for (int round = 0; round < 20; round++) {
		sel_input_cache *c;
		CHECK_OK(sel_input_cache_create(round % 2 ? 0 : 1 << 20, &c));
		enum {
			N = 8
		};
		pthread_t t[N];
		struct racer r[N];
		pthread_barrier_t bar;
		int preparations = 0;
		pthread_barrier_init(&bar, NULL, N);
		for (int i = 0; i < N; i++) {
			r[i] = (struct racer){.c = c, .bar = &bar, .preparations = &preparations};
			CHECK(pthread_create(&t[i], NULL, race, &r[i]) == 0);
		}
		int waits = 0;
		for (int i = 0; i < N; i++) {
			pthread_join(t[i], NULL);
			waits += r[i].result == SEL_INPUT_WAIT;
			CHECK(r[i].digest == r[0].digest);
		}
		pthread_barrier_destroy(&bar);
		/* Retained, the record serves everyone after the one preparation;
		 * with budget zero a thread that comes after the last release
		 * prepares again (nothing is kept), but never while one runs. */
		CHECKF(round % 2 ? preparations + waits <= N : preparations == 1,
		       "round %d: %d preparations, %d waits", round, preparations, waits);
		check(c);
		sel_input_cache_destroy(c);
	}
	/* Deterministic interleaving: the second lookup happens while the first
	 * is still preparing, and receives its record. */
	sel_input_cache *c;
	CHECK_OK(sel_input_cache_create(0, &c));
	sel_input_key k = key_of(9);
	sel_input_lease *a, *b;
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_PREPARED, &k, &a), SEL_INPUT_MISS);
	CHECK_RC(sel_input_cache_lookup(c, SEL_INPUT_PREPARED, &k, &b), SEL_INPUT_WAIT);
	sel_input_rec rec;
	make(&rec, 9, 10);
	CHECK_OK(sel_input_cache_publish(c, a, &rec));
	CHECK_OK(sel_input_cache_wait(c, b, 1000000000ull));
	CHECK(sel_input_lease_rec(b) == sel_input_lease_rec(a));
	struct sel_input_cache_stats st;
	sel_input_cache_stats(c, &st);
	CHECK(st.misses == 1 && st.waits == 1);
	sel_input_cache_release(c, a);
	sel_input_cache_release(c, b);
	sel_input_cache_destroy(c);
}

int main(void)
{
	test_budget();
	test_lru();
	test_failures();
	test_shared_preparation();
	printf("test_input_cache: ok\n");
	return 0;
}
