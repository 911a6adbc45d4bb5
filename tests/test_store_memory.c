/*
 * test_store_memory.c - the memory store (design 2.4) through the store
 * interface (design 2.2), with the host copy backend and with storefx's stub
 * backend that holds copies until released or fails them on demand.
 *
 * Covers: event sequencing (put -> QUEUED, no event until the copy lands,
 * then exactly one STORED; fetch -> exactly one FETCHED); copy-out failure
 * (STORE_FAILED, record gone, slots back); fetch failure (FETCH_FAILED,
 * destinations untouched afterwards); lookup pinning nothing; -ESTALE after
 * eviction and -EINVAL for a ticket of the wrong size; byte-exact round trips
 * into different page ids and state slot after poisoning the planes, for
 * records over 64 pages and multi-slot rows; parent/child chains with
 * GPU-resident prefix skips and the row drop when a non-root's only child
 * commits; LRU eviction and touch; pinned records surviving eviction;
 * SEL_OVERSIZE, SEL_RETRY reasons (inflight, slabs, queue), -EAGAIN fetches
 * with nothing pinned, fetches resubmitted from poll when the channel fills
 * midway; SEL_PRESENT/SEL_SKIPPED dedupe; TP2 with replicated and split
 * planes (packed and per-rank records, mixed chains, packed prefix skips,
 * counters); open errors and the intake warning; close with a stuck copy
 * (SEL_ESTOPPED).  sel_memory_store_check() runs after every step.
 *
 * The planes, geometry, stub backend, byte patterns and conversations are
 * storefx.h's.  Its event helpers are used in their _all forms: every event
 * counts, so a SEL_EV_PROGRESS no scenario here asks for fails the test.
 */
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include "eos.h"
#include "slab.h"
#include "store_memory.h"
#include "storefx.h"
#include "testutil.h"
#include "transfer.h"

#define PT SFX_PT

/* ---- fixture: storefx's planes, geometry and stub backend, and a store ---- */

struct fx {
	struct sfx f; /* planes, geometry, stub copy backend */
	sel_store *s;
};

static void fx_init(struct fx *fx, uint32_t ranks, uint32_t n_planes, const uint64_t *unit,
		    uint64_t row_bytes, uint64_t pages, uint64_t rows)
{
	sfx_init(&fx->f, ranks, n_planes, unit, row_bytes, pages, rows);
	fx->s = NULL;
}

struct open_opts {
	bool stub;
	uint32_t queue_depth;
};

static void fx_open(struct fx *fx, uint64_t warm_slots, struct open_opts o)
{
	sel_store_config cfg = sfx_config(&fx->f, o.stub);
	cfg.memory_bytes = warm_slots * fx->f.slot_bytes + fx->f.slot_bytes / 2; /* rounds down */
	cfg.queue_depth = o.queue_depth;
	CHECK_OK(sel_memory_store_open(&cfg, &fx->s));
	uint64_t sb, warm, intake;
	uint32_t rs;
	sel_memory_store_slots(fx->s, &sb, &warm, &intake, &rs);
	CHECK(sb == fx->f.slot_bytes && warm == warm_slots && rs == fx->f.row_slots);
	CHECK(intake == 2ull * 1 * rs + 2 * 64);
	CHECK(*sel_store_warning(fx->s) == '\0');
	CHECK_OK(sel_memory_store_check(fx->s));
}

static void fx_close(struct fx *fx)
{
	if (fx->s) {
		CHECK_OK(sel_memory_store_check(fx->s));
		CHECK_RC(sel_store_close(fx->s, 0), 0);
		sel_store_destroy(fx->s);
		fx->s = NULL;
	}
}

static void fx_free(struct fx *fx)
{
	fx_close(fx);
	sfx_free(&fx->f);
}

/* ---- events: every one counts, the checker runs after every poll ---------- */

/* Poll until `want` events arrived (sleeping on the wait fd). */
static void wait_events(sel_store *s, sel_event *ev, int want)
{
	sfx_wait_events_all(s, ev, want, sel_memory_store_check);
}

/* No event comes: every put and fetch has reported, and nothing else. */
static void no_events(sel_store *s) { sfx_no_events_all(s); }

/* No event now (the test holds every copy in flight, or started none). */
static void none_now(sel_store *s) { sfx_none_now_all(s); }

static sel_event one_event(sel_store *s)
{
	sel_event ev;
	wait_events(s, &ev, 1);
	no_events(s);
	return ev;
}

static void put_ok(struct fx *fx, const sel_published *cp)
{
	sel_retry_reason why = SEL_RETRY_SLABS;
	sel_outcome o = sel_store_put(fx->s, cp, &why);
	CHECKF(o == SEL_QUEUED, "put: %s (%s): %s", sel_outcome_name(o), sel_retry_reason_name(why),
	       sel_errmsg());
	CHECK(why == SEL_RETRY_NONE);
	CHECK_OK(sel_memory_store_check(fx->s));
}

/* put and wait for its STORED event. */
static void store(struct fx *fx, const sel_published *cp)
{
	put_ok(fx, cp);
	sel_event ev = one_event(fx->s);
	CHECKF(ev.type == SEL_EV_STORED, "event %d error %d", ev.type, ev.error);
	CHECK(ev.outcome == SEL_QUEUED && ev.checkpoint == cp->checkpoint);
	CHECK(sel_key_eq(&ev.key, &cp->key));
}

static struct sel_memory_record_info rec(struct fx *fx, const sel_key *k)
{
	struct sel_memory_record_info ri;
	CHECK_OK(sel_memory_store_record(fx->s, k, &ri));
	return ri;
}

static bool present(struct fx *fx, const sel_key *k)
{
	struct sel_memory_record_info ri;
	return sel_memory_store_record(fx->s, k, &ri) == 0;
}

static sel_stats stats(struct fx *fx)
{
	sel_stats st;
	sel_store_stats(fx->s, &st);
	return st;
}

/* Restore from the memory tier: lookup at resident, fetch into ids
 * dst_first.., slot `slot`, wait for FETCHED (the next event, and the only
 * one) and check the bytes, the row split across ranks as row_split says. */
static void restore(struct fx *fx, struct sfx_conv *cv, uint64_t resident, uint64_t limit,
		    uint64_t want_c, uint32_t dst_first, uint32_t slot, bool row_split)
{
	sel_event ev = sfx_restore_with(
		&fx->f, fx->s, cv, resident, limit, want_c, dst_first, slot, SEL_TIER_MEMORY, true,
		sel_memory_store_check,
		(struct sfx_restore_opts){.row_split = row_split, .all_events = true});
	CHECK(ev.tier == SEL_TIER_MEMORY);
	no_events(fx->s);
}

/* ---- tests ----------------------------------------------------------------- */

static const uint64_t units2[] = {4096, 1000};

