/*
 * bench/remote.c - the remote tier's throughput and lookup latency against
 * a real redis-server on loopback (issue 16), with redis-benchmark on the
 * same server in the same run as the baseline.
 *
 * Records of 16 windows, each window one stored page record of 4 MiB -
 * 4 KiB payload (a value just under 4 MiB), are put and then claimed
 * through the client; redis-benchmark SETs and GETs the same number of
 * values of exactly the window value size.  The machine is shared, so the
 * run is many short paired trials -- ours, then redis-benchmark on the
 * same bytes, the order alternating -- and a ratio is the median of the
 * trials' ratios.
 *
 * Prints RESULT lines (each also with _enc: the same with a key and
 * XChaCha20-Poly1305 encryption on):
 *   remote_put_gbps / remote_claim_gbps    payload bytes per second
 *   redis_set_gbps / redis_get_gbps        redis-benchmark, the better of
 *                                          -c 1 -P 1 and -c 4 -P 1 in each
 *                                          trial, in the client's scheduling
 *                                          class; SETs of new keys (-r)
 *   remote_put_vs_set / remote_claim_vs_get  the ratios (goal >= 0.8)
 *   remote_lookup_p50_us / remote_lookup_p99_us  a hitting lookup, submit
 *                                          to event, 10 buckets probed
 *
 * Environment: BENCH_DIR (default $TMPDIR or /tmp), BENCH_RECORDS
 * (records per trial, default 2: 128 MiB), BENCH_TRIALS (default 9),
 * BENCH_LOOKUPS (default 2000), BENCH_PUT_WINDOWS / BENCH_CLAIM_WINDOWS
 * (the client's windows in flight; 0 = its defaults), BENCH_VERBOSE=1 (the
 * process's CPU share during each put and claim phase).  Without
 * redis-server or redis-benchmark it says so and exits 0 (make bench).
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchlib.h"
#include "../tests/redisfx.h"

#define PAGES 16u
#define MAX_TRIALS 31
#define MAX_RECORDS 64
#define SEC 1000000000ull

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 10) : def;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* redis-benchmark's requests per second for test ("set" or "get"), or -1.
 * SETs go to random keys of a keyspace of 10^9 (-r), so that, like puts,
 * each value is new memory for Redis: without -r every SET overwrites one
 * key, whose memory Redis reuses hot, and is about 1.5 times as fast as
 * storing new values.  GETs read one existing key (a SET of it first):
 * reading a value costs the same whichever it is. */
static double redis_benchmark(const struct rfx_server *s, const char *dir, const char *test,
			      size_t value, int clients, int pipeline, int requests)
{
	char cmd[1400], out[1100];
	snprintf(out, sizeof out, "%s/rb.csv", dir);
	/* In the client's scheduling class (its I/O thread runs SCHED_BATCH,
	 * nice 10, below serving threads), so both sides of a ratio get the
	 * same share of a shared machine. */
	bool set = strcmp(test, "set") == 0;
	if (!set) {
		snprintf(
			cmd, sizeof cmd,
			"redis-benchmark -h 127.0.0.1 -p %d -t set -d %zu -n 1 -c 1 -q >/dev/null 2>&1",
			s->port, value);
		if (system(cmd) != 0)
			return -1;
	}
	snprintf(cmd, sizeof cmd,
		 "chrt --batch 0 nice -n 10 redis-benchmark -h 127.0.0.1 -p %d -t %s -d %zu -n %d "
		 "-c %d -P %d %s --csv > %s 2>/dev/null",
		 s->port, test, value, requests, clients, pipeline, set ? "-r 1000000000" : "",
		 out);
	if (system(cmd) != 0)
		return -1;
	FILE *f = fopen(out, "r");
	if (!f)
		return -1;
	char line[512];
	double rps = -1;
	while (fgets(line, sizeof line, f)) {
		/* "SET","123.45",... (the header line starts with "test") */
		if (line[0] != '"' || strncmp(line, "\"test\"", 6) == 0)
			continue;
		char *c = strchr(line + 1, '"');
		if (c && c[1] == ',' && c[2] == '"')
			rps = strtod(c + 3, NULL);
	}
	fclose(f);
	unlink(out);
	return rps;
}

