/*
 * bench/disk.c - record write and read throughput through the disk thread,
 * against fio on the same directory, and the startup scan of 100,000
 * records (design 2.5; section 4 "Copy-out bandwidth").
 *
 * Prints RESULT lines:
 *   disk_write_gbps / disk_read_gbps   records through the disk thread
 *                                      (io_uring + O_DIRECT, checksums
 *                                      computed and verified on the thread)
 *   fio_write_gbps / fio_read_gbps     fio, ioengine=io_uring, direct=1,
 *                                      bs=8M, iodepth=32, same bytes
 *   disk_write_vs_fio / disk_read_vs_fio  the ratios (goal >= 0.9)
 *   small_<size>_*                     records of 16 KiB to 1 MiB of pages
 *                                      (and a 4 KiB row) written, read and
 *                                      unlinked with the file operations on
 *                                      the thread (sync, the fallback) and on
 *                                      the ring, alternating, in one run:
 *                                      records/s, GB/s, the disk thread's CPU
 *                                      per record and the process's (the
 *                                      thread plus io_uring's kernel workers),
 *                                      and ring / sync ratios
 *   scan_100k_s                        sel_record_scan over 100,000 records
 *                                      (goal <= 2 s); scan_100k_cold_s too
 *                                      when the page cache can be dropped
 *
 * Environment: BENCH_DIR (default $TMPDIR or /tmp), BENCH_MIB (MiB of
 * records per measurement, default 512), BENCH_ROUNDS (default 4), BENCH_SCAN_RECORDS (default 100000),
 * BENCH_SMALL_MIB (MiB of small records per size and mode, default 32; 0
 * skips them), BENCH_SMALL_ONLY=1 (only the small records), BENCH_DISK_NICE
 * (the disk thread's nice value for the throughput rounds, default 10).  Everything it
 * writes is removed at the end.  Without fio the ratios are skipped with a
 * line saying why.
 */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchlib.h"
#include "disk.h"
#include "../tests/recutil.h"
#include "slab.h"

#define MiB (1024.0 * 1024.0)
#define MAX_ROUNDS 15
static int ROUNDS = 4;

static double now_s(void) { return (double)eos_now_ns() / 1e9; }

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 10) : def;
}

/* Submit jobs[0..n), job i + depth only once job i has completed (jobs
 * depth apart share buffers); wait for all.  Returns bytes per second from
 * the first submit to the last completion. */
static double run_jobs(sel_disk *d, struct sel_disk_job *jobs, int n, int depth)
{
	int next = 0, lo = 0;
	uint64_t bytes = 0;
	struct pollfd p = {.fd = sel_disk_fd(d), .events = POLLIN};
	for (int i = 0; i < n; i++)
		jobs[i].id = 0;
	double t0 = now_s();
	while (lo < n) {
		while (next < n && next < lo + depth) {
			int rc = sel_disk_submit(d, &jobs[next]);
			if (rc == -EAGAIN)
				break;
			CHECK_OK(rc);
			next++;
		}
		poll(&p, 1, 1000);
		struct sel_disk_job *out[16];
		int k = sel_disk_poll(d, out, 16);
		for (int i = 0; i < k; i++) {
			if (out[i]->status)
				fprintf(stderr, "job failed: %s\n", out[i]->errmsg);
			CHECK(out[i]->status == 0);
			bytes += out[i]->bytes;
			out[i]->id = 1; /* finished */
		}
		while (lo < n && jobs[lo].id == 1)
			lo++;
	}
	return (double)bytes / (now_s() - t0);
}

static void set_jobs(struct sel_disk_job *jobs, int n, enum sel_disk_op op, void *const *pages,
		     const struct iovec *iov, int npieces)
{
	for (int i = 0; i < n; i++) {
		sel_record_desc rec = jobs[i].rec;
		memset(&jobs[i], 0, sizeof jobs[i]);
		jobs[i].rec = rec;
		jobs[i].op = op;
		jobs[i].row = true;
		jobs[i].pages = pages;
		jobs[i].row_iov = iov;
		jobs[i].row_n = (uint32_t)npieces;
	}
}

