/*
 * pool_client_lease.c - the worker's side of the pool client: holdings,
 * lookups and their tickets, claims, puts, exports and the leases they
 * grant, each submission encoded into a frame for the I/O thread (design
 * 2.15 claims, puts, exports, leases; pool_client.h).
 *
 * DESIGN
 *
 * Everything here runs on the worker thread and owns the tables of
 * tickets, pending claims and puts and live leases.  A submission is
 * encoded whole and linked onto the outbound queue (bounded: ends of
 * leases are always accepted).  A lease is in the table from its grant
 * (pool_client_poll.c) until its end: release, commit, export done, or the
 * loss of its session; its windows were checked against exactly what was
 * asked (sel_pool_windows_check).  Checksums of what a lease moved are
 * verified here before the caller trusts the bytes.
 *
 * INVARIANTS
 *   1. A lease is in the lease table from its grant until its end (pool_client.c
 *      invariant 1); n_live counts those not yet committed.
 *   2. n_claims and n_puts count the pending and live ones, within the
 *      hello's limits.
 */
#include "pool_client_int.h"


struct pending *pc_pending_find(sel_pool_client *c, uint64_t id, bool claim)
{
	for (struct eos_hnode *x = eos_hmap_first(&c->pendings, eos_hash64(id)); x;
	     x = eos_hmap_next(x)) {
		struct pending *p = CONTAINER(x, struct pending, hn);
		if (p->id == id && p->is_claim == claim && p->epoch == c->epoch)
			return p;
	}
	return NULL;
}

void pc_pending_drop(sel_pool_client *c, struct pending *p)
{
	eos_hmap_remove(&c->pendings, &p->hn);
	if (p->is_claim) {
		plist_del(&c->claims, p);
		c->n_claims--;
	} else {
		c->n_puts--;
	}
	free(p);
}

struct lease *pc_lease_find(sel_pool_client *c, uint64_t id)
{
	for (struct eos_hnode *x = eos_hmap_first(&c->leases, eos_hash64(id)); x;
	     x = eos_hmap_next(x)) {
		struct lease *l = CONTAINER(x, struct lease, hn);
		if (l->pub.id == id)
			return l;
	}
	return NULL;
}

void pc_maybe_drained(sel_pool_client *c)
{
	if (c->state == SEL_POOL_DETACHED && c->n_live == 0 &&
	    atomic_load(&c->drained) != c->epoch) {
		atomic_store(&c->drained, c->epoch);
		pc_wake(c->wake_io);
	}
}

/* Remove a lease from the table and free it. */
void pc_lease_end(sel_pool_client *c, struct lease *l)
{
	eos_hmap_remove(&c->leases, &l->hn);
	if (!l->committed) {
		c->n_live--;
		if (l->pub.kind == SEL_POOL_CLAIM) {
			c->n_claims--;
			c->claim_bytes -= l->pub.bytes;
		} else if (l->pub.kind == SEL_POOL_PUT)
			c->n_puts--;
	} else {
		c->n_puts--;
	}
	pc_lease_free(l);
	pc_maybe_drained(c);
}

struct lease *pc_lease_new(sel_pool_client *c, enum sel_pool_lease_kind kind, uint64_t id,
			   uint64_t nonce, uint32_t deadline_ms, const struct sel_pool_window *w,
			   uint32_t nw, uint32_t pages, uint32_t rows)
{
	struct lease *l = calloc(1, sizeof *l);
	if (!l)
		return NULL;
	l->slots = malloc(((size_t)pages + rows + 1) * sizeof *l->slots);
	if (!l->slots) {
		free(l);
		return NULL;
	}
	uint32_t k = 0;
	for (uint32_t i = 0; i < nw; i++)
		for (uint32_t s = 0; s < w[i].slots; s++)
			l->slots[k++] = (uint32_t)(w[i].off / c->lay.slot_bytes) + s;
	l->pub.kind = kind;
	l->pub.id = id;
	l->pub.n_pages = pages;
	l->pub.page_slots = l->slots;
	l->pub.n_row_slots = rows;
	l->pub.row_slots = l->slots + pages;
	l->pub.bytes = ((uint64_t)pages + rows) * c->lay.slot_bytes;
	l->pub.deadline_ns = eos_now_ns() + (uint64_t)deadline_ms * MS_NS;
	l->pub.windows = nw;
	l->pub.page_tokens = c->g->page_tokens;
	l->nonce = nonce;
	l->epoch = c->epoch;
	eos_hmap_insert(&c->leases, &l->hn, eos_hash64(id));
	c->n_live++;
	if (kind == SEL_POOL_CLAIM)
		c->claim_bytes += l->pub.bytes;
	return l;
}

