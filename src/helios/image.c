/*
 * image.c - data: URLs and PNG / JPEG decoding from memory (design 2.13,
 * "Source decoding"; docs/inputs.md).
 *
 * A prompt's image arrives as a data: URL in a chat message.  This file
 * turns the URL into encoded bytes (libsodium's base64 decoder) and the
 * bytes into the decoded representation of image.h (libpng, libjpeg-turbo),
 * refusing what is too big before it costs anything.
 *
 * DESIGN
 *   Memory only.  Both decoders read from the caller's buffer (a read
 *   callback that bounds-checks for libpng, jpeg_mem_src for libjpeg);
 *   there is no fetching of any kind, and another URL scheme is an error
 *   naming it.
 *   Bombs are refused from the header.  The pixel count of the header
 *   (PNG IHDR, JPEG SOF) is checked against the limit before any image data
 *   is decompressed and before the pixel buffer exists; a decoded image
 *   therefore never exceeds max_pixels x 4 bytes.  What the header cannot
 *   bound is bounded inside the libraries: libpng skips every ancillary
 *   chunk but tRNS unread (no zTXt / iCCP decompression at all), caps its
 *   chunk cache and chunk allocations; libjpeg's memory manager is capped
 *   (whole-image coefficient arrays of progressive files) and a progress
 *   monitor refuses files with absurd numbers of scans, the remaining
 *   time bomb of small JPEGs.
 *   Errors never crash.  libpng and libjpeg report errors by longjmp: each
 *   decode keeps everything it allocates after setjmp in a context struct
 *   reached through a pointer that is itself never modified after setjmp,
 *   so the recovery path sees the current values (C11 7.13.2.1) and frees
 *   them.  libjpeg's corrupt-data warnings (a truncated scan it would pad
 *   with grey) are errors too: an image is decoded exactly or not at all,
 *   so the same bytes always give the same pixels.
 *   Determinism: libpng's transforms are exact integer code; libjpeg runs
 *   the accurate integer IDCT (JDCT_ISLOW) with fancy upsampling, whose
 *   SIMD and C paths agree bit for bit.  Another libjpeg version may decode
 *   a JPEG differently: identities are over decoded pixels, so that gives
 *   cache misses, never wrong reuse.
 *
 * INVARIANTS
 *   1. A successful decode has 1 <= width, height <= HEL_IMAGE_SIDE_MAX,
 *      width x height <= lim->max_pixels, bytes = width x height x channels
 *      <= capacity, and channels = hel_image_color_channels(color).
 *   2. A failed call frees everything it allocated and leaves *out zeroed.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <sodium.h>

#include "eos.h"
#include "image.h"

#define PNG_CHUNK_CACHE 64           /* ancillary chunks libpng may store */
#define PNG_CHUNK_MALLOC (1u << 20)  /* largest chunk buffer libpng may allocate */
#define JPEG_MEM_SLACK (16ull << 20) /* libjpeg working memory above the pixels */

hel_image_limits hel_image_limits_default(void)
{
	return (hel_image_limits){.max_encoded_bytes = HEL_IMAGE_ENCODED_DEFAULT,
				  .max_pixels = HEL_IMAGE_PIXELS_DEFAULT,
				  .max_images = HEL_IMAGE_COUNT_DEFAULT};
}

int hel_image_check_count(uint32_t n, const hel_image_limits *l)
{
	if (n > l->max_images)
		return eos_fail(SEL_EOVERSIZE,
				"image: %" PRIu32 " images in the request (at most %" PRIu32 ")", n,
				l->max_images);
	return 0;
}

const char *hel_image_format_name(hel_image_format f)
{
	return f == HEL_IMAGE_PNG ? "png" : f == HEL_IMAGE_JPEG ? "jpeg" : NULL;
}

const char *hel_image_color_name(hel_image_color c)
{
	switch (c) {
	case HEL_COLOR_GRAY: return "gray";
	case HEL_COLOR_GRAY_ALPHA: return "gray+alpha";
	case HEL_COLOR_RGB: return "rgb";
	case HEL_COLOR_RGBA: return "rgba";
	case HEL_COLOR_CMYK: return "cmyk";
	}
	return "?";
}

