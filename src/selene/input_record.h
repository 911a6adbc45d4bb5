/*
 * input_record.h - CPU input records, pure encode and decode (design 2.13:
 * "Versioned .input files store bounded lengths and checksums
 * independently of the unchanged .ckpt checkpoint format").
 * docs/record-format.md, section "Input records (.input)", is normative.
 *
 * Two kinds of record, one file format:
 *   source description  source key -> semantic identity and geometry (the
 *                       image's size, its token grid, the prepared size);
 *                       a header alone, no payload
 *   prepared input      semantic identity -> serialized CPU tensors: a
 *                       header with a tensor table, then each tensor's
 *                       bytes padded to 64 bytes
 * The encoded bytes of a record are the same in memory (the input cache
 * holds them) and on disk (input_store.c writes them whole), so a record
 * moves between the tiers without re-encoding.
 *
 * Nothing here does I/O; fuzz/fuzz_input_record.c drives the decoder.
 * Calls return 0 or SEL_EFORMAT (structure), SEL_ECORRUPT (a checksum),
 * SEL_EIDENTITY (another key or kind than expected), -EINVAL, -ENOMEM, with
 * a message.
 */
#ifndef SEL_INPUT_RECORD_H
#define SEL_INPUT_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "input_key.h"

#define SEL_INPUT_MAGIC "FLAREINP"
#define SEL_INPUT_VERSION 1u
#define SEL_INPUT_FIXED 80u /* header bytes before the body */
#define SEL_INPUT_ALIGN 64u /* header size and tensor offsets */
#define SEL_INPUT_TENSORS_MAX 16u
#define SEL_INPUT_RANK_MAX 4u
#define SEL_INPUT_NAME_MAX 31u            /* tensor names: 1..31 of a-z 0-9 _ . - */
#define SEL_INPUT_TENSOR_MAX (1ull << 30) /* one tensor's bytes */
#define SEL_INPUT_HEADER_MAX 2048u        /* 80 + 16 x 96, rounded up */
#define SEL_INPUT_FILE_MAX (SEL_INPUT_HEADER_MAX + (1ull << 31)) /* any record file */

enum sel_input_kind {
	SEL_INPUT_SOURCE = 1,   /* source description */
	SEL_INPUT_PREPARED = 2, /* prepared input */
};

/* Element types of a tensor. */
enum sel_dtype {
	SEL_DT_U8 = 1,
	SEL_DT_U16 = 2,
	SEL_DT_U32 = 3,
	SEL_DT_I32 = 4,
	SEL_DT_F32 = 5,
};
/* Bytes per element (0 for an unknown type); "u8", "u16", ... */
uint32_t sel_dtype_bytes(uint32_t dtype);
const char *sel_dtype_name(uint32_t dtype);

/* What a source description says.  Selene does not interpret the values;
 * Helios fills encoding (hel_image_format), color (hel_image_color of the
 * decoded source), width and height (decoded), tokens and the token grid
 * (after resizing) and the prepared record's length. */
typedef struct sel_input_source {
	sel_input_key identity; /* semantic identity */
	uint32_t encoding;
	uint32_t color;
	uint32_t width, height;
	uint32_t tokens;
	uint32_t grid_h, grid_w;
	uint64_t prepared_bytes;
} sel_input_source;

/* One tensor of a prepared record. */
typedef struct sel_input_tensor {
	char name[SEL_INPUT_NAME_MAX + 1];
	uint32_t dtype;                    /* enum sel_dtype */
	uint32_t rank;                     /* 1..4 */
	uint64_t dims[SEL_INPUT_RANK_MAX]; /* each >= 1; 0 past rank */
	uint64_t offset;                   /* in the record, a multiple of 64 */
	uint64_t bytes;                    /* product of dims x element bytes */
	uint64_t checksum;                 /* XXH3-64 of the bytes */
} sel_input_tensor;

