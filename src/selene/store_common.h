/*
 * store_common.h - the store skeleton: what every store built on an index
 * of records shares (design 2.2 store interface and its shared components;
 * 2.3 dedupe, parent links and tree eviction; 2.12 invariants; 2.15
 * publication outcomes and retention counters).
 *
 * Internal to libselene.  The memory store and the disk store are both a
 * struct sel_core (the base sel_store, the index, the slot pool's numbers,
 * one record per index node, the counters) plus what differs; a new store
 * of the same kind -- a pooled level, a remote level -- embeds one too and
 * writes only its own storage, copies and completions (HACKING.md "Adding
 * a store").  Everything here runs on the model worker thread, never locks
 * and never waits.
 *
 * What the skeleton does, once for every store:
 *   - the put prologue (sel_core_put_begin): closed or stopped, unusable
 *     checkpoints, dedupe (READY with its row: PRESENT; in flight, or a
 *     node the store refuses: SKIPPED), refilling a failed record kept for
 *     its children, the parent link (linked under an indexed parent when
 *     the checkpoint's tail is the count since it, else a root with its
 *     whole chain), page ids within the planes;
 *   - the record insert with its undo (sel_core_insert, sel_core_discard):
 *     index node and zeroed record together, or neither;
 *   - tree eviction until a store's predicate holds (sel_core_evict_until);
 *   - lookup (sel_core_lookup) and the fetch check (sel_core_fetch_check):
 *     the hit's chain above the resident count walked again, every node
 *     READY and not refused, its page count unchanged, and issue 12's chain
 *     digest equal to the one the lookup verified, so a fetch reads exactly
 *     the nodes whose keys were compared with the request's history;
 *   - failed-record removal (sel_core_remove_failed), the expiry sweep
 *     (sel_core_expire), progress accounting (store_common.h sel_progress,
 *     sel_put_account), the counters of completed puts and fetches, touch;
 *   - one process-wide leak list (sel_leak) for what a store that could
 *     not drain its threads must keep reachable.
 */
#ifndef SEL_STORE_COMMON_H
#define SEL_STORE_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "eos.h"
#include "expiry.h"
#include "index.h"
#include "selene_store.h"
#include "transfer.h"

struct sel_store_pool;

/* ---- Put checks --------------------------------------------------------- */

/* Whether cp can be stored at all: a non-zero consumed count whose whole
 * pages are exactly cp's page list, a tail within it, and a state slot below
 * rows.  Otherwise fails (-EINVAL) naming every field and returns false. */
bool sel_put_usable(const char *store, const sel_published *cp, uint32_t page_tokens,
		    uint64_t rows);

/* The tail cp has below a parent stored at parent_consumed tokens: the
 * pages past the parent's whole pages.  cp may also carry its whole chain
 * (tail == n_pages), as when it was offered before its parent was stored.
 * Returns false (and fails, -EINVAL) when cp does not extend that parent. */
bool sel_put_extends(const char *store, const sel_published *cp, uint64_t parent_consumed,
		     uint32_t page_tokens, uint32_t *derived);

/* Whether the last `tail` page ids of cp lie below `pages` (the smallest
 * rank's page count); else fails (-EINVAL) naming the first bad id. */
bool sel_put_pages_fit(const char *store, const sel_published *cp, uint32_t tail, uint64_t pages);

/* ---- Progress (selene.h SEL_EV_PROGRESS) --------------------------------- */

/* Refusals since the last SEL_EV_PROGRESS, and capacity released since. */
struct sel_progress {
	bool refused;
	bool released;
};

/* A refusal (a Retry, or a Deferred event): capacity that came back
 * before it does not count as progress. */
static inline void sel_progress_refuse(struct sel_progress *pg)
{
	pg->refused = true;
	pg->released = false;
}

/* Counts a put's outcome (and a Retry's reason) in st, notes a refusal in
 * pg, and stores what a caller's why receives.  Returns o. */
sel_outcome sel_put_account(sel_stats *st, struct sel_progress *pg, sel_outcome o,
			    sel_retry_reason reason, sel_retry_reason *why);

/* Whether a poll should report SEL_EV_PROGRESS now: a put was refused and
 * capacity came back since.  Clears both when it returns true. */
bool sel_progress_due(struct sel_progress *pg);

/* ---- The core of a store ------------------------------------------------- */

