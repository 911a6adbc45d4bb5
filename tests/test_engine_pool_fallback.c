/*
 * test_engine_pool_fallback.c - a request whose pool restore failed
 * (design 2.15 "One source"; engine.c requeue_failed_waiters): it is
 * readmitted once with a lookup, which the pooled store answers from its
 * local tiers alone (store_pooled_lookup.c; test_store_pooled_fallback.c
 * shows that side), so a shorter local prefix is restored from that one
 * source instead of the whole prompt recomputed; with no local prefix it
 * recomputes; a local restore that fails too is not retried (no loop).
 * Every reply has the tokens of the model run directly.
 *
 * The store is a memory store behind a double that plays the pool: the
 * lookup of the whole prompt P answers the memory store's deep hit
 * labelled SEL_TIER_POOL, whose restore (the memory store's real copy)
 * is reported FETCH_FAILED from the pool; after that the double answers
 * what the pooled store would, the local tiers' prefix (S, the prompt's
 * first 128 tokens, or nothing).  Waits are by condition with deadlines.
 */
#include "engine_test.h"

static hel_core *core;
static test_rng rng;

enum {
	ARMED,  /* P's lookup: a "pool" hit */
	FALLEN, /* a pool restore failed: the local answer (S or none) */
};

struct fb {
	struct et_gate g;
	uint64_t limit, short_limit; /* P's lookups; S */
	bool local;                  /* the local tiers hold S */
	bool fail_local;             /* the local restore fails too */
	int state;                   /* atomic */
	uint64_t fail_ticket;        /* the restore reported failed (worker thread) */
	uint64_t pool_fetches, local_fetches, lookups_after; /* atomic */
};

static struct fb *F(sel_store *s) { return (struct fb *)s; }
static uint64_t get(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }

static int f_lookup(sel_store *s, const sel_history *h, uint64_t res, uint64_t lim, sel_hit *hit)
{
	struct fb *d = F(s);
	if (lim != d->limit)
		return sel_store_lookup(d->g.inner, h, res, lim, hit);
	if (__atomic_load_n(&d->state, __ATOMIC_SEQ_CST) == ARMED) {
		int rc = sel_store_lookup(d->g.inner, h, res, lim, hit);
		if (rc == 1 && hit->key.consumed > d->short_limit)
			hit->tier = SEL_TIER_POOL; /* deeper than S: the pool's */
		return rc;
	}
	__atomic_add_fetch(&d->lookups_after, 1, __ATOMIC_SEQ_CST);
	uint64_t top = lim < d->short_limit ? lim : d->short_limit;
	return d->local && top > res ? sel_store_lookup(d->g.inner, h, res, top, hit) : 0;
}

static int f_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct fb *d = F(s);
	sel_hit h = *hit;
	bool pool = h.tier == SEL_TIER_POOL;
	h.tier = SEL_TIER_MEMORY;
	int rc = et_gate_fetch(s, &h, in);
	if (rc == 0 && (pool || d->fail_local))
		d->fail_ticket = in->ticket;
	if (rc == 0)
		__atomic_add_fetch(pool ? &d->pool_fetches : &d->local_fetches, 1,
				   __ATOMIC_SEQ_CST);
	return rc;
}

/* The failed restore's completion: FETCH_FAILED, from the pool (or the
 * local tier when that fails too). */
static int f_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct fb *d = F(s);
	int n = et_gate_poll(s, ev, cap);
	for (int i = 0; i < n; i++) {
		if (ev[i].type != SEL_EV_FETCHED || !d->fail_ticket ||
		    ev[i].ticket != d->fail_ticket)
			continue;
		bool pool = __atomic_load_n(&d->state, __ATOMIC_SEQ_CST) == ARMED;
		ev[i].type = SEL_EV_FETCH_FAILED;
		ev[i].error = -ECANCELED;
		ev[i].tier = pool ? SEL_TIER_POOL : SEL_TIER_MEMORY;
		ev[i].bytes = 0;
		d->fail_ticket = 0;
		__atomic_store_n(&d->state, FALLEN, __ATOMIC_SEQ_CST);
	}
	return n;
}

