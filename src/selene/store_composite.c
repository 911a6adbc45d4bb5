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
 *   finish, maintenance writes end).  Then, with drain_on_shutdown, the
 *   drain (design 2.5): a plan of the parked records -- those a committed
 *   file links under first (its file needs them at the next start), then
 *   the rest, each group most recently used first, which puts every
 *   record after its parked ancestors (a parent is always more recent than
 *   its children in the access order) -- is written in order, at most four
 *   records and 2 x intake slots ahead; a record whose parked ancestor did not start is
 *   skipped, an uncharged one is charged only if the limit has room
 *   without evicting (committed files are preserved).  New writes stop at
 *   drain_ns and at the close deadline; started ones finish.  ENOSPC and
 *   EDQUOT send a record back to the park for up to three more passes
 *   (100, 200, 400 ms apart); other errors drop it.  Nothing of this fails
 *   the close.  Without the drain, drain_progress hears once, at close, how
 *   many DRAM-only records (and bytes) the stop loses, when it loses any
 *   (sel_drain_progress.off).  drain_progress hears of it about once a second and once at
 *   the end.  Then both stores close (their transfers drain before memory
 *   is released); if either cannot drain, the pool is leaked.
 *
 * INVARIANTS (verified by sel_composite_store_check)
 *
 *   1. Every memory record has a disk index node, except copies whose
 *      removal waits for their pins (the pending-removal list).
 *   2. Every parked disk record has a READY memory copy pinned by the
 *      composite; a record is pinned by the composite exactly while it is
 *      parked (dirty) or its read-through is in flight.
 *   3. writing_slots is the sum of the memory slots of records whose writes
 *      are in flight.
 *   4. The memory store's and the disk store's checks pass.
 *   5. streaming counts the disk store's put streams whose events the
 *      composite has not seen; put starts none while it is STREAM_PUTS.
 */
#include "store_composite.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "eos.h"
#include "internal.h"
#include "record.h"
#include "slab.h"
#include "store_common.h"
#include "store_disk.h"
#include "store_memory.h"
#include "store_pool.h"

#define BACKOFF_MIN_NS (50ull * 1000000)
#define BACKOFF_MAX_NS (2000ull * 1000000)
#define POLL_BATCH 32
#define DRAIN_WRITES 4           /* drain writes in flight at most: the time limit's overrun */
#define DRAIN_RETRIES 3          /* drain passes after a full filesystem */
#define DRAIN_BACKOFF_NS (100ull * 1000000) /* before the first; doubling, at most 400 ms */
/* Streamed puts (records larger than the warm pool) at once: each keeps its
 * GPU checkpoint pinned for a whole disk write; two let the next one's
 * copy-out overlap the last one's final write. */
#define STREAM_PUTS 2

/* A memory put whose copy-out has not landed. */
struct cput {
	uint64_t checkpoint;
	sel_key key, parent;
	sel_digest bucket;
	uint32_t n_pages, tail;
	bool parent_pinned;
	struct cput *next;
};

/* A write_from in flight. */
struct cwrite {
	sel_key key;
	uint64_t slots;
	uint64_t bytes;      /* the record's file bytes */
	struct cwrite *next;
};

/* The shutdown drain (design 2.5): its plan and what it did. */
struct cdrain {
	sel_key *plan;       /* parked records, in write order */
	size_t n, next;
	uint64_t start_ns, end_ns;  /* end: new writes stop (0: no limit) */
	uint64_t report_ns;         /* next progress report */
	uint64_t written, written_bytes, failed;
	uint64_t retried;           /* writes a full filesystem sent back */
	uint64_t retries_left;
	uint64_t resume_ns;         /* no new pass before this */
	uint32_t in_flight;         /* drain writes started, not done */
	bool time_up, deadline_hit, no_room, no_space;
};

/* A read-through fetch. */
struct cfetch {
	uint64_t ticket;
	sel_hit hit;
	uint32_t *dst;
	uint32_t n_dst, state_slot;
	uint32_t n;          /* chain nodes, ascending */
	sel_key *keys;
	uint8_t *role;       /* ROLE_* */
	uint32_t pending;    /* reads in flight */
	int status;
	bool read_done;
	uint64_t submit_ns;
	struct cfetch *next;
};
enum { ROLE_RESIDENT = 1, ROLE_READ = 2 };

/* A memory fetch the composite answers for (its tier and timing). */
struct cticket {
	uint64_t ticket;
	sel_tier tier;
	uint64_t bytes, submit_ns;
};

struct comp_store {
	sel_store base;
	struct sel_store_pool *sp;
	sel_store *mem, *disk;
	sel_record_layout rl;
	uint32_t pt, ranks;
	uint64_t intake;
	int epfd, tfd, efd;
	bool drain;
	uint64_t drain_ns;
	void (*drain_cb)(void *ctx, const sel_drain_progress *p);
	void *drain_ctx;
	struct cdrain dr;
	bool draining;

	struct cput *puts;
	struct cwrite *writes;
	struct cfetch *fetches;
	struct cticket *tk;
	size_t n_tk, cap_tk;
	sel_key *pend_rm;      /* memory copies to remove once unpinned */
	size_t n_rm, cap_rm;
	sel_event *evq;
	size_t evq_head, evq_n, evq_cap;

	uint64_t writing_slots;
	uint64_t want_slots;    /* warm slots the last refused put needed */
	uint32_t streaming;     /* streamed puts in flight */
	struct sel_progress pg;    /* refusals since the last PROGRESS, capacity back since */
	uint64_t backoff_until, backoff_ns;
	struct sel_composite_gauges g;
	bool closed, stopped;
	int close_rc;
	sel_stats st;           /* the composite's own counters */
};

#define CS(s) ((struct comp_store *)(s))

static void debug_check(struct comp_store *cs)
{
#ifdef SEL_DEBUG_CHECKS
	if (sel_composite_store_check(&cs->base) != 0) {
		fprintf(stderr, "sel_composite_store_check: %s\n", eos_errmsg());
		abort();
	}
#else
	(void)cs;
#endif
}

/* Make the wait descriptor readable: poll has work no thread announces. */
static void wake(struct comp_store *cs)
{
	uint64_t v = 1;
	if (cs->efd >= 0) {
		ssize_t w = write(cs->efd, &v, sizeof v);
		(void)w;
	}
}

