/*
 * policy.c - the inbound fetch decision and the per-tier transfer estimates
 * it uses (design 2.10, "Policy"; docs/architecture.md records how this
 * departs from the design's rate model).
 *
 * DESIGN
 *
 * A transfer costs a fixed time plus its bytes over the tier's bandwidth:
 *
 *     t(b) = fixed[tier] + b * per_byte[tier]
 *
 * The fixed part is what a transfer costs whatever its size: the store's
 * submission, waking a copy or disk thread, opening and verifying a record
 * file, the completion reaching the worker's next poll.  Bytes / time of
 * one transfer, the design's sample, measures the fixed part for small
 * records and the bandwidth for large ones, so after tiny records a tier
 * looks slow for everything (84 MB/s measured from disk, where large reads
 * run at GB/s) and large restores are recomputed.  Fitting both parameters
 * keeps each record size's estimate right.
 *
 * A hit is fetched when its estimated transfer time is below the estimated
 * prefill time of the tokens it saves, tokens / prefill rate.  The design's
 * factor of one half was margin for estimates that ignore the fixed cost;
 * with the fixed cost fitted, that margin only makes the policy recompute
 * hits that restore up to twice as fast (bench/policy measures the choice).
 *
 * Estimation.  Each tier keeps its last SAMPLES completed transfers that
 * moved pages (bytes, ns); failed transfers and row-only restores are not
 * samples (design 2.15), nor are transfers of zero bytes or zero time.
 * After each sample both parameters are refitted from those samples by
 * weighted medians (the design's "median of the last three" applied to each
 * parameter):
 *
 *   per_byte: the weighted median, over pairs of samples whose sizes differ
 *     at least SPREAD times, of the pair's slope (t_j - t_i) / (b_j - b_i),
 *     each weighted by (b_j - b_i) / (T(b_i) + T(b_j)), where T is the
 *     current estimate.  A transfer's noise grows with its time, so that
 *     weight is the inverse of the slope's error: two small records a few
 *     KiB apart say almost nothing about bandwidth and weigh almost
 *     nothing, while a pair spanning a large record decides it.  This is
 *     the Theil-Sen line estimator with Sievers' weights.  The weights come
 *     from the estimate, not from the observed times, so that fast samples
 *     do not outweigh slow ones: a tier that became slower is followed once
 *     nine of the sixteen samples show it.  Why sixteen samples and not
 *     three: a slope needs two samples, and with three one bad sample (a
 *     cold first read, a transfer stalled behind a busy disk) is in two of
 *     the three pairs and owns their median; with sixteen it is in 15 of
 *     120 pairs.  Sixteen rather than eight because stalls come in bursts
 *     on a loaded machine: bench/policy picked the faster path in 0.88 and
 *     0.95 of its decisions with eight, 0.98 and 0.95 with sixteen, in
 *     runs of the same seeds on a machine at load 5-10.  A
 *     median slope that is not positive (times that fall with size: noise
 *     around a fixed cost) keeps the previous per_byte.
 *   fixed: the weighted median of the residuals t_k - per_byte * b_k of
 *     the latest FIXED_RECENT (7) samples that can measure it (the current
 *     fixed cost at least FIXED_SHARE, a quarter, of their estimate; all
 *     samples when none is), each weighted by 1 / T(b_k) (small transfers
 *     pin the fixed cost down best), never below 0.  Why the latest seven
 *     and not all sixteen: the fixed cost is the part that load changes (a
 *     copy or disk thread waiting for a core, a busy device), and it
 *     changes in bursts.  bench/policy saw memory restores of 20-260 KiB
 *     records stall 2-7 ms for the first dozen (their copy thread, at
 *     SCHED_BATCH and nice 10 then, waiting for a scheduler tick while other
 *     jobs held both cores); with the fixed cost fitted to all sixteen,
 *     nine stalled samples made it 1.3-2.9 ms, the small records were then
 *     recomputed and so never measured again, and the estimate stayed
 *     there for the rest of the run (decisions up to 10-17x slower than
 *     restoring), though 1 MiB restores in 0.2 ms were observed meanwhile.
 *     Fitted to the latest seven, four quiet transfers bring it back, and
 *     a load that persists (four of seven slow) is followed as quickly.
 *     Five was tried: two slow small samples of five (their weights are
 *     the largest) owned the median, so one stall in eight samples moved
 *     the estimate tenfold (tests/test_policy.c test_outliers).
 *     The bandwidth, a property of the hardware, keeps all sixteen.
 *     The bound: the fixed cost is at most the plain median of the
 *     residuals t_k - per_byte * b_k of the samples whose bytes take at
 *     most BOUND_SPAN (4) times it, of any age among the sixteen.  Load
 *     only ever adds time (a transfer is never faster than its fixed cost
 *     plus its bytes), so when half of those samples, larger ones
 *     included, completed faster than the fixed cost allows, it is too
 *     high.  (Larger samples cannot tell: a 1% error in per_byte moves a
 *     1 GiB transfer's residual by 2 ms.)  Why it
 *     is needed: a burst of stalls among small records (bench/policy at
 *     load 6-10: 21-30 KiB memory restores 3-36 ms, against 0.04-0.07 ms
 *     between bursts) set the fixed cost to 2-4 ms, small hits were then
 *     recomputed and so never measured again, and the estimate stayed
 *     there while 0.5-1 MiB restores of 0.3-0.5 ms showed it wrong.  A
 *     load that persists (more than half the samples slow) keeps it.
 *
 *   Held back: the newest sample alone never makes a tier slower.  After
 *     each sample both parameters are fitted twice, with and without the
 *     newest, and the fit that expects the newest sample's bytes sooner is
 *     kept.  The next sample confirms a slow one (the fit without the
 *     newest then holds the earlier one) or outvotes it: a tier that slowed
 *     is followed one sample late, whatever the rule that moves it.  Why:
 *     a hit the estimate makes look slower than its prefill is recomputed
 *     and never measured again, so one stalled transfer can lock a tier
 *     out.  bench/policy (deepseek band, load 2-4) restored a 511 MiB
 *     record from memory in 439 ms as the tier's first transfer, against
 *     210-270 ms in every later pass: larger than both seeds, it owned the
 *     slope's median (1.2 GB/s), 1 GiB was estimated at 881 ms against a
 *     700 ms recompute, and the band's memory hits were recomputed for
 *     three passes though they restored in 415 ms.  The cost: a tier that
 *     truly became slower is followed one sample later (test_adapts), and
 *     one restore more is fetched at the old estimate.
 *
 *   tests/test_policy.c holds the properties: both parameters recovered
 *   from an exact line; one slow sample in eight, or two (unless they are
 *   the only small ones), moving no estimate by more than 10-15%.
 *
 * While no pair spans SPREAD (a workload whose records are all about one
 * size), the samples cannot separate the two parameters.  Then the part
 * that dominates the current estimate at the samples' median size is
 * fitted to them and the other kept: the fixed cost for records it
 * dominates, per_byte otherwise.  The estimate then matches the observed
 * transfers at their own size, and a later record of another size is
 * estimated from the kept part, which is the best evidence there is.
 *
 * Initial estimates: the design's rates, 20 GB/s for memory (20e9 B/s),
 * 3 GB/s for disk, 400 MiB/s for the pool and 8,000 tokens/s for prefill,
 * with fixed costs of 50 us for memory, 300 us for disk and 1 ms for the
 * pool.  They enter the ring as SEEDS samples the initial estimate predicts
 * (1 MiB and 256 MiB).  So a first transfer that went badly (a cold first
 * read at 6.7 MB/s was measured) is one sample against two, and cannot by
 * itself make the tier look so slow that it is never fetched from, and so
 * never measured, again.
 *
 * Seeds: each seed stands for one parameter and leaves the ring as soon
 * as measured samples can fit that parameter themselves (otherwise real
 * samples push it out after SAMPLES - SEEDS transfers).  The 256 MiB seed
 * (SEED_RATE) pins the bandwidth: it goes once SEED_UNTIL (3, the design's
 * "last three") measured samples include two SPREAD apart in size.  The 1
 * MiB seed (SEED_FIXED) pins the fixed cost: it goes once SEED_UNTIL
 * measured samples can measure the fixed cost (it is at least FIXED_SHARE
 * of their estimate).  Why: a seed is not a measurement.  The 256 MiB one
 * had the largest weight of every pair it was in (its bytes span), so
 * while it stayed it held the slope at the initial rate, and a workload
 * of small records had its bytes' cost folded into the fixed cost:
 * bench/policy's tiny band has disk records of 21 KiB to 1 MiB (8.5 KiB
 * pages, whose restores include per-page work and the model's page loads,
 * far slower per byte than the device's 3 GB/s), and stop 25's quiet run
 * estimated a 132 KiB record that restores in 1.44 ms at 2.27 ms and
 * recomputed it.  tests/test_policy.c test_seed_out shows the mechanism
 * on an exact line of 1 ms + 0.5 GB/s: samples of 259 KiB to 1 MiB left
 * the 132 KiB estimate 17% high with the seed, exact without it.
 * The other way round, records that are all large cannot measure the
 * fixed cost, so its seed stays: with both seeds gone after three stalled
 * large memory restores (bench/policy's deepseek band at load 10) the fit
 * was 220 ms + 5.4 GB/s and 128 MiB records that restore in 81 ms were
 * recomputed for the rest of the band.  Records all within SPREAD of each
 * other keep the rate seed: they cannot tell the two parameters apart
 * (test_small_records).  The held-back fit without the newest sample
 * keeps the seeds the newest would retire.
 *
 * Once a measured sample is in the ring the two seeds' own pair is no
 * slope: it is the initial line, not a measurement, and seeds then vote
 * only through their pairs with measured samples.  Why: qualify's
 * fetch-choice on disk (stop 30, a quiet machine) restored Qwen TP1
 * records of 116.6 MiB in 87-89 ms (1.4 GB/s), and the third was still
 * estimated at the initial 3 GB/s (41 ms) and restored, 1.6x slower than
 * recomputing: the held-back fit without the newest sample held one
 * measured sample, whose pair with the 1 MiB seed the seeds' own pair
 * outweighed by 2%, so two agreeing restores moved nothing
 * (tests/test_policy.c test_two_agree).  Halving every seed's weight
 * instead made the first cold small disk reads of bench/policy's tiny
 * band count for more (a 132 KiB record recomputed at 1.55x); leaving out
 * the pair met the acceptance in all three seeds (docs/performance.md,
 * stop 30).
 *
 * Prefill time by position.  What a declined hit costs is the prefill of
 * the tokens it would have restored, at their positions: a token's cost is
 * a constant (the weights) plus a part that grows with the context it
 * attends over, so a chunk at position x costs about n * (c + d * x) and
 * the span [g, h) about (h - g) * (c + d * (g + h) / 2).  One rate cannot
 * follow that: bench/policy measured the synthetic deepseek-small 3-5x
 * slower per token at 45K than at 1-3K, so a rate measured on short
 * prompts underestimated long recomputes (and restores of them were
 * declined) and overestimated short ones.  The worker reports every
 * prefill chunk it ran (sel_policy_observe_prefill: positions and time);
 * chunks of fewer than PF_MIN_TOKENS tokens (decode-like steps, whose
 * per-call cost dominates) are no samples.  A chunk's cost per token is
 * kept in a bucket by log2 of its middle position, each the median of its
 * last PF_KEEP (the design's "median of the last three", applied per
 * position band), so that a long prompt's hundreds of chunks at one
 * position do not push out what was learned at others; c and d are
 * fitted over the buckets' medians as the transfer line is (weighted
 * Theil-Sen slope over pairs of buckets at least SPREAD apart, d never
 * below 0; c the weighted median residual).  With one bucket only, d is
 * kept and c fitted.  sel_policy_set_prefill_rate sets a flat estimate (c
 * = 1 / rate, d = 0) and forgets the chunks: for callers that measure a
 * rate themselves, and the initial 8,000 tokens/s.
 *
 * The load.  Medians give a chunk's typical cost, but a recompute is the
 * sum of many chunks, and on a loaded machine some of them stall (the
 * worker descheduled for a scheduler tick or more: bench/policy saw a
 * third of deepseek-small's 256-token chunks take 5-10x the others at
 * load 7-9), so the sum is the mean cost times the chunks, and a
 * recompute estimated from medians alone came out at a third of the
 * measured one.  So the estimate of a span is the medians' line times the
 * recent ratio of actual to expected chunk time (decayed sums over about
 * the last 64 chunks, PF_DECAY; clamped to [PF_LOAD_MIN, PF_LOAD_MAX]):
 * the shape from the robust medians, the level from every chunk.  A
 * quiet machine keeps it near 1.
 *
 * Non-positive or non-finite prefill rates are ignored.  SEL_TIER_NONE
 * transfers nothing: nothing is ever fetched from it.
 *
 * Not thread-safe: one owner (the model worker) calls it.
 *
 * INVARIANTS
 *
 *   1. For every real tier per_byte[t] >= 1 / MAX_RATE and fixed[t] >= 0,
 *      both finite; prefill > 0 and finite.
 *   2. 1 <= n[t] <= SAMPLES; the ring holds the last n[t] samples in
 *      arrival order, each with bytes > 0 and ns > 0, among them at most
 *      one seed of each role (until pushed out or retired: DESIGN,
 *      "Seeds").
 *   3. pf.c > 0 and pf.d >= 0, both finite; every bucket holds at most
 *      PF_KEEP samples, each with y > 0, all in its log2 position band;
 *      pf.act, pf.pred >= 0, and the load factor is within
 *      [PF_LOAD_MIN, PF_LOAD_MAX] (1 before any chunk).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "selene.h"

#define RATE_MEMORY 20e9
#define RATE_DISK 3e9
#define RATE_POOL (400.0 * 1024 * 1024)
#define FIXED_MEMORY 50e3 /* ns */
#define FIXED_DISK 300e3
#define FIXED_POOL 1e6
#define PREFILL_TOKENS 8000.0

