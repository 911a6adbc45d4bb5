/*
 * pool_proto.h - the wire protocol between a pool manager (`flare pool`,
 * src/manager/) and its clients (pool_client.c): framed binary messages over
 * a Unix stream socket (design 2.15; docs/pool.md is the reference).
 *
 * Internal to libselene (the manager links it too).  Pure code: encoding and
 * decoding do no I/O, so tests and fuzz/fuzz_pool_proto.c call them
 * directly.
 *
 * Framing.  Every message is one frame:
 *     u32 payload length (<= SEL_POOL_FRAME_MAX) | u16 type | u16 zero | payload
 * all integers little-endian.  A payload holds exactly the fields of its
 * type, in order, with nothing after them; array counts are bounded by the
 * SEL_POOL_MAX_* constants, padding bytes are zero and enumerations hold
 * known values.  Anything else is SEL_EFORMAT: the receiver cannot trust the
 * rest of the stream and closes the connection.  Decoding is canonical:
 * every frame that decodes encodes back to the same bytes.
 *
 * The decoder checks structure only.  What a field means -- whether a lease
 * is one this receiver granted, whether a window lies inside the arena, a
 * generation is current -- is checked by the receiver against its own state
 * (the manager's server.c, pool_client.c), which refuses and counts what
 * does not match and never follows it.  sel_pool_windows_check is the shared
 * window rule.
 *
 * Exchanges (C: client to manager, M: manager to client):
 *   connect      M_HELLO (with the arena descriptor, SCM_RIGHTS), C_HELLO,
 *                M_WELCOME (status 0, or a refusal and the manager closes)
 *   holdings     C_ANNOUNCE, C_WITHDRAW (eviction notices), C_RESET
 *                (evictions_lost: forget these kinds, re-announce follows)
 *   lookup       C_LOOKUP (ticket) -> M_ANSWER (same ticket; may come late)
 *   claim        C_CLAIM -> M_CLAIM_GRANT (a lease) | M_CLAIM_REFUSED;
 *                C_PROGRESS...; C_RELEASE once the client's copies drained
 *   put          C_PUT -> M_PUT_GRANT (a lease) | M_PUT_REFUSED; C_PROGRESS...;
 *                C_COMMIT -> M_PUT_RESULT; or C_RELEASE to abandon
 *   export       M_EXPORT_REQUEST (a lease on the holder) -> C_EXPORT_REPLY
 *                (accept or refuse); C_PROGRESS...; C_EXPORT_DONE (checksums
 *                or a failure, after the holder's copies drained);
 *                M_EXPORT_CANCEL when the requester went away
 *   failures     M_LEASE_FAILED (timeout, no progress): the client still
 *                releases (or ends the export) once its copies drained;
 *                M_ERROR (a refused frame, counted; fatal ones close)
 */
#ifndef SEL_POOL_PROTO_H
#define SEL_POOL_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "selene.h"

#define SEL_POOL_VERSION 1u
#define SEL_POOL_MAGIC 0x4c4f4f50u /* "POOL" in the two hellos */
#define SEL_POOL_FRAME_HEADER 8u
#define SEL_POOL_FRAME_MAX (1u << 20) /* payload bytes */
#define SEL_POOL_NAME_MAX 64u         /* pool name bytes */
#define SEL_POOL_TEXT_MAX 256u        /* refusal and error text bytes */
#define SEL_POOL_TABLE_MAX 65536u     /* scope rank table bytes */
#define SEL_POOL_MAX_BOUNDS 16384u    /* lookup boundaries (1M tokens) */
#define SEL_POOL_MAX_HOLDINGS 4096u   /* announce / withdraw entries per frame */
#define SEL_POOL_MAX_NODES 1024u      /* answer and grant nodes */
#define SEL_POOL_MAX_CANDIDATES 32u   /* answer candidates */
#define SEL_POOL_MAX_WINDOWS 16384u   /* windows per grant */
#define SEL_POOL_MAX_PAGES 65536u     /* pages per grant (checksums) */
#define SEL_POOL_ID_BYTES 16u         /* instance ids, scope ids */
#define SEL_POOL_NONE UINT32_MAX      /* no node index */

