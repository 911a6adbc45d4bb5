/*
 * test_cuda_driver.c - the CUDA driver table, copy backend and split pools
 * against a fake driver, on machines without a GPU (design 2.5).
 *
 * Covers:
 *   - the loader: a missing library and the process-wide libcuda.so.1 (where
 *     absent) report SEL_ECUDA "cuda unavailable: ..."; a library without
 *     the symbols names the first missing one; CUDA 13's stub libcuda.so
 *     (where the toolkit is installed) resolves every symbol we use -- so the
 *     versioned export names are right -- and fails only at cuInit; a driver
 *     lacking cuMemcpyBatchAsync_v2 is "too old"; the plain
 *     cuMemcpyBatchAsync (CUDA 12.8's ABI) is never looked up;
 *   - the backend on a fake driver that really defers copies until an event
 *     or stream synchronisation: round trips through transfer threads on
 *     two devices byte-exact, batches within 16 MiB and 4,096 entries with
 *     one stream-ordered attribute, the rank's context current, a
 *     least-priority non-blocking stream and a blocking-sync event, the
 *     pool registered PORTABLE once; a failing batch reported as SEL_ECUDA
 *     with nothing left in flight; a stream that cannot be created failing
 *     sel_xfer_create with the driver's message; unknown devices refused;
 *   - split pools on the fake: one pinned HOST_NUMA allocation per rank on
 *     the device's NUMA node, mapped inside one reserved range, opened to
 *     that device and the host; identity translation; a round trip through
 *     sel_xfer_create_parts; compare refused; everything released; devices
 *     without host-NUMA support refused;
 *   - the memory store on a split pool (design 2.5, memory-only TP>1),
 *     opened through sel_store_open with the default split mode and the
 *     fake as the process's driver: cuMemCreate on each device's NUMA node,
 *     access for that device and the host only, nothing registered, the
 *     slab pool a free list over the identity range; a root over two
 *     windows and its child stored from scattered ids, each rank's bytes in
 *     its own part at part base + slot x share, records per-rank although
 *     the ranks' bytes are identical (no compare), fetched byte-exact into
 *     other ids and another state slot, also above a resident prefix;
 *     eviction; close releasing the parts only after the transfer streams
 *     are gone.  The same identical bytes pack on a registered pool
 *     (split_pool off).  AUTO keeps the registered pool at TP1 and, with a
 *     warning, on devices without host-NUMA allocations; ON fails there,
 *     with a disk tier and with a non-CUDA backend; ON splits a TP1 pool;
 *   - a split-pool store whose copy never finishes: close returns
 *     SEL_ESTOPPED and destroy leaks the parts (nothing unmapped).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "cuda.h"
#include "cudafake.h"
#include "eos.h"
#include "slab.h"
#include "store_memory.h"
#include "store_pool.h"
#include "testutil.h"
#include "transfer.h"

static bool starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* ---- Loader ---------------------------------------------------------------- */

static void test_loader(void)
{
	struct sel_cuda *cu = (struct sel_cuda *)1;
	CHECK_RC(sel_cuda_load_library("libselene-test-no-such-cuda.so.1", &cu), SEL_ECUDA);
	CHECK(cu == NULL);
	CHECK(starts_with(sel_errmsg(), "cuda unavailable: "));
	CHECK(strstr(sel_errmsg(), "libselene-test-no-such-cuda.so.1"));

	/* The process-wide driver: where libcuda.so.1 is absent (this test's
	 * usual machine), the failure is stable and says why. */
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	const struct sel_cuda *pcu = NULL;
	int rc = sel_cuda_load(&pcu);
	if (!h) {
		CHECK_RC(rc, SEL_ECUDA);
		CHECK(pcu == NULL);
		CHECKF(starts_with(sel_errmsg(), "cuda unavailable: ") &&
			       strstr(sel_errmsg(), "libcuda.so.1"),
		       "message: %s", sel_errmsg());
		eos_errclear();
		CHECK_RC(sel_cuda_load(&pcu), SEL_ECUDA);
		CHECK(starts_with(sel_errmsg(), "cuda unavailable: "));
		printf("libcuda.so.1 absent: %s\n", sel_errmsg());
	} else {
		dlclose(h);
		if (rc == 0)
			CHECK(pcu && pcu->cuMemcpyBatchAsync && pcu->cuInit);
		else
			CHECK(rc == SEL_ECUDA && starts_with(sel_errmsg(), "cuda unavailable: "));
	}

	/* A library that is not a driver: the first symbol is named. */
	CHECK_RC(sel_cuda_load_library("libc.so.6", &cu), SEL_ECUDA);
	CHECKF(strcmp(sel_errmsg(),
		      "cuda unavailable: symbol cuInit missing from libc.so.6 (driver too old"
		      " for CUDA 13?)") == 0,
	       "message: %s", sel_errmsg());

	/* CUDA 13's stub libcuda exports the real ABI names: every symbol we
	 * use resolves, and only cuInit refuses. */
	const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
	if (access(stub, R_OK) == 0) {
		CHECK_RC(sel_cuda_load_library(stub, &cu), SEL_ECUDA);
		CHECKF(starts_with(sel_errmsg(), "cuda unavailable: cuInit: "), "stub: %s",
		       sel_errmsg());
		CHECK(strstr(sel_errmsg(), "(34)")); /* CUDA_ERROR_STUB_LIBRARY */
	} else {
		printf("note: %s absent, export names not checked against it\n", stub);
	}

	/* Fake drivers: too old, failing cuInit, and the good one. */
	fake_reset();
	fake.missing = "cuMemcpyBatchAsync_v2";
	CHECK_RC(sel_cuda_load_from("fake", fake_resolve, NULL, &cu), SEL_ECUDA);
	CHECK(strcmp(sel_errmsg(),
		     "cuda unavailable: symbol cuMemcpyBatchAsync_v2 missing from fake (driver"
		     " too old for CUDA 13?)") == 0);
	fake_reset();
	fake.init_rc = SEL_CU_ERROR_NO_DEVICE;
	CHECK_RC(sel_cuda_load_from("fake", fake_resolve, NULL, &cu), SEL_ECUDA);
	CHECKF(strcmp(sel_errmsg(),
		      "cuda unavailable: cuInit: CUDA_ERROR_NO_DEVICE (100): fake driver error") ==
		       0,
	       "message: %s", sel_errmsg());
	fake_reset();
	cu = fake_load();
	CHECK(atomic_load(&fake.plain_batch_asked) == 0);
	CHECK(strcmp(sel_cuda_symbol("cuMemcpyBatchAsync"), "cuMemcpyBatchAsync_v2") == 0);
	CHECK(strcmp(sel_cuda_symbol("cuMemHostRegister"), "cuMemHostRegister_v2") == 0);
	CHECK(sel_cuda_symbol("cuNothing") == NULL);
	struct sel_cuda_device_info info;
	CHECK_OK(sel_cuda_device_info(cu, 1, &info));
	CHECK(info.ordinal == 1 && !info.integrated && info.host_numa_id == 4 && info.vmm &&
	      info.host_numa_vmm);
	CHECK_RC(sel_cuda_device_info(cu, 2, &info), SEL_ECUDA);
	CHECK(strstr(sel_errmsg(), "cuDeviceGet(2)"));
	CHECK_RC(sel_cuda_fail(cu, SEL_CU_ERROR_INVALID_VALUE, "thing %d", 7), SEL_ECUDA);
	CHECK(strcmp(sel_errmsg(),
		     "cuda: thing 7: CUDA_ERROR_INVALID_VALUE (1): fake driver error") == 0);
	CHECK(sel_cuda_fail(cu, SEL_CU_SUCCESS, "fine") == 0);
	sel_cuda_unload(cu);
	sel_cuda_unload(NULL);
}