static void ev_push(struct comp_store *cs, const sel_event *ev)
{
	if (cs->evq_n == cs->evq_cap) {
		size_t n = cs->evq_cap ? cs->evq_cap * 2 : 64;
		sel_event *q = malloc(n * sizeof(*q));
		if (!q)
			abort(); /* a lost event would leak the worker's pins */
		for (size_t i = 0; i < cs->evq_n; i++)
			q[i] = cs->evq[(cs->evq_head + i) % cs->evq_cap];
		free(cs->evq);
		cs->evq = q;
		cs->evq_cap = n;
		cs->evq_head = 0;
	}
	cs->evq[(cs->evq_head + cs->evq_n) % cs->evq_cap] = *ev;
	cs->evq_n++;
	wake(cs);
}

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

static bool rm_pending(const struct comp_store *cs, const sel_key *key)
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
	if (sel_memory_store_remove(cs->mem, key) == -EBUSY)
		rm_push(cs, key);
	else
		cs->pg.released = true;
}

static struct cticket *tk_find(struct comp_store *cs, uint64_t ticket)
{
	for (size_t i = 0; i < cs->n_tk; i++)
		if (cs->tk[i].ticket == ticket)
			return &cs->tk[i];
	return NULL;
}

static int tk_add(struct comp_store *cs, uint64_t ticket, sel_tier tier, uint64_t bytes,
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
}

/* Start the write of parked record key from its memory slots.  0, or an
 * error (nothing started). */
static int write_start(struct comp_store *cs, const sel_key *key)
{
	struct sel_memory_view v;
	struct sel_disk_record_info di;
	if (sel_memory_store_view(cs->mem, key, &v) != 0 || !v.ready)
		return -ENOENT;
	if (sel_disk_store_record(cs->disk, key, &di) != 0)
		return -ENOENT;
	if (di.tail > v.tail_pages || (di.has_row && (!v.has_row || !v.n_row_slots)))
		return -EINVAL; /* cannot happen: the copy is pinned since it parked */
	uint32_t n_slots = v.n_page_slots + v.n_row_slots;
	void **sa = malloc(((size_t)n_slots + di.tail + 1) * sizeof(void *));
	uint32_t icap = cs->ranks * (v.n_row_slots + 1);
	struct iovec *iov = malloc((size_t)icap * sizeof(*iov));
	struct cwrite *w = calloc(1, sizeof(*w));
	int rc = -ENOMEM;
	if (!sa || !iov || !w)
		goto out;
	for (uint32_t i = 0; i < n_slots; i++)
		sa[i] = sel_slab_addr(cs->sp->pool, v.slots[i]);
	void **pages = sa + n_slots;
	uint32_t off = v.tail_pages - di.tail; /* a full-chain memory copy of a linked record */
	for (uint32_t k = 0; k < di.tail; k++)
		pages[k] = sel_record_page_addr(&cs->rl, di.flags, sa, off + k);
	int n_iov = 0;
	if (di.has_row) {
		n_iov = sel_record_row_iov(&cs->rl, di.flags, sa + v.n_page_slots, v.n_row_slots, iov,
					   icap);
		if (n_iov < 0) {
			rc = n_iov;
			goto out;
		}
	}
	w->key = *key;
	w->slots = n_slots;
	w->bytes = di.bytes;
	rc = sel_disk_store_write_from(cs->disk, key, pages, iov, (uint32_t)n_iov,
				       (uint64_t)(uintptr_t)w);
	if (rc == 0) {
		w->next = cs->writes;
		cs->writes = w;
		w = NULL;
		cs->writing_slots += n_slots;
		if (cs->writing_slots > cs->g.max_writing_slots)
			cs->g.max_writing_slots = cs->writing_slots;
		cs->g.writes_started++;
	}
out:
	free(sa);
	free(iov);
	free(w);
	return rc;
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
		if (!pi.writing && pi.charged)
			best = p;
		cur = p;
	}
	return best;
}

static void maintain(struct comp_store *cs)
{
	/* Uncharged parked records: try again (evictions may make room). */
	sel_key k = {0};
	while (sel_disk_store_uncharged(cs->disk) && sel_disk_store_next_parked(cs->disk, &k) == 1) {
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
		uint64_t in_use, pinned, free_warm;
		sel_memory_store_counts(cs->mem, &in_use, &pinned, &free_warm);
		uint64_t free_slots = sel_slab_free_count(cs->sp->pool);
		uint64_t clean = in_use - pinned;
		if (free_slots + clean + cs->writing_slots >= floor &&
		    free_warm + clean + cs->writing_slots >= cs->want_slots)
			break;
		if (cs->writing_slots >= bound)
			break; /* the write-ahead bound */
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, &k, &di) != 0 || di.writing || !di.charged)
			continue;
		sel_key t = write_target(cs, &k);
		if (write_start(cs, &t) != 0 && !sel_key_eq(&t, &k))
			(void)write_start(cs, &k);
	}
}

