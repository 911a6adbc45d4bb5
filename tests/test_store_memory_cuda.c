/*
 * test_store_memory_cuda.c - the memory store on a real GPU (design 2.4,
 * 2.5): device page planes and rows, the CUDA copy backend chosen by the
 * store from the geometry's memory kinds, the slab pool registered through
 * it.
 *
 * Exits 77 (skip), saying why, where libcuda.so.1 cannot be loaded or no
 * device is visible.  With a GPU it covers, for one rank and for two ranks
 * (devices 0 and 1, or both on device 0) with split and with replicated
 * planes: a root record and its child stored from scattered page ids (the
 * root over 64 pages, so several windows and 16 MiB batch calls), the
 * device poisoned, the chain looked up and fetched into other page ids and
 * another state slot, byte-exact; a fetch above a GPU-resident prefix; and
 * the packed / per-rank counters (replicated TP2 records pack on the
 * registered pool).
 *
 * Split pools (design 2.5, memory-only TP>1): the default mode splits a TP2
 * store where every device can create host-NUMA allocations (else it keeps
 * the registered pool and warns), split_pool on splits or fails with
 * SEL_ECUDA, off never splits.  On a split pool the same round trips run,
 * records stay per-rank even with replicated planes, and each rank's page
 * bytes are read back on the CPU from its own part at part base + slot x
 * share (the parts are opened to the host as well as the rank's device).
 */
#include <poll.h>

#include "cuda.h"
#include "eos.h"
#include "slab.h"
#include "store_memory.h"
#include "store_pool.h"
#include "storefx.h"
#include "testutil.h"

#define PLANE_A (256u * 1024)
#define PLANE_B 3000u
#define ROW 300000u
#define PAGES 200u
#define ROWS 4u
#define PT 64u

static const struct sel_cuda *cu;

#define CU(call) CHECK_OK(sel_cuda_fail(cu, (call), "%s", #call))

struct gworld {
	uint32_t ranks;
	int dev[2];
	sel_cu_ctx ctx[2];
	sel_cu_dptr mem[2][3]; /* planes a, b, row */
	uint64_t len[2][3];
	uint8_t *host[2][3]; /* the bytes written to the device */
	sel_geometry *g;
};

static const uint64_t unit[3] = {PLANE_A, PLANE_B, ROW};

static void set_device(struct gworld *w, uint32_t r) { CU(cu->cuCtxSetCurrent(w->ctx[r])); }

static void gworld_open(struct gworld *w, uint32_t ranks, const int *devices, bool replicated,
			test_rng *rng)
{
	static const char *names[3] = {"a", "b", "row"};
	const uint64_t count[3] = {PAGES, PAGES, ROWS};
	sel_allocation al[6];
	size_t n = 0;
	uint64_t seed = test_rng_next(rng);
	memset(w, 0, sizeof(*w));
	w->ranks = ranks;
	for (uint32_t r = 0; r < ranks; r++) {
		sel_cu_device d;
		w->dev[r] = devices[r];
		CU(cu->cuDeviceGet(&d, devices[r]));
		CU(cu->cuDevicePrimaryCtxRetain(&w->ctx[r], d));
		set_device(w, r);
		for (int p = 0; p < 3; p++) {
			w->len[r][p] = unit[p] * count[p];
			CU(cu->cuMemAlloc(&w->mem[r][p], w->len[r][p]));
			w->host[r][p] = malloc(w->len[r][p]);
			CHECK(w->host[r][p]);
			test_rng pr;
			test_rng_init(&pr, replicated ? seed + (uint64_t)p : test_rng_next(rng));
			test_rng_fill(&pr, w->host[r][p], w->len[r][p]);
			CU(cu->cuMemcpyHtoD(w->mem[r][p], w->host[r][p], w->len[r][p]));
			al[n++] = (sel_allocation){.rank = r,
						   .name = names[p],
						   .group = p == 2 ? SEL_GROUP_STATE_ROWS
								   : SEL_GROUP_KV_PAGES,
						   .kind = SEL_MEM_DEVICE,
						   .address = w->mem[r][p],
						   .unit_bytes = unit[p],
						   .count = count[p]};
		}
	}
	CHECK_OK(sel_geometry_build(al, n, ranks, PT, &w->g));
}

static void gworld_close(struct gworld *w)
{
	for (uint32_t r = 0; r < w->ranks; r++) {
		set_device(w, r);
		for (int p = 0; p < 3; p++) {
			CU(cu->cuMemFree(w->mem[r][p]));
			free(w->host[r][p]);
		}
		CU(cu->cuCtxSetCurrent(NULL));
		sel_cu_device d;
		CU(cu->cuDeviceGet(&d, w->dev[r]));
		CU(cu->cuDevicePrimaryCtxRelease(d));
	}
	sel_geometry_free(w->g);
}

