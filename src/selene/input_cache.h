/*
 * input_cache.h - reusable CPU input records in ordinary host memory
 * (design 2.13; design 1: "Prepared image inputs use one eighth of the warm
 * budget, rounded down to 4 KiB, in ordinary CPU memory").
 *
 * A bounded LRU of sealed records (input_record.h) of both kinds, keyed by
 * (kind, key): source descriptions by source key, prepared inputs by
 * semantic identity.  Lookups of the same missing key share one
 * preparation: the first caller gets SEL_INPUT_MISS and owns a pending
 * entry it must publish or fail; every later caller gets SEL_INPUT_WAIT on
 * the same entry and is given the result when it comes.
 *
 * Budget: retained entries are charged their record length plus a fixed
 * overhead; the total never exceeds the budget.  A leased entry (one a
 * caller holds) stays charged and is never evicted until its last lease is
 * released; eviction takes the least recently used unleased entry.  A
 * published record that cannot fit even after eviction is handed to its
 * owner and waiters but not retained (not charged: it lives on its
 * owners' allowance and is freed with the last lease).
 *
 * Threads: every call is thread-safe.  A mutex guards the map for a few
 * pointer operations and is never held across I/O or preparation, so the
 * model worker may look up, poll and release without waiting (design 2.12:
 * it never waits on a lock held for I/O); only sel_input_cache_wait
 * blocks, and only threads that may block call it.
 *
 * Lease rules: every lookup that returns >= 0 hands the caller one lease,
 * which the caller releases exactly once (sel_input_cache_release) --
 * after a failure too.  A record seen through a lease stays valid and
 * unchanged until that lease is released.  The cache is destroyed with no
 * lease outstanding.
 */
#ifndef SEL_INPUT_CACHE_H
#define SEL_INPUT_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "input_record.h"

typedef struct sel_input_cache sel_input_cache;
typedef struct sel_input_lease sel_input_lease;

/* Design 1: one eighth of the warm budget rounded down to 4 KiB for a core
 * that takes images, nothing for a text-only core. */
uint64_t sel_input_budget(uint64_t warm_bytes, bool vision);

/* Bytes charged per retained entry on top of its record. */
#define SEL_INPUT_ENTRY_OVERHEAD 256u

int sel_input_cache_create(uint64_t budget_bytes, sel_input_cache **out);
/* NULL-safe.  No lease may be outstanding. */
void sel_input_cache_destroy(sel_input_cache *c);

/* Called (outside the cache's lock, on the publishing thread) after each
 * publish or fail, so a thread that polls leases knows when to look again
 * (the model worker's eventfd).  NULL clears it. */
void sel_input_cache_notify(sel_input_cache *c, void (*fn)(void *ctx), void *ctx);

enum {
	SEL_INPUT_HIT = 0,  /* *out leases a ready record */
	SEL_INPUT_MISS = 1, /* *out is a new pending entry the caller must publish or fail */
	SEL_INPUT_WAIT = 2, /* *out is another caller's pending entry: poll or wait */
};
/* Look up (kind, key).  Returns HIT, MISS or WAIT with a lease in *out, or
 * -ENOMEM. */
int sel_input_cache_lookup(sel_input_cache *c, uint32_t kind, const sel_input_key *key,
			   sel_input_lease **out);

/* The owner of a MISS entry publishes the record for it: rec must be a
 * sealed record of the entry's kind and key (-EINVAL otherwise: rec is
 * freed, the entry is failed and the owner still releases its lease); it
 * moves into the cache (*rec is zeroed) whether or not it is retained.
 * The owner's lease now holds the record. */
int sel_input_cache_publish(sel_input_cache *c, sel_input_lease *l, sel_input_rec *rec);
/* The owner of a MISS entry gives up with err (< 0): waiters see err, the
 * next lookup misses again.  The owner's lease is released by this call. */
void sel_input_cache_fail(sel_input_cache *c, sel_input_lease *l, int err);

/* State of a lease: 0 ready (the record is readable), -EAGAIN still
 * pending, or the owner's error.  Never blocks. */
int sel_input_cache_poll(sel_input_cache *c, sel_input_lease *l);
/* Block until the entry is ready or failed, at most timeout_ns: 0, the
 * owner's error, or -ETIMEDOUT.  Not for the model worker. */
int sel_input_cache_wait(sel_input_cache *c, sel_input_lease *l, uint64_t timeout_ns);
/* The record of a ready lease (NULL while pending or after a failure). */
const sel_input_rec *sel_input_lease_rec(const sel_input_lease *l);
void sel_input_cache_release(sel_input_cache *c, sel_input_lease *l);
/* One more lease on what l leases (a second consumer of the same record,
 * retained or not): returns l, to be released separately. */
sel_input_lease *sel_input_cache_ref(sel_input_cache *c, sel_input_lease *l);

/* Insert a sealed record without a lookup (a disk read, a warm-up): it is
 * retained if it fits, replacing nothing -- an entry already there (ready
 * or pending) wins and rec is freed.  Takes rec in every case.  0, or
 * -EINVAL for an unsealed record. */
int sel_input_cache_put(sel_input_cache *c, sel_input_rec *rec);

struct sel_input_cache_stats {
	uint64_t budget;
	uint64_t bytes;   /* charged: retained records + overhead */
	uint64_t entries; /* retained */
	uint64_t leased;  /* retained entries with a lease */
	uint64_t pending; /* preparations in progress */
	uint64_t lookups, hits, misses, waits;
	uint64_t published, not_retained, failed, evictions;
};
void sel_input_cache_stats(sel_input_cache *c, struct sel_input_cache_stats *out);

/* Checker (STYLE 9): charges, the LRU list, the map and the counts agree
 * and the bytes are within the budget.  0 or SEL_ECORRUPT naming the first
 * broken rule. */
int sel_input_cache_check(sel_input_cache *c);

#endif
