/*
 * store_memory.c - the memory store: published GPU checkpoints copied into
 * host slots and restored from them, byte-exact (design 2.4 "MemoryStore";
 * 2.2 store interface; 2.3 index and tree eviction; 2.5 slabs, transfers
 * and TP packing; 2.5 expiry; 2.10 policy; 2.12 invariants; 2.15 outcomes
 * and retention metrics).
 *
 * DESIGN
 *
 * The store is a struct sel_core (store_common.h: the index, the slot pool's
 * numbers, one record per node, the counters, the transfer set, the
 * policy used here for the memory tier's measured rate) plus its slots and
 * jobs.  The skeleton does the put prologue, the insert and its undo, the
 * lookup, the fetch check and failed-record removal; this file does the
 * slots, the copy-out and its completion; store_memory_fetch.c the
 * restores; store_memory_view.c the calls of the composite.  Everything is
 * driven from the model worker thread; nothing here locks or waits.
 *
 * A record is one index node plus a struct mrec at recs[node id]: the slot
 * ids holding its tail pages (page_slots first) and, after them, the slots
 * of its row.  A page record fills one slot; a row spreads over row_slots
 * slots (slab.h).  After a TP>1 copy-out the transfer thread compares the
 * ranks' bytes and packs what is identical in place (transfer.h): share j
 * then lives in slot slots[j / ranks] at rank (j % ranks)'s offset, so the
 * record keeps the first ceil(n / ranks) of its page slots (and of its row
 * slots) and the rest go back to the pool.  Pages and row decide
 * independently.
 *
 * put:  dedupe (READY -> PRESENT, in flight -> SKIPPED), insert the node
 *       PENDING under its offered parent (absent parent: a root holding the
 *       whole chain), pin it, evict by the tree policy until tail + row slots
 *       fit the warm class (no eviction at all when free warm slots plus
 *       every unpinned record's could not hold it: a refusal empties
 *       nothing), take the slots and submit one OUT job.  The
 *       calling thread does O(tail) work: it copies page ids and slot ids
 *       into the job, nothing else; no payload byte is touched and nothing
 *       waits.  Any refusal after the insert undoes it (the node and its
 *       slots go; evictions already made stay made).
 * poll: drains job completions.  OUT success applies packing, commits the
 *       node (which may drop its parent's row through ops->drop_row) and
 *       unpins it: SEL_EV_STORED.  OUT failure frees the slots and removes
 *       the node: SEL_EV_STORE_FAILED.  A failed node that already has
 *       children cannot be removed; it stays PENDING with no slots (flag
 *       MS_FAILED), so no lookup chain runs through it, until eviction takes
 *       it, a new put of its key fills it again, or its last child's failed
 *       copy removes the child and then it (sel_core_remove_failed).  IN completions update the
 *       memory tier's estimates (fixed cost, bandwidth: policy.c) and
 *       byte counters.
 * lookup: sel_index_lookup; only READY nodes with rows qualify, so every
 *       hit is resident.
 * fetch: re-walks the chain, pins every node on it and submits IN jobs: one
 *       per run of nodes sharing a page representation (a packed run also
 *       breaks after a node whose used pages are not a multiple of ranks,
 *       because packed shares are addressed from the run's first page).  The
 *       row rides on the last job.  A full channel before the first job is
 *       -EAGAIN with nothing pinned; a full channel later keeps the fetch on
 *       an internal FIFO and poll resubmits the rest.  One event per ticket,
 *       after every job of the ticket completed.
 *
 * expiry (design 2.5; cfg->max_age_ns): the index stamps last use on
 *       publication, PRESENT, touch and fetch, for the record and its
 *       ancestors.  At most once a minute of the store's clock, poll runs
 *       the index's expiry walk (sel_index_expire): expired ready leaves no
 *       job pins are dropped outright (counted expired, not evicted), with
 *       page-only ancestors they leave childless; a pinned record keeps its
 *       slots until its job ends.  In a composite the memory store does not
 *       sweep: the disk index is the catalogue and drops the copy.
 *
 * Every job is one malloc'd block owning everything the transfer threads
 * read (job descriptor, page ids, slot ids), so records can change or go
 * while the block lives.  If close cannot drain the copy threads
 * (SEL_ESTOPPED), destroy leaks the pool, the transfer set, the layout and
 * every outstanding job block -- a detached copy thread may still write into
 * them -- and keeps them reachable from a process-wide list.  put and fetch
 * after close are refused (SEL_SKIPPED / SEL_ESTOPPED).
 *
 * Retry reasons: a put whose slots cannot be found after eviction is
 * SEL_RETRY_INFLIGHT when free warm slots plus the slots of records pinned
 * by this store's jobs would hold it (progress frees them), else
 * SEL_RETRY_SLABS; a full channel is SEL_RETRY_QUEUE.  A record larger than
 * the warm class can ever hold is SEL_OVERSIZE.  The slots a refused put
 * needed are kept for the composite (sel_memory_store_refused_need), whose
 * maintenance writes dirty records until that many could be evicted.
 *
 * Progress (selene.h SEL_EV_PROGRESS): after a refused put, a poll that
 *   released capacity without a STORED or FETCHED event -- a failed copy-out
 *   freed its slots, a failed fetch dropped its pins, expiry removed records
 *   -- ends with one SEL_EV_PROGRESS (or the next poll does, when this one's
 *   events filled the caller's array).  Releases made before the refusal do
 *   not count: the refused put saw them.
 *
 * A restore that starts inside a packed record (the GPU already holds a
 * prefix ending at a page that is not a multiple of ranks) sets the IN job's
 * first_share to that page's share index within its slot.
 *
 * Copy backend, layout and slots come from a struct sel_store_pool
 * (store_pool.c): cfg->copy_backend (tests), else memcpy for host planes,
 * else the CUDA driver (rank r on cfg->cuda_devices[r] or device r) with
 * the pool registered through it; a configured GPU is never replaced by
 * memcpy.  A standalone store owns its pool; in a composite the composite
 * lends it one pool of warm and intake slots shared with the disk store's
 * staging (sel_memory_store_open_shared) and uses the calls of
 * store_memory.h to pin dirty records, read records into warm slots and
 * remove copies the disk tier lost.  A standalone store on the CUDA
 * backend at TP>1 gets a split pool instead (design 2.5; store_pool.c,
 * cfg->split_pool): the same slot numbers, each rank's share in its own
 * pinned part, and records that stay per-rank -- its OUT jobs never ask for
 * compare, since no CPU code may read a split slot.
 *
 * The store's startup warning (intake shrunk for host headroom, design 1)
 * is read with sel_store_warning().
 *
 * INVARIANTS (verified by sel_memory_store_check)
 *
 *   1. Every slot in use belongs to exactly one live record; every live
 *      index node has a live record and vice versa.
 *   2. A record holds page slots = tail (or ceil(tail / ranks) packed), and
 *      row slots = row_slots (or ceil(row_slots / ranks) packed) while the
 *      node has its row; a MS_FAILED record holds none.
 *   3. A record with an OUT job in flight is PENDING and pinned by it; a
 *      fetch in flight pins every node of its chain (store pins mypins <=
 *      index pins).  No slot of a pinned record is freed except by packing
 *      at its own OUT completion.
 *   4. slots_pinned equals the slots held by records with mypins > 0;
 *      slots_held equals the slots held by all records (the pool's in-use
 *      count when the store owns it).
 *   5. inflight_out / inflight_in count the OUT jobs and fetches not yet
 *      reported; each fetch produces exactly one event, after all its jobs
 *      completed.
 *   6. The index check and the slab check pass.
 */
