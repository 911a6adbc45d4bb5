/*
 * cache.c - the GPU prefix checkpoint cache: page and row id pools with
 * fence-gated free lists, the checkpoint tree, lookup, LRU eviction and
 * compaction, eviction notices (design 2.1, 2.3 "Eviction", 2.12, 2.15
 * "Evictions"; the design's PrefixCheckpointCache).  cache.h states the
 * contract; this file is how it is kept.
 *
 * DESIGN
 *   Ids.  Each id space (pages, rows) is an array of states plus a LIFO
 *   free stack and a FIFO pending ring.  A release is tagged with the
 *   submitted fence; since that number never decreases, the ring is sorted
 *   by tag and completing fence f pops a prefix of it.  CKPT ids record
 *   the node that owns them, which makes "owned exactly once" checkable.
 *
 *   Nodes.  Each checkpoint is one heap allocation (stable address) listed
 *   in a slot table.  Three multimaps index it: id -> node (every node),
 *   key -> node and bucket digest -> node (nodes with a row: those are the
 *   only ones lookup and dedupe may find).  Children hang off their parent
 *   in a doubly linked sibling list; all nodes sit on one LRU list ordered
 *   by a strictly increasing tick.
 *
 *   Lookup walks aligned boundaries of the history from the top down,
 *   probing the bucket map with the boundary digest the history already
 *   holds (no hashing), and hashes at most 64 tokens per candidate to
 *   confirm the exact key.  A request that extends a cached prefix by a
 *   short new message therefore costs a few probes, whatever the length of
 *   the history.
 *
 *   Eviction scans the LRU list from the oldest end: first for an
 *   unpinned ready leaf, then for an unpinned ready single-child node with
 *   a row.  Removing a leaf also removes the page-only ancestors it leaves
 *   childless: a page-only node exists only to supply pages to children.
 *
 * INVARIANTS (hel_cache_check verifies each)
 *   1. Every page id and row slot is in exactly one of FREE (on the free
 *      stack once), PENDING (in the pending ring once, tag > completed),
 *      CKPT (in exactly one node's tail / row, owner recorded) or OUT; the
 *      four counts sum to the totals.
 *   2. submitted >= completed; pending tags are non-decreasing.
 *   3. A node's parent is live, ends strictly before it, and the node owns
 *      exactly key.consumed/P - parent.consumed/P tail pages (a root:
 *      key.consumed/P).  children equals the length of its sibling list.
 *   4. A node has a row iff it is in the key and bucket maps (once each);
 *      a page-only node has at least one child and no pins; every node is
 *      in the id map once.  No two row-bearing nodes share a key.
 *   5. xpins <= pins.
 *   6. The LRU list holds every node once, ticks strictly increasing from
 *      oldest to newest.
 *   7. The notice queue holds at most notice_cap notices.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "helios/cache.h"
#include "helios/map.h"

/* Transient state of a tail page during hel_cache_insert's checks. */
#define ID_MARK 7

struct pend {
	uint32_t id;
	uint64_t fence;
};

struct idpool {
	const char *what; /* "page" / "row" for messages */
	uint32_t total;
	uint8_t *state;  /* hel_id_state */
	uint32_t *owner; /* CKPT: owning node slot */
	uint32_t *free;
	uint32_t n_free;
	struct pend *pend; /* ring of total entries */
	uint32_t pend_head, n_pend;
	uint32_t n_ckpt, n_out;
};

struct hel_cache {
	uint32_t P;
	struct idpool pages, rows;
	uint64_t submitted, completed;
	hel_ckpt **nodes; /* slot table; NULL = empty slot */
	uint32_t nodes_cap, n_nodes, n_page_only;
	uint32_t *free_slots;
	uint32_t n_free_slots;
	hel_map by_id, by_key, by_bucket;
	hel_ckpt *lru_head, *lru_tail; /* oldest, newest */
	uint64_t next_id, tick;
	hel_notice *notices;
	uint32_t notice_cap, nq_head, nq_n;
	bool lost;
	char bad[160]; /* first misuse seen (reported by check) */
};

static void misuse(hel_cache *c, const char *what, uint32_t id)
{
	if (!c->bad[0])
		snprintf(c->bad, sizeof c->bad, "misuse: %s %u", what, id);
}

/* ---- id pools ------------------------------------------------------------ */

static int pool_init(struct idpool *p, const char *what, uint32_t total)
{
	p->what = what;
	p->total = total;
	p->state = calloc(total ? total : 1, 1);
	p->owner = malloc((total ? total : 1) * sizeof(uint32_t));
	p->free = malloc((total ? total : 1) * sizeof(uint32_t));
	p->pend = malloc((total ? total : 1) * sizeof(struct pend));
	if (!p->state || !p->owner || !p->free || !p->pend)
		return -ENOMEM;
	/* Pop order 0, 1, 2, ...: the stack holds ids in reverse. */
	for (uint32_t i = 0; i < total; i++) {
		p->free[i] = total - 1 - i;
		p->owner[i] = HEL_NONE;
	}
	p->n_free = total;
	return 0;
}

