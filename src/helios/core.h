/*
 * core.h - the core file: what a model is, as far as Helios and the store
 * need to know (docs/core-format.md, design 2.1).
 *
 * A core names the synthetic model's dimensions and seed, its page planes
 * (one KV_PAGES allocation per plane per rank, indexed by physical page id)
 * and the regions of its state row (one STATE_ROWS allocation per rank,
 * indexed by state slot).  Parsing is pure code: hel_core_parse() takes
 * text, never touches a file, and is what the fuzzer calls.
 *
 * Conventions: calls return 0 or a negative errno / SEL_E* code (selene.h).
 * A parsed hel_core is immutable and may be shared between threads.
 */
#ifndef HEL_CORE_H
#define HEL_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "selene.h"

/* ---- Vocabulary ---------------------------------------------------------- */

/* Byte-level: tokens 0..255 are the bytes, then three specials.  A core's
 * vocab may be larger; the extra ids are reserved and never generated. */
typedef uint32_t hel_token;
#define HEL_TOK_BEGIN 256u   /* start of a conversation */
#define HEL_TOK_END 257u     /* end of a generated reply */
#define HEL_TOK_MESSAGE 258u /* boundary after every chat message */
#define HEL_VOCAB_MIN 259u
/* Vision cores (an [image] section): the id the model consumes at every
 * image-token position, with that position's image-token state added to
 * its embedding (hel_model_prefill_image).  Never generated. */
#define HEL_TOK_IMAGE 259u

/* ---- Limits (a core outside them is rejected) ----------------------------- */

#define HEL_NAME_MAX 63           /* core and plane names */
#define HEL_PAGE_TOKENS_MAX 4096u /* page_tokens: multiple of 64 up to this */
#define HEL_RANKS_MAX 64u
#define HEL_VOCAB_MAX 65536u
#define HEL_HIDDEN_MAX 4096u /* hidden: multiple of 8 */
#define HEL_LAYERS_MAX 64u
#define HEL_WEIGHTS_MAX (1u << 24) /* vocab x hidden */
#define HEL_CONTEXT_MAX (1u << 24) /* max_context */
#define HEL_PLANES_MAX 1024u       /* page planes (drafts: HEL_DRAFT_PLANES_MAX) */
#define HEL_DRAFT_PLANES_MAX 64u
#define HEL_TOKEN_BYTES_MAX (16u << 20) /* a plane's bytes per token per rank */
#define HEL_RECURRENT_MAX (16ull << 30) /* recurrent bytes per rank */
#define HEL_ROW_MAX (64ull << 30)       /* a row, per rank */
#define HEL_DRAFT_HISTORY_MAX 65536u    /* tokens */
#define HEL_PATCH_MAX 64u               /* [image] patch_size: pixels per side */
#define HEL_MERGE_MAX 4u                /* [image] merge: patches per token side */
#define HEL_IMAGE_TOKENS_MAX 16384u     /* [image] max_tokens */
#define HEL_PREPARED_MAX (256ull << 20) /* prepared pixel bytes of one image */

/* ---- The parsed core -------------------------------------------------- */

typedef enum hel_shard {
	HEL_SHARD_REPLICATED = 0, /* identical bytes on every rank */
	HEL_SHARD_SPLIT = 1,      /* each rank holds its own share */
} hel_shard;

typedef struct hel_core_plane {
	char name[HEL_NAME_MAX + 1];
	uint64_t token_bytes; /* per token per rank; multiple of 8 */
	hel_shard shard;
	bool draft; /* a draft plane: allocated only in speculative modes */
} hel_core_plane;

/* How a vision core resizes an image before patching (docs/inputs.md
 * "Preparation"). */
typedef enum hel_resize {
	HEL_RESIZE_FIT = 0,     /* keep the aspect ratio, grid within max_tokens */
	HEL_RESIZE_CROP = 1,    /* centre square crop, then the square grid */
	HEL_RESIZE_STRETCH = 2, /* the square grid, aspect ratio ignored */
} hel_resize;

/* The [image] section: the geometry image inputs are prepared to. */
typedef struct hel_core_image {
	uint32_t patch;      /* patch side in pixels */
	uint32_t merge;      /* patches per image-token side (1: a token per patch) */
	uint32_t max_tokens; /* image tokens of one image, at most */
	hel_resize resize;
	uint32_t channels; /* 1 gray, 3 RGB, 4 RGBA */
} hel_core_image;

/* "fit", "crop", "stretch"; hel_resize_parse: 0 or -EINVAL. */
const char *hel_resize_name(hel_resize r);
int hel_resize_parse(const char *s, hel_resize *out);

