/*
 * remote_lookup.c - the remote client's lookups: the deepest record on
 * Redis whose whole chain matches the request's history (issue 16; design
 * 2.3 on Redis; 2.15 the grace period; remote_client.c DESIGN "Lookup").
 *
 * DESIGN
 *
 * One SMEMBERS per aligned boundary from the limit down to the resident
 * count, pipelined; members whose key is the history's key at their length
 * (one hash of at most 63 tokens per distinct length) are candidates; their
 * manifests are read in one pipeline; the deepest whose chain checks out
 * wins: every node's key equals the history's key at its length, the chain
 * stops at a parent at or below the resident count or at a record holding
 * its full chain, and EXISTS finds every window the restore needs.  A
 * candidate that fails any of this gives way to the next.
 *
 * INVARIANTS
 *   1. A hit names only manifests that decoded and verified, and a chain
 *      every node of which was compared with the history.
 */
#include "remote_client_int.h"

/* ---- Lookup -------------------------------------------------------------- */

static void lk_key_at(const struct op *o, uint64_t c, sel_key *out)
{
	uint64_t k = c / SEL_BUCKET_TOKENS;
	sel_key_from_bound(&o->u.l.bounds[k - o->u.l.k_lo],
			   o->u.l.tok + (k - o->u.l.k_lo) * SEL_BUCKET_TOKENS, c, out);
}

/* Whether the history covers c for key checks. */
static bool lk_covers(const struct op *o, uint64_t c)
{
	return c > o->u.l.a && c <= o->u.l.lim && c / SEL_BUCKET_TOKENS >= o->u.l.k_lo;
}

static int lk_find(const struct op *o, const sel_key *k)
{
	for (uint32_t i = 0; i < o->u.l.n_cand; i++)
		if (sel_key_eq(&o->u.l.cand[i].key, k))
			return (int)i;
	return -1;
}

static void lk_bucket(struct op *o, uint64_t k, const redisReply *rep)
{
	if (rep->type != REDIS_REPLY_ARRAY)
		return;
	/* One hash per distinct length in the bucket: at most 64. */
	bool tried[SEL_BUCKET_TOKENS] = {false};
	sel_key want[SEL_BUCKET_TOKENS];
	size_t n = rep->elements < MEMBERS_MAX ? rep->elements : MEMBERS_MAX;
	for (size_t i = 0; i < n; i++) {
		const redisReply *e = rep->element[i];
		sel_key key;
		if (!e || e->type != REDIS_REPLY_STRING ||
		    sel_rv_member_parse(e->str, e->len, &key))
			continue;
		uint64_t c = key.consumed;
		if (c / SEL_BUCKET_TOKENS != k || !lk_covers(o, c))
			continue;
		uint32_t j = (uint32_t)(c % SEL_BUCKET_TOKENS);
		if (!tried[j]) {
			lk_key_at(o, c, &want[j]);
			tried[j] = true;
		}
		if (!sel_key_eq(&want[j], &key) || lk_find(o, &key) >= 0 ||
		    o->u.l.n_cand >= CANDIDATES_MAX + CHAIN_MAX)
			continue;
		struct cand *cd = &o->u.l.cand[o->u.l.n_cand++];
		memset(cd, 0, sizeof *cd);
		cd->key = key;
		cd->from_bucket = true;
	}
}

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return x->key.consumed < y->key.consumed ? 1 : x->key.consumed > y->key.consumed ? -1 : 0;
}

static int lk_get_manifest(struct op *o, uint32_t i)
{
	char key[SEL_RV_NAME_MAX];
	int kl = sel_rv_manifest_name(&o->r->names, &o->u.l.cand[i].key, key);
	const char *argv[] = {"GET", key};
	size_t lens[] = {3, (size_t)kl};
	o->u.l.pending++;
	return rmt_issue_argv(o, i, rmt_slot_of(key, kl), SEL_RN_FAST, true, 2, argv, lens);
}

static void lk_manifest(struct op *o, uint32_t i, redisReply *rep)
{
	struct sel_remote *r = o->r;
	struct cand *cd = &o->u.l.cand[i];
	cd->fetched = true;
	if (rep->type != REDIS_REPLY_STRING)
		return; /* nil: expired or evicted; anything else: not ours */
	cd->val = malloc(rep->len ? rep->len : 1);
	if (!cd->val)
		return;
	memcpy(cd->val, rep->str, rep->len);
	struct sel_rv_hdr want, got;
	uint8_t *payload;
	rmt_value_want(r, SEL_RV_KIND_MANIFEST, &cd->key, SEL_RV_MANIFEST_WINDOW, 0, &want);
	int rc = sel_rv_decode(&r->keys, &want, cd->val, rep->len, &got, &payload);
	if (!rc)
		rc = sel_rv_manifest_decode(r->ns, &cd->key, payload, got.payload, &cd->m);
	if (rc) {
		rmt_refused(r, rc, &cd->key);
		return;
	}
	cd->generation = got.generation;
	cd->good = true;
}

