/*
 * store_disk_staged.c - the Staged transport of the disk store: records
 * streamed window by window between the GPU and record files through
 * intake slots (design 2.4 "Staged shares the host slot pool with the
 * memory store and owns an independent transfer handle and the disk
 * thread"; 2.5 windows, TP representation, the disk thread; 2.10 the
 * worker never waits).
 *
 * DESIGN
 *
 * A stream is one put or one fetch: a plan of windows, each <= 64 page
 * records of one node (a fetch reads the row first, in a window of its
 * own, unless the store is sharded; otherwise the row goes with the last
 * window, or, for a TP > 1 put that decides over several windows, with
 * the first), at most WINDOWS_IN_FLIGHT of them live at once (a put:
 * PUT_WINDOWS_IN_FLIGHT windows of PUT_WINDOW_PAGES, issue 18).
 *
 *   put window:   copy-out (transfer set) of GPU pages into intake slots,
 *                 then a SEL_DISK_WRITE_PART of those slots, then the slots
 *                 go back.  The part that ends the record commits the file
 *                 (rename).
 *   fetch window: a SEL_DISK_READ of [first, first + count) of the node's
 *                 file into intake slots (verified by the disk thread),
 *                 then a copy-in to the ticket's page ids (and row), then
 *                 the slots go back.
 *
 * A window that finds no free intake slots puts its stream on the wait
 * FIFO, served oldest first as slots come back, so a fetch never fails for
 * lack of staging.  Submissions never fail either: a full copy or disk
 * queue keeps the window on a FIFO that poll flushes in order, and a
 * refusal other than a full queue completes it with that status at the
 * next poll (the eventfd says so).  Every window, job and stream is one
 * malloc'd block owning what the threads read.
 *
 * TP > 1 (design 2.5): a put decides its record's representation from its
 * first window.  That window's copy-out compares the ranks' bytes (packing
 * equal ones in place); later windows wait for it.  If every page matched,
 * the pages are stored once (SEL_RECORD_PAGES_REPLICATED) and later
 * windows compare too: one whose pages differ fails the stream (-EILSEQ,
 * SEL_SKIPPED; the temporary is discarded), so no partial or mixed record
 * is written.  The row is decided by the same window: when the ranks' rows
 * can be equal (uniform rows), a record of several windows copies its row
 * with the first, and the stream keeps those row slots for the last part,
 * which writes the row (rslots, riov).  The file length, budget charge and
 * counters follow the decision.
 *
 * A stream ends when its last window drained.  A failed put's event waits
 * for a DISCARD job that removes its temporary (the job holds the event),
 * so whoever sees the failure finds no temporary of it left; ENOSPC and
 * EDQUOT report SEL_DEFERRED (a refusal, never progress), other errors
 * SEL_SKIPPED (io_error counted for terminal disk errors).  A fetch's
 * read that fails verification dooms the record (store_disk_catalog.c).
 *
 * INVARIANTS
 *
 *   1. live_win <= WINDOWS_IN_FLIGHT (a put: PUT_WINDOWS_IN_FLIGHT); next_win <= n_win; a stream is
 *      finished exactly once, when live_win == 0 and it failed or started
 *      every window, and it is not waiting.
 *   2. A window holds its n_slots intake slots from win_start to win_free.
 *   3. A window or job is on at most one submission FIFO at a time.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "slab.h"
#include "store_disk_int.h"

/* ---- disk and copy submission ------------------------------------------------ */

static void df_push(struct disk_store *ds, struct dj *d, int rc)
{
	d->j.status = rc;
	snprintf(d->j.errmsg, sizeof d->j.errmsg, "%s", eos_errmsg());
	djq_push(&ds->df, d);
	sel_evq_wake(&ds->evq);
}

/* A refusal by a thread's queue other than a full one. */
static void submit_refused(struct disk_store *ds, int rc)
{
	if (rc == SEL_ESTOPPED)
		ds->c.stopped = true;
}

void ds_disk_submit(struct disk_store *ds, struct dj *d)
{
	d->j.id = ++ds->c.job_seq;
	if (!ds->dq.head) {
		int rc = sel_disk_submit(ds->disk, &d->j);
		if (rc == 0) {
			ds->disk_out++;
			return;
		}
		if (rc != -EAGAIN) {
			submit_refused(ds, rc);
			df_push(ds, d, rc);
			return;
		}
	}
	djq_push(&ds->dq, d);
}

static void disk_flush(struct disk_store *ds)
{
	struct dj *d;
	while ((d = ds->dq.head)) {
		int rc = sel_disk_submit(ds->disk, &d->j);
		if (rc == -EAGAIN)
			return;
		(void)djq_pop(&ds->dq);
		if (rc == 0) {
			ds->disk_out++;
		} else {
			submit_refused(ds, rc);
			df_push(ds, d, rc);
		}
	}
}

static void xf_push(struct disk_store *ds, struct dwin *w, int rc)
{
	w->x.status = rc;
	dwq_push(&ds->xf, w);
	sel_evq_wake(&ds->evq);
}

static void xfer_submit(struct disk_store *ds, struct dwin *w)
{
	w->x.id = ++ds->c.job_seq;
	if (!ds->xq.head) {
		int rc = sel_xfer_submit(ds->c.xfer, &w->x);
		if (rc == 0)
			return;
		if (rc != -EAGAIN) {
			submit_refused(ds, rc);
			xf_push(ds, w, rc);
			return;
		}
	}
	dwq_push(&ds->xq, w);
}

static void xfer_flush(struct disk_store *ds)
{
	struct dwin *w;
	while ((w = ds->xq.head)) {
		int rc = sel_xfer_submit(ds->c.xfer, &w->x);
		if (rc == -EAGAIN)
			return;
		(void)dwq_pop(&ds->xq);
		if (rc != 0) {
			submit_refused(ds, rc);
			xf_push(ds, w, rc);
		}
	}
}

