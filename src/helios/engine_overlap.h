/*
 * engine_overlap.h - overlapped restores for the model worker (issue 18,
 * "Overlapped restore"; engine_overlap.c has the design).
 *
 * The worker's calls, all on its thread:
 *   admission, for a host hit gaining [a, c) over the GPU checkpoint:
 *     hel_ovl_prepare()  -> 1: restore it overlapped (prep filled: the
 *                           split, the tail's hit, the head pages' stored
 *                           digests); admit with the whole hit;
 *     on a new ticket:      hel_ovl_start() before fetching prep.tail into
 *                           the ticket's pages past the head (hel_ovl_tail);
 *                           hel_ovl_cancel() if that fetch fails;
 *     always:               hel_ovl_prep_free();
 *   each loop:            hel_ovl_run(): one prefill chunk of every head;
 *   the ticket's FETCHED / FETCH_FAILED event: hel_ovl_loaded() (true: an
 *                           overlapped ticket, whose finish is the module's);
 *   the store stopped:    hel_ovl_clear().
 * A ticket finishes through env->finish once both its head is computed and
 * its tail loaded (or at once when either failed), with status 0, the
 * load's error, SEL_ECORRUPT (a head page differed from the stored one:
 * the record is dropped first) or -ECANCELED (the head's request went).
 */
#ifndef HEL_ENGINE_OVERLAP_H
#define HEL_ENGINE_OVERLAP_H

#include <stdbool.h>
#include <stdint.h>

#include "helios/engine.h"
#include "helios/model.h"
#include "helios/scheduler.h"
#include "selene.h"

typedef struct hel_overlap hel_overlap;

/* What the module works with: the worker's objects. */
typedef struct hel_ovl_env {
	hel_model *model;
	hel_scheduler *sched;
	sel_store *store;
	sel_policy *policy;
	const sel_geometry *geo;
	uint32_t page_tokens;
	uint32_t chunk_tokens; /* tokens per head chunk */
	hel_overlap_mode mode;
	hel_fetch_mode fetch;
	bool split_worth;     /* hel_engine_config.test_split_worth */
	hel_engine_stats *ws; /* overlap_* counters */
	/* Finish the ticket for key with status (the worker's finish_inbound
	 * and requeue of failed waiters). */
	void (*finish)(void *ctx, const sel_key *key, int status);
	void *ctx;
} hel_ovl_env;

typedef struct hel_ovl_prep {
	sel_split split;
	sel_hit tail;        /* the hit above split.at: what the store loads */
	uint32_t head_pages; /* the ticket's first head_pages pages are recomputed */
	uint64_t *want;      /* their stored digests (with_fetch: to be delivered) */
	bool with_fetch;     /* the tail's fetch delivers want (sel_inbound.sums) */
} hel_ovl_prep;

int hel_ovl_create(hel_overlap **out);
void hel_ovl_destroy(hel_overlap *o);

/* Decide and prepare an overlapped restore of hit for history h (a: the
 * GPU checkpoint's count).  1 with *p filled, 0 (restore or recompute it
 * whole; *p empty).  Never an error: anything that stands in the way (no
 * digests from this store, no tail hit, no memory) is 0. */
int hel_ovl_prepare(const hel_ovl_env *env, const sel_hit *hit, const sel_history *h, uint64_t a,
		    hel_ovl_prep *p);
void hel_ovl_prep_free(hel_ovl_prep *p);
/* The ticket's destinations for the tail: in's pages past the head. */
sel_inbound hel_ovl_tail(hel_overlap *o, const hel_ovl_prep *p, const sel_inbound *in);
/* Register the head of new ticket in->ticket (key: the hit's), computed
 * with request sid's live row from GPU checkpoint gpu (HEL_CKPT_NONE: from
 * empty).  Takes p->want.  0 or -ENOMEM (nothing registered). */
int hel_ovl_start(hel_overlap *o, const hel_ovl_env *env, hel_ovl_prep *p, const sel_key *key,
		  const sel_inbound *in, uint64_t gpu, hel_req_id sid, uint64_t a);
/* The tail's fetch failed to start: forget the head of ticket. */
void hel_ovl_cancel(hel_overlap *o, uint64_t ticket);
/* The store refused the tail's fetch with its digests (sel_inbound.sums):
 * forget the head of ticket and uncount its overlap; the caller restores
 * the hit whole. */
void hel_ovl_unstart(hel_overlap *o, const hel_ovl_env *env, uint64_t ticket);
/* One chunk of every head.  Returns the chunks run. */
int hel_ovl_run(hel_overlap *o, const hel_ovl_env *env);
/* The store's event for ticket (status 0: its tail and row landed and were
 * loaded).  False when ticket is not overlapped (the caller finishes it). */
bool hel_ovl_loaded(hel_overlap *o, const hel_ovl_env *env, uint64_t ticket, int status);
/* Forget every head (the store stopped: its tickets are never finished). */
void hel_ovl_clear(hel_overlap *o);
/* Heads registered now. */
uint32_t hel_ovl_count(const hel_overlap *o);

#endif
