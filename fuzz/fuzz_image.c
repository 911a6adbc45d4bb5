/*
 * fuzz_image.c - libFuzzer target for image inputs (src/helios/image.c and
 * vision.c, design 2.13; STYLE.md 13): data: URLs, PNG and JPEG decoding
 * through libpng and libjpeg-turbo, and the preparation of what decodes.
 * Its corpus, fuzz/corpus/image/ (tiny real PNG and JPEG files of every
 * variant, broken ones, bombs and URLs; written by `build/tests/test_image
 * --write-corpus DIR`), replays in make check through
 * build/fuzz/replay_image.
 *
 * An input that starts like a URL ("scheme:") is parsed as an image URL and
 * its data, if any, decoded; any other input is decoded as image bytes.
 * Checks, besides "never crashes, never reads past the input, never
 * leaks" (ASan):
 *   1. Failures are SEL_EFORMAT, SEL_EOVERSIZE or -ENOMEM with a one-line
 *      message, and leave the output zeroed.
 *   2. A decoded image is within the limits and its sizes add up; the
 *      header probe agrees with it.
 *   3. It converts, describes and prepares for a vision core, and the
 *      prepared record passes the core's check with the described tokens.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "helios/core.h"
#include "helios/image.h"
#include "helios/vision.h"

static const char core_text[] =
	"name = fuzz\npage_tokens = 64\nranks = 1\nvocab = 320\nhidden = 8\nlayers = 1\n"
	"seed = 1\nmax_context = 4096\n[row]\nrecurrent_bytes = 0\nrecurrent_shard = split\n"
	"[plane k]\ntoken_bytes = 8\nshard = split\n"
	"[image]\npatch_size = 4\nmerge = 2\nmax_tokens = 12\nresize = fit\nchannels = 3\n";

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_image: %s (message '%s')\n", what, eos_errmsg());
	abort();
}

static void check_error(int rc)
{
	if (rc != SEL_EFORMAT && rc != SEL_EOVERSIZE && rc != -ENOMEM)
		fail("unexpected error code");
	const char *m = eos_errmsg();
	if (!*m || strchr(m, '\n'))
		fail("failure without a one-line message");
}

static void decode(const hel_core *core, const hel_image_limits *lim, const uint8_t *b, size_t n)
{
	hel_image img;
	int rc = hel_image_decode(b, n, lim, &img);
	if (rc) {
		check_error(rc);
		if (img.pixels || img.width)
			fail("a failed decode left output");
		return;
	}
	if (img.width == 0 || img.height == 0 ||
	    (uint64_t)img.width * img.height > lim->max_pixels ||
	    img.channels != hel_image_color_channels(img.color) ||
	    img.bytes != (size_t)img.width * img.height * img.channels || img.capacity < img.bytes)
		fail("decoded sizes do not add up");
	uint32_t w, h;
	hel_image_format f;
	if (hel_image_probe(b, n, lim, &f, &w, &h) || f != img.format || w != img.width ||
	    h != img.height)
		fail("the probe disagrees with the decode");
	hel_image cons;
	sel_input_source d;
	sel_input_rec r;
	uint32_t tokens;
	if (hel_vision_convert(core, &img, &cons))
		fail("a decoded image does not convert");
	if (hel_vision_describe(core, &cons, &d) || hel_vision_prepare(core, &cons, &d, &r))
		fail("a converted image does not prepare");
	if (hel_vision_check(core, &r, &tokens) || tokens != d.tokens || r.len != d.prepared_bytes)
		fail("a prepared image does not check");
	sel_input_rec_free(&r);
	hel_image_free(&cons);
	hel_image_free(&img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static hel_core *core;
	char err[256];
	if (!core &&
	    hel_core_parse(core_text, sizeof core_text - 1, "fuzz.core", &core, err, sizeof err))
		fail("the fuzz core does not parse");
	/* Small limits keep each run fast; the logic is the same. */
	hel_image_limits lim = {
		.max_encoded_bytes = 1u << 20, .max_pixels = 1u << 18, .max_images = 4};
	const uint8_t *colon = memchr(data, ':', size < 16 ? size : 16);
	bool url = colon && colon > data && ((data[0] | 32) >= 'a' && (data[0] | 32) <= 'z');
	if (!url) {
		decode(core, &lim, data, size);
		return 0;
	}
	hel_data_url u;
	int rc = hel_data_url_parse((const char *)data, size, &lim, &u);
	if (rc) {
		check_error(rc);
		if (u.bytes || u.len)
			fail("a failed parse left output");
		return 0;
	}
	if (u.len > lim.max_encoded_bytes || strncmp(u.media_type, "image/", 6) != 0)
		fail("a parsed URL breaks its limits");
	decode(core, &lim, u.bytes, u.len);
	hel_data_url_free(&u);
	return 0;
}
