/*
 * test_index.c - the checkpoint index (design 2.3; implementation step 4
 * acceptance), each case with 64-, 128- and 256-token pages.
 *
 * Unaligned endpoints; feasibility through the resident ancestor; a chain
 * broken by a page-only node still supplying pages; pinned and non-evictable
 * nodes surviving eviction; compaction removing lookup matches but not chain
 * pages; LRU order; dedupe; root records and orphans; row drops on commit of
 * an only child (and their deferral while pinned); prune; the removal
 * cascade; lookup bounds; key mismatches inside one bucket; salts; last-use
 * stamps (ancestors refreshed, a clock stepping back), the expiry walk
 * (stop at the first fresh leaf, interior and pinned nodes passed over,
 * page-only ancestors going with their last child, the 64-leaf bound) and
 * recovered times.  Every step is followed by sel_index_check().
 */
#include "testutil.h"

#include "index.h"

enum {
	NTOK = 6000
};

static uint8_t model_id[SEL_IDENTITY_BYTES];
static sel_token toks[NTOK]; /* the conversation */
static sel_token alt[NTOK];  /* shares toks[0, 1010), then differs */

struct fx {
	sel_index *ix;
	uint32_t pt;
	sel_node_id dropped[512];
	int ndropped;
	sel_node_id removed[512];
	int nremoved;
};

static void cb_drop_row(void *ctx, sel_index *ix, sel_node_id id)
{
	struct fx *f = ctx;
	const sel_index_node *n = sel_index_cget(ix, id);
	CHECK(n && (n->flags & SEL_NODE_HAS_ROW) && n->pins == 0);
	CHECK(f->ndropped < 512);
	f->dropped[f->ndropped++] = id;
}

static void cb_remove(void *ctx, sel_index *ix, sel_node_id id)
{
	struct fx *f = ctx;
	const sel_index_node *n = sel_index_cget(ix, id);
	CHECK(n && n->children == 0 && n->pins == 0);
	CHECK(f->nremoved < 512);
	f->removed[f->nremoved++] = id;
}

static const struct sel_index_ops ops = {.drop_row = cb_drop_row, .remove = cb_remove};

static void fx_init(struct fx *f, uint32_t pt)
{
	memset(f, 0, sizeof *f);
	f->pt = pt;
	CHECK_OK(sel_index_create(pt, &ops, f, &f->ix));
	CHECK(sel_index_count(f->ix) == 0 && sel_index_page_tokens(f->ix) == pt);
	CHECK_OK(sel_index_check(f->ix));
}

static void fx_free(struct fx *f)
{
	CHECK_OK(sel_index_check(f->ix));
	sel_index_destroy(f->ix);
}

static void fx_clear_log(struct fx *f) { f->ndropped = f->nremoved = 0; }

static void mkhist(sel_history *h, const sel_token *t, uint64_t n, const char *salt)
{
	CHECK_OK(sel_history_init(h, model_id, salt, salt ? strlen(salt) : 0));
	CHECK_OK(sel_history_append(h, t, n));
}

/* Insert the record of h's first c tokens under h's first p tokens (p < 0:
 * no parent), with an automatic tail. */
static sel_node_id put(struct fx *f, const sel_history *h, uint64_t c, int64_t p, bool row)
{
	sel_key k, pk;
	sel_node_id id = 7;
	sel_history_key_at(h, c, &k);
	if (p >= 0)
		sel_history_key_at(h, (uint64_t)p, &pk);
	CHECK_OK(sel_index_insert(f->ix, &k, p >= 0 ? &pk : NULL, sel_history_bound(h, c / 64),
				  SEL_TAIL_AUTO, row, &id));
	CHECK_OK(sel_index_check(f->ix));
	const sel_index_node *n = sel_index_cget(f->ix, id);
	CHECK(n && n->state == SEL_NODE_PENDING && n->pins == 0);
	CHECK(sel_key_eq(&n->key, &k));
	CHECK(!!(n->flags & SEL_NODE_HAS_ROW) == row);
	CHECK(sel_index_find(f->ix, &k) == id);
	return id;
}

static void commit(struct fx *f, sel_node_id id)
{
	sel_index_commit(f->ix, id);
	CHECK_OK(sel_index_check(f->ix));
	CHECK(sel_index_cget(f->ix, id)->state == SEL_NODE_READY);
}

static sel_node_id put_ready(struct fx *f, const sel_history *h, uint64_t c, int64_t p)
{
	sel_node_id id = put(f, h, c, p, true);
	commit(f, id);
	return id;
}

static bool has_row(struct fx *f, sel_node_id id)
{
	return (sel_index_cget(f->ix, id)->flags & SEL_NODE_HAS_ROW) != 0;
}

static bool alive(struct fx *f, sel_node_id id) { return sel_index_cget(f->ix, id) != NULL; }

/* Lookup with h's first len tokens and expect the chain ids[0..n) with base
 * p (n == 0: a miss). */
