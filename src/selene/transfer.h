/*
 * transfer.h - per-rank copy threads between GPU planes and host slots
 * (design 2.5 "Transfers", 2.10, 2.12).
 *
 * Internal to libselene.
 *
 * A transfer set runs one thread per rank.  The submitting thread (the model
 * worker) hands it jobs made of page ids, a state slot and slot numbers; each
 * rank's thread expands them into plane and slot addresses from its rank's
 * geometry (never on the worker thread), copies in windows of at most
 * SEL_WINDOW_PAGES pages plus the multi-slot row (the row goes with the last
 * window) through its copy backend, and reports (job, rank, status).  A job
 * completes when every rank has reported; sel_xfer_poll returns job-level
 * completions.  A rank reports a failure only after its backend has drained
 * every copy it issued for the job, so destinations are quiescent when the
 * failure is seen.
 *
 * Submission never blocks: channels are bounded and a full channel returns
 * -EAGAIN (the store turns that into SEL_RETRY with reason QUEUE).  The job
 * descriptor and its arrays belong to the caller from submission until the
 * job's completion is polled: the transfer set reads the arrays and writes
 * the completion fields and the private part of the descriptor meanwhile.
 *
 * Threads run at reduced priority (SCHED_BATCH, nice 10).
 *
 * Slot addressing.  Rank r's share of slot s lies at
 *     part[r].base + s * part[r].stride
 * For the ordinary slab pool (one mapping of whole cross-rank records,
 * sel_xfer_create) part[r] = { pool base + share_off[r], slot_bytes }.  For a
 * CUDA split pool (design 2.5, memory-only TP>1; see cuda.h) each rank's
 * shares are one allocation: part[r] = { part base, share[r] }, and slot
 * numbers stay the identities the store and its index use.  Within a share,
 * page plane p sits at plane_off[r][p] and a row piece at offset 0.
 */
#ifndef SEL_TRANSFER_H
#define SEL_TRANSFER_H

#include "selene.h"
#include "slab.h"

/* One copy: len bytes from src to dst (host or device addresses). */
struct sel_copy {
	uint64_t dst, src, len;
};

enum sel_copy_dir {
	SEL_COPY_OUT = 0, /* planes -> slots (store) */
	SEL_COPY_IN = 1,  /* slots -> planes (fetch) */
};

/* The copy backend: host memcpy, CUDA batched copies, or a test stub.
 * open_rank/copy/close_rank run on the rank's thread; host_register and
 * host_unregister on the caller's.  The backend outlives every transfer set
 * using it (and is leaked with one that closed with SEL_ESTOPPED). */
struct sel_copy_backend {
	const char *name; /* "host", "cuda", ... */
	void *ctx;
	/* Per-rank setup on the rank's own thread (CUDA: make the rank's
	 * context current, create the lowest-priority stream and a blocking-
	 * sync event).  0 or a negative errno / SEL_E*, with a message
	 * (eos_fail) that sel_xfer_create passes on. */
	int (*open_rank)(void *ctx, uint32_t rank, void **rank_state);
	/* Issue n (>= 1) copies and wait until they have all landed (or failed
	 * and drained: nothing of them may still be in flight when copy
	 * returns).  n and the sum of lengths respect max_call_entries and
	 * max_call_bytes.  0 or a negative errno / SEL_ECUDA. */
	int (*copy)(void *rank_state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir);
	/* Optional (NULL: copy): the same as copy, for copies whose
	 * destination nobody reads soon (a restore's row handed to the landed
	 * hook in pieces, whose summary reads the source while it is in the
	 * cache: transfer.c "Landed windows"), so the host backend streams
	 * them whatever their size (copy_host.c "Bandwidth"). */
	int (*copy_cold)(void *rank_state, const struct sel_copy *c, uint32_t n,
			 enum sel_copy_dir dir);
	/* Undo open_rank, on the rank's thread.  NULL-safe state. */
	void (*close_rank)(void *rank_state);
	/* Host memory registration for the slab pool (NULL: not needed).
	 * Shaped like struct sel_slab_hooks. */
	int (*host_register)(void *ctx, void *addr, uint64_t len);
	void (*host_unregister)(void *ctx, void *addr, uint64_t len);
	/* Per-call bounds the backend needs (0 = unbounded): CUDA 16 MiB and
	 * 4,096 entries per batch call.  The transfer thread splits windows
	 * into several calls, and single copies longer than max_call_bytes
	 * into pieces, to respect them. */
	uint64_t max_call_bytes;
	uint32_t max_call_entries;
	/* copy_cold may run on a second thread with the rank's state while
	 * the rank's thread runs copy or copy_cold (transfer.c "Sharing a
	 * restore"): the host backend, whose cold calls use no rank state. */
	bool cold_any_thread;
};

