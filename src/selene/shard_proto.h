/*
 * shard_proto.h - the frames of the rank links between rank zero and the
 * peers of a multi-host core (design 2.14; docs/multihost.md is the
 * reference).
 *
 * Internal to libselene.  Pure code: encoding and decoding do no I/O, so
 * tests and fuzz/fuzz_shard.c call them directly.  shard_link.c moves the
 * frames over TCP; shard_agree.c decides the scan agreement.
 *
 * Framing.  Every message is one frame:
 *     u32 payload length (<= SEL_SHARD_FRAME_MAX) | u16 type | u16 zero | payload
 * all integers little-endian.  A payload holds exactly the fields of its
 * type, in order, nothing after them; counts are bounded by the
 * SEL_SHARD_MAX_* constants and by the payload, reserved bytes are zero,
 * booleans 0 or 1, enumerations known values, texts without control bytes.
 * Anything else is SEL_EFORMAT with a message: the receiver cannot trust
 * the rest of the stream and ends the connection.  Every frame that decodes
 * encodes back to exactly its bytes.
 *
 * Exchanges (0: rank zero, P: a peer):
 *   join       0->P HELLO over the peer's rendezvous connection (nonce, the
 *              address that connection used on rank zero and the link
 *              listener's port, world size, rank zero's identity,
 *              fingerprint and settings); P connects to that address and
 *              sends JOIN (the nonce, its rank, world size, identity,
 *              fingerprint, settings); 0 answers ACCEPT (the agreed disk
 *              limit) once every rank joined, or ERROR and closes
 *   agreement  P->0 SCAN... SCAN_END (the records its scan kept);
 *              0->P DECIDE... DECIDE_END (an action for each of them, in
 *              the order P sent them); P applies them and sends APPLIED
 *   jobs       0->P JOB (store, fetch, truncate, unlink); P->0 DONE (one per
 *              job, in any order)
 *   shutdown   0->P DRAIN once rank zero has no job outstanding; P drains
 *              its transport and answers DRAINED; 0 closes
 *   failures   ERROR, either way, before the sender closes
 *
 * The decoder checks structure only, and ranges where the caller gives
 * them (struct sel_shard_limits: the receiver's page and slot counts and
 * record sizes).  What a field means -- whether a nonce is the one sent,
 * a job id is outstanding, a rank is expected -- the receiver checks
 * against its own state (shard_link.c).
 */
#ifndef SEL_SHARD_PROTO_H
#define SEL_SHARD_PROTO_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "record.h"
#include "selene.h"

#define SEL_SHARD_MAGIC 0x44524853u /* "SHRD" in HELLO and JOIN */
#define SEL_SHARD_VERSION 2u        /* 2: JOB carries `after` */
#define SEL_SHARD_FRAME_HEADER 8u
#define SEL_SHARD_FRAME_MAX (1u << 20) /* payload bytes */
#define SEL_SHARD_WORLD_MAX 64u        /* ranks, rank zero included */
#define SEL_SHARD_NONCE_BYTES 16u
#define SEL_SHARD_TEXT_MAX 255u       /* ERROR, APPLIED, DONE, DRAINED text */
#define SEL_SHARD_MAX_RECS 1024u      /* records of one job (a fetch's chain) */
#define SEL_SHARD_MAX_PAGES 131072u   /* page ids of one job */
#define SEL_SHARD_ENTRY_BYTES 128u    /* one scan summary entry */
#define SEL_SHARD_SCAN_CHUNK 8000u    /* entries per SCAN frame */
#define SEL_SHARD_DECIDE_CHUNK 65536u /* actions per DECIDE frame */
#define SEL_SHARD_MAX_SCAN (1u << 24) /* entries of one rank's summary */
#define SEL_SHARD_NO_SLOT UINT32_MAX  /* a job without a state slot */

enum sel_shard_type {
	SEL_SHARD_HELLO = 0x01,
	SEL_SHARD_JOIN = 0x02,
	SEL_SHARD_ACCEPT = 0x03,
	SEL_SHARD_ERROR = 0x04,
	SEL_SHARD_SCAN = 0x05,
	SEL_SHARD_SCAN_END = 0x06,
	SEL_SHARD_DECIDE = 0x07,
	SEL_SHARD_DECIDE_END = 0x08,
	SEL_SHARD_APPLIED = 0x09,
	SEL_SHARD_JOB = 0x0a,
	SEL_SHARD_DONE = 0x0b,
	SEL_SHARD_DRAIN = 0x0c,
	SEL_SHARD_DRAINED = 0x0d,
	SEL_SHARD_TYPES
};
/* "HELLO", ... ("?" for an unknown type). */
const char *sel_shard_type_name(uint16_t type);

/* The settings every rank must share (design 2.14): a disk store on every
 * rank or on none; each rank's disk limit, of which the smallest holds. */
struct sel_shard_settings {
	bool disk;
	uint64_t disk_limit; /* bytes; 0 without a disk store */
};

