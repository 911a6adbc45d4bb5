/*
 * disk_int.h - what the files of the disk thread share (design 2.5;
 * disk.h is the interface): its struct, the per-job I/O context, requests
 * and segments, the windowed writes' entries, and the calls one part makes
 * into another.  Private to disk.c (the thread and its channel),
 * disk_io.c (the I/O engine) and disk_job.c (each job's prologue, segments
 * and epilogue).
 */
#ifndef SEL_DISK_INT_H
#define SEL_DISK_INT_H

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
#include "xxh.h"

#include "internal.h"

#define IOV_PER_REQ 128
#define SUBMIT_RETRIES 8
#define ACTIVE_JOBS 8

enum seg_kind {
	SEG_PAGE = 0,
	SEG_ROW,
	SEG_HEAD
};

struct seg {
	uint8_t *addr;
	uint64_t len;
	uint64_t off;
	uint32_t idx; /* page index from the job's first page / row piece index */
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
	uint32_t next;  /* the next part's first page record (set at its admission) */
	uint32_t users; /* active parts of this record (issue 18: they overlap) */
	bool failed;    /* a part failed: the last user removes the temporary */
	uint8_t *head;  /* header + checksum segment (aligned) */
	size_t head_cap;
	char tmp[SEL_RECORD_TMPNAME_MAX];
};

/* One active job: its state and its scratch. */
/* A record file kept open between the windows of one fetch (disk_job.c,
 * "Open files"): its descriptor, the header read and checked when it was
 * opened, and its whole checksum segment. */
#define RFILES (ACTIVE_JOBS + 2)

struct rfile {
	bool used;
	uint32_t users; /* active jobs reading through it (issue 18: windows beside) */
	bool closing;   /* closed once its last user ends; no new user */
	sel_key key;
	struct eos_file_id want; /* the file the opening job named (zero: none) */
	int fd;
	uint32_t tail, header_bytes;
	uint64_t cksum_off; /* the span's, when opened */
	uint64_t size;      /* st_size at open */
	sel_record_header h;
	uint8_t *cksum; /* [8 * tail] from cksum_off, in an aligned buffer */
	uint64_t lru;
};

/* A file operation on the ring (disk_fop.c): one per kind per job. */
#define FOP_UNSET INT32_MIN /* not run: never submitted, or abandoned with the ring */

struct fop {
	struct io_ctx *owner;
	int res;    /* the completion's result, FOP_UNSET before */
	int inject; /* hooks.fileop's errno: a NOP stands in for the operation */
	uint8_t kind;
	bool busy; /* prepared, not yet reaped */
};

/* A job's phase on the ring file-operation path. */
enum {
	PH_IO = 0, /* payload (the builder), or nothing more to do */
	PH_OPEN,   /* prologue operations in flight: nothing built, no admission */
	PH_COMMIT, /* the commit chain in flight */
	PH_DONE,   /* the commit chain has completed (results in fops) */
};

/* An entry of the submission queue: its owner and its busy flag. */
struct sqi {
	struct io_ctx *owner;
	bool *busy;
};

struct io_ctx {
	struct sel_disk_job *job;
	struct rfile *rf; /* READ: the open file read through (not closed by the job) */
	char name[SEL_RECORD_NAME_MAX];
	char tmp[SEL_RECORD_TMPNAME_MAX];
	bool write, active;
	bool odirect; /* the ring's openat asks for O_DIRECT */
	int fd;
	int err;
	sel_record_span span;
	sel_record_header h;  /* read: the file's header */
	size_t si;            /* builder: next segment */
	uint64_t spos;        /* builder: bytes of it already queued */
	uint32_t inflight;    /* submitted, not reaped (requests and file operations) */
	uint32_t unsubmitted; /* prepared, not yet taken by the kernel */
	uint8_t phase;        /* PH_* */
	uint32_t fop_pending; /* file operations prepared and not yet reaped */
	struct fop fops[SEL_DISK_FOPS];
	uint64_t bytes;
	uint8_t *cksum;   /* write: where page hashes go; read: expected, from first */
	uint8_t *head;    /* write: header + checksums (bounce, or the part's entry) */
	struct wtemp *wt; /* WRITE_PART: the record's entry */
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

