/*
 * hmap.h - an intrusive chained hash table keyed by 64-bit hashes.
 *
 * Callers embed a struct eos_hnode in their objects, compute the hash
 * themselves and compare their own keys while walking one hash's chain
 * (eos_hmap_first / eos_hmap_next), so one table type serves lease ids,
 * checkpoint keys and bucket digests alike.  The bucket array doubles when
 * the table holds more nodes than buckets; a failed growth leaves the table
 * as it was and still correct (chains only get longer).  Single-threaded.
 */
#ifndef EOS_HMAP_H
#define EOS_HMAP_H

#include <stddef.h>
#include <stdint.h>

struct eos_hnode {
	struct eos_hnode *next;
	uint64_t hash;
};

struct eos_hmap {
	struct eos_hnode **b;
	size_t mask; /* buckets - 1 */
	size_t n;
};

/* An empty table with 16 buckets: 0 or -ENOMEM. */
int eos_hmap_init(struct eos_hmap *m);
/* Free the buckets (not the nodes).  Safe on a zeroed table. */
void eos_hmap_free(struct eos_hmap *m);
/* Link x under hash (several nodes may share a hash). */
void eos_hmap_insert(struct eos_hmap *m, struct eos_hnode *x, uint64_t hash);
/* Unlink x, which must be in m. */
void eos_hmap_remove(struct eos_hmap *m, struct eos_hnode *x);
/* The first node with this hash, then the next one after x, or NULL. */
struct eos_hnode *eos_hmap_first(const struct eos_hmap *m, uint64_t hash);
struct eos_hnode *eos_hmap_next(const struct eos_hnode *x);

/* A 64-bit mix of a 64-bit value (for ids that are small counters). */
static inline uint64_t eos_hash64(uint64_t v)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdull;
	v ^= v >> 33;
	v *= 0xc4ceb9fe1a85ec53ull;
	v ^= v >> 33;
	return v;
}

#endif
