/*
 * test_index_model.c - the index against a brute-force reference (design
 * 2.3).
 *
 * Random operations -- insert with random parents (present, absent, none or
 * invalid) and tails, commit, pin, unpin, touch, evict, remove, drop_row,
 * set_evictable, prune and lookup -- run on the index and on an independent
 * reference model: a plain array of records with parent links, flags and a
 * use counter, whose lookup is a linear scan for the deepest qualifying and
 * feasible endpoint, and whose prefix relation is decided by comparing
 * tokens, not digests.  After every step the two must agree on return
 * codes, store callbacks, every node's fields, the access order and lookup
 * answers (endpoint, chain, base, pages, skip), and sel_index_check() must
 * pass.  Token sequences share prefixes (forks inside and on bucket
 * boundaries, a one-token difference, a salted copy) so lookups hit, miss
 * on keys inside a shared bucket, and stop at resident ancestors.
 *
 * Replay a failure with the printed TEST_SEED; TEST_OPS overrides the
 * number of operations.
 */
#include "testutil.h"

#include "index.h"

enum {
	NSEQ = 7,
	SEQLEN = 1600,
	MAXID = 8192,
	MAXEV = 4096
};

static uint8_t model_id[SEL_IDENTITY_BYTES];
static sel_token seq[NSEQ][SEQLEN];
static int salt_of[NSEQ];        /* 0 unsalted, 1 salted */
static uint64_t lcp[NSEQ][NSEQ]; /* common prefix, by token comparison */
static sel_history hist[NSEQ];   /* full-length histories */
static test_rng rng;

static uint64_t rnd(uint64_t n) { return test_rng_below(&rng, n); }
static bool chance(unsigned pct) { return rnd(100) < pct; }

/* ---- reference model --------------------------------------------------- */

struct rec {
	bool live, ready, row, drop, noevict, unpruned;
	int seq;
	uint64_t c;
	int parent; /* id or -1 */
	uint32_t children, tail, pins;
	uint64_t used; /* access counter */
};

static struct rec R[MAXID];
static uint64_t R_clock;
static int R_hi; /* ids below this were ever used */

/* What the run exercised, so a weakened generator shows. */
static struct {
	uint64_t hits, misses, chain_nodes, skipped, based, ins[5], evict[3], deferred, cascades,
		pruned, max_nodes;
} st;
static uint32_t pt;

/* Store callbacks, as the index made them and as the model expects them:
 * 'd' drop_row, 'r' remove. */
struct ev {
	char kind;
	sel_node_id id;
};
static struct ev got[MAXEV], want[MAXEV];
static int ngot, nwant;

static bool same_prefix(int s, int t, uint64_t c) { return lcp[s][t] >= c; }

static int ref_find(int s, uint64_t c)
{
	for (int i = 0; i < R_hi; i++)
		if (R[i].live && R[i].c == c && same_prefix(R[i].seq, s, c))
			return i;
	return -1;
}

static int ref_count(void)
{
	int n = 0;
	for (int i = 0; i < R_hi; i++)
		n += R[i].live;
	return n;
}

static void ref_touch(int id)
{
	for (; id >= 0; id = R[id].parent)
		R[id].used = ++R_clock;
}

static bool ref_useless(const struct rec *r)
{
	return r->children == 0 && !r->row && r->pins == 0 && !r->noevict && !r->unpruned;
}

static void expect_ev(char kind, int id)
{
	CHECK(nwant < MAXEV);
	want[nwant++] = (struct ev){kind, (sel_node_id)id};
}

static int ref_remove_cascade(int id, bool prune)
{
	int n = 0;
	while (id >= 0) {
		expect_ev('r', id);
		if (n++)
			st.cascades++;
		int p = R[id].parent;
		R[id].live = false;
		if (p < 0)
			break;
		struct rec *q = &R[p];
		q->children--;
		bool go = prune ? q->children == 0 && !q->row && q->pins == 0 : ref_useless(q);
		id = go ? p : -1;
	}
	return n;
}

static void ref_drop_row(int id)
{
	expect_ev('d', id);
	R[id].row = false;
	R[id].drop = false;
}

/* ---- the index under test ---------------------------------------------- */

static sel_index *ix;

static void cb_drop_row(void *ctx, sel_index *x, sel_node_id id)
{
	(void)ctx;
	CHECK(sel_index_cget(x, id) && ngot < MAXEV);
	got[ngot++] = (struct ev){'d', id};
}

