/*
 * bench/store.c - store-level put and fetch throughput through the disk
 * store (design 2.4 DiskStore, Staged transport: copy-out into intake
 * windows, windowed record writes, verified range reads, copy-in), against
 * fio on the same directory (design 4 "Copy-out bandwidth").
 *
 * Host planes and the host copy backend stand in for the GPU, so the
 * numbers are the staging pipeline's: memcpy into intake slots, XXH3 on the
 * disk thread, direct I/O.  Records are 256 pages of 132 KiB (33 MiB) plus a
 * 256 KiB row; puts and fetches are kept in flight as fast as the store
 * accepts them (a refused put is offered again at the next event, as an
 * engine does after SEL_EV_PROGRESS).
 *
 * Like with like: fio runs on the store's own namespace directory, over the
 * same number of bytes as the round's records, with io_uring and O_DIRECT
 * (the store's disk thread uses io_uring + O_DIRECT too; the line "disk
 * I/O:" says what it got), in 8 MiB requests as the thread's chunks are.
 * Two things differ and are printed, not hidden:
 *   - queue depth: fio keeps 32 requests in flight (256 MiB), the device's
 *     ceiling.  The store writes and reads at most as many windows at once
 *     as its intake holds (design 1: 2 x max_active x row_slots + 2 x 64
 *     slots, two windows of 64 pages here, about 16.5 MiB).  So each round
 *     also runs fio at that depth (iodepth = intake slots / 64, 8 MiB
 *     requests): *_same_depth is the store against the device at the
 *     concurrency the store is allowed.
 *   - priority: the copy and disk threads run at nice 10 (design 2.10,
 *     --offload-sched), fio at the caller's.
 * The file fio writes is removed before the store's next put.  Each round
 * runs the store's put right beside fio's write and its fetch right beside
 * fio's read, on the same bytes; who goes first alternates by round (the
 * virtual disk drifts by the second), and the headline ratios are the
 * medians of the rounds' own ratios (a noisy round moves them least).
 *
 * Prints RESULT lines:
 *   store_put_gbps / store_fetch_gbps   bytes of records stored / restored
 *                                       per second (median of the rounds)
 *   fio_write_gbps / fio_read_gbps      fio, io_uring, direct=1, bs=8M,
 *                                       iodepth=32, the same bytes
 *   store_put_vs_fio / store_fetch_vs_fio  the median of the paired
 *                                       rounds' ratios
 *   store_put_vs_fio_paired / store_fetch_vs_fio_paired  their geometric
 *                                       mean
 *   store_put_vs_fio_of_medians / _fetch_  the ratio of the medians (the
 *                                       headline before issue 18's r18c)
 *   store_put_write_depth               the disk thread's mean count of write
 *                                       requests in flight during the puts,
 *                                       while any is (a mechanism figure:
 *                                       the load moves it little)
 *   fio_write_same_depth_gbps / fio_read_same_depth_gbps  fio at the
 *                                       store's depth, and
 *   store_put_vs_fio_same_depth / store_fetch_vs_fio_same_depth (paired)
 *
 *   store_read_through_gbps / fio_read_rt_gbps / store_read_through_vs_fio
 *                                       the composite's fetch of a record
 *                                       on disk only, read through into
 *                                       warm memory on its way to the
 *                                       destination (store_composite_read.c),
 *                                       one fetch at a time, fetch to
 *                                       SEL_EV_FETCHED, against fio's read
 *                                       of the same bytes in the same
 *                                       directory (issue 18, r26disk)
 *   store_read_through_read_depth       the disk thread's mean count of read
 *                                       requests in flight during them,
 *                                       while any is
 *
 * Environment: BENCH_DIR (default $TMPDIR or /tmp), BENCH_MIB (MiB of
 * records per round, default 512), BENCH_ROUNDS (default 5),
 * BENCH_RT_ROUNDS (read-through rounds, default 3; 0 skips them),
 * BENCH_ONLY_RT=1 (only the read-through rounds).  Everything it
 * writes is removed at the end.
 */
#include <math.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchlib.h"
#include "disk.h"
#include "store_composite.h"
#include "store_disk.h"
#include "../tests/storefx.h"

#define PAGES 256u
#define MAX_ROUNDS 9

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 10) : def;
}

static void wait_fd(sel_store *s)
{
	struct pollfd p = {.fd = sel_store_wait_fd(s), .events = POLLIN};
	poll(&p, 1, 5);
}