/* Restore deadlines (design 2.15): setup plus the bytes at 8 MiB/s. */
#define SEL_POOL_SETUP_MS 10000u           /* what a client asks for */
#define SEL_POOL_SETUP_LIMIT_MS 30000u     /* the manager's default clamp */
#define SEL_POOL_REQUESTER_SETUP_MS 12000u /* the requester's own allowance */
#define SEL_POOL_PROGRESS_MS 3000u         /* the manager's no-progress timeout */
#define SEL_POOL_DEADLINE_BPS (8ull << 20)

/* Message types.  Client-to-manager types have bit 6 set. */
enum sel_pool_type {
	SEL_POOL_M_HELLO = 0x01,
	SEL_POOL_M_WELCOME = 0x02,
	SEL_POOL_M_ANSWER = 0x03,
	SEL_POOL_M_CLAIM_GRANT = 0x04,
	SEL_POOL_M_CLAIM_REFUSED = 0x05,
	SEL_POOL_M_PUT_GRANT = 0x06,
	SEL_POOL_M_PUT_REFUSED = 0x07,
	SEL_POOL_M_PUT_RESULT = 0x08,
	SEL_POOL_M_EXPORT_REQUEST = 0x09,
	SEL_POOL_M_EXPORT_CANCEL = 0x0a,
	SEL_POOL_M_LEASE_FAILED = 0x0b,
	SEL_POOL_M_ERROR = 0x0c,
	SEL_POOL_C_HELLO = 0x41,
	SEL_POOL_C_ANNOUNCE = 0x42,
	SEL_POOL_C_WITHDRAW = 0x43,
	SEL_POOL_C_RESET = 0x44,
	SEL_POOL_C_LOOKUP = 0x45,
	SEL_POOL_C_CLAIM = 0x46,
	SEL_POOL_C_RELEASE = 0x47,
	SEL_POOL_C_PROGRESS = 0x48,
	SEL_POOL_C_PUT = 0x49,
	SEL_POOL_C_COMMIT = 0x4a,
	SEL_POOL_C_EXPORT_REPLY = 0x4b,
	SEL_POOL_C_EXPORT_DONE = 0x4c,
};

/* "M_HELLO", ... ("?" for an unknown type). */
const char *sel_pool_type_name(uint16_t type);
/* Whether type is one of the enum's values. */
bool sel_pool_type_known(uint16_t type);

/* Why something was refused or failed (reasons on the wire; 0 is success).
 * docs/pool.md lists who sends which. */
enum sel_pool_reason {
	SEL_POOL_OK = 0,
	SEL_POOL_NOT_FOUND,          /* no such record or holding (any more) */
	SEL_POOL_GENERATION_CHANGED, /* the holder's checkpoint is another generation */
	SEL_POOL_CHAIN_GAP,          /* the holder cannot supply the pages asked for */
	SEL_POOL_NO_HEADROOM,        /* the holder cannot pin it without hurting serving */
	SEL_POOL_NO_ROOM,            /* the arena has no room, even after eviction */
	SEL_POOL_BUSY,               /* a per-session limit (claims, puts, exports) */
	SEL_POOL_PRESENT,            /* put: the record is already in the pool */
	SEL_POOL_IN_FLIGHT,          /* put: another put of the key is open */
	SEL_POOL_ORPHAN,             /* put: the parent is not in the pool and the
					tail is not the whole chain */
	SEL_POOL_OVERSIZE,           /* larger than the pool can ever hold or grant */
	SEL_POOL_BAD_REQUEST,        /* fields that contradict each other or the scope */
	SEL_POOL_FORGED,             /* a handle this receiver never granted */
	SEL_POOL_STALE,              /* a handle that was valid once (ended, another nonce) */
	SEL_POOL_TIMEOUT,            /* the restore deadline passed */
	SEL_POOL_NO_PROGRESS,        /* three seconds without progress */
	SEL_POOL_GONE,               /* the peer session (holder, requester) ended */
	SEL_POOL_CANCELLED,          /* the requester no longer wants it */
	SEL_POOL_RECOVERING,         /* a restarted manager waits for old clients */
	SEL_POOL_SCOPE,              /* the hello's scope is not usable */
	SEL_POOL_VERSION_MISMATCH,   /* protocol version */
	SEL_POOL_DUPLICATE,          /* another live process uses this instance id */
	SEL_POOL_TOO_MANY,           /* session or scope limit */
	SEL_POOL_CORRUPT,            /* bytes failed their checksums */
	SEL_POOL_COPY_FAILED,        /* the client's copy failed */
	SEL_POOL_FULL,               /* holdings beyond the manager's limit were dropped */
	SEL_POOL_MALFORMED,          /* a frame that does not decode (fatal) */
	SEL_POOL_SHUTDOWN,           /* the manager is stopping (fatal) */
	SEL_POOL_REASONS
};
/* "ok", "not_found", ... (metric label spelling). */
const char *sel_pool_reason_name(uint32_t r);

