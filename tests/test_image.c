/*
 * test_image.c - image decoding and data: URLs (src/helios/image.c, design
 * 2.13): every PNG and JPEG variant into the decoded representation,
 * limits and decompression bombs refused from the header before decoding,
 * corrupt and truncated input as errors (never a crash), data URL parsing.
 *
 *   test_image --write-corpus DIR   writes fuzz/corpus/image/
 */
#include <sys/stat.h>

#include <png.h>
#include <jpeglib.h>
#include <sodium.h>

#include "eos.h"
#include "helios/image.h"
#include "imgutil.h"
#include "testutil.h"

static hel_image_limits lim;

static void decode_ok(const struct imgbuf *b, hel_image *img)
{
	CHECK_OK(hel_image_decode(b->b, b->n, &lim, img));
}

/* 16-bit big-endian rows from 8-bit samples scaled by 257 (exactly v again). */
static uint8_t *widen(const uint8_t *p, size_t n)
{
	uint8_t *o = malloc(2 * n);
	for (size_t i = 0; i < n; i++)
		o[2 * i] = o[2 * i + 1] = p[i];
	return o;
}

static void test_png_rgb_variants(void)
{
	const uint32_t w = 23, h = 17;
	uint8_t *rgb = img_pattern(w, h, 3, 1);
	struct imgbuf b = {0};
	hel_image img;

	img_png(&b, w, h, PNG_COLOR_TYPE_RGB, 8, rgb, w * 3, NULL);
	decode_ok(&b, &img);
	CHECK(img.format == HEL_IMAGE_PNG && img.color == HEL_COLOR_RGB && img.channels == 3);
	CHECK(img.width == w && img.height == h && img.bytes == w * h * 3 && img.source_bits == 8);
	CHECK(memcmp(img.pixels, rgb, img.bytes) == 0);
	hel_image_free(&img);
	imgbuf_free(&b);

	/* 16 bits: v x 257 scales back to v exactly. */
	uint8_t *wide = widen(rgb, (size_t)w * h * 3);
	img_png(&b, w, h, PNG_COLOR_TYPE_RGB, 16, wide, w * 6, NULL);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_RGB && img.source_bits == 16);
	CHECK(memcmp(img.pixels, rgb, img.bytes) == 0);
	hel_image_free(&img);
	imgbuf_free(&b);

	/* 16 bits, arbitrary: round(v x 255 / 65535). */
	for (size_t i = 0; i < (size_t)w * h * 3; i++) {
		uint16_t v = (uint16_t)(i * 2654435761u >> 7);
		wide[2 * i] = (uint8_t)(v >> 8);
		wide[2 * i + 1] = (uint8_t)v;
	}
	img_png(&b, w, h, PNG_COLOR_TYPE_RGB, 16, wide, w * 6, NULL);
	decode_ok(&b, &img);
	for (size_t i = 0; i < img.bytes; i++) {
		uint32_t v = (uint32_t)wide[2 * i] << 8 | wide[2 * i + 1];
		CHECKF(img.pixels[i] == (v * 255 + 32767) / 65535, "sample %zu: %u -> %u", i, v,
		       img.pixels[i]);
	}
	hel_image_free(&img);
	imgbuf_free(&b);
	free(wide);

	/* Interlaced: the same pixels. */
	struct img_png_opts il = {.interlace = true};
	img_png(&b, w, h, PNG_COLOR_TYPE_RGB, 8, rgb, w * 3, &il);
	decode_ok(&b, &img);
	CHECK(memcmp(img.pixels, rgb, img.bytes) == 0);
	hel_image_free(&img);
	imgbuf_free(&b);

	/* Palette: expanded to RGB; with tRNS to RGBA. */
	uint8_t pal[16 * 3], idx[w * h], trns[16];
	for (int i = 0; i < 16; i++) {
		pal[3 * i] = (uint8_t)(i * 16);
		pal[3 * i + 1] = (uint8_t)(255 - i * 9);
		pal[3 * i + 2] = (uint8_t)(i * i);
		trns[i] = (uint8_t)(i * 17);
	}
	for (uint32_t i = 0; i < w * h; i++)
		idx[i] = (uint8_t)(rgb[3 * i] % 16);
	struct img_png_opts po = {.palette = pal, .n_palette = 16};
	img_png(&b, w, h, PNG_COLOR_TYPE_PALETTE, 8, idx, w, &po);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_RGB);
	for (uint32_t i = 0; i < w * h; i++)
		CHECK(memcmp(img.pixels + 3 * i, pal + 3 * idx[i], 3) == 0);
	hel_image_free(&img);
	imgbuf_free(&b);
	po.trns = trns;
	po.n_trns = 16;
	img_png(&b, w, h, PNG_COLOR_TYPE_PALETTE, 8, idx, w, &po);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_RGBA && img.channels == 4);
	for (uint32_t i = 0; i < w * h; i++) {
		CHECK(memcmp(img.pixels + 4 * i, pal + 3 * idx[i], 3) == 0);
		CHECK(img.pixels[4 * i + 3] == trns[idx[i]]);
	}
	hel_image_free(&img);
	imgbuf_free(&b);

	/* RGBA. */
	uint8_t *rgba = img_pattern(w, h, 4, 2);
	img_png(&b, w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, w * 4, NULL);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_RGBA && memcmp(img.pixels, rgba, img.bytes) == 0);
	hel_image_free(&img);
	imgbuf_free(&b);
	free(rgba);

	/* RGB with a tRNS key colour: alpha 0 exactly there. */
	struct img_png_opts ko = {.n_trns = 1};
	ko.trns_rgb[0] = rgb[0];
	ko.trns_rgb[1] = rgb[1];
	ko.trns_rgb[2] = rgb[2];
	img_png(&b, w, h, PNG_COLOR_TYPE_RGB, 8, rgb, w * 3, &ko);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_RGBA);
	for (uint32_t i = 0; i < w * h; i++) {
		bool key = memcmp(rgb + 3 * i, rgb, 3) == 0;
		CHECK(img.pixels[4 * i + 3] == (key ? 0 : 255));
	}
	hel_image_free(&img);
	imgbuf_free(&b);
	free(rgb);
}

