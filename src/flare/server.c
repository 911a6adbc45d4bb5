/*
 * server.c - libmicrohttpd glue of `flare run`: routing, request bodies,
 * waiting for the engine without holding a thread, streaming, disconnects
 * and shutdown (design 2.8 "every store call from the worker returns
 * without waiting" seen from the front end; docs/configuration.md).
 *
 * DESIGN
 * Each POST is an exchange shared by three parties: the HTTP thread that
 * owns the connection, the engine thread that calls on_tokens/on_done, and
 * the watcher thread that notices a client that went away.  The exchange
 * is reference counted (HTTP side, engine side from submit to on_done, the
 * streamed response, the watcher while it polls) and its shared fields sit
 * under its mutex.
 *
 * No thread waits for the engine.  After submit, a plain request suspends
 * its connection and on_done resumes it; the access handler then runs
 * again and answers.  A streamed request queues a chunked response whose
 * reader turns tokens into SSE frames and suspends the connection when it
 * has nothing to send; on_tokens resumes it.  The engine callbacks only
 * copy tokens and resume: formatting happens on the HTTP threads.
 *
 * libmicrohttpd does not notice a client that disconnects while its
 * connection is suspended, and a request may wait long (queue, prefill).
 * The watcher polls the sockets of suspended exchanges for POLLRDHUP every
 * watch_ms and cancels their engine requests.
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
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	R_HEALTH,
	R_METRICS,
};

enum state { ST_STARTING, ST_READY, ST_STOPPING };

enum phase {
	PH_BODY,   /* receiving the body */
	PH_WAIT,   /* plain: submitted, waiting for on_done */
	PH_STREAM, /* streamed: response queued */
	PH_ANSWERED,
};

struct exchange {
	struct flare_server *srv;
	struct MHD_Connection *conn;
	enum route route;
	enum phase phase;          /* HTTP side only */
	struct flare_buf body;     /* HTTP side only */
	bool too_large;
	struct flare_api_request req;
	struct flare_api_meta meta;

	pthread_mutex_t lock;      /* everything below */
	int refs;
	uint64_t id;               /* the engine's request id */
	bool submitted, cancel_sent;
	hel_token *toks;           /* delivered, not yet taken by the HTTP side */
	size_t n_toks, cap_toks;
	bool done;
	hel_outcome outcome;
	char finish[16];
	bool suspended;
	bool gone;                 /* the watcher saw the client leave */
	bool aborted;              /* the server is stopping */
	bool closed;               /* libmicrohttpd finished with the request */
	struct exchange *prev, *next; /* server's live list (server lock) */
	bool live;

	/* Streaming, HTTP side only. */
	struct flare_buf text;     /* bytes not yet valid UTF-8 (a split character) */
	struct flare_buf out;      /* SSE bytes not yet handed to libmicrohttpd */
	size_t out_pos;
	hel_token *taken;
	size_t cap_taken;
	uint32_t streamed_tokens;
	bool ended;
};

struct flare_server {
	struct flare_server_config cfg;
	char model[HEL_NAME_MAX + 1];
	char mode[16], store[32], transport[32];
	struct flare_backend backend;
	struct MHD_Daemon *daemon;
	uint16_t port;
	char url[INET6_ADDRSTRLEN + 32];
	atomic_int state;
	uint64_t started_unix;

	pthread_mutex_t lock;
	pthread_cond_t cv;         /* live list shrank */
	struct exchange *live;
	size_t n_live;

	pthread_t watcher;
	bool watcher_running;
	int wake_fd;
	atomic_bool watch_stop;
	bool stopped;

