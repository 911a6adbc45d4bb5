/*
 * server.c - libmicrohttpd glue of `flare run`: routing, request bodies,
 * waiting for the engine without holding a thread, choices, stop
 * sequences, streaming, disconnects, CORS, API keys, connection limits
 * and shutdown (design 2.8 "every store call from the worker returns
 * without waiting" seen from the front end; docs/configuration.md).
 *
 * DESIGN
 * Each POST is an exchange shared by three parties: the HTTP thread that
 * owns the connection, the engine thread that calls on_tokens/on_done, and
 * the watcher thread that notices a client that went away.  The exchange
 * is reference counted (HTTP side, engine side per submitted choice from
 * submit to on_done, the streamed response, the watcher while it polls)
 * and its shared fields sit under its mutex.
 *
 * Choices.  A request has prompts x n choices, each its own engine
 * request.  The first choice of a prompt is submitted plainly; its n - 1
 * siblings name it in hel_request.after, so the engine admits them once
 * it has computed the prompt and they resume from its GPU checkpoint
 * (branching, design 4) instead of computing it n times.
 *
 * No thread waits for the engine.  After submit, a plain request suspends
 * its connection and the last on_done resumes it; the access handler then
 * runs again and answers.  A streamed request queues a chunked response
 * whose reader turns new text into SSE frames and suspends the connection
 * when it has nothing to send; on_tokens resumes it.  The engine callbacks
 * only append the token's bytes, match stop sequences and resume:
 * formatting happens on the HTTP threads.
 *
 * Stop sequences are matched in on_tokens, token by token, on each
 * choice's detokenized text (stop.h): the match cuts the text where the
 * sequence starts, and on_tokens tells the engine to end the request
 * there ("stop"), so nothing past the stop is generated or counted.  A
 * stream sends only text that cannot be the start of a stop sequence (the
 * matcher's hold-back); on_tokens records that boundary as `safe`.
 *
 * libmicrohttpd does not notice a client that disconnects while its
 * connection is suspended, and a request may wait long (queue, prefill).
 * The watcher polls the sockets of suspended exchanges for POLLRDHUP every
 * watch_ms and cancels their engine requests.
 *
 * Every request, GET included, is answered on the handler's last call
 * (after the whole body): libmicrohttpd closes a connection whose
 * response was queued before the request was read, and keep-alive needs
 * the opposite.  Only refusals that must not read the body (413, the body
 * budget's 503) answer early, and those connections close.
 *
 * Limits: libmicrohttpd's connection limit, per-address limit and idle
 * timeout from the configuration, and a byte budget over all request
 * bodies being received, charged by buffer capacity before it grows (as
 * bytes arrive, not as Content-Length announces them, so a client must
 * send what it holds): a body that would pass it is dropped, the rest of
 * it read and discarded, and the request answered 503 once whole (an
 * answer sent while the client still sends would be lost to the reset a
 * close with unread data causes).
 *
 * Invariants:
 *   1. suspended is true exactly while the connection is suspended by us;
 *      whoever clears it (under the exchange lock) resumes the connection,
 *      so a connection is resumed once per suspension, and a suspended
 *      connection is alive (libmicrohttpd closes none that is suspended).
 *   2. Lock order: server lock, then exchange lock, then libmicrohttpd's
 *      own locks (suspend/resume); libmicrohttpd calls none of our
 *      callbacks with its locks held.
 *   3. After begin_stop no exchange is registered; stop marks every
 *      registered one aborted and resumes it, and an aborted exchange never
 *      suspends again, so MHD_stop_daemon never sees a suspended
 *      connection (an API violation in libmicrohttpd).
 *   4. An engine request is cancelled at most once (cancel_sent).
 *   5. A choice's text only grows, except that a stop match cuts it at
 *      the match, which is never before `safe` (stop.c invariant 2); a
 *      stream has sent at most `safe` bytes, so it never sent stop text.
 *   6. s->buffered is the sum of the charges of live exchanges' bodies.
 */
#include "flare/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"
#include "helios/tokenizer.h"

enum route {
	R_NONE = 0,
	R_COMPLETIONS,
	R_CHAT,
	R_MODELS,
	R_MODEL, /* /v1/models/{id} */
	R_HEALTH,
	R_METRICS,
};

enum state {
	ST_STARTING,
	ST_READY,
	ST_STOPPING
};

enum phase {
	PH_BODY,   /* receiving the body */
	PH_WAIT,   /* plain: submitted, waiting for every on_done */
	PH_STREAM, /* streamed: response queued */
	PH_ANSWERED,
};

struct exchange;

struct choice {
	struct exchange *x;
	uint32_t index;  /* in the response */
	uint32_t prompt; /* x->req.prompts[prompt] */
	/* x->lock */
	uint64_t id; /* the engine's request id */
	bool submitted, cancel_sent, done;
	hel_outcome outcome;
	char finish[16];
	struct flare_buf text;        /* generated bytes, cut where a stop sequence began */
	size_t safe;                  /* of which a stream may send (invariant 5) */
	bool stopped;                 /* a stop sequence ended it */
	uint32_t generated;           /* tokens received (up to the stop) */
	struct flare_api_token *toks; /* logprobs: the tokens the text shows */
	size_t n_toks, cap_toks;
	/* Streams, HTTP side only. */
	size_t sent; /* text bytes sent */
	size_t toks_sent;
	size_t seen_len, seen_toks; /* what the last fill looked at */
	bool seen_final;
	bool finish_sent;
};