static void test_png_gray_variants(void)
{
	const uint32_t w = 19, h = 7;
	uint8_t *g8 = img_pattern(w, h, 1, 3);
	struct imgbuf b = {0};
	hel_image img;

	for (int depth = 1; depth <= 16; depth *= 2) {
		/* Pack samples of `depth` bits, MSB first. */
		size_t stride = depth == 16 ? w * 2 : (w * (size_t)depth + 7) / 8;
		uint8_t *rows = calloc(h, stride);
		uint32_t maxv = depth == 16 ? 65535 : (1u << depth) - 1;
		for (uint32_t y = 0; y < h; y++)
			for (uint32_t x = 0; x < w; x++) {
				uint32_t v = g8[y * w + x] * maxv / 255;
				uint8_t *r = rows + y * stride;
				if (depth == 16) {
					r[2 * x] = (uint8_t)(v >> 8);
					r[2 * x + 1] = (uint8_t)v;
				} else if (depth == 8) {
					r[x] = (uint8_t)v;
				} else {
					uint32_t bit = x * (uint32_t)depth;
					r[bit / 8] |= (uint8_t)(v << (8 - depth - bit % 8));
				}
			}
		img_png(&b, w, h, PNG_COLOR_TYPE_GRAY, depth, rows, stride, NULL);
		decode_ok(&b, &img);
		CHECK(img.color == HEL_COLOR_GRAY && img.channels == 1 &&
		      img.source_bits == (uint32_t)depth);
		for (uint32_t i = 0; i < w * h; i++) {
			uint32_t v = g8[i] * maxv / 255;
			uint32_t want = depth == 16 ? (v * 255 + 32767) / 65535 : v * 255 / maxv;
			CHECKF(img.pixels[i] == want, "depth %d pixel %u: %u, want %u", depth, i,
			       img.pixels[i], want);
		}
		hel_image_free(&img);
		imgbuf_free(&b);
		free(rows);
	}

	/* Gray + alpha. */
	uint8_t *ga = img_pattern(w, h, 2, 4);
	img_png(&b, w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga, w * 2, NULL);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_GRAY_ALPHA && img.channels == 2);
	CHECK(memcmp(img.pixels, ga, img.bytes) == 0);
	hel_image_free(&img);
	imgbuf_free(&b);
	free(ga);

	/* Gray with a tRNS key: gray + alpha. */
	struct img_png_opts ko = {.n_trns = 1, .trns_gray = g8[0]};
	img_png(&b, w, h, PNG_COLOR_TYPE_GRAY, 8, g8, w, &ko);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_GRAY_ALPHA);
	for (uint32_t i = 0; i < w * h; i++)
		CHECK(img.pixels[2 * i] == g8[i] &&
		      img.pixels[2 * i + 1] == (g8[i] == g8[0] ? 0 : 255));
	hel_image_free(&img);
	imgbuf_free(&b);
	free(g8);
}

