/*
 * disk.c - the disk thread: one thread per record directory moving records
 * between files and caller-owned slot buffers through io_uring and O_DIRECT,
 * computing and verifying checksums on the way (design 2.5, the disk-thread
 * paragraph; 2.10 CPU and page cache; 2.12).
 *
 * DESIGN
 *
 * Jobs arrive over a bounded channel (a mutex-protected ring of pointers;
 * submit never waits) and leave through a bounded completion ring signalled
 * by an eventfd, as in the transfer module.  The two rings together never
 * hold more than queue_depth jobs: submit refuses with -EAGAIN once that
 * many are outstanding, so a completion always has room.
 *
 * A job runs in three phases.  Its prologue is synchronous: a write creates
 * the temporary file and preallocates it; a read opens the file, reads and
 * checks the header against the indexed record, and reads the checksums it
 * needs.  Its payload is then planned as segments, each one contiguous
 * memory range at one file offset: the page records, the row pieces, and
 * for a write the header with its checksum segment, which sits in the
 * job's own aligned bounce buffer and goes last (its checksums and row
 * checksum are known only once the payload is hashed).  A builder cuts the
 * segments, in order, into requests of at most chunk_bytes (8 MiB) and 128
 * iovecs over file-contiguous runs.  The epilogue is synchronous again:
 * verify the row, or commit (fdatasync, rename, directory fsync).
 *
 * One record rarely fills the ring (a 64 MiB record is 8 requests), so on
 * the io_uring path up to ACTIVE_JOBS jobs are in flight together: once
 * every active job has queued all its requests, the next job's prologue
 * runs while the device works on theirs, and its requests follow.  Up to
 * ring_depth (32) requests are in flight in all.  A job is admitted early
 * only if no active job has the same key, so the jobs of one record run in
 * submission order; jobs of different records may complete out of order.
 * A write hashes each page record (XXH3-64 of the whole record, padding
 * included) and feeds each row piece to the row hash just before the first
 * request that carries it is submitted; each request is submitted as soon
 * as it is built, so hashing overlaps the device.  A read verifies a page
 * record as soon as the last request touching it completes, and the row
 * once everything has landed.
 *
 * Every request is owned by the kernel from submission to its completion.
 * Whatever goes wrong -- a failed request, a short transfer at end of file,
 * a checksum mismatch, a refused submission -- the job's builder stops and
 * the engine keeps reaping until none of its requests is in flight; only
 * then is the job reported.  A submission the kernel refuses (after a few
 * retries of the transient -EAGAIN / -EBUSY) leaves prepared entries in the
 * submission queue that the kernel never saw: every active job that still
 * had requests to submit fails, all requests in flight are reaped, and the
 * ring is torn down and rebuilt, which discards the entries; if it cannot
 * be rebuilt the thread continues on the pread path.  A short transfer is
 * resumed from where it stopped.
 *
 * Windowed writes (SEL_DISK_WRITE_PART) keep one small entry per record
 * being written between its parts: the temporary's descriptor and name, the
 * next page record expected, and the header-plus-checksum buffer the parts
 * hash into.  A part's segments are its page records at their final
 * offsets; the ending part adds the row and the header segment and commits
 * in its epilogue like a whole write.  A failed part removes the temporary
 * in its epilogue and forgets the entry, so the parts after it fail fast.
 * Entries still open when the thread ends are discarded.
 *
 * The pread/pwrite path runs the same builder and completion logic one job
 * and one request at a time through eos_fileops(), so fault injection
 * reaches every payload byte there; on the io_uring path the hooks of
 * struct sel_disk_hooks stand in for the kernel.  Prologues and epilogues
 * go through eos_fileops() on both paths.
 *
 * Scratch memory (a bounce buffer and segment and plan arrays per active
 * job, and the requests) belongs to the thread and grows to the largest job
 * seen; a steady state allocates nothing per job.
 *
 * INVARIANTS
 *   1. queued + active + completed-unpolled == outstanding <= cap.
 *   2. A job is pushed to the completion ring only when none of its
 *      requests is in flight or waiting in the submission queue: no kernel
 *      reference to its buffers remains (after a refused submission, the
 *      ring is reset before anything else is submitted).
 *   3. Every submitted request is reaped exactly once; a request is busy
 *      from being prepared until reaped (or abandoned with a ring reset,
 *      when it was never submitted).  inflight (ring) is the sum of the
 *      active jobs' inflight; sq_n the sum of their unsubmitted.
 *   4. Two active jobs never have the same key.
 *   5. A read reports 0 only when the header matched the indexed record,
 *      every page it read matched its checksum and the row (if read)
 *      matched the row checksum.
 *   6. A windowed write's entry exists from its BEGIN part until its END
 *      part commits, a part fails or a DISCARD; while it exists its
 *      temporary file exists and its descriptor is open.  Parts run in
 *      page order (next == first), and a record's checksum segment is
 *      written only by its END part, after every page record was hashed.
 */
#define XXH_STATIC_LINKING_ONLY
#include "disk.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "internal.h"

#define IOV_PER_REQ 128
#define SUBMIT_RETRIES 8
#define ACTIVE_JOBS 4

enum seg_kind { SEG_PAGE = 0, SEG_ROW, SEG_HEAD };

struct seg {
	uint8_t *addr;
	uint64_t len;
	uint64_t off;
	uint32_t idx;     /* page index from the job's first page / row piece index */
	uint8_t kind;
	bool all_queued;  /* every byte is in some request */
	uint32_t pending; /* requests touching it that have not finished */
};

struct io_ctx;

struct req {
	struct iovec iov[IOV_PER_REQ];
	uint32_t iov_at, iov_n; /* remaining: iov[iov_at .. iov_n) */
	uint64_t off, left;     /* file offset and bytes of the remainder */
	uint32_t seg_lo, seg_hi;
	struct io_ctx *owner;
	bool busy;
};

/* A windowed write between its parts (invariant 6). */
struct wtemp {
	bool used;
	bool row;
	sel_key key;
	int fd;
	uint32_t next;        /* the next part's first page record */
	uint8_t *head;        /* header + checksum segment (aligned) */
	size_t head_cap;
	char tmp[SEL_RECORD_TMPNAME_MAX];
};

/* One active job: its state and its scratch. */
struct io_ctx {
	struct sel_disk_job *job;
	char name[SEL_RECORD_NAME_MAX];
	char tmp[SEL_RECORD_TMPNAME_MAX];
	bool write, active;
	int fd;
	int err;
	sel_record_span span;
	sel_record_header h;  /* read: the file's header */
	size_t si;            /* builder: next segment */
	uint64_t spos;        /* builder: bytes of it already queued */
	uint32_t inflight;    /* submitted, not reaped */
	uint32_t unsubmitted; /* prepared, not yet taken by the kernel */
	uint64_t bytes;
	uint8_t *cksum;       /* write: where page hashes go; read: expected, from first */
	uint8_t *head;        /* write: header + checksums (bounce, or the part's entry) */
	struct wtemp *wt;     /* WRITE_PART: the record's entry */
	XXH3_state_t row_state;
	/* scratch */
	uint8_t *bounce;
	size_t bounce_cap;
	struct seg *segs;
	size_t segs_cap, n_segs;
	struct sel_record_piece *plan;
	size_t plan_cap;
};

