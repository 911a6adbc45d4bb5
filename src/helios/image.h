/*
 * image.h - images in prompts: data: URLs, PNG and JPEG decoding from
 * memory, and the limits that keep a request's images bounded (design
 * 2.13; docs/inputs.md).
 *
 * Everything here is pure apart from memory: no files, no sockets, no
 * fetching.  The decoders are the Debian libraries (libpng 1.6,
 * libjpeg-turbo), driven from memory buffers only, with their error paths
 * turned into return codes (never a crash, never an exit).
 *
 * Conventions: calls return 0 or a negative code -- SEL_EFORMAT (malformed
 * or unsupported input), SEL_EOVERSIZE (over a limit), -ENOMEM -- and
 * leave a one-line message naming the value and what was expected in
 * eos_errmsg() ("image: 100000 x 100000 = 10000000000 pixels is over the
 * limit of 16777216 (refused before decoding)").  Functions are
 * thread-safe: they share no state.
 */
#ifndef HEL_IMAGE_H
#define HEL_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "selene.h"

/* ---- Limits ----------------------------------------------------------- */

typedef struct hel_image_limits {
	uint64_t max_encoded_bytes; /* one image's encoded (decoded base64) bytes */
	uint64_t max_pixels;        /* width x height, checked from the header before decoding */
	uint32_t max_images;        /* images in one request */
} hel_image_limits;

#define HEL_IMAGE_ENCODED_DEFAULT (16ull << 20) /* 16 MiB */
#define HEL_IMAGE_PIXELS_DEFAULT (1ull << 24)   /* 16 Mpx, e.g. 4096 x 4096 */
#define HEL_IMAGE_COUNT_DEFAULT 16u
#define HEL_IMAGE_SIDE_MAX 65535u    /* width and height, each (JPEG's own bound) */
#define HEL_IMAGE_JPEG_SCANS_MAX 256 /* progressive scans before a JPEG is refused */

/* The defaults above. */
hel_image_limits hel_image_limits_default(void);
/* Bytes the cold decoded-source allowance holds: max_pixels x 8 (design
 * 2.13). */
static inline uint64_t hel_image_cold_allowance(const hel_image_limits *l)
{
	return l->max_pixels * 8;
}
/* 0, or SEL_EOVERSIZE "N images in the request (at most M)". */
int hel_image_check_count(uint32_t n, const hel_image_limits *l);

/* ---- data: URLs (RFC 2397) ------------------------------------------------ */

/* A parsed data URL: its media type (lower case) and the decoded bytes. */
typedef struct hel_data_url {
	char media_type[64]; /* "image/png" or "image/jpeg" */
	uint8_t *bytes;      /* malloc'd, len bytes */
	size_t len;
} hel_data_url;

/* Parse url[0..len) as "data:image/png;base64,<base64>" (or image/jpeg,
 * image/jpg; other parameters before ";base64" are allowed and ignored;
 * whitespace inside the base64 text is skipped; padding is optional).
 * Refused, with a message naming the offending part: another scheme
 * ("scheme 'https' is not supported: Flare does not fetch images; send a
 * data: URL"), a media type other than PNG or JPEG, data that is not
 * base64, and data over lim->max_encoded_bytes (checked from the length
 * of the text before decoding).  *out is zeroed on failure. */
int hel_data_url_parse(const char *url, size_t len, const hel_image_limits *lim, hel_data_url *out);
/* NULL-safe; zeroes *u. */
void hel_data_url_free(hel_data_url *u);

/* ---- Decoding ------------------------------------------------------------- */

typedef enum hel_image_format {
	HEL_IMAGE_PNG = 1,
	HEL_IMAGE_JPEG = 2,
} hel_image_format;

/* "png", "jpeg" (the names the source key hashes), NULL for others. */
const char *hel_image_format_name(hel_image_format f);

/* The decoded representation (docs/inputs.md "Decoded images"): 8 bits
 * per sample, channels interleaved, rows top to bottom without padding.
 *   GRAY        1 channel   (PNG gray of 1..16 bits)
 *   GRAY_ALPHA  2 channels  (PNG gray + alpha, or gray with a tRNS key)
 *   RGB         3 channels  (PNG RGB or palette; JPEG YCbCr or RGB)
 *   RGBA        4 channels  (PNG RGBA, or RGB / palette with tRNS)
 *   CMYK        4 channels  (JPEG CMYK or YCCK) as ink amounts, 0 = no
 *               ink: Adobe-marked files (which store inverted values, the
 *               Photoshop convention) are inverted back.
 * 16-bit samples are scaled to 8 bits with libpng's exact rounding
 * (round(v x 255 / 65535)), so v x 257 gives back v.  Palettes are
 * expanded.  No gamma, colour profile or EXIF orientation is applied:
 * ancillary PNG chunks other than tRNS are skipped unread. */
typedef enum hel_image_color {
	HEL_COLOR_GRAY = 1,
	HEL_COLOR_GRAY_ALPHA = 2,
	HEL_COLOR_RGB = 3,
	HEL_COLOR_RGBA = 4,
	HEL_COLOR_CMYK = 5,
} hel_image_color;

/* "gray", "gray+alpha", "rgb", "rgba", "cmyk". */
const char *hel_image_color_name(hel_image_color c);
uint32_t hel_image_color_channels(hel_image_color c);

typedef struct hel_image {
	hel_image_format format; /* what the bytes were */
	hel_image_color color;
	uint32_t width, height;
	uint32_t channels;    /* hel_image_color_channels(color) */
	uint32_t source_bits; /* bits per sample in the file: 1, 2, 4, 8 or 16 */
	uint8_t *pixels;      /* height x width x channels bytes */
	size_t bytes;         /* of pixels */
	size_t capacity;      /* allocated for pixels: what an allowance charges */
} hel_image;

/* The format by magic bytes (PNG signature, JPEG SOI), or SEL_EFORMAT
 * "not a PNG or JPEG image". */
int hel_image_detect(const void *data, size_t len, hel_image_format *out);

/* Read the header only: format, width, height.  Checks the encoded bytes
 * and the header's pixel count against lim (SEL_EOVERSIZE), so a
 * decompression bomb is refused here, before any image data is
 * decompressed.  Cheap: no pixel buffer is allocated. */
int hel_image_probe(const void *data, size_t len, const hel_image_limits *lim,
		    hel_image_format *fmt, uint32_t *width, uint32_t *height);

/* Decode data[0..len) (PNG or JPEG, by magic) into *out.  The limits are
 * checked first from the header (hel_image_probe); libpng's chunk cache and
 * chunk allocation and libjpeg's memory are bounded too, and a JPEG with
 * more than HEL_IMAGE_JPEG_SCANS_MAX scans or over libjpeg's memory cap is
 * SEL_EOVERSIZE.  Corrupt data -- including what libjpeg merely warns about
 * (a truncated scan) -- is SEL_EFORMAT with the library's message.  *out is zeroed on failure;
 * release with hel_image_free. */
int hel_image_decode(const void *data, size_t len, const hel_image_limits *lim, hel_image *out);

/* NULL-safe; zeroes *img. */
void hel_image_free(hel_image *img);

#endif
