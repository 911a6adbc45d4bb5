/*
 * test_engine_requeue.c - the worker's use of the store interface through a
 * test double (design 2.2 "a test double implements it for worker tests",
 * 2.8, step 11: "a test double covering requeue on failure").
 *
 * The double is a sel_store of its own (ops version SEL_STORE_OPS_VERSION)
 * that answers lookups with made-up hits, fails fetches, scripts put
 * outcomes and their events, and logs every call.  Covers:
 *   - FETCH_FAILED: the waiters (two sharing one ticket) go back to the
 *     front of the queue with host lookup disabled for that attempt (no
 *     second lookup), recompute and produce the reference tokens;
 *   - a fetch refused at once (-ESTALE) and a hit the policy declines;
 *     failed restores leave the policy's estimates (published in the
 *     stats) as they were;
 *   - --prefix-cache-fetch: always restores a hit the policy would
 *     decline, never recomputes one it would take (counted as declined),
 *     and an unknown mode is refused at open;
 *   - Retry outcomes put again only after store progress (a STORED,
 *     FETCHED or PROGRESS event delivered after the refusal; failure
 *     events, Deferred included, are none), and abandoned by their last
 *     reason once the checkpoint left the GPU;
 *   - Deferred: the pin released, the put retried after progress;
 *   - two checkpoints deferred on every put do not re-offer each other
 *     (retry_storm_two_deferred): with the engine idle no put is made, and
 *     both are abandoned once evicted;
 *   - the copy-out pin bound (copyouts_pin_the_gpu_cache): with copy-outs
 *     that never complete, queued copy-outs pin at most
 *     max(1, rows / 4) checkpoints, requests still finish, the rest is
 *     held back unpinned (counted) and offered once pins drop;
 *   - STORE_FAILED: the pin released (the checkpoint is evicted later),
 *     no retry;
 *   - every Queued put pinned until its event (no pin leaks: every
 *     checkpoint offered is eventually evicted), eviction notices before
 *     the puts of the same iteration;
 *   - a store that stops (poll fails): inbound waiters recompute, serving
 *     goes on without it, and a close that cannot drain makes stop return
 *     SEL_ESTOPPED and keep the memory;
 *   - nothing leaks: a request needing nearly the whole GPU cache still
 *     fits after all of it (and the sanitizer builds check memory).
 */
#include <sys/eventfd.h>

#include "engine_test.h"
#include "selene_store.h" /* the store double */
#include "flare/metrics.h"

static hel_core *core;
static test_rng rng;

/* ---- the double ------------------------------------------------------------------- */

enum {
	LOG_POLL = 1,
	LOG_PUT,
	LOG_EVICTED,
	LOG_MAX = 1 << 16
};

struct putrec {
	uint64_t id;
	sel_key key;
	int puts;
	uint64_t progress_at_refusal; /* progress events delivered (or queued
				       * ahead of its Deferred) when last refused */
	bool refused;                 /* waits for progress */
	bool evicted;
	int pins; /* Queued puts without their event yet */
};

struct dbl {
	sel_store base;
	pthread_mutex_t mu;
	int efd;
	/* lookups */
	uint64_t hit_at; /* 0: miss */
	uint64_t hit_bytes;
	int fetch_rc;    /* fetch returns it when non-zero */
	int fetch_error; /* FETCH_FAILED error */
	bool hold;       /* keep fetch events */
	int lookups, fetches;
	/* puts */
	bool scripted;              /* outcome by checkpoint id % 4, else always Queued */
	bool always_retry;          /* scripted kind 1 refuses every put */
	bool defer_one;             /* the first scripted kind-2 checkpoint defers every put */
	bool defer_two;             /* the first two do */
	uint64_t deferring[2];      /* their ids (0: not chosen yet) */
	bool hold_stored;           /* keep the events of Queued puts until released */
	sel_retry_reason defer_why; /* the cause deferral events name */
	int poll_fail;              /* poll returns it when non-zero */
	int close_rc;
	/* events */
	sel_event q[1024], held[64], held_st[1024];
	size_t nq, nheld, nheld_st;
	uint64_t delivered; /* events returned by poll */
	uint64_t progress;  /* of which STORED, FETCHED and PROGRESS */
	int pins, max_pins; /* Queued puts without their event: now, most */
	int puts;           /* every put */
	/* bookkeeping */
	struct putrec *recs;
	size_t nrecs, caprecs;
	uint8_t log[LOG_MAX];
	size_t nlog;
	int order_violations, early_retries, unknown_events;
	bool closed;
};

static struct putrec *rec_of(struct dbl *d, uint64_t id)
{
	for (size_t i = 0; i < d->nrecs; i++)
		if (d->recs[i].id == id)
			return &d->recs[i];
	if (d->nrecs == d->caprecs) {
		d->caprecs = d->caprecs ? 2 * d->caprecs : 256;
		d->recs = realloc(d->recs, d->caprecs * sizeof *d->recs);
		CHECK(d->recs);
	}
	struct putrec *r = &d->recs[d->nrecs++];
	memset(r, 0, sizeof *r);
	r->id = id;
	return r;
}

static void logc(struct dbl *d, uint8_t what)
{
	if (d->nlog < LOG_MAX)
		d->log[d->nlog++] = what;
}

