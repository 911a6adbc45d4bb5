/*
 * record_verify.c - whole-file verification of one record file with
 * ordinary buffered reads, for tools that work on a record directory
 * without a server (`flare records verify`, `ls`, `gc`): every check the
 * startup scan and the disk thread make, in one place (design 2.5, the
 * record-file, recovery-scan and disk-thread paragraphs;
 * docs/record-format.md, "Validation").
 *
 * DESIGN
 *
 * Nothing here decides validity by itself.  The header goes through
 * sel_record_decode, the same decoder the scan and the disk thread use;
 * the length through sel_record_check_length, each page record through
 * sel_record_check_page and the row through sel_record_check_row, the
 * helpers the disk thread calls on every read.  So a file this module
 * passes is one the store would restore, and a corruption the store would
 * refuse is one this module reports.  What differs is only how the bytes
 * arrive: one pread at a time through eos_fileops() into heap buffers,
 * instead of the disk thread's O_DIRECT pipeline into slots -- a tool has
 * time, and no slots.
 *
 * The order of the checks is the store's: file type, header, name, length,
 * holes, then payload.  The first failure names the verdict and ends the
 * reading: nothing past a header, name, length or hole failure is read
 * (those files are unusable as a whole, and their offsets cannot be
 * trusted), and nothing past the first page record that fails its
 * checksum.  A symbolic link, FIFO or device named like a record is judged
 * by fstatat and never opened.  Memory is bounded by one page record, one
 * row and a 4 KiB window of the checksum segment, whatever tail a header
 * claims.
 *
 * INVARIANTS
 *   1. kind == SEL_CHECK_OK exactly when every check ran and passed (with
 *      payload, every page record and the row when present).
 *   2. decoded is set exactly when h holds a header that decoded; the
 *      verdict is then NAME or later (or OK).
 */
#include "record.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "internal.h"

const char *sel_check_kind_name(enum sel_check_kind k)
{
	switch (k) {
	case SEL_CHECK_OK: return "ok";
	case SEL_CHECK_UNREADABLE: return "unreadable";
	case SEL_CHECK_NOT_FILE: return "not a file";
	case SEL_CHECK_FORMAT: return "format";
	case SEL_CHECK_HEADER_CHECKSUM: return "header checksum";
	case SEL_CHECK_IDENTITY: return "identity";
	case SEL_CHECK_LAYOUT: return "layout";
	case SEL_CHECK_NAME: return "name";
	case SEL_CHECK_SIZE: return "size";
	case SEL_CHECK_PAGE: return "page checksum";
	case SEL_CHECK_ROW: return "row checksum";
	case SEL_CHECK_SPARSE: return "sparse";
	}
	return "?";
}

