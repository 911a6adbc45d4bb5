/*
 * test_eos_lock.c - the record directory lock: one owner at a time, within
 * a process and across processes; release and death free it; a forked
 * child's copy neither unlocks the parent nor outlives its own release.
 */
#include "eos_test.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *tmp;
static char dir[4096];

static void cleanup(void)
{
	if (tmp)
		test_rmtree(tmp);
}

static void put(int fd, char c) { CHECK(write(fd, &c, 1) == 1); }

static char get(int fd)
{
	char c = 0;
	CHECK(read(fd, &c, 1) == 1);
	return c;
}

/* Exit status of child pid; 255 if it did not exit normally. */
static int reap(pid_t pid)
{
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

/* In a child: fail with a line on stderr and a distinct status. */
#define CHILD_CHECK(cond, code)                                                                    \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "child: %s:%d: %s (msg: %s)\n", __FILE__, __LINE__, #cond, \
				eos_errmsg());                                                     \
			_exit(code);                                                               \
		}                                                                                  \
	} while (0)

static void test_same_process(void)
{
	struct eos_dirlock a, b;
	CHECK_OK(eos_dirlock_acquire(&a, dir));
	CHECK(a.fd >= 0 && a.path && strcmp(a.path, dir) == 0);

	/* The descriptor is a dirfd. */
	int fd = openat(a.fd, "x", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	close(fd);
	CHECK(unlinkat(a.fd, "x", 0) == 0);

	/* A second opener in the same process fails at once. */
	CHECK_RC(eos_dirlock_acquire(&b, dir), -EBUSY);
	CHECK(b.fd == -1 && b.path == NULL);
	CHECK_MSG(dir);
	CHECK_MSG("this process");
	eos_dirlock_release(&b); /* a failed lock releases as a no-op */

	/* Another spelling of the same directory is the same lock. */
	char other[4200];
	snprintf(other, sizeof other, "%s/./", dir);
	CHECK_RC(eos_dirlock_acquire(&b, other), -EBUSY);
	CHECK_MSG(other);

	eos_dirlock_release(&a);
	CHECK(a.fd == -1 && a.path == NULL);
	eos_dirlock_release(&a); /* twice is fine */

	CHECK_OK(eos_dirlock_acquire(&b, other));
	eos_dirlock_release(&b);
}

static void test_forked_child(void)
{
	struct eos_dirlock a;
	CHECK_OK(eos_dirlock_acquire(&a, dir));

	int to_child[2], to_parent[2];
	CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		test_fail_cb = NULL; /* the parent owns the cleanup */
		/* Drop the inherited copy: this must not unlock the parent. */
		eos_dirlock_release(&a);
		struct eos_dirlock c;
		int rc = eos_dirlock_acquire(&c, dir);
		CHILD_CHECK(rc == -EBUSY, 2);
		CHILD_CHECK(strstr(eos_errmsg(), dir) != NULL, 3);
		char pidtext[64];
		snprintf(pidtext, sizeof pidtext, "pid %ld", (long)getppid());
		if (!strstr(eos_errmsg(), pidtext))
			fprintf(stderr, "note: holder pid not shown: %s\n", eos_errmsg());
		put(to_parent[1], 'b');
		CHILD_CHECK(get(to_child[0]) == 'r', 4); /* parent released */
		rc = eos_dirlock_acquire(&c, dir);
		CHILD_CHECK(rc == 0, 5);
		put(to_parent[1], 'l');
		CHILD_CHECK(get(to_child[0]) == 'q', 6);
		eos_dirlock_release(&c);
		_exit(0);
	}
	CHECK(get(to_parent[0]) == 'b');
	/* The child's release did not unlock us. */
	struct eos_dirlock b;
	CHECK_RC(eos_dirlock_acquire(&b, dir), -EBUSY);
	eos_dirlock_release(&a);
	put(to_child[1], 'r');
	CHECK(get(to_parent[0]) == 'l');
	/* Now the child holds it. */
	CHECK_RC(eos_dirlock_acquire(&b, dir), -EBUSY);
	CHECK_MSG(dir);
	put(to_child[1], 'q');
	CHECK_RC(reap(pid), 0);
	CHECK_OK(eos_dirlock_acquire(&b, dir));
	eos_dirlock_release(&b);
	close(to_child[0]), close(to_child[1]), close(to_parent[0]), close(to_parent[1]);
}

/* A killed owner leaves no stale lock. */
static void test_killed_owner(void)
{
	int to_parent[2];
	CHECK(pipe(to_parent) == 0);
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		test_fail_cb = NULL;
		struct eos_dirlock c;
		CHILD_CHECK(eos_dirlock_acquire(&c, dir) == 0, 2);
		put(to_parent[1], 'l');
		for (;;)
			pause();
	}
	CHECK(get(to_parent[0]) == 'l');
	struct eos_dirlock b;
	CHECK_RC(eos_dirlock_acquire(&b, dir), -EBUSY);
	char pidtext[64];
	snprintf(pidtext, sizeof pidtext, "pid %ld", (long)pid);
	if (strstr(eos_errmsg(), pidtext))
		printf("holder named: %s\n", eos_errmsg());
	else
		printf("note: /proc/locks did not name the holder: %s\n", eos_errmsg());
	CHECK(kill(pid, SIGKILL) == 0);
	CHECK(reap(pid) == 255);
	CHECK_OK(eos_dirlock_acquire(&b, dir));
	eos_dirlock_release(&b);
	close(to_parent[0]), close(to_parent[1]);
}

static void test_bad_dirs(void)
{
	struct eos_dirlock lk;
	char path[4200];
	snprintf(path, sizeof path, "%s/missing", tmp);
	CHECK_RC(eos_dirlock_acquire(&lk, path), -ENOENT);
	CHECK_MSG("no such directory");
	CHECK_MSG(path);
	CHECK(lk.fd == -1 && lk.path == NULL);

	snprintf(path, sizeof path, "%s/file", tmp);
	int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	close(fd);
	CHECK_RC(eos_dirlock_acquire(&lk, path), -ENOTDIR);
	CHECK_MSG("not a directory");
	CHECK_MSG(path);

	CHECK_RC(eos_dirlock_acquire(&lk, ""), -EINVAL);
	CHECK_RC(eos_dirlock_acquire(&lk, NULL), -EINVAL);

	/* A zeroed lock releases as a no-op: descriptor 0 stays open. */
	int fd0 = fcntl(0, F_GETFD);
	struct eos_dirlock z = {0};
	eos_dirlock_release(&z);
	CHECK(fcntl(0, F_GETFD) == fd0);
	eos_dirlock_release(NULL);
}

int main(void)
{
	tmp = test_mkdtemp("eos-lock");
	CHECK(tmp != NULL);
	test_fail_cb = cleanup;
	snprintf(dir, sizeof dir, "%s/records", tmp);
	CHECK(mkdir(dir, 0755) == 0);

	test_same_process();
	test_forked_child();
	test_killed_owner();
	test_bad_dirs();

	test_fail_cb = NULL;
	cleanup();
	printf("ok\n");
	return 0;
}
