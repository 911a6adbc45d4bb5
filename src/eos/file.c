/*
 * file.c - opening record files, with or without O_DIRECT; probing whether a
 * directory's filesystem takes direct I/O; creating directory trees
 * (design 2.5 "Transfers, slabs, and record files", 2.10 "Page cache").
 *
 * All record I/O is direct so that disk writes neither grow the page cache
 * nor evict the core file's mappings.  Not every filesystem allows it (older
 * tmpfs, some FUSE and network filesystems refuse O_DIRECT with EINVAL), so
 * the store asks eos_direct_io_probe once per directory and takes the slower
 * buffered path where the answer is no (STYLE.md 5).
 *
 * DESIGN
 *   Opens, reads, writes and unlinks go through eos_fileops() so fault
 *   injection reaches them; mkdir does not (the table has no entry for it and
 *   no test needs to fail it).  The probe checks what the disk thread will
 *   actually do, not just the open: a filesystem may accept O_DIRECT at open
 *   and still refuse aligned I/O, so it writes one aligned block, reads it
 *   back and compares.  Its test file is unlinked as soon as both
 *   descriptors are open, so a crash mid-probe leaves nothing behind.
 *   Stateless apart from the probe's name counter.
 */
#include "eos.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EOS_FILE_MODE 0644

/* "dir/path" for messages: the directory behind dirfd when path is relative
 * and the descriptor names one, else path as given. */
static const char *describe_at(int dirfd, const char *path, char *buf, size_t len)
{
	if (dirfd == AT_FDCWD || path[0] == '/')
		return path;
	char link[64], dir[PATH_MAX];
	snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
	ssize_t n = readlink(link, dir, sizeof dir - 1);
	if (n <= 0)
		return path;
	dir[n] = '\0';
	snprintf(buf, len, "%s/%s", dir, path);
	return buf;
}

int eos_open(int dirfd, const char *path, unsigned flags)
{
	const unsigned known = EOS_O_DIRECT | EOS_O_CREATE | EOS_O_WRITE | EOS_O_TRUNC;
	if (!path || !*path)
		return eos_fail(-EINVAL, "open: empty path");
	if (flags & ~known)
		return eos_fail(-EINVAL,
				"open '%s': unknown flags 0x%x (expected EOS_O_* bits 0x%x)", path,
				flags & ~known, known);
	if ((flags & EOS_O_TRUNC) && !(flags & EOS_O_WRITE))
		return eos_fail(-EINVAL, "open '%s': EOS_O_TRUNC needs EOS_O_WRITE", path);

	int oflags = O_CLOEXEC | O_NOFOLLOW | ((flags & EOS_O_WRITE) ? O_RDWR : O_RDONLY);
	if (flags & EOS_O_CREATE)
		oflags |= O_CREAT | O_EXCL;
	if (flags & EOS_O_TRUNC)
		oflags |= O_TRUNC;
	if (flags & EOS_O_DIRECT)
		oflags |= O_DIRECT;

	int fd = eos_fileops()->openat(dirfd, path, oflags, EOS_FILE_MODE);
	if (fd >= 0)
		return fd;
	int e = errno;
	char where[PATH_MAX + 64];
	const char *name = describe_at(dirfd, path, where, sizeof where);
	if (e == EINVAL && (flags & EOS_O_DIRECT))
		return eos_fail(-EINVAL,
				"open '%s' with O_DIRECT: refused (%s); the filesystem "
				"does not support direct I/O",
				name, strerror(e));
	if (e == EEXIST && (flags & EOS_O_CREATE))
		return eos_fail(-EEXIST, "create '%s': already exists", name);
	if (e == ELOOP)
		return eos_fail(-ELOOP, "open '%s': a symbolic link; refused, not followed", name);
	return eos_fail(-e, "open '%s'%s: %s", name, (flags & EOS_O_WRITE) ? " for writing" : "",
			strerror(e));
}

static const char *file_type(mode_t m)
{
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m) || S_ISBLK(m))
		return "a device";
	if (S_ISLNK(m))
		return "a symbolic link";
	return "not a regular file";
}

