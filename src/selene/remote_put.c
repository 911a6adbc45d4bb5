/*
 * remote_put.c - the remote client's puts: a record written to Redis as its
 * windows, its manifest and its bucket entry, on the I/O thread (issue 16;
 * remote_client.c DESIGN "Put"; docs/remote.md).
 *
 * DESIGN
 *
 * EXISTS of the manifest and every window (pipelined, one key per command
 * so a slot in migration answers ASK, not TRYAGAIN), then -- unless all are
 * there -- the windows, the manifest, and the bucket entry (SADD) with the
 * bucket's expiry.  Windows go out sealed, one at a time on each of the
 * node's bulk connections, within the client-wide budget of windows in
 * flight shared by the puts running (two at a time, oldest first).  Without
 * a max age the windows carry a provisional expiry that PERSIST clears once
 * the manifest is in: a put cut short leaves nothing that lasts.
 *
 * INVARIANTS
 *   1. A put's windows in flight never exceed its lanes, and all puts' never
 *      the client's put budget.
 *   2. The manifest is written only after every window was acknowledged.
 *   3. A page record's padding is zeroed (sel_record_zero_padding) before
 *      its checksum is taken and before any of its bytes go out, so the
 *      version-4 header the manifest carries is true: each page checksum is
 *      XXH3-64 of the planes followed by zeros (docs/record-format.md).
 */
#include "remote_client_int.h"

/* ---- Put ----------------------------------------------------------------- */

/* The expiry of a put's keys: the max age; without one, none for the
 * manifest and, for the windows until PERSIST, twice the put's deadline
 * plus a minute -- longer than the put can take, short enough that what a
 * put cut short leaves goes away. */
static uint64_t put_ttl_ms(const struct op *o, bool window)
{
	const struct sel_remote *r = o->r;
	if (r->cfg.max_age_ns)
		return r->cfg.max_age_ns / MS ? r->cfg.max_age_ns / MS : 1;
	return window ? 2 * (o->deadline_ns - o->start_ns) / MS + 60000 : 0;
}

/* The payload pieces of window w of a put. */
static uint32_t put_pieces(struct op *o, uint32_t w)
{
	struct sel_rv_extent e;
	sel_rv_extent(&o->u.p.lay, w, &e);
	uint32_t n = 0;
	if (!e.row) {
		for (uint32_t i = 0; i < e.pages; i++) {
			uint32_t pg = e.page + i;
			if (e.off == 0) { /* the page starts here: zero its padding, hash it */
				sel_record_zero_padding(&o->r->ns->layout, o->u.p.in.d.flags,
							o->u.p.pages[pg]); /* version 4 */
				o->u.p.cksum[pg] = XXH3_64bits(o->u.p.pages[pg], o->u.p.lay.stride);
			}
			o->u.p.iov[n].iov_base = (uint8_t *)o->u.p.pages[pg] + e.off;
			o->u.p.iov[n++].iov_len = e.pages == 1 ? e.len : o->u.p.lay.stride;
		}
		return n;
	}
	uint64_t at = 0, lo = e.off, hi = e.off + e.len;
	for (uint32_t i = 0; i < o->u.p.in.row_n && at < hi; i++) {
		uint64_t len = o->u.p.row[i].iov_len, s = at, t = at + len;
		if (t > lo && s < hi) {
			uint64_t a = s > lo ? s : lo, b = t < hi ? t : hi;
			o->u.p.iov[n].iov_base = (uint8_t *)o->u.p.row[i].iov_base + (a - s);
			o->u.p.iov[n++].iov_len = b - a;
		}
		at = t;
	}
	return n;
}

static void put_fail(struct op *o, int err) { rmt_finish(o, SEL_REMOTE_FAILED, err, NULL, 0); }