/* Windows of a grant: the protocol's rule, and slot numbers that fit u32. */
int pc_windows_ok(sel_pool_client *c, const struct sel_pool_window *w, uint32_t n, uint32_t pages,
		  uint32_t rows)
{
	if (c->arena_bytes / c->lay.slot_bytes > UINT32_MAX)
		return eos_fail(SEL_EFORMAT, "pool: the arena has more slots than slot numbers");
	return sel_pool_windows_check(w, n, c->arena_bytes, c->hello.data_start, c->lay.slot_bytes,
				      pages, rows);
}

void pc_send_ls(sel_pool_client *c, uint16_t type, uint64_t lease, uint64_t nonce, uint32_t status)
{
	struct sel_pool_msg m = {.type = type};
	m.u.ls = (struct sel_pool_lease_status){lease, nonce, status};
	pc_submit(c, &m, true);
}

/* ---- holdings and lookups ---------------------------------------------------------------------- */

static int holdings(sel_pool_client *c, uint16_t type, const struct sel_pool_holding *h, uint32_t n)
{
	if (n > SEL_POOL_MAX_HOLDINGS)
		return eos_fail(-EINVAL, "pool: %u holdings in one call (at most %u)", n,
				SEL_POOL_MAX_HOLDINGS);
	for (uint32_t i = 0; i < n; i++)
		if (h[i].source == SEL_POOL_SRC_ARENA || h[i].source >= SEL_POOL_SOURCES)
			return eos_fail(-EINVAL,
					"pool: holding %u has source %u (gpu, dram or nvme)", i,
					h[i].source);
	struct sel_pool_msg m = {.type = type};
	m.u.holdings.n = n;
	m.u.holdings.h = (struct sel_pool_holding *)h;
	return pc_submit(c, &m, false);
}

int sel_pool_announce(sel_pool_client *c, const struct sel_pool_holding *h, uint32_t n)
{
	return holdings(c, SEL_POOL_C_ANNOUNCE, h, n);
}

int sel_pool_withdraw(sel_pool_client *c, const struct sel_pool_holding *h, uint32_t n)
{
	return holdings(c, SEL_POOL_C_WITHDRAW, h, n);
}

int sel_pool_reset_holdings(sel_pool_client *c, uint32_t sources)
{
	if (sources & ~0xeu)
		return eos_fail(-EINVAL, "pool: unknown source bits 0x%x", sources);
	struct sel_pool_msg m = {.type = SEL_POOL_C_RESET};
	m.u.reset.sources = sources;
	return pc_submit(c, &m, false);
}

int sel_pool_begin_lookup(sel_pool_client *c, const sel_history *h, uint64_t resident,
			  uint64_t limit, sel_pool_ticket **out)
{
	*out = NULL;
	uint64_t len = sel_history_len(h);
	uint64_t top = limit < len ? limit : len;
	if (resident >= top)
		return eos_fail(-EINVAL,
				"pool lookup: nothing above the resident %" PRIu64 " tokens "
				"(history %" PRIu64 ", limit %" PRIu64 ")",
				resident, len, limit);
	uint64_t k_hi = top / SEL_BUCKET_TOKENS, k_lo = resident / SEL_BUCKET_TOKENS;
	uint64_t n = k_hi - k_lo + 1;
	if (n > SEL_POOL_MAX_BOUNDS)
		n = SEL_POOL_MAX_BOUNDS;
	sel_digest *b = malloc(n * sizeof *b);
	sel_pool_ticket *t = calloc(1, sizeof *t);
	if (!b || !t) {
		free(b);
		free(t);
		return eos_fail(-ENOMEM, "pool lookup: out of memory");
	}
	for (uint64_t i = 0; i < n; i++)
		b[i] = *sel_history_bound(h, k_hi - i);
	t->id = c->next_id++;
	t->epoch = c->epoch;
	t->resident = resident;
	struct sel_pool_msg m = {.type = SEL_POOL_C_LOOKUP};
	m.u.lookup = (struct sel_pool_c_lookup){t->id, resident, top, k_hi, (uint32_t)n, b};
	int rc = pc_submit(c, &m, false);
	free(b);
	if (rc) {
		free(t);
		return rc;
	}
	t->linked = true;
	eos_hmap_insert(&c->tickets, &t->hn, eos_hash64(t->id));
	c->st.lookups++;
	*out = t;
	return 0;
}

