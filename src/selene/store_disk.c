/*
 * store_disk.c - the disk store: published GPU checkpoints streamed through
 * intake slots into record files in the model's namespace directory, and
 * streamed back, byte-exact and verified (design 2.4 "DiskStore" and its
 * Staged transport; 2.2 store interface; 2.3 index, tree eviction, row
 * drops and startup pruning; 2.5 record files, directory lock, recovery,
 * the disk thread, expiry; 2.10 backpressure; 2.11 disk limit; 2.12
 * invariants; 2.15 local eviction, retention metrics and publication
 * outcomes).
 *
 * DESIGN
 *
 * The store is a struct sel_core (store_common.h: the index rebuilt from
 * its directory at startup, the slot pool's numbers, one record per node,
 * the counters, its own transfer set) plus the disk thread (disk.c), a
 * slab pool of intake slots (its own, intake only, when it stands alone;
 * the composite's shared warm + intake pool inside a composite) and the
 * parts of store_disk_int.h: the catalogue (per-record state, budget,
 * pins, doom, eviction), the Staged transport (windows through intake
 * slots), recovery at open, and the composite's side (park, write_from,
 * read_into).  This file is the ops.  Everything is driven from the model
 * worker thread; nothing here locks or waits, except close.
 *
 * put (Staged): the skeleton's prologue (dedupe: READY with row ->
 *   PRESENT; in flight or doomed -> SKIPPED; a failed record kept for its
 *   children is filled again), then SEL_OVERSIZE when the record plus the
 *   ancestors it links under can never fit the limit; insert PENDING and
 *   pin; evict least recently used unpinned leaves (unlink; compaction
 *   truncates) until its bytes fit, else SEL_RETRY (budget); take the first
 *   window's intake slots (else SEL_RETRY slabs -- also while other streams
 *   wait for slots) and submit its copy-out (else SEL_RETRY queue).  The
 *   record then streams window by window (store_disk_staged.c); the part
 *   that ends it commits the file, the node becomes READY and
 *   SEL_EV_STORED releases the worker's GPU pin.  The calling thread copies
 *   page ids; it never touches payload bytes or hashes.
 *
 * fetch: the skeleton's fetch check (every node READY, not doomed, the
 *   chain digest the lookup verified) plus a committed file for every
 *   node; then one stream of windows reads and copies the chain in.
 *   Windows that find no slots wait, so fetch itself never fails for lack
 *   of staging.  One event per ticket after every window drained.
 *
 * Progress (selene.h SEL_EV_PROGRESS): after a put was refused (SEL_RETRY)
 *   or deferred, a poll ends with one SEL_EV_PROGRESS when capacity came
 *   back without a STORED or FETCHED event: a window of a longer stream
 *   gave its intake slots back (and no stream waits for slots), a stream
 *   that failed for good released its intake slots and budget, a failed
 *   fetch its pins, expiry its records' budget.  A deferral (ENOSPC, EDQUOT) is a refusal, never
 *   progress: the space it hands back was not usable.
 *
 * Every job and window is one malloc'd block owning what the copy and disk
 * threads read.  If close cannot drain them (SEL_ESTOPPED), destroy leaks
 * the transfer set, the disk thread, the namespace, the directory lock, the
 * pool (if owned) and every live block, keeping them reachable.
 *
 * INVARIANTS: those of the catalogue (store_disk_catalog.c), verified by
 * sel_disk_store_check after every mutation in SEL_DEBUG_CHECKS builds, and
 * of the Staged transport (store_disk_staged.c).
 */
#include "store_disk_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "slab.h"

static const struct sel_store_ops ds_ops;
static const struct sel_core_ops ds_core_ops;

struct disk_store *sel_ds_of(sel_store *s)
{
	return (struct disk_store *)sel_store_checked(s, &ds_ops);
}

/* ---- put ---------------------------------------------------------------------- */

