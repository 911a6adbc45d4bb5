/*
 * server.h - the HTTP server of `flare run`: libmicrohttpd glue between
 * clients and a backend (backend.h).  Endpoints: POST /v1/completions,
 * POST /v1/chat/completions (plain and streamed), GET /v1/models,
 * GET /health, GET /metrics (docs/configuration.md "HTTP API",
 * docs/metrics.md).
 *
 * Threads: libmicrohttpd's pool answers requests; one watcher thread
 * notices clients that go away while their request waits; the backend's
 * thread delivers tokens through callbacks that only copy and wake.  The
 * HTTP threads call the backend's submit, cancel and stats, nothing else.
 *
 * Lifecycle: start (answers 503 until set_ready) -> set_ready ->
 * begin_stop (503 for new requests; running ones continue) -> the caller
 * stops the backend, which finishes every request -> stop -> destroy.
 */
#ifndef FLARE_SERVER_H
#define FLARE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "flare/api.h"
#include "flare/backend.h"
#include "flare/metrics.h"

#define FLARE_SERVER_MAX_BODY (8u << 20)

struct flare_server_config {
	const char *host;                 /* address or name to listen on */
	uint16_t port;                    /* 0: any free port */
	struct flare_api_limits limits;   /* model name, vocab, context (copied) */
	struct flare_metrics_info info;   /* for flare_info (strings copied) */
	size_t max_body;                  /* request body limit; 0: FLARE_SERVER_MAX_BODY */
	unsigned threads;                 /* libmicrohttpd thread pool; 0: 2 */
	unsigned watch_ms;                /* disconnect check period; 0: 100 */
};

struct flare_server;

/* Listen and start answering (503 until flare_server_set_ready).  The
 * backend's table and context must outlive the server.  On failure writes
 * one line naming the flag at fault ("--port: cannot listen on
 * 127.0.0.1:8080: Address already in use"). */
int flare_server_start(const struct flare_server_config *cfg, const struct flare_backend *b,
		       struct flare_server **out, char *err, size_t errlen);
/* The bound port, and "http://ADDR:PORT" (IPv6 in brackets). */
uint16_t flare_server_port(const struct flare_server *s);
const char *flare_server_url(const struct flare_server *s);
void flare_server_set_ready(struct flare_server *s);
/* From now on new requests get 503 and /health says "stopping". */
void flare_server_begin_stop(struct flare_server *s);
void flare_server_http_stats(struct flare_server *s, struct flare_http_stats *out);
/* Wait up to grace_ns for requests in flight to finish and their responses
 * to go out (the backend's stop or cancel finishes them), end the rest
 * (503, or a "cancelled" finish on streams; their engine requests are
 * cancelled), then close every connection.  Idempotent. */
void flare_server_stop(struct flare_server *s, uint64_t grace_ns);
/* Stops first if needed.  NULL-safe. */
void flare_server_destroy(struct flare_server *s);

#endif
