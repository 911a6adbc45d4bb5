/*
 * transfer.c - per-rank copy threads between GPU planes and host slots
 * (design 2.5 "Transfers, slabs, and record files"; 2.10 "Policy and
 * isolation"; 2.12 "Invariants").
 *
 * The model worker never builds copy descriptors and never waits for a
 * copy.  It submits a job (page ids, a state slot, slot numbers) and later
 * polls completions; one thread per rank turns the job into (dst, src, len)
 * copies from its own rank's geometry and drives its copy backend (host
 * memcpy, CUDA batched copies, or a test stub).
 *
 * DESIGN
 *
 * Channels.  Each rank has a bounded ring of job pointers under its own
 * mutex and condition variable.  Submission checks every ring for room and
 * then pushes onto every ring, all under one submission mutex; since only
 * submitters push, room found in the check is still there for the push, so
 * a job is queued on all ranks or on none, and a full ring costs -EAGAIN
 * without blocking.  A rank thread pops in FIFO order and sleeps on its
 * condition variable when idle (design 2.10: transfer threads sleep on
 * channel receives and event waits).
 *
 * Expansion.  For page i of a job, rank r copies each page plane p:
 *     plane:  rank[r].pages[p].address + pages[i] * unit_bytes
 *     slot:   part[r].base + page_slots[i] * part[r].stride + plane_off[r][p]
 * unpadded unit bytes only (the 4 KiB padding of the slot is never
 * written).  Row piece k (sel_slot_layout_row_piece) copies
 *     row:    rank[r].row.address + state_slot * row unit + k * share[r]
 *     slot:   part[r].base + row_slots[k] * part[r].stride
 * Packed IN jobs read the one stored share instead: page i from slot
 * page_slots[i / ranks] in part (i % ranks), row piece k from slot
 * row_slots[k / ranks] in part (k % ranks).  Copies are gathered into a
 * preallocated call buffer and handed to the backend in windows of at most
 * SEL_WINDOW_PAGES pages, the row with the last window; a window is split
 * into several backend calls where the backend bounds a call's bytes or
 * entries (CUDA: 16 MiB, 4,096), and a single copy longer than the byte
 * bound is cut into pieces.  Each backend call returns only when its copies
 * have landed or, on failure, drained; the rank then stops that job and
 * reports the failure, so a reported failure never leaves a copy in flight
 * (design 2.12).
 *
 * Completion.  A job carries the number of ranks yet to report.  Each rank
 * adds its bytes and, on failure, records the first failure (status,
 * failed_rank) under the completion mutex.  The rank that brings the count
 * to zero owns the job: for OUT jobs with compare it compares the ranks'
 * shares and packs identical records in place (below), stamps done_ns and
 * appends the job to the completion queue.  The push that makes the queue
 * non-empty owes one write of the eventfd (owed, under the completion
 * mutex) and makes it just after unlocking: the worker it wakes may run on
 * this thread's CPU at once, and must not find the mutex held (it would
 * wait for it, two futex calls; issue 18).  Poll reads the eventfd under
 * the mutex when it leaves the queue empty and a write is owed that it has
 * not consumed (consumed counts what its reads returned), so a write that
 * lands after that read leaves the eventfd readable with the queue empty
 * only until the next poll, which reads it; a poll that finds nothing and
 * owes nothing makes no syscall.  (Issue 18: this order was reverted once
 * because test_engine_spec's restore scenario then failed 3 times in 24
 * runs.  The cause was the test: it ran its fillers without waiting for
 * the terminal's copy-out, whose pins keep the terminal's pages on the
 * GPU, so whenever the copy's completion came late -- a delay before the
 * push fails it as surely as one before the write -- turn 2 found the
 * terminal on the GPU.  The write itself cannot reach a closed or reused
 * descriptor: close waits for every rank thread's exit, which follows its
 * last write, and an abandoned set is never freed.)  Because each ring is FIFO, job k's last report
 * precedes job k+1's, so completion order is submission order (the compare
 * runs before the owning thread takes its next job).
 *
 * Compare and pack (design 2.5).  After copy-out, the owning thread
 * compares every rank's unpadded plane bytes with rank 0's, page by page,
 * and likewise the row.  Packing needs equal share layouts on all ranks
 * (decided once at creation).  If every page matches, page i's rank-0 share
 * moves to slot page_slots[i / ranks] at rank (i % ranks)'s share offset.
 * In ascending i this is safe: page i's destination can only be the rank-0
 * share of page i / ranks <= i, which has already moved (or is page i
 * itself when i == 0).  Rows the same, per piece.  The store frees the tail
 * slots (transfer.h).  The rank threads read each other's copies only after
 * the completion mutex ordered them, so this needs no further locking.
 *
 * Wakes (design 2.10; issue 18 "worker calls").  Waking a sleeping thread
 * is a futex syscall that, on a VM whose other vCPU is idle, costs the
 * waker an IPI: 7-15 us, more than the rest of a store call.  So a thread
 * that runs out of jobs first spins for spin_ns (50 us) watching its
 * ring's seq without the lock, and only then marks itself asleep (under the
 * ring lock) and waits; a submission signals only a thread marked asleep
 * (and marks it awake, so a burst signals once).  In deferred mode
 * (sel_xfer_defer_wakes, which the stores set) submission does not signal
 * at all: it sets the ring's kick and the set's kick_any, and
 * sel_xfer_kick, which the store calls once per service pass (its poll and
 * sel_store_flush), signals each sleeping rank with a kick once.  A call
 * with nothing to wake costs one atomic load.  A deferred-mode thread
 * sleeps with a timeout (XFER_BACKSTOP_NS, 50 ms) so a kick nobody sent
 * delays its job instead of losing it.
 *
 * Landed windows (issue 18).  A restore's destination bytes are read
 * once more after the copy by whoever uses them: the reference engine's
 * model summarises every restored byte (model.c "Landed summaries").  An
 * optional hook (sel_xfer_set_landed) runs on the rank's thread after each
 * copy-in window landed, with the window's destination ids, so that work
 * runs where the bytes were just written, per rank and in parallel across
 * ranks, instead of on the worker after the event.  It runs before the
 * rank's report, so whatever it writes is ordered before the completion
 * (the completion mutex) and so before the worker's poll; a failed window
 * never reaches it, and a rank abandoned by close calls it no more.  The
 * set itself does nothing else with it.  A hook with row_piece takes the
 * row's window's row in pieces: the window's pages are flushed first,
 * then the row in pieces of at most 256 KiB (never across a row share),
 * each one backend call with copy_cold (streaming stores) and reported to
 * row_piece with its source as soon as it landed.  Why: a restore's row
 * (104 MiB for a Qwen TP1 prefix) in one call streams too, and the hook's
 * summary then reads the destination back from memory; a piece's source
 * was just read by the copy and is still in the cache, so a summary of
 * it costs no second pass over memory.  Copying pieces with ordinary
 * stores and summarising the destination instead costs the stores' line
 * reads, more than the cached summary saves (docs/performance.md,
 * r29fuse).  A hook with page likewise takes each page of a copy-in
 * window alone: one cold call of its planes, then page with the call's
 * copies (destination, source, length), before fn for the window.  Such
 * calls are below the helper's split size (copy_host.c "Splitting"), so
 * a rank's thread copies them alone -- unless the restore is shared.
 *
 * Sharing a restore (issue 18).  With the page hook, one thread copies
 * and summarises a restore (a 200 MiB 8K-token Qwen-like record: 40-55
 * ms of one CPU, half of it the hook's hashing), while the model worker,
 * which waits for it, leaves its CPU idle.  So a hook with share (the
 * engine's "my worker is idle now") lets a rank's thread take a second
 * thread, its helper (started at its first shared restore, stopped when
 * the rank's thread exits; nice 10 like it), for every copy-in job with
 * more than one page: the rank's thread copies the row first (in pieces,
 * as above) and then takes pages, the helper takes pages from the first,
 * both by one atomic counter, each page alone with its page hook on the
 * thread that copied it.  The helper asks share before each page, so it
 * stops within a page once the worker runs again, and while share says no
 * it looks again every HELP_WAIT_NS (0.5 ms: the worker usually goes idle
 * just after the job starts, once its loop reaches its wait), costing a
 * busy worker's CPU one short wake per 0.5 ms of a restore at most.  The
 * rank's thread then waits for the helper's page
 * in hand (under the helper's mutex: done_cv), adds its bytes, and calls
 * fn for every window, in order, after all the restore's copies landed;
 * a failure on either thread stops both and skips fn (run_shared).  A
 * helper that wakes only after the rank's thread finished takes nothing.
 * Only backends whose cold calls may run on another thread
 * (cold_any_thread: the host's) share, and a rank has a helper only while
 * every rank up to it can have two CPUs (the worker's among them, free
 * while it shares): rank 0 of a TP=1 store from 2 CPUs.  A job the hook
 * does not share runs as before, window by window.
 *
 * Close.  Closing stops submission, marks every ring stopped, and waits on a
 * monotonic condition variable until each thread has drained its ring and
 * exited, or the deadline passes.  Then it joins the exited threads; the
 * rest are told to abandon (they take no further job and, when a backend
 * call returns, exit without touching the job) and detached.  A set with
 * detached threads is never freed: it goes on a process-wide list, which
 * also keeps leak checkers quiet about memory that is deliberately kept.
 *
 * INVARIANTS (checked by sel_xfer_check, transfer_check.c; the structures
 * are in transfer_int.h)
 *
 *   1. Every ring holds 0 <= count <= cap jobs from head (head < cap).
 *   2. inflight == running + ndone, where running counts submitted jobs
 *      with pending > 0 and ndone the jobs in the completion queue.
 *   3. Every job queued on rank r's ring has pending >= 1 (r has not
 *      reported it), so no ring holds more than running jobs.
 *   4. Jobs in the completion queue have pending == 0; the queue has ndone
 *      links and its tail is the last one.
 *   5. ndone > 0 implies owed > consumed (a write is owed that no read
 *      has consumed); written <= owed and consumed <= owed; and once every
 *      owed write is made (written == owed), the eventfd is readable iff
 *      owed != consumed.  So a queue holding completions has a readable
 *      eventfd or a write on its way, and a late write leaves it readable
 *      with the queue empty only until the next poll.
 *   6. After close began, nothing is pushed onto a ring (closing is set
 *      under the submission mutex).
 *   7. A job is reported by each rank once, after all of that rank's
 *      backend calls for it returned; a failure is reported only then.
 *   8. A ring holding jobs whose thread is asleep has its kick set (only
 *      in deferred mode: otherwise submission signalled it), and then
 *      kick_any is set.
 */
