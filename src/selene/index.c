/*
 * index.c - the in-memory checkpoint tree every store owns (design 2.3,
 * "Index and lookup"; the pin rules of design 2.12; the last-use times and
 * the expiry walk of design 2.5, "Host record expiry").
 *
 * The index answers one question fast -- "what is the deepest restorable
 * checkpoint for this request above what the GPU already holds?" -- and keeps
 * the tree bookkeeping the stores need around it: parents and child counts,
 * tail pages, pins, rows, and the access order that drives leaf-first
 * eviction and ancestor compaction.  It never touches store storage; it
 * calls ops->drop_row and ops->remove and lets the store free bytes.
 *
 * DESIGN
 *   Nodes live in one growable array indexed by sel_node_id; removed ids go
 *   on a free list threaded through lru_next and are reused.  Three
 *   structures index the array:
 *
 *   - A key table: open addressing with linear probing over a power-of-two
 *     array of ids, hashed by the first 8 digest bytes xor the consumed
 *     count.  Deletion shifts later entries back (no tombstones), so a probe
 *     stops at the first empty slot.
 *   - A bucket table of the same kind, keyed by bucket digest, holding the
 *     head of a singly linked chain (node.bnext) of every node in that
 *     bucket, deepest endpoint first.  Lookup walks the history's aligned
 *     boundaries downwards and each chain downwards, so the first feasible
 *     candidate is the deepest one.  A bucket holds the endpoints of one
 *     64-token block of one prefix, so it holds at most 64 distinct consumed
 *     counts and lookup hashes each at most once.
 *   - One LRU list of all nodes (lru_prev/lru_next), oldest at the head.  A
 *     touch gives the node a fresh tick and moves it to the tail, then does
 *     the same for each ancestor walking up.  Ancestors are therefore always
 *     more recent than their descendants, the head is always a leaf, and the
 *     first unpinned evictable leaf from the head is the least recently used
 *     one.
 *
 *   Rows.  A node inserted with its row has SEL_NODE_HAS_ROW.  The row goes
 *   (ops->drop_row, flag cleared) on an explicit sel_index_drop_row, on
 *   compaction, and when the node is not a root and its only child commits
 *   ("each tier drops a non-root record's row once its only child commits");
 *   a pinned node gets SEL_NODE_DROP_ROW instead and loses the row at its
 *   last unpin, unless it has lost its children by then (the row is wanted
 *   again).  A page-only node stops matching lookups but still supplies
 *   pages to its descendants' chains.  A row drop on a childless node removes
 *   the node instead: it would be useless.
 *
 *   Removal cascades.  Removing a node decrements its parent's child count;
 *   a parent left childless, page-only, unpinned and evictable is removed
 *   too, and so on upwards.  A useless node that is pinned or not evictable
 *   goes at its last unpin or when it is made evictable.  The exception is a
 *   node inserted without its row (a startup scan inserting a truncated
 *   record before its children): it carries SEL_NODE_UNPRUNED until it gets
 *   a child or sel_index_prune runs, which removes the ones still useless.
 *
 *   Last use.  Beside the logical tick, every node has a last-use time in
 *   nanoseconds (a parallel array, so the node stays within 96 bytes).
 *   The touch that refreshes a node's tick stamps it and each ancestor
 *   with one stamp: the store's clock when it gave one
 *   (sel_index_set_clock), never less than the last stamp given, so a
 *   clock stepping back never reorders anything.  Startup seeds each
 *   node's time from its own file's mtime (sel_index_seed_used; design
 *   2.5, "recovery uses file mtime") and sorts the LRU list by the newest
 *   time in each node's subtree (sel_index_order_by_use), so parents stay
 *   after their children.  A touch moves the node and its ancestors to the
 *   tail with a stamp no older than any other, so the list stays in that
 *   order and the expiry walk (sel_index_expire) can start at the head and
 *   stop at the first fresh leaf.  The one exception is a recovered parent
 *   whose own file is older than its children's: once its children go, it
 *   is an old leaf behind fresher ones and expires only when the walk
 *   reaches it -- the delay design 2.5 accepts ("a record reused from disk
 *   but never rewritten may expire up to one max age early", and the
 *   reverse).  The times live only in memory.
 *
 *   Lookup never writes: it reads the tables, computes at most one key per
 *   distinct candidate consumed count, and grows only the caller's chain.
 *   Its cost is one table probe per boundary between the resident count and
 *   the history's end (the new tokens / 64), one BLAKE2b per qualifying
 *   candidate, and the parent walk above the resident count with one
 *   BLAKE2b per ancestor on it -- not the history length.
 *
 *   Parent links are not trusted.  A recovered node's parent came from its
 *   file's header, and anyone who can write the directory can make it name
 *   another prefix's record of the same consumed count (design 2.3's
 *   feasibility alone would then restore that prefix's pages under this
 *   one's row).  So every ancestor on a candidate's walk must have the key
 *   the request's history gives at its consumed count, or the candidate is
 *   infeasible; the chain found is digested (internal.h,
 *   sel_chain_digest_add) so that fetch, which re-walks the tree later
 *   without the history, can prove it reads exactly these nodes.
 *
 *   Building with -DSEL_DEBUG_CHECKS (make check-asan) runs
 *   sel_index_check after every mutation and aborts on the first
 *   violation.
 *
 * INVARIANTS (verified by sel_index_check)
 *   1. The key table maps the key of every live node to its id and holds
 *      nothing else; every entry is reachable from its home slot without
 *      crossing an empty slot.
 *   2. The bucket table maps each bucket digest in use to a chain holding
 *      exactly the live nodes with that bucket, ordered by consumed count,
 *      non-increasing.  Every live node is on exactly one chain.
 *   3. A node's parent is live and has a smaller consumed count; its child
 *      count equals the number of live nodes naming it as parent.
 *   4. tail_pages == c/pt - p/pt for a node with parent endpoint p, and
 *      c/pt for a root (c its consumed count, pt the page tokens).  Hence
 *      a chain's tails sum to c/pt - p/pt for its stopping parent p.
 *   5. The LRU list holds every live node exactly once, ticks strictly
 *      increase from head to tail, and tick(parent) > tick(child); so the
 *      head is a leaf and leaves leave in least-recently-used order.
 *   6. No live node is childless, page-only, unpinned, evictable and not
 *      UNPRUNED; UNPRUNED marks only childless page-only nodes.
 *   7. DROP_ROW is set only on pinned nodes that have their row.
 *   8. Free-list ids are below the used count, not live, and together with
 *      the live nodes account for every used id.
 *   9. No last-use time exceeds the last stamp.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "index_int.h"
#include "internal.h"

/* ---- hashing and tables ------------------------------------------------ */

