/*
 * store_pool.c - the slot layout, copy backend and slab pool the stores of
 * one configuration share (design 2.2 shared components; design 1 automatic
 * intake and the warm budget rounded down to whole slots; design 2.5 slabs;
 * ARCHITECTURE "Two kinds of device memory").
 *
 * DESIGN
 *
 * A memory store uses warm slots for retention; a disk store streams
 * through intake slots; a composite lends one pool of both to its two
 * stores, so Staged and the memory store share one mapping, one
 * registration and one free list (design 2.2: "there is no separate staging
 * pool").  The warm class never takes the last intake free slots, so
 * staging always finds room once copies in flight complete.
 *
 * The intake is 2 x max_active x row_slots + 2 x 64 slots, shrunk toward
 * two complete windows when host headroom cannot hold it, with one warning
 * (sel_intake_slots).  Headroom is cfg->host_headroom, else MemAvailable
 * less the warm bytes and cfg->host_reserved, because intake comes on top
 * of the warm budget and of what the process's CPU inputs may take.
 *
 * Split pools (design 2.5).  Registering host memory maps it into every
 * device's page tables, at a device-memory cost proportional to the bytes
 * registered, whichever ranks copy them.  A standalone memory store never
 * reads its slots on the CPU (no disk thread, no checksums, no pool
 * announcements), so on the CUDA backend at TP>1 its slots are split by
 * rank: sel_cuda_split_pool_create gives rank r one pinned cuMemCreate
 * allocation of slots x share[r] bytes on the host NUMA node nearest its
 * device, mapped into one reserved range and opened to that device and the
 * host only.  Nothing is registered.  The slab pool becomes a free list
 * over the range (sel_slab_create_over), so slot numbers and their identity
 * addresses base + s * slot_bytes stay what the store and its index use;
 * the transfer threads get each rank's (part base, share) and never see the
 * identities.  Because no CPU code may read a split slot, records stay
 * per-rank: the memory store sets no compare on its jobs and the transfer
 * set refuses compare and packing.  AUTO splits only where every device
 * can create host-NUMA allocations, and otherwise keeps the registered pool
 * with a warning; ON fails instead.  Stores with a disk tier use
 * sel_store_pool_open, which never splits.
 *
 * Order.  Open: backend (retains each rank's context), intake, then the
 * split pool or the mapping.  Destroy, once every transfer set over the
 * pool has drained: free list, split parts and range (or unregister and
 * unmap), backend.  A store whose copies could not drain leaks the whole
 * struct instead (sel_store_pool_leak), split parts included.
 *
 * INVARIANTS
 *   1. A pool exists only with a backend and a layout; the backend outlives
 *      the pool (its registration hooks run at unmap).
 *   2. warm + intake == sel_slab_total(pool).
 *   3. split != NULL implies the CUDA backend, no registration
 *      (!sel_slab_owns_memory(pool)), sel_slab_base(pool) == split->base,
 *      split->slots == warm + intake and split->slot_bytes == slot_bytes.
 */
#include "store_pool.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "eos.h"
#include "store_common.h"

static int pick_backend(struct sel_store_pool *sp, const sel_store_config *cfg, const char *who)
{
	const sel_geometry *g = cfg->geometry;
	bool device = false;
	int rc;
	for (uint32_t r = 0; r < g->ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		device |= rg->row.kind == SEL_MEM_DEVICE;
		for (uint32_t i = 0; i < rg->n_planes; i++)
			device |= rg->pages[i].kind == SEL_MEM_DEVICE;
	}
	if (cfg->copy_backend) {
		sp->backend = cfg->copy_backend;
		return 0;
	}
	if (cfg->backend == SEL_BACKEND_HOST && device)
		return eos_fail(SEL_EGEOMETRY,
				"%s: host copy backend asked for, but the geometry has"
				" device planes",
				who);
	if (cfg->backend != SEL_BACKEND_CUDA && !device) {
		sp->backend = &sel_copy_backend_host;
		return 0;
	}
	/* A configured GPU is never silently replaced by memcpy: every failure
	 * here is SEL_ECUDA "cuda unavailable: ..." or a driver error. */
	rc = sel_cuda_load(&sp->cu);
	if (rc)
		return rc;
	sp->devices = calloc(g->ranks, sizeof(*sp->devices));
	if (!sp->devices)
		return eos_fail(-ENOMEM, "%s: out of memory", who);
	for (uint32_t r = 0; r < g->ranks; r++)
		sp->devices[r] =
			cfg->cuda_devices ? cfg->cuda_devices[r] : (int)r; /* rank r on device r */
	rc = sel_copy_backend_cuda_create(sp->cu, sp->devices, g->ranks, &sp->cuda_backend);
	if (rc)
		return rc;
	sp->backend = sp->cuda_backend;
	return 0;
}