struct dj *ds_job_new(struct disk_store *ds, uint8_t kind, sel_node_id id, enum sel_disk_op op)
{
	struct dj *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->kind = kind;
	d->node = id;
	d->standalone = true;
	d->j.op = op;
	ds_job_rec(ds, id, &d->j);
	jobs_push(&ds->jobs, d);
	return d;
}

void ds_job_free(struct disk_store *ds, struct dj *d)
{
	jobs_del(&ds->jobs, d);
	free(d->held);
	free(d);
}

/* ---- streams and windows ------------------------------------------------------- */

static struct dstream *stream_new(struct disk_store *ds, uint32_t n_ids, uint32_t n_win,
				  uint32_t n_nodes)
{
	size_t sz = sizeof(struct dstream) + (size_t)n_win * sizeof(struct wplan) +
		    (size_t)n_nodes * sizeof(sel_node_id) + (size_t)n_ids * sizeof(uint32_t);
	struct dstream *st = calloc(1, sz);
	if (!st)
		return NULL;
	st->plan = (struct wplan *)(st + 1);
	st->nodes = (sel_node_id *)(st->plan + n_win);
	st->ids = (uint32_t *)(st->nodes + n_nodes);
	st->n_ids = n_ids;
	st->n_win = n_win;
	st->n_nodes = n_nodes;
	st->submit_ns = eos_now_ns();
	streams_push(&ds->streams, st);
	return st;
}

/* Unlink and free a stream block and the row slots it kept (a put deciding
 * over several windows). */
void ds_stream_free(struct disk_store *ds, struct dstream *st)
{
	streams_del(&ds->streams, st);
	if (st->n_rslots)
		(void)sel_slab_free(ds->pool, st->rslots, st->n_rslots);
	free(st->rslots);
	free(st->riov);
	free(st->into);
	free(st);
}

void ds_win_free(struct disk_store *ds, struct dwin *w)
{
	if (w->n_slots && !w->borrowed)
		(void)sel_slab_free(ds->pool, w->slots, w->n_slots);
	wins_del(&ds->wins, w);
	free(w);
}

static void stream_finish(struct disk_store *ds, struct dstream *st);

static void stream_fail(struct dstream *st, int rc)
{
	if (!st->status)
		st->status = rc ? rc : -EIO;
}

/* Slots a window of the plan needs. */
static uint32_t win_slots(const struct disk_store *ds, const struct dstream *st,
			  const struct wplan *p, uint32_t flags, uint32_t *pages, uint32_t *rows)
{
	uint32_t ps = (flags & SEL_RECORD_PAGES_REPLICATED) ? sel_div_up(p->count, ds->c.ranks)
							    : p->count;
	uint32_t rs = 0;
	if (p->row)
		rs = st->put ? ds->c.row_slots : sel_record_row_slots(&ds->ns->layout, flags);
	*pages = ps;
	*rows = rs;
	return ps + rs;
}

/* The addresses of w's page records and row pieces in its slots, laid out
 * as flags (SEL_RECORD_*_REPLICATED) say. */
static int win_addrs(struct disk_store *ds, struct dwin *w, uint32_t flags)
{
	return sel_store_pool_map(ds->c.sp, flags, w->slots, w->n_page_slots,
				  w->p.row ? w->n_row_slots : 0, 0, w->p.count, w->addr, w->iov,
				  ds->iov_cap, &w->n_iov);
}

/* A window block for plan p with its intake slots, or NULL (1: no slots
 * now; else an error) in *rc. */
static struct dwin *win_new(struct disk_store *ds, struct dstream *st, const struct wplan *p,
			    uint32_t flags, int *rc)
{
	uint32_t np, nr, need = win_slots(ds, st, p, flags, &np, &nr);
	*rc = 1;
	if (!st->into && !sel_slab_can_alloc(ds->pool, need, SEL_SLAB_INTAKE))
		return NULL;
	size_t sz = sizeof(struct dwin) + (size_t)need * sizeof(uint32_t) +
		    (size_t)p->count * sizeof(void *) + (size_t)ds->iov_cap * sizeof(struct iovec);
	struct dwin *w = calloc(1, sz + sizeof(void *));
	if (!w) {
		*rc = eos_fail(-ENOMEM, "disk store: out of memory for a window");
		return NULL;
	}
	w->slots = (uint32_t *)(w + 1);
	w->addr = (void **)eos_round_up((uintptr_t)(w->slots + need), sizeof(void *));
	w->iov = (struct iovec *)(w->addr + p->count);
	if (st->into) {
		/* The caller's slots of the node: the page records from the
		 * window's first (a multiple of the ranks when packed:
		 * sel_disk_store_fetch_into), or the row's. */
		const struct sel_disk_into *n = &st->into[p->node_i];
		bool packed = flags & SEL_RECORD_PAGES_REPLICATED;
		w->slots =
			(uint32_t *)n->slots +
			(p->count ? (packed ? p->first / ds->c.ranks : p->first) : n->n_page_slots);
		w->borrowed = true;
	} else if (sel_slab_alloc(ds->pool, need, SEL_SLAB_INTAKE, w->slots) != 0) {
		free(w);
		return NULL;
	}
	w->st = st;
	w->p = *p;
	w->begin = st->next_win == 0;
	w->end = st->next_win + 1 == st->n_win;
	w->flags = flags;
	w->n_slots = need;
	w->n_page_slots = np;
	w->n_row_slots = nr;
	wins_push(&ds->wins, w);
	w->dj.kind = st->put ? K_PUT_WIN : K_FETCH_WIN;
	w->dj.w = w;
	*rc = 0;
	return w;
}

