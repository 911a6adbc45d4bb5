/*
 * bench/index.c - the checkpoint index (design 2.3).
 *
 * 1. Lookup cost must follow the new tokens, not the history length: a
 *    10K-token and a 100K-token conversation are indexed (a record every
 *    64..2048 tokens, committed, so interior rows are dropped as in
 *    serving) among 200,000 unrelated records; each request extends its
 *    conversation by 500 new tokens and the GPU holds everything before
 *    them (resident = the old length).  Only sel_index_lookup is timed,
 *    averaged over many repetitions; histories are built beforehand.
 *    - index_lookup_*: the index holds the conversation up to the resident
 *      count, so the lookup probes every bucket of the new tokens and misses
 *      (nothing above the resident count can be restored).
 *    - index_lookup_hit_*: the index also holds records inside the new
 *      tokens (the same prompt was served and evicted earlier); the lookup
 *      returns their chain above the resident count.
 *    The ratio 100K / 10K should stay at or below 1.2.
 * 2. Bytes per node with 1M nodes.
 * 3. Steady-state insert + evict at 1M nodes: each operation inserts a new
 *    node under a random node (or as a root) and evicts one.
 *
 * Prints `RESULT <name> <value> <unit>` per result, after a human line.
 */
#include "testutil.h"

#include <time.h>

#include "index.h"

enum {
	PT = 256,
	NEW_TOKENS = 500,
	UNRELATED = 200000,
	MILLION = 1000000
};

static test_rng rng;
static uint8_t model_id[SEL_IDENTITY_BYTES];

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void result(const char *human, const char *name, double v, const char *unit)
{
	printf("%s: %.3f %s\n", human, v, unit);
	printf("RESULT %s %.3f %s\n", name, v, unit);
	fflush(stdout);
}

static void random_key(uint64_t consumed, sel_key *k, sel_digest *bucket)
{
	k->consumed = consumed;
	test_rng_fill(&rng, k->digest.b, SEL_DIGEST_BYTES);
	test_rng_fill(&rng, bucket->b, SEL_DIGEST_BYTES);
}

/* Insert and commit the record of h's first c tokens under the one at p
 * (0: a root). */
static void put(sel_index *ix, const sel_history *h, uint64_t c, uint64_t p)
{
	sel_key k, pk;
	sel_node_id id;
	sel_history_key_at(h, c, &k);
	if (p)
		sel_history_key_at(h, p, &pk);
	CHECK_OK(sel_index_insert(ix, &k, p ? &pk : NULL,
				  sel_history_bound(h, c / SEL_BUCKET_TOKENS), SEL_TAIL_AUTO, true,
				  &id));
	sel_index_commit(ix, id);
}

/* A conversation of n old tokens plus NEW_TOKENS new ones; records every
 * 64..2048 tokens up to exactly n, and (with_new) two inside the new
 * tokens. */
static void conversation(sel_index *ix, sel_history *h, uint64_t n, bool with_new)
{
	uint64_t total = n + NEW_TOKENS;
	sel_token *t = malloc(total * sizeof *t);
	CHECK(t);
	for (uint64_t i = 0; i < total; i++)
		t[i] = (sel_token)test_rng_below(&rng, 150000);
	CHECK_OK(sel_history_init(h, model_id, NULL, 0));
	CHECK_OK(sel_history_append(h, t, total));
	free(t);
	uint64_t prev = 0;
	for (uint64_t c = 64 + test_rng_below(&rng, 1985); c < n;
	     c += 64 + test_rng_below(&rng, 1985)) {
		put(ix, h, c, prev);
		prev = c;
	}
	put(ix, h, n, prev);
	if (with_new) {
		put(ix, h, n + 137, n);
		put(ix, h, n + NEW_TOKENS, n + 137);
	}
}

