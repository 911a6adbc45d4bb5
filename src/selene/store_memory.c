/*
 * store_memory.c - the memory store: published GPU checkpoints copied into
 * host slots and restored from them, byte-exact (design 2.4 "MemoryStore";
 * 2.2 store interface; 2.3 index and tree eviction; 2.5 slabs, transfers
 * and TP packing; 2.5 expiry; 2.10 policy; 2.12 invariants; 2.15 outcomes
 * and retention metrics).
 *
 * DESIGN
 *
 * The store owns an index (the checkpoint tree, index.c), a slab pool (warm
 * slots for retention plus the automatic intake reserve, slab.c), a slot
 * layout, a transfer set (per-rank copy threads, transfer.c) and a policy
 * (policy.c, used here for the memory tier's measured rate).  Everything is
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
 *       copy removes the child and then it.  IN completions update the
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
#include "store_memory.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "expiry.h"
#include "index.h"
#include "list.h"
#include "slab.h"
#include "store_common.h"
#include "store_pool.h"
#include "transfer.h"

#define MS_FAILED (1u << 8) /* node flag (store bits): copy-out failed, no slots */
#define POLL_BATCH 32

struct mfetch;

enum { JOB_OUT = 1, JOB_IN = 2 };

/* A job block: descriptor, then the arrays it points into. */
struct mjob {
	struct sel_xfer_job x;
	uint8_t kind;
	/* OUT */
	sel_node_id node;
	uint64_t checkpoint;
	uint64_t bytes;
	sel_key key;
	struct mjob *prev, *next; /* live OUT jobs (for destroy) */
	/* IN */
	struct mfetch *f;
};

struct mfetch {
	uint64_t ticket;
	sel_key key;
	uint64_t resident;           /* GPU-resident count the hit was for */
	uint64_t bytes;
	uint32_t pages;              /* pages restored (0: row only) */
	uint64_t submit_ns, last_done_ns;
	int status;
	uint32_t n_jobs, n_submitted, n_done;
	uint32_t n_nodes;
	sel_node_id *nodes;
	struct mjob *jobs;
	struct mfetch *prev, *next;  /* live fetches (for destroy) */
	struct mfetch *pend_next;    /* resubmission FIFO */
	struct mfetch *fin_next;     /* finished, event not yet delivered */
	bool pending, finished;
};

struct mjob_list {
	struct mjob *head, *tail;
	uint32_t n;
};
struct mfetch_list {
	struct mfetch *head, *tail;
	uint32_t n;
};
EOS_DLIST_DEFINE(outs, struct mjob_list, struct mjob)
EOS_DLIST_DEFINE(fetches, struct mfetch_list, struct mfetch)

struct mrec {
	uint32_t *slots;       /* page slots, then row slots */
	uint32_t n_page_slots; /* tail, or ceil(tail / ranks) packed; 0 failed */
	uint32_t n_row_slots;  /* row_slots, fewer packed, 0 without row */
	uint32_t mypins;       /* pins held by this store's jobs */
	bool live;
	bool pages_packed, row_packed;
	struct mjob *out;      /* OUT job in flight */
};

/* What a stopped store cannot free: a detached copy thread may use it. */
struct leaked {
	sel_xfer *xfer;
	struct mjob *outs;
	struct mfetch *fetches;
	struct leaked *next;
};
static pthread_mutex_t leaked_lock = PTHREAD_MUTEX_INITIALIZER;
static struct leaked *leaked_list; /* keeps leaked memory reachable */

struct mem_store {
	sel_store base;
	const sel_geometry *g;
	struct sel_store_pool *sp;   /* layout, backend, slots (shared in a composite) */
	bool own_sp;
	const struct sel_copy_backend *backend;
	sel_slot_layout *layout;
	sel_slab_pool *pool;
	sel_xfer *xfer;
	sel_index *ix;
	sel_policy *policy;

	uint32_t ranks, pt, row_slots;
	uint64_t slot_bytes, warm, intake;
	uint64_t page_bytes_all; /* unpadded bytes of one page, all ranks */
	uint64_t row_bytes_all;  /* unpadded bytes of one row, all ranks */
	uint64_t min_pages;      /* smallest page count over ranks */
	uint64_t min_rows;       /* smallest row count over ranks */

	struct mrec *recs;
	uint32_t nrecs;
	sel_index_chain chain;   /* lookup scratch, reused */
	sel_node_id *scratch;    /* fetch chain scratch, reused */
	uint32_t scratch_cap;
	uint64_t job_seq;
	uint64_t slots_pinned;
	uint64_t slots_held;     /* slots records hold (the pool may be shared) */

	struct mjob_list outs;      /* live OUT jobs */
	struct mfetch_list fetches; /* live fetches */
	struct mfetch *pend_head, *pend_tail;
	struct mfetch *fin_head, *fin_tail;

	bool evicting;
	bool expiring;           /* inside the expiry sweep */
	struct sel_expiry exp;
	bool stopped;            /* a transfer failed fatally or close timed out */
	bool closed;
	int close_rc;

	struct sel_progress pg;    /* refusals since the last PROGRESS, capacity back since */
	uint32_t refused_need;   /* slots the last refused put needed */

	sel_stats st;            /* counters; gauges are filled at stats() */
};

#define MS(s) ((struct mem_store *)(s))

static void debug_check(struct mem_store *ms)
{
#ifdef SEL_DEBUG_CHECKS
	if (sel_memory_store_check(&ms->base) != 0) {
		fprintf(stderr, "sel_memory_store_check: %s\n", eos_errmsg());
		abort();
	}
#else
	(void)ms;
#endif
}

static uint32_t div_up(uint32_t n, uint32_t d)
{
	return n / d + (n % d != 0);
}

static uint32_t rec_slots(const struct mrec *r)
{
	return r->n_page_slots + r->n_row_slots;
}

static struct mrec *rec_of(struct mem_store *ms, sel_node_id id)
{
	return id < ms->nrecs ? &ms->recs[id] : NULL;
}

/* Make recs[id] addressable (zeroed). */
static int ensure_rec(struct mem_store *ms, sel_node_id id)
{
	if (id < ms->nrecs)
		return 0;
	uint32_t n = ms->nrecs ? ms->nrecs : 64;
	while (n <= id)
		n = n > UINT32_MAX / 2 ? UINT32_MAX : n * 2;
	struct mrec *r = realloc(ms->recs, (size_t)n * sizeof(*r));
	if (!r)
		return eos_fail(-ENOMEM, "memory store: out of memory for %" PRIu32 " records", n);
	memset(r + ms->nrecs, 0, (size_t)(n - ms->nrecs) * sizeof(*r));
	ms->recs = r;
	ms->nrecs = n;
	return 0;
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
	if (r->mypins)
		ms->slots_pinned -= n;
}

static void rec_release(struct mem_store *ms, struct mrec *r)
{
	free_slots(ms, r, 0, rec_slots(r));
	free(r->slots);
	memset(r, 0, sizeof(*r));
}

/* ---- Index callbacks ------------------------------------------------------ */

