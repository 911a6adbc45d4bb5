/*
 * engine_inputs.h - the engine's image inputs (design 2.13; docs/inputs.md
 * "Engine scheduling"): one preparation worker per engine over the
 * engine's memory and disk input tiers, and the per-request state that
 * admission and prefill use.  engine.c calls these from small hooks; this
 * module owns everything else.
 *
 * A request with images arrives with HEL_TOK_IMAGE placeholders at its
 * images' positions (hel_image_input).  At admission its images are
 * DESCRIBED by the worker (source key -> semantic identity and geometry,
 * from memory, disk, or by decoding); the placeholders then become the
 * image tokens of each semantic identity (sel_input_tokens), so prefix
 * keys depend on the image through its identity alone.  Admission then
 * knows the reused checkpoint: images whose span ends past it are
 * PREPARED (tensors from memory, disk, or by resizing and patching) one at
 * a time, each packed at once into the request's image-token states
 * (hel_model_image_states) and released (hel_prep_done), so the worker
 * holds at most one tensor result; images a checkpoint covers are never
 * prepared (their cold decoded source is forgotten).  The request is
 * admitted when every image past the checkpoint is packed; until then it
 * waits in the pending queue while other requests are admitted past it.
 * Prefill consumes image positions with hel_model_prefill_image and that
 * chunk's share of the states.
 *
 * Threads: the hel_inputs_* calls other than copy and free are made on the
 * engine's worker thread and never wait: they submit, poll and release
 * (prepare.h).  hel_inputs_copy runs on the submitting thread.
 */
#ifndef HEL_ENGINE_INPUTS_H
#define HEL_ENGINE_INPUTS_H

#include <stdbool.h>
#include <stdint.h>

#include "core.h"
#include "engine.h"
#include "model.h"

typedef struct hel_inputs hel_inputs;
typedef struct hel_req_inputs hel_req_inputs;

/* The memory tier's budget: one eighth of the warm budget for a vision
 * core (sel_input_budget), 0 otherwise.  The checkpoints get the rest. */
uint64_t hel_inputs_memory_budget(const hel_engine_config *cfg);

/* Host bytes a vision core's inputs may hold beyond the memory tier's
 * budget (design 2.13): the cold decoded-source allowance (max_pixels x
 * 8), the disk index's allowance (1 MiB) and one serialized prepared
 * record in flight (the core's largest); 0 for a text-only core.  The
 * store leaves them out of the intake's headroom. */
uint64_t hel_inputs_host_reserved(const hel_engine_config *cfg);

/* For a vision core: the memory tier, the disk tier over the namespace
 * directory disk_dir (the disk store's locked record directory; NULL or ""
 * for none) with a limit of disk_limit bytes, and the worker.  *out NULL
 * for a text-only core.  Fails when the disk tier's scan fails (its disk
 * usage would be unknown). */
int hel_inputs_open(const hel_engine_config *cfg, const hel_model *model, const char *disk_dir,
		    uint64_t disk_limit, hel_inputs **out);
/* After the worker thread stopped: stops the preparation worker and frees
 * what requests that ended left in flight.  NULL-safe. */
void hel_inputs_destroy(hel_inputs *in);
/* The preparation worker's result descriptor, or -1. */
int hel_inputs_wait_fd(const hel_inputs *in);

/* Submit side: validate q's images against core and the prompt (positions
 * in order, placeholders exactly there) and copy them.  0 with *out (NULL
 * without images), or -EINVAL naming the field (eos_fail). */
int hel_inputs_copy(const hel_core *core, const hel_request *q, hel_req_inputs **out);
/* Free what hel_inputs_copy made, never seen by the worker.  NULL-safe. */
void hel_req_inputs_free(hel_req_inputs *ri);

/* Admission, before planning: 0 when every image is described (the
 * prompt's placeholders replaced by image tokens) and no preparation is in
 * flight, 1 while a job is (the request is not planned, so a waiting
 * prompt is not hashed again every step), or < 0: the request fails
 * (message through eos_fail). */
int hel_inputs_describe(hel_inputs *in, hel_req_inputs *ri, hel_token *prompt);
/* Admission, with the plan: reused = the tokens the admission will reuse
 * (GPU or host checkpoint).  0 when every image whose span ends past
 * reused is packed, 1 while preparations are in flight, < 0: fail. */
int hel_inputs_ready(hel_inputs *in, hel_req_inputs *ri, uint64_t reused);
/* The depth a replay of the request must start from: the end of its
 * last image without states (one a reused checkpoint covered), 0 when
 * every image is packed or it has none.  The scheduler holds a preempted
 * request whose GPU checkpoint lies below it (hel_scheduler_set_floor);
 * hel_inputs_ready with the depth it found prepares those images. */
uint64_t hel_inputs_floor(const hel_req_inputs *ri);
/* The request ended (finished, failed, cancelled): cancel its jobs; what a
 * job still reads is freed once its result is polled.  NULL-safe. */
void hel_inputs_release(hel_inputs *in, hel_req_inputs *ri);

/* Poll the worker's results and pack them: the count handled. */
int hel_inputs_service(hel_inputs *in);

/* A prefill (or capture) entry over [begin, end) of a request with images:
 * text runs with hel_model_prefill, image runs with
 * hel_model_prefill_image and their share of the packed states; logits
 * of the last token.  -EINVAL when an image position has no states. */
int hel_inputs_prefill(const hel_req_inputs *ri, hel_model *m, uint32_t slot, const uint32_t *pages,
		       uint32_t page_tokens, const hel_token *tokens, uint64_t begin, uint64_t end,
		       int32_t *logits);

void hel_inputs_stats(hel_inputs *in, hel_engine_input_stats *out);

#endif
