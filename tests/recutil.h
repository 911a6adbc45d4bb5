/*
 * recutil.h - helpers shared by the record, disk and scan tests and the
 * disk benchmark: hand-built geometries, record namespaces, keys and
 * payload patterns.
 */
#ifndef RECUTIL_H
#define RECUTIL_H

#include "record.h"
#include "testutil.h"

#define TG_MAX_RANKS 8
#define TG_MAX_PLANES 128

/* A geometry built by hand (addresses and counts are irrelevant to
 * records).  Plane names are "p000", "p001", ... so geometry order is index
 * order. */
struct test_geo {
	sel_geometry g;
	sel_rank_geometry rank[TG_MAX_RANKS];
	sel_plane planes[TG_MAX_RANKS][TG_MAX_PLANES];
	char names[TG_MAX_RANKS][TG_MAX_PLANES][16];
};

/* ranks ranks, each with n planes of units[] and a row of row_bytes. */
void test_geo_init(struct test_geo *t, uint32_t ranks, uint32_t page_tokens, uint32_t n,
		   const uint64_t *units, uint64_t row_bytes);
/* Replace rank r's planes and row. */
void test_geo_rank(struct test_geo *t, uint32_t r, uint32_t n, const uint64_t *units,
		   uint64_t row_bytes);

/* A namespace for g with the offload identity of model identity byte `model`
 * (all 32 bytes equal), ordinary mode. */
void test_ns_init(sel_record_ns *ns, const sel_geometry *g, uint8_t model);

/* A random key of consumed tokens. */
void test_key(test_rng *r, uint64_t consumed, sel_key *k);

/* A record desc: key at c tokens, parent (NULL or a key), tail derived
 * (linked) or the full chain (full == true or no parent). */
void test_desc(test_rng *r, uint32_t page_tokens, uint64_t c, const sel_key *parent, bool full,
	       sel_record_desc *d);

/* Write record d of ns into dirfd through sel_record_write (direct I/O
 * where the filesystem takes it), its page and row bytes a pattern seeded
 * by its key; with or without the row. */
void test_record_write(int dirfd, const sel_record_ns *ns, const sel_record_desc *d, bool row);

#endif
