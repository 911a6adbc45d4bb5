/*
 * vision.c - preparation of images for a vision core: the consumed
 * representation, the semantic identity, the token grid, deterministic
 * resizing and patching into prepared tensors (design 2.13; docs/inputs.md
 * "Preparation").
 *
 * DESIGN
 *   The core's [image] section is the whole profile: patch size, merge,
 *   the token bound, the resize mode and the channels the model consumes.
 *   hel_vision_settings renders it as one versioned line that every
 *   identity hashes, so two cores that prepare alike share records and any
 *   difference separates them.
 *   Channel conversion, resizing and patching are integer code with the
 *   rounding written down (docs/inputs.md), so a prepared tensor is a pure
 *   function of the consumed pixels and the settings -- which is what lets
 *   the semantic identity stand for it in memory, on disk and in the
 *   prompt's tokens.
 *     convert   alpha over white: (c a + 255 (255 - a) + 127) / 255;
 *               gray from RGB: (77 R + 150 G + 29 B + 128) >> 8;
 *               CMYK ink to RGB: ((255 - C)(255 - K) + 127) / 255, ...
 *     resize    exact area averaging: destination pixel i of m covers
 *               [i n, (i + 1) n) where source pixel j of n covers
 *               [j m, (j + 1) m); the weights are the integer overlaps,
 *               separable (rows, then columns), one division per output
 *               sample, rounded half up.  It serves up- and down-scaling
 *               alike and never reads outside the (cropped) source.
 *     patch     token t = (y / U) gw + (x / U) with U = patch x merge;
 *               inside a token its merge x merge patches in raster order,
 *               inside a patch its pixels in raster order, channels
 *               interleaved.
 *   Memory: the resizer keeps one horizontally filtered source row and one
 *   accumulator row and writes straight into the record's pixel tensor, so
 *   preparing an image costs the record plus O(width) scratch.
 *
 * INVARIANTS
 *   1. A prepared record has exactly the tensors "pixels" (u8, [gh gw, U^2
 *      channels]) and "grid" (u32, [2] = {gh, gw}), 1 <= gh gw <=
 *      max_tokens, and hel_vision_check accepts it.
 *   2. Equal consumed images and cores give byte-identical records (the
 *      creation time aside).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "vision.h"

#define SETTINGS_VERSION "flare-image-prep-v1"

int hel_vision_settings(const hel_core *c, char out[HEL_VISION_SETTINGS_MAX])
{
	if (!c->has_image) {
		out[0] = 0;
		return eos_fail(-EINVAL, "core '%s' has no [image] section: it takes no images",
				c->name);
	}
	const hel_core_image *g = &c->image;
	snprintf(out, HEL_VISION_SETTINGS_MAX,
		 SETTINGS_VERSION " patch=%u merge=%u max_tokens=%u resize=%s channels=%u",
		 g->patch, g->merge, g->max_tokens, hel_resize_name(g->resize), g->channels);
	return 0;
}

static uint32_t isqrt32(uint32_t v)
{
	uint32_t r = 0;
	while ((r + 1) * (r + 1) <= v)
		r++;
	return r;
}

void hel_vision_grid(const hel_core_image *g, uint32_t w, uint32_t h, uint32_t *gh_out,
		     uint32_t *gw_out)
{
	uint32_t T = g->max_tokens;
	if (g->resize != HEL_RESIZE_FIT) {
		uint32_t s = isqrt32(T);
		*gh_out = *gw_out = s ? s : 1;
		return;
	}
	uint64_t U = (uint64_t)g->patch * g->merge;
	uint64_t gh = (h + U / 2) / U, gw = (w + U / 2) / U;
	if (gh < 1)
		gh = 1;
	if (gw < 1)
		gw = 1;
	if (gh * gw > T) {
		/* The widest grid that keeps the aspect ratio (rows rounded from
		 * the columns) and holds at most T tokens. */
		uint64_t c = gw < T ? gw : T;
		for (; c >= 1; c--) {
			uint64_t r = (2 * c * h + w) / (2 * (uint64_t)w);
			if (r < 1)
				r = 1;
			if (r > T)
				r = T;
			if (r * c <= T) {
				gh = r;
				gw = c;
				break;
			}
		}
	}
	*gh_out = (uint32_t)gh;
	*gw_out = (uint32_t)gw;
}