static double best_benchmark(const struct rfx_server *s, const char *dir, const char *test,
			     size_t value, int requests)
{
	double a = redis_benchmark(s, dir, test, value, 1, 1, requests);
	double b = redis_benchmark(s, dir, test, value, 4, 1, requests);
	double best = a > b ? a : b;
	return best > 0 ? best * (double)value : -1;
}

static void flushall(struct rfx_server *s)
{
	redisReply *r = rfx_cmd(s, "FLUSHALL");
	if (r)
		freeReplyObject(r);
}

struct run {
	double put[MAX_TRIALS], claim[MAX_TRIALS], set[MAX_TRIALS], get[MAX_TRIALS];
	double put_ratio[MAX_TRIALS], claim_ratio[MAX_TRIALS];
	double p50, p99;
};

static void wait_all(sel_remote *r, int n, uint64_t timeout_ns, struct sel_remote_event *out)
{
	uint64_t deadline = eos_now_ns() + timeout_ns;
	int got = 0;
	while (got < n) {
		int k = sel_remote_poll(r, out + got, (size_t)(n - got));
		got += k;
		if (got == n)
			break;
		if (eos_now_ns() > deadline) {
			fprintf(stderr, "bench/remote: %d of %d events in time\n", got, n);
			exit(1);
		}
		struct pollfd p = {.fd = sel_remote_wait_fd(r), .events = POLLIN};
		poll(&p, 1, 100);
	}
}

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec / 1e6;
}
static double last_cpu_share;

static double put_all(sel_remote *r, struct rfx_rec *rec, int nrec, uint64_t payload,
		      struct sel_remote_event *ev)
{
	double c0 = cpu_s();
	uint64_t t0 = eos_now_ns();
	for (int i = 0; i < nrec; i++) {
		struct sel_remote_put p = {.d = rec[i].d,
					   .has_row = true,
					   .pages = rec[i].pages,
					   .row = rec[i].row,
					   .row_n = 1};
		uint64_t id;
		if (sel_remote_put(r, &p, &id)) {
			fprintf(stderr, "bench/remote: put: %s\n", sel_errmsg());
			exit(1);
		}
	}
	wait_all(r, nrec, 300 * SEC, ev);
	double bw = (double)payload / ((double)(eos_now_ns() - t0) / 1e9);
	last_cpu_share = (cpu_s() - c0) / ((double)(eos_now_ns() - t0) / 1e9);
	if (getenv("BENCH_VERBOSE"))
		printf("put: cpu %.2f of a core\n", last_cpu_share);
	for (int i = 0; i < nrec; i++)
		if (ev[i].result != SEL_REMOTE_STORED) {
			fprintf(stderr, "bench/remote: put %d: %s\n", i, sel_strerror(ev[i].error));
			exit(1);
		}
	return bw;
}

static double claim_all(sel_remote *r, sel_history *h, struct rfx_rec *rec, int nrec,
			uint64_t payload, struct sel_remote_event *ev, uint8_t *mem)
{
	sel_remote_hit *hits[MAX_RECORDS];
	for (int i = 0; i < nrec; i++) {
		struct sel_remote_event e = rfx_lookup(r, &h[i], 0, PAGES * 64 + 100);
		if (e.result != SEL_REMOTE_HIT) {
			fprintf(stderr, "bench/remote: lookup %d missed\n", i);
			exit(1);
		}
		hits[i] = e.hit;
	}
	void *pages[PAGES];
	for (uint32_t p = 0; p < PAGES; p++)
		pages[p] = mem + p * rec[0].stride;
	struct iovec row = {mem + PAGES * rec[0].stride, rec[0].row_bytes};
	struct sel_remote_dest d = {.pages = pages, .n_pages = PAGES, .row = &row, .row_n = 1};
	/* All claims write the same buffers: the client checks every page as
	 * it lands, which is part of what is measured. */
	double c0 = cpu_s();
	uint64_t t0 = eos_now_ns();
	for (int i = 0; i < nrec; i++) {
		uint64_t id;
		if (sel_remote_claim(r, hits[i], &d, 0, &id)) {
			fprintf(stderr, "bench/remote: claim: %s\n", sel_errmsg());
			exit(1);
		}
	}
	wait_all(r, nrec, 300 * SEC, ev);
	double bw = (double)payload / ((double)(eos_now_ns() - t0) / 1e9);
	if (getenv("BENCH_VERBOSE"))
		printf("claim: cpu %.2f of a core\n",
		       (cpu_s() - c0) / ((double)(eos_now_ns() - t0) / 1e9));
	for (int i = 0; i < nrec; i++)
		if (ev[i].result != SEL_REMOTE_CLAIMED) {
			fprintf(stderr, "bench/remote: claim: %s\n", sel_strerror(ev[i].error));
			exit(1);
		}
	return bw;
}

