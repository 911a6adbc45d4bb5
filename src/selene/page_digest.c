/*
 * page_digest.c - page digests and record drops for overlapped restores
 * (issue 18, "Overlapped restore"; docs/architecture.md records how this
 * departs from the design): the digest of a page from the live planes
 * (sel_page_digest), the digests of a hit's pages as the memory store
 * holds them (sel_memory_store_page_digests), and the drop of a record found wrong
 * (sel_core_drop, for every store built on the core).
 *
 * DESIGN
 *
 * An overlapped restore recomputes the head of a hit's pages instead of
 * loading them, and must prove the recomputed pages equal the stored ones.
 * The comparison is by digest: XXH3-64 streamed over, for each rank in
 * order, that page's bytes in each page plane in geometry order, unpadded
 * (SEL_PAGE_DIGEST in selene.h).  Not the record file's page checksum: that
 * one covers the stored page record with its 4 KiB plane padding, and
 * transfers never write a slot's padding (design 2.5), so it holds whatever
 * an earlier occupant of the slot left there (a row piece) and cannot be
 * recomputed from the planes.
 *
 * A record on disk gives its head's digests with the tail's fetch, from its
 * checksum segment (sel_inbound.sums): the page record checksums.  Version
 * 4 files have zero padding, so sel_page_digest_padded recomputes those
 * from the planes (planes followed by zeros to 4 KiB, rank by rank).
 *
 * The memory store hashes its slots on the caller's thread, the worker:
 * n pages' bytes, as the recomputed head's are hashed there too.  Packed
 * (replicated, TP > 1) records keep one share for all ranks; their digest
 * streams that share once per rank, which is what the planes hold when the
 * ranks agree.
 *
 * A record found wrong is removed when nothing pins it and it has no
 * children; with children its row is dropped (it no longer answers
 * lookups; its pages stay for its children, whose own restores cannot
 * tell).  A pinned record is left (-EBUSY).
 */
#include <errno.h>
#include <inttypes.h>
#define XXH_STATIC_LINKING_ONLY
#include "xxh.h"

#include "eos.h"
#include "internal.h"
#include "store_memory_int.h"

static const uint8_t zeros[4096];

static void pad_zeros(XXH3_state_t *st, uint64_t unit_bytes)
{
	for (uint64_t pad = eos_round_up(unit_bytes, sizeof zeros) - unit_bytes; pad;) {
		size_t n = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
		XXH3_64bits_update(st, zeros, n);
		pad -= n;
	}
}

static int digest(const sel_geometry *g, uint32_t page, bool padded, uint64_t *out)
{
	if (!g || !out)
		return eos_fail(-EINVAL, "page digest: no geometry");
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (uint32_t r = 0; r < g->ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		if (page >= rg->page_count)
			return eos_fail(-EINVAL, "page digest: page %" PRIu32 " beyond %" PRIu64,
					page, rg->page_count);
		for (uint32_t i = 0; i < rg->n_planes; i++) {
			const sel_plane *pl = &rg->pages[i];
			if (pl->kind != SEL_MEM_HOST)
				return eos_fail(-ENOTSUP,
						"page digest: plane '%s' of rank %" PRIu32
						" is not host memory",
						pl->name ? pl->name : "?", r);
			const void *p = (const void *)(uintptr_t)(pl->address +
								  (uint64_t)page * pl->unit_bytes);
			XXH3_64bits_update(&st, p, (size_t)pl->unit_bytes);
			if (padded)
				pad_zeros(&st, pl->unit_bytes);
		}
	}
	*out = XXH3_64bits_digest(&st);
	return 0;
}

int sel_slot_page_digest_padded(const sel_geometry *g, const sel_slot_layout *l,
				const uint8_t *slot, uint64_t *out)
{
	if (!g || !l || !slot || !out || l->ranks != g->ranks)
		return eos_fail(-EINVAL, "slot page digest: no slot, or a layout of other ranks");
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (uint32_t r = 0; r < g->ranks; r++)
		for (uint32_t i = 0; i < g->rank[r].n_planes; i++) {
			uint64_t unit = g->rank[r].pages[i].unit_bytes;
			XXH3_64bits_update(&st, slot + l->share_off[r] + l->plane_off[r][i],
					   (size_t)unit);
			pad_zeros(&st, unit);
		}
	*out = XXH3_64bits_digest(&st);
	return 0;
}