struct exchange {
	struct flare_server *srv;
	struct MHD_Connection *conn;
	enum route route;
	enum phase phase;      /* HTTP side only */
	struct flare_buf body; /* HTTP side only */
	size_t charged;        /* body bytes charged to the budget (invariant 6) */
	bool too_large, over_budget;
	char *path; /* the URL path */
	struct flare_api_request req;
	struct flare_api_meta meta;
	struct choice *ch;
	uint32_t n_ch;

	pthread_mutex_t lock; /* everything below and the choices' shared fields */
	int refs;
	uint32_t n_done; /* choices whose on_done came */
	bool suspended;
	bool gone;                    /* the watcher saw the client leave */
	bool aborted;                 /* the server is stopping */
	bool closed;                  /* libmicrohttpd finished with the request */
	struct exchange *prev, *next; /* server's live list (server lock) */
	bool live;

	/* Streaming, HTTP side only. */
	struct flare_buf out; /* SSE bytes not yet handed to libmicrohttpd */
	size_t out_pos;
	bool ended;
};

struct flare_server {
	struct flare_server_config cfg;
	char model[HEL_NAME_MAX + 1];
	char mode[16], store[32], transport[32];
	char *origins; /* the CORS list, or NULL */
	bool cors, cors_any;
	bool has_key;
	unsigned char key_hash[crypto_generichash_BYTES];
	unsigned char key_salt[crypto_generichash_KEYBYTES];
	struct flare_backend backend;
	struct MHD_Daemon *daemon;
	uint16_t port;
	char url[INET6_ADDRSTRLEN + 32];
	atomic_int state;
	uint64_t started_unix;

	pthread_mutex_t lock;
	pthread_cond_t cv; /* live list shrank */
	struct exchange *live;
	size_t n_live;

	pthread_t watcher;
	bool watcher_running;
	int wake_fd;
	atomic_bool watch_stop;
	bool stopped;

	atomic_uint_fast64_t requests, responses[6], streams_active, disconnects, counter;
	atomic_uint_fast64_t connections, buffered, buffer_refusals, unauthorized;
	uint64_t salt;
};

/* ---- small helpers ---------------------------------------------------------- */

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t next_random(struct flare_server *s)
{
	return splitmix(s->salt + atomic_fetch_add(&s->counter, 1));
}

static void count_response(struct flare_server *s, unsigned status)
{
	atomic_fetch_add(&s->requests, 1);
	unsigned c = status / 100;
	if (c >= 2 && c <= 5)
		atomic_fetch_add(&s->responses[c], 1);
}

/* ---- CORS and the API key ------------------------------------------------------ */

/* What Access-Control-Allow-Origin answers this request's Origin with, or
 * NULL (CORS off, no Origin, or an origin not allowed). */
static const char *cors_origin(struct flare_server *s, struct MHD_Connection *c)
{
	if (!s->cors)
		return NULL;
	const char *o = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
	if (!o || !*o)
		return NULL;
	if (s->cors_any)
		return "*";
	size_t ol = strlen(o);
	for (const char *p = s->origins; *p;) {
		size_t l = strcspn(p, ",");
		if (l == ol && !strncasecmp(p, o, l))
			return o;
		p += l;
		if (*p == ',')
			p++;
	}
	return NULL;
}

static void add_cors(struct flare_server *s, struct MHD_Connection *c, struct MHD_Response *r)
{
	const char *ao = cors_origin(s, c);
	if (!ao)
		return;
	MHD_add_response_header(r, "Access-Control-Allow-Origin", ao);
	if (strcmp(ao, "*"))
		MHD_add_response_header(r, "Vary", "Origin");
}

static void key_digest(const struct flare_server *s, const char *k, size_t n,
		       unsigned char out[crypto_generichash_BYTES])
{
	crypto_generichash(out, crypto_generichash_BYTES, (const unsigned char *)k, n, s->key_salt,
			   sizeof s->key_salt);
}

/* Does the request carry the API key as a Bearer token?  Compared in
 * constant time: both sides hashed (keyed BLAKE2b, so lengths do not
 * matter), then sodium_memcmp. */
static bool authorized(struct flare_server *s, struct MHD_Connection *c)
{
	if (!s->has_key)
		return true;
	const char *h =
		MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	if (!h || strncasecmp(h, "Bearer ", 7))
		return false;
	h += 7;
	while (*h == ' ')
		h++;
	unsigned char d[crypto_generichash_BYTES];
	key_digest(s, h, strlen(h), d);
	return sodium_memcmp(d, s->key_hash, sizeof d) == 0;
}

/* ---- responses ------------------------------------------------------------------ */

/* Queue body (malloc'd, non-NULL; taken) as the response. */
static enum MHD_Result respond(struct flare_server *s, struct MHD_Connection *c, unsigned status,
			       const char *ctype, char *body, size_t len, const char *allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	if (ctype)
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
		MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
	if (status == MHD_HTTP_UNAUTHORIZED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
					"Bearer realm=\"flare\"");
	add_cors(s, c, r);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	count_response(s, status);
	return ret;
}

static enum MHD_Result respond_json(struct flare_server *s, struct MHD_Connection *c,
				    unsigned status, struct flare_buf *b, const char *allow)
{
	if (flare_buf_failed(b)) {
		flare_buf_free(b);
		return MHD_NO;
	}
	flare_buf_puts(b, "\n");
	size_t len = 0;
	char *body = flare_buf_take(b, &len);
	if (!body)
		return MHD_NO;
	return respond(s, c, status, "application/json", body, len, allow);
}

static enum MHD_Result respond_error(struct flare_server *s, struct MHD_Connection *c,
				     const struct flare_api_error *e, const char *allow)
{
	struct flare_buf b = {0};
	flare_api_error_json(&b, e);
	return respond_json(s, c, e->status, &b, allow);
}

