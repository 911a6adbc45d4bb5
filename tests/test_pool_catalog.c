/*
 * test_pool_catalog.c - the pool manager's arena allocator and catalogue
 * in-process (src/manager/arena.c, catalog.c; design 2.15), with
 * mgr_catalog_check after every mutation:
 *
 *   - windows: slot-aligned, within the data area, capped in length, all or
 *     nothing, freed and reused; a fragmented arena still fills;
 *   - records: roots and links, PRESENT / IN_FLIGHT / ORPHAN /
 *     BAD_REQUEST / OVERSIZE, abort, commit, chains above a resident count;
 *   - answers: deepest first, holders before the arena's copy, a session's
 *     own holdings left out, shared chain nodes emitted once, buckets that
 *     hold two endpoints;
 *   - eviction: least recently used unpinned leaves only, parents after
 *     their children; a touch keeps a record; bad records go at unpin;
 *   - max age with explicit clocks: not served once expired, swept at most
 *     once per interval, pinned and interior records kept.
 */
#include "manager/session.h"
#include "testutil.h"

#define S_NS UINT64_C(1000000000)

static struct mgr_arena arena;
static struct mgr_stats st;
static struct mgr_catalog cat;

static void open_arena(uint64_t bytes)
{
	struct mgr_options o;
	memset(&o, 0, sizeof o);
	o.memory = bytes;
	snprintf(o.name, sizeof o.name, "t");
	char err[512];
	CHECKF(!mgr_arena_open(&arena, &o, err, sizeof err), "%s", err);
}

static void checked(void) { CHECKF(!mgr_catalog_check(&cat), "%s", sel_errmsg()); }

static void test_arena(void)
{
	open_arena(MGR_ARENA_HEADER + 64 * 12288); /* 64 slots of 12 KiB, 192 of 4 KiB */
	CHECK(arena.data_start == MGR_ARENA_HEADER && arena.generation);
	struct sel_pool_window w[64];
	uint32_t n = 0;
	CHECK_OK(mgr_arena_alloc(&arena, 12288, 10, 4, SEL_POOL_WIN_PAGES, w, &n, 64));
	CHECK(n == 3); /* 4 + 4 + 2 */
	CHECK_OK(sel_pool_windows_check(w, n, arena.bytes, arena.data_start, 12288, 10, 0));
	for (uint32_t i = 0; i < n; i++)
		CHECK(w[i].off % 12288 == 0 && w[i].slots <= 4);
	CHECK_OK(mgr_arena_check(&arena));
	/* All or nothing. */
	uint32_t n2 = n;
	CHECK_RC(mgr_arena_alloc(&arena, 12288, 1000, 4, 0, w, &n2, 64), -ENOSPC);
	CHECK(n2 == n && arena.used == 30); /* granules */
	/* Fragment: free every other window of single slots, then a big ask
	 * still succeeds in pieces. */
	mgr_arena_free(&arena, w, n, 12288);
	CHECK(arena.used == 0);
	struct sel_pool_window one[200];
	uint32_t k = 0;
	for (int i = 0; i < 60; i++)
		CHECK_OK(mgr_arena_alloc(&arena, 4096, 1, 1, 0, one, &k, 200));
	for (uint32_t i = 0; i < k; i += 2)
		mgr_arena_free(&arena, &one[i], 1, 4096);
	uint32_t m = 0;
	CHECK_OK(mgr_arena_alloc(&arena, 4096, 150, 8, 0, w, &m, 64));
	CHECK_OK(sel_pool_windows_check(w, m, arena.bytes, arena.data_start, 4096, 150, 0));
	CHECK_OK(mgr_arena_check(&arena));
	mgr_arena_close(&arena);
}

/* Sessions for holdings (only the instance id is read). */
static struct mgr_session sa, sb;

static struct sel_pool_scope scope_of(uint8_t fp)
{
	static uint8_t table[24] = {1};
	struct sel_pool_scope s = {.page_tokens = 64,
				   .ranks = 1,
				   .slot_bytes = 8192,
				   .row_slots = 1,
				   .table_bytes = sizeof table,
				   .table = table};
	memset(s.fingerprint, fp, sizeof s.fingerprint);
	return s;
}

static sel_key kk(uint64_t c, uint8_t tag)
{
	sel_key k = {.consumed = c};
	memset(k.digest.b, tag, 16);
	return k;
}