static void cb_remove(void *ctx, sel_index *x, sel_node_id id)
{
	(void)ctx;
	CHECK(sel_index_cget(x, id) && ngot < MAXEV);
	got[ngot++] = (struct ev){'r', id};
}

static const struct sel_index_ops ops = {.drop_row = cb_drop_row, .remove = cb_remove};

static int ev_cmp(const void *a, const void *b)
{
	const struct ev *x = a, *y = b;
	if (x->kind != y->kind)
		return x->kind - y->kind;
	return x->id < y->id ? -1 : x->id > y->id;
}

static uint64_t step;
static const char *op_name;

static void dump(void)
{
	fprintf(stderr, "step %" PRIu64 " (%s), page tokens %u, %d records\n", step, op_name, pt,
		ref_count());
}

/* Callbacks as a multiset: a prune visits nodes in an order of its own. */
static void compare_events(void)
{
	qsort(got, (size_t)ngot, sizeof *got, ev_cmp);
	qsort(want, (size_t)nwant, sizeof *want, ev_cmp);
	CHECKF(ngot == nwant, "%d callbacks, model expects %d", ngot, nwant);
	for (int i = 0; i < ngot; i++)
		CHECKF(got[i].kind == want[i].kind && got[i].id == want[i].id,
		       "callback %c %u, model expects %c %u", got[i].kind, got[i].id, want[i].kind,
		       want[i].id);
	ngot = nwant = 0;
}

static void compare_state(void)
{
	CHECK_OK(sel_index_check(ix));
	compare_events();
	uint64_t n = 0;
	for (int i = 0; i < R_hi; i++) {
		const sel_index_node *x = sel_index_cget(ix, (sel_node_id)i);
		if (!R[i].live) {
			CHECKF(!x, "node %d lives in the index only", i);
			continue;
		}
		n++;
		const struct rec *r = &R[i];
		CHECKF(x, "node %d lives in the model only", i);
		CHECK(x->key.consumed == r->c);
		CHECKF(x->parent == (r->parent < 0 ? SEL_NODE_NONE : (sel_node_id)r->parent),
		       "node %d parent %u, model %d", i, x->parent, r->parent);
		CHECKF(x->children == r->children, "node %d children %u, model %u", i, x->children,
		       r->children);
		CHECK(x->tail_pages == r->tail && x->pins == r->pins);
		CHECK(x->state == (r->ready ? SEL_NODE_READY : SEL_NODE_PENDING));
		CHECKF(!!(x->flags & SEL_NODE_HAS_ROW) == r->row, "node %d row", i);
		CHECKF(!!(x->flags & SEL_NODE_DROP_ROW) == r->drop, "node %d drop", i);
		CHECKF(!!(x->flags & SEL_NODE_NOEVICT) == r->noevict, "node %d noevict", i);
		CHECKF(!!(x->flags & SEL_NODE_UNPRUNED) == r->unpruned, "node %d unpruned", i);
	}
	CHECK(sel_index_count(ix) == n);
	/* Access order: the index's list must follow the model's counters. */
	uint64_t walked = 0, last = 0;
	for (sel_node_id id = sel_index_next_lru(ix, SEL_NODE_NONE); id != SEL_NODE_NONE;
	     id = sel_index_next_lru(ix, id)) {
		CHECK(id < MAXID && R[id].live);
		CHECKF(walked == 0 || R[id].used > last, "access order differs at node %u", id);
		last = R[id].used;
		walked++;
	}
	CHECK(walked == n);
}

static int pick_live(void)
{
	int n = ref_count();
	if (!n)
		return -1;
	int k = (int)rnd((uint64_t)n);
	for (int i = 0; i < R_hi; i++)
		if (R[i].live && k-- == 0)
			return i;
	return -1;
}

static void key_of(int s, uint64_t c, sel_key *k) { sel_history_key_at(&hist[s], c, k); }

/* ---- operations -------------------------------------------------------- */

