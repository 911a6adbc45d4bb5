/*
 * record_io.c - the record file protocol: the namespace directory, atomic
 * writes (temporary name, fallocate, write, optional fdatasync, rename,
 * directory fsync), compaction by truncation, deletion, and the startup scan
 * that turns a directory back into a list an index can be rebuilt from
 * (design 2.5, the record-file, directory-lock and recovery paragraphs;
 * design 2.3, startup pruning; design 2.12, one owner per directory).
 *
 * DESIGN
 *
 * Every syscall on a record file or on the namespace directory goes through
 * eos_fileops(), so tests inject ENOSPC and EIO anywhere.  (fstat and
 * getdents do not: the table has no entries for them, and neither changes
 * the directory.)  Only files renamed into place are records: a write in
 * progress lives under ".tmp-<name>-<nonce>" in the same directory, so the
 * rename is atomic, and a crash leaves at most a temporary that the next
 * scan removes.  A rename replaces an older file of the same name in one
 * step, so a failed rewrite never loses the committed record.
 *
 * Nothing under the directory is trusted to be what its name says.  Every
 * open of an existing record is O_NOFOLLOW | O_NONBLOCK, requires a regular
 * file and, where the caller knows it, the device and inode it indexed
 * (sel_record_open, sel_record_truncate), so a symbolic link never leads a
 * read or a truncation outside the directory and a FIFO never blocks one;
 * the scan judges every entry with fstatat(AT_SYMLINK_NOFOLLOW) before it
 * opens anything, whatever d_type says.  At open the namespace directory
 * must not be a link and must take a file (SEL_EDIRECTORY otherwise).
 *
 * The scan runs under the namespace directory lock the caller holds, so no
 * one else writes while it deletes.  Header reads dominate its time on a
 * cold cache (one device read per file), so a few threads read headers in
 * parallel; everything else -- validation of the tree, removals, ordering
 * -- runs on the calling thread.  The tree rules follow the index (design
 * 2.3): a record whose tail is the count since its parent links under that
 * parent and needs it; a record holding its full chain stands alone.  An
 * orphan (linked, parent missing) goes with everything that links under
 * it; then childless page-only records go, cascading upwards.  Removals go
 * deepest first, so a crash mid-scan never leaves a child without the
 * parent it links to that the next scan would not also remove.
 *
 * INVARIANTS
 *   1. A successful sel_record_write or sel_record_commit leaves exactly
 *      the named file and no temporary; a failed one leaves the directory
 *      as it was (a temporary only when its unlink itself failed, named in
 *      the message).
 *   2. Every record the scan returns is a regular file that decoded against
 *      the namespace, its name is its key, its length is its row offset or
 *      row end (and at most max_file_bytes), it has no hole, every record it
 *      links under is returned before it and matches its parent link check.
 *   3. The scan opens nothing that is not a regular file, and follows no
 *      symbolic link.
 */
#include "record.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "xxh.h"

/* ---- Directory ---------------------------------------------------------- */

/* Whether errno e says a directory cannot be used by this process (as
 * opposed to a transient or resource failure). */
static bool unusable(int e)
{
	return e == EACCES || e == EPERM || e == EROFS || e == ENOTDIR || e == ELOOP || e == ENOENT;
}

int sel_record_dir_open(const char *base, const sel_record_ns *ns, struct eos_dirlock *lk)
{
	static unsigned probes;
	char path[PATH_MAX];
	lk->fd = -1;
	lk->path = NULL;
	if (!base || !*base)
		return eos_fail(-EINVAL, "record directory: empty base directory");
	if ((size_t)snprintf(path, sizeof path, "%s/%s", base, ns->dirname) >= sizeof path)
		return eos_fail(-ENAMETOOLONG, "record directory: '%s' is too long", base);
	int rc = eos_mkdir_p(path);
	if (rc)
		return eos_fail(unusable(-rc) ? SEL_EDIRECTORY : rc, "record directory '%s': %s",
				path, eos_errmsg());
	rc = eos_dirlock_acquire(lk, path);
	if (rc)
		return eos_fail(unusable(-rc) ? SEL_EDIRECTORY : rc, "%s", eos_errmsg());
	/* Every write creates a temporary here: prove one can be made (as the
	 * process is, capabilities included) before anything is scanned, so a
	 * read-only or foreign directory selects no disk tier instead of
	 * failing later in the middle of the startup. */
	char probe[64];
	snprintf(probe, sizeof probe, SEL_RECORD_TMP_PREFIX "probe-%ld-%u", (long)getpid(),
		 __atomic_fetch_add(&probes, 1, __ATOMIC_RELAXED));
	int fd = eos_open(lk->fd, probe, EOS_O_CREATE | EOS_O_WRITE);
	if (fd == -EEXIST) {
		(void)eos_fileops()->unlinkat(lk->fd, probe, 0); /* a stale probe of a dead pid */
		fd = eos_open(lk->fd, probe, EOS_O_CREATE | EOS_O_WRITE);
	}
	if (fd < 0) {
		rc = fd;
		char msg[EOS_ERRMSG_MAX];
		snprintf(msg, sizeof msg, "%s", eos_errmsg());
		eos_dirlock_release(lk);
		return eos_fail(unusable(-rc) ? SEL_EDIRECTORY : rc,
				"record directory '%s' is not "
				"writable: %s",
				path, msg);
	}
	eos_fileops()->close(fd);
	if (eos_fileops()->unlinkat(lk->fd, probe, 0) != 0 && errno != ENOENT) {
		rc = -errno;
		eos_dirlock_release(lk);
		return eos_fail(unusable(-rc) ? SEL_EDIRECTORY : rc,
				"record directory '%s': cannot "
				"remove a file it created: %s",
				path, strerror(-rc));
	}
	return 0;
}

