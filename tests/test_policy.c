/*
 * test_policy.c - the fetch decision and per-tier rates (design 2.10).
 *
 * Covers: the initial rates; decisions over a table of tiers, bytes and
 * tokens on both sides of the break-even point (strictly below half the
 * prefill time); the prefill rate supplied by the caller; the median of the
 * last three samples per tier (one, two, three and rolling samples; tiers
 * independent); ignored zero-duration and zero-byte samples; and the tier
 * without a rate.
 */
#include <math.h>

#include "testutil.h"

#define MiB (1024.0 * 1024.0)

static void test_initial(void)
{
	sel_policy *p;
	CHECK_OK(sel_policy_create(&p));
	CHECK(sel_policy_rate(p, SEL_TIER_MEMORY) == 20e9);
	CHECK(sel_policy_rate(p, SEL_TIER_DISK) == 3e9);
	CHECK(sel_policy_rate(p, SEL_TIER_POOL) == 400 * MiB);
	CHECK(sel_policy_rate(p, SEL_TIER_NONE) == 0);
	CHECK(sel_policy_rate(p, SEL_TIERS) == 0);
	CHECK(sel_policy_prefill_rate(p) == 8000);
	sel_policy_destroy(p);
	sel_policy_destroy(NULL);
}

struct decision {
	sel_tier tier;
	double rate;        /* tier rate to set up (0: initial) */
	double prefill;     /* tokens/s (0: initial) */
	uint64_t bytes, tokens;
	bool want;
};

static void test_decisions(void)
{
	/* Break-even: bytes / rate == tokens / prefill / 2.
	 * Memory 20e9 B/s, prefill 8000 tok/s: 8000 tokens take 1 s to prefill,
	 * so fetching is worth it below 0.5 s = 10e9 bytes. */
	const struct decision table[] = {
		{SEL_TIER_MEMORY, 0, 0, 10000000000ull - 1, 8000, true},
		{SEL_TIER_MEMORY, 0, 0, 10000000000ull, 8000, false}, /* equal: not below */
		{SEL_TIER_MEMORY, 0, 0, 1 << 20, 64, true},           /* 52 us vs 4 ms */
		{SEL_TIER_MEMORY, 0, 0, 1 << 20, 0, false},           /* nothing gained */
		{SEL_TIER_MEMORY, 0, 0, 0, 1, true},                  /* free */
		/* Disk 3e9: 64 tokens = 8 ms prefill, 4 ms budget = 12e6 bytes. */
		{SEL_TIER_DISK, 0, 0, 12000000 - 1, 64, true},
		{SEL_TIER_DISK, 0, 0, 12000000, 64, false},
		/* Pool 400 MiB/s: 8000 tokens, 0.5 s budget = 200 MiB. */
		{SEL_TIER_POOL, 0, 0, (uint64_t)(200 * MiB) - 1, 8000, true},
		{SEL_TIER_POOL, 0, 0, (uint64_t)(200 * MiB), 8000, false},
		/* A faster prefill shrinks the budget: 80,000 tok/s, 8000 tokens =
		 * 0.1 s, half 0.05 s at 20e9 = 1e9 bytes. */
		{SEL_TIER_MEMORY, 0, 80000, 1000000000ull - 1, 8000, true},
		{SEL_TIER_MEMORY, 0, 80000, 1000000000ull, 8000, false},
		/* A measured slow memory tier: 1e9 B/s, 8000 tokens at 8000 tok/s,
		 * budget 0.5e9 bytes. */
		{SEL_TIER_MEMORY, 1e9, 0, 500000000ull - 1, 8000, true},
		{SEL_TIER_MEMORY, 1e9, 0, 500000000ull + 1, 8000, false},
		/* No tier, or an invalid one: never. */
		{SEL_TIER_NONE, 0, 0, 1, 1000000, false},
		{SEL_TIERS, 0, 0, 1, 1000000, false},
	};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		const struct decision *d = &table[i];
		sel_policy *p;
		CHECK_OK(sel_policy_create(&p));
		if (d->prefill)
			sel_policy_set_prefill_rate(p, d->prefill);
		if (d->rate)
			/* One sample sets the rate exactly. */
			sel_policy_observe(p, d->tier, (uint64_t)d->rate, 1000000000ull);
		if (d->rate)
			CHECKF(sel_policy_rate(p, d->tier) == d->rate, "row %zu", i);
		bool got = sel_policy_should_fetch(p, d->tier, d->bytes, d->tokens);
		CHECKF(got == d->want, "row %zu: tier %d bytes %" PRIu64 " tokens %" PRIu64 " got %d", i,
		       d->tier, d->bytes, d->tokens, got);
		sel_policy_destroy(p);
	}
}