/* The record's file as the plan says: its description, span and bytes. */
static int put_span(struct disk_store *ds, const sel_published *cp, const struct sel_put_plan *p,
		    sel_record_desc *d, sel_record_span *span)
{
	*d = (sel_record_desc){.key = cp->key, .bucket = cp->bucket, .tail = p->tail};
	if (!p->fresh) {
		d->parent = ds_rec(ds, p->id)->fparent;
		d->parent_check = ds_rec(ds, p->id)->parent_check;
	} else if (p->pid != SEL_NODE_NONE) {
		d->parent = cp->parent;
		d->parent_check = sel_record_parent_check(&NODE(ds, p->pid)->bucket);
	}
	return sel_record_span_of(&ds->ns->layout.sz, d, span);
}

/* The first window: 0, or SEL_RETRY with its reason, or SEL_SKIPPED. */
static sel_outcome put_start(struct disk_store *ds, struct dstream *st, uint64_t bytes,
			     const sel_published *cp, sel_retry_reason *why)
{
	if (!ds_make_room(ds, bytes)) {
		char a[32], b[32];
		*why = SEL_RETRY_BUDGET;
		eos_fail(-ENOSPC,
			 "disk store: checkpoint %" PRIu64 " needs %s; %s of the limit are held"
			 " by records in use",
			 cp->checkpoint, eos_format_size(bytes, a, sizeof a),
			 eos_format_size(ds->used, b, sizeof b));
		return SEL_RETRY;
	}
	if (ds->wait.head) {
		*why = SEL_RETRY_SLABS;
		eos_fail(-EAGAIN, "disk store: staging is busy (streams wait for intake slots)");
		return SEL_RETRY;
	}
	int rc = ds_win_start(ds, st, true);
	if (rc == 0)
		return SEL_QUEUED;
	if (rc == 1) {
		*why = SEL_RETRY_SLABS;
		eos_fail(-ENOSPC, "disk store: no free intake slots for a window");
		return SEL_RETRY;
	}
	if (rc == -EAGAIN) {
		*why = SEL_RETRY_QUEUE;
		eos_fail(-EAGAIN, "disk store: transfer queue full");
		return SEL_RETRY;
	}
	return SEL_SKIPPED;
}

static sel_outcome put_inner(struct sel_core *c, const sel_published *cp,
			     const struct sel_put_plan *p, sel_retry_reason *why)
{
	struct disk_store *ds = (struct disk_store *)c;
	sel_outcome out;
	sel_record_desc d;
	sel_record_span span;
	if (put_span(ds, cp, p, &d, &span) != 0)
		return SEL_SKIPPED;
	uint64_t bytes = p->row ? span.row_end : span.row_off;
	uint64_t total = bytes + ds_ancestors_bytes(ds, p->pid);
	if (total > ds->limit) {
		char a[32], b[32];
		ds->c.st.tier[SEL_TIER_DISK].dropped_oversize++;
		eos_fail(SEL_EOVERSIZE,
			 "disk store: checkpoint %" PRIu64 " needs %s with its ancestors;"
			 " the disk limit is %s",
			 cp->checkpoint, eos_format_size(total, a, sizeof a),
			 eos_format_size(ds->limit, b, sizeof b));
		return SEL_OVERSIZE;
	}
	struct dstream *st = ds_put_stream(ds, cp, p->tail, p->row);
	if (!st)
		return SEL_SKIPPED;
	sel_node_id id = p->id;
	if (p->fresh &&
	    sel_core_insert(&ds->c, &cp->key, p->pid == SEL_NODE_NONE ? NULL : &cp->parent,
			    &cp->bucket, p->tail, true, &id) != 0) {
		ds_stream_free(ds, st);
		return SEL_SKIPPED;
	}
	struct drec *r = ds_rec(ds, id);
	if (p->fresh)
		r->pprev = r->pnext = SEL_NODE_NONE;
	r->fparent = d.parent;
	r->parent_check = d.parent_check;
	r->full = span.row_end;
	r->rowseg = span.row_end - span.row_off;
	r->flags = 0;
	st->nodes[0] = id;
	ds_pin(&ds->c, id);

	out = put_start(ds, st, bytes, cp, why);
	if (out != SEL_QUEUED) {
		ds_stream_free(ds, st);
		ds_unpin(&ds->c, id);
		if (p->fresh)
			sel_core_discard(&ds->c, id, &cp->key);
		debug_check(ds);
		return out;
	}
	sel_index_get(ds->c.ix, id)->flags &= (uint16_t)~DS_FAILED;
	r->charged = bytes;
	ds->used += bytes;
	r->writing = true;
	ds->c.st.inflight_out++;
	if (ds->sh)
		ds_shard_put(ds, st); /* the same record on every peer */
	ds_stream_pump(ds, st);       /* a second window, if slots allow */
	debug_check(ds);
	return SEL_QUEUED;
}