#include "transfer_int.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"

#define XFER_NICE 10
/* An idle thread spins this long before it sleeps (sel_xfer_set_spin). */
#define XFER_SPIN_NS (50 * 1000ull)
/* A thread asleep in deferred mode looks at its ring this often even
 * without a signal: a kick its submitter never sent delays a job by at
 * most this much instead of losing it. */
#define XFER_BACKSTOP_NS (50 * 1000000ull)
/* A row handed to the landed hook's row_piece goes in cold calls of at
 * most this many bytes, each reported as it lands, while its source is
 * still in the core's cache (DESIGN "Landed windows"). */
#define ROW_PIECE (256ull << 10)
/* A helper whose hook does not share yet looks again this often (DESIGN
 * "Sharing a restore"). */
#define HELP_WAIT_NS (500 * 1000ull)

/* Wait on cv (a CLOCK_MONOTONIC one, mu held) for at most ns. */
static void wait_for(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t ns)
{
	uint64_t t = eos_now_ns() + ns;
	struct timespec ts = {.tv_sec = (time_t)(t / 1000000000u),
			      .tv_nsec = (long)(t % 1000000000u)};
	(void)pthread_cond_timedwait(cv, mu, &ts);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* Transfer sets whose threads could not be joined: kept, never freed. */
static pthread_mutex_t grave_lock = PTHREAD_MUTEX_INITIALIZER;
static sel_xfer *graveyard;

#ifdef SEL_DEBUG_CHECKS
static void debug_check(const sel_xfer *x)
{
	if (sel_xfer_check(x) != 0) {
		fprintf(stderr, "sel_xfer_check: %s\n", eos_errmsg());
		abort();
	}
}
#else
static inline void debug_check(const sel_xfer *x) { (void)x; }
#endif

static inline uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

static inline void *ptr(uint64_t a) { return (void *)(uintptr_t)a; }

/* Rank r's share of slot s. */
static inline uint64_t share_addr(const sel_xfer *x, uint32_t r, uint32_t s)
{
	return x->part[r].base + (uint64_t)s * x->part[r].stride;
}

/* ---- Rank thread: expansion and backend calls --------------------------- */

/* Hand the gathered copies to the backend.  Returns its status; sets
 * rk->abandoned when close gave up on this thread meanwhile. */
static int flush_as(struct rank *rk, bool cold)
{
	sel_xfer *x = rk->x;
	int rc;
	if (rk->ncall == 0)
		return 0;
	assert(!x->be.max_call_entries || rk->ncall <= x->be.max_call_entries);
	assert(!x->be.max_call_bytes || rk->call_bytes <= x->be.max_call_bytes);
	if (cold && x->be.copy_cold)
		rc = x->be.copy_cold(rk->state, rk->call, rk->ncall, rk->dir);
	else
		rc = x->be.copy(rk->state, rk->call, rk->ncall, rk->dir);
	if (rc > 0)
		rc = -EIO;
	if (rc == 0)
		rk->job_bytes += rk->call_bytes;
	rk->ncall = 0;
	rk->call_bytes = 0;
	if (atomic_load(&x->abandon)) {
		rk->abandoned = true;
		return rc ? rc : -ECANCELED;
	}
	return rc;
}

static int flush(struct rank *rk) { return flush_as(rk, false); }

/* Add one copy, flushing first where the call would exceed a bound, and
 * cutting copies longer than the byte bound into pieces. */
static int push(struct rank *rk, uint64_t dst, uint64_t src, uint64_t len)
{
	const struct sel_copy_backend *be = &rk->x->be;
	while (len) {
		uint64_t n = len;
		int rc;
		if (rk->ncall == rk->call_cap ||
		    (be->max_call_bytes && rk->call_bytes + n > be->max_call_bytes && rk->ncall)) {
			if ((rc = flush(rk)))
				return rc;
		}
		if (be->max_call_bytes && n > be->max_call_bytes)
			n = be->max_call_bytes;
		rk->call[rk->ncall++] = (struct sel_copy){.dst = dst, .src = src, .len = n};
		rk->call_bytes += n;
		dst += n;
		src += n;
		len -= n;
	}
	return 0;
}

static inline int push_dir(struct rank *rk, uint64_t plane, uint64_t slot, uint64_t len)
{
	return rk->dir == SEL_COPY_OUT ? push(rk, slot, plane, len) : push(rk, plane, slot, len);
}

static int push_page(struct rank *rk, const struct sel_xfer_job *job, uint32_t i)
{
	const sel_xfer *x = rk->x;
	const sel_rank_geometry *rg = &x->g->rank[rk->r];
	uint64_t j = (uint64_t)job->first_share + i;
	uint64_t share = job->pages_packed
				 ? share_addr(x, j % x->ranks, job->page_slots[j / x->ranks])
				 : share_addr(x, rk->r, job->page_slots[i]);
	uint64_t id = job->pages[i];
	for (uint32_t p = 0; p < rg->n_planes; p++) {
		const sel_plane *pl = &rg->pages[p];
		int rc = push_dir(rk, pl->address + id * pl->unit_bytes,
				  share + x->l->plane_off[rk->r][p], pl->unit_bytes);
		if (rc)
			return rc;
	}
	return 0;
}

/* Copy the row's bytes [at, at + len) from slot: one copy, or with the
 * hook's row_piece (DESIGN "Landed windows") one cold call and one report
 * per ROW_PIECE bytes. */
static int push_row_bytes(struct rank *rk, const struct sel_xfer_job *job, uint64_t row,
			  uint64_t slot, uint64_t at, uint64_t len)
{
	const sel_landed_hook *h = &rk->x->landed;
	if (!h->row_piece || job->dir != SEL_COPY_IN)
		return push_dir(rk, row + at, slot, len);
	for (uint64_t o = 0; o < len;) {
		uint64_t n = len - o < ROW_PIECE ? len - o : ROW_PIECE;
		int rc = push_dir(rk, row + at + o, slot + o, n);
		if (!rc)
			rc = flush_as(rk, true);
		if (rc)
			return rc;
		h->row_piece(h->ctx, rk->r, job->state_slot, at + o, n, ptr(slot + o));
		o += n;
	}
	return 0;
}

static int push_row(struct rank *rk, const struct sel_xfer_job *job)
{
	const sel_xfer *x = rk->x;
	const sel_rank_geometry *rg = &x->g->rank[rk->r];
	uint64_t row = rg->row.address + (uint64_t)job->state_slot * rg->row.unit_bytes;
	uint64_t piece_bytes = x->l->share[rk->r];
	int rc;
	/* In pieces: the window's pages go first, in their own call. */
	if (x->landed.row_piece && job->dir == SEL_COPY_IN && (rc = flush(rk)))
		return rc;
	for (uint32_t k = 0; k < x->l->row_slots; k++) {
		uint64_t off, len;
		sel_slot_layout_row_piece(x->l, rk->r, k, &off, &len);
		if (len == 0)
			break;
		uint64_t slot = job->row_packed
					? share_addr(x, k % x->ranks, job->row_slots[k / x->ranks])
					: share_addr(x, rk->r, job->row_slots[k]);
		if ((rc = push_row_bytes(rk, job, row, slot, (uint64_t)k * piece_bytes, len)))
			return rc;
	}
	return 0;
}

/* A copy-in window [from, end) of job landed: tell the landed hook (see
 * DESIGN "Landed windows"). */
static void landed(const struct rank *rk, const struct sel_xfer_job *job, uint32_t from,
		   uint32_t end)
{
	const sel_landed_hook *h = &rk->x->landed;
	bool row = end == job->n_pages && job->row;
	if (!h->fn || job->dir != SEL_COPY_IN || (end == from && !row))
		return;
	h->fn(h->ctx, rk->r, job->pages + from, end - from, row, job->state_slot);
}

/* Page i of job alone in a cold call, then the hook's page (DESIGN "Landed
 * windows"), with the page's copies. */
static int push_page_alone(struct rank *rk, const struct sel_xfer_job *job, uint32_t i)
{
	const sel_landed_hook *h = &rk->x->landed;
	int rc = flush(rk);
	if (!rc)
		rc = push_page(rk, job, i);
	if (rc)
		return rc;
	uint32_t n = rk->ncall;
	for (uint32_t k = 0; k < n; k++)
		rk->page_copies[k] = (sel_landed_copy){.dst = ptr(rk->call[k].dst),
						       .src = ptr(rk->call[k].src),
						       .len = rk->call[k].len};
	if ((rc = flush_as(rk, true)))
		return rc;
	h->page(h->ctx, rk->r, job->pages[i], rk->page_copies, n);
	return 0;
}

/* Copy this rank's part of job in windows.  0 or the failure. */
static int run_job(struct rank *rk, const struct sel_xfer_job *job)
{
	uint32_t n = job->n_pages, i = 0;
	bool alone = rk->x->landed.page && job->dir == SEL_COPY_IN;
	int rc = 0;
	rk->dir = job->dir;
	rk->job_bytes = 0;
	do {
		uint32_t from = i, end = n - i > SEL_WINDOW_PAGES ? i + SEL_WINDOW_PAGES : n;
		for (; i < end && !rc; i++)
			rc = alone ? push_page_alone(rk, job, i) : push_page(rk, job, i);
		if (!rc && end == n && job->row)
			rc = push_row(rk, job);
		if (!rc)
			rc = flush(rk);
		if (!rc && !rk->abandoned)
			landed(rk, job, from, end);
	} while (!rc && i < n);
	/* A failed push leaves nothing issued behind it: drop the rest. */
	rk->ncall = 0;
	rk->call_bytes = 0;
	return rc;
}

/* ---- Sharing a restore (see DESIGN) -------------------------------------- */

/* Take pages of job by index until none is left: 0 or the first failure,
 * after which nobody takes more. */
static int take_pages(struct rank *rk, struct help *h, const struct sel_xfer_job *job)
{
	uint32_t n = job->n_pages, i;
	int rc = 0;
	while (!rc && (i = atomic_fetch_add(&h->next, 1)) < n)
		if ((rc = push_page_alone(rk, job, i)))
			atomic_store(&h->next, n);
	return rc;
}

/* The helper's part of task seq (mu held on entry and return): while
 * pages are left and the task is still posted, a page whenever the hook
 * shares, else a wait of at most HELP_WAIT_NS for the worker to go idle.
 * 0 or the first failure. */
static int help_task(struct help *h, const struct sel_xfer_job *job, uint64_t seq)
{
	const sel_landed_hook *lh = &h->lane.x->landed;
	uint32_t n = job->n_pages, i;
	int rc = 0;
	while (!rc && h->job == job && h->seq == seq && atomic_load(&h->next) < n) {
		if (!lh->share(lh->ctx)) {
			wait_for(&h->cv, &h->mu, HELP_WAIT_NS);
			continue;
		}
		pthread_mutex_unlock(&h->mu);
		if ((i = atomic_fetch_add(&h->next, 1)) < n) {
			if ((rc = push_page_alone(&h->lane, job, i)))
				atomic_store(&h->next, n);
			else
				atomic_fetch_add_explicit(&h->pages, 1, memory_order_relaxed);
		}
		pthread_mutex_lock(&h->mu);
	}
	return rc;
}

static void *help_main(void *arg)
{
	struct help *h = arg;
	uint64_t seen = 0;
	char name[16];
	snprintf(name, sizeof(name), "sel-xfer-h%" PRIu32, h->lane.r);
	eos_thread_name(name);
	(void)eos_thread_lower_priority(XFER_NICE);
	pthread_mutex_lock(&h->mu);
	for (;;) {
		while (!h->stop && (!h->job || h->seq == seen))
			pthread_cond_wait(&h->cv, &h->mu);
		if (h->stop)
			break;
		seen = h->seq;
		h->in_task = true;
		h->rc = help_task(h, h->job, seen);
		h->in_task = false;
		pthread_cond_signal(&h->done_cv);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* Whether rank r may have a helper: while every rank up to it can have two
 * of the CPUs this process may run on (its thread and its helper; the
 * model worker's CPU is among them, free while it shares). */
static bool help_wanted(uint32_t r) { return eos_cpus_allowed() >= 2 * ((uint64_t)r + 1); }

static void help_free(struct help *h)
{
	if (!h)
		return;
	free(h->lane.call);
	free(h->lane.page_copies);
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	pthread_cond_destroy(&h->done_cv);
	free(h);
}

/* rk's helper, started on its first wanted restore; NULL where it cannot
 * be (then the rank copies alone, as before). */
static struct help *help_get(struct rank *rk)
{
	if (rk->help || rk->help_tried)
		return rk->help;
	rk->help_tried = true;
	if (!help_wanted(rk->r))
		return NULL;
	struct help *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	h->lane =
		(struct rank){.x = rk->x, .r = rk->r, .state = rk->state, .call_cap = rk->call_cap};
	h->lane.call = calloc(rk->call_cap, sizeof(*h->lane.call));
	h->lane.page_copies = calloc(rk->call_cap, sizeof(*h->lane.page_copies));
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, &ca);
	pthread_cond_init(&h->done_cv, NULL);
	pthread_condattr_destroy(&ca);
	if (!h->lane.call || !h->lane.page_copies ||
	    pthread_create(&h->tid, NULL, help_main, h) != 0) {
		help_free(h);
		return NULL;
	}
	return rk->help = h;
}

/* At the rank thread's exit: the helper is between tasks (run_shared
 * waits for its part), so it stops at once. */
static void help_stop(struct rank *rk)
{
	struct help *h = rk->help;
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->stop = true;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
	pthread_join(h->tid, NULL);
}

/* Whether job is shared: a copy-in of more than one page with the page
 * hook and share, a backend whose cold calls may run on a second thread,
 * and a helper.  (Whether the worker's CPU is free the helper asks before
 * each page: the worker may go idle only after the job started.) */
static struct help *shared(struct rank *rk, const struct sel_xfer_job *job)
{
	const sel_landed_hook *lh = &rk->x->landed;
	if (job->dir != SEL_COPY_IN || !lh->page || !lh->share || !rk->x->be.cold_any_thread ||
	    job->n_pages < 2)
		return NULL;
	return help_get(rk);
}

/* Copy this rank's part of job with the helper: the rank's thread takes
 * the row first and then pages, the helper pages from the start; each page
 * alone (push_page_alone), so each lands with its hook on the thread that
 * copied it.  Once both are done, the landed hook's fn for every window.
 * 0 or the first failure (then no fn call). */
static int run_shared(struct rank *rk, struct help *h, const struct sel_xfer_job *job)
{
	uint32_t n = job->n_pages;
	int rc = 0;
	rk->dir = h->lane.dir = job->dir;
	rk->job_bytes = h->lane.job_bytes = 0;
	h->lane.abandoned = false;
	atomic_store(&h->next, 0);
	pthread_mutex_lock(&h->mu);
	h->job = job;
	h->seq++;
	h->rc = 0;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
	if (job->row && !(rc = push_row(rk, job)))
		rc = flush(rk);
	if (rc)
		atomic_store(&h->next, n);
	else
		rc = take_pages(rk, h, job);
	pthread_mutex_lock(&h->mu);
	h->job = NULL;               /* a helper waking only now takes no part */
	pthread_cond_signal(&h->cv); /* one waiting for share: the task ended */
	while (h->in_task)
		pthread_cond_wait(&h->done_cv, &h->mu);
	int hrc = h->rc;
	pthread_mutex_unlock(&h->mu);
	rk->job_bytes += h->lane.job_bytes;
	if (h->lane.abandoned)
		rk->abandoned = true;
	rc = rc ? rc : hrc;
	for (uint32_t from = 0; !rc && !rk->abandoned;) {
		uint32_t end = n - from > SEL_WINDOW_PAGES ? from + SEL_WINDOW_PAGES : n;
		landed(rk, job, from, end);
		if ((from = end) >= n)
			break;
	}
	rk->ncall = 0;
	rk->call_bytes = 0;
	return rc;
}

uint64_t sel_xfer_helped(const sel_xfer *x)
{
	uint64_t n = 0;
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct help *h = x->rank[r].help;
		n += h ? atomic_load_explicit(&h->pages, memory_order_relaxed) : 0;
	}
	return n;
}

/* ---- Compare and pack (design 2.5) -------------------------------------- */

static bool pages_equal(const sel_xfer *x, const struct sel_xfer_job *job)
{
	const sel_rank_geometry *g0 = &x->g->rank[0];
	for (uint32_t i = 0; i < job->n_pages; i++) {
		const uint8_t *s0 = ptr(share_addr(x, 0, job->page_slots[i]));
		for (uint32_t r = 1; r < x->ranks; r++) {
			const uint8_t *sr = ptr(share_addr(x, r, job->page_slots[i]));
			for (uint32_t p = 0; p < g0->n_planes; p++)
				if (memcmp(s0 + x->l->plane_off[0][p], sr + x->l->plane_off[r][p],
					   g0->pages[p].unit_bytes) != 0)
					return false;
		}
	}
	return true;
}

static bool rows_equal(const sel_xfer *x, const struct sel_xfer_job *job)
{
	for (uint32_t k = 0; k < x->l->row_slots; k++) {
		uint64_t off, len;
		sel_slot_layout_row_piece(x->l, 0, k, &off, &len);
		if (len == 0)
			break;
		const void *s0 = ptr(share_addr(x, 0, job->row_slots[k]));
		for (uint32_t r = 1; r < x->ranks; r++)
			if (memcmp(s0, ptr(share_addr(x, r, job->row_slots[k])), len) != 0)
				return false;
	}
	return true;
}

/* Move share i of rank 0 (in slots[i]) to slots[i / ranks] at rank
 * (i % ranks)'s offset, for i ascending (safe: see DESIGN). */
static void pack(const sel_xfer *x, const uint32_t *slots, uint32_t n, uint64_t len)
{
	for (uint32_t i = 0; i < n; i++) {
		uint64_t src = share_addr(x, 0, slots[i]);
		uint64_t dst = share_addr(x, i % x->ranks, slots[i / x->ranks]);
		if (dst != src)
			memcpy(ptr(dst), ptr(src), len);
	}
}

static void compare_and_pack(const sel_xfer *x, struct sel_xfer_job *job)
{
	if (job->dir != SEL_COPY_OUT || x->ranks < 2 || x->split)
		return;
	if (x->uniform && job->n_pages > 0 && pages_equal(x, job)) {
		pack(x, job->page_slots, job->n_pages, x->l->share[0]);
		job->pages_replicated = true;
	}
	if (x->uniform_row && job->row && rows_equal(x, job)) {
		uint64_t off, len;
		uint32_t pieces = 0;
		for (; pieces < x->l->row_slots; pieces++) {
			sel_slot_layout_row_piece(x->l, 0, pieces, &off, &len);
			if (len == 0)
				break;
		}
		pack(x, job->row_slots, pieces, x->l->share[0]);
		job->row_replicated = true;
	}
}

/* ---- Completion --------------------------------------------------------- */

static void report(struct rank *rk, struct sel_xfer_job *job, int rc)
{
	sel_xfer *x = rk->x;
	bool last;

	pthread_mutex_lock(&x->done);
	job->bytes += rk->job_bytes;
	if (rc && job->status == 0) {
		job->status = rc;
		job->failed_rank = rk->r;
	}
	assert(job->priv.pending > 0);
	last = --job->priv.pending == 0;
	pthread_mutex_unlock(&x->done);
	if (!last)
		return;

	/* Every rank reported: this thread owns the job until it is queued. */
	if (job->status == 0 && job->compare)
		compare_and_pack(x, job);
	job->done_ns = eos_now_ns();

	pthread_mutex_lock(&x->done);
	job->priv.next = NULL;
	if (x->tail)
		x->tail->priv.next = job;
	else
		x->head = job;
	x->tail = job;
	x->running--;
	bool signal = x->ndone++ == 0;
	if (signal)
		x->owed++;
	pthread_mutex_unlock(&x->done);
	/* After the unlock: the worker this wakes may preempt this thread
	 * (its vCPU), and must not then find the lock held.  x and efd stay
	 * valid: close waits for this thread's exit, which follows. */
	if (signal) {
		if (x->late_hook)
			x->late_hook(x->late_arg);
		(void)eventfd_write(x->efd, 1);
		atomic_fetch_add_explicit(&x->written, 1, memory_order_release);
	}
}

void sel_xfer_test_late_hook(sel_xfer *x, void (*fn)(void *arg), void *arg)
{
	x->late_hook = fn;
	x->late_arg = arg;
}

/* ---- Rank thread -------------------------------------------------------- */

/* Spin until the ring changes or ns pass (no lock: seq only). */
static void spin_idle(const struct ring *q, uint32_t seen, uint64_t ns)
{
	uint64_t end = eos_now_ns() + ns;
	do {
		for (int i = 0; i < 32; i++)
			cpu_relax();
		if (atomic_load_explicit(&q->seq, memory_order_acquire) != seen)
			return;
	} while (eos_now_ns() < end);
}

/* Sleep on the ring (lock held) until signalled or, in deferred mode, the
 * backstop passes. */
static void ring_sleep(struct rank *rk)
{
	struct ring *q = &rk->ring;
	q->asleep = true;
	if (atomic_load(&rk->x->defer)) {
		wait_for(&q->cv, &q->lock, XFER_BACKSTOP_NS);
	} else {
		pthread_cond_wait(&q->cv, &q->lock);
	}
	q->asleep = false;
}

static struct sel_xfer_job *ring_pop(struct rank *rk)
{
	struct ring *q = &rk->ring;
	struct sel_xfer_job *job = NULL;
	bool spun = false;
	pthread_mutex_lock(&q->lock);
	for (;;) {
		if (atomic_load(&rk->x->abandon))
			break;
		if (q->count) {
			job = q->q[q->head];
			q->head = (q->head + 1) % q->cap;
			q->count--;
			break;
		}
		if (q->stop)
			break;
		uint64_t spin = atomic_load_explicit(&rk->x->spin_ns, memory_order_relaxed);
		if (!spun && spin) {
			uint32_t seen = atomic_load_explicit(&q->seq, memory_order_relaxed);
			pthread_mutex_unlock(&q->lock);
			spin_idle(q, seen, spin);
			pthread_mutex_lock(&q->lock);
			spun = true;
			continue;
		}
		ring_sleep(rk);
	}
	/* Whatever kick was pending is served by this thread being awake. */
	q->kick = false;
	pthread_mutex_unlock(&q->lock);
	return job;
}

static void *rank_main(void *arg)
{
	struct rank *rk = arg;
	sel_xfer *x = rk->x;
	char name[16];
	int rc;

	snprintf(name, sizeof(name), "sel-xfer-%" PRIu32, rk->r);
	eos_thread_name(name);
	/* Best effort: a kernel refusing the offload class or nice still copies. */
	(void)eos_thread_lower_priority(XFER_NICE);

	eos_errclear();
	rc = x->be.open_rank(x->be.ctx, rk->r, &rk->state);
	if (rc > 0)
		rc = -EIO;
	pthread_mutex_lock(&x->life);
	if (rc && !x->open_rc) {
		x->open_rc = rc;
		x->open_rank = rk->r;
		snprintf(x->open_msg, sizeof(x->open_msg), "%s", eos_errmsg());
	}
	x->opened++;
	pthread_cond_broadcast(&x->life_cv);
	pthread_mutex_unlock(&x->life);

	if (rc == 0) {
		struct sel_xfer_job *job;
		while ((job = ring_pop(rk)) != NULL) {
			struct help *h = shared(rk, job);
			int jrc = h ? run_shared(rk, h, job) : run_job(rk, job);
			if (rk->abandoned)
				break; /* close gave up on us: the job is no longer ours */
			report(rk, job, jrc);
		}
		help_stop(rk);
		if (!atomic_load(&x->abandon) && x->be.close_rank)
			x->be.close_rank(rk->state);
	}

	pthread_mutex_lock(&x->life);
	rk->exited = true;
	x->exited++;
	pthread_cond_broadcast(&x->life_cv);
	pthread_mutex_unlock(&x->life);
	return NULL;
}

/* ---- Creation ------------------------------------------------------------ */

static void stop_rings(sel_xfer *x)
{
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct ring *q = &x->rank[r].ring;
		pthread_mutex_lock(&q->lock);
		q->stop = true;
		atomic_fetch_add_explicit(&q->seq, 1, memory_order_release);
		pthread_cond_broadcast(&q->cv);
		pthread_mutex_unlock(&q->lock);
	}
}

static void join_all(sel_xfer *x)
{
	for (uint32_t r = 0; r < x->ranks; r++)
		if (x->rank[r].running) {
			pthread_join(x->rank[r].tid, NULL);
			x->rank[r].running = false;
		}
}

static void free_set(sel_xfer *x)
{
	if (x->rank) {
		for (uint32_t r = 0; r < x->ranks; r++) {
			free(x->rank[r].ring.q);
			free(x->rank[r].call);
			free(x->rank[r].page_copies);
			help_free(x->rank[r].help);
			pthread_mutex_destroy(&x->rank[r].ring.lock);
			pthread_cond_destroy(&x->rank[r].ring.cv);
		}
	}
	free(x->rank);
	free(x->part);
	if (x->efd >= 0)
		close(x->efd);
	pthread_mutex_destroy(&x->submit);
	pthread_mutex_destroy(&x->done);
	pthread_mutex_destroy(&x->life);
	pthread_cond_destroy(&x->life_cv);
	free(x);
}

static bool same_share_layout(const sel_geometry *g, uint32_t r)
{
	const sel_rank_geometry *a = &g->rank[0], *b = &g->rank[r];
	if (a->n_planes != b->n_planes)
		return false;
	for (uint32_t p = 0; p < a->n_planes; p++)
		if (a->pages[p].unit_bytes != b->pages[p].unit_bytes)
			return false;
	return true;
}

static int check_args(const sel_geometry *g, const sel_slot_layout *layout,
		      const struct sel_xfer_part *parts, uint64_t nslots,
		      const struct sel_copy_backend *backend, uint32_t queue_depth, sel_xfer **out)
{
	if (!g || !layout || !parts || !backend || !out)
		return eos_fail(-EINVAL, "transfer: missing geometry, layout, slots or backend");
	if (!backend->open_rank || !backend->copy)
		return eos_fail(-EINVAL, "transfer: backend '%s' lacks open_rank or copy",
				backend->name ? backend->name : "?");
	if (g->ranks == 0 || g->ranks != layout->ranks)
		return eos_fail(-EINVAL,
				"transfer: geometry has %" PRIu32 " ranks, slot layout %" PRIu32,
				g->ranks, layout->ranks);
	if (queue_depth == 0)
		return eos_fail(-EINVAL, "transfer: queue depth 0 (expected at least 1)");
	if (nslots == 0 || nslots > UINT32_MAX)
		return eos_fail(-EINVAL, "transfer: %" PRIu64 " slots (expected 1..%" PRIu32 ")",
				nslots, UINT32_MAX);
	return 0;
}

/* A set not yet started: its locks, its parameters, its rank table. */
static sel_xfer *set_new(const sel_geometry *g, const sel_slot_layout *layout,
			 const struct sel_xfer_part *parts, uint64_t nslots, bool split,
			 const struct sel_copy_backend *backend, uint32_t queue_depth)
{
	sel_xfer *x = calloc(1, sizeof(*x));
	if (!x)
		return NULL;
	x->efd = -1;
	pthread_mutex_init(&x->submit, NULL);
	pthread_mutex_init(&x->done, NULL);
	pthread_mutex_init(&x->life, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&x->life_cv, &ca);
	atomic_init(&x->inflight, 0);
	atomic_init(&x->abandon, false);
	atomic_init(&x->defer, false);
	atomic_init(&x->kick_any, false);
	atomic_init(&x->wakes, 0);
	atomic_init(&x->written, 0);
	atomic_init(&x->spin_ns, XFER_SPIN_NS);
	x->g = g;
	x->l = layout;
	x->be = *backend;
	x->ranks = g->ranks;
	x->depth = queue_depth;
	x->nslots = nslots;
	x->split = split;
	x->part = calloc(x->ranks, sizeof(*x->part));
	x->rank = calloc(x->ranks, sizeof(*x->rank));
	if (!x->part || !x->rank) {
		free(x->part);
		x->part = NULL;
		free(x->rank);
		x->rank = NULL;
		pthread_condattr_destroy(&ca);
		return x;
	}
	for (uint32_t r = 0; r < x->ranks; r++) {
		pthread_mutex_init(&x->rank[r].ring.lock, NULL);
		pthread_cond_init(&x->rank[r].ring.cv, &ca);
	}
	pthread_condattr_destroy(&ca);
	memcpy(x->part, parts, x->ranks * sizeof(*x->part));
	return x;
}

/* Page and row limits, and whether the ranks' shares (and rows) have one
 * layout, so a copy-out may compare them. */
static int set_limits(sel_xfer *x)
{
	const sel_geometry *g = x->g;
	x->uniform = x->uniform_row = true;
	x->page_limit = x->row_limit = UINT64_MAX;
	for (uint32_t r = 0; r < x->ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		if (rg->n_planes == 0 || !rg->pages)
			return eos_fail(-EINVAL, "transfer: rank %" PRIu32 " has no page planes",
					r);
		if (rg->page_count < x->page_limit)
			x->page_limit = rg->page_count;
		if (rg->row_count < x->row_limit)
			x->row_limit = rg->row_count;
		if (!same_share_layout(g, r))
			x->uniform = false;
		if (x->l->row_bytes[r] != x->l->row_bytes[0])
			x->uniform_row = false;
	}
	x->uniform_row = x->uniform_row && x->uniform;
	return 0;
}

/* Each rank's call array (the largest window: 64 pages of every plane plus
 * every row piece, at most the backend's entries per call) and ring. */
static int rank_buffers(sel_xfer *x)
{
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct rank *rk = &x->rank[r];
		uint64_t cap =
			(uint64_t)SEL_WINDOW_PAGES * x->g->rank[r].n_planes + x->l->row_slots;
		if (x->be.max_call_entries && x->be.max_call_entries < cap)
			cap = x->be.max_call_entries;
		rk->x = x;
		rk->r = r;
		rk->call_cap = (uint32_t)cap;
		rk->call = calloc(cap, sizeof(*rk->call));
		rk->page_copies = calloc(cap, sizeof(*rk->page_copies));
		rk->ring.cap = x->depth;
		rk->ring.q = calloc(x->depth, sizeof(struct sel_xfer_job *));
		if (!rk->call || !rk->page_copies || !rk->ring.q)
			return eos_fail(-ENOMEM,
					"transfer: out of memory for rank %" PRIu32 " buffers", r);
	}
	return 0;
}