#include "store_memory_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "slab.h"
#include "transfer.h"

#define POLL_BATCH 32

/* The memory store's own entries; the skeleton's are in the tables. */
static sel_outcome put_inner(struct sel_core *c, const sel_published *cp,
			     const struct sel_put_plan *p, sel_retry_reason *why);
static void cb_drop_row(struct sel_core *c, sel_node_id id);
static void cb_remove(struct sel_core *c, sel_node_id id);
static int ms_poll(sel_store *s, sel_event *ev, size_t cap);
static void ms_stats(sel_store *s, sel_stats *out);
static int ms_wait_fd(sel_store *s);
static int ms_close(sel_store *s, uint64_t deadline_ns);
static void ms_destroy(sel_store *s);
static void ms_describe(sel_store *s, sel_store_info *out);

static const struct sel_store_ops ms_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "memory",
	.lookup = sel_core_lookup,
	.put = sel_core_put,
	.fetch = ms_fetch,
	.poll = ms_poll,
	.touch = sel_core_touch,
	.stats = ms_stats,
	.wait_fd = ms_wait_fd,
	.close = ms_close,
	.destroy = ms_destroy,
	.describe = ms_describe,
	.page_digests = sel_memory_store_page_digests, /* page_digest.c (issue 18) */
	.drop = sel_core_drop,
	.flush = sel_core_flush_op,
};

