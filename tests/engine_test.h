/*
 * engine_test.h - helpers for the engine tests (header-only; static
 * functions): request collectors, chat prompts, a reference decoder that
 * runs the model directly, a logits recorder, and a gate store that wraps
 * another store to hold fetch completions and corrupt restored bytes.
 */
#ifndef ENGINE_TEST_H
#define ENGINE_TEST_H

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"
#include "helios/core.h"
#include "helios/engine.h"
#include "helios/model.h"
#include "helios/tokenizer.h"
#include "selene_store.h" /* the gate below is a store double */
#include "testutil.h"
#include "transfer.h" /* the gate's slow copy backend */

#ifdef SEL_SANITIZED
#define ET_SCALE 1
#else
#define ET_SCALE 3
#endif

#define ET_MAXTOK 512
#define ET_FN static __attribute__((unused))

/* ---- a request and what came back ------------------------------------------- */

struct et_call {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	hel_token tok[ET_MAXTOK];
	uint32_t n;
	hel_outcome out;
	int done;         /* on_done calls */
	bool late_tokens; /* on_tokens after on_done */
	uint64_t id;
	hel_logprob lp[ET_MAXTOK]; /* with logprobs */
	bool have_lp;
	uint32_t stop_after; /* on_tokens ends the request after this many tokens (0: never) */
};

ET_FN uint32_t et_on_tokens(void *ctx, const hel_token *t, const hel_logprob *lp, uint32_t n)
{
	struct et_call *c = ctx;
	uint32_t keep = 0;
	pthread_mutex_lock(&c->mu);
	if (c->done)
		c->late_tokens = true;
	/* Tokens after a stop are discarded, as the front end does. */
	for (uint32_t i = 0; i < n && c->n < ET_MAXTOK && !keep; i++) {
		if (lp)
			c->lp[c->n] = lp[i];
		c->have_lp |= lp != NULL;
		c->tok[c->n++] = t[i];
		if (c->stop_after && c->n == c->stop_after)
			keep = i + 1;
	}
	pthread_mutex_unlock(&c->mu);
	return keep;
}

ET_FN void et_on_done(void *ctx, const hel_outcome *o)
{
	struct et_call *c = ctx;
	pthread_mutex_lock(&c->mu);
	c->out = *o;
	c->done++;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

ET_FN struct et_call *et_call_new(void)
{
	struct et_call *c = calloc(1, sizeof *c);
	CHECK(c);
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	return c;
}

ET_FN void et_call_free(struct et_call *c)
{
	if (!c)
		return;
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c);
}

ET_FN int et_submit(hel_engine *e, struct et_call *c, const hel_token *prompt, uint32_t n,
		    uint32_t max_tokens, const hel_sampler *sm)
{
	hel_request q = {.prompt = prompt,
			 .n_prompt = n,
			 .max_tokens = max_tokens,
			 .on_tokens = et_on_tokens,
			 .on_done = et_on_done,
			 .ctx = c};
	if (sm)
		q.sampler = *sm;
	return hel_engine_submit(e, &q, &c->id);
}

/* Wait (up to 60 s) for on_done. */
ET_FN void et_wait(struct et_call *c)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 60;
	pthread_mutex_lock(&c->mu);
	while (!c->done) {
		int rc = pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		if (rc) {
			pthread_mutex_unlock(&c->mu);
			CHECKF(0, "request %llu did not finish in 60 s", (unsigned long long)c->id);
		}
	}
	pthread_mutex_unlock(&c->mu);
	CHECK(c->done == 1 && !c->late_tokens);
	CHECK(c->n == c->out.completion_tokens);
}

/* Submit and wait; returns the call (caller frees). */
ET_FN struct et_call *et_run(hel_engine *e, const hel_token *prompt, uint32_t n,
			     uint32_t max_tokens, const hel_sampler *sm)
{
	struct et_call *c = et_call_new();
	CHECK_OK(et_submit(e, c, prompt, n, max_tokens, sm));
	et_wait(c);
	CHECKF(c->out.error == 0, "request failed: %s", sel_strerror(c->out.error));
	return c;
}