/* ---- Write protocol ----------------------------------------------------- */

int sel_record_discard(int dirfd, int fd, const char *tmp)
{
	const struct eos_fileops *ops = eos_fileops();
	if (fd >= 0)
		ops->close(fd);
	if (ops->unlinkat(dirfd, tmp, 0) != 0 && errno != ENOENT)
		return eos_fail(-errno, "remove temporary record '%s': %s", tmp, strerror(errno));
	return 0;
}

/* Fail with rc and msg after discarding tmp, naming a failed cleanup too. */
static int fail_discard(int dirfd, int fd, const char *tmp, int rc)
{
	char msg[EOS_ERRMSG_MAX];
	snprintf(msg, sizeof msg, "%s", eos_errmsg());
	if (sel_record_discard(dirfd, fd, tmp) != 0)
		return eos_fail(rc, "%s; and %s (the next scan removes it)", msg, eos_errmsg());
	return eos_fail(rc, "%s", msg);
}

int sel_record_tmp_create(int dirfd, const char *name, uint64_t len, uint64_t nonce, bool *direct,
			  char tmp[SEL_RECORD_TMPNAME_MAX])
{
	const struct eos_fileops *ops = eos_fileops();
	int fd = -EEXIST;
	for (int tries = 0; tries < 16 && fd == -EEXIST; tries++) {
		sel_record_tmp_name(name, nonce + (uint64_t)tries * 0x9e3779b97f4a7c15ull, tmp);
		unsigned fl = EOS_O_CREATE | EOS_O_WRITE | (*direct ? EOS_O_DIRECT : 0);
		fd = eos_open(dirfd, tmp, fl);
		if (fd == -EINVAL && *direct) {
			/* Some kernels create the file before refusing O_DIRECT. */
			ops->unlinkat(dirfd, tmp, 0);
			*direct = false;
			fd = eos_open(dirfd, tmp, EOS_O_CREATE | EOS_O_WRITE);
		}
	}
	if (fd < 0)
		return eos_fail(fd, "write record '%s': %s", name, eos_errmsg());
	if (len > 0 && ops->fallocate(fd, 0, 0, (off_t)len) != 0 && errno != EOPNOTSUPP &&
	    errno != ENOSYS) {
		int e = errno;
		eos_fail(-e, "write record '%s': preallocating %" PRIu64 " bytes: %s", name, len,
			 strerror(e));
		return fail_discard(dirfd, fd, tmp, -e);
	}
	return fd;
}

int sel_record_commit(int dirfd, int fd, const char *tmp, const char *name, unsigned flags,
		      bool *committed)
{
	const struct eos_fileops *ops = eos_fileops();
	*committed = false;
	if ((flags & SEL_COMMIT_DATASYNC) && ops->fdatasync(fd) != 0) {
		int e = errno;
		eos_fail(-e, "write record '%s': fdatasync: %s", name, strerror(e));
		return fail_discard(dirfd, fd, tmp, -e);
	}
	if (ops->close(fd) != 0) {
		int e = errno;
		eos_fail(-e, "write record '%s': close: %s", name, strerror(e));
		return fail_discard(dirfd, -1, tmp, -e);
	}
	if (ops->renameat(dirfd, tmp, dirfd, name) != 0) {
		int e = errno;
		eos_fail(-e, "write record '%s': rename into place: %s", name, strerror(e));
		return fail_discard(dirfd, -1, tmp, -e);
	}
	*committed = true;
	if (!(flags & SEL_COMMIT_NO_DIR_FSYNC) && ops->fsync(dirfd) != 0) {
		int e = errno;
		return eos_fail(-e,
				"write record '%s': fsync of the directory after the rename: %s "
				"(the file is in place but may not survive a crash)",
				name, strerror(e));
	}
	return 0;
}

int sel_record_open(int dirfd, const char *name, bool *direct, const struct eos_file_id *id,
		    struct stat *st)
{
	int fd = eos_open_regular(dirfd, name, *direct ? EOS_O_DIRECT : 0, id, st);
	if (fd == -EINVAL && *direct) {
		*direct = false;
		fd = eos_open_regular(dirfd, name, 0, id, st);
	}
	if (fd == -ELOOP || fd == -ENXIO || fd == -ESTALE)
		return eos_fail(SEL_ECORRUPT,
				"the file under the record's name is not the record: %s",
				eos_errmsg());
	return fd;
}

