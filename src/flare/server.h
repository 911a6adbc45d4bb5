/*
 * server.h - the HTTP server of `flare run`: libmicrohttpd glue between
 * clients and a backend (backend.h).  Endpoints: POST /v1/completions,
 * POST /v1/chat/completions (plain and streamed), GET /v1/models,
 * GET /v1/models/{id}, GET /health, GET /metrics, and OPTIONS on each
 * (CORS preflight) (docs/configuration.md "HTTP API", docs/metrics.md).
 *
 * Threads: libmicrohttpd's pool answers requests; one watcher thread
 * notices clients that go away while their request waits; the backend's
 * thread delivers tokens through callbacks that only copy, match stop
 * sequences and wake.  The HTTP threads call the backend's submit, cancel
 * and stats, nothing else.
 *
 * Lifecycle: start (listens at once; answers 503 "starting" until
 * set_ready) -> attach the backend -> set_ready -> begin_stop (503 for new
 * requests; running ones continue) -> the caller stops the backend, which
 * finishes every request -> stop -> destroy.  The port is bound before
 * the engine is built, so a busy port is found before minutes of loading.
 */
#ifndef FLARE_SERVER_H
#define FLARE_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flare/api.h"
#include "flare/backend.h"
#include "flare/metrics.h"

#define FLARE_SERVER_MAX_BODY (8u << 20)
#define FLARE_SERVER_MAX_CONNECTIONS 1024u
#define FLARE_SERVER_IDLE_TIMEOUT_S 30u
#define FLARE_SERVER_MAX_BUFFERED (64u << 20)

struct flare_server_config {
	const char *host;               /* address or name to listen on */
	uint16_t port;                  /* 0: any free port */
	struct flare_api_limits limits; /* model name, vocab, context (copied) */
	struct flare_metrics_info info; /* for flare_info (strings copied); attach may replace it */
	size_t max_body;                /* request body limit; 0: FLARE_SERVER_MAX_BODY */
	unsigned threads;               /* libmicrohttpd thread pool; 0: 2 */
	unsigned watch_ms;              /* disconnect check period; 0: 100 */
	/* CORS: NULL or "" off; "*" any origin; else origins separated by
	 * commas ("https://app.example.com,http://localhost:3000"). */
	const char *allowed_origins;
	/* Bearer token every endpoint but /health (and /metrics unless
	 * metrics_auth) requires; NULL or "": none.  Copied. */
	const char *api_key;
	bool metrics_auth;
	unsigned max_connections; /* 0: FLARE_SERVER_MAX_CONNECTIONS */
	unsigned max_per_client;  /* connections per client address; 0: no limit */
	unsigned idle_timeout_s;  /* 0: FLARE_SERVER_IDLE_TIMEOUT_S */
	size_t max_buffered; /* request body bytes held at once; 0: FLARE_SERVER_MAX_BUFFERED */
};

struct flare_server;

/* Listen and start answering (503 until flare_server_set_ready).  b may
 * be NULL here and given later with flare_server_attach; its table and
 * context must outlive the server.  On failure writes one line naming the
 * flag at fault ("--port: cannot listen on 127.0.0.1:8080: Address already
 * in use"). */
int flare_server_start(const struct flare_server_config *cfg, const struct flare_backend *b,
		       struct flare_server **out, char *err, size_t errlen);
/* Give the backend (and what the engine reported, for flare_info) to a
 * server started without one; before set_ready. */
void flare_server_attach(struct flare_server *s, const struct flare_backend *b,
			 const struct flare_metrics_info *info);
/* The bound port, and "http://ADDR:PORT" (IPv6 in brackets). */
uint16_t flare_server_port(const struct flare_server *s);
const char *flare_server_url(const struct flare_server *s);
void flare_server_set_ready(struct flare_server *s);
/* From now on new requests get 503 and /health says "stopping". */
void flare_server_begin_stop(struct flare_server *s);
void flare_server_http_stats(struct flare_server *s, struct flare_http_stats *out);
/* Wait up to grace_ns for requests in flight to finish and their responses
 * to go out (the backend's stop or cancel finishes them), end the rest
 * (503, or an "abort" finish with what was generated; their engine
 * requests are cancelled), then close every connection.  Idempotent. */
void flare_server_stop(struct flare_server *s, uint64_t grace_ns);
/* Stops first if needed.  NULL-safe. */
void flare_server_destroy(struct flare_server *s);

#endif
