/*
 * catalog.c - the pool manager's catalogue: one index per scope of the
 * records in the arena and of what instances hold (design 2.15 scope, LRU
 * and max age; 2.3 lookup by buckets; docs/pool.md).
 *
 * DESIGN
 *
 * A scope is what a hello names -- the pool name, offload identity, layout
 * fingerprint, page tokens, rank table and slot sizes -- hashed to an id, so
 * instances share only identical record layouts.  Within a scope every key
 * that something is known about has one entry: its arena record (if any)
 * and its holders (instances announcing it in their GPU, DRAM or NVMe
 * tier).  Entries hang in a bucket list (the boundary digest at consumed /
 * 64), deepest first, exactly as a local index files its nodes, so a
 * lookup walks the request's boundaries from the deepest and meets
 * candidates deepest first.
 *
 * The manager never sees tokens.  A lookup carries boundary digests only;
 * the answer names candidates with every chain node's key, and the client
 * compares each with history.key_at(consumed) (issue 12's rule) before it
 * claims, and again on the grant.  So a bucket shared by two prefixes (two
 * endpoints in one 64-token block) yields both, and the client keeps the
 * one that is its own.
 *
 * Arena records form trees like local records: a record either links
 * under a parent record of the scope (its tail is the pages since the
 * parent's endpoint) or holds its whole chain as a root.  Every record keeps
 * its row (page-only records are not pooled).  One least-recently-used list
 * runs over the ready records of every scope, because all scopes share one
 * arena: eviction takes the least recently used unpinned leaf; the max-age
 * sweep walks the same list from its old end, and lookups and claims treat
 * an expired record as absent even before the sweep reaches it.  A record
 * a reader reported corrupt is marked bad: never served, and removed when
 * it is an unpinned leaf.  Use means a put or a restore (design 2.5: "manager
 * copies' max age counts from their last put or restore"), so the list is
 * in last-use order and the sweep stops at the first fresh record.
 *
 * INVARIANTS (mgr_catalog_check)
 *   1. An entry exists only with a record or a holder, is in its scope's key
 *      table and in exactly one bucket list, ordered by consumed descending.
 *   2. A record's children count equals the ready records linked under it;
 *      a record with children or pins is never removed; a linked parent is
 *      ready and has a smaller consumed count.
 *   3. The LRU list holds exactly the ready records; cat->records counts
 *      every record, cat->holds every holding.
 */
#include "manager/manager.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define S_NS 1000000000ull

struct mgr_bucket {
	struct eos_hnode hn;
	sel_digest d;
	struct mgr_entry *first;
};

static uint64_t key_hash(const sel_key *k) { return sel_get_u64(k->digest.b) ^ k->consumed; }
static uint64_t digest_hash(const sel_digest *d) { return sel_get_u64(d->b); }
static bool digest_eq(const sel_digest *a, const sel_digest *b)
{
	return !memcmp(a->b, b->b, SEL_DIGEST_BYTES);
}

void mgr_catalog_init(struct mgr_catalog *cat, struct mgr_arena *a, struct mgr_stats *st,
		      uint32_t max_scopes, uint64_t max_age_ns, uint32_t window_limit)
{
	memset(cat, 0, sizeof *cat);
	cat->arena = a;
	cat->st = st;
	cat->max_scopes = max_scopes;
	cat->max_age_ns = max_age_ns;
	cat->window_limit = window_limit;
}

/* ---- scopes ---------------------------------------------------------------------------- */

static void scope_free(struct mgr_catalog *cat, struct mgr_scope *sc)
{
	if (cat->scopes == sc)
		cat->scopes = sc->next;
	else
		sc->prev->next = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	cat->n_scopes--;
	eos_hmap_free(&sc->keys);
	eos_hmap_free(&sc->buckets);
	free(sc->table_copy);
	free(sc);
}

static void scope_maybe_free(struct mgr_catalog *cat, struct mgr_scope *sc)
{
	if (!sc->sessions && !sc->entries)
		scope_free(cat, sc);
}

