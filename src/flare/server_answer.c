/*
 * server_answer.c - what `flare run` answers from an exchange: the
 * engine's callbacks (on the engine's thread: copy the token's bytes,
 * match stop sequences, wake the connection, return), what a choice says,
 * the plain answer once every choice is done, and the streamed one (SSE
 * frames filled on the HTTP threads).  server.c has the rest of the
 * design; server_int.h is what the two share.
 *
 * DESIGN
 * Stop sequences are matched in on_tokens, token by token, on each
 * choice's detokenized text (stop.h): the match cuts the text where the
 * sequence starts, and on_tokens tells the engine to end the request
 * there ("stop"), so nothing past the stop is generated or counted.  A
 * stream sends only text that cannot be the start of a stop sequence (the
 * matcher's hold-back); on_tokens records that boundary as `safe`.
 *
 * The engine callbacks only append and resume; every answer is formatted
 * on the HTTP threads (server.c "No thread waits for the engine").
 *
 * INVARIANTS: those of server.c, numbered as there (1 for suspending and
 *   resuming, 4 for cancellation, 5 for a choice's text and what a stream
 *   sent).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "flare/server_int.h"

/* ---- engine callbacks (the engine's thread: copy, match, wake, return) ---------- */

static void tok_add(struct choice *c, hel_token t, size_t offset, const hel_logprob *lp)
{
	if (c->n_toks == c->cap_toks) {
		size_t cap = c->cap_toks ? 2 * c->cap_toks : 64;
		struct flare_api_token *p = realloc(c->toks, cap * sizeof *p);
		if (!p) {
			c->text.failed = true; /* reported as a failed request */
			return;
		}
		c->toks = p;
		c->cap_toks = cap;
	}
	struct flare_api_token *e = &c->toks[c->n_toks++];
	e->token = t;
	e->offset = offset;
	if (lp)
		e->lp = *lp;
	else
		memset(&e->lp, 0, sizeof e->lp);
}

uint32_t srv_on_tokens(void *ctx, const hel_token *t, const hel_logprob *lp, uint32_t n)
{
	struct choice *c = ctx;
	struct exchange *x = c->x;
	const struct flare_stop *st = &x->req.stop;
	uint32_t keep = 0;
	pthread_mutex_lock(&x->lock);
	if (x->closed || x->gone || c->stopped) {
		pthread_mutex_unlock(&x->lock);
		return 0; /* a cancel is on its way */
	}
	for (uint32_t i = 0; i < n; i++) {
		size_t before = c->text.len;
		char b[8];
		size_t nb = hel_detokenize(&t[i], 1, b, sizeof b);
		flare_buf_append(&c->text, b, nb < sizeof b ? nb : 0);
		c->generated++;
		/* The end token that ends the reply is no part of it (OpenAI shows none). */
		if (x->req.logprobs && !(t[i] == HEL_TOK_END && !x->req.ignore_eos))
			tok_add(c, t[i], before, lp ? &lp[i] : NULL);
		size_t at;
		if (st->n && c->text.data &&
		    flare_stop_find(st, c->text.data, c->text.len, before, &at)) {
			c->text.len = at;
			c->text.data[at] = '\0';
			while (c->n_toks && c->toks[c->n_toks - 1].offset >= at)
				c->n_toks--;
			c->stopped = true;
			keep = i + 1;
			break;
		}
	}
	c->safe = c->text.len;
	if (!c->stopped && st->n && c->text.data)
		c->safe -= flare_stop_holdback(st, c->text.data, c->text.len);
	if (x->req.stream)
		wake_locked(x);
	pthread_mutex_unlock(&x->lock);
	return keep;
}

void srv_on_done(void *ctx, const hel_outcome *o)
{
	struct choice *c = ctx;
	struct exchange *x = c->x;
	pthread_mutex_lock(&x->lock);
	c->outcome = *o;
	snprintf(c->finish, sizeof c->finish, "%s", o->finish_reason ? o->finish_reason : "stop");
	c->outcome.finish_reason = c->finish;
	c->done = true;
	x->n_done++;
	if (!x->closed && (x->req.stream || x->n_done == x->n_ch))
		wake_locked(x);
	pthread_mutex_unlock(&x->lock);
	srv_exchange_unref(x);
}

/* ---- what a choice says (x->lock held, or every choice done) ---------------------- */

