/*
 * metrics.h - GET /metrics: an engine stats snapshot as Prometheus text
 * (exposition format 0.0.4; docs/metrics.md; design 2.11, 2.15 "Retention
 * metrics").
 *
 * Pure: a snapshot in, text out.
 */
#ifndef FLARE_METRICS_H
#define FLARE_METRICS_H

#include <stdint.h>

#include "flare/buf.h"
#include "helios/engine.h"

/* The front end's own counters (server.c keeps them). */
struct flare_http_stats {
	uint64_t requests;        /* HTTP requests answered */
	uint64_t responses[6];    /* by status class: [2] = 2xx ... [5] = 5xx */
	uint64_t streams_active;  /* SSE responses open */
	uint64_t disconnects;     /* clients gone before their request finished */
	uint64_t connections;     /* TCP connections open */
	uint64_t buffered_bytes;  /* request body bytes held */
	uint64_t buffer_refusals; /* requests refused (503) for the body budget */
	uint64_t unauthorized;    /* requests refused (401) for a missing or wrong API key */
};

/* What the startup summary knew (hel_engine_info), for the info gauges. */
struct flare_metrics_info {
	const char *model;
	const char *mode;  /* "off", "copy", "learned" */
	const char *store; /* "disabled", "memory", "disk", "composite" */
	const char *transport;
	uint64_t slot_bytes;
};

/* Append every metric (HELP and TYPE lines, then samples) to out.  Metric
 * names are fixed: a metric is present with value 0 rather than absent,
 * so dashboards and alerts need no special cases.  http and info may be
 * NULL. */
void flare_metrics_format(struct flare_buf *out, const hel_engine_stats *st,
			  const struct flare_http_stats *http,
			  const struct flare_metrics_info *info);

#endif
