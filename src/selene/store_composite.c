/*
 * store_composite.c - the composite store: warm host memory over the disk
 * store, one shared slot pool (design 2.4 "CompositeStore"; 2.2 store
 * interface; 2.5 memory allocation, maintenance, write-ahead limit,
 * durability, the shutdown drain and expiry; 2.12 "memory contents are a subset of
 * disk contents"; 2.15 eviction below the instance, retention metrics,
 * publication outcomes -- local-tier parts).
 *
 * DESIGN
 *
 * The composite owns a memory store and a disk store (store_memory.c,
 * store_disk.c) over one pool of warm plus intake slots (store_pool.c):
 * warm slots hold retained records, intake slots stage the disk store's
 * windows.  Each has its own transfer set.  The disk index is the
 * composite's catalogue: every record in memory has a disk index node --
 * parked (complete in DRAM, no file yet), being written, or committed.
 *
 * put: dedupe on the disk index (READY with its row: PRESENT; a write or
 *   copy in flight: SKIPPED); SEL_OVERSIZE when the record with the
 *   ancestors it links under can never fit the disk limit; then the memory
 *   store's put, with the disk parent pinned until the record is parked
 *   under it.  When memory cannot hold it now -- its warm slots are held by
 *   dirty (parked) records, copies or reads in flight -- the put is
 *   SEL_RETRY with memory's reason (INFLIGHT or SLABS): no copy, so the
 *   worker holds no GPU pin while the disk catches up (design 2.10 "when a
 *   pool is exhausted by pinned records, copy-out is skipped and counted,
 *   never waited for").  Streaming such a record to disk instead would keep
 *   its GPU checkpoint pinned for a whole disk write, and with the warm
 *   tier full every publication would: the GPU rows fill with pins and
 *   admission stalls (docs/performance.md, serving).  Only a record larger
 *   than the warm pool (memory's SEL_OVERSIZE), which can never be
 *   retained, streams through intake without retention (design 2.4), at
 *   most STREAM_PUTS at once (beyond: SEL_RETRY, INFLIGHT).  When the copy-out lands
 *   (SEL_EV_STORED from memory) the record is parked: indexed READY in the
 *   disk index with DRAM's packing decisions and its file bytes charged
 *   (evicting committed leaves) or, when that cannot be done now, indexed
 *   uncharged and charged later; the memory copy is pinned by the
 *   composite, so it is never evicted and keeps its row until its file
 *   commits (this is the "NOEVICT on dirty" rule, done with a pin).
 *
 * Maintenance (every poll but during close): uncharged parked records try
 *   to charge again; when free slots + clean (durable, unpinned) memory slots + slots whose
 *   writes are in flight fall below 2 x intake -- or free warm + clean +
 *   writing slots below what the last refused put needed (want_slots), a
 *   need the design's write-ahead bound allows for -- writes start for parked
 *   records in park order (oldest first), each from its topmost parked
 *   ancestor down, while the slots being written stay below the larger of
 *   the two (so at most that plus one record is ever written ahead).  A write is
 *   the disk store's write_from of the memory slots themselves (no copy).
 *   Its completion makes the memory copy durable (unpinned, evictable).
 *   ENOSPC and EDQUOT keep it parked and pause writes for a backoff that
 *   doubles from 50 ms to 2 s; any other error drops the record (and its
 *   descendants) from both tiers, counted as dropped io_error.
 *
 * lookup runs on the disk index (parked and in-flight records included);
 *   the hit's tier is memory when the memory store finds the same endpoint.
 *
 * fetch: the memory store's fetch when its chain is complete in memory.
 *   Otherwise read-through: every chain node not in memory gets warm slots
 *   from the memory store (which evicts durable unpinned residents), is
 *   read with read_into (pages; the endpoint also its row), becomes a
 *   durable memory resident, and the memory store's fetch uploads the
 *   chain.  Read-through needs each node it reads to link in memory (its
 *   parent in memory or read too, or itself a root) and the chain to fit in
 *   free plus clean warm slots; otherwise the disk store's fetch streams
 *   the chain through intake straight to the ticket, evicting nothing.  (A
 *   chain whose first node's parent is neither in memory nor a root is
 *   therefore streamed, not retained: a simplification of design 2.4.)
 *
 * Disk removal (eviction, corruption, drops, expiry) removes the memory
 *   copy too: at once, or when the copy's pins are released.
 *
 * Progress (selene.h SEL_EV_PROGRESS): after a put was refused (SEL_RETRY)
 *   or deferred, the next poll in which capacity came back without a
 *   STORED or FETCHED event ends with one SEL_EV_PROGRESS: a maintenance
 *   write committed (its memory copy durable, so evictable), a terminal
 *   write error or a removal freed memory slots, a read-through failed and
 *   gave back its reserved slots, a streamed put failed for good (stream
 *   room), or an inner store reported progress.  A deferral or ENOSPC
 *   write is never progress.  Then want_slots is forgotten: the retry it
 *   wakes, if still refused, sets it again.
 *
 * Expiry (design 2.5): the disk index is the catalogue, so only the disk
 *   store sweeps (the memory store is opened with no max age); every
 *   refresh reaches the disk index -- publication parks under the disk
 *   parent, PRESENT and touch go to both stores, and every fetch touches
 *   the disk record whichever tier serves it.  An expired record leaves
 *   both tiers, a parked one too (it is DRAM-only: dropped, not written),
 *   and each tier counts it.
 *
 * Close: first the accepted transfers (puts land and park, reads through
 *   finish, maintenance writes end), then, with drain_on_shutdown, the
 *   drain of the parked records (store_drain.c, design 2.5), then both
 *   stores close (their transfers drain before memory is released); if
 *   either cannot drain, the pool is leaked.
 *
 * ONE RECORD'S STATES
 *
 * A record of the composite lives in both inner stores at once; its state
 * is the pair (memory copy, disk node) and what the composite holds for
 * it.  cs_state() derives it, and the checker verifies that every record
 * is in one of these states and nowhere in between:
 *
 *   state            memory copy               disk node              composite holds
 *   ---------------  ------------------------  ---------------------  -------------------------
 *   COPYING          PENDING, pinned by its    none (the disk parent  a cput (puts list)
 *                    copy-out job              pinned)
 *   PARKED           READY, pinned (dirty)     READY, DS_PARKED, no   --
 *                                              file, not evictable
 *                                              (charged or not)
 *   WRITING          READY, pinned (dirty)     PARKED, writing        a cwrite (writes list)
 *   DURABLE          READY, unpinned by us,    READY, committed file  --
 *                    evictable
 *   DISK_ONLY        none                      READY, committed file  --
 *   RESERVED         PENDING, pinned           READY, file, pinned    a cfetch (fetches list)
 *                    (sel_memory_store_reserve) by read_into
 *   STREAMING        none                      PENDING, a put stream  streaming count
 *   PENDING_REMOVAL  any, pinned by a reader   none                   pend_rm entry
 *   (DOOMED)         any                       doomed: removed with   --
 *                                              its descendants at its
 *                                              last unpin
 *   (FAILED)         PENDING, failed, no slots none                   --
 *                    (kept for its children)
 *
 * Transitions: put -> COPYING -> (copy-out lands) PARKED -> (maintenance or
 * the drain) WRITING -> (commit) DURABLE; WRITING -> (ENOSPC) PARKED;
 * WRITING -> (terminal error) dropped from both.  DURABLE -> (memory
 * eviction) DISK_ONLY -> (read-through) RESERVED -> (reads land) DURABLE.
 * A record larger than warm memory: put -> STREAMING -> DISK_ONLY.  Disk
 * removal (eviction, corruption, drop, expiry) of any state: the memory
 * copy goes at once, or becomes PENDING_REMOVAL until its pins go.
 * Completions are told apart by who reports them: the memory store's
 * events (copy-outs), the disk store's events (streams and its own
 * fetches), and its two hooks -- written for a write_from (its cwrite),
 * read for a read_into (its cfetch).
 *
 * INVARIANTS (verified by sel_composite_store_check)
 *
 *   1. Every record is in one state of the table above: in particular
 *      every memory record has a disk index node, except copies whose
 *      removal waits for their pins (PENDING_REMOVAL) and copies in flight.
 *   2. Every parked disk record has a READY memory copy pinned by the
 *      composite; a record is pinned by the composite exactly while it is
 *      parked (dirty) or its read-through is in flight.
 *   3. writing_slots is the sum of the memory slots of records whose writes
 *      are in flight, and each of them is WRITING.
 *   4. The memory store's and the disk store's checks pass.
 *   5. streaming counts the disk store's put streams whose events the
 *      composite has not seen; put starts none while it is STREAM_PUTS.
 */