/* Wait until pred(stats) holds (up to 30 s). */
ET_FN void et_wait_stats(hel_engine *e, bool (*pred)(const hel_engine_stats *, void *), void *arg)
{
	for (int i = 0; i < 30000; i++) {
		hel_engine_stats st;
		hel_engine_stats_get(e, &st);
		if (pred(&st, arg))
			return;
		usleep(1000);
	}
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);
	CHECKF(0,
	       "engine stats condition not reached in 30 s: pending %llu active %llu inbound %llu "
	       "host hits %llu declined %llu failed %llu gpu hits %llu",
	       (unsigned long long)st.pending, (unsigned long long)st.active,
	       (unsigned long long)st.inbound_waiting, (unsigned long long)st.host_hits,
	       (unsigned long long)st.host_fetch_declined, (unsigned long long)st.host_fetch_failed,
	       (unsigned long long)st.gpu_hits);
}

/* Settled: no request pending, active or waiting for a restore, no
 * copy-out pinned, and the worker's last iteration found nothing to do --
 * every publication offered, every queued copy-out reported. */
ET_FN bool et_settled(const hel_engine_stats *st, void *arg)
{
	(void)arg;
	return st->pending == 0 && st->active == 0 && st->inbound_waiting == 0 &&
	       st->copyout_pins == 0 && st->quiet;
}

/* Wait (up to 30 s) until the engine settled: what the last requests
 * published has reached the store. */
ET_FN void et_settle(hel_engine *e) { et_wait_stats(e, et_settled, NULL); }

/* The same, in an iteration after the snapshot whose loop count was
 * loops (the worker woke and found nothing to do again). */
struct et_since {
	uint64_t loops;
};
ET_FN bool et_settled_since(const hel_engine_stats *st, void *arg)
{
	return st->loops > ((struct et_since *)arg)->loops && et_settled(st, NULL);
}

/* Quiet with no request live, copy-out pins allowed (a store holding
 * its events): every publication has been offered. */
ET_FN bool et_quiet(const hel_engine_stats *st, void *arg)
{
	(void)arg;
	return st->pending == 0 && st->active == 0 && st->inbound_waiting == 0 && st->quiet;
}

/* ---- conversations ------------------------------------------------------------ */

/* A chat of up to 16 messages; contents owned. */
struct et_chat {
	hel_message m[16];
	char *text[16];
	size_t n;
};

ET_FN void et_chat_add(struct et_chat *ch, const char *role, const char *content, size_t len)
{
	CHECK(ch->n < 16);
	ch->text[ch->n] = malloc(len + 1);
	CHECK(ch->text[ch->n]);
	memcpy(ch->text[ch->n], content, len);
	ch->text[ch->n][len] = 0;
	ch->m[ch->n] = (hel_message){.role = role, .content = ch->text[ch->n], .content_len = len};
	ch->n++;
}

/* Add the assistant's reply: the generated tokens' bytes (END and other
 * specials produce none). */
ET_FN void et_chat_reply(struct et_chat *ch, const hel_token *t, uint32_t n)
{
	char buf[ET_MAXTOK + 1];
	size_t len = hel_detokenize(t, n, buf, sizeof buf);
	et_chat_add(ch, "assistant", buf, len);
}

ET_FN void et_chat_free(struct et_chat *ch)
{
	for (size_t i = 0; i < ch->n; i++)
		free(ch->text[i]);
	ch->n = 0;
}

/* The chat's prompt with the generation prompt; *n its length. */
ET_FN hel_token *et_chat_prompt(const struct et_chat *ch, uint32_t *n)
{
	size_t len = hel_chat_template(ch->m, ch->n, true, NULL, 0);
	hel_token *t = malloc(len * sizeof *t);
	CHECK(t);
	hel_chat_template(ch->m, ch->n, true, t, len);
	*n = (uint32_t)len;
	return t;
}

/* Random printable text of n bytes. */
ET_FN void et_text(test_rng *rng, char *out, size_t n)
{
	static const char al[] = "abcdefghijklmnopqrstuvwxyz      ABCDEFGHIJ.,?0123456789";
	for (size_t i = 0; i < n; i++)
		out[i] = al[test_rng_below(rng, sizeof al - 1)];
}

/* A one-message chat prompt of about n bytes of random text. */
ET_FN hel_token *et_random_prompt(test_rng *rng, size_t n, uint32_t *len)
{
	struct et_chat ch = {0};
	char *buf = malloc(n + 1);
	CHECK(buf);
	et_text(rng, buf, n);
	et_chat_add(&ch, "user", buf, n);
	free(buf);
	hel_token *t = et_chat_prompt(&ch, len);
	et_chat_free(&ch);
	return t;
}