static double mean_abs_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += abs((int)a[i] - (int)b[i]);
	return s / (double)n;
}

static void test_jpeg_variants(void)
{
	const uint32_t w = 40, h = 24;
	struct imgbuf b = {0};
	hel_image img, again;

	uint8_t *rgb = img_smooth(w, h, 3, 5);
	img_jpeg(&b, w, h, 3, rgb, 95, false);
	decode_ok(&b, &img);
	CHECK(img.format == HEL_IMAGE_JPEG && img.color == HEL_COLOR_RGB && img.channels == 3);
	CHECK(img.width == w && img.height == h && img.source_bits == 8);
	double d = mean_abs_diff(img.pixels, rgb, img.bytes);
	CHECKF(d < 8, "mean difference %.2f", d);
	decode_ok(&b, &again);
	CHECK(memcmp(img.pixels, again.pixels, img.bytes) == 0); /* deterministic */
	hel_image_free(&again);
	hel_image_free(&img);
	imgbuf_free(&b);

	img_jpeg(&b, w, h, 3, rgb, 90, true);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_RGB && mean_abs_diff(img.pixels, rgb, img.bytes) < 10);
	hel_image_free(&img);
	imgbuf_free(&b);

	uint8_t *g = img_smooth(w, h, 1, 6);
	img_jpeg(&b, w, h, 1, g, 95, false);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_GRAY && img.channels == 1 &&
	      mean_abs_diff(img.pixels, g, img.bytes) < 6);
	hel_image_free(&img);
	imgbuf_free(&b);
	free(g);

	/* CMYK: libjpeg writes an Adobe marker, so the stored values are the
	 * inverted (Photoshop) convention and decode back to ink amounts. */
	uint8_t *ink = img_smooth(w, h, 4, 7), *stored = malloc((size_t)w * h * 4);
	for (size_t i = 0; i < (size_t)w * h * 4; i++)
		stored[i] = (uint8_t)(255 - ink[i]);
	img_jpeg(&b, w, h, 4, stored, 95, false);
	decode_ok(&b, &img);
	CHECK(img.color == HEL_COLOR_CMYK && img.channels == 4);
	d = mean_abs_diff(img.pixels, ink, img.bytes);
	CHECKF(d < 8, "cmyk mean difference %.2f", d);
	hel_image_free(&img);
	imgbuf_free(&b);
	free(ink);
	free(stored);
	free(rgb);
}

/* A progressive JPEG whose scan script has 570 scans (every AC coefficient
 * of every component on its own, in three successive approximation
 * steps): a valid file that costs a pass over the coefficients per scan. */