struct mgr_scope *mgr_scope_ref(struct mgr_catalog *cat, const char *name,
				const struct sel_pool_scope *s)
{
	uint8_t id[SEL_POOL_ID_BYTES];
	sel_pool_scope_id(name, s, id);
	for (struct mgr_scope *sc = cat->scopes; sc; sc = sc->next)
		if (!memcmp(sc->id, id, sizeof id)) {
			sc->sessions++;
			return sc;
		}
	if (cat->n_scopes >= cat->max_scopes)
		return NULL;
	struct mgr_scope *sc = calloc(1, sizeof *sc);
	if (!sc)
		return NULL;
	sc->table_copy = malloc(s->table_bytes ? s->table_bytes : 1);
	if (!sc->table_copy || eos_hmap_init(&sc->keys) || eos_hmap_init(&sc->buckets)) {
		eos_hmap_free(&sc->keys);
		eos_hmap_free(&sc->buckets);
		free(sc->table_copy);
		free(sc);
		return NULL;
	}
	memcpy(sc->id, id, sizeof id);
	sc->s = *s;
	if (s->table_bytes)
		memcpy(sc->table_copy, s->table, s->table_bytes);
	sc->s.table = sc->table_copy;
	sc->sessions = 1;
	sc->next = cat->scopes;
	if (cat->scopes)
		cat->scopes->prev = sc;
	cat->scopes = sc;
	cat->n_scopes++;
	return sc;
}

void mgr_scope_unref(struct mgr_catalog *cat, struct mgr_scope *sc)
{
	if (!sc)
		return;
	sc->sessions--;
	scope_maybe_free(cat, sc);
}

/* ---- entries ---------------------------------------------------------------------------- */

struct mgr_entry *mgr_entry_find(struct mgr_scope *sc, const sel_key *key)
{
	for (struct eos_hnode *x = eos_hmap_first(&sc->keys, key_hash(key)); x;
	     x = eos_hmap_next(x)) {
		struct mgr_entry *e = (struct mgr_entry *)x;
		if (sel_key_eq(&e->key, key))
			return e;
	}
	return NULL;
}

static struct mgr_bucket *bucket_find(struct mgr_scope *sc, const sel_digest *d)
{
	for (struct eos_hnode *x = eos_hmap_first(&sc->buckets, digest_hash(d)); x;
	     x = eos_hmap_next(x)) {
		struct mgr_bucket *b = (struct mgr_bucket *)x;
		if (digest_eq(&b->d, d))
			return b;
	}
	return NULL;
}

/* The entry of key, created when absent; NULL when out of memory or when
 * the entry exists under another bucket (a lie about the key's prefix). */
static struct mgr_entry *entry_get(struct mgr_scope *sc, const sel_key *key,
				   const sel_digest *bucket)
{
	struct mgr_entry *e = mgr_entry_find(sc, key);
	if (e)
		return digest_eq(&e->bucket, bucket) ? e : NULL;
	struct mgr_bucket *b = bucket_find(sc, bucket);
	bool new_bucket = !b;
	if (!b) {
		if (!(b = calloc(1, sizeof *b)))
			return NULL;
		b->d = *bucket;
	}
	if (!(e = calloc(1, sizeof *e))) {
		if (new_bucket)
			free(b);
		return NULL;
	}
	if (new_bucket)
		eos_hmap_insert(&sc->buckets, &b->hn, digest_hash(bucket));
	e->scope = sc;
	e->key = *key;
	e->bucket = *bucket;
	e->bk = b;
	/* Deepest first. */
	struct mgr_entry *prev = NULL, *x = b->first;
	while (x && x->key.consumed >= key->consumed) {
		prev = x;
		x = x->bnext;
	}
	e->bprev = prev;
	e->bnext = x;
	if (prev)
		prev->bnext = e;
	else
		b->first = e;
	if (x)
		x->bprev = e;
	eos_hmap_insert(&sc->keys, &e->hn, key_hash(key));
	sc->entries++;
	return e;
}

static void entry_maybe_free(struct mgr_catalog *cat, struct mgr_entry *e)
{
	if (e->rec || e->holds)
		return;
	struct mgr_scope *sc = e->scope;
	struct mgr_bucket *b = e->bk;
	if (e->bprev)
		e->bprev->bnext = e->bnext;
	else
		b->first = e->bnext;
	if (e->bnext)
		e->bnext->bprev = e->bprev;
	if (!b->first) {
		eos_hmap_remove(&sc->buckets, &b->hn);
		free(b);
	}
	eos_hmap_remove(&sc->keys, &e->hn);
	free(e);
	sc->entries--;
	scope_maybe_free(cat, sc);
}

