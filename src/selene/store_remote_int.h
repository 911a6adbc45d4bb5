/*
 * store_remote_int.h - the remote level (issue 16 part B): a store that
 * wraps a local store (memory, disk, composite, a pooled level, or none)
 * and adds the remote tier on Redis (remote_client.h) as the last level of
 * the cascade and of copy priority (design 2.15).
 *
 * Internal to libselene: store_remote.c (open, lookup, put, fetch, stats,
 * close) and store_remote_poll.c (completions).  Everything runs on the
 * model worker thread and never waits: the remote client's I/O thread does
 * the network, the level's own transfer set the copies between GPU pages
 * and its intake slots.
 *
 * DESIGN
 *
 *   Lookups: the inner store first.  When it has nothing up to the limit,
 *   the remote lookup is submitted and the lookup answers
 *   SEL_LOOKUP_PENDING (selene.h) until the answer is in or the grace
 *   period (sel_remote_grace_ns: four round trips, 2..250 ms) has passed;
 *   then the deeper of the two wins (one source: the whole suffix above
 *   the GPU-resident count comes from the level that answers).  Answers
 *   are kept in a small table keyed by (the history's key at the limit,
 *   the resident count, the limit) for ANSWER_TTL_NS, so a request that
 *   waits on capacity asks again without another round trip, and a late
 *   answer serves the request's next admission attempt.  A lookup whose
 *   key at the limit is a kept hit's endpoint, with a resident count
 *   between that lookup's and the endpoint (an overlapped restore's tail,
 *   issue 18), is answered at once from that hit rebased
 *   (sel_remote_hit_rebase: the same verified manifests, no round trip),
 *   kept as an entry of its own linked to the first, which expires with
 *   it; claiming either drops both.
 *
 *   Claims: a remote hit is claimed into intake slots of the level's own
 *   slot pool (sel_store_pool_map gives the page-record and row
 *   addresses); the client checks every page against the manifest's
 *   checksums and the row against the header's before its event, and only
 *   then does a copy-in job move the slots to the ticket's page ids and
 *   state slot.  A failed claim never touched the GPU: FETCH_FAILED at
 *   once, and the request recomputes.
 *
 *   Background writes: a put the inner store queued (or, with no inner
 *   store, every usable put) also gets a copy-out of its tail pages and
 *   row into intake slots.  The inner store's STORED or STORE_FAILED event
 *   for that checkpoint is held until the copy-out has landed (the
 *   worker's GPU pin covers both); a STORED inner event (the record
 *   committed to the first local tier) with a landed copy starts
 *   sel_remote_put from the slots, which are freed at the put's event.  No
 *   slots, a full transfer channel, OUT_MAX copies in flight or a full put
 *   queue: the write is skipped and counted, never waited for.  Keys known
 *   to be on Redis (written, found present, or restored from it) are not
 *   written again (a ring of KNOWN_MAX keys).
 *
 *   Close: the level stops taking puts, serves completions until every
 *   copy-out landed and its inner event came (within the deadline), closes
 *   the inner store, then the client with the same deadline (queued remote
 *   writes finish within the shutdown bound), then its transfer set.
 *
 * INVARIANTS
 *   1. Every inner STORED / STORE_FAILED event is delivered exactly once,
 *      after the level's own copy-out of that checkpoint (if any) landed.
 *   2. A ticket gets exactly one FETCHED or FETCH_FAILED event; its page
 *      ids and state slot are written only by a copy-in of slots the
 *      client verified.
 *   3. Intake slots are held by exactly one job from allocation to the
 *      job's end (its remote event, or its failure).
 */
#ifndef SEL_STORE_REMOTE_INT_H
#define SEL_STORE_REMOTE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "record.h"
#include "selene_store.h"
#include "remote_client.h"
#include "remote_url.h"
#include "store_evq.h"
#include "store_pool.h"
#include "transfer.h"

#define RS_LOOKS 64       /* lookup answers kept */
#define RS_KNOWN_MAX 4096 /* keys known to be on Redis */
#define RS_OUT_MAX 8      /* background copy-outs and writes at once */
#define RS_ANSWER_TTL_NS (2000ull * 1000000)
#define RS_GRACE_MIN_NS (50ull * 1000000)
#define RS_GRACE_MAX_NS (250ull * 1000000)