enum sel_pool_ticket_state sel_pool_ticket_state(const sel_pool_ticket *t) { return t->state; }
uint64_t sel_pool_ticket_id(const sel_pool_ticket *t) { return t->id; }
uint64_t sel_pool_ticket_resident(const sel_pool_ticket *t) { return t->resident; }

const struct sel_pool_m_answer *sel_pool_ticket_answer(const sel_pool_ticket *t)
{
	return t->state == SEL_POOL_TICKET_READY ? &t->ans.u.answer : NULL;
}

void sel_pool_ticket_free(sel_pool_client *c, sel_pool_ticket *t)
{
	if (!t)
		return;
	if (t->linked && c)
		eos_hmap_remove(&c->tickets, &t->hn);
	sel_pool_msg_free(&t->ans);
	free(t);
}

sel_pool_ticket *pc_ticket_find(sel_pool_client *c, uint64_t id)
{
	for (struct eos_hnode *x = eos_hmap_first(&c->tickets, eos_hash64(id)); x;
	     x = eos_hmap_next(x)) {
		sel_pool_ticket *t = CONTAINER(x, sel_pool_ticket, hn);
		if (t->id == id)
			return t;
	}
	return NULL;
}

bool sel_pool_candidate_matches(const struct sel_pool_m_answer *a, uint32_t i, const sel_history *h,
				uint64_t resident)
{
	if (i >= a->n_cands)
		return false;
	const struct sel_pool_candidate *cd = &a->cands[i];
	if (cd->base > resident || cd->node >= a->n_nodes || !a->nodes[cd->node].has_row)
		return false;
	uint64_t len = sel_history_len(h), prev = UINT64_MAX;
	uint32_t n = cd->node, steps = 0;
	while (n != SEL_POOL_NONE) {
		if (n >= a->n_nodes || ++steps > a->n_nodes)
			return false;
		const struct sel_pool_anode *x = &a->nodes[n];
		uint64_t cc = x->key.consumed;
		if (cc > len || cc >= prev || cc <= cd->base || cc <= resident)
			return false;
		sel_key k;
		sel_history_key_at(h, cc, &k);
		if (!sel_key_eq(&k, &x->key))
			return false;
		prev = cc;
		n = x->up;
	}
	return true;
}

static int source_rank(uint8_t s)
{
	return s == SEL_POOL_SRC_GPU    ? 0
	       : s == SEL_POOL_SRC_DRAM ? 1
	       : s == SEL_POOL_SRC_NVME ? 2
					: 3;
}

int sel_pool_answer_pick(const struct sel_pool_m_answer *a, const sel_history *h, uint64_t resident)
{
	int best = -1;
	for (uint32_t i = 0; i < a->n_cands; i++) {
		uint64_t ci = a->nodes[a->cands[i].node].key.consumed;
		if (best >= 0) {
			uint64_t cb = a->nodes[a->cands[best].node].key.consumed;
			if (ci < cb)
				break;
			if (ci > cb ||
			    source_rank(a->cands[i].source) >= source_rank(a->cands[best].source))
				continue;
		}
		if (sel_pool_candidate_matches(a, i, h, resident))
			best = (int)i;
	}
	return best;
}

/* ---- claims, puts, exports ------------------------------------------------------------------------ */

uint64_t sel_pool_claim_deadline(const sel_pool_client *c, uint64_t claim)
{
	for (const struct pending *q = c->claims.head; q; q = q->next)
		if (q->id == claim && !q->dead)
			return q->deadline_ns;
	return 0;
}

int sel_pool_claim(sel_pool_client *c, const sel_pool_ticket *t, uint32_t i, uint64_t *claim)
{
	return sel_pool_claim_at(c, t, i, t->resident, claim);
}

