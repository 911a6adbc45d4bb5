/*
 * remote_conn.h - the remote tier's network (issue 16): connections to one
 * Redis server or to every master of a cluster, pipelined commands,
 * cluster slot routing with MOVED / ASK / TRYAGAIN, slot map refresh,
 * reconnects with backoff, stall detection and round-trip measurement.
 *
 * THREADS: every call below runs on the remote client's I/O thread
 * (remote_client.c), the only thread that touches a struct sel_rn.  No call
 * blocks except sel_rn_open's host resolution for names that are not
 * addresses (connections are non-blocking; the thread sleeps in poll()).
 *
 * COMMANDS: a command is submitted once and completes exactly once through
 * its done callback, always from sel_rn_run or sel_rn_close (never from
 * inside sel_rn_submit), with the reply (owned by the network, freed when
 * done returns) or an error:
 *   -ENOTCONN    its node is down (reconnecting after a backoff)
 *   -ECONNRESET  the connection broke (EOF, reset, write error)
 *   -ETIMEDOUT   the connection stalled (no progress for stall_ns) or did
 *                not connect within connect_timeout_ns
 *   -EPROTO      the server sent what RESP does not allow
 *   -ELOOP       more than 5 redirects, or TRYAGAIN for more than 2 s
 *   -EHOSTUNREACH a redirect to a node without an endpoint
 *   -ECANCELED   *cancel was set before its first byte was written, or
 *                the network closed
 * Error replies other than redirects (and TRYAGAIN) reach done as replies
 * of type REDIS_REPLY_ERROR.  done may submit further commands.
 *
 * Internal to libselene.
 */
#ifndef SEL_REMOTE_CONN_H
#define SEL_REMOTE_CONN_H

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <hiredis/hiredis.h>

#include "remote_url.h"

/* Connections per node.  Redis serves big values best one per connection
 * at a time (a pipeline of 4 MiB SETs on one connection is several times
 * slower than the same SETs on as many connections), so puts spread their
 * windows over a few bulk connections, one window each. */
enum sel_rn_lane {
	SEL_RN_FAST = 0, /* lookups, claims, pings: small requests, latency */
	SEL_RN_BULK = 1, /* puts, first of SEL_RN_BULK_LANES: never ahead of a lookup */
	SEL_RN_BULK_LANES = 3,
	SEL_RN_LANES = 1 + SEL_RN_BULK_LANES,
};

#define SEL_RN_RTT_BUCKETS 20 /* bucket i: round trips up to 2^i * 16 us; the last: above */

/* Connection state of the whole network (sel_rn_counters.state). */
enum sel_rn_state {
	SEL_RN_CONNECTING = 0, /* no node has answered yet */
	SEL_RN_UP = 1,         /* every known node answers */
	SEL_RN_DEGRADED = 2,   /* some do */
	SEL_RN_DOWN = 3,       /* none does */
};

/* Counters the network keeps for the client's stats; read from any thread. */
struct sel_rn_counters {
	_Atomic uint64_t wire_in, wire_out; /* bytes received and sent */
	_Atomic uint64_t moved, ask, tryagain;
	_Atomic uint64_t reconnects, connect_failures, stalls;
	_Atomic uint64_t map_refreshes;
	_Atomic uint64_t rtt_ns; /* median of the last 16 samples; 0 = none yet */
	_Atomic uint64_t rtt_hist[SEL_RN_RTT_BUCKETS];
	_Atomic uint64_t rtt_sum_ns; /* of every round trip in rtt_hist */
	_Atomic uint32_t nodes, nodes_up, state;
};

struct sel_rn_opts {
	uint64_t connect_timeout_ns; /* 0 = 2 s */
	uint64_t stall_ns;           /* 0 = 3 s: no byte moved while a reply is due */
	uint64_t ping_ns;            /* 0 = 1 s: PING an idle connection */
	uint64_t backoff_min_ns;     /* 0 = 50 ms: first reconnect delay, doubling */
	uint64_t backoff_max_ns;     /* 0 = 2 s */
};

struct sel_rn;
struct sel_rn_cmd;
typedef void (*sel_rn_done_fn)(struct sel_rn_cmd *c, redisReply *reply, int err);

struct sel_rn_cmd {
	/* Set by the submitter. */
	sel_rn_done_fn done;
	void *owner;
	uint64_t tag;
	const bool *cancel; /* may be NULL */
	int32_t slot;       /* the key's slot, or -1: any node */
	enum sel_rn_lane lane;
	bool rtt; /* a round-trip sample (small command on the fast lane) */
	/* Owned by the network from submission to done. */
	struct sel_rn_cmd *prev, *next;
	char *buf;
	size_t len;        /* bytes of the command (without ASKING) */
	struct iovec *seg; /* the command as segments, or NULL: buf[0..len) */
	uint32_t nseg;
	void (*free_buf)(void *ctx, char *buf);
	void *free_ctx;
	struct sel_rn_conn *on;
	int err; /* set when failed before done */
	uint32_t redirects, tries;
	bool asking, internal;
	uint8_t replies; /* replies still expected: 1, or 2 after ASKING */
	size_t sent;     /* bytes written, ASKING prefix included */
	uint64_t sent_ns, first_ns, retry_ns;
	redisReply *pending; /* ASKING's reply kept until the command's */
};

