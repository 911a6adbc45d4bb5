/*
 * engine.c - the reference engine's model worker: one thread that owns the
 * synthetic model, the scheduler with its GPU checkpoint cache, and the
 * optional host store, and serves the requests the front end queues
 * (design 2.8 "Worker integration"; 2.2 store interface and outcomes; 2.7
 * the scheduler's call sequence; 2.9 and 1 store selection; 2.10 policy;
 * 2.12 invariants).  engine.h is the contract with the front end,
 * scheduler.h the call sequence this file follows.
 *
 * DESIGN
 *   Threads.  Front-end threads only touch the submission side: a mutex
 *   guards the incoming queue, the list of live requests (for cancel), the
 *   counters kept there and the published stats snapshot; an eventfd wakes
 *   the worker.  Everything else -- model, scheduler, cache, store, policy,
 *   the pending queue and the active list -- belongs to the worker thread.
 *   Callbacks run on the worker without the mutex held.
 *
 *   One loop iteration (scheduler.h's sequence):
 *     1. take new submissions and cancellations;
 *     2. service the store: poll every event (FETCHED: tell the model the
 *        ticket's pages and row were written behind its back, then
 *        finish_inbound; FETCH_FAILED likewise without the loads; STORED /
 *        STORE_FAILED: unpin, remembering a Deferred checkpoint for a
 *        retry; PROGRESS: nothing but the count), deliver eviction
 *        notices, put again each remembered checkpoint (Retries below)
 *        and forget those that left the GPU cache, then take publications
 *        and put each within the pin bound (Backpressure below), pinning a
 *        Queued one at once;
 *     3. admission, oldest first: plan, touch the store on a GPU hit, look
 *        the store up above it, let the policy decide (tokens gained = hit
 *        minus GPU hit, the hit's bytes and tier, the prefill rate the
 *        worker measures) unless --prefix-cache-fetch says always or
 *        never, admit_planned, fetch for a new ticket; -EAGAIN
 *        keeps the request at the head, and it is planned again only when
 *        capacity may have come back (a retirement, preemption or store
 *        event), so a long waiting prompt is not re-hashed every step;
 *     4. at most one model step, one launch of the model: plan it,
 *        execute its entries with the model (RESTORE: row copy, and at the
 *        end of the prompt the logits from the row, hel_model_logits;
 *        PREFILL: hel_model_prefill; captures: row copy; DECODE: a round
 *        of hel_model_decode; sampling with the request's sampler at the
 *        token's position), deliver tokens, complete it and finish
 *        requests;
 *     5. publish the stats snapshot; sleep in poll(2) on the eventfd and
 *        the store's wait fd when nothing happened (at most a minute with
 *        expiry on, so the store's poll can sweep an idle cache).
 *   Steps run synchronously (max_inflight 1), so no id is ever PENDING
 *   while the worker sleeps and nothing but a submission, a cancellation
 *   or a store event can make progress possible; while requests are live
 *   the poll still has a short timeout as a safety net.
 *
 *   Requests.  The worker's record of a request (struct ereq) outlives its
 *   scheduler request: an inbound failure cancels the scheduler request
 *   and pushes the record back to the front of the pending queue with host
 *   lookup disabled for that attempt (design 2.8).  The scheduler carries a
 *   pointer to the record as its user cookie, so a step's entries find
 *   their records before complete_step retires finished requests.
 *
 *   Branching (design 4, "two continuations of one prefix").  A request
 *   submitted with `after` naming an earlier one of the same prompt joins
 *   that one's group and waits in the pending queue, passed over by
 *   admission, until the first has sampled its first token -- its prompt
 *   checkpoint is then GPU-ready -- or ended.  Admitted then, its GPU
 *   lookup finds the whole prompt and it resumes with a row copy instead
 *   of computing it again (counted in branched_requests and
 *   branched_reused_tokens).  The group lives under the mutex: submit
 *   links it, the worker primes it.
 *
 *   Speculative decoding (issue 19).  In copy and learned modes a DECODE
 *   entry is a round: the model consumes the pending token, drafts up to
 *   --draft-tokens proposals and verifies them in the same launch,
 *   emitting the accepted ones and one token of its own (max_tokens left
 *   and END bound it).  Rejected proposals never touch the row or the
 *   pages, so a round leaves nothing to undo, and everything a step
 *   publishes (captures, terminals) comes after its fence: an in-flight
 *   round is never offered to the store (design 1).  Rounds are counted
 *   and timed (the speculative round time of design 4).
 *
 *   Tokens out.  A step's tokens go to on_tokens before the step
 *   completes -- a round's several in one call -- each with its log
 *   probabilities when the request asked (hel_logprobs over the logits it
 *   was decided from: the target distribution at its position).
 *   on_tokens may end the request after k of them (the front end matched
 *   a stop sequence): the worker withdraws it before complete_step when
 *   the cut is inside the round, so the tokens after it reach neither the
 *   request's history nor a checkpoint, and finishes it "stop".
 *
 *   Latencies.  Submit, first admission, first token and every later token
 *   are stamped on the worker (submit on the caller's thread) and go into
 *   the histograms of hel_engine_stats; a restore is timed from its
 *   fetch to its FETCHED event.
 *
 *   A model call that fails fails its request (cancelled in the scheduler
 *   before the step completes, so no terminal is taken from it).  If the
 *   entry was to fill a checkpoint capture, the capture row's consumed
 *   count is overwritten with an impossible value: any later restore of
 *   that checkpoint, from the GPU cache or through the store, fails
 *   loudly instead of resuming from stale bytes.
 *
 *   Retries (design 2.2, selene.h).  A refused put (Retry) and a deferred
 *   copy (Deferred event) leave only the checkpoint id, unpinned, with the
 *   progress count at the refusal.  Progress is a STORED, FETCHED or
 *   PROGRESS event -- capacity the store got back.  Failure events are
 *   not: a Deferred event says its copy found no room, and counting it
 *   (as the worker once counted every event) let two records that keep
 *   being deferred, say on a full disk, re-offer each other for ever, each
 *   round pinning a GPU checkpoint for another copy-out.  A retry is
 *   offered again only once progress passed its count; it is forgotten,
 *   counted in retry_abandoned by its last reason, when its checkpoint
 *   leaves the GPU cache (or loses its row).  Nothing waits for one: a
 *   retry whose capacity never returns just stays unpinned until GPU
 *   eviction takes its checkpoint.
 *
 *   Backpressure (design 2.10: "when a pool is exhausted by pinned
 *   records, copy-out is skipped and counted, never waited for"; 2.12 a
 *   checkpoint is pinned for its whole copy-out).  Queued copy-outs may pin
 *   at most max(1, rows / 4) checkpoints, whose own pages may take at most
 *   a quarter of the GPU pages; one copy-out may always run, so a
 *   checkpoint larger than the page share still goes, alone.  A put beyond
 *   the bound is not attempted: the checkpoint waits as an unpinned retry
 *   (reason inflight, counted in copyout_pin_waits) and is offered, oldest
 *   first, when a pin goes; later publications queue behind it.  Why rows
 *   and a quarter: every pinned checkpoint holds one snapshot row -- the
 *   scarce id with 100 MiB rows -- and admission needs a live row per
 *   request while each capture takes a row when it is planned (skipped,
 *   captures_failed, when none can be had); a copy-out slower than decode (a disk
 *   write behind a full warm tier) otherwise ends with every row pinned
 *   and admission stalled behind copies (docs/performance.md, serving:
 *   10 copies in flight, 0 of 12 rows free).  A quarter keeps three
 *   quarters of each pool for serving, while a store keeping up (copies
 *   shorter than a decode step apart) never meets the bound.
 *
 *   Stopping.  On a stop the worker cancels every request (which may offer
 *   messages at retirement), then services the store once more before it
 *   exits: events, notices, the publications not yet taken -- a terminal
 *   the last request resumed at would otherwise never reach the store, and
 *   the drain on shutdown could not write it -- and one offer of every
 *   retry still in the GPU cache, the pin bound lifted (nothing is
 *   admitted any more).  With the drain on, refused retries are offered
 *   after each progress while the drain's time limit and the stop deadline
 *   allow and the store is not quiet for a second; then hel_engine_stop
 *   closes the store as before.
 *
 *   Overlapped restores (issue 18; engine_overlap.c has the design).  At
 *   admission a host hit may be split (host_decision): the ticket is the
 *   whole hit's, the store fetches the tail (start_fetch), the worker
 *   computes the head one chunk per loop iteration after the model step,
 *   and the ticket finishes in the later of the two (fetch_event hands
 *   overlapped tickets to hel_ovl_loaded).
 *
 *   Store failure.  A poll that fails (SEL_ESTOPPED) stops the worker's
 *   use of the store for good: requests waiting on tickets are requeued
 *   without host lookup, while the tickets keep their ids and the pins of
 *   copies in flight stay taken, so nothing a transfer may still touch is
 *   reused (design 2.12).  Shutdown then keeps the model planes and the
 *   store alive (design 2.8).
 *
 * INVARIANTS
 *   1. Every live request is in e->all (mutex) and in exactly one of the
 *      incoming queue (mutex), the pending queue or the active list
 *      (worker); a request is active iff it has a scheduler id (sid).
 *   2. on_done is called exactly once per successful submit, after every
 *      on_tokens call of that request, on the worker thread (or on the
 *      thread calling hel_engine_stop when the worker never started).
 *   3. A checkpoint holds one worker pin per put that returned Queued and
 *      has had no STORED / STORE_FAILED event; nothing else takes worker
 *      pins.  Between take_publications and the last pin no other
 *      scheduler call is made.  e->op lists those puts: n_op <= pin_max
 *      and their pages <= pin_max_pages unless n_op is 1, except while
 *      stopping.
 *   7. A retry is either held back by the pin bound (pin) or refused by
 *      the store and offered again only after progress past its epoch; a
 *      retry takes no pin.
 *   4. Eviction notices reach the store before any put of the same
 *      iteration.
 *   5. A ticket's page ids and row are handed to the model as loaded
 *      (page_loaded, row_loaded) before finish_inbound can publish them,
 *      and only after the store reported FETCHED for that ticket (an
 *      overlapped ticket's head pages are the model's own writes).
 *   6. The worker never waits on the store: every store call returns at
 *      once, and it sleeps only in poll(2).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "eos.h"
#include "list.h"
#include "helios/cache.h"
#include "helios/engine.h"
#include "helios/engine_inputs.h"
#include "helios/engine_overlap.h"
#include "helios/scheduler.h"
#include "store_disk_sharded.h"

#define DEFAULT_QUEUE 1024u
#define DEFAULT_MAX_ACTIVE 8u
#define DEFAULT_GPU_CACHE (64ull << 20)
#define POLL_BATCH 32
#define NOTICE_BATCH 64
#define IDLE_WAIT_MS 50
#define EXPIRY_WAIT_MS 60000 /* an idle worker's wake-up for expiry sweeps */
#define REMOTE_WAIT_MS 1000  /* ... and for the remote tier's gauges (issue 16) */
/* A request held for a remote lookup's answer is planned again (its
 * history hashed, the stores asked) at most this often, so a held request
 * costs the worker's loop nothing between checks. */
#define HOLD_RECHECK_NS (200ull * 1000)

_Static_assert(HEL_STEP_TOKENS_MAX == HEL_DRAFT_MAX + 1, "a step entry holds one round's tokens");

/* ---- requests ------------------------------------------------------------ */

/* Siblings of a branching request (hel_request.after) and their first
 * one: e->mu. */
struct egroup {
	uint32_t refs;
	bool primed; /* the first one computed its prompt, or ended */
};