void rmt_put_pump(struct op *o)
{
	struct sel_remote *r = o->r;
	while (!o->finished && r->put_wins < r->put_budget && o->u.p.next_w < o->u.p.lay.windows) {
		uint32_t lane = 0; /* a bulk connection with no window in flight */
		while (lane < SEL_RN_BULK_LANES && (r->bulk_busy & (1u << lane)))
			lane++;
		if (lane == SEL_RN_BULK_LANES)
			return;
		uint32_t w = o->u.p.next_w;
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_window_name(&r->names, &o->u.p.in.d.key, w, key);
		uint32_t n = put_pieces(o, w);
		struct sel_rv_extent e;
		sel_rv_extent(&o->u.p.lay, w, &e);
		struct sel_rv_hdr h;
		rmt_value_want(r, SEL_RV_KIND_WINDOW, &o->u.p.in.d.key, w, o->u.p.generation, &h);
		h.payload = (uint32_t)e.len;
		int err = 0;
		struct sel_rn_cmd *c = rmt_set_window_cmd(r, key, (size_t)kl, &h, o->u.p.iov, n,
							  put_ttl_ms(o, true), &err);
		if (!c) {
			put_fail(o, err);
			return;
		}
		o->u.p.wcmd[lane] = c;
		o->u.p.next_w++;
		o->u.p.inflight++;
		o->u.p.lanes |= 1u << lane;
		r->put_wins++;
		r->bulk_busy |= 1u << lane;
		rmt_issue(o, c, w | (uint64_t)lane << 32, o->u.p.slot,
			  (enum sel_rn_lane)(SEL_RN_BULK + lane), false);
	}
}

static void put_done(struct op *o)
{
	rmt_finish(o, o->u.p.present ? SEL_REMOTE_PRESENT : SEL_REMOTE_STORED, 0, NULL,
		   o->u.p.present ? 0 : o->u.p.in.d.tail * o->u.p.lay.stride + o->u.p.lay.row);
}

/* After the manifest: announce the record in its bucket (only a record
 * with its row can be an endpoint; a page-only one is found through its
 * children's parent links) and, without a max age, end the windows'
 * provisional expiry. */
static void put_bucket(struct op *o)
{
	struct sel_remote *r = o->r;
	int rc;
	o->u.p.step = P_BUCKET;
	o->u.p.pending = 0;
	if (o->u.p.in.has_row) {
		char bkey[SEL_RV_NAME_MAX], member[SEL_RECORD_NAME_MAX];
		int bl = sel_rv_bucket_name(&r->names, &o->u.p.in.d.bucket, bkey);
		sel_record_name(&o->u.p.in.d.key, member);
		int32_t bslot = rmt_slot_of(bkey, bl);
		const char *sadd[] = {"SADD", bkey, member};
		size_t sl[] = {4, (size_t)bl, strlen(member)};
		if ((rc = rmt_issue_argv(o, 0, bslot, SEL_RN_BULK, false, 3, sadd, sl))) {
			put_fail(o, rc);
			return;
		}
		o->u.p.pending++;
		if (r->cfg.max_age_ns) {
			char ms[24];
			int ml = snprintf(ms, sizeof ms, "%llu",
					  (unsigned long long)put_ttl_ms(o, false));
			const char *pe[] = {"PEXPIRE", bkey, ms};
			size_t pl[] = {7, (size_t)bl, (size_t)ml};
			if ((rc = rmt_issue_argv(o, 0, bslot, SEL_RN_BULK, false, 3, pe, pl))) {
				put_fail(o, rc);
				return;
			}
			o->u.p.pending++;
		}
	}
	if (!r->cfg.max_age_ns && !o->u.p.present) {
		for (uint32_t w = 0; w < o->u.p.lay.windows; w++) {
			char key[SEL_RV_NAME_MAX];
			int kl = sel_rv_window_name(&r->names, &o->u.p.in.d.key, w, key);
			const char *pa[] = {"PERSIST", key};
			size_t pl[] = {7, (size_t)kl};
			if ((rc = rmt_issue_argv(o, 0, o->u.p.slot, SEL_RN_BULK, false, 2, pa,
						 pl))) {
				put_fail(o, rc);
				return;
			}
			o->u.p.pending++;
		}
	}
	if (!o->u.p.pending)
		put_done(o);
}

