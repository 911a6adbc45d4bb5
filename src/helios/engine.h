/*
 * engine.h - the serving engine as the HTTP front end sees it: a model
 * worker thread that owns the model, the scheduler, the GPU checkpoint cache
 * and the optional host store (design 2.8, 2.9, 2.11).
 *
 * The front end's threads only parse, validate and queue: hel_engine_submit
 * copies the request into the worker's bounded queue and returns.  The worker
 * reports tokens and completion through the request's callbacks, called on
 * the worker thread: they must not block (copy the tokens, signal, return).
 * Exactly one on_done call follows a successful submit, after every
 * on_tokens call of that request; none follows a failed submit.
 */
#ifndef HEL_ENGINE_H
#define HEL_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "image.h"
#include "model.h"
#include "selene.h"

typedef struct hel_engine hel_engine;

/* --prefix-cache-fetch: who decides whether a host hit is restored. */
typedef enum hel_fetch_mode {
	HEL_FETCH_AUTO =
		0,        /* the fetch policy (design 2.10): the faster of restore and recompute */
	HEL_FETCH_ALWAYS, /* restore every host hit */
	HEL_FETCH_NEVER,  /* recompute every host hit (counted as declined) */
} hel_fetch_mode;

/* --prefix-cache-overlap (issue 18, engine_overlap.c): overlapped restores,
 * the head of a hit recomputed while its tail loads. */
typedef enum hel_overlap_mode {
	HEL_OVERLAP_ON = 0, /* where the policy's split says it is faster */
	HEL_OVERLAP_OFF,    /* never: restore or recompute whole */
	HEL_OVERLAP_ALWAYS, /* every hit the store can give digests for, split at
			       the middle page boundary (tests) */
} hel_overlap_mode;