#define SAMPLES 16
#define PAIRS (SAMPLES * (SAMPLES - 1) / 2)
#define SPREAD 2.0
#define MAX_RATE 1e12 /* bytes/s: no tier is faster, so per_byte never reaches 0 */
#define SEEDS 2
#define SEED_UNTIL 3     /* measured samples that retire a seed (DESIGN, "Seeds") */
#define SEED_FIXED 1     /* the small seed: it pins the fixed cost */
#define SEED_RATE 2      /* the large seed: it pins the bandwidth */
#define FIXED_RECENT 7   /* samples the fixed cost is fitted to, the latest ... */
#define FIXED_SHARE 0.25 /* ... of those whose estimate it is this share of */
#define BOUND_SPAN 4.0   /* the bound's samples: bytes' time at most this x the fixed cost */
static const uint64_t seed_bytes[SEEDS] = {1ull << 20, 256ull << 20};
static const int seed_role[SEEDS] = {SEED_FIXED, SEED_RATE};

struct sample {
	double bytes, ns;
	int seed; /* 0: measured; else the seed's role, SEED_FIXED or SEED_RATE */
};

struct tier_est {
	double fixed;    /* ns per transfer */
	double per_byte; /* ns per byte */
	struct sample ring[SAMPLES];
	uint32_t n, next;
};

