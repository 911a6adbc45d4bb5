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
 * SEL_WINDOW_PAGES pages plus the multi-slot row through its copy backend,
 * and reports (job id, rank, status).  A job completes when every rank has
 * reported; sel_xfer_poll returns job-level completions.  A rank reports a
 * failure only after its backend has drained every copy it issued for the
 * job, so destinations are quiescent when the failure is seen.
 *
 * Submission never blocks: channels are bounded and a full channel returns
 * -EAGAIN (the store turns that into SEL_RETRY with reason QUEUE).  The job
 * descriptor and its arrays belong to the caller until the job's completion
 * is polled.
 *
 * Threads run at reduced priority (SCHED_BATCH, positive nice).
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
 * open_rank/copy/close_rank run on the rank's thread. */
struct sel_copy_backend {
	const char *name; /* "host", "cuda", ... */
	void *ctx;
	/* Per-rank setup on the rank's own thread (CUDA: make the rank's
	 * context current, create the lowest-priority stream and a blocking-
	 * sync event). */
	int (*open_rank)(void *ctx, uint32_t rank, void **rank_state);
	/* Issue n copies and wait until they have all landed (or failed and
	 * drained).  0 or a negative errno / SEL_ECUDA. */
	int (*copy)(void *rank_state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir);
	void (*close_rank)(void *rank_state);
	/* Host memory registration for the slab pool (NULL: not needed). */
	int (*host_register)(void *ctx, void *addr, uint64_t len);
	void (*host_unregister)(void *ctx, void *addr, uint64_t len);
	/* Per-call bounds the backend needs (0 = unbounded): CUDA 16 MiB and
	 * 4,096 entries per batch call. */
	uint64_t max_call_bytes;
	uint32_t max_call_entries;
};

/* The host backend: memcpy on the transfer thread. */
extern const struct sel_copy_backend sel_copy_backend_host;

/* A job.  For SEL_COPY_OUT the planes are read at pages[] and the row at
 * state_slot, and written into page_slots[] / row_slots[]; SEL_COPY_IN is the
 * reverse.  Page i of the job uses slot page_slots[i] unless packed. */
struct sel_xfer_job {
	uint64_t id;              /* caller's id, echoed in the completion */
	enum sel_copy_dir dir;
	uint32_t n_pages;
	const uint32_t *pages;    /* GPU page ids [n_pages] */
	const uint32_t *page_slots;
	bool row;                 /* copy the row too */
	uint32_t state_slot;      /* GPU state slot */
	const uint32_t *row_slots; /* [layout.row_slots] (or fewer when packed) */
	/* Replicated (packed) representation, design 2.5: when set, one share
	 * is stored for all ranks: share j lives in slot slots[j / ranks] at
	 * rank (j % ranks)'s share offset.  IN jobs fan that share out to every
	 * rank.  OUT jobs never set these; they set compare instead. */
	bool pages_packed, row_packed;
	/* OUT, ranks > 1: once every rank's copy landed, compare the ranks'
	 * unpadded plane bytes (pages) and row bytes, and pack in place what is
	 * identical (see sel_xfer_done).  Runs on a transfer thread. */
	bool compare;
	/* Filled at completion. */
	int status;                     /* 0 or first failure */
	uint32_t failed_rank;
	bool pages_replicated, row_replicated; /* compare result: now packed */
	uint64_t bytes;                 /* bytes copied, all ranks */
	uint64_t submit_ns, done_ns;
};

typedef struct sel_xfer sel_xfer;

/* Start one thread per rank of g.  layout and pool describe the slots (the
 * pool's base address and slot bytes); queue_depth bounds each rank's job
 * channel.  Returns SEL_ECUDA (message "cuda unavailable: <reason>") if the
 * backend cannot open a rank: a configured GPU is never silently replaced. */
int sel_xfer_create(const sel_geometry *g, const sel_slot_layout *layout,
		    const sel_slab_pool *pool, const struct sel_copy_backend *backend,
		    uint32_t queue_depth, sel_xfer **out);

/* Submit; never blocks.  0, -EAGAIN when any rank's channel is full (nothing
 * was queued), SEL_ESTOPPED after a fatal failure. */
int sel_xfer_submit(sel_xfer *x, struct sel_xfer_job *job);

/* Completed jobs (every rank reported), oldest first, up to cap.  Never
 * blocks. */
int sel_xfer_poll(sel_xfer *x, struct sel_xfer_job **done, size_t cap);

/* Readable (eventfd) when a completion is waiting. */
int sel_xfer_fd(const sel_xfer *x);

/* Jobs submitted and not yet polled. */
uint32_t sel_xfer_inflight(const sel_xfer *x);

/* Stop accepting jobs, wait for queued jobs until deadline_ns (monotonic;
 * 0 = no limit), join the threads.  0, or SEL_ESTOPPED when a thread did not
 * finish: it is then detached and the caller must keep the slots and
 * planes alive (leak them). */
int sel_xfer_close(sel_xfer *x, uint64_t deadline_ns);
void sel_xfer_destroy(sel_xfer *x);

#endif
