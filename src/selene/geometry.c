/*
 * geometry.c - CacheGeometry, the layout fingerprint and the offload
 * identity (design 2.1, implementation step 1).
 *
 * The store never interprets model bytes.  What it needs of a model is the
 * shape of a checkpoint: for each rank, the page planes (every KV_PAGES
 * allocation, indexed by the same physical page id) and the row plane (the
 * single STATE_ROWS allocation, indexed by state slot).  The engine hands us
 * its allocations; this file turns them into a sel_geometry, names its byte
 * layout with a fingerprint, and derives the storage namespace identity.
 *
 * DESIGN
 *   Planes are sorted by name (strcmp) so the fingerprint and the record
 *   layout do not depend on allocation order.  PEER allocations belong to
 *   another rank and are skipped, so each byte is copied once under tensor
 *   and context parallelism.  Addresses and counts are excluded from the
 *   fingerprint: they change with load-time options (concurrency, cache
 *   size), the byte layout of a checkpoint does not.
 *
 * INVARIANTS
 *   1. Every rank has exactly one row plane and >= 1 page plane, all with
 *      non-zero unit sizes and distinct non-empty names.
 *   2. pages[] is strictly increasing by name.
 *   3. page_bytes == sum of the rank's page unit sizes.
 *
 * The canonical encodings hashed here are documented in docs/identity.md.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "eos.h"
#include "internal.h"
#include "selene.h"

#define LAYOUT_DOMAIN "flare-layout-v1"
#define STATE_DOMAIN "flare-prefix-state-v1"

static int plane_cmp(const void *a, const void *b)
{
	return strcmp(((const sel_plane *)a)->name, ((const sel_plane *)b)->name);
}

static int set_plane(sel_plane *p, const sel_allocation *a)
{
	p->name = strdup(a->name);
	if (!p->name)
		return -ENOMEM;
	p->kind = a->kind;
	p->address = a->address;
	p->unit_bytes = a->unit_bytes;
	return 0;
}

int sel_geometry_build(const sel_allocation *allocs, size_t n, uint32_t ranks, uint32_t page_tokens,
		       sel_geometry **out)
{
	sel_geometry *g = NULL;
	int rc;

	*out = NULL;
	if (ranks == 0 || ranks > 4096)
		return eos_fail(SEL_EGEOMETRY, "geometry: rank count %u (expected 1..4096)", ranks);
	if (page_tokens == 0 || page_tokens % SEL_BUCKET_TOKENS)
		return eos_fail(SEL_EGEOMETRY,
				"geometry: page tokens %u (expected a positive multiple of %u)",
				page_tokens, SEL_BUCKET_TOKENS);
	g = calloc(1, sizeof *g);
	if (!g || !(g->rank = calloc(ranks, sizeof *g->rank))) {
		free(g);
		return eos_fail(-ENOMEM, "geometry: out of memory");
	}
	g->ranks = ranks;
	g->page_tokens = page_tokens;

	for (size_t i = 0; i < n; i++) {
		const sel_allocation *a = &allocs[i];
		if (a->kind == SEL_MEM_PEER || a->group == SEL_GROUP_OTHER)
			continue;
		if (!a->name || !*a->name) {
			rc = eos_fail(SEL_EGEOMETRY, "geometry: allocation %zu has no name", i);
			goto fail;
		}
		if (a->rank >= ranks) {
			rc = eos_fail(SEL_EGEOMETRY,
				      "geometry: allocation '%s' names rank %u of %u", a->name,
				      a->rank, ranks);
			goto fail;
		}
		if (a->unit_bytes == 0 || a->count == 0) {
			rc = eos_fail(
				SEL_EGEOMETRY,
				"geometry: rank %u allocation '%s' has unit %llu bytes x %llu "
				"(expected non-zero)",
				a->rank, a->name, (unsigned long long)a->unit_bytes,
				(unsigned long long)a->count);
			goto fail;
		}
		sel_rank_geometry *r = &g->rank[a->rank];
		if (a->group == SEL_GROUP_STATE_ROWS) {
			if (r->row.name) {
				rc = eos_fail(
					SEL_EGEOMETRY,
					"geometry: rank %u has two STATE_ROWS allocations ('%s' "
					"and '%s'; expected exactly one)",
					a->rank, r->row.name, a->name);
				goto fail;
			}
			if (set_plane(&r->row, a))
				goto nomem;
			r->row_count = a->count;
		} else if (a->group == SEL_GROUP_KV_PAGES) {
			sel_plane *np = realloc(r->pages, (r->n_planes + 1) * sizeof *np);
			if (!np)
				goto nomem;
			r->pages = np;
			memset(&np[r->n_planes], 0, sizeof *np);
			if (set_plane(&np[r->n_planes], a))
				goto nomem;
			r->n_planes++;
			if (r->page_count == 0 || a->count < r->page_count)
				r->page_count = a->count;
			r->page_bytes += a->unit_bytes;
		} else {
			rc = eos_fail(SEL_EGEOMETRY,
				      "geometry: allocation '%s' has unknown group %d", a->name,
				      (int)a->group);
			goto fail;
		}
	}

	for (uint32_t rk = 0; rk < ranks; rk++) {
		sel_rank_geometry *r = &g->rank[rk];
		if (!r->row.name) {
			rc = eos_fail(
				SEL_EGEOMETRY,
				"geometry: rank %u has no STATE_ROWS allocation (expected exactly one)",
				rk);
			goto fail;
		}
		if (r->n_planes == 0) {
			rc = eos_fail(
				SEL_EGEOMETRY,
				"geometry: rank %u has no KV_PAGES allocation (expected at least one)",
				rk);
			goto fail;
		}
		qsort(r->pages, r->n_planes, sizeof *r->pages, plane_cmp);
		for (uint32_t p = 1; p < r->n_planes; p++)
			if (strcmp(r->pages[p - 1].name, r->pages[p].name) == 0) {
				rc = eos_fail(
					SEL_EGEOMETRY,
					"geometry: rank %u has two KV_PAGES allocations named '%s'",
					rk, r->pages[p].name);
				goto fail;
			}
	}
	*out = g;
	return 0;
nomem:
	rc = eos_fail(-ENOMEM, "geometry: out of memory");
fail:
	sel_geometry_free(g);
	return rc;
}

void sel_geometry_free(sel_geometry *g)
{
	if (!g)
		return;
	for (uint32_t rk = 0; g->rank && rk < g->ranks; rk++) {
		sel_rank_geometry *r = &g->rank[rk];
		free(r->row.name);
		for (uint32_t p = 0; p < r->n_planes; p++)
			free(r->pages[p].name);
		free(r->pages);
	}
	free(g->rank);
	free(g);
}

static void hash_u32(crypto_generichash_blake2b_state *st, uint32_t v)
{
	uint8_t b[4];
	sel_put_u32(b, v);
	crypto_generichash_blake2b_update(st, b, sizeof b);
}

static void hash_u64(crypto_generichash_blake2b_state *st, uint64_t v)
{
	uint8_t b[8];
	sel_put_u64(b, v);
	crypto_generichash_blake2b_update(st, b, sizeof b);
}

static void hash_plane(crypto_generichash_blake2b_state *st, const sel_plane *p)
{
	size_t len = strlen(p->name);
	hash_u32(st, (uint32_t)len);
	crypto_generichash_blake2b_update(st, (const unsigned char *)p->name, len);
	hash_u64(st, p->unit_bytes);
}

void sel_layout_fingerprint(const sel_geometry *g, uint8_t out[SEL_FINGERPRINT_BYTES])
{
	crypto_generichash_blake2b_state st;
	sel_crypto_init();
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_FINGERPRINT_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)LAYOUT_DOMAIN,
					  sizeof LAYOUT_DOMAIN - 1);
	hash_u32(&st, g->ranks);
	hash_u32(&st, g->page_tokens);
	for (uint32_t rk = 0; rk < g->ranks; rk++) {
		const sel_rank_geometry *r = &g->rank[rk];
		hash_u32(&st, r->n_planes);
		for (uint32_t p = 0; p < r->n_planes; p++)
			hash_plane(&st, &r->pages[p]);
		hash_plane(&st, &r->row);
	}
	crypto_generichash_blake2b_final(&st, out, SEL_FINGERPRINT_BYTES);
}

const char *sel_state_mode_name(sel_state_mode m)
{
	switch (m) {
	case SEL_MODE_ORDINARY: return "ordinary";
	case SEL_MODE_LEARNED: return "learned";
	case SEL_MODE_COPY: return "copy";
	}
	return "unknown";
}

void sel_offload_identity(const uint8_t model_identity[SEL_IDENTITY_BYTES], sel_state_mode mode,
			  uint8_t out[SEL_IDENTITY_BYTES])
{
	crypto_generichash_blake2b_state st;
	sel_crypto_init();
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_IDENTITY_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)STATE_DOMAIN,
					  sizeof STATE_DOMAIN - 1);
	crypto_generichash_blake2b_update(&st, model_identity, SEL_IDENTITY_BYTES);
	hash_u32(&st, (uint32_t)mode);
	crypto_generichash_blake2b_final(&st, out, SEL_IDENTITY_BYTES);
}
