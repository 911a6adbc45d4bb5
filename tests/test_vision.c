/*
 * test_vision.c - the vision path of the synthetic model (design 2.13;
 * docs/inputs.md): the [image] section of a core, the consumed
 * representation and semantic identities (the same pixels in another
 * encoding give the same identity, alpha composited where the profile has
 * none), the token grid, deterministic resizing and patching, image tokens
 * and the prefix keys they give, and the model's dependence on every byte
 * of a prepared image.
 */
#include <png.h>

#include "helios/core.h"
#include "helios/image.h"
#include "helios/model.h"
#include "helios/vision.h"
#include "imgutil.h"
#include "inpututil.h"
#include "input_key.h"
#include "testutil.h"

#include "xxh.h"

#ifdef SEL_SANITIZED
#define FLIP_STRIDE 7 /* sanitizer builds: every 7th byte */
#else
#define FLIP_STRIDE 1
#endif

static hel_image_limits lim;

#define load test_core_load

/* text with the first a replaced by b (malloc'd). */
static char *edit(const char *text, const char *a, const char *b)
{
	const char *at = strstr(text, a);
	CHECKF(at, "'%s' not in the text", a);
	size_t n = strlen(text) + strlen(b) + 1;
	char *o = malloc(n);
	snprintf(o, n, "%.*s%s%s", (int)(at - text), text, b, at + strlen(a));
	return o;
}

/* vision-small with one line of [image] changed. */
static hel_core *variant(const hel_core *base, const char *a, const char *b)
{
	char err[512], *t = edit(base->canonical, a, b);
	hel_core *c;
	int rc = hel_core_parse(t, strlen(t), "variant", &c, err, sizeof err);
	CHECKF(rc == 0, "%s", err);
	free(t);
	return c;
}

static void parse_bad(const char *image_section, const char *needle)
{
	char text[2048], err[512];
	snprintf(
		text, sizeof text,
		"name = v\npage_tokens = 64\nranks = 1\nvocab = 320\nhidden = 8\nlayers = 1\n"
		"seed = 1\nmax_context = 4096\n[row]\nrecurrent_bytes = 0\nrecurrent_shard = split\n"
		"[plane k]\ntoken_bytes = 8\nshard = split\n%s",
		image_section);
	hel_core *c;
	int rc = hel_core_parse(text, strlen(text), "v.core", &c, err, sizeof err);
	CHECKF(rc == SEL_EFORMAT, "'%s' parsed", image_section);
	CHECKF(strstr(err, needle), "'%s': '%s' lacks '%s'", image_section, err, needle);
}