/* ---- A small world over "device" planes (host memory for the fake) --------- */

struct world {
	uint32_t ranks;
	uint8_t *mem[2][3];
	uint64_t len[2][3];
	sel_geometry *g;
	sel_slot_layout l;
};

/* Rank r: planes "a" (unit a[r]) and "b" (unit b[r]), a row of row[r]. */
static void world_open(struct world *w, uint32_t ranks, const uint64_t *a, const uint64_t *b,
		       const uint64_t *row, uint64_t pages, uint64_t rows, test_rng *rng)
{
	sel_allocation al[6];
	size_t n = 0;
	memset(w, 0, sizeof(*w));
	w->ranks = ranks;
	for (uint32_t r = 0; r < ranks; r++) {
		const uint64_t unit[3] = {a[r], b[r], row[r]}, count[3] = {pages, pages, rows};
		static const char *names[3] = {"a", "b", "row"};
		for (int p = 0; p < 3; p++) {
			w->len[r][p] = unit[p] * count[p];
			w->mem[r][p] = eos_aligned_alloc(EOS_ALIGN, w->len[r][p]);
			CHECK(w->mem[r][p]);
			test_rng_fill(rng, w->mem[r][p], w->len[r][p]);
			al[n++] = (sel_allocation){.rank = r,
						   .name = names[p],
						   .group = p == 2 ? SEL_GROUP_STATE_ROWS
								   : SEL_GROUP_KV_PAGES,
						   .kind = SEL_MEM_DEVICE,
						   .address = (uintptr_t)w->mem[r][p],
						   .unit_bytes = unit[p],
						   .count = count[p]};
		}
	}
	CHECK_OK(sel_geometry_build(al, n, ranks, 64, &w->g));
	CHECK_OK(sel_slot_layout_init(&w->l, w->g));
}

static void world_close(struct world *w)
{
	sel_slot_layout_free(&w->l);
	sel_geometry_free(w->g);
	for (uint32_t r = 0; r < 2; r++)
		for (int p = 0; p < 3; p++)
			eos_aligned_free(w->mem[r][p]);
}

static uint8_t *unit_at(const struct world *w, uint32_t r, int p, uint64_t i)
{
	const sel_plane *pl = p == 2 ? &w->g->rank[r].row : &w->g->rank[r].pages[p];
	return (uint8_t *)(uintptr_t)(pl->address + i * pl->unit_bytes);
}

static void wait_one(sel_xfer *x, struct sel_xfer_job *job)
{
	struct sel_xfer_job *done = NULL;
	for (int i = 0; i < 20000 && sel_xfer_poll(x, &done, 1) == 0; i++)
		eos_sleep_ns(1000000);
	CHECK(done == job);
}