uint32_t hel_image_color_channels(hel_image_color c)
{
	switch (c) {
	case HEL_COLOR_GRAY: return 1;
	case HEL_COLOR_GRAY_ALPHA: return 2;
	case HEL_COLOR_RGB: return 3;
	case HEL_COLOR_RGBA:
	case HEL_COLOR_CMYK: return 4;
	}
	return 0;
}

void hel_image_free(hel_image *img)
{
	if (!img)
		return;
	free(img->pixels);
	memset(img, 0, sizeof *img);
}

/* ---- data: URLs ------------------------------------------------------------ */

/* Up to 24 bytes of s for a message: printable ASCII, others as '?'. */
static const char *quote(const char *s, size_t n, char *buf, size_t cap)
{
	size_t k = n < cap - 4 ? n : cap - 4, i;
	for (i = 0; i < k; i++)
		buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
	if (k < n)
		memcpy(buf + i, "...", 4);
	else
		buf[i] = 0;
	return buf;
}

static bool b64_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

void hel_data_url_free(hel_data_url *u)
{
	if (!u)
		return;
	free(u->bytes);
	memset(u, 0, sizeof *u);
}

int hel_data_url_parse(const char *url, size_t len, const hel_image_limits *lim, hel_data_url *out)
{
	char q[32];
	memset(out, 0, sizeof *out);
	if (!url)
		len = 0;
	/* The scheme: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":" */
	size_t s = 0;
	while (s < len && s < 64 &&
	       ((url[s] >= 'a' && url[s] <= 'z') || (url[s] >= 'A' && url[s] <= 'Z') ||
		(s > 0 && ((url[s] >= '0' && url[s] <= '9') || url[s] == '+' || url[s] == '-' ||
			   url[s] == '.'))))
		s++;
	if (s == 0 || s >= len || url[s] != ':')
		return eos_fail(SEL_EFORMAT,
				"image url '%s' is not a URL (expected "
				"data:image/png;base64,... or data:image/jpeg;base64,...)",
				quote(url ? url : "", len, q, sizeof q));
	if (s != 4 || strncasecmp(url, "data", 4) != 0)
		return eos_fail(SEL_EFORMAT,
				"image url scheme '%s' is not supported: Flare does not "
				"fetch images (expected a data: URL, data:image/png;base64,...)",
				quote(url, s, q, sizeof q));
	const char *p = url + 5, *end = url + len;
	const char *comma = memchr(p, ',', (size_t)(end - p));
	if (!comma)
		return eos_fail(SEL_EFORMAT, "image data url has no ',' before its data (expected "
					     "data:image/png;base64,...)");
	/* Media type and parameters: type/subtype *(;attribute=value) ;base64 */
	const char *semi = memchr(p, ';', (size_t)(comma - p));
	const char *mt_end = semi ? semi : comma;
	size_t mt_len = (size_t)(mt_end - p);
	if (mt_len == 0)
		return eos_fail(SEL_EFORMAT,
				"image data url has no media type (expected image/png or "
				"image/jpeg)");
	if (mt_len >= sizeof out->media_type ||
	    !((mt_len == 9 && strncasecmp(p, "image/png", 9) == 0) ||
	      (mt_len == 10 && strncasecmp(p, "image/jpeg", 10) == 0) ||
	      (mt_len == 9 && strncasecmp(p, "image/jpg", 9) == 0)))
		return eos_fail(SEL_EFORMAT,
				"image data url media type '%s' is not supported "
				"(expected image/png or image/jpeg)",
				quote(p, mt_len, q, sizeof q));
	bool base64 = false;
	for (const char *a = semi; a && a < comma;) {
		const char *b = memchr(a + 1, ';', (size_t)(comma - a - 1));
		const char *e = b ? b : comma;
		size_t n = (size_t)(e - a - 1);
		if (n == 6 && strncasecmp(a + 1, "base64", 6) == 0) {
			if (e != comma)
				return eos_fail(SEL_EFORMAT,
						"image data url: ';base64' must come last, "
						"just before the ','");
			base64 = true;
		} else if (n == 0 || !memchr(a + 1, '=', n)) {
			return eos_fail(SEL_EFORMAT,
					"image data url parameter '%s' is not "
					"attribute=value",
					quote(a + 1, n, q, sizeof q));
		}
		a = b;
	}
	if (!base64)
		return eos_fail(SEL_EFORMAT, "image data url is not base64-encoded (expected "
					     ";base64 before the ',')");
	for (size_t i = 0; i < mt_len; i++)
		out->media_type[i] = (char)(p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]);
	if (strcmp(out->media_type, "image/jpg") == 0)
		strcpy(out->media_type, "image/jpeg");

	/* The data: its decoded size from the text, before decoding. */
	const char *d = comma + 1;
	size_t dn = (size_t)(end - d), sig = 0, pad = 0;
	bool urlsafe = false;
	for (size_t i = 0; i < dn; i++) {
		char c = d[i];
		if (b64_space(c))
			continue;
		if (c == '=') {
			pad++;
			continue;
		}
		if (pad)
			return eos_fail(SEL_EFORMAT,
					"image data url: base64 data continues after '=' "
					"padding (at byte %zu of the data)",
					i);
		if (c == '-' || c == '_')
			urlsafe = true;
		sig++;
	}
	if (pad > 2 || (pad && (sig + pad) % 4))
		return eos_fail(SEL_EFORMAT,
				"image data url: base64 data has wrong padding (%zu "
				"characters and %zu '=')",
				sig, pad);
	uint64_t bytes = (uint64_t)sig * 6 / 8;
	if (bytes > lim->max_encoded_bytes)
		return eos_fail(SEL_EOVERSIZE,
				"image data is %" PRIu64 " bytes (at most %" PRIu64
				" encoded bytes per image)",
				bytes, lim->max_encoded_bytes);
	if (sig == 0)
		return eos_fail(SEL_EFORMAT, "image data url has no data after the ','");
	uint8_t *bin = malloc(bytes ? bytes : 1);
	if (!bin)
		return eos_fail(-ENOMEM, "image data url: out of memory for %" PRIu64 " bytes",
				bytes);
	int variant = urlsafe ? (pad ? sodium_base64_VARIANT_URLSAFE
				     : sodium_base64_VARIANT_URLSAFE_NO_PADDING)
			      : (pad ? sodium_base64_VARIANT_ORIGINAL
				     : sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
	size_t got = 0;
	const char *stop = NULL;
	int brc = sodium_base642bin(bin, bytes ? bytes : 1, d, dn, " \t\r\n", &got, &stop, variant);
	while (brc == 0 && stop && stop < end && b64_space(*stop))
		stop++; /* whitespace after the padding */
	if (brc != 0 || stop != end) {
		size_t at = stop ? (size_t)(stop - d) : 0;
		free(bin);
		if (stop && stop < end)
			return eos_fail(SEL_EFORMAT,
					"image data url: '%s' at byte %zu of the data is not "
					"base64",
					quote(stop, 1, q, sizeof q), at);
		return eos_fail(SEL_EFORMAT, "image data url: the data is not valid base64");
	}
	out->bytes = bin;
	out->len = got;
	return 0;
}