static void cb_drop_row(void *ctx, sel_index *ix, sel_node_id id)
{
	(void)ix;
	struct mem_store *ms = ctx;
	struct mrec *r = rec_of(ms, id);
	if (!r || !r->live)
		return;
	free_slots(ms, r, r->n_page_slots, r->n_row_slots);
	r->n_row_slots = 0;
	r->row_packed = false;
}

static void cb_remove(void *ctx, sel_index *ix, sel_node_id id)
{
	(void)ix;
	struct mem_store *ms = ctx;
	struct mrec *r = rec_of(ms, id);
	if (ms->expiring) {
		ms->st.tier[SEL_TIER_MEMORY].expired++;
	} else if (ms->evicting) {
		ms->st.tier[SEL_TIER_MEMORY].evicted++;
		/* The end of the local chain only when memory is the last tier;
		 * in a composite the record stays on disk. */
		if (ms->own_sp)
			ms->st.tier[SEL_TIER_MEMORY].dropped_end_of_chain++;
	}
	if (r && r->live)
		rec_release(ms, r);
}

static const struct sel_index_ops ms_index_ops = {
	.drop_row = cb_drop_row,
	.remove = cb_remove,
};

/* ---- Pins ----------------------------------------------------------------- */

static void ms_pin(struct mem_store *ms, sel_node_id id)
{
	struct mrec *r = &ms->recs[id];
	if (r->mypins++ == 0)
		ms->slots_pinned += rec_slots(r);
	sel_index_pin(ms->ix, id);
}

/* May run drop_row/remove callbacks on id (deferred row drops, useless
 * page-only leaves). */
static void ms_unpin(struct mem_store *ms, sel_node_id id)
{
	struct mrec *r = &ms->recs[id];
	if (--r->mypins == 0)
		ms->slots_pinned -= rec_slots(r);
	sel_index_unpin(ms->ix, id);
}

/* ---- Helpers -------------------------------------------------------------- */

static uint64_t record_bytes(const struct mem_store *ms, uint32_t pages, bool row)
{
	return (uint64_t)pages * ms->page_bytes_all + (row ? ms->row_bytes_all : 0);
}

/* Evict by the tree policy until n warm slots can be taken.  0 or -ENOSPC. */
static int make_room(struct mem_store *ms, uint32_t n)
{
	ms->evicting = true;
	while (!sel_slab_can_alloc(ms->pool, n, SEL_SLAB_WARM)) {
		int r = sel_index_evict(ms->ix, NULL);
		if (r == 0)
			break;
		if (r == 2)
			ms->st.tier[SEL_TIER_MEMORY].compacted++;
	}
	ms->evicting = false;
	return sel_slab_can_alloc(ms->pool, n, SEL_SLAB_WARM) ? 0 : -ENOSPC;
}

/* ---- put ------------------------------------------------------------------ */

static sel_outcome put_inner(struct mem_store *ms, const sel_published *cp, sel_retry_reason *why)
{
	sel_node_id id, pid = SEL_NODE_NONE;
	uint32_t tail;
	bool row, fresh;

	if (ms->stopped || ms->closed) {
		eos_fail(SEL_ESTOPPED, "memory store: %s", ms->closed ? "closed" : "stopped");
		return SEL_SKIPPED;
	}
	if (!sel_put_usable("memory store", cp, ms->pt, ms->min_rows))
		return SEL_SKIPPED;

	id = sel_index_find(ms->ix, &cp->key);
	if (id != SEL_NODE_NONE) {
		const sel_index_node *n = sel_index_cget(ms->ix, id);
		if (n->state == SEL_NODE_READY) {
			if (!(n->flags & SEL_NODE_HAS_ROW))
				return SEL_SKIPPED; /* page-only: its row cannot come back */
			sel_index_touch(ms->ix, id);
			return SEL_PRESENT;
		}
		if (!(n->flags & MS_FAILED) || n->pins)
			return SEL_SKIPPED; /* its copy is in flight */
		/* A failed copy kept for its children: fill it again. */
		fresh = false;
		tail = n->tail_pages;
		row = n->flags & SEL_NODE_HAS_ROW;
		if (tail > cp->n_pages)
			return SEL_SKIPPED;
	} else {
		fresh = true;
		row = true;
		tail = cp->n_pages;
		if (!sel_key_is_none(&cp->parent)) {
			pid = sel_index_find(ms->ix, &cp->parent);
			if (pid != SEL_NODE_NONE) {
				uint32_t derived;
				if (!sel_put_extends("memory store", cp, sel_index_cget(ms->ix, pid)->key.consumed, ms->pt,
						     &derived))
					return SEL_SKIPPED;
				tail = cp->tail;
			}
		}
	}

	uint32_t nrow = row ? ms->row_slots : 0;
	uint64_t need64 = (uint64_t)tail + nrow;
	if (need64 > ms->warm) {
		if (ms->own_sp) /* a composite streams it to disk instead */
			ms->st.tier[SEL_TIER_MEMORY].dropped_oversize++;
		eos_fail(SEL_EOVERSIZE, "memory store: checkpoint %" PRIu64 " needs %" PRIu64
			 " slots, the warm pool has %" PRIu64, cp->checkpoint, need64, ms->warm);
		return SEL_OVERSIZE;
	}
	uint32_t need = (uint32_t)need64;

	/* The job block and the record's slot array, before touching the index. */
	size_t jsz = sizeof(struct mjob) + ((size_t)tail + need) * sizeof(uint32_t);
	struct mjob *j = malloc(jsz);
	uint32_t *slots = malloc((need ? need : 1) * sizeof(uint32_t));
	if (!j || !slots) {
		free(j);
		free(slots);
		eos_fail(-ENOMEM, "memory store: out of memory for a job of %" PRIu32 " pages", tail);
		return SEL_SKIPPED;
	}
	memset(j, 0, sizeof(*j));
	uint32_t *jpages = (uint32_t *)(j + 1);
	uint32_t *jslots = jpages + tail;
	if (!sel_put_pages_fit("memory store", cp, tail, ms->min_pages)) {
		free(j);
		free(slots);
		return SEL_SKIPPED;
	}
	if (tail)
		memcpy(jpages, cp->pages + (cp->n_pages - tail), (size_t)tail * sizeof(uint32_t));

	if (fresh) {
		int rc = sel_index_insert(ms->ix, &cp->key, pid == SEL_NODE_NONE ? NULL : &cp->parent,
					  &cp->bucket, tail, true, &id);
		if (rc == 0)
			rc = ensure_rec(ms, id);
		if (rc) {
			if (rc != -EEXIST && id != SEL_NODE_NONE && sel_index_find(ms->ix, &cp->key) == id)
				sel_index_remove(ms->ix, id);
			free(j);
			free(slots);
			return SEL_SKIPPED;
		}
		struct mrec *r = &ms->recs[id];
		memset(r, 0, sizeof(*r));
		r->live = true;
	}
	struct mrec *r = &ms->recs[id];
	ms_pin(ms, id);

	sel_outcome out = SEL_QUEUED;
	/* Free warm slots plus every unpinned record's cannot hold it: evicting
	 * would only empty memory for a refusal (under backpressure, a
	 * composite whose dirty records fill memory refuses often). */
	uint64_t warm_free = sel_slab_free_count(ms->pool);
	warm_free = warm_free > ms->intake ? warm_free - ms->intake : 0;
	bool hopeless = warm_free + (ms->slots_held - ms->slots_pinned) < need;
	if (hopeless || make_room(ms, need) != 0) {
		uint64_t avail = sel_slab_free_count(ms->pool);
		avail = avail > ms->intake ? avail - ms->intake : 0;
		*why = avail + ms->slots_pinned - rec_slots(r) >= need ? SEL_RETRY_INFLIGHT
								     : SEL_RETRY_SLABS;
		eos_fail(-ENOSPC, "memory store: checkpoint %" PRIu64 " needs %" PRIu32
			 " slots; %" PRIu64 " free, %" PRIu64 " held by pinned records",
			 cp->checkpoint, need, avail, ms->slots_pinned - rec_slots(r));
		out = SEL_RETRY;
		goto undo;
	}
	if (sel_slab_alloc(ms->pool, need, SEL_SLAB_WARM, slots) != 0) {
		*why = SEL_RETRY_SLABS;
		out = SEL_RETRY;
		goto undo;
	}
	/* The record owns the slots from here; pinned, so count them. */
	free(r->slots);
	r->slots = slots;
	slots = NULL;
	r->n_page_slots = tail;
	r->n_row_slots = nrow;
	r->pages_packed = r->row_packed = false;
	ms->slots_pinned += need;
	ms->slots_held += need;
	memcpy(jslots, r->slots, (size_t)need * sizeof(uint32_t));

	j->kind = JOB_OUT;
	j->node = id;
	j->checkpoint = cp->checkpoint;
	j->key = cp->key;
	j->bytes = record_bytes(ms, tail, row);
	j->x.id = ++ms->job_seq;
	j->x.dir = SEL_COPY_OUT;
	j->x.n_pages = tail;
	j->x.pages = jpages;
	j->x.page_slots = jslots;
	j->x.row = row;
	j->x.state_slot = cp->state_slot;
	j->x.row_slots = jslots + tail;
	j->x.compare = ms->ranks > 1 && !ms->sp->split; /* split slots are not CPU-readable */

	int rc = sel_xfer_submit(ms->xfer, &j->x);
	if (rc != 0) {
		if (rc == -EAGAIN) {
			*why = SEL_RETRY_QUEUE;
			out = SEL_RETRY;
		} else {
			if (rc == SEL_ESTOPPED)
				ms->stopped = true;
			out = SEL_SKIPPED;
		}
		eos_fail(rc, "memory store: checkpoint %" PRIu64 ": transfer submission: %s",
			 cp->checkpoint, sel_strerror(rc));
		/* Give the slots back; the record is empty again. */
		free_slots(ms, r, 0, rec_slots(r));
		r->n_page_slots = r->n_row_slots = 0;
		goto undo;
	}
	sel_index_get(ms->ix, id)->flags &= (uint16_t)~MS_FAILED;
	r->out = j;
	outs_push(&ms->outs, j);
	ms->st.inflight_out++;
	debug_check(ms);
	return SEL_QUEUED;

undo:
	if (out == SEL_RETRY)
		ms->refused_need = need;
	ms_unpin(ms, id);
	if (fresh)
		sel_index_remove(ms->ix, id);
	free(j);
	free(slots);
	debug_check(ms);
	return out;
}