static void test_core_section(void)
{
	hel_core *vs = load("vision-small"), *v = load("vision"), *tiny;
	CHECK_OK(hel_core_builtin(&tiny));
	CHECK(!tiny->has_image && vs->has_image && v->has_image);
	CHECK(vs->image.patch == 8 && vs->image.merge == 1 && vs->image.max_tokens == 16);
	CHECK(vs->image.resize == HEL_RESIZE_FIT && vs->image.channels == 3);
	CHECK(v->image.patch == 14 && v->image.merge == 2 && v->image.max_tokens == 1280);
	CHECK(strstr(vs->canonical, "\n[image]\npatch_size = 8\nmerge = 1\nmax_tokens = 16\n"
				    "resize = fit\nchannels = 3\n"));
	CHECK(!strstr(tiny->canonical, "[image]"));
	/* The canonical form parses back to the same identity. */
	hel_core *again;
	char err[512];
	CHECK_OK(hel_core_parse(vs->canonical, vs->canonical_len, "c", &again, err, sizeof err));
	CHECK(memcmp(again->identity, vs->identity, SEL_IDENTITY_BYTES) == 0 && again->has_image);
	hel_core_free(again);
	/* Every image field is part of the identity. */
	const char *edits[][2] = {{"patch_size = 8", "patch_size = 9"},
				  {"merge = 1", "merge = 2"},
				  {"max_tokens = 16", "max_tokens = 15"},
				  {"resize = fit", "resize = crop"},
				  {"channels = 3", "channels = 4"}};
	for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
		again = variant(vs, edits[i][0], edits[i][1]);
		CHECK(memcmp(again->identity, vs->identity, SEL_IDENTITY_BYTES) != 0);
		hel_core_free(again);
	}
	parse_bad("[image]\nmerge = 1\nmax_tokens = 4\nresize = fit\nchannels = 3\n",
		  "patch_size: missing in [image]");
	parse_bad("[image]\npatch_size = 8\nmax_tokens = 4\nresize = zoom\nchannels = 3\n",
		  "'zoom' is not a resize mode");
	parse_bad("[image]\npatch_size = 8\nmax_tokens = 4\nresize = fit\nchannels = 2\n",
		  "channels: 2 is out of range");
	parse_bad("[image]\npatch_size = 1\nmax_tokens = 4\nresize = fit\nchannels = 3\n",
		  "patch_size: 1 is out of range");
	parse_bad("[image]\npatch_size = 8\nmax_tokens = 5000\nresize = fit\nchannels = 3\n",
		  "do not fit in max_context");
	parse_bad(
		"[image]\npatch_size = 64\nmerge = 4\nmax_tokens = 4096\nresize = fit\nchannels = 4\n",
		"prepared bytes");
	parse_bad("[image]\npatch_size = 8\nmax_tokens = 4\nresize = fit\nchannels = 3\n[image]\n",
		  "section repeated");
	parse_bad("[image x]\n", "takes no name");
	parse_bad("[image]\nshard = split\n", "belongs in a [plane] section, not [image]");
	parse_bad("[image]\ncolour = red\n", "unknown key in [image]");
	/* vocab must leave HEL_TOK_IMAGE. */
	const char *low =
		"name = v\npage_tokens = 64\nranks = 1\nvocab = 259\nhidden = 8\nlayers = 1\n"
		"seed = 1\nmax_context = 4096\n[row]\nrecurrent_bytes = 0\n"
		"recurrent_shard = split\n[plane k]\ntoken_bytes = 8\nshard = split\n"
		"[image]\npatch_size = 8\nmax_tokens = 4\nresize = fit\nchannels = 3\n";
	hel_core *c;
	CHECK_RC(hel_core_parse(low, strlen(low), "v.core", &c, err, sizeof err), SEL_EFORMAT);
	CHECKF(strstr(err, "no id for image tokens"), "%s", err);

	char st[HEL_VISION_SETTINGS_MAX];
	CHECK_OK(hel_vision_settings(v, st));
	CHECK(strcmp(st,
		     "flare-image-prep-v1 patch=14 merge=2 max_tokens=1280 resize=fit channels=3") ==
	      0);
	CHECK_RC(hel_vision_settings(tiny, st), -EINVAL);
	hel_core_free(vs);
	hel_core_free(v);
	hel_core_free(tiny);
}

static void test_grid(void)
{
	hel_core_image g = {.patch = 14,
			    .merge = 2,
			    .max_tokens = 1280,
			    .resize = HEL_RESIZE_FIT,
			    .channels = 3};
	uint32_t gh, gw;
	hel_vision_grid(&g, 1024, 768, &gh, &gw);
	CHECK(gh == 27 && gw == 37); /* round(768 / 28), round(1024 / 28) */
	hel_vision_grid(&g, 10, 10, &gh, &gw);
	CHECK(gh == 1 && gw == 1);
	hel_vision_grid(&g, 4096, 4096, &gh, &gw); /* shrunk to fit 1280 */
	CHECK(gh * gw <= 1280 && gh == gw && gh == 35);
	hel_vision_grid(&g, 65535, 1, &gh, &gw);
	CHECK(gh == 1 && gw == 1280);
	hel_vision_grid(&g, 1, 65535, &gh, &gw);
	CHECK(gh == 1280 && gw == 1);
	g.resize = HEL_RESIZE_CROP;
	hel_vision_grid(&g, 1024, 768, &gh, &gw);
	CHECK(gh == 35 && gw == 35);
	g.resize = HEL_RESIZE_STRETCH;
	hel_vision_grid(&g, 3, 9000, &gh, &gw);
	CHECK(gh == 35 && gw == 35);
	/* The bound holds for every size, and fit keeps the aspect roughly. */
	test_rng rng;
	test_rng_init(&rng, test_seed());
	g.resize = HEL_RESIZE_FIT;
	for (int i = 0; i < 20000; i++) {
		uint32_t w = 1 + (uint32_t)test_rng_below(&rng, 65535);
		uint32_t h = 1 + (uint32_t)test_rng_below(&rng, i % 2 ? 65535 : 3000);
		g.max_tokens = 1 + (uint32_t)test_rng_below(&rng, 2000);
		hel_vision_grid(&g, w, h, &gh, &gw);
		CHECK(gh >= 1 && gw >= 1 && (uint64_t)gh * gw <= g.max_tokens);
	}
}

