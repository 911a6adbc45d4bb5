/*
 * test_engine_late.c - the late-answer retry of an admitted request
 * (design 2.15 "Lookups"; engine.c late_mark / late_retries): a request
 * whose lookup was held, then admitted on the local answer when the grace
 * period ended (a restore of a shorter prefix), is readmitted through
 * ordinary admission when a deeper answer arrives before its restore
 * drained, and restores the deeper source; not when the deeper answer
 * arrives once its prefill was submitted, and not once it was cancelled.
 * Every reply has the tokens of the model run directly.
 *
 * The store is a memory store behind a double that plays the pool's
 * ticket: while `state` is PENDING it answers lookups of the prompt
 * SEL_LOOKUP_PENDING; EXPIRED, the local answer (the memory store's, at
 * most the short prefix S); ANSWERED, the memory store's whole answer
 * (the prompt P, deeper: the "late answer").  It also holds restores'
 * completions while `hold` is set, so the test decides what arrives
 * before the restore drained.  Waits are by condition with deadlines.
 */
#include "engine_test.h"

static hel_core *core;
static test_rng rng;

enum {
	OFF,
	PENDING,
	EXPIRED,
	ANSWERED
};

struct late {
	sel_store base;
	sel_store *inner;
	uint64_t limit, short_limit; /* the prompt's lookups; the local answer's depth */
	int state, hold;             /* atomic */
	uint64_t pendings;           /* atomic: PENDING answers */
	uint64_t held_resident;      /* the resident count of the last PENDING lookup */
	uint64_t fetches, deep_fetches, deep_consumed; /* atomic */
	sel_event held[64];
	size_t n_held;
};

static struct late *L(sel_store *s) { return (struct late *)s; }

static int l_lookup(sel_store *s, const sel_history *h, uint64_t res, uint64_t lim, sel_hit *hit)
{
	struct late *d = L(s);
	int st = __atomic_load_n(&d->state, __ATOMIC_SEQ_CST);
	if (st == OFF || lim != d->limit || st == ANSWERED)
		return sel_store_lookup(d->inner, h, res, lim, hit);
	if (st == PENDING) {
		d->held_resident = res;
		__atomic_add_fetch(&d->pendings, 1, __ATOMIC_SEQ_CST);
		return SEL_LOOKUP_PENDING;
	}
	uint64_t top = lim < d->short_limit ? lim : d->short_limit;
	return top > res ? sel_store_lookup(d->inner, h, res, top, hit) : 0;
}

static int l_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct late *d = L(s);
	int rc = sel_store_fetch(d->inner, hit, in);
	if (rc == 0 && hit->key.consumed > d->short_limit) {
		__atomic_add_fetch(&d->deep_fetches, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&d->deep_consumed, hit->key.consumed, __ATOMIC_SEQ_CST);
	}
	if (rc == 0)
		__atomic_add_fetch(&d->fetches, 1, __ATOMIC_SEQ_CST);
	return rc;
}

static int l_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct late *d = L(s);
	sel_event tmp[32];
	int n = sel_store_poll(d->inner, tmp, cap < 32 ? cap : 32);
	if (n < 0)
		return n;
	size_t out = 0;
	for (int i = 0; i < n; i++) {
		bool fetch = tmp[i].type == SEL_EV_FETCHED || tmp[i].type == SEL_EV_FETCH_FAILED;
		if (fetch && d->n_held < 64)
			d->held[d->n_held++] = tmp[i];
		else
			ev[out++] = tmp[i];
	}
	if (!__atomic_load_n(&d->hold, __ATOMIC_SEQ_CST)) {
		size_t k = 0;
		for (; k < d->n_held && out < cap; k++)
			ev[out++] = d->held[k];
		memmove(d->held, d->held + k, (d->n_held - k) * sizeof *d->held);
		d->n_held -= k;
	}
	return (int)out;
}

static sel_outcome l_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	return sel_store_put(L(s)->inner, cp, why);
}
static void l_evicted(sel_store *s, const sel_key *k, uint64_t gen, const sel_key *heir)
{
	sel_store_evicted(L(s)->inner, k, gen, heir);
}
static void l_touch(sel_store *s, const sel_key *k) { sel_store_touch(L(s)->inner, k); }
static void l_stats(sel_store *s, sel_stats *out) { sel_store_stats(L(s)->inner, out); }
static int l_wait_fd(sel_store *s) { return sel_store_wait_fd(L(s)->inner); }
static int l_close(sel_store *s, uint64_t deadline)
{
	return sel_store_close(L(s)->inner, deadline);
}
static void l_destroy(sel_store *s)
{
	sel_store_destroy(L(s)->inner);
	L(s)->inner = NULL;
}

static const struct sel_store_ops late_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "memory",
	.lookup = l_lookup,
	.put = l_put,
	.fetch = l_fetch,
	.poll = l_poll,
	.evicted = l_evicted,
	.touch = l_touch,
	.stats = l_stats,
	.wait_fd = l_wait_fd,
	.close = l_close,
	.destroy = l_destroy,
};