static sel_outcome ms_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct mem_store *ms = MS(s);
	sel_retry_reason reason = SEL_RETRY_NONE;
	sel_outcome o = cp ? put_inner(ms, cp, &reason) : SEL_SKIPPED;
	sel_put_account(&ms->st, &ms->pg, o, reason, why);
	return o;
}

/* ---- lookup --------------------------------------------------------------- */

static int ms_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_hit *hit)
{
	struct mem_store *ms = MS(s);
	ms->st.lookups++;
	int rc = sel_index_lookup(ms->ix, h, resident, limit, &ms->chain);
	ms->st.chains_rejected += ms->chain.rejected;
	if (rc <= 0)
		return rc;
	const sel_index_chain *ch = &ms->chain;
	sel_node_id end = ch->ids[ch->n - 1];
	memset(hit, 0, sizeof(*hit));
	hit->key = sel_index_cget(ms->ix, end)->key;
	hit->resident = resident;
	hit->pages = ch->pages - ch->skip_pages;
	hit->bytes = record_bytes(ms, hit->pages, true);
	hit->tier = SEL_TIER_MEMORY;
	hit->cookie = end;
	hit->chain = ch->digest;
	ms->st.hits++;
	return 1;
}

/* ---- fetch ---------------------------------------------------------------- */

static void pend_push(struct mem_store *ms, struct mfetch *f)
{
	f->pending = true;
	f->pend_next = NULL;
	if (ms->pend_tail)
		ms->pend_tail->pend_next = f;
	else
		ms->pend_head = f;
	ms->pend_tail = f;
}

static void fin_push(struct mem_store *ms, struct mfetch *f)
{
	f->finished = true;
	f->fin_next = NULL;
	if (ms->fin_tail)
		ms->fin_tail->fin_next = f;
	else
		ms->fin_head = f;
	ms->fin_tail = f;
}

/* The transfer set stopped: jobs never submitted count as failed. */
static void fetch_abandon_rest(struct mem_store *ms, struct mfetch *f, int rc)
{
	if (!f->status)
		f->status = rc;
	f->n_done += f->n_jobs - f->n_submitted;
	f->n_submitted = f->n_jobs;
	if (f->n_done == f->n_jobs)
		fin_push(ms, f);
}

/* Submit f's remaining jobs in order.  0 when all are submitted, -EAGAIN
 * when the channel filled, SEL_ESTOPPED (the rest abandoned). */