static const struct sel_core_ops ms_core_ops =
	SEL_CORE_OPS(put_inner, ms_pin, ms_unpin, sel_memory_store_check, cb_drop_row, cb_remove);


struct mem_store *sel_ms_of(sel_store *s)
{
	return (struct mem_store *)sel_store_checked(s, &ms_ops);
}

/* Free `n` slots at r->slots[from..] of a record, keeping the accounting
 * of pinned slots. */
static void free_slots(struct mem_store *ms, struct mrec *r, uint32_t from, uint32_t n)
{
	if (n == 0)
		return;
	/* A refusal is a bug here; the pool keeps the slots (never handing one
	 * out twice) and sel_slab_check() fails from then on. */
	(void)sel_slab_free(ms->pool, r->slots + from, n);
	ms->slots_held -= n;
	if (r->h.mypins)
		ms->slots_pinned -= n;
}

/* ---- Index callbacks ------------------------------------------------------ */

static void cb_drop_row(struct sel_core *c, sel_node_id id)
{
	struct mem_store *ms = (struct mem_store *)c;
	struct mrec *r = ms_rec(ms, id);
	free_slots(ms, r, r->n_page_slots, r->n_row_slots);
	r->n_row_slots = 0;
	r->row_packed = false;
}

static void cb_remove(struct sel_core *c, sel_node_id id)
{
	struct mem_store *ms = (struct mem_store *)c;
	struct mrec *r = ms_rec(ms, id);
	free_slots(ms, r, 0, rec_slots(r));
	free(r->slots);
	r->slots = NULL;
}

/* ---- Pins and room ---------------------------------------------------------- */

void ms_pin(struct sel_core *c, sel_node_id id)
{
	struct mem_store *ms = (struct mem_store *)c;
	struct mrec *r = ms_rec(ms, id);
	if (r->h.mypins++ == 0)
		ms->slots_pinned += rec_slots(r);
	sel_index_pin(ms->c.ix, id);
}

void ms_unpin(struct sel_core *c, sel_node_id id)
{
	struct mem_store *ms = (struct mem_store *)c;
	struct mrec *r = ms_rec(ms, id);
	if (--r->h.mypins == 0)
		ms->slots_pinned -= rec_slots(r);
	sel_index_unpin(ms->c.ix, id);
}

uint64_t ms_free_warm(const struct mem_store *ms)
{
	uint64_t f = sel_slab_free_count(ms->pool);
	return f > ms->c.intake ? f - ms->c.intake : 0;
}

static bool warm_fits(struct sel_core *c, uint64_t n)
{
	return sel_slab_can_alloc(((struct mem_store *)c)->pool, (uint32_t)n, SEL_SLAB_WARM);
}

int ms_make_room(struct mem_store *ms, uint32_t n)
{
	return sel_core_evict_until(&ms->c, warm_fits, n) ? 0 : -ENOSPC;
}

/* The put's path, read only (the warm pass, sel_core_keep_warm): the free
 * slots a put of the last one's size takes next, and the least recently
 * used record with its slot ids, where the put's evictions look first. */
static void ms_warm(struct sel_core *c)
{
	struct mem_store *ms = (struct mem_store *)c;
	uint32_t acc = sel_slab_warm(ms->pool, ms->warm_need);
	sel_node_id id = sel_index_next_lru(c->ix, SEL_NODE_NONE);
	if (id != SEL_NODE_NONE) {
		const struct mrec *r = ms_rec(ms, id);
		uint32_t n = r->slots ? rec_slots(r) : 0;
		for (uint32_t i = 0; i < n; i += 16) /* one read per cache line */
			acc += r->slots[i];
	}
	__asm__ volatile("" : : "r"(acc));
}

/* ---- put ------------------------------------------------------------------ */

/* The copy-out job of a put: one block of the descriptor, the tail's page
 * ids and the slot ids, filled but for the slots. */
