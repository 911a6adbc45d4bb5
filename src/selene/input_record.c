/*
 * input_record.c - the .input record format, pure: building, sealing,
 * decoding and verifying source-description and prepared-input records,
 * and their file names (design 2.13; docs/record-format.md "Input records").
 *
 * DESIGN
 *   One format for both kinds: an 80-byte fixed part (magic, version, kind,
 *   sizes, key, creation time, header checksum), a kind-specific body (a
 *   source description, or a table of at most 16 tensors), zero padding to
 *   a multiple of 64 bytes, then -- prepared records only -- each tensor's
 *   bytes padded to 64.  Every length is bounded, every offset is
 *   recomputed from the table and compared with the stored one, and the
 *   header is covered by its own XXH3-64 and each tensor by one, like
 *   .ckpt records, so a decoded header is canonical: one record has
 *   exactly one valid encoding apart from its creation time.
 *   The decoder reads nothing past the header, so a description lookup
 *   (or a window planner that wants tensor sizes) never loads a payload;
 *   sel_input_verify checks the payload when it is read.
 *   Records are built in place: sel_input_prepared_init lays out and
 *   allocates the whole file, the caller writes tensor data where it will
 *   stay, and sel_input_seal computes the checksums and the header.  The
 *   same bytes then serve memory, disk and the model without a copy.
 *
 * INVARIANTS
 *   1. A decoded header has header_bytes = round_up(80 + body, 64),
 *      tensors at consecutive 64-aligned offsets from header_bytes, and
 *      file_bytes = header_bytes + sum of round_up(tensor bytes, 64).
 *   2. encode(decode(b)) == b for every header b that decodes.
 *   3. A sealed record decodes and verifies.
 */
#define XXH_STATIC_LINKING_ONLY
#include "input_record.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "xxh.h"

#include "eos.h"
#include "internal.h"

/* Fixed part (docs/record-format.md). */
enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 8,
	OFF_KIND = 12,
	OFF_HEADER_BYTES = 16,
	OFF_COUNT = 20,
	OFF_PAYLOAD = 24,
	OFF_KEY = 32,
	OFF_CREATED = 64,
	OFF_HEADER_CHECKSUM = 72,
	OFF_BODY = 80,
	/* Source body, from OFF_BODY. */
	SRC_IDENTITY = 0,
	SRC_ENCODING = 32,
	SRC_COLOR = 36,
	SRC_WIDTH = 40,
	SRC_HEIGHT = 44,
	SRC_TOKENS = 48,
	SRC_GRID_H = 52,
	SRC_GRID_W = 56,
	SRC_RESERVED = 60,
	SRC_PREPARED = 64,
	SRC_BODY = 72,
	/* Tensor entry. */
	T_NAME = 0,
	T_DTYPE = 32,
	T_RANK = 36,
	T_DIMS = 40,
	T_OFFSET = 72,
	T_BYTES = 80,
	T_CHECKSUM = 88,
	T_ENTRY = 96,
};

#define PAYLOAD_MAX (1ull << 31)

_Static_assert(OFF_BODY == SEL_INPUT_FIXED, "fixed part");
_Static_assert(((OFF_BODY + SEL_INPUT_TENSORS_MAX * T_ENTRY + 63) & ~63u) <= SEL_INPUT_HEADER_MAX,
	       "the largest header fits SEL_INPUT_HEADER_MAX");

static uint64_t round64(uint64_t v)
{
	return (v + SEL_INPUT_ALIGN - 1) / SEL_INPUT_ALIGN * SEL_INPUT_ALIGN;
}

uint32_t sel_dtype_bytes(uint32_t dtype)
{
	switch (dtype) {
	case SEL_DT_U8: return 1;
	case SEL_DT_U16: return 2;
	case SEL_DT_U32:
	case SEL_DT_I32:
	case SEL_DT_F32: return 4;
	}
	return 0;
}

const char *sel_dtype_name(uint32_t dtype)
{
	switch (dtype) {
	case SEL_DT_U8: return "u8";
	case SEL_DT_U16: return "u16";
	case SEL_DT_U32: return "u32";
	case SEL_DT_I32: return "i32";
	case SEL_DT_F32: return "f32";
	}
	return "?";
}

static uint32_t body_bytes(uint32_t kind, uint32_t count)
{
	return kind == SEL_INPUT_SOURCE ? SRC_BODY : count * T_ENTRY;
}

