/*
 * selene.h - the tiered prefix-cache store (libselene).
 *
 * Selene keeps immutable prefix checkpoints -- KV page chains plus one state
 * row -- that an inference engine publishes, moves them out of GPU memory into
 * host DRAM and local NVMe, and brings them back byte-exact when a later
 * request can resume from them (design: prefix-cache-offload.md).
 *
 * This header is the library's whole public surface.  Conventions:
 *   - Calls return 0 (or a non-negative count) on success and a negative
 *     errno, or one of the SEL_E* codes below, on failure.  sel_strerror()
 *     decodes both; sel_errmsg() returns the calling thread's detailed
 *     message for the last failure ("geometry: rank 1 has no KV_PAGES
 *     allocation").
 *   - A call that fails changes nothing and produces no event.
 *   - Objects are opaque; destructors accept NULL and half-built objects.
 */
#ifndef SELENE_H
#define SELENE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEL_VERSION_MAJOR 0
#define SEL_VERSION_MINOR 1

/* ---- Errors ------------------------------------------------------------ */

/* Our own codes live below -30800, far from any errno. */
enum {
	SEL_EBASE = -30800,
	SEL_ECORRUPT = -30800,   /* stored bytes failed verification */
	SEL_EIDENTITY = -30801,  /* record of another model or state mode */
	SEL_ELAYOUT = -30802,    /* record of another layout fingerprint */
	SEL_EGEOMETRY = -30803,  /* allocations do not form a valid geometry */
	SEL_ECUDA = -30804,      /* CUDA driver unavailable or failed */
	SEL_EOVERSIZE = -30805,  /* larger than the tier can ever hold */
	SEL_EFORMAT = -30806,    /* malformed header, name or text */
	SEL_ESTOPPED = -30807,   /* the store stopped after an unreportable failure */
	SEL_ELAST = -30808,
};

/* Static description of rc (negative errno or SEL_E*). */
const char *sel_strerror(int rc);
/* The calling thread's message for its last failed call ("" if none). */
const char *sel_errmsg(void);

/* ---- Digests, keys and histories (design 2.3) -------------------------- */

#define SEL_DIGEST_BYTES 16      /* prefix and bucket digests */
#define SEL_IDENTITY_BYTES 32    /* model identity, offload identity */
#define SEL_FINGERPRINT_BYTES 16 /* layout fingerprint */
#define SEL_BUCKET_TOKENS 64     /* lookup bucket granularity */

typedef uint32_t sel_token;

typedef struct sel_digest {
	uint8_t b[SEL_DIGEST_BYTES];
} sel_digest;

/* A PrefixKey: the exact token prefix of `consumed` tokens, named by a
 * BLAKE2b digest salted by the model identity (and an optional per-request
 * cache salt).  Equal keys mean equal prefixes, short of a BLAKE2b
 * collision.  The all-zero key (consumed 0, zero digest) means "none". */
typedef struct sel_key {
	uint64_t consumed;
	sel_digest digest;
} sel_key;

static inline bool sel_key_eq(const sel_key *a, const sel_key *b)
{
	if (a->consumed != b->consumed)
		return false;
	for (int i = 0; i < SEL_DIGEST_BYTES; i++)
		if (a->digest.b[i] != b->digest.b[i])
			return false;
	return true;
}
bool sel_key_is_none(const sel_key *k);

/* A request's token history with the chained digests of every aligned
 * 64-token boundary, so key_at(c) costs one hash of at most 64 tokens.
 * Build once per request; append as tokens are generated.  Single-threaded.
 * Embed it (the struct is public so schedulers can hold it by value) but
 * touch its fields only through the calls below. */
typedef struct sel_history {
	sel_digest root;       /* boundary digest at 0 (salted root) */
	sel_token *tokens;
	uint64_t n, cap;
	sel_digest *bounds;    /* bounds[k] = digest of boundary k*64, k <= n/64 */
	uint64_t nbounds_cap;
} sel_history;

/* Initialise an empty history.  salt may be NULL (salt_len 0): requests with
 * different salts never share any key, bucket or digest. */
int sel_history_init(sel_history *h, const uint8_t model_identity[SEL_IDENTITY_BYTES],
		     const void *salt, size_t salt_len);
int sel_history_append(sel_history *h, const sel_token *t, size_t n);
/* Shorten to n tokens (n <= length). */
void sel_history_truncate(sel_history *h, uint64_t n);
void sel_history_free(sel_history *h);
static inline uint64_t sel_history_len(const sel_history *h) { return h->n; }
/* Key of the first c tokens; c must be <= length. */
void sel_history_key_at(const sel_history *h, uint64_t c, sel_key *out);
/* Digest of aligned boundary k (token k*64); k must be <= length/64.  The
 * bucket digest of an endpoint c is the boundary digest at c/64. */