static void put_manifest(struct op *o)
{
	struct sel_remote *r = o->r;
	size_t ml = sel_rv_manifest_bytes(r->ns, o->u.p.in.d.tail);
	uint8_t *m = malloc(ml);
	if (!m) {
		put_fail(o, -ENOMEM);
		return;
	}
	int rc = sel_rv_manifest_encode(r->ns, &o->u.p.in.d, o->u.p.in.has_row, o->u.p.row_cksum,
					o->u.p.in.created_ns, r->cap, o->u.p.cksum, m, ml);
	if (rc < 0) {
		free(m);
		rmt_note_error(r, eos_errmsg());
		put_fail(o, rc);
		return;
	}
	struct sel_rv_hdr h;
	rmt_value_want(r, SEL_RV_KIND_MANIFEST, &o->u.p.in.d.key, SEL_RV_MANIFEST_WINDOW,
		       o->u.p.generation, &h);
	h.payload = (uint32_t)rc;
	struct iovec iov = {m, (size_t)rc};
	int err = 0;
	struct sel_rn_cmd *c = rmt_set_value_cmd(r, o->u.p.mname, strlen(o->u.p.mname), &h, &iov, 1,
						 put_ttl_ms(o, false), &err);
	free(m);
	if (!c) {
		put_fail(o, err);
		return;
	}
	o->u.p.step = P_MANIFEST;
	rmt_issue(o, c, 0, o->u.p.slot, SEL_RN_BULK, false);
}

void rmt_put_start(struct op *o)
{
	struct sel_remote *r = o->r;
	struct sel_remote_put *in = &o->u.p.in;
	o->started = true;
	o->start_ns = eos_now_ns();
	r->puts_running++;
	ol_push(&r->active, o);
	uint64_t bytes = in->d.tail * o->u.p.span.page_stride + o->u.p.lay.row;
	o->deadline_ns = o->start_ns + sel_remote_claim_budget_ns(r, bytes);
	if (in->has_row)
		o->u.p.row_cksum = sel_record_row_checksum(o->u.p.row, in->row_n);
	randombytes_buf(&o->u.p.generation, sizeof o->u.p.generation);
	o->u.p.generation |= 1; /* never 0 */
	/* EXISTS of the manifest and every window, one key per command (see
	 * lk_exists): all there means the record is complete on Redis. */
	o->u.p.step = P_CHECK;
	o->u.p.pending = 0;
	o->u.p.have = 0;
	for (uint32_t w = 0; w <= o->u.p.lay.windows; w++) {
		char key[SEL_RV_NAME_MAX];
		int kl = w == o->u.p.lay.windows
				 ? snprintf(key, sizeof key, "%s", o->u.p.mname)
				 : sel_rv_window_name(&r->names, &in->d.key, w, key);
		const char *argv[] = {"EXISTS", key};
		size_t lens[] = {6, (size_t)kl};
		int rc = rmt_issue_argv(o, 0, o->u.p.slot, SEL_RN_BULK, false, 2, argv, lens);
		if (rc) {
			put_fail(o, rc);
			return;
		}
		o->u.p.pending++;
	}
}

