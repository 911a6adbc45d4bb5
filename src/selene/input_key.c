/*
 * input_key.c - source keys, semantic identities and image tokens of CPU
 * inputs (design 2.13 "Source-description records map an encoded input key
 * to its semantic identity"; docs/identity.md "CPU inputs").
 *
 * DESIGN
 *   Every identity is unkeyed BLAKE2b-256 over a domain string that names
 *   its version, then length-prefixed fields, as the prefix keys of key.c
 *   are: a crafted collision would let one image's prepared tensors stand
 *   in for another's, so the hash is cryptographic.  Selene interprets none
 *   of the fields: the encoding name and the preparation settings are text
 *   the engine supplies (Helios: the image format and hel_vision_settings),
 *   the pixels are bytes in the representation the engine's profile
 *   consumes.  A new preprocessing semantics changes the settings text (its
 *   version word) or the domain, and with them every identity, so old
 *   records are never reused for it.
 *   Image tokens are expanded from the semantic identity by BLAKE2b in a
 *   third domain; their top bit keeps them apart from every vocabulary id,
 *   so a prompt with an image can never have the prefix key of a text
 *   prompt.
 *
 * INVARIANTS
 *   1. Equal inputs give equal outputs on every host (little-endian
 *      encodings throughout).
 *   2. Every image token has SEL_INPUT_TOKEN_BIT set.
 */
#include <string.h>

#include <sodium.h>

#include "input_key.h"
#include "internal.h"

#define SOURCE_DOMAIN "flare-input-source-v1"
#define IMAGE_DOMAIN "flare-input-image-v1"
#define TOKENS_DOMAIN "flare-input-tokens-v1"

_Static_assert(sizeof(sel_input_id_state) >= sizeof(crypto_generichash_blake2b_state),
	       "sel_input_id_state holds a BLAKE2b state");

static void put_u32(crypto_generichash_blake2b_state *st, uint32_t v)
{
	uint8_t b[4];
	sel_put_u32(b, v);
	crypto_generichash_blake2b_update(st, b, sizeof b);
}

static void put_str(crypto_generichash_blake2b_state *st, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	put_u32(st, (uint32_t)n);
	if (n)
		crypto_generichash_blake2b_update(st, (const unsigned char *)s, n);
}

static void begin(crypto_generichash_blake2b_state *st, const char *domain)
{
	sel_crypto_init();
	crypto_generichash_blake2b_init(st, NULL, 0, SEL_INPUT_KEY_BYTES);
	crypto_generichash_blake2b_update(st, (const unsigned char *)domain, strlen(domain));
}

void sel_input_source_key(const char *encoding, const void *bytes, size_t len, const char *settings,
			  sel_input_key *out)
{
	crypto_generichash_blake2b_state st;
	uint8_t n[8];
	begin(&st, SOURCE_DOMAIN);
	put_str(&st, encoding);
	sel_put_u64(n, len);
	crypto_generichash_blake2b_update(&st, n, sizeof n);
	if (len)
		crypto_generichash_blake2b_update(&st, bytes, len);
	put_str(&st, settings);
	crypto_generichash_blake2b_final(&st, out->b, SEL_INPUT_KEY_BYTES);
}

void sel_input_image_identity_init(sel_input_id_state *s, const char *settings, uint32_t width,
				   uint32_t height, uint32_t channels)
{
	crypto_generichash_blake2b_state *st = (crypto_generichash_blake2b_state *)s->opaque;
	begin(st, IMAGE_DOMAIN);
	put_str(st, settings);
	put_u32(st, width);
	put_u32(st, height);
	put_u32(st, channels);
}

void sel_input_image_identity_update(sel_input_id_state *s, const uint8_t *pixels, size_t n)
{
	if (n)
		crypto_generichash_blake2b_update((crypto_generichash_blake2b_state *)s->opaque,
						  pixels, n);
}

void sel_input_image_identity_final(sel_input_id_state *s, sel_input_key *out)
{
	crypto_generichash_blake2b_final((crypto_generichash_blake2b_state *)s->opaque, out->b,
					 SEL_INPUT_KEY_BYTES);
}

void sel_input_image_identity(const char *settings, uint32_t width, uint32_t height,
			      uint32_t channels, const uint8_t *pixels, sel_input_key *out)
{
	sel_input_id_state st;
	sel_input_image_identity_init(&st, settings, width, height, channels);
	sel_input_image_identity_update(&st, pixels, (size_t)width * height * channels);
	sel_input_image_identity_final(&st, out);
}

void sel_input_tokens(const sel_input_key *id, uint32_t n, sel_token *out)
{
	uint8_t block[SEL_INPUT_KEY_BYTES];
	for (uint32_t k = 0; k < n; k++) {
		if (k % 8 == 0) {
			crypto_generichash_blake2b_state st;
			begin(&st, TOKENS_DOMAIN);
			crypto_generichash_blake2b_update(&st, id->b, SEL_INPUT_KEY_BYTES);
			put_u32(&st, k / 8);
			crypto_generichash_blake2b_final(&st, block, sizeof block);
		}
		out[k] = SEL_INPUT_TOKEN_BIT |
			 (sel_get_u32(block + 4 * (size_t)(k % 8)) & 0x7fffffffu);
	}
}

char *sel_input_key_hex(const sel_input_key *k, char out[2 * SEL_INPUT_KEY_BYTES + 1])
{
	return sel_hex(k->b, SEL_INPUT_KEY_BYTES, out);
}