/* The node flag the skeleton owns among the store bits (index.h: 8..15):
 * the record's copy-out or write failed and it is kept, without bytes, for
 * its children, so no lookup chain runs through it.  Stores define theirs
 * from bit 9. */
#define SEL_CORE_FAILED (1u << 8)

/* The head of every store's per-node record. */
struct sel_core_rec {
	uint32_t mypins; /* pins held by the store's own jobs and callers */
	bool live;       /* the record of a live index node */
};

/* Why a record is leaving the index, for the store's remove callback. */
enum sel_core_why {
	SEL_WHY_NONE = 0, /* a put's undo, a failed record, a caller's removal */
	SEL_WHY_EVICT,    /* tree eviction (sel_core_evict_until) */
	SEL_WHY_DOOM,     /* the disk store's doomed records */
	SEL_WHY_EXPIRE,   /* the expiry sweep (sel_core_expire) */
	SEL_WHY_CASCADE,  /* the next level accepted it (sel_core_cascade_end) */
};

struct sel_core;
struct sel_put_plan;

/* An observer of a core's restorable records (the pooled store's host
 * holdings, design 2.15): committed when a record became READY, leaving
 * when it leaves the index or loses its row (it is no endpoint any more),
 * before its storage goes.  Both on the thread that mutates the core; they
 * must not call back into the store.  See sel_core_watch_set. */
struct sel_core_watch {
	void (*committed)(void *ctx, struct sel_core *c, sel_node_id id);
	void (*leaving)(void *ctx, struct sel_core *c, sel_node_id id);
	void *ctx;
};

/* The level below the end of the local chain (design 2.15 "eviction below
 * the instance": the pooled store over the last local tier).  See
 * sel_core_cascade_set. */
struct sel_cascade {
	/* Take a copy of key's record: READY with its row, a leaf, not
	 * pinned, the least recently used the store would evict next.  true:
	 * a copy started, and the core holds a store pin on the record until
	 * sel_core_cascade_end; false: not now (no offers for a backoff). */
	bool (*offer)(void *ctx, sel_store *s, const sel_key *key);
	/* Optional (NULL: never): whether key's record, a READY leaf with its
	 * row that tree eviction may not take (SEL_NODE_NOEVICT: a composite's
	 * parked record, complete in DRAM without a file), may be offered all
	 * the same, in its place in the least recently used order.  Asked
	 * just before the offer; it must not change the store. */
	bool (*parked)(void *ctx, sel_store *s, const sel_key *key);
	void *ctx;
};
#define SEL_CASCADE_MAX 8 /* records offered and held at once */

/* What a store built on the core tells it about itself. */
struct sel_core_ops {
	/* The store's own put, once the prologue (sel_core_put_begin) let cp
	 * through with plan p; sel_core_put does the accounting.  *why
	 * receives a Retry's reason. */
	sel_outcome (*put)(struct sel_core *c, const sel_published *cp,
			   const struct sel_put_plan *p, sel_retry_reason *why);
	/* Store pins (its jobs, the composite): the index pin plus whatever
	 * the store counts. */
	void (*pin)(struct sel_core *c, sel_node_id id);
	void (*unpin)(struct sel_core *c, sel_node_id id);
	/* The store's checker (SEL_DEBUG_CHECKS runs it after mutations). */
	int (*check)(sel_store *s);
	/* The index's callbacks (index.h), for live records only: free the
	 * storage of id's row, or all of id's storage (its removal is counted
	 * already; the core clears the record after remove). */
	void (*drop_row)(struct sel_core *c, sel_node_id id);
	void (*remove)(struct sel_core *c, sel_node_id id);
};