static inline uint64_t mix(uint64_t h) { return h * 0x9e3779b97f4a7c15ull; }

static inline uint64_t digest_word(const sel_digest *d)
{
	uint64_t w;
	memcpy(&w, d->b, sizeof w);
	return w;
}

static inline uint64_t key_hash(const sel_key *k)
{
	return mix(digest_word(&k->digest) ^ k->consumed);
}

static inline uint64_t bucket_hash(const sel_digest *d) { return mix(digest_word(d)); }

static inline uint64_t home_of(const struct idtable *t, uint64_t h) { return h >> (64 - t->bits); }

static inline uint64_t entry_hash(const sel_index *ix, const struct idtable *t, sel_node_id id)
{
	return t->by_bucket ? bucket_hash(&N(ix, id)->bucket) : key_hash(&N(ix, id)->key);
}

static int table_init(struct idtable *t, uint32_t bits, bool by_bucket)
{
	size_t cap = (size_t)1 << bits;
	t->slot = malloc(cap * sizeof *t->slot);
	if (!t->slot)
		return -ENOMEM;
	memset(t->slot, 0xff, cap * sizeof *t->slot); /* SEL_NODE_NONE */
	t->bits = bits;
	t->by_bucket = by_bucket;
	t->used = 0;
	return 0;
}

/* Place id (not present) at the first empty slot from its home. */
static void table_put(const sel_index *ix, struct idtable *t, sel_node_id id)
{
	uint64_t mask = ((uint64_t)1 << t->bits) - 1;
	uint64_t i = home_of(t, entry_hash(ix, t, id));
	while (t->slot[i] != SEL_NODE_NONE)
		i = (i + 1) & mask;
	t->slot[i] = id;
	t->used++;
}

/* Make room for one more entry, keeping the load at most 3/4. */
static int table_reserve(const sel_index *ix, struct idtable *t)
{
	uint64_t cap = (uint64_t)1 << t->bits;
	if ((t->used + 1) * 4 <= cap * 3)
		return 0;
	if (t->bits >= 31)
		return -ENOMEM;
	struct idtable nt;
	if (table_init(&nt, t->bits + 1, t->by_bucket))
		return -ENOMEM;
	for (uint64_t i = 0; i < cap; i++)
		if (t->slot[i] != SEL_NODE_NONE)
			table_put(ix, &nt, t->slot[i]);
	free(t->slot);
	*t = nt;
	return 0;
}

/* Remove the entry at slot i, shifting later entries of the probe run back
 * so that no probe ever needs a tombstone. */
static void table_del(const sel_index *ix, struct idtable *t, uint64_t i)
{
	uint64_t mask = ((uint64_t)1 << t->bits) - 1;
	uint64_t j = i;
	for (;;) {
		j = (j + 1) & mask;
		sel_node_id e = t->slot[j];
		if (e == SEL_NODE_NONE)
			break;
		uint64_t home = home_of(t, entry_hash(ix, t, e));
		/* e may fill the hole at i unless its home lies in (i, j]. */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			t->slot[i] = e;
			i = j;
		}
	}
	t->slot[i] = SEL_NODE_NONE;
	t->used--;
}