/* A put window's copy-out: submitted now (direct) or through the FIFO. */
static int put_win_submit(struct disk_store *ds, struct dstream *st, struct dwin *w, bool direct)
{
	const struct wplan *p = &st->plan[st->next_win - 1];
	w->x.dir = SEL_COPY_OUT;
	w->x.n_pages = p->count;
	w->x.pages = st->ids + p->dst_at;
	w->x.page_slots = w->slots;
	w->x.row = p->row;
	w->x.state_slot = st->state_slot;
	w->x.row_slots = w->slots + w->n_page_slots;
	/* Compare the ranks' bytes (and pack equal ones in place) in the window
	 * that decides, and in later ones of a replicated record to prove they
	 * match too. */
	w->x.compare = st->decide && (!st->decided || (st->flags & SEL_RECORD_PAGES_REPLICATED));
	if (!direct) {
		xfer_submit(ds, w);
		return 0;
	}
	w->x.id = ++ds->c.job_seq;
	int rc = sel_xfer_submit(ds->c.xfer, &w->x);
	if (rc) {
		st->next_win--;
		st->live_win--;
		ds_win_free(ds, w);
		submit_refused(ds, rc);
	}
	return rc;
}

int ds_win_start(struct disk_store *ds, struct dstream *st, bool direct)
{
	const struct wplan *p = &st->plan[st->next_win];
	sel_node_id id = st->nodes[p->node_i];
	uint32_t flags = st->put ? 0 : ds_rec(ds, id)->flags;
	int rc;
	struct dwin *w = win_new(ds, st, p, flags, &rc);
	if (!w)
		return rc;
	if ((rc = win_addrs(ds, w, flags))) {
		ds_win_free(ds, w);
		return rc;
	}
	st->next_win++;
	st->live_win++;
	if (st->put)
		return put_win_submit(ds, st, w, direct);
	struct sel_disk_job *j = &w->dj.j;
	j->op = SEL_DISK_READ;
	ds_job_rec(ds, id, j);
	j->first = p->first;
	j->count = p->count;
	j->pages = w->addr;
	j->row = p->row;
	j->row_iov = p->row ? w->iov : NULL;
	j->row_n = p->row ? w->n_iov : 0;
	if (p == st->plan && st->n_sums) { /* node 0's first read: the head's checksums */
		j->sums = st->sums;
		j->sums_first = st->sums_first;
		j->n_sums = st->n_sums;
	}
	ds_disk_submit(ds, &w->dj);
	return 0;
}

static void wait_add(struct disk_store *ds, struct dstream *st)
{
	if (st->waiting)
		return;
	st->waiting = true;
	waitq_push(&ds->wait, st);
}

void ds_stream_pump(struct disk_store *ds, struct dstream *st)
{
	while (!st->status && st->next_win < st->n_win &&
	       st->live_win < (st->put    ? PUT_WINDOWS_IN_FLIGHT
			       : st->into ? INTO_WINDOWS_IN_FLIGHT
					  : WINDOWS_IN_FLIGHT) &&
	       !(st->decide && !st->decided && st->next_win > 0)) {
		int rc = ds_win_start(ds, st, false);
		if (rc == 1) {
			wait_add(ds, st);
			return;
		}
		if (rc < 0)
			stream_fail(st, rc);
	}
	if (st->live_win == 0 && st->sums_live == 0 && !st->endj &&
	    (st->status || st->next_win == st->n_win) && !st->waiting)
		stream_finish(ds, st);
}

/* Serve streams waiting for slots, oldest first. */
static void wait_pump(struct disk_store *ds)
{
	struct dstream_fifo list = ds->wait;
	struct dstream *st;
	ds->wait.head = ds->wait.tail = NULL;
	while ((st = waitq_pop(&list))) {
		st->waiting = false;
		ds_stream_pump(ds, st);
	}
}

static bool budget_error(int rc) { return rc == -ENOSPC || rc == -EDQUOT; }

/* A window's last stage ended. */
static void win_end(struct disk_store *ds, struct dwin *w)
{
	struct dstream *st = w->st;
	/* A put deferred for budget gives its slots back with its refusal
	 * (put_failed, in the pump below when this was its last window):
	 * that is no progress.  Read now: the pump may free st. */
	bool deferred = st->put && budget_error(st->status);
	ds_win_free(ds, w);
	st->live_win--;
	ds_stream_pump(ds, st);
	/* Intake slots came back before the stream's end: a put refused for
	 * slots may go through now, so the poll says so (SEL_EV_PROGRESS)
	 * instead of leaving it to the stream's STORED, a whole record later
	 * (bench/store lost 5-10 ms per record to that).  Not while streams
	 * wait for slots: a new put would queue behind them anyway. */
	if (!deferred && !ds->wait.head && sel_slab_can_alloc(ds->pool, 1, SEL_SLAB_INTAKE))
		ds->c.pg.released = true;
}

/* ---- puts: the representation (TP > 1) and the write parts --------------------- */

/* The first window decided fl: the record's file length and charge follow. */
static bool apply_decision(struct disk_store *ds, struct dstream *st, uint32_t fl)
{
	sel_node_id id = st->nodes[0];
	struct drec *r = ds_rec(ds, id);
	sel_record_desc d;
	sel_record_span span;
	r->flags = fl;
	ds_node_desc(ds, id, &d);
	if (sel_record_span_of(&ds->ns->layout.sz, &d, &span) != 0) {
		r->flags = 0;
		stream_fail(st, -EINVAL);
		return false;
	}
	uint64_t bytes = (NODE(ds, id)->flags & SEL_NODE_HAS_ROW) ? span.row_end : span.row_off;
	r->full = span.row_end;
	r->rowseg = span.row_end - span.row_off;
	if (bytes < r->charged) {
		ds->used -= r->charged - bytes;
		r->charged = bytes;
		ds->c.pg.released = true; /* budget */
	}
	return true;
}