struct sel_core {
	sel_store base; /* first: the store's handle */
	const struct sel_core_ops *cops;
	const char *name; /* "memory store": messages start with it */
	sel_tier tier;    /* the stats slot it counts in */
	/* Node flags that take a node out of dedupe, parent links, lookups
	 * and fetches (the disk store's doomed records; 0 for none). */
	uint16_t refuse;
	/* Evictions drop records for good (the local end of the chain): the
	 * tier's dropped_end_of_chain counts them too. */
	bool end_of_chain;
	struct sel_store_pool *sp; /* layout, backend, slots (shared in a composite) */
	bool own_sp;
	sel_index *ix;
	sel_policy *policy; /* the tier's fitted restore estimates */
	sel_xfer *xfer;     /* the store's own transfer set */
	/* Besides the transfer set's kick, what sel_core_flush wakes (the
	 * disk store: its disk thread; defer: switch it to deferred wakes
	 * instead); NULL for none. */
	void (*flush_more)(struct sel_core *c, bool defer);
	bool deferring; /* sel_store_flush was called: wakes are deferred */
	struct sel_expiry exp;
	uint64_t poll_at;    /* the store clock's time of the last poll */
	uint64_t warm_at;    /* ... and of the last warm pass */
	sel_digest warm_acc; /* what the warm passes hash into */
	/* The put's path in the warm pass: the bytes of the store's last
	 * per-put allocation (0: none), and the store's own read-only touches
	 * (NULL: none). */
	size_t warm_alloc;
	void (*warm_more)(struct sel_core *c);

	/* The pool's numbers, copied for the hot paths. */
	uint32_t ranks, pt, row_slots;
	uint64_t slot_bytes, warm, intake;
	uint64_t min_pages, min_rows;           /* smallest plane page and row counts */
	uint64_t page_bytes_all, row_bytes_all; /* unpadded bytes of one page / row, all ranks */

	/* recs[id]: rec_size bytes per index node, each starting with a struct
 * sel_core_rec, zeroed when made
	 * addressable and again by sel_core_insert. */
	void *recs;
	uint32_t nrecs;
	size_t rec_size;

	sel_index_chain chain; /* lookup scratch */
	sel_node_id *walk;     /* fetch-check scratch: the chain, ascending */
	uint32_t walk_cap;
	enum sel_core_why why;
	uint64_t job_seq;
	bool stopped; /* a transfer failed fatally or close timed out */
	bool closed;
	int close_rc;
	struct sel_progress pg; /* refusals since the last PROGRESS, capacity back since */
	sel_stats st;           /* counters; gauges are filled at stats() */

	/* The end of the chain (sel_core_cascade_set): offered records, held
	 * with a store pin until the next level answers. */
	struct sel_cascade casc;
	struct {
		sel_key key;
		uint64_t units;
	} casc_held[SEL_CASCADE_MAX];
	uint32_t casc_n;
	uint64_t casc_units;            /* of the held records, in the store's units */
	uint64_t casc_after, casc_wait; /* no offers before casc_after; the backoff */
	uint64_t casc_offered, casc_accepted, casc_kept;
	struct sel_core_watch watch; /* sel_core_watch_set (zero: none) */
};

/* A zeroed store of size bytes (its core first), or NULL with -ENOMEM
 * failed and, when own, sp destroyed: the first step of a core store's
 * open, after which the store owns sp either way. */
void *sel_core_alloc(size_t size, struct sel_store_pool *sp, bool own, const char *who);

/* Set up c for a store of ops over sp (own: the store frees or leaks sp):
 * the base, the pool's numbers, an index calling cops' callbacks, the
 * expiry schedule of cfg, a policy and record 0.  On failure the caller
 * still calls sel_core_free (c is then half built, which it accepts). */
int sel_core_init(struct sel_core *c, const struct sel_store_ops *ops,
		  const struct sel_core_ops *cops, const char *name, sel_tier tier, size_t rec_size,
		  const sel_store_config *cfg, struct sel_store_pool *sp, bool own);
/* Create the core's transfer set over its pool (cfg->queue_depth, 64 by
 * default). */
int sel_core_xfer(struct sel_core *c, const sel_store_config *cfg);
/* Free what sel_core_init made (records, scratch, index, policy).  The
 * store frees its records' own storage, its transfer set and its pool
 * first. */
void sel_core_free(struct sel_core *c);

/* s as the store whose ops table is ops (a checked cast: a store of
 * another kind aborts with a message; NULL stays NULL). */
void *sel_store_checked(sel_store *s, const struct sel_store_ops *ops);

/* recs[id] of a record type (id must be addressable). */
#define SEL_CORE_REC(c, type, id) ((type *)(c)->recs + (id))

/* The record head of id, or NULL when id has no live record. */
static inline struct sel_core_rec *sel_core_live(const struct sel_core *c, sel_node_id id)
{
	struct sel_core_rec *h;
	if (id >= c->nrecs)
		return NULL;
	h = (struct sel_core_rec *)((char *)c->recs + (size_t)id * c->rec_size);
	return h->live ? h : NULL;
}