struct ereq {
	uint64_t id;
	uint64_t held_ns; /* last time the store said its lookup is pending; 0: not held */
	hel_token *prompt;
	uint32_t n_prompt;
	uint64_t *ends; /* message ends (after each HEL_TOK_MESSAGE) */
	uint32_t n_ends;
	uint32_t max_tokens;
	bool ignore_eos;
	hel_sampler sampler;
	uint8_t *salt;
	size_t salt_len;
	bool logprobs;
	uint32_t top_logprobs;
	uint32_t (*on_tokens)(void *ctx, const hel_token *tokens, const hel_logprob *lp,
			      uint32_t n);
	void (*on_done)(void *ctx, const hel_outcome *outcome);
	void *ctx;
	uint64_t t_submit;  /* eos_now_ns at submit */
	hel_req_inputs *in; /* images (engine_inputs.h), or NULL */
	/* e->mu */
	bool cancel, cancel_seen;
	struct ereq *all_prev, *all_next;
	struct ereq *in_next;
	struct egroup *group; /* branching: shared with the siblings */
	bool leads;           /* the group's first request */
	bool primed;          /* sampled its first token */
	bool sibling;         /* waits on a group (set before the worker sees it) */
	bool branch;          /* submitted after an earlier request of the engine */
	/* worker */
	hel_req_id sid;
	bool no_host, counted;
	bool pool_failed; /* a pool restore of it failed once: readmitted with the local tiers */
	/* Admitted after its lookup was held and restoring a host hit: its
	 * pool (or remote) answer may still come, deeper (late_retries).
	 * late_resident: the GPU-resident count admission looked up from;
	 * late_depth: what the restore brings; late_retried: once. */
	bool late, late_retried;
	uint64_t late_depth, late_resident;
	uint64_t t_admit, t_last; /* first admission, latest token */
	struct ereq *prev, *next;
	hel_outcome out;
};

struct rlist {
	struct ereq *head, *tail;
	uint32_t n;
};

/* An inbound ticket the worker started (sel_store_fetch returned 0). */
struct etk {
	uint64_t ticket;
	sel_key key;
	uint32_t *pages;
	uint32_t n_pages;
	uint32_t row;
	sel_tier tier;     /* the hit's */
	uint64_t start_ns; /* the fetch's start */
};

/* A checkpoint whose put waits, unpinned: for store progress after its
 * refusal (a Retry outcome or a Deferred event: e->progress passing epoch),
 * or, held back by the copy-out pin bound (pin), for room under it. */
struct eretry {
	uint64_t id;
	sel_retry_reason why;
	uint64_t epoch; /* e->progress when refused */
	bool pin;       /* held back by the pin bound, not refused by the store */
};

/* A GPU pin a queued copy-out holds, with the checkpoint's own pages. */
struct epin {
	uint64_t id;
	uint32_t pages;
};

struct hel_engine {
	hel_engine_config cfg;
	uint8_t remote_key[32]; /* the remote tier's key while the store opens */
	const hel_core *core;
	hel_model *model;
	sel_geometry *geo;
	hel_scheduler *sched;
	sel_store *store;
	sel_policy *policy;
	hel_engine_info info;
	uint32_t P, V, max_active, queue_limit, n_pages, n_rows;
	uint64_t open_ns;
	int efd;
	pthread_t thread;
	bool started, stopped, leak;
	int stop_rc;

	/* Submission side, under mu. */
	pthread_mutex_t mu;
	bool stopping, cancel_pending;
	struct ereq *all;
	uint32_t n_all;
	struct ereq *in_head, *in_tail;
	uint32_t n_in;
	uint64_t next_id;
	uint64_t submitted, finished, cancelled, failed;
	hel_engine_stats snap;

	/* Worker. */
	struct rlist pending, active;
	struct etk *tk;
	size_t n_tk, cap_tk;
	struct eretry *rt;
	size_t n_rt, cap_rt;
	size_t n_held;   /* retries with pin set */
	bool offer_all;  /* stopping: offer every retry once, progress or not */
	bool flushing;   /* stopping: the pin bound no longer applies */
	struct epin *op; /* copy-out pins: puts Queued without their event */
	size_t n_op, cap_op;
	uint64_t op_pages;               /* their checkpoints' own pages */
	uint32_t pin_max, pin_max_pages; /* the bound (DESIGN) */
	struct ereq **cv;
	size_t cap_cv;
	hel_step_result *res; /* [max_active]: a step has one entry per request */
	struct ereq **ent;
	int *ent_rc;
	int32_t *logits;
	hel_logprob *lps; /* [max_active x HEL_STEP_TOKENS_MAX]: a step's entries' logprobs */
	uint32_t *keep;   /* [max_active]: what on_tokens kept of each entry's tokens */
	bool store_stopped;
	int store_stop_rc;
	char disk_note[512];    /* why no disk store: an unusable directory */
	uint64_t stop_deadline; /* hel_engine_stop's deadline (mu) */
	uint64_t events;        /* store events handled */
	uint64_t progress;      /* of which STORED, FETCHED and PROGRESS */
	uint64_t primes;        /* branching groups primed (mu) */
	bool blocked;           /* the head of the queue got -EAGAIN ... */
	uint64_t block_epoch;   /* ... at this capacity_epoch() */
	uint32_t block_skips;
	bool held_soon; /* admission skipped a held request until its recheck */
	double prefill_rate;
	hel_engine_stats ws; /* the worker's own counters */
	sel_event *held_ev;  /* restore outcomes held back (cfg.test_hold_inbound) */
	size_t n_held_ev, cap_held_ev;
	hel_inputs *inputs; /* image inputs of a vision core (engine_inputs.h), or NULL */
	struct hel_engine *grave_next;
	sel_export_hooks xh;    /* the pooled store's export hooks (design 2.15) */
	sel_landed_hook landed; /* restores summarised as they land (model.h) */
	hel_overlap *ovl;       /* overlapped restores' heads (engine_overlap.h) */
};

/* Engines whose store could not drain keep everything (design 2.8): the
 * model planes, the ids and the store stay allocated and reachable here. */
static pthread_mutex_t grave_mu = PTHREAD_MUTEX_INITIALIZER;
static struct hel_engine *graveyard;

EOS_DLIST_DEFINE(list, struct rlist, struct ereq)

/* 0.1 ms to 60 s, as vLLM's latency histograms span. */
const uint64_t hel_hist_bounds_ns[HEL_HIST_BUCKETS] = {
	100000ull,      250000ull,      500000ull,     1000000ull,     2500000ull,
	5000000ull,     10000000ull,    25000000ull,   50000000ull,    75000000ull,
	100000000ull,   250000000ull,   500000000ull,  750000000ull,   1000000000ull,
	2500000000ull,  5000000000ull,  7500000000ull, 10000000000ull, 20000000000ull,
	40000000000ull, 60000000000ull,
};

/* 10 us to 5 s: a speculative round takes tens of microseconds here. */
const uint64_t hel_hist_fine_bounds_ns[HEL_HIST_BUCKETS] = {
	10000ull,     25000ull,      50000ull,      75000ull,      100000ull,    250000ull,
	500000ull,    750000ull,     1000000ull,    2500000ull,    5000000ull,   7500000ull,
	10000000ull,  25000000ull,   50000000ull,   75000000ull,   100000000ull, 250000000ull,
	500000000ull, 1000000000ull, 2500000000ull, 5000000000ull,
};

void hel_hist_observe_in(hel_hist *h, const uint64_t *bounds, uint64_t ns)
{
	size_t i = 0;
	while (i < HEL_HIST_BUCKETS && ns > bounds[i])
		i++;
	h->bucket[i]++;
	h->count++;
	h->sum_ns += ns;
}

void hel_hist_observe(hel_hist *h, uint64_t ns) { hel_hist_observe_in(h, hel_hist_bounds_ns, ns); }

/* Leave r's group (e->mu held); a first request that ends primes it. */
static void group_leave_locked(hel_engine *e, struct ereq *r)
{
	struct egroup *g = r->group;
	if (!g)
		return;
	if (r->leads && !g->primed) {
		g->primed = true;
		e->primes++;
	}
	r->group = NULL;
	if (--g->refs == 0)
		free(g);
}

/* Is r a sibling whose first request has not computed the prompt yet? */
static bool group_waits(hel_engine *e, struct ereq *r)
{
	if (!r->sibling)
		return false;
	pthread_mutex_lock(&e->mu);
	bool w = r->group && !r->group->primed;
	pthread_mutex_unlock(&e->mu);
	return w;
}

/* r sampled its first token: a group it leads is primed. */
static void group_prime(hel_engine *e, struct ereq *r)
{
	pthread_mutex_lock(&e->mu);
	r->primed = true;
	if (r->group && r->leads && !r->group->primed) {
		r->group->primed = true;
		e->primes++;
	}
	pthread_mutex_unlock(&e->mu);
}

static void req_free(struct ereq *r)
{
	if (!r)
		return;
	free(r->prompt);
	free(r->ends);
	free(r->salt);
	hel_req_inputs_free(r->in);
	free(r);
}

static void wake(hel_engine *e) { (void)eventfd_write(e->efd, 1); }

/* The request is done: report it once and forget it.  A cancellation
 * requested before this point wins over the natural finish (engine.h). */
static void finish(hel_engine *e, struct ereq *r, const char *reason, int error)
{
	pthread_mutex_lock(&e->mu);
	if (r->cancel) {
		reason = "cancelled";
		error = 0;
	}
	if (r->all_prev)
		r->all_prev->all_next = r->all_next;
	else
		e->all = r->all_next;
	if (r->all_next)
		r->all_next->all_prev = r->all_prev;
	e->n_all--;
	group_leave_locked(e, r);
	if (!strcmp(reason, "cancelled"))
		e->cancelled++;
	else if (error)
		e->failed++;
	else
		e->finished++;
	pthread_mutex_unlock(&e->mu);
	if (!error && strcmp(reason, "cancelled"))
		hel_hist_observe(&e->ws.e2e, eos_now_ns() - r->t_submit);
	r->out.finish_reason = reason;
	r->out.error = error;
	if (r->on_done)
		r->on_done(r->ctx, &r->out);
	hel_inputs_release(e->inputs, r->in);
	r->in = NULL;
	req_free(r);
}

static hel_request_spec spec_of(const struct ereq *r)
{
	hel_request_spec sp = {
		.prompt = r->prompt,
		.prompt_len = r->n_prompt,
		.message_ends = r->ends,
		.n_message_ends = r->n_ends,
		.max_tokens = r->max_tokens,
		.has_stop = !r->ignore_eos,
		.stop = HEL_TOK_END,
		.salt = r->salt,
		.salt_len = r->salt_len,
		.user = (uint64_t)(uintptr_t)r,
	};
	return sp;
}

static struct ereq *req_of(hel_engine *e, hel_req_id sid)
{
	hel_request_info inf;
	if (hel_scheduler_request_info(e->sched, sid, &inf))
		return NULL;
	return (struct ereq *)(uintptr_t)inf.user;
}

/* ---- opening ------------------------------------------------------------- */

/* Split the GPU cache budget: a quarter for snapshot rows (at least three
 * per active request: its live row and two captures), the rest for pages
 * (at least two per active request). */
static int size_cache(const hel_engine_config *c, uint32_t max_active, uint64_t pb, uint64_t rb,
		      uint32_t *pages, uint32_t *rows)
{
	uint64_t min_r = 3ull * max_active, min_p = 2ull * max_active, np, nr;
	const uint64_t idmax = UINT32_MAX - 1;

	if (c->gpu_pages || c->gpu_rows) {
		if (!c->gpu_pages || !c->gpu_rows)
			return eos_fail(-EINVAL,
					"gpu_pages %u and gpu_rows %u: set both or neither",
					c->gpu_pages, c->gpu_rows);
		if (c->gpu_pages < min_p || c->gpu_rows < min_r)
			return eos_fail(
				-EINVAL,
				"gpu_pages %u and gpu_rows %u: max_active %u needs at least "
				"%" PRIu64 " pages and %" PRIu64 " rows",
				c->gpu_pages, c->gpu_rows, max_active, min_p, min_r);
		*pages = c->gpu_pages;
		*rows = c->gpu_rows;
		return 0;
	}
	uint64_t B = c->gpu_cache_bytes ? c->gpu_cache_bytes : DEFAULT_GPU_CACHE;
	nr = B / 4 / rb;
	if (nr < min_r)
		nr = min_r;
	np = B / rb >= nr ? (B - nr * rb) / pb : 0;
	if (np < min_p)
		return eos_fail(
			-EINVAL,
			"gpu_cache_bytes: %" PRIu64 " bytes hold %" PRIu64 " pages of %" PRIu64
			" bytes besides %" PRIu64 " rows of %" PRIu64 " bytes; max_active %u "
			"needs at least %" PRIu64 " pages and %" PRIu64 " rows (%" PRIu64 " bytes)",
			B, np, pb, nr, rb, max_active, min_p, min_r, min_p * pb + min_r * rb);
	*pages = (uint32_t)(np < idmax ? np : idmax);
	*rows = (uint32_t)(nr < idmax ? nr : idmax);
	return 0;
}