struct sel_disk {
	int dirfd;
	char *dir;
	const sel_record_ns *ns;
	uint32_t cap, ring_depth;
	uint64_t chunk;
	bool fdatasync;
	int nice;
	struct sel_disk_hooks hooks;

	bool uring;      /* atomic: the thread may switch it off */
	bool direct;     /* atomic: likewise */
	bool ring_ok;    /* ring initialised */
	bool ring_broken;
	struct io_uring ring;
	uint32_t inflight;    /* requests the kernel holds */
	struct req **sq;      /* [ring_depth] prepared, not yet submitted, oldest first */
	uint32_t sq_n;

	pthread_mutex_t mu;
	pthread_cond_t cv;      /* jobs queued, or closing */
	pthread_cond_t cv_exit; /* the thread ended */
	struct sel_disk_job **q;
	uint32_t q_head, q_n;
	struct sel_disk_job **done;
	uint32_t d_head, d_n;
	uint32_t outstanding;
	bool closing, exited, joined, detached, orphaned, started;
	bool abort; /* atomic */
	int efd;
	pthread_t th;

	/* Thread state. */
	struct io_ctx ctx[ACTIVE_JOBS];
	struct io_ctx *act[ACTIVE_JOBS]; /* active jobs, oldest first */
	uint32_t n_act;
	struct req *reqs;
	uint64_t nonce;
	struct wtemp **wt;    /* windowed writes between parts (entries never move:
				 active jobs point at them) */
	uint32_t n_wt;

	struct sel_disk_stats st; /* updated with atomics */
	char io_note[EOS_ERRMSG_MAX]; /* why not io_uring + O_DIRECT at startup */
};

#define STAT_ADD(d, field, v) __atomic_fetch_add(&(d)->st.field, (v), __ATOMIC_RELAXED)

static bool aborting(sel_disk *d) { return __atomic_load_n(&d->abort, __ATOMIC_ACQUIRE); }

/* Record the job's first failure with its message. */
__attribute__((format(printf, 3, 4))) static void io_fail(struct io_ctx *c, int rc,
							  const char *fmt, ...)
{
	if (c->err)
		return;
	c->err = rc;
	char *m = c->job->errmsg;
	size_t cap = sizeof c->job->errmsg;
	int n = snprintf(m, cap, "%s record '%s': ", c->write ? "write" : "read", c->name);
	if (n < 0 || (size_t)n >= cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m + n, cap - (size_t)n, fmt, ap);
	va_end(ap);
}

/* Fail with the calling thread's Eos message as the cause. */
static void io_fail_msg(struct io_ctx *c, int rc)
{
	if (c->err)
		return;
	c->err = rc;
	snprintf(c->job->errmsg, sizeof c->job->errmsg, "%s", eos_errmsg());
}

/* ---- Scratch ---------------------------------------------------------------- */

static int grow_bounce(struct io_ctx *c, size_t need)
{
	if (need <= c->bounce_cap)
		return 0;
	size_t n = c->bounce_cap ? c->bounce_cap : 131072;
	while (n < need)
		n *= 2;
	uint8_t *b = eos_aligned_alloc(EOS_ALIGN, n);
	if (!b)
		return -ENOMEM;
	eos_aligned_free(c->bounce);
	c->bounce = b;
	c->bounce_cap = n;
	return 0;
}

static bool add_seg(struct io_ctx *c, void *addr, uint64_t len, uint64_t off, uint8_t kind,
		    uint32_t idx)
{
	if (eos_grow((void **)&c->segs, &c->segs_cap, c->n_segs + 1, sizeof(*c->segs)) != 0)
		return false;
	c->segs[c->n_segs++] = (struct seg){.addr = addr, .len = len, .off = off, .kind = kind,
					    .idx = idx};
	return true;
}

/* ---- Engine ----------------------------------------------------------------- */

/* A segment's first byte is about to be queued. */
static void seg_start(sel_disk *d, struct io_ctx *c, struct seg *s)
{
	if (!c->write)
		return;
	if (s->kind == SEG_PAGE) {
		sel_put_u64(c->cksum + 8 * (size_t)s->idx, XXH3_64bits(s->addr, s->len));
	} else if (s->kind == SEG_ROW) {
		XXH3_64bits_update(&c->row_state, s->addr, c->plan[s->idx].data);
	} else {
		struct sel_disk_job *j = c->job;
		uint64_t row_ck = j->row ? XXH3_64bits_digest(&c->row_state) : 0;
		int rc = sel_record_encode(d->ns, &j->rec, row_ck, eos_wall_ns(), SEL_RECORD_VERSION,
					   c->head, c->span.header_bytes);
		if (rc < 0)
			io_fail(c, rc, "encoding the header: %s", eos_errmsg());
	}
}

/* Every request touching a segment has finished. */
static void seg_end(struct io_ctx *c, struct seg *s)
{
	if (c->write || c->err || s->kind != SEG_PAGE)
		return;
	uint64_t want = sel_get_u64(c->cksum + 8 * (size_t)s->idx);
	int rc = sel_record_check_page(s->addr, s->len, want, c->job->first + s->idx);
	if (rc)
		io_fail(c, rc, "%s", eos_errmsg());
}

static void req_finish(struct req *r)
{
	struct io_ctx *c = r->owner;
	for (uint32_t i = r->seg_lo; i <= r->seg_hi; i++) {
		struct seg *s = &c->segs[i];
		if (--s->pending == 0 && s->all_queued)
			seg_end(c, s);
	}
	r->busy = false;
}

static bool builder_done(const struct io_ctx *c) { return c->err || c->si >= c->n_segs; }

/* Fill r with c's next chunk: file-contiguous segment bytes, at most chunk
 * bytes and IOV_PER_REQ pieces. */
static void build_chunk(sel_disk *d, struct io_ctx *c, struct req *r)
{
	r->owner = c;
	r->iov_at = r->iov_n = 0;
	r->left = 0;
	r->off = c->segs[c->si].off + c->spos;
	r->seg_lo = r->seg_hi = (uint32_t)c->si;
	while (c->si < c->n_segs && r->iov_n < IOV_PER_REQ && r->left < d->chunk) {
		struct seg *s = &c->segs[c->si];
		if (r->iov_n > 0 && s->off + c->spos != r->off + r->left)
			break;
		if (c->spos == 0)
			seg_start(d, c, s);
		uint64_t take = s->len - c->spos;
		if (take > d->chunk - r->left)
			take = d->chunk - r->left;
		r->iov[r->iov_n].iov_base = s->addr + c->spos;
		r->iov[r->iov_n].iov_len = take;
		r->iov_n++;
		r->left += take;
		s->pending++;
		r->seg_hi = (uint32_t)c->si;
		c->spos += take;
		if (c->spos == s->len) {
			s->all_queued = true;
			c->si++;
			c->spos = 0;
		}
	}
	r->busy = true;
}