/* The consumed count of a finished request's terminal: the prompt plus
 * every generated token but the last. */
ET_FN uint64_t et_terminal(const struct et_call *c)
{
	return c->out.prompt_tokens + c->out.completion_tokens - 1;
}

/* ---- the reference: the model run directly, one prefill ---------------------- */

struct et_ref {
	hel_token tok[ET_MAXTOK];
	uint32_t n;
	int32_t *logits; /* [n][vocab] */
};

/* Prefill the whole prompt at once, then decode token by token until END or
 * max_tokens, sampling as the engine does (position = the token's index). */
ET_FN void et_reference(const hel_core *core, const hel_token *prompt, uint32_t n,
			uint32_t max_tokens, const hel_sampler *sm, struct et_ref *out)
{
	uint32_t P = core->page_tokens, V = core->vocab;
	uint32_t total = n + max_tokens;
	hel_model *m;
	hel_model_opts o = {.mode = SEL_MODE_ORDINARY, .pages = total / P + 2, .rows = 1};
	CHECK_OK(hel_model_create(core, &o, &m));
	uint32_t *pages = malloc((total / P + 2) * sizeof *pages);
	CHECK(pages && max_tokens <= ET_MAXTOK);
	for (uint32_t i = 0; i < total / P + 2; i++)
		pages[i] = i;
	memset(out, 0, sizeof *out);
	out->logits = malloc((size_t)max_tokens * V * sizeof(int32_t));
	CHECK(out->logits);
	CHECK_OK(hel_model_row_init(m, 0));
	CHECK_OK(hel_model_prefill(m, 0, pages, n / P, prompt, n, out->logits));
	uint64_t pos = n;
	for (;;) {
		hel_token t = hel_sample(out->logits + (size_t)out->n * V, V, sm, pos);
		out->tok[out->n++] = t;
		if (t == HEL_TOK_END || out->n == max_tokens)
			break;
		CHECK_OK(hel_model_prefill(m, 0, pages, (uint32_t)((pos + 1) / P), &t, 1,
					   out->logits + (size_t)out->n * V));
		pos++;
	}
	free(pages);
	hel_model_destroy(m);
}

ET_FN void et_ref_free(struct et_ref *r)
{
	free(r->logits);
	r->logits = NULL;
}

/* Open and start an engine on core with c (its core replaced); stop and
 * destroy one. */
ET_FN hel_engine *et_engine_start(const hel_core *core, hel_engine_config c)
{
	hel_engine *e;
	c.core = core;
	CHECK_OK(hel_engine_open(&c, &e));
	CHECK_OK(hel_engine_start(e));
	return e;
}

ET_FN void et_engine_finish(hel_engine *e)
{
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
}

/* ---- a logits recorder for hel_engine_config.debug_logits ---------------------- */

struct et_logit_rec {
	uint64_t id, pos;
	int32_t *l;
};

struct et_logits {
	pthread_mutex_t mu;
	struct et_logit_rec *r;
	size_t n, cap;
	uint32_t vocab;
};

ET_FN void et_logits_cb(void *ctx, uint64_t id, uint64_t pos, const int32_t *l, uint32_t vocab)
{
	struct et_logits *x = ctx;
	pthread_mutex_lock(&x->mu);
	if (x->n == x->cap) {
		x->cap = x->cap ? 2 * x->cap : 256;
		x->r = realloc(x->r, x->cap * sizeof *x->r);
		CHECK(x->r);
	}
	int32_t *c = malloc(vocab * sizeof *c);
	CHECK(c);
	memcpy(c, l, vocab * sizeof *c);
	x->r[x->n++] = (struct et_logit_rec){id, pos, c};
	x->vocab = vocab;
	pthread_mutex_unlock(&x->mu);
}

/* The logits recorded for (id, pos), or NULL. */
ET_FN const int32_t *et_logits_get(struct et_logits *x, uint64_t id, uint64_t pos)
{
	const int32_t *l = NULL;
	pthread_mutex_lock(&x->mu);
	for (size_t i = x->n; i-- > 0;)
		if (x->r[i].id == id && x->r[i].pos == pos) {
			l = x->r[i].l;
			break;
		}
	pthread_mutex_unlock(&x->mu);
	return l;
}