#include "store_composite_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "eos.h"
#include "internal.h"
#include "record.h"
#include "slab.h"

#define POLL_BATCH 32

static const struct sel_store_ops cs_ops;

struct comp_store *sel_cs_of(sel_store *s) { return sel_store_checked(s, &cs_ops); }

bool cs_past(uint64_t deadline_ns) { return deadline_ns && eos_now_ns() >= deadline_ns; }

/* ---- removals and tickets -------------------------------------------------------- */

static void rm_push(struct comp_store *cs, const sel_key *key)
{
	if (cs->n_rm == cs->cap_rm) {
		size_t n = cs->cap_rm ? cs->cap_rm * 2 : 16;
		sel_key *k = realloc(cs->pend_rm, n * sizeof(*k));
		if (!k)
			abort(); /* the subset invariant needs it */
		cs->pend_rm = k;
		cs->cap_rm = n;
	}
	cs->pend_rm[cs->n_rm++] = *key;
}

/* Remove key's memory copy now, or once its pins go. */
static void mem_remove(struct comp_store *cs, const sel_key *key)
{
	if (sel_memory_store_remove(cs->mem, key) == -EBUSY)
		rm_push(cs, key);
	else
		cs->pg.released = true;
}

/* Remove pending memory copies that can go now (until no progress). */
static void rm_flush(struct comp_store *cs)
{
	bool more = true;
	while (more && cs->n_rm) {
		more = false;
		size_t keep = 0;
		for (size_t i = 0; i < cs->n_rm; i++) {
			int rc = sel_memory_store_remove(cs->mem, &cs->pend_rm[i]);
			if (rc == -EBUSY) {
				cs->pend_rm[keep++] = cs->pend_rm[i];
			} else {
				more = true;
				cs->pg.released = true;
			}
		}
		cs->n_rm = keep;
	}
}

bool cs_rm_pending(const struct comp_store *cs, const sel_key *key)
{
	for (size_t i = 0; i < cs->n_rm; i++)
		if (sel_key_eq(&cs->pend_rm[i], key))
			return true;
	return false;
}

/* The disk store dropped key: the memory copy goes too (an expired record
 * leaves both tiers, design 2.5; a copy in flight keeps its slots until
 * its pins go). */
static void on_removed(void *ctx, const sel_key *key, bool parked, bool expired)
{
	struct comp_store *cs = ctx;
	struct sel_memory_view v;
	if (sel_memory_store_view(cs->mem, key, &v) != 0)
		return;
	if (expired)
		cs->st.tier[SEL_TIER_MEMORY].expired++;
	if (parked)
		sel_memory_store_unpin(cs->mem, key); /* the dirty pin */
	mem_remove(cs, key);
}

static struct cticket *tk_find(struct comp_store *cs, uint64_t ticket)
{
	for (size_t i = 0; i < cs->n_tk; i++)
		if (cs->tk[i].ticket == ticket)
			return &cs->tk[i];
	return NULL;
}