bool sel_record_sparse(int fd, uint64_t size, uint64_t *at)
{
	if (size == 0)
		return false;
	off_t h = lseek(fd, 0, SEEK_HOLE);
	if (h < 0 || (uint64_t)h >= size)
		return false; /* no hole, or no SEEK_HOLE: nothing to say */
	if (at)
		*at = (uint64_t)h;
	return true;
}

int sel_record_truncate(int dirfd, const char *name, const sel_record_span *span,
			const struct eos_file_id *id, bool *had_row)
{
	const struct eos_fileops *ops = eos_fileops();
	struct stat st;
	int rc = 0;
	int fd = eos_open_regular(dirfd, name, EOS_O_WRITE, id, &st);
	if (fd == -ELOOP || fd == -ENXIO || fd == -ESTALE)
		return eos_fail(SEL_ECORRUPT,
				"compact record: the file under the record's name is not "
				"the record: %s",
				eos_errmsg());
	if (fd < 0)
		return eos_fail(fd, "compact record: %s", eos_errmsg());
	if ((uint64_t)st.st_size == span->row_off) {
		if (had_row)
			*had_row = false;
		goto out;
	}
	if ((uint64_t)st.st_size != span->row_end) {
		rc = eos_fail(SEL_ECORRUPT,
			      "compact record '%s': length %" PRIu64 " is neither its "
			      "page-only %" PRIu64 " nor its full %" PRIu64,
			      name, (uint64_t)st.st_size, span->row_off, span->row_end);
		goto out;
	}
	if (ops->ftruncate(fd, (off_t)span->row_off) != 0) {
		rc = eos_fail(-errno, "compact record '%s': truncate to %" PRIu64 ": %s", name,
			      span->row_off, strerror(errno));
		goto out;
	}
	if (had_row)
		*had_row = true;
out:
	ops->close(fd);
	return rc;
}

int sel_record_unlink(int dirfd, const char *name, bool *existed)
{
	if (existed)
		*existed = true;
	if (eos_fileops()->unlinkat(dirfd, name, 0) == 0)
		return 0;
	if (errno == ENOENT) {
		if (existed)
			*existed = false;
		return 0;
	}
	return eos_fail(-errno, "remove record '%s': %s", name, strerror(errno));
}