#define PF_BUCKETS 48 /* log2 of a chunk's middle position */
#define PF_KEEP 3
#define PF_MIN_TOKENS 16
#define PF_DECAY (1.0 / 64) /* the load follows about the last 64 chunks */
#define PF_LOAD_MIN 0.5
#define PF_LOAD_MAX 20.0

struct pf_bucket {
	double x[PF_KEEP], y[PF_KEEP]; /* middle position, ns per token */
	uint32_t n, next;
};

struct prefill_est {
	double c, d;      /* ns per token at position 0; ns per token per position */
	double act, pred; /* decayed sums of chunk times and of their estimates */
	struct pf_bucket b[PF_BUCKETS];
};

struct sel_policy {
	struct tier_est t[SEL_TIERS];
	struct prefill_est pf;
};

int sel_policy_create(sel_policy **out)
{
	sel_policy *p = calloc(1, sizeof(*p));
	*out = NULL;
	if (!p)
		return eos_fail(-ENOMEM, "policy: out of memory");
	static const double rate[SEL_TIERS] = {
		[SEL_TIER_MEMORY] = RATE_MEMORY,
		[SEL_TIER_DISK] = RATE_DISK,
		[SEL_TIER_POOL] = RATE_POOL,
		[SEL_TIER_REMOTE] = RATE_POOL}; /* design 2.10: remote 400 MiB/s */
	static const double fixed[SEL_TIERS] = {[SEL_TIER_MEMORY] = FIXED_MEMORY,
						[SEL_TIER_DISK] = FIXED_DISK,
						[SEL_TIER_POOL] = FIXED_POOL,
						[SEL_TIER_REMOTE] = FIXED_POOL};
	for (int t = SEL_TIER_MEMORY; t < SEL_TIERS; t++) {
		struct tier_est *e = &p->t[t];
		e->fixed = fixed[t];
		e->per_byte = 1e9 / rate[t];
		for (uint32_t k = 0; k < SEEDS; k++) {
			double b = (double)seed_bytes[k];
			e->ring[k] = (struct sample){b, e->fixed + b * e->per_byte, seed_role[k]};
		}
		e->n = e->next = SEEDS;
	}
	p->pf.c = 1e9 / PREFILL_TOKENS;
	*out = p;
	return 0;
}

