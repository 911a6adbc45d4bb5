/*
 * flare_testlib.h - what the flare front-end tests share: a fake engine
 * behind the backend function table (src/flare/backend.h) and a plain TCP
 * HTTP/1.1 client.
 *
 * The fake engine runs one thread that emits the bytes of `reply` as
 * tokens, one token per step, round robin over its requests, and finishes
 * each with "stop" (reply exhausted) or "length" (max_tokens reached).  It
 * keeps the engine's contract: exactly one on_done per successful submit,
 * callbacks never under its lock, cancel finishes a request "cancelled",
 * stop cancels everything.  on_tokens returning k ends the request "stop"
 * (a stop sequence), as the engine does; logprobs are made up but
 * predictable (fake_main).  Knobs: delay between tokens, hold (stop after
 * the first token until cancelled), hold_all (no token at all), a forced
 * submit result, one failing submit, the outcome's reuse figures.  It
 * records the last request it was given and every seed.
 *
 * Header-only (static functions) so each test links only what it uses.
 */
#ifndef FLARE_TESTLIB_H
#define FLARE_TESTLIB_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"
#include "flare/backend.h"
#include "testutil.h"

#define UNUSED __attribute__((unused))

/* ---- the fake engine ------------------------------------------------------------ */

struct fake_req {
	struct fake_req *next;
	uint64_t id;
	hel_request r;
	uint32_t n_prompt;
	uint32_t emitted;
	bool cancelled;
	bool stopped; /* on_tokens ended it */
};

struct fake {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t thread;
	bool running, stopping;
	struct fake_req *reqs;
	uint64_t next_id;

	/* Knobs (set before use, or under mu). */
	const char *reply;
	unsigned delay_us;
	bool hold;
	bool hold_all; /* no token at all until cancelled (a queued request) */
	int submit_rc;
	unsigned fail_at; /* the submit with this number (1-based) fails -EAGAIN */
	uint64_t cached, gpu, host;
	sel_tier tier;

	/* Observations (under mu). */
	unsigned submitted, cancels, finished, stop_requests;
	unsigned tokens; /* on_tokens calls returned */
	hel_sampler last_sampler;
	uint64_t last_after;
	bool last_logprobs;
	uint32_t last_top_logprobs;
	uint64_t seeds[256];  /* of every submit, in order: the seed, */
	uint64_t afters[256]; /* hel_request.after, */
	uint64_t ids[256];    /* and the id it got */
	uint32_t last_max_tokens;
	bool last_ignore_eos;
	hel_token last_prompt[8192];
	uint32_t last_n_prompt;
	char last_salt[2048];
	size_t last_salt_len;
	bool last_has_salt;
	hel_engine_stats stats;
	hel_engine_config cfg;
	char cfg_disk[4096];
	bool opened;
};

static UNUSED void fake_init(struct fake *f)
{
	memset(f, 0, sizeof *f);
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	f->reply = "Hello, world!";
	f->next_id = 1;
	f->tier = SEL_TIER_MEMORY;
}

