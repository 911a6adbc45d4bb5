/*
 * shard_link.h - the rank links of a multi-host core: rank zero's link set
 * to every peer and a peer's link to rank zero (design 2.14; frames in
 * shard_proto.h; docs/multihost.md is the reference).
 *
 * Internal to libselene.  Part B's sharded transport and the peers' record
 * service sit on these calls.
 *
 * SECURITY.  The links are plaintext TCP with no authentication beyond the
 * join checks below; anyone who can reach the listener or sit on the path
 * can read every job and, on the path, forge frames.  Run them only on a
 * trusted fabric (the same one the ranks' tensor-parallel traffic uses), as
 * design 2.14 assumes.  What the join does check: the connection must come
 * from the address of that rank's rendezvous peer and present the 16-byte
 * random nonce rank zero sent over that rendezvous connection (compared in
 * constant time, used once), and the peer's world size, rank, offload
 * identity, layout fingerprint and settings must be the ones rank zero
 * expects.  Every frame is decoded strictly (shard_proto.h): lengths, ids,
 * page ids, slots and names out of range are refused and end the link.
 *
 * RANK ZERO (sel_shard_set)
 *   startup, one thread, each call blocking up to its deadline:
 *     sel_shard_open        listener (wildcard address unless configured)
 *     sel_shard_hello       for each peer: the HELLO frame for its
 *                           rendezvous connection (the caller sends it)
 *     sel_shard_join        accept every peer's JOIN, refusing forgeries
 *     sel_shard_agreement   gather the peers' scan summaries, decide
 *                           (shard_agree.h), send each its actions, wait
 *                           until every peer applied them
 *     sel_shard_start       writer threads and the reader thread
 *   serving, the model worker only; no call waits (mutex held by other
 *   threads only to link and unlink, never across I/O):
 *     sel_shard_submit, sel_shard_cleanup, sel_shard_poll, sel_shard_wait_fd,
 *     sel_shard_stopped, sel_shard_stats, sel_shard_check
 *   shutdown, the worker's thread once it stopped submitting:
 *     sel_shard_close (blocks up to its deadline), sel_shard_destroy
 *
 * Jobs.  A submission encodes the job once and links it onto the bounded
 * queue of every addressed peer's writer thread; a queue already full (its
 * peer is not reading) fails the submission at once with -EAGAIN and
 * produces no completion, so the worker never waits for a peer.  A job
 * completes when every addressed peer reported it; its completion comes
 * back through sel_shard_poll (the eventfd of sel_shard_wait_fd is readable
 * while one waits).
 *
 * Partial stores.  When some peers committed a STORE and another failed,
 * the set unlinks the file from the peers that wrote it before it reports
 * the store (done.cleaned, done.cleanup_failed; a cleanup unlink that fails
 * is reported in the store's own status text).  When the store failed on
 * rank zero itself while peers committed, the caller removes theirs with
 * sel_shard_cleanup before it reports the failure.
 *
 * Stopping.  A link that fails (connection reset, closed, a frame that does
 * not decode, an ERROR from the peer, a completion for a job it was never
 * sent) or a job not completed by every addressed peer within the job
 * timeout stops the set: from then on no submission is accepted
 * (SEL_ESTOPPED) and no completion is reported for any job outstanding,
 * because the peer may still be copying into that job's page ids and state
 * slot: reporting it as failed would hand those ids back to the scheduler's
 * free lists under a running copy.  The caller must stop its worker and
 * keep those ids.  Before the stop is reported the set waits (up to the job
 * timeout) for the surviving peers' outstanding jobs and unlinks every
 * store they committed, so no surviving rank keeps a record rank zero never
 * reported.  Then sel_shard_poll returns SEL_ESTOPPED (after any completion
 * that finished before the stop) and sel_shard_stopped gives the reason.
 *
 * PEER (sel_shard_peer)
 *   sel_shard_peer_join, sel_shard_peer_agreement, sel_shard_peer_applied,
 *   then sel_shard_peer_serve: one thread, blocking; sel_shard_peer_complete
 *   from any thread.  The peer keeps its transport (the ops' resources)
 *   until serve returns: after rank zero drained every rank and closed, or
 *   after the connection ended and the ops drained.
 */
