/*
 * store_pooled_fetch.c - restores from the pool: the claim, the grant's
 * checks, and the windows, each verified on the helper thread and then
 * copied into the ticket's page ids and state slot while the next one is
 * verified (store_pooled.h has the design and invariants 1 and 2).
 *
 * A restore of n pages is ceil(n / SEL_WINDOW_PAGES) windows (at least
 * one: a row-only restore), the row with the last.  Every window goes to
 * the helper at the grant, which verifies them in order; each verified
 * window is submitted as an IN job at once (a full channel: on a later
 * poll) while the helper goes on with the next.  So the copy of window i
 * overlaps the verification of the windows after it, the copy threads find
 * the next verified window queued without waiting for the worker, and a
 * restore takes about the longer of the two passes rather than their sum.  A window that fails its checksums stops the
 * pipeline: nothing after it is submitted, and the lease is released
 * CORRUPT once the jobs already out have drained.  Bytes reach the GPU ids
 * only after their own window verified; a failed restore leaves the
 * destination partly written, which the FETCH_FAILED contract allows (the
 * ids go back to the free lists: nothing reads them).
 *
 * Fused restores.  With host planes and the host copy backend (flare run
 * on the reference engine) a window is one helper job instead: each page
 * is checksummed from the arena and then copied from the cache it was
 * just read into (streaming stores for a large window), the row likewise.
 * The record then crosses the memory bus once, as one memcpy of it would,
 * instead of once for the verification and again for the copy, which is
 * what bounds a restore on a machine whose memory bandwidth is shared
 * (docs/performance.md); a page is still copied only after it verified.
 *
 * Overlapped restores (issue 18; sel_inbound.sums).  The engine fetches
 * only the tail of a hit, above a resident `at`, while it recomputes the
 * n pages below it, and needs the stored digests of those n pages to
 * compare.  The claim then starts n pages lower (the manager grants the
 * chain from any resident): the lease's first n pages are the head, which
 * one more helper job (sum_job) checks against the lease's page_cksum and
 * digests from the arena (sel_slot_page_digest_padded: the planes' bytes,
 * not the slot's never-written padding), and which are never copied; the
 * windows cover the tail only.  The restore ends when the head's job and
 * every window are done, so the digests are there with FETCHED; a head
 * page that fails its checksum fails the restore (corrupt), as any page.
 */
#include "xxh.h"
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "store_pooled.h"
#include "transfer.h"

void sp_fetch_free(struct sp_fetch *f)
{
	sel_history_free(&f->hist);
	free(f->hjs);
	free(f->vdone);
	free(f->jobs);
	free(f->pages);
	free(f);
}

static void fetch_unlink(struct sel_pooled *p, struct sp_fetch *f)
{
	for (struct sp_fetch **pp = &p->fetches; *pp; pp = &(*pp)->next)
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	sp_fetch_free(f);
}

static void count_restore(struct sel_pooled *p, const struct sp_fetch *f)
{
	p->pc_st.restores++;
	p->pc_st.reused_tokens += f->key.consumed - f->resident;
	p->pc_st.reused_bytes += f->bytes;
	p->tier.bytes_in += f->bytes;
	if (f->neighbour) {
		p->pc_st.neighbour_restores++;
		p->pc_st.neighbour_tokens += f->key.consumed - f->resident;
		p->pc_st.neighbour_bytes += f->bytes;
		if (f->ntier == SEL_TIER_MEMORY || f->ntier == SEL_TIER_DISK) {
			int k = f->ntier == SEL_TIER_DISK;
			p->pc_st.neighbour_host_restores[k]++;
			p->pc_st.neighbour_host_tokens[k] += f->key.consumed - f->resident;
			p->pc_st.neighbour_host_bytes[k] += f->bytes;
		}
	}
}

/* A failed restore whose endpoint the local tiers hold too (a neighbour
 * won the tie): the local copy, now that the pool's writes drained (design
 * 2.15 "One source").  True when the inner store took it (its event is the
 * ticket's). */
