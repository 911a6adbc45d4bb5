/*
 * test_engine_export.c - the engine's side of exports (design 2.15
 * "exports", export_fits; engine.c export_pin / export_unpin): a store that
 * is asked for an export on a neighbour's behalf pins the checkpoint
 * through the hooks the engine handed it (sel_store_config.pool_exports),
 * from within sel_store_poll on the worker thread, and the engine refuses
 * with -ENOSPC -- the pooled store's no_headroom -- when, with it pinned,
 * the GPU cache could no longer admit the first pending request.
 *
 * The store is a double in front of a memory store, doing what the pooled
 * store does with the hooks (store_pooled_export.c): it records every
 * checkpoint offered to it (its announced GPU holdings), and when the test
 * asks, its next poll pins one, counts a refusal by its reason (-ENOSPC
 * no_headroom, -ENOENT not_found, -ESTALE generation_changed) or, served,
 * checks the description and unpins it (the copy drained).  Its lookup can
 * hold one prompt's request in the pending queue (SEL_LOOKUP_PENDING, as a
 * pool lookup within its grace period does), which makes that request the
 * first pending one deterministically.
 *
 *   - nothing pending: the export is served, and its pin released (a later
 *     request that needs the checkpoint's pages is admitted and served);
 *   - a pending request whose prompt needs more pages than are free with
 *     the checkpoint pinned: refused no_headroom, nothing left pinned, and
 *     that request, once its lookup answers, is admitted (evicting the
 *     checkpoint's pages) and served with the model's own tokens.
 */
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "engine_test.h"

static hel_core *core;
static test_rng rng;

#define XD_MAX 64

struct xdouble {
	sel_store base;
	sel_store *inner;
	const sel_export_hooks *hooks; /* the engine's (cfg->pool_exports) */
	int efd, epfd;                 /* the test's wake, and inner's fd with it */
	uint64_t hold_limit;           /* lookups with this limit are pending while held */
	int held;                      /* atomic */
	/* Offered checkpoints (worker thread; read by the test once settled). */
	struct {
		sel_key key;
		uint64_t id;
		uint32_t n_pages;
	} put[XD_MAX];
	int n_put; /* atomic */
	/* The export asked for: the test sets want, then wakes the worker. */
	int want; /* atomic: the index in put[] + 1, 0 for none */
	int rc;   /* atomic: the last pin's return */
	int done; /* atomic: exports attempted */
	int served, pins_live;
	int refused[SEL_EXPORT_REFUSALS]; /* atomic */
	bool described_ok;
};

static sel_store *inner(sel_store *s) { return ((struct xdouble *)s)->inner; }

static int x_lookup(sel_store *s, const sel_history *h, uint64_t res, uint64_t lim, sel_hit *hit)
{
	struct xdouble *d = (struct xdouble *)s;
	if (__atomic_load_n(&d->held, __ATOMIC_SEQ_CST) && lim == d->hold_limit)
		return SEL_LOOKUP_PENDING;
	return sel_store_lookup(inner(s), h, res, lim, hit);
}

static sel_outcome x_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct xdouble *d = (struct xdouble *)s;
	int n = __atomic_load_n(&d->n_put, __ATOMIC_SEQ_CST);
	if (n < XD_MAX) {
		d->put[n].key = cp->key;
		d->put[n].id = cp->checkpoint;
		d->put[n].n_pages = cp->n_pages;
		__atomic_store_n(&d->n_put, n + 1, __ATOMIC_SEQ_CST);
	}
	return sel_store_put(inner(s), cp, why);
}

static int x_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	return sel_store_fetch(inner(s), hit, in);
}

/* What store_pooled_export.c does with a pin's answer. */
static sel_export_refusal refusal_of(int rc)
{
	switch (rc) {
	case -ENOSPC: return SEL_EXPORT_NO_HEADROOM;
	case -ENOENT: return SEL_EXPORT_NOT_FOUND;
	case -ESTALE: return SEL_EXPORT_GENERATION_CHANGED;
	default: return SEL_EXPORT_FAILED;
	}
}