static void lk_finish_miss(struct op *o, int err)
{
	rmt_finish(o, err ? SEL_REMOTE_FAILED : SEL_REMOTE_MISS, err, NULL, 0);
}

static void lk_evaluate(struct op *o);
static void lk_hit(struct op *o);

/* Of record m's stored pages, those below resident (the GPU holds them). */
static uint32_t skip_at(uint32_t pt, const struct sel_rv_manifest *m, uint64_t resident)
{
	uint64_t first = m->h.d.key.consumed / pt - m->h.d.tail; /* global page of its first */
	uint64_t need = resident / pt;
	return need > first ? (uint32_t)(need - first) : 0;
}

/* Page geometry of chain node j (ascending chain order in hit terms). */
static uint32_t node_skip(const struct op *o, const struct sel_rv_manifest *m)
{
	return skip_at(o->r->ns->layout.sz.page_tokens, m, o->u.l.a);
}

/* EXISTS of every window the chain's restore reads, one key per command
 * (pipelined): a multi-key EXISTS meets TRYAGAIN while a slot migrates,
 * one key follows ASK. */
static void lk_exists(struct op *o)
{
	struct sel_remote *r = o->r;
	o->u.l.step = L_EXISTS;
	o->u.l.pending = 0;
	o->u.l.exists_want = o->u.l.exists_got = 0;
	for (uint32_t j = 0; j < o->u.l.n_chain; j++) {
		const struct cand *cd = &o->u.l.cand[o->u.l.chain[j]];
		const struct sel_rv_layout *lay = &cd->m.layout;
		uint32_t skip = node_skip(o, &cd->m);
		uint32_t w0 = skip < lay->tail ? sel_rv_page_window(lay, skip) : lay->page_windows;
		uint32_t w1 =
			j == 0 ? lay->windows : lay->page_windows; /* chain[0]: the endpoint */
		for (uint32_t w = w0; w < w1; w++) {
			char key[SEL_RV_NAME_MAX];
			int kl = sel_rv_window_name(&r->names, &cd->key, w, key);
			const char *argv[] = {"EXISTS", key};
			size_t lens[] = {6, (size_t)kl};
			if (rmt_issue_argv(o, 0, rmt_slot_of(key, kl), SEL_RN_FAST, true, 2, argv,
					   lens)) {
				lk_finish_miss(o, -ENOMEM);
				return;
			}
			o->u.l.pending++;
			o->u.l.exists_want++;
		}
	}
	if (!o->u.l.pending)
		lk_hit(o); /* no window to check */
}

/* The skips and totals of h for resident, from its nodes' keys, tails and
 * manifests (design 2.15: the claim reads what the GPU lacks). */
static void hit_shape(const struct sel_remote *r, sel_remote_hit *h, uint64_t resident)
{
	const struct hit_priv *hp = h->priv;
	uint32_t pt = r->ns->layout.sz.page_tokens;
	h->resident = resident;
	h->pages = 0;
	h->bytes = h->wire_bytes = 0;
	for (uint32_t j = 0; j < h->n_nodes; j++) {
		struct sel_remote_node *nd = &h->node[j];
		const struct sel_rv_manifest *m = &hp->node[j].m;
		const struct sel_rv_layout *lay = &m->layout;
		nd->skip = skip_at(pt, m, resident);
		if (nd->skip > nd->tail)
			nd->skip = nd->tail;
		h->pages += nd->tail - nd->skip;
		h->bytes += (uint64_t)(nd->tail - nd->skip) * nd->stride;
		uint32_t w0 = nd->skip < lay->tail ? sel_rv_page_window(lay, nd->skip)
						   : lay->page_windows;
		uint32_t w1 = j == h->n_nodes - 1 ? lay->windows : lay->page_windows;
		for (uint32_t w = w0; w < w1; w++) {
			struct sel_rv_extent e;
			sel_rv_extent(lay, w, &e);
			h->wire_bytes += sel_rv_value_bytes(&r->keys, e.len);
		}
		if (j == h->n_nodes - 1) {
			h->key = nd->key;
			h->flags = nd->flags;
			h->row_bytes = m->row_bytes;
			h->bytes += m->row_bytes;
		}
	}
}