static void write_done(struct comp_store *cs, struct cwrite *w, int status)
{
	struct cwrite **pp = &cs->writes;
	while (*pp && *pp != w)
		pp = &(*pp)->next;
	if (*pp)
		*pp = w->next;
	cs->writing_slots -= w->slots;
	cs->g.writes_done++;
	if (cs->draining) {
		if (cs->dr.in_flight)
			cs->dr.in_flight--;
		if (status == 0) {
			cs->dr.written++;
			cs->dr.written_bytes += w->bytes;
		} else if (status != -ENOSPC && status != -EDQUOT) {
			cs->dr.failed++;
		} else {
			cs->dr.retried++;
			cs->dr.no_space = true;
		}
	}
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

/* ---- read-through ------------------------------------------------------------------- */

static void cfetch_unlink(struct comp_store *cs, struct cfetch *f)
{
	struct cfetch **pp = &cs->fetches;
	while (*pp && *pp != f)
		pp = &(*pp)->next;
	if (*pp)
		*pp = f->next;
}

static void fetch_failed_event(struct comp_store *cs, uint64_t ticket, const sel_key *key,
			       uint64_t bytes, int status, uint64_t submit_ns)
{
	sel_event ev = {0};
	uint64_t now = eos_now_ns();
	ev.type = SEL_EV_FETCH_FAILED;
	ev.outcome = SEL_QUEUED;
	ev.error = status ? status : -EIO;
	ev.ticket = ticket;
	ev.key = *key;
	ev.tier = SEL_TIER_DISK;
	ev.bytes = bytes;
	ev.duration_ns = now > submit_ns ? now - submit_ns : 0;
	cs->st.fetch_failures++;
	cs->st.inflight_in--;
	ev_push(cs, &ev);
}

/* Release what a read-through holds: reserved copies settle, resident
 * pins drop. */
static void cfetch_release(struct comp_store *cs, struct cfetch *f, bool ok)
{
	if (ok) {
		for (uint32_t i = 0; i < f->n; i++)
			if (f->role[i] == ROLE_READ)
				sel_memory_store_settle(cs->mem, &f->keys[i], true);
	} else {
		for (uint32_t i = f->n; i-- > 0;)
			if (f->role[i] == ROLE_READ)
				sel_memory_store_settle(cs->mem, &f->keys[i], false);
	}
	for (uint32_t i = 0; i < f->n; i++)
		if (f->role[i] == ROLE_RESIDENT)
			sel_memory_store_unpin(cs->mem, &f->keys[i]);
}

static void cfetch_free(struct comp_store *cs, struct cfetch *f)
{
	cfetch_unlink(cs, f);
	free(f);
}

/* The reads landed: upload through the memory store, or stream from disk
 * when memory cannot serve the chain after all.  Returns false to retry
 * later (memory transfer queue full). */
static bool cfetch_upload(struct comp_store *cs, struct cfetch *f)
{
	sel_inbound in = {.ticket = f->ticket, .pages = f->dst, .n_pages = f->n_dst,
			  .state_slot = f->state_slot};
	if (f->status) {
		cfetch_release(cs, f, false);
		cs->pg.released = true; /* the reserved slots, the residents' pins */
		fetch_failed_event(cs, f->ticket, &f->hit.key, f->hit.bytes, f->status, f->submit_ns);
		cfetch_free(cs, f);
		return true;
	}
	/* Commit the copies (ancestors first) while still pinned, then fetch:
	 * the memory fetch pins them itself before ours drop. */
	for (uint32_t i = 0; i < f->n; i++) {
		if (f->role[i] != ROLE_READ)
			continue;
		(void)sel_memory_store_pin(cs->mem, &f->keys[i]);
		sel_memory_store_settle(cs->mem, &f->keys[i], true);
		f->role[i] = ROLE_RESIDENT;
	}
	int rc = sel_store_fetch(cs->mem, &f->hit, &in);
	if (rc == -EAGAIN)
		return false;
	if (rc == 0) {
		(void)tk_add(cs, f->ticket, SEL_TIER_DISK, f->hit.bytes, f->submit_ns);
		cs->g.read_through++;
	} else {
		rc = sel_disk_store_chain_on_disk(cs->disk, &f->hit.key, f->hit.resident)
			     ? sel_store_fetch(cs->disk, &f->hit, &in) : -ESTALE;
		if (rc == 0)
			cs->g.streamed++;
		else
			fetch_failed_event(cs, f->ticket, &f->hit.key, f->hit.bytes, rc, f->submit_ns);
	}
	cfetch_release(cs, f, true);
	cfetch_free(cs, f);
	return true;
}

static void read_done(struct comp_store *cs, struct cfetch *f, int status)
{
	if (status && !f->status)
		f->status = status;
	if (--f->pending == 0) {
		f->read_done = true;
		wake(cs); /* may be synchronous, with nothing else to wake poll */
	}
}

static void on_done(void *ctx, uint64_t cookie, int status)
{
	struct comp_store *cs = ctx;
	if (cookie & 1)
		read_done(cs, (struct cfetch *)(uintptr_t)(cookie & ~(uint64_t)1), status);
	else
		write_done(cs, (struct cwrite *)(uintptr_t)cookie, status);
}

/* Try read-through for hit: 0 started, 1 not eligible (stream instead),
 * or an error. */
static int read_through(struct comp_store *cs, const sel_hit *hit, const sel_inbound *in)
{
	/* The disk chain above resident, ascending. */
	uint32_t cap = 8, n = 0;
	sel_key *chain = malloc(cap * sizeof(*chain));
	struct sel_disk_record_info *info = malloc(cap * sizeof(*info));
	struct cfetch *f = NULL;
	int rc = 1;
	if (!chain || !info) {
		rc = -ENOMEM;
		goto out;
	}
	for (sel_key k = hit->key;;) {
		if (n == cap) {
			cap *= 2;
			sel_key *c2 = realloc(chain, cap * sizeof(*c2));
			if (c2)
				chain = c2;
			struct sel_disk_record_info *i2 = realloc(info, cap * sizeof(*i2));
			if (i2)
				info = i2;
			if (!c2 || !i2) {
				rc = -ENOMEM;
				goto out;
			}
		}
		if (sel_disk_store_record(cs->disk, &k, &info[n]) != 0 || !info[n].ready ||
		    info[n].doomed)
			goto out;
		chain[n++] = k;
		if (info[n - 1].is_root || info[n - 1].parent.consumed <= hit->resident)
			break;
		k = info[n - 1].parent;
	}
	for (uint32_t i = 0; i < n / 2; i++) { /* ascending */
		sel_key t = chain[i];
		chain[i] = chain[n - 1 - i];
		chain[n - 1 - i] = t;
		struct sel_disk_record_info u = info[i];
		info[i] = info[n - 1 - i];
		info[n - 1 - i] = u;
	}
	/* Exactly the nodes the lookup compared with the request's history
	 * (else the disk fetch refuses the hit as stale). */
	{
		uint64_t base = info[0].is_root ? 0 : info[0].parent.consumed;
		uint32_t skip = (uint32_t)(hit->resident / cs->pt - base / cs->pt);
		sel_digest dg;
		memset(&dg, 0, sizeof dg);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t used = info[i].tail - (i == 0 ? skip : 0);
			if (used || i + 1 == n)
				sel_chain_digest_add(&dg, &chain[i], used);
		}
		if (memcmp(dg.b, hit->chain.b, SEL_DIGEST_BYTES) != 0)
			goto out;
	}
	f = calloc(1, sizeof(*f) + n * (sizeof(sel_key) + 1) + (size_t)in->n_pages * sizeof(uint32_t));
	if (!f) {
		rc = -ENOMEM;
		goto out;
	}
	f->keys = (sel_key *)(f + 1);
	f->dst = (uint32_t *)(f->keys + n);
	f->role = (uint8_t *)(f->dst + in->n_pages);
	f->n = n;
	memcpy(f->keys, chain, n * sizeof(sel_key));
	memcpy(f->dst, in->pages, (size_t)in->n_pages * sizeof(uint32_t));
	f->n_dst = in->n_pages;
	f->state_slot = in->state_slot;
	f->ticket = in->ticket;
	f->hit = *hit;
	f->submit_ns = eos_now_ns();

	/* Roles and eligibility: a node read must link in memory. */
	uint64_t need = 0, have_pinned = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct sel_memory_view v;
		bool endpoint = i + 1 == n;
		if (sel_memory_store_view(cs->mem, &chain[i], &v) == 0) {
			if (v.ready && (!endpoint || v.has_row) && !rm_pending(cs, &chain[i])) {
				f->role[i] = ROLE_RESIDENT;
				have_pinned += v.n_page_slots + v.n_row_slots;
				continue;
			}
			goto out; /* a copy in another state: stream */
		}
		if (!info[i].file)
			goto out;
		bool root = info[i].is_root;
		bool linked = false;
		if (!root) {
			struct sel_memory_view pv;
			linked = (i > 0 && sel_key_eq(&chain[i - 1], &info[i].parent)) ||
				 (sel_memory_store_view(cs->mem, &info[i].parent, &pv) == 0 && pv.ready);
		}
		if (!root && !linked)
			goto out;
		f->role[i] = ROLE_READ;
		need += sel_memory_store_record_slots(cs->mem, info[i].tail, endpoint,
						      info[i].flags & SEL_RECORD_PAGES_REPLICATED,
						      info[i].flags & SEL_RECORD_ROW_REPLICATED);
	}
	uint64_t in_use, pinned, free_warm;
	sel_memory_store_counts(cs->mem, &in_use, &pinned, &free_warm);
	uint64_t clean = in_use - pinned;
	clean = clean > have_pinned ? clean - have_pinned : 0;
	if (need > free_warm + clean)
		goto out; /* would evict residents for an impossible admission */

	/* Pin the residents, reserve the rest (ancestors first). */
	for (uint32_t i = 0; i < n; i++)
		if (f->role[i] == ROLE_RESIDENT)
			(void)sel_memory_store_pin(cs->mem, &chain[i]);
	for (uint32_t i = 0; i < n; i++) {
		if (f->role[i] != ROLE_READ)
			continue;
		bool endpoint = i + 1 == n;
		const sel_key *parent = info[i].is_root ? NULL : &info[i].parent;
		int r = sel_memory_store_reserve(cs->mem, &chain[i], parent, &info[i].bucket,
						 info[i].tail, endpoint,
						 info[i].flags & SEL_RECORD_PAGES_REPLICATED,
						 endpoint && (info[i].flags & SEL_RECORD_ROW_REPLICATED));
		if (r != 0) {
			/* Undo: settle what was reserved, unpin residents. */
			for (uint32_t j = i; j < n; j++)
				if (f->role[j] == ROLE_READ)
					f->role[j] = 0;
			cfetch_release(cs, f, false);
			goto out;
		}
	}
	/* Read each reserved node into its slots. */
	f->next = cs->fetches;
	cs->fetches = f;
	f->pending = 1; /* held while submitting */
	for (uint32_t i = 0; i < n; i++) {
		if (f->role[i] != ROLE_READ)
			continue;
		bool endpoint = i + 1 == n;
		if (!endpoint && info[i].tail == 0)
			continue; /* owns no pages: the empty reserved copy stands in */
		struct sel_memory_view v;
		f->pending++;
		if (sel_memory_store_view(cs->mem, &chain[i], &v) != 0) {
			read_done(cs, f, -ESTALE);
			continue;
		}
		uint32_t ns = v.n_page_slots + v.n_row_slots;
		void **sa = malloc(((size_t)ns + info[i].tail + 1) * sizeof(void *));
		uint32_t icap = cs->ranks * (v.n_row_slots + 1);
		struct iovec *iov = malloc((size_t)icap * sizeof(*iov));
		int r = -ENOMEM;
		if (sa && iov) {
			for (uint32_t s = 0; s < ns; s++)
				sa[s] = sel_slab_addr(cs->sp->pool, v.slots[s]);
			void **pages = sa + ns;
			for (uint32_t k = 0; k < info[i].tail; k++)
				pages[k] = sel_record_page_addr(&cs->rl, info[i].flags, sa, k);
			int n_iov = 0;
			if (endpoint)
				n_iov = sel_record_row_iov(&cs->rl, info[i].flags, sa + v.n_page_slots,
							   v.n_row_slots, iov, icap);
			r = n_iov < 0 ? n_iov
				      : sel_disk_store_read_into(cs->disk, &chain[i], endpoint, pages, iov,
								 (uint32_t)n_iov,
								 (uint64_t)(uintptr_t)f | 1);
		}
		free(sa);
		free(iov);
		if (r != 0)
			read_done(cs, f, r);
	}
	read_done(cs, f, 0); /* the submission hold */
	f = NULL;
	rc = 0;