static void enqueue(struct dbl *d, const sel_event *ev)
{
	CHECK(d->nq < 1024);
	d->q[d->nq++] = *ev;
	(void)eventfd_write(d->efd, 1);
}

static bool is_progress(const sel_event *ev)
{
	return ev->type == SEL_EV_STORED || ev->type == SEL_EV_FETCHED ||
	       ev->type == SEL_EV_PROGRESS;
}

/* Progress events the engine will have seen once it reaches the end of
 * the queue as it is now. */
static uint64_t progress_through_queue(const struct dbl *d)
{
	uint64_t n = d->progress;
	for (size_t i = 0; i < d->nq; i++)
		n += is_progress(&d->q[i]);
	return n;
}

static bool deferring(const struct dbl *d, uint64_t id)
{
	return id && (d->deferring[0] == id || d->deferring[1] == id);
}

static int d_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		    sel_hit *hit)
{
	struct dbl *d = (struct dbl *)s;
	int rc = 0;
	pthread_mutex_lock(&d->mu);
	d->lookups++;
	uint64_t c = d->hit_at;
	if (c && resident < c && c <= limit && c <= sel_history_len(h)) {
		memset(hit, 0, sizeof *hit);
		sel_history_key_at(h, c, &hit->key);
		hit->resident = resident;
		hit->pages = (uint32_t)(c / s->page_tokens - resident / s->page_tokens);
		hit->bytes = d->hit_bytes;
		hit->tier = SEL_TIER_MEMORY;
		rc = 1;
	}
	pthread_mutex_unlock(&d->mu);
	return rc;
}

static int d_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct dbl *d = (struct dbl *)s;
	pthread_mutex_lock(&d->mu);
	int rc = d->fetch_rc;
	if (rc == 0) {
		d->fetches++;
		/* Slow, to show that failed restores are no policy samples. */
		sel_event ev = {.type = SEL_EV_FETCH_FAILED,
				.error = d->fetch_error,
				.ticket = in->ticket,
				.key = hit->key,
				.tier = SEL_TIER_MEMORY,
				.bytes = 1 << 20,
				.duration_ns = 1000000000};
		CHECK(in->n_pages == hit->pages);
		if (d->hold) {
			CHECK(d->nheld < 64);
			d->held[d->nheld++] = ev;
		} else {
			enqueue(d, &ev);
		}
	}
	pthread_mutex_unlock(&d->mu);
	return rc;
}

static sel_outcome d_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct dbl *d = (struct dbl *)s;
	sel_outcome o = SEL_QUEUED;
	pthread_mutex_lock(&d->mu);
	logc(d, LOG_PUT);
	struct putrec *r = rec_of(d, cp->checkpoint);
	r->key = cp->key;
	if (r->refused && d->progress <= r->progress_at_refusal)
		d->early_retries++; /* retried without store progress */
	r->refused = false;
	r->puts++;
	d->puts++;
	CHECK(cp->n_pages == cp->key.consumed / s->page_tokens && cp->tail <= cp->n_pages);
	sel_event ev = {.type = SEL_EV_STORED,
			.outcome = SEL_QUEUED,
			.checkpoint = cp->checkpoint,
			.key = cp->key};
	int kind = d->scripted ? (int)(cp->checkpoint % 4) : 0;
	if (kind == 1 && (r->puts == 1 || d->always_retry)) {
		o = SEL_RETRY;
		*why = SEL_RETRY_QUEUE;
	} else if (kind == 2 && (d->defer_one || d->defer_two) && !deferring(d, cp->checkpoint)) {
		if (!d->deferring[0])
			d->deferring[0] = cp->checkpoint;
		else if (d->defer_two && !d->deferring[1])
			d->deferring[1] = cp->checkpoint;
	}
	if (kind == 2 && (r->puts == 1 || deferring(d, cp->checkpoint))) {
		ev.type = SEL_EV_STORE_FAILED;
		ev.outcome = SEL_DEFERRED;
		ev.why = d->defer_why;
	} else if (kind == 3) {
		ev.type = SEL_EV_STORE_FAILED;
		ev.outcome = SEL_SKIPPED;
		ev.error = -EIO;
	}
	if (o == SEL_QUEUED) {
		r->pins++;
		if (++d->pins > d->max_pins)
			d->max_pins = d->pins;
		if (ev.outcome == SEL_DEFERRED) {
			/* Progress queued ahead of its own event is not after it. */
			r->refused = true;
			r->progress_at_refusal = progress_through_queue(d);
		}
		if (d->hold_stored && ev.type == SEL_EV_STORED) {
			CHECK(d->nheld_st < 1024);
			d->held_st[d->nheld_st++] = ev;
		} else {
			enqueue(d, &ev);
		}
	} else {
		r->refused = true;
		r->progress_at_refusal = d->progress;
	}
	pthread_mutex_unlock(&d->mu);
	return o;
}

