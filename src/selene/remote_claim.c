/*
 * remote_claim.c - the remote client's claims: a hit's windows read from
 * Redis into the caller's buffers, verified (issue 16; design 2.15
 * restore deadlines, one source; remote_client.c DESIGN "Claim").
 *
 * DESIGN
 *
 * GET of the needed windows within the client-wide budget (two in flight),
 * each value decoded (authenticated, decrypted in place) and copied to its
 * page buffers; every page is checked against the manifest's XXH3-64 as it
 * completes and the row against the header's row checksum at the end.  A
 * value bad in itself gets its record's manifest deleted, so the record
 * stops being found and its next put writes it again.
 *
 * INVARIANTS
 *   1. Nothing is written into the caller's buffers after the claim's
 *      event (remote_client.c invariant 2).
 */
#include "remote_client_int.h"

/* ---- Claim --------------------------------------------------------------- */

static void cl_fail(struct op *o, int err) { rmt_finish(o, SEL_REMOTE_FAILED, err, NULL, 0); }

void rmt_cl_pump(struct op *o)
{
	struct sel_remote *r = o->r;
	while (!o->finished && r->claim_wins < r->claim_budget && o->u.c.next < o->u.c.n_wins) {
		uint32_t i = o->u.c.next++;
		const struct hnode *hn = &o->u.c.hp->node[o->u.c.wins[i].node];
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_window_name(&r->names, &hn->m.h.d.key, o->u.c.wins[i].w, key);
		const char *argv[] = {"GET", key};
		size_t lens[] = {3, (size_t)kl};
		if (rmt_issue_argv(o, i, hn->slot, SEL_RN_FAST, false, 2, argv, lens)) {
			cl_fail(o, -ENOMEM);
			return;
		}
		o->u.c.inflight++;
		r->claim_wins++;
	}
}

/* Copy window i's payload to its destinations, checking completed pages. */
static int cl_place(struct op *o, uint32_t i, const uint8_t *p)
{
	uint32_t j = o->u.c.wins[i].node, w = o->u.c.wins[i].w;
	const struct hnode *hn = &o->u.c.hp->node[j];
	const struct sel_remote_node *nd = &o->u.c.hit->node[j];
	const struct sel_rv_layout *lay = &hn->m.layout;
	struct sel_rv_extent e;
	sel_rv_extent(lay, w, &e);
	if (e.row) {
		uint64_t at = 0, lo = e.off, hi = e.off + e.len;
		for (uint32_t k = 0; k < o->u.c.row_n && at < hi; k++) {
			uint64_t len = o->u.c.row[k].iov_len, s = at, t = at + len;
			if (t > lo && s < hi) {
				uint64_t a = s > lo ? s : lo, b = t < hi ? t : hi;
				memcpy((uint8_t *)o->u.c.row[k].iov_base + (a - s), p + (a - lo),
				       b - a);
			}
			at = t;
		}
		return 0;
	}
	for (uint32_t k = 0; k < e.pages; k++) {
		uint32_t pg = e.page + k;
		if (pg < nd->skip)
			continue;
		uint32_t di = o->u.c.base[j] + (pg - nd->skip);
		uint8_t *dst = o->u.c.pages[di];
		uint64_t len = e.pages == 1 ? e.len : lay->stride;
		memcpy(dst + e.off, p + (uint64_t)k * lay->stride, len);
		if ((o->u.c.got[di] += len) == lay->stride) {
			int rc = sel_record_check_page(dst, lay->stride,
						       sel_rv_manifest_cksum(&hn->m, pg), pg);
			if (rc)
				return rc;
		}
	}
	return 0;
}

