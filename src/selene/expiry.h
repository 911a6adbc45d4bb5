/*
 * expiry.h - when a store sweeps for expired records (design 2.5, "Host
 * record expiry").  Internal to libselene.
 *
 * The rule itself (last use before now - max age) and the walk are the
 * index's (sel_index_expired, sel_index_expire); this is the schedule every
 * store shares: off unless a max age is configured, at most one sweep per
 * minute of the store's clock, at most 64 expired leaves per sweep, the
 * clock being sel_store_config.clock_ns or the wall clock (record ages
 * compare with file mtimes).
 */
#ifndef SEL_EXPIRY_H
#define SEL_EXPIRY_H

#include "selene.h"

#define SEL_EXPIRY_PERIOD_NS (60ull * 1000000000ull)
#define SEL_EXPIRY_LEAVES 64u

struct sel_expiry {
	uint64_t max_age_ns;     /* 0: expiry off */
	uint64_t (*clock)(void); /* ns since the epoch */
	uint64_t last_ns;        /* clock reading of the last sweep */
	bool swept;              /* a sweep ran */
	uint64_t sweeps;         /* sweeps run */
};

/* From cfg->max_age_ns and cfg->clock_ns. */
void sel_expiry_init(struct sel_expiry *x, const sel_store_config *cfg);

static inline bool sel_expiry_on(const struct sel_expiry *x) { return x->max_age_ns != 0; }

/* now - max_age, or 0 when max_age reaches back before the epoch. */
static inline uint64_t sel_expiry_cutoff(uint64_t now_ns, uint64_t max_age_ns)
{
	return now_ns > max_age_ns ? now_ns - max_age_ns : 0;
}

/* Whether a sweep is due now: expiry is on and no sweep ran in the last
 * period (the first poll sweeps).  When due, records the sweep and sets
 * *cutoff_ns. */
bool sel_expiry_due(struct sel_expiry *x, uint64_t *cutoff_ns);

#endif