static void pool_free(struct idpool *p)
{
	free(p->state);
	free(p->owner);
	free(p->free);
	free(p->pend);
}

static int pool_alloc(struct idpool *p, uint32_t *id)
{
	if (!p->n_free)
		return -ENOSPC;
	uint32_t i = p->free[--p->n_free];
	p->state[i] = HEL_ID_OUT;
	p->n_out++;
	*id = i;
	return 0;
}

static void pool_to_free(struct idpool *p, uint32_t i)
{
	p->state[i] = HEL_ID_FREE;
	p->owner[i] = HEL_NONE;
	p->free[p->n_free++] = i;
}

/* i leaves OUT or CKPT (already uncounted there) and goes to PENDING or
 * FREE depending on the fences. */
static void pool_release(hel_cache *c, struct idpool *p, uint32_t i)
{
	if (c->submitted <= c->completed) {
		pool_to_free(p, i);
		return;
	}
	p->state[i] = HEL_ID_PENDING;
	p->owner[i] = HEL_NONE;
	struct pend *e = &p->pend[(p->pend_head + p->n_pend) % p->total];
	e->id = i;
	e->fence = c->submitted;
	p->n_pend++;
}

static void pool_release_out(hel_cache *c, struct idpool *p, uint32_t i, bool now)
{
	if (i >= p->total || p->state[i] != HEL_ID_OUT) {
		misuse(c, now ? "unalloc of a non-OUT id" : "release of a non-OUT id", i);
		return;
	}
	p->n_out--;
	if (now)
		pool_to_free(p, i);
	else
		pool_release(c, p, i);
}

static void pool_complete(struct idpool *p, uint64_t completed)
{
	while (p->n_pend && p->pend[p->pend_head].fence <= completed) {
		pool_to_free(p, p->pend[p->pend_head].id);
		p->pend_head = (p->pend_head + 1) % p->total;
		p->n_pend--;
	}
}

int hel_cache_alloc_page(hel_cache *c, uint32_t *page) { return pool_alloc(&c->pages, page); }
int hel_cache_alloc_row(hel_cache *c, uint32_t *row) { return pool_alloc(&c->rows, row); }
void hel_cache_release_page(hel_cache *c, uint32_t page)
{
	pool_release_out(c, &c->pages, page, false);
}
void hel_cache_release_row(hel_cache *c, uint32_t row)
{
	pool_release_out(c, &c->rows, row, false);
}
void hel_cache_unalloc_page(hel_cache *c, uint32_t page)
{
	pool_release_out(c, &c->pages, page, true);
}
void hel_cache_unalloc_row(hel_cache *c, uint32_t row) { pool_release_out(c, &c->rows, row, true); }

void hel_cache_submit_fence(hel_cache *c, uint64_t f)
{
	if (f <= c->submitted) {
		misuse(c, "fence submitted out of order", (uint32_t)f);
		return;
	}
	c->submitted = f;
}

void hel_cache_complete_fence(hel_cache *c, uint64_t f)
{
	if (f > c->submitted) {
		misuse(c, "completion of an unsubmitted fence", (uint32_t)f);
		return;
	}
	if (f <= c->completed)
		return;
	c->completed = f;
	pool_complete(&c->pages, f);
	pool_complete(&c->rows, f);
}

void hel_cache_counts_get(const hel_cache *c, hel_cache_counts *o)
{
	memset(o, 0, sizeof(*o));
	o->pages_total = c->pages.total;
	o->pages_free = c->pages.n_free;
	o->pages_pending = c->pages.n_pend;
	o->pages_ckpt = c->pages.n_ckpt;
	o->pages_out = c->pages.n_out;
	o->rows_total = c->rows.total;
	o->rows_free = c->rows.n_free;
	o->rows_pending = c->rows.n_pend;
	o->rows_ckpt = c->rows.n_ckpt;
	o->rows_out = c->rows.n_out;
	o->checkpoints = c->n_nodes;
	o->page_only = c->n_page_only;
	o->submitted = c->submitted;
	o->completed = c->completed;
}

hel_id_state hel_cache_page_state(const hel_cache *c, uint32_t page)
{
	return page < c->pages.total ? (hel_id_state)c->pages.state[page] : HEL_ID_FREE;
}

hel_id_state hel_cache_row_state(const hel_cache *c, uint32_t row)
{
	return row < c->rows.total ? (hel_id_state)c->rows.state[row] : HEL_ID_FREE;
}

/* ---- create / destroy ------------------------------------------------------ */

