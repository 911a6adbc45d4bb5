/*
 * disk_io.c - the disk thread's I/O engine: a job's segments cut into
 * chunked requests of at most IOV_PER_REQ pieces, prepared on the io_uring
 * ring (or run one at a time through eos_fileops() on the pread/pwrite
 * path), reaped, resumed after short transfers, and the ring rebuilt after
 * a refused submission (design 2.5 "The disk thread owns an io_uring ring",
 * 2.10; disk.c DESIGN).
 *
 * DESIGN
 *
 * Every request is owned by the kernel from submission to its completion.
 * Whatever goes wrong -- a failed request, a short transfer at end of file,
 * a checksum mismatch, a refused submission -- the job's builder stops and
 * the engine keeps reaping until none of its requests is in flight; only
 * then is the job reported.  Scratch memory (a bounce buffer and segment
 * and plan arrays per active job, and the requests) belongs to the thread
 * and grows to the largest job seen.
 *
 * INVARIANTS: disk.c's 2 and 3 (no kernel reference to a reported job's
 * buffers; every submitted request reaped exactly once).
 */
#include "disk_int.h"

#include <stdarg.h>

/* ---- Failures ----------------------------------------------------------------- */

/* Record the job's first failure with its message. */
void dk_io_fail(struct io_ctx *c, int rc, const char *fmt, ...)
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
void dk_io_fail_msg(struct io_ctx *c, int rc)
{
	if (c->err)
		return;
	c->err = rc;
	snprintf(c->job->errmsg, sizeof c->job->errmsg, "%s", eos_errmsg());
}

/* ---- Scratch ---------------------------------------------------------------- */

int dk_grow_bounce(struct io_ctx *c, size_t need)
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

bool dk_add_seg(struct io_ctx *c, void *addr, uint64_t len, uint64_t off, uint8_t kind,
		uint32_t idx)
{
	if (eos_grow((void **)&c->segs, &c->segs_cap, c->n_segs + 1, sizeof(*c->segs)) != 0)
		return false;
	c->segs[c->n_segs++] =
		(struct seg){.addr = addr, .len = len, .off = off, .kind = kind, .idx = idx};
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
		int rc = sel_record_encode(d->ns, &j->rec, row_ck,
					   j->created_ns ? j->created_ns : eos_wall_ns(),
					   SEL_RECORD_VERSION, c->head, c->span.header_bytes);
		if (rc < 0)
			dk_io_fail(c, rc, "encoding the header: %s", eos_errmsg());
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
		dk_io_fail(c, rc, "%s", eos_errmsg());
}

/* Issue 18: the time write (read) requests were with the kernel, and its
 * integral of their count (sel_disk_stats write_busy_ns, write_depth_ns;
 * read_busy_ns, read_depth_ns). */
static void io_depth(sel_disk *d, bool write, int delta)
{
	uint64_t now = eos_now_ns();
	if (write && d->wr_reqs) {
		STAT_ADD(d, write_busy_ns, now - d->wr_t);
		STAT_ADD(d, write_depth_ns, (now - d->wr_t) * d->wr_reqs);
	} else if (!write && d->rd_reqs) {
		STAT_ADD(d, read_busy_ns, now - d->rd_t);
		STAT_ADD(d, read_depth_ns, (now - d->rd_t) * d->rd_reqs);
	}
	uint32_t *n = write ? &d->wr_reqs : &d->rd_reqs;
	*(write ? &d->wr_t : &d->rd_t) = now;
	*n = (uint32_t)((int)*n + delta);
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
		dk_io_fail(c, res, "%s of %" PRIu64 " bytes at offset %" PRIu64 ": %s",
			   c->write ? "write" : "read", r->left, r->off, strerror(-res));
		return -1;
	}
	if (res == 0) {
		if (c->write)
			dk_io_fail(c, -EIO, "write at offset %" PRIu64 " made no progress", r->off);
		else
			dk_io_fail(c, SEL_ECORRUPT,
				   "the file ends at %" PRIu64 ", inside what its header "
				   "describes",
				   r->off);
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
	d->sq[d->sq_n++] = (struct sqi){c, &r->busy};
	c->unsubmitted++;
	return true;
}

