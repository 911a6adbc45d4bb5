/*
 * record.c - the record file format, pure: layouts and offsets, header
 * encoding and decoding, names (design 2.5, "A record file lives at ...").
 * docs/record-format.md is the normative description of every byte.
 *
 * DESIGN
 *
 * Nothing here does I/O, so the fuzz target (fuzz/fuzz_record.c) and the
 * tests drive the decoder with arbitrary bytes.  The decoder trusts
 * nothing: every length is checked against what is left of the buffer
 * before it is read, every sum and product of sizes is checked for
 * overflow, and offsets are recomputed from the sizes and compared with the
 * stored ones, so a header can never announce a segment the layout does not
 * imply.  A decoded header is canonical: reserved fields and padding are
 * zero and the v2 header size is the smallest that holds the rank table, so
 * one record has exactly one valid header (apart from its row checksum and
 * creation time), which lets the disk thread compare headers field by
 * field.
 *
 * The rank table (per rank: planes, row bytes, plane unit sizes) is parsed
 * by one function, table_parse, for every caller: a layout built from a
 * geometry is first encoded as a table and then parsed, so the geometry
 * path and the file path cannot disagree about offsets.
 *
 * INVARIANTS
 *   1. A layout's share[r] = sum of round_up(unit, 4 KiB) > 0, share_off is
 *      the prefix sum, sz.page_record = sum of shares; row_off[r] is the
 *      prefix sum of round_up(row_bytes, 4 KiB), sz.row_segment its total.
 *      These equal sel_slot_layout's numbers for the same geometry.
 *   2. Every span has page_off = header_bytes + round_up(8 tail, 4 KiB),
 *      row_off = page_off + tail * stride, row_end = row_off + row segment,
 *      all multiples of 4 KiB and at most INT64_MAX.
 *   3. decode(encode(x)) == x for every valid x, and encode(decode(b)) == b
 *      for every b that decodes.
 */
#define XXH_STATIC_LINKING_ONLY
#include "record.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "xxh.h"

#include "internal.h"

/* Header field offsets (docs/record-format.md, "Header"). */
enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 8,
	OFF_FLAGS = 12,
	OFF_HEADER_BYTES = 16,
	OFF_RANKS = 20,
	OFF_PAGE_TOKENS = 24,
	OFF_TAIL = 28,
	OFF_IDENTITY = 32,
	OFF_FINGERPRINT = 64,
	OFF_KEY = 80, /* u64 consumed, 16-byte digest */
	OFF_PARENT = 104,
	OFF_BUCKET = 128,
	OFF_PAGE_OFF = 144,
	OFF_ROW_OFF = 152,
	OFF_ROW_CHECKSUM = 160,
	OFF_CREATED = 168,
	OFF_HEADER_CHECKSUM = 176,
	OFF_RESERVED = 184,     /* v1, v2: 8 reserved zero bytes */
	OFF_PARENT_CHECK = 184, /* v3: the parent link check (record.h) */
	OFF_TABLE = 192,
	RANK_ENTRY = 16, /* u32 planes, u32 reserved, u64 row bytes */
};

#define ALIGN SEL_RECORD_ALIGN

