/*
 * store_memory_fetch.c - the memory store's restores: a checked hit's chain
 * copied from its slots into the ticket's page ids and state slot (design
 * 2.4 MemoryStore "fetch copies resident slabs in"; 2.5 windows and TP
 * packing; 2.2 one event per ticket).
 *
 * DESIGN
 *
 * sel_core_fetch_check (store_common.c) re-walks the hit's chain and
 * refuses what the lookup did not verify.  The chain is then copied by IN
 * jobs: one per run of nodes sharing a page representation (per-rank or
 * packed; a packed run also breaks after a node whose used pages are not a
 * multiple of ranks, because packed shares are addressed from the run's
 * first page).  The endpoint's row rides on the last job.  A restore that
 * starts inside a packed record (the GPU already holds a prefix ending at
 * a page that is not a multiple of ranks) sets the job's first_share to
 * that page's share index within its slot.
 *
 * The fetch is one block (the jobs, the chain's node ids, the destination
 * ids, the slot ids), pins every node of the chain until its event, and is
 * on the store's live list.  A full channel before the first job is
 * -EAGAIN with nothing pinned; a full channel later keeps the fetch on the
 * pend FIFO and poll resubmits the rest.  If the transfer set stops with
 * jobs unsubmitted, those count as failed and the fetch, once its
 * submitted jobs completed, waits on the fin FIFO for its event.
 *
 * INVARIANTS
 *
 *   1. n_submitted <= n_jobs and n_done <= n_jobs; the event is made once,
 *      when n_done == n_jobs.
 *   2. A fetch is on pend only while n_submitted < n_jobs and the set has
 *      not stopped; on fin only once n_done == n_jobs without a last
 *      completion to deliver its event.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "store_memory_int.h"

/* The transfer set stopped: jobs never submitted count as failed. */
static void fetch_abandon_rest(struct mem_store *ms, struct mfetch *f, int rc)
{
	if (!f->status)
		f->status = rc;
	f->n_done += f->n_jobs - f->n_submitted;
	f->n_submitted = f->n_jobs;
	if (f->n_done == f->n_jobs)
		fin_push(&ms->fin, f);
}

/* Submit f's remaining jobs in order.  0 when all are submitted, -EAGAIN
 * when the channel filled, SEL_ESTOPPED (the rest abandoned). */
static int fetch_submit(struct mem_store *ms, struct mfetch *f)
{
	while (f->n_submitted < f->n_jobs) {
		int rc = sel_xfer_submit(ms->c.xfer, &f->jobs[f->n_submitted].x);
		if (rc == -EAGAIN)
			return rc;
		if (rc != 0) {
			if (rc == SEL_ESTOPPED)
				ms->c.stopped = true;
			if (f->n_submitted > 0)
				fetch_abandon_rest(ms, f, rc);
			return rc;
		}
		f->n_submitted++;
	}
	return 0;
}

static void fetch_release(struct mem_store *ms, struct mfetch *f)
{
	for (uint32_t i = 0; i < f->n_nodes; i++)
		ms_unpin(&ms->c, f->nodes[i]);
	fetches_del(&ms->fetches, f);
	free(f);
}

/* The runs of a chain: how its used pages split into IN jobs. */
struct run_walk {
	uint32_t i;         /* node index */
	uint32_t off, used; /* first used page of the node, pages used */
	uint32_t lead;      /* packed: shares before ours in the first slot */
	bool packed;
	bool new_job; /* this node starts a job */
};

/* Step to the next node of w that supplies pages: false at the end. */
static bool run_next(struct mem_store *ms, const struct sel_chain_walk *w, struct run_walk *r,
		     bool *started, bool *run_packed, uint32_t *prev_used)
{
	for (; r->i < w->n; r->i++) {
		const sel_index_node *n = sel_core_node(&ms->c, w->ids[r->i]);
		r->off = r->i == 0 ? w->skip : 0;
		r->used = n->tail_pages - r->off;
		if (r->used == 0)
			continue;
		r->packed = ms_rec(ms, w->ids[r->i])->pages_packed;
		r->lead = r->packed ? r->off % ms->c.ranks : 0;
		r->new_job = !*started || r->packed != *run_packed ||
			     (r->packed && *prev_used % ms->c.ranks);
		*started = true;
		*run_packed = r->packed;
		*prev_used = r->lead + r->used;
		return true;
	}
	return false;
}

/* Pass 1: the jobs and slot ids the chain needs. */
static void count_jobs(struct mem_store *ms, const struct sel_chain_walk *w, uint32_t *n_jobs,
		       uint32_t *n_slot_ids)
{
	struct run_walk r = {0};
	bool started = false, run_packed = false;
	uint32_t prev_used = 0;
	*n_jobs = 0;
	*n_slot_ids = 0;
	for (; run_next(ms, w, &r, &started, &run_packed, &prev_used); r.i++) {
		*n_jobs += r.new_job;
		*n_slot_ids += r.packed ? sel_div_up(r.lead + r.used, ms->c.ranks) : r.used;
	}
	if (*n_jobs == 0)
		*n_jobs = 1; /* the row alone */
	*n_slot_ids += ms_rec(ms, w->end)->n_row_slots;
}

static struct mjob *job_start(struct mfetch *f, uint32_t *nj, uint32_t *dst, uint32_t *sl)
{
	struct mjob *j = &f->jobs[(*nj)++];
	j->kind = JOB_IN;
	j->f = f;
	j->x.dir = SEL_COPY_IN;
	j->x.pages = dst;
	j->x.page_slots = sl;
	return j;
}

/* Pass 2: fill the jobs (dst: the destination ids, sl: room for the slot
 * ids).  Returns the job count. */