static bool name_ok(const char *s, size_t max)
{
	size_t n = strnlen(s, max + 1);
	if (n == 0 || n > SEL_INPUT_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
		      s[i] == '.' || s[i] == '-'))
			return false;
	return true;
}

/* Check t's type, rank and dims and compute its bytes.  i names it. */
static int tensor_shape(const sel_input_tensor *t, uint32_t i, uint64_t *bytes)
{
	uint32_t eb = sel_dtype_bytes(t->dtype);
	if (!eb)
		return eos_fail(SEL_EFORMAT,
				"input record: tensor %" PRIu32 " has unknown type %" PRIu32, i,
				t->dtype);
	if (t->rank < 1 || t->rank > SEL_INPUT_RANK_MAX)
		return eos_fail(SEL_EFORMAT,
				"input record: tensor %" PRIu32 " has rank %" PRIu32
				" (expected 1..%u)",
				i, t->rank, SEL_INPUT_RANK_MAX);
	uint64_t b = eb;
	for (uint32_t d = 0; d < SEL_INPUT_RANK_MAX; d++) {
		if (d >= t->rank) {
			if (t->dims[d] != 0)
				return eos_fail(SEL_EFORMAT,
						"input record: tensor %" PRIu32
						" dimension %" PRIu32 " past its rank is %" PRIu64
						", not 0",
						i, d, t->dims[d]);
			continue;
		}
		if (t->dims[d] == 0 || t->dims[d] > SEL_INPUT_TENSOR_MAX ||
		    __builtin_mul_overflow(b, t->dims[d], &b) || b > SEL_INPUT_TENSOR_MAX)
			return eos_fail(SEL_EFORMAT,
					"input record: tensor %" PRIu32 " dimension %" PRIu32
					" is %" PRIu64 " (the tensor must be 1 byte .. 1 GiB)",
					i, d, t->dims[d]);
	}
	*bytes = b;
	return 0;
}

/* ---- Building -------------------------------------------------------------- */

static void put_key(uint8_t *p, const sel_input_key *k) { memcpy(p, k->b, SEL_INPUT_KEY_BYTES); }

/* Encode h's header into buf (h->header_bytes, zeroed by the caller). */
static void encode_header(const sel_input_header *h, uint8_t *buf)
{
	/* NOLINTNEXTLINE(bugprone-not-null-terminated-result): 8 bytes, no NUL by the format */
	memcpy(buf + OFF_MAGIC, SEL_INPUT_MAGIC, 8);
	sel_put_u32(buf + OFF_VERSION, h->version);
	sel_put_u32(buf + OFF_KIND, h->kind);
	sel_put_u32(buf + OFF_HEADER_BYTES, h->header_bytes);
	sel_put_u32(buf + OFF_COUNT, h->count);
	sel_put_u64(buf + OFF_PAYLOAD, h->payload_bytes);
	put_key(buf + OFF_KEY, &h->key);
	sel_put_u64(buf + OFF_CREATED, h->created_ns);
	uint8_t *b = buf + OFF_BODY;
	if (h->kind == SEL_INPUT_SOURCE) {
		const sel_input_source *s = &h->src;
		put_key(b + SRC_IDENTITY, &s->identity);
		sel_put_u32(b + SRC_ENCODING, s->encoding);
		sel_put_u32(b + SRC_COLOR, s->color);
		sel_put_u32(b + SRC_WIDTH, s->width);
		sel_put_u32(b + SRC_HEIGHT, s->height);
		sel_put_u32(b + SRC_TOKENS, s->tokens);
		sel_put_u32(b + SRC_GRID_H, s->grid_h);
		sel_put_u32(b + SRC_GRID_W, s->grid_w);
		sel_put_u64(b + SRC_PREPARED, s->prepared_bytes);
	} else {
		for (uint32_t i = 0; i < h->count; i++) {
			const sel_input_tensor *t = &h->tensors[i];
			uint8_t *e = b + (size_t)i * T_ENTRY;
			memcpy(e + T_NAME, t->name, strnlen(t->name, SEL_INPUT_NAME_MAX));
			sel_put_u32(e + T_DTYPE, t->dtype);
			sel_put_u32(e + T_RANK, t->rank);
			for (uint32_t d = 0; d < SEL_INPUT_RANK_MAX; d++)
				sel_put_u64(e + T_DIMS + 8 * (size_t)d, t->dims[d]);
			sel_put_u64(e + T_OFFSET, t->offset);
			sel_put_u64(e + T_BYTES, t->bytes);
			sel_put_u64(e + T_CHECKSUM, t->checksum);
		}
	}
	sel_put_u64(buf + OFF_HEADER_CHECKSUM, XXH3_64bits(buf, h->header_bytes));
}

