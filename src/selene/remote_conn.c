/*
 * remote_conn.c - the remote tier's network: connections, pipelines,
 * cluster routing and redirects, reconnects, stalls, round trips (issue 16;
 * the Redis Cluster specification's "Redirection and resharding" and
 * "ASK redirection"; design 2.15 for the grace period the round trips
 * feed).
 *
 * The I/O half of our cluster client (remote_cluster.c is the pure half),
 * written here because Debian 12 packages no Redis Cluster client.
 * libhiredis makes the connections (non-blocking), formats small commands
 * and parses every reply; we own the socket loop so that one thread can
 * drive many connections with deadlines, and we frame the one command that
 * carries a window value ourselves so its 4 MiB are not copied twice more.
 *
 * DESIGN
 *   Every node (the one server, or each master a slot map or a redirect
 *   names) has two connections, lanes: FAST carries lookups, claims and
 *   pings, BULK carries puts, so a lookup never waits behind megabytes of
 *   background writes on one socket.  A connection's commands sit in one
 *   queue in send order; `send` points at the first not yet written
 *   completely, and replies, which Redis returns in order, complete
 *   commands from the head.
 *
 *   A connection is DOWN, CONNECTING (TCP handshake in progress),
 *   HANDSHAKE (SELECT and PING written, PING's reply awaited) or READY.
 *   Commands may be queued from CONNECTING on; a command for a DOWN
 *   connection whose backoff has not passed fails at once (-ENOTCONN), so a
 *   lost server turns lookups into misses without waiting.  A broken
 *   connection fails every queued command, doubles its backoff (50 ms to
 *   2 s, with jitter) and, in a cluster, asks for a slot map refresh.  No
 *   byte moved for stall_ns while a reply is due is a stall: the same as a
 *   break, which is what bounds a stopped server's hold on anything.
 *
 *   Routing: in a cluster a command goes to its slot's owner in the map, or
 *   to any node while the map has none (the node answers MOVED).  MOVED
 *   updates the slot's owner at once and schedules a CLUSTER SLOTS
 *   refresh (at most one in flight, one per 100 ms); ASK sends ASKING and
 *   the command to the named node without touching the map; TRYAGAIN (a
 *   multi-key command during a migration) retries after 10 ms for up to
 *   2 s.  At most five redirects per command.
 *
 *   Round trips: the time from a small fast-lane command's last byte
 *   written to its reply, pings included; the median of the last 16 is
 *   published with a histogram (the client derives the grace period).
 *
 * INVARIANTS
 *   1. A command is in exactly one list -- a connection's queue, the
 *      failed list or the delayed list -- from submission to done, and
 *      inflight counts them.
 *   2. In a queue, every command before `send` is written completely and
 *      every command from `send` on has sent < its total, except that only
 *      `send` itself may be partly written.
 *   3. A DOWN connection has no context and an empty queue.
 *   4. done is called exactly once per command, never from sel_rn_submit.
 */
#include "remote_conn.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <sodium.h>

#include "eos.h"
#include "list.h"
#include "remote_cluster.h"
#include "selene.h"

#define READ_CHUNK (256u << 10)
#define READS_PER_RUN 16
#define IOV_BATCH 64
#define REDIRECTS_MAX 5
#define TRYAGAIN_DELAY_NS (10ull * 1000 * 1000)
#define TRYAGAIN_FOR_NS (2ull * 1000 * 1000 * 1000)
#define REFRESH_MIN_NS (100ull * 1000 * 1000)
#define RTT_SAMPLES 16
#define NODES_MAX (SEL_RC_NODES_MAX + SEL_RU_SEEDS_MAX)

static const char ASKING[] = "*1\r\n$6\r\nASKING\r\n";
#define ASKING_LEN (sizeof ASKING - 1)

struct cmd_list {
	struct sel_rn_cmd *head, *tail;
	uint32_t n;
};
EOS_DLIST_DEFINE(cl, struct cmd_list, struct sel_rn_cmd)

enum conn_state {
	C_DOWN,
	C_CONNECTING,
	C_HANDSHAKE,
	C_READY
};

struct sel_rn_node;

struct sel_rn_conn {
	struct sel_rn *net;
	struct sel_rn_node *node;
	enum sel_rn_lane lane;
	enum conn_state st;
	redisContext *ctx;
	struct cmd_list q;
	struct sel_rn_cmd *send;
	uint64_t since_ns, io_ns, rx_ns, tx_ns, retry_ns, backoff_ns;
	uint32_t gen; /* connections made: tells a stale poll result */
	bool ever_ready, failed_once;
};

struct sel_rn_node {
	struct sel_rc_addr addr;
	bool is_unix;
	bool wanted; /* the server, a seed before the first map, or a master in the map */
	struct sel_rn_conn conn[SEL_RN_LANES];
};

struct sel_rn {
	struct sel_ru_url url;
	struct sel_rn_opts o;
	struct sel_rn_counters *ctr;
	bool cluster, closing;
	struct sel_rn_node *node[NODES_MAX];
	uint32_t n_nodes;
	uint16_t slot_node[SEL_RC_SLOTS];
	bool map_loaded, refresh_due, refreshing;
	uint64_t refresh_ns;
	struct cmd_list failed, delayed;
	uint64_t inflight;
	uint8_t *rbuf;
	struct sel_rc_slotmap *scratch;
	uint64_t rtt[RTT_SAMPLES];
	uint32_t rtt_n, rtt_i;
	char last_error[256];
	uint64_t errors;
	struct sel_rn_conn *pconn[2 * NODES_MAX];
	uint32_t pgen[2 * NODES_MAX];
	int npoll;
};