static void expect_at(struct fx *f, const sel_history *full, uint64_t len, uint64_t a,
		      uint64_t limit, const sel_node_id *ids, uint32_t n, uint64_t p, int line)
{
	sel_history h;
	CHECK_OK(sel_history_copy(&h, full));
	sel_history_truncate(&h, len);
	sel_index_chain ch = {0};
	int rc = sel_index_lookup(f->ix, &h, a, limit, &ch);
	CHECKF(rc == (n ? 1 : 0),
	       "line %d: lookup(len %" PRIu64 ", a %" PRIu64 ", limit %" PRIu64
	       ") returned %d, chain of %u",
	       line, len, a, limit, rc, ch.n);
	if (n) {
		CHECKF(ch.n == n, "line %d: chain of %u, want %u", line, ch.n, n);
		for (uint32_t i = 0; i < n; i++)
			CHECKF(ch.ids[i] == ids[i], "line %d: chain[%u] = %u, want %u", line, i,
			       ch.ids[i], ids[i]);
		uint64_t c = sel_index_cget(f->ix, ids[n - 1])->key.consumed, pt = f->pt;
		CHECKF(ch.consumed == c && ch.base == p,
		       "line %d: consumed %" PRIu64 " base %" PRIu64, line, ch.consumed, ch.base);
		CHECKF(ch.pages == c / pt - p / pt, "line %d: pages %u", line, ch.pages);
		CHECKF(ch.skip_pages == a / pt - p / pt, "line %d: skip %u", line, ch.skip_pages);
		uint64_t sum = 0;
		for (uint32_t i = 0; i < n; i++)
			sum += sel_index_cget(f->ix, ids[i])->tail_pages;
		CHECK(sum == ch.pages);
	} else {
		CHECK(ch.n == 0);
	}
	sel_index_chain_free(&ch);
	sel_history_free(&h);
	CHECK_OK(sel_index_check(f->ix));
}

/* EXPECT(fx, history, len, a, limit, base, chain ids...) */
#define IDS(...)                                                                                   \
	((const sel_node_id[]){__VA_ARGS__}),                                                      \
		(uint32_t)(sizeof((sel_node_id[]){__VA_ARGS__}) / sizeof(sel_node_id))
#define EXPECT(f, h, len, a, limit, p, ...)                                                        \
	expect_at(f, h, len, a, limit, IDS(__VA_ARGS__), p, __LINE__)
#define EXPECT_MISS(f, h, len, a, limit) expect_at(f, h, len, a, limit, NULL, 0, 0, __LINE__)
#define NOLIMIT UINT64_MAX

/* Endpoints off page and bucket boundaries: 100, 1000, 1001. */
static void test_unaligned(uint32_t pt, const sel_history *h)
{
	struct fx f;
	fx_init(&f, pt);
	sel_node_id a = put_ready(&f, h, 100, -1);
	sel_node_id b = put_ready(&f, h, 1000, 100);
	CHECK(sel_index_cget(f.ix, a)->tail_pages == 100 / pt);
	CHECK(sel_index_cget(f.ix, b)->tail_pages == 1000 / pt - 100 / pt);
	CHECK(has_row(&f, a) && f.ndropped == 0); /* a root keeps its row */
	EXPECT(&f, h, 1200, 0, NOLIMIT, 0, a, b);

	sel_node_id c = put(&f, h, 1001, 1000, true);
	EXPECT(&f, h, 1200, 0, NOLIMIT, 0, a, b); /* pending: not a candidate */
	commit(&f, c);
	CHECK(!has_row(&f, b) && f.ndropped == 1 && f.dropped[0] == b); /* only child committed */
	EXPECT(&f, h, 1200, 0, NOLIMIT, 0, a, b, c);
	EXPECT(&f, h, 1001, 0, NOLIMIT, 0, a, b, c);
	EXPECT(&f, h, 1200, 0, 1001, 0, a, b, c);
	/* b lost its row: a limit of 1000 falls back to a. */
	EXPECT(&f, h, 1200, 0, 1000, 0, a);
	EXPECT(&f, h, 1000, 0, NOLIMIT, 0, a);
	EXPECT(&f, h, 1200, 99, NOLIMIT, 0, a, b, c);
	EXPECT(&f, h, 1200, 100, NOLIMIT, 100, b, c);
	EXPECT(&f, h, 1200, 500, NOLIMIT, 100, b, c);
	EXPECT(&f, h, 1200, 999, NOLIMIT, 100, b, c);
	EXPECT(&f, h, 1200, 1000, NOLIMIT, 1000, c);
	EXPECT_MISS(&f, h, 1200, 1001, NOLIMIT);
	EXPECT_MISS(&f, h, 1200, 5000, NOLIMIT);
	EXPECT_MISS(&f, h, 99, 0, NOLIMIT);
	EXPECT(&f, h, 100, 0, NOLIMIT, 0, a);
	EXPECT_MISS(&f, h, 1200, 0, 99);
	EXPECT_MISS(&f, h, 1200, 50, 50);
	fx_free(&f);
}

/* The chain stops at the first parent at or below the resident count; a
 * pending node above it makes the candidate infeasible, one below does not. */
