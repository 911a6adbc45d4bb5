/*
 * key.c - PrefixKeys, request histories and bucket digests (design 2.3).
 *
 * A PrefixKey names an exact token prefix by its length and a 16-byte
 * BLAKE2b digest.  The digests are chained through aligned 64-token
 * boundaries so that a history can produce the key of any prefix length c by
 * hashing at most 64 tokens, and so that lookup can probe one bucket per
 * boundary (the bucket digest of an endpoint is its boundary digest).
 *
 * DESIGN
 *   root   = B16("flare-prefix-root-v1" || model identity (32) ||
 *                u64le salt length || salt)
 *   bound0 = root
 *   boundK+1 = B16(0x01 || boundK || tokens[64K, 64K+64) as u32le)
 *   key(c) = B16(0x02 || bound(c/64) || u64le c || tokens[64(c/64), c) as u32le)
 * where B16 is unkeyed BLAKE2b with a 16-byte output (docs/identity.md).
 * The leading 0x01 / 0x02 separate boundary digests from key digests, so a
 * key digest can never equal a boundary digest of another prefix by
 * construction.  BLAKE2b (not a fast non-cryptographic hash) because a
 * crafted collision would make one prompt restore another's state.
 *
 * INVARIANTS
 *   1. bounds[k] is defined for k <= n / 64 and depends only on root and
 *      tokens[0, 64k).
 *   2. key_at(c) == sel_key_direct(c) for every c <= n.
 *   3. Different salts give different roots, hence different keys and
 *      buckets everywhere (short of a BLAKE2b collision).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "eos.h"
#include "internal.h"
#include "selene.h"

#define ROOT_DOMAIN "flare-prefix-root-v1"


/* Hash n tokens as little-endian u32 into the running state. */
static void hash_tokens(crypto_generichash_blake2b_state *st, const sel_token *t, uint64_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	crypto_generichash_blake2b_update(st, (const unsigned char *)t, n * sizeof(sel_token));
#else
	uint8_t buf[256];
	while (n) {
		uint64_t m = n < 64 ? n : 64;
		for (uint64_t i = 0; i < m; i++)
			for (int b = 0; b < 4; b++)
				buf[4 * i + b] = (uint8_t)(t[i] >> (8 * b));
		crypto_generichash_blake2b_update(st, buf, m * 4);
		t += m;
		n -= m;
	}
#endif
}

static void make_root(const uint8_t id[SEL_IDENTITY_BYTES], const void *salt, size_t salt_len,
		      sel_digest *out)
{
	crypto_generichash_blake2b_state st;
	uint8_t len[8];
	sel_crypto_init();
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_DIGEST_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)ROOT_DOMAIN,
					  sizeof ROOT_DOMAIN - 1);
	crypto_generichash_blake2b_update(&st, id, SEL_IDENTITY_BYTES);
	sel_put_u64(len, salt_len);
	crypto_generichash_blake2b_update(&st, len, sizeof len);
	if (salt_len)
		crypto_generichash_blake2b_update(&st, salt, salt_len);
	crypto_generichash_blake2b_final(&st, out->b, SEL_DIGEST_BYTES);
}

static void next_bound(const sel_digest *prev, const sel_token *block, sel_digest *out)
{
	crypto_generichash_blake2b_state st;
	const uint8_t tag = 0x01;
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_DIGEST_BYTES);
	crypto_generichash_blake2b_update(&st, &tag, 1);
	crypto_generichash_blake2b_update(&st, prev->b, SEL_DIGEST_BYTES);
	hash_tokens(&st, block, SEL_BUCKET_TOKENS);
	crypto_generichash_blake2b_final(&st, out->b, SEL_DIGEST_BYTES);
}

static void key_from(const sel_digest *bound, const sel_token *rest, uint64_t c, sel_key *out)
{
	crypto_generichash_blake2b_state st;
	const uint8_t tag = 0x02;
	uint8_t cb[8];
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_DIGEST_BYTES);
	crypto_generichash_blake2b_update(&st, &tag, 1);
	crypto_generichash_blake2b_update(&st, bound->b, SEL_DIGEST_BYTES);
	sel_put_u64(cb, c);
	crypto_generichash_blake2b_update(&st, cb, sizeof cb);
	hash_tokens(&st, rest, c % SEL_BUCKET_TOKENS);
	crypto_generichash_blake2b_final(&st, out->digest.b, SEL_DIGEST_BYTES);
	out->consumed = c;
}

void sel_chain_digest_add(sel_digest *acc, const sel_key *k, uint32_t pages)
{
	static const char domain[] = "flare-chain-v1";
	crypto_generichash_blake2b_state st;
	uint8_t b[12];
	sel_crypto_init();
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_DIGEST_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)domain, sizeof domain - 1);
	crypto_generichash_blake2b_update(&st, acc->b, SEL_DIGEST_BYTES);
	sel_put_u64(b, k->consumed);
	sel_put_u32(b + 8, pages);
	crypto_generichash_blake2b_update(&st, b, sizeof b);
	crypto_generichash_blake2b_update(&st, k->digest.b, SEL_DIGEST_BYTES);
	crypto_generichash_blake2b_final(&st, acc->b, SEL_DIGEST_BYTES);
}

