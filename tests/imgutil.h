/*
 * imgutil.h - encode test images in memory with libpng and libjpeg, so the
 * image, vision, preparation tests and bench/inputs build every variant
 * they decode (and tests/gen-image-corpus writes the fuzz corpus).
 */
#ifndef IMGUTIL_H
#define IMGUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer the encoders write into. */
struct imgbuf {
	uint8_t *b;
	size_t n, cap;
};
void imgbuf_free(struct imgbuf *b);
void imgbuf_put(struct imgbuf *b, const void *p, size_t n);

/* PNG options beyond the samples. */
struct img_png_opts {
	bool interlace;         /* Adam7 */
	const uint8_t *palette; /* PNG_COLOR_TYPE_PALETTE: n_palette RGB triples */
	int n_palette;
	const uint8_t *trns;  /* palette alpha entries, or for gray/RGB the key colour */
	int n_trns;           /* entries (palette); 1 for a gray/RGB key */
	uint16_t trns_gray;   /* key colour, gray */
	uint16_t trns_rgb[3]; /* key colour, RGB */
	int compression;      /* zlib level, 0..9 (0 means 6) */
};

/* Encode a PNG: color_type and depth are libpng's (PNG_COLOR_TYPE_*, 1..16);
 * rows are packed as the PNG format stores them (16-bit samples big-endian,
 * sub-byte samples packed MSB first).  Aborts on failure. */
void img_png(struct imgbuf *out, uint32_t w, uint32_t h, int color_type, int depth,
	     const uint8_t *rows, size_t stride, const struct img_png_opts *o);

/* Encode a JPEG from 8-bit interleaved samples: components 1 (gray),
 * 3 (RGB) or 4 (CMYK, stored as given; libjpeg writes an Adobe marker),
 * at quality, optionally progressive.  Aborts on failure. */
void img_jpeg(struct imgbuf *out, uint32_t w, uint32_t h, int components, const uint8_t *pix,
	      int quality, bool progressive);

/* A deterministic test pattern: w x h x ch bytes (gradients and a hash). */
uint8_t *img_pattern(uint32_t w, uint32_t h, uint32_t ch, uint32_t seed);

/* A smooth one (what JPEG keeps well): values in 20..237. */
uint8_t *img_smooth(uint32_t w, uint32_t h, uint32_t ch, uint32_t seed);

/* Append a raw PNG chunk (length, type, data, CRC) to out. */
void img_png_chunk(struct imgbuf *out, const char type[4], const uint8_t *data, uint32_t len);

#endif