/* Where a holding or a candidate's bytes are. */
enum sel_pool_source {
	SEL_POOL_SRC_ARENA = 0, /* a record in the manager's arena ("pool") */
	SEL_POOL_SRC_GPU = 1,   /* a neighbour instance's GPU cache ("neighbour") */
	SEL_POOL_SRC_DRAM = 2,  /* a neighbour's host memory tier */
	SEL_POOL_SRC_NVME = 3,  /* a neighbour's disk tier */
	SEL_POOL_SOURCES
};
/* "pool", "gpu", "dram", "nvme". */
const char *sel_pool_source_name(uint32_t s);

/* ---- Message bodies ----------------------------------------------------- */

/* An arena window: `slots` consecutive slots of the scope's slot_bytes at
 * byte offset `off` of the arena mapping.  Pages windows come first, in
 * chain page order, then row windows, in row piece order. */
enum sel_pool_win_kind {
	SEL_POOL_WIN_PAGES = 0,
	SEL_POOL_WIN_ROW = 1
};
struct sel_pool_window {
	uint64_t off;
	uint32_t slots;
	uint8_t kind; /* enum sel_pool_win_kind */
};

struct sel_pool_m_hello {
	uint32_t version;
	uint64_t generation;     /* region generation: the arena's identity */
	uint64_t arena_bytes;    /* length of the descriptor to map */
	uint64_t data_start;     /* first byte windows may use (header before it) */
	uint32_t window_limit;   /* bytes per window at most (beyond one slot) */
	uint32_t window_credits; /* windows in flight per lease (remote data channels) */
	uint32_t max_claims, max_puts, max_exports; /* open leases per session */
	uint32_t setup_limit_ms;                    /* the clamp on a requested setup time */
	uint32_t progress_ms;                       /* the no-progress timeout */
	uint64_t staging_bytes; /* data staging a client needs (0: shared memory) */
	char name[SEL_POOL_NAME_MAX + 1];
};

enum {
	SEL_POOL_HELLO_DRAINED = 1u << 0
}; /* previous session's copies drained */

struct sel_pool_scope {
	uint8_t identity[SEL_IDENTITY_BYTES];       /* offload identity */
	uint8_t fingerprint[SEL_FINGERPRINT_BYTES]; /* layout fingerprint */
	uint32_t page_tokens;
	uint32_t ranks;
	uint64_t slot_bytes;  /* one page record (4 KiB multiple) */
	uint32_t row_slots;   /* slots a row occupies */
	uint32_t table_bytes; /* the record rank table (docs/record-format.md) */
	const uint8_t *table; /* decoded: points into the message's memory */
};

struct sel_pool_c_hello {
	uint32_t version;
	uint32_t flags; /* SEL_POOL_HELLO_* */
	uint8_t instance[SEL_POOL_ID_BYTES];
	uint64_t generation; /* the region this client still maps, 0 for none */
	struct sel_pool_scope scope;
};

struct sel_pool_m_welcome {
	uint32_t status;     /* SEL_POOL_OK or the refusal */
	uint64_t session;    /* the manager's session id */
	uint32_t recovering; /* 1: allocation waits for clients of a previous run */
	char text[SEL_POOL_TEXT_MAX + 1];
};

struct sel_pool_holding {
	uint8_t source; /* SEL_POOL_SRC_GPU, _DRAM or _NVME */
	sel_key key;
	sel_digest bucket;   /* announce only */
	uint64_t generation; /* the holder's checkpoint generation */
};

struct sel_pool_c_holdings { /* C_ANNOUNCE, C_WITHDRAW */
	uint32_t n;
	struct sel_pool_holding *h;
};

struct sel_pool_c_reset {
	uint32_t sources; /* bit (1 << source) for each kind to forget */
};

