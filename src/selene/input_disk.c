/*
 * input_disk.c - the disk tier of reusable CPU input records: .input files
 * in a record directory, written atomically, read and verified whole,
 * indexed within a fixed bound (design 2.13; docs/record-format.md "Input
 * records"; see input_disk.h for the contract).
 *
 * DESIGN
 *   The index is allocated whole at open: SEL_INPUT_DISK_RECORDS entries, a
 *   hash table and a free stack, well inside the 1 MiB host allowance
 *   (checked at compile time), so steady-state indexing allocates nothing.
 *   Entries carry their kind, key and charged bytes and sit on one LRU list
 *   (reads and writes move them to the tail); evictions take the head.
 *   File names are the record's own (input_record.h): the key is in the
 *   name, so the scan needs no reads, and a file whose header disagrees
 *   with its name fails its first read (SEL_EIDENTITY) and is removed.
 *   Opening trusts nothing: openat relative to the directory with
 *   O_NOFOLLOW (a link is a miss, never followed) and O_NONBLOCK (a FIFO
 *   planted under a record name cannot hang the reader), then fstat must
 *   say a regular file of a plausible size before a byte is read.
 *   Writes follow the .ckpt protocol (record_io.c): a temporary named after
 *   the record, O_CREAT | O_EXCL | O_NOFOLLOW, the whole record, optional
 *   fdatasync, rename, optional directory fsync.  A failure removes the
 *   temporary; if even that fails, its bytes stay charged and writes stop
 *   (design 2.13), since the directory's usage would otherwise be unknown.
 *   Every syscall on a file goes through eos_fileops(), so tests inject
 *   faults anywhere.
 *   Only names of this module are touched: "src-" / "prep-" records, and
 *   temporaries whose embedded name is one of them.  Checkpoint records and
 *   their temporaries are never looked at, which is what keeps input
 *   eviction and checkpoint eviction independent (design 2.13).
 *
 * INVARIANTS (sel_input_disk_check)
 *   1. records = entries in use = entries on the LRU list = entries in the
 *      hash table, <= max_records; each (kind, key) once.
 *   2. bytes = sum of the entries' bytes + the bytes of stuck temporaries;
 *      without a budget, bytes <= limit when a limit is set.
 */
#include "input_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eos.h"
#include "internal.h"

#define NONE UINT32_MAX
#define BUCKETS 8192u /* a power of two, twice the record bound */
#define TMP_PREFIX ".tmp-"

struct ent {
	sel_input_key key;
	uint64_t bytes;
	uint32_t kind;
	uint32_t hnext;      /* hash chain */
	uint32_t prev, next; /* LRU, or the free stack's link */
	uint32_t used;
};

_Static_assert((uint64_t)SEL_INPUT_DISK_RECORDS * sizeof(struct ent) + BUCKETS * sizeof(uint32_t) <=
		       SEL_INPUT_DISK_ALLOWANCE,
	       "the input index fits its 1 MiB host allowance");

struct sel_input_disk {
	int dirfd;
	struct sel_input_disk_opts o;
	uint32_t max;
	struct ent *e;     /* [max] */
	uint32_t *buckets; /* [BUCKETS] */
	uint32_t free_head;
	uint32_t head, tail; /* LRU: least recently used at head */
	uint64_t own_used;   /* without a budget: charged bytes */
	uint64_t stuck;      /* bytes of temporaries that could not be removed */
	uint64_t nonce;
	pthread_mutex_t st_mu; /* stats only */
	struct sel_input_disk_stats st;
};

/* ---- Budget ---------------------------------------------------------------- */

static int charge(sel_input_disk *d, uint64_t bytes)
{
	if (d->o.budget)
		return d->o.budget->reserve(d->o.budget->ctx, bytes);
	if (d->o.limit_bytes && d->own_used + bytes > d->o.limit_bytes)
		return -ENOSPC;
	d->own_used += bytes;
	return 0;
}

