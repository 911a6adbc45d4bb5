/*
 * test_cuda.c - the CUDA copy backend on a real GPU (design 2.5).
 *
 * Exits 77 (skip), saying why, where libcuda.so.1 cannot be loaded or no
 * device is visible.  With a GPU it covers:
 *   - device page planes and a row plane (cuMemAlloc), a slab pool that is a
 *     registered anonymous mapping, and a scattered batch of pages plus the
 *     multi-slot row copied out through the CUDA backend's transfer
 *     threads, checked in the slots, then copied back into different page
 *     ids and a different state slot, byte-exact; windows large enough to
 *     need several 16 MiB batch calls;
 *   - two ranks (on devices 0 and 1, or both on device 0) with replicated
 *     planes: compare packs the record, and a packed copy-in fans it out to
 *     both devices byte-exact;
 *   - an O_DIRECT file read into the registered mapping, then copied in;
 *   - a split pool (where the device supports host-NUMA allocations):
 *     a round trip through rank parts.
 * (The memory store's GPU test is added with the store.)
 */
#include <fcntl.h>
#include <unistd.h>

#include "cuda.h"
#include "eos.h"
#include "slab.h"
#include "storefx.h"
#include "testutil.h"
#include "transfer.h"

#define PLANE_A (256u * 1024) /* 64 pages per window: ~16.2 MiB, two batch calls */
#define PLANE_B 3000u
#define ROW 600000u
#define PAGES 160u
#define ROWS 4u

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
	sel_slot_layout l;
};

static void set_device(struct gworld *w, uint32_t r) { CU(cu->cuCtxSetCurrent(w->ctx[r])); }

static void gworld_open(struct gworld *w, uint32_t ranks, const int *devices, bool replicated,
			test_rng *rng)
{
	static const char *names[3] = {"a", "b", "row"};
	const uint64_t unit[3] = {PLANE_A, PLANE_B, ROW}, count[3] = {PAGES, PAGES, ROWS};
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
	CHECK_OK(sel_geometry_build(al, n, ranks, 64, &w->g));
	CHECK_OK(sel_slot_layout_init(&w->l, w->g));
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
	sel_slot_layout_free(&w->l);
	sel_geometry_free(w->g);
}

static uint64_t unit_of(const struct gworld *w, uint32_t r, int p)
{
	return p == 2 ? w->g->rank[r].row.unit_bytes : w->g->rank[r].pages[p].unit_bytes;
}

