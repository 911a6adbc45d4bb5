/*
 * scheduler.h - the reference engine's request scheduler (design 2.7, 2.2
 * publication and deferral rules, 2.8 worker integration, 2.12, 2.15
 * "Evictions"; implementation step 10).
 *
 * The scheduler plans; it never touches model bytes.  It owns the GPU
 * prefix checkpoint cache (cache.h), the requests, the inbound tickets and
 * the publication and eviction-notice queues.  The model worker executes
 * the steps it plans, drives the store, and reports back.  Everything runs
 * on the worker thread; nothing here blocks or locks.
 *
 * ---- The worker's call sequence --------------------------------------------
 *
 *   loop {
 *     // 1. service the store (design 2.8 service_store)
 *     n = sel_store_poll(store, ev, cap);
 *       FETCHED / FETCH_FAILED  -> hel_scheduler_finish_inbound(s, &ev.key,
 *                                  ev.type == FETCHED ? 0 : ev.error, &failed, &nf);
 *                                  each failed id: hel_scheduler_cancel(), then
 *                                  re-admit it (front of the queue, no host lookup)
 *       STORED / STORE_FAILED   -> hel_scheduler_unpin(s, ev.checkpoint)
 *                                  (a SEL_DEFERRED outcome: retry the put after
 *                                  store progress, via hel_scheduler_describe)
 *       PROGRESS                -> store progress (with STORED and FETCHED):
 *                                  retries refused before it may go again
 *     n = hel_scheduler_take_evictions(s, notices, cap, &lost);
 *       each -> sel_store_evicted(key, generation, heir or NULL); lost -> the
 *       store's evictions-lost hook.  Always before the puts below.
 *     hel_scheduler_take_publications(s, &pubs, &np);
 *       each -> o = sel_store_put(store, &pubs[i], &why);
 *               o == SEL_QUEUED -> hel_scheduler_pin(s, pubs[i].checkpoint)
 *               at once: no other scheduler call may come between the take and
 *               the pins (any of them may evict).
 *
 *     // 2. admission, for each incoming request, oldest first
 *     hel_scheduler_plan_admission(s, &spec, &plan);
 *     if (plan.gpu) sel_store_touch(store, &plan.gpu_key);
 *     if (store && lookup allowed) {
 *       plan.host_lookup = true;
 *       hit? = sel_store_lookup(store, &plan.history, plan.gpu_consumed,
 *                               plan.lookup_limit, &hit) && policy says fetch;
 *     }
 *     rc = hel_scheduler_admit_planned(s, &spec, &plan, hit? &hit : NULL, &adm);
 *       rc == -EAGAIN: no capacity; hel_admission_plan_free(&plan), keep the
 *                      request queued and stop admitting this round;
 *       adm.fetch:     sel_store_fetch(store, &hit, &adm.inbound); if that
 *                      fails, hel_scheduler_finish_inbound(s, &hit.key, rc, ...)
 *
 *     // 3. model work
 *     while (hel_scheduler_next_step(s, &step) == 1) {   // or one per loop
 *       execute step.entries (below), then
 *       hel_scheduler_complete_step(s, step.fence, results, step.n);
 *     }
 *   }
 *   shutdown: cancel the requests, service the store once more (the
 *             publications not yet taken, retries), close the executor,
 *             sel_store_close(), then hel_scheduler_release_after_shutdown(s),
 *             hel_scheduler_destroy(s).
 *
 * ---- Executing an entry ------------------------------------------------------
 *
 * Entries of one step are independent (one per request) and run in any
 * order; all of a step's reads and writes belong to its fence.  For entry e:
 *   RESTORE  copy row e.restore_src into e.live_row; the row then holds
 *            e.restore_consumed tokens.
 *   PREFILL  if e.reset, start e.live_row empty (0 tokens consumed); then
 *   DECODE   for t in [e.begin, e.end): hel_model_step(model, e.live_row,
 *            e.pages, t / P, e.tokens[t - e.begin], page) where page =
 *            e.pages[t / P] when (t + 1) % P == 0 (the token completes that
 *            page) and none otherwise.
 *   then     if e.capture_row != HEL_NONE, copy e.live_row into
 *            e.capture_row (checkpoint e.capture, GPU-ready after the fence);
 *            if e.sample, sample a token from the row and put it in
 *            results[i].token.
 *   A DECODE entry may instead run a speculative round (hel_model_decode):
 *   consume e.tokens[0], then emit up to e.emit_max tokens (none after a
 *   stop token when e.has_stop), consuming every emitted token but the
 *   last and completing no page but the one e.pages names for the first
 *   token; the first emitted token goes to results[i].token, the rest to
 *   results[i].more.
 * A step's hel_step and everything it points to stay valid until its
 * complete_step.  Steps complete in fence order; with max_inflight > 1 the
 * worker may plan the next step before completing the previous one (its
 * requests are not in it).  No entry reads what another entry of the same
 * step writes: restores wait until their source is GPU-ready.
 *
 * ---- Ownership ------------------------------------------------------------------
 *
 *   - Page ids and row slots live in the cache's pools (cache.h).  The
 *     scheduler hands out only FREE ids, whose last use passed a completed
 *     fence; ids released while a step is in flight wait for its fence.
 *   - A request owns its live row from admission until it retires (finish,
 *     cancel) or is preempted, and the pages it computes until a
 *     checkpoint captured from it takes them.  Its page table is its prefix
 *     checkpoint's chain (shared; the request pins the prefix) followed by
 *     its own pages.
 *   - A capture creates a checkpoint at once: it takes the request's own
 *     pages and a fresh snapshot row, becomes the request's (pinned) prefix,
 *     and is GPU-ready after the step's fence.  A finished or preempted
 *     request's live row and own pages become its terminal checkpoint (no
 *     copy; released instead when that key is already cached).
 *   - A finished request is gone when complete_step returns (its tokens
 *     arrived through the results); a cancelled one when cancel returns; a
 *     preempted one stays, WAITING, and next_step re-admits it from its
 *     whole history (prompt and generated tokens), normally by a GPU hit on
 *     its own terminal.
 *   - A ticket (one per inbound key) owns its destination pages and row and
 *     one pin on its GPU ancestor until finish_inbound or shutdown, whatever
 *     happens to the requests waiting on it (design 2.7, 2.12).
 *   - Worker pins (hel_scheduler_pin) keep a checkpoint through a copy-out;
 *     the worker unpins on the store's event.
 *   - Returned arrays (publications, failed waiters, the inbound
 *     destinations) are the scheduler's: valid until the next call of the
 *     same function (inbound: until finish_inbound of that key).
 *
 * ---- Publication and deferral (design 2.2) -------------------------------------
 *
 * Captures and terminals are offered to the store once GPU-ready, through
 * take_publications, except:
 *   - a message checkpoint whose planned prompt checkpoint is its direct
 *     child less than one page later, and every terminal checkpoint, are
 *     deferred until a request resumes at exactly that checkpoint (its GPU
 *     lookup hit is exactly it);
 *   - a preempted request's terminal counts as resumed (offered at once);
 *   - a deferred message is offered while its request still pins it if the
 *     prompt capture gets no snapshot row, and at retirement if the request
 *     is cancelled before that capture;
 *   - compaction offers a deferred heir, and re-offers ("refreshes") the
 *     nearest already-published descendants below it so they name it as
 *     their parent;
 *   - checkpoints restored from the store count as offered (they name
 *     their key as parent to later publications) and are not offered back.
 * A publication names the nearest offered ancestor as parent ("none" if
 * there is none: the store keeps it as a root) and the whole chain.
 *
 * Errors: 0 (or a count) or a negative errno with sel_errmsg() set.
 * -EAGAIN always means "no capacity now; nothing changed that matters,
 * retry later".
 */
