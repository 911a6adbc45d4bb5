/*
 * test_eos_file.c - aligned buffers, eos_open, the direct I/O probe,
 * eos_mkdir_p, and fault injection through the file-ops table.
 */
#include "eos_test.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char *tmp;

static void cleanup(void)
{
	eos_fileops_set(NULL);
	if (tmp)
		test_rmtree(tmp);
}

static void test_aligned_alloc(void)
{
	static const size_t aligns[] = {sizeof(void *), 16, 512, 4096, 65536};
	static const size_t lens[] = {0, 1, 100, 4095, 4096, 4097, 1 << 20};
	for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
		for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
			size_t align = aligns[a], len = lens[l];
			unsigned char *p = eos_aligned_alloc(align, len);
			CHECKF(p != NULL, "align %zu len %zu: %s", align, len, eos_errmsg());
			CHECKF((uintptr_t)p % align == 0, "%p not %zu-aligned", (void *)p, align);
			/* Zero over the whole rounded length, which is usable. */
			size_t rounded = eos_round_up(len ? len : 1, align);
			for (size_t i = 0; i < rounded; i++)
				CHECKF(p[i] == 0, "byte %zu of %zu not zero", i, rounded);
			memset(p, 0xa5, rounded);
			eos_aligned_free(p);
		}
	}
	eos_aligned_free(NULL);

	static const size_t bad_aligns[] = {0, 1, 2, 3, 24, 4097};
	for (size_t i = 0; i < sizeof bad_aligns / sizeof bad_aligns[0]; i++) {
		errno = 0;
		CHECK(eos_aligned_alloc(bad_aligns[i], 64) == NULL);
		CHECK(errno == EINVAL);
		CHECK_MSG("not a power of two");
	}
	/* A length whose rounding overflows fails cleanly (never reaches
	 * malloc, which a sanitizer would abort on). */
	errno = 0;
	CHECK(eos_aligned_alloc(4096, SIZE_MAX - 10) == NULL);
	CHECK(errno == ENOMEM);
	CHECK_MSG("overflows");
	CHECK(eos_round_up(4097, 4096) == 8192 && eos_round_up(4096, 4096) == 4096);
	CHECK(eos_round_up(0, 4096) == 0);
}

static void test_open(int dfd, bool direct_ok)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/f", tmp);

	/* Create: read-write, close-on-exec, exclusive. */
	int fd = eos_open(AT_FDCWD, path, EOS_O_CREATE | EOS_O_WRITE);
	CHECK_OK(fd);
	int fl = fcntl(fd, F_GETFL);
	CHECK((fl & O_ACCMODE) == O_RDWR);
	CHECK(!(fl & O_DIRECT));
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	CHECK(pwrite(fd, "hello", 5, 0) == 5);
	close(fd);
	struct stat st;
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644); /* umask 022 */

	CHECK_RC(eos_open(AT_FDCWD, path, EOS_O_CREATE | EOS_O_WRITE), -EEXIST);
	CHECK_MSG("already exists");
	CHECK_MSG(path);

	/* Read-only by default: writes fail. */
	fd = eos_open(AT_FDCWD, path, 0);
	CHECK_OK(fd);
	CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
	CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	CHECK(pwrite(fd, "x", 1, 0) == -1 && errno == EBADF);
	char got[8] = {0};
	CHECK(pread(fd, got, sizeof got, 0) == 5 && memcmp(got, "hello", 5) == 0);
	close(fd);

	/* Relative to a directory descriptor; truncation. */
	fd = eos_open(dfd, "f", EOS_O_WRITE | EOS_O_TRUNC);
	CHECK_OK(fd);
	CHECK(fstat(fd, &st) == 0 && st.st_size == 0);
	close(fd);

	/* A missing file is named with its directory even when opened
	 * relative to a descriptor. */
	CHECK_RC(eos_open(dfd, "missing", 0), -ENOENT);
	CHECK_MSG(tmp);
	CHECK_MSG("/missing'");

	CHECK_RC(eos_open(AT_FDCWD, path, 1u << 7), -EINVAL);
	CHECK_MSG("unknown flags");
	CHECK_RC(eos_open(AT_FDCWD, path, EOS_O_TRUNC), -EINVAL);
	CHECK_MSG("EOS_O_TRUNC needs EOS_O_WRITE");
	CHECK_RC(eos_open(AT_FDCWD, "", 0), -EINVAL);
	CHECK_RC(eos_open(AT_FDCWD, NULL, 0), -EINVAL);

	fd = eos_open(dfd, "f", EOS_O_WRITE | EOS_O_DIRECT);
	if (direct_ok) {
		CHECK_OK(fd);
		CHECK(fcntl(fd, F_GETFL) & O_DIRECT);
		close(fd);
	} else if (fd < 0) {
		CHECK(fd == -EINVAL);
		CHECK_MSG("O_DIRECT");
	} else {
		close(fd);
	}
}