/* An IPv4 or IPv6 address (no port).  v4 uses a[0..4), the rest zero;
 * IPv4-mapped IPv6 addresses are always held as v4. */
struct sel_shard_addr {
	uint8_t family; /* 4 or 6 */
	uint8_t a[16];
};

struct sel_shard_hello {
	uint32_t world, rank; /* the rank rank zero expects on this connection */
	uint8_t nonce[SEL_SHARD_NONCE_BYTES];
	struct sel_shard_addr addr; /* rank zero's end of the rendezvous connection */
	uint16_t port;              /* the link listener's port */
	uint8_t identity[SEL_IDENTITY_BYTES];
	uint8_t fingerprint[SEL_FINGERPRINT_BYTES]; /* rank zero's own */
	struct sel_shard_settings set;
};

struct sel_shard_join {
	uint32_t world, rank;
	uint8_t nonce[SEL_SHARD_NONCE_BYTES];
	uint8_t identity[SEL_IDENTITY_BYTES];
	uint8_t fingerprint[SEL_FINGERPRINT_BYTES]; /* the peer's own rank */
	struct sel_shard_settings set;
};

struct sel_shard_accept {
	uint32_t world;
	uint64_t disk_limit; /* the smallest rank's */
};

/* ERROR, APPLIED, DRAINED: a status (0 or negative) and a one-line text. */
struct sel_shard_status {
	int32_t status;
	uint32_t deleted, truncated; /* APPLIED only (0 elsewhere) */
	char text[SEL_SHARD_TEXT_MAX + 1];
};

/* One record a rank's scan kept, as the agreement compares it: the header
 * fields but the layout fingerprint (which covers the rank) and the row
 * checksum (each rank's row differs), and whether the file holds the row.
 * The name is the key's. */
struct sel_shard_entry {
	sel_record_desc d;
	uint32_t version;
	uint32_t header_bytes;
	uint64_t created_ns;
	uint64_t page_off, row_off, row_end;
	bool has_row;
};

struct sel_shard_scan {
	uint32_t first, n; /* entries [first, first + n) of the summary */
	struct sel_shard_entry *e;
};

/* What a rank does with each record of its summary. */
enum sel_shard_action {
	SEL_SHARD_KEEP = 0,
	SEL_SHARD_TRUNCATE_ROW = 1, /* keep its pages, drop its row */
	SEL_SHARD_DELETE = 2,
	SEL_SHARD_ACTIONS
};

struct sel_shard_decide {
	uint32_t first, n; /* actions for entries [first, first + n) */
	uint8_t *act;
};

/* SCAN_END, DECIDE_END: how many were sent in all. */
struct sel_shard_total {
	uint32_t total;
};

enum sel_shard_op {
	SEL_SHARD_STORE =
		1, /* write the record from the GPU ids (its tail pages, the row's slot) */
	SEL_SHARD_FETCH = 2,    /* read a chain into the GPU ids */
	SEL_SHARD_TRUNCATE = 3, /* compaction: drop the row segment */
	SEL_SHARD_UNLINK = 4,   /* delete the file (a missing file is success) */
	SEL_SHARD_OPS
};
/* "store", "fetch", "truncate", "unlink" ("?"). */
const char *sel_shard_op_name(uint32_t op);

/* One record a job names: the file <key>.ckpt and the header it must have.
 * FETCH reads its stored page records [first, first + count). */
struct sel_shard_rec {
	sel_record_desc d;
	uint32_t first, count;
};

/* A job, the same on every rank (design 2.14: the same file names, GPU ids
 * and state slot).
 *   STORE     one record; pages = its tail page ids in chain order (count =
 *             tail, first 0); with row, slot is the row's state slot;
 *             created_ns is the header's creation time, the same on every
 *             rank so that every rank's header agrees
 *   FETCH     a chain, ancestor first, each record's parent the previous
 *             record's key; pages = the destinations of every record's
 *             [first, first + count) in order; with row, the endpoint's row
 *             goes to slot
 *   TRUNCATE, UNLINK  one record, no pages, no slot, no row */
struct sel_shard_job {
	uint64_t id; /* not 0 */
	uint32_t op;
	bool row;
	uint32_t slot;
	uint64_t created_ns;
	/* STORE, FETCH: rank zero's count of model calls mirrored to the peers
	 * before this job; the peer runs it only once its model executed that
	 * many (the GPU ids it copies are then quiescent: a call rank zero
	 * mirrored without waiting may still be writing them).  0: none. */
	uint64_t after;
	uint32_t n_recs;
	struct sel_shard_rec *recs;
	uint32_t n_pages;
	uint32_t *pages;
};