int sel_page_digest(const sel_geometry *g, uint32_t page, uint64_t *out)
{
	return digest(g, page, false, out);
}

int sel_page_digest_padded(const sel_geometry *g, uint32_t page, uint64_t *out)
{
	return digest(g, page, true, out);
}

/* The digest of stored page j (within its node) of record m. */
static uint64_t slot_digest(const struct mem_store *ms, const struct mrec *m, uint32_t j)
{
	const struct sel_store_pool *sp = ms->c.sp;
	const sel_slot_layout *l = &sp->layout;
	uint32_t R = ms->c.ranks;
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (uint32_t r = 0; r < R; r++) {
		/* Packed: share j of the record sits in slot j / R at rank
		 * (j % R)'s share offset, and stands for every rank. */
		uint32_t slot = m->pages_packed ? m->slots[j / R] : m->slots[j];
		uint32_t at = m->pages_packed ? j % R : r;
		const uint8_t *base =
			(const uint8_t *)sel_slab_addr(sp->pool, slot) + l->share_off[at];
		const sel_rank_geometry *rg = &sp->g->rank[m->pages_packed ? 0 : r];
		for (uint32_t i = 0; i < rg->n_planes; i++)
			XXH3_64bits_update(&st, base + l->plane_off[m->pages_packed ? 0 : r][i],
					   (size_t)rg->pages[i].unit_bytes);
	}
	return XXH3_64bits_digest(&st);
}

int sel_memory_store_page_digests(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t n,
				  uint64_t *out)
{
	struct mem_store *ms = sel_ms_of(s);
	struct sel_chain_walk w;
	int rc;
	if (!hit || (n && !out))
		return eos_fail(-EINVAL, "memory store: page digests without a hit");
	if ((uint64_t)first + n > hit->pages)
		return eos_fail(-EINVAL,
				"memory store: page digests %" PRIu32 "+%" PRIu32
				" beyond the hit's %" PRIu32 " pages",
				first, n, hit->pages);
	if (ms->c.sp->split)
		return eos_fail(-ENOTSUP, "memory store: a split pool's slots are device memory");
	if ((rc = sel_core_walk(&ms->c, &hit->key, hit->resident, &w)))
		return rc;
	if (w.pages != hit->pages)
		return eos_fail(-ESTALE, "memory store: hit chain changed");
	uint32_t k = 0; /* page index within the hit */
	for (uint32_t i = 0; i < w.n && k < first + n; i++) {
		const sel_index_node *nd = sel_core_node(&ms->c, w.ids[i]);
		const struct mrec *m = ms_rec(ms, w.ids[i]);
		for (uint32_t j = i == 0 ? w.skip : 0; j < nd->tail_pages && k < first + n;
		     j++, k++)
			if (k >= first)
				out[k - first] = slot_digest(ms, m, j);
	}
	return k == first + n ? 0 : eos_fail(-ESTALE, "memory store: hit chain changed");
}

int sel_core_drop(sel_store *s, const sel_key *key)
{
	struct sel_core *c = (struct sel_core *)s;
	if (!key)
		return eos_fail(-EINVAL, "%s: drop without a key", c->name);
	sel_node_id id = sel_index_find(c->ix, key);
	if (id == SEL_NODE_NONE)
		return eos_fail(-ENOENT, "%s: no record at %" PRIu64 " to drop", c->name,
				key->consumed);
	const sel_index_node *nd = sel_core_node(c, id);
	if (nd->pins)
		return eos_fail(-EBUSY, "%s: the record at %" PRIu64 " is in use", c->name,
				key->consumed);
	c->st.tier[c->tier].corrupt++;
	enum sel_core_why w = c->why; /* a caller's removal, as the counters see it */
	c->why = SEL_WHY_NONE;
	int rc = nd->children == 0 ? sel_index_remove(c->ix, id) : sel_index_drop_row(c->ix, id);
	c->why = w;
	return rc == -ENOENT ? 0 : rc;
}
