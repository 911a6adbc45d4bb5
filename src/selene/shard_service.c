/*
 * shard_service.c - a peer's record service (shard_service.h; design 2.14;
 * docs/multihost.md "For part B" item 2).
 *
 * DESIGN
 *
 * One thread per service does everything, in the order design 2.14 asks:
 * the record directory (locked, this rank's namespace), the intake pool,
 * the transfer set and the disk thread first -- so a rank that cannot
 * start them fails its join instead of failing after rank zero counted it
 * -- then the join, the scan with the agreed disk limit, the agreement and
 * its application, then sel_shard_peer_serve until rank zero closes.
 *
 * The jobs run on this rank's Staged parts: a STORE copies the record's
 * tail pages (and row) out of the model's planes into intake slots, window
 * by window (<= 64 page records), through the transfer set, and writes
 * each window as a SEL_DISK_WRITE_PART of the disk thread, the last part
 * with the job's creation time, so every rank's header agrees; a FETCH
 * reads each record's range window by window (the disk thread verifies
 * the header against the job's record, and every page's checksum) and
 * copies it in to the job's page ids and state slot; TRUNCATE and UNLINK
 * are disk thread jobs.  Each job runs to its end inside ops.submit, one
 * window at a time (deviation, docs/architecture.md: a peer's jobs are
 * serial; rank zero's queue and the link's buffers absorb the backlog and
 * the job timeout bounds it).  The serving thread is not the model's, so
 * its waiting delays nothing but the next job.
 *
 * A transfer or disk job that does not complete within the job wait
 * (SVC_WAIT_NS) leaves its slots in use: the service then stops with
 * SEL_ESTOPPED and keeps the pool, the transfer set and the disk thread
 * (design 2.14: never release memory a transfer may still use).
 */
#include "shard_service.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk.h"
#include "eos.h"
#include "internal.h"
#include "record.h"
#include "shard_link.h"
#include "store_common.h"
#include "store_pool.h"
#include "transfer.h"

#define SVC_JOIN_NS (120ull * 1000000000ull)
#define SVC_WAIT_NS (60ull * 1000000000ull)
#define SVC_ROW_IOV 64u

struct sel_shard_service {
	struct sel_shard_service_config cfg;
	uint8_t *hello;
	size_t hello_len;
	pthread_t th;
	atomic_bool done;
	int rc;
	char why[EOS_ERRMSG_MAX];
	bool leak; /* the transport could not drain: keep it */

	sel_record_ns ns;
	struct eos_dirlock lk;
	struct sel_store_pool *sp;
	sel_xfer *xfer;
	sel_disk *disk;
	sel_shard_peer *peer;
	uint32_t *slots;
	void **addr;
	struct iovec iov[SVC_ROW_IOV];
	bool stuck; /* a copy or disk job did not come back */
};

/* ---- one transfer or disk job, waited for --------------------------------- */

static int wait_on(int fd, uint64_t deadline)
{
	for (;;) {
		uint64_t now = eos_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		struct pollfd p = {fd, POLLIN, 0};
		int ms = (int)((deadline - now) / 1000000ull) + 1;
		int n = poll(&p, 1, ms > 1000 ? 1000 : ms);
		if (n > 0 || (n < 0 && errno != EINTR))
			return 0;
	}
}

static int run_xfer(struct sel_shard_service *sv, struct sel_xfer_job *x)
{
	int rc = sel_xfer_submit(sv->xfer, x);
	if (rc)
		return rc;
	uint64_t dl = eos_now_ns() + SVC_WAIT_NS;
	for (;;) {
		struct sel_xfer_job *d;
		if (sel_xfer_poll(sv->xfer, &d, 1) == 1)
			return d->status;
		if (wait_on(sel_xfer_fd(sv->xfer), dl) == -ETIMEDOUT) {
			sv->stuck = true;
			return eos_fail(SEL_ESTOPPED, "a copy did not complete in %" PRIu64 " s",
					(uint64_t)(SVC_WAIT_NS / 1000000000ull));
		}
	}
}

