/*
 * test_pool_budget.c - the budget check before registration (design 2.15,
 * pool_budget.h), every branch: a plan that fits; one over the host supply
 * (MemAvailable less the local tiers to come, the 2 GiB server allowance
 * and 5 % of RAM); one over a GPU's device budget (one byte per 512, each
 * region rounded up separately); an integrated GPU's charge on the host;
 * an unobservable supply; and the test knob SELENE_TEST_MEMAVAILABLE.
 */
#include <stdlib.h>
#include <string.h>

#include "pool_budget.h"
#include "testutil.h"

#define GIB (UINT64_C(1) << 30)
#define MIB (UINT64_C(1) << 20)

static struct sel_pool_budget_in host(uint64_t total, uint64_t avail, uint64_t arena)
{
	return (struct sel_pool_budget_in){
		.observed = true, .mem_total = total, .mem_available = avail, .arena_bytes = arena};
}

static void test_fits_and_host(void)
{
	char msg[400];
	struct sel_pool_budget_out o;
	/* 100 GiB of RAM, 50 available, 8 for the local tiers: the supply is
	 * 50 - 8 - 2 - 5 = 35 GiB. */
	struct sel_pool_budget_in in = host(100 * GIB, 50 * GIB, 35 * GIB);
	in.local_future = 8 * GIB;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_FITS);
	CHECK(o.host_supply == 35 * GIB && o.host_need == 35 * GIB && !*msg);
	CHECK(o.device_need == 0); /* no GPU registers it */
	in.arena_bytes = 35 * GIB + 1;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_HOST);
	CHECKF(strstr(msg, "host supply of 35 GiB") && strstr(msg, "available 50 GiB") &&
		       strstr(msg, "8 GiB of local tiers"),
	       "'%s'", msg);
	/* Staging counts on the host too. */
	in.arena_bytes = 30 * GIB;
	in.staging_bytes = 6 * GIB;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_HOST);
	CHECK(o.host_need == 36 * GIB && strstr(msg, "staging 6 GiB"));
	/* Less available than the allowances: the supply is 0, not a wrap. */
	in = host(100 * GIB, GIB, 4096);
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_HOST);
	CHECK(o.host_supply == 0);
}

static void test_device(void)
{
	char msg[400];
	struct sel_pool_budget_out o;
	/* 1 GiB + 1 byte of arena and 513 bytes of staging: 2 MiB + 1 and 2
	 * device bytes (each region rounded up on its own). */
	struct sel_pool_budget_in in = host(100 * GIB, 90 * GIB, GIB + 1);
	in.staging_bytes = 513;
	in.gpus = 4;
	in.device_budget = 2 * MIB + 3;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_FITS);
	CHECK(o.device_need == 2 * MIB + 3);
	in.device_budget = 2 * MIB + 2;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_DEVICE);
	CHECKF(strstr(msg, "each of 4 GPUs") && strstr(msg, "budget of"), "'%s'", msg);
	/* Integrated GPUs: the device charge lands on the host once. */
	in.device_budget = 4 * MIB;
	in.integrated = true;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_FITS);
	CHECK(o.host_need == GIB + 1 + 513 + 2 * MIB + 3);
	in.mem_available = 2 * GIB + 5 * GIB + GIB + 513 + 1; /* 2 MiB short */
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_HOST);
}

static void test_unobservable(void)
{
	char msg[400];
	struct sel_pool_budget_out o;
	struct sel_pool_budget_in in = {.observed = false, .arena_bytes = 8 * MIB};
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_UNOBSERVABLE);
	CHECKF(strstr(msg, "cannot be observed") && strstr(msg, "8 MiB"), "'%s'", msg);
}

static void test_knob(void)
{
	struct sel_pool_budget_in in = {0};
	unsetenv("SELENE_TEST_MEMAVAILABLE");
	sel_pool_budget_observe(&in);
	CHECK(in.observed && in.mem_total > 0 && in.mem_available <= in.mem_total);
	setenv("SELENE_TEST_MEMAVAILABLE", "3GiB", 1);
	sel_pool_budget_observe(&in);
	CHECK(in.observed && in.mem_available == 3 * GIB);
	setenv("SELENE_TEST_MEMAVAILABLE", "unobservable", 1);
	sel_pool_budget_observe(&in);
	CHECK(!in.observed);
	unsetenv("SELENE_TEST_MEMAVAILABLE");
}

int main(void)
{
	test_fits_and_host();
	test_device();
	test_unobservable();
	test_knob();
	printf("ok\n");
	return 0;
}