/* Decode b and convert for core c. */
static void consume(const hel_core *c, const struct imgbuf *b, hel_image *out)
{
	hel_image dec;
	CHECK_OK(hel_image_decode(b->b, b->n, &lim, &dec));
	CHECK_OK(hel_vision_convert(c, &dec, out));
	hel_image_free(&dec);
}

static void identity_of(const hel_core *c, const struct imgbuf *b, sel_input_key *id)
{
	hel_image im;
	sel_input_source d;
	consume(c, b, &im);
	CHECK_OK(hel_vision_describe(c, &im, &d));
	*id = d.identity;
	hel_image_free(&im);
}

static void test_convert(void)
{
	hel_core *c3 = load("vision-small");
	/* A core consuming gray and one keeping alpha: edits of vision-small. */
	hel_core *c1 = variant(c3, "channels = 3", "channels = 1");
	hel_core *c4 = variant(c3, "channels = 3", "channels = 4");

	uint8_t rgba[4 * 4] = {10, 20, 30, 255, 200, 100, 50, 0, 90, 180, 250, 128, 0, 0, 0, 1};
	hel_image src = {.format = HEL_IMAGE_PNG,
			 .color = HEL_COLOR_RGBA,
			 .width = 4,
			 .height = 1,
			 .channels = 4,
			 .pixels = rgba,
			 .bytes = 16,
			 .capacity = 16};
	hel_image o;
	CHECK_OK(hel_vision_convert(c3, &src, &o));
	CHECK(o.color == HEL_COLOR_RGB && o.channels == 3 && o.bytes == 12);
	uint8_t want3[12];
	for (int p = 0; p < 4; p++)
		for (int k = 0; k < 3; k++) {
			uint32_t cc = rgba[4 * p + k], a = rgba[4 * p + 3];
			want3[3 * p + k] = (uint8_t)((cc * a + 255 * (255 - a) + 127) / 255);
		}
	CHECK(memcmp(o.pixels, want3, 12) == 0);
	CHECK(o.pixels[3] == 255 && o.pixels[4] == 255 &&
	      o.pixels[5] == 255); /* transparent: white */
	hel_image_free(&o);
	CHECK_OK(hel_vision_convert(c4, &src, &o));
	CHECK(o.color == HEL_COLOR_RGBA && memcmp(o.pixels, rgba, 16) == 0);
	hel_image_free(&o);
	CHECK_OK(hel_vision_convert(c1, &src, &o));
	CHECK(o.color == HEL_COLOR_GRAY && o.bytes == 4);
	for (int p = 0; p < 4; p++) {
		uint32_t r = want3[3 * p], g = want3[3 * p + 1], b = want3[3 * p + 2];
		CHECK(o.pixels[p] == (uint8_t)((77 * r + 150 * g + 29 * b + 128) >> 8));
	}
	hel_image_free(&o);

	/* CMYK ink to RGB. */
	uint8_t cmyk[8] = {0, 0, 0, 0, 255, 128, 0, 64};
	hel_image cs = {.format = HEL_IMAGE_JPEG,
			.color = HEL_COLOR_CMYK,
			.width = 2,
			.height = 1,
			.channels = 4,
			.pixels = cmyk,
			.bytes = 8,
			.capacity = 8};
	CHECK_OK(hel_vision_convert(c3, &cs, &o));
	CHECK(o.pixels[0] == 255 && o.pixels[1] == 255 && o.pixels[2] == 255);
	CHECK(o.pixels[3] == 0);
	CHECK(o.pixels[4] == (uint8_t)((127u * 191 + 127) / 255));
	CHECK(o.pixels[5] == (uint8_t)((255u * 191 + 127) / 255));
	hel_image_free(&o);
	/* Gray sources stay exact in a gray profile; to RGB they replicate. */
	uint8_t ga[4] = {77, 255, 33, 0};
	hel_image gs = {.format = HEL_IMAGE_PNG,
			.color = HEL_COLOR_GRAY_ALPHA,
			.width = 2,
			.height = 1,
			.channels = 2,
			.pixels = ga,
			.bytes = 4,
			.capacity = 4};
	CHECK_OK(hel_vision_convert(c1, &gs, &o));
	CHECK(o.pixels[0] == 77 && o.pixels[1] == 255);
	hel_image_free(&o);
	CHECK_OK(hel_vision_convert(c3, &gs, &o));
	CHECK(o.pixels[0] == 77 && o.pixels[1] == 77 && o.pixels[2] == 77 && o.pixels[5] == 255);
	hel_image_free(&o);
	hel_core_free(c1);
	hel_core_free(c4);
	hel_core_free(c3);
}

