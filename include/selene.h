/*
 * selene.h - the tiered prefix-cache store (libselene).
 *
 * Selene keeps immutable prefix checkpoints -- KV page chains plus one state
 * row -- that an inference engine publishes, moves them out of GPU memory into
 * host DRAM and local NVMe, and brings them back byte-exact when a later
 * request can resume from them (design: prefix-cache-offload.md).
 *
 * This header is the library's whole public surface for an engine
 * (docs/integration.md is the guide; examples/engine.c a complete host).
 * An implementation of a store, or a test double, also includes
 * selene_store.h, the implementer's header.  Conventions:
 *   - Calls return 0 (or a non-negative count) on success and a negative
 *     errno, or one of the SEL_E* codes below, on failure.  sel_strerror()
 *     decodes both; sel_errmsg() returns the calling thread's detailed
 *     message for the last failure ("geometry: rank 1 has no KV_PAGES
 *     allocation").  Each call says which errors it returns ("Errors:"),
 *     as lmdb.h does; calls without such a line cannot fail.
 *   - A call that fails changes nothing and produces no event.
 *   - Objects are opaque; destructors accept NULL and half-built objects.
 *   - Every store call on a handle is made from one thread (the model
 *     worker).  sel_history is single-threaded too.  Different handles are
 *     independent.
 */
#ifndef SELENE_H
#define SELENE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SEL_VERSION_MAJOR 0
#define SEL_VERSION_MINOR 1
#define SEL_VERSION_PATCH 0
#define SEL_VERSION_STRING "0.1.0"

/* The library's version as "major.minor.patch" (static), with each part
 * stored where the pointer is not NULL: what the library linked at run
 * time says, which may differ from the SEL_VERSION_* this program was
 * compiled with.  Never fails. */
const char *sel_version(int *major, int *minor, int *patch);

/* ---- Errors ------------------------------------------------------------ */

/* Our own codes live below -30800, far from any errno. */
enum {
	SEL_EBASE = -30800,
	SEL_ECORRUPT = -30800,   /* stored bytes failed verification */
	SEL_EIDENTITY = -30801,  /* record of another model or state mode */
	SEL_ELAYOUT = -30802,    /* record of another layout fingerprint */
	SEL_EGEOMETRY = -30803,  /* allocations do not form a valid geometry */
	SEL_ECUDA = -30804,      /* CUDA driver unavailable or failed */
	SEL_EOVERSIZE = -30805,  /* larger than the tier can ever hold */
	SEL_EFORMAT = -30806,    /* malformed header, name or text */
	SEL_ESTOPPED = -30807,   /* the store stopped after an unreportable failure */
	SEL_EDIRECTORY = -30808, /* the record directory is unusable (not writable, not a
				    directory, a symbolic link): no disk tier */
	SEL_ELAST = -30809,
};

/* Static description of rc (negative errno or SEL_E*); never NULL. */
const char *sel_strerror(int rc);
/* The calling thread's message for its last failed call ("" if none). */
const char *sel_errmsg(void);

/* ---- Digests, keys and histories (design 2.3) -------------------------- */

#define SEL_DIGEST_BYTES 16      /* prefix and bucket digests */
#define SEL_IDENTITY_BYTES 32    /* model identity, offload identity */
#define SEL_FINGERPRINT_BYTES 16 /* layout fingerprint */
#define SEL_BUCKET_TOKENS 64     /* lookup bucket granularity */

typedef uint32_t sel_token;

typedef struct sel_digest {
	uint8_t b[SEL_DIGEST_BYTES];
} sel_digest;

/* A PrefixKey: the exact token prefix of `consumed` tokens, named by a
 * BLAKE2b digest salted by the model identity (and an optional per-request
 * cache salt).  Equal keys mean equal prefixes, short of a BLAKE2b
 * collision.  The all-zero key (consumed 0, zero digest) means "none". */
typedef struct sel_key {
	uint64_t consumed;
	sel_digest digest;
} sel_key;

static inline bool sel_key_eq(const sel_key *a, const sel_key *b)
{
	if (a->consumed != b->consumed)
		return false;
	for (int i = 0; i < SEL_DIGEST_BYTES; i++)
		if (a->digest.b[i] != b->digest.b[i])
			return false;
	return true;
}
bool sel_key_is_none(const sel_key *k);

/* A request's token history with the chained digests of every aligned
 * 64-token boundary, so key_at(c) costs one hash of at most 64 tokens.
 * Build once per request; append as tokens are generated.  Single-threaded.
 * Embed it (the struct is public so schedulers can hold it by value) but
 * touch its fields only through the calls below. */
typedef struct sel_history {
	sel_digest root; /* boundary digest at 0 (salted root) */
	sel_token *tokens;
	uint64_t n, cap;
	sel_digest *bounds; /* bounds[k] = digest of boundary k*64, k <= n/64 */
	uint64_t nbounds_cap;
} sel_history;

/* Initialise an empty history.  salt may be NULL (salt_len 0): requests with
 * different salts never share any key, bucket or digest.
 * Errors: -EINVAL (salt NULL with salt_len > 0), -ENOMEM. */
int sel_history_init(sel_history *h, const uint8_t model_identity[SEL_IDENTITY_BYTES],
		     const void *salt, size_t salt_len);
/* Errors: -ENOMEM (h unchanged). */
int sel_history_append(sel_history *h, const sel_token *t, size_t n);
/* Shorten to n tokens (n <= length). */
void sel_history_truncate(sel_history *h, uint64_t n);
void sel_history_free(sel_history *h);
static inline uint64_t sel_history_len(const sel_history *h) { return h->n; }
/* Key of the first c tokens; c must be <= length. */
void sel_history_key_at(const sel_history *h, uint64_t c, sel_key *out);
/* Digest of aligned boundary k (token k*64); k must be <= length/64.  The
 * bucket digest of an endpoint c is the boundary digest at c/64. */
const sel_digest *sel_history_bound(const sel_history *h, uint64_t k);
/* Copy h into an empty dst (deep copy).  Errors: -ENOMEM (dst left empty). */
int sel_history_copy(sel_history *dst, const sel_history *h);

/* Reference definition: the key of tokens[0..c) computed from scratch,
 * without a history.  Used by tests and tools. */
void sel_key_direct(const uint8_t model_identity[SEL_IDENTITY_BYTES], const void *salt,
		    size_t salt_len, const sel_token *tokens, uint64_t c, sel_key *out);

/* ---- Geometry, layout fingerprint, offload identity (design 2.1) ------- */

typedef enum sel_group {
	SEL_GROUP_OTHER = 0,  /* weights, activations: not checkpoint bytes */
	SEL_GROUP_STATE_ROWS, /* one row per state slot */
	SEL_GROUP_KV_PAGES,   /* one unit per physical page id */
} sel_group;

typedef enum sel_memkind {
	SEL_MEM_HOST = 0, /* ordinary host memory: the host transfer backend */
	SEL_MEM_DEVICE,   /* device memory of this rank: the CUDA backend */
	SEL_MEM_PEER,     /* belongs to another rank: excluded */
} sel_memkind;

