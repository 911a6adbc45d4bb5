/*
 * pool_client.h - an instance's connection to a pool manager (`flare pool`,
 * design 2.15): attach, the arena mapping, and every exchange of
 * pool_proto.h as calls that never wait (docs/pool.md).
 *
 * Internal to libselene: the pooled store (part B of issue 15) is its user.
 *
 * Threads.
 *   - sel_pool_attach runs once at startup, on the loader's thread, and may
 *     wait there: up to cfg->hello_timeout_ns (10 s) for the manager's
 *     hello, retrying a missing or refusing socket silently.
 *   - Every other call except sel_pool_close / sel_pool_destroy is made from
 *     one thread, the model worker, and never waits: submissions encode a
 *     frame into a bounded queue (full: -EAGAIN, nothing queued) and return;
 *     replies come back through sel_pool_poll.  The queues' mutex is held
 *     only to link or unlink a frame, never across I/O.
 *   - The client's own I/O thread owns the socket: it sends the queued
 *     frames, decodes what arrives into a bounded inbound queue (when that
 *     is full it stops reading, and the manager may disconnect a client that
 *     does not read), and reconnects after a lost connection.
 *   - The verify and checksum helpers at the end read the arena only; the
 *     copier threads call them.
 *
 * Leases.  A claim, a put and an export each become a lease (struct
 * sel_pool_lease) when the manager grants arena windows.  The caller owns
 * the lease from its event until it ends it with exactly one of
 * sel_pool_release, sel_pool_commit (puts) or sel_pool_export_done /
 * sel_pool_export_reply with a refusal (exports), and calls that only once
 * no copy can touch the lease's windows any more: the end of a lease is
 * also the client's statement that its copies drained.  A lease's windows
 * stay reserved for it at the manager until then, even after
 * SEL_POOL_EV_LEASE_FAILED (a deadline or the no-progress timeout passed, or
 * the connection was lost): the caller then stops, drains and releases,
 * and counts the restore or put as failed.
 *
 * Sessions.  A lost connection (SEL_POOL_EV_DETACHED) fails every pending
 * ticket, claim and put, and every live lease gets SEL_POOL_EV_LEASE_FAILED
 * (reason SEL_POOL_GONE).  The I/O thread reconnects only once every lease
 * of the lost session has ended (its hello then says "drained", which lets
 * the manager free what it held for the old session).  The same region
 * generation (and the same arena file) keeps the mapping:
 * SEL_POOL_EV_ATTACHED, and announcements must be sent again.  A changed
 * generation disables sharing for good: SEL_POOL_EV_DISABLED, with one
 * warning in sel_pool_warning; the mapping stays until destroy.
 *
 * Trust.  Every frame the manager sends is decoded strictly; a grant, an
 * export request or a failure notice naming a request, lease or nonce this
 * client does not hold, or windows that break sel_pool_windows_check for
 * what was asked, is refused (released or replied to as refused), counted
 * in stats, and never followed.  A grant carries each node's key so the
 * caller can compare it with history.key_at(consumed) before copying
 * (sel_pool_candidate_matches, sel_pool_lease_matches), and per-page and
 * row checksums so the copier verifies the bytes before they reach the GPU
 * (sel_pool_lease_verify).
 *
 * Errors: 0 or a negative errno with sel_errmsg() saying why: -EAGAIN (a
 * queue is full: retry after poll), -ENOTCONN (detached or disabled: the
 * pool is unavailable now), -EBUSY (a per-session limit of the manager's
 * hello), -EINVAL (bad arguments), -ENOMEM.  A call that fails changes
 * nothing and produces no event.
 */
#ifndef SEL_POOL_CLIENT_H
#define SEL_POOL_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "pool_proto.h"
#include "selene.h"
#include "transfer.h"

typedef struct sel_pool_client sel_pool_client;
typedef struct sel_pool_ticket sel_pool_ticket;