int hel_cache_create(const hel_cache_config *cfg, hel_cache **out)
{
	*out = NULL;
	if (!cfg->page_tokens || cfg->page_tokens % SEL_BUCKET_TOKENS)
		return eos_fail(-EINVAL, "cache: page_tokens %u is not a positive multiple of %d",
				cfg->page_tokens, SEL_BUCKET_TOKENS);
	if (!cfg->n_pages || !cfg->n_rows || cfg->n_pages == HEL_NONE || cfg->n_rows == HEL_NONE)
		return eos_fail(-EINVAL, "cache: %u pages and %u rows (both must be positive)",
				cfg->n_pages, cfg->n_rows);
	hel_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return eos_fail(-ENOMEM, "cache: out of memory");
	c->P = cfg->page_tokens;
	c->next_id = 1;
	c->notice_cap = cfg->notice_cap ? cfg->notice_cap : 1024;
	c->notices = malloc(c->notice_cap * sizeof(hel_notice));
	if (!c->notices || pool_init(&c->pages, "page", cfg->n_pages) ||
	    pool_init(&c->rows, "row", cfg->n_rows)) {
		hel_cache_destroy(c);
		return eos_fail(-ENOMEM, "cache: out of memory for %u pages and %u rows",
				cfg->n_pages, cfg->n_rows);
	}
	*out = c;
	return 0;
}

void hel_cache_destroy(hel_cache *c)
{
	if (!c)
		return;
	for (uint32_t i = 0; i < c->nodes_cap; i++)
		if (c->nodes[i]) {
			free(c->nodes[i]->tail);
			free(c->nodes[i]);
		}
	free(c->nodes);
	free(c->free_slots);
	hel_map_free(&c->by_id);
	hel_map_free(&c->by_key);
	hel_map_free(&c->by_bucket);
	pool_free(&c->pages);
	pool_free(&c->rows);
	free(c->notices);
	free(c);
}

uint32_t hel_cache_page_tokens(const hel_cache *c) { return c->P; }

/* ---- node lookup ------------------------------------------------------------ */

static hel_ckpt *get_node(const hel_cache *c, uint64_t id)
{
	uint64_t h = hel_mix64(id);
	for (size_t p = hel_map_first(&c->by_id, h); p != HEL_MAP_END;
	     p = hel_map_next(&c->by_id, h, p)) {
		hel_ckpt *k = c->nodes[c->by_id.v[p]];
		if (k && k->id == id)
			return k;
	}
	return NULL;
}

const hel_ckpt *hel_cache_get(const hel_cache *c, uint64_t id)
{
	return id == HEL_CKPT_NONE ? NULL : get_node(c, id);
}

static hel_ckpt *find_node(const hel_cache *c, const sel_key *key)
{
	uint64_t h = hel_hash_key(key);
	for (size_t p = hel_map_first(&c->by_key, h); p != HEL_MAP_END;
	     p = hel_map_next(&c->by_key, h, p)) {
		hel_ckpt *k = c->nodes[c->by_key.v[p]];
		if (sel_key_eq(&k->key, key))
			return k;
	}
	return NULL;
}

const hel_ckpt *hel_cache_find(const hel_cache *c, const sel_key *key) { return find_node(c, key); }

bool hel_cache_ready(const hel_cache *c, const hel_ckpt *k)
{
	return k->ready_after <= c->completed;
}

uint32_t hel_cache_chain_len(const hel_cache *c, const hel_ckpt *k)
{
	return (uint32_t)(k->key.consumed / c->P);
}

int hel_cache_chain(const hel_cache *c, const hel_ckpt *k, uint32_t *out, size_t cap)
{
	uint32_t n = hel_cache_chain_len(c, k);
	if (n > cap)
		return -ENOSPC;
	/* Fill from the end: each node's tail ends where its chain ends. */
	uint32_t end = n;
	for (const hel_ckpt *x = k; x; x = x->parent) {
		end -= x->n_tail;
		if (x->n_tail)
			memcpy(out + end, x->tail, x->n_tail * sizeof(uint32_t));
	}
	return (int)n;
}

const hel_ckpt *hel_cache_lookup(const hel_cache *c, const sel_history *h, uint64_t limit)
{
	uint64_t len = sel_history_len(h);
	if (limit > len)
		limit = len;
	for (uint64_t k = limit / SEL_BUCKET_TOKENS + 1; k-- > 0;) {
		const sel_digest *d = sel_history_bound(h, k);
		uint64_t hh = hel_hash_digest(d);
		const hel_ckpt *best = NULL;
		for (size_t p = hel_map_first(&c->by_bucket, hh); p != HEL_MAP_END;
		     p = hel_map_next(&c->by_bucket, hh, p)) {
			const hel_ckpt *x = c->nodes[c->by_bucket.v[p]];
			if (x->key.consumed > limit ||
			    (best && x->key.consumed <= best->key.consumed))
				continue;
			if (!hel_digest_eq(&x->bucket, d) || !hel_cache_ready(c, x))
				continue;
			sel_key want;
			sel_history_key_at(h, x->key.consumed, &want);
			if (sel_key_eq(&want, &x->key))
				best = x;
		}
		if (best)
			return best;
	}
	return NULL;
}

