/*
 * store_disk.c - the disk store: published GPU checkpoints streamed through
 * intake slots into record files in the model's namespace directory, and
 * streamed back, byte-exact and verified (design 2.4 "DiskStore" and its
 * Staged transport; 2.2 store interface; 2.3 index, tree eviction, row
 * drops and startup pruning; 2.5 record files, directory lock, recovery,
 * the disk thread, expiry; 2.10 backpressure; 2.11 disk limit; 2.12 invariants;
 * 2.15 local eviction, retention metrics and publication outcomes).
 *
 * DESIGN
 *
 * The store owns an index rebuilt from its directory at startup, a slab
 * pool of intake slots (its own, intake only, when it stands alone; the
 * composite's shared warm + intake pool inside a composite), its own
 * transfer set, and the disk thread (disk.c).  Everything is driven from
 * the model worker thread; nothing here locks or waits, except close.
 *
 * Namespace.  <disk_dir>/<identity prefix>-<fingerprint> is created and
 * locked (eos_dirlock) before anything is read: a second owner of the same
 * namespace fails at open with -EBUSY before scanning or deleting; other
 * namespaces share the base directory.  The lock is held until destroy
 * (or for ever, if the disk thread could not drain).
 *
 * Startup.  sel_recover (record_recovery.c, the routine `flare records gc`
 * runs too) scans -- removing temporaries, invalid files, files over the
 * limit or with holes, orphans and records with a bad parent link --
 * inserts the survivors (linked under their parents when their tails are
 * the counts since them), with their rows when the file lengths cover
 * them, commits them all -- which applies the row-drop rule to any
 * single-child ancestor whose truncation a crash interrupted -- prunes what
 * is useless, seeds each record's last use from its file's mtime (no later
 * than now) and sorts the access order by the newest time under each
 * record.  If the records exceed the limit, LRU eviction brings them under
 * it.  Each record remembers the device and inode its file had, so a file
 * put under its name later is never read or truncated.
 *
 * Expiry (design 2.5, cfg->max_age_ns): the index stamps last use on
 * publication, PRESENT, touch, fetch and read_into (the record and its
 * ancestors).  At most once a minute of the store's clock, poll runs the
 * index's expiry walk: a ready leaf that is not doomed and no stream or
 * job pins is removed outright (unlinked; a parked one leaves the
 * composite's memory too), counted expired, with the page-only ancestors
 * it leaves childless.
 *
 * Budget.  Every record charges its file bytes (with or without the row)
 * against the limit (cfg->disk_limit, or a tenth of the free space at
 * startup).  A removal or compaction releases its bytes when its unlink or
 * truncate job is submitted: the disk thread runs job prologues in
 * submission order, so a later write's fallocate never precedes it.  A
 * removal that fails leaves its bytes charged as stuck until restart.
 *
 * put (Staged): dedupe (READY with row -> PRESENT; in flight -> SKIPPED),
 *   then SEL_OVERSIZE when the record plus the ancestors it links under
 *   can never fit the limit; insert PENDING and pin; evict least recently
 *   used unpinned leaves (unlink; compaction truncates) until its bytes
 *   fit, else SEL_RETRY (budget); take the first window's intake slots
 *   (else SEL_RETRY slabs -- also while other streams wait for slots) and
 *   submit its copy-out (else SEL_RETRY queue).  The record then streams
 *   window by window, at most WINDOWS_IN_FLIGHT at once: copy-out of <= 64
 *   page records (the last window also the row) into intake slots, a
 *   SEL_DISK_WRITE_PART of them, free the slots, next window.  The part
 *   that ends the record commits the file (rename); then the node is READY
 *   and SEL_EV_STORED reports it, releasing the worker's GPU pin.  A failed
 *   window stops the stream; once its windows drained, a DISCARD removes
 *   any temporary and, once it ran (the discard job holds the event, so
 *   whoever sees the failure finds no temporary of it left),
 *   SEL_EV_STORE_FAILED reports SEL_DEFERRED for ENOSPC
 *   and EDQUOT (retry after progress) or SEL_SKIPPED, counting io_error for
 *   terminal errors.  The calling thread copies page ids; it never touches
 *   payload bytes or hashes.
 *
 *   TP > 1 (design 2.5): a put decides its record's representation from
 *   its first window.  That window's copy-out compares the ranks' bytes
 *   (packing equal ones in place); later windows wait for it.  If every
 *   page matched, the pages are stored once (SEL_RECORD_PAGES_REPLICATED)
 *   and later windows compare too: one whose pages differ fails the stream
 *   (-EILSEQ, SEL_SKIPPED; the temporary is discarded), so no partial or
 *   mixed record is written.  The row is decided by the same window: when
 *   the ranks' rows can be equal (uniform rows), a record of several
 *   windows copies its row with the first, and the stream keeps those row
 *   slots for the last part, which writes the row (rslots, riov).  The file
 *   length, budget charge and counters (packed_records, per_rank_records)
 *   follow the decision.  Records a composite writes use DRAM's decisions.
 *
 * fetch: re-validates the hit's chain (every node READY, with a file, not
 *   doomed), pins it and plans windows: each node's needed pages in runs of
 *   <= 64, the endpoint's row with its last window.  Each window takes
 *   intake slots, reads [first, first + count) of the node's file (verified
 *   by the disk thread), copies them in to the ticket's page ids (and row
 *   into its state slot), frees the slots.  Windows that find no slots wait
 *   in a FIFO served as slots come back, so fetch itself never fails for
 *   lack of staging.  One event per ticket after every window drained.  A
 *   read that fails verification (or finds its file gone) dooms the
 *   record and its descendants: each is removed (unlinked) at its last
 *   unpin and never served again; the ticket gets SEL_EV_FETCH_FAILED.  An
 *   I/O error fails the fetch and keeps the record (it may be transient).
 *
 * Progress (selene.h SEL_EV_PROGRESS): after a put was refused (SEL_RETRY)
 *   or deferred, a poll ends with one SEL_EV_PROGRESS when capacity came
 *   back without a STORED or FETCHED event: a stream that failed for good
 *   released its intake slots and budget, a failed fetch its pins, expiry
 *   its records' budget.  A deferral (ENOSPC, EDQUOT) is a refusal, never
 *   progress: the space it hands back was not usable.
 *
 * Compaction (a non-root record's row once its only child commits, design
 *   2.3) is a TRUNCATE job; removal an UNLINK job.  Index pins (streams,
 *   write_from, read_into) keep a node's file from both.
 *
 * Composite (store_disk.h): a parked record is indexed READY but not
 *   evictable, without a file, its bytes charged (or, when the limit has no
 *   room even after eviction, uncharged until sel_disk_store_charge
 *   succeeds).  write_from writes it from the composite's memory slots with
 *   one whole-record job and commits it; read_into reads a committed record
 *   into the composite's slots.  A record that leaves the index calls
 *   hooks.removed so the composite drops its memory copy.
 *
 * Every job and window is one malloc'd block owning what the copy and disk
 * threads read.  If close cannot drain them (SEL_ESTOPPED), destroy leaks
 * the transfer set, the disk thread, the namespace, the directory lock, the
 * pool (if owned) and every live block, keeping them reachable.
 *
 * INVARIANTS (verified by sel_disk_store_check)
 *
 *   1. Every live index node has a live record and vice versa.
 *   2. used == the sum of charged bytes + stuck bytes; a record charges 0
 *      when uncharged, else its file bytes with its row when it has one.
 *   3. A record with a file or a write in flight is charged.  A READY
 *      record has a file or is parked; a parked record has no file and is
 *      not evictable; every parked record is on the park list once.
 *   4. A record with a write in flight is pinned by it; a fetch pins every
 *      node of its chain; store pins (mypins) <= index pins.
 *   5. inflight_out / inflight_in count the put streams and fetches not yet
 *      reported (a failed put's stream is gone while its discard job holds
 *      its event); each produces exactly one event.
 *   6. The index check (and, for an owned pool, the slab check) passes.
 */
#include "store_disk.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "disk.h"
#include "eos.h"
#include "expiry.h"
#include "index.h"
#include "list.h"
#include "record.h"
#include "recovery.h"
#include "slab.h"
#include "store_common.h"
#include "store_pool.h"
#include "transfer.h"

#define DS_FAILED (1u << 8)    /* its write failed; kept without a file for its children */
#define DS_DOOMED (1u << 9)    /* removed with its descendants at its last unpin */
#define DS_PARKED (1u << 10)   /* composite: complete in DRAM, no file yet */
#define DS_UNCHARGED (1u << 11) /* composite: parked without disk budget */

#define WINDOWS_IN_FLIGHT 2u
#define POLL_BATCH 32

enum jkind { K_PUT_WIN = 1, K_FETCH_WIN, K_TRUNCATE, K_UNLINK, K_DISCARD, K_WRITE_FROM, K_READ_INTO };
enum why { W_NONE = 0, W_EVICT, W_DOOM, W_EXPIRE };

struct dwin;
struct dstream;

/* A disk job block. */
struct dj {
	struct sel_disk_job j;
	uint8_t kind;
	struct dwin *w;            /* window jobs */
	sel_node_id node;          /* write_from, read_into */
	uint64_t cookie;
	uint64_t bytes;            /* truncate, unlink: bytes released at submission */
	sel_event *held;           /* discard: the failed put's event, sent once it ran */
	struct dj *qnext;          /* submission FIFO / failed-now list */
	struct dj *prev, *next;    /* live standalone jobs */
	bool standalone;
};

/* One window: <= 64 page records (and maybe the row) through intake slots. */
struct dwin {
	struct dstream *st;
	struct dj dj;              /* disk stage */
	struct sel_xfer_job x;     /* copy stage */
	struct dwin *xqnext;       /* copy submission FIFO */
	struct dwin *prev, *next;  /* live windows */
	uint32_t node_i, first, count, dst_at;
	bool row, begin, end;
	uint32_t flags;            /* record flags (fetch: packing) */
	uint32_t n_slots, n_page_slots, n_row_slots;
	uint32_t *slots;
	void **addr;
	struct iovec *iov;
	uint32_t n_iov;
};

struct wplan {
	uint32_t node_i, first, count, dst_at;
	bool row;
};

struct dstream {
	bool put;
	int status;
	uint64_t id;               /* checkpoint (put) or ticket (fetch) */
	sel_key key;
	uint64_t resident;
	uint64_t bytes;
	uint64_t submit_ns, done_ns;
	uint32_t state_slot;
	uint32_t *ids;             /* put: tail GPU page ids; fetch: destination ids */
	uint32_t n_ids;
	struct wplan *plan;
	uint32_t n_win, next_win, live_win;
	sel_node_id *nodes;        /* put: the node; fetch: the chain, ascending, pinned */
	uint32_t n_nodes;
	bool parts_sent;           /* put: a part reached the disk thread */
	bool decide;               /* put, TP > 1: representation from the first window */
	bool decided;              /* put: that window's copy-out completed */
	uint32_t flags;            /* put: the representation decided (SEL_RECORD_*) */
	/* put, deciding over several windows: the row travels with the first
	 * window, and its slots and pieces stay here for the last part. */
	uint32_t *rslots, n_rslots;
	struct iovec *riov;
	uint32_t n_riov;
	bool disk_failed;          /* put: a write part failed on the disk thread */
	bool waiting;
	struct dstream *wnext;
	struct dstream *prev, *next;
};

struct dj_list {
	struct dj *head, *tail;
	uint32_t n;
};
struct dwin_list {
	struct dwin *head, *tail;
	uint32_t n;
};
struct dstream_list {
	struct dstream *head, *tail;
	uint32_t n;
};
EOS_DLIST_DEFINE(jobs, struct dj_list, struct dj)
EOS_DLIST_DEFINE(wins, struct dwin_list, struct dwin)
EOS_DLIST_DEFINE(streams, struct dstream_list, struct dstream)

struct drec {
	sel_key fparent;           /* the parent its file names */
	uint64_t parent_check;     /* its file's parent link check (record.h) */
	struct eos_file_id fid;    /* the file indexed: the scan's, or the last commit's */
	uint64_t full;             /* file bytes with the row */
	uint64_t rowseg;           /* row segment bytes */
	uint64_t charged;
	uint32_t flags;            /* SEL_RECORD_*_REPLICATED */
	uint32_t mypins;
	sel_node_id pprev, pnext;  /* park list */
	bool live, file, writing, parked_listed;
};

struct hookdone {
	uint64_t cookie;
	int status;
};

struct leaked {
	void *what[6];
	struct leaked *next;
};
static pthread_mutex_t leak_mu = PTHREAD_MUTEX_INITIALIZER;
static struct leaked *leaked_list;