/* Out of src ids / state 0, poison, back into dst ids / state 1, compare. */
static void roundtrip(struct world *w, sel_xfer *x, const uint32_t *ps, const uint32_t *rs,
		      uint32_t n, bool expect_ok)
{
	uint32_t *src = malloc(n * sizeof(*src)), *dst = malloc(n * sizeof(*dst));
	CHECK(src && dst);
	for (uint32_t i = 0; i < n; i++) {
		src[i] = (i * 7) % n;
		dst[i] = n + i;
	}
	uint8_t *ref[2][3];
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++) {
			uint64_t u = p == 2 ? w->g->rank[r].row.unit_bytes
					    : w->g->rank[r].pages[p].unit_bytes;
			ref[r][p] = malloc(p == 2 ? u : u * n);
			CHECK(ref[r][p]);
			if (p == 2)
				memcpy(ref[r][p], unit_at(w, r, 2, 0), u);
			else
				for (uint32_t i = 0; i < n; i++)
					memcpy(ref[r][p] + i * u, unit_at(w, r, p, src[i]), u);
		}
	struct sel_xfer_job out = {.dir = SEL_COPY_OUT,
				   .n_pages = n,
				   .pages = src,
				   .page_slots = ps,
				   .row = true,
				   .state_slot = 0,
				   .row_slots = rs};
	CHECK_OK(sel_xfer_submit(x, &out));
	wait_one(x, &out);
	if (!expect_ok) {
		CHECK_RC(out.status, SEL_ECUDA);
		CHECK(out.failed_rank < w->ranks);
		goto done;
	}
	CHECK(out.status == 0);
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++)
			memset(w->mem[r][p], 0x5a, w->len[r][p]);
	struct sel_xfer_job in = {.dir = SEL_COPY_IN,
				  .n_pages = n,
				  .pages = dst,
				  .page_slots = ps,
				  .row = true,
				  .state_slot = 1,
				  .row_slots = rs};
	CHECK_OK(sel_xfer_submit(x, &in));
	wait_one(x, &in);
	CHECK(in.status == 0);
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++) {
			uint64_t u = p == 2 ? w->g->rank[r].row.unit_bytes
					    : w->g->rank[r].pages[p].unit_bytes;
			if (p == 2)
				CHECK(memcmp(ref[r][p], unit_at(w, r, 2, 1), u) == 0);
			else
				for (uint32_t i = 0; i < n; i++)
					CHECKF(memcmp(ref[r][p] + i * u, unit_at(w, r, p, dst[i]),
						      u) == 0,
					       "rank %u plane %d page %u", r, p, i);
		}
done:
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++)
			free(ref[r][p]);
	free(src);
	free(dst);
}

/* ---- The backend --------------------------------------------------------- */

static void test_backend(test_rng *rng)
{
	fake_reset();
	struct sel_cuda *cu = fake_load();
	struct sel_copy_backend *be;
	const int devices[2] = {0, 1};

	CHECK_RC(sel_copy_backend_cuda_create(cu, (int[]){0, 5}, 2, &be), SEL_ECUDA);
	CHECK(strstr(sel_errmsg(), "rank 1 names device 5 but 2 devices are visible"));
	CHECK(atomic_load(&fake.retains[0]) == 0);

	CHECK_OK(sel_copy_backend_cuda_create(cu, devices, 2, &be));
	CHECK(strcmp(be->name, "cuda") == 0);
	CHECK(be->max_call_bytes == 16u << 20 && be->max_call_entries == 4096);
	CHECK(atomic_load(&fake.retains[0]) == 1 && atomic_load(&fake.retains[1]) == 1);

	/* 256 KiB planes: a 64-page window moves ~16.3 MiB per rank, so
	 * windows split into several batches. */
	struct world w;
	world_open(&w, 2, (uint64_t[]){262144, 262144}, (uint64_t[]){3000, 3000},
		   (uint64_t[]){600000, 700000}, 140, 2, rng);
	struct sel_slab_hooks hooks = {be->host_register, be->host_unregister, be->ctx};
	sel_slab_pool *pool;
	fake_current = NULL;
	CHECK_OK(sel_slab_create(w.l.slot_bytes, 0, 80, false, &hooks, &pool));
	CHECK(atomic_load(&fake.registers) == 1);
	CHECK(fake_current == NULL); /* the caller's context is restored */

	sel_xfer *x;
	CHECK_OK(sel_xfer_create(w.g, &w.l, pool, be, 4, &x));
	CHECK(atomic_load(&fake.streams) == 2 && atomic_load(&fake.events) == 2);
	uint32_t ps[70], rs[3];
	CHECK(w.l.row_slots == 3);
	CHECK_OK(sel_slab_alloc(pool, 70, SEL_SLAB_INTAKE, ps));
	CHECK_OK(sel_slab_alloc(pool, 3, SEL_SLAB_INTAKE, rs));
	roundtrip(&w, x, ps, rs, 70, true);
	CHECKF(atomic_load(&fake.bad) == 0, "fake driver: %s", fake.bad_why);
	CHECK(atomic_load(&fake.inflight_at_entry) == 0);
	CHECK(atomic_load(&fake.batches) >= 2 * 2 * 3);
	CHECK(atomic_load(&fake.max_bytes) <= 16u << 20 &&
	      atomic_load(&fake.max_bytes) > (15u << 20));

	/* A failing batch: SEL_ECUDA, and the stream drained before the report. */
	int syncs = atomic_load(&fake.stream_syncs);
	atomic_store(&fake.fail_batch, atomic_load(&fake.batches) + 1);
	roundtrip(&w, x, ps, rs, 70, false);
	CHECK(atomic_load(&fake.stream_syncs) == syncs + 1);
	CHECK(atomic_load(&fake.inflight_at_entry) == 0);
	atomic_store(&fake.fail_batch, -1);
	roundtrip(&w, x, ps, rs, 70, true); /* and the set still works */
	CHECKF(atomic_load(&fake.bad) == 0, "fake driver: %s", fake.bad_why);
	CHECK_OK(sel_xfer_check(x));
	CHECK_OK(sel_xfer_close(x, 0));
	sel_xfer_destroy(x);
	CHECK(atomic_load(&fake.streams) == 0 && atomic_load(&fake.events) == 0);
	sel_slab_destroy(pool);
	CHECK(atomic_load(&fake.unregisters) == 1);

	/* A rank that cannot make its stream fails the whole set. */
	fake.stream_fail = 1;
	CHECK_OK(sel_slab_create(w.l.slot_bytes, 0, 8, false, NULL, &pool));
	CHECK_RC(sel_xfer_create(w.g, &w.l, pool, be, 4, &x), SEL_ECUDA);
	CHECKF(strstr(sel_errmsg(), "cuStreamCreateWithPriority(0): CUDA_ERROR_FAKE") &&
		       strstr(sel_errmsg(), "(transfer rank "),
	       "message: %s", sel_errmsg());
	CHECK(atomic_load(&fake.streams) == 0);
	sel_slab_destroy(pool);
	fake.stream_fail = 0;

	sel_copy_backend_cuda_destroy(be);
	CHECK(atomic_load(&fake.retains[0]) == 0 && atomic_load(&fake.retains[1]) == 0);
	world_close(&w);
	sel_cuda_unload(cu);
}