	atomic_uint_fast64_t requests, responses[6], streams_active, disconnects, counter;
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

/* Queue body (malloc'd, non-NULL; taken) as the response. */
static enum MHD_Result respond(struct flare_server *s, struct MHD_Connection *c, unsigned status,
			       const char *ctype, char *body, size_t len, const char *allow)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	if (allow)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
	if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
		MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
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
	flare_buf_free(&x->body);
	flare_buf_free(&x->text);
	flare_buf_free(&x->out);
	flare_api_request_free(&x->req);
	free(x->toks);
	free(x->taken);
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

/* Cancel the engine request if it still runs; returns whether it did. */
static bool cancel_once(struct exchange *x)
{
	pthread_mutex_lock(&x->lock);
	bool need = x->submitted && !x->done && !x->cancel_sent;
	x->cancel_sent |= need;
	uint64_t id = x->id;
	pthread_mutex_unlock(&x->lock);
	if (need)
		x->srv->backend.ops->cancel(x->srv->backend.ctx, id);
	return need;
}

/* ---- engine callbacks (the engine's thread: copy, wake, return) ------------- */

static void on_tokens(void *ctx, const hel_token *t, uint32_t n)
{
	struct exchange *x = ctx;
	pthread_mutex_lock(&x->lock);
	if (!x->closed && !x->gone && n) {
		if (x->n_toks + n > x->cap_toks) {
			size_t cap = x->cap_toks ? x->cap_toks : 64;
			while (cap < x->n_toks + n)
				cap *= 2;
			hel_token *p = realloc(x->toks, cap * sizeof *p);
			if (p) {
				x->toks = p;
				x->cap_toks = cap;
			}
		}
		if (x->n_toks + n <= x->cap_toks) {
			memcpy(x->toks + x->n_toks, t, n * sizeof *t);
			x->n_toks += n;
		}
		if (x->req.stream)
			wake_locked(x);
	}
	pthread_mutex_unlock(&x->lock);
}

static void on_done(void *ctx, const hel_outcome *o)
{
	struct exchange *x = ctx;
	pthread_mutex_lock(&x->lock);
	x->outcome = *o;
	snprintf(x->finish, sizeof x->finish, "%s", o->finish_reason ? o->finish_reason : "stop");
	x->outcome.finish_reason = x->finish;
	x->done = true;
	if (!x->closed)
		wake_locked(x);
	pthread_mutex_unlock(&x->lock);
	exchange_unref(x);
}

/* ---- plain responses ------------------------------------------------------------- */

static char *detokenize(const hel_token *t, size_t n, size_t *len)
{
	char *b = malloc(n + 1);
	if (b)
		*len = hel_detokenize(t, n, b, n + 1);
	return b;
}

/* Map an engine error or a cancellation to a status. */
static enum MHD_Result respond_outcome_error(struct flare_server *s, struct exchange *x,
					     const hel_outcome *o, bool aborted)
{
	if (aborted || !strcmp(x->finish, "cancelled") || o->error == -ESHUTDOWN)
		return respond_simple_error(s, x->conn, 503, NULL, NULL,
					    "the request was cancelled: the server is stopping");
	char msg[256];
	snprintf(msg, sizeof msg, "the engine failed the request: %s", sel_strerror(o->error));
	return respond_simple_error(s, x->conn, 500, NULL, NULL, msg);
}

/* The handler runs again after on_done (or an abort) resumed a plain
 * request. */
static enum MHD_Result finish_plain(struct flare_server *s, struct exchange *x)
{
	pthread_mutex_lock(&x->lock);
	if (x->gone) {
		pthread_mutex_unlock(&x->lock);
		return MHD_NO; /* close: nobody is listening */
	}
	if (!x->done && !x->aborted) {
		sleep_locked(x); /* woken early: keep waiting */
		pthread_mutex_unlock(&x->lock);
		return MHD_YES;
	}
	bool done = x->done, aborted = x->aborted;
	hel_outcome o = x->outcome;
	hel_token *toks = x->toks;
	size_t n = x->n_toks;
	x->toks = NULL;
	x->n_toks = x->cap_toks = 0;
	pthread_mutex_unlock(&x->lock);
	x->phase = PH_ANSWERED;