static struct mjob *out_job(struct mem_store *ms, const sel_published *cp,
			    const struct sel_put_plan *p, uint32_t need)
{
	size_t jsz = sizeof(struct mjob) + ((size_t)p->tail + need) * sizeof(uint32_t);
	struct mjob *j = calloc(1, jsz);
	if (!j)
		return NULL;
	uint32_t *jpages = (uint32_t *)(j + 1);
	if (p->tail)
		memcpy(jpages, cp->pages + (cp->n_pages - p->tail),
		       (size_t)p->tail * sizeof(uint32_t));
	j->kind = JOB_OUT;
	j->checkpoint = cp->checkpoint;
	j->key = cp->key;
	j->bytes = sel_core_record_bytes(&ms->c, p->tail, p->row);
	j->x.dir = SEL_COPY_OUT;
	j->x.n_pages = p->tail;
	j->x.pages = jpages;
	j->x.page_slots = jpages + p->tail;
	j->x.row = p->row;
	j->x.state_slot = cp->state_slot;
	j->x.row_slots = jpages + p->tail + p->tail;
	j->x.compare = ms->c.ranks > 1 && !ms->c.sp->split; /* split slots are not CPU-readable */
	return j;
}

/* Warm slots for need, evicting by the tree policy: 0, or SEL_RETRY's
 * reason.  Free warm slots plus every unpinned record's cannot hold it:
 * evicting would only empty memory for a refusal (under backpressure, a
 * composite whose dirty records fill memory refuses often). */
static sel_retry_reason take_slots(struct mem_store *ms, const sel_published *cp,
				   const struct mrec *r, uint32_t need, uint32_t *slots)
{
	bool hopeless = ms_free_warm(ms) + (ms->slots_held - ms->slots_pinned) < need;
	if (hopeless || ms_make_room(ms, need) != 0) {
		uint64_t avail = ms_free_warm(ms);
		eos_fail(-ENOSPC,
			 "memory store: checkpoint %" PRIu64 " needs %" PRIu32 " slots; %" PRIu64
			 " free, %" PRIu64 " held by pinned records",
			 cp->checkpoint, need, avail, ms->slots_pinned - rec_slots(r));
		return avail + ms->slots_pinned - rec_slots(r) >= need ? SEL_RETRY_INFLIGHT
								       : SEL_RETRY_SLABS;
	}
	if (sel_slab_alloc(ms->pool, need, SEL_SLAB_WARM, slots) != 0)
		return SEL_RETRY_SLABS;
	return SEL_RETRY_NONE;
}

static sel_outcome put_inner(struct sel_core *c, const sel_published *cp,
			     const struct sel_put_plan *p, sel_retry_reason *why)
{
	struct mem_store *ms = (struct mem_store *)c;
	sel_outcome out = SEL_QUEUED;
	uint32_t nrow = p->row ? ms->c.row_slots : 0;
	uint64_t need64 = (uint64_t)p->tail + nrow;
	if (need64 > ms->c.warm) {
		if (ms->c.own_sp) /* a composite streams it to disk instead */
			ms->c.st.tier[SEL_TIER_MEMORY].dropped_oversize++;
		eos_fail(SEL_EOVERSIZE,
			 "memory store: checkpoint %" PRIu64 " needs %" PRIu64
			 " slots, the warm pool has %" PRIu64,
			 cp->checkpoint, need64, ms->c.warm);
		return SEL_OVERSIZE;
	}
	uint32_t need = (uint32_t)need64;

	/* The job block and the record's slot array, before touching the index. */
	struct mjob *j = out_job(ms, cp, p, need);
	uint32_t *slots = malloc((need ? need : 1) * sizeof(uint32_t));
	sel_node_id id = p->id;
	int rc = j && slots ? 0
			    : eos_fail(-ENOMEM,
				       "memory store: out of memory for a job of %" PRIu32 " pages",
				       p->tail);
	if (rc == 0 && p->fresh)
		rc = sel_core_insert(&ms->c, &cp->key, p->pid == SEL_NODE_NONE ? NULL : &cp->parent,
				     &cp->bucket, p->tail, true, &id);
	if (rc) {
		free(j);
		free(slots);
		return SEL_SKIPPED;
	}
	struct mrec *r = ms_rec(ms, id);
	ms_pin(&ms->c, id);

	sel_retry_reason reason = take_slots(ms, cp, r, need, slots);
	if (reason != SEL_RETRY_NONE) {
		*why = reason;
		out = SEL_RETRY;
		goto undo;
	}
	/* The record owns the slots from here; pinned, so count them. */
	free(r->slots);
	r->slots = slots;
	slots = NULL;
	r->n_page_slots = p->tail;
	r->n_row_slots = nrow;
	r->pages_packed = r->row_packed = false;
	ms->slots_pinned += need;
	ms->slots_held += need;
	memcpy((uint32_t *)(j + 1) + p->tail, r->slots, (size_t)need * sizeof(uint32_t));
	j->node = id;
	j->x.id = ++ms->c.job_seq;

	rc = sel_xfer_submit(ms->c.xfer, &j->x);
	if (rc != 0) {
		if (rc == -EAGAIN) {
			*why = SEL_RETRY_QUEUE;
			out = SEL_RETRY;
		} else {
			if (rc == SEL_ESTOPPED)
				ms->c.stopped = true;
			out = SEL_SKIPPED;
		}
		eos_fail(rc, "memory store: checkpoint %" PRIu64 ": transfer submission: %s",
			 cp->checkpoint, sel_strerror(rc));
		/* Give the slots back; the record is empty again. */
		free_slots(ms, r, 0, rec_slots(r));
		r->n_page_slots = r->n_row_slots = 0;
		goto undo;
	}
	sel_index_get(ms->c.ix, id)->flags &= (uint16_t)~MS_FAILED;
	r->out = j;
	outs_push(&ms->outs, j);
	ms->c.st.inflight_out++;
	ms->c.warm_alloc = sizeof(struct mjob) + ((size_t)p->tail + need) * sizeof(uint32_t);
	ms->warm_need = need;
	debug_check(ms);
	return SEL_QUEUED;

undo:
	if (out == SEL_RETRY)
		ms->refused_need = need;
	ms_unpin(&ms->c, id);
	if (p->fresh)
		sel_core_discard(&ms->c, id, &cp->key);
	free(j);
	free(slots);
	debug_check(ms);
	return out;
}

