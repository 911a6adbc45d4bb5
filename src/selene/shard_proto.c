/*
 * shard_proto.c - encoding and decoding of the rank links' frames (design
 * 2.14; shard_proto.h; docs/multihost.md).
 *
 * DESIGN
 * Each message type has one field list, run by a writer (wire.h) to encode
 * and by a strict reader to decode, so both stay in step and decoding is
 * canonical: padding zero, booleans 0 or 1, enumerations known, texts
 * without control bytes, nothing after the last field.  The encoder runs
 * the decoder's rules first (a count over its limit, a job that breaks a
 * rule), so nothing it writes can be refused by the other end.
 *
 * Arrays of a decoded frame (scan entries, actions, a job's records and
 * page ids) live in one malloc'd block whose size was computed from counts
 * already checked against the bytes left in the payload: a small frame
 * never makes a large allocation.
 *
 * INVARIANTS
 *   1. The decoder never reads outside buf[0..len) and needs no NUL.
 *   2. encode(decode(f)) == f for every frame f that decodes
 *      (fuzz/fuzz_shard.c checks it), and decode(encode(m)) == m.
 *   3. A decoded job satisfies sel_shard_job_check under the limits it was
 *      decoded with.
 */
#include "shard_proto.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <sodium.h>

#include "eos.h"
#include "wire.h"

#define DESC_BYTES 80u
#define REC_BYTES (DESC_BYTES + 8u)

static const char *const type_names[SEL_SHARD_TYPES] = {
	[SEL_SHARD_HELLO] = "HELLO",     [SEL_SHARD_JOIN] = "JOIN",
	[SEL_SHARD_ACCEPT] = "ACCEPT",   [SEL_SHARD_ERROR] = "ERROR",
	[SEL_SHARD_SCAN] = "SCAN",       [SEL_SHARD_SCAN_END] = "SCAN_END",
	[SEL_SHARD_DECIDE] = "DECIDE",   [SEL_SHARD_DECIDE_END] = "DECIDE_END",
	[SEL_SHARD_APPLIED] = "APPLIED", [SEL_SHARD_JOB] = "JOB",
	[SEL_SHARD_DONE] = "DONE",       [SEL_SHARD_DRAIN] = "DRAIN",
	[SEL_SHARD_DRAINED] = "DRAINED",
};

const char *sel_shard_type_name(uint16_t type)
{
	return type < SEL_SHARD_TYPES && type_names[type] ? type_names[type] : "?";
}

const char *sel_shard_op_name(uint32_t op)
{
	switch (op) {
	case SEL_SHARD_STORE: return "store";
	case SEL_SHARD_FETCH: return "fetch";
	case SEL_SHARD_TRUNCATE: return "truncate";
	case SEL_SHARD_UNLINK: return "unlink";
	default: return "?";
	}
}

bool sel_shard_status_valid(int32_t status)
{
	return status == 0 || (status < 0 && status >= -4095) ||
	       (status <= SEL_EBASE && status > SEL_ELAST);
}

void sel_shard_text(char *out, const char *text)
{
	size_t n = 0;
	for (; text && text[n] && n < SEL_SHARD_TEXT_MAX; n++) {
		unsigned char c = (unsigned char)text[n];
		out[n] = c < 0x20 || c == 0x7f ? '?' : (char)c;
	}
	out[n] = '\0';
}

void sel_shard_rank_fingerprint(const sel_rank_geometry *rg, uint32_t page_tokens, uint32_t rank,
				uint32_t world, uint8_t out[SEL_FINGERPRINT_BYTES])
{
	static const char domain[] = "flare-rank-layout-v1";
	sel_geometry one = {
		.ranks = 1, .page_tokens = page_tokens, .rank = (sel_rank_geometry *)rg};
	uint8_t layout[SEL_FINGERPRINT_BYTES], b[8];
	sel_layout_fingerprint(&one, layout);
	sel_put_u32(b, rank);
	sel_put_u32(b + 4, world);
	crypto_generichash_blake2b_state st;
	sel_crypto_init();
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_FINGERPRINT_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)domain, sizeof domain - 1);
	crypto_generichash_blake2b_update(&st, layout, sizeof layout);
	crypto_generichash_blake2b_update(&st, b, sizeof b);
	crypto_generichash_blake2b_final(&st, out, SEL_FINGERPRINT_BYTES);
}

/* ---- addresses ----------------------------------------------------------------- */

/* ::ffff:a.b.c.d, from bytes of any alignment. */
static bool v4_mapped(const uint8_t a[16])
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return !memcmp(a, prefix, sizeof prefix);
}

int sel_shard_addr_from(const struct sockaddr *sa, struct sel_shard_addr *out)
{
	memset(out, 0, sizeof *out);
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
		out->family = 4;
		memcpy(out->a, &s4->sin_addr, 4);
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
		if (v4_mapped(s6->sin6_addr.s6_addr)) {
			out->family = 4;
			memcpy(out->a, s6->sin6_addr.s6_addr + 12, 4);
		} else {
			out->family = 6;
			memcpy(out->a, s6->sin6_addr.s6_addr, 16);
		}
		return 0;
	}
	return eos_fail(-EAFNOSUPPORT, "rank link: address family %d is neither IPv4 nor IPv6",
			sa->sa_family);
}

