/*
 * store_common.c - put checks and outcome bookkeeping shared by the memory
 * and disk stores (store_common.h).
 */
#include "store_common.h"

#include <errno.h>
#include <inttypes.h>

#include "eos.h"

bool sel_put_usable(const char *store, const sel_published *cp, uint32_t page_tokens,
		    uint64_t rows)
{
	uint64_t c = cp->key.consumed;
	if (c != 0 && cp->n_pages == c / page_tokens && cp->tail <= cp->n_pages &&
	    (cp->n_pages == 0 || cp->pages) && cp->state_slot < rows)
		return true;
	eos_fail(-EINVAL, "%s: checkpoint %" PRIu64 " is unusable: %" PRIu64 " tokens, %" PRIu32
		 " pages (%" PRIu64 " expected), tail %" PRIu32 ", state slot %" PRIu32 " of %" PRIu64,
		 store, cp->checkpoint, c, cp->n_pages, c / page_tokens, cp->tail, cp->state_slot,
		 rows);
	return false;
}

bool sel_put_extends(const char *store, const sel_published *cp, uint64_t parent_consumed,
		     uint32_t page_tokens, uint32_t *derived)
{
	uint64_t c = cp->key.consumed, p = parent_consumed;
	*derived = p < c ? (uint32_t)(c / page_tokens - p / page_tokens) : 0;
	if (p < c && (cp->tail == *derived || cp->tail == cp->n_pages))
		return true;
	eos_fail(-EINVAL, "%s: checkpoint %" PRIu64 " tail %" PRIu32 " does not extend its parent"
		 " at %" PRIu64 " tokens (%" PRIu32 " pages)", store, cp->checkpoint, cp->tail, p,
		 *derived);
	return false;
}

bool sel_put_pages_fit(const char *store, const sel_published *cp, uint32_t tail,
		       uint64_t pages)
{
	for (uint32_t i = 0; i < tail; i++) {
		uint32_t id = cp->pages[cp->n_pages - tail + i];
		if (id >= pages) {
			eos_fail(-EINVAL, "%s: checkpoint %" PRIu64 " page id %" PRIu32
				 " beyond the planes' %" PRIu64 " pages", store, cp->checkpoint,
				 id, pages);
			return false;
		}
	}
	return true;
}

sel_outcome sel_put_account(sel_stats *st, struct sel_progress *pg, sel_outcome o,
			    sel_retry_reason reason, sel_retry_reason *why)
{
	st->outcomes[o]++;
	if (o == SEL_RETRY) {
		st->retry_reasons[reason]++;
		sel_progress_refuse(pg); /* what came back before, this put saw */
	}
	if (why)
		*why = o == SEL_RETRY ? reason : SEL_RETRY_NONE;
	return o;
}

bool sel_progress_due(struct sel_progress *pg)
{
	if (!pg->refused || !pg->released)
		return false;
	pg->refused = pg->released = false;
	return true;
}