static void test_jpeg_scan_bomb(void)
{
	const uint32_t w = 16, h = 16;
	uint8_t *rgb = img_pattern(w, h, 3, 8);
	static jpeg_scan_info scans[600];
	int n = 0;
	for (int ah = 0; ah < 3; ah++) {
		int al = ah == 0 ? 2 : ah == 1 ? 1 : 0, prev = ah == 0 ? 0 : ah == 1 ? 2 : 1;
		scans[n] = (jpeg_scan_info){3, {0, 1, 2, 0}, 0, 0, prev, al};
		n++;
	}
	for (int c = 0; c < 3; c++)
		for (int k = 1; k < 64; k++)
			for (int s = 0; s < 3; s++) {
				int ah = s == 0   ? 0
					 : s == 1 ? 2
						  : 1,
				    al = s == 0   ? 2
					 : s == 1 ? 1
						  : 0;
				scans[n] = (jpeg_scan_info){1, {c, 0, 0, 0}, k, k, ah, al};
				n++;
			}
	CHECK(n == 570);
	struct jpeg_compress_struct ci;
	struct jpeg_error_mgr err;
	unsigned char *mem = NULL;
	unsigned long mem_len = 0;
	ci.err = jpeg_std_error(&err);
	jpeg_create_compress(&ci);
	jpeg_mem_dest(&ci, &mem, &mem_len);
	ci.image_width = w;
	ci.image_height = h;
	ci.input_components = 3;
	ci.in_color_space = JCS_RGB;
	jpeg_set_defaults(&ci);
	ci.scan_info = scans;
	ci.num_scans = n;
	jpeg_start_compress(&ci, TRUE);
	while (ci.next_scanline < h) {
		JSAMPROW row = rgb + (size_t)ci.next_scanline * w * 3;
		jpeg_write_scanlines(&ci, &row, 1);
	}
	jpeg_finish_compress(&ci);
	jpeg_destroy_compress(&ci);
	hel_image img;
	int rc = hel_image_decode(mem, mem_len, &lim, &img);
	CHECK_RC(rc, SEL_EOVERSIZE);
	CHECKF(strstr(sel_errmsg(), "more than 256 scans"), "%s", sel_errmsg());
	CHECK(img.pixels == NULL);
	free(mem);
	free(rgb);
}

/* Refused from the header: the files below hold no image data at all, so
 * a decoder that read past the header would fail with SEL_EFORMAT. */
static void test_bombs(void)
{
	struct imgbuf b = {0};
	hel_image img;
	static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	const uint32_t dims[][2] = {{20000, 20000}, {100000, 100000}, {65535, 65535}, {1, 70000}};
	for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
		uint8_t ihdr[13] = {0};
		for (int k = 0; k < 4; k++) {
			ihdr[k] = (uint8_t)(dims[i][0] >> (24 - 8 * k));
			ihdr[4 + k] = (uint8_t)(dims[i][1] >> (24 - 8 * k));
		}
		ihdr[8] = 8;
		ihdr[9] = 2; /* RGB */
		b.n = 0;
		imgbuf_put(&b, sig, 8);
		img_png_chunk(&b, "IHDR", ihdr, 13);
		static const uint8_t junk[6] = {0x78, 0x9c, 1, 2, 3, 4};
		img_png_chunk(&b, "IDAT", junk, sizeof junk);
		uint32_t pw = 0, ph = 0;
		CHECK_RC(hel_image_probe(b.b, b.n, &lim, NULL, &pw, &ph), SEL_EOVERSIZE);
		CHECK_RC(hel_image_decode(b.b, b.n, &lim, &img), SEL_EOVERSIZE);
		CHECKF(strstr(sel_errmsg(), "refused before decoding"), "%s", sel_errmsg());
		CHECK(img.pixels == NULL && img.width == 0);
	}
	imgbuf_free(&b);

	/* JPEG: a real file with its SOF dimensions patched (JPEG has no CRC);
	 * the scan data is for 8 x 8, so decoding it would fail otherwise. */
	uint8_t *rgb = img_pattern(8, 8, 3, 9);
	img_jpeg(&b, 8, 8, 3, rgb, 80, false);
	size_t sof = 0;
	for (size_t i = 2; i + 9 < b.n; i++)
		if (b.b[i] == 0xff && b.b[i + 1] == 0xc0) {
			sof = i;
			break;
		}
	CHECK(sof);
	b.b[sof + 5] = 0xea; /* height 60000 */
	b.b[sof + 6] = 0x60;
	b.b[sof + 7] = 0xea; /* width 60000 */
	b.b[sof + 8] = 0x60;
	uint32_t jw = 0, jh = 0;
	CHECK_RC(hel_image_probe(b.b, b.n, &lim, NULL, &jw, &jh), SEL_EOVERSIZE);
	CHECK_RC(hel_image_decode(b.b, b.n, &lim, &img), SEL_EOVERSIZE);
	CHECKF(strstr(sel_errmsg(), "60000 x 60000"), "%s", sel_errmsg());
	imgbuf_free(&b);

	/* A real image over a small pixel limit, and over the encoded limit. */
	img_jpeg(&b, 8, 8, 3, rgb, 80, false);
	hel_image_limits small = lim;
	small.max_pixels = 63;
	CHECK_RC(hel_image_decode(b.b, b.n, &small, &img), SEL_EOVERSIZE);
	small = lim;
	small.max_encoded_bytes = b.n - 1;
	CHECK_RC(hel_image_decode(b.b, b.n, &small, &img), SEL_EOVERSIZE);
	CHECKF(strstr(sel_errmsg(), "encoded bytes"), "%s", sel_errmsg());
	small.max_encoded_bytes = b.n;
	hel_image_format f;
	CHECK_OK(hel_image_probe(b.b, b.n, &small, &f, &jw, &jh));
	CHECK(f == HEL_IMAGE_JPEG && jw == 8 && jh == 8);
	CHECK_OK(hel_image_decode(b.b, b.n, &small, &img));
	hel_image_free(&img);
	imgbuf_free(&b);
	free(rgb);

	/* A compressed text chunk whose "compressed" data is garbage: skipped
	 * unread, so it can be neither a zlib bomb nor an error. */
	uint8_t *px = img_pattern(4, 4, 3, 10);
	img_png(&b, 4, 4, PNG_COLOR_TYPE_RGB, 8, px, 12, NULL);
	struct imgbuf c = {0};
	static const char ztxt[] = "Comment\0\0\x78\x9c garbage",
			  iccp[] = "icc\0\0\x78\x9c\xff\xff\xff";
	img_png_chunk(&c, "zTXt", (const uint8_t *)ztxt, sizeof ztxt - 1);
	img_png_chunk(&c, "iCCP", (const uint8_t *)iccp, sizeof iccp - 1);
	/* Insert after IHDR (8 + 25 bytes). */
	uint8_t *merged = malloc(b.n + c.n);
	memcpy(merged, b.b, 33);
	memcpy(merged + 33, c.b, c.n);
	memcpy(merged + 33 + c.n, b.b + 33, b.n - 33);
	CHECK_OK(hel_image_decode(merged, b.n + c.n, &lim, &img));
	CHECK(memcmp(img.pixels, px, 48) == 0);
	hel_image_free(&img);
	free(merged);
	imgbuf_free(&b);
	imgbuf_free(&c);
	free(px);
}