struct sel_pool_client_config {
	/* "unix:PATH" or a path: the manager's socket. */
	const char *address;
	/* The scope: live plane sizes (the geometry outlives the client) and
	 * the offload identity of the records. */
	const sel_geometry *geometry;
	uint8_t identity[SEL_IDENTITY_BYTES];
	/* Instance id inputs (sel_pool_instance_id): an explicit id
	 * (--prefix-cache-instance-id; NULL or "" to derive it), else the
	 * machine id (read from machine_id_path, NULL: /etc/machine-id), the
	 * core's model identity and the listen address. */
	const char *instance_id;
	const char *machine_id_path;
	uint8_t core_identity[SEL_IDENTITY_BYTES];
	const char *listen;
	/* How long attach waits for the manager's hello (0: 10 s). */
	uint64_t hello_timeout_ns;
	/* Bounds: bytes of frames waiting to be sent (0: 8 MiB) and of
	 * decoded messages waiting for poll (0: 16 MiB). */
	uint64_t out_bytes, in_bytes;
	/* Requested restore setup time in claims and puts (0: 10 s). */
	uint32_t setup_ms;
};

/* Connect, receive the manager's hello and the arena descriptor, map the
 * arena, send this instance's hello and wait for the welcome; then start
 * the I/O thread.  On failure nothing is left behind and *out is NULL:
 * -ETIMEDOUT when no manager answered in time (absent, or never wrote its
 * hello), -EACCES when the manager refused this process (its uid or group,
 * or the socket's permissions), -EPROTO when it refused the hello (version,
 * scope, a duplicate instance id; the message has the manager's text),
 * SEL_EFORMAT when it sent something that does not decode, or another
 * negative errno.  The message names the address: the caller prints it
 * once as the warning that local tiers will be used and the instance will
 * not attach later. */
int sel_pool_attach(const struct sel_pool_client_config *cfg, sel_pool_client **out);

/* Stop the I/O thread and close the connection (the manager keeps what
 * live leases hold until this process exits).  0; idempotent.  Leases,
 * tickets and the mapping stay valid until destroy. */
int sel_pool_close(sel_pool_client *c);
/* Close, free every ticket and lease, and unmap the arena: only once no
 * copy can touch it.  NULL-safe. */
void sel_pool_destroy(sel_pool_client *c);

/* ---- What attach learned ------------------------------------------------ */

enum sel_pool_state {
	SEL_POOL_ATTACHED = 0, /* a session is open */
	SEL_POOL_DETACHED,     /* the connection was lost; reattach follows */
	SEL_POOL_DISABLED,     /* sharing is off for good (see sel_pool_warning) */
};
/* The state as of the last poll. */
enum sel_pool_state sel_pool_state(const sel_pool_client *c);
const char *sel_pool_state_name(enum sel_pool_state s);

/* The manager's hello (name, generation, limits) of the first session. */
const struct sel_pool_m_hello *sel_pool_hello(const sel_pool_client *c);
const uint8_t *sel_pool_instance(const sel_pool_client *c); /* SEL_POOL_ID_BYTES */
/* The arena mapping: base address and length.  Host addresses of windows
 * are base + offset; a slot s of the scope is at base + s * slot_bytes. */
void *sel_pool_arena(const sel_pool_client *c, uint64_t *bytes);
/* Of those bytes, how many were already resident when the first session
 * mapped the arena (sel_pool_budget_resident of its descriptor): what the
 * budget check before registration does not charge. */
uint64_t sel_pool_arena_resident(const sel_pool_client *c);
uint64_t sel_pool_slot_bytes(const sel_pool_client *c);
uint32_t sel_pool_row_slots(const sel_pool_client *c);
/* Transfer parts over the arena, for sel_xfer_create_parts: rank r's share
 * of slot s at base + s * slot_bytes + share_off[r] (parts[ranks]); the
 * slot numbers of a lease index that set.  Returns the slot count. */
uint64_t sel_pool_xfer_parts(const sel_pool_client *c, struct sel_xfer_part *parts);
/* One warning for the operator (sharing disabled, ...), or "". */
const char *sel_pool_warning(const sel_pool_client *c);

