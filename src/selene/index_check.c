/*
 * index_check.c - the index's checker: every invariant of index.c's header
 * verified over the whole tree, its tables, its lists and its free ids
 * (design 2.3, 2.12; SQLite's assert_pager_state: SEL_DEBUG_CHECKS builds
 * run it after every mutation, tests call it directly).
 *
 * DESIGN
 *
 * One pass per invariant group, each a function that fails with
 * SEL_ECORRUPT naming the first violation and the node it was found at.
 * O(nodes + table slots); the scratch arrays come from sel_index_check.
 *
 * INVARIANTS: those of index.c, numbered as there.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "index_int.h"

/* ---- checker ----------------------------------------------------------- */

static int check_table(const sel_index *ix, const struct idtable *t, const char *what,
		       uint8_t *seen)
{
	uint64_t cap = (uint64_t)1 << t->bits, used = 0;
	for (uint64_t i = 0; i < cap; i++) {
		sel_node_id e = t->slot[i];
		if (e == SEL_NODE_NONE)
			continue;
		used++;
		if (!live(ix, e))
			return eos_fail(SEL_ECORRUPT,
					"index: %s slot %" PRIu64 " holds dead id %" PRIu32, what,
					i, e);
		if (seen[e])
			return eos_fail(SEL_ECORRUPT, "index: %s holds id %" PRIu32 " twice", what,
					e);
		seen[e] = 1;
		uint64_t s = t->by_bucket ? ix_bucket_slot(ix, &N(ix, e)->bucket)
					  : ix_key_slot(ix, &N(ix, e)->key);
		if (s != i)
			return eos_fail(SEL_ECORRUPT,
					"index: %s entry %" PRIu32 " at slot %" PRIu64
					" is found at %" PRIu64,
					what, e, i, s);
	}
	if (used != t->used)
		return eos_fail(SEL_ECORRUPT,
				"index: %s counts %" PRIu64 " entries, holds %" PRIu64, what,
				t->used, used);
	if (used * 4 > cap * 3)
		return eos_fail(SEL_ECORRUPT, "index: %s overloaded", what);
	return 0;
}

/* 1: every live node is in the key table, and only those.  *nlive: the
 * live nodes. */
static int check_keys(const sel_index *ix, uint8_t *seen, uint64_t *nlive)
{
	char hex[2 * SEL_DIGEST_BYTES + 1];
	memset(seen, 0, ix->used);
	int rc = check_table(ix, &ix->keys, "key table", seen);
	if (rc)
		return rc;
	*nlive = 0;
	for (sel_node_id id = 0; id < ix->used; id++) {
		if (!live(ix, id))
			continue;
		(*nlive)++;
		if (!seen[id])
			return eos_fail(SEL_ECORRUPT,
					"index: node %" PRIu32 " (key %s) missing from the"
					" key table",
					id, sel_hex(N(ix, id)->key.digest.b, 8, hex));
	}
	if (*nlive != ix->count)
		return eos_fail(SEL_ECORRUPT, "index: count %" PRIu64 " but %" PRIu64 " live nodes",
				ix->count, *nlive);
	return 0;
}