/* The row came with the first window: its slots and pieces move to the
 * stream for the last part (freed at its end). */
static bool keep_row(struct dstream *st, struct dwin *w)
{
	st->rslots = malloc((size_t)w->n_row_slots * sizeof(uint32_t));
	st->riov = malloc((size_t)(w->n_iov ? w->n_iov : 1) * sizeof(struct iovec));
	if (!st->rslots || !st->riov) {
		free(st->rslots);
		free(st->riov);
		st->rslots = NULL;
		st->riov = NULL;
		stream_fail(st, eos_fail(-ENOMEM, "disk store: out of memory for a row"));
		return false;
	}
	memcpy(st->rslots, w->slots + w->n_page_slots, (size_t)w->n_row_slots * sizeof(uint32_t));
	memcpy(st->riov, w->iov, (size_t)w->n_iov * sizeof(struct iovec));
	st->n_rslots = w->n_row_slots;
	st->n_riov = w->n_iov;
	w->n_slots -= w->n_row_slots; /* win_free leaves them */
	w->n_row_slots = 0;
	w->n_iov = 0;
	return true;
}

/* TP > 1 (design 2.5): a disk-only record's representation is decided from
 * its first window's copy-out.  Pages are stored once (replicated) when
 * every rank's pages matched there; the row too when that window carries
 * it.  A later window of a replicated record whose pages differ fails the
 * stream: no partial or mixed record is written.  Returns false when the
 * stream failed. */
static bool put_decide(struct disk_store *ds, struct dstream *st, struct dwin *w)
{
	if (!st->decided) {
		st->decided = true;
		uint32_t fl = 0;
		if (w->p.count && w->x.pages_replicated)
			fl |= SEL_RECORD_PAGES_REPLICATED;
		if (w->p.row && w->x.row_replicated)
			fl |= SEL_RECORD_ROW_REPLICATED;
		st->flags = fl;
		if (fl && !apply_decision(ds, st, fl))
			return false;
		ds_stream_pump(ds, st); /* the windows held back for the decision */
	} else if ((st->flags & SEL_RECORD_PAGES_REPLICATED) && w->p.count &&
		   !w->x.pages_replicated) {
		stream_fail(st, eos_fail(-EILSEQ,
					 "disk store: checkpoint %" PRIu64 ": pages %" PRIu32
					 "..%" PRIu32
					 " differ across ranks, the first window's did not;"
					 " the record is abandoned",
					 st->id, w->p.first, w->p.first + w->p.count - 1));
		ds->c.st.abandoned_stores++;
		return false;
	}
	/* Slots hold pages and the row as the copy left them (packed in place
	 * where they matched and compare ran): as the record stores them, or
	 * this is a bug caught before any byte is written. */
	uint32_t as =
		(w->x.compare && w->x.pages_replicated && w->p.count ? SEL_RECORD_PAGES_REPLICATED
								     : 0) |
		(w->x.compare && w->x.row_replicated && w->p.row ? SEL_RECORD_ROW_REPLICATED : 0);
	uint32_t want = (w->p.count ? st->flags & SEL_RECORD_PAGES_REPLICATED : 0) |
			(w->p.row ? st->flags & SEL_RECORD_ROW_REPLICATED : 0);
	if (as != want) {
		stream_fail(st,
			    eos_fail(-EINVAL,
				     "disk store: checkpoint %" PRIu64 ": window at page %" PRIu32
				     " copied out with flags 0x%" PRIx32 ", the record's"
				     " are 0x%" PRIx32,
				     st->id, w->p.first, as, want));
		return false;
	}
	int rc = win_addrs(ds, w, st->flags);
	if (rc) {
		stream_fail(st, rc);
		return false;
	}
	return !(w->p.row && !w->end) || keep_row(st, w);
}

/* Issue 18: the last window of a record of several windows writes its
 * pages as a middle part and gives its intake slots back when they are
 * written; a separate END part (no pages: the row, kept by the stream, and
 * the header) follows it on the disk thread, which starts it beside the
 * window's part and commits once every part has been written (disk.c).
 * Before, the window held its slots through the commit chain (close,
 * rename, directory fsync: 10-12 ms a record in bench/store's trace) while
 * the intake holds two windows.  False: out of memory, the window ends
 * the record itself. */
static bool put_end_apart(struct disk_store *ds, struct dstream *st, struct dwin *w)
{
	if (w->begin || ds->sh)
		return false;
	struct dj *d = ds_job_new(ds, K_PUT_END, st->nodes[0], SEL_DISK_WRITE_PART);
	if (!d)
		return false;
	if (w->p.row && !st->riov && !keep_row(st, w)) {
		ds_job_free(ds, d);
		return false;
	}
	sel_node_id id = st->nodes[0];
	struct sel_disk_job *j = &d->j;
	d->st = st;
	ds_node_desc(ds, id, &j->rec);
	j->want = (struct eos_file_id){0}; /* as a window's part: a write checks no file */
	j->first = w->p.first + w->p.count;
	j->part = SEL_DISK_PART_END;
	j->row = NODE(ds, id)->flags & SEL_NODE_HAS_ROW;
	j->row_iov = j->row ? st->riov : NULL;
	j->row_n = j->row ? st->n_riov : 0;
	j->created_ns = st->created_ns;
	st->endj = d;
	return true;
}