bool sel_shard_addr_eq(const struct sel_shard_addr *a, const struct sel_shard_addr *b)
{
	return a->family == b->family && !memcmp(a->a, b->a, a->family == 4 ? 4 : 16);
}

const char *sel_shard_addr_text(const struct sel_shard_addr *a, char out[64])
{
	if (!inet_ntop(a->family == 4 ? AF_INET : AF_INET6, a->a, out, 64))
		snprintf(out, 64, "(address of family %u)", a->family);
	return out;
}

/* ---- field codecs ---------------------------------------------------------------- */

static void w_desc(struct sel_wr *w, const sel_record_desc *d)
{
	sel_wr_key(w, &d->key);
	sel_wr_key(w, &d->parent);
	sel_wr_bytes(w, d->bucket.b, SEL_DIGEST_BYTES);
	sel_wr_u32(w, d->tail);
	sel_wr_u32(w, d->flags);
	sel_wr_u64(w, d->parent_check);
}

/* The record rules a frame can check without the receiver's layout. */
static int desc_check(const sel_record_desc *d, const struct sel_shard_limits *lim,
		      const char *what)
{
	if (d->key.consumed == 0)
		return eos_fail(SEL_EFORMAT, "%s: the key consumes 0 tokens", what);
	if (sel_key_is_none(&d->parent)) {
		if (d->parent_check)
			return eos_fail(SEL_EFORMAT, "%s: a parent link check without a parent",
					what);
	} else if (d->parent.consumed == 0 || d->parent.consumed >= d->key.consumed) {
		return eos_fail(SEL_EFORMAT,
				"%s: the parent consumes %" PRIu64 " tokens, not 1 to %" PRIu64,
				what, d->parent.consumed, d->key.consumed - 1);
	}
	if (d->flags & ~SEL_RECORD_FLAGS_KNOWN)
		return eos_fail(SEL_EFORMAT, "%s: unknown record flags 0x%" PRIx32, what, d->flags);
	if (d->tail > SEL_SHARD_MAX_PAGES)
		return eos_fail(SEL_EFORMAT, "%s: a tail of %" PRIu32 " pages, more than %u", what,
				d->tail, SEL_SHARD_MAX_PAGES);
	if (lim && lim->sz) {
		sel_record_span sp;
		int rc = sel_record_span_of(lim->sz, d, &sp);
		if (rc)
			return eos_fail(SEL_EFORMAT, "%s: %s", what, eos_errmsg());
	}
	return 0;
}

static void r_desc(struct sel_rd *r, sel_record_desc *d, const struct sel_shard_limits *lim,
		   const char *f)
{
	sel_rd_key(r, &d->key, f);
	sel_rd_key(r, &d->parent, f);
	sel_rd_bytes(r, d->bucket.b, SEL_DIGEST_BYTES, f);
	d->tail = sel_rd_u32(r, f);
	d->flags = sel_rd_u32(r, f);
	d->parent_check = sel_rd_u64(r, f);
	if (!r->err && desc_check(d, lim, f))
		r->err = eos_fail(SEL_EFORMAT, "%s frame %s: %s", r->proto, r->what, eos_errmsg());
}

static void w_addr(struct sel_wr *w, const struct sel_shard_addr *a)
{
	sel_wr_u8(w, a->family);
	sel_wr_bytes(w, a->a, 16);
}
static void r_addr(struct sel_rd *r, struct sel_shard_addr *a)
{
	a->family = sel_rd_u8(r, "address family");
	sel_rd_bytes(r, a->a, 16, "address");
	if (r->err)
		return;
	if (a->family != 4 && a->family != 6) {
		sel_rd_fail(r, "address family", "neither 4 nor 6");
		return;
	}
	if (a->family == 4) {
		for (int i = 4; i < 16; i++)
			if (a->a[i]) {
				sel_rd_fail(r, "address",
					    "an IPv4 address with bytes after its fourth");
				return;
			}
	} else if (v4_mapped(a->a)) {
		sel_rd_fail(r, "address", "an IPv4-mapped IPv6 address (sent as IPv4)");
	}
}

static bool world_ok(uint32_t world) { return world >= 2 && world <= SEL_SHARD_WORLD_MAX; }