int sel_input_prepared_init(sel_input_rec *r, const sel_input_key *identity,
			    const sel_input_tensor *specs, uint32_t n)
{
	memset(r, 0, sizeof *r);
	sel_input_header *h = &r->h;
	if (n < 1 || n > SEL_INPUT_TENSORS_MAX)
		return eos_fail(-EINVAL, "input record: %" PRIu32 " tensors (expected 1..%u)", n,
				SEL_INPUT_TENSORS_MAX);
	h->version = SEL_INPUT_VERSION;
	h->kind = SEL_INPUT_PREPARED;
	h->count = n;
	h->key = *identity;
	h->header_bytes = (uint32_t)round64(OFF_BODY + body_bytes(h->kind, n));
	uint64_t off = h->header_bytes;
	for (uint32_t i = 0; i < n; i++) {
		sel_input_tensor *t = &h->tensors[i];
		memset(t, 0, sizeof *t);
		if (!name_ok(specs[i].name, SEL_INPUT_NAME_MAX))
			return eos_fail(-EINVAL,
					"input record: tensor %" PRIu32 " name '%.40s' is not "
					"1..31 of a-z 0-9 _ . -",
					i, specs[i].name);
		for (uint32_t j = 0; j < i; j++)
			if (strcmp(h->tensors[j].name, specs[i].name) == 0)
				return eos_fail(-EINVAL, "input record: tensor name '%s' twice",
						specs[i].name);
		snprintf(t->name, sizeof t->name, "%s", specs[i].name);
		t->dtype = specs[i].dtype;
		t->rank = specs[i].rank;
		memcpy(t->dims, specs[i].dims, sizeof t->dims);
		int rc = tensor_shape(t, i, &t->bytes);
		if (rc)
			return eos_fail(-EINVAL, "%s", eos_errmsg());
		t->offset = off;
		off += round64(t->bytes);
	}
	h->payload_bytes = off - h->header_bytes;
	h->file_bytes = off;
	if (h->payload_bytes > PAYLOAD_MAX)
		return eos_fail(-EINVAL, "input record: %" PRIu64 " payload bytes (at most 2 GiB)",
				h->payload_bytes);
	r->bytes = eos_aligned_alloc(SEL_INPUT_ALIGN, (size_t)h->file_bytes);
	if (!r->bytes) {
		memset(r, 0, sizeof *r);
		return eos_fail(-ENOMEM, "input record: out of memory for %" PRIu64 " bytes",
				h->file_bytes);
	}
	r->len = (size_t)h->file_bytes;
	return 0;
}

int sel_input_seal(sel_input_rec *r, uint64_t created_ns)
{
	sel_input_header *h = &r->h;
	if (!r->bytes || r->len != h->file_bytes)
		return eos_fail(-EINVAL, "input record: seal of a record that was not built");
	h->created_ns = created_ns ? created_ns : eos_wall_ns();
	for (uint32_t i = 0; i < h->count; i++) {
		sel_input_tensor *t = &h->tensors[i];
		t->checksum = XXH3_64bits(r->bytes + t->offset, (size_t)t->bytes);
		memset(r->bytes + t->offset + t->bytes, 0, (size_t)(round64(t->bytes) - t->bytes));
	}
	memset(r->bytes, 0, h->header_bytes);
	encode_header(h, r->bytes);
	h->header_checksum = sel_get_u64(r->bytes + OFF_HEADER_CHECKSUM);
	return 0;
}