enum rs_look_state {
	RS_FREE = 0,
	RS_PENDING, /* submitted, within the grace period */
	RS_LATE,    /* submitted, grace period over: the answer is kept when it comes */
	RS_HIT,
	RS_MISS,
};

struct rs_look {
	enum rs_look_state state;
	sel_key key; /* the history's key at limit */
	uint64_t resident, limit;
	uint64_t deadline; /* PENDING: end of the grace period */
	uint64_t answered; /* when the answer came (TTL) */
	uint32_t gen;      /* bumped at every use: cookies of old hits go stale */
	sel_remote_hit *hit;
	/* A hit rebased from another entry's (look_derive): that entry and
	 * its gen then; a claim of either drops both. */
	int32_t from;
	uint32_t from_gen;
};

enum rs_job_kind {
	RS_OUT = 1,
	RS_IN
};

/* One copy between the GPU and intake slots, and what follows it. */
struct rs_job {
	enum rs_job_kind kind;
	struct sel_xfer_job x;
	uint32_t *slots; /* n_pages page slots, then row_slots row slots */
	uint32_t n_slots, n_pages;
	uint32_t *ids; /* GPU page ids (x.pages) */
	void **pagev;  /* page-record addresses of the slots */
	struct iovec *iov;
	uint32_t n_iov, iov_cap;
	bool copying; /* the transfer job is in flight */
	bool copied;  /* it landed (x.status 0) or failed */
	bool queued;  /* IN: waits for room in the transfer channel */
	bool remote;  /* a remote put or claim is in flight */
	/* OUT */
	uint64_t checkpoint;
	sel_record_desc d;
	bool inner;     /* the inner store queued the put; its event decides */
	bool have_held; /* its event came and is held here */
	sel_event held;
	/* IN */
	uint64_t ticket, t0, bytes;
	sel_key key;
	sel_key *chain; /* the hit's node keys (known on Redis once restored) */
	uint32_t n_chain;
	struct rs_job *next;
};

struct remote_store {
	sel_store base;
	sel_store *inner; /* owned; NULL: every restore comes from Redis */
	sel_remote *r;
	sel_record_ns ns;
	bool ns_ok;
	struct sel_store_pool *sp;
	sel_xfer *xfer;
	struct sel_evq evq;
	int tfd; /* timerfd: the earliest grace deadline */
	uint64_t armed;
	bool closed, close_done, inner_closed, leak;
	int close_rc;
	const char *close_note;
	char url[SEL_RU_TEXT_MAX];
	char keydesc[64]; /* "key flare-<id>" or "no key (checksums only)" */
	bool encrypt, cluster;
	char desc[SEL_RU_TEXT_MAX + 1024];
	char warning[SEL_RU_TEXT_MAX + 1024];
	struct rs_look look[RS_LOOKS];
	sel_key *known;
	uint32_t n_known, known_next;
	struct rs_job *jobs;
	uint32_t n_out; /* OUT jobs alive */
	/* Counters of the level itself. */
	uint64_t lookups, hits; /* answered (not pending); remote hits returned */
	uint64_t lookups_late, fetches, fetch_failures, reused_tokens, skipped;
	uint64_t outcomes[SEL_SKIPPED + 1];
	uint64_t inflight_in;
};

/* store_remote.c */
/* The remote level over inner (owned from here on: destroyed on failure
 * too), or over nothing. */
int sel_remote_store_open(const sel_store_config *cfg, sel_store *inner, sel_store **out);
/* A job with n_pages page slots and the row's, mapped as flags
 * (SEL_RECORD_*_REPLICATED) lay a record out in them. */
struct rs_job *rs_job_new(struct remote_store *rs, enum rs_job_kind kind, uint32_t n_pages,
			  uint32_t flags);
/* (Re)compute j->pagev and j->iov for the layout flags give. */
int rs_job_map(struct remote_store *rs, struct rs_job *j, uint32_t flags);
void rs_job_end(struct remote_store *rs, struct rs_job *j);
void rs_known_add(struct remote_store *rs, const sel_key *k);
bool rs_known(const struct remote_store *rs, const sel_key *k);
void rs_arm(struct remote_store *rs);

/* store_remote_poll.c */
int rs_poll(sel_store *s, sel_event *ev, size_t cap);
/* One round of completions (inner events, transfers, remote events);
 * whether anything happened. */
bool rs_service(struct remote_store *rs);

#endif