static void lk_hit(struct op *o)
{
	struct sel_remote *r = o->r;
	uint32_t n = o->u.l.n_chain;
	sel_remote_hit *h = calloc(1, sizeof *h);
	struct hit_priv *hp = calloc(1, sizeof *hp + n * sizeof(struct hnode));
	struct sel_remote_node *nodes = calloc(n, sizeof *nodes);
	if (!h || !hp || !nodes) {
		free(h);
		free(hp);
		free(nodes);
		lk_finish_miss(o, -ENOMEM);
		return;
	}
	h->n_nodes = n;
	h->node = nodes;
	h->priv = hp;
	hp->n = n;
	for (uint32_t j = 0; j < n; j++) {
		/* chain[] runs from the endpoint down; the hit ascends. */
		struct cand *cd = &o->u.l.cand[o->u.l.chain[n - 1 - j]];
		struct sel_remote_node *nd = &nodes[j];
		struct hnode *hn = &hp->node[j];
		hn->m = cd->m;
		hn->val = cd->val; /* the hit owns the manifest now */
		cd->val = NULL;
		hn->generation = cd->generation;
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_manifest_name(&r->names, &cd->key, key);
		hn->slot = rmt_slot_of(key, kl);
		nd->key = cd->key;
		nd->flags = cd->m.h.d.flags;
		nd->tail = cd->m.h.d.tail;
		nd->stride = cd->m.h.span.page_stride;
	}
	hit_shape(r, h, o->u.l.a);
	rmt_finish(o, SEL_REMOTE_HIT, 0, h, 0);
}

/* Try candidates from o->u.l.at: build the chain of the first good one,
 * fetching a parent manifest it lacks (the reply resumes here, at the same
 * candidate), then check its windows (lk_reply moves on to the next
 * candidate when one is missing). */
static void lk_evaluate(struct op *o)
{
	uint32_t pt = o->r->ns->layout.sz.page_tokens;
	o->u.l.step = L_MANIFESTS;
	for (; o->u.l.at < o->u.l.n_cand; o->u.l.at++) {
		struct cand *end = &o->u.l.cand[o->u.l.at];
		if (!end->from_bucket || !end->fetched || !end->good || !end->m.has_row)
			continue; /* parents fetched for a chain are not endpoints */
		o->u.l.n_chain = 0;
		uint32_t cur = o->u.l.at;
		bool ok = true;
		for (;;) {
			struct cand *cd = &o->u.l.cand[cur];
			if (o->u.l.n_chain == CHAIN_MAX) {
				ok = false;
				break;
			}
			o->u.l.chain[o->u.l.n_chain++] = cur;
			const sel_record_desc *d = &cd->m.h.d;
			if (!sel_record_links_parent(d, pt) || d->parent.consumed <= o->u.l.a)
				break; /* complete: a full chain, or the GPU holds the rest */
			/* Design 2.3: every node's key must be the history's key at
			 * its length, or the chain is another conversation's. */
			sel_key want;
			if (!lk_covers(o, d->parent.consumed)) {
				ok = false;
				break;
			}
			lk_key_at(o, d->parent.consumed, &want);
			if (!sel_key_eq(&want, &d->parent)) {
				ok = false;
				break;
			}
			int pi = lk_find(o, &d->parent);
			if (pi < 0) {
				if (o->u.l.n_cand >= CANDIDATES_MAX + CHAIN_MAX) {
					ok = false;
					break;
				}
				pi = (int)o->u.l.n_cand++;
				memset(&o->u.l.cand[pi], 0, sizeof o->u.l.cand[pi]);
				o->u.l.cand[pi].key = d->parent;
			}
			struct cand *pc = &o->u.l.cand[pi];
			if (!pc->fetched) {
				o->u.l.step = L_CHAIN;
				o->u.l.pending = 0;
				if (lk_get_manifest(o, (uint32_t)pi))
					lk_finish_miss(o, -ENOMEM);
				return;
			}
			if (!pc->good) {
				ok = false;
				break;
			}
			cur = (uint32_t)pi;
		}
		if (ok) {
			lk_exists(o);
			return;
		}
	}
	lk_finish_miss(o, 0);
}

/* A read that failed (a node down, an error reply) is a read that found
 * nothing: the lookup goes on with what the other nodes answered, so one
 * master down in a cluster costs only the records (and buckets) it holds.
 * The lookup fails only when no bucket read was answered at all. */