static void test_feasibility(uint32_t pt, const sel_history *h)
{
	struct fx f;
	fx_init(&f, pt);
	sel_node_id n256 = put_ready(&f, h, 256, -1);
	sel_node_id n640 = put(&f, h, 640, 256, true);
	sel_node_id n1100 = put_ready(&f, h, 1100, 640);
	sel_node_id n1800 = put_ready(&f, h, 1800, 1100);
	/* Both n1100 and n1800 committed as only children: n640 and n1100 are
	 * page-only now (n256 is a root). */
	CHECK(!has_row(&f, n640) && !has_row(&f, n1100) && has_row(&f, n256));
	EXPECT(&f, h, 2000, 700, NOLIMIT, 640, n1100, n1800);
	EXPECT(&f, h, 2000, 640, NOLIMIT, 640, n1100, n1800);
	EXPECT(&f, h, 2000, 1100, NOLIMIT, 1100, n1800);
	EXPECT(&f, h, 2000, 1799, NOLIMIT, 1100, n1800);
	/* n640 pending and above the resident count: infeasible; n256 is below. */
	EXPECT_MISS(&f, h, 2000, 639, NOLIMIT);
	EXPECT_MISS(&f, h, 2000, 300, NOLIMIT);
	EXPECT(&f, h, 2000, 0, 1799, 0, n256);
	commit(&f, n640);
	EXPECT(&f, h, 2000, 300, NOLIMIT, 256, n640, n1100, n1800);
	EXPECT(&f, h, 2000, 0, NOLIMIT, 0, n256, n640, n1100, n1800);
	EXPECT(&f, h, 2000, 255, NOLIMIT, 0, n256, n640, n1100, n1800);
	EXPECT(&f, h, 2000, 256, NOLIMIT, 256, n640, n1100, n1800);

	/* A deeper pending candidate is skipped for a shallower feasible one. */
	sel_node_id n1900 = put(&f, h, 1900, 1800, true);
	EXPECT(&f, h, 2000, 0, NOLIMIT, 0, n256, n640, n1100, n1800);
	sel_node_id n2500 = put_ready(&f, h, 2500, 1900);
	EXPECT(&f, h, 2600, 1000, NOLIMIT, 640, n1100, n1800); /* n1900 pending on the walk */
	EXPECT(&f, h, 2600, 1900, NOLIMIT, 1900, n2500);       /* ... but not above 1900 */
	commit(&f, n1900);
	EXPECT(&f, h, 2600, 1000, NOLIMIT, 640, n1100, n1800, n1900, n2500);

	/* A long chain (more than the initial chain capacity). */
	uint64_t prev = 2500;
	sel_node_id ids[64];
	uint32_t n = 0;
	ids[n++] = n256, ids[n++] = n640, ids[n++] = n1100, ids[n++] = n1800, ids[n++] = n1900;
	ids[n++] = n2500;
	for (uint64_t c = 2570; c < 5900; c += 70 + c % 13) {
		ids[n++] = put_ready(&f, h, c, (int64_t)prev);
		prev = c;
	}
	CHECK(n > 40);
	expect_at(&f, h, NTOK, 0, NOLIMIT, ids, n, 0, __LINE__);
	expect_at(&f, h, NTOK, 2000, NOLIMIT, ids + 5, n - 5, 1900, __LINE__);
	fx_free(&f);
}

/* A page-only interior node: not a match itself, still a chain member;
 * compaction by eviction behaves the same. */
static void test_page_only_chain(uint32_t pt, const sel_history *h)
{
	struct fx f;
	fx_init(&f, pt);
	sel_node_id a = put_ready(&f, h, 300, -1);
	sel_node_id b = put_ready(&f, h, 900, 300);
	sel_node_id b2 = put_ready(&f, h, 950, 300); /* b's sibling */
	sel_node_id c = put(&f, h, 1500, 900, true);
	sel_node_id d = put(&f, h, 1600, 900, true);
	commit(&f, c);
	commit(&f, d);
	CHECK(has_row(&f, b) && f.ndropped == 0);
	EXPECT(&f, h, 1000, 0, NOLIMIT, 0, a, b2);
	EXPECT(&f, h, 920, 0, NOLIMIT, 0, a, b);
	CHECK_RC(sel_index_remove(f.ix, b2), 0);
	CHECK(f.nremoved == 1 && f.removed[0] == b2 && !alive(&f, b2));
	EXPECT(&f, h, 1000, 0, NOLIMIT, 0, a, b);

	CHECK_RC(sel_index_drop_row(f.ix, b), 0);
	CHECK(f.ndropped == 1 && f.dropped[0] == b && !has_row(&f, b));
	CHECK_RC(sel_index_drop_row(f.ix, b), -ENOENT);
	EXPECT(&f, h, 1000, 0, NOLIMIT, 0, a);       /* b no longer matches */
	EXPECT(&f, h, 1550, 0, NOLIMIT, 0, a, b, c); /* ... but supplies pages */
	EXPECT(&f, h, 1700, 0, NOLIMIT, 0, a, b, d);
	EXPECT(&f, h, 1700, 950, NOLIMIT, 900, d);
	EXPECT(&f, h, 1700, 400, NOLIMIT, 300, b, d);
	EXPECT(&f, h, 1700, 0, 1599, 0, a, b, c);

	/* Compaction by eviction: pin every leaf; the single-child row holder a
	 * is a root here, so it is the only compaction candidate once c goes. */
	sel_index_pin(f.ix, c);
	sel_index_pin(f.ix, d);
	sel_node_id v = 0;
	/* b has two children and no row, a has one child: a is compacted. */
	CHECK_RC(sel_index_evict(f.ix, &v), 2);
	CHECK(v == a && !has_row(&f, a) && alive(&f, a));
	CHECK_OK(sel_index_check(f.ix));
	EXPECT_MISS(&f, h, 1000, 0, NOLIMIT);
	EXPECT(&f, h, 1550, 0, NOLIMIT, 0, a, b, c);
	CHECK_RC(sel_index_evict(f.ix, &v), 0); /* nothing left to evict or compact */
	CHECK(v == SEL_NODE_NONE);
	fx_clear_log(&f);
	/* Unpinning makes the leaves evictable; removing both cascades up. */
	sel_index_unpin(f.ix, c);
	CHECK_RC(sel_index_evict(f.ix, &v), 1);
	CHECK(v == c && !alive(&f, c) && alive(&f, b));
	sel_index_unpin(f.ix, d);
	CHECK_OK(sel_index_check(f.ix));
	CHECK_RC(sel_index_evict(f.ix, &v), 1);
	CHECK(v == d && !alive(&f, d) && !alive(&f, b) && !alive(&f, a));
	CHECK(f.nremoved == 4 && sel_index_count(f.ix) == 0);
	fx_free(&f);
}

