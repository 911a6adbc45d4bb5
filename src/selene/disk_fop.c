/*
 * disk_fop.c - the disk thread's file operations through the io_uring ring:
 * creating a write's temporary (openat), preallocating it (fallocate), the
 * commit chain (fdatasync, close, renameat, fsync of the directory) and
 * unlinks (unlinkat), so that the thread submits them and goes on with the
 * other active jobs instead of waiting in each syscall (design 2.5, "The
 * disk thread owns an io_uring ring"; disk.c DESIGN).
 *
 * DESIGN
 *
 * At startup the ring is probed (io_uring_get_probe_ring) for each
 * operation; one the kernel lacks runs on the thread through eos_fileops()
 * as before, so does every operation when SELENE_DISK_FILEOPS=sync (or
 * config fileops) says so, when the ring is broken or gone, and while a
 * fault-injecting eos_fileops() table is installed (the tests' faultfs sees
 * every call it expects; the ring path has hooks.fileop instead).
 *
 * A job has one struct fop per kind.  The prologue's operations run one
 * at a time (the fallocate needs the descriptor the openat returns; a
 * fixed-file table would allow linking them, but then the record's file
 * identity could not be taken with fstat); while they run the job is in
 * PH_OPEN, builds nothing and admits no later job, so prologues still run
 * in submission order (disk.h).  The commit is one chain linked with
 * IOSQE_IO_LINK -- fdatasync (when configured), close, renameat, fsync of
 * the directory -- in the durability order of the synchronous commit: a
 * failed link cancels the rest (-ECANCELED), so the rename never runs after
 * a failed fdatasync and the directory is never synced for a rename that
 * did not happen.  disk_job.c reads the results once every entry of the
 * chain has completed, and cleans up after a failure on the thread.
 *
 * A completion's user data is the struct fop's address with the low bit
 * set (requests are left as they are).  File operations count in the
 * job's inflight and unsubmitted like requests, so a job is reported only
 * once none is with the kernel (disk.c invariant 2), and a ring reset
 * abandons the unsubmitted ones (res stays FOP_UNSET).
 *
 * The ring's operations name the directory through a descriptor of its own
 * (ring_dirfd, opened at startup), never through dirfd: dirfd is the
 * description the directory lock is held on, and a description the ring
 * refers to lives until the ring's asynchronous teardown after the process
 * died, which would keep the lock from the next owner (test_store_crash
 * saw it).  io_uring's workers share the process's descriptor table, so
 * the lock is still released only after the last of them has exited,
 * after any operation it was running: nothing the ring does lands after
 * the next owner took the directory.
 *
 * hooks.fileop may fail an operation: a NOP then stands in for it (so it
 * never runs) and reports the injected errno, and the operations after it
 * in its chain are not submitted at all (-ECANCELED), as a real failure
 * would cancel them.
 */
#include "disk_int.h"

static const uint8_t fop_opcode[SEL_DISK_FOPS] = {
	[SEL_DISK_FOP_OPEN] = IORING_OP_OPENAT,     [SEL_DISK_FOP_FALLOCATE] = IORING_OP_FALLOCATE,
	[SEL_DISK_FOP_DATASYNC] = IORING_OP_FSYNC,  [SEL_DISK_FOP_CLOSE] = IORING_OP_CLOSE,
	[SEL_DISK_FOP_RENAME] = IORING_OP_RENAMEAT, [SEL_DISK_FOP_DIRSYNC] = IORING_OP_FSYNC,
	[SEL_DISK_FOP_UNLINK] = IORING_OP_UNLINKAT,
};

static const char *const fop_name[SEL_DISK_FOPS] = {
	"openat", "fallocate", "fdatasync", "close", "renameat", "fsync", "unlinkat",
};