/* A decoded header. */
typedef struct sel_input_header {
	uint32_t version;
	uint32_t kind; /* enum sel_input_kind */
	uint32_t header_bytes;
	uint32_t count;         /* tensors (prepared), 0 (source) */
	uint64_t payload_bytes; /* after the header: sum of the padded tensors */
	uint64_t file_bytes;    /* header_bytes + payload_bytes */
	sel_input_key key;      /* source key (source) or semantic identity (prepared) */
	uint64_t created_ns;
	uint64_t header_checksum;
	sel_input_source src;                            /* kind SEL_INPUT_SOURCE */
	sel_input_tensor tensors[SEL_INPUT_TENSORS_MAX]; /* kind SEL_INPUT_PREPARED */
} sel_input_header;

/* An encoded record and its decoded header.  bytes[0..len) are the file's
 * bytes; tensor i's data is at bytes + h.tensors[i].offset. */
typedef struct sel_input_rec {
	uint8_t *bytes;
	size_t len;
	sel_input_header h;
} sel_input_rec;

/* ---- Building ------------------------------------------------------------- */

/* A prepared record for identity with n tensors whose name, dtype, rank and
 * dims come from specs[0..n) (other fields ignored): computes the layout,
 * allocates r->bytes zeroed (64-byte aligned), and leaves the header
 * unsealed.  Write each tensor's data at sel_input_data(r, i), then seal. */
int sel_input_prepared_init(sel_input_rec *r, const sel_input_key *identity,
			    const sel_input_tensor *specs, uint32_t n);
/* Checksum every tensor and encode the header (created_ns 0 = now).  The
 * record is immutable afterwards. */
int sel_input_seal(sel_input_rec *r, uint64_t created_ns);
/* A source description record for source key key (sealed). */
int sel_input_source_init(sel_input_rec *r, const sel_input_key *key, const sel_input_source *s,
			  uint64_t created_ns);

static inline uint8_t *sel_input_data(const sel_input_rec *r, uint32_t i)
{
	return r->bytes + r->h.tensors[i].offset;
}
/* Index of the tensor named name, or -ENOENT. */
int sel_input_find(const sel_input_rec *r, const char *name);

/* ---- Decoding ------------------------------------------------------------- */

/* Header bytes the first SEL_INPUT_FIXED bytes announce (64..2048), or
 * SEL_EFORMAT (short, magic, version, size field). */
int sel_input_header_bytes(const void *buf, size_t len);

/* Decode and validate a header from buf[0..len) (never reads past len, nor
 * past the header): magic, version, kind, sizes, the tensor table (names,
 * types, ranks, dims, offsets, lengths against the computed layout, every
 * bound), zero reserved bytes and padding, and the header checksum.  The
 * payload is not read (a description lookup reads the header alone). */
int sel_input_decode(const void *buf, size_t len, sel_input_header *out);

/* Check a whole record against its decoded header: len is exactly
 * h->file_bytes, every tensor matches its checksum, the padding after each
 * is zero.  SEL_EFORMAT (length, padding) or SEL_ECORRUPT (checksum). */
int sel_input_verify(const sel_input_header *h, const void *file, size_t len);

/* Decode and verify bytes[0..len) as a record of kind with key want (NULL:
 * any key) and take ownership of bytes (malloc'd or eos_aligned_alloc'd)
 * on success; on failure
 * bytes stay the caller's.  SEL_EIDENTITY for another kind or key. */
int sel_input_rec_adopt(sel_input_rec *r, uint8_t *bytes, size_t len, uint32_t kind,
			const sel_input_key *want);

/* NULL-safe; zeroes *r. */
void sel_input_rec_free(sel_input_rec *r);

/* ---- Names ------------------------------------------------------------------- */

/* "src-<64 hex>.input" or "prep-<64 hex>.input" + NUL */
#define SEL_INPUT_NAME_LEN 80
void sel_input_name(uint32_t kind, const sel_input_key *key, char out[SEL_INPUT_NAME_LEN]);
/* Exactly that pattern, lower-case hex: 0 or SEL_EFORMAT. */
int sel_input_name_parse(const char *name, uint32_t *kind, sel_input_key *key);

#endif