static void test_sequencing(void)
{
	struct fx fx;
	struct sfx_conv cv;
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	CHECK(fx.f.row_slots == 3);
	fx_open(&fx, 64, (struct open_opts){.stub = true});
	sfx_conv_init(&fx.f, &cv, 1, 300, 10);

	sfx_hold(&fx.f, true);
	sel_published cp = sfx_ckpt_row(&fx.f, &cv, 256, 0, 1, 77, false);
	put_ok(&fx, &cp);
	sfx_wait_blocked(&fx.f, 1);
	none_now(fx.s);
	sel_stats st = stats(&fx);
	CHECK(st.inflight_out == 1 && st.slots_in_use == 4 + 3);
	struct sel_memory_record_info ri = rec(&fx, &cp.key);
	CHECK(!ri.ready && ri.pins == 1 && ri.page_slots == 4 && ri.row_slots == 3 && ri.is_root);

	/* In flight: a second offer is skipped, nothing is found. */
	sel_retry_reason why;
	CHECK(sel_store_put(fx.s, &cp, &why) == SEL_SKIPPED);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &cv.h, 0, 300, &hit), 0);

	sfx_hold(&fx.f, false);
	sel_event ev = one_event(fx.s);
	CHECK(ev.type == SEL_EV_STORED && ev.outcome == SEL_QUEUED && ev.checkpoint == 77);
	CHECK(ev.error == 0 && ev.tier == SEL_TIER_MEMORY);
	CHECK(ev.bytes == 4 * (4096 + 1000) + 20000);
	CHECK(sel_key_eq(&ev.key, &cp.key));
	ri = rec(&fx, &cp.key);
	CHECK(ri.ready && ri.pins == 0 && ri.has_row);

	/* Committed: present. */
	CHECK(sel_store_put(fx.s, &cp, &why) == SEL_PRESENT);

	/* Lookup pins nothing. */
	CHECK_RC(sel_store_lookup(fx.s, &cv.h, 0, 300, &hit), 1);
	CHECK(hit.pages == 4 && sel_key_eq(&hit.key, &cp.key));
	CHECK(rec(&fx, &cp.key).pins == 0);
	CHECK(stats(&fx).inflight_in == 0);

	/* Fetch: pinned while the copy is held, one event when it lands. */
	sfx_hold(&fx.f, true);
	uint32_t dst[4] = {100, 101, 102, 103};
	sel_inbound in = {.ticket = 5, .pages = dst, .n_pages = 4, .state_slot = 3};
	CHECK_OK(sel_store_fetch(fx.s, &hit, &in));
	sfx_wait_blocked(&fx.f, 1);
	none_now(fx.s);
	CHECK(rec(&fx, &cp.key).pins == 1);
	CHECK(stats(&fx).inflight_in == 1);
	sfx_hold(&fx.f, false);
	ev = one_event(fx.s);
	CHECK(ev.type == SEL_EV_FETCHED && ev.ticket == 5 && ev.error == 0);
	CHECK(ev.tier == SEL_TIER_MEMORY && ev.bytes == hit.bytes);
	CHECK(rec(&fx, &cp.key).pins == 0);
	for (uint32_t i = 0; i < 4; i++)
		CHECK(sfx_page_ok(&fx.f, dst[i], cv.tag, i, false));
	CHECK(sfx_row_ok(&fx.f, 3, sfx_row_seed(&cv, 256), false));

	st = stats(&fx);
	CHECK(st.outcomes[SEL_QUEUED] == 1 && st.outcomes[SEL_SKIPPED] == 1 &&
	      st.outcomes[SEL_PRESENT] == 1);
	CHECK(st.lookups == 2 && st.hits == 1 && st.reused_tokens == 256);
	CHECK(st.fetches == 1 && st.fetch_failures == 0 && st.store_failures == 0);
	CHECK(st.inflight_out == 0 && st.inflight_in == 0);
	CHECK(st.per_rank_records == 1 && st.packed_records == 0);
	CHECK(st.tier[SEL_TIER_MEMORY].records == 1);
	CHECK(st.tier[SEL_TIER_MEMORY].held == 1);
	CHECK(st.tier[SEL_TIER_MEMORY].bytes_out == ev.bytes);
	CHECK(st.tier[SEL_TIER_MEMORY].bytes_in == ev.bytes);
	CHECK(st.tier[SEL_TIER_MEMORY].bytes_used == 7 * fx.f.slot_bytes);
	CHECK(st.tier[SEL_TIER_MEMORY].bytes_limit == 64 * fx.f.slot_bytes);
	CHECK(st.tier[SEL_TIER_MEMORY].rate_bps > 0);
	CHECK(st.slots_total == 64 + st.intake_slots && st.intake_slots == 2 * 3 + 128);

	/* Touch and evicted notices are harmless. */
	sel_store_touch(fx.s, &cp.key);
	sel_key none = {0};
	sel_store_touch(fx.s, &none);
	sel_store_evicted(fx.s, &cp.key, 1, NULL);
	CHECK(stats(&fx).evictions_noticed == 1);
	CHECK(rec(&fx, &cp.key).ready);

	sfx_conv_free(&cv);
	fx_free(&fx);
}

static void test_failures(void)
{
	struct fx fx;
	struct sfx_conv a, b, c;
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	fx_open(&fx, 15, (struct open_opts){.stub = true});
	sfx_conv_init(&fx.f, &a, 11, 200, 10);
	sfx_conv_init(&fx.f, &b, 12, 200, 20);
	sfx_conv_init(&fx.f, &c, 13, 200, 30);

	/* Copy-out failure: STORE_FAILED, the record and its slots are gone. */
	sfx_fail_n(&fx.f, -EIO, SEL_COPY_OUT, -1);
	sel_published cpa = sfx_ckpt_row(&fx.f, &a, 128, 0, 1, 1, false);
	put_ok(&fx, &cpa);
	sel_event ev = one_event(fx.s);
	CHECK(ev.type == SEL_EV_STORE_FAILED && ev.error == -EIO && ev.checkpoint == 1);
	CHECK(ev.outcome == SEL_SKIPPED);
	CHECK(!present(&fx, &cpa.key));
	sel_stats st = stats(&fx);
	CHECK(st.slots_in_use == 0 && st.store_failures == 1 && st.inflight_out == 0);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &a.h, 0, 200, &hit), 0);

	/* The same offer succeeds later. */
	sfx_fail_n(&fx.f, 0, -1, -1);
	store(&fx, &cpa);

	/* Fetch failure: FETCH_FAILED; the destinations are quiescent after. */
	CHECK_RC(sel_store_lookup(fx.s, &a.h, 0, 200, &hit), 1);
	uint32_t dst[2] = {200, 201};
	for (int i = 0; i < 2; i++)
		for (uint32_t p = 0; p < fx.f.n_planes; p++)
			memset(fx.f.plane[0][p] + dst[i] * fx.f.unit[p], 0x77, fx.f.unit[p]);
	memset(fx.f.row[0] + 6 * fx.f.row_bytes, 0x77, fx.f.row_bytes);
	/* Wrong destination size: -EINVAL, nothing pinned, no event. */
	sel_inbound bad = {.ticket = 8, .pages = dst, .n_pages = 1, .state_slot = 6};
	CHECK_RC(sel_store_fetch(fx.s, &hit, &bad), -EINVAL);
	CHECK(strstr(sel_errmsg(), "1 pages") && strstr(sel_errmsg(), "uploads 2"));
	CHECK(rec(&fx, &cpa.key).pins == 0);
	none_now(fx.s);

	sfx_fail_n(&fx.f, -EIO, SEL_COPY_IN, -1);
	sel_inbound in = {.ticket = 9, .pages = dst, .n_pages = 2, .state_slot = 6};
	CHECK_OK(sel_store_fetch(fx.s, &hit, &in));
	ev = one_event(fx.s);
	CHECK(ev.type == SEL_EV_FETCH_FAILED && ev.error == -EIO && ev.ticket == 9);
	CHECK(rec(&fx, &cpa.key).pins == 0);
	/* Untouched now, and still after a later copy through the same
	 * transfer threads (which run their jobs in order) has completed:
	 * nothing of the failed fetch was left to land late. */
	sel_published cpb = sfx_ckpt_row(&fx.f, &b, 128, 0, 2, 2, false);
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < 2; i++)
			for (uint32_t p = 0; p < fx.f.n_planes; p++)
				for (uint64_t k = 0; k < fx.f.unit[p]; k++)
					CHECK(fx.f.plane[0][p][dst[i] * fx.f.unit[p] + k] == 0x77);
		for (uint64_t k = 0; k < fx.f.row_bytes; k++)
			CHECK(fx.f.row[0][6 * fx.f.row_bytes + k] == 0x77);
		if (pass == 0) {
			sfx_fail_n(&fx.f, 0, -1, -1);
			store(&fx, &cpb);
		}
	}
	st = stats(&fx);
	CHECK(st.fetches == 1 && st.fetch_failures == 1 && st.inflight_in == 0);
	CHECK(st.tier[SEL_TIER_MEMORY].bytes_in == 0);

	/* -ESTALE once eviction took the hit's record: 15 warm slots hold three
	 * records of 2 pages + 3 row slots. */
	sel_published cpc = sfx_ckpt_row(&fx.f, &c, 128, 0, 3, 3, false);
	store(&fx, &cpc);
	CHECK(present(&fx, &cpa.key));
	struct sfx_conv d;
	sfx_conv_init(&fx.f, &d, 14, 200, 40);
	sel_published cpd = sfx_ckpt_row(&fx.f, &d, 128, 0, 4, 4, false);
	store(&fx, &cpd); /* evicts a, the least recently used */
	CHECK(!present(&fx, &cpa.key));
	CHECK(stats(&fx).tier[SEL_TIER_MEMORY].evicted == 1);
	CHECK_RC(sel_store_fetch(fx.s, &hit, &in), -ESTALE);
	none_now(fx.s);

	sfx_conv_free(&a);
	sfx_conv_free(&b);
	sfx_conv_free(&c);
	sfx_conv_free(&d);
	fx_free(&fx);
}