/* Start every rank's thread and wait until each has opened its rank (or
 * failed to): 0, or the first failure. */
static int start_ranks(sel_xfer *x)
{
	int rc = 0;
	for (uint32_t r = 0; r < x->ranks; r++) {
		int e = pthread_create(&x->rank[r].tid, NULL, rank_main, &x->rank[r]);
		if (e) {
			rc = eos_fail(-e,
				      "transfer: cannot start the thread of rank %" PRIu32 ": %s",
				      r, strerror(e));
			break;
		}
		x->rank[r].running = true;
		x->started++;
	}
	pthread_mutex_lock(&x->life);
	while (x->opened < x->started)
		pthread_cond_wait(&x->life_cv, &x->life);
	if (!rc && x->open_rc) {
		rc = x->open_rc;
		if (x->open_msg[0])
			eos_fail(rc, "%s (transfer rank %" PRIu32 ")", x->open_msg, x->open_rank);
		else
			eos_fail(rc,
				 "transfer rank %" PRIu32 ": backend '%s' could not open it: %s",
				 x->open_rank, x->be.name ? x->be.name : "?", sel_strerror(rc));
	}
	pthread_mutex_unlock(&x->life);
	return rc;
}

static int create(const sel_geometry *g, const sel_slot_layout *layout,
		  const struct sel_xfer_part *parts, uint64_t nslots, bool split,
		  const struct sel_copy_backend *backend, uint32_t queue_depth, sel_xfer **out)
{
	sel_xfer *x;
	int rc;

	if (out)
		*out = NULL;
	if ((rc = check_args(g, layout, parts, nslots, backend, queue_depth, out)))
		return rc;
	if (!(x = set_new(g, layout, parts, nslots, split, backend, queue_depth)))
		return eos_fail(-ENOMEM, "transfer: out of memory");
	if (!x->rank) {
		rc = eos_fail(-ENOMEM, "transfer: out of memory for %" PRIu32 " ranks", g->ranks);
		goto fail;
	}
	x->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (x->efd < 0) {
		rc = -errno;
		eos_fail(rc, "transfer: eventfd: %s", strerror(-rc));
		goto fail;
	}
	if ((rc = set_limits(x)) || (rc = rank_buffers(x)) || (rc = start_ranks(x)))
		goto fail;
	*out = x;
	return 0;
fail:
	if (x->rank) {
		stop_rings(x);
		join_all(x);
	}
	free_set(x);
	return rc;
}