/* Store selection, design 1's table.  The disk and composite stores do not
 * exist yet: a configured disk tier is reported as not available, and warm
 * memory, if any, is served by the memory store alone.  This is the one
 * place that changes when they land. */
/* Design 1's table through sel_store_open: memory, disk, composite or
 * disabled.  An explicit disk limit of 0 selects no disk store. */
static int select_store(hel_engine *e, const sel_store_config *sc)
{
	const hel_engine_config *c = &e->cfg;
	bool disk = c->disk_dir && *c->disk_dir && !(c->disk_limit_set && c->disk_limit == 0);
	sel_store_config cfg = *sc;

	if (c->disk_dir && *c->disk_dir && !disk)
		e->info.disk_note = "disk limit 0 selects no disk store";
	cfg.disk_dir = disk ? c->disk_dir : NULL;
	int rc = sel_store_open(&cfg, &e->store);
	if (rc == SEL_EDIRECTORY && cfg.disk_dir) {
		/* docs/configuration.md: an unusable directory selects no disk
		 * store (design 2.11); the startup line says which and why. */
		snprintf(e->disk_note, sizeof e->disk_note, "%s", sel_errmsg());
		e->info.disk_note = e->disk_note;
		e->info.disk_warning = true;
		cfg.disk_dir = NULL;
		rc = sel_store_open(&cfg, &e->store);
	}
	if (rc) {
		char a[32];
		return eos_fail(rc, "prefix cache (memory %s%s%s): %s",
				eos_format_size(cfg.memory_bytes, a, sizeof a),
				cfg.disk_dir ? ", disk " : "", cfg.disk_dir ? cfg.disk_dir : "",
				sel_errmsg());
	}
	return 0;
}

/* Ranks in separate processes keep records on disk only (design 1, 2.14). */
static int ranks_refuse(const hel_engine_config *cfg)
{
	if (cfg->memory_bytes)
		return eos_fail(-EINVAL,
				"ranks on separate hosts keep records on disk only: a memory "
				"tier would hold every rank's bytes in one process; set "
				"--prefix-cache-memory 0");
	return 0;
}

/* The model and the scheduler over the GPU cache's ids. */
static int open_model(hel_engine *e)
{
	const hel_engine_config *cfg = &e->cfg;
	const hel_core *core = e->core;
	hel_row_layout lay;
	int rc;
	if ((rc = hel_core_row_layout(core, cfg->mode, &lay)))
		return rc;
	uint64_t pb = hel_core_page_bytes(core, cfg->mode) * core->ranks;
	uint64_t rb = lay.bytes * core->ranks;
	if ((rc = size_cache(cfg, e->max_active, pb, rb, &e->n_pages, &e->n_rows)))
		return rc;
	e->pin_max = e->n_rows / 4 > 1 ? e->n_rows / 4 : 1;
	e->pin_max_pages = e->n_pages / 4 > 1 ? e->n_pages / 4 : 1;

	if (cfg->tp && (rc = ranks_refuse(cfg)))
		return rc;
	hel_model_opts mo = {.mode = cfg->mode,
			     .pages = e->n_pages,
			     .rows = e->n_rows,
			     .draft_tokens = cfg->draft_tokens,
			     .tp = cfg->tp};
	if ((rc = hel_model_create(core, &mo, &e->model)))
		return rc;
	hel_scheduler_config sc = {
		.page_tokens = e->P,
		.n_pages = e->n_pages,
		.n_rows = e->n_rows,
		.max_active = e->max_active,
		.chunk_tokens = cfg->chunk_tokens,
		.step_tokens = cfg->step_tokens,
		.max_inflight = 1,
	};
	memcpy(sc.model_identity, core->identity, SEL_IDENTITY_BYTES);
	if ((rc = hel_scheduler_create(&sc, &e->sched)))
		return rc;
	return hel_model_geometry(e->model, &e->geo);
}

/* Design 2.15 export_fits: with checkpoint id pinned, the GPU cache still
 * covers the next step of every running decode and the request admission
 * would take next -- a parked one (the scheduler's), else the first
 * pending one not waiting on its branching group, charged from its GPU
 * prefix (hel_scheduler_export_fits).  Read-only. */
static bool store_usable(const hel_engine *e);

static bool export_fits(hel_engine *e, uint64_t id)
{
	struct ereq *q = e->pending.head;
	while (q && group_waits(e, q))
		q = q->next;
	if (!q)
		return hel_scheduler_export_fits(e->sched, id, NULL, false);
	hel_request_spec sp = spec_of(q);
	return hel_scheduler_export_fits(e->sched, id, &sp, store_usable(e) && !q->no_host);
}

/* Exports (design 2.15): the pooled store pins a checkpoint it announced
 * when the manager asks this instance to copy it for a neighbour; called
 * on the worker thread from within sel_store_poll.  Headroom: refused
 * (-ENOSPC: no_headroom) when it does not fit (export_fits), or while
 * copy-outs fill their pin bound. */
static int export_pin(void *ctx, const sel_key *key, uint64_t id, sel_published *out)
{
	hel_engine *e = ctx;
	if (hel_scheduler_describe(e->sched, id, out))
		return -ENOENT;
	if (!sel_key_eq(&out->key, key))
		return -ESTALE;
	if (e->n_op >= e->pin_max || !export_fits(e, id))
		return -ENOSPC;
	return hel_scheduler_pin(e->sched, id) ? -ENOENT : 0;
}

static void export_unpin(void *ctx, uint64_t id)
{
	hel_engine *e = ctx;
	(void)hel_scheduler_unpin(e->sched, id);
}

static int export_describe(void *ctx, uint64_t id, sel_published *out)
{
	hel_engine *e = ctx;
	return hel_scheduler_describe(e->sched, id, out) ? -ENOENT : 0;
}

/* The host store (design 1's table, or the test double), its policy and
 * what the startup summary says of it. */
static int open_store(hel_engine *e)
{
	const hel_engine_config *cfg = &e->cfg;
	int rc;
	sel_store_config stc = {
		.geometry = e->geo,
		.max_active = e->max_active,
		.memory_bytes =
			cfg->memory_bytes - hel_inputs_memory_budget(cfg), /* images: warm / 8 */
		.disk_dir = cfg->disk_dir, /* select_store applies "limit 0: no disk" */
		.disk_limit = cfg->disk_limit,
		.drain_on_shutdown = cfg->drain_on_shutdown,
		.drain_ns = cfg->drain_limit_ns,
		.drain_progress = cfg->drain_progress,
		.drain_ctx = cfg->drain_ctx,
		.max_age_ns = cfg->max_age_ns,
		.clock_ns = cfg->clock_ns,
		.backend = SEL_BACKEND_HOST,
		.populate = true,
		.fdatasync = cfg->fdatasync,
		.disk_share_div = e->core->has_image ? 8 : 0,   /* the .input files' eighth */
		.host_reserved = hel_inputs_host_reserved(cfg), /* CPU inputs' allowances */
		.pool = cfg->pool,
		.pool_instance_id = cfg->pool_instance_id,
		.pool_listen = cfg->pool_listen,
		.pool_wait_ns = cfg->pool_wait_ns,
		.pool_grace_ns = cfg->pool_grace_ns,
		.pool_exports = &e->xh,
		.remote = cfg->remote,
		.remote_key = cfg->remote_key ? e->remote_key : NULL,
		.remote_encrypt = cfg->remote_encrypt,
		.remote_window_bytes = cfg->remote_window_bytes,
		.ranks = cfg->tp ? cfg->store_ranks : NULL,
	};
	e->xh = (sel_export_hooks){
		.ctx = e, .pin = export_pin, .unpin = export_unpin, .describe = export_describe};
	e->landed = (sel_landed_hook){.fn = hel_model_landed,
				      .ctx = e->model,
				      .row_piece = hel_model_row_piece,
				      .page = hel_model_page_landed,
				      .share = hel_model_share};
	stc.landed = &e->landed;
	if (cfg->remote_key)
		memcpy(e->remote_key, cfg->remote_key, sizeof e->remote_key);
	hel_model_offload_identity(e->model, stc.identity);
	memcpy(stc.model_identity, e->core->identity, SEL_IDENTITY_BYTES);
	e->info.store = "disabled";
	e->info.transport = "none";
	e->info.disk_note = "";
	if (cfg->store_open) {
		if ((rc = cfg->store_open(cfg->store_ctx, &stc, &e->store)))
			return rc;
	} else if ((rc = select_store(e, &stc))) {
		return rc;
	}
	if (!e->store && stc.ranks) /* every rank has a disk store or none */
		return sel_store_ranks_join_none(stc.ranks, e->geo, stc.identity);
	if (!e->store)
		return 0;
	if ((rc = sel_policy_create(&e->policy)))
		return rc;
	sel_store_info si;
	sel_store_describe(e->store, &si);
	e->info.store = si.kind;
	e->info.transport = si.transport ? si.transport : "host";
	e->info.slots_total = si.slots_total;
	e->info.intake_slots = si.intake_slots;
	e->info.slot_bytes = si.slot_bytes;
	e->info.memory_bytes = cfg->memory_bytes;
	if (si.disk_dir)
		snprintf(e->info.disk_dir, sizeof e->info.disk_dir, "%s", si.disk_dir);
	e->info.disk_limit = si.disk_limit;
	e->info.disk_shared = si.disk_shared;
	e->info.input_memory = hel_inputs_memory_budget(cfg);
	e->info.input_reserved = hel_inputs_host_reserved(cfg);
	e->info.scanned_records = si.scanned_records;
	e->info.disk_io = si.disk_io;
	snprintf(e->info.disk_io_note, sizeof e->info.disk_io_note, "%s",
		 si.disk_io_note ? si.disk_io_note : "");
	if (si.remote)
		snprintf(e->info.remote, sizeof e->info.remote, "%s", si.remote);
	snprintf(e->info.warning, sizeof e->info.warning, "%s", sel_store_warning(e->store));
	snprintf(e->info.pool, sizeof e->info.pool, "%s", si.pool ? si.pool : "");
	return 0;
}

/* The worker's per-step buffers and its eventfd; the first snapshot. */
static int open_worker(hel_engine *e)
{
	e->res = calloc(e->max_active, sizeof *e->res);
	e->ent = calloc(e->max_active, sizeof(struct ereq *));
	e->ent_rc = calloc(e->max_active, sizeof *e->ent_rc);
	e->lps = calloc((size_t)e->max_active * HEL_STEP_TOKENS_MAX, sizeof *e->lps);
	e->keep = calloc(e->max_active, sizeof *e->keep);
	if (!(e->logits = malloc((size_t)e->V * sizeof *e->logits)) || !e->res || !e->ent ||
	    !e->ent_rc || !e->lps || !e->keep)
		return eos_fail(-ENOMEM, "engine: out of memory");
	if (hel_ovl_create(&e->ovl))
		return -ENOMEM;
	e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (e->efd < 0)
		return eos_fail(-errno, "engine: eventfd: %s", strerror(errno));
	e->ws.spec_mode = e->cfg.mode;
	e->snap.spec_mode = e->cfg.mode;
	e->snap.store_enabled = e->store != NULL;
	e->snap.gpu_pages_total = e->snap.gpu_pages_free = e->n_pages;
	e->snap.gpu_rows_total = e->snap.gpu_rows_free = e->n_rows;
	e->snap.copyout_pin_limit = e->pin_max;
	return 0;
}