/* Leaf-first eviction in LRU order; touch reorders; pinned and
 * non-evictable nodes survive; compaction of a single-child ancestor. */
static void test_eviction(uint32_t pt, const sel_history *h, const sel_history *h2)
{
	struct fx f;
	fx_init(&f, pt);
	/* Unrelated roots evict in insertion order... */
	sel_node_id r[5];
	for (int i = 0; i < 5; i++)
		r[i] = put_ready(&f, i % 2 ? h2 : h, 1100 + 100 * (uint64_t)i, -1);
	sel_node_id order[5], it = SEL_NODE_NONE;
	for (int i = 0; i < 5; i++)
		order[i] = it = sel_index_next_lru(f.ix, it);
	CHECK(sel_index_next_lru(f.ix, it) == SEL_NODE_NONE);
	for (int i = 0; i < 5; i++)
		CHECK(order[i] == r[i]);
	/* ...until touched. */
	sel_index_touch(f.ix, r[0]);
	sel_index_touch(f.ix, r[2]);
	CHECK_OK(sel_index_check(f.ix));
	sel_node_id want[5] = {r[1], r[3], r[4], r[0], r[2]}, v;
	for (int i = 0; i < 5; i++) {
		CHECK_RC(sel_index_evict(f.ix, &v), 1);
		CHECK(v == want[i] && f.removed[i] == want[i]);
		CHECK_OK(sel_index_check(f.ix));
	}
	CHECK_RC(sel_index_evict(f.ix, NULL), 0);
	fx_clear_log(&f);

	/* A tree: root 200 with children 700 and 800, 700 with child 1300.
	 * Inserting refreshes ancestors, so every leaf precedes its parents. */
	sel_node_id t200 = put_ready(&f, h, 200, -1);
	sel_node_id t700 = put_ready(&f, h, 700, 200);
	sel_node_id t800 = put_ready(&f, h, 800, 200);
	sel_node_id t1300 = put_ready(&f, h, 1300, 700); /* drops 700's row */
	CHECK(!has_row(&f, t700));
	CHECK(sel_index_next_lru(f.ix, SEL_NODE_NONE) == t800);
	/* Pin the LRU leaf, forbid the next: nothing else is a leaf, so the
	 * only-child row holder... there is none (700 is page-only, 200 has two
	 * children): nothing to evict. */
	sel_index_pin(f.ix, t800);
	sel_index_set_evictable(f.ix, t1300, false);
	CHECK(sel_index_cget(f.ix, t1300)->flags & SEL_NODE_NOEVICT);
	CHECK_OK(sel_index_check(f.ix));
	CHECK_RC(sel_index_evict(f.ix, &v), 0);
	CHECK(alive(&f, t800) && alive(&f, t1300) && f.nremoved == 0);
	/* Another leaf under 200 is evicted before the pinned and the forbidden. */
	sel_node_id t900 = put_ready(&f, h, 900, 200);
	sel_index_touch(f.ix, t800);
	sel_index_touch(f.ix, t1300);
	CHECK_RC(sel_index_evict(f.ix, &v), 1);
	CHECK(v == t900);
	/* A page-only chain: allow eviction of 1300; it goes, taking 700 along
	 * (page-only, childless), 200 stays (row, and 800). */
	sel_index_set_evictable(f.ix, t1300, true);
	CHECK_OK(sel_index_check(f.ix));
	CHECK_RC(sel_index_evict(f.ix, &v), 1);
	CHECK(v == t1300 && !alive(&f, t1300) && !alive(&f, t700) && alive(&f, t200));
	/* 800 pinned: 200 is a single-child row holder: compacted. */
	CHECK_RC(sel_index_evict(f.ix, &v), 2);
	CHECK(v == t200 && !has_row(&f, t200));
	CHECK_RC(sel_index_evict(f.ix, &v), 0);
	sel_index_unpin(f.ix, t800);
	CHECK_RC(sel_index_evict(f.ix, &v), 1);
	CHECK(v == t800 && sel_index_count(f.ix) == 0);

	/* A non-evictable single-child row holder is not compacted. */
	sel_node_id u1 = put_ready(&f, h, 1000, -1);
	sel_node_id u2 = put_ready(&f, h, 2000, 1000);
	sel_index_pin(f.ix, u2);
	sel_index_set_evictable(f.ix, u1, false);
	CHECK_RC(sel_index_evict(f.ix, &v), 0);
	sel_index_set_evictable(f.ix, u1, true);
	sel_index_pin(f.ix, u1);
	CHECK_RC(sel_index_evict(f.ix, &v), 0);
	sel_index_unpin(f.ix, u1);
	CHECK_RC(sel_index_evict(f.ix, &v), 2);
	CHECK(v == u1);
	CHECK_RC(sel_index_remove(f.ix, u1), -EBUSY);
	CHECK_RC(sel_index_remove(f.ix, u2), -EBUSY);
	sel_index_unpin(f.ix, u2);
	CHECK_RC(sel_index_remove(f.ix, u2), 0);
	CHECK(!alive(&f, u1) && sel_index_count(f.ix) == 0);
	fx_free(&f);
}

