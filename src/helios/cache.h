/*
 * cache.h - the GPU prefix checkpoint cache of the reference engine
 * (design 2.1, 2.3 "Eviction", 2.12; the design's PrefixCheckpointCache).
 *
 * The cache owns the two id spaces of the model's cache memory:
 *   - page ids  0 .. n_pages-1: one logical page (page_tokens tokens) in
 *     every page plane;
 *   - row slots 0 .. n_rows-1:  one state row in the STATE_ROWS plane.
 * Every id is in exactly one state at any time:
 *   FREE     on a free list; its last GPU use has passed a completed fence,
 *            so anyone may write it at once (design 2.12);
 *   PENDING  released while a step that may still read or write it is in
 *            flight; it becomes FREE when that step's fence completes;
 *   CKPT     owned by one checkpoint (its tail pages, its snapshot row);
 *   OUT      handed out by hel_cache_alloc_*() to an owner outside the
 *            cache (the scheduler: a request's live row and new pages, an
 *            inbound ticket's destinations).
 *
 * Checkpoints are immutable prefix snapshots arranged in a tree keyed by
 * exact-endpoint PrefixKey (sel_key).  A checkpoint at consumed count c with
 * parent at p owns its tail pages: the complete pages since the parent's
 * endpoint, c/P - p/P of them for page_tokens P (a root owns c/P); its whole
 * page chain is its ancestors' tails followed by its own.  It owns one
 * snapshot row until compaction drops it ("page-only": it keeps its pages
 * for its descendants, no longer matches lookups, and no longer appears
 * under its key).  A checkpoint is READY once the fence of the step that
 * wrote it (ready_after) has completed; only ready checkpoints are found by
 * lookup, evicted, compacted or published.
 *
 * Fences.  The scheduler numbers the steps it submits (1, 2, ...) and tells
 * the cache: hel_cache_submit_fence(f) before the worker may run step f,
 * hel_cache_complete_fence(f) once step f (and every earlier one) finished.
 * Steps complete in order.  An id released while submitted > completed goes
 * to PENDING tagged with the submitted fence; otherwise straight to FREE.
 *
 * Pins.  A pin keeps a checkpoint, its row and its pages: pinned
 * checkpoints are neither evicted nor compacted.  Pins come from requests
 * (their prefix), inbound tickets (their GPU ancestor) and the worker (a
 * copy-out or export in flight, counted separately in xpins).
 *
 * Eviction (design 2.3): hel_cache_evict() removes the least recently used
 * unpinned ready leaf -- and then every page-only ancestor it leaves
 * childless -- or, when every leaf is pinned or not ready, compacts the
 * least recently used unpinned ready single-child checkpoint with a row.
 * Each logical retirement (a leaf removal or a compaction, not the later
 * physical removal of a page-only node) of a checkpoint flagged
 * HEL_CK_OFFERED queues a notice (key, generation, heir key for a
 * compaction).  The notice queue is bounded: on overflow it drops the
 * oldest notice and sets the "lost" flag returned by the next take.
 *
 * Lifetimes.  Pointers returned by hel_cache_get(), hel_cache_iter() and
 * the tree links inside hel_ckpt stay valid until the next call that
 * inserts, evicts, compacts or drops checkpoints.  Checkpoint ids are never
 * reused; a stale id simply finds nothing.
 *
 * Threading: single-threaded (the model worker owns the cache).
 * Errors: 0 or a negative errno with eos_errmsg()/sel_errmsg() set.
 */
#ifndef HEL_CACHE_H
#define HEL_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "selene.h"

#define HEL_NONE UINT32_MAX /* no page id / no row slot */
#define HEL_CKPT_NONE 0     /* no checkpoint (ids start at 1) */

typedef struct hel_cache hel_cache;

typedef struct hel_cache_config {
	uint32_t page_tokens; /* tokens per page: a positive multiple of 64 */
	uint32_t n_pages;     /* page ids 0 .. n_pages-1 */
	uint32_t n_rows;      /* row slots 0 .. n_rows-1 */
	uint32_t notice_cap;  /* eviction notice queue bound; 0 = 1024 */
} hel_cache_config;

/* Publication and bookkeeping flags of a checkpoint.  The cache reads only
 * HEL_CK_OFFERED (notices); the scheduler owns the meaning of the rest. */
enum hel_ckpt_flags {
	HEL_CK_DEFERRED = 1u << 0, /* offer waits for an exact resume (design 2.2) */
	HEL_CK_OFFERED = 1u << 1,  /* offered to the store, or restored from it */
	HEL_CK_QUEUED = 1u << 2,   /* waits in the scheduler's publication queue */
	HEL_CK_TAKEN = 1u << 3,    /* returned by take_publications at least once */
	HEL_CK_RESTORED = 1u << 4, /* created by an inbound restore */
	HEL_CK_MESSAGE = 1u << 5,  /* captured at a message boundary */
	HEL_CK_PROMPT = 1u << 6,   /* captured at the end of a prompt */
	HEL_CK_TERMINAL = 1u << 7, /* taken from a finished or preempted request */
};