struct sel_pool_c_lookup {
	uint64_t ticket;
	uint64_t resident; /* GPU-resident count a */
	uint64_t limit;    /* deepest endpoint wanted */
	uint64_t k_hi;     /* bounds[i] is the boundary digest at k_hi - i */
	uint32_t n;
	sel_digest *bounds;
};

/* An answer node: one record of an arena chain, or a holder's endpoint. */
struct sel_pool_anode {
	sel_key key;
	uint32_t tail; /* pages the record holds */
	uint32_t up;   /* index of the next node toward the root, or NONE */
	uint8_t has_row;
};

struct sel_pool_candidate {
	uint8_t source;                    /* enum sel_pool_source */
	uint32_t node;                     /* endpoint node; chain = node, up, up, ... */
	uint64_t base;                     /* consumed count where the chain stops (<= resident) */
	uint64_t generation;               /* holders: the generation to claim */
	uint8_t holder[SEL_POOL_ID_BYTES]; /* holders: instance id; arena: zero */
	uint64_t bytes;                    /* bytes the restore would move */
};

struct sel_pool_m_answer {
	uint64_t ticket;
	uint32_t n_nodes, n_cands;
	struct sel_pool_anode *nodes;
	struct sel_pool_candidate *cands; /* deepest first */
};

struct sel_pool_c_claim {
	uint64_t claim; /* the client's id */
	uint8_t source;
	uint8_t holder[SEL_POOL_ID_BYTES];
	uint64_t generation;
	sel_key key; /* endpoint */
	uint64_t resident;
	uint32_t setup_ms;
};

/* A grant node: the record header fields the client checks. */
struct sel_pool_gnode {
	sel_key key;
	sel_key parent;
	sel_digest bucket;
	uint32_t tail;   /* pages the record holds */
	uint32_t pages;  /* the last `pages` of them are granted */
	uint8_t has_row; /* the endpoint row is granted (last node only) */
};

struct sel_pool_m_claim_grant {
	uint64_t claim;
	uint64_t lease, nonce;
	uint32_t deadline_ms;
	uint8_t source;
	uint64_t base; /* consumed count the granted pages start after (page aligned) */
	uint32_t n_nodes, n_windows, n_pages;
	struct sel_pool_gnode *nodes; /* chain order, ancestor first */
	struct sel_pool_window *windows;
	uint64_t *page_cksum; /* [n_pages] XXH3-64 of each page record */
	uint64_t row_cksum;   /* XXH3-64 of the row (docs/record-format.md) */
};

struct sel_pool_m_refused { /* M_CLAIM_REFUSED, M_PUT_REFUSED */
	uint64_t id;        /* claim or put id */
	uint32_t reason;
};

struct sel_pool_c_put {
	uint64_t put; /* the client's id */
	sel_key key, parent;
	sel_digest bucket;
	uint32_t tail;
	uint8_t has_row;
	uint32_t setup_ms;
};

struct sel_pool_m_put_grant {
	uint64_t put;
	uint64_t lease, nonce;
	uint32_t deadline_ms;
	uint32_t n_windows;
	struct sel_pool_window *windows;
};

struct sel_pool_lease_status { /* M_PUT_RESULT, M_EXPORT_CANCEL, M_LEASE_FAILED, C_RELEASE,
				  C_EXPORT_REPLY */
	uint64_t lease, nonce;
	uint32_t status; /* SEL_POOL_OK or a reason */
};

struct sel_pool_m_export_request {
	uint64_t lease, nonce;
	uint32_t deadline_ms;
	uint8_t source; /* which holding: GPU, DRAM, NVME */
	sel_key key;
	uint64_t generation;
	uint32_t start_page; /* the first chain page wanted */
	uint32_t n_pages;
	uint8_t row; /* the endpoint row is wanted */
	uint32_t n_windows;
	struct sel_pool_window *windows;
};

struct sel_pool_c_progress {
	uint64_t lease, nonce;
	uint32_t windows_done;
};

struct sel_pool_c_cksums { /* C_COMMIT, C_EXPORT_DONE */
	uint64_t lease, nonce;
	uint32_t status; /* EXPORT_DONE: OK or the failure; COMMIT: 0 */
	uint32_t n;
	uint64_t *page_cksum;
	uint64_t row_cksum;
};