/* ---- poll ----------------------------------------------------------------- */

/* TP > 1: the transfer thread compared the ranks' bytes and packed what
 * was identical in place; give back the slots packing freed.  Returns
 * whether anything was packed. */
static bool apply_packing(struct mem_store *ms, struct mrec *r, const struct mjob *j)
{
	bool packed = false;
	if (ms->c.ranks > 1 && j->x.pages_replicated && r->n_page_slots) {
		uint32_t keep = sel_div_up(r->n_page_slots, ms->c.ranks);
		free_slots(ms, r, keep, r->n_page_slots - keep);
		memmove(r->slots + keep, r->slots + r->n_page_slots,
			(size_t)r->n_row_slots * sizeof(uint32_t));
		r->n_page_slots = keep;
		r->pages_packed = true;
		packed = true;
	}
	if (ms->c.ranks > 1 && j->x.row_replicated && r->n_row_slots) {
		uint32_t keep = sel_div_up(r->n_row_slots, ms->c.ranks);
		free_slots(ms, r, r->n_page_slots + keep, r->n_row_slots - keep);
		r->n_row_slots = keep;
		r->row_packed = true;
		packed = true;
	}
	return packed;
}

static int out_done(struct mem_store *ms, struct mjob *j, sel_event *ev)
{
	sel_node_id id = j->node;
	struct mrec *r = ms_rec(ms, id);
	memset(ev, 0, sizeof(*ev));
	ev->checkpoint = j->checkpoint;
	ev->key = j->key;
	ev->tier = SEL_TIER_MEMORY;
	ev->bytes = j->bytes;
	ev->duration_ns = j->x.done_ns > j->x.submit_ns ? j->x.done_ns - j->x.submit_ns : 0;
	r->out = NULL;
	outs_del(&ms->outs, j);
	ms->c.st.inflight_out--;

	if (j->x.status == 0) {
		sel_core_count_stored(&ms->c, j->bytes, apply_packing(ms, r, j));
		sel_index_commit(ms->c.ix, id);
		ms_unpin(&ms->c, id);
		ev->type = SEL_EV_STORED;
		ev->outcome = SEL_QUEUED;
	} else {
		free_slots(ms, r, 0, rec_slots(r));
		r->n_page_slots = r->n_row_slots = 0;
		r->pages_packed = r->row_packed = false;
		sel_index_get(ms->c.ix, id)->flags |= MS_FAILED;
		ms_unpin(&ms->c, id);
		sel_core_remove_failed(&ms->c, id, &j->key);
		ms->c.st.store_failures++;
		ms->c.pg.released = true; /* its slots are free again */
		ev->type = SEL_EV_STORE_FAILED;
		ev->outcome = SEL_SKIPPED;
		ev->error = j->x.status;
	}
	free(j);
	return 1;
}

/* Expiry may drop a ready record no job holds (pinned ones are passed
 * over by the index). */