void rmt_cl_reply(struct op *o, uint64_t tag, redisReply *rep, int err)
{
	struct sel_remote *r = o->r;
	if (err) {
		cl_fail(o, err);
		return;
	}
	if (rep->type == REDIS_REPLY_NIL) {
		char m[160];
		snprintf(m, sizeof m, "remote claim: window %u of %llu tokens is gone",
			 o->u.c.wins[tag].w,
			 (unsigned long long)o->u.c.hit->node[o->u.c.wins[tag].node].key.consumed);
		rmt_note_error(r, m);
		cl_fail(o, -ENOENT);
		return;
	}
	if (rep->type != REDIS_REPLY_STRING) {
		cl_fail(o, rep->type == REDIS_REPLY_ERROR ? rmt_reply_error(r, rep, "remote claim")
							  : -EPROTO);
		return;
	}
	uint32_t j = o->u.c.wins[tag].node, w = o->u.c.wins[tag].w;
	const struct hnode *hn = &o->u.c.hp->node[j];
	struct sel_rv_hdr want, got;
	uint8_t *payload;
	rmt_value_want(r, SEL_RV_KIND_WINDOW, &hn->m.h.d.key, w, hn->generation, &want);
	int rc = sel_rv_decode(&r->keys, &want, (uint8_t *)rep->str, rep->len, &got, &payload);
	if (!rc) {
		struct sel_rv_extent e;
		sel_rv_extent(&hn->m.layout, w, &e);
		if (got.payload != e.len)
			rc = eos_fail(SEL_EFORMAT,
				      "remote window %u: %u payload bytes, the manifest "
				      "says %llu",
				      w, got.payload, (unsigned long long)e.len);
	}
	if (!rc)
		rc = cl_place(o, (uint32_t)tag, payload);
	if (rc) {
		rmt_refused(r, rc, &hn->m.h.d.key);
		cl_fail(o, rc);
		return;
	}
	o->u.c.inflight--;
	r->claim_wins--;
	if (++o->u.c.acked < o->u.c.n_wins) {
		rmt_pump_all(r, SEL_REMOTE_OP_CLAIM);
		return;
	}
	const struct hnode *end = &o->u.c.hp->node[o->u.c.hp->n - 1];
	if ((rc = sel_record_check_row(o->u.c.row, o->u.c.row_n, end->m.h.row_checksum))) {
		rmt_refused(r, rc, &end->m.h.d.key);
		cl_fail(o, rc);
		return;
	}
	rmt_finish(o, SEL_REMOTE_CLAIMED, 0, NULL, o->u.c.hit->bytes);
}

void rmt_cl_start(struct op *o)
{
	struct sel_remote *r = o->r;
	o->started = true;
	o->start_ns = eos_now_ns();
	o->deadline_ns = o->submit_ns + sel_remote_claim_budget_ns(r, o->u.c.hit->wire_bytes);
	ol_push(&r->active, o);
	if (!o->u.c.n_wins) {
		rmt_finish(o, SEL_REMOTE_CLAIMED, 0, NULL, o->u.c.hit->bytes);
		return;
	}
	rmt_cl_pump(o);
}