#ifndef SEL_SHARD_LINK_H
#define SEL_SHARD_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "eos.h"
#include "shard_agree.h"
#include "shard_proto.h"

typedef struct sel_shard_set sel_shard_set;
typedef struct sel_shard_peer sel_shard_peer;

#define SEL_SHARD_QUEUE_JOBS 256u           /* frames queued per peer */
#define SEL_SHARD_QUEUE_BYTES (16ull << 20) /* bytes queued per peer */
#define SEL_SHARD_JOB_TIMEOUT_NS (60ull * 1000000000ull)
#define SEL_SHARD_HANDSHAKE_NS (10ull * 1000000000ull)
#define SEL_SHARD_DRAIN_MS 30000u

/* ---- rank zero ----------------------------------------------------------- */

struct sel_shard_config {
	uint32_t world;                       /* ranks, rank zero included: 2..64 */
	uint32_t page_tokens;                 /* the layout's (agreement rule 3) */
	uint8_t identity[SEL_IDENTITY_BYTES]; /* the offload identity every rank must have */
	/* The layout fingerprint each rank must present (design 2.14: it covers
	 * that rank's geometry, its rank and the world size); [0] is rank
	 * zero's own, sent in HELLO for the peers to compare. */
	uint8_t fingerprint[SEL_SHARD_WORLD_MAX][SEL_FINGERPRINT_BYTES];
	struct sel_shard_settings set; /* rank zero's: every peer must match .disk */
	/* The listener: NULL binds the wildcard address (IPv6 dual-stack, else
	 * IPv4) and each HELLO names the local address of that peer's rendezvous
	 * connection; a numeric address binds that address only, and HELLO
	 * names it.  Port 0: an ephemeral port (sel_shard_port). */
	const char *listen_addr;
	uint16_t listen_port;
	uint32_t queue_jobs;     /* 0 = SEL_SHARD_QUEUE_JOBS */
	uint64_t queue_bytes;    /* 0 = SEL_SHARD_QUEUE_BYTES */
	uint64_t job_timeout_ns; /* 0 = SEL_SHARD_JOB_TIMEOUT_NS */
	uint64_t handshake_ns;   /* a joining connection's time to send JOIN; 0 = 10 s */
	uint32_t drain_ms;       /* what DRAIN allows a peer; 0 = SEL_SHARD_DRAIN_MS */
	uint32_t max_scan;       /* entries of one peer's summary; 0 = SEL_SHARD_MAX_SCAN */
	int sock_buf;            /* SO_SNDBUF and SO_RCVBUF of the links; 0 = the system's */
};

/* Validate cfg and open the listener: 0, -EINVAL (config), or the socket
 * error, with a message. */
int sel_shard_open(const struct sel_shard_config *cfg, sel_shard_set **out);
/* The listener's port. */
uint16_t sel_shard_port(const sel_shard_set *s);

/* The HELLO frame for peer `rank` (1..world-1) into buf[0..cap): a fresh
 * nonce, the address this rendezvous connection uses on rank zero (or the
 * configured listen address) and the listener's port.  rendezvous_fd is the
 * connected rendezvous socket of that rank: its remote address is the only
 * one rank's JOIN is accepted from.  Returns the frame's length, or
 * -EINVAL (rank, not a connected socket, joined already), -ENOBUFS. */
int sel_shard_hello(sel_shard_set *s, uint32_t rank, int rendezvous_fd, void *buf, size_t cap);

/* Accept one JOIN per peer until every peer joined or deadline_ns
 * (monotonic).  A connection whose JOIN names a rank out of range, has
 * another nonce, comes from another address than that rank's rendezvous
 * peer, names a rank that joined already, or sends no JOIN within the
 * handshake time is refused (an ERROR frame, then closed, counted in
 * sel_shard_stats.refused_joins, the reason in sel_shard_refusal) and the
 * join goes on waiting for the real peer.  A JOIN that passes those checks
 * but disagrees -- world size, identity (SEL_EIDENTITY), fingerprint
 * (SEL_ELAYOUT), a disk store on one rank and not another (-EINVAL) --
 * fails the join at once with a message naming the rank and both values,
 * and every joined peer is told (ERROR).  When every peer joined, each gets
 * ACCEPT with the agreed disk limit (the smallest rank's).  0, one of the
 * errors above, -ETIMEDOUT (naming the ranks missing and the last refusal),
 * or a socket error. */