static bool fetch_fallback(struct sel_pooled *p, struct sp_fetch *f)
{
	/* Not an overlapped tail: the local copy would not give its head's
	 * digests. */
	if (f->n_head || !f->has_local || !p->w.inner || p->closed ||
	    f->local.pages != f->n_pages || !sel_key_eq(&f->local.key, &f->key))
		return false;
	sel_inbound in = {.ticket = f->ticket,
			  .pages = f->pages,
			  .n_pages = f->n_pages,
			  .state_slot = f->state_slot};
	if (sel_store_fetch(p->w.inner, &f->local, &in))
		return false; /* gone meanwhile: recompute */
	p->pc_st.local_fallbacks++;
	return true;
}

/* End f (no work of it out any more): the lease released, one event. */
static void fetch_end(struct sel_pooled *p, struct sp_fetch *f)
{
	bool ok = !f->failed;
	if (f->lease)
		(void)sel_pool_release(p->pc, f->lease, ok ? SEL_POOL_OK : f->release);
	f->lease = NULL;
	if (!ok && fetch_fallback(p, f)) {
		p->pc_st.claims_failed[f->why]++;
		sp_ticket_failed(p, f->tk_slot, f->tk_seq, false);
		fetch_unlink(p, f);
		return;
	}
	sel_event ev = {.type = ok ? SEL_EV_FETCHED : SEL_EV_FETCH_FAILED,
			.error = ok ? 0 : -ECANCELED,
			.ticket = f->ticket,
			.key = f->key,
			.tier = SEL_TIER_POOL,
			.bytes = ok ? f->bytes : 0,
			.duration_ns = eos_now_ns() - f->t0};
	if (ok) {
		sp_known_add(p, &f->key); /* children of it link under the pool's copy */
		count_restore(p, f);
	} else {
		p->pc_st.claims_failed[f->why]++;
		/* The readmitted request's lookup: the local tiers alone (a
		 * shorter prefix from one of them, or a recompute). */
		sp_ticket_failed(p, f->tk_slot, f->tk_seq, true);
		if (f->neighbour) { /* the arena's copy, if any, next time */
			p->shun[p->n_shun % SP_SHUNNED].key = f->key;
			p->shun[p->n_shun++ % SP_SHUNNED].until = eos_now_ns() + SP_SHUN_NS;
		}
	}
	(void)sp_emit(p, &ev);
	fetch_unlink(p, f);
}

/* f failed (why; the lease to end with release): it ends once nothing of
 * it is out (the helper's window returned, the jobs drained). */
static void fetch_fail(struct sel_pooled *p, struct sp_fetch *f, sel_pool_fail why,
		       uint32_t release)
{
	if (!f->failed) {
		f->failed = true;
		f->why = why;
		f->release = release;
	}
	if (!f->verifying && f->copied == f->submitted)
		fetch_end(p, f);
}

int sp_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	if (!hit || !in || hit->tier != SEL_TIER_POOL)
		return sel_wrap_fetch(s, hit, in);
	if (p->closed || !p->pc)
		return eos_fail(SEL_ESTOPPED, "pooled store: closed");
	uint32_t cand;
	struct sp_ticket *t = sp_ticket_of(p, hit, &cand);
	if (!t)
		return eos_fail(-ESTALE, "pooled store: the pool hit's lookup is gone");
	if (in->n_pages != hit->pages)
		return eos_fail(-EINVAL, "pooled store: %u destination pages for a hit of %u",
				in->n_pages, hit->pages);
	if (in->n_sums && hit->neighbour)
		return eos_fail(-ENOTSUP,
				"pooled store: no page digests from a neighbour's export");
	struct sp_fetch *f = calloc(1, sizeof *f);
	if (!f || !(f->pages = malloc(((size_t)in->n_pages + 1) * sizeof *f->pages))) {
		free(f);
		return eos_fail(-ENOMEM, "pooled store: out of memory");
	}
	if (in->n_pages)
		memcpy(f->pages, in->pages, (size_t)in->n_pages * sizeof *f->pages);
	f->n_head = in->n_sums;
	f->sums = in->sums;
	f->claimed = f->n_head ? (hit->resident / s->page_tokens - f->n_head) * s->page_tokens
			       : hit->resident;
	int rc = sel_pool_claim_at(p->pc, t->t, cand, f->claimed, &f->claim);
	if (rc) {
		free(f->pages);
		free(f);
		return rc;
	}
	f->hist = t->hist; /* the history the lookup compared: moved */
	t->hist_ok = false;
	f->tk_seq = t->seq;
	f->tk_slot = (uint32_t)(t - p->tk);
	f->ticket = in->ticket;
	f->key = hit->key;
	f->resident = hit->resident;
	f->neighbour = hit->neighbour;
	f->ntier = hit->neighbour ? hit->neighbour_tier : SEL_TIER_NONE;
	f->has_local = t->has_local;
	f->local = t->local;
	f->n_pages = in->n_pages;
	f->state_slot = in->state_slot;
	f->t0 = eos_now_ns();
	f->next = p->fetches;
	p->fetches = f;
	p->pc_st.claims++;
	return 0;
}