/* Every prefix and many byte flips of a PNG and a JPEG: an error or a
 * decode, never a crash (ASan runs this too). */
static void test_corrupt(void)
{
	struct imgbuf png = {0}, jpg = {0};
	uint8_t *px = img_pattern(12, 9, 3, 11);
	img_png(&png, 12, 9, PNG_COLOR_TYPE_RGB, 8, px, 36, NULL);
	img_jpeg(&jpg, 12, 9, 3, px, 85, true);
	struct imgbuf *files[2] = {&png, &jpg};
	hel_image img;
	for (int f = 0; f < 2; f++) {
		struct imgbuf *b = files[f];
		for (size_t n = 0; n < b->n; n++) {
			uint8_t *cut = malloc(n ? n : 1);
			memcpy(cut, b->b, n);
			int rc = hel_image_decode(cut, n, &lim, &img);
			CHECKF(rc == SEL_EFORMAT, "%s cut at %zu: rc %d (%s)", f ? "jpeg" : "png",
			       n, rc, sel_errmsg());
			CHECK(*sel_errmsg() && !strchr(sel_errmsg(), '\n'));
			free(cut);
		}
		test_rng rng;
		test_rng_init(&rng, test_seed());
		uint8_t *copy = malloc(b->n);
		for (int t = 0; t < 400; t++) {
			memcpy(copy, b->b, b->n);
			int flips = 1 + (int)test_rng_below(&rng, 4);
			for (int k = 0; k < flips; k++)
				copy[test_rng_below(&rng, b->n)] ^=
					(uint8_t)(1 + test_rng_below(&rng, 255));
			int rc = hel_image_decode(copy, b->n, &lim, &img);
			CHECK(rc == 0 || rc == SEL_EFORMAT || rc == SEL_EOVERSIZE);
			if (rc == 0) {
				CHECK(img.bytes == (size_t)img.width * img.height * img.channels);
				hel_image_free(&img);
			}
		}
		free(copy);
	}
	/* A PNG with one IDAT byte changed fails its CRC: an error. */
	size_t idat = 0;
	for (size_t i = 8; i + 8 < png.n; i++)
		if (memcmp(png.b + i, "IDAT", 4) == 0) {
			idat = i;
			break;
		}
	CHECK(idat);
	png.b[idat + 6] ^= 1;
	CHECK_RC(hel_image_decode(png.b, png.n, &lim, &img), SEL_EFORMAT);
	CHECKF(strstr(sel_errmsg(), "png"), "%s", sel_errmsg());
	CHECK_RC(hel_image_decode("GIF89a....", 10, &lim, &img), SEL_EFORMAT);
	CHECK_RC(hel_image_decode(NULL, 0, &lim, &img), SEL_EFORMAT);
	imgbuf_free(&png);
	imgbuf_free(&jpg);
	free(px);
}