/* Reap completions: wait for one first when wait is set. */
void dk_reap(sel_disk *d, bool wait)
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
		uintptr_t ud = (uintptr_t)io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		io_uring_cqe_seen(&d->ring, cqe);
		if (ud & FOP_TAG) {
			struct fop *f = (struct fop *)(ud & ~(uintptr_t)FOP_TAG);
			f->owner->inflight--;
			d->inflight--;
			dk_fop_reaped(d, f, res);
			continue;
		}
		struct req *r = (struct req *)ud;
		struct io_ctx *c = r->owner;
		c->inflight--;
		d->inflight--;
		if (d->hooks.complete)
			res = d->hooks.complete(d->hooks.ctx, res);
		int p = req_progress(r, res);
		if (p == 0 && !c->err && !d->ring_broken) {
			if (prep(d, r))
				continue;
			dk_io_fail(c, -EBUSY, "no submission entry to resume a short transfer");
		}
		io_depth(d, c->write, -1);
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
				struct io_ctx *c = d->sq[i].owner;
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
				dk_reap(d, true);
			else
				eos_sleep_ns(1000000);
			continue;
		}
		d->ring_broken = true;
		for (uint32_t i = 0; i < d->n_act; i++) {
			struct io_ctx *c = d->act[i];
			if (c->unsubmitted || !dk_builder_done(c))
				dk_io_fail(c, rc, "io_uring submission refused: %s", strerror(-rc));
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
bool dk_quiescent(const sel_disk *d, const struct io_ctx *c)
{
	if (c->inflight)
		return false;
	return c->unsubmitted == 0 || d->ring_broken; /* abandoned with the ring */
}

/* One step of the ring: build and submit what fits; the caller reaps. */
void dk_uring_fill(sel_disk *d)
{
	bool full = false;
	for (uint32_t i = 0; i < d->n_act && !full && !d->ring_broken; i++) {
		struct io_ctx *c = d->act[i];
		while (!dk_builder_done(c) && c->phase == PH_IO) {
			if (dk_aborting(d)) {
				dk_io_fail(c, SEL_ESTOPPED, "the disk thread is stopping");
				break;
			}
			struct req *r = free_req(d);
			if (!r || io_uring_sq_space_left(&d->ring) == 0) {
				full = true;
				break;
			}
			build_chunk(d, c, r);
			if (!prep(d, r)) {
				dk_io_fail(c, -EBUSY, "no submission entry");
				r->busy = false;
				break;
			}
			io_depth(d, c->write, 1);
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
void dk_run_sync(sel_disk *d, struct io_ctx *c)
{
	const struct eos_fileops *ops = eos_fileops();
	struct req *r = &d->reqs[0];
	while (!dk_builder_done(c)) {
		if (dk_aborting(d)) {
			dk_io_fail(c, SEL_ESTOPPED, "the disk thread is stopping");
			break;
		}
		build_chunk(d, c, r);
		int p = 0;
		while (p == 0) {
			struct iovec *v = &r->iov[r->iov_at];
			ssize_t n =
				c->write
					? ops->pwrite(c->fd, v->iov_base, v->iov_len, (off_t)r->off)
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
void dk_ring_reset(sel_disk *d)
{
	for (uint32_t i = 0; i < d->sq_n; i++)
		*d->sq[i].busy = false;
	d->sq_n = 0;
	d->ring_broken = false;
	d->wr_reqs = d->rd_reqs = 0; /* the abandoned ones never complete */
	STAT_ADD(d, ring_resets, 1);
	io_uring_queue_exit(&d->ring);
	d->ring_ok = false;
	if (io_uring_queue_init(d->sq_cap, &d->ring, 0) == 0)
		d->ring_ok = true;
	else
		__atomic_store_n(&d->uring, false, __ATOMIC_RELAXED);
}