/* The same pixels in another encoding: one semantic identity, several
 * source keys; what the profile does not consume (alpha of a 3-channel
 * profile, once composited) does not separate identities either. */
static void test_identities(void)
{
	hel_core *c = load("vision-small"), *v = load("vision");
	const uint32_t w = 29, h = 21;
	/* 16 colours, so a palette PNG can carry the same pixels. */
	uint8_t pal[16 * 3], idx[w * h], rgb[w * h * 3];
	for (int i = 0; i < 16; i++)
		for (int k = 0; k < 3; k++)
			pal[3 * i + k] = (uint8_t)(i * 15 + k * 40);
	for (uint32_t i = 0; i < w * h; i++) {
		idx[i] = (uint8_t)((i * 7 + i / w) % 16);
		memcpy(rgb + 3 * i, pal + 3 * idx[i], 3);
	}
	struct imgbuf enc[6] = {0};
	img_png(&enc[0], w, h, PNG_COLOR_TYPE_RGB, 8, rgb, w * 3, NULL);
	uint8_t *wide = malloc((size_t)w * h * 6);
	for (size_t i = 0; i < (size_t)w * h * 3; i++)
		wide[2 * i] = wide[2 * i + 1] = rgb[i];
	img_png(&enc[1], w, h, PNG_COLOR_TYPE_RGB, 16, wide, w * 6, NULL);
	struct img_png_opts po = {.palette = pal, .n_palette = 16};
	img_png(&enc[2], w, h, PNG_COLOR_TYPE_PALETTE, 8, idx, w, &po);
	struct img_png_opts il = {.interlace = true, .compression = 9};
	img_png(&enc[3], w, h, PNG_COLOR_TYPE_RGB, 8, rgb, w * 3, &il);
	uint8_t *rgba = malloc((size_t)w * h * 4);
	for (uint32_t i = 0; i < w * h; i++) {
		memcpy(rgba + 4 * i, rgb + 3 * i, 3);
		rgba[4 * i + 3] = 255;
	}
	/* One pixel fully transparent over any colour equals a white pixel. */
	uint8_t *rgb_white = malloc((size_t)w * h * 3);
	memcpy(rgb_white, rgb, (size_t)w * h * 3);
	memset(rgb_white + 3 * 5, 255, 3);
	rgba[4 * 5 + 3] = 0;
	img_png(&enc[4], w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, w * 4, NULL);
	img_png(&enc[5], w, h, PNG_COLOR_TYPE_RGB, 8, rgb_white, w * 3, NULL);

	sel_input_key id[6], src[6];
	char st[HEL_VISION_SETTINGS_MAX];
	CHECK_OK(hel_vision_settings(c, st));
	for (int i = 0; i < 6; i++) {
		identity_of(c, &enc[i], &id[i]);
		sel_input_source_key("png", enc[i].b, enc[i].n, st, &src[i]);
	}
	for (int i = 1; i < 4; i++)
		CHECKF(sel_input_key_eq(&id[i], &id[0]), "encoding %d: another semantic identity",
		       i);
	CHECK(sel_input_key_eq(&id[4], &id[5]));
	CHECK(!sel_input_key_eq(&id[4], &id[0]));
	for (int i = 0; i < 6; i++)
		for (int j = 0; j < i; j++)
			CHECK(!sel_input_key_eq(&src[i], &src[j]));
	/* The source key covers the encoding name and the settings too. */
	sel_input_key k;
	sel_input_source_key("jpeg", enc[0].b, enc[0].n, st, &k);
	CHECK(!sel_input_key_eq(&k, &src[0]));
	char st2[HEL_VISION_SETTINGS_MAX];
	CHECK_OK(hel_vision_settings(v, st2));
	sel_input_source_key("png", enc[0].b, enc[0].n, st2, &k);
	CHECK(!sel_input_key_eq(&k, &src[0]));
	/* Another profile, another semantic identity of the same pixels. */
	identity_of(v, &enc[0], &k);
	CHECK(!sel_input_key_eq(&k, &id[0]));
	/* A changed pixel changes it. */
	rgb[100] ^= 1;
	struct imgbuf e = {0};
	img_png(&e, w, h, PNG_COLOR_TYPE_RGB, 8, rgb, w * 3, NULL);
	identity_of(c, &e, &k);
	CHECK(!sel_input_key_eq(&k, &id[0]));
	imgbuf_free(&e);

	/* Image tokens: the top bit, a function of the identity alone. */
	sel_token t0[40], t1[40];
	sel_input_tokens(&id[0], 40, t0);
	sel_input_tokens(&id[1], 40, t1);
	CHECK(memcmp(t0, t1, sizeof t0) == 0);
	for (int i = 0; i < 40; i++)
		CHECK(sel_token_is_input(t0[i]));
	sel_input_tokens(&id[4], 40, t1);
	for (int i = 0; i < 8; i++)
		CHECK(t0[i] != t1[i]);
	/* The same image in the same place: the same prefix keys; another
	 * image or another place: others. */
	sel_token prompt[3][80];
	uint32_t n = 0;
	const char *pre = "user: look ", *post = " what is it?";
	for (int p = 0; p < 3; p++) {
		n = 0;
		prompt[p][n++] = HEL_TOK_BEGIN;
		for (const char *s = pre; *s; s++)
			prompt[p][n++] = (uint8_t)*s;
		if (p == 2)
			prompt[p][n++] = ' '; /* one more token before the image */
		sel_input_tokens(&id[p == 1 ? 2 : 0], 16, prompt[p] + n);
		n += 16;
		for (const char *s = post; *s; s++)
			prompt[p][n++] = (uint8_t)*s;
	}
	sel_key k0, k1, k2;
	sel_key_direct(c->identity, NULL, 0, prompt[0], n - 1, &k0);
	sel_key_direct(c->identity, NULL, 0, prompt[1], n - 1, &k1);
	sel_key_direct(c->identity, NULL, 0, prompt[2], n, &k2);
	CHECK(sel_key_eq(&k0, &k1));
	CHECK(!sel_key_eq(&k0, &k2));
	prompt[1][14] ^= 1; /* another image (another identity) there */
	sel_key_direct(c->identity, NULL, 0, prompt[1], n - 1, &k1);
	CHECK(!sel_key_eq(&k0, &k1));

	for (int i = 0; i < 6; i++)
		imgbuf_free(&enc[i]);
	free(wide);
	free(rgba);
	free(rgb_white);
	hel_core_free(c);
	hel_core_free(v);
}