int cs_tk_add(struct comp_store *cs, uint64_t ticket, sel_tier tier, uint64_t bytes,
	      uint64_t submit_ns)
{
	if (cs->n_tk == cs->cap_tk) {
		size_t n = cs->cap_tk ? cs->cap_tk * 2 : 16;
		struct cticket *t = realloc(cs->tk, n * sizeof(*t));
		if (!t)
			return eos_fail(-ENOMEM, "composite store: out of memory");
		cs->tk = t;
		cs->cap_tk = n;
	}
	cs->tk[cs->n_tk++] = (struct cticket){ticket, tier, bytes, submit_ns};
	return 0;
}

/* ---- maintenance: writes ------------------------------------------------------------ */

static void arm_timer(struct comp_store *cs)
{
	struct itimerspec it = {0};
	if (cs->backoff_until) {
		uint64_t now = eos_now_ns();
		uint64_t d = cs->backoff_until > now ? cs->backoff_until - now : 1;
		it.it_value.tv_sec = (time_t)(d / 1000000000u);
		it.it_value.tv_nsec = (long)(d % 1000000000u);
	}
	(void)timerfd_settime(cs->tfd, 0, &it, NULL);
	cs->tfd_armed = cs->backoff_until != 0;
}

int cs_write_start(struct comp_store *cs, const sel_key *key)
{
	struct sel_memory_view v;
	struct sel_disk_record_info di;
	if (sel_memory_store_view(cs->mem, key, &v) != 0 || !v.ready)
		return -ENOENT;
	if (sel_disk_store_record(cs->disk, key, &di) != 0)
		return -ENOENT;
	if (di.tail > v.tail_pages || (di.has_row && (!v.has_row || !v.n_row_slots)))
		return -EINVAL; /* cannot happen: the copy is pinned since it parked */
	uint32_t icap = cs->ranks * (v.n_row_slots + 1), n_iov = 0;
	void **pages = malloc(((size_t)di.tail + 1) * sizeof(void *));
	struct iovec *iov = malloc((size_t)icap * sizeof(*iov));
	struct cwrite *w = calloc(1, sizeof(*w));
	int rc = -ENOMEM;
	if (!pages || !iov || !w)
		goto out;
	/* A full-chain memory copy of a linked record: its last di.tail pages. */
	rc = sel_store_pool_map(cs->sp, di.flags, v.slots, v.n_page_slots,
				di.has_row ? v.n_row_slots : 0, v.tail_pages - di.tail, di.tail,
				pages, iov, icap, &n_iov);
	if (rc)
		goto out;
	w->key = *key;
	w->slots = v.n_page_slots + v.n_row_slots;
	w->bytes = di.bytes;
	rc = sel_disk_store_write_from(cs->disk, key, pages, iov, n_iov, w);
	if (rc == 0) {
		cwrites_push(&cs->writes, w);
		cs->writing_slots += w->slots;
		w = NULL;
		if (cs->writing_slots > cs->g.max_writing_slots)
			cs->g.max_writing_slots = cs->writing_slots;
		cs->g.writes_started++;
	}
out:
	free(pages);
	free(iov);
	free(w);
	return rc;
}

/* Whether key is held for the next level (design 2.15: a parked record
 * the pool copies straight from DRAM): not written meanwhile, so it is
 * offered once, from DRAM, and never again through its disk write. */
static bool held_below(struct comp_store *cs, const sel_key *key)
{
	return sel_core_cascade_holds(sel_store_core(cs->disk), key);
}

/* The topmost parked ancestor of key that could be written now (key
 * itself when none): ancestors commit first. */
static sel_key write_target(struct comp_store *cs, const sel_key *key)
{
	sel_key best = *key;
	struct sel_disk_record_info di;
	sel_key cur = *key;
	while (sel_disk_store_record(cs->disk, &cur, &di) == 0 && !di.is_root) {
		sel_key p = di.parent;
		struct sel_disk_record_info pi;
		if (sel_disk_store_record(cs->disk, &p, &pi) != 0 || !pi.parked)
			break;
		if (!pi.writing && pi.charged && !held_below(cs, &p))
			best = p;
		cur = p;
	}
	return best;
}

/* Whether memory is below its clean floor (2 x intake of free, clean and
 * writing slots) or below what the last refused put needed. */
static bool below_floor(struct comp_store *cs, uint64_t floor)
{
	uint64_t in_use, pinned, free_warm;
	sel_memory_store_counts(cs->mem, &in_use, &pinned, &free_warm);
	uint64_t free_slots = sel_slab_free_count(cs->sp->pool);
	uint64_t clean = in_use - pinned;
	return free_slots + clean + cs->writing_slots < floor ||
	       free_warm + clean + cs->writing_slots < cs->want_slots;
}

static void maintain(struct comp_store *cs)
{
	/* Uncharged parked records: try again (evictions may make room). */
	sel_key k = {0};
	while (sel_disk_store_uncharged(cs->disk) &&
	       sel_disk_store_next_parked(cs->disk, &k) == 1) {
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, &k, &di) == 0 && !di.charged)
			(void)sel_disk_store_charge(cs->disk, &k);
	}
	uint64_t now = eos_now_ns();
	if (cs->backoff_until && now < cs->backoff_until)
		return;
	if (cs->backoff_until) {
		cs->backoff_until = 0;
		arm_timer(cs);
	}
	uint64_t floor = 2 * cs->intake;
	uint64_t bound = floor > cs->want_slots ? floor : cs->want_slots;
	memset(&k, 0, sizeof k);
	while (sel_disk_store_next_parked(cs->disk, &k) == 1) {
		if (!below_floor(cs, floor) || cs->writing_slots >= bound)
			break; /* enough room, or the write-ahead bound */
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, &k, &di) != 0 || di.writing || !di.charged ||
		    held_below(cs, &k))
			continue;
		sel_key t = write_target(cs, &k);
		if (cs_write_start(cs, &t) != 0 && !sel_key_eq(&t, &k))
			(void)cs_write_start(cs, &k);
	}
}