int sel_input_source_init(sel_input_rec *r, const sel_input_key *key, const sel_input_source *s,
			  uint64_t created_ns)
{
	memset(r, 0, sizeof *r);
	sel_input_header *h = &r->h;
	h->version = SEL_INPUT_VERSION;
	h->kind = SEL_INPUT_SOURCE;
	h->key = *key;
	h->src = *s;
	h->header_bytes = (uint32_t)round64(OFF_BODY + SRC_BODY);
	h->file_bytes = h->header_bytes;
	r->bytes = eos_aligned_alloc(SEL_INPUT_ALIGN, h->header_bytes);
	if (!r->bytes) {
		memset(r, 0, sizeof *r);
		return eos_fail(-ENOMEM, "input record: out of memory");
	}
	r->len = h->header_bytes;
	return sel_input_seal(r, created_ns);
}

int sel_input_find(const sel_input_rec *r, const char *name)
{
	for (uint32_t i = 0; i < r->h.count; i++)
		if (strcmp(r->h.tensors[i].name, name) == 0)
			return (int)i;
	return -ENOENT;
}

void sel_input_rec_free(sel_input_rec *r)
{
	if (!r)
		return;
	eos_aligned_free(r->bytes);
	memset(r, 0, sizeof *r);
}

/* ---- Decoding -------------------------------------------------------------- */

int sel_input_header_bytes(const void *buf, size_t len)
{
	const uint8_t *b = buf;
	if (len < OFF_BODY)
		return eos_fail(SEL_EFORMAT,
				"input record: %zu bytes, shorter than the %u-byte fixed "
				"header",
				len, OFF_BODY);
	if (memcmp(b + OFF_MAGIC, SEL_INPUT_MAGIC, 8) != 0)
		return eos_fail(SEL_EFORMAT, "input record: bad magic (not a FLAREINP file)");
	uint32_t v = sel_get_u32(b + OFF_VERSION);
	if (v != SEL_INPUT_VERSION)
		return eos_fail(SEL_EFORMAT,
				"input record: version %" PRIu32 " (this build reads %u)", v,
				SEL_INPUT_VERSION);
	uint32_t kind = sel_get_u32(b + OFF_KIND), count = sel_get_u32(b + OFF_COUNT);
	if (kind != SEL_INPUT_SOURCE && kind != SEL_INPUT_PREPARED)
		return eos_fail(SEL_EFORMAT,
				"input record: kind %" PRIu32 " (expected 1 source or 2 "
				"prepared)",
				kind);
	if (kind == SEL_INPUT_SOURCE ? count != 0 : (count < 1 || count > SEL_INPUT_TENSORS_MAX))
		return eos_fail(SEL_EFORMAT, "input record: %" PRIu32 " tensors in a %s record",
				count, kind == SEL_INPUT_SOURCE ? "source" : "prepared");
	uint32_t hb = sel_get_u32(b + OFF_HEADER_BYTES);
	uint32_t want = (uint32_t)round64(OFF_BODY + body_bytes(kind, count));
	if (hb != want)
		return eos_fail(SEL_EFORMAT,
				"input record: header bytes %" PRIu32 " (expected %" PRIu32
				" for this kind and count)",
				hb, want);
	return (int)hb;
}

static void get_key(const uint8_t *p, sel_input_key *k) { memcpy(k->b, p, SEL_INPUT_KEY_BYTES); }