static double geomean(const double *v, int n)
{
	double l = 0;
	for (int i = 0; i < n; i++)
		l += log(v[i]);
	return exp(l / n);
}

static bool have_fio(void)
{
	int rc = system("fio --version >/dev/null 2>&1");
	return rc == 0;
}

static bool drop_caches(void)
{
	sync();
	int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0)
		return false;
	bool ok = write(fd, "3", 1) == 1;
	close(fd);
	return ok;
}

static double thread_cpu_s(const char *name);

/* ---- throughput ----------------------------------------------------------- */

static void bench_throughput(const char *base, uint64_t total)
{
	/* One rank, four 1 MiB planes (a 4 MiB page record), a 1 MiB row;
	 * records of 16 pages: 65 MiB each with header and row. */
	struct test_geo t;
	test_geo_init(&t, 1, 256, 4, (uint64_t[]){1 << 20, 1 << 20, 1 << 20, 1 << 20},
		      (1 << 20) + 100);
	sel_record_ns ns;
	test_ns_init(&ns, &t.g, 1);
	struct eos_dirlock lk;
	CHECK_OK(sel_record_dir_open(base, &ns, &lk));
	const uint32_t tail = (uint32_t)env_u64("BENCH_TAIL", 16);
	const uint64_t slot = ns.layout.sz.page_record;
	uint32_t rs = sel_record_row_slots(&ns.layout, 0);
	int nrec = (int)(total / (tail * slot));
	if (nrec < 2)
		nrec = 2;

	sel_slab_pool *pool;
	/* The source, and two destinations so that two reads can be in flight
	 * (a store reads several records into different slots). */
	CHECK_OK(sel_slab_create(slot, 3 * (tail + rs), 0, true, NULL, &pool));
	void *pages[3][256], *row[3][4];
	struct iovec iov[3][8];
	test_rng r;
	test_rng_init(&r, 1);
	int npieces = 0;
	for (int k = 0; k < 3; k++) {
		for (uint32_t i = 0; i < tail + rs; i++) {
			void *a = sel_slab_addr(pool, (uint32_t)k * (tail + rs) + i);
			if (k == 0)
				test_rng_fill(&r, a, slot);
			if (i < tail)
				pages[k][i] = a;
			else
				row[k][i - tail] = a;
		}
		npieces = sel_record_row_iov(&ns.layout, 0, row[k], rs, iov[k], 8);
		CHECK(npieces > 0);
	}
	void **src_pages = pages[0];
	struct iovec *src_iov = iov[0];

	/* BENCH_DISK_NICE: the disk thread's nice value (1..19; the default
	 * is the store's 10), to show what a busy machine's other processes
	 * take from a thread at reduced priority. */
	struct sel_disk_config cfg = {.dirfd = lk.fd,
				      .dir = lk.path,
				      .ns = &ns,
				      .direct = -1,
				      .nice = (int)env_u64("BENCH_DISK_NICE", 0)};
	sel_disk *d;
	CHECK_OK(sel_disk_create(&cfg, &d));
	for (int i = 0; i < 5000 && thread_cpu_s("sel-disk") < 0; i++)
		eos_sleep_ns(1000000);
	double wcpu = 0, wbytes = 0;
	struct sel_disk_stats st;
	sel_disk_stats(d, &st);
	printf("disk thread: %s, %s; %d records of %u x %.0f MiB pages + %.1f MiB row\n",
	       st.uring ? "io_uring" : "pread", st.direct ? "O_DIRECT" : "buffered", nrec, tail,
	       (double)slot / MiB, (double)ns.layout.sz.row_segment / MiB);

	struct sel_disk_job *jobs = calloc((size_t)nrec, sizeof(*jobs));
	for (int i = 0; i < nrec; i++)
		test_desc(&r, 256, (uint64_t)tail * 256 + 17, NULL, false, &jobs[i].rec);
	/* Paired rounds: each round writes with the disk thread and with fio
	 * back to back, then reads both back the same way; who goes first
	 * alternates.  The device is shared and drifts, and on a filesystem
	 * mounted with discard (thin-provisioned virtual disks) whoever writes
	 * first after the previous round's deletions is slower.  Each round's
	 * ratio compares like with like, and the geometric mean over an even
	 * number of rounds cancels the order bias. */
	bool fio = have_fio();
	if (!fio)
		printf("fio not found: skipping disk_write_vs_fio and disk_read_vs_fio\n");
	double wbw[MAX_ROUNDS], rbw[MAX_ROUNDS], fw[MAX_ROUNDS], fr[MAX_ROUNDS], wr[MAX_ROUNDS],
		rr[MAX_ROUNDS];
	for (int round = 0; round < ROUNDS; round++) {
		bool fio_first = round % 2 == 1;
		uint64_t bytes = (uint64_t)nrec * (tail * slot + ns.layout.sz.row_segment + 8192);
		fw[round] = fr[round] = 0;
		sync();
		if (fio && fio_first && (fw[round] = bench_fio_bw(lk.path, "write", bytes)) <= 0)
			fio = false;
		set_jobs(jobs, nrec, SEL_DISK_WRITE, src_pages, src_iov, npieces);
		double c0 = thread_cpu_s("sel-disk"), t0 = now_s();
		struct sel_disk_stats s0, s1;
		sel_disk_stats(d, &s0);
		wbw[round] = run_jobs(d, jobs, nrec, 4);
		sel_disk_stats(d, &s1);
		wcpu += thread_cpu_s("sel-disk") - c0;
		uint64_t busy = s1.write_busy_ns - s0.write_busy_ns;
		printf("round %d: write depth %.1f requests while busy, busy %.0f%% of the time\n",
		       round,
		       busy ? (double)(s1.write_depth_ns - s0.write_depth_ns) / (double)busy : 0,
		       100.0 * (double)busy / 1e9 / (now_s() - t0));
		wbytes += (double)bytes;
		if (fio && !fio_first && (fw[round] = bench_fio_bw(lk.path, "write", bytes)) <= 0)
			fio = false;
		sync();
		if (fio && fio_first && (fr[round] = bench_fio_bw(lk.path, "read", bytes)) <= 0)
			fio = false;
		set_jobs(jobs, nrec, SEL_DISK_READ, pages[1], iov[1], npieces);
		for (int i = 1; i < nrec; i += 2) {
			jobs[i].pages = pages[2];
			jobs[i].row_iov = iov[2];
		}
		/* Two in flight: job i + 2 reuses job i's destination, and the
		 * runner waits for job i before submitting job i + 2. */
		rbw[round] = run_jobs(d, jobs, nrec, 2);
		if (fio && !fio_first && (fr[round] = bench_fio_bw(lk.path, "read", bytes)) <= 0)
			fio = false;
		for (uint32_t i = 0; i < tail; i++)
			CHECK(memcmp(src_pages[i], pages[1][i], slot) == 0 &&
			      memcmp(src_pages[i], pages[2][i], slot) == 0);
		for (int i = 0; i < nrec; i++) {
			char name[SEL_RECORD_NAME_MAX];
			sel_record_name(&jobs[i].rec.key, name);
			unlinkat(lk.fd, name, 0);
		}
		unlinkat(lk.fd, "fio.bench", 0);
		wr[round] = fio ? wbw[round] / fw[round] : 0;
		rr[round] = fio ? rbw[round] / fr[round] : 0;
		printf("round %d: write %.2f GB/s (fio %.2f), read %.2f GB/s (fio %.2f)\n", round,
		       wbw[round] / 1e9, fw[round] / 1e9, rbw[round] / 1e9, fr[round] / 1e9);
	}
	if (!fio)
		printf("fio did not run: no ratios\n");
	printf("RESULT disk_write_gbps %.3f GB/s\n", bench_median(wbw, ROUNDS) / 1e9);
	printf("RESULT disk_write_thread_cpu_s_per_gb %.3f s\n", wcpu / (wbytes / 1e9));
	printf("RESULT disk_read_gbps %.3f GB/s\n", bench_median(rbw, ROUNDS) / 1e9);
	if (fio) {
		printf("RESULT fio_write_gbps %.3f GB/s\n", bench_median(fw, ROUNDS) / 1e9);
		printf("RESULT fio_read_gbps %.3f GB/s\n", bench_median(fr, ROUNDS) / 1e9);
		printf("RESULT disk_write_vs_fio %.3f ratio\n", geomean(wr, ROUNDS));
		printf("RESULT disk_read_vs_fio %.3f ratio\n", geomean(rr, ROUNDS));
	}
	CHECK_OK(sel_disk_close(d, 0));
	sel_disk_destroy(d);
	free(jobs);
	sel_slab_destroy(pool);
	eos_dirlock_release(&lk);
	sel_record_ns_free(&ns);
}

