/*
 * lock.c - the record directory lock: one process owner per record
 * directory for its whole I/O lifetime (design 2.5, the loader's exclusive
 * nonblocking lock; design 2.12 "Each record directory has one process
 * owner").
 *
 * The loader takes the lock before scanning the directory, and the store
 * keeps the descriptor as the dirfd of every *at() call until it closes, so
 * the directory it locked is the directory it writes, even if the path is
 * renamed underneath it.  The directory's own name must not be a symbolic
 * link (O_NOFOLLOW): a link there is refused, never followed, so a store
 * never works in the link's target.  A second store on the same directory, in this
 * process or another, fails at once instead of deleting files the first one
 * is writing.
 *
 * DESIGN
 *   flock(LOCK_EX | LOCK_NB) on an O_DIRECTORY descriptor.  flock locks
 *   belong to the open file description, so a second open of the directory
 *   conflicts even within one process (unlike POSIX record locks, which a
 *   process never conflicts with), and the kernel drops the lock when the
 *   last descriptor of that description closes, so a killed process never
 *   leaves a stale lock.  There is no lock file to clean up.
 *
 *   Release only closes the descriptor and never calls LOCK_UN: a child
 *   forked while the lock is held shares the description, and LOCK_UN from
 *   the child would unlock the parent's directory.  The flip side, written
 *   in eos.h: a forked child that keeps its inherited copy keeps the
 *   directory locked after the parent releases, until it exits or execs
 *   (the descriptor is O_CLOEXEC).
 *
 * INVARIANTS
 *   1. A lock is held exactly when path != NULL; then fd is the locked
 *      directory descriptor.  A zeroed or released lock has path == NULL
 *      (a released or failed one also fd == -1).
 */
#include "eos.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* The pid holding the flock on the directory behind fd, from /proc/locks,
 * or 0 when it cannot be told (no /proc, a pid in another namespace).  Only
 * for the message: the lock itself never depends on it. */
static long lock_holder(int fd)
{
	struct stat st;
	if (fstat(fd, &st) != 0)
		return 0;
	char key[64];
	snprintf(key, sizeof key, "%02x:%02x:%lu", major(st.st_dev), minor(st.st_dev),
		 (unsigned long)st.st_ino);
	FILE *f = fopen("/proc/locks", "re");
	if (!f)
		return 0;
	/* "1: FLOCK  ADVISORY  WRITE 5292 fe:00:247066 0 EOF"; waiters carry
	 * "->" after the number and are skipped. */
	char line[256];
	long pid = 0;
	while (!pid && fgets(line, sizeof line, f)) {
		char *save = NULL, *prev = NULL;
		bool flock_line = false;
		for (char *t = strtok_r(line, " \t\n", &save); t;
		     t = strtok_r(NULL, " \t\n", &save)) {
			if (strcmp(t, "->") == 0)
				break;
			if (strcmp(t, "FLOCK") == 0)
				flock_line = true;
			if (flock_line && prev && strcmp(t, key) == 0) {
				pid = strtol(prev, NULL, 10);
				break;
			}
			prev = t;
		}
	}
	fclose(f);
	return pid > 0 ? pid : 0;
}

int eos_dirlock_acquire(struct eos_dirlock *lk, const char *dir)
{
	lk->fd = -1;
	lk->path = NULL;
	if (!dir || !*dir)
		return eos_fail(-EINVAL, "lock directory: empty directory name");
	char *path = strdup(dir);
	if (!path)
		return eos_fail(-ENOMEM, "lock directory '%s': out of memory", dir);
	/* O_NOFOLLOW: a symbolic link at the directory's own name is refused,
	 * so a store never scans, writes or deletes in a link's target. */
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		free(path);
		if (e == ENOENT)
			return eos_fail(-ENOENT, "lock directory '%s': no such directory", dir);
		struct stat ls;
		if ((e == ENOTDIR || e == ELOOP) && lstat(dir, &ls) == 0 && S_ISLNK(ls.st_mode))
			e = ELOOP; /* O_DIRECTORY | O_NOFOLLOW on a link says ENOTDIR */
		if (e == ENOTDIR)
			return eos_fail(-ENOTDIR, "lock directory '%s': not a directory", dir);
		if (e == ELOOP)
			return eos_fail(-ELOOP,
					"lock directory '%s': a symbolic link; refused, not "
					"followed",
					dir);
		return eos_fail(-e, "lock directory '%s': cannot open it: %s", dir, strerror(e));
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		long holder = e == EWOULDBLOCK ? lock_holder(fd) : 0;
		close(fd);
		free(path);
		if (e == EWOULDBLOCK && holder == (long)getpid())
			return eos_fail(-EBUSY,
					"lock directory '%s': already locked by another "
					"store in this process (pid %ld); one owner at a time",
					dir, holder);
		if (e == EWOULDBLOCK && holder)
			return eos_fail(-EBUSY,
					"lock directory '%s': already locked by pid %ld; "
					"one owner at a time",
					dir, holder);
		if (e == EWOULDBLOCK)
			return eos_fail(-EBUSY,
					"lock directory '%s': already locked by another "
					"store (this or another process); one owner at a time",
					dir);
		return eos_fail(-e, "lock directory '%s': flock failed: %s", dir, strerror(e));
	}
	lk->fd = fd;
	lk->path = path;
	return 0;
}

void eos_dirlock_release(struct eos_dirlock *lk)
{
	if (!lk || !lk->path)
		return;
	close(lk->fd); /* drops the lock with the last reference; never LOCK_UN */
	free(lk->path);
	lk->fd = -1;
	lk->path = NULL;
}
