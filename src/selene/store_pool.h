/*
 * store_pool.h - what the stores of one configuration share: the slot
 * layout, the copy backend and the one slab pool of warm plus intake slots
 * (design 2.2 "Three components are shared"; design 1 automatic intake;
 * design 2.5 slabs).
 *
 * Internal to libselene.  A standalone memory or disk store opens its own
 * pool; the composite opens one and lends it to its memory store and its
 * disk store, which then never free it.  Used from the model worker thread
 * only (the transfer threads receive addresses).
 */
#ifndef SEL_STORE_POOL_H
#define SEL_STORE_POOL_H

#include "selene.h"
#include "slab.h"
#include "transfer.h"

struct sel_store_pool {
	const sel_geometry *g;
	sel_slot_layout layout;
	const struct sel_copy_backend *backend; /* the caller's, the host one, or cuda_backend */
	struct sel_copy_backend *cuda_backend;  /* owned, when CUDA */
	sel_slab_pool *pool;
	uint64_t slot_bytes;
	uint64_t warm, intake;                  /* slots */
	uint32_t row_slots;
	uint64_t page_bytes_all;                /* unpadded bytes of one page, all ranks */
	uint64_t row_bytes_all;                 /* unpadded bytes of one row, all ranks */
	uint64_t min_pages, min_rows;           /* smallest plane page and row counts */
	char warning[512];                      /* intake shrunk for headroom, or "" */
};

/* Build the layout, pick the copy backend (cfg->copy_backend, memcpy for
 * host planes, the CUDA driver for device planes; a configured GPU is never
 * replaced by memcpy), size the automatic intake (cfg->max_active, headroom
 * from cfg->host_headroom or MemAvailable less the warm bytes) and map
 * warm_bytes / slot_bytes warm slots plus the intake.  warm_bytes 0 maps an
 * intake-only pool (disk store).  who names the store in messages.  0 or
 * an error with a message; nothing is left behind on failure. */
int sel_store_pool_open(const sel_store_config *cfg, uint64_t warm_bytes, const char *who,
			struct sel_store_pool **out);
/* Unmap and free.  NULL-safe.  Only once nothing can copy into a slot. */
void sel_store_pool_destroy(struct sel_store_pool *sp);
/* Keep everything reachable and never free it: a copier that could not
 * drain may still use the slots (design 2.5, 2.8).  NULL-safe. */
void sel_store_pool_leak(struct sel_store_pool *sp);

#endif