/* Slot holding key k, or UINT64_MAX. */
uint64_t ix_key_slot(const sel_index *ix, const sel_key *k)
{
	const struct idtable *t = &ix->keys;
	uint64_t mask = ((uint64_t)1 << t->bits) - 1;
	for (uint64_t i = home_of(t, key_hash(k));; i = (i + 1) & mask) {
		sel_node_id e = t->slot[i];
		if (e == SEL_NODE_NONE)
			return UINT64_MAX;
		if (sel_key_eq(&N(ix, e)->key, k))
			return i;
	}
}

/* Slot holding the chain of bucket d, or UINT64_MAX. */
uint64_t ix_bucket_slot(const sel_index *ix, const sel_digest *d)
{
	const struct idtable *t = &ix->buckets;
	uint64_t mask = ((uint64_t)1 << t->bits) - 1;
	for (uint64_t i = home_of(t, bucket_hash(d));; i = (i + 1) & mask) {
		sel_node_id e = t->slot[i];
		if (e == SEL_NODE_NONE)
			return UINT64_MAX;
		if (digest_eq(&N(ix, e)->bucket, d))
			return i;
	}
}

/* ---- bucket chains and the LRU list ------------------------------------ */

static void bucket_link(sel_index *ix, sel_node_id id)
{
	sel_index_node *n = N(ix, id);
	uint64_t s = ix_bucket_slot(ix, &n->bucket);
	if (s == UINT64_MAX) {
		n->bnext = SEL_NODE_NONE;
		table_put(ix, &ix->buckets, id);
		return;
	}
	sel_node_id *link = &ix->buckets.slot[s];
	while (*link != SEL_NODE_NONE && N(ix, *link)->key.consumed > n->key.consumed)
		link = &N(ix, *link)->bnext;
	n->bnext = *link;
	*link = id; /* becoming the head rewrites the table slot itself */
}

static void bucket_unlink(sel_index *ix, sel_node_id id)
{
	sel_index_node *n = N(ix, id);
	uint64_t s = ix_bucket_slot(ix, &n->bucket);
	assert(s != UINT64_MAX);
	if (ix->buckets.slot[s] == id) {
		if (n->bnext == SEL_NODE_NONE)
			table_del(ix, &ix->buckets, s);
		else
			ix->buckets.slot[s] = n->bnext;
		return;
	}
	sel_node_id p = ix->buckets.slot[s];
	while (N(ix, p)->bnext != id)
		p = N(ix, p)->bnext;
	N(ix, p)->bnext = n->bnext;
}

static void lru_unlink(sel_index *ix, sel_node_id id)
{
	sel_index_node *n = N(ix, id);
	if (n->lru_prev != SEL_NODE_NONE)
		N(ix, n->lru_prev)->lru_next = n->lru_next;
	else
		ix->lru_head = n->lru_next;
	if (n->lru_next != SEL_NODE_NONE)
		N(ix, n->lru_next)->lru_prev = n->lru_prev;
	else
		ix->lru_tail = n->lru_prev;
}

static void lru_append(sel_index *ix, sel_node_id id)
{
	sel_index_node *n = N(ix, id);
	n->lru_next = SEL_NODE_NONE;
	n->lru_prev = ix->lru_tail;
	if (ix->lru_tail != SEL_NODE_NONE)
		N(ix, ix->lru_tail)->lru_next = id;
	else
		ix->lru_head = id;
	ix->lru_tail = id;
}

/* The stamp of a touch: the clock, but never before the last stamp
 * (invariant 9 holds whatever the clock does). */
static uint64_t next_stamp(sel_index *ix)
{
	if (ix->now_ns) {
		uint64_t t = ix->now_ns();
		if (t > ix->stamp)
			ix->stamp = t;
	}
	return ix->stamp;
}

/* Fresh ticks for id, then each ancestor: parents stay newer (inv. 5), and
 * all get one last-use stamp (inv. 9). */
static void touch(sel_index *ix, sel_node_id id)
{
	uint64_t t = next_stamp(ix);
	while (id != SEL_NODE_NONE) {
		sel_index_node *n = N(ix, id);
		n->tick = ++ix->clock;
		ix->last_use[id] = t;
		if (ix->lru_tail != id) {
			lru_unlink(ix, id);
			lru_append(ix, id);
		}
		id = n->parent;
	}
}

/* ---- removal and rows -------------------------------------------------- */

#ifdef SEL_DEBUG_CHECKS
static void debug_check(const sel_index *ix)
{
	if (sel_index_check(ix)) {
		fprintf(stderr, "selene: %s\n", sel_errmsg());
		abort();
	}
}
#else
static inline void debug_check(const sel_index *ix) { (void)ix; }
#endif

/* Forget one node (storage freed through ops->remove first); returns its
 * parent. */