static void prepare(const hel_core *c, const hel_image *im, sel_input_source *d, sel_input_rec *r)
{
	CHECK_OK(hel_vision_describe(c, im, d));
	CHECK_OK(hel_vision_prepare(c, im, d, r));
	CHECK(r->len == d->prepared_bytes);
	uint32_t t;
	CHECK_OK(hel_vision_check(c, r, &t));
	CHECK(t == d->tokens);
}

static void test_prepare(void)
{
	hel_core *c = load("vision-small"), *v = load("vision");
	/* Deterministic: twice the same bytes; and a known answer that pins
	 * the resize and patch rules. */
	uint8_t *px = img_pattern(37, 23, 3, 21);
	hel_image im = {.format = HEL_IMAGE_PNG,
			.color = HEL_COLOR_RGB,
			.width = 37,
			.height = 23,
			.channels = 3,
			.pixels = px,
			.bytes = 37 * 23 * 3,
			.capacity = 37 * 23 * 3};
	sel_input_source d;
	sel_input_rec a, b;
	prepare(c, &im, &d, &a);
	prepare(c, &im, &d, &b);
	CHECK(d.grid_h == 3 && d.grid_w == 5 && d.tokens == 15); /* round(23/8), round(37/8) */
	CHECK(a.len == b.len && memcmp(a.bytes + a.h.header_bytes, b.bytes + b.h.header_bytes,
				       a.len - a.h.header_bytes) == 0);
	uint64_t digest = XXH3_64bits(sel_input_data(&a, 0), a.h.tensors[0].bytes);
	printf("prepared known answer: %016llx\n", (unsigned long long)digest);
	CHECK(digest == 0x38c50cb24432965bull);
	sel_input_rec_free(&b);
	sel_input_rec_free(&a);
	free(px);

	/* An image exactly at the grid's size is copied unchanged, patch by
	 * patch; a constant image stays constant at any scale. */
	px = img_pattern(16, 8, 3, 22);
	hel_image ex = {.format = HEL_IMAGE_PNG,
			.color = HEL_COLOR_RGB,
			.width = 16,
			.height = 8,
			.channels = 3,
			.pixels = px,
			.bytes = 16 * 8 * 3,
			.capacity = 16 * 8 * 3};
	prepare(c, &ex, &d, &a);
	CHECK(d.grid_h == 1 && d.grid_w == 2);
	const uint8_t *pp = sel_input_data(&a, 0);
	for (uint32_t y = 0; y < 8; y++)
		for (uint32_t x = 0; x < 16; x++)
			for (uint32_t k = 0; k < 3; k++)
				CHECK(pp[((x / 8) * 64 + y * 8 + x % 8) * 3 + k] ==
				      px[(y * 16 + x) * 3 + k]);
	const uint8_t *gb = sel_input_data(&a, 1);
	CHECK(gb[0] == 1 && gb[4] == 2);
	sel_input_rec_free(&a);
	free(px);
	const uint32_t sizes[][2] = {{1, 1}, {3, 97}, {200, 7}, {1000, 1000}, {64, 64}};
	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		size_t n = (size_t)sizes[s][0] * sizes[s][1] * 3;
		px = malloc(n);
		for (size_t i = 0; i < n; i++)
			px[i] = (uint8_t)(i % 3 == 0 ? 17 : i % 3 == 1 ? 200 : 99);
		hel_image k = {.format = HEL_IMAGE_PNG,
			       .color = HEL_COLOR_RGB,
			       .width = sizes[s][0],
			       .height = sizes[s][1],
			       .channels = 3,
			       .pixels = px,
			       .bytes = n,
			       .capacity = n};
		prepare(v, &k, &d, &a);
		pp = sel_input_data(&a, 0);
		for (uint64_t i = 0; i < a.h.tensors[0].bytes; i++)
			CHECK(pp[i] == (i % 3 == 0 ? 17 : i % 3 == 1 ? 200 : 99));
		sel_input_rec_free(&a);
		free(px);
	}
	/* 2:1 downscale averages 2 x 2 blocks, rounding half up. */
	px = malloc(16 * 16 * 3);
	for (int i = 0; i < 16 * 16 * 3; i++)
		px[i] = (uint8_t)((i * 37) % 251);
	hel_image big = {.format = HEL_IMAGE_PNG,
			 .color = HEL_COLOR_RGB,
			 .width = 16,
			 .height = 16,
			 .channels = 3,
			 .pixels = px,
			 .bytes = 768,
			 .capacity = 768};
	hel_core *crop1 = variant(c, "resize = fit", "resize = crop");
	hel_core *crop = variant(crop1, "max_tokens = 16", "max_tokens = 1");
	hel_core_free(crop1);
	CHECK(crop->image.resize == HEL_RESIZE_CROP && crop->image.max_tokens == 1);
	prepare(crop, &big, &d, &a);
	pp = sel_input_data(&a, 0);
	for (int y = 0; y < 8; y++)
		for (int x = 0; x < 8; x++)
			for (int k = 0; k < 3; k++) {
				uint32_t s = 0;
				for (int dy = 0; dy < 2; dy++)
					for (int dx = 0; dx < 2; dx++)
						s += px[((2 * y + dy) * 16 + 2 * x + dx) * 3 + k];
				CHECK(pp[(y * 8 + x) * 3 + k] == (s + 2) / 4);
			}
	sel_input_rec_free(&a);
	/* Crop takes the centred square: bands outside it never show. */
	uint8_t *wide = malloc(24 * 8 * 3);
	for (int y = 0; y < 8; y++)
		for (int x = 0; x < 24; x++)
			for (int k = 0; k < 3; k++)
				wide[(y * 24 + x) * 3 + k] = x < 8 || x >= 16 ? 0 : 250;
	hel_image wi = {.format = HEL_IMAGE_PNG,
			.color = HEL_COLOR_RGB,
			.width = 24,
			.height = 8,
			.channels = 3,
			.pixels = wide,
			.bytes = 576,
			.capacity = 576};
	prepare(crop, &wi, &d, &a);
	pp = sel_input_data(&a, 0);
	for (int i = 0; i < 192; i++)
		CHECK(pp[i] == 250);
	sel_input_rec_free(&a);
	free(wide);
	free(px);
	hel_core_free(crop);

	/* The realistic core: a 1024 x 768 photo. */
	px = img_smooth(1024, 768, 3, 23);
	hel_image photo = {.format = HEL_IMAGE_JPEG,
			   .color = HEL_COLOR_RGB,
			   .width = 1024,
			   .height = 768,
			   .channels = 3,
			   .pixels = px,
			   .bytes = 1024 * 768 * 3,
			   .capacity = 1024 * 768 * 3};
	prepare(v, &photo, &d, &a);
	CHECK(d.tokens == 27 * 37 && a.h.tensors[0].dims[1] == 28 * 28 * 3);
	/* Records that do not fit the core are refused. */
	CHECK_RC(hel_vision_check(c, &a, NULL), -EINVAL);
	sel_input_rec_free(&a);
	free(px);
	hel_core_free(c);
	hel_core_free(v);
}