/* Puts of cp[0..n): as many in flight as the store accepts.  Bytes/s. */
static double run_puts(sel_store *s, const sel_published *cp, uint32_t n, uint64_t rec_bytes)
{
	double t0 = (double)eos_now_ns() / 1e9;
	uint32_t next = 0, done = 0;
	while (done < n) {
		while (next < n) {
			sel_retry_reason why;
			sel_outcome o = sel_store_put(s, &cp[next], &why);
			if (o == SEL_RETRY)
				break;
			CHECKF(o == SEL_QUEUED, "put %u: %s", next, sel_outcome_name(o));
			next++;
		}
		sel_event ev[16];
		int k = sel_store_poll(s, ev, 16);
		CHECK_OK(k);
		for (int i = 0; i < k; i++) {
			if (ev[i].type == SEL_EV_PROGRESS)
				continue; /* capacity back after a Retry */
			CHECK(ev[i].type == SEL_EV_STORED);
			done++;
		}
		if (!k)
			wait_fd(s);
	}
	return (double)n * (double)rec_bytes / ((double)eos_now_ns() / 1e9 - t0);
}

/* Fetches of every record, four tickets in flight.  Bytes/s. */
static double run_fetches(sel_store *s, struct sfx_conv *cv, uint32_t n, uint64_t rec_bytes,
			  uint32_t *dst)
{
	double t0 = (double)eos_now_ns() / 1e9;
	uint32_t next = 0, done = 0, live = 0;
	while (done < n) {
		while (next < n && live < 4) {
			sel_hit hit;
			CHECK_RC(sel_store_lookup(s, &cv[next].h, 0, UINT64_MAX, &hit), 1);
			sel_inbound in = {.ticket = next,
					  .pages = dst,
					  .n_pages = hit.pages,
					  .state_slot = 2 + next % 4};
			CHECK_OK(sel_store_fetch(s, &hit, &in));
			next++;
			live++;
		}
		sel_event ev[16];
		int k = sel_store_poll(s, ev, 16);
		CHECK_OK(k);
		for (int i = 0; i < k; i++) {
			if (ev[i].type == SEL_EV_PROGRESS)
				continue;
			CHECKF(ev[i].type == SEL_EV_FETCHED, "fetch: %s",
			       sel_strerror(ev[i].error));
			done++;
			live--;
		}
		if (!k)
			wait_fd(s);
	}
	return (double)n * (double)rec_bytes / ((double)eos_now_ns() / 1e9 - t0);
}

/* fio at depth 32 (write or read, 8 MiB requests) on dir: bytes/s, 0 on
 * failure.  A write goes into a new file, as every record does:
 * overwriting the blocks of the last run skips the allocation and measured
 * up to 1.6x faster here. */
static double fio_one(const char *dir, const char *rw, uint64_t bytes)
{
	char p[4200];
	snprintf(p, sizeof p, "%s/fio.bench", dir);
	if (rw[0] == 'w')
		unlink(p);
	return bench_fio_bw(dir, rw, bytes);
}

/* fio at the store's depth, write then read (a new file): out[0..2). */
static bool fio_depth(const char *dir, uint64_t bytes, unsigned depth, double out[2])
{
	char p[4200];
	snprintf(p, sizeof p, "%s/fio.bench", dir);
	unlink(p);
	out[0] = bench_fio_bw_depth(dir, "write", bytes, depth);
	out[1] = bench_fio_bw_depth(dir, "read", bytes, depth);
	unlink(p);
	return out[0] > 0 && out[1] > 0;
}

/* ---- read-through: the composite's disk-to-destination fetch ---------------------- */

/* Records put into a composite with room for all of them and drained to
 * disk at close; reopened (memory empty), each is fetched alone, as a
 * restore is, and read through into warm memory on its way to the
 * destination (store_composite_read.c).  Bytes per second from each fetch
 * to its SEL_EV_FETCHED, the fetches one after another. */
static sel_store *open_composite(struct sfx *fx, const char *dir, uint64_t warm_bytes)
{
	sel_store_config cfg = sfx_config(fx, false);
	cfg.disk_dir = dir;
	cfg.disk_limit = 64ull << 30;
	cfg.max_active = 4;
	cfg.memory_bytes = warm_bytes;
	cfg.drain_on_shutdown = true;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(!strcmp(s->ops->name, "composite"));
	return s;
}

static void rt_fill(struct sfx *fx, const char *dir, uint64_t warm, const sel_published *cp,
		    uint32_t n, uint64_t rec_bytes)
{
	sel_store *s = open_composite(fx, dir, warm);
	(void)run_puts(s, cp, n, rec_bytes);
	CHECK_RC(sel_store_close(s, 0), 0); /* drains every record to disk */
	sel_store_destroy(s);
}