static void put_copied(struct disk_store *ds, struct dwin *w)
{
	struct dstream *st = w->st;
	if (w->x.status)
		stream_fail(st, w->x.status);
	if ((!st->status && st->decide && !put_decide(ds, st, w)) || st->status) {
		win_end(ds, w);
		return;
	}
	sel_node_id id = st->nodes[0];
	struct sel_disk_job *j = &w->dj.j;
	j->op = SEL_DISK_WRITE_PART;
	ds_node_desc(ds, id, &j->rec);
	j->first = w->p.first;
	j->count = w->p.count;
	j->part = (w->begin ? SEL_DISK_PART_BEGIN : 0) | (w->end ? SEL_DISK_PART_END : 0);
	j->row = NODE(ds, id)->flags & SEL_NODE_HAS_ROW;
	j->pages = w->addr;
	j->row_iov = w->end && j->row ? (st->riov ? st->riov : w->iov) : NULL;
	j->row_n = w->end && j->row ? (st->riov ? st->n_riov : w->n_iov) : 0;
	j->created_ns = st->created_ns;
	st->parts_sent = true;
	if (w->end && put_end_apart(ds, st, w)) {
		j->part &= ~SEL_DISK_PART_END;
		j->row_iov = NULL;
		j->row_n = 0;
		ds_disk_submit(ds, &w->dj);
		ds_disk_submit(ds, st->endj);
		return;
	}
	ds_disk_submit(ds, &w->dj);
}

struct dstream *ds_put_stream(struct disk_store *ds, const sel_published *cp, uint32_t tail,
			      bool row)
{
	uint32_t n_win = tail ? sel_div_up(tail, PUT_WINDOW_PAGES) : 1;
	struct dstream *st = stream_new(ds, tail, n_win, 1);
	if (!st) {
		eos_fail(-ENOMEM, "disk store: out of memory for a stream of %" PRIu32 " pages",
			 tail);
		return NULL;
	}
	const struct sel_record_sizes *sz = &ds->ns->layout.sz;
	st->put = true;
	st->id = cp->checkpoint;
	st->key = cp->key;
	st->state_slot = cp->state_slot;
	st->bytes = sel_core_record_bytes(&ds->c, tail, row);
	st->decide = ds->c.ranks > 1 && (sz->uniform_planes || sz->uniform_row);
	if (tail) /* a record shorter than a page has no page ids (cp->pages may be NULL) */
		memcpy(st->ids, cp->pages + (cp->n_pages - tail), (size_t)tail * sizeof(uint32_t));
	/* A record that decides its representation over several windows copies
	 * its row with the first (so both decisions come from it), and keeps the
	 * row's slots until the last part writes them. */
	bool row_first = st->decide && sz->uniform_row && n_win > 1;
	for (uint32_t k = 0; k < n_win; k++) {
		uint32_t first = k * PUT_WINDOW_PAGES;
		uint32_t cnt = tail - first < PUT_WINDOW_PAGES ? tail - first : PUT_WINDOW_PAGES;
		bool has_row = row && (row_first ? k == 0 : k + 1 == n_win);
		st->plan[k] = (struct wplan){.node_i = 0,
					     .first = first,
					     .count = tail ? cnt : 0,
					     .dst_at = first,
					     .row = has_row};
	}
	return st;
}

/* ---- fetches ------------------------------------------------------------------------ */

static void fetch_read(struct disk_store *ds, struct dwin *w)
{
	struct dstream *st = w->st;
	int rc = w->dj.j.status;
	if (rc) {
		stream_fail(st, rc);
		ds_read_failed(ds, st->nodes[w->p.node_i], rc);
	}
	if (st->status) {
		win_end(ds, w);
		return;
	}
	w->x.dir = SEL_COPY_IN;
	w->x.n_pages = w->p.count;
	w->x.pages = st->ids + w->p.dst_at;
	w->x.page_slots = w->slots;
	w->x.pages_packed = w->flags & SEL_RECORD_PAGES_REPLICATED;
	w->x.row = w->p.row;
	w->x.state_slot = st->state_slot;
	w->x.row_slots = w->slots + w->n_page_slots;
	w->x.row_packed = w->p.row && (w->flags & SEL_RECORD_ROW_REPLICATED);
	xfer_submit(ds, w);
}

/* Overlapped restores (issue 18, sel_inbound.sums): the checksums of the n
 * pages below a fetch's resident, the head its caller recomputes, come
 * from the records that hold them -- the one the fetch's first window
 * reads anyway (that read copies them), and, for a head reaching into
 * ancestors the fetch does not read, one K_SUMS job each: a READ of no
 * page record that checks the header and copies the entries from the
 * checksum segment.  A record's checksum is the page digest
 * (sel_page_digest) only when its stored page records are exactly the
 * planes' bytes: no padding (docs/record-format.md leaves padding
 * undefined, so a padded record's checksum cannot be recomputed from the
 * planes) and one share per rank (not replicated). */
struct hsum {
	sel_node_id id;
	uint32_t first, n, at; /* page records [first, +n) give sums[at, +n) */
};