static enum MHD_Result respond_simple_error(struct flare_server *s, struct MHD_Connection *c,
					    unsigned status, const char *param, const char *allow,
					    const char *msg)
{
	struct flare_api_error e;
	flare_api_error_set(&e, status, status >= 500 ? "server_error" : "invalid_request_error",
			    param, NULL, "%s", msg);
	return respond_error(s, c, &e, allow);
}

/* ---- exchanges ---------------------------------------------------------------- */

static struct exchange *exchange_new(struct flare_server *s, struct MHD_Connection *c, enum route r)
{
	struct exchange *x = calloc(1, sizeof *x);
	if (!x)
		return NULL;
	if (pthread_mutex_init(&x->lock, NULL)) {
		free(x);
		return NULL;
	}
	x->srv = s;
	x->conn = c;
	x->route = r;
	x->phase = PH_BODY;
	x->refs = 1;
	return x;
}

static void body_release(struct exchange *x)
{
	flare_buf_free(&x->body);
	if (x->charged)
		atomic_fetch_sub(&x->srv->buffered, x->charged);
	x->charged = 0;
}

static void exchange_ref(struct exchange *x)
{
	pthread_mutex_lock(&x->lock);
	x->refs++;
	pthread_mutex_unlock(&x->lock);
}

static void exchange_unref(struct exchange *x)
{
	pthread_mutex_lock(&x->lock);
	bool last = --x->refs == 0;
	pthread_mutex_unlock(&x->lock);
	if (!last)
		return;
	pthread_mutex_destroy(&x->lock);
	body_release(x);
	flare_buf_free(&x->out);
	for (uint32_t i = 0; i < x->n_ch; i++) {
		flare_buf_free(&x->ch[i].text);
		free(x->ch[i].toks);
	}
	free(x->ch);
	free(x->path);
	flare_api_request_free(&x->req);
	free(x);
}

/* Register x in the live list unless the server is stopping. */
static bool exchange_register(struct flare_server *s, struct exchange *x)
{
	pthread_mutex_lock(&s->lock);
	bool ok = atomic_load(&s->state) == ST_READY;
	if (ok) {
		x->next = s->live;
		if (s->live)
			s->live->prev = x;
		s->live = x;
		x->live = true;
		s->n_live++;
	}
	pthread_mutex_unlock(&s->lock);
	return ok;
}

static void exchange_unregister(struct flare_server *s, struct exchange *x)
{
	pthread_mutex_lock(&s->lock);
	if (x->live) {
		if (x->prev)
			x->prev->next = x->next;
		else
			s->live = x->next;
		if (x->next)
			x->next->prev = x->prev;
		x->prev = x->next = NULL;
		x->live = false;
		s->n_live--;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->lock);
}

/* Resume a connection we suspended (x->lock held). */
static void wake_locked(struct exchange *x)
{
	if (x->suspended) {
		x->suspended = false;
		MHD_resume_connection(x->conn);
	}
}

/* Suspend the connection until on_tokens/on_done (x->lock held). */
static void sleep_locked(struct exchange *x)
{
	x->suspended = true;
	MHD_suspend_connection(x->conn);
}

/* Cancel every engine request of x still running; returns whether any
 * was. */
static bool cancel_once(struct exchange *x)
{
	uint64_t ids[FLARE_API_CHOICES_MAX];
	size_t n = 0;
	pthread_mutex_lock(&x->lock);
	for (uint32_t i = 0; i < x->n_ch; i++) {
		struct choice *c = &x->ch[i];
		if (c->submitted && !c->done && !c->cancel_sent) {
			c->cancel_sent = true;
			ids[n++] = c->id;
		}
	}
	pthread_mutex_unlock(&x->lock);
	for (size_t i = 0; i < n; i++)
		x->srv->backend.ops->cancel(x->srv->backend.ctx, ids[i]);
	return n > 0;
}

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

static uint32_t on_tokens(void *ctx, const hel_token *t, const hel_logprob *lp, uint32_t n)
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

static void on_done(void *ctx, const hel_outcome *o)
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
	exchange_unref(x);
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

/* The handler runs again after the last on_done (or an abort) resumed a
 * plain request. */
