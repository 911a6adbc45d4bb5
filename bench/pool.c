/*
 * pool.c - the pool manager's costs (design 2.15; docs/pool.md,
 * docs/performance.md).  Starts `$SELENE_BUILD/flare pool` (default
 * build/flare) in a temporary directory and prints:
 *
 *   RESULT pool_lookup_rtt_p50 <us> us      lookup submitted -> answer polled,
 *   RESULT pool_lookup_rtt_p99 <us> us      through the manager (1 candidate)
 *   RESULT unix_rtt_p50 <us> us             baseline: a 64-byte ping-pong on a
 *                                           Unix socketpair with a thread echoing
 *   RESULT pool_lookup_rtt_p50_vs_unix <x> ratio
 *   RESULT pool_restore_bps <v> bytes/s     claim a 64 MiB record, verify every
 *                                           page and the row, memcpy every slot
 *                                           out of the arena, release
 *   RESULT memcpy_bps <v> bytes/s           baseline: one memcpy of the same
 *                                           bytes out of the arena
 *   RESULT pool_restore_vs_memcpy <x> ratio  (goal >= 0.85)
 *   RESULT pool_restore_copy_vs_memcpy <x> ratio  the same without the
 *                                           verification (copy and protocol only)
 *
 * Paired rounds (docs/performance.md "Restore ratio, paired"): each round
 * measures the restore, the copy-only restore and the memcpy of the same
 * claimed slots into the same destination, in an order that rotates from
 * round to round, each from cold caches (bench_cold_caches); the ratios
 * are the medians of the rounds' own ratios.  The restore here copies into
 * host memory with memcpy, the host backend's copy; a GPU restore would be
 * a cuMemcpyBatch from the same registered arena.
 */
#include <pthread.h>
#include <sys/socket.h>

#include "benchlib.h"
#include "pool_testlib.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void *echo(void *arg)
{
	int fd = *(int *)arg;
	char b[64];
	for (;;) {
		ssize_t r = read(fd, b, sizeof b);
		if (r <= 0 || write(fd, b, (size_t)r) != r)
			return NULL;
	}
}

