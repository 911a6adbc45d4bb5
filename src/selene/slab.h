/*
 * slab.h - the host slot pool shared by the memory store and staged disk
 * transfers (design 2.5, "Transfers, slabs, and record files"; design 1 for
 * the intake size).
 *
 * Internal to libselene.
 *
 * One 4 KiB-aligned anonymous mapping (MAP_PRIVATE | MAP_ANONYMOUS |
 * MAP_POPULATE, MADV_HUGEPAGE) cut into equal slots.  A slot holds one page
 * record: for each rank in order, that rank's share, which is its page planes
 * in geometry order, each padded to 4 KiB -- exactly the bytes of one page
 * record in a record file, so a slot is written or read with one aligned
 * direct I/O.  A row occupies row_slots slots: rank r's row is cut into
 * pieces of share[r] bytes, piece i in rank r's share of the i-th row slot.
 *
 * The pool has warm slots (retention) and intake slots (staging).  Warm
 * allocations never take the last intake_slots free slots; intake
 * allocations may take any.  Allocation never blocks: it succeeds whole or
 * fails with -ENOSPC.  The free list is shared; the pool is used from the
 * model worker thread only (transfer threads receive addresses).
 *
 * A memory-only TP>1 store on the CUDA backend splits its slots by rank
 * instead (design 2.5, cuda.h): the slab pool is then only the free list
 * over a range the split pool reserved (sel_slab_create_over), its
 * addresses are slot identities, and the transfer set addresses each rank's
 * part itself (sel_xfer_create_parts).
 */
#ifndef SEL_SLAB_H
#define SEL_SLAB_H

#include "selene.h"

#define SEL_WINDOW_PAGES 64u /* pages per transfer window (design 2.5) */

/* How a geometry's records map onto slots. */
typedef struct sel_slot_layout {
	uint32_t ranks;
	uint64_t slot_bytes;  /* sum of shares */
	uint64_t *share;      /* [ranks] bytes of rank r's share (4 KiB multiple) */
	uint64_t *share_off;  /* [ranks] offset of rank r's share in a slot */
	uint64_t **plane_off; /* [ranks][n_planes] offset of plane p within the share */
	uint64_t *row_bytes;  /* [ranks] unpadded row unit bytes */
	uint32_t row_slots;   /* max over ranks of ceil(row_bytes / share) */
} sel_slot_layout;

/* Fill *l from g.  Fails, leaving *l zeroed, with SEL_EGEOMETRY (no ranks,
 * a rank without page planes, a zero unit size), -EOVERFLOW (slot or row
 * size beyond 64 bits, or more than UINT32_MAX row slots) or -ENOMEM; the
 * message names the rank and plane. */
int sel_slot_layout_init(sel_slot_layout *l, const sel_geometry *g);
/* Release l's arrays and zero it.  Safe on a zeroed or failed layout. */
void sel_slot_layout_free(sel_slot_layout *l);
/* The page digest of the page held in slot bytes `slot` laid out by l (one
 * unpacked share per rank, planes at plane_off), in sel_page_digest_padded's
 * form: each plane's bytes of g followed by zeros to 4 KiB, rank by rank.
 * Reads only the planes' bytes, never the slot's padding (page_digest.c;
 * the pool's overlapped restores, issue 18). */
int sel_slot_page_digest_padded(const sel_geometry *g, const sel_slot_layout *l,
				const uint8_t *slot, uint64_t *out);
/* Piece i (0 <= i < row_slots) of rank r's row: offset within the slot and
 * length (0 when the row ended in an earlier piece).  Piece i holds row
 * bytes [i * share[r], i * share[r] + len). */
void sel_slot_layout_row_piece(const sel_slot_layout *l, uint32_t rank, uint32_t i,
			       uint64_t *off_in_slot, uint64_t *len);

/* Registration hooks (CUDA: cuMemHostRegister_v2 / cuMemHostUnregister).
 * NULL or NULL entries: host backend, nothing to do. */
struct sel_slab_hooks {
	int (*reg)(void *ctx, void *addr, uint64_t len);
	void (*unreg)(void *ctx, void *addr, uint64_t len);
	void *ctx;
};

typedef struct sel_slab_pool sel_slab_pool;

enum sel_slab_class {
	SEL_SLAB_WARM = 0,   /* retention: leaves intake_slots free */
	SEL_SLAB_INTAKE = 1, /* staging: may use every free slot */
};

/* Map warm_slots + intake_slots slots of slot_bytes (a positive multiple of
 * 4 KiB).  populate: pre-fault the mapping (MAP_POPULATE).  Calls
 * hooks->reg once for the whole mapping; hooks is copied.  The total must be
 * 1..UINT32_MAX slots and its bytes must fit the address space (-EINVAL,
 * -EOVERFLOW); a failed mmap or madvise returns its errno, a failed reg its
 * return value, each with a message and nothing left mapped.  Kernels
 * without transparent huge pages (madvise EINVAL) are fine. */
