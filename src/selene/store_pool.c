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
 * less the warm bytes, because intake comes on top of the warm budget.
 *
 * INVARIANTS
 *   1. A pool exists only with a backend and a layout; the backend outlives
 *      the pool (its registration hooks run at unmap).
 *   2. warm + intake == sel_slab_total(pool).
 */
#include "store_pool.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "eos.h"

/* Leaked pools stay reachable (design 2.5: never reuse under copies). */
static pthread_mutex_t leak_mu = PTHREAD_MUTEX_INITIALIZER;
static struct leaked_pool {
	struct sel_store_pool *sp;
	struct leaked_pool *next;
} *leaked_pools;

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
		return eos_fail(SEL_EGEOMETRY, "%s: host copy backend asked for, but the geometry has"
				" device planes", who);
	if (cfg->backend != SEL_BACKEND_CUDA && !device) {
		sp->backend = &sel_copy_backend_host;
		return 0;
	}
	/* A configured GPU is never silently replaced by memcpy: every failure
	 * here is SEL_ECUDA "cuda unavailable: ..." or a driver error. */
	const struct sel_cuda *cu;
	rc = sel_cuda_load(&cu);
	if (rc)
		return rc;
	int *dev = NULL;
	const int *devices = cfg->cuda_devices;
	if (!devices) {
		dev = calloc(g->ranks, sizeof(*dev));
		if (!dev)
			return eos_fail(-ENOMEM, "%s: out of memory", who);
		for (uint32_t r = 0; r < g->ranks; r++)
			dev[r] = (int)r; /* rank r on device r */
		devices = dev;
	}
	rc = sel_copy_backend_cuda_create(cu, devices, g->ranks, &sp->cuda_backend);
	free(dev);
	if (rc)
		return rc;
	sp->backend = sp->cuda_backend;
	return 0;
}

int sel_store_pool_open(const sel_store_config *cfg, uint64_t warm_bytes, const char *who,
			struct sel_store_pool **out)
{
	struct sel_store_pool *sp;
	int rc;

	*out = NULL;
	if (!cfg || !cfg->geometry)
		return eos_fail(-EINVAL, "%s: no geometry", who);
	const sel_geometry *g = cfg->geometry;
	if (!(sp = calloc(1, sizeof(*sp))))
		return eos_fail(-ENOMEM, "%s: out of memory", who);
	sp->g = g;
	rc = sel_slot_layout_init(&sp->layout, g);
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
		uint64_t warm_b = sp->warm * sp->slot_bytes; /* intake comes on top */
		headroom = avail > warm_b ? avail - warm_b : 0;
	}
	rc = sel_intake_slots(cfg->max_active ? cfg->max_active : 1, sp->row_slots, sp->slot_bytes,
			      headroom, &sp->intake, sp->warning, sizeof(sp->warning));
	if (rc)
		goto fail;
	struct sel_slab_hooks hooks = {
		.reg = sp->backend->host_register,
		.unreg = sp->backend->host_unregister,
		.ctx = sp->backend->ctx,
	};
	rc = sel_slab_create(sp->slot_bytes, sp->warm, sp->intake, cfg->populate, &hooks, &sp->pool);
	if (rc)
		goto fail;
	*out = sp;
	return 0;
fail:
	sel_store_pool_destroy(sp);
	return rc;
}

void sel_store_pool_destroy(struct sel_store_pool *sp)
{
	if (!sp)
		return;
	sel_slab_destroy(sp->pool); /* unregisters through the backend */
	if (sp->cuda_backend)
		sel_copy_backend_cuda_destroy(sp->cuda_backend);
	sel_slot_layout_free(&sp->layout);
	free(sp);
}

void sel_store_pool_leak(struct sel_store_pool *sp)
{
	if (!sp)
		return;
	struct leaked_pool *l = malloc(sizeof(*l));
	if (!l)
		return; /* leaked unreachable: still never reused */
	l->sp = sp;
	pthread_mutex_lock(&leak_mu);
	l->next = leaked_pools;
	leaked_pools = l;
	pthread_mutex_unlock(&leak_mu);
}