/* Dedupe, root records, orphans and argument checks. */
static void test_insert_rules(uint32_t pt, const sel_history *h)
{
	struct fx f;
	fx_init(&f, pt);
	sel_key k1000, k1500, k3000, k0 = {0};
	sel_history_key_at(h, 1000, &k1000);
	sel_history_key_at(h, 1500, &k1500);
	sel_history_key_at(h, 3000, &k3000);
	const sel_digest *b1500 = sel_history_bound(h, 1500 / 64);
	const sel_digest *b3000 = sel_history_bound(h, 3000 / 64);
	sel_node_id id, x = put_ready(&f, h, 1000, -1);

	/* Dedupe: the existing id comes back, nothing changes. */
	uint64_t tick = sel_index_cget(f.ix, x)->tick;
	CHECK_RC(sel_index_insert(f.ix, &k1000, NULL, sel_history_bound(h, 1000 / 64),
				  SEL_TAIL_AUTO, true, &id),
		 -EEXIST);
	CHECK(id == x && sel_index_count(f.ix) == 1 && sel_index_cget(f.ix, x)->tick == tick);

	/* Parent absent: a root with the full chain, AUTO or explicit. */
	CHECK_RC(sel_index_insert(f.ix, &k3000, &k1500, b3000, SEL_TAIL_AUTO, true, &id), 0);
	CHECK(sel_index_cget(f.ix, id)->parent == SEL_NODE_NONE);
	CHECK(sel_index_cget(f.ix, id)->tail_pages == 3000 / pt);
	commit(&f, id);
	EXPECT(&f, h, 3100, 0, NOLIMIT, 0, id);
	EXPECT(&f, h, 3100, 1200, NOLIMIT, 0, id); /* skip 1200/pt of the root's pages */
	CHECK_RC(sel_index_remove(f.ix, id), 0);
	CHECK_RC(sel_index_insert(f.ix, &k3000, &k1500, b3000, 3000 / pt, true, &id), 0);
	CHECK_RC(sel_index_remove(f.ix, id), 0);
	CHECK_RC(sel_index_insert(f.ix, &k3000, NULL, b3000, SEL_TAIL_AUTO, true, &id), 0);
	CHECK_RC(sel_index_remove(f.ix, id), 0);
	CHECK_RC(sel_index_insert(f.ix, &k3000, &k0, b3000, SEL_TAIL_AUTO, true, &id), 0);
	CHECK(sel_index_cget(f.ix, id)->parent == SEL_NODE_NONE);
	CHECK_RC(sel_index_remove(f.ix, id), 0);

	/* Orphan: parent absent, only the tail since it. */
	CHECK_RC(sel_index_insert(f.ix, &k3000, &k1500, b3000, 3000 / pt - 1500 / pt, true, &id),
		 -ENOENT);
	CHECK(id == SEL_NODE_NONE && sel_index_count(f.ix) == 1);
	CHECK_RC(sel_index_insert(f.ix, &k3000, NULL, b3000, 1, true, &id), -ENOENT);

	/* Parent present: derived tail links, the full chain makes a root,
	 * anything else is refused. */
	CHECK_RC(
		sel_index_insert(f.ix, &k1500, &k1000, b1500, 1500 / pt - 1000 / pt + 1, true, &id),
		-EINVAL);
	CHECK_RC(sel_index_insert(f.ix, &k1500, &k1000, b1500, 1500 / pt, true, &id), 0);
	CHECK(sel_index_cget(f.ix, id)->parent == SEL_NODE_NONE);
	CHECK(sel_index_cget(f.ix, x)->children == 0);
	CHECK_RC(sel_index_remove(f.ix, id), 0);
	CHECK_RC(sel_index_insert(f.ix, &k1500, &k1000, b1500, 1500 / pt - 1000 / pt, true, &id),
		 0);
	CHECK(sel_index_cget(f.ix, id)->parent == x && sel_index_cget(f.ix, x)->children == 1);
	CHECK_RC(sel_index_remove(f.ix, id), 0);

	/* The parent must be shorter; a key must consume something. */
	CHECK_RC(sel_index_insert(f.ix, &k1000, &k1500, b1500, SEL_TAIL_AUTO, true, &id), -EEXIST);
	CHECK_RC(sel_index_insert(f.ix, &k1500, &k3000, b1500, SEL_TAIL_AUTO, true, &id), -EINVAL);
	CHECK_RC(sel_index_insert(f.ix, &k1500, &k1500, b1500, SEL_TAIL_AUTO, true, &id), -EINVAL);
	CHECK_RC(sel_index_insert(f.ix, &k0, NULL, b1500, SEL_TAIL_AUTO, true, &id), -EINVAL);
	CHECK(sel_index_count(f.ix) == 1);
	CHECK(sel_index_get(f.ix, SEL_NODE_NONE) == NULL && sel_index_get(f.ix, 12345) == NULL);
	sel_index *bad;
	CHECK_RC(sel_index_create(100, NULL, NULL, &bad), -EINVAL);
	CHECK_RC(sel_index_create(0, NULL, NULL, &bad), -EINVAL);
	sel_index_destroy(NULL);
	fx_free(&f);
}

/* Row drops on commit of an only child, deferred while pinned, cancelled
 * when the child goes first; roots and branch points keep their rows. */