struct run {
	hel_model *m;
	uint32_t pages[64];
	uint32_t np;
};

/* Prefill "text, image (its states), text" into slot 0 and return the
 * logits of the last token.  The image may be split into two chunks. */
static void run_prompt(struct run *r, const uint32_t *states, uint32_t n_img, uint32_t split,
		       const char *before, const char *after, int32_t *logits)
{
	hel_model *m = r->m;
	const uint32_t pt = hel_model_core(m)->page_tokens;
	uint64_t c = 0;
	CHECK_OK(hel_model_row_init(m, 0));
	r->np = 0;
	hel_token tok[256];
	size_t n = 0;
	tok[n++] = HEL_TOK_BEGIN;
	for (const char *s = before; *s; s++)
		tok[n++] = (uint8_t)*s;
	uint32_t want = (uint32_t)((c + n) / pt);
	while (r->np < want) {
		r->pages[r->np] = r->np;
		r->np++;
	}
	CHECK_OK(hel_model_prefill(m, 0, r->pages, r->np, tok, n, NULL));
	c += n;
	uint32_t parts[2] = {split, n_img - split};
	const uint32_t *st = states;
	for (int p = 0; p < 2; p++) {
		if (!parts[p])
			continue;
		want = (uint32_t)((c + parts[p]) / pt);
		while (r->np < want) {
			r->pages[r->np] = r->np;
			r->np++;
		}
		CHECK_OK(hel_model_prefill_image(m, 0, r->pages, r->np, st, parts[p], NULL));
		st += (size_t)parts[p] * hel_model_core(m)->hidden;
		c += parts[p];
	}
	n = 0;
	for (const char *s = after; *s; s++)
		tok[n++] = (uint8_t)*s;
	want = (uint32_t)((c + n) / pt);
	while (r->np < want) {
		r->pages[r->np] = r->np;
		r->np++;
	}
	CHECK_OK(hel_model_prefill(m, 0, r->pages, r->np, tok, n, logits));
}