static int d_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct dbl *d = (struct dbl *)s;
	pthread_mutex_lock(&d->mu);
	logc(d, LOG_POLL);
	if (d->poll_fail) {
		int rc = d->poll_fail;
		pthread_mutex_unlock(&d->mu);
		return eos_fail(rc, "test double: a copy job's completion cannot be reported");
	}
	if (!d->hold && d->nheld) {
		for (size_t i = 0; i < d->nheld; i++)
			enqueue(d, &d->held[i]);
		d->nheld = 0;
	}
	if (!d->hold_stored && d->nheld_st) {
		for (size_t i = 0; i < d->nheld_st; i++)
			enqueue(d, &d->held_st[i]);
		d->nheld_st = 0;
	}
	size_t n = d->nq < cap ? d->nq : cap;
	memcpy(ev, d->q, n * sizeof *ev);
	memmove(d->q, d->q + n, (d->nq - n) * sizeof *d->q);
	d->nq -= n;
	for (size_t i = 0; i < n; i++) {
		if (ev[i].type == SEL_EV_STORED || ev[i].type == SEL_EV_STORE_FAILED) {
			struct putrec *r = rec_of(d, ev[i].checkpoint);
			r->pins--;
			d->pins--;
		}
		d->progress += is_progress(&ev[i]);
	}
	d->delivered += n;
	if (d->nq == 0) {
		eventfd_t v;
		(void)eventfd_read(d->efd, &v);
	}
	pthread_mutex_unlock(&d->mu);
	return (int)n;
}

static void d_evicted(sel_store *s, const sel_key *key, uint64_t gen, const sel_key *heir)
{
	struct dbl *d = (struct dbl *)s;
	(void)gen;
	(void)heir;
	pthread_mutex_lock(&d->mu);
	logc(d, LOG_EVICTED);
	for (size_t i = 0; i < d->nrecs; i++)
		if (sel_key_eq(&d->recs[i].key, key)) {
			if (d->recs[i].pins)
				d->order_violations++; /* evicted while a copy-out held it */
			d->recs[i].evicted = true;
		}
	pthread_mutex_unlock(&d->mu);
}

static void d_touch(sel_store *s, const sel_key *key)
{
	(void)s;
	(void)key;
}

static void d_stats(sel_store *s, sel_stats *out)
{
	struct dbl *d = (struct dbl *)s;
	memset(out, 0, sizeof *out);
	pthread_mutex_lock(&d->mu);
	out->lookups = (uint64_t)d->lookups;
	out->fetches = (uint64_t)d->fetches;
	pthread_mutex_unlock(&d->mu);
}

static int d_wait_fd(sel_store *s) { return ((struct dbl *)s)->efd; }

static int d_close(sel_store *s, uint64_t deadline)
{
	struct dbl *d = (struct dbl *)s;
	(void)deadline;
	pthread_mutex_lock(&d->mu);
	d->closed = true;
	int rc = d->close_rc;
	pthread_mutex_unlock(&d->mu);
	return rc;
}

static void d_destroy(sel_store *s) { (void)s; /* the test owns the double */ }

static const struct sel_store_ops dbl_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "test",
	.lookup = d_lookup,
	.put = d_put,
	.fetch = d_fetch,
	.poll = d_poll,
	.evicted = d_evicted,
	.touch = d_touch,
	.stats = d_stats,
	.wait_fd = d_wait_fd,
	.close = d_close,
	.destroy = d_destroy,
};

static int d_open(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct dbl *d = ctx;
	d->base.ops = &dbl_ops;
	d->base.page_tokens = cfg->geometry->page_tokens;
	*out = &d->base;
	return 0;
}

static struct dbl *dbl_new(void)
{
	struct dbl *d = calloc(1, sizeof *d);
	CHECK(d);
	pthread_mutex_init(&d->mu, NULL);
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	CHECK(d->efd >= 0);
	d->hit_bytes = 1;
	d->fetch_error = -EIO;
	return d;
}

static void dbl_free(struct dbl *d)
{
	close(d->efd);
	free(d->recs);
	pthread_mutex_destroy(&d->mu);
	free(d);
}

#define LOCKED(d, stmt)                                                                            \
	do {                                                                                       \
		pthread_mutex_lock(&(d)->mu);                                                      \
		stmt;                                                                              \
		pthread_mutex_unlock(&(d)->mu);                                                    \
	} while (0)

/* What the worker said when the store stopped (hel_engine_config.store_stopped). */
static struct {
	pthread_mutex_t mu;
	int calls, rc;
	char reason[64], why[512];
} stopped_said = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void on_store_stopped(void *ctx, int rc, const char *reason, const char *why)
{
	(void)ctx;
	pthread_mutex_lock(&stopped_said.mu);
	stopped_said.calls++;
	stopped_said.rc = rc;
	snprintf(stopped_said.reason, sizeof stopped_said.reason, "%s", reason);
	snprintf(stopped_said.why, sizeof stopped_said.why, "%s", why);
	pthread_mutex_unlock(&stopped_said.mu);
}

static hel_engine *open_mode(struct dbl *d, uint32_t pages, uint32_t rows, hel_fetch_mode fetch)
{
	hel_engine_config c = {.core = core,
			       .max_active = 3,
			       .gpu_pages = pages,
			       .gpu_rows = rows,
			       .store_open = d_open,
			       .store_ctx = d,
			       .store_stopped = on_store_stopped,
			       .fetch = fetch};
	hel_engine *e;
	CHECK_OK(hel_engine_open(&c, &e));
	hel_engine_info info;
	hel_engine_info_get(e, &info);
	CHECK(!strcmp(info.store, "test"));
	CHECK_OK(hel_engine_start(e));
	return e;
}