static void test_roundtrip_host(void)
{
	struct fx fx;
	struct sfx_conv a, b;
	const uint64_t units3[] = {8192, 4096, 100};
	fx_init(&fx, 1, 3, units3, 50000, 512, 8);
	/* share 8+4+4 KiB = 16 KiB; row 50000 -> 4 slots. */
	CHECK(fx.f.slot_bytes == 16384 && fx.f.row_slots == 4);
	fx_open(&fx, 400, (struct open_opts){0});

	/* A record over 64 pages: 150 pages (three windows) at scattered ids. */
	sfx_conv_init(&fx.f, &a, 21, 150 * PT + 30, 0);
	test_rng rng;
	test_rng_init(&rng, test_seed());
	uint32_t perm[256];
	for (uint32_t j = 0; j < 256; j++)
		perm[j] = j;
	for (uint32_t j = 255; j > 0; j--) {
		uint32_t k = (uint32_t)test_rng_below(&rng, j + 1), t = perm[j];
		perm[j] = perm[k];
		perm[k] = t;
	}
	for (uint32_t j = 0; j <= 150; j++)
		a.gid[j] = perm[j];
	sel_published cpa = sfx_ckpt_row(&fx.f, &a, 150 * PT + 30, 0, 2, 1, false);
	store(&fx, &cpa);
	CHECK(stats(&fx).slots_in_use == 150 + 4);
	restore(&fx, &a, 0, UINT64_MAX, 150 * PT + 30, 300, 5, false);
	/* Again, into other ids and another slot: the record is unchanged. */
	restore(&fx, &a, 0, UINT64_MAX, 150 * PT + 30, 100, 7, false);

	/* A one-page record. */
	sfx_conv_init(&fx.f, &b, 22, 100, 400);
	sel_published cpb = sfx_ckpt_row(&fx.f, &b, 64, 0, 0, 2, false);
	store(&fx, &cpb);
	restore(&fx, &b, 0, 100, 64, 0, 1, false);
	/* A GPU-resident prefix covering the whole page: the row alone. */
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &b.h, 64, 100, &hit), 0); /* nothing deeper than 64 */
	CHECK_RC(sel_store_lookup(fx.s, &b.h, 63, 100, &hit), 1);
	CHECK(hit.pages == 1);

	sfx_conv_free(&a);
	sfx_conv_free(&b);
	fx_free(&fx);
}

static void test_chains(void)
{
	struct fx fx;
	struct sfx_conv a, other;
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	fx_open(&fx, 64, (struct open_opts){0});
	sfx_conv_init(&fx.f, &a, 31, 1100, 10);

	/* Root A at 256 (4 pages), B at 640 (+6), C at 1000 (+5). */
	sel_published cpa = sfx_ckpt_row(&fx.f, &a, 256, 0, 1, 1, false);
	sel_published cpb = sfx_ckpt_row(&fx.f, &a, 640, 256, 2, 2, false);
	sel_published cpc = sfx_ckpt_row(&fx.f, &a, 1000, 640, 3, 3, false);
	store(&fx, &cpa);
	store(&fx, &cpb);
	/* B's parent is a root: A keeps its row. */
	CHECK(rec(&fx, &cpa.key).has_row && rec(&fx, &cpb.key).tail_pages == 6);
	CHECK(stats(&fx).slots_in_use == 7 + 9);
	store(&fx, &cpc);
	/* C is the only child of B, which is not a root: B's row goes. */
	struct sel_memory_record_info rb = rec(&fx, &cpb.key);
	CHECK(!rb.has_row && rb.row_slots == 0 && rb.page_slots == 6);
	CHECK(rec(&fx, &cpc.key).tail_pages == 5 && !rec(&fx, &cpc.key).is_root);
	CHECK(stats(&fx).slots_in_use == 7 + 6 + 8);

	/* Whole chain, then GPU-resident prefixes: at a parent, inside B. */
	restore(&fx, &a, 0, 1100, 1000, 50, 4, false);
	restore(&fx, &a, 256, 1100, 1000, 80, 5, false);
	restore(&fx, &a, 300, 1100, 1000, 100, 6, false);
	restore(&fx, &a, 400, 1100, 1000, 120, 7, false);
	restore(&fx, &a, 700, 1100, 1000, 140, 0, false);
	/* Limited below C: B has no row any more, A is the deepest. */
	restore(&fx, &a, 0, 999, 256, 160, 1, false);
	restore(&fx, &a, 100, 700, 256, 170, 2, false);

	/* A conversation sharing A's first 300 tokens finds A only. */
	sfx_conv_init(&fx.f, &other, 32, 800, 200);
	sel_token *t = malloc(800 * sizeof(*t));
	CHECK(t);
	memcpy(t, a.h.tokens, 300 * sizeof(*t));
	for (int i = 300; i < 800; i++)
		t[i] = (sel_token)(70000 + i);
	sel_history_free(&other.h);
	CHECK_OK(sel_history_init(&other.h, fx.f.model, NULL, 0));
	CHECK_OK(sel_history_append(&other.h, t, 800));
	free(t);
	other.tag = a.tag; /* same bytes for the shared pages */
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &other.h, 0, 800, &hit), 1);
	CHECK(sel_key_eq(&hit.key, &cpa.key) && hit.pages == 4);

	/* A child offered with its parent unknown becomes a root with the whole
	 * chain. */
	struct sfx_conv r;
	sfx_conv_init(&fx.f, &r, 33, 700, 100);
	sel_published cpr = sfx_ckpt_row(&fx.f, &r, 640, 320, 5, 9, false);
	store(&fx, &cpr);
	struct sel_memory_record_info ri = rec(&fx, &cpr.key);
	CHECK(ri.is_root && ri.tail_pages == 10);
	restore(&fx, &r, 130, 700, 640, 60, 3, false);

	sfx_conv_free(&a);
	sfx_conv_free(&other);
	sfx_conv_free(&r);
	fx_free(&fx);
}

static void test_eviction(void)
{
	struct fx fx;
	struct sfx_conv cv[8];
	sel_published cp[8];
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	/* Three records of 2 pages + 3 row slots. */
	fx_open(&fx, 15, (struct open_opts){.stub = true});
	for (int i = 0; i < 8; i++) {
		sfx_conv_init(&fx.f, &cv[i], 40 + i, 200, 10 + 10 * i);
		cp[i] = sfx_ckpt_row(&fx.f, &cv[i], 128, 0, 1, 100 + i, false);
	}
	store(&fx, &cp[0]);
	store(&fx, &cp[1]);
	store(&fx, &cp[2]);
	/* LRU: touch 0, so 1 is the oldest. */
	sel_store_touch(fx.s, &cp[0].key);
	store(&fx, &cp[3]);
	CHECK(present(&fx, &cp[0].key) && !present(&fx, &cp[1].key));
	CHECK(present(&fx, &cp[2].key) && present(&fx, &cp[3].key));
	CHECK(stats(&fx).tier[SEL_TIER_MEMORY].evicted == 1);
	CHECK(stats(&fx).slots_in_use == 15);

	/* A record being fetched is not evicted even when it is the oldest. */
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &cv[2].h, 0, 200, &hit), 1);
	sfx_hold(&fx.f, true);
	uint32_t dst[2] = {200, 201};
	sel_inbound in = {.ticket = 1, .pages = dst, .n_pages = 2, .state_slot = 5};
	CHECK_OK(sel_store_fetch(fx.s, &hit, &in));
	sfx_wait_blocked(&fx.f, 1);
	sel_store_touch(fx.s, &cp[0].key);
	sel_store_touch(fx.s, &cp[3].key); /* now 2 is the least recently used */
	put_ok(&fx, &cp[4]);               /* evicts 0, not 2 */
	CHECK(present(&fx, &cp[2].key) && !present(&fx, &cp[0].key));
	CHECK(rec(&fx, &cp[2].key).pins == 1);
	/* 3 is evictable; after that only pinned records hold slots. */
	put_ok(&fx, &cp[5]);
	CHECK(!present(&fx, &cp[3].key));
	sel_retry_reason why;
	CHECK(sel_store_put(fx.s, &cp[6], &why) == SEL_RETRY);
	CHECK(why == SEL_RETRY_INFLIGHT);
	CHECK(!present(&fx, &cp[6].key) && present(&fx, &cp[2].key));
	CHECK(stats(&fx).retry_reasons[SEL_RETRY_INFLIGHT] == 1);
	CHECK(stats(&fx).outcomes[SEL_RETRY] == 1);
	sfx_hold(&fx.f, false);
	sel_event ev[3];
	wait_events(fx.s, ev, 3);
	no_events(fx.s);
	int fetched = 0, stored = 0;
	for (int i = 0; i < 3; i++) {
		fetched += ev[i].type == SEL_EV_FETCHED;
		stored += ev[i].type == SEL_EV_STORED;
	}
	CHECK(fetched == 1 && stored == 2);
	/* Progress: the retry succeeds now. */
	store(&fx, &cp[6]);
	CHECK(stats(&fx).tier[SEL_TIER_MEMORY].evicted == 4);

	for (int i = 0; i < 8; i++)
		sfx_conv_free(&cv[i]);
	fx_free(&fx);
}