/* Has the interval since `since` reached len?  Times stamped by a
 * submission after the caller read its clock are in the "future". */
static bool elapsed(uint64_t now, uint64_t since, uint64_t len)
{
	return now > since && now - since >= len;
}

/* A reply may have buffered this much before it completes (conn_read). */
#define READER_MAX (SEL_RN_REPLY_STRING_MAX + (1u << 20))

/* ---- Commands ------------------------------------------------------------ */

static void cmd_free(struct sel_rn_cmd *c)
{
	free(c->seg);
	if (c->pending)
		freeReplyObject(c->pending);
	if (c->free_buf)
		c->free_buf(c->free_ctx, c->buf);
	else
		free(c->buf);
	free(c);
}

static size_t cmd_total(const struct sel_rn_cmd *c)
{
	return (c->asking ? ASKING_LEN : 0) + c->len;
}

static void set_error(struct sel_rn *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(struct sel_rn *n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(n->last_error, sizeof n->last_error, fmt, ap);
	va_end(ap);
	n->errors++;
}

static const char *node_text(const struct sel_rn_node *nd, char *buf, size_t len)
{
	if (nd->is_unix) {
		snprintf(buf, len, "unix:%s", nd->addr.host);
		return buf;
	}
	return sel_rc_addr_text(&nd->addr, buf, len);
}

/* Complete c: done, then free. */
static void complete(struct sel_rn *n, struct sel_rn_cmd *c, redisReply *reply, int err)
{
	n->inflight--;
	c->on = NULL;
	if (c->done)
		c->done(c, reply, err);
	cmd_free(c);
}

static void fail_later(struct sel_rn *n, struct sel_rn_cmd *c, int err)
{
	c->err = err;
	c->on = NULL;
	cl_push(&n->failed, c);
}

/* ---- State --------------------------------------------------------------- */

static void publish_state(struct sel_rn *n)
{
	uint32_t wanted = 0, up = 0;
	bool ever = false, failed = false;
	for (uint32_t i = 0; i < n->n_nodes; i++) {
		struct sel_rn_node *nd = n->node[i];
		if (!nd->wanted)
			continue;
		wanted++;
		if (nd->conn[SEL_RN_FAST].st == C_READY)
			up++;
		for (int l = 0; l < SEL_RN_LANES; l++) {
			ever |= nd->conn[l].ever_ready;
			failed |= nd->conn[l].failed_once;
		}
	}
	uint32_t st = up && up == wanted ? SEL_RN_UP
		      : up               ? SEL_RN_DEGRADED
		      : !ever && !failed ? SEL_RN_CONNECTING
					 : SEL_RN_DOWN;
	atomic_store_explicit(&n->ctr->nodes, wanted, memory_order_relaxed);
	atomic_store_explicit(&n->ctr->nodes_up, up, memory_order_relaxed);
	atomic_store_explicit(&n->ctr->state, st, memory_order_relaxed);
}

static void rtt_sample(struct sel_rn *n, uint64_t ns)
{
	n->rtt[n->rtt_i] = ns;
	n->rtt_i = (n->rtt_i + 1) % RTT_SAMPLES;
	if (n->rtt_n < RTT_SAMPLES)
		n->rtt_n++;
	uint64_t v[RTT_SAMPLES];
	memcpy(v, n->rtt, sizeof v);
	for (uint32_t i = 1; i < n->rtt_n; i++) /* insertion sort of at most 16 */
		for (uint32_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
			uint64_t t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	atomic_store_explicit(&n->ctr->rtt_ns, v[n->rtt_n / 2], memory_order_relaxed);
	uint64_t us = ns / 1000;
	uint32_t b = 0;
	while (b + 1 < SEL_RN_RTT_BUCKETS && us > (16ull << b))
		b++;
	atomic_fetch_add_explicit(&n->ctr->rtt_hist[b], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&n->ctr->rtt_sum_ns, ns, memory_order_relaxed);
}

/* ---- Connections --------------------------------------------------------- */

static void conn_kill(struct sel_rn_conn *k, int err, uint64_t now)
{
	struct sel_rn *n = k->net;
	if (k->ctx) {
		redisFree(k->ctx);
		k->ctx = NULL;
	}
	while (k->q.head) {
		struct sel_rn_cmd *c = k->q.head;
		cl_del(&k->q, c);
		if (c->pending) {
			freeReplyObject(c->pending);
			c->pending = NULL;
		}
		fail_later(n, c, err);
	}
	k->send = NULL;
	k->st = C_DOWN;
	k->failed_once = true;
	if (!k->backoff_ns)
		k->backoff_ns = n->o.backoff_min_ns;
	else if ((k->backoff_ns *= 2) > n->o.backoff_max_ns)
		k->backoff_ns = n->o.backoff_max_ns;
	/* +-25% so that many hosts do not reconnect in step. */
	uint64_t jitter = k->backoff_ns / 2;
	k->retry_ns =
		now + k->backoff_ns - jitter / 2 +
		(jitter ? randombytes_uniform((uint32_t)(jitter > UINT32_MAX ? UINT32_MAX : jitter))
			: 0);
	k->since_ns = now;
	if (n->cluster)
		n->refresh_due = true;
	publish_state(n);
}

static void hs_done(struct sel_rn_cmd *c, redisReply *reply, int err);

static struct sel_rn_cmd *internal_cmd(int argc, const char **argv, const size_t *lens,
				       sel_rn_done_fn done, void *owner)
{
	struct sel_rn_cmd *c = sel_rn_cmd_argv(argc, argv, lens);
	if (!c)
		return NULL;
	c->internal = true;
	c->done = done;
	c->owner = owner;
	c->replies = 1;
	return c;
}

static void enqueue(struct sel_rn_conn *k, struct sel_rn_cmd *c, bool front)
{
	c->on = k;
	c->sent = 0;
	c->replies = c->asking ? 2 : 1;
	if (front) {
		cl_push_front(&k->q, c);
		k->send = k->q.head;
	} else {
		cl_push(&k->q, c);
		if (!k->send)
			k->send = c;
	}
}

static int conn_connect(struct sel_rn_conn *k, uint64_t now)
{
	struct sel_rn *n = k->net;
	struct sel_rn_node *nd = k->node;
	char t[SEL_RC_HOST_MAX + 16];
	if (n->closing)
		return -ECANCELED;
	if (k->failed_once)
		atomic_fetch_add_explicit(&n->ctr->reconnects, 1, memory_order_relaxed);
	redisContext *ctx = nd->is_unix ? redisConnectUnixNonBlock(nd->addr.host)
					: redisConnectNonBlock(nd->addr.host, nd->addr.port);
	if (!ctx || ctx->err) {
		set_error(n, "connect to %s: %s", node_text(nd, t, sizeof t),
			  ctx ? ctx->errstr : "out of memory");
		if (ctx)
			redisFree(ctx);
		atomic_fetch_add_explicit(&n->ctr->connect_failures, 1, memory_order_relaxed);
		conn_kill(k, -ENOTCONN, now);
		return -ENOTCONN;
	}
	sel_rn_reader_bound(ctx->reader);
	ctx->reader->maxbuf = 0; /* keep the reader's buffer: windows are megabytes */
	k->ctx = ctx;
	k->gen++;
	k->st = C_CONNECTING;
	k->since_ns = k->io_ns = k->rx_ns = k->tx_ns = now;
	/* The handshake goes first: SELECT (a database other than 0), then PING,
	 * whose reply makes the connection READY. */
	static const char *ping[] = {"PING"};
	struct sel_rn_cmd *p = internal_cmd(1, ping, NULL, hs_done, k);
	if (!p) {
		conn_kill(k, -ENOMEM, now);
		return -ENOMEM;
	}
	p->rtt = k->lane == SEL_RN_FAST;
	p->tag = 1;
	n->inflight++;
	enqueue(k, p, true);
	if (!nd->is_unix && n->url.kind == SEL_RU_TCP && n->url.db) {
		char db[16];
		int dl = snprintf(db, sizeof db, "%u", n->url.db);
		const char *argv[] = {"SELECT", db};
		size_t lens[] = {6, (size_t)dl};
		struct sel_rn_cmd *s = internal_cmd(2, argv, lens, hs_done, k);
		if (!s) {
			conn_kill(k, -ENOMEM, now);
			return -ENOMEM;
		}
		n->inflight++;
		enqueue(k, s, true);
	} else if (nd->is_unix && n->url.db) {
		(void)0; /* unix:// has no database */
	}
	return 0;
}

static void hs_done(struct sel_rn_cmd *c, redisReply *reply, int err)
{
	struct sel_rn_conn *k = c->owner;
	struct sel_rn *n = k->net;
	char t[SEL_RC_HOST_MAX + 16];
	if (err || !reply)
		return; /* the connection is already down */
	if (reply->type == REDIS_REPLY_ERROR) {
		set_error(n, "%s: %s: %.*s", node_text(k->node, t, sizeof t),
			  c->tag == 1 ? "PING" : "SELECT", (int)reply->len, reply->str);
		/* Killed from the run loop after this reply (see handle_reply). */
		k->st = C_HANDSHAKE;
		k->backoff_ns = n->o.backoff_max_ns / 2; /* a refusal: retry slowly */
		c->err = -ECONNREFUSED;
		return;
	}
	if (c->tag == 1) {
		k->st = C_READY;
		k->ever_ready = true;
		k->backoff_ns = 0;
		/* The server answers: its other connections need no backoff. */
		for (int l = 0; l < SEL_RN_LANES; l++)
			if (k->node->conn[l].st == C_DOWN)
				k->node->conn[l].retry_ns = 0;
		publish_state(n);
	}
}

/* ---- Nodes and routing --------------------------------------------------- */

static int node_get(struct sel_rn *n, const struct sel_rc_addr *a, bool is_unix)
{
	for (uint32_t i = 0; i < n->n_nodes; i++)
		if (n->node[i]->is_unix == is_unix && n->node[i]->addr.port == a->port &&
		    strcmp(n->node[i]->addr.host, a->host) == 0)
			return (int)i;
	if (n->n_nodes == NODES_MAX)
		return -ENOSPC;
	struct sel_rn_node *nd = calloc(1, sizeof *nd);
	if (!nd)
		return -ENOMEM;
	nd->addr = *a;
	nd->is_unix = is_unix;
	for (int l = 0; l < SEL_RN_LANES; l++) {
		nd->conn[l].net = n;
		nd->conn[l].node = nd;
		nd->conn[l].lane = (enum sel_rn_lane)l;
		nd->conn[l].st = C_DOWN;
	}
	n->node[n->n_nodes] = nd;
	return (int)n->n_nodes++;
}

static struct sel_rn_node *pick(struct sel_rn *n, const struct sel_rn_cmd *c, uint64_t now)
{
	if (!n->cluster)
		return n->node[0];
	if (c->slot >= 0 && n->slot_node[c->slot] != SEL_RC_NO_NODE)
		return n->node[n->slot_node[c->slot]];
	struct sel_rn_node *best = NULL;
	for (uint32_t i = 0; i < n->n_nodes; i++) {
		struct sel_rn_node *nd = n->node[i];
		const struct sel_rn_conn *k = &nd->conn[c->lane];
		if (!nd->wanted)
			continue;
		if (k->st == C_READY)
			return nd;
		if (!best && (k->st != C_DOWN || now >= k->retry_ns))
			best = nd;
	}
	return best ? best : n->node[0];
}

static void route_to(struct sel_rn *n, struct sel_rn_cmd *c, struct sel_rn_node *nd, uint64_t now)
{
	struct sel_rn_conn *k = &nd->conn[c->lane];
	if (n->closing) {
		fail_later(n, c, -ECANCELED);
		return;
	}
	if (k->st == C_DOWN) {
		/* In its backoff, but another connection to the node answers:
		 * the server is there, connect now. */
		bool alive = false;
		for (int l = 0; l < SEL_RN_LANES; l++)
			alive |= nd->conn[l].st == C_READY;
		if ((now < k->retry_ns && !alive) || conn_connect(k, now) != 0) {
			fail_later(n, c, -ENOTCONN);
			return;
		}
	}
	enqueue(k, c, false);
}

void sel_rn_submit(struct sel_rn *n, struct sel_rn_cmd *c)
{
	uint64_t now = eos_now_ns();
	n->inflight++;
	c->first_ns = now;
	route_to(n, c, pick(n, c, now), now);
}

/* ---- Replies ------------------------------------------------------------- */

static bool reply_is(const redisReply *r, const char *word)
{
	size_t wl = strlen(word);
	return r->type == REDIS_REPLY_ERROR && r->len >= wl && memcmp(r->str, word, wl) == 0 &&
	       (r->len == wl || r->str[wl] == ' ');
}

/* A cluster error reply for c: follow it.  Returns true when c was taken
 * (re-routed, delayed or completed). */
static bool redirect(struct sel_rn_conn *k, struct sel_rn_cmd *c, redisReply *r, uint64_t now)
{
	struct sel_rn *n = k->net;
	struct sel_rc_redirect rd;
	if (c->pending) {
		freeReplyObject(c->pending);
		c->pending = NULL;
	}
	int rc = sel_rc_redirect_parse(r->str, r->len, &rd);
	if (rc < 0) {
		set_error(n, "%s", eos_errmsg());
		return false; /* the command sees the error reply */
	}
	if (rc == 1) {
		if (++c->redirects > REDIRECTS_MAX) {
			set_error(n, "more than %d redirects for slot %u", REDIRECTS_MAX, rd.slot);
			complete(n, c, NULL, -ELOOP);
			return true;
		}
		if (rd.unknown_endpoint) {
			n->refresh_due = true;
			complete(n, c, NULL, -EHOSTUNREACH);
			return true;
		}
		if (!rd.to.host[0])
			memcpy(rd.to.host, k->node->addr.host, sizeof rd.to.host);
		int idx = node_get(n, &rd.to, false);
		if (idx < 0) {
			complete(n, c, NULL, idx);
			return true;
		}
		if (rd.kind == SEL_RC_MOVED) {
			atomic_fetch_add_explicit(&n->ctr->moved, 1, memory_order_relaxed);
			n->slot_node[rd.slot] = (uint16_t)idx;
			n->node[idx]->wanted = true;
			n->refresh_due = true;
			c->asking = false;
		} else {
			atomic_fetch_add_explicit(&n->ctr->ask, 1, memory_order_relaxed);
			c->asking = true;
		}
		route_to(n, c, n->node[idx], now);
		return true;
	}
	if (reply_is(r, "TRYAGAIN")) {
		atomic_fetch_add_explicit(&n->ctr->tryagain, 1, memory_order_relaxed);
		if (elapsed(now, c->first_ns, TRYAGAIN_FOR_NS)) {
			complete(n, c, NULL, -ELOOP);
			return true;
		}
		c->tries++;
		c->asking = false;
		c->retry_ns = now + TRYAGAIN_DELAY_NS;
		cl_push(&n->delayed, c);
		return true;
	}
	if (reply_is(r, "CLUSTERDOWN"))
		n->refresh_due = true;
	return false;
}

static void map_done(struct sel_rn_cmd *c, redisReply *reply, int err);

static void handle_reply(struct sel_rn_conn *k, redisReply *r, uint64_t now)
{
	struct sel_rn *n = k->net;
	struct sel_rn_cmd *c = k->q.head;
	bool asking_reply = c && c->replies == 2 && c->sent >= ASKING_LEN;
	if (!c || (c == k->send && !asking_reply)) {
		char t[SEL_RC_HOST_MAX + 16];
		set_error(n, "%s: a reply to no command", node_text(k->node, t, sizeof t));
		freeReplyObject(r);
		conn_kill(k, -EPROTO, now);
		return;
	}
	if (asking_reply) { /* ASKING's +OK, kept until the command's own reply */
		c->replies = 1;
		c->pending = r;
		return;
	}
	cl_del(&k->q, c);
	c->on = NULL;
	if (c->rtt)
		rtt_sample(n, now > c->sent_ns ? now - c->sent_ns : 0);
	if (n->cluster && !c->internal && r->type == REDIS_REPLY_ERROR && redirect(k, c, r, now)) {
		freeReplyObject(r);
		return;
	}
	bool refused = false;
	n->inflight--;
	if (c->done)
		c->done(c, r, 0);
	refused = c->internal && c->err == -ECONNREFUSED;
	freeReplyObject(r);
	cmd_free(c);
	if (refused && k->ctx)
		conn_kill(k, -ECONNREFUSED, now);
}

/* ---- I/O ----------------------------------------------------------------- */

static void conn_write(struct sel_rn_conn *k, uint64_t now)
{
	struct sel_rn *n = k->net;
	while (k->ctx && k->st != C_CONNECTING && k->send) {
		struct iovec iov[IOV_BATCH];
		int cnt = 0;
		for (struct sel_rn_cmd *c = k->send; c && cnt < IOV_BATCH - 1;) {
			struct sel_rn_cmd *next = c->next;
			if (c->sent == 0 && c->cancel && *c->cancel) {
				if (k->send == c)
					k->send = next;
				cl_del(&k->q, c);
				fail_later(n, c, -ECANCELED);
				c = next;
				continue;
			}
			size_t off = c->sent;
			if (c->asking && off < ASKING_LEN) {
				iov[cnt].iov_base = (void *)(ASKING + off);
				iov[cnt++].iov_len = ASKING_LEN - off;
				off = ASKING_LEN;
			}
			size_t boff = off - (c->asking ? ASKING_LEN : 0);
			if (!c->seg) {
				iov[cnt].iov_base = c->buf + boff;
				iov[cnt++].iov_len = c->len - boff;
			} else {
				for (uint32_t i = 0; i < c->nseg && cnt < IOV_BATCH; i++) {
					size_t sl = c->seg[i].iov_len;
					if (boff >= sl) {
						boff -= sl;
						continue;
					}
					iov[cnt].iov_base = (char *)c->seg[i].iov_base + boff;
					iov[cnt++].iov_len = sl - boff;
					boff = 0;
				}
				if (cnt == IOV_BATCH)
					break; /* the rest of c on the next writev */
			}
			c = next;
		}
		if (!cnt)
			return;
		ssize_t w = writev(k->ctx->fd, iov, cnt);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			char t[SEL_RC_HOST_MAX + 16];
			set_error(n, "write to %s: %s", node_text(k->node, t, sizeof t),
				  strerror(errno));
			conn_kill(k, -ECONNRESET, now);
			return;
		}
		atomic_fetch_add_explicit(&n->ctr->wire_out, (uint64_t)w, memory_order_relaxed);
		k->io_ns = k->tx_ns = now;
		size_t left = (size_t)w;
		while (k->send && left) {
			struct sel_rn_cmd *c = k->send;
			size_t rem = cmd_total(c) - c->sent;
			if (left < rem) {
				c->sent += left;
				break;
			}
			left -= rem;
			c->sent = cmd_total(c);
			c->sent_ns = now;
			k->send = c->next;
		}
	}
}

void sel_rn_cmd_detach(struct sel_rn *n, struct sel_rn_cmd *c)
{
	if (!c->seg || (c->sent == 0 && c->cancel && *c->cancel) || c->sent >= cmd_total(c))
		return;
	char *flat = malloc(c->len ? c->len : 1);
	if (!flat) {
		if (c->on)
			conn_kill(c->on, -ENOMEM, eos_now_ns());
		set_error(n, "out of memory copying a command");
		return;
	}
	size_t at = 0;
	for (uint32_t i = 0; i < c->nseg; i++) {
		memcpy(flat + at, c->seg[i].iov_base, c->seg[i].iov_len);
		at += c->seg[i].iov_len;
	}
	if (c->free_buf)
		c->free_buf(c->free_ctx, c->buf);
	else
		free(c->buf);
	free(c->seg);
	c->seg = NULL;
	c->nseg = 0;
	c->buf = flat;
	c->free_buf = NULL;
}

static void conn_read(struct sel_rn_conn *k, uint64_t now)
{
	struct sel_rn *n = k->net;
	char t[SEL_RC_HOST_MAX + 16];
	for (int i = 0; i < READS_PER_RUN && k->ctx; i++) {
		ssize_t r = read(k->ctx->fd, n->rbuf, READ_CHUNK);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (r <= 0) {
			set_error(n, "%s: %s", node_text(k->node, t, sizeof t),
				  r == 0 ? "connection closed" : strerror(errno));
			conn_kill(k, -ECONNRESET, now);
			return;
		}
		atomic_fetch_add_explicit(&n->ctr->wire_in, (uint64_t)r, memory_order_relaxed);
		k->io_ns = k->rx_ns = now;
		if (redisReaderFeed(k->ctx->reader, (const char *)n->rbuf, (size_t)r) != REDIS_OK) {
			set_error(n, "%s: %s", node_text(k->node, t, sizeof t),
				  k->ctx->reader->errstr);
			conn_kill(k, -EPROTO, now);
			return;
		}
		if (k->ctx->reader->len - k->ctx->reader->pos > READER_MAX) {
			set_error(n, "%s: a reply beyond %u MiB", node_text(k->node, t, sizeof t),
				  READER_MAX >> 20);
			conn_kill(k, -EPROTO, now);
			return;
		}
		for (;;) {
			void *rep = NULL;
			if (redisReaderGetReply(k->ctx->reader, &rep) != REDIS_OK) {
				set_error(n, "%s: %s", node_text(k->node, t, sizeof t),
					  k->ctx->reader->errstr);
				conn_kill(k, -EPROTO, now);
				return;
			}
			if (!rep)
				break;
			handle_reply(k, rep, now);
			if (!k->ctx)
				return;
		}
		if ((size_t)r < READ_CHUNK)
			return;
	}
}

static void connected(struct sel_rn_conn *k, uint64_t now)
{
	int soerr = 0;
	socklen_t sl = sizeof soerr;
	if (getsockopt(k->ctx->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
		soerr = errno;
	if (soerr) {
		char t[SEL_RC_HOST_MAX + 16];
		set_error(k->net, "connect to %s: %s", node_text(k->node, t, sizeof t),
			  strerror(soerr));
		atomic_fetch_add_explicit(&k->net->ctr->connect_failures, 1, memory_order_relaxed);
		conn_kill(k, -ENOTCONN, now);
		return;
	}
	k->st = C_HANDSHAKE;
	k->io_ns = k->rx_ns = k->tx_ns = now;
}

/* ---- The slot map -------------------------------------------------------- */

static void refresh(struct sel_rn *n, uint64_t now)
{
	struct sel_rn_conn *k = NULL;
	for (uint32_t i = 0; i < n->n_nodes && !k; i++)
		if (n->node[i]->wanted && n->node[i]->conn[SEL_RN_FAST].st == C_READY)
			k = &n->node[i]->conn[SEL_RN_FAST];
	if (!k)
		return; /* asked again once some node answers */
	static const char *argv[] = {"CLUSTER", "SLOTS"};
	struct sel_rn_cmd *c = internal_cmd(2, argv, NULL, map_done, k);
	if (!c)
		return;
	n->refreshing = true;
	n->refresh_due = false;
	n->refresh_ns = now;
	n->inflight++;
	enqueue(k, c, false);
}

static void map_done(struct sel_rn_cmd *c, redisReply *reply, int err)
{
	struct sel_rn_conn *k = c->owner;
	struct sel_rn *n = k->net;
	n->refreshing = false;
	if (err || !reply) {
		n->refresh_due = true;
		return;
	}
	int rc = sel_rc_slotmap_parse(reply, k->node->addr.host, n->scratch);
#if defined(SEL_SANITIZED) || defined(SEL_DEBUG_CHECKS)
	if (!rc && sel_rc_slotmap_check(n->scratch)) {
		fprintf(stderr, "selene: %s\n", sel_errmsg());
		abort();
	}
#endif
	if (rc) {
		set_error(n, "%s", eos_errmsg());
		n->refresh_due = true;
		return;
	}
	if (!n->scratch->assigned) {
		set_error(n, "CLUSTER SLOTS: no slot is assigned (is the cluster created?)");
		n->refresh_due = true;
		return;
	}
	uint16_t map[SEL_RC_NODES_MAX];
	for (uint32_t i = 0; i < n->scratch->n_nodes; i++) {
		int idx = node_get(n, &n->scratch->node[i], false);
		if (idx < 0) {
			set_error(n, "slot map: too many nodes");
			n->refresh_due = true;
			return;
		}
		map[i] = (uint16_t)idx;
	}
	for (uint32_t i = 0; i < n->n_nodes; i++)
		n->node[i]->wanted = false;
	for (uint32_t i = 0; i < n->scratch->n_nodes; i++)
		n->node[map[i]]->wanted = true;
	for (uint32_t s = 0; s < SEL_RC_SLOTS; s++) {
		uint16_t o = n->scratch->owner[s];
		n->slot_node[s] = o == SEL_RC_NO_NODE ? SEL_RC_NO_NODE : map[o];
	}
	n->map_loaded = true;
	atomic_fetch_add_explicit(&n->ctr->map_refreshes, 1, memory_order_relaxed);
	publish_state(n);
}

/* ---- Open, close, run ---------------------------------------------------- */

int sel_rn_open(const struct sel_ru_url *url, const struct sel_rn_opts *o,
		struct sel_rn_counters *counters, struct sel_rn **out)
{
	*out = NULL;
	struct sel_rn *n = calloc(1, sizeof *n);
	if (!n)
		return eos_fail(-ENOMEM, "remote: out of memory");
	n->url = *url;
	n->o = *o;
	if (!n->o.connect_timeout_ns)
		n->o.connect_timeout_ns = 2000000000ull;
	if (!n->o.stall_ns)
		n->o.stall_ns = 3000000000ull;
	if (!n->o.ping_ns)
		n->o.ping_ns = 1000000000ull;
	if (!n->o.backoff_min_ns)
		n->o.backoff_min_ns = 50000000ull;
	if (!n->o.backoff_max_ns)
		n->o.backoff_max_ns = 2000000000ull;
	if (n->o.backoff_max_ns < n->o.backoff_min_ns)
		n->o.backoff_max_ns = n->o.backoff_min_ns;
	n->ctr = counters;
	n->cluster = url->kind == SEL_RU_CLUSTER;
	for (uint32_t s = 0; s < SEL_RC_SLOTS; s++)
		n->slot_node[s] = SEL_RC_NO_NODE;
	n->rbuf = malloc(READ_CHUNK);
	n->scratch = n->cluster ? malloc(sizeof *n->scratch) : NULL;
	if (!n->rbuf || (n->cluster && !n->scratch))
		goto nomem;
	if (url->kind == SEL_RU_UNIX) {
		struct sel_rc_addr a = {.port = 0};
		snprintf(a.host, sizeof a.host, "%s", url->path);
		if (node_get(n, &a, true) < 0)
			goto nomem;
	} else {
		for (uint32_t i = 0; i < url->n; i++)
			if (node_get(n, &url->seed[i], false) < 0)
				goto nomem;
	}
	for (uint32_t i = 0; i < n->n_nodes; i++)
		n->node[i]->wanted = true;
	n->refresh_due = n->cluster;
	publish_state(n);
	*out = n;
	return 0;
nomem:
	sel_rn_close(n);
	return eos_fail(-ENOMEM, "remote: out of memory");
}

static void deliver_failed(struct sel_rn *n)
{
	while (n->failed.head) {
		struct sel_rn_cmd *c = n->failed.head;
		cl_del(&n->failed, c);
		complete(n, c, NULL, c->err);
	}
}

void sel_rn_close(struct sel_rn *n)
{
	if (!n)
		return;
	n->closing = true;
	uint64_t now = eos_now_ns();
	for (uint32_t i = 0; i < n->n_nodes; i++)
		for (int l = 0; l < SEL_RN_LANES; l++) {
			struct sel_rn_conn *k = &n->node[i]->conn[l];
			if (k->ctx || k->q.head)
				conn_kill(k, -ECANCELED, now);
		}
	while (n->delayed.head) {
		struct sel_rn_cmd *c = n->delayed.head;
		cl_del(&n->delayed, c);
		fail_later(n, c, -ECANCELED);
	}
	deliver_failed(n);
	for (uint32_t i = 0; i < n->n_nodes; i++)
		free(n->node[i]);
	free(n->rbuf);
	free(n->scratch);
	free(n);
}

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Is k waiting for the server (a reply due or bytes unsent)? */
static bool busy(const struct sel_rn_conn *k) { return k->q.head != NULL; }

/* When k stalls if nothing moves: no byte read for stall_ns since a reply
 * became due (its command written), or no byte written for stall_ns while
 * bytes wait to go.  Writing more does not keep a silent server alive:
 * the kernel takes bytes a stopped server never reads.  UINT64_MAX when
 * nothing is due. */
static uint64_t stall_at(const struct sel_rn *n, const struct sel_rn_conn *k)
{
	uint64_t at = UINT64_MAX;
	const struct sel_rn_cmd *head = k->q.head;
	if (head && head != k->send) {
		uint64_t since = head->sent_ns > k->rx_ns ? head->sent_ns : k->rx_ns;
		at = since + n->o.stall_ns;
	}
	if (k->send) {
		uint64_t w = k->tx_ns + n->o.stall_ns;
		at = w < at ? w : at;
	}
	return at;
}

int sel_rn_pollfds(struct sel_rn *n, struct pollfd *pfd, int cap, uint64_t *next_ns)
{
	uint64_t next = UINT64_MAX;
	int cnt = 0;
	if (n->failed.head)
		next = 0;
	for (struct sel_rn_cmd *c = n->delayed.head; c; c = c->next)
		next = min64(next, c->retry_ns);
	if (n->cluster && n->refresh_due && !n->refreshing)
		next = min64(next, n->refresh_ns + REFRESH_MIN_NS);
	for (uint32_t i = 0; i < n->n_nodes; i++)
		for (int l = 0; l < SEL_RN_LANES; l++) {
			struct sel_rn_conn *k = &n->node[i]->conn[l];
			switch (k->st) {
			case C_DOWN:
				if (n->node[i]->wanted)
					next = min64(next, k->retry_ns);
				continue;
			case C_CONNECTING:
				next = min64(next, k->since_ns + n->o.connect_timeout_ns);
				break;
			default:
				next = min64(next,
					     busy(k) ? stall_at(n, k) : k->io_ns + n->o.ping_ns);
			}
			if (cnt < cap) {
				pfd[cnt].fd = k->ctx->fd;
				pfd[cnt].events =
					(short)(POLLIN |
						(k->st == C_CONNECTING || k->send ? POLLOUT : 0));
				pfd[cnt].revents = 0;
				n->pconn[cnt] = k;
				n->pgen[cnt] = k->gen;
				cnt++;
			}
		}
	n->npoll = cnt;
	*next_ns = next;
	return cnt;
}

void sel_rn_run(struct sel_rn *n, const struct pollfd *pfd, int nfds, uint64_t now)
{
	uint64_t t = eos_now_ns();
	if (t > now)
		now = t;
	/* Poll results first: the connections they name are still the ones
	 * sel_rn_pollfds saw (nothing ran in between). */
	for (int i = 0; i < nfds && i < n->npoll; i++) {
		struct sel_rn_conn *k = n->pconn[i];
		short ev = pfd[i].revents;
		if (!ev || !k->ctx || n->pgen[i] != k->gen)
			continue;
		if (k->st == C_CONNECTING) {
			if (ev & (POLLOUT | POLLERR | POLLHUP))
				connected(k, now);
			continue;
		}
		if (ev & (POLLIN | POLLERR | POLLHUP))
			conn_read(k, now);
		if (k->ctx && (ev & POLLOUT))
			conn_write(k, now);
	}
	n->npoll = 0;
	/* Timers. */
	for (uint32_t i = 0; i < n->n_nodes; i++)
		for (int l = 0; l < SEL_RN_LANES; l++) {
			struct sel_rn_conn *k = &n->node[i]->conn[l];
			switch (k->st) {
			case C_DOWN:
				if (n->node[i]->wanted && now >= k->retry_ns && !n->closing)
					conn_connect(k, now);
				break;
			case C_CONNECTING:
				if (elapsed(now, k->since_ns, n->o.connect_timeout_ns)) {
					char t[SEL_RC_HOST_MAX + 16];
					set_error(n, "connect to %s: timed out",
						  node_text(k->node, t, sizeof t));
					atomic_fetch_add_explicit(&n->ctr->connect_failures, 1,
								  memory_order_relaxed);
					conn_kill(k, -ETIMEDOUT, now);
				}
				break;
			default:
				if (busy(k) && now >= stall_at(n, k)) {
					char t[SEL_RC_HOST_MAX + 16];
					set_error(n, "%s: no answer for %llu ms",
						  node_text(k->node, t, sizeof t),
						  (unsigned long long)(n->o.stall_ns / 1000000));
					atomic_fetch_add_explicit(&n->ctr->stalls, 1,
								  memory_order_relaxed);
					conn_kill(k, -ETIMEDOUT, now);
				} else if (!busy(k) && k->st == C_READY &&
					   elapsed(now, k->io_ns, n->o.ping_ns)) {
					static const char *ping[] = {"PING"};
					struct sel_rn_cmd *c =
						internal_cmd(1, ping, NULL, NULL, NULL);
					if (c) {
						c->rtt = l == SEL_RN_FAST;
						n->inflight++;
						enqueue(k, c, false);
						k->io_ns = now;
					}
				}
			}
		}
	for (struct sel_rn_cmd *c = n->delayed.head, *next; c; c = next) {
		next = c->next;
		if (c->retry_ns <= now) {
			cl_del(&n->delayed, c);
			route_to(n, c, pick(n, c, now), now);
		}
	}
	if (n->cluster && n->refresh_due && !n->refreshing &&
	    (!n->refresh_ns || elapsed(now, n->refresh_ns, REFRESH_MIN_NS)))
		refresh(n, now);
	deliver_failed(n);
	/* Write what the replies and timers queued. */
	for (uint32_t i = 0; i < n->n_nodes; i++)
		for (int l = 0; l < SEL_RN_LANES; l++)
			conn_write(&n->node[i]->conn[l], now);
	deliver_failed(n);
#if defined(SEL_SANITIZED) || defined(SEL_DEBUG_CHECKS)
	/* The checker after every run in the sanitizer builds (STYLE.md 9). */
	if (sel_rn_check(n)) {
		fprintf(stderr, "selene: %s\n", sel_errmsg());
		abort();
	}
#endif
}

uint64_t sel_rn_inflight(const struct sel_rn *n) { return n->inflight; }

void sel_rn_describe(const struct sel_rn *n, char *buf, size_t len)
{
	size_t at = 0;
	buf[0] = '\0';
	for (uint32_t i = 0; i < n->n_nodes && at + 1 < len; i++) {
		if (!n->node[i]->wanted)
			continue;
		char t[SEL_RC_HOST_MAX + 16];
		int w = snprintf(buf + at, len - at, "%s%s", at ? "," : "",
				 node_text(n->node[i], t, sizeof t));
		if (w < 0)
			break;
		at += (size_t)w;
	}
}

const char *sel_rn_last_error(const struct sel_rn *n, uint64_t *count)
{
	if (count)
		*count = n->errors;
	return n->last_error;
}

int sel_rn_check(const struct sel_rn *n)
{
	uint64_t total = n->failed.n + n->delayed.n;
	for (uint32_t i = 0; i < n->n_nodes; i++)
		for (int l = 0; l < SEL_RN_LANES; l++) {
			const struct sel_rn_conn *k = &n->node[i]->conn[l];
			uint32_t cnt = 0;
			bool after_send = false;
			if (k->st == C_DOWN && (k->ctx || k->q.head))
				return eos_fail(-EINVAL,
						"remote net: a down connection holds commands");
			for (const struct sel_rn_cmd *c = k->q.head; c; c = c->next) {
				cnt++;
				if (c == k->send)
					after_send = true;
				if (c->on != k)
					return eos_fail(-EINVAL,
							"remote net: a command on the wrong queue");
				if (!after_send && c->sent != cmd_total(c))
					return eos_fail(-EINVAL,
							"remote net: a command before send is "
							"not written");
				if (after_send && c != k->send && c->sent)
					return eos_fail(-EINVAL,
							"remote net: a command after send is "
							"partly written");
			}
			if (k->send && !after_send)
				return eos_fail(-EINVAL, "remote net: send is not in its queue");
			if (cnt != k->q.n)
				return eos_fail(-EINVAL, "remote net: queue count %u, %u linked",
						k->q.n, cnt);
			total += cnt;
		}
	if (total != n->inflight)
		return eos_fail(-EINVAL, "remote net: %llu commands in lists, %llu in flight",
				(unsigned long long)total, (unsigned long long)n->inflight);
	return 0;
}