#ifndef HEL_SCHEDULER_H
#define HEL_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "helios/cache.h"
#include "selene.h"

typedef struct hel_scheduler hel_scheduler;
typedef uint64_t hel_req_id; /* 0 = none; never reused */

typedef enum hel_phase {
	HEL_PHASE_WAITING = 0, /* preempted: holds nothing, re-admitted by next_step */
	HEL_PHASE_INBOUND,     /* waits for a host restore; never scheduled */
	HEL_PHASE_RESTORE,     /* next: copy its prefix snapshot into its live row */
	HEL_PHASE_PREFILL,     /* next: a chunk of its history */
	HEL_PHASE_DECODE,      /* next: one token */
	HEL_PHASE_FINISHED,    /* reported in results; the request is gone */
	HEL_PHASE_CANCELLED,
} hel_phase;

const char *hel_phase_name(hel_phase p);

typedef struct hel_scheduler_config {
	uint32_t page_tokens;  /* tokens per page: positive multiple of 64 */
	uint32_t n_pages;      /* page ids in the page planes */
	uint32_t n_rows;       /* row slots in the row plane (live and snapshot) */
	uint32_t max_active;   /* requests holding a live row; 0 = n_rows / 2 */
	uint32_t chunk_tokens; /* prefill tokens per request per step; 0 = 256 */
	uint32_t step_tokens;  /* tokens per step, all requests; 0 = 1024 */
	uint32_t max_inflight; /* steps submitted and not completed; 0 = 2 */
	uint32_t notice_cap;   /* eviction notice queue bound; 0 = 1024 */
	uint8_t model_identity[SEL_IDENTITY_BYTES];
} hel_scheduler_config;

