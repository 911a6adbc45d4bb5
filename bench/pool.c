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
 *   RESULT pool_restore_bps <v> bytes/s     the product's restore path: a 64 MiB
 *                                           record restored through a pooled
 *                                           store (lookup, claim, each window
 *                                           verified and copied in one pass on
 *                                           the store's two helpers, release)
 *   RESULT memcpy_bps <v> bytes/s           baseline: one memcpy of the same
 *                                           bytes (the record's arena slots)
 *   RESULT pool_restore_vs_memcpy <x> ratio  (goal >= 0.85) the median of the
 *                                           rounds' restore / memcpy
 *   RESULT pool_restore_vs_memcpy_p25 <x> ratio   and their quartiles
 *   RESULT pool_restore_vs_memcpy_p75 <x> ratio
 *
 * The restore figure is bench/pooled's measurement (bench/restorelib.c,
 * the same code) run against this benchmark's manager: fair pairs, each
 * round one restore and one memcpy of the same arena bytes, alternating
 * which goes first, each from cold caches (bench_cold_caches), the median
 * of the rounds' ratios (docs/performance.md "Restore ratio, paired").
 * BENCH_ROUNDS sets its rounds (default 41).
 *
 * Secondary, the client's protocol alone, without the pooled store:
 *
 *   RESULT pool_client_serial_restore_bps <v> bytes/s   claim, verify every
 *                                           page and the row on the calling
 *                                           thread, memcpy every slot, release
 *   RESULT pool_client_serial_memcpy_bps <v> bytes/s    one memcpy of the
 *                                           same claimed slots
 *   RESULT pool_client_serial_restore_vs_memcpy <x> ratio
 *   RESULT pool_client_serial_restore_copy_vs_memcpy <x> ratio  the same
 *                                           without the verification
 *
 * Its 21 paired rounds measure the serial restore, the copy-only restore
 * and the memcpy of the same claimed slots into the same destination, in
 * an order that rotates from round to round, each from cold caches; the
 * ratios are the medians of the rounds' own ratios.  It is the unfused
 * path (the checksum pass reads the record once more), kept to show what
 * the pooled store's fused pass on two helpers buys.
 */
#include <pthread.h>
#include <sys/socket.h>

#include "benchlib.h"
#include "pool_testlib.h"
#include "restorelib.h"

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

/* Lookup round trips through the manager, one candidate, and the Unix
 * socketpair baseline. */
static void lookup_rtts(struct tc *a, struct scope *s)
{
	sel_history h;
	hist_make(&h, s, 1024, 1, 0);
	CHECK(put_record(a, &h, 1024, 0) == SEL_POOL_OK);
	enum {
		N = 3000
	};
	static uint64_t rtt[N];
	for (int i = 0; i < N; i++) {
		sel_pool_ticket *k;
		uint64_t t0 = eos_now_ns();
		CHECK_OK(sel_pool_begin_lookup(a->c, &h, 0, 1024, &k));
		while (sel_pool_ticket_state(k) == SEL_POOL_TICKET_PENDING) {
			struct pollfd p = {sel_pool_wait_fd(a->c), POLLIN, 0};
			poll(&p, 1, 1000);
			struct sel_pool_event ev[8];
			sel_pool_poll(a->c, ev, 8);
		}
		rtt[i] = eos_now_ns() - t0;
		CHECK(sel_pool_ticket_answer(k)->n_cands == 1);
		sel_pool_ticket_free(a->c, k);
	}
	qsort(rtt, N, sizeof rtt[0], cmp_u64);
	double p50 = (double)rtt[N / 2] / 1e3, p99 = (double)rtt[N * 99 / 100] / 1e3;
	double u50 = unix_rtt_p50(N);
	printf("RESULT pool_lookup_rtt_p50 %.1f us\n", p50);
	printf("RESULT pool_lookup_rtt_p99 %.1f us\n", p99);
	printf("RESULT unix_rtt_p50 %.1f us\n", u50);
	printf("RESULT pool_lookup_rtt_p50_vs_unix %.2f ratio\n", p50 / u50);
	sel_history_free(&h);
}

/* The product's restore path: bench/pooled's paired rounds through this
 * benchmark's manager. */
static void pooled_restores(const char *sock, int R)
{
	struct bench_restore res;
	bench_pooled_restore(sock, R, "bench/pool", 0, &res);
	printf("RESULT pool_restore_bps %.0f bytes/s (%" PRIu64 " bytes)\n",
	       bench_median(res.restore_bps, R), res.bytes);
	printf("RESULT memcpy_bps %.0f bytes/s\n", bench_median(res.memcpy_bps, R));
	printf("RESULT pool_restore_vs_memcpy %.3f ratio\n", bench_median(res.ratio, R));
	printf("RESULT pool_restore_vs_memcpy_p25 %.3f ratio\n",
	       bench_quantile(res.ratio, R, 0.25));
	printf("RESULT pool_restore_vs_memcpy_p75 %.3f ratio\n",
	       bench_quantile(res.ratio, R, 0.75));
	bench_restore_free(&res);
}

/* One serial restore by the client alone, timed from the claim: verify
 * (when asked) on this thread, then memcpy every slot, release. */
static double serial_restore(struct tc *a, sel_pool_ticket *t, uint8_t *dst, uint64_t sb,
			     uint32_t pages, uint64_t bytes, bool verify)
{
	uint32_t why;
	bench_cold_caches();
	uint64_t t0 = eos_now_ns();
	struct sel_pool_lease *l = claim(a, t, 0, &why);
	CHECK(l && l->n_pages == pages);
	if (verify)
		CHECK_OK(sel_pool_lease_verify(a->c, l));
	for (uint32_t i = 0; i < l->n_pages; i++)
		memcpy(dst + (uint64_t)i * sb, sel_pool_slot_addr(a->c, l->page_slots[i]), sb);
	for (uint32_t i = 0; i < l->n_row_slots; i++)
		memcpy(dst + (uint64_t)(pages + i) * sb, sel_pool_slot_addr(a->c, l->row_slots[i]),
		       sb);
	CHECK_OK(sel_pool_release(a->c, l, SEL_POOL_OK));
	return (double)bytes / ((double)(eos_now_ns() - t0) / 1e9);
}

/* The client's protocol alone (secondary figures): serial restores of a
 * 64 MiB record against one memcpy of the same claimed slots. */
static void serial_restores(struct tc *a, struct scope *s)
{
	uint64_t sb = sel_pool_slot_bytes(a->c);
	uint32_t pages = (uint32_t)((64ull << 20) / sb);
	uint64_t c = (uint64_t)pages * 64;
	sel_history big;
	hist_make(&big, s, c, 2, 0);
	CHECK(put_record(a, &big, c, 0) == SEL_POOL_OK);
	uint64_t bytes = ((uint64_t)pages + sel_pool_row_slots(a->c)) * sb;
	uint8_t *dst = aligned_alloc(4096, bytes);
	CHECK(dst);
	memset(dst, 1, bytes);
	enum {
		R = 21
	};
	double full[R], copy[R], mc[R], rf[R], rc[R];
	for (int r = 0; r < R; r++) {
		for (int k = 0; k < 3; k++) {
			int what = (k + r) % 3; /* 0: verified restore, 1: copy only, 2: memcpy */
			sel_pool_ticket *t = lookup(a, &big, 0, c);
			if (what == 2) { /* the claim untimed: the memcpy alone is */
				uint32_t why;
				struct sel_pool_lease *l = claim(a, t, 0, &why);
				CHECK(l);
				bench_cold_caches();
				uint64_t t0 = eos_now_ns();
				memcpy_slots(a, l, dst, sb, pages);
				mc[r] = (double)bytes / ((double)(eos_now_ns() - t0) / 1e9);
				CHECK_OK(sel_pool_release(a->c, l, SEL_POOL_OK));
			} else {
				(what == 0 ? full : copy)[r] =
					serial_restore(a, t, dst, sb, pages, bytes, what == 0);
			}
			sel_pool_ticket_free(a->c, t);
		}
		rf[r] = full[r] / mc[r];
		rc[r] = copy[r] / mc[r];
	}
	printf("RESULT pool_client_serial_restore_bps %.0f bytes/s\n", bench_median(full, R));
	printf("RESULT pool_client_serial_memcpy_bps %.0f bytes/s\n", bench_median(mc, R));
	printf("RESULT pool_client_serial_restore_vs_memcpy %.3f ratio\n", bench_median(rf, R));
	printf("RESULT pool_client_serial_restore_copy_vs_memcpy %.3f ratio\n",
	       bench_median(rc, R));
	free(dst);
	sel_history_free(&big);
}

int main(void)
{
	int rounds = bench_rounds("bench/pool", 41); /* checked before anything starts */
	char *dir = test_mkdtemp("bench-pool");
	struct mgr_proc m;
	/* Room for both 64 MiB records (the pooled store's and the client's). */
	mgr_start(&m, dir, "bench", "--memory", "512MiB", NULL);
	struct scope s;
	/* One rank, 64 KiB + 1000-byte planes: 68 KiB slots, a 6000-byte row. */
	scope_make(&s, 1, 65536, 1);
	struct tc a;
	CHECK_OK(tc_attach(&a, &m, &s, "bench", 0));
	lookup_rtts(&a, &s);
	pooled_restores(m.sock, rounds);
	serial_restores(&a, &s);
	tc_close(&a);
	mgr_stop(&m);
	scope_free(&s);
	test_rmtree(dir);
	free(dir);
	return 0;
}