int dk_fop_probe(sel_disk *d, enum sel_disk_fileops mode)
{
	d->fileops = false;
	d->fop_ok = 0;
	if (mode == SEL_DISK_FILEOPS_SYNC)
		return 0;
	if (!d->ring_ok)
		return 0;
	d->ring_dirfd = openat(d->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (d->ring_dirfd < 0) {
		if (mode == SEL_DISK_FILEOPS_RING)
			return eos_fail(-errno,
					"disk thread: ring file operations forced, but the "
					"directory cannot be opened again: %s",
					strerror(errno));
		return 0; /* on the thread */
	}
	struct io_uring_probe *p = io_uring_get_probe_ring(&d->ring);
	char lacks[128] = "";
	size_t n = 0;
	for (int k = 0; k < SEL_DISK_FOPS; k++) {
		if (p && io_uring_opcode_supported(p, fop_opcode[k]) &&
		    io_uring_opcode_supported(p, IORING_OP_NOP))
			d->fop_ok |= FOP_BIT(k);
		else if (n < sizeof lacks)
			n += (size_t)snprintf(lacks + n, sizeof lacks - n, "%s%s", n ? ", " : "",
					      fop_name[k]);
	}
	if (p)
		io_uring_free_probe(p);
	if (lacks[0] && mode == SEL_DISK_FILEOPS_RING)
		return eos_fail(-EOPNOTSUPP,
				"disk thread: ring file operations forced, but this kernel's "
				"io_uring lacks %s",
				lacks);
	d->fileops = d->fop_ok != 0;
	return 0;
}

bool dk_fop_usable(sel_disk *d, uint32_t kinds)
{
	if (!d->fileops || (d->fop_ok & kinds) != kinds || d->ring_broken || !d->ring_ok ||
	    !__atomic_load_n(&d->uring, __ATOMIC_RELAXED) || dk_aborting(d))
		return false;
	/* Fault injection through the table: the calls must reach it. */
	if (eos_fileops() != &eos_fileops_libc)
		return false;
	return io_uring_sq_space_left(&d->ring) >= (unsigned)__builtin_popcount(kinds);
}

/* Prepare kind k of c in sqe (the caller checked the kernel has it). */
static void fop_prep_one(sel_disk *d, struct io_ctx *c, struct io_uring_sqe *sqe, uint8_t k, int fd,
			 const char *tmp, uint64_t len)
{
	switch (k) {
	case SEL_DISK_FOP_OPEN: {
		int fl = O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW |
			 (c->odirect ? O_DIRECT : 0);
		io_uring_prep_openat(sqe, d->ring_dirfd, tmp, fl, 0644);
		break;
	}
	case SEL_DISK_FOP_FALLOCATE: io_uring_prep_fallocate(sqe, fd, 0, 0, (off_t)len); break;
	case SEL_DISK_FOP_DATASYNC: io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC); break;
	case SEL_DISK_FOP_CLOSE: io_uring_prep_close(sqe, fd); break;
	case SEL_DISK_FOP_RENAME:
		io_uring_prep_renameat(sqe, d->ring_dirfd, tmp, d->ring_dirfd, c->name, 0);
		break;
	case SEL_DISK_FOP_DIRSYNC: io_uring_prep_fsync(sqe, d->ring_dirfd, 0); break;
	case SEL_DISK_FOP_UNLINK: io_uring_prep_unlinkat(sqe, d->ring_dirfd, c->name, 0); break;
	default: io_uring_prep_nop(sqe); break;
	}
}

void dk_fop_chain(sel_disk *d, struct io_ctx *c, const uint8_t *kinds, int n, int fd,
		  const char *tmp, uint64_t len)
{
	bool cut = false;
	for (int i = 0; i < n; i++) {
		struct fop *f = &c->fops[kinds[i]];
		*f = (struct fop){.owner = c, .res = FOP_UNSET, .kind = kinds[i]};
		if (cut) {
			f->res = -ECANCELED; /* after an injected failure: never submitted */
			continue;
		}
		struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
		if (!sqe) { /* dk_fop_usable checked the space: cannot happen */
			f->res = -EBUSY;
			dk_io_fail(c, -EBUSY, "no submission entry for %s", fop_name[kinds[i]]);
			cut = true;
			continue;
		}
		if (d->hooks.fileop) {
			int e = d->hooks.fileop(d->hooks.ctx, kinds[i]);
			f->inject = e < 0 ? e : 0;
		}
		if (f->inject) {
			io_uring_prep_nop(sqe);
			cut = true;
		} else {
			fop_prep_one(d, c, sqe, kinds[i], fd, tmp, len);
			if (i + 1 < n)
				sqe->flags |= IOSQE_IO_LINK;
		}
		io_uring_sqe_set_data(sqe, (void *)((uintptr_t)f | FOP_TAG));
		f->busy = true;
		d->sq[d->sq_n++] = (struct sqi){c, &f->busy};
		c->unsubmitted++;
		c->fop_pending++;
	}
}

void dk_fop_reaped(sel_disk *d, struct fop *f, int res)
{
	struct io_ctx *c = f->owner;
	f->busy = false;
	if (f->inject && res != -ECANCELED) {
		res = f->inject;
		/* A failed close releases the descriptor all the same. */
		if (f->kind == SEL_DISK_FOP_CLOSE) {
			int fd = c->job->op == SEL_DISK_WRITE_PART && c->wt ? c->wt->fd : c->fd;
			if (fd >= 0)
				close(fd);
		}
	} else if (!f->inject && res != -ECANCELED) {
		STAT_ADD(d, ring_fileops[f->kind], 1);
	}
	f->res = res;
	if (d->hooks.fileop_done)
		d->hooks.fileop_done(d->hooks.ctx, f->kind, res);
	if (--c->fop_pending == 0)
		dk_job_fops_done(d, c);
}