/* ---- Split pools ------------------------------------------------------------ */

static void test_split_pool(test_rng *rng)
{
	fake_reset();
	struct sel_cuda *cu = fake_load();
	const int devices[2] = {0, 1};
	struct world w;
	/* Different shares per rank: 64 KiB + 4 KiB, and 32 KiB + 8 KiB. */
	world_open(&w, 2, (uint64_t[]){65536, 32768}, (uint64_t[]){100, 5000},
		   (uint64_t[]){9000, 9000}, 40, 2, rng);
	const uint64_t slots = 30;

	sel_cuda_split_pool *sp;
	CHECK_OK(sel_cuda_split_pool_create(cu, devices, &w.l, slots, &sp));
	CHECK(fake.ncreated == 2 && fake.nmapped == 2 && fake.naccess == 2);
	CHECK(sp->base == (uintptr_t)fake.reserved && sp->bytes == fake.reserved_size);
	CHECK(sp->bytes >= slots * w.l.slot_bytes);
	for (uint32_t r = 0; r < 2; r++) {
		const struct sel_cuda_split_part *pt = &sp->part[r];
		const struct sel_cu_mem_alloc_prop *prop = &fake.created[r].prop;
		CHECK(prop->type == SEL_CU_MEM_ALLOCATION_TYPE_PINNED);
		CHECK(prop->requested_handle_types == SEL_CU_MEM_HANDLE_TYPE_NONE);
		CHECK(prop->location.type == SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA);
		CHECK(prop->location.id == 3 + (int)r && pt->numa == 3 + (int)r &&
		      pt->device == (int)r);
		CHECK(fake.created[r].size == pt->bytes && pt->bytes % 65536 == 0);
		CHECK(pt->bytes >= slots * w.l.share[r] && pt->share == w.l.share[r]);
		CHECK(fake.mapped[r].ptr == pt->base && fake.mapped[r].size == pt->bytes);
		CHECK(fake.mapped[r].h == pt->handle);
		CHECK(fake.access[r].ptr == pt->base && fake.access[r].size == pt->bytes &&
		      fake.access[r].n == 2);
		CHECK(fake.access[r].d[0].location.type == SEL_CU_MEM_LOCATION_TYPE_DEVICE);
		CHECK(fake.access[r].d[0].location.id == (int)r);
		CHECK(fake.access[r].d[0].flags == SEL_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
		CHECK(fake.access[r].d[1].location.type == SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA);
		CHECK(fake.access[r].d[1].flags == SEL_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
		CHECK(pt->base >= sp->base && pt->base + pt->bytes <= sp->base + sp->bytes);
	}
	CHECK(sp->part[0].base + sp->part[0].bytes <= sp->part[1].base); /* no overlap */
	CHECK(atomic_load(&fake.retains[0]) == 1);

	/* Identity addressing. */
	uint64_t id = sp->base + 7 * w.l.slot_bytes;
	CHECK(sel_cuda_split_pool_translate(sp, 0, id) == sp->part[0].base + 7 * w.l.share[0]);
	CHECK(sel_cuda_split_pool_translate(sp, 0, id + 100) ==
	      sp->part[0].base + 7 * w.l.share[0] + 100);
	CHECK(sel_cuda_split_pool_translate(sp, 1, id + w.l.share_off[1] + 5) ==
	      sp->part[1].base + 7 * w.l.share[1] + 5);
	CHECK(sel_cuda_split_pool_translate(sp, 1, id) == 0); /* rank 0's share */
	CHECK(sel_cuda_split_pool_translate(sp, 0, id + w.l.share_off[1]) ==
	      0); /* rank 1's share */
	CHECK(sel_cuda_split_pool_translate(sp, 0, sp->base + slots * w.l.slot_bytes) == 0);
	CHECK(sel_cuda_split_pool_translate(sp, 2, id) == 0);

	/* Transfers through the parts. */
	struct sel_copy_backend *be;
	CHECK_OK(sel_copy_backend_cuda_create(cu, devices, 2, &be));
	struct sel_xfer_part parts[2];
	sel_cuda_split_pool_parts(sp, parts);
	CHECK(parts[1].base == sp->part[1].base && parts[1].stride == w.l.share[1]);
	sel_xfer *x;
	CHECK_OK(sel_xfer_create_parts(w.g, &w.l, parts, slots, be, 4, &x));
	uint32_t ps[20], rs[1] = {29};
	CHECK(w.l.row_slots == 1);
	for (uint32_t i = 0; i < 20; i++)
		ps[i] = 27 - i;
	roundtrip(&w, x, ps, rs, 20, true);
	/* Bytes sit in the parts: page 0 of the last copy-out (id 0) in slot 27. */
	for (uint32_t r = 0; r < 2; r++)
		CHECK(memcmp((void *)(uintptr_t)(sp->part[r].base + 27 * w.l.share[r] +
						 w.l.plane_off[r][1]),
			     unit_at(&w, r, 1, 20), w.g->rank[r].pages[1].unit_bytes) == 0);
	struct sel_xfer_job cmp = {
		.dir = SEL_COPY_OUT, .n_pages = 1, .pages = ps, .page_slots = ps, .compare = true};
	CHECK_RC(sel_xfer_submit(x, &cmp), -EINVAL);
	CHECK(strstr(sel_errmsg(), "split pools"));
	uint32_t big[1] = {(uint32_t)slots};
	struct sel_xfer_job oob = {
		.dir = SEL_COPY_OUT, .n_pages = 1, .pages = ps, .page_slots = big};
	CHECK_RC(sel_xfer_submit(x, &oob), -EINVAL);
	CHECK_OK(sel_xfer_close(x, 0));
	sel_xfer_destroy(x);
	sel_copy_backend_cuda_destroy(be);
	CHECKF(atomic_load(&fake.bad) == 0, "fake driver: %s", fake.bad_why);

	sel_cuda_split_pool_destroy(sp);
	CHECK(fake.nunmapped == 2 && fake.nreleased == 2 && fake.freed == 1);
	CHECK(atomic_load(&fake.retains[0]) == 0 && atomic_load(&fake.retains[1]) == 0);
	sel_cuda_split_pool_destroy(NULL);

	/* Devices without host-NUMA allocations. */
	fake.numa_vmm = 0;
	sp = (sel_cuda_split_pool *)1;
	CHECK_RC(sel_cuda_split_pool_create(cu, devices, &w.l, slots, &sp), SEL_ECUDA);
	CHECK(sp == NULL && strstr(sel_errmsg(), "cannot create host NUMA allocations"));
	CHECK(fake.reserved == NULL && atomic_load(&fake.retains[0]) == 0);

	world_close(&w);
	sel_cuda_unload(cu);
	fake_reset();
}


/* ---- The memory store on a split pool -------------------------------------- */

#define ST_PAGES 200u
#define ST_ROWS 4u

static sel_event store_wait(sel_store *s)
{
	sel_event ev;
	uint64_t deadline = eos_now_ns() + 30ull * 1000000000;
	for (;;) {
		int n = sel_store_poll(s, &ev, 1);
		CHECK(n >= 0);
		if (n == 1)
			return ev;
		CHECK(eos_now_ns() < deadline);
		eos_sleep_ns(200000);
	}
}

/* A conversation over the world's planes: tokens, and its page ids. */
struct sconv {
	sel_history h;
	uint32_t ids[ST_PAGES];
};

static void sconv_init(struct sconv *c, uint32_t pages, test_rng *rng)
{
	static const uint8_t model[SEL_IDENTITY_BYTES] = {7};
	sel_token *tok = malloc((size_t)pages * 64 * sizeof(*tok));
	CHECK(tok);
	CHECK_OK(sel_history_init(&c->h, model, NULL, 0));
	for (uint32_t i = 0; i < pages * 64; i++)
		tok[i] = (sel_token)(test_rng_next(rng) % 50000);
	CHECK_OK(sel_history_append(&c->h, tok, (size_t)pages * 64));
	free(tok);
	for (uint32_t i = 0; i < ST_PAGES; i++)
		c->ids[i] = i;
	for (uint32_t i = ST_PAGES - 1; i > 0; i--) {
		uint32_t j = (uint32_t)test_rng_below(rng, i + 1), t = c->ids[i];
		c->ids[i] = c->ids[j];
		c->ids[j] = t;
	}
}

/* The checkpoint at consumed tokens c: n_pages ids, the last tail new. */
static sel_published sconv_ckpt(struct sconv *cv, uint64_t id, uint64_t c, const sel_key *parent,
				uint32_t tail, uint32_t state_slot)
{
	sel_published p = {.checkpoint = id,
			   .pages = cv->ids,
			   .n_pages = (uint32_t)(c / 64),
			   .tail = tail,
			   .state_slot = state_slot};
	sel_history_key_at(&cv->h, c, &p.key);
	p.bucket = *sel_history_bound(&cv->h, c / SEL_BUCKET_TOKENS);
	if (parent)
		p.parent = *parent;
	return p;
}

static void put_stored(sel_store *s, const sel_published *p)
{
	sel_retry_reason why;
	sel_outcome o = sel_store_put(s, p, &why);
	CHECKF(o == SEL_QUEUED, "put %s: %s", sel_outcome_name(o), sel_errmsg());
	sel_event ev = store_wait(s);
	CHECKF(ev.type == SEL_EV_STORED && ev.checkpoint == p->checkpoint, "store event %d: %s",
	       ev.type, sel_strerror(ev.error));
	CHECK_OK(sel_memory_store_check(s));
}

/* Snapshot of every plane, to compare restores with. */
struct snap {
	uint8_t *b[2][3];
};

static void snap_take(struct snap *sn, const struct world *w)
{
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++) {
			sn->b[r][p] = malloc(w->len[r][p]);
			CHECK(sn->b[r][p]);
			memcpy(sn->b[r][p], w->mem[r][p], w->len[r][p]);
		}
}

static void snap_free(struct snap *sn, const struct world *w)
{
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++)
			free(sn->b[r][p]);
}

