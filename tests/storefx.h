/*
 * storefx.h - the fixture the store tests share (memory, disk, composite,
 * crash, drain, expiry, flare metrics; bench/store.c too): page and row
 * planes in host memory (eos_aligned_alloc), a geometry over them, a copy
 * backend the test can hold or fail, deterministic byte patterns derived
 * from a conversation tag and page index, conversations with their
 * histories, and event helpers.
 */
#ifndef STOREFX_H
#define STOREFX_H

#include <pthread.h>

#include "cuda.h"
#include "eos.h"
#include "testutil.h"
#include "transfer.h"

#define SFX_PT 64u
#define SFX_MAXR 2
#define SFX_MAXP 3

/* A copy backend the test controls. */
struct sfx_stub {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool hold;     /* copies wait while set */
	int fail;      /* error for copies in fail_dir (0: none) */
	int fail_dir;  /* SEL_COPY_OUT, SEL_COPY_IN, or -1 for both */
	int fail_left; /* copies still to fail (-1: every one) */
	int waiting;   /* copy calls blocked on hold */
	uint64_t calls;
	uint64_t done; /* copy calls returned */
};

struct sfx {
	uint32_t ranks, n_planes;
	uint64_t unit[SFX_MAXP];
	uint64_t row_bytes;
	uint64_t pages, rows;
	/* The planes; in device mode host mirrors (what was written or read
	 * back last) of the device planes dplane / drow. */
	uint8_t *plane[SFX_MAXR][SFX_MAXP];
	uint8_t *row[SFX_MAXR];
	/* Device mode (sfx_devices): rank r's planes on device dev[r]. */
	const struct sel_cuda *cu;
	int dev[SFX_MAXR];
	sel_cu_ctx ctx[SFX_MAXR];
	sel_cu_dptr dplane[SFX_MAXR][SFX_MAXP], drow[SFX_MAXR];
	sel_geometry *g;
	struct sfx_stub stub;
	struct sel_copy_backend be;
	uint8_t model[SEL_IDENTITY_BYTES];
	uint64_t slot_bytes;
	uint32_t row_slots;
};

/* Device mode: from now on sfx_init puts rank r's planes and rows in
 * device memory of devices[r] (cuMemAlloc through cu, the real driver or
 * tests/cudafake.c), kind SEL_MEM_DEVICE, and sfx_config names the
 * devices, so stores copy through the CUDA backend; page and row patterns
 * are written and checked through cuMemcpyHtoD / cuMemcpyDtoH, and the stub
 * backend copies with them too.  NULL cu: host planes again.
 * sfx_device_mode() says which; sfx_cuda_main runs a store test's main in
 * device mode (the real driver, or the fake with SELENE_TEST_FAKE_CUDA=1),
 * exiting 77 with the reason when there is no driver or device. */
void sfx_devices(const struct sel_cuda *cu, const int *devices);
/* The process's CUDA driver with *count devices, or exit 77 saying why
 * there is none to test on (no library, cuInit failing, no device). */
const struct sel_cuda *sfx_cuda_or_skip(int *count);
const struct sel_cuda *sfx_device_mode(void);
bool sfx_device_fake(void);
int sfx_cuda_main(const char *name, int (*test_main)(void));

/* ranks x n_planes page planes of unit[] bytes (names "k", "v", "x") and a
 * row plane of row_bytes, pages pages and rows rows each. */
void sfx_init(struct sfx *f, uint32_t ranks, uint32_t n_planes, const uint64_t *unit,
	      uint64_t row_bytes, uint64_t pages, uint64_t rows);
void sfx_free(struct sfx *f);
/* A store configuration over f: host headroom 1 GiB, max_active 1, the
 * offload identity derived from f->model (ordinary mode). */
sel_store_config sfx_config(struct sfx *f, bool stub);

void sfx_hold(struct sfx *f, bool hold);
void sfx_fail_n(struct sfx *f, int err, int dir, int n);
void sfx_wait_blocked(struct sfx *f, int n);
/* Wait (up to 10 s) until every copy call made so far has returned. */
void sfx_wait_copies_done(struct sfx *f);

/* Byte patterns.  Page j of conversation tag on every rank; split: ranks
 * differ. */
uint64_t sfx_mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
void sfx_put_page(struct sfx *f, uint32_t id, uint64_t tag, uint64_t j, bool split);
bool sfx_page_ok(struct sfx *f, uint32_t id, uint64_t tag, uint64_t j, bool split);
void sfx_put_row(struct sfx *f, uint32_t slot, uint64_t seed, bool split);
bool sfx_row_ok(struct sfx *f, uint32_t slot, uint64_t seed, bool split);
void sfx_poison(struct sfx *f);

struct sfx_conv {
	sel_history h;
	uint64_t tag;
	uint32_t *gid; /* GPU page id of logical page j */
	uint64_t n;
	bool split;          /* TP>1: pages and rows differ across ranks ... */
	uint64_t split_from; /* ... pages from page split_from on (0: all) */
};

/* Whether logical page j of cv differs across ranks. */
static inline bool sfx_conv_split(const struct sfx_conv *cv, uint64_t j)
{
	return cv->split && j >= cv->split_from;
}

/* tokens tokens derived from tag; logical page j lives at id first_id + j. */
void sfx_conv_init(struct sfx *f, struct sfx_conv *cv, uint64_t tag, uint64_t tokens,
		   uint32_t first_id);
void sfx_conv_free(struct sfx_conv *cv);
/* Write the GPU bytes of the checkpoint at c (pages from 0, its row in
 * slot) and describe it.  parent_c 0: no offered parent.  The row is split
 * across ranks as cv->split says; sfx_ckpt_row says it per checkpoint. */