static void op_insert(void)
{
	op_name = "insert";
	int s = (int)rnd(NSEQ);
	uint64_t c;
	int live = pick_live();
	bool extend = false;
	if (live >= 0 && chance(15)) {
		c = R[live].c; /* often the same key again: dedupe */
		s = R[live].seq;
	} else if (live >= 0 && R[live].c < SEQLEN && chance(45)) {
		/* Extend a record, on its sequence or on one forking later. */
		extend = true;
		for (int tries = 0; tries < 4; tries++) {
			s = (int)rnd(NSEQ);
			if (same_prefix(R[live].seq, s, R[live].c))
				break;
			s = R[live].seq;
		}
		c = R[live].c + 1 + rnd(300);
		if (c > SEQLEN)
			c = SEQLEN;
	} else {
		c = 1 + rnd(SEQLEN);
	}
	/* The parent: a present prefix, an arbitrary prefix (present or not),
	 * none, or not shorter. */
	int ps = s;
	int64_t pc = -1;
	unsigned how = (unsigned)rnd(100);
	if (extend && how < 80) {
		ps = R[live].seq;
		pc = (int64_t)R[live].c;
	} else if (how < 50) {
		int cand[MAXID], nc = 0;
		for (int i = 0; i < R_hi; i++)
			if (R[i].live && R[i].c < c && same_prefix(R[i].seq, s, R[i].c))
				cand[nc++] = i;
		if (nc) {
			int p = cand[rnd((uint64_t)nc)];
			ps = R[p].seq;
			pc = (int64_t)R[p].c;
		}
	} else if (how < 80) {
		if (c > 1)
			pc = (int64_t)(1 + rnd(c - 1));
	} else if (how < 85) {
		pc = (int64_t)(c + rnd(SEQLEN - c + 1)); /* invalid: not shorter */
	}
	uint32_t full = (uint32_t)(c / pt);
	uint32_t derived = pc >= 0 ? (uint32_t)(c / pt - (uint64_t)pc / pt) : full;
	uint32_t tail;
	unsigned tw = (unsigned)rnd(100);
	if (tw < 55)
		tail = SEL_TAIL_AUTO;
	else if (tw < 72)
		tail = derived;
	else if (tw < 87)
		tail = full;
	else
		tail = (uint32_t)rnd(30);
	bool row = chance(85);

	/* The model's answer. */
	int want_rc = 0, want_id = -1, pid = -1;
	uint32_t t = 0;
	int have = ref_find(s, c);
	if (have >= 0) {
		want_rc = -EEXIST;
		want_id = have;
	} else if (pc >= 0 && (uint64_t)pc >= c) {
		want_rc = -EINVAL;
	} else {
		pid = pc >= 0 ? ref_find(ps, (uint64_t)pc) : -1;
		if (pid >= 0) {
			if (tail == SEL_TAIL_AUTO || tail == derived) {
				t = derived;
			} else if (tail == full) {
				t = full;
				pid = -1;
			} else {
				want_rc = -EINVAL;
			}
		} else if (tail == SEL_TAIL_AUTO || tail == full) {
			t = full;
		} else {
			want_rc = -ENOENT;
		}
	}

	sel_key k, pk;
	key_of(s, c, &k);
	if (pc >= 0)
		key_of(ps, (uint64_t)pc, &pk);
	sel_node_id id = 12345;
	int rc = sel_index_insert(ix, &k, pc >= 0 ? &pk : NULL, sel_history_bound(&hist[s], c / 64),
				  tail, row, &id);
	CHECKF(rc == want_rc, "insert returned %d (%s), model %d", rc, sel_errmsg(), want_rc);
	st.ins[rc == 0 ? 0 : rc == -EEXIST ? 1 : rc == -EINVAL ? 2 : rc == -ENOENT ? 3 : 4]++;
	if (rc == -EEXIST) {
		CHECK(id == (sel_node_id)want_id);
		return;
	}
	if (rc) {
		CHECK(id == SEL_NODE_NONE);
		return;
	}
	CHECKF(id < MAXID && !R[id].live, "insert gave id %u", id);
	if ((int)id >= R_hi)
		R_hi = (int)id + 1;
	R[id] = (struct rec){.live = true,
			     .row = row,
			     .unpruned = !row,
			     .seq = s,
			     .c = c,
			     .parent = pid,
			     .tail = t};
	if (pid >= 0) {
		R[pid].children++;
		R[pid].unpruned = false;
	}
	ref_touch((int)id);
}