/* Host copy of what the device should hold at (plane p, index i). */
static const uint8_t *expect(const struct gworld *w, uint32_t r, int p, uint32_t i)
{
	return w->host[r][p] + (uint64_t)i * unit_of(w, r, p);
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

/* Does the device hold want at (r, p, i)? */
static bool device_has(struct gworld *w, uint32_t r, int p, uint32_t i, const uint8_t *want)
{
	uint64_t u = unit_of(w, r, p);
	uint8_t *b = malloc(u);
	CHECK(b);
	set_device(w, r);
	CU(cu->cuMemcpyDtoH(b, w->mem[r][p] + (uint64_t)i * u, u));
	bool same = memcmp(b, want, u) == 0;
	free(b);
	return same;
}

static void wait_job(sel_xfer *x, struct sel_xfer_job *job)
{
	struct sel_xfer_job *done = NULL;
	for (int i = 0; i < 60000 && sel_xfer_poll(x, &done, 1) == 0; i++)
		eos_sleep_ns(1000000);
	CHECK(done == job);
	CHECKF(job->status == 0, "job failed on rank %u: %s", job->failed_rank,
	       sel_strerror(job->status));
}

/* Scattered pages + row out of the device, back into other ids. */
static void roundtrip(struct gworld *w, sel_xfer *x, sel_slab_pool *pool,
		      const struct sel_xfer_part *parts, uint32_t n, bool compare, test_rng *rng)
{
	uint32_t all[PAGES], *src = all, *dst = all + n, ps[PAGES], rs[8];
	CHECK(2 * n <= PAGES && w->l.row_slots <= 8);
	for (uint32_t i = 0; i < PAGES; i++)
		all[i] = i;
	for (uint32_t i = PAGES - 1; i > 0; i--) {
		uint32_t j = (uint32_t)test_rng_below(rng, i + 1), t = all[i];
		all[i] = all[j];
		all[j] = t;
	}
	if (pool) {
		CHECK_OK(sel_slab_alloc(pool, n, SEL_SLAB_INTAKE, ps));
		CHECK_OK(sel_slab_alloc(pool, w->l.row_slots, SEL_SLAB_INTAKE, rs));
	} else {
		for (uint32_t i = 0; i < n; i++)
			ps[i] = n - 1 - i;
		for (uint32_t k = 0; k < w->l.row_slots; k++)
			rs[k] = n + k;
	}
	struct sel_xfer_job out = {.dir = SEL_COPY_OUT,
				   .n_pages = n,
				   .pages = src,
				   .page_slots = ps,
				   .row = true,
				   .state_slot = 0,
				   .row_slots = rs,
				   .compare = compare};
	CHECK_OK(sel_xfer_submit(x, &out));
	wait_job(x, &out);
	if (compare)
		CHECK(out.pages_replicated && out.row_replicated);

	/* In the slots (CPU-readable unless split). */
	if (pool && !out.pages_replicated)
		for (uint32_t r = 0; r < w->ranks; r++)
			for (uint32_t i = 0; i < n; i++)
				for (int p = 0; p < 2; p++) {
					const uint8_t *s =
						(const uint8_t *)(uintptr_t)parts[r].base +
						(uint64_t)ps[i] * parts[r].stride +
						w->l.plane_off[r][p];
					CHECKF(memcmp(s, expect(w, r, p, src[i]),
						      unit_of(w, r, p)) == 0,
					       "slot of rank %u page %u plane %d", r, i, p);
				}

	poison_device(w);
	struct sel_xfer_job in = {.dir = SEL_COPY_IN,
				  .n_pages = n,
				  .pages = dst,
				  .page_slots = ps,
				  .row = true,
				  .state_slot = 1,
				  .row_slots = rs,
				  .pages_packed = out.pages_replicated,
				  .row_packed = out.row_replicated};
	CHECK_OK(sel_xfer_submit(x, &in));
	wait_job(x, &in);
	for (uint32_t r = 0; r < w->ranks; r++) {
		for (uint32_t i = 0; i < n; i++)
			for (int p = 0; p < 2; p++)
				CHECKF(device_has(w, r, p, dst[i], expect(w, r, p, src[i])),
				       "rank %u page %u (id %u -> %u) plane %d", r, i, src[i],
				       dst[i], p);
		CHECKF(device_has(w, r, 2, 1, expect(w, r, 2, 0)), "rank %u row", r);
	}
	/* A page that was not a destination kept the poison. */
	uint8_t *z = malloc(PLANE_A);
	CHECK(z);
	memset(z, 0x5a, PLANE_A);
	CHECK(device_has(w, 0, 0, src[0], z) || 2 * n == PAGES);
	free(z);

	/* Restore the device bytes for later tests. */
	for (uint32_t r = 0; r < w->ranks; r++) {
		set_device(w, r);
		for (int p = 0; p < 3; p++)
			CU(cu->cuMemcpyHtoD(w->mem[r][p], w->host[r][p], w->len[r][p]));
	}
	if (pool) {
		CHECK_OK(sel_slab_free(pool, ps, n));
		CHECK_OK(sel_slab_free(pool, rs, w->l.row_slots));
	}
}

static void registered_pool(struct sel_copy_backend *be, const struct gworld *w, uint64_t slots,
			    sel_slab_pool **pool, struct sel_xfer_part *parts)
{
	struct sel_slab_hooks hooks = {be->host_register, be->host_unregister, be->ctx};
	CHECK_OK(sel_slab_create(w->l.slot_bytes, 0, slots, true, &hooks, pool));
	for (uint32_t r = 0; r < w->ranks; r++) {
		parts[r].base = (uintptr_t)sel_slab_base(*pool) + w->l.share_off[r];
		parts[r].stride = w->l.slot_bytes;
	}
}

static void test_backend(uint32_t ranks, const int *devices, bool replicated, test_rng *rng)
{
	struct gworld w;
	gworld_open(&w, ranks, devices, replicated, rng);
	struct sel_copy_backend *be;
	CHECK_OK(sel_copy_backend_cuda_create(cu, devices, ranks, &be));
	sel_slab_pool *pool;
	struct sel_xfer_part parts[2];
	registered_pool(be, &w, 2 * PAGES, &pool, parts);
	sel_xfer *x;
	CHECK_OK(sel_xfer_create(w.g, &w.l, pool, be, 8, &x));
	roundtrip(&w, x, pool, parts, 70, replicated && ranks > 1, rng);
	roundtrip(&w, x, pool, parts, 1, false, rng);
	CHECK_OK(sel_xfer_check(x));
	CHECK_OK(sel_xfer_close(x, 0));
	sel_xfer_destroy(x);
	sel_slab_destroy(pool);
	sel_copy_backend_cuda_destroy(be);
	gworld_close(&w);
	printf("backend: %u rank(s) on device %d%s, %s planes ok\n", ranks, devices[0],
	       ranks > 1 ? (devices[1] ? " and 1" : " twice") : "",
	       replicated ? "replicated" : "split");
}

/* Slot images in a file, read with O_DIRECT into the registered mapping,
 * then copied in. */
static void test_direct_read(test_rng *rng)
{
	const int dev[1] = {0};
	struct gworld w;
	gworld_open(&w, 1, dev, false, rng);
	struct sel_copy_backend *be;
	CHECK_OK(sel_copy_backend_cuda_create(cu, dev, 1, &be));
	sel_slab_pool *pool;
	struct sel_xfer_part parts[1];
	registered_pool(be, &w, 16, &pool, parts);

	const uint32_t n = 8;
	uint64_t sb = w.l.slot_bytes;
	uint8_t *img = eos_aligned_alloc(EOS_ALIGN, n * sb);
	CHECK(img);
	test_rng_fill(rng, img, n * sb);
	int fd = eos_open(AT_FDCWD, "slots.img", EOS_O_CREATE | EOS_O_WRITE);
	CHECK_OK(fd);
	CHECK(pwrite(fd, img, n * sb, 0) == (ssize_t)(n * sb));
	CHECK(fsync(fd) == 0);
	close(fd);
	fd = eos_open(AT_FDCWD, "slots.img", EOS_O_DIRECT);
	if (fd == -EINVAL) {
		printf("note: O_DIRECT refused here; direct read not checked\n");
	} else {
		CHECK_OK(fd);
		uint32_t ps[8], ids[8];
		CHECK_OK(sel_slab_alloc(pool, n, SEL_SLAB_INTAKE, ps));
		for (uint32_t i = 0; i < n; i++) {
			ids[i] = 3 + 11 * i;
			CHECK(pread(fd, sel_slab_addr(pool, ps[i]), sb, (off_t)(i * sb)) ==
			      (ssize_t)sb);
		}
		close(fd);
		struct sel_xfer_job in = {
			.dir = SEL_COPY_IN, .n_pages = n, .pages = ids, .page_slots = ps};
		sel_xfer *x;
		CHECK_OK(sel_xfer_create(w.g, &w.l, pool, be, 4, &x));
		CHECK_OK(sel_xfer_submit(x, &in));
		wait_job(x, &in);
		for (uint32_t i = 0; i < n; i++)
			for (int p = 0; p < 2; p++)
				CHECKF(device_has(&w, 0, p, ids[i],
						  img + i * sb + w.l.plane_off[0][p]),
				       "direct-read page %u plane %d", i, p);
		CHECK_OK(sel_xfer_close(x, 0));
		sel_xfer_destroy(x);
		printf("direct read into the registered mapping ok\n");
	}
	unlink("slots.img");
	eos_aligned_free(img);
	sel_slab_destroy(pool);
	sel_copy_backend_cuda_destroy(be);
	gworld_close(&w);
}

static void test_split(test_rng *rng)
{
	const int dev[1] = {0};
	struct sel_cuda_device_info info;
	CHECK_OK(sel_cuda_device_info(cu, 0, &info));
	if (!info.host_numa_vmm) {
		printf("note: device 0 has no host-NUMA virtual memory support; split pool not checked\n");
		return;
	}
	struct gworld w;
	gworld_open(&w, 1, dev, false, rng);
	sel_cuda_split_pool *sp;
	CHECK_OK(sel_cuda_split_pool_create(cu, dev, &w.l, 2 * PAGES, &sp));
	struct sel_copy_backend *be;
	CHECK_OK(sel_copy_backend_cuda_create(cu, dev, 1, &be));
	struct sel_xfer_part parts[1];
	sel_cuda_split_pool_parts(sp, parts);
	sel_xfer *x;
	CHECK_OK(sel_xfer_create_parts(w.g, &w.l, parts, 2 * PAGES, be, 4, &x));
	roundtrip(&w, x, NULL, parts, 70, false, rng);
	CHECK_OK(sel_xfer_close(x, 0));
	sel_xfer_destroy(x);
	sel_copy_backend_cuda_destroy(be);
	sel_cuda_split_pool_destroy(sp);
	gworld_close(&w);
	printf("split pool on NUMA node %d ok\n", info.host_numa_id);
}

int main(void)
{
	int count = 0;
	cu = sfx_cuda_or_skip(&count);
	test_rng rng;
	test_rng_init(&rng, test_seed());
	struct sel_cuda_device_info info;
	CHECK_OK(sel_cuda_device_info(cu, 0, &info));
	printf("driver %d, %d device(s); device 0: integrated %d, host NUMA node %d\n",
	       cu->driver_version, count, info.integrated, info.host_numa_id);

	test_backend(1, (int[]){0}, false, &rng);
	int two[2] = {0, count > 1 ? 1 : 0};
	test_backend(2, two, false, &rng);
	test_backend(2, two, true, &rng);
	test_direct_read(&rng);
	test_split(&rng);
	printf("ok\n");
	return 0;
}
