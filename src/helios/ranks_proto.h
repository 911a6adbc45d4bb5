/*
 * ranks_proto.h - the frames of the execution protocol between the ranks of
 * one core run as separate processes (design 2.8 "process-peer tensor
 * parallelism", 2.14; docs/multihost.md "Execution").
 *
 * Pure code, no I/O: encode, decode, limits.  Every frame is
 *   u32 payload length | u16 type | u16 zero | payload
 * little endian, payload at most HEL_RP_FRAME_MAX bytes, decoded strictly
 * and canonically (wire.h): reserved bytes zero, known types and
 * operations, counts bounded and checked against the bytes present before
 * anything is allocated, nothing after the last field.
 *
 *   JOIN   peer -> 0  magic, version, world, rank, the core's identity
 *   START  0 -> peer  state mode, page ids, state slots (rank 0's model)
 *   READY  peer -> 0  the peer's layout fingerprint (sel_shard_rank_fingerprint)
 *   CALL   0 -> peer  one model call (hel_tp_call): op, slot, arg, value,
 *                     page ids, words (tokens or image-token states)
 *   PART   peer -> 0  the peer's share of a reduction (u64 words)
 *   SUM    0 -> peer  the reduction's total
 *   ERROR  either     status, text; the sender closes
 *   BYE    0 -> peer  the instance stops: the peer exits 0
 *   STORE  0 -> peer  the rank links' HELLO (shard_proto.h) for the peer's
 *                     record service (design 2.14), after READY
 */
#ifndef HEL_RANKS_PROTO_H
#define HEL_RANKS_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "selene.h"

#define HEL_RP_MAGIC 0x4b4e5248u /* "HRNK" */
#define HEL_RP_VERSION 1u
#define HEL_RP_HEADER 8u
#define HEL_RP_FRAME_MAX (64u << 20) /* payload bytes */
#define HEL_RP_TEXT_MAX 511u
#define HEL_RP_MAX_PAGES (1u << 20) /* page ids of one call */
#define HEL_RP_MAX_WORDS (8u << 20) /* words of one call (tokens or states) */
#define HEL_RP_MAX_SUM 65536u       /* words of one reduction */
#define HEL_RP_FP_BYTES 16u
#define HEL_RP_STORE_MAX 1024u /* the HELLO a STORE frame carries */

enum hel_rp_type {
	HEL_RP_JOIN = 1,
	HEL_RP_START,
	HEL_RP_READY,
	HEL_RP_CALL,
	HEL_RP_PART,
	HEL_RP_SUM,
	HEL_RP_ERROR,
	HEL_RP_BYE,
	HEL_RP_STORE,
	HEL_RP_TYPE_MAX = HEL_RP_STORE,
};

struct hel_rp_msg {
	uint16_t type;
	union {
		struct {
			uint32_t world, rank;
			uint8_t identity[SEL_IDENTITY_BYTES];
		} join;
		struct {
			uint32_t mode, pages, rows;
		} start;
		struct {
			uint8_t fingerprint[HEL_RP_FP_BYTES];
		} ready;
		hel_tp_call call; /* decoded: pages and words are owned (hel_rp_free) */
		struct {
			uint32_t n;
			uint64_t *w; /* decoded: owned */
		} sum;               /* PART and SUM */
		struct {
			int32_t status;
			char text[HEL_RP_TEXT_MAX + 1];
		} error;
		struct {
			uint32_t n;
			uint8_t b[HEL_RP_STORE_MAX];
		} store;
	};
};

/* The header of buf[0..len) (len >= HEL_RP_HEADER): 0, or SEL_EFORMAT for
 * an unknown type, non-zero reserved bytes or a payload over the limit. */
int hel_rp_header(const void *buf, size_t len, uint16_t *type, uint32_t *plen);
/* Encode m (header included): the frame's size, written into buf[0..cap)
 * when it fits (buf NULL measures), or -EINVAL (with a message) for a
 * message the decoder would refuse. */
int64_t hel_rp_encode(const struct hel_rp_msg *m, void *buf, size_t cap);
/* Decode one whole frame (header and payload, exactly len bytes) into *m;
 * SEL_EFORMAT with a message naming the field, -ENOMEM.  Release with
 * hel_rp_free (also after a failure). */
int hel_rp_decode(const void *buf, size_t len, struct hel_rp_msg *m);
void hel_rp_free(struct hel_rp_msg *m);
const char *hel_rp_type_name(uint16_t type);

#endif
