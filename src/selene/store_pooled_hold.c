/*
 * store_pooled_hold.c - the local tiers' records as holdings (design 2.15
 * "announcements of GPU and host holdings", copy priority "neighbour GPU,
 * host DRAM, host NVMe, pool"): every restorable record of the memory
 * tier is announced as a DRAM holding of this instance, every one of the
 * disk tier as an NVMe holding, and withdrawn when it leaves that tier, so
 * that a neighbour whose GPU copy is gone can still restore from this
 * instance's host tiers through an export (store_pooled_export.c
 * sp_export_host), without the manager's arena.
 *
 * DESIGN
 *   The tiers are watched through their cores (sel_core_watch): a commit
 *   queues the key (SP_HOST_PENDING; an overflow walks the index instead),
 *   and the next poll announces it once it is readable the way an export
 *   reads it -- the memory store's whole chain in its slots
 *   (sp_chain_sources), or the disk store's committed files
 *   (sp_chain_files; a parked record, not yet on disk, is looked at again
 *   for SP_HOST_WAIT_NS).  A record leaving the index or losing its row
 *   (eviction, unlink, compaction, cascade acceptance, expiry, a drop)
 *   withdraws its holding from inside the core's callback: a frame queued,
 *   nothing else touched.  Each tier keeps at most SP_HOLDINGS holdings,
 *   the oldest withdrawn for a new one, like the GPU holdings.  The
 *   generation of a holding is a number of this store, never reused, so an
 *   export request for a record that left and came back is refused
 *   (generation_changed).
 *
 *   Records with replicated shares (TP > 1, packed) are not announced
 *   (design 2.4: memory stores containing replicated records refuse pool
 *   announcements; the disk tier's are not announced either, although the
 *   cascade now reads them).  A split pool's memory store is not announced (the cascade
 *   cannot read it either).
 *
 * INVARIANTS
 *   1. A used holding names a record of its tier that was readable when it
 *      was announced; when the record leaves the tier the holding is
 *      withdrawn in the same callback.
 *   2. Everything runs on the model worker thread and never waits: the
 *      client's calls queue frames.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "store_common.h"
#include "store_composite.h"
#include "store_disk.h"
#include "store_memory.h"
#include "store_pool.h"
#include "store_pooled.h"

static bool attached(const struct sel_pooled *p)
{
	return p->pc && !p->closed && sel_pool_state(p->pc) == SEL_POOL_ATTACHED;
}

struct sp_holding *sp_hold_find(struct sel_pooled *p, uint8_t source, const sel_key *key,
				struct sp_htier **tp)
{
	for (uint32_t t = 0; t < 2; t++) {
		struct sp_htier *ht = &p->host[t];
		if (!ht->c || ht->source != source)
			continue;
		for (uint32_t i = 0; i < SP_HOLDINGS; i++)
			if (ht->h[i].used && sel_key_eq(&ht->h[i].key, key)) {
				if (tp)
					*tp = ht;
				return &ht->h[i];
			}
	}
	return NULL;
}

static void withdraw(struct sel_pooled *p, struct sp_htier *t, struct sp_holding *h)
{
	struct sel_pool_holding w = {.source = t->source, .key = h->key, .generation = h->id};
	if (attached(p) && sel_pool_withdraw(p->pc, &w, 1) == 0)
		p->pc_st.host_withdrawn[t->source == SEL_POOL_SRC_NVME]++;
	h->used = false;
}

void sp_hold_withdraw(struct sel_pooled *p, uint8_t source, const sel_key *key)
{
	struct sp_htier *t;
	struct sp_holding *h = sp_hold_find(p, source, key, &t);
	if (h)
		withdraw(p, t, h);
}

/* Whether key's record in t is readable as an export reads it: 1 yes, 0
 * not now (a parked disk record: later), -1 never (replicated, gone). */