/* ---- Conversion ---------------------------------------------------------- */

static inline uint8_t over_white(uint32_t c, uint32_t a)
{
	return (uint8_t)((c * a + 255 * (255 - a) + 127) / 255);
}

static inline uint8_t luma(uint32_t r, uint32_t g, uint32_t b)
{
	return (uint8_t)((77 * r + 150 * g + 29 * b + 128) >> 8);
}

/* Pixel p of src as RGBA (alpha 255 when src has none). */
static inline void rgba_at(const hel_image *src, size_t p, uint8_t o[4])
{
	const uint8_t *s = src->pixels + p * src->channels;
	switch (src->color) {
	case HEL_COLOR_GRAY:
		o[0] = o[1] = o[2] = s[0];
		o[3] = 255;
		break;
	case HEL_COLOR_GRAY_ALPHA:
		o[0] = o[1] = o[2] = s[0];
		o[3] = s[1];
		break;
	case HEL_COLOR_RGB:
		o[0] = s[0];
		o[1] = s[1];
		o[2] = s[2];
		o[3] = 255;
		break;
	case HEL_COLOR_RGBA: memcpy(o, s, 4); break;
	case HEL_COLOR_CMYK:
		for (int k = 0; k < 3; k++)
			o[k] = (uint8_t)(((255u - s[k]) * (255u - s[3]) + 127) / 255);
		o[3] = 255;
		break;
	}
}

int hel_vision_convert(const hel_core *c, const hel_image *src, hel_image *out)
{
	memset(out, 0, sizeof *out);
	if (!c->has_image)
		return eos_fail(-EINVAL, "core '%s' has no [image] section: it takes no images",
				c->name);
	if (!src->pixels || src->channels != hel_image_color_channels(src->color) ||
	    src->bytes != (size_t)src->width * src->height * src->channels)
		return eos_fail(-EINVAL, "vision: not a decoded image");
	uint32_t ch = c->image.channels;
	size_t n = (size_t)src->width * src->height;
	uint8_t *px = malloc(n * ch);
	if (!px)
		return eos_fail(-ENOMEM, "vision: out of memory for %zu pixels", n);
	bool gray_src = src->color == HEL_COLOR_GRAY || src->color == HEL_COLOR_GRAY_ALPHA;
	for (size_t p = 0; p < n; p++) {
		uint8_t v[4];
		rgba_at(src, p, v);
		uint8_t *d = px + p * ch;
		if (ch == 4) {
			memcpy(d, v, 4);
		} else if (ch == 3) {
			for (int k = 0; k < 3; k++)
				d[k] = over_white(v[k], v[3]);
		} else {
			uint8_t r = over_white(v[0], v[3]), g = over_white(v[1], v[3]),
				b = over_white(v[2], v[3]);
			d[0] = gray_src ? r : luma(r, g, b);
		}
	}
	out->format = src->format;
	out->color = ch == 1 ? HEL_COLOR_GRAY : ch == 3 ? HEL_COLOR_RGB : HEL_COLOR_RGBA;
	out->width = src->width;
	out->height = src->height;
	out->channels = ch;
	out->source_bits = src->source_bits;
	out->pixels = px;
	out->bytes = out->capacity = n * ch;
	return 0;
}

/* ---- Describing ----------------------------------------------------------- */

static uint64_t prepared_bytes(const hel_core_image *g, uint32_t tokens)
{
	uint64_t U = (uint64_t)g->patch * g->merge;
	uint64_t px = (uint64_t)tokens * U * U * g->channels;
	uint64_t header = eos_round_up(SEL_INPUT_FIXED + 2 * 96, 64);
	return header + (px + 63) / 64 * 64 + 64;
}

static int check_consumed(const hel_core *c, const hel_image *im)
{
	if (!c->has_image)
		return eos_fail(-EINVAL, "core '%s' has no [image] section: it takes no images",
				c->name);
	if (!im->pixels || im->channels != c->image.channels || im->width == 0 || im->height == 0 ||
	    im->bytes != (size_t)im->width * im->height * im->channels)
		return eos_fail(-EINVAL,
				"vision: the image is not in the core's consumed "
				"representation (%u channels; hel_vision_convert makes it)",
				c->image.channels);
	return 0;
}