bool sel_key_is_none(const sel_key *k)
{
	if (k->consumed)
		return false;
	for (int i = 0; i < SEL_DIGEST_BYTES; i++)
		if (k->digest.b[i])
			return false;
	return true;
}

int sel_history_init(sel_history *h, const uint8_t model_identity[SEL_IDENTITY_BYTES],
		     const void *salt, size_t salt_len)
{
	memset(h, 0, sizeof *h);
	if (salt_len && !salt)
		return eos_fail(-EINVAL, "history: salt of %zu bytes with no data", salt_len);
	make_root(model_identity, salt, salt_len, &h->root);
	h->nbounds_cap = 16;
	h->bounds = malloc(h->nbounds_cap * sizeof *h->bounds);
	if (!h->bounds)
		return eos_fail(-ENOMEM, "history: out of memory");
	h->bounds[0] = h->root;
	return 0;
}

int sel_history_append(sel_history *h, const sel_token *t, size_t n)
{
	if (!n)
		return 0;
	if (h->n + n > h->cap) {
		uint64_t cap = h->cap ? h->cap : 256;
		while (cap < h->n + n)
			cap *= 2;
		sel_token *nt = realloc(h->tokens, cap * sizeof *nt);
		if (!nt)
			return eos_fail(-ENOMEM, "history: out of memory for %llu tokens",
					(unsigned long long)cap);
		h->tokens = nt;
		h->cap = cap;
	}
	uint64_t want = (h->n + n) / SEL_BUCKET_TOKENS + 1;
	if (want > h->nbounds_cap) {
		uint64_t cap = h->nbounds_cap;
		while (cap < want)
			cap *= 2;
		sel_digest *nb = realloc(h->bounds, cap * sizeof *nb);
		if (!nb)
			return eos_fail(-ENOMEM, "history: out of memory for %llu boundaries",
					(unsigned long long)cap);
		h->bounds = nb;
		h->nbounds_cap = cap;
	}
	memcpy(h->tokens + h->n, t, n * sizeof *t);
	uint64_t old = h->n / SEL_BUCKET_TOKENS;
	h->n += n;
	for (uint64_t k = old; k < h->n / SEL_BUCKET_TOKENS; k++)
		next_bound(&h->bounds[k], h->tokens + k * SEL_BUCKET_TOKENS, &h->bounds[k + 1]);
	return 0;
}

void sel_history_truncate(sel_history *h, uint64_t n)
{
	if (n < h->n)
		h->n = n; /* bounds above n/64 are simply no longer used */
}

void sel_history_free(sel_history *h)
{
	if (!h)
		return;
	free(h->tokens);
	free(h->bounds);
	memset(h, 0, sizeof *h);
}

void sel_history_key_at(const sel_history *h, uint64_t c, sel_key *out)
{
	uint64_t k = c / SEL_BUCKET_TOKENS;
	key_from(&h->bounds[k], h->tokens + k * SEL_BUCKET_TOKENS, c, out);
}

const sel_digest *sel_history_bound(const sel_history *h, uint64_t k) { return &h->bounds[k]; }

int sel_history_copy(sel_history *dst, const sel_history *h)
{
	memset(dst, 0, sizeof *dst);
	dst->root = h->root;
	dst->nbounds_cap = h->n / SEL_BUCKET_TOKENS + 1;
	dst->bounds = malloc(dst->nbounds_cap * sizeof *dst->bounds);
	if (!dst->bounds)
		return eos_fail(-ENOMEM, "history: out of memory");
	memcpy(dst->bounds, h->bounds, dst->nbounds_cap * sizeof *dst->bounds);
	if (h->n) {
		dst->tokens = malloc(h->n * sizeof *dst->tokens);
		if (!dst->tokens) {
			sel_history_free(dst);
			return eos_fail(-ENOMEM, "history: out of memory");
		}
		memcpy(dst->tokens, h->tokens, h->n * sizeof *dst->tokens);
	}
	dst->n = dst->cap = h->n;
	return 0;
}

void sel_key_direct(const uint8_t model_identity[SEL_IDENTITY_BYTES], const void *salt,
		    size_t salt_len, const sel_token *tokens, uint64_t c, sel_key *out)
{
	sel_digest b;
	make_root(model_identity, salt, salt_len, &b);
	uint64_t k = 0;
	for (; k < c / SEL_BUCKET_TOKENS; k++)
		next_bound(&b, tokens + k * SEL_BUCKET_TOKENS, &b);
	key_from(&b, tokens + k * SEL_BUCKET_TOKENS, c, out);
}

char *sel_hex(const void *bytes, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	const uint8_t *p = bytes;
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[p[i] >> 4];
		out[2 * i + 1] = digits[p[i] & 15];
	}
	out[2 * n] = 0;
	return out;
}

void sel_key_from_bound(const sel_digest *bound, const sel_token *rest, uint64_t c, sel_key *out)
{
	key_from(bound, rest, c, out);
}