static int readable(struct sel_pooled *p, struct sp_htier *t, const sel_key *key)
{
	sel_node_id id = sel_index_find(t->c->ix, key);
	const sel_index_node *n = id == SEL_NODE_NONE ? NULL : sel_core_node(t->c, id);
	if (!n || n->state != SEL_NODE_READY || !(n->flags & SEL_NODE_HAS_ROW) ||
	    (n->flags & t->c->refuse))
		return -1;
	uint32_t np = (uint32_t)(key->consumed / t->c->pt), tail, nf;
	sel_key parent;
	if (t->source == SEL_POOL_SRC_NVME) {
		struct sel_disk_file *f = sp_chain_files(t->s, key, np, &nf, &parent, &tail);
		if (f) {
			uint32_t flags = 0; /* replicated shares anywhere in the chain: no */
			for (uint32_t i = 0; i < nf; i++)
				flags |= f[i].d.flags;
			free(f);
			return flags ? -1 : 1;
		}
		struct sel_disk_file df;
		return sel_disk_store_file(t->s, key, &df) == -EAGAIN ? 0 : -1;
	}
	for (sel_key at = *key;;) { /* replicated shares anywhere in the chain: no */
		struct sel_memory_view v;
		if (sel_memory_store_view(t->s, &at, &v) || v.pages_packed || v.row_packed)
			return -1;
		if (v.is_root)
			break;
		at = v.parent;
	}
	const uint8_t **src = sp_chain_sources(p, t->s, key, np, &parent, &tail);
	free(src);
	return src ? 1 : -1;
}

static void announce(struct sel_pooled *p, struct sp_htier *t, const sel_key *key)
{
	sel_node_id id = sel_index_find(t->c->ix, key);
	if (id == SEL_NODE_NONE || sp_hold_find(p, t->source, key, NULL))
		return;
	struct sp_holding *h = &t->h[t->n % SP_HOLDINGS];
	if (h->used) /* the oldest goes */
		withdraw(p, t, h);
	*h = (struct sp_holding){.used = true,
				 .key = *key,
				 .bucket = sel_core_node(t->c, id)->bucket,
				 .id = ++p->hgen};
	t->n++;
	struct sel_pool_holding a = {
		.source = t->source, .key = *key, .bucket = h->bucket, .generation = h->id};
	if (attached(p) && sel_pool_announce(p->pc, &a, 1) == 0)
		p->pc_st.host_announced[t->source == SEL_POOL_SRC_NVME]++;
}

/* ---- the cores' callbacks ------------------------------------------------------------------- */

static struct sp_htier *tier_of(struct sel_pooled *p, const struct sel_core *c)
{
	for (uint32_t t = 0; t < 2; t++)
		if (p->host[t].c == c)
			return &p->host[t];
	return NULL;
}

static void on_committed(void *ctx, struct sel_core *c, sel_node_id id)
{
	struct sel_pooled *p = ctx;
	struct sp_htier *t = tier_of(p, c);
	const sel_index_node *n = sel_core_node(c, id);
	if (!t || !(n->flags & SEL_NODE_HAS_ROW))
		return;
	if (t->p_n == SP_HOST_PENDING) {
		t->rescan = true;
		return;
	}
	uint32_t at = (t->p_head + t->p_n++) % SP_HOST_PENDING;
	t->pend[at].key = n->key;
	t->pend[at].since = eos_now_ns();
}

static void on_leaving(void *ctx, struct sel_core *c, sel_node_id id)
{
	struct sel_pooled *p = ctx;
	struct sp_htier *t = tier_of(p, c);
	struct sp_holding *h =
		t ? sp_hold_find(p, t->source, &sel_core_node(c, id)->key, NULL) : NULL;
	if (h)
		withdraw(p, t, h);
}

/* ---- announcing -------------------------------------------------------------------------------- */

/* Every indexed record of t, oldest first, as committed now (the newest
 * SP_HOST_PENDING). */
static void rescan(struct sel_pooled *p, struct sp_htier *t)
{
	t->rescan = false;
	size_t n = sel_core_keys(t->c, NULL, 0);
	sel_key *keys = n ? malloc(n * sizeof *keys) : NULL;
	if (!keys)
		return;
	n = sel_core_keys(t->c, keys, n);
	t->p_head = t->p_n = 0;
	uint64_t now = eos_now_ns();
	for (size_t i = n > SP_HOST_PENDING ? n - SP_HOST_PENDING : 0; i < n; i++) {
		t->pend[t->p_n].key = keys[i];
		t->pend[t->p_n++].since = now;
	}
	free(keys);
	(void)p;
}