/* Files the probe left in tmp. */
static int probe_files(void)
{
	DIR *d = opendir(tmp);
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (strncmp(e->d_name, ".eos-dio-probe", 14) == 0)
			n++;
	closedir(d);
	return n;
}

static void test_probe(void)
{
	int rc = eos_direct_io_probe(tmp);
	CHECKF(rc >= 0, "probe of %s: %d: %s", tmp, rc, eos_errmsg());
	if (rc == 0)
		printf("note: %s refuses direct I/O (%s); testing the refusal path only\n", tmp,
		       eos_errmsg());
	else
		printf("direct I/O accepted in %s\n", tmp);
	CHECK(probe_files() == 0); /* it leaves nothing behind */

	char missing[4096];
	snprintf(missing, sizeof missing, "%s/no/such/dir", tmp);
	CHECK_RC(eos_direct_io_probe(missing), -ENOENT);
	CHECK_MSG(missing);
	CHECK_RC(eos_direct_io_probe(""), -EINVAL);
}

static void test_mkdir_p(void)
{
	char path[4096], file[4096];
	struct stat st;

	snprintf(path, sizeof path, "%s/a/b//c/", tmp);
	CHECK_OK(eos_mkdir_p(path));
	snprintf(path, sizeof path, "%s/a/b/c", tmp);
	CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
	CHECK_OK(eos_mkdir_p(path)); /* existing is fine */
	CHECK_OK(eos_mkdir_p(tmp));
	CHECK_OK(eos_mkdir_p("/"));

	/* A symlink to a directory counts as one. */
	snprintf(file, sizeof file, "%s/link", tmp);
	CHECK(symlink(path, file) == 0);
	snprintf(path, sizeof path, "%s/link/d", tmp);
	CHECK_OK(eos_mkdir_p(path));

	/* A file on the way. */
	snprintf(file, sizeof file, "%s/plain", tmp);
	int fd = open(file, O_CREAT | O_WRONLY, 0644);
	CHECK(fd >= 0);
	close(fd);
	snprintf(path, sizeof path, "%s/plain/x/y", tmp);
	CHECK_RC(eos_mkdir_p(path), -ENOTDIR);
	CHECK_MSG("not a directory");
	CHECK_MSG(file);
	CHECK_RC(eos_mkdir_p(file), -ENOTDIR);

	CHECK_RC(eos_mkdir_p(""), -EINVAL);
	CHECK_RC(eos_mkdir_p(NULL), -EINVAL);

	/* Relative paths work from the cwd. */
	char cwd[4096];
	CHECK(getcwd(cwd, sizeof cwd) != NULL);
	CHECK(chdir(tmp) == 0);
	CHECK_OK(eos_mkdir_p("rel/x"));
	CHECK(stat("rel/x", &st) == 0 && S_ISDIR(st.st_mode));
	CHECK(chdir(cwd) == 0);
}

/* ---- fault injection ---------------------------------------------------- */

static int inject_errno;
static unsigned pwrite_calls, openat_calls;