struct disk_store {
	sel_store base;
	const sel_geometry *g;
	struct sel_store_pool *sp;
	bool own_sp;
	const sel_slot_layout *layout;
	sel_slab_pool *pool;
	sel_xfer *xfer;
	sel_disk *disk;
	sel_index *ix;
	sel_policy *policy;
	sel_record_ns *ns;
	struct eos_dirlock *lk;
	struct sel_disk_store_hooks hooks;
	int epfd, efd;

	uint32_t ranks, pt, row_slots;
	uint64_t slot_bytes, intake;
	uint64_t min_pages, min_rows, page_bytes_all, row_bytes_all;
	uint64_t limit, used, stuck;
	uint32_t iov_cap;          /* row pieces of one row, all ranks */

	struct drec *recs;
	uint32_t nrecs;
	sel_node_id park_head, park_tail;
	uint64_t parked, uncharged;
	sel_index_chain chain;
	sel_node_id *doomed;
	uint32_t n_doomed, cap_doomed;
	uint64_t job_seq;
	enum why why;
	struct sel_expiry exp;

	struct dj *dq_head, *dq_tail;      /* waiting for disk queue room */
	struct dj *df_head, *df_tail;      /* refused at submission: complete at poll */
	struct dwin *xq_head, *xq_tail;    /* waiting for copy queue room */
	struct dwin *xf_head;              /* copy refused at submission */
	struct dstream_list streams;       /* live streams */
	struct dstream *wait_head, *wait_tail;
	struct dwin_list wins;             /* live windows */
	struct dj_list jobs;               /* live standalone jobs */
	sel_event *evq;
	size_t evq_head, evq_n, evq_cap;
	struct hookdone *hd;
	size_t hd_n, hd_cap;
	uint32_t disk_out;                 /* jobs handed to the disk thread, not polled */

	bool stopped, closed;
	struct sel_progress pg;    /* refusals since the last PROGRESS, capacity back since */
	int close_rc;
	sel_stats st;
};

#define DS(s) ((struct disk_store *)(s))

static void debug_check(struct disk_store *ds)
{
#ifdef SEL_DEBUG_CHECKS
	if (sel_disk_store_check(&ds->base) != 0) {
		fprintf(stderr, "sel_disk_store_check: %s\n", eos_errmsg());
		abort();
	}
#else
	(void)ds;
#endif
}

static uint32_t div_up(uint32_t n, uint32_t d) { return n / d + (n % d != 0); }

static const sel_index_node *NODE(const struct disk_store *ds, sel_node_id id)
{
	return sel_index_cget(ds->ix, id);
}

static int ensure_rec(struct disk_store *ds, sel_node_id id)
{
	if (id < ds->nrecs)
		return 0;
	uint32_t n = ds->nrecs ? ds->nrecs : 64;
	while (n <= id)
		n = n > UINT32_MAX / 2 ? UINT32_MAX : n * 2;
	struct drec *r = realloc(ds->recs, (size_t)n * sizeof(*r));
	if (!r)
		return eos_fail(-ENOMEM, "disk store: out of memory for %" PRIu32 " records", n);
	memset(r + ds->nrecs, 0, (size_t)(n - ds->nrecs) * sizeof(*r));
	ds->recs = r;
	ds->nrecs = n;
	return 0;
}

static uint64_t node_bytes(const struct disk_store *ds, sel_node_id id)
{
	const struct drec *r = &ds->recs[id];
	return (NODE(ds, id)->flags & SEL_NODE_HAS_ROW) ? r->full : r->full - r->rowseg;
}

/* The record as its file describes it. */
static void node_desc(const struct disk_store *ds, sel_node_id id, sel_record_desc *d)
{
	const sel_index_node *n = NODE(ds, id);
	memset(d, 0, sizeof(*d));
	d->key = n->key;
	d->parent = ds->recs[id].fparent;
	d->bucket = n->bucket;
	d->tail = n->tail_pages;
	d->flags = ds->recs[id].flags;
	d->parent_check = ds->recs[id].parent_check;
}

/* A disk job on record id's file: its description and the file indexed,
 * so the disk thread refuses anything else under the name. */
static void job_rec(const struct disk_store *ds, sel_node_id id, struct sel_disk_job *j)
{
	node_desc(ds, id, &j->rec);
	j->want = ds->recs[id].fid;
}

static uint64_t record_bytes(const struct disk_store *ds, uint32_t pages, bool row)
{
	return (uint64_t)pages * ds->page_bytes_all + (row ? ds->row_bytes_all : 0);
}

/* Make the wait descriptor readable: poll has work that no thread's
 * completion will announce (an event, a refused submission). */
static void wake(struct disk_store *ds)
{
	uint64_t v = 1;
	if (ds->efd >= 0) {
		ssize_t w = write(ds->efd, &v, sizeof v);
		(void)w;
	}
}

static void ev_push(struct disk_store *ds, const sel_event *ev)
{
	if (ds->evq_n == ds->evq_cap) {
		size_t n = ds->evq_cap ? ds->evq_cap * 2 : 64;
		sel_event *q = malloc(n * sizeof(*q));
		if (!q)
			abort(); /* an event may never be lost: its pins would leak */
		for (size_t i = 0; i < ds->evq_n; i++)
			q[i] = ds->evq[(ds->evq_head + i) % ds->evq_cap];
		free(ds->evq);
		ds->evq = q;
		ds->evq_cap = n;
		ds->evq_head = 0;
	}
	ds->evq[(ds->evq_head + ds->evq_n) % ds->evq_cap] = *ev;
	ds->evq_n++;
	wake(ds);
}

static void hook_push(struct disk_store *ds, uint64_t cookie, int status)
{
	if (ds->hd_n == ds->hd_cap) {
		size_t n = ds->hd_cap ? ds->hd_cap * 2 : 16;
		struct hookdone *h = realloc(ds->hd, n * sizeof(*h));
		if (!h)
			abort(); /* as above: the composite's pins would leak */
		ds->hd = h;
		ds->hd_cap = n;
	}
	ds->hd[ds->hd_n++] = (struct hookdone){cookie, status};
}

/* ---- park list --------------------------------------------------------------- */

static void park_add(struct disk_store *ds, sel_node_id id)
{
	struct drec *r = &ds->recs[id];
	r->pprev = ds->park_tail;
	r->pnext = SEL_NODE_NONE;
	if (ds->park_tail != SEL_NODE_NONE)
		ds->recs[ds->park_tail].pnext = id;
	else
		ds->park_head = id;
	ds->park_tail = id;
	r->parked_listed = true;
	ds->parked++;
}

static void park_del(struct disk_store *ds, sel_node_id id)
{
	struct drec *r = &ds->recs[id];
	if (!r->parked_listed)
		return;
	if (r->pprev != SEL_NODE_NONE)
		ds->recs[r->pprev].pnext = r->pnext;
	else
		ds->park_head = r->pnext;
	if (r->pnext != SEL_NODE_NONE)
		ds->recs[r->pnext].pprev = r->pprev;
	else
		ds->park_tail = r->pprev;
	r->parked_listed = false;
	ds->parked--;
}

/* ---- disk and copy submission ------------------------------------------------ */

static void df_push(struct disk_store *ds, struct dj *d, int rc)
{
	d->j.status = rc;
	snprintf(d->j.errmsg, sizeof d->j.errmsg, "%s", eos_errmsg());
	d->qnext = NULL;
	if (ds->df_tail)
		ds->df_tail->qnext = d;
	else
		ds->df_head = d;
	ds->df_tail = d;
	wake(ds);
}

/* Hand d to the disk thread in FIFO order; never fails: a refusal other
 * than a full queue completes d with that status at the next poll. */
static void disk_submit(struct disk_store *ds, struct dj *d)
{
	d->j.id = ++ds->job_seq;
	if (!ds->dq_head) {
		int rc = sel_disk_submit(ds->disk, &d->j);
		if (rc == 0) {
			ds->disk_out++;
			return;
		}
		if (rc != -EAGAIN) {
			if (rc == SEL_ESTOPPED)
				ds->stopped = true;
			df_push(ds, d, rc);
			return;
		}
	}
	d->qnext = NULL;
	if (ds->dq_tail)
		ds->dq_tail->qnext = d;
	else
		ds->dq_head = d;
	ds->dq_tail = d;
}

static void disk_flush(struct disk_store *ds)
{
	while (ds->dq_head) {
		struct dj *d = ds->dq_head;
		int rc = sel_disk_submit(ds->disk, &d->j);
		if (rc == -EAGAIN)
			return;
		ds->dq_head = d->qnext;
		if (!ds->dq_head)
			ds->dq_tail = NULL;
		if (rc == 0) {
			ds->disk_out++;
		} else {
			if (rc == SEL_ESTOPPED)
				ds->stopped = true;
			df_push(ds, d, rc);
		}
	}
}

static void xf_push(struct disk_store *ds, struct dwin *w, int rc)
{
	w->x.status = rc;
	w->xqnext = ds->xf_head;
	ds->xf_head = w;
	wake(ds);
}

static void xfer_submit(struct disk_store *ds, struct dwin *w)
{
	w->x.id = ++ds->job_seq;
	if (!ds->xq_head) {
		int rc = sel_xfer_submit(ds->xfer, &w->x);
		if (rc == 0)
			return;
		if (rc != -EAGAIN) {
			if (rc == SEL_ESTOPPED)
				ds->stopped = true;
			xf_push(ds, w, rc);
			return;
		}
	}
	w->xqnext = NULL;
	if (ds->xq_tail)
		ds->xq_tail->xqnext = w;
	else
		ds->xq_head = w;
	ds->xq_tail = w;
}

static void xfer_flush(struct disk_store *ds)
{
	while (ds->xq_head) {
		struct dwin *w = ds->xq_head;
		int rc = sel_xfer_submit(ds->xfer, &w->x);
		if (rc == -EAGAIN)
			return;
		ds->xq_head = w->xqnext;
		if (!ds->xq_head)
			ds->xq_tail = NULL;
		if (rc != 0) {
			if (rc == SEL_ESTOPPED)
				ds->stopped = true;
			xf_push(ds, w, rc);
		}
	}
}

/* A standalone job on node id (unlink, truncate, discard). */
static struct dj *job_new(struct disk_store *ds, uint8_t kind, sel_node_id id, enum sel_disk_op op)
{
	struct dj *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->kind = kind;
	d->node = id;
	d->standalone = true;
	d->j.op = op;
	job_rec(ds, id, &d->j);
	jobs_push(&ds->jobs, d);
	return d;
}

/* ---- index callbacks --------------------------------------------------------- */

static void cb_drop_row(void *ctx, sel_index *ix, sel_node_id id)
{
	(void)ix;
	struct disk_store *ds = ctx;
	struct drec *r = &ds->recs[id];
	if (!r->live)
		return;
	if (r->charged) {
		ds->used -= r->rowseg;
		r->charged -= r->rowseg;
	}
	if (r->file) {
		struct dj *d = job_new(ds, K_TRUNCATE, id, SEL_DISK_TRUNCATE);
		if (d) {
			d->bytes = r->rowseg;
			disk_submit(ds, d);
		} else {
			ds->stuck += r->rowseg; /* the file keeps its row until a restart */
			ds->used += r->rowseg;
		}
	}
}

static void cb_remove(void *ctx, sel_index *ix, sel_node_id id)
{
	(void)ix;
	struct disk_store *ds = ctx;
	struct drec *r = &ds->recs[id];
	if (!r->live)
		return;
	const sel_index_node *n = NODE(ds, id);
	sel_key key = n->key;
	bool parked = n->flags & DS_PARKED;
	if (r->file) {
		struct dj *d = job_new(ds, K_UNLINK, id, SEL_DISK_UNLINK);
		if (d) {
			d->bytes = r->charged;
			disk_submit(ds, d);
		} else {
			ds->stuck += r->charged; /* the file stays until a restart */
			ds->used += r->charged;
		}
	}
	ds->used -= r->charged;
	park_del(ds, id);
	if (n->flags & DS_UNCHARGED)
		ds->uncharged--;
	if (ds->why == W_EVICT) {
		ds->st.tier[SEL_TIER_DISK].evicted++;
		ds->st.tier[SEL_TIER_DISK].dropped_end_of_chain++;
	} else if (ds->why == W_EXPIRE) {
		ds->st.tier[SEL_TIER_DISK].expired++;
	}
	memset(r, 0, sizeof(*r));
	if (ds->hooks.removed)
		ds->hooks.removed(ds->hooks.ctx, &key, parked, ds->why == W_EXPIRE);
}

static const struct sel_index_ops ds_index_ops = {
	.drop_row = cb_drop_row,
	.remove = cb_remove,
};