/* One runtime-sized allocation as the engine made it. */
typedef struct sel_allocation {
	uint32_t rank;
	const char *name;
	sel_group group;
	sel_memkind kind;
	uint64_t address;    /* base; unit i is at address + i * unit_bytes */
	uint64_t unit_bytes; /* bytes per page (KV_PAGES) or per row (STATE_ROWS) */
	uint64_t count;      /* number of pages or rows */
} sel_allocation;

typedef struct sel_plane {
	char *name;
	sel_memkind kind;
	uint64_t address;
	uint64_t unit_bytes;
} sel_plane;

typedef struct sel_rank_geometry {
	sel_plane row; /* the STATE_ROWS allocation */
	uint64_t row_count;
	sel_plane *pages; /* KV_PAGES allocations, ordered by name (strcmp) */
	uint32_t n_planes;
	uint64_t page_count; /* smallest page count among the page planes */
	uint64_t page_bytes; /* sum of page plane unit bytes */
} sel_rank_geometry;

typedef struct sel_geometry {
	uint32_t ranks;
	uint32_t page_tokens;
	sel_rank_geometry *rank; /* [ranks] */
} sel_geometry;

/* Build the per-rank geometry from an engine's allocations: for each rank
 * exactly one STATE_ROWS and at least one KV_PAGES allocation that is not
 * PEER memory; PEER and OTHER allocations are ignored.  Plane names must be
 * unique within a rank and unit sizes non-zero.  page_tokens must be a
 * positive multiple of SEL_BUCKET_TOKENS.
 * Errors: SEL_EGEOMETRY (a message names the rank and allocation: no or two
 * STATE_ROWS, no KV_PAGES, a duplicate name, a zero unit or count, ranks
 * or page_tokens out of range), -ENOMEM.  *out is NULL on failure. */
int sel_geometry_build(const sel_allocation *allocs, size_t n, uint32_t ranks, uint32_t page_tokens,
		       sel_geometry **out);
void sel_geometry_free(sel_geometry *g);

/* 16-byte BLAKE2b over the rank count, the page tokens and each rank's
 * ordered page plane names and unit sizes and row plane name and unit size
 * (encoding: docs/identity.md).  Addresses and counts do not enter it, so it
 * is stable across load-time options. */
void sel_layout_fingerprint(const sel_geometry *g, uint8_t out[SEL_FINGERPRINT_BYTES]);

/* Continuation-state modes: records of one mode never load into another. */
typedef enum sel_state_mode {
	SEL_MODE_ORDINARY = 0,
	SEL_MODE_LEARNED = 1, /* learned speculation */
	SEL_MODE_COPY = 2,    /* copy speculation */
} sel_state_mode;

const char *sel_state_mode_name(sel_state_mode m);

/* 32-byte BLAKE2b with domain "flare-prefix-state-v1" over the model
 * identity and the state mode (docs/identity.md). */
void sel_offload_identity(const uint8_t model_identity[SEL_IDENTITY_BYTES], sel_state_mode mode,
			  uint8_t out[SEL_IDENTITY_BYTES]);

/* Lower-case hex of n bytes into out (2n + 1 bytes). */
char *sel_hex(const void *bytes, size_t n, char *out);

/* ---- The store interface (design 2.2) ---------------------------------- */
/*
 * A store keeps host copies of published GPU checkpoints and restores them.
 * All calls are made from one thread (the model worker), never block, and
 * never wait for a transfer: copies run on the store's own threads and their
 * results come back through sel_store_poll().
 *
 * Pins and lifetimes (the worker's side of the contract):
 *   - sel_store_put() returning SEL_QUEUED means a copy-out job reads the
 *     checkpoint's GPU pages and row.  The worker holds one GPU pin on the
 *     checkpoint from before the call until the job's SEL_EV_STORED or
 *     SEL_EV_STORE_FAILED event (whose outcome may be SEL_DEFERRED).
 *     Every other outcome takes no pin and produces no event.
 *   - sel_store_lookup() pins nothing.  A hit stays valid until the next
 *     call that may change the store (put, fetch, poll, evicted, touch);
 *     sel_store_fetch() re-validates it and returns -ESTALE when the chain
 *     is gone, in which case the worker treats the request as a miss.
 *   - SEL_RETRY (from put) and SEL_DEFERRED (a store event) take no pin:
 *     the worker keeps only the checkpoint id and offers it again after
 *     store progress made after the refusal -- a SEL_EV_STORED,
 *     SEL_EV_FETCHED or SEL_EV_PROGRESS event delivered later than the
 *     refusal.  Failure events (SEL_EV_STORE_FAILED, SEL_DEFERRED included,
 *     and SEL_EV_FETCH_FAILED) are not progress: a deferral found no
 *     capacity, and counting it would let two deferred records re-offer
 *     each other for ever.  A retry that sees no progress stays unpinned
 *     until GPU eviction takes its checkpoint; nothing waits for it.
 *   - SEL_EV_PROGRESS (design 2.10 backpressure): after a put was refused
 *     (SEL_RETRY, or a SEL_DEFERRED event), a store emits one PROGRESS
 *     event, at most one per poll, when host capacity that may let a
 *     refused put through comes back without a STORED or FETCHED event
 *     saying so: a composite's maintenance write committed (its memory
 *     slots became evictable), slots, budget or pins held by a failed
 *     transfer or by records now removed were released, a bounded stream
 *     ended.  Never for a failure that itself found no capacity (a
 *     SEL_DEFERRED outcome, ENOSPC).  Only `type` is set.  Consumers that
 *     do not retry may ignore it; the ops table version is unchanged.
 *   - sel_store_fetch() returning 0 means exactly one SEL_EV_FETCHED or
 *     SEL_EV_FETCH_FAILED event follows for the ticket.  The destination
 *     page ids and state slot belong to the scheduler's ticket until then;
 *     a failure is reported only after every copy into them has drained, so
 *     they can go straight back to the free lists.  The store pins the
 *     records it reads until the event.
 *   - A call that returns an error produces no event.
 *   - sel_store_close() drains and joins every thread within the deadline.
 *     If a transfer cannot be drained, close returns SEL_ESTOPPED and keeps
 *     its memory (registrations, slabs) alive: the caller must keep the
 *     GPU planes alive too (design 2.8).
 */

typedef struct sel_store sel_store;

/* Outcome of sel_store_put(), and the outcome carried by store events. */
typedef enum sel_outcome {
	SEL_QUEUED = 0, /* copy submitted; pin until SEL_EV_STORED/STORE_FAILED */
	SEL_PRESENT,    /* a committed local copy of the key exists */
	SEL_DEFERRED,   /* (event only) the queued copy found no host capacity:
			     pin released, retry after store progress */
	SEL_RETRY,      /* capacity or queue room temporarily unavailable: no
			     copy, no pin; retry after store progress */
	SEL_OVERSIZE,   /* can never fit this store: do not retry */
	SEL_SKIPPED,    /* not stored and not worth retrying (duplicate in
			     flight, unusable record, store stopped) */
} sel_outcome;

const char *sel_outcome_name(sel_outcome o);

