/*
 * index.h - the in-memory checkpoint tree every store owns (design 2.3).
 *
 * Internal to libselene.  Single writer (the model worker thread), no locks.
 *
 * A node is one record: the exact-endpoint PrefixKey, the parent it extends,
 * the tail pages it owns (the complete pages since its parent's endpoint, or
 * its whole chain when it is a root), whether it still holds its row, and the
 * store's bookkeeping (location, state, pins).  Node ids are small integers,
 * stable for the node's life and reused after removal.
 *
 * Ownership rules:
 *   - A node's parent is always present; a parent is removed only once it has
 *     no children.  A record published while its parent is absent becomes a
 *     root holding its complete page chain.
 *   - A page-only node (row dropped) with no children is useless and is
 *     removed as soon as it is unpinned and the store allows it.  A node
 *     inserted without its row is exempt (SEL_NODE_UNPRUNED) until it gets
 *     a child or sel_index_prune runs.
 *   - Pins (readers, writers, spills) keep a node, its row and its storage:
 *     eviction, compaction and row drops wait until the last unpin.
 *   - The index never frees store storage itself: it calls ops->drop_row
 *     before marking a row gone and ops->remove before forgetting a node.
 */
#ifndef SEL_INDEX_H
#define SEL_INDEX_H

#include "selene.h"

typedef uint32_t sel_node_id;
#define SEL_NODE_NONE UINT32_MAX
#define SEL_TAIL_AUTO UINT32_MAX

enum sel_node_state {
	SEL_NODE_PENDING = 0, /* inserted; its bytes are not complete yet */
	SEL_NODE_READY = 1,   /* committed: readable, can be on a lookup chain */
};

enum sel_node_flags {
	SEL_NODE_HAS_ROW = 1u << 0,  /* the endpoint row is stored */
	SEL_NODE_DROP_ROW = 1u << 1, /* row drop waits for the last unpin */
	SEL_NODE_NOEVICT = 1u << 2,  /* store says: not evictable now (composite: not durable) */
	SEL_NODE_UNPRUNED = 1u << 3, /* inserted without a row and no child yet: kept for the
					  * children a startup scan inserts later, until it gets
					  * one or sel_index_prune runs (index-owned) */
	/* bits 4..7 are reserved for the index; bits 8..15 are free for the owning store */
};

typedef struct sel_index_node {
	sel_key key;
	sel_digest bucket;  /* boundary digest at key.consumed / 64 */
	uint64_t loc;       /* store-defined location (slots, file id, ...) */
	uint64_t tick;      /* access order: larger is more recent */
	sel_node_id parent; /* SEL_NODE_NONE for a root */
	uint32_t children;
	uint32_t tail_pages;
	uint32_t pins;
	uint8_t state; /* enum sel_node_state */
	uint8_t pad_;
	uint16_t flags; /* enum sel_node_flags | store bits */
	/* private links */
	sel_node_id lru_prev, lru_next; /* all nodes, oldest first */
	sel_node_id bnext;              /* next node in the same bucket, deeper first */
	uint32_t user;                  /* free for the owning store */
} sel_index_node;

typedef struct sel_index sel_index;

/* Store callbacks.  All optional.  Called synchronously from index calls,
 * on the index's thread; they must not call back into the index except to
 * read nodes. */
struct sel_index_ops {
	/* Free the storage of id's row; the index clears HAS_ROW afterwards. */
	void (*drop_row)(void *ctx, sel_index *ix, sel_node_id id);
	/* Free all storage of id; the index forgets the node afterwards. */
	void (*remove)(void *ctx, sel_index *ix, sel_node_id id);
	/* Optional (may be NULL): id became READY (sel_index_commit). */
	void (*commit)(void *ctx, sel_index *ix, sel_node_id id);
};

/* page_tokens: positive multiple of SEL_BUCKET_TOKENS. */
int sel_index_create(uint32_t page_tokens, const struct sel_index_ops *ops, void *ctx,
		     sel_index **out);
/* Forgets every node without calling ops (the store frees its storage
 * itself).  NULL-safe. */
void sel_index_destroy(sel_index *ix);

uint64_t sel_index_count(const sel_index *ix);
uint32_t sel_index_page_tokens(const sel_index *ix);
/* The node of a live id, or NULL.  The store may write loc, user and flag
 * bits 8..15; everything else belongs to the index (NOEVICT changes through
 * sel_index_set_evictable).  Valid until the node is removed; the node
 * array moves when an insert grows it. */