/* pwrite all of buf at off through the table. */
static int write_all(int fd, const void *buf, uint64_t len, uint64_t off, const char *name)
{
	const struct eos_fileops *ops = eos_fileops();
	const uint8_t *p = buf;
	while (len) {
		size_t n = len > (1u << 30) ? (1u << 30) : (size_t)len;
		ssize_t w = ops->pwrite(fd, p, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return eos_fail(-errno,
					"write record '%s': write of %zu bytes at %" PRIu64 ": %s",
					name, n, off, strerror(errno));
		if (w == 0)
			return eos_fail(-EIO,
					"write record '%s': write at %" PRIu64 " made no progress",
					name, off);
		p += w;
		off += (uint64_t)w;
		len -= (uint64_t)w;
	}
	return 0;
}

int sel_record_write(int dirfd, const sel_record_ns *ns, const sel_record_desc *d,
		     void *const *pages, bool row, const struct iovec *row_iov, uint32_t row_n,
		     const struct sel_record_write_opts *o)
{
	const sel_record_layout *l = &ns->layout;
	struct sel_record_write_opts opts = o ? *o : (struct sel_record_write_opts){0};
	sel_record_span s;
	char name[SEL_RECORD_NAME_MAX], tmp[SEL_RECORD_TMPNAME_MAX];
	struct sel_record_piece *plan = NULL;
	uint8_t *head = NULL;
	int fd = -1, rc;

	sel_record_name(&d->key, name);
	if ((rc = sel_record_span_of(&l->sz, d, &s)) != 0)
		return rc;
	if (row) {
		plan = calloc(row_n ? row_n : 1, sizeof(*plan));
		if (!plan)
			return eos_fail(-ENOMEM, "write record '%s': out of memory", name);
		if ((rc = sel_record_row_plan(l, d->flags, row_iov, row_n, plan)) != 0)
			goto out;
	}
	head = eos_aligned_alloc(EOS_ALIGN, s.header_bytes + s.cksum_bytes);
	if (!head) {
		rc = eos_fail(-ENOMEM, "write record '%s': out of memory", name);
		goto out;
	}
	for (uint32_t i = 0; i < d->tail; i++) {
		sel_record_zero_padding(l, d->flags, pages[i]); /* version 4 */
		uint64_t h = XXH3_64bits(pages[i], s.page_stride);
		for (int b = 0; b < 8; b++)
			head[s.cksum_off + 8 * (uint64_t)i + b] = (uint8_t)(h >> (8 * b));
	}
	uint64_t row_ck = row ? sel_record_row_checksum(row_iov, row_n) : 0;
	rc = sel_record_encode(ns, d, row_ck, opts.created_ns ? opts.created_ns : eos_wall_ns(),
			       SEL_RECORD_VERSION, head, s.header_bytes);
	if (rc < 0)
		goto out;
	bool direct = opts.direct;
	fd = sel_record_tmp_create(dirfd, name, row ? s.row_end : s.row_off,
				   opts.nonce ? opts.nonce : eos_now_ns(), &direct, tmp);
	if (fd < 0) {
		rc = fd;
		fd = -1;
		goto out;
	}
	rc = write_all(fd, head, s.header_bytes + s.cksum_bytes, 0, name);
	for (uint32_t i = 0; rc == 0 && i < d->tail; i++)
		rc = write_all(fd, pages[i], s.page_stride,
			       s.page_off + (uint64_t)i * s.page_stride, name);
	for (uint32_t i = 0; rc == 0 && row && i < row_n; i++)
		rc = write_all(fd, plan[i].addr, plan[i].len, s.row_off + plan[i].off, name);
	if (rc) {
		rc = fail_discard(dirfd, fd, tmp, rc);
		fd = -1;
		goto out;
	}
	bool committed;
	rc = sel_record_commit(dirfd, fd, tmp, name,
			       (opts.datasync ? SEL_COMMIT_DATASYNC : 0) |
				       (opts.no_dir_fsync ? SEL_COMMIT_NO_DIR_FSYNC : 0),
			       &committed);
	fd = -1;
out:
	if (fd >= 0)
		eos_fileops()->close(fd);
	eos_aligned_free(head);
	free(plan);
	return rc < 0 ? rc : 0;
}

/* ---- Scan --------------------------------------------------------------- */

enum ent_state {
	ENT_CANDIDATE = 0, /* name parsed; header not read yet */
	ENT_OK,            /* valid; kept unless the tree rules remove it */
	ENT_UNREADABLE,    /* open or read failed: neither kept nor removed */
	ENT_IGNORED,       /* not a regular file */
	ENT_INVALID,       /* remove: see reason */
	ENT_ORPHAN,        /* remove: parent named, absent, tail not the full chain */
	ENT_DESCENDANT,    /* remove: links under an orphan */
	ENT_PRUNED,        /* remove: childless page-only */
	ENT_HELD,          /* links under an unreadable file: neither kept nor removed */
	ENT_BADLINK,       /* remove: its parent link check does not match the parent */
};

struct ent {
	char name[SEL_RECORD_NAME_MAX];
	sel_key name_key;
	uint8_t state;
	int reason;        /* ENT_INVALID: the decode error (SEL_E*), or a REASON_* */
	int64_t parent;    /* index of the linked parent, -1 if none */
	uint32_t children; /* linked children still kept */
	bool emitted;
	uint64_t size;
	sel_scan_record r;
};

struct scan_ctx {
	int dirfd;
	const sel_record_ns *ns;
	bool direct;
	uint64_t max_bytes;
	struct ent *e;
	size_t n;
	size_t next; /* atomic work counter */
};

#define REASON_NAME 1
#define REASON_SIZE 2
#define REASON_LARGE 3
#define REASON_SPARSE 4

/* Read and judge one file's header (a scan thread).  The entry is judged
 * by fstatat first, without following a link: anything but a regular file
 * is passed over unopened, so a FIFO never blocks the scan and a link never
 * leads outside the directory, whatever d_type said.  The open that follows
 * is O_NOFOLLOW | O_NONBLOCK and must find the same file (an entry swapped
 * in between is unreadable: neither kept nor removed). */
static void scan_one(struct scan_ctx *c, struct ent *e, uint8_t *buf)
{
	const struct eos_fileops *ops = eos_fileops();
	struct stat st;
	sel_record_header h;
	if (fstatat(c->dirfd, e->name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
		e->state = ENT_UNREADABLE;
		return;
	}
	if (!S_ISREG(st.st_mode)) {
		e->state = ENT_IGNORED;
		return;
	}
	struct eos_file_id id = {(uint64_t)st.st_dev, (uint64_t)st.st_ino};
	int fd = eos_open_regular(c->dirfd, e->name, c->direct ? EOS_O_DIRECT : 0, &id, &st);
	if (fd == -EINVAL && c->direct)
		fd = eos_open_regular(c->dirfd, e->name, 0, &id, &st);
	if (fd < 0) {
		e->state = ENT_UNREADABLE;
		return;
	}
	e->r.id = id;
	e->size = (uint64_t)st.st_size;
	e->r.mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	if (e->size < SEL_RECORD_HEADER_MIN) {
		e->state = ENT_INVALID;
		e->reason = SEL_EFORMAT;
		goto out;
	}
	ssize_t got = ops->pread(fd, buf, SEL_RECORD_HEADER_MIN, 0);
	if (got < 0) {
		e->state = ENT_UNREADABLE;
		goto out;
	}
	size_t have = (size_t)got;
	int hb = sel_record_header_bytes(buf, have);
	if (hb > (int)SEL_RECORD_HEADER_MIN && e->size >= (uint64_t)hb) {
		got = ops->pread(fd, buf + SEL_RECORD_HEADER_MIN,
				 (size_t)hb - SEL_RECORD_HEADER_MIN, SEL_RECORD_HEADER_MIN);
		if (got < 0) {
			e->state = ENT_UNREADABLE;
			goto out;
		}
		have += (size_t)got;
	}
	int rc = hb < 0 ? hb : sel_record_decode(buf, have, c->ns, &h);
	if (rc) {
		e->state = ENT_INVALID;
		e->reason = rc;
		goto out;
	}
	if (!sel_key_eq(&h.d.key, &e->name_key)) {
		e->state = ENT_INVALID;
		e->reason = REASON_NAME;
		goto out;
	}
	if (e->size != h.span.row_off && e->size != h.span.row_end) {
		e->state = ENT_INVALID;
		e->reason = REASON_SIZE;
		goto out;
	}
	/* Before anything is charged to the budget: a file that can never fit
	 * it, or whose blocks do not cover its length (a sparse file claiming
	 * a huge tail), would make the store evict good records for it. */
	if (c->max_bytes && e->size > c->max_bytes) {
		e->state = ENT_INVALID;
		e->reason = REASON_LARGE;
		goto out;
	}
	if (sel_record_sparse(fd, e->size, NULL)) {
		e->state = ENT_INVALID;
		e->reason = REASON_SPARSE;
		goto out;
	}
	e->state = ENT_OK;
	e->r.d = h.d;
	e->r.has_row = e->size == h.span.row_end;
	e->r.version = h.version;
	e->r.created_ns = h.created_ns;
	e->r.file_bytes = e->size;
	e->r.span = h.span;
out:
	ops->close(fd);
}

static void *scan_thread(void *arg)
{
	struct scan_ctx *c = arg;
	uint8_t *buf = eos_aligned_alloc(EOS_ALIGN, SEL_RECORD_HEADER_MAX);
	for (;;) {
		size_t i = __atomic_fetch_add(&c->next, 1, __ATOMIC_RELAXED);
		if (i >= c->n)
			break;
		if (!buf) {
			c->e[i].state = ENT_UNREADABLE;
			continue;
		}
		scan_one(c, &c->e[i], buf);
	}
	eos_aligned_free(buf);
	return NULL;
}

/* Key -> entry index, open addressing over the kept entries. */
struct keymap {
	int64_t *slot;
	size_t mask;
};

static size_t key_hash(const sel_key *k)
{
	uint64_t h = k->consumed * 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < 8; i++)
		h ^= (uint64_t)k->digest.b[i] << (8 * i);
	h ^= h >> 29;
	return (size_t)(h * 0xbf58476d1ce4e5b9ull);
}

static int keymap_init(struct keymap *m, size_t n)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap *= 2;
	m->slot = malloc(cap * sizeof(*m->slot));
	if (!m->slot)
		return -ENOMEM;
	memset(m->slot, 0xff, cap * sizeof(*m->slot));
	m->mask = cap - 1;
	return 0;
}