/* Records with explicit buckets: bucket(c) = tag of c / 64 (a fake
 * history where every prefix has its own boundary digests). */
static sel_digest bk(uint64_t c, uint8_t tag)
{
	sel_digest d;
	memset(d.b, 0, sizeof d.b);
	d.b[0] = tag;
	d.b[1] = (uint8_t)(c / 64);
	return d;
}

static struct mgr_record *put(struct mgr_scope *sc, uint64_t c, uint64_t p, uint8_t tag,
			      uint64_t now, uint32_t *why)
{
	struct sel_pool_c_put q = {.key = kk(c, tag),
				   .parent = p ? kk(p, tag) : (sel_key){0},
				   .bucket = bk(c, tag),
				   .tail = (uint32_t)(c / 64 - p / 64),
				   .has_row = 1};
	struct mgr_record *r;
	*why = mgr_record_begin(&cat, sc, &q, &r);
	checked();
	if (*why)
		return NULL;
	struct sel_pool_window *w;
	uint32_t nw;
	if (mgr_catalog_alloc(&cat, sc, q.tail, 1, &w, &nw)) {
		struct sel_pool_window *x;
		uint32_t nx;
		mgr_record_abort(&cat, r, &x, &nx);
		*why = SEL_POOL_NO_ROOM;
		checked();
		return NULL;
	}
	mgr_record_set_windows(r, w, nw);
	uint64_t ck[64] = {0};
	CHECK(mgr_record_commit(&cat, r, ck, q.tail, 0, now) == SEL_POOL_OK);
	checked();
	return r;
}

static struct sel_pool_msg answer(struct mgr_scope *sc, const struct mgr_session *s,
				  uint64_t resident, uint64_t limit, uint8_t tag, uint64_t now)
{
	sel_digest b[64];
	uint64_t k_hi = limit / 64, n = k_hi - resident / 64 + 1;
	for (uint64_t i = 0; i < n; i++)
		b[i] = bk((k_hi - i) * 64, tag);
	struct sel_pool_c_lookup l = {1, resident, limit, k_hi, (uint32_t)n, b};
	struct sel_pool_msg m;
	CHECK_OK(mgr_catalog_answer(&cat, sc, s, &l, now, &m));
	/* It encodes (within the protocol's limits). */
	CHECK(sel_pool_encoded_size(&m) > 0);
	return m;
}

