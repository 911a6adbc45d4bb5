/*
 * selene_store.h - the implementer's side of the store interface
 * (libselene): what a store implementation, or a test double standing in
 * for one, needs beyond selene.h.
 *
 * An engine uses stores through selene.h alone, where sel_store is opaque.
 * Code that implements a store -- the library's memory, disk and composite
 * stores, a test double for worker tests (design 2.2: "a test double
 * implements it for worker tests"), a future pooled or remote level --
 * includes this header as well: it defines the ops table every sel_store_*
 * call dispatches through and the base struct an implementation embeds
 * first.  It declares no functions: everything here is data layout, and
 * its contract is SEL_STORE_OPS_VERSION.
 *
 * Rules for an implementation:
 *   - Embed struct sel_store first, zero it, set ops (a static table) and
 *     page_tokens, and hand out &impl->base.  sel_store_destroy() calls
 *     ops->destroy exactly once; the implementation frees itself there.
 *   - Set version to SEL_STORE_OPS_VERSION.  A table of another version is
 *     refused by every call (-EPROTO, a message naming the store's name),
 *     so a binary built against another revision of this header fails
 *     loudly instead of calling through a misplaced pointer.
 *   - Every entry is called on the model worker's thread only, and must
 *     keep the contract selene.h states for its sel_store_* call: never
 *     block, a failed call changes nothing and produces no event, and so
 *     on.  Entries marked optional may be NULL; the others may not (a call
 *     reaching a NULL entry is refused with -EPROTO).
 */
#ifndef SELENE_STORE_H
#define SELENE_STORE_H

#include "selene.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 added describe and made evicted and touch optional; version 3
 * the optional evictions_lost; version 4 the optional page_digests and drop
 * (overlapped restores, issue 18); version 5 the optional flush (deferred
 * wakes, issue 18); version 6 the optional fetch_sums (overlapped restores
 * from disk, issue 18). */
#define SEL_STORE_OPS_VERSION 6

struct sel_store_ops {
	uint32_t version; /* SEL_STORE_OPS_VERSION */
	const char *name; /* "memory", "disk", "composite", "test": sel_store_info.kind */
	int (*lookup)(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		      sel_hit *hit);
	/* why is never NULL here (store.c passes its own when the caller did not). */
	sel_outcome (*put)(sel_store *s, const sel_published *cp, sel_retry_reason *why);
	int (*fetch)(sel_store *s, const sel_hit *hit, const sel_inbound *in);
	int (*poll)(sel_store *s, sel_event *ev, size_t cap);
	/* Optional: NULL counts the notice in sel_stats.evictions_noticed. */
	void (*evicted)(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir);
	/* Optional: NULL ignores the touch. */
	void (*touch)(sel_store *s, const sel_key *key);
	void (*stats)(sel_store *s, sel_stats *out);
	int (*wait_fd)(sel_store *s);
	int (*close)(sel_store *s, uint64_t deadline_ns);
	void (*destroy)(sel_store *s);
	/* Optional: add what only the store knows to *out, which store.c has
	 * filled already (kind from name; transport and slot counts from
	 * stats; disk fields NULL or 0; warning ""): the disk tier's
	 * directory, limit, scan count and I/O path, a startup warning.
	 * Strings stay owned by the store, valid until destroy. */
	void (*describe)(sel_store *s, sel_store_info *out);
	/* Optional: eviction notices were dropped (the worker's bounded queue
	 * overflowed); a store that announces holdings announces them again.
	 * NULL ignores it. */
	void (*evictions_lost)(sel_store *s);
	/* Optional (NULL: -ENOTSUP): sel_store_page_digests, its range checked
	 * by store.c. */
	int (*page_digests)(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t n,
			    uint64_t *out);
	/* Optional (NULL: -ENOTSUP): sel_store_drop. */
	int (*drop)(sel_store *s, const sel_key *key);
	/* Optional: wake the store's threads for the work this pass's calls
	 * queued (sel_store_flush); a wrapping store forwards it.  NULL: its
	 * calls wake their threads themselves. */
	void (*flush)(sel_store *s);
	/* Version 6.  Optional (false: a fetch with sel_inbound.n_sums > 0 is
	 * refused with -ENOTSUP by store.c): fetch delivers sel_inbound.sums
	 * or refuses the fetch with -ENOTSUP itself. */
	bool fetch_sums;
};

/* The base every implementation embeds first.  Zero it; set ops and
 * page_tokens.  evictions_noticed belongs to store.c (the default evicted). */
struct sel_store {
	const struct sel_store_ops *ops;
	uint32_t page_tokens; /* the geometry's page tokens */
	uint64_t evictions_noticed;
};

#ifdef __cplusplus
}
#endif
#endif