/* ---- the windows ----------------------------------------------------------------------------- */

/* Every window to the helper, in order (fused: to verify and copy). */
static void verify_all(struct sel_pooled *p, struct sp_fetch *f)
{
	if (f->n_head) { /* the head first: its digests are due with FETCHED */
		f->sum_job = (struct sp_hjob){
			.lease = f->lease, .first = 0, .n = f->n_head, .sums = f->sums};
		f->verifying++;
		f->sums_live = true;
		sp_helper_submit(p, &f->sum_job);
	}
	for (uint32_t k = 0; k < f->n_win; k++) {
		uint32_t first = k * SEL_WINDOW_PAGES, left = f->n_pages - first;
		f->hjs[k] = (struct sp_hjob){.lease = f->lease,
					     .verify = true,
					     .first = f->n_head + first,
					     .n = left < SEL_WINDOW_PAGES ? left : SEL_WINDOW_PAGES,
					     .row = k + 1 == f->n_win,
					     .restore = p->fused,
					     .dst = f->pages,
					     .dst_skip = f->n_head,
					     .state_slot = f->state_slot};
		f->verifying++;
		sp_helper_submit(p, &f->hjs[k]);
	}
}

/* Every window copied and the head's digests (if any) written. */
static bool fetch_done(const struct sp_fetch *f) { return f->copied == f->n_win && !f->sums_live; }

/* Submit the verified windows not yet out, in order. */
static void submit_verified(struct sel_pooled *p, struct sp_fetch *f)
{
	while (!f->failed && f->submitted < f->verified) {
		int rc = sel_xfer_submit(p->x, &f->jobs[f->submitted]);
		if (rc == -EAGAIN)
			return; /* a later poll */
		if (rc) {
			fetch_fail(p, f, SEL_POOL_FAIL_COPY, SEL_POOL_COPY_FAILED);
			return;
		}
		f->submitted++;
	}
}

void sp_fetch_retry(struct sel_pooled *p)
{
	for (struct sp_fetch *f = p->fetches, *n; f; f = n) {
		n = f->next;
		if (f->granted && !f->failed)
			submit_verified(p, f);
	}
}