/* The header and identity fields HELLO and JOIN share. */
static void w_greeting(struct sel_wr *w, uint32_t world, uint32_t rank, const uint8_t *nonce)
{
	sel_wr_u32(w, SEL_SHARD_MAGIC);
	sel_wr_u32(w, SEL_SHARD_VERSION);
	sel_wr_u32(w, world);
	sel_wr_u32(w, rank);
	sel_wr_bytes(w, nonce, SEL_SHARD_NONCE_BYTES);
}
static void r_greeting(struct sel_rd *r, uint32_t *world, uint32_t *rank, uint8_t *nonce)
{
	uint32_t magic = sel_rd_u32(r, "magic");
	uint32_t version = sel_rd_u32(r, "version");
	*world = sel_rd_u32(r, "world size");
	*rank = sel_rd_u32(r, "rank");
	sel_rd_bytes(r, nonce, SEL_SHARD_NONCE_BYTES, "nonce");
	if (r->err)
		return;
	if (magic != SEL_SHARD_MAGIC) {
		sel_rd_fail(r, "magic", "not a rank link");
		return;
	}
	if (version != SEL_SHARD_VERSION) {
		r->err = eos_fail(SEL_EFORMAT,
				  "%s frame %s: protocol version %" PRIu32 ", this build "
				  "speaks version %u",
				  r->proto, r->what, version, SEL_SHARD_VERSION);
		return;
	}
	if (!world_ok(*world))
		sel_rd_fail(r, "world size", "not 2 to 64");
	else if (*rank == 0 || *rank >= *world)
		sel_rd_fail(r, "rank", "not a peer's rank (1 to the world size - 1)");
}
static void r_settings(struct sel_rd *r, struct sel_shard_settings *s)
{
	if (!r->err && !s->disk && s->disk_limit)
		sel_rd_fail(r, "disk limit", "set without a disk store");
	else if (!r->err && s->disk && !s->disk_limit)
		sel_rd_fail(r, "disk limit", "0 with a disk store");
}

static void w_entry(struct sel_wr *w, const struct sel_shard_entry *e)
{
	w_desc(w, &e->d);
	sel_wr_u32(w, e->version);
	sel_wr_u32(w, e->header_bytes);
	sel_wr_u64(w, e->created_ns);
	sel_wr_u64(w, e->page_off);
	sel_wr_u64(w, e->row_off);
	sel_wr_u64(w, e->row_end);
	sel_wr_u8(w, e->has_row);
	sel_wr_zeros(w, 7);
}
static int entry_check(const struct sel_shard_entry *e)
{
	const char *why = NULL;
	if (e->version < SEL_RECORD_VERSION_MIN || e->version > SEL_RECORD_VERSION)
		why = "a record format version this build does not read";
	else if (e->header_bytes < SEL_RECORD_HEADER_MIN ||
		 e->header_bytes > SEL_RECORD_HEADER_MAX || e->header_bytes % SEL_RECORD_ALIGN)
		why = "header bytes not a multiple of 4096 in 4096..65536";
	else if (e->page_off % SEL_RECORD_ALIGN || e->row_off % SEL_RECORD_ALIGN ||
		 e->row_end % SEL_RECORD_ALIGN)
		why = "offsets not multiples of 4096";
	else if (e->page_off < e->header_bytes || e->row_off < e->page_off ||
		 e->row_end < e->row_off || e->row_end > INT64_MAX)
		why = "offsets not in header <= pages <= row <= end order";
	if (why)
		return eos_fail(SEL_EFORMAT, "scan entry %" PRIu64 " tokens: %s", e->d.key.consumed,
				why);
	return 0;
}

static void r_entry(struct sel_rd *r, struct sel_shard_entry *e, const struct sel_shard_limits *lim)
{
	r_desc(r, &e->d, lim, "entry record");
	e->version = sel_rd_u32(r, "entry version");
	e->header_bytes = sel_rd_u32(r, "entry header bytes");
	e->created_ns = sel_rd_u64(r, "entry creation time");
	e->page_off = sel_rd_u64(r, "entry page offset");
	e->row_off = sel_rd_u64(r, "entry row offset");
	e->row_end = sel_rd_u64(r, "entry row end");
	e->has_row = sel_rd_bool(r, "entry row present");
	sel_rd_zeros(r, 7, "entry padding");
	if (!r->err && entry_check(e))
		r->err = eos_fail(SEL_EFORMAT, "%s frame %s: %s", r->proto, r->what, eos_errmsg());
}

/* Whether a text can travel: at most SEL_SHARD_TEXT_MAX bytes, no control
 * byte (sel_shard_text makes any text so). */
static bool text_ok(const char *t)
{
	size_t n = strnlen(t, SEL_SHARD_TEXT_MAX + 1);
	if (n > SEL_SHARD_TEXT_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)t[i] < 0x20 || t[i] == 0x7f)
			return false;
	return true;
}

static void w_rec(struct sel_wr *w, const struct sel_shard_rec *x)
{
	w_desc(w, &x->d);
	sel_wr_u32(w, x->first);
	sel_wr_u32(w, x->count);
}

static void w_status(struct sel_wr *w, const struct sel_shard_status *s, bool applied)
{
	sel_wr_u32(w, (uint32_t)s->status);
	if (applied) {
		sel_wr_u32(w, s->deleted);
		sel_wr_u32(w, s->truncated);
	}
	sel_wr_text(w, s->text);
}
static void r_status(struct sel_rd *r, struct sel_shard_status *s, bool applied, bool error)
{
	s->status = (int32_t)sel_rd_u32(r, "status");
	if (applied) {
		s->deleted = sel_rd_u32(r, "deleted");
		s->truncated = sel_rd_u32(r, "truncated");
	}
	sel_rd_text(r, s->text, SEL_SHARD_TEXT_MAX, "text");
	if (!r->err && !sel_shard_status_valid(s->status))
		sel_rd_fail(r, "status", "not 0, an errno or a SEL_E code");
	else if (!r->err && error && s->status == 0)
		sel_rd_fail(r, "status", "0 in an error");
}