static int fetch_submit(struct mem_store *ms, struct mfetch *f)
{
	while (f->n_submitted < f->n_jobs) {
		int rc = sel_xfer_submit(ms->xfer, &f->jobs[f->n_submitted].x);
		if (rc == -EAGAIN)
			return rc;
		if (rc != 0) {
			if (rc == SEL_ESTOPPED)
				ms->stopped = true;
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
		ms_unpin(ms, f->nodes[i]);
	fetches_del(&ms->fetches, f);
	free(f);
}

static int ms_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct mem_store *ms = MS(s);
	if (ms->stopped || ms->closed)
		return eos_fail(SEL_ESTOPPED, "memory store: %s", ms->closed ? "closed" : "stopped");
	if (!hit || !in || (in->n_pages && !in->pages))
		return eos_fail(-EINVAL, "memory store: fetch without a hit or destination");

	/* Re-validate: the endpoint is READY with its row, and the chain above
	 * hit->resident is READY and still uploads hit->pages pages. */
	sel_node_id end = sel_index_find(ms->ix, &hit->key);
	if (end == SEL_NODE_NONE)
		return eos_fail(-ESTALE, "memory store: hit endpoint is gone");
	const sel_index_node *en = sel_index_cget(ms->ix, end);
	if (en->state != SEL_NODE_READY || !(en->flags & SEL_NODE_HAS_ROW) ||
	    en->key.consumed <= hit->resident)
		return eos_fail(-ESTALE, "memory store: hit endpoint lost its row");
	uint32_t n_nodes = 0;
	uint64_t base = 0, tails = 0;
	for (sel_node_id cur = end; cur != SEL_NODE_NONE;) {
		const sel_index_node *n = sel_index_cget(ms->ix, cur);
		if (n->key.consumed <= hit->resident) {
			base = n->key.consumed;
			break;
		}
		if (n->state != SEL_NODE_READY)
			return eos_fail(-ESTALE, "memory store: hit chain is no longer complete");
		n_nodes++;
		tails += n->tail_pages;
		cur = n->parent;
	}
	uint64_t chain_pages = en->key.consumed / ms->pt - base / ms->pt;
	uint64_t skip = hit->resident / ms->pt - base / ms->pt;
	if (tails != chain_pages || chain_pages - skip != hit->pages)
		return eos_fail(-ESTALE, "memory store: hit chain changed (%" PRIu64 " pages now, %" PRIu32
				" in the hit)", chain_pages - skip, hit->pages);
	/* Exactly the nodes the lookup compared with the request's history. */
	sel_digest dg;
	int drc = sel_index_chain_digest(ms->ix, end, hit->resident, &dg);
	if (drc)
		return drc;
	if (memcmp(dg.b, hit->chain.b, SEL_DIGEST_BYTES) != 0)
		return eos_fail(-ESTALE, "memory store: the hit's chain is not the one its lookup "
				"verified");
	if (in->n_pages != hit->pages)
		return eos_fail(-EINVAL, "memory store: inbound ticket %" PRIu64 " has %" PRIu32
				" pages, the hit uploads %" PRIu32, in->ticket, in->n_pages, hit->pages);
	if (in->state_slot >= ms->min_rows)
		return eos_fail(-EINVAL, "memory store: inbound state slot %" PRIu32 " beyond %" PRIu64
				" rows", in->state_slot, ms->min_rows);

	/* Chain, ascending, in the store's scratch array. */
	if (n_nodes > ms->scratch_cap) {
		sel_node_id *p = realloc(ms->scratch, (size_t)n_nodes * 2 * sizeof(*p));
		if (!p)
			return eos_fail(-ENOMEM, "memory store: out of memory for a chain of %" PRIu32,
					n_nodes);
		ms->scratch = p;
		ms->scratch_cap = n_nodes * 2;
	}
	sel_node_id *ids = ms->scratch;
	{
		sel_node_id cur = end;
		for (uint32_t i = n_nodes; i-- > 0;) {
			ids[i] = cur;
			cur = sel_index_cget(ms->ix, cur)->parent;
		}
	}
	/* Pass 1: count jobs and slot ids. */
	uint32_t n_jobs = 0, n_slot_ids = 0, run_packed = 0, prev_used = 0;
	for (uint32_t i = 0; i < n_nodes; i++) {
		const sel_index_node *n = sel_index_cget(ms->ix, ids[i]);
		const struct mrec *r = &ms->recs[ids[i]];
		uint32_t off = i == 0 ? (uint32_t)skip : 0, used = n->tail_pages - off;
		if (used == 0)
			continue;
		bool p = r->pages_packed;
		uint32_t lead = p ? off % ms->ranks : 0; /* shares before ours in the first slot */
		if (n_jobs == 0 || p != run_packed || (p && prev_used % ms->ranks))
			n_jobs++;
		run_packed = p;
		prev_used = lead + used;
		n_slot_ids += p ? div_up(lead + used, ms->ranks) : used;
	}
	if (n_jobs == 0)
		n_jobs = 1; /* the row alone */
	const struct mrec *er = &ms->recs[end];
	n_slot_ids += er->n_row_slots;

	size_t sz = sizeof(struct mfetch) + (size_t)n_jobs * sizeof(struct mjob) +
		    (size_t)n_nodes * sizeof(sel_node_id) +
		    ((size_t)hit->pages + n_slot_ids) * sizeof(uint32_t);
	struct mfetch *f = calloc(1, sz);
	if (!f) {
		return eos_fail(-ENOMEM, "memory store: out of memory for a fetch of %" PRIu32 " pages",
				hit->pages);
	}
	f->jobs = (struct mjob *)(f + 1);
	f->nodes = (sel_node_id *)(f->jobs + n_jobs);
	uint32_t *dst = (uint32_t *)(f->nodes + n_nodes);
	uint32_t *sl = dst + hit->pages;
	for (uint32_t i = 0; i < in->n_pages; i++) {
		if (in->pages[i] >= ms->min_pages) {
			free(f);
			return eos_fail(-EINVAL, "memory store: inbound page id %" PRIu32 " beyond %" PRIu64
					" pages", in->pages[i], ms->min_pages);
		}
		dst[i] = in->pages[i];
	}
	memcpy(f->nodes, ids, n_nodes * sizeof(*ids));
	f->n_nodes = n_nodes;
	f->n_jobs = n_jobs;
	f->ticket = in->ticket;
	f->key = hit->key;
	f->resident = hit->resident;
	f->bytes = record_bytes(ms, hit->pages, true);
	f->pages = hit->pages;

	/* Pass 2: fill the jobs. */
	struct mjob *j = NULL;
	uint32_t nj = 0, page_at = 0;
	run_packed = 0;
	prev_used = 0;
	for (uint32_t i = 0; i < n_nodes; i++) {
		const sel_index_node *n = sel_index_cget(ms->ix, f->nodes[i]);
		const struct mrec *r = &ms->recs[f->nodes[i]];
		uint32_t off = i == 0 ? (uint32_t)skip : 0, used = n->tail_pages - off;
		if (used == 0)
			continue;
		bool p = r->pages_packed;
		uint32_t lead = p ? off % ms->ranks : 0;
		if (!j || p != run_packed || (p && prev_used % ms->ranks)) {
			j = &f->jobs[nj++];
			j->kind = JOB_IN;
			j->f = f;
			j->x.dir = SEL_COPY_IN;
			j->x.pages = dst + page_at;
			j->x.page_slots = sl;
			j->x.pages_packed = p;
			j->x.first_share = lead; /* non-zero only for the first node */
		}
		run_packed = p;
		prev_used = lead + used;
		uint32_t from = p ? off / ms->ranks : off, cnt = p ? div_up(lead + used, ms->ranks) : used;
		memcpy(sl, r->slots + from, (size_t)cnt * sizeof(uint32_t));
		sl += cnt;
		j->x.n_pages += used;
		page_at += used;
	}
	if (!j) {
		j = &f->jobs[nj++];
		j->kind = JOB_IN;
		j->f = f;
		j->x.dir = SEL_COPY_IN;
		j->x.pages = dst;
		j->x.page_slots = sl;
	}
	/* The endpoint's row rides on the last job. */
	memcpy(sl, er->slots + er->n_page_slots, (size_t)er->n_row_slots * sizeof(uint32_t));
	j->x.row = true;
	j->x.row_slots = sl;
	j->x.row_packed = er->row_packed;
	j->x.state_slot = in->state_slot;
	for (uint32_t i = 0; i < nj; i++)
		f->jobs[i].x.id = ++ms->job_seq;

	for (uint32_t i = 0; i < n_nodes; i++)
		ms_pin(ms, f->nodes[i]);
	fetches_push(&ms->fetches, f);
	f->submit_ns = eos_now_ns();
	int rc = fetch_submit(ms, f);
	if (rc != 0 && f->n_submitted == 0) {
		fetch_release(ms, f);
		debug_check(ms);
		if (rc == -EAGAIN)
			return eos_fail(-EAGAIN, "memory store: transfer queue full");
		return eos_fail(rc, "memory store: fetch submission: %s", sel_strerror(rc));
	}
	if (rc == -EAGAIN)
		pend_push(ms, f);
	sel_index_touch(ms->ix, end);
	ms->st.fetches++;
	ms->st.inflight_in++;
	debug_check(ms);
	return 0;
}

/* ---- poll ----------------------------------------------------------------- */

static void fetch_event(struct mem_store *ms, struct mfetch *f, sel_event *ev)
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
	ms->st.inflight_in--;
	if (f->status) {
		ms->st.fetch_failures++;
		ms->pg.released = true; /* its pins drop: a failure is no progress event */
	} else {
		ms->st.tier[SEL_TIER_MEMORY].bytes_in += f->bytes;
		ms->st.reused_tokens += f->key.consumed - f->resident;
		sel_policy_observe(ms->policy, SEL_TIER_MEMORY, f->bytes, ev->duration_ns, f->pages);
	}
	fetch_release(ms, f);
}

