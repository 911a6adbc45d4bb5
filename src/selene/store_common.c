/*
 * store_common.c - the store skeleton (store_common.h): the put prologue,
 * the record insert and its undo, tree eviction, lookup, the fetch check,
 * failed-record removal, expiry, counters and the leak list that the
 * memory and disk stores share (design 2.2, 2.3, 2.5 expiry, 2.12, 2.15).
 *
 * DESIGN
 *
 * A store built on the skeleton embeds struct sel_core first, so its index
 * callbacks receive the core as their context and the store's handle is
 * the core's base.  The skeleton knows a record only by its head (struct
 * sel_core_rec: store pins, live) and its size; the rest of the record,
 * the copies and their completions are the store's.  The calls here never
 * block, never lock and change nothing when they fail (the insert's undo
 * removes the node it made).
 *
 * The fetch check re-walks the hit's chain as the tree is now and refuses
 * anything that is not the chain the lookup verified: a gone or incomplete
 * node, another page count, a node the store refuses (doomed), and --
 * issue 12 -- a chain digest that differs from sel_hit.chain, so a fetch
 * never reads a node whose key was not compared with the request's history.
 *
 * INVARIANTS
 *
 *   1. recs[id] is addressable for every live node id; a record is live
 *      exactly while its node is indexed (sel_core_check).
 *   2. c->why is SEL_WHY_NONE outside sel_core_evict_until, sel_core_expire
 *      and a store's own removal loops, which restore it.
 *   3. The leak list only grows; what is on it is never freed.
 */
#include "store_common.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <string.h>

#include "internal.h"
#include "slab.h"
#include "store_pool.h"

/* ---- put checks ------------------------------------------------------------ */

bool sel_put_usable(const char *store, const sel_published *cp, uint32_t page_tokens, uint64_t rows)
{
	uint64_t c = cp->key.consumed;
	if (c != 0 && cp->n_pages == c / page_tokens && cp->tail <= cp->n_pages &&
	    (cp->n_pages == 0 || cp->pages) && cp->state_slot < rows)
		return true;
	eos_fail(-EINVAL,
		 "%s: checkpoint %" PRIu64 " is unusable: %" PRIu64 " tokens, %" PRIu32
		 " pages (%" PRIu64 " expected), tail %" PRIu32 ", state slot %" PRIu32
		 " of %" PRIu64,
		 store, cp->checkpoint, c, cp->n_pages, c / page_tokens, cp->tail, cp->state_slot,
		 rows);
	return false;
}

bool sel_put_extends(const char *store, const sel_published *cp, uint64_t parent_consumed,
		     uint32_t page_tokens, uint32_t *derived)
{
	uint64_t c = cp->key.consumed, p = parent_consumed;
	*derived = p < c ? (uint32_t)(c / page_tokens - p / page_tokens) : 0;
	if (p < c && (cp->tail == *derived || cp->tail == cp->n_pages))
		return true;
	eos_fail(-EINVAL,
		 "%s: checkpoint %" PRIu64 " tail %" PRIu32 " does not extend its parent"
		 " at %" PRIu64 " tokens (%" PRIu32 " pages)",
		 store, cp->checkpoint, cp->tail, p, *derived);
	return false;
}

bool sel_put_pages_fit(const char *store, const sel_published *cp, uint32_t tail, uint64_t pages)
{
	for (uint32_t i = 0; i < tail; i++) {
		uint32_t id = cp->pages[cp->n_pages - tail + i];
		if (id >= pages) {
			eos_fail(-EINVAL,
				 "%s: checkpoint %" PRIu64 " page id %" PRIu32
				 " beyond the planes' %" PRIu64 " pages",
				 store, cp->checkpoint, id, pages);
			return false;
		}
	}
	return true;
}

sel_outcome sel_put_account(sel_stats *st, struct sel_progress *pg, sel_outcome o,
			    sel_retry_reason reason, sel_retry_reason *why)
{
	st->outcomes[o]++;
	if (o == SEL_RETRY) {
		st->retry_reasons[reason]++;
		sel_progress_refuse(pg); /* what came back before, this put saw */
	}
	if (why)
		*why = o == SEL_RETRY ? reason : SEL_RETRY_NONE;
	return o;
}

bool sel_progress_due(struct sel_progress *pg)
{
	if (!pg->refused || !pg->released)
		return false;
	pg->refused = pg->released = false;
	return true;
}

/* ---- the core --------------------------------------------------------------- */

/* A record leaving by eviction (at the local end: also
 * dropped_end_of_chain) or expiry is counted. */
