/*
 * remote_value.h - the remote tier's layout on Redis, pure: key names, the
 * framing, authentication and encryption of every value, the cut of a
 * record into windows, and the manifest (issue 16 "Layout on Redis" and
 * "Trust"; docs/remote.md is the normative description of every byte).
 *
 * A record (docs/record-format.md) is stored as
 *   <prefix>:{<ns>/<name>}:w<i>  window i: at most 4 MiB, a run of whole
 *                                stored page records, a piece of one that
 *                                is larger, or a piece of the row
 *   <prefix>:{<ns>/<name>}:m     the manifest, written last: the record
 *                                header, window size and count, one XXH3-64
 *                                per stored page record (the header holds
 *                                the row's)
 * and announced in
 *   <prefix>:{<ns>/b/<bucket>}   a set of record names per aligned
 *                                64-token boundary (design 2.3's bucket map)
 * where <ns> is the record directory name (identity prefix and layout
 * fingerprint), <name> the record file name and <bucket> the boundary
 * digest in hex.  One record's keys share one hash tag, hence one cluster
 * slot.
 *
 * Nothing here does I/O except sel_rv_key_load, which reads the key file.
 * fuzz/fuzz_remote.c drives the decoders; tests/test_remote_value.c holds
 * known answers.  Internal to libselene.
 */
#ifndef SEL_REMOTE_VALUE_H
#define SEL_REMOTE_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "record.h"

#define SEL_RV_VALUE_MAX (4u << 20)               /* the largest value written or accepted */
#define SEL_RV_HEADER 120u                        /* value header bytes */
#define SEL_RV_CAP_MIN 4096u                      /* window payload bytes, smallest */
#define SEL_RV_CAP_MAX (SEL_RV_VALUE_MAX - 4096u) /* ... and largest (the default) */
#define SEL_RV_MANIFEST_WINDOW 0xffffffffu        /* the manifest's window index */
#define SEL_RV_WINDOWS_MAX (1u << 20)             /* windows of one record */
#define SEL_RV_KEY_BYTES 32u                      /* the key file's secret */
#define SEL_RV_NAME_MAX 224u                      /* a Redis key we build, NUL included */
#define SEL_RV_PREFIX_MAX 40u

/* Value kinds. */
enum sel_rv_kind {
	SEL_RV_KIND_MANIFEST = 1,
	SEL_RV_KIND_WINDOW = 2,
};

/* How a value is protected (byte 6 of its header). */
enum sel_rv_prot {
	SEL_RV_CHECKSUM = 0, /* no key: XXH3-64 over the header (and a manifest's payload) */
	SEL_RV_MAC = 1,      /* key: keyed BLAKE2b-256 over header and payload */
	SEL_RV_AEAD = 2,     /* key, encryption: XChaCha20-Poly1305, header as AD */
};

/* The secrets derived from a key file, and what the writer uses. */
struct sel_rv_keys {
	bool keyed;       /* a key is configured: only MAC and AEAD values are accepted */
	bool encrypt;     /* values are written encrypted (needs keyed) */
	uint8_t mac[32];  /* BLAKE2b-256(key = secret, "flare-remote-mac-v1") */
	uint8_t aead[32]; /* BLAKE2b-256(key = secret, "flare-remote-aead-v1") */
	char id[17];      /* 16 hex of BLAKE2b-64(key = secret, "flare-remote-id-v1"); "" */
};
/* Derive from a 32-byte secret (NULL: no key; encrypt is then refused with
 * -EINVAL, "encryption needs a key").  0 or -EINVAL. */
int sel_rv_keys_init(struct sel_rv_keys *k, const uint8_t *secret, bool encrypt);
/* Zero the secrets. */
void sel_rv_keys_wipe(struct sel_rv_keys *k);

/* A key file's bytes: exactly 32 raw bytes, or 64 hex digits with an
 * optional trailing newline.  All-zero secrets are refused.  0 or
 * SEL_EFORMAT with a message. */
int sel_rv_key_parse(const void *buf, size_t len, uint8_t out[SEL_RV_KEY_BYTES]);
/* Read and parse a key file: a regular file, not readable or writable by
 * others (chmod 600), through sel_rv_key_parse.  0, SEL_EFORMAT, -EPERM
 * (mode) or the failing errno, with a message naming the path. */