/* ---- Holdings (design 2.15 announcements, eviction notices) ------------ */

/* Announce checkpoints this instance holds (source GPU, DRAM or NVME), or
 * withdraw them (eviction notices: key and generation; bucket unused).  At
 * most SEL_POOL_MAX_HOLDINGS per call.  After SEL_POOL_EV_ATTACHED, or
 * when the caller lost notices (evictions_lost), reset and announce
 * again. */
int sel_pool_announce(sel_pool_client *c, const struct sel_pool_holding *h, uint32_t n);
int sel_pool_withdraw(sel_pool_client *c, const struct sel_pool_holding *h, uint32_t n);
/* Forget every holding of these sources (bits 1 << SEL_POOL_SRC_*). */
int sel_pool_reset_holdings(sel_pool_client *c, uint32_t sources);

/* ---- Lookups ------------------------------------------------------------ */

enum sel_pool_ticket_state {
	SEL_POOL_TICKET_PENDING = 0, /* no answer yet */
	SEL_POOL_TICKET_READY,       /* sel_pool_ticket_answer holds it */
	SEL_POOL_TICKET_FAILED,      /* the session ended first: no answer */
};

/* Ask which endpoints of h above resident and at or below limit the pool
 * has (the boundaries from min(len, limit) / 64 down to resident / 64, at
 * most SEL_POOL_MAX_BOUNDS of the deepest).  0 with *out PENDING; the
 * answer arrives through poll (SEL_POOL_EV_ANSWER) and the state never
 * waits for it.  The caller owns the ticket until sel_pool_ticket_free. */
int sel_pool_begin_lookup(sel_pool_client *c, const sel_history *h, uint64_t resident,
			  uint64_t limit, sel_pool_ticket **out);
enum sel_pool_ticket_state sel_pool_ticket_state(const sel_pool_ticket *t);
/* READY: the manager's answer (candidates deepest first), valid until the
 * ticket is freed; otherwise NULL. */
const struct sel_pool_m_answer *sel_pool_ticket_answer(const sel_pool_ticket *t);
uint64_t sel_pool_ticket_id(const sel_pool_ticket *t);
uint64_t sel_pool_ticket_resident(const sel_pool_ticket *t);
/* Drop a ticket (a late answer is then discarded).  NULL-safe. */
void sel_pool_ticket_free(sel_pool_client *c, sel_pool_ticket *t);

/* Whether candidate i's chain is h's (issue 12's rule): every node from the
 * endpoint down to the candidate's base has key == history.key_at(its
 * consumed), consumed <= len(h), and consumed counts strictly fall toward
 * the base, which is <= resident. */
bool sel_pool_candidate_matches(const struct sel_pool_m_answer *a, uint32_t i, const sel_history *h,
				uint64_t resident);
/* The candidate to restore: the deepest that matches, and among equally
 * deep ones the closest source (neighbour GPU, DRAM, NVMe, then the
 * arena).  Its index, or -1 when none matches. */
int sel_pool_answer_pick(const struct sel_pool_m_answer *a, const sel_history *h,
			 uint64_t resident);

/* ---- Leases ------------------------------------------------------------- */

enum sel_pool_lease_kind {
	SEL_POOL_CLAIM = 0,
	SEL_POOL_PUT = 1,
	SEL_POOL_EXPORT = 2
};