static enum MHD_Result finish_plain(struct flare_server *s, struct exchange *x)
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
		cancel_once(x);

	enum MHD_Result ret;
	if (!ok) {
		ret = MHD_NO;
	} else if (failed && image_error(error)) {
		char msg[256];
		snprintf(msg, sizeof msg, "an image of the request does not decode: %s",
			 sel_strerror(error));
		ret = respond_simple_error(s, x->conn, 400, "messages", NULL, msg);
	} else if (failed) {
		char msg[256];
		snprintf(msg, sizeof msg, "the engine failed the request: %s", sel_strerror(error));
		ret = respond_simple_error(s, x->conn, 500, NULL, NULL, msg);
	} else if (cut && !any) {
		ret = respond_simple_error(s, x->conn, 503, NULL, NULL,
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
			ret = respond_json(s, x->conn, 200, &b, NULL);
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
		cancel_once(x);

	/* A failed choice ends the stream with an error event. */
	pthread_mutex_lock(&x->lock);
	int error = 0;
	for (uint32_t i = 0; i < x->n_ch && !error; i++)
		if (choice_failed(&x->ch[i]))
			error = x->ch[i].outcome.error ? x->ch[i].outcome.error : -EIO;
	pthread_mutex_unlock(&x->lock);
	if (error) {
		cancel_once(x);
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

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
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

static void stream_free(void *cls) { exchange_unref(cls); }

/* ---- starting a request ---------------------------------------------------------- */

/* Submit every choice: the first of each prompt plainly, its siblings
 * after it (branching).  0, or the first failure (the choices submitted
 * before it are cancelled). */
static int submit_all(struct flare_server *s, struct exchange *x)
{
	const struct flare_api_request *q = &x->req;
	for (uint32_t p = 0; p < q->n_prompts; p++) {
		uint64_t first = 0;
		for (uint32_t j = 0; j < q->n; j++) {
			struct choice *c = &x->ch[p * q->n + j];
			hel_sampler sm = q->sampler;
			sm.seed = q->seed_set ? q->sampler.seed + j : next_random(s);
			hel_request hr = {
				.prompt = q->prompts[p].tokens,
				.n_prompt = q->prompts[p].n,
				.images = p == 0 ? q->images : NULL, /* chat: one prompt */
				.n_images = p == 0 ? q->n_images : 0,
				.max_tokens = q->prompts[p].max_tokens,
				.ignore_eos = q->ignore_eos,
				.sampler = sm,
				.cache_salt = q->salt,
				.cache_salt_len = q->salt_len,
				.logprobs = q->logprobs,
				.top_logprobs = q->top_logprobs,
				.after = first,
				.on_tokens = on_tokens,
				.on_done = on_done,
				.ctx = c,
			};
			exchange_ref(x); /* the engine's, released by on_done */
			uint64_t id = 0;
			int rc = s->backend.ops->submit(s->backend.ctx, &hr, &id);
			if (rc) {
				exchange_unref(x);
				cancel_once(x);
				return rc;
			}
			pthread_mutex_lock(&x->lock);
			c->id = id;
			c->submitted = true;
			pthread_mutex_unlock(&x->lock);
			if (j == 0)
				first = id;
		}
	}
	return 0;
}

static enum MHD_Result start_exchange(struct flare_server *s, struct exchange *x)
{
	struct MHD_Connection *c = x->conn;
	x->phase = PH_ANSWERED;
	struct flare_api_error e;
	enum flare_api_kind kind = x->route == R_CHAT ? FLARE_API_CHAT : FLARE_API_COMPLETIONS;
	if (flare_api_parse(kind, x->body.data ? x->body.data : "", x->body.len, &s->cfg.limits,
			    &x->req, &e))
		return respond_error(s, c, &e, NULL);
	body_release(x);

	x->n_ch = x->req.n_prompts * x->req.n;
	x->ch = calloc(x->n_ch, sizeof *x->ch);
	if (!x->ch)
		return respond_simple_error(s, c, 500, NULL, NULL, "out of memory");
	for (uint32_t i = 0; i < x->n_ch; i++) {
		x->ch[i].x = x;
		x->ch[i].index = i;
		x->ch[i].prompt = i / x->req.n;
	}
	x->meta.kind = kind;
	snprintf(x->meta.id, sizeof x->meta.id, "%s-%016" PRIx64,
		 kind == FLARE_API_CHAT ? "chatcmpl" : "cmpl", next_random(s));
	x->meta.created = (int64_t)time(NULL);
	x->meta.model = s->model;
	x->meta.include_usage = x->req.stream && x->req.include_usage;
	x->meta.logprobs = x->req.logprobs;
	x->phase = x->req.stream ? PH_STREAM : PH_WAIT;

	if (!exchange_register(s, x)) {
		x->phase = PH_ANSWERED;
		return respond_simple_error(s, c, 503, NULL, NULL, "the server is stopping");
	}
	int rc = submit_all(s, x);
	if (rc) {
		const char *why = sel_errmsg();
		char msg[384];
		exchange_unregister(s, x);
		x->phase = PH_ANSWERED;
		if (rc == -EAGAIN)
			return respond_simple_error(s, c, 503, NULL, NULL,
						    "the request queue is full; retry later");
		if (rc == -ESHUTDOWN)
			return respond_simple_error(s, c, 503, NULL, NULL,
						    "the server is stopping");
		snprintf(msg, sizeof msg, "%s%s%s", sel_strerror(rc), *why ? ": " : "", why);
		if (rc == -EINVAL || rc == -E2BIG)
			return respond_simple_error(s, c, 400,
						    kind == FLARE_API_CHAT ? "messages" : "prompt",
						    NULL, msg);
		return respond_simple_error(s, c, 500, NULL, NULL, msg);
	}

	if (x->phase == PH_STREAM) {
		if (kind == FLARE_API_CHAT)
			for (uint32_t i = 0; i < x->n_ch; i++)
				flare_api_sse_role(&x->out, &x->meta, x->ch[i].index);
		exchange_ref(x); /* the response's, released by stream_free */
		struct MHD_Response *r = MHD_create_response_from_callback(
			MHD_SIZE_UNKNOWN, 4096, stream_read, x, stream_free);
		if (!r) {
			exchange_unref(x);
			x->phase = PH_ANSWERED;
			return MHD_NO; /* completion cancels the engine requests */
		}
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
		MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		MHD_add_response_header(r, "X-Accel-Buffering", "no");
		add_cors(s, c, r);
		enum MHD_Result ret = MHD_queue_response(c, 200, r);
		MHD_destroy_response(r);
		count_response(s, 200);
		atomic_fetch_add(&s->streams_active, 1);
		return ret;
	}
	pthread_mutex_lock(&x->lock);
	bool ready = x->n_done == x->n_ch || x->aborted || x->gone;
	if (!ready)
		sleep_locked(x);
	pthread_mutex_unlock(&x->lock);
	return ready ? finish_plain(s, x) : MHD_YES;
}

/* ---- GET endpoints ------------------------------------------------------------ */

static enum MHD_Result get_health(struct flare_server *s, struct MHD_Connection *c)
{
	int st = atomic_load(&s->state);
	struct flare_buf b = {0};
	flare_buf_printf(&b, "{\"status\":\"%s\"}",
			 st == ST_READY      ? "ok"
			 : st == ST_STARTING ? "starting"
					     : "stopping");
	return respond_json(s, c, st == ST_READY ? 200 : 503, &b, NULL);
}

static enum MHD_Result get_metrics(struct flare_server *s, struct MHD_Connection *c)
{
	hel_engine_stats st;
	memset(&st, 0, sizeof st);
	struct flare_metrics_info info;
	pthread_mutex_lock(&s->lock);
	info = s->cfg.info;
	bool have = atomic_load(&s->state) != ST_STARTING && s->backend.ops;
	pthread_mutex_unlock(&s->lock);
	if (have)
		s->backend.ops->stats(s->backend.ctx, &st);
	struct flare_http_stats h;
	flare_server_http_stats(s, &h);
	struct flare_buf b = {0};
	flare_metrics_format(&b, &st, &h, &info);
	if (flare_buf_failed(&b)) {
		flare_buf_free(&b);
		return MHD_NO;
	}
	size_t len = 0;
	char *body = flare_buf_take(&b, &len);
	if (!body)
		return MHD_NO;
	return respond(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", body, len, NULL);
}

static enum MHD_Result get_models(struct flare_server *s, struct MHD_Connection *c, const char *id)
{
	struct flare_buf b = {0};
	if (id && strcmp(id, s->model)) {
		struct flare_api_error e;
		flare_api_error_set(&e, 404, NULL, "model", "model_not_found",
				    "model '%.200s' does not exist; this server serves '%s'", id,
				    s->model);
		return respond_error(s, c, &e, NULL);
	}
	flare_api_model(&b, s->model, s->started_unix, id == NULL);
	return respond_json(s, c, 200, &b, NULL);
}

/* OPTIONS: a CORS preflight (Origin and Access-Control-Request-Method), or
 * plain OPTIONS, which says what the path allows. */
static enum MHD_Result options(struct flare_server *s, struct MHD_Connection *c, const char *allow)
{
	const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
	const char *method =
		MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method");
	if (origin && method) {
		if (!s->cors)
			return respond_simple_error(
				s, c, 403, NULL, allow,
				"cross-origin requests are off (--allowed-origins)");
		const char *ao = cors_origin(s, c);
		if (!ao) {
			char msg[320];
			snprintf(msg, sizeof msg,
				 "origin '%.200s' is not allowed (--allowed-origins)", origin);
			return respond_simple_error(s, c, 403, NULL, allow, msg);
		}
		/* The headers it asks for, if they are plain header names. */
		const char *hdrs = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
							       "Access-Control-Request-Headers");
		if (!hdrs || !*hdrs || strlen(hdrs) > 512 ||
		    strspn(hdrs,
			   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_, ") !=
			    strlen(hdrs))
			hdrs = "Authorization, Content-Type";
		char *empty = malloc(1);
		if (!empty)
			return MHD_NO;
		struct MHD_Response *r =
			MHD_create_response_from_buffer(0, empty, MHD_RESPMEM_MUST_FREE);
		if (!r) {
			free(empty);
			return MHD_NO;
		}
		MHD_add_response_header(r, "Access-Control-Allow-Origin", ao);
		if (strcmp(ao, "*"))
			MHD_add_response_header(r, "Vary", "Origin");
		MHD_add_response_header(r, "Access-Control-Allow-Methods", allow);
		MHD_add_response_header(r, "Access-Control-Allow-Headers", hdrs);
		MHD_add_response_header(r, "Access-Control-Max-Age", "600");
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
		enum MHD_Result ret = MHD_queue_response(c, 204, r);
		MHD_destroy_response(r);
		count_response(s, 204);
		return ret;
	}
	char *empty = malloc(1);
	if (!empty)
		return MHD_NO;
	return respond(s, c, 204, NULL, empty, 0, allow);
}

/* ---- the access handler --------------------------------------------------------- */

static enum route route_of(const char *url)
{
	if (!strcmp(url, "/v1/completions"))
		return R_COMPLETIONS;
	if (!strcmp(url, "/v1/chat/completions"))
		return R_CHAT;
	if (!strcmp(url, "/v1/models"))
		return R_MODELS;
	if (!strncmp(url, "/v1/models/", 11) && url[11])
		return R_MODEL;
	if (!strcmp(url, "/health"))
		return R_HEALTH;
	if (!strcmp(url, "/metrics"))
		return R_METRICS;
	return R_NONE;
}

/* The capacity flare_buf will have after appending n bytes to b. */
static size_t grown_cap(const struct flare_buf *b, size_t n)
{
	size_t need = b->len + n + 1;
	if (need <= b->cap)
		return b->cap;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap *= 2;
	return cap;
}

/* Charge the body's buffer growing to cap; false when over the budget. */
static bool body_charge(struct flare_server *s, struct exchange *x, size_t cap)
{
	if (cap <= x->charged)
		return true;
	size_t add = cap - x->charged;
	if (atomic_fetch_add(&s->buffered, add) + add > s->cfg.max_buffered) {
		atomic_fetch_sub(&s->buffered, add);
		return false;
	}
	x->charged = cap;
	return true;
}

static enum MHD_Result refuse_budget(struct flare_server *s, struct exchange *x)
{
	x->phase = PH_ANSWERED;
	char msg[160];
	snprintf(msg, sizeof msg,
		 "the server holds %zu bytes of request bodies (--max-buffered-bytes); retry later",
		 s->cfg.max_buffered);
	return respond_simple_error(s, x->conn, 503, NULL, NULL, msg);
}

/* The request is whole: answer it. */
static enum MHD_Result dispatch(struct flare_server *s, struct exchange *x, const char *method)
{
	struct MHD_Connection *c = x->conn;
	enum route r = x->route;
	bool post = r == R_COMPLETIONS || r == R_CHAT;
	const char *allow = post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS";
	x->phase = PH_ANSWERED;
	if (!strcmp(method, MHD_HTTP_METHOD_OPTIONS) && r != R_NONE)
		return options(s, c, allow);
	bool is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
	bool is_get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
	if (r == R_NONE) {
		char msg[320];
		snprintf(msg, sizeof msg, "unknown path '%.256s'", x->path);
		return respond_simple_error(s, c, 404, NULL, NULL, msg);
	}
	if (r != R_HEALTH && (r != R_METRICS || s->cfg.metrics_auth) && !authorized(s, c)) {
		atomic_fetch_add(&s->unauthorized, 1);
		struct flare_api_error e;
		bool sent = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
							MHD_HTTP_HEADER_AUTHORIZATION) != NULL;
		flare_api_error_set(&e, 401, NULL, NULL, "invalid_api_key", "%s",
				    sent ? "incorrect API key provided (Authorization: Bearer KEY)"
					 : "no API key provided: send the header Authorization: "
					   "Bearer KEY (--api-key)");
		return respond_error(s, c, &e, NULL);
	}
	if (post ? !is_post : !is_get) {
		char msg[160];
		snprintf(msg, sizeof msg, "this path needs %s, not %.32s", post ? "POST" : "GET",
			 method);
		return respond_simple_error(s, c, 405, NULL, allow, msg);
	}
	switch (r) {
	case R_HEALTH: return get_health(s, c);
	case R_METRICS: return get_metrics(s, c);
	case R_MODELS: return get_models(s, c, NULL);
	case R_MODEL: return get_models(s, c, x->path + 11);
	default: break;
	}
	if (atomic_load(&s->state) != ST_READY)
		return respond_simple_error(s, c, 503, NULL, NULL,
					    atomic_load(&s->state) == ST_STARTING
						    ? "the server is starting"
						    : "the server is stopping");
	if (x->too_large) {
		char msg[128];
		snprintf(msg, sizeof msg, "request body is larger than %zu bytes", s->cfg.max_body);
		return respond_simple_error(s, c, 413, NULL, NULL, msg);
	}
	if (x->over_budget)
		return refuse_budget(s, x);
	return start_exchange(s, x);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	(void)version;
	struct flare_server *s = cls;
	struct exchange *x = *con_cls;
	if (!x) {
		enum route r = route_of(url);
		x = exchange_new(s, c, r);
		if (!x)
			return MHD_NO;
		*con_cls = x;
		if (!(x->path = strdup(url)))
			return MHD_NO;
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
							     MHD_HTTP_HEADER_CONTENT_LENGTH);
		bool post = r == R_COMPLETIONS || r == R_CHAT;
		if (post && cl && strtoull(cl, NULL, 10) > s->cfg.max_body) {
			/* Refused before the body is read: the connection closes. */
			char msg[128];
			x->phase = PH_ANSWERED;
			snprintf(msg, sizeof msg, "request body is larger than %zu bytes",
				 s->cfg.max_body);
			return respond_simple_error(s, c, 413, NULL, NULL, msg);
		}
		return MHD_YES;
	}
	if (*upload_size) {
		bool post = x->route == R_COMPLETIONS || x->route == R_CHAT;
		if (post && x->phase == PH_BODY && !x->too_large && !x->over_budget) {
			if (x->body.len + *upload_size > s->cfg.max_body) {
				x->too_large = true;
				body_release(x);
			} else if (!body_charge(s, x, grown_cap(&x->body, *upload_size))) {
				/* Over the budget: the rest is read and dropped, and
				 * the answer (503) goes out once the request is whole. */
				x->over_budget = true;
				body_release(x);
				atomic_fetch_add(&s->buffer_refusals, 1);
			} else {
				flare_buf_append(&x->body, upload, *upload_size);
				if (flare_buf_failed(&x->body))
					return MHD_NO;
			}
		}
		*upload_size = 0;
		return MHD_YES;
	}
	switch (x->phase) {
	case PH_BODY: return dispatch(s, x, method);
	case PH_WAIT: return finish_plain(s, x);
	default: return MHD_NO;
	}
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)c;
	(void)toe;
	struct flare_server *s = cls;
	struct exchange *x = *con_cls;
	if (!x)
		return;
	*con_cls = NULL;
	if (cancel_once(x))
		atomic_fetch_add(&s->disconnects, 1);
	pthread_mutex_lock(&x->lock);
	x->closed = true;
	x->suspended = false;
	pthread_mutex_unlock(&x->lock);
	if (x->phase == PH_STREAM)
		atomic_fetch_sub(&s->streams_active, 1);
	exchange_unregister(s, x);
	body_release(x);
	exchange_unref(x);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	(void)c;
	(void)socket_context;
	struct flare_server *s = cls;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED)
		atomic_fetch_add(&s->connections, 1);
	else if (toe == MHD_CONNECTION_NOTIFY_CLOSED)
		atomic_fetch_sub(&s->connections, 1);
}