/* A request as the server hands it over.  Arrays are copied. */
typedef struct hel_request_spec {
	const sel_token *prompt;
	uint64_t prompt_len; /* >= 1 */
	/* Capture points after MESSAGE boundary tokens, as consumed counts: m
	 * means "after the first m tokens".  Ascending, each in [1, prompt_len]
	 * (prompt_len itself is always a capture point: the prompt checkpoint). */
	const uint64_t *message_ends;
	size_t n_message_ends;
	uint32_t max_tokens; /* >= 1 generated tokens */
	bool has_stop;       /* end of generation token */
	sel_token stop;
	const void *salt; /* cache salt; NULL = none */
	size_t salt_len;
	uint64_t user; /* caller's cookie (hel_request_info) */
} hel_request_spec;

/* The result of plan_admission: nothing is reserved by it. */
typedef struct hel_admission_plan {
	sel_history history;   /* the prompt's history; the plan owns it */
	uint64_t gpu;          /* deepest ready GPU checkpoint, HEL_CKPT_NONE */
	sel_key gpu_key;       /* its key (for sel_store_touch) */
	uint64_t gpu_consumed; /* a: pass as sel_store_lookup's `resident` */
	uint64_t lookup_limit; /* pass as sel_store_lookup's `limit` */
	bool host_lookup;      /* set by the worker when it asked the store */
} hel_admission_plan;

/* Free a plan that was not admitted.  NULL- and double-free safe. */
void hel_admission_plan_free(hel_admission_plan *p);

typedef struct hel_admission {
	hel_req_id req;
	hel_phase phase;        /* RESTORE, PREFILL or INBOUND */
	uint64_t reused_tokens; /* admission_reused_tokens: a, or c for inbound */
	bool fetch;             /* a new ticket: call sel_store_fetch(hit, &inbound) */
	sel_inbound inbound;    /* the ticket's destinations (new or joined) */
} hel_admission;

typedef enum hel_entry_kind {
	HEL_ENTRY_RESTORE = 1,
	HEL_ENTRY_PREFILL,
	HEL_ENTRY_DECODE,
} hel_entry_kind;