/* ---- holdings --------------------------------------------------------------------------------- */

static void hold_remove(struct mgr_catalog *cat, struct mgr_session_holds *sh, struct mgr_hold *h)
{
	struct mgr_entry *e = h->e;
	struct mgr_hold **p = &e->holds;
	while (*p && *p != h)
		p = &(*p)->enext;
	if (*p)
		*p = h->enext;
	if (h->sprev)
		h->sprev->snext = h->snext;
	else
		sh->head = h->snext;
	if (h->snext)
		h->snext->sprev = h->sprev;
	sh->n--;
	cat->holds--;
	free(h);
	entry_maybe_free(cat, e);
}

int mgr_hold_add(struct mgr_catalog *cat, struct mgr_scope *sc, struct mgr_session *s,
		 struct mgr_session_holds *sh, const struct sel_pool_holding *h)
{
	if (!h->key.consumed)
		return -EINVAL;
	struct mgr_entry *e = entry_get(sc, &h->key, &h->bucket);
	if (!e)
		return mgr_entry_find(sc, &h->key) ? -EINVAL : -ENOMEM;
	for (struct mgr_hold *x = e->holds; x; x = x->enext)
		if (x->s == s && x->source == h->source) {
			x->generation = h->generation;
			return 0;
		}
	struct mgr_hold *x = calloc(1, sizeof *x);
	if (!x) {
		entry_maybe_free(cat, e);
		return -ENOMEM;
	}
	x->e = e;
	x->s = s;
	x->source = h->source;
	x->generation = h->generation;
	/* GPU first, then DRAM, then NVMe: the answer's order of holders. */
	struct mgr_hold **p = &e->holds;
	while (*p && (*p)->source <= x->source)
		p = &(*p)->enext;
	x->enext = *p;
	*p = x;
	x->snext = sh->head;
	if (sh->head)
		sh->head->sprev = x;
	sh->head = x;
	sh->n++;
	cat->holds++;
	return 0;
}

void mgr_hold_withdraw(struct mgr_catalog *cat, struct mgr_scope *sc, struct mgr_session *s,
		       struct mgr_session_holds *sh, const struct sel_pool_holding *h)
{
	struct mgr_entry *e = mgr_entry_find(sc, &h->key);
	if (!e)
		return;
	for (struct mgr_hold *x = e->holds; x; x = x->enext)
		if (x->s == s && x->source == h->source) {
			if (x->generation == h->generation)
				hold_remove(cat, sh, x);
			return;
		}
}

void mgr_hold_reset(struct mgr_catalog *cat, struct mgr_session_holds *sh, uint32_t sources)
{
	for (struct mgr_hold *x = sh->head, *nx; x; x = nx) {
		nx = x->snext;
		if (sources & (1u << x->source))
			hold_remove(cat, sh, x);
	}
}

struct mgr_hold *mgr_hold_find(struct mgr_scope *sc, const sel_key *key, const uint8_t *instance,
			       uint8_t source)
{
	struct mgr_entry *e = mgr_entry_find(sc, key);
	if (!e)
		return NULL;
	for (struct mgr_hold *x = e->holds; x; x = x->enext)
		if (x->source == source &&
		    !memcmp(mgr_session_instance(x->s), instance, SEL_POOL_ID_BYTES))
			return x;
	return NULL;
}

/* ---- records ------------------------------------------------------------------------------------ */

static void lru_unlink(struct mgr_catalog *cat, struct mgr_record *r)
{
	if (r->lprev)
		r->lprev->lnext = r->lnext;
	else
		cat->lru_head = r->lnext;
	if (r->lnext)
		r->lnext->lprev = r->lprev;
	else
		cat->lru_tail = r->lprev;
	r->lprev = r->lnext = NULL;
}

static void lru_push(struct mgr_catalog *cat, struct mgr_record *r)
{
	r->lnext = NULL;
	r->lprev = cat->lru_tail;
	if (cat->lru_tail)
		cat->lru_tail->lnext = r;
	else
		cat->lru_head = r;
	cat->lru_tail = r;
}