static uint64_t round_up4k(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

/* ---- Rank table ----------------------------------------------------------- */

/* Allocate l's per-rank arrays for ranks ranks; plane arrays come later. */
static int layout_alloc(sel_record_layout *l, uint32_t ranks)
{
	l->ranks = ranks;
	l->n_planes = calloc(ranks, sizeof(*l->n_planes));
	l->unit = calloc(ranks, sizeof(*l->unit));
	l->plane_off = calloc(ranks, sizeof(*l->plane_off));
	l->row_bytes = calloc(ranks, sizeof(*l->row_bytes));
	l->share = calloc(ranks, sizeof(*l->share));
	l->share_off = calloc(ranks, sizeof(*l->share_off));
	l->row_off = calloc(ranks, sizeof(*l->row_off));
	if (!l->n_planes || !l->unit || !l->plane_off || !l->row_bytes || !l->share ||
	    !l->share_off || !l->row_off)
		return eos_fail(-ENOMEM, "record layout: out of memory for %" PRIu32 " ranks",
				ranks);
	return 0;
}

/*
 * Parse the rank table at t[0..avail) for ranks ranks: fill *sz (ranks and
 * page tokens are set by the caller) and *used, and when l is non-NULL also
 * the layout's arrays.  Never reads past avail.
 */
static int table_parse(const uint8_t *t, size_t avail, uint32_t ranks, struct sel_record_sizes *sz,
		       size_t *used, sel_record_layout *l)
{
	size_t pos = 0;
	uint64_t page_record = 0, row_segment = 0;
	const uint8_t *planes0 = NULL;
	uint32_t n0 = 0;
	uint64_t row0 = 0;
	bool uniform_planes = ranks > 1, uniform_row = ranks > 1;
	int rc;

	if (l && (rc = layout_alloc(l, ranks)) != 0)
		return rc;
	for (uint32_t r = 0; r < ranks; r++) {
		if (avail - pos < RANK_ENTRY)
			return eos_fail(SEL_EFORMAT,
					"record header: rank table ends inside rank %" PRIu32
					" (header too short for %" PRIu32 " ranks)",
					r, ranks);
		uint32_t n = sel_get_u32(t + pos);
		uint32_t reserved = sel_get_u32(t + pos + 4);
		uint64_t row = sel_get_u64(t + pos + 8);
		pos += RANK_ENTRY;
		if (n == 0)
			return eos_fail(SEL_EFORMAT,
					"record header: rank %" PRIu32 " has no page planes", r);
		if (reserved != 0)
			return eos_fail(SEL_EFORMAT,
					"record header: rank %" PRIu32 " reserved field is %" PRIu32
					", not 0",
					r, reserved);
		if (row == 0)
			return eos_fail(SEL_EFORMAT,
					"record header: rank %" PRIu32 " has a 0-byte row", r);
		if (row > UINT64_MAX - (ALIGN - 1))
			return eos_fail(-EOVERFLOW,
					"record header: rank %" PRIu32 " row of %" PRIu64
					" bytes cannot be padded",
					r, row);
		if ((avail - pos) / 8 < n)
			return eos_fail(SEL_EFORMAT,
					"record header: rank %" PRIu32 " lists %" PRIu32
					" planes, more than the header holds",
					r, n);
		const uint8_t *planes = t + pos;
		if (l) {
			l->n_planes[r] = n;
			l->row_bytes[r] = row;
			l->unit[r] = calloc(n, sizeof(**l->unit));
			l->plane_off[r] = calloc(n, sizeof(**l->plane_off));
			if (!l->unit[r] || !l->plane_off[r])
				return eos_fail(-ENOMEM,
						"record layout: out of memory for rank %" PRIu32
						" planes",
						r);
		}
		uint64_t share = 0;
		for (uint32_t i = 0; i < n; i++) {
			uint64_t u = sel_get_u64(planes + 8 * (size_t)i);
			if (u == 0)
				return eos_fail(SEL_EFORMAT,
						"record header: rank %" PRIu32 " plane %" PRIu32
						" has unit size 0",
						r, i);
			if (u > UINT64_MAX - (ALIGN - 1))
				return eos_fail(-EOVERFLOW,
						"record header: rank %" PRIu32 " plane %" PRIu32
						" unit %" PRIu64 " cannot be padded",
						r, i, u);
			if (l) {
				l->unit[r][i] = u;
				l->plane_off[r][i] = share;
			}
			if (__builtin_add_overflow(share, round_up4k(u), &share))
				return eos_fail(
					-EOVERFLOW,
					"record header: rank %" PRIu32 " share exceeds 64 bits", r);
		}
		pos += 8 * (size_t)n;
		if (l) {
			l->share[r] = share;
			l->share_off[r] = page_record;
			l->row_off[r] = row_segment;
		}
		if (__builtin_add_overflow(page_record, share, &page_record) ||
		    __builtin_add_overflow(row_segment, round_up4k(row), &row_segment))
			return eos_fail(-EOVERFLOW,
					"record header: page record or row segment exceeds "
					"64 bits at rank %" PRIu32,
					r);
		if (r == 0) {
			planes0 = planes;
			n0 = n;
			row0 = row;
			sz->share0 = share;
			sz->row0_padded = round_up4k(row);
		} else {
			if (n != n0 || memcmp(planes, planes0, 8 * (size_t)n) != 0)
				uniform_planes = false;
			if (row != row0)
				uniform_row = false;
		}
	}
	sz->page_record = page_record;
	sz->row_segment = row_segment;
	sz->uniform_planes = uniform_planes;
	sz->uniform_row = uniform_row;
	*used = pos;
	uint64_t hb = round_up4k((uint64_t)OFF_TABLE + pos);
	sz->header_bytes = hb <= SEL_RECORD_HEADER_MAX ? (uint32_t)hb : 0;
	return 0;
}

/* ---- Layouts -------------------------------------------------------------- */

void sel_record_layout_free(sel_record_layout *l)
{
	if (!l)
		return;
	for (uint32_t r = 0; r < l->ranks; r++) {
		if (l->unit)
			free(l->unit[r]);
		if (l->plane_off)
			free(l->plane_off[r]);
	}
	free(l->n_planes);
	free(l->unit);
	free(l->plane_off);
	free(l->row_bytes);
	free(l->share);
	free(l->share_off);
	free(l->row_off);
	free(l->table);
	memset(l, 0, sizeof(*l));
}

/* Build l from an encoded table t[0..len) (which l then owns). */
static int layout_from_table(sel_record_layout *l, uint8_t *t, size_t len, uint32_t ranks,
			     uint32_t page_tokens)
{
	size_t used = 0;
	memset(l, 0, sizeof(*l));
	l->table = t;
	l->table_bytes = (uint32_t)len;
	l->sz.ranks = ranks;
	l->sz.page_tokens = page_tokens;
	int rc = table_parse(t, len, ranks, &l->sz, &used, l);
	if (rc == 0 && used != len)
		rc = eos_fail(SEL_EFORMAT, "record layout: rank table has %zu trailing bytes",
			      len - used);
	if (rc == 0 && l->sz.header_bytes == 0)
		rc = eos_fail(SEL_EOVERSIZE,
			      "record layout: the rank table of %zu bytes does not fit a "
			      "%u-byte header",
			      len, SEL_RECORD_HEADER_MAX);
	if (rc)
		sel_record_layout_free(l);
	return rc;
}

int sel_record_layout_init(sel_record_layout *l, const sel_geometry *g)
{
	memset(l, 0, sizeof(*l));
	if (!g || g->ranks == 0 || !g->rank)
		return eos_fail(SEL_EGEOMETRY, "record layout: geometry has no ranks");
	if (g->page_tokens == 0 || g->page_tokens % SEL_BUCKET_TOKENS != 0)
		return eos_fail(SEL_EGEOMETRY,
				"record layout: page tokens %" PRIu32
				" is not a positive multiple of %d",
				g->page_tokens, SEL_BUCKET_TOKENS);
	uint64_t len = 0;
	for (uint32_t r = 0; r < g->ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		if (rg->n_planes == 0 || !rg->pages)
			return eos_fail(SEL_EGEOMETRY,
					"record layout: rank %" PRIu32 " has no page planes", r);
		if (rg->row.unit_bytes == 0)
			return eos_fail(SEL_EGEOMETRY,
					"record layout: rank %" PRIu32 " row has unit size 0", r);
		for (uint32_t i = 0; i < rg->n_planes; i++)
			if (rg->pages[i].unit_bytes == 0)
				return eos_fail(SEL_EGEOMETRY,
						"record layout: rank %" PRIu32 " plane '%s' has "
						"unit size 0",
						r, rg->pages[i].name ? rg->pages[i].name : "?");
		len += RANK_ENTRY + 8 * (uint64_t)rg->n_planes;
		if (len > SEL_RECORD_HEADER_MAX)
			return eos_fail(SEL_EOVERSIZE,
					"record layout: %" PRIu32 " ranks' plane tables exceed "
					"the %u-byte header limit",
					g->ranks, SEL_RECORD_HEADER_MAX);
	}
	uint8_t *t = calloc(1, len ? len : 1);
	if (!t)
		return eos_fail(-ENOMEM, "record layout: out of memory");
	size_t pos = 0;
	for (uint32_t r = 0; r < g->ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		sel_put_u32(t + pos, rg->n_planes);
		sel_put_u64(t + pos + 8, rg->row.unit_bytes);
		pos += RANK_ENTRY;
		for (uint32_t i = 0; i < rg->n_planes; i++, pos += 8)
			sel_put_u64(t + pos, rg->pages[i].unit_bytes);
	}
	return layout_from_table(l, t, len, g->ranks, g->page_tokens);
}

int sel_record_layout_parse(sel_record_layout *l, const void *hdr, size_t len)
{
	sel_record_header h;
	memset(l, 0, sizeof(*l));
	int rc = sel_record_decode(hdr, len, NULL, &h);
	if (rc)
		return rc;
	const uint8_t *b = hdr;
	struct sel_record_sizes sz = {0};
	size_t used = 0;
	rc = table_parse(b + OFF_TABLE, h.span.header_bytes - OFF_TABLE, h.ranks, &sz, &used, NULL);
	if (rc)
		return rc;
	uint8_t *t = malloc(used ? used : 1);
	if (!t)
		return eos_fail(-ENOMEM, "record layout: out of memory");
	memcpy(t, b + OFF_TABLE, used);
	return layout_from_table(l, t, used, h.ranks, h.page_tokens);
}

/* ---- Namespaces ------------------------------------------------------------- */

void sel_record_dirname(const uint8_t identity[SEL_IDENTITY_BYTES],
			const uint8_t fingerprint[SEL_FINGERPRINT_BYTES],
			char out[SEL_RECORD_DIRNAME_MAX])
{
	char id[2 * SEL_IDENTITY_BYTES + 1], fp[2 * SEL_FINGERPRINT_BYTES + 1];
	sel_hex(identity, SEL_IDENTITY_BYTES, id);
	sel_hex(fingerprint, SEL_FINGERPRINT_BYTES, fp);
	snprintf(out, SEL_RECORD_DIRNAME_MAX, "%.*s-%s", SEL_RECORD_ID_PREFIX_HEX, id, fp);
}

int sel_record_ns_init(sel_record_ns *ns, const sel_geometry *g,
		       const uint8_t identity[SEL_IDENTITY_BYTES])
{
	memset(ns, 0, sizeof(*ns));
	int rc = sel_record_layout_init(&ns->layout, g);
	if (rc)
		return rc;
	memcpy(ns->identity, identity, SEL_IDENTITY_BYTES);
	sel_layout_fingerprint(g, ns->fingerprint);
	sel_record_dirname(ns->identity, ns->fingerprint, ns->dirname);
	return 0;
}

void sel_record_ns_free(sel_record_ns *ns)
{
	if (!ns)
		return;
	sel_record_layout_free(&ns->layout);
	memset(ns, 0, sizeof(*ns));
}

int sel_record_ns_from_header(sel_record_ns *ns, const void *hdr, size_t len)
{
	sel_record_header h;
	memset(ns, 0, sizeof(*ns));
	int rc = sel_record_decode(hdr, len, NULL, &h);
	if (rc)
		return rc;
	if ((rc = sel_record_layout_parse(&ns->layout, hdr, len)) != 0)
		return rc;
	memcpy(ns->identity, h.identity, SEL_IDENTITY_BYTES);
	memcpy(ns->fingerprint, h.fingerprint, SEL_FINGERPRINT_BYTES);
	sel_record_dirname(ns->identity, ns->fingerprint, ns->dirname);
	return 0;
}

/* ---- Spans ------------------------------------------------------------------ */

static void key_text(const sel_key *k, char *buf, size_t len)
{
	char hex[2 * SEL_DIGEST_BYTES + 1];
	sel_hex(k->digest.b, SEL_DIGEST_BYTES, hex);
	snprintf(buf, len, "%" PRIu64 "/%.8s", k->consumed, hex);
}

bool sel_record_links_parent(const sel_record_desc *d, uint32_t page_tokens)
{
	if (sel_key_is_none(&d->parent) || page_tokens == 0 ||
	    d->parent.consumed >= d->key.consumed)
		return false;
	uint64_t derived = d->key.consumed / page_tokens - d->parent.consumed / page_tokens;
	return d->tail == derived;
}

int sel_record_span_of(const struct sel_record_sizes *sz, const sel_record_desc *d,
		       sel_record_span *out)
{
	char kt[64];
	uint32_t pt = sz->page_tokens;
	if (pt == 0 || pt % SEL_BUCKET_TOKENS != 0)
		return eos_fail(SEL_EFORMAT,
				"record: page tokens %" PRIu32 " is not a positive multiple "
				"of %d",
				pt, SEL_BUCKET_TOKENS);
	if (sz->ranks == 0 || sz->header_bytes == 0)
		return eos_fail(SEL_EFORMAT, "record: layout without ranks or header size");
	uint64_t c = d->key.consumed;
	key_text(&d->key, kt, sizeof kt);
	if (c == 0)
		return eos_fail(SEL_EFORMAT, "record: key consumes 0 tokens");
	uint64_t full = c / pt;
	if (sel_key_is_none(&d->parent)) {
		if (d->parent_check)
			return eos_fail(SEL_EFORMAT,
					"record %s: a parent link check without a parent", kt);
		if (d->tail != full)
			return eos_fail(SEL_EFORMAT,
					"record %s: a root must hold its full chain of %" PRIu64
					" pages, not %" PRIu32,
					kt, full, d->tail);
	} else {
		uint64_t p = d->parent.consumed;
		if (p == 0)
			return eos_fail(SEL_EFORMAT,
					"record %s: parent consumes 0 tokens but is not none", kt);
		if (p >= c)
			return eos_fail(SEL_EFORMAT,
					"record %s: parent consumes %" PRIu64 " tokens, not "
					"fewer than the key",
					kt, p);
		uint64_t derived = full - p / pt;
		if (d->tail != derived && d->tail != full)
			return eos_fail(SEL_EFORMAT,
					"record %s: tail of %" PRIu32
					" pages is neither the %" PRIu64
					" since the parent nor the full chain of %" PRIu64,
					kt, d->tail, derived, full);
	}
	if (d->flags & ~SEL_RECORD_FLAGS_KNOWN)
		return eos_fail(SEL_EFORMAT, "record %s: unknown flags 0x%" PRIx32, kt,
				d->flags & ~SEL_RECORD_FLAGS_KNOWN);
	if ((d->flags & SEL_RECORD_PAGES_REPLICATED) && !sz->uniform_planes)
		return eos_fail(SEL_EFORMAT,
				"record %s: replicated pages need several ranks with equal "
				"planes",
				kt);
	if ((d->flags & SEL_RECORD_ROW_REPLICATED) && !sz->uniform_row)
		return eos_fail(SEL_EFORMAT,
				"record %s: a replicated row needs several ranks with "
				"equal rows",
				kt);

	sel_record_span s = {0};
	s.header_bytes = sz->header_bytes;
	s.row_ranks = (d->flags & SEL_RECORD_ROW_REPLICATED) ? 1 : sz->ranks;
	s.cksum_off = sz->header_bytes;
	s.cksum_bytes = round_up4k(8 * (uint64_t)d->tail);
	s.page_off = s.cksum_off + s.cksum_bytes;
	s.page_stride = (d->flags & SEL_RECORD_PAGES_REPLICATED) ? sz->share0 : sz->page_record;
	s.row_bytes = (d->flags & SEL_RECORD_ROW_REPLICATED) ? sz->row0_padded : sz->row_segment;
	uint64_t pages;
	if (s.page_stride == 0 || s.row_bytes == 0 || s.page_stride % ALIGN || s.row_bytes % ALIGN)
		return eos_fail(SEL_EFORMAT,
				"record %s: page record of %" PRIu64 " or row segment of %" PRIu64
				" bytes is not a positive multiple of 4 KiB",
				kt, s.page_stride, s.row_bytes);
	if (__builtin_mul_overflow((uint64_t)d->tail, s.page_stride, &pages) ||
	    __builtin_add_overflow(s.page_off, pages, &s.row_off) ||
	    __builtin_add_overflow(s.row_off, s.row_bytes, &s.row_end) || s.row_end > INT64_MAX)
		return eos_fail(-EOVERFLOW,
				"record %s: %" PRIu32 " page records of %" PRIu64
				" bytes exceed the largest file",
				kt, d->tail, s.page_stride);
	*out = s;
	return 0;
}

/* ---- Encode ----------------------------------------------------------------- */

uint64_t sel_record_parent_check(const sel_digest *b)
{
	uint64_t v = sel_get_u64(b->b);
	return v ? v : 1;
}

static void put_key(uint8_t *p, const sel_key *k)
{
	sel_put_u64(p, k->consumed);
	memcpy(p + 8, k->digest.b, SEL_DIGEST_BYTES);
}

static void get_key(const uint8_t *p, sel_key *k)
{
	k->consumed = sel_get_u64(p);
	memcpy(k->digest.b, p + 8, SEL_DIGEST_BYTES);
}

/* XXH3-64 of b[0..hb) with the header checksum field read as zero. */
static uint64_t header_checksum(const uint8_t *b, uint32_t hb)
{
	static const uint8_t zero[8];
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, b, OFF_HEADER_CHECKSUM);
	XXH3_64bits_update(&st, zero, sizeof zero);
	XXH3_64bits_update(&st, b + OFF_RESERVED, hb - OFF_RESERVED);
	return XXH3_64bits_digest(&st);
}

