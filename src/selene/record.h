/*
 * record.h - the checkpoint record file: naming, the 4 KiB header, the
 * checksum, page and row segments, and the file protocol around them
 * (design 2.5, "A record file lives at ..."; the directory lock and the
 * recovery scan; design 2.3 for startup pruning).
 *
 * Internal to libselene.  docs/record-format.md is the normative reference
 * for every byte; this header is the C view of it.
 *
 * Two halves:
 *   - record.c is pure: layouts, offsets, header encode/decode, names.  It
 *     does no I/O, so tests and fuzz/fuzz_record.c call it directly.
 *   - record_io.c is the file protocol over eos_fileops(): the namespace
 *     directory, the atomic temporary-then-rename write, compaction,
 *     deletion, and the startup scan.  The disk thread (disk.c) uses the
 *     protocol helpers and moves the payload itself.
 *   - record_verify.c checks one file whole with buffered reads (tools:
 *     `flare records`), through the same decoder and the same length, page
 *     and row checks the disk thread calls on every read.
 *
 * A record file, in order (every offset a multiple of 4 KiB):
 *   header     header_bytes (4 KiB unless the rank table needs more)
 *   checksums  one XXH3-64 per stored page record, padded to 4 KiB
 *   pages      page-major; a stored page record is every rank's share (the
 *              bytes of one slab slot) or, replicated, one share for all
 *   row        rank-major, each rank's row padded to 4 KiB (replicated: one)
 * The row exists exactly when the file length covers the row segment;
 * compaction truncates at the row segment offset and changes nothing else.
 */
#ifndef SEL_RECORD_H
#define SEL_RECORD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "eos.h"
#include "selene.h"

#define SEL_RECORD_MAGIC "FLARECKP"
#define SEL_RECORD_VERSION 4u     /* what we write */
#define SEL_RECORD_VERSION_MIN 1u /* oldest we read */
#define SEL_RECORD_ALIGN 4096u
#define SEL_RECORD_HEADER_MIN 4096u
#define SEL_RECORD_HEADER_MAX 65536u /* v2 headers grow for big rank tables */

/* Header flags (version 2; version 1 has none). */
#define SEL_RECORD_PAGES_REPLICATED (1u << 31) /* one share per page record */
#define SEL_RECORD_ROW_REPLICATED (1u << 30)   /* one row for all ranks */
#define SEL_RECORD_FLAGS_KNOWN (SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED)

/* Hex digits of the offload identity in the namespace directory name. */
#define SEL_RECORD_ID_PREFIX_HEX 16
/* "<16 hex identity>-<32 hex fingerprint>" + NUL */
#define SEL_RECORD_DIRNAME_MAX 64
/* "<16 hex consumed>-<32 hex digest>.ckpt" + NUL (54 + 1) */
#define SEL_RECORD_NAME_MAX 64
/* ".tmp-<name>-<16 hex>" + NUL */
#define SEL_RECORD_TMPNAME_MAX 96
#define SEL_RECORD_TMP_PREFIX ".tmp-"

/* ---- Layout: the bytes of one namespace's records ---------------------- */

/* Size summary of a rank table: what offsets depend on. */
struct sel_record_sizes {
	uint32_t ranks;
	uint32_t page_tokens;
	uint64_t page_record;  /* per-rank page record: sum of shares (= slot bytes) */
	uint64_t share0;       /* rank 0's share: a replicated page record */
	uint64_t row_segment;  /* sum of padded rows */
	uint64_t row0_padded;  /* rank 0's padded row: a replicated row segment */
	bool uniform_planes;   /* ranks > 1, every rank has rank 0's plane table */
	bool uniform_row;      /* ranks > 1, every rank has rank 0's row bytes */
	uint32_t header_bytes; /* v2 header size for this table */
};

/* Per-rank plane sizes as a geometry (or a header) gives them, and every
 * offset derived from them.  Built once per namespace. */