/* The finish reason a client sees: a matched stop sequence is "stop"; a
 * generation cut by shutdown (or never finished) is "abort", vLLM's value. */
static const char *finish_of(const struct choice *c)
{
	if (c->stopped)
		return "stop";
	if (!c->done || !strcmp(c->finish, "cancelled"))
		return "abort";
	return c->finish;
}

/* Only an image the preparation worker could not decode past its header
 * fails a request with these (docs/inputs.md): the client's fault. */
static bool image_error(int error) { return error == SEL_EFORMAT || error == SEL_EOVERSIZE; }

static bool choice_failed(const struct choice *c)
{
	return c->text.failed ||
	       (c->done && ((c->outcome.error && strcmp(c->finish, "cancelled")) ||
			    !strcmp(c->finish, "error")));
}

/* The request's totals: each prompt counted once, with the tokens none of
 * its choices computed as cached; completions and reuse summed. */
static void totals(const struct exchange *x, hel_outcome *t)
{
	memset(t, 0, sizeof *t);
	t->host_tier = SEL_TIER_NONE;
	uint32_t n = x->req.n;
	for (uint32_t p = 0; p < x->req.n_prompts; p++) {
		t->prompt_tokens += x->req.prompts[p].n;
		uint64_t cached = UINT64_MAX;
		for (uint32_t j = 0; j < n; j++) {
			const struct choice *c = &x->ch[p * n + j];
			uint64_t v = c->done ? c->outcome.cached_tokens : 0;
			cached = v < cached ? v : cached;
		}
		t->cached_tokens += cached == UINT64_MAX ? 0 : cached;
	}
	for (uint32_t i = 0; i < x->n_ch; i++) {
		const struct choice *c = &x->ch[i];
		t->completion_tokens += c->done ? c->outcome.completion_tokens : c->generated;
		if (!c->done)
			continue;
		t->reused_gpu_tokens += c->outcome.reused_gpu_tokens;
		t->reused_host_tokens += c->outcome.reused_host_tokens;
		t->prefill_tokens += c->outcome.prefill_tokens;
		t->prefill_launches += c->outcome.prefill_launches;
		t->spec_rounds += c->outcome.spec_rounds;
		t->spec_proposed += c->outcome.spec_proposed;
		t->spec_accepted += c->outcome.spec_accepted;
		t->overlap_tokens += c->outcome.overlap_tokens;
		if (t->host_tier == SEL_TIER_NONE && c->outcome.reused_host_tokens) {
			t->host_tier = c->outcome.host_tier;
			t->host_neighbour = c->outcome.host_neighbour;
			t->host_neighbour_tier = c->outcome.host_neighbour_tier;
		}
	}
}

/* ---- plain responses ------------------------------------------------------------- */

/* A choice's text and tokens, copied under the lock. */
struct snap {
	char *text;
	size_t len;
	struct flare_api_token *toks;
	size_t n_toks;
	const char *finish;
};

static bool snap_take(struct snap *sn, const struct choice *c)
{
	sn->len = c->text.len;
	sn->text = malloc(sn->len + 1);
	sn->n_toks = c->n_toks;
	sn->toks = malloc((sn->n_toks ? sn->n_toks : 1) * sizeof *sn->toks);
	sn->finish = finish_of(c);
	if (!sn->text || !sn->toks)
		return false;
	if (sn->len)
		memcpy(sn->text, c->text.data, sn->len);
	if (sn->n_toks)
		memcpy(sn->toks, c->toks, sn->n_toks * sizeof *sn->toks);
	return true;
}

/* The handler runs again after the last srv_on_done (or an abort) resumed a
 * plain request. */