static void test_model(void)
{
	hel_core *c = load("vision-small"), *tiny;
	CHECK_OK(hel_core_builtin(&tiny));
	hel_model_opts o = {.mode = SEL_MODE_ORDINARY, .pages = 64, .rows = 2};
	struct run r = {0};
	CHECK_OK(hel_model_create(c, &o, &r.m));
	const uint32_t H = c->hidden, V = c->vocab;

	uint8_t *px = img_pattern(31, 29, 3, 31);
	hel_image im = {.format = HEL_IMAGE_PNG,
			.color = HEL_COLOR_RGB,
			.width = 31,
			.height = 29,
			.channels = 3,
			.pixels = px,
			.bytes = 31 * 29 * 3,
			.capacity = 31 * 29 * 3};
	sel_input_source d;
	sel_input_rec rec;
	prepare(c, &im, &d, &rec);
	CHECK(d.tokens == 16); /* round(29 / 8) x round(31 / 8) */
	uint32_t *states = malloc((size_t)d.tokens * H * 4), *s2 = malloc((size_t)d.tokens * H * 4);
	CHECK_RC(hel_model_image_states(r.m, &rec, states), (int)d.tokens);
	int32_t *l0 = malloc(V * 4), *l1 = malloc(V * 4);
	/* A prefix long enough that the image crosses the first page. */
	const char *before = "user: here is a long enough prefix of text so the image... ";
	run_prompt(&r, states, d.tokens, 0, before, " and what is in it?", l0);
	CHECK_OK(hel_model_check(r.m));
	/* Chunked at any point: the same logits. */
	for (uint32_t split = 1; split < d.tokens; split += 5) {
		run_prompt(&r, states, d.tokens, split, before, " and what is in it?", l1);
		CHECK(memcmp(l0, l1, V * 4) == 0);
	}
	/* The image feeds later tokens: without it, or with another, other logits. */
	run_prompt(&r, states, d.tokens / 2, 0, before, " and what is in it?", l1);
	CHECK(memcmp(l0, l1, V * 4) != 0);

	/* Every byte of the prepared tensors matters. */
	uint8_t *pb = sel_input_data(&rec, 0);
	uint64_t pbytes = rec.h.tensors[0].bytes, flips = 0;
	for (uint64_t i = 0; i < pbytes; i += FLIP_STRIDE) {
		pb[i] ^= (uint8_t)(1u << (i % 8));
		CHECK_RC(hel_model_image_states(r.m, &rec, s2), (int)d.tokens);
		run_prompt(&r, s2, d.tokens, 0, before, " and what is in it?", l1);
		CHECKF(memcmp(l0, l1, V * 4) != 0, "flipping prepared byte %llu changes nothing",
		       (unsigned long long)i);
		pb[i] ^= (uint8_t)(1u << (i % 8));
		flips++;
	}
	/* The grid tensor: a changed grid is refused or changes the states. */
	uint8_t *gb = sel_input_data(&rec, 1);
	for (int i = 0; i < 8; i++) {
		gb[i] ^= 1;
		int rc = hel_model_image_states(r.m, &rec, s2);
		if (rc >= 0) {
			CHECK(rc == (int)d.tokens);
			CHECK(memcmp(s2, states, (size_t)d.tokens * H * 4) != 0);
		} else {
			CHECK(rc == -EINVAL);
		}
		gb[i] ^= 1;
	}
	printf("flipped %llu of %llu prepared bytes, each changed the logits\n",
	       (unsigned long long)flips, (unsigned long long)pbytes);
	CHECK_RC(hel_model_image_states(r.m, &rec, s2), (int)d.tokens);
	CHECK(memcmp(s2, states, (size_t)d.tokens * H * 4) == 0);

	/* A plain step of the image token is refused on a vision core; text
	 * cores take no images. */
	CHECK_OK(hel_model_row_init(r.m, 1));
	hel_token it = HEL_TOK_IMAGE;
	CHECK_RC(hel_model_prefill(r.m, 1, NULL, 0, &it, 1, NULL), -EINVAL);
	hel_model *tm;
	CHECK_OK(hel_model_create(tiny, &o, &tm));
	CHECK_OK(hel_model_row_init(tm, 0));
	CHECK_RC(hel_model_prefill_image(tm, 0, NULL, 0, states, 1, NULL), -EINVAL);
	CHECK_RC(hel_model_image_states(tm, &rec, s2), -EINVAL);
	hel_model_destroy(tm);

	free(states);
	free(s2);
	free(l0);
	free(l1);
	free(px);
	sel_input_rec_free(&rec);
	hel_model_destroy(r.m);
	hel_core_free(c);
	hel_core_free(tiny);
}

int main(void)
{
	lim = hel_image_limits_default();
	test_core_section();
	test_grid();
	test_convert();
	test_identities();
	test_prepare();
	test_model();
	printf("test_vision: ok\n");
	return 0;
}
