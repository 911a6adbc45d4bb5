/*
 * store_memory.h - internal calls of the memory store (design 2.4) for
 * tests, tools and the composite store.  The store itself is opened with
 * sel_memory_store_open() (selene.h) and used through sel_store_*.
 */
#ifndef SEL_STORE_MEMORY_H
#define SEL_STORE_MEMORY_H

#include "selene_store.h"

struct sel_store_pool;

/* Verify the memory store's invariants (store_memory.c header): the index
 * and slab checks pass, every slot in use belongs to exactly one record,
 * each record holds exactly the slots its representation needs, in-flight
 * jobs hold pins on the records they touch.  0 or SEL_ECORRUPT with
 * sel_errmsg() naming the first violation.  O(records + slots); allocates. */
int sel_memory_store_check(sel_store *s);

/* One record's storage, for tests. */
struct sel_memory_record_info {
	bool ready; /* committed (SEL_NODE_READY) */
	bool has_row;
	bool failed; /* its copy-out failed; holds no slots */
	bool pages_packed, row_packed;
	uint32_t tail_pages;
	uint32_t page_slots, row_slots; /* slots held */
	uint32_t pins;                  /* index pins (store-held and others) */
	bool is_root;
};

/* 0 with *out filled, or -ENOENT when key is not indexed. */
int sel_memory_store_record(sel_store *s, const sel_key *key, struct sel_memory_record_info *out);

/* Slot geometry the store derived: slot bytes, warm and intake slots and the
 * slots one row takes. */
void sel_memory_store_slots(sel_store *s, uint64_t *slot_bytes, uint64_t *warm, uint64_t *intake,
			    uint32_t *row_slots);

/* The slot pool the store copies through (store_pool.h): its layout, slab
 * pool and, for a split pool (design 2.5), the rank parts.  For tests;
 * valid until destroy. */
const struct sel_store_pool *sel_memory_store_pool(sel_store *s);

/* ---- The composite's view (design 2.4 CompositeStore) ------------------- */

/* A memory store over a pool the caller owns (store_pool.h): it never frees
 * or leaks the pool; when its close returns SEL_ESTOPPED the owner must
 * leak the pool.  The pool must have warm slots. */
int sel_memory_store_open_shared(const sel_store_config *cfg, struct sel_store_pool *sp,
				 sel_store **out);

/* A record's storage as the composite sees it (write_from reads it, the
 * disk index mirrors it).  slots: page slots then row slots, valid until
 * the next call that may change the store. */
struct sel_memory_view {
	bool ready, has_row;
	bool pages_packed, row_packed;
	uint32_t tail_pages;
	uint32_t n_page_slots, n_row_slots;
	const uint32_t *slots;
	uint32_t pins; /* index pins */
	bool is_root;
	sel_key parent; /* its parent in the memory index (none for a root) */
};
int sel_memory_store_view(sel_store *s, const sel_key *key, struct sel_memory_view *out);

/* Store pins (the composite keeps dirty records and read-through targets
 * pinned: a pinned record is never evicted and keeps its row and slots).
 * pin: 0 or -ENOENT.  unpin may run deferred row drops and remove a
 * useless page-only leaf. */
int sel_memory_store_pin(sel_store *s, const sel_key *key);
void sel_memory_store_unpin(sel_store *s, const sel_key *key);

/* Remove a record now: 0, -ENOENT, or -EBUSY while it is pinned or has
 * children (retry later).  Page-only ancestors left childless go too. */
int sel_memory_store_remove(sel_store *s, const sel_key *key);

/* Read-through: index key PENDING and pinned under parent (tail as
 * sel_index_insert takes it), with warm slots for tail pages and, when row,
 * the row -- in the packed representation where asked -- evicting by the
 * tree policy (unpinned records only) to make room.  0, -EEXIST, -ENOSPC
 * (nothing changed but evictions), or an index error.  The slots are the
 * caller's to fill until sel_memory_store_settle: ok commits the record
 * (READY) and drops the pin; !ok frees the slots and removes it. */
int sel_memory_store_reserve(sel_store *s, const sel_key *key, const sel_key *parent,
			     const sel_digest *bucket, uint32_t tail, bool row, bool pages_packed,
			     bool row_packed);
void sel_memory_store_settle(sel_store *s, const sel_key *key, bool ok);

/* The warm slots the last put refused with SEL_RETRY needed (0 if none
 * was): the composite writes dirty records until that many can be freed. */
uint32_t sel_memory_store_refused_need(sel_store *s);

/* Slots a record of tail pages (and its row) takes in a representation. */
uint32_t sel_memory_store_record_slots(sel_store *s, uint32_t tail, bool row, bool pages_packed,
				       bool row_packed);

/* Every indexed key, oldest first, into keys[0..cap); returns the count
 * (which may exceed cap). */
size_t sel_memory_store_keys(sel_store *s, sel_key *keys, size_t cap);

/* Slot gauges: in use by records, held by pinned records, free warm (what
 * a warm allocation could take now). */
void sel_memory_store_counts(sel_store *s, uint64_t *in_use, uint64_t *pinned, uint64_t *free_warm);

/* sel_store_page_digests of the memory store (page_digest.c; the
 * composite's for chains it holds in memory). */
int sel_memory_store_page_digests(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t n,
				  uint64_t *out);

#endif
