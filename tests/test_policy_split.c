/*
 * test_policy_split.c - the split point of an overlapped restore (issue 18;
 * policy_split.c).
 *
 * Covers: with restore and recompute about equal, the split is the page
 * boundary where the head's prefill and the tail's transfer cross (both
 * estimates within a page of each other, the split's estimate their max,
 * about half of either alone) and it is taken; a restore clearly faster
 * than recompute (beyond 1.5x) is not split though a split point exists; a
 * restore somewhat slower than recompute is split when that gains 10%, and
 * not when the best split gains less; spans without a page boundary above
 * their start, unaligned starts, no tier and empty spans.
 */
#include <math.h>

#include "testutil.h"

#define MS 1e6

static sel_policy *fresh(double tokens_per_s)
{
	sel_policy *p;
	CHECK_OK(sel_policy_create(&p));
	sel_policy_set_prefill_rate(p, tokens_per_s);
	return p;
}

int main(void)
{
	/* Prefill 1 ms per token; disk 300 us + 3 GB/s (the initial estimate). */
	sel_policy *p = fresh(1000);
	const uint32_t P = 64;
	const uint64_t row = 1000000;
	sel_split sp;

	/* 100 pages, 6.4 s to recompute; 64 ms per page to load (192 MB): about
	 * equal.  Head k pages: 64k ms; tail (100 - k) pages: 64(100 - k) ms. */
	uint64_t pb = 192000000;
	CHECK(sel_policy_split(p, SEL_TIER_DISK, pb, row, P, 0, 6400, &sp));
	CHECK(sp.at % P == 0 && sp.at > 0 && sp.at < 6400);
	CHECKF(fabs(sp.head_ns - sp.tail_ns) <= 64 * MS, "head %.0f ms tail %.0f ms",
	       sp.head_ns / MS, sp.tail_ns / MS);
	CHECK(sp.split_ns == fmax(sp.head_ns, sp.tail_ns));
	CHECK(fabs(sp.recompute_ns - 6400 * MS) < MS);
	CHECK(fabs(sp.restore_ns - sel_policy_transfer_ns(p, SEL_TIER_DISK, 100 * pb + row)) < 1);
	CHECKF(sp.split_ns < 0.55 * sp.recompute_ns, "split %.0f ms", sp.split_ns / MS);
	printf("about equal: split at %llu of 6400, %.0f ms against %.0f / %.0f ms alone\n",
	       (unsigned long long)sp.at, sp.split_ns / MS, sp.restore_ns / MS,
	       sp.recompute_ns / MS);

	/* Restore 10x faster than recompute: no split, the boundary is still
	 * given. */
	CHECK(!sel_policy_split(p, SEL_TIER_DISK, pb / 10, row, P, 0, 6400, &sp));
	CHECK(sp.at > 0 && sp.restore_ns * 1.5 < sp.recompute_ns);
	/* Just inside 1.5x faster: split (it gains more than 10%). */
	CHECK(sel_policy_split(p, SEL_TIER_DISK, pb * 10 / 14, row, P, 0, 6400, &sp));
	/* Restore 3x slower: the split (k = 75: 4.8 s) beats recompute by more
	 * than 10%. */
	CHECK(sel_policy_split(p, SEL_TIER_DISK, 3 * pb, row, P, 0, 6400, &sp));
	CHECK(sp.split_ns < 0.9 * sp.recompute_ns && sp.at >= 70 * P && sp.at <= 80 * P);
	/* Restore 10x slower: the best split (k about 91) gains under 10%. */
	CHECK(!sel_policy_split(p, SEL_TIER_DISK, 10 * pb, row, P, 0, 6400, &sp));
	CHECK(sp.at >= 88 * P && sp.split_ns >= 0.9 * sp.recompute_ns);

	/* The span starts inside a page: the head ends on a later boundary. */
	CHECK(sel_policy_split(p, SEL_TIER_DISK, pb, row, P, 100, 6400, &sp));
	CHECK(sp.at > 100 && sp.at % P == 0);
	/* Loading is slow and the row is cheap: the tail may be the row alone
	 * (the head ends at the span's last boundary). */
	(void)sel_policy_split(p, SEL_TIER_DISK, 100 * pb, 1000, P, 0, 6400, &sp);
	CHECK(sp.at == 6400 && sp.tail_ns < 1 * MS);
	/* No boundary above the start; empty spans; no tier. */
	CHECK(!sel_policy_split(p, SEL_TIER_DISK, pb, row, P, 10, 60, &sp) && sp.at == 0);
	CHECK(!sel_policy_split(p, SEL_TIER_DISK, pb, row, P, 70, 120, &sp) && sp.at == 0);
	CHECK(!sel_policy_split(p, SEL_TIER_DISK, pb, row, P, 500, 500, &sp));
	CHECK(!sel_policy_split(p, SEL_TIER_NONE, pb, row, P, 0, 6400, &sp));
	CHECK(!sel_policy_split(p, SEL_TIERS, pb, row, P, 0, 6400, &sp));
	CHECK(!sel_policy_split(p, SEL_TIER_DISK, pb, row, 0, 0, 6400, &sp));
	sel_policy_destroy(p);
	printf("ok\n");
	return 0;
}
