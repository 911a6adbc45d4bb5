/*
 * disk_job.c - one disk job from prologue to epilogue: whole and windowed
 * record writes by the atomic protocol of record.h (temporary, fallocate,
 * payload, header last, optional fdatasync, rename, directory fsync),
 * verified reads (header first, every page against its checksum, the row
 * against its checksum), truncation and unlinks of the indexed file only
 * (design 2.5 record files; 2.12; disk.c DESIGN).
 *
 * DESIGN
 *
 * A job's prologue and epilogue run through eos_fileops() on both I/O
 * paths, so fault injection reaches them; its payload runs on the engine
 * (disk_io.c).  Windowed writes (SEL_DISK_WRITE_PART) keep one small entry
 * per record between its parts: the temporary's descriptor and name, the
 * next page record expected, and the header-plus-checksum buffer the parts
 * hash into; the ending part adds the row and the header segment and
 * commits in its epilogue like a whole write.  A failed part removes the
 * temporary and forgets the entry, so the parts after it fail fast.
 *
 * INVARIANTS: disk.c's 4 to 6.
 */
#include <assert.h>

#include "disk_int.h"

/* ---- Jobs ------------------------------------------------------------------- */

static void note_direct(sel_disk *d, bool direct)
{
	if (!direct && __atomic_load_n(&d->direct, __ATOMIC_RELAXED)) {
		__atomic_store_n(&d->direct, false, __ATOMIC_RELAXED);
		STAT_ADD(d, direct_fallbacks, 1);
	}
}

/* The file a job names, or NULL when it names none. */
static const struct eos_file_id *want_id(const struct sel_disk_job *j)
{
	return j->want.dev || j->want.ino ? &j->want : NULL;
}

/* The file behind fd, for the job's completion (a commit's `file`). */
static void note_file(struct sel_disk_job *j, int fd)
{
	struct stat st;
	if (fstat(fd, &st) == 0)
		j->file = (struct eos_file_id){(uint64_t)st.st_dev, (uint64_t)st.st_ino};
}

static uint64_t next_nonce(sel_disk *d)
{
	uint64_t x = d->nonce;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return d->nonce = x;
}

/* Plan the row pieces of c's job and add their segments. */
static int add_row_segs(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (eos_grow((void **)&c->plan, &c->plan_cap, j->row_n ? j->row_n : 1, sizeof(*c->plan)) !=
	    0)
		return -ENOMEM;
	int rc = sel_record_row_plan(&d->ns->layout, j->rec.flags, j->row_iov, j->row_n, c->plan);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < j->row_n; i++)
		if (!dk_add_seg(c, c->plan[i].addr, c->plan[i].len,
				c->span.row_off + c->plan[i].off, SEG_ROW, i))
			return -ENOMEM;
	return 0;
}

/* ---- Windowed writes ---------------------------------------------------------- */

static struct wtemp *wt_find(sel_disk *d, const sel_key *key)
{
	for (uint32_t i = 0; i < d->n_wt; i++)
		if (d->wt[i]->used && sel_key_eq(&d->wt[i]->key, key))
			return d->wt[i];
	return NULL;
}

static struct wtemp *wt_new(sel_disk *d, size_t head_bytes)
{
	struct wtemp *w = NULL;
	for (uint32_t i = 0; i < d->n_wt && !w; i++)
		if (!d->wt[i]->used)
			w = d->wt[i];
	if (!w) {
		struct wtemp **n = realloc(d->wt, (d->n_wt + 1) * sizeof(struct wtemp *));
		if (!n)
			return NULL;
		d->wt = n;
		if (!(w = calloc(1, sizeof(*w))))
			return NULL;
		d->wt[d->n_wt++] = w;
	}
	if (head_bytes > w->head_cap || !w->head) {
		uint8_t *b = eos_aligned_alloc(EOS_ALIGN, head_bytes);
		if (!b)
			return NULL;
		eos_aligned_free(w->head);
		w->head = b;
		w->head_cap = head_bytes;
	}
	w->used = true;
	w->fd = -1;
	w->next = 0;
	w->users = 1;
	w->failed = false;
	w->tmp[0] = '\0';
	return w;
}