static int run_disk(struct sel_shard_service *sv, struct sel_disk_job *j)
{
	int rc;
	while ((rc = sel_disk_submit(sv->disk, j)) == -EAGAIN)
		(void)wait_on(sel_disk_fd(sv->disk), eos_now_ns() + 1000000ull);
	if (rc)
		return rc;
	uint64_t dl = eos_now_ns() + SVC_WAIT_NS;
	for (;;) {
		struct sel_disk_job *d;
		if (sel_disk_poll(sv->disk, &d, 1) == 1) {
			if (d->status)
				eos_fail(d->status, "%s", d->errmsg);
			return d->status;
		}
		if (wait_on(sel_disk_fd(sv->disk), dl) == -ETIMEDOUT) {
			sv->stuck = true;
			return eos_fail(SEL_ESTOPPED,
					"a disk job did not complete in %" PRIu64 " s",
					(uint64_t)(SVC_WAIT_NS / 1000000000ull));
		}
	}
}

/* ---- jobs ---------------------------------------------------------------------- */

/* Intake slots for count pages (and the row) and their addresses. */
static int window(struct sel_shard_service *sv, uint32_t count, bool row, uint32_t *n_slots,
		  uint32_t *n_iov)
{
	uint32_t nr = row ? sv->sp->row_slots : 0;
	*n_slots = count + nr;
	*n_iov = 0;
	if (*n_slots == 0)
		return 0;
	if (sel_slab_alloc(sv->sp->pool, *n_slots, SEL_SLAB_INTAKE, sv->slots) != 0)
		return eos_fail(-ENOSPC, "no intake slots for a window of %" PRIu32 " pages",
				count);
	int rc = sel_store_pool_map(sv->sp, 0, sv->slots, count, nr, 0, count, sv->addr, sv->iov,
				    SVC_ROW_IOV, n_iov);
	if (rc) {
		(void)sel_slab_free(sv->sp->pool, sv->slots, *n_slots);
		*n_slots = 0;
	}
	return rc;
}

static void window_free(struct sel_shard_service *sv, uint32_t n_slots)
{
	if (n_slots && !sv->stuck)
		(void)sel_slab_free(sv->sp->pool, sv->slots, n_slots);
}

static int do_store(struct sel_shard_service *sv, const struct sel_shard_job *j,
		    struct sel_shard_result *res)
{
	const sel_record_desc *d = &j->recs[0].d;
	uint32_t tail = d->tail, first = 0;
	int rc = 0;
	bool sent = false;
	do {
		uint32_t cnt = tail - first < SEL_WINDOW_PAGES ? tail - first : SEL_WINDOW_PAGES;
		bool end = first + cnt == tail, row = end && j->row;
		uint32_t ns, niov;
		if ((rc = window(sv, cnt, row, &ns, &niov)))
			break;
		struct sel_xfer_job x = {.dir = SEL_COPY_OUT,
					 .n_pages = cnt,
					 .pages = j->pages + first,
					 .page_slots = sv->slots,
					 .row = row,
					 .state_slot = row ? j->slot : 0,
					 .row_slots = sv->slots + cnt};
		rc = run_xfer(sv, &x);
		if (!rc) {
			struct sel_disk_job dj = {.op = SEL_DISK_WRITE_PART,
						  .rec = *d,
						  .row = j->row,
						  .first = first,
						  .count = cnt,
						  .part = (first == 0 ? SEL_DISK_PART_BEGIN : 0) |
							  (end ? SEL_DISK_PART_END : 0),
						  .pages = sv->addr,
						  .row_iov = row ? sv->iov : NULL,
						  .row_n = row ? niov : 0,
						  .created_ns = j->created_ns};
			sent = true;
			rc = run_disk(sv, &dj);
			res->bytes += dj.bytes;
			if (end && dj.committed)
				res->flags |= SEL_SHARD_R_COMMITTED;
		}
		window_free(sv, ns);
		first += cnt;
		if (end)
			break;
	} while (!rc);
	if (rc && sent && !(res->flags & SEL_SHARD_R_COMMITTED) && !sv->stuck) {
		char keep[EOS_ERRMSG_MAX];
		snprintf(keep, sizeof keep, "%s", eos_errmsg());
		struct sel_disk_job dj = {.op = SEL_DISK_DISCARD, .rec = *d};
		(void)run_disk(sv, &dj);
		eos_fail(rc, "%s", keep);
	}
	return rc;
}