static void uncharge(sel_input_disk *d, uint64_t bytes)
{
	if (d->o.budget)
		d->o.budget->release(d->o.budget->ctx, bytes);
	else
		d->own_used -= bytes;
}

/* ---- Index ----------------------------------------------------------------- */

static uint32_t bucket(uint32_t kind, const sel_input_key *k)
{
	return (uint32_t)((sel_get_u64(k->b) ^ kind) & (BUCKETS - 1));
}

static uint32_t lookup(const sel_input_disk *d, uint32_t kind, const sel_input_key *k)
{
	for (uint32_t i = d->buckets[bucket(kind, k)]; i != NONE; i = d->e[i].hnext)
		if (d->e[i].kind == kind && sel_input_key_eq(&d->e[i].key, k))
			return i;
	return NONE;
}

static void lru_unlink(sel_input_disk *d, uint32_t i)
{
	struct ent *x = &d->e[i];
	if (x->prev != NONE)
		d->e[x->prev].next = x->next;
	else
		d->head = x->next;
	if (x->next != NONE)
		d->e[x->next].prev = x->prev;
	else
		d->tail = x->prev;
	x->prev = x->next = NONE;
}

static void lru_append(sel_input_disk *d, uint32_t i)
{
	struct ent *x = &d->e[i];
	x->next = NONE;
	x->prev = d->tail;
	if (d->tail != NONE)
		d->e[d->tail].next = i;
	else
		d->head = i;
	d->tail = i;
}

static void stats_update(sel_input_disk *d)
{
	pthread_mutex_lock(&d->st_mu);
	uint64_t n = 0, b = d->stuck;
	for (uint32_t i = d->head; i != NONE; i = d->e[i].next) {
		n++;
		b += d->e[i].bytes;
	}
	d->st.records = n;
	d->st.bytes = b;
	pthread_mutex_unlock(&d->st_mu);
}

#define COUNT(d, field)                                                                            \
	do {                                                                                       \
		pthread_mutex_lock(&(d)->st_mu);                                                   \
		(d)->st.field++;                                                                   \
		pthread_mutex_unlock(&(d)->st_mu);                                                 \
	} while (0)

/* Index a charged file; the caller checked it is absent and a slot is free. */
static void index_add(sel_input_disk *d, uint32_t kind, const sel_input_key *k, uint64_t bytes)
{
	uint32_t i = d->free_head;
	struct ent *x = &d->e[i];
	d->free_head = x->next;
	x->key = *k;
	x->kind = kind;
	x->bytes = bytes;
	x->used = 1;
	uint32_t b = bucket(kind, k);
	x->hnext = d->buckets[b];
	d->buckets[b] = i;
	lru_append(d, i);
}

/* Drop entry i from the index and give back its charge (the file is the
 * caller's business). */
static void index_del(sel_input_disk *d, uint32_t i)
{
	struct ent *x = &d->e[i];
	uint32_t *p = &d->buckets[bucket(x->kind, &x->key)];
	while (*p != i)
		p = &d->e[*p].hnext;
	*p = x->hnext;
	lru_unlink(d, i);
	uncharge(d, x->bytes);
	x->used = 0;
	x->next = d->free_head;
	d->free_head = i;
}

static uint32_t index_count(const sel_input_disk *d)
{
	uint32_t n = 0;
	for (uint32_t i = d->head; i != NONE; i = d->e[i].next)
		n++;
	return n;
}

/* Unlink entry i's file and drop it.  0, or the unlink's errno (the entry
 * is dropped either way: a file we cannot remove we cannot trust). */
static int remove_entry(sel_input_disk *d, uint32_t i)
{
	char name[SEL_INPUT_NAME_LEN];
	sel_input_name(d->e[i].kind, &d->e[i].key, name);
	int rc = 0;
	if (eos_fileops()->unlinkat(d->dirfd, name, 0) != 0 && errno != ENOENT)
		rc = eos_fail(-errno, "input records: remove '%s': %s", name, strerror(errno));
	index_del(d, i);
	return rc;
}

