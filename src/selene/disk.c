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
 * checks the header against the indexed record, and reads the record's
 * checksums -- or, for a later window of the same fetch, finds the file
 * still open with its header and checksums and checks that header against
 * its own indexed record (disk_job.c, "Open files").  Its payload is then planned as segments, each one contiguous
 * memory range at one file offset: the page records, the row pieces, and
 * for a write the header with its checksum segment, which sits in the
 * job's own aligned bounce buffer and goes last (its checksums and row
 * checksum are known only once the payload is hashed).  A builder cuts the
 * segments, in order, into requests of at most chunk_bytes (8 MiB) and 128
 * iovecs over file-contiguous runs.  The epilogue is synchronous again:
 * verify the row, or commit (fdatasync, rename, directory fsync).  On the
 * ring, a write's file operations (creating and preallocating the
 * temporary; the commit as one linked chain) and an unlink are put on the
 * ring instead, where the kernel has them, and the job waits for their
 * completions like for its requests (disk_fop.c), so the thread goes on
 * with the other jobs meanwhile.
 *
 * One record rarely fills the ring (a 64 MiB record is 8 requests), so on
 * the io_uring path up to ACTIVE_JOBS (8) jobs are in flight together: once
 * every active job has queued all its requests (or is a write whose
 * temporary the ring is creating), the next job's prologue runs while the
 * device works on theirs, and its requests follow.  Up to
 * ring_depth (32) requests are in flight in all.  A job is admitted early
 * only if no active job has the same key, so the jobs of one record start
 * in submission order; jobs of different records may complete out of
 * order.  The one exception (issue 18): a later part of a windowed write
 * starts beside its record's earlier parts once they have queued all their
 * requests (dk_part_beside), so one put keeps more than one window with the
 * device; an END part started so waits for them before its epilogue
 * (dk_part_waits).  Likewise a READ starts beside an active READ of its
 * record that reads through an open file past its prologue
 * (dk_read_beside), so the windows of one fetch are with the device
 * together.
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
 *   4. Two active jobs never have the same key, except parts of one
 *      windowed write admitted by dk_part_beside (at most one of them the
 *      END part, which ends after all the others) and reads admitted by
 *      dk_read_beside (all of them READs through one open file).
 *   5. A read reports 0 only when the header matched the indexed record,
 *      every page it read matched its checksum and the row (if read)
 *      matched the row checksum.
 *   6. A windowed write's entry exists from its BEGIN part until its END
 *      part commits, a part fails or a DISCARD; while it exists its
 *      temporary file exists and its descriptor is open.  Parts start in
 *      page order (next == first, advanced at each part's start), and a
 *      record's checksum segment is written only by its END part, after
 *      every page record was hashed; it commits only after every other part
 *      of the record ended without failing.  After a part failed, the
 *      entry is removed (its temporary with it) when the last active part
 *      of the record ends.
 */
#include "disk_int.h"

/* ---- Thread and channel ------------------------------------------------------ */

static void disk_free(sel_disk *d)
{
	if (d->ring_ok)
		io_uring_queue_exit(&d->ring);
	if (d->efd >= 0)
		close(d->efd);
	if (d->ring_dirfd >= 0)
		close(d->ring_dirfd);
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

/* Wakes (issue 18, as transfer.c's): the thread marks itself asleep under
 * the lock before it waits; a submission signals only a sleeping thread,
 * or with deferred wakes records a kick that sel_disk_kick sends once per
 * service pass.  A deferred-mode thread sleeps at most BACKSTOP_NS, so a
 * kick never sent delays a job instead of losing it. */
#define BACKSTOP_NS (50 * 1000000ull)

static void disk_sleep(sel_disk *d)
{
	d->asleep = true;
	if (__atomic_load_n(&d->defer, __ATOMIC_RELAXED)) {
		uint64_t t = eos_now_ns() + BACKSTOP_NS;
		struct timespec ts = {.tv_sec = (time_t)(t / 1000000000u),
				      .tv_nsec = (long)(t % 1000000000u)};
		(void)pthread_cond_timedwait(&d->cv, &d->mu, &ts);
	} else {
		pthread_cond_wait(&d->cv, &d->mu);
	}
	d->asleep = false;
	d->kick = false;
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
		const struct io_ctx *c = d->act[i];
		if (!dk_admits_past(c, j) || (sel_key_eq(&c->job->rec.key, &j->rec.key) &&
					      !dk_part_beside(c, j) && !dk_read_beside(c, j)))
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
			if (dk_aborting(d)) {
				j->status = SEL_ESTOPPED;
				snprintf(j->errmsg, sizeof j->errmsg,
					 "the disk thread stopped before this job");
			} else if ((io = dk_job_begin(d, c, j))) {
				c->active = true;
				if (d->n_act)
					STAT_ADD(d, overlapped, 1);
				if (c->wt && c->wt->users > 1)
					STAT_ADD(d, parts_beside, 1);
				if (c->rf && c->rf->users > 1)
					STAT_ADD(d, reads_beside, 1);
				d->act[d->n_act++] = c;
			} else {
				dk_job_end(d, c);
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
			disk_sleep(d);
			continue;
		}
		pthread_mutex_unlock(&d->mu);

		/* Run the active jobs' I/O.  On the ring, wait for a completion
		 * only when no further job could start meanwhile. */
		if (__atomic_load_n(&d->uring, __ATOMIC_RELAXED)) {
			dk_uring_fill(d);
			pthread_mutex_lock(&d->mu);
			bool wait = !can_admit(d);
			pthread_mutex_unlock(&d->mu);
			if (d->inflight)
				dk_reap(d, wait);
		} else {
			dk_run_sync(d, d->act[0]);
		}

		/* Finish what is quiescent; reset a broken ring once idle. */
		struct sel_disk_job *fin[ACTIVE_JOBS];
		uint32_t nf = 0, keep = 0;
		for (uint32_t i = 0; i < d->n_act; i++) {
			struct io_ctx *c = d->act[i];
			if (dk_builder_done(c) && dk_quiescent(d, c) && !dk_part_waits(c) &&
			    !dk_job_commit(d, c)) {
				dk_job_end(d, c);
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
			dk_ring_reset(d);
		}
		pthread_mutex_lock(&d->mu);
		for (uint32_t i = 0; i < nf; i++)
			complete_locked(d, fin[i]);
	}
	pthread_mutex_unlock(&d->mu);
	dk_rf_close_all(d);
	/* Windowed writes that never ended leave nothing behind. */
	for (uint32_t i = 0; i < d->n_wt; i++)
		if (d->wt[i]->used)
			(void)dk_wt_discard(d, d->wt[i]);
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

const char *sel_disk_io_note(const sel_disk *d) { return d->io_note; }

static const char *env_choice(const char *var)
{
	const char *v = getenv(var);
	return v && *v ? v : NULL;
}

/* The configuration, with SELENE_DISK_IO and SELENE_DISK_DIRECT applied:
 * the engine and the direct mode (-1 probe, 0, 1), and whether the
 * environment chose the mode.  0 or -EINVAL naming the bad value. */
static int config_choices(const struct sel_disk_config *cfg, enum sel_disk_io *io, int *direct,
			  bool *direct_env)
{
	if (!cfg || !cfg->ns || cfg->dirfd < 0)
		return eos_fail(-EINVAL,
				"disk thread: configuration needs a namespace and a directory");
	if ((unsigned)cfg->fileops > SEL_DISK_FILEOPS_SYNC)
		return eos_fail(-EINVAL, "disk thread: file operations mode %d (expected 0..2)",
				(int)cfg->fileops);
	if (cfg->chunk_bytes % EOS_ALIGN != 0 || cfg->chunk_bytes > (1u << 30))
		return eos_fail(-EINVAL,
				"disk thread: chunk of %" PRIu64 " bytes is not a multiple of "
				"4 KiB up to 1 GiB",
				cfg->chunk_bytes);
	if (cfg->nice < 0 || cfg->nice > 19)
		return eos_fail(-EINVAL, "disk thread: nice %d is not in 0..19", cfg->nice);
	*io = cfg->io;
	const char *env = env_choice("SELENE_DISK_IO");
	if (env) {
		if (strcmp(env, "pread") == 0)
			*io = SEL_DISK_IO_PREAD;
		else if (strcmp(env, "uring") == 0)
			*io = SEL_DISK_IO_URING;
		else if (strcmp(env, "auto") == 0)
			*io = SEL_DISK_IO_AUTO;
		else
			return eos_fail(-EINVAL,
					"SELENE_DISK_IO='%s' (expected pread, uring or auto)", env);
	}
	*direct = cfg->direct;
	env = env_choice("SELENE_DISK_DIRECT");
	*direct_env = env != NULL;
	if (env) {
		if (strcmp(env, "0") == 0)
			*direct = 0;
		else if (strcmp(env, "1") == 0)
			*direct = 1;
		else
			return eos_fail(-EINVAL, "SELENE_DISK_DIRECT='%s' (expected 0 or 1)", env);
	}
	return 0;
}

/* The file-operations mode: the configuration's, or SELENE_DISK_FILEOPS
 * (auto, ring, sync).  0 or -EINVAL naming the bad value. */
static int fileops_choice(const struct sel_disk_config *cfg, enum sel_disk_fileops *mode)
{
	*mode = cfg->fileops;
#ifdef __SANITIZE_THREAD__
	/* ThreadSanitizer cannot see the descriptors the kernel opens and
	 * closes for the ring, so a number the ring closed and another thread's
	 * open reused reads as a race on that descriptor.  Under TSan, auto
	 * means the synchronous path; an explicit "ring" (test_disk's ring
	 * tests, one thread) still takes the ring. */
	if (*mode == SEL_DISK_FILEOPS_AUTO)
		*mode = SEL_DISK_FILEOPS_SYNC;
#endif
	const char *env = env_choice("SELENE_DISK_FILEOPS");
	if (!env)
		return 0;
	if (strcmp(env, "auto") == 0)
		*mode = SEL_DISK_FILEOPS_AUTO;
	else if (strcmp(env, "ring") == 0)
		*mode = SEL_DISK_FILEOPS_RING;
	else if (strcmp(env, "sync") == 0)
		*mode = SEL_DISK_FILEOPS_SYNC;
	else
		return eos_fail(-EINVAL, "SELENE_DISK_FILEOPS='%s' (expected auto, ring or sync)",
				env);
	return 0;
}

/* Direct I/O as chosen: probed (-1), off (0) or forced (1, refused when the
 * filesystem does not allow it). */
static int choose_direct(sel_disk *d, int direct, bool direct_env)
{
	int rc;
	if (direct < 0) {
		if (d->dir) {
			if ((rc = eos_direct_io_probe_at(d->dirfd, d->dir)) < 0)
				return rc;
			direct = rc;
			if (!direct)
				note(d, "O_DIRECT refused, buffered I/O: %s", eos_errmsg());
		} else {
			direct = 1; /* fall back at the first open that refuses */
		}
	} else if (direct == 0) {
		note(d, "buffered I/O: %s", direct_env ? "SELENE_DISK_DIRECT=0" : "direct I/O off");
	} else if (direct == 1 && d->dir) {
		if ((rc = eos_direct_io_probe_at(d->dirfd, d->dir)) < 0)
			return rc;
		if (rc == 0)
			return eos_fail(-EINVAL, "disk thread: direct I/O forced but refused: %s",
					eos_errmsg());
	}
	d->direct = direct == 1;
	return 0;
}

/* The io_uring ring, unless pread/pwrite was chosen or the kernel refuses
 * it (then the pread path, with a note, unless io_uring was forced). */
static int choose_engine(sel_disk *d, enum sel_disk_io io)
{
	if (io == SEL_DISK_IO_PREAD) {
		note(d, "pread/pwrite: %s",
		     getenv("SELENE_DISK_IO") ? "SELENE_DISK_IO=pread" : "io_uring off");
		return 0;
	}
	int rc = io_uring_queue_init(d->sq_cap, &d->ring, 0);
	if (rc == 0) {
		d->ring_ok = true;
		d->uring = true;
	} else if (io == SEL_DISK_IO_URING) {
		return eos_fail(rc, "disk thread: io_uring forced but refused: %s", strerror(-rc));
	} else {
		note(d, "io_uring refused (%s), pread/pwrite", strerror(-rc));
	}
	return 0;
}

/* The queues, the requests and each active job's starting scratch. */
static int alloc_queues(sel_disk *d)
{
	d->q = calloc(d->cap, sizeof(struct sel_disk_job *));
	d->done = calloc(d->cap, sizeof(struct sel_disk_job *));
	d->reqs = calloc(d->ring_depth, sizeof(*d->reqs));
	d->sq = calloc(d->sq_cap, sizeof(*d->sq));
	bool ok = d->q && d->done && d->reqs && d->sq;
	for (int i = 0; ok && i < ACTIVE_JOBS; i++) {
		struct io_ctx *c = &d->ctx[i];
		c->fd = -1;
		ok = dk_grow_bounce(c, 131072) == 0 &&
		     eos_grow((void **)&c->segs, &c->segs_cap, 256, sizeof(*c->segs)) == 0 &&
		     eos_grow((void **)&c->plan, &c->plan_cap, 64, sizeof(*c->plan)) == 0;
	}
	return ok ? 0 : eos_fail(-ENOMEM, "disk thread: out of memory");
}

/* A thread not yet started: its configuration and synchronisation. */
static sel_disk *disk_new(const struct sel_disk_config *cfg)
{
	sel_disk *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->efd = -1;
	d->ring_dirfd = -1;
	d->dirfd = cfg->dirfd;
	d->ns = cfg->ns;
	d->cap = cfg->queue_depth ? cfg->queue_depth : SEL_DISK_QUEUE_DEPTH;
	d->ring_depth = cfg->ring_depth ? cfg->ring_depth : SEL_DISK_RING_DEPTH;
	/* Requests, and each active job's file operations. */
	d->sq_cap = d->ring_depth + ACTIVE_JOBS * SEL_DISK_FOPS;
	d->chunk = cfg->chunk_bytes ? cfg->chunk_bytes : SEL_DISK_CHUNK_BYTES;
	d->fdatasync = cfg->fdatasync;
	d->nice = cfg->nice ? cfg->nice : 10;
	if (cfg->hooks)
		d->hooks = *cfg->hooks;
	if (cfg->dir && !(d->dir = strdup(cfg->dir))) {
		free(d);
		return NULL;
	}
	pthread_mutex_init(&d->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cv, &ca);
	pthread_cond_init(&d->cv_exit, &ca);
	pthread_condattr_destroy(&ca);
	return d;
}

int sel_disk_create(const struct sel_disk_config *cfg, sel_disk **out)
{
	enum sel_disk_io io = SEL_DISK_IO_AUTO;
	enum sel_disk_fileops fops = SEL_DISK_FILEOPS_AUTO;
	int direct = -1, rc;
	bool direct_env = false;
	*out = NULL;
	if ((rc = config_choices(cfg, &io, &direct, &direct_env)) ||
	    (rc = fileops_choice(cfg, &fops)))
		return rc;
	sel_disk *d = disk_new(cfg);
	if (!d)
		return eos_fail(-ENOMEM, "disk thread: out of memory");
	if ((rc = choose_direct(d, direct, direct_env)) || (rc = choose_engine(d, io)) ||
	    (rc = dk_fop_probe(d, fops)) || (rc = alloc_queues(d)))
		goto fail;
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
		return eos_fail(-EINVAL, "disk job: a write starts at page 0, not %" PRIu32,
				j->first);
	if (j->first > j->rec.tail)
		return eos_fail(-EINVAL,
				"disk job: first page %" PRIu32 " beyond the tail of %" PRIu32,
				j->first, j->rec.tail);
	uint32_t n = j->rec.tail - j->first;
	bool row_pieces = j->row;
	if (j->op == SEL_DISK_READ && j->count) {
		if (j->count > n)
			return eos_fail(-EINVAL,
					"disk job: pages [%" PRIu32 ", +%" PRIu32 ") beyond the "
					"tail of %" PRIu32,
					j->first, j->count, j->rec.tail);
		n = j->count;
	}
	if (j->op == SEL_DISK_WRITE_PART) {
		if (j->part & ~(SEL_DISK_PART_BEGIN | SEL_DISK_PART_END))
			return eos_fail(-EINVAL, "disk job: unknown part flags %#x", j->part);
		if (j->count > n)
			return eos_fail(-EINVAL,
					"disk job: part [%" PRIu32 ", +%" PRIu32 ") beyond the "
					"tail of %" PRIu32,
					j->first, j->count, j->rec.tail);
		if ((j->part & SEL_DISK_PART_BEGIN) && j->first != 0)
			return eos_fail(-EINVAL, "disk job: the first part starts at page %" PRIu32,
					j->first);
		if ((j->part & SEL_DISK_PART_END) && j->count != n)
			return eos_fail(-EINVAL,
					"disk job: the last part ends at page %" PRIu32 ", not at"
					" the tail of %" PRIu32,
					j->first + j->count, j->rec.tail);
		n = j->count;
		row_pieces = j->row && (j->part & SEL_DISK_PART_END);
		if (!row_pieces && j->row_n)
			return eos_fail(-EINVAL,
					"disk job: row pieces on a part that does not end the "
					"record with its row");
	}
	if (n && !j->pages)
		return eos_fail(-EINVAL, "disk job: %" PRIu32 " page records without addresses", n);
	for (uint32_t i = 0; i < n; i++)
		if (!j->pages[i] || (uintptr_t)j->pages[i] % EOS_ALIGN != 0)
			return eos_fail(-EINVAL,
					"disk job: page record %" PRIu32 " address is not 4 KiB "
					"aligned",
					j->first + i);
	if (row_pieces &&
	    sel_record_row_plan(&d->ns->layout, j->rec.flags, j->row_iov, j->row_n, NULL) != 0)
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
		return eos_fail(-EAGAIN, "disk thread: %" PRIu32 " jobs outstanding",
				d->outstanding);
	}
	d->q[(d->q_head + d->q_n) % d->cap] = j;
	d->q_n++;
	d->outstanding++;
	if (d->asleep && __atomic_load_n(&d->defer, __ATOMIC_RELAXED)) {
		d->kick = true;
		__atomic_store_n(&d->kick_any, true, __ATOMIC_RELAXED);
	} else if (d->asleep) {
		d->asleep = false; /* one signal per sleep */
		pthread_cond_signal(&d->cv);
		__atomic_fetch_add(&d->wakes, 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&d->mu);
	return 0;
}

void sel_disk_defer_wakes(sel_disk *d, bool defer)
{
	pthread_mutex_lock(&d->mu);
	__atomic_store_n(&d->defer, defer, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&d->cv); /* a sleeping thread chooses its wait again */
	pthread_mutex_unlock(&d->mu);
}

int sel_disk_kick(sel_disk *d)
{
	int n = 0;
	if (!__atomic_load_n(&d->kick_any, __ATOMIC_RELAXED))
		return 0;
	__atomic_store_n(&d->kick_any, false, __ATOMIC_RELAXED);
	pthread_mutex_lock(&d->mu);
	if (d->kick && d->asleep) {
		d->asleep = false;
		pthread_cond_signal(&d->cv);
		n = 1;
	}
	d->kick = false;
	pthread_mutex_unlock(&d->mu);
	__atomic_fetch_add(&d->wakes, (uint64_t)n, __ATOMIC_RELAXED);
	return n;
}

uint64_t sel_disk_wakes(const sel_disk *d)
{
	return __atomic_load_n(&((sel_disk *)d)->wakes, __ATOMIC_RELAXED);
}

int sel_disk_poll(sel_disk *d, struct sel_disk_job **done, size_t cap)
{
	/* Under the lock the eventfd is non-zero exactly while completions
	 * wait: the thread pushes and signals under it too. */
	uint64_t v;
	pthread_mutex_lock(&d->mu);
	if (d->d_n == 0) { /* the eventfd is 0: no syscall */
		pthread_mutex_unlock(&d->mu);
		return 0;
	}
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
	out->parts_beside = __atomic_load_n(&d->st.parts_beside, __ATOMIC_RELAXED);
	out->reads_beside = __atomic_load_n(&d->st.reads_beside, __ATOMIC_RELAXED);
	out->write_busy_ns = __atomic_load_n(&d->st.write_busy_ns, __ATOMIC_RELAXED);
	out->write_depth_ns = __atomic_load_n(&d->st.write_depth_ns, __ATOMIC_RELAXED);
	out->read_busy_ns = __atomic_load_n(&d->st.read_busy_ns, __ATOMIC_RELAXED);
	out->read_depth_ns = __atomic_load_n(&d->st.read_depth_ns, __ATOMIC_RELAXED);
	out->read_opens = __atomic_load_n(&d->st.read_opens, __ATOMIC_RELAXED);
	out->read_reuses = __atomic_load_n(&d->st.read_reuses, __ATOMIC_RELAXED);
	for (int i = 0; i < SEL_DISK_FOPS; i++)
		out->ring_fileops[i] = __atomic_load_n(&d->st.ring_fileops[i], __ATOMIC_RELAXED);
	out->fileop_fallbacks = __atomic_load_n(&d->st.fileop_fallbacks, __ATOMIC_RELAXED);
	out->ring_fileops_on = d->fileops && __atomic_load_n(&d->uring, __ATOMIC_RELAXED);
	out->uring = __atomic_load_n(&d->uring, __ATOMIC_RELAXED);
	out->direct = __atomic_load_n(&d->direct, __ATOMIC_RELAXED);
}
