/*
 * remote_client.h - the remote tier's client: records on Redis (one server
 * or a cluster), shared by the hosts of a deployment (issue 16; design
 * 2.15's lookups with a grace period, restore deadlines and one source;
 * design 2.3's bucket map; docs/remote.md).
 *
 * What it does: put a record (its windows, then its manifest, then its
 * bucket entry), look up the deepest record chain matching a request's
 * history, and claim a looked-up chain into host buffers with every page
 * and the row verified.  The pooled store (issue 15) will make it the last
 * level of its cascade; this header is what that level calls.
 *
 * THREADS
 *   One I/O thread per client does every network operation, every hash and
 *   every copy.  The calls below are for one caller thread at a time (the
 *   model worker); they never wait for the network, for the I/O thread or
 *   for a lock the I/O thread holds while doing I/O: submissions take a
 *   mutex that guards only two list links and a counter, and return at
 *   once.  Results come back through sel_remote_poll; sel_remote_wait_fd
 *   becomes readable when there is something to poll.  sel_remote_stats,
 *   sel_remote_rtt_ns and sel_remote_grace_ns may be called from any
 *   thread.  Only open and close block (close for at most its deadline).
 *
 * OPERATIONS AND EVENTS
 *   Each submission that returns 0 produces exactly one event, carrying the
 *   op id it returned and the caller's cookie; one that fails produces
 *   none and changes nothing.  Queues are bounded: an op holds its queue
 *   slot from submission until its event has been polled.
 *
 *   sel_remote_put      windows (each at most 4 MiB), the manifest, the
 *                       bucket entry, skipping a record already complete
 *                       on Redis (result SEL_REMOTE_PRESENT).  The page
 *                       buffers and row pieces are read by the I/O thread
 *                       and must stay valid and unchanged until the put's
 *                       event.  Deadline: 10 s + bytes at 8 MiB/s from
 *                       when the put starts.
 *   sel_remote_lookup   pipelined SMEMBERS of the buckets at the history's
 *                       aligned 64-token boundaries from the limit down to
 *                       the resident count, the candidates' manifests, the
 *                       chain's keys compared with the history's key at
 *                       every node, EXISTS of every window the restore
 *                       needs.  The history is copied (its new tokens) at
 *                       submission.  A hit hands a sel_remote_hit to the
 *                       caller.  Deadline: lookup_timeout_ns.
 *   sel_remote_claim    the hit's windows into caller buffers, every page
 *                       and the row checked against the manifest's
 *                       checksums before the event.  The buffers belong to
 *                       the client until the event; on failure their
 *                       contents are undefined but nothing writes them
 *                       after the event.  Deadline (design 2.15): 10 s +
 *                       the window bytes at 8 MiB/s.
 *
 * ERRORS (event.error; 0 on success)
 *   -ENOTCONN, -ECONNRESET   the server (or the slot's node) is down or the
 *                            connection broke; reconnection is automatic
 *   -ETIMEDOUT               the op's deadline passed (a stalled server)
 *   -ECANCELED               the client closed before the op ran
 *   -ENOENT                  claim: a window or manifest is gone (evicted,
 *                            expired, Redis restarted): a miss, never partial
 *   -EBADMSG                 a value failed authentication (counted)
 *   SEL_ECORRUPT, SEL_EFORMAT a value or page failed its checksum or
 *                            structure (counted)
 *                            After either, the record's manifest is
 *                            deleted from Redis, so it is no longer found
 *                            and its next put writes it again.
 *   -ESTALE                  claim: the record was rewritten since lookup
 *   -EREMOTEIO               Redis refused a command (its message is in
 *                            sel_remote_last_error: OOM, READONLY, ...)
 *   -ELOOP                   cluster redirects did not settle
 *   A lookup that fails is a miss: result 0 and the error.
 */
#ifndef SEL_REMOTE_CLIENT_H
#define SEL_REMOTE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "record.h"
#include "remote_conn.h"

typedef struct sel_remote sel_remote;

struct sel_remote_config {
	const char *url;            /* sel_ru_parse's forms */
	const sel_record_ns *ns;    /* the namespace; must outlive the client */
	const uint8_t *key;         /* 32-byte secret (sel_rv_key_load), or NULL */
	bool encrypt;               /* XChaCha20-Poly1305 values; needs key */
	uint64_t max_age_ns;        /* EXPIRE of every key; 0 = none */
	uint32_t put_queue;         /* puts queued or running; 0 = 32 */
	uint32_t lookup_queue;      /* 0 = 64 */
	uint32_t claim_queue;       /* 0 = 8 */
	uint32_t window_bytes;      /* window payload bytes; 0 = 4 MiB - 4 KiB (tests: less) */
	uint64_t lookup_timeout_ns; /* 0 = 1 s */
	uint64_t restore_setup_ns;  /* 0 = 10 s (design 2.15) */
	uint64_t restore_rate_bps;  /* 0 = 8 MiB/s (design 2.15) */
	uint32_t max_buckets;       /* buckets one lookup probes; 0 = 4096 */
	uint32_t put_windows;       /* window SETs in flight, all puts; 0 = 3 (at most 3:
					 one per bulk connection) */
	uint32_t claim_windows;     /* window GETs in flight, all claims; 0 = 2 */
	struct sel_rn_opts net;     /* connect timeout, stall, ping, backoff */
};