static sel_node_id forget(sel_index *ix, sel_node_id id)
{
	if (ix->ops.remove)
		ix->ops.remove(ix->ctx, ix, id);
	sel_index_node *n = N(ix, id);
	uint64_t s = ix_key_slot(ix, &n->key);
	assert(s != UINT64_MAX);
	table_del(ix, &ix->keys, s);
	bucket_unlink(ix, id);
	lru_unlink(ix, id);
	sel_node_id p = n->parent;
	if (p != SEL_NODE_NONE)
		N(ix, p)->children--;
	n->state = NODE_FREE;
	n->flags = 0;
	n->lru_prev = SEL_NODE_NONE;
	n->lru_next = ix->free_head;
	ix->free_head = id;
	ix->nfree++;
	ix->count--;
	return p;
}

/* Remove id, then every ancestor it leaves useless.  In prune mode an
 * ancestor goes when childless, page-only and unpinned, whatever its
 * NOEVICT flag.  Returns the number of nodes removed. */
static uint64_t remove_cascade(sel_index *ix, sel_node_id id, bool prune)
{
	uint64_t removed = 0;
	while (id != SEL_NODE_NONE) {
		sel_node_id p = forget(ix, id);
		removed++;
		if (p == SEL_NODE_NONE)
			break;
		const sel_index_node *pn = N(ix, p);
		bool go = prune ? pn->children == 0 && !(pn->flags & SEL_NODE_HAS_ROW) &&
					  pn->pins == 0
				: useless(pn);
		id = go ? p : SEL_NODE_NONE;
	}
	return removed;
}

static void drop_row_now(sel_index *ix, sel_node_id id)
{
	if (ix->ops.drop_row)
		ix->ops.drop_row(ix->ctx, ix, id);
	N(ix, id)->flags &= (uint16_t) ~(SEL_NODE_HAS_ROW | SEL_NODE_DROP_ROW);
}

/* ---- life cycle and accessors ------------------------------------------ */

int sel_index_create(uint32_t page_tokens, const struct sel_index_ops *ops, void *ctx,
		     sel_index **out)
{
	*out = NULL;
	if (page_tokens == 0 || page_tokens % SEL_BUCKET_TOKENS)
		return eos_fail(-EINVAL,
				"index: page tokens %" PRIu32 " is not a positive multiple of %d",
				page_tokens, SEL_BUCKET_TOKENS);
	sel_index *ix = calloc(1, sizeof *ix);
	if (!ix)
		return eos_fail(-ENOMEM, "index: out of memory");
	ix->page_tokens = page_tokens;
	if (ops)
		ix->ops = *ops;
	ix->ctx = ctx;
	ix->free_head = ix->lru_head = ix->lru_tail = SEL_NODE_NONE;
	if (table_init(&ix->keys, MIN_TABLE_BITS, false) ||
	    table_init(&ix->buckets, MIN_TABLE_BITS, true)) {
		sel_index_destroy(ix);
		return eos_fail(-ENOMEM, "index: out of memory");
	}
	*out = ix;
	return 0;
}

void sel_index_destroy(sel_index *ix)
{
	if (!ix)
		return;
	free(ix->nodes);
	free(ix->last_use);
	free(ix->keys.slot);
	free(ix->buckets.slot);
	free(ix);
}

uint64_t sel_index_count(const sel_index *ix) { return ix->count; }

uint32_t sel_index_page_tokens(const sel_index *ix) { return ix->page_tokens; }

sel_index_node *sel_index_get(sel_index *ix, sel_node_id id)
{
	return live(ix, id) ? N(ix, id) : NULL;
}

const sel_index_node *sel_index_cget(const sel_index *ix, sel_node_id id)
{
	return live(ix, id) ? N(ix, id) : NULL;
}

sel_node_id sel_index_find(const sel_index *ix, const sel_key *key)
{
	uint64_t s = ix_key_slot(ix, key);
	return s == UINT64_MAX ? SEL_NODE_NONE : ix->keys.slot[s];
}

sel_node_id sel_index_next_lru(const sel_index *ix, sel_node_id after)
{
	if (after == SEL_NODE_NONE)
		return ix->lru_head;
	return live(ix, after) ? N(ix, after)->lru_next : SEL_NODE_NONE;
}

double sel_index_bytes_per_node(const sel_index *ix)
{
	double bytes = (double)sizeof *ix +
		       (double)ix->cap * (sizeof(sel_index_node) + sizeof(uint64_t)) +
		       (double)((uint64_t)1 << ix->keys.bits) * sizeof(sel_node_id) +
		       (double)((uint64_t)1 << ix->buckets.bits) * sizeof(sel_node_id);
	return ix->count ? bytes / (double)ix->count : bytes;
}

/* ---- insert ------------------------------------------------------------ */