/* Account res bytes (or a failure) of r: 1 done, 0 more to do, -1 failed. */
static int req_progress(struct req *r, int res)
{
	struct io_ctx *c = r->owner;
	if (res < 0) {
		io_fail(c, res, "%s of %" PRIu64 " bytes at offset %" PRIu64 ": %s",
			c->write ? "write" : "read", r->left, r->off, strerror(-res));
		return -1;
	}
	if (res == 0) {
		if (c->write)
			io_fail(c, -EIO, "write at offset %" PRIu64 " made no progress", r->off);
		else
			io_fail(c, SEL_ECORRUPT, "the file ends at %" PRIu64 ", inside what its header "
				"describes", r->off);
		return -1;
	}
	uint64_t n = (uint64_t)res;
	if (n > r->left)
		n = r->left;
	c->bytes += n;
	r->off += n;
	r->left -= n;
	while (n) {
		struct iovec *v = &r->iov[r->iov_at];
		if (n >= v->iov_len) {
			n -= v->iov_len;
			r->iov_at++;
		} else {
			v->iov_base = (uint8_t *)v->iov_base + n;
			v->iov_len -= n;
			n = 0;
		}
	}
	return r->left == 0 ? 1 : 0;
}

/* Prepare r's (remaining) transfer in a submission entry. */
static bool prep(sel_disk *d, struct req *r)
{
	struct io_ctx *c = r->owner;
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
	if (!sqe)
		return false;
	if (c->write)
		io_uring_prep_writev(sqe, c->fd, r->iov + r->iov_at, r->iov_n - r->iov_at, r->off);
	else
		io_uring_prep_readv(sqe, c->fd, r->iov + r->iov_at, r->iov_n - r->iov_at, r->off);
	io_uring_sqe_set_data(sqe, r);
	d->sq[d->sq_n++] = r;
	c->unsubmitted++;
	return true;
}

/* Reap completions: wait for one first when wait is set. */
static void reap(sel_disk *d, bool wait)
{
	struct io_uring_cqe *cqe;
	if (wait) {
		int rc;
		/* A wait that fails otherwise than by a signal would leave us
		 * unable to prove the buffers quiescent: keep trying (close
		 * then times out and the buffers are leaked, never reused). */
		while ((rc = io_uring_wait_cqe(&d->ring, &cqe)) < 0)
			if (rc != -EINTR && rc != -EAGAIN)
				eos_sleep_ns(1000000);
	}
	while (io_uring_peek_cqe(&d->ring, &cqe) == 0) {
		struct req *r = io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		io_uring_cqe_seen(&d->ring, cqe);
		struct io_ctx *c = r->owner;
		c->inflight--;
		d->inflight--;
		if (d->hooks.complete)
			res = d->hooks.complete(d->hooks.ctx, res);
		int p = req_progress(r, res);
		if (p == 0 && !c->err && !d->ring_broken) {
			if (prep(d, r))
				continue;
			io_fail(c, -EBUSY, "no submission entry to resume a short transfer");
		}
		req_finish(r);
	}
}

/* Hand every prepared entry to the kernel.  Transient refusals are retried
 * (reaping in between); a lasting one breaks the ring: every active job
 * with requests left to submit fails, and nothing more is submitted until
 * the ring is reset. */
static void submit_pending(sel_disk *d)
{
	int tries = 0;
	while (d->sq_n && !d->ring_broken) {
		int rc = d->hooks.submit ? d->hooks.submit(d->hooks.ctx, &d->ring)
					 : io_uring_submit(&d->ring);
		if (rc > 0) {
			uint32_t n = (uint32_t)rc > d->sq_n ? d->sq_n : (uint32_t)rc;
			for (uint32_t i = 0; i < n; i++) {
				struct io_ctx *c = d->sq[i]->owner;
				c->unsubmitted--;
				c->inflight++;
			}
			memmove(d->sq, d->sq + n, (d->sq_n - n) * sizeof(*d->sq));
			d->sq_n -= n;
			d->inflight += n;
			continue;
		}
		if (rc == 0)
			rc = -EAGAIN;
		if ((rc == -EAGAIN || rc == -EBUSY || rc == -EINTR) && tries++ < SUBMIT_RETRIES) {
			STAT_ADD(d, submit_retries, 1);
			if (d->inflight)
				reap(d, true);
			else
				eos_sleep_ns(1000000);
			continue;
		}
		d->ring_broken = true;
		for (uint32_t i = 0; i < d->n_act; i++) {
			struct io_ctx *c = d->act[i];
			if (c->unsubmitted || !builder_done(c))
				io_fail(c, rc, "io_uring submission refused: %s", strerror(-rc));
		}
	}
}

static struct req *free_req(sel_disk *d)
{
	for (uint32_t i = 0; i < d->ring_depth; i++)
		if (!d->reqs[i].busy)
			return &d->reqs[i];
	return NULL;
}

/* Whether job c has nothing left with the kernel or in the queue. */
static bool quiescent(const sel_disk *d, const struct io_ctx *c)
{
	if (c->inflight)
		return false;
	return c->unsubmitted == 0 || d->ring_broken; /* abandoned with the ring */
}

/* One step of the ring: build and submit what fits; the caller reaps. */
static void uring_fill(sel_disk *d)
{
	bool full = false;
	for (uint32_t i = 0; i < d->n_act && !full && !d->ring_broken; i++) {
		struct io_ctx *c = d->act[i];
		while (!builder_done(c)) {
			if (aborting(d)) {
				io_fail(c, SEL_ESTOPPED, "the disk thread is stopping");
				break;
			}
			struct req *r = free_req(d);
			if (!r || io_uring_sq_space_left(&d->ring) == 0) {
				full = true;
				break;
			}
			build_chunk(d, c, r);
			if (!prep(d, r)) {
				io_fail(c, -EBUSY, "no submission entry");
				r->busy = false;
				break;
			}
			/* Hand each request over at once, so the device works
			 * while the next chunk is hashed. */
			submit_pending(d);
			if (d->ring_broken)
				break;
		}
	}
	if (d->sq_n && !d->ring_broken)
		submit_pending(d);
}

/* The pread/pwrite path: run job c's requests one after another. */
static void run_sync(sel_disk *d, struct io_ctx *c)
{
	const struct eos_fileops *ops = eos_fileops();
	struct req *r = &d->reqs[0];
	while (!builder_done(c)) {
		if (aborting(d)) {
			io_fail(c, SEL_ESTOPPED, "the disk thread is stopping");
			break;
		}
		build_chunk(d, c, r);
		int p = 0;
		while (p == 0) {
			struct iovec *v = &r->iov[r->iov_at];
			ssize_t n = c->write ? ops->pwrite(c->fd, v->iov_base, v->iov_len, (off_t)r->off)
					     : ops->pread(c->fd, v->iov_base, v->iov_len, (off_t)r->off);
			if (n < 0 && errno == EINTR)
				continue;
			p = req_progress(r, n < 0 ? -errno : (int)n);
		}
		req_finish(r);
	}
}

/* After a refused submission, once nothing is in flight: drop the ring
 * (and with it the entries the kernel never took) and build a new one, or
 * continue without. */
static void ring_reset(sel_disk *d)
{
	for (uint32_t i = 0; i < d->sq_n; i++)
		d->sq[i]->busy = false;
	d->sq_n = 0;
	d->ring_broken = false;
	STAT_ADD(d, ring_resets, 1);
	io_uring_queue_exit(&d->ring);
	d->ring_ok = false;
	if (io_uring_queue_init(d->ring_depth, &d->ring, 0) == 0)
		d->ring_ok = true;
	else
		__atomic_store_n(&d->uring, false, __ATOMIC_RELAXED);
}