/* Forget w, removing its temporary if it has one.  Returns the removal's
 * error (the file then stays for the next scan), else 0. */
int dk_wt_discard(sel_disk *d, struct wtemp *w)
{
	int rc = 0;
	if (w->fd >= 0)
		rc = sel_record_discard(d->dirfd, w->fd, w->tmp);
	w->fd = -1;
	w->used = false;
	return rc;
}

/* Create and preallocate the temporary of c's write on the thread (the
 * synchronous path), under the name tmp; a windowed write's entry keeps
 * the descriptor. */
static void create_sync(sel_disk *d, struct io_ctx *c, bool direct, char *tmp)
{
	const struct sel_disk_job *j = c->job;
	c->fd = sel_record_tmp_create(d->dirfd, c->name, j->row ? c->span.row_end : c->span.row_off,
				      next_nonce(d), &direct, tmp);
	note_direct(d, direct);
	if (c->fd < 0) {
		dk_io_fail_msg(c, c->fd);
		c->fd = -1;
	} else if (j->op == SEL_DISK_WRITE_PART) {
		c->wt->fd = c->fd;
	}
}

static void write_begin(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	const sel_record_span *s = &c->span;
	bool part = j->op == SEL_DISK_WRITE_PART;
	bool begin = !part || (j->part & SEL_DISK_PART_BEGIN);
	bool end = !part || (j->part & SEL_DISK_PART_END);
	uint32_t first = part ? j->first : 0, n = part ? j->count : j->rec.tail;
	size_t head_bytes = (size_t)s->header_bytes + s->cksum_bytes;
	int rc;

	if (part) {
		struct wtemp *w = wt_find(d, &j->rec.key);
		if (begin && w && dk_wt_discard(d, w) != 0) {
			dk_io_fail(c, -EIO, "a stale temporary of this record: %s", eos_errmsg());
			return;
		}
		if (!begin) {
			if (!w) {
				dk_io_fail(c, -ENOENT,
					   "no temporary for the part at page record %" PRIu32
					   " (an earlier part failed or none began)",
					   first);
				return;
			}
			if (w->failed) { /* beside a part that failed: fail fast */
				dk_io_fail(c, -ECANCELED,
					   "an earlier part of this record failed (part at page "
					   "record %" PRIu32 ")",
					   first);
				return;
			}
			c->wt = w; /* from here a failure discards it */
			w->users++;
			if (w->next != first || w->row != j->row) {
				dk_io_fail(c, -EINVAL,
					   "part at page record %" PRIu32
					   "%s, the write is at %" PRIu32,
					   first, w->row != j->row ? " changes the row flag" : "",
					   w->next);
				return;
			}
		} else {
			if (!(w = wt_new(d, head_bytes)))
				goto nomem;
			w->key = j->rec.key;
			w->row = j->row;
			c->wt = w;
		}
		c->head = w->head;
		w->next = first + n; /* the next part may start beside this one */
	} else {
		if (dk_grow_bounce(c, head_bytes) != 0) {
			dk_io_fail(c, -ENOMEM, "out of memory for a %zu-byte header", head_bytes);
			return;
		}
		c->head = c->bounce;
	}
	c->cksum = c->head + s->header_bytes;
	if (begin)
		memset(c->cksum, 0, s->cksum_bytes);
	for (uint32_t i = 0; i < n; i++) {
		/* Version 4: zero padding, hashed and written as such.  Nothing
		 * else writes or reads these bytes of the slot now. */
		sel_record_zero_padding(&d->ns->layout, j->rec.flags, j->pages[i]);
		if (!dk_add_seg(c, j->pages[i], s->page_stride,
				s->page_off + (uint64_t)(first + i) * s->page_stride, SEG_PAGE,
				first + i))
			goto nomem;
	}
	if (end && j->row && (rc = add_row_segs(d, c)) != 0) {
		if (rc == -ENOMEM)
			goto nomem;
		dk_io_fail(c, rc, "%s", eos_errmsg());
		return;
	}
	if (end && !dk_add_seg(c, c->head, head_bytes, 0, SEG_HEAD, 0))
		goto nomem;
	XXH3_64bits_reset(&c->row_state);

	if (!begin) {
		c->fd = c->wt->fd;
		return;
	}
	bool direct = __atomic_load_n(&d->direct, __ATOMIC_RELAXED);
	if (dk_fop_usable(d, FOP_BIT(SEL_DISK_FOP_OPEN))) {
		/* On the ring: the fallocate and the payload follow its
		 * completion (dk_job_fops_done). */
		char *tmp = part ? c->wt->tmp : c->tmp;
		sel_record_tmp_name(c->name, next_nonce(d), tmp);
		c->odirect = direct;
		c->phase = PH_OPEN;
		dk_fop_chain(d, c, (const uint8_t[]){SEL_DISK_FOP_OPEN}, 1, -1, tmp, 0);
		return;
	}
	create_sync(d, c, direct, part ? c->wt->tmp : c->tmp);
	return;
nomem:
	dk_io_fail(c, -ENOMEM, "out of memory planning %" PRIu32 " page records", n);
}