static int reserve(sel_index *ix)
{
	if (ix->free_head == SEL_NODE_NONE && ix->used == ix->cap) {
		if (ix->cap >= MAX_IDS)
			return eos_fail(-ENOMEM, "index: out of node ids");
		uint64_t ncap = ix->cap ? (uint64_t)ix->cap * 2 : 64;
		if (ncap > MAX_IDS)
			ncap = MAX_IDS;
		sel_index_node *nn = realloc(ix->nodes, ncap * sizeof *nn);
		if (!nn)
			return eos_fail(-ENOMEM, "index: out of memory for %" PRIu64 " nodes",
					ncap);
		ix->nodes = nn;
		uint64_t *nu = realloc(ix->last_use, ncap * sizeof *nu);
		if (!nu)
			return eos_fail(-ENOMEM, "index: out of memory for %" PRIu64 " nodes",
					ncap);
		ix->last_use = nu;
		ix->cap = (uint32_t)ncap;
	}
	if (table_reserve(ix, &ix->keys) || table_reserve(ix, &ix->buckets))
		return eos_fail(-ENOMEM, "index: out of memory for the hash tables");
	return 0;
}

int sel_index_insert(sel_index *ix, const sel_key *key, const sel_key *parent,
		     const sel_digest *bucket, uint32_t tail, bool has_row, sel_node_id *out)
{
	uint64_t c = key->consumed, pt = ix->page_tokens;
	sel_node_id dummy, pid = SEL_NODE_NONE;
	if (!out)
		out = &dummy;
	*out = SEL_NODE_NONE;
	if (c == 0)
		return eos_fail(-EINVAL, "index: a key must consume at least one token");
	if (c / pt >= UINT32_MAX)
		return eos_fail(-EINVAL, "index: key of %" PRIu64 " tokens has too many pages", c);
	sel_node_id have = sel_index_find(ix, key);
	if (have != SEL_NODE_NONE) {
		*out = have;
		return eos_fail(-EEXIST, "index: key of %" PRIu64 " tokens is already present", c);
	}
	uint32_t full = (uint32_t)(c / pt), t;
	if (parent && !sel_key_is_none(parent)) {
		if (parent->consumed >= c)
			return eos_fail(-EINVAL,
					"index: parent consumes %" PRIu64 " tokens, not fewer than"
					" its child's %" PRIu64,
					parent->consumed, c);
		pid = sel_index_find(ix, parent);
	}
	if (pid != SEL_NODE_NONE) {
		uint32_t derived = (uint32_t)(c / pt - N(ix, pid)->key.consumed / pt);
		if (tail == SEL_TAIL_AUTO || tail == derived) {
			t = derived;
		} else if (tail == full) {
			t = full;
			pid = SEL_NODE_NONE; /* a root although its parent exists */
		} else {
			return eos_fail(-EINVAL,
					"index: tail of %" PRIu32 " pages for key of %" PRIu64
					" tokens is neither the %" PRIu32
					" since its parent nor the"
					" full chain of %" PRIu32,
					tail, c, derived, full);
		}
	} else {
		if (tail != SEL_TAIL_AUTO && tail != full)
			return eos_fail(-ENOENT,
					"index: parent of key of %" PRIu64 " tokens is absent"
					" and its %" PRIu32
					" pages are not the full chain of %" PRIu32,
					c, tail, full);
		t = full;
	}
	int rc = reserve(ix);
	if (rc)
		return rc;

	sel_node_id id;
	if (ix->free_head != SEL_NODE_NONE) {
		id = ix->free_head;
		ix->free_head = N(ix, id)->lru_next;
		ix->nfree--;
	} else {
		id = ix->used++;
	}
	sel_index_node *n = N(ix, id);
	memset(n, 0, sizeof *n);
	n->key = *key;
	n->bucket = *bucket;
	n->parent = pid;
	n->tail_pages = t;
	n->state = SEL_NODE_PENDING;
	n->flags = has_row ? SEL_NODE_HAS_ROW : SEL_NODE_UNPRUNED;
	n->bnext = SEL_NODE_NONE;
	ix->count++;
	table_put(ix, &ix->keys, id);
	bucket_link(ix, id);
	lru_append(ix, id);
	if (pid != SEL_NODE_NONE) {
		N(ix, pid)->children++;
		N(ix, pid)->flags &= (uint16_t)~SEL_NODE_UNPRUNED;
	}
	touch(ix, id);
	*out = id;
	debug_check(ix);
	return 0;
}

/* ---- state, pins, access ----------------------------------------------- */

void sel_index_commit(sel_index *ix, sel_node_id id)
{
	assert(live(ix, id));
	sel_index_node *n = N(ix, id);
	n->state = SEL_NODE_READY;
	if (n->parent != SEL_NODE_NONE) {
		sel_index_node *p = N(ix, n->parent);
		if (p->parent != SEL_NODE_NONE && (p->flags & SEL_NODE_HAS_ROW) &&
		    p->children == 1) {
			if (p->pins)
				p->flags |= SEL_NODE_DROP_ROW;
			else
				drop_row_now(ix, n->parent);
		}
	}
	if (ix->ops.commit)
		ix->ops.commit(ix->ctx, ix, id);
	debug_check(ix);
}

void sel_index_pin(sel_index *ix, sel_node_id id)
{
	assert(live(ix, id));
	N(ix, id)->pins++;
	debug_check(ix);
}

