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
 * and SELENE_DISK_DIRECT=0|1 force either.  On the ring, a write's file
 * operations (creating the temporary, fallocate, fdatasync, close, rename,
 * directory fsync) and an unlink go through the ring too, each where the
 * kernel has the operation (io_uring_get_probe), so the thread does not
 * wait on them; SELENE_DISK_FILEOPS=sync (or config fileops) keeps them on
 * the thread, as does a fault-injecting eos_fileops() table.  The thread
 * runs at reduced priority (SCHED_BATCH, nice).
 *
 * Contract with the submitting thread (the store's worker):
 *   - sel_disk_submit never blocks.  It returns -EAGAIN when queue_depth
 *     jobs are outstanding (submitted and not yet polled), SEL_ESTOPPED
 *     after close began, and -EINVAL for a malformed job; a call that
 *     returns an error produces no completion.
 *   - Jobs of one record (same key) run and complete in submission order,
 *     except reads: a READ may start beside an earlier READ of its record
 *     (issue 18, r26disk) and complete before it.
 *     Every job's prologue (temporary creation and preallocation,
 *     truncation, unlink, the header read) starts in submission order
 *     across records too, and an unlink's or a truncation's completes
 *     before any later write starts (a truncation's before any later job),
 *     so a store that releases a removal's disk budget when it submits the
 *     unlink never has a later write preallocate before that file is gone.
 *     On io_uring, jobs of different records overlap (up to eight at once)
 *     and may complete out of order; match completions by pointer or id.
 *   - The job descriptor, its page address array, its row pieces and the
 *     slot buffers they point to belong to the disk thread from a
 *     successful submit until the job comes back from sel_disk_poll.  A job
 *     is reported only after every I/O it issued has completed, including
 *     after a failed ring submission, so the buffers are quiescent then.
 *   - Every record file is opened relative to the directory descriptor with
 *     O_NOFOLLOW and O_NONBLOCK, must be a regular file and, where the job
 *     names it (want), the very file that was indexed: a symbolic link, a
 *     FIFO or a file put under the name since is never read, written
 *     through or truncated (SEL_ECORRUPT).
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
	SEL_DISK_WRITE = 1,  /* write a record from slots (replaces a file of its name) */
	SEL_DISK_READ,       /* read a page range and/or the row into slots, verified */
	SEL_DISK_TRUNCATE,   /* compaction: drop the row segment */
	SEL_DISK_UNLINK,     /* delete the file (a missing file is success) */
	SEL_DISK_WRITE_PART, /* one window of a windowed write (see below) */
	SEL_DISK_DISCARD,    /* abandon a windowed write: remove its temporary */
	SEL_DISK_OPS
};

/* Windowed writes (design 2.4 Staged: a record streamed through intake
 * windows).  A record is written as a sequence of SEL_DISK_WRITE_PART jobs
 * covering its page records in order, [first, first + count) each:
 *   - the part with SEL_DISK_PART_BEGIN (first == 0) creates the temporary
 *     file and preallocates the record's whole length (with the row when
 *     `row` is set: every part of one record carries the same `row`);
 *   - each part writes its page records and hashes them into the record's
 *     checksum segment, which the disk thread keeps between parts;
 *   - the part with SEL_DISK_PART_END (first + count == tail) also writes
 *     the row (its pieces are given on this part only), then the checksum
 *     segment and the header, and commits (fdatasync if configured, rename,
 *     directory fsync).  One part may be both BEGIN and END.
 * The disk thread holds the temporary's descriptor between parts.  Parts
 * queued together may overlap (issue 18): a later part starts beside the
 * earlier ones once they have queued their writes, and the END part
 * commits only after every other part ended; a part's completion may so
 * come before an earlier part's.  A part that fails removes the temporary
 * once no other part of the record is active (before the last of them
 * reports); a part that started beside it fails with -ECANCELED, a later
 * part of that record with -ENOENT ("no temporary").  A part out of order (first is not
 * where the previous part ended) fails the same way and removes the
 * temporary too.  SEL_DISK_DISCARD removes a record's temporary if one is
 * open (existed tells) and is how a store abandons a write whose copy-out
 * failed midway.  BEGIN on a record that already has an open temporary
 * discards the old one first.  Temporaries still open at close are
 * removed.  Nothing but the final rename ever touches a committed file of
 * the record's name. */
