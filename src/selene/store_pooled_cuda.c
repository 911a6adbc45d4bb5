/*
 * store_pooled_cuda.c - the pooled store's CUDA path (design 2.15
 * "registration", the budget check's device half; store_pooled.h).
 *
 * DESIGN
 *   With device planes (or backend CUDA) and no test backend, the pooled
 *   store copies between the arena's windows and the device page planes
 *   through a CUDA copy backend of its own (design 2.15: "the pool has its
 *   own copier"), made with sel_copy_backend_cuda_create over the ranks'
 *   devices (cfg->cuda_devices, else rank r on device r, as store_pool.c).
 *   The restores then verify on the helpers and copy on the transfer set
 *   (not fused: that stays the host path's).
 *
 *   Order at attach.  The driver is loaded before the session (a driver
 *   that cannot be loaded is an open error, as for the local tiers).  Once
 *   the hello names the arena, the budget check gets the device half: the
 *   GPUs registering it (distinct devices of the ranks), the least free
 *   memory among them (cuMemGetInfo_v2 through sel_cuda_device_memory) less
 *   SP_CUDA_RESERVE for the copier's streams, and whether any is
 *   integrated (CU_DEVICE_ATTRIBUTE_INTEGRATED).  A figure the driver
 *   cannot give refuses the plan, as an unobservable host supply does.
 *   Only a plan that fits makes the backend and registers the arena
 *   mapping, once (the backend's host_register: cuMemHostRegister_v2,
 *   PORTABLE, which maps it into every device), and requires the device
 *   address of the registration to be the host address (the startup
 *   registrar's rule: the copies name the windows by host address).  A
 *   registration the driver refuses, or one at another device address,
 *   gives one warning, closes the session and leaves nothing registered:
 *   local tiers.
 *
 *   Unregistration.  The arena stays registered while the session lives
 *   and across a reattach to the same region generation (the mapping is
 *   the same).  A manager back with another generation disables sharing
 *   (SEL_POOL_EV_DISABLED, only once every lease of the lost session has
 *   ended, so no copy touches the arena): the old mapping is unregistered
 *   then.  Close unregisters once the transfer set drained, before the
 *   client unmaps; a close whose copies could not drain leaks the
 *   registration with the mapping.
 *
 * INVARIANTS
 *   1. reg_addr != NULL iff the arena mapping is registered, and then
 *      cuda_be != NULL and pc != NULL.
 *   2. Registered at most once per mapping (one client maps one region
 *      generation).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "eos.h"
#include "store_common.h"
#include "store_pooled.h"

bool sp_cuda_wanted(const sel_store_config *cfg)
{
	if (cfg->copy_backend || cfg->backend == SEL_BACKEND_HOST)
		return false;
	if (cfg->backend == SEL_BACKEND_CUDA)
		return true;
	const sel_geometry *g = cfg->geometry;
	for (uint32_t r = 0; r < g->ranks; r++) {
		if (g->rank[r].row.kind == SEL_MEM_DEVICE)
			return true;
		for (uint32_t i = 0; i < g->rank[r].n_planes; i++)
			if (g->rank[r].pages[i].kind == SEL_MEM_DEVICE)
				return true;
	}
	return false;
}

int sp_cuda_load(struct sel_pooled *p, const sel_store_config *cfg)
{
	int rc = sel_cuda_load(&p->cu);
	if (rc)
		return rc;
	uint32_t ranks = cfg->geometry->ranks;
	if (!(p->cu_dev = calloc(ranks, sizeof *p->cu_dev)))
		return eos_fail(-ENOMEM, "pooled store: out of memory");
	for (uint32_t r = 0; r < ranks; r++)
		p->cu_dev[r] = cfg->cuda_devices ? cfg->cuda_devices[r] : (int)r;
	return 0;
}

int sp_cuda_budget(struct sel_pooled *p, struct sel_pool_budget_in *in, char *msg, size_t cap)
{
	if (!p->cu)
		return 0;
	uint64_t least = UINT64_MAX;
	for (uint32_t r = 0; r < p->g->ranks; r++) {
		int d = p->cu_dev[r];
		bool seen = false;
		for (uint32_t q = 0; q < r; q++)
			seen |= p->cu_dev[q] == d;
		if (seen)
			continue;
		struct sel_cuda_device_info info;
		uint64_t fr, tot;
		if (sel_cuda_device_info(p->cu, d, &info) ||
		    sel_cuda_device_memory(p->cu, d, &fr, &tot)) {
			char a[32];
			snprintf(msg, cap,
				 "pool budget: the device memory of GPU %d cannot be observed "
				 "(%.200s), so registering the arena of %s is refused",
				 d, eos_errmsg(), eos_format_size(in->arena_bytes, a, sizeof a));
			return SEL_ECUDA;
		}
		in->gpus++;
		in->integrated |= info.integrated;
		fr = fr > SP_CUDA_RESERVE ? fr - SP_CUDA_RESERVE : 0;
		least = fr < least ? fr : least;
	}
	in->device_budget = in->gpus ? least : 0;
	return 0;
}

/* Give up on the pool after attach: one warning, the session closed. */
static bool sp_cuda_refuse(struct sel_pooled *p, const char *what)
{
	char a[32];
	uint64_t len = 0;
	(void)sel_pool_arena(p->pc, &len);
	snprintf(p->warn, sizeof p->warn,
		 "prefix cache pool %.120s: %s the arena of %s with the CUDA driver failed: "
		 "%.200s; nothing was registered, local tiers will be used and this instance "
		 "will not attach later",
		 p->address, what, eos_format_size(len, a, sizeof a), eos_errmsg());
	snprintf(p->desc, sizeof p->desc, "%s (not attached: registration)", p->address);
	(void)sel_pool_close(p->pc);
	sel_pool_destroy(p->pc);
	p->pc = NULL;
	sel_copy_backend_cuda_destroy(p->cuda_be);
	p->cuda_be = NULL;
	return false;
}

bool sp_cuda_register(struct sel_pooled *p)
{
	if (sel_copy_backend_cuda_create(p->cu, p->cu_dev, p->g->ranks, &p->cuda_be))
		return sp_cuda_refuse(p, "preparing to register");
	uint64_t len = 0;
	void *addr = sel_pool_arena(p->pc, &len);
	if (p->cuda_be->host_register(p->cuda_be->ctx, addr, len))
		return sp_cuda_refuse(p, "registering");
	p->reg_addr = addr;
	p->reg_len = len;
	if (sel_cuda_host_identical(p->cuda_be, addr)) {
		char msg[EOS_ERRMSG_MAX];
		snprintf(msg, sizeof msg, "%s", eos_errmsg());
		sp_cuda_unregister(p); /* the copies name windows by host address */
		(void)eos_fail(SEL_ECUDA, "%s", msg);
		return sp_cuda_refuse(p, "registering");
	}
	return true;
}

void sp_cuda_unregister(struct sel_pooled *p)
{
	if (!p->reg_addr)
		return;
	p->cuda_be->host_unregister(p->cuda_be->ctx, p->reg_addr, p->reg_len);
	p->reg_addr = NULL;
	p->reg_len = 0;
}

void sp_cuda_free(struct sel_pooled *p, bool leak)
{
	if (leak && p->cuda_be)
		sel_leak((void *[]){p->cuda_be}, 1); /* a copy may still run on it */
	else
		sel_copy_backend_cuda_destroy(p->cuda_be);
	p->cuda_be = NULL;
	free(p->cu_dev);
	p->cu_dev = NULL;
}