/* ---- jobs --------------------------------------------------------------------------- */

int sel_shard_job_check(const struct sel_shard_job *j, const struct sel_shard_limits *lim)
{
	const char *op = sel_shard_op_name(j->op);
	if (j->id == 0)
		return eos_fail(SEL_EFORMAT, "job: id 0");
	if (j->op < SEL_SHARD_STORE || j->op >= SEL_SHARD_OPS)
		return eos_fail(SEL_EFORMAT, "job %" PRIu64 ": unknown operation %" PRIu32, j->id,
				j->op);
	if (j->n_recs < 1 || j->n_recs > SEL_SHARD_MAX_RECS || !j->recs)
		return eos_fail(SEL_EFORMAT,
				"job %" PRIu64 " (%s): %" PRIu32 " records, not 1 to %u", j->id, op,
				j->n_recs, SEL_SHARD_MAX_RECS);
	if (j->n_pages > SEL_SHARD_MAX_PAGES || (j->n_pages && !j->pages))
		return eos_fail(SEL_EFORMAT,
				"job %" PRIu64 " (%s): %" PRIu32 " page ids, more than %u", j->id,
				op, j->n_pages, SEL_SHARD_MAX_PAGES);
	if (j->op != SEL_SHARD_FETCH && j->n_recs != 1)
		return eos_fail(SEL_EFORMAT, "job %" PRIu64 " (%s): %" PRIu32 " records, not one",
				j->id, op, j->n_recs);
	if ((j->slot != SEL_SHARD_NO_SLOT) != j->row)
		return eos_fail(SEL_EFORMAT, "job %" PRIu64 " (%s): %s", j->id, op,
				j->row ? "a row without a state slot"
				       : "a state slot without a row");
	if (j->slot != SEL_SHARD_NO_SLOT && lim && lim->slots && j->slot >= lim->slots)
		return eos_fail(SEL_EFORMAT,
				"job %" PRIu64 " (%s): state slot %" PRIu32 " out of range "
				"(this rank has %" PRIu32 ")",
				j->id, op, j->slot, lim->slots);
	if ((j->op == SEL_SHARD_STORE) != (j->created_ns != 0))
		return eos_fail(SEL_EFORMAT, "job %" PRIu64 " (%s): %s", j->id, op,
				j->created_ns ? "a creation time on a job that writes nothing"
					      : "a store without a creation time");
	uint64_t pages = 0;
	for (uint32_t i = 0; i < j->n_recs; i++) {
		const struct sel_shard_rec *x = &j->recs[i];
		char what[96];
		snprintf(what, sizeof what, "job %" PRIu64 " (%s) record %" PRIu32, j->id, op, i);
		int rc = desc_check(&x->d, lim, what);
		if (rc)
			return rc;
		if (x->first > x->d.tail || x->count > x->d.tail - x->first)
			return eos_fail(SEL_EFORMAT,
					"%s: pages [%" PRIu32 ", +%" PRIu32 ") beyond its "
					"tail of %" PRIu32,
					what, x->first, x->count, x->d.tail);
		if (i && !sel_key_eq(&x->d.parent, &j->recs[i - 1].d.key))
			return eos_fail(SEL_EFORMAT, "%s: its parent is not the record before it",
					what);
		pages += x->count;
	}
	switch (j->op) {
	case SEL_SHARD_STORE:
		if (j->recs[0].first != 0 || j->recs[0].count != j->recs[0].d.tail)
			return eos_fail(SEL_EFORMAT,
					"job %" PRIu64 " (store): pages [%" PRIu32 ", +%" PRIu32
					") are not its whole tail",
					j->id, j->recs[0].first, j->recs[0].count);
		break;
	case SEL_SHARD_FETCH:
		if (pages == 0 && !j->row)
			return eos_fail(SEL_EFORMAT, "job %" PRIu64 " (fetch): moves nothing",
					j->id);
		break;
	default:
		if (j->row || pages || j->recs[0].first)
			return eos_fail(SEL_EFORMAT,
					"job %" PRIu64 " (%s): pages or a row on a job that "
					"moves none",
					j->id, op);
	}
	if (pages != j->n_pages)
		return eos_fail(SEL_EFORMAT,
				"job %" PRIu64 " (%s): %" PRIu32 " page ids for %" PRIu64 " pages",
				j->id, op, j->n_pages, pages);
	if (lim && lim->pages)
		for (uint32_t i = 0; i < j->n_pages; i++)
			if (j->pages[i] >= lim->pages)
				return eos_fail(SEL_EFORMAT,
						"job %" PRIu64 " (%s): page id %" PRIu32
						" out of range (this rank has %" PRIu32 ")",
						j->id, op, j->pages[i], lim->pages);
	return 0;
}

