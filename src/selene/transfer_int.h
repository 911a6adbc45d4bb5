/*
 * transfer_int.h - the transfer set's private structures, shared by
 * transfer.c and its checker (transfer_check.c).  Internal to transfer.c's
 * module: nothing else includes it.  See transfer.c DESIGN and INVARIANTS.
 */
#ifndef SEL_TRANSFER_INT_H
#define SEL_TRANSFER_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "eos.h"
#include "transfer.h"

struct ring {
	pthread_mutex_t lock;
	pthread_cond_t cv;       /* CLOCK_MONOTONIC */
	struct sel_xfer_job **q; /* [cap] */
	uint32_t cap, head, count;
	bool stop;   /* drain what is queued, then exit */
	bool asleep; /* the thread waits on cv and needs a signal */
	bool kick;   /* deferred: jobs were queued while asleep (see Wakes) */
	/* Bumped on every push and stop: what a spinning thread watches
	 * without the lock. */
	_Atomic uint32_t seq;
};

struct help;

struct rank {
	sel_xfer *x;
	uint32_t r;
	pthread_t tid;
	bool running; /* a thread exists and has not been joined/detached (creator) */
	bool exited;  /* the thread left its loop (under x->life) */
	struct ring ring;
	/* Rank thread only. */
	void *state;
	struct sel_copy *call;        /* [call_cap] */
	sel_landed_copy *page_copies; /* [call_cap]: a page's copies for the hook */
	uint32_t call_cap, ncall;
	uint64_t call_bytes;
	uint64_t job_bytes;
	enum sel_copy_dir dir;
	bool abandoned;
	struct help *help; /* the thread sharing restores, or NULL (transfer.c) */
	bool help_tried;   /* help was wanted once: not again */
};

/* A rank's second thread for restores (transfer.c "Sharing a restore"). */
struct help {
	pthread_t tid;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* the helper waits for a task or stop */
	pthread_cond_t done_cv; /* the rank's thread waits for the helper's part */
	/* Under mu. */
	const struct sel_xfer_job *job; /* the task the helper may join, or NULL */
	uint64_t seq;                   /* bumped with each task posted */
	bool in_task;                   /* the helper is copying pages of job */
	bool stop;
	int rc; /* the helper's first failure in the last task */
	/* The next page index of job to take, by either thread. */
	_Atomic uint32_t next;
	/* The helper's own call buffers and copy state (x, r, state and dir
	 * as its rank's); read by the rank's thread once in_task is false. */
	struct rank lane;
	_Atomic uint64_t pages; /* pages the helper copied (sel_xfer_helped) */
};

struct sel_xfer {
	const sel_geometry *g;
	const sel_slot_layout *l;
	struct sel_copy_backend be;
	uint32_t ranks, depth;
	struct sel_xfer_part *part; /* [ranks] */
	uint64_t nslots;
	bool split;          /* explicit parts: no compare, no packing */
	bool uniform;        /* every rank has rank 0's share layout */
	bool uniform_row;    /* ... and rank 0's row bytes */
	uint64_t page_limit; /* smallest page count over ranks */
	uint64_t row_limit;  /* smallest row count over ranks */
	struct rank *rank;   /* [ranks] */

	pthread_mutex_t submit; /* serialises submitters; guards closing */
	bool closing;

	/* Wakes (see DESIGN). */
	atomic_bool defer;        /* submit records, sel_xfer_kick wakes */
	atomic_bool kick_any;     /* some ring has kick set */
	_Atomic uint64_t wakes;   /* signals submit and kick issued */
	_Atomic uint64_t spin_ns; /* how long an idle thread spins first */

	pthread_mutex_t done; /* completion queue, job priv, running/ndone */
	struct sel_xfer_job *head, *tail;
	uint32_t ndone, running;
	_Atomic uint32_t inflight;
	int efd;
	/* Writes to efd: owed by the pushes that made the queue non-empty,
	 * consumed by poll's reads (see Completion). */
	uint64_t owed, consumed;
	/* Writes made (after the unlock, so atomic): written == owed when no
	 * write is on its way.  Never above owed, never below consumed. */
	_Atomic uint64_t written;
	sel_landed_hook landed; /* fn NULL: none (sel_xfer_set_landed) */
	/* Tests only (sel_xfer_test_late_hook): called between a push's
	 * unlock and its eventfd write, on the rank thread. */
	void (*late_hook)(void *arg);
	void *late_arg;

	pthread_mutex_t life;   /* thread start, open results, exits */
	pthread_cond_t life_cv; /* CLOCK_MONOTONIC */
	uint32_t started, opened, exited;
	int open_rc;
	uint32_t open_rank;
	char open_msg[EOS_ERRMSG_MAX];
	atomic_bool abandon;

	/* Submitting thread only. */
	bool closed, leaked;
	int close_rc;
	struct sel_xfer *grave_next;
};

/* Tests only: run fn(arg) on the rank thread between the completion
 * push's unlock and its eventfd write (the window a late write opens).
 * Set before any job is submitted. */
void sel_xfer_test_late_hook(struct sel_xfer *x, void (*fn)(void *arg), void *arg);

#endif