int sel_pool_claim_at(sel_pool_client *c, const sel_pool_ticket *t, uint32_t i, uint64_t resident,
		      uint64_t *claim)
{
	if (t->state != SEL_POOL_TICKET_READY || t->epoch != c->epoch ||
	    i >= t->ans.u.answer.n_cands)
		return eos_fail(-EINVAL,
				"pool claim: the ticket has no candidate %u of this session", i);
	/* Below the lookup's resident too: an overlapped restore's claim
	 * starts at the head it recomputes (issue 18); the manager builds the
	 * chain from any resident, and the grant is checked against the whole
	 * history (sel_pool_lease_matches). */
	if (resident >= t->ans.u.answer.nodes[t->ans.u.answer.cands[i].node].key.consumed)
		return eos_fail(-EINVAL,
				"pool claim: resident %" PRIu64
				" at or past the candidate's endpoint (the lookup's from %" PRIu64
				")",
				resident, t->resident);
	if (c->n_claims >= c->hello.max_claims)
		return eos_fail(-EBUSY, "pool claim: %u claims open (the manager allows %u)",
				c->n_claims, c->hello.max_claims);
	const struct sel_pool_m_answer *a = &t->ans.u.answer;
	const struct sel_pool_candidate *cd = &a->cands[i];
	struct pending *p = calloc(1, sizeof *p);
	if (!p)
		return eos_fail(-ENOMEM, "pool claim: out of memory");
	p->id = c->next_id++;
	p->epoch = c->epoch;
	p->is_claim = true;
	p->source = cd->source;
	p->key = a->nodes[cd->node].key;
	p->resident = resident;
	p->bytes = cd->bytes;
	/* Design 2.15 restore deadlines: a waiting restore also budgets for
	 * the restores ahead of it: the claims still waiting for a grant and
	 * the granted ones still copying (their leases not yet released). */
	uint64_t ahead = c->claim_bytes;
	for (const struct pending *q = c->claims.head; q; q = q->next)
		if (!q->dead)
			ahead += q->bytes;
	p->deadline_ns = eos_now_ns() + (uint64_t)sel_pool_deadline_ms(SEL_POOL_REQUESTER_SETUP_MS,
								       SEL_POOL_REQUESTER_SETUP_MS,
								       cd->bytes + ahead) *
						MS_NS;
	struct sel_pool_msg m = {.type = SEL_POOL_C_CLAIM};
	m.u.claim.claim = p->id;
	m.u.claim.source = cd->source;
	memcpy(m.u.claim.holder, cd->holder, SEL_POOL_ID_BYTES);
	m.u.claim.generation = cd->generation;
	m.u.claim.key = p->key;
	m.u.claim.resident = resident;
	m.u.claim.setup_ms = c->setup_ms;
	int rc = pc_submit(c, &m, false);
	if (rc) {
		free(p);
		return rc;
	}
	eos_hmap_insert(&c->pendings, &p->hn, eos_hash64(p->id));
	plist_push(&c->claims, p);
	c->n_claims++;
	c->st.claims++;
	*claim = p->id;
	return 0;
}

int sel_pool_put(sel_pool_client *c, const struct sel_pool_put_desc *d, uint64_t *put)
{
	uint32_t pt = c->g->page_tokens;
	uint64_t cc = d->key.consumed, pc = d->parent.consumed;
	bool root = d->tail == cc / pt;
	bool linked = !sel_key_is_none(&d->parent) && pc < cc && d->tail == cc / pt - pc / pt;
	if (!cc || (!root && !linked) || d->tail > SEL_POOL_MAX_PAGES)
		return eos_fail(-EINVAL,
				"pool put: tail %u is neither the whole chain (%" PRIu64 ") nor "
				"the pages past the parent's %" PRIu64 " tokens",
				d->tail, cc / pt, pc);
	if (c->n_puts >= c->hello.max_puts)
		return eos_fail(-EBUSY, "pool put: %u puts open (the manager allows %u)", c->n_puts,
				c->hello.max_puts);
	struct pending *p = calloc(1, sizeof *p);
	if (!p)
		return eos_fail(-ENOMEM, "pool put: out of memory");
	p->id = c->next_id++;
	p->epoch = c->epoch;
	p->key = d->key;
	p->tail = d->tail;
	struct sel_pool_msg m = {.type = SEL_POOL_C_PUT};
	m.u.put = (struct sel_pool_c_put){.put = p->id,
					  .key = d->key,
					  .parent = d->parent,
					  .bucket = d->bucket,
					  .tail = d->tail,
					  .has_row = 1,
					  .setup_ms = c->setup_ms};
	int rc = pc_submit(c, &m, false);
	if (rc) {
		free(p);
		return rc;
	}
	eos_hmap_insert(&c->pendings, &p->hn, eos_hash64(p->id));
	c->n_puts++;
	c->st.puts++;
	*put = p->id;
	return 0;
}

static bool live(sel_pool_client *c, struct sel_pool_lease *pub, enum sel_pool_lease_kind kind)
{
	struct lease *l = (struct lease *)pub;
	return pub && pub->kind == kind && !l->committed && pc_lease_find(c, pub->id) == l;
}