/* ---- the watcher: clients that leave while their request waits -------------------- */

#define WATCH_MAX 256

static void *watch_main(void *arg)
{
	struct flare_server *s = arg;
	eos_thread_name("flare-watch");
	struct pollfd pfd[WATCH_MAX + 1];
	struct exchange *xs[WATCH_MAX];
	while (!atomic_load(&s->watch_stop)) {
		size_t n = 0;
		pthread_mutex_lock(&s->lock);
		for (struct exchange *x = s->live; x && n < WATCH_MAX; x = x->next) {
			pthread_mutex_lock(&x->lock);
			if (x->suspended && !x->gone && !x->closed) {
				const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
					x->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
				if (ci) {
					x->refs++;
					xs[n] = x;
					pfd[n].fd = ci->connect_fd;
					pfd[n].events = POLLRDHUP;
					pfd[n].revents = 0;
					n++;
				}
			}
			pthread_mutex_unlock(&x->lock);
		}
		pthread_mutex_unlock(&s->lock);
		pfd[n].fd = s->wake_fd;
		pfd[n].events = POLLIN;
		pfd[n].revents = 0;
		int r = poll(pfd, n + 1, (int)s->cfg.watch_ms);
		for (size_t i = 0; i < n; i++) {
			struct exchange *x = xs[i];
			if (r > 0 && (pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
				/* Only a connection still suspended is the one we polled. */
				pthread_mutex_lock(&x->lock);
				bool act = x->suspended && !x->closed && !x->gone;
				if (act) {
					x->gone = true;
					wake_locked(x);
				}
				pthread_mutex_unlock(&x->lock);
				if (act && cancel_once(x))
					atomic_fetch_add(&s->disconnects, 1);
			}
			exchange_unref(x);
		}
	}
	return NULL;
}

/* ---- listening ----------------------------------------------------------------- */

static int open_listener(struct flare_server *s, const char *host, uint16_t port, int *fd_out,
			 char *err, size_t errlen)
{
	struct addrinfo hints = {0}, *res = NULL;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	char ps[8];
	snprintf(ps, sizeof ps, "%u", port);
	int g = getaddrinfo(host, ps, &hints, &res);
	if (g) {
		snprintf(err, errlen, "--host: cannot resolve '%s': %s", host, gai_strerror(g));
		return -EINVAL;
	}
	int fd = -1, e = 0;
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			e = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0)
			break;
		e = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0) {
		bool v6 = strchr(host, ':') != NULL;
		/* An address this host does not have is the --host's fault. */
		snprintf(err, errlen, "%s: cannot listen on %s%s%s:%u: %s",
			 e == EADDRNOTAVAIL ? "--host" : "--port", v6 ? "[" : "", host,
			 v6 ? "]" : "", port, strerror(e));
		return -e;
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss); /* the analyzer does not see getsockname fill it */
	socklen_t sl = sizeof ss;
	char addr[INET6_ADDRSTRLEN] = "?";
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
			s->port = ntohs(a->sin6_port);
			inet_ntop(AF_INET6, &a->sin6_addr, addr, sizeof addr);
			snprintf(s->url, sizeof s->url, "http://[%s]:%u", addr, s->port);
		} else {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;
			s->port = ntohs(a->sin_port);
			inet_ntop(AF_INET, &a->sin_addr, addr, sizeof addr);
			snprintf(s->url, sizeof s->url, "http://%s:%u", addr, s->port);
		}
	}
	*fd_out = fd;
	return 0;
}