int hel_engine_open(const hel_engine_config *cfg, hel_engine **out)
{
	hel_engine *e = NULL;
	int rc;

	*out = NULL;
	if (!cfg || !cfg->core)
		return eos_fail(-EINVAL, "engine: no core");
	const hel_core *core = cfg->core;
	if (!hel_core_supports(core, cfg->mode))
		return eos_fail(-EINVAL, "speculate: core '%s' does not support the %s state mode",
				core->name, sel_state_mode_name(cfg->mode));
	if (cfg->draft_tokens > HEL_DRAFT_MAX)
		return eos_fail(-EINVAL, "draft_tokens: %u (at most %u)", cfg->draft_tokens,
				HEL_DRAFT_MAX);
	if (cfg->fetch != HEL_FETCH_AUTO && cfg->fetch != HEL_FETCH_ALWAYS &&
	    cfg->fetch != HEL_FETCH_NEVER)
		return eos_fail(-EINVAL, "engine: fetch mode %d (expected auto, always or never)",
				(int)cfg->fetch);
	if (!(e = calloc(1, sizeof *e)))
		return eos_fail(-ENOMEM, "engine: out of memory");
	e->efd = -1;
	pthread_mutex_init(&e->mu, NULL);
	e->cfg = *cfg;
	e->core = core;
	e->P = core->page_tokens;
	e->V = core->vocab;
	e->max_active = cfg->max_active ? cfg->max_active : DEFAULT_MAX_ACTIVE;
	e->queue_limit = cfg->queue_limit ? cfg->queue_limit : DEFAULT_QUEUE;
	e->open_ns = eos_now_ns();
	e->next_id = 1;
	rc = open_model(e);
	if (rc == 0)
		rc = open_store(e);
	e->cfg.remote_key = NULL; /* the caller's buffer: not kept */
	explicit_bzero(e->remote_key, sizeof e->remote_key);
	if (rc == 0)
		rc = hel_inputs_open(cfg, e->model, e->info.disk_dir, e->info.disk_shared,
				     &e->inputs);
	if (rc)
		goto fail;
	e->info.gpu_pages = e->n_pages;
	e->info.gpu_rows = e->n_rows;
	e->info.max_active = e->max_active;
	if ((rc = open_worker(e)))
		goto fail;
	*out = e;
	return 0;
fail:
	hel_engine_destroy(e); /* closes a store that was opened */
	return rc;
}

void hel_engine_info_get(const hel_engine *e, hel_engine_info *out) { *out = e->info; }

/* ---- submission side (any thread) ------------------------------------------ */

int hel_engine_submit(hel_engine *e, const hel_request *q, uint64_t *id)
{
	const hel_core *c = e->core;
	struct ereq *r = NULL;

	if (!q->prompt || q->n_prompt == 0)
		return eos_fail(-EINVAL, "prompt: empty");
	if (q->max_tokens == 0)
		return eos_fail(-EINVAL, "max_tokens: 0 (at least 1)");
	if ((uint64_t)q->n_prompt + q->max_tokens > c->max_context)
		return eos_fail(
			-EINVAL,
			"max_tokens: %u prompt tokens plus max_tokens %u exceed the context "
			"of %" PRIu64 " tokens",
			q->n_prompt, q->max_tokens, c->max_context);
	if (!(q->sampler.temperature >= 0))
		return eos_fail(-EINVAL, "temperature: %g (expected >= 0)", q->sampler.temperature);
	if (q->cache_salt_len && !q->cache_salt)
		return eos_fail(-EINVAL, "cache_salt: %zu bytes without a salt", q->cache_salt_len);
	if (q->top_logprobs > HEL_TOP_LOGPROBS_MAX)
		return eos_fail(-EINVAL, "top_logprobs: %u (at most %u)", q->top_logprobs,
				HEL_TOP_LOGPROBS_MAX);
	uint32_t n_ends = 0;
	for (uint32_t i = 0; i < q->n_prompt; i++) {
		if (q->prompt[i] >= c->vocab)
			return eos_fail(-EINVAL,
					"prompt: token %u at %u is outside the vocabulary (%u)",
					q->prompt[i], i, c->vocab);
		n_ends += q->prompt[i] == HEL_TOK_MESSAGE;
	}
	uint64_t need_p = ((uint64_t)q->n_prompt + q->max_tokens) / e->P, need_r = n_ends + 2ull;
	if (need_p > e->n_pages || need_r > e->n_rows)
		return eos_fail(
			-E2BIG,
			"prompt: %u tokens with %u messages and max_tokens %u need up to "
			"%" PRIu64 " pages and %" PRIu64 " rows; the GPU cache holds %u and %u",
			q->n_prompt, n_ends, q->max_tokens, need_p, need_r, e->n_pages, e->n_rows);

	if (!(r = calloc(1, sizeof *r)) || !(r->prompt = malloc(q->n_prompt * sizeof *r->prompt)) ||
	    !(r->ends = malloc((n_ends ? n_ends : 1) * sizeof *r->ends)) ||
	    (q->cache_salt_len && !(r->salt = malloc(q->cache_salt_len)))) {
		req_free(r);
		return eos_fail(-ENOMEM, "submit: out of memory");
	}
	int irc = hel_inputs_copy(c, q, &r->in); /* images: validated and copied */
	if (irc) {
		req_free(r);
		return irc;
	}
	memcpy(r->prompt, q->prompt, q->n_prompt * sizeof *r->prompt);
	r->n_prompt = q->n_prompt;
	for (uint32_t i = 0; i < q->n_prompt; i++)
		if (q->prompt[i] == HEL_TOK_MESSAGE)
			r->ends[r->n_ends++] = i + 1;
	r->max_tokens = q->max_tokens;
	r->ignore_eos = q->ignore_eos;
	r->sampler = q->sampler;
	if (q->cache_salt_len)
		memcpy(r->salt, q->cache_salt, q->cache_salt_len);
	r->salt_len = q->cache_salt_len;
	r->logprobs = q->logprobs;
	r->top_logprobs = q->logprobs ? q->top_logprobs : 0;
	r->on_tokens = q->on_tokens;
	r->on_done = q->on_done;
	r->ctx = q->ctx;
	r->out.prompt_tokens = q->n_prompt;
	r->t_submit = eos_now_ns();
	struct egroup *g = q->after ? calloc(1, sizeof *g) : NULL; /* used if the first has none */

	pthread_mutex_lock(&e->mu);
	if (e->stopping) {
		pthread_mutex_unlock(&e->mu);
		req_free(r);
		free(g);
		return eos_fail(-ESHUTDOWN, "submit: the engine is stopping");
	}
	if (e->n_all >= e->queue_limit + e->max_active) {
		uint32_t n = e->n_all;
		pthread_mutex_unlock(&e->mu);
		req_free(r);
		free(g);
		return eos_fail(-EAGAIN, "submit: queue full (%u requests)", n);
	}
	/* Branching: wait for the first request of the prompt while it has not
	 * computed it (without memory for a group, just do not wait). */
	r->branch = q->after && q->after < e->next_id;
	for (struct ereq *f = q->after ? e->all : NULL; f; f = f->all_next) {
		if (f->id != q->after)
			continue;
		if (f->primed)
			break; /* its prompt checkpoint is there already */
		if (!f->group && g) {
			f->group = g;
			f->leads = true;
			g->refs = 1;
			g = NULL;
		}
		if (f->group && !f->group->primed) {
			r->group = f->group;
			r->group->refs++;
			r->sibling = true;
		}
		break;
	}
	free(g);
	r->id = e->next_id++;
	r->all_next = e->all;
	if (e->all)
		e->all->all_prev = r;
	e->all = r;
	e->n_all++;
	if (e->in_tail)
		e->in_tail->in_next = r;
	else
		e->in_head = r;
	e->in_tail = r;
	e->n_in++;
	e->submitted++;
	*id = r->id;
	pthread_mutex_unlock(&e->mu);
	wake(e);
	return 0;
}

int hel_engine_cancel(hel_engine *e, uint64_t id)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&e->mu);
	for (struct ereq *r = e->all; r; r = r->all_next)
		if (r->id == id) {
			r->cancel = true;
			e->cancel_pending = true;
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&e->mu);
	if (rc)
		return eos_fail(rc, "cancel: no request %" PRIu64, id);
	wake(e);
	return 0;
}

void hel_engine_stats_get(hel_engine *e, hel_engine_stats *out)
{
	pthread_mutex_lock(&e->mu);
	*out = e->snap;
	out->requests_submitted = e->submitted;
	out->requests_finished = e->finished;
	out->requests_cancelled = e->cancelled;
	out->requests_failed = e->failed;
	out->pending += e->n_in;
	pthread_mutex_unlock(&e->mu);
	out->uptime_ns = eos_now_ns() - e->open_ns;
}

/* ---- the worker: requests in and out ---------------------------------------- */

/* Move submissions to the pending queue and collect cancellations (into
 * e->cv, returned count).  *stop: the engine is stopping. */
static size_t take_incoming(hel_engine *e, bool *stop)
{
	size_t n = 0;
	pthread_mutex_lock(&e->mu);
	for (struct ereq *r = e->in_head, *nx; r; r = nx) {
		nx = r->in_next;
		r->in_next = NULL;
		list_push(&e->pending, r);
	}
	e->in_head = e->in_tail = NULL;
	e->n_in = 0;
	if (e->cancel_pending) {
		e->cancel_pending = false;
		for (struct ereq *r = e->all; r; r = r->all_next) {
			if (!r->cancel || r->cancel_seen)
				continue;
			if (eos_grow((void **)&e->cv, &e->cap_cv, n + 1, sizeof(struct ereq *))) {
				e->cancel_pending = true; /* try again next round */
				break;
			}
			r->cancel_seen = true;
			e->cv[n++] = r;
		}
	}
	*stop = e->stopping;
	pthread_mutex_unlock(&e->mu);
	return n;
}

/* Withdraw an admitted request from the scheduler (it keeps its record). */
static void withdraw(hel_engine *e, struct ereq *r)
{
	if (r->sid) {
		(void)hel_scheduler_cancel(e->sched, r->sid);
		r->sid = 0;
		list_del(&e->active, r);
	} else {
		list_del(&e->pending, r);
	}
}

static void cancel_now(hel_engine *e, struct ereq *r)
{
	withdraw(e, r);
	finish(e, r, "cancelled", 0);
}

/* Requests whose ticket failed (INBOUND with ticket 0) go back to the
 * front of the pending queue, in their admission order, with host lookup
 * disabled for their next attempt (design 2.8).  Found by scanning the
 * active list, so a failed-waiter list lost to ENOMEM loses nobody.  After
 * its first failed pool restore a request asks the store once more: the
 * pooled store answers from its local tiers only. */
static int requeue_failed_waiters(hel_engine *e, bool all_inbound)
{
	int n = 0;
	for (struct ereq *r = e->active.tail, *pv; r; r = pv) {
		pv = r->prev;
		hel_request_info inf;
		if (hel_scheduler_request_info(e->sched, r->sid, &inf) ||
		    inf.phase != HEL_PHASE_INBOUND || (inf.ticket && !all_inbound))
			continue;
		withdraw(e, r);
		/* A failed pool restore, the first: the next lookup is answered
		 * by the local tiers alone (the pooled store keeps the failed
		 * ticket: no new pool lookup), so a shorter local prefix is
		 * restored from one source instead of recomputed (design 2.15
		 * "One source"; docs/architecture.md). */
		bool local = r->out.host_tier == SEL_TIER_POOL && !r->pool_failed;
		r->pool_failed |= local;
		r->no_host = !local;
		r->out.cached_tokens = r->out.reused_gpu_tokens = r->out.reused_host_tokens = 0;
		r->out.host_tier = SEL_TIER_NONE;
		r->out.host_neighbour = false;
		r->out.host_neighbour_tier = SEL_TIER_NONE;
		r->out.overlap_tokens = 0;
		list_push_front(&e->pending, r);
		e->ws.host_fetch_failed++;
		n++;
	}
	return n;
}

/* ---- the worker: the store ------------------------------------------------------ */

static bool store_usable(const hel_engine *e) { return e->store && !e->store_stopped; }

static struct etk *tk_find(hel_engine *e, uint64_t ticket)
{
	for (size_t i = 0; i < e->n_tk; i++)
		if (e->tk[i].ticket == ticket)
			return &e->tk[i];
	return NULL;
}

static void tk_del(hel_engine *e, struct etk *t)
{
	free(t->pages);
	*t = e->tk[--e->n_tk];
}

static int tk_add(hel_engine *e, const sel_inbound *in, const sel_key *key, sel_tier tier)
{
	if (eos_grow((void **)&e->tk, &e->cap_tk, e->n_tk + 1, sizeof *e->tk))
		return eos_fail(-ENOMEM, "engine: out of memory for a ticket");
	struct etk *t = &e->tk[e->n_tk];
	memset(t, 0, sizeof *t);
	if (!(t->pages = malloc((in->n_pages ? in->n_pages : 1) * sizeof *t->pages)))
		return eos_fail(-ENOMEM, "engine: out of memory for a ticket");
	memcpy(t->pages, in->pages, in->n_pages * sizeof *t->pages);
	t->n_pages = in->n_pages;
	t->row = in->state_slot;
	t->ticket = in->ticket;
	t->key = *key;
	t->tier = tier;
	t->start_ns = eos_now_ns();
	e->n_tk++;
	return 0;
}

