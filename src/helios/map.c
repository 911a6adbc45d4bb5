/*
 * map.c - the hash multimap of map.h.
 *
 * DESIGN
 *   Linear probing over a power-of-two table whose slot of hash h starts at
 *   h & (cap - 1).  Deletion shifts later members of the probe run back so
 *   no tombstones exist and lookups stop at the first empty slot.
 *
 * INVARIANTS
 *   1. n <= cap / 2 (the table grows before it would pass half load).
 *   2. Every stored pair is reachable from its home slot without crossing
 *      an empty slot.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "helios/map.h"

void hel_map_free(hel_map *m)
{
	free(m->h);
	free(m->v);
	free(m->used);
	memset(m, 0, sizeof(*m));
}

static void put_raw(hel_map *m, uint64_t h, uint32_t v)
{
	size_t mask = m->cap - 1, i = (size_t)h & mask;
	while (m->used[i])
		i = (i + 1) & mask;
	m->used[i] = 1;
	m->h[i] = h;
	m->v[i] = v;
	m->n++;
}

static int grow(hel_map *m, size_t want)
{
	size_t cap = m->cap ? m->cap : 16;
	while (want > cap / 2)
		cap *= 2;
	if (cap == m->cap)
		return 0;
	hel_map nm = {0};
	nm.h = malloc(cap * sizeof(*nm.h));
	nm.v = malloc(cap * sizeof(*nm.v));
	nm.used = calloc(cap, 1);
	if (!nm.h || !nm.v || !nm.used) {
		hel_map_free(&nm);
		return -ENOMEM;
	}
	nm.cap = cap;
	for (size_t i = 0; i < m->cap; i++)
		if (m->used[i])
			put_raw(&nm, m->h[i], m->v[i]);
	hel_map_free(m);
	*m = nm;
	return 0;
}

int hel_map_reserve(hel_map *m, size_t more) { return grow(m, m->n + more); }

int hel_map_add(hel_map *m, uint64_t h, uint32_t v)
{
	int rc = grow(m, m->n + 1);
	if (rc)
		return rc;
	put_raw(m, h, v);
	return 0;
}

bool hel_map_del(hel_map *m, uint64_t h, uint32_t v)
{
	if (!m->cap)
		return false;
	size_t mask = m->cap - 1, i = (size_t)h & mask;
	while (m->used[i] && !(m->h[i] == h && m->v[i] == v))
		i = (i + 1) & mask;
	if (!m->used[i])
		return false;
	/* Backward shift: move later members of the run into the hole when
	 * their home slot does not lie cyclically in (hole, j]. */
	size_t hole = i, j = i;
	for (;;) {
		j = (j + 1) & mask;
		if (!m->used[j])
			break;
		size_t home = (size_t)m->h[j] & mask;
		bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
		if (stays)
			continue;
		m->h[hole] = m->h[j];
		m->v[hole] = m->v[j];
		hole = j;
	}
	m->used[hole] = 0;
	m->n--;
	return true;
}

size_t hel_map_next(const hel_map *m, uint64_t h, size_t pos)
{
	if (!m->cap)
		return HEL_MAP_END;
	size_t mask = m->cap - 1;
	for (size_t i = (pos + 1) & mask; m->used[i]; i = (i + 1) & mask)
		if (m->h[i] == h)
			return i;
	return HEL_MAP_END;
}

size_t hel_map_first(const hel_map *m, uint64_t h)
{
	if (!m->cap)
		return HEL_MAP_END;
	size_t mask = m->cap - 1, i = (size_t)h & mask;
	if (m->used[i] && m->h[i] == h)
		return i;
	return m->used[i] ? hel_map_next(m, h, i) : HEL_MAP_END;
}

size_t hel_map_count(const hel_map *m, uint64_t h, uint32_t v)
{
	size_t n = 0;
	for (size_t p = hel_map_first(m, h); p != HEL_MAP_END; p = hel_map_next(m, h, p))
		if (m->v[p] == v)
			n++;
	return n;
}