/* ---- fetch, poll ------------------------------------------------------------------ */

static int ds_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct disk_store *ds = sel_ds_of(s);
	struct sel_chain_walk w;
	int rc = sel_core_fetch_check(&ds->c, hit, in, ds_has_file,
				      "part of the hit chain has no file yet", &w);
	if (rc == 0)
		rc = ds_fetch_stream(ds, hit, in, &w, NULL, NULL);
	debug_check(ds);
	return rc;
}

/* The end of the chain (sel_core_cascade_set, design 2.15 "disk uses
 * byte-based headroom"): with a level below, the disk keeps its headroom
 * free by moving its oldest committed records there.  The headroom is
 * twice the intake's bytes -- what the layers above write ahead of need (a
 * composite's DRAM at most 2 x intake slots plus one record, a disk
 * store's own streams through its intake slots) -- and at most a quarter
 * of the limit, so a disk smaller than 8 x the intake still keeps three
 * quarters of itself local (docs/architecture.md).  The headroom
 * includes the unlinks and truncates still in flight (design 2.15): the
 * budget released their bytes at submission (the disk thread orders them
 * before any later fallocate), and they count as room already made, so
 * records are not offered again while a removal lands; ds->unlinking says
 * how many bytes that is, for the filesystem's side (sel_disk_store_headroom). */
static uint64_t ds_headroom(const struct disk_store *ds)
{
	uint64_t h = 2 * ds->c.intake * ds->c.slot_bytes, q = ds->limit / 4;
	return h < q ? h : q;
}

/* The limit less what the records charge (removals in flight count as
 * free) and less what the uncharged parked records want: in a composite
 * those are DRAM's demotions waiting for disk room, and the cascade makes
 * it (design 2.15 "DRAM demotes cold records to disk, and the last local
 * tier to the manager, before they fill") rather than leave the charge's
 * own eviction to drop committed records for good. */
static uint64_t ds_free_bytes(const struct disk_store *ds)
{
	uint64_t taken = ds->used + ds->wanted;
	return ds->limit > taken ? ds->limit - taken : 0;
}

static bool ds_cascade_low(struct sel_core *c, uint64_t held)
{
	struct disk_store *ds = (struct disk_store *)c;
	return ds_free_bytes(ds) + held < ds_headroom(ds);
}

bool sel_disk_store_headroom(sel_store *s, uint64_t *free_bytes, uint64_t *unlinking,
			     uint64_t *headroom)
{
	struct disk_store *ds = sel_ds_of(s);
	if (free_bytes)
		*free_bytes = ds_free_bytes(ds);
	if (unlinking)
		*unlinking = ds->unlinking;
	if (headroom)
		*headroom = ds_headroom(ds);
	return ds_cascade_low(&ds->c, ds->c.casc_units);
}

static uint64_t ds_cascade_units(struct sel_core *c, sel_node_id id)
{
	return ds_node_bytes((struct disk_store *)c, id);
}

static int ds_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct disk_store *ds = sel_ds_of(s);
	ds_progress(ds);
	sel_core_keep_warm(&ds->c);
	ds_expire(ds);
	ds_run_hooks(ds);
	(void)sel_core_cascade_run(&ds->c, ds_cascade_low, ds_cascade_units);
	if (sel_progress_due(&ds->c.pg)) {
		sel_event pe = {.type = SEL_EV_PROGRESS};
		sel_evq_push(&ds->evq, &pe);
	}
	sel_core_flush(&ds->c); /* this pass's submissions, put's and fetch's included */
	size_t n = sel_evq_take(&ds->evq, ev, cap);
	sel_evq_rearm(&ds->evq, ds->df.head || ds->xf.head);
	debug_check(ds);
	if (n == 0 && ds->sh && ds_shard_stopped(ds))
		return SEL_ESTOPPED; /* the rank links stopped: the store and the worker stop */
	return (int)n;
}