/* ---- Names --------------------------------------------------------------- */

/* Whether name is a temporary of one of our writes:
 * ".tmp-<input name>-<16 hex>". */
static bool is_our_tmp(const char *name)
{
	size_t n = strlen(name);
	if (n < 5 + 17 || strncmp(name, TMP_PREFIX, 5) != 0 || name[n - 17] != '-')
		return false;
	for (size_t i = n - 16; i < n; i++)
		if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
			return false;
	char inner[SEL_INPUT_NAME_LEN + 1];
	size_t k = n - 17 - 5;
	if (k >= sizeof inner)
		return false;
	memcpy(inner, name + 5, k);
	inner[k] = 0;
	uint32_t kind;
	sel_input_key key;
	return sel_input_name_parse(inner, &kind, &key) == 0;
}

/* ---- Open and close ---------------------------------------------------------- */

struct found {
	uint32_t kind;
	sel_input_key key;
	uint64_t bytes;
	uint64_t mtime_ns;
	char name[SEL_INPUT_NAME_LEN];
};

static int by_mtime(const void *a, const void *b)
{
	const struct found *x = a, *y = b;
	if (x->mtime_ns != y->mtime_ns)
		return x->mtime_ns < y->mtime_ns ? -1 : 1;
	return memcmp(x->key.b, y->key.b, SEL_INPUT_KEY_BYTES);
}

/* Remove name at open; a failure fails the open. */
static int scan_unlink(sel_input_disk *d, const char *name, const char *why)
{
	if (eos_fileops()->unlinkat(d->dirfd, name, 0) != 0 && errno != ENOENT)
		return eos_fail(-errno,
				"input records: cannot remove %s '%s': %s (its disk usage "
				"would be unknown)",
				why, name, strerror(errno));
	d->st.scan_removed++;
	return 0;
}

