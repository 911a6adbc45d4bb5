/*
 * test_engine_late.c - the late-answer retry of an admitted request
 * (design 2.15 "Lookups"; engine.c late_mark / late_retries): a request
 * whose lookup was held, then admitted on the local answer when the grace
 * period ended (a restore of a shorter prefix), is readmitted through
 * ordinary admission when a deeper answer arrives before its restore
 * drained, and restores the deeper source; not when the deeper answer
 * arrives once its prefill was submitted, not once it was cancelled, and
 * not for a request with an image (conditioned inputs keep their
 * decision).  Every reply has the tokens of the model run directly (of a
 * cold engine, with the image).
 *
 * The store is a memory store behind a double that plays the pool's
 * ticket: while `state` is PENDING it answers lookups of the prompt
 * SEL_LOOKUP_PENDING; EXPIRED, the local answer (the memory store's, at
 * most the short prefix S); ANSWERED, the memory store's whole answer
 * (the prompt P, deeper: the "late answer").  It is engine_test.h's gate,
 * which holds restores' completions while told to, so the test decides
 * what arrives before the restore drained.  Waits are by condition with deadlines.
 */
#include <png.h>

#include "engine_test.h"
#include "helios/image.h"
#include "helios/vision.h"
#include "imgutil.h"
#include "inpututil.h"

static hel_core *core, *vcore; /* the built-in text core; a vision core */
static test_rng rng;

enum {
	OFF,
	PENDING,
	EXPIRED,
	ANSWERED
};

/* engine_test.h's gate (restore completions held while its hold is set)
 * with the pool ticket's lookups. */
struct late {
	struct et_gate g;
	uint64_t limit, short_limit; /* the prompt's lookups; the local answer's depth */
	int state;                   /* atomic */
	uint64_t pendings;           /* atomic: PENDING answers */
	uint64_t held_resident;      /* the resident count of the last PENDING lookup */
	uint64_t fetches, deep_fetches, deep_consumed; /* atomic */
};

static struct late *L(sel_store *s) { return (struct late *)s; }

static int l_lookup(sel_store *s, const sel_history *h, uint64_t res, uint64_t lim, sel_hit *hit)
{
	struct late *d = L(s);
	int st = __atomic_load_n(&d->state, __ATOMIC_SEQ_CST);
	if (st == OFF || lim != d->limit || st == ANSWERED)
		return sel_store_lookup(d->g.inner, h, res, lim, hit);
	if (st == PENDING) {
		d->held_resident = res;
		__atomic_add_fetch(&d->pendings, 1, __ATOMIC_SEQ_CST);
		return SEL_LOOKUP_PENDING;
	}
	uint64_t top = lim < d->short_limit ? lim : d->short_limit;
	return top > res ? sel_store_lookup(d->g.inner, h, res, top, hit) : 0;
}

static int l_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct late *d = L(s);
	int rc = et_gate_fetch(s, hit, in);
	if (rc == 0 && hit->key.consumed > d->short_limit) {
		__atomic_add_fetch(&d->deep_fetches, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&d->deep_consumed, hit->key.consumed, __ATOMIC_SEQ_CST);
	}
	if (rc == 0)
		__atomic_add_fetch(&d->fetches, 1, __ATOMIC_SEQ_CST);
	return rc;
}

static const struct sel_store_ops late_ops = {.lookup = l_lookup, .fetch = l_fetch};

