/*
 * pool_proto_msg.c - the pool protocol's messages: one writer and one
 * reader with a sticky error, and each message's encoder and decoder as one
 * field list read in two directions (design 2.15; pool_proto.h; docs/pool.md).
 *
 * DESIGN
 * The writer and the reader carry every field, so a message's encoder and
 * decoder stay in step and decoding is canonical (every field fully
 * determined by its bytes: padding must be zero, booleans 0 or 1, strings
 * without NUL or control bytes, nothing after the last field).  The writer
 * also runs without a buffer to measure a message first.  The codec table
 * finds each type's pair of functions.
 *
 * A decoded message's arrays live in one malloc'd block sized from counts
 * that were checked against the payload length first, so a small frame
 * never makes a large allocation: memory is bounded by the frame size (at
 * most a few times SEL_POOL_FRAME_MAX).
 *
 * INVARIANTS
 *   1. The decoder never reads outside buf[0..len) and never needs a NUL.
 *   2. decode(encode(m)) == m and encode(decode(f)) == f for every frame f
 *      that decodes (fuzz/fuzz_pool_proto.c checks the second).
 *   3. Every count is checked against its SEL_POOL_MAX_* limit and against
 *      the bytes left before anything is allocated.
 */
#include "pool_proto.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "eos.h"
#include "internal.h"
/* ---- writer and reader ------------------------------------------------------ */

struct wr {
	uint8_t *b; /* NULL: measure only */
	size_t cap, n;
};

static void w_raw(struct wr *w, const void *p, size_t len)
{
	if (w->b && w->n + len <= w->cap && len)
		memcpy(w->b + w->n, p, len);
	w->n += len;
}
static void w_zero(struct wr *w, size_t len)
{
	if (w->b && w->n + len <= w->cap)
		memset(w->b + w->n, 0, len);
	w->n += len;
}
static void w_u8(struct wr *w, uint8_t v) { w_raw(w, &v, 1); }
static void w_u16(struct wr *w, uint16_t v)
{
	uint8_t b[2];
	sel_put_u16(b, v);
	w_raw(w, b, 2);
}
static void w_u32(struct wr *w, uint32_t v)
{
	uint8_t b[4];
	sel_put_u32(b, v);
	w_raw(w, b, 4);
}
static void w_u64(struct wr *w, uint64_t v)
{
	uint8_t b[8];
	sel_put_u64(b, v);
	w_raw(w, b, 8);
}
static void w_key(struct wr *w, const sel_key *k)
{
	w_u64(w, k->consumed);
	w_raw(w, k->digest.b, SEL_DIGEST_BYTES);
}
static void w_str(struct wr *w, const char *s)
{
	size_t n = strlen(s);
	w_u16(w, (uint16_t)n);
	w_raw(w, s, n);
}

struct rd {
	const uint8_t *b;
	size_t len, pos;
	int err;
	const char *what; /* the message type's name, for messages */
};

static int r_fail(struct rd *r, const char *field, const char *why)
{
	if (!r->err)
		r->err = eos_fail(SEL_EFORMAT, "pool frame %s: %s: %s", r->what, field, why);
	return r->err;
}
static bool r_have(struct rd *r, size_t n, const char *field)
{
	if (r->err)
		return false;
	if (r->len - r->pos < n) {
		r_fail(r, field, "the payload ends inside it");
		return false;
	}
	return true;
}
static void r_raw(struct rd *r, void *p, size_t n, const char *field)
{
	if (!r_have(r, n, field)) {
		memset(p, 0, n);
		return;
	}
	memcpy(p, r->b + r->pos, n);
	r->pos += n;
}
static void r_pad(struct rd *r, size_t n, const char *field)
{
	if (!r_have(r, n, field))
		return;
	for (size_t i = 0; i < n; i++)
		if (r->b[r->pos + i]) {
			r_fail(r, field, "padding is not zero");
			return;
		}
	r->pos += n;
}
static uint8_t r_u8(struct rd *r, const char *f)
{
	uint8_t v = 0;
	r_raw(r, &v, 1, f);
	return v;
}
static uint16_t r_u16(struct rd *r, const char *f)
{
	uint8_t b[2];
	r_raw(r, b, 2, f);
	return sel_get_u16(b);
}
static uint32_t r_u32(struct rd *r, const char *f)
{
	uint8_t b[4];
	r_raw(r, b, 4, f);
	return sel_get_u32(b);
}
static uint64_t r_u64(struct rd *r, const char *f)
{
	uint8_t b[8];
	r_raw(r, b, 8, f);
	return sel_get_u64(b);
}
static void r_key(struct rd *r, sel_key *k, const char *f)
{
	k->consumed = r_u64(r, f);
	r_raw(r, k->digest.b, SEL_DIGEST_BYTES, f);
}
static uint8_t r_bool(struct rd *r, const char *f)
{
	uint8_t v = r_u8(r, f);
	if (v > 1)
		r_fail(r, f, "not 0 or 1");
	return v;
}
static uint32_t r_enum(struct rd *r, uint32_t v, uint32_t limit, const char *f)
{
	if (!r->err && v >= limit)
		r_fail(r, f, "value out of range");
	return v;
}
/* A u16-length string of at most max bytes, no NUL or control bytes. */
static void r_str(struct rd *r, char *out, size_t max, const char *f)
{
	uint16_t n = r_u16(r, f);
	out[0] = '\0';
	if (r->err)
		return;
	if (n > max) {
		r_fail(r, f, "longer than allowed");
		return;
	}
	if (!r_have(r, n, f))
		return;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = r->b[r->pos + i];
		if (c < 0x20 || c == 0x7f) {
			r_fail(r, f, "holds a control byte");
			return;
		}
	}
	memcpy(out, r->b + r->pos, n);
	out[n] = '\0';
	r->pos += n;
}
/* A count of elements of esize bytes that must fit the rest of the payload
 * (before anything is allocated for them) and its limit. */
static uint32_t r_count(struct rd *r, uint32_t max, size_t esize, const char *f)
{
	uint32_t n = r_u32(r, f);
	if (r->err)
		return 0;
	if (n > max) {
		r_fail(r, f, "count over its limit");
		return 0;
	}
	if ((uint64_t)n * esize > r->len - r->pos) {
		r_fail(r, f, "count larger than the payload holds");
		return 0;
	}
	return n;
}