static hel_engine *open_with(struct dbl *d, uint32_t pages, uint32_t rows)
{
	return open_mode(d, pages, rows, HEL_FETCH_AUTO);
}

static bool idle(const hel_engine_stats *st, void *arg)
{
	(void)arg;
	return st->pending == 0 && st->active == 0;
}

static bool inbound_is(const hel_engine_stats *st, void *arg)
{
	return st->inbound_waiting == *(uint64_t *)arg;
}

static void check_ref(const struct et_call *c, const hel_token *p, uint32_t n, uint32_t max)
{
	struct et_ref ref;
	et_reference(core, p, n, max, NULL, &ref);
	et_same_as_ref(NULL, c, &ref);
	et_ref_free(&ref);
}

static void fillers(hel_engine *e, int count)
{
	for (int i = 0; i < count; i++) {
		uint32_t n;
		hel_token *p = et_random_prompt(&rng, 100 + test_rng_below(&rng, 100), &n);
		et_call_free(et_run(e, p, n, 1 + (uint32_t)test_rng_below(&rng, 4), NULL));
		free(p);
	}
}

/* Everything the cache holds can still be used: a request needing every
 * page fits (a leaked ticket id or checkpoint pin would make it wait
 * forever).  A one-message prompt is its text plus 19 tokens. */
static void big_request_fits(hel_engine *e, uint32_t pages)
{
	uint32_t n;
	hel_token *p = et_random_prompt(&rng, pages * core->page_tokens - 19 - 8, &n);
	CHECK((n + 8) / core->page_tokens == pages);
	struct et_call *c = et_run(e, p, n, 8, NULL);
	check_ref(c, p, n, 8);
	et_call_free(c);
	free(p);
}

/* ---- inbound failures -------------------------------------------------------------- */

static void test_fetch_failed(void)
{
	struct dbl *d = dbl_new();
	hel_engine *e = open_with(d, 24, 24);
	uint32_t n;
	hel_token *p = et_random_prompt(&rng, 180, &n);
	hel_token *p2 = malloc((n + 5) * sizeof *p2);
	memcpy(p2, p, n * sizeof *p);
	for (int i = 0; i < 5; i++)
		p2[n + i] = 'a' + (hel_token)i;
	/* Both prompts share the first 130 tokens: one ticket at 130. */
	LOCKED(d, {
		d->hit_at = 130;
		d->hold = true;
	});
	struct et_call *a = et_call_new(), *b = et_call_new();
	CHECK_OK(et_submit(e, a, p, n, 20, NULL));
	CHECK_OK(et_submit(e, b, p2, n + 5, 20, NULL));
	uint64_t two = 2;
	et_wait_stats(e, inbound_is, &two);
	LOCKED(d, {
		CHECK(d->fetches == 1 && d->lookups == 2);
		d->hold = false;
		d->hit_at = 0;
	});
	et_wait(a);
	et_wait(b);
	check_ref(a, p, n, 20);
	check_ref(b, p2, n + 5, 20);
	CHECK(a->out.reused_host_tokens == 0 && a->out.cached_tokens == 0 &&
	      a->out.prefill_tokens == n && a->out.host_tier == SEL_TIER_NONE);
	/* Re-admitted without asking the store again. */
	LOCKED(d, CHECK(d->lookups == 2 && d->fetches == 1));
	et_wait_stats(e, idle, NULL);
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	CHECK(st.host_fetch_failed == 2 && st.host_hits == 2 && st.inbound_waiting == 0);

	/* Requeued at the front: the failed waiter runs before a request
	 * queued after it.  One active slot makes the order visible. */
	et_call_free(a);
	et_call_free(b);

	/* A fetch the store refuses at once (the chain went: -ESTALE). */
	LOCKED(d, {
		d->hit_at = 70;
		d->fetch_rc = -ESTALE;
	});
	a = et_run(e, p, n, 10, NULL);
	CHECK(a->out.reused_host_tokens == 0);
	check_ref(a, p, n, 10);
	LOCKED(d, {
		CHECK(d->fetches == 1);
		d->fetch_rc = 0;
		d->hit_at = 0;
	});
	et_call_free(a);

	/* A hit the policy declines: recomputed, no fetch. */
	uint32_t n3;
	hel_token *p3 = et_random_prompt(&rng, 180, &n3);
	LOCKED(d, {
		d->hit_at = 150;
		d->hit_bytes = 1ull << 50;
	});
	a = et_run(e, p3, n3, 10, NULL);
	check_ref(a, p3, n3, 10);
	free(p3);
	CHECK(a->out.reused_host_tokens == 0);
	LOCKED(d, {
		CHECK(d->fetches == 1);
		d->hit_at = 0;
		d->hit_bytes = 1;
	});
	et_wait_stats(e, idle, NULL);
	hel_engine_stats_get(e, &st);
	CHECK(st.host_fetch_declined >= 1);
	/* Two failed restores of 1 MiB in a second each: no samples. */
	CHECK(st.store.tier[SEL_TIER_MEMORY].rate_bps == 20000000000ull);
	CHECK(st.store.tier[SEL_TIER_MEMORY].fixed_ns == 50000);
	et_call_free(a);

	big_request_fits(e, 24);
	CHECK_OK(hel_engine_stop(e, 0));
	LOCKED(d, CHECK(d->closed));
	hel_engine_destroy(e);
	free(p);
	free(p2);
	dbl_free(d);
}