/* Add one more sentence to sp's startup warning. */
static void add_warning(struct sel_store_pool *sp, const char *text)
{
	size_t n = strlen(sp->warning);
	snprintf(sp->warning + n, sizeof(sp->warning) - n, "%s%s", n ? "; " : "", text);
}

/* Whether a standalone memory store's pool is split (design 2.5): 1, 0, or
 * an error for a mode that cannot be honoured. */
static int split_wanted(struct sel_store_pool *sp, const sel_store_config *cfg, const char *who)
{
	sel_split_mode mode = cfg->split_pool;
	int rc;
	if (mode == SEL_SPLIT_OFF)
		return 0;
	if (mode != SEL_SPLIT_AUTO && mode != SEL_SPLIT_ON)
		return eos_fail(-EINVAL,
				"%s: split_pool %d is not a split mode (auto 0, on 1, off 2)", who,
				(int)mode);
	if (!sp->cuda_backend) {
		if (mode == SEL_SPLIT_AUTO)
			return 0;
		return eos_fail(
			-EINVAL,
			"%s: a split pool needs the CUDA copy backend, this store copies with"
			" '%s'",
			who, sp->backend->name ? sp->backend->name : "?");
	}
	if (mode == SEL_SPLIT_ON)
		return 1; /* sel_cuda_split_pool_create names a device that cannot */
	if (sp->g->ranks < 2)
		return 0;
	for (uint32_t r = 0; r < sp->g->ranks; r++) {
		struct sel_cuda_device_info info;
		if ((rc = sel_cuda_device_info(sp->cu, sp->devices[r], &info)))
			return rc;
		if (!info.host_numa_vmm) {
			char w[256];
			snprintf(w, sizeof(w),
				 "%s: device %d (rank %" PRIu32 ") cannot create host NUMA"
				 " allocations, so the slot pool is registered whole and every "
				 "device maps all"
				 " of it (no split pool, design 2.5)",
				 who, sp->devices[r], r);
			add_warning(sp, w);
			return 0;
		}
	}
	return 1;
}

static int pool_open(const sel_store_config *cfg, uint64_t warm_bytes, const char *who,
		     bool memory_only, struct sel_store_pool **out)
{
	struct sel_store_pool *sp;
	int rc;

	*out = NULL;
	if (!cfg || !cfg->geometry)
		return eos_fail(-EINVAL, "%s: no geometry", who);
	if (!memory_only && cfg->split_pool == SEL_SPLIT_ON)
		return eos_fail(-EINVAL,
				"%s: split_pool is on, but a store with a disk tier reads whole"
				" records on the CPU and needs the registered pool; split pools "
				"serve memory"
				" stores alone (design 2.5)",
				who);
	const sel_geometry *g = cfg->geometry;
	if (!(sp = calloc(1, sizeof(*sp))))
		return eos_fail(-ENOMEM, "%s: out of memory", who);
	sp->g = g;
	rc = sel_slot_layout_init(&sp->layout, g);
	if (rc == 0)
		rc = sel_record_layout_init(&sp->rl, g);
	if (rc)
		goto fail;
	sp->slot_bytes = sp->layout.slot_bytes;
	sp->row_slots = sp->layout.row_slots;
	sp->min_pages = UINT64_MAX;
	sp->min_rows = UINT64_MAX;
	for (uint32_t r = 0; r < g->ranks; r++) {
		sp->page_bytes_all += g->rank[r].page_bytes;
		sp->row_bytes_all += g->rank[r].row.unit_bytes;
		if (g->rank[r].page_count < sp->min_pages)
			sp->min_pages = g->rank[r].page_count;
		if (g->rank[r].row_count < sp->min_rows)
			sp->min_rows = g->rank[r].row_count;
	}
	rc = pick_backend(sp, cfg, who);
	if (rc)
		goto fail;

	sp->warm = warm_bytes / sp->slot_bytes;
	if (warm_bytes && sp->warm == 0) {
		char a[32], b[32];
		rc = eos_fail(-EINVAL, "%s: warm budget %s is smaller than one slot (%s)", who,
			      eos_format_size(warm_bytes, a, sizeof(a)),
			      eos_format_size(sp->slot_bytes, b, sizeof(b)));
		goto fail;
	}
	uint64_t headroom = cfg->host_headroom;
	if (headroom == 0) {
		uint64_t total = 0, avail = 0;
		rc = eos_mem_info(&total, &avail);
		if (rc)
			goto fail;
		/* intake comes on top of the warm budget and what others reserved */
		uint64_t warm_b = sp->warm * sp->slot_bytes + cfg->host_reserved;
		headroom = avail > warm_b ? avail - warm_b : 0;
	}
	rc = sel_intake_slots(cfg->max_active ? cfg->max_active : 1, sp->row_slots, sp->slot_bytes,
			      headroom, &sp->intake, sp->warning, sizeof(sp->warning));
	if (rc)
		goto fail;

	int split = memory_only ? split_wanted(sp, cfg, who) : 0;
	if (split < 0) {
		rc = split;
		goto fail;
	}
	if (split) {
		struct sel_cuda_split_pool *p;
		rc = sel_cuda_split_pool_create(sp->cu, sp->devices, &sp->layout,
						sp->warm + sp->intake, &p);
		if (rc)
			goto fail;
		sp->split = p;
		rc = sel_slab_create_over((void *)(uintptr_t)p->base, sp->slot_bytes, sp->warm,
					  sp->intake, &sp->pool);
		if (rc)
			goto fail;
	} else {
		struct sel_slab_hooks hooks = {
			.reg = sp->backend->host_register,
			.unreg = sp->backend->host_unregister,
			.ctx = sp->backend->ctx,
		};
		rc = sel_slab_create(sp->slot_bytes, sp->warm, sp->intake, cfg->populate, &hooks,
				     &sp->pool);
		if (rc)
			goto fail;
	}
	*out = sp;
	return 0;
fail:
	sel_store_pool_destroy(sp);
	return rc;
}