/* A checkpoint.  Read-only outside cache.c. */
typedef struct hel_ckpt {
	uint64_t id;         /* never reused; >= 1 */
	uint64_t generation; /* creation sequence: a key re-created after its
				 eviction gets a larger one (notices name it) */
	sel_key key;         /* endpoint: key.consumed tokens */
	sel_digest bucket;   /* boundary digest at key.consumed / 64 */
	uint64_t parent_id;  /* HEL_CKPT_NONE for a root */
	uint32_t *tail;      /* owned tail page ids, in chain order */
	uint32_t n_tail;
	uint32_t row;   /* snapshot row, HEL_NONE once compacted */
	uint32_t pins;  /* every pin, including xpins */
	uint32_t xpins; /* pins held by the worker (copy-out, export) */
	uint32_t children;
	uint32_t flags;       /* enum hel_ckpt_flags */
	uint64_t ready_after; /* fence of the step that wrote it */
	uint64_t tick;        /* access order: larger is more recent */
	/* Tree links (read-only). */
	const struct hel_ckpt *parent, *first_child, *next_sibling;
	/* private */
	struct hel_ckpt *prev_sibling_, *lru_prev_, *lru_next_;
	uint32_t slot_;                 /* index in the cache's node table */
	uint32_t mark_, kept_children_; /* scratch of reclaimable/check */
} hel_ckpt;

typedef enum hel_id_state {
	HEL_ID_FREE = 0,
	HEL_ID_PENDING,
	HEL_ID_CKPT,
	HEL_ID_OUT,
} hel_id_state;

typedef struct hel_cache_counts {
	uint32_t pages_total, pages_free, pages_pending, pages_ckpt, pages_out;
	uint32_t rows_total, rows_free, rows_pending, rows_ckpt, rows_out;
	uint32_t checkpoints; /* in the tree, page-only ones included */
	uint32_t page_only;
	uint64_t submitted, completed; /* fences */
} hel_cache_counts;

/* An eviction notice for the store (design 2.15 "Evictions"). */
typedef struct hel_notice {
	sel_key key;
	uint64_t generation;
	sel_key heir; /* compaction: the child that took the pages; else none (zero) */
} hel_notice;

enum {
	HEL_EVICT_NONE = 0,
	HEL_EVICT_LEAF = 1,
	HEL_EVICT_COMPACT = 2
};

/* What one hel_cache_evict() did. */
typedef struct hel_eviction {
	int kind;        /* HEL_EVICT_* */
	uint64_t victim; /* id (already gone after a leaf eviction) */
	sel_key key;
	uint64_t generation;
	uint32_t victim_flags;
	uint64_t heir;    /* compaction: the only child's id */
	uint32_t pages;   /* page ids released (leaf and cascade) */
	uint32_t rows;    /* row slots released */
	uint32_t cascade; /* page-only ancestors removed after a leaf */
} hel_eviction;

/* What hel_cache_insert() takes over. */
typedef struct hel_ckpt_spec {
	sel_key key;
	sel_digest bucket;    /* boundary digest at key.consumed / 64 */
	uint64_t parent;      /* HEL_CKPT_NONE: a root */
	const uint32_t *tail; /* OUT page ids: key.consumed/P - parent/P of them */
	uint32_t n_tail;
	uint32_t row;         /* an OUT row slot */
	uint64_t ready_after; /* fence after which the bytes are complete */
	uint32_t flags;
} hel_ckpt_spec;

int hel_cache_create(const hel_cache_config *cfg, hel_cache **out);
/* Frees everything, pins or not.  NULL-safe. */
void hel_cache_destroy(hel_cache *c);
uint32_t hel_cache_page_tokens(const hel_cache *c);

/* ---- Ids and fences ------------------------------------------------------ */

/* Pop a FREE id, which becomes OUT.  -ENOSPC when the free list is empty
 * (the caller may evict and retry).  Never evicts by itself. */
int hel_cache_alloc_page(hel_cache *c, uint32_t *page);
int hel_cache_alloc_row(hel_cache *c, uint32_t *row);
/* Give back an OUT id whose last use may be in the submitted step:
 * PENDING until that fence completes, FREE at once when nothing is in
 * flight. */
void hel_cache_release_page(hel_cache *c, uint32_t page);
void hel_cache_release_row(hel_cache *c, uint32_t row);
/* Give back an OUT id that no submitted graph has touched (popped and not
 * used, or written only by a drained store transfer): FREE at once. */
void hel_cache_unalloc_page(hel_cache *c, uint32_t page);
void hel_cache_unalloc_row(hel_cache *c, uint32_t row);

/* Fence f (> the last submitted) is about to be submitted. */
void hel_cache_submit_fence(hel_cache *c, uint64_t f);
/* Every step up to f (<= submitted) has completed: PENDING ids tagged
 * <= f become FREE, checkpoints with ready_after <= f become READY. */