/* Open a client and start its I/O thread; the first connections are made
 * in the background (open does not wait for Redis).  Errors: SEL_EFORMAT
 * (the URL), -EINVAL (a missing namespace, encryption without a key, a
 * window size outside 4 KiB..4 MiB - 4 KiB), -ENOMEM, or pthread's error,
 * with a message naming the setting. */
int sel_remote_open(const struct sel_remote_config *cfg, sel_remote **out);

/* ---- Put ---------------------------------------------------------------- */

struct sel_remote_put {
	sel_record_desc d;       /* key, parent, bucket, tail, flags */
	bool has_row;            /* store the row (an endpoint); page-only otherwise */
	void *const *pages;      /* d.tail stored page records, page_stride bytes each;
				  * the I/O thread zeroes their padding (record
				  * version 4) before sending: the caller's own,
				  * untouched by others until the put's event */
	const struct iovec *row; /* the stored rows' bytes in file order (sel_record_row_iov) */
	uint32_t row_n;
	uint64_t created_ns; /* record creation time; 0 = now */
	uint64_t user;       /* echoed in the event */
};
/* Queue a put.  0 with *id; -EAGAIN when the put queue is full (counted
 * as skipped; retry later or drop it: nothing waits); -EINVAL (a desc the
 * record format refuses, missing buffers, row pieces that do not add up);
 * SEL_EOVERSIZE (more windows or checksums than one record may have);
 * SEL_ESTOPPED after close. */
int sel_remote_put(sel_remote *r, const struct sel_remote_put *p, uint64_t *id);

/* ---- Lookup and claim --------------------------------------------------- */

/* One record of a hit's chain, ascending. */
struct sel_remote_node {
	sel_key key;
	uint32_t flags;  /* SEL_RECORD_*_REPLICATED */
	uint32_t tail;   /* stored page records */
	uint32_t skip;   /* of them, already resident on the GPU */
	uint64_t stride; /* bytes of one stored page record */
};

typedef struct sel_remote_hit {
	sel_key key;         /* the endpoint */
	uint64_t resident;   /* the resident count the lookup was made for */
	uint32_t pages;      /* page buffers a claim needs: sum of tail - skip */
	uint64_t row_bytes;  /* the endpoint's stored rows (sel_rv_row_bytes) */
	uint32_t flags;      /* the endpoint's flags */
	uint64_t bytes;      /* bytes the claim restores (pages and row) */
	uint64_t wire_bytes; /* value bytes the claim reads */
	uint32_t n_nodes;
	struct sel_remote_node *node; /* [n_nodes], ascending; the last is the endpoint */
	void *priv;
} sel_remote_hit;

/* Free a hit (NULL-safe); a claimed hit is the client's. */
void sel_remote_hit_free(sel_remote_hit *h);

/* Look up the deepest chain for h with consumed in (resident, limit]
 * (limit <= the history's length).  0 with *id; -EAGAIN (lookup queue
 * full: a miss), -EINVAL, -ENOMEM, SEL_ESTOPPED. */
int sel_remote_lookup(sel_remote *r, const sel_history *h, uint64_t resident, uint64_t limit,
		      uint64_t user, uint64_t *id);

/* Where a claim lands: hit->pages page buffers in chain order (node 0's
 * pages skip..tail-1, then node 1's, ...), each holding its node's stride
 * bytes; the endpoint's stored rows as pieces in file order summing to
 * hit->row_bytes. */
struct sel_remote_dest {
	void *const *pages;
	uint32_t n_pages;
	const struct iovec *row;
	uint32_t row_n;
};
/* Claim hit into dest; the client takes the hit (freed after the event,
 * also when this call fails).  0 with *id; -EAGAIN (claim queue full),
 * -EINVAL (dest does not match the hit), SEL_ESTOPPED. */
int sel_remote_claim(sel_remote *r, sel_remote_hit *hit, const struct sel_remote_dest *dest,
		     uint64_t user, uint64_t *id);

/* The manifest's page checksums of the n pages just below hit->resident
 * (overlapped restores, issue 18): the version-4 page checksum, which is
 * sel_page_digest_padded of the planes (remote_put.c invariant 3).  The
 * manifest was verified at lookup.  -ENOTSUP when those pages are not all
 * in the hit's first record (or, for a rebased hit, in the records of the
 * hit it came from), or it is replicated or older than version 4;
 * -EINVAL without a hit.  Call before the hit is claimed. */
int sel_remote_hit_head_sums(const sel_remote_hit *hit, uint32_t n, uint64_t *out);