/* ---- Jobs ------------------------------------------------------------------- */

static void note_direct(sel_disk *d, bool direct)
{
	if (!direct && __atomic_load_n(&d->direct, __ATOMIC_RELAXED)) {
		__atomic_store_n(&d->direct, false, __ATOMIC_RELAXED);
		STAT_ADD(d, direct_fallbacks, 1);
	}
}

/* The file a job names, or NULL when it names none. */
static const struct eos_file_id *want_id(const struct sel_disk_job *j)
{
	return j->want.dev || j->want.ino ? &j->want : NULL;
}

/* The file behind fd, for the job's completion (a commit's `file`). */
static void note_file(struct sel_disk_job *j, int fd)
{
	struct stat st;
	if (fstat(fd, &st) == 0)
		j->file = (struct eos_file_id){(uint64_t)st.st_dev, (uint64_t)st.st_ino};
}

static uint64_t next_nonce(sel_disk *d)
{
	uint64_t x = d->nonce;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return d->nonce = x;
}

/* Plan the row pieces of c's job and add their segments. */
static int add_row_segs(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (eos_grow((void **)&c->plan, &c->plan_cap, j->row_n ? j->row_n : 1, sizeof(*c->plan)) != 0)
		return -ENOMEM;
	int rc = sel_record_row_plan(&d->ns->layout, j->rec.flags, j->row_iov, j->row_n, c->plan);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < j->row_n; i++)
		if (!add_seg(c, c->plan[i].addr, c->plan[i].len, c->span.row_off + c->plan[i].off,
			     SEG_ROW, i))
			return -ENOMEM;
	return 0;
}

/* ---- Windowed writes ---------------------------------------------------------- */

static struct wtemp *wt_find(sel_disk *d, const sel_key *key)
{
	for (uint32_t i = 0; i < d->n_wt; i++)
		if (d->wt[i]->used && sel_key_eq(&d->wt[i]->key, key))
			return d->wt[i];
	return NULL;
}

static struct wtemp *wt_new(sel_disk *d, size_t head_bytes)
{
	struct wtemp *w = NULL;
	for (uint32_t i = 0; i < d->n_wt && !w; i++)
		if (!d->wt[i]->used)
			w = d->wt[i];
	if (!w) {
		struct wtemp **n = realloc(d->wt, (d->n_wt + 1) * sizeof(*n));
		if (!n)
			return NULL;
		d->wt = n;
		if (!(w = calloc(1, sizeof(*w))))
			return NULL;
		d->wt[d->n_wt++] = w;
	}
	if (head_bytes > w->head_cap) {
		uint8_t *b = eos_aligned_alloc(EOS_ALIGN, head_bytes);
		if (!b)
			return NULL;
		eos_aligned_free(w->head);
		w->head = b;
		w->head_cap = head_bytes;
	}
	w->used = true;
	w->fd = -1;
	w->next = 0;
	w->tmp[0] = '\0';
	return w;
}

/* Forget w, removing its temporary if it has one.  Returns the removal's
 * error (the file then stays for the next scan), else 0. */
static int wt_discard(sel_disk *d, struct wtemp *w)
{
	int rc = 0;
	if (w->fd >= 0)
		rc = sel_record_discard(d->dirfd, w->fd, w->tmp);
	w->fd = -1;
	w->used = false;
	return rc;
}

static void write_begin(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	const sel_record_span *s = &c->span;
	bool part = j->op == SEL_DISK_WRITE_PART;
	bool begin = !part || (j->part & SEL_DISK_PART_BEGIN);
	bool end = !part || (j->part & SEL_DISK_PART_END);
	uint32_t first = part ? j->first : 0, n = part ? j->count : j->rec.tail;
	size_t head_bytes = (size_t)s->header_bytes + s->cksum_bytes;
	int rc;

	if (part) {
		struct wtemp *w = wt_find(d, &j->rec.key);
		if (begin && w && wt_discard(d, w) != 0) {
			io_fail(c, -EIO, "a stale temporary of this record: %s", eos_errmsg());
			return;
		}
		if (!begin) {
			if (!w) {
				io_fail(c, -ENOENT, "no temporary for the part at page record %" PRIu32
					" (an earlier part failed or none began)", first);
				return;
			}
			c->wt = w; /* from here a failure discards it */
			if (w->next != first || w->row != j->row) {
				io_fail(c, -EINVAL, "part at page record %" PRIu32 "%s, the write is at %"
					PRIu32, first, w->row != j->row ? " changes the row flag" : "",
					w->next);
				return;
			}
		} else {
			if (!(w = wt_new(d, head_bytes)))
				goto nomem;
			w->key = j->rec.key;
			w->row = j->row;
			c->wt = w;
		}
		c->head = w->head;
	} else {
		if (grow_bounce(c, head_bytes) != 0) {
			io_fail(c, -ENOMEM, "out of memory for a %zu-byte header", head_bytes);
			return;
		}
		c->head = c->bounce;
	}
	c->cksum = c->head + s->header_bytes;
	if (begin)
		memset(c->cksum, 0, s->cksum_bytes);
	for (uint32_t i = 0; i < n; i++)
		if (!add_seg(c, j->pages[i], s->page_stride,
			     s->page_off + (uint64_t)(first + i) * s->page_stride, SEG_PAGE, first + i))
			goto nomem;
	if (end && j->row && (rc = add_row_segs(d, c)) != 0) {
		if (rc == -ENOMEM)
			goto nomem;
		io_fail(c, rc, "%s", eos_errmsg());
		return;
	}
	if (end && !add_seg(c, c->head, head_bytes, 0, SEG_HEAD, 0))
		goto nomem;
	XXH3_64bits_reset(&c->row_state);

	if (!begin) {
		c->fd = c->wt->fd;
		return;
	}
	bool direct = __atomic_load_n(&d->direct, __ATOMIC_RELAXED);
	c->fd = sel_record_tmp_create(d->dirfd, c->name, j->row ? s->row_end : s->row_off,
				      next_nonce(d), &direct, part ? c->wt->tmp : c->tmp);
	note_direct(d, direct);
	if (c->fd < 0) {
		io_fail_msg(c, c->fd);
		c->fd = -1;
	} else if (part) {
		c->wt->fd = c->fd;
	}
	return;
nomem:
	io_fail(c, -ENOMEM, "out of memory planning %" PRIu32 " page records", n);
}

static void write_end(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (j->op == SEL_DISK_WRITE_PART) {
		struct wtemp *w = c->wt;
		c->fd = -1; /* the entry owns the descriptor */
		if (!w)
			return;
		if (c->err) {
			if (wt_discard(d, w) != 0) {
				size_t l = strlen(j->errmsg);
				snprintf(j->errmsg + l, sizeof j->errmsg - l, "; and %s", eos_errmsg());
			}
			return;
		}
		if (!(j->part & SEL_DISK_PART_END)) {
			w->next = j->first + j->count;
			return;
		}
		note_file(j, w->fd);
		int rc = sel_record_commit(d->dirfd, w->fd, w->tmp, c->name,
					   d->fdatasync ? SEL_COMMIT_DATASYNC : 0, &j->committed);
		w->fd = -1; /* closed by the commit in every case */
		w->used = false;
		if (rc)
			io_fail_msg(c, rc);
		return;
	}
	if (c->fd < 0)
		return;
	if (c->err) {
		if (sel_record_discard(d->dirfd, c->fd, c->tmp) != 0) {
			size_t l = strlen(j->errmsg);
			snprintf(j->errmsg + l, sizeof j->errmsg - l, "; and %s", eos_errmsg());
		}
		c->fd = -1;
		return;
	}
	note_file(j, c->fd);
	int rc = sel_record_commit(d->dirfd, c->fd, c->tmp, c->name,
				   d->fdatasync ? SEL_COMMIT_DATASYNC : 0, &j->committed);
	c->fd = -1;
	if (rc)
		io_fail_msg(c, rc);
}