static void poison_device(struct gworld *w)
{
	for (uint32_t r = 0; r < w->ranks; r++) {
		set_device(w, r);
		for (int p = 0; p < 3; p++) {
			uint8_t *z = malloc(w->len[r][p]);
			CHECK(z);
			memset(z, 0x5a, w->len[r][p]);
			CU(cu->cuMemcpyHtoD(w->mem[r][p], z, w->len[r][p]));
			free(z);
		}
	}
}

static void restore_device(struct gworld *w)
{
	for (uint32_t r = 0; r < w->ranks; r++) {
		set_device(w, r);
		for (int p = 0; p < 3; p++)
			CU(cu->cuMemcpyHtoD(w->mem[r][p], w->host[r][p], w->len[r][p]));
	}
}

/* Does the device hold the original bytes of (plane p, index src) at dst? */
static bool device_has(struct gworld *w, uint32_t r, int p, uint32_t dst, uint32_t src)
{
	uint8_t *b = malloc(unit[p]);
	CHECK(b);
	set_device(w, r);
	CU(cu->cuMemcpyDtoH(b, w->mem[r][p] + (uint64_t)dst * unit[p], unit[p]));
	bool same = memcmp(b, w->host[r][p] + (uint64_t)src * unit[p], unit[p]) == 0;
	free(b);
	return same;
}

static sel_event wait_one(sel_store *s)
{
	sel_event ev;
	uint64_t deadline = eos_now_ns() + 60ull * 1000000000;
	for (;;) {
		int n = sel_store_poll(s, &ev, 1);
		CHECK_OK(n);
		if (n == 1)
			return ev;
		CHECK(eos_now_ns() < deadline);
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		poll(&pfd, 1, 10);
	}
}

/* Can every device create the host-NUMA allocations of a split pool? */
static bool numa_capable(uint32_t ranks, const int *devices)
{
	for (uint32_t r = 0; r < ranks; r++) {
		struct sel_cuda_device_info info;
		CHECK_OK(sel_cuda_device_info(cu, devices[r], &info));
		if (!info.host_numa_vmm)
			return false;
	}
	return true;
}

static const char *mode_name(sel_split_mode m)
{
	return m == SEL_SPLIT_ON ? "on" : m == SEL_SPLIT_OFF ? "off" : "auto";
}