/* ---- Formats and headers ------------------------------------------------------- */

static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

int hel_image_detect(const void *data, size_t len, hel_image_format *out)
{
	const uint8_t *b = data;
	if (len >= 8 && memcmp(b, png_sig, 8) == 0)
		*out = HEL_IMAGE_PNG;
	else if (len >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff)
		*out = HEL_IMAGE_JPEG;
	else
		return eos_fail(SEL_EFORMAT,
				"image: %zu bytes that are not a PNG or JPEG image "
				"(no PNG signature or JPEG SOI marker)",
				len);
	return 0;
}

static int check_size(uint64_t w, uint64_t h, const hel_image_limits *lim)
{
	if (w == 0 || h == 0)
		return eos_fail(SEL_EFORMAT, "image: %" PRIu64 " x %" PRIu64 " pixels (empty)", w,
				h);
	if (w > HEL_IMAGE_SIDE_MAX || h > HEL_IMAGE_SIDE_MAX || w * h > lim->max_pixels)
		return eos_fail(SEL_EOVERSIZE,
				"image: %" PRIu64 " x %" PRIu64 " = %" PRIu64
				" pixels is over the limit of %" PRIu64 " pixels, %u per side "
				"(refused before decoding)",
				w, h, w * h, lim->max_pixels, HEL_IMAGE_SIDE_MAX);
	return 0;
}