static void test_prefill_rate(void)
{
	sel_policy *p;
	CHECK_OK(sel_policy_create(&p));
	sel_policy_set_prefill_rate(p, 12345.5);
	CHECK(sel_policy_prefill_rate(p) == 12345.5);
	sel_policy_set_prefill_rate(p, 0);        /* ignored */
	sel_policy_set_prefill_rate(p, -5);       /* ignored */
	sel_policy_set_prefill_rate(p, NAN);      /* ignored */
	sel_policy_set_prefill_rate(p, INFINITY); /* ignored */
	CHECK(sel_policy_prefill_rate(p) == 12345.5);
	sel_policy_destroy(p);
}

/* A sample of `rate` bytes per second (1 ms transfers). */
static void observe_rate(sel_policy *p, sel_tier t, double rate)
{
	sel_policy_observe(p, t, (uint64_t)(rate / 1000), 1000000);
}

static void test_median(void)
{
	sel_policy *p;
	CHECK_OK(sel_policy_create(&p));
	const sel_tier t = SEL_TIER_DISK;

	observe_rate(p, t, 1e9);
	CHECK(sel_policy_rate(p, t) == 1e9); /* one sample */
	observe_rate(p, t, 3e9);
	CHECK(sel_policy_rate(p, t) == 2e9); /* two: their mean */
	observe_rate(p, t, 10e9);
	CHECK(sel_policy_rate(p, t) == 3e9); /* median of 1, 3, 10 */
	observe_rate(p, t, 2e9);
	CHECK(sel_policy_rate(p, t) == 3e9); /* last three: 3, 10, 2 */
	observe_rate(p, t, 4e9);
	CHECK(sel_policy_rate(p, t) == 4e9); /* 10, 2, 4 */
	observe_rate(p, t, 5e9);
	CHECK(sel_policy_rate(p, t) == 4e9); /* 2, 4, 5 */
	observe_rate(p, t, 0.5e9);
	observe_rate(p, t, 0.25e9);
	CHECK(sel_policy_rate(p, t) == 0.5e9); /* 5, 0.5, 0.25 */

	/* Ignored: zero duration, zero bytes. */
	sel_policy_observe(p, t, 1000, 0);
	sel_policy_observe(p, t, 0, 1000);
	CHECK(sel_policy_rate(p, t) == 0.5e9);
	/* Other tiers are independent and keep their initial rates. */
	CHECK(sel_policy_rate(p, SEL_TIER_MEMORY) == 20e9);
	CHECK(sel_policy_rate(p, SEL_TIER_POOL) == 400 * MiB);
	/* Samples for no tier change nothing. */
	sel_policy_observe(p, SEL_TIER_NONE, 1000, 1000);
	CHECK(sel_policy_rate(p, SEL_TIER_NONE) == 0);

	/* The decision follows the measured rate: 64 tokens at 8000 tok/s is
	 * 8 ms, budget 4 ms at 0.5e9 B/s = 2e6 bytes. */
	CHECK(sel_policy_should_fetch(p, t, 2000000 - 1, 64));
	CHECK(!sel_policy_should_fetch(p, t, 2000000, 64));

	/* Memory rate from real-looking samples: 1 GiB in 50, 60, 55 ms. */
	sel_policy_observe(p, SEL_TIER_MEMORY, 1ull << 30, 50000000);
	sel_policy_observe(p, SEL_TIER_MEMORY, 1ull << 30, 60000000);
	sel_policy_observe(p, SEL_TIER_MEMORY, 1ull << 30, 55000000);
	CHECK(fabs(sel_policy_rate(p, SEL_TIER_MEMORY) - (double)(1ull << 30) / 0.055) < 1);
	sel_policy_destroy(p);
}

int main(void)
{
	test_initial();
	test_decisions();
	test_prefill_rate();
	test_median();
	printf("test_policy: ok\n");
	return 0;
}