/* ---- small records ---------------------------------------------------------- */

/* The CPU time of the thread named name (the disk thread), in seconds, or
 * -1 when there is none. */
static double thread_cpu_s(const char *name)
{
	DIR *dir = opendir("/proc/self/task");
	if (!dir)
		return -1;
	struct dirent *e;
	double t = -1;
	while ((e = readdir(dir)) != NULL) {
		char path[300], comm[64] = "";
		snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof comm, f))
			comm[strcspn(comm, "\n")] = '\0';
		fclose(f);
		if (strcmp(comm, name) != 0)
			continue;
		/* A thread's CPU clock: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED). */
		pid_t tid = (pid_t)atoi(e->d_name);
		clockid_t cid = (clockid_t)((~(unsigned)tid << 3) | 6);
		struct timespec ts;
		if (clock_gettime(cid, &ts) == 0)
			t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
	}
	closedir(dir);
	return t;
}

/* The process's CPU time outside the calling thread: the disk thread and
 * the io_uring workers (which do the ring's file operations), in seconds. */
static double others_cpu_s(void)
{
	struct rusage all, me;
	getrusage(RUSAGE_SELF, &all);
	getrusage(RUSAGE_THREAD, &me);
	double a = (double)all.ru_utime.tv_sec + (double)all.ru_utime.tv_usec / 1e6 +
		   (double)all.ru_stime.tv_sec + (double)all.ru_stime.tv_usec / 1e6;
	double m = (double)me.ru_utime.tv_sec + (double)me.ru_utime.tv_usec / 1e6 +
		   (double)me.ru_stime.tv_sec + (double)me.ru_stime.tv_usec / 1e6;
	return a - m;
}