sel_index_node *sel_index_get(sel_index *ix, sel_node_id id);
const sel_index_node *sel_index_cget(const sel_index *ix, sel_node_id id);
/* The id of key, or SEL_NODE_NONE. */
sel_node_id sel_index_find(const sel_index *ix, const sel_key *key);

/* Insert.  parent may be NULL.  tail is the page count the record holds, or
 * SEL_TAIL_AUTO to derive it:
 *   - parent present: derived tail = c/pt - p/pt; tail must be AUTO, the
 *     derived count (linked under the parent) or the full chain c/pt (stored
 *     as a root although its parent exists);
 *   - parent absent or NULL: the record must hold its full chain c/pt (AUTO
 *     selects it) and becomes a root; any other tail returns -ENOENT (an
 *     orphan whose ancestors are gone).
 * The parent's consumed count must be below key's (-EINVAL), and key must
 * consume at least one token.  A parent equal to the none key counts as
 * NULL.  A key already present returns -EEXIST with *out set to the
 * existing node (dedupe), changing nothing.  The new node is PENDING,
 * unpinned, most recently used, and its ancestors are refreshed.  Without
 * has_row it is page-only and SEL_NODE_UNPRUNED.  out may be NULL.
 */
int sel_index_insert(sel_index *ix, const sel_key *key, const sel_key *parent,
		     const sel_digest *bucket, uint32_t tail, bool has_row, sel_node_id *out);

/* Mark id READY (its bytes are complete).  If its parent is not a root,
 * holds its row, and id is its only child, the parent's row is dropped
 * (design 2.3), now or, when the parent is pinned, at its last unpin
 * (SEL_NODE_DROP_ROW) -- unless the parent has no children by then, when it
 * keeps its row. */
void sel_index_commit(sel_index *ix, sel_node_id id);

void sel_index_pin(sel_index *ix, sel_node_id id);
/* Drops pending row drops and useless page-only leaves at the last unpin. */
void sel_index_unpin(sel_index *ix, sel_node_id id);

/* Make id and its ancestors the most recently used. */
void sel_index_touch(sel_index *ix, sel_node_id id);

/* Allow or forbid eviction/compaction of id (NOEVICT flag).  Allowing it
 * may remove a page-only leaf at once. */
void sel_index_set_evictable(sel_index *ix, sel_node_id id, bool evictable);

/* Remove leaf id (no children, unpinned; NOEVICT does not stop an explicit
 * removal): ops->remove, then page-only ancestors left childless go too,
 * each if unpinned and evictable.  Returns -EBUSY if id has children or
 * pins. */
int sel_index_remove(sel_index *ix, sel_node_id id);

/* Drop id's row now (ops->drop_row).  -EBUSY if pinned, -ENOENT if it has
 * none.  A childless node is removed instead of becoming page-only. */
int sel_index_drop_row(sel_index *ix, sel_node_id id);

/* One step of tree eviction: remove the least recently used unpinned,
 * evictable leaf; if none, compact the least recently used unpinned,
 * evictable single-child node that has a row (drop the row, keep the pages).
 * Returns 1 when a leaf was removed, 2 when a node was compacted, 0 when
 * nothing can be evicted.  *victim (may be NULL) receives the node id, which
 * is already invalid for a removal. */
int sel_index_evict(sel_index *ix, sel_node_id *victim);

/* Remove every unpinned childless page-only node, cascading upwards through
 * unpinned page-only ancestors left childless, whatever their NOEVICT flag
 * (startup).  Clears SEL_NODE_UNPRUNED on the survivors.  Returns the number
 * of nodes removed. */
uint64_t sel_index_prune(sel_index *ix);

/* The restorable chain of a lookup, ascending (ancestor first). */
typedef struct sel_index_chain {
	sel_node_id *ids;
	uint32_t n, cap;
	uint64_t consumed;   /* endpoint's consumed count c */
	uint64_t base;       /* stopping parent's consumed count p (0 at a root) */
	uint32_t pages;      /* sum of chain tail pages = c/pt - p/pt */
	uint32_t skip_pages; /* a/pt - p/pt: chain pages the GPU already holds */
	sel_digest digest;   /* the chain digest (internal.h, sel_hit.chain) */
	/* Candidates the last lookup passed over because a node of their chain
	 * did not match the history (a forged or stale parent link). */
	uint32_t rejected;
} sel_index_chain;