/* ---- pins, doom, eviction ---------------------------------------------------- */

static void ds_pin(struct disk_store *ds, sel_node_id id)
{
	ds->recs[id].mypins++;
	sel_index_pin(ds->ix, id);
}

static void reap(struct disk_store *ds);

/* May remove id (a useless page-only leaf, or doomed). */
static void ds_unpin(struct disk_store *ds, sel_node_id id)
{
	ds->recs[id].mypins--;
	sel_index_unpin(ds->ix, id);
	if (ds->n_doomed)
		reap(ds);
}

/* Remove every doomed node that is unpinned and childless, until none is. */
static void reap(struct disk_store *ds)
{
	bool more = true;
	while (more) {
		more = false;
		uint32_t keep = 0;
		for (uint32_t i = 0; i < ds->n_doomed; i++) {
			sel_node_id id = ds->doomed[i];
			const sel_index_node *n = NODE(ds, id);
			if (!n || !ds->recs[id].live || !(n->flags & DS_DOOMED))
				continue; /* gone already */
			if (n->pins || n->children) {
				ds->doomed[keep++] = id;
				continue;
			}
			enum why w = ds->why;
			ds->why = W_DOOM;
			(void)sel_index_remove(ds->ix, id);
			ds->why = w;
			more = true;
		}
		ds->n_doomed = keep;
	}
}

/* Doom id and everything below it.  Returns the number of descendants. */
static uint64_t doom(struct disk_store *ds, sel_node_id id)
{
	uint64_t below = 0;
	for (sel_node_id x = sel_index_next_lru(ds->ix, SEL_NODE_NONE); x != SEL_NODE_NONE;
	     x = sel_index_next_lru(ds->ix, x)) {
		bool under = x == id;
		for (sel_node_id p = NODE(ds, x)->parent; !under && p != SEL_NODE_NONE;
		     p = NODE(ds, p)->parent)
			under = p == id;
		if (!under || (NODE(ds, x)->flags & DS_DOOMED))
			continue;
		if (x != id)
			below++;
		sel_index_get(ds->ix, x)->flags |= DS_DOOMED;
		if (ds->n_doomed == ds->cap_doomed) {
			uint32_t n = ds->cap_doomed ? ds->cap_doomed * 2 : 16;
			sel_node_id *p = realloc(ds->doomed, n * sizeof(*p));
			if (!p)
				continue; /* stays doomed: refused by lookup and fetch */
			ds->doomed = p;
			ds->cap_doomed = n;
		}
		ds->doomed[ds->n_doomed++] = x;
	}
	reap(ds);
	return below;
}

/* Evict least recently used unpinned leaves (compacting when none) until
 * need more bytes fit the limit.  True when they do. */
static bool make_room(struct disk_store *ds, uint64_t need)
{
	enum why w = ds->why;
	ds->why = W_EVICT;
	while (ds->used + need > ds->limit) {
		int r = sel_index_evict(ds->ix, NULL);
		if (r == 0)
			break;
		if (r == 2)
			ds->st.tier[SEL_TIER_DISK].compacted++;
	}
	ds->why = w;
	return ds->used + need <= ds->limit;
}

/* Bytes the ancestors id links under hold (or would, uncharged). */
static uint64_t ancestors_bytes(const struct disk_store *ds, sel_node_id pid)
{
	uint64_t b = 0;
	for (; pid != SEL_NODE_NONE; pid = NODE(ds, pid)->parent)
		b += node_bytes(ds, pid);
	return b;
}

/* ---- windows ----------------------------------------------------------------- */

static void win_free(struct disk_store *ds, struct dwin *w)
{
	if (w->n_slots)
		(void)sel_slab_free(ds->pool, w->slots, w->n_slots);
	wins_del(&ds->wins, w);
	free(w);
}

static void stream_pump(struct disk_store *ds, struct dstream *st);
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
	uint32_t ps = (flags & SEL_RECORD_PAGES_REPLICATED) ? div_up(p->count, ds->ranks) : p->count;
	uint32_t rs = 0;
	if (p->row)
		rs = st->put ? ds->row_slots : sel_record_row_slots(&ds->ns->layout, flags);
	*pages = ps;
	*rows = rs;
	return ps + rs;
}

/* The addresses of w's page records and row pieces in its slots, laid out
 * as flags (SEL_RECORD_*_REPLICATED) say.  0 or -ENOMEM / -ENOBUFS. */
static int win_addrs(struct disk_store *ds, struct dwin *w, uint32_t flags)
{
	const sel_record_layout *l = &ds->ns->layout;
	void *sa[2 * SEL_WINDOW_PAGES + 64];
	void **slot_addr = w->n_slots <= sizeof sa / sizeof sa[0] ? sa
				 : malloc(w->n_slots * sizeof(void *));
	if (!slot_addr)
		return eos_fail(-ENOMEM, "disk store: out of memory for a window");
	for (uint32_t i = 0; i < w->n_slots; i++)
		slot_addr[i] = sel_slab_addr(ds->pool, w->slots[i]);
	for (uint32_t i = 0; i < w->count; i++)
		w->addr[i] = sel_record_page_addr(l, flags, slot_addr, i);
	int rc = 0;
	w->n_iov = 0;
	if (w->row) {
		int k = sel_record_row_iov(l, flags, slot_addr + w->n_page_slots, w->n_row_slots,
					   w->iov, ds->iov_cap);
		if (k > 0)
			w->n_iov = (uint32_t)k;
		else
			rc = k;
	}
	if (slot_addr != sa)
		free(slot_addr);
	return rc;
}

/* Start the stream's next window: 0, 1 when no slots are free now, or a
 * submission error (direct: the put's first window, submitted at once). */
static int win_start(struct disk_store *ds, struct dstream *st, bool direct)
{
	const struct wplan *p = &st->plan[st->next_win];
	sel_node_id id = st->nodes[p->node_i];
	uint32_t flags = st->put ? 0 : ds->recs[id].flags;
	uint32_t np, nr, need = win_slots(ds, st, p, flags, &np, &nr);
	if (!sel_slab_can_alloc(ds->pool, need, SEL_SLAB_INTAKE))
		return 1;
	size_t sz = sizeof(struct dwin) + (size_t)need * sizeof(uint32_t) +
		    (size_t)p->count * sizeof(void *) + (size_t)ds->iov_cap * sizeof(struct iovec);
	struct dwin *w = calloc(1, sz + sizeof(void *));
	if (!w)
		return eos_fail(-ENOMEM, "disk store: out of memory for a window");
	w->slots = (uint32_t *)(w + 1);
	w->addr = (void **)eos_round_up((uintptr_t)(w->slots + need), sizeof(void *));
	w->iov = (struct iovec *)(w->addr + p->count);
	if (sel_slab_alloc(ds->pool, need, SEL_SLAB_INTAKE, w->slots) != 0) {
		free(w);
		return 1;
	}
	w->st = st;
	w->node_i = p->node_i;
	w->first = p->first;
	w->count = p->count;
	w->dst_at = p->dst_at;
	w->row = p->row;
	w->begin = st->next_win == 0;
	w->end = st->next_win + 1 == st->n_win;
	w->flags = flags;
	w->n_slots = need;
	w->n_page_slots = np;
	w->n_row_slots = nr;
	wins_push(&ds->wins, w);
	w->dj.kind = st->put ? K_PUT_WIN : K_FETCH_WIN;
	w->dj.w = w;

	int rc = win_addrs(ds, w, flags);
	if (rc) {
		win_free(ds, w);
		return rc;
	}

	st->next_win++;
	st->live_win++;
	if (st->put) {
		w->x.dir = SEL_COPY_OUT;
		w->x.n_pages = p->count;
		w->x.pages = st->ids + p->dst_at;
		w->x.page_slots = w->slots;
		w->x.row = p->row;
		w->x.state_slot = st->state_slot;
		w->x.row_slots = w->slots + np;
		/* Compare the ranks' bytes (and pack equal ones in place) in the
		 * window that decides, and in later ones of a replicated record
		 * to prove they match too. */
		w->x.compare = st->decide &&
			       (!st->decided || (st->flags & SEL_RECORD_PAGES_REPLICATED));
		if (direct) {
			w->x.id = ++ds->job_seq;
			rc = sel_xfer_submit(ds->xfer, &w->x);
			if (rc) {
				st->next_win--;
				st->live_win--;
				win_free(ds, w);
				if (rc == SEL_ESTOPPED)
					ds->stopped = true;
				return rc;
			}
		} else {
			xfer_submit(ds, w);
		}
	} else {
		struct sel_disk_job *j = &w->dj.j;
		j->op = SEL_DISK_READ;
		job_rec(ds, id, j);
		j->first = p->first;
		j->count = p->count;
		j->pages = w->addr;
		j->row = p->row;
		j->row_iov = p->row ? w->iov : NULL;
		j->row_n = p->row ? w->n_iov : 0;
		disk_submit(ds, &w->dj);
	}
	return 0;
}

static void wait_add(struct disk_store *ds, struct dstream *st)
{
	if (st->waiting)
		return;
	st->waiting = true;
	st->wnext = NULL;
	if (ds->wait_tail)
		ds->wait_tail->wnext = st;
	else
		ds->wait_head = st;
	ds->wait_tail = st;
}

static void stream_pump(struct disk_store *ds, struct dstream *st)
{
	while (!st->status && st->next_win < st->n_win && st->live_win < WINDOWS_IN_FLIGHT &&
	       !(st->decide && !st->decided && st->next_win > 0)) {
		int rc = win_start(ds, st, false);
		if (rc == 1) {
			wait_add(ds, st);
			return;
		}
		if (rc < 0)
			stream_fail(st, rc);
	}
	if (st->live_win == 0 && (st->status || st->next_win == st->n_win) && !st->waiting)
		stream_finish(ds, st);
}

/* Serve streams waiting for slots, oldest first. */
static void wait_pump(struct disk_store *ds)
{
	struct dstream *list = ds->wait_head;
	ds->wait_head = ds->wait_tail = NULL;
	while (list) {
		struct dstream *st = list;
		list = st->wnext;
		st->waiting = false;
		stream_pump(ds, st);
	}
}

/* A window's last stage ended. */
static void win_end(struct disk_store *ds, struct dwin *w)
{
	struct dstream *st = w->st;
	win_free(ds, w);
	st->live_win--;
	stream_pump(ds, st);
}

/* A read status that makes the record useless for good: it failed
 * verification, or the file is gone.  (An I/O error may be transient: the
 * fetch fails, the committed record stays.) */
static bool doom_status(int rc)
{
	return rc == SEL_ECORRUPT || rc == -ENOENT;
}

/* TP > 1 (design 2.5): a disk-only record's representation is decided from
 * its first window's copy-out.  Pages are stored once (replicated) when
 * every rank's pages matched there; the row too when that window is the
 * only one (it carries the row).  The file, its budget and the window's
 * addresses follow.  A later window of a replicated record whose pages
 * differ fails the stream: no partial or mixed record is written.
 * Returns false when the stream failed. */
static bool put_decide(struct disk_store *ds, struct dstream *st, struct dwin *w)
{
	if (!st->decided) {
		st->decided = true;
		uint32_t fl = 0;
		if (w->count && w->x.pages_replicated)
			fl |= SEL_RECORD_PAGES_REPLICATED;
		if (w->row && w->x.row_replicated)
			fl |= SEL_RECORD_ROW_REPLICATED;
		st->flags = fl;
		if (fl) {
			sel_node_id id = st->nodes[0];
			struct drec *r = &ds->recs[id];
			sel_record_desc d;
			sel_record_span span;
			r->flags = fl;
			node_desc(ds, id, &d);
			if (sel_record_span_of(&ds->ns->layout.sz, &d, &span) != 0) {
				r->flags = 0;
				stream_fail(st, -EINVAL);
				return false;
			}
			uint64_t bytes = (NODE(ds, id)->flags & SEL_NODE_HAS_ROW) ? span.row_end
										    : span.row_off;
			r->full = span.row_end;
			r->rowseg = span.row_end - span.row_off;
			if (bytes < r->charged) {
				ds->used -= r->charged - bytes;
				r->charged = bytes;
				ds->pg.released = true; /* budget */
			}
		}
		stream_pump(ds, st); /* the windows held back for the decision */
	} else if ((st->flags & SEL_RECORD_PAGES_REPLICATED) && w->count && !w->x.pages_replicated) {
		stream_fail(st, eos_fail(-EILSEQ, "disk store: checkpoint %" PRIu64 ": pages %" PRIu32
					 "..%" PRIu32 " differ across ranks, the first window's did not;"
					 " the record is abandoned", st->id, w->first,
					 w->first + w->count - 1));
		ds->st.abandoned_stores++;
		return false;
	}
	/* Slots hold pages and the row as the copy left them (packed in
	 * place where they matched and compare ran): as the record stores
	 * them, or this is a bug caught before any byte is written. */
	uint32_t as = (w->x.compare && w->x.pages_replicated && w->count
			       ? SEL_RECORD_PAGES_REPLICATED : 0) |
		      (w->x.compare && w->x.row_replicated && w->row ? SEL_RECORD_ROW_REPLICATED : 0);
	uint32_t want = (w->count ? st->flags & SEL_RECORD_PAGES_REPLICATED : 0) |
			(w->row ? st->flags & SEL_RECORD_ROW_REPLICATED : 0);
	if (as != want) {
		stream_fail(st, eos_fail(-EINVAL, "disk store: checkpoint %" PRIu64 ": window at page %"
					 PRIu32 " copied out with flags 0x%" PRIx32 ", the record's"
					 " are 0x%" PRIx32, st->id, w->first, as, want));
		return false;
	}
	int rc = win_addrs(ds, w, st->flags);
	if (rc) {
		stream_fail(st, rc);
		return false;
	}
	if (w->row && !w->end) {
		/* The row came with the first window: its slots and pieces
		 * move to the stream for the last part (freed at its end). */
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
	}
	return true;
}