int hel_vision_describe(const hel_core *c, const hel_image *im, sel_input_source *out)
{
	char settings[HEL_VISION_SETTINGS_MAX];
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = check_consumed(c, im)) || (rc = hel_vision_settings(c, settings)))
		return rc;
	sel_input_image_identity(settings, im->width, im->height, im->channels, im->pixels,
				 &out->identity);
	out->width = im->width;
	out->height = im->height;
	hel_vision_grid(&c->image, im->width, im->height, &out->grid_h, &out->grid_w);
	out->tokens = out->grid_h * out->grid_w;
	out->prepared_bytes = prepared_bytes(&c->image, out->tokens);
	return 0;
}

/* ---- Resizing and patching -------------------------------------------------- */

/* Source cells of destination cell i when n source cells map onto m. */
static inline void span_of(uint64_t i, uint64_t n, uint64_t m, uint64_t *j0, uint64_t *j1)
{
	*j0 = i * n / m;
	*j1 = ((i + 1) * n - 1) / m;
}

static inline uint64_t overlap(uint64_t i, uint64_t j, uint64_t n, uint64_t m)
{
	uint64_t lo = i * n > j * m ? i * n : j * m;
	uint64_t hi = (i + 1) * n < (j + 1) * m ? (i + 1) * n : (j + 1) * m;
	return hi - lo;
}

int hel_vision_prepare(const hel_core *c, const hel_image *im, const sel_input_source *desc,
		       sel_input_rec *out)
{
	const hel_core_image *g = &c->image;
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = check_consumed(c, im)))
		return rc;
	uint32_t gh, gw;
	hel_vision_grid(g, im->width, im->height, &gh, &gw);
	if (desc->grid_h != gh || desc->grid_w != gw || desc->width != im->width ||
	    desc->height != im->height)
		return eos_fail(-EINVAL,
				"vision: the description (%u x %u, grid %u x %u) is not of "
				"this image (%u x %u, grid %u x %u)",
				desc->width, desc->height, desc->grid_h, desc->grid_w, im->width,
				im->height, gh, gw);
	const uint32_t C = g->channels, P = g->patch, M = g->merge, U = P * M;
	if (!C || !U)
		return eos_fail(-EINVAL,
				"vision: the core's image geometry is empty (%u channels, "
				"patch %u, merge %u)",
				C, P, M);
	const uint64_t DW = (uint64_t)gw * U, DH = (uint64_t)gh * U;
	/* The source region: the whole image, or its centred square. */
	uint64_t x0 = 0, y0 = 0, SW = im->width, SH = im->height;
	if (g->resize == HEL_RESIZE_CROP) {
		uint64_t s = SW < SH ? SW : SH;
		x0 = (SW - s) / 2;
		y0 = (SH - s) / 2;
		SW = SH = s;
	}
	sel_input_tensor spec[2] = {0};
	strcpy(spec[0].name, HEL_VISION_PIXELS);
	spec[0].dtype = SEL_DT_U8;
	spec[0].rank = 2;
	spec[0].dims[0] = (uint64_t)gh * gw;
	spec[0].dims[1] = (uint64_t)U * U * C;
	strcpy(spec[1].name, HEL_VISION_GRID);
	spec[1].dtype = SEL_DT_U32;
	spec[1].rank = 1;
	spec[1].dims[0] = 2;
	if ((rc = sel_input_prepared_init(out, &desc->identity, spec, 2)))
		return rc;
	uint32_t *hrow = calloc(DW * C, sizeof *hrow); /* every element set before read */
	uint64_t *acc = malloc(DW * C * sizeof *acc);
	if (!hrow || !acc) {
		rc = eos_fail(-ENOMEM, "vision: out of memory for a %" PRIu64 "-pixel row", DW);
		goto fail;
	}
	uint8_t *dst = sel_input_data(out, 0);
	const uint64_t den = SW * SH;
	uint64_t cached = UINT64_MAX;
	for (uint64_t y = 0; y < DH; y++) {
		uint64_t r0, r1;
		span_of(y, SH, DH, &r0, &r1);
		memset(acc, 0, DW * C * sizeof *acc);
		for (uint64_t r = r0; r <= r1; r++) {
			if (r != cached) {
				/* Horizontal pass over source row y0 + r. */
				const uint8_t *src = im->pixels + ((y0 + r) * im->width + x0) * C;
				for (uint64_t x = 0; x < DW; x++) {
					uint64_t c0, c1;
					span_of(x, SW, DW, &c0, &c1);
					for (uint32_t k = 0; k < C; k++) {
						uint32_t s = 0;
						for (uint64_t j = c0; j <= c1; j++)
							s += (uint32_t)overlap(x, j, SW, DW) *
							     src[j * C + k];
						hrow[x * C + k] = s;
					}
				}
				cached = r;
			}
			uint64_t wv = overlap(y, r, SH, DH);
			for (uint64_t i = 0; i < DW * C; i++)
				acc[i] += wv * hrow[i];
		}
		/* Row y into the patches. */
		uint64_t ty = y / U, py = (y % U) / P, iy = y % P;
		for (uint64_t x = 0; x < DW; x++) {
			uint64_t t = ty * gw + x / U, p = py * M + (x % U) / P, ix = x % P;
			uint8_t *o = dst + (((t * M * M + p) * P + iy) * P + ix) * C;
			for (uint32_t k = 0; k < C; k++)
				o[k] = (uint8_t)((acc[x * C + k] + den / 2) / den);
		}
	}
	uint8_t *grid = sel_input_data(out, 1);
	uint32_t gv[2] = {gh, gw};
	for (int i = 0; i < 2; i++)
		for (int b = 0; b < 4; b++)
			grid[4 * i + b] = (uint8_t)(gv[i] >> (8 * b));
	free(hrow);
	free(acc);
	if ((rc = sel_input_seal(out, 0)))
		goto fail_rec;
	return 0;
