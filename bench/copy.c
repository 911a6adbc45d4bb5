/*
 * copy.c - transfer throughput of 64-page windows (design 2.5, section 4).
 *
 * For two geometries -- a Qwen3-8B-like one (36 page planes: key and value
 * of 64 tokens x 8 KV heads x 128 dims x 2 bytes = 128 KiB, and 2 KiB
 * selector planes, for 12 layers; a 1.5 MiB row) and a 4-plane one with
 * 2 MiB units (a 4 MiB row) -- it times one window of 64 scattered pages
 * plus the row, copied out to slots and back in through a transfer set, and
 * prints
 *
 *   RESULT <name> <value> <unit>
 *
 * lines: with the host backend, bytes/s and the ratio to one large memcpy
 * of the same total bytes timed in the same run (issue 18: goal >= 0.9),
 * the ratio to the faster of that memcpy and one large copy of the same
 * bytes with streaming stores (copy_host.c), the best a single copy
 * reaches on this CPU (where glibc's memcpy does not stream at this size,
 * that copy beats it), the ratio the backend had before it streamed
 * (memcpy per piece, memcpy_pieces_*) and before it split windows with a
 * helper thread (the rank's thread alone, alone_*); all of them in rounds of every copy
 * back to back, each ratio the median of the rounds' ratios; with a GPU,
 * bytes/s through the CUDA backend, the ratio to one large pinned copy of
 * the same bytes (goal >= 0.9), and the speed-up over one cuMemcpyAsync per
 * page plane.  Without CUDA the GPU lines are skipped with a comment saying
 * why.  Each figure is the median of repeated runs, at least 5 and about a
 * second's worth.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchlib.h"
#include "cuda.h"
#include "eos.h"
#include "slab.h"
#include "../tests/testutil.h"
#include "transfer.h"

#define WINDOW SEL_WINDOW_PAGES
#define MIN_REPS 5
#define MAX_REPS 200
#define TARGET_NS 1000000000ull

struct geo {
	const char *name;
	uint32_t n_planes;
	uint64_t units[36];
	char names[36][16];
	uint64_t row;
	uint32_t pages; /* page count of each plane */
};

static void geo_qwen(struct geo *g)
{
	memset(g, 0, sizeof(*g));
	g->name = "qwen";
	g->n_planes = 36;
	for (uint32_t l = 0; l < 12; l++) {
		snprintf(g->names[3 * l], 16, "L%02u.key", l);
		snprintf(g->names[3 * l + 1], 16, "L%02u.sel", l);
		snprintf(g->names[3 * l + 2], 16, "L%02u.value", l);
		g->units[3 * l] = 64 * 8 * 128 * 2;
		g->units[3 * l + 1] = 2048;
		g->units[3 * l + 2] = 64 * 8 * 128 * 2;
	}
	g->row = 1536 * 1024;
	g->pages = 2 * WINDOW;
}