static void x_export(struct xdouble *d, int i)
{
	sel_published pub;
	int rc = d->hooks->pin(d->hooks->ctx, &d->put[i].key, d->put[i].id, &pub);
	if (rc == 0) {
		d->pins_live++;
		d->described_ok = sel_key_eq(&pub.key, &d->put[i].key) &&
				  pub.n_pages == d->put[i].n_pages && pub.pages;
		/* The copy into the lease's windows would run here; it drained. */
		d->hooks->unpin(d->hooks->ctx, d->put[i].id);
		d->pins_live--;
		d->served++;
	} else {
		__atomic_add_fetch(&d->refused[refusal_of(rc)], 1, __ATOMIC_SEQ_CST);
	}
	__atomic_store_n(&d->rc, rc, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&d->done, 1, __ATOMIC_SEQ_CST);
}

static int x_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct xdouble *d = (struct xdouble *)s;
	uint64_t v;
	while (read(d->efd, &v, sizeof v) == (ssize_t)sizeof v)
		;
	int want = __atomic_exchange_n(&d->want, 0, __ATOMIC_SEQ_CST);
	if (want)
		x_export(d, want - 1);
	return sel_store_poll(inner(s), ev, cap);
}

static void x_stats(sel_store *s, sel_stats *out) { sel_store_stats(inner(s), out); }
static int x_wait_fd(sel_store *s) { return ((struct xdouble *)s)->epfd; }
static int x_close(sel_store *s, uint64_t deadline) { return sel_store_close(inner(s), deadline); }
static void x_destroy(sel_store *s)
{
	struct xdouble *d = (struct xdouble *)s;
	sel_store_destroy(d->inner);
	d->inner = NULL;
	close(d->epfd);
	close(d->efd);
}

static const struct sel_store_ops x_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "memory",
	.lookup = x_lookup,
	.put = x_put,
	.fetch = x_fetch,
	.poll = x_poll,
	.stats = x_stats,
	.wait_fd = x_wait_fd,
	.close = x_close,
	.destroy = x_destroy,
};

static int x_open(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct xdouble *d = ctx;
	CHECK(cfg->pool_exports && cfg->pool_exports->pin && cfg->pool_exports->unpin);
	d->hooks = cfg->pool_exports;
	int rc = sel_memory_store_open(cfg, &d->inner);
	if (rc)
		return rc;
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	d->epfd = epoll_create1(EPOLL_CLOEXEC);
	CHECK(d->efd >= 0 && d->epfd >= 0);
	struct epoll_event a = {.events = EPOLLIN}, b = {.events = EPOLLIN};
	CHECK_OK(epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->efd, &a));
	CHECK_OK(epoll_ctl(d->epfd, EPOLL_CTL_ADD, sel_store_wait_fd(d->inner), &b));
	d->base.ops = &x_ops;
	d->base.page_tokens = d->inner->page_tokens;
	*out = &d->base;
	return 0;
}

/* Ask for an export of put[i] on the worker and wait (up to 30 s) for its
 * answer: the pin's return. */
static int export_now(struct xdouble *d, int i)
{
	int before = __atomic_load_n(&d->done, __ATOMIC_SEQ_CST);
	__atomic_store_n(&d->want, i + 1, __ATOMIC_SEQ_CST);
	uint64_t one = 1;
	CHECK(write(d->efd, &one, sizeof one) == (ssize_t)sizeof one);
	TEST_UNTIL(__atomic_load_n(&d->done, __ATOMIC_SEQ_CST) != before, 30);
	CHECK(__atomic_load_n(&d->done, __ATOMIC_SEQ_CST) == before + 1);
	return __atomic_load_n(&d->rc, __ATOMIC_SEQ_CST);
}

static bool one_held(const hel_engine_stats *st, void *arg)
{
	(void)arg;
	return st->pending == 1 && st->active == 0 && st->host_lookups_held > 0;
}

static void same_as_model(const struct et_call *c, const hel_token *p, uint32_t n, uint32_t max)
{
	struct et_ref ref;
	et_reference(core, p, n, max, NULL, &ref);
	CHECK(c->n == ref.n && !memcmp(c->tok, ref.tok, ref.n * sizeof *ref.tok));
	et_ref_free(&ref);
}