void sel_policy_destroy(sel_policy *p) { free(p); }

static bool real_tier(sel_tier t) { return t > SEL_TIER_NONE && t < SEL_TIERS; }

double sel_policy_transfer_ns(const sel_policy *p, sel_tier tier, uint64_t bytes)
{
	if (!real_tier(tier))
		return INFINITY;
	return p->t[tier].fixed + (double)bytes * p->t[tier].per_byte;
}

bool sel_policy_should_fetch(const sel_policy *p, sel_tier tier, uint64_t bytes,
			     uint64_t tokens_gained)
{
	return sel_policy_should_fetch_span(p, tier, bytes, 0, tokens_gained);
}

/* Actual over estimated chunk time, recently (DESIGN, "load"). */
static double pf_load(const struct prefill_est *e)
{
	if (!(e->pred > 0))
		return 1;
	double f = e->act / e->pred;
	return f < PF_LOAD_MIN ? PF_LOAD_MIN : f > PF_LOAD_MAX ? PF_LOAD_MAX : f;
}

double sel_policy_prefill_ns(const sel_policy *p, uint64_t begin, uint64_t end)
{
	if (end <= begin)
		return 0;
	double n = (double)(end - begin), mid = ((double)begin + (double)end) / 2;
	return n * (p->pf.c + p->pf.d * mid) * pf_load(&p->pf);
}

