/*
 * restorelib.h - the product's restore path measured against one memcpy
 * of the same bytes, shared by bench/pooled and bench/pool (issue 15):
 * two pool-only stores over host planes attached to a running `flare
 * pool`, a 64 MiB record put by A and restored by B through the pooled
 * store (lookup, claim, each window verified and copied in one pass on
 * the store's two helpers, release), in paired rounds.
 */
#ifndef RESTORELIB_H
#define RESTORELIB_H

#include <stdint.h>

struct bench_restore {
	int rounds;
	uint64_t bytes;      /* what one restore landed (FETCHED's bytes) */
	double *restore_bps; /* per round: fetch -> FETCHED */
	double *memcpy_bps;  /* per round: one memcpy of the record's arena span */
	double *ratio;       /* per round: restore_bps / memcpy_bps */
};

/* Fair pairs (docs/performance.md "Restore ratio, paired"): every round
 * measures one restore and one memcpy of the same 64 MiB of the arena (the
 * record's slots, found by their bytes) into 64 MiB of destination, one
 * right after the other, alternating which goes first, each from cold
 * caches (bench_cold_caches).  sock: the manager's socket (it needs about
 * 70 MiB of arena free); rounds: 3..1001; name prefixes the per-round lines
 * printed when verbose.  Exits on failure. */
void bench_pooled_restore(const char *sock, int rounds, const char *name, int verbose,
			  struct bench_restore *out);
void bench_restore_free(struct bench_restore *r);

/* BENCH_ROUNDS, else def: the rounds, checked to be 3..1001 (exits 2
 * naming the value otherwise). */
int bench_rounds(const char *name, int def);

#endif