	bool uring;   /* atomic: the thread may switch it off */
	bool direct;  /* atomic: likewise */
	bool ring_ok; /* ring initialised */
	bool ring_broken;
	struct io_uring ring;
	uint32_t inflight; /* requests and file operations the kernel holds */
	uint32_t wr_reqs;  /* write requests prepared and not finished (issue 18) */
	uint64_t wr_t;     /* when wr_reqs last changed */
	uint32_t rd_reqs;  /* read requests likewise (issue 18, r26disk) */
	uint64_t rd_t;
	struct sqi *sq; /* [sq_cap] prepared, not yet submitted, oldest first */
	uint32_t sq_n, sq_cap;
	bool fileops;    /* file operations through the ring (config, env) */
	uint32_t fop_ok; /* bit per enum sel_disk_fop: the kernel has it */
	int ring_dirfd;  /* the directory again, for the ring's operations (not
			    the locked description: disk_fop.c) */

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
	/* Wakes (disk.c "Wakes"): the thread waits on cv and needs a signal;
	 * deferred submissions left it work; submit only records (atomic);
	 * some kick is due (atomic); signals sent (atomic). */
	bool asleep, kick, defer, kick_any;
	uint64_t wakes;

	/* Thread state. */
	struct io_ctx ctx[ACTIVE_JOBS];
	struct io_ctx *act[ACTIVE_JOBS]; /* active jobs, oldest first */
	uint32_t n_act;
	struct req *reqs;
	uint64_t nonce;
	struct wtemp **wt; /* windowed writes between parts (entries never move:
				 active jobs point at them) */
	uint32_t n_wt;
	struct rfile rf[RFILES]; /* record files open between a fetch's windows */
	uint64_t rf_tick;

	struct sel_disk_stats st;     /* updated with atomics */
	char io_note[EOS_ERRMSG_MAX]; /* why not io_uring + O_DIRECT at startup */
};

#define STAT_ADD(d, field, v) __atomic_fetch_add(&(d)->st.field, (v), __ATOMIC_RELAXED)

/* disk_io.c: scratch, segments, the ring and the pread path. */
int dk_grow_bounce(struct io_ctx *c, size_t need);
bool dk_add_seg(struct io_ctx *c, void *addr, uint64_t len, uint64_t off, uint8_t kind,
		uint32_t idx);
void dk_reap(sel_disk *d, bool wait);
bool dk_quiescent(const sel_disk *d, const struct io_ctx *c);
void dk_uring_fill(sel_disk *d);
void dk_run_sync(sel_disk *d, struct io_ctx *c);
void dk_ring_reset(sel_disk *d);

/* disk_fop.c: file operations through the ring. */
/* Probe the ring for each operation (after the ring is set up).  0, or an
 * error when mode forces the ring and the kernel lacks an operation. */
int dk_fop_probe(sel_disk *d, enum sel_disk_fileops mode);
/* Whether every operation of kinds (FOP_BIT mask) may go on the ring now,
 * with room for them in the submission queue. */
bool dk_fop_usable(sel_disk *d, uint32_t kinds);
/* Prepare kinds[0..n) of c as one chain (IOSQE_IO_LINK), on fd, the
 * temporary tmp and c's record name as each needs; len: fallocate's. */
void dk_fop_chain(sel_disk *d, struct io_ctx *c, const uint8_t *kinds, int n, int fd,
		  const char *tmp, uint64_t len);
/* A file operation's completion (dk_reap). */
void dk_fop_reaped(sel_disk *d, struct fop *f, int res);
#define FOP_BIT(k) (1u << (k))
/* A completion's user data: a request, or a file operation (low bit set). */
#define FOP_TAG 1u