static void test_records(void)
{
	open_arena(MGR_ARENA_HEADER + 40 * 8192);
	mgr_catalog_init(&cat, &arena, &st, 4, 0, 4 << 20);
	struct sel_pool_scope s1 = scope_of(1), s2 = scope_of(2);
	struct mgr_scope *a = mgr_scope_ref(&cat, "p", &s1), *b = mgr_scope_ref(&cat, "p", &s2);
	CHECK(a && b && a != b && mgr_scope_ref(&cat, "p", &s1) == a);
	mgr_scope_unref(&cat, a);
	checked();
	uint32_t why;
	struct mgr_record *r256 = put(a, 256, 0, 1, 1, &why);
	CHECK(r256);
	struct mgr_record *r448 = put(a, 448, 256, 1, 2, &why);
	CHECK(r448 && r448->parent == r256 && r256->children == 1);
	/* Refusals. */
	CHECK(!put(a, 256, 0, 1, 3, &why) && why == SEL_POOL_PRESENT);
	CHECK(!put(a, 576, 512, 1, 3, &why) && why == SEL_POOL_ORPHAN);
	struct sel_pool_c_put bad = {.key = kk(300, 1),
				     .parent = kk(400, 1),
				     .bucket = bk(300, 1),
				     .tail = 4,
				     .has_row = 1};
	CHECK(mgr_record_precheck(&cat, a, &bad) == SEL_POOL_BAD_REQUEST); /* parent deeper */
	bad = (struct sel_pool_c_put){
		.key = kk(256, 1), .bucket = bk(999, 1), .tail = 4, .has_row = 1};
	CHECK(mgr_record_precheck(&cat, a, &bad) == SEL_POOL_BAD_REQUEST); /* another bucket */
	bad = (struct sel_pool_c_put){
		.key = kk(64 * 100, 1), .bucket = bk(64 * 100, 1), .tail = 100, .has_row = 1};
	CHECK(mgr_record_precheck(&cat, a, &bad) == SEL_POOL_OVERSIZE);
	bad.has_row = 0;
	CHECK(mgr_record_precheck(&cat, a, &bad) == SEL_POOL_BAD_REQUEST);
	/* A pending put: IN_FLIGHT for a second, gone after abort. */
	struct sel_pool_c_put q = {.key = kk(640, 1),
				   .parent = kk(448, 1),
				   .bucket = bk(640, 1),
				   .tail = 3,
				   .has_row = 1};
	struct mgr_record *pend;
	CHECK(mgr_record_begin(&cat, a, &q, &pend) == SEL_POOL_OK && r448->pins == 1);
	CHECK(mgr_record_precheck(&cat, a, &q) == SEL_POOL_IN_FLIGHT);
	checked();
	struct sel_pool_window *w;
	uint32_t nw;
	mgr_record_abort(&cat, pend, &w, &nw);
	CHECK(r448->pins == 0 && mgr_entry_find(a, &q.key) == NULL);
	checked();

	/* Chains above a resident count. */
	struct mgr_record *ch[8];
	uint32_t n;
	uint64_t base;
	CHECK(mgr_catalog_chain(&cat, a, &r448->e->key, 0, 10, ch, 8, &n, &base) == 0);
	CHECK(n == 2 && ch[0] == r256 && ch[1] == r448 && base == 0);
	CHECK(mgr_catalog_chain(&cat, a, &r448->e->key, 300, 10, ch, 8, &n, &base) == 0);
	CHECK(n == 1 && ch[0] == r448 && base == 256);
	CHECK(mgr_catalog_chain(&cat, a, &r448->e->key, 448, 10, ch, 8, &n, &base) ==
	      SEL_POOL_BAD_REQUEST);
	CHECK(mgr_catalog_chain(&cat, b, &r448->e->key, 0, 10, ch, 8, &n, &base) ==
	      SEL_POOL_NOT_FOUND);
	CHECK(mgr_catalog_chain(&cat, a, &r448->e->key, 0, 10, ch, 1, &n, &base) ==
	      SEL_POOL_OVERSIZE);

	/* Holdings and answers. */
	memset(sa.instance, 0xa, 16);
	memset(sb.instance, 0xb, 16);
	struct mgr_session_holds ha = {0}, hb = {0};
	struct sel_pool_holding h = {SEL_POOL_SRC_DRAM, kk(448, 1), bk(448, 1), 3};
	CHECK_OK(mgr_hold_add(&cat, a, &sa, &ha, &h));
	h.source = SEL_POOL_SRC_GPU;
	CHECK_OK(mgr_hold_add(&cat, a, &sa, &ha, &h));
	h.bucket = bk(1, 1);
	CHECK_RC(mgr_hold_add(&cat, a, &sb, &hb, &h), -EINVAL); /* filed under another bucket */
	h.bucket = bk(448, 1);
	checked();
	/* A second endpoint in the bucket of 448 (another prefix's 450). */
	struct sel_pool_holding h2 = {SEL_POOL_SRC_NVME, kk(450, 2), bk(448, 1), 1};
	CHECK_OK(mgr_hold_add(&cat, a, &sb, &hb, &h2));
	checked();
	struct sel_pool_msg m = answer(a, &sb, 0, 500, 1, 10);
	struct sel_pool_m_answer *an = &m.u.answer;
	/* B sees: A's GPU, A's DRAM, the arena's 448 chain, the arena's 256;
	 * not its own NVMe holding. */
	CHECK(an->n_cands == 4);
	CHECK(an->cands[0].source == SEL_POOL_SRC_GPU && an->cands[1].source == SEL_POOL_SRC_DRAM);
	CHECK(an->cands[0].node == an->cands[1].node &&
	      !memcmp(an->cands[0].holder, sa.instance, 16));
	CHECK(an->cands[2].source == SEL_POOL_SRC_ARENA &&
	      an->cands[3].source == SEL_POOL_SRC_ARENA);
	uint32_t e448 = an->cands[2].node, e256 = an->cands[3].node;
	CHECK(an->nodes[e448].key.consumed == 448 && an->nodes[e448].up == e256);
	CHECK(an->nodes[e256].up == SEL_POOL_NONE && an->n_nodes == 3); /* 256 once */
	sel_pool_msg_free(&m);
	m = answer(a, &sa, 0, 500, 1, 10);
	CHECK(m.u.answer.n_cands == 3 && m.u.answer.cands[0].source == SEL_POOL_SRC_NVME);
	sel_pool_msg_free(&m);
	/* Withdraw needs the generation; reset clears by source. */
	h.generation = 2;
	mgr_hold_withdraw(&cat, a, &sa, &ha, &h);
	CHECK(ha.n == 2);
	h.generation = 3;
	mgr_hold_withdraw(&cat, a, &sa, &ha, &h); /* the GPU one */
	CHECK(ha.n == 1);
	mgr_hold_reset(&cat, &ha, ~0u);
	mgr_hold_reset(&cat, &hb, ~0u);
	CHECK(ha.n == 0 && hb.n == 0 && cat.holds == 0);
	checked();

	/* Eviction: leaves only, least recently used first. */
	mgr_record_touch(&cat, r256, 20);        /* 256 is now the most recent, but has a child */
	CHECK(mgr_catalog_evict_one(&cat) == 1); /* 448 goes, then 256 is a leaf */
	sel_key k448 = kk(448, 1);
	CHECK(mgr_entry_find(a, &k448) == NULL && r256->children == 0);
	mgr_record_pin(r256);
	CHECK(mgr_catalog_evict_one(&cat) == 0); /* pinned */
	r256->bad = true;
	mgr_record_unpin(&cat, r256); /* a bad leaf goes at its last unpin */
	CHECK(cat.records == 0 && arena.used == 0);
	checked();
	/* Room is made by evicting: 40 slots hold 8 records of 4 + 1. */
	for (int i = 0; i < 20; i++)
		CHECK(put(b, 256, 0, (uint8_t)(10 + i), 30 + (uint64_t)i, &why));
	CHECK(cat.records == 8 && st.evicted >= 12);
	checked();
	mgr_scope_unref(&cat, a);
	mgr_scope_unref(&cat, b);
	mgr_catalog_free(&cat);
	CHECK(arena.used == 0 && cat.n_scopes == 0);
	mgr_arena_close(&arena);
}