static int head_sums_plan(struct disk_store *ds, const sel_hit *hit, uint32_t n, struct hsum **out,
			  uint32_t *n_out)
{
	const sel_record_layout *l = &ds->ns->layout;
	uint64_t unpadded = 0, P = ds->c.base.page_tokens;
	for (uint32_t r = 0; r < l->ranks; r++)
		for (uint32_t i = 0; i < l->n_planes[r]; i++)
			unpadded += l->unit[r][i];
	bool padded = unpadded != l->sz.page_record;
	if (ds->sh || hit->resident % P)
		return eos_fail(-ENOTSUP, "disk store: %s",
				ds->sh ? "ranks on hosts give no page digests"
				       : "a head not ending on a page");
	struct sel_chain_walk hw;
	int rc = sel_core_walk(&ds->c, &hit->key, hit->resident - n * P, &hw);
	if (rc)
		return rc;
	struct hsum *hs = calloc(hw.n ? hw.n : 1, sizeof *hs);
	if (!hs)
		return eos_fail(-ENOMEM, "disk store: out of memory");
	uint32_t k = 0, m = 0;
	for (uint32_t i = 0; i < hw.n && k < n; i++) {
		sel_node_id id = hw.ids[i];
		uint32_t tail = NODE(ds, id)->tail_pages, f = i == 0 ? hw.skip : 0;
		if (f >= tail)
			continue;
		if (l->ranks > 1 && (ds_rec(ds, id)->flags & SEL_RECORD_PAGES_REPLICATED)) {
			free(hs);
			return eos_fail(-ENOTSUP,
					"disk store: a replicated record gives no page digests");
		}
		if (padded && !ds_rec(ds, id)->pad_zero) {
			free(hs);
			return eos_fail(-ENOTSUP,
					"disk store: a version-3 record's padding is undefined: "
					"no page digests");
		}
		if (!ds_has_file(&ds->c, id)) {
			free(hs);
			return eos_fail(-ESTALE, "disk store: part of the head has no file yet");
		}
		uint32_t c = tail - f < n - k ? tail - f : n - k;
		hs[m++] = (struct hsum){.id = id, .first = f, .n = c, .at = k};
		k += c;
	}
	if (k != n) {
		free(hs);
		return eos_fail(-ESTALE, "disk store: the head's chain changed");
	}
	*out = hs;
	*n_out = m;
	return 0;
}

/* Give st the head's checksums: the last range through its first window's
 * read when that reads the same record, the others through K_SUMS jobs. */
static void head_sums_start(struct disk_store *ds, struct dstream *st, const sel_inbound *in,
			    const struct hsum *hs, uint32_t m)
{
	for (uint32_t i = 0; i < m; i++) {
		if (i + 1 == m && hs[i].id == st->nodes[st->plan[0].node_i]) {
			st->sums = in->sums + hs[i].at;
			st->sums_first = hs[i].first;
			st->n_sums = hs[i].n;
			continue;
		}
		struct dj *d = ds_job_new(ds, K_SUMS, hs[i].id, SEL_DISK_READ);
		if (!d) {
			stream_fail(st, eos_fail(-ENOMEM, "disk store: out of memory"));
			return;
		}
		d->st = st;
		d->j.first = d->j.rec.tail; /* no page record, no row */
		d->j.sums = in->sums + hs[i].at;
		d->j.sums_first = hs[i].first;
		d->j.n_sums = hs[i].n;
		ds_pin(&ds->c, hs[i].id);
		st->sums_live++;
		ds_disk_submit(ds, d);
	}
}

static void sums_done(struct disk_store *ds, struct dj *d)
{
	struct dstream *st = d->st;
	if (d->j.status) {
		stream_fail(st, d->j.status);
		ds_read_failed(ds, d->node, d->j.status);
	}
	ds_unpin(&ds->c, d->node);
	st->sums_live--;
	ds_stream_pump(ds, st);
}

int ds_fetch_stream(struct disk_store *ds, const sel_hit *hit, const sel_inbound *in,
		    const struct sel_chain_walk *w0, struct sel_disk_into *into, void *arg)
{
	/* The head's walk reuses the walk buffer: keep w0's nodes. */
	struct sel_chain_walk wc = *w0;
	const struct sel_chain_walk *w = &wc;
	sel_node_id *ids = NULL;
	struct hsum *hs = NULL;
	uint32_t n_hs = 0;
	if (in->n_sums) {
		if (!(ids = malloc((size_t)w0->n * sizeof *ids)))
			return eos_fail(-ENOMEM, "disk store: out of memory");
		memcpy(ids, w0->ids, (size_t)w0->n * sizeof *ids);
		wc.ids = ids;
		int rc = head_sums_plan(ds, hit, in->n_sums, &hs, &n_hs);
		if (rc) {
			free(ids);
			return rc;
		}
	}
	/* Windows: each node's needed pages in runs of <= 64; the row first
	 * (alone) or last (sharded). */
	uint32_t n_win = 0;
	for (uint32_t i = 0; i < w->n; i++)
		n_win += sel_div_up(NODE(ds, w->ids[i])->tail_pages - (i == 0 ? w->skip : 0),
				    SEL_WINDOW_PAGES);
	const sel_index_node *e = NODE(ds, w->end);
	/* The row in a window of its own, the first (issue 18): it is half of
	 * a Qwen-like restore's bytes, and in one window with the last pages
	 * its read, checksum and copy-in ran after theirs, in series; first
	 * and alone, its checksum and copy overlap the pages' reads.  Not for
	 * a sharded store, whose peers mirror the plan (store_disk_sharded.c). */
	bool row_first = !ds->sh;
	if (row_first || e->tail_pages == (w->n == 1 ? w->skip : 0))
		n_win++; /* the row alone */
	struct dstream *st = stream_new(ds, hit->pages, n_win, w->n);
	if (!st) {
		free(ids);
		free(hs);
		return eos_fail(-ENOMEM,
				"disk store: out of memory for a fetch of %" PRIu32 " pages",
				hit->pages);
	}
	memcpy(st->nodes, w->ids, (size_t)w->n * sizeof(sel_node_id));
	uint32_t k = row_first ? 1 : 0, at = 0;
	for (uint32_t i = 0; i < w->n; i++) {
		uint32_t tail = NODE(ds, st->nodes[i])->tail_pages;
		for (uint32_t f = i == 0 ? w->skip : 0; f < tail; f += SEL_WINDOW_PAGES) {
			uint32_t cnt = tail - f < SEL_WINDOW_PAGES ? tail - f : SEL_WINDOW_PAGES;
			st->plan[k++] =
				(struct wplan){.node_i = i, .first = f, .count = cnt, .dst_at = at};
			at += cnt;
		}
	}
	struct wplan row = {.node_i = w->n - 1, .first = e->tail_pages, .dst_at = at, .row = true};
	if (row_first)
		st->plan[0] = row;
	else if (k < n_win)
		st->plan[k++] = row;
	st->plan[n_win - 1].row |= !row_first;
	memcpy(st->ids, in->pages, (size_t)in->n_pages * sizeof(uint32_t));
	st->put = false;
	st->id = in->ticket;
	st->key = hit->key;
	st->resident = hit->resident;
	st->state_slot = in->state_slot;
	st->bytes = sel_core_record_bytes(&ds->c, hit->pages, true);
	for (uint32_t i = 0; i < w->n; i++)
		ds_pin(&ds->c, st->nodes[i]);
	ds->c.st.fetches++;
	ds->c.st.inflight_in++;
	sel_index_touch(ds->c.ix, w->end);
	st->into = into;
	st->into_arg = arg;
	if (n_hs)
		head_sums_start(ds, st, in, hs, n_hs);
	free(ids);
	free(hs);
	if (ds->sh)
		ds_shard_fetch(ds, st);
	ds_stream_pump(ds, st);
	return 0;
}