/* One record's range [first, first + count) into dst, and the row last. */
static int fetch_rec(struct sel_shard_service *sv, const struct sel_shard_rec *x,
		     const uint32_t *dst, bool with_row, uint32_t slot, uint64_t *bytes)
{
	uint32_t at = 0;
	int rc = 0;
	do {
		uint32_t left = x->count - at;
		uint32_t cnt = left < SEL_WINDOW_PAGES ? left : SEL_WINDOW_PAGES;
		bool row = with_row && at + cnt == x->count;
		uint32_t ns, niov;
		if ((rc = window(sv, cnt, row, &ns, &niov)))
			return rc;
		/* A row alone reads the empty suffix at the tail (count 0 is
		 * "through the tail"). */
		struct sel_disk_job dj = {.op = SEL_DISK_READ,
					  .rec = x->d,
					  .row = row,
					  .first = cnt ? x->first + at : x->d.tail,
					  .count = cnt,
					  .pages = sv->addr,
					  .row_iov = row ? sv->iov : NULL,
					  .row_n = row ? niov : 0};
		rc = run_disk(sv, &dj);
		*bytes += dj.bytes;
		if (!rc) {
			struct sel_xfer_job xj = {.dir = SEL_COPY_IN,
						  .n_pages = cnt,
						  .pages = dst + at,
						  .page_slots = sv->slots,
						  .row = row,
						  .state_slot = row ? slot : 0,
						  .row_slots = sv->slots + cnt};
			rc = run_xfer(sv, &xj);
		}
		window_free(sv, ns);
		at += cnt;
	} while (!rc && at < x->count);
	return rc;
}

static int do_fetch(struct sel_shard_service *sv, const struct sel_shard_job *j,
		    struct sel_shard_result *res)
{
	uint32_t at = 0;
	int rc = 0;
	for (uint32_t i = 0; !rc && i < j->n_recs; i++) {
		bool last = i + 1 == j->n_recs;
		if (j->recs[i].count || (last && j->row))
			rc = fetch_rec(sv, &j->recs[i], j->pages + at, last && j->row, j->slot,
				       &res->bytes);
		at += j->recs[i].count;
	}
	return rc;
}

static int do_file(struct sel_shard_service *sv, const struct sel_shard_job *j,
		   struct sel_shard_result *res)
{
	struct sel_disk_job dj = {.op = j->op == SEL_SHARD_TRUNCATE ? SEL_DISK_TRUNCATE
								    : SEL_DISK_UNLINK,
				  .rec = j->recs[0].d};
	int rc = run_disk(sv, &dj);
	if (!rc && dj.had_row)
		res->flags |= SEL_SHARD_R_HAD_ROW;
	if (!rc && dj.existed)
		res->flags |= SEL_SHARD_R_EXISTED;
	return rc;
}

static int ops_submit(void *ctx, sel_shard_peer *p, const struct sel_shard_job *j)
{
	struct sel_shard_service *sv = ctx;
	struct sel_shard_result res = {.id = j->id};
	int rc;
	if (j->op == SEL_SHARD_STORE && sv->cfg.test_block_stores) {
		/* Tests: a peer that stops reading its link (bounded). */
		for (int i = 0; i < 1200; i++)
			(void)poll(NULL, 0, 100);
	}
	/* Its GPU ids are quiescent only once this rank's model executed the
	 * calls rank 0 mirrored before the job (design 2.14: the same ids). */
	int wrc = j->after && sv->cfg.wait_calls ? sv->cfg.wait_calls(sv->cfg.calls_ctx, j->after,
								      eos_now_ns() + SVC_WAIT_NS)
						 : 0;
	if (wrc)
		rc = eos_fail(wrc, "the model calls before job %" PRIu64 " did not run: %s", j->id,
			      sel_strerror(wrc));
	else if (sv->stuck)
		rc = eos_fail(SEL_ESTOPPED, "this rank's transport is stuck");
	else if (j->op == SEL_SHARD_STORE)
		rc = do_store(sv, j, &res);
	else if (j->op == SEL_SHARD_FETCH)
		rc = do_fetch(sv, j, &res);
	else
		rc = do_file(sv, j, &res);
	res.status = rc;
	if (rc)
		sel_shard_text(res.text, eos_errmsg());
	return sel_shard_peer_complete(p, &res);
}

static int ops_drain(void *ctx, sel_shard_peer *p, uint64_t deadline_ns)
{
	(void)p;
	(void)deadline_ns;
	struct sel_shard_service *sv = ctx;
	/* Every job ran to its end inside submit: nothing is in flight unless
	 * a copy or disk job never came back. */
	return sv->stuck ? eos_fail(SEL_ESTOPPED, "a copy or disk job is still in flight") : 0;
}