/* The host backend: copies on the transfer thread (and its helper, below);
 * registration is a no-op.  One instance serves every transfer set. */
extern const struct sel_copy_backend sel_copy_backend_host;

/* How the host backend copies a call (copy_host.c DESIGN): memcpy, or
 * streaming (non-temporal) stores with SSE2 or AVX2. */
enum sel_host_copy {
	SEL_HOST_COPY_AUTO = 0, /* sel_host_copy_choose by the call's bytes */
	SEL_HOST_COPY_MEMCPY,
	SEL_HOST_COPY_STREAM_SSE2, /* x86-64 only */
	SEL_HOST_COPY_STREAM_AVX2, /* CPUs (and kernels) with AVX2 only */
};

/* Whether this CPU can run kind (AUTO and MEMCPY: always). */
bool sel_host_copy_available(enum sel_host_copy kind);
/* The kind AUTO uses for a call of that many bytes. */
enum sel_host_copy sel_host_copy_choose(uint64_t bytes);
/* Copy c[0..n) (non-overlapping; any alignment and length) with kind
 * (MEMCPY where kind is not available); every byte is visible to other
 * threads' ordinary loads once it returns.  Returns the kind used. */
enum sel_host_copy sel_host_copy_run(const struct sel_copy *c, uint32_t n, enum sel_host_copy kind);

/* A helper thread that splits calls with their caller (copy_host.c DESIGN
 * "Splitting").  The host backend opens one for a rank's thread where the
 * process has two CPUs per rank up to it, and splits calls of 8 MiB or
 * more.  One caller at a time; the caller waits only for the chunks the
 * helper claimed, never for the helper to wake.  open: 0 or a negative
 * errno (no thread started). */
struct sel_host_lane;
int sel_host_lane_open(struct sel_host_lane **out);
void sel_host_lane_close(struct sel_host_lane *l); /* joins the helper; NULL-safe */
/* sel_host_copy_run with the helper taking 1 MiB chunks of the call's
 * bytes (pieces taken end to end, so a chunk may begin or end inside a
 * piece) while the caller takes the rest; every byte is visible to other
 * threads' ordinary loads once it returns.  Returns the kind used. */
enum sel_host_copy sel_host_lane_run(struct sel_host_lane *l, const struct sel_copy *c, uint32_t n,
				     enum sel_host_copy kind);
/* Chunks the helper has copied so far (tests). */
uint64_t sel_host_lane_helped(struct sel_host_lane *l);

/* Private per-job bookkeeping of the transfer set.  Callers neither read nor
 * write it (submission initialises it). */
struct sel_xfer_job_priv {
	uint32_t pending;          /* ranks yet to report */
	struct sel_xfer_job *next; /* completion queue link */
};

/* A job.
 *
 * SEL_COPY_OUT reads the planes at pages[] and the row at state_slot and
 * writes page i into slot page_slots[i] and row piece k into row_slots[k]
 * (k < layout.row_slots), each rank in its own share.  SEL_COPY_IN is the
 * reverse, from the same slots into pages[] and state_slot.
 *
 * Replicated (packed) representation, design 2.5, IN jobs only: one share
 * is stored for all ranks.  With pages_packed, the share of page j lives in
 * slot page_slots[j / ranks] at rank (j % ranks)'s share offset, so
 * page_slots has ceil(n_pages / ranks) entries; with row_packed, row piece
 * k lives in slot row_slots[k / ranks] at rank (k % ranks)'s share offset
 * (ceil(layout.row_slots / ranks) entries).  Every rank reads that one
 * share: the bytes fan out to all ranks.  Packing needs every rank to have
 * the same share layout (plane count and unit sizes; for rows also the same
 * row bytes): otherwise submission fails with -EINVAL.
 *
 * compare (OUT, ranks > 1): once every rank's copy has landed, the last
 * rank's thread compares, page by page, every rank's unpadded plane bytes
 * with rank 0's, and every rank's row bytes with rank 0's.  If all pages
 * are identical it packs them in place (page i's rank-0 share moves to slot
 * page_slots[i / ranks] at rank (i % ranks)'s share offset, in ascending i,
 * which never overwrites a share not yet moved) and sets pages_replicated;
 * rows likewise, setting row_replicated.  The store then owns these slots
 * again and should free the tail no longer used:
 *     pages_replicated: page_slots[ceil(n_pages / ranks) .. n_pages)
 *     row_replicated:   row_slots[ceil(layout.row_slots / ranks) .. layout.row_slots)
 * The store keeps the rest and fetches with pages_packed / row_packed.
 * Records whose ranks' layouts differ, jobs with 0 pages (pages) or without
 * the row (row), and failed jobs are never marked replicated.  Not allowed
 * with split pools (slot bytes are not CPU-readable there).
 */