static bool ms_droppable(void *ctx, const sel_index *ix, sel_node_id id)
{
	(void)ctx;
	const sel_index_node *n = sel_index_cget(ix, id);
	return n->state == SEL_NODE_READY && !(n->flags & MS_FAILED);
}

/* The end of the chain (sel_core_cascade_set, design 2.5 and 2.15): with a
 * level below, maintenance retires the coldest records to it while free
 * slots (warm and intake) + clean slots fall below 2 x intake.  The last
 * local tier has no clean records (none has a copy below it: an accepted
 * one leaves at once), but those held for the next level are as good as
 * free, as a composite counts its writes in flight; so the write-ahead is
 * bounded by the floor itself: at most 2 x intake slots plus one record.
 * A warm tier smaller than 4 x intake keeps a quarter of its warm slots
 * free instead (the floor would otherwise offer every record as it lands:
 * write-through, which the design's bound on writing ahead of need
 * forbids; docs/architecture.md). */
static uint64_t ms_cascade_floor(const struct sel_core *c)
{
	uint64_t q = c->warm / 4;
	return c->intake + (c->intake < q ? c->intake : q);
}

static bool ms_cascade_low(struct sel_core *c, uint64_t held)
{
	return sel_slab_free_count(((struct mem_store *)c)->pool) + held < ms_cascade_floor(c);
}

static uint64_t ms_cascade_units(struct sel_core *c, sel_node_id id)
{
	return rec_slots(ms_rec((struct mem_store *)c, id));
}

static int ms_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct mem_store *ms = sel_ms_of(s);
	size_t n = 0;
	bool progress = true;

	sel_core_keep_warm(&ms->c);
	sel_core_expire(&ms->c, ms_droppable);

	while (n < cap && progress) {
		/* Fetches that finished without a completion (transfer set
		 * stopped while part of them was still unsubmitted). */
		struct mfetch *f;
		while (n < cap && (f = fin_pop(&ms->fin)))
			ms_fetch_event(ms, f, &ev[n++]);
		if (n == cap)
			break;
		struct sel_xfer_job *done[POLL_BATCH];
		size_t want = cap - n < POLL_BATCH ? cap - n : POLL_BATCH;
		int k = sel_xfer_poll(ms->c.xfer, done, want);
		for (int i = 0; i < k; i++) {
			struct mjob *j =
				(struct mjob *)((char *)done[i] - offsetof(struct mjob, x));
			n += j->kind == JOB_OUT ? out_done(ms, j, &ev[n])
						: ms_in_done(ms, j, &ev[n]);
		}
		progress = k > 0;
		/* Completions made channel room. */
		ms_resubmit_pending(ms);
		progress |= ms->fin.head != NULL;
	}
	if (cap == 0)
		ms_resubmit_pending(ms);
	(void)sel_core_cascade_run(&ms->c, ms_cascade_low, ms_cascade_units);
	sel_core_flush(&ms->c); /* this pass's submissions, put's and fetch's included */
	if (n < cap && sel_progress_due(&ms->c.pg)) {
		memset(&ev[n], 0, sizeof(ev[n]));
		ev[n++].type = SEL_EV_PROGRESS;
	}
	debug_check(ms);
	return (int)n;
}

/* ---- the rest of the interface ----------------------------------------------- */

static void ms_stats(sel_store *s, sel_stats *out)
{
	struct mem_store *ms = sel_ms_of(s);
	sel_core_stats(&ms->c, out);
	sel_tier_stats *t = &out->tier[SEL_TIER_MEMORY];
	t->bytes_used = out->slots_in_use * ms->c.slot_bytes;
	t->bytes_limit = ms->c.warm * ms->c.slot_bytes;
}

static void ms_describe(sel_store *s, sel_store_info *out)
{
	struct mem_store *ms = sel_ms_of(s);
	if (ms->c.own_sp && ms->c.sp->warning[0])
		out->warning = ms->c.sp->warning;
}

static int ms_wait_fd(sel_store *s)
{
	struct mem_store *ms = sel_ms_of(s);
	return ms->c.xfer ? sel_xfer_fd(ms->c.xfer) : -1;
}

static int ms_close(sel_store *s, uint64_t deadline_ns)
{
	struct mem_store *ms = sel_ms_of(s);
	if (ms->c.closed)
		return ms->c.close_rc;
	char b[32];
	if (ms->c.xfer && sel_xfer_close(ms->c.xfer, deadline_ns) != 0)
		return sel_core_close_end(
			&ms->c,
			eos_fail(SEL_ESTOPPED,
				 "memory store: copies did not drain by the deadline;"
				 " the slot pool (%s) is leaked and the planes must stay mapped",
				 eos_format_size(ms->c.slot_bytes * (ms->c.warm + ms->c.intake), b,
						 sizeof(b))));
	return sel_core_close_end(&ms->c, 0);
}

