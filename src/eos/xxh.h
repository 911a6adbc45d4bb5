/*
 * xxh.h - libxxhash, with its x86 runtime dispatch where Debian ships it.
 *
 * Debian's libxxhash is built for baseline x86-64 (SSE2), but the same
 * library exports the *_dispatch entry points, which pick the AVX2 or
 * AVX-512 kernels by CPUID at the first call.  Here XXH3_64bits,
 * XXH3_64bits_withSeed and XXH3_64bits_update name wrappers that call
 * them.  The hashes are the same bit for bit (xxHash's kernels agree by
 * construction); only the speed differs: 1.7-7x for the 0.5-4 KiB token
 * chunks and page records we hash (docs/performance.md, "XXH3 dispatch").
 *
 * The library's AVX kernels return with the upper halves of the vector
 * registers dirty (no vzeroupper), and every later SSE instruction of the
 * caller then pays a transition penalty: the reference model, which
 * hashes a token's chunk between SSE loops, ran 35-40% slower (bench/model
 * prefill 296k -> 182k tok/s) until each wrapper cleared them after the
 * call, on CPUs with AVX (without, the dispatch chose SSE2 and there is
 * nothing to clear).  Elsewhere (another architecture, or a library without
 * the header) the plain entry points are used.  Include this instead of
 * <xxhash.h>.
 */
#ifndef EOS_XXH_H
#define EOS_XXH_H

#include <xxhash.h>

#if defined(__x86_64__) && defined(__has_include)
#if __has_include(<xxh_x86dispatch.h>)
#define XXH_DISPATCH_DISABLE_REPLACE 1
#include <immintrin.h>
#include <xxh_x86dispatch.h>
#define EOS_XXH_DISPATCH 1

__attribute__((target("avx"))) static inline void eos_xxh_clear_upper(void) { _mm256_zeroupper(); }

static inline void eos_xxh_after(void)
{
	if (__builtin_cpu_supports("avx"))
		eos_xxh_clear_upper();
}

static inline XXH64_hash_t eos_xxh3_64(const void *p, size_t n)
{
	XXH64_hash_t h = XXH3_64bits_dispatch(p, n);
	eos_xxh_after();
	return h;
}

static inline XXH64_hash_t eos_xxh3_64_seed(const void *p, size_t n, XXH64_hash_t seed)
{
	XXH64_hash_t h = XXH3_64bits_withSeed_dispatch(p, n, seed);
	eos_xxh_after();
	return h;
}

static inline XXH_errorcode eos_xxh3_64_update(XXH3_state_t *st, const void *p, size_t n)
{
	XXH_errorcode rc = XXH3_64bits_update_dispatch(st, p, n);
	eos_xxh_after();
	return rc;
}

#undef XXH3_64bits
#define XXH3_64bits eos_xxh3_64
#undef XXH3_64bits_withSeed
#define XXH3_64bits_withSeed eos_xxh3_64_seed
#undef XXH3_64bits_update
#define XXH3_64bits_update eos_xxh3_64_update
#endif
#endif

#endif /* EOS_XXH_H */
