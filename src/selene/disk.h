/*
 * disk.h - the disk thread: record writes, reads, compactions and
 * deletions between record files and caller-owned slot buffers (design
 * 2.5, "The disk thread owns an io_uring ring ..."; 2.10 CPU, page cache
 * and backpressure; 2.12).
 *
 * Internal to libselene.
 *
 * One thread per namespace directory owns an io_uring ring over O_DIRECT
 * files, chunks transfers at 8 MiB with up to 32 requests in flight,
 * computes the per-page XXH3 checksums of a write and verifies those of a
 * read.  Where the kernel refuses io_uring or the filesystem refuses
 * O_DIRECT it uses pread/pwrite and buffered files; SELENE_DISK_IO=pread|uring
 * and SELENE_DISK_DIRECT=0|1 force either.  The thread runs at reduced
 * priority (SCHED_BATCH, nice).
 *
 * Contract with the submitting thread (the store's worker):
 *   - sel_disk_submit never blocks.  It returns -EAGAIN when queue_depth
 *     jobs are outstanding (submitted and not yet polled), SEL_ESTOPPED
 *     after close began, and -EINVAL for a malformed job; a call that
 *     returns an error produces no completion.
 *   - Jobs of one record (same key) run and complete in submission order.
 *     On io_uring, jobs of different records overlap (up to four at once)
 *     and may complete out of order; match completions by pointer or id.
 *   - The job descriptor, its page address array, its row pieces and the
 *     slot buffers they point to belong to the disk thread from a
 *     successful submit until the job comes back from sel_disk_poll.  A job
 *     is reported only after every I/O it issued has completed, including
 *     after a failed ring submission, so the buffers are quiescent then.
 *   - Reads verify before they report success: the file's header is re-read
 *     and must describe exactly the indexed record (identity, fingerprint,
 *     layout, key, parent, bucket, tail, flags, every offset) before any
 *     payload is read, so a changed header never enlarges a read; each page
 *     read is checked against its XXH3 in the checksum segment and the row
 *     against the header's row checksum.  Any mismatch is SEL_ECORRUPT: the
 *     destination buffers then hold unspecified bytes, and the caller
 *     removes the file and counts it.
 *   - Writes follow the atomic protocol of record.h: temporary name,
 *     fallocate, payload, header last, optional fdatasync, rename, directory
 *     fsync.  A failed write leaves no temporary behind (unless removing it
 *     failed too, which the message says) and never touches a committed
 *     file of the same name.
 *   - sel_disk_close drains within the deadline.  If the thread cannot
 *     finish (a device that does not complete), close returns SEL_ESTOPPED:
 *     the thread is left running with the buffers of its current job, which
 *     the caller must then never free or reuse (design 2.5: leak, never
 *     reuse under outstanding I/O).  Jobs queued behind it complete with
 *     SEL_ESTOPPED without touching their buffers.
 */
#ifndef SEL_DISK_H
#define SEL_DISK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "record.h"

#define SEL_DISK_CHUNK_BYTES (8u << 20) /* bytes per I/O request */
#define SEL_DISK_RING_DEPTH 32u         /* requests in flight */
#define SEL_DISK_QUEUE_DEPTH 64u        /* jobs outstanding */

enum sel_disk_op {
	SEL_DISK_WRITE = 1, /* write a record from slots (replaces a file of its name) */
	SEL_DISK_READ,      /* read a page suffix and/or the row into slots, verified */
	SEL_DISK_TRUNCATE,  /* compaction: drop the row segment */
	SEL_DISK_UNLINK,    /* delete the file (a missing file is success) */
};

struct sel_disk_job {
	/* Set by the caller. */
	uint64_t id;                /* echoed */
	enum sel_disk_op op;
	sel_record_desc rec;        /* the record as indexed */
	bool row;                   /* WRITE: write the row (else page-only); READ: read it */
	uint32_t first;             /* READ: first page record (a suffix [first, tail)); WRITE: 0 */
	void *const *pages;         /* [tail - first] page record addresses, 4 KiB aligned,
				       span.page_stride bytes each (sel_record_page_addr) */
	const struct iovec *row_iov; /* row pieces in file order (sel_record_row_iov); each
				       row's last piece is transferred padded to 4 KiB, so the
				       4 KiB-rounded piece must be writable memory (a slot share) */
	uint32_t row_n;
	/* Filled at completion. */
	int status;                 /* 0, a negative errno, SEL_ECORRUPT, SEL_ESTOPPED */
	bool committed;             /* WRITE: the file is in place under its name (a failed
				       directory fsync reports an error with this set) */
	bool had_row;               /* READ, TRUNCATE: the file held its row */
	bool existed;               /* UNLINK: the file was there */
	uint64_t bytes;             /* bytes moved to or from the file */
	uint64_t submit_ns, done_ns; /* monotonic */
	char errmsg[EOS_ERRMSG_MAX]; /* the cause, when status != 0 */
};