struct sel_pool_m_error {
	uint32_t code;  /* a reason */
	uint16_t about; /* the type of the frame refused, or 0 */
	uint8_t fatal;  /* the connection closes after it */
	char text[SEL_POOL_TEXT_MAX + 1];
};

struct sel_pool_msg {
	uint16_t type;
	union {
		struct sel_pool_m_hello m_hello;
		struct sel_pool_m_welcome welcome;
		struct sel_pool_m_answer answer;
		struct sel_pool_m_claim_grant grant;
		struct sel_pool_m_refused refused;
		struct sel_pool_m_put_grant put_grant;
		struct sel_pool_lease_status ls;
		struct sel_pool_m_export_request export_req;
		struct sel_pool_m_error error;
		struct sel_pool_c_hello c_hello;
		struct sel_pool_c_holdings holdings;
		struct sel_pool_c_reset reset;
		struct sel_pool_c_lookup lookup;
		struct sel_pool_c_claim claim;
		struct sel_pool_c_progress progress;
		struct sel_pool_c_put put;
		struct sel_pool_c_cksums cksums;
	} u;
	void *mem; /* arrays of a decoded message (one block), or NULL */
};

/* ---- Encoding and decoding ---------------------------------------------- */

/* The frame header at buf[0..len): 0 with *type and *payload when the 8
 * bytes are there and well formed, -EAGAIN when fewer than 8 bytes, or
 * SEL_EFORMAT (payload over SEL_POOL_FRAME_MAX, a non-zero reserved field,
 * an unknown type) with a message. */
int sel_pool_frame_header(const uint8_t *buf, size_t len, uint16_t *type, uint32_t *payload);

/* Encoded size of m, frame header included, or SEL_EFORMAT when a count is
 * over its limit, an enumeration out of range or the payload too big. */
int64_t sel_pool_encoded_size(const struct sel_pool_msg *m);
/* Encode m into buf[0..cap): the frame's byte count, -ENOBUFS when cap is
 * too small, SEL_EFORMAT as sel_pool_encoded_size. */
int64_t sel_pool_encode(const struct sel_pool_msg *m, uint8_t *buf, size_t cap);

/* Decode one whole frame buf[0..len) (header included, len exactly 8 +
 * payload) into *out.  0, SEL_EFORMAT with a message naming the type and
 * field, or -ENOMEM.  On success the arrays live in out->mem (free with
 * sel_pool_msg_free); on failure nothing needs freeing. */
int sel_pool_decode(const uint8_t *buf, size_t len, struct sel_pool_msg *out);
void sel_pool_msg_free(struct sel_pool_msg *m);

/* ---- Shared rules -------------------------------------------------------- */

/* A lease deadline: min(setup_ms, limit_ms) plus bytes at 8 MiB/s, in ms
 * (saturating at UINT32_MAX). */
uint32_t sel_pool_deadline_ms(uint32_t setup_ms, uint32_t limit_ms, uint64_t bytes);

/* The window rule both sides apply to a grant: every window lies in
 * [data_start, arena_bytes), starts on a multiple of slot_bytes, holds at
 * least one slot, no two windows overlap, pages windows come before row
 * windows and hold exactly `pages` slots, row windows exactly `row_slots`.
 * 0 or SEL_EFORMAT naming the window. */
int sel_pool_windows_check(const struct sel_pool_window *w, uint32_t n, uint64_t arena_bytes,
			   uint64_t data_start, uint64_t slot_bytes, uint32_t pages,
			   uint32_t row_slots);

/* The scope id the manager files a hello under: BLAKE2b-16 over the pool
 * name and every scope field (so scopes differing in anything never
 * share). */
void sel_pool_scope_id(const char *pool_name, const struct sel_pool_scope *s,
		       uint8_t out[SEL_POOL_ID_BYTES]);

/* A stable instance id: BLAKE2b-16 over the pool name and either the
 * explicit id (when non-empty) or the machine id, the core identity and the
 * listen address. */
void sel_pool_instance_id(const char *pool_name, const char *explicit_id, const char *machine_id,
			  const uint8_t core_identity[SEL_IDENTITY_BYTES], const char *listen,
			  uint8_t out[SEL_POOL_ID_BYTES]);

#endif
