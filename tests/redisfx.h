/*
 * redisfx.h - real redis-server processes for the remote tier's tests and
 * benchmark, and the records they move.
 *
 * Servers: started with posix_spawn on 127.0.0.1 in a directory of their
 * own (log, nodes.conf, socket), no persistence; ports are picked by
 * binding a socket first (redis-server has no port 0) and picked again
 * when the server cannot bind; every wait has a deadline and polls the
 * condition it needs; servers are stopped by PID.  rfx_available says
 * whether redis-server exists (tests exit 77 without it).
 *
 * Records: a synthetic namespace, histories of random tokens, and records
 * on them whose pages and rows are a pure function of their key, so a
 * claim can be checked byte for byte; helpers put them and wait for a
 * client's events with deadlines.
 */
#ifndef REDISFX_H
#define REDISFX_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#include "recutil.h"
#include "remote_client.h"
#include "remote_value.h"

struct rfx_server {
	pid_t pid;
	int port;
	char dir[1024];
	char sock[1100]; /* unix socket path when asked for */
	bool cluster, unix_socket;
	char extra[512];   /* extra "--name value" pairs, space separated */
	redisContext *ctx; /* the test's own connection (rfx_cmd) */
};

/* Is redis-server (and redis-cli) on PATH? */
bool rfx_available(void);
/* Start a server in parent/name.  extra: "--maxmemory 8mb --maxmemory-policy
 * allkeys-lru" or NULL.  Waits (deadline 20 s) until it answers PING.
 * Exits the test (CHECK) on failure. */
void rfx_start(struct rfx_server *s, const char *parent, const char *name, bool cluster,
	       bool unix_socket, const char *extra);
/* Start again on the same port and directory (after a kill). */
void rfx_restart(struct rfx_server *s);
/* SIGTERM, then SIGKILL after 10 s; reaps it. */
void rfx_stop(struct rfx_server *s);
/* SIGKILL and reap. */
void rfx_kill(struct rfx_server *s);
void rfx_signal(struct rfx_server *s, int sig);
/* One command on the test's own connection (reconnecting as needed);
 * NULL when the server does not answer.  Free with freeReplyObject. */
redisReply *rfx_cmd(struct rfx_server *s, const char *fmt, ...);
redisReply *rfx_cmd_argv(struct rfx_server *s, int argc, const char **argv, const size_t *lens);
/* An integer reply, or -1. */
long long rfx_int(struct rfx_server *s, const char *fmt, ...);
/* Make a cluster of the n servers (started with cluster true) with
 * redis-cli --cluster create, and wait until every node sees every slot
 * assigned and the state ok.  log goes to parent/cluster.log. */
void rfx_cluster_create(struct rfx_server *s, int n, const char *parent);
/* The node id (CLUSTER MYID). */
void rfx_node_id(struct rfx_server *s, char out[64]);
/* "redis://127.0.0.1:PORT" (or the cluster's seeds) into buf. */
void rfx_url(const struct rfx_server *s, int n, bool cluster, char *buf, size_t len);

/* ---- Records ----------------------------------------------------------- */

struct rfx_ns {
	struct test_geo tg;
	sel_record_ns ns;
	uint8_t model[SEL_IDENTITY_BYTES];
};
/* ranks ranks, n planes of unit bytes each, a row of row bytes, page_tokens. */
void rfx_ns_init(struct rfx_ns *t, uint32_t ranks, uint32_t page_tokens, uint32_t n, uint64_t unit,
		 uint64_t row);
void rfx_ns_free(struct rfx_ns *t);
/* A history of n random tokens (seeded). */
void rfx_history(struct rfx_ns *t, sel_history *h, uint64_t n, uint64_t seed);

struct rfx_rec {
	sel_record_desc d;
	bool has_row;
	uint64_t stride, row_bytes;
	uint8_t *mem; /* tail pages, then the row */
	void **pages;
	struct iovec row[1];
};
/* The record at c tokens of h: linked under the record at parent (0: a
 * root holding its full chain), flags as given. */
void rfx_rec_make(struct rfx_rec *rec, const struct rfx_ns *t, const sel_history *h, uint64_t c,
		  uint64_t parent, uint32_t flags, bool has_row);
void rfx_rec_free(struct rfx_rec *rec);
/* The byte pattern of stored page i / the row of the record keyed k. */
void rfx_fill(const sel_key *k, uint64_t what, uint8_t *buf, uint64_t len);

/* Put rec and wait for its event (deadline 30 s); returns the event. */
struct sel_remote_event rfx_put(sel_remote *r, const struct rfx_rec *rec);
/* Wait for the event of op id (deadline timeout_ns); other events are kept
 * for later waits.  CHECK fails at the deadline. */
struct sel_remote_event rfx_wait(sel_remote *r, uint64_t id, uint64_t timeout_ns);
/* Look up h in (resident, limit] and wait. */
struct sel_remote_event rfx_lookup(sel_remote *r, const sel_history *h, uint64_t resident,
				   uint64_t limit);
/* Claim a hit into fresh buffers, wait, and when it succeeds check every
 * byte against rfx_fill (pages: rfx_page_want).  Returns the event's error (0 on success). */
int rfx_claim_check(sel_remote *r, sel_remote_hit *hit);
/* What stored page record i of the record k must read back as: rfx_fill's
 * bytes with the padding zeroed, as the writer does (record version 4). */
void rfx_page_want(const sel_record_ns *ns, const sel_key *k, uint32_t i, uint32_t flags,
		   uint8_t *buf, uint64_t stride);
/* rfx_claim_check needs each client's namespace: rfx_client records it;
 * a client opened with sel_remote_open is recorded with rfx_track. */
void rfx_track(const sel_remote *r, const sel_record_ns *ns);
/* Submit a claim of hit into fresh buffers (*mem, freed by the caller
 * after the event) without waiting or checking bytes: the op id. */
uint64_t rfx_claim_async(sel_remote *r, sel_remote_hit *hit, uint8_t **mem);
/* Wait (deadline timeout_ns) until the client's state is want. */
void rfx_wait_state(sel_remote *r, enum sel_rn_state want, uint64_t timeout_ns);
/* Open a client on url for t with test-sized settings. */
sel_remote *rfx_client(const char *url, const struct rfx_ns *t, const uint8_t *key, bool encrypt,
		       uint32_t window);

#endif
