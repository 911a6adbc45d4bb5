/*
 * input_key.h - identities of reusable CPU inputs (design 2.13): source
 * keys, semantic identities, and the image tokens a semantic identity puts
 * into the token prefix.  docs/identity.md is normative for every byte.
 *
 * A *source key* names an encoded input as the request sent it: its
 * encoding, its encoded bytes and the preparation settings it will be
 * prepared with.  A *semantic identity* names what the model's profile
 * consumes after decoding: the decoded representation in the profile's
 * channels (alpha composited or kept, CMYK converted), its size, and the
 * same settings (resize mode, patch geometry).  The same pixels sent as PNG,
 * 16-bit PNG or palette PNG have different source keys and one semantic
 * identity.  Both are BLAKE2b-256 in versioned domains, so a change of
 * preprocessing semantics (a new settings version) never reuses an old
 * record.
 *
 * The image's place in the prompt is a run of *image tokens* derived from
 * its semantic identity (sel_input_tokens), so prefix keys (design 2.3)
 * over a prompt with an image depend on the image exactly through its
 * semantic identity: the same image in the same place gives the same
 * checkpoint keys, whatever encoding carried it.
 *
 * Pure functions; thread-safe.
 */
#ifndef SEL_INPUT_KEY_H
#define SEL_INPUT_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "selene.h"

#define SEL_INPUT_KEY_BYTES 32

/* A source key or a semantic identity. */
typedef struct sel_input_key {
	uint8_t b[SEL_INPUT_KEY_BYTES];
} sel_input_key;

static inline bool sel_input_key_eq(const sel_input_key *a, const sel_input_key *b)
{
	for (int i = 0; i < SEL_INPUT_KEY_BYTES; i++)
		if (a->b[i] != b->b[i])
			return false;
	return true;
}

/* B32("flare-input-source-v1" || u32(len(encoding)) || encoding
 *     || u64(len) || bytes || u32(len(settings)) || settings)
 * encoding: the detected format ("png", "jpeg"); settings: the profile's
 * preparation settings text (Helios: hel_vision_settings). */
void sel_input_source_key(const char *encoding, const void *bytes, size_t len, const char *settings,
			  sel_input_key *out);

/* B32("flare-input-image-v1" || u32(len(settings)) || settings
 *     || u32(width) || u32(height) || u32(channels) || pixels)
 * pixels: height rows of width x channels bytes, the representation the
 * profile consumes.  Streaming form for large images: init, update with
 * the pixels in order (any split), final. */
void sel_input_image_identity(const char *settings, uint32_t width, uint32_t height,
			      uint32_t channels, const uint8_t *pixels, sel_input_key *out);

typedef struct sel_input_id_state {
	uint8_t opaque[512] __attribute__((aligned(64))); /* crypto_generichash_blake2b_state */
} sel_input_id_state;
void sel_input_image_identity_init(sel_input_id_state *st, const char *settings, uint32_t width,
				   uint32_t height, uint32_t channels);
void sel_input_image_identity_update(sel_input_id_state *st, const uint8_t *pixels, size_t n);
void sel_input_image_identity_final(sel_input_id_state *st, sel_input_key *out);

/* Image tokens have the top bit set: never a vocabulary id (vocabularies
 * are at most 65536), never equal to a text token in a prefix key. */
#define SEL_INPUT_TOKEN_BIT 0x80000000u
static inline bool sel_token_is_input(sel_token t) { return (t & SEL_INPUT_TOKEN_BIT) != 0; }

/* The n image tokens of an image with semantic identity id:
 *   block(j) = B32("flare-input-tokens-v1" || id || u32(j))
 *   token(k) = 0x80000000 | (u32le(block(k / 8), bytes 4 (k mod 8) ..) & 0x7fffffff)
 * Tokens 0..7 alone carry 248 bits of the identity. */
void sel_input_tokens(const sel_input_key *id, uint32_t n, sel_token *out);

/* Lower-case hex of a key into out (65 bytes). */
char *sel_input_key_hex(const sel_input_key *k, char out[2 * SEL_INPUT_KEY_BYTES + 1]);

#endif