/* Why the last SEL_RETRY/SEL_DEFERRED happened (design 2.15 metrics). */
typedef enum sel_retry_reason {
	SEL_RETRY_NONE = 0,
	SEL_RETRY_INFLIGHT, /* the slots are held by copies in flight */
	SEL_RETRY_SLABS,    /* no evictable slots */
	SEL_RETRY_QUEUE,    /* a transfer queue is full */
	SEL_RETRY_BUDGET,   /* disk budget or filesystem space */
	SEL_RETRY_REASONS
} sel_retry_reason;

const char *sel_retry_reason_name(sel_retry_reason r);

/* A GPU-ready checkpoint the scheduler offers (PublishedCheckpoint). */
typedef struct sel_published {
	uint64_t checkpoint;   /* GPU checkpoint id, echoed in events */
	sel_key key;           /* endpoint */
	sel_key parent;        /* nearest offered ancestor; none = all zero */
	sel_digest bucket;     /* boundary digest at key.consumed / 64 */
	const uint32_t *pages; /* whole chain from the root: key.consumed / page_tokens ids */
	uint32_t n_pages;
	uint32_t tail;       /* pages since the offered ancestor (the last `tail` ids) */
	uint32_t state_slot; /* the checkpoint's snapshot row */
} sel_published;

typedef enum sel_tier {
	SEL_TIER_NONE = 0,
	SEL_TIER_MEMORY,
	SEL_TIER_DISK,
	SEL_TIER_POOL,
	SEL_TIER_REMOTE, /* the remote tier on Redis (issue 16) */
	SEL_TIERS
} sel_tier;

/* Metric label of a tier: "none", "dram", "nvme", "pool", "remote"
 * (design 2.15). */
const char *sel_tier_name(sel_tier t);

/* A restorable host chain (HostHit). */
typedef struct sel_hit {
	sel_key key;       /* endpoint found */
	uint64_t resident; /* the GPU-resident count the lookup was made for */
	uint32_t pages;    /* pages to upload: the chain's pages past `resident` */
	uint64_t bytes;    /* bytes the restore moves (pages and row, all ranks) */
	sel_tier tier;     /* where the bytes come from (the slowest tier involved) */
	uint64_t cookie;   /* store-private */
	/* The chain the lookup verified: every node above `resident` had its
	 * key compared with the request's history at its consumed count, and
	 * this digest names those nodes and the pages each supplies.  fetch
	 * re-walks its chain and refuses (-ESTALE) one whose digest differs,
	 * so it never reads a node the lookup did not check.  Store-computed;
	 * callers copy hits whole. */
	sel_digest chain;
	/* Pool hits: the bytes come from another instance's cache through an
	 * export (design 2.15 "neighbour GPU"), not from the manager's arena. */
	bool neighbour;
	/* Of a neighbour hit: the neighbour's tier the export reads, MEMORY
	 * (its host DRAM) or DISK (its NVMe); NONE for its GPU cache. */
	sel_tier neighbour_tier;
} sel_hit;

/* Where a restore lands (InboundTicket). */
typedef struct sel_inbound {
	uint64_t ticket;       /* scheduler's ticket id, echoed in events */
	const uint32_t *pages; /* hit.pages destination page ids, in chain order */
	uint32_t n_pages;
	uint32_t state_slot; /* destination row */
	/* Overlapped restores (issue 18): with n_sums > 0 the fetch also
	 * delivers into sums[0..n_sums) the page digests (sel_page_digest_padded) of
	 * the chain's n_sums pages just below hit->resident -- the head the
	 * caller recomputes -- taken from the record this fetch reads, so the
	 * caller can compare them when the fetch's FETCHED event comes (not
	 * before).  A store that cannot (no such entry, a padded version-3
	 * record, a replicated record) refuses the fetch with -ENOTSUP.  sums
	 * stays writable
	 * until the fetch's event or the store's destroy. */
	uint64_t *sums;
	uint32_t n_sums;
} sel_inbound;

typedef enum sel_event_type {
	SEL_EV_STORED = 1,   /* a queued put landed (outcome SEL_QUEUED) */
	SEL_EV_STORE_FAILED, /* a queued put failed or was deferred (outcome) */
	SEL_EV_FETCHED,      /* a fetch landed: the ticket's ids hold the bytes */
	SEL_EV_FETCH_FAILED, /* a fetch failed; its destinations are quiescent */
	SEL_EV_PROGRESS,     /* host capacity came back after a refusal: retry
				  (no checkpoint, no ticket; see the rules above) */
} sel_event_type;

typedef struct sel_event {
	sel_event_type type;
	sel_outcome outcome; /* store events: SEL_QUEUED (stored), SEL_DEFERRED, SEL_SKIPPED */
	int error;           /* failures: negative errno or SEL_E* */
	uint64_t checkpoint; /* store events */
	uint64_t ticket;     /* fetch events */
	sel_key key;
	sel_tier tier; /* fetch events: where the bytes came from */
	uint64_t bytes;
	uint64_t duration_ns; /* submission to completion */
	sel_retry_reason why; /* SEL_DEFERRED: the cause (design 2.15) */
} sel_event;

/* Counters and gauges, cumulative since open (design 2.11, 2.15). */
typedef struct sel_tier_stats {
	uint64_t records;    /* records indexed in this tier */
	uint64_t bytes_used; /* bytes held */
	uint64_t bytes_limit;
	uint64_t bytes_in;  /* host -> GPU (restores) */
	uint64_t bytes_out; /* GPU -> host (stores) */
	uint64_t held;      /* records taken into this tier */
	uint64_t dropped_end_of_chain;
	uint64_t dropped_oversize;
	uint64_t dropped_io_error;
	uint64_t expired;
	uint64_t evicted;
	uint64_t compacted;
	uint64_t corrupt;  /* records that failed verification */
	uint64_t rate_bps; /* fitted bandwidth of restores (policy) */
	uint64_t fixed_ns; /* fitted fixed cost per restore (policy) */
	/* Records stored into the tier with replicated shares packed once,
	 * or per rank (design 2.5; a read-through promotion is a new store). */
	uint64_t stores_packed, stores_per_rank;
} sel_tier_stats;

/* Why a pool restore failed (sel_pool_counters.claims_failed). */
typedef enum sel_pool_fail {
	SEL_POOL_FAIL_REFUSED = 0, /* the manager refused the claim (record gone, limits) */
	SEL_POOL_FAIL_TIMEOUT,     /* the restore deadline or the no-progress timeout */
	SEL_POOL_FAIL_GONE,        /* the connection to the manager was lost */
	SEL_POOL_FAIL_MISMATCH,    /* the grant's chain keys are not the request's history */
	SEL_POOL_FAIL_CORRUPT,     /* a page or the row failed its checksum */
	SEL_POOL_FAIL_COPY,        /* the copy into the GPU ids failed */
	SEL_POOL_FAILS
} sel_pool_fail;

/* Metric label: "refused", "timeout", "gone", "mismatch", "corrupt", "copy". */
const char *sel_pool_fail_name(sel_pool_fail f);