static void test_capacity_outcomes(void)
{
	struct fx fx;
	struct sfx_conv p, x, q[4];
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	fx_open(&fx, 12, (struct open_opts){.stub = true});

	/* Oversize: 10 pages + 3 row slots > 12 warm slots, never inserted. */
	sfx_conv_init(&fx.f, &x, 50, 700, 100);
	sel_published big = sfx_ckpt_row(&fx.f, &x, 640, 0, 1, 1, false);
	sel_retry_reason why;
	CHECK(sel_store_put(fx.s, &big, &why) == SEL_OVERSIZE);
	CHECK(!present(&fx, &big.key));
	sel_stats st = stats(&fx);
	CHECK(st.outcomes[SEL_OVERSIZE] == 1 && st.tier[SEL_TIER_MEMORY].dropped_oversize == 1);
	CHECK(st.slots_in_use == 0);

	/* Slabs vs inflight: root P (4 pages + row = 7), child C (1 page + row
	 * = 4) in flight.  Eviction can only compact P (its row, 3 slots). */
	sfx_conv_init(&fx.f, &p, 51, 400, 10);
	sel_published cpp = sfx_ckpt_row(&fx.f, &p, 256, 0, 1, 2, false);
	sel_published cpc = sfx_ckpt_row(&fx.f, &p, 320, 256, 2, 3, false);
	store(&fx, &cpp);
	sfx_hold(&fx.f, true);
	put_ok(&fx, &cpc);
	sfx_wait_blocked(&fx.f, 1);
	CHECK(stats(&fx).slots_in_use == 11);
	/* 6 pages + 3 = 9 slots: free 1 + 7 unpinned < 9 -- even evicting
	 * everything it could not fit, so nothing is evicted for it -- and
	 * free 4 after compaction + 4 pinned < 9: slabs. */
	sel_published x9 = sfx_ckpt_row(&fx.f, &x, 384, 0, 3, 4, false);
	CHECK(sel_store_put(fx.s, &x9, &why) == SEL_RETRY && why == SEL_RETRY_SLABS);
	CHECK(!present(&fx, &x9.key));
	CHECK_OK(sel_memory_store_check(fx.s));
	CHECK(rec(&fx, &cpp.key).has_row && stats(&fx).tier[SEL_TIER_MEMORY].compacted == 0);
	CHECK(stats(&fx).slots_in_use == 11);
	/* 2 pages + 3 = 5 slots: eviction compacts P (page-only, its row slots
	 * back) and stops at free 4; free 4 + 4 pinned >= 5: in flight. */
	sel_published x5 = sfx_ckpt_row(&fx.f, &x, 128, 0, 3, 5, false);
	CHECK(sel_store_put(fx.s, &x5, &why) == SEL_RETRY && why == SEL_RETRY_INFLIGHT);
	CHECK(!rec(&fx, &cpp.key).has_row && stats(&fx).tier[SEL_TIER_MEMORY].compacted == 1);
	CHECK(stats(&fx).slots_in_use == 8);
	st = stats(&fx);
	CHECK(st.retry_reasons[SEL_RETRY_SLABS] == 1 && st.retry_reasons[SEL_RETRY_INFLIGHT] == 1);
	sfx_hold(&fx.f, false);
	sel_event ev = one_event(fx.s);
	CHECK(ev.type == SEL_EV_STORED && ev.checkpoint == 3);
	/* The page-only P stays for its child. */
	CHECK(present(&fx, &cpp.key) && rec(&fx, &cpc.key).ready);
	restore(&fx, &p, 0, 400, 320, 200, 4, false);
	fx_close(&fx);

	/* Queue: depth 1.  One job runs (held), one waits, the third is refused
	 * and undone; a fetch then gets -EAGAIN with nothing pinned. */
	fx_open(&fx, 40, (struct open_opts){.stub = true, .queue_depth = 1});
	sel_published cq[4];
	for (int i = 0; i < 4; i++) {
		sfx_conv_init(&fx.f, &q[i], 60 + i, 200, 10 + 10 * i);
		cq[i] = sfx_ckpt_row(&fx.f, &q[i], 128, 0, 1, 10 + i, false);
	}
	store(&fx, &cq[0]);
	sfx_hold(&fx.f, true);
	put_ok(&fx, &cq[1]);
	sfx_wait_blocked(&fx.f, 1);
	put_ok(&fx, &cq[2]);
	CHECK(sel_store_put(fx.s, &cq[3], &why) == SEL_RETRY && why == SEL_RETRY_QUEUE);
	CHECK(!present(&fx, &cq[3].key));
	CHECK(stats(&fx).slots_in_use == 15);
	CHECK_OK(sel_memory_store_check(fx.s));
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &q[0].h, 0, 200, &hit), 1);
	uint32_t dst[2] = {200, 201};
	sel_inbound in = {.ticket = 3, .pages = dst, .n_pages = 2, .state_slot = 5};
	CHECK_RC(sel_store_fetch(fx.s, &hit, &in), -EAGAIN);
	CHECK(rec(&fx, &cq[0].key).pins == 0 && stats(&fx).inflight_in == 0);
	none_now(fx.s);
	sfx_hold(&fx.f, false);
	sel_event evs[2];
	wait_events(fx.s, evs, 2);
	CHECK(evs[0].type == SEL_EV_STORED && evs[1].type == SEL_EV_STORED);
	store(&fx, &cq[3]);
	CHECK(stats(&fx).retry_reasons[SEL_RETRY_QUEUE] == 1);

	/* Dedupe in flight and committed. */
	CHECK(sel_store_put(fx.s, &cq[3], &why) == SEL_PRESENT && why == SEL_RETRY_NONE);

	/* Unusable offers are skipped. */
	sel_published odd = cq[0];
	odd.n_pages = 5;
	CHECK(sel_store_put(fx.s, &odd, &why) == SEL_SKIPPED);
	odd = cq[0];
	odd.state_slot = 8;
	odd.key.consumed = 129;
	CHECK(sel_store_put(fx.s, &odd, &why) == SEL_SKIPPED);
	CHECK(sel_store_put(fx.s, NULL, &why) == SEL_SKIPPED);

	for (int i = 0; i < 4; i++)
		sfx_conv_free(&q[i]);
	sfx_conv_free(&p);
	sfx_conv_free(&x);
	fx_free(&fx);
}

/* TP2: planes "k" (4 KiB) and "v" (1000 B) on both ranks; a conversation's
 * pages are replicated (identical on both ranks) before split_from and split
 * from there on. */