static void op_commit(void)
{
	op_name = "commit";
	int id = pick_live();
	for (int tries = 0; id >= 0 && R[id].ready && tries < 3; tries++)
		id = pick_live(); /* prefer pending nodes */
	if (id < 0)
		return;
	R[id].ready = true;
	int p = R[id].parent;
	if (p >= 0 && R[p].parent >= 0 && R[p].row && R[p].children == 1) {
		if (R[p].pins) {
			R[p].drop = true;
			st.deferred++;
		} else
			ref_drop_row(p);
	}
	sel_index_commit(ix, (sel_node_id)id);
}

static void op_pin(void)
{
	op_name = "pin";
	int id = pick_live();
	if (id < 0 || R[id].pins >= 3)
		return;
	R[id].pins++;
	sel_index_pin(ix, (sel_node_id)id);
}

static void op_unpin(void)
{
	op_name = "unpin";
	int cand[MAXID], n = 0;
	for (int i = 0; i < R_hi; i++)
		if (R[i].live && R[i].pins)
			cand[n++] = i;
	if (!n)
		return;
	int id = cand[rnd((uint64_t)n)];
	struct rec *r = &R[id];
	if (--r->pins == 0) {
		if (r->drop) {
			r->drop = false;
			if (r->children && r->row)
				ref_drop_row(id);
		}
		if (ref_useless(r))
			ref_remove_cascade(id, false);
	}
	sel_index_unpin(ix, (sel_node_id)id);
}

/* Pin every leaf: the next evictions must compact. */
static void op_pin_leaves(void)
{
	op_name = "pin_leaves";
	for (int i = 0; i < R_hi; i++)
		if (R[i].live && R[i].children == 0 && R[i].pins < 3) {
			R[i].pins++;
			sel_index_pin(ix, (sel_node_id)i);
		}
}

static void op_touch(void)
{
	op_name = "touch";
	int id = pick_live();
	if (id < 0)
		return;
	ref_touch(id);
	sel_index_touch(ix, (sel_node_id)id);
}

static void op_evict(void)
{
	op_name = "evict";
	int leaf = -1, comp = -1;
	for (int i = 0; i < R_hi; i++) {
		const struct rec *r = &R[i];
		if (!r->live || r->pins || r->noevict)
			continue;
		if (r->children == 0 && (leaf < 0 || r->used < R[leaf].used))
			leaf = i;
		if (r->children == 1 && r->row && (comp < 0 || r->used < R[comp].used))
			comp = i;
	}
	int want_rc = 0, want_v = -1;
	if (leaf >= 0) {
		want_rc = 1;
		want_v = leaf;
		ref_remove_cascade(leaf, false);
	} else if (comp >= 0) {
		want_rc = 2;
		want_v = comp;
		ref_drop_row(comp);
	}
	sel_node_id v = 777;
	int rc = sel_index_evict(ix, &v);
	st.evict[rc >= 0 && rc <= 2 ? rc : 0]++;
	CHECKF(rc == want_rc, "evict returned %d, model %d", rc, want_rc);
	CHECKF(v == (want_v < 0 ? SEL_NODE_NONE : (sel_node_id)want_v), "evicted %u, model %d", v,
	       want_v);
}

static void op_remove(void)
{
	op_name = "remove";
	int id = pick_live();
	if (id < 0)
		return;
	int want_rc = 0;
	if (R[id].children || R[id].pins)
		want_rc = -EBUSY;
	else
		ref_remove_cascade(id, false);
	CHECK_RC(sel_index_remove(ix, (sel_node_id)id), want_rc);
}

static void op_drop_row(void)
{
	op_name = "drop_row";
	int id = pick_live();
	if (id < 0)
		return;
	int want_rc = 0;
	if (R[id].pins)
		want_rc = -EBUSY;
	else if (!R[id].row)
		want_rc = -ENOENT;
	else if (R[id].children == 0)
		ref_remove_cascade(id, false);
	else
		ref_drop_row(id);
	CHECK_RC(sel_index_drop_row(ix, (sel_node_id)id), want_rc);
}

static void op_set_evictable(void)
{
	op_name = "set_evictable";
	int id = pick_live();
	if (id < 0)
		return;
	bool ev = chance(65);
	R[id].noevict = !ev;
	if (ev && ref_useless(&R[id]))
		ref_remove_cascade(id, false);
	sel_index_set_evictable(ix, (sel_node_id)id, ev);
}