/* ---- LRU -------------------------------------------------------------------- */

static void lru_unlink(hel_cache *c, hel_ckpt *k)
{
	if (k->lru_prev_)
		k->lru_prev_->lru_next_ = k->lru_next_;
	else
		c->lru_head = k->lru_next_;
	if (k->lru_next_)
		k->lru_next_->lru_prev_ = k->lru_prev_;
	else
		c->lru_tail = k->lru_prev_;
	k->lru_prev_ = k->lru_next_ = NULL;
}

static void lru_append(hel_cache *c, hel_ckpt *k)
{
	k->tick = ++c->tick;
	k->lru_prev_ = c->lru_tail;
	k->lru_next_ = NULL;
	if (c->lru_tail)
		c->lru_tail->lru_next_ = k;
	else
		c->lru_head = k;
	c->lru_tail = k;
}

static void touch_chain(hel_cache *c, hel_ckpt *k)
{
	for (; k; k = (hel_ckpt *)k->parent) {
		lru_unlink(c, k);
		lru_append(c, k);
	}
}

void hel_cache_touch(hel_cache *c, uint64_t id)
{
	hel_ckpt *k = get_node(c, id);
	if (k)
		touch_chain(c, k);
}

/* ---- insert / remove ------------------------------------------------------- */

int hel_cache_insert(hel_cache *c, const hel_ckpt_spec *s, uint64_t *out)
{
	*out = HEL_CKPT_NONE;
	hel_ckpt *parent = NULL;
	uint64_t pc = 0;
	if (s->parent != HEL_CKPT_NONE) {
		parent = get_node(c, s->parent);
		if (!parent)
			return eos_fail(-ENOENT, "cache: parent checkpoint %llu is gone",
					(unsigned long long)s->parent);
		pc = parent->key.consumed;
		if (pc >= s->key.consumed)
			return eos_fail(-EINVAL, "cache: parent ends at %llu, not before %llu",
					(unsigned long long)pc,
					(unsigned long long)s->key.consumed);
	}
	uint64_t want = s->key.consumed / c->P - pc / c->P;
	if (s->n_tail != want)
		return eos_fail(-EINVAL,
				"cache: checkpoint at %llu over %llu needs %llu tail pages, got %u",
				(unsigned long long)s->key.consumed, (unsigned long long)pc,
				(unsigned long long)want, s->n_tail);
	for (uint32_t i = 0; i < s->n_tail; i++)
		if (s->tail[i] >= c->pages.total || c->pages.state[s->tail[i]] != HEL_ID_OUT)
			return eos_fail(-EINVAL, "cache: tail page %u is not handed out",
					s->tail[i]);
	if (s->row >= c->rows.total || c->rows.state[s->row] != HEL_ID_OUT)
		return eos_fail(-EINVAL, "cache: row %u is not handed out", s->row);
	hel_ckpt *dup = find_node(c, &s->key);
	if (dup) {
		*out = dup->id;
		return eos_fail(-EEXIST, "cache: checkpoint %llu already has this key",
				(unsigned long long)dup->id);
	}
	/* Allocate everything first, so nothing changes on failure. */
	hel_ckpt *k = calloc(1, sizeof(*k));
	uint32_t *tail = malloc((s->n_tail ? s->n_tail : 1) * sizeof(uint32_t));
	if (!k || !tail)
		goto nomem;
	if (!c->n_free_slots && c->n_nodes == c->nodes_cap) {
		uint32_t cap = c->nodes_cap ? c->nodes_cap * 2 : 64;
		hel_ckpt **nodes = realloc(c->nodes, cap * sizeof(hel_ckpt *));
		if (!nodes)
			goto nomem;
		c->nodes = nodes;
		uint32_t *fs = realloc(c->free_slots, cap * sizeof(*fs));
		if (!fs)
			goto nomem;
		c->free_slots = fs;
		for (uint32_t i = c->nodes_cap; i < cap; i++)
			c->nodes[i] = NULL;
		/* New slots go on the free stack, lowest on top. */
		for (uint32_t i = cap; i-- > c->nodes_cap;)
			c->free_slots[c->n_free_slots++] = i;
		c->nodes_cap = cap;
	}
	if (hel_map_reserve(&c->by_id, 1) || hel_map_reserve(&c->by_key, 1) ||
	    hel_map_reserve(&c->by_bucket, 1))
		goto nomem;
	/* A repeated tail id: mark each id (state MARK) and undo on a repeat. */
	for (uint32_t i = 0; i < s->n_tail; i++) {
		if (c->pages.state[s->tail[i]] == ID_MARK) {
			for (uint32_t j = 0; j < i; j++)
				c->pages.state[s->tail[j]] = HEL_ID_OUT;
			free(k);
			free(tail);
			return eos_fail(-EINVAL, "cache: tail page %u appears twice", s->tail[i]);
		}
		c->pages.state[s->tail[i]] = ID_MARK;
	}

	uint32_t slot = c->free_slots[--c->n_free_slots];
	c->nodes[slot] = k;
	c->n_nodes++;
	k->slot_ = slot;
	k->id = c->next_id++;
	k->generation = k->id;
	k->key = s->key;
	k->bucket = s->bucket;
	k->parent_id = parent ? parent->id : HEL_CKPT_NONE;
	k->parent = parent;
	k->tail = tail;
	k->n_tail = s->n_tail;
	if (s->n_tail)
		memcpy(tail, s->tail, s->n_tail * sizeof(uint32_t));
	for (uint32_t i = 0; i < s->n_tail; i++) {
		c->pages.state[tail[i]] = HEL_ID_CKPT;
		c->pages.owner[tail[i]] = slot;
	}
	c->pages.n_out -= s->n_tail;
	c->pages.n_ckpt += s->n_tail;
	k->row = s->row;
	c->rows.state[s->row] = HEL_ID_CKPT;
	c->rows.owner[s->row] = slot;
	c->rows.n_out--;
	c->rows.n_ckpt++;
	k->ready_after = s->ready_after;
	k->flags = s->flags;
	if (parent) {
		k->next_sibling = parent->first_child;
		if (parent->first_child)
			((hel_ckpt *)parent->first_child)->prev_sibling_ = k;
		parent->first_child = k;
		parent->children++;
		touch_chain(c, parent);
	}
	lru_append(c, k);
	/* Reserved above: these cannot fail. */
	(void)hel_map_add(&c->by_id, hel_mix64(k->id), slot);
	(void)hel_map_add(&c->by_key, hel_hash_key(&k->key), slot);
	(void)hel_map_add(&c->by_bucket, hel_hash_digest(&k->bucket), slot);
	*out = k->id;
	return 0;
nomem:
	free(k);
	free(tail);
	return eos_fail(-ENOMEM, "cache: out of memory inserting a checkpoint");
}