/* Why this instance refused or failed an export (design 2.15). */
typedef enum sel_export_refusal {
	SEL_EXPORT_NOT_FOUND = 0,      /* the checkpoint left the GPU cache */
	SEL_EXPORT_GENERATION_CHANGED, /* the id holds another key */
	SEL_EXPORT_CHAIN_GAP,          /* not the pages asked for */
	SEL_EXPORT_NO_HEADROOM,        /* pinning it would hurt serving */
	SEL_EXPORT_FAILED,             /* the copy failed, or the requester went away */
	SEL_EXPORT_DAMAGED,            /* a host holding's record file failed its checks */
	SEL_EXPORT_REFUSALS
} sel_export_refusal;

/* Metric label: "not_found", "generation_changed", "chain_gap",
 * "no_headroom", "failed". */
const char *sel_export_refusal_name(sel_export_refusal r);

/* Attachment of a pooled store (design 2.15). */
typedef enum sel_pool_attach_state {
	SEL_POOL_OFF = 0,       /* no pool configured */
	SEL_POOL_UP,            /* a session is open */
	SEL_POOL_DOWN,          /* the connection was lost: reattach follows */
	SEL_POOL_GONE_FOR_GOOD, /* sharing disabled (a changed region), or never attached */
} sel_pool_attach_state;

/* What the pooled store did (design 2.15 "Visible"); sel_stats.pool. */
typedef struct sel_pool_counters {
	sel_pool_attach_state state;
	uint64_t sessions, detaches; /* sessions opened (attach and reattaches), losses */
	uint64_t lookups;            /* pool lookups begun (tickets) */
	uint64_t answers;            /* answered */
	uint64_t late_answers;       /* answered after the grace period */
	uint64_t grace_expired;      /* admissions that went on without the answer */
	uint64_t hits;               /* lookups where the pool had the deepest prefix */
	uint64_t claims, restores;   /* claims made, restores that landed */
	uint64_t claims_failed[SEL_POOL_FAILS];
	uint64_t reused_tokens, reused_bytes;                    /* by restores from the pool */
	uint64_t puts, puts_accepted, puts_refused, puts_failed; /* copies into the arena */
	uint64_t put_bytes;
	uint64_t neighbour_restores; /* of restores: exported by another instance */
	uint64_t neighbour_tokens, neighbour_bytes;
	/* Of those: from a neighbour's host DRAM ([0]) and NVMe ([1]) holdings. */
	uint64_t neighbour_host_restores[2], neighbour_host_tokens[2], neighbour_host_bytes[2];
	uint64_t host_announced[2], host_withdrawn[2]; /* DRAM, NVMe holdings */
	uint64_t announced, withdrawn;                 /* GPU holdings */
	uint64_t exports_served; /* exports this instance copied for a neighbour */
	uint64_t exports_refused[SEL_EXPORT_REFUSALS];
	uint64_t export_bytes;
	uint64_t local_fallbacks; /* failed pool restores the local tiers' copy took over */
	uint64_t evictions_lost;  /* times the holdings were announced again after lost notices */
	/* The end-of-chain cascade (design 2.15): local records the pool
	 * accepted (they left the local tier), and those kept local after a
	 * refused or failed put. */
	uint64_t cascaded, cascade_kept;
} sel_pool_counters;
/* The remote tier's client (issue 16, docs/remote.md): its counters and
 * gauges, for /metrics.  enabled is false (everything 0) without one. */
#define SEL_REMOTE_RTT_BINS 20 /* bin i: round trips <= 16 us << i; the last: above */
typedef struct sel_remote_tier_stats {
	bool enabled;
	uint64_t lookups, hits;         /* remote lookups submitted, hits returned */
	uint64_t lookups_late;          /* answers that came after the grace period */
	uint64_t bytes_in, bytes_out;   /* restored from / written to Redis (payload) */
	uint64_t puts, stored, present; /* background writes: queued, written, already there */
	uint64_t put_failures;
	uint64_t skipped;          /* background writes skipped: queue or slots full */
	uint64_t writes_in_flight; /* background writes copying out or on their way */
	uint64_t claims, claim_failures;
	uint64_t auth_failures, corrupt, dropped;
	uint64_t moved, ask, reconnects, stalls;
	uint32_t state; /* 0 connecting, 1 up, 2 degraded, 3 down */
	uint32_t nodes, nodes_up;
	uint64_t rtt_ns, grace_ns; /* median round trip; lookup grace period */
	uint64_t rtt_hist[SEL_REMOTE_RTT_BINS];
	uint64_t rtt_sum_ns; /* of the round trips in rtt_hist */
} sel_remote_tier_stats;

/* The period of a core store's warm passes (sel_stats.warm_passes). */
#define SEL_WARM_PERIOD_NS 1000000ull

typedef struct sel_stats {
	const char *transport; /* copy backend: "host", "cuda" */
	uint64_t slot_bytes;   /* bytes per slot (one page record, padded) */
	uint64_t slots_in_use, slots_total, intake_slots;
	uint64_t parked_records;
	uint64_t outcomes[SEL_SKIPPED + 1]; /* put() results and deferrals */
	uint64_t retry_reasons[SEL_RETRY_REASONS];
	uint64_t lookups, hits; /* lookups made, hits returned */
	/* Lookup candidates passed over because a node of their chain had
	 * another key than the request's history gives at its consumed count:
	 * a parent link naming another prefix's record (forged, or stale). */
	uint64_t chains_rejected;
	uint64_t reused_tokens; /* tokens restored by completed fetches */
	uint64_t fetches, fetch_failures;
	uint64_t store_failures;
	uint64_t inflight_out, inflight_in;
	uint64_t packed_records, per_rank_records;
	/* Disk-only TP>1 stores abandoned: a later page window differed across
	 * ranks after the first decided they were replicated (design 2.5). */
	uint64_t abandoned_stores;
	/* Composite traffic between its tiers, included in the disk tier's
	 * bytes_out (spills: memory to disk) and bytes_in (read-through: disk
	 * to memory); the rest of the tiers' bytes crossed to or from the GPU. */
	uint64_t spilled_bytes, read_through_bytes;
	uint64_t evictions_noticed;
	/* The disk tier's record I/O path now: "io_uring+O_DIRECT" (design
	 * 2.10), "io_uring+buffered", "pread+O_DIRECT", "pread+buffered";
	 * NULL without a disk tier.  A static string. */
	const char *disk_io;
	sel_tier_stats tier[SEL_TIERS];
	sel_pool_counters pool; /* zero without --prefix-cache-pool */
	/* The remote tier (issue 16; all zero without one). */
	sel_remote_tier_stats remote;
	/* Wakes of the store's copy and disk threads that its calls sent on
	 * the worker's thread (each one futex syscall; issue 18). */
	uint64_t thread_wakes;
	/* Passes of the lookup's hash that the store's polls ran, at most one
	 * per SEL_WARM_PERIOD_NS of its clock and only while the worker polls
	 * at least that often, to keep that code in the worker's caches
	 * (issue 18, worker calls; store_common.c). */
	uint64_t warm_passes;
	/* Of those, the passes that also read the completion eventfd while
	 * nothing was owed on it (EAGAIN, no effect), to keep the delivering
	 * poll's read warm (transfer.h sel_xfer_warm). */
	uint64_t warm_reads;
} sel_stats;