int sel_xfer_create(const sel_geometry *g, const sel_slot_layout *layout, const sel_slab_pool *pool,
		    const struct sel_copy_backend *backend, uint32_t queue_depth, sel_xfer **out)
{
	struct sel_xfer_part *parts;
	int rc;

	*out = NULL;
	if (!layout || !pool || layout->ranks == 0)
		return eos_fail(-EINVAL, "transfer: missing slot layout or pool");
	if (sel_slab_slot_bytes(pool) != layout->slot_bytes)
		return eos_fail(-EINVAL,
				"transfer: pool slots of %" PRIu64 " bytes, layout needs %" PRIu64,
				sel_slab_slot_bytes(pool), layout->slot_bytes);
	parts = calloc(layout->ranks, sizeof(*parts));
	if (!parts)
		return eos_fail(-ENOMEM, "transfer: out of memory");
	for (uint32_t r = 0; r < layout->ranks; r++) {
		parts[r].base = (uint64_t)(uintptr_t)sel_slab_base(pool) + layout->share_off[r];
		parts[r].stride = layout->slot_bytes;
	}
	rc = create(g, layout, parts, sel_slab_total(pool), false, backend, queue_depth, out);
	free(parts);
	return rc;
}

int sel_xfer_create_parts(const sel_geometry *g, const sel_slot_layout *layout,
			  const struct sel_xfer_part *parts, uint64_t nslots,
			  const struct sel_copy_backend *backend, uint32_t queue_depth,
			  sel_xfer **out)
{
	return create(g, layout, parts, nslots, true, backend, queue_depth, out);
}