/* One block for a decoded message's arrays. */
struct bump {
	uint8_t *p;
	size_t used, cap;
};
static void *bump(struct bump *b, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (!n)
		return NULL;
	void *p = b->p + b->used;
	b->used += n;
	return p;
}
static size_t arr(size_t n, size_t e) { return (n * e + 15) & ~(size_t)15; }

/* ---- element codecs ------------------------------------------------------------ */

#define WIN_BYTES 16u
#define HOLD_BYTES 56u
#define ANODE_BYTES 40u
#define CAND_BYTES 48u
#define GNODE_BYTES 80u

static void w_window(struct wr *w, const struct sel_pool_window *x)
{
	w_u64(w, x->off);
	w_u32(w, x->slots);
	w_u8(w, x->kind);
	w_zero(w, 3);
}
static void r_window(struct rd *r, struct sel_pool_window *x)
{
	x->off = r_u64(r, "window offset");
	x->slots = r_u32(r, "window slots");
	x->kind = (uint8_t)r_enum(r, r_u8(r, "window kind"), 2, "window kind");
	r_pad(r, 3, "window padding");
}

static void w_holding(struct wr *w, const struct sel_pool_holding *h)
{
	w_u8(w, h->source);
	w_zero(w, 7);
	w_key(w, &h->key);
	w_raw(w, h->bucket.b, SEL_DIGEST_BYTES);
	w_u64(w, h->generation);
}
static void r_holding(struct rd *r, struct sel_pool_holding *h, bool announce)
{
	h->source = r_u8(r, "holding source");
	if (!r->err && (h->source == SEL_POOL_SRC_ARENA || h->source >= SEL_POOL_SOURCES))
		r_fail(r, "holding source", "not gpu, dram or nvme");
	r_pad(r, 7, "holding padding");
	r_key(r, &h->key, "holding key");
	r_raw(r, h->bucket.b, SEL_DIGEST_BYTES, "holding bucket");
	if (!announce && !r->err)
		for (int i = 0; i < SEL_DIGEST_BYTES; i++)
			if (h->bucket.b[i]) {
				r_fail(r, "holding bucket", "not zero in a withdrawal");
				break;
			}
	h->generation = r_u64(r, "holding generation");
}

static void w_scope(struct wr *w, const struct sel_pool_scope *s)
{
	w_raw(w, s->identity, SEL_IDENTITY_BYTES);
	w_raw(w, s->fingerprint, SEL_FINGERPRINT_BYTES);
	w_u32(w, s->page_tokens);
	w_u32(w, s->ranks);
	w_u64(w, s->slot_bytes);
	w_u32(w, s->row_slots);
	w_u32(w, s->table_bytes);
	w_raw(w, s->table, s->table_bytes);
}

/* ---- encode ------------------------------------------------------------------- */

static int check_str(const char *s, size_t max)
{
	size_t n = strnlen(s, max + 1);
	if (n > max)
		return eos_fail(SEL_EFORMAT, "pool frame: a string of more than %zu bytes", max);
	return 0;
}

