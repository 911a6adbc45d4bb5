/*
 * store_pooled_export.c - the pooled store as a source for its neighbours
 * (design 2.15 "Exports", "Evictions"): GPU holdings announced when a
 * checkpoint is offered and withdrawn on its eviction notice, and exports,
 * the manager's requests to copy one of them into arena windows for
 * another instance.
 *
 * An export pins the checkpoint through the engine's hooks
 * (sel_export_hooks) before it replies, so eviction, which also runs on
 * the worker, cannot take it; the copy is one OUT job from the GPU ids into
 * the lease, the checksums are computed on the helper thread, and
 * sel_pool_export_done ends the lease.  The pin goes only once the copy
 * drained (a cancelled or failed export too).  Headroom is the engine's
 * answer (-ENOSPC).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "store_common.h"
#include "store_pooled.h"

const char *sel_export_refusal_name(sel_export_refusal r)
{
	switch (r) {
	case SEL_EXPORT_NOT_FOUND: return "not_found";
	case SEL_EXPORT_GENERATION_CHANGED: return "generation_changed";
	case SEL_EXPORT_CHAIN_GAP: return "chain_gap";
	case SEL_EXPORT_NO_HEADROOM: return "no_headroom";
	case SEL_EXPORT_FAILED: return "failed";
	case SEL_EXPORT_DAMAGED: return "damaged";
	case SEL_EXPORT_REFUSALS: break;
	}
	return "unknown";
}

/* ---- holdings -------------------------------------------------------------------------------- */

bool sp_held(const struct sel_pooled *p, uint64_t id)
{
	for (uint32_t i = 0; p->hooks && i < SP_HOLDINGS; i++)
		if (p->hold[i].used && p->hold[i].id == id)
			return true;
	return !p->hooks; /* nothing is announced without exports */
}

void sp_announce(struct sel_pooled *p, const sel_published *cp)
{
	if (!p->hooks || !p->pc || sel_pool_state(p->pc) != SEL_POOL_ATTACHED)
		return;
	struct sp_holding *h = &p->hold[p->n_hold % SP_HOLDINGS];
	if (p->n_hold >= SP_HOLDINGS && h->used) { /* the oldest goes */
		struct sel_pool_holding w = {
			.source = SEL_POOL_SRC_GPU, .key = h->key, .generation = h->id};
		if (sel_pool_withdraw(p->pc, &w, 1) == 0)
			p->pc_st.withdrawn++;
	}
	struct sel_pool_holding a = {.source = SEL_POOL_SRC_GPU,
				     .key = cp->key,
				     .bucket = cp->bucket,
				     .generation = cp->checkpoint};
	if (sel_pool_announce(p->pc, &a, 1))
		return;
	*h = (struct sp_holding){
		.used = true, .key = cp->key, .bucket = cp->bucket, .id = cp->checkpoint};
	p->n_hold++;
	p->pc_st.announced++;
}

void sp_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	for (uint32_t i = 0; p->pc && i < SP_HOLDINGS; i++) {
		struct sp_holding *h = &p->hold[i];
		if (!h->used || !sel_key_eq(&h->key, key))
			continue;
		struct sel_pool_holding w = {
			.source = SEL_POOL_SRC_GPU, .key = h->key, .generation = h->id};
		if (sel_pool_withdraw(p->pc, &w, 1) == 0)
			p->pc_st.withdrawn++;
		h->used = false;
	}
	sel_wrap_evicted(s, key, generation, heir);
}

void sp_reannounce(struct sel_pooled *p)
{
	if (!p->hooks)
		return;
	(void)sel_pool_reset_holdings(p->pc, 1u << SEL_POOL_SRC_GPU);
	for (uint32_t i = 0; i < SP_HOLDINGS; i++) {
		struct sp_holding *h = &p->hold[i];
		struct sel_pool_holding a = {.source = SEL_POOL_SRC_GPU,
					     .key = h->key,
					     .bucket = h->bucket,
					     .generation = h->id};
		if (h->used && sel_pool_announce(p->pc, &a, 1) == 0)
			p->pc_st.announced++;
	}
}

void sp_evictions_lost(sel_store *s)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	sel_store_evictions_lost(p->w.inner);
	if (p->pc && !p->closed)
		sp_hold_reannounce(p); /* the host holdings too, checked */
	if (!p->pc || p->closed || !p->hooks)
		return;
	p->pc_st.evictions_lost++;
	/* Keep only what the engine still holds with its row (describe says),
	 * then announce afresh. */
	for (uint32_t i = 0; i < SP_HOLDINGS; i++) {
		struct sp_holding *h = &p->hold[i];
		sel_published pub;
		if (!h->used || !p->hooks->describe)
			continue;
		if (p->hooks->describe(p->hooks->ctx, h->id, &pub) ||
		    !sel_key_eq(&pub.key, &h->key))
			h->used = false;
	}
	sp_reannounce(p);
}

/* ---- exports ----------------------------------------------------------------------------------- */