static void xfer_done(struct disk_store *ds, struct dwin *w)
{
	if (w->st->put) {
		put_copied(ds, w);
	} else {
		if (w->x.status)
			stream_fail(w->st, w->x.status);
		win_end(ds, w);
	}
}

/* ---- the end of a stream -------------------------------------------------------------- */

static void put_committed(struct disk_store *ds, struct dstream *st, sel_event *ev)
{
	sel_node_id id = st->nodes[0];
	struct drec *r = ds_rec(ds, id);
	r->file = true;
	sel_index_get(ds->c.ix, id)->flags &= (uint16_t)~DS_FAILED;
	sel_index_commit(ds->c.ix, id);
	sel_core_count_stored(&ds->c, st->bytes,
			      r->flags & (SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED));
	ev->type = SEL_EV_STORED;
	ev->outcome = SEL_QUEUED;
	ds_unpin(&ds->c, id);
}

/* A put failed: the node stays, failed, for its children (or goes); the
 * event is returned to be held by the discard of its temporary, or NULL
 * when it goes now. */
static sel_event *put_failed(struct disk_store *ds, struct dstream *st, sel_event *ev)
{
	sel_node_id id = st->nodes[0];
	struct drec *r = ds_rec(ds, id);
	sel_event *held = NULL;
	/* The event waits for the discard: whoever sees it finds no temporary
	 * left of this put. */
	struct dj *d = st->parts_sent ? ds_job_new(ds, K_DISCARD, id, SEL_DISK_DISCARD) : NULL;
	if (d && !(d->held = malloc(sizeof(*d->held)))) {
		/* Out of memory: the event goes now, and the disk thread drops
		 * the temporary at close. */
		jobs_del(&ds->jobs, d);
		free(d);
		d = NULL;
	}
	if (d) {
		held = d->held;
		ds_disk_submit(ds, d);
	}
	ds->used -= r->charged;
	r->charged = 0;
	sel_index_get(ds->c.ix, id)->flags |= DS_FAILED;
	ev->type = SEL_EV_STORE_FAILED;
	ds->c.st.store_failures++;
	if (budget_error(st->status)) {
		ev->outcome = SEL_DEFERRED;
		ev->why = SEL_RETRY_BUDGET;
		ds->c.st.outcomes[SEL_DEFERRED]++;
		ds->c.st.retry_reasons[SEL_RETRY_BUDGET]++;
		/* A refusal; the space it gives back was never usable, so no
		 * progress either. */
		sel_progress_refuse(&ds->c.pg);
	} else {
		ds->c.pg.released = true; /* its slots and budget */
		ev->outcome = SEL_SKIPPED;
		/* A terminal disk error loses the record (design 2.15); a failed
		 * GPU copy-out is not a disk drop. */
		if (st->disk_failed && st->status != SEL_ESTOPPED)
			ds->c.st.tier[SEL_TIER_DISK].dropped_io_error++;
	}
	ds_unpin(&ds->c, id);
	sel_core_remove_failed(&ds->c, id, &st->key);
	return held;
}

void ds_stream_finish(struct disk_store *ds, struct dstream *st) { stream_finish(ds, st); }

static void stream_finish(struct disk_store *ds, struct dstream *st)
{
	if (ds->sh && ds_shard_hold(ds, st))
		return; /* the peers' part of it is still running */
	sel_event ev = {0};
	sel_event *held = NULL; /* the event, kept by the discard job that must run first */
	uint64_t now = eos_now_ns();
	ev.key = st->key;
	ev.tier = SEL_TIER_DISK;
	ev.bytes = st->bytes;
	ev.duration_ns = now > st->submit_ns ? now - st->submit_ns : 0;
	ev.error = st->status;
	if (st->put) {
		ev.checkpoint = st->id;
		ds_rec(ds, st->nodes[0])->writing = false;
		if (!st->status)
			put_committed(ds, st, &ev);
		else
			held = put_failed(ds, st, &ev);
	} else {
		ev.ticket = st->id;
		ev.type = st->status ? SEL_EV_FETCH_FAILED : SEL_EV_FETCHED;
		ev.outcome = SEL_QUEUED;
		sel_core_count_fetched(&ds->c, st->status, st->bytes, ev.duration_ns, st->n_ids,
				       st->key.consumed, st->resident);
		for (uint32_t i = 0; i < st->n_nodes; i++)
			ds_unpin(&ds->c, st->nodes[i]);
		if (st->into) {
			/* Every read and copy ended: the caller's slots are its
			 * own again, verified whole when the status is 0.  The
			 * hook runs in this poll, before its event is taken. */
			if (!st->status)
				ds->c.st.read_through_bytes += st->bytes;
			ds_hook_push(ds, K_READ_INTO, st->into_arg, st->status);
		}
	}
	if (held) {
		*held = ev; /* still in flight until the discard ran */
	} else {
		if (st->put)
			ds->c.st.inflight_out--;
		sel_evq_push(&ds->evq, &ev);
	}
	ds_stream_free(ds, st);
}