void sel_index_unpin(sel_index *ix, sel_node_id id)
{
	assert(live(ix, id) && N(ix, id)->pins > 0);
	sel_index_node *n = N(ix, id);
	if (n->pins == 0 || --n->pins) {
		debug_check(ix);
		return;
	}
	if (n->flags & SEL_NODE_DROP_ROW) {
		/* A row drop deferred by commit, unless the child went meanwhile. */
		if (n->children)
			drop_row_now(ix, id);
		else
			n->flags &= (uint16_t)~SEL_NODE_DROP_ROW;
	}
	if (useless(n))
		remove_cascade(ix, id, false);
	debug_check(ix);
}

void sel_index_touch(sel_index *ix, sel_node_id id)
{
	assert(live(ix, id));
	touch(ix, id);
	debug_check(ix);
}

void sel_index_set_evictable(sel_index *ix, sel_node_id id, bool evictable)
{
	assert(live(ix, id));
	sel_index_node *n = N(ix, id);
	if (!evictable) {
		n->flags |= SEL_NODE_NOEVICT;
		return;
	}
	n->flags &= (uint16_t)~SEL_NODE_NOEVICT;
	if (useless(n))
		remove_cascade(ix, id, false);
	debug_check(ix);
}

/* ---- removal, rows, eviction, prune ------------------------------------ */

int sel_index_remove(sel_index *ix, sel_node_id id)
{
	if (!live(ix, id))
		return eos_fail(-ENOENT, "index: no node %" PRIu32, id);
	const sel_index_node *n = N(ix, id);
	if (n->children || n->pins)
		return eos_fail(-EBUSY,
				"index: node %" PRIu32 " has %" PRIu32 " children and %" PRIu32
				" pins",
				id, n->children, n->pins);
	remove_cascade(ix, id, false);
	debug_check(ix);
	return 0;
}

int sel_index_drop_row(sel_index *ix, sel_node_id id)
{
	if (!live(ix, id))
		return eos_fail(-ENOENT, "index: no node %" PRIu32, id);
	const sel_index_node *n = N(ix, id);
	if (n->pins)
		return eos_fail(-EBUSY, "index: node %" PRIu32 " is pinned", id);
	if (!(n->flags & SEL_NODE_HAS_ROW))
		return eos_fail(-ENOENT, "index: node %" PRIu32 " has no row", id);
	if (n->children == 0)
		remove_cascade(ix, id, false);
	else
		drop_row_now(ix, id);
	debug_check(ix);
	return 0;
}

int sel_index_evict(sel_index *ix, sel_node_id *victim)
{
	sel_node_id id;
	if (victim)
		*victim = SEL_NODE_NONE;
	for (id = ix->lru_head; id != SEL_NODE_NONE; id = N(ix, id)->lru_next) {
		const sel_index_node *n = N(ix, id);
		if (n->children == 0 && n->pins == 0 && !(n->flags & SEL_NODE_NOEVICT)) {
			if (victim)
				*victim = id;
			remove_cascade(ix, id, false);
			debug_check(ix);
			return 1;
		}
	}
	for (id = ix->lru_head; id != SEL_NODE_NONE; id = N(ix, id)->lru_next) {
		const sel_index_node *n = N(ix, id);
		if (n->children == 1 && n->pins == 0 &&
		    (n->flags & (SEL_NODE_HAS_ROW | SEL_NODE_NOEVICT)) == SEL_NODE_HAS_ROW) {
			if (victim)
				*victim = id;
			drop_row_now(ix, id);
			debug_check(ix);
			return 2;
		}
	}
	return 0;
}

uint64_t sel_index_prune(sel_index *ix)
{
	uint64_t removed = 0;
	for (sel_node_id id = 0; id < ix->used; id++) {
		if (!live(ix, id))
			continue;
		sel_index_node *n = N(ix, id);
		if (n->children == 0 && !(n->flags & SEL_NODE_HAS_ROW) && n->pins == 0)
			removed += remove_cascade(ix, id, true);
	}
	/* Survivors are row holders, parents, or pinned: the startup exemption
	 * ends, and a pinned useless node goes at its last unpin. */
	for (sel_node_id id = 0; id < ix->used; id++)
		if (live(ix, id))
			N(ix, id)->flags &= (uint16_t)~SEL_NODE_UNPRUNED;
	debug_check(ix);
	return removed;
}

/* ---- last use and expiry (design 2.5) ------------------------------------ */

void sel_index_set_clock(sel_index *ix, uint64_t (*now_ns)(void)) { ix->now_ns = now_ns; }

uint64_t sel_index_used_ns(const sel_index *ix, sel_node_id id)
{
	return live(ix, id) ? ix->last_use[id] : 0;
}

uint64_t sel_index_stamp(const sel_index *ix) { return ix->stamp; }

void sel_index_seed_used(sel_index *ix, sel_node_id id, uint64_t ns)
{
	assert(live(ix, id));
	ix->last_use[id] = ns;
	if (ns > ix->stamp)
		ix->stamp = ns;
}