out:
	free(f);
	free(chain);
	free(info);
	return rc;
}

/* Read-throughs whose reads landed. */
static void fetches_advance(struct comp_store *cs)
{
	for (struct cfetch *f = cs->fetches, *next; f; f = next) {
		next = f->next;
		if (f->read_done)
			(void)cfetch_upload(cs, f);
	}
}

/* ---- put ------------------------------------------------------------------------------ */

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
		eos_fail(SEL_EOVERSIZE, "composite store: checkpoint %" PRIu64 " with its ancestors "
			 "exceeds the disk limit", cp->checkpoint);
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
		p->checkpoint = cp->checkpoint;
		p->key = cp->key;
		p->parent = cp->parent;
		p->bucket = cp->bucket;
		p->n_pages = cp->n_pages;
		p->tail = cp->tail;
		p->parent_pinned = !sel_key_is_none(&cp->parent) &&
				   sel_disk_store_pin(cs->disk, &cp->parent) == 0;
		p->next = cs->puts;
		cs->puts = p;
		cs->st.inflight_out++;
		return SEL_QUEUED;
	}
	free(p);
	if (o == SEL_OVERSIZE) {
		/* Memory can never retain it: stream it to disk without
		 * retention (design 2.4), a bounded number at once. */
		if (cs->streaming >= STREAM_PUTS) {
			eos_fail(-EAGAIN, "composite store: %u records larger than warm memory "
				 "are streaming already", cs->streaming);
			*why = SEL_RETRY_INFLIGHT;
			return SEL_RETRY;
		}
		sel_retry_reason dwhy = SEL_RETRY_NONE;
		sel_outcome d = sel_store_put(cs->disk, cp, &dwhy);
		if (d == SEL_QUEUED) {
			cs->st.inflight_out++;
			cs->streaming++;
			cs->g.streamed++;
			return d;
		}
		if (d == SEL_RETRY)
			*why = dwhy;
		return d;
	}
	if (o == SEL_RETRY) {
		/* Memory cannot take it now (dirty records, copies or reads
		 * hold its slots, or its queue is full): no copy and no GPU
		 * pin; maintenance writes make room and PROGRESS says so. */
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
	struct comp_store *cs = CS(s);
	sel_retry_reason reason = SEL_RETRY_NONE;
	sel_outcome o = cp ? put_inner(cs, cp, &reason) : SEL_SKIPPED;
	sel_put_account(&cs->st, &cs->pg, o, reason, why);
	debug_check(cs);
	return o;
}