int sel_record_encode(const sel_record_ns *ns, const sel_record_desc *d, uint64_t row_checksum,
		      uint64_t created_ns, uint32_t version, void *buf, size_t len)
{
	const sel_record_layout *l = &ns->layout;
	sel_record_span s;
	if (version < SEL_RECORD_VERSION_MIN || version > SEL_RECORD_VERSION)
		return eos_fail(-EINVAL, "record encode: version %" PRIu32 " (can write %u..%u)",
				version, SEL_RECORD_VERSION_MIN, SEL_RECORD_VERSION);
	int rc = sel_record_span_of(&l->sz, d, &s);
	if (rc)
		return rc;
	if (version < 3 && d->parent_check)
		return eos_fail(SEL_EFORMAT,
				"record encode: version %" PRIu32 " has no parent link "
				"check",
				version);
	if (version == 1) {
		if (d->flags)
			return eos_fail(SEL_EFORMAT,
					"record encode: version 1 has no flags (0x%" PRIx32 ")",
					d->flags);
		if (s.header_bytes != SEL_RECORD_HEADER_MIN)
			return eos_fail(SEL_EOVERSIZE,
					"record encode: version 1 headers are 4 KiB; this "
					"rank table needs %" PRIu32,
					s.header_bytes);
	}
	if (len < s.header_bytes)
		return eos_fail(-EINVAL,
				"record encode: buffer of %zu bytes, header needs %" PRIu32, len,
				s.header_bytes);
	uint8_t *b = buf;
	memset(b, 0, s.header_bytes);
	/* NOLINTNEXTLINE(bugprone-not-null-terminated-result): 8 bytes, no NUL by the format */
	memcpy(b + OFF_MAGIC, SEL_RECORD_MAGIC, 8);
	sel_put_u32(b + OFF_VERSION, version);
	sel_put_u32(b + OFF_FLAGS, d->flags);
	sel_put_u32(b + OFF_HEADER_BYTES, version == 1 ? 0 : s.header_bytes);
	sel_put_u32(b + OFF_RANKS, l->sz.ranks);
	sel_put_u32(b + OFF_PAGE_TOKENS, l->sz.page_tokens);
	sel_put_u32(b + OFF_TAIL, d->tail);
	memcpy(b + OFF_IDENTITY, ns->identity, SEL_IDENTITY_BYTES);
	memcpy(b + OFF_FINGERPRINT, ns->fingerprint, SEL_FINGERPRINT_BYTES);
	put_key(b + OFF_KEY, &d->key);
	put_key(b + OFF_PARENT, &d->parent);
	memcpy(b + OFF_BUCKET, d->bucket.b, SEL_DIGEST_BYTES);
	sel_put_u64(b + OFF_PAGE_OFF, s.page_off);
	sel_put_u64(b + OFF_ROW_OFF, s.row_off);
	sel_put_u64(b + OFF_ROW_CHECKSUM, row_checksum);
	sel_put_u64(b + OFF_CREATED, created_ns);
	if (version >= 3)
		sel_put_u64(b + OFF_PARENT_CHECK, d->parent_check);
	memcpy(b + OFF_TABLE, l->table, l->table_bytes);
	if (version >= 2)
		sel_put_u64(b + OFF_HEADER_CHECKSUM, header_checksum(b, s.header_bytes));
	return (int)s.header_bytes;
}