static void test_max_age(void)
{
	open_arena(MGR_ARENA_HEADER + 64 * 8192);
	memset(&st, 0, sizeof st);
	mgr_catalog_init(&cat, &arena, &st, 4, 10 * S_NS, 4 << 20);
	struct sel_pool_scope s1 = scope_of(1);
	struct mgr_scope *a = mgr_scope_ref(&cat, "p", &s1);
	uint32_t why;
	struct mgr_record *r1 = put(a, 128, 0, 1, 100 * S_NS, &why);
	struct mgr_record *r2 = put(a, 256, 128, 1, 105 * S_NS, &why);
	struct mgr_record *r3 = put(a, 128, 0, 3, 106 * S_NS, &why);
	CHECK(r1 && r2 && r3);
	/* At 111 s r1 is expired but interior; its child's chain is not served. */
	struct mgr_record *ch[4];
	uint32_t n;
	uint64_t base;
	CHECK(mgr_catalog_chain(&cat, a, &r2->e->key, 0, 111 * S_NS, ch, 4, &n, &base) ==
	      SEL_POOL_NOT_FOUND);
	CHECK(mgr_catalog_chain(&cat, a, &r2->e->key, 200, 111 * S_NS, ch, 4, &n, &base) ==
	      0); /* above it */
	mgr_catalog_sweep(&cat, 111 * S_NS);
	CHECK(cat.records == 3 && st.expired == 0); /* r1 is interior: skipped, r2 fresh: stop */
	checked();
	/* At 116 s r2 and r3 are expired too: r2 goes, then r1 is a leaf --
	 * but the sweep runs once per max age (10 s), so not again at 117 s. */
	mgr_record_pin(r3);
	mgr_catalog_sweep(&cat, 117 * S_NS);
	CHECK(st.expired == 0);
	mgr_catalog_sweep(&cat, 122 * S_NS);
	CHECK(st.expired == 2 && cat.records == 1 && r3->pins == 1); /* r2, r1; r3 pinned */
	checked();
	mgr_record_unpin(&cat, r3);
	mgr_scope_unref(&cat, a);
	mgr_catalog_free(&cat);
	mgr_arena_close(&arena);
}

int main(void)
{
	test_arena();
	test_records();
	test_max_age();
	printf("ok\n");
	return 0;
}
