/*
 * benchlib.c - shared benchmark helpers (benchlib.h).
 */
#include "benchlib.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

double bench_median(const double *v, int n)
{
	double *s = malloc((size_t)n * sizeof *s);
	if (!s)
		abort();
	memcpy(s, v, (size_t)n * sizeof *s);
	qsort(s, (size_t)n, sizeof *s, cmp_double);
	double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	free(s);
	return m;
}

double bench_quantile(const double *v, int n, double q)
{
	double *s = malloc((size_t)n * sizeof *s);
	if (!s)
		abort();
	memcpy(s, v, (size_t)n * sizeof *s);
	qsort(s, (size_t)n, sizeof *s, cmp_double);
	double x = s[(int)(q * (n - 1) + 0.5)];
	free(s);
	return x;
}

void bench_cold_caches(void)
{
	static uint8_t *buf;
	static size_t len;
	static volatile uint64_t sink;
	if (!buf) {
		long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
		len = l3 > 0 && (size_t)l3 * 2 > (64u << 20) ? (size_t)l3 * 2 : 64u << 20;
		if (!(buf = malloc(len)))
			abort();
	}
	uint64_t acc = 0;
	for (size_t i = 0; i < len; i += 64)
		buf[i] = (uint8_t)(buf[i] + 1);
	for (size_t i = 0; i < len; i += 64)
		acc += buf[i];
	sink += acc;
}

double bench_fio_bw(const char *dir, const char *rw, uint64_t bytes)
{
	return bench_fio_bw_depth(dir, rw, bytes, 32);
}

double bench_fio_bw_depth(const char *dir, const char *rw, uint64_t bytes, unsigned depth)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
		 "fio --name=selene-bench --directory='%s' --filename=fio.bench --rw=%s --bs=8M "
		 "--iodepth=%u --ioengine=io_uring --direct=1 --size=%llu --numjobs=1 "
		 "--output-format=terse --terse-version=3 2>&1",
		 dir, rw, depth, (unsigned long long)bytes);
	FILE *f = popen(cmd, "r");
	if (!f) {
		printf("fio %s: cannot start it\n", rw);
		return -1;
	}
	char line[8192] = {0}, last[8192] = {0};
	while (fgets(line, sizeof line, f))
		if (strncmp(line, "3;", 2) == 0)
			snprintf(last, sizeof last, "%s", line);
	int st = pclose(f);
	if (st != 0 || !last[0]) {
		printf("fio %s failed (status %d)\n", rw, st);
		return -1;
	}
	/* terse v3: field 7 read bandwidth KiB/s, field 48 write bandwidth KiB/s
	 * (1-based, counting the version as field 1). */
	int want = strcmp(rw, "read") == 0 ? 7 : 48, field = 1;
	for (char *s = last, *tok; (tok = strsep(&s, ";")); field++)
		if (field == want)
			return strtod(tok, NULL) * 1024.0;
	printf("fio %s: no bandwidth field in its output\n", rw);
	return -1;
}

const char *bench_dir(void)
{
	const char *dir = getenv("BENCH_DIR");
	if (!dir || !*dir)
		dir = getenv("TMPDIR");
	return dir && *dir ? dir : "/tmp";
}

const char *bench_cores_dir(void)
{
	static char dir[PATH_MAX];
	const char *env = getenv("SELENE_SRCDIR");
	if (env && *env) {
		snprintf(dir, sizeof dir, "%s/cores", env);
		return dir;
	}
	char exe[PATH_MAX - 16];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return "cores";
	exe[n] = 0;
	for (char *slash; (slash = strrchr(exe, '/')) && slash != exe;) {
		*slash = 0;
		snprintf(dir, sizeof dir, "%s/cores", exe);
		if (access(dir, R_OK) == 0)
			return dir;
	}
	return "cores";
}
