/*
 * index_int.h - what the files of the index share (design 2.3; index.h is
 * the interface): the index's struct, its hash tables and the helpers
 * its checker needs.  Private to index.c and index_check.c.
 */
#ifndef SEL_INDEX_INT_H
#define SEL_INDEX_INT_H

#include <string.h>

#include "index.h"

#define NODE_FREE 0xffu /* node.state of an id on the free list */
#define MIN_TABLE_BITS 4
#define MAX_IDS (UINT32_MAX - 1u)

_Static_assert(sizeof(sel_index_node) <= 96, "keep the index node small");

/* An open-addressing table of node ids (empty = SEL_NODE_NONE), keyed by
 * the node's key or by its bucket digest. */
struct idtable {
	sel_node_id *slot;
	uint32_t bits; /* capacity 1 << bits */
	bool by_bucket;
	uint64_t used;
};

struct sel_index {
	uint32_t page_tokens;
	struct sel_index_ops ops;
	void *ctx;
	sel_index_node *nodes;
	uint32_t used; /* ids [0, used) are live or free */
	uint32_t cap;  /* allocated entries of nodes[] */
	sel_node_id free_head;
	uint32_t nfree;
	uint64_t count;         /* live nodes */
	struct idtable keys;    /* key -> id */
	struct idtable buckets; /* bucket digest -> deepest node of the bucket */
	sel_node_id lru_head, lru_tail;
	uint64_t clock;           /* last tick given */
	uint64_t *last_use;       /* [cap] last-use time (ns) of each id */
	uint64_t (*now_ns)(void); /* the store's clock, or NULL */
	uint64_t stamp;           /* last stamp given (or seeded) */
};

static inline sel_index_node *N(const sel_index *ix, sel_node_id id) { return &ix->nodes[id]; }

static inline bool live(const sel_index *ix, sel_node_id id)
{
	return id < ix->used && ix->nodes[id].state != NODE_FREE;
}

static inline bool digest_eq(const sel_digest *a, const sel_digest *b)
{
	return memcmp(a->b, b->b, SEL_DIGEST_BYTES) == 0;
}

/* Invariant 6: a node nobody needs and nothing keeps. */
static inline bool useless(const sel_index_node *n)
{
	const unsigned keep = SEL_NODE_HAS_ROW | SEL_NODE_NOEVICT | SEL_NODE_UNPRUNED;
	return n->children == 0 && n->pins == 0 && !(n->flags & keep);
}

/* The slot holding key k (in the key table) or the chain of bucket d (in
 * the bucket table), or UINT64_MAX. */
uint64_t ix_key_slot(const sel_index *ix, const sel_key *k);
uint64_t ix_bucket_slot(const sel_index *ix, const sel_digest *d);

#endif