/* The outcome of q (under f->mu: reads the knobs). */
static hel_outcome fake_outcome(const struct fake_req *q, const char *reason, const struct fake *f)
{
	hel_outcome o = {0};
	o.finish_reason = reason;
	o.prompt_tokens = q->n_prompt;
	o.completion_tokens = q->emitted;
	o.cached_tokens = f->cached;
	o.reused_gpu_tokens = f->gpu;
	o.reused_host_tokens = f->host;
	o.host_tier = f->host ? f->tier : SEL_TIER_NONE;
	o.prefill_tokens = q->n_prompt > f->cached ? q->n_prompt - f->cached : 0;
	o.prefill_launches = 1;
	return o;
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	pthread_mutex_lock(&f->mu);
	while (!f->stopping) {
		/* First a cancelled request, else the first one that can step. */
		struct fake_req **pp, *q = NULL;
		for (pp = &f->reqs; *pp; pp = &(*pp)->next)
			if ((*pp)->cancelled || (*pp)->stopped ||
			    !(f->hold_all || (f->hold && (*pp)->emitted >= 1)))
				break;
		if (!*pp) {
			pthread_cond_wait(&f->cv, &f->mu);
			continue;
		}
		q = *pp;
		size_t len = strlen(f->reply);
		uint32_t limit = len < q->r.max_tokens ? (uint32_t)len : q->r.max_tokens;
		if (q->cancelled || q->stopped || q->emitted >= limit) {
			*pp = q->next;
			const char *why = q->cancelled                      ? "cancelled"
					  : q->stopped || q->emitted >= len ? "stop"
									    : "length";
			f->finished++;
			hel_outcome o = fake_outcome(q, why, f);
			pthread_mutex_unlock(&f->mu);
			q->r.on_done(q->r.ctx, &o);
			free(q);
			pthread_mutex_lock(&f->mu);
			continue;
		}
		hel_token t = (unsigned char)f->reply[q->emitted++];
		/* Round robin: move q to the end. */
		*pp = q->next;
		q->next = NULL;
		struct fake_req **tail = &f->reqs;
		while (*tail)
			tail = &(*tail)->next;
		*tail = q;
		unsigned delay = f->delay_us;
		pthread_mutex_unlock(&f->mu);
		/* Logprobs that tests can predict: the token itself at
		 * -(t % 8) / 4, alternatives t + 1, t + 2, ... lower. */
		hel_logprob lp = {0};
		lp.logprob = -(float)(t % 8) / 4;
		lp.n_top = q->r.top_logprobs;
		for (uint32_t k = 0; k < lp.n_top; k++) {
			lp.top[k] = (t + k) % 256;
			lp.top_logprob[k] = lp.logprob - (float)k;
		}
		uint32_t keep = q->r.on_tokens(q->r.ctx, &t, q->r.logprobs ? &lp : NULL, 1);
		if (delay)
			usleep(delay);
		pthread_mutex_lock(&f->mu);
		f->tokens++;
		if (keep) {
			q->stopped = true; /* a stop sequence: finish "stop" next */
			f->stop_requests++;
		}
	}
	/* Stopping: every request still here finishes cancelled. */
	while (f->reqs) {
		struct fake_req *q = f->reqs;
		f->reqs = q->next;
		f->finished++;
		hel_outcome o = fake_outcome(q, "cancelled", f);
		pthread_mutex_unlock(&f->mu);
		q->r.on_done(q->r.ctx, &o);
		free(q);
		pthread_mutex_lock(&f->mu);
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

static void fake_info(void *ctx, hel_engine_info *out)
{
	struct fake *f = ctx;
	memset(out, 0, sizeof *out);
	bool mem = f->cfg.memory_bytes > 0, disk = f->cfg.disk_dir != NULL;
	out->store = mem && disk ? "composite" : mem ? "memory" : disk ? "disk" : "disabled";
	out->transport = mem || disk ? "host" : "none";
	out->disk_note = "";
	out->slot_bytes = 8704;
	out->intake_slots = mem || disk ? 140 : 0;
	out->slots_total = out->intake_slots + f->cfg.memory_bytes / out->slot_bytes;
	out->memory_bytes = f->cfg.memory_bytes;
	if (disk)
		snprintf(out->disk_dir, sizeof out->disk_dir,
			 "%s/tiny-0011223344556677-8899aabbccddeeff", f->cfg.disk_dir);
	out->disk_limit = f->cfg.disk_limit_set ? f->cfg.disk_limit : (1ull << 30);
	out->scanned_records = disk ? 3 : 0;
	out->gpu_pages = (uint32_t)(f->cfg.gpu_cache_bytes / 8704);
	out->gpu_rows = 64;
	out->max_active = f->cfg.max_active;
}

static int fake_start(void *ctx)
{
	struct fake *f = ctx;
	pthread_mutex_lock(&f->mu);
	f->stopping = false;
	pthread_mutex_unlock(&f->mu);
	if (pthread_create(&f->thread, NULL, fake_main, f))
		return -EAGAIN;
	f->running = true;
	return 0;
}

static int fake_submit(void *ctx, const hel_request *r, uint64_t *id)
{
	struct fake *f = ctx;
	pthread_mutex_lock(&f->mu);
	int rc = f->stopping ? -ESHUTDOWN : f->submit_rc;
	if (!rc && f->fail_at && f->submitted + 1 == f->fail_at) {
		f->fail_at = 0;
		rc = -EAGAIN;
	}
	if (rc) {
		pthread_mutex_unlock(&f->mu);
		if (rc == -EINVAL)
			eos_fail(rc, "prompt: the fake engine refuses it");
		return rc;
	}
	struct fake_req *q = calloc(1, sizeof *q);
	CHECK(q);
	q->r = *r;
	q->r.prompt = NULL; /* copied below, as the engine does */
	q->r.cache_salt = NULL;
	q->n_prompt = r->n_prompt;
	q->id = f->next_id++;
	f->submitted++;
	f->last_sampler = r->sampler;
	f->last_after = r->after;
	f->last_logprobs = r->logprobs;
	f->last_top_logprobs = r->top_logprobs;
	if (f->submitted <= 256) {
		f->seeds[f->submitted - 1] = r->sampler.seed;
		f->afters[f->submitted - 1] = r->after;
		f->ids[f->submitted - 1] = q->id;
	}
	f->last_max_tokens = r->max_tokens;
	f->last_ignore_eos = r->ignore_eos;
	f->last_n_prompt = r->n_prompt < 8192 ? r->n_prompt : 8192;
	memcpy(f->last_prompt, r->prompt, f->last_n_prompt * sizeof *r->prompt);
	f->last_has_salt = r->cache_salt != NULL;
	f->last_salt_len = r->cache_salt_len < sizeof f->last_salt ? r->cache_salt_len : 0;
	if (r->cache_salt)
		memcpy(f->last_salt, r->cache_salt, f->last_salt_len);
	struct fake_req **tail = &f->reqs;
	while (*tail)
		tail = &(*tail)->next;
	*tail = q;
	*id = q->id;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return 0;
}

static int fake_cancel(void *ctx, uint64_t id)
{
	struct fake *f = ctx;
	int rc = -ENOENT;
	pthread_mutex_lock(&f->mu);
	for (struct fake_req *q = f->reqs; q; q = q->next)
		if (q->id == id && !q->cancelled) {
			q->cancelled = true;
			f->cancels++;
			rc = 0;
		}
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return rc;
}

static void fake_stats(void *ctx, hel_engine_stats *out)
{
	struct fake *f = ctx;
	pthread_mutex_lock(&f->mu);
	*out = f->stats;
	out->requests_submitted = f->submitted;
	out->requests_cancelled = f->cancels;
	pthread_mutex_unlock(&f->mu);
}

static int fake_stop(void *ctx, uint64_t deadline_ns)
{
	(void)deadline_ns;
	struct fake *f = ctx;
	/* A drain, as the engine reports one from its store's close. */
	if (f->cfg.drain_on_shutdown && f->cfg.drain_progress) {
		sel_drain_progress p = {.elapsed_ns = 1000000000ull,
					.records_written = 2,
					.bytes_written = 2 << 20,
					.records_writing = 1,
					.bytes_writing = 1 << 20,
					.records_left = 4,
					.bytes_left = 4 << 20,
					.rate_bps = 2 << 20};
		f->cfg.drain_progress(f->cfg.drain_ctx, &p);
		p.final = true;
		p.elapsed_ns = 1500000000ull;
		p.records_written = 3;
		p.bytes_written = 3 << 20;
		p.records_writing = 0;
		p.bytes_writing = 0;
		p.records_left = 4;
		p.why = "time limit";
		f->cfg.drain_progress(f->cfg.drain_ctx, &p);
	}
	pthread_mutex_lock(&f->mu);
	f->stopping = true;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	if (f->running) {
		pthread_join(f->thread, NULL);
		f->running = false;
	}
	return 0;
}

static void fake_destroy(void *ctx)
{
	struct fake *f = ctx;
	while (f->reqs) {
		struct fake_req *q = f->reqs;
		f->reqs = q->next;
		free(q);
	}
}

static const struct flare_backend_ops fake_ops = {
	.info = fake_info,
	.start = fake_start,
	.submit = fake_submit,
	.cancel = fake_cancel,
	.stats = fake_stats,
	.stop = fake_stop,
	.destroy = fake_destroy,
};

static UNUSED struct flare_backend fake_backend(struct fake *f)
{
	struct flare_backend b = {&fake_ops, f};
	return b;
}

static UNUSED int fake_open(const struct flare_backend_factory *fac, const hel_engine_config *cfg,
			    struct flare_backend *out, char *err, size_t errlen)
{
	struct fake *f = fac->arg;
	(void)err;
	(void)errlen;
	f->cfg = *cfg;
	if (cfg->disk_dir) {
		snprintf(f->cfg_disk, sizeof f->cfg_disk, "%s", cfg->disk_dir);
		f->cfg.disk_dir = f->cfg_disk;
	}
	f->opened = true;
	out->ops = &fake_ops;
	out->ctx = f;
	return 0;
}

/* Wait up to ms for *counter (read under f->mu) to reach want. */
static UNUSED bool fake_wait(struct fake *f, const unsigned *counter, unsigned want, int ms)
{
	for (int i = 0; i < ms; i++) {
		pthread_mutex_lock(&f->mu);
		unsigned v = *counter;
		pthread_mutex_unlock(&f->mu);
		if (v >= want)
			return true;
		usleep(1000);
	}
	return false;
}

/* ---- an HTTP/1.1 client over a plain socket ---------------------------------- */

static UNUSED int http_connect(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	struct sockaddr_in a = {0};
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECKF(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s", strerror(errno));
	return fd;
}

static UNUSED void http_send(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		CHECKF(w > 0, "send: %s", strerror(errno));
		c += w;
		n -= (size_t)w;
	}
}

/* Read up to cap-1 more bytes into buf at *len within ms; returns false on
 * EOF or timeout (errors are EOF). */
static UNUSED bool http_read_some(int fd, char *buf, size_t *len, size_t cap, int ms)
{
	struct pollfd p = {fd, POLLIN, 0};
	if (poll(&p, 1, ms) <= 0)
		return false;
	ssize_t r = read(fd, buf + *len, cap - 1 - *len);
	if (r <= 0)
		return false;
	*len += (size_t)r;
	buf[*len] = '\0';
	return true;
}

struct http_resp {
	int status;
	char head[8192]; /* status line and headers */
	char *body;      /* decoded (chunked removed), NUL-terminated */
	size_t len;
	char *raw; /* everything received */
	size_t raw_len;
};

static UNUSED void http_resp_free(struct http_resp *r)
{
	free(r->body);
	free(r->raw);
	memset(r, 0, sizeof *r);
}

/* Case-insensitive header lookup into out ("" when absent). */
static UNUSED const char *http_header(const struct http_resp *r, const char *name, char *out,
				      size_t cap)
{
	out[0] = '\0';
	size_t nl = strlen(name);
	for (const char *p = strstr(r->head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n")) {
		const char *h = p + 2;
		if (!strncasecmp(h, name, nl) && h[nl] == ':') {
			h += nl + 1;
			while (*h == ' ')
				h++;
			size_t n = strcspn(h, "\r");
			snprintf(out, cap, "%.*s", (int)n, h);
			break;
		}
	}
	return out;
}

/* Parse a complete response from raw bytes (the connection was closed). */
static UNUSED void http_parse(struct http_resp *r)
{
	char *end = strstr(r->raw, "\r\n\r\n");
	CHECKF(end, "no header end in response: %.200s", r->raw);
	size_t hl = (size_t)(end - r->raw);
	CHECK(hl < sizeof r->head);
	memcpy(r->head, r->raw, hl);
	r->head[hl] = '\0';
	CHECKF(sscanf(r->head, "HTTP/1.%*c %d", &r->status) == 1, "bad status line: %.100s",
	       r->head);
	const char *b = end + 4;
	size_t blen = r->raw_len - (size_t)(b - r->raw);
	char te[64];
	r->body = malloc(blen + 1);
	CHECK(r->body);
	if (strcasestr(http_header(r, "Transfer-Encoding", te, sizeof te), "chunked")) {
		size_t n = 0;
		const char *p = b, *e = b + blen;
		for (;;) {
			CHECKF(p < e, "chunked body ends early");
			unsigned long sz = strtoul(p, NULL, 16);
			const char *crlf = strstr(p, "\r\n");
			CHECK(crlf);
			p = crlf + 2;
			if (sz == 0)
				break;
			CHECK(p + sz <= e);
			memcpy(r->body + n, p, sz);
			n += sz;
			p += sz + 2;
		}
		r->len = n;
	} else {
		memcpy(r->body, b, blen);
		r->len = blen;
	}
	r->body[r->len] = '\0';
}

/* Send a complete request text and read until the server closes. */
static UNUSED void http_exchange(uint16_t port, const char *req, size_t req_len,
				 struct http_resp *out)
{
	memset(out, 0, sizeof *out);
	int fd = http_connect(port);
	http_send(fd, req, req_len);
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	CHECK(buf);
	buf[0] = '\0';
	for (;;) {
		if (len + 1 >= cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			CHECK(buf);
		}
		struct pollfd p = {fd, POLLIN, 0};
		int pr = poll(&p, 1, 20000);
		CHECKF(pr > 0, "timed out waiting for the response (have %zu bytes: %.200s)", len,
		       buf);
		ssize_t r = recv(fd, buf + len, cap - 1 - len, 0);
		if (r <= 0)
			break;
		len += (size_t)r;
		buf[len] = '\0';
	}
	close(fd);
	out->raw = buf;
	out->raw_len = len;
	http_parse(out);
}

static UNUSED void http_request(uint16_t port, const char *method, const char *path,
				const char *body, struct http_resp *out)
{
	size_t bl = body ? strlen(body) : 0;
	size_t cap = bl + 512;
	char *req = malloc(cap);
	CHECK(req);
	int n = snprintf(req, cap,
			 "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
			 "Content-Length: %zu\r\n\r\n",
			 method, path, body ? "Content-Type: application/json\r\n" : "", bl);
	if (body)
		memcpy(req + n, body, bl);
	http_exchange(port, req, (size_t)n + bl, out);
	free(req);
}

/* Read one whole response from a kept-alive connection (Content-Length
 * or chunked) into out; false when the connection closed or stalled for
 * 20 s first. */
static UNUSED bool http_read_response(int fd, struct http_resp *out)
{
	memset(out, 0, sizeof *out);
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	CHECK(buf);
	buf[0] = '\0';
	for (;;) {
		char *end = strstr(buf, "\r\n\r\n");
		if (end) {
			size_t hl = (size_t)(end - buf) + 4;
			const char *cl = strcasestr(buf, "\r\nContent-Length:");
			bool chunked = strcasestr(buf, "\r\nTransfer-Encoding: chunked") != NULL;
			if (cl && cl < end && len >= hl + strtoull(cl + 17, NULL, 10))
				break;
			if (chunked && len >= hl + 5 && !memcmp(buf + len - 5, "0\r\n\r\n", 5) &&
			    (len == hl + 5 || !memcmp(buf + len - 7, "\r\n", 2)))
				break;
			if (!cl && !chunked)
				break; /* no body (204, HEAD) */
		}
		if (len + 1 >= cap) {
			cap *= 2;
			buf = realloc(buf, cap);
			CHECK(buf);
		}
		if (!http_read_some(fd, buf, &len, cap, 20000)) {
			free(buf);
			return false;
		}
	}
	out->raw = buf;
	out->raw_len = len;
	http_parse(out);
	return true;
}

/* Send a request on a kept-alive connection (no Connection: close) with
 * extra header lines (each ending in \r\n, or NULL). */
static UNUSED void http_send_request(int fd, const char *method, const char *path,
				     const char *headers, const char *body)
{
	char head[2048];
	size_t bl = body ? strlen(body) : 0;
	int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s", method,
			 path, headers ? headers : "",
			 body ? "Content-Type: application/json\r\n" : "");
	if (body || !strcmp(method, "POST"))
		n += snprintf(head + n, sizeof head - (size_t)n, "Content-Length: %zu\r\n", bl);
	n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
	http_send(fd, head, (size_t)n);
	if (bl)
		http_send(fd, body, bl);
}

/* ---- Prometheus text ---------------------------------------------------------- */

/* Prometheus text: # HELP/# TYPE once per family, before its samples;
 * sample lines "name{labels} value". */
static UNUSED void prom_check(const char *text)
{
	char types[256][96];
	size_t nt = 0;
	const char *p = text;
	while (*p) {
		const char *nl = strchr(p, '\n');
		CHECK(nl);
		char line[512];
		size_t l = (size_t)(nl - p);
		CHECK(l < sizeof line);
		memcpy(line, p, l);
		line[l] = '\0';
		p = nl + 1;
		char name[96], kind[32];
		if (!strncmp(line, "# HELP ", 7)) {
			CHECK(sscanf(line + 7, "%95s", name) == 1);
			continue;
		}
		if (!strncmp(line, "# TYPE ", 7)) {
			CHECK(sscanf(line + 7, "%95s %31s", name, kind) == 2);
			CHECKF(!strcmp(kind, "counter") || !strcmp(kind, "gauge") ||
				       !strcmp(kind, "histogram"),
			       "type %s", kind);
			for (size_t i = 0; i < nt; i++)
				CHECKF(strcmp(types[i], name), "TYPE %s twice", name);
			bool total = strlen(name) > 6 && !strcmp(name + strlen(name) - 6, "_total");
			if (!strcmp(kind, "counter"))
				CHECKF(total, "counter %s does not end in _total", name);
			else
				CHECKF(!total, "%s %s ends in _total (promtool: only counters may)",
				       kind, name);
			CHECK(nt < 256);
			snprintf(types[nt++], sizeof types[0], "%s", name);
			continue;
		}
		CHECKF(line[0] != '#' && line[0], "bad line '%s'", line);
		size_t nl2 = strspn(line, "abcdefghijklmnopqrstuvwxyz_0123456789");
		CHECKF(nl2 > 0 && (line[nl2] == ' ' || line[nl2] == '{'), "bad sample '%s'", line);
		memcpy(name, line, nl2);
		name[nl2] = '\0';
		/* A histogram's samples are NAME_bucket, NAME_sum and NAME_count. */
		size_t fl = nt ? strlen(types[nt - 1]) : 0;
		if (nt && strcmp(types[nt - 1], name) && !strncmp(types[nt - 1], name, fl) &&
		    (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
		     !strcmp(name + fl, "_count")))
			name[fl] = '\0';
		CHECKF(nt > 0 && !strcmp(types[nt - 1], name), "sample %s outside its family",
		       name);
		const char *v = strrchr(line, ' ');
		char *end;
		strtod(v + 1, &end);
		CHECKF(*end == '\0' && end != v + 1, "bad value in '%s'", line);
	}
}

/* The value of the sample "name" or "name{labels}" (exactly as written);
 * fails when absent. */
static UNUSED double prom_value(const char *text, const char *sample)
{
	size_t n = strlen(sample);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (!strncmp(p, sample, n) && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	CHECKF(0, "no sample %s", sample);
	return 0;
}

#endif