/* Drop k's row (compaction or removal): the row is released, the key and
 * bucket maps forget k. */
static void drop_row(hel_cache *c, hel_ckpt *k)
{
	hel_map_del(&c->by_key, hel_hash_key(&k->key), k->slot_);
	hel_map_del(&c->by_bucket, hel_hash_digest(&k->bucket), k->slot_);
	c->rows.n_ckpt--;
	pool_release(c, &c->rows, k->row);
	k->row = HEL_NONE;
}

/* Forget k entirely (it has no children): its ids are released. */
static void remove_node(hel_cache *c, hel_ckpt *k, hel_eviction *ev)
{
	if (hel_ckpt_has_row(k)) {
		drop_row(c, k);
		if (ev)
			ev->rows++;
	} else {
		c->n_page_only--;
	}
	for (uint32_t i = 0; i < k->n_tail; i++)
		pool_release(c, &c->pages, k->tail[i]);
	c->pages.n_ckpt -= k->n_tail;
	if (ev)
		ev->pages += k->n_tail;
	hel_ckpt *p = (hel_ckpt *)k->parent;
	if (p) {
		if (k->prev_sibling_)
			((hel_ckpt *)k->prev_sibling_)->next_sibling = k->next_sibling;
		else
			p->first_child = k->next_sibling;
		if (k->next_sibling)
			((hel_ckpt *)k->next_sibling)->prev_sibling_ = k->prev_sibling_;
		p->children--;
	}
	lru_unlink(c, k);
	hel_map_del(&c->by_id, hel_mix64(k->id), k->slot_);
	c->nodes[k->slot_] = NULL;
	c->free_slots[c->n_free_slots++] = k->slot_;
	c->n_nodes--;
	free(k->tail);
	free(k);
}

static void push_notice(hel_cache *c, const hel_ckpt *k, const hel_ckpt *heir)
{
	if (!(k->flags & HEL_CK_OFFERED))
		return;
	if (c->nq_n == c->notice_cap) {
		c->nq_head = (c->nq_head + 1) % c->notice_cap;
		c->nq_n--;
		c->lost = true;
	}
	hel_notice *n = &c->notices[(c->nq_head + c->nq_n) % c->notice_cap];
	memset(n, 0, sizeof(*n));
	n->key = k->key;
	n->generation = k->generation;
	if (heir)
		n->heir = heir->key;
	c->nq_n++;
}