static void put_copied(struct disk_store *ds, struct dwin *w)
{
	struct dstream *st = w->st;
	if (w->x.status)
		stream_fail(st, w->x.status);
	if (!st->status && st->decide && !put_decide(ds, st, w)) {
		win_end(ds, w);
		return;
	}
	if (st->status) {
		win_end(ds, w);
		return;
	}
	sel_node_id id = st->nodes[0];
	struct sel_disk_job *j = &w->dj.j;
	j->op = SEL_DISK_WRITE_PART;
	node_desc(ds, id, &j->rec);
	j->first = w->first;
	j->count = w->count;
	j->part = (w->begin ? SEL_DISK_PART_BEGIN : 0) | (w->end ? SEL_DISK_PART_END : 0);
	j->row = NODE(ds, id)->flags & SEL_NODE_HAS_ROW;
	j->pages = w->addr;
	j->row_iov = w->end && j->row ? (st->riov ? st->riov : w->iov) : NULL;
	j->row_n = w->end && j->row ? (st->riov ? st->n_riov : w->n_iov) : 0;
	st->parts_sent = true;
	disk_submit(ds, &w->dj);
}

static void fetch_read(struct disk_store *ds, struct dwin *w)
{
	struct dstream *st = w->st;
	int rc = w->dj.j.status;
	if (rc) {
		stream_fail(st, rc);
		sel_node_id id = st->nodes[w->node_i];
		if (doom_status(rc) && !(NODE(ds, id)->flags & DS_DOOMED)) {
			if (rc == SEL_ECORRUPT)
				ds->st.tier[SEL_TIER_DISK].corrupt++;
			else
				ds->st.tier[SEL_TIER_DISK].dropped_io_error++;
			ds->st.tier[SEL_TIER_DISK].dropped_io_error += doom(ds, id);
		}
	}
	if (st->status) {
		win_end(ds, w);
		return;
	}
	w->x.dir = SEL_COPY_IN;
	w->x.n_pages = w->count;
	w->x.pages = st->ids + w->dst_at;
	w->x.page_slots = w->slots;
	w->x.pages_packed = w->flags & SEL_RECORD_PAGES_REPLICATED;
	w->x.row = w->row;
	w->x.state_slot = st->state_slot;
	w->x.row_slots = w->slots + w->n_page_slots;
	w->x.row_packed = w->row && (w->flags & SEL_RECORD_ROW_REPLICATED);
	xfer_submit(ds, w);
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

static bool budget_error(int rc) { return rc == -ENOSPC || rc == -EDQUOT; }

/* Remove failed node id once childless and unpinned, then failed ancestors
 * left so. */
static void remove_failed(struct disk_store *ds, sel_node_id id, const sel_key *key)
{
	if (sel_index_find(ds->ix, key) != id)
		return;
	while (id != SEL_NODE_NONE) {
		const sel_index_node *n = NODE(ds, id);
		if (!(n->flags & DS_FAILED) || n->children || n->pins)
			return;
		sel_node_id parent = n->parent;
		if (sel_index_remove(ds->ix, id) != 0)
			return;
		id = parent;
		if (id != SEL_NODE_NONE && !NODE(ds, id))
			return;
	}
}

/* Free a stream block and the row slots it kept (a put deciding over
 * several windows). */
static void stream_free(struct disk_store *ds, struct dstream *st)
{
	if (st->n_rslots)
		(void)sel_slab_free(ds->pool, st->rslots, st->n_rslots);
	free(st->rslots);
	free(st->riov);
	free(st);
}

static void stream_finish(struct disk_store *ds, struct dstream *st)
{
	sel_event ev = {0};
	sel_event *held = NULL; /* the event, kept by the discard job that must run first */
	uint64_t now = eos_now_ns();
	ev.key = st->key;
	ev.tier = SEL_TIER_DISK;
	ev.bytes = st->bytes;
	ev.duration_ns = now > st->submit_ns ? now - st->submit_ns : 0;
	ev.error = st->status;
	if (st->put) {
		sel_node_id id = st->nodes[0];
		struct drec *r = &ds->recs[id];
		ev.checkpoint = st->id;
		r->writing = false;
		if (!st->status) {
			r->file = true;
			sel_index_get(ds->ix, id)->flags &= (uint16_t)~DS_FAILED;
			sel_index_commit(ds->ix, id);
			ds->st.tier[SEL_TIER_DISK].held++;
			ds->st.tier[SEL_TIER_DISK].bytes_out += st->bytes;
			if (r->flags & (SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED)) {
				ds->st.packed_records++;
				ds->st.tier[SEL_TIER_DISK].stores_packed++;
			} else {
				ds->st.per_rank_records++;
				ds->st.tier[SEL_TIER_DISK].stores_per_rank++;
			}
			ev.type = SEL_EV_STORED;
			ev.outcome = SEL_QUEUED;
			ds_unpin(ds, id);
		} else {
			/* The event waits for the discard: whoever sees it finds
			 * no temporary left of this put. */
			struct dj *d = st->parts_sent ? job_new(ds, K_DISCARD, id, SEL_DISK_DISCARD) : NULL;
			if (d && !(d->held = malloc(sizeof(*d->held)))) {
				/* Out of memory: the event goes now, and the
				 * disk thread drops the temporary at close. */
				jobs_del(&ds->jobs, d);
				free(d);
				d = NULL;
			}
			if (d) {
				held = d->held;
				disk_submit(ds, d);
			}
			ds->used -= r->charged;
			r->charged = 0;
			sel_index_get(ds->ix, id)->flags |= DS_FAILED;
			ev.type = SEL_EV_STORE_FAILED;
			ds->st.store_failures++;
			if (budget_error(st->status)) {
				ev.outcome = SEL_DEFERRED;
				ev.why = SEL_RETRY_BUDGET;
				ds->st.outcomes[SEL_DEFERRED]++;
				ds->st.retry_reasons[SEL_RETRY_BUDGET]++;
				/* A refusal; the space it gives back was never
				 * usable, so no progress either. */
				sel_progress_refuse(&ds->pg);
			} else {
				ds->pg.released = true; /* its slots and budget */
				ev.outcome = SEL_SKIPPED;
				/* A terminal disk error loses the record (design 2.15);
				 * a failed GPU copy-out is not a disk drop. */
				if (st->disk_failed && st->status != SEL_ESTOPPED)
					ds->st.tier[SEL_TIER_DISK].dropped_io_error++;
			}
			ds_unpin(ds, id);
			remove_failed(ds, id, &st->key);
		}
	} else {
		ev.ticket = st->id;
		ev.type = st->status ? SEL_EV_FETCH_FAILED : SEL_EV_FETCHED;
		ev.outcome = SEL_QUEUED;
		ds->st.inflight_in--;
		if (st->status) {
			ds->st.fetch_failures++;
			ds->pg.released = true; /* its pins drop */
		} else {
			ds->st.tier[SEL_TIER_DISK].bytes_in += st->bytes;
			ds->st.reused_tokens += st->key.consumed - st->resident;
			sel_policy_observe(ds->policy, SEL_TIER_DISK, st->bytes, ev.duration_ns, st->n_ids);
		}
		for (uint32_t i = 0; i < st->n_nodes; i++)
			ds_unpin(ds, st->nodes[i]);
	}
	if (held) {
		*held = ev; /* still in flight until the discard ran */
	} else {
		if (st->put)
			ds->st.inflight_out--;
		ev_push(ds, &ev);
	}
	streams_del(&ds->streams, st);
	stream_free(ds, st);
}

/* ---- completions ------------------------------------------------------------- */

static void job_free(struct disk_store *ds, struct dj *d)
{
	jobs_del(&ds->jobs, d);
	free(d->held);
	free(d);
}

static void disk_done(struct disk_store *ds, struct dj *d)
{
	int rc = d->j.status;
	switch (d->kind) {
	case K_PUT_WIN:
		if (d->j.committed)
			ds->recs[d->w->st->nodes[0]].fid = d->j.file;
		/* A failed directory fsync after the rename: the file is in
		 * place and readable; keep it. */
		if (rc && !d->j.committed) {
			stream_fail(d->w->st, rc);
			d->w->st->disk_failed = true;
		}
		win_end(ds, d->w);
		return;
	case K_FETCH_WIN:
		fetch_read(ds, d->w);
		return;
	case K_TRUNCATE:
	case K_UNLINK:
		if (rc && rc != -ENOENT) {
			/* The file stays as it was until a restart: charged. */
			ds->stuck += d->bytes;
			ds->used += d->bytes;
		}
		break;
	case K_DISCARD:
		if (d->held) {
			ds->st.inflight_out--;
			ev_push(ds, d->held);
		}
		break;
	case K_WRITE_FROM: {
		sel_node_id id = d->node;
		struct drec *r = &ds->recs[id];
		r->writing = false;
		if (rc && d->j.committed)
			rc = 0; /* in place; only the directory fsync failed */
		if (rc == 0) {
			r->file = true;
			r->fid = d->j.file;
			sel_index_get(ds->ix, id)->flags &= (uint16_t)~(DS_PARKED | DS_UNCHARGED);
			park_del(ds, id);
			ds->st.tier[SEL_TIER_DISK].held++;
			ds->st.tier[SEL_TIER_DISK].bytes_out += d->j.bytes;
			ds->st.spilled_bytes += d->j.bytes;
			if (r->flags) {
				ds->st.packed_records++;
				ds->st.tier[SEL_TIER_DISK].stores_packed++;
			} else {
				ds->st.per_rank_records++;
				ds->st.tier[SEL_TIER_DISK].stores_per_rank++;
			}
			sel_index_set_evictable(ds->ix, id, true);
		} else {
			ds->st.store_failures++;
		}
		hook_push(ds, d->cookie, rc);
		ds_unpin(ds, id);
		break;
	}
	case K_READ_INTO: {
		sel_node_id id = d->node;
		if (rc == 0) {
			ds->st.tier[SEL_TIER_DISK].bytes_in += d->j.bytes;
			ds->st.read_through_bytes += d->j.bytes;
		} else if (doom_status(rc) && !(NODE(ds, id)->flags & DS_DOOMED)) {
			if (rc == SEL_ECORRUPT)
				ds->st.tier[SEL_TIER_DISK].corrupt++;
			else
				ds->st.tier[SEL_TIER_DISK].dropped_io_error++;
			ds->st.tier[SEL_TIER_DISK].dropped_io_error += doom(ds, id);
		}
		hook_push(ds, d->cookie, rc);
		ds_unpin(ds, id);
		break;
	}
	}
	job_free(ds, d);
}

/* Drive every stage: completions, queued submissions, waiting streams.
 * Returns whether anything happened. */
static bool progress(struct disk_store *ds)
{
	bool any = false;
	for (;;) {
		bool step = false;
		struct sel_xfer_job *xd[POLL_BATCH];
		int k = ds->xfer ? sel_xfer_poll(ds->xfer, xd, POLL_BATCH) : 0;
		for (int i = 0; i < k; i++)
			xfer_done(ds, (struct dwin *)((char *)xd[i] - offsetof(struct dwin, x)));
		step |= k > 0;
		while (ds->xf_head) {
			struct dwin *w = ds->xf_head;
			ds->xf_head = w->xqnext;
			xfer_done(ds, w);
			step = true;
		}
		struct sel_disk_job *dd[POLL_BATCH];
		k = ds->disk ? sel_disk_poll(ds->disk, dd, POLL_BATCH) : 0;
		ds->disk_out -= (uint32_t)k;
		for (int i = 0; i < k; i++)
			disk_done(ds, (struct dj *)dd[i]);
		step |= k > 0;
		while (ds->df_head) {
			struct dj *d = ds->df_head;
			ds->df_head = d->qnext;
			if (!ds->df_head)
				ds->df_tail = NULL;
			disk_done(ds, d);
			step = true;
		}
		if (ds->xfer)
			xfer_flush(ds);
		if (ds->disk)
			disk_flush(ds);
		if (ds->wait_head)
			wait_pump(ds);
		any |= step;
		if (!step)
			break;
	}
	return any;
}

static void run_hooks(struct disk_store *ds)
{
	while (ds->hd_n) {
		/* Hooks may submit more (and so add hooks): take the batch. */
		size_t n = ds->hd_n;
		struct hookdone *batch = malloc(n * sizeof(*batch));
		if (!batch)
			abort();
		memcpy(batch, ds->hd, n * sizeof(*batch));
		ds->hd_n = 0;
		for (size_t i = 0; i < n; i++)
			if (ds->hooks.done)
				ds->hooks.done(ds->hooks.ctx, batch[i].cookie, batch[i].status);
		free(batch);
	}
}

static void signal_self(struct disk_store *ds)
{
	uint64_t v;
	ssize_t r = read(ds->efd, &v, sizeof v);
	(void)r;
	if (ds->evq_n || ds->df_head || ds->xf_head)
		wake(ds);
}

/* Expiry may drop a committed or parked record that is not doomed (pinned
 * ones -- streams, write_from, read_into -- are passed over by the index). */
static bool ds_droppable(void *ctx, const sel_index *ix, sel_node_id id)
{
	struct disk_store *ds = ctx;
	const sel_index_node *n = sel_index_cget(ix, id);
	return n->state == SEL_NODE_READY && !(n->flags & DS_DOOMED) && !ds->recs[id].writing;
}

/* The once-a-minute expiry sweep (design 2.5): unlinks and memory copies
 * through the usual removal path, counted as expired. */
static void ds_expire(struct disk_store *ds)
{
	uint64_t cutoff;
	if (ds->closed || ds->stopped || !sel_expiry_due(&ds->exp, &cutoff))
		return;
	enum why w = ds->why;
	uint64_t before = ds->st.tier[SEL_TIER_DISK].expired;
	ds->why = W_EXPIRE;
	(void)sel_index_expire(ds->ix, cutoff, SEL_EXPIRY_LEAVES, false, ds_droppable, ds);
	ds->why = w;
	if (ds->st.tier[SEL_TIER_DISK].expired != before)
		ds->pg.released = true; /* budget */
}

static int ds_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct disk_store *ds = DS(s);
	progress(ds);
	ds_expire(ds);
	run_hooks(ds);
	if (sel_progress_due(&ds->pg)) {
		sel_event pe = {.type = SEL_EV_PROGRESS};
		ev_push(ds, &pe);
	}
	size_t n = 0;
	while (n < cap && ds->evq_n) {
		ev[n++] = ds->evq[ds->evq_head];
		ds->evq_head = (ds->evq_head + 1) % ds->evq_cap;
		ds->evq_n--;
	}
	signal_self(ds);
	debug_check(ds);
	return (int)n;
}

