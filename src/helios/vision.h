/*
 * vision.h - preparing decoded images for a vision core (design 2.13;
 * docs/inputs.md "Preparation"): the profile's settings, the consumed
 * representation and its semantic identity, the token grid, and the
 * prepared tensors the model turns into image-token states.
 *
 * The pipeline of one image, every step deterministic integer code:
 *
 *   encoded bytes --hel_image_decode--> decoded image (image.h)
 *     --hel_vision_convert--> consumed image: the core's channels, alpha
 *        composited over white unless the core keeps it, CMYK converted
 *     --hel_vision_describe--> semantic identity, token grid, sizes
 *     --hel_vision_prepare--> prepared record (input_record.h):
 *        "pixels" u8 [tokens, merge^2 x patch^2 x channels]
 *        "grid"   u32 [2] = { grid_h, grid_w }
 *
 * Pure functions over their arguments (memory only); thread-safe.  Errors
 * as image.h: SEL_EFORMAT, SEL_EOVERSIZE, -EINVAL (a text-only core, a
 * record that does not fit the core), -ENOMEM, with a message.
 */
#ifndef HEL_VISION_H
#define HEL_VISION_H

#include <stdint.h>

#include "core.h"
#include "image.h"
#include "input_record.h"

#define HEL_VISION_SETTINGS_MAX 160
#define HEL_VISION_PIXELS "pixels"
#define HEL_VISION_GRID "grid"

/* The core's preparation settings as text, e.g.
 *   "flare-image-prep-v1 patch=14 merge=2 max_tokens=1024 resize=fit channels=3"
 * Source keys and semantic identities hash it; its version word changes
 * whenever preparation semantics do.  -EINVAL for a text-only core. */
int hel_vision_settings(const hel_core *c, char out[HEL_VISION_SETTINGS_MAX]);

/* The token grid for a width x height source: fit keeps the aspect ratio
 * (each side rounded to whole tokens, then shrunk until the grid holds at
 * most max_tokens), crop and stretch use the square grid of
 * floor(sqrt(max_tokens)) per side.  Always 1 <= gh x gw <= max_tokens. */
void hel_vision_grid(const hel_core_image *g, uint32_t width, uint32_t height, uint32_t *gh,
		     uint32_t *gw);

/* The consumed representation of src in the core's channels (new pixels
 * in *out; src unchanged).  out->color is GRAY, RGB or RGBA. */
int hel_vision_convert(const hel_core *c, const hel_image *src, hel_image *out);

/* Describe a consumed image: its semantic identity (sel_input_image_identity
 * over the settings and the consumed pixels), the decoded size, the token
 * grid and tokens, and the prepared record's length.  encoding and color
 * are left for the caller (the source's). */
int hel_vision_describe(const hel_core *c, const hel_image *consumed, sel_input_source *out);

/* Resize consumed to the grid of desc (exact area averaging, round half
 * up; crop takes the centred square first) and cut it into patches: a
 * sealed prepared record keyed by desc->identity. */
int hel_vision_prepare(const hel_core *c, const hel_image *consumed, const sel_input_source *desc,
		       sel_input_rec *out);

/* Whether r is a prepared record this core can consume: its two tensors,
 * their types and shapes against the core's geometry.  0 with the image's
 * token count in *tokens, or -EINVAL naming the mismatch. */
int hel_vision_check(const hel_core *c, const sel_input_rec *r, uint32_t *tokens);

#endif