int hel_cache_evict(hel_cache *c, hel_eviction *ev)
{
	memset(ev, 0, sizeof(*ev));
	hel_ckpt *k;
	for (k = c->lru_head; k; k = k->lru_next_)
		if (!k->children && !k->pins && hel_ckpt_has_row(k) && hel_cache_ready(c, k))
			break;
	if (k) {
		ev->kind = HEL_EVICT_LEAF;
		ev->victim = k->id;
		ev->key = k->key;
		ev->generation = k->generation;
		ev->victim_flags = k->flags;
		push_notice(c, k, NULL);
		hel_ckpt *p = (hel_ckpt *)k->parent;
		remove_node(c, k, ev);
		/* Page-only ancestors exist for their children only. */
		while (p && !p->children && !hel_ckpt_has_row(p)) {
			hel_ckpt *pp = (hel_ckpt *)p->parent;
			remove_node(c, p, ev);
			ev->cascade++;
			p = pp;
		}
		return HEL_EVICT_LEAF;
	}
	for (k = c->lru_head; k; k = k->lru_next_)
		if (k->children == 1 && !k->pins && hel_ckpt_has_row(k) && hel_cache_ready(c, k))
			break;
	if (!k)
		return HEL_EVICT_NONE;
	ev->kind = HEL_EVICT_COMPACT;
	ev->victim = k->id;
	ev->key = k->key;
	ev->generation = k->generation;
	ev->victim_flags = k->flags;
	ev->heir = k->first_child->id;
	ev->rows = 1;
	push_notice(c, k, k->first_child);
	drop_row(c, k);
	c->n_page_only++;
	return HEL_EVICT_COMPACT;
}

int hel_cache_pin(hel_cache *c, uint64_t id, bool worker)
{
	hel_ckpt *k = get_node(c, id);
	if (!k)
		return eos_fail(-ENOENT, "cache: checkpoint %llu is gone", (unsigned long long)id);
	if (!hel_ckpt_has_row(k))
		return eos_fail(-EINVAL, "cache: checkpoint %llu is page-only",
				(unsigned long long)id);
	k->pins++;
	if (worker)
		k->xpins++;
	return 0;
}

int hel_cache_unpin(hel_cache *c, uint64_t id, bool worker)
{
	hel_ckpt *k = get_node(c, id);
	if (!k)
		return eos_fail(-ENOENT, "cache: checkpoint %llu is gone", (unsigned long long)id);
	if (!k->pins || (worker && !k->xpins) || (!worker && k->pins == k->xpins))
		return eos_fail(-EINVAL, "cache: checkpoint %llu has no such pin",
				(unsigned long long)id);
	k->pins--;
	if (worker)
		k->xpins--;
	return 0;
}

int hel_cache_set_flags(hel_cache *c, uint64_t id, uint32_t set, uint32_t clear)
{
	hel_ckpt *k = get_node(c, id);
	if (!k)
		return -ENOENT;
	k->flags = (k->flags | set) & ~clear;
	return 0;
}

static bool pinned_extra(const hel_ckpt *k, const uint64_t *extra, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (extra[i] == k->id)
			return true;
	return false;
}

void hel_cache_reclaimable_if_pinned(hel_cache *c, const uint64_t *extra, size_t n_extra,
				     uint32_t *pages, uint32_t *rows)
{
	uint32_t np = 0, nr = 0;
	for (hel_ckpt *k = c->lru_head; k; k = k->lru_next_)
		k->mark_ = k->kept_children_ = 0;
	/* Mark every node that eviction can never remove, and count for each
	 * the children whose subtrees it keeps. */
	for (hel_ckpt *k = c->lru_head; k; k = k->lru_next_) {
		if (!(k->pins || pinned_extra(k, extra, n_extra) || !hel_cache_ready(c, k)) ||
		    k->mark_)
			continue;
		k->mark_ = 1;
		for (hel_ckpt *p = (hel_ckpt *)k->parent; p; p = (hel_ckpt *)p->parent) {
			p->kept_children_++;
			if (p->mark_)
				break;
			p->mark_ = 1;
		}
	}
	/* Compaction's rule on the pin-adjusted counts: an unpinned ready
	 * ancestor with one kept child gives its row; a branching one or a
	 * pinned one keeps it. */
	for (hel_ckpt *k = c->lru_head; k; k = k->lru_next_) {
		if (!k->mark_) {
			np += k->n_tail;
			nr += hel_ckpt_has_row(k);
		} else if (hel_ckpt_has_row(k) && !k->pins && !pinned_extra(k, extra, n_extra) &&
			   hel_cache_ready(c, k) && k->kept_children_ == 1) {
			nr++;
		}
	}
	*pages = np;
	*rows = nr;
}

void hel_cache_reclaimable(hel_cache *c, uint64_t extra_pin, uint32_t *pages, uint32_t *rows)
{
	hel_cache_reclaimable_if_pinned(c, &extra_pin, 1, pages, rows);
}

