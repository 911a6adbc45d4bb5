/*
 * store_common.h - the put checks and outcome bookkeeping that the memory
 * and disk stores share (design 2.2).
 *
 * Both stores refuse the same malformed checkpoints with the same messages
 * (prefixed by the store's name), derive a child's tail from its parent the
 * same way, and count outcomes and refusals for SEL_EV_PROGRESS alike.
 */
#ifndef SEL_STORE_COMMON_H
#define SEL_STORE_COMMON_H

#include <stdbool.h>
#include <stdint.h>

#include "selene.h"

/* Whether cp can be stored at all: a non-zero consumed count whose whole
 * pages are exactly cp's page list, a tail within it, and a state slot below
 * rows.  Otherwise fails (-EINVAL) naming every field and returns false. */
bool sel_put_usable(const char *store, const sel_published *cp, uint32_t page_tokens,
		    uint64_t rows);

/* The tail cp has below a parent stored at parent_consumed tokens: the
 * pages past the parent's whole pages.  cp may also carry its whole chain
 * (tail == n_pages), as when it was offered before its parent was stored.
 * Returns false (and fails, -EINVAL) when cp does not extend that parent. */
bool sel_put_extends(const char *store, const sel_published *cp, uint64_t parent_consumed,
		     uint32_t page_tokens, uint32_t *derived);

/* Whether the last `tail` page ids of cp lie below `pages` (the smallest
 * rank's page count); else fails (-EINVAL) naming the first bad id. */
bool sel_put_pages_fit(const char *store, const sel_published *cp, uint32_t tail,
		       uint64_t pages);

/* Refusals since the last SEL_EV_PROGRESS, and capacity released since. */
struct sel_progress {
	bool refused;
	bool released;
};

/* A refusal (a Retry, or a Deferred event): capacity that came back
 * before it does not count as progress. */
static inline void sel_progress_refuse(struct sel_progress *pg)
{
	pg->refused = true;
	pg->released = false;
}

/* Counts a put's outcome (and a Retry's reason) in st, notes a refusal in
 * pg, and stores what a caller's why receives.  Returns o. */
sel_outcome sel_put_account(sel_stats *st, struct sel_progress *pg, sel_outcome o,
			    sel_retry_reason reason, sel_retry_reason *why);

/* Whether a poll should report SEL_EV_PROGRESS now: a put was refused and
 * capacity came back since.  Clears both when it returns true. */
bool sel_progress_due(struct sel_progress *pg);

#endif
