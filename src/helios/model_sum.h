/*
 * model_sum.h - the recurrent-state summary of the synthetic model's row
 * (model.c "Summaries"), kept apart so that its vector form is one small
 * file (model_sum.c).
 */
#ifndef HELIOS_MODEL_SUM_H
#define HELIOS_MODEL_SUM_H

#include <stdint.h>

#define HEL_SUM_GOLD 0x9E3779B97F4A7C15ull
#define HEL_SUM_MIX 0xd6e8feb86659fd93ull

static inline uint64_t hel_sum_mix64(uint64_t x)
{
	x ^= x >> 32;
	x *= HEL_SUM_MIX;
	x ^= x >> 32;
	x *= HEL_SUM_MIX;
	x ^= x >> 32;
	return x;
}

/* The term of word i of the recurrent state: bijective in w. */
static inline uint64_t hel_sum_rec_term(uint64_t rsr, uint64_t i, uint64_t w)
{
	return hel_sum_mix64((w ^ rsr) + i * HEL_SUM_GOLD);
}

/* The sum (mod 2^64) of hel_sum_rec_term over the W little-endian words at
 * w: the same value on every path (the sum is order-free), with AVX-512
 * where the CPU has it (about 2.6x the scalar loop on the machine of
 * issue 18, where this summary of a 104 MiB row is most of a restore's
 * validation on the worker). */
uint64_t hel_sum_rec(const uint8_t *w, uint64_t W, uint64_t rsr);
/* The same over the n words at w numbered from i0 (words i0 .. i0 + n - 1
 * of a state whose word i0 is at w): a row summed piece by piece as it
 * lands. */
uint64_t hel_sum_rec_at(const uint8_t *w, uint64_t i0, uint64_t n, uint64_t rsr);
/* The scalar loop alone (tests compare the two). */
uint64_t hel_sum_rec_scalar(const uint8_t *w, uint64_t W, uint64_t rsr);

#endif