void rmt_put_reply(struct op *o, uint64_t tag, redisReply *rep, int err)
{
	struct sel_remote *r = o->r;
	if (err) {
		put_fail(o, err);
		return;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		put_fail(o, rmt_reply_error(r, rep, "remote put"));
		return;
	}
	switch (o->u.p.step) {
	case P_CHECK:
		if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 1)
			o->u.p.have++;
		if (--o->u.p.pending)
			return;
		if (o->u.p.have == o->u.p.lay.windows + 1) {
			o->u.p.present =
				true; /* complete there: announce it again, write nothing */
			put_bucket(o);
			return;
		}
		o->u.p.step = P_WINDOWS;
		rmt_put_pump(o);
		if (!o->finished && o->u.p.lay.windows == 0)
			put_manifest(o);
		return;
	case P_WINDOWS:
		o->u.p.inflight--;
		o->u.p.lanes &= ~(1u << (tag >> 32));
		r->bulk_busy &= ~(1u << (tag >> 32));
		r->put_wins--;
		if (++o->u.p.acked == o->u.p.lay.windows)
			put_manifest(o);
		rmt_pump_all(r, SEL_REMOTE_OP_PUT);
		return;
	case P_MANIFEST: put_bucket(o); return;
	case P_BUCKET:
		if (--o->u.p.pending == 0)
			put_done(o);
		return;
	}
}

int sel_remote_put(sel_remote *r, const struct sel_remote_put *p, uint64_t *id)
{
	const sel_record_ns *ns = r->ns;
	sel_record_span span;
	int rc = sel_record_span_of(&ns->layout.sz, &p->d, &span);
	if (rc)
		return eos_fail(-EINVAL, "remote put: %s", eos_errmsg());
	if (p->d.tail && !p->pages)
		return eos_fail(-EINVAL, "remote put: %u pages and no page buffers", p->d.tail);
	uint64_t row = p->has_row ? sel_rv_row_bytes(&ns->layout, p->d.flags) : 0, sum = 0;
	for (uint32_t i = 0; p->has_row && i < p->row_n; i++)
		sum += p->row[i].iov_len;
	if (sum != row)
		return eos_fail(-EINVAL, "remote put: row pieces of %llu bytes for a row of %llu",
				(unsigned long long)sum, (unsigned long long)row);
	if (!sel_rv_manifest_bytes(ns, p->d.tail))
		return eos_fail(SEL_EOVERSIZE,
				"remote put: %u pages need a manifest beyond one "
				"value",
				p->d.tail);
	struct op *o = calloc(1, sizeof *o);
	if (!o)
		return eos_fail(-ENOMEM, "remote put: out of memory");
	o->kind = SEL_REMOTE_OP_PUT;
	o->r = r;
	o->refs = 1;
	o->user = p->user;
	o->u.p.in = *p;
	o->u.p.span = span;
	if ((rc = sel_rv_layout_init(&o->u.p.lay, span.page_stride, p->d.tail, row, r->cap))) {
		free(o);
		return rc;
	}
	uint32_t iov_cap = o->u.p.lay.ppw > p->row_n ? o->u.p.lay.ppw : p->row_n;
	o->u.p.iov_cap = iov_cap ? iov_cap : 1;
	o->u.p.pages = p->d.tail ? malloc(p->d.tail * sizeof(void *)) : NULL;
	o->u.p.row = malloc((p->row_n ? p->row_n : 1) * sizeof(struct iovec));
	o->u.p.iov = malloc(o->u.p.iov_cap * sizeof(struct iovec));
	o->u.p.cksum = calloc(p->d.tail ? p->d.tail : 1, sizeof(uint64_t));
	if ((p->d.tail && !o->u.p.pages) || !o->u.p.row || !o->u.p.iov || !o->u.p.cksum) {
		rmt_op_free(o);
		return eos_fail(-ENOMEM, "remote put: out of memory");
	}
	if (p->d.tail)
		memcpy(o->u.p.pages, p->pages, p->d.tail * sizeof(void *));
	if (p->has_row && p->row_n)
		memcpy(o->u.p.row, p->row, p->row_n * sizeof(struct iovec));
	if (!p->has_row)
		o->u.p.in.row_n = 0;
	o->u.p.in.pages = NULL;
	o->u.p.in.row = NULL;
	if (!o->u.p.in.created_ns)
		o->u.p.in.created_ns = eos_wall_ns();
	int ml = sel_rv_manifest_name(&r->names, &p->d.key, o->u.p.mname);
	o->u.p.slot = rmt_slot_of(o->u.p.mname, ml);
	return rmt_submit(r, o, id);
}