typedef struct sel_record_layout {
	struct sel_record_sizes sz;
	uint32_t ranks;
	uint32_t *n_planes;   /* [ranks] */
	uint64_t **unit;      /* [ranks][n_planes[r]] unpadded plane unit bytes */
	uint64_t **plane_off; /* [ranks][n_planes[r]] offset in the rank's share */
	uint64_t *row_bytes;  /* [ranks] unpadded row bytes */
	uint64_t *share;      /* [ranks] sum of round_up(unit, 4 KiB) */
	uint64_t *share_off;  /* [ranks] offset of the share in a page record */
	uint64_t *row_off;    /* [ranks] offset of the row in the row segment */
	uint8_t *table;       /* encoded rank table (docs/record-format.md) */
	uint32_t table_bytes;
} sel_record_layout;

/* From a geometry: SEL_EGEOMETRY (no ranks, no planes, zero sizes),
 * -EOVERFLOW, SEL_EOVERSIZE (rank table beyond SEL_RECORD_HEADER_MAX) or
 * -ENOMEM, with a message; *l is zeroed on failure.  page_tokens must be a
 * positive multiple of 64. */
int sel_record_layout_init(sel_record_layout *l, const sel_geometry *g);
/* From a header's rank table (tools, fuzzing): the header must decode
 * (sel_record_decode with ns NULL).  Same errors as decode. */
int sel_record_layout_parse(sel_record_layout *l, const void *hdr, size_t len);
/* Release and zero.  Safe on a zeroed or failed layout. */
void sel_record_layout_free(sel_record_layout *l);

/* ---- Namespace: identity + fingerprint + layout ------------------------ */

typedef struct sel_record_ns {
	uint8_t identity[SEL_IDENTITY_BYTES];
	uint8_t fingerprint[SEL_FINGERPRINT_BYTES];
	sel_record_layout layout;
	char dirname[SEL_RECORD_DIRNAME_MAX]; /* "<identity prefix>-<fingerprint>" */
} sel_record_ns;

/* Layout and fingerprint from g (sel_layout_fingerprint), identity as
 * given (the offload identity).  Errors as sel_record_layout_init. */
int sel_record_ns_init(sel_record_ns *ns, const sel_geometry *g,
		       const uint8_t identity[SEL_IDENTITY_BYTES]);
void sel_record_ns_free(sel_record_ns *ns);
/* A namespace from a record header alone (tools that have no geometry):
 * the header must decode (sel_record_decode with ns NULL); identity,
 * fingerprint and layout are the header's, the dirname follows from them.
 * Same errors as decode, or -ENOMEM; *ns is zeroed on failure. */
int sel_record_ns_from_header(sel_record_ns *ns, const void *hdr, size_t len);
/* "<first 16 hex of identity>-<32 hex fingerprint>" into out. */
void sel_record_dirname(const uint8_t identity[SEL_IDENTITY_BYTES],
			const uint8_t fingerprint[SEL_FINGERPRINT_BYTES],
			char out[SEL_RECORD_DIRNAME_MAX]);

/* ---- One record -------------------------------------------------------- */

/* What an index knows about a record: enough to name it, size it and check
 * its header.  Scan results and disk jobs carry it. */
typedef struct sel_record_desc {
	sel_key key;
	sel_key parent;    /* nearest stored ancestor; none = all zero */
	sel_digest bucket; /* boundary digest at key.consumed / 64 */
	uint32_t tail;     /* stored page records */
	uint32_t flags;    /* SEL_RECORD_*_REPLICATED */
	/* Version 3: sel_record_parent_check(the parent's bucket digest) as the
	 * writer knew it, so a parent key rewritten to another record's (of the
	 * same consumed count) no longer matches that record's bucket.  0 =
	 * not known (no parent; version 1 and 2 files; writers without one):
	 * nothing is checked then.  A consistency check, not authentication:
	 * whoever rewrites the parent key can rewrite this too (the restore
	 * itself compares every chain node with the request's history,
	 * sel_index_lookup). */
	uint64_t parent_check;
} sel_record_desc;

/* The parent link check of a record whose parent has bucket digest b: its
 * first 8 bytes, little-endian, never 0 (0 means "not known"). */
uint64_t sel_record_parent_check(const sel_digest *b);

/* Where everything is in one record's file. */
typedef struct sel_record_span {
	uint32_t header_bytes;
	uint32_t row_ranks;   /* rows stored: 1 if replicated, else ranks */
	uint64_t cksum_off;   /* == header_bytes */
	uint64_t cksum_bytes; /* round_up(8 * tail, 4 KiB) */
	uint64_t page_off;
	uint64_t page_stride; /* bytes of one stored page record */
	uint64_t row_off;     /* == the page-only file length */
	uint64_t row_bytes;   /* row segment bytes */
	uint64_t row_end;     /* == the file length with the row */
} sel_record_span;