static sel_retry_reason valid_why(sel_retry_reason why, sel_retry_reason dflt)
{
	return why > SEL_RETRY_NONE && why < SEL_RETRY_REASONS ? why : dflt;
}

/* Remember id for a retry: refused by the store (pin false: offered again
 * after progress made from now on) or held back by the pin bound. */
static void retry_add(hel_engine *e, uint64_t id, sel_retry_reason why, bool pin)
{
	struct eretry x = {id, why, e->progress, pin};
	for (size_t i = 0; i < e->n_rt; i++)
		if (e->rt[i].id == id) {
			e->n_held += (size_t)pin - (size_t)e->rt[i].pin;
			e->rt[i] = x;
			return;
		}
	if (eos_grow((void **)&e->rt, &e->cap_rt, e->n_rt + 1, sizeof *e->rt)) {
		e->ws.retry_abandoned[why]++; /* cannot remember it: given up */
		return;
	}
	e->rt[e->n_rt++] = x;
	e->n_held += pin;
}

/* ---- the copy-out pin bound (DESIGN "Backpressure") ---- */

/* The pages checkpoint id owns in the GPU cache (0 when gone). */
static uint32_t ckpt_pages(hel_engine *e, uint64_t id)
{
	const hel_ckpt *k = hel_cache_get(hel_scheduler_cache(e->sched), id);
	return k ? k->n_tail : 0;
}

/* May one more copy-out pin a checkpoint of `pages` own pages?  Always
 * when none is pinned (so a checkpoint larger than the share still goes,
 * alone) and while stopping; else within max(1, rows / 4) checkpoints and
 * pages / 4 pages. */
static bool pin_room(const hel_engine *e, uint32_t pages)
{
	if (e->flushing || e->n_op == 0)
		return true;
	return e->n_op < e->pin_max && e->op_pages + pages <= e->pin_max_pages;
}

static void op_add(hel_engine *e, uint64_t id, uint32_t pages)
{
	if (eos_grow((void **)&e->op, &e->cap_op, e->n_op + 1, sizeof *e->op))
		return; /* not counted: the bound is looser by one, nothing leaks */
	e->op[e->n_op++] = (struct epin){id, pages};
	e->op_pages += pages;
}

static void op_del(hel_engine *e, uint64_t id)
{
	for (size_t i = 0; i < e->n_op; i++)
		if (e->op[i].id == id) {
			e->op_pages -= e->op[i].pages;
			e->op[i] = e->op[--e->n_op];
			return;
		}
}

/* Put a described checkpoint, pinning it at once when Queued.  Returns the
 * outcome (why: a Retry's reason). */
static sel_outcome put_pin(hel_engine *e, const sel_published *p, uint32_t pages,
			   sel_retry_reason *why)
{
	*why = SEL_RETRY_NONE;
	sel_outcome o = sel_store_put(e->store, p, why);
	if (o == SEL_QUEUED && hel_scheduler_pin(e->sched, p->checkpoint) == 0)
		op_add(e, p->checkpoint, pages);
	return o;
}

/* The store stopped for good (design 2.12): stop using it, keep every id
 * and pin it may still touch, and recompute what waited on it. */
const char *hel_store_stop_reason(int rc)
{
	switch (rc) {
	case SEL_ESTOPPED: return "transfer_failed";
	case -EIO: return "io_error";
	case -ENOMEM: return "out_of_memory";
	case SEL_ECORRUPT: return "corrupt";
	default: return "error";
	}
}

static void store_stop(hel_engine *e, int rc)
{
	/* Say it once (design 2.12: the store stops; serving goes on). */
	char why[EOS_ERRMSG_MAX];
	snprintf(why, sizeof why, "%s", sel_errmsg());
	e->store_stopped = true;
	e->store_stop_rc = rc;
	for (size_t i = 0; i < e->n_rt; i++)
		e->ws.retry_abandoned[e->rt[i].why]++;
	e->n_rt = e->n_held = 0;
	for (size_t i = 0; i < e->n_tk; i++)
		free(e->tk[i].pages);
	e->n_tk = 0;
	hel_ovl_clear(e->ovl); /* their tickets are never finished now */
	requeue_failed_waiters(e, true);
	if (e->cfg.store_stopped)
		e->cfg.store_stopped(e->cfg.store_stopped_ctx, rc, hel_store_stop_reason(rc),
				     *why ? why : sel_strerror(rc));
}

/* An overlapped restore's ticket is over (engine_overlap.h). */
static void ovl_finish(void *ctx, const sel_key *key, int status)
{
	hel_engine *e = ctx;
	if (hel_scheduler_finish_inbound(e->sched, key, status, NULL, NULL) == 0)
		requeue_failed_waiters(e, false);
}

static hel_ovl_env ovl_env(hel_engine *e)
{
	return (hel_ovl_env){.model = e->model,
			     .sched = e->sched,
			     .store = store_usable(e) ? e->store : NULL,
			     .policy = e->policy,
			     .geo = e->geo,
			     .page_tokens = e->P,
			     .chunk_tokens = e->cfg.chunk_tokens ? e->cfg.chunk_tokens : 256,
			     .mode = e->cfg.overlap,
			     .fetch = e->cfg.fetch,
			     .split_worth = e->cfg.test_split_worth,
			     .ws = &e->ws,
			     .finish = ovl_finish,
			     .ctx = e};
}

static void fetch_event(hel_engine *e, const sel_event *ev)
{
	struct etk *t = tk_find(e, ev->ticket);
	int status = ev->type == SEL_EV_FETCHED ? 0 : (ev->error ? ev->error : -EIO);
	sel_key key = t ? t->key : ev->key;

	if (!t && status == 0)
		status = -ENOENT; /* destinations unknown: cannot load them */

	if (t && status == 0) {
		/* Written behind the model's back (model.h loading rule); the
		 * transfer threads may have summarised them as they landed. */
		for (uint32_t i = 0; i < t->n_pages && status == 0; i++)
			status = hel_model_page_loaded(e->model, t->pages[i]);
		if (status == 0)
			status = hel_model_row_loaded(e->model, t->row, key.consumed);
		if (status)
			e->ws.model_errors++;
	}
	if (t && status)
		hel_model_load_cancel(e->model, t->pages, t->n_pages, t->row);
	/* The policy's sample is the restore as the worker waited for it, from
	 * the fetch to the loaded pages and row (what a recompute is set
	 * against), not the store's copy time alone.  Failed and row-only
	 * restores are no samples (design 2.15). */
	if (status == 0 && t)
		sel_policy_observe(e->policy, ev->tier, ev->bytes, eos_now_ns() - t->start_ns,
				   t->n_pages);
	if (status == 0 && t && t->tier > SEL_TIER_NONE && t->tier < SEL_TIERS)
		hel_hist_observe(&e->ws.restore_time[t->tier], eos_now_ns() - t->start_ns);
	if (t)
		tk_del(e, t);
	hel_ovl_env env = ovl_env(e);
	if (hel_ovl_loaded(e->ovl, &env, ev->ticket, status))
		return; /* overlapped: finished once its head is computed too */
	if (hel_scheduler_finish_inbound(e->sched, &key, status, NULL, NULL) == 0)
		requeue_failed_waiters(e, false);
}

/* STORED or STORE_FAILED: the copy-out's pin goes. */
static void store_event(hel_engine *e, const sel_event *ev)
{
	(void)hel_scheduler_unpin(e->sched, ev->checkpoint);
	op_del(e, ev->checkpoint);
	if (ev->type == SEL_EV_STORED)
		e->progress++;
	/* Deferred: no host capacity; the event names why (a store that does
	 * not say is counted as out of slots).  Not progress for anyone. */
	if (ev->type == SEL_EV_STORE_FAILED && ev->outcome == SEL_DEFERRED)
		retry_add(e, ev->checkpoint, valid_why(ev->why, SEL_RETRY_SLABS), false);
}

/* A new publication: put it, unless the pin bound holds it back (or earlier
 * publications wait under the bound: first come, first offered). */
static void put_one(hel_engine *e, const sel_published *p)
{
	uint32_t pages = ckpt_pages(e, p->checkpoint);
	if (e->n_held || !pin_room(e, pages)) {
		retry_add(e, p->checkpoint, SEL_RETRY_INFLIGHT, true);
		e->ws.copyout_pin_waits++;
		return;
	}
	sel_retry_reason why;
	if (put_pin(e, p, pages, &why) == SEL_RETRY)
		retry_add(e, p->checkpoint, valid_why(why, SEL_RETRY_NONE), false);
}

/* Remembered puts, oldest first: forget those whose checkpoint left the
 * GPU cache (counting the abandonment by its last reason); offer again
 * those refused before the latest store progress, and those held back by
 * the pin bound, while the bound has room -- once it has none, every later
 * one waits too (held back, reason inflight). */
static void retry_puts(hel_engine *e)
{
	hel_cache *c = hel_scheduler_cache(e->sched);
	size_t keep = 0;
	bool full = false;
	for (size_t i = 0; i < e->n_rt; i++) {
		struct eretry x = e->rt[i];
		const hel_ckpt *k = hel_cache_get(c, x.id);
		if (!k || !hel_ckpt_has_row(k)) {
			e->ws.retry_abandoned[x.why]++;
			continue;
		}
		if (!x.pin && !e->offer_all && e->progress <= x.epoch) {
			e->rt[keep++] = x; /* no progress since its refusal */
			continue;
		}
		uint32_t pages = k->n_tail;
		if (full || !pin_room(e, pages)) {
			if (!x.pin) {
				x.pin = true;
				x.why = SEL_RETRY_INFLIGHT;
				e->ws.copyout_pin_waits++;
			}
			full = true;
			e->rt[keep++] = x;
			continue;
		}
		sel_published p;
		if (hel_scheduler_describe(e->sched, x.id, &p)) {
			e->ws.retry_abandoned[x.why]++;
			continue;
		}
		sel_retry_reason why;
		if (put_pin(e, &p, pages, &why) == SEL_RETRY) {
			x.why = valid_why(why, SEL_RETRY_NONE);
			x.epoch = e->progress;
			x.pin = false;
			e->rt[keep++] = x;
		}
	}
	e->n_rt = keep;
	e->n_held = 0;
	for (size_t i = 0; i < keep; i++)
		e->n_held += e->rt[i].pin;
	e->offer_all = false;
}

/* The test hook cfg.test_hold_inbound: keep a restore's outcome while the
 * path exists (or when the array cannot grow: then it is handled now). */
static bool hold_inbound(hel_engine *e, const sel_event *ev)
{
	if (!e->cfg.test_hold_inbound || access(e->cfg.test_hold_inbound, F_OK) != 0)
		return false;
	if (e->n_held_ev == e->cap_held_ev) {
		size_t cap = e->cap_held_ev ? 2 * e->cap_held_ev : 8;
		sel_event *p = realloc(e->held_ev, cap * sizeof *p);
		if (!p)
			return false;
		e->held_ev = p;
		e->cap_held_ev = cap;
	}
	e->held_ev[e->n_held_ev++] = *ev;
	return true;
}

/* The held outcomes, in their order, once the path is gone (or always,
 * when the worker stops). */
static int release_inbound(hel_engine *e, bool always)
{
	size_t n = e->n_held_ev;
	if (!n || (!always && access(e->cfg.test_hold_inbound, F_OK) == 0))
		return 0;
	e->n_held_ev = 0;
	for (size_t i = 0; i < n; i++)
		fetch_event(e, &e->held_ev[i]);
	return (int)n;
}

/* Wake the store's copy and disk threads once for what this pass's puts
 * and fetches queued (sel_store_flush; issue 18): after the puts of
 * service_store and after admission's fetches, so copies start before the
 * model step and never wait for the next iteration. */
static void store_flush(hel_engine *e)
{
	if (store_usable(e))
		sel_store_flush(e->store);
}

