/*
 * store_wrap.h - a store that wraps another (design 2.15 "Loading attaches
 * the pool to the local tiers, if any, as a PooledStore"): the base every
 * wrapping level embeds first, and forwarding helpers for the entries it
 * does not change.  Internal to libselene.
 *
 * A wrapper owns its inner store (NULL: no local tiers) and closes and
 * destroys it.  Each helper does what the inner store would, or what an
 * empty store does without one (a miss, SEL_SKIPPED, no events), so a
 * level that only adds a path calls them for everything else, and levels
 * compose: remote(pooled(local)) forwards through both.  An inner store
 * may answer a lookup SEL_LOOKUP_PENDING (the pooled store within its
 * grace period): a wrapper passes that on (sel_wrap_lookup does), or asks
 * its own level meanwhile and answers PENDING itself; and a hit of a tier
 * it does not own (hit->tier, hit->cookie) goes to the inner store's fetch
 * unchanged.
 */
#ifndef SEL_STORE_WRAP_H
#define SEL_STORE_WRAP_H

#include "selene_store.h"

struct sel_wrap {
	sel_store base; /* first */
	sel_store *inner;
};

static inline struct sel_wrap *sel_wrap_of(sel_store *s) { return (struct sel_wrap *)s; }

/* Set up w's base (ops, page_tokens from the geometry) over inner. */
void sel_wrap_init(struct sel_wrap *w, const struct sel_store_ops *ops, uint32_t page_tokens,
		   sel_store *inner);

int sel_wrap_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		    sel_hit *hit);
sel_outcome sel_wrap_put(sel_store *s, const sel_published *cp, sel_retry_reason *why);
int sel_wrap_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in);
int sel_wrap_poll(sel_store *s, sel_event *ev, size_t cap);
void sel_wrap_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir);
void sel_wrap_touch(sel_store *s, const sel_key *key);
/* The inner store's stats, or zeros with transport "host". */
void sel_wrap_stats(sel_store *s, sel_stats *out);
int sel_wrap_wait_fd(sel_store *s);
int sel_wrap_close(sel_store *s, uint64_t deadline_ns);
/* The inner store's description (its kind, directory, warning), or the
 * defaults store.c filled. */
void sel_wrap_describe(sel_store *s, sel_store_info *out);
/* sel_store_flush of the inner store (its deferred thread wakes). */
void sel_wrap_flush(sel_store *s);
/* Destroy the inner store (after close). */
void sel_wrap_destroy_inner(struct sel_wrap *w);

#endif