typedef struct hel_step_entry {
	hel_req_id req;
	hel_entry_kind kind;
	uint32_t live_row;         /* the request's working row */
	uint32_t restore_src;      /* RESTORE: source snapshot row; else HEL_NONE */
	uint64_t restore_consumed; /* RESTORE: tokens the restored row holds */
	uint64_t begin, end;       /* tokens consumed: [begin, end); RESTORE: end, end */
	const sel_token *tokens;   /* end - begin tokens */
	const uint32_t *pages;     /* page table after the entry: end / P ids */
	uint32_t n_pages;
	uint32_t first_new_page; /* pages[first_new_page..n_pages) complete in this entry */
	bool reset;              /* begin == 0 without a restore: start empty */
	bool sample;             /* sample the next token after the entry */
	uint32_t emit_max;       /* sample: tokens the request may still generate (>= 1;
				      more than 1 only for DECODE: a speculative round) */
	bool has_stop;           /* the request ends at the stop token */
	uint32_t capture_row;    /* HEL_NONE, or snapshot live_row here after the entry */
	uint64_t capture;        /* the checkpoint that capture fills */
} hel_step_entry;

typedef struct hel_step {
	uint64_t fence;
	const hel_step_entry *entries;
	size_t n;
} hel_step;

typedef enum hel_finish {
	HEL_FINISH_NONE = 0,
	HEL_FINISH_STOP,   /* sampled the stop token */
	HEL_FINISH_LENGTH, /* max_tokens generated */
	HEL_FINISH_ERROR,  /* out of memory recording the token */
} hel_finish;

#define HEL_STEP_TOKENS_MAX 17 /* tokens one entry may emit: a round of 16 proposals */

typedef struct hel_step_result {
	sel_token token; /* in: the sampled token, for entries with sample */
	/* in: a speculative round's further tokens, in order (DECODE only;
	 * 1 + n_more <= the entry's emit_max, no token after a stop token).
	 * All of them but the last were consumed by the round. */
	sel_token more[HEL_STEP_TOKENS_MAX - 1];
	uint32_t n_more;
	hel_finish finished; /* out: the request finished and is gone */
	uint64_t terminal;   /* out: its terminal checkpoint (or HEL_CKPT_NONE) */
} hel_step_result;

typedef struct hel_request_info {
	hel_phase phase;
	uint64_t user;
	uint64_t prompt_len;
	uint64_t consumed;      /* tokens the live row holds (after planned steps) */
	uint64_t reused_tokens; /* admission_reused_tokens */
	uint32_t generated;
	uint64_t prefix;       /* pinned prefix checkpoint or HEL_CKPT_NONE */
	uint32_t live_row;     /* HEL_NONE while WAITING */
	const uint32_t *pages; /* page table: n_shared prefix pages, then its own */
	uint32_t n_pages, n_shared;
	uint64_t ticket; /* INBOUND: its ticket (0 once failed) */
	bool in_flight;
	const sel_history *history; /* prompt and generated tokens */
	const sel_token *tokens;    /* the same tokens */
	uint64_t n_tokens;
	bool held;           /* WAITING below its floor (hel_scheduler_set_floor) */
	uint64_t held_depth; /* held: the GPU checkpoint depth re-admission found */
} hel_request_info;

typedef struct hel_scheduler_stats {
	uint64_t admitted, rejected_capacity, readmitted, finished, cancelled, preempted;
	uint64_t gpu_hits, gpu_reused_tokens;
	uint64_t host_lookups, host_hits, host_reused_tokens;
	uint64_t inbound_waiting; /* gauge: requests waiting on a ticket */
	uint64_t tickets;         /* gauge */
	uint64_t inbound_ok, inbound_existing, inbound_failed;
	uint64_t launches, prefill_launches, prefill_tokens, decode_tokens, restores;
	uint64_t captures, captures_skipped, captures_failed, terminals;
	uint64_t offered, published, refreshed;
	uint64_t evictions, compactions;
	uint64_t active, waiting; /* gauges */
} hel_scheduler_stats;

int hel_scheduler_create(const hel_scheduler_config *cfg, hel_scheduler **out);
/* Frees everything without any fence or pin discipline: call after
 * release_after_shutdown (or on a scheduler that never ran).  NULL-safe. */