bool mgr_record_expired(const struct mgr_catalog *cat, const struct mgr_record *r, uint64_t now)
{
	return cat->max_age_ns && now > r->used_ns && now - r->used_ns > cat->max_age_ns;
}

static bool servable(const struct mgr_catalog *cat, const struct mgr_record *r, uint64_t now)
{
	return r && r->ready && !r->bad && !mgr_record_expired(cat, r, now);
}

/* Remove a ready, unpinned, childless record. */
static void record_remove(struct mgr_catalog *cat, struct mgr_record *r)
{
	lru_unlink(cat, r);
	if (r->parent)
		r->parent->children--;
	mgr_arena_free(cat->arena, r->w, r->nw, r->e->scope->s.slot_bytes);
	cat->records--;
	cat->record_bytes -= r->bytes;
	r->e->scope->records--;
	struct mgr_entry *e = r->e;
	e->rec = NULL;
	free(r->w);
	free(r->cksum);
	free(r);
	entry_maybe_free(cat, e);
}

uint32_t mgr_record_precheck(struct mgr_catalog *cat, struct mgr_scope *sc,
			     const struct sel_pool_c_put *p)
{
	uint32_t pt = sc->s.page_tokens;
	uint64_t c = p->key.consumed, pc = p->parent.consumed;
	if (!c || p->has_row != 1 || (!sel_key_is_none(&p->parent) && pc >= c))
		return SEL_POOL_BAD_REQUEST;
	uint64_t slots = (uint64_t)p->tail + sc->s.row_slots;
	if (p->tail > SEL_POOL_MAX_PAGES || slots > SEL_POOL_MAX_WINDOWS * 64ull ||
	    slots * sc->s.slot_bytes > cat->arena->bytes - cat->arena->data_start)
		return SEL_POOL_OVERSIZE;
	struct mgr_entry *e = mgr_entry_find(sc, &p->key);
	if (e && !digest_eq(&e->bucket, &p->bucket))
		return SEL_POOL_BAD_REQUEST;
	if (e && e->rec)
		return e->rec->ready && !e->rec->bad ? SEL_POOL_PRESENT : SEL_POOL_IN_FLIGHT;
	bool root = p->tail == c / pt;
	struct mgr_entry *pe = sel_key_is_none(&p->parent) ? NULL : mgr_entry_find(sc, &p->parent);
	bool parent_here = pe && pe->rec && pe->rec->ready && !pe->rec->bad;
	bool linked = parent_here && p->tail == c / pt - pc / pt;
	if (!root && !linked)
		return parent_here || sel_key_is_none(&p->parent) ? SEL_POOL_BAD_REQUEST
								  : SEL_POOL_ORPHAN;
	return SEL_POOL_OK;
}

uint32_t mgr_record_begin(struct mgr_catalog *cat, struct mgr_scope *sc,
			  const struct sel_pool_c_put *p, struct mgr_record **out)
{
	*out = NULL;
	uint32_t why = mgr_record_precheck(cat, sc, p);
	if (why)
		return why;
	uint32_t pt = sc->s.page_tokens;
	struct mgr_entry *pe = sel_key_is_none(&p->parent) ? NULL : mgr_entry_find(sc, &p->parent);
	struct mgr_record *parent = NULL;
	if (pe && pe->rec && pe->rec->ready && !pe->rec->bad &&
	    p->tail == p->key.consumed / pt - p->parent.consumed / pt)
		parent = pe->rec;
	struct mgr_record *r = calloc(1, sizeof *r);
	if (!r)
		return SEL_POOL_NO_ROOM;
	struct mgr_entry *e = entry_get(sc, &p->key, &p->bucket);
	if (!e) {
		free(r);
		return SEL_POOL_NO_ROOM;
	}
	r->e = e;
	r->parent = parent;
	r->parent_key = p->parent;
	r->tail = p->tail;
	r->bytes = ((uint64_t)p->tail + sc->s.row_slots) * sc->s.slot_bytes;
	if (parent)
		parent->pins++;
	e->rec = r;
	cat->records++;
	sc->records++;
	*out = r;
	return SEL_POOL_OK;
}