static void test_row_drop(uint32_t pt, const sel_history *h)
{
	struct fx f;
	fx_init(&f, pt);
	sel_node_id r = put_ready(&f, h, 500, -1);
	sel_node_id a = put_ready(&f, h, 1000, 500);
	CHECK(has_row(&f, r)); /* root */
	sel_node_id b = put(&f, h, 1500, 1000, true);
	sel_node_id b2 = put(&f, h, 1600, 1000, true);
	commit(&f, b);
	commit(&f, b2);
	CHECK(has_row(&f, a) && f.ndropped == 0); /* two children */
	CHECK_RC(sel_index_remove(f.ix, b2), 0);

	/* b is a's only child now but committed earlier: a keeps its row until
	 * a new only-child commit. */
	CHECK(has_row(&f, a));
	sel_node_id c = put(&f, h, 2000, 1500, true);
	sel_index_pin(f.ix, b);
	sel_index_pin(f.ix, b);
	commit(&f, c);
	const sel_index_node *bn = sel_index_cget(f.ix, b);
	CHECK((bn->flags & SEL_NODE_DROP_ROW) && (bn->flags & SEL_NODE_HAS_ROW) && f.ndropped == 0);
	EXPECT(&f, h, 1800, 0, NOLIMIT, 0, r, a, b); /* the row is still there */
	CHECK_RC(sel_index_drop_row(f.ix, b), -EBUSY);
	sel_index_unpin(f.ix, b);
	CHECK_OK(sel_index_check(f.ix));
	CHECK(has_row(&f, b) && f.ndropped == 0);
	sel_index_unpin(f.ix, b);
	CHECK_OK(sel_index_check(f.ix));
	CHECK(!has_row(&f, b) && f.ndropped == 1 && f.dropped[0] == b);
	CHECK(!(sel_index_cget(f.ix, b)->flags & SEL_NODE_DROP_ROW));
	EXPECT(&f, h, 1800, 0, NOLIMIT, 0, r, a);

	/* Deferred drop cancelled: c pinned, its only child commits, then the
	 * child is removed before c is unpinned: c keeps its row. */
	sel_node_id d = put(&f, h, 2500, 2000, true);
	sel_index_pin(f.ix, c);
	commit(&f, d);
	CHECK(sel_index_cget(f.ix, c)->flags & SEL_NODE_DROP_ROW);
	CHECK_RC(sel_index_remove(f.ix, d), 0);
	sel_index_unpin(f.ix, c);
	CHECK_OK(sel_index_check(f.ix));
	CHECK(has_row(&f, c) && !(sel_index_cget(f.ix, c)->flags & SEL_NODE_DROP_ROW));
	CHECK(f.ndropped == 1);
	EXPECT(&f, h, 2600, 0, NOLIMIT, 0, r, a, b, c);

	/* An explicit row drop of a leaf removes it, and the page-only parent b
	 * with it. */
	fx_clear_log(&f);
	CHECK_RC(sel_index_drop_row(f.ix, c), 0);
	CHECK(f.ndropped == 0 && f.nremoved == 2 && f.removed[0] == c && f.removed[1] == b);
	CHECK(alive(&f, a) && has_row(&f, a));
	EXPECT(&f, h, 2600, 0, NOLIMIT, 0, r, a);
	fx_free(&f);
}

/* Removal cascades through useless page-only ancestors, waiting for pins
 * and evictability; prune removes what startup leaves useless. */
static void test_cascade_prune(uint32_t pt, const sel_history *h, const sel_history *h2)
{
	struct fx f;
	fx_init(&f, pt);
	sel_node_id a = put_ready(&f, h, 400, -1);
	sel_node_id b = put_ready(&f, h, 800, 400);
	sel_node_id c = put_ready(&f, h, 1200, 800);
	sel_node_id d = put_ready(&f, h, 1600, 1200);
	CHECK(has_row(&f, a) && !has_row(&f, b) && !has_row(&f, c) && has_row(&f, d));
	sel_index_pin(f.ix, b);
	CHECK_RC(sel_index_remove(f.ix, d), 0);
	CHECK(!alive(&f, d) && !alive(&f, c) && alive(&f, b)); /* b pinned */
	CHECK(f.nremoved == 2 && f.removed[0] == d && f.removed[1] == c);
	sel_index_set_evictable(f.ix, b, false);
	sel_index_unpin(f.ix, b);
	CHECK_OK(sel_index_check(f.ix));
	CHECK(alive(&f, b)); /* not evictable */
	sel_index_set_evictable(f.ix, b, true);
	CHECK_OK(sel_index_check(f.ix));
	CHECK(!alive(&f, b) && alive(&f, a) && f.nremoved == 3);
	CHECK_RC(sel_index_remove(f.ix, a), 0);
	CHECK(sel_index_count(f.ix) == 0);

	/* A startup scan: records inserted page-only before their children;
	 * h2 shares h's first 1010 tokens. */
	fx_clear_log(&f);
	sel_node_id s1 = put(&f, h, 300, -1, false);
	sel_node_id s2 = put(&f, h, 700, 300, false);
	CHECK(sel_index_cget(f.ix, s2)->flags & SEL_NODE_UNPRUNED);
	CHECK(!(sel_index_cget(f.ix, s1)->flags & SEL_NODE_UNPRUNED)); /* it has a child */
	sel_node_id s3 = put(&f, h, 1200, 700, true);
	sel_node_id s4 = put(&f, h2, 1100, 700, false);  /* page-only leaf */
	sel_node_id s5 = put(&f, h2, 1300, 1100, false); /* page-only leaf under it */
	sel_node_id s6 = put(&f, h, 900, 300, false);    /* another branch */
	sel_node_id s7 = put(&f, h, 2000, -1, false);    /* a lone root */
	sel_index_pin(f.ix, s7);
	sel_index_set_evictable(f.ix, s6, false);
	const sel_node_id all[] = {s1, s2, s3, s4, s5, s6, s7};
	for (int i = 0; i < 7; i++)
		commit(&f, all[i]);
	CHECK(f.nremoved == 0);
	CHECK(sel_index_prune(f.ix) == 3); /* s5, s4 (cascade) and s6 */
	CHECK(alive(&f, s1) && alive(&f, s2) && alive(&f, s3) && alive(&f, s7));
	CHECK(!alive(&f, s4) && !alive(&f, s5) && !alive(&f, s6));
	CHECK(!(sel_index_cget(f.ix, s7)->flags & SEL_NODE_UNPRUNED));
	CHECK(sel_index_prune(f.ix) == 0);
	EXPECT(&f, h, 1300, 0, NOLIMIT, 0, s1, s2, s3);
	sel_index_unpin(f.ix, s7); /* useless now that the exemption ended */
	CHECK(!alive(&f, s7));
	CHECK_RC(sel_index_remove(f.ix, s3), 0);
	CHECK(sel_index_count(f.ix) == 0 && f.nremoved == 7);
	fx_free(&f);
}

