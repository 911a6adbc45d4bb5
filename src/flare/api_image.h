/*
 * api_image.h - image content parts of chat requests (docs/inputs.md
 * "For part B" 1; OpenAI's {"type": "image_url", "image_url": {"url":
 * "data:image/png;base64,..."}}).
 *
 * Pure code, called by api.c's message reader: each part is parsed as a
 * data: URL (no fetching: another scheme is refused), its decoded bytes
 * are checked against the limits, its header probed (a decompression bomb
 * is refused before any pixel is decompressed), and its token count is
 * computed from the header by the core's grid (hel_vision_grid), so the
 * whole request's context budget is known before admission.  The
 * frontend never decodes, resizes or patches: the engine's preparation
 * worker does.  Every refusal is a 400 naming the part
 * (messages[i].content[j]) and the reason.
 */
#ifndef FLARE_API_IMAGE_H
#define FLARE_API_IMAGE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "flare/api.h"
#include "helios/tokenizer.h"

/* The images of one request while its messages are read. */
struct flare_api_images {
	hel_image_input *img;    /* bytes malloc'd; at set by flare_api_images_place */
	size_t *msg;             /* each image's message */
	hel_message_image *span; /* each image's place in its message's content */
	uint32_t n, cap;
};

/* The image_url part `part` of message msg, standing before content byte
 * offset, at parameter pp: appended.  0, or -EINVAL with *err. */
int flare_api_image_part(json_t *part, const char *pp, size_t msg, size_t offset,
			 const struct flare_api_limits *lim, struct flare_api_images *im,
			 struct flare_api_error *err);
/* Point each message at its images (msgs[0..n) in message order). */
void flare_api_images_bind(struct flare_api_images *im, hel_message *msgs, size_t n);
/* The images' positions in the templated prompt tokens[0..n): the k-th
 * image takes the k-th run of its token count of HEL_TOK_IMAGE.  0, or
 * -EINVAL when they do not match (a template bug). */
int flare_api_images_place(struct flare_api_images *im, const hel_token *tokens, size_t n);
/* Hand the images to out (flare_api_request_free frees them). */
void flare_api_images_move(struct flare_api_images *im, struct flare_api_request *out);
/* NULL-safe on an empty set. */
void flare_api_images_free(struct flare_api_images *im);
/* Free a request's images (flare_api_request_free). */
void flare_api_request_images_free(hel_image_input *img, uint32_t n);

#endif