/* 2: bucket chains partition the live nodes, deepest first. */
static int check_buckets(const sel_index *ix, uint8_t *seen, uint64_t nlive)
{
	memset(seen, 0, ix->used);
	uint64_t cap = (uint64_t)1 << ix->buckets.bits, on_chains = 0, heads = 0;
	for (uint64_t i = 0; i < cap; i++) {
		sel_node_id head = ix->buckets.slot[i];
		if (head == SEL_NODE_NONE)
			continue;
		heads++;
		if (!live(ix, head))
			return eos_fail(SEL_ECORRUPT,
					"index: bucket slot %" PRIu64 " holds dead id %" PRIu32, i,
					head);
		if (ix_bucket_slot(ix, &N(ix, head)->bucket) != i)
			return eos_fail(SEL_ECORRUPT,
					"index: bucket head %" PRIu32 " not found at its"
					" slot %" PRIu64,
					head, i);
		uint64_t prev_c = UINT64_MAX;
		for (sel_node_id id = head; id != SEL_NODE_NONE; id = N(ix, id)->bnext) {
			if (!live(ix, id) || seen[id])
				return eos_fail(SEL_ECORRUPT,
						"index: bucket chain of %" PRIu32 " reaches %s"
						" id %" PRIu32,
						head, live(ix, id) ? "repeated" : "dead", id);
			seen[id] = 1;
			on_chains++;
			const sel_index_node *n = N(ix, id);
			if (!digest_eq(&n->bucket, &N(ix, head)->bucket))
				return eos_fail(SEL_ECORRUPT,
						"index: node %" PRIu32 " on the chain of"
						" another bucket",
						id);
			if (n->key.consumed > prev_c)
				return eos_fail(SEL_ECORRUPT,
						"index: bucket chain not deepest first at"
						" node %" PRIu32,
						id);
			prev_c = n->key.consumed;
		}
	}
	if (heads != ix->buckets.used)
		return eos_fail(SEL_ECORRUPT,
				"index: bucket table counts %" PRIu64 ", holds %" PRIu64,
				ix->buckets.used, heads);
	if (on_chains != nlive)
		return eos_fail(SEL_ECORRUPT,
				"index: %" PRIu64 " of %" PRIu64 " nodes on bucket chains",
				on_chains, nlive);

	return 0;
}

/* 3, 4, 7 for one node, and its parent's child count into kids. */
static int check_node(const sel_index *ix, sel_node_id id, uint32_t *kids)
{
	uint64_t pt = ix->page_tokens;
	const sel_index_node *n = N(ix, id);
	uint64_t c = n->key.consumed;
	if (n->state != SEL_NODE_PENDING && n->state != SEL_NODE_READY)
		return eos_fail(SEL_ECORRUPT, "index: node %" PRIu32 " in state %u", id, n->state);
	if (c == 0)
		return eos_fail(SEL_ECORRUPT, "index: node %" PRIu32 " consumes nothing", id);
	uint64_t want = c / pt;
	if (n->parent != SEL_NODE_NONE) {
		if (!live(ix, n->parent))
			return eos_fail(SEL_ECORRUPT,
					"index: node %" PRIu32 " has dead parent %" PRIu32, id,
					n->parent);
		uint64_t p = N(ix, n->parent)->key.consumed;
		if (p >= c)
			return eos_fail(SEL_ECORRUPT,
					"index: node %" PRIu32 " (%" PRIu64 " tokens)"
					" under parent %" PRIu32 " of %" PRIu64,
					id, c, n->parent, p);
		want = c / pt - p / pt;
		kids[n->parent]++;
	}
	if (n->tail_pages != want)
		return eos_fail(SEL_ECORRUPT,
				"index: node %" PRIu32 " tail %" PRIu32 " pages,"
				" expected %" PRIu64,
				id, n->tail_pages, want);
	if ((n->flags & SEL_NODE_DROP_ROW) && (n->pins == 0 || !(n->flags & SEL_NODE_HAS_ROW)))
		return eos_fail(SEL_ECORRUPT,
				"index: node %" PRIu32 " waits to drop a row"
				" while %s",
				id, n->pins ? "rowless" : "unpinned");
	if ((n->flags & SEL_NODE_UNPRUNED) && (n->flags & SEL_NODE_HAS_ROW))
		return eos_fail(SEL_ECORRUPT, "index: node %" PRIu32 " unpruned with a row", id);
	if (n->tick > ix->clock)
		return eos_fail(SEL_ECORRUPT, "index: node %" PRIu32 " ticks in the future", id);
	return 0;
}