/* The memory copy-out of p landed: park it. */
static void park(struct comp_store *cs, struct cput *p, sel_event *ev)
{
	struct sel_memory_view v;
	int rc = sel_memory_store_view(cs->mem, &p->key, &v);
	if (rc == 0 && v.ready) {
		struct sel_disk_park dp = {.key = p->key, .parent = p->parent, .bucket = p->bucket,
					   .row = v.has_row};
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
			if (rc == 0) {
				(void)sel_memory_store_pin(cs->mem, &p->key); /* dirty */
			} else if (rc == -EEXIST) {
				rc = 0; /* a streamed copy committed meanwhile: durable */
			}
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
	for (struct cput **pp = &cs->puts; *pp; pp = &(*pp)->next) {
		struct cput *p = *pp;
		if (p->checkpoint == checkpoint && sel_key_eq(&p->key, key)) {
			*pp = p->next;
			return p;
		}
	}
	return NULL;
}

/* ---- poll ---------------------------------------------------------------------------------- */

/* A deferral passing through is a refusal of ours (the worker waits for
 * our progress). */
static void note_deferral(struct comp_store *cs, const sel_event *ev)
{
	if (ev->type == SEL_EV_STORE_FAILED && ev->outcome == SEL_DEFERRED) {
		sel_progress_refuse(&cs->pg);
	}
}

static void mem_event(struct comp_store *cs, sel_event *ev)
{
	if (ev->type == SEL_EV_PROGRESS) {
		cs->pg.released = true; /* ours to announce */
		return;
	}
	note_deferral(cs, ev);
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
		ev_push(cs, ev);
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
	ev_push(cs, ev);
}

static void disk_event(struct comp_store *cs, const sel_event *ev)
{
	if (ev->type == SEL_EV_PROGRESS) {
		cs->pg.released = true; /* ours to announce */
		return;
	}
	note_deferral(cs, ev);
	if (ev->type == SEL_EV_STORED || ev->type == SEL_EV_STORE_FAILED) {
		/* A streamed put ended (write_from completions come through the
		 * done hook, not as events). */
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
	ev_push(cs, ev);
}

static bool step(struct comp_store *cs)
{
	sel_event ev[POLL_BATCH];
	bool any = false;
	int n;
	do {
		n = sel_store_poll(cs->disk, ev, POLL_BATCH); /* runs write/read hooks */
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
	fetches_advance(cs);
	return any;
}

static void signal_self(struct comp_store *cs)
{
	uint64_t v;
	ssize_t r = read(cs->efd, &v, sizeof v);
	(void)r;
	r = read(cs->tfd, &v, sizeof v); /* a fired backoff timer */
	(void)r;
	bool ready = cs->evq_n > 0;
	for (const struct cfetch *f = cs->fetches; f && !ready; f = f->next)
		ready = f->read_done;
	if (ready)
		wake(cs);
}

static int cs_poll(sel_store *s, sel_event *out, size_t cap)
{
	struct comp_store *cs = CS(s);
	step(cs);
	if (!cs->closed)
		maintain(cs);
	if (sel_progress_due(&cs->pg)) {
		sel_event pe = {.type = SEL_EV_PROGRESS};
		ev_push(cs, &pe);
		cs->want_slots = 0;
		cs->g.progress++;
	}
	size_t n = 0;
	while (n < cap && cs->evq_n) {
		out[n++] = cs->evq[cs->evq_head];
		cs->evq_head = (cs->evq_head + 1) % cs->evq_cap;
		cs->evq_n--;
	}
	signal_self(cs);
	debug_check(cs);
	return (int)n;
}

/* ---- lookup and fetch ----------------------------------------------------------------------- */

static int cs_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_hit *hit)
{
	struct comp_store *cs = CS(s);
	cs->st.lookups++;
	int rc = sel_store_lookup(cs->disk, h, resident, limit, hit);
	if (rc <= 0)
		return rc;
	sel_hit mh;
	if (sel_store_lookup(cs->mem, h, resident, limit, &mh) == 1 && sel_key_eq(&mh.key, &hit->key))
		hit->tier = SEL_TIER_MEMORY;
	cs->st.hits++;
	return 1;
}

static int cs_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct comp_store *cs = CS(s);
	if (cs->closed || cs->stopped)
		return eos_fail(SEL_ESTOPPED, "composite store: %s", cs->closed ? "closed" : "stopped");
	if (!hit || !in)
		return eos_fail(-EINVAL, "composite store: fetch without a hit or destination");
	if (in->n_pages != hit->pages)
		return eos_fail(-EINVAL, "composite store: inbound ticket %" PRIu64 " has %" PRIu32
				" pages, the hit uploads %" PRIu32, in->ticket, in->n_pages, hit->pages);
	uint64_t now = eos_now_ns();
	int rc = sel_store_fetch(cs->mem, hit, in);
	if (rc == 0) {
		/* Without the entry the event keeps the memory store's own tier
		 * and bytes, which are right for a memory hit. */
		(void)tk_add(cs, in->ticket, SEL_TIER_MEMORY, hit->bytes, now);
		goto started;
	}
	if (rc != -ESTALE)
		return rc;
	rc = read_through(cs, hit, in);
	if (rc == 0)
		goto started;
	if (rc < 0)
		return rc;
	/* Stream from disk without retention. */
	rc = sel_store_fetch(cs->disk, hit, in);
	if (rc)
		return rc;
	cs->g.streamed++;
started:
	/* A restore refreshes the catalogue's last use (design 2.5), whichever
	 * tier serves it. */
	sel_store_touch(cs->disk, &hit->key);
	cs->st.fetches++;
	cs->st.inflight_in++;
	debug_check(cs);
	return 0;
}

/* ---- the rest of the interface ------------------------------------------------------------------ */

static void cs_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir)
{
	(void)key;
	(void)generation;
	(void)heir;
	CS(s)->st.evictions_noticed++;
}