/* ---- the rest of the interface ------------------------------------------------------ */

static void ds_stats(sel_store *s, sel_stats *out)
{
	struct disk_store *ds = sel_ds_of(s);
	sel_core_stats(&ds->c, out);
	if (ds->disk) {
		struct sel_disk_stats dst;
		sel_disk_stats(ds->disk, &dst);
		out->disk_io = sel_disk_io_path(&dst);
		out->thread_wakes += sel_disk_wakes(ds->disk);
	}
	out->parked_records = ds->parked;
	sel_tier_stats *t = &out->tier[SEL_TIER_DISK];
	t->bytes_used = ds->used;
	t->bytes_limit = ds->limit;
}

static void ds_describe(sel_store *s, sel_store_info *out)
{
	struct disk_store *ds = sel_ds_of(s);
	out->disk_dir = ds->dir;
	out->disk_limit = ds->limit;
	out->disk_shared = ds->shared;
	out->scanned_records = ds->scanned;
	out->disk_io = ds->disk_io;
	out->disk_io_note = ds->disk_io_note;
	if (ds->c.own_sp && ds->c.sp->warning[0])
		out->warning = ds->c.sp->warning;
}

static int ds_wait_fd(sel_store *s) { return sel_ds_of(s)->evq.epfd; }

int sel_disk_store_fd(sel_store *s) { return sel_ds_of(s)->evq.epfd; }