/* struct sel_store and the ops table it dispatches through are the
 * implementer's (selene_store.h): an engine never needs them. */

/* Dispatch.  See the contract above. */

/* Deepest restorable host chain for h above the GPU-resident count and at
 * or below limit: 1 with *hit filled, 0 for a miss.  Pins nothing.
 * A store with a network tier (the remote tier, issue 16) may also return
 * SEL_LOOKUP_PENDING: its answer is not in yet, and the caller should hold
 * the request and ask again with the same history, resident count and
 * limit after a later poll; the store answers 0 or 1 once its grace
 * period (design 2.15: four round trips, 2..250 ms) has passed, and its
 * wait descriptor becomes readable when the answer or the period's end
 * is due.  Callers that cannot hold a request treat it as a miss.
 * Errors: -ENOMEM, -EINVAL (NULL store), -EPROTO (an ops table of another
 * version, selene_store.h). */
int sel_store_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_hit *hit);
/* sel_store_lookup's answer from a pooled store or the remote level while
 * that level's answer is due (design 2.15 "Lookups": the pool's 2 ms grace
 * period, the remote tier's four measured round trips): nothing in *hit;
 * hold the request and ask again after a poll (the wait fd becomes
 * readable by the end of the grace period, and after it the lookup
 * answers from the levels that did answer). */
#define SEL_LOOKUP_PENDING 2
/* Offer a checkpoint.  why (may be NULL) receives the reason of a
 * SEL_RETRY.  Returns an outcome, never an error code: a checkpoint that
 * cannot be used (page ids beyond the planes, a tail longer than its
 * chain, a state slot beyond the rows, a tail that does not extend its
 * parent), a store that stopped or closed, or a failed allocation is
 * SEL_SKIPPED with sel_errmsg() saying why. */
sel_outcome sel_store_put(sel_store *s, const sel_published *cp, sel_retry_reason *why);
/* Restore hit into in's page ids and state slot: 0 means exactly one
 * SEL_EV_FETCHED or SEL_EV_FETCH_FAILED follows for in->ticket.
 * Errors: -ESTALE (the chain changed since the lookup: a node gone, no
 * longer complete, another page count, a chain digest other than the one
 * the lookup verified, a disk node without its file -- treat it as a
 * miss), -EINVAL (no hit or destination, in->n_pages != hit->pages, a page
 * id or state slot beyond the planes), -EAGAIN (the memory tier's transfer
 * queue is full: try again after a poll), -ENOMEM, SEL_ESTOPPED (closed, or
 * stopped after a transfer failed for good), -EPROTO. */
int sel_store_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in);
/* Up to cap completed events; never blocks.  Returns the count.
 * Errors: -EINVAL (NULL store), -EPROTO. */
int sel_store_poll(sel_store *s, sel_event *ev, size_t cap);
/* The GPU retired a checkpoint (LRU or compaction; heir: the child that took
 * its pages, or NULL). */
void sel_store_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir);
/* Eviction notices were lost (design 2.15 evictions_lost): the store
 * forgets what it announced and announces again.  NULL-safe. */
void sel_store_evictions_lost(sel_store *s);
/* A GPU-resident hit: refresh the host record's recency. */
void sel_store_touch(sel_store *s, const sel_key *key);
void sel_store_stats(sel_store *s, sel_stats *out);
/* A descriptor that becomes readable when poll has something (eventfd), so
 * the worker can sleep on it with its other inputs; -1 if none (or for a
 * store that cannot be called).  Owned by the store. */
int sel_store_wait_fd(sel_store *s);
/* Drain within deadline_ns (monotonic, 0 = wait as long as needed) and
 * join threads.  A second close returns what the first did; NULL is 0.
 * Errors: SEL_ESTOPPED (a copy or disk I/O could not drain: the store
 * keeps its memory, destroy leaks it instead of freeing, and the caller
 * must keep its planes mapped), -EPROTO. */
int sel_store_close(sel_store *s, uint64_t deadline_ns);
/* Free everything (after close).  NULL-safe. */
void sel_store_destroy(sel_store *s);
/* The store's startup warning ("" when none; NULL-safe), valid until
 * destroy.  Print it once with the startup summary. */
const char *sel_store_warning(const sel_store *s);
/* End of a service pass (issue 18 "worker calls"): wake the store's copy
 * and disk threads for the work that this pass's put and fetch calls
 * queued, one wake per sleeping thread however many jobs the pass queued.
 * put and fetch may leave their jobs for the next flush or poll instead of
 * waking a thread on every call; sel_store_poll flushes as well.  Call it
 * once per loop iteration, before sleeping on the wait descriptor (a job
 * whose flush never comes still starts, up to 50 ms late).  A store defers
 * only from its first flush on: a caller (or a wrapping store that does
 * not forward flush) that never calls it keeps a wake in every put and
 * fetch.  Cheap when nothing is due (no syscall); never blocks.
 * NULL-safe. */
void sel_store_flush(sel_store *s);

/* Overlapped restores (issue 18): a request recomputes the head of a
 * hit's pages while the tail loads, and the recomputed pages must equal
 * the stored ones.  They are compared by page digest: XXH3-64 streamed
 * over, for each rank in order, the page's bytes in each page plane in
 * geometry order, unpadded (not the record file's page checksum, which
 * covers a slot's never-written padding too: page_digest.c). */
/* The digests of pages [first, first + n) of hit's chain (page 0 is the
 * first page past hit->resident) as the store holds them, into out[0..n),
 * computed now from host copies on the caller's thread.
 * Errors: -ENOTSUP (the store cannot say without I/O: a record only on
 * disk, in the pool or remote; a split pool; a store without the entry),
 * -ESTALE (the chain changed since the lookup), -EINVAL (no hit, or the
 * range beyond hit->pages), -EPROTO. */
int sel_store_page_digests(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t n,
			   uint64_t *out);
/* The record whose endpoint is key was found wrong (a page's recompute did
 * not match it): remove it, or, while children use its pages, drop its
 * row so it no longer answers lookups.  Counted in the tier's corrupt.
 * Errors: -ENOENT (no such record), -EBUSY (in use by a transfer: left),
 * -ENOTSUP (a store without the entry), -EINVAL, -EPROTO. */
int sel_store_drop(sel_store *s, const sel_key *key);
/* The page digest of page id `page` in the live planes of g (host memory
 * only).  Errors: -ENOTSUP (a device plane), -EINVAL (page beyond a
 * plane's count). */
int sel_page_digest(const sel_geometry *g, uint32_t page, uint64_t *out);
/* The same with each plane's bytes followed by zeros up to its 4 KiB
 * boundary: a version-4 record file's page checksum of that page (one
 * share per rank), which a disk fetch delivers as sel_inbound.sums.  Equal
 * to sel_page_digest when no plane needs padding. */
int sel_page_digest_padded(const sel_geometry *g, uint32_t page, uint64_t *out);