struct small_fig {
	double wrec, wbw, rrec, urec; /* write records/s and bytes/s, read and unlink records/s */
	double thread_us, proc_us;    /* write: CPU per record, disk thread / all but the caller */
};

/* Write, read back and unlink n records of tail pages with the file
 * operations as mode says. */
static void small_once(int dirfd, const char *path, const sel_record_ns *ns,
		       enum sel_disk_fileops mode, struct sel_disk_job *jobs, int n,
		       void *const *src, const struct iovec *siov, int spieces, void *const *dst,
		       const struct iovec *diov, int dpieces, struct small_fig *out)
{
	struct sel_disk_config cfg = {
		.dirfd = dirfd, .dir = path, .ns = ns, .direct = -1, .fileops = mode};
	sel_disk *d;
	CHECK_OK(sel_disk_create(&cfg, &d));
	struct sel_disk_stats st;
	sel_disk_stats(d, &st);
	CHECK(st.ring_fileops_on == (mode != SEL_DISK_FILEOPS_SYNC));
	/* The thread names itself when it starts. */
	for (int i = 0; i < 5000 && thread_cpu_s("sel-disk") < 0; i++)
		eos_sleep_ns(1000000);
	CHECK(thread_cpu_s("sel-disk") >= 0);
	sync();
	set_jobs(jobs, n, SEL_DISK_WRITE, src, siov, spieces);
	double c0 = thread_cpu_s("sel-disk"), p0 = others_cpu_s(), t0 = now_s();
	out->wbw = run_jobs(d, jobs, n, 16); /* one source: the writes only read it */
	double dt = now_s() - t0;
	out->thread_us = (thread_cpu_s("sel-disk") - c0) / n * 1e6;
	out->proc_us = (others_cpu_s() - p0) / n * 1e6;
	out->wrec = n / dt;
	sync();
	set_jobs(jobs, n, SEL_DISK_READ, dst, diov, dpieces);
	t0 = now_s();
	run_jobs(d, jobs, n, 1); /* one destination */
	out->rrec = n / (now_s() - t0);
	for (int i = 0; i < n; i++) {
		sel_record_desc rec = jobs[i].rec;
		memset(&jobs[i], 0, sizeof jobs[i]);
		jobs[i].rec = rec;
		jobs[i].op = SEL_DISK_UNLINK;
	}
	t0 = now_s();
	run_jobs(d, jobs, n, 16);
	out->urec = n / (now_s() - t0);
	sel_disk_stats(d, &st);
	CHECK((st.ring_fileops[SEL_DISK_FOP_RENAME] > 0) == (mode != SEL_DISK_FILEOPS_SYNC));
	CHECK_OK(sel_disk_close(d, 0));
	sel_disk_destroy(d);
}