/* Count limits and enumerations, so an encoded frame always decodes. */
static int enc_check(const struct sel_pool_msg *m)
{
	const char *t = sel_pool_type_name(m->type);
	switch (m->type) {
	case SEL_POOL_M_HELLO: return check_str(m->u.m_hello.name, SEL_POOL_NAME_MAX);
	case SEL_POOL_M_WELCOME:
		if (m->u.welcome.status >= SEL_POOL_REASONS || m->u.welcome.recovering > 1)
			return eos_fail(SEL_EFORMAT, "pool frame %s: status out of range", t);
		return check_str(m->u.welcome.text, SEL_POOL_TEXT_MAX);
	case SEL_POOL_M_ERROR:
		if (m->u.error.code >= SEL_POOL_REASONS || m->u.error.fatal > 1)
			return eos_fail(SEL_EFORMAT, "pool frame %s: code out of range", t);
		return check_str(m->u.error.text, SEL_POOL_TEXT_MAX);
	case SEL_POOL_M_ANSWER: {
		const struct sel_pool_m_answer *a = &m->u.answer;
		if (a->n_nodes > SEL_POOL_MAX_NODES || a->n_cands > SEL_POOL_MAX_CANDIDATES)
			return eos_fail(SEL_EFORMAT, "pool frame %s: too many nodes or candidates",
					t);
		for (uint32_t i = 0; i < a->n_nodes; i++)
			if ((a->nodes[i].up != SEL_POOL_NONE && a->nodes[i].up >= a->n_nodes) ||
			    a->nodes[i].has_row > 1)
				return eos_fail(SEL_EFORMAT, "pool frame %s: node %u is malformed",
						t, i);
		for (uint32_t i = 0; i < a->n_cands; i++)
			if (a->cands[i].node >= a->n_nodes ||
			    a->cands[i].source >= SEL_POOL_SOURCES)
				return eos_fail(SEL_EFORMAT,
						"pool frame %s: candidate %u is malformed", t, i);
		return 0;
	}
	case SEL_POOL_M_CLAIM_GRANT: {
		const struct sel_pool_m_claim_grant *g = &m->u.grant;
		if (g->n_nodes > SEL_POOL_MAX_NODES || g->n_windows > SEL_POOL_MAX_WINDOWS ||
		    g->n_pages > SEL_POOL_MAX_PAGES || g->source >= SEL_POOL_SOURCES)
			return eos_fail(SEL_EFORMAT, "pool frame %s: counts over their limits", t);
		uint64_t sum = 0;
		for (uint32_t i = 0; i < g->n_nodes; i++) {
			if (g->nodes[i].has_row > 1)
				return eos_fail(SEL_EFORMAT, "pool frame %s: node %u is malformed",
						t, i);
			sum += g->nodes[i].pages;
		}
		if (sum != g->n_pages)
			return eos_fail(SEL_EFORMAT,
					"pool frame %s: node pages do not sum to n_pages", t);
		for (uint32_t i = 0; i < g->n_windows; i++)
			if (g->windows[i].kind > 1)
				return eos_fail(SEL_EFORMAT, "pool frame %s: window kind", t);
		return 0;
	}
	case SEL_POOL_M_PUT_GRANT:
		if (m->u.put_grant.n_windows > SEL_POOL_MAX_WINDOWS)
			return eos_fail(SEL_EFORMAT, "pool frame %s: too many windows", t);
		for (uint32_t i = 0; i < m->u.put_grant.n_windows; i++)
			if (m->u.put_grant.windows[i].kind > 1)
				return eos_fail(SEL_EFORMAT, "pool frame %s: window kind", t);
		return 0;
	case SEL_POOL_M_EXPORT_REQUEST: {
		const struct sel_pool_m_export_request *e = &m->u.export_req;
		if (e->n_windows > SEL_POOL_MAX_WINDOWS || e->row > 1 ||
		    e->source == SEL_POOL_SRC_ARENA || e->source >= SEL_POOL_SOURCES)
			return eos_fail(SEL_EFORMAT, "pool frame %s: malformed", t);
		for (uint32_t i = 0; i < e->n_windows; i++)
			if (e->windows[i].kind > 1)
				return eos_fail(SEL_EFORMAT, "pool frame %s: window kind", t);
		return 0;
	}
	case SEL_POOL_M_CLAIM_REFUSED:
	case SEL_POOL_M_PUT_REFUSED:
		return m->u.refused.reason < SEL_POOL_REASONS
			       ? 0
			       : eos_fail(SEL_EFORMAT, "pool frame %s: reason out of range", t);
	case SEL_POOL_M_PUT_RESULT:
	case SEL_POOL_M_EXPORT_CANCEL:
	case SEL_POOL_M_LEASE_FAILED:
	case SEL_POOL_C_RELEASE:
	case SEL_POOL_C_EXPORT_REPLY:
		return m->u.ls.status < SEL_POOL_REASONS
			       ? 0
			       : eos_fail(SEL_EFORMAT, "pool frame %s: status out of range", t);
	case SEL_POOL_C_HELLO:
		if (m->u.c_hello.version == SEL_POOL_VERSION &&
		    m->u.c_hello.scope.table_bytes > SEL_POOL_TABLE_MAX)
			return eos_fail(SEL_EFORMAT, "pool frame %s: rank table too big", t);
		return 0;
	case SEL_POOL_C_ANNOUNCE:
	case SEL_POOL_C_WITHDRAW:
		if (m->u.holdings.n > SEL_POOL_MAX_HOLDINGS)
			return eos_fail(SEL_EFORMAT, "pool frame %s: too many holdings", t);
		for (uint32_t i = 0; i < m->u.holdings.n; i++) {
			uint8_t s = m->u.holdings.h[i].source;
			if (s == SEL_POOL_SRC_ARENA || s >= SEL_POOL_SOURCES)
				return eos_fail(SEL_EFORMAT, "pool frame %s: holding source", t);
		}
		return 0;
	case SEL_POOL_C_RESET:
		return (m->u.reset.sources & ~0xeu) == 0
			       ? 0
			       : eos_fail(SEL_EFORMAT, "pool frame %s: unknown sources", t);
	case SEL_POOL_C_LOOKUP:
		if (m->u.lookup.n > SEL_POOL_MAX_BOUNDS ||
		    (m->u.lookup.n && m->u.lookup.k_hi < (uint64_t)m->u.lookup.n - 1))
			return eos_fail(SEL_EFORMAT, "pool frame %s: boundaries", t);
		return 0;
	case SEL_POOL_C_CLAIM:
		return m->u.claim.source < SEL_POOL_SOURCES
			       ? 0
			       : eos_fail(SEL_EFORMAT, "pool frame %s: source", t);
	case SEL_POOL_C_PUT:
		return m->u.put.has_row <= 1 ? 0
					     : eos_fail(SEL_EFORMAT, "pool frame %s: has_row", t);
	case SEL_POOL_C_COMMIT:
	case SEL_POOL_C_EXPORT_DONE:
		if (m->u.cksums.n > SEL_POOL_MAX_PAGES || m->u.cksums.status >= SEL_POOL_REASONS)
			return eos_fail(SEL_EFORMAT, "pool frame %s: malformed", t);
		return 0;
	case SEL_POOL_C_PROGRESS: return 0;
	default: return eos_fail(SEL_EFORMAT, "pool frame: unknown type %u", m->type);
	}
}

/* SEL_POOL_M_HELLO */
static void enc_m_hello(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_m_hello *h = &m->u.m_hello;
	w_u32(w, SEL_POOL_MAGIC);
	w_u32(w, h->version);
	w_u64(w, h->generation);
	w_u64(w, h->arena_bytes);
	w_u64(w, h->data_start);
	w_u32(w, h->window_limit);
	w_u32(w, h->window_credits);
	w_u32(w, h->max_claims);
	w_u32(w, h->max_puts);
	w_u32(w, h->max_exports);
	w_u32(w, h->setup_limit_ms);
	w_u32(w, h->progress_ms);
	w_u64(w, h->staging_bytes);
	w_str(w, h->name);
}

/* SEL_POOL_M_WELCOME */
static void enc_welcome(struct wr *w, const struct sel_pool_msg *m)
{
	w_u32(w, m->u.welcome.status);
	w_u64(w, m->u.welcome.session);
	w_u32(w, m->u.welcome.recovering);
	w_str(w, m->u.welcome.text);
}

/* SEL_POOL_M_ANSWER */
static void enc_answer(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_m_answer *a = &m->u.answer;
	w_u64(w, a->ticket);
	w_u32(w, a->n_nodes);
	for (uint32_t i = 0; i < a->n_nodes; i++) {
		w_key(w, &a->nodes[i].key);
		w_u32(w, a->nodes[i].tail);
		w_u32(w, a->nodes[i].up);
		w_u8(w, a->nodes[i].has_row);
		w_zero(w, 7);
	}
	w_u32(w, a->n_cands);
	for (uint32_t i = 0; i < a->n_cands; i++) {
		const struct sel_pool_candidate *c = &a->cands[i];
		w_u8(w, c->source);
		w_zero(w, 3);
		w_u32(w, c->node);
		w_u64(w, c->base);
		w_u64(w, c->generation);
		w_raw(w, c->holder, SEL_POOL_ID_BYTES);
		w_u64(w, c->bytes);
	}
}