bool sel_policy_should_fetch_span(const sel_policy *p, sel_tier tier, uint64_t bytes,
				  uint64_t begin, uint64_t end)
{
	if (!real_tier(tier) || end <= begin)
		return false;
	return sel_policy_transfer_ns(p, tier, bytes) < sel_policy_prefill_ns(p, begin, end);
}

/* ---- fitting ----------------------------------------------------------------- */

struct wv {
	double v, w;
};

static int wv_cmp(const void *a, const void *b)
{
	double x = ((const struct wv *)a)->v, y = ((const struct wv *)b)->v;
	return x < y ? -1 : x > y;
}

/* The weighted median of v[0..n) (n >= 1, weights > 0): the smallest value
 * at which the weight at or below it reaches half the total.  Sorts v. */
static double wmedian(struct wv *v, int n)
{
	double total = 0, acc = 0;
	qsort(v, (size_t)n, sizeof(*v), wv_cmp);
	for (int i = 0; i < n; i++)
		total += v[i].w;
	for (int i = 0; i < n; i++) {
		acc += v[i].w;
		if (acc >= total / 2)
			return v[i].v;
	}
	return v[n - 1].v;
}

/* The time the current estimate expects of b bytes: the scale of a
 * sample's noise, and so of the weights. */
static double expect(const struct tier_est *e, double b) { return e->fixed + e->per_byte * b; }

/* The fixed cost from the latest FIXED_RECENT samples that can measure
 * it (DESIGN, fixed), or from all when none can. */
static double fit_fixed(const struct tier_est *e, const double *scale)
{
	struct wv r[SAMPLES];
	uint32_t m = 0;
	for (uint32_t k = 0; k < e->n && m < FIXED_RECENT; k++) {
		uint32_t i = (e->next + SAMPLES - 1 - k) % SAMPLES;
		if (e->fixed >= FIXED_SHARE * scale[i])
			r[m++] = (struct wv){e->ring[i].ns - e->per_byte * e->ring[i].bytes,
					     1 / scale[i]};
	}
	if (m == 0)
		for (uint32_t i = 0; i < e->n; i++)
			r[m++] = (struct wv){e->ring[i].ns - e->per_byte * e->ring[i].bytes,
					     1 / scale[i]};
	double c = wmedian(r, (int)m);
	/* No transfer is faster than its fixed cost plus its bytes: the
	 * median residual of the samples that can tell bounds it (DESIGN). */
	m = 0;
	for (uint32_t i = 0; i < e->n; i++)
		if (e->per_byte * e->ring[i].bytes <= BOUND_SPAN * c)
			r[m++] = (struct wv){e->ring[i].ns - e->per_byte * e->ring[i].bytes, 1};
	double u = m ? wmedian(r, (int)m) : c;
	if (u > 0 && u < c)
		c = u;
	return c > 0 ? c : 0;
}