/* ---- Submission and polling --------------------------------------------- */

static int check_slots(const sel_xfer *x, const uint32_t *slots, uint64_t n, const char *what)
{
	for (uint64_t j = 0; j < n; j++)
		if (slots[j] >= x->nslots)
			return eos_fail(-EINVAL,
					"transfer: %s slot %" PRIu32 " (entry %" PRIu64
					") beyond %" PRIu64 " slots",
					what, slots[j], j, x->nslots);
	return 0;
}

static int validate(const sel_xfer *x, const struct sel_xfer_job *job)
{
	int rc;
	if (job->dir != SEL_COPY_OUT && job->dir != SEL_COPY_IN)
		return eos_fail(-EINVAL, "transfer: job %" PRIu64 " has direction %d", job->id,
				(int)job->dir);
	if (job->n_pages && (!job->pages || !job->page_slots))
		return eos_fail(-EINVAL,
				"transfer: job %" PRIu64 " lacks its page ids or page slots",
				job->id);
	if (job->row && !job->row_slots)
		return eos_fail(-EINVAL, "transfer: job %" PRIu64 " lacks its row slots", job->id);
	bool pages_packed = job->pages_packed && job->n_pages;
	bool row_packed = job->row_packed && job->row;
	if (job->dir == SEL_COPY_OUT && (job->pages_packed || job->row_packed))
		return eos_fail(-EINVAL,
				"transfer: job %" PRIu64
				": packed flags on a copy-out (use compare)",
				job->id);
	if (job->dir == SEL_COPY_IN && job->compare)
		return eos_fail(-EINVAL, "transfer: job %" PRIu64 ": compare on a copy-in",
				job->id);
	if (x->split && (pages_packed || row_packed || job->compare))
		return eos_fail(-EINVAL,
				"transfer: job %" PRIu64 ": split pools keep per-rank records"
				" (no compare or packing)",
				job->id);
	if (pages_packed && !x->uniform)
		return eos_fail(-EINVAL,
				"transfer: job %" PRIu64 ": packed pages need equal share layouts"
				" on every rank",
				job->id);
	if (row_packed && !x->uniform_row)
		return eos_fail(-EINVAL,
				"transfer: job %" PRIu64 ": a packed row needs equal share layouts"
				" and row sizes on every rank",
				job->id);
	for (uint32_t i = 0; i < job->n_pages; i++)
		if (job->pages[i] >= x->page_limit)
			return eos_fail(-EINVAL,
					"transfer: job %" PRIu64 ": page id %" PRIu32
					" (entry %" PRIu32 ") beyond %" PRIu64 " pages",
					job->id, job->pages[i], i, x->page_limit);
	if (job->first_share && (!pages_packed || job->first_share >= x->ranks))
		return eos_fail(-EINVAL,
				"transfer: job %" PRIu64 ": first share %" PRIu32
				" (expected 0, or below %" PRIu32 " on packed pages)",
				job->id, job->first_share, x->ranks);
	uint64_t np = pages_packed ? ceil_div((uint64_t)job->first_share + job->n_pages, x->ranks)
				   : job->n_pages;
	if ((rc = check_slots(x, job->page_slots, np, "page")))
		return rc;
	if (job->row) {
		if (job->state_slot >= x->row_limit)
			return eos_fail(-EINVAL,
					"transfer: job %" PRIu64 ": state slot %" PRIu32
					" beyond %" PRIu64 " rows",
					job->id, job->state_slot, x->row_limit);
		uint64_t nr = row_packed ? ceil_div(x->l->row_slots, x->ranks) : x->l->row_slots;
		if ((rc = check_slots(x, job->row_slots, nr, "row")))
			return rc;
	}
	return 0;
}