int sel_store_pool_open(const sel_store_config *cfg, uint64_t warm_bytes, const char *who,
			struct sel_store_pool **out)
{
	return pool_open(cfg, warm_bytes, who, false, out);
}

int sel_store_pool_open_memory(const sel_store_config *cfg, uint64_t warm_bytes, const char *who,
			       struct sel_store_pool **out)
{
	return pool_open(cfg, warm_bytes, who, true, out);
}

int sel_store_pool_xfer_create(const struct sel_store_pool *sp, uint32_t queue_depth,
			       sel_xfer **out)
{
	if (!sp->split)
		return sel_xfer_create(sp->g, &sp->layout, sp->pool, sp->backend, queue_depth, out);
	struct sel_xfer_part *parts = calloc(sp->g->ranks, sizeof(*parts));
	*out = NULL;
	if (!parts)
		return eos_fail(-ENOMEM, "split pool: out of memory");
	sel_cuda_split_pool_parts(sp->split, parts);
	int rc = sel_xfer_create_parts(sp->g, &sp->layout, parts, sel_slab_total(sp->pool),
				       sp->backend, queue_depth, out);
	free(parts);
	return rc;
}

void sel_store_landed_install(const sel_store_config *cfg, sel_xfer *x)
{
	const sel_geometry *g = cfg->geometry;
	if (!cfg->landed || !cfg->landed->fn || !x)
		return;
	for (uint32_t r = 0; r < g->ranks; r++) {
		if (g->rank[r].row.kind != SEL_MEM_HOST)
			return;
		for (uint32_t k = 0; k < g->rank[r].n_planes; k++)
			if (g->rank[r].pages[k].kind != SEL_MEM_HOST)
				return;
	}
	sel_xfer_set_landed(x, cfg->landed);
}

void sel_store_pool_destroy(struct sel_store_pool *sp)
{
	if (!sp)
		return;
	sel_slab_destroy(sp->pool); /* unregisters through the backend (registered pool) */
	sel_cuda_split_pool_destroy(sp->split);
	if (sp->cuda_backend)
		sel_copy_backend_cuda_destroy(sp->cuda_backend);
	free(sp->devices);
	sel_slot_layout_free(&sp->layout);
	sel_record_layout_free(&sp->rl);
	free(sp);
}

void sel_store_pool_leak(struct sel_store_pool *sp)
{
	if (sp)
		sel_leak((void *[]){sp}, 1); /* still never reused */
}

int sel_store_pool_map(const struct sel_store_pool *sp, uint32_t flags, const uint32_t *slots,
		       uint32_t n_page_slots, uint32_t n_row_slots, uint32_t first, uint32_t count,
		       void **pages, struct iovec *iov, uint32_t iov_cap, uint32_t *n_iov)
{
	uint32_t n_slots = n_page_slots + n_row_slots;
	void *sa[2 * SEL_WINDOW_PAGES + 64];
	void **addr = n_slots <= sizeof sa / sizeof sa[0] ? sa : malloc(n_slots * sizeof(void *));
	int rc = 0;
	if (!addr)
		return eos_fail(-ENOMEM,
				"slot pool: out of memory for the addresses of %" PRIu32 " slots",
				n_slots);
	for (uint32_t i = 0; i < n_slots; i++)
		addr[i] = sel_slab_addr(sp->pool, slots[i]);
	for (uint32_t i = 0; i < count; i++)
		pages[i] = sel_record_page_addr(&sp->rl, flags, addr, first + i);
	*n_iov = 0;
	if (n_row_slots) {
		int k = sel_record_row_iov(&sp->rl, flags, addr + n_page_slots, n_row_slots, iov,
					   iov_cap);
		if (k < 0)
			rc = eos_fail(k,
				      "slot pool: a row of %" PRIu32
				      " slots has more pieces than %" PRIu32,
				      n_row_slots, iov_cap);
		else
			*n_iov = (uint32_t)k;
	}
	if (addr != sa)
		free(addr);
	return rc;
}