/* One active request at a time: a failed waiter goes back ahead of a
 * request that queued behind it. */
static struct et_call *order[4];
static int norder;
static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;

static void order_done(void *ctx, const hel_outcome *o)
{
	pthread_mutex_lock(&order_mu);
	order[norder++] = ctx;
	pthread_mutex_unlock(&order_mu);
	et_on_done(ctx, o);
}

static void test_requeue_front(void)
{
	struct dbl *d = dbl_new();
	hel_engine_config c = {.core = core,
			       .max_active = 1,
			       .gpu_pages = 24,
			       .gpu_rows = 24,
			       .store_open = d_open,
			       .store_ctx = d};
	hel_engine *e;
	CHECK_OK(hel_engine_open(&c, &e));
	CHECK_OK(hel_engine_start(e));
	uint32_t n1, n2;
	hel_token *p1 = et_random_prompt(&rng, 150, &n1), *p2 = et_random_prompt(&rng, 40, &n2);
	LOCKED(d, {
		d->hit_at = 128;
		d->hold = true;
	});
	struct et_call *a = et_call_new(), *b = et_call_new();
	hel_request q = {.prompt = p1,
			 .n_prompt = n1,
			 .max_tokens = 6,
			 .on_tokens = et_on_tokens,
			 .on_done = order_done,
			 .ctx = a};
	CHECK_OK(hel_engine_submit(e, &q, &a->id));
	uint64_t one = 1;
	et_wait_stats(e, inbound_is, &one);
	q = (hel_request){.prompt = p2,
			  .n_prompt = n2,
			  .max_tokens = 6,
			  .on_tokens = et_on_tokens,
			  .on_done = order_done,
			  .ctx = b};
	CHECK_OK(hel_engine_submit(e, &q, &b->id));
	LOCKED(d, {
		d->hold = false;
		d->hit_at = 0;
	});
	et_wait(a);
	et_wait(b);
	pthread_mutex_lock(&order_mu);
	CHECK(norder == 2 && order[0] == a && order[1] == b);
	pthread_mutex_unlock(&order_mu);
	check_ref(a, p1, n1, 6);
	check_ref(b, p2, n2, 6);
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	et_call_free(a);
	et_call_free(b);
	free(p1);
	free(p2);
	dbl_free(d);
}

/* ---- put outcomes, pins, notices --------------------------------------------------------- */

/* No checkpoint holds a worker pin (every Queued put had its event). */
static bool no_pins(struct dbl *d)
{
	bool none = true;
	pthread_mutex_lock(&d->mu);
	for (size_t i = 0; i < d->nrecs && none; i++)
		none = d->recs[i].pins == 0;
	pthread_mutex_unlock(&d->mu);
	return none;
}

static void test_put_outcomes(void)
{
	struct dbl *d = dbl_new();
	LOCKED(d, d->scripted = true);
	hel_engine *e = open_with(d, 24, 30);
	/* Conversations and fillers: checkpoints of every kind, offered and
	 * evicted under pressure. */
	for (int round = 0; round < 3 * ET_SCALE; round++) {
		struct et_chat ch = {0};
		char text[120];
		for (int turn = 0; turn < 3; turn++) {
			size_t len = 20 + test_rng_below(&rng, 90);
			et_text(&rng, text, len);
			et_chat_add(&ch, "user", text, len);
			uint32_t n;
			hel_token *p = et_chat_prompt(&ch, &n);
			struct et_call *c = et_run(e, p, n, 12, NULL);
			check_ref(c, p, n, 12);
			et_chat_reply(&ch, c->tok, c->n);
			et_call_free(c);
			free(p);
		}
		et_chat_free(&ch);
		fillers(e, 3);
	}
	/* Push everything out: every offered checkpoint must go, so none kept a
	 * pin (a leaked pin keeps its checkpoint forever). */
	fillers(e, 20);
	/* Idle requests do not mean settled puts: the last terminals are
	 * offered, and their events polled, an iteration or two later. */
	et_settle(e);
	CHECK(no_pins(d));
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	int puts_by_kind[4] = {0}, evicted_by_kind[4] = {0}, n_by_kind[4] = {0};
	pthread_mutex_lock(&d->mu);
	CHECK(d->order_violations == 0);
	CHECKF(d->early_retries == 0, "%d puts retried without store progress", d->early_retries);
	/* Between two polls (one service_store), no eviction notice after a put. */
	bool put_seen = false;
	for (size_t i = 0; i < d->nlog; i++) {
		if (d->log[i] == LOG_POLL)
			put_seen = false;
		else if (d->log[i] == LOG_PUT)
			put_seen = true;
		else
			CHECKF(!put_seen,
			       "eviction notice after a put in one iteration (log entry %zu)", i);
	}
	size_t old = 0;
	for (size_t i = 0; i < d->nrecs; i++) {
		struct putrec *r = &d->recs[i];
		int k = (int)(r->id % 4);
		CHECK(r->pins == 0);
		n_by_kind[k]++;
		puts_by_kind[k] += r->puts;
		evicted_by_kind[k] += r->evicted;
		if (k == 3)
			CHECK(r->puts == 1 || r->evicted); /* failed copies are not retried */
		old += r->evicted;
	}
	printf("offered by kind %d %d %d %d, puts %d %d %d %d, evicted %d %d %d %d; "
	       "abandoned inflight %llu slabs %llu queue %llu\n",
	       n_by_kind[0], n_by_kind[1], n_by_kind[2], n_by_kind[3], puts_by_kind[0],
	       puts_by_kind[1], puts_by_kind[2], puts_by_kind[3], evicted_by_kind[0],
	       evicted_by_kind[1], evicted_by_kind[2], evicted_by_kind[3],
	       (unsigned long long)st.retry_abandoned[SEL_RETRY_INFLIGHT],
	       (unsigned long long)st.retry_abandoned[SEL_RETRY_SLABS],
	       (unsigned long long)st.retry_abandoned[SEL_RETRY_QUEUE]);
	for (int k = 0; k < 4; k++)
		CHECK(n_by_kind[k] > 0);
	/* Retry and Deferred were put again (or abandoned when their
	 * checkpoint went first); Queued ones once. */
	CHECK(puts_by_kind[1] > n_by_kind[1] && puts_by_kind[2] > n_by_kind[2]);
	CHECK(2 * n_by_kind[1] - puts_by_kind[1] <=
	      (int)(st.retry_abandoned[SEL_RETRY_QUEUE] + st.store_retries_pending));
	/* All but the last fillers' checkpoints were evicted. */
	CHECKF(old + 40 >= d->nrecs, "only %zu of %zu offered checkpoints evicted", old, d->nrecs);
	pthread_mutex_unlock(&d->mu);
	CHECK(st.evictions_noticed > 0 && st.publications > 0);
	big_request_fits(e, 24);
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	dbl_free(d);
}