/* An IN job completed; 1 with *ev filled when its fetch is complete. */
static int in_done(struct mem_store *ms, struct mjob *j, sel_event *ev)
{
	struct mfetch *f = j->f;
	f->n_done++;
	if (j->x.status && !f->status)
		f->status = j->x.status;
	if (j->x.done_ns > f->last_done_ns)
		f->last_done_ns = j->x.done_ns;
	if (f->n_done < f->n_jobs)
		return 0;
	fetch_event(ms, f, ev);
	return 1;
}

/* Remove failed node id (if it is still key's node) once it is childless
 * and unpinned, then failed ancestors left so. */
static void remove_failed(struct mem_store *ms, sel_node_id id, const sel_key *key)
{
	if (sel_index_find(ms->ix, key) != id)
		return; /* already gone (a useless page-only leaf at unpin) */
	while (id != SEL_NODE_NONE) {
		const sel_index_node *n = sel_index_cget(ms->ix, id);
		if (!(n->flags & MS_FAILED) || n->children || n->pins)
			return;
		sel_node_id parent = n->parent;
		if (sel_index_remove(ms->ix, id) != 0)
			return;
		id = parent;
		if (id != SEL_NODE_NONE && !sel_index_cget(ms->ix, id))
			return; /* the removal cascaded through it */
	}
}

static int out_done(struct mem_store *ms, struct mjob *j, sel_event *ev)
{
	sel_node_id id = j->node;
	struct mrec *r = &ms->recs[id];
	memset(ev, 0, sizeof(*ev));
	ev->checkpoint = j->checkpoint;
	ev->key = j->key;
	ev->tier = SEL_TIER_MEMORY;
	ev->bytes = j->bytes;
	ev->duration_ns = j->x.done_ns > j->x.submit_ns ? j->x.done_ns - j->x.submit_ns : 0;
	r->out = NULL;
	outs_del(&ms->outs, j);
	ms->st.inflight_out--;

	if (j->x.status == 0) {
		bool packed = false;
		if (ms->ranks > 1 && j->x.pages_replicated && r->n_page_slots) {
			uint32_t keep = div_up(r->n_page_slots, ms->ranks);
			free_slots(ms, r, keep, r->n_page_slots - keep);
			memmove(r->slots + keep, r->slots + r->n_page_slots,
				(size_t)r->n_row_slots * sizeof(uint32_t));
			r->n_page_slots = keep;
			r->pages_packed = true;
			packed = true;
		}
		if (ms->ranks > 1 && j->x.row_replicated && r->n_row_slots) {
			uint32_t keep = div_up(r->n_row_slots, ms->ranks);
			free_slots(ms, r, r->n_page_slots + keep, r->n_row_slots - keep);
			r->n_row_slots = keep;
			r->row_packed = true;
			packed = true;
		}
		if (packed) {
			ms->st.packed_records++;
			ms->st.tier[SEL_TIER_MEMORY].stores_packed++;
		} else {
			ms->st.per_rank_records++;
			ms->st.tier[SEL_TIER_MEMORY].stores_per_rank++;
		}
		ms->st.tier[SEL_TIER_MEMORY].held++;
		ms->st.tier[SEL_TIER_MEMORY].bytes_out += j->bytes;
		sel_index_commit(ms->ix, id);
		ms_unpin(ms, id);
		ev->type = SEL_EV_STORED;
		ev->outcome = SEL_QUEUED;
	} else {
		free_slots(ms, r, 0, rec_slots(r));
		r->n_page_slots = r->n_row_slots = 0;
		r->pages_packed = r->row_packed = false;
		sel_index_get(ms->ix, id)->flags |= MS_FAILED;
		ms_unpin(ms, id);
		remove_failed(ms, id, &j->key);
		ms->st.store_failures++;
		ms->pg.released = true; /* its slots are free again */
		ev->type = SEL_EV_STORE_FAILED;
		ev->outcome = SEL_SKIPPED;
		ev->error = j->x.status;
	}
	free(j);
	return 1;
}

static void resubmit_pending(struct mem_store *ms)
{
	while (ms->pend_head) {
		struct mfetch *f = ms->pend_head;
		int rc = fetch_submit(ms, f);
		if (rc == -EAGAIN)
			return;
		ms->pend_head = f->pend_next;
		if (!ms->pend_head)
			ms->pend_tail = NULL;
		f->pending = false;
	}
}

/* Expiry may drop a ready record no job holds (pinned ones are passed
 * over by the index). */
static bool ms_droppable(void *ctx, const sel_index *ix, sel_node_id id)
{
	(void)ctx;
	const sel_index_node *n = sel_index_cget(ix, id);
	return n->state == SEL_NODE_READY && !(n->flags & MS_FAILED);
}

/* The once-a-minute expiry sweep (design 2.5). */
static void ms_expire(struct mem_store *ms)
{
	uint64_t cutoff;
	if (ms->closed || ms->stopped || !sel_expiry_due(&ms->exp, &cutoff))
		return;
	uint64_t before = ms->st.tier[SEL_TIER_MEMORY].expired;
	ms->expiring = true;
	(void)sel_index_expire(ms->ix, cutoff, SEL_EXPIRY_LEAVES, false, ms_droppable, ms);
	ms->expiring = false;
	if (ms->st.tier[SEL_TIER_MEMORY].expired != before)
		ms->pg.released = true;
}

