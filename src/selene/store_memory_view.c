/*
 * store_memory_view.c - the memory store as the composite sees it (design
 * 2.4 CompositeStore): a record's slots for write_from, store pins for
 * dirty records and read-through targets, removal of copies the disk tier
 * lost, reservation of warm slots for a read-through and its settling, the
 * slot gauges that drive maintenance (store_memory.h "The composite's
 * view").
 *
 * DESIGN
 *
 * These calls change the memory store only through its index and its own
 * slot accounting, exactly as put and poll do, and run its checker after
 * every mutation.  A reserved record is an index node PENDING and pinned
 * whose slots the caller fills (a disk read) before settling it: ok
 * commits it as a durable resident, !ok gives its slots back and removes
 * it.  The composite pins what is dirty (parked, not yet on disk) and what
 * a read-through reads through; a pinned record is never evicted and keeps
 * its row and slots.
 *
 * INVARIANTS (those of store_memory.c, which the checker verifies)
 *
 *   1. A reserved record holds exactly sel_memory_store_record_slots(tail,
 *      row, packing) slots and is pinned until settled.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "slab.h"
#include "store_memory_int.h"

int sel_memory_store_view(sel_store *s, const sel_key *key, struct sel_memory_view *out)
{
	struct mem_store *ms = sel_ms_of(s);
	sel_node_id id = sel_index_find(ms->c.ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = sel_core_node(&ms->c, id);
	const struct mrec *r = ms_rec(ms, id);
	memset(out, 0, sizeof(*out));
	out->ready = n->state == SEL_NODE_READY && !(n->flags & MS_FAILED);
	out->has_row = n->flags & SEL_NODE_HAS_ROW;
	out->pages_packed = r->pages_packed;
	out->row_packed = r->row_packed;
	out->tail_pages = n->tail_pages;
	out->n_page_slots = r->n_page_slots;
	out->n_row_slots = r->n_row_slots;
	out->slots = r->slots;
	out->pins = n->pins;
	out->is_root = n->parent == SEL_NODE_NONE;
	if (!out->is_root)
		out->parent = sel_core_node(&ms->c, n->parent)->key;
	return 0;
}

int sel_memory_store_pin(sel_store *s, const sel_key *key)
{
	return sel_core_pin_key(&sel_ms_of(s)->c, key);
}

void sel_memory_store_unpin(sel_store *s, const sel_key *key)
{
	sel_core_unpin_key(&sel_ms_of(s)->c, key);
}

int sel_memory_store_remove(sel_store *s, const sel_key *key)
{
	struct mem_store *ms = sel_ms_of(s);
	sel_node_id id = sel_index_find(ms->c.ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = sel_core_node(&ms->c, id);
	if (n->pins || n->children)
		return -EBUSY;
	int rc = sel_index_remove(ms->c.ix, id);
	debug_check(ms);
	return rc;
}

uint32_t sel_memory_store_refused_need(sel_store *s) { return sel_ms_of(s)->refused_need; }

uint32_t sel_memory_store_record_slots(sel_store *s, uint32_t tail, bool row, bool pages_packed,
				       bool row_packed)
{
	struct mem_store *ms = sel_ms_of(s);
	uint32_t p = pages_packed ? sel_div_up(tail, ms->c.ranks) : tail;
	uint32_t r = !row         ? 0
		     : row_packed ? sel_div_up(ms->c.row_slots, ms->c.ranks)
				  : ms->c.row_slots;
	return p + r;
}

int sel_memory_store_reserve(sel_store *s, const sel_key *key, const sel_key *parent,
			     const sel_digest *bucket, uint32_t tail, bool row, bool pages_packed,
			     bool row_packed)
{
	struct mem_store *ms = sel_ms_of(s);
	int rc = sel_core_refuse_stopped(&ms->c);
	if (rc)
		return rc;
	if ((ms->c.ranks == 1 || ms->c.sp->split) && (pages_packed || row_packed))
		return eos_fail(-EINVAL,
				"memory store: packing needs ranks > 1 and a registered pool");
	uint32_t need = sel_memory_store_record_slots(s, tail, row, pages_packed, row_packed);
	if (need > ms->c.warm)
		return eos_fail(-ENOSPC,
				"memory store: %" PRIu32 " slots exceed the warm pool's %" PRIu64,
				need, ms->c.warm);
	uint32_t *slots = malloc((need ? need : 1) * sizeof(uint32_t));
	if (!slots)
		return eos_fail(-ENOMEM, "memory store: out of memory");
	sel_node_id id;
	if ((rc = sel_core_insert(&ms->c, key, parent, bucket, tail, row, &id))) {
		free(slots);
		return rc;
	}
	struct mrec *r = ms_rec(ms, id);
	ms_pin(&ms->c, id);
	if (ms_make_room(ms, need) != 0 ||
	    sel_slab_alloc(ms->pool, need, SEL_SLAB_WARM, slots) != 0) {
		ms_unpin(&ms->c, id);
		sel_core_discard(&ms->c, id, key);
		free(slots);
		debug_check(ms);
		return eos_fail(-ENOSPC, "memory store: no room for %" PRIu32 " slots", need);
	}
	r->slots = slots;
	r->n_page_slots = pages_packed ? sel_div_up(tail, ms->c.ranks) : tail;
	r->n_row_slots = need - r->n_page_slots;
	r->pages_packed = pages_packed;
	r->row_packed = row && row_packed;
	ms->slots_pinned += need;
	ms->slots_held += need;
	debug_check(ms);
	return 0;
}

void sel_memory_store_settle(sel_store *s, const sel_key *key, bool ok)
{
	struct mem_store *ms = sel_ms_of(s);
	sel_node_id id = sel_index_find(ms->c.ix, key);
	if (id == SEL_NODE_NONE)
		return;
	if (ok) {
		const struct mrec *r = ms_rec(ms, id);
		sel_tier_stats *t = &ms->c.st.tier[SEL_TIER_MEMORY];
		sel_index_commit(ms->c.ix, id);
		t->held++;
		if (r->pages_packed || r->row_packed)
			t->stores_packed++; /* a promotion: a new store */
		else
			t->stores_per_rank++;
		ms_unpin(&ms->c, id);
	} else {
		ms_unpin(&ms->c, id);
		const sel_index_node *n;
		if (sel_index_find(ms->c.ix, key) == id && (n = sel_core_node(&ms->c, id)) &&
		    !n->pins && !n->children)
			sel_index_remove(ms->c.ix, id);
	}
	debug_check(ms);
}

void sel_memory_store_counts(sel_store *s, uint64_t *in_use, uint64_t *pinned, uint64_t *free_warm)
{
	struct mem_store *ms = sel_ms_of(s);
	if (in_use)
		*in_use = ms->slots_held;
	if (pinned)
		*pinned = ms->slots_pinned;
	if (free_warm)
		*free_warm = ms_free_warm(ms);
}

size_t sel_memory_store_keys(sel_store *s, sel_key *keys, size_t cap)
{
	return sel_core_keys(&sel_ms_of(s)->c, keys, cap);
}