/* pread exactly len bytes at off into buf (a short read is a short file). */
static int read_exact(struct io_ctx *c, void *buf, uint64_t len, uint64_t off, const char *what)
{
	const struct eos_fileops *ops = eos_fileops();
	uint8_t *p = buf;
	while (len) {
		ssize_t n = ops->pread(c->fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			io_fail(c, -errno, "reading the %s: %s", what, strerror(errno));
			return c->err;
		}
		if (n == 0) {
			io_fail(c, SEL_ECORRUPT, "the file ends inside its %s", what);
			return c->err;
		}
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static void read_begin(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	const sel_record_span *s = &c->span;
	struct stat st;
	int rc;

	uint32_t n = j->count ? j->count : j->rec.tail - j->first;
	uint64_t ck_lo = (s->cksum_off + 8 * (uint64_t)j->first) / EOS_ALIGN * EOS_ALIGN;
	uint64_t ck_hi = eos_round_up(s->cksum_off + 8 * (uint64_t)(j->first + n), EOS_ALIGN);
	if (grow_bounce(c, (size_t)s->header_bytes + (ck_hi - ck_lo) + EOS_ALIGN) != 0) {
		io_fail(c, -ENOMEM, "out of memory for the header and checksums");
		return;
	}
	bool direct = __atomic_load_n(&d->direct, __ATOMIC_RELAXED);
	c->fd = sel_record_open(d->dirfd, c->name, &direct, want_id(j), &st);
	if (c->fd >= 0)
		note_direct(d, direct);
	if (c->fd < 0) {
		io_fail(c, c->fd, "%s", eos_errmsg());
		c->fd = -1;
		return;
	}

	/* The header first: it must describe exactly the indexed record
	 * before a single payload byte is read. */
	if (read_exact(c, c->bounce, SEL_RECORD_HEADER_MIN, 0, "header") != 0)
		return;
	int hb = sel_record_header_bytes(c->bounce, SEL_RECORD_HEADER_MIN);
	if (hb < 0) {
		io_fail(c, SEL_ECORRUPT, "%s", eos_errmsg());
		return;
	}
	if ((uint32_t)hb != s->header_bytes) {
		io_fail(c, SEL_ECORRUPT, "the header is %d bytes, the indexed record's %" PRIu32, hb,
			s->header_bytes);
		return;
	}
	if (hb > (int)SEL_RECORD_HEADER_MIN &&
	    read_exact(c, c->bounce + SEL_RECORD_HEADER_MIN, (uint64_t)hb - SEL_RECORD_HEADER_MIN,
		       SEL_RECORD_HEADER_MIN, "header") != 0)
		return;
	if ((rc = sel_record_decode(c->bounce, (size_t)hb, d->ns, &c->h)) != 0 ||
	    (rc = sel_record_header_matches(&c->h, &j->rec, s)) != 0) {
		io_fail(c, SEL_ECORRUPT, "%s", eos_errmsg());
		return;
	}
	if ((rc = sel_record_check_length(s, (uint64_t)st.st_size, &j->had_row)) != 0) {
		io_fail(c, rc, "%s", eos_errmsg());
		return;
	}
	if (j->row && !j->had_row) {
		io_fail(c, SEL_ECORRUPT, "the row was asked for, but the file holds pages only");
		return;
	}
	j->bytes += (uint64_t)hb;

	if (n) {
		uint8_t *ck = c->bounce + s->header_bytes;
		if (read_exact(c, ck, ck_hi - ck_lo, ck_lo, "checksum segment") != 0)
			return;
		j->bytes += ck_hi - ck_lo;
		c->cksum = ck + (s->cksum_off + 8 * (uint64_t)j->first - ck_lo);
	}
	for (uint32_t i = 0; i < n; i++)
		if (!add_seg(c, j->pages[i], s->page_stride,
			     s->page_off + (uint64_t)(j->first + i) * s->page_stride, SEG_PAGE, i)) {
			io_fail(c, -ENOMEM, "out of memory planning %" PRIu32 " page records", n);
			return;
		}
	if (j->row && (rc = add_row_segs(d, c)) != 0)
		io_fail(c, rc, "%s", rc == -ENOMEM ? "out of memory" : eos_errmsg());
}

static void read_end(struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (c->err || !j->row)
		return;
	/* row_iov holds the pieces' unpadded lengths (plan[i].data). */
	int rc = sel_record_check_row(j->row_iov, j->row_n, c->h.row_checksum);
	if (rc)
		io_fail(c, rc, "%s", eos_errmsg());
}

/* Start job j in context c: the synchronous prologue.  Returns true when
 * the job has payload I/O to run; otherwise it is finished (job_end). */
static bool job_begin(sel_disk *d, struct io_ctx *c, struct sel_disk_job *j)
{
	c->job = j;
	c->write = j->op == SEL_DISK_WRITE || j->op == SEL_DISK_WRITE_PART;
	c->wt = NULL;
	c->head = NULL;
	c->fd = -1;
	c->err = 0;
	c->si = 0;
	c->spos = 0;
	c->inflight = c->unsubmitted = 0;
	c->bytes = 0;
	c->n_segs = 0;
	c->cksum = NULL;
	sel_record_name(&j->rec.key, c->name);
	int rc = sel_record_span_of(&d->ns->layout.sz, &j->rec, &c->span);
	if (rc) {
		io_fail_msg(c, rc);
		return false;
	}
	switch (j->op) {
	case SEL_DISK_WRITE:
	case SEL_DISK_WRITE_PART:
		write_begin(d, c);
		break;
	case SEL_DISK_READ:
		read_begin(d, c);
		break;
	case SEL_DISK_TRUNCATE:
		if ((rc = sel_record_truncate(d->dirfd, c->name, &c->span, want_id(j), &j->had_row)) != 0)
			io_fail_msg(c, rc);
		return false;
	case SEL_DISK_UNLINK:
		if ((rc = sel_record_unlink(d->dirfd, c->name, &j->existed)) != 0)
			io_fail_msg(c, rc);
		return false;
	case SEL_DISK_DISCARD: {
		struct wtemp *w = wt_find(d, &j->rec.key);
		j->existed = w != NULL;
		if (w && wt_discard(d, w) != 0)
			io_fail_msg(c, -EIO);
		return false;
	}
	case SEL_DISK_OPS:
		break;
	}
	return !c->err;
}

/* The epilogue: commit or verify, close, account.  c's I/O is quiescent. */
static void job_end(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (c->write)
		write_end(d, c);
	else if (j->op == SEL_DISK_READ)
		read_end(c);
	if (c->fd >= 0)
		eos_fileops()->close(c->fd);
	c->fd = -1;
	if (c->write)
		STAT_ADD(d, bytes_written, c->bytes);
	else if (j->op == SEL_DISK_READ)
		STAT_ADD(d, bytes_read, c->bytes);
	j->bytes += c->bytes;
	j->status = c->err;
	STAT_ADD(d, jobs[j->op], 1);
	if (c->err) {
		STAT_ADD(d, failed, 1);
		if (c->err == SEL_ECORRUPT && j->op == SEL_DISK_READ)
			STAT_ADD(d, corrupt, 1);
	}
}

/* ---- Thread and channel ------------------------------------------------------ */

static void disk_free(sel_disk *d)
{
	if (d->ring_ok)
		io_uring_queue_exit(&d->ring);
	if (d->efd >= 0)
		close(d->efd);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->cv);
	pthread_cond_destroy(&d->cv_exit);
	free(d->q);
	free(d->done);
	free(d->dir);
	for (int i = 0; i < ACTIVE_JOBS; i++) {
		eos_aligned_free(d->ctx[i].bounce);
		free(d->ctx[i].segs);
		free(d->ctx[i].plan);
	}
	for (uint32_t i = 0; i < d->n_wt; i++) {
		eos_aligned_free(d->wt[i]->head);
		free(d->wt[i]);
	}
	free(d->wt);
	free(d->sq);
	free(d->reqs);
	free(d);
}


static void signal_fd(sel_disk *d)
{
	uint64_t one = 1;
	ssize_t w = write(d->efd, &one, sizeof one);
	(void)w; /* EAGAIN: the counter is already non-zero */
}

/* Hand a finished job back (lock held). */
static void complete_locked(sel_disk *d, struct sel_disk_job *j)
{
	j->done_ns = eos_now_ns();
	d->done[(d->d_head + d->d_n) % d->cap] = j;
	d->d_n++;
	signal_fd(d);
}

/* May the job at the head of the queue start now (lock held)? */
static bool can_admit(sel_disk *d)
{
	if (d->q_n == 0 || d->n_act == ACTIVE_JOBS)
		return false;
	if (d->n_act == 0)
		return true;
	if (!__atomic_load_n(&d->uring, __ATOMIC_RELAXED) || d->ring_broken)
		return false;
	const struct sel_disk_job *j = d->q[d->q_head];
	for (uint32_t i = 0; i < d->n_act; i++) {
		if (!builder_done(d->act[i]) || sel_key_eq(&d->act[i]->job->rec.key, &j->rec.key))
			return false;
	}
	return true;
}

static struct io_ctx *free_ctx(sel_disk *d)
{
	for (int i = 0; i < ACTIVE_JOBS; i++)
		if (!d->ctx[i].active)
			return &d->ctx[i];
	return NULL;
}

static void *disk_main(void *arg)
{
	sel_disk *d = arg;
	eos_thread_name("sel-disk");
	eos_thread_lower_priority(d->nice); /* best effort */
	pthread_mutex_lock(&d->mu);
	for (;;) {
		/* Admit: start the next jobs' prologues while the device works. */
		while (can_admit(d)) {
			struct sel_disk_job *j = d->q[d->q_head];
			d->q_head = (d->q_head + 1) % d->cap;
			d->q_n--;
			pthread_mutex_unlock(&d->mu);
			struct io_ctx *c = free_ctx(d);
			bool io = false;
			if (aborting(d)) {
				j->status = SEL_ESTOPPED;
				snprintf(j->errmsg, sizeof j->errmsg, "the disk thread stopped before this job");
			} else if ((io = job_begin(d, c, j))) {
				c->active = true;
				if (d->n_act)
					STAT_ADD(d, overlapped, 1);
				d->act[d->n_act++] = c;
			} else {
				job_end(d, c);
			}
			pthread_mutex_lock(&d->mu);
			if (!io)
				complete_locked(d, j);
		}
		if (d->n_act == 0) {
			if (d->q_n)
				continue;
			if (d->closing)
				break;
			pthread_cond_wait(&d->cv, &d->mu);
			continue;
		}
		pthread_mutex_unlock(&d->mu);

		/* Run the active jobs' I/O.  On the ring, wait for a completion
		 * only when no further job could start meanwhile. */
		if (__atomic_load_n(&d->uring, __ATOMIC_RELAXED)) {
			uring_fill(d);
			pthread_mutex_lock(&d->mu);
			bool wait = !can_admit(d);
			pthread_mutex_unlock(&d->mu);
			if (d->inflight)
				reap(d, wait);
		} else {
			run_sync(d, d->act[0]);
		}

		/* Finish what is quiescent; reset a broken ring once idle. */
		struct sel_disk_job *fin[ACTIVE_JOBS];
		uint32_t nf = 0, keep = 0;
		for (uint32_t i = 0; i < d->n_act; i++) {
			struct io_ctx *c = d->act[i];
			if (builder_done(c) && quiescent(d, c)) {
				job_end(d, c);
				c->active = false;
				fin[nf++] = c->job;
			} else {
				d->act[keep++] = c;
			}
		}
		d->n_act = keep;
		if (d->ring_broken && d->inflight == 0) {
			for (uint32_t i = 0; i < d->n_act; i++) /* cannot happen: all failed */
				d->act[i]->err = d->act[i]->err ? d->act[i]->err : -EIO;
			ring_reset(d);
		}
		pthread_mutex_lock(&d->mu);
		for (uint32_t i = 0; i < nf; i++)
			complete_locked(d, fin[i]);
	}
	pthread_mutex_unlock(&d->mu);
	/* Windowed writes that never ended leave nothing behind. */
	for (uint32_t i = 0; i < d->n_wt; i++)
		if (d->wt[i]->used)
			(void)wt_discard(d, d->wt[i]);
	pthread_mutex_lock(&d->mu);
	d->exited = true;
	pthread_cond_broadcast(&d->cv_exit);
	bool free_me = d->orphaned;
	pthread_mutex_unlock(&d->mu);
	if (free_me)
		disk_free(d);
	return NULL;
}

/* Add a startup path note (io_note, "; "-separated). */
__attribute__((format(printf, 2, 3))) static void note(sel_disk *d, const char *fmt, ...)
{
	size_t n = strlen(d->io_note);
	if (n && n + 2 < sizeof d->io_note) {
		memcpy(d->io_note + n, "; ", 3);
		n += 2;
	}
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(d->io_note + n, sizeof d->io_note - n, fmt, ap);
	va_end(ap);
}

const char *sel_disk_io_path(const struct sel_disk_stats *st)
{
	return st->uring ? (st->direct ? "io_uring+O_DIRECT" : "io_uring+buffered")
			 : (st->direct ? "pread+O_DIRECT" : "pread+buffered");
}

const char *sel_disk_io_note(const sel_disk *d)
{
	return d->io_note;
}

static const char *env_choice(const char *var)
{
	const char *v = getenv(var);
	return v && *v ? v : NULL;
}

int sel_disk_create(const struct sel_disk_config *cfg, sel_disk **out)
{
	sel_disk *d = NULL;
	int rc;
	*out = NULL;
	if (!cfg || !cfg->ns || cfg->dirfd < 0)
		return eos_fail(-EINVAL, "disk thread: configuration needs a namespace and a directory");
	if (cfg->chunk_bytes % EOS_ALIGN != 0 || cfg->chunk_bytes > (1u << 30))
		return eos_fail(-EINVAL, "disk thread: chunk of %" PRIu64 " bytes is not a multiple of "
				"4 KiB up to 1 GiB", cfg->chunk_bytes);
	if (cfg->nice < 0 || cfg->nice > 19)
		return eos_fail(-EINVAL, "disk thread: nice %d is not in 0..19", cfg->nice);

	enum sel_disk_io io = cfg->io;
	const char *env = env_choice("SELENE_DISK_IO");
	if (env) {
		if (strcmp(env, "pread") == 0)
			io = SEL_DISK_IO_PREAD;
		else if (strcmp(env, "uring") == 0)
			io = SEL_DISK_IO_URING;
		else if (strcmp(env, "auto") == 0)
			io = SEL_DISK_IO_AUTO;
		else
			return eos_fail(-EINVAL, "SELENE_DISK_IO='%s' (expected pread, uring or auto)", env);
	}
	int direct = cfg->direct;
	env = env_choice("SELENE_DISK_DIRECT");
	if (env) {
		if (strcmp(env, "0") == 0)
			direct = 0;
		else if (strcmp(env, "1") == 0)
			direct = 1;
		else
			return eos_fail(-EINVAL, "SELENE_DISK_DIRECT='%s' (expected 0 or 1)", env);
	}

	d = calloc(1, sizeof(*d));
	if (!d)
		return eos_fail(-ENOMEM, "disk thread: out of memory");
	d->efd = -1;
	d->dirfd = cfg->dirfd;
	d->ns = cfg->ns;
	d->cap = cfg->queue_depth ? cfg->queue_depth : SEL_DISK_QUEUE_DEPTH;
	d->ring_depth = cfg->ring_depth ? cfg->ring_depth : SEL_DISK_RING_DEPTH;
	d->chunk = cfg->chunk_bytes ? cfg->chunk_bytes : SEL_DISK_CHUNK_BYTES;
	d->fdatasync = cfg->fdatasync;
	d->nice = cfg->nice ? cfg->nice : 10;
	if (cfg->hooks)
		d->hooks = *cfg->hooks;
	if (cfg->dir && !(d->dir = strdup(cfg->dir))) {
		free(d);
		return eos_fail(-ENOMEM, "disk thread: out of memory");
	}
	pthread_mutex_init(&d->mu, NULL);
	pthread_cond_init(&d->cv, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cv_exit, &ca);
	pthread_condattr_destroy(&ca);

	if (direct < 0) {
		if (d->dir) {
			rc = eos_direct_io_probe_at(d->dirfd, d->dir);
			if (rc < 0)
				goto fail;
			direct = rc;
			if (!direct)
				note(d, "O_DIRECT refused, buffered I/O: %s", eos_errmsg());
		} else {
			direct = 1; /* fall back at the first open that refuses */
		}
	} else if (direct == 0) {
		note(d, "buffered I/O: %s", env ? "SELENE_DISK_DIRECT=0" : "direct I/O off");
	} else if (direct == 1 && d->dir) {
		rc = eos_direct_io_probe_at(d->dirfd, d->dir);
		if (rc < 0)
			goto fail;
		if (rc == 0) {
			rc = eos_fail(-EINVAL, "disk thread: direct I/O forced but refused: %s", eos_errmsg());
			goto fail;
		}
	}
	d->direct = direct == 1;

	if (io != SEL_DISK_IO_PREAD) {
		rc = io_uring_queue_init(d->ring_depth, &d->ring, 0);
		if (rc == 0) {
			d->ring_ok = true;
			d->uring = true;
		} else if (io == SEL_DISK_IO_URING) {
			rc = eos_fail(rc, "disk thread: io_uring forced but refused: %s", strerror(-rc));
			goto fail;
		} else {
			note(d, "io_uring refused (%s), pread/pwrite", strerror(-rc));
		}
	} else {
		note(d, "pread/pwrite: %s", getenv("SELENE_DISK_IO") ? "SELENE_DISK_IO=pread"
								     : "io_uring off");
	}

	d->q = calloc(d->cap, sizeof(*d->q));
	d->done = calloc(d->cap, sizeof(*d->done));
	d->reqs = calloc(d->ring_depth, sizeof(*d->reqs));
	d->sq = calloc(d->ring_depth, sizeof(*d->sq));
	bool ok = d->q && d->done && d->reqs && d->sq;
	for (int i = 0; ok && i < ACTIVE_JOBS; i++) {
		struct io_ctx *c = &d->ctx[i];
		c->fd = -1;
		ok = grow_bounce(c, 131072) == 0 &&
		     eos_grow((void **)&c->segs, &c->segs_cap, 256, sizeof(*c->segs)) == 0 &&
		     eos_grow((void **)&c->plan, &c->plan_cap, 64, sizeof(*c->plan)) == 0;
	}
	if (!ok) {
		rc = eos_fail(-ENOMEM, "disk thread: out of memory");
		goto fail;
	}
	if (getrandom(&d->nonce, sizeof d->nonce, GRND_NONBLOCK) != sizeof d->nonce || !d->nonce)
		d->nonce = eos_now_ns() | 1;
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->efd < 0) {
		rc = eos_fail(-errno, "disk thread: eventfd: %s", strerror(errno));
		goto fail;
	}
	rc = pthread_create(&d->th, NULL, disk_main, d);
	if (rc) {
		rc = eos_fail(-rc, "disk thread: cannot start: %s", strerror(rc));
		goto fail;
	}
	d->started = true;
	*out = d;
	return 0;
fail:
	disk_free(d);
	return rc;
}