/* ---- messages ------------------------------------------------------------------------ */

/* The rules the encoder shares with the decoder, before anything is written. */
static int encode_check(const struct sel_shard_msg *m)
{
	switch (m->type) {
	case SEL_SHARD_HELLO:
	case SEL_SHARD_JOIN: {
		uint32_t world = m->type == SEL_SHARD_HELLO ? m->u.hello.world : m->u.join.world;
		uint32_t rank = m->type == SEL_SHARD_HELLO ? m->u.hello.rank : m->u.join.rank;
		const struct sel_shard_settings *s =
			m->type == SEL_SHARD_HELLO ? &m->u.hello.set : &m->u.join.set;
		if (!world_ok(world) || rank == 0 || rank >= world)
			return eos_fail(SEL_EFORMAT, "shard %s: rank %" PRIu32 " of world %" PRIu32,
					sel_shard_type_name(m->type), rank, world);
		if (s->disk != (s->disk_limit != 0))
			return eos_fail(SEL_EFORMAT,
					"shard %s: disk limit %" PRIu64 " %s a disk store",
					sel_shard_type_name(m->type), s->disk_limit,
					s->disk ? "with" : "without");
		if (m->type == SEL_SHARD_HELLO) {
			const struct sel_shard_addr *a = &m->u.hello.addr;
			if ((a->family != 4 && a->family != 6) || m->u.hello.port == 0)
				return eos_fail(SEL_EFORMAT, "shard HELLO: no address or port");
		}
		return 0;
	}
	case SEL_SHARD_ACCEPT:
		return world_ok(m->u.accept.world)
			       ? 0
			       : eos_fail(SEL_EFORMAT, "shard ACCEPT: world %" PRIu32,
					  m->u.accept.world);
	case SEL_SHARD_ERROR:
	case SEL_SHARD_APPLIED:
	case SEL_SHARD_DRAINED: {
		const struct sel_shard_status *s = &m->u.status;
		if (!sel_shard_status_valid(s->status) ||
		    (m->type == SEL_SHARD_ERROR && !s->status))
			return eos_fail(SEL_EFORMAT, "shard %s: status %" PRId32,
					sel_shard_type_name(m->type), s->status);
		if (m->type != SEL_SHARD_APPLIED && (s->deleted || s->truncated))
			return eos_fail(SEL_EFORMAT, "shard %s: counts outside APPLIED",
					sel_shard_type_name(m->type));
		if (!text_ok(s->text))
			return eos_fail(SEL_EFORMAT,
					"shard %s: a text too long or with control bytes",
					sel_shard_type_name(m->type));
		return 0;
	}
	case SEL_SHARD_SCAN: {
		const struct sel_shard_scan *s = &m->u.scan;
		if (s->n > SEL_SHARD_SCAN_CHUNK || s->first > SEL_SHARD_MAX_SCAN - s->n)
			return eos_fail(SEL_EFORMAT,
					"shard SCAN: entries [%" PRIu32 ", +%" PRIu32 ")", s->first,
					s->n);
		for (uint32_t i = 0; i < s->n; i++) {
			int rc = desc_check(&s->e[i].d, NULL, "shard SCAN entry");
			if (rc || (rc = entry_check(&s->e[i])))
				return rc;
		}
		return 0;
	}
	case SEL_SHARD_DECIDE: {
		const struct sel_shard_decide *d = &m->u.decide;
		if (d->n > SEL_SHARD_DECIDE_CHUNK || d->first > SEL_SHARD_MAX_SCAN - d->n)
			return eos_fail(SEL_EFORMAT,
					"shard DECIDE: actions [%" PRIu32 ", +%" PRIu32 ")",
					d->first, d->n);
		for (uint32_t i = 0; i < d->n; i++)
			if (d->act[i] >= SEL_SHARD_ACTIONS)
				return eos_fail(SEL_EFORMAT, "shard DECIDE: action %u", d->act[i]);
		return 0;
	}
	case SEL_SHARD_SCAN_END:
	case SEL_SHARD_DECIDE_END:
		return m->u.total.total <= SEL_SHARD_MAX_SCAN
			       ? 0
			       : eos_fail(SEL_EFORMAT, "shard %s: total %" PRIu32,
					  sel_shard_type_name(m->type), m->u.total.total);
	case SEL_SHARD_JOB: return sel_shard_job_check(&m->u.job, NULL);
	case SEL_SHARD_DONE: {
		const struct sel_shard_result *d = &m->u.done;
		if (!d->id || !sel_shard_status_valid(d->status) ||
		    (d->flags & ~SEL_SHARD_R_KNOWN) || !text_ok(d->text))
			return eos_fail(SEL_EFORMAT,
					"shard DONE: job %" PRIu64 " status %" PRId32
					" flags 0x%" PRIx32,
					d->id, d->status, d->flags);
		return 0;
	}
	case SEL_SHARD_DRAIN: return 0;
	default: return eos_fail(SEL_EFORMAT, "shard: unknown message type %u", m->type);
	}
}