int sel_xfer_submit(sel_xfer *x, struct sel_xfer_job *job)
{
	int rc;
	if (!job)
		return eos_fail(-EINVAL, "transfer: no job");
	if ((rc = validate(x, job)))
		return rc;

	pthread_mutex_lock(&x->submit);
	if (x->closing) {
		pthread_mutex_unlock(&x->submit);
		return eos_fail(SEL_ESTOPPED, "transfer: closed, job %" PRIu64 " refused", job->id);
	}
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct ring *q = &x->rank[r].ring;
		pthread_mutex_lock(&q->lock);
		bool full = q->count == q->cap;
		pthread_mutex_unlock(&q->lock);
		if (full) {
			pthread_mutex_unlock(&x->submit);
			return eos_fail(-EAGAIN,
					"transfer: rank %" PRIu32 " channel is full (%" PRIu32
					" jobs)",
					r, q->cap);
		}
	}

	job->status = 0;
	job->failed_rank = 0;
	job->pages_replicated = job->row_replicated = false;
	job->bytes = 0;
	job->done_ns = 0;
	job->submit_ns = eos_now_ns();
	job->priv.pending = x->ranks;
	job->priv.next = NULL;
	if (job->n_pages == 0)
		job->pages_packed = false;
	if (!job->row)
		job->row_packed = false;

	pthread_mutex_lock(&x->done);
	x->running++;
	pthread_mutex_unlock(&x->done);
	atomic_fetch_add(&x->inflight, 1);

	/* Room was found above and only submitters (serialised) push. */
	bool defer = atomic_load(&x->defer);
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct ring *q = &x->rank[r].ring;
		pthread_mutex_lock(&q->lock);
		assert(q->count < q->cap);
		q->q[(q->head + q->count) % q->cap] = job;
		q->count++;
		atomic_fetch_add_explicit(&q->seq, 1, memory_order_release);
		if (q->asleep && defer) {
			q->kick = true;
			atomic_store(&x->kick_any, true);
		} else if (q->asleep) {
			q->asleep = false; /* one signal per sleep */
			pthread_cond_signal(&q->cv);
			atomic_fetch_add_explicit(&x->wakes, 1, memory_order_relaxed);
		}
		pthread_mutex_unlock(&q->lock);
	}
	pthread_mutex_unlock(&x->submit);
	debug_check(x);
	return 0;
}