typedef struct hel_engine_config {
	const hel_core *core;     /* must outlive the engine */
	sel_state_mode mode;      /* --speculate: ordinary, copy, learned */
	uint32_t draft_tokens;    /* --draft-tokens: proposals per speculative round,
					1..HEL_DRAFT_MAX; 0 = HEL_DRAFT_DEFAULT */
	uint32_t max_active;      /* --max-active: concurrently running requests */
	uint64_t gpu_cache_bytes; /* --gpu-cache: page planes + rows budget */
	uint32_t queue_limit;     /* pending requests accepted; 0 = 1024 */
	/* Host prefix cache (design 1, 2.11).  The store is selected from these
	 * by the table of design 1; all zero/NULL: disabled. */
	uint64_t memory_bytes;   /* --prefix-cache-memory */
	const char *disk_dir;    /* --prefix-cache-disk: base directory, or NULL */
	uint64_t disk_limit;     /* --prefix-cache-disk-limit; see disk_limit_set */
	bool disk_limit_set;     /* an explicit limit (0 then selects no disk store) */
	bool drain_on_shutdown;  /* --prefix-cache-drain-on-shutdown */
	uint64_t drain_limit_ns; /* its duration; 0 = until done */
	/* The drain's progress, called by hel_engine_stop on the stopping
	 * thread about once a second and once at the end (final); NULL: none
	 * (sel_store_config.drain_progress). */
	void (*drain_progress)(void *ctx, const sel_drain_progress *p);
	void *drain_ctx;
	/* Called once, on the worker thread, when the store stops for good
	 * (its poll failed: design 2.12, a transfer whose completion cannot be
	 * reported): rc, a short reason (hel_store_stop_reason) and the
	 * store's message.  Serving goes on without the store.  Must not
	 * block for long.  NULL: nothing is said (the stats still are). */
	void (*store_stopped)(void *ctx, int rc, const char *reason, const char *why);
	void *store_stopped_ctx;
	uint64_t max_age_ns; /* --prefix-cache-max-age; 0 = off */
	bool fdatasync;
	/* --prefix-cache-pool (design 2.15; sel_store_config.pool): the
	 * manager's address, NULL for none; the instance id (NULL: derived
	 * from the machine id, the core and pool_listen); how long startup
	 * waits for the manager's hello (0: 10 s). */
	const char *pool;
	const char *pool_instance_id;
	const char *pool_listen;
	uint64_t pool_wait_ns;
	uint64_t pool_grace_ns; /* --prefix-cache-pool-grace; 0: 2 ms */
	/* The remote tier (issue 16): --prefix-cache-remote URL or NULL; the
	 * key (32 bytes, copied at open) or NULL; --prefix-cache-remote-encrypt. */
	const char *remote;
	const uint8_t *remote_key;
	bool remote_encrypt;
	uint32_t remote_window_bytes; /* tests: smaller windows; 0 = 4 MiB - 4 KiB */
	/* Tuning, tests and tools (0 / NULL: defaults). */
	uint32_t gpu_pages, gpu_rows; /* explicit cache ids (both, instead of
					 sizing from gpu_cache_bytes) */
	uint32_t chunk_tokens;        /* prefill tokens per request per step (256) */
	uint32_t step_tokens;         /* tokens per step, all requests (1024) */
	hel_fetch_mode fetch;         /* --prefix-cache-fetch (tests whose tiny
					restores could look slow use ALWAYS) */
	uint64_t (*clock_ns)(void);   /* record ages and expiry sweeps (tests;
					NULL: the wall clock) */
	/* Tests only (FLARE_TEST_HOLD_INBOUND): while this path exists, the
	 * worker keeps completed restores to itself, so that a test can admit
	 * requests onto one in-flight ticket without a race.  NULL: off. */
	const char *test_hold_inbound;
	/* Tests only: with --prefix-cache-overlap on, every host hit the
	 * policy's split can divide is split at the policy's point, whatever
	 * its estimates say it gains (a tiny core's restores are never worth
	 * a split), so a test can set on against off with all else equal. */
	bool test_split_worth;
	/* Replaces store selection: called once by hel_engine_open with the
	 * configuration the engine would open a store with (geometry,
	 * identities, sizes); the engine closes and destroys what it returns.
	 * *out NULL: no store.  Worker-side test doubles (design 2.2). */
	int (*store_open)(void *ctx, const sel_store_config *cfg, sel_store **out);
	void *store_ctx;
	/* Called on the worker thread with the logits each sampled token was
	 * drawn from: id as returned by hel_engine_submit, position = the
	 * sampled token's index in the sequence.  Must not block. */
	void (*debug_logits)(void *ctx, uint64_t id, uint64_t position, const int32_t *logits,
			     uint32_t vocab);
	/* Called on the worker thread after each speculative round: id, the
	 * position of the round's first emitted token, and the round (its
	 * proposals, acceptance and tokens).  Must not block. */
	void (*debug_round)(void *ctx, uint64_t id, uint64_t position, const hel_round *round);
	void *debug_ctx;
	/* Ranks in separate processes (src/helios/ranks.h): this process's
	 * rank 0 of a multi-host core, or NULL.  Disk-only retention at most. */
	const hel_model_tp *tp;
	/* With tp: the disk store's rank links (hel_ranks_store; design 2.14),
	 * or NULL. */
	const struct sel_store_ranks *store_ranks;
	/* Image inputs (vision cores; docs/inputs.md): the limits the
	 * preparation worker decodes under (all zero: the defaults). */
	hel_image_limits image_limits;
	hel_overlap_mode overlap; /* --prefix-cache-overlap (default on) */
} hel_engine_config;

/* What the startup summary reports (design 2.11). */
typedef struct hel_engine_info {
	const char *store;     /* "disabled", "memory", "disk", "composite" */
	const char *transport; /* "host" (memcpy) or "cuda", or "none" */
	const char *disk_note; /* why no disk store was selected, or "" */
	bool disk_warning;     /* disk_note is a warning: the directory is unusable */
	uint64_t slots_total, intake_slots, slot_bytes;
	uint64_t memory_bytes;
	char disk_dir[4096]; /* the namespace directory, or "" */
	uint64_t disk_limit;
	uint64_t disk_shared;    /* of the disk limit, the image inputs' (vision cores) */
	uint64_t input_memory;   /* of memory_bytes, the image inputs' (vision cores) */
	uint64_t input_reserved; /* host bytes their allowances may take besides (cold
					sources, index, a record in flight) */
	uint64_t scanned_records;
	const char *disk_io;    /* record I/O path ("io_uring+O_DIRECT", ...), or NULL */
	char disk_io_note[512]; /* why not io_uring+O_DIRECT, or "" */
	uint32_t gpu_pages, gpu_rows, max_active;
	char warning[1024]; /* intake shrink warning, the pool's, or "" */
	char pool[600];     /* the pool (address, name, arena) or "" */
	char remote[1024];  /* the remote tier's description (nodes, key,
					encryption), or "" without one */
} hel_engine_info;