/* SEL_POOL_M_CLAIM_GRANT */
static void enc_claim_grant(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_m_claim_grant *g = &m->u.grant;
	w_u64(w, g->claim);
	w_u64(w, g->lease);
	w_u64(w, g->nonce);
	w_u32(w, g->deadline_ms);
	w_u8(w, g->source);
	w_zero(w, 3);
	w_u64(w, g->base);
	w_u32(w, g->n_nodes);
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const struct sel_pool_gnode *n = &g->nodes[i];
		w_key(w, &n->key);
		w_key(w, &n->parent);
		w_raw(w, n->bucket.b, SEL_DIGEST_BYTES);
		w_u32(w, n->tail);
		w_u32(w, n->pages);
		w_u8(w, n->has_row);
		w_zero(w, 7);
	}
	w_u32(w, g->n_windows);
	for (uint32_t i = 0; i < g->n_windows; i++)
		w_window(w, &g->windows[i]);
	w_u32(w, g->n_pages);
	for (uint32_t i = 0; i < g->n_pages; i++)
		w_u64(w, g->page_cksum[i]);
	w_u64(w, g->row_cksum);
}

/* SEL_POOL_M_CLAIM_REFUSED, SEL_POOL_M_PUT_REFUSED */
static void enc_refused(struct wr *w, const struct sel_pool_msg *m)
{
	w_u64(w, m->u.refused.id);
	w_u32(w, m->u.refused.reason);
}

/* SEL_POOL_M_PUT_GRANT */
static void enc_put_grant(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_m_put_grant *g = &m->u.put_grant;
	w_u64(w, g->put);
	w_u64(w, g->lease);
	w_u64(w, g->nonce);
	w_u32(w, g->deadline_ms);
	w_u32(w, g->n_windows);
	for (uint32_t i = 0; i < g->n_windows; i++)
		w_window(w, &g->windows[i]);
}

/* SEL_POOL_M_PUT_RESULT, SEL_POOL_M_EXPORT_CANCEL, SEL_POOL_M_LEASE_FAILED, SEL_POOL_C_RELEASE, SEL_POOL_C_EXPORT_REPLY */
static void enc_lease_status(struct wr *w, const struct sel_pool_msg *m)
{
	w_u64(w, m->u.ls.lease);
	w_u64(w, m->u.ls.nonce);
	w_u32(w, m->u.ls.status);
}

/* SEL_POOL_M_EXPORT_REQUEST */
static void enc_export_request(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_m_export_request *e = &m->u.export_req;
	w_u64(w, e->lease);
	w_u64(w, e->nonce);
	w_u32(w, e->deadline_ms);
	w_u8(w, e->source);
	w_u8(w, e->row);
	w_zero(w, 2);
	w_key(w, &e->key);
	w_u64(w, e->generation);
	w_u32(w, e->start_page);
	w_u32(w, e->n_pages);
	w_u32(w, e->n_windows);
	for (uint32_t i = 0; i < e->n_windows; i++)
		w_window(w, &e->windows[i]);
}

/* SEL_POOL_M_ERROR */
static void enc_error(struct wr *w, const struct sel_pool_msg *m)
{
	w_u32(w, m->u.error.code);
	w_u16(w, m->u.error.about);
	w_u8(w, m->u.error.fatal);
	w_zero(w, 1);
	w_str(w, m->u.error.text);
}

/* SEL_POOL_C_HELLO */
static void enc_c_hello(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_c_hello *h = &m->u.c_hello;
	w_u32(w, SEL_POOL_MAGIC);
	w_u32(w, h->version);
	if (h->version != SEL_POOL_VERSION)
		return; /* another version's hello: only what every version reads */
	w_u32(w, h->flags);
	w_raw(w, h->instance, SEL_POOL_ID_BYTES);
	w_u64(w, h->generation);
	w_scope(w, &h->scope);
}

/* SEL_POOL_C_ANNOUNCE, SEL_POOL_C_WITHDRAW */
static void enc_holdings(struct wr *w, const struct sel_pool_msg *m)
{
	w_u32(w, m->u.holdings.n);
	for (uint32_t i = 0; i < m->u.holdings.n; i++) {
		struct sel_pool_holding h = m->u.holdings.h[i];
		if (m->type == SEL_POOL_C_WITHDRAW)
			memset(h.bucket.b, 0, SEL_DIGEST_BYTES);
		w_holding(w, &h);
	}
}

/* SEL_POOL_C_RESET */
static void enc_reset(struct wr *w, const struct sel_pool_msg *m) { w_u32(w, m->u.reset.sources); }

/* SEL_POOL_C_LOOKUP */
static void enc_lookup(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_c_lookup *l = &m->u.lookup;
	w_u64(w, l->ticket);
	w_u64(w, l->resident);
	w_u64(w, l->limit);
	w_u64(w, l->k_hi);
	w_u32(w, l->n);
	for (uint32_t i = 0; i < l->n; i++)
		w_raw(w, l->bounds[i].b, SEL_DIGEST_BYTES);
}

/* SEL_POOL_C_CLAIM */
static void enc_claim(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_c_claim *c = &m->u.claim;
	w_u64(w, c->claim);
	w_u8(w, c->source);
	w_zero(w, 3);
	w_u32(w, c->setup_ms);
	w_raw(w, c->holder, SEL_POOL_ID_BYTES);
	w_u64(w, c->generation);
	w_key(w, &c->key);
	w_u64(w, c->resident);
}

/* SEL_POOL_C_PROGRESS */
static void enc_progress(struct wr *w, const struct sel_pool_msg *m)
{
	w_u64(w, m->u.progress.lease);
	w_u64(w, m->u.progress.nonce);
	w_u32(w, m->u.progress.windows_done);
}

/* SEL_POOL_C_PUT */
static void enc_put(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_c_put *p = &m->u.put;
	w_u64(w, p->put);
	w_key(w, &p->key);
	w_key(w, &p->parent);
	w_raw(w, p->bucket.b, SEL_DIGEST_BYTES);
	w_u32(w, p->tail);
	w_u32(w, p->setup_ms);
	w_u8(w, p->has_row);
	w_zero(w, 3);
}

/* SEL_POOL_C_COMMIT, SEL_POOL_C_EXPORT_DONE */
static void enc_cksums(struct wr *w, const struct sel_pool_msg *m)
{
	const struct sel_pool_c_cksums *c = &m->u.cksums;
	w_u64(w, c->lease);
	w_u64(w, c->nonce);
	w_u32(w, m->type == SEL_POOL_C_COMMIT ? 0 : c->status);
	w_u32(w, c->n);
	for (uint32_t i = 0; i < c->n; i++)
		w_u64(w, c->page_cksum[i]);
	w_u64(w, c->row_cksum);
}