/* A rank's completion of a job. */
#define SEL_SHARD_R_COMMITTED (1u << 0) /* STORE: the file is in place under its name */
#define SEL_SHARD_R_HAD_ROW (1u << 1)   /* TRUNCATE: the file held its row */
#define SEL_SHARD_R_EXISTED (1u << 2)   /* UNLINK: the file was there */
#define SEL_SHARD_R_KNOWN (SEL_SHARD_R_COMMITTED | SEL_SHARD_R_HAD_ROW | SEL_SHARD_R_EXISTED)
struct sel_shard_result {
	uint64_t id;
	int32_t status; /* 0, a negative errno or a SEL_E* code */
	uint32_t flags;
	uint64_t bytes; /* moved to or from files */
	char text[SEL_SHARD_TEXT_MAX + 1];
};

struct sel_shard_drain {
	uint32_t ms; /* how long the peer may take */
};

struct sel_shard_msg {
	uint16_t type;
	union {
		struct sel_shard_hello hello;
		struct sel_shard_join join;
		struct sel_shard_accept accept;
		struct sel_shard_status status; /* ERROR, APPLIED, DRAINED */
		struct sel_shard_scan scan;
		struct sel_shard_decide decide;
		struct sel_shard_total total; /* SCAN_END, DECIDE_END */
		struct sel_shard_job job;
		struct sel_shard_result done;
		struct sel_shard_drain drain;
	} u;
	void *block; /* decoded arrays (sel_shard_msg_free) */
};

/* What the receiver's own geometry bounds (0 / NULL: only the structural
 * limits): page ids below pages, slots below slots, and every record desc
 * valid for sz (sel_record_span_of). */
struct sel_shard_limits {
	uint32_t pages, slots;
	const struct sel_record_sizes *sz;
};

/* Parse a frame header from buf[0..len) (len >= SEL_SHARD_FRAME_HEADER):
 * 0 with type and payload length, or SEL_EFORMAT (reserved bytes, unknown
 * type, length over SEL_SHARD_FRAME_MAX), with a message. */
int sel_shard_frame_header(const void *buf, size_t len, uint16_t *type, uint32_t *plen);

/* Bytes of m's frame, header included, or SEL_EFORMAT / -E2BIG for a
 * message that would not decode (a count over its limit, a frame over
 * SEL_SHARD_FRAME_MAX, a text too long), with a message. */
int64_t sel_shard_encoded_size(const struct sel_shard_msg *m);
/* Encode m into buf[0..cap): the frame's length, or the errors above, or
 * -ENOBUFS when cap is short.  The encoder checks what the decoder checks,
 * so a frame it writes always decodes. */
int64_t sel_shard_encode(const struct sel_shard_msg *m, void *buf, size_t cap);

/* Decode one whole frame buf[0..len) (header and payload, nothing more)
 * under lim (may be NULL).  0 with *m filled (free with sel_shard_msg_free),
 * or SEL_EFORMAT / -ENOMEM with a message; *m is zeroed on failure.  Memory
 * is bounded by len. */
int sel_shard_decode(const void *buf, size_t len, const struct sel_shard_limits *lim,
		     struct sel_shard_msg *m);
void sel_shard_msg_free(struct sel_shard_msg *m);

/* The job rules the decoder applies, for a job about to be encoded or one
 * built by hand: 0 or SEL_EFORMAT naming the rule. */
int sel_shard_job_check(const struct sel_shard_job *j, const struct sel_shard_limits *lim);

/* Whether a status is one a rank may report: 0, -1..-4095, or a SEL_E*. */
bool sel_shard_status_valid(int32_t status);
/* Whether a failed store or fetch may be retried after progress: the
 * filesystem was full or over quota (design 2.14, last paragraph). */
static inline bool sel_shard_space_status(int status)
{
	return status == -ENOSPC || status == -EDQUOT;
}

/* Copy text into out[SEL_SHARD_TEXT_MAX + 1] as a frame may carry it: cut
 * to SEL_SHARD_TEXT_MAX bytes, control bytes replaced by '?'. */
void sel_shard_text(char *out, const char *text);

/* The layout fingerprint rank `rank` of a world of `world` ranks presents
 * at JOIN and writes into its record files (design 2.14: it covers that
 * rank's geometry, its rank and the world size, so a host never restores
 * records another rank wrote): the 16-byte BLAKE2b of the domain
 * "flare-rank-layout-v1", sel_layout_fingerprint of a one-rank geometry of
 * rg with page_tokens, rank and world (u32 little-endian). */
void sel_shard_rank_fingerprint(const sel_rank_geometry *rg, uint32_t page_tokens, uint32_t rank,
				uint32_t world, uint8_t out[SEL_FINGERPRINT_BYTES]);

/* Addresses: from a sockaddr (AF_INET, AF_INET6; v4-mapped becomes v4),
 * 0 or -EAFNOSUPPORT; equality; "a.b.c.d" or "x:y::z" into out[64]. */
struct sockaddr;
int sel_shard_addr_from(const struct sockaddr *sa, struct sel_shard_addr *out);
bool sel_shard_addr_eq(const struct sel_shard_addr *a, const struct sel_shard_addr *b);
const char *sel_shard_addr_text(const struct sel_shard_addr *a, char out[64]);

#endif