static uint32_t fill_jobs(struct mem_store *ms, struct mfetch *f, const struct sel_chain_walk *w,
			  uint32_t *dst, uint32_t *sl, uint32_t state_slot)
{
	struct run_walk r = {0};
	bool started = false, run_packed = false;
	uint32_t prev_used = 0, nj = 0, page_at = 0;
	struct mjob *j = NULL;
	for (; run_next(ms, w, &r, &started, &run_packed, &prev_used); r.i++) {
		const struct mrec *rec = ms_rec(ms, w->ids[r.i]);
		if (r.new_job || !j) { /* the first run always starts one */
			j = job_start(f, &nj, dst + page_at, sl);
			j->x.pages_packed = r.packed;
			j->x.first_share = r.lead; /* non-zero only for the first node */
		}
		uint32_t from = r.packed ? r.off / ms->c.ranks : r.off;
		uint32_t cnt = r.packed ? sel_div_up(r.lead + r.used, ms->c.ranks) : r.used;
		memcpy(sl, rec->slots + from, (size_t)cnt * sizeof(uint32_t));
		sl += cnt;
		j->x.n_pages += r.used;
		page_at += r.used;
	}
	if (!j)
		j = job_start(f, &nj, dst, sl);
	/* The endpoint's row rides on the last job. */
	const struct mrec *er = ms_rec(ms, w->end);
	memcpy(sl, er->slots + er->n_page_slots, (size_t)er->n_row_slots * sizeof(uint32_t));
	j->x.row = true;
	j->x.row_slots = sl;
	j->x.row_packed = er->row_packed;
	j->x.state_slot = state_slot;
	for (uint32_t i = 0; i < nj; i++)
		f->jobs[i].x.id = ++ms->c.job_seq;
	return nj;
}

int ms_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct mem_store *ms = sel_ms_of(s);
	struct sel_chain_walk w;
	int rc = sel_core_fetch_check(&ms->c, hit, in, NULL, NULL, &w);
	if (rc)
		return rc;
	uint32_t n_jobs, n_slot_ids;
	count_jobs(ms, &w, &n_jobs, &n_slot_ids);
	size_t sz = sizeof(struct mfetch) + (size_t)n_jobs * sizeof(struct mjob) +
		    (size_t)w.n * sizeof(sel_node_id) +
		    ((size_t)hit->pages + n_slot_ids) * sizeof(uint32_t);
	struct mfetch *f = calloc(1, sz);
	if (!f)
		return eos_fail(-ENOMEM,
				"memory store: out of memory for a fetch of %" PRIu32 " pages",
				hit->pages);
	f->jobs = (struct mjob *)(f + 1);
	f->nodes = (sel_node_id *)(f->jobs + n_jobs);
	uint32_t *dst = (uint32_t *)(f->nodes + w.n);
	memcpy(dst, in->pages, (size_t)in->n_pages * sizeof(uint32_t));
	memcpy(f->nodes, w.ids, w.n * sizeof(*w.ids));
	f->n_nodes = w.n;
	f->n_jobs = fill_jobs(ms, f, &w, dst, dst + hit->pages, in->state_slot);
	f->ticket = in->ticket;
	f->key = hit->key;
	f->resident = hit->resident;
	f->bytes = sel_core_record_bytes(&ms->c, hit->pages, true);
	f->pages = hit->pages;

	for (uint32_t i = 0; i < w.n; i++)
		ms_pin(&ms->c, f->nodes[i]);
	fetches_push(&ms->fetches, f);
	f->submit_ns = eos_now_ns();
	rc = fetch_submit(ms, f);
	if (rc != 0 && f->n_submitted == 0) {
		fetch_release(ms, f);
		debug_check(ms);
		if (rc == -EAGAIN)
			return eos_fail(-EAGAIN, "memory store: transfer queue full");
		return eos_fail(rc, "memory store: fetch submission: %s", sel_strerror(rc));
	}
	if (rc == -EAGAIN)
		pend_push(&ms->pend, f);
	sel_index_touch(ms->c.ix, w.end);
	ms->c.st.fetches++;
	ms->c.st.inflight_in++;
	debug_check(ms);
	return 0;
}

void ms_fetch_event(struct mem_store *ms, struct mfetch *f, sel_event *ev)
{
	uint64_t end = f->last_done_ns > f->submit_ns ? f->last_done_ns : eos_now_ns();
	memset(ev, 0, sizeof(*ev));
	ev->type = f->status ? SEL_EV_FETCH_FAILED : SEL_EV_FETCHED;
	ev->outcome = SEL_QUEUED;
	ev->error = f->status;
	ev->ticket = f->ticket;
	ev->key = f->key;
	ev->tier = SEL_TIER_MEMORY;
	ev->bytes = f->bytes;
	ev->duration_ns = end - f->submit_ns;
	sel_core_count_fetched(&ms->c, f->status, f->bytes, ev->duration_ns, f->pages,
			       f->key.consumed, f->resident);
	fetch_release(ms, f);
}

int ms_in_done(struct mem_store *ms, struct mjob *j, sel_event *ev)
{
	struct mfetch *f = j->f;
	f->n_done++;
	if (j->x.status && !f->status)
		f->status = j->x.status;
	if (j->x.done_ns > f->last_done_ns)
		f->last_done_ns = j->x.done_ns;
	if (f->n_done < f->n_jobs)
		return 0;
	ms_fetch_event(ms, f, ev);
	return 1;
}

void ms_resubmit_pending(struct mem_store *ms)
{
	struct mfetch *f;
	while ((f = ms->pend.head)) {
		if (fetch_submit(ms, f) == -EAGAIN)
			return;
		(void)pend_pop(&ms->pend);
	}
}
