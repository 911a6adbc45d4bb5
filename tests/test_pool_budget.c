/*
 * test_pool_budget.c - the budget check before registration (design 2.15,
 * pool_budget.h), every branch: a plan that fits; one over the host supply
 * (MemAvailable less the local tiers to come, the 2 GiB server allowance
 * and 5 % of RAM); one over a GPU's device budget (one byte per 512, each
 * region rounded up separately); an integrated GPU's charge on the host;
 * an unobservable supply; the test knob SELENE_TEST_MEMAVAILABLE; and the
 * arena's resident part, which is not charged (an arena over the supply
 * that is mostly resident fits; the device charge stays on the whole
 * arena), with sel_pool_budget_resident on a memfd (committed, sparse,
 * touched, bounded by the arena) and on a file of another file system.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

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

/* The arena's resident part is out of MemAvailable already: charged
 * only the rest, bounded by the arena. */
static void test_resident(void)
{
	char msg[400];
	struct sel_pool_budget_out o;
	/* Supply 35 GiB (test_fits_and_host), an arena of 40: refused whole. */
	struct sel_pool_budget_in in = host(100 * GIB, 50 * GIB, 40 * GIB);
	in.local_future = 8 * GIB;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_HOST);
	CHECKF(o.arena_charged == 40 * GIB && strstr(msg, "arena 40 GiB, 40 GiB of it not yet "
							  "resident"),
	       "'%s'", msg);
	/* 38 GiB of it resident (the manager committed it, say): 2 GiB are
	 * charged, it fits although it is larger than the supply. */
	in.arena_resident = 38 * GIB;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_FITS);
	CHECK(o.arena_charged == 2 * GIB && o.host_need == 2 * GIB && !*msg);
	/* Only 4 GiB resident: the 36 not resident exceed the supply, and the
	 * warning names them. */
	in.arena_resident = 4 * GIB;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_HOST);
	CHECKF(o.host_need == 36 * GIB && strstr(msg, "36 GiB of it not yet resident"), "'%s'",
	       msg);
	/* A figure above the arena is bounded by it: nothing charged, and
	 * staging still is. */
	in.arena_resident = 41 * GIB;
	in.staging_bytes = 35 * GIB + 1;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_HOST);
	CHECK(o.arena_charged == 0 && o.host_need == 35 * GIB + 1);
	/* The device charge is on the whole arena: registration pins it all. */
	in = host(100 * GIB, 90 * GIB, GIB);
	in.arena_resident = GIB;
	in.gpus = 1;
	in.device_budget = 2 * MIB;
	in.integrated = true;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_FITS);
	CHECK(o.device_need == 2 * MIB && o.host_need == 2 * MIB && o.arena_charged == 0);
	in.device_budget = 2 * MIB - 1;
	CHECK(sel_pool_budget_check(&in, &o, msg, sizeof msg) == SEL_POOL_BUDGET_DEVICE);
}

/* sel_pool_budget_resident: st_blocks of a shared-memory descriptor. */
static void test_resident_measured(void)
{
	CHECK(sel_pool_budget_resident(-1, MIB) == 0);
	int fd = memfd_create("budget", MFD_CLOEXEC);
	CHECK(fd >= 0);
	CHECK(ftruncate(fd, 4 * (off_t)MIB) == 0);
	CHECK(sel_pool_budget_resident(fd, 4 * MIB) == 0); /* sparse */
	char page[4096];
	memset(page, 7, sizeof page);
	CHECK(pwrite(fd, page, sizeof page, (off_t)MIB) == (ssize_t)sizeof page);
	CHECK(sel_pool_budget_resident(fd, 4 * MIB) == 4096); /* one page touched */
	CHECK(fallocate(fd, 0, 0, 2 * (off_t)MIB) == 0);
	CHECK(sel_pool_budget_resident(fd, 4 * MIB) == 2 * MIB);     /* committed, as the manager */
	CHECK(sel_pool_budget_resident(fd, MIB + 100) == MIB + 100); /* bounded by the arena */
	close(fd);
	/* A file of another file system (the test's directory, unless it is a
	 * tmpfs): its page cache is reclaimable, so nothing counts as resident. */
	struct statfs fs;
	CHECK(statfs(".", &fs) == 0);
	if (fs.f_type == 0x01021994) {
		printf("the working directory is a tmpfs: the other-file-system case is skipped\n");
		return;
	}
	fd = open("arena", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	CHECK(pwrite(fd, page, sizeof page, 0) == (ssize_t)sizeof page);
	CHECK(fsync(fd) == 0);
	CHECK(sel_pool_budget_resident(fd, 4096) == 0);
	close(fd);
	CHECK(unlink("arena") == 0);
}

int main(void)
{
	test_fits_and_host();
	test_device();
	test_unobservable();
	test_knob();
	test_resident();
	test_resident_measured();
	printf("ok\n");
	return 0;
}