ET_FN void et_logits_free(struct et_logits *x)
{
	for (size_t i = 0; i < x->n; i++)
		free(x->r[i].l);
	free(x->r);
	x->r = NULL;
	x->n = x->cap = 0;
}

/* The engine's tokens and logits of call c equal the reference's. */
ET_FN void et_same_as_ref(struct et_logits *x, const struct et_call *c, const struct et_ref *ref)
{
	CHECKF(c->n == ref->n && memcmp(c->tok, ref->tok, c->n * sizeof *c->tok) == 0,
	       "request %llu: tokens differ from the reference (%u vs %u tokens)",
	       (unsigned long long)c->id, c->n, ref->n);
	if (!x)
		return;
	for (uint32_t i = 0; i < c->n; i++) {
		const int32_t *l = et_logits_get(x, c->id, c->out.prompt_tokens + i);
		CHECKF(l, "request %llu: no logits recorded at %u", (unsigned long long)c->id,
		       c->out.prompt_tokens + i);
		CHECKF(memcmp(l, ref->logits + (size_t)i * x->vocab, x->vocab * sizeof *l) == 0,
		       "request %llu: logits of token %u differ from the reference",
		       (unsigned long long)c->id, i);
	}
}

/* ---- the gate store: a wrapper that holds fetch completions -------------------- */

/* What the gate does to the next restore it sees complete. */
enum et_flip {
	ET_FLIP_NONE = 0,
	ET_FLIP_PAGE, /* plane `plane`, restored page `index`, byte `offset` */
	ET_FLIP_ROW,  /* the restored row, byte `offset` (rank 0) */
};

struct et_gate {
	sel_store base;
	sel_store *inner;
	const sel_geometry *geo;
	int hold; /* atomic: keep fetch completions */
	sel_event held[64];
	size_t n_held;
	/* tickets in flight: destinations (for flips) */
	struct {
		uint64_t ticket;
		uint32_t pages[256];
		uint32_t n;
		uint32_t row;
	} in[16];
	size_t n_in;
	/* one-shot corruption of the next completed restore */
	int flip_kind; /* atomic */
	uint32_t flip_plane, flip_index;
	uint64_t flip_offset;
	int flipped;    /* atomic: flips applied */
	int fetches;    /* atomic */
	int held_total; /* atomic: fetch completions that passed the gate */
	/* Called on the worker thread with every put before the inner store
	 * sees it (the checkpoint is published and immutable: its bytes are
	 * those the store will copy).  NULL: none. */
	void (*on_put)(void *ctx, const sel_published *p, const sel_geometry *geo);
	void *put_ctx;
	/* Non-zero: the inner store copies through a host backend that takes
	 * this long per backend call (a slow copy engine: completions come
	 * late, whatever the order of push and wake). */
	uint64_t copy_delay_ns;
	struct sel_copy_backend slow;
	sel_store_config cfg;
	struct sel_store_ops ops; /* et_gate_open_over: the gate's, some replaced */
	/* The engine's landed hook, which the gate's own wraps (flips). */
	sel_landed_hook landed, hook;
};

ET_FN sel_store *et_gate_inner(sel_store *s) { return ((struct et_gate *)s)->inner; }

ET_FN int et_gate_lookup(sel_store *s, const sel_history *h, uint64_t res, uint64_t lim,
			 sel_hit *hit)
{
	return sel_store_lookup(et_gate_inner(s), h, res, lim, hit);
}

ET_FN sel_outcome et_gate_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct et_gate *g = (struct et_gate *)s;
	if (g->on_put)
		g->on_put(g->put_ctx, cp, g->geo);
	return sel_store_put(et_gate_inner(s), cp, why);
}

ET_FN int et_gate_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct et_gate *g = (struct et_gate *)s;
	int rc = sel_store_fetch(g->inner, hit, in);
	if (rc == 0 && g->n_in < 16 && in->n_pages <= 256) {
		g->in[g->n_in].ticket = in->ticket;
		memcpy(g->in[g->n_in].pages, in->pages, in->n_pages * sizeof(uint32_t));
		g->in[g->n_in].n = in->n_pages;
		g->in[g->n_in].row = in->state_slot;
		g->n_in++;
		__atomic_add_fetch(&g->fetches, 1, __ATOMIC_SEQ_CST);
	}
	return rc;
}