static void cs_touch(sel_store *s, const sel_key *key)
{
	struct comp_store *cs = CS(s);
	sel_store_touch(cs->disk, key);
	sel_store_touch(cs->mem, key);
	debug_check(cs);
}

static void cs_stats(sel_store *s, sel_stats *out)
{
	struct comp_store *cs = CS(s);
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
}

static int cs_wait_fd(sel_store *s)
{
	return CS(s)->epfd;
}

static bool cs_busy(const struct comp_store *cs)
{
	return cs->puts || cs->writes || cs->fetches;
}

static bool past(uint64_t deadline_ns)
{
	return deadline_ns && eos_now_ns() >= deadline_ns;
}

/* Sleep until a store has something, at most 5 ms. */
static void nap(struct comp_store *cs)
{
	struct epoll_event e;
	(void)epoll_wait(cs->epfd, &e, 1, 5);
}

/* ---- the shutdown drain (design 2.5) ------------------------------------------------ */

struct dcand {
	sel_key key;
	uint64_t tick;
	bool protects;       /* a committed file links under it */
};

static int by_drain_order(const void *a, const void *b)
{
	const struct dcand *x = a, *y = b;
	if (x->protects != y->protects)
		return x->protects ? -1 : 1;
	return x->tick < y->tick ? 1 : x->tick > y->tick ? -1 : 0; /* most recent first */
}

/* The write order: first the parked records committed files link under
 * (their files need them at the next start), then the rest; within each,
 * most recently used first.  A parent is always more recent than its
 * children in the access order (index invariant 5), so every record comes
 * after its parked ancestors. */
static int drain_plan(struct comp_store *cs)
{
	struct cdrain *d = &cs->dr;
	sel_stats ds;
	sel_store_stats(cs->disk, &ds);
	size_t cap = ds.parked_records, n = 0;
	struct dcand *c = malloc((cap ? cap : 1) * sizeof(*c));
	if (!c)
		return -ENOMEM;
	sel_key k = {0};
	while (n < cap && sel_disk_store_next_parked(cs->disk, &k) == 1) {
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, &k, &di) != 0)
			continue;
		c[n++] = (struct dcand){.key = k, .tick = di.tick};
	}
	/* Mark the parked chains above committed files. */
	size_t nk = sel_disk_store_keys(cs->disk, NULL, 0);
	sel_key *all = malloc((nk ? nk : 1) * sizeof(*all));
	if (all) {
		nk = sel_disk_store_keys(cs->disk, all, nk);
		for (size_t i = 0; i < nk; i++) {
			struct sel_disk_record_info di, pi;
			if (sel_disk_store_record(cs->disk, &all[i], &di) != 0 || !di.file || di.is_root)
				continue;
			for (sel_key p = di.parent;
			     sel_disk_store_record(cs->disk, &p, &pi) == 0 && pi.parked;
			     p = pi.parent) {
				for (size_t j = 0; j < n; j++)
					if (sel_key_eq(&c[j].key, &p))
						c[j].protects = true;
				if (pi.is_root)
					break;
			}
		}
		free(all);
	}
	qsort(c, n, sizeof(*c), by_drain_order);
	d->plan = malloc((n ? n : 1) * sizeof(sel_key));
	if (!d->plan) {
		free(c);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		d->plan[i] = c[i].key;
	d->n = n;
	d->next = 0;
	free(c);
	return 0;
}

/* Whether every parked ancestor of key has a write started (so key's file
 * will link under files, not under DRAM-only records). */
static bool ancestors_started(struct comp_store *cs, const struct sel_disk_record_info *di)
{
	struct sel_disk_record_info pi;
	if (di->is_root)
		return true;
	for (sel_key p = di->parent; sel_disk_store_record(cs->disk, &p, &pi) == 0; p = pi.parent) {
		if (pi.parked && !pi.writing)
			return false;
		if (pi.is_root)
			break;
	}
	return true;
}

/* Start plan writes while the time limit and the write-ahead bound allow:
 * at most DRAIN_WRITES records and 2 x intake slots in flight (one record
 * at a time above that), so the limit is overrun by a few writes at most. */
static void drain_step(struct comp_store *cs, uint64_t deadline_ns)
{
	struct cdrain *d = &cs->dr;
	uint64_t now = eos_now_ns();
	if (now < d->resume_ns)
		return;
	while (d->next < d->n) {
		if (d->end_ns && now >= d->end_ns) {
			d->time_up = true;
			return;
		}
		if (deadline_ns && now >= deadline_ns) {
			d->deadline_hit = true;
			return;
		}
		if (cs->writes && (cs->writing_slots >= 2 * cs->intake ||
				   d->in_flight >= DRAIN_WRITES))
			return;
		const sel_key *k = &d->plan[d->next++];
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, k, &di) != 0 || !di.parked || di.writing || di.doomed)
			continue; /* gone, written, or being written */
		if (!di.charged && sel_disk_store_charge_free(cs->disk, k) != 0) {
			d->no_room = true; /* committed files are not evicted for it */
			continue;
		}
		if (!ancestors_started(cs, &di))
			continue; /* its file would not link: not saved */
		if (write_start(cs, k) != 0)
			d->failed++;
		else
			d->in_flight++;
	}
	/* The plan is done.  Records a full filesystem sent back to the park
	 * get another pass after the backoff, a few times. */
	if (!cs->writes && d->retries_left && d->retried) {
		bool again = false;
		sel_key k = {0};
		while (!again && sel_disk_store_next_parked(cs->disk, &k) == 1) {
			struct sel_disk_record_info di;
			again = sel_disk_store_record(cs->disk, &k, &di) == 0 && di.charged && !di.writing;
		}
		d->retried = 0;
		if (again) {
			uint32_t k = DRAIN_RETRIES - (uint32_t)d->retries_left;
			d->resume_ns = now + (DRAIN_BACKOFF_NS << (k < 2 ? k : 2));
			d->retries_left--;
			d->next = 0;
		}
	}
}

