/*
 * expiry.c - the schedule of the stores' expiry sweeps (design 2.5, "Host
 * record expiry": "At most once a minute, the model-thread poll walks from
 * the oldest entry ... stopping at the first fresh leaf or 64 expired
 * leaves").
 *
 * DESIGN
 *   Each store embeds a struct sel_expiry and asks sel_expiry_due from its
 *   poll; when it says yes the store runs sel_index_expire with the cutoff
 *   and SEL_EXPIRY_LEAVES.  The clock is the configuration's (tests drive
 *   a fake one) or the wall clock, because recovered ages come from file
 *   mtimes.  A clock that steps back does not sweep again until it has
 *   passed the last sweep by a period.
 *
 * INVARIANTS
 *   1. Two sweeps are at least SEL_EXPIRY_PERIOD_NS of the store's clock
 *      apart.
 *   2. With max_age_ns 0 nothing is ever due.
 */
#include "expiry.h"

#include "eos.h"

void sel_expiry_init(struct sel_expiry *x, const sel_store_config *cfg)
{
	x->max_age_ns = cfg ? cfg->max_age_ns : 0;
	x->clock = cfg && cfg->clock_ns ? cfg->clock_ns : eos_wall_ns;
	x->last_ns = 0;
	x->swept = false;
	x->sweeps = 0;
}

bool sel_expiry_due(struct sel_expiry *x, uint64_t *cutoff_ns)
{
	if (!sel_expiry_on(x))
		return false;
	uint64_t now = x->clock();
	if (x->swept && (now < x->last_ns || now - x->last_ns < SEL_EXPIRY_PERIOD_NS))
		return false;
	x->swept = true;
	x->last_ns = now;
	x->sweeps++;
	*cutoff_ns = sel_expiry_cutoff(now, x->max_age_ns);
	return true;
}