static int ms_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct mem_store *ms = MS(s);
	size_t n = 0;
	bool progress = true;

	ms_expire(ms);

	while (n < cap && progress) {
		progress = false;
		/* Fetches that finished without a completion (transfer set
		 * stopped while part of them was still unsubmitted). */
		while (n < cap && ms->fin_head) {
			struct mfetch *f = ms->fin_head;
			ms->fin_head = f->fin_next;
			if (!ms->fin_head)
				ms->fin_tail = NULL;
			fetch_event(ms, f, &ev[n++]);
		}
		if (n == cap)
			break;
		struct sel_xfer_job *done[POLL_BATCH];
		size_t want = cap - n < POLL_BATCH ? cap - n : POLL_BATCH;
		int k = sel_xfer_poll(ms->xfer, done, want);
		for (int i = 0; i < k; i++) {
			struct mjob *j = (struct mjob *)((char *)done[i] - offsetof(struct mjob, x));
			n += j->kind == JOB_OUT ? out_done(ms, j, &ev[n]) : in_done(ms, j, &ev[n]);
		}
		progress = k > 0;
		/* Completions made channel room. */
		resubmit_pending(ms);
		progress |= ms->fin_head != NULL;
	}
	if (cap == 0)
		resubmit_pending(ms);
	if (n < cap && sel_progress_due(&ms->pg)) {
		memset(&ev[n], 0, sizeof(ev[n]));
		ev[n++].type = SEL_EV_PROGRESS;
	}
	debug_check(ms);
	return (int)n;
}

/* ---- the rest of the interface ----------------------------------------------- */

static void ms_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir)
{
	(void)key;
	(void)generation;
	(void)heir;
	MS(s)->st.evictions_noticed++;
}

static void ms_touch(sel_store *s, const sel_key *key)
{
	struct mem_store *ms = MS(s);
	sel_node_id id = sel_index_find(ms->ix, key);
	if (id != SEL_NODE_NONE)
		sel_index_touch(ms->ix, id);
	debug_check(ms);
}

static void ms_stats(sel_store *s, sel_stats *out)
{
	struct mem_store *ms = MS(s);
	*out = ms->st;
	out->transport = ms->backend->name;
	out->slot_bytes = ms->slot_bytes;
	out->slots_in_use = sel_slab_in_use(ms->pool);
	out->slots_total = sel_slab_total(ms->pool);
	out->intake_slots = sel_slab_intake(ms->pool);
	sel_tier_stats *t = &out->tier[SEL_TIER_MEMORY];
	t->records = sel_index_count(ms->ix);
	t->bytes_used = out->slots_in_use * ms->slot_bytes;
	t->bytes_limit = ms->warm * ms->slot_bytes;
	t->rate_bps = (uint64_t)sel_policy_rate(ms->policy, SEL_TIER_MEMORY);
	t->fixed_ns = (uint64_t)sel_policy_fixed_ns(ms->policy, SEL_TIER_MEMORY);
}

static int ms_wait_fd(sel_store *s)
{
	struct mem_store *ms = MS(s);
	return ms->xfer ? sel_xfer_fd(ms->xfer) : -1;
}

static int ms_close(sel_store *s, uint64_t deadline_ns)
{
	struct mem_store *ms = MS(s);
	if (ms->closed)
		return ms->close_rc;
	int rc = ms->xfer ? sel_xfer_close(ms->xfer, deadline_ns) : 0;
	ms->closed = true;
	if (rc != 0) {
		char b[32];
		ms->stopped = true;
		rc = SEL_ESTOPPED;
		eos_fail(rc, "memory store: copies did not drain by the deadline; the slot pool (%s) is"
			 " leaked and the planes must stay mapped",
			 eos_format_size(ms->slot_bytes * (ms->warm + ms->intake), b, sizeof(b)));
	}
	ms->close_rc = rc;
	return rc;
}

static void ms_destroy(sel_store *s)
{
	struct mem_store *ms = MS(s);
	if (!ms)
		return;
	if (ms->xfer && !ms->closed) {
		/* Destroy without close: drain within a bounded time. */
		ms_close(s, eos_now_ns() + 10ull * 1000 * 1000 * 1000);
	}
	if (ms->stopped && ms->closed && ms->close_rc != 0) {
		if (ms->own_sp)
			sel_store_pool_leak(ms->sp); /* a lender leaks its own pool */
		struct leaked *l = calloc(1, sizeof(*l));
		if (l) {
			l->xfer = ms->xfer;
			l->outs = ms->outs.head;
			l->fetches = ms->fetches.head;
			pthread_mutex_lock(&leaked_lock);
			l->next = leaked_list;
			leaked_list = l;
			pthread_mutex_unlock(&leaked_lock);
		}
		/* else: leaked unreachable, which is still safe. */
	} else {
		while (ms->outs.head) {
			struct mjob *j = ms->outs.head;
			outs_del(&ms->outs, j);
			free(j);
		}
		while (ms->fetches.head) {
			struct mfetch *f = ms->fetches.head;
			fetches_del(&ms->fetches, f);
			free(f);
		}
		if (ms->xfer)
			sel_xfer_destroy(ms->xfer);
		if (ms->own_sp)
			sel_store_pool_destroy(ms->sp); /* unregisters through the backend */
	}
	for (uint32_t i = 0; i < ms->nrecs; i++)
		free(ms->recs[i].slots);
	free(ms->recs);
	free(ms->scratch);
	sel_index_chain_free(&ms->chain);
	sel_index_destroy(ms->ix);
	sel_policy_destroy(ms->policy);
	free(ms);
}

static const struct sel_store_ops ms_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "memory",
	.lookup = ms_lookup,
	.put = ms_put,
	.fetch = ms_fetch,
	.poll = ms_poll,
	.evicted = ms_evicted,
	.touch = ms_touch,
	.stats = ms_stats,
	.wait_fd = ms_wait_fd,
	.close = ms_close,
	.destroy = ms_destroy,
};

/* ---- open ----------------------------------------------------------------- */