/* ---- data: URLs ------------------------------------------------------------ */

static char *b64(const uint8_t *p, size_t n, int variant)
{
	size_t cap = sodium_base64_ENCODED_LEN(n, variant);
	char *s = malloc(cap);
	sodium_bin2base64(s, cap, p, n, variant);
	return s;
}

static void url_ok(const char *url, const char *mt, const uint8_t *want, size_t n)
{
	hel_data_url u;
	int rc = hel_data_url_parse(url, strlen(url), &lim, &u);
	CHECKF(rc == 0, "'%.60s': %s", url, sel_errmsg());
	CHECK(strcmp(u.media_type, mt) == 0 && u.len == n && memcmp(u.bytes, want, n) == 0);
	hel_data_url_free(&u);
	CHECK(u.bytes == NULL);
}

static void url_bad(const char *url, int want, const char *needle)
{
	hel_data_url u;
	int rc = hel_data_url_parse(url, url ? strlen(url) : 0, &lim, &u);
	CHECKF(rc == want, "'%.60s': rc %d (%s), want %d", url, rc, sel_errmsg(), want);
	CHECKF(strstr(sel_errmsg(), needle), "'%.60s': message '%s' lacks '%s'", url, sel_errmsg(),
	       needle);
	CHECK(u.bytes == NULL && u.len == 0);
}