static int check_job(sel_disk *d, struct sel_disk_job *j)
{
	sel_record_span s;
	if (j->op < SEL_DISK_WRITE || j->op >= SEL_DISK_OPS)
		return eos_fail(-EINVAL, "disk job: unknown operation %d", (int)j->op);
	int rc = sel_record_span_of(&d->ns->layout.sz, &j->rec, &s);
	if (rc)
		return eos_fail(-EINVAL, "disk job: %s", eos_errmsg());
	if (j->op != SEL_DISK_WRITE && j->op != SEL_DISK_READ && j->op != SEL_DISK_WRITE_PART)
		return 0;
	if (j->op == SEL_DISK_WRITE && j->first != 0)
		return eos_fail(-EINVAL, "disk job: a write starts at page 0, not %" PRIu32, j->first);
	if (j->first > j->rec.tail)
		return eos_fail(-EINVAL, "disk job: first page %" PRIu32 " beyond the tail of %" PRIu32,
				j->first, j->rec.tail);
	uint32_t n = j->rec.tail - j->first;
	bool row_pieces = j->row;
	if (j->op == SEL_DISK_READ && j->count) {
		if (j->count > n)
			return eos_fail(-EINVAL, "disk job: pages [%" PRIu32 ", +%" PRIu32 ") beyond the "
					"tail of %" PRIu32, j->first, j->count, j->rec.tail);
		n = j->count;
	}
	if (j->op == SEL_DISK_WRITE_PART) {
		if (j->part & ~(SEL_DISK_PART_BEGIN | SEL_DISK_PART_END))
			return eos_fail(-EINVAL, "disk job: unknown part flags %#x", j->part);
		if (j->count > n)
			return eos_fail(-EINVAL, "disk job: part [%" PRIu32 ", +%" PRIu32 ") beyond the "
					"tail of %" PRIu32, j->first, j->count, j->rec.tail);
		if ((j->part & SEL_DISK_PART_BEGIN) && j->first != 0)
			return eos_fail(-EINVAL, "disk job: the first part starts at page %" PRIu32,
					j->first);
		if ((j->part & SEL_DISK_PART_END) && j->count != n)
			return eos_fail(-EINVAL, "disk job: the last part ends at page %" PRIu32 ", not at"
					" the tail of %" PRIu32, j->first + j->count, j->rec.tail);
		n = j->count;
		row_pieces = j->row && (j->part & SEL_DISK_PART_END);
		if (!row_pieces && j->row_n)
			return eos_fail(-EINVAL, "disk job: row pieces on a part that does not end the "
					"record with its row");
	}
	if (n && !j->pages)
		return eos_fail(-EINVAL, "disk job: %" PRIu32 " page records without addresses", n);
	for (uint32_t i = 0; i < n; i++)
		if (!j->pages[i] || (uintptr_t)j->pages[i] % EOS_ALIGN != 0)
			return eos_fail(-EINVAL, "disk job: page record %" PRIu32 " address is not 4 KiB "
					"aligned", j->first + i);
	if (row_pieces && (rc = sel_record_row_plan(&d->ns->layout, j->rec.flags, j->row_iov,
						    j->row_n, NULL)) != 0)
		return eos_fail(-EINVAL, "disk job: %s", eos_errmsg());
	if (!j->row && j->row_n)
		return eos_fail(-EINVAL, "disk job: row pieces given without the row flag");
	return 0;
}

