/*
 * policy_split.c - the split point of an overlapped restore (issue 18,
 * "Overlapped restore"; design 2.10's policy extended; docs/architecture.md
 * records the deviation).
 *
 * DESIGN
 *
 * A host hit gains positions [begin, end) over what the GPU holds.  Instead
 * of restoring all of it or recomputing all of it, an overlapped restore
 * recomputes the head [begin, at) on the model stream while the tail's
 * pages [at / P, end / P) and the endpoint row load from the host tier.
 * The request is ready when both are done, so the split minimises
 *
 *     max(H(at), T(at)),  H(at) = sel_policy_prefill_ns(begin, at),
 *                         T(at) = sel_policy_transfer_ns(tail bytes at at)
 *
 * over page boundaries at (the head must end on a page: the pages it
 * computes are whole pages, compared with the stored ones).  H grows and T
 * falls with at, so the best boundary is where they cross: a binary search
 * over page indexes finds the first at with H >= T, and the better of it
 * and the boundary before it wins.  The tail may be the row alone (at the
 * last page boundary at or below end).
 *
 * When to split.  Issue 18: "when a host hit is worth less than recompute
 * alone or about the same".  A hit whose restore is estimated clearly
 * faster than its recompute (below recompute / SPLIT_ABOUT, 1.5, the
 * acceptance's "within 1.5x") is restored plainly: the split's gain there
 * is small against its costs the estimates do not hold (a second lookup,
 * hashing the head's pages).  Otherwise the split is taken when its
 * estimate is below SPLIT_GAIN (0.9) of the better of the two alone.
 *
 * Pure arithmetic on the policy's estimates; one owner, like policy.c.
 */
#include <math.h>
#include <string.h>

#include "selene.h"

#define SPLIT_ABOUT 1.5
#define SPLIT_GAIN 0.9

static double tail_ns(const sel_policy *p, sel_tier tier, uint64_t page_bytes, uint64_t row_bytes,
		      uint64_t pages)
{
	return sel_policy_transfer_ns(p, tier, pages * page_bytes + row_bytes);
}

bool sel_policy_split(const sel_policy *p, sel_tier tier, uint64_t page_bytes, uint64_t row_bytes,
		      uint32_t page_tokens, uint64_t begin, uint64_t end, sel_split *out)
{
	memset(out, 0, sizeof *out);
	if (page_tokens == 0 || end <= begin || tier <= SEL_TIER_NONE || tier >= SEL_TIERS)
		return false;
	uint64_t P = page_tokens, last = end / P; /* pages of the chain at end */
	uint64_t lo = begin / P + 1, hi = last;   /* head ends at k * P, k in [lo, hi] */
	out->restore_ns = tail_ns(p, tier, page_bytes, row_bytes, last - begin / P);
	out->recompute_ns = sel_policy_prefill_ns(p, begin, end);
	if (lo > hi || !isfinite(out->restore_ns))
		return false;
	/* The first k whose head takes at least its tail. */
	uint64_t a = lo, b = hi;
	while (a < b) {
		uint64_t k = a + (b - a) / 2;
		if (sel_policy_prefill_ns(p, begin, k * P) >=
		    tail_ns(p, tier, page_bytes, row_bytes, last - k))
			b = k;
		else
			a = k + 1;
	}
	double best = INFINITY;
	for (uint64_t k = a > lo ? a - 1 : a; k <= a; k++) {
		double h = sel_policy_prefill_ns(p, begin, k * P);
		double t = tail_ns(p, tier, page_bytes, row_bytes, last - k);
		double m = h > t ? h : t;
		if (m < best) {
			best = m;
			out->at = k * P;
			out->head_ns = h;
			out->tail_ns = t;
		}
	}
	out->split_ns = best;
	double alone = out->restore_ns < out->recompute_ns ? out->restore_ns : out->recompute_ns;
	return !(out->restore_ns * SPLIT_ABOUT < out->recompute_ns) && best < SPLIT_GAIN * alone;
}