struct use_order {
	const sel_index *ix;
	const uint64_t *eff; /* newest last use in each id's subtree */
};

static int by_depth(const void *a, const void *b, void *arg)
{
	const sel_index *ix = arg;
	uint64_t cx = N(ix, *(const sel_node_id *)a)->key.consumed;
	uint64_t cy = N(ix, *(const sel_node_id *)b)->key.consumed;
	return cx > cy ? -1 : cx < cy;
}

static int by_use(const void *a, const void *b, void *arg)
{
	const struct use_order *u = arg;
	const sel_index *ix = u->ix;
	sel_node_id x = *(const sel_node_id *)a, y = *(const sel_node_id *)b;
	if (u->eff[x] != u->eff[y])
		return u->eff[x] < u->eff[y] ? -1 : 1;
	/* Equal times: deeper first, so a parent stays after its children. */
	uint64_t cx = N(ix, x)->key.consumed, cy = N(ix, y)->key.consumed;
	if (cx != cy)
		return cx > cy ? -1 : 1;
	return x < y ? -1 : x > y;
}

int sel_index_order_by_use(sel_index *ix)
{
	if (ix->count == 0)
		return 0;
	sel_node_id *ids = malloc(ix->count * sizeof *ids);
	uint64_t *eff = malloc((size_t)ix->used * sizeof *eff);
	if (!ids || !eff) {
		free(ids);
		free(eff);
		return eos_fail(-ENOMEM, "index: out of memory to order %" PRIu64 " nodes",
				ix->count);
	}
	uint64_t n = 0;
	for (sel_node_id id = ix->lru_head; id != SEL_NODE_NONE; id = N(ix, id)->lru_next) {
		ids[n++] = id;
		eff[id] = ix->last_use[id];
	}
	/* Children before parents (deeper first): each passes its subtree's
	 * newest time up once. */
	qsort_r(ids, n, sizeof *ids, by_depth, ix);
	for (uint64_t i = 0; i < n; i++) {
		sel_node_id p = N(ix, ids[i])->parent;
		if (p != SEL_NODE_NONE && eff[p] < eff[ids[i]])
			eff[p] = eff[ids[i]];
	}
	struct use_order u = {ix, eff};
	qsort_r(ids, n, sizeof *ids, by_use, &u);
	ix->lru_head = ix->lru_tail = SEL_NODE_NONE;
	for (uint64_t i = 0; i < n; i++) {
		lru_append(ix, ids[i]);
		N(ix, ids[i])->tick = ++ix->clock;
	}
	free(ids);
	free(eff);
	debug_check(ix);
	return 0;
}

uint32_t sel_index_expire(sel_index *ix, uint64_t cutoff_ns, uint32_t max_leaves, bool all,
			  bool (*droppable)(void *ctx, const sel_index *ix, sel_node_id id),
			  void *ctx)
{
	uint32_t n = 0;
	sel_node_id kept = SEL_NODE_NONE; /* the last node passed over */
	sel_node_id id = ix->lru_head;
	while (id != SEL_NODE_NONE && n < max_leaves) {
		const sel_index_node *x = N(ix, id);
		if (x->children || x->pins || (droppable && !droppable(ctx, ix, id))) {
			kept = id;
			id = x->lru_next;
			continue;
		}
		if (!sel_index_expired(ix->last_use[id], cutoff_ns)) {
			if (!all)
				break; /* the first fresh leaf: later ones are as fresh (DESIGN) */
			kept = id;
			id = x->lru_next;
			continue;
		}
		remove_cascade(ix, id, false);
		n++;
		/* The cascade removed only id and ancestors after it. */
		id = kept == SEL_NODE_NONE ? ix->lru_head : N(ix, kept)->lru_next;
	}
	debug_check(ix);
	return n;
}

/* ---- lookup ------------------------------------------------------------ */

void sel_index_chain_free(sel_index_chain *ch)
{
	if (!ch)
		return;
	free(ch->ids);
	memset(ch, 0, sizeof *ch);
}

static int chain_push(sel_index_chain *ch, sel_node_id id)
{
	if (ch->n == ch->cap) {
		uint32_t ncap = ch->cap ? ch->cap * 2 : 16;
		sel_node_id *ni = realloc(ch->ids, (size_t)ncap * sizeof *ni);
		if (!ni)
			return eos_fail(-ENOMEM, "index: out of memory for a chain of %" PRIu32,
					ncap);
		ch->ids = ni;
		ch->cap = ncap;
	}
	ch->ids[ch->n++] = id;
	return 0;
}

/* The chain digest of ch (ascending ids, skip pages of its first node). */
static void chain_digest(const sel_index *ix, const sel_node_id *ids, uint32_t n, uint32_t skip,
			 sel_digest *out)
{
	memset(out, 0, sizeof *out);
	for (uint32_t i = 0; i < n; i++) {
		const sel_index_node *x = N(ix, ids[i]);
		uint32_t used = x->tail_pages - (i == 0 ? skip : 0);
		if (used || i + 1 == n)
			sel_chain_digest_add(out, &x->key, used);
	}
}

