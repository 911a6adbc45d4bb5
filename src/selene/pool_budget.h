/*
 * pool_budget.h - the budget check before registration (design 2.15, third
 * paragraph): a pool's Hello plan -- the manager's arena plus the client's
 * staging -- must fit the host supply and every GPU's device budget before
 * anything is registered; a plan that does not fit registers nothing, and
 * the instance serves from its local tiers with one warning naming the
 * sizes and the reason.
 *
 * DESIGN
 *   sel_pool_budget_check is pure arithmetic over the figures the loader
 *   has (struct sel_pool_budget_in), so every branch is a unit test:
 *     host supply = MemAvailable - future local host allocations
 *                   - a 2 GiB server allowance - 5 % of MemTotal
 *                   (clamped at 0);
 *     host need   = the arena's bytes not yet resident + staging (+ the
 *                   device charge once, integrated GPUs, whose device
 *                   bytes are host memory);
 *     device need = ceil(arena / 512) + ceil(staging / 512) per GPU (one
 *                   device byte per 512 registered host bytes, rounded up
 *                   separately for each region).
 *   The arena's resident part is not charged: the manager committed it
 *   (fallocate) or another instance filled it, so it is out of
 *   MemAvailable already, and charging it again would refuse an arena
 *   larger than about half the host's free memory that costs this
 *   instance nothing (docs/architecture.md reads design 2.15's "the
 *   manager's arena" this way).  sel_pool_budget_resident measures it:
 *   st_blocks of a shared-memory (tmpfs, memfd) arena, whose pages are
 *   shmem and never in MemAvailable; an arena file on another file
 *   system is charged whole (its page cache is reclaimable, so counted
 *   as available).  The device charge is on the whole arena either way.
 *   Supply that cannot be observed (no /proc/meminfo) refuses the plan
 *   with that reason.  sel_pool_budget_observe fills the host figures from
 *   /proc/meminfo, or from SELENE_TEST_MEMAVAILABLE (a size, or
 *   "unobservable"): a test knob, docs/configuration.md.
 *   With the host copy backend nothing is registered with a GPU: gpus is
 *   0 and only the host budget applies.  Stateless.
 */
#ifndef SEL_POOL_BUDGET_H
#define SEL_POOL_BUDGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SEL_POOL_SERVER_ALLOWANCE (UINT64_C(2) << 30) /* 2 GiB for the server */
#define SEL_POOL_SYSTEM_PERCENT 5                     /* of MemTotal, for the system */
#define SEL_POOL_DEVICE_RATIO 512                     /* host bytes registered per device byte */

struct sel_pool_budget_in {
	bool observed;          /* the host figures below were read */
	uint64_t mem_total;     /* MemTotal */
	uint64_t mem_available; /* MemAvailable */
	uint64_t local_future; /* local host allocations still to come (the tiers' planned bytes) */
	uint64_t arena_bytes;  /* the manager's region (Hello arena_bytes) */
	uint64_t arena_resident; /* of it already in memory (sel_pool_budget_resident) */
	uint64_t staging_bytes;  /* the client's data staging (Hello staging_bytes; 0 locally) */
	uint32_t gpus;           /* GPUs that register the regions (0: host copy backend) */
	uint64_t device_budget;  /* device bytes each of them can spare */
	bool integrated;         /* integrated GPUs: the device charge is host memory too */
};

enum sel_pool_budget_verdict {
	SEL_POOL_BUDGET_FITS = 0,
	SEL_POOL_BUDGET_HOST,         /* host need > host supply */
	SEL_POOL_BUDGET_DEVICE,       /* device need > a GPU's budget */
	SEL_POOL_BUDGET_UNOBSERVABLE, /* host supply could not be read */
};

struct sel_pool_budget_out {
	enum sel_pool_budget_verdict verdict;
	uint64_t host_need, host_supply; /* bytes */
	uint64_t arena_charged;          /* arena bytes in host_need: those not yet resident */
	uint64_t device_need;            /* per GPU */
};

/* The verdict, with the figures in *out and, unless it fits, one line in
 * msg[cap] naming the sizes and the reason ("" when it fits).  Pure. */
enum sel_pool_budget_verdict sel_pool_budget_check(const struct sel_pool_budget_in *in,
						   struct sel_pool_budget_out *out, char *msg,
						   size_t cap);

/* in->observed, mem_total and mem_available from /proc/meminfo, or from
 * SELENE_TEST_MEMAVAILABLE (test knob: a size replaces MemAvailable,
 * "unobservable" makes the supply unreadable).  Leaves the other fields. */
void sel_pool_budget_observe(struct sel_pool_budget_in *in);

/* Bytes of the arena behind fd (bytes long) already resident, for
 * arena_resident: st_blocks * 512, at most bytes, when fd is a
 * shared-memory file (memfd or tmpfs: fstatfs TMPFS_MAGIC); 0 on any
 * other file system or when fstat fails (so the whole arena is charged).
 * Swapped-out shmem pages count as resident (st_blocks keeps them). */
uint64_t sel_pool_budget_resident(int fd, uint64_t bytes);

#endif