/* What the startup summary reports about a store (design 2.11). */
typedef struct sel_store_info {
	const char *kind;         /* "memory", "disk", "composite", a test double's name */
	const char *transport;    /* copy backend: "host", "cuda" */
	const char *disk_dir;     /* namespace directory, or NULL without a disk tier */
	uint64_t disk_limit;      /* bytes; 0 without a disk tier */
	uint64_t scanned_records; /* records the startup scan kept */
	uint64_t slot_bytes, slots_total, intake_slots;
	const char *disk_io;      /* the record I/O path at startup, or NULL (no disk tier) */
	const char *disk_io_note; /* why it is not io_uring+O_DIRECT, or "" */
	const char *warning;      /* the startup warning, or "" (sel_store_warning) */
	uint64_t disk_shared;     /* of the disk limit, set aside (disk_share_div); disk_limit
				      is the store's own part */
	/* With a pool: "unix:PATH, pool 'NAME', arena 64 GiB" or why it is not
	 * attached; NULL without --prefix-cache-pool. */
	const char *pool;
	/* The remote tier: "redis://... (1 node: 127.0.0.1:6379), key <id>,
	 * encryption off", or NULL without one. */
	const char *remote;
} sel_store_info;
/* Fill *out (NULL-safe store: everything zero, kind "disabled").  The
 * strings are the store's, valid until destroy. */
void sel_store_describe(sel_store *s, sel_store_info *out);

/* ---- Opening stores (design 1, 2.4, 2.9, 2.11) -------------------------- */

/* How a standalone memory store lays out its slot pool on the CUDA backend
 * (design 2.5).  A registered pool is one host mapping pinned with
 * cuMemHostRegister, which maps it into every device's page tables; a split
 * pool gives each rank its share of every slot as one pinned allocation on
 * the host NUMA node nearest the rank's device, mapped for that device (and
 * the host) only, so each device pays for its own share.  Records in a split
 * pool stay per-rank (no TP packing: their bytes are not compared on the
 * CPU).  Disk and composite stores, whose disk threads read whole records,
 * always use the registered pool. */
typedef enum sel_split_mode {
	/* The design's choice: split a memory store's pool when it has no disk
	 * tier, copies with the CUDA driver and has ranks > 1, and every device
	 * can create host-NUMA allocations; otherwise the registered pool (with
	 * a startup warning when only the devices stood in the way). */
	SEL_SPLIT_AUTO = 0,
	/* Split it, at any rank count, or fail: -EINVAL with a disk tier or a
	 * host (memcpy) or test copy backend, SEL_ECUDA where a device cannot. */
	SEL_SPLIT_ON = 1,
	/* Always the registered pool (TP packing stays possible). */
	SEL_SPLIT_OFF = 2,
} sel_split_mode;

typedef enum sel_backend_kind {
	SEL_BACKEND_AUTO = 0, /* from the geometry's memory kinds */
	SEL_BACKEND_HOST,     /* planes in host memory: memcpy */
	SEL_BACKEND_CUDA,     /* planes in device memory: the CUDA driver (dlopen) */
} sel_backend_kind;

/* The shutdown drain's progress (design 2.5), for the operator's log. */
typedef struct sel_drain_progress {
	bool final;                              /* the last report: the drain is over */
	uint64_t elapsed_ns;                     /* since the drain began */
	uint64_t records_written, bytes_written; /* files committed by the drain */
	uint64_t records_writing, bytes_writing; /* writes in flight */
	uint64_t records_left, bytes_left;       /* DRAM-only, not started */
	uint64_t rate_bps;                       /* bytes_written / elapsed */
	/* Final: why records were not saved ("" when all were): "time limit"
	 * (drain_ns passed), "deadline" (the close deadline passed), "disk
	 * limit" (no budget without evicting committed files), "disk full"
	 * (ENOSPC/EDQUOT after a few retries), "write errors", "stopped". */
	const char *why;
	uint64_t failed; /* writes that failed (their records not saved) */
	/* The drain on shutdown is off: one final report at close when DRAM-only
	 * records exist, with records_left / bytes_left the records lost (why
	 * "drain off"), so a stop never drops them without a word. */
	bool off;
} sel_drain_progress;

/* The engine's side of exports (design 2.15): a pooled store announces
 * the checkpoints offered to it as GPU holdings and, when the manager asks
 * for one on a neighbour's behalf, calls these on the worker thread from
 * within sel_store_poll. */
typedef struct sel_export_hooks {
	void *ctx;
	/* Pin GPU checkpoint `checkpoint` (the id it was offered with), whose
	 * key must be *key, and describe it into *out (its whole chain's page
	 * ids, valid until the next call, and its state slot).  0, or
	 * -ENOENT (it left the GPU cache or lost its row), -ESTALE (the id
	 * holds another key), -ENOSPC (no headroom: pinning it now would take
	 * what serving needs). */
	int (*pin)(void *ctx, const sel_key *key, uint64_t checkpoint, sel_published *out);
	/* Undo a pin once the export's copy drained. */
	void (*unpin)(void *ctx, uint64_t checkpoint);
	/* Optional: describe without pinning (0, or -ENOENT once it left the
	 * GPU cache): which announced holdings are still true after eviction
	 * notices were lost. */
	int (*describe)(void *ctx, uint64_t checkpoint, sel_published *out);
} sel_export_hooks;

/* Landed restore windows (issue 18): called on a transfer thread after a
 * window of a restore's copy-in has landed in the planes, before that
 * rank's part of the copy is reported, with the rank (the geometry's), the
 * window's destination page ids (pages[0..n_pages), in the ticket's order)
 * and, for the window that carries the row, row true and the ticket's
 * state slot.  The destinations belong to the restore until its event
 * (design 2.12): fn may read them, and what it writes is ordered before
 * the event reaches the worker.  It must be quick and must not block or
 * call the store.  Every window of a FETCHED restore was reported to it,
 * unless the store could not run it (CUDA planes, which the CPU cannot
 * read; a transport without per-window copies): a caller must not rely on
 * it, only use what it computed.
 *
 * row_piece (optional, NULL: none) hands the row over in pieces instead:
 * the row's window then copies the rank's share of the row (state_slot's
 * bytes [0, row bytes) of the geometry's row plane) in pieces of at most
 * 256 KiB, each its own copy, and calls row_piece after each piece landed
 * with its byte range [off, off + len) and src, the host bytes it was
 * copied from (equal to the landed ones; just read by the copy, so still
 * in the cache, while the destination may have been written past it):
 * ascending, without gaps, from 0 to the row's end, before fn's call with
 * row true for the same window.  Same rules as fn (it may read the piece
 * and src[0, len) during the call; quick, no blocking, no store calls); a
 * failed piece ends the calls, and fn is not called for that window.
 *
 * page (optional, NULL: none) does the same for pages: each page of a
 * copy-in window is then its own copy, and page is called after it landed
 * with its id and its copies[0..n) (one per page plane of the rank, in
 * the geometry's order: destination, the host source it was copied from,
 * length), before fn's call for the window (which still names every page
 * of it).
 *
 * share (optional, NULL: never) says whether a second thread may take part
 * in a restore's copies now: true while the caller's model worker is idle
 * (waiting for this restore or for work), so its CPU is free.  Where it
 * says so, the store's host copy path may copy a restore's pages on two
 * threads at once: page may then be called for two different pages of
 * one restore at the same time, and while row_piece runs for its row
 * (never twice for one page, never at once with fn); fn's calls for every
 * window, in order, then follow all the restore's page and row_piece
 * calls, and none follows a failed restore.  It is asked on a transfer thread before each page is
 * taken: cheap (an atomic load), no blocking. */