/* ---- put ---------------------------------------------------------------------- */

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

static sel_outcome put_inner(struct disk_store *ds, const sel_published *cp, sel_retry_reason *why)
{
	sel_node_id id, pid = SEL_NODE_NONE;
	uint32_t tail;
	bool row, fresh;

	if (ds->stopped || ds->closed) {
		eos_fail(SEL_ESTOPPED, "disk store: %s", ds->closed ? "closed" : "stopped");
		return SEL_SKIPPED;
	}
	if (!sel_put_usable("disk store", cp, ds->pt, ds->min_rows))
		return SEL_SKIPPED;
	id = sel_index_find(ds->ix, &cp->key);
	sel_key fparent = {0};
	uint64_t pcheck = 0;
	if (id != SEL_NODE_NONE) {
		const sel_index_node *n = NODE(ds, id);
		if (n->flags & DS_DOOMED)
			return SEL_SKIPPED;
		if (n->state == SEL_NODE_READY) {
			if (!(n->flags & SEL_NODE_HAS_ROW))
				return SEL_SKIPPED;
			sel_index_touch(ds->ix, id);
			return SEL_PRESENT;
		}
		if (!(n->flags & DS_FAILED) || n->pins)
			return SEL_SKIPPED; /* its write is in flight */
		fresh = false;
		tail = n->tail_pages;
		row = n->flags & SEL_NODE_HAS_ROW;
		pid = n->parent;
		fparent = ds->recs[id].fparent;
		pcheck = ds->recs[id].parent_check;
		if (tail > cp->n_pages)
			return SEL_SKIPPED;
	} else {
		fresh = true;
		row = true;
		tail = cp->n_pages;
		if (!sel_key_is_none(&cp->parent)) {
			pid = sel_index_find(ds->ix, &cp->parent);
			if (pid != SEL_NODE_NONE && (NODE(ds, pid)->flags & DS_DOOMED))
				pid = SEL_NODE_NONE;
			if (pid != SEL_NODE_NONE) {
				uint32_t derived;
				if (!sel_put_extends("disk store", cp, NODE(ds, pid)->key.consumed, ds->pt,
						     &derived))
					return SEL_SKIPPED;
				tail = cp->tail;
				if (tail == derived) {
					fparent = cp->parent;
					pcheck = sel_record_parent_check(&NODE(ds, pid)->bucket);
				} else
					pid = SEL_NODE_NONE; /* stored as a root */
			}
		}
	}
	if (!sel_put_pages_fit("disk store", cp, tail, ds->min_pages))
		return SEL_SKIPPED;

	sel_record_desc d = {.key = cp->key, .parent = fparent, .bucket = cp->bucket, .tail = tail,
			     .parent_check = pcheck};
	sel_record_span span;
	if (sel_record_span_of(&ds->ns->layout.sz, &d, &span) != 0)
		return SEL_SKIPPED;
	uint64_t bytes = row ? span.row_end : span.row_off;
	if (bytes + ancestors_bytes(ds, pid) > ds->limit) {
		char a[32], b[32];
		ds->st.tier[SEL_TIER_DISK].dropped_oversize++;
		eos_fail(SEL_EOVERSIZE, "disk store: checkpoint %" PRIu64 " needs %s with its ancestors;"
			 " the disk limit is %s", cp->checkpoint,
			 eos_format_size(bytes + ancestors_bytes(ds, pid), a, sizeof a),
			 eos_format_size(ds->limit, b, sizeof b));
		return SEL_OVERSIZE;
	}

	uint32_t n_win = tail ? div_up(tail, SEL_WINDOW_PAGES) : 1;
	struct dstream *st = stream_new(ds, tail, n_win, 1);
	if (!st) {
		eos_fail(-ENOMEM, "disk store: out of memory for a stream of %" PRIu32 " pages", tail);
		return SEL_SKIPPED;
	}
	st->put = true;
	st->id = cp->checkpoint;
	st->key = cp->key;
	st->state_slot = cp->state_slot;
	st->bytes = record_bytes(ds, tail, row);
	st->decide = ds->ranks > 1 && (ds->ns->layout.sz.uniform_planes ||
				       ds->ns->layout.sz.uniform_row);
	memcpy(st->ids, cp->pages + (cp->n_pages - tail), (size_t)tail * sizeof(uint32_t));
	/* A record that decides its representation over several windows copies
	 * its row with the first (so both decisions come from it), and keeps the
	 * row's slots until the last part writes them. */
	bool row_first = st->decide && ds->ns->layout.sz.uniform_row && n_win > 1;
	for (uint32_t k = 0; k < n_win; k++) {
		uint32_t first = k * SEL_WINDOW_PAGES;
		uint32_t cnt = tail - first < SEL_WINDOW_PAGES ? tail - first : SEL_WINDOW_PAGES;
		bool has_row = row && (row_first ? k == 0 : k + 1 == n_win);
		st->plan[k] = (struct wplan){.node_i = 0, .first = first, .count = tail ? cnt : 0,
					     .dst_at = first, .row = has_row};
	}

	if (fresh) {
		int rc = sel_index_insert(ds->ix, &cp->key, pid == SEL_NODE_NONE ? NULL : &cp->parent,
					  &cp->bucket, tail, true, &id);
		if (rc == 0)
			rc = ensure_rec(ds, id);
		if (rc) {
			if (rc != -EEXIST && id != SEL_NODE_NONE && sel_index_find(ds->ix, &cp->key) == id)
				sel_index_remove(ds->ix, id);
			streams_del(&ds->streams, st);
			free(st);
			return SEL_SKIPPED;
		}
		struct drec *r = &ds->recs[id];
		memset(r, 0, sizeof(*r));
		r->live = true;
		r->pprev = r->pnext = SEL_NODE_NONE;
	}
	struct drec *r = &ds->recs[id];
	r->fparent = fparent;
	r->parent_check = pcheck;
	r->full = span.row_end;
	r->rowseg = span.row_end - span.row_off;
	r->flags = 0;
	st->nodes[0] = id;
	ds_pin(ds, id);

	sel_outcome out = SEL_QUEUED;
	if (!make_room(ds, bytes)) {
		char a[32], b[32];
		*why = SEL_RETRY_BUDGET;
		eos_fail(-ENOSPC, "disk store: checkpoint %" PRIu64 " needs %s; %s of the limit are held"
			 " by records in use", cp->checkpoint, eos_format_size(bytes, a, sizeof a),
			 eos_format_size(ds->used, b, sizeof b));
		out = SEL_RETRY;
		goto undo;
	}
	if (ds->wait_head) {
		*why = SEL_RETRY_SLABS;
		eos_fail(-EAGAIN, "disk store: staging is busy (streams wait for intake slots)");
		out = SEL_RETRY;
		goto undo;
	}
	int rc = win_start(ds, st, true);
	if (rc != 0) {
		if (rc == 1) {
			*why = SEL_RETRY_SLABS;
			eos_fail(-ENOSPC, "disk store: no free intake slots for a window");
			out = SEL_RETRY;
		} else if (rc == -EAGAIN) {
			*why = SEL_RETRY_QUEUE;
			eos_fail(-EAGAIN, "disk store: transfer queue full");
			out = SEL_RETRY;
		} else {
			out = SEL_SKIPPED;
		}
		goto undo;
	}
	sel_index_get(ds->ix, id)->flags &= (uint16_t)~DS_FAILED;
	r->charged = bytes;
	ds->used += bytes;
	r->writing = true;
	ds->st.inflight_out++;
	stream_pump(ds, st); /* a second window, if slots allow */
	debug_check(ds);
	return SEL_QUEUED;

undo:
	streams_del(&ds->streams, st);
	free(st);
	ds_unpin(ds, id);
	if (fresh && sel_index_find(ds->ix, &cp->key) == id)
		sel_index_remove(ds->ix, id);
	debug_check(ds);
	return out;
}

static sel_outcome ds_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct disk_store *ds = DS(s);
	sel_retry_reason reason = SEL_RETRY_NONE;
	sel_outcome o = cp ? put_inner(ds, cp, &reason) : SEL_SKIPPED;
	sel_put_account(&ds->st, &ds->pg, o, reason, why);
	return o;
}

/* ---- lookup and fetch ----------------------------------------------------------- */

static bool chain_doomed(const struct disk_store *ds, const sel_index_chain *ch)
{
	for (uint32_t i = 0; i < ch->n; i++)
		if (NODE(ds, ch->ids[i])->flags & DS_DOOMED)
			return true;
	return false;
}

static int ds_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_hit *hit)
{
	struct disk_store *ds = DS(s);
	ds->st.lookups++;
	int rc = sel_index_lookup(ds->ix, h, resident, limit, &ds->chain);
	ds->st.chains_rejected += ds->chain.rejected;
	if (rc <= 0)
		return rc;
	const sel_index_chain *ch = &ds->chain;
	if (chain_doomed(ds, ch))
		return 0;
	sel_node_id end = ch->ids[ch->n - 1];
	memset(hit, 0, sizeof(*hit));
	hit->key = NODE(ds, end)->key;
	hit->resident = resident;
	hit->pages = ch->pages - ch->skip_pages;
	hit->bytes = record_bytes(ds, hit->pages, true);
	hit->tier = SEL_TIER_DISK;
	hit->cookie = end;
	hit->chain = ch->digest;
	ds->st.hits++;
	return 1;
}

