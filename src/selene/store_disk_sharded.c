/*
 * store_disk_sharded.c - the Sharded transport of the disk store, rank
 * zero's side (store_disk_sharded.h; design 2.14; docs/multihost.md "For
 * part B" items 1, 3, 4).
 *
 * DESIGN
 *
 * The disk store stays what it is on one host: its index, budget,
 * eviction and plans, its Staged streams.  This file adds, at four hooks:
 *
 *   put     (store_disk.c put_inner, once the first window was queued):
 *           a STORE job with the record's file header, its tail page ids,
 *           the row's state slot and the creation time the local header
 *           gets too (dstream.created_ns -> the END part's job).  A link
 *           that refuses it (-EAGAIN: a peer's queue is full) fails the
 *           stream at once: the local windows already in flight drain and
 *           the put reports SEL_SKIPPED; the worker never waits.
 *   fetch   (store_disk_staged.c ds_fetch_stream): one FETCH job with the
 *           whole chain, ancestor first, each record's page range and the
 *           destination ids in order, the endpoint's row into the slot.
 *   file    (store_disk_catalog.c file_job): every TRUNCATE and UNLINK --
 *           eviction, compaction, recovery's prune, a failed put's cleanup
 *           -- also on every peer, queued here when the links refuse it
 *           for now and sent at the next progress.
 *   finish  (stream_finish): a stream whose link job is outstanding waits
 *           (ds_shard_hold); the event comes when both parts ended:
 *             put, both committed            STORED
 *             put, this rank committed, the links failed (their partial
 *                  files already unlinked by the link set): this rank's
 *                  file is unlinked (a disk job ahead of the discard that
 *                  holds the event), then STORE_FAILED -- DEFERRED when
 *                  every failure was ENOSPC or EDQUOT
 *             put, this rank failed and peers committed: sel_shard_cleanup
 *                  unlinks theirs, and its completion finishes the stream
 *             fetch: FETCHED only when every rank's copy landed
 *
 * Stop.  When the link set stops (a peer's connection failed with a job
 * outstanding, or a job timed out), sel_shard_poll says SEL_ESTOPPED: the
 * store stops (c.stopped, poll returns SEL_ESTOPPED), no held stream is
 * ever finished -- a peer may still copy into its ids -- and close returns
 * SEL_ESTOPPED so that destroy leaks what they reference.
 *
 * INVARIANTS
 *   1. A stream with link == DS_LINK_OUT or DS_LINK_CLEANUP is finished
 *      only by the link completion whose cookie is the stream.
 *   2. Every TRUNCATE and UNLINK this rank runs is sent or queued (pend)
 *      in the same order.
 */
#include "store_disk_sharded.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "shard_link.h"
#include "store_disk_int.h"

#define SH_JOIN_NS (120ull * 1000000000ull)
#define SH_POLL 32

struct pend {
	sel_record_desc d;
	uint32_t op;
};

struct ds_shard {
	sel_shard_set *set;
	struct sel_store_ranks r; /* the engine's callbacks */
	uint32_t world;
	struct pend *pend; /* file jobs the links refused for now, in order */
	size_t n_pend, cap_pend;
	uint32_t out; /* stream and file jobs outstanding on the links */
	bool stopped;
	char why[EOS_ERRMSG_MAX];
};

/* ---- open ----------------------------------------------------------------------- */

void ds_shard_namespace(struct disk_store *ds, const sel_store_config *cfg)
{
	const sel_geometry *g = cfg->geometry;
	sel_shard_rank_fingerprint(&g->rank[0], g->page_tokens, 0, cfg->ranks->world,
				   ds->ns->fingerprint);
	sel_record_dirname(ds->ns->identity, ds->ns->fingerprint, ds->ns->dirname);
}

static int set_open(const struct sel_store_ranks *r, const sel_geometry *g,
		    const uint8_t identity[SEL_IDENTITY_BYTES], bool disk, uint64_t limit,
		    sel_shard_set **out)
{
	if (r->world < 2 || r->world > SEL_SHARD_WORLD_MAX || g->ranks != 1)
		return eos_fail(-EINVAL,
				"rank links: %" PRIu32 " ranks with a %" PRIu32
				"-rank geometry on rank 0 (expected 2..64 and one)",
				r->world, g->ranks);
	struct sel_shard_config c = {.world = r->world,
				     .page_tokens = g->page_tokens,
				     .set = {.disk = disk, .disk_limit = limit},
				     .queue_jobs = r->queue_jobs,
				     .queue_bytes = r->queue_bytes,
				     .job_timeout_ns = r->job_timeout_ns,
				     .sock_buf = r->sock_buf};
	memcpy(c.identity, identity, SEL_IDENTITY_BYTES);
	for (uint32_t k = 0; k < r->world; k++)
		sel_shard_rank_fingerprint(&g->rank[0], g->page_tokens, k, r->world,
					   c.fingerprint[k]);
	int rc = sel_shard_open(&c, out);
	if (rc)
		return rc;
	uint8_t buf[1024];
	for (uint32_t k = 1; k < r->world; k++) {
		int n = sel_shard_hello(*out, k, r->rendezvous_fd(r->ctx, k), buf, sizeof buf);
		if (n < 0)
			return n;
		if ((rc = r->send_hello(r->ctx, k, buf, (size_t)n)))
			return rc;
	}
	return sel_shard_join(*out, eos_now_ns() + (r->join_ns ? r->join_ns : SH_JOIN_NS));
}