/* Collect the chain of candidate id above resident a: 1 when feasible (every
 * node above a READY, and each with the key h has at its consumed count --
 * the candidate's own key was compared by the caller), 0 when not, or
 * -ENOMEM. */
static int collect(const sel_index *ix, const sel_history *h, sel_node_id id, uint64_t a,
		   sel_index_chain *ch)
{
	uint64_t pages = 0, base = 0;
	ch->n = 0;
	for (;;) {
		const sel_index_node *n = N(ix, id);
		if (n->state != SEL_NODE_READY) {
			ch->n = 0;
			return 0;
		}
		if (ch->n > 0) { /* an ancestor: its link came from a file */
			sel_key want;
			sel_history_key_at(h, n->key.consumed, &want);
			if (!sel_key_eq(&want, &n->key)) {
				ch->n = 0;
				ch->rejected++;
				return 0;
			}
		}
		int rc = chain_push(ch, id);
		if (rc)
			return rc;
		pages += n->tail_pages;
		if (n->parent == SEL_NODE_NONE)
			break;
		if (N(ix, n->parent)->key.consumed <= a) {
			base = N(ix, n->parent)->key.consumed;
			break;
		}
		id = n->parent;
	}
	for (uint32_t i = 0, j = ch->n - 1; i < j; i++, j--) {
		sel_node_id t = ch->ids[i];
		ch->ids[i] = ch->ids[j];
		ch->ids[j] = t;
	}
	uint64_t pt = ix->page_tokens;
	ch->consumed = N(ix, ch->ids[ch->n - 1])->key.consumed;
	ch->base = base;
	ch->pages = (uint32_t)pages;
	ch->skip_pages = (uint32_t)(a / pt - base / pt);
	assert(pages == ch->consumed / pt - base / pt); /* invariant 4 */
	chain_digest(ix, ch->ids, ch->n, ch->skip_pages, &ch->digest);
	return 1;
}

int sel_index_chain_digest(const sel_index *ix, sel_node_id end, uint64_t resident, sel_digest *out)
{
	sel_node_id small[64], *ids = small;
	uint32_t n = 0, cap = 64;
	uint64_t base = 0;
	int rc = 0;
	for (sel_node_id cur = end; cur != SEL_NODE_NONE;) {
		const sel_index_node *x = N(ix, cur);
		if (x->key.consumed <= resident) {
			base = x->key.consumed;
			break;
		}
		if (n == cap) {
			sel_node_id *g = malloc((size_t)cap * 2 * sizeof *g);
			if (!g) {
				rc = eos_fail(-ENOMEM,
					      "index: out of memory for a chain of %" PRIu32, cap);
				goto out;
			}
			memcpy(g, ids, (size_t)n * sizeof *g);
			if (ids != small)
				free(ids);
			ids = g;
			cap *= 2;
		}
		ids[n++] = cur;
		cur = x->parent;
	}
	for (uint32_t i = 0, j = n ? n - 1 : 0; i < j; i++, j--) {
		sel_node_id t = ids[i];
		ids[i] = ids[j];
		ids[j] = t;
	}
	uint64_t pt = ix->page_tokens;
	chain_digest(ix, ids, n, (uint32_t)(resident / pt - base / pt), out);
out:
	if (ids != small)
		free(ids);
	return rc;
}

int sel_index_lookup(const sel_index *ix, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_index_chain *out)
{
	uint64_t top = sel_history_len(h);
	if (limit < top)
		top = limit;
	out->n = 0;
	out->consumed = out->base = 0;
	out->pages = out->skip_pages = 0;
	out->rejected = 0;
	memset(&out->digest, 0, sizeof out->digest);
	if (top <= resident)
		return 0;
	sel_key want;
	uint64_t want_c = 0; /* consumed count of want; 0 = not computed */
	uint64_t lowest = resident / SEL_BUCKET_TOKENS;
	for (uint64_t k = top / SEL_BUCKET_TOKENS;; k--) {
		uint64_t s = ix_bucket_slot(ix, sel_history_bound(h, k));
		sel_node_id id = s == UINT64_MAX ? SEL_NODE_NONE : ix->buckets.slot[s];
		for (; id != SEL_NODE_NONE; id = N(ix, id)->bnext) {
			const sel_index_node *n = N(ix, id);
			uint64_t c = n->key.consumed;
			if (c > top)
				continue;
			if (c <= resident)
				break; /* the rest of the chain is shallower still */
			if (n->state != SEL_NODE_READY || !(n->flags & SEL_NODE_HAS_ROW))
				continue;
			if (want_c != c) {
				sel_history_key_at(h, c, &want);
				want_c = c;
			}
			if (!sel_key_eq(&want, &n->key))
				continue;
			int rc = collect(ix, h, id, resident, out);
			if (rc)
				return rc;
		}
		if (k == lowest)
			break;
	}
	return 0;
}