/* Make recs[id] addressable (zeroed): 0 or -ENOMEM. */
int sel_core_ensure_rec(struct sel_core *c, sel_node_id id);

/* SEL_ESTOPPED naming the state when closed or stopped; else 0. */
int sel_core_refuse_stopped(struct sel_core *c);

/* Bytes a restore or store of pages pages (and the row) moves. */
static inline uint64_t sel_core_record_bytes(const struct sel_core *c, uint32_t pages, bool row)
{
	return (uint64_t)pages * c->page_bytes_all + (row ? c->row_bytes_all : 0);
}

static inline const sel_index_node *sel_core_node(const struct sel_core *c, sel_node_id id)
{
	return sel_index_cget(c->ix, id);
}

/* ---- put ------------------------------------------------------------------ */

/* What the put prologue decided. */
struct sel_put_plan {
	sel_node_id id;   /* the failed node being refilled, or SEL_NODE_NONE (fresh) */
	sel_node_id pid;  /* the parent the record links under, or SEL_NODE_NONE (a root) */
	uint32_t tail;    /* page records it holds: its tail, or its whole chain */
	uint32_t derived; /* fresh and linked: the count since the parent */
	bool row;         /* it holds its row */
	bool fresh;       /* a new node is to be inserted */
};

/* ops->put of a core store: the prologue, cops->put, and the outcome
 * counted (sel_put_account). */
sel_outcome sel_core_put(sel_store *s, const sel_published *cp, sel_retry_reason *why);

/* The ops table of a core store: lookup, put and touch are the skeleton's
 * (sel_core_lookup, sel_core_put, sel_core_touch), evicted is store.c's
 * default; the store gives its name and the entries that are its own, and
 * whether its fetch delivers page digests (sel_inbound.sums). */
#define SEL_CORE_STORE_OPS(kind, fetch_, poll_, stats_, wait_fd_, close_, destroy_, describe_,     \
			   fetch_sums_)                                                            \
	{                                                                                          \
		.version = SEL_STORE_OPS_VERSION, .name = (kind), .lookup = sel_core_lookup,       \
		.put = sel_core_put, .fetch = (fetch_), .poll = (poll_), .touch = sel_core_touch,  \
		.stats = (stats_), .wait_fd = (wait_fd_), .close = (close_),                       \
		.destroy = (destroy_), .describe = (describe_), .drop = sel_core_drop,             \
		.flush = sel_core_flush_op, .fetch_sums = (fetch_sums_),                           \
	}

/* A core store's sel_core_ops, in the order of the struct. */
#define SEL_CORE_OPS(put_, pin_, unpin_, check_, drop_row_, remove_)                               \
	{                                                                                          \
		.put = (put_), .pin = (pin_), .unpin = (unpin_), .check = (check_),                \
		.drop_row = (drop_row_), .remove = (remove_),                                      \
	}

/* The checks every put starts with.  SEL_QUEUED means go on with *p;
 * anything else is the put's outcome (with a message where it fails).  A
 * PRESENT touches the record. */
sel_outcome sel_core_put_begin(struct sel_core *c, const sel_published *cp, struct sel_put_plan *p);

/* Insert key PENDING under parent (NULL: a root) with a zeroed, live-to-be
 * record: 0 with *id, or the index's or -ENOMEM error with nothing left
 * behind (-EEXIST: key is indexed already, nothing changed). */
int sel_core_insert(struct sel_core *c, const sel_key *key, const sel_key *parent,
		    const sel_digest *bucket, uint32_t tail, bool row, sel_node_id *id);
/* Undo an insert whose later steps failed: remove id when key still names
 * it (a cascade may have taken it already). */
void sel_core_discard(struct sel_core *c, sel_node_id id, const sel_key *key);

/* Tree eviction (why SEL_WHY_EVICT, compactions counted) until fits(c,
 * need) holds or nothing is evictable.  Returns fits(c, need). */
bool sel_core_evict_until(struct sel_core *c, bool (*fits)(struct sel_core *c, uint64_t need),
			  uint64_t need);

/* Remove failed node id (if it is still key's node) once it is childless
 * and unpinned, then failed ancestors left so. */