/* The disk store's written hook: a write_from ended. */
static void on_written(void *ctx, void *arg, int status)
{
	struct comp_store *cs = ctx;
	struct cwrite *w = arg;
	cwrites_del(&cs->writes, w);
	cs->writing_slots -= w->slots;
	cs->g.writes_done++;
	if (cs->draining)
		cs_drain_write_done(cs, w, status);
	if (status == 0) {
		sel_memory_store_unpin(cs->mem, &w->key); /* durable: evictable now */
		cs->backoff_ns = 0;
		cs->pg.released = true;
	} else if (status == -ENOSPC || status == -EDQUOT) {
		/* Keep it parked; pause writes for a short, growing backoff. */
		cs->backoff_ns = cs->backoff_ns ? cs->backoff_ns * 2 : BACKOFF_MIN_NS;
		if (cs->backoff_ns > BACKOFF_MAX_NS)
			cs->backoff_ns = BACKOFF_MAX_NS;
		cs->backoff_until = eos_now_ns() + cs->backoff_ns;
		cs->g.writes_retried++;
		arm_timer(cs);
	} else {
		/* Terminal: drop it (and its descendants) from both tiers. */
		(void)sel_disk_store_drop(cs->disk, &w->key, SEL_DISK_DROP_IO_ERROR);
	}
	free(w);
}

/* ---- put ------------------------------------------------------------------------------ */

/* Memory can never retain cp: stream it to disk without retention (design
 * 2.4), a bounded number at once. */
static sel_outcome put_stream(struct comp_store *cs, const sel_published *cp, sel_retry_reason *why)
{
	if (cs->streaming >= STREAM_PUTS) {
		eos_fail(-EAGAIN,
			 "composite store: %u records larger than warm memory are streaming"
			 " already",
			 cs->streaming);
		*why = SEL_RETRY_INFLIGHT;
		return SEL_RETRY;
	}
	sel_retry_reason dwhy = SEL_RETRY_NONE;
	sel_outcome d = sel_store_put(cs->disk, cp, &dwhy);
	if (d == SEL_QUEUED) {
		cs->st.inflight_out++;
		cs->streaming++;
		cs->g.streamed++;
	} else if (d == SEL_RETRY) {
		*why = dwhy;
	}
	return d;
}

/* The memory put queued: remember it (COPYING) until its copy-out lands. */
static void put_queued(struct comp_store *cs, const sel_published *cp, struct cput *p)
{
	p->checkpoint = cp->checkpoint;
	p->key = cp->key;
	p->parent = cp->parent;
	p->bucket = cp->bucket;
	p->n_pages = cp->n_pages;
	p->tail = cp->tail;
	p->parent_pinned =
		!sel_key_is_none(&cp->parent) && sel_disk_store_pin(cs->disk, &cp->parent) == 0;
	cputs_push(&cs->puts, p);
	cs->st.inflight_out++;
}

static sel_outcome put_inner(struct comp_store *cs, const sel_published *cp, sel_retry_reason *why)
{
	if (cs->closed || cs->stopped) {
		eos_fail(SEL_ESTOPPED, "composite store: %s", cs->closed ? "closed" : "stopped");
		return SEL_SKIPPED;
	}
	struct sel_disk_record_info di;
	if (sel_disk_store_record(cs->disk, &cp->key, &di) == 0) {
		if (di.ready && di.has_row && !di.doomed) {
			sel_store_touch(cs->disk, &cp->key);
			sel_store_touch(cs->mem, &cp->key);
			return SEL_PRESENT;
		}
		return SEL_SKIPPED; /* in flight, failed or page-only */
	}
	if (!sel_disk_store_fits(cs->disk, cp)) {
		cs->st.tier[SEL_TIER_DISK].dropped_oversize++;
		eos_fail(SEL_EOVERSIZE,
			 "composite store: checkpoint %" PRIu64 " with its ancestors "
			 "exceeds the disk limit",
			 cp->checkpoint);
		return SEL_OVERSIZE;
	}
	struct cput *p = calloc(1, sizeof(*p));
	if (!p) {
		eos_fail(-ENOMEM, "composite store: out of memory");
		return SEL_SKIPPED;
	}
	sel_retry_reason mwhy = SEL_RETRY_NONE;
	sel_outcome o = sel_store_put(cs->mem, cp, &mwhy);
	if (o == SEL_QUEUED) {
		put_queued(cs, cp, p);
		return SEL_QUEUED;
	}
	free(p);
	if (o == SEL_OVERSIZE)
		return put_stream(cs, cp, why);
	if (o == SEL_RETRY) {
		/* Memory cannot take it now (dirty records, copies or reads hold
		 * its slots, or its queue is full): no copy and no GPU pin;
		 * maintenance writes make room and PROGRESS says so. */
		*why = mwhy;
		if (mwhy == SEL_RETRY_INFLIGHT || mwhy == SEL_RETRY_SLABS) {
			uint64_t need = sel_memory_store_refused_need(cs->mem);
			if (need > cs->want_slots)
				cs->want_slots = need;
			cs->g.refused_full++;
		}
	}
	if (o == SEL_PRESENT)
		return SEL_SKIPPED; /* a copy whose disk record just went */
	return o;
}

static sel_outcome cs_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct comp_store *cs = sel_cs_of(s);
	sel_retry_reason reason = SEL_RETRY_NONE;
	sel_outcome o = cp ? put_inner(cs, cp, &reason) : SEL_SKIPPED;
	sel_put_account(&cs->st, &cs->pg, o, reason, why);
	debug_check(cs);
	return o;
}

