/*
 * ranks_proto.c - the execution protocol's frames (ranks_proto.h).
 *
 * An encoder and its decoder are one list of fields walked in two
 * directions (wire.h), so a frame that decodes re-encodes to exactly its
 * bytes; the encoder refuses what the decoder would.
 */
#include "ranks_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "wire.h"

static const char *const names[] = {
	[HEL_RP_JOIN] = "JOIN",   [HEL_RP_START] = "START", [HEL_RP_READY] = "READY",
	[HEL_RP_CALL] = "CALL",   [HEL_RP_PART] = "PART",   [HEL_RP_SUM] = "SUM",
	[HEL_RP_ERROR] = "ERROR", [HEL_RP_BYE] = "BYE",     [HEL_RP_STORE] = "STORE",
};

const char *hel_rp_type_name(uint16_t type)
{
	return type >= 1 && type <= HEL_RP_TYPE_MAX ? names[type] : "unknown";
}

int hel_rp_header(const void *buf, size_t len, uint16_t *type, uint32_t *plen)
{
	const uint8_t *b = buf;
	if (len < HEL_RP_HEADER)
		return eos_fail(SEL_EFORMAT, "ranks frame: a header of %zu bytes", len);
	*plen = sel_get_u32(b);
	*type = sel_get_u16(b + 4);
	if (*type < 1 || *type > HEL_RP_TYPE_MAX)
		return eos_fail(SEL_EFORMAT, "ranks frame: unknown type %u", *type);
	if (sel_get_u16(b + 6))
		return eos_fail(SEL_EFORMAT, "ranks frame %s: reserved header bytes are not zero",
				names[*type]);
	if (*plen > HEL_RP_FRAME_MAX)
		return eos_fail(SEL_EFORMAT, "ranks frame %s: a payload of %u bytes (at most %u)",
				names[*type], *plen, HEL_RP_FRAME_MAX);
	return 0;
}

/* What the decoder refuses, said before encoding. */
static int check(const struct hel_rp_msg *m)
{
	switch (m->type) {
	case HEL_RP_CALL:
		if (m->call.op < HEL_TP_ROW_INIT || m->call.op > HEL_TP_OP_MAX ||
		    m->call.n_pages > HEL_RP_MAX_PAGES || m->call.n_words > HEL_RP_MAX_WORDS ||
		    m->call.n > HEL_RP_MAX_WORDS || (m->call.n_pages && !m->call.pages) ||
		    (m->call.n_words && !m->call.words))
			return eos_fail(-EINVAL, "ranks frame CALL: op %d, %u pages, %zu words",
					(int)m->call.op, m->call.n_pages, m->call.n_words);
		return 0;
	case HEL_RP_PART:
	case HEL_RP_SUM:
		if (m->sum.n > HEL_RP_MAX_SUM || (m->sum.n && !m->sum.w))
			return eos_fail(-EINVAL, "ranks frame %s: %u words", names[m->type],
					m->sum.n);
		return 0;
	case HEL_RP_ERROR:
		if (strlen(m->error.text) > HEL_RP_TEXT_MAX)
			return eos_fail(-EINVAL, "ranks frame ERROR: text too long");
		for (const char *p = m->error.text; *p; p++)
			if ((uint8_t)*p < 0x20 || *p == 0x7f)
				return eos_fail(-EINVAL,
						"ranks frame ERROR: a control byte in the text");
		return 0;
	case HEL_RP_STORE:
		if (m->store.n == 0 || m->store.n > HEL_RP_STORE_MAX)
			return eos_fail(-EINVAL, "ranks frame STORE: %u bytes", m->store.n);
		return 0;
	default:
		return m->type >= 1 && m->type <= HEL_RP_TYPE_MAX
			       ? 0
			       : eos_fail(-EINVAL, "ranks frame: unknown type %u", m->type);
	}
}