static void keymap_put(struct keymap *m, const struct ent *e, int64_t idx)
{
	size_t i = key_hash(&e[idx].name_key) & m->mask;
	while (m->slot[i] >= 0)
		i = (i + 1) & m->mask;
	m->slot[i] = idx;
}

static int64_t keymap_get(const struct keymap *m, const struct ent *e, const sel_key *k)
{
	for (size_t i = key_hash(k) & m->mask; m->slot[i] >= 0; i = (i + 1) & m->mask)
		if (sel_key_eq(&e[m->slot[i]].name_key, k))
			return m->slot[i];
	return -1;
}

static int by_depth_desc(const void *a, const void *b, void *base)
{
	const struct ent *e = base, *x = &e[*(const size_t *)a], *y = &e[*(const size_t *)b];
	uint64_t cx = x->r.d.key.consumed, cy = y->r.d.key.consumed;
	return cx < cy ? 1 : cx > cy ? -1 : 0;
}

static int by_access(const void *a, const void *b, void *base)
{
	const struct ent *e = base, *x = &e[*(const size_t *)a], *y = &e[*(const size_t *)b];
	if (x->r.mtime_ns != y->r.mtime_ns)
		return x->r.mtime_ns < y->r.mtime_ns ? -1 : 1;
	uint64_t cx = x->r.d.key.consumed, cy = y->r.d.key.consumed;
	if (cx != cy)
		return cx < cy ? -1 : 1;
	return memcmp(x->r.d.key.digest.b, y->r.d.key.digest.b, SEL_DIGEST_BYTES);
}

static bool is_removal(uint8_t st)
{
	return st == ENT_INVALID || st == ENT_ORPHAN || st == ENT_DESCENDANT || st == ENT_PRUNED ||
	       st == ENT_BADLINK;
}