void sel_index_chain_free(sel_index_chain *ch);

/* Find the deepest restorable endpoint for history h above the GPU-resident
 * count `resident` (a) and at or below `limit`: probe the bucket of each
 * aligned boundary from min(len, limit)/64 down to a/64; a node qualifies
 * when it is READY with a row, resident < c <= limit, and h's key at c
 * equals its key; it is feasible when every node on its parent walk with a
 * consumed count above a is READY.  The walk stops at a parent at or below
 * a (base p) or after a root (base 0).  Buckets are probed deepest first and
 * each bucket's nodes deepest first, so the first feasible candidate is the
 * deepest.  Returns 1 with the chain filled, 0 for a miss (out->n = 0), or
 * -ENOMEM.  Does not touch or pin anything.  out starts zeroed; its ids are
 * reused and grown across calls; free it with sel_index_chain_free. */
int sel_index_lookup(const sel_index *ix, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_index_chain *out);

/* The chain digest (sel_hit.chain) of the restore of endpoint end above
 * resident, walking the tree as it is now: the check every fetch makes
 * before it reads.  0, or -ENOMEM. */
int sel_index_chain_digest(const sel_index *ix, sel_node_id end, uint64_t resident,
			   sel_digest *out);

/* ---- Last use and expiry (design 2.5, "Host record expiry") ------------
 *
 * Every node has a last-use time in nanoseconds, kept in memory only.
 * Insert and touch stamp the node and each ancestor with one stamp: the
 * clock's reading, but never less than the last stamp given, so from then
 * on the access order is last-use order (oldest first).  Without a clock
 * the stamp stays at the newest seed (0 when none).  Recovered nodes keep
 * their own file's time; see index.c DESIGN for the one way the two orders
 * can then differ. */

/* The store's clock (ns; NULL: none).  Set it when expiry is on. */
void sel_index_set_clock(sel_index *ix, uint64_t (*now_ns)(void));
/* id's last-use time (0 for a dead id). */
uint64_t sel_index_used_ns(const sel_index *ix, sel_node_id id);
/* The last stamp given or seeded. */
uint64_t sel_index_stamp(const sel_index *ix);
/* Startup: id was last used at ns (its file's mtime; the caller clamps it
 * to the present).  Changes no access order: call sel_index_order_by_use
 * once every node is seeded. */
void sel_index_seed_used(sel_index *ix, sel_node_id id, uint64_t ns);
/* Sort the access order by the newest last use in each node's subtree
 * (oldest first; equal times deeper first, so parents stay after their
 * children) and renumber the ticks.  0 or -ENOMEM (nothing changed). */
int sel_index_order_by_use(sel_index *ix);

/* The expiry rule, shared by the stores' sweeps and `flare records gc`: a
 * record is expired when it was last used before cutoff (now - max age). */
static inline bool sel_index_expired(uint64_t used_ns, uint64_t cutoff_ns)
{
	return used_ns < cutoff_ns;
}

/* The expiry walk: from the oldest node, pass over interior nodes, pinned
 * ones and those droppable (may be NULL) refuses; stop at the first leaf
 * that is not expired (the stores' bounded sweep) -- or, with all, pass
 * over fresh leaves too (tools) -- or after max_leaves removals.  Each
 * expired leaf is removed like sel_index_remove (ops->remove, then
 * page-only ancestors it leaves useless); an ancestor left a leaf with its
 * row is judged in its turn later in the walk.  Returns the leaves removed
 * (cascaded ancestors not counted). */
uint32_t sel_index_expire(sel_index *ix, uint64_t cutoff_ns, uint32_t max_leaves, bool all,
			  bool (*droppable)(void *ctx, const sel_index *ix, sel_node_id id),
			  void *ctx);

/* Iterate in access order, oldest first: start with SEL_NODE_NONE; returns
 * SEL_NODE_NONE after the newest. */
sel_node_id sel_index_next_lru(const sel_index *ix, sel_node_id after);

/* Verify every invariant; 0 or SEL_ECORRUPT with sel_errmsg() naming the
 * first violation.  O(n). */
int sel_index_check(const sel_index *ix);

/* Approximate bytes used per node (node array, hash tables). */
double sel_index_bytes_per_node(const sel_index *ix);

#endif