/* The parked (DRAM-only) records no write has started for, and their bytes. */
static void parked_left(struct comp_store *cs, uint64_t *records, uint64_t *bytes)
{
	sel_key k = {0};
	while (sel_disk_store_next_parked(cs->disk, &k) == 1) {
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, &k, &di) == 0 && !di.writing) {
			(*records)++;
			*bytes += di.bytes;
		}
	}
}

static void drain_report(struct comp_store *cs, bool final, bool stopped)
{
	struct cdrain *d = &cs->dr;
	if (!cs->drain_cb)
		return;
	uint64_t now = eos_now_ns();
	sel_drain_progress p = {.final = final};
	p.elapsed_ns = now - d->start_ns;
	p.records_written = d->written;
	p.bytes_written = d->written_bytes;
	for (const struct cwrite *w = cs->writes; w; w = w->next) {
		p.records_writing++;
		p.bytes_writing += w->bytes;
	}
	parked_left(cs, &p.records_left, &p.bytes_left);
	p.rate_bps = p.elapsed_ns ? (uint64_t)((double)d->written_bytes * 1e9 / (double)p.elapsed_ns)
				  : 0;
	p.failed = d->failed;
	p.why = "";
	if (final && (p.records_left || d->failed))
		p.why = stopped ? "stopped" : d->deadline_hit ? "deadline" : d->time_up ? "time limit"
			: d->no_room ? "disk limit" : d->no_space && !d->failed ? "disk full"
			: "write errors";
	cs->drain_cb(cs->drain_ctx, &p);
}

/* Without the drain on shutdown: say what a stop loses (the DRAM-only
 * records and their bytes), once, when it loses anything. */
static void report_not_drained(struct comp_store *cs)
{
	if (!cs->drain_cb)
		return;
	sel_drain_progress p = {.final = true, .off = true, .why = "drain off"};
	parked_left(cs, &p.records_left, &p.bytes_left);
	if (p.records_left)
		cs->drain_cb(cs->drain_ctx, &p);
}

/* Write the parked records to disk within the drain limit and the close
 * deadline; writes started finish (or the deadline passes). */
static void drain(struct comp_store *cs, uint64_t deadline_ns)
{
	struct cdrain *d = &cs->dr;
	memset(d, 0, sizeof(*d));
	d->start_ns = eos_now_ns();
	d->report_ns = d->start_ns + 1000000000ull;
	if (cs->drain_ns)
		d->end_ns = d->start_ns + cs->drain_ns;
	d->retries_left = DRAIN_RETRIES;
	cs->draining = true;
	cs->backoff_until = 0;
	if (drain_plan(cs) != 0)
		d->n = 0; /* out of memory: nothing drains, the rest closes */
	for (;;) {
		step(cs);
		if (!cs->stopped)
			drain_step(cs, deadline_ns);
		/* Writes in flight, plan left to start, or a pass after a full
		 * filesystem's backoff. */
		bool retry = d->retried && d->retries_left;
		bool more = cs->writes || (!cs->stopped && !d->time_up && !d->deadline_hit &&
					   (d->next < d->n || retry));
		if (!more || past(deadline_ns)) {
			d->deadline_hit |= more;
			break;
		}
		if (eos_now_ns() >= d->report_ns) {
			drain_report(cs, false, false);
			d->report_ns += 1000000000ull;
		}
		nap(cs);
	}
	step(cs);
	drain_report(cs, true, cs->stopped);
	cs->draining = false;
	free(d->plan);
	d->plan = NULL;
}