/* Mean microseconds of one lookup, over reps calls. */
static double time_lookup(sel_index *ix, const sel_history *h, uint64_t resident, int want,
			  sel_index_chain *ch, int reps)
{
	double t0 = now_s();
	int got = 0;
	for (int i = 0; i < reps; i++)
		got += sel_index_lookup(ix, h, resident, UINT64_MAX, ch);
	double dt = now_s() - t0;
	CHECK(got == want * reps);
	return dt / reps * 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median over rounds, the two sizes interleaved so drift hits both. */
static void bench_lookup(bool hit)
{
	sel_index *ix;
	CHECK_OK(sel_index_create(PT, NULL, NULL, &ix));
	sel_history h10, h100;
	conversation(ix, &h10, 10000, hit);
	for (int i = 0; i < UNRELATED; i++) {
		sel_key k;
		sel_digest b;
		random_key(1 + test_rng_below(&rng, 200000), &k, &b);
		CHECK_OK(sel_index_insert(ix, &k, NULL, &b, SEL_TAIL_AUTO, true, NULL));
	}
	conversation(ix, &h100, 100000, hit);
	sel_index_chain ch = {0};
	enum {
		ROUNDS = 15,
		REPS = 20000
	};
	double t10[ROUNDS], t100[ROUNDS];
	int want = hit ? 1 : 0;
	time_lookup(ix, &h10, 10000, want, &ch, REPS); /* warm up */
	time_lookup(ix, &h100, 100000, want, &ch, REPS);
	if (hit)
		CHECK(ch.n == 2 && ch.base == 100000 && ch.consumed == 100000 + NEW_TOKENS);
	for (int r = 0; r < ROUNDS; r++) {
		t10[r] = time_lookup(ix, &h10, 10000, want, &ch, REPS);
		t100[r] = time_lookup(ix, &h100, 100000, want, &ch, REPS);
	}
	qsort(t10, ROUNDS, sizeof(double), cmp_double);
	qsort(t100, ROUNDS, sizeof(double), cmp_double);
	double a = t10[ROUNDS / 2], b = t100[ROUNDS / 2];
	char human[160];
	const char *what = hit ? "hit inside the new tokens" : "miss above the resident count";
	snprintf(human, sizeof human, "lookup, 10K-token history + %d new tokens (%s)", NEW_TOKENS,
		 what);
	result(human, hit ? "index_lookup_hit_10k_us" : "index_lookup_10k_us", a, "us");
	snprintf(human, sizeof human, "lookup, 100K-token history + %d new tokens (%s)", NEW_TOKENS,
		 what);
	result(human, hit ? "index_lookup_hit_100k_us" : "index_lookup_100k_us", b, "us");
	snprintf(human, sizeof human, "lookup time ratio 100K / 10K (%s; goal <= 1.2)", what);
	result(human, hit ? "index_lookup_hit_ratio" : "index_lookup_ratio", b / a, "x");
	sel_index_chain_free(&ch);
	sel_history_free(&h10);
	sel_history_free(&h100);
	sel_index_destroy(ix);
}

/* A new node under a random live node (1 in 10 a root). */
static void insert_random(sel_index *ix)
{
	const sel_index_node *p = NULL;
	if (sel_index_count(ix) && test_rng_below(&rng, 10)) {
		while (!p)
			p = sel_index_cget(
				ix, (sel_node_id)test_rng_below(&rng, sel_index_count(ix) + 16));
	}
	sel_key k, pk;
	sel_digest b;
	uint64_t base = p ? p->key.consumed : 0;
	if (p)
		pk = p->key;
	random_key(base + 1 + test_rng_below(&rng, 2048), &k, &b);
	CHECK_OK(sel_index_insert(ix, &k, p ? &pk : NULL, &b, SEL_TAIL_AUTO, true, NULL));
}

static void bench_million(void)
{
	sel_index *ix;
	CHECK_OK(sel_index_create(PT, NULL, NULL, &ix));
	double t0 = now_s();
	for (int i = 0; i < MILLION; i++)
		insert_random(ix);
	double fill = now_s() - t0;
	CHECK(sel_index_count(ix) == MILLION);
	result("index bytes per node at 1M nodes (node array and hash tables)",
	       "index_bytes_per_node", sel_index_bytes_per_node(ix), "bytes");
	printf("(filled 1M nodes in %.2f s, %.0f inserts/s)\n", fill, MILLION / fill);

	enum {
		OPS = 1000000
	};
	t0 = now_s();
	for (int i = 0; i < OPS; i++) {
		insert_random(ix);
		CHECK(sel_index_evict(ix, NULL) == 1);
	}
	double dt = now_s() - t0;
	CHECK(sel_index_count(ix) <= MILLION);
	uint64_t depth = 0, nodes = 0;
	for (sel_node_id id = sel_index_next_lru(ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(ix, id), nodes++)
		for (const sel_index_node *n = sel_index_cget(ix, id); n->parent != SEL_NODE_NONE;
		     n = sel_index_cget(ix, n->parent))
			depth++;
	printf("(%" PRIu64 " nodes, mean depth %.1f: each insert refreshes that many ancestors)\n",
	       nodes, (double)depth / (double)nodes);
	result("insert + evict at 1M nodes, steady state", "index_insert_evict_ops_per_s", OPS / dt,
	       "ops/s");
	CHECK_OK(sel_index_check(ix));
	sel_index_destroy(ix);
}

int main(void)
{
	test_rng_init(&rng, 42);
	test_rng_fill(&rng, model_id, sizeof model_id);
	bench_lookup(false);
	bench_lookup(true);
	bench_million();
	return 0;
}