static void fetch_granted(struct sel_pooled *p, struct sp_fetch *f, struct sel_pool_lease *l)
{
	f->lease = l;
	f->granted = true;
	if (!sel_pool_lease_matches(l, &f->hist, f->claimed) ||
	    l->n_pages != f->n_head + f->n_pages || !l->n_row_slots) {
		fetch_fail(p, f, SEL_POOL_FAIL_MISMATCH, SEL_POOL_CORRUPT);
		return;
	}
	f->n_win = f->n_pages ? (f->n_pages + SEL_WINDOW_PAGES - 1) / SEL_WINDOW_PAGES : 1;
	if (!(f->jobs = calloc(f->n_win, sizeof *f->jobs)) ||
	    !(f->hjs = calloc(f->n_win, sizeof *f->hjs)) || !(f->vdone = calloc(f->n_win, 1))) {
		fetch_fail(p, f, SEL_POOL_FAIL_COPY, SEL_POOL_COPY_FAILED);
		return;
	}
	for (uint32_t k = 0; k < f->n_win; k++) {
		uint32_t first = k * SEL_WINDOW_PAGES, left = f->n_pages - first;
		f->jobs[k] = (struct sel_xfer_job){
			.id = f->ticket,
			.dir = SEL_COPY_IN,
			.n_pages = left < SEL_WINDOW_PAGES ? left : SEL_WINDOW_PAGES,
			.pages = f->pages + first,
			.page_slots = l->page_slots + f->n_head + first,
			.row = k + 1 == f->n_win,
			.state_slot = f->state_slot,
			.row_slots = l->row_slots};
	}
	verify_all(p, f);
}

static sel_pool_fail fail_of(uint32_t reason)
{
	switch (reason) {
	case SEL_POOL_TIMEOUT:
	case SEL_POOL_NO_PROGRESS: return SEL_POOL_FAIL_TIMEOUT;
	case SEL_POOL_GONE:
	case SEL_POOL_SHUTDOWN: return SEL_POOL_FAIL_GONE;
	default: return SEL_POOL_FAIL_REFUSED;
	}
}

bool sp_fetch_event(struct sel_pooled *p, const struct sel_pool_event *ev)
{
	bool by_lease = ev->type == SEL_POOL_EV_LEASE_FAILED;
	if (ev->type != SEL_POOL_EV_CLAIM_GRANTED && ev->type != SEL_POOL_EV_CLAIM_FAILED &&
	    !(by_lease && ev->lease && ev->lease->kind == SEL_POOL_CLAIM))
		return false;
	struct sp_fetch *f = p->fetches;
	while (f && (by_lease ? f->lease != ev->lease : (f->granted || f->claim != ev->request)))
		f = f->next;
	if (!f) {
		if (ev->type == SEL_POOL_EV_CLAIM_GRANTED || by_lease) /* nobody's: end it */
			(void)sel_pool_release(p->pc, ev->lease, SEL_POOL_OK);
		return true;
	}
	if (ev->type == SEL_POOL_EV_CLAIM_GRANTED)
		fetch_granted(p, f, ev->lease);
	else
		fetch_fail(p, f, fail_of(ev->reason), SEL_POOL_COPY_FAILED);
	return true;
}

bool sp_fetch_helped(struct sel_pooled *p, struct sp_hjob *j)
{
	struct sp_fetch *f = p->fetches;
	while (f && j != &f->sum_job && !(f->hjs && j >= f->hjs && j < f->hjs + f->n_win))
		f = f->next;
	if (!f)
		return false;
	f->verifying--;
	if (j == &f->sum_job) {
		f->sums_live = false;
		if (f->failed)
			fetch_fail(p, f, f->why, f->release);
		else if (j->status)
			fetch_fail(p, f, SEL_POOL_FAIL_CORRUPT, SEL_POOL_CORRUPT);
		else if (fetch_done(f))
			fetch_end(p, f);
		return true;
	}
	if (f->failed) {
		fetch_fail(p, f, f->why, f->release);
		return true;
	}
	if (j->status) {
		fetch_fail(p, f, SEL_POOL_FAIL_CORRUPT, SEL_POOL_CORRUPT);
		return true;
	}
	f->vdone[j - f->hjs] = 1; /* the helpers may finish windows out of order */
	while (f->verified < f->n_win && f->vdone[f->verified])
		f->verified++;
	/* The manager's no-progress timer: the share of its windows done. */
	(void)sel_pool_progress(p->pc, f->lease,
				(uint32_t)((uint64_t)f->lease->windows * f->verified / f->n_win));
	if (j->restore) { /* verified and copied */
		f->submitted++;
		f->copied++;
		f->bytes += j->bytes;
		if (fetch_done(f))
			fetch_end(p, f);
		return true;
	}
	submit_verified(p, f);
	return true;
}