void rmt_lk_reply(struct op *o, uint64_t tag, redisReply *rep, int err)
{
	if (!err && rep->type == REDIS_REPLY_ERROR)
		err = rmt_reply_error(o->r, rep, "remote lookup");
	if (err && !o->u.l.err)
		o->u.l.err = err;
	static const redisReply nil = {.type = REDIS_REPLY_NIL};
	if (err)
		rep = (redisReply *)&nil;
	switch (o->u.l.step) {
	case L_BUCKETS:
		if (!err)
			o->u.l.answered++;
		lk_bucket(o, tag, rep);
		if (--o->u.l.pending)
			return;
		if (!o->u.l.answered) {
			lk_finish_miss(o, o->u.l.err); /* nothing answered: a failure */
			return;
		}
		qsort(o->u.l.cand, o->u.l.n_cand, sizeof *o->u.l.cand, cand_cmp);
		if (o->u.l.n_cand > CANDIDATES_MAX)
			o->u.l.n_cand = CANDIDATES_MAX;
		if (!o->u.l.n_cand) {
			lk_finish_miss(o, 0);
			return;
		}
		o->u.l.step = L_MANIFESTS;
		for (uint32_t i = 0; i < o->u.l.n_cand; i++)
			if (lk_get_manifest(o, i)) {
				lk_finish_miss(o, -ENOMEM);
				return;
			}
		return;
	case L_MANIFESTS:
	case L_CHAIN:
		lk_manifest(o, (uint32_t)tag, rep);
		if (--o->u.l.pending)
			return;
		lk_evaluate(o);
		return;
	case L_EXISTS:
		if (rep->type == REDIS_REPLY_INTEGER && rep->integer > 0)
			o->u.l.exists_got += (uint64_t)rep->integer;
		if (--o->u.l.pending)
			return;
		if (o->u.l.exists_got == o->u.l.exists_want) {
			lk_hit(o);
			return;
		}
		o->u.l.at++; /* a window is gone (or unreachable): a miss, never partial */
		lk_evaluate(o);
		return;
	}
}

void rmt_lk_start(struct op *o)
{
	struct sel_remote *r = o->r;
	o->started = true;
	o->start_ns = eos_now_ns();
	o->deadline_ns = o->submit_ns + r->cfg.lookup_timeout_ns;
	ol_push(&r->active, o);
	o->u.l.step = L_BUCKETS;
	for (uint64_t k = o->u.l.k_hi + 1; k-- > o->u.l.k_lo;) {
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_bucket_name(&r->names, &o->u.l.bounds[k - o->u.l.k_lo], key);
		const char *argv[] = {"SMEMBERS", key};
		size_t lens[] = {8, (size_t)kl};
		if (rmt_issue_argv(o, k, rmt_slot_of(key, kl), SEL_RN_FAST, true, 2, argv, lens)) {
			lk_finish_miss(o, -ENOMEM);
			return;
		}
		o->u.l.pending++;
	}
}

int sel_remote_lookup(sel_remote *r, const sel_history *h, uint64_t resident, uint64_t limit,
		      uint64_t user, uint64_t *id)
{
	if (limit > sel_history_len(h) || resident >= limit)
		return eos_fail(-EINVAL,
				"remote lookup: resident %llu and limit %llu for a history "
				"of %llu tokens",
				(unsigned long long)resident, (unsigned long long)limit,
				(unsigned long long)sel_history_len(h));
	struct op *o = calloc(1, sizeof *o);
	if (!o)
		return eos_fail(-ENOMEM, "remote lookup: out of memory");
	o->kind = SEL_REMOTE_OP_LOOKUP;
	o->r = r;
	o->refs = 1;
	o->user = user;
	o->u.l.a = resident;
	o->u.l.lim = limit;
	o->u.l.k_hi = limit / SEL_BUCKET_TOKENS;
	o->u.l.k_lo = resident / SEL_BUCKET_TOKENS;
	if (o->u.l.k_hi - o->u.l.k_lo + 1 > r->cfg.max_buckets)
		o->u.l.k_lo = o->u.l.k_hi + 1 - r->cfg.max_buckets;
	uint64_t nb = o->u.l.k_hi - o->u.l.k_lo + 1, nt = limit - o->u.l.k_lo * SEL_BUCKET_TOKENS;
	o->u.l.bounds = malloc(nb * sizeof *o->u.l.bounds);
	o->u.l.tok = malloc((nt ? nt : 1) * sizeof *o->u.l.tok);
	o->u.l.cand = calloc(CANDIDATES_MAX + CHAIN_MAX, sizeof *o->u.l.cand);
	if (!o->u.l.bounds || !o->u.l.tok || !o->u.l.cand) {
		rmt_op_free(o);
		return eos_fail(-ENOMEM, "remote lookup: out of memory");
	}
	/* The new tokens and their boundaries: what every key check needs. */
	for (uint64_t k = o->u.l.k_lo; k <= o->u.l.k_hi; k++)
		o->u.l.bounds[k - o->u.l.k_lo] = *sel_history_bound(h, k);
	memcpy(o->u.l.tok, h->tokens + o->u.l.k_lo * SEL_BUCKET_TOKENS, nt * sizeof *o->u.l.tok);
	return rmt_submit(r, o, id);
}