static void run(uint32_t ranks, const int *devices, bool replicated, sel_split_mode mode,
		test_rng *rng)
{
	struct gworld w;
	gworld_open(&w, ranks, devices, replicated, rng);

	sel_store_config cfg = {0};
	cfg.geometry = w.g;
	cfg.max_active = 1;
	cfg.cuda_devices = devices;
	cfg.host_headroom = 1ull << 30;
	cfg.split_pool = mode;
	uint64_t slot = 0;
	for (uint32_t r = 0; r < ranks; r++)
		slot += eos_round_up(PLANE_A, 4096) + eos_round_up(PLANE_B, 4096);
	cfg.memory_bytes = 120 * slot;
	sel_store *s;
	bool capable = numa_capable(ranks, devices);
	if (mode == SEL_SPLIT_ON && !capable) {
		CHECK_RC(sel_memory_store_open(&cfg, &s), SEL_ECUDA);
		printf("memory store: split pool on: refused as expected: %s\n", sel_errmsg());
		gworld_close(&w);
		return;
	}
	CHECK_OK(sel_memory_store_open(&cfg, &s));
	const struct sel_store_pool *sp = sel_memory_store_pool(s);
	bool split = sp->split != NULL;
	bool want_split = mode == SEL_SPLIT_ON || (mode == SEL_SPLIT_AUTO && ranks > 1 && capable);
	CHECKF(split == want_split, "split pool %s at TP%u: split %d", mode_name(mode), ranks,
	       split);
	if (mode == SEL_SPLIT_AUTO && ranks > 1 && !capable)
		CHECK(strstr(sel_store_warning(s), "cannot create host NUMA allocations"));
	CHECK(split != sel_slab_owns_memory(sp->pool));

	/* Scattered GPU page ids for a conversation of 90 pages. */
	uint32_t ids[PAGES];
	for (uint32_t i = 0; i < PAGES; i++)
		ids[i] = i;
	for (uint32_t i = PAGES - 1; i > 0; i--) {
		uint32_t j = (uint32_t)test_rng_below(rng, i + 1), t = ids[i];
		ids[i] = ids[j];
		ids[j] = t;
	}
	uint8_t model[SEL_IDENTITY_BYTES] = {9};
	sel_history h;
	CHECK_OK(sel_history_init(&h, model, NULL, 0));
	sel_token tok[90 * PT];
	for (uint32_t i = 0; i < 90 * PT; i++)
		tok[i] = (sel_token)(test_rng_next(rng) % 50000);
	CHECK_OK(sel_history_append(&h, tok, 90 * PT));

	/* Root at 70 pages (row in slot 0), child at 90 pages (row in slot 1). */
	const uint64_t c1 = 70 * PT, c2 = 90 * PT - 10;
	sel_published a = {
		.checkpoint = 1, .pages = ids, .n_pages = 70, .tail = 70, .state_slot = 0};
	sel_history_key_at(&h, c1, &a.key);
	a.bucket = *sel_history_bound(&h, c1 / SEL_BUCKET_TOKENS);
	sel_published b = {.checkpoint = 2,
			   .parent = a.key,
			   .pages = ids,
			   .n_pages = 89,
			   .tail = 19,
			   .state_slot = 1};
	sel_history_key_at(&h, c2, &b.key);
	b.bucket = *sel_history_bound(&h, c2 / SEL_BUCKET_TOKENS);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &a, &why) == SEL_QUEUED);
	sel_event ev = wait_one(s);
	CHECKF(ev.type == SEL_EV_STORED, "store failed: %s", sel_strerror(ev.error));
	CHECK(sel_store_put(s, &b, &why) == SEL_QUEUED);
	ev = wait_one(s);
	CHECKF(ev.type == SEL_EV_STORED, "store failed: %s", sel_strerror(ev.error));
	CHECK_OK(sel_memory_store_check(s));
	sel_stats st;
	sel_store_stats(s, &st);
	bool packs = replicated && ranks > 1 && !split;
	CHECK(st.packed_records == (packs ? 2u : 0u) && st.per_rank_records == (packs ? 0u : 2u));
	if (split) {
		/* Each rank's share of the root's pages, read on the CPU from its
		 * part. */
		struct sel_memory_view v;
		CHECK_OK(sel_memory_store_view(s, &a.key, &v));
		CHECK(v.n_page_slots == 70);
		for (uint32_t r = 0; r < ranks; r++)
			for (uint32_t i = 0; i < 70; i++)
				for (int p = 0; p < 2; p++) {
					uint64_t at = sp->split->part[r].base +
						      v.slots[i] * sp->layout.share[r] +
						      sp->layout.plane_off[r][p];
					CHECKF(memcmp((const void *)(uintptr_t)at,
						      w.host[r][p] + (uint64_t)ids[i] * unit[p],
						      unit[p]) == 0,
					       "rank %u part, page %u plane %d", r, i, p);
				}
	}

	/* Whole chain, then above a resident prefix of 30 pages. */
	for (int pass = 0; pass < 2; pass++) {
		uint64_t resident = pass ? 30 * PT + 5 : 0;
		sel_hit hit;
		CHECK_RC(sel_store_lookup(s, &h, resident, 90 * PT, &hit), 1);
		CHECK(sel_key_eq(&hit.key, &b.key) && hit.pages == 89 - resident / PT);
		uint32_t dst[PAGES];
		for (uint32_t i = 0; i < hit.pages; i++)
			dst[i] = ids[PAGES - 1 - i]; /* the ids the record did not use */
		sel_inbound in = {.ticket = 7, .pages = dst, .n_pages = hit.pages, .state_slot = 3};
		poison_device(&w);
		CHECK_OK(sel_store_fetch(s, &hit, &in));
		ev = wait_one(s);
		CHECKF(ev.type == SEL_EV_FETCHED, "fetch failed: %s", sel_strerror(ev.error));
		for (uint32_t r = 0; r < ranks; r++) {
			for (uint32_t i = 0; i < hit.pages; i++)
				for (int p = 0; p < 2; p++)
					CHECKF(device_has(&w, r, p, dst[i], ids[resident / PT + i]),
					       "rank %u page %u plane %d", r, i, p);
			CHECKF(device_has(&w, r, 2, 3, 1), "rank %u row", r);
		}
		restore_device(&w);
	}

	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	sel_history_free(&h);
	gworld_close(&w);
	printf("memory store: %u rank(s), %s planes, split pool %s (%s) ok\n", ranks,
	       replicated ? "replicated" : "split", mode_name(mode),
	       split ? "split" : "registered");
}

int main(void)
{
	int count = 0;
	cu = sfx_cuda_or_skip(&count);
	test_rng rng;
	test_rng_init(&rng, test_seed());
	run(1, (int[]){0}, false, SEL_SPLIT_AUTO, &rng);
	int two[2] = {0, count > 1 ? 1 : 0};
	run(2, two, false, SEL_SPLIT_OFF, &rng);
	run(2, two, true, SEL_SPLIT_OFF, &rng);
	run(2, two, true, SEL_SPLIT_AUTO, &rng);
	run(2, two, false, SEL_SPLIT_ON, &rng);
	run(1, (int[]){0}, false, SEL_SPLIT_ON, &rng);
	printf("ok\n");
	return 0;
}