static void test_tp2(void)
{
	struct fx fx;
	struct sfx_conv pk, un, mx, ch, od;
	fx_init(&fx, 2, 2, units2, 20000, 256, 8);
	CHECK(fx.f.slot_bytes == 2 * 8192 && fx.f.row_slots == 3);
	fx_open(&fx, 200, (struct open_opts){0});

	/* Packed: pages and row replicated. */
	sfx_conv_init(&fx.f, &pk, 70, 400, 10);
	sel_published cpk = sfx_ckpt_row(&fx.f, &pk, 320, 0, 1, 1, false);
	store(&fx, &cpk);
	struct sel_memory_record_info ri = rec(&fx, &cpk.key);
	CHECK(ri.pages_packed && ri.row_packed && ri.page_slots == 3 && ri.row_slots == 2);
	/* Per-rank: split pages, split row. */
	sfx_conv_init(&fx.f, &un, 71, 400, 20);
	un.split = true; /* from page 0 */
	sel_published cun = sfx_ckpt_row(&fx.f, &un, 320, 0, 2, 2, true);
	store(&fx, &cun);
	ri = rec(&fx, &cun.key);
	CHECK(!ri.pages_packed && !ri.row_packed && ri.page_slots == 5 && ri.row_slots == 3);
	/* Mixed: replicated pages, split row. */
	sfx_conv_init(&fx.f, &mx, 72, 400, 30);
	sel_published cmx = sfx_ckpt_row(&fx.f, &mx, 320, 0, 3, 3, true);
	store(&fx, &cmx);
	ri = rec(&fx, &cmx.key);
	CHECK(ri.pages_packed && !ri.row_packed && ri.page_slots == 3 && ri.row_slots == 3);
	sel_stats st = stats(&fx);
	CHECK(st.packed_records == 2 && st.per_rank_records == 1);
	CHECK(st.slots_in_use == 5 + 8 + 6);

	restore(&fx, &pk, 0, 400, 320, 100, 4, false);
	restore(&fx, &un, 0, 400, 320, 100, 4, true);
	restore(&fx, &mx, 0, 400, 320, 100, 4, true);
	/* Packed prefix skip at a multiple of ranks. */
	restore(&fx, &pk, 128, 400, 320, 120, 5, false);
	/* ... and off it: the job starts at the second share of a slot. */
	restore(&fx, &pk, 64, 400, 320, 120, 5, false);
	restore(&fx, &pk, 192, 400, 320, 120, 5, false);
	restore(&fx, &un, 64, 400, 320, 120, 5, true);

	/* Chain: packed root (5 pages, odd) + per-rank child: two IN jobs. */
	sfx_conv_init(&fx.f, &ch, 73, 800, 40);
	ch.split = true;
	ch.split_from = 5;
	sel_published cr = sfx_ckpt_row(&fx.f, &ch, 320, 0, 1, 4, false);
	sel_published cc = sfx_ckpt_row(&fx.f, &ch, 640, 320, 2, 5, true);
	store(&fx, &cr);
	store(&fx, &cc);
	CHECK(rec(&fx, &cr.key).pages_packed && !rec(&fx, &cc.key).pages_packed);
	restore(&fx, &ch, 0, 800, 640, 150, 6, true);
	restore(&fx, &ch, 130, 800, 640, 150, 6, true); /* skip 2 of the packed root */
	restore(&fx, &ch, 64, 800, 640, 150, 6, true);  /* skip 1: starts mid-slot */
	restore(&fx, &ch, 200, 800, 640, 150, 6, true); /* skip 3 */

	/* Two packed records, the first with an odd page count: 3 + 4 pages. */
	sfx_conv_init(&fx.f, &od, 74, 600, 80);
	sel_published o1 = sfx_ckpt_row(&fx.f, &od, 192, 0, 1, 6, false);
	sel_published o2 = sfx_ckpt_row(&fx.f, &od, 448, 192, 2, 7, false);
	store(&fx, &o1);
	store(&fx, &o2);
	CHECK(rec(&fx, &o1.key).page_slots == 2 && rec(&fx, &o2.key).page_slots == 2);
	restore(&fx, &od, 0, 600, 448, 170, 7, false);
	restore(&fx, &od, 128, 600, 448, 170, 7, false);
	restore(&fx, &od, 64, 600, 448, 170, 7, false); /* odd skip inside a packed record */
	restore(&fx, &od, 192, 600, 448, 170, 7, false);
	st = stats(&fx);
	CHECK(st.packed_records == 2 + 3 && st.per_rank_records == 1 + 1);

	sfx_conv_free(&pk);
	sfx_conv_free(&un);
	sfx_conv_free(&mx);
	sfx_conv_free(&ch);
	sfx_conv_free(&od);
	fx_free(&fx);
}

/* A two-job fetch whose second job finds the channel full is finished from
 * poll, with one event. */
static void test_fetch_resubmit(void)
{
	struct fx fx;
	struct sfx_conv ch, z;
	fx_init(&fx, 2, 2, units2, 20000, 256, 8);
	fx_open(&fx, 100, (struct open_opts){.stub = true, .queue_depth = 1});
	sfx_conv_init(&fx.f, &ch, 80, 800, 10);
	ch.split = true;
	ch.split_from = 5;
	sel_published cr = sfx_ckpt_row(&fx.f, &ch, 320, 0, 1, 1, false);
	sel_published cc = sfx_ckpt_row(&fx.f, &ch, 640, 320, 2, 2, true);
	store(&fx, &cr);
	store(&fx, &cc);
	CHECK(rec(&fx, &cr.key).pages_packed && !rec(&fx, &cc.key).pages_packed);

	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &ch.h, 0, 800, &hit), 1);
	CHECK(hit.pages == 10);
	sfx_conv_init(&fx.f, &z, 81, 200, 100);
	sel_published cz = sfx_ckpt_row(&fx.f, &z, 128, 0, 3, 3, false);
	sfx_hold(&fx.f, true);
	put_ok(&fx, &cz);
	sfx_wait_blocked(&fx.f, 2); /* both ranks took it: channels empty */
	uint32_t dst[10];
	for (uint32_t i = 0; i < 10; i++)
		dst[i] = 150 + i;
	sel_inbound in = {.ticket = 42, .pages = dst, .n_pages = 10, .state_slot = 6};
	sfx_poison(&fx.f);
	CHECK_OK(sel_store_fetch(fx.s, &hit, &in)); /* job 1 queued, job 2 kept */
	CHECK(rec(&fx, &cr.key).pins == 1 && rec(&fx, &cc.key).pins == 1);
	none_now(fx.s);
	sfx_hold(&fx.f, false);
	sel_event ev[2];
	wait_events(fx.s, ev, 2);
	no_events(fx.s);
	CHECK(ev[0].type == SEL_EV_STORED && ev[0].checkpoint == 3);
	CHECK(ev[1].type == SEL_EV_FETCHED && ev[1].ticket == 42 && ev[1].bytes == hit.bytes);
	CHECK(rec(&fx, &cr.key).pins == 0 && rec(&fx, &cc.key).pins == 0);
	for (uint32_t i = 0; i < 10; i++)
		CHECK(sfx_page_ok(&fx.f, dst[i], ch.tag, i, sfx_conv_split(&ch, i)));
	CHECK(sfx_row_ok(&fx.f, 6, sfx_row_seed(&ch, 640), true));

	/* A fetch failing in one of its two jobs reports once, after both. */
	sfx_fail_n(&fx.f, -EIO, SEL_COPY_IN, -1);
	CHECK_RC(sel_store_lookup(fx.s, &ch.h, 0, 800, &hit), 1);
	CHECK_OK(sel_store_fetch(fx.s, &hit, &in));
	sel_event e = one_event(fx.s);
	CHECK(e.type == SEL_EV_FETCH_FAILED && e.error == -EIO && e.ticket == 42);
	CHECK(stats(&fx).inflight_in == 0 && rec(&fx, &cr.key).pins == 0);
	sfx_fail_n(&fx.f, 0, -1, -1);

	sfx_conv_free(&ch);
	sfx_conv_free(&z);
	fx_free(&fx);
}

/* A copy-out that fails after its record got a child: the record stays,
 * empty and unrestorable, until an offer of its key fills it again. */
static void test_failed_parent(void)
{
	struct fx fx;
	struct sfx_conv a;
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	fx_open(&fx, 64, (struct open_opts){.stub = true});
	sfx_conv_init(&fx.f, &a, 90, 700, 10);
	sel_published cpa = sfx_ckpt_row(&fx.f, &a, 256, 0, 1, 1, false);
	sel_published cpb = sfx_ckpt_row(&fx.f, &a, 512, 256, 2, 2, false);
	sfx_hold(&fx.f, true);
	sfx_fail_n(&fx.f, -EIO, SEL_COPY_OUT, -1);
	put_ok(&fx, &cpa);
	sfx_wait_blocked(&fx.f, 1);
	put_ok(&fx, &cpb); /* queued behind a, under a */
	sfx_hold(&fx.f, false);
	sel_event ev[2];
	wait_events(fx.s, ev, 2);
	CHECK(ev[0].type == SEL_EV_STORE_FAILED && ev[1].type == SEL_EV_STORE_FAILED);
	CHECK(!present(&fx, &cpa.key) && !present(&fx, &cpb.key));
	CHECK(stats(&fx).slots_in_use == 0);

	/* Now b succeeds while a fails: a stays as an empty interior node. */
	sfx_fail_n(&fx.f, -EIO, SEL_COPY_OUT, 1);
	sfx_hold(&fx.f, true);
	put_ok(&fx, &cpa);
	sfx_wait_blocked(&fx.f, 1);
	put_ok(&fx, &cpb);
	sfx_hold(&fx.f, false);
	wait_events(fx.s, ev, 2);
	no_events(fx.s);
	CHECK(ev[0].type == SEL_EV_STORE_FAILED && ev[0].checkpoint == 1);
	CHECK(ev[1].type == SEL_EV_STORED && ev[1].checkpoint == 2);
	sfx_fail_n(&fx.f, 0, -1, -1);
	struct sel_memory_record_info ri = rec(&fx, &cpa.key);
	CHECK(ri.failed && !ri.ready && ri.page_slots == 0 && ri.row_slots == 0);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &a.h, 0, 700, &hit), 0);   /* chain broken at a */
	CHECK_RC(sel_store_lookup(fx.s, &a.h, 256, 700, &hit), 1); /* above a is fine */
	CHECK(hit.pages == 4);
	/* Offering a again fills it. */
	store(&fx, &cpa);
	ri = rec(&fx, &cpa.key);
	CHECK(ri.ready && !ri.failed && ri.page_slots == 4);
	restore(&fx, &a, 0, 700, 512, 100, 3, false);

	sfx_conv_free(&a);
	fx_free(&fx);
}