/* ---- startup -------------------------------------------------------------------- */

/* The record directory, the limit, the pool, the transfer set, the disk
 * thread: everything a job needs, before the join. */
static int open_transport(struct sel_shard_service *sv, uint64_t *limit)
{
	const struct sel_shard_service_config *c = &sv->cfg;
	const sel_geometry *g = c->geometry;
	int rc = sel_record_ns_init(&sv->ns, g, c->identity);
	if (rc)
		return rc;
	/* Design 2.14: this rank's namespace, so a host never restores a
	 * record another rank wrote. */
	sel_shard_rank_fingerprint(&g->rank[0], g->page_tokens, c->rank, c->world,
				   sv->ns.fingerprint);
	sel_record_dirname(sv->ns.identity, sv->ns.fingerprint, sv->ns.dirname);
	if ((rc = sel_record_dir_open(c->disk_dir, &sv->ns, &sv->lk)))
		return rc;
	*limit = c->disk_limit;
	if (!*limit) {
		uint64_t avail = 0;
		if ((rc = eos_fs_space(sv->lk.path, &avail, NULL)))
			return rc;
		*limit = avail / 10;
	}
	sel_store_config sc = {.geometry = g,
			       .max_active = c->max_active ? c->max_active : 4,
			       .backend = SEL_BACKEND_HOST};
	if ((rc = sel_store_pool_open(&sc, 0, "rank record service", &sv->sp)) ||
	    (rc = sel_store_pool_xfer_create(sv->sp, 8, &sv->xfer)))
		return rc;
	sv->slots = calloc(SEL_WINDOW_PAGES + sv->sp->row_slots, sizeof *sv->slots);
	sv->addr = calloc(SEL_WINDOW_PAGES, sizeof *sv->addr);
	if (!sv->slots || !sv->addr)
		return eos_fail(-ENOMEM, "out of memory");
	struct sel_disk_config dc = {.dirfd = sv->lk.fd,
				     .dir = sv->lk.path,
				     .ns = &sv->ns,
				     .direct = -1,
				     .fdatasync = c->fdatasync};
	return sel_disk_create(&dc, &sv->disk);
}

/* Scan with the agreed limit, agree, apply, report. */
static int agree(struct sel_shard_service *sv, uint64_t deadline)
{
	sel_scan s;
	struct sel_scan_opts o = {.max_file_bytes = sel_shard_peer_disk_limit(sv->peer),
				  .threads = 4};
	int rc = sel_record_scan(sv->lk.fd, &sv->ns, &o, &s);
	if (rc)
		return rc;
	struct sel_shard_entry *e = calloc(s.n ? s.n : 1, sizeof *e);
	uint8_t *act = malloc(s.n ? s.n : 1);
	if (!e || !act) {
		rc = eos_fail(-ENOMEM, "out of memory for a summary of %zu records", s.n);
	} else {
		sel_shard_entries_from_scan(&s, e);
		rc = sel_shard_peer_agreement(sv->peer, e, s.n, act, deadline);
	}
	if (!rc) {
		uint32_t del = 0, tr = 0;
		int arc = sel_shard_apply(sv->lk.fd, &s, act, &del, &tr);
		rc = sel_shard_peer_applied(sv->peer, arc, del, tr, arc ? eos_errmsg() : "",
					    deadline);
		if (!rc)
			rc = arc;
	}
	free(e);
	free(act);
	sel_scan_free(&s);
	return rc;
}