static double rt_fetches(sel_store *s, struct sfx_conv *cv, uint32_t n, uint64_t rec_bytes,
			 uint32_t *dst)
{
	uint64_t busy = 0;
	for (uint32_t i = 0; i < n; i++) {
		sel_hit hit;
		CHECK_RC(sel_store_lookup(s, &cv[i].h, 0, UINT64_MAX, &hit), 1);
		CHECK(hit.tier == SEL_TIER_DISK);
		sel_inbound in = {.ticket = i, .pages = dst, .n_pages = hit.pages, .state_slot = 2};
		uint64_t t0 = eos_now_ns();
		CHECK_OK(sel_store_fetch(s, &hit, &in));
		for (bool done = false; !done;) {
			sel_event ev[16];
			int k = sel_store_poll(s, ev, 16);
			CHECK_OK(k);
			for (int e = 0; e < k; e++) {
				if (ev[e].type == SEL_EV_PROGRESS)
					continue;
				CHECKF(ev[e].type == SEL_EV_FETCHED, "read-through: %s",
				       sel_strerror(ev[e].error));
				done = true;
			}
			if (!k && !done)
				wait_fd(s);
		}
		busy += eos_now_ns() - t0;
	}
	return (double)n * (double)rec_bytes / ((double)busy / 1e9);
}

/* Rounds of read-through fetches beside fio's read of the same bytes on
 * the same directory, who goes first alternating.  Prints the RESULTs. */
static void run_read_through(struct sfx *fx, const char *base, struct sfx_conv *cv,
			     const sel_published *cp, uint32_t n, uint64_t rec_bytes, uint32_t *dst,
			     int rounds, bool have_fio)
{
	double rt[MAX_ROUNDS], fr[MAX_ROUNDS], ratio[MAX_ROUNDS], depth[MAX_ROUNDS];
	uint64_t warm = (uint64_t)(n + 2) * (PAGES + 8) * fx->slot_bytes;
	uint64_t bytes = (uint64_t)n * rec_bytes;
	for (int r = 0; r < rounds; r++) {
		test_rmtree(base);
		rt_fill(fx, base, warm, cp, n, rec_bytes);
		sel_store *s = open_composite(fx, base, warm);
		const char *ns_dir = test_store_dir(s);
		struct sel_composite_gauges g0, g1;
		sel_composite_store_gauges(s, &g0);
		bool fio_first = r % 2 == 1;
		fr[r] = 0;
		if (have_fio && fio_first)
			have_fio = (fr[r] = fio_one(ns_dir, "read", bytes)) > 0;
		struct sel_disk_stats d0, d1;
		sel_disk_store_thread_stats(sel_composite_store_disk(s), &d0);
		rt[r] = rt_fetches(s, cv, n, rec_bytes, dst);
		sel_disk_store_thread_stats(sel_composite_store_disk(s), &d1);
		uint64_t busy = d1.read_busy_ns - d0.read_busy_ns;
		depth[r] = busy ? (double)(d1.read_depth_ns - d0.read_depth_ns) / (double)busy : 0;
		if (have_fio && !fio_first)
			have_fio = (fr[r] = fio_one(ns_dir, "read", bytes)) > 0;
		sel_composite_store_gauges(s, &g1);
		CHECKF(g1.read_through - g0.read_through == n && g1.streamed == g0.streamed,
		       "%" PRIu64 " read through, %" PRIu64 " streamed",
		       g1.read_through - g0.read_through, g1.streamed - g0.streamed);
		CHECK(sfx_page_ok(fx, dst[7], 1000 + n - 1, 7, false));
		ratio[r] = fr[r] > 0 ? rt[r] / fr[r] : 0;
		printf("read-through round %d: %u records, %.2f GB/s (%.2f reads in flight, %" PRIu64
		       " reads beside; fio read %.2f)%s\n",
		       r, n, rt[r] / 1e9, depth[r], d1.reads_beside - d0.reads_beside, fr[r] / 1e9,
		       fio_first ? ", fio first" : "");
		char p[4200];
		snprintf(p, sizeof p, "%s/fio.bench", ns_dir);
		unlink(p);
		CHECK_RC(sel_store_close(s, 0), 0);
		sel_store_destroy(s);
	}
	printf("RESULT store_read_through_gbps %.3f GB/s\n", bench_median(rt, rounds) / 1e9);
	printf("RESULT store_read_through_read_depth %.2f requests\n", bench_median(depth, rounds));
	if (have_fio) {
		printf("RESULT fio_read_rt_gbps %.3f GB/s\n", bench_median(fr, rounds) / 1e9);
		printf("RESULT store_read_through_vs_fio %.3f ratio\n",
		       bench_median(ratio, rounds));
	}
}