/* Read-only after hel_core_parse().  Plane arrays are in strcmp order of
 * names, whatever order the file used, so everything derived from a core
 * (the canonical form, the model's weights and bytes) ignores file order. */
typedef struct hel_core {
	char name[HEL_NAME_MAX + 1];
	uint32_t page_tokens; /* tokens per page: a multiple of 64 */
	uint32_t ranks;       /* tensor-parallel ranks in one process */
	uint32_t vocab;
	uint32_t hidden;        /* model width (lanes of the hidden vector) */
	uint32_t layers;        /* attention blocks per token */
	uint64_t seed;          /* every weight derives from it */
	uint64_t max_context;   /* tokens a sequence may consume */
	uint32_t modes;         /* bit (1u << sel_state_mode) per supported mode */
	hel_core_plane *planes; /* main page planes */
	uint32_t n_planes;
	hel_core_plane *drafts; /* draft page planes (speculative modes only) */
	uint32_t n_drafts;
	uint64_t recurrent_bytes; /* per rank; multiple of 8, may be 0 */
	hel_shard recurrent_shard;
	uint32_t draft_history;               /* tokens of history in the row (speculative) */
	uint8_t identity[SEL_IDENTITY_BYTES]; /* model identity */
	char *canonical;                      /* canonical text (itself a valid core) */
	size_t canonical_len;
	bool has_image;       /* a vision core: the [image] section */
	hel_core_image image; /* valid when has_image */
} hel_core;

/* Parse a core from text[0..len) (need not be NUL-terminated).  On failure
 * returns SEL_EFORMAT (or -ENOMEM) and writes one line to err naming the
 * file, the line and the field: "qwen.core:12: token_bytes: '12X' is not a
 * size (...)".  filename is used in messages only (NULL: "core").  *out is
 * NULL on failure. */
int hel_core_parse(const char *text, size_t len, const char *filename, hel_core **out, char *err,
		   size_t errlen);

/* Read path and parse it (messages name path).  Files over 1 MiB are
 * refused. */
int hel_core_load(const char *path, hel_core **out, char *err, size_t errlen);

/* The built-in core (cores/tiny.core, compiled in): flare run's default and
 * the tests'.  hel_core_builtin_text() returns its text. */
const char *hel_core_builtin_text(void);
int hel_core_builtin(hel_core **out);

/* NULL-safe. */
void hel_core_free(hel_core *c);

static inline bool hel_core_supports(const hel_core *c, sel_state_mode m)
{
	return (unsigned)m < 3 && (c->modes >> m & 1u);
}

/* Page-plane unit bytes: what sel_allocation.unit_bytes gets. */
static inline uint64_t hel_plane_unit_bytes(const hel_core *c, const hel_core_plane *p)
{
	return (uint64_t)c->page_tokens * p->token_bytes;
}

/* Bytes of one page record on one rank in a mode (drafts count only in
 * speculative modes). */
uint64_t hel_core_page_bytes(const hel_core *c, sel_state_mode mode);

/* ---- The row (design 2.1: "the recipe stores everything else") ---------- */

/* Byte offsets of the row's regions on one rank.  Every region is a
 * multiple of 8 bytes and they follow each other without padding, in this
 * order; the draft regions exist (non-zero size) only in speculative modes.
 *
 *   consumed       u64: tokens consumed by the sequence
 *   hidden         hidden x i32: the last hidden vector
 *   recurrent      recurrent_bytes: the recurrent state (word 0: previous
 *                  token; then the induction table; then mixing state)
 *   partial        the partial tail page of the main planes, plane-major
 *                  in plane order: page_tokens x token_bytes per plane
 *   draft_history  draft_history x u32: ring of recent tokens
 *   draft_hidden   hidden x i32: the draft head's hidden vector
 *   draft_partial  partial tail page of the draft planes, as above
 */
typedef struct hel_row_layout {
	uint64_t consumed;
	uint64_t hidden, hidden_bytes;
	uint64_t recurrent, recurrent_bytes;
	uint64_t partial, partial_bytes;
	uint64_t draft_history, draft_history_bytes;
	uint64_t draft_hidden, draft_hidden_bytes;
	uint64_t draft_partial, draft_partial_bytes;
	uint64_t bytes; /* the row's unit_bytes */
} hel_row_layout;

/* -EINVAL when the core does not support mode. */
int hel_core_row_layout(const hel_core *c, sel_state_mode mode, hel_row_layout *out);

/* Parse "ordinary", "copy" or "learned". */
int hel_state_mode_parse(const char *s, sel_state_mode *out);

#endif