static int run(struct sel_shard_service *sv)
{
	const struct sel_shard_service_config *c = &sv->cfg;
	uint64_t deadline = eos_now_ns() + (c->join_ns ? c->join_ns : SVC_JOIN_NS);
	uint64_t limit = 0;
	int rc = 0;
	bool disk = c->disk_dir && *c->disk_dir;
	if (disk && (rc = open_transport(sv, &limit)))
		return eos_fail(rc, "rank %u: the record service cannot start: %s", c->rank,
				eos_errmsg());
	struct sel_shard_peer_config pc = {.world = c->world,
					   .rank = c->rank,
					   .set = {.disk = disk, .disk_limit = limit},
					   .rendezvous_fd = c->rendezvous_fd,
					   .sock_buf = c->sock_buf};
	memcpy(pc.identity, c->identity, SEL_IDENTITY_BYTES);
	const sel_geometry *g = c->geometry;
	sel_shard_rank_fingerprint(&g->rank[0], g->page_tokens, c->rank, c->world, pc.fingerprint);
	sel_shard_rank_fingerprint(&g->rank[0], g->page_tokens, 0, c->world,
				   pc.primary_fingerprint);
	if (disk)
		pc.lim = (struct sel_shard_limits){.pages = (uint32_t)g->rank[0].page_count,
						   .slots = (uint32_t)g->rank[0].row_count,
						   .sz = &sv->ns.layout.sz};
	if (c->test_join_delay_ms)
		(void)poll(NULL, 0, (int)c->test_join_delay_ms); /* tests: a late peer */
	if ((rc = sel_shard_peer_join(&pc, sv->hello, sv->hello_len, deadline, &sv->peer)))
		return eos_fail(rc, "rank %u: the record links: %s", c->rank, eos_errmsg());
	if (!disk)
		return 0; /* every rank has none: the join was all */
	if ((rc = agree(sv, deadline)))
		return eos_fail(rc, "rank %u: the agreement of the record directories: %s", c->rank,
				eos_errmsg());
	struct sel_shard_ops ops = {.ctx = sv, .submit = ops_submit, .drain = ops_drain};
	rc = sel_shard_peer_serve(sv->peer, &ops);
	if (rc == SEL_ESTOPPED)
		sv->leak = true;
	if (rc)
		return eos_fail(rc, "rank %u: the record service: %s", c->rank, eos_errmsg());
	return 0;
}

static void *thread_main(void *arg)
{
	struct sel_shard_service *sv = arg;
	eos_thread_name("shard-svc");
	sv->rc = run(sv);
	snprintf(sv->why, sizeof sv->why, "%s", sv->rc ? eos_errmsg() : "");
	atomic_store(&sv->done, true);
	return NULL;
}

int sel_shard_service_start(const struct sel_shard_service_config *cfg, const void *hello,
			    size_t len, sel_shard_service **out)
{
	*out = NULL;
	if (!cfg || !cfg->geometry || cfg->geometry->ranks != 1 || !hello || !len)
		return eos_fail(-EINVAL, "record service: a one-rank geometry and a HELLO needed");
	struct sel_shard_service *sv = calloc(1, sizeof *sv);
	if (!sv || !(sv->hello = malloc(len))) {
		free(sv);
		return eos_fail(-ENOMEM, "record service: out of memory");
	}
	sv->cfg = *cfg;
	memcpy(sv->hello, hello, len);
	sv->hello_len = len;
	sv->lk.fd = -1;
	if (pthread_create(&sv->th, NULL, thread_main, sv)) {
		free(sv->hello);
		free(sv);
		return eos_fail(-EAGAIN, "record service: cannot start its thread");
	}
	*out = sv;
	return 0;
}

bool sel_shard_service_done(sel_shard_service *sv) { return atomic_load(&sv->done); }

int sel_shard_service_wait(sel_shard_service *sv, char *why, size_t cap)
{
	pthread_join(sv->th, NULL);
	if (why && cap)
		snprintf(why, cap, "%s", sv->why);
	return sv->rc;
}

void sel_shard_service_free(sel_shard_service *sv)
{
	if (!sv)
		return;
	sel_shard_peer_destroy(sv->peer);
	sv->peer = NULL;
	uint64_t dl = eos_now_ns() + 10000000000ull;
	if ((sv->xfer && sel_xfer_close(sv->xfer, dl) != 0) ||
	    (sv->disk && sel_disk_close(sv->disk, dl) != 0))
		sv->stuck = true;
	if (sv->leak || sv->stuck) {
		/* A copy or disk job may still use the slots, the namespace and
		 * the directory (design 2.14): keep all of it, reachable. */
		sel_leak((void *[]){sv, sv->sp, sv->xfer, sv->disk, sv->slots, sv->addr}, 6);
		sel_store_pool_leak(sv->sp);
		return;
	}
	sel_xfer_destroy(sv->xfer);
	sel_disk_destroy(sv->disk);
	sel_store_pool_destroy(sv->sp);
	free(sv->slots);
	free(sv->addr);
	if (sv->lk.path)
		eos_dirlock_release(&sv->lk);
	sel_record_ns_free(&sv->ns);
	free(sv->hello);
	free(sv);
}