void mgr_record_set_windows(struct mgr_record *r, struct sel_pool_window *w, uint32_t nw)
{
	r->w = w;
	r->nw = nw;
}

uint32_t mgr_record_commit(struct mgr_catalog *cat, struct mgr_record *r, const uint64_t *cksum,
			   uint32_t n, uint64_t row_cksum, uint64_t now)
{
	if (n != r->tail)
		return SEL_POOL_BAD_REQUEST;
	if (n && !(r->cksum = malloc((size_t)n * sizeof *r->cksum)))
		return SEL_POOL_NO_ROOM;
	if (n)
		memcpy(r->cksum, cksum, (size_t)n * sizeof *cksum);
	r->row_cksum = row_cksum;
	r->ready = true;
	r->used_ns = now;
	if (r->parent) {
		r->parent->children++;
		mgr_record_unpin(cat, r->parent);
	}
	lru_push(cat, r);
	cat->record_bytes += r->bytes;
	cat->st->bytes_put += r->bytes;
	return SEL_POOL_OK;
}

void mgr_record_abort(struct mgr_catalog *cat, struct mgr_record *r, struct sel_pool_window **w,
		      uint32_t *nw)
{
	*w = r->w;
	*nw = r->nw;
	struct mgr_entry *e = r->e;
	e->rec = NULL;
	cat->records--;
	e->scope->records--;
	struct mgr_record *parent = r->parent;
	free(r->cksum);
	free(r);
	if (parent)
		mgr_record_unpin(cat, parent);
	entry_maybe_free(cat, e);
}

void mgr_record_pin(struct mgr_record *r) { r->pins++; }

void mgr_record_unpin(struct mgr_catalog *cat, struct mgr_record *r)
{
	if (--r->pins == 0 && r->bad && !r->children && r->ready)
		record_remove(cat, r);
}

void mgr_record_touch(struct mgr_catalog *cat, struct mgr_record *r, uint64_t now)
{
	r->used_ns = now;
	lru_unlink(cat, r);
	lru_push(cat, r);
}

int mgr_catalog_evict_one(struct mgr_catalog *cat)
{
	for (struct mgr_record *r = cat->lru_head; r; r = r->lnext)
		if (!r->pins && !r->children) {
			record_remove(cat, r);
			cat->st->evicted++;
			return 1;
		}
	return 0;
}

void mgr_catalog_sweep(struct mgr_catalog *cat, uint64_t now)
{
	if (!cat->max_age_ns || now < cat->next_sweep_ns)
		return;
	uint64_t every = cat->max_age_ns < 60 * S_NS ? cat->max_age_ns : 60 * S_NS;
	cat->next_sweep_ns = now + every;
	uint32_t removed = 0;
	for (struct mgr_record *r = cat->lru_head, *nx; r && removed < 64; r = nx) {
		nx = r->lnext;
		if (!mgr_record_expired(cat, r, now))
			break;
		if (r->pins || r->children)
			continue;
		/* Expired ancestors this leaves childless go with it. */
		struct mgr_record *p = r->parent;
		record_remove(cat, r);
		cat->st->expired++;
		removed++;
		while (p && !p->pins && !p->children && mgr_record_expired(cat, p, now)) {
			struct mgr_record *up = p->parent;
			if (p == nx)
				nx = p->lnext;
			record_remove(cat, p);
			cat->st->expired++;
			p = up;
		}
	}
}