/* Read the eventfd (under the completion mutex), counting what it
 * returned; a failed read (EAGAIN: nothing written) counts nothing. */
static void consume_efd(sel_xfer *x)
{
	eventfd_t v;
	if (eventfd_read(x->efd, &v) == 0)
		x->consumed += v;
}

int sel_xfer_poll(sel_xfer *x, struct sel_xfer_job **done, size_t cap)
{
	int n = 0;
	if (cap > INT32_MAX)
		cap = INT32_MAX;
	pthread_mutex_lock(&x->done);
	while ((size_t)n < cap && x->head) {
		struct sel_xfer_job *job = x->head;
		x->head = job->priv.next;
		job->priv.next = NULL;
		done[n++] = job;
		x->ndone--;
	}
	if (!x->head)
		x->tail = NULL;
	if (x->ndone == 0 && x->owed != x->consumed)
		consume_efd(x);
	pthread_mutex_unlock(&x->done);
	atomic_fetch_sub(&x->inflight, (uint32_t)n);
	debug_check(x);
	return n;
}

bool sel_xfer_warm(sel_xfer *x)
{
	bool read = false;
	/* The submission's locks, taken and left (sel_xfer_submit's path). */
	pthread_mutex_lock(&x->submit);
	for (uint32_t r = 0; r < x->ranks; r++) {
		pthread_mutex_lock(&x->rank[r].ring.lock);
		pthread_mutex_unlock(&x->rank[r].ring.lock);
	}
	pthread_mutex_unlock(&x->submit);
	pthread_mutex_lock(&x->done);
	if (x->ndone == 0 && x->owed == x->consumed) {
		/* Every owed write was consumed and none is on its way (a new
		 * one is owed under this mutex first): the count is zero and
		 * the read fails with EAGAIN.  Counted all the same, so that
		 * the accounting stays exact whatever it returns. */
		consume_efd(x);
		read = true;
	}
	pthread_mutex_unlock(&x->done);
	debug_check(x);
	return read;
}