static void test_open_errors(void)
{
	struct fx fx;
	sel_store *s = NULL;
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	sel_store_config cfg = {0};
	cfg.geometry = fx.f.g;
	cfg.max_active = 4;
	cfg.host_headroom = 1ull << 30;

	CHECK_RC(sel_memory_store_open(&cfg, &s), -EINVAL); /* no warm budget */
	CHECK(s == NULL);
	cfg.memory_bytes = 100; /* below one slot */
	CHECK_RC(sel_memory_store_open(&cfg, &s), -EINVAL);

	/* Intake shrunk for headroom: one warning, readable from the store. */
	cfg.memory_bytes = 10 * fx.f.slot_bytes;
	cfg.max_active = 1000;
	cfg.host_headroom = 200 * fx.f.slot_bytes;
	CHECK_OK(sel_memory_store_open(&cfg, &s));
	CHECK(strstr(sel_store_warning(s), "intake") != NULL);
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.intake_slots == 200 && st.slots_total == 210);
	CHECK_RC(sel_store_close(s, 0), 0);
	CHECK_RC(sel_store_close(s, 0), 0); /* idempotent */
	sel_store_destroy(s);
	CHECK(*sel_store_warning(NULL) == '\0');

	/* Headroom below the floor. */
	cfg.host_headroom = 10 * fx.f.slot_bytes;
	CHECK_RC(sel_memory_store_open(&cfg, &s), -ENOMEM);

	/* From MemAvailable. */
	cfg.host_headroom = 0;
	cfg.max_active = 1;
	CHECK_OK(sel_memory_store_open(&cfg, &s));
	sel_store_destroy(s); /* without close */

	/* Device planes need CUDA, which is never silently replaced. */
	sel_geometry *g;
	sel_allocation a[2] = {
		{.rank = 0,
		 .name = "k",
		 .group = SEL_GROUP_KV_PAGES,
		 .kind = SEL_MEM_DEVICE,
		 .address = 1ull << 40,
		 .unit_bytes = 4096,
		 .count = 16},
		{.rank = 0,
		 .name = "state",
		 .group = SEL_GROUP_STATE_ROWS,
		 .kind = SEL_MEM_DEVICE,
		 .address = 1ull << 41,
		 .unit_bytes = 4096,
		 .count = 4},
	};
	CHECK_OK(sel_geometry_build(a, 2, 1, PT, &g));
	cfg.geometry = g;
	cfg.host_headroom = 1ull << 30;
	cfg.backend = SEL_BACKEND_HOST;
	CHECK_RC(sel_memory_store_open(&cfg, &s), SEL_EGEOMETRY);
	cfg.backend = SEL_BACKEND_AUTO;
	int rc = sel_memory_store_open(&cfg, &s);
	if (rc == 0) {
		/* A build with a CUDA backend and a usable device: fine too. */
		sel_store_close(s, 0);
		sel_store_destroy(s);
	} else {
		CHECK_RC(rc, SEL_ECUDA);
		CHECK(strstr(sel_errmsg(), "cuda unavailable") != NULL);
	}
	sel_geometry_free(g);
	fx_free(&fx);
}

/* Store interface dispatch: a table of another version is refused. */
static void test_ops_version(void)
{
	struct sel_store_ops ops = {.version = SEL_STORE_OPS_VERSION + 1, .name = "future"};
	sel_store s = {.ops = &ops};
	sel_hit hit;
	sel_retry_reason why = SEL_RETRY_SLABS;
	CHECK_RC(sel_store_lookup(&s, NULL, 0, 0, &hit), -EPROTO);
	CHECK(strstr(sel_errmsg(), "future") != NULL);
	CHECK(sel_store_put(&s, NULL, &why) == SEL_SKIPPED && why == SEL_RETRY_NONE);
	CHECK_RC(sel_store_fetch(&s, NULL, NULL), -EPROTO);
	CHECK_RC(sel_store_poll(&s, NULL, 0), -EPROTO);
	CHECK_RC(sel_store_wait_fd(&s), -1);
	CHECK_RC(sel_store_close(&s, 0), -EPROTO);
	sel_stats st;
	memset(&st, 0xff, sizeof(st));
	sel_store_stats(&s, &st);
	CHECK(st.lookups == 0);
	sel_store_touch(&s, NULL);
	sel_store_evicted(&s, NULL, 0, NULL);
	sel_store_destroy(&s); /* refused: nothing called */
	/* The right version without the entry is refused too. */
	ops.version = SEL_STORE_OPS_VERSION;
	CHECK_RC(sel_store_poll(&s, NULL, 0), -EPROTO);
	CHECK_RC(sel_store_lookup(NULL, NULL, 0, 0, &hit), -EINVAL);
	CHECK_RC(sel_store_close(NULL, 0), 0);
	sel_store_destroy(NULL);

	CHECK(strcmp(sel_outcome_name(SEL_QUEUED), "queued") == 0);
	CHECK(strcmp(sel_outcome_name(SEL_SKIPPED), "skipped") == 0);
	CHECK(strcmp(sel_outcome_name((sel_outcome)99), "unknown") == 0);
	CHECK(strcmp(sel_retry_reason_name(SEL_RETRY_INFLIGHT), "inflight") == 0);
	CHECK(strcmp(sel_retry_reason_name(SEL_RETRY_BUDGET), "budget") == 0);
	CHECK(strcmp(sel_tier_name(SEL_TIER_MEMORY), "dram") == 0);
	CHECK(strcmp(sel_tier_name(SEL_TIER_DISK), "nvme") == 0);
	CHECK(strcmp(sel_tier_name(SEL_TIERS), "unknown") == 0);
}

/* A randomised run against the host backend: offers, lookups, fetches,
 * touches and polls in random order with a pool small enough to evict all
 * the time.  Every fetch lands byte-exact, every QUEUED put and every
 * accepted fetch gets exactly one event, and the store's checker passes
 * after every call. */
#define RND_CONVS 6
#define RND_CKPTS 5
#define RND_TOKENS 2200
#define RND_CONV_IDS (RND_TOKENS / PT + 1)     /* page ids of one conversation */
#define RND_SRC_IDS (RND_CONVS * RND_CONV_IDS) /* conversations' page ids below this */

struct rnd_fetch {
	bool live;
	uint64_t ticket;
	struct sfx_conv *cv;
	uint64_t first_page, c;
	uint32_t *dst, n;
	uint32_t slot;
	bool row_split;
};