/* The same hit for a higher resident count (an overlapped restore's tail,
 * issue 18), with no round trip: a new hit (the caller's) whose chain is
 * hit's nodes above resident, with the same manifests (copied: the claim
 * checks the windows against them and their generations, so a record
 * rewritten on Redis since the lookup fails the claim) and skips for
 * resident; its head sums also give the pages between hit's resident and
 * resident from hit's other manifests.  resident in [hit->resident,
 * hit->key.consumed), else -EINVAL; -ENOMEM.  hit is unchanged. */
int sel_remote_hit_rebase(const sel_remote *r, const sel_remote_hit *hit, uint64_t resident,
			  sel_remote_hit **out);

/* ---- Events ------------------------------------------------------------- */

enum sel_remote_op {
	SEL_REMOTE_OP_PUT = 1,
	SEL_REMOTE_OP_LOOKUP = 2,
	SEL_REMOTE_OP_CLAIM = 3,
};
enum sel_remote_result {
	SEL_REMOTE_FAILED = 0,  /* error says why; a lookup: a miss */
	SEL_REMOTE_STORED = 1,  /* put: written */
	SEL_REMOTE_PRESENT = 2, /* put: already complete on Redis, nothing written */
	SEL_REMOTE_HIT = 3,     /* lookup: hit is set */
	SEL_REMOTE_MISS = 4,    /* lookup: nothing usable (error 0) */
	SEL_REMOTE_CLAIMED = 5, /* claim: the buffers hold verified bytes */
};
struct sel_remote_event {
	enum sel_remote_op op;
	enum sel_remote_result result;
	int error;
	uint64_t id, user;
	sel_key key;          /* put, claim: the record; lookup hit: the endpoint */
	sel_remote_hit *hit;  /* lookup hit: the caller's now */
	uint64_t bytes;       /* put: payload written; claim: bytes restored */
	uint64_t duration_ns; /* submission to event */
};
/* Up to cap events; never blocks.  Returns the count. */
int sel_remote_poll(sel_remote *r, struct sel_remote_event *ev, size_t cap);
/* An eventfd, readable while events wait. */
int sel_remote_wait_fd(sel_remote *r);

/* ---- Stats -------------------------------------------------------------- */

#define SEL_REMOTE_RTT_BUCKETS SEL_RN_RTT_BUCKETS
struct sel_remote_stats {
	uint64_t lookups, hits, lookup_errors, lookups_refused; /* refused: queue full */
	uint64_t puts, stored, present, put_failures, skipped;  /* skipped: queue full */
	uint64_t claims, claimed, claim_failures, claims_refused;
	uint64_t bytes_in;  /* restored by claims (pages and rows) */
	uint64_t bytes_out; /* written by puts (payload of windows) */
	uint64_t wire_in, wire_out;
	uint64_t auth_failures; /* values refused by their MAC / AEAD, or unauthenticated */
	uint64_t corrupt;       /* values or pages refused by checksums or structure */
	uint64_t dropped;       /* records deleted from Redis after such a refusal */
	uint64_t moved, ask, tryagain;
	uint64_t reconnects, connect_failures, stalls, map_refreshes;
	uint32_t nodes, nodes_up;
	enum sel_rn_state state;
	uint64_t rtt_ns;   /* median of the last 16 round trips; 0 = none yet */
	uint64_t grace_ns; /* sel_remote_grace_ns */
	uint64_t rtt_hist[SEL_REMOTE_RTT_BUCKETS]; /* bucket i: <= 16 us << i; last: above */
	uint64_t rtt_sum_ns;                       /* of the round trips in rtt_hist */
	uint64_t queued_puts, queued_lookups, queued_claims;
};
void sel_remote_stats(sel_remote *r, struct sel_remote_stats *out);
/* The measured round trip (median of the last 16, 0 before the first). */
uint64_t sel_remote_rtt_ns(sel_remote *r);
/* Lookup grace period (design 2.15): four measured round trips, bounded to
 * 2..250 ms; 250 ms before the first measurement. */
uint64_t sel_remote_grace_ns(sel_remote *r);
/* Connection state name: "connecting", "up", "degraded", "down". */
const char *sel_remote_state_name(enum sel_rn_state s);
/* The nodes (for the startup line) and the last connection or server
 * error ("" when none); copies, callable from any thread. */
void sel_remote_describe(sel_remote *r, char *buf, size_t len);
void sel_remote_last_error(sel_remote *r, char *buf, size_t len);
/* The restore deadline for bytes (design 2.15): setup + bytes / rate. */
uint64_t sel_remote_claim_budget_ns(const sel_remote *r, uint64_t bytes);

/* ---- Close -------------------------------------------------------------- */

/* Stop: new submissions fail with SEL_ESTOPPED; queued lookups and claims
 * end with -ECANCELED at once; queued and running puts go on until
 * deadline_ns (monotonic; 0 = until done) and then end with -ETIMEDOUT;
 * the I/O thread is joined.  Every op has its event when close returns
 * (poll them).  0 when every put finished, -ETIMEDOUT when some did not. */
int sel_remote_close(sel_remote *r, uint64_t deadline_ns);
/* Free everything (after close; calls close with no deadline if needed).
 * Hits handed out stay the caller's.  NULL-safe. */
void sel_remote_destroy(sel_remote *r);

#endif