int mgr_catalog_alloc(struct mgr_catalog *cat, const struct mgr_scope *sc, uint32_t pages,
		      uint32_t rows, struct sel_pool_window **w, uint32_t *nw)
{
	uint64_t sb = sc->s.slot_bytes, slots = (uint64_t)pages + rows;
	uint32_t per = cat->window_limit / sb > 1 ? (uint32_t)(cat->window_limit / sb) : 1;
	uint32_t cap = slots < SEL_POOL_MAX_WINDOWS ? (uint32_t)slots : SEL_POOL_MAX_WINDOWS;
	*w = NULL;
	*nw = 0;
	if (!slots)
		return 0;
	struct sel_pool_window *v = malloc((size_t)cap * sizeof *v);
	if (!v)
		return -ENOMEM;
	while (mgr_arena_free_bytes(cat->arena) < slots * sb)
		if (!mgr_catalog_evict_one(cat)) {
			free(v);
			return -ENOSPC;
		}
	for (;;) {
		uint32_t n = 0;
		int rc =
			mgr_arena_alloc(cat->arena, sb, pages, per, SEL_POOL_WIN_PAGES, v, &n, cap);
		if (!rc) {
			rc = mgr_arena_alloc(cat->arena, sb, rows, per, SEL_POOL_WIN_ROW, v, &n,
					     cap);
			if (rc)
				mgr_arena_free(cat->arena, v, n, sb);
		}
		if (!rc) {
			*w = v;
			*nw = n;
			return 0;
		}
		/* Fragmented or misaligned: make more room and try again. */
		if (!mgr_catalog_evict_one(cat)) {
			free(v);
			return -ENOSPC;
		}
	}
}

/* ---- chains and answers ---------------------------------------------------------------------- */

uint32_t mgr_catalog_chain(struct mgr_catalog *cat, struct mgr_scope *sc, const sel_key *key,
			   uint64_t resident, uint64_t now, struct mgr_record **chain, uint32_t cap,
			   uint32_t *n, uint64_t *base)
{
	*n = 0;
	*base = 0;
	struct mgr_entry *e = mgr_entry_find(sc, key);
	if (!e || !servable(cat, e->rec, now))
		return SEL_POOL_NOT_FOUND;
	if (key->consumed <= resident)
		return SEL_POOL_BAD_REQUEST;
	uint32_t k = 0;
	for (struct mgr_record *x = e->rec; x; x = x->parent) {
		if (x->e->key.consumed <= resident) {
			*base = x->e->key.consumed;
			break;
		}
		if (!servable(cat, x, now))
			return SEL_POOL_NOT_FOUND;
		if (k == cap)
			return SEL_POOL_OVERSIZE;
		chain[k++] = x;
	}
	for (uint32_t i = 0; i < k / 2; i++) {
		struct mgr_record *t = chain[i];
		chain[i] = chain[k - 1 - i];
		chain[k - 1 - i] = t;
	}
	*n = k;
	return SEL_POOL_OK;
}

/* Whether r's chain above resident is servable, and how many of its nodes
 * are not in the answer yet. */
static bool chain_ok(const struct mgr_catalog *cat, const struct mgr_record *r, uint64_t resident,
		     uint64_t now, uint32_t *fresh)
{
	*fresh = 0;
	for (const struct mgr_record *x = r; x && x->e->key.consumed > resident; x = x->parent) {
		if (!servable(cat, x, now))
			return false;
		if (x->mark == cat->mark)
			return true; /* the rest is in the answer already */
		(*fresh)++;
	}
	return true;
}