static int open_on(const sel_store_config *cfg, struct sel_store_pool *sp, bool own,
		   sel_store **out)
{
	struct mem_store *ms = calloc(1, sizeof(*ms));
	int rc;
	if (!ms) {
		if (own)
			sel_store_pool_destroy(sp);
		return eos_fail(-ENOMEM, "memory store: out of memory");
	}
	const sel_geometry *g = cfg->geometry;
	ms->base.ops = &ms_ops;
	ms->base.page_tokens = g->page_tokens;
	ms->g = g;
	ms->sp = sp;
	ms->own_sp = own;
	ms->backend = sp->backend;
	ms->layout = &sp->layout;
	ms->pool = sp->pool;
	ms->ranks = g->ranks;
	ms->pt = g->page_tokens;
	ms->slot_bytes = sp->slot_bytes;
	ms->row_slots = sp->row_slots;
	ms->warm = sp->warm;
	ms->intake = sp->intake;
	ms->page_bytes_all = sp->page_bytes_all;
	ms->row_bytes_all = sp->row_bytes_all;
	ms->min_pages = sp->min_pages;
	ms->min_rows = sp->min_rows;
	if (own && sp->warning[0])
		ms->base.warning = sp->warning;
	if (ms->warm == 0) {
		rc = eos_fail(-EINVAL, "memory store: the pool has no warm slots");
		goto fail;
	}
	rc = sel_index_create(ms->pt, &ms_index_ops, ms, &ms->ix);
	if (rc)
		goto fail;
	sel_expiry_init(&ms->exp, cfg);
	if (sel_expiry_on(&ms->exp))
		sel_index_set_clock(ms->ix, ms->exp.clock);
	rc = sel_policy_create(&ms->policy);
	if (rc)
		goto fail;
	rc = ensure_rec(ms, 0);
	if (rc)
		goto fail;
	rc = sel_store_pool_xfer_create(sp, cfg->queue_depth ? cfg->queue_depth : 64, &ms->xfer);
	if (rc)
		goto fail;
	*out = &ms->base;
	return 0;
fail:
	ms->closed = true; /* nothing was submitted */
	ms_destroy(&ms->base);
	return rc;
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

int sel_memory_store_check(sel_store *s)
{
	struct mem_store *ms = MS(s);
	int rc = sel_index_check(ms->ix);
	if (rc)
		return rc;
	rc = sel_slab_check(ms->pool);
	if (rc)
		return rc;
	uint64_t total = sel_slab_total(ms->pool);
	uint8_t *owned = calloc(total ? total : 1, 1);
	if (!owned)
		return eos_fail(-ENOMEM, "memory store check: out of memory");
	uint64_t used = 0, nodes = 0, pinned = 0;
	for (sel_node_id id = sel_index_next_lru(ms->ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(ms->ix, id)) {
		const sel_index_node *n = sel_index_cget(ms->ix, id);
		const struct mrec *r = rec_of(ms, id);
		nodes++;
		if (!r || !r->live) {
			rc = eos_fail(SEL_ECORRUPT, "memory store: node %" PRIu32 " has no record", id);
			goto out;
		}
		bool failed = n->flags & MS_FAILED;
		uint32_t want_pages = failed ? 0 : r->pages_packed ? div_up(n->tail_pages, ms->ranks)
								     : n->tail_pages;
		uint32_t want_row = failed || !(n->flags & SEL_NODE_HAS_ROW) ? 0
				    : r->row_packed ? div_up(ms->row_slots, ms->ranks) : ms->row_slots;
		if (r->n_page_slots != want_pages || r->n_row_slots != want_row) {
			rc = eos_fail(SEL_ECORRUPT, "memory store: node %" PRIu32 " holds %" PRIu32 "+%" PRIu32
				      " slots, expected %" PRIu32 "+%" PRIu32, id, r->n_page_slots,
				      r->n_row_slots, want_pages, want_row);
			goto out;
		}
		for (uint32_t i = 0; i < rec_slots(r); i++) {
			uint32_t sl = r->slots[i];
			if (sl >= total || owned[sl]) {
				rc = eos_fail(SEL_ECORRUPT, "memory store: slot %" PRIu32 " of node %" PRIu32
					      " is %s", sl, id, sl >= total ? "out of range" : "owned twice");
				goto out;
			}
			owned[sl] = 1;
			used++;
		}
		if (r->mypins > n->pins) {
			rc = eos_fail(SEL_ECORRUPT, "memory store: node %" PRIu32 " store pins %" PRIu32
				      " > index pins %" PRIu32, id, r->mypins, n->pins);
			goto out;
		}
		if (r->mypins)
			pinned += rec_slots(r);
		if (r->out && (n->state != SEL_NODE_PENDING || !r->mypins || r->out->node != id)) {
			rc = eos_fail(SEL_ECORRUPT, "memory store: node %" PRIu32 " has a copy-out in flight"
				      " but is not a pinned pending node", id);
			goto out;
		}
	}
	uint64_t live = 0;
	for (uint32_t i = 0; i < ms->nrecs; i++)
		live += ms->recs[i].live;
	if (live != nodes || nodes != sel_index_count(ms->ix)) {
		rc = eos_fail(SEL_ECORRUPT, "memory store: %" PRIu64 " records, %" PRIu64 " nodes", live,
			      nodes);
		goto out;
	}
	if (used != ms->slots_held || (ms->own_sp && used != sel_slab_in_use(ms->pool))) {
		rc = eos_fail(SEL_ECORRUPT, "memory store: records hold %" PRIu64 " slots, counted %"
			      PRIu64 ", the pool has %" PRIu64 " in use", used, ms->slots_held,
			      sel_slab_in_use(ms->pool));
		goto out;
	}
	if (pinned != ms->slots_pinned) {
		rc = eos_fail(SEL_ECORRUPT, "memory store: pinned slots %" PRIu64 ", counted %" PRIu64,
			      pinned, ms->slots_pinned);
		goto out;
	}
	uint64_t outs = 0, fetches = 0;
	for (const struct mjob *j = ms->outs.head; j; j = j->next, outs++)
		if (rec_of(ms, j->node) == NULL || ms->recs[j->node].out != j) {
			rc = eos_fail(SEL_ECORRUPT, "memory store: copy-out job of node %" PRIu32
				      " not on its record", j->node);
			goto out;
		}
	for (const struct mfetch *f = ms->fetches.head; f; f = f->next, fetches++)
		for (uint32_t i = 0; i < f->n_nodes; i++)
			if (!ms->recs[f->nodes[i]].live || !ms->recs[f->nodes[i]].mypins) {
				rc = eos_fail(SEL_ECORRUPT, "memory store: fetch of ticket %" PRIu64
					      " reads unpinned node %" PRIu32, f->ticket, f->nodes[i]);
				goto out;
			}
	if (outs != ms->st.inflight_out || fetches != ms->st.inflight_in) {
		rc = eos_fail(SEL_ECORRUPT, "memory store: %" PRIu64 "/%" PRIu64 " jobs live, counted %"
			      PRIu64 "/%" PRIu64, outs, fetches, ms->st.inflight_out, ms->st.inflight_in);
		goto out;
	}
out:
	free(owned);
	return rc;
}

int sel_memory_store_record(sel_store *s, const sel_key *key, struct sel_memory_record_info *out)
{
	struct mem_store *ms = MS(s);
	sel_node_id id = sel_index_find(ms->ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = sel_index_cget(ms->ix, id);
	const struct mrec *r = &ms->recs[id];
	memset(out, 0, sizeof(*out));
	out->ready = n->state == SEL_NODE_READY;
	out->has_row = n->flags & SEL_NODE_HAS_ROW;
	out->failed = n->flags & MS_FAILED;
	out->pages_packed = r->pages_packed;
	out->row_packed = r->row_packed;
	out->tail_pages = n->tail_pages;
	out->page_slots = r->n_page_slots;
	out->row_slots = r->n_row_slots;
	out->pins = n->pins;
	out->is_root = n->parent == SEL_NODE_NONE;
	return 0;
}

void sel_memory_store_slots(sel_store *s, uint64_t *slot_bytes, uint64_t *warm, uint64_t *intake,
			    uint32_t *row_slots)
{
	struct mem_store *ms = MS(s);
	if (slot_bytes)
		*slot_bytes = ms->slot_bytes;
	if (warm)
		*warm = ms->warm;
	if (intake)
		*intake = ms->intake;
	if (row_slots)
		*row_slots = ms->row_slots;
}

const struct sel_store_pool *sel_memory_store_pool(sel_store *s)
{
	return MS(s)->sp;
}

/* ---- the composite's view ----------------------------------------------------- */

static sel_node_id find_live(struct mem_store *ms, const sel_key *key)
{
	return sel_index_find(ms->ix, key);
}

int sel_memory_store_view(sel_store *s, const sel_key *key, struct sel_memory_view *out)
{
	struct mem_store *ms = MS(s);
	sel_node_id id = find_live(ms, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = sel_index_cget(ms->ix, id);
	const struct mrec *r = &ms->recs[id];
	memset(out, 0, sizeof(*out));
	out->ready = n->state == SEL_NODE_READY && !(n->flags & MS_FAILED);
	out->has_row = n->flags & SEL_NODE_HAS_ROW;
	out->pages_packed = r->pages_packed;
	out->row_packed = r->row_packed;
	out->tail_pages = n->tail_pages;
	out->n_page_slots = r->n_page_slots;
	out->n_row_slots = r->n_row_slots;
	out->slots = r->slots;
	out->pins = n->pins;
	out->is_root = n->parent == SEL_NODE_NONE;
	if (!out->is_root)
		out->parent = sel_index_cget(ms->ix, n->parent)->key;
	return 0;
}

int sel_memory_store_pin(sel_store *s, const sel_key *key)
{
	struct mem_store *ms = MS(s);
	sel_node_id id = find_live(ms, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	ms_pin(ms, id);
	debug_check(ms);
	return 0;
}

void sel_memory_store_unpin(sel_store *s, const sel_key *key)
{
	struct mem_store *ms = MS(s);
	sel_node_id id = find_live(ms, key);
	if (id != SEL_NODE_NONE && ms->recs[id].mypins)
		ms_unpin(ms, id);
	debug_check(ms);
}

int sel_memory_store_remove(sel_store *s, const sel_key *key)
{
	struct mem_store *ms = MS(s);
	sel_node_id id = find_live(ms, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = sel_index_cget(ms->ix, id);
	if (n->pins || n->children)
		return -EBUSY;
	int rc = sel_index_remove(ms->ix, id);
	debug_check(ms);
	return rc;
}

uint32_t sel_memory_store_refused_need(sel_store *s)
{
	return MS(s)->refused_need;
}

uint32_t sel_memory_store_record_slots(sel_store *s, uint32_t tail, bool row, bool pages_packed,
				       bool row_packed)
{
	struct mem_store *ms = MS(s);
	uint32_t p = pages_packed ? div_up(tail, ms->ranks) : tail;
	uint32_t r = !row ? 0 : row_packed ? div_up(ms->row_slots, ms->ranks) : ms->row_slots;
	return p + r;
}

int sel_memory_store_reserve(sel_store *s, const sel_key *key, const sel_key *parent,
			     const sel_digest *bucket, uint32_t tail, bool row, bool pages_packed,
			     bool row_packed)
{
	struct mem_store *ms = MS(s);
	if (ms->stopped || ms->closed)
		return eos_fail(SEL_ESTOPPED, "memory store: %s", ms->closed ? "closed" : "stopped");
	if ((ms->ranks == 1 || ms->sp->split) && (pages_packed || row_packed))
		return eos_fail(-EINVAL, "memory store: packing needs ranks > 1 and a registered pool");
	uint32_t need = sel_memory_store_record_slots(s, tail, row, pages_packed, row_packed);
	if (need > ms->warm)
		return eos_fail(-ENOSPC, "memory store: %" PRIu32 " slots exceed the warm pool's %"
				PRIu64, need, ms->warm);
	uint32_t *slots = malloc((need ? need : 1) * sizeof(uint32_t));
	if (!slots)
		return eos_fail(-ENOMEM, "memory store: out of memory");
	sel_node_id id;
	int rc = sel_index_insert(ms->ix, key, parent, bucket, tail, row, &id);
	if (rc == 0)
		rc = ensure_rec(ms, id);
	if (rc) {
		if (rc != -EEXIST && id != SEL_NODE_NONE && sel_index_find(ms->ix, key) == id)
			sel_index_remove(ms->ix, id);
		free(slots);
		return rc;
	}
	struct mrec *r = &ms->recs[id];
	memset(r, 0, sizeof(*r));
	r->live = true;
	ms_pin(ms, id);
	if (make_room(ms, need) != 0 || sel_slab_alloc(ms->pool, need, SEL_SLAB_WARM, slots) != 0) {
		ms_unpin(ms, id);
		if (sel_index_find(ms->ix, key) == id)
			sel_index_remove(ms->ix, id);
		free(slots);
		debug_check(ms);
		return eos_fail(-ENOSPC, "memory store: no room for %" PRIu32 " slots", need);
	}
	r->slots = slots;
	r->n_page_slots = pages_packed ? div_up(tail, ms->ranks) : tail;
	r->n_row_slots = need - r->n_page_slots;
	r->pages_packed = pages_packed;
	r->row_packed = row && row_packed;
	ms->slots_pinned += need;
	ms->slots_held += need;
	debug_check(ms);
	return 0;
}

void sel_memory_store_settle(sel_store *s, const sel_key *key, bool ok)
{
	struct mem_store *ms = MS(s);
	sel_node_id id = find_live(ms, key);
	if (id == SEL_NODE_NONE)
		return;
	if (ok) {
		const struct mrec *r = &ms->recs[id];
		sel_index_commit(ms->ix, id);
		ms->st.tier[SEL_TIER_MEMORY].held++;
		if (r->pages_packed || r->row_packed)
			ms->st.tier[SEL_TIER_MEMORY].stores_packed++; /* a promotion: a new store */
		else
			ms->st.tier[SEL_TIER_MEMORY].stores_per_rank++;
		ms_unpin(ms, id);
	} else {
		ms_unpin(ms, id);
		const sel_index_node *n;
		if (sel_index_find(ms->ix, key) == id && (n = sel_index_cget(ms->ix, id)) &&
		    !n->pins && !n->children)
			sel_index_remove(ms->ix, id);
	}
	debug_check(ms);
}

void sel_memory_store_counts(sel_store *s, uint64_t *in_use, uint64_t *pinned, uint64_t *free_warm)
{
	struct mem_store *ms = MS(s);
	uint64_t f = sel_slab_free_count(ms->pool);
	if (in_use)
		*in_use = ms->slots_held;
	if (pinned)
		*pinned = ms->slots_pinned;
	if (free_warm)
		*free_warm = f > ms->intake ? f - ms->intake : 0;
}

size_t sel_memory_store_keys(sel_store *s, sel_key *keys, size_t cap)
{
	struct mem_store *ms = MS(s);
	size_t n = 0;
	for (sel_node_id id = sel_index_next_lru(ms->ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(ms->ix, id)) {
		if (n < cap)
			keys[n] = sel_index_cget(ms->ix, id)->key;
		n++;
	}
	return n;
}