/* Paired trials, each short so that both sides of a ratio see the same
 * machine: ours, then redis-benchmark on the same bytes (or the other way
 * round on odd trials). */
static void bench(const char *label, struct rfx_server *srv, const char *dir, struct rfx_ns *t,
		  const uint8_t *key, bool encrypt, int trials, int nrec, int lookups,
		  struct run *out)
{
	char url[256];
	rfx_url(srv, 1, false, url, sizeof url);
	sel_history h[MAX_RECORDS];
	struct rfx_rec rec[MAX_RECORDS];
	for (int i = 0; i < nrec; i++) {
		rfx_history(t, &h[i], PAGES * 64 + 100, 7000 + (uint64_t)i);
		rfx_rec_make(&rec[i], t, &h[i], PAGES * 64, 0, 0, true);
	}
	struct sel_remote_config c = {.url = url,
				      .ns = &t->ns,
				      .key = key,
				      .encrypt = encrypt,
				      .put_queue = MAX_RECORDS,
				      .claim_queue = MAX_RECORDS,
				      .lookup_queue = 64,
				      .put_windows = (uint32_t)env_u64("BENCH_PUT_WINDOWS", 0),
				      .claim_windows = (uint32_t)env_u64("BENCH_CLAIM_WINDOWS", 0)};
	sel_remote *r;
	if (sel_remote_open(&c, &r)) {
		fprintf(stderr, "bench/remote: %s\n", sel_errmsg());
		exit(1);
	}
	rfx_wait_state(r, SEL_RN_UP, 20 * SEC);
	struct sel_remote_event *ev = calloc((size_t)nrec, sizeof *ev);
	struct sel_rv_keys kk = {.keyed = key != NULL, .encrypt = encrypt};
	size_t value = sel_rv_value_bytes(&kk, rec[0].stride);
	uint64_t payload = (uint64_t)nrec * (PAGES * rec[0].stride + rec[0].row_bytes);
	int requests = (int)(payload / value); /* the same bytes */
	uint8_t *mem = malloc(PAGES * rec[0].stride + rec[0].row_bytes);
	memset(mem, 0, PAGES * rec[0].stride + rec[0].row_bytes);
	for (int k = 0; k < trials; k++) {
		bool theirs_first = k % 2;
		if (theirs_first) {
			out->set[k] = best_benchmark(srv, dir, "set", value, requests);
			out->get[k] = best_benchmark(srv, dir, "get", value, requests);
			flushall(srv);
		}
		out->put[k] = put_all(r, rec, nrec, payload, ev);
		out->claim[k] = claim_all(r, h, rec, nrec, payload, ev, mem);
		if (k == trials - 1) {
			/* Lookups with 10 buckets to probe (about 600 new tokens). */
			uint64_t *lat = malloc((size_t)lookups * sizeof *lat);
			for (int i = 0; i < lookups; i++) {
				uint64_t id, s0 = eos_now_ns();
				if (sel_remote_lookup(r, &h[i % nrec], PAGES * 64 - 540,
						      PAGES * 64 + 100, 0, &id)) {
					fprintf(stderr, "bench/remote: lookup: %s\n", sel_errmsg());
					exit(1);
				}
				struct sel_remote_event e = rfx_wait(r, id, 30 * SEC);
				lat[i] = eos_now_ns() - s0;
				if (e.result != SEL_REMOTE_HIT) {
					fprintf(stderr, "bench/remote: lookup missed\n");
					exit(1);
				}
				sel_remote_hit_free(e.hit);
			}
			qsort(lat, (size_t)lookups, sizeof *lat, cmp_u64);
			out->p50 = (double)lat[lookups / 2] / 1e3;
			out->p99 = (double)lat[(size_t)lookups * 99 / 100] / 1e3;
			free(lat);
		}
		flushall(srv);
		if (!theirs_first) {
			out->set[k] = best_benchmark(srv, dir, "set", value, requests);
			out->get[k] = best_benchmark(srv, dir, "get", value, requests);
			flushall(srv);
		}
		out->put_ratio[k] = out->set[k] > 0 ? out->put[k] / out->set[k] : 0;
		out->claim_ratio[k] = out->get[k] > 0 ? out->claim[k] / out->get[k] : 0;
		printf("%s trial %d: put %.3f GB/s / SET %.3f = %.2f; claim %.3f GB/s / GET %.3f = "
		       "%.2f\n",
		       label, k, out->put[k] / 1e9, out->set[k] / 1e9, out->put_ratio[k],
		       out->claim[k] / 1e9, out->get[k] / 1e9, out->claim_ratio[k]);
		fflush(stdout);
	}
	struct sel_remote_stats st;
	sel_remote_stats(r, &st);
	printf("%s: window value %zu bytes, rtt %.0f us, grace %.1f ms, %llu auth failures, "
	       "%llu corrupt\n",
	       label, value, (double)st.rtt_ns / 1e3, (double)st.grace_ns / 1e6,
	       (unsigned long long)st.auth_failures, (unsigned long long)st.corrupt);
	sel_remote_close(r, 0);
	sel_remote_destroy(r);
	for (int i = 0; i < nrec; i++) {
		rfx_rec_free(&rec[i]);
		sel_history_free(&h[i]);
	}
	free(mem);
	free(ev);
}