/* Validate d against sz and compute its span: key consumed > 0; parent none
 * or below key; tail = c/pt (a root, or a full chain stored as a root) or,
 * with a parent, c/pt - p/pt; flags known, only with ranks > 1 and uniform
 * planes (pages) or rows (row); no offset beyond INT64_MAX.  0 or
 * SEL_EFORMAT / -EOVERFLOW with a message. */
int sel_record_span_of(const struct sel_record_sizes *sz, const sel_record_desc *d,
		       sel_record_span *out);
/* Whether d's tail links it under its parent (derived count c/pt - p/pt),
 * as opposed to holding its full chain as a root.  A record whose tail is
 * both (parent inside the first page) links.  False without a parent. */
bool sel_record_links_parent(const sel_record_desc *d, uint32_t page_tokens);

/* A decoded header. */
typedef struct sel_record_header {
	sel_record_desc d;
	uint32_t version;
	uint32_t ranks;
	uint32_t page_tokens;
	uint8_t identity[SEL_IDENTITY_BYTES];
	uint8_t fingerprint[SEL_FINGERPRINT_BYTES];
	sel_record_span span;
	uint64_t row_checksum;    /* XXH3-64 of the stored rows' bytes */
	uint64_t created_ns;      /* wall clock at write, ns since the epoch */
	uint64_t header_checksum; /* v2; 0 in v1 */
} sel_record_header;

/* Encode the header of record d in namespace ns into buf (len >= its
 * header bytes; the whole header is written, zero padded).  version is
 * SEL_RECORD_VERSION, or 1 for test vectors (no flags, 4 KiB header, no
 * header checksum).  Returns the header bytes, or SEL_EFORMAT (bad desc),
 * SEL_EOVERSIZE (a v1 table that needs more than 4 KiB), -EINVAL (version,
 * short buffer) with a message. */
int sel_record_encode(const sel_record_ns *ns, const sel_record_desc *d, uint64_t row_checksum,
		      uint64_t created_ns, uint32_t version, void *buf, size_t len);

/* The header size that buf's first 4 KiB announce, so a reader knows how
 * much to read: 4096..65536, or SEL_EFORMAT (len < 4096, magic, version,
 * size field). */
int sel_record_header_bytes(const void *buf, size_t len);

/* Decode and validate a header from buf[0..len) (never reads past len).
 * Every structural rule of docs/record-format.md is checked: magic,
 * version, flags, sizes, zero padding and reserved fields, the rank table,
 * the desc rules of sel_record_span_of, the stored offsets against the
 * computed span, and (v2) the header checksum.  With ns, also the identity
 * (SEL_EIDENTITY), the fingerprint and the rank table (SEL_ELAYOUT).
 * Returns 0, SEL_EFORMAT, SEL_ECORRUPT (header checksum), SEL_EIDENTITY,
 * SEL_ELAYOUT, with a message; *out is written only on success. */
int sel_record_decode(const void *buf, size_t len, const sel_record_ns *ns, sel_record_header *out);

/* Whether a decoded header describes exactly record d: key, parent,
 * bucket, tail, flags and every offset.  0 or SEL_ECORRUPT naming the
 * first field that differs. */
int sel_record_header_matches(const sel_record_header *h, const sel_record_desc *d,
			      const sel_record_span *want);

/* ---- Verification (the disk thread's read checks, shared with tools) ---- */

/* The length rule: a file is page-only (span->row_off bytes) or full
 * (span->row_end).  0 with *has_row (may be NULL), or SEL_ECORRUPT "length N
 * is neither the page-only X nor the full Y". */
int sel_record_check_length(const sel_record_span *s, uint64_t size, bool *has_row);
/* Stored page record i (stride bytes, padding included) against its entry
 * want from the checksum segment: 0 or SEL_ECORRUPT "page record i fails
 * its checksum (...)". */
int sel_record_check_page(const void *page, uint64_t stride, uint64_t want, uint32_t i);
/* Version 4 (issue 18, overlapped restores): the writer zeroes a page
 * record's padding -- each plane's bytes up to its 4 KiB boundary -- before
 * hashing and writing it, so a version-4 page checksum can be recomputed
 * from the planes alone (sel_page_digest_padded).  page: a stored page
 * record (flags: SEL_RECORD_PAGES_REPLICATED for one share), writable. */
