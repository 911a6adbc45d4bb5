/*
 * policy.c - the inbound fetch decision and the per-tier transfer rates it
 * uses (design 2.10, "Policy").
 *
 * DESIGN
 *
 * Fetch a hit when its estimated transfer time is below half the estimated
 * prefill time of the tokens it saves:
 *
 *     bytes / rate(tier)  <  (tokens_gained / prefill_rate) / 2
 *
 * evaluated without division as 2 * bytes * prefill < tokens * rate, so a
 * zero rate never divides.  Initial rates are 20 GB/s for memory (20e9 B/s),
 * 3 GB/s for disk (3e9 B/s), 400 MiB/s for the pool and 8,000 tokens/s for
 * prefill.  Each completed transfer at a tier is a sample bytes / ns; the
 * tier's rate becomes the median of its last three samples (with fewer so
 * far: the one sample, or the mean of two -- the median of an even set).
 * Samples of zero duration or zero bytes carry no rate and are ignored, as
 * are non-positive or non-finite prefill rates.  SEL_TIER_NONE has rate 0:
 * nothing is ever fetched from it.
 *
 * Not thread-safe: one owner (the model worker) calls it.
 *
 * INVARIANTS
 *
 *   1. rate[t] > 0 for every real tier and prefill > 0, always finite.
 *   2. n[t] <= 3; ring[t][0..n[t]) are the last n[t] positive samples.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "eos.h"
#include "selene.h"

#define RATE_MEMORY 20e9
#define RATE_DISK 3e9
#define RATE_POOL (400.0 * 1024 * 1024)
#define PREFILL_TOKENS 8000.0

struct sel_policy {
	double rate[SEL_TIERS];
	double ring[SEL_TIERS][3];
	uint32_t n[SEL_TIERS], next[SEL_TIERS];
	double prefill;
};

int sel_policy_create(sel_policy **out)
{
	sel_policy *p = calloc(1, sizeof(*p));
	*out = NULL;
	if (!p)
		return eos_fail(-ENOMEM, "policy: out of memory");
	p->rate[SEL_TIER_NONE] = 0;
	p->rate[SEL_TIER_MEMORY] = RATE_MEMORY;
	p->rate[SEL_TIER_DISK] = RATE_DISK;
	p->rate[SEL_TIER_POOL] = RATE_POOL;
	p->prefill = PREFILL_TOKENS;
	*out = p;
	return 0;
}

void sel_policy_destroy(sel_policy *p)
{
	free(p);
}

static bool real_tier(sel_tier t)
{
	return t > SEL_TIER_NONE && t < SEL_TIERS;
}

bool sel_policy_should_fetch(const sel_policy *p, sel_tier tier, uint64_t bytes,
			     uint64_t tokens_gained)
{
	if (!real_tier(tier) || tokens_gained == 0)
		return false;
	/* bytes / rate < tokens / prefill / 2  <=>  2 * bytes * prefill < tokens * rate */
	return 2.0 * (double)bytes * p->prefill < (double)tokens_gained * p->rate[tier];
}

static double median3(double a, double b, double c)
{
	if (a > b) {
		double t = a;
		a = b;
		b = t;
	}
	/* a <= b */
	if (c <= a)
		return a;
	if (c >= b)
		return b;
	return c;
}

void sel_policy_observe(sel_policy *p, sel_tier tier, uint64_t bytes, uint64_t ns)
{
	if (!real_tier(tier) || ns == 0 || bytes == 0)
		return;
	double r = (double)bytes * 1e9 / (double)ns;
	if (!(r > 0) || !isfinite(r))
		return;
	p->ring[tier][p->next[tier]] = r;
	p->next[tier] = (p->next[tier] + 1) % 3;
	if (p->n[tier] < 3)
		p->n[tier]++;
	const double *s = p->ring[tier];
	switch (p->n[tier]) {
	case 1: p->rate[tier] = s[0]; break;
	case 2: p->rate[tier] = (s[0] + s[1]) / 2; break;
	default: p->rate[tier] = median3(s[0], s[1], s[2]); break;
	}
}

void sel_policy_set_prefill_rate(sel_policy *p, double tokens_per_s)
{
	if (tokens_per_s > 0 && isfinite(tokens_per_s))
		p->prefill = tokens_per_s;
}

double sel_policy_rate(const sel_policy *p, sel_tier tier)
{
	return real_tier(tier) ? p->rate[tier] : 0;
}

double sel_policy_prefill_rate(const sel_policy *p)
{
	return p->prefill;
}