ET_FN void et_gate_corrupt(struct et_gate *g, uint64_t ticket)
{
	int kind = __atomic_load_n(&g->flip_kind, __ATOMIC_SEQ_CST);
	for (size_t i = 0; i < g->n_in; i++) {
		if (g->in[i].ticket != ticket)
			continue;
		const sel_rank_geometry *rg = &g->geo->rank[0];
		if (kind == ET_FLIP_PAGE && g->flip_index < g->in[i].n) {
			const sel_plane *p = &rg->pages[g->flip_plane];
			uint8_t *b =
				(uint8_t *)(uintptr_t)(p->address + g->in[i].pages[g->flip_index] *
									    p->unit_bytes);
			b[g->flip_offset % p->unit_bytes] ^= 0x10;
			__atomic_add_fetch(&g->flipped, 1, __ATOMIC_SEQ_CST);
		} else if (kind == ET_FLIP_ROW) {
			uint8_t *b =
				(uint8_t *)(uintptr_t)(rg->row.address +
						       (uint64_t)g->in[i].row * rg->row.unit_bytes);
			b[g->flip_offset % rg->row.unit_bytes] ^= 0x10;
			__atomic_add_fetch(&g->flipped, 1, __ATOMIC_SEQ_CST);
		}
		if (kind != ET_FLIP_NONE)
			__atomic_store_n(&g->flip_kind, ET_FLIP_NONE, __ATOMIC_SEQ_CST);
		g->in[i] = g->in[--g->n_in];
		return;
	}
}

/* A flip pending when a restore's windows land is made there, on rank 0,
 * before the engine's hook summarises the window (the model reads the
 * flipped byte as a store that delivered it: a restored page `index` of
 * the first window that has it, or the row in the row's window); restores
 * without landed windows are flipped at their completion (et_gate_corrupt). */
ET_FN void et_gate_landed(void *ctx, uint32_t rank, const uint32_t *pages, uint32_t n, bool row,
			  uint32_t slot)
{
	struct et_gate *g = ctx;
	int kind = __atomic_load_n(&g->flip_kind, __ATOMIC_SEQ_CST);
	const sel_rank_geometry *rg = &g->geo->rank[0];
	uint8_t *b = NULL;
	if (rank == 0 && kind == ET_FLIP_PAGE && g->flip_index < n) {
		const sel_plane *p = &rg->pages[g->flip_plane];
		b = (uint8_t *)(uintptr_t)(p->address + pages[g->flip_index] * p->unit_bytes);
		b += g->flip_offset % p->unit_bytes;
	} else if (rank == 0 && kind == ET_FLIP_ROW && row) {
		b = (uint8_t *)(uintptr_t)(rg->row.address + (uint64_t)slot * rg->row.unit_bytes);
		b += g->flip_offset % rg->row.unit_bytes;
	}
	if (b) {
		*b ^= 0x10;
		__atomic_add_fetch(&g->flipped, 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(&g->flip_kind, ET_FLIP_NONE, __ATOMIC_SEQ_CST);
	}
	g->landed.fn(g->landed.ctx, rank, pages, n, row, slot);
}

ET_FN int et_gate_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct et_gate *g = (struct et_gate *)s;
	sel_event tmp[32];
	int n = sel_store_poll(g->inner, tmp, cap < 32 ? cap : 32);
	if (n < 0)
		return n;
	size_t out = 0;
	for (int i = 0; i < n; i++) {
		bool fetch = tmp[i].type == SEL_EV_FETCHED || tmp[i].type == SEL_EV_FETCH_FAILED;
		if (fetch && g->n_held < 64) {
			g->held[g->n_held++] = tmp[i];
			__atomic_add_fetch(&g->held_total, 1, __ATOMIC_SEQ_CST);
		} else if (out < cap)
			ev[out++] = tmp[i];
		else
			CHECK(0); /* the engine polls with room for a batch */
	}
	if (!__atomic_load_n(&g->hold, __ATOMIC_SEQ_CST)) {
		size_t k = 0;
		for (; k < g->n_held && out < cap; k++) {
			if (g->held[k].type == SEL_EV_FETCHED)
				et_gate_corrupt(g, g->held[k].ticket);
			ev[out++] = g->held[k];
		}
		memmove(g->held, g->held + k, (g->n_held - k) * sizeof *g->held);
		g->n_held -= k;
	}
	return (int)out;
}