/* ---- the public calls ----------------------------------------------------------- */

static void copy_info(struct flare_server *s, const struct flare_metrics_info *in)
{
	snprintf(s->mode, sizeof s->mode, "%s", in->mode ? in->mode : "");
	snprintf(s->store, sizeof s->store, "%s", in->store ? in->store : "");
	snprintf(s->transport, sizeof s->transport, "%s", in->transport ? in->transport : "");
	s->cfg.info = *in;
	s->cfg.info.model = s->model;
	s->cfg.info.mode = s->mode;
	s->cfg.info.store = s->store;
	s->cfg.info.transport = s->transport;
}

int flare_server_start(const struct flare_server_config *cfg, const struct flare_backend *b,
		       struct flare_server **out, char *err, size_t errlen)
{
	*out = NULL;
	if (sodium_init() < 0) {
		snprintf(err, errlen, "libsodium does not initialise");
		return -EIO;
	}
	struct flare_server *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->cfg = *cfg;
	if (!s->cfg.max_body)
		s->cfg.max_body = FLARE_SERVER_MAX_BODY;
	if (!s->cfg.threads)
		s->cfg.threads = 2;
	if (!s->cfg.watch_ms)
		s->cfg.watch_ms = 100;
	if (!s->cfg.max_connections)
		s->cfg.max_connections = FLARE_SERVER_MAX_CONNECTIONS;
	if (!s->cfg.idle_timeout_s)
		s->cfg.idle_timeout_s = FLARE_SERVER_IDLE_TIMEOUT_S;
	if (!s->cfg.max_buffered)
		s->cfg.max_buffered = FLARE_SERVER_MAX_BUFFERED;
	snprintf(s->model, sizeof s->model, "%s", cfg->limits.model ? cfg->limits.model : "");
	s->cfg.limits.model = s->model;
	copy_info(s, &cfg->info);
	s->cfg.host = NULL;
	s->cfg.api_key = NULL;
	s->cfg.allowed_origins = NULL;
	if (cfg->allowed_origins && *cfg->allowed_origins) {
		s->cors = true;
		s->cors_any = !strcmp(cfg->allowed_origins, "*");
		if (!(s->origins = strdup(cfg->allowed_origins))) {
			free(s);
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	}
	if (cfg->api_key && *cfg->api_key) {
		s->has_key = true;
		randombytes_buf(s->key_salt, sizeof s->key_salt);
		key_digest(s, cfg->api_key, strlen(cfg->api_key), s->key_hash);
	}
	if (b)
		s->backend = *b;
	s->wake_fd = -1;
	s->started_unix = (uint64_t)time(NULL);
	s->salt = splitmix(eos_now_ns() ^ (uint64_t)(uintptr_t)s ^ ((uint64_t)getpid() << 32));
	atomic_init(&s->state, ST_STARTING);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cv, NULL);