static void count_removed(struct sel_core *c)
{
	sel_tier_stats *t = &c->st.tier[c->tier];
	if (c->why == SEL_WHY_EXPIRE) {
		t->expired++;
	} else if (c->why == SEL_WHY_EVICT) {
		t->evicted++;
		if (c->end_of_chain)
			t->dropped_end_of_chain++;
	} else if (c->why == SEL_WHY_CASCADE) {
		t->evicted++; /* the next level holds it: not dropped */
	}
}

static void cb_drop_row(void *ctx, sel_index *ix, sel_node_id id)
{
	struct sel_core *c = ctx;
	(void)ix;
	if (!sel_core_live(c, id))
		return;
	if (c->watch.leaving)
		c->watch.leaving(c->watch.ctx, c, id);
	c->cops->drop_row(c, id);
}

static void cb_remove(void *ctx, sel_index *ix, sel_node_id id)
{
	struct sel_core *c = ctx;
	struct sel_core_rec *h = sel_core_live(c, id);
	(void)ix;
	if (!h)
		return;
	if (c->watch.leaving)
		c->watch.leaving(c->watch.ctx, c, id);
	count_removed(c);
	c->cops->remove(c, id);
	memset(h, 0, c->rec_size);
}

static void cb_commit(void *ctx, sel_index *ix, sel_node_id id)
{
	struct sel_core *c = ctx;
	(void)ix;
	if (c->watch.committed && sel_core_live(c, id))
		c->watch.committed(c->watch.ctx, c, id);
}

static const struct sel_index_ops core_index_ops = {
	.drop_row = cb_drop_row,
	.remove = cb_remove,
	.commit = cb_commit,
};

void sel_core_watch_set(struct sel_core *c, const struct sel_core_watch *k)
{
	c->watch = k ? *k : (struct sel_core_watch){0};
}

void *sel_core_alloc(size_t size, struct sel_store_pool *sp, bool own, const char *who)
{
	void *s = calloc(1, size);
	if (s)
		return s;
	if (own)
		sel_store_pool_destroy(sp);
	eos_fail(-ENOMEM, "%s: out of memory", who);
	return NULL;
}

int sel_core_init(struct sel_core *c, const struct sel_store_ops *ops,
		  const struct sel_core_ops *cops, const char *name, sel_tier tier, size_t rec_size,
		  const sel_store_config *cfg, struct sel_store_pool *sp, bool own)
{
	const sel_geometry *g = cfg->geometry;
	int rc;
	c->base.ops = ops;
	c->cops = cops;
	c->base.page_tokens = g->page_tokens;
	c->name = name;
	c->tier = tier;
	c->sp = sp;
	c->own_sp = own;
	c->rec_size = rec_size;
	c->ranks = g->ranks;
	c->pt = g->page_tokens;
	c->row_slots = sp->row_slots;
	c->slot_bytes = sp->slot_bytes;
	c->warm = sp->warm;
	c->intake = sp->intake;
	c->min_pages = sp->min_pages;
	c->min_rows = sp->min_rows;
	c->page_bytes_all = sp->page_bytes_all;
	c->row_bytes_all = sp->row_bytes_all;
	if ((rc = sel_index_create(c->pt, &core_index_ops, c, &c->ix)))
		return rc;
	sel_expiry_init(&c->exp, cfg);
	if (sel_expiry_on(&c->exp))
		sel_index_set_clock(c->ix, c->exp.clock);
	if ((rc = sel_policy_create(&c->policy)))
		return rc;
	return sel_core_ensure_rec(c, 0);
}

int sel_core_xfer(struct sel_core *c, const sel_store_config *cfg)
{
	int rc = sel_store_pool_xfer_create(c->sp, cfg->queue_depth ? cfg->queue_depth : 64,
					    &c->xfer);
	if (rc == 0)
		sel_store_landed_install(cfg, c->xfer);
	return rc;
}

void sel_core_flush(struct sel_core *c)
{
	if (c->xfer)
		(void)sel_xfer_kick(c->xfer);
	if (c->flush_more)
		c->flush_more(c, false);
}

void sel_core_flush_op(sel_store *s)
{
	struct sel_core *c = (struct sel_core *)s;
	if (!c->deferring) { /* the caller flushes: from now on calls leave wakes to it */
		c->deferring = true;
		if (c->xfer)
			sel_xfer_defer_wakes(c->xfer, true);
		if (c->flush_more)
			c->flush_more(c, true);
	}
	sel_core_flush(c);
}