/* The memory copy-out of p landed: park it (COPYING -> PARKED). */
static void park(struct comp_store *cs, struct cput *p, sel_event *ev)
{
	struct sel_memory_view v;
	int rc = sel_memory_store_view(cs->mem, &p->key, &v);
	if (rc == 0 && v.ready) {
		struct sel_disk_park dp = {
			.key = p->key, .parent = p->parent, .bucket = p->bucket, .row = v.has_row};
		dp.flags = (v.pages_packed ? SEL_RECORD_PAGES_REPLICATED : 0) |
			   (v.row_packed ? SEL_RECORD_ROW_REPLICATED : 0);
		/* Linked on disk when the parent is there (pinned since the put),
		 * else a root holding the whole chain. */
		struct sel_disk_record_info pi;
		bool linked = !sel_key_is_none(&p->parent) &&
			      sel_disk_store_record(cs->disk, &p->parent, &pi) == 0 && !pi.doomed;
		dp.tail = linked ? p->tail : p->n_pages;
		if (dp.tail > v.tail_pages) {
			rc = -ESTALE; /* memory holds only the tail, the disk needs it all */
		} else {
			bool charged;
			rc = sel_disk_store_park(cs->disk, &dp, &charged);
			if (rc == 0)
				(void)sel_memory_store_pin(cs->mem, &p->key); /* dirty */
			else if (rc == -EEXIST)
				rc = 0; /* a streamed copy committed meanwhile: durable */
		}
	}
	if (rc != 0) {
		/* Cannot be kept in both tiers: drop the memory copy. */
		if (sel_memory_store_remove(cs->mem, &p->key) == -EBUSY)
			rm_push(cs, &p->key);
		if (rc == SEL_EOVERSIZE)
			cs->st.tier[SEL_TIER_DISK].dropped_oversize++;
		ev->type = SEL_EV_STORE_FAILED;
		ev->outcome = SEL_SKIPPED;
		ev->error = rc;
		cs->st.store_failures++;
	}
	if (p->parent_pinned)
		sel_disk_store_unpin(cs->disk, &p->parent);
}

static struct cput *put_take(struct comp_store *cs, uint64_t checkpoint, const sel_key *key)
{
	for (struct cput *p = cs->puts.head; p; p = p->next)
		if (p->checkpoint == checkpoint && sel_key_eq(&p->key, key)) {
			cputs_del(&cs->puts, p);
			return p;
		}
	return NULL;
}

/* ---- poll ---------------------------------------------------------------------------------- */

/* An inner store's PROGRESS is ours to announce; a deferral passing
 * through is a refusal of ours (the worker waits for our progress).
 * Returns true when ev is consumed (PROGRESS). */
static bool note_event(struct comp_store *cs, const sel_event *ev)
{
	if (ev->type == SEL_EV_PROGRESS) {
		cs->pg.released = true;
		return true;
	}
	if (ev->type == SEL_EV_STORE_FAILED && ev->outcome == SEL_DEFERRED)
		sel_progress_refuse(&cs->pg);
	return false;
}

static void mem_event(struct comp_store *cs, sel_event *ev)
{
	if (note_event(cs, ev))
		return;
	if (ev->type == SEL_EV_STORED || ev->type == SEL_EV_STORE_FAILED) {
		struct cput *p = put_take(cs, ev->checkpoint, &ev->key);
		if (p) {
			cs->st.inflight_out--;
			if (ev->type == SEL_EV_STORED)
				park(cs, p, ev);
			else if (p->parent_pinned)
				sel_disk_store_unpin(cs->disk, &p->parent);
			free(p);
		}
		if (ev->type == SEL_EV_STORE_FAILED && ev->outcome != SEL_DEFERRED)
			cs->st.store_failures++;
		sel_evq_push(&cs->evq, ev);
		return;
	}
	struct cticket *t = tk_find(cs, ev->ticket);
	cs->st.inflight_in--;
	if (t) {
		ev->tier = t->tier;
		ev->bytes = t->bytes;
		uint64_t now = eos_now_ns();
		ev->duration_ns = now > t->submit_ns ? now - t->submit_ns : ev->duration_ns;
		*t = cs->tk[--cs->n_tk];
	}
	if (ev->type == SEL_EV_FETCH_FAILED)
		cs->st.fetch_failures++;
	sel_evq_push(&cs->evq, ev);
}

static void disk_event(struct comp_store *cs, const sel_event *ev)
{
	if (note_event(cs, ev))
		return;
	if (ev->type == SEL_EV_STORED || ev->type == SEL_EV_STORE_FAILED) {
		/* A streamed put ended (write_from completions come through the
		 * written hook, not as events). */
		cs->st.inflight_out--;
		if (cs->streaming)
			cs->streaming--;
		if (ev->type == SEL_EV_STORE_FAILED && ev->outcome != SEL_DEFERRED) {
			cs->st.store_failures++;
			cs->pg.released = true; /* stream room */
		}
		if (ev->type == SEL_EV_STORE_FAILED && ev->outcome == SEL_DEFERRED)
			cs->st.outcomes[SEL_DEFERRED]++;
	} else {
		cs->st.inflight_in--;
		if (ev->type == SEL_EV_FETCH_FAILED)
			cs->st.fetch_failures++;
	}
	sel_evq_push(&cs->evq, ev);
}

bool cs_step(struct comp_store *cs)
{
	sel_event ev[POLL_BATCH];
	bool any = false;
	int n;
	do {
		n = sel_store_poll(cs->disk, ev, POLL_BATCH); /* runs the write/read hooks */
		for (int i = 0; i < n; i++)
			disk_event(cs, &ev[i]);
		any |= n > 0;
	} while (n == POLL_BATCH);
	do {
		n = sel_store_poll(cs->mem, ev, POLL_BATCH);
		for (int i = 0; i < n; i++)
			mem_event(cs, &ev[i]);
		any |= n > 0;
	} while (n == POLL_BATCH);
	size_t before = cs->n_rm;
	rm_flush(cs);
	any |= cs->n_rm != before;
	cs_fetches_advance(cs);
	return any;
}