/* disk_job.c: a job's prologue and epilogue, windowed writes. */
int dk_wt_discard(sel_disk *d, struct wtemp *w);
void dk_rf_close_all(sel_disk *d);
bool dk_job_begin(sel_disk *d, struct io_ctx *c, struct sel_disk_job *j);
void dk_job_end(sel_disk *d, struct io_ctx *c);
/* Every file operation c had on the ring has completed: the next step. */
void dk_job_fops_done(sel_disk *d, struct io_ctx *c);
/* c's payload is done: put its commit on the ring.  False: commit on the
 * thread (dk_job_end), as before. */
bool dk_job_commit(sel_disk *d, struct io_ctx *c);
/* c is an END part whose record's earlier parts are still active (it
 * started beside them): its epilogue waits.  Fails c once they ended if
 * one of them failed. */
bool dk_part_waits(struct io_ctx *c);

/* Shared helpers. */
static inline bool dk_aborting(sel_disk *d) { return __atomic_load_n(&d->abort, __ATOMIC_ACQUIRE); }
/* The builder has nothing more to queue (it failed, or every segment is
 * in some request; not while the prologue's file operations run). */
static inline bool dk_builder_done(const struct io_ctx *c)
{
	return c->err || (c->phase != PH_OPEN && c->si >= c->n_segs);
}
/* Whether job j may start beside active job c: c has queued all it will
 * (or failed), or its file operations are on the ring and j need not wait
 * for them -- c creates a temporary, or c is an unlink and j does not
 * write (only an unlink's completion must precede a later write's
 * preallocation: disk.h). */
static inline bool dk_admits_past(const struct io_ctx *c, const struct sel_disk_job *j)
{
	if (dk_builder_done(c))
		return true;
	if (c->phase != PH_OPEN)
		return false;
	if (c->write)
		return true;
	return c->job->op == SEL_DISK_UNLINK && j->op != SEL_DISK_WRITE &&
	       j->op != SEL_DISK_WRITE_PART;
}
/* Issue 18: whether windowed-write part j may start beside active job c
 * of the same record.  A later part (not a BEGIN) may follow the record's
 * earlier parts once they are past their prologue (the temporary exists,
 * its descriptor is known) and none failed: parts write disjoint page
 * records and hash into disjoint checksum slots, and an earlier part that
 * may be passed has hashed all its pages already (dk_admits_past: it has
 * queued all it will).  An END part then waits for them before its
 * epilogue (dk_part_waits). */
static inline bool dk_part_beside(const struct io_ctx *c, const struct sel_disk_job *j)
{
	const struct sel_disk_job *a = c->job;
	return j->op == SEL_DISK_WRITE_PART && a->op == SEL_DISK_WRITE_PART &&
	       !(j->part & SEL_DISK_PART_BEGIN) && !(a->part & SEL_DISK_PART_END) && !c->err &&
	       c->phase == PH_IO && c->wt && c->wt->fd >= 0 && !c->wt->failed;
}
/* Issue 18 (r26disk): whether READ job j may start beside active READ job
 * c of the same record.  Reads change nothing, and c reads through an open
 * file past its prologue (its header checked, its checksums in memory):
 * j reads the same descriptor (disk_job.c "Open files") and verifies its
 * own page records.  So the windows of one fetch keep the device busy
 * together, as fio's queue does. */
static inline bool dk_read_beside(const struct io_ctx *c, const struct sel_disk_job *j)
{
	return j->op == SEL_DISK_READ && c->job->op == SEL_DISK_READ && c->rf && !c->rf->closing &&
	       !c->err && c->phase == PH_IO;
}
/* Record the job's first failure with its message, or the calling thread's
 * Eos message as the cause. */
__attribute__((format(printf, 3, 4))) void dk_io_fail(struct io_ctx *c, int rc, const char *fmt,
						      ...);
void dk_io_fail_msg(struct io_ctx *c, int rc);

#endif
