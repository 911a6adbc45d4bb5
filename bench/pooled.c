/*
 * bench/pooled.c - restores through the pooled store (store_pooled.h):
 * one `flare pool`, two pool-only stores over host planes (the host copy
 * backend), a 64 MiB record put by A and restored by B, end to end:
 * lookup, claim, each window verified and copied in one pass on the
 * store's helpers, release.
 *
 *   RESULT pooled_restore_bps <v> bytes/s   fetch -> FETCHED (median of the rounds)
 *   RESULT pooled_memcpy_bps <v> bytes/s    baseline: one memcpy of the same
 *                                           bytes (the record's arena slots),
 *                                           in the same run
 *   RESULT pooled_restore_vs_memcpy <x> ratio  (goal >= 0.85): the median of
 *                                           each round's restore / its memcpy
 *   RESULT pooled_restore_vs_memcpy_of_medians <x> ratio  the two medians'
 *   RESULT pooled_restore_vs_memcpy_p25 <x> ratio   the per-round ratios'
 *   RESULT pooled_restore_vs_memcpy_p75 <x> ratio   quartiles (the spread)
 *
 * Fair pairs (docs/performance.md "Restore ratio, paired"): every round
 * measures one restore and one memcpy of the same 64 MiB of the arena (the
 * record's slots, found by their bytes) into 64 MiB of destination, one
 * right after the other, alternating which goes first, and each starts
 * from cold caches (bench_cold_caches: the previous pass's bytes evicted).
 * The ratio is the median of the rounds' ratios, so load that comes and
 * goes on a shared machine moves both sides of a pair.  BENCH_ROUNDS sets
 * the rounds (default 41, odd).
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

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double quantile(const double *v, int n, double q)
{
	double *s = malloc((size_t)n * sizeof *s);
	CHECK(s);
	memcpy(s, v, (size_t)n * sizeof *s);
	qsort(s, (size_t)n, sizeof *s, cmp_d);
	double x = s[(int)(q * (n - 1) + 0.5)];
	free(s);
	return x;
}

/* The record's span of arena slots, as B maps it: the slot whose bytes are
 * B's restored page 0 (plane 0 then plane 1), checked at the last page too,
 * so the baseline copies exactly the bytes the restore read. */
static const uint8_t *find_record(sel_store *b, struct sfx *f, uint64_t span)
{
	sel_pool_client *pc = ((struct sel_pooled *)b)->pc;
	uint64_t abytes, sb = sel_pool_slot_bytes(pc);
	const uint8_t *arena = sel_pool_arena(pc, &abytes);
	uint64_t u0 = f->unit[0], u1 = f->unit[1], last = span / sb - 1;
	for (uint64_t off = 0; off + span <= abytes; off += 4096) {
		const uint8_t *s = arena + off;
		if (!memcmp(s, f->plane[0][0], u0) && !memcmp(s + u0, f->plane[0][1], u1) &&
		    !memcmp(s + last * sb, f->plane[0][0] + last * u0, u0) &&
		    !memcmp(s + last * sb + u0, f->plane[0][1] + last * u1, u1))
			return s;
	}
	fprintf(stderr, "bench/pooled: the record's slots are not one span of the arena\n");
	exit(1);
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

	const char *env = getenv("BENCH_ROUNDS");
	int R = env ? atoi(env) : 41;
	if (R < 3 || R > 1001) {
		fprintf(stderr, "bench/pooled: BENCH_ROUNDS=%s: expected 3..1001 rounds\n", env);
		return 2;
	}
	double *rs = calloc((size_t)R, sizeof *rs), *mc = calloc((size_t)R, sizeof *mc),
	       *pr = calloc((size_t)R, sizeof *pr);
	uint64_t bytes = 0, span = (uint64_t)pages * (unit[0] + unit[1]);
	uint32_t *ids = malloc(pages * sizeof *ids);
	for (uint32_t i = 0; i < pages; i++)
		ids[i] = i;
	uint8_t *y = aligned_alloc(4096, span);
	CHECK(rs && mc && pr && ids && y);
	memset(y, 2, span);
	const uint8_t *src = NULL;     /* the record's slots in B's mapping of the arena */
	for (int r = -1; r < R; r++) { /* round -1: warms up, finds src */
		sel_hit hit;
		int rc;
		while ((rc = sel_store_lookup(b, &cb.h, 0, c, &hit)) != 1) {
			CHECK(rc == SEL_LOOKUP_PENDING || rc == 0);
			pump_once(b);
		}
		CHECK(hit.tier == SEL_TIER_POOL && hit.pages == pages);
		double t_restore = 0, t_copy = 0;
		for (int side = 0; side < 2; side++) {
			bool restore = (side == 0) == (r % 2 == 0);
			if (restore || src) {
				bench_cold_caches();
			} else {
				continue; /* round -1 has no src yet */
			}
			uint64_t t0 = eos_now_ns();
			if (restore) {
				sel_inbound in = {.ticket = (uint64_t)(r + 2),
						  .pages = ids,
						  .n_pages = pages,
						  .state_slot = 2};
				CHECK_OK(sel_store_fetch(b, &hit, &in));
				sel_event e = wait_one(b);
				t_restore = (double)(eos_now_ns() - t0) / 1e9;
				CHECK(e.type == SEL_EV_FETCHED);
				bytes = e.bytes;
			} else {
				memcpy(y, src, span);
				t_copy = (double)(eos_now_ns() - t0) / 1e9;
			}
		}
		if (!src)
			src = find_record(b, &fb, span);
		if (r < 0)
			continue;
		rs[r] = (double)bytes / t_restore;
		mc[r] = (double)span / t_copy;
		pr[r] = rs[r] / mc[r];
		printf("round %2d (%s first): restore %.2f GB/s, memcpy %.2f GB/s, ratio %.3f\n", r,
		       r % 2 ? "memcpy" : "restore", rs[r] / 1e9, mc[r] / 1e9, pr[r]);
	}
	CHECK(sfx_page_ok(&fb, pages - 1, cb.tag, pages - 1, false));
	double f = bench_median(rs, R), bm = bench_median(mc, R);
	printf("RESULT pooled_restore_bps %.0f bytes/s (%" PRIu64 " bytes)\n", f, bytes);
	printf("RESULT pooled_memcpy_bps %.0f bytes/s\n", bm);
	printf("RESULT pooled_restore_vs_memcpy %.3f ratio\n", bench_median(pr, R));
	printf("RESULT pooled_restore_vs_memcpy_of_medians %.3f ratio\n", f / bm);
	printf("RESULT pooled_restore_vs_memcpy_p25 %.3f ratio\n", quantile(pr, R, 0.25));
	printf("RESULT pooled_restore_vs_memcpy_p75 %.3f ratio\n", quantile(pr, R, 0.75));
	free(rs);
	free(mc);
	free(pr);
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