static int cs_poll(sel_store *s, sel_event *out, size_t cap)
{
	struct comp_store *cs = sel_cs_of(s);
	cs_step(cs);
	if (!cs->closed)
		maintain(cs);
	/* What the events and maintenance queued on the inner stores (their
	 * kicks only: deferral starts with the caller's own flush). */
	sel_core_flush((struct sel_core *)cs->disk);
	sel_core_flush((struct sel_core *)cs->mem);
	if (sel_progress_due(&cs->pg)) {
		sel_event pe = {.type = SEL_EV_PROGRESS};
		sel_evq_push(&cs->evq, &pe);
		cs->want_slots = 0;
		cs->g.progress++;
	}
	size_t n = sel_evq_take(&cs->evq, out, cap);
	uint64_t v;
	/* A fired backoff timer (one-shot: read back once, no syscall while
	 * none is set). */
	if (cs->tfd_armed && read(cs->tfd, &v, sizeof v) == (ssize_t)sizeof v)
		cs->tfd_armed = false;
	bool ready = false;
	for (const struct cfetch *f = cs->fetches.head; f && !ready; f = f->next)
		ready = f->read_done;
	sel_evq_rearm(&cs->evq, ready);
	debug_check(cs);
	return (int)n;
}

/* ---- lookup and fetch ----------------------------------------------------------------------- */

static int cs_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_hit *hit)
{
	struct comp_store *cs = sel_cs_of(s);
	cs->st.lookups++;
	int rc = sel_store_lookup(cs->disk, h, resident, limit, hit);
	if (rc <= 0)
		return rc;
	sel_hit mh;
	if (sel_store_lookup(cs->mem, h, resident, limit, &mh) == 1 &&
	    sel_key_eq(&mh.key, &hit->key))
		hit->tier = SEL_TIER_MEMORY;
	cs->st.hits++;
	return 1;
}

static int cs_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct comp_store *cs = sel_cs_of(s);
	if (cs->closed || cs->stopped)
		return eos_fail(SEL_ESTOPPED, "composite store: %s",
				cs->closed ? "closed" : "stopped");
	if (!hit || !in)
		return eos_fail(-EINVAL, "composite store: fetch without a hit or destination");
	if (in->n_pages != hit->pages)
		return eos_fail(-EINVAL,
				"composite store: inbound ticket %" PRIu64 " has %" PRIu32
				" pages, the hit uploads %" PRIu32,
				in->ticket, in->n_pages, hit->pages);
	uint64_t now = eos_now_ns();
	int rc;
	if (in->n_sums) {
		/* An overlapped restore's tail with its head's digests (issue
		 * 18): streamed from disk without retention, so only the tail's
		 * page records are read (a read-through reads whole records). */
		if ((rc = sel_store_fetch(cs->disk, hit, in)))
			return rc;
		cs->g.streamed++;
		goto fetched;
	}
	rc = sel_store_fetch(cs->mem, hit, in);
	if (rc == 0) {
		/* Without the entry the event keeps the memory store's own tier
		 * and bytes, which are right for a memory hit. */
		(void)cs_tk_add(cs, in->ticket, SEL_TIER_MEMORY, hit->bytes, now);
	} else if (rc != -ESTALE) {
		return rc;
	} else if ((rc = cs_read_through(cs, hit, in)) != 0) {
		if (rc < 0)
			return rc;
		/* Stream from disk without retention. */
		if ((rc = sel_store_fetch(cs->disk, hit, in)))
			return rc;
		cs->g.streamed++;
	}
fetched:
	/* A restore refreshes the catalogue's last use (design 2.5), whichever
	 * tier serves it. */
	sel_store_touch(cs->disk, &hit->key);
	cs->st.fetches++;
	cs->st.inflight_in++;
	debug_check(cs);
	return 0;
}

/* ---- the rest of the interface ------------------------------------------------------------------ */

static void cs_touch(sel_store *s, const sel_key *key)
{
	struct comp_store *cs = sel_cs_of(s);
	sel_store_touch(cs->disk, key);
	sel_store_touch(cs->mem, key);
	debug_check(cs);
}

static void cs_stats(sel_store *s, sel_stats *out)
{
	struct comp_store *cs = sel_cs_of(s);
	sel_stats m, d;
	sel_store_stats(cs->mem, &m);
	sel_store_stats(cs->disk, &d);
	*out = cs->st;
	out->transport = cs->sp->backend->name;
	out->slot_bytes = cs->sp->slot_bytes;
	out->slots_in_use = sel_slab_in_use(cs->sp->pool);
	out->slots_total = sel_slab_total(cs->sp->pool);
	out->intake_slots = sel_slab_intake(cs->sp->pool);
	out->parked_records = d.parked_records;
	out->packed_records = m.packed_records + d.packed_records;
	out->per_rank_records = m.per_rank_records + d.per_rank_records;
	out->abandoned_stores = d.abandoned_stores;
	out->spilled_bytes = d.spilled_bytes;
	out->read_through_bytes = d.read_through_bytes;
	out->reused_tokens = m.reused_tokens + d.reused_tokens;
	out->chains_rejected = d.chains_rejected; /* the catalogue's lookups */
	out->disk_io = d.disk_io;
	out->tier[SEL_TIER_MEMORY] = m.tier[SEL_TIER_MEMORY];
	out->tier[SEL_TIER_DISK] = d.tier[SEL_TIER_DISK];
	out->tier[SEL_TIER_DISK].dropped_oversize += cs->st.tier[SEL_TIER_DISK].dropped_oversize;
	out->tier[SEL_TIER_MEMORY].expired += cs->st.tier[SEL_TIER_MEMORY].expired;
	out->thread_wakes = m.thread_wakes + d.thread_wakes;
}

static void cs_describe(sel_store *s, sel_store_info *out)
{
	struct comp_store *cs = sel_cs_of(s);
	sel_store_info d;
	sel_store_describe(cs->disk, &d);
	out->disk_dir = d.disk_dir;
	out->disk_limit = d.disk_limit;
	out->disk_shared = d.disk_shared;
	out->scanned_records = d.scanned_records;
	out->disk_io = d.disk_io;
	out->disk_io_note = d.disk_io_note;
	if (cs->sp->warning[0])
		out->warning = cs->sp->warning;
}

static int cs_wait_fd(sel_store *s) { return sel_cs_of(s)->evq.epfd; }

static void cs_flush(sel_store *s)
{
	struct comp_store *cs = sel_cs_of(s);
	sel_store_flush(cs->disk);
	sel_store_flush(cs->mem);
}