static void report(const char *suffix, const struct run *x, int n)
{
	printf("RESULT remote_put_gbps%s %.3f GB/s\n", suffix, bench_median(x->put, n) / 1e9);
	printf("RESULT remote_claim_gbps%s %.3f GB/s\n", suffix, bench_median(x->claim, n) / 1e9);
	printf("RESULT redis_set_gbps%s %.3f GB/s\n", suffix, bench_median(x->set, n) / 1e9);
	printf("RESULT redis_get_gbps%s %.3f GB/s\n", suffix, bench_median(x->get, n) / 1e9);
	printf("RESULT remote_put_vs_set%s %.3f ratio\n", suffix, bench_median(x->put_ratio, n));
	printf("RESULT remote_claim_vs_get%s %.3f ratio\n", suffix,
	       bench_median(x->claim_ratio, n));
	printf("RESULT remote_lookup_p50_us%s %.0f us\n", suffix, x->p50);
	printf("RESULT remote_lookup_p99_us%s %.0f us\n", suffix, x->p99);
}

int main(void)
{
	/* Not an error for make bench, which runs every benchmark. */
	if (!rfx_available()) {
		printf("skip: redis-server is not installed (scripts/install-deps)\n");
		return 0;
	}
	if (system("command -v redis-benchmark >/dev/null") != 0) {
		printf("skip: redis-benchmark is not installed (redis-tools)\n");
		return 0;
	}
	const char *base = getenv("BENCH_DIR");
	if (!base || !*base)
		base = getenv("TMPDIR");
	if (!base || !*base)
		base = "/tmp";
	int trials = (int)env_u64("BENCH_TRIALS", 9);
	if (trials < 1 || trials > MAX_TRIALS)
		trials = 9;
	int nrec = (int)env_u64("BENCH_RECORDS", 2);
	if (nrec < 1 || nrec > MAX_RECORDS)
		nrec = 2;
	int lookups = (int)env_u64("BENCH_LOOKUPS", 2000);
	if (lookups < 10)
		lookups = 2000;
	char tmpl[4096];
	snprintf(tmpl, sizeof tmpl, "%s/bench-remote.XXXXXX", base);
	char *dir = mkdtemp(tmpl);
	if (!dir) {
		perror("bench/remote: mkdtemp");
		return 1;
	}
	struct rfx_server srv;
	rfx_start(&srv, dir, "redis", false, false, NULL);
	/* One page record fills one window: 4 MiB - 4 KiB of payload, so the
	 * value is just under 4 MiB. */
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 1, SEL_RV_CAP_MAX, 65536);
	static const uint8_t key[32] = "bench-remote-secret-0123456789a";
	static struct run plain, enc;
	bench("plain", &srv, dir, &t, NULL, false, trials, nrec, lookups, &plain);
	bench("encrypted", &srv, dir, &t, key, true, trials, nrec, lookups, &enc);
	report("", &plain, trials);
	report("_enc", &enc, trials);
	rfx_stop(&srv);
	rfx_ns_free(&t);
	test_rmtree(dir);
	return 0;
}