int sel_disk_submit(sel_disk *d, struct sel_disk_job *j)
{
	int rc = check_job(d, j);
	if (rc)
		return rc;
	j->status = 0;
	j->committed = j->had_row = j->existed = false;
	j->file = (struct eos_file_id){0, 0};
	j->bytes = 0;
	j->errmsg[0] = '\0';
	j->submit_ns = eos_now_ns();
	j->done_ns = 0;
	pthread_mutex_lock(&d->mu);
	if (d->closing) {
		pthread_mutex_unlock(&d->mu);
		return eos_fail(SEL_ESTOPPED, "disk thread: closing, job refused");
	}
	if (d->outstanding >= d->cap) {
		pthread_mutex_unlock(&d->mu);
		return eos_fail(-EAGAIN, "disk thread: %" PRIu32 " jobs outstanding", d->outstanding);
	}
	d->q[(d->q_head + d->q_n) % d->cap] = j;
	d->q_n++;
	d->outstanding++;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	return 0;
}

int sel_disk_poll(sel_disk *d, struct sel_disk_job **done, size_t cap)
{
	/* Under the lock the eventfd is non-zero exactly while completions
	 * wait: the thread pushes and signals under it too. */
	uint64_t v;
	pthread_mutex_lock(&d->mu);
	ssize_t r = read(d->efd, &v, sizeof v);
	(void)r;
	size_t n = 0;
	while (n < cap && d->d_n) {
		done[n++] = d->done[d->d_head];
		d->d_head = (d->d_head + 1) % d->cap;
		d->d_n--;
		d->outstanding--;
	}
	if (d->d_n > 0)
		signal_fd(d);
	pthread_mutex_unlock(&d->mu);
	return (int)n;
}