int sel_input_decode(const void *buf, size_t len, sel_input_header *out)
{
	const uint8_t *b = buf;
	sel_input_header h;
	int hb = sel_input_header_bytes(buf, len);
	if (hb < 0)
		return hb;
	if (len < (size_t)hb)
		return eos_fail(SEL_EFORMAT,
				"input record: %zu bytes, shorter than its %d-byte header", len,
				hb);
	memset(&h, 0, sizeof h);
	h.version = SEL_INPUT_VERSION;
	h.kind = sel_get_u32(b + OFF_KIND);
	h.count = sel_get_u32(b + OFF_COUNT);
	h.header_bytes = (uint32_t)hb;
	h.payload_bytes = sel_get_u64(b + OFF_PAYLOAD);
	get_key(b + OFF_KEY, &h.key);
	h.created_ns = sel_get_u64(b + OFF_CREATED);
	h.header_checksum = sel_get_u64(b + OFF_HEADER_CHECKSUM);

	/* The checksum first: what follows then judges intended bytes. */
	uint8_t copy[SEL_INPUT_HEADER_MAX];
	memcpy(copy, b, (size_t)hb);
	memset(copy + OFF_HEADER_CHECKSUM, 0, 8);
	uint64_t sum = XXH3_64bits(copy, (size_t)hb);
	if (sum != h.header_checksum)
		return eos_fail(SEL_ECORRUPT,
				"input record: header checksum %016" PRIx64 " does not "
				"match its bytes (%016" PRIx64 ")",
				h.header_checksum, sum);

	const uint8_t *body = b + OFF_BODY;
	uint32_t used = body_bytes(h.kind, h.count);
	uint64_t off = (uint64_t)hb;
	if (h.kind == SEL_INPUT_SOURCE) {
		sel_input_source *s = &h.src;
		get_key(body + SRC_IDENTITY, &s->identity);
		s->encoding = sel_get_u32(body + SRC_ENCODING);
		s->color = sel_get_u32(body + SRC_COLOR);
		s->width = sel_get_u32(body + SRC_WIDTH);
		s->height = sel_get_u32(body + SRC_HEIGHT);
		s->tokens = sel_get_u32(body + SRC_TOKENS);
		s->grid_h = sel_get_u32(body + SRC_GRID_H);
		s->grid_w = sel_get_u32(body + SRC_GRID_W);
		s->prepared_bytes = sel_get_u64(body + SRC_PREPARED);
		if (sel_get_u32(body + SRC_RESERVED) != 0)
			return eos_fail(SEL_EFORMAT,
					"input record: reserved source field is not 0");
		if (s->width == 0 || s->height == 0 || s->tokens == 0 || s->grid_h == 0 ||
		    s->grid_w == 0 || s->prepared_bytes == 0 ||
		    s->prepared_bytes > SEL_INPUT_FILE_MAX)
			return eos_fail(SEL_EFORMAT,
					"input record: source description with %" PRIu32
					" x %" PRIu32 " pixels, %" PRIu32 " tokens, grid %" PRIu32
					" x %" PRIu32 ", %" PRIu64
					" prepared bytes (each must be positive and "
					"bounded)",
					s->width, s->height, s->tokens, s->grid_h, s->grid_w,
					s->prepared_bytes);
	} else {
		for (uint32_t i = 0; i < h.count; i++) {
			const uint8_t *e = body + (size_t)i * T_ENTRY;
			sel_input_tensor *t = &h.tensors[i];
			memcpy(t->name, e + T_NAME, 32);
			if (t->name[SEL_INPUT_NAME_MAX] != 0 ||
			    !name_ok(t->name, SEL_INPUT_NAME_MAX))
				return eos_fail(SEL_EFORMAT,
						"input record: tensor %" PRIu32 " has no "
						"valid name (1..31 of a-z 0-9 _ . -)",
						i);
			size_t nl = strlen(t->name);
			for (size_t k = nl; k < 32; k++)
				if (e[T_NAME + k])
					return eos_fail(SEL_EFORMAT,
							"input record: tensor %" PRIu32
							" name is not NUL padded",
							i);
			for (uint32_t j = 0; j < i; j++)
				if (strcmp(h.tensors[j].name, t->name) == 0)
					return eos_fail(SEL_EFORMAT,
							"input record: tensor name '%s' "
							"twice",
							t->name);
			t->dtype = sel_get_u32(e + T_DTYPE);
			t->rank = sel_get_u32(e + T_RANK);
			for (uint32_t d = 0; d < SEL_INPUT_RANK_MAX; d++)
				t->dims[d] = sel_get_u64(e + T_DIMS + 8 * (size_t)d);
			t->offset = sel_get_u64(e + T_OFFSET);
			t->bytes = sel_get_u64(e + T_BYTES);
			t->checksum = sel_get_u64(e + T_CHECKSUM);
			uint64_t want;
			int rc = tensor_shape(t, i, &want);
			if (rc)
				return rc;
			if (t->bytes != want)
				return eos_fail(SEL_EFORMAT,
						"input record: tensor '%s' says %" PRIu64
						" bytes, its shape %" PRIu64,
						t->name, t->bytes, want);
			if (t->offset != off)
				return eos_fail(SEL_EFORMAT,
						"input record: tensor '%s' at offset %" PRIu64
						" (expected %" PRIu64 ")",
						t->name, t->offset, off);
			off += round64(t->bytes);
		}
	}
	for (size_t k = OFF_BODY + used; k < (size_t)hb; k++)
		if (b[k])
			return eos_fail(SEL_EFORMAT,
					"input record: header padding byte %zu is not 0", k);
	if (h.payload_bytes != off - (uint64_t)hb || h.payload_bytes > PAYLOAD_MAX)
		return eos_fail(SEL_EFORMAT,
				"input record: payload of %" PRIu64 " bytes (the table "
				"says %" PRIu64 ")",
				h.payload_bytes, off - (uint64_t)hb);
	h.file_bytes = off;
	*out = h;
	return 0;
}