/* Per-request result. */
typedef struct hel_outcome {
	int error;                 /* 0, or negative errno / SEL_E* */
	const char *finish_reason; /* "stop", "length", "cancelled", "error" */
	uint32_t prompt_tokens;
	uint32_t completion_tokens;
	uint64_t cached_tokens;       /* prompt tokens not computed: reused */
	uint64_t reused_gpu_tokens;   /* of which from the GPU checkpoint cache */
	uint64_t reused_host_tokens;  /* of which restored from a host tier */
	sel_tier host_tier;           /* that host tier (memory, disk), or NONE */
	bool host_neighbour;          /* pool: another instance exported it (design 2.15) */
	sel_tier host_neighbour_tier; /* from its MEMORY or DISK tier; NONE: its GPU */
	uint64_t prefill_tokens;      /* tokens this request computed in prefill */
	uint32_t prefill_launches;    /* prefill chunks it ran */
	/* Speculative decoding: the draft's proposals for this request and
	 * those verified and emitted (flare.speculation). */
	uint32_t spec_rounds, spec_proposed, spec_accepted;
	/* Overlapped restore (issue 18): prompt tokens recomputed as the head
	 * of a host hit while its tail loaded (not in reused_host_tokens). */
	uint64_t overlap_tokens;
} hel_outcome;

/* An image of a request (vision cores): its encoded bytes (PNG or JPEG,
 * copied by submit) and the prompt positions it occupies:
 * prompt[at .. at + tokens) are HEL_TOK_IMAGE placeholders, which the
 * engine replaces by the image tokens of its semantic identity once its
 * preparation worker has described it (sel_input_tokens).  tokens must be
 * what the image's header gives (hel_vision_grid of its width and height),
 * else the request fails. */
typedef struct hel_image_input {
	const uint8_t *bytes;
	size_t len;
	uint32_t at, tokens;
} hel_image_input;

typedef struct hel_request {
	const hel_token *prompt; /* copied by submit; checkpoints are taken
					 after each HEL_TOK_MESSAGE and at the end */
	uint32_t n_prompt;
	/* Images, in prompt order, not overlapping; HEL_TOK_IMAGE appears in
	 * the prompt exactly at their positions.  None on a text-only core. */
	const hel_image_input *images;
	uint32_t n_images;
	uint32_t max_tokens; /* > 0 */
	bool ignore_eos;     /* the end token does not stop generation */
	hel_sampler sampler;
	const void *cache_salt; /* optional tenant salt (copied) */
	size_t cache_salt_len;
	/* Report each sampled token's log probability with on_tokens, and the
	 * top_logprobs (0..HEL_TOP_LOGPROBS_MAX) most likely tokens. */
	bool logprobs;
	uint32_t top_logprobs;
	/* Branching (design 4): 0, or the id of an earlier request of this
	 * engine with the same prompt and salt.  This one is admitted only
	 * once that one has computed its prompt (sampled its first token) or
	 * ended, so it resumes from that prompt checkpoint in the GPU cache
	 * instead of computing the prompt again; other requests are admitted
	 * past it meanwhile.  An unknown or finished id does not wait. */
	uint64_t after;
	/* Called on the worker thread; must not block.  tokens[0..n) are
	 * accepted in order (one per step, or several from one speculative
	 * round); lp[0..n) their log probabilities (of the model's own
	 * distribution at each token's position), or NULL unless logprobs.
	 * Returns 0 to go on, or k in 1..n: the request ends after its first k
	 * of these tokens (a stop sequence ended there) with finish reason
	 * "stop", completion_tokens counts only those k, and the tokens after
	 * them are discarded: never reported, never part of a checkpoint. */
	uint32_t (*on_tokens)(void *ctx, const hel_token *tokens, const hel_logprob *lp,
			      uint32_t n);
	void (*on_done)(void *ctx, const hel_outcome *outcome);
	void *ctx;
} hel_request;

/* A latency histogram (Prometheus style): bucket[i] counts observations
 * at or below hel_hist_bounds_ns[i] and above the bound before it;
 * bucket[HEL_HIST_BUCKETS] those above the last bound. */