static const struct sel_store_ops fb_ops = {.lookup = f_lookup, .fetch = f_fetch, .poll = f_poll};

static int fb_open(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct fb *d = ctx;
	return et_gate_open_over(&d->g, cfg, out, &fb_ops);
}

static void same_as_model(const struct et_call *c, const hel_token *p, uint32_t n, uint32_t max)
{
	CHECKF(c->out.error == 0, "request failed: %s", sel_strerror(c->out.error));
	struct et_ref ref;
	et_reference(core, p, n, max, NULL, &ref);
	CHECK(c->n == ref.n && !memcmp(c->tok, ref.tok, ref.n * sizeof *ref.tok));
	et_ref_free(&ref);
}

enum kind {
	SHORTER,   /* the local tiers hold S: restored from them */
	NONE,      /* no local prefix: recomputed */
	BOTH_FAIL, /* S's restore fails too: recomputed, no third attempt */
};

static void run_case(enum kind k)
{
	static struct fb d;
	memset(&d, 0, sizeof d);
	hel_engine_config c = {.core = core,
			       .max_active = 3,
			       .gpu_pages = 20,
			       .gpu_rows = 30,
			       .memory_bytes = 16 << 20,
			       .store_open = fb_open,
			       .store_ctx = &d,
			       .fetch = HEL_FETCH_ALWAYS};
	hel_engine *e;
	CHECK_OK(hel_engine_open(&c, &e));
	CHECK_OK(hel_engine_start(e));
	uint32_t n;
	hel_token *p = et_random_prompt(&rng, 300, &n);
	const uint32_t s = 128;
	CHECKF(n > 2 * s && n <= ET_MAXTOK, "%u tokens", n);
	d.limit = n;
	d.short_limit = s;
	d.local = k != NONE;
	d.fail_local = k == BOTH_FAIL;
	/* S and P reach the memory store, then fillers push both out of the
	 * small GPU cache. */
	et_call_free(et_run(e, p, s, 2, NULL));
	et_call_free(et_run(e, p, n, 2, NULL));
	et_settle(e);
	for (int i = 0; i < 14; i++) {
		uint32_t m;
		hel_token *f = et_random_prompt(&rng, 130 + test_rng_below(&rng, 40), &m);
		et_call_free(et_run(e, f, m, 3, NULL));
		free(f);
	}
	et_settle(e);
	hel_engine_stats st0, st;
	hel_engine_stats_get(e, &st0);

	struct et_call *x = et_run(e, p, n, 4, NULL);
	same_as_model(x, p, n, 4);
	et_settle(e);
	hel_engine_stats_get(e, &st);
	CHECK(get(&d.pool_fetches) == 1);
	CHECKF(st.host_fetch_failed == st0.host_fetch_failed + (k == BOTH_FAIL ? 2 : 1),
	       "%llu failed restores",
	       (unsigned long long)(st.host_fetch_failed - st0.host_fetch_failed));
	/* Readmitted with one lookup (the pooled store's local answer). */
	CHECKF(get(&d.lookups_after) == 1, "%llu lookups after the failure",
	       (unsigned long long)get(&d.lookups_after));
	if (k == SHORTER) {
		CHECK(get(&d.local_fetches) == 1);
		CHECKF(x->out.cached_tokens == s && x->out.reused_host_tokens == s &&
			       x->out.host_tier == SEL_TIER_MEMORY,
		       "cached %llu host %llu tier %d", (unsigned long long)x->out.cached_tokens,
		       (unsigned long long)x->out.reused_host_tokens, (int)x->out.host_tier);
	} else {
		CHECK(get(&d.local_fetches) == (k == BOTH_FAIL));
		CHECK(x->out.cached_tokens == 0 && x->out.host_tier == SEL_TIER_NONE);
	}
	/* Serving goes on: the prompt again, the model's tokens. */
	__atomic_store_n(&d.state, ARMED, __ATOMIC_SEQ_CST);
	d.fail_local = false;
	struct et_call *y = et_run(e, p, n, 4, NULL);
	same_as_model(y, p, n, 4);
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	et_call_free(x);
	et_call_free(y);
	free(p);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	run_case(SHORTER);
	run_case(NONE);
	run_case(BOTH_FAIL);
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