static double unix_rtt_p50(int n)
{
	int sv[2];
	CHECK(!socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
	pthread_t th;
	CHECK(!pthread_create(&th, NULL, echo, &sv[1]));
	uint64_t *v = malloc((size_t)n * sizeof *v);
	char b[64] = {1};
	for (int i = 0; i < n; i++) {
		uint64_t t0 = eos_now_ns();
		CHECK(write(sv[0], b, sizeof b) == (ssize_t)sizeof b);
		size_t got = 0;
		while (got < sizeof b) {
			ssize_t r = read(sv[0], b + got, sizeof b - got);
			CHECK(r > 0);
			got += (size_t)r;
		}
		v[i] = eos_now_ns() - t0;
	}
	close(sv[0]);
	pthread_join(th, NULL);
	close(sv[1]);
	qsort(v, (size_t)n, sizeof *v, cmp_u64);
	double p50 = (double)v[n / 2] / 1e3;
	free(v);
	return p50;
}

/* One memcpy of the claimed slots out of the arena (one call when they
 * are one span, as they are in a fresh arena), then the row. */
static void memcpy_slots(struct tc *a, const struct sel_pool_lease *l, uint8_t *dst, uint64_t sb,
			 uint32_t pages)
{
	const uint8_t *src = sel_pool_slot_addr(a->c, l->page_slots[0]);
	bool contiguous = true;
	for (uint32_t i = 1; i < l->n_pages && contiguous; i++)
		contiguous = l->page_slots[i] == l->page_slots[0] + i;
	if (contiguous) {
		memcpy(dst, src, (uint64_t)pages * sb);
	} else {
		for (uint32_t i = 0; i < l->n_pages; i++)
			memcpy(dst + (uint64_t)i * sb, sel_pool_slot_addr(a->c, l->page_slots[i]),
			       sb);
	}
	for (uint32_t i = 0; i < l->n_row_slots; i++)
		memcpy(dst + (uint64_t)(pages + i) * sb, sel_pool_slot_addr(a->c, l->row_slots[i]),
		       sb);
}

int main(void)
{
	char *dir = test_mkdtemp("bench-pool");
	struct mgr_proc m;
	mgr_start(&m, dir, "bench", "--memory", "256MiB", NULL);
	struct scope s;
	/* One rank, 64 KiB + 1000-byte planes: 68 KiB slots, a 6000-byte row. */
	scope_make(&s, 1, 65536, 1);
	struct tc a;
	CHECK_OK(tc_attach(&a, &m, &s, "bench", 0));
	uint64_t sb = sel_pool_slot_bytes(a.c);

	/* Lookup round trips. */
	sel_history h;
	hist_make(&h, &s, 1024, 1, 0);
	CHECK(put_record(&a, &h, 1024, 0) == SEL_POOL_OK);
	enum {
		N = 3000
	};
	static uint64_t rtt[N];
	for (int i = 0; i < N; i++) {
		sel_pool_ticket *k;
		uint64_t t0 = eos_now_ns();
		CHECK_OK(sel_pool_begin_lookup(a.c, &h, 0, 1024, &k));
		while (sel_pool_ticket_state(k) == SEL_POOL_TICKET_PENDING) {
			struct pollfd p = {sel_pool_wait_fd(a.c), POLLIN, 0};
			poll(&p, 1, 1000);
			struct sel_pool_event ev[8];
			sel_pool_poll(a.c, ev, 8);
		}
		rtt[i] = eos_now_ns() - t0;
		CHECK(sel_pool_ticket_answer(k)->n_cands == 1);
		sel_pool_ticket_free(a.c, k);
	}
	qsort(rtt, N, sizeof rtt[0], cmp_u64);
	double p50 = (double)rtt[N / 2] / 1e3, p99 = (double)rtt[N * 99 / 100] / 1e3;
	double u50 = unix_rtt_p50(N);
	printf("RESULT pool_lookup_rtt_p50 %.1f us\n", p50);
	printf("RESULT pool_lookup_rtt_p99 %.1f us\n", p99);
	printf("RESULT unix_rtt_p50 %.1f us\n", u50);
	printf("RESULT pool_lookup_rtt_p50_vs_unix %.2f ratio\n", p50 / u50);

	/* Restores of a 64 MiB record. */
	uint32_t pages = (uint32_t)((64ull << 20) / sb);
	uint64_t c = (uint64_t)pages * 64;
	sel_history big;
	hist_make(&big, &s, c, 2, 0);
	CHECK(put_record(&a, &big, c, 0) == SEL_POOL_OK);
	uint64_t bytes = ((uint64_t)pages + sel_pool_row_slots(a.c)) * sb;
	uint8_t *dst = aligned_alloc(4096, bytes);
	memset(dst, 1, bytes);
	enum {
		R = 21
	};
	double full[R], copy[R], mc[R], rf[R], rc[R];
	for (int r = 0; r < R; r++) {
		for (int k = 0; k < 3; k++) {
			int what = (k + r) % 3; /* 0: verified restore, 1: copy only, 2: memcpy */
			sel_pool_ticket *t = lookup(&a, &big, 0, c);
			uint32_t why;
			struct sel_pool_lease *l = NULL;
			if (what == 2) { /* the claim untimed: the memcpy alone is */
				CHECK((l = claim(&a, t, 0, &why)));
				bench_cold_caches();
				uint64_t t0 = eos_now_ns();
				memcpy_slots(&a, l, dst, sb, pages);
				mc[r] = (double)bytes / ((double)(eos_now_ns() - t0) / 1e9);
			} else {
				bench_cold_caches();
				uint64_t t0 = eos_now_ns();
				l = claim(&a, t, 0, &why);
				CHECK(l && l->n_pages == pages);
				if (what == 0)
					CHECK_OK(sel_pool_lease_verify(a.c, l));
				for (uint32_t i = 0; i < l->n_pages; i++)
					memcpy(dst + (uint64_t)i * sb,
					       sel_pool_slot_addr(a.c, l->page_slots[i]), sb);
				for (uint32_t i = 0; i < l->n_row_slots; i++)
					memcpy(dst + (uint64_t)(pages + i) * sb,
					       sel_pool_slot_addr(a.c, l->row_slots[i]), sb);
				CHECK_OK(sel_pool_release(a.c, l, SEL_POOL_OK));
				l = NULL;
				double secs = (double)(eos_now_ns() - t0) / 1e9;
				(what == 0 ? full : copy)[r] = (double)bytes / secs;
			}
			if (l)
				CHECK_OK(sel_pool_release(a.c, l, SEL_POOL_OK));
			sel_pool_ticket_free(a.c, t);
		}
		rf[r] = full[r] / mc[r];
		rc[r] = copy[r] / mc[r];
	}
	double f = bench_median(full, R), b = bench_median(mc, R);
	printf("RESULT pool_restore_bps %.0f bytes/s\n", f);
	printf("RESULT memcpy_bps %.0f bytes/s\n", b);
	printf("RESULT pool_restore_vs_memcpy %.3f ratio\n", bench_median(rf, R));
	printf("RESULT pool_restore_copy_vs_memcpy %.3f ratio\n", bench_median(rc, R));
	free(dst);
	sel_history_free(&h);
	sel_history_free(&big);
	tc_close(&a);
	mgr_stop(&m);
	scope_free(&s);
	test_rmtree(dir);
	free(dir);
	return 0;
}