/* Walk key's chain above resident: the node count, the skipped pages of its
 * first node, whether every node has a file.  0 or -ESTALE. */
static int chain_walk(struct disk_store *ds, const sel_key *key, uint64_t resident, bool need_row,
		      uint32_t *n_nodes, uint32_t *pages, uint32_t *skip, bool *on_disk)
{
	sel_node_id end = sel_index_find(ds->ix, key);
	if (end == SEL_NODE_NONE)
		return eos_fail(-ESTALE, "disk store: hit endpoint is gone");
	const sel_index_node *en = NODE(ds, end);
	if (en->state != SEL_NODE_READY || (need_row && !(en->flags & SEL_NODE_HAS_ROW)) ||
	    en->key.consumed <= resident || (en->flags & DS_DOOMED))
		return eos_fail(-ESTALE, "disk store: hit endpoint lost its row");
	uint32_t n = 0;
	uint64_t base = 0, tails = 0;
	bool disk = true;
	for (sel_node_id cur = end; cur != SEL_NODE_NONE;) {
		const sel_index_node *x = NODE(ds, cur);
		if (x->key.consumed <= resident) {
			base = x->key.consumed;
			break;
		}
		if (x->state != SEL_NODE_READY || (x->flags & DS_DOOMED))
			return eos_fail(-ESTALE, "disk store: hit chain is no longer complete");
		disk &= ds->recs[cur].file;
		n++;
		tails += x->tail_pages;
		cur = x->parent;
	}
	uint64_t chain_pages = en->key.consumed / ds->pt - base / ds->pt;
	if (tails != chain_pages)
		return eos_fail(-ESTALE, "disk store: hit chain changed");
	*n_nodes = n;
	*skip = (uint32_t)(resident / ds->pt - base / ds->pt);
	*pages = (uint32_t)(chain_pages - *skip);
	*on_disk = disk;
	return 0;
}

bool sel_disk_store_chain_on_disk(sel_store *s, const sel_key *key, uint64_t resident)
{
	uint32_t n, pages, skip;
	bool disk;
	return chain_walk(DS(s), key, resident, true, &n, &pages, &skip, &disk) == 0 && disk;
}

static int ds_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct disk_store *ds = DS(s);
	if (ds->stopped || ds->closed)
		return eos_fail(SEL_ESTOPPED, "disk store: %s", ds->closed ? "closed" : "stopped");
	if (!hit || !in || (in->n_pages && !in->pages))
		return eos_fail(-EINVAL, "disk store: fetch without a hit or destination");
	uint32_t n_nodes, pages, skip;
	bool on_disk;
	int rc = chain_walk(ds, &hit->key, hit->resident, true, &n_nodes, &pages, &skip, &on_disk);
	if (rc)
		return rc;
	if (!on_disk)
		return eos_fail(-ESTALE, "disk store: part of the hit chain has no file yet");
	if (pages != hit->pages)
		return eos_fail(-ESTALE, "disk store: hit chain changed (%" PRIu32 " pages now, %" PRIu32
				" in the hit)", pages, hit->pages);
	/* Exactly the nodes the lookup compared with the request's history. */
	sel_digest dg;
	if ((rc = sel_index_chain_digest(ds->ix, sel_index_find(ds->ix, &hit->key), hit->resident,
					 &dg)) != 0)
		return rc;
	if (memcmp(dg.b, hit->chain.b, SEL_DIGEST_BYTES) != 0)
		return eos_fail(-ESTALE, "disk store: the hit's chain is not the one its lookup "
				"verified");
	if (in->n_pages != hit->pages)
		return eos_fail(-EINVAL, "disk store: inbound ticket %" PRIu64 " has %" PRIu32
				" pages, the hit uploads %" PRIu32, in->ticket, in->n_pages, hit->pages);
	if (in->state_slot >= ds->min_rows)
		return eos_fail(-EINVAL, "disk store: inbound state slot %" PRIu32 " beyond %" PRIu64
				" rows", in->state_slot, ds->min_rows);
	for (uint32_t i = 0; i < in->n_pages; i++)
		if (in->pages[i] >= ds->min_pages)
			return eos_fail(-EINVAL, "disk store: inbound page id %" PRIu32 " beyond %" PRIu64
					" pages", in->pages[i], ds->min_pages);

	/* Windows: each node's needed pages in runs of <= 64; the row last. */
	sel_node_id end = sel_index_find(ds->ix, &hit->key);
	uint32_t n_win = 0;
	{
		sel_node_id cur = end;
		for (uint32_t i = n_nodes; i-- > 0;) {
			const sel_index_node *x = NODE(ds, cur);
			uint32_t off = i == 0 ? skip : 0;
			n_win += div_up(x->tail_pages - off, SEL_WINDOW_PAGES);
			cur = x->parent;
		}
		const sel_index_node *e = NODE(ds, end);
		if (e->tail_pages == (n_nodes == 1 ? skip : 0))
			n_win++; /* the row alone */
	}
	struct dstream *st = stream_new(ds, hit->pages, n_win, n_nodes);
	if (!st)
		return eos_fail(-ENOMEM, "disk store: out of memory for a fetch of %" PRIu32 " pages",
				hit->pages);
	{
		sel_node_id cur = end;
		for (uint32_t i = n_nodes; i-- > 0;) {
			st->nodes[i] = cur;
			cur = NODE(ds, cur)->parent;
		}
	}
	uint32_t w = 0, at = 0;
	for (uint32_t i = 0; i < n_nodes; i++) {
		const sel_index_node *x = NODE(ds, st->nodes[i]);
		for (uint32_t f = i == 0 ? skip : 0; f < x->tail_pages; f += SEL_WINDOW_PAGES) {
			uint32_t cnt = x->tail_pages - f < SEL_WINDOW_PAGES ? x->tail_pages - f
									    : SEL_WINDOW_PAGES;
			st->plan[w++] = (struct wplan){.node_i = i, .first = f, .count = cnt, .dst_at = at};
			at += cnt;
		}
	}
	if (w < n_win) /* the row alone */
		st->plan[w++] = (struct wplan){.node_i = n_nodes - 1,
					       .first = NODE(ds, end)->tail_pages, .dst_at = at};
	st->plan[n_win - 1].row = true;
	memcpy(st->ids, in->pages, (size_t)in->n_pages * sizeof(uint32_t));
	st->put = false;
	st->id = in->ticket;
	st->key = hit->key;
	st->resident = hit->resident;
	st->state_slot = in->state_slot;
	st->bytes = record_bytes(ds, hit->pages, true);
	for (uint32_t i = 0; i < n_nodes; i++)
		ds_pin(ds, st->nodes[i]);
	ds->st.fetches++;
	ds->st.inflight_in++;
	sel_index_touch(ds->ix, end);
	stream_pump(ds, st);
	debug_check(ds);
	return 0;
}

/* ---- the rest of the interface ------------------------------------------------------ */

static void ds_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir)
{
	(void)key;
	(void)generation;
	(void)heir;
	DS(s)->st.evictions_noticed++;
}

static void ds_touch(sel_store *s, const sel_key *key)
{
	struct disk_store *ds = DS(s);
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id != SEL_NODE_NONE)
		sel_index_touch(ds->ix, id);
	debug_check(ds);
}

static void ds_stats(sel_store *s, sel_stats *out)
{
	struct disk_store *ds = DS(s);
	*out = ds->st;
	out->transport = ds->sp->backend->name;
	if (ds->disk) {
		struct sel_disk_stats dst;
		sel_disk_stats(ds->disk, &dst);
		out->disk_io = sel_disk_io_path(&dst);
	}
	out->slot_bytes = ds->slot_bytes;
	out->slots_in_use = sel_slab_in_use(ds->pool);
	out->slots_total = sel_slab_total(ds->pool);
	out->intake_slots = sel_slab_intake(ds->pool);
	out->parked_records = ds->parked;
	sel_tier_stats *t = &out->tier[SEL_TIER_DISK];
	t->records = sel_index_count(ds->ix);
	t->bytes_used = ds->used;
	t->bytes_limit = ds->limit;
	t->rate_bps = (uint64_t)sel_policy_rate(ds->policy, SEL_TIER_DISK);
	t->fixed_ns = (uint64_t)sel_policy_fixed_ns(ds->policy, SEL_TIER_DISK);
}

static int ds_wait_fd(sel_store *s)
{
	return DS(s)->epfd;
}

int sel_disk_store_fd(sel_store *s)
{
	return DS(s)->epfd;
}

static bool busy(const struct disk_store *ds)
{
	return ds->streams.head || ds->jobs.head || ds->dq_head || ds->df_head || ds->xf_head ||
	       ds->disk_out || (ds->xfer && sel_xfer_inflight(ds->xfer));
}