void sel_core_remove_failed(struct sel_core *c, sel_node_id id, const sel_key *key);

/* ops->drop of a core store (page_digest.c): remove key's record, or drop
 * its row while it has children; counted as corrupt.  0, -ENOENT, -EBUSY
 * (pinned), -EINVAL. */
int sel_core_drop(sel_store *s, const sel_key *key);

/* A put's copy landed: held and bytes counted, packed or per rank. */
void sel_core_count_stored(struct sel_core *c, uint64_t bytes, bool packed);

/* ---- the end of the chain (design 2.15 "eviction below the instance") ---- */

/* Set (k NULL or k->offer NULL: clear) the level records go to before this
 * store would evict them.  Clearing ends every held record as kept. */
void sel_core_cascade_set(struct sel_core *c, const struct sel_cascade *k);
/* Maintenance, from the store's poll: while low(c, held units) says the
 * store's free capacity (with what the held records will free) is under its
 * floor, offer the least recently used evictable leaves (at most 64 looked
 * at per call, SEL_CASCADE_MAX held), each worth units(c, id), and the
 * parked ones the level's parked() lets through.  Returns the records
 * offered and taken. */
uint32_t sel_core_cascade_run(struct sel_core *c, bool (*low)(struct sel_core *c, uint64_t held),
			      uint64_t (*units)(struct sel_core *c, sel_node_id id));
/* The next level's answer for a held record: accepted (it holds a copy) --
 * the record leaves now when nothing else pins it and it is still a leaf
 * (counted evicted, not dropped), else it stays to be evicted later;
 * !accepted -- it stays local and offers pause for a backoff (50 ms,
 * doubling to 2 s, reset by an acceptance).  A key not held is ignored. */
void sel_core_cascade_end(struct sel_core *c, const sel_key *key, bool accepted);
/* Set (k NULL: clear) the observer of c's records. */
void sel_core_watch_set(struct sel_core *c, const struct sel_core_watch *k);
/* Whether key is held for the next level. */
bool sel_core_cascade_holds(const struct sel_core *c, const sel_key *key);
/* The core of a store built on the skeleton (its lookup is sel_core_lookup),
 * or NULL. */
struct sel_core *sel_store_core(sel_store *s);

/* ---- lookup and fetch ------------------------------------------------------ */

/* ops->lookup of a core store: the deepest restorable chain
 * (sel_index_lookup, counted), refused when a node of it carries a refuse
 * flag: 1 with *hit, 0 for a miss. */
int sel_core_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		    sel_hit *hit);

/* A chain as a fetch will read it. */
struct sel_chain_walk {
	sel_node_id end;
	const sel_node_id *ids; /* ascending: ids[0] is the first node above resident */
	uint32_t n;             /* nodes above resident */
	uint32_t skip;          /* pages of ids[0] the GPU already holds */
	uint32_t pages;         /* pages to upload */
};

/* Walk key's chain above resident: the endpoint READY with its row, every
 * node above resident READY and not refused, their tails summing to the
 * chain's pages.  0 with *w (ids valid until the next walk), or -ESTALE. */
int sel_core_walk(struct sel_core *c, const sel_key *key, uint64_t resident,
		  struct sel_chain_walk *w);

/* The fetch check: a running store, a hit and a destination, the walk, the
 * hit's page count, its chain digest, and the destination's page count,
 * state slot and page ids.  readable (may be NULL) must accept every node
 * of the chain, else -ESTALE with unreadable as the message's reason.  0
 * with *w, or -ESTALE, -EINVAL, -ENOMEM, SEL_ESTOPPED (nothing changed). */
int sel_core_fetch_check(struct sel_core *c, const sel_hit *hit, const sel_inbound *in,
			 bool (*readable)(struct sel_core *c, sel_node_id id),
			 const char *unreadable, struct sel_chain_walk *w);

/* A fetch ended (status 0: its bytes landed): counters, the tier's fitted
 * estimates and, for a failure, released capacity. */
void sel_core_count_fetched(struct sel_core *c, int status, uint64_t bytes, uint64_t ns,
			    uint32_t pages, uint64_t consumed, uint64_t resident);

/* ---- checks ------------------------------------------------------------------- */