const sel_digest *sel_history_bound(const sel_history *h, uint64_t k);
/* Copy h into an empty dst (deep copy). */
int sel_history_copy(sel_history *dst, const sel_history *h);

/* Reference definition: the key of tokens[0..c) computed from scratch,
 * without a history.  Used by tests and tools. */
void sel_key_direct(const uint8_t model_identity[SEL_IDENTITY_BYTES], const void *salt,
		    size_t salt_len, const sel_token *tokens, uint64_t c, sel_key *out);

/* ---- Geometry, layout fingerprint, offload identity (design 2.1) ------- */

typedef enum sel_group {
	SEL_GROUP_OTHER = 0,  /* weights, activations: not checkpoint bytes */
	SEL_GROUP_STATE_ROWS, /* one row per state slot */
	SEL_GROUP_KV_PAGES,   /* one unit per physical page id */
} sel_group;

typedef enum sel_memkind {
	SEL_MEM_HOST = 0, /* ordinary host memory: the host transfer backend */
	SEL_MEM_DEVICE,   /* device memory of this rank: the CUDA backend */
	SEL_MEM_PEER,     /* belongs to another rank: excluded */
} sel_memkind;

/* One runtime-sized allocation as the engine made it. */
typedef struct sel_allocation {
	uint32_t rank;
	const char *name;
	sel_group group;
	sel_memkind kind;
	uint64_t address;    /* base; unit i is at address + i * unit_bytes */
	uint64_t unit_bytes; /* bytes per page (KV_PAGES) or per row (STATE_ROWS) */
	uint64_t count;      /* number of pages or rows */
} sel_allocation;

typedef struct sel_plane {
	char *name;
	sel_memkind kind;
	uint64_t address;
	uint64_t unit_bytes;
} sel_plane;

typedef struct sel_rank_geometry {
	sel_plane row;       /* the STATE_ROWS allocation */
	uint64_t row_count;
	sel_plane *pages;    /* KV_PAGES allocations, ordered by name (strcmp) */
	uint32_t n_planes;
	uint64_t page_count; /* smallest page count among the page planes */
	uint64_t page_bytes; /* sum of page plane unit bytes */
} sel_rank_geometry;

typedef struct sel_geometry {
	uint32_t ranks;
	uint32_t page_tokens;
	sel_rank_geometry *rank; /* [ranks] */
} sel_geometry;

/* Build the per-rank geometry from an engine's allocations: for each rank
 * exactly one STATE_ROWS and at least one KV_PAGES allocation that is not
 * PEER memory; PEER and OTHER allocations are ignored.  Plane names must be
 * unique within a rank and unit sizes non-zero.  page_tokens must be a
 * positive multiple of SEL_BUCKET_TOKENS.  On error returns SEL_EGEOMETRY
 * with a message naming the rank and allocation. */
int sel_geometry_build(const sel_allocation *allocs, size_t n, uint32_t ranks,
		       uint32_t page_tokens, sel_geometry **out);
void sel_geometry_free(sel_geometry *g);

/* 16-byte BLAKE2b over the rank count, the page tokens and each rank's
 * ordered page plane names and unit sizes and row plane name and unit size
 * (encoding: docs/identity.md).  Addresses and counts do not enter it, so it
 * is stable across load-time options. */
void sel_layout_fingerprint(const sel_geometry *g, uint8_t out[SEL_FINGERPRINT_BYTES]);

/* Continuation-state modes: records of one mode never load into another. */
typedef enum sel_state_mode {
	SEL_MODE_ORDINARY = 0,
	SEL_MODE_LEARNED = 1, /* learned speculation */
	SEL_MODE_COPY = 2,    /* copy speculation */
} sel_state_mode;

const char *sel_state_mode_name(sel_state_mode m);

/* 32-byte BLAKE2b with domain "flare-prefix-state-v1" over the model
 * identity and the state mode (docs/identity.md). */
void sel_offload_identity(const uint8_t model_identity[SEL_IDENTITY_BYTES], sel_state_mode mode,
			  uint8_t out[SEL_IDENTITY_BYTES]);

/* Lower-case hex of n bytes into out (2n + 1 bytes). */
char *sel_hex(const void *bytes, size_t n, char *out);

#ifdef __cplusplus
}
#endif
#endif