static void bench_small(const char *base, uint64_t total)
{
	/* One rank, one plane: 16 KiB page records, a 4 KiB row. */
	struct test_geo t;
	test_geo_init(&t, 1, 64, 1, (uint64_t[]){16384}, 4000);
	sel_record_ns ns;
	test_ns_init(&ns, &t.g, 3);
	struct eos_dirlock lk;
	CHECK_OK(sel_record_dir_open(base, &ns, &lk));
	const uint64_t slot = ns.layout.sz.page_record;
	uint32_t rs = sel_record_row_slots(&ns.layout, 0);
	static const uint32_t tails[] = {1, 4, 16, 64};
	uint32_t only_tail = (uint32_t)env_u64("BENCH_SMALL_TAIL", 0);
	sel_slab_pool *pool;
	CHECK_OK(sel_slab_create(slot, 2 * (64 + rs), 0, true, NULL, &pool));
	void *pages[2][64], *row[2][4];
	struct iovec iov[2][8];
	int np[2];
	test_rng r;
	test_rng_init(&r, 7);
	for (int k = 0; k < 2; k++) {
		for (uint32_t i = 0; i < 64 + rs; i++) {
			void *a = sel_slab_addr(pool, (uint32_t)k * (64 + rs) + i);
			test_rng_fill(&r, a, slot);
			if (i < 64)
				pages[k][i] = a;
			else
				row[k][i - 64] = a;
		}
		np[k] = sel_record_row_iov(&ns.layout, 0, row[k], rs, iov[k], 8);
		CHECK(np[k] > 0);
	}
	printf("small records: %.0f KiB page records, 4 KiB row, file operations on the thread "
	       "(sync) and on the ring, alternating\n",
	       (double)slot / 1024);
	for (size_t s = 0; s < sizeof tails / sizeof tails[0]; s++) {
		uint32_t tail = tails[s];
		if (only_tail && tail != only_tail)
			continue;
		uint64_t rec_bytes = tail * slot;
		int n = (int)(total / rec_bytes);
		if (n < 64)
			n = 64;
		if (n > 4000)
			n = 4000;
		struct sel_disk_job *jobs = calloc((size_t)n, sizeof(*jobs));
		for (int i = 0; i < n; i++)
			test_desc(&r, 64, (uint64_t)tail * 64, NULL, false, &jobs[i].rec);
		struct small_fig fs[MAX_ROUNDS], fr[MAX_ROUNDS];
		int rounds = ROUNDS < 2 ? 2 : ROUNDS;
		for (int round = 0; round < rounds; round++) {
			bool ring_first = round % 2 == 1;
			for (int m = 0; m < 2; m++) {
				bool ring = (m == 0) == ring_first;
				small_once(lk.fd, lk.path, &ns,
					   ring ? SEL_DISK_FILEOPS_AUTO : SEL_DISK_FILEOPS_SYNC,
					   jobs, n, pages[0], iov[0], np[0], pages[1], iov[1],
					   np[1], ring ? &fr[round] : &fs[round]);
			}
			printf("  %4llu KiB x %d, round %d: write %.0f / %.0f records/s (sync / ring), "
			       "read %.0f / %.0f, unlink %.0f / %.0f, disk thread %.1f / %.1f us per "
			       "record, process %.1f / %.1f\n",
			       (unsigned long long)(rec_bytes >> 10), n, round, fs[round].wrec,
			       fr[round].wrec, fs[round].rrec, fr[round].rrec, fs[round].urec,
			       fr[round].urec, fs[round].thread_us, fr[round].thread_us,
			       fs[round].proc_us, fr[round].proc_us);
		}
		const char *names[] = {"write_rec_s",         "write_gbps",
				       "read_rec_s",          "unlink_rec_s",
				       "write_thread_cpu_us", "write_process_cpu_us"};
		for (int f = 0; f < 6; f++) {
			double a[MAX_ROUNDS], b[MAX_ROUNDS], q[MAX_ROUNDS];
			for (int i = 0; i < rounds; i++) {
				const struct small_fig *x = &fs[i], *y = &fr[i];
				double xs[6] = {x->wrec, x->wbw / 1e9, x->rrec,
						x->urec, x->thread_us, x->proc_us};
				double ys[6] = {y->wrec, y->wbw / 1e9, y->rrec,
						y->urec, y->thread_us, y->proc_us};
				a[i] = xs[f];
				b[i] = ys[f];
				q[i] = xs[f] > 0 ? ys[f] / xs[f] : 0;
			}
			const char *unit = f == 1 ? "GB/s" : f >= 4 ? "us" : "records/s";
			printf("RESULT small_%llu_%s_sync %.3f %s\n",
			       (unsigned long long)(rec_bytes >> 10), names[f],
			       bench_median(a, rounds), unit);
			printf("RESULT small_%llu_%s_ring %.3f %s\n",
			       (unsigned long long)(rec_bytes >> 10), names[f],
			       bench_median(b, rounds), unit);
			printf("RESULT small_%llu_%s_ring_vs_sync %.3f ratio\n",
			       (unsigned long long)(rec_bytes >> 10), names[f], geomean(q, rounds));
		}
		free(jobs);
	}
	sel_slab_destroy(pool);
	eos_dirlock_release(&lk);
	sel_record_ns_free(&ns);
}