static int check_encoded(size_t len, const hel_image_limits *lim)
{
	if (len > lim->max_encoded_bytes)
		return eos_fail(SEL_EOVERSIZE, "image: %zu encoded bytes (at most %" PRIu64 ")",
				len, lim->max_encoded_bytes);
	return 0;
}

/* ---- PNG ------------------------------------------------------------------------ */

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

struct png_ctx {
	const uint8_t *data;
	size_t len, pos;
	char msg[160];
	/* Everything allocated after setjmp lives here (see DESIGN). */
	uint8_t *pixels;
	png_bytep *rows;
};

static void png_on_error(png_structp png, png_const_charp msg)
{
	struct png_ctx *c = png_get_error_ptr(png);
	snprintf(c->msg, sizeof c->msg, "%s", msg);
	png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg)
{
	(void)png;
	(void)msg; /* ancillary trouble: the chunk is skipped */
}

static void png_on_read(png_structp png, png_bytep out, size_t n)
{
	struct png_ctx *c = png_get_io_ptr(png);
	if (n > c->len - c->pos)
		png_error(png, "the data ends inside a chunk (truncated)");
	memcpy(out, c->data + c->pos, n);
	c->pos += n;
}

static int decode_png(const uint8_t *data, size_t len, const hel_image_limits *lim, hel_image *out,
		      bool header_only)
{
	struct png_ctx ctx = {.data = data, .len = len};
	struct png_ctx *c = &ctx;
	png_structp png =
		png_create_read_struct(PNG_LIBPNG_VER_STRING, c, png_on_error, png_on_warning);
	png_infop info = png ? png_create_info_struct(png) : NULL;
	int rc;

	/* IHDR is the first chunk (libpng insists): its dimensions decide
	 * before libpng runs at all, so a bomb is SEL_EOVERSIZE whatever
	 * libpng's own checks would call it. */
	if (len >= 24 && memcmp(data + 12, "IHDR", 4) == 0 &&
	    (rc = check_size(be32(data + 16), be32(data + 20), lim))) {
		png_destroy_read_struct(&png, &info, NULL);
		return rc;
	}
	if (!info) {
		png_destroy_read_struct(&png, NULL, NULL);
		return eos_fail(-ENOMEM, "image: png: out of memory");
	}
	if (setjmp(png_jmpbuf(png))) {
		rc = eos_fail(SEL_EFORMAT, "image: png: %s", c->msg);
		goto out;
	}
	png_set_read_fn(png, c, png_on_read);
	png_set_user_limits(png, HEL_IMAGE_SIDE_MAX, HEL_IMAGE_SIDE_MAX);
	png_set_chunk_cache_max(png, PNG_CHUNK_CACHE);
	png_set_chunk_malloc_max(png, PNG_CHUNK_MALLOC);
	/* Every chunk but IHDR, PLTE, tRNS, IDAT and IEND is skipped unread. */
	png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, NULL, -1);
	png_read_info(png, info);

	png_uint_32 w, h;
	int depth, ctype, interlace;
	png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
	if ((rc = check_size(w, h, lim)))
		goto out;
	out->format = HEL_IMAGE_PNG;
	out->width = w;
	out->height = h;
	out->source_bits = (uint32_t)depth;
	if (header_only)
		goto out;
	if (ctype == PNG_COLOR_TYPE_PALETTE)
		png_set_palette_to_rgb(png);
	if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8)
		png_set_expand_gray_1_2_4_to_8(png);
	if (png_get_valid(png, info, PNG_INFO_tRNS))
		png_set_tRNS_to_alpha(png);
	if (depth == 16)
		png_set_scale_16(png);
	png_set_interlace_handling(png);
	png_read_update_info(png, info);

	uint32_t ch = png_get_channels(png, info);
	size_t rowbytes = png_get_rowbytes(png, info);
	if (ch < 1 || ch > 4 || png_get_bit_depth(png, info) != 8 || rowbytes != (size_t)w * ch) {
		rc = eos_fail(SEL_EFORMAT,
			      "image: png: unexpected layout after expansion (%u channels, "
			      "%d bits, %zu bytes per row)",
			      ch, png_get_bit_depth(png, info), rowbytes);
		goto out;
	}
	out->color = (hel_image_color)ch; /* 1 gray, 2 gray+alpha, 3 rgb, 4 rgba */
	out->channels = ch;
	out->bytes = rowbytes * h;
	c->pixels = malloc(out->bytes);
	c->rows = malloc((size_t)h * sizeof *c->rows);
	if (!c->pixels || !c->rows) {
		rc = eos_fail(-ENOMEM, "image: png: out of memory for %zu bytes", out->bytes);
		goto out;
	}
	for (png_uint_32 y = 0; y < h; y++)
		c->rows[y] = c->pixels + (size_t)y * rowbytes;
	png_read_image(png, c->rows);
	png_read_end(png, NULL);
	out->pixels = c->pixels;
	out->capacity = out->bytes;
	c->pixels = NULL;
	rc = 0;
