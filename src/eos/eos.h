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
#include <sys/types.h>

#define EOS_ALIGN 4096u /* direct I/O and slab alignment */

/* ---- Errors ------------------------------------------------------------ */

/* The calling thread's last error message ("" when none was set). */
const char *eos_errmsg(void);
/* Set the calling thread's message; returns rc so callers can `return
 * eos_fail(-EINVAL, "...")`.  Messages longer than 511 bytes are cut. */
int eos_fail(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int eos_vfail(int rc, const char *fmt, va_list ap);
void eos_errclear(void);

/* ---- Aligned buffers --------------------------------------------------- */

/* Allocate len bytes (rounded up to a multiple of align) aligned to align,
 * a power of two >= sizeof(void *).  Zero-filled.  NULL with errno=ENOMEM
 * and a message on failure.  Free with eos_aligned_free(). */
void *eos_aligned_alloc(size_t align, size_t len);
void eos_aligned_free(void *p);
static inline uint64_t eos_round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* ---- File operations table (fault injection point) --------------------- */

/* Every syscall on record files goes through this table.  Tests replace
 * entries (eos_fileops_set) to inject ENOSPC, EIO and short writes at any
 * call site; production uses the libc wrappers.  Entries follow libc's
 * convention (return -1 and set errno). */
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
/* Replace the table (NULL restores the libc one).  Not thread-safe against
 * concurrent I/O: tests swap it while no store is open. */
void eos_fileops_set(const struct eos_fileops *ops);
/* The libc table, for wrappers that inject faults into a few entries only. */
extern const struct eos_fileops eos_fileops_libc;

/* ---- Opening files ----------------------------------------------------- */

enum {
	EOS_O_DIRECT = 1 << 0, /* open with O_DIRECT; fails with -EINVAL where refused */
	EOS_O_CREATE = 1 << 1, /* O_CREAT | O_EXCL */
	EOS_O_WRITE = 1 << 2,  /* O_RDWR instead of O_RDONLY */
	EOS_O_TRUNC = 1 << 3,
};

/* Open path relative to dirfd (AT_FDCWD for the cwd) with O_CLOEXEC and the
 * flags above.  Returns the descriptor or a negative errno with a message
 * naming the path. */
int eos_open(int dirfd, const char *path, unsigned flags);

/* Whether the filesystem holding directory dir accepts O_DIRECT reads and
 * writes of EOS_ALIGN-aligned buffers: 1 yes, 0 no (message says why), or
 * a negative errno when the probe itself could not run (directory missing,
 * not writable).  Creates and removes one temporary file. */
int eos_direct_io_probe(const char *dir);

/* Create directory path and any missing parents (mode 0755).  Existing
 * directories are fine. */
int eos_mkdir_p(const char *path);

/* ---- Directory lock ---------------------------------------------------- */

/* An exclusive, nonblocking lock on a directory, held through an open
 * descriptor for the owner's lifetime (flock on the directory itself).
 * A second opener, in this or another process, fails at once with -EBUSY
 * and a message naming the directory.  The descriptor is usable as a
 * dirfd for *at() calls. */
struct eos_dirlock {
	int fd;
	char *path;
};
int eos_dirlock_acquire(struct eos_dirlock *lk, const char *dir);
/* Safe on a zeroed or already released lock. */
void eos_dirlock_release(struct eos_dirlock *lk);

/* ---- Filesystem capacity ----------------------------------------------- */

/* Bytes available to unprivileged users on the filesystem holding path
 * (statvfs f_bavail * f_frsize), and its total size.  Either out pointer
 * may be NULL. */
int eos_fs_space(const char *path, uint64_t *avail, uint64_t *total);

/* Physical memory: total and currently available (MemAvailable). */
int eos_mem_info(uint64_t *total, uint64_t *avail);

/* ---- Scheduling priority ----------------------------------------------- */

/* Move the calling thread to SCHED_BATCH and raise its nice value to nice
 * (1..19).  Returns 0, or a negative errno when the kernel refused either
 * step (the thread keeps whatever could be applied). */
int eos_thread_lower_priority(int nice);

/* Name the calling thread (truncated to 15 bytes) for top and gdb. */
void eos_thread_name(const char *name);

/* ---- Clocks ------------------------------------------------------------ */

uint64_t eos_now_ns(void);          /* CLOCK_MONOTONIC */
uint64_t eos_now_coarse_ns(void);   /* CLOCK_MONOTONIC_COARSE: cheap, ~4 ms resolution */
uint64_t eos_wall_ns(void);         /* CLOCK_REALTIME, for file times */
void eos_sleep_ns(uint64_t ns);

/* ---- Parsing ----------------------------------------------------------- */

/* Parse a byte size: a non-negative decimal number (fractions allowed with
 * a unit, "1.5GiB") followed by an optional unit.  Units are case-
 * insensitive: B; K, KB, KiB = 1024; M, MB, MiB = 1024^2; G, GB, GiB;
 * T, TB, TiB.  Bare numbers are bytes.  "0" is valid.  Rejects empty text,
 * signs, unknown units, trailing garbage and values over UINT64_MAX with
 * -EINVAL / -ERANGE and a message quoting the text. */
int eos_parse_size(const char *text, uint64_t *out);

/* Parse a duration into nanoseconds: a non-negative number with unit ns,
 * us, ms, s, m, h or d, or a bare number of seconds.  "off" (any case)
 * yields *off = true and *out = 0 when off is non-NULL, else it is an
 * error.  Same error rules as eos_parse_size. */
int eos_parse_duration(const char *text, uint64_t *out_ns, bool *off);

/* Format bytes as "1.5 GiB" / "512 MiB" / "17 B" into buf (>= 16 bytes). */
const char *eos_format_size(uint64_t bytes, char *buf, size_t len);

#endif