static void ms_destroy(sel_store *s)
{
	struct mem_store *ms = sel_ms_of(s);
	if (!ms)
		return;
	if (sel_core_destroy_begin(s)) {
		/* A detached copy thread may still use the jobs. */
		sel_leak((void *[]){ms->outs.head, ms->fetches.head}, 2);
	} else {
		struct mjob *j;
		struct mfetch *f;
		while ((j = outs_pop(&ms->outs)))
			free(j);
		while ((f = fetches_pop(&ms->fetches)))
			free(f);
	}
	for (uint32_t i = 0; i < ms->c.nrecs; i++)
		free(ms_rec(ms, i)->slots);
	sel_core_destroy_end(&ms->c);
	free(ms);
}

/* ---- open ----------------------------------------------------------------- */

static int open_on(const sel_store_config *cfg, struct sel_store_pool *sp, bool own,
		   sel_store **out)
{
	struct mem_store *ms = sel_core_alloc(sizeof(*ms), sp, own, "memory store");
	int rc;
	if (!ms)
		return -ENOMEM;
	ms->pool = sp->pool;
	ms->c.closed = true; /* until open completes: nothing was submitted */
	rc = sel_core_init(&ms->c, &ms_ops, &ms_core_ops, "memory store", SEL_TIER_MEMORY,
			   sizeof(struct mrec), cfg, sp, own);
	/* The end of the local chain only when memory is the last tier; in a
	 * composite the record stays on disk. */
	ms->c.end_of_chain = own;
	ms->c.warm_more = ms_warm;
	if (rc == 0 && sp->warm == 0)
		rc = eos_fail(-EINVAL, "memory store: the pool has no warm slots");
	if (rc == 0)
		rc = sel_core_xfer(&ms->c, cfg);
	if (rc) {
		ms_destroy(&ms->c.base); /* frees or keeps sp as own says */
		return rc;
	}
	ms->c.closed = false;
	*out = &ms->c.base;
	return 0;
}

int sel_memory_store_open(const sel_store_config *cfg, sel_store **out)
{
	struct sel_store_pool *sp;
	*out = NULL;
	if (!cfg || !cfg->geometry)
		return eos_fail(-EINVAL, "memory store: no geometry");
	if (cfg->memory_bytes == 0)
		return eos_fail(-EINVAL, "memory store: warm memory budget is 0");
	int rc = sel_store_pool_open_memory(cfg, cfg->memory_bytes, "memory store", &sp);
	if (rc)
		return rc;
	return open_on(cfg, sp, true, out);
}

int sel_memory_store_open_shared(const sel_store_config *cfg, struct sel_store_pool *sp,
				 sel_store **out)
{
	*out = NULL;
	if (!cfg || !cfg->geometry || !sp)
		return eos_fail(-EINVAL, "memory store: no geometry or pool");
	return open_on(cfg, sp, false, out);
}

/* ---- checks and introspection ---------------------------------------------- */

struct check_ctx {
	uint8_t *owned;
	uint64_t total, used, pinned;
};

/* Invariants 1-3 for one node. */
static int check_rec(struct sel_core *c, sel_node_id id, const sel_index_node *n, void *arg)
{
	struct mem_store *ms = (struct mem_store *)c;
	struct check_ctx *x = arg;
	const struct mrec *r = ms_rec(ms, id);
	bool failed = n->flags & MS_FAILED;
	uint32_t want_pages = failed            ? 0
			      : r->pages_packed ? sel_div_up(n->tail_pages, c->ranks)
						: n->tail_pages;
	uint32_t want_row = failed || !(n->flags & SEL_NODE_HAS_ROW) ? 0
			    : r->row_packed ? sel_div_up(c->row_slots, c->ranks)
					    : c->row_slots;
	if (r->n_page_slots != want_pages || r->n_row_slots != want_row)
		return eos_fail(SEL_ECORRUPT,
				"memory store: node %" PRIu32 " holds %" PRIu32 "+%" PRIu32
				" slots, expected %" PRIu32 "+%" PRIu32,
				id, r->n_page_slots, r->n_row_slots, want_pages, want_row);
	for (uint32_t i = 0; i < rec_slots(r); i++) {
		uint32_t sl = r->slots[i];
		if (sl >= x->total || x->owned[sl])
			return eos_fail(SEL_ECORRUPT,
					"memory store: slot %" PRIu32 " of node %" PRIu32 " is %s",
					sl, id, sl >= x->total ? "out of range" : "owned twice");
		x->owned[sl] = 1;
		x->used++;
	}
	if (r->h.mypins)
		x->pinned += rec_slots(r);
	if (r->out && (n->state != SEL_NODE_PENDING || !r->h.mypins || r->out->node != id))
		return eos_fail(SEL_ECORRUPT,
				"memory store: node %" PRIu32 " has a copy-out in flight"
				" but is not a pinned pending node",
				id);
	return 0;
}