static void test_random(uint32_t ranks)
{
	struct fx fx;
	struct sfx_conv cv[RND_CONVS];
	uint64_t cks[RND_CONVS][RND_CKPTS];
	bool offered[RND_CONVS][RND_CKPTS];
	bool row_split[RND_CONVS];
	test_rng rng;
	test_rng_init(&rng, test_seed() + ranks);

	fx_init(&fx, ranks, 2, units2, 20000, 512, 64);
	fx_open(&fx, 48, (struct open_opts){.queue_depth = 4});
	for (int i = 0; i < RND_CONVS; i++) {
		/* Each conversation its own ids, all below the fetches'
		 * destinations: a fetch must never land on a page a later put
		 * reads (ids i * 34 put conversation 5's pages 30-34 at the
		 * first destination ids). */
		sfx_conv_init(&fx.f, &cv[i], 500 + i, RND_TOKENS, (uint32_t)(i * RND_CONV_IDS));
		/* TP2: some conversations replicated, some split from a page on. */
		if (ranks > 1) {
			cv[i].split = true;
			cv[i].split_from = test_rng_below(&rng, 40);
		}
		row_split[i] = ranks > 1 && test_rng_below(&rng, 2);
		uint64_t c = 0;
		for (int k = 0; k < RND_CKPTS; k++) {
			c += 64 + test_rng_below(&rng, 370);
			CHECK(c <= RND_TOKENS); /* within the conversation's tokens and ids */
			cks[i][k] = c;
			offered[i][k] = false;
		}
		/* Every checkpoint's pages and rows are written once: the GPU
		 * copies never change (rows: slot i * RND_CKPTS + k). */
		for (uint64_t j = 0; j < c / PT; j++)
			sfx_put_page(&fx.f, cv[i].gid[j], cv[i].tag, j, sfx_conv_split(&cv[i], j));
		for (int k = 0; k < RND_CKPTS; k++)
			sfx_put_row(&fx.f, (uint32_t)(i * RND_CKPTS + k),
				    sfx_row_seed(&cv[i], cks[i][k]), row_split[i]);
	}
	bool id_used[512] = {0};
	bool slot_used[64] = {0};
	struct rnd_fetch fl[16] = {0};
	uint64_t queued = 0, stored = 0, store_failed = 0, fetches = 0, fetched = 0, tickets = 0;

	for (int op = 0; op < 4000; op++) {
		int what = (int)test_rng_below(&rng, 10);
		int i = (int)test_rng_below(&rng, RND_CONVS);
		if (what < 4) {
			/* Offer checkpoint k with its nearest offered ancestor. */
			int k = (int)test_rng_below(&rng, RND_CKPTS);
			uint64_t parent_c = 0;
			for (int a = k - 1; a >= 0; a--)
				if (offered[i][a]) {
					parent_c = cks[i][a];
					break;
				}
			sel_published cp = {0};
			cp.checkpoint = (uint64_t)(i * RND_CKPTS + k);
			cp.key = sfx_key(&cv[i], cks[i][k]);
			if (parent_c)
				cp.parent = sfx_key(&cv[i], parent_c);
			cp.bucket = *sel_history_bound(&cv[i].h, cks[i][k] / SEL_BUCKET_TOKENS);
			cp.pages = cv[i].gid;
			cp.n_pages = (uint32_t)(cks[i][k] / PT);
			cp.tail = (uint32_t)(cks[i][k] / PT - parent_c / PT);
			cp.state_slot = (uint32_t)(i * RND_CKPTS + k);
			sel_retry_reason why;
			sel_outcome o = sel_store_put(fx.s, &cp, &why);
			CHECKF(o == SEL_QUEUED || o == SEL_PRESENT || o == SEL_SKIPPED ||
				       o == SEL_RETRY || o == SEL_OVERSIZE,
			       "outcome %d", o);
			CHECK((o == SEL_RETRY) == (why != SEL_RETRY_NONE));
			if (o == SEL_QUEUED)
				queued++;
			offered[i][k] = true;
		} else if (what < 7) {
			/* Lookup above a random resident count, fetch if room. */
			uint64_t resident =
				test_rng_below(&rng, 3) ? 0 : test_rng_below(&rng, 1200);
			uint64_t limit = test_rng_below(&rng, 4) ? RND_TOKENS
								 : test_rng_below(&rng, RND_TOKENS);
			sel_hit hit;
			int rc = sel_store_lookup(fx.s, &cv[i].h, resident, limit, &hit);
			CHECK_OK(rc);
			CHECK_OK(sel_memory_store_check(fx.s));
			if (rc == 0)
				continue;
			CHECK(hit.key.consumed > resident && hit.key.consumed <= limit);
			CHECK(hit.pages == hit.key.consumed / PT - resident / PT);
			int f = -1;
			for (int x = 0; x < 16; x++)
				if (!fl[x].live) {
					f = x;
					break;
				}
			int slot = -1;
			for (int x = 40; x < 64; x++)
				if (!slot_used[x]) {
					slot = x;
					break;
				}
			if (f < 0 || slot < 0)
				continue;
			uint32_t *dst = malloc((hit.pages + 1) * sizeof(*dst));
			CHECK(dst);
			uint32_t n = 0;
			for (uint32_t id = RND_SRC_IDS; id < 512 && n < hit.pages; id++)
				if (!id_used[id])
					dst[n++] = id;
			if (n < hit.pages) {
				free(dst);
				continue;
			}
			/* Garbage in the destinations first. */
			for (uint32_t x = 0; x < n; x++)
				for (uint32_t r = 0; r < fx.f.ranks; r++)
					for (uint32_t p = 0; p < fx.f.n_planes; p++)
						memset(fx.f.plane[r][p] + dst[x] * fx.f.unit[p],
						       0xEE, fx.f.unit[p]);
			sel_inbound in = {.ticket = ++tickets,
					  .pages = dst,
					  .n_pages = n,
					  .state_slot = (uint32_t)slot};
			rc = sel_store_fetch(fx.s, &hit, &in);
			CHECK_OK(sel_memory_store_check(fx.s));
			if (rc == -EAGAIN) {
				free(dst);
				continue;
			}
			CHECK_OK(rc);
			fetches++;
			for (uint32_t x = 0; x < n; x++)
				id_used[dst[x]] = true;
			slot_used[slot] = true;
			int k = 0;
			while (cks[i][k] != hit.key.consumed)
				k++;
			fl[f] = (struct rnd_fetch){.live = true,
						   .ticket = in.ticket,
						   .cv = &cv[i],
						   .first_page = resident / PT,
						   .c = hit.key.consumed,
						   .dst = dst,
						   .n = n,
						   .slot = (uint32_t)slot,
						   .row_split = row_split[i]};
			(void)k;
		} else if (what < 8) {
			int k = (int)test_rng_below(&rng, RND_CKPTS);
			sel_key key = sfx_key(&cv[i], cks[i][k]);
			sel_store_touch(fx.s, &key);
		} else {
			sel_event ev[4];
			int n = sel_store_poll(fx.s, ev, 1 + test_rng_below(&rng, 4));
			CHECK_OK(n);
			if (n == 0 && test_rng_below(&rng, 2)) {
				/* Give the copy threads (nice 10) time now and then. */
				struct pollfd pfd = {.fd = sel_store_wait_fd(fx.s),
						     .events = POLLIN};
				poll(&pfd, 1, 2);
			}
			for (int e = 0; e < n; e++) {
				if (ev[e].type == SEL_EV_STORED) {
					stored++;
				} else if (ev[e].type == SEL_EV_STORE_FAILED) {
					store_failed++;
				} else {
					CHECKF(ev[e].type == SEL_EV_FETCHED, "fetch failed: %d",
					       ev[e].error);
					int f = 0;
					while (f < 16 &&
					       !(fl[f].live && fl[f].ticket == ev[e].ticket))
						f++;
					CHECK(f < 16);
					struct rnd_fetch *rf = &fl[f];
					for (uint32_t x = 0; x < rf->n; x++) {
						uint64_t j = rf->first_page + x;
						CHECKF(sfx_page_ok(&fx.f, rf->dst[x], rf->cv->tag,
								   j, sfx_conv_split(rf->cv, j)),
						       "ticket %" PRIu64 " page %" PRIu64,
						       rf->ticket, j);
						id_used[rf->dst[x]] = false;
					}
					CHECK(sfx_row_ok(&fx.f, rf->slot,
							 sfx_row_seed(rf->cv, rf->c),
							 rf->row_split));
					slot_used[rf->slot] = false;
					free(rf->dst);
					rf->live = false;
					fetched++;
				}
			}
		}
		CHECK_OK(sel_memory_store_check(fx.s));
	}
	/* Drain: on the wait fd, with a deadline for a stall, not for speed --
	 * the copy threads run at nice 10, far behind any nice-0 load. */
	uint64_t deadline = eos_now_ns() + 60ull * 1000000000;
	while (stored + store_failed < queued || fetched < fetches) {
		sel_event ev;
		int n = sel_store_poll(fx.s, &ev, 1);
		CHECK_OK(n);
		if (n == 0) {
			CHECKF(eos_now_ns() < deadline,
			       "drain: %" PRIu64 " of %" PRIu64 " puts and %" PRIu64 " of %" PRIu64
			       " fetches reported in 60 s",
			       stored + store_failed, queued, fetched, fetches);
			struct pollfd pfd = {.fd = sel_store_wait_fd(fx.s), .events = POLLIN};
			poll(&pfd, 1, 10);
			continue;
		}
		if (ev.type == SEL_EV_STORED)
			stored++;
		else if (ev.type == SEL_EV_STORE_FAILED)
			store_failed++;
		else {
			CHECK(ev.type == SEL_EV_FETCHED);
			for (int f = 0; f < 16; f++)
				if (fl[f].live && fl[f].ticket == ev.ticket) {
					for (uint32_t x = 0; x < fl[f].n; x++)
						CHECK(sfx_page_ok(
							&fx.f, fl[f].dst[x], fl[f].cv->tag,
							fl[f].first_page + x,
							sfx_conv_split(fl[f].cv,
								       fl[f].first_page + x)));
					CHECK(sfx_row_ok(&fx.f, fl[f].slot,
							 sfx_row_seed(fl[f].cv, fl[f].c),
							 fl[f].row_split));
					free(fl[f].dst);
					fl[f].live = false;
				}
			fetched++;
		}
	}
	no_events(fx.s);
	CHECK(store_failed == 0);
	sel_stats st = stats(&fx);
	CHECK(st.inflight_in == 0 && st.inflight_out == 0);
	CHECK(st.outcomes[SEL_QUEUED] == queued && st.fetches == fetches);
	CHECK(st.packed_records + st.per_rank_records == stored);
	printf("random TP%u: %" PRIu64 " stored, %" PRIu64 " fetched, %" PRIu64 " evicted, %" PRIu64
	       " compacted, %" PRIu64 " packed, retries %" PRIu64 "/%" PRIu64 "/%" PRIu64 "\n",
	       ranks, stored, fetched, st.tier[SEL_TIER_MEMORY].evicted,
	       st.tier[SEL_TIER_MEMORY].compacted, st.packed_records,
	       st.retry_reasons[SEL_RETRY_INFLIGHT], st.retry_reasons[SEL_RETRY_SLABS],
	       st.retry_reasons[SEL_RETRY_QUEUE]);
	for (int i = 0; i < RND_CONVS; i++)
		sfx_conv_free(&cv[i]);
	fx_free(&fx);
}