#define HEL_HIST_BUCKETS 22
extern const uint64_t hel_hist_bounds_ns[HEL_HIST_BUCKETS]; /* 0.1 ms ... 60 s */
/* Finer bounds for what takes microseconds (a speculative round). */
extern const uint64_t hel_hist_fine_bounds_ns[HEL_HIST_BUCKETS]; /* 10 us ... 5 s */
typedef struct hel_hist {
	uint64_t bucket[HEL_HIST_BUCKETS + 1];
	uint64_t count;
	uint64_t sum_ns;
} hel_hist;
void hel_hist_observe(hel_hist *h, uint64_t ns);
void hel_hist_observe_in(hel_hist *h, const uint64_t *bounds, uint64_t ns);

/* Image inputs (docs/inputs.md, metrics flare_input_*).  A lookup is a
 * description asked of the caches (every image of every request) or a
 * prepared tensor asked (an image past the reused checkpoint); a hit is
 * one served from that tier (a preparation shared with a concurrent
 * request counts as a memory hit).  saved_ns: each description hit times
 * the mean decode time of built descriptions, plus each tensor hit times
 * the mean preparation time. */
typedef struct hel_engine_input_stats {
	bool enabled; /* a vision core: the preparation worker runs */
	uint64_t lookups, hits_memory, hits_disk;
	uint64_t desc_lookups, desc_hits, tensor_lookups, tensor_hits;
	uint64_t bytes_memory, bytes_disk, records_disk;
	uint64_t memory_budget; /* the memory tier's: warm / 8 */
	uint64_t decodes, preparations, decode_ns, prepare_ns, saved_ns;
	uint64_t images_covered;    /* images a reused checkpoint covered: never prepared */
	uint64_t images_failed;     /* images refused by decoding (their request failed) */
	uint64_t images_reprepared; /* covered once, prepared after all: a replay or a
					  failed restore landed before them */
	uint64_t disk_invalid;      /* .input files that failed verification (removed, rebuilt) */
	uint64_t waiting;           /* requests waiting for their inputs now */
} hel_engine_input_stats;

/* Everything /metrics and the dashboard show.  A consistent snapshot the
 * worker publishes once per loop iteration. */