static double geomean(const double *v, int n)
{
	double l = 0;
	for (int i = 0; i < n; i++)
		l += log(v[i]);
	return exp(l / n);
}

static void loadavg(const char *when)
{
	char b[128] = "?";
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (!fgets(b, sizeof b, f))
			snprintf(b, sizeof b, "?\n");
		fclose(f);
	}
	printf("load average %s: %s", when, b);
}

/* One put and fetch round's line (f: its four fio figures, or NULL). */
static void print_round(int r, uint32_t n, uint64_t rec_bytes, double put, double depth_w,
			uint64_t beside, double get, const double *f, unsigned depth,
			bool fio_first)
{
	printf("round %d: %u records of %.1f MiB: put %.2f GB/s (%.2f writes in flight, %" PRIu64
	       " parts beside), fetch %.2f GB/s",
	       r, n, (double)rec_bytes / (1 << 20), put / 1e9, depth_w, beside, get / 1e9);
	if (f)
		printf(" (fio write %.2f, read %.2f; at depth %u: write %.2f, read %.2f)%s",
		       f[0] / 1e9, f[1] / 1e9, depth, f[2] / 1e9, f[3] / 1e9,
		       fio_first ? ", fio first" : "");
	else
		printf(" (fio failed or absent: no ratios)");
	printf("\n");
}

/* The put and fetch rounds' RESULT lines (rounds >= 1). */
static void report(double *put, double *get, double *depth_w, double fio[4][MAX_ROUNDS],
		   double ratio[4][MAX_ROUNDS], int rounds, bool have_fio)
{
	printf("RESULT store_put_gbps %.3f GB/s\n", bench_median(put, rounds) / 1e9);
	printf("RESULT store_fetch_gbps %.3f GB/s\n", bench_median(get, rounds) / 1e9);
	printf("RESULT store_put_write_depth %.2f requests\n", bench_median(depth_w, rounds));
	if (have_fio) {
		static const char *const fio_name[4] = {"fio_write_gbps", "fio_read_gbps",
							"fio_write_same_depth_gbps",
							"fio_read_same_depth_gbps"};
		static const char *const ratio_name[4] = {
			"store_put_vs_fio_paired", "store_fetch_vs_fio_paired",
			"store_put_vs_fio_same_depth", "store_fetch_vs_fio_same_depth"};
		for (int k = 0; k < 4; k++)
			printf("RESULT %s %.3f GB/s\n", fio_name[k],
			       bench_median(fio[k], rounds) / 1e9);
		printf("RESULT store_put_vs_fio %.3f ratio\n", bench_median(ratio[0], rounds));
		printf("RESULT store_fetch_vs_fio %.3f ratio\n", bench_median(ratio[1], rounds));
		printf("RESULT store_put_vs_fio_of_medians %.3f ratio\n",
		       bench_median(put, rounds) / bench_median(fio[0], rounds));
		printf("RESULT store_fetch_vs_fio_of_medians %.3f ratio\n",
		       bench_median(get, rounds) / bench_median(fio[1], rounds));
		for (int k = 0; k < 4; k++)
			printf("RESULT %s %.3f ratio\n", ratio_name[k], geomean(ratio[k], rounds));
	}
}