/* Design 2.8 service_store.  Returns the number of events handled. */
static int service_store(hel_engine *e)
{
	int events = 0;
	if (store_usable(e)) {
		sel_event ev[POLL_BATCH];
		for (;;) {
			int n = sel_store_poll(e->store, ev, POLL_BATCH);
			if (n < 0) {
				store_stop(e, n);
				break;
			}
			for (int i = 0; i < n; i++) {
				e->events++;
				switch (ev[i].type) {
				case SEL_EV_FETCHED:
					e->progress++;
					/* fall through */
				case SEL_EV_FETCH_FAILED:
					if (!hold_inbound(e, &ev[i]))
						fetch_event(e, &ev[i]);
					break;
				case SEL_EV_STORED:
				case SEL_EV_STORE_FAILED: store_event(e, &ev[i]); break;
				case SEL_EV_PROGRESS: e->progress++; break;
				default:
					break; /* a kind this worker does not know: holds nothing */
				}
			}
			events += n;
			if (n < POLL_BATCH)
				break;
		}
	}
	events += release_inbound(e, false);
	/* Eviction notices before any put (design 2.15 "Evictions"). */
	hel_notice nt[NOTICE_BATCH];
	for (;;) {
		bool lost = false;
		size_t k = hel_scheduler_take_evictions(e->sched, nt, NOTICE_BATCH, &lost);
		if (lost) {
			e->ws.evictions_lost++;
			if (store_usable(e)) /* design 2.15: announce the holdings again */
				sel_store_evictions_lost(e->store);
		}
		for (size_t i = 0; i < k && store_usable(e); i++) {
			sel_store_evicted(e->store, &nt[i].key, nt[i].generation,
					  sel_key_is_none(&nt[i].heir) ? NULL : &nt[i].heir);
			e->ws.evictions_noticed++;
		}
		if (k < NOTICE_BATCH)
			break;
	}
	if (store_usable(e) && e->n_rt)
		retry_puts(e);
	/* Publications: put each and pin a Queued one before any other
	 * scheduler call (scheduler.h). */
	const sel_published *pubs;
	size_t np;
	if (hel_scheduler_take_publications(e->sched, &pubs, &np) == 0 && store_usable(e))
		for (size_t i = 0; i < np; i++)
			put_one(e, &pubs[i]);
	store_flush(e);
	return events;
}

/* ---- the worker: admission --------------------------------------------------------- */

/* Changes whenever capacity may have come back: a request finished,
 * cancelled (withdrawals included), preempted or re-admitted, or a store
 * event (a ticket finished, a copy-out pin released). */
static uint64_t capacity_epoch(hel_engine *e)
{
	hel_scheduler_stats ss;
	hel_scheduler_stats_get(e->sched, &ss);
	pthread_mutex_lock(&e->mu);
	uint64_t primes = e->primes;
	pthread_mutex_unlock(&e->mu);
	return e->events + ss.finished + ss.cancelled + ss.preempted + ss.readmitted + primes;
}

/* Restore this host hit (gaining positions [from, hit->key.consumed) over
 * the GPU hit) or recompute them? */
static bool fetch_decision(const hel_engine *e, const sel_hit *hit, uint64_t from)
{
	switch (e->cfg.fetch) {
	case HEL_FETCH_ALWAYS: return true;
	case HEL_FETCH_NEVER: return false;
	case HEL_FETCH_AUTO: break;
	}
	return sel_policy_should_fetch_span(e->policy, hit->tier, hit->bytes, from,
					    hit->key.consumed);
}

/* An image-input call's answer at admission (engine_inputs.h): 0 go on,
 * 1 wait in the queue, or 2: it failed and the request is finished. */
static int inputs_gate(hel_engine *e, struct ereq *r, int irc)
{
	if (irc >= 0)
		return irc;
	list_del(&e->pending, r);
	finish(e, r, "error", irc);
	return 2;
}

/* A host hit found at admission: restore it (overlapped when *prep is
 * filled) or recompute it?  Overlap needs no images in the head (their
 * prefill is the inputs module's). */
static bool host_decision(hel_engine *e, const struct ereq *r, const sel_hit *hit,
			  const hel_admission_plan *plan, uint64_t a, hel_ovl_prep *prep)
{
	hel_ovl_env env = ovl_env(e);
	if (!r->in && hel_ovl_prepare(&env, hit, &plan->history, a, prep) == 1)
		return true;
	if (fetch_decision(e, hit, a))
		return true;
	e->ws.host_fetch_declined++;
	return false;
}

/* Fetch fh (hit or its tail) into in's ids under a ticket record, the
 * model told which ids the restore writes (model.h landed summaries). */
static int fetch_into(hel_engine *e, const sel_hit *fh, const sel_inbound *in, const sel_hit *hit)
{
	int rc = tk_add(e, in, &hit->key, hit->tier);
	if (rc)
		return rc;
	hel_model_load_expect(e->model, in->pages, in->n_pages, in->state_slot);
	if ((rc = sel_store_fetch(e->store, fh, in))) {
		hel_model_load_cancel(e->model, in->pages, in->n_pages, in->state_slot);
		tk_del(e, &e->tk[e->n_tk - 1]);
	}
	return rc;
}

/* A new ticket: fetch the hit into it, or only its tail while the worker
 * computes the head (prep->head_pages > 0; engine_overlap.h). */
static void start_fetch(hel_engine *e, struct ereq *r, const hel_admission *adm, const sel_hit *hit,
			hel_ovl_prep *prep, uint64_t gpu, uint64_t a)
{
	hel_ovl_env env = ovl_env(e);
	sel_inbound in = adm->inbound;
	sel_hit tail = prep->tail; /* prep is freed below */
	const sel_hit *fh = hit;
	uint64_t head = 0;
	if (prep->head_pages &&
	    hel_ovl_start(e->ovl, &env, prep, &hit->key, &adm->inbound, gpu, r->sid, a) == 0) {
		in = hel_ovl_tail(e->ovl, prep, &adm->inbound);
		fh = &tail;
		head = prep->split.at - a;
		r->out.overlap_tokens = head;
		r->out.reused_host_tokens -= head;
		r->out.cached_tokens -= head;
	}
	hel_ovl_prep_free(prep);
	int rc = fetch_into(e, fh, &in, hit);
	if (rc && in.n_sums) {
		/* The store cannot give the head's digests with its tail (a
		 * padded or replicated record, a head in another record, a
		 * tier without them): restore the hit whole. */
		hel_ovl_unstart(e->ovl, &env, adm->inbound.ticket);
		r->out.overlap_tokens = 0;
		r->out.reused_host_tokens += head;
		r->out.cached_tokens += head;
		in = adm->inbound;
		rc = fetch_into(e, hit, &in, hit);
	}
	if (rc) {
		hel_ovl_cancel(e->ovl, adm->inbound.ticket);
		if (hel_scheduler_finish_inbound(e->sched, &hit->key, rc, NULL, NULL) == 0)
			requeue_failed_waiters(e, false);
	}
}

/* Design 2.15 "Lookups", the late-answer retry.  An admitted text request
 * whose lookup was held and whose grace period ended keeps its (pooled or
 * remote) ticket while its restore runs: nothing is submitted for it
 * until the restore drains.  late_mark notes such a request as it is
 * admitted (not one with images, whose preparation may own its slot, nor
 * one whose overlapped head is being computed, nor one readmitted
 * already); late_retries, once its restore drained and before its first
 * step, asks the store again what admission asked (history, resident
 * count, limit: the ticket admission was held on, so no new lookup and no
 * new grace period): an answer deeper than the restored prefix withdraws
 * the request and puts it back at the front of the queue, where ordinary
 * admission plans it again (history, cost, capacity) above the restored
 * prefix, now GPU-resident, and restores the deeper source.  A restore that failed
 * requeues without the store (requeue_failed_waiters, no lookup); a
 * cancelled request is gone with its mark. */
static void late_mark(struct ereq *r, const hel_admission *adm, uint64_t resident, uint64_t depth,
		      bool overlapped)
{
	r->late = r->held_ns && !r->in && !r->late_retried && adm->phase == HEL_PHASE_INBOUND &&
		  !overlapped;
	r->late_resident = resident;
	r->late_depth = depth;
}

/* Whether r's store, asked what admission asked, now knows a prefix
 * deeper than the restored one. */
static bool late_deeper(hel_engine *e, const struct ereq *r, const hel_request_info *inf)
{
	sel_hit hit;
	return store_usable(e) &&
	       sel_store_lookup(e->store, inf->history, r->late_resident, r->n_prompt, &hit) == 1 &&
	       hit.key.consumed > r->late_depth;
}

static int late_retries(hel_engine *e)
{
	int n = 0;
	for (struct ereq *r = e->active.head, *nx; r; r = nx) {
		nx = r->next;
		hel_request_info inf;
		if (!r->late || hel_scheduler_request_info(e->sched, r->sid, &inf)) {
			r->late = false;
			continue;
		}
		if (inf.phase == HEL_PHASE_INBOUND)
			continue; /* restoring: the answer may still come */
		r->late = false;
		if (inf.phase != HEL_PHASE_RESTORE || inf.in_flight || !late_deeper(e, r, &inf))
			continue; /* started, or nothing deeper: goes on as admitted */
		withdraw(e, r);
		r->late_retried = true;
		r->out.cached_tokens = r->out.reused_gpu_tokens = r->out.reused_host_tokens = 0;
		r->out.host_tier = SEL_TIER_NONE;
		r->out.host_neighbour = false;
		list_push_front(&e->pending, r);
		e->ws.late_retries++;
		n++;
	}
	return n;
}

static int admission(hel_engine *e)
{
	int work = 0, stale = 0;
	/* A head that found no capacity is planned again (its history hashed,
	 * the store asked) only once something changed, or every 64 rounds. */
	if (e->pending.head && e->blocked && capacity_epoch(e) == e->block_epoch &&
	    ++e->block_skips % 64)
		return 0;
	e->blocked = false;
	e->held_soon = false;
	for (struct ereq *r = e->pending.head, *nx; r; r = nx) {
		nx = r->next;
		if (group_waits(e, r))
			continue; /* branching: its first request is computing the prompt */
		if (r->held_ns && eos_now_ns() - r->held_ns < HOLD_RECHECK_NS) {
			e->held_soon =
				true; /* held for a pool or remote answer: asked again shortly */
			continue;
		}
		int g = inputs_gate(e, r, hel_inputs_describe(e->inputs, r->in, r->prompt));
		if (g) {
			work += g == 2;
			continue; /* its images are being described, or it failed */
		}
		hel_request_spec sp = spec_of(r);
		hel_admission_plan plan;
		int rc = hel_scheduler_plan_admission(e->sched, &sp, &plan);
		if (rc) {
			list_del(&e->pending, r);
			finish(e, r, "error", rc);
			work++;
			continue;
		}
		e->ws.gpu_lookups++;
		uint64_t a = plan.gpu != HEL_CKPT_NONE ? plan.gpu_consumed : 0;
		if (plan.gpu != HEL_CKPT_NONE && store_usable(e))
			sel_store_touch(e->store, &plan.gpu_key);
		sel_hit hit = {0}; /* read only when have (adm.fetch implies a hit) */
		bool have = false;
		hel_ovl_prep prep = {0}; /* an overlapped restore of hit (head_pages > 0) */
		if (store_usable(e) && !r->no_host && a < r->n_prompt) {
			plan.host_lookup = true;
			int lr = sel_store_lookup(e->store, &plan.history, a, plan.lookup_limit,
						  &hit);
			if (lr == SEL_LOOKUP_PENDING) {
				/* The pool's or the remote tier's answer is due within
				 * its grace period (design 2.15): hold this request,
				 * admit the ones behind it; the store's descriptor
				 * wakes us. */
				hel_admission_plan_free(&plan);
				e->ws.host_lookups_held++;
				r->held_ns = eos_now_ns();
				continue;
			}
			if (lr == 1)
				have = host_decision(e, r, &hit, &plan, a, &prep);
		}
		if ((g = inputs_gate(
			     e, r,
			     hel_inputs_ready(e->inputs, r->in, have ? hit.key.consumed : a)))) {
			hel_admission_plan_free(&plan);
			hel_ovl_prep_free(&prep);
			work += g == 2;
			continue; /* images past the reused checkpoint are being prepared */
		}
		hel_admission adm;
		rc = hel_scheduler_admit_planned(e->sched, &sp, &plan, have ? &hit : NULL, &adm);
		uint64_t gpu = plan.gpu;
		hel_admission_plan_free(&plan);
		if (rc || !adm.fetch)
			hel_ovl_prep_free(&prep); /* joined a ticket: restored as it is */
		if (rc == -EAGAIN) {
			e->blocked = true;
			e->block_epoch = capacity_epoch(e);
			break;
		}
		if (rc == -ESTALE && stale++ < 2) {
			nx = r; /* the plan's GPU checkpoint went: plan again */
			continue;
		}
		list_del(&e->pending, r);
		work++;
		if (rc) {
			finish(e, r, "error", rc);
			continue;
		}
		list_push(&e->active, r);
		late_mark(r, &adm, a, have ? hit.key.consumed : a, prep.head_pages > 0);
		r->held_ns = 0;
		r->sid = adm.req;
		if (r->in) /* a replay must not start before an image it never prepared */
			(void)hel_scheduler_set_floor(e->sched, r->sid, hel_inputs_floor(r->in));
		r->no_host = false;
		r->out.reused_gpu_tokens = a;
		r->out.reused_host_tokens = have ? hit.key.consumed - a : 0;
		r->out.cached_tokens = adm.reused_tokens;
		r->out.host_tier = have ? hit.tier : SEL_TIER_NONE;
		r->out.host_neighbour = have && hit.neighbour;
		r->out.host_neighbour_tier =
			have && hit.neighbour ? hit.neighbour_tier : SEL_TIER_NONE;
		if (!r->counted) { /* once, however often it is requeued */
			r->counted = true;
			e->ws.prompt_tokens += r->n_prompt;
			r->t_admit = eos_now_ns();
			hel_hist_observe(&e->ws.queue_time, r->t_admit - r->t_submit);
			if (r->branch) {
				e->ws.branched_requests++;
				e->ws.branched_reused_tokens += a;
			}
		}
		if (adm.fetch)
			start_fetch(e, r, &adm, &hit, &prep, gpu, a);
	}
	return work;
}