	int fd = -1,
	    rc = open_listener(s, cfg->host ? cfg->host : "127.0.0.1", cfg->port, &fd, err, errlen);
	if (rc)
		goto fail;
	s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->wake_fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		close(fd);
		goto fail;
	}
	/* poll, not epoll: libmicrohttpd 0.9.75's edge-triggered epoll mode
	 * misses the end of a connection whose client closed in the middle of
	 * a large body (it stays in CLOSE_WAIT, with its body held, until the
	 * idle timeout; test_flare_access).  poll costs nothing at our
	 * connection counts. */
	s->daemon = MHD_start_daemon(
		MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME |
			MHD_USE_ITC,
		0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
		on_connection, s, MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)s->cfg.threads,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned int)s->cfg.max_connections,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)s->cfg.max_per_client,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)s->cfg.idle_timeout_s, MHD_OPTION_END);
	if (!s->daemon) {
		rc = -EIO;
		snprintf(err, errlen, "cannot start the HTTP server on %s", s->url);
		close(fd);
		goto fail;
	}
	if (pthread_create(&s->watcher, NULL, watch_main, s)) {
		rc = -EAGAIN;
		snprintf(err, errlen, "cannot start the disconnect watcher thread");
		goto fail;
	}
	s->watcher_running = true;
	*out = s;
	return 0;