/* The session that granted the lease is still open. */
static bool same_session(sel_pool_client *c, struct lease *l)
{
	return c->state == SEL_POOL_ATTACHED && l->epoch == c->epoch;
}

int sel_pool_commit(sel_pool_client *c, struct sel_pool_lease *pub, const uint64_t *page_cksum,
		    uint64_t row_cksum)
{
	if (!live(c, pub, SEL_POOL_PUT))
		return eos_fail(-EINVAL, "pool commit: not a live put lease");
	struct lease *l = (struct lease *)pub;
	if (!same_session(c, l)) {
		/* The session is gone: nothing to commit to. */
		pc_emit(c, SEL_POOL_EV_PUT_RESULT, SEL_POOL_GONE, l->pub.request, &l->pub.key, NULL,
			NULL);
		pc_lease_end(c, l);
		return 0;
	}
	struct sel_pool_msg m = {.type = SEL_POOL_C_COMMIT};
	m.u.cksums = (struct sel_pool_c_cksums){
		l->pub.id, l->nonce, 0, l->pub.n_pages, (uint64_t *)page_cksum, row_cksum};
	int rc = pc_submit(c, &m, true);
	if (rc)
		return rc;
	/* Committed: the windows are the manager's; keep the id for the result. */
	l->committed = true;
	c->n_live--;
	pc_maybe_drained(c);
	return 0;
}

int sel_pool_export_reply(sel_pool_client *c, struct sel_pool_lease *pub, uint32_t reason)
{
	if (!live(c, pub, SEL_POOL_EXPORT) || reason >= SEL_POOL_REASONS)
		return eos_fail(-EINVAL, "pool export reply: not a live export lease");
	struct lease *l = (struct lease *)pub;
	if (same_session(c, l))
		pc_send_ls(c, SEL_POOL_C_EXPORT_REPLY, l->pub.id, l->nonce, reason);
	if (reason == SEL_POOL_OK) {
		c->st.exports_accepted++;
		return 0;
	}
	c->st.exports_refused++;
	pc_lease_end(c, l);
	return 0;
}

int sel_pool_export_done(sel_pool_client *c, struct sel_pool_lease *pub, const uint64_t *page_cksum,
			 uint64_t row_cksum)
{
	if (!live(c, pub, SEL_POOL_EXPORT))
		return eos_fail(-EINVAL, "pool export done: not a live export lease");
	struct lease *l = (struct lease *)pub;
	if (same_session(c, l)) {
		struct sel_pool_msg m = {.type = SEL_POOL_C_EXPORT_DONE};
		m.u.cksums = (struct sel_pool_c_cksums){
			l->pub.id, l->nonce, SEL_POOL_OK, l->pub.n_pages, (uint64_t *)page_cksum,
			row_cksum};
		pc_submit(c, &m, true);
	}
	c->st.exports_done++;
	pc_lease_end(c, l);
	return 0;
}

int sel_pool_progress(sel_pool_client *c, struct sel_pool_lease *pub, uint32_t windows_done)
{
	struct lease *l = (struct lease *)pub;
	if (!pub || l->committed || pc_lease_find(c, pub->id) != l)
		return eos_fail(-EINVAL, "pool progress: not a live lease");
	if (!same_session(c, l))
		return eos_fail(-ENOTCONN, "pool progress: the lease's session is gone");
	struct sel_pool_msg m = {.type = SEL_POOL_C_PROGRESS};
	m.u.progress = (struct sel_pool_c_progress){l->pub.id, l->nonce, windows_done};
	return pc_submit(c, &m, false);
}

int sel_pool_release(sel_pool_client *c, struct sel_pool_lease *pub, uint32_t status)
{
	struct lease *l = (struct lease *)pub;
	if (!pub || l->committed || pc_lease_find(c, pub->id) != l || status >= SEL_POOL_REASONS)
		return eos_fail(-EINVAL, "pool release: not a live lease");
	if (same_session(c, l)) {
		if (l->pub.kind == SEL_POOL_EXPORT) {
			struct sel_pool_msg m = {.type = SEL_POOL_C_EXPORT_DONE};
			m.u.cksums = (struct sel_pool_c_cksums){
				l->pub.id, l->nonce, status ? status : SEL_POOL_COPY_FAILED,
				0,         NULL,     0};
			pc_submit(c, &m, true);
		} else {
			uint32_t s = l->pub.kind == SEL_POOL_PUT && !status ? SEL_POOL_CANCELLED
									    : status;
			pc_send_ls(c, SEL_POOL_C_RELEASE, l->pub.id, l->nonce, s);
		}
	}
	pc_lease_end(c, l);
	return 0;
}