static void op_prune(void)
{
	op_name = "prune";
	uint64_t n = 0;
	for (int i = 0; i < R_hi; i++)
		if (R[i].live && R[i].children == 0 && !R[i].row && R[i].pins == 0)
			n += (uint64_t)ref_remove_cascade(i, true);
	for (int i = 0; i < R_hi; i++)
		R[i].unpruned = false;
	CHECK(sel_index_prune(ix) == n);
	st.pruned += n;
}

static sel_index_chain chain; /* reused across lookups, as a store would */

static void op_lookup(void)
{
	op_name = "lookup";
	int t = (int)rnd(NSEQ);
	uint64_t len;
	int some = pick_live();
	if (some >= 0 && chance(60)) {
		/* Near a record, on its sequence or one that forks from it. */
		len = R[some].c + rnd(200);
		if (len > SEQLEN)
			len = SEQLEN;
		if (chance(70))
			t = R[some].seq;
	} else {
		len = rnd(SEQLEN + 1);
	}
	uint64_t a;
	if (chance(30))
		a = 0;
	else if (chance(90))
		a = rnd(len + 1);
	else
		a = len + rnd(100);
	uint64_t limit = chance(70) ? UINT64_MAX : rnd(len + 100);

	/* The model: the deepest record with a row, ready, above a and within
	 * the bounds, whose tokens prefix the history, whose walk above a is
	 * all ready. */
	uint64_t top = len < limit ? len : limit;
	int best = -1;
	uint64_t best_base = 0;
	for (int i = 0; i < R_hi; i++) {
		const struct rec *r = &R[i];
		if (!r->live || !r->ready || !r->row || r->c <= a || r->c > top ||
		    !same_prefix(r->seq, t, r->c))
			continue;
		if (best >= 0 && r->c <= R[best].c)
			continue;
		bool ok = true;
		int q = r->parent;
		while (q >= 0 && R[q].c > a) {
			if (!R[q].ready) {
				ok = false;
				break;
			}
			q = R[q].parent;
		}
		if (ok) {
			best = i;
			best_base = q >= 0 ? R[q].c : 0;
		}
	}

	sel_history_truncate(&hist[t], len);
	int rc = sel_index_lookup(ix, &hist[t], a, limit, &chain);
	CHECK_OK(sel_history_append(&hist[t], seq[t] + len, SEQLEN - len));
	CHECKF(rc == (best >= 0),
	       "lookup(seq %d, len %" PRIu64 ", a %" PRIu64 ", limit %" PRIu64
	       ") returned %d, model %d",
	       t, len, a, limit, rc, best);
	if (best < 0) {
		CHECK(chain.n == 0);
		st.misses++;
		return;
	}
	st.hits++;
	st.chain_nodes += chain.n;
	st.skipped += chain.skip_pages > 0;
	st.based += chain.base > 0;
	/* The expected chain, ascending. */
	int ids[MAXID], n = 0;
	uint64_t pages = 0;
	for (int q = best; q >= 0 && (q == best || R[q].c > a); q = R[q].parent) {
		ids[n++] = q;
		pages += R[q].tail;
	}
	CHECKF(chain.n == (uint32_t)n, "chain of %u, model %d (endpoint %d of %" PRIu64 ")",
	       chain.n, n, best, R[best].c);
	for (int i = 0; i < n; i++)
		CHECKF(chain.ids[i] == (sel_node_id)ids[n - 1 - i], "chain[%d] = %u, model %d", i,
		       chain.ids[i], ids[n - 1 - i]);
	CHECK(chain.consumed == R[best].c && chain.base == best_base);
	CHECK(chain.pages == pages && pages == R[best].c / pt - best_base / pt);
	CHECK(chain.skip_pages == a / pt - best_base / pt);
}

/* ---- driver ------------------------------------------------------------ */

