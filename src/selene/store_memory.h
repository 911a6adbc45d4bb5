/*
 * store_memory.h - internal calls of the memory store (design 2.4) for
 * tests, tools and the composite store.  The store itself is opened with
 * sel_memory_store_open() (selene.h) and used through sel_store_*.
 */
#ifndef SEL_STORE_MEMORY_H
#define SEL_STORE_MEMORY_H

#include "selene.h"

/* Verify the memory store's invariants (store_memory.c header): the index
 * and slab checks pass, every slot in use belongs to exactly one record,
 * each record holds exactly the slots its representation needs, in-flight
 * jobs hold pins on the records they touch.  0 or SEL_ECORRUPT with
 * sel_errmsg() naming the first violation.  O(records + slots); allocates. */
int sel_memory_store_check(sel_store *s);

/* One record's storage, for tests. */
struct sel_memory_record_info {
	bool ready;            /* committed (SEL_NODE_READY) */
	bool has_row;
	bool failed;           /* its copy-out failed; holds no slots */
	bool pages_packed, row_packed;
	uint32_t tail_pages;
	uint32_t page_slots, row_slots; /* slots held */
	uint32_t pins;         /* index pins (store-held and others) */
	bool is_root;
};

/* 0 with *out filled, or -ENOENT when key is not indexed. */
int sel_memory_store_record(sel_store *s, const sel_key *key, struct sel_memory_record_info *out);

/* Slot geometry the store derived: slot bytes, warm and intake slots and the
 * slots one row takes. */
void sel_memory_store_slots(sel_store *s, uint64_t *slot_bytes, uint64_t *warm, uint64_t *intake,
			    uint32_t *row_slots);

#endif