static ssize_t failing_pwrite(int fd, const void *buf, size_t len, off_t off)
{
	(void)fd, (void)buf, (void)len, (void)off;
	pwrite_calls++;
	errno = inject_errno;
	return -1;
}

static int failing_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	(void)dirfd, (void)path, (void)flags, (void)mode;
	openat_calls++;
	errno = EMFILE;
	return -1;
}

/* A filesystem that refuses O_DIRECT at open, as older tmpfs does. */
static int no_direct_openat(int dirfd, const char *path, int flags, mode_t mode)
{
	if (flags & O_DIRECT) {
		errno = EINVAL;
		return -1;
	}
	return eos_fileops_libc.openat(dirfd, path, flags, mode);
}

static void test_fileops(bool direct_ok)
{
	CHECK(eos_fileops() == &eos_fileops_libc);
	struct eos_fileops ops = eos_fileops_libc;
	ops.pwrite = failing_pwrite;
	eos_fileops_set(&ops);
	CHECK(eos_fileops() == &ops);

	/* Observed by anyone who writes through the table. */
	char path[4096];
	snprintf(path, sizeof path, "%s/inj", tmp);
	int fd = eos_open(AT_FDCWD, path, EOS_O_CREATE | EOS_O_WRITE);
	CHECK_OK(fd);
	inject_errno = ENOSPC;
	CHECK(eos_fileops()->pwrite(fd, "x", 1, 0) == -1 && errno == ENOSPC);
	CHECK(pwrite_calls == 1);
	/* The probe is one such writer: ENOSPC means it could not run, EINVAL
	 * that direct I/O is refused. */
	if (direct_ok) {
		CHECK_RC(eos_direct_io_probe(tmp), -ENOSPC);
		CHECK_MSG("No space left on device");
		CHECK(pwrite_calls == 2);
		inject_errno = EINVAL;
		CHECK_RC(eos_direct_io_probe(tmp), 0);
		CHECK_MSG("does not support direct I/O");
		CHECK(pwrite_calls == 3);
	}

	/* Refused at open: the probe says no, eos_open says why. */
	struct eos_fileops nodirect = eos_fileops_libc;
	nodirect.openat = no_direct_openat;
	eos_fileops_set(&nodirect);
	CHECK_RC(eos_direct_io_probe(tmp), 0);
	CHECK_MSG("does not support direct I/O");
	CHECK_MSG(tmp);
	CHECK_RC(eos_open(AT_FDCWD, path, EOS_O_DIRECT), -EINVAL);
	CHECK_MSG("with O_DIRECT");
	eos_fileops_set(&ops);

	/* eos_open goes through openat. */
	ops.openat = failing_openat;
	CHECK_RC(eos_open(AT_FDCWD, path, 0), -EMFILE);
	CHECK(openat_calls == 1);
	CHECK_MSG(path);

	/* Restoring the libc table restores real I/O. */
	eos_fileops_set(NULL);
	CHECK(eos_fileops() == &eos_fileops_libc);
	CHECK(eos_fileops()->pwrite(fd, "x", 1, 0) == 1);
	CHECK(eos_fileops()->close(fd) == 0);
	unsigned before = pwrite_calls;
	if (direct_ok)
		CHECK_RC(eos_direct_io_probe(tmp), 1);
	CHECK(pwrite_calls == before);
	CHECK(probe_files() == 0); /* not even after failed probes */
}

int main(void)
{
	umask(022);
	tmp = test_mkdtemp("eos-file");
	CHECK(tmp != NULL);
	test_fail_cb = cleanup;

	int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dfd >= 0);
	int probe = eos_direct_io_probe(tmp);
	CHECKF(probe >= 0, "probe: %s", eos_errmsg());

	test_aligned_alloc();
	test_open(dfd, probe == 1);
	test_probe();
	test_mkdir_p();
	test_fileops(probe == 1);

	close(dfd);
	test_fail_cb = NULL;
	cleanup();
	printf("ok\n");
	return 0;
}
