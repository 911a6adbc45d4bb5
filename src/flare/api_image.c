/*
 * api_image.c - image content parts of chat requests (api_image.h).
 */
#include "flare/api_image.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "helios/image.h"
#include "helios/vision.h"

#define INVALID "invalid_request_error"

#define FAIL(status, param, ...)                                                                   \
	do {                                                                                       \
		flare_api_error_set(err, status, INVALID, param, NULL, __VA_ARGS__);               \
		goto fail;                                                                         \
	} while (0)

static hel_image_limits limits_of(const struct flare_api_limits *lim)
{
	hel_image_limits l = lim->images;
	hel_image_limits d = hel_image_limits_default();
	if (!l.max_encoded_bytes)
		l.max_encoded_bytes = d.max_encoded_bytes;
	if (!l.max_pixels)
		l.max_pixels = d.max_pixels;
	if (!l.max_images)
		l.max_images = d.max_images;
	return l;
}

/* The url of {"type": "image_url", "image_url": {"url": ..., "detail": ...}}. */
static int part_url(json_t *part, const char *pp, const char **url, size_t *len,
		    struct flare_api_error *err)
{
	const char *key;
	json_t *v;
	json_object_foreach(part, key, v)
	{
		if (strcmp(key, "type") && strcmp(key, "image_url"))
			FAIL(400, pp,
			     "%s.%.40s is not a field of an image_url part (type, image_url)", pp,
			     key);
	}
	json_t *iu = json_object_get(part, "image_url");
	if (!json_is_object(iu))
		FAIL(400, pp,
		     "%s.image_url must be an object {\"url\": \"data:image/png;base64,...\"}", pp);
	json_object_foreach(iu, key, v)
	{
		if (!strcmp(key, "url"))
			continue;
		if (!strcmp(key, "detail")) {
			const char *d = json_is_string(v) ? json_string_value(v) : "";
			if (strcmp(d, "auto") && strcmp(d, "low") && strcmp(d, "high"))
				FAIL(400, pp,
				     "%s.image_url.detail must be \"auto\", \"low\" or \"high\"",
				     pp);
			continue; /* the core's geometry decides the tokens */
		}
		FAIL(400, pp, "%s.image_url.%.40s is not a field of image_url (url, detail)", pp,
		     key);
	}
	json_t *u = json_object_get(iu, "url");
	if (!json_is_string(u))
		FAIL(400, pp, "%s.image_url.url must be a string (a data: URL)", pp);
	*url = json_string_value(u);
	*len = json_string_length(u);
	return 0;
fail:
	return -EINVAL;
}

static int grow(struct flare_api_images *im)
{
	if (im->n < im->cap)
		return 0;
	uint32_t cap = im->cap ? im->cap * 2 : 4;
	hel_image_input *a = realloc(im->img, cap * sizeof *a);
	if (a)
		im->img = a;
	size_t *m = realloc(im->msg, cap * sizeof *m);
	if (m)
		im->msg = m;
	hel_message_image *s = realloc(im->span, cap * sizeof *s);
	if (s)
		im->span = s;
	if (!a || !m || !s)
		return -ENOMEM;
	im->cap = cap;
	return 0;
}

int flare_api_image_part(json_t *part, const char *pp, size_t msg, size_t offset,
			 const struct flare_api_limits *lim, struct flare_api_images *im,
			 struct flare_api_error *err)
{
	hel_data_url du = {0};
	const char *url;
	size_t len;
	const hel_core *core = lim->core;
	if (!core || !core->has_image)
		FAIL(400, pp, "%s: the model takes no images (core '%s' has no [image] section)",
		     pp,
		     core         ? core->name
		     : lim->model ? lim->model
				  : "?");
	if (part_url(part, pp, &url, &len, err))
		goto fail;
	hel_image_limits l = limits_of(lim);
	if (hel_image_check_count(im->n + 1, &l))
		FAIL(400, pp, "%s: %s", pp, sel_errmsg());
	if (hel_data_url_parse(url, len, &l, &du))
		FAIL(400, pp, "%s: %s", pp, sel_errmsg());
	hel_image_format fmt;
	uint32_t w, h;
	if (hel_image_probe(du.bytes, du.len, &l, &fmt, &w, &h))
		FAIL(400, pp, "%s: %s", pp, sel_errmsg());
	bool png = fmt == HEL_IMAGE_PNG;
	if (strcmp(du.media_type, png ? "image/png" : "image/jpeg"))
		FAIL(400, pp, "%s: the data is a %s image but the URL says %s", pp,
		     png ? "PNG" : "JPEG", du.media_type);
	uint32_t gh, gw;
	hel_vision_grid(&core->image, w, h, &gh, &gw);
	if (grow(im))
		FAIL(500, NULL, "out of memory");
	im->img[im->n] = (hel_image_input){.bytes = du.bytes, .len = du.len, .tokens = gh * gw};
	im->msg[im->n] = msg;
	im->span[im->n] = (hel_message_image){.offset = offset, .tokens = gh * gw};
	im->n++;
	return 0;
fail:
	hel_data_url_free(&du);
	return -EINVAL;
}

void flare_api_images_bind(struct flare_api_images *im, hel_message *msgs, size_t n)
{
	uint32_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t first = k;
		while (k < im->n && im->msg[k] == i)
			k++;
		msgs[i].images = k > first ? &im->span[first] : NULL;
		msgs[i].n_images = k - first;
	}
}

int flare_api_images_place(struct flare_api_images *im, const hel_token *tokens, size_t n)
{
	size_t i = 0;
	for (uint32_t k = 0; k < im->n; k++) {
		while (i < n && tokens[i] != HEL_TOK_IMAGE)
			i++;
		if (i + im->img[k].tokens > n)
			return -EINVAL;
		im->img[k].at = (uint32_t)i;
		i += im->img[k].tokens;
	}
	return 0;
}

void flare_api_images_move(struct flare_api_images *im, struct flare_api_request *out)
{
	out->images = im->n ? im->img : NULL;
	out->n_images = im->n;
	if (!im->n)
		free(im->img);
	im->img = NULL;
	im->n = 0;
	flare_api_images_free(im);
}

void flare_api_request_images_free(hel_image_input *img, uint32_t n)
{
	for (uint32_t k = 0; img && k < n; k++)
		free((void *)img[k].bytes);
	free(img);
}

void flare_api_images_free(struct flare_api_images *im)
{
	flare_api_request_images_free(im->img, im->n);
	free(im->msg);
	free(im->span);
	memset(im, 0, sizeof *im);
}