int sel_store_ranks_join_none(const struct sel_store_ranks *r, const sel_geometry *g,
			      const uint8_t identity[SEL_IDENTITY_BYTES])
{
	sel_shard_set *s = NULL;
	int rc = set_open(r, g, identity, false, 0, &s);
	if (rc)
		rc = eos_fail(rc, "the rank links: %s", eos_errmsg());
	sel_shard_destroy(s);
	return rc;
}

/* Scan with the agreed limit, agree with every peer, apply rank zero's
 * share: every rank then holds the same file names and lengths. */
static int agree(struct disk_store *ds, uint64_t deadline)
{
	sel_scan s;
	struct sel_scan_opts o = {.max_file_bytes = ds->limit, .threads = 4};
	int rc = sel_record_scan(ds->lk->fd, ds->ns, &o, &s);
	if (rc)
		return rc;
	struct sel_shard_entry *e = calloc(s.n ? s.n : 1, sizeof *e);
	uint8_t *act = malloc(s.n ? s.n : 1);
	struct sel_shard_agree_stats st;
	if (!e || !act) {
		rc = eos_fail(-ENOMEM, "out of memory for a summary of %zu records", s.n);
	} else {
		sel_shard_entries_from_scan(&s, e);
		rc = sel_shard_agreement(ds->sh->set, e, s.n, act, &st, deadline);
	}
	if (!rc)
		rc = sel_shard_apply(ds->lk->fd, &s, act, NULL, NULL);
	free(e);
	free(act);
	sel_scan_free(&s);
	return rc;
}

int ds_shard_open(struct disk_store *ds, const sel_store_config *cfg)
{
	const struct sel_store_ranks *r = cfg->ranks;
	if (!(ds->sh = calloc(1, sizeof *ds->sh)))
		return eos_fail(-ENOMEM, "disk store: out of memory");
	ds->sh->world = r->world;
	ds->sh->r = *r;
	uint64_t deadline = eos_now_ns() + (r->join_ns ? r->join_ns : SH_JOIN_NS);
	int rc = set_open(r, cfg->geometry, cfg->identity, true, ds->limit, &ds->sh->set);
	if (rc == 0) {
		/* Design 2.14: a record every host must hold is bounded by the
		 * host with the least room. */
		uint64_t agreed = sel_shard_disk_limit(ds->sh->set);
		if (agreed < ds->limit)
			ds->limit = agreed;
		rc = agree(ds, deadline);
	}
	if (rc == 0)
		rc = sel_shard_start(ds->sh->set);
	if (rc == 0)
		rc = sel_evq_watch(&ds->evq, sel_shard_wait_fd(ds->sh->set), "disk store");
	if (rc)
		return eos_fail(rc, "disk store: the rank links: %s", eos_errmsg());
	return 0;
}

/* ---- jobs ---------------------------------------------------------------------------- */

static uint64_t cookie_of(struct dstream *st) { return (uint64_t)(uintptr_t)st; }

/* The model calls the peers must have run before a job copies GPU ids. */
static uint64_t calls_before(struct disk_store *ds)
{
	return ds->sh->r.calls ? ds->sh->r.calls(ds->sh->r.ctx) : 0;
}

/* The links stopped: say so once; nothing outstanding ever completes. */
static void link_stopped(struct disk_store *ds)
{
	struct ds_shard *sh = ds->sh;
	if (sh->stopped)
		return;
	sh->stopped = true;
	char why[EOS_ERRMSG_MAX];
	if (!sel_shard_stopped(sh->set, why, sizeof why))
		snprintf(why, sizeof why, "the rank links stopped");
	snprintf(sh->why, sizeof sh->why, "%s", why);
	ds->c.stopped = true;
	sel_evq_wake(&ds->evq);
}

static int submit(struct disk_store *ds, const struct sel_shard_job *j, uint64_t cookie)
{
	int rc = sel_shard_submit(ds->sh->set, j, 0, cookie, NULL);
	if (rc == 0)
		ds->sh->out++;
	else if (rc == SEL_ESTOPPED)
		link_stopped(ds);
	return rc;
}

