/*
 * test_xxh.c - eos/xxh.h: the dispatched XXH3 entry points give the plain
 * library's hashes bit for bit (one-shot, seeded, and streamed in pieces
 * of every alignment), for lengths 0 to 5000 across the short, mid-size
 * and long paths and every stripe and block boundary in between.
 */
#include <xxhash.h>

/* The plain entry points, taken before xxh.h renames them. */
static XXH64_hash_t (*const plain_64)(const void *, size_t) = XXH3_64bits;
static XXH64_hash_t (*const plain_seed)(const void *, size_t, XXH64_hash_t) = XXH3_64bits_withSeed;
static XXH_errorcode (*const plain_update)(XXH3_state_t *, const void *,
					   size_t) = XXH3_64bits_update;

#include "testutil.h"
#include "xxh.h"

#define MAXLEN 5000

/* Streamed in pieces of at most step bytes, with update (dispatched or not). */
static XXH64_hash_t streamed(const uint8_t *p, size_t n, XXH64_hash_t seed, size_t step,
			     bool dispatched)
{
	XXH3_state_t *st = XXH3_createState();
	CHECK(st);
	CHECK(XXH3_64bits_reset_withSeed(st, seed) == XXH_OK);
	for (size_t o = 0; o < n;) {
		size_t k = n - o < step ? n - o : step;
		CHECK((dispatched ? XXH3_64bits_update(st, p + o, k)
				  : plain_update(st, p + o, k)) == XXH_OK);
		o += k;
	}
	XXH64_hash_t h = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return h;
}

int main(void)
{
	test_rng rng;
	test_rng_init(&rng, test_seed());
	static uint8_t buf[MAXLEN + 64];
	for (size_t i = 0; i < sizeof buf; i++)
		buf[i] = (uint8_t)test_rng_next(&rng);
#ifdef EOS_XXH_DISPATCH
	printf("dispatched entry points\n");
#else
	printf("plain entry points only (no xxh_x86dispatch.h here)\n");
#endif
	for (size_t n = 0; n <= MAXLEN; n++) {
		const uint8_t *p = buf + (n % 61);
		XXH64_hash_t seed = test_rng_next(&rng);
		CHECKF(XXH3_64bits(p, n) == plain_64(p, n), "length %zu", n);
		CHECKF(XXH3_64bits_withSeed(p, n, seed) == plain_seed(p, n, seed), "length %zu", n);
		CHECKF(XXH3_64bits_withSeed(p, n, 0) == plain_64(p, n), "length %zu, seed 0", n);
		if (n % 97 == 0 || n == MAXLEN) {
			size_t step = 1 + (size_t)test_rng_below(&rng, 700);
			XXH64_hash_t want = plain_seed(p, n, seed);
			CHECKF(streamed(p, n, seed, step, true) == want, "length %zu in %zu", n,
			       step);
			CHECKF(streamed(p, n, seed, step, false) == want, "length %zu in %zu", n,
			       step);
		}
	}
	printf("ok\n");
	return 0;
}