#define SEL_RECORD_VERSION_ZERO_PAD 4u
void sel_record_zero_padding(const sel_record_layout *l, uint32_t flags, void *page);
/* The stored rows as unpadded pieces in file order (sel_record_row_iov, or
 * one piece per stored row of a row segment read whole) against the
 * header's row checksum: 0 or SEL_ECORRUPT "the row fails its checksum
 * (...)". */
int sel_record_check_row(const struct iovec *iov, uint32_t n, uint64_t want);

/* ---- Names ------------------------------------------------------------- */

/* "<consumed, 16 hex>-<digest, 32 hex>.ckpt" */
void sel_record_name(const sel_key *key, char out[SEL_RECORD_NAME_MAX]);
/* Parse a record name exactly (lower-case hex, nothing after ".ckpt"):
 * 0 or SEL_EFORMAT. */
int sel_record_name_parse(const char *name, sel_key *key);
/* ".tmp-<name>-<16 hex of nonce>" */
void sel_record_tmp_name(const char *name, uint64_t nonce, char out[SEL_RECORD_TMPNAME_MAX]);
static inline bool sel_record_is_tmp_name(const char *name)
{
	return name[0] == '.' && name[1] == 't' && name[2] == 'm' && name[3] == 'p' &&
	       name[4] == '-';
}

/* ---- Payload addresses from slots (design 2.5 slot layout) -------------- */

/* Address of stored page record i of a record whose pages sit in slots:
 * per-rank, record i is slot slots[i]; replicated, share i lives in slot
 * slots[i / ranks] at rank (i % ranks)'s share offset. */
void *sel_record_page_addr(const sel_record_layout *l, uint32_t flags, void *const *slots,
			   uint32_t i);
/* Slots a row occupies: max over ranks of ceil(row / share) per-rank;
 * replicated, ceil(ceil(row0 / share0) / ranks). */
uint32_t sel_record_row_slots(const sel_record_layout *l, uint32_t flags);
/* The stored row's pieces in file order into iov[0..cap): rank-major, piece
 * i of rank r at slot i + share_off[r] (replicated: piece j of the one row
 * at slot j / ranks + share_off[j % ranks]).  Returns the piece count, or
 * -ENOBUFS when cap is too small.  Piece lengths are unpadded; the disk
 * thread pads each rank's last piece to 4 KiB within its share. */
int sel_record_row_iov(const sel_record_layout *l, uint32_t flags, void *const *slots,
		       uint32_t n_slots, struct iovec *iov, uint32_t cap);

/* XXH3-64 of the stored row bytes given as pieces (unpadded lengths,
 * file order).  The row checksum of the header. */
uint64_t sel_record_row_checksum(const struct iovec *iov, uint32_t n);

/* One row piece as file I/O: len is the piece padded where a stored row
 * ends (to 4 KiB; the bytes past data belong to the piece's slot share),
 * off its offset in the row segment. */
struct sel_record_piece {
	void *addr;
	uint64_t data; /* row bytes in the piece */
	uint64_t len;  /* bytes to transfer */
	uint64_t off;  /* offset in the row segment */
};
/* Check row pieces against the layout and plan them: the pieces of each
 * stored row (rank-major; one row when replicated) must sum to its row
 * bytes, every piece must start 4 KiB aligned, and every piece but a row's
 * last must be a multiple of 4 KiB.  0 or -EINVAL with a message.  out
 * (n entries) may be NULL to check only. */
int sel_record_row_plan(const sel_record_layout *l, uint32_t flags, const struct iovec *iov,
			uint32_t n, struct sel_record_piece *out);

/* ---- File protocol (record_io.c) ---------------------------------------- */

/* Create <base>/<ns->dirname> (and base) if missing, take its exclusive
 * nonblocking lock and prove a file can be created and removed in it: 0;
 * -EBUSY when another owner holds it; SEL_EDIRECTORY when the directory
 * cannot be used by this process -- a regular file or a symbolic link at
 * its name (never followed), no permission to create files there (the
 * probe runs as the process is, so it tells the truth for root too), a
 * read-only filesystem; another errno otherwise; each with a message
 * naming the directory and why.  The lock's fd is the dirfd of every later
 * call. */