fail:
	s->stopped = !s->daemon;
	flare_server_destroy(s);
	return rc;
}

void flare_server_attach(struct flare_server *s, const struct flare_backend *b,
			 const struct flare_metrics_info *info)
{
	pthread_mutex_lock(&s->lock);
	s->backend = *b;
	if (info)
		copy_info(s, info);
	pthread_mutex_unlock(&s->lock);
}

uint16_t flare_server_port(const struct flare_server *s) { return s->port; }
const char *flare_server_url(const struct flare_server *s) { return s->url; }

void flare_server_set_ready(struct flare_server *s)
{
	pthread_mutex_lock(&s->lock);
	if (atomic_load(&s->state) == ST_STARTING && s->backend.ops)
		atomic_store(&s->state, ST_READY);
	pthread_mutex_unlock(&s->lock);
}

void flare_server_begin_stop(struct flare_server *s)
{
	pthread_mutex_lock(&s->lock);
	atomic_store(&s->state, ST_STOPPING);
	pthread_mutex_unlock(&s->lock);
}

void flare_server_http_stats(struct flare_server *s, struct flare_http_stats *out)
{
	memset(out, 0, sizeof *out);
	out->requests = atomic_load(&s->requests);
	for (int i = 0; i < 6; i++)
		out->responses[i] = atomic_load(&s->responses[i]);
	out->streams_active = atomic_load(&s->streams_active);
	out->disconnects = atomic_load(&s->disconnects);
	out->connections = atomic_load(&s->connections);
	out->buffered_bytes = atomic_load(&s->buffered);
	out->buffer_refusals = atomic_load(&s->buffer_refusals);
	out->unauthorized = atomic_load(&s->unauthorized);
}

/* Wait (server lock held) until no exchange is live or the deadline. */
static void wait_live(struct flare_server *s, uint64_t deadline)
{
	while (s->n_live > 0) {
		uint64_t now = eos_now_ns();
		if (now >= deadline)
			break;
		uint64_t left = deadline - now;
		if (left > 50000000ull)
			left = 50000000ull; /* recheck: the cv is monotonic-agnostic */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t ns = (uint64_t)ts.tv_nsec + left;
		ts.tv_sec += (time_t)(ns / 1000000000ull);
		ts.tv_nsec = (long)(ns % 1000000000ull);
		pthread_cond_timedwait(&s->cv, &s->lock, &ts);
	}
}

void flare_server_stop(struct flare_server *s, uint64_t grace_ns)
{
	if (s->stopped)
		return;
	flare_server_begin_stop(s);
	uint64_t now = eos_now_ns();
	pthread_mutex_lock(&s->lock);
	wait_live(s, now + grace_ns);
	/* End what is left: invariant 3. */
	for (struct exchange *x = s->live; x; x = x->next) {
		pthread_mutex_lock(&x->lock);
		x->aborted = true;
		wake_locked(x);
		pthread_mutex_unlock(&x->lock);
	}
	wait_live(s, eos_now_ns() + 1000000000ull);
	pthread_mutex_unlock(&s->lock);
	if (s->watcher_running) {
		atomic_store(&s->watch_stop, true);
		uint64_t one = 1;
		if (write(s->wake_fd, &one, sizeof one) < 0) {
			/* the watcher still wakes within watch_ms */
		}
		pthread_join(s->watcher, NULL);
		s->watcher_running = false;
	}
	if (s->daemon) {
		MHD_stop_daemon(s->daemon);
		s->daemon = NULL;
	}
	s->stopped = true;
}

void flare_server_destroy(struct flare_server *s)
{
	if (!s)
		return;
	if (!s->stopped)
		flare_server_stop(s, 0);
	if (s->watcher_running) {
		atomic_store(&s->watch_stop, true);
		pthread_join(s->watcher, NULL);
	}
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->lock);
	free(s->origins);
	sodium_memzero(s->key_hash, sizeof s->key_hash);
	free(s);
}