sel_published sfx_ckpt(struct sfx *f, struct sfx_conv *cv, uint64_t c, uint64_t parent_c,
		       uint32_t slot, uint64_t checkpoint);
sel_published sfx_ckpt_row(struct sfx *f, struct sfx_conv *cv, uint64_t c, uint64_t parent_c,
			   uint32_t slot, uint64_t checkpoint, bool row_split);
sel_key sfx_key(struct sfx_conv *cv, uint64_t c);
static inline uint64_t sfx_row_seed(const struct sfx_conv *cv, uint64_t c)
{
	return cv->tag * 1000003 + c;
}

/* Events.  check (may be NULL) runs after every poll.  These skip
 * SEL_EV_PROGRESS: they wait for, count or forbid the events of puts and
 * fetches (tests of PROGRESS poll directly).  The _all forms count every
 * event, PROGRESS included, for scenarios in which none may come. */
typedef int (*sfx_check_fn)(sel_store *s);
void sfx_wait_events(sel_store *s, sel_event *ev, int want, sfx_check_fn check);
void sfx_wait_events_all(sel_store *s, sel_event *ev, int want, sfx_check_fn check);
/* No event comes: poll until every accepted put and fetch has reported
 * (nothing in flight), failing on any event on the way.  No fixed wait:
 * once nothing is in flight, nothing can come. */
void sfx_no_events(sel_store *s);
void sfx_no_events_all(sel_store *s);
/* No event now: one poll.  For a test that holds every copy in flight
 * (sfx_hold, then sfx_wait_blocked) or started none: nothing can complete,
 * so nothing may be reported. */
void sfx_none_now(sel_store *s);
void sfx_none_now_all(sel_store *s);
/* The one event that comes next, and no other after it. */
sel_event sfx_one_event(sel_store *s, sfx_check_fn check);
/* One poll, then a wait of at most 5 ms on the store's descriptor.  Any
 * event but PROGRESS fails the test; PROGRESS events are counted in
 * *progress (may be NULL).  check (may be NULL) runs after the poll. */
void sfx_pump(sel_store *s, sfx_check_fn check, int *progress);
/* A wait of at most 5 ms on the store's descriptor, then one poll of up
 * to cap events into ev: their count (a poll error fails the test). */
int sfx_poll_wait(sel_store *s, sel_event *ev, int cap);
/* The store's pool counters (sel_store_stats). */
sel_pool_counters sfx_pool_counters(sel_store *s);
/* Poll until one event comes (20 s) and return it; two at once fail the
 * test. */
sel_event sfx_next_event(sel_store *s);
/* A store over f's memory tier of `memory` bytes (0: pool only) attached
 * to the manager on sock as instance id, with ten seconds for its Hello:
 * attached (SEL_POOL_UP) or the test fails, naming the warning. */
sel_store *sfx_open_pooled(struct sfx *f, const char *sock, const char *id, uint64_t memory);
/* Fetch hit into pages first.. (consecutive ids) and state slot slot under
 * ticket: sel_store_fetch's result. */
int sfx_fetch_at(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t slot, uint64_t ticket);
/* Checkpoint c of cv restored into pages first.. and row slot slot: every
 * page and the row hold cv's bytes. */
bool sfx_restored_ok(struct sfx *f, struct sfx_conv *cv, uint64_t c, uint32_t first, uint32_t slot);
/* Nothing in flight: every put and fetch reported and, in a composite,
 * no maintenance write, read-through or streamed put left and no write
 * backoff pending.  Nothing more happens then without a new call. */
bool sfx_quiet(sel_store *s);
/* Pump until quiet (at most 20 s): what the last calls set off has
 * finished.  Returns the PROGRESS events seen on the way. */
int sfx_settle(sel_store *s, sfx_check_fn check);
/* Pump until cond holds, at most 20 s (a file removed, a count reached). */
#define SFX_UNTIL(s, check, cond)                                                                  \
	do {                                                                                       \
		uint64_t until_deadline_ = eos_now_ns() + 20ull * 1000000000;                      \
		while (!(cond)) {                                                                  \
			CHECKF(eos_now_ns() < until_deadline_, "not reached in 20 s: %s", #cond);  \
			sfx_pump((s), (check), NULL);                                              \
		}                                                                                  \
	} while (0)
/* Poll (discarding nothing but PROGRESS) until pred(ctx) or 10 s. */
void sfx_pump_until(sel_store *s, bool (*pred)(void *), void *ctx, sel_event *ev, int *n_ev,
		    int cap, sfx_check_fn check);

uint64_t sfx_page_bytes_all(struct sfx *f);

/* Restore: lookup at resident (hit must be want_c on tier), fetch into ids
 * dst_first.. and slot, wait; returns the event.  With verify, the bytes
 * must match, the row's split across ranks as cv->split says. */
sel_event sfx_restore(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t resident,
		      uint64_t limit, uint64_t want_c, uint32_t dst_first, uint32_t slot,
		      sel_tier tier, bool verify, sfx_check_fn check);
/* sfx_restore with the row split or not as row_split says (whatever
 * cv->split) and, with all_events, the fetch's event the very next event
 * (PROGRESS included). */
struct sfx_restore_opts {
	bool row_split;
	bool all_events;
};
sel_event sfx_restore_with(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t resident,
			   uint64_t limit, uint64_t want_c, uint32_t dst_first, uint32_t slot,
			   sel_tier tier, bool verify, sfx_check_fn check,
			   struct sfx_restore_opts o);

#endif