/* The outcome of the commit chain the ring ran on fd / tmp (c->phase
 * PH_DONE, or PH_COMMIT abandoned with a broken ring), as
 * sel_record_commit reports it: a failure before the rename removes the
 * temporary (closing fd unless the close ran). */
static void ring_commit_end(sel_disk *d, struct io_ctx *c, int fd, const char *tmp)
{
	struct sel_disk_job *j = c->job;
	const struct fop *f = c->fops;
	static const uint8_t order[] = {SEL_DISK_FOP_DATASYNC, SEL_DISK_FOP_CLOSE,
					SEL_DISK_FOP_RENAME};
	static const char *const what[] = {"fdatasync", "close", "rename into place"};
	for (int i = 0; i < 3; i++) {
		int res = f[order[i]].res;
		if (order[i] == SEL_DISK_FOP_DATASYNC && !d->fdatasync)
			continue;
		if (res >= 0)
			continue;
		int e = res == FOP_UNSET ? -ECANCELED : res;
		dk_io_fail(c, e, "%s: %s", what[i], strerror(-e));
		int cr = f[SEL_DISK_FOP_CLOSE].res;
		bool open = cr == FOP_UNSET || cr == -ECANCELED;
		if (sel_record_discard(d->dirfd, open ? fd : -1, tmp) != 0) {
			size_t l = strlen(j->errmsg);
			snprintf(j->errmsg + l, sizeof j->errmsg - l,
				 "; and %s (the next scan "
				 "removes it)",
				 eos_errmsg());
		}
		return;
	}
	j->committed = true;
	int res = f[SEL_DISK_FOP_DIRSYNC].res;
	if (res < 0) {
		int e = res == FOP_UNSET ? -ECANCELED : res;
		dk_io_fail(c, e,
			   "fsync of the directory after the rename: %s (the file is in place "
			   "but may not survive a crash)",
			   strerror(-e));
	}
}

static void write_end(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (c->phase == PH_DONE || c->phase == PH_COMMIT) {
		bool part = j->op == SEL_DISK_WRITE_PART;
		ring_commit_end(d, c, part ? c->wt->fd : c->fd, part ? c->wt->tmp : c->tmp);
		if (part) {
			c->wt->fd = -1;
			c->wt->used = false;
			c->wt->users = 0;
		}
		c->fd = -1;
		return;
	}
	if (j->op == SEL_DISK_WRITE_PART) {
		struct wtemp *w = c->wt;
		c->fd = -1; /* the entry owns the descriptor */
		if (!w)
			return;
		w->users--;
		if (c->err)
			w->failed = true;
		if (w->failed) {
			/* The last of the record's active parts removes the
			 * temporary (none of them writes to it any more). */
			if (w->users == 0 && dk_wt_discard(d, w) != 0) {
				size_t l = strlen(j->errmsg);
				snprintf(j->errmsg + l, sizeof j->errmsg - l, "; and %s",
					 eos_errmsg());
			}
			return;
		}
		if (!(j->part & SEL_DISK_PART_END))
			return;
		note_file(j, w->fd);
		int rc = sel_record_commit(d->dirfd, w->fd, w->tmp, c->name,
					   d->fdatasync ? SEL_COMMIT_DATASYNC : 0, &j->committed);
		w->fd = -1; /* closed by the commit in every case */
		w->used = false;
		if (rc)
			dk_io_fail_msg(c, rc);
		return;
	}
	if (c->fd < 0)
		return;
	if (c->err) {
		if (sel_record_discard(d->dirfd, c->fd, c->tmp) != 0) {
			size_t l = strlen(j->errmsg);
			snprintf(j->errmsg + l, sizeof j->errmsg - l, "; and %s", eos_errmsg());
		}
		c->fd = -1;
		return;
	}
	note_file(j, c->fd);
	int rc = sel_record_commit(d->dirfd, c->fd, c->tmp, c->name,
				   d->fdatasync ? SEL_COMMIT_DATASYNC : 0, &j->committed);
	c->fd = -1;
	if (rc)
		dk_io_fail_msg(c, rc);
}