int sel_record_dir_open(const char *base, const sel_record_ns *ns, struct eos_dirlock *lk);

/* Write protocol step 1: create ".tmp-<name>-<nonce>" (O_EXCL; another
 * nonce on EEXIST) with O_DIRECT when *direct (falling back to buffered,
 * *direct = false, where the filesystem refuses) and preallocate len bytes
 * (fallocate; filesystems without it are fine).  Returns the fd with the
 * temporary name in tmp, or a negative errno (nothing left behind). */
int sel_record_tmp_create(int dirfd, const char *name, uint64_t len, uint64_t nonce, bool *direct,
			  char tmp[SEL_RECORD_TMPNAME_MAX]);
/* Step 2 (after every byte is written): fdatasync (SEL_COMMIT_DATASYNC),
 * close, renameat tmp -> name (replacing an older file of that name
 * atomically), fsync the directory (unless SEL_COMMIT_NO_DIR_FSYNC, for
 * bulk set-up only).  fd is closed in every case.  On a failure before the
 * rename the temporary file is removed and *committed is false; a failed
 * directory fsync returns its error with *committed true (the file is in
 * place).  A failed cleanup unlink is named in the message. */
enum {
	SEL_COMMIT_DATASYNC = 1u << 0,
	SEL_COMMIT_NO_DIR_FSYNC = 1u << 1,
};
int sel_record_commit(int dirfd, int fd, const char *tmp, const char *name, unsigned flags,
		      bool *committed);
/* Abandon a temporary file: close fd (if >= 0) and unlink tmp.  Returns
 * the unlink error (the file then stays for the next scan), else 0. */
int sel_record_discard(int dirfd, int fd, const char *tmp);
/* Compaction: truncate name to span->row_off.  The file must be a regular
 * file (a symbolic link, FIFO or other file type under the name is never
 * opened through: SEL_ECORRUPT), the file id names (dev, ino; NULL: any)
 * and page-only or full (SEL_ECORRUPT otherwise); page-only already is a
 * no-op.  *had_row (may be NULL) tells which. */
int sel_record_truncate(int dirfd, const char *name, const sel_record_span *span,
			const struct eos_file_id *id, bool *had_row);
/* Open record file name in dirfd for reading (O_DIRECT when *direct,
 * falling back to buffered where refused: *direct = false) with
 * eos_open_regular: no symbolic link is followed, no FIFO or device opened
 * for I/O, and with id the file must be the one indexed.  Those refusals
 * are SEL_ECORRUPT ("the file under the record's name is not the record"),
 * a missing file -ENOENT, other failures their errno, with a message. */
int sel_record_open(int dirfd, const char *name, bool *direct, const struct eos_file_id *id,
		    struct stat *st);
/* Whether the file fd of size bytes has a hole (SEEK_HOLE before its end):
 * allocated blocks that do not cover its length.  Filesystems without
 * SEEK_HOLE report none.  *at (may be NULL): where the first hole starts. */
bool sel_record_sparse(int fd, uint64_t size, uint64_t *at);
/* Deletion: unlinkat.  A missing file is success (*existed false). */
int sel_record_unlink(int dirfd, const char *name, bool *existed);

/* Synchronous whole-record write through the protocol (tools, tests, the
 * scan benchmark; the disk thread has its own pipelined writer): pages
 * [0, tail) from page addresses (4 KiB aligned, span.page_stride bytes each),
 * the row from pieces when row is true.  no_dir_fsync skips the directory
 * fsync (bulk set-up only); created_ns 0 = now; nonce 0 = from the clock. */
struct sel_record_write_opts {
	bool direct;
	bool datasync;
	bool no_dir_fsync;
	uint64_t created_ns;
	uint64_t nonce;
};
int sel_record_write(int dirfd, const sel_record_ns *ns, const sel_record_desc *d,
		     void *const *pages, bool row, const struct iovec *row_iov, uint32_t row_n,
		     const struct sel_record_write_opts *o);

/* ---- Startup scan ------------------------------------------------------- */