int eos_open_regular(int dirfd, const char *name, unsigned flags, const struct eos_file_id *want,
		     struct stat *st_out)
{
	const unsigned known = EOS_O_DIRECT | EOS_O_WRITE;
	if (!name || !*name)
		return eos_fail(-EINVAL, "open: empty path");
	if (flags & ~known)
		return eos_fail(-EINVAL, "open '%s': flags 0x%x are not for an existing file", name,
				flags & ~known);
	int oflags =
		O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | ((flags & EOS_O_WRITE) ? O_RDWR : O_RDONLY);
	if (flags & EOS_O_DIRECT)
		oflags |= O_DIRECT;
	const struct eos_fileops *ops = eos_fileops();
	char where[PATH_MAX + 64];
	int fd = ops->openat(dirfd, name, oflags, 0);
	if (fd < 0) {
		int e = errno;
		const char *nm = describe_at(dirfd, name, where, sizeof where);
		if (e == EINVAL && (flags & EOS_O_DIRECT))
			return eos_fail(-EINVAL,
					"open '%s' with O_DIRECT: refused (%s); the filesystem "
					"does not support direct I/O",
					nm, strerror(e));
		if (e == ELOOP)
			return eos_fail(-ELOOP, "open '%s': a symbolic link; refused, not followed",
					nm);
		if (e == ENXIO || e == EISDIR)
			return eos_fail(-ENXIO, "open '%s': not a regular file; refused", nm);
		return eos_fail(-e, "open '%s'%s: %s", nm,
				(flags & EOS_O_WRITE) ? " for writing" : "", strerror(e));
	}
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) != 0) {
		rc = eos_fail(-errno, "fstat '%s': %s",
			      describe_at(dirfd, name, where, sizeof where), strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		rc = eos_fail(-ENXIO, "'%s' is %s; refused",
			      describe_at(dirfd, name, where, sizeof where), file_type(st.st_mode));
	} else if (want && (want->dev != (uint64_t)st.st_dev || want->ino != (uint64_t)st.st_ino)) {
		rc = eos_fail(-ESTALE,
			      "'%s' is another file (device %llu inode %llu) than the one "
			      "expected (device %llu inode %llu): it was replaced; refused",
			      describe_at(dirfd, name, where, sizeof where),
			      (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
			      (unsigned long long)want->dev, (unsigned long long)want->ino);
	} else {
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
			rc = eos_fail(-errno, "fcntl '%s': %s",
				      describe_at(dirfd, name, where, sizeof where),
				      strerror(errno));
	}
	if (rc) {
		ops->close(fd);
		return rc;
	}
	if (st_out)
		*st_out = st;
	return fd;
}

/* The probe's outcome when an I/O call failed with errno e: EINVAL means
 * the filesystem refuses direct I/O (0); anything else means the probe
 * could not run (negative errno). */
static int probe_io_failed(const char *dir, const char *what, int e)
{
	if (e == EINVAL)
		return eos_fail(0,
				"direct I/O probe in '%s': %s refused with EINVAL; the "
				"filesystem does not support direct I/O",
				dir, what);
	return eos_fail(-e, "direct I/O probe in '%s': %s failed: %s", dir, what, strerror(e));
}

int eos_direct_io_probe(const char *dir)
{
	if (!dir || !*dir)
		return eos_fail(-EINVAL, "direct I/O probe: empty directory name");
	int dfd = eos_fileops()->openat(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (dfd < 0)
		return eos_fail(-errno, "direct I/O probe: cannot open directory '%s': %s", dir,
				strerror(errno));
	int rc = eos_direct_io_probe_at(dfd, dir);
	eos_fileops()->close(dfd);
	return rc;
}

int eos_direct_io_probe_at(int dfd, const char *dir)
{
	static unsigned counter;
	const struct eos_fileops *ops = eos_fileops();
	int wfd = -1, dio = -1, rc;
	void *out = NULL, *in = NULL;
	char name[64];

	if (!dir)
		dir = "the directory";
	/* A plain create first: failing here means the probe cannot run
	 * (read-only, no space, no permission), not that O_DIRECT is refused. */
	for (int tries = 0;; tries++) {
		unsigned n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
		snprintf(name, sizeof name, ".eos-dio-probe.%ld.%u", (long)getpid(), n);
		wfd = eos_open(dfd, name, EOS_O_CREATE | EOS_O_WRITE);
		if (wfd != -EEXIST || tries == 16)
			break;
	}
	if (wfd < 0) {
		rc = eos_fail(wfd, "direct I/O probe in '%s': cannot create a test file: %s", dir,
			      eos_errmsg());
		goto out;
	}
	dio = eos_open(dfd, name, EOS_O_WRITE | EOS_O_DIRECT);
	if (ops->unlinkat(dfd, name, 0) != 0) {
		rc = eos_fail(-errno, "direct I/O probe in '%s': cannot remove test file '%s': %s",
			      dir, name, strerror(errno));
		goto out;
	}
	if (dio == -EINVAL) {
		rc = eos_fail(0, "direct I/O probe in '%s': %s", dir, eos_errmsg());
		goto out;
	}
	if (dio < 0) {
		rc = eos_fail(dio, "direct I/O probe in '%s': %s", dir, eos_errmsg());
		goto out;
	}

	out = eos_aligned_alloc(EOS_ALIGN, EOS_ALIGN);
	in = eos_aligned_alloc(EOS_ALIGN, EOS_ALIGN);
	if (!out || !in) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < EOS_ALIGN; i++)
		((unsigned char *)out)[i] = (unsigned char)(i * 7 + 0x5a);
	ssize_t n = ops->pwrite(dio, out, EOS_ALIGN, 0);
	if (n < 0) {
		rc = probe_io_failed(dir, "an aligned 4 KiB direct write", errno);
		goto out;
	}
	if (n != (ssize_t)EOS_ALIGN) {
		rc = eos_fail(0, "direct I/O probe in '%s': a direct write of %u bytes wrote %zd",
			      dir, EOS_ALIGN, n);
		goto out;
	}
	n = ops->pread(dio, in, EOS_ALIGN, 0);
	if (n < 0) {
		rc = probe_io_failed(dir, "an aligned 4 KiB direct read", errno);
		goto out;
	}
	if (n != (ssize_t)EOS_ALIGN || memcmp(in, out, EOS_ALIGN) != 0) {
		rc = eos_fail(0,
			      "direct I/O probe in '%s': a direct read returned %zd bytes "
			      "that differ from the %u written",
			      dir, n, EOS_ALIGN);
		goto out;
	}
	rc = 1;
out:
	eos_aligned_free(in);
	eos_aligned_free(out);
	if (dio >= 0)
		ops->close(dio);
	if (wfd >= 0)
		ops->close(wfd);
	return rc;
}

/* Create one directory; an existing directory (or a symlink to one) is
 * fine, whatever mkdir said about it. */
static int mkdir_one(const char *full, const char *prefix)
{
	if (mkdir(prefix, 0755) == 0)
		return 0;
	int e = errno;
	struct stat st;
	if (stat(prefix, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return 0;
		return eos_fail(-ENOTDIR, "mkdir '%s': '%s' exists and is not a directory", full,
				prefix);
	}
	return eos_fail(-e, "mkdir '%s': cannot create '%s': %s", full, prefix, strerror(e));
}

int eos_mkdir_p(const char *path)
{
	if (!path || !*path)
		return eos_fail(-EINVAL, "mkdir: empty path");
	char *copy = strdup(path);
	if (!copy)
		return eos_fail(-ENOMEM, "mkdir '%s': out of memory", path);
	int rc = 0;
	/* Each '/' that ends a component ends a prefix to create; the leading
	 * '/' of an absolute path and repeated slashes end none. */
	for (char *p = copy + 1; *p && rc == 0; p++) {
		if (*p != '/' || p[-1] == '/')
			continue;
		*p = '\0';
		rc = mkdir_one(path, copy);
		*p = '/';
	}
	if (rc == 0)
		rc = mkdir_one(path, copy);
	free(copy);
	return rc;
}