struct sel_xfer_job {
	uint64_t id; /* caller's id, untouched */
	enum sel_copy_dir dir;
	uint32_t n_pages;
	const uint32_t *pages; /* page ids [n_pages] */
	const uint32_t *page_slots;
	bool row;            /* copy the row too */
	uint32_t state_slot; /* state slot of the row */
	const uint32_t *row_slots;
	bool pages_packed, row_packed; /* IN only, see above */
	/* Packed IN only: share index of the job's first page, below ranks, so
	 * a restore may start inside a packed record (a GPU-resident prefix
	 * ending off a multiple of ranks): page i uses share first_share + i. */
	uint32_t first_share;
	bool compare; /* OUT only, see above */
	/* Filled at completion (valid once polled). */
	int status;                            /* 0 or the first failure reported */
	uint32_t failed_rank;                  /* rank of that failure */
	bool pages_replicated, row_replicated; /* compare result: now packed */
	uint64_t bytes;              /* bytes copied, all ranks (packing moves excluded) */
	uint64_t submit_ns, done_ns; /* eos_now_ns() at submission and completion */
	struct sel_xfer_job_priv priv;
};

typedef struct sel_xfer sel_xfer;

/* Landed windows (issue 18, transfer.c DESIGN "Landed windows"): with a
 * hook set (selene.h sel_landed_hook), a rank's thread calls it after each
 * copy-in window of a job has landed (every backend call of the window
 * returned 0) and before the rank reports the job.  A failed window is not
 * reported to it. */

/* Where rank r's share of slot 0 is and how far apart slots are (see the
 * header comment). */
struct sel_xfer_part {
	uint64_t base;
	uint64_t stride;
};

/* Start one thread per rank of g over the slots of pool.  g, layout, pool
 * and backend must outlive the transfer set.  queue_depth (>= 1) bounds
 * each rank's job channel.  Each rank's thread opens its rank with the
 * backend before this returns; if any rank fails, every thread is stopped
 * and joined and its error comes back with the backend's message plus the
 * rank ("cuda unavailable: ... (transfer rank 1)"): a configured GPU is
 * never silently replaced.  -EINVAL for mismatched arguments, -ENOMEM,
 * or a thread creation error. */
int sel_xfer_create(const sel_geometry *g, const sel_slot_layout *layout, const sel_slab_pool *pool,
		    const struct sel_copy_backend *backend, uint32_t queue_depth, sel_xfer **out);

/* The same over explicitly addressed rank parts (parts[g->ranks], copied)
 * holding nslots slots: used for CUDA split pools
 * (sel_cuda_split_pool_parts).  Such a set refuses compare and packed jobs. */
int sel_xfer_create_parts(const sel_geometry *g, const sel_slot_layout *layout,
			  const struct sel_xfer_part *parts, uint64_t nslots,
			  const struct sel_copy_backend *backend, uint32_t queue_depth,
			  sel_xfer **out);

/* Set (hook non-NULL, copied) or clear the landed hook, before the first
 * submission (the rank threads read it without a lock). */
void sel_xfer_set_landed(sel_xfer *x, const sel_landed_hook *hook);