void sp_hold_pump(struct sel_pooled *p)
{
	if (!attached(p))
		return;
	uint64_t now = eos_now_ns();
	for (uint32_t k = 0; k < 2; k++) {
		struct sp_htier *t = &p->host[k];
		if (!t->c)
			continue;
		if (t->rescan)
			rescan(p, t);
		for (uint32_t m = t->p_n; m-- > 0;) { /* what is queued now, once */
			sel_key key = t->pend[t->p_head].key;
			uint64_t since = t->pend[t->p_head].since;
			t->p_head = (t->p_head + 1) % SP_HOST_PENDING;
			t->p_n--;
			int r = readable(p, t, &key);
			if (r > 0) {
				announce(p, t, &key);
			} else if (r == 0 && now - since < SP_HOST_WAIT_NS) {
				uint32_t at = (t->p_head + t->p_n++) % SP_HOST_PENDING;
				t->pend[at].key = key;
				t->pend[at].since = since;
			}
		}
	}
}

void sp_hold_reannounce(struct sel_pooled *p)
{
	if (!p->host[0].c && !p->host[1].c)
		return;
	if (!attached(p))
		return;
	(void)sel_pool_reset_holdings(p->pc, 1u << SEL_POOL_SRC_DRAM | 1u << SEL_POOL_SRC_NVME);
	for (uint32_t k = 0; k < 2; k++) {
		struct sp_htier *t = &p->host[k];
		for (uint32_t i = 0; t->c && i < SP_HOLDINGS; i++) {
			struct sp_holding *h = &t->h[i];
			if (!h->used)
				continue;
			if (readable(p, t, &h->key) < 0) { /* left while nobody listened */
				h->used = false;
				continue;
			}
			struct sel_pool_holding a = {.source = t->source,
						     .key = h->key,
						     .bucket = h->bucket,
						     .generation = h->id};
			if (sel_pool_announce(p->pc, &a, 1) == 0)
				p->pc_st.host_announced[k]++;
		}
	}
}

/* ---- attach and detach --------------------------------------------------------------------- */

static void watch(struct sel_pooled *p, struct sp_htier *t, sel_store *s, uint8_t source)
{
	struct sel_core *c = sel_store_core(s);
	if (!c || c->sp->split)
		return;
	t->h = calloc(SP_HOLDINGS, sizeof *t->h);
	t->pend = calloc(SP_HOST_PENDING, sizeof *t->pend);
	if (!t->h || !t->pend) {
		free(t->h);
		free(t->pend);
		t->h = NULL;
		t->pend = NULL;
		return;
	}
	t->c = c;
	t->s = s;
	t->source = source;
	t->rescan = true; /* what the tier held before: a restart's disk records */
	struct sel_core_watch w = {.committed = on_committed, .leaving = on_leaving, .ctx = p};
	sel_core_watch_set(c, &w);
}

void sp_hold_attach(struct sel_pooled *p)
{
	sel_store *in = p->w.inner, *mem = NULL, *disk = NULL;
	if (!p->pc || !in)
		return;
	if (!strcmp(in->ops->name, "composite")) {
		mem = sel_composite_store_memory(in);
		disk = sel_composite_store_disk(in);
	} else if (!strcmp(in->ops->name, "memory")) {
		mem = in;
	} else if (!strcmp(in->ops->name, "disk")) {
		disk = in;
	}
	if (mem && sel_store_core(mem) && sel_store_core(mem)->tier == SEL_TIER_MEMORY)
		watch(p, &p->host[0], mem, SEL_POOL_SRC_DRAM);
	if (disk && sel_store_core(disk) && sel_store_core(disk)->tier == SEL_TIER_DISK) {
		if (!p->casc_ns) { /* the reader's namespace (the cascade's, when it runs) */
			p->casc_dirfd = sel_disk_store_dirfd(disk);
			p->casc_ns = sel_disk_store_ns(disk);
		}
		watch(p, &p->host[1], disk, SEL_POOL_SRC_NVME);
	}
}

void sp_hold_detach(struct sel_pooled *p)
{
	for (uint32_t k = 0; k < 2; k++) {
		struct sp_htier *t = &p->host[k];
		if (t->c)
			sel_core_watch_set(t->c, NULL);
		free(t->h);
		free(t->pend);
		*t = (struct sp_htier){0};
	}
}