static void write_payload(struct sel_wr *w, const struct sel_shard_msg *m)
{
	switch (m->type) {
	case SEL_SHARD_HELLO: {
		const struct sel_shard_hello *h = &m->u.hello;
		w_greeting(w, h->world, h->rank, h->nonce);
		w_addr(w, &h->addr);
		sel_wr_u8(w, h->set.disk);
		sel_wr_u16(w, h->port);
		sel_wr_bytes(w, h->identity, SEL_IDENTITY_BYTES);
		sel_wr_bytes(w, h->fingerprint, SEL_FINGERPRINT_BYTES);
		sel_wr_u64(w, h->set.disk_limit);
		break;
	}
	case SEL_SHARD_JOIN: {
		const struct sel_shard_join *j = &m->u.join;
		w_greeting(w, j->world, j->rank, j->nonce);
		sel_wr_bytes(w, j->identity, SEL_IDENTITY_BYTES);
		sel_wr_bytes(w, j->fingerprint, SEL_FINGERPRINT_BYTES);
		sel_wr_u8(w, j->set.disk);
		sel_wr_zeros(w, 7);
		sel_wr_u64(w, j->set.disk_limit);
		break;
	}
	case SEL_SHARD_ACCEPT:
		sel_wr_u32(w, m->u.accept.world);
		sel_wr_zeros(w, 4);
		sel_wr_u64(w, m->u.accept.disk_limit);
		break;
	case SEL_SHARD_ERROR:
	case SEL_SHARD_DRAINED: w_status(w, &m->u.status, false); break;
	case SEL_SHARD_APPLIED: w_status(w, &m->u.status, true); break;
	case SEL_SHARD_SCAN:
		sel_wr_u32(w, m->u.scan.first);
		sel_wr_u32(w, m->u.scan.n);
		for (uint32_t i = 0; i < m->u.scan.n; i++)
			w_entry(w, &m->u.scan.e[i]);
		break;
	case SEL_SHARD_DECIDE:
		sel_wr_u32(w, m->u.decide.first);
		sel_wr_u32(w, m->u.decide.n);
		sel_wr_bytes(w, m->u.decide.act, m->u.decide.n);
		break;
	case SEL_SHARD_SCAN_END:
	case SEL_SHARD_DECIDE_END: sel_wr_u32(w, m->u.total.total); break;
	case SEL_SHARD_JOB: {
		const struct sel_shard_job *j = &m->u.job;
		sel_wr_u64(w, j->id);
		sel_wr_u32(w, j->op);
		sel_wr_u8(w, j->row);
		sel_wr_zeros(w, 3);
		sel_wr_u32(w, j->slot);
		sel_wr_u64(w, j->created_ns);
		sel_wr_u64(w, j->after);
		sel_wr_u32(w, j->n_recs);
		sel_wr_u32(w, j->n_pages);
		for (uint32_t i = 0; i < j->n_recs; i++)
			w_rec(w, &j->recs[i]);
		for (uint32_t i = 0; i < j->n_pages; i++)
			sel_wr_u32(w, j->pages[i]);
		break;
	}
	case SEL_SHARD_DONE: {
		const struct sel_shard_result *d = &m->u.done;
		sel_wr_u64(w, d->id);
		sel_wr_u32(w, (uint32_t)d->status);
		sel_wr_u32(w, d->flags);
		sel_wr_u64(w, d->bytes);
		sel_wr_text(w, d->text);
		break;
	}
	case SEL_SHARD_DRAIN:
		sel_wr_u32(w, m->u.drain.ms);
		sel_wr_zeros(w, 4);
		break;
	}
}

int64_t sel_shard_encoded_size(const struct sel_shard_msg *m)
{
	int rc = encode_check(m);
	if (rc)
		return rc;
	struct sel_wr w = {0};
	write_payload(&w, m);
	if (w.n > SEL_SHARD_FRAME_MAX)
		return eos_fail(-E2BIG, "shard %s: %zu payload bytes, more than a frame holds (%u)",
				sel_shard_type_name(m->type), w.n, SEL_SHARD_FRAME_MAX);
	return (int64_t)(SEL_SHARD_FRAME_HEADER + w.n);
}

int64_t sel_shard_encode(const struct sel_shard_msg *m, void *buf, size_t cap)
{
	int64_t n = sel_shard_encoded_size(m);
	if (n < 0)
		return n;
	if ((size_t)n > cap)
		return eos_fail(-ENOBUFS, "shard %s: %" PRId64 " bytes into a buffer of %zu",
				sel_shard_type_name(m->type), n, cap);
	uint8_t *b = buf;
	sel_put_u32(b, (uint32_t)(n - SEL_SHARD_FRAME_HEADER));
	sel_put_u16(b + 4, m->type);
	sel_put_u16(b + 6, 0);
	struct sel_wr w = {b + SEL_SHARD_FRAME_HEADER, (size_t)n - SEL_SHARD_FRAME_HEADER, 0};
	write_payload(&w, m);
	return n;
}