/* A command from arguments, formatted by hiredis.  NULL when out of memory. */
struct sel_rn_cmd *sel_rn_cmd_argv(int argc, const char **argv, const size_t *argvlen);
/* A command whose RESP bytes the caller formatted into buf[0..len) (a
 * value too large to copy again); free_buf(ctx, buf) releases it after
 * done (NULL: free()).  NULL when out of memory (buf is then released). */
struct sel_rn_cmd *sel_rn_cmd_raw(char *buf, size_t len, void (*free_buf)(void *, char *),
				  void *ctx);
/* A command of segments seg[0..nseg) (a malloc'd array the command takes)
 * in order; buf (may be NULL) holds the bytes of any segment the command
 * owns and is released as for sel_rn_cmd_raw.  Segments that point
 * elsewhere are read until the command is written completely: see
 * sel_rn_cmd_detach.  NULL when out of memory (seg and buf released). */
struct sel_rn_cmd *sel_rn_cmd_segs(struct iovec *seg, uint32_t nseg, char *buf,
				   void (*free_buf)(void *, char *), void *ctx);
/* Make c stop reading memory it does not own: a command not yet written
 * completely gets its bytes copied into a buffer of its own (a command not
 * started is left alone if its *cancel is set: it will not be written).
 * On a copy that fails for memory, c's connection is closed (its commands
 * fail) instead.  Call it from done of another command or from the I/O
 * thread's own code, never with c completed. */
void sel_rn_cmd_detach(struct sel_rn *n, struct sel_rn_cmd *c);

struct sel_rn;

/* A libhiredis reader whose replies are bounded (at most 2^20 elements, a
 * string of at most 64 MiB): a reply beyond is a reader error, not an
 * allocation hiredis 0.14 would abort on.  Every connection reads with
 * these builders; tests and the fuzz target use this reader. */
redisReader *sel_rn_reader_create(void);
/* Give a connection's existing reader the same bounded builders. */
void sel_rn_reader_bound(redisReader *r);
/* The bounds its builders keep (remote_resp.c): elements of a multi-bulk
 * reply and bytes of one string; more is a reader error. */
#define SEL_RN_REPLY_ELEMENTS_MAX (1 << 20)
#define SEL_RN_REPLY_STRING_MAX (64u << 20)

/* Open the network for url: nothing is sent yet; connections start at the
 * first sel_rn_run.  counters must outlive it.  0, -ENOMEM. */
int sel_rn_open(const struct sel_ru_url *url, const struct sel_rn_opts *o,
		struct sel_rn_counters *counters, struct sel_rn **out);
/* Fail every command with -ECANCELED (done is called), close every
 * connection, free.  NULL-safe. */
void sel_rn_close(struct sel_rn *n);

/* Queue c (the slot routes it in a cluster; -1 and one server: any node).
 * Never calls done; a node that is down fails c at the next sel_rn_run. */
void sel_rn_submit(struct sel_rn *n, struct sel_rn_cmd *c);

/* The descriptors to poll (at most cap) and the earliest timer (monotonic
 * ns, UINT64_MAX when none).  Returns the count. */
int sel_rn_pollfds(struct sel_rn *n, struct pollfd *pfd, int cap, uint64_t *next_ns);
/* Handle the poll results for the descriptors sel_rn_pollfds gave (pfd may
 * be NULL with nfds 0 to run timers and writes only): read replies and
 * complete their commands, write what is queued, connect, reconnect,
 * time out, ping, refresh the slot map. */
void sel_rn_run(struct sel_rn *n, const struct pollfd *pfd, int nfds, uint64_t now);

/* Commands queued or in flight anywhere. */
uint64_t sel_rn_inflight(const struct sel_rn *n);
/* "127.0.0.1:6379", "unix:/path", or the masters of a cluster, comma
 * separated (up to len bytes). */
void sel_rn_describe(const struct sel_rn *n, char *buf, size_t len);
/* The last connection or server error, "" when none; *count (may be
 * NULL) receives how many errors were set so far. */
const char *sel_rn_last_error(const struct sel_rn *n, uint64_t *count);
/* Invariants: queues consistent, counts balance.  0 or -EINVAL with a
 * message. */
int sel_rn_check(const struct sel_rn *n);

#endif