int sel_slab_create(uint64_t slot_bytes, uint64_t warm_slots, uint64_t intake_slots, bool populate,
		    const struct sel_slab_hooks *hooks, sel_slab_pool **out);
/* A free list over warm_slots + intake_slots slots of a range the caller
 * owns and keeps mapped (a CUDA split pool's reserved range, design 2.5):
 * nothing is mapped, populated or registered here, and sel_slab_addr(p, s)
 * is base + s * slot_bytes.  For a split pool those addresses are slot
 * identities, not the slots' bytes (cuda.h).  base must be 4 KiB aligned
 * and non-NULL (-EINVAL); other limits as sel_slab_create. */
int sel_slab_create_over(void *base, uint64_t slot_bytes, uint64_t warm_slots,
			 uint64_t intake_slots, sel_slab_pool **out);
/* Unregisters and unmaps (a pool from sel_slab_create_over: frees only the
 * free list).  NULL-safe.  The caller guarantees no transfer still uses a
 * slot (design 2.5: a store whose copiers cannot drain leaks the pool
 * instead of destroying it). */
void sel_slab_destroy(sel_slab_pool *p);

/* Take n slots, all or none, into out[0..n): 0 or -ENOSPC (with a
 * message; the pool is unchanged).  n = 0 succeeds.  Slot ids are below
 * sel_slab_total(); the order is unspecified (freed slots come back first). */
int sel_slab_alloc(sel_slab_pool *p, uint32_t n, enum sel_slab_class cls, uint32_t *out);
/* Return n slots, all or none.  A slot out of range, already free, or named
 * twice is a caller bug: the whole call is refused (-EINVAL with a message,
 * nothing freed -- leaking the batch is safer than handing out a slot a
 * transfer may still use) and sel_slab_check() fails from then on.  Builds
 * with SEL_DEBUG_CHECKS abort instead. */
int sel_slab_free(sel_slab_pool *p, const uint32_t *slots, uint32_t n);
/* Would an allocation of n slots of class cls succeed now? */
bool sel_slab_can_alloc(const sel_slab_pool *p, uint32_t n, enum sel_slab_class cls);
/* Read, changing nothing, what an allocation of n slots would touch next
 * (the free stack's top n entries and their position words), so that a
 * caller that allocates after a long time away finds them in cache (the
 * stores' warm pass, store_common.c "Keeping the lookup warm").  Returns
 * a value of them for the caller to keep the reads alive. */
uint32_t sel_slab_warm(const sel_slab_pool *p, uint32_t n);

void *sel_slab_addr(const sel_slab_pool *p, uint32_t slot);
void *sel_slab_base(const sel_slab_pool *p);
uint64_t sel_slab_slot_bytes(const sel_slab_pool *p);
uint64_t sel_slab_total(const sel_slab_pool *p); /* warm + intake */
uint64_t sel_slab_intake(const sel_slab_pool *p);
uint64_t sel_slab_free_count(const sel_slab_pool *p);
uint64_t sel_slab_in_use(const sel_slab_pool *p);

/* Whether p's slots live in its own mapping (false: sel_slab_create_over). */
bool sel_slab_owns_memory(const sel_slab_pool *p);

/* Verify: free list holds distinct in-range slots marked free, every other
 * slot is marked in use, counts balance, and no free was ever refused.
 * 0 or SEL_ECORRUPT with sel_errmsg() naming the first violation.  O(total);
 * builds with SEL_DEBUG_CHECKS run it after every mutation. */
int sel_slab_check(const sel_slab_pool *p);

/* Automatic intake (design 1): full = 2 * max_active * row_slots + 2 * 64.
 * If headroom_bytes cannot hold full * slot_bytes, use the most slots that
 * fit, not below the floor 2 * (64 + row_slots), and write one warning into
 * warn (naming the memory full intake needs and what is used); if even the
 * floor does not fit, return -ENOMEM with a message.  headroom_bytes =
 * UINT64_MAX means unlimited (-EOVERFLOW if full intake's bytes exceed 64
 * bits).  max_active and row_slots must be >= 1 and slot_bytes a positive
 * multiple of 4 KiB (-EINVAL).  warn may be NULL; it is set to "" when there
 * is nothing to say.  *slots is written only on success. */
int sel_intake_slots(uint32_t max_active, uint32_t row_slots, uint64_t slot_bytes,
		     uint64_t headroom_bytes, uint64_t *slots, char *warn, size_t warn_len);

#endif