static int ds_close(sel_store *s, uint64_t deadline_ns)
{
	struct disk_store *ds = DS(s);
	if (ds->closed)
		return ds->close_rc;
	ds->closed = true;
	/* Drain: streams need this thread to move them from stage to stage. */
	while (busy(ds) && !ds->stopped) {
		if (progress(ds))
			continue;
		run_hooks(ds);
		if (!busy(ds))
			break;
		if (deadline_ns && eos_now_ns() >= deadline_ns)
			break;
		struct epoll_event e;
		(void)epoll_wait(ds->epfd, &e, 1, 5);
	}
	run_hooks(ds);
	int rc = 0;
	bool drained = !busy(ds);
	if (ds->xfer && sel_xfer_close(ds->xfer, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (ds->disk && sel_disk_close(ds->disk, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (rc == 0 && !drained) {
		/* Stopped with work queued: what never reached a thread is
		 * safe to drop now that both threads have ended. */
		progress(ds);
		run_hooks(ds);
	}
	if (rc) {
		char b[32];
		ds->stopped = true;
		eos_fail(rc, "disk store: copies or disk I/O did not drain by the deadline; the slot "
			 "pool (%s) and the record directory lock are kept",
			 eos_format_size(ds->slot_bytes * sel_slab_total(ds->pool), b, sizeof b));
	}
	ds->close_rc = rc;
	return rc;
}

static void ds_destroy(sel_store *s)
{
	struct disk_store *ds = DS(s);
	if (!ds)
		return;
	if (!ds->closed)
		ds_close(s, eos_now_ns() + 10ull * 1000 * 1000 * 1000);
	if (ds->close_rc != 0) {
		/* A thread may still use these: keep them, reachable. */
		struct leaked *l = calloc(1, sizeof(*l));
		if (ds->own_sp)
			sel_store_pool_leak(ds->sp);
		if (l) {
			l->what[0] = ds->xfer;
			l->what[1] = ds->disk;
			l->what[2] = ds->ns;
			l->what[3] = ds->lk;
			l->what[4] = ds->wins.head;
			l->what[5] = ds->jobs.head;
			pthread_mutex_lock(&leak_mu);
			l->next = leaked_list;
			leaked_list = l;
			pthread_mutex_unlock(&leak_mu);
		}
		sel_disk_destroy(ds->disk); /* frees itself when its thread ends */
	} else {
		while (ds->wins.head)
			win_free(ds, ds->wins.head);
		while (ds->jobs.head)
			job_free(ds, ds->jobs.head);
		while (ds->streams.head) {
			struct dstream *st = ds->streams.head;
			streams_del(&ds->streams, st);
			stream_free(ds, st);
		}
		sel_xfer_destroy(ds->xfer);
		sel_disk_destroy(ds->disk);
		if (ds->own_sp)
			sel_store_pool_destroy(ds->sp);
		if (ds->lk)
			eos_dirlock_release(ds->lk);
		free(ds->lk);
		if (ds->ns)
			sel_record_ns_free(ds->ns);
		free(ds->ns);
	}
	if (ds->epfd >= 0)
		close(ds->epfd);
	if (ds->efd >= 0)
		close(ds->efd);
	free((char *)ds->base.disk_dir);
	free(ds->recs);
	free(ds->doomed);
	free(ds->evq);
	free(ds->hd);
	sel_index_chain_free(&ds->chain);
	sel_index_destroy(ds->ix);
	sel_policy_destroy(ds->policy);
	free(ds);
}

static const struct sel_store_ops ds_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "disk",
	.lookup = ds_lookup,
	.put = ds_put,
	.fetch = ds_fetch,
	.poll = ds_poll,
	.evicted = ds_evicted,
	.touch = ds_touch,
	.stats = ds_stats,
	.wait_fd = ds_wait_fd,
	.close = ds_close,
	.destroy = ds_destroy,
};

/* ---- open: lock, scan, rebuild --------------------------------------------------------- */

/* The startup recovery's hook: the record behind node id, from its file. */
static int rebuilt(void *ctx, sel_index *ix, sel_node_id id, size_t i, const sel_scan_record *x)
{
	(void)ix;
	(void)i;
	struct disk_store *ds = ctx;
	int rc = ensure_rec(ds, id);
	if (rc)
		return rc;
	struct drec *r = &ds->recs[id];
	memset(r, 0, sizeof(*r));
	r->live = true;
	r->file = true;
	r->pprev = r->pnext = SEL_NODE_NONE;
	r->fparent = x->d.parent;
	r->parent_check = x->d.parent_check;
	r->fid = x->id;
	r->flags = x->d.flags;
	r->full = x->span.row_end;
	r->rowseg = x->span.row_end - x->span.row_off;
	r->charged = x->file_bytes;
	ds->used += r->charged;
	return 0;
}

/* Startup: the recovery `flare records gc` runs too (record_recovery.c),
 * then the limit. */
static int rebuild(struct disk_store *ds)
{
	sel_scan sc;
	struct sel_recovery_opts ro = {
		.scan = {.direct = false, .max_file_bytes = ds->limit},
		.now_ns = ds->exp.clock(),
		.inserted = rebuilt,
		.ctx = ds,
	};
	int rc = sel_recover(ds->lk->fd, ds->ns, &ro, ds->ix, &sc);
	if (rc)
		return eos_fail(rc, "disk store: recovering '%s': %s", ds->base.disk_dir, eos_errmsg());
	/* Files the scan removed for failing header verification count as
	 * corrupt records (docs/metrics.md), like payloads failing at a read. */
	ds->st.tier[SEL_TIER_DISK].corrupt += sc.st.bad_format + sc.st.bad_checksum +
					      sc.st.bad_name + sc.st.bad_size + sc.st.bad_sparse +
					      sc.st.bad_link;
	ds->st.tier[SEL_TIER_DISK].dropped_oversize += sc.st.bad_large;
	ds->base.scanned_records = sel_index_count(ds->ix);
	(void)make_room(ds, 0); /* over the limit: LRU eviction */
	sel_scan_free(&sc);
	return 0;
}

static int epoll_add(int epfd, int fd)
{
	struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e) != 0)
		return eos_fail(-errno, "disk store: epoll: %s", strerror(errno));
	return 0;
}

static int open_on(const sel_store_config *cfg, struct sel_store_pool *sp, bool own,
		   const struct sel_disk_store_hooks *hooks, sel_store **out)
{
	struct disk_store *ds = calloc(1, sizeof(*ds));
	int rc;
	*out = NULL;
	if (!ds) {
		if (own)
			sel_store_pool_destroy(sp);
		return eos_fail(-ENOMEM, "disk store: out of memory");
	}
	const sel_geometry *g = cfg->geometry;
	ds->base.ops = &ds_ops;
	ds->base.page_tokens = g->page_tokens;
	ds->g = g;
	ds->sp = sp;
	ds->own_sp = own;
	ds->layout = &sp->layout;
	ds->pool = sp->pool;
	ds->epfd = ds->efd = -1;
	ds->park_head = ds->park_tail = SEL_NODE_NONE;
	ds->ranks = g->ranks;
	ds->pt = g->page_tokens;
	ds->row_slots = sp->row_slots;
	ds->slot_bytes = sp->slot_bytes;
	ds->intake = sp->intake;
	ds->min_pages = sp->min_pages;
	ds->min_rows = sp->min_rows;
	ds->page_bytes_all = sp->page_bytes_all;
	ds->row_bytes_all = sp->row_bytes_all;
	ds->iov_cap = g->ranks * sp->row_slots;
	if (hooks)
		ds->hooks = *hooks;
	if (own && sp->warning[0])
		ds->base.warning = sp->warning;

	if (!(ds->ns = calloc(1, sizeof(*ds->ns))) || !(ds->lk = calloc(1, sizeof(*ds->lk)))) {
		rc = eos_fail(-ENOMEM, "disk store: out of memory");
		goto fail;
	}
	ds->lk->fd = -1;
	rc = sel_record_ns_init(ds->ns, g, cfg->identity);
	if (rc)
		goto fail;
	/* The lock first: a second owner fails here, before any scan. */
	rc = sel_record_dir_open(cfg->disk_dir, ds->ns, ds->lk);
	if (rc) {
		rc = eos_fail(rc, "disk store: %s", eos_errmsg());
		goto fail;
	}
	if (!(ds->base.disk_dir = strdup(ds->lk->path))) {
		rc = eos_fail(-ENOMEM, "disk store: out of memory");
		goto fail;
	}
	ds->limit = cfg->disk_limit;
	if (!ds->limit) {
		uint64_t avail = 0;
		rc = eos_fs_space(ds->lk->path, &avail, NULL);
		if (rc) {
			rc = eos_fail(rc, "disk store: free space of '%s': %s", ds->lk->path, eos_errmsg());
			goto fail;
		}
		ds->limit = avail / 10;
	}
	ds->base.disk_limit = ds->limit;
	if ((rc = sel_index_create(ds->pt, &ds_index_ops, ds, &ds->ix)) ||
	    (rc = sel_policy_create(&ds->policy)) || (rc = ensure_rec(ds, 0)))
		goto fail;
	sel_expiry_init(&ds->exp, cfg);
	if (sel_expiry_on(&ds->exp))
		sel_index_set_clock(ds->ix, ds->exp.clock);
	struct sel_disk_config dc = {
		.dirfd = ds->lk->fd, .dir = ds->lk->path, .ns = ds->ns, .direct = -1,
		.fdatasync = cfg->fdatasync,
	};
	if ((rc = sel_disk_create(&dc, &ds->disk)))
		goto fail;
	{
		/* The startup line names the path actually used (design 2.10 wants
		 * direct I/O; a fallback fills the page cache). */
		struct sel_disk_stats dst;
		sel_disk_stats(ds->disk, &dst);
		ds->base.disk_io = sel_disk_io_path(&dst);
		ds->base.disk_io_note = sel_disk_io_note(ds->disk);
	}
	rc = sel_xfer_create(g, ds->layout, ds->pool, sp->backend,
			     cfg->queue_depth ? cfg->queue_depth : 64, &ds->xfer);
	if (rc)
		goto fail;
	ds->epfd = epoll_create1(EPOLL_CLOEXEC);
	ds->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (ds->epfd < 0 || ds->efd < 0) {
		rc = eos_fail(-errno, "disk store: epoll/eventfd: %s", strerror(errno));
		goto fail;
	}
	if ((rc = epoll_add(ds->epfd, sel_xfer_fd(ds->xfer))) ||
	    (rc = epoll_add(ds->epfd, sel_disk_fd(ds->disk))) || (rc = epoll_add(ds->epfd, ds->efd)))
		goto fail;
	if ((rc = rebuild(ds)))
		goto fail;
	*out = &ds->base;
	debug_check(ds);
	return 0;
fail:
	ds_destroy(&ds->base);
	return rc;
}

int sel_disk_store_open(const sel_store_config *cfg, sel_store **out)
{
	struct sel_store_pool *sp;
	*out = NULL;
	if (!cfg || !cfg->geometry)
		return eos_fail(-EINVAL, "disk store: no geometry");
	if (!cfg->disk_dir || !*cfg->disk_dir)
		return eos_fail(-EINVAL, "disk store: no directory");
	int rc = sel_store_pool_open(cfg, 0, "disk store", &sp);
	if (rc)
		return rc;
	return open_on(cfg, sp, true, NULL, out);
}

int sel_disk_store_open_shared(const sel_store_config *cfg, struct sel_store_pool *sp,
			       const struct sel_disk_store_hooks *hooks, sel_store **out)
{
	*out = NULL;
	if (!cfg || !cfg->geometry || !sp || !cfg->disk_dir || !*cfg->disk_dir)
		return eos_fail(-EINVAL, "disk store: no geometry, pool or directory");
	return open_on(cfg, sp, false, hooks, out);
}

/* ---- the composite's side -------------------------------------------------------------- */

int sel_disk_store_park(sel_store *s, const struct sel_disk_park *p, bool *charged)
{
	struct disk_store *ds = DS(s);
	*charged = false;
	if (ds->stopped || ds->closed)
		return eos_fail(SEL_ESTOPPED, "disk store: %s", ds->closed ? "closed" : "stopped");
	if (sel_index_find(ds->ix, &p->key) != SEL_NODE_NONE)
		return -EEXIST;
	sel_node_id pid = sel_key_is_none(&p->parent) ? SEL_NODE_NONE
						       : sel_index_find(ds->ix, &p->parent);
	if (pid != SEL_NODE_NONE && (NODE(ds, pid)->flags & DS_DOOMED))
		pid = SEL_NODE_NONE;
	bool linked = false;
	if (pid != SEL_NODE_NONE) {
		uint64_t pc = NODE(ds, pid)->key.consumed, c = p->key.consumed;
		linked = pc < c && p->tail == (uint32_t)(c / ds->pt - pc / ds->pt);
		if (!linked)
			pid = SEL_NODE_NONE;
	}
	sel_record_desc d = {.key = p->key, .bucket = p->bucket, .tail = p->tail, .flags = p->flags};
	if (linked) {
		d.parent = p->parent;
		d.parent_check = sel_record_parent_check(&NODE(ds, pid)->bucket);
	}
	sel_record_span span;
	int rc = sel_record_span_of(&ds->ns->layout.sz, &d, &span);
	if (rc)
		return rc;
	uint64_t bytes = p->row ? span.row_end : span.row_off;
	if (bytes + ancestors_bytes(ds, pid) > ds->limit)
		return eos_fail(SEL_EOVERSIZE, "disk store: record of %" PRIu64 " bytes with its "
				"ancestors exceeds the limit", bytes);
	sel_node_id id;
	rc = sel_index_insert(ds->ix, &p->key, linked ? &p->parent : NULL, &p->bucket, p->tail,
			      p->row, &id);
	if (rc == 0)
		rc = ensure_rec(ds, id);
	if (rc) {
		if (rc != -EEXIST && id != SEL_NODE_NONE && sel_index_find(ds->ix, &p->key) == id)
			sel_index_remove(ds->ix, id);
		return rc;
	}
	struct drec *r = &ds->recs[id];
	memset(r, 0, sizeof(*r));
	r->live = true;
	r->pprev = r->pnext = SEL_NODE_NONE;
	r->fparent = d.parent;
	r->parent_check = d.parent_check;
	r->flags = p->flags;
	r->full = span.row_end;
	r->rowseg = span.row_end - span.row_off;
	sel_index_set_evictable(ds->ix, id, false);
	sel_index_get(ds->ix, id)->flags |= DS_PARKED | DS_UNCHARGED;
	ds->uncharged++;
	park_add(ds, id);
	sel_index_commit(ds->ix, id); /* complete in DRAM: lookups may use it */
	*charged = sel_disk_store_charge(s, &p->key) == 0;
	debug_check(ds);
	return 0;
}

int sel_disk_store_charge(sel_store *s, const sel_key *key)
{
	struct disk_store *ds = DS(s);
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	if (!(NODE(ds, id)->flags & DS_UNCHARGED))
		return 0;
	uint64_t bytes = node_bytes(ds, id);
	ds_pin(ds, id);
	bool ok = make_room(ds, bytes);
	ds_unpin(ds, id);
	if (!ok || sel_index_find(ds->ix, key) != id)
		return -ENOSPC;
	ds->recs[id].charged = bytes;
	ds->used += bytes;
	sel_index_get(ds->ix, id)->flags &= (uint16_t)~DS_UNCHARGED;
	ds->uncharged--;
	debug_check(ds);
	return 0;
}

int sel_disk_store_charge_free(sel_store *s, const sel_key *key)
{
	struct disk_store *ds = DS(s);
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	if (!(NODE(ds, id)->flags & DS_UNCHARGED))
		return 0;
	uint64_t bytes = node_bytes(ds, id);
	if (ds->used + bytes > ds->limit)
		return -ENOSPC;
	ds->recs[id].charged = bytes;
	ds->used += bytes;
	sel_index_get(ds->ix, id)->flags &= (uint16_t)~DS_UNCHARGED;
	ds->uncharged--;
	debug_check(ds);
	return 0;
}

int sel_disk_store_next_parked(sel_store *s, sel_key *key)
{
	struct disk_store *ds = DS(s);
	sel_node_id id;
	if (sel_key_is_none(key)) {
		id = ds->park_head;
	} else {
		id = sel_index_find(ds->ix, key);
		if (id == SEL_NODE_NONE || !ds->recs[id].parked_listed)
			return 0;
		id = ds->recs[id].pnext;
	}
	if (id == SEL_NODE_NONE)
		return 0;
	*key = NODE(ds, id)->key;
	return 1;
}

int sel_disk_store_write_from(sel_store *s, const sel_key *key, void *const *pages,
			      const struct iovec *row_iov, uint32_t row_n, uint64_t cookie)
{
	struct disk_store *ds = DS(s);
	if (ds->stopped || ds->closed)
		return eos_fail(SEL_ESTOPPED, "disk store: %s", ds->closed ? "closed" : "stopped");
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id == SEL_NODE_NONE)
		return eos_fail(-ENOENT, "disk store: no such record");
	const sel_index_node *n = NODE(ds, id);
	struct drec *r = &ds->recs[id];
	if (r->writing)
		return eos_fail(-EBUSY, "disk store: a write of this record is in flight");
	if (!(n->flags & DS_PARKED) || (n->flags & (DS_UNCHARGED | DS_DOOMED)))
		return eos_fail(-EINVAL, "disk store: write_from of a record that is not parked and "
				"charged");
	bool row = n->flags & SEL_NODE_HAS_ROW;
	if (row && (!row_iov || !row_n))
		return eos_fail(-EINVAL, "disk store: write_from without the row");
	size_t sz = sizeof(struct dj) + (size_t)n->tail_pages * sizeof(void *) +
		    (size_t)(row ? row_n : 0) * sizeof(struct iovec);
	struct dj *d = calloc(1, sz);
	if (!d)
		return eos_fail(-ENOMEM, "disk store: out of memory");
	void **pa = (void **)(d + 1);
	struct iovec *iov = (struct iovec *)(pa + n->tail_pages);
	memcpy(pa, pages, (size_t)n->tail_pages * sizeof(void *));
	if (row)
		memcpy(iov, row_iov, (size_t)row_n * sizeof(*iov));
	d->kind = K_WRITE_FROM;
	d->standalone = true;
	d->node = id;
	d->cookie = cookie;
	d->j.op = SEL_DISK_WRITE;
	node_desc(ds, id, &d->j.rec);
	d->j.row = row;
	d->j.pages = pa;
	d->j.row_iov = row ? iov : NULL;
	d->j.row_n = row ? row_n : 0;
	jobs_push(&ds->jobs, d);
	r->writing = true;
	ds_pin(ds, id);
	disk_submit(ds, d);
	debug_check(ds);
	return 0;
}