/* ---- completions --------------------------------------------------------------------- */

static void disk_done(struct disk_store *ds, struct dj *d)
{
	int rc = d->j.status;
	switch (d->kind) {
	case K_PUT_WIN:
		if (d->j.committed) {
			struct drec *r = ds_rec(ds, d->w->st->nodes[0]);
			r->fid = d->j.file;
			r->pad_zero = true; /* written by this build: version 4 */
		}
		/* A failed directory fsync after the rename: the file is in
		 * place and readable; keep it. */
		if (rc && !d->j.committed) {
			stream_fail(d->w->st, rc);
			d->w->st->disk_failed = true;
		}
		win_end(ds, d->w);
		return;
	case K_PUT_END: {
		struct dstream *st = d->st;
		if (d->j.committed) {
			struct drec *r = ds_rec(ds, st->nodes[0]);
			r->fid = d->j.file;
			r->pad_zero = true;
		}
		if (rc && !d->j.committed) {
			stream_fail(st, rc);
			st->disk_failed = true;
		}
		st->endj = NULL;
		ds_job_free(ds, d);
		ds_stream_pump(ds, st);
		return;
	}
	case K_FETCH_WIN: fetch_read(ds, d->w); return;
	case K_TRUNCATE:
	case K_UNLINK:
		ds->unlinking -= d->bytes;
		if (rc && rc != -ENOENT) {
			/* The file stays as it was until a restart: charged. */
			ds->stuck += d->bytes;
			ds->used += d->bytes;
		}
		break;
	case K_DISCARD:
		if (d->held) {
			ds->c.st.inflight_out--;
			sel_evq_push(&ds->evq, d->held);
		}
		break;
	case K_WRITE_FROM: ds_write_from_done(ds, d); break;
	case K_READ_INTO: ds_read_into_done(ds, d); break;
	case K_SUMS: sums_done(ds, d); break;
	}
	ds_job_free(ds, d);
}

/* Copy completions and refused copies. */
static bool copies_done(struct disk_store *ds)
{
	struct sel_xfer_job *xd[POLL_BATCH];
	struct dwin *w;
	int k = ds->c.xfer ? sel_xfer_poll(ds->c.xfer, xd, POLL_BATCH) : 0;
	for (int i = 0; i < k; i++)
		xfer_done(ds, (struct dwin *)((char *)xd[i] - offsetof(struct dwin, x)));
	bool step = k > 0;
	while ((w = dwq_pop(&ds->xf))) {
		xfer_done(ds, w);
		step = true;
	}
	return step;
}

/* Disk completions and refused disk jobs. */
static bool disk_jobs_done(struct disk_store *ds)
{
	struct sel_disk_job *dd[POLL_BATCH];
	struct dj *d;
	int k = ds->disk ? sel_disk_poll(ds->disk, dd, POLL_BATCH) : 0;
	ds->disk_out -= (uint32_t)k;
	for (int i = 0; i < k; i++)
		disk_done(ds, (struct dj *)dd[i]);
	bool step = k > 0;
	while ((d = djq_pop(&ds->df))) {
		disk_done(ds, d);
		step = true;
	}
	return step;
}

bool ds_progress(struct disk_store *ds)
{
	bool any = false;
	for (;;) {
		bool step = copies_done(ds);
		step |= disk_jobs_done(ds);
		if (ds->c.xfer)
			xfer_flush(ds);
		if (ds->disk)
			disk_flush(ds);
		if (ds->wait.head)
			wait_pump(ds);
		if (ds->sh)
			step |= ds_shard_progress(ds);
		any |= step;
		if (!step)
			break;
	}
	return any;
}

void ds_hook_push(struct disk_store *ds, uint8_t kind, void *arg, int status)
{
	if (ds->hd_n == ds->hd_cap) {
		size_t n = ds->hd_cap ? ds->hd_cap * 2 : 16;
		struct hookdone *h = realloc(ds->hd, n * sizeof(*h));
		if (!h)
			abort(); /* the composite's pins would leak */
		ds->hd = h;
		ds->hd_cap = n;
	}
	ds->hd[ds->hd_n++] = (struct hookdone){kind, arg, status};
}

void ds_run_hooks(struct disk_store *ds)
{
	while (ds->hd_n) {
		/* Hooks may submit more (and so add hooks): take the batch. */
		size_t n = ds->hd_n;
		struct hookdone *batch = malloc(n * sizeof(*batch));
		if (!batch)
			abort();
		memcpy(batch, ds->hd, n * sizeof(*batch));
		ds->hd_n = 0;
		for (size_t i = 0; i < n; i++) {
			void (*hook)(void *, void *, int) =
				batch[i].kind == K_WRITE_FROM ? ds->hooks.written : ds->hooks.read;
			if (hook)
				hook(ds->hooks.ctx, batch[i].arg, batch[i].status);
		}
		free(batch);
	}
}

bool ds_busy(const struct disk_store *ds)
{
	return ds->streams.head || ds->jobs.head || ds->dq.head || ds->df.head || ds->xf.head ||
	       ds->disk_out || (ds->c.xfer && sel_xfer_inflight(ds->c.xfer)) ||
	       (ds->sh && ds_shard_busy(ds));
}