void sel_core_free(struct sel_core *c)
{
	free(c->recs);
	c->recs = NULL;
	free(c->walk);
	c->walk = NULL;
	sel_index_chain_free(&c->chain);
	sel_index_destroy(c->ix);
	c->ix = NULL;
	sel_policy_destroy(c->policy);
	c->policy = NULL;
}

void *sel_store_checked(sel_store *s, const struct sel_store_ops *ops)
{
	if (s && s->ops != ops) {
		/* A store of another kind passed to a store's own call: a bug in
		 * the caller, which nothing here could make safe. */
		fprintf(stderr, "selene: a '%s' store passed where a '%s' store was expected\n",
			s->ops && s->ops->name ? s->ops->name : "?", ops->name);
		abort();
	}
	return s;
}

int sel_core_ensure_rec(struct sel_core *c, sel_node_id id)
{
	if (id < c->nrecs)
		return 0;
	uint32_t n = c->nrecs ? c->nrecs : 64;
	while (n <= id)
		n = n > UINT32_MAX / 2 ? UINT32_MAX : n * 2;
	char *r = realloc(c->recs, (size_t)n * c->rec_size);
	if (!r)
		return eos_fail(-ENOMEM, "%s: out of memory for %" PRIu32 " records", c->name, n);
	memset(r + (size_t)c->nrecs * c->rec_size, 0, (size_t)(n - c->nrecs) * c->rec_size);
	c->recs = r;
	c->nrecs = n;
	return 0;
}

int sel_core_refuse_stopped(struct sel_core *c)
{
	if (!c->stopped && !c->closed)
		return 0;
	return eos_fail(SEL_ESTOPPED, "%s: %s", c->name, c->closed ? "closed" : "stopped");
}

/* ---- put ----------------------------------------------------------------------- */

/* The entries below (sel_core_put, sel_core_lookup, sel_core_touch) sit in
 * a core store's own ops table, so the store behind s is a core store by
 * construction: store.c dispatched through that table. */
static struct sel_core *core(sel_store *s) { return (struct sel_core *)s; }

sel_outcome sel_core_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct sel_core *c = core(s);
	sel_retry_reason reason = SEL_RETRY_NONE;
	struct sel_put_plan p;
	sel_outcome o = cp ? sel_core_put_begin(c, cp, &p) : SEL_SKIPPED;
	if (o == SEL_QUEUED)
		o = c->cops->put(c, cp, &p, &reason);
	return sel_put_account(&c->st, &c->pg, o, reason, why);
}

/* An indexed key: PRESENT, SKIPPED, or a failed record to fill again. */
static sel_outcome put_existing(struct sel_core *c, const sel_published *cp, sel_node_id id,
				struct sel_put_plan *p)
{
	const sel_index_node *n = sel_core_node(c, id);
	if (n->flags & c->refuse)
		return SEL_SKIPPED;
	if (n->state == SEL_NODE_READY) {
		if (!(n->flags & SEL_NODE_HAS_ROW))
			return SEL_SKIPPED; /* page-only: its row cannot come back */
		sel_index_touch(c->ix, id);
		return SEL_PRESENT;
	}
	if (!(n->flags & SEL_CORE_FAILED) || n->pins)
		return SEL_SKIPPED; /* its copy is in flight */
	/* A failed copy kept for its children: fill it again. */
	p->id = id;
	p->pid = n->parent;
	p->tail = n->tail_pages;
	p->row = n->flags & SEL_NODE_HAS_ROW;
	return p->tail > cp->n_pages ? SEL_SKIPPED : SEL_QUEUED;
}

sel_outcome sel_core_put_begin(struct sel_core *c, const sel_published *cp, struct sel_put_plan *p)
{
	*p = (struct sel_put_plan){.id = SEL_NODE_NONE, .pid = SEL_NODE_NONE};
	if (sel_core_refuse_stopped(c) || !sel_put_usable(c->name, cp, c->pt, c->min_rows))
		return SEL_SKIPPED;
	sel_node_id id = sel_index_find(c->ix, &cp->key);
	if (id != SEL_NODE_NONE) {
		sel_outcome o = put_existing(c, cp, id, p);
		if (o != SEL_QUEUED)
			return o;
	} else {
		p->fresh = true;
		p->row = true;
		p->tail = cp->n_pages;
		sel_node_id pid = sel_key_is_none(&cp->parent) ? SEL_NODE_NONE
							       : sel_index_find(c->ix, &cp->parent);
		if (pid != SEL_NODE_NONE && !(sel_core_node(c, pid)->flags & c->refuse)) {
			uint32_t derived;
			if (!sel_put_extends(c->name, cp, sel_core_node(c, pid)->key.consumed,
					     c->pt, &derived))
				return SEL_SKIPPED;
			p->tail = cp->tail;
			if (p->tail == derived) { /* linked; else a root with its whole chain */
				p->pid = pid;
				p->derived = derived;
			}
		}
	}
	if (!sel_put_pages_fit(c->name, cp, p->tail, c->min_pages))
		return SEL_SKIPPED;
	return SEL_QUEUED;
}

