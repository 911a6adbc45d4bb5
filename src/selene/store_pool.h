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
 *
 * Two layouts.  The registered pool is one host mapping of whole cross-rank
 * records, pinned once through the copy backend (cuMemHostRegister on CUDA,
 * which maps it into every device's page tables).  A standalone memory store
 * on the CUDA backend at TP>1 splits it by rank instead (design 2.5, cuda.h
 * "Split pools"): each rank's share of every slot is one pinned allocation
 * on its device's NUMA node, mapped for that device and the host only; the
 * slab pool keeps the free list over the split pool's identity range and
 * the transfer set addresses the rank parts (sel_store_pool_xfer_create).
 * Records in a split pool stay per-rank: nothing may compare or pack them,
 * since no CPU code reads their slots.
 */
#ifndef SEL_STORE_POOL_H
#define SEL_STORE_POOL_H

#include <sys/uio.h>

#include "record.h"
#include "selene.h"
#include "slab.h"
#include "transfer.h"

struct sel_cuda;
struct sel_cuda_split_pool;

struct sel_store_pool {
	const sel_geometry *g;
	sel_slot_layout layout;
	sel_record_layout rl;                   /* the same layout as record files see it */
	const struct sel_copy_backend *backend; /* the caller's, the host one, or cuda_backend */
	struct sel_copy_backend *cuda_backend;  /* owned, when CUDA */
	const struct sel_cuda *cu;              /* the driver, when CUDA */
	int *devices;                           /* [ranks] device ordinals, when CUDA */
	/* Owned, for a split pool (records per-rank, no compare); else NULL.
	 * pool is then a free list over its identity range. */
	struct sel_cuda_split_pool *split;
	sel_slab_pool *pool;
	uint64_t slot_bytes;
	uint64_t warm, intake; /* slots */
	uint32_t row_slots;
	uint64_t page_bytes_all;      /* unpadded bytes of one page, all ranks */
	uint64_t row_bytes_all;       /* unpadded bytes of one row, all ranks */
	uint64_t min_pages, min_rows; /* smallest plane page and row counts */
	/* Intake shrunk for headroom, a split pool the devices could not make,
	 * or "". */
	char warning[512];
};

/* Build the layout, pick the copy backend (cfg->copy_backend, memcpy for
 * host planes, the CUDA driver for device planes; a configured GPU is never
 * replaced by memcpy), size the automatic intake (cfg->max_active, headroom
 * from cfg->host_headroom or MemAvailable less the warm bytes) and map
 * warm_bytes / slot_bytes warm slots plus the intake as the registered
 * pool.  warm_bytes 0 maps an intake-only pool (disk store).  who names the
 * store in messages.  For stores with a disk tier, which read records on
 * the CPU: cfg->split_pool == SEL_SPLIT_ON is refused (-EINVAL), AUTO means
 * the registered pool.  0 or an error with a message; nothing is left
 * behind on failure. */
int sel_store_pool_open(const sel_store_config *cfg, uint64_t warm_bytes, const char *who,
			struct sel_store_pool **out);
/* The same for a standalone memory store, which never reads its slots on
 * the CPU: the pool is split by rank as cfg->split_pool says (selene.h
 * sel_split_mode; AUTO: CUDA backend, ranks > 1 and devices with host-NUMA
 * allocations, else the registered pool with a warning when only the
 * devices stood in the way).  The split pool's driver calls fail with
 * SEL_ECUDA naming the call, rank and device. */
int sel_store_pool_open_memory(const sel_store_config *cfg, uint64_t warm_bytes, const char *who,
			       struct sel_store_pool **out);
/* The transfer set over sp's slots (queue_depth per rank): sel_xfer_create
 * over the registered mapping, or sel_xfer_create_parts over a split pool's
 * rank parts (that set refuses compare and packed jobs).  sp must outlive
 * it; destroy it (or, after SEL_ESTOPPED, leak sp) before the pool. */
int sel_store_pool_xfer_create(const struct sel_store_pool *sp, uint32_t queue_depth,
			       sel_xfer **out);
/* Install cfg->landed (selene.h sel_landed_hook) on x when its reader can
 * use it: every page plane and row of cfg->geometry in host memory (CUDA
 * planes are not CPU-readable; their restores keep no hook, and the
 * caller computes what it would have).  Nothing without cfg->landed. */
void sel_store_landed_install(const sel_store_config *cfg, sel_xfer *x);
/* One mapping from a record's slots to what the disk thread reads and
 * writes (design 2.5 slot layout; record.h "Payload addresses"): for a
 * record held in slots as flags lay it out (SEL_RECORD_*_REPLICATED: DRAM's
 * or the disk file's packing), the addresses of its page records
 * [first, first + count) into pages[0..count) and, when n_row_slots > 0,
 * its row's pieces in file order into iov[0..iov_cap) with their count in
 * *n_iov (0 without a row).  slots: the record's page slots, then its
 * n_row_slots row slots.  Pure address arithmetic: 0, or -ENOMEM, -ENOBUFS
 * (iov_cap too small) with a message. */
int sel_store_pool_map(const struct sel_store_pool *sp, uint32_t flags, const uint32_t *slots,
		       uint32_t n_page_slots, uint32_t n_row_slots, uint32_t first, uint32_t count,
		       void **pages, struct iovec *iov, uint32_t iov_cap, uint32_t *n_iov);

/* Unmap and free: the slab pool, then a split pool's parts and range, then
 * the CUDA backend.  NULL-safe.  Only once nothing can copy into a slot
 * (every transfer set over sp closed and drained). */
void sel_store_pool_destroy(struct sel_store_pool *sp);
/* Keep everything reachable and never free it: a copier that could not
 * drain may still use the slots (design 2.5, 2.8).  NULL-safe. */
void sel_store_pool_leak(struct sel_store_pool *sp);

#endif