out:
	png_destroy_read_struct(&png, &info, NULL);
	free(c->pixels);
	free(c->rows);
	return rc;
}

/* ---- JPEG ------------------------------------------------------------------------ */

struct jpeg_ctx {
	struct jpeg_error_mgr err;
	struct jpeg_progress_mgr progress;
	jmp_buf jb;
	char msg[JMSG_LENGTH_MAX];
	int rc;          /* the code the error maps to */
	uint8_t *pixels; /* allocated after setjmp (see DESIGN) */
};

static void jpeg_on_error(j_common_ptr ci)
{
	struct jpeg_ctx *c = (struct jpeg_ctx *)ci->err;
	ci->err->format_message(ci, c->msg);
	int code = ci->err->msg_code;
	/* Its memory cap: a limit, not a broken file. */
	c->rc = code == JERR_OUT_OF_MEMORY || code == JERR_NO_BACKING_STORE ? SEL_EOVERSIZE
									    : SEL_EFORMAT;
	longjmp(c->jb, 1);
}

/* Warnings (level -1) are corrupt data: errors here, but for the two that
 * say nothing about the pixels. */
static void jpeg_on_message(j_common_ptr ci, int level)
{
	if (level >= 0)
		return;
	int code = ci->err->msg_code;
	if (code == JWRN_JFIF_MAJOR || code == JWRN_BOGUS_ICC)
		return;
	jpeg_on_error(ci);
}

static void jpeg_on_progress(j_common_ptr ci)
{
	struct jpeg_ctx *c = (struct jpeg_ctx *)ci->err;
	if (ci->is_decompressor &&
	    ((j_decompress_ptr)ci)->input_scan_number > HEL_IMAGE_JPEG_SCANS_MAX) {
		snprintf(c->msg, sizeof c->msg,
			 "more than %d scans (refused as a decoding time bomb)",
			 HEL_IMAGE_JPEG_SCANS_MAX);
		c->rc = SEL_EOVERSIZE;
		longjmp(c->jb, 1);
	}
}