int sel_remote_claim(sel_remote *r, sel_remote_hit *hit, const struct sel_remote_dest *dest,
		     uint64_t user, uint64_t *id)
{
	struct hit_priv *hp = hit ? hit->priv : NULL;
	uint64_t rs = 0;
	for (uint32_t i = 0; dest && i < dest->row_n; i++)
		rs += dest->row[i].iov_len;
	if (!hp || !dest || dest->n_pages != hit->pages || (hit->pages && !dest->pages) ||
	    rs != hit->row_bytes) {
		int rc = eos_fail(-EINVAL,
				  "remote claim: destination of %u pages and %llu row "
				  "bytes for a hit of %u pages and %llu row bytes",
				  dest ? dest->n_pages : 0, (unsigned long long)rs,
				  hit ? hit->pages : 0,
				  hit ? (unsigned long long)hit->row_bytes : 0ull);
		sel_remote_hit_free(hit);
		return rc;
	}
	struct op *o = calloc(1, sizeof *o);
	int rc = -ENOMEM;
	if (!o)
		goto fail;
	o->kind = SEL_REMOTE_OP_CLAIM;
	o->r = r;
	o->refs = 1;
	o->user = user;
	o->u.c.hit = hit;
	o->u.c.hp = hp;
	o->u.c.row_n = dest->row_n;
	o->u.c.pages = malloc((hit->pages ? hit->pages : 1) * sizeof(void *));
	o->u.c.row = malloc((dest->row_n ? dest->row_n : 1) * sizeof(struct iovec));
	o->u.c.base = calloc(hit->n_nodes, sizeof(uint32_t));
	o->u.c.got = calloc(hit->pages ? hit->pages : 1, sizeof(uint64_t));
	uint64_t nw = 0;
	for (uint32_t j = 0; j < hp->n; j++) {
		const struct sel_rv_layout *lay = &hp->node[j].m.layout;
		uint32_t skip = hit->node[j].skip;
		uint32_t w0 = skip < lay->tail ? sel_rv_page_window(lay, skip) : lay->page_windows;
		nw += (j == hp->n - 1 ? lay->windows : lay->page_windows) - w0;
	}
	o->u.c.wins = malloc((nw ? nw : 1) * sizeof *o->u.c.wins);
	if (!o->u.c.pages || !o->u.c.row || !o->u.c.base || !o->u.c.got || !o->u.c.wins)
		goto fail;
	if (hit->pages)
		memcpy(o->u.c.pages, dest->pages, hit->pages * sizeof(void *));
	if (dest->row_n)
		memcpy(o->u.c.row, dest->row, dest->row_n * sizeof(struct iovec));
	uint32_t base = 0;
	for (uint32_t j = 0; j < hp->n; j++) {
		const struct sel_rv_layout *lay = &hp->node[j].m.layout;
		uint32_t skip = hit->node[j].skip;
		uint32_t w0 = skip < lay->tail ? sel_rv_page_window(lay, skip) : lay->page_windows;
		uint32_t w1 = j == hp->n - 1 ? lay->windows : lay->page_windows;
		o->u.c.base[j] = base;
		base += hit->node[j].tail - skip;
		for (uint32_t w = w0; w < w1; w++) {
			o->u.c.wins[o->u.c.n_wins].node = j;
			o->u.c.wins[o->u.c.n_wins++].w = w;
		}
	}
	return rmt_submit(r, o, id);
fail:
	if (rc == -ENOMEM)
		eos_fail(rc, "remote claim: out of memory");
	if (o)
		rmt_op_free(o); /* frees the hit */
	else
		sel_remote_hit_free(hit);
	return rc;
}

/* ---- Head digests (issue 18) --------------------------------------------- */

int sel_remote_hit_head_sums(const sel_remote_hit *hit, uint32_t n, uint64_t *out)
{
	const struct hit_priv *hp = hit ? hit->priv : NULL;
	if (!hp || !hp->n || (n && !out))
		return eos_fail(-EINVAL, "remote head sums: no hit");
	if (n && n <= hp->n_below) { /* a rebased hit: its first hit's manifests */
		memcpy(out, hp->below + (hp->n_below - n), n * sizeof *out);
		return 0;
	}
	const struct sel_remote_node *nd = &hit->node[0];
	const struct sel_rv_manifest *m = &hp->node[0].m;
	if (n > nd->skip)
		return eos_fail(-ENOTSUP,
				"remote head sums: %u pages below the resident, the first record "
				"holds %u of them",
				n, nd->skip);
	if (nd->flags & SEL_RECORD_PAGES_REPLICATED)
		return eos_fail(-ENOTSUP, "remote head sums: a replicated record");
	if (m->h.version < SEL_RECORD_VERSION_ZERO_PAD)
		return eos_fail(-ENOTSUP, "remote head sums: a version-%u record (padding unknown)",
				m->h.version);
	for (uint32_t i = 0; i < n; i++)
		out[i] = sel_get_u64(m->cksum + 8 * ((size_t)nd->skip - n + i));
	return 0;
}