size_t hel_cache_take_notices(hel_cache *c, hel_notice *out, size_t cap, bool *lost)
{
	size_t n = 0;
	while (n < cap && c->nq_n) {
		out[n++] = c->notices[c->nq_head];
		c->nq_head = (c->nq_head + 1) % c->notice_cap;
		c->nq_n--;
	}
	if (lost) {
		*lost = c->lost;
		c->lost = false;
	}
	return n;
}

size_t hel_cache_notices_queued(const hel_cache *c) { return c->nq_n; }

void hel_cache_drop_all(hel_cache *c)
{
	/* Children first: repeatedly remove leaves from the LRU list. */
	while (c->lru_head) {
		hel_ckpt *k = c->lru_head;
		while (k->first_child)
			k = (hel_ckpt *)k->first_child;
		remove_node(c, k, NULL);
	}
}

const hel_ckpt *hel_cache_iter(const hel_cache *c, size_t *cursor)
{
	while (*cursor < c->nodes_cap) {
		hel_ckpt *k = c->nodes[(*cursor)++];
		if (k)
			return k;
	}
	return NULL;
}

/* ---- check ------------------------------------------------------------------ */

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		rc = eos_fail(-EUCLEAN, "cache check: " __VA_ARGS__);                              \
		goto out;                                                                          \
	} while (0)

static int check_pool(const hel_cache *c, const struct idpool *p, uint8_t *seen)
{
	int rc = 0;
	uint32_t cnt[4] = {0};
	memset(seen, 0, p->total);
	for (uint32_t i = 0; i < p->total; i++) {
		if (p->state[i] > HEL_ID_OUT)
			FAIL("%s %u has state %u", p->what, i, p->state[i]);
		cnt[p->state[i]]++;
	}
	if (cnt[HEL_ID_FREE] != p->n_free || cnt[HEL_ID_PENDING] != p->n_pend ||
	    cnt[HEL_ID_CKPT] != p->n_ckpt || cnt[HEL_ID_OUT] != p->n_out)
		FAIL("%s states free %u pending %u ckpt %u out %u but counters %u %u %u %u",
		     p->what, cnt[0], cnt[1], cnt[2], cnt[3], p->n_free, p->n_pend, p->n_ckpt,
		     p->n_out);
	if (p->n_free + p->n_pend + p->n_ckpt + p->n_out != p->total)
		FAIL("%s counts do not sum to %u", p->what, p->total);
	for (uint32_t i = 0; i < p->n_free; i++) {
		uint32_t id = p->free[i];
		if (id >= p->total || p->state[id] != HEL_ID_FREE || seen[id]++)
			FAIL("%s free list entry %u (id %u) is bad or repeated", p->what, i, id);
	}
	uint64_t prev = 0;
	for (uint32_t i = 0; i < p->n_pend; i++) {
		const struct pend *e = &p->pend[(p->pend_head + i) % p->total];
		if (e->id >= p->total || p->state[e->id] != HEL_ID_PENDING || seen[e->id]++)
			FAIL("%s pending entry %u (id %u) is bad or repeated", p->what, i, e->id);
		if (e->fence <= c->completed || e->fence > c->submitted || e->fence < prev)
			FAIL("%s %u pending on fence %llu (completed %llu, submitted %llu)",
			     p->what, e->id, (unsigned long long)e->fence,
			     (unsigned long long)c->completed, (unsigned long long)c->submitted);
		prev = e->fence;
	}
out:
	return rc;
}

