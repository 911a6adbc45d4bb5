/*
 * test_engine_held.c - admission with a store whose lookup answers
 * SEL_LOOKUP_PENDING (selene.h; the remote tier's grace period, issue 16):
 * the request is held in the pending queue while the requests behind it
 * are admitted and served, it is planned again at most every 200 us (not
 * in a busy loop), and once the store answers it runs with the same tokens
 * as the model run directly.  The store is a memory store behind a double
 * that holds lookups of one prompt length while the test says so.
 */
#include "engine_test.h"

static hel_core *core;
static test_rng rng;

struct holder {
	sel_store base;
	sel_store *inner;
	uint64_t hold_limit; /* lookups with this limit are pending while held */
	int held;            /* atomic */
	uint64_t pending;    /* atomic: PENDING answers given */
};

static sel_store *inner(sel_store *s) { return ((struct holder *)s)->inner; }

static int h_lookup(sel_store *s, const sel_history *h, uint64_t res, uint64_t lim, sel_hit *hit)
{
	struct holder *d = (struct holder *)s;
	if (__atomic_load_n(&d->held, __ATOMIC_SEQ_CST) && lim == d->hold_limit) {
		__atomic_add_fetch(&d->pending, 1, __ATOMIC_SEQ_CST);
		return SEL_LOOKUP_PENDING;
	}
	return sel_store_lookup(inner(s), h, res, lim, hit);
}

static sel_outcome h_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	return sel_store_put(inner(s), cp, why);
}
static int h_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	return sel_store_fetch(inner(s), hit, in);
}
static int h_poll(sel_store *s, sel_event *ev, size_t cap)
{
	return sel_store_poll(inner(s), ev, cap);
}
static void h_stats(sel_store *s, sel_stats *out) { sel_store_stats(inner(s), out); }
static int h_wait_fd(sel_store *s) { return sel_store_wait_fd(inner(s)); }
static int h_close(sel_store *s, uint64_t deadline) { return sel_store_close(inner(s), deadline); }
static void h_destroy(sel_store *s)
{
	sel_store_destroy(inner(s));
	((struct holder *)s)->inner = NULL;
}

static const struct sel_store_ops holder_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "memory",
	.lookup = h_lookup,
	.put = h_put,
	.fetch = h_fetch,
	.poll = h_poll,
	.stats = h_stats,
	.wait_fd = h_wait_fd,
	.close = h_close,
	.destroy = h_destroy,
};

static int holder_open(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct holder *d = ctx;
	int rc = sel_memory_store_open(cfg, &d->inner);
	if (rc)
		return rc;
	d->base.ops = &holder_ops;
	d->base.page_tokens = d->inner->page_tokens;
	*out = &d->base;
	return 0;
}

static bool one_pending(const hel_engine_stats *st, void *arg)
{
	(void)arg;
	return st->pending == 1 && st->host_lookups_held > 0;
}

static void same_as_model(const struct et_call *c, const hel_token *p, uint32_t n, uint32_t max)
{
	struct et_ref ref;
	et_reference(core, p, n, max, NULL, &ref);
	CHECK(c->n == ref.n && !memcmp(c->tok, ref.tok, ref.n * sizeof *ref.tok));
	et_ref_free(&ref);
}

static void test_held(void)
{
	static struct holder d;
	memset(&d, 0, sizeof d);
	hel_engine_config c = {.core = core,
			       .max_active = 3,
			       .memory_bytes = 16 << 20,
			       .store_open = holder_open,
			       .store_ctx = &d,
			       .fetch = HEL_FETCH_ALWAYS};
	hel_engine *e;
	CHECK_OK(hel_engine_open(&c, &e));
	CHECK_OK(hel_engine_start(e));

	uint32_t nx, ny;
	hel_token *px = et_random_prompt(&rng, 150, &nx);
	hel_token *py = et_random_prompt(&rng, 90, &ny);
	CHECK(nx != ny);
	d.hold_limit = nx;
	__atomic_store_n(&d.held, 1, __ATOMIC_SEQ_CST);

	/* X is held; Y, behind it, is admitted and served meanwhile. */
	struct et_call *x = et_call_new();
	CHECK_OK(et_submit(e, x, px, nx, 8, NULL));
	et_wait_stats(e, one_pending, NULL);
	struct et_call *y = et_run(e, py, ny, 8, NULL);
	same_as_model(y, py, ny, 8);
	pthread_mutex_lock(&x->mu);
	CHECK(!x->done);
	pthread_mutex_unlock(&x->mu);

	/* Held, it is planned again at most every 200 us, not in a busy loop:
	 * over 100 ms at most ~500 asks (slack for the clock's granularity). */
	uint64_t before = __atomic_load_n(&d.pending, __ATOMIC_SEQ_CST);
	uint64_t t0 = eos_now_ns();
	usleep(100 * 1000);
	uint64_t asks = __atomic_load_n(&d.pending, __ATOMIC_SEQ_CST) - before;
	uint64_t ms = (eos_now_ns() - t0) / 1000000;
	CHECKF(asks <= (ms + 1) * 5 + 10, "%llu asks in %llu ms", (unsigned long long)asks,
	       (unsigned long long)ms);
	CHECK(asks > 0);

	/* The store answers: X runs, its tokens those of the model. */
	__atomic_store_n(&d.held, 0, __ATOMIC_SEQ_CST);
	et_wait(x);
	CHECK(x->out.error == 0);
	same_as_model(x, px, nx, 8);
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	CHECK(st.host_lookups_held >= 1);

	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	et_call_free(x);
	et_call_free(y);
	free(px);
	free(py);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	test_held();
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