enum MHD_Result srv_finish_plain(struct flare_server *s, struct exchange *x)
{
	pthread_mutex_lock(&x->lock);
	if (x->gone) {
		pthread_mutex_unlock(&x->lock);
		return MHD_NO; /* close: nobody is listening */
	}
	if (x->n_done < x->n_ch && !x->aborted) {
		sleep_locked(x); /* woken early: keep waiting */
		pthread_mutex_unlock(&x->lock);
		return MHD_YES;
	}
	bool all = x->n_done == x->n_ch, failed = false, any = false, cut = false;
	int error = 0;
	struct snap *sn = calloc(x->n_ch, sizeof *sn);
	bool ok = sn != NULL;
	for (uint32_t i = 0; ok && i < x->n_ch; i++) {
		const struct choice *c = &x->ch[i];
		if (choice_failed(c)) {
			failed = true;
			error = c->outcome.error ? c->outcome.error
				: c->text.failed ? -ENOMEM
						 : -EIO;
		}
		any |= c->generated > 0;
		cut |= !strcmp(finish_of(c), "abort");
		ok = snap_take(&sn[i], c);
	}
	hel_outcome total;
	totals(x, &total);
	pthread_mutex_unlock(&x->lock);
	x->phase = PH_ANSWERED;
	if (!all)
		srv_cancel_once(x);

	enum MHD_Result ret;
	if (!ok) {
		ret = MHD_NO;
	} else if (failed && image_error(error)) {
		char msg[256];
		snprintf(msg, sizeof msg, "an image of the request does not decode: %s",
			 sel_strerror(error));
		ret = srv_respond_simple_error(s, x->conn, 400, "messages", NULL, msg);
	} else if (failed) {
		char msg[256];
		snprintf(msg, sizeof msg, "the engine failed the request: %s", sel_strerror(error));
		ret = srv_respond_simple_error(s, x->conn, 500, NULL, NULL, msg);
	} else if (cut && !any) {
		ret = srv_respond_simple_error(s, x->conn, 503, NULL, NULL,
					       "the request was cancelled: the server is stopping");
	} else {
		struct flare_api_choice *cs = calloc(x->n_ch, sizeof *cs);
		struct flare_buf *texts = calloc(x->n_ch, sizeof *texts);
		struct flare_buf b = {0};
		bool good = cs && texts;
		for (uint32_t i = 0; good && i < x->n_ch; i++) {
			flare_utf8_clean(sn[i].text, sn[i].len, true, &texts[i]);
			good = !flare_buf_failed(&texts[i]);
			cs[i] = (struct flare_api_choice){.index = x->ch[i].index,
							  .text = texts[i].data ? texts[i].data
										: "",
							  .len = texts[i].len,
							  .finish = sn[i].finish,
							  .tokens = sn[i].toks,
							  .n_tokens = sn[i].n_toks};
		}
		if (good) {
			flare_api_response(&b, &x->meta, cs, x->n_ch, &total);
			ret = srv_respond_json(s, x->conn, 200, &b, NULL);
		} else {
			ret = MHD_NO;
		}
		for (uint32_t i = 0; texts && i < x->n_ch; i++)
			flare_buf_free(&texts[i]);
		free(texts);
		free(cs);
	}
	for (uint32_t i = 0; sn && i < x->n_ch; i++) {
		free(sn[i].text);
		free(sn[i].toks);
	}
	free(sn);
	return ret;
}

/* ---- streamed responses ------------------------------------------------------------ */

static size_t tok_len(hel_token t) { return hel_detokenize(&t, 1, NULL, 0); }

/* New text and tokens of choice c into x->out.  *progress: something was
 * looked at that the last fill had not seen. */
static bool fill_choice(struct exchange *x, struct choice *c, bool *progress)
{
	pthread_mutex_lock(&x->lock);
	bool final = c->done || x->aborted;
	size_t end = final ? c->text.len : c->safe;
	if (end == c->seen_len && c->n_toks == c->seen_toks && final == c->seen_final) {
		pthread_mutex_unlock(&x->lock);
		return true;
	}
	*progress = true;
	c->seen_len = end;
	c->seen_toks = c->n_toks;
	c->seen_final = final;
	size_t n = end > c->sent ? end - c->sent : 0, nt = c->n_toks - c->toks_sent;
	char *raw = malloc(n + 1);
	struct flare_api_token *tk = malloc((nt ? nt : 1) * sizeof *tk);
	bool ok = raw && tk && !c->text.failed;
	if (ok) {
		memcpy(raw, c->text.data ? c->text.data + c->sent : "", n);
		if (nt)
			memcpy(tk, c->toks + c->toks_sent, nt * sizeof *tk);
	}
	hel_outcome o = c->outcome;
	const char *finish = finish_of(c);
	pthread_mutex_unlock(&x->lock);

	struct flare_buf clean = {0};
	size_t used = ok ? flare_utf8_clean(raw, n, final, &clean) : 0;
	size_t released = c->sent + used, k = 0;
	while (ok && k < nt && (final || tk[k].offset + tok_len(tk[k].token) <= released))
		k++;
	ok = ok && !flare_buf_failed(&clean);
	if (ok && (clean.len || k)) {
		struct flare_api_choice ch = {.index = c->index,
					      .text = clean.data ? clean.data : "",
					      .len = clean.len,
					      .tokens = tk,
					      .n_tokens = k};
		flare_api_sse_text(&x->out, &x->meta, &ch);
	}
	c->sent = released;
	c->toks_sent += k;
	if (ok && final && !c->finish_sent) {
		struct flare_api_choice ch = {
			.index = c->index, .finish = finish, .o = c->done ? &o : NULL};
		flare_api_sse_finish(&x->out, &x->meta, &ch);
		c->finish_sent = true;
	}
	flare_buf_free(&clean);
	free(raw);
	free(tk);
	return ok;
}

