/*
 * stats.c - the pool manager's /metrics: Prometheus text of its counters
 * and gauges (docs/pool.md "Metrics"), served by libmicrohttpd.
 *
 * DESIGN
 * The event loop owns struct mgr_stats and copies it into the HTTP side's
 * snapshot once a tick (under a mutex held for the copy only); the HTTP
 * thread formats the snapshot.  So /metrics never touches the manager's
 * state and lags it by at most one tick.  Metric names are fixed and every
 * labelled series is present (value 0) from the start.
 */
#include "manager/manager.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "flare/buf.h"

static void metric(struct flare_buf *b, const char *name, const char *type, const char *help)
{
	flare_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(struct flare_buf *b, const char *name, const char *type, const char *help,
		uint64_t v)
{
	metric(b, name, type, help);
	flare_buf_printf(b, "%s %" PRIu64 "\n", name, v);
}

/* A counter by reason, every reason except ok. */
static void by_reason(struct flare_buf *b, const char *name, const char *help, const uint64_t *v)
{
	metric(b, name, "counter", help);
	for (uint32_t r = 1; r < SEL_POOL_REASONS; r++)
		flare_buf_printf(b, "%s{reason=\"%s\"} %" PRIu64 "\n", name,
				 sel_pool_reason_name(r), v[r]);
}

void mgr_metrics_format(struct flare_buf *b, const struct mgr_stats *st,
			const struct mgr_metrics_info *info)
{
	metric(b, "flare_pool_info", "gauge",
	       "The pool manager: name, arena kind and region generation.");
	flare_buf_printf(
		b, "flare_pool_info{name=\"%s\",arena=\"%s\",generation=\"%016" PRIx64 "\"} 1\n",
		info->name, info->arena_kind, info->generation);
	one(b, "flare_pool_max_age_seconds", "gauge",
	    "Records expire this long after their last put or "
	    "restore (0: never).",
	    info->max_age_ns / 1000000000ull);
	one(b, "flare_pool_arena_bytes", "gauge", "Arena size.", st->arena_bytes);
	one(b, "flare_pool_arena_used_bytes", "gauge", "Arena bytes in records and leases.",
	    st->arena_used);
	one(b, "flare_pool_record_bytes", "gauge", "Arena bytes in committed records.",
	    st->record_bytes);
	one(b, "flare_pool_records", "gauge", "Records in the arena (pending puts included).",
	    st->records);
	one(b, "flare_pool_scopes", "gauge", "Distinct scopes (record layouts) known.", st->scopes);
	one(b, "flare_pool_holdings", "gauge", "Checkpoints instances announced.", st->holdings);
	one(b, "flare_pool_leases", "gauge",
	    "Open leases (claims, puts, exports), quarantined included.", st->leases);
	one(b, "flare_pool_quarantined_leases", "gauge",
	    "Leases of ended sessions whose process may still "
	    "copy.",
	    st->quarantined);
	one(b, "flare_pool_quarantined_bytes", "gauge", "Arena bytes those leases hold.",
	    st->quarantined_bytes);
	one(b, "flare_pool_recovering", "gauge",
	    "1 while a restarted manager waits for its previous "
	    "clients.",
	    st->recovering);
	one(b, "flare_pool_sessions", "gauge", "Connected clients.", st->sessions);
	one(b, "flare_pool_sessions_total", "counter", "Sessions opened.", st->sessions_total);
	one(b, "flare_pool_peers_refused_total", "counter",
	    "Connections refused for their uid and gid.", st->peers_refused);
	by_reason(b, "flare_pool_hellos_refused_total", "Hellos refused, by reason.",
		  st->hellos_refused);
	metric(b, "flare_pool_disconnects_total", "counter",
	       "Sessions the manager closed, by cause.");
	flare_buf_printf(b,
			 "flare_pool_disconnects_total{cause=\"slow_reader\"} %" PRIu64 "\n"
			 "flare_pool_disconnects_total{cause=\"protocol\"} %" PRIu64 "\n"
			 "flare_pool_disconnects_total{cause=\"closed\"} %" PRIu64 "\n"
			 "flare_pool_disconnects_total{cause=\"hello_timeout\"} %" PRIu64 "\n",
			 st->disconnects_slow, st->disconnects_protocol, st->disconnects_eof,
			 st->disconnects_timeout);
	one(b, "flare_pool_frames_in_total", "counter", "Frames received.", st->frames_in);
	one(b, "flare_pool_frames_out_total", "counter", "Frames sent.", st->frames_out);
	by_reason(b, "flare_pool_frames_refused_total",
		  "Frames refused: forged or stale handles, "
		  "malformed frames, holdings over the limits.",
		  st->refused);
	one(b, "flare_pool_lookups_total", "counter", "Lookups answered.", st->lookups);
	one(b, "flare_pool_lookup_hits_total", "counter", "Lookups answered with a candidate.",
	    st->lookup_hits);
	one(b, "flare_pool_lookup_candidates_total", "counter", "Candidates in answers.",
	    st->candidates);
	metric(b, "flare_pool_claims_granted_total", "counter", "Claims granted, by source.");
	for (uint32_t s = 0; s < SEL_POOL_SOURCES; s++)
		flare_buf_printf(b, "flare_pool_claims_granted_total{source=\"%s\"} %" PRIu64 "\n",
				 sel_pool_source_name(s), st->claims_granted[s]);
	by_reason(b, "flare_pool_claims_refused_total",
		  "Claims refused or failed before a grant, by "
		  "reason.",
		  st->claims_refused);
	one(b, "flare_pool_claims_released_total", "counter", "Claim leases released.",
	    st->claims_released);
	one(b, "flare_pool_claims_corrupt_total", "counter",
	    "Claims whose bytes failed the client's "
	    "checksums.",
	    st->claims_corrupt);
	one(b, "flare_pool_bad_records_total", "counter", "Records marked bad after such a claim.",
	    st->bad_records);
	one(b, "flare_pool_bytes_granted_total", "counter", "Bytes of claims granted.",
	    st->bytes_granted);
	one(b, "flare_pool_puts_granted_total", "counter", "Puts given windows.", st->puts_granted);
	by_reason(b, "flare_pool_puts_refused_total", "Puts refused, by reason.", st->puts_refused);
	one(b, "flare_pool_puts_accepted_total", "counter", "Puts committed into the pool.",
	    st->puts_accepted);
	by_reason(b, "flare_pool_puts_rejected_total", "Commits refused, by reason.",
		  st->puts_rejected);
	one(b, "flare_pool_bytes_put_total", "counter", "Bytes of committed records.",
	    st->bytes_put);
	one(b, "flare_pool_exports_requested_total", "counter", "Exports asked of holders.",
	    st->exports_requested);
	one(b, "flare_pool_exports_served_total", "counter", "Exports completed and granted.",
	    st->exports_served);
	by_reason(b, "flare_pool_exports_refused_total", "Exports refused or failed, by reason.",
		  st->exports_refused);
	by_reason(b, "flare_pool_leases_failed_total", "Leases failed by the manager, by reason.",
		  st->leases_failed);
	one(b, "flare_pool_leases_quarantined_total", "counter",
	    "Leases kept after their session ended.", st->leases_quarantined);
	one(b, "flare_pool_leases_reclaimed_total", "counter",
	    "Quarantined leases freed (the process "
	    "exited or reconnected drained).",
	    st->leases_reclaimed);
	one(b, "flare_pool_evicted_total", "counter", "Records evicted for room (LRU).",
	    st->evicted);
	one(b, "flare_pool_expired_total", "counter", "Records dropped by the max-age sweep.",
	    st->expired);
}

/* ---- the HTTP side ------------------------------------------------------------------------ */

struct mgr_http {
	struct MHD_Daemon *d;
	pthread_mutex_t mu;
	struct mgr_stats snap;
	struct mgr_metrics_info info;
	char name[SEL_POOL_NAME_MAX + 1];
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_len, void **state)
{
	(void)version;
	(void)upload;
	(void)upload_len;
	(void)state;
	struct mgr_http *h = cls;
	const char *ctype = "text/plain; charset=utf-8";
	unsigned status = 200;
	struct flare_buf b = {0};
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		status = 405;
		flare_buf_puts(&b, "only GET\n");
	} else if (!strcmp(url, "/metrics")) {
		struct mgr_stats st;
		pthread_mutex_lock(&h->mu);
		st = h->snap;
		pthread_mutex_unlock(&h->mu);
		mgr_metrics_format(&b, &st, &h->info);
		ctype = "text/plain; version=0.0.4; charset=utf-8";
	} else if (!strcmp(url, "/health")) {
		flare_buf_puts(&b, "ok\n");
	} else {
		status = 404;
		flare_buf_puts(&b, "not found (try /metrics)\n");
	}
	size_t len = 0;
	char *body = flare_buf_take(&b, &len);
	if (!body)
		return MHD_NO;
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

int mgr_http_start(const char *host, int port, const struct mgr_metrics_info *info,
		   struct mgr_http **out, int *bound, char *err, size_t errlen)
{
	*out = NULL;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		snprintf(err, errlen, "--metrics-host '%s' is not an IPv4 address", host);
		return -EINVAL;
	}
	struct mgr_http *h = calloc(1, sizeof *h);
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&h->mu, NULL);
	h->info = *info;
	snprintf(h->name, sizeof h->name, "%s", info->name);
	h->info.name = h->name;
	h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port,
				NULL, NULL, answer, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
				MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT,
				10u, MHD_OPTION_END);
	if (!h->d) {
		snprintf(err, errlen, "--metrics-port %d on %s: cannot listen", port, host);
		pthread_mutex_destroy(&h->mu);
		free(h);
		return -EADDRINUSE;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	*bound = di ? di->port : port;
	*out = h;
	return 0;
}

void mgr_http_publish(struct mgr_http *h, const struct mgr_stats *st)
{
	pthread_mutex_lock(&h->mu);
	h->snap = *st;
	pthread_mutex_unlock(&h->mu);
}

void mgr_http_stop(struct mgr_http *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->d);
	pthread_mutex_destroy(&h->mu);
	free(h);
}