/* Records of two histories that share a bucket; salts. */
static void test_mismatch_and_salt(uint32_t pt, const sel_history *h, const sel_history *h2,
				   const sel_history *hs)
{
	struct fx f;
	fx_init(&f, pt);
	/* h and h2 agree on [0, 1010): 1020 lies in the block of boundary 960
	 * for both, so the two 1020 records share a bucket. */
	CHECK(memcmp(sel_history_bound(h, 15), sel_history_bound(h2, 15), SEL_DIGEST_BYTES) == 0);
	sel_node_id base = put_ready(&f, h, 500, -1);
	sel_node_id x = put_ready(&f, h, 1020, 500);
	EXPECT(&f, h, 1100, 0, NOLIMIT, 0, base, x);
	EXPECT(&f, h2, 1100, 0, NOLIMIT, 0, base); /* same bucket, other tokens */
	EXPECT_MISS(&f, h2, 1100, 500, NOLIMIT);
	sel_node_id y = put_ready(&f, h2, 1020, 500);
	sel_node_id y2 = put_ready(&f, h2, 1009, 500); /* before the fork: in both */
	EXPECT(&f, h2, 1100, 0, NOLIMIT, 0, base, y);
	EXPECT(&f, h, 1100, 0, NOLIMIT, 0, base, x);
	EXPECT(&f, h, 1019, 0, NOLIMIT, 0, base, y2);
	EXPECT(&f, h2, 1015, 0, NOLIMIT, 0, base, y2);

	/* Salted: same tokens, no matches either way. */
	EXPECT_MISS(&f, hs, 1100, 0, NOLIMIT);
	sel_node_id s = put_ready(&f, hs, 1020, -1);
	EXPECT(&f, hs, 1100, 0, NOLIMIT, 0, s);
	EXPECT(&f, hs, 1100, 700, NOLIMIT, 0, s);
	EXPECT(&f, h, 1100, 0, NOLIMIT, 0, base, x);
	fx_free(&f);
}

/* The checker names what a corruption broke. */
static void test_checker(uint32_t pt, const sel_history *h)
{
	struct fx f;
	fx_init(&f, pt);
	sel_node_id a = put_ready(&f, h, 700, -1);
	sel_node_id b = put_ready(&f, h, 1300, 700);
	sel_index_node *n = sel_index_get(f.ix, b);
	n->tail_pages++;
	CHECK_RC(sel_index_check(f.ix), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "tail"));
	n->tail_pages--;
	sel_index_get(f.ix, a)->children++;
	CHECK_RC(sel_index_check(f.ix), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "children"));
	sel_index_get(f.ix, a)->children--;
	uint64_t t = n->tick;
	n->tick = sel_index_cget(f.ix, a)->tick + 1;
	CHECK_RC(sel_index_check(f.ix), SEL_ECORRUPT);
	n->tick = t;
	n->flags |= SEL_NODE_DROP_ROW;
	CHECK_RC(sel_index_check(f.ix), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "row"));
	n->flags &= (uint16_t)~SEL_NODE_DROP_ROW;
	sel_node_id prev = n->lru_prev;
	n->lru_prev = n->lru_prev == a ? SEL_NODE_NONE : a;
	CHECK_RC(sel_index_check(f.ix), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "LRU"));
	n->lru_prev = prev;
	CHECK_OK(sel_index_check(f.ix));
	fx_free(&f);
}


/* ---- last use and the expiry walk (design 2.5) ---------------------------------------- */

static uint64_t fake_now;
static uint64_t fake_clock(void) { return fake_now; }

static bool refuse_ctx(void *ctx, const sel_index *ix, sel_node_id id)
{
	(void)ix;
	return id != *(sel_node_id *)ctx;
}