int sel_core_insert(struct sel_core *c, const sel_key *key, const sel_key *parent,
		    const sel_digest *bucket, uint32_t tail, bool row, sel_node_id *id)
{
	sel_node_id nid = SEL_NODE_NONE;
	int rc = sel_index_insert(c->ix, key, parent, bucket, tail, row, &nid);
	if (rc == 0)
		rc = sel_core_ensure_rec(c, nid);
	if (rc) {
		if (rc != -EEXIST && nid != SEL_NODE_NONE && sel_index_find(c->ix, key) == nid)
			sel_index_remove(c->ix, nid);
		return rc;
	}
	struct sel_core_rec *h =
		(struct sel_core_rec *)((char *)c->recs + (size_t)nid * c->rec_size);
	memset(h, 0, c->rec_size);
	h->live = true;
	*id = nid;
	return 0;
}

void sel_core_discard(struct sel_core *c, sel_node_id id, const sel_key *key)
{
	if (id != SEL_NODE_NONE && sel_index_find(c->ix, key) == id)
		sel_index_remove(c->ix, id);
}

bool sel_core_evict_until(struct sel_core *c, bool (*fits)(struct sel_core *c, uint64_t need),
			  uint64_t need)
{
	enum sel_core_why w = c->why;
	c->why = SEL_WHY_EVICT;
	while (!fits(c, need)) {
		int r = sel_index_evict(c->ix, NULL);
		if (r == 0)
			break;
		if (r == 2)
			c->st.tier[c->tier].compacted++;
	}
	c->why = w;
	return fits(c, need);
}

void sel_core_remove_failed(struct sel_core *c, sel_node_id id, const sel_key *key)
{
	if (sel_index_find(c->ix, key) != id)
		return; /* already gone (a useless page-only leaf at unpin) */
	while (id != SEL_NODE_NONE) {
		const sel_index_node *n = sel_core_node(c, id);
		if (!(n->flags & SEL_CORE_FAILED) || n->children || n->pins)
			return;
		sel_node_id parent = n->parent;
		if (sel_index_remove(c->ix, id) != 0)
			return;
		id = parent;
		if (id != SEL_NODE_NONE && !sel_core_node(c, id))
			return; /* the removal cascaded through it */
	}
}

void sel_core_count_stored(struct sel_core *c, uint64_t bytes, bool packed)
{
	sel_tier_stats *t = &c->st.tier[c->tier];
	t->held++;
	t->bytes_out += bytes;
	if (packed) {
		c->st.packed_records++;
		t->stores_packed++;
	} else {
		c->st.per_rank_records++;
		t->stores_per_rank++;
	}
}

/* ---- lookup and fetch ------------------------------------------------------------- */

int sel_core_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		    sel_hit *hit)
{
	struct sel_core *c = core(s);
	c->st.lookups++;
	int rc = sel_index_lookup(c->ix, h, resident, limit, &c->chain);
	c->st.chains_rejected += c->chain.rejected;
	if (rc <= 0)
		return rc;
	const sel_index_chain *ch = &c->chain;
	for (uint32_t i = 0; c->refuse && i < ch->n; i++)
		if (sel_core_node(c, ch->ids[i])->flags & c->refuse)
			return 0;
	sel_node_id end = ch->ids[ch->n - 1];
	memset(hit, 0, sizeof(*hit));
	hit->key = sel_core_node(c, end)->key;
	hit->resident = resident;
	hit->pages = ch->pages - ch->skip_pages;
	hit->bytes = sel_core_record_bytes(c, hit->pages, true);
	hit->tier = c->tier;
	hit->cookie = end;
	hit->chain = ch->digest;
	c->st.hits++;
	return 1;
}

/* A node a restore may read: READY and not refused. */
static bool readable_node(const struct sel_core *c, const sel_index_node *n)
{
	return n->state == SEL_NODE_READY && !(n->flags & c->refuse);
}