	enum MHD_Result ret;
	if (!done) {
		cancel_once(x);
		ret = respond_simple_error(s, x->conn, 503, NULL, NULL,
					   "the request was cancelled: the server is stopping");
	} else if (o.error || !strcmp(x->finish, "cancelled") || !strcmp(x->finish, "error")) {
		ret = respond_outcome_error(s, x, &o, aborted);
	} else {
		size_t len = 0;
		char *raw = detokenize(toks, n, &len);
		struct flare_buf text = {0}, b = {0};
		if (raw)
			flare_utf8_clean(raw, len, true, &text);
		free(raw);
		if (!raw || flare_buf_failed(&text)) {
			flare_buf_free(&text);
			free(toks);
			return MHD_NO;
		}
		flare_api_response(&b, &x->meta, text.data ? text.data : "", text.len, &o);
		flare_buf_free(&text);
		ret = respond_json(s, x->conn, 200, &b, NULL);
	}
	free(toks);
	return ret;
}

/* ---- streamed responses ------------------------------------------------------------ */

/* Turn what the engine delivered into SSE bytes in x->out.  Returns false
 * when the connection should be dropped. */
static bool stream_fill(struct flare_server *s, struct exchange *x, bool *wait)
{
	*wait = false;
	pthread_mutex_lock(&x->lock);
	if (x->gone) {
		pthread_mutex_unlock(&x->lock);
		return false;
	}
	size_t n = x->n_toks;
	bool done = x->done, aborted = x->aborted;
	if (n == 0 && !done && !aborted) {
		sleep_locked(x);
		pthread_mutex_unlock(&x->lock);
		*wait = true;
		return true;
	}
	/* Swap buffers: the engine appends to an empty one while we format. */
	hel_token *t = x->toks;
	size_t cap = x->cap_toks;
	x->toks = x->taken;
	x->cap_toks = x->cap_taken;
	x->n_toks = 0;
	x->taken = t;
	x->cap_taken = cap;
	hel_outcome o = x->outcome;
	pthread_mutex_unlock(&x->lock);

	x->streamed_tokens += (uint32_t)n;
	size_t len = 0;
	char *raw = detokenize(x->taken, n, &len);
	if (!raw)
		return false;
	flare_buf_append(&x->text, raw, len);
	free(raw);
	bool final = done || aborted;
	struct flare_buf clean = {0};
	size_t used = flare_utf8_clean(x->text.data ? x->text.data : "", x->text.len, final, &clean);
	flare_buf_consume(&x->text, used);
	if (clean.len)
		flare_api_sse_text(&x->out, &x->meta, clean.data, clean.len);
	flare_buf_free(&clean);

	if (done) {
		if (o.error && strcmp(x->finish, "cancelled")) {
			struct flare_api_error e;
			flare_api_error_set(&e, 500, "server_error", NULL, NULL,
					    "the engine failed the request: %s", sel_strerror(o.error));
			flare_api_sse_error(&x->out, &e);
		} else {
			flare_api_sse_finish(&x->out, &x->meta, &o);
			if (x->meta.include_usage)
				flare_api_sse_usage(&x->out, &x->meta, &o);
		}
		flare_api_sse_done(&x->out);
		x->ended = true;
	} else if (aborted) {
		cancel_once(x);
		hel_outcome c = {.finish_reason = "cancelled", .prompt_tokens = x->req.n_prompt,
				 .completion_tokens = x->streamed_tokens};
		flare_api_sse_finish(&x->out, &x->meta, &c);
		flare_api_sse_done(&x->out);
		x->ended = true;
	}
	(void)s;
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

static void stream_free(void *cls)
{
	exchange_unref(cls);
}

/* ---- starting a request ---------------------------------------------------------- */

static enum MHD_Result start_exchange(struct flare_server *s, struct exchange *x)
{
	struct MHD_Connection *c = x->conn;
	x->phase = PH_ANSWERED;
	if (x->too_large) {
		char msg[128];
		snprintf(msg, sizeof msg, "request body is larger than %zu bytes", s->cfg.max_body);
		return respond_simple_error(s, c, 413, NULL, NULL, msg);
	}
	struct flare_api_error e;
	enum flare_api_kind kind = x->route == R_CHAT ? FLARE_API_CHAT : FLARE_API_COMPLETIONS;
	if (flare_api_parse(kind, x->body.data ? x->body.data : "", x->body.len, &s->cfg.limits,
			    &x->req, &e))
		return respond_error(s, c, &e, NULL);
	flare_buf_free(&x->body);
	if (!x->req.seed_set)
		x->req.sampler.seed = next_random(s);

	x->meta.kind = kind;
	snprintf(x->meta.id, sizeof x->meta.id, "%s-%016" PRIx64,
		 kind == FLARE_API_CHAT ? "chatcmpl" : "cmpl", next_random(s));
	x->meta.created = (int64_t)time(NULL);
	x->meta.model = s->model;
	x->meta.include_usage = x->req.stream && x->req.include_usage;
	x->phase = x->req.stream ? PH_STREAM : PH_WAIT;

	hel_request hr = {
		.prompt = x->req.prompt,
		.n_prompt = x->req.n_prompt,
		.max_tokens = x->req.max_tokens,
		.ignore_eos = x->req.ignore_eos,
		.sampler = x->req.sampler,
		.cache_salt = x->req.salt,
		.cache_salt_len = x->req.salt_len,
		.on_tokens = on_tokens,
		.on_done = on_done,
		.ctx = x,
	};
	if (!exchange_register(s, x)) {
		x->phase = PH_ANSWERED;
		return respond_simple_error(s, c, 503, NULL, NULL, "the server is stopping");
	}
	exchange_ref(x); /* the engine's, released by on_done */
	uint64_t id = 0;
	int rc = s->backend.ops->submit(s->backend.ctx, &hr, &id);
	if (rc) {
		const char *why = sel_errmsg();
		char msg[384];
		exchange_unregister(s, x);
		exchange_unref(x);
		x->phase = PH_ANSWERED;
		if (rc == -EAGAIN)
			return respond_simple_error(s, c, 503, NULL, NULL,
						    "the request queue is full; retry later");
		if (rc == -ESHUTDOWN)
			return respond_simple_error(s, c, 503, NULL, NULL, "the server is stopping");
		snprintf(msg, sizeof msg, "%s%s%s", sel_strerror(rc), *why ? ": " : "", why);
		if (rc == -EINVAL)
			return respond_simple_error(s, c, 400,
						    kind == FLARE_API_CHAT ? "messages" : "prompt", NULL,
						    msg);
		return respond_simple_error(s, c, 500, NULL, NULL, msg);
	}
	pthread_mutex_lock(&x->lock);
	x->id = id;
	x->submitted = true;
	pthread_mutex_unlock(&x->lock);

	if (x->phase == PH_STREAM) {
		if (kind == FLARE_API_CHAT)
			flare_api_sse_role(&x->out, &x->meta);
		exchange_ref(x); /* the response's, released by stream_free */
		struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096,
									   stream_read, x, stream_free);
		if (!r) {
			exchange_unref(x);
			x->phase = PH_ANSWERED;
			return MHD_NO; /* completion cancels the engine request */
		}
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
		MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
		MHD_add_response_header(r, "X-Accel-Buffering", "no");
		enum MHD_Result ret = MHD_queue_response(c, 200, r);
		MHD_destroy_response(r);
		count_response(s, 200);
		atomic_fetch_add(&s->streams_active, 1);
		return ret;
	}
	pthread_mutex_lock(&x->lock);
	bool ready = x->done || x->aborted || x->gone;
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
			 st == ST_READY ? "ok" : st == ST_STARTING ? "starting" : "stopping");
	return respond_json(s, c, st == ST_READY ? 200 : 503, &b, NULL);
}