/* Preempted requests the scheduler holds because their replay would start
 * before an image a checkpoint had covered (never prepared): prepare those
 * images through the preparation worker, never waiting, then let the
 * scheduler re-admit them (design 2.13; docs/inputs.md "Serving"). */
static int inputs_replays(hel_engine *e)
{
	int work = 0;
	for (struct ereq *r = e->inputs ? e->active.head : NULL, *nx; r; r = nx) {
		nx = r->next;
		hel_request_info inf;
		if (!r->in || hel_scheduler_request_info(e->sched, r->sid, &inf) || !inf.held)
			continue;
		int rc = hel_inputs_ready(e->inputs, r->in, inf.held_depth);
		if (rc == 1)
			continue; /* its preparation is in flight */
		work++;
		if (rc < 0) {
			withdraw(e, r);
			finish(e, r, "error", rc);
			continue;
		}
		(void)hel_scheduler_set_floor(e->sched, r->sid, hel_inputs_floor(r->in));
	}
	return work;
}

/* ---- the worker: model steps ------------------------------------------------------------ */

/* Make a capture row that was not filled unusable: its consumed count can
 * match no key, so a GPU restore (row copy from an invalid slot) and a
 * host restore (row_loaded) of that checkpoint both fail. */
static void poison_row(hel_engine *e, uint32_t row)
{
	const hel_row_layout *lay = hel_model_layout(e->model);
	for (uint32_t r = 0; r < e->core->ranks; r++) {
		uint8_t *p = hel_model_row_ptr(e->model, r, row); /* NULL: another process's rank */
		if (p)
			memset(p + lay->consumed, 0xff, 8);
	}
	(void)hel_model_row_loaded(e->model, row, 0);
}

/* A DECODE entry: one round of hel_model_decode (one token in ordinary
 * mode, a speculative round otherwise); its tokens go to res (token, then
 * more), their log probabilities to lp[0..), each from the logits it was
 * decided from, read before the model's next call. */
static int exec_decode(hel_engine *e, const hel_step_entry *x, struct ereq *r, hel_step_result *res,
		       hel_logprob *lp)
{
	uint64_t pos = x->begin;
	uint32_t next = (pos + 1) % e->P == 0 ? x->pages[pos / e->P] : HEL_NO_PAGE;
	hel_decode_opts o = {.sampler = &r->sampler,
			     .max_tokens = x->emit_max,
			     .stop_on_end = x->has_stop,
			     .draft_tokens = e->cfg.draft_tokens};
	hel_round rd;
	uint64_t t0 = eos_now_ns();
	int rc = hel_model_decode(e->model, x->live_row, x->pages, (uint32_t)(pos / e->P), next,
				  x->tokens[0], &o, &rd);
	if (rc)
		return rc;
	if (e->cfg.mode != SEL_MODE_ORDINARY) {
		hel_hist_observe_in(&e->ws.spec_round_time, hel_hist_fine_bounds_ns,
				    eos_now_ns() - t0);
		e->ws.spec_rounds++;
		e->ws.spec_proposed += rd.n_proposed;
		e->ws.spec_accepted += rd.accepted;
		e->ws.spec_emitted += rd.n_tokens;
		e->ws.spec_copied += rd.copied;
		r->out.spec_rounds++;
		r->out.spec_proposed += rd.n_proposed;
		r->out.spec_accepted += rd.accepted;
		if (e->cfg.debug_round)
			e->cfg.debug_round(e->cfg.debug_ctx, r->id, x->end, &rd);
	}
	res->token = rd.tokens[0];
	res->n_more = rd.n_tokens - 1;
	memcpy(res->more, rd.tokens + 1, res->n_more * sizeof *res->more);
	for (uint32_t i = 0; i < rd.n_tokens; i++) {
		if (e->cfg.debug_logits)
			e->cfg.debug_logits(e->cfg.debug_ctx, r->id, x->end + i, rd.logits[i],
					    e->V);
		if (r->logprobs)
			hel_logprobs(rd.logits[i], e->V, rd.tokens[i], r->top_logprobs, &lp[i]);
	}
	return 0;
}

static int exec_entry(hel_engine *e, const hel_step_entry *x, struct ereq *r, hel_step_result *res,
		      hel_logprob *lp, uint64_t *pf_ns)
{
	hel_model *m = e->model;
	int32_t *lg = x->sample ? e->logits : NULL;
	int rc = 0;

	if (x->kind == HEL_ENTRY_DECODE && x->sample && x->capture_row == HEL_NONE)
		return exec_decode(e, x, r, res, lp);
	if (x->kind == HEL_ENTRY_RESTORE) {
		rc = hel_model_row_copy(m, x->restore_src, x->live_row);
		if (rc == 0 && x->sample)
			rc = hel_model_logits(m, x->live_row, x->pages, x->n_pages, lg);
	} else {
		if (x->reset)
			rc = hel_model_row_init(m, x->live_row);
		/* The chunk's time for the policy starts after the row's reset:
		 * a recompute from position 0 resets the row as a restore
		 * copies one in (RESTORE above), a cost of either path and not
		 * of the chunk's tokens.  Timed with them, Qwen TP1's 104 MiB
		 * reset made every first chunk 5x the others per token and the
		 * policy's load factor 3.5 on a quiet machine (make qualify
		 * fetch-choice; docs/performance.md, stop 30). */
		uint64_t t0 = eos_now_ns();
		if (rc == 0 && r->in)
			rc = hel_inputs_prefill(r->in, m, x->live_row, x->pages, e->P, x->tokens,
						x->begin, x->end, lg);
		else if (rc == 0)
			rc = hel_model_prefill(m, x->live_row, x->pages, x->n_pages, x->tokens,
					       x->end - x->begin, lg);
		if (x->kind == HEL_ENTRY_PREFILL) {
			uint64_t ns = eos_now_ns() - t0;
			*pf_ns += ns;
			/* The policy's recompute estimate, by position. */
			if (rc == 0 && e->policy)
				sel_policy_observe_prefill(e->policy, x->begin, x->end, ns);
		}
	}
	if (x->capture_row != HEL_NONE) {
		if (rc == 0)
			rc = hel_model_row_copy(m, x->live_row, x->capture_row);
		if (rc)
			poison_row(e, x->capture_row);
	}
	if (rc == 0 && x->sample) {
		if (e->cfg.debug_logits)
			e->cfg.debug_logits(e->cfg.debug_ctx, r->id, x->end, lg, e->V);
		res->token = hel_sample(lg, e->V, &r->sampler, x->end);
		if (r->logprobs)
			hel_logprobs(lg, e->V, res->token, r->top_logprobs, lp);
	}
	return rc;
}

/* The measured prefill rate (an average over steps, most weight on the
 * recent ones): a gauge in /metrics.  The fetch policy estimates prefill
 * time by position from each chunk instead (exec_entry). */
static void note_prefill_rate(hel_engine *e, uint64_t tokens, uint64_t ns)
{
	if (tokens < 16 || ns == 0)
		return;
	double rate = (double)tokens * 1e9 / (double)ns;
	e->prefill_rate = e->prefill_rate > 0 ? 0.75 * e->prefill_rate + 0.25 * rate : rate;
}

/* The tokens entry i sampled (a round's several) to its request: latency
 * stamps and on_tokens, before the step completes, so that a stop
 * sequence can cut a round short.  Returns how many the request keeps:
 * all of them (0 < n), or k < n where on_tokens ended it after k. */
static uint32_t deliver(hel_engine *e, size_t i, struct ereq *r)
{
	const hel_step_result *res = &e->res[i];
	hel_token t[HEL_STEP_TOKENS_MAX];
	uint32_t n = 1 + res->n_more;
	t[0] = res->token;
	memcpy(t + 1, res->more, res->n_more * sizeof *t);
	uint64_t now = eos_now_ns();
	if (r->out.completion_tokens == 0) {
		hel_hist_observe(&e->ws.ttft, now - r->t_submit);
		hel_hist_observe(&e->ws.prefill_time, now - r->t_admit);
		group_prime(e, r); /* its siblings may go */
	} else {
		hel_hist_observe(&e->ws.tpot, now - r->t_last);
	}
	for (uint32_t k = 1; k < n; k++)
		hel_hist_observe(&e->ws.tpot, 0); /* a round's tokens arrive together */
	r->t_last = now;
	uint32_t keep =
		r->on_tokens
			? r->on_tokens(r->ctx, t,
				       r->logprobs ? e->lps + i * HEL_STEP_TOKENS_MAX : NULL, n)
			: 0;
	if (keep > n)
		keep = n;
	uint32_t kept = keep ? keep : n;
	r->out.completion_tokens += kept;
	e->ws.completion_tokens += kept;
	return keep;
}

/* How entry i's request ends after the step completed (keep: deliver's
 * answer; a request cut before the end of its round was withdrawn). */
static void settle(hel_engine *e, size_t i, struct ereq *r, uint32_t keep)
{
	const hel_step_result *res = &e->res[i];
	if (keep) {
		/* A stop sequence ended with the kept tokens: done, "stop". */
		if (r->sid && res->finished == HEL_FINISH_NONE)
			withdraw(e, r);
		else if (r->sid)
			list_del(&e->active, r);
		r->sid = 0;
		finish(e, r, "stop", 0);
		return;
	}
	if (res->finished == HEL_FINISH_NONE)
		return;
	list_del(&e->active, r);
	r->sid = 0;
	switch (res->finished) {
	case HEL_FINISH_STOP: finish(e, r, "stop", 0); break;
	case HEL_FINISH_LENGTH: finish(e, r, "length", 0); break;
	default: finish(e, r, "error", -ENOMEM); break;
	}
}

/* Plan, execute and complete one step; 1 if there was one.  The step is
 * one launch of the model (hel_model_launch_begin: its requests share the
 * weight stream, as a GPU engine's batch does). */