/* The checks every core store starts with (its invariant "every live index
 * node has a live record and vice versa; store pins <= index pins"): the
 * index check, then for each node its record, visit (may be NULL: the
 * store's own per-node checks, which fail with SEL_ECORRUPT), its pins,
 * and last the record count.  0 or SEL_ECORRUPT naming the first
 * violation. */
int sel_core_check(struct sel_core *c,
		   int (*visit)(struct sel_core *c, sel_node_id id, const sel_index_node *n,
				void *ctx),
		   void *ctx);
/* Invariant "inflight_out / inflight_in count what is live": the puts and
 * fetches the store found on its lists (what names them in the message). */
int sel_core_check_inflight(struct sel_core *c, uint64_t puts, uint64_t fetches, const char *what);

/* ---- close and destroy ------------------------------------------------------ */

/* The end of a core store's close: rc 0, or SEL_ESTOPPED (the store is
 * stopped from now on); a second close returns it again. */
int sel_core_close_end(struct sel_core *c, int rc);
/* The start of a core store's destroy: a store not closed is closed,
 * draining within a bounded time.  Returns true when that close could not
 * drain (SEL_ESTOPPED): what a detached thread may still use must be
 * leaked (sel_leak), never freed; an owned pool is leaked already. */
bool sel_core_destroy_begin(sel_store *s);
/* Its end: the transfer set and an owned pool destroyed (or the set
 * leaked after SEL_ESTOPPED), then sel_core_free. */
void sel_core_destroy_end(struct sel_core *c);

/* ---- the rest ----------------------------------------------------------------- */

/* ops->touch of a core store: the record and its ancestors become the most
 * recently used. */
void sel_core_touch(sel_store *s, const sel_key *key);

/* Wake the store's threads for what this pass queued: the transfer set's
 * kick and flush_more (issue 18).  Every poll of a core store ends with
 * it.  sel_core_flush_op is ops->flush: its first call switches the
 * store's threads to deferred wakes (until then each call wakes its thread
 * itself, so a caller, or a wrapping store, that never flushes loses
 * nothing), and every call kicks. */
void sel_core_flush(struct sel_core *c);
void sel_core_flush_op(sel_store *s);

/* Store pins by key (the composite's calls): 0 or -ENOENT; unpin ignores
 * a key it does not hold. */
int sel_core_pin_key(struct sel_core *c, const sel_key *key);
void sel_core_unpin_key(struct sel_core *c, const sel_key *key);

/* Every indexed key, oldest first, into keys[0..cap); returns the count
 * (which may exceed cap). */
size_t sel_core_keys(struct sel_core *c, sel_key *keys, size_t cap);

/* The once-a-minute expiry sweep (design 2.5) with why SEL_WHY_EXPIRE;
 * droppable as sel_index_expire takes it.  Expired records release
 * capacity (progress). */
void sel_core_expire(struct sel_core *c,
		     bool (*droppable)(void *ctx, const sel_index *ix, sel_node_id id));

/* While the worker loops (polls within SEL_WARM_PERIOD_NS of each other),
 * the lookup's hash and the put's path, read only, once per period
 * (store_common.c "Keeping the lookup warm"); called at the top of a core
 * store's poll. */
void sel_core_keep_warm(struct sel_core *c);

/* The stats every core store reports: its counters, the pool's slots, the
 * tier's record count and fitted estimates. */
void sel_core_stats(struct sel_core *c, sel_stats *out);

/* Keep n pointers reachable for ever: what a detached copy or disk thread
 * may still use after a close that could not drain (design 2.5, 2.8). */
void sel_leak(void *const *what, size_t n);

/* SEL_DEBUG_CHECKS builds: run a module's checker after a mutation and
 * abort on the first violation (SQLite's assert_pager_state). */
#ifdef SEL_DEBUG_CHECKS
#define SEL_DEBUG_CHECK(check, s)                                                                  \
	do {                                                                                       \
		if ((check)(s) != 0) {                                                             \
			fprintf(stderr, "%s: %s\n", #check, eos_errmsg());                         \
			abort();                                                                   \
		}                                                                                  \
	} while (0)
#else
#define SEL_DEBUG_CHECK(check, s) ((void)(s))
#endif
/* The core store's own checker after a mutation (SEL_DEBUG_CHECKS). */
#define SEL_CORE_DEBUG(c) SEL_DEBUG_CHECK((c)->cops->check, &(c)->base)

#endif