/* Submit; never blocks.  0; -EAGAIN when any rank's channel is full
 * (nothing was queued on any rank); -EINVAL with a message for a job that
 * names a page id, state slot or slot number out of range, sets packed
 * flags on an OUT job or compare on an IN job, or packs across unequal
 * layouts; SEL_ESTOPPED once sel_xfer_close has begun.  On success the job
 * completes exactly once (see sel_xfer_poll); on error it never does. */
int sel_xfer_submit(sel_xfer *x, struct sel_xfer_job *job);

/* Completed jobs, in the order they completed (which for one transfer set
 * is submission order), up to cap; never blocks.  Returns the count.
 * Also valid after sel_xfer_close returned 0. */
int sel_xfer_poll(sel_xfer *x, struct sel_xfer_job **done, size_t cap);

/* An eventfd that is readable exactly while completions wait to be polled.
 * Do not read it; sel_xfer_poll resets it. */
int sel_xfer_fd(const sel_xfer *x);

/* The warm pass's read (issue 18, worker calls): when no completion waits
 * and no write of the eventfd is owed, read it once, which returns EAGAIN
 * and changes nothing, so that the next delivering poll's read finds the
 * syscall path and the descriptor's lines in the cache.  Never blocks;
 * takes the completion mutex as sel_xfer_poll does.  Returns true when it
 * read (false: completions or a write were on their way, which the next
 * poll reads anyway). */
bool sel_xfer_warm(sel_xfer *x);

/* Jobs submitted and not yet polled. */
uint32_t sel_xfer_inflight(const sel_xfer *x);

/* Wakes (transfer.c DESIGN "Wakes").  A rank thread out of jobs spins
 * (sel_xfer_set_spin, 50 us by default; 0: sleep at once) and then sleeps;
 * submission signals only a sleeping thread.  With deferred wakes on,
 * submission never signals: it records that a sleeping rank has work, and
 * sel_xfer_kick wakes each such rank once, so a caller that submits many
 * jobs pays one signal per rank per kick.  The caller kicks before it
 * sleeps or waits for the job (a store: at every poll and
 * sel_store_flush); a kick never sent delays the job by at most 50 ms (the
 * sleeping thread's backstop), it is never lost.  Either may be set at any
 * time from the submitting thread (a sleeping rank chooses its wait again;
 * a store switches to deferred wakes at its first sel_store_flush). */
void sel_xfer_defer_wakes(sel_xfer *x, bool defer);
void sel_xfer_set_spin(sel_xfer *x, uint64_t spin_ns);
/* Wake the sleeping ranks that deferred submissions left work for.
 * Returns the signals sent (0 and one atomic load when none is due).
 * Submitting thread. */
int sel_xfer_kick(sel_xfer *x);
/* Signals sent so far by submissions and kicks (each one a futex wake). */
uint64_t sel_xfer_wakes(const sel_xfer *x);

/* Pages the ranks' helpers copied in shared restores (transfer.c "Sharing
 * a restore"), for tests and stats. */
uint64_t sel_xfer_helped(const sel_xfer *x);
/* Ranks whose thread is asleep now (tests). */
uint32_t sel_xfer_sleeping(const sel_xfer *x);

/* Stop accepting jobs (later submissions get SEL_ESTOPPED), let the
 * threads finish the queued jobs until deadline_ns (eos_now_ns clock;
 * 0 = no limit), and join them.  0, or SEL_ESTOPPED when a thread had not
 * finished by the deadline: the threads are then told to abandon queued
 * jobs and are detached; a thread busy in a backend copy finishes that call
 * and exits without reporting.  The caller must then keep the slots,
 * planes, backend and unfinished job descriptors alive (leak them);
 * unfinished jobs never complete.  The transfer set itself is kept
 * reachable internally and sel_xfer_destroy leaves it alone.  Idempotent:
 * a second call returns the first result. */
int sel_xfer_close(sel_xfer *x, uint64_t deadline_ns);

/* Free a closed transfer set (closing it first, without deadline, if
 * needed).  NULL-safe; does nothing after close returned SEL_ESTOPPED. */
void sel_xfer_destroy(sel_xfer *x);

/* Verify the invariants in transfer.c's header: 0 or SEL_ECORRUPT with a
 * message naming the first violation.  Safe to call from the submitting
 * thread at any time (takes every lock briefly). */
int sel_xfer_check(const sel_xfer *x);

#endif