/* Record the first failure: kind and message. */
static void verdict(struct sel_record_check *out, enum sel_check_kind k, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void verdict(struct sel_record_check *out, enum sel_check_kind k, const char *fmt, ...)
{
	if (out->kind != SEL_CHECK_OK)
		return;
	out->kind = k;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(out->why, sizeof out->why, fmt, ap);
	va_end(ap);
}

/* pread exactly len bytes at off: 0, 1 at end of file, or a negative errno. */
static int read_at(int fd, void *buf, uint64_t len, uint64_t off, uint64_t *counted)
{
	const struct eos_fileops *ops = eos_fileops();
	uint8_t *p = buf;
	while (len) {
		size_t n = len > (1u << 30) ? (1u << 30) : (size_t)len;
		ssize_t got = ops->pread(fd, p, n, (off_t)off);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		if (got == 0)
			return 1;
		p += got;
		off += (uint64_t)got;
		len -= (uint64_t)got;
		*counted += (uint64_t)got;
	}
	return 0;
}

/* Read the header of the open file fd (size bytes long) into buf
 * (SEL_RECORD_HEADER_MAX bytes): its length in *len, or a verdict. */
static bool read_header(int fd, uint64_t size, uint8_t *buf, size_t *len,
			struct sel_record_check *out)
{
	if (size < SEL_RECORD_HEADER_MIN) {
		verdict(out, SEL_CHECK_FORMAT,
			"the file of %" PRIu64 " bytes ends inside its header", size);
		return false;
	}
	int rc = read_at(fd, buf, SEL_RECORD_HEADER_MIN, 0, &out->bytes_read);
	if (rc < 0) {
		verdict(out, SEL_CHECK_UNREADABLE, "reading the header: %s", strerror(-rc));
		return false;
	}
	if (rc > 0) {
		verdict(out, SEL_CHECK_FORMAT, "the file ends inside its header");
		return false;
	}
	int hb = sel_record_header_bytes(buf, SEL_RECORD_HEADER_MIN);
	if (hb < 0) {
		verdict(out, SEL_CHECK_FORMAT, "%s", eos_errmsg());
		return false;
	}
	if (hb > (int)SEL_RECORD_HEADER_MIN) {
		if (size < (uint64_t)hb) {
			verdict(out, SEL_CHECK_FORMAT,
				"the file of %" PRIu64 " bytes ends inside its "
				"%d-byte header",
				size, hb);
			return false;
		}
		rc = read_at(fd, buf + SEL_RECORD_HEADER_MIN, (uint64_t)hb - SEL_RECORD_HEADER_MIN,
			     SEL_RECORD_HEADER_MIN, &out->bytes_read);
		if (rc != 0) {
			verdict(out, rc < 0 ? SEL_CHECK_UNREADABLE : SEL_CHECK_FORMAT,
				"reading the header: %s", rc < 0 ? strerror(-rc) : "end of file");
			return false;
		}
	}
	*len = (size_t)hb;
	return true;
}

static enum sel_check_kind decode_kind(int rc)
{
	switch (rc) {
	case SEL_ECORRUPT: return SEL_CHECK_HEADER_CHECKSUM;
	case SEL_EIDENTITY: return SEL_CHECK_IDENTITY;
	case SEL_ELAYOUT: return SEL_CHECK_LAYOUT;
	default: return SEL_CHECK_FORMAT;
	}
}

/* Checksum entries read at a time: verification streams the checksum
 * segment beside the pages, so its memory does not grow with the tail a
 * header claims. */
#define CK_CHUNK 4096u

/* Pages and row of a file whose header, name and length passed.  Stops at
 * the first page record that fails (the rest of such a file is never read):
 * its verdict is decided, and a file claiming millions of pages is not read
 * whole for it. */
static int check_payload(int fd, const uint8_t *hdr, size_t hlen, struct sel_record_check *out)
{
	const sel_record_header *h = &out->h;
	const sel_record_span *s = &h->span;
	sel_record_layout l;
	uint8_t *ck = NULL, *buf = NULL;
	struct iovec *iov = NULL;
	int rc = sel_record_layout_parse(&l, hdr, hlen);
	if (rc == -ENOMEM)
		return rc;
	if (rc) { /* cannot happen: the header decoded */
		verdict(out, SEL_CHECK_FORMAT, "%s", eos_errmsg());
		return 0;
	}
	if (h->d.tail) {
		ck = malloc(CK_CHUNK);
		buf = malloc(s->page_stride);
		if (!ck || !buf) {
			rc = -ENOMEM;
			goto out;
		}
		uint32_t have = 0, at = 0; /* entries [at, at + have) are in ck */
		for (uint32_t i = 0; i < h->d.tail; i++) {
			if (i >= at + have) {
				uint32_t left = h->d.tail - i, per = CK_CHUNK / 8;
				at = i;
				have = left < per ? left : per;
				rc = read_at(fd, ck, 8 * (uint64_t)have,
					     s->cksum_off + 8 * (uint64_t)i, &out->bytes_read);
				if (rc != 0) {
					verdict(out, rc < 0 ? SEL_CHECK_UNREADABLE : SEL_CHECK_SIZE,
						"reading the checksum segment: %s",
						rc < 0 ? strerror(-rc) : "end of file");
					rc = 0;
					goto out;
				}
			}
			rc = read_at(fd, buf, s->page_stride,
				     s->page_off + (uint64_t)i * s->page_stride, &out->bytes_read);
			if (rc != 0) {
				verdict(out, rc < 0 ? SEL_CHECK_UNREADABLE : SEL_CHECK_SIZE,
					"reading page record %" PRIu32 ": %s", i,
					rc < 0 ? strerror(-rc) : "end of file");
				rc = 0;
				goto out;
			}
			if (sel_record_check_page(buf, s->page_stride,
						  sel_get_u64(ck + 8 * (size_t)(i - at)), i) != 0) {
				out->bad_pages++;
				verdict(out, SEL_CHECK_PAGE, "%s (not read further)", eos_errmsg());
				rc = 0;
				goto out;
			}
		}
		free(buf);
		buf = NULL;
	}
	if (out->has_row) {
		iov = calloc(s->row_ranks, sizeof(*iov));
		buf = malloc(s->row_bytes);
		if (!iov || !buf) {
			rc = -ENOMEM;
			goto out;
		}
		rc = read_at(fd, buf, s->row_bytes, s->row_off, &out->bytes_read);
		if (rc != 0) {
			verdict(out, rc < 0 ? SEL_CHECK_UNREADABLE : SEL_CHECK_SIZE,
				"reading the row: %s", rc < 0 ? strerror(-rc) : "end of file");
			rc = 0;
			goto out;
		}
		/* Rank-major, each row padded to 4 KiB (one row when replicated):
		 * the unpadded bytes in file order, as the disk thread hashes them. */
		for (uint32_t r = 0; r < s->row_ranks; r++) {
			iov[r].iov_base = buf + (s->row_ranks == 1 ? 0 : l.row_off[r]);
			iov[r].iov_len = l.row_bytes[r];
		}
		if (sel_record_check_row(iov, s->row_ranks, h->row_checksum) != 0) {
			out->bad_row = true;
			verdict(out, SEL_CHECK_ROW, "%s", eos_errmsg());
		}
	}
	rc = 0;
out:
	free(ck);
	free(buf);
	free(iov);
	sel_record_layout_free(&l);
	return rc;
}

/* Open name in dirfd for a check: judged by fstatat first (a symbolic link,
 * FIFO or device is never opened), then opened as eos_open_regular does
 * (O_NOFOLLOW | O_NONBLOCK, a regular file, the same one).  The descriptor,
 * or -1 with the verdict given. */
static int open_checked(int dirfd, const char *name, struct stat *st, struct sel_record_check *out)
{
	if (fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) != 0) {
		verdict(out, SEL_CHECK_UNREADABLE, "fstatat: %s", strerror(errno));
		return -1;
	}
	if (!S_ISREG(st->st_mode)) {
		verdict(out, SEL_CHECK_NOT_FILE, "%s, not a regular file (never opened)",
			S_ISLNK(st->st_mode)    ? "a symbolic link"
			: S_ISFIFO(st->st_mode) ? "a FIFO"
			: S_ISDIR(st->st_mode)  ? "a directory"
						: "a device or socket");
		return -1;
	}
	struct eos_file_id id = {(uint64_t)st->st_dev, (uint64_t)st->st_ino};
	int fd = eos_open_regular(dirfd, name, 0, &id, st);
	if (fd < 0) {
		verdict(out,
			fd == -ENXIO || fd == -ELOOP ? SEL_CHECK_NOT_FILE : SEL_CHECK_UNREADABLE,
			"%s", eos_errmsg());
		return -1;
	}
	return fd;
}