static int late_open(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct late *d = ctx;
	return et_gate_open_over(&d->g, cfg, out, &late_ops);
}

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t get(uint64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static void set(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

/* Up to 30 s for *p >= want. */
static void wait_at_least(uint64_t *p, uint64_t want) { TEST_UNTIL(get(p) >= want, 30); }


/* A prompt, with an image or none. */
struct prompt {
	hel_token tok[ET_MAXTOK];
	uint32_t n;
	hel_image_input img;
	bool has_img;
};

static int submit(hel_engine *e, struct et_call *c, const struct prompt *p, uint32_t n,
		  uint32_t max)
{
	hel_request q = {.prompt = p->tok,
			 .n_prompt = n,
			 .images = p->has_img ? &p->img : NULL,
			 .n_images = p->has_img,
			 .max_tokens = max,
			 .on_tokens = et_on_tokens,
			 .on_done = et_on_done,
			 .ctx = c};
	return hel_engine_submit(e, &q, &c->id);
}

static struct et_call *run(hel_engine *e, const struct prompt *p, uint32_t n, uint32_t max)
{
	struct et_call *c = et_call_new();
	CHECK_OK(submit(e, c, p, n, max));
	et_wait(c);
	CHECKF(c->out.error == 0, "request failed: %s", sel_strerror(c->out.error));
	return c;
}

/* The model's reply: the text core run directly, or a cold engine. */
static void same_as_model(const hel_core *k, const struct et_call *c, const struct prompt *p,
			  uint32_t max)
{
	CHECK(c->out.error == 0);
	if (!p->has_img) {
		struct et_ref ref;
		et_reference(k, p->tok, p->n, max, NULL, &ref);
		CHECK(c->n == ref.n && !memcmp(c->tok, ref.tok, ref.n * sizeof *ref.tok));
		et_ref_free(&ref);
		return;
	}
	hel_engine *e;
	CHECK_OK(hel_engine_open(&(hel_engine_config){.core = k, .max_active = 2}, &e));
	CHECK_OK(hel_engine_start(e));
	struct et_call *r = run(e, p, p->n, max);
	CHECK(c->n == r->n && !memcmp(c->tok, r->tok, r->n * sizeof *r->tok));
	hel_engine_destroy(e);
	et_call_free(r);
}

/* A text prompt of about 300 tokens. */
static void text_prompt(struct prompt *p)
{
	uint32_t n;
	hel_token *t = et_random_prompt(&rng, 300, &n);
	CHECK(n <= ET_MAXTOK);
	memcpy(p->tok, t, n * sizeof *t);
	p->n = n;
	p->has_img = false;
	free(t);
}

/* A chat with an image near its start and a long text after it. */
static void image_prompt(struct prompt *p, struct imgbuf *b)
{
	uint8_t *px = img_pattern(40, 24, 3, 5);
	img_png(b, 40, 24, PNG_COLOR_TYPE_RGB, 8, px, 40 * 3, NULL);
	free(px);
	hel_image_limits l = hel_image_limits_default();
	hel_image_format f;
	uint32_t w, h, gh, gw;
	CHECK_OK(hel_image_probe(b->b, b->n, &l, &f, &w, &h));
	hel_vision_grid(&vcore->image, w, h, &gh, &gw);
	char text[300];
	et_text(&rng, text, sizeof text - 1);
	text[sizeof text - 1] = 0;
	hel_message_image span = {.offset = 4, .tokens = gh * gw};
	hel_message m[2] = {
		{.role = "system", .content = "Be brief.", .content_len = 9},
		{.role = "user",
		 .content = text,
		 .content_len = strlen(text),
		 .images = &span,
		 .n_images = 1},
	};
	size_t n = hel_chat_template(m, 2, true, p->tok, ET_MAXTOK);
	CHECK(n <= ET_MAXTOK);
	p->n = (uint32_t)n;
	uint32_t at = 0;
	while (p->tok[at] != HEL_TOK_IMAGE)
		at++;
	p->img = (hel_image_input){.bytes = b->b, .len = b->n, .at = at, .tokens = span.tokens};
	p->has_img = true;
}

/* S (the prompt's first 128 tokens) and P reach the store, then fillers
 * push both out of the small GPU cache. */
static void prepare(hel_engine *e, const struct prompt *p, uint32_t s)
{
	et_call_free(run(e, p, s, 2));
	et_call_free(run(e, p, p->n, 2));
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
	CANCELLED,
	IMAGE
};

static bool has_token(struct et_call *c)
{
	pthread_mutex_lock(&c->mu);
	bool t = c->n > 0 || c->done;
	pthread_mutex_unlock(&c->mu);
	return t;
}

static void run_case(enum when w)
{
	static struct late d;
	static struct prompt p;
	memset(&d, 0, sizeof d);
	struct imgbuf img = {0};
	const hel_core *k = w == IMAGE ? vcore : core;
	hel_engine_config c = {.core = k,
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
	if (w == IMAGE)
		image_prompt(&p, &img);
	else
		text_prompt(&p);
	const uint32_t s = 128;
	CHECKF(p.n > 2 * s && (!p.has_img || p.img.at + p.img.tokens < s), "%u tokens", p.n);
	d.limit = p.n;
	d.short_limit = s;
	prepare(e, &p, s);

	/* Held; the grace period ends: admitted on the local answer, S, whose
	 * restore is held back. */
	et_gate_hold(&d.g, true);
	set(&d.state, PENDING);
	struct et_call *x = et_call_new();
	CHECK_OK(submit(e, x, &p, p.n, 4));
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
		et_gate_hold(&d.g, false);
		et_wait(x);
		hel_engine_stats_get(e, &st);
		CHECKF(st.late_retries == 1, "%llu retries", (unsigned long long)st.late_retries);
		CHECK(get(&d.deep_fetches) == 1 && get(&d.fetches) == fetches + 2);
		CHECK(x->out.cached_tokens == get(&d.deep_consumed) && x->out.cached_tokens > s);
		CHECK(x->out.reused_gpu_tokens == s); /* the restored S, then P's tail */
	} else if (w == STARTED) {
		/* S drains first: prefill starts; the deeper answer after it
		 * changes nothing. */
		et_gate_hold(&d.g, false);
		TEST_UNTIL(has_token(x), 30);
		set(&d.state, ANSWERED);
		et_wait(x);
		hel_engine_stats_get(e, &st);
		CHECK(st.late_retries == 0 && get(&d.deep_fetches) == 0);
		CHECK(x->out.cached_tokens == s);
	} else if (w == IMAGE) {
		/* The deeper answer arrives while S is restoring, but the
		 * request has an image: it keeps its decision. */
		set(&d.state, ANSWERED);
		et_gate_hold(&d.g, false);
		et_wait(x);
		hel_engine_stats_get(e, &st);
		CHECK(st.late_retries == 0 && get(&d.deep_fetches) == 0);
		CHECKF(x->out.cached_tokens <= s && x->out.cached_tokens > 0,
		       "cached %llu gpu %llu host %llu", (unsigned long long)x->out.cached_tokens,
		       (unsigned long long)x->out.reused_gpu_tokens,
		       (unsigned long long)x->out.reused_host_tokens);
	} else {
		/* Cancelled while restoring, the deeper answer in: no retry. */
		set(&d.state, ANSWERED);
		CHECK_OK(hel_engine_cancel(e, x->id));
		et_wait(x);
		et_gate_hold(&d.g, false);
		et_settle(e);
		hel_engine_stats_get(e, &st);
		CHECK(st.late_retries == 0 && get(&d.deep_fetches) == 0);
		CHECK(x->out.error == 0 && x->n < 4);
	}
	if (w != CANCELLED)
		same_as_model(k, x, &p, 4);
	set(&d.state, OFF);
	/* Serving goes on: the prompt again, the model's tokens. */
	struct et_call *y = run(e, &p, p.n, 4);
	same_as_model(k, y, &p, 4);
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	et_call_free(x);
	et_call_free(y);
	imgbuf_free(&img);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	vcore = test_core_load("vision-small");
	run_case(RETRY);
	run_case(STARTED);
	run_case(CANCELLED);
	run_case(IMAGE);
	hel_core_free(core);
	hel_core_free(vcore);
	printf("ok\n");
	return 0;
}