static const uint8_t *snap_unit(const struct snap *sn, const struct world *w, uint32_t r, int p,
				uint64_t i)
{
	const sel_plane *pl = p == 2 ? &w->g->rank[r].row : &w->g->rank[r].pages[p];
	return sn->b[r][p] + i * pl->unit_bytes;
}

/* Look up cv up to c above resident, fetch into ids the chain does not use
 * (from the end of cv->ids) and state slot 3, and compare with sn. */
static void fetch_check(sel_store *s, struct world *w, const struct snap *sn, struct sconv *cv,
			uint64_t c, uint64_t resident, const sel_published *want)
{
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &cv->h, resident, c, &hit), 1);
	CHECK(sel_key_eq(&hit.key, &want->key));
	uint32_t first = (uint32_t)(resident / 64), dst[ST_PAGES];
	CHECK(hit.pages == want->n_pages - first);
	for (uint32_t i = 0; i < hit.pages; i++)
		dst[i] = cv->ids[ST_PAGES - 1 - i];
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++)
			memset(w->mem[r][p], 0x5a, w->len[r][p]);
	sel_inbound in = {.ticket = 11, .pages = dst, .n_pages = hit.pages, .state_slot = 3};
	CHECK_OK(sel_store_fetch(s, &hit, &in));
	sel_event ev = store_wait(s);
	CHECKF(ev.type == SEL_EV_FETCHED && ev.ticket == 11, "fetch event %d: %s", ev.type,
	       sel_strerror(ev.error));
	for (uint32_t r = 0; r < w->ranks; r++) {
		for (uint32_t i = 0; i < hit.pages; i++)
			for (int p = 0; p < 2; p++)
				CHECKF(memcmp(unit_at(w, r, p, dst[i]),
					      snap_unit(sn, w, r, p, cv->ids[first + i]),
					      w->g->rank[r].pages[p].unit_bytes) == 0,
				       "rank %u page %u plane %d", r, i, p);
		CHECKF(memcmp(unit_at(w, r, 2, 3), snap_unit(sn, w, r, 2, want->state_slot),
			      w->g->rank[r].row.unit_bytes) == 0,
		       "rank %u row", r);
	}
	for (uint32_t r = 0; r < w->ranks; r++)
		for (int p = 0; p < 3; p++)
			memcpy(w->mem[r][p], sn->b[r][p], w->len[r][p]);
}

