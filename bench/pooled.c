/*
 * bench/pooled.c - restores through the pooled store (store_pooled.h):
 * one `flare pool`, two pool-only stores over host planes (the host copy
 * backend), a 64 MiB record put by A and restored by B, end to end:
 * lookup, claim, each window verified and copied in one pass on the
 * store's helpers, release (bench/restorelib.c, which bench/pool runs
 * too).
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
#include "benchlib.h"
#include "pool_testlib.h"
#include "restorelib.h"

int main(void)
{
	int R = bench_rounds("bench/pooled", 41);
	char *dir = test_mkdtemp("bench-pooled");
	struct mgr_proc m;
	mgr_start(&m, dir, "bench", "--memory", "512MiB", NULL);
	struct bench_restore res;
	bench_pooled_restore(m.sock, R, "bench/pooled", 1, &res);
	double f = bench_median(res.restore_bps, R), bm = bench_median(res.memcpy_bps, R);
	printf("RESULT pooled_restore_bps %.0f bytes/s (%" PRIu64 " bytes)\n", f, res.bytes);
	printf("RESULT pooled_memcpy_bps %.0f bytes/s\n", bm);
	printf("RESULT pooled_restore_vs_memcpy %.3f ratio\n", bench_median(res.ratio, R));
	printf("RESULT pooled_restore_vs_memcpy_of_medians %.3f ratio\n", f / bm);
	printf("RESULT pooled_restore_vs_memcpy_p25 %.3f ratio\n",
	       bench_quantile(res.ratio, R, 0.25));
	printf("RESULT pooled_restore_vs_memcpy_p75 %.3f ratio\n",
	       bench_quantile(res.ratio, R, 0.75));
	bench_restore_free(&res);
	mgr_stop(&m);
	test_rmtree(dir);
	free(dir);
	return 0;
}
