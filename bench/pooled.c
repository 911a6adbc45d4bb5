/*
 * bench/pooled.c - restores through the pooled store (store_pooled.h):
 * one `flare pool`, two pool-only stores over host planes (the host copy
 * backend), a 64 MiB record put by A and restored by B, end to end:
 * lookup, claim, per-window verification on the helper thread overlapped
 * with the copy of the previous window, release.
 *
 *   RESULT pooled_restore_bps <v> bytes/s   fetch -> FETCHED (median of 15)
 *   RESULT pooled_memcpy_bps <v> bytes/s    baseline: one memcpy of the same
 *                                           bytes, in the same run
 *   RESULT pooled_restore_vs_memcpy <x> ratio  (goal >= 0.85): of the medians
 *   RESULT pooled_restore_vs_memcpy_paired <x> ratio  the median of each
 *                                           round's restore / its memcpy
 *
 * Host planes and the host copy backend: each window is verified and
 * copied in one pass on the store's helpers (docs/performance.md).  The
 * paired ratio compares a restore with the memcpy right after it, so load
 * that comes and goes on a shared machine moves both.
 */
#include <poll.h>

#include "benchlib.h"
#include "pool_testlib.h"
#include "store_pooled.h"
#include "storefx.h"

static sel_store *open_store(struct sfx *f, const char *sock, const char *id)
{
	sel_store_config c = sfx_config(f, false);
	c.pool = sock;
	c.pool_instance_id = id;
	c.pool_grace_ns = 1000000000ull;
	sel_store *s = NULL;
	CHECK_OK(sel_store_open(&c, &s));
	return s;
}

static sel_event wait_one(sel_store *s)
{
	sel_event ev[4];
	for (;;) {
		struct pollfd p = {sel_store_wait_fd(s), POLLIN, 0};
		(void)poll(&p, 1, 100);
		int n = sel_store_poll(s, ev, 4);
		CHECK(n >= 0 && n <= 1);
		if (n == 1)
			return ev[0];
	}
}

/* One poll with a short wait; no event may come. */
static void pump_once(sel_store *s)
{
	sel_event ev[4];
	struct pollfd pf = {sel_store_wait_fd(s), POLLIN, 0};
	(void)poll(&pf, 1, 10);
	CHECK(sel_store_poll(s, ev, 4) == 0);
}

int main(void)
{
	char *dir = test_mkdtemp("bench-pooled");
	struct mgr_proc m;
	mgr_start(&m, dir, "bench", "--memory", "512MiB", NULL);
	/* 64 KiB page records: 1024 pages are 64 MiB (65,536 tokens). */
	const uint64_t unit[2] = {32768, 32768};
	const uint32_t pages = 1024;
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, pages + 8, 4);
	sfx_init(&fb, 1, 2, unit, 6000, pages + 8, 4);
	sel_store *a = open_store(&fa, m.sock, "bench-a"), *b = open_store(&fb, m.sock, "bench-b");
	uint64_t c = (uint64_t)pages * SFX_PT;
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 3, c, 0);
	sfx_conv_init(&fb, &cb, 3, c, 0);
	sel_published p = sfx_ckpt(&fa, &ca, c, 0, 1, 1);
	sel_retry_reason why;
	CHECK(sel_store_put(a, &p, &why) == SEL_QUEUED);
	CHECK(wait_one(a).type == SEL_EV_STORED);
	while (((struct sel_pooled *)a)->pc_st.puts_accepted < 1)
		pump_once(a);

	enum {
		R = 15
	};
	double rs[R], mc[R], pr[R];
	uint64_t bytes = 0;
	uint32_t *ids = malloc(pages * sizeof *ids);
	for (uint32_t i = 0; i < pages; i++)
		ids[i] = i;
	uint8_t *x = aligned_alloc(4096, 64u << 20), *y = aligned_alloc(4096, 64u << 20);
	memset(x, 1, 64u << 20);
	memset(y, 2, 64u << 20);
	for (int r = 0; r < R; r++) {
		sel_hit hit;
		int rc;
		while ((rc = sel_store_lookup(b, &cb.h, 0, c, &hit)) != 1) {
			CHECK(rc == SEL_LOOKUP_PENDING || rc == 0);
			pump_once(b);
		}
		CHECK(hit.tier == SEL_TIER_POOL && hit.pages == pages);
		sel_inbound in = {
			.ticket = (uint64_t)r + 1, .pages = ids, .n_pages = pages, .state_slot = 2};
		uint64_t t0 = eos_now_ns();
		CHECK_OK(sel_store_fetch(b, &hit, &in));
		sel_event e = wait_one(b);
		uint64_t ns = eos_now_ns() - t0;
		CHECK(e.type == SEL_EV_FETCHED);
		bytes = e.bytes;
		rs[r] = (double)e.bytes / ((double)ns / 1e9);
		t0 = eos_now_ns();
		memcpy(y, x, 64u << 20);
		mc[r] = (double)(64u << 20) / ((double)(eos_now_ns() - t0) / 1e9);
		pr[r] = rs[r] / mc[r];
		printf("round %2d: restore %.2f GB/s, memcpy %.2f GB/s\n", r, rs[r] / 1e9,
		       mc[r] / 1e9);
	}
	CHECK(sfx_page_ok(&fb, pages - 1, cb.tag, pages - 1, false));
	double f = bench_median(rs, R), bm = bench_median(mc, R);
	printf("RESULT pooled_restore_bps %.0f bytes/s (%" PRIu64 " bytes)\n", f, bytes);
	printf("RESULT pooled_memcpy_bps %.0f bytes/s\n", bm);
	printf("RESULT pooled_restore_vs_memcpy %.3f ratio\n", f / bm);
	printf("RESULT pooled_restore_vs_memcpy_paired %.3f ratio\n", bench_median(pr, R));
	free(x);
	free(y);
	free(ids);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	sfx_free(&fa);
	sfx_free(&fb);
	mgr_stop(&m);
	test_rmtree(dir);
	free(dir);
	return 0;
}