bool sel_pool_lease_matches(const struct sel_pool_lease *l, const sel_history *h, uint64_t resident)
{
	if (l->kind != SEL_POOL_CLAIM || !l->n_nodes)
		return false;
	uint32_t pt = l->page_tokens;
	if (l->base != resident / pt * pt || !sel_key_eq(&l->nodes[l->n_nodes - 1].key, &l->key))
		return false;
	uint64_t len = sel_history_len(h), prev = 0;
	for (uint32_t i = 0; i < l->n_nodes; i++) {
		uint64_t cc = l->nodes[i].key.consumed;
		if (cc > len || cc <= prev || cc <= resident)
			return false;
		sel_key k;
		sel_history_key_at(h, cc, &k);
		if (!sel_key_eq(&k, &l->nodes[i].key))
			return false;
		prev = cc;
	}
	return true;
}

/* ---- verification and checksums (copier threads) ---------------------------------------------------- */

static uint64_t row_checksum(const sel_pool_client *c, const struct sel_pool_lease *l, bool *ok)
{
	uint32_t cap = l->n_row_slots * c->lay.ranks;
	struct iovec small[64], *iov = cap <= 64 ? small : malloc(cap * sizeof *iov);
	void *sm[64], **slots = l->n_row_slots <= 64 ? sm : malloc(l->n_row_slots * sizeof *slots);
	uint64_t v = 0;
	*ok = false;
	if (iov && slots) {
		for (uint32_t k = 0; k < l->n_row_slots; k++)
			slots[k] = sel_pool_slot_addr(c, l->row_slots[k]);
		int n = sel_record_row_iov(&c->rl, 0, slots, l->n_row_slots, iov, cap);
		if (n >= 0) {
			v = sel_record_row_checksum(iov, (uint32_t)n);
			*ok = true;
		}
	}
	if (iov != small)
		free(iov);
	if (slots != sm)
		free(slots);
	return v;
}

int sel_pool_lease_verify(const sel_pool_client *c, const struct sel_pool_lease *l)
{
	return sel_pool_lease_verify_part(c, l, 0, l->n_pages, true);
}

int sel_pool_lease_verify_part(const sel_pool_client *c, const struct sel_pool_lease *l,
			       uint32_t first, uint32_t n, bool row)
{
	if (l->kind != SEL_POOL_CLAIM || !l->page_cksum)
		return eos_fail(-EINVAL, "pool verify: not a claim lease");
	if (first > l->n_pages || n > l->n_pages - first)
		return eos_fail(-EINVAL, "pool verify: pages %u..%u of a lease of %u", first,
				first + n, l->n_pages);
	for (uint32_t i = first; i < first + n; i++) {
		uint64_t got =
			XXH3_64bits(sel_pool_slot_addr(c, l->page_slots[i]), c->lay.slot_bytes);
		if (got != l->page_cksum[i])
			return eos_fail(SEL_ECORRUPT,
					"pool claim %" PRIu64 ": page %u (arena slot %u) fails "
					"its checksum (%016" PRIx64 ", expected %016" PRIx64 ")",
					l->id, i, l->page_slots[i], got, l->page_cksum[i]);
	}
	if (row && l->n_row_slots) {
		bool ok;
		uint64_t got = row_checksum(c, l, &ok);
		if (!ok)
			return eos_fail(-ENOMEM, "pool verify: out of memory for the row");
		if (got != l->row_cksum)
			return eos_fail(SEL_ECORRUPT,
					"pool claim %" PRIu64 ": the row fails its checksum "
					"(%016" PRIx64 ", expected %016" PRIx64 ")",
					l->id, got, l->row_cksum);
	}
	return 0;
}

void sel_pool_lease_checksums(const sel_pool_client *c, const struct sel_pool_lease *l,
			      uint64_t *page_cksum, uint64_t *row_cksum)
{
	for (uint32_t i = 0; i < l->n_pages; i++)
		page_cksum[i] =
			XXH3_64bits(sel_pool_slot_addr(c, l->page_slots[i]), c->lay.slot_bytes);
	bool ok;
	*row_cksum = l->n_row_slots ? row_checksum(c, l, &ok) : 0;
}

/* ---- poll: applying what the manager sent ---------------------------------------------------------- */