static void geo_big4(struct geo *g)
{
	memset(g, 0, sizeof(*g));
	g->name = "big4";
	g->n_planes = 4;
	for (uint32_t p = 0; p < 4; p++) {
		snprintf(g->names[p], 16, "p%u", p);
		g->units[p] = 2u << 20;
	}
	g->row = 4u << 20;
	g->pages = WINDOW + WINDOW / 2;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Median duration of fn(ctx) over about TARGET_NS of runs. */
static uint64_t median_ns(void (*fn)(void *), void *ctx)
{
	uint64_t t[MAX_REPS], spent = 0;
	int n = 0;
	fn(ctx); /* warm up */
	while (n < MAX_REPS && (n < MIN_REPS || spent < TARGET_NS)) {
		uint64_t t0 = eos_now_ns();
		fn(ctx);
		t[n] = eos_now_ns() - t0;
		spent += t[n++];
	}
	qsort(t, (size_t)n, sizeof(t[0]), cmp_u64);
	return t[n / 2];
}

static double rate(uint64_t bytes, uint64_t ns) { return (double)bytes / ((double)ns / 1e9); }

static void result(const char *geo, const char *what, double v, const char *unit)
{
	printf("RESULT %s_%s %.3f %s\n", geo, what, v, unit);
	fflush(stdout);
}

/* ---- One transfer set and its window job ---------------------------------- */

struct rig {
	sel_geometry *g;
	sel_slot_layout l;
	sel_slab_pool *pool;
	sel_xfer *x;
	uint32_t ids[WINDOW], ps[WINDOW], rs[16];
	struct sel_xfer_job job;
	uint64_t bytes;
};

static void rig_open(struct rig *rg, const struct geo *geo, const uint64_t *addr, uint64_t row_addr,
		     sel_memkind kind, const struct sel_copy_backend *be, test_rng *rng)
{
	sel_allocation al[37];
	memset(rg, 0, sizeof(*rg));
	for (uint32_t p = 0; p < geo->n_planes; p++)
		al[p] = (sel_allocation){.rank = 0,
					 .name = geo->names[p],
					 .group = SEL_GROUP_KV_PAGES,
					 .kind = kind,
					 .address = addr[p],
					 .unit_bytes = geo->units[p],
					 .count = geo->pages};
	al[geo->n_planes] = (sel_allocation){.rank = 0,
					     .name = "state",
					     .group = SEL_GROUP_STATE_ROWS,
					     .kind = kind,
					     .address = row_addr,
					     .unit_bytes = geo->row,
					     .count = 2};
	CHECK_OK(sel_geometry_build(al, geo->n_planes + 1, 1, 64, &rg->g));
	CHECK_OK(sel_slot_layout_init(&rg->l, rg->g));
	CHECK(rg->l.row_slots <= 16);
	struct sel_slab_hooks hooks = {be->host_register, be->host_unregister, be->ctx};
	CHECK_OK(sel_slab_create(rg->l.slot_bytes, 0, WINDOW + rg->l.row_slots, true, &hooks,
				 &rg->pool));
	memset(sel_slab_base(rg->pool), 0x11, (WINDOW + rg->l.row_slots) * rg->l.slot_bytes);
	CHECK_OK(sel_xfer_create(rg->g, &rg->l, rg->pool, be, 4, &rg->x));
	/* 64 scattered page ids. */
	uint32_t all[256];
	CHECK(geo->pages <= 256);
	for (uint32_t i = 0; i < geo->pages; i++)
		all[i] = i;
	for (uint32_t i = geo->pages - 1; i > 0; i--) {
		uint32_t j = (uint32_t)test_rng_below(rng, i + 1), t = all[i];
		all[i] = all[j];
		all[j] = t;
	}
	memcpy(rg->ids, all, sizeof(rg->ids));
	CHECK_OK(sel_slab_alloc(rg->pool, WINDOW, SEL_SLAB_INTAKE, rg->ps));
	CHECK_OK(sel_slab_alloc(rg->pool, rg->l.row_slots, SEL_SLAB_INTAKE, rg->rs));
	rg->bytes = WINDOW * rg->g->rank[0].page_bytes + geo->row;
}

static void rig_close(struct rig *rg)
{
	CHECK_OK(sel_xfer_close(rg->x, 0));
	sel_xfer_destroy(rg->x);
	sel_slab_destroy(rg->pool);
	sel_slot_layout_free(&rg->l);
	sel_geometry_free(rg->g);
}

static void run_job(struct rig *rg, enum sel_copy_dir dir)
{
	rg->job = (struct sel_xfer_job){.dir = dir,
					.n_pages = WINDOW,
					.pages = rg->ids,
					.page_slots = rg->ps,
					.row = true,
					.state_slot = 0,
					.row_slots = rg->rs};
	CHECK_OK(sel_xfer_submit(rg->x, &rg->job));
	struct sel_xfer_job *done = NULL;
	while (sel_xfer_poll(rg->x, &done, 1) == 0) {
		struct pollfd pfd = {.fd = sel_xfer_fd(rg->x), .events = POLLIN};
		poll(&pfd, 1, 1000);
	}
	CHECK(done == &rg->job && rg->job.status == 0 && rg->job.bytes == rg->bytes);
}

static void job_out(void *ctx) { run_job(ctx, SEL_COPY_OUT); }
static void job_in(void *ctx) { run_job(ctx, SEL_COPY_IN); }

/* ---- Host backend ------------------------------------------------------------ */

struct big_copy {
	void *dst;
	const void *src;
	size_t len;
};

static void do_memcpy(void *ctx)
{
	struct big_copy *c = ctx;
	memcpy(c->dst, c->src, c->len);
}

/* The host backend as it was before streaming stores: memcpy per piece,
 * measured in the same rounds for comparison. */
static int memcpy_copy(void *st, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	(void)st;
	(void)dir;
	(void)sel_host_copy_run(c, n, SEL_HOST_COPY_MEMCPY);
	return 0;
}

static struct sel_copy_backend memcpy_backend;

/* The host backend without its helper thread (copy_host.c "Splitting"):
 * the rank's thread alone, as before issue 18's split. */
static int alone_open(void *ctx, uint32_t rank, void **st)
{
	(void)ctx;
	(void)rank;
	*st = NULL;
	return 0;
}

static int alone_copy(void *st, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	(void)st;
	(void)dir;
	(void)sel_host_copy_run(c, n, SEL_HOST_COPY_AUTO);
	return 0;
}

static void alone_close(void *st) { (void)st; }

static struct sel_copy_backend alone_backend;

static void do_stream(void *ctx)
{
	struct big_copy *c = ctx;
	struct sel_copy one = {(uintptr_t)c->dst, (uintptr_t)c->src, c->len};
	(void)sel_host_copy_run(&one, 1, sel_host_copy_choose(c->len));
}

static void bench_host(const struct geo *geo, test_rng *rng)
{
	uint8_t *plane[36], *row;
	uint64_t addr[36];
	for (uint32_t p = 0; p < geo->n_planes; p++) {
		plane[p] = eos_aligned_alloc(EOS_ALIGN, geo->units[p] * geo->pages);
		CHECK(plane[p]);
		memset(plane[p], (int)p + 1, geo->units[p] * geo->pages);
		addr[p] = (uintptr_t)plane[p];
	}
	row = eos_aligned_alloc(EOS_ALIGN, 2 * geo->row);
	CHECK(row);
	memset(row, 0x77, 2 * geo->row);

	struct rig rg, old, alone;
	rig_open(&rg, geo, addr, (uintptr_t)row, SEL_MEM_HOST, &sel_copy_backend_host, rng);
	rig_open(&old, geo, addr, (uintptr_t)row, SEL_MEM_HOST, &memcpy_backend, rng);
	rig_open(&alone, geo, addr, (uintptr_t)row, SEL_MEM_HOST, &alone_backend, rng);

	struct big_copy c = {.len = rg.bytes};
	c.dst = eos_aligned_alloc(EOS_ALIGN, c.len);
	void *src = eos_aligned_alloc(EOS_ALIGN, c.len);
	CHECK(c.dst && src);
	memset(c.dst, 1, c.len);
	memset(src, 2, c.len);
	c.src = src;

	/* Rounds of every copy back to back, so each ratio compares timings
	 * taken under the same load (the machine is shared); medians of the
	 * rates and of the per-round ratios. */
	enum {
		OUT,
		OLD_OUT,
		IN,
		OLD_IN,
		BIG,
		STREAM,
		ALONE_OUT,
		ALONE_IN,
		KINDS
	};
	static void (*const fn[KINDS])(void *) = {job_out,   job_out,   job_in,  job_in,
						  do_memcpy, do_stream, job_out, job_in};
	void *ctx[KINDS] = {&rg, &old, &rg, &old, &c, &c, &alone, &alone};
	static double t[KINDS][MAX_REPS], q[8][MAX_REPS];
	for (int k = 0; k < KINDS; k++)
		fn[k](ctx[k]); /* warm up */
	int n = 0;
	uint64_t spent = 0;
	while (n < MAX_REPS && (n < MIN_REPS || spent < 2 * TARGET_NS)) {
		for (int k = 0; k < KINDS; k++) {
			uint64_t t0 = eos_now_ns();
			fn[k](ctx[k]);
			uint64_t d = eos_now_ns() - t0;
			t[k][n] = (double)d;
			spent += d;
		}
		double best = t[BIG][n] < t[STREAM][n] ? t[BIG][n] : t[STREAM][n];
		q[0][n] = t[BIG][n] / t[OUT][n];
		q[1][n] = best / t[OUT][n];
		q[2][n] = t[BIG][n] / t[IN][n];
		q[3][n] = best / t[IN][n];
		q[4][n] = t[BIG][n] / t[OLD_OUT][n];
		q[5][n] = t[BIG][n] / t[OLD_IN][n];
		q[6][n] = t[BIG][n] / t[ALONE_OUT][n];
		q[7][n] = t[BIG][n] / t[ALONE_IN][n];
		n++;
	}
	double b = (double)rg.bytes;
#define RATE(k) (b / (bench_median(t[k], n) / 1e9) / 1e9)
	printf("# %s: windows of this size are copied with %s; %d rounds\n", geo->name,
	       sel_host_copy_choose(rg.bytes) == SEL_HOST_COPY_MEMCPY ? "memcpy"
								      : "streaming stores",
	       n);
	result(geo->name, "window_bytes", b, "B");
	result(geo->name, "host_memcpy_rate", RATE(BIG), "GB/s");
	result(geo->name, "host_stream_rate", RATE(STREAM), "GB/s");
	result(geo->name, "host_out_rate", RATE(OUT), "GB/s");
	result(geo->name, "host_out_ratio", bench_median(q[0], n), "x");
	result(geo->name, "host_out_vs_best", bench_median(q[1], n), "x");
	result(geo->name, "host_in_rate", RATE(IN), "GB/s");
	result(geo->name, "host_in_ratio", bench_median(q[2], n), "x");
	result(geo->name, "host_in_vs_best", bench_median(q[3], n), "x");
	result(geo->name, "memcpy_pieces_out_ratio", bench_median(q[4], n), "x");
	result(geo->name, "memcpy_pieces_in_ratio", bench_median(q[5], n), "x");
	result(geo->name, "alone_out_ratio", bench_median(q[6], n), "x");
	result(geo->name, "alone_in_ratio", bench_median(q[7], n), "x");
#undef RATE

	rig_close(&alone);
	rig_close(&old);
	rig_close(&rg);
	eos_aligned_free(c.dst);
	eos_aligned_free(src);
	for (uint32_t p = 0; p < geo->n_planes; p++)
		eos_aligned_free(plane[p]);
	eos_aligned_free(row);
}

/* ---- CUDA backend -------------------------------------------------------------- */

static const struct sel_cuda *cu;

#define CU(call) CHECK_OK(sel_cuda_fail(cu, (call), "%s", #call))

struct cuda_copy {
	sel_cu_stream stream;
	sel_cu_dptr dst, src;
	size_t len;
	/* per-plane copies */
	struct rig *rg;
	enum sel_copy_dir dir;
};

static void do_cuda_big(void *ctx)
{
	struct cuda_copy *c = ctx;
	CU(cu->cuMemcpyAsync(c->dst, c->src, c->len, c->stream));
	CU(cu->cuStreamSynchronize(c->stream));
}

/* One cuMemcpyAsync per page plane (and row piece), then one wait. */
static void do_cuda_per_page(void *ctx)
{
	struct cuda_copy *c = ctx;
	const struct rig *rg = c->rg;
	const sel_rank_geometry *g0 = &rg->g->rank[0];
	uint64_t base = (uintptr_t)sel_slab_base(rg->pool);
	for (uint32_t i = 0; i < WINDOW; i++)
		for (uint32_t p = 0; p < g0->n_planes; p++) {
			uint64_t dev = g0->pages[p].address +
				       (uint64_t)rg->ids[i] * g0->pages[p].unit_bytes;
			uint64_t host = base + (uint64_t)rg->ps[i] * rg->l.slot_bytes +
					rg->l.plane_off[0][p];
			if (c->dir == SEL_COPY_OUT)
				CU(cu->cuMemcpyAsync(host, dev, g0->pages[p].unit_bytes,
						     c->stream));
			else
				CU(cu->cuMemcpyAsync(dev, host, g0->pages[p].unit_bytes,
						     c->stream));
		}
	for (uint32_t k = 0; k < rg->l.row_slots; k++) {
		uint64_t off, len;
		sel_slot_layout_row_piece(&rg->l, 0, k, &off, &len);
		if (!len)
			break;
		uint64_t dev = g0->row.address + k * rg->l.share[0];
		uint64_t host = base + (uint64_t)rg->rs[k] * rg->l.slot_bytes + off;
		if (c->dir == SEL_COPY_OUT)
			CU(cu->cuMemcpyAsync(host, dev, len, c->stream));
		else
			CU(cu->cuMemcpyAsync(dev, host, len, c->stream));
	}
	CU(cu->cuStreamSynchronize(c->stream));
}

static void bench_cuda(const struct geo *geo, test_rng *rng)
{
	const int dev0[1] = {0};
	sel_cu_device d;
	sel_cu_ctx ctx;
	CU(cu->cuDeviceGet(&d, 0));
	CU(cu->cuDevicePrimaryCtxRetain(&ctx, d));
	CU(cu->cuCtxSetCurrent(ctx));

	sel_cu_dptr plane[36], row;
	uint64_t addr[36];
	for (uint32_t p = 0; p < geo->n_planes; p++) {
		CU(cu->cuMemAlloc(&plane[p], geo->units[p] * geo->pages));
		addr[p] = plane[p];
	}
	CU(cu->cuMemAlloc(&row, 2 * geo->row));

	struct sel_copy_backend *be;
	CHECK_OK(sel_copy_backend_cuda_create(cu, dev0, 1, &be));
	struct rig rg;
	rig_open(&rg, geo, addr, row, SEL_MEM_DEVICE, be, rng);
	CU(cu->cuCtxSetCurrent(ctx)); /* rig_open's registration restored ours; be explicit */
	uint64_t out_ns = median_ns(job_out, &rg);
	uint64_t in_ns = median_ns(job_in, &rg);

	/* One large pinned copy of the same bytes, each way, in the pool. */
	struct cuda_copy c = {.len = rg.bytes, .rg = &rg};
	int least, greatest;
	CU(cu->cuCtxGetStreamPriorityRange(&least, &greatest));
	CU(cu->cuStreamCreateWithPriority(&c.stream, SEL_CU_STREAM_NON_BLOCKING, least));
	sel_cu_dptr dbuf;
	CU(cu->cuMemAlloc(&dbuf, rg.bytes));
	c.dst = (uintptr_t)sel_slab_base(rg.pool);
	c.src = dbuf;
	uint64_t big_out_ns = median_ns(do_cuda_big, &c);
	c.dst = dbuf;
	c.src = (uintptr_t)sel_slab_base(rg.pool);
	uint64_t big_in_ns = median_ns(do_cuda_big, &c);
	c.dir = SEL_COPY_OUT;
	uint64_t pp_out_ns = median_ns(do_cuda_per_page, &c);
	c.dir = SEL_COPY_IN;
	uint64_t pp_in_ns = median_ns(do_cuda_per_page, &c);

	result(geo->name, "cuda_big_out_rate", rate(rg.bytes, big_out_ns) / 1e9, "GB/s");
	result(geo->name, "cuda_out_rate", rate(rg.bytes, out_ns) / 1e9, "GB/s");
	result(geo->name, "cuda_out_ratio", (double)big_out_ns / (double)out_ns, "x");
	result(geo->name, "cuda_out_speedup_vs_per_page", (double)pp_out_ns / (double)out_ns, "x");
	result(geo->name, "cuda_big_in_rate", rate(rg.bytes, big_in_ns) / 1e9, "GB/s");
	result(geo->name, "cuda_in_rate", rate(rg.bytes, in_ns) / 1e9, "GB/s");
	result(geo->name, "cuda_in_ratio", (double)big_in_ns / (double)in_ns, "x");
	result(geo->name, "cuda_in_speedup_vs_per_page", (double)pp_in_ns / (double)in_ns, "x");

	CU(cu->cuStreamDestroy(c.stream));
	CU(cu->cuMemFree(dbuf));
	rig_close(&rg);
	sel_copy_backend_cuda_destroy(be);
	for (uint32_t p = 0; p < geo->n_planes; p++)
		CU(cu->cuMemFree(plane[p]));
	CU(cu->cuMemFree(row));
	CU(cu->cuCtxSetCurrent(NULL));
	CU(cu->cuDevicePrimaryCtxRelease(d));
}

int main(void)
{
	struct geo geos[2];
	test_rng rng;
	test_rng_init(&rng, 42);
	geo_qwen(&geos[0]);
	geo_big4(&geos[1]);

	memcpy_backend = sel_copy_backend_host;
	memcpy_backend.name = "host-memcpy";
	memcpy_backend.copy = memcpy_copy;
	alone_backend = sel_copy_backend_host;
	alone_backend.name = "host-alone";
	alone_backend.open_rank = alone_open;
	alone_backend.copy = alone_copy;
	alone_backend.close_rank = alone_close;
	for (int i = 0; i < 2; i++)
		bench_host(&geos[i], &rng);

	int count = 0;
	if (sel_cuda_load(&cu) != 0) {
		printf("# cuda: skipped (%s)\n", sel_errmsg());
		return 0;
	}
	if (sel_cuda_device_count(cu, &count) != 0 || count == 0) {
		printf("# cuda: skipped (no device visible)\n");
		return 0;
	}
	for (int i = 0; i < 2; i++)
		bench_cuda(&geos[i], &rng);
	return 0;
}