/* A Retry whose checkpoint leaves the GPU before any progress is abandoned
 * by its reason. */
static void test_retry_abandoned(void)
{
	struct dbl *d = dbl_new();
	LOCKED(d, {
		d->scripted = true;
		d->always_retry = true;
	});
	hel_engine *e = open_with(d, 12, 20);
	/* Kind-1 checkpoints are refused on every put: retried after each
	 * progress until the GPU evicts them, then abandoned. */
	fillers(e, 30);
	et_wait_stats(e, idle, NULL);
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	CHECK(st.retry_abandoned[SEL_RETRY_QUEUE] > 0);
	CHECK(st.retry_abandoned[SEL_RETRY_INFLIGHT] == 0 && st.store_retries_pending <= 6);
	pthread_mutex_lock(&d->mu);
	CHECK(d->early_retries == 0);
	pthread_mutex_unlock(&d->mu);
	big_request_fits(e, 12);
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	dbl_free(d);
}

/* A Deferred put is abandoned by the cause its event names (design 2.15:
 * the disk store defers for disk budget); one without a cause counts as
 * out of slots. */
static bool abandoned_for(const hel_engine_stats *st, void *arg)
{
	return st->retry_abandoned[*(sel_retry_reason *)arg] > 0;
}

static void test_deferred_abandoned(sel_retry_reason why)
{
	struct dbl *d = dbl_new();
	LOCKED(d, {
		d->scripted = true;
		d->defer_one = true;
		d->defer_why = why;
	});
	hel_engine *e = open_with(d, 12, 20);
	/* One checkpoint is deferred on every put until the GPU evicts it. */
	fillers(e, 30);
	et_wait_stats(e, idle, NULL);
	big_request_fits(e, 12);
	sel_retry_reason want = why == SEL_RETRY_NONE ? SEL_RETRY_SLABS : why;
	et_wait_stats(e, abandoned_for, &want);
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	for (int r = 0; r < SEL_RETRY_REASONS; r++)
		if (r != (int)want && r != SEL_RETRY_QUEUE) /* kind 1 is refused once (queue) */
			CHECKF(st.retry_abandoned[r] == 0, "%s abandoned",
			       sel_retry_reason_name(r));
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	dbl_free(d);
}

/* Two checkpoints deferred on every put (a full disk): each one's Deferred
 * event is no progress for the other, so they do not re-offer each other
 * (the worker used to count any event as progress, and two such records
 * kept each other -- and a GPU pin each -- going for ever).  They are
 * offered again only after real progress, and abandoned once evicted. */
static bool two_abandoned_budget(const hel_engine_stats *st, void *arg)
{
	(void)arg;
	return st->retry_abandoned[SEL_RETRY_BUDGET] >= 2;
}