void sel_remote_hit_free(sel_remote_hit *h)
{
	if (!h)
		return;
	struct hit_priv *hp = h->priv;
	if (hp) {
		for (uint32_t i = 0; i < hp->n; i++)
			free(hp->node[i].val);
		free(hp->below);
	}
	free(hp);
	free(h->node);
	free(h);
}

/* ---- Rebase (issue 18) --------------------------------------------------- */

/* The checksums of the pages [hit->resident / P, resident / P) from hit's
 * manifests into d's below: the longest run ending at resident / P whose
 * records can give them (version 4, pages per rank). */
static int rebase_below(uint32_t pt, const sel_remote_hit *hit, uint64_t resident,
			struct hit_priv *d)
{
	const struct hit_priv *hp = hit->priv;
	uint64_t lo = hit->resident / pt, hi = resident / pt;
	if (hi <= lo)
		return 0;
	if (!(d->below = calloc(hi - lo, sizeof *d->below)))
		return -ENOMEM;
	uint64_t run = lo; /* pages [run, g) have their checksums */
	for (uint64_t g = lo; g < hi; g++) {
		bool ok = false;
		for (uint32_t j = 0; j < hp->n && !ok; j++) {
			const struct sel_rv_manifest *m = &hp->node[j].m;
			uint64_t first = m->h.d.key.consumed / pt - m->h.d.tail;
			if (g < first || g >= first + m->h.d.tail)
				continue;
			ok = m->h.version >= SEL_RECORD_VERSION_ZERO_PAD &&
			     !(hit->node[j].flags & SEL_RECORD_PAGES_REPLICATED);
			if (ok)
				d->below[g - lo] = sel_get_u64(m->cksum + 8 * (g - first));
		}
		if (!ok)
			run = g + 1;
	}
	d->n_below = (uint32_t)(hi - run);
	memmove(d->below, d->below + (run - lo), d->n_below * sizeof *d->below);
	return 0;
}

int sel_remote_hit_rebase(const sel_remote *r, const sel_remote_hit *hit, uint64_t resident,
			  sel_remote_hit **out)
{
	*out = NULL;
	const struct hit_priv *hp = hit ? hit->priv : NULL;
	if (!hp || resident < hit->resident || resident >= hit->key.consumed)
		return eos_fail(-EINVAL, "remote rebase: resident %llu for a hit in (%llu, %llu]",
				(unsigned long long)resident,
				hit ? (unsigned long long)hit->resident : 0ull,
				hit ? (unsigned long long)hit->key.consumed : 0ull);
	uint32_t j0 = 0; /* the nodes the GPU holds whole at resident go */
	while (j0 < hit->n_nodes && hit->node[j0].key.consumed <= resident)
		j0++;
	uint32_t n = hit->n_nodes - j0;
	sel_remote_hit *h = calloc(1, sizeof *h);
	struct hit_priv *d = calloc(1, sizeof *d + n * sizeof(struct hnode));
	struct sel_remote_node *nodes = calloc(n, sizeof *nodes);
	if (h) {
		h->priv = d;
		h->node = nodes;
	}
	if (!h || !d || !nodes)
		goto nomem;
	h->n_nodes = n;
	for (uint32_t j = 0; j < n; j++) {
		const struct hnode *s = &hp->node[j0 + j];
		uint32_t tail = s->m.h.d.tail;
		nodes[j] = hit->node[j0 + j];
		d->node[j] = *s;
		d->node[j].val = malloc(tail ? 8ull * tail : 1);
		if (!d->node[j].val)
			goto nomem;
		d->n = j + 1;
		memcpy(d->node[j].val, s->m.cksum, 8ull * tail); /* all m points at */
		d->node[j].m.cksum = d->node[j].val;
	}
	uint32_t pt = r->ns->layout.sz.page_tokens;
	if (rebase_below(pt, hit, resident, d))
		goto nomem;
	hit_shape(r, h, resident);
	*out = h;
	return 0;
nomem:
	if (h)
		sel_remote_hit_free(h);
	else {
		free(d);
		free(nodes);
	}
	return eos_fail(-ENOMEM, "remote rebase: out of memory");
}