static void make_sequences(void)
{
	for (int i = 0; i < SEQLEN; i++)
		seq[0][i] = (sel_token)rnd(100000);
	/* Forks of earlier sequences: one on a bucket boundary, others inside
	 * blocks. */
	for (int s = 1; s <= 4; s++) {
		int from = (int)rnd((uint64_t)s);
		uint64_t at = s == 1 ? 64 * (1 + rnd(SEQLEN / 64 - 1)) : 1 + rnd(SEQLEN - 1);
		memcpy(seq[s], seq[from], at * sizeof(sel_token));
		for (uint64_t i = at; i < SEQLEN; i++)
			seq[s][i] = (sel_token)rnd(100000);
	}
	/* One token different, then the same tokens again. */
	memcpy(seq[5], seq[1], sizeof seq[5]);
	seq[5][rnd(SEQLEN)] ^= 0x40000;
	/* A salted copy of sequence 0. */
	memcpy(seq[6], seq[0], sizeof seq[6]);
	salt_of[6] = 1;
	for (int a = 0; a < NSEQ; a++)
		for (int b = 0; b < NSEQ; b++) {
			uint64_t n = 0;
			if (salt_of[a] == salt_of[b])
				while (n < SEQLEN && seq[a][n] == seq[b][n])
					n++;
			lcp[a][b] = n;
		}
	for (int s = 0; s < NSEQ; s++) {
		CHECK_OK(sel_history_init(&hist[s], model_id, salt_of[s] ? "tenant" : NULL,
					  salt_of[s] ? 6 : 0));
		CHECK_OK(sel_history_append(&hist[s], seq[s], SEQLEN));
	}
}

static void run(uint32_t page_tokens, uint64_t nops)
{
	pt = page_tokens;
	memset(R, 0, sizeof R);
	R_clock = 0;
	R_hi = 0;
	CHECK_OK(sel_index_create(pt, &ops, NULL, &ix));
	/* Population drifts between a few and ~250 nodes; the op mix shifts
	 * towards eviction as it grows. */
	for (uint64_t i = 0; i < nops; i++) {
		step = i;
		int n = ref_count();
		if ((uint64_t)n > st.max_nodes)
			st.max_nodes = (uint64_t)n;
		unsigned w = (unsigned)rnd(1000);
		if (w >= 763 && w < 765 && (i / 5000) % 2)
			w = 999; /* leaves pinned in alternate stretches only */
		if (n > 250 && w < 300)
			op_evict();
		else if (w < 260)
			op_insert();
		else if (w < 400)
			op_commit();
		else if (w < 470)
			op_pin();
		else if (w < 540)
			op_unpin();
		else if (w < 580)
			op_touch();
		else if (w < 650)
			op_evict();
		else if (w < 690)
			op_remove();
		else if (w < 720)
			op_drop_row();
		else if (w < 760)
			op_set_evictable();
		else if (w < 763)
			op_prune();
		else if (w < 765)
			op_pin_leaves();
		else if (w < 775)
			for (int k = 0; k < 20; k++)
				op_unpin();
		else
			op_lookup();
		compare_state();
	}
	sel_index_destroy(ix);
	ix = NULL;
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	test_fail_cb = dump;
	test_rng_fill(&rng, model_id, sizeof model_id);
	make_sequences();
#ifdef SEL_SANITIZED
	uint64_t total = 60000;
#else
	uint64_t total = 150000;
#endif
	const char *env = getenv("TEST_OPS");
	if (env && *env)
		total = strtoull(env, NULL, 0);
	static const uint32_t page_sizes[] = {64, 128, 256};
	for (int i = 0; i < 3; i++) {
		run(page_sizes[i], total / 3);
		printf("page tokens %u: %" PRIu64 " operations agree\n", page_sizes[i], total / 3);
	}
	printf("lookups: %" PRIu64 " hits (%" PRIu64 " chain nodes, %" PRIu64 " stopping above a"
	       " resident parent, %" PRIu64 " skipping pages), %" PRIu64 " misses\n",
	       st.hits, st.chain_nodes, st.based, st.skipped, st.misses);
	printf("inserts: %" PRIu64 " ok, %" PRIu64 " dedupe, %" PRIu64 " invalid, %" PRIu64
	       " orphan; evict: %" PRIu64 " leaves, %" PRIu64 " compactions, %" PRIu64 " none\n",
	       st.ins[0], st.ins[1], st.ins[2], st.ins[3], st.evict[1], st.evict[2], st.evict[0]);
	printf("deferred row drops %" PRIu64 ", cascaded removals %" PRIu64 ", pruned %" PRIu64
	       ", most nodes %" PRIu64 "\n",
	       st.deferred, st.cascades, st.pruned, st.max_nodes);
	sel_index_chain_free(&chain);
	for (int s = 0; s < NSEQ; s++)
		sel_history_free(&hist[s]);
	printf("ok\n");
	return 0;
}
