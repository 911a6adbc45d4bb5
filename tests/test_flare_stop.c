/*
 * test_flare_stop.c - stop sequences matched on generated text as it grows
 * (src/flare/stop.c): against a plain search of the whole text, for random
 * texts, random sequences and random token lengths (several bytes a token,
 * as real tokenizers have, and several tokens a step, as speculative
 * decoding will bring).
 *
 * What must hold, fed token by token the way server.c feeds it:
 *   1. the match is found with the token that completes the first
 *      occurrence of any sequence, and the text is cut at the earliest
 *      occurrence that token completes;
 *   2. the bytes not held back never include the start of that occurrence,
 *      so a stream never sends stop text;
 *   3. the hold-back is shorter than the longest sequence.
 */
#include "flare/stop.h"
#include "testutil.h"

static test_rng rng;

/* Where the first occurrence of any sequence in t[0..n) ends (0: none). */
static size_t naive_first_end(const struct flare_stop *st, const char *t, size_t n)
{
	for (size_t e = 1; e <= n; e++)
		for (uint32_t k = 0; k < st->n; k++) {
			size_t l = st->len[k];
			if (l <= e && !memcmp(t + e - l, st->s[k], l))
				return e;
		}
	return 0;
}

/* The earliest start among occurrences ending at or before end. */
static long naive_start(const struct flare_stop *st, const char *t, size_t end)
{
	long best = -1;
	for (size_t e = 1; e <= end; e++)
		for (uint32_t k = 0; k < st->n; k++) {
			size_t l = st->len[k];
			if (l <= e && !memcmp(t + e - l, st->s[k], l) &&
			    (best < 0 || (long)(e - l) < best))
				best = (long)(e - l);
		}
	return best;
}

static void test_examples(void)
{
	struct flare_stop st = {0};
	CHECK_OK(flare_stop_add(&st, ", w", 3));
	const char *t = "Hello, world!";
	size_t at = 0;
	/* Byte by byte: found at the 'w', cut at the comma. */
	for (size_t i = 1; i <= strlen(t); i++) {
		bool f = flare_stop_find(&st, t, i, i - 1, &at);
		CHECK(f == (i == 8));
		if (f)
			CHECK(at == 5);
		if (i == 6)
			CHECK(flare_stop_holdback(&st, t, i) == 1); /* "," */
		if (i == 7)
			CHECK(flare_stop_holdback(&st, t, i) == 2); /* ", " */
		if (i < 6)
			CHECK(flare_stop_holdback(&st, t, i) == 0);
	}
	/* The earliest start wins among sequences completed by one token. */
	struct flare_stop two = {0};
	CHECK_OK(flare_stop_add(&two, "lo, w", 5));
	CHECK_OK(flare_stop_add(&two, ", w", 3));
	CHECK(flare_stop_find(&two, t, 8, 0, &at) && at == 3);
	/* Bounds. */
	struct flare_stop full = {0};
	for (int i = 0; i < FLARE_STOP_MAX; i++)
		CHECK_OK(flare_stop_add(&full, "x", 1));
	CHECK_RC(flare_stop_add(&full, "x", 1), -EINVAL);
	struct flare_stop b = {0};
	CHECK_RC(flare_stop_add(&b, "", 0), -EINVAL);
	char big[FLARE_STOP_BYTES + 1];
	memset(big, 'a', sizeof big);
	CHECK_RC(flare_stop_add(&b, big, sizeof big), -EINVAL);
	CHECK_OK(flare_stop_add(&b, big, FLARE_STOP_BYTES));
	/* No sequences: nothing found, nothing held. */
	struct flare_stop none = {0};
	CHECK(!flare_stop_find(&none, t, 13, 0, &at) && flare_stop_holdback(&none, t, 13) == 0);
	/* Bytes that are not text (NUL) are bytes like any other. */
	struct flare_stop nul = {0};
	CHECK_OK(flare_stop_add(&nul, "a\0b", 3));
	CHECK(flare_stop_find(&nul, "xa\0bc", 5, 0, &at) && at == 1);
}

static void test_random(void)
{
	static const char al[] = "ab\n";
	for (int trial = 0; trial < 20000; trial++) {
		struct flare_stop st = {0};
		uint32_t ns = 1 + (uint32_t)test_rng_below(&rng, FLARE_STOP_MAX);
		size_t longest = 0;
		for (uint32_t k = 0; k < ns; k++) {
			char s[8];
			size_t l = 1 + test_rng_below(&rng, 5);
			for (size_t i = 0; i < l; i++)
				s[i] = al[test_rng_below(&rng, 3)];
			CHECK_OK(flare_stop_add(&st, s, l));
			longest = l > longest ? l : longest;
		}
		char t[64];
		size_t n = test_rng_below(&rng, sizeof t);
		for (size_t i = 0; i < n; i++)
			t[i] = al[test_rng_below(&rng, 3)];
		size_t first_end = naive_first_end(&st, t, n);
		/* The earliest start a stream could reach: none can start before
		 * first_end - longest. */
		long lowest = naive_start(&st, t, n);

		/* Feed in tokens of 1-3 bytes, steps of 1-3 tokens, each token
		 * checked on its own as server.c's on_tokens does. */
		size_t len = 0, sent = 0, before = 0;
		bool found = false;
		size_t at = 0;
		while (len < n && !found) {
			uint32_t step = 1 + (uint32_t)test_rng_below(&rng, 3);
			for (uint32_t s = 0; s < step && len < n && !found; s++) {
				before = len;
				len += 1 + test_rng_below(&rng, 3);
				if (len > n)
					len = n;
				found = flare_stop_find(&st, t, len, before, &at);
			}
			if (!found) {
				size_t hold = flare_stop_holdback(&st, t, len);
				CHECK(hold < longest && hold <= len);
				CHECK(len - hold >= sent); /* what was released stays released */
				sent = len - hold;
				/* 2: nothing released reaches into an occurrence to come. */
				if (lowest >= 0)
					CHECKF((long)sent <= lowest,
					       "trial %d: sent %zu of a stop at %ld", trial, sent,
					       lowest);
			}
		}
		/* 1: found with the token that completed the first occurrence, cut
		 * at the earliest occurrence that token completes. */
		CHECKF(found == (first_end > 0), "trial %d: found %d, first end %zu", trial, found,
		       first_end);
		if (found) {
			CHECK(first_end > before && first_end <= len);
			CHECKF((long)at == naive_start(&st, t, len), "trial %d: at %zu, want %ld",
			       trial, at, naive_start(&st, t, len));
			CHECK(sent <= at);
		}
	}
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	test_examples();
	test_random();
	printf("ok\n");
	return 0;
}