int sel_input_verify(const sel_input_header *h, const void *file, size_t len)
{
	const uint8_t *b = file;
	if (len != h->file_bytes)
		return eos_fail(SEL_EFORMAT, "input record: %zu bytes, the header says %" PRIu64,
				len, h->file_bytes);
	for (uint32_t i = 0; i < h->count; i++) {
		const sel_input_tensor *t = &h->tensors[i];
		uint64_t sum = XXH3_64bits(b + t->offset, (size_t)t->bytes);
		if (sum != t->checksum)
			return eos_fail(SEL_ECORRUPT,
					"input record: tensor '%s' fails its checksum (%016" PRIx64
					", stored %016" PRIx64 ")",
					t->name, sum, t->checksum);
		for (uint64_t k = t->offset + t->bytes; k < t->offset + round64(t->bytes); k++)
			if (b[k])
				return eos_fail(SEL_EFORMAT,
						"input record: padding after tensor '%s' is "
						"not 0",
						t->name);
	}
	return 0;
}

int sel_input_rec_adopt(sel_input_rec *r, uint8_t *bytes, size_t len, uint32_t kind,
			const sel_input_key *want)
{
	sel_input_header h;
	int rc;
	memset(r, 0, sizeof *r);
	if ((rc = sel_input_decode(bytes, len, &h)) || (rc = sel_input_verify(&h, bytes, len)))
		return rc;
	if (h.kind != kind)
		return eos_fail(SEL_EIDENTITY,
				"input record: a %s record where a %s one was expected",
				h.kind == SEL_INPUT_SOURCE ? "source" : "prepared",
				kind == SEL_INPUT_SOURCE ? "source" : "prepared");
	if (want && !sel_input_key_eq(&h.key, want)) {
		char a[65], e[65];
		return eos_fail(SEL_EIDENTITY,
				"input record: key %.16s... where %.16s... was expected",
				sel_input_key_hex(&h.key, a), sel_input_key_hex(want, e));
	}
	r->bytes = bytes;
	r->len = len;
	r->h = h;
	return 0;
}

/* ---- Names ------------------------------------------------------------------ */

static const char *kind_prefix(uint32_t kind)
{
	return kind == SEL_INPUT_SOURCE ? "src-" : "prep-";
}

void sel_input_name(uint32_t kind, const sel_input_key *key, char out[SEL_INPUT_NAME_LEN])
{
	char hex[2 * SEL_INPUT_KEY_BYTES + 1];
	snprintf(out, SEL_INPUT_NAME_LEN, "%s%s.input", kind_prefix(kind),
		 sel_input_key_hex(key, hex));
}

int sel_input_name_parse(const char *name, uint32_t *kind, sel_input_key *key)
{
	uint32_t k;
	size_t p;
	if (strncmp(name, "src-", 4) == 0) {
		k = SEL_INPUT_SOURCE;
		p = 4;
	} else if (strncmp(name, "prep-", 5) == 0) {
		k = SEL_INPUT_PREPARED;
		p = 5;
	} else {
		return eos_fail(SEL_EFORMAT, "input record name '%.80s': not src-... or prep-...",
				name);
	}
	sel_input_key out;
	for (int i = 0; i < 2 * SEL_INPUT_KEY_BYTES; i++) {
		char c = name[p + (size_t)i];
		int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (v < 0)
			return eos_fail(SEL_EFORMAT,
					"input record name '%.80s': not 64 lower-case hex "
					"digits",
					name);
		if (i % 2 == 0)
			out.b[i / 2] = (uint8_t)(v << 4);
		else
			out.b[i / 2] |= (uint8_t)v;
	}
	if (strcmp(name + p + 2 * (size_t)SEL_INPUT_KEY_BYTES, ".input") != 0)
		return eos_fail(SEL_EFORMAT, "input record name '%.80s': does not end in .input",
				name);
	*kind = k;
	*key = out;
	return 0;
}