static void enc_body(struct wr *w, const struct sel_pool_msg *m);

int64_t sel_pool_encoded_size(const struct sel_pool_msg *m)
{
	int rc = enc_check(m);
	if (rc)
		return rc;
	struct wr w = {0};
	enc_body(&w, m);
	if (w.n > SEL_POOL_FRAME_MAX)
		return eos_fail(SEL_EFORMAT,
				"pool frame %s: payload of %zu bytes is over the %u limit",
				sel_pool_type_name(m->type), w.n, SEL_POOL_FRAME_MAX);
	return (int64_t)(w.n + SEL_POOL_FRAME_HEADER);
}

int64_t sel_pool_encode(const struct sel_pool_msg *m, uint8_t *buf, size_t cap)
{
	int64_t n = sel_pool_encoded_size(m);
	if (n < 0)
		return n;
	if ((uint64_t)n > cap)
		return eos_fail(-ENOBUFS, "pool frame %s: needs %" PRId64 " bytes, have %zu",
				sel_pool_type_name(m->type), n, cap);
	struct wr w = {buf, cap, 0};
	w_u32(&w, (uint32_t)(n - SEL_POOL_FRAME_HEADER));
	w_u16(&w, m->type);
	w_u16(&w, 0);
	enc_body(&w, m);
	return n;
}

/* ---- decode --------------------------------------------------------------------- */

int sel_pool_frame_header(const uint8_t *buf, size_t len, uint16_t *type, uint32_t *payload)
{
	if (len < SEL_POOL_FRAME_HEADER)
		return -EAGAIN;
	uint32_t n = sel_get_u32(buf);
	uint16_t t = sel_get_u16(buf + 4), z = sel_get_u16(buf + 6);
	if (n > SEL_POOL_FRAME_MAX)
		return eos_fail(SEL_EFORMAT,
				"pool frame: payload of %" PRIu32 " bytes is over the %u limit", n,
				SEL_POOL_FRAME_MAX);
	if (z)
		return eos_fail(SEL_EFORMAT, "pool frame: reserved header field is %u, not 0", z);
	if (!sel_pool_type_known(t))
		return eos_fail(SEL_EFORMAT, "pool frame: unknown type 0x%x", t);
	*type = t;
	*payload = n;
	return 0;
}

void sel_pool_msg_free(struct sel_pool_msg *m)
{
	if (!m)
		return;
	free(m->mem);
	m->mem = NULL;
}

/* SEL_POOL_M_HELLO */
static int dec_m_hello(struct rd *r, struct sel_pool_msg *m)
{
	struct sel_pool_m_hello *h = &m->u.m_hello;
	if (r_u32(r, "magic") != SEL_POOL_MAGIC && !r->err)
		return r_fail(r, "magic", "not POOL");
	h->version = r_u32(r, "version");
	h->generation = r_u64(r, "generation");
	h->arena_bytes = r_u64(r, "arena bytes");
	h->data_start = r_u64(r, "data start");
	h->window_limit = r_u32(r, "window limit");
	h->window_credits = r_u32(r, "window credits");
	h->max_claims = r_u32(r, "max claims");
	h->max_puts = r_u32(r, "max puts");
	h->max_exports = r_u32(r, "max exports");
	h->setup_limit_ms = r_u32(r, "setup limit");
	h->progress_ms = r_u32(r, "progress timeout");
	h->staging_bytes = r_u64(r, "staging bytes");
	r_str(r, h->name, SEL_POOL_NAME_MAX, "name");
	return r->err;
}

/* SEL_POOL_M_WELCOME */
static int dec_welcome(struct rd *r, struct sel_pool_msg *m)
{
	m->u.welcome.status = r_enum(r, r_u32(r, "status"), SEL_POOL_REASONS, "status");
	m->u.welcome.session = r_u64(r, "session");
	m->u.welcome.recovering = r_enum(r, r_u32(r, "recovering"), 2, "recovering");
	r_str(r, m->u.welcome.text, SEL_POOL_TEXT_MAX, "text");
	return r->err;
}

/* SEL_POOL_M_ANSWER */
static int dec_answer(struct rd *r, struct sel_pool_msg *m)
{
	struct bump b = {0};
	struct sel_pool_m_answer *a = &m->u.answer;
	a->ticket = r_u64(r, "ticket");
	a->n_nodes = r_count(r, SEL_POOL_MAX_NODES, ANODE_BYTES, "node count");
	if (r->err)
		return r->err;
	/* The candidates' count comes after the nodes: bound it by the
	 * limit for now, by the bytes once read. */
	b.cap = arr(a->n_nodes, sizeof *a->nodes) + arr(SEL_POOL_MAX_CANDIDATES, sizeof *a->cands);
	if (!(b.p = m->mem = calloc(1, b.cap)))
		return eos_fail(-ENOMEM, "pool frame: out of memory");
	a->nodes = bump(&b, (size_t)a->n_nodes * sizeof *a->nodes);
	for (uint32_t i = 0; i < a->n_nodes && !r->err; i++) {
		struct sel_pool_anode *n = &a->nodes[i];
		r_key(r, &n->key, "node key");
		n->tail = r_u32(r, "node tail");
		n->up = r_u32(r, "node up");
		n->has_row = r_bool(r, "node has_row");
		r_pad(r, 7, "node padding");
		if (!r->err && n->up != SEL_POOL_NONE && n->up >= a->n_nodes)
			r_fail(r, "node up", "not a node of the answer");
	}
	a->n_cands = r_count(r, SEL_POOL_MAX_CANDIDATES, CAND_BYTES, "candidate count");
	a->cands = bump(&b, (size_t)SEL_POOL_MAX_CANDIDATES * sizeof *a->cands);
	for (uint32_t i = 0; i < a->n_cands && !r->err; i++) {
		struct sel_pool_candidate *c = &a->cands[i];
		c->source = (uint8_t)r_enum(r, r_u8(r, "candidate source"), SEL_POOL_SOURCES,
					    "candidate source");
		r_pad(r, 3, "candidate padding");
		c->node = r_u32(r, "candidate node");
		if (!r->err && c->node >= a->n_nodes)
			r_fail(r, "candidate node", "not a node of the answer");
		c->base = r_u64(r, "candidate base");
		c->generation = r_u64(r, "candidate generation");
		r_raw(r, c->holder, SEL_POOL_ID_BYTES, "candidate holder");
		c->bytes = r_u64(r, "candidate bytes");
	}
	if (!a->n_nodes)
		a->nodes = NULL;
	if (!a->n_cands)
		a->cands = NULL;
	return r->err;
}