/* ---- scan ------------------------------------------------------------------- */

struct filler {
	int dirfd;
	const sel_record_ns *ns;
	uint64_t from, to;
	void *row;
};

static void *fill_thread(void *arg)
{
	struct filler *fl = arg;
	test_rng r;
	test_rng_init(&r, fl->from + 1);
	struct iovec iov = {.iov_base = fl->row, .iov_len = fl->ns->layout.row_bytes[0]};
	struct sel_record_write_opts o = {.direct = true, .no_dir_fsync = true};
	for (uint64_t i = fl->from; i < fl->to; i++) {
		sel_record_desc d;
		/* Roots of fewer than 64 tokens: no pages, a 4 KiB row; 8 KiB files. */
		test_desc(&r, 64, 1 + i % 63, NULL, false, &d);
		o.nonce = i + 1;
		CHECK_OK(sel_record_write(fl->dirfd, fl->ns, &d, NULL, true, &iov, 1, &o));
	}
	return NULL;
}

static void bench_scan(const char *base, uint64_t n)
{
	struct test_geo t;
	test_geo_init(&t, 1, 64, 1, (uint64_t[]){4096}, 100);
	sel_record_ns ns;
	test_ns_init(&ns, &t.g, 2);
	struct eos_dirlock lk;
	CHECK_OK(sel_record_dir_open(base, &ns, &lk));
	void *row = eos_aligned_alloc(4096, 4096);
	double t0 = now_s();
	enum {
		NT = 4
	};
	struct filler fl[NT];
	pthread_t th[NT];
	for (int i = 0; i < NT; i++) {
		fl[i] = (struct filler){lk.fd, &ns, n * (uint64_t)i / NT,
					n * (uint64_t)(i + 1) / NT, row};
		CHECK(pthread_create(&th[i], NULL, fill_thread, &fl[i]) == 0);
	}
	for (int i = 0; i < NT; i++)
		pthread_join(th[i], NULL);
	printf("scan: wrote %llu records in %.1f s\n", (unsigned long long)n, now_s() - t0);
	/* A restart finds files written long ago: let writeback settle. */
	sync();
	eos_sleep_ns(1000000000ull);

	struct sel_scan_opts o = {.direct = true};
	sel_scan sc;
	t0 = now_s();
	CHECK_OK(sel_record_scan(lk.fd, &ns, &o, &sc));
	double ts = now_s() - t0;
	CHECK(sc.n == n);
	sel_scan_free(&sc);
	printf("RESULT scan_100k_s %.3f s\n", ts * 100000.0 / (double)n);
	if (drop_caches()) {
		t0 = now_s();
		CHECK_OK(sel_record_scan(lk.fd, &ns, &o, &sc));
		ts = now_s() - t0;
		CHECK(sc.n == n);
		sel_scan_free(&sc);
		printf("RESULT scan_100k_cold_s %.3f s\n", ts * 100000.0 / (double)n);
	} else {
		printf("cannot drop the page cache (not root): no cold scan\n");
	}
	eos_aligned_free(row);
	eos_dirlock_release(&lk);
	sel_record_ns_free(&ns);
}

