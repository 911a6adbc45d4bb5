/*
 * prepare.h - the bounded preparation worker: decodes and prepares image
 * inputs off the model worker thread (design 2.13 "A bounded CPU worker
 * materializes only inputs in the active window"; "CPU preparation holds at
 * most one image tensor result across queued work, completion delivery,
 * and packing"; "Cold decoded sources use a separate shared one-use
 * allowance of max_image_pixels * 8 bytes"; docs/inputs.md).
 *
 * One thread per worker.  The caller (the model worker, part B) submits
 * jobs and polls results; neither call blocks, and results are announced
 * on an eventfd it can sleep on with its other inputs.  A job names an
 * encoded image and what is wanted of it:
 *   DESCRIBE  its source key, semantic identity and geometry (the image
 *             tokens it will occupy) -- what admission needs, and all
 *             that an image fully covered by a reused checkpoint needs
 *   PREPARE   that and its prepared tensors (a lease on a prepared-input
 *             record, input_record.h), for the model's vision path
 * The worker looks each up in the memory tier and the disk tier (when
 * given) before decoding or preparing, publishes what it builds to both,
 * and shares one preparation between lookups of the same record
 * (input_cache.h).  A failed or invalid record is a miss: the job's own
 * encoded bytes rebuild it.
 *
 * Bounds:
 *   - at most one image tensor result exists at a time from materializing
 *     it until the consumer calls hel_prep_done (packing): a PREPARE job
 *     whose tensors differ from the held one waits, while DESCRIBE jobs
 *     and jobs for the held tensor keep running;
 *   - cold decoded sources (a DESCRIBE's decoded image, kept for one later
 *     PREPARE of the same source) and the image being decoded share an
 *     allowance of max_pixels x 8 bytes, charged by buffer capacity; a
 *     source that does not fit is dropped and decoded again if needed;
 *   - at most queue_max jobs are queued or running (submit says -EAGAIN).
 *
 * Lifetimes: a job's encoded bytes belong to the caller, who keeps them
 * unchanged until the job's result has been polled -- cancelled jobs too
 * (they deliver -ECANCELED).  A result's tensor lease stays valid until
 * hel_prep_done; every polled result goes back through hel_prep_done
 * exactly once.
 *
 * Threads: submit, poll, done, cancel, forget and stats may be called from
 * any thread and never wait for decoding, preparation or I/O (a mutex
 * guards the queues for pointer operations only).  create and destroy
 * from one owner.
 */
#ifndef HEL_PREPARE_H
#define HEL_PREPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "image.h"
#include "input_cache.h"
#include "input_disk.h"

typedef struct hel_prep hel_prep;

typedef struct hel_prep_opts {
	const hel_core *core;    /* a vision core; outlives the worker */
	hel_image_limits limits; /* all zero: hel_image_limits_default() */
	sel_input_cache *cache;  /* memory tier; NULL: none (a private zero-budget
				   * cache still shares concurrent preparations) */
	sel_input_disk *disk;    /* disk tier, used only on the worker thread; NULL: none */
	uint32_t queue_max;      /* jobs queued or running at most; 0: 64 */
} hel_prep_opts;

enum hel_prep_kind {
	HEL_PREP_DESCRIBE = 1,
	HEL_PREP_PREPARE = 2,
};

/* Where a result came from. */
enum hel_prep_tier {
	HEL_PREP_BUILT = 0,  /* decoded (description) or prepared (tensors) by this job */
	HEL_PREP_MEMORY = 1, /* the memory tier */
	HEL_PREP_DISK = 2,   /* the disk tier */
	HEL_PREP_SHARED = 3, /* another job's result, still held */
};
const char *hel_prep_tier_name(uint32_t tier); /* "built", "memory", "disk", "shared" */

typedef struct hel_prep_job {
	uint32_t kind;        /* enum hel_prep_kind */
	const uint8_t *bytes; /* the encoded image (see Lifetimes) */
	size_t len;
	uint64_t tag; /* the caller's, returned in the result */
} hel_prep_job;

typedef struct hel_prep_result {
	uint64_t ticket, tag;
	uint32_t kind;
	int rc;                   /* 0, SEL_EFORMAT, SEL_EOVERSIZE, -ECANCELED, -ENOMEM, ... */
	char why[256];            /* the message when rc < 0 */
	sel_input_key source;     /* the source key */
	sel_input_source desc;    /* semantic identity and geometry (rc 0) */
	uint32_t desc_tier;       /* enum hel_prep_tier */
	sel_input_lease *tensors; /* PREPARE, rc 0: the prepared record (sel_input_lease_rec) */
	uint32_t tensor_tier;
	uint64_t decode_ns;  /* spent by this job decoding (0 when it did not) */
	uint64_t prepare_ns; /* spent resizing and patching */
} hel_prep_result;

int hel_prep_create(const hel_prep_opts *o, hel_prep **out);
/* Cancels what is queued, waits for the job in progress to stop, releases
 * every held owner (results not yet polled included) and joins the
 * thread.  Results already polled must have gone through hel_prep_done.
 * NULL-safe. */
void hel_prep_destroy(hel_prep *w);

/* Queue a job: 0 with its ticket, -EAGAIN when queue_max jobs are queued
 * or running, -EINVAL for a bad job.  Never blocks. */
int hel_prep_submit(hel_prep *w, const hel_prep_job *job, uint64_t *ticket);
/* Move up to max finished results into out: the count.  Never blocks. */
int hel_prep_poll(hel_prep *w, hel_prep_result *out, uint32_t max);
/* Readable (eventfd) while results wait to be polled. */
int hel_prep_wait_fd(const hel_prep *w);
/* The consumer is done with a polled result (its tensors are packed or no
 * longer needed): releases its lease, which may let the next tensor
 * materialize. */
void hel_prep_done(hel_prep *w, hel_prep_result *r);
/* Cancel a queued or running job: it delivers -ECANCELED soon (a job
 * that already finished delivers its result as it is).  0 or -ENOENT. */
int hel_prep_cancel(hel_prep *w, uint64_t ticket);
/* Drop a retained cold decoded source (its image became covered by a
 * restored checkpoint, or its request went away). */
void hel_prep_forget(hel_prep *w, const sel_input_key *source);

typedef struct hel_prep_stats {
	uint64_t submitted, delivered, cancelled, failed;
	uint64_t queued; /* queued or running now */
	uint64_t decodes, preparations;
	uint64_t desc_memory, desc_disk, tensor_memory, tensor_disk, tensor_shared;
	uint64_t disk_writes, disk_write_failures;
	uint64_t tensors_held;     /* image tensor results alive now: 0 or 1 */
	uint64_t tensors_held_max; /* the most ever at once (the bound says 1) */
	uint64_t cold_bytes, cold_peak, cold_limit, cold_sources;
	uint64_t decode_ns, prepare_ns; /* totals */
} hel_prep_stats;
void hel_prep_stats_get(hel_prep *w, hel_prep_stats *out);

#endif