typedef struct sel_landed_copy {
	const void *dst, *src;
	uint64_t len;
} sel_landed_copy;

typedef struct sel_landed_hook {
	void (*fn)(void *ctx, uint32_t rank, const uint32_t *pages, uint32_t n_pages, bool row,
		   uint32_t state_slot);
	void *ctx;
	void (*row_piece)(void *ctx, uint32_t rank, uint32_t state_slot, uint64_t off, uint64_t len,
			  const void *src);
	void (*page)(void *ctx, uint32_t rank, uint32_t page, const sel_landed_copy *copies,
		     uint32_t n);
	bool (*share)(void *ctx);
} sel_landed_hook;

typedef struct sel_store_config {
	const sel_geometry *geometry;         /* live plane addresses; outlives the store */
	uint8_t identity[SEL_IDENTITY_BYTES]; /* offload identity (namespace) */
	uint8_t model_identity[SEL_IDENTITY_BYTES];
	uint32_t max_active;    /* scheduler concurrency (intake size) */
	uint64_t memory_bytes;  /* warm budget; 0 = none */
	const char *disk_dir;   /* base directory; NULL = no disk tier */
	uint64_t disk_limit;    /* 0 = one tenth of free space */
	uint64_t host_headroom; /* bytes intake may use; 0 = from MemAvailable */
	sel_backend_kind backend;
	const int *cuda_devices;   /* [ranks] device ordinals (CUDA) */
	uint32_t queue_depth;      /* per-rank transfer channel; 0 = 64 */
	bool populate;             /* pre-fault the slab mapping */
	sel_split_mode split_pool; /* memory-only CUDA slot pool; 0 = AUTO */
	bool fdatasync;            /* fdatasync record files before rename */
	/* Composite: at close, write DRAM-only (parked) records to disk first
	 * (design 2.5 --prefix-cache-drain-on-shutdown): the most recently
	 * used first, each after its parked ancestors; new writes start only
	 * within drain_ns (0 = until done) and the close deadline, writes
	 * started finish.  Committed files are never evicted to make room.
	 * drain_progress (may be NULL) is called from sel_store_close on the
	 * closing thread about once a second while it drains and once at the
	 * end (final), with drain_ctx. */
	bool drain_on_shutdown;
	uint64_t drain_ns;
	void (*drain_progress)(void *ctx, const struct sel_drain_progress *p);
	void *drain_ctx;
	/* Expiry (design 2.5 --prefix-cache-max-age): records whose last use
	 * (publication, reuse, restore, a child's publication; file mtime
	 * after a restart) is older than max_age_ns are dropped by a sweep
	 * that sel_store_poll runs at most once a minute.  0 = off. */
	uint64_t max_age_ns;
	/* Tests: a struct sel_copy_backend replacing the host/CUDA backend. */
	const void *copy_backend;
	/* Tests and tools: the clock of record ages and expiry sweeps, ns
	 * since the epoch (NULL = CLOCK_REALTIME, which file mtimes use). */
	uint64_t (*clock_ns)(void);
	/* Pool manager address (design 2.15): "unix:PATH" (or a path).  With
	 * it sel_store_open wraps the local tiers (or none: pool only) in the
	 * pooled store, which attaches at open (waiting up to pool_wait_ns, 0:
	 * 10 s, for the manager's hello); an absent or refusing manager leaves
	 * the local tiers alone, with one warning (sel_store_warning). */
	const char *pool;
	/* Nonzero: one disk_share_div-th of the resolved disk limit is set
	 * aside for the other records of the namespace directory (a vision
	 * core's .input files, design 2.11 "Checkpoint and CPU input records
	 * share this limit"); the store's own records get the rest.
	 * sel_store_info.disk_shared says how much. */
	uint32_t disk_share_div;
	/* Host bytes the process's other allocations may take (a vision
	 * core's CPU inputs: the cold decoded-source allowance, the input
	 * index, one serialized record in flight; design 2.13 "The loader
	 * accounts for these allocations"): left out of the headroom the
	 * intake is sized from when host_headroom is 0. */
	uint64_t host_reserved;
	/* Pool instance id inputs: an explicit id (NULL: derived from the
	 * machine id, model_identity and pool_listen, docs/pool.md). */
	const char *pool_instance_id;
	const char *pool_listen;
	uint64_t pool_wait_ns;
	/* The shortest grace period a lookup waits for the pool's answer (0:
	 * 2 ms, design 2.15); four measured round trips when longer. */
	uint64_t pool_grace_ns;
	/* Tests: the machine id file (NULL: /etc/machine-id). */
	const char *pool_machine_id_path;
	/* Exports to neighbours (NULL: none; no GPU holdings announced). */
	const sel_export_hooks *pool_exports;
	/* The remote tier (issue 16, docs/remote.md): a Redis URL
	 * (redis://HOST:PORT[/DB], unix:///PATH, redis-cluster://HOST:PORT,...)
	 * or NULL.  The remote level wraps the local store of the table above
	 * (or none): the last level of the cascade and of copy priority.
	 * remote_key: the deployment's 32-byte secret (sel_remote_key_load),
	 * or NULL (checksums only); remote_encrypt needs it. */
	const char *remote;
	const uint8_t *remote_key;
	bool remote_encrypt;
	/* Tests: the remote client's window payload bytes (0 = 4 MiB - 4 KiB). */
	uint32_t remote_window_bytes;
	/* Ranks on separate hosts (design 2.14, docs/multihost.md): rank zero of
	 * a core whose ranks run as separate processes.  The disk store then
	 * runs the sharded transport to every peer (store_disk_sharded.h, internal
	 * to libselene and the engine); NULL: every rank in this process. */
	const struct sel_store_ranks *ranks;
	/* Restore windows as they land (NULL: none); outlives the store. */
	const sel_landed_hook *landed;
} sel_store_config;

/* Read a remote tier key file (docs/remote.md): 32 raw bytes or 64 hex
 * digits, a regular file not readable or writable by others, not all
 * zero.  0, SEL_EFORMAT, -EPERM (its mode) or the errno, with a message
 * naming the path. */
int sel_remote_key_load(const char *path, uint8_t out[32]);
/* Check a remote tier URL without connecting: 0 or SEL_EFORMAT with a
 * message quoting it. */
int sel_remote_url_check(const char *url);
/* "connecting", "up", "degraded", "down" (sel_remote_tier_stats.state). */
const char *sel_remote_state_label(uint32_t state);

