/*
 * faultfs.c - file operations that fail on demand (faultfs.h).
 */
#include "faultfs.h"

#include <errno.h>
#include <string.h>

#include "record.h"

const char *const faultfs_op_name[F_NOPS] = {"none",      "open",  "fallocate", "pwrite", "pread",
					     "fdatasync", "fsync", "rename",    "unlink"};
struct faultfs faultfs;

static bool inject(enum faultfs_op op)
{
	__atomic_add_fetch(&faultfs.calls[op], 1, __ATOMIC_SEQ_CST);
	int e = __atomic_load_n(&faultfs.armed[op], __ATOMIC_SEQ_CST);
	if (!e)
		return false;
	if (__atomic_load_n(&faultfs.skip[op], __ATOMIC_SEQ_CST) > 0) {
		__atomic_sub_fetch(&faultfs.skip[op], 1, __ATOMIC_SEQ_CST);
		return false;
	}
	errno = e;
	return true;
}

static bool record_path(const char *p) { return strstr(p, ".ckpt") != NULL; }

static int f_openat(int dfd, const char *p, int fl, mode_t m)
{
	return record_path(p) && inject(F_OPEN) ? -1 : eos_fileops_libc.openat(dfd, p, fl, m);
}
static ssize_t f_pread(int fd, void *b, size_t n, off_t off)
{
	if (off >= 4096)
		__atomic_add_fetch(&faultfs.payload_preads, 1, __ATOMIC_SEQ_CST);
	return inject(F_PREAD) ? -1 : eos_fileops_libc.pread(fd, b, n, off);
}
static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t off)
{
	int ms = __atomic_load_n(&faultfs.slow_ms, __ATOMIC_SEQ_CST);
	if (ms)
		eos_sleep_ns((uint64_t)ms * 1000000);
	return inject(F_PWRITE) ? -1 : eos_fileops_libc.pwrite(fd, b, n, off);
}
static int f_fsync(int fd) { return inject(F_FSYNC) ? -1 : eos_fileops_libc.fsync(fd); }
static int f_fdatasync(int fd) { return inject(F_FDATASYNC) ? -1 : eos_fileops_libc.fdatasync(fd); }
static int f_fallocate(int fd, int mode, off_t off, off_t len)
{
	return inject(F_FALLOCATE) ? -1 : eos_fileops_libc.fallocate(fd, mode, off, len);
}
static int f_renameat(int a, const char *p, int b, const char *q)
{
	return inject(F_RENAME) ? -1 : eos_fileops_libc.renameat(a, p, b, q);
}
static int f_unlinkat(int dfd, const char *p, int fl)
{
	int ms = __atomic_load_n(&faultfs.slow_unlink_ms, __ATOMIC_SEQ_CST);
	if (ms)
		eos_sleep_ns((uint64_t)ms * 1000000);
	bool spared = __atomic_load_n(&faultfs.spare_tmp_unlink, __ATOMIC_SEQ_CST) &&
		      sel_record_is_tmp_name(p);
	return record_path(p) && !spared && inject(F_UNLINK)
		       ? -1
		       : eos_fileops_libc.unlinkat(dfd, p, fl);
}

const struct eos_fileops *faultfs_ops(void)
{
	static struct eos_fileops ops;
	static bool ready;
	if (ready)
		return &ops;
	ready = true;
	ops = eos_fileops_libc;
	ops.openat = f_openat;
	ops.pread = f_pread;
	ops.pwrite = f_pwrite;
	ops.fsync = f_fsync;
	ops.fdatasync = f_fdatasync;
	ops.fallocate = f_fallocate;
	ops.renameat = f_renameat;
	ops.unlinkat = f_unlinkat;
	return &ops;
}

void faultfs_reset(void)
{
	for (int i = 0; i < F_NOPS; i++) {
		__atomic_store_n(&faultfs.armed[i], 0, __ATOMIC_SEQ_CST);
		__atomic_store_n(&faultfs.skip[i], 0, __ATOMIC_SEQ_CST);
		__atomic_store_n(&faultfs.calls[i], 0, __ATOMIC_SEQ_CST);
	}
	__atomic_store_n(&faultfs.payload_preads, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&faultfs.slow_ms, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(&faultfs.spare_tmp_unlink, false, __ATOMIC_SEQ_CST);
}

void faultfs_arm(enum faultfs_op op, int e, int skip)
{
	__atomic_store_n(&faultfs.skip[op], skip, __ATOMIC_SEQ_CST);
	__atomic_store_n(&faultfs.armed[op], e, __ATOMIC_SEQ_CST);
}