void hel_cache_complete_fence(hel_cache *c, uint64_t f);

void hel_cache_counts_get(const hel_cache *c, hel_cache_counts *out);
hel_id_state hel_cache_page_state(const hel_cache *c, uint32_t page);
hel_id_state hel_cache_row_state(const hel_cache *c, uint32_t row);

/* ---- Checkpoints --------------------------------------------------------- */

/* Create a checkpoint owning spec->tail and spec->row (both OUT; on success
 * they become CKPT, on failure they stay with the caller).  It is the most
 * recently used, and its ancestors are refreshed.  Errors: -EEXIST when a
 * checkpoint with a row already has the key (*out = its id), -ENOENT when
 * the parent is gone, -EINVAL for a wrong tail count, an id that is not
 * OUT, or a parent that does not end before the key; -ENOMEM. */
int hel_cache_insert(hel_cache *c, const hel_ckpt_spec *spec, uint64_t *out);

const hel_ckpt *hel_cache_get(const hel_cache *c, uint64_t id);
static inline bool hel_ckpt_has_row(const hel_ckpt *k) { return k->row != UINT32_MAX; }
bool hel_cache_ready(const hel_cache *c, const hel_ckpt *k);
/* Pages in k's whole chain: key.consumed / page_tokens. */
uint32_t hel_cache_chain_len(const hel_cache *c, const hel_ckpt *k);
/* Write k's whole chain (root first) into out[cap]; returns the count or
 * -ENOSPC when cap is too small. */
int hel_cache_chain(const hel_cache *c, const hel_ckpt *k, uint32_t *out, size_t cap);

/* The checkpoint with a row and this key (ready or not), or NULL. */
const hel_ckpt *hel_cache_find(const hel_cache *c, const sel_key *key);
/* The deepest READY checkpoint with a row whose key is h's key at its
 * consumed count c, with c <= limit.  Probes the bucket of each aligned
 * boundary from min(len, limit)/64 downwards and stops at the first bucket
 * with a match, so a hit costs about (len - c)/64 probes plus one key
 * hash per candidate.  Pins and touches nothing.  NULL for a miss. */
const hel_ckpt *hel_cache_lookup(const hel_cache *c, const sel_history *h, uint64_t limit);

/* Make id and its ancestors the most recently used. */
void hel_cache_touch(hel_cache *c, uint64_t id);
/* Pin / unpin (worker: also count in xpins).  -ENOENT if id is gone,
 * -EINVAL to unpin a checkpoint without such a pin or to pin a page-only
 * one. */
int hel_cache_pin(hel_cache *c, uint64_t id, bool worker);
int hel_cache_unpin(hel_cache *c, uint64_t id, bool worker);
/* flags = (flags | set) & ~clear.  -ENOENT if gone. */
int hel_cache_set_flags(hel_cache *c, uint64_t id, uint32_t set, uint32_t clear);

/* One eviction step (see the top of this file); *ev describes it.  Returns
 * HEL_EVICT_LEAF, HEL_EVICT_COMPACT or HEL_EVICT_NONE (nothing evictable). */
int hel_cache_evict(hel_cache *c, hel_eviction *ev);

/* What repeated eviction could still release, were checkpoint extra_pin
 * (HEL_CKPT_NONE for none) pinned once more: the pages and rows of every
 * subtree free of pins and unready checkpoints, plus the row of each
 * unpinned ready checkpoint left with exactly one kept child.  O(n). */
void hel_cache_reclaimable(hel_cache *c, uint64_t extra_pin, uint32_t *pages, uint32_t *rows);
/* The same were each of extra[0..n_extra) pinned once more (ids that are
 * HEL_CKPT_NONE or gone count for nothing): design 2.15's
 * reclaimable_if_pinned, for export_fits (the export's checkpoint and the
 * next admission's GPU prefix). */
void hel_cache_reclaimable_if_pinned(hel_cache *c, const uint64_t *extra, size_t n_extra,
				     uint32_t *pages, uint32_t *rows);

/* Up to cap queued notices, oldest first; *lost (may be NULL) receives and
 * clears the overflow flag.  Returns the count. */
size_t hel_cache_take_notices(hel_cache *c, hel_notice *out, size_t cap, bool *lost);
size_t hel_cache_notices_queued(const hel_cache *c);

/* Shutdown: forget every checkpoint regardless of pins; its ids are
 * released as by hel_cache_release_*.  Queues no notices. */
void hel_cache_drop_all(hel_cache *c);

/* Iterate every checkpoint (any order): start with *cursor = 0; NULL at
 * the end. */
const hel_ckpt *hel_cache_iter(const hel_cache *c, size_t *cursor);

/* Verify every invariant of cache.c; 0, or -EUCLEAN with a message naming
 * the first violation.  O(n_pages + n_rows + checkpoints). */
int hel_cache_check(const hel_cache *c);

#endif
