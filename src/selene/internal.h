/*
 * internal.h - small helpers shared by libselene's modules.
 */
#ifndef SEL_INTERNAL_H
#define SEL_INTERNAL_H

#include <stdint.h>

#include "selene.h"

/* Initialise libsodium once (thread-safe); picks its fast BLAKE2b. */
void sel_crypto_init(void);

/* The chain digest of a restore (sel_hit.chain): start from an all-zero
 * digest and add, ancestor first, every node of the chain above the
 * resident count that supplies pages (with the pages it supplies) and the
 * endpoint:  acc = B16("flare-chain-v1" || acc || u64le consumed ||
 * u32le pages || key digest).  Lookup computes it over the nodes it
 * checked against the request's history; every fetch path recomputes it
 * over the nodes it is about to read and refuses a difference, so a
 * restore reads exactly the chain that was verified. */
void sel_chain_digest_add(sel_digest *acc, const sel_key *k, uint32_t pages);

/* key.c: the key of the first c tokens from the boundary digest at c / 64
 * and the c % 64 tokens after that boundary -- sel_history_key_at for a
 * caller that holds only that part of a history (the remote lookup, which
 * runs off the worker thread on a copy of the new tokens). */
struct sel_digest;
struct sel_key;
void sel_key_from_bound(const struct sel_digest *bound, const uint32_t *rest, uint64_t c,
			struct sel_key *out);

/* ceil(n / d) for d > 0. */
static inline uint32_t sel_div_up(uint32_t n, uint32_t d) { return n / d + (n % d != 0); }

/* Little-endian field access for on-disk and hashed encodings. */
static inline void sel_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static inline void sel_put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline void sel_put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t sel_get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t sel_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t sel_get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

#endif