void hel_scheduler_destroy(hel_scheduler *s);
/* The cache, for reading (counts, lookups in tests, hel_cache_check).
 * Mutate it only through the scheduler. */
hel_cache *hel_scheduler_cache(hel_scheduler *s);

/* ---- Admission (design 2.7) ------------------------------------------------ */

/* Validate spec, build its history and look up the GPU cache.  Reserves,
 * pins and touches nothing.  -EINVAL for a malformed spec, -E2BIG for one
 * that could never fit the pools (prompt plus max_tokens pages, or a live
 * row plus a row per capture point). */
int hel_scheduler_plan_admission(hel_scheduler *s, const hel_request_spec *spec,
				 hel_admission_plan *plan);

/* Reserve and create the request.  inbound (may be NULL) is the store's hit
 * for plan->history above plan->gpu_consumed: the request then waits in
 * INBOUND on the ticket for inbound->key, created (adm.fetch) or joined,
 * with consumed and reused tokens = inbound->key.consumed.
 * Reservation: the request's live row now, and room -- free, pending or
 * reclaimable by eviction, beyond other requests' reservations -- for the
 * pages of its history past its prefix depth; a new ticket also pops its
 * pages and row now.  Capture points reserve nothing: each capture takes
 * a snapshot row when next_step plans it and is skipped (captures_failed)
 * when none is free or reclaimable.
 * On success the plan's history moves into the request (the plan is then
 * empty).  Errors: -EAGAIN no capacity (nothing reserved; evictions
 * started to refill the free lists may remain), -ESTALE the plan's GPU
 * checkpoint is gone (plan again), -EINVAL spec/plan/hit mismatch,
 * -ENOMEM.  On error the caller still owns the plan. */
int hel_scheduler_admit_planned(hel_scheduler *s, const hel_request_spec *spec,
				hel_admission_plan *plan, const sel_hit *inbound,
				hel_admission *out);

/* plan_admission + admit_planned without inbound. */
int hel_scheduler_admit(hel_scheduler *s, const hel_request_spec *spec, hel_admission *out);

/* The store finished the ticket for key: status 0 (bytes landed) or a
 * negative error.  Success publishes the restored checkpoint (parent: the
 * ticket's GPU ancestor; tail: the ticket pages; row: the ticket row;
 * ready now), or finds the key already cached and returns the ticket's ids
 * to the free lists; either way each waiter gets that checkpoint as its
 * pinned prefix, its chain as page table and phase RESTORE.  Failure
 * returns the ids to the free lists and lists the waiters in *failed (valid
 * until the next finish_inbound); they stay INBOUND, holding their live
 * row, until the caller cancels them.  The ticket's pin is released.
 * -ENOENT when no ticket has the key. */
int hel_scheduler_finish_inbound(hel_scheduler *s, const sel_key *key, int status,
				 const hel_req_id **failed, size_t *n_failed);

/* Cancel a request in any phase: its live row and own pages are released
 * (after the fence of a step in flight), its prefix unpinned, and it
 * leaves its ticket, whose resources stay until finish_inbound.  A results
 * entry for it in a step in flight is ignored.  -ENOENT if unknown. */
int hel_scheduler_cancel(hel_scheduler *s, hel_req_id req);

int hel_scheduler_request_info(hel_scheduler *s, hel_req_id req, hel_request_info *out);

/* The depth below which req may not be re-admitted by next_step after a
 * preemption (0 at admission: any).  A preempted request whose deepest
 * GPU checkpoint lies below it is held in WAITING (request_info: held and
 * held_depth), passed over by re-admission and by the rule that new
 * admissions wait for preempted requests, until the caller sets the floor
 * again (for instance once the inputs its replay needs exist) or cancels
 * it.  -ENOENT if unknown. */
int hel_scheduler_set_floor(hel_scheduler *s, hel_req_id req, uint64_t floor);

/* ---- Steps ------------------------------------------------------------------------- */