int sel_core_walk(struct sel_core *c, const sel_key *key, uint64_t resident,
		  struct sel_chain_walk *w)
{
	sel_node_id end = sel_index_find(c->ix, key);
	if (end == SEL_NODE_NONE)
		return eos_fail(-ESTALE, "%s: hit endpoint is gone", c->name);
	const sel_index_node *en = sel_core_node(c, end);
	if (!readable_node(c, en) || !(en->flags & SEL_NODE_HAS_ROW) ||
	    en->key.consumed <= resident)
		return eos_fail(-ESTALE, "%s: hit endpoint lost its row", c->name);
	uint32_t n = 0;
	uint64_t base = 0, tails = 0;
	for (sel_node_id cur = end; cur != SEL_NODE_NONE;) {
		const sel_index_node *x = sel_core_node(c, cur);
		if (x->key.consumed <= resident) {
			base = x->key.consumed;
			break;
		}
		if (!readable_node(c, x))
			return eos_fail(-ESTALE, "%s: hit chain is no longer complete", c->name);
		n++;
		tails += x->tail_pages;
		cur = x->parent;
	}
	uint64_t chain_pages = en->key.consumed / c->pt - base / c->pt;
	if (tails != chain_pages)
		return eos_fail(-ESTALE, "%s: hit chain changed", c->name);
	if (n > c->walk_cap) {
		sel_node_id *p = realloc(c->walk, (size_t)n * 2 * sizeof(*p));
		if (!p)
			return eos_fail(-ENOMEM, "%s: out of memory for a chain of %" PRIu32,
					c->name, n);
		c->walk = p;
		c->walk_cap = n * 2;
	}
	sel_node_id cur = end;
	for (uint32_t i = n; i-- > 0; cur = sel_core_node(c, cur)->parent)
		c->walk[i] = cur;
	w->end = end;
	w->ids = c->walk;
	w->n = n;
	w->skip = (uint32_t)(resident / c->pt - base / c->pt);
	w->pages = (uint32_t)(chain_pages - w->skip);
	return 0;
}

int sel_core_fetch_check(struct sel_core *c, const sel_hit *hit, const sel_inbound *in,
			 bool (*readable)(struct sel_core *c, sel_node_id id),
			 const char *unreadable, struct sel_chain_walk *w)
{
	int rc = sel_core_refuse_stopped(c);
	if (rc)
		return rc;
	if (!hit || !in || (in->n_pages && !in->pages))
		return eos_fail(-EINVAL, "%s: fetch without a hit or destination", c->name);
	if ((rc = sel_core_walk(c, &hit->key, hit->resident, w)))
		return rc;
	for (uint32_t i = 0; readable && i < w->n; i++)
		if (!readable(c, w->ids[i]))
			return eos_fail(-ESTALE, "%s: %s", c->name, unreadable);
	if (w->pages != hit->pages)
		return eos_fail(-ESTALE,
				"%s: hit chain changed (%" PRIu32 " pages now, %" PRIu32
				" in the hit)",
				c->name, w->pages, hit->pages);
	/* Exactly the nodes the lookup compared with the request's history. */
	sel_digest dg;
	if ((rc = sel_index_chain_digest(c->ix, w->end, hit->resident, &dg)))
		return rc;
	if (memcmp(dg.b, hit->chain.b, SEL_DIGEST_BYTES) != 0)
		return eos_fail(-ESTALE, "%s: the hit's chain is not the one its lookup verified",
				c->name);
	if (in->n_pages != hit->pages)
		return eos_fail(-EINVAL,
				"%s: inbound ticket %" PRIu64 " has %" PRIu32
				" pages, the hit uploads %" PRIu32,
				c->name, in->ticket, in->n_pages, hit->pages);
	if (in->state_slot >= c->min_rows)
		return eos_fail(-EINVAL,
				"%s: inbound state slot %" PRIu32 " beyond %" PRIu64 " rows",
				c->name, in->state_slot, c->min_rows);
	for (uint32_t i = 0; i < in->n_pages; i++)
		if (in->pages[i] >= c->min_pages)
			return eos_fail(-EINVAL,
					"%s: inbound page id %" PRIu32 " beyond %" PRIu64 " pages",
					c->name, in->pages[i], c->min_pages);
	return 0;
}

void sel_core_count_fetched(struct sel_core *c, int status, uint64_t bytes, uint64_t ns,
			    uint32_t pages, uint64_t consumed, uint64_t resident)
{
	c->st.inflight_in--;
	if (status) {
		c->st.fetch_failures++;
		c->pg.released = true; /* its pins drop: a failure is no progress event */
		return;
	}
	c->st.tier[c->tier].bytes_in += bytes;
	c->st.reused_tokens += consumed - resident;
	sel_policy_observe(c->policy, c->tier, bytes, ns, pages);
}

/* ---- checks -------------------------------------------------------------------------- */