static void test_expiry(uint32_t pt, const sel_history *h, const sel_history *h2)
{
	struct fx f;
	fx_init(&f, pt);
	const uint64_t S = 1000000000ull;
	sel_index_set_clock(f.ix, fake_clock);
	/* a <- b <- c (b loses its row when c, its only child, commits), and
	 * d, e: roots of another conversation, e used last. */
	fake_now = 100 * S;
	sel_node_id a = put_ready(&f, h, 2 * pt, -1);
	fake_now = 200 * S;
	sel_node_id b = put_ready(&f, h, 4 * pt, 2 * pt);
	fake_now = 300 * S;
	sel_node_id d = put_ready(&f, h2, 3 * pt, -1);
	fake_now = 400 * S;
	sel_node_id c = put_ready(&f, h, 6 * pt, 4 * pt);
	CHECK(!has_row(&f, b));
	fake_now = 500 * S;
	sel_node_id e = put_ready(&f, h2, 5 * pt, -1); /* a second root (full chain) */
	/* Publication refreshes the record and its ancestors. */
	CHECK(sel_index_used_ns(f.ix, c) == 400 * S && sel_index_used_ns(f.ix, b) == 400 * S &&
	      sel_index_used_ns(f.ix, a) == 400 * S && sel_index_used_ns(f.ix, d) == 300 * S &&
	      sel_index_used_ns(f.ix, e) == 500 * S);
	/* Nothing is older than 250 s but d: d goes, the walk stops at c. */
	fx_clear_log(&f);
	CHECK(sel_index_expire(f.ix, 350 * S, 64, false, NULL, NULL) == 1);
	CHECK(!alive(&f, d) && f.nremoved == 1 && alive(&f, c));
	CHECK_OK(sel_index_check(f.ix));
	/* A reuse refreshes c and its ancestors; the clock stepping back
	 * stamps no earlier than before. */
	fake_now = 600 * S;
	sel_index_touch(f.ix, c);
	fake_now = 550 * S;
	sel_index_touch(f.ix, e);
	CHECK(sel_index_used_ns(f.ix, c) == 600 * S && sel_index_used_ns(f.ix, a) == 600 * S &&
	      sel_index_used_ns(f.ix, e) == 600 * S && sel_index_stamp(f.ix) == 600 * S);
	/* A pinned leaf is passed over, and so is one droppable refuses;
	 * interior nodes are never expired while their children live. */
	sel_index_pin(f.ix, c);
	fx_clear_log(&f);
	CHECK(sel_index_expire(f.ix, 1000 * S, 64, false, NULL, NULL) == 1);
	CHECK(alive(&f, a) && alive(&f, b) && alive(&f, c) && !alive(&f, e));
	sel_index_unpin(f.ix, c);
	CHECK(sel_index_expire(f.ix, 1000 * S, 64, false, refuse_ctx, &c) == 0);
	CHECK(alive(&f, c));
	/* c expires; b (page-only) goes with its last child; a, left a leaf
	 * with its row, is judged in turn and expires too. */
	fx_clear_log(&f);
	CHECK(sel_index_expire(f.ix, 1000 * S, 64, false, NULL, NULL) == 2);
	CHECK(f.nremoved == 3 && f.removed[0] == c && f.removed[1] == b && f.removed[2] == a);
	CHECK(sel_index_count(f.ix) == 0);
	CHECK_OK(sel_index_check(f.ix));

	/* The 64-leaf bound, and the stop at the first fresh leaf against
	 * 'all' (tools). */
	for (int i = 0; i < 70; i++) {
		fake_now = (1000 + (uint64_t)i) * S;
		put_ready(&f, h, (uint64_t)(i + 1) * 64 + 1, -1);
	}
	CHECK(sel_index_count(f.ix) == 70);
	CHECK(sel_index_expire(f.ix, 2000 * S, 64, false, NULL, NULL) == 64);
	CHECK(sel_index_count(f.ix) == 6);
	CHECK(sel_index_expire(f.ix, 2000 * S, 64, false, NULL, NULL) == 6);
	CHECK_OK(sel_index_check(f.ix));

	/* Recovery: times seeded from each file's mtime, the access order
	 * sorted by the newest time in each subtree (parents after children).
	 * p (old file) under q (fresh file): p stays while q lives. */
	fake_now = 5000 * S;
	sel_node_id p = put_ready(&f, h, 2 * pt, -1);
	sel_node_id q = put_ready(&f, h, 3 * pt, 2 * pt);
	sel_node_id x = put_ready(&f, h2, 1100, -1);
	sel_index_seed_used(f.ix, p, 100 * S);
	sel_index_seed_used(f.ix, q, 300 * S);
	sel_index_seed_used(f.ix, x, 200 * S);
	CHECK_OK(sel_index_order_by_use(f.ix));
	CHECK_OK(sel_index_check(f.ix));
	CHECK(sel_index_next_lru(f.ix, SEL_NODE_NONE) == x);
	CHECK(sel_index_next_lru(f.ix, x) == q && sel_index_next_lru(f.ix, q) == p);
	CHECK(sel_index_used_ns(f.ix, p) == 100 * S); /* its own file's time */
	fx_clear_log(&f);
	CHECK(sel_index_expire(f.ix, 250 * S, 64, false, NULL, NULL) == 1); /* x; q is fresh */
	CHECK(!alive(&f, x) && alive(&f, p) && alive(&f, q));
	/* q expires: p, an old leaf now, goes in the same walk. */
	CHECK(sel_index_expire(f.ix, 350 * S, 64, false, NULL, NULL) == 2);
	CHECK(sel_index_count(f.ix) == 0);
	fx_free(&f);
}

int main(void)
{
	test_rng r;
	test_rng_init(&r, test_seed());
	test_rng_fill(&r, model_id, sizeof model_id);
	for (int i = 0; i < NTOK; i++) {
		toks[i] = (sel_token)test_rng_below(&r, 150000);
		alt[i] = i < 1010 ? toks[i] : (sel_token)test_rng_below(&r, 150000) + 200000;
	}
	sel_history h, h2, hs;
	mkhist(&h, toks, NTOK, NULL);
	mkhist(&h2, alt, NTOK, NULL);
	mkhist(&hs, toks, NTOK, "tenant-a");

	static const uint32_t page_sizes[] = {64, 128, 256};
	for (int i = 0; i < 3; i++) {
		uint32_t pt = page_sizes[i];
		test_unaligned(pt, &h);
		test_feasibility(pt, &h);
		test_page_only_chain(pt, &h);
		test_eviction(pt, &h, &h2);
		test_insert_rules(pt, &h);
		test_row_drop(pt, &h);
		test_cascade_prune(pt, &h, &h2);
		test_mismatch_and_salt(pt, &h, &h2, &hs);
		test_checker(pt, &h);
		test_expiry(pt, &h, &h2);
		printf("page tokens %u: ok\n", pt);
	}
	sel_history_free(&h);
	sel_history_free(&h2);
	sel_history_free(&hs);
	printf("ok\n");
	return 0;
}