int sel_shard_join(sel_shard_set *s, uint64_t deadline_ns);
/* The last refused join's reason ("" when none). */
const char *sel_shard_refusal(const sel_shard_set *s);
/* The agreed disk limit (after sel_shard_join; 0 without disk stores). */
uint64_t sel_shard_disk_limit(const sel_shard_set *s);

/* The scan agreement: read every peer's summary, decide with own (rank
 * zero's summary of n_own entries), send each peer its actions and wait
 * until each reports APPLIED.  own_act[n_own] receives rank zero's actions
 * (the caller applies them: sel_shard_apply).  st may be NULL.  0, or a
 * failure with a message naming the rank: a frame out of order, a summary
 * over max_scan or one naming a record twice (SEL_EFORMAT), a peer that
 * could not apply (its status), -ETIMEDOUT, a socket error; every peer is
 * told (ERROR). */
int sel_shard_agreement(sel_shard_set *s, const struct sel_shard_entry *own, size_t n_own,
			uint8_t *own_act, struct sel_shard_agree_stats *st, uint64_t deadline_ns);

/* Start the writer threads and the reader thread (after a successful
 * agreement): 0, -EINVAL (not agreed), or the thread error. */
int sel_shard_start(sel_shard_set *s);

/* A completed job as rank zero reports it: every addressed peer finished
 * it.  status: 0; else the first terminal failure; else, when every
 * failure was the filesystem being full or over quota, -ENOSPC or
 * -EDQUOT (space is then true: defer and retry after progress). */
struct sel_shard_done {
	uint64_t id, cookie;
	uint32_t op;
	int status;
	bool space;              /* some rank reported ENOSPC or EDQUOT */
	bool cleanup;            /* a sel_shard_cleanup job */
	uint64_t ranks;          /* addressed peers (bit r = rank r) */
	uint64_t failed;         /* peers that reported a failure */
	uint64_t committed;      /* STORE: peers whose file is in place (before any cleanup) */
	uint64_t had_row;        /* TRUNCATE: peers whose file held the row */
	uint64_t existed;        /* UNLINK: peers whose file was there */
	uint64_t cleaned;        /* STORE: peers whose partial file was unlinked after the failure;
				cleanup: peers unlinked */
	uint64_t cleanup_failed; /* peers whose cleanup unlink failed (or could not be sent) */
	uint64_t bytes;          /* moved by every peer together */
	int32_t rank_status[SEL_SHARD_WORLD_MAX];
	char text[EOS_ERRMSG_MAX]; /* "rank 2: ..." for the failure, cleanup failures after */
};

/* Submit job (job->id is ignored: the set numbers its jobs) to the peers in
 * ranks (bit r = rank r; 0 = every peer).  Page ids and records are copied:
 * the caller's arrays are free again on return.  0 with *id (may be NULL),
 * or, with no completion to come: -EAGAIN (some addressed peer's queue is
 * full: jobs or bytes; nothing was queued anywhere), SEL_EFORMAT (the job
 * breaks a rule of sel_shard_job_check, or would not fit a frame), -EINVAL
 * (ranks), SEL_ESTOPPED (stopping, stopped, or closing), -ENOMEM. */
int sel_shard_submit(sel_shard_set *s, const struct sel_shard_job *job, uint64_t ranks,
		     uint64_t cookie, uint64_t *id);
/* Unlink record rec from the peers in ranks because a store failed: an
 * UNLINK job that the queue bound never refuses (it may exceed it by at
 * most queue_jobs frames; beyond that -EAGAIN).  Its completion has
 * cleanup set, status = cause (the store's failure) and text = cause_text
 * followed by every cleanup unlink that failed; cleaned and cleanup_failed
 * say where.  Errors as sel_shard_submit. */
int sel_shard_cleanup(sel_shard_set *s, const sel_record_desc *rec, uint64_t ranks, int cause,
		      const char *cause_text, uint64_t cookie, uint64_t *id);