static void test_data_urls(void)
{
	uint8_t data[100];
	for (int i = 0; i < 100; i++)
		data[i] = (uint8_t)(i * 7 + 3);
	char url[1024];
	for (size_t n = 1; n <= 100; n += 33) {
		char *s = b64(data, n, sodium_base64_VARIANT_ORIGINAL);
		snprintf(url, sizeof url, "data:image/png;base64,%s", s);
		url_ok(url, "image/png", data, n);
		snprintf(url, sizeof url, "DATA:Image/JPEG;base64,%s", s);
		url_ok(url, "image/jpeg", data, n);
		snprintf(url, sizeof url, "data:image/jpg;name=a.jpg;BASE64,%s", s);
		url_ok(url, "image/jpeg", data, n);
		/* Whitespace and line breaks inside the data, and after it. */
		char *sp = malloc(3 * strlen(s) + 8), *q = sp;
		for (size_t i = 0; s[i]; i++) {
			*q++ = s[i];
			if (i % 5 == 4)
				*q++ = i % 2 ? '\n' : ' ';
		}
		strcpy(q, "\r\n");
		snprintf(url, sizeof url, "data:image/png;base64,%s", sp);
		url_ok(url, "image/png", data, n);
		free(sp);
		free(s);
		/* No padding; URL-safe alphabet. */
		s = b64(data, n, sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
		snprintf(url, sizeof url, "data:image/png;base64,%s", s);
		url_ok(url, "image/png", data, n);
		free(s);
		s = b64(data, n, sodium_base64_VARIANT_URLSAFE);
		snprintf(url, sizeof url, "data:image/png;base64,%s", s);
		url_ok(url, "image/png", data, n);
		free(s);
	}
	url_bad("https://example.com/cat.png", SEL_EFORMAT, "scheme 'https' is not supported");
	url_bad("HTTP://example.com/cat.png", SEL_EFORMAT, "scheme 'HTTP'");
	url_bad("file:///etc/passwd", SEL_EFORMAT, "scheme 'file'");
	url_bad("ftp://x/y.png", SEL_EFORMAT, "does not fetch");
	url_bad("cat.png", SEL_EFORMAT, "not a URL");
	url_bad("", SEL_EFORMAT, "not a URL");
	url_bad(NULL, SEL_EFORMAT, "not a URL");
	url_bad("data:image/png;base64", SEL_EFORMAT, "no ','");
	url_bad("data:;base64,AAAA", SEL_EFORMAT, "no media type");
	url_bad("data:image/gif;base64,R0lGOD", SEL_EFORMAT, "'image/gif' is not supported");
	url_bad("data:text/plain,hello", SEL_EFORMAT, "'text/plain'");
	url_bad("data:image/png,%89PNG", SEL_EFORMAT, "not base64-encoded");
	url_bad("data:image/png;base64;x=y,AAAA", SEL_EFORMAT, "must come last");
	url_bad("data:image/png;junk;base64,AAAA", SEL_EFORMAT, "'junk' is not attribute=value");
	url_bad("data:image/png;base64,", SEL_EFORMAT, "no data");
	url_bad("data:image/png;base64,AA*A", SEL_EFORMAT, "'*' at byte 2");
	url_bad("data:image/png;base64,AA=A", SEL_EFORMAT, "after '='");
	url_bad("data:image/png;base64,A===", SEL_EFORMAT, "padding");
	url_bad("data:image/png;base64,A", SEL_EFORMAT, "not valid base64");

	/* The size limit from the text's length, before decoding. */
	hel_image_limits small = lim;
	small.max_encoded_bytes = 74;
	char *s = b64(data, 75, sodium_base64_VARIANT_ORIGINAL);
	snprintf(url, sizeof url, "data:image/png;base64,%s", s);
	hel_data_url u;
	CHECK_RC(hel_data_url_parse(url, strlen(url), &small, &u), SEL_EOVERSIZE);
	CHECKF(strstr(sel_errmsg(), "75 bytes (at most 74"), "%s", sel_errmsg());
	small.max_encoded_bytes = 75;
	CHECK_OK(hel_data_url_parse(url, strlen(url), &small, &u));
	hel_data_url_free(&u);
	free(s);

	/* A whole PNG through a data URL. */
	struct imgbuf b = {0};
	uint8_t *px = img_pattern(5, 5, 3, 12);
	img_png(&b, 5, 5, PNG_COLOR_TYPE_RGB, 8, px, 15, NULL);
	s = b64(b.b, b.n, sodium_base64_VARIANT_ORIGINAL);
	char *big = malloc(strlen(s) + 64);
	sprintf(big, "data:image/png;base64,%s", s);
	CHECK_OK(hel_data_url_parse(big, strlen(big), &lim, &u));
	hel_image img;
	CHECK_OK(hel_image_decode(u.bytes, u.len, &lim, &img));
	CHECK(memcmp(img.pixels, px, 75) == 0);
	hel_image_free(&img);
	hel_data_url_free(&u);
	free(big);
	free(s);
	free(px);
	imgbuf_free(&b);
}

static void test_count(void)
{
	CHECK_OK(hel_image_check_count(lim.max_images, &lim));
	CHECK_RC(hel_image_check_count(lim.max_images + 1, &lim), SEL_EOVERSIZE);
	CHECKF(strstr(sel_errmsg(), "17 images in the request (at most 16)"), "%s", sel_errmsg());
	CHECK(hel_image_cold_allowance(&lim) == lim.max_pixels * 8);
	CHECK(strcmp(hel_image_format_name(HEL_IMAGE_PNG), "png") == 0);
	CHECK(strcmp(hel_image_color_name(HEL_COLOR_CMYK), "cmyk") == 0);
}

/* ---- The fuzz corpus ---------------------------------------------------------- */

static void put_file(const char *dir, const char *name, const void *b, size_t n)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	CHECK(f && fwrite(b, 1, n, f) == n);
	fclose(f);
	CHECKF(n < 2048, "%s: %zu bytes (corpus files stay under 2 KiB)", name, n);
}

static void put_image(const char *dir, const char *name, struct imgbuf *b)
{
	put_file(dir, name, b->b, b->n);
	imgbuf_free(b);
}