/* A copy that never finishes: close gives SEL_ESTOPPED by its deadline and
 * destroy leaks what the copy may still touch.  Runs last; the planes stay
 * allocated (static) because the detached thread may still write them. */
static struct fx stuck_fx;

static void test_close_stuck(void)
{
	struct fx *fx = &stuck_fx;
	struct sfx_conv cv;
	fx_init(fx, 1, 2, units2, 20000, 256, 8);
	fx_open(fx, 32, (struct open_opts){.stub = true});
	sfx_conv_init(&fx->f, &cv, 95, 300, 10);
	sel_published cp = sfx_ckpt_row(&fx->f, &cv, 256, 0, 1, 1, false);
	sfx_hold(&fx->f, true);
	put_ok(fx, &cp);
	sfx_wait_blocked(&fx->f, 1);
	/* No bound on how long close took (a loaded machine): one that ignored
	 * its deadline would wait for the held copy for ever, and the runner's
	 * timeout fails the test. */
	CHECK_RC(sel_store_close(fx->s, eos_now_ns() + 100000000), SEL_ESTOPPED);
	CHECK(strstr(sel_errmsg(), "leaked") != NULL);
	CHECK_RC(sel_store_close(fx->s, 0), SEL_ESTOPPED);
	sel_retry_reason why;
	CHECK(sel_store_put(fx->s, &cp, &why) == SEL_SKIPPED);
	sel_store_destroy(fx->s);
	fx->s = NULL;
	/* Let the copy finish into the leaked pool; nothing reports it. */
	sfx_hold(&fx->f, false);
	sfx_wait_copies_done(&fx->f);
	sfx_conv_free(&cv);
}

/* The poll's warm pass (store_common.c "Keeping the lookup warm"): only
 * while polls come within SEL_WARM_PERIOD_NS of each other, at most one per
 * period of the store's clock, again at once after the clock stepped back,
 * and it changes nothing a lookup sees. */
static uint64_t warm_clock_ns = 1000000000000ull;
static uint64_t warm_clock(void) { return warm_clock_ns; }

static uint64_t warm_passes(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.warm_reads <= st.warm_passes);
	return st.warm_passes;
}

static uint64_t warm_reads(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	return st.warm_reads;
}

/* One poll at the clock advanced by dt; the warm passes after it. */
static uint64_t poll_at(sel_store *s, int64_t dt)
{
	sel_event ev;
	warm_clock_ns += (uint64_t)dt;
	CHECK_RC(sel_store_poll(s, &ev, 1), 0);
	return warm_passes(s);
}

static void test_keep_warm(void)
{
	const int64_t P = (int64_t)SEL_WARM_PERIOD_NS;
	struct fx fx;
	fx_init(&fx, 1, 2, units2, 20000, 256, 8);
	sel_store_config cfg = sfx_config(&fx.f, false);
	cfg.memory_bytes = 32 * fx.f.slot_bytes;
	cfg.clock_ns = warm_clock;
	CHECK_OK(sel_memory_store_open(&cfg, &fx.s));
	CHECK(warm_passes(fx.s) == 0);
	CHECK(poll_at(fx.s, 0) == 0); /* the first poll: no loop yet */
	CHECK(poll_at(fx.s, 0) == 1); /* looping, never warmed */
	CHECK(poll_at(fx.s, 0) == 1);
	CHECK(poll_at(fx.s, P - 1) == 1); /* within the period */
	CHECK(poll_at(fx.s, 1) == 2);
	CHECK(poll_at(fx.s, 2 * P) == 2);   /* back from a sleep: none */
	CHECK(poll_at(fx.s, 0) == 3);       /* looping again */
	CHECK(poll_at(fx.s, -10 * P) == 3); /* the clock stepped back */
	CHECK(poll_at(fx.s, 0) == 4);
	CHECK(poll_at(fx.s, 0) == 4); /* the period restarts from there */

	/* A record stored and found again across warm passes. */
	struct sfx_conv cv;
	sfx_conv_init(&fx.f, &cv, 95, 300, 10);
	sel_published cp = sfx_ckpt_row(&fx.f, &cv, 256, 0, 1, 1, false);
	put_ok(&fx, &cp);
	CHECK(one_event(fx.s).type == SEL_EV_STORED);
	/* The passes also walk the put's path (the index, an allocation of the
	 * last put's size, the free slots and the eviction end, the transfer
	 * set's submission locks): the store is unchanged by them. */
	sel_stats before, after;
	sel_store_stats(fx.s, &before);
	for (int i = 0; i < 3; i++) {
		poll_at(fx.s, P / 2);
		poll_at(fx.s, P / 2);
		sel_hit hit;
		CHECK_RC(sel_store_lookup(fx.s, &cv.h, 0, 256, &hit), 1);
		CHECK(sel_key_eq(&hit.key, &cp.key));
	}
	CHECK(warm_passes(fx.s) == 7); /* one per period, none while the clock stood */
	/* Nothing was owed on the completion eventfd at any pass: each one
	 * also read it (EAGAIN), and the put's completion still came. */
	CHECK(warm_reads(fx.s) == 7);
	sel_store_stats(fx.s, &after);
	CHECK(after.slots_in_use == before.slots_in_use &&
	      after.intake_slots == before.intake_slots);
	CHECK(after.tier[SEL_TIER_MEMORY].records == before.tier[SEL_TIER_MEMORY].records);
	CHECK(after.tier[SEL_TIER_MEMORY].evicted == before.tier[SEL_TIER_MEMORY].evicted);
	CHECK_OK(sel_memory_store_check(fx.s));
	/* A put and a fetch after the passes: their locks were left free. */
	struct sfx_conv cv2;
	sfx_conv_init(&fx.f, &cv2, 96, 300, 100);
	sel_published cp2 = sfx_ckpt_row(&fx.f, &cv2, 256, 0, 2, 2, false);
	put_ok(&fx, &cp2);
	CHECK(one_event(fx.s).type == SEL_EV_STORED);
	poll_at(fx.s, P / 2);
	poll_at(fx.s, P / 2);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(fx.s, &cv2.h, 0, 256, &hit), 1);
	CHECK(sel_key_eq(&hit.key, &cp2.key));
	CHECK_OK(sel_memory_store_check(fx.s));
	sfx_conv_free(&cv2);
	sfx_conv_free(&cv);
	fx_free(&fx);
}

int main(void)
{
	test_ops_version();
	test_open_errors();
	test_sequencing();
	test_failures();
	test_roundtrip_host();
	test_chains();
	test_eviction();
	test_capacity_outcomes();
	test_tp2();
	test_fetch_resubmit();
	test_failed_parent();
	test_random(1);
	test_random(2);
	test_close_stuck();
	test_keep_warm();
	printf("test_store_memory: ok\n");
	return 0;
}
