/*
 * eos.h - operating-system helpers shared by Selene, Helios and Flare.
 *
 * Eos is the thin layer between our code and Linux: aligned buffers, file
 * opening with and without O_DIRECT, the record directory lock, filesystem
 * capacity, thread priority, clocks, and parsing of the sizes and durations
 * operators type.  Nothing here knows about checkpoints.
 *
 * Conventions (shared with Selene, see STYLE.md 6-8):
 *   - Functions return 0 (or a non-negative count) on success and a negative
 *     errno on failure.  They never print.
 *   - A failing call leaves a one-line, human-readable explanation in a
 *     thread-local buffer, read with eos_errmsg().  Messages name the bad
 *     value and what was expected ("size '8X': unknown unit 'X' (expected
 *     B, K, KiB, M, MiB, G, GiB, T, TiB)").
 *   - Syscalls that tests must be able to fail go through eos_fileops (see
 *     below); fault injection swaps the table.
 */
#ifndef EOS_H
#define EOS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define EOS_ALIGN 4096u /* direct I/O and slab alignment */

/* ---- Errors ------------------------------------------------------------ */

#define EOS_ERRMSG_MAX 512 /* message buffer, NUL included */

/* The calling thread's last error message ("" when none was set).  A
 * successful call does not clear it: read it only after a failure. */
const char *eos_errmsg(void);
/* Set the calling thread's message; returns rc so callers can `return
 * eos_fail(-EINVAL, "...")`.  Messages longer than 511 bytes are cut (never
 * inside a UTF-8 sequence).  The arguments may include eos_errmsg() itself,
 * to wrap the previous message.  errno is left as it was. */
int eos_fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int eos_vfail(int rc, const char *fmt, va_list ap);
#ifdef __clang_analyzer__
/* clang-tidy's analyzer does not see into err.c; without this it follows
 * paths where a failure returns 0 and reports what they leave unset. */
#define eos_fail(rc, ...) ((void)eos_fail(rc, __VA_ARGS__), (rc))
#define eos_vfail(rc, fmt, ap) ((void)eos_vfail(rc, fmt, ap), (rc))
#endif
void eos_errclear(void);

/* ---- Aligned buffers --------------------------------------------------- */

/* Allocate len bytes (rounded up to a multiple of align) aligned to align,
 * a power of two >= sizeof(void *).  Zero-filled, the whole rounded length.
 * len 0 allocates one align unit.  NULL with errno=ENOMEM (errno=EINVAL for
 * a bad align) and a message on failure.  Free with eos_aligned_free(),
 * which accepts NULL. */
void *eos_aligned_alloc(size_t align, size_t len);
void eos_aligned_free(void *p);

/* Make the array *p of elem-byte elements hold at least want of them,
 * doubling *cap (from 16) and reallocating when it is short.  0, or -ENOMEM
 * (the array is left as it was; also when the size would overflow). */
int eos_grow(void **p, size_t *cap, size_t want, size_t elem);
/* v rounded up to a multiple of a (a > 0); v must be <= UINT64_MAX - a + 1. */
static inline uint64_t eos_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ---- File operations table (fault injection point) --------------------- */

/* Every syscall on record files goes through this table.  Tests replace
 * entries (eos_fileops_set) to inject ENOSPC, EIO and short writes at any
 * call site; production uses the libc wrappers.  Entries follow libc's
 * convention (return -1 and set errno).  A replacement table fills every
 * entry: copy eos_fileops_libc and change the few to fail. */