int sel_rv_key_load(const char *path, uint8_t out[SEL_RV_KEY_BYTES]);

/* What a value's header says. */
struct sel_rv_hdr {
	uint8_t kind;                         /* enum sel_rv_kind */
	uint8_t prot;                         /* enum sel_rv_prot (decode only) */
	uint8_t identity[SEL_IDENTITY_BYTES]; /* offload identity */
	uint8_t fingerprint[SEL_FINGERPRINT_BYTES];
	sel_key key;         /* the record */
	uint32_t window;     /* SEL_RV_MANIFEST_WINDOW for the manifest */
	uint32_t payload;    /* payload bytes */
	uint64_t generation; /* the put that wrote it, never 0 */
};

/* Bytes of a value carrying payload bytes under k. */
size_t sel_rv_value_bytes(const struct sel_rv_keys *k, size_t payload);

/* Encode one value into out[0..cap): the header from h (prot chosen by k;
 * the nonce, with encryption, random), the payload gathered from iov[0..n)
 * (their lengths must sum to h->payload) and the tag.  Returns the value's
 * bytes, or -EINVAL (sizes, kind, generation 0, payload beyond a window)
 * or -ENOBUFS. */
int sel_rv_encode(const struct sel_rv_keys *k, const struct sel_rv_hdr *h, const struct iovec *iov,
		  uint32_t n, uint8_t *out, size_t cap);

/* The header and the tag of a value whose payload stays in iov[0..n)
 * (checksum and MAC protection; -EINVAL under encryption, whose payload is
 * ciphertext and has to be written): header into hdr, tag into tag (32
 * bytes of room), returns the tag's bytes.  The value is header, the
 * pieces in order, then the tag -- what sel_rv_encode writes into one
 * buffer.  Errors as sel_rv_encode. */
int sel_rv_seal(const struct sel_rv_keys *k, const struct sel_rv_hdr *h, const struct iovec *iov,
		uint32_t n, uint8_t hdr[SEL_RV_HEADER], uint8_t *tag);

/* Decode and verify the value buf[0..len) in place (an encrypted payload
 * is decrypted where it lies).  want names the value expected: kind,
 * identity, fingerprint, key, window, and generation (0 = any).  Checks,
 * in order: the structure (SEL_EFORMAT: magic, version, kind, reserved
 * bytes, lengths), the protection against k (-EBADMSG: a value without a
 * key's protection where a key is configured; -ENOKEY: an authenticated
 * value and no key), integrity (SEL_ECORRUPT: checksum; -EBADMSG: MAC or
 * AEAD tag), then the fields (SEL_EIDENTITY, SEL_ELAYOUT; SEL_ECORRUPT for
 * another kind, key or window: a value copied from elsewhere; -ESTALE for
 * another generation).  0 with *got and *payload (inside buf) on success;
 * every failure has a message. */
int sel_rv_decode(const struct sel_rv_keys *k, const struct sel_rv_hdr *want, uint8_t *buf,
		  size_t len, struct sel_rv_hdr *got, uint8_t **payload);

/* ---- Windows ------------------------------------------------------------ */

/* How a record's payload -- stored page records (stride bytes each), then
 * the stored rows' bytes (unpadded, file order) -- is cut into windows of
 * at most cap payload bytes.  A page record never straddles two windows
 * unless it is larger than cap, and then it is alone in its windows; the
 * row starts a window of its own. */
struct sel_rv_layout {
	uint64_t stride;
	uint32_t tail;
	uint64_t row; /* row bytes; 0 = no row */
	uint32_t cap;
	uint32_t ppw; /* pages per window when stride <= cap, else 0 */
	uint32_t wpp; /* windows per page when stride > cap, else 0 */
	uint32_t page_windows, row_windows, windows;
};
/* 0, or -EINVAL (stride 0 with pages, cap outside SEL_RV_CAP_MIN..MAX) or
 * SEL_EOVERSIZE (more than SEL_RV_WINDOWS_MAX windows), with a message. */