typedef struct hel_engine_stats {
	uint64_t requests_submitted, requests_finished, requests_cancelled, requests_failed;
	uint64_t pending, active, inbound_waiting;
	uint64_t prompt_tokens, completion_tokens;
	uint64_t prefill_launches, prefill_tokens, decode_tokens;
	uint64_t gpu_lookups, gpu_hits, gpu_reused_tokens;
	uint64_t host_lookups, host_hits, host_reused_tokens;
	uint64_t host_fetch_declined; /* policy said recompute */
	uint64_t host_lookups_held;   /* admission passes that held a request for a pool or
					  remote answer (design 2.15 grace period) */
	uint64_t host_fetch_failed;   /* restores that failed and were recomputed */
	uint64_t late_retries; /* admitted requests readmitted for a late, deeper answer (2.15) */
	uint64_t gpu_pages_free, gpu_pages_total, gpu_rows_free, gpu_rows_total;
	uint64_t gpu_checkpoints, gpu_evictions;
	uint64_t preemptions; /* decoders preempted for pages (resumed later) */
	uint64_t publications, store_retries_pending;
	/* The copy-out pin bound (design 2.10 backpressure): checkpoints
	 * pinned by queued copy-outs now, the most that may be, and puts held
	 * back by it (kept as unpinned retries, reason inflight). */
	uint64_t copyout_pins, copyout_pin_limit, copyout_pin_waits;
	uint64_t retry_abandoned[SEL_RETRY_REASONS];
	uint64_t evictions_noticed, evictions_lost; /* notices delivered; queue overflows */
	/* Branching: requests admitted that named an earlier sibling
	 * (hel_request.after), and the prompt tokens they reused from the GPU
	 * cache. */
	uint64_t branched_requests, branched_reused_tokens;
	/* Latencies, from submit: to admission (queue), admission to the
	 * first token (prefill, restores included), to the first token, between
	 * tokens, to the end of requests that finished (stop or length); and
	 * restores, from the ticket's start to its bytes landing, by host tier. */
	hel_hist queue_time, prefill_time, ttft, tpot, e2e;
	hel_hist restore_time[SEL_TIERS];
	uint64_t model_errors; /* requests failed by a model call */
	/* Restored page and row shares (per rank) whose summaries the
	 * transfer threads computed as they landed, and those the worker
	 * computed itself (model.h landed summaries; issue 18). */
	uint64_t landed_pages, computed_pages, landed_rows, computed_rows;
	/* Speculative decoding (issue 19; design 4 "speculative round time"):
	 * the engine's mode, its rounds, the draft's proposals, those
	 * accepted, the tokens rounds emitted (accepted ones plus each
	 * round's own), the rounds whose proposals came from the history
	 * (copy mode), and each round's model time (fine bounds). */
	sel_state_mode spec_mode;
	uint64_t spec_rounds, spec_proposed, spec_accepted, spec_emitted, spec_copied;
	hel_hist spec_round_time;
	uint64_t prefill_rate; /* measured prefill tokens per second (policy input) */
	bool store_enabled;
	bool store_stopped;            /* the store failed for good; serving goes on without it */
	int store_stop_rc;             /* then: the poll's error */
	const char *store_stop_reason; /* then: hel_store_stop_reason(rc); NULL while running */
	sel_stats store;               /* the host store's counters */
	uint64_t uptime_ns;
	/* The worker's loop: iterations run, and whether the last one found
	 * nothing to do (no submission, store event, admission or step) and
	 * went to sleep.  A quiet snapshot with no request live and no
	 * copy-out pinned means every publication was offered and every
	 * queued copy-out reported: what a caller that reads the stores'
	 * state waits for, instead of a fixed time. */
	uint64_t loops;
	bool quiet;
	hel_engine_input_stats inputs;
	/* Overlapped restores (issue 18): started, head tokens recomputed,
	 * head pages whose recompute differed from the stored page (the
	 * restore then failed, the record was dropped and the request
	 * recomputed), and completed ones. */
	uint64_t overlap_restores, overlap_head_tokens, overlap_mismatches, overlap_done;
} hel_engine_stats;

/* A short, fixed name for why a store stopped (a metric label):
 * "transfer_failed" (SEL_ESTOPPED), "io_error", "out_of_memory",
 * "corrupt", or "error". */
const char *hel_store_stop_reason(int rc);

/* Build the model, the scheduler and cache, and the configured store
 * (scanning a disk directory, taking its lock).  Nothing runs yet.  On
 * error, a message through sel_errmsg() names the setting at fault. */
int hel_engine_open(const hel_engine_config *cfg, hel_engine **out);
void hel_engine_info_get(const hel_engine *e, hel_engine_info *out);
/* Start the worker thread. */
int hel_engine_start(hel_engine *e);

/* Thread-safe.  0 with *id set; -EAGAIN when the queue is full (more than
 * queue_limit requests not yet finished beyond max_active); -EINVAL
 * (message names the field) for an empty prompt, max_tokens 0, a prompt
 * plus max_tokens over the core's context, a token outside the vocabulary,
 * a negative temperature, a salt length without a salt or top_logprobs over
 * HEL_TOP_LOGPROBS_MAX; -E2BIG when the request could never fit the GPU
 * cache (its pages, or a row per message checkpoint); -ESHUTDOWN when
 * stopping.  Every sampled token is reported, the stop token HEL_TOK_END
 * included (it counts in completion_tokens). */
int hel_engine_submit(hel_engine *e, const hel_request *r, uint64_t *id);
/* Thread-safe.  The request finishes with "cancelled" (0), or -ENOENT
 * when it is unknown or already finished (its on_done was called or is
 * being called). */
int hel_engine_cancel(hel_engine *e, uint64_t id);
/* Thread-safe snapshot. */
void hel_engine_stats_get(hel_engine *e, hel_engine_stats *out);

/* Stop: refuse new requests, cancel running ones, stop the worker, close
 * the store within deadline_ns (monotonic; 0 = no limit), with the drain on
 * shutdown if configured.  0, or SEL_ESTOPPED when a drain failed (memory
 * is then kept alive, design 2.8). */
int hel_engine_stop(hel_engine *e, uint64_t deadline_ns);
void hel_engine_destroy(hel_engine *e);

#endif