typedef struct sel_scan_record {
	sel_record_desc d;
	bool has_row;
	uint32_t version;
	uint64_t mtime_ns; /* access order */
	uint64_t created_ns;
	uint64_t file_bytes; /* span.row_off or span.row_end */
	sel_record_span span;
	struct eos_file_id id; /* the file the scan read (dev, ino) */
} sel_scan_record;

/* What the scan found and removed, and why. */
typedef struct sel_scan_stats {
	uint64_t entries;       /* directory entries looked at */
	uint64_t records;       /* kept */
	uint64_t with_row;      /* kept with their row */
	uint64_t bytes;         /* bytes of kept records */
	uint64_t tmp_removed;   /* temporaries of interrupted writes */
	uint64_t bad_format;    /* magic, version, structure */
	uint64_t bad_checksum;  /* v2 header checksum */
	uint64_t bad_identity;  /* another offload identity */
	uint64_t bad_layout;    /* another fingerprint or rank table */
	uint64_t bad_name;      /* name does not match the header's key */
	uint64_t bad_size;      /* length neither page-only nor full */
	uint64_t bad_large;     /* longer than max_file_bytes (the disk limit) */
	uint64_t bad_sparse;    /* holes: allocated blocks do not cover the length */
	uint64_t bad_link;      /* parent link check differs from the parent's bucket */
	uint64_t orphans;       /* parent named, absent, tail not the full chain */
	uint64_t descendants;   /* removed with an orphan */
	uint64_t pruned;        /* childless page-only, cascading */
	uint64_t ignored;       /* names that are not ours, not regular files */
	uint64_t tmp_dirs;      /* ".tmp-*" directories: left alone (not ours to remove) */
	uint64_t unreadable;    /* open/read failed: neither kept nor removed */
	uint64_t unlink_failed; /* removals that failed (files stay) */
	uint64_t bytes_stuck;   /* bytes of unreadable or unremovable files */
	uint64_t bytes_removed;
} sel_scan_stats;

typedef struct sel_scan {
	sel_scan_record *rec; /* surviving records, see sel_record_scan */
	size_t n;
	sel_scan_stats st;
} sel_scan;

/* Why the scan removes a file (sel_scan_opts.on_remove). */
enum sel_scan_why {
	SEL_SCAN_TMP = 1,    /* temporary of an interrupted write */
	SEL_SCAN_FORMAT,     /* bad_format */
	SEL_SCAN_CHECKSUM,   /* bad_checksum (header) */
	SEL_SCAN_IDENTITY,   /* bad_identity */
	SEL_SCAN_LAYOUT,     /* bad_layout */
	SEL_SCAN_NAME,       /* bad_name */
	SEL_SCAN_SIZE,       /* bad_size */
	SEL_SCAN_ORPHAN,     /* orphans */
	SEL_SCAN_DESCENDANT, /* descendants */
	SEL_SCAN_PRUNED,     /* pruned */
	SEL_SCAN_LARGE,      /* bad_large */
	SEL_SCAN_SPARSE,     /* bad_sparse */
	SEL_SCAN_LINK,       /* bad_link, and every record linking under it */
};
/* "temporary", "format", "header checksum", "identity", "layout", "name",
 * "size", "orphan", "descendant of an orphan", "childless page-only",
 * "too large", "sparse", "parent link". */
const char *sel_scan_why_name(enum sel_scan_why why);

struct sel_scan_opts {
	bool direct;      /* read headers with O_DIRECT (fallback to buffered) */
	uint32_t threads; /* header readers; 0 = 16 */
	bool dry_run;     /* report, remove nothing */
	/* Records longer than this are refused (removed, SEL_SCAN_LARGE) before
	 * any budget is charged: the disk limit.  0 = no bound. */
	uint64_t max_file_bytes;
	/* Called on the calling thread for each file the scan removes (with
	 * dry_run: would remove), in removal order -- temporaries, then records
	 * deepest first.  bytes is the file's length (0 for a temporary, which
	 * is not opened); err is 0, or the failed unlink's negative errno (the
	 * file stays).  NULL: no calls. */
	void (*on_remove)(void *ctx, const char *name, enum sel_scan_why why, uint64_t bytes,
			  int err);
	void *ctx;
};