/* ---- Decode ----------------------------------------------------------------- */

int sel_record_header_bytes(const void *buf, size_t len)
{
	const uint8_t *b = buf;
	if (len < SEL_RECORD_HEADER_MIN)
		return eos_fail(SEL_EFORMAT, "record header: %zu bytes, need at least %u", len,
				SEL_RECORD_HEADER_MIN);
	if (memcmp(b + OFF_MAGIC, SEL_RECORD_MAGIC, 8) != 0)
		return eos_fail(SEL_EFORMAT, "record header: bad magic (not a FLARECKP record)");
	uint32_t version = sel_get_u32(b + OFF_VERSION);
	if (version < SEL_RECORD_VERSION_MIN || version > SEL_RECORD_VERSION)
		return eos_fail(SEL_EFORMAT,
				"record header: version %" PRIu32 " (this build reads %u..%u)",
				version, SEL_RECORD_VERSION_MIN, SEL_RECORD_VERSION);
	uint32_t hb = sel_get_u32(b + OFF_HEADER_BYTES);
	if (version == 1) {
		if (hb != 0)
			return eos_fail(SEL_EFORMAT,
					"record header: version 1 reserved field at %d is %" PRIu32,
					OFF_HEADER_BYTES, hb);
		return SEL_RECORD_HEADER_MIN;
	}
	if (hb < SEL_RECORD_HEADER_MIN || hb > SEL_RECORD_HEADER_MAX || hb % ALIGN != 0)
		return eos_fail(SEL_EFORMAT,
				"record header: header size %" PRIu32 " is not a multiple "
				"of 4 KiB in %u..%u",
				hb, SEL_RECORD_HEADER_MIN, SEL_RECORD_HEADER_MAX);
	return (int)hb;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

int sel_record_decode(const void *buf, size_t len, const sel_record_ns *ns, sel_record_header *out)
{
	const uint8_t *b = buf;
	sel_record_header h;
	memset(&h, 0, sizeof(h));
	int hb = sel_record_header_bytes(buf, len);
	if (hb < 0)
		return hb;
	if (len < (size_t)hb)
		return eos_fail(SEL_EFORMAT, "record header: %zu bytes of a %d-byte header", len,
				hb);
	h.version = sel_get_u32(b + OFF_VERSION);
	h.d.flags = sel_get_u32(b + OFF_FLAGS);
	h.header_checksum = sel_get_u64(b + OFF_HEADER_CHECKSUM);
	if (h.version >= 2) {
		uint64_t want = header_checksum(b, (uint32_t)hb);
		if (want != h.header_checksum)
			return eos_fail(SEL_ECORRUPT,
					"record header: checksum %016" PRIx64 " does not match "
					"its bytes (%016" PRIx64 ")",
					h.header_checksum, want);
	} else {
		if (h.d.flags)
			return eos_fail(SEL_EFORMAT,
					"record header: version 1 has no flags (0x%" PRIx32 ")",
					h.d.flags);
		if (h.header_checksum)
			return eos_fail(SEL_EFORMAT,
					"record header: version 1 reserved field at %d is not 0",
					OFF_HEADER_CHECKSUM);
	}
	if (h.d.flags & ~SEL_RECORD_FLAGS_KNOWN)
		return eos_fail(SEL_EFORMAT, "record header: unknown flags 0x%" PRIx32,
				h.d.flags & ~SEL_RECORD_FLAGS_KNOWN);
	if (h.version >= 3)
		h.d.parent_check = sel_get_u64(b + OFF_PARENT_CHECK);
	else if (!all_zero(b + OFF_RESERVED, OFF_TABLE - OFF_RESERVED))
		return eos_fail(SEL_EFORMAT, "record header: reserved bytes %d..%d are not 0",
				OFF_RESERVED, OFF_TABLE - 1);
	h.ranks = sel_get_u32(b + OFF_RANKS);
	h.page_tokens = sel_get_u32(b + OFF_PAGE_TOKENS);
	h.d.tail = sel_get_u32(b + OFF_TAIL);
	memcpy(h.identity, b + OFF_IDENTITY, SEL_IDENTITY_BYTES);
	memcpy(h.fingerprint, b + OFF_FINGERPRINT, SEL_FINGERPRINT_BYTES);
	get_key(b + OFF_KEY, &h.d.key);
	get_key(b + OFF_PARENT, &h.d.parent);
	memcpy(h.d.bucket.b, b + OFF_BUCKET, SEL_DIGEST_BYTES);
	uint64_t page_off = sel_get_u64(b + OFF_PAGE_OFF);
	uint64_t row_off = sel_get_u64(b + OFF_ROW_OFF);
	h.row_checksum = sel_get_u64(b + OFF_ROW_CHECKSUM);
	h.created_ns = sel_get_u64(b + OFF_CREATED);
	if (h.ranks == 0)
		return eos_fail(SEL_EFORMAT, "record header: 0 ranks");
	if (h.page_tokens == 0 || h.page_tokens % SEL_BUCKET_TOKENS != 0)
		return eos_fail(SEL_EFORMAT,
				"record header: page tokens %" PRIu32 " is not a positive "
				"multiple of %d",
				h.page_tokens, SEL_BUCKET_TOKENS);

	struct sel_record_sizes sz = {.ranks = h.ranks, .page_tokens = h.page_tokens};
	size_t used = 0;
	int rc = table_parse(b + OFF_TABLE, (size_t)hb - OFF_TABLE, h.ranks, &sz, &used, NULL);
	if (rc)
		return rc;
	if (!all_zero(b + OFF_TABLE + used, (size_t)hb - OFF_TABLE - used))
		return eos_fail(SEL_EFORMAT, "record header: bytes after the rank table are not 0");
	if (sz.header_bytes != (uint32_t)hb)
		return eos_fail(SEL_EFORMAT,
				"record header: header size %d is not the %" PRIu32
				" its rank table needs",
				hb, sz.header_bytes);

	if (ns) {
		if (memcmp(h.identity, ns->identity, SEL_IDENTITY_BYTES) != 0) {
			char a[65], w[65];
			sel_hex(h.identity, SEL_IDENTITY_BYTES, a);
			sel_hex(ns->identity, SEL_IDENTITY_BYTES, w);
			return eos_fail(SEL_EIDENTITY,
					"record header: offload identity %.16s... is not this "
					"namespace's %.16s...",
					a, w);
		}
		if (memcmp(h.fingerprint, ns->fingerprint, SEL_FINGERPRINT_BYTES) != 0) {
			char a[33], w[33];
			sel_hex(h.fingerprint, SEL_FINGERPRINT_BYTES, a);
			sel_hex(ns->fingerprint, SEL_FINGERPRINT_BYTES, w);
			return eos_fail(SEL_ELAYOUT,
					"record header: layout fingerprint %s is not this "
					"namespace's %s",
					a, w);
		}
		const sel_record_layout *l = &ns->layout;
		if (h.ranks != l->sz.ranks || h.page_tokens != l->sz.page_tokens ||
		    used != l->table_bytes || memcmp(b + OFF_TABLE, l->table, used) != 0)
			return eos_fail(SEL_ELAYOUT,
					"record header: ranks, page tokens or plane sizes differ "
					"from this namespace's layout (same fingerprint)");
	}

	rc = sel_record_span_of(&sz, &h.d, &h.span);
	if (rc)
		return eos_fail(rc, "record header: %s", eos_errmsg());
	if (page_off != h.span.page_off || row_off != h.span.row_off)
		return eos_fail(SEL_EFORMAT,
				"record header: page segment at %" PRIu64 " and row segment "
				"at %" PRIu64 ", but its sizes put them at %" PRIu64
				" and %" PRIu64,
				page_off, row_off, h.span.page_off, h.span.row_off);
	*out = h;
	return 0;
}

int sel_record_header_matches(const sel_record_header *h, const sel_record_desc *d,
			      const sel_record_span *want)
{
	const char *what = NULL;
	if (!sel_key_eq(&h->d.key, &d->key))
		what = "key";
	else if (!sel_key_eq(&h->d.parent, &d->parent))
		what = "parent key";
	else if (memcmp(h->d.bucket.b, d->bucket.b, SEL_DIGEST_BYTES) != 0)
		what = "bucket digest";
	else if (h->d.tail != d->tail)
		what = "tail page count";
	else if (h->d.flags != d->flags)
		what = "replication flags";
	else if (h->d.parent_check != d->parent_check)
		what = "parent link check";
	else if (memcmp(&h->span, want, sizeof(*want)) != 0)
		what = "segment offsets";
	if (!what)
		return 0;
	char kt[64];
	key_text(&d->key, kt, sizeof kt);
	return eos_fail(SEL_ECORRUPT,
			"record %s: the file's header changed since it was indexed "
			"(%s differs)",
			kt, what);
}

/* ---- Verification ----------------------------------------------------------- */

int sel_record_check_length(const sel_record_span *s, uint64_t size, bool *has_row)
{
	if (size != s->row_off && size != s->row_end)
		return eos_fail(SEL_ECORRUPT,
				"length %" PRIu64 " is neither the page-only %" PRIu64
				" nor the full %" PRIu64,
				size, s->row_off, s->row_end);
	if (has_row)
		*has_row = size == s->row_end;
	return 0;
}

int sel_record_check_page(const void *page, uint64_t stride, uint64_t want, uint32_t i)
{
	uint64_t got = XXH3_64bits(page, stride);
	if (got != want)
		return eos_fail(SEL_ECORRUPT,
				"page record %" PRIu32 " fails its checksum (%016" PRIx64
				", stored %016" PRIx64 ")",
				i, got, want);
	return 0;
}

void sel_record_zero_padding(const sel_record_layout *l, uint32_t flags, void *page)
{
	uint32_t ranks = (flags & SEL_RECORD_PAGES_REPLICATED) ? 1 : l->ranks;
	for (uint32_t r = 0; r < ranks; r++)
		for (uint32_t p = 0; p < l->n_planes[r]; p++) {
			uint64_t u = l->unit[r][p], pad = eos_round_up(u, SEL_RECORD_ALIGN) - u;
			if (pad)
				memset((uint8_t *)page + l->share_off[r] + l->plane_off[r][p] + u,
				       0, (size_t)pad);
		}
}

int sel_record_check_row(const struct iovec *iov, uint32_t n, uint64_t want)
{
	uint64_t got = sel_record_row_checksum(iov, n);
	if (got != want)
		return eos_fail(SEL_ECORRUPT,
				"the row fails its checksum (%016" PRIx64 ", stored %016" PRIx64
				")",
				got, want);
	return 0;
}

/* ---- Names ------------------------------------------------------------------ */

void sel_record_name(const sel_key *key, char out[SEL_RECORD_NAME_MAX])
{
	char hex[2 * SEL_DIGEST_BYTES + 1];
	sel_hex(key->digest.b, SEL_DIGEST_BYTES, hex);
	snprintf(out, SEL_RECORD_NAME_MAX, "%016" PRIx64 "-%s.ckpt", key->consumed, hex);
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int sel_record_name_parse(const char *name, sel_key *key)
{
	/* 16 hex, '-', 32 hex, ".ckpt" */
	size_t n = strnlen(name, 64);
	if (n != 54 || name[16] != '-' || memcmp(name + 49, ".ckpt", 6) != 0)
		return eos_fail(SEL_EFORMAT, "record name '%.64s': not <16 hex>-<32 hex>.ckpt",
				name);
	sel_key k;
	memset(&k, 0, sizeof(k));
	for (int i = 0; i < 16; i++) {
		int v = hexval(name[i]);
		if (v < 0)
			return eos_fail(SEL_EFORMAT, "record name '%s': bad hex digit", name);
		k.consumed = k.consumed << 4 | (uint64_t)v;
	}
	for (int i = 0; i < 32; i++) {
		int v = hexval(name[17 + i]);
		if (v < 0)
			return eos_fail(SEL_EFORMAT, "record name '%s': bad hex digit", name);
		k.digest.b[i / 2] = (uint8_t)(k.digest.b[i / 2] << 4 | v);
	}
	*key = k;
	return 0;
}

void sel_record_tmp_name(const char *name, uint64_t nonce, char out[SEL_RECORD_TMPNAME_MAX])
{
	snprintf(out, SEL_RECORD_TMPNAME_MAX, SEL_RECORD_TMP_PREFIX "%s-%016" PRIx64, name, nonce);
}

/* ---- Payload addresses -------------------------------------------------------- */

void *sel_record_page_addr(const sel_record_layout *l, uint32_t flags, void *const *slots,
			   uint32_t i)
{
	if (!(flags & SEL_RECORD_PAGES_REPLICATED))
		return slots[i];
	return (uint8_t *)slots[i / l->ranks] + l->share_off[i % l->ranks];
}

static uint64_t div_up(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

uint32_t sel_record_row_slots(const sel_record_layout *l, uint32_t flags)
{
	if (flags & SEL_RECORD_ROW_REPLICATED)
		return (uint32_t)div_up(div_up(l->row_bytes[0], l->share[0]), l->ranks);
	uint64_t n = 1;
	for (uint32_t r = 0; r < l->ranks; r++) {
		uint64_t need = div_up(l->row_bytes[r], l->share[r]);
		if (need > n)
			n = need;
	}
	return (uint32_t)n;
}

int sel_record_row_iov(const sel_record_layout *l, uint32_t flags, void *const *slots,
		       uint32_t n_slots, struct iovec *iov, uint32_t cap)
{
	uint32_t n = 0;
	if (flags & SEL_RECORD_ROW_REPLICATED) {
		uint64_t left = l->row_bytes[0];
		for (uint64_t j = 0; left; j++) {
			uint32_t r = (uint32_t)(j % l->ranks);
			uint64_t len = left < l->share[r] ? left : l->share[r];
			if (n == cap || j / l->ranks >= n_slots)
				return eos_fail(-ENOBUFS,
						"record row: %" PRIu32 " pieces or %" PRIu32
						" slots are too few",
						cap, n_slots);
			iov[n].iov_base = (uint8_t *)slots[j / l->ranks] + l->share_off[r];
			iov[n++].iov_len = len;
			left -= len;
		}
		return (int)n;
	}
	for (uint32_t r = 0; r < l->ranks; r++) {
		uint64_t left = l->row_bytes[r];
		for (uint32_t i = 0; left; i++) {
			uint64_t len = left < l->share[r] ? left : l->share[r];
			if (n == cap || i >= n_slots)
				return eos_fail(-ENOBUFS,
						"record row: %" PRIu32 " pieces or %" PRIu32
						" slots are too few",
						cap, n_slots);
			iov[n].iov_base = (uint8_t *)slots[i] + l->share_off[r];
			iov[n++].iov_len = len;
			left -= len;
		}
	}
	return (int)n;
}

uint64_t sel_record_row_checksum(const struct iovec *iov, uint32_t n)
{
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	for (uint32_t i = 0; i < n; i++)
		XXH3_64bits_update(&st, iov[i].iov_base, iov[i].iov_len);
	return XXH3_64bits_digest(&st);
}

int sel_record_row_plan(const sel_record_layout *l, uint32_t flags, const struct iovec *iov,
			uint32_t n, struct sel_record_piece *out)
{
	uint32_t rows = (flags & SEL_RECORD_ROW_REPLICATED) ? 1 : l->ranks;
	uint32_t i = 0;
	for (uint32_t r = 0; r < rows; r++) {
		uint64_t want = l->row_bytes[r], got = 0;
		uint64_t base = (flags & SEL_RECORD_ROW_REPLICATED) ? 0 : l->row_off[r];
		while (got < want) {
			if (i == n)
				return eos_fail(-EINVAL,
						"record row: pieces end after %" PRIu64
						" of rank %" PRIu32 "'s %" PRIu64 " row bytes",
						got, r, want);
			uint64_t len = iov[i].iov_len;
			if (len == 0 || len > want - got)
				return eos_fail(-EINVAL,
						"record row: piece %" PRIu32 " of %" PRIu64
						" bytes "
						"does not fit rank %" PRIu32 "'s row (%" PRIu64
						" of %" PRIu64 " placed)",
						i, (uint64_t)len, r, got, want);
			if ((uintptr_t)iov[i].iov_base % ALIGN != 0)
				return eos_fail(
					-EINVAL,
					"record row: piece %" PRIu32 " is not 4 KiB aligned", i);
			bool last = got + len == want;
			if (!last && len % ALIGN != 0)
				return eos_fail(-EINVAL,
						"record row: piece %" PRIu32 " of %" PRIu64
						" bytes is "
						"not the row's last and not a multiple of 4 KiB",
						i, (uint64_t)len);
			if (out) {
				out[i].addr = iov[i].iov_base;
				out[i].data = len;
				out[i].len = last ? round_up4k(len) : len;
				out[i].off = base + got;
			}
			got += len;
			i++;
		}
	}
	if (i != n)
		return eos_fail(-EINVAL,
				"record row: %" PRIu32 " pieces given, the row has %" PRIu32, n, i);
	return 0;
}