static void test_retry_storm_two_deferred(void)
{
	struct dbl *d = dbl_new();
	LOCKED(d, {
		d->scripted = true;
		d->defer_two = true;
		d->defer_why = SEL_RETRY_BUDGET;
	});
	/* A cache large enough that the first deferred checkpoint stays on
	 * the GPU until the second is chosen (that can take a dozen fillers;
	 * with 24 pages the first was sometimes evicted and abandoned). */
	hel_engine *e = open_with(d, 160, 60);
	bool both = false;
	int nfill = 0;
	for (int i = 0; i < 100 && !both; i++, nfill++) {
		fillers(e, 1);
		LOCKED(d, both = d->deferring[1] != 0);
	}
	CHECK(both);
	et_settle(e); /* the last events handled */
	CHECK(no_pins(d));
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	CHECKF(st.store_retries_pending >= 2,
	       "retries pending %llu, abandoned budget %llu, "
	       "evicted %d %d, fillers %d",
	       (unsigned long long)st.store_retries_pending,
	       (unsigned long long)st.retry_abandoned[SEL_RETRY_BUDGET],
	       rec_of(d, d->deferring[0])->evicted, rec_of(d, d->deferring[1])->evicted, nfill);
	/* Settled means neither is being offered now; woken again, the
	 * worker still finds nothing to offer. */
	int puts0, puts1;
	LOCKED(d, puts0 = d->puts);
	struct et_since since = {st.loops};
	(void)eventfd_write(d->efd, 1);
	et_wait_stats(e, et_settled_since, &since);
	LOCKED(d, puts1 = d->puts);
	CHECKF(puts1 == puts0, "%d puts while idle: deferred checkpoints re-offer each other",
	       puts1 - puts0);
	/* Evicted by later requests: abandoned by the deferral's cause. */
	for (int i = 0; i < 400; i++) {
		fillers(e, 1);
		hel_engine_stats_get(e, &st);
		if (two_abandoned_budget(&st, NULL))
			break;
	}
	et_wait_stats(e, two_abandoned_budget, NULL);
	et_settle(e);
	hel_engine_stats_get(e, &st);
	pthread_mutex_lock(&d->mu);
	CHECKF(d->early_retries == 0, "%d puts retried without store progress", d->early_retries);
	CHECKF(d->max_pins <= (int)st.copyout_pin_limit, "%d copy-out pins at once, bound %llu",
	       d->max_pins, (unsigned long long)st.copyout_pin_limit);
	CHECK(d->pins == 0);
	for (int k = 0; k < 2; k++)
		CHECK(rec_of(d, d->deferring[k])->evicted);
	printf("two deferring checkpoints: %d and %d puts, %d puts in all, at most %d pins\n",
	       rec_of(d, d->deferring[0])->puts, rec_of(d, d->deferring[1])->puts, d->puts,
	       d->max_pins);
	pthread_mutex_unlock(&d->mu);
	big_request_fits(e, 24);
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	dbl_free(d);
}

/* Copy-outs that never complete (a disk far behind) pin at most
 * max(1, rows / 4) GPU checkpoints: requests go on finishing, and the
 * publications beyond the bound wait unpinned (counted, reason inflight)
 * and are abandoned when evicted, or offered once pins drop.  Unbounded,
 * every publication kept its row pinned until admission found none. */
static bool drained(const hel_engine_stats *st, void *arg)
{
	(void)arg;
	return st->copyout_pins == 0 && st->store_retries_pending == 0;
}

static void test_copyouts_pin_the_gpu_cache(void)
{
	struct dbl *d = dbl_new();
	LOCKED(d, d->hold_stored = true);
	hel_engine *e = open_with(d, 24, 20);
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	CHECK(st.copyout_pin_limit == 5); /* 20 rows / 4 */
	for (int i = 0; i < 12 * ET_SCALE; i++) {
		uint32_t n;
		hel_token *p = et_random_prompt(&rng, 100 + test_rng_below(&rng, 100), &n);
		struct et_call *c = et_run(e, p, n, 1 + (uint32_t)test_rng_below(&rng, 4), NULL);
		check_ref(c, p, n, c->out.completion_tokens);
		et_call_free(c);
		free(p);
		hel_engine_stats_get(e, &st);
		CHECK(st.copyout_pins <= st.copyout_pin_limit);
	}
	et_wait_stats(e, et_quiet, NULL); /* every publication offered */
	hel_engine_stats_get(e, &st);
	pthread_mutex_lock(&d->mu);
	int held = d->pins, most = d->max_pins;
	pthread_mutex_unlock(&d->mu);
	CHECKF(most <= 5 && held <= 5, "%d copy-out pins (at most %d at once), bound 5", held,
	       most);
	CHECK(held > 0 && st.copyout_pin_waits > 0 && st.retry_abandoned[SEL_RETRY_INFLIGHT] > 0);
	printf("copy-outs held: %d pins (bound %llu), %llu puts held back, %llu abandoned\n", held,
	       (unsigned long long)st.copyout_pin_limit, (unsigned long long)st.copyout_pin_waits,
	       (unsigned long long)st.retry_abandoned[SEL_RETRY_INFLIGHT]);
	/* The copies land: the pins go and what waits under the bound is
	 * offered while it is still in the GPU cache. */
	int puts0;
	LOCKED(d, {
		d->hold_stored = false;
		puts0 = d->puts;
	});
	(void)eventfd_write(d->efd, 1);
	et_wait_stats(e, drained, NULL);
	et_settle(e);
	pthread_mutex_lock(&d->mu);
	CHECK(d->pins == 0 && d->max_pins <= 5 && d->early_retries == 0);
	CHECK(d->puts > puts0 || st.store_retries_pending == 0);
	pthread_mutex_unlock(&d->mu);
	big_request_fits(e, 24);
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	dbl_free(d);
}