/* Scan the namespace directory dirfd (the caller holds its eos_dirlock):
 * read every record's header, validate it against ns (magic, version,
 * identity, fingerprint, rank table, name vs key, length vs header, no
 * holes, at most max_file_bytes), and remove what cannot be used:
 * temporaries, invalid files, orphans (parent named but absent and tail not
 * the full chain) and records whose parent link check does not match their
 * parent, with every record that depends on them, and childless page-only
 * records, cascading.  Files whose names are not ours are left alone, and
 * so is every entry that is not a regular file (symbolic links, FIFOs,
 * devices, directories -- ".tmp-*" directories included): each is judged by
 * fstatat without following links and never opened, so nothing outside
 * the directory is read or touched and a FIFO cannot block the scan, on
 * filesystems without d_type too.
 *
 * out->rec lists the survivors in access order: ascending mtime, except
 * that a record's parent (when it links under it) is moved up to just
 * before it -- so inserting the list in order into an index never meets
 * a missing parent.  0 or a negative errno when the directory cannot be
 * read (nothing is removed then) or memory runs out; out is freed with
 * sel_scan_free. */
int sel_record_scan(int dirfd, const sel_record_ns *ns, const struct sel_scan_opts *o,
		    sel_scan *out);
void sel_scan_free(sel_scan *s);

/* ---- Whole-file verification (record_verify.c) -------------------------- */

/* What sel_record_check_file found, the first failure winning. */
enum sel_check_kind {
	SEL_CHECK_OK = 0,
	SEL_CHECK_UNREADABLE,      /* open, fstat or read failed (not a verdict on the bytes) */
	SEL_CHECK_NOT_FILE,        /* not a regular file */
	SEL_CHECK_FORMAT,          /* header: magic, version, structure, or a file too short */
	SEL_CHECK_HEADER_CHECKSUM, /* header: the v2 header checksum */
	SEL_CHECK_IDENTITY,        /* header: another offload identity */
	SEL_CHECK_LAYOUT,          /* header: another fingerprint or rank table */
	SEL_CHECK_NAME,            /* the name is not the header's key */
	SEL_CHECK_SIZE,            /* length neither page-only nor full */
	SEL_CHECK_PAGE,            /* a page record fails its checksum */
	SEL_CHECK_ROW,             /* the row fails its checksum */
	SEL_CHECK_SPARSE,          /* holes: its blocks do not cover its length */
};
/* "ok", "unreadable", "not a file", "format", "header checksum",
 * "identity", "layout", "name", "size", "page checksum", "row checksum",
 * "sparse". */
const char *sel_check_kind_name(enum sel_check_kind k);

struct sel_record_check {
	enum sel_check_kind kind;
	char why[EOS_ERRMSG_MAX]; /* the first failure, "" when OK */
	bool decoded;             /* h holds the decoded header (kind OK, NAME or later) */
	sel_record_header h;
	uint64_t size; /* file length (0 when unreadable) */
	uint64_t mtime_ns;
	bool has_row;       /* valid when kind >= SEL_CHECK_PAGE or OK */
	uint32_t bad_pages; /* 1 when a page record failed (the check stops there) */
	bool bad_row;
	uint64_t bytes_read;
};

/* Check record file `name` in directory dirfd with ordinary buffered reads
 * through eos_fileops(): the header decodes (against ns when given, else
 * structurally only), the name is the header's key, the length is page-only
 * or full -- the checks of the startup scan -- and with payload also what
 * the disk thread checks on a read: every stored page record against its
 * checksum entry and, when the file holds it, the row against the row
 * checksum (sel_record_check_page, sel_record_check_row).  The file is
 * judged by fstatat first: a symbolic link, FIFO or device is never opened
 * (SEL_CHECK_NOT_FILE); a file with holes is not read past its header
 * (SEL_CHECK_SPARSE); reading stops at the first page record that fails.
 * Memory stays bounded whatever tail the header claims.  The verdict is in
 * *out; returns 0, or -ENOMEM (nothing decided). */
int sel_record_check_file(int dirfd, const char *name, const sel_record_ns *ns, bool payload,
			  struct sel_record_check *out);

/* The namespace a record file's header describes (sel_record_ns_from_header
 * over the file's header): for tools that find a directory without knowing
 * its geometry.  0, SEL_E* for a header that does not decode, or a negative
 * errno, with a message. */
int sel_record_ns_load(int dirfd, const char *name, sel_record_ns *ns);

#endif