void sel_scan_free(sel_scan *s)
{
	if (!s)
		return;
	free(s->rec);
	s->rec = NULL;
	s->n = 0;
}

/* Read the directory: temporaries into *tmps, parsable names into *ents. */
static int scan_list(int dirfd, sel_scan_stats *st, struct ent **ents, size_t *n_ents, char ***tmps,
		     size_t *n_tmps)
{
	const struct eos_fileops *ops = eos_fileops();
	size_t cap = 0, tcap = 0;
	int rc = 0;
	int fd = ops->openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (fd < 0)
		return eos_fail(-errno, "record scan: cannot open the record directory: %s",
				strerror(errno));
	DIR *d = fdopendir(fd);
	if (!d) {
		rc = eos_fail(-errno, "record scan: cannot read the record directory: %s",
			      strerror(errno));
		ops->close(fd);
		return rc;
	}
	for (;;) {
		errno = 0;
		struct dirent *de = readdir(d);
		if (!de) {
			if (errno)
				rc = eos_fail(-errno, "record scan: reading the directory: %s",
					      strerror(errno));
			break;
		}
		const char *nm = de->d_name;
		if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0)
			continue;
		st->entries++;
		if (sel_record_is_tmp_name(nm)) {
			if (*n_tmps == tcap) {
				tcap = tcap ? 2 * tcap : 16;
				char **nt = realloc(*tmps, tcap * sizeof(*nt));
				if (!nt)
					goto nomem;
				*tmps = nt;
			}
			if (!((*tmps)[*n_tmps] = strdup(nm)))
				goto nomem;
			(*n_tmps)++;
			continue;
		}
		sel_key k;
		/* d_type only short-cuts: DT_UNKNOWN (filesystems without it)
		 * and DT_REG are judged by fstatat in scan_one. */
		if (strlen(nm) >= SEL_RECORD_NAME_MAX || sel_record_name_parse(nm, &k) != 0 ||
		    (de->d_type != DT_REG && de->d_type != DT_UNKNOWN)) {
			st->ignored++;
			continue;
		}
		if (*n_ents == cap) {
			cap = cap ? 2 * cap : 1024;
			struct ent *ne = realloc(*ents, cap * sizeof(*ne));
			if (!ne)
				goto nomem;
			*ents = ne;
		}
		struct ent *e = &(*ents)[(*n_ents)++];
		memset(e, 0, sizeof(*e));
		memcpy(e->name, nm, strlen(nm) + 1); /* shorter than the array, checked above */
		e->name_key = k;
		e->parent = -1;
	}
	closedir(d);
	return rc;
nomem:
	closedir(d);
	return eos_fail(-ENOMEM, "record scan: out of memory listing the directory");
}