void ds_shard_put(struct disk_store *ds, struct dstream *st)
{
	sel_node_id id = st->nodes[0];
	struct sel_shard_rec rec = {.count = NODE(ds, id)->tail_pages};
	ds_node_desc(ds, id, &rec.d);
	bool row = NODE(ds, id)->flags & SEL_NODE_HAS_ROW;
	st->created_ns = eos_wall_ns();
	struct sel_shard_job j = {.op = SEL_SHARD_STORE,
				  .row = row,
				  .slot = row ? st->state_slot : SEL_SHARD_NO_SLOT,
				  .created_ns = st->created_ns,
				  .after = calls_before(ds),
				  .n_recs = 1,
				  .recs = &rec,
				  .n_pages = st->n_ids,
				  .pages = st->ids};
	int rc = submit(ds, &j, cookie_of(st));
	if (rc == 0) {
		st->link = DS_LINK_OUT;
		return;
	}
	/* Refused: the put fails now, without waiting for any peer. */
	if (!st->status)
		st->status = eos_fail(rc, "disk store: the rank links refused the store: %s",
				      eos_errmsg());
}

void ds_shard_fetch(struct disk_store *ds, struct dstream *st)
{
	struct sel_shard_rec *recs = calloc(st->n_nodes, sizeof *recs);
	int rc = recs ? 0 : eos_fail(-ENOMEM, "disk store: out of memory for a fetch job");
	for (uint32_t i = 0; recs && i < st->n_nodes; i++) {
		ds_node_desc(ds, st->nodes[i], &recs[i].d);
		recs[i].first = 0;
		recs[i].count = recs[i].d.tail;
	}
	/* The first node's pages the GPU already holds are not read. */
	if (recs && st->n_nodes) {
		uint32_t sum = 0;
		for (uint32_t i = 1; i < st->n_nodes; i++)
			sum += recs[i].count;
		uint32_t skip = recs[0].d.tail - (st->n_ids - sum);
		recs[0].first = skip;
		recs[0].count = recs[0].d.tail - skip;
	}
	if (rc == 0) {
		struct sel_shard_job j = {.op = SEL_SHARD_FETCH,
					  .row = true,
					  .slot = st->state_slot,
					  .after = calls_before(ds),
					  .n_recs = st->n_nodes,
					  .recs = recs,
					  .n_pages = st->n_ids,
					  .pages = st->ids};
		rc = submit(ds, &j, cookie_of(st));
	}
	free(recs);
	if (rc == 0)
		st->link = DS_LINK_OUT;
	else if (!st->status)
		st->status = eos_fail(rc, "disk store: the rank links refused the fetch: %s",
				      eos_errmsg());
}

static int file_submit(struct disk_store *ds, const sel_record_desc *d, uint32_t op)
{
	struct sel_shard_rec rec = {.d = *d};
	struct sel_shard_job j = {.op = op, .slot = SEL_SHARD_NO_SLOT, .n_recs = 1, .recs = &rec};
	return submit(ds, &j, 0);
}

void ds_shard_file(struct disk_store *ds, sel_node_id id, enum sel_disk_op op)
{
	struct ds_shard *sh = ds->sh;
	sel_record_desc d;
	ds_node_desc(ds, id, &d);
	uint32_t sop = op == SEL_DISK_TRUNCATE ? SEL_SHARD_TRUNCATE : SEL_SHARD_UNLINK;
	if (sh->stopped)
		return;
	if (!sh->n_pend && file_submit(ds, &d, sop) != -EAGAIN)
		return; /* sent, or the links stopped */
	if (sh->n_pend == sh->cap_pend) {
		size_t n = sh->cap_pend ? sh->cap_pend * 2 : 64;
		struct pend *p = realloc(sh->pend, n * sizeof *p);
		if (!p)
			abort(); /* a peer would keep a file the index dropped */
		sh->pend = p;
		sh->cap_pend = n;
	}
	sh->pend[sh->n_pend++] = (struct pend){d, sop};
}

static bool pend_flush(struct disk_store *ds)
{
	struct ds_shard *sh = ds->sh;
	size_t k = 0;
	while (k < sh->n_pend && !sh->stopped &&
	       file_submit(ds, &sh->pend[k].d, sh->pend[k].op) == 0)
		k++;
	if (sh->stopped)
		k = sh->n_pend;
	memmove(sh->pend, sh->pend + k, (sh->n_pend - k) * sizeof *sh->pend);
	sh->n_pend -= k;
	return k > 0;
}

/* ---- completions ------------------------------------------------------------------- */

/* A put whose two parts ended: combine them (DESIGN).  True while it waits
 * again (a cleanup, or this rank's unlink). */