int sel_disk_store_read_into(sel_store *s, const sel_key *key, bool row, void *const *pages,
			     const struct iovec *row_iov, uint32_t row_n, uint64_t cookie)
{
	struct disk_store *ds = DS(s);
	if (ds->stopped || ds->closed)
		return eos_fail(SEL_ESTOPPED, "disk store: %s", ds->closed ? "closed" : "stopped");
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id == SEL_NODE_NONE)
		return eos_fail(-ESTALE, "disk store: no such record");
	const sel_index_node *n = NODE(ds, id);
	struct drec *r = &ds->recs[id];
	if (!r->file || (n->flags & DS_DOOMED) || (row && !(n->flags & SEL_NODE_HAS_ROW)))
		return eos_fail(-ESTALE, "disk store: the record has no file%s",
				row ? " or no row" : "");
	size_t sz = sizeof(struct dj) + (size_t)n->tail_pages * sizeof(void *) +
		    (size_t)(row ? row_n : 0) * sizeof(struct iovec);
	struct dj *d = calloc(1, sz);
	if (!d)
		return eos_fail(-ENOMEM, "disk store: out of memory");
	void **pa = (void **)(d + 1);
	struct iovec *iov = (struct iovec *)(pa + n->tail_pages);
	memcpy(pa, pages, (size_t)n->tail_pages * sizeof(void *));
	if (row)
		memcpy(iov, row_iov, (size_t)row_n * sizeof(*iov));
	d->kind = K_READ_INTO;
	d->standalone = true;
	d->node = id;
	d->cookie = cookie;
	d->j.op = SEL_DISK_READ;
	job_rec(ds, id, &d->j);
	d->j.pages = pa;
	d->j.row = row;
	d->j.row_iov = row ? iov : NULL;
	d->j.row_n = row ? row_n : 0;
	jobs_push(&ds->jobs, d);
	ds_pin(ds, id);
	sel_index_touch(ds->ix, id);
	disk_submit(ds, d);
	debug_check(ds);
	return 0;
}

int sel_disk_store_drop(sel_store *s, const sel_key *key, int reason)
{
	struct disk_store *ds = DS(s);
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	if (NODE(ds, id)->flags & DS_DOOMED)
		return 0;
	sel_tier_stats *t = &ds->st.tier[SEL_TIER_DISK];
	uint64_t n = 1 + doom(ds, id); /* doom counts nothing itself */
	if (reason == SEL_DISK_DROP_OVERSIZE)
		t->dropped_oversize += n;
	else if (reason == SEL_DISK_DROP_END_OF_CHAIN)
		t->dropped_end_of_chain += n;
	else
		t->dropped_io_error += n;
	debug_check(ds);
	return 0;
}

int sel_disk_store_pin(sel_store *s, const sel_key *key)
{
	struct disk_store *ds = DS(s);
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	ds_pin(ds, id);
	debug_check(ds);
	return 0;
}

void sel_disk_store_unpin(sel_store *s, const sel_key *key)
{
	struct disk_store *ds = DS(s);
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id != SEL_NODE_NONE && ds->recs[id].mypins)
		ds_unpin(ds, id);
	debug_check(ds);
}

/* ---- checks and introspection ------------------------------------------------------------ */

int sel_disk_store_record(sel_store *s, const sel_key *key, struct sel_disk_record_info *out)
{
	struct disk_store *ds = DS(s);
	sel_node_id id = sel_index_find(ds->ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = NODE(ds, id);
	const struct drec *r = &ds->recs[id];
	memset(out, 0, sizeof(*out));
	out->ready = n->state == SEL_NODE_READY;
	out->has_row = n->flags & SEL_NODE_HAS_ROW;
	out->file = r->file;
	out->writing = r->writing;
	out->parked = n->flags & DS_PARKED;
	out->charged = !(n->flags & DS_UNCHARGED);
	out->failed = n->flags & DS_FAILED;
	out->doomed = n->flags & DS_DOOMED;
	out->is_root = n->parent == SEL_NODE_NONE;
	out->tail = n->tail_pages;
	out->flags = r->flags;
	out->pins = n->pins;
	out->bytes = node_bytes(ds, id);
	out->bucket = n->bucket;
	out->tick = n->tick;
	out->used_ns = sel_index_used_ns(ds->ix, id);
	if (!out->is_root)
		out->parent = NODE(ds, n->parent)->key;
	return 0;
}

uint64_t sel_disk_store_uncharged(sel_store *s)
{
	return DS(s)->uncharged;
}

void sel_disk_store_usage(sel_store *s, uint64_t *used, uint64_t *limit)
{
	struct disk_store *ds = DS(s);
	if (used)
		*used = ds->used;
	if (limit)
		*limit = ds->limit;
}

size_t sel_disk_store_keys(sel_store *s, sel_key *keys, size_t cap)
{
	struct disk_store *ds = DS(s);
	size_t n = 0;
	for (sel_node_id id = sel_index_next_lru(ds->ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(ds->ix, id)) {
		if (n < cap)
			keys[n] = NODE(ds, id)->key;
		n++;
	}
	return n;
}

int sel_disk_store_check(sel_store *s)
{
	struct disk_store *ds = DS(s);
	int rc = sel_index_check(ds->ix);
	if (rc)
		return rc;
	if (ds->own_sp && (rc = sel_slab_check(ds->pool)))
		return rc;
	uint64_t nodes = 0, charged = 0, parked = 0, puts = 0, fetches = 0, unch_n = 0;
	for (sel_node_id id = sel_index_next_lru(ds->ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(ds->ix, id)) {
		const sel_index_node *n = NODE(ds, id);
		const struct drec *r = id < ds->nrecs ? &ds->recs[id] : NULL;
		nodes++;
		if (!r || !r->live)
			return eos_fail(SEL_ECORRUPT, "disk store: node %" PRIu32 " has no record", id);
		bool unch = n->flags & DS_UNCHARGED, park = n->flags & DS_PARKED;
		unch_n += unch;
		uint64_t want = unch ? 0 : node_bytes(ds, id);
		if (!(n->flags & DS_FAILED) && r->charged != want)
			return eos_fail(SEL_ECORRUPT, "disk store: node %" PRIu32 " charges %" PRIu64
					", expected %" PRIu64, id, r->charged, want);
		if ((n->flags & DS_FAILED) && (r->charged || r->file))
			return eos_fail(SEL_ECORRUPT, "disk store: failed node %" PRIu32 " holds a file "
					"or charge", id);
		charged += r->charged;
		if ((r->file || r->writing) && unch)
			return eos_fail(SEL_ECORRUPT, "disk store: node %" PRIu32 " has a file or a write "
					"but no charge", id);
		if (n->state == SEL_NODE_READY && !r->file && !park)
			return eos_fail(SEL_ECORRUPT, "disk store: ready node %" PRIu32 " has no file and "
					"is not parked", id);
		if (park && (r->file || !(n->flags & SEL_NODE_NOEVICT) || !r->parked_listed))
			return eos_fail(SEL_ECORRUPT, "disk store: parked node %" PRIu32 " has a file, is "
					"evictable or is off the park list", id);
		if (!park && r->parked_listed)
			return eos_fail(SEL_ECORRUPT, "disk store: node %" PRIu32 " on the park list is "
					"not parked", id);
		parked += r->parked_listed;
		if (r->writing && !r->mypins)
			return eos_fail(SEL_ECORRUPT, "disk store: node %" PRIu32 " is written unpinned",
					id);
		if (r->mypins > n->pins)
			return eos_fail(SEL_ECORRUPT, "disk store: node %" PRIu32 " store pins %" PRIu32
					" > index pins %" PRIu32, id, r->mypins, n->pins);
	}
	uint64_t live = 0;
	for (uint32_t i = 0; i < ds->nrecs; i++)
		live += ds->recs[i].live;
	if (live != nodes)
		return eos_fail(SEL_ECORRUPT, "disk store: %" PRIu64 " records, %" PRIu64 " nodes", live,
				nodes);
	if (charged + ds->stuck != ds->used)
		return eos_fail(SEL_ECORRUPT, "disk store: charges %" PRIu64 " + stuck %" PRIu64
				" != used %" PRIu64, charged, ds->stuck, ds->used);
	if (unch_n != ds->uncharged)
		return eos_fail(SEL_ECORRUPT, "disk store: %" PRIu64 " uncharged, counted %" PRIu64,
				unch_n, ds->uncharged);
	if (parked != ds->parked)
		return eos_fail(SEL_ECORRUPT, "disk store: %" PRIu64 " parked, counted %" PRIu64, parked,
				ds->parked);
	for (const struct dstream *st = ds->streams.head; st; st = st->next) {
		if (st->put)
			puts++;
		else
			fetches++;
		for (uint32_t i = 0; i < (st->put ? 1 : st->n_nodes); i++)
			if (!ds->recs[st->nodes[i]].live || !ds->recs[st->nodes[i]].mypins)
				return eos_fail(SEL_ECORRUPT, "disk store: a stream uses unpinned node %"
						PRIu32, st->nodes[i]);
	}
	for (const struct dj *d = ds->jobs.head; d; d = d->next)
		puts += d->held != NULL;
	if (puts != ds->st.inflight_out || fetches != ds->st.inflight_in)
		return eos_fail(SEL_ECORRUPT, "disk store: %" PRIu64 "/%" PRIu64 " streams live, counted %"
				PRIu64 "/%" PRIu64, puts, fetches, ds->st.inflight_out,
				ds->st.inflight_in);
	return 0;
}

bool sel_disk_store_fits(sel_store *s, const sel_published *cp)
{
	struct disk_store *ds = DS(s);
	uint64_t c = cp->key.consumed;
	sel_node_id pid = sel_key_is_none(&cp->parent) ? SEL_NODE_NONE
							: sel_index_find(ds->ix, &cp->parent);
	sel_record_desc d = {.key = cp->key, .bucket = cp->bucket, .tail = cp->n_pages};
	if (pid != SEL_NODE_NONE) {
		uint64_t p = NODE(ds, pid)->key.consumed;
		if (p < c && cp->tail == (uint32_t)(c / ds->pt - p / ds->pt)) {
			d.parent = cp->parent;
			d.tail = cp->tail;
		} else {
			pid = SEL_NODE_NONE;
		}
	}
	sel_record_span span;
	if (sel_record_span_of(&ds->ns->layout.sz, &d, &span) != 0)
		return false;
	return span.row_end + ancestors_bytes(ds, pid) <= ds->limit;
}
