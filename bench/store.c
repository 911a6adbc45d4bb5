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
 * accepts them.
 *
 * Prints RESULT lines:
 *   store_put_gbps / store_fetch_gbps   bytes of records stored / restored
 *                                       per second (median of the rounds)
 *   fio_write_gbps / fio_read_gbps      fio, io_uring, direct=1, bs=8M,
 *                                       iodepth=32, the same bytes
 *   store_put_vs_fio / store_fetch_vs_fio  the ratios
 *
 * Environment: BENCH_DIR (default $TMPDIR or /tmp), BENCH_MIB (MiB of
 * records per round, default 512), BENCH_ROUNDS (default 3).  Everything it
 * writes is removed at the end.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchlib.h"
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

int main(void)
{
	const char *dir = bench_dir();
	int rounds = (int)env_u64("BENCH_ROUNDS", 3);
	if (rounds < 1 || rounds > MAX_ROUNDS)
		rounds = 3;
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

	double put[MAX_ROUNDS], get[MAX_ROUNDS], fw[MAX_ROUNDS], fr[MAX_ROUNDS];
	bool fio = system("fio --version >/dev/null 2>&1") == 0;
	if (!fio)
		printf("fio not found: skipping the ratios\n");
	const char *ns_dir = NULL;
	for (int r = 0; r < rounds; r++) {
		test_rmtree(base);
		sel_store_config cfg = sfx_config(&fx, false);
		cfg.disk_dir = base;
		cfg.disk_limit = 64ull << 30;
		cfg.max_active = 4;
		sel_store *s;
		CHECK_OK(sel_store_open(&cfg, &s));
		ns_dir = test_store_dir(s);

		/* Puts: as many in flight as the store accepts. */
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
		put[r] = (double)n * (double)rec_bytes / ((double)eos_now_ns() / 1e9 - t0);

		/* Fetches: four tickets in flight. */
		t0 = (double)eos_now_ns() / 1e9;
		next = done = 0;
		uint32_t live = 0;
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
		get[r] = (double)n * (double)rec_bytes / ((double)eos_now_ns() / 1e9 - t0);
		CHECK(sfx_page_ok(&fx, dst[7], 1000 + n - 1, 7, false));

		if (fio) {
			fw[r] = bench_fio_bw(ns_dir, "write", (uint64_t)n * rec_bytes);
			fr[r] = bench_fio_bw(ns_dir, "read", (uint64_t)n * rec_bytes);
			if (fw[r] <= 0 || fr[r] <= 0) {
				printf("fio failed: no ratios\n");
				fio = false;
			}
			char p[4200];
			snprintf(p, sizeof p, "%s/fio.bench", ns_dir);
			unlink(p);
		}
		printf("round %d: %u records of %.1f MiB: put %.2f GB/s, fetch %.2f GB/s", r, n,
		       (double)rec_bytes / (1 << 20), put[r] / 1e9, get[r] / 1e9);
		if (fio)
			printf(" (fio write %.2f, read %.2f)", fw[r] / 1e9, fr[r] / 1e9);
		printf("\n");
		CHECK_RC(sel_store_close(s, 0), 0);
		sel_store_destroy(s);
	}
	printf("RESULT store_put_gbps %.3f GB/s\n", bench_median(put, rounds) / 1e9);
	printf("RESULT store_fetch_gbps %.3f GB/s\n", bench_median(get, rounds) / 1e9);
	if (fio) {
		printf("RESULT fio_write_gbps %.3f GB/s\n", bench_median(fw, rounds) / 1e9);
		printf("RESULT fio_read_gbps %.3f GB/s\n", bench_median(fr, rounds) / 1e9);
		printf("RESULT store_put_vs_fio %.3f ratio\n",
		       bench_median(put, rounds) / bench_median(fw, rounds));
		printf("RESULT store_fetch_vs_fio %.3f ratio\n",
		       bench_median(get, rounds) / bench_median(fr, rounds));
	}
	for (uint32_t i = 0; i < n; i++)
		sfx_conv_free(&cv[i]);
	free(cv);
	free(cp);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	return 0;
}