/* Tiny real files of every variant, broken ones, bombs and URLs. */
static int write_corpus(const char *dir)
{
	struct imgbuf b = {0};
	uint8_t *rgb = img_pattern(8, 6, 3, 1), *rgba = img_pattern(7, 5, 4, 2);
	uint8_t *g = img_pattern(9, 4, 1, 3), *ga = img_pattern(5, 5, 2, 4);
	uint8_t *sm = img_smooth(16, 16, 4, 5);
	mkdir(dir, 0755);
	img_png(&b, 8, 6, PNG_COLOR_TYPE_RGB, 8, rgb, 24, NULL);
	put_file(dir, "truncated.png", b.b, b.n - 20);
	put_image(dir, "rgb8.png", &b);
	uint8_t *wide = widen(rgb, 8 * 6 * 3);
	img_png(&b, 8, 6, PNG_COLOR_TYPE_RGB, 16, wide, 48, NULL);
	put_image(dir, "rgb16.png", &b);
	struct img_png_opts il = {.interlace = true};
	img_png(&b, 7, 5, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba, 28, &il);
	put_image(dir, "rgba-interlaced.png", &b);
	uint8_t pal[12] = {0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255}, trns[4] = {0, 80, 160, 255};
	uint8_t idx[8 * 6];
	for (int i = 0; i < 48; i++)
		idx[i] = (uint8_t)(i % 4);
	struct img_png_opts po = {.palette = pal, .n_palette = 4, .trns = trns, .n_trns = 4};
	img_png(&b, 8, 6, PNG_COLOR_TYPE_PALETTE, 8, idx, 8, &po);
	put_image(dir, "palette-trns.png", &b);
	uint8_t bits[4] = {0xa5, 0x5a, 0xf0, 0x0f};
	img_png(&b, 8, 4, PNG_COLOR_TYPE_GRAY, 1, bits, 1, NULL);
	put_image(dir, "gray1.png", &b);
	img_png(&b, 9, 4, PNG_COLOR_TYPE_GRAY, 8, g, 9, NULL);
	put_image(dir, "gray8.png", &b);
	img_png(&b, 5, 5, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga, 10, NULL);
	put_image(dir, "gray-alpha.png", &b);
	img_jpeg(&b, 16, 16, 3, sm, 70, false);
	put_file(dir, "truncated.jpg", b.b, b.n / 2);
	put_image(dir, "rgb.jpg", &b);
	img_jpeg(&b, 16, 16, 3, sm, 70, true);
	put_image(dir, "progressive.jpg", &b);
	img_jpeg(&b, 9, 4, 1, g, 70, false);
	put_image(dir, "gray.jpg", &b);
	img_jpeg(&b, 16, 16, 4, sm, 60, false);
	put_image(dir, "cmyk.jpg", &b);
	/* A header announcing 20000 x 20000 before a few junk bytes. */
	static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
	uint8_t ihdr[13] = {0, 0, 0x4e, 0x20, 0, 0, 0x4e, 0x20, 8, 2, 0, 0, 0};
	imgbuf_put(&b, sig, 8);
	img_png_chunk(&b, "IHDR", ihdr, 13);
	img_png_chunk(&b, "IDAT", (const uint8_t *)"\x78\x9c\x01\x02", 4);
	put_image(dir, "bomb-header.png", &b);
	const char *urls[][2] = {
		{"url-https", "https://example.com/cat.png"},
		{"url-bad-base64", "data:image/png;base64,iVBO*w0KGgo="},
		{"url-gif", "data:image/gif;base64,R0lGODlhAQABAAAAACw="},
	};
	for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++)
		put_file(dir, urls[i][0], urls[i][1], strlen(urls[i][1]));
	img_png(&b, 4, 3, PNG_COLOR_TYPE_RGB, 8, rgb, 12, NULL);
	char *s = b64(b.b, b.n, sodium_base64_VARIANT_ORIGINAL);
	char url[2048];
	snprintf(url, sizeof url, "data:image/png;base64,%s", s);
	put_file(dir, "url-png", url, strlen(url));
	free(s);
	imgbuf_free(&b);
	free(wide);
	free(rgb);
	free(rgba);
	free(g);
	free(ga);
	free(sm);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
		return write_corpus(argv[2]);
	lim = hel_image_limits_default();
	test_png_rgb_variants();
	test_png_gray_variants();
	test_jpeg_variants();
	test_jpeg_scan_bomb();
	test_bombs();
	test_corrupt();
	test_data_urls();
	test_count();
	printf("test_image: ok\n");
	return 0;
}