fail:
	free(hrow);
	free(acc);
fail_rec:
	sel_input_rec_free(out);
	return rc;
}

int hel_vision_check(const hel_core *c, const sel_input_rec *r, uint32_t *tokens)
{
	if (!c->has_image)
		return eos_fail(-EINVAL, "core '%s' has no [image] section: it takes no images",
				c->name);
	const hel_core_image *g = &c->image;
	const sel_input_header *h = &r->h;
	int pi = sel_input_find(r, HEL_VISION_PIXELS), gi = sel_input_find(r, HEL_VISION_GRID);
	if (h->kind != SEL_INPUT_PREPARED || h->count != 2 || pi < 0 || gi < 0 || !r->bytes ||
	    r->len != h->file_bytes)
		return eos_fail(
			-EINVAL,
			"vision: not a prepared image (expected the tensors '" HEL_VISION_PIXELS
			"' and '" HEL_VISION_GRID "')");
	const sel_input_tensor *pt = &h->tensors[pi], *gt = &h->tensors[gi];
	if (gt->dtype != SEL_DT_U32 || gt->rank != 1 || gt->dims[0] != 2)
		return eos_fail(-EINVAL,
				"vision: tensor '" HEL_VISION_GRID "' is %s rank %u, not u32 [2]",
				sel_dtype_name(gt->dtype), gt->rank);
	const uint8_t *gb = r->bytes + gt->offset;
	uint32_t gh = (uint32_t)gb[0] | (uint32_t)gb[1] << 8 | (uint32_t)gb[2] << 16 |
		      (uint32_t)gb[3] << 24;
	uint32_t gw = (uint32_t)gb[4] | (uint32_t)gb[5] << 8 | (uint32_t)gb[6] << 16 |
		      (uint32_t)gb[7] << 24;
	uint64_t U = (uint64_t)g->patch * g->merge, E = U * U * g->channels;
	if (gh == 0 || gw == 0 || (uint64_t)gh * gw > g->max_tokens)
		return eos_fail(-EINVAL, "vision: grid %u x %u (the core allows 1..%u tokens)", gh,
				gw, g->max_tokens);
	if (pt->dtype != SEL_DT_U8 || pt->rank != 2 || pt->dims[0] != (uint64_t)gh * gw ||
	    pt->dims[1] != E)
		return eos_fail(-EINVAL,
				"vision: tensor '" HEL_VISION_PIXELS "' is %s [%" PRIu64
				", %" PRIu64 "], the core expects u8 [%u, %" PRIu64 "]",
				sel_dtype_name(pt->dtype), pt->dims[0], pt->dims[1], gh * gw, E);
	if (tokens)
		*tokens = gh * gw;
	return 0;
}