int sel_disk_fd(const sel_disk *d) { return d->efd; }

uint32_t sel_disk_outstanding(sel_disk *d)
{
	pthread_mutex_lock(&d->mu);
	uint32_t n = d->outstanding;
	pthread_mutex_unlock(&d->mu);
	return n;
}

int sel_disk_close(sel_disk *d, uint64_t deadline_ns)
{
	if (!d)
		return 0;
	pthread_mutex_lock(&d->mu);
	if (d->joined) {
		pthread_mutex_unlock(&d->mu);
		return 0;
	}
	d->closing = true;
	pthread_cond_broadcast(&d->cv);
	while (!d->exited) {
		if (!deadline_ns) {
			pthread_cond_wait(&d->cv_exit, &d->mu);
			continue;
		}
		struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000u),
				      .tv_nsec = (long)(deadline_ns % 1000000000u)};
		if (pthread_cond_timedwait(&d->cv_exit, &d->mu, &ts) == ETIMEDOUT)
			break;
	}
	if (!d->exited) {
		bool first = !d->detached;
		if (first) {
			/* Stop what has not started; the running job stops at
			 * its next chunk, after draining what the kernel holds. */
			__atomic_store_n(&d->abort, true, __ATOMIC_RELEASE);
			d->detached = true;
		}
		pthread_mutex_unlock(&d->mu);
		if (first)
			pthread_detach(d->th);
		return eos_fail(SEL_ESTOPPED, "disk thread: did not drain before its deadline; its "
				"buffers stay in use");
	}
	/* Ended.  Seeing exited under the lock orders everything the thread
	 * did before it, so the buffers are free now even if it was detached. */
	bool join = !d->detached;
	pthread_mutex_unlock(&d->mu);
	if (join)
		pthread_join(d->th, NULL);
	d->joined = true;
	return 0;
}

void sel_disk_destroy(sel_disk *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->mu);
	bool detached = d->detached;
	pthread_mutex_unlock(&d->mu);
	if (!d->joined && !detached)
		sel_disk_close(d, 0);
	pthread_mutex_lock(&d->mu);
	if (d->detached && !d->exited) {
		d->orphaned = true; /* the thread frees it when it ends */
		pthread_mutex_unlock(&d->mu);
		return;
	}
	pthread_mutex_unlock(&d->mu);
	disk_free(d);
}

void sel_disk_stats(sel_disk *d, struct sel_disk_stats *out)
{
	for (int i = 0; i < SEL_DISK_OPS; i++)
		out->jobs[i] = __atomic_load_n(&d->st.jobs[i], __ATOMIC_RELAXED);
	out->failed = __atomic_load_n(&d->st.failed, __ATOMIC_RELAXED);
	out->corrupt = __atomic_load_n(&d->st.corrupt, __ATOMIC_RELAXED);
	out->bytes_written = __atomic_load_n(&d->st.bytes_written, __ATOMIC_RELAXED);
	out->bytes_read = __atomic_load_n(&d->st.bytes_read, __ATOMIC_RELAXED);
	out->submit_retries = __atomic_load_n(&d->st.submit_retries, __ATOMIC_RELAXED);
	out->ring_resets = __atomic_load_n(&d->st.ring_resets, __ATOMIC_RELAXED);
	out->direct_fallbacks = __atomic_load_n(&d->st.direct_fallbacks, __ATOMIC_RELAXED);
	out->overlapped = __atomic_load_n(&d->st.overlapped, __ATOMIC_RELAXED);
	out->uring = __atomic_load_n(&d->uring, __ATOMIC_RELAXED);
	out->direct = __atomic_load_n(&d->direct, __ATOMIC_RELAXED);
}