static bool cs_busy(const struct comp_store *cs)
{
	return cs->puts.head || cs->writes.head || cs->fetches.head;
}

static int cs_close(sel_store *s, uint64_t deadline_ns)
{
	struct comp_store *cs = sel_cs_of(s);
	if (cs->closed)
		return cs->close_rc;
	/* Accepted transfers first: in-flight puts land and park, reads
	 * through finish, maintenance writes end. */
	for (;;) {
		cs_step(cs);
		if (!cs_busy(cs) || cs_past(deadline_ns))
			break;
		sel_evq_nap(&cs->evq, 5);
	}
	/* Then, with the drain, the parked records (design 2.5); past the
	 * deadline it only reports that nothing could be saved. */
	if (cs->drain)
		cs_drain(cs, deadline_ns);
	else
		cs_report_not_drained(cs);
	cs->closed = true;
	int rc = 0;
	if (sel_store_close(cs->mem, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (sel_store_close(cs->disk, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (rc) {
		cs->stopped = true;
		eos_fail(rc,
			 "composite store: copies or disk I/O did not drain by the deadline; the "
			 "slot pool is leaked");
	}
	cs->close_rc = rc;
	return rc;
}

static void cs_destroy(sel_store *s)
{
	struct comp_store *cs = sel_cs_of(s);
	struct cput *p;
	struct cwrite *w;
	struct cfetch *f;
	if (!cs)
		return;
	if (!cs->closed && (cs->mem || cs->disk))
		cs_close(s, eos_now_ns() + 10ull * 1000 * 1000 * 1000);
	sel_store_destroy(cs->mem);
	sel_store_destroy(cs->disk);
	if (cs->close_rc)
		sel_store_pool_leak(cs->sp);
	else
		sel_store_pool_destroy(cs->sp);
	while ((p = cputs_pop(&cs->puts)))
		free(p);
	while ((w = cwrites_pop(&cs->writes)))
		free(w);
	while ((f = cfetches_pop(&cs->fetches)))
		free(f);
	sel_evq_free(&cs->evq);
	if (cs->tfd >= 0)
		close(cs->tfd);
	free(cs->tk);
	free(cs->pend_rm);
	free(cs);
}

/* sel_store_page_digests (issue 18): from the memory copy when it holds
 * the hit's whole chain above its resident count (the pages of a prefix
 * are the same bytes whichever records hold them; a memory copy that lied
 * would only fail the recompute's comparison).  A chain read from disk
 * has none without reading its pages: -ENOTSUP. */
static int cs_page_digests(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t n,
			   uint64_t *out)
{
	struct comp_store *cs = sel_cs_of(s);
	int rc = sel_memory_store_page_digests(cs->mem, hit, first, n, out);
	if (rc == -ESTALE)
		return eos_fail(-ENOTSUP, "composite: the chain at %" PRIu64 " is not in memory",
				hit->key.consumed);
	return rc;
}

/* sel_store_drop (issue 18): the disk record goes (or its row), and the
 * disk store's removal hook takes the memory copy with it (on_removed), so
 * memory stays a subset of disk. */
static int cs_drop(sel_store *s, const sel_key *key)
{
	struct comp_store *cs = sel_cs_of(s);
	return sel_store_drop(cs->disk, key);
}

static const struct sel_store_ops cs_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "composite",
	.lookup = cs_lookup,
	.put = cs_put,
	.fetch = cs_fetch,
	.poll = cs_poll,
	.touch = cs_touch,
	.stats = cs_stats,
	.wait_fd = cs_wait_fd,
	.close = cs_close,
	.destroy = cs_destroy,
	.describe = cs_describe,
	.page_digests = cs_page_digests,
	.drop = cs_drop,
	.flush = cs_flush,
	.fetch_sums = true,
};

/* Both stores over one pool: the memory store never sweeps for expiry (the
 * disk index is the catalogue, and its removals take the memory copies
 * along); the disk store calls back on removals and completions. */
static int inner_open(struct comp_store *cs, const sel_store_config *cfg)
{
	sel_store_config mcfg = *cfg;
	mcfg.max_age_ns = 0;
	int rc = sel_memory_store_open_shared(&mcfg, cs->sp, &cs->mem);
	if (rc)
		return rc;
	struct sel_disk_store_hooks hooks = {
		.ctx = cs,
		.removed = on_removed,
		.written = on_written,
		.read = cs_read_done,
	};
	if ((rc = sel_disk_store_open_shared(cfg, cs->sp, &hooks, &cs->disk)))
		return rc;
	cs->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (cs->tfd < 0)
		return eos_fail(-errno, "composite store: timerfd: %s", strerror(errno));
	if ((rc = sel_evq_init(&cs->evq, "composite store")) ||
	    (rc = sel_evq_watch(&cs->evq, sel_store_wait_fd(cs->mem), "composite store")) ||
	    (rc = sel_evq_watch(&cs->evq, sel_store_wait_fd(cs->disk), "composite store")))
		return rc;
	return sel_evq_watch(&cs->evq, cs->tfd, "composite store");
}

int sel_composite_store_open(const sel_store_config *cfg, sel_store **out)
{
	struct comp_store *cs;
	int rc;
	*out = NULL;
	if (!cfg || !cfg->geometry)
		return eos_fail(-EINVAL, "composite store: no geometry");
	if (!cfg->memory_bytes || !cfg->disk_dir || !*cfg->disk_dir)
		return eos_fail(-EINVAL, "composite store: needs warm memory and a disk directory");
	if (!(cs = calloc(1, sizeof(*cs))))
		return eos_fail(-ENOMEM, "composite store: out of memory");
	cs->base.ops = &cs_ops;
	cs->base.page_tokens = cfg->geometry->page_tokens;
	cs->pt = cfg->geometry->page_tokens;
	cs->ranks = cfg->geometry->ranks;
	cs->evq.epfd = cs->evq.efd = cs->tfd = -1;
	cs->drain = cfg->drain_on_shutdown;
	cs->drain_ns = cfg->drain_ns;
	cs->drain_cb = cfg->drain_progress;
	cs->drain_ctx = cfg->drain_ctx;
	cs->closed = true; /* until open completes: destroy skips the drain */
	if ((rc = sel_store_pool_open(cfg, cfg->memory_bytes, "composite store", &cs->sp)) == 0) {
		cs->intake = cs->sp->intake;
		rc = inner_open(cs, cfg);
	}
	if (rc) {
		if (cs->mem)
			sel_store_close(cs->mem, 0);
		if (cs->disk)
			sel_store_close(cs->disk, 0);
		cs_destroy(&cs->base);
		return rc;
	}
	cs->closed = false;
	*out = &cs->base;
	debug_check(cs);
	return 0;
}

/* ---- checks and introspection ------------------------------------------------------------------ */

sel_store *sel_composite_store_memory(sel_store *s) { return sel_cs_of(s)->mem; }
sel_store *sel_composite_store_disk(sel_store *s) { return sel_cs_of(s)->disk; }

void sel_composite_store_gauges(sel_store *s, struct sel_composite_gauges *out)
{
	struct comp_store *cs = sel_cs_of(s);
	*out = cs->g;
	out->writing_slots = cs->writing_slots;
	out->write_ahead_bound = 2 * cs->intake > cs->want_slots ? 2 * cs->intake : cs->want_slots;
	out->want_slots = cs->want_slots;
	out->streaming = cs->streaming;
	out->backoff_until_ns = cs->backoff_until;
	out->busy = cs_busy(cs) || cs->streaming || cs->evq.n;
}

/* One record's state (the table in the header), or a name of why it is
 * in none. */
enum cstate {
	CS_NONE = 0,
	CS_COPYING,
	CS_PARKED,
	CS_WRITING,
	CS_DURABLE,
	CS_DISK_ONLY,
	CS_RESERVED,
	CS_STREAMING,
	CS_PENDING_REMOVAL,
	CS_DOOMED, /* any state above, its disk node doomed: removed at its last unpin */
	CS_FAILED, /* a memory copy whose copy-out failed, kept for its children */
	CS_INVALID,
};

static bool in_puts(const struct comp_store *cs, const sel_key *key)
{
	for (const struct cput *p = cs->puts.head; p; p = p->next)
		if (sel_key_eq(&p->key, key))
			return true;
	return false;
}

static bool in_writes(const struct comp_store *cs, const sel_key *key)
{
	for (const struct cwrite *w = cs->writes.head; w; w = w->next)
		if (sel_key_eq(&w->key, key))
			return true;
	return false;
}

static enum cstate cs_state(struct comp_store *cs, const sel_key *key, const char **why)
{
	struct sel_memory_view v;
	struct sel_disk_record_info di;
	bool mem = sel_memory_store_view(cs->mem, key, &v) == 0;
	bool disk = sel_disk_store_record(cs->disk, key, &di) == 0;
	*why = "";
	if (mem && cs_rm_pending(cs, key))
		return CS_PENDING_REMOVAL;
	if (disk && di.doomed)
		return CS_DOOMED; /* both copies go at its last unpin */
	if (disk && di.parked) {
		*why = "is parked without a pinned, complete memory copy";
		if (!mem || !v.ready || !v.pins)
			return CS_INVALID;
		*why = "is written without its write on the list, or the other way round";
		if (di.writing != in_writes(cs, key))
			return CS_INVALID;
		return di.writing ? CS_WRITING : CS_PARKED;
	}
	if (mem &&
	    !v.ready) /* a copy-out or a read in flight, or a failed copy kept for children */
		return in_puts(cs, key) ? CS_COPYING : disk && di.file ? CS_RESERVED : CS_FAILED;
	if (mem) {
		*why = disk ? "has a memory copy whose disk record has no file"
			    : "has a memory copy but no disk record";
		return disk && di.file ? CS_DURABLE : CS_INVALID;
	}
	return disk && di.file ? CS_DISK_ONLY : disk ? CS_STREAMING : CS_NONE;
}

/* Invariants 1 and 2 over every memory record and every parked one. */
static int check_states(struct comp_store *cs)
{
	size_t n = sel_memory_store_keys(cs->mem, NULL, 0);
	sel_key *keys = malloc((n ? n : 1) * sizeof(*keys));
	const char *why;
	int rc = 0;
	if (!keys)
		return eos_fail(-ENOMEM, "composite check: out of memory");
	sel_memory_store_keys(cs->mem, keys, n);
	for (size_t i = 0; i < n && !rc; i++)
		if (cs_state(cs, &keys[i], &why) == CS_INVALID)
			rc = eos_fail(SEL_ECORRUPT,
				      "composite: the record at %" PRIu64 " tokens %s",
				      keys[i].consumed, *why ? why : "is in no state of the table");
	free(keys);
	sel_key k = {0};
	while (!rc && sel_disk_store_next_parked(cs->disk, &k) == 1)
		if (cs_state(cs, &k, &why) == CS_INVALID)
			rc = eos_fail(SEL_ECORRUPT,
				      "composite: the record at %" PRIu64 " tokens %s", k.consumed,
				      why);
	return rc;
}

int sel_composite_store_check(sel_store *s)
{
	struct comp_store *cs = sel_cs_of(s);
	int rc;
	if ((rc = sel_memory_store_check(cs->mem)) || (rc = sel_disk_store_check(cs->disk)) ||
	    (rc = sel_slab_check(cs->sp->pool)) || (rc = check_states(cs)))
		return rc;
	uint64_t ws = 0;
	for (const struct cwrite *w = cs->writes.head; w; w = w->next)
		ws += w->slots;
	if (ws != cs->writing_slots)
		return eos_fail(SEL_ECORRUPT,
				"composite: writing slots %" PRIu64 ", counted %" PRIu64, ws,
				cs->writing_slots);
	if (cs->streaming > STREAM_PUTS)
		return eos_fail(SEL_ECORRUPT, "composite: %u streamed puts in flight, at most %d",
				cs->streaming, STREAM_PUTS);
	return 0;
}
