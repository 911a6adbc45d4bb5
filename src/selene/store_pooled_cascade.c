/*
 * store_pooled_cascade.c - the pool as the next level of the local chain
 * (design 2.15 "Eviction below the instance"): records the last local
 * tier would evict go to the arena first, and leave the local tier only
 * once the manager accepted them.
 *
 * DESIGN
 *
 *   The pooled store hands the last local tier (a memory store: the core of
 *   sel_store_core with tier memory) a struct sel_cascade.  The store's own
 *   maintenance (sel_core_cascade_run, each poll) offers its least recently
 *   used evictable leaves while its free capacity is under its floor; the
 *   offer here snapshots the record's chain -- the source address of every
 *   rank's share of every chain page, the leaf's row -- and starts a put
 *   (sp_put with cascade set).  The core holds the record with a store pin
 *   from then on: lookups still find it locally, eviction cannot take it,
 *   its slots do not change.  On the grant, the helper thread copies the
 *   shares into the lease's windows and checksums them in one job, and the
 *   put commits.  PUT_RESULT OK (or PRESENT: the pool has it already) ends
 *   the hold as accepted and the record leaves the local tier; a refusal, a
 *   failed lease, a lost session or close ends it as kept: the record stays
 *   local, and the store's offers pause for a backoff.
 *
 *   Packed records (TP > 1, identical ranks' shares stored once) are copied
 *   out to every rank's share: share j of a packed page or row slot lives
 *   in slot j / ranks at rank (j % ranks)'s offset (store_memory.c).
 *
 * INVARIANTS
 *   1. Every held record ends exactly once (sel_core_cascade_end), after
 *      the helper stopped reading its slots.
 *   2. The source addresses are read only while the record is held: its
 *      chain cannot be evicted (a pinned leaf keeps its ancestors).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "slab.h"
#include "store_common.h"
#include "store_memory.h"
#include "store_pool.h"
#include "store_pooled.h"

/* Fill src for the tail pages of one chain node starting at chain page
 * pos (and, with row, the row slots after the chain's n pages). */
static void node_sources(const struct sel_pooled *p, const sel_slab_pool *pool,
			 const struct sel_memory_view *v, uint32_t pos, uint32_t n, bool row,
			 const uint8_t **src)
{
	uint32_t R = p->lay.ranks;
	for (uint32_t j = 0; j < v->tail_pages; j++)
		for (uint32_t r = 0; r < R; r++) {
			uint32_t s = v->pages_packed ? v->slots[j / R] : v->slots[j];
			uint32_t rr = v->pages_packed ? j % R : r;
			src[(size_t)(pos + j) * R + r] =
				(const uint8_t *)sel_slab_addr(pool, s) + p->lay.share_off[rr];
		}
	if (!row)
		return;
	const uint32_t *rs = v->slots + v->n_page_slots;
	for (uint32_t i = 0; i < p->lay.row_slots; i++)
		for (uint32_t r = 0; r < R; r++) {
			uint32_t s = v->row_packed ? rs[i / R] : rs[i];
			uint32_t rr = v->row_packed ? i % R : r;
			src[(size_t)(n + i) * R + r] =
				(const uint8_t *)sel_slab_addr(pool, s) + p->lay.share_off[rr];
		}
}

/* The source of every share of key's whole chain and its row, or NULL
 * when the memory store's record is not a complete chain. */
static const uint8_t **chain_sources(struct sel_pooled *p, sel_store *s, const sel_key *key,
				     uint32_t n, sel_key *parent, uint32_t *tail)
{
	const sel_slab_pool *pool = sel_memory_store_pool(s)->pool;
	uint32_t R = p->lay.ranks;
	const uint8_t **src = calloc(((size_t)n + p->lay.row_slots) * R, sizeof *src);
	struct sel_memory_view v;
	if (!src || sel_memory_store_view(s, key, &v) || !v.ready || !v.has_row)
		goto fail;
	*tail = v.tail_pages;
	*parent = v.is_root ? (sel_key){0} : v.parent;
	uint32_t pos = n;
	for (bool leaf = true;; leaf = false) {
		if (v.tail_pages > pos || !v.ready)
			goto fail;
		pos -= v.tail_pages;
		node_sources(p, pool, &v, pos, n, leaf, src);
		if (v.is_root)
			break;
		sel_key up = v.parent;
		if (sel_memory_store_view(s, &up, &v))
			goto fail;
	}
	if (pos == 0)
		return src;
fail:
	free(src);
	return NULL;
}

static bool sp_cascade_offer(void *ctx, sel_store *s, const sel_key *key)
{
	struct sel_pooled *p = ctx;
	if (!p->pc || p->closed || sel_pool_state(p->pc) != SEL_POOL_ATTACHED)
		return false;
	struct sel_core *c = sel_store_core(s);
	sel_node_id id = sel_index_find(c->ix, key);
	if (id == SEL_NODE_NONE)
		return false;
	uint32_t n = (uint32_t)(key->consumed / c->pt), tail = 0;
	sel_key parent;
	const uint8_t **src = chain_sources(p, s, key, n, &parent, &tail);
	if (!src)
		return false;
	sel_published cp = {.key = *key,
			    .parent = parent,
			    .bucket = sel_core_node(c, id)->bucket,
			    .n_pages = n,
			    .tail = tail};
	if (sp_put_cascade(p, &cp, src)) {
		free(src);
		return false;
	}
	return true;
}

void sp_cascade_attach(struct sel_pooled *p)
{
	struct sel_core *c = sel_store_core(p->w.inner);
	if (!p->pc || !c || c->tier != SEL_TIER_MEMORY || c->sp->split)
		return;
	struct sel_cascade k = {.offer = sp_cascade_offer, .ctx = p};
	sel_core_cascade_set(c, &k);
	p->casc = c;
}

void sp_cascade_detach(struct sel_pooled *p)
{
	if (p->casc)
		sel_core_cascade_set(p->casc, NULL); /* whatever is held stays local */
	p->casc = NULL;
}

void sp_cascade_end(struct sel_pooled *p, const sel_key *key, bool accepted)
{
	if (!p->casc)
		return;
	if (accepted)
		p->pc_st.cascaded++;
	else
		p->pc_st.cascade_kept++;
	sel_core_cascade_end(p->casc, key, accepted);
}

void sp_cascade_copy(const struct sel_pooled *p, const struct sp_hjob *j)
{
	const struct sel_pool_lease *l = j->lease;
	uint32_t R = p->lay.ranks;
	for (uint32_t k = 0; k < l->n_pages + l->n_row_slots; k++) {
		bool row = k >= l->n_pages;
		uint32_t slot = row ? l->row_slots[k - l->n_pages] : l->page_slots[k];
		size_t at = row ? (size_t)j->src_n + (k - l->n_pages) : (size_t)j->src_skip + k;
		uint8_t *dst = sel_pool_slot_addr(p->pc, slot);
		for (uint32_t r = 0; r < R; r++)
			memcpy(dst + p->lay.share_off[r], j->src[at * R + r], p->lay.share[r]);
	}
}