int mgr_catalog_answer(struct mgr_catalog *cat, struct mgr_scope *sc, const struct mgr_session *s,
		       const struct sel_pool_c_lookup *l, uint64_t now, struct sel_pool_msg *out)
{
	memset(out, 0, sizeof *out);
	out->type = SEL_POOL_M_ANSWER;
	struct sel_pool_m_answer *a = &out->u.answer;
	a->ticket = l->ticket;
	size_t nb = SEL_POOL_MAX_NODES * sizeof *a->nodes;
	out->mem = malloc(nb + SEL_POOL_MAX_CANDIDATES * sizeof *a->cands);
	if (!out->mem)
		return -ENOMEM;
	a->nodes = out->mem;
	a->cands = (struct sel_pool_candidate *)((char *)out->mem + nb);
	uint32_t pt = sc->s.page_tokens;
	uint64_t rs = sc->s.row_slots, sb = sc->s.slot_bytes;
	if (++cat->mark == 0)
		cat->mark = 1;
	for (uint32_t i = 0; i < l->n && a->n_cands < SEL_POOL_MAX_CANDIDATES; i++) {
		uint64_t k = l->k_hi - i;
		struct mgr_bucket *b = bucket_find(sc, &l->bounds[i]);
		for (struct mgr_entry *e = b ? b->first : NULL;
		     e && a->n_cands < SEL_POOL_MAX_CANDIDATES; e = e->bnext) {
			uint64_t c = e->key.consumed;
			if (c / SEL_BUCKET_TOKENS != k || c <= l->resident || c > l->limit)
				continue;
			uint64_t bytes = (c / pt - l->resident / pt + rs) * sb;
			/* Holders: one node for the endpoint, shared by them. */
			uint32_t hnode = SEL_POOL_NONE;
			for (struct mgr_hold *h = e->holds;
			     h && a->n_cands < SEL_POOL_MAX_CANDIDATES; h = h->enext) {
				if (h->s == s)
					continue;
				if (hnode == SEL_POOL_NONE) {
					if (a->n_nodes == SEL_POOL_MAX_NODES)
						break;
					hnode = a->n_nodes++;
					a->nodes[hnode] = (struct sel_pool_anode){
						e->key, (uint32_t)(c / pt), SEL_POOL_NONE, 1};
				}
				struct sel_pool_candidate *cd = &a->cands[a->n_cands++];
				*cd = (struct sel_pool_candidate){.source = h->source,
								  .node = hnode,
								  .base = 0,
								  .generation = h->generation,
								  .bytes = bytes};
				memcpy(cd->holder, mgr_session_instance(h->s), SEL_POOL_ID_BYTES);
			}
			/* The arena's copy, with its chain. */
			struct mgr_record *r = e->rec;
			uint32_t fresh;
			if (!servable(cat, r, now) || a->n_cands == SEL_POOL_MAX_CANDIDATES ||
			    !chain_ok(cat, r, l->resident, now, &fresh) ||
			    a->n_nodes + fresh > SEL_POOL_MAX_NODES)
				continue;
			uint32_t prev = SEL_POOL_NONE, endpoint = SEL_POOL_NONE;
			uint64_t base = 0;
			for (struct mgr_record *x = r; x; x = x->parent) {
				if (x->e->key.consumed <= l->resident) {
					base = x->e->key.consumed;
					break;
				}
				uint32_t idx;
				bool seen = x->mark == cat->mark;
				if (seen) {
					idx = x->idx;
				} else {
					idx = a->n_nodes++;
					a->nodes[idx] = (struct sel_pool_anode){x->e->key, x->tail,
										SEL_POOL_NONE, 1};
					x->mark = cat->mark;
					x->idx = idx;
				}
				if (prev != SEL_POOL_NONE)
					a->nodes[prev].up = idx;
				else
					endpoint = idx;
				if (seen) {
					/* Its base is the earlier candidate's; walk on to find it. */
					const struct mgr_record *y = x;
					while (y && y->e->key.consumed > l->resident)
						y = y->parent;
					base = y ? y->e->key.consumed : 0;
					break;
				}
				prev = idx;
			}
			a->cands[a->n_cands++] =
				(struct sel_pool_candidate){.source = SEL_POOL_SRC_ARENA,
							    .node = endpoint,
							    .base = base,
							    .bytes = bytes};
		}
	}
	if (!a->n_nodes)
		a->nodes = NULL;
	if (!a->n_cands)
		a->cands = NULL;
	cat->st->lookups++;
	cat->st->candidates += a->n_cands;
	if (a->n_cands)
		cat->st->lookup_hits++;
	return 0;
}

/* ---- teardown and checks ---------------------------------------------------------------------- */

void mgr_catalog_free(struct mgr_catalog *cat)
{
	/* Records first (children before parents: evict until none), then
	 * whatever entries holdings keep. */
	while (cat->lru_head) {
		struct mgr_record *r = cat->lru_head;
		/* The analyzer cannot tie r->lprev to the node that points at r,
		 * so it thinks a removed record stays reachable from the head. */
		/* NOLINTNEXTLINE(clang-analyzer-unix.Malloc) */
		while (r && (r->children || r->pins))
			r = r->lnext;
		if (!r)
			break;
		r->pins = 0;
		record_remove(cat, r);
	}
	while (cat->scopes) {
		struct mgr_scope *sc = cat->scopes;
		for (size_t i = 0; sc->keys.b && i <= sc->keys.mask; i++)
			for (struct eos_hnode *x = sc->keys.b[i], *nx; x; x = nx) {
				nx = x->next;
				struct mgr_entry *e = (struct mgr_entry *)x;
				while (e->holds) {
					struct mgr_hold *h = e->holds;
					e->holds = h->enext;
					free(h);
				}
				if (e->rec) {
					free(e->rec->w);
					free(e->rec->cksum);
					free(e->rec);
				}
				free(e);
			}
		for (size_t i = 0; sc->buckets.b && i <= sc->buckets.mask; i++)
			for (struct eos_hnode *x = sc->buckets.b[i], *nx; x; x = nx) {
				nx = x->next;
				free(x);
			}
		scope_free(cat, sc);
	}
	cat->lru_head = cat->lru_tail = NULL;
	cat->records = cat->holds = cat->record_bytes = 0;
}