/* Re-admit preempted requests that fit, then plan one step: for each
 * runnable request (never INBOUND, never one in a step in flight) a
 * RESTORE, a PREFILL chunk (ending at the next capture point, allocating
 * the pages it completes, evicting and preempting decoders as needed) or a
 * DECODE token.  Returns 1 with *out filled and the step's fence submitted,
 * 0 when nothing can run now, -EBUSY when max_inflight steps are
 * outstanding. */
int hel_scheduler_next_step(hel_scheduler *s, hel_step *out);

/* The step `fence` (the oldest outstanding) completed: results[i] answers
 * entries[i] (n must match).  Applies sampled tokens (a round's several in
 * order; the request's live row then holds every one but the last),
 * finishes requests on the stop token or max_tokens (their terminal
 * checkpoint is created and reported), completes the fence (pending ids
 * become free, the step's captures become GPU-ready).  -EINVAL for a wrong
 * fence or count, or a result with more tokens than its entry allowed
 * (nothing is applied then). */
int hel_scheduler_complete_step(hel_scheduler *s, uint64_t fence, hel_step_result *results,
				size_t n);

/* ---- Publications, pins, evictions ------------------------------------------------- */

/* GPU-ready checkpoints offered since the previous call, each once,
 * parents before children.  The array and its page arrays are valid until
 * the next call.  0 or -ENOMEM (nothing taken). */
int hel_scheduler_take_publications(hel_scheduler *s, const sel_published **out, size_t *n);

/* Describe checkpoint id again (a put retry): -ENOENT once it has left
 * the GPU cache (gone or page-only) or if it was never offered.  The
 * pages stay valid until the next describe. */
int hel_scheduler_describe(hel_scheduler *s, uint64_t id, sel_published *out);

/* Worker pins (copy-out, export): -ENOENT if the checkpoint left the
 * cache, -EINVAL to unpin without a pin. */
int hel_scheduler_pin(hel_scheduler *s, uint64_t id);
int hel_scheduler_unpin(hel_scheduler *s, uint64_t id);

/* Design 2.15 export_fits ("Headroom"), read-only: whether, were
 * checkpoint id (a ready one, or HEL_CKPT_NONE) pinned once more, the free
 * pages and rows, those awaiting their fences and what eviction could
 * still reclaim (hel_cache_reclaimable_if_pinned, with id and the next
 * admission's GPU prefix pinned) cover every admitted request's
 * reservation, the next step of every running decode (a page where its
 * token completes one) and the request admission would take next, with
 * the pages and rows admission_pages gives it from its GPU prefix: the
 * first parked (preempted, waiting) request that re-admission would not
 * hold, else `next` (the caller's first eligible pending request, or
 * NULL), whose lookup may bring a host hit and its ticket's row when
 * next_host. */
bool hel_scheduler_export_fits(hel_scheduler *s, uint64_t id, const hel_request_spec *next,
			       bool next_host);

/* Evict up to `steps` times (leaf or compaction each); every eviction of
 * the cache goes through here or through allocation, which queue the
 * notices and apply the compaction heir rule.  Returns the number done. */
uint32_t hel_scheduler_evict(hel_scheduler *s, uint32_t steps);

/* Eviction notices, oldest first (design 2.15 "Evictions"): deliver each
 * with sel_store_evicted before the next put.  *lost (may be NULL) says
 * the bounded queue dropped its oldest since the last call. */
size_t hel_scheduler_take_evictions(hel_scheduler *s, hel_notice *out, size_t cap, bool *lost);

void hel_scheduler_stats_get(hel_scheduler *s, hel_scheduler_stats *out);

/* After the executor and the store are closed: drop tickets, requests,
 * steps in flight and every checkpoint; every id returns to the free
 * lists.  The scheduler stays usable (empty). */
void hel_scheduler_release_after_shutdown(hel_scheduler *s);

/* Verify every invariant of scheduler.c (and the cache's); 0 or -EUCLEAN
 * with a message naming the first violation. */
int hel_scheduler_check(hel_scheduler *s);

#endif