/* Every access descriptor the fake saw names device r (for the r-th part)
 * or the host: no other device maps a part. */
static void check_access(uint32_t parts)
{
	CHECK(fake.naccess == (int)parts);
	for (uint32_t r = 0; r < parts; r++) {
		int devs = 0, hosts = 0;
		CHECK(fake.access[r].ptr == fake.mapped[r].ptr &&
		      fake.access[r].size == fake.mapped[r].size);
		for (size_t i = 0; i < fake.access[r].n; i++) {
			const struct sel_cu_mem_access_desc *d = &fake.access[r].d[i];
			CHECK(d->flags == SEL_CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
			if (d->location.type == SEL_CU_MEM_LOCATION_TYPE_DEVICE) {
				CHECKF(d->location.id == (int)r, "part %u opened to device %d", r,
				       d->location.id);
				devs++;
			} else {
				CHECK(d->location.type == SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA);
				hosts++;
			}
		}
		CHECK(devs == 1 && hosts == 1);
	}
}

static sel_store_config split_cfg(const struct world *w, const int *devices, uint64_t warm_slots)
{
	sel_store_config cfg = {0};
	cfg.geometry = w->g;
	cfg.max_active = 1;
	cfg.cuda_devices = devices;
	cfg.host_headroom = 1ull << 30;
	cfg.memory_bytes = warm_slots * w->l.slot_bytes;
	return cfg;
}

static void close_store(sel_store *s)
{
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
}

static void test_split_store(test_rng *rng)
{
	fake_reset();
	struct sel_cuda *cu = fake_load();
	sel_cuda_override(cu);
	const int devices[2] = {0, 1};
	struct world w;
	/* Equal share layouts and, below, identical bytes on both ranks: a
	 * registered pool would pack these records. */
	world_open(&w, 2, (uint64_t[]){65536, 65536}, (uint64_t[]){5000, 5000},
		   (uint64_t[]){9000, 9000}, ST_PAGES, ST_ROWS, rng);
	for (int p = 0; p < 3; p++)
		memcpy(w.mem[1][p], w.mem[0][p], w.len[0][p]);
	CHECK(w.l.row_slots == 1);
	struct snap sn;
	snap_take(&sn, &w);

	/* The default (AUTO) through the one constructor: split. */
	sel_store_config cfg = split_cfg(&w, devices, 120);
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(s && strcmp(s->ops->name, "memory") == 0);
	CHECK(strcmp(sel_store_warning(s), "") == 0);
	const struct sel_store_pool *sp = sel_memory_store_pool(s);
	const sel_cuda_split_pool *split = sp->split;
	CHECK(split && split->ranks == 2);
	CHECK(atomic_load(&fake.registers) == 0); /* no cuMemHostRegister of the pool */
	CHECK(fake.ncreated == 2 && fake.nmapped == 2);
	for (uint32_t r = 0; r < 2; r++) {
		const struct sel_cu_mem_alloc_prop *prop = &fake.created[r].prop;
		CHECK(prop->type == SEL_CU_MEM_ALLOCATION_TYPE_PINNED);
		CHECK(prop->location.type == SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA);
		CHECK(prop->location.id == 3 + (int)r); /* device r's NUMA node */
		CHECK(split->part[r].base == fake.mapped[r].ptr &&
		      split->part[r].share == w.l.share[r]);
		CHECK(split->part[r].bytes >= split->slots * w.l.share[r]);
	}
	check_access(2);
	CHECK(!sel_slab_owns_memory(sp->pool));
	CHECK((uintptr_t)sel_slab_base(sp->pool) == split->base &&
	      split->base == (uintptr_t)fake.reserved);
	CHECK(split->slots == sp->warm + sp->intake && sp->warm == 120);
	CHECK(split->slot_bytes == w.l.slot_bytes);
	sel_store_info info;
	sel_store_describe(s, &info);
	CHECK(strcmp(info.transport, "cuda") == 0 && info.slots_total == split->slots);

	/* A root over two windows (70 pages, row from state slot 0) and its
	 * child (19 more pages, row from state slot 1). */
	struct sconv a;
	sconv_init(&a, 90, rng);
	sel_published ra = sconv_ckpt(&a, 1, 70 * 64, NULL, 70, 0);
	sel_published rb = sconv_ckpt(&a, 2, 90 * 64 - 10, &ra.key, 19, 1);
	put_stored(s, &ra);
	put_stored(s, &rb);
	struct sel_memory_record_info ri;
	CHECK_OK(sel_memory_store_record(s, &ra.key, &ri));
	CHECK(ri.ready && !ri.pages_packed && !ri.row_packed && ri.page_slots == 70 &&
	      ri.row_slots == 1);
	CHECK_OK(sel_memory_store_record(s, &rb.key, &ri));
	CHECK(ri.ready && !ri.pages_packed && !ri.row_packed && ri.page_slots == 19 &&
	      ri.row_slots == 1);
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.packed_records == 0 && st.per_rank_records == 2);

	/* Each rank's bytes sit in its own part at part base + slot x share,
	 * where the identity address translates to. */
	struct sel_memory_view v;
	CHECK_OK(sel_memory_store_view(s, &ra.key, &v));
	for (uint32_t i = 0; i < 70; i++)
		for (uint32_t r = 0; r < 2; r++)
			for (int p = 0; p < 2; p++) {
				uint64_t at = split->part[r].base + v.slots[i] * w.l.share[r] +
					      w.l.plane_off[r][p];
				uint64_t id = (uintptr_t)sel_slab_addr(sp->pool, v.slots[i]) +
					      w.l.share_off[r] + w.l.plane_off[r][p];
				CHECK(sel_cuda_split_pool_translate(split, r, id) == at);
				CHECKF(memcmp((void *)(uintptr_t)at,
					      snap_unit(&sn, &w, r, p, a.ids[i]),
					      w.g->rank[r].pages[p].unit_bytes) == 0,
				       "part %u slot %u plane %d", r, v.slots[i], p);
			}
	for (uint32_t r = 0; r < 2; r++)
		CHECK(memcmp((void *)(uintptr_t)(split->part[r].base + v.slots[70] * w.l.share[r]),
			     snap_unit(&sn, &w, r, 2, 0), 9000) == 0);

	/* Restores: the whole chain, then above a GPU-resident prefix. */
	fetch_check(s, &w, &sn, &a, 90 * 64 - 10, 0, &rb);
	fetch_check(s, &w, &sn, &a, 90 * 64 - 10, 30 * 64 + 5, &rb);
	fetch_check(s, &w, &sn, &a, 70 * 64, 0, &ra);
	CHECKF(atomic_load(&fake.bad) == 0, "fake driver: %s", fake.bad_why);

	/* Eviction: another root of 40 pages needs 41 of the 120 warm slots
	 * while 91 are held; the child goes. */
	struct sconv b;
	sconv_init(&b, 40, rng);
	sel_published rc2 = sconv_ckpt(&b, 3, 40 * 64, NULL, 40, 1);
	put_stored(s, &rc2);
	sel_store_stats(s, &st);
	CHECK(st.tier[SEL_TIER_MEMORY].evicted >= 1);
	CHECK(sel_memory_store_record(s, &rb.key, &ri) == -ENOENT);
	fetch_check(s, &w, &sn, &b, 40 * 64, 0, &rc2);
	CHECK_OK(sel_memory_store_check(s));

	/* Close drains the transfer threads before the parts are released. */
	close_store(s);
	CHECK(fake.nunmapped == 2 && fake.nreleased == 2 && fake.freed == 1);
	CHECK(fake.streams_at_unmap == 0);
	CHECK(atomic_load(&fake.streams) == 0 && atomic_load(&fake.events) == 0);
	CHECK(atomic_load(&fake.retains[0]) == 0 && atomic_load(&fake.retains[1]) == 0);
	CHECK(atomic_load(&fake.registers) == 0 && atomic_load(&fake.unregisters) == 0);
	CHECKF(atomic_load(&fake.bad) == 0, "fake driver: %s", fake.bad_why);

	/* split_pool off: the registered pool, where the same bytes pack. */
	fake_reset();
	cfg.split_pool = SEL_SPLIT_OFF;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(sel_memory_store_pool(s)->split == NULL &&
	      sel_slab_owns_memory(sel_memory_store_pool(s)->pool));
	CHECK(atomic_load(&fake.registers) == 1 && fake.ncreated == 0);
	put_stored(s, &ra);
	sel_store_stats(s, &st);
	CHECK(st.packed_records == 1 && st.per_rank_records == 0);
	fetch_check(s, &w, &sn, &a, 70 * 64, 0, &ra);
	close_store(s);
	CHECK(atomic_load(&fake.unregisters) == 1);

	/* AUTO on devices without host-NUMA allocations: registered, with a
	 * warning.  ON there: the driver's refusal, nothing left behind. */
	fake_reset();
	fake.numa_vmm = 0;
	cfg.split_pool = SEL_SPLIT_AUTO;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(sel_memory_store_pool(s)->split == NULL && atomic_load(&fake.registers) == 1);
	CHECKF(strstr(sel_store_warning(s),
		      "device 0 (rank 0) cannot create host NUMA allocations"),
	       "warning: %s", sel_store_warning(s));
	close_store(s);
	cfg.split_pool = SEL_SPLIT_ON;
	s = (sel_store *)1;
	CHECK_RC(sel_store_open(&cfg, &s), SEL_ECUDA);
	CHECK(s == NULL && strstr(sel_errmsg(), "cannot create host NUMA allocations"));
	CHECK(fake.reserved == NULL && fake.ncreated == 0);
	CHECK(atomic_load(&fake.retains[0]) == 0 && atomic_load(&fake.retains[1]) == 0);
	fake.numa_vmm = 1;

	/* ON where records are read on the CPU or copied without CUDA. */
	fake_reset();
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/split-disk",
		 getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp");
	cfg.disk_dir = dir;
	cfg.disk_limit = 1ull << 30;
	CHECK_RC(sel_store_open(&cfg, &s), -EINVAL);
	CHECKF(strstr(sel_errmsg(), "split_pool is on"), "message: %s", sel_errmsg());
	cfg.disk_dir = NULL;
	cfg.copy_backend = &sel_copy_backend_host;
	CHECK_RC(sel_store_open(&cfg, &s), -EINVAL);
	CHECK(strstr(sel_errmsg(), "needs the CUDA copy backend"));
	cfg.copy_backend = NULL;
	cfg.split_pool = (sel_split_mode)7;
	CHECK_RC(sel_store_open(&cfg, &s), -EINVAL);
	CHECK(atomic_load(&fake.retains[0]) == 0 && atomic_load(&fake.retains[1]) == 0);
	CHECK(fake.reserved == NULL && atomic_load(&fake.registers) == 0);

	/* TP1: AUTO keeps the registered pool; ON splits into one part. */
	struct world w1;
	world_open(&w1, 1, (uint64_t[]){65536}, (uint64_t[]){5000}, (uint64_t[]){9000}, ST_PAGES, 2,
		   rng);
	sel_store_config c1 = split_cfg(&w1, devices, 70);
	CHECK_OK(sel_store_open(&c1, &s));
	CHECK(sel_memory_store_pool(s)->split == NULL && atomic_load(&fake.registers) == 1);
	close_store(s);
	fake_reset();
	c1.split_pool = SEL_SPLIT_ON;
	CHECK_OK(sel_store_open(&c1, &s));
	CHECK(sel_memory_store_pool(s)->split != NULL && fake.ncreated == 1 &&
	      atomic_load(&fake.registers) == 0);
	check_access(1);
	struct sconv d;
	sconv_init(&d, 64, rng);
	sel_published rd = sconv_ckpt(&d, 4, 64 * 64, NULL, 64, 0);
	put_stored(s, &rd);
	close_store(s);
	CHECK(fake.nunmapped == 1 && fake.freed == 1);
	CHECKF(atomic_load(&fake.bad) == 0, "fake driver: %s", fake.bad_why);
	sel_history_free(&d.h);
	world_close(&w1);

	sel_history_free(&a.h);
	sel_history_free(&b.h);
	snap_free(&sn, &w);
	world_close(&w);
	sel_cuda_override(NULL);
	sel_cuda_unload(cu);
	fake_reset();
}