static bool put_combine(struct disk_store *ds, struct dstream *st)
{
	sel_node_id id = st->nodes[0];
	if (!st->status && st->link_status) {
		/* This rank committed; the peers failed and were cleaned: remove
		 * this rank's file too before the failure is reported (the
		 * discard that holds the event runs after it). */
		struct dj *d = ds_job_new(ds, K_UNLINK, id, SEL_DISK_UNLINK);
		if (d)
			ds_disk_submit(ds, d);
		st->status = st->link_status;
		st->disk_failed = false;
		return false;
	}
	if (st->status && st->link_committed && st->link != DS_LINK_CLEANUP) {
		/* This rank failed and peers committed: remove theirs first. */
		sel_record_desc d;
		ds_node_desc(ds, id, &d);
		char text[EOS_ERRMSG_MAX];
		snprintf(text, sizeof text, "disk store: the store failed on rank 0 (%s)",
			 sel_strerror(st->status));
		int rc = sel_shard_cleanup(ds->sh->set, &d, st->link_committed, st->status, text,
					   cookie_of(st), NULL);
		if (rc == 0) {
			ds->sh->out++;
			st->link = DS_LINK_CLEANUP;
			return true;
		}
		if (rc == SEL_ESTOPPED) {
			link_stopped(ds);
			return true; /* never finished: a peer may still hold its ids */
		}
	}
	return false;
}

bool ds_shard_hold(struct disk_store *ds, struct dstream *st)
{
	if (st->link == DS_LINK_OUT || st->link == DS_LINK_CLEANUP) {
		st->local_done = true;
		return true;
	}
	if (st->link != DS_LINK_DONE)
		return false;
	st->link = DS_LINK_NONE;
	if (st->put)
		return put_combine(ds, st);
	if (!st->status && st->link_status) {
		st->status = st->link_status;
		/* A peer's file that fails verification or is gone makes the
		 * record unusable everywhere. */
		if (st->link_status == SEL_ECORRUPT || st->link_status == -ENOENT)
			ds_read_failed(ds, st->nodes[st->n_nodes - 1], st->link_status);
	}
	return false;
}

static void link_done(struct disk_store *ds, const struct sel_shard_done *d)
{
	struct dstream *st = (struct dstream *)(uintptr_t)d->cookie;
	ds->sh->out--;
	if (!st)
		return; /* a file job: a peer's failure leaves a file the next agreement drops */
	if (st->link == DS_LINK_CLEANUP) {
		st->link = DS_LINK_DONE; /* st->status is this rank's cause */
	} else {
		st->link = DS_LINK_DONE;
		st->link_status = d->status;
		st->link_committed = d->committed & ~d->cleaned;
		if (d->status)
			eos_fail(d->status, "%s", d->text);
	}
	if (st->local_done) {
		st->local_done = false;
		ds_stream_finish(ds, st);
	}
}

bool ds_shard_progress(struct disk_store *ds)
{
	struct ds_shard *sh = ds->sh;
	if (sh->stopped)
		return false;
	bool any = sh->n_pend && pend_flush(ds);
	struct sel_shard_done d[SH_POLL];
	int n;
	while ((n = sel_shard_poll(sh->set, d, SH_POLL)) > 0) {
		for (int i = 0; i < n; i++)
			link_done(ds, &d[i]);
		any = true;
	}
	if (n == SEL_ESTOPPED) {
		link_stopped(ds);
		any = true;
	}
	return any;
}

bool ds_shard_busy(const struct disk_store *ds)
{
	return !ds->sh->stopped && (ds->sh->out || ds->sh->n_pend);
}

int ds_shard_stopped(struct disk_store *ds)
{
	if (!ds->sh->stopped)
		return 0;
	return eos_fail(SEL_ESTOPPED, "disk store: %s", ds->sh->why);
}

int ds_shard_close(struct disk_store *ds, uint64_t deadline_ns)
{
	struct ds_shard *sh = ds->sh;
	if (sh->stopped)
		return eos_fail(SEL_ESTOPPED, "disk store: %s", sh->why);
	uint64_t dl = deadline_ns ? deadline_ns : eos_now_ns() + 60ull * 1000000000ull;
	int rc = sel_shard_close(sh->set, dl);
	if (rc)
		return eos_fail(SEL_ESTOPPED, "disk store: closing the rank links: %s",
				eos_errmsg());
	return 0;
}

void ds_shard_destroy(struct disk_store *ds, bool leak)
{
	struct ds_shard *sh = ds->sh;
	if (!sh)
		return;
	sel_shard_destroy(sh->set); /* copies every job: never references ours */
	free(sh->pend);
	if (!leak)
		free(sh);
	ds->sh = NULL;
}
