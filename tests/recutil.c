/*
 * recutil.c - see recutil.h.
 */
#include "recutil.h"

#include <stdio.h>
#include <string.h>

void test_geo_rank(struct test_geo *t, uint32_t r, uint32_t n, const uint64_t *units,
		   uint64_t row_bytes)
{
	sel_rank_geometry *rg = &t->rank[r];
	CHECK(r < TG_MAX_RANKS && n <= TG_MAX_PLANES);
	memset(rg, 0, sizeof(*rg));
	rg->row.name = (char *)"state";
	rg->row.unit_bytes = row_bytes;
	rg->row_count = 4;
	rg->pages = t->planes[r];
	rg->n_planes = n;
	rg->page_count = 64;
	for (uint32_t i = 0; i < n; i++) {
		snprintf(t->names[r][i], sizeof t->names[r][i], "p%03u", i % 1000);
		t->planes[r][i].name = t->names[r][i];
		t->planes[r][i].unit_bytes = units[i];
		rg->page_bytes += units[i];
	}
}

void test_geo_init(struct test_geo *t, uint32_t ranks, uint32_t page_tokens, uint32_t n,
		   const uint64_t *units, uint64_t row_bytes)
{
	memset(t, 0, sizeof(*t));
	t->g.ranks = ranks;
	t->g.page_tokens = page_tokens;
	t->g.rank = t->rank;
	for (uint32_t r = 0; r < ranks; r++)
		test_geo_rank(t, r, n, units, row_bytes);
}

void test_ns_init(sel_record_ns *ns, const sel_geometry *g, uint8_t model)
{
	uint8_t mid[SEL_IDENTITY_BYTES], id[SEL_IDENTITY_BYTES];
	memset(mid, model, sizeof mid);
	sel_offload_identity(mid, SEL_MODE_ORDINARY, id);
	CHECK_OK(sel_record_ns_init(ns, g, id));
}

void test_key(test_rng *r, uint64_t consumed, sel_key *k)
{
	k->consumed = consumed;
	test_rng_fill(r, k->digest.b, sizeof k->digest.b);
}

void test_desc(test_rng *r, uint32_t page_tokens, uint64_t c, const sel_key *parent, bool full,
	       sel_record_desc *d)
{
	memset(d, 0, sizeof(*d));
	test_key(r, c, &d->key);
	test_rng_fill(r, d->bucket.b, sizeof d->bucket.b);
	if (parent)
		d->parent = *parent;
	if (!parent || full)
		d->tail = (uint32_t)(c / page_tokens);
	else
		d->tail = (uint32_t)(c / page_tokens - parent->consumed / page_tokens);
}

void test_record_write(int dirfd, const sel_record_ns *ns, const sel_record_desc *d, bool row)
{
	const sel_record_layout *l = &ns->layout;
	uint64_t stride = l->sz.page_record;
	uint32_t rs = sel_record_row_slots(l, d->flags);
	uint32_t n = d->tail + rs;
	uint8_t *mem = eos_aligned_alloc(4096, (n ? n : 1) * stride);
	test_rng r;
	test_rng_init(&r, d->key.consumed ^ d->key.digest.b[0]);
	test_rng_fill(&r, mem, n * stride);
	void **pages = calloc(d->tail + 1, sizeof(*pages)), **rslots = calloc(rs, sizeof(*rslots));
	for (uint32_t i = 0; i < d->tail; i++)
		pages[i] = mem + i * stride;
	for (uint32_t i = 0; i < rs; i++)
		rslots[i] = mem + (d->tail + i) * stride;
	struct iovec iov[64];
	int pieces = sel_record_row_iov(l, d->flags, rslots, rs, iov, 64);
	CHECK_OK(pieces);
	struct sel_record_write_opts o = {.direct = true};
	CHECK_OK(sel_record_write(dirfd, ns, d, pages, row, iov, (uint32_t)pieces, &o));
	free(pages);
	free(rslots);
	eos_aligned_free(mem);
}