int mgr_catalog_check(const struct mgr_catalog *cat)
{
	uint64_t records = 0, holds = 0, ready = 0, lru = 0;
	uint32_t scopes = 0;
	for (const struct mgr_scope *sc = cat->scopes; sc; sc = sc->next) {
		scopes++;
		uint64_t entries = 0, recs = 0;
		for (size_t i = 0; i <= sc->keys.mask; i++)
			for (struct eos_hnode *x = sc->keys.b[i]; x; x = x->next) {
				const struct mgr_entry *e = (const struct mgr_entry *)x;
				entries++;
				if (!e->rec && !e->holds)
					return eos_fail(SEL_ECORRUPT, "catalog: an empty entry");
				if (e->scope != sc ||
				    bucket_find((struct mgr_scope *)sc, &e->bucket) != e->bk)
					return eos_fail(SEL_ECORRUPT,
							"catalog: an entry outside its bucket");
				if (e->bnext && e->bnext->key.consumed > e->key.consumed)
					return eos_fail(SEL_ECORRUPT,
							"catalog: a bucket out of order");
				for (const struct mgr_hold *h = e->holds; h; h = h->enext) {
					holds++;
					if (h->e != e)
						return eos_fail(
							SEL_ECORRUPT,
							"catalog: a holding of another entry");
				}
				const struct mgr_record *r = e->rec;
				if (!r)
					continue;
				records++;
				recs++;
				if (r->e != e)
					return eos_fail(SEL_ECORRUPT,
							"catalog: a record of another entry");
				if (r->ready)
					ready++;
				if (r->parent && (!r->parent->ready ||
						  r->parent->e->key.consumed >= e->key.consumed ||
						  r->parent->e->scope != sc))
					return eos_fail(SEL_ECORRUPT, "catalog: a bad parent link");
				/* Children: count ready records linked under r. */
				uint32_t kids = 0;
				for (size_t j = 0; j <= sc->keys.mask; j++)
					for (struct eos_hnode *y = sc->keys.b[j]; y; y = y->next) {
						const struct mgr_entry *f =
							(const struct mgr_entry *)y;
						if (f->rec && f->rec->ready && f->rec->parent == r)
							kids++;
					}
				if (kids != r->children)
					return eos_fail(SEL_ECORRUPT,
							"catalog: record %" PRIu64 " counts %u "
							"children, has %u",
							e->key.consumed, r->children, kids);
			}
		if (entries != sc->entries || recs != sc->records)
			return eos_fail(SEL_ECORRUPT,
					"catalog: scope counts %" PRIu64 "/%" PRIu64
					", found %" PRIu64 "/%" PRIu64,
					sc->entries, sc->records, entries, recs);
	}
	for (const struct mgr_record *r = cat->lru_head; r; r = r->lnext) {
		lru++;
		if (!r->ready)
			return eos_fail(SEL_ECORRUPT, "catalog: a pending record on the LRU list");
		if (r->lnext && r->lnext->lprev != r)
			return eos_fail(SEL_ECORRUPT, "catalog: a broken LRU link");
	}
	if (scopes != cat->n_scopes || records != cat->records || holds != cat->holds ||
	    lru != ready)
		return eos_fail(SEL_ECORRUPT,
				"catalog: counts differ (scopes %u/%u records %" PRIu64 "/%" PRIu64
				" holds %" PRIu64 "/%" PRIu64 " lru %" PRIu64 "/%" PRIu64 ")",
				scopes, cat->n_scopes, records, cat->records, holds, cat->holds,
				lru, ready);
	return mgr_arena_check(cat->arena);
}