static void put_payload(struct sel_wr *w, const struct hel_rp_msg *m)
{
	switch (m->type) {
	case HEL_RP_JOIN:
		sel_wr_u32(w, HEL_RP_MAGIC);
		sel_wr_u16(w, HEL_RP_VERSION);
		sel_wr_zeros(w, 2);
		sel_wr_u32(w, m->join.world);
		sel_wr_u32(w, m->join.rank);
		sel_wr_bytes(w, m->join.identity, SEL_IDENTITY_BYTES);
		break;
	case HEL_RP_START:
		sel_wr_u32(w, m->start.mode);
		sel_wr_u32(w, m->start.pages);
		sel_wr_u32(w, m->start.rows);
		break;
	case HEL_RP_READY: sel_wr_bytes(w, m->ready.fingerprint, HEL_RP_FP_BYTES); break;
	case HEL_RP_CALL:
		sel_wr_u16(w, (uint16_t)m->call.op);
		sel_wr_zeros(w, 2);
		sel_wr_u32(w, m->call.slot);
		sel_wr_u32(w, m->call.arg);
		sel_wr_u64(w, m->call.value);
		sel_wr_u32(w, (uint32_t)m->call.n);
		sel_wr_u32(w, m->call.n_pages);
		for (uint32_t i = 0; i < m->call.n_pages; i++)
			sel_wr_u32(w, m->call.pages[i]);
		sel_wr_u32(w, (uint32_t)m->call.n_words);
		for (size_t i = 0; i < m->call.n_words; i++)
			sel_wr_u32(w, m->call.words[i]);
		break;
	case HEL_RP_PART:
	case HEL_RP_SUM:
		sel_wr_u32(w, m->sum.n);
		for (uint32_t i = 0; i < m->sum.n; i++)
			sel_wr_u64(w, m->sum.w[i]);
		break;
	case HEL_RP_ERROR:
		sel_wr_u32(w, (uint32_t)m->error.status);
		sel_wr_text(w, m->error.text);
		break;
	case HEL_RP_STORE:
		sel_wr_u32(w, m->store.n);
		sel_wr_bytes(w, m->store.b, m->store.n);
		break;
	default: /* BYE */ break;
	}
}

int64_t hel_rp_encode(const struct hel_rp_msg *m, void *buf, size_t cap)
{
	int rc = check(m);
	if (rc)
		return rc;
	struct sel_wr meas = {NULL, 0, 0};
	put_payload(&meas, m);
	size_t total = HEL_RP_HEADER + meas.n;
	if (meas.n > HEL_RP_FRAME_MAX)
		return eos_fail(-EINVAL, "ranks frame %s: %zu payload bytes (at most %u)",
				names[m->type], meas.n, HEL_RP_FRAME_MAX);
	if (buf && cap >= total) {
		struct sel_wr w = {buf, cap, 0};
		sel_wr_u32(&w, (uint32_t)meas.n);
		sel_wr_u16(&w, m->type);
		sel_wr_zeros(&w, 2);
		put_payload(&w, m);
	}
	return (int64_t)total;
}

static void get_call(struct sel_rd *r, hel_tp_call *c)
{
	uint16_t op = sel_rd_u16(r, "op");
	sel_rd_zeros(r, 2, "reserved");
	if (!r->err && (op < HEL_TP_ROW_INIT || op > HEL_TP_OP_MAX))
		sel_rd_fail(r, "op", "unknown operation");
	c->op = (hel_tp_op)op;
	c->slot = sel_rd_u32(r, "slot");
	c->arg = sel_rd_u32(r, "arg");
	c->value = sel_rd_u64(r, "value");
	c->n = sel_rd_u32(r, "positions");
	if (!r->err && c->n > HEL_RP_MAX_WORDS)
		sel_rd_fail(r, "positions", "over its limit");
	c->n_pages = sel_rd_count(r, HEL_RP_MAX_PAGES, 4, "pages");
	uint32_t *pages = c->n_pages ? malloc((size_t)c->n_pages * 4) : NULL;
	if (c->n_pages && !pages && !r->err)
		r->err = eos_fail(-ENOMEM, "ranks frame CALL: out of memory");
	for (uint32_t i = 0; i < c->n_pages && !r->err; i++)
		pages[i] = sel_rd_u32(r, "page id");
	c->pages = pages;
	c->n_words = sel_rd_count(r, HEL_RP_MAX_WORDS, 4, "words");
	uint32_t *words = c->n_words ? malloc(c->n_words * 4) : NULL;
	if (c->n_words && !words && !r->err)
		r->err = eos_fail(-ENOMEM, "ranks frame CALL: out of memory");
	for (size_t i = 0; i < c->n_words && !r->err; i++)
		words[i] = sel_rd_u32(r, "word");
	c->words = words;
}