/* A one-message prompt of at least `tokens` tokens. */
static hel_token *prompt_of(uint32_t tokens, uint32_t *n)
{
	hel_token *t = et_random_prompt(&rng, tokens, n);
	CHECK(*n >= tokens);
	return t;
}

static void test_export_fits(void)
{
	static struct xdouble d;
	memset(&d, 0, sizeof d);
	const uint32_t P = core->page_tokens, G = 12;
	hel_engine *e = et_engine_start(core, (hel_engine_config){.max_active = 1,
								  .gpu_pages = G,
								  .gpu_rows = 24,
								  .memory_bytes = 16 << 20,
								  .store_open = x_open,
								  .store_ctx = &d});
	/* A: about half the cache; its chain stays in the GPU cache. */
	uint32_t na;
	hel_token *pa = prompt_of(5 * P + 10, &na);
	struct et_call *a = et_run(e, pa, na, 8, NULL);
	same_as_model(a, pa, na, 8);
	et_settle(e);
	int n = __atomic_load_n(&d.n_put, __ATOMIC_SEQ_CST), k = -1;
	for (int i = 0; i < n; i++)
		if (k < 0 || d.put[i].key.consumed > d.put[k].key.consumed)
			k = i;
	CHECK(k >= 0 && d.put[k].key.consumed >= 5 * P); /* the prompt's checkpoint */
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	uint64_t free_pages = st.gpu_pages_free;
	CHECK(free_pages + d.put[k].n_pages <= G && free_pages >= 2);

	/* Nothing pending: served, the description is A's chain, and the pin
	 * is released once the copy drained. */
	CHECK_RC(export_now(&d, k), 0);
	CHECK(d.served == 1 && d.described_ok && d.pins_live == 0);

	/* B's prompt needs more pages than are free with A's chain pinned (but
	 * fits the cache): while its lookup is held it is the first pending
	 * request, and the export is refused no_headroom. */
	uint32_t nb;
	hel_token *pb = prompt_of((uint32_t)(free_pages + 1) * P + 10, &nb);
	CHECK(nb / P + 2 <= G);
	d.hold_limit = nb;
	__atomic_store_n(&d.held, 1, __ATOMIC_SEQ_CST);
	struct et_call *b = et_call_new();
	CHECK_OK(et_submit(e, b, pb, nb, 8, NULL));
	et_wait_stats(e, one_held, NULL);
	CHECK_RC(export_now(&d, k), -ENOSPC);
	CHECK(__atomic_load_n(&d.refused[SEL_EXPORT_NO_HEADROOM], __ATOMIC_SEQ_CST) == 1);
	CHECK(d.served == 1 && d.pins_live == 0);
	/* Refused while B waits, again: the answer is the headroom's, not a
	 * one-off. */
	CHECK_RC(export_now(&d, k), -ENOSPC);
	CHECK(__atomic_load_n(&d.refused[SEL_EXPORT_NO_HEADROOM], __ATOMIC_SEQ_CST) == 2);

	/* B's lookup answers: it is admitted, which takes pages of A's chain
	 * (neither the served export nor the refused one left it pinned), and
	 * is served with the model's tokens. */
	__atomic_store_n(&d.held, 0, __ATOMIC_SEQ_CST);
	et_wait(b);
	CHECK(b->out.error == 0);
	same_as_model(b, pb, nb, 8);
	et_settle(e);
	hel_engine_stats_get(e, &st);
	CHECK(st.copyout_pins == 0);
	int other = 0;
	for (int i = 0; i < SEL_EXPORT_REFUSALS; i++)
		other += i == SEL_EXPORT_NO_HEADROOM ? 0 : d.refused[i];
	CHECK(other == 0);

	et_engine_finish(e);
	et_call_free(a);
	et_call_free(b);
	free(pa);
	free(pb);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	test_export_fits();
	hel_core_free(core);
	printf("test_engine_export: ok\n");
	return 0;
}