/* Read-only for the caller. */
struct sel_pool_lease {
	enum sel_pool_lease_kind kind;
	uint64_t id;      /* the manager's lease id */
	uint64_t request; /* the claim or put id it answers (0: export) */
	uint8_t source;   /* claims: where the bytes came from */
	sel_key key;      /* the endpoint */
	uint64_t base;    /* claims: pages start after this consumed count */
	uint32_t n_nodes; /* claims: the chain, ancestor first */
	const struct sel_pool_gnode *nodes;
	uint32_t n_pages;           /* pages in the windows, chain order */
	const uint32_t *page_slots; /* [n_pages] arena slot numbers */
	uint32_t n_row_slots;       /* row_slots, or 0 without the row */
	const uint32_t *row_slots;
	const uint64_t *page_cksum; /* claims: [n_pages] expected checksums */
	uint64_t row_cksum;         /* claims */
	/* Exports: what the manager asks for. */
	uint64_t generation;
	uint32_t start_page;
	uint64_t bytes;       /* bytes the windows hold */
	uint64_t deadline_ns; /* eos_now_ns clock: the manager's deadline */
	uint32_t failed;      /* 0, or the reason of SEL_POOL_EV_LEASE_FAILED */
	uint32_t windows;     /* windows the grant had (progress counts them) */
	uint32_t page_tokens; /* the scope's */
};

/* Claim candidate i of a READY ticket's answer (which must be the
 * ticket's own; the ticket may be freed afterwards).  *claim receives the
 * id that SEL_POOL_EV_CLAIM_GRANTED / _FAILED carries.  The requester
 * fails the claim itself (SEL_POOL_TIMEOUT) when no grant came within 12 s
 * plus the candidate's bytes at 8 MiB/s. */
int sel_pool_claim(sel_pool_client *c, const sel_pool_ticket *t, uint32_t i, uint64_t *claim);
/* sel_pool_claim above another resident count: past the ticket's (a
 * request readmitted after a shorter restore, design 2.15 "late answer"),
 * or below it (an overlapped restore's tail with its head, issue 18): the
 * grant then covers the pages past resident.  -EINVAL at or past the
 * candidate's endpoint. */
int sel_pool_claim_at(sel_pool_client *c, const sel_pool_ticket *t, uint32_t i, uint64_t resident,
		      uint64_t *claim);
/* The requester's deadline (eos_now_ns clock) of claim, while it waits for
 * its grant: 12 s plus its bytes and those of the claims waiting ahead of
 * it at 8 MiB/s (design 2.15 restore deadlines); 0 when none waits. */
uint64_t sel_pool_claim_deadline(const sel_pool_client *c, uint64_t claim);

/* Ask for arena windows for a record (the end of a local chain cascading
 * down).  tail pages (the whole chain c / pt as a root, or c / pt - p / pt
 * under a parent the pool holds) and the row.  *put receives the id of
 * SEL_POOL_EV_PUT_GRANTED / _REFUSED.  Keep the local source until
 * SEL_POOL_EV_PUT_RESULT says OK. */
struct sel_pool_put_desc {
	sel_key key, parent;
	sel_digest bucket;
	uint32_t tail;
};
int sel_pool_put(sel_pool_client *c, const struct sel_pool_put_desc *d, uint64_t *put);
/* The put lease's windows are filled (copies drained): page_cksum[n_pages]
 * and the row checksum (sel_pool_lease_checksums).  Ends the lease;
 * SEL_POOL_EV_PUT_RESULT follows (OK: the pool holds the record). */
int sel_pool_commit(sel_pool_client *c, struct sel_pool_lease *l, const uint64_t *page_cksum,
		    uint64_t row_cksum);
/* Export: accept (reason SEL_POOL_OK; the lease stays) or refuse with
 * NOT_FOUND, GENERATION_CHANGED, CHAIN_GAP or NO_HEADROOM (ends the lease:
 * only before any copy into its windows started). */
int sel_pool_export_reply(sel_pool_client *c, struct sel_pool_lease *l, uint32_t reason);
/* Export: the windows are filled (copies drained); ends the lease. */
int sel_pool_export_done(sel_pool_client *c, struct sel_pool_lease *l, const uint64_t *page_cksum,
			 uint64_t row_cksum);
/* windows_done of the lease's windows are complete (the manager's
 * no-progress timer restarts).  Optional, cheap. */
int sel_pool_progress(sel_pool_client *c, struct sel_pool_lease *l, uint32_t windows_done);
/* End any lease once its copies drained: a claim (status OK, or CORRUPT
 * when the bytes failed verification, COPY_FAILED), a put abandoned, an
 * export that failed.  Frees l.  Never fails for a live lease; after a lost
 * session it only frees. */