int hel_cache_check(const hel_cache *c)
{
	int rc = 0;
	uint32_t maxn = c->pages.total > c->rows.total ? c->pages.total : c->rows.total;
	uint8_t *seen = malloc(maxn);
	if (!seen)
		return eos_fail(-ENOMEM, "cache check: out of memory");
	if (c->bad[0])
		FAIL("%s", c->bad);
	if (c->submitted < c->completed)
		FAIL("completed fence %llu passes submitted %llu", (unsigned long long)c->completed,
		     (unsigned long long)c->submitted);
	if ((rc = check_pool(c, &c->pages, seen)) || (rc = check_pool(c, &c->rows, seen)))
		goto out;

	uint32_t n = 0, page_only = 0, ckpt_pages = 0, ckpt_rows = 0;
	for (uint32_t s = 0; s < c->nodes_cap; s++) {
		const hel_ckpt *k = c->nodes[s];
		if (!k)
			continue;
		n++;
		if (k->slot_ != s)
			FAIL("checkpoint %llu in slot %u says slot %u", (unsigned long long)k->id,
			     s, k->slot_);
		if (hel_map_count(&c->by_id, hel_mix64(k->id), s) != 1)
			FAIL("checkpoint %llu not in the id map once", (unsigned long long)k->id);
		const hel_ckpt *p = k->parent;
		uint64_t pc = 0;
		if (p) {
			if (p->id != k->parent_id || get_node(c, p->id) != p)
				FAIL("checkpoint %llu has a stale parent",
				     (unsigned long long)k->id);
			pc = p->key.consumed;
			if (pc >= k->key.consumed)
				FAIL("checkpoint %llu ends at %llu, its parent at %llu",
				     (unsigned long long)k->id, (unsigned long long)k->key.consumed,
				     (unsigned long long)pc);
		} else if (k->parent_id != HEL_CKPT_NONE) {
			FAIL("checkpoint %llu names parent %llu without a link",
			     (unsigned long long)k->id, (unsigned long long)k->parent_id);
		}
		if (k->n_tail != k->key.consumed / c->P - pc / c->P)
			FAIL("checkpoint %llu owns %u tail pages, not %llu",
			     (unsigned long long)k->id, k->n_tail,
			     (unsigned long long)(k->key.consumed / c->P - pc / c->P));
		for (uint32_t i = 0; i < k->n_tail; i++) {
			uint32_t pg = k->tail[i];
			if (pg >= c->pages.total || c->pages.state[pg] != HEL_ID_CKPT ||
			    c->pages.owner[pg] != s)
				FAIL("checkpoint %llu tail page %u is not owned by it",
				     (unsigned long long)k->id, pg);
		}
		ckpt_pages += k->n_tail;
		uint32_t nc = 0;
		const hel_ckpt *prevc = NULL;
		for (const hel_ckpt *ch = k->first_child; ch; ch = ch->next_sibling) {
			if (ch->parent != k || ch->prev_sibling_ != prevc || ++nc > c->n_nodes)
				FAIL("checkpoint %llu has a broken child list",
				     (unsigned long long)k->id);
			prevc = ch;
		}
		if (nc != k->children)
			FAIL("checkpoint %llu counts %u children, has %u",
			     (unsigned long long)k->id, k->children, nc);
		if (k->xpins > k->pins)
			FAIL("checkpoint %llu has %u worker pins of %u", (unsigned long long)k->id,
			     k->xpins, k->pins);
		if (hel_ckpt_has_row(k)) {
			ckpt_rows++;
			if (k->row >= c->rows.total || c->rows.state[k->row] != HEL_ID_CKPT ||
			    c->rows.owner[k->row] != s)
				FAIL("checkpoint %llu row %u is not owned by it",
				     (unsigned long long)k->id, k->row);
			if (hel_map_count(&c->by_key, hel_hash_key(&k->key), s) != 1 ||
			    hel_map_count(&c->by_bucket, hel_hash_digest(&k->bucket), s) != 1)
				FAIL("checkpoint %llu with a row is not in the key and bucket maps once",
				     (unsigned long long)k->id);
			if (find_node(c, &k->key) != k)
				FAIL("checkpoint %llu shares its key", (unsigned long long)k->id);
		} else {
			page_only++;
			if (hel_map_count(&c->by_key, hel_hash_key(&k->key), s) ||
			    hel_map_count(&c->by_bucket, hel_hash_digest(&k->bucket), s))
				FAIL("page-only checkpoint %llu is still in the key or bucket map",
				     (unsigned long long)k->id);
			if (!k->children || k->pins)
				FAIL("page-only checkpoint %llu has %u children and %u pins",
				     (unsigned long long)k->id, k->children, k->pins);
		}
	}
	if (n != c->n_nodes || page_only != c->n_page_only)
		FAIL("counted %u checkpoints (%u page-only), recorded %u (%u)", n, page_only,
		     c->n_nodes, c->n_page_only);
	if (ckpt_pages != c->pages.n_ckpt || ckpt_rows != c->rows.n_ckpt)
		FAIL("checkpoints own %u pages and %u rows, pools say %u and %u", ckpt_pages,
		     ckpt_rows, c->pages.n_ckpt, c->rows.n_ckpt);
	if (c->by_id.n != n || c->by_key.n != n - page_only || c->by_bucket.n != n - page_only)
		FAIL("map sizes %zu/%zu/%zu for %u checkpoints (%u page-only)", c->by_id.n,
		     c->by_key.n, c->by_bucket.n, n, page_only);
	uint32_t m = 0;
	const hel_ckpt *prev = NULL;
	for (const hel_ckpt *k = c->lru_head; k; k = k->lru_next_) {
		if (++m > n || k->lru_prev_ != prev || (prev && prev->tick >= k->tick))
			FAIL("LRU list broken at checkpoint %llu", (unsigned long long)k->id);
		prev = k;
	}
	if (m != n || c->lru_tail != prev)
		FAIL("LRU list holds %u of %u checkpoints", m, n);
	if (c->nq_n > c->notice_cap)
		FAIL("%u notices queued, bound %u", c->nq_n, c->notice_cap);
out:
	free(seen);
	return rc;
}