ET_FN void et_gate_evicted(sel_store *s, const sel_key *k, uint64_t gen, const sel_key *heir)
{
	sel_store_evicted(et_gate_inner(s), k, gen, heir);
}

ET_FN void et_gate_touch(sel_store *s, const sel_key *k) { sel_store_touch(et_gate_inner(s), k); }

ET_FN void et_gate_stats(sel_store *s, sel_stats *out) { sel_store_stats(et_gate_inner(s), out); }

ET_FN int et_gate_wait_fd(sel_store *s) { return sel_store_wait_fd(et_gate_inner(s)); }

ET_FN int et_gate_close(sel_store *s, uint64_t deadline)
{
	return sel_store_close(et_gate_inner(s), deadline);
}

ET_FN void et_gate_destroy(sel_store *s)
{
	struct et_gate *g = (struct et_gate *)s;
	sel_store_destroy(g->inner);
	g->inner = NULL;
}

static const struct sel_store_ops et_gate_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "memory",
	.lookup = et_gate_lookup,
	.put = et_gate_put,
	.fetch = et_gate_fetch,
	.poll = et_gate_poll,
	.evicted = et_gate_evicted,
	.touch = et_gate_touch,
	.stats = et_gate_stats,
	.wait_fd = et_gate_wait_fd,
	.close = et_gate_close,
	.destroy = et_gate_destroy,
};

/* hel_engine_config.store_open: a memory store behind the gate (ctx: the
 * gate, zeroed by the caller; it must outlive the engine). */
ET_FN int et_slow_open(void *ctx, uint32_t rank, void **state)
{
	(void)rank;
	*state = ctx;
	return 0;
}

ET_FN int et_slow_copy(void *state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	const struct et_gate *g = state;
	(void)dir;
	eos_sleep_ns(g->copy_delay_ns);
	for (uint32_t i = 0; i < n; i++)
		memcpy((void *)(uintptr_t)c[i].dst, (const void *)(uintptr_t)c[i].src, c[i].len);
	return 0;
}

ET_FN int et_gate_open(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct et_gate *g = ctx;
	g->cfg = *cfg;
	if (g->copy_delay_ns) {
		g->slow = (struct sel_copy_backend){.name = "slow host",
						    .ctx = g,
						    .open_rank = et_slow_open,
						    .copy = et_slow_copy};
		g->cfg.copy_backend = &g->slow;
	}
	if (cfg->landed && cfg->landed->fn) {
		g->landed = *cfg->landed;
		g->hook = (sel_landed_hook){.fn = et_gate_landed, .ctx = g};
		g->cfg.landed = &g->hook;
	}
	cfg = &g->cfg;
	int rc = sel_memory_store_open(cfg, &g->inner);
	if (rc)
		return rc;
	g->base.ops = &et_gate_ops;
	g->base.page_tokens = g->inner->page_tokens;
	g->geo = cfg->geometry;
	*out = &g->base;
	return 0;
}

/* et_gate_open with the lookup, fetch and poll of `over` in place of the
 * gate's where they are set: for tests that wrap the gate further (their
 * store embeds the gate first and calls its functions). */
ET_FN int et_gate_open_over(struct et_gate *g, const sel_store_config *cfg, sel_store **out,
			    const struct sel_store_ops *over)
{
	int rc = et_gate_open(g, cfg, out);
	if (rc)
		return rc;
	g->ops = et_gate_ops;
	if (over->lookup)
		g->ops.lookup = over->lookup;
	if (over->fetch)
		g->ops.fetch = over->fetch;
	if (over->poll)
		g->ops.poll = over->poll;
	g->base.ops = &g->ops;
	return 0;
}

ET_FN void et_gate_hold(struct et_gate *g, bool on)
{
	__atomic_store_n(&g->hold, on ? 1 : 0, __ATOMIC_SEQ_CST);
}

/* Wait (up to 30 s) until `total` fetch completions reached the gate. */
ET_FN void et_gate_wait_completions(struct et_gate *g, int total)
{
	for (int i = 0; i < 30000 && __atomic_load_n(&g->held_total, __ATOMIC_SEQ_CST) < total; i++)
		usleep(1000);
	CHECK(__atomic_load_n(&g->held_total, __ATOMIC_SEQ_CST) >= total);
}

#endif