static int cs_close(sel_store *s, uint64_t deadline_ns)
{
	struct comp_store *cs = CS(s);
	if (cs->closed)
		return cs->close_rc;
	/* Accepted transfers first: in-flight puts land and park, reads
	 * through finish, maintenance writes end. */
	for (;;) {
		step(cs);
		if (!cs_busy(cs) || past(deadline_ns))
			break;
		nap(cs);
	}
	/* Then, with the drain, the parked records (design 2.5); past the
	 * deadline it only reports that nothing could be saved. */
	if (cs->drain)
		drain(cs, deadline_ns);
	else
		report_not_drained(cs);
	cs->closed = true;
	int rc = 0;
	if (sel_store_close(cs->mem, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (sel_store_close(cs->disk, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (rc) {
		cs->stopped = true;
		eos_fail(rc, "composite store: copies or disk I/O did not drain by the deadline; the "
			 "slot pool is leaked");
	}
	cs->close_rc = rc;
	return rc;
}

static void cs_destroy(sel_store *s)
{
	struct comp_store *cs = CS(s);
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
	sel_record_layout_free(&cs->rl);
	while (cs->puts) {
		struct cput *p = cs->puts;
		cs->puts = p->next;
		free(p);
	}
	while (cs->writes) {
		struct cwrite *w = cs->writes;
		cs->writes = w->next;
		free(w);
	}
	while (cs->fetches) {
		struct cfetch *f = cs->fetches;
		cs->fetches = f->next;
		free(f);
	}
	if (cs->epfd >= 0)
		close(cs->epfd);
	if (cs->tfd >= 0)
		close(cs->tfd);
	if (cs->efd >= 0)
		close(cs->efd);
	free(cs->tk);
	free(cs->pend_rm);
	free(cs->evq);
	free(cs);
}

static const struct sel_store_ops cs_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "composite",
	.lookup = cs_lookup,
	.put = cs_put,
	.fetch = cs_fetch,
	.poll = cs_poll,
	.evicted = cs_evicted,
	.touch = cs_touch,
	.stats = cs_stats,
	.wait_fd = cs_wait_fd,
	.close = cs_close,
	.destroy = cs_destroy,
};

static int epoll_add(int epfd, int fd)
{
	struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) != 0)
		return eos_fail(-errno, "composite store: epoll: %s", strerror(errno));
	return 0;
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
	cs->epfd = cs->tfd = cs->efd = -1;
	cs->drain = cfg->drain_on_shutdown;
	cs->drain_ns = cfg->drain_ns;
	cs->drain_cb = cfg->drain_progress;
	cs->drain_ctx = cfg->drain_ctx;
	cs->closed = true; /* until open completes: destroy skips the drain */
	if ((rc = sel_store_pool_open(cfg, cfg->memory_bytes, "composite store", &cs->sp)))
		goto fail;
	cs->intake = cs->sp->intake;
	if (cs->sp->warning[0])
		cs->base.warning = cs->sp->warning;
	if ((rc = sel_record_layout_init(&cs->rl, cfg->geometry)))
		goto fail;
	/* The disk index is the catalogue: only the disk store sweeps for
	 * expiry, and its removals take the memory copies along. */
	sel_store_config mcfg = *cfg;
	mcfg.max_age_ns = 0;
	if ((rc = sel_memory_store_open_shared(&mcfg, cs->sp, &cs->mem)))
		goto fail;
	struct sel_disk_store_hooks hooks = {.ctx = cs, .removed = on_removed, .done = on_done};
	if ((rc = sel_disk_store_open_shared(cfg, cs->sp, &hooks, &cs->disk)))
		goto fail;
	cs->base.disk_dir = cs->disk->disk_dir;
	cs->base.disk_limit = cs->disk->disk_limit;
	cs->base.scanned_records = cs->disk->scanned_records;
	cs->base.disk_io = cs->disk->disk_io;
	cs->base.disk_io_note = cs->disk->disk_io_note;
	cs->epfd = epoll_create1(EPOLL_CLOEXEC);
	cs->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	cs->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (cs->epfd < 0 || cs->tfd < 0 || cs->efd < 0) {
		rc = eos_fail(-errno, "composite store: epoll/timerfd/eventfd: %s", strerror(errno));
		goto fail;
	}
	if ((rc = epoll_add(cs->epfd, sel_store_wait_fd(cs->mem))) ||
	    (rc = epoll_add(cs->epfd, sel_store_wait_fd(cs->disk))) ||
	    (rc = epoll_add(cs->epfd, cs->tfd)) || (rc = epoll_add(cs->epfd, cs->efd)))
		goto fail;
	cs->closed = false;
	*out = &cs->base;
	debug_check(cs);
	return 0;
fail:
	if (cs->mem)
		sel_store_close(cs->mem, 0);
	if (cs->disk)
		sel_store_close(cs->disk, 0);
	cs_destroy(&cs->base);
	return rc;
}

/* ---- checks and introspection ------------------------------------------------------------------ */

sel_store *sel_composite_store_memory(sel_store *s) { return CS(s)->mem; }
sel_store *sel_composite_store_disk(sel_store *s) { return CS(s)->disk; }

void sel_composite_store_gauges(sel_store *s, struct sel_composite_gauges *out)
{
	struct comp_store *cs = CS(s);
	*out = cs->g;
	out->writing_slots = cs->writing_slots;
	out->write_ahead_bound = 2 * cs->intake > cs->want_slots ? 2 * cs->intake : cs->want_slots;
	out->want_slots = cs->want_slots;
	out->streaming = cs->streaming;
	out->backoff_until_ns = cs->backoff_until;
	out->busy = cs_busy(cs) || cs->streaming || cs->evq_n;
}

int sel_composite_store_check(sel_store *s)
{
	struct comp_store *cs = CS(s);
	int rc = sel_memory_store_check(cs->mem);
	if (rc)
		return rc;
	if ((rc = sel_disk_store_check(cs->disk)))
		return rc;
	if ((rc = sel_slab_check(cs->sp->pool)))
		return rc;
	size_t n = sel_memory_store_keys(cs->mem, NULL, 0);
	sel_key *keys = malloc((n ? n : 1) * sizeof(*keys));
	if (!keys)
		return eos_fail(-ENOMEM, "composite check: out of memory");
	sel_memory_store_keys(cs->mem, keys, n);
	for (size_t i = 0; i < n && !rc; i++) {
		struct sel_memory_view v;
		struct sel_disk_record_info di;
		if (sel_memory_store_view(cs->mem, &keys[i], &v) != 0 || !v.ready)
			continue; /* a copy-out or read in flight */
		if (sel_disk_store_record(cs->disk, &keys[i], &di) != 0) {
			if (!rm_pending(cs, &keys[i]))
				rc = eos_fail(SEL_ECORRUPT, "composite: memory record at %" PRIu64 " tokens "
					      "has no disk record", keys[i].consumed);
			continue;
		}
		if (di.parked && v.pins == 0)
			rc = eos_fail(SEL_ECORRUPT, "composite: parked record at %" PRIu64 " tokens is "
				      "not pinned in memory", keys[i].consumed);
	}
	free(keys);
	if (rc)
		return rc;
	/* Every parked record has a ready memory copy. */
	sel_key k = {0};
	while (sel_disk_store_next_parked(cs->disk, &k) == 1) {
		struct sel_memory_view v;
		if (sel_memory_store_view(cs->mem, &k, &v) != 0 || !v.ready || !v.pins)
			return eos_fail(SEL_ECORRUPT, "composite: parked record at %" PRIu64 " tokens has "
					"no pinned memory copy", k.consumed);
	}
	uint64_t ws = 0;
	for (const struct cwrite *w = cs->writes; w; w = w->next)
		ws += w->slots;
	if (ws != cs->writing_slots)
		return eos_fail(SEL_ECORRUPT, "composite: writing slots %" PRIu64 ", counted %" PRIu64,
				ws, cs->writing_slots);
	if (cs->streaming > STREAM_PUTS)
		return eos_fail(SEL_ECORRUPT, "composite: %u streamed puts in flight, at most %d",
				cs->streaming, STREAM_PUTS);
	return 0;
}