static int decode_jpeg(const uint8_t *data, size_t len, const hel_image_limits *lim, hel_image *out,
		       bool header_only)
{
	struct jpeg_decompress_struct ci;
	struct jpeg_ctx ctx;
	struct jpeg_ctx *c = &ctx;
	int rc;

	memset(&ci, 0, sizeof ci);
	memset(c, 0, sizeof *c);
	ci.err = jpeg_std_error(&c->err);
	c->err.error_exit = jpeg_on_error;
	c->err.emit_message = jpeg_on_message;
	if (setjmp(c->jb)) {
		rc = eos_fail(c->rc, "image: jpeg: %s%s", c->msg,
			      c->rc == SEL_EOVERSIZE && !strstr(c->msg, "scans")
				      ? " (over the decoder's memory limit for this pixel limit)"
				      : "");
		goto out;
	}
	jpeg_create_decompress(&ci);
	ci.mem->max_memory_to_use = (long)(lim->max_pixels * 8 + JPEG_MEM_SLACK);
	c->progress.progress_monitor = jpeg_on_progress;
	ci.progress = &c->progress;
	jpeg_mem_src(&ci, data, (unsigned long)len);
	if (jpeg_read_header(&ci, TRUE) != JPEG_HEADER_OK) {
		rc = eos_fail(SEL_EFORMAT, "image: jpeg: tables only, no image");
		goto out;
	}
	if ((rc = check_size(ci.image_width, ci.image_height, lim)))
		goto out;
	out->format = HEL_IMAGE_JPEG;
	out->width = ci.image_width;
	out->height = ci.image_height;
	out->source_bits = (uint32_t)ci.data_precision;
	if (header_only)
		goto out;
	bool adobe = ci.saw_Adobe_marker;
	switch (ci.jpeg_color_space) {
	case JCS_GRAYSCALE:
		ci.out_color_space = JCS_GRAYSCALE;
		out->color = HEL_COLOR_GRAY;
		break;
	case JCS_CMYK:
	case JCS_YCCK:
		ci.out_color_space = JCS_CMYK;
		out->color = HEL_COLOR_CMYK;
		break;
	default:
		ci.out_color_space = JCS_RGB;
		out->color = HEL_COLOR_RGB;
		break;
	}
	ci.dct_method = JDCT_ISLOW;
	ci.do_fancy_upsampling = TRUE;
	ci.do_block_smoothing = TRUE;
	jpeg_start_decompress(&ci);
	out->channels = hel_image_color_channels(out->color);
	if ((uint32_t)ci.output_components != out->channels || ci.output_width != out->width ||
	    ci.output_height != out->height) {
		rc = eos_fail(SEL_EFORMAT,
			      "image: jpeg: unexpected output (%d components, %u x %u)",
			      ci.output_components, ci.output_width, ci.output_height);
		goto out;
	}
	size_t stride = (size_t)out->width * out->channels;
	out->bytes = stride * out->height;
	/* calloc: no byte is left unset should a scanline loop stop short. */
	if (!(c->pixels = calloc(1, out->bytes))) {
		rc = eos_fail(-ENOMEM, "image: jpeg: out of memory for %zu bytes", out->bytes);
		goto out;
	}
	while (ci.output_scanline < ci.output_height) {
		JSAMPROW row = c->pixels + (size_t)ci.output_scanline * stride;
		if (jpeg_read_scanlines(&ci, &row, 1) != 1) {
			rc = eos_fail(SEL_EFORMAT, "image: jpeg: no progress at row %u",
				      ci.output_scanline);
			goto out;
		}
	}
	jpeg_finish_decompress(&ci);
	if (out->color == HEL_COLOR_CMYK && adobe)
		for (size_t i = 0; i < out->bytes; i++)
			c->pixels[i] = (uint8_t)(255 - c->pixels[i]);
	out->pixels = c->pixels;
	out->capacity = out->bytes;
	c->pixels = NULL;
	rc = 0;
out:
	jpeg_destroy_decompress(&ci);
	free(c->pixels);
	return rc;
}

/* ---- Entry points ------------------------------------------------------------------- */

static int run(const void *data, size_t len, const hel_image_limits *lim, hel_image *out,
	       bool header_only)
{
	hel_image_format f;
	int rc;
	memset(out, 0, sizeof *out);
	if ((rc = check_encoded(len, lim)) || (rc = hel_image_detect(data, len, &f)))
		return rc;
	rc = f == HEL_IMAGE_PNG ? decode_png(data, len, lim, out, header_only)
				: decode_jpeg(data, len, lim, out, header_only);
	if (rc)
		memset(out, 0, sizeof *out);
	return rc;
}

int hel_image_probe(const void *data, size_t len, const hel_image_limits *lim,
		    hel_image_format *fmt, uint32_t *width, uint32_t *height)
{
	hel_image img;
	int rc = run(data, len, lim, &img, true);
	if (rc)
		return rc;
	if (fmt)
		*fmt = img.format;
	if (width)
		*width = img.width;
	if (height)
		*height = img.height;
	return 0;
}

int hel_image_decode(const void *data, size_t len, const hel_image_limits *lim, hel_image *out)
{
	return run(data, len, lim, out, false);
}