/* Decide the tree: orphans and their descendants, then pruning. */
static int scan_tree(struct ent *e, size_t n, uint32_t page_tokens)
{
	struct keymap m;
	size_t *stack = NULL, *queue = NULL;
	int rc = 0;
	if (keymap_init(&m, n) != 0)
		return eos_fail(-ENOMEM, "record scan: out of memory for %zu records", n);
	stack = malloc((n ? n : 1) * sizeof(*stack));
	queue = malloc((n ? n : 1) * sizeof(*queue));
	if (!stack || !queue) {
		rc = eos_fail(-ENOMEM, "record scan: out of memory for %zu records", n);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (e[i].state == ENT_OK || e[i].state == ENT_UNREADABLE)
			keymap_put(&m, e, (int64_t)i);

	/* Links, and orphans: a linked record whose parent is not there. */
	for (size_t i = 0; i < n; i++) {
		if (e[i].state != ENT_OK || !sel_record_links_parent(&e[i].r.d, page_tokens))
			continue;
		int64_t p = keymap_get(&m, e, &e[i].r.d.parent);
		if (p < 0)
			e[i].state = ENT_ORPHAN;
		else if (e[i].r.d.parent_check && e[p].state == ENT_OK &&
			 e[i].r.d.parent_check != sel_record_parent_check(&e[p].r.d.bucket))
			e[i].state =
				ENT_BADLINK; /* named another record than it was written under */
		else
			e[i].parent = p;
	}
	/* Descendants: walk up each chain to a decided node; the verdict of
	 * the top applies to the whole path (removed under an orphan, held
	 * under an unreadable file).  A mark per node keeps it O(n). */
	for (size_t i = 0; i < n; i++) {
		if (e[i].state != ENT_OK || e[i].emitted)
			continue;
		size_t depth = 0, x = i;
		uint8_t verdict = ENT_OK;
		for (;;) {
			uint8_t s = e[x].state;
			if (s == ENT_ORPHAN || s == ENT_DESCENDANT || s == ENT_BADLINK) {
				verdict = ENT_DESCENDANT;
				break;
			}
			if (s == ENT_UNREADABLE || s == ENT_HELD) {
				verdict = ENT_HELD;
				break;
			}
			stack[depth++] = x;
			if (e[x].emitted || e[x].parent < 0)
				break;
			x = (size_t)e[x].parent;
		}
		for (size_t k = 0; k < depth; k++) {
			if (verdict != ENT_OK)
				e[stack[k]].state = verdict;
			else
				e[stack[k]].emitted = true; /* decided: alive */
		}
	}
	for (size_t i = 0; i < n; i++)
		e[i].emitted = false;

	/* Children among the kept, then prune childless page-only records. */
	for (size_t i = 0; i < n; i++)
		if ((e[i].state == ENT_OK || e[i].state == ENT_HELD) && e[i].parent >= 0)
			e[e[i].parent].children++;
	size_t qn = 0;
	for (size_t i = 0; i < n; i++)
		if (e[i].state == ENT_OK && !e[i].r.has_row && e[i].children == 0)
			queue[qn++] = i;
	while (qn) {
		size_t x = queue[--qn];
		e[x].state = ENT_PRUNED;
		if (e[x].parent >= 0) {
			struct ent *p = &e[e[x].parent];
			if (--p->children == 0 && !p->r.has_row && p->state == ENT_OK)
				queue[qn++] = (size_t)e[x].parent;
		}
	}
out:
	free(m.slot);
	free(stack);
	free(queue);
	return rc;
}

const char *sel_scan_why_name(enum sel_scan_why why)
{
	switch (why) {
	case SEL_SCAN_TMP: return "temporary";
	case SEL_SCAN_FORMAT: return "format";
	case SEL_SCAN_CHECKSUM: return "header checksum";
	case SEL_SCAN_IDENTITY: return "identity";
	case SEL_SCAN_LAYOUT: return "layout";
	case SEL_SCAN_NAME: return "name";
	case SEL_SCAN_SIZE: return "size";
	case SEL_SCAN_ORPHAN: return "orphan";
	case SEL_SCAN_DESCENDANT: return "descendant of an orphan";
	case SEL_SCAN_PRUNED: return "childless page-only";
	case SEL_SCAN_LARGE: return "too large";
	case SEL_SCAN_SPARSE: return "sparse";
	case SEL_SCAN_LINK: return "parent link";
	}
	return "?";
}

/* Why a removed entry goes (is_removal(e->state)). */
static enum sel_scan_why why_of(const struct ent *e)
{
	switch (e->state) {
	case ENT_ORPHAN: return SEL_SCAN_ORPHAN;
	case ENT_DESCENDANT: return SEL_SCAN_DESCENDANT;
	case ENT_PRUNED: return SEL_SCAN_PRUNED;
	case ENT_BADLINK: return SEL_SCAN_LINK;
	default: break;
	}
	switch (e->reason) {
	case REASON_LARGE: return SEL_SCAN_LARGE;
	case REASON_SPARSE: return SEL_SCAN_SPARSE;
	case SEL_ECORRUPT: return SEL_SCAN_CHECKSUM;
	case SEL_EIDENTITY: return SEL_SCAN_IDENTITY;
	case SEL_ELAYOUT: return SEL_SCAN_LAYOUT;
	case REASON_NAME: return SEL_SCAN_NAME;
	case REASON_SIZE: return SEL_SCAN_SIZE;
	default: return SEL_SCAN_FORMAT;
	}
}

static void count_invalid(sel_scan_stats *st, int reason)
{
	switch (reason) {
	case SEL_ECORRUPT: st->bad_checksum++; break;
	case SEL_EIDENTITY: st->bad_identity++; break;
	case SEL_ELAYOUT: st->bad_layout++; break;
	case REASON_NAME: st->bad_name++; break;
	case REASON_SIZE: st->bad_size++; break;
	case REASON_LARGE: st->bad_large++; break;
	case REASON_SPARSE: st->bad_sparse++; break;
	default: st->bad_format++; break;
	}
}

/* Temporaries of interrupted writes.  A directory by such a name is not
 * one (nothing of ours makes directories here): left alone, counted. */
static void scan_tmps(int dirfd, const struct sel_scan_opts *opts, char **tmps, size_t n_tmps,
		      sel_scan_stats *st)
{
	const struct eos_fileops *ops = eos_fileops();
	for (size_t i = 0; i < n_tmps; i++) {
		int err = 0;
		struct stat tst;
		if (fstatat(dirfd, tmps[i], &tst, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISDIR(tst.st_mode)) {
			st->tmp_dirs++;
			continue;
		}
		if (opts->dry_run || ops->unlinkat(dirfd, tmps[i], 0) == 0 || errno == ENOENT) {
			st->tmp_removed++;
		} else {
			err = -errno;
			st->unlink_failed++;
		}
		if (opts->on_remove)
			opts->on_remove(opts->ctx, tmps[i], SEL_SCAN_TMP, 0, err);
	}
}

/* Headers, in parallel (at most opts->threads readers, 16 by default, one
 * per 64 files), then the counts of what they found. */
static void scan_headers(int dirfd, const sel_record_ns *ns, const struct sel_scan_opts *opts,
			 struct ent *e, size_t n, sel_scan_stats *st)
{
	pthread_t th[64];
	struct scan_ctx c = {.dirfd = dirfd,
			     .ns = ns,
			     .direct = opts->direct,
			     .max_bytes = opts->max_file_bytes,
			     .e = e,
			     .n = n};
	uint32_t want = opts->threads ? opts->threads : 16, started = 0;
	if (want > 64)
		want = 64;
	if (want > n / 64 + 1)
		want = (uint32_t)(n / 64 + 1);
	for (; started + 1 < want; started++)
		if (pthread_create(&th[started], NULL, scan_thread, &c) != 0)
			break;
	scan_thread(&c);
	for (uint32_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	for (size_t i = 0; i < n; i++) {
		if (e[i].state == ENT_INVALID)
			count_invalid(st, e[i].reason);
		else if (e[i].state == ENT_UNREADABLE) {
			st->unreadable++;
			st->bytes_stuck += e[i].size;
		} else if (e[i].state == ENT_IGNORED)
			st->ignored++;
	}
}

/* Removals, deepest first (order: room for n indices). */
static void scan_remove(int dirfd, const struct sel_scan_opts *opts, struct ent *e, size_t n,
			size_t *order, sel_scan_stats *st)
{
	const struct eos_fileops *ops = eos_fileops();
	size_t nr = 0;
	for (size_t i = 0; i < n; i++)
		if (is_removal(e[i].state))
			order[nr++] = i;
	qsort_r(order, nr, sizeof(*order), by_depth_desc, e);
	for (size_t k = 0; k < nr; k++) {
		struct ent *x = &e[order[k]];
		if (x->state == ENT_BADLINK)
			st->bad_link++;
		else if (x->state == ENT_ORPHAN)
			st->orphans++;
		else if (x->state == ENT_DESCENDANT)
			st->descendants++;
		else if (x->state == ENT_PRUNED)
			st->pruned++;
		int err = 0;
		if (opts->dry_run || ops->unlinkat(dirfd, x->name, 0) == 0 || errno == ENOENT) {
			st->bytes_removed += x->size;
		} else {
			err = -errno;
			st->unlink_failed++;
			st->bytes_stuck += x->size;
		}
		if (opts->on_remove)
			opts->on_remove(opts->ctx, x->name, why_of(x), x->size, err);
	}
}

/* Survivors in access order, linked parents first, into out. */
static int scan_emit(struct ent *e, size_t n, size_t *order, sel_scan *out)
{
	sel_scan_stats *st = &out->st;
	size_t nk = 0;
	for (size_t i = 0; i < n; i++)
		if (e[i].state == ENT_OK)
			order[nk++] = i;
	qsort_r(order, nk, sizeof(*order), by_access, e);
	out->rec = malloc((nk ? nk : 1) * sizeof(*out->rec));
	size_t *chain = malloc((nk ? nk : 1) * sizeof(*chain));
	if (!out->rec || !chain) {
		free(chain);
		return eos_fail(-ENOMEM, "record scan: out of memory");
	}
	for (size_t k = 0; k < nk; k++) {
		size_t depth = 0;
		for (int64_t x = (int64_t)order[k]; x >= 0 && !e[x].emitted; x = e[x].parent)
			chain[depth++] = (size_t)x;
		while (depth) {
			struct ent *x = &e[chain[--depth]];
			x->emitted = true;
			out->rec[out->n++] = x->r;
			st->records++;
			st->with_row += x->r.has_row;
			st->bytes += x->size;
		}
	}
	free(chain);
	return 0;
}

int sel_record_scan(int dirfd, const sel_record_ns *ns, const struct sel_scan_opts *o,
		    sel_scan *out)
{
	struct sel_scan_opts opts = o ? *o : (struct sel_scan_opts){0};
	struct ent *e = NULL;
	size_t n = 0, n_tmps = 0, *order = NULL;
	char **tmps = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	sel_scan_stats *st = &out->st;
	if ((rc = scan_list(dirfd, st, &e, &n, &tmps, &n_tmps)) != 0)
		goto out;
	scan_tmps(dirfd, &opts, tmps, n_tmps, st);
	scan_headers(dirfd, ns, &opts, e, n, st);
	if ((rc = scan_tree(e, n, ns->layout.sz.page_tokens)) != 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		if (e[i].state == ENT_HELD) {
			st->unreadable++;
			st->bytes_stuck += e[i].size;
		}
	}
	if (!(order = malloc((n ? n : 1) * sizeof(*order)))) {
		rc = eos_fail(-ENOMEM, "record scan: out of memory");
		goto out;
	}
	scan_remove(dirfd, &opts, e, n, order, st);
	rc = scan_emit(e, n, order, out);
out:
	for (size_t i = 0; i < n_tmps; i++)
		free(tmps[i]);
	free(tmps);
	free(order);
	free(e);
	if (rc)
		sel_scan_free(out);
	return rc;
}