static void set_per_byte(struct tier_est *e, double s)
{
	if (s > 0 && isfinite(s))
		e->per_byte = s > 1e9 / MAX_RATE ? s : 1e9 / MAX_RATE;
}

static void fit(struct tier_est *e)
{
	struct wv v[PAIRS > SAMPLES ? PAIRS : SAMPLES];
	double scale[SAMPLES] = {0}; /* the first e->n are set below (invariant 2) */
	int np = 0;
	bool measured = false;
	for (uint32_t k = 0; k < e->n; k++) {
		scale[k] = expect(e, e->ring[k].bytes);
		measured |= !e->ring[k].seed;
	}
	for (uint32_t i = 0; i < e->n; i++)
		for (uint32_t j = 0; j < e->n; j++) {
			const struct sample *a = &e->ring[i], *b = &e->ring[j];
			if (b->bytes < SPREAD * a->bytes || (measured && a->seed && b->seed))
				continue;
			double db = b->bytes - a->bytes;
			v[np++] = (struct wv){(b->ns - a->ns) / db, db / (scale[i] + scale[j])};
		}
	if (np > 0) {
		set_per_byte(e, wmedian(v, np));
		e->fixed = fit_fixed(e, scale);
		return;
	}

	/* All samples within SPREAD of each other: fit the dominant part. */
	for (uint32_t k = 0; k < e->n; k++)
		v[k] = (struct wv){e->ring[k].bytes, 1};
	double size = wmedian(v, (int)e->n);
	if (e->fixed < e->per_byte * size) {
		for (uint32_t k = 0; k < e->n; k++)
			v[k] = (struct wv){(e->ring[k].ns - e->fixed) / e->ring[k].bytes,
					   1 / scale[k]};
		double s = wmedian(v, (int)e->n);
		if (s > 0) {
			set_per_byte(e, s);
			return;
		}
		/* Faster than the fixed cost alone: that is what is wrong. */
	}
	e->fixed = fit_fixed(e, scale);
}

/* Keep e's samples but the newest `but_last` and the seed of role `drop`
 * (0: none), oldest first from ring[0]. */
static void compact(struct tier_est *e, uint32_t but_last, int drop)
{
	struct sample keep[SAMPLES];
	uint32_t m = 0, oldest = (e->next + SAMPLES - e->n) % SAMPLES;
	for (uint32_t k = 0; k + but_last < e->n; k++) {
		const struct sample *x = &e->ring[(oldest + k) % SAMPLES];
		if (!drop || x->seed != drop)
			keep[m++] = *x;
	}
	memcpy(e->ring, keep, m * sizeof keep[0]);
	e->n = m;
	e->next = m % SAMPLES;
}

/* The fit of e's samples but the newest, from the estimate e has now. */
static void fit_but_newest(struct tier_est *e)
{
	compact(e, 1, 0);
	fit(e);
}

/* Whether the measured samples now fit the part the seed of `role` stands
 * for (DESIGN, "Seeds"): the bandwidth when SEED_UNTIL of them include two
 * SPREAD apart, the fixed cost when SEED_UNTIL of them can measure it. */
static bool seed_done(const struct tier_est *e, int role)
{
	uint32_t real = 0, fixed_ok = 0;
	bool held = false;
	double lo = INFINITY, hi = 0;
	for (uint32_t i = 0; i < e->n; i++) {
		const struct sample *x = &e->ring[i];
		if (x->seed) {
			held |= x->seed == role;
			continue;
		}
		real++;
		lo = x->bytes < lo ? x->bytes : lo;
		hi = x->bytes > hi ? x->bytes : hi;
		fixed_ok += e->fixed >= FIXED_SHARE * expect(e, x->bytes);
	}
	if (!held)
		return false;
	return role == SEED_RATE ? real >= SEED_UNTIL && hi >= SPREAD * lo : fixed_ok >= SEED_UNTIL;
}