int sel_shard_frame_header(const void *buf, size_t len, uint16_t *type, uint32_t *plen)
{
	const uint8_t *b = buf;
	if (len < SEL_SHARD_FRAME_HEADER)
		return eos_fail(SEL_EFORMAT, "shard frame: %zu bytes, shorter than a header", len);
	uint32_t n = sel_get_u32(b);
	uint16_t t = sel_get_u16(b + 4);
	if (sel_get_u16(b + 6))
		return eos_fail(SEL_EFORMAT, "shard frame: reserved header bytes are not zero");
	if (t == 0 || t >= SEL_SHARD_TYPES)
		return eos_fail(SEL_EFORMAT, "shard frame: unknown type %u", t);
	if (n > SEL_SHARD_FRAME_MAX)
		return eos_fail(SEL_EFORMAT,
				"shard frame %s: a payload of %" PRIu32 " bytes, more than %u",
				sel_shard_type_name(t), n, SEL_SHARD_FRAME_MAX);
	*type = t;
	*plen = n;
	return 0;
}

void sel_shard_msg_free(struct sel_shard_msg *m)
{
	free(m->block);
	memset(m, 0, sizeof *m);
}

static void *block(struct sel_shard_msg *m, struct sel_rd *r, size_t bytes)
{
	if (r->err)
		return NULL;
	m->block = malloc(bytes ? bytes : 1);
	if (!m->block)
		r->err = eos_fail(-ENOMEM, "shard frame %s: out of memory for %zu bytes", r->what,
				  bytes);
	return m->block;
}

/* SCAN: a chunk of a rank's summary. */
static void r_scan(struct sel_rd *r, struct sel_shard_msg *m, const struct sel_shard_limits *lim)
{
	struct sel_shard_scan *s = &m->u.scan;
	s->first = sel_rd_u32(r, "first entry");
	s->n = sel_rd_count(r, SEL_SHARD_SCAN_CHUNK, SEL_SHARD_ENTRY_BYTES, "entries");
	if (!r->err && s->first > SEL_SHARD_MAX_SCAN - s->n)
		sel_rd_fail(r, "first entry", "beyond the largest summary");
	s->e = block(m, r, (size_t)s->n * sizeof *s->e);
	for (uint32_t i = 0; i < s->n && !r->err; i++)
		r_entry(r, &s->e[i], lim);
}

/* DECIDE: a chunk of a rank's actions. */
static void r_decide(struct sel_rd *r, struct sel_shard_msg *m, const struct sel_shard_limits *lim)
{
	(void)lim;
	struct sel_shard_decide *d = &m->u.decide;
	d->first = sel_rd_u32(r, "first action");
	d->n = sel_rd_count(r, SEL_SHARD_DECIDE_CHUNK, 1, "actions");
	if (!r->err && d->first > SEL_SHARD_MAX_SCAN - d->n)
		sel_rd_fail(r, "first action", "beyond the largest summary");
	d->act = block(m, r, d->n);
	if (d->act)
		sel_rd_bytes(r, d->act, d->n, "actions");
	for (uint32_t i = 0; i < d->n && !r->err; i++)
		if (d->act[i] >= SEL_SHARD_ACTIONS)
			sel_rd_fail(r, "action", "neither keep, truncate nor delete");
}

/* JOB: the records, page ids and slot, checked against lim. */
static void r_job(struct sel_rd *r, struct sel_shard_msg *m, const struct sel_shard_limits *lim)
{
	struct sel_shard_job *j = &m->u.job;
	j->id = sel_rd_u64(r, "job id");
	j->op = sel_rd_u32(r, "operation");
	j->row = sel_rd_bool(r, "row");
	sel_rd_zeros(r, 3, "padding");
	j->slot = sel_rd_u32(r, "state slot");
	j->created_ns = sel_rd_u64(r, "creation time");
	j->after = sel_rd_u64(r, "model calls before it");
	j->n_recs = sel_rd_count(r, SEL_SHARD_MAX_RECS, REC_BYTES, "records");
	j->n_pages = sel_rd_count(r, SEL_SHARD_MAX_PAGES, 4, "page ids");
	if (!r->err &&
	    (uint64_t)j->n_recs * REC_BYTES + (uint64_t)j->n_pages * 4 != r->len - r->pos)
		sel_rd_fail(r, "records and page ids", "not exactly the rest of the payload");
	size_t rb = ((size_t)j->n_recs * sizeof *j->recs + 15) & ~(size_t)15;
	uint8_t *blk = block(m, r, rb + (size_t)j->n_pages * sizeof *j->pages);
	if (!blk)
		return;
	j->recs = (struct sel_shard_rec *)(void *)blk;
	j->pages = j->n_pages ? (uint32_t *)(void *)(blk + rb) : NULL;
	for (uint32_t i = 0; i < j->n_recs && !r->err; i++) {
		r_desc(r, &j->recs[i].d, NULL, "record");
		j->recs[i].first = sel_rd_u32(r, "record first page");
		j->recs[i].count = sel_rd_u32(r, "record page count");
	}
	for (uint32_t i = 0; i < j->n_pages && !r->err; i++)
		j->pages[i] = sel_rd_u32(r, "page id");
	if (!r->err && sel_shard_job_check(j, lim))
		r->err = eos_fail(SEL_EFORMAT, "shard frame JOB: %s", eos_errmsg());
}

