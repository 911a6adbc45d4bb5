/*
 * test_key.c - PrefixKeys and histories (design 2.3).
 *
 * key_at(c) must equal the key computed from scratch for every prefix length
 * of a long random history, however the history was built (one append, many
 * small appends, truncate and regrow, copy); salts must separate everything.
 */
#include "testutil.h"

static uint8_t model_id[SEL_IDENTITY_BYTES];

static void check_against_direct(const sel_history *h, const sel_token *toks, uint64_t n,
				 const void *salt, size_t salt_len, uint64_t step)
{
	for (uint64_t c = 0; c <= n; c += step) {
		sel_key a, b;
		sel_history_key_at(h, c, &a);
		sel_key_direct(model_id, salt, salt_len, toks, c, &b);
		CHECKF(sel_key_eq(&a, &b), "key_at(%" PRIu64 ") differs from the direct key", c);
		CHECK(a.consumed == c);
	}
}

int main(void)
{
	test_rng r;
	test_rng_init(&r, test_seed());
	test_rng_fill(&r, model_id, sizeof model_id);

	enum {
		N = 10000
	};
	sel_token *toks = malloc(N * sizeof *toks);
	for (int i = 0; i < N; i++)
		toks[i] = (sel_token)test_rng_below(&r, 50000);

	/* One append; every c. */
	sel_history h;
	CHECK_OK(sel_history_init(&h, model_id, NULL, 0));
	CHECK_OK(sel_history_append(&h, toks, N));
	CHECK(sel_history_len(&h) == N);
	check_against_direct(&h, toks, N, NULL, 0, 1);

	/* Many random-size appends give the same boundaries and keys. */
	sel_history h2;
	CHECK_OK(sel_history_init(&h2, model_id, NULL, 0));
	for (uint64_t done = 0; done < N;) {
		uint64_t m = 1 + test_rng_below(&r, 200);
		if (m > N - done)
			m = N - done;
		CHECK_OK(sel_history_append(&h2, toks + done, m));
		done += m;
	}
	for (uint64_t k = 0; k <= N / SEL_BUCKET_TOKENS; k++)
		CHECK(memcmp(sel_history_bound(&h, k), sel_history_bound(&h2, k),
			     SEL_DIGEST_BYTES) == 0);
	check_against_direct(&h2, toks, N, NULL, 0, 7);

	/* Truncate and regrow with different tokens: keys follow the new tokens,
	 * keys below the cut are unchanged. */
	sel_key before;
	sel_history_key_at(&h2, 4000, &before);
	sel_history_truncate(&h2, 5000);
	sel_token *alt = malloc(N * sizeof *alt);
	memcpy(alt, toks, 5000 * sizeof *alt);
	for (int i = 5000; i < N; i++)
		alt[i] = toks[i] + 1;
	CHECK_OK(sel_history_append(&h2, alt + 5000, N - 5000));
	check_against_direct(&h2, alt, N, NULL, 0, 13);
	sel_key after;
	sel_history_key_at(&h2, 4000, &after);
	CHECK(sel_key_eq(&before, &after));
	sel_key ka, kb;
	sel_history_key_at(&h, 6000, &ka);
	sel_history_key_at(&h2, 6000, &kb);
	CHECK(!sel_key_eq(&ka, &kb));

	/* Copies are deep and equal. */
	sel_history hc;
	CHECK_OK(sel_history_copy(&hc, &h));
	sel_history_free(&h);
	check_against_direct(&hc, toks, N, NULL, 0, 11);
	sel_history_free(&hc);

	/* Salts: different salts (and salt vs none) differ at every c, buckets
	 * included; the same salt agrees with the direct definition. */
	const char *salts[] = {"tenant-a", "tenant-b"};
	sel_history hs[2], hn;
	CHECK_OK(sel_history_init(&hn, model_id, NULL, 0));
	CHECK_OK(sel_history_append(&hn, toks, N));
	for (int s = 0; s < 2; s++) {
		CHECK_OK(sel_history_init(&hs[s], model_id, salts[s], strlen(salts[s])));
		CHECK_OK(sel_history_append(&hs[s], toks, N));
		check_against_direct(&hs[s], toks, N, salts[s], strlen(salts[s]), 97);
	}
	for (uint64_t c = 0; c <= N; c++) {
		sel_key a, b, z;
		sel_history_key_at(&hs[0], c, &a);
		sel_history_key_at(&hs[1], c, &b);
		sel_history_key_at(&hn, c, &z);
		CHECKF(!sel_key_eq(&a, &b) && !sel_key_eq(&a, &z) && !sel_key_eq(&b, &z),
		       "salted keys collide at c=%" PRIu64, c);
	}
	for (uint64_t k = 0; k <= N / SEL_BUCKET_TOKENS; k++) {
		CHECK(memcmp(sel_history_bound(&hs[0], k), sel_history_bound(&hs[1], k),
			     SEL_DIGEST_BYTES));
		CHECK(memcmp(sel_history_bound(&hs[0], k), sel_history_bound(&hn, k),
			     SEL_DIGEST_BYTES));
	}

	/* Another model identity gives other keys for the same tokens. */
	uint8_t other[SEL_IDENTITY_BYTES];
	memcpy(other, model_id, sizeof other);
	other[0] ^= 1;
	sel_key k1, k2;
	sel_key_direct(model_id, NULL, 0, toks, 100, &k1);
	sel_key_direct(other, NULL, 0, toks, 100, &k2);
	CHECK(!sel_key_eq(&k1, &k2));

	/* Keys of different lengths never coincide, including at a boundary
	 * and one past it; the none key is recognised. */
	sel_key k64, k65;
	sel_history_key_at(&hn, 64, &k64);
	sel_history_key_at(&hn, 65, &k65);
	CHECK(memcmp(k64.digest.b, k65.digest.b, SEL_DIGEST_BYTES));
	CHECK(memcmp(k64.digest.b, sel_history_bound(&hn, 1)->b, SEL_DIGEST_BYTES));
	sel_key none = {0};
	CHECK(sel_key_is_none(&none) && !sel_key_is_none(&k64));

	/* Known answer for the encoding of docs/identity.md: model identity of
	 * zeros, no salt, tokens 0..99, key at 100. */
	uint8_t zero_id[SEL_IDENTITY_BYTES] = {0};
	sel_token seq[100];
	for (int i = 0; i < 100; i++)
		seq[i] = (sel_token)i;
	sel_key kat;
	char hex[33];
	sel_key_direct(zero_id, NULL, 0, seq, 100, &kat);
	CHECK(strcmp(sel_hex(kat.digest.b, 16, hex), "267a02852146e3b084d2ed6ff5f57c71") == 0);

	for (int s = 0; s < 2; s++)
		sel_history_free(&hs[s]);
	sel_history_free(&hn);
	sel_history_free(&h2);
	free(toks);
	free(alt);
	printf("ok\n");
	return 0;
}