struct eos_fileops {
	int (*open)(const char *path, int flags, mode_t mode);
	int (*openat)(int dirfd, const char *path, int flags, mode_t mode);
	int (*close)(int fd);
	ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
	ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
	int (*fsync)(int fd);
	int (*fdatasync)(int fd);
	int (*fallocate)(int fd, int mode, off_t off, off_t len);
	int (*ftruncate)(int fd, off_t len);
	int (*renameat)(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
	int (*unlinkat)(int dirfd, const char *path, int flags);
};

/* The table in force.  Never NULL. */
const struct eos_fileops *eos_fileops(void);
/* Replace the table (NULL restores the libc one).  ops is used by pointer
 * and must stay valid while installed.  The swap itself is atomic, but a
 * call already under way finishes through the old table: tests swap it
 * while no store is open. */
void eos_fileops_set(const struct eos_fileops *ops);
/* The libc table, for wrappers that inject faults into a few entries only. */
extern const struct eos_fileops eos_fileops_libc;

/* ---- Opening files ----------------------------------------------------- */

enum {
	EOS_O_DIRECT = 1 << 0, /* open with O_DIRECT; fails with -EINVAL where refused */
	EOS_O_CREATE = 1 << 1, /* O_CREAT | O_EXCL, mode 0644; -EEXIST if present */
	EOS_O_WRITE = 1 << 2,  /* O_RDWR instead of O_RDONLY */
	EOS_O_TRUNC = 1 << 3,  /* O_TRUNC; only with EOS_O_WRITE */
};

/* Open path relative to dirfd (AT_FDCWD for the cwd) with O_CLOEXEC,
 * O_NOFOLLOW and the flags above, through eos_fileops()->openat: a symbolic
 * link as the last component is refused (-ELOOP), never followed.  Returns
 * the descriptor or a negative errno with a message naming the path (and
 * the directory behind dirfd).  Unknown flag bits, or EOS_O_TRUNC without
 * EOS_O_WRITE, are -EINVAL. */
int eos_open(int dirfd, const char *path, unsigned flags);

/* A file's identity: the device and inode it lives at (st_dev, st_ino). */
struct eos_file_id {
	uint64_t dev, ino;
};
static inline bool eos_file_id_eq(const struct eos_file_id *a, const struct eos_file_id *b)
{
	return a->dev == b->dev && a->ino == b->ino;
}

/* Open an existing regular file `name` in directory dirfd (never creating
 * it), as eos_open with flags EOS_O_DIRECT and EOS_O_WRITE only, and prove
 * it is the file the caller means before anything reads it:
 *   - a symbolic link is refused (O_NOFOLLOW): -ELOOP;
 *   - the open is O_NONBLOCK, so a FIFO or device never blocks it, and the
 *     descriptor's fstat must say S_ISREG, else -ENXIO ("not a regular
 *     file": a FIFO, socket, device or directory);
 *   - with want, the file must be that device and inode, else -ESTALE (the
 *     name was replaced since the caller learnt it).
 * O_NONBLOCK is cleared again before returning.  st (may be NULL) receives
 * the fstat.  Returns the descriptor, or a negative errno with a message
 * naming the file; -EINVAL for a refused O_DIRECT as eos_open. */
int eos_open_regular(int dirfd, const char *name, unsigned flags, const struct eos_file_id *want,
		     struct stat *st);

/* Whether the filesystem holding directory dir accepts O_DIRECT reads and
 * writes of EOS_ALIGN-aligned buffers: 1 yes, 0 no (message says why), or
 * a negative errno when the probe itself could not run (directory missing,
 * not writable).  Creates and removes one temporary file, and goes through
 * eos_fileops() like record I/O: an injected EINVAL reads as "no", any
 * other injected error as a failed probe. */
int eos_direct_io_probe(const char *dir);
/* The same probe in the directory open at dfd (a locked directory: the test
 * file is created relative to it, so a path renamed or replaced by a link
 * since it was opened does not matter); dir names it in messages. */
int eos_direct_io_probe_at(int dfd, const char *dir);

/* Create directory path and any missing parents (mode 0755).  Existing
 * directories (and symlinks to them) are fine; an existing non-directory on
 * the way is -ENOTDIR. */
int eos_mkdir_p(const char *path);

/* ---- Directory lock ---------------------------------------------------- */

/* An exclusive, nonblocking lock on a directory, held through an open
 * descriptor for the owner's lifetime (flock on the directory itself).
 * A second opener, in this or another process, fails at once with -EBUSY
 * and a message naming the directory (and the holder's pid where
 * /proc/locks tells it).  The descriptor is usable as a dirfd for *at()
 * calls.  The kernel drops the lock when the last descriptor sharing it
 * closes, so a killed owner leaves no stale lock.
 *
 * fork: a child inherits the descriptor and with it the lock.  Releasing
 * the child's copy (eos_dirlock_release, or exec: it is O_CLOEXEC) does not
 * unlock the parent's; but while the child keeps its copy, the directory
 * stays locked even after the parent releases. */
struct eos_dirlock {
	int fd;
	char *path; /* non-NULL exactly while held */
};
/* lk is overwritten; on failure it is left released (fd -1, path NULL).
 * The last component of dir must be a directory, not a symbolic link to
 * one (-ELOOP, refused, never followed; -ENOTDIR for anything else). */
int eos_dirlock_acquire(struct eos_dirlock *lk, const char *dir);
/* Close the descriptor, which drops the lock.  Safe on a zeroed or already
 * released lock. */
void eos_dirlock_release(struct eos_dirlock *lk);

/* ---- Filesystem capacity ----------------------------------------------- */

/* Bytes available to unprivileged users on the filesystem holding path
 * (statvfs f_bavail * f_frsize), and its total size.  Either out pointer
 * may be NULL. */
int eos_fs_space(const char *path, uint64_t *avail, uint64_t *total);

/* Physical memory: total and currently available (MemAvailable). */
int eos_mem_info(uint64_t *total, uint64_t *avail);

/* ---- Scheduling priority ----------------------------------------------- */

/* The scheduling class of offload threads (transfer, disk, remote I/O,
 * rank links), one per process, read by eos_thread_lower_priority when such
 * a thread starts: set it before the stores open.  Default OTHER
 * (sched.c DESIGN says why not BATCH). */
enum eos_sched_class {
	EOS_SCHED_OTHER = 0,
	EOS_SCHED_BATCH,
	EOS_SCHED_IDLE
};
void eos_offload_sched_set(enum eos_sched_class c); /* out of range: ignored */
enum eos_sched_class eos_offload_sched(void);
const char *eos_sched_class_name(enum eos_sched_class c);            /* "other", "batch", "idle" */
int eos_sched_class_parse(const char *s, enum eos_sched_class *out); /* 0 or -EINVAL */

/* Move the calling thread (only it; other threads keep theirs) to the
 * offload class (above) and raise its nice value to nice (1..19; -EINVAL
 * otherwise).  A thread already nicer than that keeps its value: this never
 * raises a priority.  Returns 0, or a negative errno when the kernel
 * refused either step (the thread keeps whatever could be applied; the
 * message says which). */
int eos_thread_lower_priority(int nice);

/* Name the calling thread (truncated to 15 bytes) for top and gdb. */
void eos_thread_name(const char *name);

/* The CPUs this process may run on (its affinity mask), or 0 when the
 * kernel does not say: the rules that give copy threads helpers. */
uint32_t eos_cpus_allowed(void);

/* ---- Clocks ------------------------------------------------------------ */

uint64_t eos_now_ns(void);        /* CLOCK_MONOTONIC */
uint64_t eos_now_coarse_ns(void); /* CLOCK_MONOTONIC_COARSE: cheap, ~4 ms resolution */
uint64_t eos_wall_ns(void);       /* CLOCK_REALTIME, for file times */
void eos_sleep_ns(uint64_t ns);

/* ---- Parsing ----------------------------------------------------------- */

/* Parse a byte size: a non-negative decimal number (fractions allowed with
 * a unit, "1.5GiB") followed by an optional unit.  Units are case-
 * insensitive: B; K, KB, KiB = 1024; M, MB, MiB = 1024^2; G, GB, GiB;
 * T, TB, TiB.  Bare numbers are bytes.  "0" is valid.  One space may
 * separate number and unit ("1.5 GiB", as eos_format_size prints); no other
 * whitespace.  A fraction needs digits on both sides of the point and a
 * unit above B; the result is rounded down to whole bytes, computed in
 * integers ("1.5GiB" is exactly 1610612736).  Rejects empty text, signs,
 * unknown units, trailing garbage and values over UINT64_MAX with
 * -EINVAL / -ERANGE and a message quoting the text.  *out is written only
 * on success.  The full grammar is in parse.c. */
int eos_parse_size(const char *text, uint64_t *out);

/* Parse a duration into nanoseconds: a non-negative number with unit ns,
 * us, ms, s, m, h or d (case-insensitive), or a bare number of seconds;
 * fractions allowed ("1.5s", "1.5"), except of ns; rounded down to whole
 * nanoseconds.  "0" is valid (callers wanting a positive duration check).
 * "off" (any case) yields *off = true and *out_ns = 0 when off is
 * non-NULL, else it is an error; a number sets *off = false.  Same grammar
 * and error rules as eos_parse_size; outputs are written only on success. */
int eos_parse_duration(const char *text, uint64_t *out_ns, bool *off);

/* Format bytes as "1.5 GiB" / "512 MiB" / "17 B" into buf (>= 16 bytes;
 * shorter is cut) and return buf ("" when buf is NULL or len 0).  The
 * largest unit up to TiB that fits, at most two decimals, rounded down
 * (never claims more than there is).  The text parses back with
 * eos_parse_size: exactly when the value needs no more than two decimals,
 * else to a value below it by less than a hundredth of the unit plus one
 * byte. */
const char *eos_format_size(uint64_t bytes, char *buf, size_t len);

#endif