/* Turn what the engine delivered into SSE bytes in x->out.  Returns false
 * when the connection should be dropped. */
static bool stream_fill(struct flare_server *s, struct exchange *x, bool *wait)
{
	(void)s;
	*wait = false;
	pthread_mutex_lock(&x->lock);
	bool gone = x->gone, aborted = x->aborted;
	pthread_mutex_unlock(&x->lock);
	if (gone)
		return false;
	if (aborted)
		srv_cancel_once(x);

	/* A failed choice ends the stream with an error event. */
	pthread_mutex_lock(&x->lock);
	int error = 0;
	for (uint32_t i = 0; i < x->n_ch && !error; i++)
		if (choice_failed(&x->ch[i]))
			error = x->ch[i].outcome.error ? x->ch[i].outcome.error : -EIO;
	pthread_mutex_unlock(&x->lock);
	if (error) {
		srv_cancel_once(x);
		struct flare_api_error e;
		bool img = image_error(error);
		flare_api_error_set(&e, img ? 400 : 500,
				    img ? "invalid_request_error" : "server_error",
				    img ? "messages" : NULL, NULL,
				    img ? "an image of the request does not decode: %s"
					: "the engine failed the request: %s",
				    sel_strerror(error));
		flare_api_sse_error(&x->out, &e);
		flare_api_sse_done(&x->out);
		x->ended = true;
		return !flare_buf_failed(&x->out);
	}

	bool progress = false, all = true;
	for (uint32_t i = 0; i < x->n_ch; i++) {
		if (!fill_choice(x, &x->ch[i], &progress))
			return false;
		all &= x->ch[i].finish_sent;
	}
	if (all) {
		pthread_mutex_lock(&x->lock);
		hel_outcome total;
		totals(x, &total);
		pthread_mutex_unlock(&x->lock);
		if (x->meta.include_usage)
			flare_api_sse_usage(&x->out, &x->meta, &total);
		flare_api_sse_done(&x->out);
		x->ended = true;
	} else if (!progress && x->out.len == 0) {
		/* Nothing new: sleep, unless something arrived since we looked. */
		pthread_mutex_lock(&x->lock);
		bool news = x->aborted || x->gone;
		for (uint32_t i = 0; i < x->n_ch && !news; i++) {
			const struct choice *c = &x->ch[i];
			bool final = c->done;
			news = (final ? c->text.len : c->safe) != c->seen_len ||
			       c->n_toks != c->seen_toks || final != c->seen_final;
		}
		if (!news) {
			sleep_locked(x);
			*wait = true;
		}
		pthread_mutex_unlock(&x->lock);
	}
	return !flare_buf_failed(&x->out);
}

ssize_t srv_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct exchange *x = cls;
	for (;;) {
		if (x->out_pos < x->out.len) {
			size_t n = x->out.len - x->out_pos;
			if (n > max)
				n = max;
			memcpy(buf, x->out.data + x->out_pos, n);
			x->out_pos += n;
			if (x->out_pos == x->out.len) {
				flare_buf_reset(&x->out);
				x->out_pos = 0;
			}
			return (ssize_t)n;
		}
		if (x->ended)
			return MHD_CONTENT_READER_END_OF_STREAM;
		bool wait;
		if (!stream_fill(x->srv, x, &wait))
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (wait)
			return 0;
	}
}

void srv_stream_free(void *cls) { srv_exchange_unref(cls); }