/* SEL_POOL_M_CLAIM_GRANT */
static int dec_claim_grant(struct rd *r, struct sel_pool_msg *m)
{
	struct bump b = {0};
	struct sel_pool_m_claim_grant *g = &m->u.grant;
	g->claim = r_u64(r, "claim");
	g->lease = r_u64(r, "lease");
	g->nonce = r_u64(r, "nonce");
	g->deadline_ms = r_u32(r, "deadline");
	g->source = (uint8_t)r_enum(r, r_u8(r, "source"), SEL_POOL_SOURCES, "source");
	r_pad(r, 3, "padding");
	g->base = r_u64(r, "base");
	g->n_nodes = r_count(r, SEL_POOL_MAX_NODES, GNODE_BYTES, "node count");
	if (r->err)
		return r->err;
	/* Read the nodes, then size the windows and checksums from
	 * their counts (each checked against what is left). */
	size_t at = r->pos + (size_t)g->n_nodes * GNODE_BYTES;
	if (r->len - at < 4)
		return r_fail(r, "window count", "the payload ends inside it");
	uint32_t nw = sel_get_u32(r->b + at);
	if (nw > SEL_POOL_MAX_WINDOWS || (uint64_t)nw * WIN_BYTES > r->len - at - 4)
		return r_fail(r, "window count", "over its limit or the payload");
	size_t at2 = at + 4 + (size_t)nw * WIN_BYTES;
	if (r->len - at2 < 4)
		return r_fail(r, "page count", "the payload ends inside it");
	uint32_t np = sel_get_u32(r->b + at2);
	if (np > SEL_POOL_MAX_PAGES || (uint64_t)np * 8 > r->len - at2 - 4)
		return r_fail(r, "page count", "over its limit or the payload");
	b.cap = arr(g->n_nodes, sizeof *g->nodes) + arr(nw, sizeof *g->windows) + arr(np, 8);
	if (b.cap && !(b.p = m->mem = calloc(1, b.cap)))
		return eos_fail(-ENOMEM, "pool frame: out of memory");
	g->nodes = bump(&b, (size_t)g->n_nodes * sizeof *g->nodes);
	uint64_t sum = 0;
	for (uint32_t i = 0; i < g->n_nodes && !r->err; i++) {
		struct sel_pool_gnode *n = &g->nodes[i];
		r_key(r, &n->key, "node key");
		r_key(r, &n->parent, "node parent");
		r_raw(r, n->bucket.b, SEL_DIGEST_BYTES, "node bucket");
		n->tail = r_u32(r, "node tail");
		n->pages = r_u32(r, "node pages");
		n->has_row = r_bool(r, "node has_row");
		r_pad(r, 7, "node padding");
		sum += n->pages;
	}
	g->n_windows = r_count(r, SEL_POOL_MAX_WINDOWS, WIN_BYTES, "window count");
	g->windows = bump(&b, (size_t)g->n_windows * sizeof *g->windows);
	for (uint32_t i = 0; i < g->n_windows && !r->err; i++)
		r_window(r, &g->windows[i]);
	g->n_pages = r_count(r, SEL_POOL_MAX_PAGES, 8, "page count");
	if (!r->err && sum != g->n_pages)
		return r_fail(r, "page count", "not the sum of the nodes' pages");
	g->page_cksum = bump(&b, (size_t)g->n_pages * 8);
	for (uint32_t i = 0; i < g->n_pages && !r->err; i++)
		g->page_cksum[i] = r_u64(r, "page checksum");
	g->row_cksum = r_u64(r, "row checksum");
	return r->err;
}

/* SEL_POOL_M_CLAIM_REFUSED, SEL_POOL_M_PUT_REFUSED */
static int dec_refused(struct rd *r, struct sel_pool_msg *m)
{
	m->u.refused.id = r_u64(r, "id");
	m->u.refused.reason = r_enum(r, r_u32(r, "reason"), SEL_POOL_REASONS, "reason");
	return r->err;
}

/* SEL_POOL_M_PUT_GRANT */
static int dec_put_grant(struct rd *r, struct sel_pool_msg *m)
{
	struct bump b = {0};
	struct sel_pool_m_put_grant *g = &m->u.put_grant;
	g->put = r_u64(r, "put");
	g->lease = r_u64(r, "lease");
	g->nonce = r_u64(r, "nonce");
	g->deadline_ms = r_u32(r, "deadline");
	g->n_windows = r_count(r, SEL_POOL_MAX_WINDOWS, WIN_BYTES, "window count");
	if (r->err)
		return r->err;
	b.cap = arr(g->n_windows, sizeof *g->windows);
	if (b.cap && !(b.p = m->mem = calloc(1, b.cap)))
		return eos_fail(-ENOMEM, "pool frame: out of memory");
	g->windows = bump(&b, (size_t)g->n_windows * sizeof *g->windows);
	for (uint32_t i = 0; i < g->n_windows && !r->err; i++)
		r_window(r, &g->windows[i]);
	return r->err;
}

/* SEL_POOL_M_PUT_RESULT, SEL_POOL_M_EXPORT_CANCEL, SEL_POOL_M_LEASE_FAILED, SEL_POOL_C_RELEASE, SEL_POOL_C_EXPORT_REPLY */
static int dec_lease_status(struct rd *r, struct sel_pool_msg *m)
{
	m->u.ls.lease = r_u64(r, "lease");
	m->u.ls.nonce = r_u64(r, "nonce");
	m->u.ls.status = r_enum(r, r_u32(r, "status"), SEL_POOL_REASONS, "status");
	return r->err;
}