/* Completed jobs, oldest completion first, up to cap: the count (>= 0), or
 * SEL_ESTOPPED once the set stopped and every completion from before the
 * stop was returned.  Never blocks. */
int sel_shard_poll(sel_shard_set *s, struct sel_shard_done *out, size_t cap);
/* Readable (an eventfd) while a completion or the stop waits to be polled. */
int sel_shard_wait_fd(const sel_shard_set *s);
/* Whether the set is stopping or stopped; why (may be NULL) gets the
 * reason. */
bool sel_shard_stopped(sel_shard_set *s, char *why, size_t len);

/* Close: refuse new jobs, wait until every outstanding job completed, send
 * DRAIN to every peer and wait for each DRAINED, then close the links and
 * join the threads -- all up to deadline_ns.  Completions stay pollable
 * until destroy.  0 when every peer confirmed its drain; SEL_ESTOPPED when
 * the set stopped, jobs were still outstanding at the deadline (their ids
 * may be under copy: keep them), or a peer did not confirm its drain, with
 * a message.  After a successful close the peers' serve calls return 0. */
int sel_shard_close(sel_shard_set *s, uint64_t deadline_ns);
/* Close the sockets, join the threads, free.  NULL-safe; safe after any
 * failure.  Nothing of the caller's is referenced by the set (jobs were
 * copied), so destroy never leaks. */
void sel_shard_destroy(sel_shard_set *s);

struct sel_shard_stats {
	uint64_t submitted, completed, failed; /* caller jobs */
	uint64_t refused_full;                 /* submissions refused: a queue was full */
	uint64_t cleanups,
		cleanup_failed; /* unlinks after partial stores, ranks that failed them */
	uint64_t frames_sent, bytes_sent, frames_received;
	uint32_t outstanding; /* jobs not completed (cleanups included) */
	uint32_t queued_max;  /* most frames a peer's queue held */
	uint32_t refused_joins;
	bool stopped;
};
void sel_shard_stats(sel_shard_set *s, struct sel_shard_stats *out);
/* The set's invariants (shard_link.c): 0 or SEL_ECORRUPT naming the first
 * violation. */
int sel_shard_check(sel_shard_set *s);

/* ---- a peer ------------------------------------------------------------------ */

struct sel_shard_peer_config {
	uint32_t world, rank;
	uint8_t identity[SEL_IDENTITY_BYTES];
	uint8_t fingerprint[SEL_FINGERPRINT_BYTES]; /* this rank's */
	uint8_t primary_fingerprint
		[SEL_FINGERPRINT_BYTES]; /* rank zero's expected; zero: unchecked */
	struct sel_shard_settings set;
	/* The rendezvous connection the HELLO came over (or -1): the link's
	 * source address is bound to its local address, the one rank zero
	 * accepts. */
	int rendezvous_fd;
	/* This rank's geometry: jobs naming page ids, slots or records beyond
	 * it are refused (the link then ends). */
	struct sel_shard_limits lim;
	uint64_t out_bytes; /* completions buffered before it stops reading jobs; 0 = 1 MiB */
	int sock_buf;
};

/* Check hello against cfg, connect to the address and port it names, send
 * JOIN and wait for ACCEPT until deadline_ns.  A HELLO that disagrees with
 * cfg (world size, rank, identity, rank zero's fingerprint, disk store or
 * none) still sends JOIN, so rank zero learns it, then an ERROR, and fails
 * with a message naming both values.  0 with *out, SEL_EFORMAT (hello does
 * not decode), SEL_EIDENTITY, SEL_ELAYOUT, -EINVAL, the refusal rank zero
 * sent (its status, with its text), -ETIMEDOUT, or a socket error. */
int sel_shard_peer_join(const struct sel_shard_peer_config *cfg, const void *hello, size_t len,
			uint64_t deadline_ns, sel_shard_peer **out);
/* The agreed disk limit ACCEPT carried: the scan's max_file_bytes. */
uint64_t sel_shard_peer_disk_limit(const sel_shard_peer *p);

/* Send the summary of this rank's scan (n entries) and receive rank zero's
 * actions into act[n] (then apply them: sel_shard_apply, and report with
 * sel_shard_peer_applied).  0, SEL_EFORMAT (a decision that does not match
 * the summary), the ERROR rank zero sent, -ETIMEDOUT, a socket error. */