static void export_end(struct sel_pooled *p, struct sp_export *x, bool done)
{
	if (x->lease) {
		if (done &&
		    sel_pool_export_done(p->pc, x->lease, x->hj.cksums, x->hj.row_cksum) == 0)
			p->pc_st.exports_served++;
		else
			(void)sel_pool_release(p->pc, x->lease, SEL_POOL_COPY_FAILED);
		if (!done)
			p->pc_st.exports_refused[x->why]++;
	}
	if (x->pinned)
		p->hooks->unpin(p->hooks->ctx, x->checkpoint);
	if (x->hpinned)
		sel_core_unpin_key(x->hc, &x->hkey);
	free(x->hj.src);
	free(x->hj.files);
	for (struct sp_export **pp = &p->exports; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	free(x->hj.cksums);
	free(x->pages);
	free(x);
}

static void export_submit(struct sel_pooled *p, struct sp_export *x)
{
	int rc = sel_xfer_submit(p->x, &x->job);
	if (rc == 0)
		x->submitted = true;
	else if (rc != -EAGAIN)
		export_end(p, x, false);
}

void sp_export_retry(struct sel_pooled *p)
{
	for (struct sp_export *x = p->exports, *n; x; x = n) {
		n = x->next;
		if (!x->submitted && !x->summing)
			export_submit(p, x);
	}
}

static void export_refuse(struct sel_pooled *p, struct sel_pool_lease *l, uint32_t reason,
			  sel_export_refusal why)
{
	p->pc_st.exports_refused[why]++;
	(void)sel_pool_export_reply(p->pc, l, reason);
}

/* A request: pin, check, reply, copy. */
static void export_begin(struct sel_pooled *p, struct sel_pool_lease *l)
{
	sel_published pub;
	int rc = p->hooks && !p->closed ? p->hooks->pin(p->hooks->ctx, &l->key, l->generation, &pub)
					: -ENOENT;
	if (rc == -ESTALE)
		return export_refuse(p, l, SEL_POOL_GENERATION_CHANGED,
				     SEL_EXPORT_GENERATION_CHANGED);
	if (rc == -ENOSPC)
		return export_refuse(p, l, SEL_POOL_NO_HEADROOM, SEL_EXPORT_NO_HEADROOM);
	if (rc)
		return export_refuse(p, l, SEL_POOL_NOT_FOUND, SEL_EXPORT_NOT_FOUND);
	struct sp_export *x = NULL;
	if ((uint64_t)l->start_page + l->n_pages != pub.n_pages || !(x = calloc(1, sizeof *x)) ||
	    !(x->pages = malloc(((size_t)l->n_pages + 1) * sizeof *x->pages)) ||
	    !(x->hj.cksums = malloc(((size_t)l->n_pages + 1) * sizeof *x->hj.cksums))) {
		if (x) {
			free(x->pages);
			free(x);
		}
		p->hooks->unpin(p->hooks->ctx, l->generation);
		return export_refuse(p, l, SEL_POOL_CHAIN_GAP, SEL_EXPORT_CHAIN_GAP);
	}
	if (l->n_pages)
		memcpy(x->pages, pub.pages + l->start_page, (size_t)l->n_pages * sizeof *x->pages);
	x->checkpoint = l->generation;
	x->why = SEL_EXPORT_FAILED;
	x->pinned = true;
	x->lease = l;
	x->next = p->exports;
	p->exports = x;
	if (sel_pool_export_reply(p->pc, l, SEL_POOL_OK)) {
		export_end(p, x, false); /* the lease is ours to end still */
		return;
	}
	x->job = (struct sel_xfer_job){.id = x->checkpoint,
				       .dir = SEL_COPY_OUT,
				       .n_pages = l->n_pages,
				       .pages = x->pages,
				       .page_slots = l->page_slots,
				       .row = l->n_row_slots > 0,
				       .state_slot = pub.state_slot,
				       .row_slots = l->row_slots};
	export_submit(p, x);
}

bool sp_export_event(struct sel_pooled *p, const struct sel_pool_event *ev)
{
	if (ev->type == SEL_POOL_EV_EXPORT) {
		uint8_t src = ev->lease->source;
		if (src == SEL_POOL_SRC_DRAM || src == SEL_POOL_SRC_NVME)
			sp_export_host(p, ev->lease);
		else
			export_begin(p, ev->lease);
		return true;
	}
	bool ours = ev->type == SEL_POOL_EV_EXPORT_CANCEL ||
		    (ev->type == SEL_POOL_EV_LEASE_FAILED && ev->lease &&
		     ev->lease->kind == SEL_POOL_EXPORT);
	if (!ours)
		return false;
	struct sp_export *x = p->exports;
	while (x && x->lease != ev->lease)
		x = x->next;
	if (!x)
		return true;
	if (!x->submitted && !x->summing)
		export_end(p, x, false); /* nothing copies into it */
	else
		x->cancelled = true;
	return true;
}

bool sp_export_copied(struct sel_pooled *p, struct sel_xfer_job *j)
{
	struct sp_export *x = p->exports;
	while (x && &x->job != j)
		x = x->next;
	if (!x)
		return false;
	x->submitted = false;
	if (j->status || x->cancelled) {
		export_end(p, x, false);
		return true;
	}
	p->pc_st.export_bytes += j->bytes;
	x->summing = true;
	x->hj.lease = x->lease;
	x->hj.verify = false;
	sp_helper_submit(p, &x->hj);
	return true;
}

bool sp_export_helped(struct sel_pooled *p, struct sp_hjob *j)
{
	struct sp_export *x = p->exports;
	while (x && &x->hj != j)
		x = x->next;
	if (!x)
		return false;
	x->summing = false;
	if (j->rstatus) { /* a host holding's file failed its checks */
		x->why = SEL_EXPORT_DAMAGED;
		sp_hold_withdraw(p, x->lease ? x->lease->source : 0, &x->hkey); /* not again */
		export_end(p, x, false);
		return true;
	}
	if (x->hc && x->lease && !x->cancelled) /* a GPU export counts its copy's bytes */
		p->pc_st.export_bytes +=
			(uint64_t)(x->lease->n_pages + x->lease->n_row_slots) * p->lay.slot_bytes;
	export_end(p, x, !x->cancelled);
	return true;
}

/* Close: every export's copy drained; end them and unpin. */
void sp_exports_end(struct sel_pooled *p)
{
	while (p->exports)
		export_end(p, p->exports, false);
}

/* ---- host holdings (store_pooled_hold.c) ----------------------------------------------------- */

/* The record of l's DRAM or NVMe holding, pinned in its tier and
 * snapshotted for the helper (the memory store's share addresses, or the
 * disk store's files), or a refusal (*why). */
static struct sp_export *host_snapshot(struct sel_pooled *p, struct sel_pool_lease *l,
				       sel_export_refusal *why)
{
	struct sp_htier *t = NULL;
	struct sp_holding *h = p->closed ? NULL : sp_hold_find(p, l->source, &l->key, &t);
	*why = SEL_EXPORT_NOT_FOUND;
	if (!h)
		return NULL;
	if (h->id != l->generation) {
		*why = SEL_EXPORT_GENERATION_CHANGED;
		return NULL;
	}
	uint32_t n = (uint32_t)(l->key.consumed / t->c->pt), tail, nf = 0;
	if ((uint64_t)l->start_page + l->n_pages != n || !l->n_row_slots) {
		*why = SEL_EXPORT_CHAIN_GAP;
		return NULL;
	}
	struct sp_export *x = calloc(1, sizeof *x);
	if (!x || sel_core_pin_key(t->c, &l->key)) {
		free(x);
		return NULL;
	}
	x->hc = t->c;
	x->hkey = l->key;
	x->hpinned = true;
	sel_key parent;
	if (t->source == SEL_POOL_SRC_NVME)
		x->hj.files = sp_chain_files(t->s, &l->key, n, &nf, &parent, &tail);
	else
		x->hj.src = sp_chain_sources(p, t->s, &l->key, n, &parent, &tail);
	x->hj.cksums = malloc(((size_t)l->n_pages + 1) * sizeof *x->hj.cksums);
	if ((!x->hj.files && !x->hj.src) || !x->hj.cksums) {
		sel_core_unpin_key(t->c, &l->key);
		free(x->hj.files);
		free(x->hj.src);
		free(x->hj.cksums);
		free(x);
		return NULL;
	}
	x->hj.n_files = nf;
	x->hj.src_n = n;
	x->hj.src_skip = l->start_page;
	return x;
}

/* An export of a host holding: the record pinned in its tier, replied to,
 * and copied (or read from its files, every header, page and row checked)
 * into the windows and checksummed in one helper job; the worker never
 * waits.  A damaged file fails it (SEL_EXPORT_DAMAGED): the requester
 * falls back as for a failed GPU export. */
void sp_export_host(struct sel_pooled *p, struct sel_pool_lease *l)
{
	sel_export_refusal why;
	struct sp_export *x = host_snapshot(p, l, &why);
	if (!x) {
		uint32_t reason = why == SEL_EXPORT_GENERATION_CHANGED ? SEL_POOL_GENERATION_CHANGED
				  : why == SEL_EXPORT_CHAIN_GAP        ? SEL_POOL_CHAIN_GAP
								       : SEL_POOL_NOT_FOUND;
		return export_refuse(p, l, reason, why);
	}
	x->checkpoint = l->generation;
	x->why = SEL_EXPORT_FAILED;
	x->lease = l;
	x->next = p->exports;
	p->exports = x;
	if (sel_pool_export_reply(p->pc, l, SEL_POOL_OK)) {
		export_end(p, x, false);
		return;
	}
	x->summing = true;
	x->hj.lease = l;
	x->hj.verify = false;
	sp_helper_submit(p, &x->hj);
}
