/*
 * store_composite_int.h - what the files of the composite store share
 * (design 2.4 CompositeStore): its struct, its in-flight operations and the
 * calls between its parts.  Private to store_composite.c (the ops, puts,
 * parking, maintenance writes, events), store_composite_read.c (fetches
 * that read through into memory) and store_drain.c (the shutdown drain);
 * everyone else uses store_composite.h.
 */
#ifndef SEL_STORE_COMPOSITE_INT_H
#define SEL_STORE_COMPOSITE_INT_H

#include "list.h"
#include "store_common.h"
#include "store_composite.h"
#include "store_disk.h"
#include "store_evq.h"
#include "store_memory.h"
#include "store_pool.h"

#define BACKOFF_MIN_NS (50ull * 1000000)
#define BACKOFF_MAX_NS (2000ull * 1000000)
/* Streamed puts (records larger than the warm pool) at once: each keeps its
 * GPU checkpoint pinned for a whole disk write; two let the next one's
 * copy-out overlap the last one's final write. */
#define STREAM_PUTS 2

/* A memory put whose copy-out has not landed (state COPYING). */
struct cput {
	uint64_t checkpoint;
	sel_key key, parent;
	sel_digest bucket;
	uint32_t n_pages, tail;
	bool parent_pinned;
	struct cput *prev, *next;
};

/* A write_from in flight (state WRITING). */
struct cwrite {
	sel_key key;
	uint64_t slots;
	uint64_t bytes; /* the record's file bytes */
	struct cwrite *prev, *next;
};

/* A read-through fetch (its nodes RESERVED or pinned RESIDENT). */
struct cfetch {
	uint64_t ticket;
	sel_hit hit;
	uint32_t *dst;
	uint32_t n_dst, state_slot;
	uint32_t n; /* chain nodes, ascending */
	sel_key *keys;
	uint8_t *role;    /* ROLE_* */
	uint32_t pending; /* reads in flight */
	int status;
	bool read_done;
	bool overlapped; /* one fetch_into: the disk store uploads and sends the event */
	uint64_t submit_ns;
	struct cfetch *prev, *next;
};
enum {
	ROLE_RESIDENT = 1,
	ROLE_READ = 2
};

EOS_DLIST(cputs, cput_list, struct cput)
EOS_DLIST(cwrites, cwrite_list, struct cwrite)
EOS_DLIST(cfetches, cfetch_list, struct cfetch)

/* A memory fetch the composite answers for (its tier and timing). */
struct cticket {
	uint64_t ticket;
	sel_tier tier;
	uint64_t bytes, submit_ns;
};

/* The shutdown drain (design 2.5): its plan and what it did. */
struct cdrain {
	sel_key *plan; /* parked records, in write order */
	size_t n, next;
	uint64_t start_ns, end_ns; /* end: new writes stop (0: no limit) */
	uint64_t report_ns;        /* next progress report */
	uint64_t written, written_bytes, failed;
	uint64_t retried; /* writes a full filesystem sent back */
	uint64_t retries_left;
	uint64_t resume_ns; /* no new pass before this */
	uint32_t in_flight; /* drain writes started, not done */
	bool time_up, deadline_hit, no_room, no_space;
};

struct comp_store {
	sel_store base;
	struct sel_store_pool *sp;
	sel_store *mem, *disk; /* a memory store and a disk store over sp */
	uint32_t pt, ranks;
	uint64_t intake;
	struct sel_evq evq; /* events; the set over both stores, the timer, the eventfd */
	int tfd;            /* the write backoff's timerfd */
	bool tfd_armed;     /* set and not yet read back: poll reads it only then */
	bool drain;
	uint64_t drain_ns;
	void (*drain_cb)(void *ctx, const sel_drain_progress *p);
	void *drain_ctx;
	struct cdrain dr;
	bool draining;

	struct cput_list puts;
	struct cwrite_list writes;
	struct cfetch_list fetches;
	struct cticket *tk;
	size_t n_tk, cap_tk;
	sel_key *pend_rm; /* memory copies to remove once unpinned (PENDING_REMOVAL) */
	size_t n_rm, cap_rm;

	uint64_t writing_slots;
	uint64_t want_slots;    /* warm slots the last refused put needed */
	uint32_t streaming;     /* streamed puts in flight */
	struct sel_progress pg; /* refusals since the last PROGRESS, capacity back since */
	uint64_t backoff_until, backoff_ns;
	struct sel_composite_gauges g;
	bool closed, stopped;
	int close_rc;
	sel_stats st; /* the composite's own counters */
};

#define debug_check(cs) SEL_DEBUG_CHECK(sel_composite_store_check, &(cs)->base)

/* The composite behind s (checked: aborts on another store). */
struct comp_store *sel_cs_of(sel_store *s);

/* store_composite.c */
/* Poll both stores once and route their events; true when anything moved. */
bool cs_step(struct comp_store *cs);
/* Start the write of parked record key from its memory slots.  0, or an
 * error (nothing started). */
int cs_write_start(struct comp_store *cs, const sel_key *key);
/* Whether key's memory copy waits for its pins to go (PENDING_REMOVAL). */
bool cs_rm_pending(const struct comp_store *cs, const sel_key *key);
int cs_tk_add(struct comp_store *cs, uint64_t ticket, sel_tier tier, uint64_t bytes,
	      uint64_t submit_ns);
/* A fetch the composite fails itself: its event, counted. */
void cs_fetch_failed_event(struct comp_store *cs, uint64_t ticket, const sel_key *key,
			   uint64_t bytes, int status, uint64_t submit_ns);
bool cs_past(uint64_t deadline_ns);

/* store_composite_read.c */
/* Try read-through for hit: 0 started, 1 not eligible (stream instead),
 * or an error. */
int cs_read_through(struct comp_store *cs, const sel_hit *hit, const sel_inbound *in);
/* The disk store's read hook. */
void cs_read_done(void *ctx, void *arg, int status);
/* Read-throughs whose reads landed: upload them. */
void cs_fetches_advance(struct comp_store *cs);

/* store_drain.c */
/* Write the parked records within the drain limit and the close deadline
 * (drain_on_shutdown), or say what a stop loses (without it). */
void cs_drain(struct comp_store *cs, uint64_t deadline_ns);
void cs_report_not_drained(struct comp_store *cs);
/* A maintenance write ended while draining: count it. */
void cs_drain_write_done(struct comp_store *cs, const struct cwrite *w, int status);

#endif