int sel_shard_peer_agreement(sel_shard_peer *p, const struct sel_shard_entry *e, size_t n,
			     uint8_t *act, uint64_t deadline_ns);
/* Report the outcome of applying the actions (status 0 or the failure). */
int sel_shard_peer_applied(sel_shard_peer *p, int status, uint32_t deleted, uint32_t truncated,
			   const char *text, uint64_t deadline_ns);

/* The record service's job table (part B backs it with the peer's own
 * Staged transport).  Called on the serving thread. */
struct sel_shard_ops {
	void *ctx;
	/* Start job: its arrays live only during the call (copy what is kept).
	 * 0 when accepted (a completion follows through sel_shard_peer_complete,
	 * from any thread, possibly before submit returns), or a failure, sent
	 * at once as the job's completion. */
	int (*submit)(void *ctx, sel_shard_peer *p, const struct sel_shard_job *job);
	/* A descriptor readable when service should run (-1: none). */
	int (*wait_fd)(void *ctx);
	/* Called when wait_fd is readable: poll the transport and complete what
	 * finished.  May be NULL without a wait_fd. */
	void (*service)(void *ctx, sel_shard_peer *p);
	/* Finish every accepted job (completing each) by deadline_ns: 0, or a
	 * failure when the transport could not drain (its resources must then
	 * stay as they are). */
	int (*drain)(void *ctx, sel_shard_peer *p, uint64_t deadline_ns);
};

/* Serve jobs until the link ends.  Returns 0 after rank zero sent DRAIN,
 * the ops drained, DRAINED went out and rank zero closed: every resource
 * may be released.  On any other end -- rank zero's connection closed or
 * failed, a frame that does not decode or is out of range (an ERROR goes
 * out first), a completion that cannot be sent -- the ops drain first
 * (up to 30 s) and serve returns the link's failure (-ECONNRESET,
 * SEL_EFORMAT, ...) with a message, or SEL_ESTOPPED when the ops could not
 * drain: then keep the transport and every resource and exit with the
 * error (design 2.14). */
int sel_shard_peer_serve(sel_shard_peer *p, const struct sel_shard_ops *ops);
/* Report job r->id done (any thread): 0, -ENOENT (not an accepted job, or
 * completed already), SEL_EFORMAT (a status or flags a frame cannot carry;
 * the text is made safe), -ENOMEM. */
int sel_shard_peer_complete(sel_shard_peer *p, const struct sel_shard_result *r);
/* Close the connection and free.  NULL-safe. */
void sel_shard_peer_destroy(sel_shard_peer *p);

/* ---- frames over a blocking exchange (the rendezvous, tests) --------------- */

/* Send frame buf[0..len) on fd by deadline_ns: 0, -ETIMEDOUT, or the socket
 * error. */
int sel_shard_send(int fd, const void *buf, size_t len, uint64_t deadline_ns);
/* Receive one whole frame of at most cap bytes (header included) from fd
 * by deadline_ns: its length, SEL_EFORMAT (a header that does not parse, or
 * a frame over cap), -ECONNRESET (closed), -ETIMEDOUT, or the socket error. */
int64_t sel_shard_recv(int fd, void *buf, size_t cap, uint64_t deadline_ns);
/* Exactly len bytes from fd by the deadline (the execution protocol's
 * frames use it too, src/helios/ranks.c): 0, -ECONNRESET when the other
 * end closed, -ETIMEDOUT, or -errno, with a message. */
int sel_shard_recv_all(int fd, uint8_t *p, size_t len, uint64_t deadline_ns);
/* A link's socket options: TCP_NODELAY, keepalive (10 s idle, 5 s, 3
 * probes) and a 30 s user timeout, so a vanished host ends the connection
 * within about a minute; sock_buf > 0 sets both buffer sizes. */
void sel_shard_sockopts(int fd, int sock_buf);
/* Tests (FLARE_TEST_RANK_LINK user_timeout_ms): the links' TCP user
 * timeout for every link made after the call; 0: 30 s. */
void sel_shard_test_user_timeout(unsigned int ms);

#endif