int sel_rv_layout_init(struct sel_rv_layout *l, uint64_t stride, uint32_t tail, uint64_t row,
		       uint32_t cap);

/* What window w (< windows) holds. */
struct sel_rv_extent {
	bool row;       /* a piece of the row */
	uint32_t page;  /* pages: the first stored page record */
	uint32_t pages; /* pages: how many (1 for a piece of a split page) */
	uint64_t off;   /* pages: offset inside the first page; row: offset in the row */
	uint64_t len;   /* payload bytes */
};
void sel_rv_extent(const struct sel_rv_layout *l, uint32_t w, struct sel_rv_extent *e);
/* The first window holding stored page record p (< tail). */
uint32_t sel_rv_page_window(const struct sel_rv_layout *l, uint32_t p);
/* The first row window (== page_windows). */
static inline uint32_t sel_rv_row_window(const struct sel_rv_layout *l) { return l->page_windows; }

/* Bytes of a record's stored rows (the row stream): rank 0's row when the
 * row is replicated, else every rank's, unpadded. */
uint64_t sel_rv_row_bytes(const sel_record_layout *l, uint32_t flags);

/* ---- The manifest ------------------------------------------------------- */

struct sel_rv_manifest {
	sel_record_header h; /* decoded against the namespace */
	bool has_row;
	uint32_t cap, windows;
	uint64_t row_bytes; /* the row stream's bytes (0 without a row) */
	struct sel_rv_layout layout;
	const uint8_t *cksum; /* tail u64le page checksums, inside the payload */
};

/* Payload bytes of a manifest (16 + header bytes + 8 tail), 0 when beyond
 * a value. */
size_t sel_rv_manifest_bytes(const sel_record_ns *ns, uint32_t tail);
/* Encode a manifest payload for record d of ns into out[0..len): window
 * size cap, whether the row is stored (its checksum in the header),
 * creation time, the tail page checksums.  Returns the payload bytes, or
 * SEL_EFORMAT (bad desc), -EINVAL, -ENOBUFS, SEL_EOVERSIZE, with a message. */
int sel_rv_manifest_encode(const sel_record_ns *ns, const sel_record_desc *d, bool has_row,
			   uint64_t row_checksum, uint64_t created_ns, uint32_t cap,
			   const uint64_t *cksum, uint8_t *out, size_t len);
/* Decode and validate a manifest payload against ns and the expected key:
 * the header decodes against the namespace (identity, fingerprint, rank
 * table: SEL_EIDENTITY, SEL_ELAYOUT), names want, its row checksum is 0
 * without a row; cap, window count and length agree with the layout.
 * 0, or the decoder's code / SEL_EFORMAT with a message.  out->cksum
 * points into p. */
int sel_rv_manifest_decode(const sel_record_ns *ns, const sel_key *want, const uint8_t *p,
			   size_t len, struct sel_rv_manifest *out);
/* Stored page record i's checksum from a decoded manifest. */
uint64_t sel_rv_manifest_cksum(const struct sel_rv_manifest *m, uint32_t i);

/* ---- Key names ---------------------------------------------------------- */

struct sel_rv_names {
	char prefix[SEL_RV_PREFIX_MAX]; /* "flare", or "flare-<key id>" with a key */
	char ns[SEL_RECORD_DIRNAME_MAX];
};
/* Names for namespace ns under keys k (the key id separates deployments
 * with different keys on one Redis). */
void sel_rv_names_init(struct sel_rv_names *n, const sel_record_ns *ns,
		       const struct sel_rv_keys *k);
/* Each writes a NUL-terminated Redis key into out (SEL_RV_NAME_MAX) and
 * returns its length. */
int sel_rv_manifest_name(const struct sel_rv_names *n, const sel_key *key, char *out);
int sel_rv_window_name(const struct sel_rv_names *n, const sel_key *key, uint32_t w, char *out);
int sel_rv_bucket_name(const struct sel_rv_names *n, const sel_digest *bucket, char *out);
/* A bucket set member: the record's file name (sel_record_name); parse
 * one back (exact, bounded): 0 or SEL_EFORMAT. */
int sel_rv_member_parse(const char *s, size_t len, sel_key *key);

#endif