int main(void)
{
	const char *dir = bench_dir();
	int rounds = (int)env_u64("BENCH_ROUNDS", 5);
	if (rounds < 1 || rounds > MAX_ROUNDS)
		rounds = 5;
	uint64_t mib = env_u64("BENCH_MIB", 512);

	struct sfx fx;
	const uint64_t units[3] = {65536, 65536, 4096};
	sfx_init(&fx, 1, 3, units, 256 << 10, 2 * PAGES + 8, 8);
	uint64_t rec_bytes = PAGES * sfx_page_bytes_all(&fx) + fx.row_bytes;
	uint32_t n = (uint32_t)((mib << 20) / rec_bytes);
	if (n < 2)
		n = 2;
	setenv("TEST_TMPDIR", dir, 1);
	char *base = test_mkdtemp("bench-store");
	CHECK(base);

	struct sfx_conv *cv = calloc(n, sizeof(*cv));
	sel_published *cp = calloc(n, sizeof(*cp));
	CHECK(cv && cp);
	for (uint32_t i = 0; i < n; i++) {
		sfx_conv_init(&fx, &cv[i], 1000 + i, PAGES * SFX_PT + 10, 0);
		cp[i] = sfx_ckpt(&fx, &cv[i], PAGES * SFX_PT, 0, 1, i + 1);
	}
	uint32_t dst[PAGES];
	for (uint32_t i = 0; i < PAGES; i++)
		dst[i] = PAGES + 4 + i;

	/* Per round: store put, fetch; fio write, read, write and read at
	 * the store's depth; and the four paired ratios. */
	double put[MAX_ROUNDS], get[MAX_ROUNDS], fio[4][MAX_ROUNDS], ratio[4][MAX_ROUNDS];
	double depth_w[MAX_ROUNDS];  /* the put's mean write requests in flight, while any */
	uint64_t beside[MAX_ROUNDS]; /* its write parts started beside their record's */
	bool have_fio = system("fio --version >/dev/null 2>&1") == 0;
	if (!have_fio)
		printf("fio not found: skipping the ratios\n");
	loadavg("at the start");
	bool only_rt = env_u64("BENCH_ONLY_RT", 0) != 0;
	for (int r = 0; r < (only_rt ? 0 : rounds); r++) {
		test_rmtree(base);
		sel_store_config cfg = sfx_config(&fx, false);
		cfg.disk_dir = base;
		cfg.disk_limit = 64ull << 30;
		cfg.max_active = 4;
		sel_store *s;
		CHECK_OK(sel_store_open(&cfg, &s));
		const char *ns_dir = test_store_dir(s);
		sel_store_info info;
		sel_store_describe(s, &info);
		unsigned depth = (unsigned)(info.intake_slots / 64);
		if (depth < 1)
			depth = 1;
		if (r == 0)
			printf("disk I/O: %s%s%s; intake %" PRIu64
			       " slots: %u windows in flight, fio "
			       "at iodepth 32 and %u\n",
			       info.disk_io ? info.disk_io : "?", *info.disk_io_note ? ", " : "",
			       info.disk_io_note, info.intake_slots, depth, depth);
		/* Each store figure right beside its fio figure on the same
		 * bytes: put beside fio's write, fetch beside fio's read, who
		 * goes first alternating by round (fio first: fio write, put,
		 * fetch, fio read; else put, fio write, fio read, fetch). */
		double f[4] = {0};
		uint64_t bytes = (uint64_t)n * rec_bytes;
		bool fio_first = r % 2 == 1;
		if (have_fio && fio_first)
			have_fio = (f[0] = fio_one(ns_dir, "write", bytes)) > 0;
		struct sel_disk_stats d0, d1;
		sel_disk_store_thread_stats(s, &d0);
		put[r] = run_puts(s, cp, n, rec_bytes);
		sel_disk_store_thread_stats(s, &d1);
		uint64_t busy = d1.write_busy_ns - d0.write_busy_ns;
		depth_w[r] =
			busy ? (double)(d1.write_depth_ns - d0.write_depth_ns) / (double)busy : 0;
		beside[r] = d1.parts_beside - d0.parts_beside;
		if (have_fio && !fio_first)
			have_fio = (f[0] = fio_one(ns_dir, "write", bytes)) > 0 &&
				   (f[1] = fio_one(ns_dir, "read", bytes)) > 0;
		get[r] = run_fetches(s, cv, n, rec_bytes, dst);
		CHECK(sfx_page_ok(&fx, dst[7], 1000 + n - 1, 7, false));
		if (have_fio && fio_first)
			have_fio = (f[1] = fio_one(ns_dir, "read", bytes)) > 0;
		if (have_fio)
			have_fio = fio_depth(ns_dir, bytes, depth, f + 2);
		for (int k = 0; k < 4; k++) {
			fio[k][r] = f[k];
			ratio[k][r] = f[k] > 0 ? (k % 2 ? get[r] : put[r]) / f[k] : 0;
		}
		print_round(r, n, rec_bytes, put[r], depth_w[r], beside[r], get[r],
			    have_fio ? f : NULL, depth, fio_first);
		CHECK_RC(sel_store_close(s, 0), 0);
		sel_store_destroy(s);
	}
	int rt_rounds = (int)env_u64("BENCH_RT_ROUNDS", 3);
	if (rt_rounds > MAX_ROUNDS)
		rt_rounds = MAX_ROUNDS;
	if (rt_rounds > 0)
		run_read_through(&fx, base, cv, cp, n, rec_bytes, dst, rt_rounds, have_fio);
	loadavg("at the end");
	if (only_rt)
		rounds = 0;
	if (rounds)
		report(put, get, depth_w, fio, ratio, rounds, have_fio);
	for (uint32_t i = 0; i < n; i++)
		sfx_conv_free(&cv[i]);
	free(cv);
	free(cp);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	return 0;
}