bool sp_fetch_copied(struct sel_pooled *p, struct sel_xfer_job *j)
{
	struct sp_fetch *f = p->fetches;
	while (f && !(f->jobs && j >= f->jobs && j < f->jobs + f->n_win))
		f = f->next;
	if (!f)
		return false;
	f->copied++;
	f->bytes += j->bytes;
	if (j->status)
		fetch_fail(p, f, SEL_POOL_FAIL_COPY, SEL_POOL_COPY_FAILED);
	else if (f->failed)
		fetch_fail(p, f, f->why, f->release);
	else if (fetch_done(f))
		fetch_end(p, f);
	return true;
}

/* ---- fused restores (on the helper thread) ----------------------------------------------- */

int sp_restore_window(const struct sel_pooled *p, struct sp_hjob *j)
{
	const struct sel_pool_lease *l = j->lease;
	const sel_slot_layout *lay = &p->lay;
	const sel_geometry *g = p->g;
	struct sel_copy c[64];
	uint64_t window = 0;
	for (uint32_t r = 0; r < g->ranks; r++)
		window += g->rank[r].page_bytes;
	enum sel_host_copy kind = sel_host_copy_choose(window * j->n);
	j->bytes = 0;
	for (uint32_t i = j->first; i < j->first + j->n; i++) {
		const uint8_t *slot = sel_pool_slot_addr(p->pc, l->page_slots[i]);
		if (XXH3_64bits(slot, lay->slot_bytes) != l->page_cksum[i])
			return eos_fail(SEL_ECORRUPT,
					"pool claim %" PRIu64 ": page %u (arena slot %u) fails "
					"its checksum",
					l->id, i, l->page_slots[i]);
		uint32_t n = 0;
		for (uint32_t r = 0; r < g->ranks; r++)
			for (uint32_t k = 0; k < g->rank[r].n_planes; k++) {
				const sel_plane *pl = &g->rank[r].pages[k];
				if (n == 64) {
					(void)sel_host_copy_run(c, n, kind);
					n = 0;
				}
				c[n++] = (struct sel_copy){
					.dst = pl->address +
					       (uint64_t)j->dst[i - j->dst_skip] * pl->unit_bytes,
					.src = (uint64_t)(uintptr_t)slot + lay->share_off[r] +
					       lay->plane_off[r][k],
					.len = pl->unit_bytes};
				j->bytes += pl->unit_bytes;
			}
		(void)sel_host_copy_run(c, n, kind);
	}
	if (!j->row)
		return 0;
	int rc = sel_pool_lease_verify_part(p->pc, l, 0, 0, true);
	if (rc)
		return rc;
	for (uint32_t r = 0; r < g->ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		uint64_t row = rg->row.address + (uint64_t)j->state_slot * rg->row.unit_bytes;
		for (uint32_t k = 0; k < lay->row_slots && k < l->n_row_slots; k++) {
			uint64_t off, len;
			sel_slot_layout_row_piece(lay, r, k, &off, &len);
			if (len == 0)
				break;
			struct sel_copy rc1 = {.dst = row + (uint64_t)k * lay->share[r],
					       .src = (uint64_t)(uintptr_t)sel_pool_slot_addr(
							      p->pc, l->row_slots[k]) +
						      lay->share_off[r],
					       .len = len};
			(void)sel_host_copy_run(&rc1, 1, SEL_HOST_COPY_MEMCPY);
			j->bytes += len;
		}
	}
	return 0;
}

int sp_head_sums(const struct sel_pooled *p, struct sp_hjob *j)
{
	const struct sel_pool_lease *l = j->lease;
	int rc = sel_pool_lease_verify_part(p->pc, l, j->first, j->n, false);
	for (uint32_t i = 0; i < j->n && rc == 0; i++)
		rc = sel_slot_page_digest_padded(
			p->g, &p->lay, sel_pool_slot_addr(p->pc, l->page_slots[j->first + i]),
			&j->sums[i]);
	return rc;
}