/* DONE: a job's completion on one rank. */
static void r_done(struct sel_rd *r, struct sel_shard_msg *m, const struct sel_shard_limits *lim)
{
	(void)lim;
	struct sel_shard_result *d = &m->u.done;
	d->id = sel_rd_u64(r, "job id");
	d->status = (int32_t)sel_rd_u32(r, "status");
	d->flags = sel_rd_u32(r, "flags");
	d->bytes = sel_rd_u64(r, "bytes");
	sel_rd_text(r, d->text, SEL_SHARD_TEXT_MAX, "text");
	if (r->err)
		return;
	if (d->id == 0)
		sel_rd_fail(r, "job id", "0");
	else if (!sel_shard_status_valid(d->status))
		sel_rd_fail(r, "status", "not 0, an errno or a SEL_E code");
	else if (d->flags & ~SEL_SHARD_R_KNOWN)
		sel_rd_fail(r, "flags", "unknown bits");
}

static void read_payload(struct sel_rd *r, struct sel_shard_msg *m,
			 const struct sel_shard_limits *lim)
{
	switch (m->type) {
	case SEL_SHARD_HELLO: {
		struct sel_shard_hello *h = &m->u.hello;
		r_greeting(r, &h->world, &h->rank, h->nonce);
		r_addr(r, &h->addr);
		h->set.disk = sel_rd_bool(r, "disk store");
		h->port = sel_rd_u16(r, "port");
		sel_rd_bytes(r, h->identity, SEL_IDENTITY_BYTES, "identity");
		sel_rd_bytes(r, h->fingerprint, SEL_FINGERPRINT_BYTES, "fingerprint");
		h->set.disk_limit = sel_rd_u64(r, "disk limit");
		r_settings(r, &h->set);
		if (!r->err && h->port == 0)
			sel_rd_fail(r, "port", "0");
		break;
	}
	case SEL_SHARD_JOIN: {
		struct sel_shard_join *j = &m->u.join;
		r_greeting(r, &j->world, &j->rank, j->nonce);
		sel_rd_bytes(r, j->identity, SEL_IDENTITY_BYTES, "identity");
		sel_rd_bytes(r, j->fingerprint, SEL_FINGERPRINT_BYTES, "fingerprint");
		j->set.disk = sel_rd_bool(r, "disk store");
		sel_rd_zeros(r, 7, "padding");
		j->set.disk_limit = sel_rd_u64(r, "disk limit");
		r_settings(r, &j->set);
		break;
	}
	case SEL_SHARD_ACCEPT:
		m->u.accept.world = sel_rd_u32(r, "world size");
		sel_rd_zeros(r, 4, "padding");
		m->u.accept.disk_limit = sel_rd_u64(r, "disk limit");
		if (!r->err && !world_ok(m->u.accept.world))
			sel_rd_fail(r, "world size", "not 2 to 64");
		break;
	case SEL_SHARD_ERROR:
	case SEL_SHARD_DRAINED: r_status(r, &m->u.status, false, m->type == SEL_SHARD_ERROR); break;
	case SEL_SHARD_APPLIED: r_status(r, &m->u.status, true, false); break;
	case SEL_SHARD_SCAN: r_scan(r, m, lim); break;
	case SEL_SHARD_DECIDE: r_decide(r, m, lim); break;
	case SEL_SHARD_SCAN_END:
	case SEL_SHARD_DECIDE_END:
		m->u.total.total = sel_rd_u32(r, "total");
		if (!r->err && m->u.total.total > SEL_SHARD_MAX_SCAN)
			sel_rd_fail(r, "total", "more than the largest summary");
		break;
	case SEL_SHARD_JOB: r_job(r, m, lim); break;
	case SEL_SHARD_DONE: r_done(r, m, lim); break;
	case SEL_SHARD_DRAIN:
		m->u.drain.ms = sel_rd_u32(r, "milliseconds");
		sel_rd_zeros(r, 4, "padding");
		break;
	}
	sel_rd_end(r);
}

int sel_shard_decode(const void *buf, size_t len, const struct sel_shard_limits *lim,
		     struct sel_shard_msg *m)
{
	memset(m, 0, sizeof *m);
	uint16_t type;
	uint32_t plen;
	int rc = sel_shard_frame_header(buf, len, &type, &plen);
	if (rc)
		return rc;
	if (len - SEL_SHARD_FRAME_HEADER != plen)
		return eos_fail(SEL_EFORMAT, "shard frame %s: %zu bytes for a payload of %" PRIu32,
				sel_shard_type_name(type), len - SEL_SHARD_FRAME_HEADER, plen);
	m->type = type;
	struct sel_rd r = {(const uint8_t *)buf + SEL_SHARD_FRAME_HEADER,
			   plen,
			   0,
			   0,
			   "shard",
			   sel_shard_type_name(type)};
	read_payload(&r, m, lim);
	if (r.err) {
		rc = r.err;
		sel_shard_msg_free(m);
		return rc;
	}
	return 0;
}
