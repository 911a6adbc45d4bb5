/*
 * server.c - libmicrohttpd glue of `flare run`: routing, request bodies,
 * waiting for the engine without holding a thread, choices, disconnects,
 * CORS, API keys, connection limits and shutdown (design 2.8 "every store
 * call from the worker returns without waiting" seen from the front end;
 * docs/configuration.md).  server_answer.c has the engine's callbacks,
 * stop sequences and the plain and streamed answers; server_int.h is what
 * the two share.
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

#include "flare/server_int.h"


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

enum MHD_Result srv_respond_json(struct flare_server *s, struct MHD_Connection *c, unsigned status,
				 struct flare_buf *b, const char *allow)
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
	return srv_respond_json(s, c, e->status, &b, allow);
}

enum MHD_Result srv_respond_simple_error(struct flare_server *s, struct MHD_Connection *c,
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

void srv_exchange_unref(struct exchange *x)
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

/* Cancel every engine request of x still running; returns whether any
 * was. */
bool srv_cancel_once(struct exchange *x)
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
				.on_tokens = srv_on_tokens,
				.on_done = srv_on_done,
				.ctx = c,
			};
			exchange_ref(x); /* the engine's, released by on_done */
			uint64_t id = 0;
			int rc = s->backend.ops->submit(s->backend.ctx, &hr, &id);
			if (rc) {
				srv_exchange_unref(x);
				srv_cancel_once(x);
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
		return srv_respond_simple_error(s, c, 500, NULL, NULL, "out of memory");
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
		return srv_respond_simple_error(s, c, 503, NULL, NULL, "the server is stopping");
	}
	int rc = submit_all(s, x);
	if (rc) {
		const char *why = sel_errmsg();
		char msg[384];
		exchange_unregister(s, x);
		x->phase = PH_ANSWERED;
		if (rc == -EAGAIN)
			return srv_respond_simple_error(s, c, 503, NULL, NULL,
							"the request queue is full; retry later");
		if (rc == -ESHUTDOWN)
			return srv_respond_simple_error(s, c, 503, NULL, NULL,
							"the server is stopping");
		snprintf(msg, sizeof msg, "%s%s%s", sel_strerror(rc), *why ? ": " : "", why);
		if (rc == -EINVAL || rc == -E2BIG)
			return srv_respond_simple_error(
				s, c, 400, kind == FLARE_API_CHAT ? "messages" : "prompt", NULL,
				msg);
		return srv_respond_simple_error(s, c, 500, NULL, NULL, msg);
	}

	if (x->phase == PH_STREAM) {
		if (kind == FLARE_API_CHAT)
			for (uint32_t i = 0; i < x->n_ch; i++)
				flare_api_sse_role(&x->out, &x->meta, x->ch[i].index);
		exchange_ref(x); /* the response's, released by stream_free */
		struct MHD_Response *r = MHD_create_response_from_callback(
			MHD_SIZE_UNKNOWN, 4096, srv_stream_read, x, srv_stream_free);
		if (!r) {
			srv_exchange_unref(x);
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
	return ready ? srv_finish_plain(s, x) : MHD_YES;
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
	return srv_respond_json(s, c, st == ST_READY ? 200 : 503, &b, NULL);
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
	return srv_respond_json(s, c, 200, &b, NULL);
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
			return srv_respond_simple_error(
				s, c, 403, NULL, allow,
				"cross-origin requests are off (--allowed-origins)");
		const char *ao = cors_origin(s, c);
		if (!ao) {
			char msg[320];
			snprintf(msg, sizeof msg,
				 "origin '%.200s' is not allowed (--allowed-origins)", origin);
			return srv_respond_simple_error(s, c, 403, NULL, allow, msg);
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
	return srv_respond_simple_error(s, x->conn, 503, NULL, NULL, msg);
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
		return srv_respond_simple_error(s, c, 404, NULL, NULL, msg);
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
		return srv_respond_simple_error(s, c, 405, NULL, allow, msg);
	}
	switch (r) {
	case R_HEALTH: return get_health(s, c);
	case R_METRICS: return get_metrics(s, c);
	case R_MODELS: return get_models(s, c, NULL);
	case R_MODEL: return get_models(s, c, x->path + 11);
	default: break;
	}
	if (atomic_load(&s->state) != ST_READY)
		return srv_respond_simple_error(s, c, 503, NULL, NULL,
						atomic_load(&s->state) == ST_STARTING
							? "the server is starting"
							: "the server is stopping");
	if (x->too_large) {
		char msg[128];
		snprintf(msg, sizeof msg, "request body is larger than %zu bytes", s->cfg.max_body);
		return srv_respond_simple_error(s, c, 413, NULL, NULL, msg);
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
			return srv_respond_simple_error(s, c, 413, NULL, NULL, msg);
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
	case PH_WAIT: return srv_finish_plain(s, x);
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
	if (srv_cancel_once(x))
		atomic_fetch_add(&s->disconnects, 1);
	pthread_mutex_lock(&x->lock);
	x->closed = true;
	x->suspended = false;
	pthread_mutex_unlock(&x->lock);
	if (x->phase == PH_STREAM)
		atomic_fetch_sub(&s->streams_active, 1);
	exchange_unregister(s, x);
	body_release(x);
	srv_exchange_unref(x);
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
				if (act && srv_cancel_once(x))
					atomic_fetch_add(&s->disconnects, 1);
			}
			srv_exchange_unref(x);
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