#define SEL_DISK_PART_BEGIN 1u
#define SEL_DISK_PART_END 2u

struct sel_disk_job {
	/* Set by the caller. */
	uint64_t id; /* echoed */
	enum sel_disk_op op;
	sel_record_desc rec;         /* the record as indexed */
	bool row;                    /* WRITE, WRITE_PART: the record has its row (else
				       page-only); READ: read it */
	uint32_t first;              /* READ, WRITE_PART: first page record; WRITE: 0 */
	uint32_t count;              /* READ: page records from first, 0 = through the tail
				       (the suffix [first, tail)); WRITE_PART: page records
				       of this part (may be 0) */
	uint32_t part;               /* WRITE_PART: SEL_DISK_PART_BEGIN | SEL_DISK_PART_END */
	void *const *pages;          /* page record addresses, 4 KiB aligned, span.page_stride
				       bytes each (sel_record_page_addr): WRITE [tail], READ
				       and WRITE_PART one per page record they move */
	const struct iovec *row_iov; /* row pieces in file order (sel_record_row_iov); each
				       row's last piece is transferred padded to 4 KiB, so the
				       4 KiB-rounded piece must be writable memory (a slot share).
				       WRITE_PART: on the END part only */
	uint32_t row_n;
	/* WRITE, WRITE_PART END: the header's creation time (ns since the
	 * epoch); 0 = now.  Ranks on separate hosts write the same one
	 * (design 2.14), so every rank's header agrees. */
	uint64_t created_ns;
	/* READ, TRUNCATE: the file the record was indexed at (the scan's
	 * fstat, or a commit's `file` below); another file under the name --
	 * replaced, a symbolic link, a FIFO -- is never read or truncated
	 * (SEL_ECORRUPT).  All zero: no such check (tests). */
	struct eos_file_id want;
	/* READ (issue 18, overlapped restores): copy the stored checksums of
	 * page records [sums_first, sums_first + n_sums) into sums once the
	 * header checked out, before any payload is read (the entries the
	 * record's checksum segment holds; no I/O beyond the segment every
	 * read reads).  n_sums 0: none. */
	uint64_t *sums;
	uint32_t sums_first, n_sums;
	/* Filled at completion. */
	int status;                  /* 0, a negative errno, SEL_ECORRUPT, SEL_ESTOPPED */
	bool committed;              /* WRITE, WRITE_PART END: the file is in place under its
				       name (a failed directory fsync reports an error with
				       this set) */
	bool had_row;                /* READ, TRUNCATE: the file held its row */
	bool existed;                /* UNLINK: the file was there; DISCARD: a temporary was */
	struct eos_file_id file;     /* WRITE, WRITE_PART END with committed: the file now
				       under the record's name */
	uint64_t bytes;              /* bytes moved to or from the file */
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
	/* Before a file operation is put on the ring (op: enum sel_disk_fop):
	 * 0 runs it, a negative errno makes it fail with that errno without
	 * running it (and cancels what the ring would have run after it). */
	int (*fileop)(void *ctx, int op);
	/* Sees each file operation's completion on the ring (after fileop's
	 * injection; -ECANCELED: a failure before it in its chain). */
	void (*fileop_done)(void *ctx, int op, int res);
};

/* The file operations the ring can carry (hooks.fileop, stats). */
enum sel_disk_fop {
	SEL_DISK_FOP_OPEN = 0, /* create the temporary (openat O_CREAT|O_EXCL) */
	SEL_DISK_FOP_FALLOCATE,
	SEL_DISK_FOP_DATASYNC, /* fdatasync before the rename (config fdatasync) */
	SEL_DISK_FOP_CLOSE,
	SEL_DISK_FOP_RENAME,
	SEL_DISK_FOP_DIRSYNC, /* fsync of the directory after the rename */
	SEL_DISK_FOP_UNLINK,
	SEL_DISK_FOPS
};

