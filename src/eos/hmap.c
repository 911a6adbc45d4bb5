/*
 * hmap.c - the intrusive chained hash table of hmap.h.
 *
 * INVARIANTS
 *   1. Every node is on the chain of bucket (hash & mask), exactly once.
 *   2. n counts the linked nodes.
 */
#include "hmap.h"

#include <errno.h>
#include <stdlib.h>

int eos_hmap_init(struct eos_hmap *m)
{
	m->n = 0;
	m->mask = 15;
	m->b = calloc(16, sizeof(struct eos_hnode *));
	return m->b ? 0 : -ENOMEM;
}

void eos_hmap_free(struct eos_hmap *m)
{
	free(m->b);
	m->b = NULL;
	m->mask = 0;
	m->n = 0;
}

static void grow(struct eos_hmap *m)
{
	size_t nb = (m->mask + 1) * 2;
	struct eos_hnode **b = calloc(nb, sizeof(struct eos_hnode *));
	if (!b)
		return; /* longer chains, still correct */
	for (size_t i = 0; i <= m->mask; i++) {
		struct eos_hnode *x = m->b[i], *next;
		for (; x; x = next) {
			next = x->next;
			struct eos_hnode **h = &b[x->hash & (nb - 1)];
			x->next = *h;
			*h = x;
		}
	}
	free(m->b);
	m->b = b;
	m->mask = nb - 1;
}

void eos_hmap_insert(struct eos_hmap *m, struct eos_hnode *x, uint64_t hash)
{
	if (m->n >= m->mask + 1)
		grow(m);
	x->hash = hash;
	struct eos_hnode **h = &m->b[hash & m->mask];
	x->next = *h;
	*h = x;
	m->n++;
}

void eos_hmap_remove(struct eos_hmap *m, struct eos_hnode *x)
{
	struct eos_hnode **p = &m->b[x->hash & m->mask];
	while (*p && *p != x)
		p = &(*p)->next;
	if (*p) {
		*p = x->next;
		x->next = NULL;
		m->n--;
	}
}

struct eos_hnode *eos_hmap_first(const struct eos_hmap *m, uint64_t hash)
{
	struct eos_hnode *x = m->b ? m->b[hash & m->mask] : NULL;
	while (x && x->hash != hash)
		x = x->next;
	return x;
}

struct eos_hnode *eos_hmap_next(const struct eos_hnode *x)
{
	uint64_t h = x->hash;
	for (x = x->next; x && x->hash != h; x = x->next)
		;
	return (struct eos_hnode *)x;
}
