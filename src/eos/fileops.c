/*
 * fileops.c - the table of file syscalls that record I/O goes through
 * (STYLE.md 4; design 2.5 "Transfers, slabs, and record files").
 *
 * Production uses eos_fileops_libc, plain wrappers over libc.  Tests install
 * a table of their own (eos_fileops_set) to make any call site see ENOSPC,
 * EIO or a short write without a full disk or a failing device.
 *
 * DESIGN
 *   The table in force is one pointer, read by every I/O call and written
 *   only by eos_fileops_set.  It is an atomic pointer (release on set,
 *   acquire on read) so that a swap is never a data race, but a swap is still
 *   not a barrier for I/O already under way: a call that has read the old
 *   table finishes through it.  Tests swap while no store is open.  The libc
 *   wrappers exist (rather than pointing at libc directly) so that every
 *   entry has the same shape, whatever libc's prototypes look like.
 *
 * INVARIANTS
 *   1. current is never NULL; it points at eos_fileops_libc or at a table the
 *      caller of eos_fileops_set keeps alive while it is installed.
 */
#include "eos.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static int libc_open(const char *path, int flags, mode_t mode) { return open(path, flags, mode); }

static int libc_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	return openat(dirfd, path, flags, mode);
}

static int libc_close(int fd) { return close(fd); }

static ssize_t libc_pread(int fd, void *buf, size_t len, off_t off)
{
	return pread(fd, buf, len, off);
}

static ssize_t libc_pwrite(int fd, const void *buf, size_t len, off_t off)
{
	return pwrite(fd, buf, len, off);
}

static int libc_fsync(int fd) { return fsync(fd); }

static int libc_fdatasync(int fd) { return fdatasync(fd); }

static int libc_fallocate(int fd, int mode, off_t off, off_t len)
{
	return fallocate(fd, mode, off, len);
}

static int libc_ftruncate(int fd, off_t len) { return ftruncate(fd, len); }

static int libc_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
	return renameat(olddirfd, oldpath, newdirfd, newpath);
}

static int libc_unlinkat(int dirfd, const char *path, int flags)
{
	return unlinkat(dirfd, path, flags);
}

const struct eos_fileops eos_fileops_libc = {
	.open = libc_open,
	.openat = libc_openat,
	.close = libc_close,
	.pread = libc_pread,
	.pwrite = libc_pwrite,
	.fsync = libc_fsync,
	.fdatasync = libc_fdatasync,
	.fallocate = libc_fallocate,
	.ftruncate = libc_ftruncate,
	.renameat = libc_renameat,
	.unlinkat = libc_unlinkat,
};

static const struct eos_fileops *current = &eos_fileops_libc;

const struct eos_fileops *eos_fileops(void) { return __atomic_load_n(&current, __ATOMIC_ACQUIRE); }

void eos_fileops_set(const struct eos_fileops *ops)
{
	__atomic_store_n(&current, ops ? ops : &eos_fileops_libc, __ATOMIC_RELEASE);
}