/* Invariants 3 and 5: the jobs and fetches in flight. */
static int check_jobs(struct mem_store *ms)
{
	uint64_t outs = 0, fetches = 0;
	for (const struct mjob *j = ms->outs.head; j; j = j->next, outs++)
		if (!sel_core_live(&ms->c, j->node) || ms_rec(ms, j->node)->out != j)
			return eos_fail(SEL_ECORRUPT,
					"memory store: copy-out job of node %" PRIu32
					" not on its record",
					j->node);
	for (const struct mfetch *f = ms->fetches.head; f; f = f->next, fetches++)
		for (uint32_t i = 0; i < f->n_nodes; i++)
			if (!sel_core_live(&ms->c, f->nodes[i]) ||
			    !ms_rec(ms, f->nodes[i])->h.mypins)
				return eos_fail(SEL_ECORRUPT,
						"memory store: fetch of ticket %" PRIu64
						" reads unpinned node %" PRIu32,
						f->ticket, f->nodes[i]);
	return sel_core_check_inflight(&ms->c, outs, fetches, "jobs");
}

int sel_memory_store_check(sel_store *s)
{
	struct mem_store *ms = sel_ms_of(s);
	int rc = sel_slab_check(ms->pool);
	if (rc)
		return rc;
	struct check_ctx x = {.total = sel_slab_total(ms->pool)};
	if (!(x.owned = calloc(x.total ? x.total : 1, 1)))
		return eos_fail(-ENOMEM, "memory store check: out of memory");
	rc = sel_core_check(&ms->c, check_rec, &x);
	free(x.owned);
	if (rc)
		return rc;
	if (x.used != ms->slots_held || (ms->c.own_sp && x.used != sel_slab_in_use(ms->pool)))
		return eos_fail(SEL_ECORRUPT,
				"memory store: records hold %" PRIu64 " slots, counted %" PRIu64
				", the pool has %" PRIu64 " in use",
				x.used, ms->slots_held, sel_slab_in_use(ms->pool));
	if (x.pinned != ms->slots_pinned)
		return eos_fail(SEL_ECORRUPT,
				"memory store: pinned slots %" PRIu64 ", counted %" PRIu64,
				x.pinned, ms->slots_pinned);
	return check_jobs(ms);
}

int sel_memory_store_record(sel_store *s, const sel_key *key, struct sel_memory_record_info *out)
{
	struct mem_store *ms = sel_ms_of(s);
	struct sel_memory_view v;
	int rc = sel_memory_store_view(s, key, &v);
	if (rc)
		return rc;
	const sel_index_node *n = sel_core_node(&ms->c, sel_index_find(ms->c.ix, key));
	*out = (struct sel_memory_record_info){
		.ready = n->state == SEL_NODE_READY,
		.has_row = v.has_row,
		.failed = n->flags & MS_FAILED,
		.pages_packed = v.pages_packed,
		.row_packed = v.row_packed,
		.tail_pages = v.tail_pages,
		.page_slots = v.n_page_slots,
		.row_slots = v.n_row_slots,
		.pins = v.pins,
		.is_root = v.is_root,
	};
	return 0;
}

void sel_memory_store_slots(sel_store *s, uint64_t *slot_bytes, uint64_t *warm, uint64_t *intake,
			    uint32_t *row_slots)
{
	struct mem_store *ms = sel_ms_of(s);
	if (slot_bytes)
		*slot_bytes = ms->c.slot_bytes;
	if (warm)
		*warm = ms->c.warm;
	if (intake)
		*intake = ms->c.intake;
	if (row_slots)
		*row_slots = ms->c.row_slots;
}

const struct sel_store_pool *sel_memory_store_pool(sel_store *s) { return sel_ms_of(s)->c.sp; }