/* A split-pool store whose copy never finishes: close gives SEL_ESTOPPED and
 * destroy leaks the parts, which the detached copy may still write.  Runs
 * last: the world, the driver table and the range stay (reachable). */
static struct world stuck_world;
static struct sconv stuck_conv;
static struct sel_cuda *stuck_cu;

static void test_split_store_stuck(test_rng *rng)
{
	fake_reset();
	stuck_cu = fake_load();
	sel_cuda_override(stuck_cu);
	const int devices[2] = {0, 1};
	struct world *w = &stuck_world;
	world_open(w, 2, (uint64_t[]){65536, 32768}, (uint64_t[]){5000, 9000},
		   (uint64_t[]){9000, 9000}, ST_PAGES, ST_ROWS, rng);
	sel_store_config cfg = split_cfg(w, devices, 80);
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(sel_memory_store_pool(s)->split != NULL);
	sconv_init(&stuck_conv, 10, rng);
	sel_published p = sconv_ckpt(&stuck_conv, 1, 10 * 64, NULL, 10, 0);
	atomic_store(&fake.hold, 1);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &p, &why) == SEL_QUEUED);
	for (int i = 0; i < 5000 && atomic_load(&fake.blocked) == 0; i++)
		eos_sleep_ns(1000000);
	CHECK(atomic_load(&fake.blocked) >= 1);
	uint64_t t0 = eos_now_ns();
	CHECK_RC(sel_store_close(s, t0 + 100000000), SEL_ESTOPPED);
	CHECK(strstr(sel_errmsg(), "leaked"));
	sel_store_destroy(s);
	CHECK(fake.nunmapped == 0 && fake.nreleased == 0 && fake.freed == 0 &&
	      fake.reserved != NULL);
	/* Let the copy land in the leaked parts; nothing reports it. */
	atomic_store(&fake.hold, 0);
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	while (atomic_load(&fake.unblocked) < atomic_load(&fake.blocked)) {
		CHECK(eos_now_ns() < deadline);
		eos_sleep_ns(1000000);
	}
	sel_cuda_override(NULL);
}

int main(void)
{
	test_rng rng;
	test_rng_init(&rng, test_seed());
	test_loader();
	test_backend(&rng);
	test_split_pool(&rng);
	test_split_store(&rng);
	test_split_store_stuck(&rng);
	printf("ok\n");
	return 0;
}