/* The one constructor (design 1's configuration table): memory_bytes > 0
 * and no disk_dir -> the memory store; memory 0 and a disk_dir -> the disk
 * store; both -> the composite; neither -> *out = NULL and 0 (offload
 * disabled).  A disk tier creates and locks <disk_dir>/<identity prefix>-
 * <fingerprint>, fails with -EBUSY (before scanning or deleting anything)
 * when another owner holds it, scans it and rebuilds its index.  Its limit
 * is disk_limit, or one tenth of the free space of the directory's
 * filesystem at startup when 0 (callers that mean "no disk tier" pass no
 * disk_dir).  On error *out is NULL and sel_errmsg() names the setting.
 * Errors (those of the stores below too):
 *   -EINVAL       no geometry; a pool address that is not unix:PATH (or a
 *                 path with a '/'); a warm budget smaller than one slot; a
 *                 split_pool value that is no mode, or on with a disk tier
 *                 or a host copy backend
 *   -ENOTSUP      cfg->pool with a CUDA backend (not in this build)
 *   SEL_EGEOMETRY the host backend asked for with device planes
 *   SEL_ECUDA     the CUDA driver is unavailable or a driver call failed
 *                 (the message names the call, rank and device)
 *   -EBUSY        another owner holds the namespace directory's lock (its
 *                 pid in the message); nothing was scanned or deleted
 *   SEL_EDIRECTORY the record directory cannot be used (not a directory, a
 *                 symbolic link, no permission, a read-only filesystem)
 *   -ENAMETOOLONG, -EOVERFLOW, SEL_EOVERSIZE (a layout beyond what a
 *                 record header can describe), -ENOMEM, -EMFILE and other
 *                 errno values from the filesystem, eventfd, epoll or
 *                 thread creation */
int sel_store_open(const sel_store_config *cfg, sel_store **out);

/* The memory store (design 2.4): index + slab pool + transfers.
 * Errors: as sel_store_open; -EINVAL when memory_bytes is 0. */
int sel_memory_store_open(const sel_store_config *cfg, sel_store **out);
/* The disk store (design 2.4 DiskStore, Staged transport): record files in
 * the namespace directory, streamed through intake slots.  memory_bytes is
 * ignored.  Errors: as sel_store_open; -EINVAL without disk_dir. */
int sel_disk_store_open(const sel_store_config *cfg, sel_store **out);
/* The composite (design 2.4 CompositeStore): warm memory over the disk
 * store, one shared slot pool.  Needs memory_bytes > 0 and disk_dir.
 * Backpressure (design 2.10): a put that warm memory cannot take now --
 * its slots held by records not yet durable on disk, by copies in flight
 * or by reads -- is SEL_RETRY (SEL_RETRY_INFLIGHT or SEL_RETRY_SLABS), with
 * no copy and no GPU pin; maintenance writes make room and SEL_EV_PROGRESS
 * says so.  Only a record larger than the warm pool, which memory can
 * never retain, streams to disk through bounded staging, and at most two
 * such streams run at once (more: SEL_RETRY_INFLIGHT).
 * Errors: as sel_store_open; -EINVAL without both memory_bytes and
 * disk_dir. */
int sel_composite_store_open(const sel_store_config *cfg, sel_store **out);

/* ---- Policy (design 2.10) ---------------------------------------------- */

typedef struct sel_policy sel_policy;

/* Transfer time is estimated per tier as a fixed cost plus bytes over a
 * bandwidth, both fitted from completed transfers (policy.c).  Initial
 * estimates: memory 50 us + 20 GB/s, disk 300 us + 3 GB/s, pool 1 ms +
 * 400 MiB/s; prefill 8,000 tokens/s.  Errors: -ENOMEM. */
int sel_policy_create(sel_policy **out);
void sel_policy_destroy(sel_policy *p);
/* Fetch when the estimated transfer time of bytes from tier is below the
 * estimated prefill time of tokens_gained (tokens / prefill rate). */
bool sel_policy_should_fetch(const sel_policy *p, sel_tier tier, uint64_t bytes,
			     uint64_t tokens_gained);
/* A completed transfer at tier: bytes in ns, restoring pages pages.  Failed
 * transfers are not passed; row-only restores (pages 0) and transfers of
 * zero bytes or time are ignored (design 2.15). */
void sel_policy_observe(sel_policy *p, sel_tier tier, uint64_t bytes, uint64_t ns, uint32_t pages);
/* The worker's measured prefill throughput (tokens per second). */
void sel_policy_set_prefill_rate(sel_policy *p, double tokens_per_s);
double sel_policy_rate(const sel_policy *p, sel_tier tier);     /* fitted bandwidth, bytes/s */
double sel_policy_fixed_ns(const sel_policy *p, sel_tier tier); /* fitted fixed cost, ns */
/* The estimate for bytes from tier, ns (infinite for SEL_TIER_NONE). */
double sel_policy_transfer_ns(const sel_policy *p, sel_tier tier, uint64_t bytes);
double sel_policy_prefill_rate(const sel_policy *p);
/* Prefill time by position (policy.c DESIGN): the worker reports each
 * prefill chunk it ran, positions [begin, end) in ns; chunks of fewer than
 * 16 tokens are ignored.  sel_policy_prefill_rate is then the rate at
 * position 0, and the estimate of a span grows with its positions. */
void sel_policy_observe_prefill(sel_policy *p, uint64_t begin, uint64_t end, uint64_t ns);
/* The estimated prefill time of positions [begin, end), ns. */
double sel_policy_prefill_ns(const sel_policy *p, uint64_t begin, uint64_t end);
/* The fitted growth of the cost per token with position, ns per token per
 * position (0 while unmeasured). */
double sel_policy_prefill_growth(const sel_policy *p);
/* Fetch when the estimated transfer time of bytes from tier is below the
 * estimated prefill time of positions [begin, end): the tokens a hit gains
 * over what the GPU holds.  sel_policy_should_fetch is the span
 * [0, tokens_gained). */
bool sel_policy_should_fetch_span(const sel_policy *p, sel_tier tier, uint64_t bytes,
				  uint64_t begin, uint64_t end);

/* An overlapped restore (issue 18; policy_split.c): recompute the head
 * [begin, at) of a hit's gained positions on the model stream while the
 * tail's pages [at / page_tokens, end / page_tokens) and the endpoint row
 * load from tier, the split chosen so both are estimated to finish
 * together.  at is a page boundary above begin and at or below end. */
typedef struct sel_split {
	uint64_t at;         /* the best head end; 0 when no page boundary is left */
	double head_ns;      /* estimated prefill of [begin, at) */
	double tail_ns;      /* estimated transfer of the tail's pages and row */
	double split_ns;     /* max of the two: the overlapped restore's estimate */
	double restore_ns;   /* the whole hit restored */
	double recompute_ns; /* the whole span recomputed */
} sel_split;
/* The best split of a hit gaining [begin, end) from tier, whose pages take
 * page_bytes each and whose row row_bytes (all ranks).  True when the hit
 * should be split: its restore is not estimated clearly faster than its
 * recompute (within 1.5x, or slower) and the split's estimate is below 0.9
 * of the faster of the two.  *out holds the best split and the estimates
 * either way (at 0 when the span has no page boundary above begin).  Never
 * fails: a tier without estimates or an empty span is false. */
bool sel_policy_split(const sel_policy *p, sel_tier tier, uint64_t page_bytes, uint64_t row_bytes,
		      uint32_t page_tokens, uint64_t begin, uint64_t end, sel_split *out);

#ifdef __cplusplus
}
#endif
#endif