static void get_payload(struct sel_rd *r, struct hel_rp_msg *m)
{
	switch (m->type) {
	case HEL_RP_JOIN:
		if (sel_rd_u32(r, "magic") != HEL_RP_MAGIC && !r->err)
			sel_rd_fail(r, "magic", "not a rank's JOIN");
		if (sel_rd_u16(r, "version") != HEL_RP_VERSION && !r->err)
			sel_rd_fail(r, "version", "another protocol version");
		sel_rd_zeros(r, 2, "reserved");
		m->join.world = sel_rd_u32(r, "world");
		m->join.rank = sel_rd_u32(r, "rank");
		sel_rd_bytes(r, m->join.identity, SEL_IDENTITY_BYTES, "identity");
		break;
	case HEL_RP_START:
		m->start.mode = sel_rd_u32(r, "mode");
		m->start.pages = sel_rd_u32(r, "pages");
		m->start.rows = sel_rd_u32(r, "rows");
		break;
	case HEL_RP_READY:
		sel_rd_bytes(r, m->ready.fingerprint, HEL_RP_FP_BYTES, "fingerprint");
		break;
	case HEL_RP_CALL: get_call(r, &m->call); break;
	case HEL_RP_PART:
	case HEL_RP_SUM:
		m->sum.n = sel_rd_count(r, HEL_RP_MAX_SUM, 8, "words");
		m->sum.w = m->sum.n ? malloc((size_t)m->sum.n * 8) : NULL;
		if (m->sum.n && !m->sum.w && !r->err)
			r->err = eos_fail(-ENOMEM, "ranks frame: out of memory");
		for (uint32_t i = 0; i < m->sum.n && !r->err; i++)
			m->sum.w[i] = sel_rd_u64(r, "word");
		break;
	case HEL_RP_ERROR:
		m->error.status = (int32_t)sel_rd_u32(r, "status");
		sel_rd_text(r, m->error.text, HEL_RP_TEXT_MAX, "text");
		break;
	case HEL_RP_STORE:
		m->store.n = sel_rd_u32(r, "bytes");
		if (!r->err && (m->store.n == 0 || m->store.n > HEL_RP_STORE_MAX))
			sel_rd_fail(r, "bytes", "not 1..1024");
		if (!r->err)
			sel_rd_bytes(r, m->store.b, m->store.n, "hello");
		break;
	default: break;
	}
}

int hel_rp_decode(const void *buf, size_t len, struct hel_rp_msg *m)
{
	uint16_t type;
	uint32_t plen;
	memset(m, 0, sizeof *m);
	int rc = hel_rp_header(buf, len, &type, &plen);
	if (rc)
		return rc;
	if (len - HEL_RP_HEADER != plen)
		return eos_fail(SEL_EFORMAT,
				"ranks frame %s: %zu payload bytes, the header says %u",
				names[type], len - HEL_RP_HEADER, plen);
	m->type = type;
	struct sel_rd r = {(const uint8_t *)buf + HEL_RP_HEADER, plen, 0, 0, "ranks", names[type]};
	get_payload(&r, m);
	if (!r.err && r.pos != r.len)
		sel_rd_fail(&r, "end", "bytes after the last field");
	return r.err;
}

void hel_rp_free(struct hel_rp_msg *m)
{
	if (m->type == HEL_RP_CALL) {
		free((void *)m->call.pages);
		free((void *)m->call.words);
		m->call.pages = m->call.words = NULL;
	} else if (m->type == HEL_RP_PART || m->type == HEL_RP_SUM) {
		free(m->sum.w);
		m->sum.w = NULL;
	}
}