void sel_policy_observe(sel_policy *p, sel_tier tier, uint64_t bytes, uint64_t ns, uint32_t pages)
{
	if (!real_tier(tier) || ns == 0 || bytes == 0 || pages == 0)
		return;
	struct tier_est *e = &p->t[tier];
	e->ring[e->next] = (struct sample){(double)bytes, (double)ns, 0};
	e->next = (e->next + 1) % SAMPLES;
	if (e->n < SAMPLES)
		e->n++;
	/* One sample alone does not make a tier slower (DESIGN, "held
	 * back"): of the fits with and without the newest sample, the one
	 * that expects the newest's bytes sooner.  Without it, the seeds it
	 * would let go stay. */
	struct tier_est without = *e;
	fit_but_newest(&without);
	for (int role = SEED_FIXED; role <= SEED_RATE; role++)
		if (seed_done(e, role))
			compact(e, 0, role);
	fit(e);
	if (expect(&without, (double)bytes) < expect(e, (double)bytes)) {
		e->fixed = without.fixed;
		e->per_byte = without.per_byte;
	}
}

void sel_policy_set_prefill_rate(sel_policy *p, double tokens_per_s)
{
	if (!(tokens_per_s > 0 && isfinite(tokens_per_s)))
		return;
	memset(&p->pf, 0, sizeof p->pf);
	p->pf.c = 1e9 / tokens_per_s;
}

static double med_of(const double *v, uint32_t n)
{
	struct wv t[PF_KEEP];
	for (uint32_t i = 0; i < n; i++)
		t[i] = (struct wv){v[i], 1};
	return wmedian(t, (int)n);
}

/* Refit c and d over the buckets' medians (DESIGN, prefill time). */
static void fit_prefill(struct prefill_est *e)
{
	double X[PF_BUCKETS], Y[PF_BUCKETS];
	int m = 0;
	for (int i = 0; i < PF_BUCKETS; i++)
		if (e->b[i].n) {
			X[m] = med_of(e->b[i].x, e->b[i].n);
			Y[m] = med_of(e->b[i].y, e->b[i].n);
			m++;
		}
	struct wv v[PF_BUCKETS * PF_BUCKETS / 2 + PF_BUCKETS];
	int np = 0;
	for (int i = 0; i < m; i++)
		for (int j = i + 1; j < m; j++) {
			double dx = X[j] - X[i];
			if (X[j] < SPREAD * X[i] || dx <= 0)
				continue;
			double ei = e->c + e->d * X[i], ej = e->c + e->d * X[j];
			v[np++] = (struct wv){(Y[j] - Y[i]) / dx, dx / (ei + ej)};
		}
	if (np > 0) {
		double d = wmedian(v, np);
		e->d = d > 0 && isfinite(d) ? d : 0;
	}
	for (int k = 0; k < m; k++)
		v[k] = (struct wv){Y[k] - e->d * X[k], 1 / (e->c + e->d * X[k])};
	double c = wmedian(v, m);
	/* Never free: at least a hundredth of the cheapest bucket's cost. */
	double floor = INFINITY;
	for (int k = 0; k < m; k++)
		floor = Y[k] / 100 < floor ? Y[k] / 100 : floor;
	e->c = c > floor ? c : floor;
}

void sel_policy_observe_prefill(sel_policy *p, uint64_t begin, uint64_t end, uint64_t ns)
{
	if (end < begin + PF_MIN_TOKENS || ns == 0)
		return;
	double n = (double)(end - begin), x = ((double)begin + (double)end) / 2;
	double y = (double)ns / n;
	if (!isfinite(y) || !(y > 0))
		return;
	uint64_t xi = (uint64_t)x + 1;
	int k = 63 - __builtin_clzll(xi);
	if (k >= PF_BUCKETS)
		k = PF_BUCKETS - 1;
	struct pf_bucket *b = &p->pf.b[k];
	/* The load: this chunk against what the medians expect of it, where
	 * its position band has been measured. */
	if (b->n) {
		p->pf.act = p->pf.act * (1 - PF_DECAY) + (double)ns;
		p->pf.pred = p->pf.pred * (1 - PF_DECAY) + n * (p->pf.c + p->pf.d * x);
	}
	b->x[b->next] = x;
	b->y[b->next] = y;
	b->next = (b->next + 1) % PF_KEEP;
	if (b->n < PF_KEEP)
		b->n++;
	fit_prefill(&p->pf);
}

double sel_policy_rate(const sel_policy *p, sel_tier tier)
{
	return real_tier(tier) ? 1e9 / p->t[tier].per_byte : 0;
}

double sel_policy_fixed_ns(const sel_policy *p, sel_tier tier)
{
	return real_tier(tier) ? p->t[tier].fixed : 0;
}

double sel_policy_prefill_rate(const sel_policy *p) { return 1e9 / p->pf.c; }

double sel_policy_prefill_growth(const sel_policy *p) { return p->pf.d; }