static int ds_close(sel_store *s, uint64_t deadline_ns)
{
	struct disk_store *ds = sel_ds_of(s);
	if (ds->c.closed)
		return ds->c.close_rc;
	ds->c.closed = true;
	/* Drain: streams need this thread to move them from stage to stage. */
	while (ds_busy(ds) && !ds->c.stopped) {
		if (ds_progress(ds))
			continue;
		ds_run_hooks(ds);
		if (!ds_busy(ds) || (deadline_ns && eos_now_ns() >= deadline_ns))
			break;
		sel_evq_nap(&ds->evq, 5);
	}
	ds_run_hooks(ds);
	int rc = ds->sh ? ds_shard_close(ds, deadline_ns) : 0;
	bool drained = !ds_busy(ds);
	if (ds->c.xfer && sel_xfer_close(ds->c.xfer, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (ds->disk && sel_disk_close(ds->disk, deadline_ns) != 0)
		rc = SEL_ESTOPPED;
	if (rc == 0 && !drained) {
		/* Stopped with work queued: what never reached a thread is safe
		 * to drop now that both threads have ended. */
		ds_progress(ds);
		ds_run_hooks(ds);
	}
	char b[32];
	if (rc)
		eos_fail(rc,
			 "disk store: copies or disk I/O did not drain by the deadline; the slot "
			 "pool (%s) and the record directory lock are kept",
			 eos_format_size(ds->c.slot_bytes * sel_slab_total(ds->pool), b, sizeof b));
	return sel_core_close_end(&ds->c, rc);
}

static void ds_destroy(sel_store *s)
{
	struct disk_store *ds = sel_ds_of(s);
	if (!ds)
		return;
	if (sel_core_destroy_begin(s)) {
		/* A thread may still use these: keep them, reachable. */
		sel_leak((void *[]){ds->disk, ds->ns, ds->lk, ds->wins.head, ds->jobs.head,
				    ds->streams.head},
			 6);
		sel_disk_destroy(ds->disk); /* frees itself when its thread ends */
		ds_shard_destroy(ds, true);
	} else {
		while (ds->wins.head)
			ds_win_free(ds, ds->wins.head);
		while (ds->jobs.head)
			ds_job_free(ds, ds->jobs.head);
		while (ds->streams.head)
			ds_stream_free(ds, ds->streams.head);
		ds_shard_destroy(ds, false);
		sel_disk_destroy(ds->disk);
		if (ds->lk)
			eos_dirlock_release(ds->lk);
		free(ds->lk);
		if (ds->ns)
			sel_record_ns_free(ds->ns);
		free(ds->ns);
	}
	sel_evq_free(&ds->evq);
	free(ds->dir);
	free(ds->doomed);
	free(ds->hd);
	sel_core_destroy_end(&ds->c);
	free(ds);
}

static const struct sel_store_ops ds_ops = SEL_CORE_STORE_OPS(
	"disk", ds_fetch, ds_poll, ds_stats, ds_wait_fd, ds_close, ds_destroy, ds_describe, true);

static const struct sel_core_ops ds_core_ops =
	SEL_CORE_OPS(put_inner, ds_pin, ds_unpin, sel_disk_store_check, ds_drop_row, ds_remove);

/* ---- open ------------------------------------------------------------------------------ */

static void ds_flush_disk(struct sel_core *c, bool defer)
{
	struct disk_store *ds = (struct disk_store *)c;
	if (ds->disk && defer)
		sel_disk_defer_wakes(ds->disk, true);
	else if (ds->disk)
		(void)sel_disk_kick(ds->disk);
}

/* The disk thread and its startup path, the transfer set and the wait set. */
static int threads_open(struct disk_store *ds, const sel_store_config *cfg)
{
	struct sel_disk_config dc = {
		.dirfd = ds->lk->fd,
		.dir = ds->lk->path,
		.ns = ds->ns,
		.direct = -1,
		.fdatasync = cfg->fdatasync,
	};
	int rc = sel_disk_create(&dc, &ds->disk);
	if (rc)
		return rc;
	ds->c.flush_more = ds_flush_disk; /* deferred wakes from the first flush on */
	/* The startup line names the path actually used (design 2.10 wants
	 * direct I/O; a fallback fills the page cache). */
	struct sel_disk_stats dst;
	sel_disk_stats(ds->disk, &dst);
	ds->disk_io = sel_disk_io_path(&dst);
	ds->disk_io_note = sel_disk_io_note(ds->disk);
	if ((rc = sel_core_xfer(&ds->c, cfg)) || (rc = sel_evq_init(&ds->evq, "disk store")) ||
	    (rc = sel_evq_watch(&ds->evq, sel_xfer_fd(ds->c.xfer), "disk store")))
		return rc;
	return sel_evq_watch(&ds->evq, sel_disk_fd(ds->disk), "disk store");
}

static int open_on(const sel_store_config *cfg, struct sel_store_pool *sp, bool own,
		   const struct sel_disk_store_hooks *hooks, sel_store **out)
{
	struct disk_store *ds = sel_core_alloc(sizeof(*ds), sp, own, "disk store");
	int rc;
	*out = NULL;
	if (!ds)
		return -ENOMEM;
	ds->pool = sp->pool;
	ds->evq.epfd = ds->evq.efd = -1;
	ds->park_head = ds->park_tail = SEL_NODE_NONE;
	ds->iov_cap = cfg->geometry->ranks * sp->row_slots;
	if (hooks)
		ds->hooks = *hooks;
	ds->c.refuse = DS_DOOMED;
	ds->c.end_of_chain = true;
	rc = sel_core_init(&ds->c, &ds_ops, &ds_core_ops, "disk store", SEL_TIER_DISK,
			   sizeof(struct drec), cfg, sp, own);
	if (rc == 0)
		rc = ds_namespace_open(ds, cfg);
	if (rc == 0)
		rc = threads_open(ds, cfg);
	if (rc == 0 && cfg->ranks)
		rc = ds_shard_open(ds, cfg); /* the agreement, before the index is built */
	if (rc == 0)
		rc = ds_rebuild(ds);
	if (rc) {
		ds_destroy(&ds->c.base);
		return rc;
	}
	*out = &ds->c.base;
	debug_check(ds);
	return 0;
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