static int model_step(hel_engine *e)
{
	hel_step st;
	if (hel_scheduler_next_step(e->sched, &st) != 1)
		return 0;
	uint64_t pf_tokens = 0, pf_ns = 0;
	hel_model_launch_begin(e->model);
	for (size_t i = 0; i < st.n; i++) {
		const hel_step_entry *x = &st.entries[i];
		struct ereq *r = req_of(e, x->req);
		memset(&e->res[i], 0, sizeof e->res[i]);
		e->ent[i] = r;
		e->ent_rc[i] = r ? exec_entry(e, x, r, &e->res[i], e->lps + i * HEL_STEP_TOKENS_MAX,
					      &pf_ns)
				 : -ENOENT;
		if (e->ent_rc[i] && r) {
			/* Out of the step before it completes: no token, no terminal. */
			e->ws.model_errors++;
			withdraw(e, r);
		}
		if (x->kind == HEL_ENTRY_PREFILL && e->ent_rc[i] == 0)
			pf_tokens += x->end - x->begin;
	}
	hel_model_launch_end(e->model);
	for (size_t i = 0; i < st.n; i++) {
		struct ereq *r = e->ent[i];
		e->keep[i] = 0;
		if (!r || e->ent_rc[i] || !st.entries[i].sample)
			continue;
		e->keep[i] = deliver(e, i, r);
		/* Cut inside its round: out before the step completes, so the
		 * tokens after the cut reach no history and no checkpoint. */
		if (e->keep[i] && e->keep[i] < 1 + e->res[i].n_more)
			withdraw(e, r);
	}
	(void)hel_scheduler_complete_step(e->sched, st.fence, e->res, st.n);
	note_prefill_rate(e, pf_tokens, pf_ns);

	for (size_t i = 0; i < st.n; i++) {
		const hel_step_entry *x = &st.entries[i];
		struct ereq *r = e->ent[i];
		if (!r)
			continue;
		if (e->ent_rc[i]) {
			finish(e, r, "error", e->ent_rc[i]);
			continue;
		}
		if (x->kind == HEL_ENTRY_PREFILL) {
			r->out.prefill_tokens += x->end - x->begin;
			r->out.prefill_launches++;
		}
		if (x->sample)
			settle(e, i, r, e->keep[i]);
	}
	return 1;
}

/* ---- the worker: loop --------------------------------------------------------------------- */

static void publish_stats(hel_engine *e)
{
	hel_inputs_stats(e->inputs, &e->ws.inputs);
	hel_engine_stats s = e->ws;
	hel_scheduler_stats ss;
	hel_cache_counts cc;
	hel_scheduler_stats_get(e->sched, &ss);
	hel_cache_counts_get(hel_scheduler_cache(e->sched), &cc);
	s.pending = e->pending.n;
	s.active = ss.active + ss.waiting;
	s.inbound_waiting = ss.inbound_waiting;
	s.prefill_launches = ss.prefill_launches;
	s.prefill_tokens = ss.prefill_tokens;
	s.decode_tokens = ss.decode_tokens;
	s.gpu_hits = ss.gpu_hits;
	s.gpu_reused_tokens = ss.gpu_reused_tokens;
	s.host_lookups = ss.host_lookups;
	s.host_hits = ss.host_hits;
	s.host_reused_tokens = ss.host_reused_tokens;
	s.gpu_pages_free = cc.pages_free;
	s.gpu_pages_total = cc.pages_total;
	s.gpu_rows_free = cc.rows_free;
	s.gpu_rows_total = cc.rows_total;
	s.gpu_checkpoints = cc.checkpoints;
	s.gpu_evictions = ss.evictions + ss.compactions;
	s.preemptions = ss.preempted;
	s.publications = ss.published;
	s.store_retries_pending = e->n_rt;
	s.copyout_pins = e->n_op;
	s.copyout_pin_limit = e->pin_max;
	s.prefill_rate = (uint64_t)e->prefill_rate;
	hel_model_counts mc;
	hel_model_counts_get(e->model, &mc);
	s.landed_pages = mc.landed_pages;
	s.computed_pages = mc.computed_pages;
	s.landed_rows = mc.landed_rows;
	s.computed_rows = mc.computed_rows;
	s.store_enabled = e->store != NULL;
	s.store_stopped = e->store_stopped;
	s.store_stop_rc = e->store_stop_rc;
	s.store_stop_reason = e->store_stopped ? hel_store_stop_reason(e->store_stop_rc) : NULL;
	if (e->store && !e->store_stopped) {
		sel_store_stats(e->store, &s.store);
		/* The estimates that decide are the worker's own. */
		for (sel_tier t = SEL_TIER_MEMORY; t < SEL_TIERS; t++) {
			s.store.tier[t].rate_bps = (uint64_t)sel_policy_rate(e->policy, t);
			s.store.tier[t].fixed_ns = (uint64_t)sel_policy_fixed_ns(e->policy, t);
		}
	} else
		s.store = e->snap.store; /* unlocked read: only the worker writes it */
	pthread_mutex_lock(&e->mu);
	e->snap = s;
	pthread_mutex_unlock(&e->mu);
}

static void idle_wait(hel_engine *e)
{
	struct pollfd pf[3] = {{.fd = e->efd, .events = POLLIN}, {.fd = -1}, {.fd = -1}};
	int nfd = 1;
	int sfd = store_usable(e) ? sel_store_wait_fd(e->store) : -1;
	if (sfd >= 0) {
		pf[nfd].fd = sfd;
		pf[nfd++].events = POLLIN;
	}
	if (hel_inputs_wait_fd(e->inputs) >= 0) { /* image preparation results */
		pf[nfd].fd = hel_inputs_wait_fd(e->inputs);
		pf[nfd++].events = POLLIN;
	}
	/* Nothing live: only a submission or the store can bring work -- and,
	 * with expiry, the store's once-a-minute sweep, which its poll runs
	 * (design 2.5): wake for it even when idle. */
	bool live = e->pending.n || e->active.n || e->n_rt || e->n_tk;
	/* A remote tier's connection state and counters change without the
	 * worker (reconnects, stalls): refresh the snapshot /metrics reads. */
	int idle = store_usable(e) && e->cfg.max_age_ns ? EXPIRY_WAIT_MS : -1;
	if (store_usable(e) && e->cfg.remote)
		idle = REMOTE_WAIT_MS;
	/* A request skipped by its hold recheck: its answer may be in already. */
	/* Our CPU is free while we wait: a restore may take it (the landed
	 * hook's share, selene transfer.c "Sharing a restore"). */
	hel_model_worker_idle(e->model, true);
	(void)poll(pf, (nfds_t)nfd, e->held_soon ? 1 : live ? IDLE_WAIT_MS : idle);
	hel_model_worker_idle(e->model, false);
}

/* Stopping: every request still here finishes "cancelled". */
static void cancel_everything(hel_engine *e)
{
	bool stop;
	(void)take_incoming(e, &stop);
	while (e->pending.head)
		cancel_now(e, e->pending.head);
	while (e->active.head)
		cancel_now(e, e->active.head);
}

/* Stopping (design 2.8): hand the store what the loop had not, so that
 * its close -- and the drain on shutdown -- sees it: the store's last
 * events, eviction notices, the publications not yet taken (a terminal a
 * request resumed at in the last iteration, messages cancellation offers)
 * and one more offer of every retry still in the GPU cache, the pin bound
 * lifted (nothing is admitted any more).  With the drain, retries the
 * store refused again are offered after each progress while the drain's
 * time limit and the stop deadline allow, until none is left or the store
 * has been quiet for SHUTDOWN_QUIET_NS (nothing in flight will wake
 * them).  Every step is a non-blocking store call or a bounded wait on the
 * store's descriptor. */
#define SHUTDOWN_QUIET_NS (1000ull * 1000000)

static void shutdown_offers(hel_engine *e)
{
	if (!store_usable(e))
		return;
	pthread_mutex_lock(&e->mu);
	uint64_t end = e->stop_deadline;
	pthread_mutex_unlock(&e->mu);
	uint64_t now = eos_now_ns();
	if (e->cfg.drain_limit_ns && (!end || now + e->cfg.drain_limit_ns < end))
		end = now + e->cfg.drain_limit_ns;
	e->flushing = true;
	e->offer_all = true;
	(void)service_store(e);
	uint64_t quiet_from = eos_now_ns();
	while (e->cfg.drain_on_shutdown && e->n_rt && store_usable(e)) {
		now = eos_now_ns();
		if ((end && now >= end) || now - quiet_from >= SHUTDOWN_QUIET_NS)
			break;
		struct pollfd pf = {.fd = sel_store_wait_fd(e->store), .events = POLLIN};
		if (pf.fd >= 0)
			(void)poll(&pf, 1, 10);
		else
			eos_sleep_ns(1000000);
		if (service_store(e))
			quiet_from = eos_now_ns();
	}
}

static void *worker(void *arg)
{
	hel_engine *e = arg;
	for (;;) {
		eventfd_t v;
		bool stop;
		(void)eventfd_read(e->efd, &v);
		size_t nc = take_incoming(e, &stop);
		if (stop)
			break;
		int work = (int)nc;
		for (size_t i = 0; i < nc; i++)
			cancel_now(e, e->cv[i]);
		work += service_store(e);
		work += hel_inputs_service(e->inputs);
		work += inputs_replays(e);
		work += late_retries(e);
		work += admission(e);
		store_flush(e); /* admission's fetches start before the model step */
		work += model_step(e);
		hel_ovl_env oe = ovl_env(e);
		work += hel_ovl_run(e->ovl, &oe);
		e->ws.loops++;
		e->ws.quiet = !work;
		publish_stats(e);
		if (!work)
			idle_wait(e);
	}
	(void)release_inbound(e, true);
	cancel_everything(e); /* may offer the messages of cancelled requests */
	shutdown_offers(e);
	e->ws.quiet = false;
	publish_stats(e);
	return NULL;
}

int hel_engine_start(hel_engine *e)
{
	if (e->started || e->stopped)
		return eos_fail(-EINVAL, "engine: %s", e->started ? "already started" : "stopped");
	int rc = pthread_create(&e->thread, NULL, worker, e);
	if (rc)
		return eos_fail(-rc, "engine: cannot start the worker: %s", strerror(rc));
	e->started = true;
	return 0;
}

/* ---- stopping ---------------------------------------------------------------------------------- */

int hel_engine_stop(hel_engine *e, uint64_t deadline_ns)
{
	if (e->stopped)
		return e->stop_rc;
	if (e->started && pthread_equal(pthread_self(), e->thread))
		return eos_fail(-EDEADLK, "engine: stop from a callback (the worker thread)");
	pthread_mutex_lock(&e->mu);
	e->stopping = true;
	e->stop_deadline = deadline_ns;
	pthread_mutex_unlock(&e->mu);
	wake(e);
	if (e->started)
		pthread_join(e->thread, NULL);
	else
		cancel_everything(e); /* never ran: report on this thread */
	/* The preparation worker writes .input files into the store's locked
	 * directory: it stops before the store lets the lock go. */
	hel_inputs_destroy(e->inputs);
	e->inputs = NULL;
	int rc = 0;
	if (e->store) {
		rc = sel_store_close(e->store, deadline_ns);
		if (rc == SEL_ESTOPPED) {
			/* A transfer may still touch the planes and the ids the
			 * scheduler holds: keep them all (design 2.8). */
			e->leak = true;
			rc = SEL_ESTOPPED;
		}
	}
	if (!e->leak && e->sched)
		hel_scheduler_release_after_shutdown(e->sched);
	e->stopped = true;
	e->stop_rc = rc;
	return rc;
}

void hel_engine_destroy(hel_engine *e)
{
	if (!e)
		return;
	if (!e->stopped)
		(void)hel_engine_stop(e, 0);
	if (e->leak) {
		pthread_mutex_lock(&grave_mu);
		e->grave_next = graveyard;
		graveyard = e;
		pthread_mutex_unlock(&grave_mu);
		return;
	}
	hel_inputs_destroy(e->inputs); /* opened but never stopped: a failed open */
	sel_store_destroy(e->store);
	hel_scheduler_destroy(e->sched);
	hel_model_destroy(e->model);
	sel_geometry_free(e->geo);
	sel_policy_destroy(e->policy);
	hel_ovl_destroy(e->ovl);
	for (size_t i = 0; i < e->n_tk; i++)
		free(e->tk[i].pages);
	e->n_tk = 0;
	free(e->tk);
	free(e->rt);
	free(e->op);
	free(e->cv);
	free(e->res);
	free(e->ent);
	free(e->ent_rc);
	free(e->lps);
	free(e->keep);
	free(e->held_ev);
	free(e->logits);
	if (e->efd >= 0)
		close(e->efd);
	pthread_mutex_destroy(&e->mu);
	free(e);
}
