/*
 * pool_budget.c - the budget check before registration (pool_budget.h has
 * the design).
 */
#include "pool_budget.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "eos.h"

static uint64_t sub0(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

static uint64_t device_charge(uint64_t region)
{
	return region / SEL_POOL_DEVICE_RATIO + (region % SEL_POOL_DEVICE_RATIO != 0);
}

enum sel_pool_budget_verdict sel_pool_budget_check(const struct sel_pool_budget_in *in,
						   struct sel_pool_budget_out *out, char *msg,
						   size_t cap)
{
	char a[32], b[32], c[32], d[32], e[32], f[32], g[32];
	*out = (struct sel_pool_budget_out){0};
	if (cap)
		*msg = 0;
	uint64_t dev = add_sat(device_charge(in->arena_bytes), device_charge(in->staging_bytes));
	out->device_need = in->gpus ? dev : 0;
	out->arena_charged = sub0(in->arena_bytes, in->arena_resident);
	out->host_need = add_sat(out->arena_charged, in->staging_bytes);
	if (in->gpus && in->integrated)
		out->host_need = add_sat(out->host_need, dev); /* once per host */
	if (!in->observed) {
		out->verdict = SEL_POOL_BUDGET_UNOBSERVABLE;
		snprintf(msg, cap,
			 "pool budget: the host supply cannot be observed (/proc/meminfo), so the "
			 "plan of %s (arena %s, staging %s) is refused",
			 eos_format_size(out->host_need, a, sizeof a),
			 eos_format_size(in->arena_bytes, b, sizeof b),
			 eos_format_size(in->staging_bytes, c, sizeof c));
		return out->verdict;
	}
	uint64_t system = in->mem_total / 100 * SEL_POOL_SYSTEM_PERCENT +
			  in->mem_total % 100 * SEL_POOL_SYSTEM_PERCENT / 100;
	out->host_supply = sub0(
		sub0(sub0(in->mem_available, in->local_future), SEL_POOL_SERVER_ALLOWANCE), system);
	if (out->host_need > out->host_supply) {
		out->verdict = SEL_POOL_BUDGET_HOST;
		snprintf(msg, cap,
			 "pool budget: the plan of %s (arena %s, %s of it not yet resident, "
			 "staging %s) exceeds the host supply of %s (available %s less %s of "
			 "local tiers, the 2 GiB server allowance and 5%% of RAM)",
			 eos_format_size(out->host_need, a, sizeof a),
			 eos_format_size(in->arena_bytes, b, sizeof b),
			 eos_format_size(out->arena_charged, g, sizeof g),
			 eos_format_size(in->staging_bytes, c, sizeof c),
			 eos_format_size(out->host_supply, d, sizeof d),
			 eos_format_size(in->mem_available, e, sizeof e),
			 eos_format_size(in->local_future, f, sizeof f));
		return out->verdict;
	}
	if (out->device_need > in->device_budget) {
		out->verdict = SEL_POOL_BUDGET_DEVICE;
		snprintf(
			msg, cap,
			"pool budget: registering %s (arena %s, staging %s) charges each of %" PRIu32
			" GPUs %s of device memory (one byte per 512, per region), over its "
			"budget of %s",
			eos_format_size(out->host_need, a, sizeof a),
			eos_format_size(in->arena_bytes, b, sizeof b),
			eos_format_size(in->staging_bytes, c, sizeof c), in->gpus,
			eos_format_size(out->device_need, d, sizeof d),
			eos_format_size(in->device_budget, e, sizeof e));
		return out->verdict;
	}
	return out->verdict = SEL_POOL_BUDGET_FITS;
}

void sel_pool_budget_observe(struct sel_pool_budget_in *in)
{
	const char *knob = getenv("SELENE_TEST_MEMAVAILABLE");
	uint64_t total = 0, avail = 0;
	in->observed = false;
	if (eos_mem_info(&total, &avail) == 0) {
		in->observed = true;
		in->mem_total = total;
		in->mem_available = avail;
	}
	if (knob && *knob) {
		uint64_t v;
		if (!strcmp(knob, "unobservable"))
			in->observed = false;
		else if (eos_parse_size(knob, &v) == 0 && in->observed)
			in->mem_available = v;
	}
}

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

uint64_t sel_pool_budget_resident(int fd, uint64_t bytes)
{
	struct stat st;
	struct statfs fs;
	if (fd < 0 || fstat(fd, &st) || fstatfs(fd, &fs) || fs.f_type != TMPFS_MAGIC ||
	    st.st_blocks < 0)
		return 0;
	uint64_t b = (uint64_t)st.st_blocks;
	return b > bytes / 512 ? bytes : b * 512;
}