int sel_core_check(struct sel_core *c,
		   int (*visit)(struct sel_core *c, sel_node_id id, const sel_index_node *n,
				void *ctx),
		   void *ctx)
{
	int rc = sel_index_check(c->ix);
	if (rc)
		return rc;
	uint64_t nodes = 0;
	for (sel_node_id id = sel_index_next_lru(c->ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(c->ix, id)) {
		const sel_index_node *n = sel_core_node(c, id);
		const struct sel_core_rec *h = sel_core_live(c, id);
		nodes++;
		if (!h)
			return eos_fail(SEL_ECORRUPT, "%s: node %" PRIu32 " has no record", c->name,
					id);
		if (visit && (rc = visit(c, id, n, ctx)))
			return rc;
		if (h->mypins > n->pins)
			return eos_fail(SEL_ECORRUPT,
					"%s: node %" PRIu32 " store pins %" PRIu32
					" > index pins %" PRIu32,
					c->name, id, h->mypins, n->pins);
	}
	uint64_t live = 0;
	for (uint32_t i = 0; i < c->nrecs; i++)
		live += sel_core_live(c, i) != NULL;
	if (live != nodes || nodes != sel_index_count(c->ix))
		return eos_fail(SEL_ECORRUPT, "%s: %" PRIu64 " records, %" PRIu64 " nodes", c->name,
				live, nodes);
	return 0;
}

int sel_core_check_inflight(struct sel_core *c, uint64_t puts, uint64_t fetches, const char *what)
{
	if (puts == c->st.inflight_out && fetches == c->st.inflight_in)
		return 0;
	return eos_fail(SEL_ECORRUPT,
			"%s: %" PRIu64 "/%" PRIu64 " %s live, counted %" PRIu64 "/%" PRIu64,
			c->name, puts, fetches, what, c->st.inflight_out, c->st.inflight_in);
}

/* ---- close and destroy ------------------------------------------------------------------ */

int sel_core_close_end(struct sel_core *c, int rc)
{
	c->closed = true;
	if (rc)
		c->stopped = true;
	c->close_rc = rc;
	return rc;
}

bool sel_core_destroy_begin(sel_store *s)
{
	struct sel_core *c = core(s);
	if (!c->closed)
		s->ops->close(s, eos_now_ns() + 10ull * 1000 * 1000 * 1000);
	if (c->close_rc == 0)
		return false;
	if (c->own_sp)
		sel_store_pool_leak(c->sp); /* a lender leaks its own pool */
	return true;
}

void sel_core_destroy_end(struct sel_core *c)
{
	if (c->close_rc) {
		sel_leak((void *[]){c->xfer}, 1);
	} else {
		sel_xfer_destroy(c->xfer);
		if (c->own_sp)
			sel_store_pool_destroy(c->sp); /* unregisters through the backend */
	}
	sel_core_free(c);
}

/* ---- the end of the chain ---------------------------------------------------------------- */

#define CASC_SCAN 64
#define CASC_WAIT_MIN_NS 50000000ull
#define CASC_WAIT_MAX_NS 2000000000ull

struct sel_core *sel_store_core(sel_store *s)
{
	return s && s->ops->lookup == sel_core_lookup ? (struct sel_core *)s : NULL;
}

static int casc_find(const struct sel_core *c, const sel_key *key)
{
	for (uint32_t i = 0; i < c->casc_n; i++)
		if (sel_key_eq(&c->casc_held[i].key, key))
			return (int)i;
	return -1;
}

bool sel_core_cascade_holds(const struct sel_core *c, const sel_key *key)
{
	return casc_find(c, key) >= 0;
}

void sel_core_cascade_set(struct sel_core *c, const struct sel_cascade *k)
{
	if (!k || !k->offer)
		while (c->casc_n)
			sel_core_cascade_end(c, &c->casc_held[c->casc_n - 1].key, false);
	c->casc = k && k->offer ? *k : (struct sel_cascade){0};
	c->casc_after = c->casc_wait = 0;
}

/* Whether id is what tree eviction could take next: a READY leaf with its
 * row, unpinned, evictable, not failed, refused or held already -- or such
 * a leaf that is not evictable (a composite's parked record) when the next
 * level's parked() takes it from where it is (DRAM). */
static bool casc_candidate(struct sel_core *c, sel_node_id id)
{
	const sel_index_node *n = sel_core_node(c, id);
	if (!n || n->state != SEL_NODE_READY || !(n->flags & SEL_NODE_HAS_ROW) || n->children ||
	    n->pins || (n->flags & (SEL_CORE_FAILED | c->refuse)) || !sel_core_live(c, id) ||
	    casc_find(c, &n->key) >= 0)
		return false;
	if (!(n->flags & SEL_NODE_NOEVICT))
		return true;
	return c->casc.parked && c->casc.parked(c->casc.ctx, &c->base, &n->key);
}

uint32_t sel_core_cascade_run(struct sel_core *c, bool (*low)(struct sel_core *c, uint64_t held),
			      uint64_t (*units)(struct sel_core *c, sel_node_id id))
{
	uint32_t taken = 0, looked = 0;
	if (!c->casc.offer || c->closed || c->stopped || eos_now_ns() < c->casc_after)
		return 0;
	sel_node_id id = sel_index_next_lru(c->ix, SEL_NODE_NONE);
	while (id != SEL_NODE_NONE && c->casc_n < SEL_CASCADE_MAX && looked++ < CASC_SCAN &&
	       low(c, c->casc_units)) {
		sel_node_id next = sel_index_next_lru(c->ix, id);
		if (casc_candidate(c, id)) {
			sel_key key = sel_core_node(c, id)->key;
			c->casc_offered++;
			if (!c->casc.offer(c->casc.ctx, &c->base, &key)) {
				uint64_t w = c->casc_wait ? 2 * c->casc_wait : CASC_WAIT_MIN_NS;
				c->casc_wait = w < CASC_WAIT_MAX_NS ? w : CASC_WAIT_MAX_NS;
				c->casc_after = eos_now_ns() + c->casc_wait;
				break;
			}
			uint64_t u = units(c, id);
			c->cops->pin(c, id);
			c->casc_held[c->casc_n].key = key;
			c->casc_held[c->casc_n++].units = u;
			c->casc_units += u;
			taken++;
		}
		id = next;
	}
	return taken;
}

void sel_core_cascade_end(struct sel_core *c, const sel_key *key, bool accepted)
{
	int i = casc_find(c, key);
	if (i < 0)
		return;
	c->casc_units -= c->casc_held[i].units;
	c->casc_held[i] = c->casc_held[--c->casc_n];
	sel_node_id id = sel_index_find(c->ix, key);
	if (id == SEL_NODE_NONE)
		return; /* cannot happen while pinned; nothing to do */
	c->cops->unpin(c, id);
	if (!accepted) {
		c->casc_kept++;
		uint64_t w = c->casc_wait ? 2 * c->casc_wait : CASC_WAIT_MIN_NS;
		c->casc_wait = w < CASC_WAIT_MAX_NS ? w : CASC_WAIT_MAX_NS;
		c->casc_after = eos_now_ns() + c->casc_wait;
		return;
	}
	c->casc_accepted++;
	c->casc_wait = 0;
	const sel_index_node *n = sel_core_node(c, id);
	if (!n || n->children || n->pins || sel_index_find(c->ix, key) != id)
		return; /* in use again (or gone at the unpin): tree eviction takes it later */
	enum sel_core_why w = c->why;
	c->why = SEL_WHY_CASCADE;
	if (sel_index_remove(c->ix, id) == 0)
		c->pg.released = true;
	c->why = w;
	SEL_CORE_DEBUG(c);
}

/* ---- the rest --------------------------------------------------------------------------- */

void sel_core_touch(sel_store *s, const sel_key *key)
{
	struct sel_core *c = core(s);
	sel_node_id id = sel_index_find(c->ix, key);
	if (id != SEL_NODE_NONE)
		sel_index_touch(c->ix, id);
	SEL_CORE_DEBUG(c);
}

int sel_core_pin_key(struct sel_core *c, const sel_key *key)
{
	sel_node_id id = sel_index_find(c->ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	c->cops->pin(c, id);
	SEL_CORE_DEBUG(c);
	return 0;
}

void sel_core_unpin_key(struct sel_core *c, const sel_key *key)
{
	sel_node_id id = sel_index_find(c->ix, key);
	const struct sel_core_rec *h = id == SEL_NODE_NONE ? NULL : sel_core_live(c, id);
	if (h && h->mypins)
		c->cops->unpin(c, id);
	SEL_CORE_DEBUG(c);
}

size_t sel_core_keys(struct sel_core *c, sel_key *keys, size_t cap)
{
	size_t n = 0;
	for (sel_node_id id = sel_index_next_lru(c->ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(c->ix, id)) {
		if (n < cap)
			keys[n] = sel_core_node(c, id)->key;
		n++;
	}
	return n;
}

void sel_core_expire(struct sel_core *c,
		     bool (*droppable)(void *ctx, const sel_index *ix, sel_node_id id))
{
	uint64_t cutoff;
	if (c->closed || c->stopped || !sel_expiry_due(&c->exp, &cutoff))
		return;
	enum sel_core_why w = c->why;
	uint64_t before = c->st.tier[c->tier].expired;
	c->why = SEL_WHY_EXPIRE;
	(void)sel_index_expire(c->ix, cutoff, SEL_EXPIRY_LEAVES, false, droppable, c);
	c->why = w;
	if (c->st.tier[c->tier].expired != before)
		c->pg.released = true; /* slots or budget */
}

/* Keeping the lookup warm (issue 18, worker calls).  A lookup hashes with
 * BLAKE2b (the chain digest, key.c) whose code is several KiB; on a worker
 * that last hashed 10-100 ms ago, one 64-byte hash costs 4-8 us against
 * 0.2 us warm, and that was most of the lookup's p99 (docs/performance.md
 * "The lookup's hash kept warm").  A serving worker polls once per loop
 * iteration, so while it loops (this poll within SEL_WARM_PERIOD_NS of the
 * last) its poll runs the same hash on scratch bytes once per period: one
 * clock read per poll, 0.2-0.5 us per period.  A poll after a longer gap
 * (the worker slept on the wait fd) runs none: the code is cold by then,
 * and a pass would pay that miss in the poll for no lookup.  A clock that
 * steps back restarts both periods.
 *
 * The put's path as well (issue 18, worker calls, stop 35): a 1 GiB put
 * spent 7-9 us in calls that each cost a few hundred ns warm (the index's
 * finds 1.3-1.7 us, its two allocations 1.5-2.4, the eviction 1.7-2.1,
 * the slab 0.4, the transfer submission 1.2; docs/performance.md "The
 * put's path kept warm").  So the pass also runs a find of the scratch key
 * in the index, allocates and frees a block of the last put's size, lets
 * the store touch what its put reads next (warm_more: the memory store's
 * free slots and its eviction end) and takes the transfer set's submission
 * locks.  Nothing the store holds is changed, and no lock is held beyond
 * that instant. */
static void warm_alloc(size_t bytes)
{
	void *p = malloc(bytes);
	/* Keep the compiler from removing the pair. */
	__asm__ volatile("" : : "r"(p) : "memory");
	free(p);
}

void sel_core_keep_warm(struct sel_core *c)
{
	uint64_t now = c->exp.clock(), last = c->poll_at;
	c->poll_at = now;
	if (now < last || now - last >= SEL_WARM_PERIOD_NS)
		return; /* not looping */
	if (c->st.warm_passes && now >= c->warm_at && now - c->warm_at < SEL_WARM_PERIOD_NS)
		return; /* warmed within the period */
	c->warm_at = now;
	c->st.warm_passes++;
	sel_key k = {.consumed = now};
	sel_chain_digest_add(&c->warm_acc, &k, 1);
	(void)sel_index_find(c->ix, &k);
	if (c->warm_alloc)
		warm_alloc(c->warm_alloc);
	if (c->warm_more)
		c->warm_more(c);
	if (c->xfer && sel_xfer_warm(c->xfer))
		c->st.warm_reads++;
}

void sel_core_stats(struct sel_core *c, sel_stats *out)
{
	*out = c->st;
	out->transport = c->sp->backend->name;
	out->slot_bytes = c->slot_bytes;
	out->slots_in_use = sel_slab_in_use(c->sp->pool);
	out->slots_total = sel_slab_total(c->sp->pool);
	out->intake_slots = sel_slab_intake(c->sp->pool);
	sel_tier_stats *t = &out->tier[c->tier];
	t->records = sel_index_count(c->ix);
	t->rate_bps = (uint64_t)sel_policy_rate(c->policy, c->tier);
	t->fixed_ns = (uint64_t)sel_policy_fixed_ns(c->policy, c->tier);
	out->thread_wakes = c->xfer ? sel_xfer_wakes(c->xfer) : 0;
}

/* Leaked memory stays reachable from here (design 2.5: never reused while a
 * detached thread may copy into it). */
static pthread_mutex_t leak_mu = PTHREAD_MUTEX_INITIALIZER;
static struct leaked {
	struct leaked *next;
	size_t n;
	void *what[];
} * leaked_list;

void sel_leak(void *const *what, size_t n)
{
	struct leaked *l = malloc(sizeof(*l) + n * sizeof(void *));
	if (!l)
		return; /* leaked unreachable, which is still safe */
	l->n = n;
	memcpy(l->what, what, n * sizeof(void *));
	pthread_mutex_lock(&leak_mu);
	l->next = leaked_list;
	leaked_list = l;
	pthread_mutex_unlock(&leak_mu);
}