/* pread exactly len bytes at off into buf (a short read is a short file). */
static int read_exact(struct io_ctx *c, void *buf, uint64_t len, uint64_t off, const char *what)
{
	const struct eos_fileops *ops = eos_fileops();
	uint8_t *p = buf;
	while (len) {
		ssize_t n = ops->pread(c->fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			dk_io_fail(c, -errno, "reading the %s: %s", what, strerror(errno));
			return c->err;
		}
		if (n == 0) {
			dk_io_fail(c, SEL_ECORRUPT, "the file ends inside its %s", what);
			return c->err;
		}
		p += n;
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

/* ---- Open files --------------------------------------------------------------
 *
 * A fetch reads its record in windows of at most 64 page records, one READ
 * job each, in page order (they start in that order, and since issue 18
 * r26disk a window starts beside the record's earlier windows once those
 * are past their prologue: disk.c dk_read_beside).
 * Opening the file, reading and checking its header and reading its
 * checksums for every window cost three dependent device round trips per
 * window before the payload (part A measured 4 opens for a 4-window fetch,
 * 2-4 ms each when the virtual disk is busy).  So the first window's job
 * opens the file, reads and decodes the header and reads the record's
 * whole checksum segment (8 bytes a page record, padded to 4 KiB) into an
 * entry of d->rf, and the windows after it read through that descriptor:
 * each still checks the decoded header and the file length against its
 * own indexed record (no I/O) before any payload is read, and verifies
 * every page record it reads against the checksums.  Windows beside each
 * other share the entry (users counts them).  The entry is closed when
 * its last user ends after the job that reads through the record's last
 * page record (a fetch's last window) or any failed read through it
 * ended (closing: no new user meanwhile), before a WRITE, WRITE_PART,
 * TRUNCATE or UNLINK of the same key (so an unlinked record's blocks are
 * not held, and a rewritten one is reopened), when a job names another
 * file identity, when evicted (least recently used, never one an active
 * job reads through) and when the thread ends.  Records are immutable
 * under their name: a descriptor opened and checked once describes the
 * same bytes for every window.
 */

static void rf_close(struct rfile *f)
{
	if (!f->used)
		return;
	eos_fileops()->close(f->fd);
	eos_aligned_free(f->cksum);
	*f = (struct rfile){0};
}

/* Close the entry of key (a write, truncate or unlink of the record). */
static void rf_drop(sel_disk *d, const sel_key *key)
{
	for (int i = 0; i < RFILES; i++)
		if (d->rf[i].used && !d->rf[i].users && sel_key_eq(&d->rf[i].key, key))
			rf_close(&d->rf[i]);
}

void dk_rf_close_all(sel_disk *d)
{
	for (int i = 0; i < RFILES; i++)
		rf_close(&d->rf[i]);
}

static bool rf_matches(const struct rfile *f, const struct sel_disk_job *j,
		       const sel_record_span *s)
{
	return f->used && !f->closing && sel_key_eq(&f->key, &j->rec.key) &&
	       eos_file_id_eq(&f->want, &j->want) && f->tail == j->rec.tail &&
	       f->header_bytes == s->header_bytes && f->cksum_off == s->cksum_off;
}

/* A free entry, or the least recently used idle one closed; NULL when
 * every entry is in use by an active job. */
static struct rfile *rf_slot(sel_disk *d)
{
	struct rfile *best = NULL;
	for (int i = 0; i < RFILES; i++) {
		struct rfile *f = &d->rf[i];
		if (!f->used)
			return f;
		if (!f->users && (!best || f->lru < best->lru))
			best = f;
	}
	if (best)
		rf_close(best);
	return best;
}

/* Open the job's file, read and decode its header and read its whole
 * checksum segment into f.  On failure c->err is set and f is unused. */
static void rf_open(sel_disk *d, struct io_ctx *c, struct rfile *f)
{
	struct sel_disk_job *j = c->job;
	const sel_record_span *s = &c->span;
	struct stat st;
	uint64_t ck_bytes = eos_round_up(8 * (uint64_t)j->rec.tail, EOS_ALIGN);
	if (dk_grow_bounce(c, (size_t)s->header_bytes + EOS_ALIGN) != 0 ||
	    (ck_bytes && !(f->cksum = eos_aligned_alloc(EOS_ALIGN, (size_t)ck_bytes)))) {
		dk_io_fail(c, -ENOMEM, "out of memory for the header and checksums");
		goto fail;
	}
	bool direct = __atomic_load_n(&d->direct, __ATOMIC_RELAXED);
	c->fd = sel_record_open(d->dirfd, c->name, &direct, want_id(j), &st);
	if (c->fd < 0) {
		dk_io_fail(c, c->fd, "%s", eos_errmsg());
		c->fd = -1;
		goto fail;
	}
	note_direct(d, direct);
	STAT_ADD(d, read_opens, 1);
	/* The header first: it must describe exactly the indexed record
	 * before a single payload byte is read. */
	if (read_exact(c, c->bounce, SEL_RECORD_HEADER_MIN, 0, "header") != 0)
		goto fail;
	int hb = sel_record_header_bytes(c->bounce, SEL_RECORD_HEADER_MIN);
	if (hb < 0) {
		dk_io_fail(c, SEL_ECORRUPT, "%s", eos_errmsg());
		goto fail;
	}
	if ((uint32_t)hb != s->header_bytes) {
		dk_io_fail(c, SEL_ECORRUPT, "the header is %d bytes, the indexed record's %" PRIu32,
			   hb, s->header_bytes);
		goto fail;
	}
	if (hb > (int)SEL_RECORD_HEADER_MIN &&
	    read_exact(c, c->bounce + SEL_RECORD_HEADER_MIN, (uint64_t)hb - SEL_RECORD_HEADER_MIN,
		       SEL_RECORD_HEADER_MIN, "header") != 0)
		goto fail;
	int rc;
	bool had_row;
	if (sel_record_decode(c->bounce, (size_t)hb, d->ns, &f->h) != 0 ||
	    sel_record_header_matches(&f->h, &j->rec, s) != 0) {
		dk_io_fail(c, SEL_ECORRUPT, "%s", eos_errmsg());
		goto fail;
	}
	/* Nothing past the header before the length is right too. */
	if ((rc = sel_record_check_length(s, (uint64_t)st.st_size, &had_row)) != 0) {
		dk_io_fail(c, rc, "%s", eos_errmsg());
		goto fail;
	}
	j->bytes += (uint64_t)hb;
	if (ck_bytes) {
		if (read_exact(c, f->cksum, ck_bytes, s->cksum_off, "checksum segment") != 0)
			goto fail;
		j->bytes += ck_bytes;
	}
	f->used = true;
	f->key = j->rec.key;
	f->want = j->want;
	f->fd = c->fd;
	f->tail = j->rec.tail;
	f->header_bytes = s->header_bytes;
	f->cksum_off = s->cksum_off;
	f->size = (uint64_t)st.st_size;
	return;
fail:
	eos_aligned_free(f->cksum);
	f->cksum = NULL;
	if (c->fd >= 0)
		eos_fileops()->close(c->fd);
	c->fd = -1;
}

static void read_begin(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	const sel_record_span *s = &c->span;
	struct rfile *f = NULL;
	int rc;

	uint32_t n = j->count ? j->count : j->rec.tail - j->first;
	if (j->first > j->rec.tail || n > j->rec.tail - j->first) {
		dk_io_fail(c, -EINVAL,
			   "page records [%" PRIu32 ", +%" PRIu32 ") of a %" PRIu32 "-page record",
			   j->first, n, j->rec.tail);
		return;
	}
	for (int i = 0; i < RFILES && !f; i++)
		if (rf_matches(&d->rf[i], j, s))
			f = &d->rf[i];
	if (f) {
		STAT_ADD(d, read_reuses, 1);
	} else {
		struct rfile fresh = {0};
		rf_open(d, c, &fresh);
		if (c->err)
			return;
		/* At most ACTIVE_JOBS - 1 other jobs hold an entry busy, and
		 * there are RFILES > ACTIVE_JOBS entries. */
		f = rf_slot(d);
		assert(f);
		*f = fresh;
	}
	f->users++;
	f->lru = ++d->rf_tick;
	c->rf = f;
	c->h = f->h;
	c->fd = f->fd;

	/* Every job checks the header and length against its own record. */
	if (sel_record_header_matches(&c->h, &j->rec, s) != 0) {
		dk_io_fail(c, SEL_ECORRUPT, "%s", eos_errmsg());
		return;
	}
	if ((rc = sel_record_check_length(s, f->size, &j->had_row)) != 0) {
		dk_io_fail(c, rc, "%s", eos_errmsg());
		return;
	}
	if (j->row && !j->had_row) {
		dk_io_fail(c, SEL_ECORRUPT, "the row was asked for, but the file holds pages only");
		return;
	}
	if (j->n_sums) {
		if (j->sums_first > j->rec.tail || j->n_sums > j->rec.tail - j->sums_first) {
			dk_io_fail(c, -EINVAL,
				   "checksums [%" PRIu32 ", +%" PRIu32 ") of a %" PRIu32
				   "-page record",
				   j->sums_first, j->n_sums, j->rec.tail);
			return;
		}
		for (uint32_t i = 0; i < j->n_sums; i++)
			j->sums[i] = sel_get_u64(f->cksum + 8 * ((size_t)j->sums_first + i));
	}
	c->cksum = n ? f->cksum + 8 * (uint64_t)j->first : NULL;
	for (uint32_t i = 0; i < n; i++)
		if (!dk_add_seg(c, j->pages[i], s->page_stride,
				s->page_off + (uint64_t)(j->first + i) * s->page_stride, SEG_PAGE,
				i)) {
			dk_io_fail(c, -ENOMEM, "out of memory planning %" PRIu32 " page records",
				   n);
			return;
		}
	if (j->row && (rc = add_row_segs(d, c)) != 0)
		dk_io_fail(c, rc, "%s", rc == -ENOMEM ? "out of memory" : eos_errmsg());
}

static void read_end(struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (c->err || !j->row)
		return;
	/* row_iov holds the pieces' unpadded lengths (plan[i].data). */
	int rc = sel_record_check_row(j->row_iov, j->row_n, c->h.row_checksum);
	if (rc)
		dk_io_fail(c, rc, "%s", eos_errmsg());
}

/* Start job j in context c: the synchronous prologue.  Returns true when
 * the job has payload I/O to run; otherwise it is finished (job_end). */
bool dk_job_begin(sel_disk *d, struct io_ctx *c, struct sel_disk_job *j)
{
	c->job = j;
	c->rf = NULL;
	c->write = j->op == SEL_DISK_WRITE || j->op == SEL_DISK_WRITE_PART;
	c->wt = NULL;
	c->head = NULL;
	c->fd = -1;
	c->err = 0;
	c->si = 0;
	c->spos = 0;
	c->inflight = c->unsubmitted = 0;
	c->phase = PH_IO;
	c->fop_pending = 0;
	c->odirect = false;
	for (int k = 0; k < SEL_DISK_FOPS; k++)
		c->fops[k] = (struct fop){.owner = c, .res = FOP_UNSET, .kind = (uint8_t)k};
	c->bytes = 0;
	c->n_segs = 0;
	c->cksum = NULL;
	sel_record_name(&j->rec.key, c->name);
	int rc = sel_record_span_of(&d->ns->layout.sz, &j->rec, &c->span);
	if (rc) {
		dk_io_fail_msg(c, rc);
		return false;
	}
	if (j->op != SEL_DISK_READ && j->op != SEL_DISK_DISCARD)
		rf_drop(d, &j->rec.key); /* Open files: nothing stale is kept open */
	switch (j->op) {
	case SEL_DISK_WRITE:
	case SEL_DISK_WRITE_PART: write_begin(d, c); break;
	case SEL_DISK_READ:
		read_begin(d, c);
		if (!c->err && c->n_segs == 0)
			return false; /* checksums only (sel_disk_job.sums): nothing to move */
		break;
	case SEL_DISK_TRUNCATE:
		if ((rc = sel_record_truncate(d->dirfd, c->name, &c->span, want_id(j),
					      &j->had_row)) != 0)
			dk_io_fail_msg(c, rc);
		return false;
	case SEL_DISK_UNLINK:
		if (dk_fop_usable(d, FOP_BIT(SEL_DISK_FOP_UNLINK))) {
			/* Nothing after it starts before it completes. */
			c->phase = PH_OPEN;
			dk_fop_chain(d, c, (const uint8_t[]){SEL_DISK_FOP_UNLINK}, 1, -1, NULL, 0);
			return true;
		}
		if ((rc = sel_record_unlink(d->dirfd, c->name, &j->existed)) != 0)
			dk_io_fail_msg(c, rc);
		return false;
	case SEL_DISK_DISCARD: {
		struct wtemp *w = wt_find(d, &j->rec.key);
		j->existed = w != NULL;
		if (w && dk_wt_discard(d, w) != 0)
			dk_io_fail_msg(c, -EIO);
		return false;
	}
	case SEL_DISK_OPS: break;
	}
	return !c->err;
}

/* The epilogue: commit or verify, close, account.  c's I/O is quiescent. */
void dk_job_end(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (c->write)
		write_end(d, c);
	else if (j->op == SEL_DISK_READ)
		read_end(c);
	if (c->rf) {
		/* Open files: the last window's job, or a failed one, closes. */
		struct rfile *f = c->rf;
		uint32_t n = j->count ? j->count : j->rec.tail - j->first;
		f->users--;
		/* (A read of the row alone -- a fetch's first window -- is not
		 * the last: the pages' windows follow it.) */
		if (c->err || (n && j->first + n >= f->tail))
			f->closing = true;
		if (f->closing && !f->users)
			rf_close(f);
		c->rf = NULL;
		c->fd = -1;
	}
	if (c->fd >= 0)
		eos_fileops()->close(c->fd);
	c->fd = -1;
	if (c->write)
		STAT_ADD(d, bytes_written, c->bytes);
	else if (j->op == SEL_DISK_READ)
		STAT_ADD(d, bytes_read, c->bytes);
	j->bytes += c->bytes;
	j->status = c->err;
	STAT_ADD(d, jobs[j->op], 1);
	if (c->err) {
		STAT_ADD(d, failed, 1);
		if (c->err == SEL_ECORRUPT && j->op == SEL_DISK_READ)
			STAT_ADD(d, corrupt, 1);
	}
}

/* ---- File operations on the ring ----------------------------------------------
 *
 * disk_fop.c puts them on the ring; here is what a job does with their
 * results.  A write's prologue: the openat of the temporary, then its
 * fallocate (on the ring or, where the ring lacks it, on the thread), then
 * the payload.  An openat refused with EEXIST (a temporary of this name
 * exists) or with EINVAL for O_DIRECT is redone on the thread by
 * sel_record_tmp_create, which retries other names and falls back to
 * buffered I/O; any other failure fails the job as the synchronous create
 * would.  An unlink's result is its job's.  The commit chain's results are
 * read in write_end (ring_commit_end).
 */

/* The temporary's openat completed with res. */
static void ring_opened(sel_disk *d, struct io_ctx *c, int res)
{
	struct sel_disk_job *j = c->job;
	bool part = j->op == SEL_DISK_WRITE_PART;
	char *tmp = part ? c->wt->tmp : c->tmp;
	uint64_t len = j->row ? c->span.row_end : c->span.row_off;
	if (res >= 0) {
		c->fd = res;
		if (part)
			c->wt->fd = res;
		note_direct(d, c->odirect);
	} else if (!c->err && (res == -EEXIST || (res == -EINVAL && c->odirect))) {
		const struct eos_fileops *ops = eos_fileops();
		bool direct = c->odirect;
		if (res == -EINVAL) {
			(void)ops->unlinkat(d->dirfd, tmp, 0); /* some kernels create it first */
			direct = false;
		}
		STAT_ADD(d, fileop_fallbacks, 1);
		create_sync(d, c, direct, tmp);
		return;
	} else {
		dk_io_fail(c, res, "create '%s'%s: %s", tmp, c->odirect ? " with O_DIRECT" : "",
			   strerror(-res));
		return;
	}
	if (c->err || len == 0)
		return;
	if (dk_aborting(d)) {
		dk_io_fail(c, SEL_ESTOPPED, "the disk thread is stopping");
		return;
	}
	if (dk_fop_usable(d, FOP_BIT(SEL_DISK_FOP_FALLOCATE))) {
		c->phase = PH_OPEN;
		dk_fop_chain(d, c, (const uint8_t[]){SEL_DISK_FOP_FALLOCATE}, 1, c->fd, tmp, len);
		return;
	}
	if (eos_fileops()->fallocate(c->fd, 0, 0, (off_t)len) != 0 && errno != EOPNOTSUPP &&
	    errno != ENOSYS)
		dk_io_fail(c, -errno, "preallocating %" PRIu64 " bytes: %s", len, strerror(errno));
}

void dk_job_fops_done(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	const struct fop *f = c->fops;
	if (c->phase == PH_COMMIT) {
		c->phase = PH_DONE;
		return;
	}
	c->phase = PH_IO; /* unless the next operation goes on the ring */
	if (j->op == SEL_DISK_UNLINK) {
		int res = f[SEL_DISK_FOP_UNLINK].res;
		j->existed = res == 0;
		if (res < 0 && res != -ENOENT) {
			int e = res == FOP_UNSET ? -ECANCELED : res;
			dk_io_fail_msg(
				c, eos_fail(e, "remove record '%s': %s", c->name, strerror(-e)));
		}
		return;
	}
	int res = f[SEL_DISK_FOP_FALLOCATE].res;
	if (res != FOP_UNSET) {
		if (res < 0 && res != -EOPNOTSUPP && res != -ENOSYS)
			dk_io_fail(c, res, "preallocating %" PRIu64 " bytes: %s",
				   j->row ? c->span.row_end : c->span.row_off, strerror(-res));
		return;
	}
	ring_opened(d, c, f[SEL_DISK_FOP_OPEN].res);
}

bool dk_part_waits(struct io_ctx *c)
{
	const struct sel_disk_job *j = c->job;
	if (j->op != SEL_DISK_WRITE_PART || !(j->part & SEL_DISK_PART_END) || !c->wt ||
	    c->phase != PH_IO)
		return false;
	if (c->wt->users > 1)
		return true;
	if (c->wt->failed && !c->err)
		dk_io_fail(c, -ECANCELED, "an earlier part of this record failed");
	return false;
}

bool dk_job_commit(sel_disk *d, struct io_ctx *c)
{
	struct sel_disk_job *j = c->job;
	if (c->phase != PH_IO || !c->write || c->err)
		return false;
	bool part = j->op == SEL_DISK_WRITE_PART;
	if (part && (!(j->part & SEL_DISK_PART_END) || !c->wt))
		return false;
	uint8_t kinds[4];
	int n = 0;
	if (d->fdatasync)
		kinds[n++] = SEL_DISK_FOP_DATASYNC;
	kinds[n++] = SEL_DISK_FOP_CLOSE;
	kinds[n++] = SEL_DISK_FOP_RENAME;
	kinds[n++] = SEL_DISK_FOP_DIRSYNC;
	uint32_t mask = 0;
	for (int i = 0; i < n; i++)
		mask |= FOP_BIT(kinds[i]);
	if (!dk_fop_usable(d, mask))
		return false;
	int fd = part ? c->wt->fd : c->fd;
	note_file(j, fd);
	c->phase = PH_COMMIT;
	dk_fop_chain(d, c, kinds, n, fd, part ? c->wt->tmp : c->tmp, 0);
	return true;
}