enum sel_disk_io {
	SEL_DISK_IO_AUTO = 0, /* io_uring where the kernel allows it */
	SEL_DISK_IO_URING,
	SEL_DISK_IO_PREAD,
};

struct io_uring;

/* Test hooks at the io_uring edge (STYLE.md 4).  NULL entries: the real
 * calls. */
struct sel_disk_hooks {
	void *ctx;
	/* Instead of io_uring_submit(ring): same return convention. */
	int (*submit)(void *ctx, struct io_uring *ring);
	/* Sees each completion's result and returns the one to use. */
	int (*complete)(void *ctx, int res);
};

struct sel_disk_config {
	int dirfd;                   /* the namespace directory; the caller holds its lock */
	const char *dir;             /* its path (direct-I/O probe, messages); may be NULL */
	const sel_record_ns *ns;     /* outlives the disk thread */
	uint32_t queue_depth;        /* jobs outstanding; 0 = SEL_DISK_QUEUE_DEPTH */
	uint32_t ring_depth;         /* requests in flight; 0 = SEL_DISK_RING_DEPTH */
	uint64_t chunk_bytes;        /* 0 = SEL_DISK_CHUNK_BYTES; a multiple of 4 KiB */
	enum sel_disk_io io;         /* SELENE_DISK_IO=pread|uring overrides */
	int direct;                  /* -1 probe dir, 0 off, 1 on; SELENE_DISK_DIRECT=0|1 overrides */
	bool fdatasync;              /* fdatasync record files before the rename */
	int nice;                    /* 1..19; 0 = 10 */
	const struct sel_disk_hooks *hooks; /* tests; copied */
};

typedef struct sel_disk sel_disk;

/* Start the thread.  Fails (nothing started) with -EINVAL (config), the
 * io_uring error when io_uring is forced and refused, -EINVAL when direct
 * I/O is forced and the probe says no, or -ENOMEM, with a message. */
int sel_disk_create(const struct sel_disk_config *cfg, sel_disk **out);

/* Queue a job; never blocks.  See the contract above. */
int sel_disk_submit(sel_disk *d, struct sel_disk_job *job);

/* Completed jobs, oldest first, up to cap; never blocks.  Returns the
 * count. */
int sel_disk_poll(sel_disk *d, struct sel_disk_job **done, size_t cap);

/* Readable (eventfd) while a completion waits to be polled. */
int sel_disk_fd(const sel_disk *d);

/* Jobs submitted and not yet polled. */
uint32_t sel_disk_outstanding(sel_disk *d);

/* Stop accepting jobs, finish the queued ones until deadline_ns (monotonic;
 * 0 = no limit) and join the thread: 0, or SEL_ESTOPPED (see above).
 * Completions stay pollable until destroy.  After SEL_ESTOPPED, a later
 * close returns 0 once the thread has ended after all; only then may the
 * buffers of the job it was running be released.  Idempotent. */
int sel_disk_close(sel_disk *d, uint64_t deadline_ns);
/* Free (closing first with no deadline if needed).  After a close that
 * returned SEL_ESTOPPED, the running thread frees the object when it ends.
 * NULL-safe. */
void sel_disk_destroy(sel_disk *d);

struct sel_disk_stats {
	uint64_t jobs[SEL_DISK_UNLINK + 1]; /* completed, by op */
	uint64_t failed;
	uint64_t corrupt;          /* reads that failed verification */
	uint64_t bytes_written, bytes_read;
	uint64_t submit_retries;   /* transient io_uring submission refusals */
	uint64_t ring_resets;      /* rings rebuilt after a failed submission */
	uint64_t direct_fallbacks; /* O_DIRECT refused at open: buffered since */
	uint64_t overlapped;       /* jobs started while another's I/O was in flight */
	bool uring, direct;        /* the paths in use now */
};
void sel_disk_stats(sel_disk *d, struct sel_disk_stats *out);

#endif