/* SEL_POOL_M_EXPORT_REQUEST */
static int dec_export_request(struct rd *r, struct sel_pool_msg *m)
{
	struct bump b = {0};
	struct sel_pool_m_export_request *e = &m->u.export_req;
	e->lease = r_u64(r, "lease");
	e->nonce = r_u64(r, "nonce");
	e->deadline_ms = r_u32(r, "deadline");
	e->source = r_u8(r, "source");
	if (!r->err && (e->source == SEL_POOL_SRC_ARENA || e->source >= SEL_POOL_SOURCES))
		return r_fail(r, "source", "not gpu, dram or nvme");
	e->row = r_bool(r, "row");
	r_pad(r, 2, "padding");
	r_key(r, &e->key, "key");
	e->generation = r_u64(r, "generation");
	e->start_page = r_u32(r, "start page");
	e->n_pages = r_u32(r, "pages");
	e->n_windows = r_count(r, SEL_POOL_MAX_WINDOWS, WIN_BYTES, "window count");
	if (r->err)
		return r->err;
	b.cap = arr(e->n_windows, sizeof *e->windows);
	if (b.cap && !(b.p = m->mem = calloc(1, b.cap)))
		return eos_fail(-ENOMEM, "pool frame: out of memory");
	e->windows = bump(&b, (size_t)e->n_windows * sizeof *e->windows);
	for (uint32_t i = 0; i < e->n_windows && !r->err; i++)
		r_window(r, &e->windows[i]);
	return r->err;
}

/* SEL_POOL_M_ERROR */
static int dec_error(struct rd *r, struct sel_pool_msg *m)
{
	m->u.error.code = r_enum(r, r_u32(r, "code"), SEL_POOL_REASONS, "code");
	m->u.error.about = r_u16(r, "about");
	m->u.error.fatal = r_bool(r, "fatal");
	r_pad(r, 1, "padding");
	r_str(r, m->u.error.text, SEL_POOL_TEXT_MAX, "text");
	return r->err;
}

/* SEL_POOL_C_HELLO */
static int dec_c_hello(struct rd *r, struct sel_pool_msg *m)
{
	struct sel_pool_c_hello *h = &m->u.c_hello;
	if (r_u32(r, "magic") != SEL_POOL_MAGIC && !r->err)
		return r_fail(r, "magic", "not POOL");
	h->version = r_u32(r, "version");
	if (r->err || h->version != SEL_POOL_VERSION)
		return r->err; /* the receiver refuses the version; nothing else is read */
	h->flags = r_u32(r, "flags");
	if (!r->err && (h->flags & ~(uint32_t)SEL_POOL_HELLO_DRAINED))
		return r_fail(r, "flags", "unknown bits");
	r_raw(r, h->instance, SEL_POOL_ID_BYTES, "instance id");
	h->generation = r_u64(r, "generation");
	struct sel_pool_scope *s = &h->scope;
	r_raw(r, s->identity, SEL_IDENTITY_BYTES, "identity");
	r_raw(r, s->fingerprint, SEL_FINGERPRINT_BYTES, "fingerprint");
	s->page_tokens = r_u32(r, "page tokens");
	s->ranks = r_u32(r, "ranks");
	s->slot_bytes = r_u64(r, "slot bytes");
	s->row_slots = r_u32(r, "row slots");
	s->table_bytes = r_count(r, SEL_POOL_TABLE_MAX, 1, "table bytes");
	if (r->err)
		return r->err;
	if (s->table_bytes) {
		if (!(m->mem = malloc(s->table_bytes)))
			return eos_fail(-ENOMEM, "pool frame: out of memory");
		r_raw(r, m->mem, s->table_bytes, "table");
		s->table = m->mem;
	}
	return r->err;
}

/* SEL_POOL_C_ANNOUNCE, SEL_POOL_C_WITHDRAW */
static int dec_holdings(struct rd *r, struct sel_pool_msg *m)
{
	struct sel_pool_c_holdings *h = &m->u.holdings;
	h->n = r_count(r, SEL_POOL_MAX_HOLDINGS, HOLD_BYTES, "holding count");
	if (r->err)
		return r->err;
	if (h->n && !(h->h = m->mem = calloc(h->n, sizeof *h->h)))
		return eos_fail(-ENOMEM, "pool frame: out of memory");
	for (uint32_t i = 0; i < h->n && !r->err; i++)
		r_holding(r, &h->h[i], m->type == SEL_POOL_C_ANNOUNCE);
	return r->err;
}

/* SEL_POOL_C_RESET */
static int dec_reset(struct rd *r, struct sel_pool_msg *m)
{
	m->u.reset.sources = r_u32(r, "sources");
	if (!r->err && (m->u.reset.sources & ~0xeu))
		return r_fail(r, "sources", "unknown bits");
	return r->err;
}

/* SEL_POOL_C_LOOKUP */
static int dec_lookup(struct rd *r, struct sel_pool_msg *m)
{
	struct sel_pool_c_lookup *l = &m->u.lookup;
	l->ticket = r_u64(r, "ticket");
	l->resident = r_u64(r, "resident");
	l->limit = r_u64(r, "limit");
	l->k_hi = r_u64(r, "k_hi");
	l->n = r_count(r, SEL_POOL_MAX_BOUNDS, SEL_DIGEST_BYTES, "boundary count");
	if (r->err)
		return r->err;
	if (l->n && l->k_hi < (uint64_t)l->n - 1)
		return r_fail(r, "boundary count", "more boundaries than k_hi + 1");
	if (l->n && !(l->bounds = m->mem = malloc((size_t)l->n * sizeof *l->bounds)))
		return eos_fail(-ENOMEM, "pool frame: out of memory");
	for (uint32_t i = 0; i < l->n && !r->err; i++)
		r_raw(r, l->bounds[i].b, SEL_DIGEST_BYTES, "boundary");
	return r->err;
}

/* SEL_POOL_C_CLAIM */
static int dec_claim(struct rd *r, struct sel_pool_msg *m)
{
	struct sel_pool_c_claim *c = &m->u.claim;
	c->claim = r_u64(r, "claim");
	c->source = (uint8_t)r_enum(r, r_u8(r, "source"), SEL_POOL_SOURCES, "source");
	r_pad(r, 3, "padding");
	c->setup_ms = r_u32(r, "setup");
	r_raw(r, c->holder, SEL_POOL_ID_BYTES, "holder");
	c->generation = r_u64(r, "generation");
	r_key(r, &c->key, "key");
	c->resident = r_u64(r, "resident");
	return r->err;
}

