/*
 * store_memory_int.h - what the files of the memory store share (design
 * 2.4 MemoryStore): its struct, its records and jobs, and the calls one
 * file makes into another.  Private to store_memory.c (ops, put, poll,
 * open, checker), store_memory_fetch.c (restores) and store_memory_view.c
 * (the composite's calls); everyone else uses store_memory.h.
 */
#ifndef SEL_STORE_MEMORY_INT_H
#define SEL_STORE_MEMORY_INT_H

#include "list.h"
#include "store_common.h"
#include "store_memory.h"
#include "store_pool.h"

#define MS_FAILED SEL_CORE_FAILED /* copy-out failed, no slots */

struct mfetch;

enum {
	JOB_OUT = 1,
	JOB_IN = 2
};

/* A job block: descriptor, then the arrays it points into. */
struct mjob {
	struct sel_xfer_job x;
	uint8_t kind;
	/* OUT */
	sel_node_id node;
	uint64_t checkpoint;
	uint64_t bytes;
	sel_key key;
	struct mjob *prev, *next; /* live OUT jobs (for destroy) */
	/* IN */
	struct mfetch *f;
};

struct mfetch {
	uint64_t ticket;
	sel_key key;
	uint64_t resident; /* GPU-resident count the hit was for */
	uint64_t bytes;
	uint32_t pages; /* pages restored (0: row only) */
	uint64_t submit_ns, last_done_ns;
	int status;
	uint32_t n_jobs, n_submitted, n_done;
	uint32_t n_nodes;
	sel_node_id *nodes;
	struct mjob *jobs;
	struct mfetch *prev, *next; /* live fetches (for destroy) */
	struct mfetch *pend_next;   /* resubmission FIFO */
	struct mfetch *fin_next;    /* finished, event not yet delivered */
};

EOS_DLIST(outs, mjob_list, struct mjob)
EOS_DLIST(fetches, mfetch_list, struct mfetch)
EOS_FIFO(pend, mfetch_fifo, struct mfetch, pend_next)
EOS_FIFO_DEFINE(fin, struct mfetch_fifo, struct mfetch, fin_next)

struct mrec {
	struct sel_core_rec h; /* store pins, live */
	uint32_t *slots;       /* page slots, then row slots */
	uint32_t n_page_slots; /* tail, or ceil(tail / ranks) packed; 0 failed */
	uint32_t n_row_slots;  /* row_slots, fewer packed, 0 without row */
	bool pages_packed, row_packed;
	struct mjob *out; /* OUT job in flight */
};

struct mem_store {
	struct sel_core c; /* first: index, pool numbers, counters, transfers */
	sel_slab_pool *pool;

	uint64_t slots_pinned;
	uint64_t slots_held; /* slots records hold (the pool may be shared) */

	struct mjob_list outs;      /* live OUT jobs */
	struct mfetch_list fetches; /* live fetches */
	struct mfetch_fifo pend;    /* fetches with jobs the channel had no room for */
	struct mfetch_fifo fin;     /* fetches finished without a last completion */

	uint32_t refused_need; /* slots the last refused put needed */
	uint32_t warm_need;    /* slots the last queued put took (the warm pass) */
};

#define debug_check(ms) SEL_DEBUG_CHECK(sel_memory_store_check, &(ms)->c.base)

/* The memory store behind s (checked: aborts on another store). */
struct mem_store *sel_ms_of(sel_store *s);

static inline struct mrec *ms_rec(struct mem_store *ms, sel_node_id id)
{
	return SEL_CORE_REC(&ms->c, struct mrec, id);
}

static inline uint32_t rec_slots(const struct mrec *r) { return r->n_page_slots + r->n_row_slots; }

/* Pins by the store (jobs, the composite): counted in slots_pinned. */
void ms_pin(struct sel_core *c, sel_node_id id);
/* May run drop_row/remove callbacks on id (deferred row drops, useless
 * page-only leaves). */
void ms_unpin(struct sel_core *c, sel_node_id id);
/* Evict by the tree policy until n warm slots can be taken.  0 or -ENOSPC. */
int ms_make_room(struct mem_store *ms, uint32_t n);
/* Free warm slots: what a warm allocation could take now. */
uint64_t ms_free_warm(const struct mem_store *ms);

/* store_memory_fetch.c */
int ms_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in);
/* An IN job completed; 1 with *ev filled when its fetch is complete. */
int ms_in_done(struct mem_store *ms, struct mjob *j, sel_event *ev);
/* The event of a fetch whose jobs all ended (fin FIFO). */
void ms_fetch_event(struct mem_store *ms, struct mfetch *f, sel_event *ev);
/* Submit what waits for channel room. */
void ms_resubmit_pending(struct mem_store *ms);

#endif
