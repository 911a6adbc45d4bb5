/*
 * benchlib.h - what several benchmarks share: the median of a few rounds and
 * fio's bandwidth on a directory, the baseline the disk figures are set
 * against (measured in the same run); where the shipped cores are.
 */
#ifndef BENCHLIB_H
#define BENCHLIB_H

#include <stdint.h>

/* Median of v[0..n) (n >= 1); v is not changed. */
double bench_median(const double *v, int n);
/* The q-quantile (0..1, nearest rank) of v[0..n) (n >= 1); v is not changed. */
double bench_quantile(const double *v, int n, double q);

/* Leave the CPU caches cold for the next measured pass: write and read a
 * buffer of twice the last-level cache (at least 64 MiB), so whatever the
 * previous pass read or wrote is evicted.  Paired rounds call it before
 * each side, so a restore and its baseline start from the same cache
 * state. */
void bench_cold_caches(void);

/* fio with io_uring and O_DIRECT, 8 MiB requests, 32 in flight, on
 * dir/fio.bench: bytes per second of `rw` ("write" or "read") over `bytes`,
 * or -1 with the reason printed.  The file is left for the caller. */
double bench_fio_bw(const char *dir, const char *rw, uint64_t bytes);
/* The same with iodepth requests of 8 MiB in flight instead of 32. */
double bench_fio_bw_depth(const char *dir, const char *rw, uint64_t bytes, unsigned depth);

/* Where benchmarks write: $BENCH_DIR, else $TMPDIR, else /tmp. */
const char *bench_dir(void);

/* The shipped cores' directory: $SELENE_SRCDIR/cores, else the first
 * cores/ directory above the executable, else "cores". */
const char *bench_cores_dir(void);

#endif