/* SEL_POOL_C_PROGRESS */
static int dec_progress(struct rd *r, struct sel_pool_msg *m)
{
	m->u.progress.lease = r_u64(r, "lease");
	m->u.progress.nonce = r_u64(r, "nonce");
	m->u.progress.windows_done = r_u32(r, "windows done");
	return r->err;
}

/* SEL_POOL_C_PUT */
static int dec_put(struct rd *r, struct sel_pool_msg *m)
{
	struct sel_pool_c_put *p = &m->u.put;
	p->put = r_u64(r, "put");
	r_key(r, &p->key, "key");
	r_key(r, &p->parent, "parent");
	r_raw(r, p->bucket.b, SEL_DIGEST_BYTES, "bucket");
	p->tail = r_u32(r, "tail");
	p->setup_ms = r_u32(r, "setup");
	p->has_row = r_bool(r, "has_row");
	r_pad(r, 3, "padding");
	return r->err;
}

/* SEL_POOL_C_COMMIT, SEL_POOL_C_EXPORT_DONE */
static int dec_cksums(struct rd *r, struct sel_pool_msg *m)
{
	struct sel_pool_c_cksums *c = &m->u.cksums;
	c->lease = r_u64(r, "lease");
	c->nonce = r_u64(r, "nonce");
	c->status = r_enum(r, r_u32(r, "status"), SEL_POOL_REASONS, "status");
	if (!r->err && m->type == SEL_POOL_C_COMMIT && c->status)
		return r_fail(r, "status", "not 0 in a commit");
	c->n = r_count(r, SEL_POOL_MAX_PAGES, 8, "checksum count");
	if (r->err)
		return r->err;
	if (c->n && !(c->page_cksum = m->mem = malloc((size_t)c->n * 8)))
		return eos_fail(-ENOMEM, "pool frame: out of memory");
	for (uint32_t i = 0; i < c->n && !r->err; i++)
		c->page_cksum[i] = r_u64(r, "checksum");
	c->row_cksum = r_u64(r, "row checksum");
	return r->err;
}

/* The codec of each message type.  A protocol reads clearest as one pair
 * of functions per message, the field list written and read the same way
 * (see DESIGN), found here by the message's type. */
struct codec {
	uint16_t type;
	void (*enc)(struct wr *w, const struct sel_pool_msg *m);
	int (*dec)(struct rd *r, struct sel_pool_msg *m);
};
static const struct codec codecs[] = {
	{SEL_POOL_M_HELLO, enc_m_hello, dec_m_hello},
	{SEL_POOL_M_WELCOME, enc_welcome, dec_welcome},
	{SEL_POOL_M_ANSWER, enc_answer, dec_answer},
	{SEL_POOL_M_CLAIM_GRANT, enc_claim_grant, dec_claim_grant},
	{SEL_POOL_M_CLAIM_REFUSED, enc_refused, dec_refused},
	{SEL_POOL_M_PUT_REFUSED, enc_refused, dec_refused},
	{SEL_POOL_M_PUT_GRANT, enc_put_grant, dec_put_grant},
	{SEL_POOL_M_PUT_RESULT, enc_lease_status, dec_lease_status},
	{SEL_POOL_M_EXPORT_CANCEL, enc_lease_status, dec_lease_status},
	{SEL_POOL_M_LEASE_FAILED, enc_lease_status, dec_lease_status},
	{SEL_POOL_C_RELEASE, enc_lease_status, dec_lease_status},
	{SEL_POOL_C_EXPORT_REPLY, enc_lease_status, dec_lease_status},
	{SEL_POOL_M_EXPORT_REQUEST, enc_export_request, dec_export_request},
	{SEL_POOL_M_ERROR, enc_error, dec_error},
	{SEL_POOL_C_HELLO, enc_c_hello, dec_c_hello},
	{SEL_POOL_C_ANNOUNCE, enc_holdings, dec_holdings},
	{SEL_POOL_C_WITHDRAW, enc_holdings, dec_holdings},
	{SEL_POOL_C_RESET, enc_reset, dec_reset},
	{SEL_POOL_C_LOOKUP, enc_lookup, dec_lookup},
	{SEL_POOL_C_CLAIM, enc_claim, dec_claim},
	{SEL_POOL_C_PROGRESS, enc_progress, dec_progress},
	{SEL_POOL_C_PUT, enc_put, dec_put},
	{SEL_POOL_C_COMMIT, enc_cksums, dec_cksums},
	{SEL_POOL_C_EXPORT_DONE, enc_cksums, dec_cksums},
};

static const struct codec *codec_of(uint16_t type)
{
	for (size_t i = 0; i < sizeof codecs / sizeof codecs[0]; i++)
		if (codecs[i].type == type)
			return &codecs[i];
	return NULL;
}

static void enc_body(struct wr *w, const struct sel_pool_msg *m)
{
	const struct codec *c = codec_of(m->type);
	if (c)
		c->enc(w, m);
}

static int dec_body(struct rd *r, struct sel_pool_msg *m)
{
	const struct codec *c = codec_of(m->type);
	if (!c)
		return eos_fail(SEL_EFORMAT, "pool frame: unknown type 0x%x", m->type);
	return c->dec(r, m);
}

int sel_pool_decode(const uint8_t *buf, size_t len, struct sel_pool_msg *out)
{
	uint16_t type;
	uint32_t plen;
	memset(out, 0, sizeof *out);
	int rc = sel_pool_frame_header(buf, len, &type, &plen);
	if (rc == -EAGAIN)
		return eos_fail(SEL_EFORMAT, "pool frame: %zu bytes are no frame header", len);
	if (rc)
		return rc;
	if (len != SEL_POOL_FRAME_HEADER + (size_t)plen)
		return eos_fail(SEL_EFORMAT, "pool frame %s: %zu bytes for a payload of %" PRIu32,
				sel_pool_type_name(type), len, plen);
	out->type = type;
	struct rd r = {buf + SEL_POOL_FRAME_HEADER, plen, 0, 0, sel_pool_type_name(type)};
	rc = dec_body(&r, out);
	if (!rc && r.pos != r.len)
		rc = r_fail(&r, "payload", "bytes after the last field");
	if (rc) {
		sel_pool_msg_free(out);
		memset(out, 0, sizeof *out);
	}
	return rc;
}
