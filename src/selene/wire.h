/*
 * wire.h - a field writer and a strict field reader for the binary frames
 * of libselene's wire protocols (design 2.14's rank links, shard_proto.c).
 *
 * Internal to libselene.  Pure code, no I/O.
 *
 * The writer appends little-endian fields to a buffer and keeps counting
 * past its end, so one pass over a message with no buffer measures it and a
 * second one writes it.  The reader takes fields from buf[0..len) with a
 * sticky error: the first field that is missing, non-zero padding, a
 * boolean other than 0 or 1, a string with a control byte, or a count that
 * the rest of the payload cannot hold fails the whole decode with
 * SEL_EFORMAT and a message "<proto> frame <type>: <field>: <why>"; later
 * reads return zeros.  An encoder and its decoder are then the same list of
 * fields read in two directions, which keeps decoding canonical.
 *
 * (pool_proto.c predates this header and keeps its own copy of the same
 * idea; it can move onto this one.)
 */
#ifndef SEL_WIRE_H
#define SEL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "selene.h"

struct sel_wr {
	uint8_t *b; /* NULL: measure only */
	size_t cap, n;
};

static inline void sel_wr_bytes(struct sel_wr *w, const void *p, size_t len)
{
	if (w->b && len && w->n <= w->cap && len <= w->cap - w->n)
		memcpy(w->b + w->n, p, len);
	w->n += len;
}
static inline void sel_wr_zeros(struct sel_wr *w, size_t len)
{
	if (w->b && len && w->n <= w->cap && len <= w->cap - w->n)
		memset(w->b + w->n, 0, len);
	w->n += len;
}
static inline void sel_wr_u8(struct sel_wr *w, uint8_t v) { sel_wr_bytes(w, &v, 1); }
static inline void sel_wr_u16(struct sel_wr *w, uint16_t v)
{
	uint8_t t[2];
	sel_put_u16(t, v);
	sel_wr_bytes(w, t, sizeof t);
}
static inline void sel_wr_u32(struct sel_wr *w, uint32_t v)
{
	uint8_t t[4];
	sel_put_u32(t, v);
	sel_wr_bytes(w, t, sizeof t);
}
static inline void sel_wr_u64(struct sel_wr *w, uint64_t v)
{
	uint8_t t[8];
	sel_put_u64(t, v);
	sel_wr_bytes(w, t, sizeof t);
}
static inline void sel_wr_key(struct sel_wr *w, const sel_key *k)
{
	sel_wr_u64(w, k->consumed);
	sel_wr_bytes(w, k->digest.b, SEL_DIGEST_BYTES);
}
/* A u32 length and the bytes of a string (its length already bounded by
 * the caller). */
static inline void sel_wr_text(struct sel_wr *w, const char *s)
{
	size_t n = strlen(s);
	sel_wr_u32(w, (uint32_t)n);
	sel_wr_bytes(w, s, n);
}

struct sel_rd {
	const uint8_t *b;
	size_t len, pos;
	int err;
	const char *proto; /* "shard" */
	const char *what;  /* the frame type's name */
};

static inline int sel_rd_fail(struct sel_rd *r, const char *field, const char *why)
{
	if (!r->err)
		r->err =
			eos_fail(SEL_EFORMAT, "%s frame %s: %s: %s", r->proto, r->what, field, why);
	return r->err;
}
/* Whether n more bytes are there (failing the read when not). */
static inline bool sel_rd_need(struct sel_rd *r, size_t n, const char *field)
{
	if (r->err)
		return false;
	if (r->len - r->pos < n) {
		sel_rd_fail(r, field, "the payload ends inside it");
		return false;
	}
	return true;
}
static inline void sel_rd_bytes(struct sel_rd *r, void *p, size_t n, const char *field)
{
	if (!sel_rd_need(r, n, field)) {
		memset(p, 0, n);
		return;
	}
	memcpy(p, r->b + r->pos, n);
	r->pos += n;
}
static inline void sel_rd_zeros(struct sel_rd *r, size_t n, const char *field)
{
	if (!sel_rd_need(r, n, field))
		return;
	for (size_t i = 0; i < n; i++)
		if (r->b[r->pos + i]) {
			sel_rd_fail(r, field, "reserved bytes are not zero");
			return;
		}
	r->pos += n;
}
static inline uint8_t sel_rd_u8(struct sel_rd *r, const char *f)
{
	uint8_t v = 0;
	sel_rd_bytes(r, &v, 1, f);
	return v;
}
static inline uint16_t sel_rd_u16(struct sel_rd *r, const char *f)
{
	uint8_t t[2];
	sel_rd_bytes(r, t, sizeof t, f);
	return sel_get_u16(t);
}
static inline uint32_t sel_rd_u32(struct sel_rd *r, const char *f)
{
	uint8_t t[4];
	sel_rd_bytes(r, t, sizeof t, f);
	return sel_get_u32(t);
}
static inline uint64_t sel_rd_u64(struct sel_rd *r, const char *f)
{
	uint8_t t[8];
	sel_rd_bytes(r, t, sizeof t, f);
	return sel_get_u64(t);
}
static inline bool sel_rd_bool(struct sel_rd *r, const char *f)
{
	uint8_t v = sel_rd_u8(r, f);
	if (v > 1)
		sel_rd_fail(r, f, "neither 0 nor 1");
	return v == 1;
}
static inline void sel_rd_key(struct sel_rd *r, sel_key *k, const char *f)
{
	k->consumed = sel_rd_u64(r, f);
	sel_rd_bytes(r, k->digest.b, SEL_DIGEST_BYTES, f);
}
/* A u32-length string of at most max bytes without NUL or control bytes
 * into out[max + 1]. */
static inline void sel_rd_text(struct sel_rd *r, char *out, size_t max, const char *f)
{
	uint32_t n = sel_rd_u32(r, f);
	out[0] = '\0';
	if (r->err)
		return;
	if (n > max) {
		sel_rd_fail(r, f, "longer than allowed");
		return;
	}
	if (!sel_rd_need(r, n, f))
		return;
	for (uint32_t i = 0; i < n; i++) {
		uint8_t c = r->b[r->pos + i];
		if (c < 0x20 || c == 0x7f) {
			sel_rd_fail(r, f, "holds a control byte");
			return;
		}
	}
	memcpy(out, r->b + r->pos, n);
	out[n] = '\0';
	r->pos += n;
}
/* A u32 count of elements of esize bytes each: at most max, and no more
 * than the rest of the payload holds (checked before anything is
 * allocated for them). */
static inline uint32_t sel_rd_count(struct sel_rd *r, uint32_t max, size_t esize, const char *f)
{
	uint32_t n = sel_rd_u32(r, f);
	if (r->err)
		return 0;
	if (n > max) {
		sel_rd_fail(r, f, "count over its limit");
		return 0;
	}
	if ((uint64_t)n * esize > r->len - r->pos) {
		sel_rd_fail(r, f, "count larger than the payload holds");
		return 0;
	}
	return n;
}
/* Nothing may follow the last field. */
static inline void sel_rd_end(struct sel_rd *r)
{
	if (!r->err && r->pos != r->len)
		sel_rd_fail(r, "payload", "bytes after the last field");
}

#endif