int sel_record_check_file(int dirfd, const char *name, const sel_record_ns *ns, bool payload,
			  struct sel_record_check *out)
{
	struct stat st;
	size_t hlen = 0;
	sel_key key;
	int rc = 0;
	memset(out, 0, sizeof(*out));
	uint8_t *hdr = malloc(SEL_RECORD_HEADER_MAX);
	if (!hdr)
		return eos_fail(-ENOMEM, "check record '%s': out of memory", name);
	int fd = open_checked(dirfd, name, &st, out);
	if (fd < 0)
		goto done;
	out->size = (uint64_t)st.st_size;
	out->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
	if (!read_header(fd, out->size, hdr, &hlen, out))
		goto done;
	if ((rc = sel_record_decode(hdr, hlen, ns, &out->h)) != 0) {
		verdict(out, decode_kind(rc), "%s", eos_errmsg());
		rc = 0;
		goto done;
	}
	out->decoded = true;
	if (sel_record_name_parse(name, &key) != 0 || !sel_key_eq(&key, &out->h.d.key)) {
		char want[SEL_RECORD_NAME_MAX];
		sel_record_name(&out->h.d.key, want);
		verdict(out, SEL_CHECK_NAME, "the header's key is named %s", want);
		goto done;
	}
	if (sel_record_check_length(&out->h.span, out->size, &out->has_row) != 0) {
		verdict(out, SEL_CHECK_SIZE, "%s", eos_errmsg());
		goto done;
	}
	uint64_t hole;
	if (sel_record_sparse(fd, out->size, &hole)) {
		verdict(out, SEL_CHECK_SPARSE,
			"a hole at byte %" PRIu64 " of %" PRIu64 ": its blocks "
			"do not cover its length (never read whole)",
			hole, out->size);
		goto done;
	}
	if (payload)
		rc = check_payload(fd, hdr, hlen, out);
done:
	if (fd >= 0)
		eos_fileops()->close(fd);
	free(hdr);
	if (rc)
		return eos_fail(rc, "check record '%s': out of memory", name);
	return 0;
}

int sel_record_ns_load(int dirfd, const char *name, sel_record_ns *ns)
{
	struct stat st;
	size_t hlen = 0;
	struct sel_record_check c;
	int rc;
	memset(ns, 0, sizeof(*ns));
	memset(&c, 0, sizeof c);
	uint8_t *hdr = malloc(SEL_RECORD_HEADER_MAX);
	if (!hdr)
		return eos_fail(-ENOMEM, "record '%s': out of memory", name);
	int fd = open_checked(dirfd, name, &st, &c);
	if (fd < 0) {
		rc = eos_fail(c.kind == SEL_CHECK_NOT_FILE ? -ENXIO : -EIO, "record '%s': %s", name,
			      c.why);
		goto out;
	}
	if (!read_header(fd, (uint64_t)st.st_size, hdr, &hlen, &c)) {
		rc = eos_fail(c.kind == SEL_CHECK_UNREADABLE ? -EIO : SEL_EFORMAT,
			      "record '%s': %s", name, c.why);
		goto out;
	}
	if ((rc = sel_record_ns_from_header(ns, hdr, hlen)) != 0)
		rc = eos_fail(rc, "record '%s': %s", name, eos_errmsg());
out:
	if (fd >= 0)
		eos_fileops()->close(fd);
	free(hdr);
	return rc;
}