enum sel_disk_fileops {
	SEL_DISK_FILEOPS_AUTO = 0, /* on the ring where the kernel has each operation */
	SEL_DISK_FILEOPS_RING,     /* likewise, and create fails if the kernel lacks one */
	SEL_DISK_FILEOPS_SYNC,     /* on the disk thread (the path before the ring) */
};

struct sel_disk_config {
	int dirfd;               /* the namespace directory; the caller holds its lock */
	const char *dir;         /* its path (direct-I/O probe, messages); may be NULL */
	const sel_record_ns *ns; /* outlives the disk thread */
	uint32_t queue_depth;    /* jobs outstanding; 0 = SEL_DISK_QUEUE_DEPTH */
	uint32_t ring_depth;     /* requests in flight; 0 = SEL_DISK_RING_DEPTH */
	uint64_t chunk_bytes;    /* 0 = SEL_DISK_CHUNK_BYTES; a multiple of 4 KiB */
	enum sel_disk_io io;     /* SELENE_DISK_IO=pread|uring overrides */
	int direct;              /* -1 probe dir, 0 off, 1 on; SELENE_DISK_DIRECT=0|1 overrides */
	bool fdatasync;          /* fdatasync record files before the rename */
	int nice;                /* 1..19; 0 = 10 */
	enum sel_disk_fileops fileops;      /* SELENE_DISK_FILEOPS=auto|ring|sync overrides */
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

/* Wakes (disk.c "Wakes", as sel_xfer_defer_wakes): with deferred wakes a
 * submission never signals the thread; sel_disk_kick wakes it once if a
 * submission left it work while it slept (returns the signals sent, 0 with
 * one atomic load when none is due).  A kick never sent delays the job by
 * at most 50 ms.  sel_disk_wakes counts the signals sent. */
void sel_disk_defer_wakes(sel_disk *d, bool defer);
int sel_disk_kick(sel_disk *d);
uint64_t sel_disk_wakes(const sel_disk *d);

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
	uint64_t jobs[SEL_DISK_OPS]; /* completed, by op */
	uint64_t failed;
	uint64_t corrupt; /* reads that failed verification */
	uint64_t bytes_written, bytes_read;
	uint64_t submit_retries;   /* transient io_uring submission refusals */
	uint64_t ring_resets;      /* rings rebuilt after a failed submission */
	uint64_t direct_fallbacks; /* O_DIRECT refused at open: buffered since */
	uint64_t overlapped;       /* jobs started while another's I/O was in flight */
	uint64_t parts_beside;     /* write parts started beside an earlier part of their record */
	uint64_t reads_beside;     /* reads started beside another read of their record */
	/* io_uring: time with write requests in flight, and the integral of
	 * their count over it (the mean depth while writing is the ratio). */
	uint64_t write_busy_ns, write_depth_ns;
	uint64_t read_busy_ns, read_depth_ns; /* the same for read requests */
	uint64_t read_opens;                  /* record files opened (and headers read) for reads */
	uint64_t read_reuses;                 /* reads through a file a previous window opened */
	uint64_t ring_fileops[SEL_DISK_FOPS]; /* file operations completed through the ring */
	uint64_t fileop_fallbacks; /* ring creates redone on the thread (EEXIST, O_DIRECT) */
	bool uring, direct;        /* the paths in use now */
	bool ring_fileops_on;      /* file operations go through the ring (where it has them) */
};
void sel_disk_stats(sel_disk *d, struct sel_disk_stats *out);
/* The I/O path the stats describe: "io_uring+O_DIRECT", "io_uring+buffered",
 * "pread+O_DIRECT" or "pread+buffered" (a static string). */
const char *sel_disk_io_path(const struct sel_disk_stats *st);
/* Why the thread started on another path than io_uring+O_DIRECT (the probe's
 * or io_uring's refusal, or the environment forcing it), "" when it did
 * not.  Valid until destroy. */
const char *sel_disk_io_note(const sel_disk *d);

#endif