int main(void)
{
	const char *dir = getenv("BENCH_DIR");
	if (dir && *dir)
		setenv("TEST_TMPDIR", dir, 1);
	char *base = test_mkdtemp("selene-bench-disk");
	CHECK(base);
	int dio = eos_direct_io_probe(base);
	if (dio != 1) {
		printf("direct I/O refused in %s: %s; skipping\n", base, eos_errmsg());
		test_rmtree(base);
		return 0;
	}
	uint64_t mib = env_u64("BENCH_MIB", 512);
	ROUNDS = (int)env_u64("BENCH_ROUNDS", 4);
	if (ROUNDS < 1 || ROUNDS > MAX_ROUNDS)
		ROUNDS = 4;
	uint64_t small = env_u64("BENCH_SMALL_MIB", 32);
	if (small)
		bench_small(base, small << 20);
	if (env_u64("BENCH_SMALL_ONLY", 0)) {
		test_rmtree(base);
		free(base);
		return 0;
	}
	bench_throughput(base, mib << 20);
	uint64_t n = env_u64("BENCH_SCAN_RECORDS", 100000);
	if (n)
		bench_scan(base, n);
	double t0 = now_s();
	test_rmtree(base);
	printf("cleanup: %.1f s\n", now_s() - t0);
	free(base);
	return 0;
}