static enum MHD_Result get_metrics(struct flare_server *s, struct MHD_Connection *c)
{
	hel_engine_stats st;
	memset(&st, 0, sizeof st);
	if (atomic_load(&s->state) != ST_STARTING)
		s->backend.ops->stats(s->backend.ctx, &st);
	struct flare_http_stats h;
	flare_server_http_stats(s, &h);
	struct flare_buf b = {0};
	flare_metrics_format(&b, &st, &h, &s->cfg.info);
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

static enum MHD_Result get_models(struct flare_server *s, struct MHD_Connection *c)
{
	struct flare_buf b = {0};
	flare_buf_printf(&b,
			 "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\","
			 "\"created\":%" PRIu64 ",\"owned_by\":\"flare\"}]}",
			 s->model, s->started_unix);
	return respond_json(s, c, 200, &b, NULL);
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
	if (!strcmp(url, "/health"))
		return R_HEALTH;
	if (!strcmp(url, "/metrics"))
		return R_METRICS;
	return R_NONE;
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
		bool post = r == R_COMPLETIONS || r == R_CHAT;
		bool is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
		bool is_get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
		char msg[320];
		if (r == R_NONE) {
			snprintf(msg, sizeof msg, "unknown path '%.256s'", url);
			return respond_simple_error(s, c, 404, NULL, NULL, msg);
		}
		if (post ? !is_post : !is_get) {
			snprintf(msg, sizeof msg, "%s needs %s, not %.32s", url, post ? "POST" : "GET",
				 method);
			return respond_simple_error(s, c, 405, NULL, post ? "POST" : "GET, HEAD", msg);
		}
		switch (r) {
		case R_HEALTH: return get_health(s, c);
		case R_METRICS: return get_metrics(s, c);
		case R_MODELS: return get_models(s, c);
		default: break;
		}
		if (atomic_load(&s->state) != ST_READY)
			return respond_simple_error(s, c, 503, NULL, NULL,
						    atomic_load(&s->state) == ST_STARTING
							    ? "the server is starting"
							    : "the server is stopping");
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
							     MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) {
			snprintf(msg, sizeof msg, "request body is larger than %zu bytes",
				 s->cfg.max_body);
			return respond_simple_error(s, c, 413, NULL, NULL, msg);
		}
		x = exchange_new(s, c, r);
		if (!x)
			return MHD_NO;
		*con_cls = x;
		return MHD_YES;
	}
	if (*upload_size) {
		if (!x->too_large) {
			if (x->body.len + *upload_size > s->cfg.max_body) {
				x->too_large = true;
				flare_buf_free(&x->body);
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
	case PH_BODY: return start_exchange(s, x);
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
	exchange_unref(x);
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
				const union MHD_ConnectionInfo *ci =
					MHD_get_connection_info(x->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
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
		snprintf(err, errlen, "--port: cannot listen on %s:%u: %s", host, port, strerror(e));
		return -e;
	}
	struct sockaddr_storage ss;
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

int flare_server_start(const struct flare_server_config *cfg, const struct flare_backend *b,
		       struct flare_server **out, char *err, size_t errlen)
{
	*out = NULL;
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
	snprintf(s->model, sizeof s->model, "%s", cfg->limits.model ? cfg->limits.model : "");
	snprintf(s->mode, sizeof s->mode, "%s", cfg->info.mode ? cfg->info.mode : "");
	snprintf(s->store, sizeof s->store, "%s", cfg->info.store ? cfg->info.store : "");
	snprintf(s->transport, sizeof s->transport, "%s", cfg->info.transport ? cfg->info.transport : "");
	s->cfg.limits.model = s->model;
	s->cfg.info.model = s->model;
	s->cfg.info.mode = s->mode;
	s->cfg.info.store = s->store;
	s->cfg.info.transport = s->transport;
	s->cfg.host = NULL;
	s->backend = *b;
	s->wake_fd = -1;
	s->started_unix = (uint64_t)time(NULL);
	s->salt = splitmix(eos_now_ns() ^ (uint64_t)(uintptr_t)s ^ ((uint64_t)getpid() << 32));
	atomic_init(&s->state, ST_STARTING);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cv, NULL);

	int fd = -1, rc = open_listener(s, cfg->host ? cfg->host : "127.0.0.1", cfg->port, &fd, err,
					errlen);
	if (rc)
		goto fail;
	s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->wake_fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		close(fd);
		goto fail;
	}
	s->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
					     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC,
				     0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
				     MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
				     MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)s->cfg.threads,
				     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)300, MHD_OPTION_END);
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

uint16_t flare_server_port(const struct flare_server *s) { return s->port; }
const char *flare_server_url(const struct flare_server *s) { return s->url; }

void flare_server_set_ready(struct flare_server *s)
{
	pthread_mutex_lock(&s->lock);
	if (atomic_load(&s->state) == ST_STARTING)
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
	free(s);
}