int sel_xfer_fd(const sel_xfer *x) { return x->efd; }

void sel_xfer_set_landed(sel_xfer *x, const sel_landed_hook *hook)
{
	x->landed = hook ? *hook : (sel_landed_hook){0};
}

void sel_xfer_defer_wakes(sel_xfer *x, bool defer)
{
	atomic_store(&x->defer, defer);
	/* A thread already asleep chose its kind of wait before: let it
	 * choose again (with the backstop, in deferred mode). */
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct ring *q = &x->rank[r].ring;
		pthread_mutex_lock(&q->lock);
		pthread_cond_broadcast(&q->cv);
		pthread_mutex_unlock(&q->lock);
	}
}

void sel_xfer_set_spin(sel_xfer *x, uint64_t spin_ns) { atomic_store(&x->spin_ns, spin_ns); }

int sel_xfer_kick(sel_xfer *x)
{
	int n = 0;
	if (!atomic_load_explicit(&x->kick_any, memory_order_relaxed))
		return 0;
	atomic_store(&x->kick_any, false);
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct ring *q = &x->rank[r].ring;
		pthread_mutex_lock(&q->lock);
		if (q->kick && q->asleep) {
			q->asleep = false;
			pthread_cond_signal(&q->cv);
			n++;
		}
		q->kick = false;
		pthread_mutex_unlock(&q->lock);
	}
	atomic_fetch_add_explicit(&x->wakes, (uint64_t)n, memory_order_relaxed);
	return n;
}

uint64_t sel_xfer_wakes(const sel_xfer *x)
{
	return atomic_load_explicit(&((sel_xfer *)x)->wakes, memory_order_relaxed);
}

uint32_t sel_xfer_sleeping(const sel_xfer *cx)
{
	sel_xfer *x = (sel_xfer *)cx;
	uint32_t n = 0;
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct ring *q = &x->rank[r].ring;
		pthread_mutex_lock(&q->lock);
		n += q->asleep;
		pthread_mutex_unlock(&q->lock);
	}
	return n;
}

uint32_t sel_xfer_inflight(const sel_xfer *x) { return atomic_load(&((sel_xfer *)x)->inflight); }

/* ---- Close --------------------------------------------------------------- */

int sel_xfer_close(sel_xfer *x, uint64_t deadline_ns)
{
	uint32_t stuck = 0;

	if (!x)
		return 0;
	if (x->closed) {
		if (x->close_rc)
			return eos_fail(x->close_rc,
					"transfer: closed earlier with threads that did not drain");
		return 0;
	}
	x->closed = true;

	pthread_mutex_lock(&x->submit);
	x->closing = true;
	pthread_mutex_unlock(&x->submit);
	stop_rings(x);

	pthread_mutex_lock(&x->life);
	while (x->exited < x->started) {
		if (deadline_ns == 0) {
			pthread_cond_wait(&x->life_cv, &x->life);
			continue;
		}
		struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u),
				      .tv_nsec = (long)(deadline_ns % 1000000000u)};
		if (pthread_cond_timedwait(&x->life_cv, &x->life, &ts) == ETIMEDOUT)
			break;
	}
	bool all = x->exited == x->started;
	pthread_mutex_unlock(&x->life);

	if (all) {
		join_all(x);
		return 0;
	}

	/* Give up on the stragglers: no further job, no report. */
	atomic_store(&x->abandon, true);
	stop_rings(x); /* wakes idle threads so they see abandon */
	for (uint32_t r = 0; r < x->ranks; r++) {
		struct rank *rk = &x->rank[r];
		if (!rk->running)
			continue;
		pthread_mutex_lock(&x->life);
		bool exited = rk->exited;
		pthread_mutex_unlock(&x->life);
		if (exited) {
			pthread_join(rk->tid, NULL);
		} else {
			pthread_detach(rk->tid);
			stuck++;
		}
		rk->running = false;
	}
	x->leaked = true;
	pthread_mutex_lock(&grave_lock);
	x->grave_next = graveyard;
	graveyard = x;
	pthread_mutex_unlock(&grave_lock);
	x->close_rc = SEL_ESTOPPED;
	return eos_fail(SEL_ESTOPPED,
			"transfer: %" PRIu32 " of %" PRIu32 " rank threads did not drain by the"
			" deadline; they were detached and their memory is kept",
			stuck, x->ranks);
}

void sel_xfer_destroy(sel_xfer *x)
{
	if (!x)
		return;
	if (!x->closed)
		(void)sel_xfer_close(x, 0);
	if (x->leaked)
		return;
	free_set(x);
}
