/*
 * map.h - a small hash multimap from 64-bit hashes to 32-bit values,
 * internal to Helios (the checkpoint cache and the scheduler).
 *
 * The map does not know the keys it indexes: callers insert (hash, value)
 * pairs and, when looking up, walk every value stored under a hash and
 * compare the full key themselves.  That keeps one implementation for
 * PrefixKeys, bucket digests, checkpoint ids and request ids, and makes
 * truncated-hash collisions harmless.
 *
 * Open addressing with linear probing and backward-shift deletion; the
 * table doubles at half load.  An iteration must not overlap a mutation.
 * Single-threaded.
 */
#ifndef HEL_MAP_H
#define HEL_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "selene.h"

typedef struct hel_map {
	uint64_t *h;
	uint32_t *v;
	uint8_t *used;
	size_t cap; /* power of two, or 0 before the first insertion */
	size_t n;
} hel_map;

#define HEL_MAP_END SIZE_MAX

/* An empty map needs no initialisation beyond zeroing. */
void hel_map_free(hel_map *m);
/* Make room for `more` insertions without growing again (so a sequence of
 * insertions can be made failure-free).  0 or -ENOMEM. */
int hel_map_reserve(hel_map *m, size_t more);
/* Insert the pair (duplicates allowed).  0 or -ENOMEM (map unchanged). */
int hel_map_add(hel_map *m, uint64_t h, uint32_t v);
/* Remove one (h, v) pair; false if absent. */
bool hel_map_del(hel_map *m, uint64_t h, uint32_t v);
/* First / next position holding hash h, or HEL_MAP_END; the value is
 * m->v[pos]. */
size_t hel_map_first(const hel_map *m, uint64_t h);
size_t hel_map_next(const hel_map *m, uint64_t h, size_t pos);
/* Number of pairs stored under h with value v (checkers). */
size_t hel_map_count(const hel_map *m, uint64_t h, uint32_t v);

/* Hashes for the key kinds Helios indexes. */
static inline uint64_t hel_mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

static inline uint64_t hel_hash_digest(const sel_digest *d)
{
	uint64_t x = 0;
	for (int i = 0; i < 8; i++)
		x |= (uint64_t)d->b[i] << (8 * i);
	return hel_mix64(x);
}

static inline uint64_t hel_hash_key(const sel_key *k)
{
	return hel_mix64(hel_hash_digest(&k->digest) ^ (k->consumed * 0x9e3779b97f4a7c15ull));
}

static inline bool hel_digest_eq(const sel_digest *a, const sel_digest *b)
{
	for (int i = 0; i < SEL_DIGEST_BYTES; i++)
		if (a->b[i] != b->b[i])
			return false;
	return true;
}

#endif