static int late_open(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct late *d = ctx;
	int rc = sel_memory_store_open(cfg, &d->inner);
	if (rc)
		return rc;
	d->base.ops = &late_ops;
	d->base.page_tokens = d->inner->page_tokens;
	*out = &d->base;
	return 0;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t get(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void set(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

/* Up to 30 s for *p >= want. */
static void wait_at_least(uint64_t *p, uint64_t want)
{
	uint64_t deadline = eos_now_ns() + 30 * UINT64_C(1000000000);
	while (get(p) < want) {
		CHECKF(eos_now_ns() < deadline, "waited 30 s for %llu", (unsigned long long)want);
		usleep(200);
	}
}

static bool has_token(struct et_call *c)
{
	pthread_mutex_lock(&c->mu);
	bool t = c->n > 0 || c->done;
	pthread_mutex_unlock(&c->mu);
	return t;
}

static void same_as_model(const struct et_call *c, const hel_token *p, uint32_t n, uint32_t max)
{
	struct et_ref ref;
	et_reference(core, p, n, max, NULL, &ref);
	CHECK(c->out.error == 0);
	CHECK(c->n == ref.n && !memcmp(c->tok, ref.tok, ref.n * sizeof *ref.tok));
	et_ref_free(&ref);
}

/* S (the prompt's first 128 tokens) and P reach the store, then fillers
 * push both out of the small GPU cache. */
static void prepare(hel_engine *e, const hel_token *p, uint32_t n, uint32_t s)
{
	et_call_free(et_run(e, p, s, 2, NULL));
	et_call_free(et_run(e, p, n, 2, NULL));
	et_settle(e);
	for (int i = 0; i < 14; i++) {
		uint32_t k;
		hel_token *f = et_random_prompt(&rng, 130 + test_rng_below(&rng, 40), &k);
		et_call_free(et_run(e, f, k, 3, NULL));
		free(f);
	}
	et_settle(e);
}

enum when {
	RETRY,
	STARTED,
	CANCELLED
};

static void run_case(enum when w)
{
	static struct late d;
	memset(&d, 0, sizeof d);
	hel_engine_config c = {.core = core,
			       .max_active = 3,
			       .gpu_pages = 20,
			       .gpu_rows = 30,
			       .memory_bytes = 16 << 20,
			       .store_open = late_open,
			       .store_ctx = &d,
			       .fetch = HEL_FETCH_ALWAYS};
	hel_engine *e;
	CHECK_OK(hel_engine_open(&c, &e));
	CHECK_OK(hel_engine_start(e));
	uint32_t n;
	hel_token *p = et_random_prompt(&rng, 300, &n);
	const uint32_t s = 128;
	CHECK(n > 2 * s);
	d.limit = n;
	d.short_limit = s;
	prepare(e, p, n, s);

	/* Held; the grace period ends: admitted on the local answer, S, whose
	 * restore is held back. */
	set(&d.hold, 1);
	set(&d.state, PENDING);
	struct et_call *x = et_call_new();
	CHECK_OK(et_submit(e, x, p, n, 4, NULL));
	wait_at_least(&d.pendings, 1);
	CHECKF(d.held_resident == 0, "the GPU still holds %llu tokens of the prompt",
	       (unsigned long long)d.held_resident);
	uint64_t fetches = get(&d.fetches);
	set(&d.state, EXPIRED);
	wait_at_least(&d.fetches, fetches + 1);
	CHECK(get(&d.deep_fetches) == 0);

	hel_engine_stats st;
	if (w == RETRY) {
		/* The deeper answer arrives while S is restoring: readmitted,
		 * P restored. */
		set(&d.state, ANSWERED);
		set(&d.hold, 0);
		et_wait(x);
		hel_engine_stats_get(e, &st);
		CHECKF(st.late_retries == 1, "%llu retries", (unsigned long long)st.late_retries);
		CHECK(get(&d.deep_fetches) == 1 && get(&d.fetches) == fetches + 2);
		CHECK(x->out.cached_tokens == get(&d.deep_consumed) && x->out.cached_tokens > s);
		CHECK(x->out.reused_gpu_tokens == s); /* the restored S, then P's tail */
	} else if (w == STARTED) {
		/* S drains first: prefill starts; the deeper answer after it
		 * changes nothing. */
		set(&d.hold, 0);
		uint64_t deadline = eos_now_ns() + 30 * UINT64_C(1000000000);
		while (!has_token(x)) {
			CHECK(eos_now_ns() < deadline);
			usleep(200);
		}
		set(&d.state, ANSWERED);
		et_wait(x);
		hel_engine_stats_get(e, &st);
		CHECK(st.late_retries == 0 && get(&d.deep_fetches) == 0);
		CHECK(x->out.cached_tokens == s);
	} else {
		/* Cancelled while restoring, the deeper answer in: no retry. */
		set(&d.state, ANSWERED);
		CHECK_OK(hel_engine_cancel(e, x->id));
		et_wait(x);
		set(&d.hold, 0);
		et_settle(e);
		hel_engine_stats_get(e, &st);
		CHECK(st.late_retries == 0 && get(&d.deep_fetches) == 0);
		CHECK(x->out.error == 0 && x->n < 4);
	}
	if (w != CANCELLED)
		same_as_model(x, p, n, 4);
	set(&d.state, OFF);
	/* Serving goes on: the prompt again, the model's tokens. */
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
	run_case(RETRY);
	run_case(STARTED);
	run_case(CANCELLED);
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
