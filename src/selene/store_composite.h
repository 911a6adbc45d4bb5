/*
 * store_composite.h - internal calls of the composite store (design 2.4
 * CompositeStore) for tests and tools.  The store is opened with
 * sel_composite_store_open() (selene.h) and used through sel_store_*.
 */
#ifndef SEL_STORE_COMPOSITE_H
#define SEL_STORE_COMPOSITE_H

#include "selene_store.h"

/* Verify the composite's invariants (store_composite.c header), the
 * memory store's and the disk store's: 0 or SEL_ECORRUPT naming the first
 * violation.  O(records). */
int sel_composite_store_check(sel_store *s);

/* The two stores inside (for their own introspection calls). */
sel_store *sel_composite_store_memory(sel_store *s);
sel_store *sel_composite_store_disk(sel_store *s);

/* Maintenance gauges: memory slots whose disk writes are in flight, the
 * most that may be (2 x intake, or what the last refused put needed when
 * larger, plus the record being started), the largest in-flight write seen,
 * and the backoff deadline (monotonic ns; 0 when none).  Backpressure:
 * puts refused because warm memory was held by dirty records, copies or
 * reads (refused_full), PROGRESS events emitted, the slots the last refused
 * put needed, streamed puts in flight.  busy: a copy-out, maintenance
 * write, read-through or streamed put is in flight or an event is queued
 * (what a caller waits out, with the inner stores' in-flight counts and
 * the backoff, to know that nothing more happens without a new call). */
struct sel_composite_gauges {
	uint64_t writing_slots;
	uint64_t write_ahead_bound;
	uint64_t max_writing_slots;
	uint64_t writes_started, writes_done, writes_retried, backoff_until_ns;
	uint64_t read_through, streamed;
	/* of read_through: uploaded window by window as the reads land
	 * (sel_disk_store_fetch_into), not after the whole chain was read */
	uint64_t read_through_overlapped;
	uint64_t refused_full, progress, want_slots, streaming;
	bool busy;
};
void sel_composite_store_gauges(sel_store *s, struct sel_composite_gauges *out);

#endif