int sel_pool_release(sel_pool_client *c, struct sel_pool_lease *l, uint32_t status);

/* Whether a claim lease's nodes are h's chain (each key == key_at), the
 * last node is the claimed endpoint and the pages are the ones a restore
 * above resident needs. */
bool sel_pool_lease_matches(const struct sel_pool_lease *l, const sel_history *h,
			    uint64_t resident);

/* Copier-thread helpers over the arena (thread-safe, read-only). */
/* Host address of arena slot s. */
void *sel_pool_slot_addr(const sel_pool_client *c, uint32_t s);
/* Every page of a claim lease against page_cksum and the row against
 * row_cksum: 0 or SEL_ECORRUPT naming the first page or the row. */
int sel_pool_lease_verify(const sel_pool_client *c, const struct sel_pool_lease *l);
/* The same for pages first .. first + n of the lease (and the row when
 * row is set): a restore verifies window i + 1 while window i copies. */
int sel_pool_lease_verify_part(const sel_pool_client *c, const struct sel_pool_lease *l,
			       uint32_t first, uint32_t n, bool row);
/* The checksums of what a put or export lease's windows now hold. */
void sel_pool_lease_checksums(const sel_pool_client *c, const struct sel_pool_lease *l,
			      uint64_t *page_cksum, uint64_t *row_cksum);

/* ---- Events ------------------------------------------------------------- */

enum sel_pool_event_type {
	SEL_POOL_EV_ANSWER = 1,    /* ticket: READY now (possibly late) */
	SEL_POOL_EV_CLAIM_GRANTED, /* lease (request = claim id) */
	SEL_POOL_EV_CLAIM_FAILED,  /* request, reason (never granted) */
	SEL_POOL_EV_PUT_GRANTED,   /* lease (request = put id) */
	SEL_POOL_EV_PUT_REFUSED,   /* request, reason (PRESENT, NO_ROOM, ...) */
	SEL_POOL_EV_PUT_RESULT,    /* request, key, reason (OK: accepted) */
	SEL_POOL_EV_EXPORT,        /* lease: reply with sel_pool_export_reply */
	SEL_POOL_EV_EXPORT_CANCEL, /* lease: the requester went away (still end it) */
	SEL_POOL_EV_LEASE_FAILED,  /* lease, reason: stop, drain, release */
	SEL_POOL_EV_DETACHED,      /* the connection was lost (pending work failed) */
	SEL_POOL_EV_ATTACHED,      /* reattached with the same generation */
	SEL_POOL_EV_DISABLED,      /* sharing is off for good */
};

struct sel_pool_event {
	enum sel_pool_event_type type;
	uint32_t reason;  /* SEL_POOL_OK or a reason */
	uint64_t request; /* claim or put id */
	sel_key key;
	struct sel_pool_lease *lease;
	sel_pool_ticket *ticket;
};

/* Up to cap events; never waits.  Also fails claims past the requester's
 * deadline. */
int sel_pool_poll(sel_pool_client *c, struct sel_pool_event *ev, size_t cap);
/* Readable when poll has something (an eventfd; do not read it). */
int sel_pool_wait_fd(const sel_pool_client *c);

struct sel_pool_client_stats {
	uint64_t sessions; /* sessions opened (attach + reattaches) */
	uint64_t detaches;
	uint64_t lookups, answers, answers_dropped; /* dropped: ticket already freed */
	uint64_t claims, claims_granted, claims_failed;
	uint64_t puts, puts_granted, puts_refused, puts_accepted, puts_rejected;
	uint64_t exports, exports_accepted, exports_refused, exports_done;
	uint64_t leases_failed;
	uint64_t refused_frames; /* manager frames refused: unknown ids, bad windows */
	uint64_t manager_errors; /* M_ERROR frames received */
	uint64_t frames_out, frames_in, queue_full;
};
void sel_pool_stats(const sel_pool_client *c, struct sel_pool_client_stats *out);

#endif