/* 3, 5, 6 for one node, once every child is counted. */
static int check_kin(const sel_index *ix, sel_node_id id, const uint32_t *kids)
{
	const sel_index_node *n = N(ix, id);
	if (n->children != kids[id])
		return eos_fail(SEL_ECORRUPT,
				"index: node %" PRIu32 " counts %" PRIu32 " children, has %" PRIu32,
				id, n->children, kids[id]);
	if (useless(n))
		return eos_fail(SEL_ECORRUPT,
				"index: node %" PRIu32 " is a useless page-only"
				" leaf",
				id);
	if ((n->flags & SEL_NODE_UNPRUNED) && n->children)
		return eos_fail(SEL_ECORRUPT, "index: node %" PRIu32 " unpruned with children", id);
	if (n->parent != SEL_NODE_NONE && N(ix, n->parent)->tick <= n->tick)
		return eos_fail(SEL_ECORRUPT,
				"index: node %" PRIu32 " is newer than its parent %" PRIu32, id,
				n->parent);
	return 0;
}

/* 5: the LRU list. */
static int check_lru(const sel_index *ix, uint64_t nlive)
{
	uint64_t walked = 0, last_tick = 0;
	sel_node_id prev = SEL_NODE_NONE;
	for (sel_node_id id = ix->lru_head; id != SEL_NODE_NONE; id = N(ix, id)->lru_next) {
		if (!live(ix, id) || ++walked > nlive)
			return eos_fail(SEL_ECORRUPT, "index: LRU list reaches %s id %" PRIu32,
					live(ix, id) ? "too many nodes at" : "dead", id);
		const sel_index_node *n = N(ix, id);
		if (n->lru_prev != prev)
			return eos_fail(SEL_ECORRUPT, "index: LRU back link of %" PRIu32 " broken",
					id);
		if (walked > 1 && n->tick <= last_tick)
			return eos_fail(SEL_ECORRUPT, "index: LRU ticks not increasing at %" PRIu32,
					id);
		if (ix->last_use[id] > ix->stamp)
			return eos_fail(SEL_ECORRUPT,
					"index: node %" PRIu32 " used after the last stamp", id);
		last_tick = n->tick;
		prev = id;
	}
	if (walked != nlive || prev != ix->lru_tail)
		return eos_fail(SEL_ECORRUPT,
				"index: LRU list holds %" PRIu64 " of %" PRIu64 " nodes", walked,
				nlive);

	return 0;
}

/* 8: the free list. */
static int check_free(const sel_index *ix, uint64_t nlive)
{
	uint64_t nfree = 0;
	for (sel_node_id id = ix->free_head; id != SEL_NODE_NONE; id = N(ix, id)->lru_next) {
		if (id >= ix->used || live(ix, id) || ++nfree > ix->nfree)
			return eos_fail(SEL_ECORRUPT, "index: free list reaches %s id %" PRIu32,
					id >= ix->used || live(ix, id) ? "a live or unused"
								       : "too many",
					id);
	}
	if (nfree != ix->nfree || nfree + nlive != ix->used)
		return eos_fail(SEL_ECORRUPT,
				"index: %" PRIu64 " free and %" PRIu64 " live of %" PRIu32 " ids",
				nfree, nlive, ix->used);
	return 0;
}

static int check_nodes(const sel_index *ix, uint8_t *seen, uint32_t *kids)
{
	uint64_t nlive;
	int rc;
	if ((rc = check_keys(ix, seen, &nlive)) || (rc = check_buckets(ix, seen, nlive)))
		return rc;
	memset(kids, 0, (size_t)ix->used * sizeof *kids);
	for (sel_node_id id = 0; id < ix->used; id++)
		if (live(ix, id) && (rc = check_node(ix, id, kids)))
			return rc;
	for (sel_node_id id = 0; id < ix->used; id++)
		if (live(ix, id) && (rc = check_kin(ix, id, kids)))
			return rc;
	if ((rc = check_lru(ix, nlive)))
		return rc;
	return check_free(ix, nlive);
}

int sel_index_check(const sel_index *ix)
{
	size_t n = ix->used ? ix->used : 1;
	uint8_t *seen = malloc(n);
	uint32_t *kids = malloc(n * sizeof *kids);
	int rc = seen && kids ? check_nodes(ix, seen, kids)
			      : eos_fail(-ENOMEM, "index: out of memory for the check");
	free(seen);
	free(kids);
	return rc;
}
