/*
 * imgutil.c - test image encoders over libpng and libjpeg (see imgutil.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <png.h>

#include "imgutil.h"

void imgbuf_put(struct imgbuf *b, const void *p, size_t n)
{
	if (b->n + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->n + n)
			cap *= 2;
		uint8_t *nb = realloc(b->b, cap);
		if (!nb)
			abort();
		b->b = nb;
		b->cap = cap;
	}
	memcpy(b->b + b->n, p, n);
	b->n += n;
}

void imgbuf_free(struct imgbuf *b)
{
	free(b->b);
	memset(b, 0, sizeof *b);
}

static void png_write_cb(png_structp png, png_bytep data, size_t n)
{
	imgbuf_put(png_get_io_ptr(png), data, n);
}

static void png_flush_cb(png_structp png) { (void)png; }

static void png_fail(png_structp png, png_const_charp msg)
{
	(void)png;
	fprintf(stderr, "imgutil: png: %s\n", msg);
	abort();
}

void img_png(struct imgbuf *out, uint32_t w, uint32_t h, int color_type, int depth,
	     const uint8_t *rows, size_t stride, const struct img_png_opts *o)
{
	struct img_png_opts none = {0};
	if (!o)
		o = &none;
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, png_fail, NULL);
	png_infop info = png_create_info_struct(png);
	if (!png || !info)
		abort();
	png_set_write_fn(png, out, png_write_cb, png_flush_cb);
	png_set_compression_level(png, o->compression ? o->compression : 6);
	png_set_IHDR(png, info, w, h, depth, color_type,
		     o->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
		     PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
	if (color_type == PNG_COLOR_TYPE_PALETTE) {
		png_color pal[256];
		for (int i = 0; i < o->n_palette; i++) {
			pal[i].red = o->palette[3 * i];
			pal[i].green = o->palette[3 * i + 1];
			pal[i].blue = o->palette[3 * i + 2];
		}
		png_set_PLTE(png, info, pal, o->n_palette);
		if (o->n_trns)
			png_set_tRNS(png, info, o->trns, o->n_trns, NULL);
	} else if (o->n_trns) {
		png_color_16 key = {0};
		key.gray = o->trns_gray;
		key.red = o->trns_rgb[0];
		key.green = o->trns_rgb[1];
		key.blue = o->trns_rgb[2];
		png_set_tRNS(png, info, NULL, 0, &key);
	}
	png_write_info(png, info);
	int passes = png_set_interlace_handling(png);
	for (int p = 0; p < passes; p++)
		for (uint32_t y = 0; y < h; y++)
			png_write_row(png, rows + (size_t)y * stride);
	png_write_end(png, info);
	png_destroy_write_struct(&png, &info);
}

static void jpeg_fail(j_common_ptr ci)
{
	char msg[JMSG_LENGTH_MAX];
	ci->err->format_message(ci, msg);
	fprintf(stderr, "imgutil: jpeg: %s\n", msg);
	abort();
}

void img_jpeg(struct imgbuf *out, uint32_t w, uint32_t h, int components, const uint8_t *pix,
	      int quality, bool progressive)
{
	struct jpeg_compress_struct ci;
	struct jpeg_error_mgr err;
	unsigned char *mem = NULL;
	unsigned long mem_len = 0;
	ci.err = jpeg_std_error(&err);
	err.error_exit = jpeg_fail;
	jpeg_create_compress(&ci);
	jpeg_mem_dest(&ci, &mem, &mem_len);
	ci.image_width = w;
	ci.image_height = h;
	ci.input_components = components;
	ci.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
	jpeg_set_defaults(&ci);
	jpeg_set_quality(&ci, quality, TRUE);
	if (progressive)
		jpeg_simple_progression(&ci);
	jpeg_start_compress(&ci, TRUE);
	while (ci.next_scanline < h) {
		JSAMPROW row = (JSAMPROW)(pix + (size_t)ci.next_scanline * w * (size_t)components);
		jpeg_write_scanlines(&ci, &row, 1);
	}
	jpeg_finish_compress(&ci);
	jpeg_destroy_compress(&ci);
	imgbuf_put(out, mem, mem_len);
	free(mem);
}

uint8_t *img_pattern(uint32_t w, uint32_t h, uint32_t ch, uint32_t seed)
{
	uint8_t *p = malloc((size_t)w * h * ch);
	if (!p)
		abort();
	for (uint32_t y = 0; y < h; y++)
		for (uint32_t x = 0; x < w; x++)
			for (uint32_t c = 0; c < ch; c++) {
				uint32_t v = (x * 255 / (w > 1 ? w - 1 : 1)) * (c % 3 == 0) +
					     (y * 255 / (h > 1 ? h - 1 : 1)) * (c % 3 == 1) +
					     ((x ^ y) * 37 + seed * 11) * (c % 3 == 2);
				uint32_t hsh =
					(x * 73856093u) ^ (y * 19349663u) ^ (c * 83492791u) ^ seed;
				v += (hsh >> 13) & 15;
				p[((size_t)y * w + x) * ch + c] = (uint8_t)v;
			}
	return p;
}

uint8_t *img_smooth(uint32_t w, uint32_t h, uint32_t ch, uint32_t seed)
{
	uint8_t *p = malloc((size_t)w * h * ch);
	if (!p)
		abort();
	for (uint32_t y = 0; y < h; y++)
		for (uint32_t x = 0; x < w; x++)
			for (uint32_t c = 0; c < ch; c++) {
				uint32_t v = 20 + (x * (80 + 10 * c)) / w +
					     (y * (100 - 10 * c)) / h + seed % 8;
				p[((size_t)y * w + x) * ch + c] = (uint8_t)v;
			}
	return p;
}

void img_png_chunk(struct imgbuf *out, const char type[4], const uint8_t *data, uint32_t len)
{
	/* libpng writes the length, the type and the CRC around the data. */
	png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, png_fail, NULL);
	if (!png)
		abort();
	png_set_write_fn(png, out, png_write_cb, png_flush_cb);
	png_write_chunk(png, (png_const_bytep)type, data, len);
	png_destroy_write_struct(&png, NULL);
}
