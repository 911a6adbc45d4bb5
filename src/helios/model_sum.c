/*
 * model_sum.c - the recurrent-state summary of the synthetic model's row,
 * scalar and AVX-512 (model_sum.h; model.c "Summaries").
 *
 * DESIGN
 *
 * A restored row is validated on the worker (hel_model_row_loaded): the
 * summary S of its recurrent state is recomputed from the loaded bytes,
 * one mix per 64-bit word.  For Qwen TP1's 104 MiB row that is 13.7 M
 * words, 50-120 ms of the worker on the 2-core machine of issue 18 --
 * serialized after the copy-in of every restore, so it was half of an 8K
 * restore from memory and most of an overlapped restore's tail after its
 * bytes landed (docs/performance.md, "Where an overlapped 8K restore's time
 * goes").  The mix (two 64-bit multiplies) has no AVX2 form, but AVX-512DQ
 * multiplies eight lanes at once, so the vector loop is about memory
 * bound.  Addition mod 2^64 is associative and commutative, so the lanes'
 * partial sums add up to the scalar loop's value exactly: the model's
 * tokens do not depend on the path (tests/test_model.c compares both).
 *
 * A row the store hands over in pieces (selene.h sel_landed_hook
 * row_piece) is summed a range of words at a time, each as its piece
 * lands, from the piece's own bytes (hel_sum_rec_at: words numbered from
 * the range's first): the sum is order-free, so the ranges' sums add up
 * to the whole row's.
 *
 * INVARIANTS
 *   1. hel_sum_rec(w, W, rsr) == the sum of hel_sum_rec_term(rsr, i, w[i])
 *      for i in [0, W), on every CPU.
 *   2. hel_sum_rec_at(w + 8 * a, a, n, rsr) == the same sum for i in
 *      [a, a + n), so hel_sum_rec(w, W, rsr) == the sum of
 *      hel_sum_rec_at over any cut of [0, W) into ranges.
 */
#include <string.h>

#include "model_sum.h"

/* Words [from, n) of w, numbered from i0. */
static uint64_t rec_scalar(const uint8_t *w, uint64_t i0, uint64_t from, uint64_t n, uint64_t rsr)
{
	uint64_t s = 0;
	for (uint64_t j = from; j < n; j++) {
		uint64_t v;
		memcpy(&v, w + 8 * j, 8);
		s += hel_sum_rec_term(rsr, i0 + j, v);
	}
	return s;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512dq")))

static inline AVX512 __m512i vmix(__m512i x, __m512i m)
{
	x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
	x = _mm512_mullo_epi64(x, m);
	x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
	x = _mm512_mullo_epi64(x, m);
	return _mm512_xor_si512(x, _mm512_srli_epi64(x, 32));
}

static AVX512 uint64_t rec_avx512(const uint8_t *w, uint64_t i0, uint64_t n, uint64_t rsr)
{
	const __m512i r = _mm512_set1_epi64((long long)rsr);
	const __m512i m = _mm512_set1_epi64((long long)HEL_SUM_MIX);
	const __m512i step = _mm512_set1_epi64((long long)(16 * HEL_SUM_GOLD));
	/* i * GOLD for the 16 words of an iteration, two vectors of 8. */
	__m512i ia = _mm512_mullo_epi64(_mm512_add_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
							 _mm512_set1_epi64((long long)i0)),
					_mm512_set1_epi64((long long)HEL_SUM_GOLD));
	__m512i ib = _mm512_add_epi64(ia, _mm512_set1_epi64((long long)(8 * HEL_SUM_GOLD)));
	__m512i sa = _mm512_setzero_si512(), sb = _mm512_setzero_si512();
	uint64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m512i a = _mm512_loadu_si512((const void *)(w + 8 * i));
		__m512i b = _mm512_loadu_si512((const void *)(w + 8 * i + 64));
		sa = _mm512_add_epi64(sa, vmix(_mm512_add_epi64(_mm512_xor_si512(a, r), ia), m));
		sb = _mm512_add_epi64(sb, vmix(_mm512_add_epi64(_mm512_xor_si512(b, r), ib), m));
		ia = _mm512_add_epi64(ia, step);
		ib = _mm512_add_epi64(ib, step);
	}
	/* Not _mm512_reduce_add_epi64: it adds as signed long long (UB on
	 * overflow); the lanes are summed unsigned here. */
	uint64_t lane[8], s = rec_scalar(w, i0, i, n, rsr);
	_mm512_storeu_si512((void *)lane, _mm512_add_epi64(sa, sb));
	for (int k = 0; k < 8; k++)
		s += lane[k];
	return s;
}

uint64_t hel_sum_rec_at(const uint8_t *w, uint64_t i0, uint64_t n, uint64_t rsr)
{
	/* Reads what libgcc's constructor found: no state of ours. */
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
		return rec_avx512(w, i0, n, rsr);
	return rec_scalar(w, i0, 0, n, rsr);
}
#else
uint64_t hel_sum_rec_at(const uint8_t *w, uint64_t i0, uint64_t n, uint64_t rsr)
{
	return rec_scalar(w, i0, 0, n, rsr);
}
#endif

uint64_t hel_sum_rec(const uint8_t *w, uint64_t W, uint64_t rsr)
{
	return hel_sum_rec_at(w, 0, W, rsr);
}

uint64_t hel_sum_rec_scalar(const uint8_t *w, uint64_t W, uint64_t rsr)
{
	return rec_scalar(w, 0, 0, W, rsr);
}