static int scan(sel_input_disk *d)
{
	int fd = dup(d->dirfd);
	if (fd < 0)
		return eos_fail(-errno, "input records: dup of the directory: %s", strerror(errno));
	DIR *dir = fdopendir(fd);
	if (!dir) {
		int e = errno;
		close(fd);
		return eos_fail(-e, "input records: cannot read the directory: %s", strerror(e));
	}
	rewinddir(dir);
	struct found *f = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	struct dirent *de;
	errno = 0;
	while (!rc && (de = readdir(dir))) {
		const char *nm = de->d_name;
		if (is_our_tmp(nm)) {
			rc = scan_unlink(d, nm, "the temporary");
			continue;
		}
		uint32_t kind;
		sel_input_key key;
		if (sel_input_name_parse(nm, &kind, &key) != 0)
			continue; /* not ours: checkpoints, their temporaries, anything */
		struct stat st;
		if (fstatat(d->dirfd, nm, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			if (errno == ENOENT)
				continue;
			rc = eos_fail(-errno, "input records: stat '%s': %s", nm, strerror(errno));
			break;
		}
		if (S_ISDIR(st.st_mode))
			continue; /* cannot be unlinked, holds no record: never indexed */
		if (!S_ISREG(st.st_mode) || st.st_size < (off_t)SEL_INPUT_ALIGN ||
		    (uint64_t)st.st_size > SEL_INPUT_FILE_MAX) {
			rc = scan_unlink(d, nm, "the invalid record");
			continue;
		}
		if ((rc = eos_grow((void **)&f, &cap, n + 1, sizeof *f))) {
			rc = eos_fail(-ENOMEM, "input records: out of memory");
			break;
		}
		f[n].kind = kind;
		f[n].key = key;
		f[n].bytes = (uint64_t)st.st_size;
		f[n].mtime_ns =
			(uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
		memcpy(f[n].name, nm, strlen(nm) + 1); /* a parsed name: shorter than the field */
		n++;
		errno = 0;
	}
	if (!rc && errno)
		rc = eos_fail(-errno, "input records: reading the directory: %s", strerror(errno));
	closedir(dir);
	if (rc) {
		free(f);
		return rc;
	}
	/* Newest first: charge what fits the bound and the budget. */
	if (n)
		qsort(f, n, sizeof *f, by_mtime);
	size_t keep_from = n;
	uint32_t kept = 0;
	for (size_t i = n; i-- > 0;) {
		if (kept == d->max || charge(d, f[i].bytes) != 0)
			break;
		kept++;
		keep_from = i;
	}
	for (size_t i = 0; i < keep_from && !rc; i++)
		rc = scan_unlink(d, f[i].name, "the record beyond the bound or the limit");
	for (size_t i = keep_from; i < n; i++) {
		if (rc) {
			uncharge(d, f[i].bytes);
			continue;
		}
		index_add(d, f[i].kind, &f[i].key, f[i].bytes);
	}
	free(f);
	return rc;
}

int sel_input_disk_open(int dirfd, const struct sel_input_disk_opts *o, sel_input_disk **out)
{
	*out = NULL;
	sel_input_disk *d = calloc(1, sizeof *d);
	if (!d)
		return eos_fail(-ENOMEM, "input records: out of memory");
	d->dirfd = dirfd;
	if (o)
		d->o = *o;
	d->max = d->o.max_records && d->o.max_records < SEL_INPUT_DISK_RECORDS
			 ? d->o.max_records
			 : SEL_INPUT_DISK_RECORDS;
	d->e = calloc(d->max, sizeof *d->e);
	d->buckets = malloc(BUCKETS * sizeof *d->buckets);
	if (!d->e || !d->buckets) {
		free(d->e);
		free(d->buckets);
		free(d);
		return eos_fail(-ENOMEM, "input records: out of memory for the index");
	}
	for (uint32_t b = 0; b < BUCKETS; b++)
		d->buckets[b] = NONE;
	for (uint32_t i = 0; i < d->max; i++)
		d->e[i].next = i + 1 < d->max ? i + 1 : NONE;
	d->free_head = 0;
	d->head = d->tail = NONE;
	d->nonce = eos_now_ns() ^ ((uint64_t)getpid() << 40);
	pthread_mutex_init(&d->st_mu, NULL);
	int rc = scan(d);
	if (rc) {
		sel_input_disk_close(d);
		return rc;
	}
	stats_update(d);
	*out = d;
	return 0;
}

void sel_input_disk_close(sel_input_disk *d)
{
	if (!d)
		return;
	while (d->head != NONE)
		index_del(d, d->head);
	if (d->stuck)
		uncharge(d, d->stuck);
	pthread_mutex_destroy(&d->st_mu);
	free(d->e);
	free(d->buckets);
	free(d);
}

bool sel_input_disk_contains(sel_input_disk *d, uint32_t kind, const sel_input_key *key)
{
	return lookup(d, kind, key) != NONE;
}

/* ---- Reading ---------------------------------------------------------------- */

/* Open entry i's file for reading: a regular file, not followed through a
 * link.  The descriptor, or a negative errno with a message. */
static int open_record(sel_input_disk *d, const char *name, uint64_t *size)
{
	const struct eos_fileops *ops = eos_fileops();
	int fd = ops->openat(d->dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
	if (fd < 0)
		return eos_fail(-errno, "input record '%s': open: %s", name, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		ops->close(fd);
		return eos_fail(-e, "input record '%s': fstat: %s", name, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		ops->close(fd);
		return eos_fail(-EINVAL, "input record '%s' is not a regular file", name);
	}
	if ((uint64_t)st.st_size > SEL_INPUT_FILE_MAX || st.st_size < (off_t)SEL_INPUT_ALIGN) {
		ops->close(fd);
		return eos_fail(SEL_EFORMAT, "input record '%s': %lld bytes cannot be a record",
				name, (long long)st.st_size);
	}
	*size = (uint64_t)st.st_size;
	return fd;
}

static int read_all(int fd, uint8_t *buf, uint64_t len, const char *name)
{
	const struct eos_fileops *ops = eos_fileops();
	uint64_t off = 0;
	while (off < len) {
		size_t n = len - off > (1u << 30) ? (1u << 30) : (size_t)(len - off);
		ssize_t r = ops->pread(fd, buf + off, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return eos_fail(-errno, "input record '%s': read at %" PRIu64 ": %s", name,
					off, strerror(errno));
		if (r == 0)
			return eos_fail(
				-EIO, "input record '%s': ends at %" PRIu64 " of %" PRIu64 " bytes",
				name, off, len);
		off += (uint64_t)r;
	}
	return 0;
}

/* A failed read: the record is a miss; remove its file. */
static int invalid(sel_input_disk *d, uint32_t i, int rc)
{
	char msg[EOS_ERRMSG_MAX];
	snprintf(msg, sizeof msg, "%s", eos_errmsg());
	remove_entry(d, i);
	COUNT(d, invalid);
	stats_update(d);
	return eos_fail(rc, "%s (removed: a miss)", msg);
}

static int read_common(sel_input_disk *d, uint32_t kind, const sel_input_key *key, bool header_only,
		       sel_input_rec *rec, sel_input_header *hdr)
{
	COUNT(d, reads);
	uint32_t i = lookup(d, kind, key);
	if (i == NONE) {
		COUNT(d, misses);
		return -ENOENT;
	}
	char name[SEL_INPUT_NAME_LEN];
	sel_input_name(kind, key, name);
	uint64_t size = 0;
	int fd = open_record(d, name, &size), rc;
	if (fd < 0)
		return invalid(d, i, fd);
	uint64_t want = size;
	if (header_only) {
		uint8_t fixed[SEL_INPUT_FIXED];
		if ((rc = read_all(fd, fixed, sizeof fixed, name)) ||
		    (rc = sel_input_header_bytes(fixed, sizeof fixed)) < 0) {
			eos_fileops()->close(fd);
			return invalid(d, i, rc);
		}
		want = (uint64_t)rc;
	}
	uint8_t *buf = eos_aligned_alloc(SEL_INPUT_ALIGN, (size_t)want);
	if (!buf) {
		eos_fileops()->close(fd);
		return eos_fail(-ENOMEM, "input record '%s': out of memory for %" PRIu64 " bytes",
				name, want);
	}
	if ((rc = read_all(fd, buf, want, name))) {
		eos_fileops()->close(fd);
		eos_aligned_free(buf);
		return invalid(d, i, rc);
	}
	if (header_only) {
		sel_input_header h;
		rc = sel_input_decode(buf, (size_t)want, &h);
		if (!rc && h.file_bytes != size)
			rc = eos_fail(SEL_EFORMAT,
				      "input record '%s': %" PRIu64 " bytes, its header "
				      "says %" PRIu64,
				      name, size, h.file_bytes);
		if (!rc && (h.kind != kind || !sel_input_key_eq(&h.key, key)))
			rc = eos_fail(SEL_EIDENTITY,
				      "input record '%s': the header names another "
				      "record",
				      name);
		eos_aligned_free(buf);
		if (!rc)
			*hdr = h;
	} else {
		rc = sel_input_rec_adopt(rec, buf, (size_t)want, kind, key);
		if (rc) {
			eos_fail(rc, "input record '%s': %s", name, eos_errmsg());
			eos_aligned_free(buf);
		}
	}
	if (!rc)
		futimens(fd, NULL); /* recency for the next open's scan; best effort */
	eos_fileops()->close(fd);
	if (rc)
		return invalid(d, i, rc);
	lru_unlink(d, i);
	lru_append(d, i);
	COUNT(d, hits);
	return 0;
}

int sel_input_disk_read(sel_input_disk *d, uint32_t kind, const sel_input_key *key,
			sel_input_rec *out)
{
	memset(out, 0, sizeof *out);
	return read_common(d, kind, key, false, out, NULL);
}

int sel_input_disk_read_header(sel_input_disk *d, uint32_t kind, const sel_input_key *key,
			       sel_input_header *out)
{
	return read_common(d, kind, key, true, NULL, out);
}

/* ---- Writing ---------------------------------------------------------------- */

static int write_all(int fd, const uint8_t *buf, uint64_t len, const char *name)
{
	const struct eos_fileops *ops = eos_fileops();
	uint64_t off = 0;
	while (off < len) {
		size_t n = len - off > (1u << 30) ? (1u << 30) : (size_t)(len - off);
		ssize_t w = ops->pwrite(fd, buf + off, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return eos_fail(-errno, "write input record '%s': %s", name,
					strerror(errno));
		if (w == 0)
			return eos_fail(-EIO, "write input record '%s': no progress at %" PRIu64,
					name, off);
		off += (uint64_t)w;
	}
	return 0;
}

uint64_t sel_input_disk_reclaim(sel_input_disk *d, uint64_t bytes)
{
	uint64_t freed = 0;
	while (freed < bytes && d->head != NONE) {
		freed += d->e[d->head].bytes;
		remove_entry(d, d->head);
		COUNT(d, evictions);
	}
	stats_update(d);
	return freed;
}

int sel_input_disk_remove(sel_input_disk *d, uint32_t kind, const sel_input_key *key)
{
	uint32_t i = lookup(d, kind, key);
	if (i == NONE)
		return -ENOENT;
	int rc = remove_entry(d, i);
	stats_update(d);
	return rc;
}

int sel_input_disk_write(sel_input_disk *d, const sel_input_rec *rec)
{
	const struct eos_fileops *ops = eos_fileops();
	char name[SEL_INPUT_NAME_LEN], tmp[SEL_INPUT_NAME_LEN + 32];
	uint64_t len = rec->len;
	int rc;

	if (!rec->bytes || rec->len != rec->h.file_bytes)
		return eos_fail(-EINVAL, "write input record: not a sealed record");
	sel_input_name(rec->h.kind, &rec->h.key, name);
	if (d->st.writes_stopped)
		return eos_fail(-EROFS,
				"write input record '%s': input writes stopped after a "
				"temporary could not be removed (until restart)",
				name);
	if (lookup(d, rec->h.kind, &rec->h.key) != NONE)
		return 0;
	if (d->free_head == NONE) {
		remove_entry(d, d->head);
		COUNT(d, evictions);
	}
	if (charge(d, len) != 0) {
		/* Reclaim our own least recently used files, then once more. */
		uint64_t freed = 0;
		while (freed < len && d->head != NONE) {
			freed += d->e[d->head].bytes;
			remove_entry(d, d->head);
			COUNT(d, evictions);
		}
		if (charge(d, len) != 0) {
			COUNT(d, write_skipped);
			stats_update(d);
			return eos_fail(-ENOSPC,
					"write input record '%s': the disk limit cannot take "
					"%" PRIu64 " bytes (skipped)",
					name, len);
		}
	}
	int fd = -1;
	for (int tries = 0; tries < 16; tries++) {
		snprintf(tmp, sizeof tmp, TMP_PREFIX "%s-%016" PRIx64, name,
			 (uint64_t)(d->nonce++ * 0x9e3779b97f4a7c15ull));
		fd = ops->openat(d->dirfd, tmp,
				 O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0) {
		rc = eos_fail(-errno, "write input record '%s': create temporary: %s", name,
			      strerror(errno));
		uncharge(d, len);
		goto failed;
	}
	if ((rc = write_all(fd, rec->bytes, len, name)) == 0 && d->o.datasync &&
	    ops->fdatasync(fd) != 0)
		rc = eos_fail(-errno, "write input record '%s': fdatasync: %s", name,
			      strerror(errno));
	if (ops->close(fd) != 0 && !rc)
		rc = eos_fail(-errno, "write input record '%s': close: %s", name, strerror(errno));
	if (!rc && ops->renameat(d->dirfd, tmp, d->dirfd, name) != 0)
		rc = eos_fail(-errno, "write input record '%s': rename into place: %s", name,
			      strerror(errno));
	if (rc) {
		char msg[EOS_ERRMSG_MAX];
		snprintf(msg, sizeof msg, "%s", eos_errmsg());
		if (ops->unlinkat(d->dirfd, tmp, 0) != 0 && errno != ENOENT) {
			/* Its bytes stay charged; writes stop until restart. */
			d->stuck += len;
			pthread_mutex_lock(&d->st_mu);
			d->st.writes_stopped = true;
			pthread_mutex_unlock(&d->st_mu);
			rc = eos_fail(rc,
				      "%s; and the temporary '%s' cannot be removed (%s): input "
				      "writes stop until restart",
				      msg, tmp, strerror(errno));
		} else {
			uncharge(d, len);
			eos_fail(rc, "%s", msg);
		}
		goto failed;
	}
	if (d->o.dir_fsync && ops->fsync(d->dirfd) != 0)
		eos_fail(-errno, "write input record '%s': directory fsync: %s", name,
			 strerror(errno));
	index_add(d, rec->h.kind, &rec->h.key, len);
	COUNT(d, writes);
	stats_update(d);
	return 0;
failed:
	COUNT(d, write_failed);
	stats_update(d);
	return rc;
}

/* ---- Stats and check -------------------------------------------------------------- */

void sel_input_disk_stats(sel_input_disk *d, struct sel_input_disk_stats *out)
{
	pthread_mutex_lock(&d->st_mu);
	*out = d->st;
	pthread_mutex_unlock(&d->st_mu);
}

int sel_input_disk_check(sel_input_disk *d)
{
	uint32_t in_use = 0, in_hash = 0, in_lru = index_count(d);
	uint64_t bytes = 0;
	for (uint32_t i = 0; i < d->max; i++)
		if (d->e[i].used) {
			in_use++;
			bytes += d->e[i].bytes;
			if (lookup(d, d->e[i].kind, &d->e[i].key) != i)
				return eos_fail(SEL_ECORRUPT,
						"input disk check: entry %u is not found "
						"by its key",
						i);
		}
	for (uint32_t b = 0; b < BUCKETS; b++)
		for (uint32_t i = d->buckets[b]; i != NONE; i = d->e[i].hnext) {
			in_hash++;
			if (!d->e[i].used || bucket(d->e[i].kind, &d->e[i].key) != b)
				return eos_fail(SEL_ECORRUPT,
						"input disk check: bucket %u holds a free or "
						"misplaced entry",
						b);
		}
	if (in_use != in_lru || in_use != in_hash || in_use > d->max)
		return eos_fail(SEL_ECORRUPT,
				"input disk check: %u entries in use, %u on the LRU "
				"list, %u hashed (bound %u)",
				in_use, in_lru, in_hash, d->max);
	if (!d->o.budget && d->own_used != bytes + d->stuck)
		return eos_fail(SEL_ECORRUPT,
				"input disk check: %" PRIu64 " bytes charged, %" PRIu64
				" indexed + %" PRIu64 " stuck",
				d->own_used, bytes, d->stuck);
	if (!d->o.budget && d->o.limit_bytes && d->own_used > d->o.limit_bytes)
		return eos_fail(SEL_ECORRUPT,
				"input disk check: %" PRIu64 " bytes over the limit %" PRIu64,
				d->own_used, d->o.limit_bytes);
	return 0;
}