/* ---- a store that stops ------------------------------------------------------------------------ */

static void test_store_stops(bool drains)
{
	struct dbl *d = dbl_new();
	hel_engine *e = open_with(d, 24, 24);
	uint32_t n;
	hel_token *p = et_random_prompt(&rng, 160, &n);
	LOCKED(d, {
		d->hit_at = 128;
		d->hold = true;
	});
	struct et_call *a = et_call_new();
	CHECK_OK(et_submit(e, a, p, n, 16, NULL));
	uint64_t one = 1;
	et_wait_stats(e, inbound_is, &one);
	/* The store fails for good: the waiter recomputes without it. */
	LOCKED(d, {
		d->poll_fail = SEL_ESTOPPED;
		d->close_rc = drains ? 0 : SEL_ESTOPPED;
	});
	(void)eventfd_write(d->efd, 1);
	et_wait(a);
	check_ref(a, p, n, 16);
	CHECK(a->out.reused_host_tokens == 0);
	int lookups;
	LOCKED(d, lookups = d->lookups);
	struct et_call *b = et_run(e, p, n, 16, NULL); /* no store calls any more */
	check_ref(b, p, n, 16);
	LOCKED(d, CHECK(d->lookups == lookups));
	et_wait_stats(e, idle, NULL);
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	CHECK(st.store_stopped && st.store_enabled);
	/* Regression (store_stop_is_silent): the worker served on without a
	 * cache and nothing said so.  One call, with the reason and the
	 * store's message; the gauges say it too. */
	pthread_mutex_lock(&stopped_said.mu);
	CHECKF(stopped_said.calls == 1 && stopped_said.rc == SEL_ESTOPPED &&
		       !strcmp(stopped_said.reason, "transfer_failed") &&
		       strstr(stopped_said.why, "cannot be reported"),
	       "%d calls, rc %d, reason %s, why %s", stopped_said.calls, stopped_said.rc,
	       stopped_said.reason, stopped_said.why);
	stopped_said.calls = 0;
	pthread_mutex_unlock(&stopped_said.mu);
	CHECK(st.store_stop_rc == SEL_ESTOPPED && !strcmp(st.store_stop_reason, "transfer_failed"));
	struct flare_buf mb = {0};
	flare_metrics_format(&mb, &st, NULL, NULL);
	CHECKF(strstr(mb.data, "\nflare_host_cache_enabled 0\n") &&
		       strstr(mb.data,
			      "\nflare_host_cache_stopped{reason=\"transfer_failed\"} 1\n"),
	       "%s", mb.data);
	flare_buf_free(&mb);
	int rc = hel_engine_stop(e, 0);
	CHECK_RC(rc, drains ? 0 : SEL_ESTOPPED);
	CHECK_RC(hel_engine_stop(e, 0), rc);
	hel_engine_destroy(e); /* SEL_ESTOPPED: the engine keeps its memory */
	et_call_free(a);
	et_call_free(b);
	free(p);
	if (drains)
		dbl_free(d);
	/* else the double stays allocated: the kept engine still points at it */
}

/* --prefix-cache-fetch always / never: the policy is not asked. */
static void test_fetch_modes(void)
{
	hel_engine_config bad = {.core = core, .fetch = (hel_fetch_mode)7};
	hel_engine *e;
	CHECK_RC(hel_engine_open(&bad, &e), -EINVAL);
	CHECK(strstr(sel_errmsg(), "fetch mode 7"));

	for (int m = 0; m < 2; m++) {
		struct dbl *d = dbl_new();
		e = open_mode(d, 24, 24, m == 0 ? HEL_FETCH_ALWAYS : HEL_FETCH_NEVER);
		uint32_t n;
		hel_token *p = et_random_prompt(&rng, 180, &n);
		/* always: a hit no tier could restore in time, fetched (and
		 * failed by the double); never: a free one, recomputed. */
		LOCKED(d, {
			d->hit_at = 150;
			d->hit_bytes = m == 0 ? 1ull << 50 : 1;
		});
		struct et_call *a = et_run(e, p, n, 10, NULL);
		check_ref(a, p, n, 10);
		CHECK(a->out.reused_host_tokens == 0);
		et_wait_stats(e, idle, NULL);
		hel_engine_stats st;
		hel_engine_stats_get(e, &st);
		LOCKED(d, CHECK(d->lookups >= 1 && d->fetches == (m == 0 ? 1 : 0)));
		CHECK(m == 0 ? st.host_fetch_declined == 0 && st.host_fetch_failed == 1
			     : st.host_fetch_declined >= 1 && st.host_hits == 0);
		et_call_free(a);
		free(p);
		CHECK_OK(hel_engine_stop(e, 0));
		hel_engine_destroy(e);
		dbl_free(d);
	}
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	test_fetch_failed();
	test_fetch_modes();
	test_requeue_front();
	test_put_outcomes();
	test_retry_abandoned();
	test_deferred_abandoned(SEL_RETRY_BUDGET);
	test_deferred_abandoned(SEL_RETRY_NONE);
	test_retry_storm_two_deferred();
	test_copyouts_pin_the_gpu_cache();
	test_store_stops(true);
	test_store_stops(false);
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
