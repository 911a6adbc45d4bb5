/*
 * engine_inputs.c - the engine's image inputs: the preparation worker,
 * the memory and disk input tiers, and each request's images from
 * description to packed states (engine_inputs.h; design 2.13).
 *
 * DESIGN
 *   Jobs.  Every job is tagged with its image (struct rimg), which belongs
 *   to its request's hel_req_inputs.  A request that ends while a job is
 *   in flight cancels it and leaves its hel_req_inputs on the orphan list:
 *   the worker reads the image's encoded bytes until the job's result is
 *   polled (prepare.h "Lifetimes"), so they are freed only then.
 *
 *   One tensor result at a time.  A request has at most one PREPARE in
 *   flight; the worker's own bound holds one tensor result across all
 *   jobs.  A polled tensor result is packed at once into the image's
 *   states and handed back (hel_prep_done), so the next image's tensors
 *   can materialize.
 *
 *   States stay with the request until it ends: a preempted request is
 *   re-admitted from its whole history by the scheduler itself, and its
 *   replay may consume the image positions again.  An image a checkpoint
 *   covered has none: the request's floor (hel_inputs_floor) makes the
 *   scheduler hold a replay that would start before it, and the engine
 *   prepares it through hel_inputs_ready at the depth found, as at
 *   admission, before letting the replay go.
 *
 * INVARIANTS
 *   1. ri->jobs counts ri's images with a job in flight (img->job).
 *   2. A hel_req_inputs is freed only with jobs == 0; dead ones with jobs
 *      are on in->orphans.
 *   3. Every polled result goes through hel_prep_done exactly once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eos.h"
#include "helios/engine_inputs.h"
#include "helios/prepare.h"
#include "input_cache.h"
#include "input_disk.h"
#include "input_key.h"

enum img_stage {
	IMG_NEW = 0,    /* nothing asked yet */
	IMG_DESCRIBING, /* a DESCRIBE in flight */
	IMG_DESCRIBED,  /* identity and geometry known */
	IMG_PREPARING,  /* a PREPARE in flight */
	IMG_PACKED,     /* its image-token states computed */
};

struct rimg {
	hel_req_inputs *owner;
	uint8_t *bytes;
	size_t len;
	uint32_t at, n;
	uint32_t stage;
	bool job, forgotten, covered;
	uint64_t ticket;
	sel_input_key source;
	sel_input_source desc;
	uint32_t *states; /* n x hidden, IMG_PACKED */
};

struct hel_req_inputs {
	uint32_t n, hidden;
	uint32_t jobs;
	bool dead, substituted, waiting;
	int err;
	hel_req_inputs *next_orphan;
	char why[320];
	struct rimg img[];
};

struct hel_inputs {
	const hel_core *core;
	const hel_model *model;
	hel_prep *prep;
	sel_input_cache *cache;
	sel_input_disk *disk;
	int dirfd;
	hel_req_inputs *orphans;
	uint64_t budget;
	hel_engine_input_stats st; /* this module's counters */
	uint64_t built_desc, built_desc_ns, built_tensor, built_tensor_ns;
};

uint64_t hel_inputs_memory_budget(const hel_engine_config *cfg)
{
	return sel_input_budget(cfg->memory_bytes, cfg->core && cfg->core->has_image);
}

uint64_t hel_inputs_host_reserved(const hel_engine_config *cfg)
{
	const hel_core *c = cfg->core;
	if (!c || !c->has_image)
		return 0;
	hel_image_limits l = cfg->image_limits;
	if (!l.max_pixels)
		l = hel_image_limits_default();
	uint64_t u = (uint64_t)c->image.patch * c->image.merge;
	uint64_t record = (uint64_t)c->image.max_tokens * u * u * c->image.channels +
			  SEL_INPUT_HEADER_MAX + 64ull * SEL_INPUT_TENSORS_MAX;
	return hel_image_cold_allowance(&l) + SEL_INPUT_DISK_ALLOWANCE + record;
}

int hel_inputs_open(const hel_engine_config *cfg, const hel_model *model, const char *disk_dir,
		    uint64_t disk_limit, hel_inputs **out)
{
	*out = NULL;
	if (!cfg->core->has_image)
		return 0;
	hel_inputs *in = calloc(1, sizeof *in);
	if (!in)
		return eos_fail(-ENOMEM, "image inputs: out of memory");
	in->core = cfg->core;
	in->model = model;
	in->dirfd = -1;
	in->budget = hel_inputs_memory_budget(cfg);
	int rc = sel_input_cache_create(in->budget, &in->cache);
	if (rc)
		goto fail;
	if (disk_dir && *disk_dir && disk_limit) {
		in->dirfd = open(disk_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (in->dirfd < 0) {
			rc = eos_fail(-errno, "image inputs: %s: %s", disk_dir, strerror(errno));
			goto fail;
		}
		struct sel_input_disk_opts o = {.limit_bytes = disk_limit,
						.datasync = cfg->fdatasync};
		if ((rc = sel_input_disk_open(in->dirfd, &o, &in->disk))) {
			rc = eos_fail(rc, "image inputs: scanning %s: %s", disk_dir, sel_errmsg());
			goto fail;
		}
	}
	hel_prep_opts po = {.core = cfg->core,
			    .limits = cfg->image_limits,
			    .cache = in->cache,
			    .disk = in->disk};
	if ((rc = hel_prep_create(&po, &in->prep)))
		goto fail;
	in->st.enabled = true;
	*out = in;
	return 0;
fail:
	hel_inputs_destroy(in);
	return rc;
}

static void ri_free(hel_req_inputs *ri)
{
	if (!ri)
		return;
	for (uint32_t k = 0; k < ri->n; k++) {
		free(ri->img[k].bytes);
		free(ri->img[k].states);
	}
	free(ri);
}

void hel_req_inputs_free(hel_req_inputs *ri) { ri_free(ri); }

void hel_inputs_destroy(hel_inputs *in)
{
	if (!in)
		return;
	hel_prep_destroy(in->prep); /* releases every result not polled */
	while (in->orphans) {
		hel_req_inputs *ri = in->orphans;
		in->orphans = ri->next_orphan;
		ri_free(ri);
	}
	sel_input_disk_close(in->disk);
	if (in->dirfd >= 0)
		close(in->dirfd);
	sel_input_cache_destroy(in->cache);
	free(in);
}

int hel_inputs_wait_fd(const hel_inputs *in) { return in ? hel_prep_wait_fd(in->prep) : -1; }

/* ---- submit side --------------------------------------------------------- */

/* The HEL_TOK_IMAGE placeholders of prompt are exactly the images' spans,
 * which are in order and within the prompt. */
static int check_spans(const hel_core *core, const hel_request *q)
{
	uint64_t end = 0;
	for (uint32_t k = 0; k < q->n_images; k++) {
		const hel_image_input *im = &q->images[k];
		if (!im->bytes || !im->len)
			return eos_fail(-EINVAL, "images[%u]: no encoded bytes", k);
		if (im->tokens == 0 || im->tokens > core->image.max_tokens)
			return eos_fail(-EINVAL, "images[%u]: %u tokens (1 to %u for core '%s')", k,
					im->tokens, core->image.max_tokens, core->name);
		if (im->at < end || (uint64_t)im->at + im->tokens > q->n_prompt)
			return eos_fail(-EINVAL,
					"images[%u]: positions %u..%" PRIu64
					" overlap the image before "
					"or leave the prompt of %u tokens",
					k, im->at, (uint64_t)im->at + im->tokens, q->n_prompt);
		end = (uint64_t)im->at + im->tokens;
	}
	uint32_t k = 0;
	for (uint32_t i = 0; i < q->n_prompt; i++) {
		while (k < q->n_images && i >= q->images[k].at + q->images[k].tokens)
			k++;
		bool inside = k < q->n_images && i >= q->images[k].at;
		if (inside && q->prompt[i] != HEL_TOK_IMAGE)
			return eos_fail(
				-EINVAL,
				"prompt: position %u of images[%u] is token %u, not the image "
				"placeholder %u",
				i, k, q->prompt[i], HEL_TOK_IMAGE);
		if (!inside && q->prompt[i] == HEL_TOK_IMAGE)
			return eos_fail(
				-EINVAL,
				"prompt: the image placeholder %u at position %u is no image's "
				"position",
				HEL_TOK_IMAGE, i);
	}
	return 0;
}

int hel_inputs_copy(const hel_core *core, const hel_request *q, hel_req_inputs **out)
{
	*out = NULL;
	if (!core->has_image) {
		if (q->n_images)
			return eos_fail(-EINVAL, "images: core '%s' takes no images", core->name);
		return 0;
	}
	int rc = check_spans(core, q);
	if (rc || !q->n_images)
		return rc;
	hel_req_inputs *ri = calloc(1, sizeof *ri + q->n_images * sizeof ri->img[0]);
	if (!ri)
		return eos_fail(-ENOMEM, "submit: out of memory");
	ri->n = q->n_images;
	ri->hidden = core->hidden;
	for (uint32_t k = 0; k < ri->n; k++) {
		struct rimg *im = &ri->img[k];
		im->owner = ri;
		im->at = q->images[k].at;
		im->n = q->images[k].tokens;
		im->len = q->images[k].len;
		if (!(im->bytes = malloc(im->len))) {
			ri_free(ri);
			return eos_fail(-ENOMEM, "submit: out of memory for images[%u]", k);
		}
		memcpy(im->bytes, q->images[k].bytes, im->len);
	}
	*out = ri;
	return 0;
}

/* ---- worker side --------------------------------------------------------- */

static int fail_ri(hel_req_inputs *ri) { return eos_fail(ri->err, "%s", ri->why); }

static void set_waiting(hel_inputs *in, hel_req_inputs *ri, bool w)
{
	if (ri->waiting != w) {
		ri->waiting = w;
		if (w)
			in->st.waiting++;
		else
			in->st.waiting--;
	}
}

/* Queue kind for im: 0, 1 when the worker's queue is full (try later), or
 * < 0 (the request fails). */
static int submit(hel_inputs *in, struct rimg *im, uint32_t kind)
{
	hel_prep_job job = {
		.kind = kind, .bytes = im->bytes, .len = im->len, .tag = (uint64_t)(uintptr_t)im};
	int rc = hel_prep_submit(in->prep, &job, &im->ticket);
	if (rc == -EAGAIN)
		return 1;
	if (rc) {
		im->owner->err = rc;
		snprintf(im->owner->why, sizeof im->owner->why, "image at %u: %s", im->at,
			 sel_errmsg());
		return rc;
	}
	im->job = true;
	im->owner->jobs++;
	im->stage = kind == HEL_PREP_DESCRIBE ? IMG_DESCRIBING : IMG_PREPARING;
	return 0;
}

int hel_inputs_describe(hel_inputs *in, hel_req_inputs *ri, hel_token *prompt)
{
	if (!ri)
		return 0;
	if (ri->err)
		return fail_ri(ri);
	if (ri->substituted)
		return ri->jobs ? 1 : 0; /* a preparation in flight: no plan until it lands */
	bool all = true;
	for (uint32_t k = 0; k < ri->n; k++) {
		struct rimg *im = &ri->img[k];
		if (im->stage == IMG_NEW) {
			int rc = submit(in, im, HEL_PREP_DESCRIBE);
			if (rc < 0)
				return fail_ri(ri);
		}
		if (im->stage < IMG_DESCRIBED)
			all = false;
	}
	set_waiting(in, ri, !all);
	if (!all)
		return 1;
	for (uint32_t k = 0; k < ri->n; k++) {
		struct rimg *im = &ri->img[k];
		if (im->desc.tokens != im->n) {
			ri->err = -EINVAL;
			snprintf(ri->why, sizeof ri->why,
				 "image at %u: it has %u tokens (%u x %u), its request placed %u",
				 im->at, im->desc.tokens, im->desc.grid_h, im->desc.grid_w, im->n);
			return fail_ri(ri);
		}
		sel_input_tokens(&im->desc.identity, im->n, prompt + im->at);
	}
	ri->substituted = true;
	return 0;
}

int hel_inputs_ready(hel_inputs *in, hel_req_inputs *ri, uint64_t reused)
{
	if (!ri)
		return 0;
	if (ri->err)
		return fail_ri(ri);
	bool all = true, busy = false;
	for (uint32_t k = 0; k < ri->n; k++)
		busy |= ri->img[k].stage == IMG_PREPARING;
	for (uint32_t k = 0; k < ri->n; k++) {
		struct rimg *im = &ri->img[k];
		if ((uint64_t)im->at + im->n <= reused || im->stage == IMG_PACKED)
			continue; /* covered by the checkpoint, or ready */
		all = false;
		if (im->stage == IMG_DESCRIBED && !busy) {
			int rc = submit(in, im, HEL_PREP_PREPARE);
			if (rc < 0)
				return fail_ri(ri);
			busy = rc == 0;
		}
	}
	set_waiting(in, ri, !all);
	if (!all)
		return 1;
	/* Admitted: what the checkpoint covers is never prepared (design
	 * 2.13 "fully covered inputs still skip tensor preparation"). */
	for (uint32_t k = 0; k < ri->n; k++) {
		struct rimg *im = &ri->img[k];
		if (im->stage == IMG_PACKED || im->covered)
			continue;
		im->covered = true;
		in->st.images_covered++;
		if (!im->forgotten) {
			hel_prep_forget(in->prep, &im->source);
			im->forgotten = true;
		}
	}
	return 0;
}

uint64_t hel_inputs_floor(const hel_req_inputs *ri)
{
	uint64_t floor = 0;
	for (uint32_t k = 0; ri && k < ri->n; k++)
		if (ri->img[k].stage != IMG_PACKED)
			floor = (uint64_t)ri->img[k].at + ri->img[k].n;
	return floor;
}

void hel_inputs_release(hel_inputs *in, hel_req_inputs *ri)
{
	if (!ri)
		return;
	set_waiting(in, ri, false);
	for (uint32_t k = 0; k < ri->n; k++) {
		struct rimg *im = &ri->img[k];
		if (im->job)
			(void)hel_prep_cancel(in->prep, im->ticket);
		if (im->stage >= IMG_DESCRIBED && im->stage != IMG_PACKED && !im->forgotten) {
			hel_prep_forget(in->prep, &im->source);
			im->forgotten = true;
		}
	}
	if (!ri->jobs) {
		ri_free(ri);
		return;
	}
	ri->dead = true;
	ri->next_orphan = in->orphans;
	in->orphans = ri;
}

static void orphan_drop(hel_inputs *in, hel_req_inputs *ri)
{
	for (hel_req_inputs **p = &in->orphans; *p; p = &(*p)->next_orphan) {
		if (*p == ri) {
			*p = ri->next_orphan;
			ri_free(ri);
			return;
		}
	}
}

static void count_result(hel_inputs *in, const hel_prep_result *r)
{
	if (r->rc)
		return;
	bool tensors = r->kind == HEL_PREP_PREPARE;
	uint32_t tier = tensors ? r->tensor_tier : r->desc_tier;
	in->st.lookups++;
	if (tensors)
		in->st.tensor_lookups++;
	else
		in->st.desc_lookups++;
	if (tier == HEL_PREP_MEMORY || tier == HEL_PREP_SHARED)
		in->st.hits_memory++;
	else if (tier == HEL_PREP_DISK)
		in->st.hits_disk++;
	if (tier != HEL_PREP_BUILT) {
		if (tensors)
			in->st.tensor_hits++;
		else
			in->st.desc_hits++;
	} else if (tensors) {
		in->built_tensor++;
		in->built_tensor_ns += r->prepare_ns;
	} else {
		in->built_desc++;
		in->built_desc_ns += r->decode_ns;
	}
}

/* A polled result for a live request. */
static void take_result(hel_inputs *in, struct rimg *im, hel_prep_result *r)
{
	hel_req_inputs *ri = im->owner;
	if (r->rc) {
		ri->err = r->rc;
		snprintf(ri->why, sizeof ri->why, "image at %u: %s", im->at, r->why);
		in->st.images_failed++;
		return;
	}
	im->source = r->source;
	im->desc = r->desc;
	if (r->kind == HEL_PREP_DESCRIBE) {
		im->stage = IMG_DESCRIBED;
		return;
	}
	uint64_t lanes = (uint64_t)im->n * in->core->hidden;
	int n = -ENOMEM;
	if ((im->states = malloc(lanes * sizeof *im->states)))
		n = hel_model_image_states(in->model, sel_input_lease_rec(r->tensors), im->states);
	if (n < 0 || (uint32_t)n != im->n) {
		ri->err = n < 0 ? n : SEL_ECORRUPT;
		snprintf(ri->why, sizeof ri->why, "image at %u: its prepared record %s", im->at,
			 n < 0 ? "does not fit the core" : "has the wrong token count");
		free(im->states);
		im->states = NULL;
		return;
	}
	im->stage = IMG_PACKED;
	im->forgotten = true; /* a PREPARE consumes the cold source */
	if (im->covered)
		in->st.images_reprepared++; /* a replay or failed restore landed before it */
}

int hel_inputs_service(hel_inputs *in)
{
	if (!in)
		return 0;
	hel_prep_result res[8];
	int total = 0, n;
	while ((n = hel_prep_poll(in->prep, res, 8)) > 0) {
		for (int i = 0; i < n; i++) {
			struct rimg *im = (struct rimg *)(uintptr_t)res[i].tag;
			hel_req_inputs *ri = im->owner;
			im->job = false;
			ri->jobs--;
			count_result(in, &res[i]);
			if (!ri->dead)
				take_result(in, im, &res[i]);
			hel_prep_done(in->prep, &res[i]);
			if (ri->dead && !ri->jobs)
				orphan_drop(in, ri);
		}
		total += n;
	}
	return total;
}

int hel_inputs_prefill(const hel_req_inputs *ri, hel_model *m, uint32_t slot, const uint32_t *pages,
		       uint32_t page_tokens, const hel_token *tokens, uint64_t begin, uint64_t end,
		       int32_t *logits)
{
	uint64_t pos = begin;
	while (pos < end) {
		const struct rimg *im = NULL;
		uint64_t stop = end;
		for (uint32_t k = 0; ri && k < ri->n; k++) {
			const struct rimg *c = &ri->img[k];
			if (c->at <= pos && pos < (uint64_t)c->at + c->n) {
				im = c;
				stop = (uint64_t)c->at + c->n < end ? (uint64_t)c->at + c->n : end;
				break;
			}
			if (c->at > pos && c->at < stop)
				stop = c->at;
		}
		uint32_t np = (uint32_t)(stop / page_tokens);
		int32_t *lg = stop == end ? logits : NULL;
		int rc;
		if (im) {
			if (!im->states)
				return eos_fail(
					-EINVAL,
					"prefill: the image at %u is not prepared (a replay "
					"past the checkpoint that covered it)",
					im->at);
			size_t lanes = (size_t)(pos - im->at) * ri->hidden;
			rc = hel_model_prefill_image(m, slot, pages, np, im->states + lanes,
						     stop - pos, lg);
		} else {
			rc = hel_model_prefill(m, slot, pages, np, tokens + (pos - begin),
					       stop - pos, lg);
		}
		if (rc)
			return rc;
		pos = stop;
	}
	return 0;
}

void hel_inputs_stats(hel_inputs *in, hel_engine_input_stats *out)
{
	memset(out, 0, sizeof *out);
	if (!in)
		return;
	*out = in->st;
	hel_prep_stats ps;
	hel_prep_stats_get(in->prep, &ps);
	out->decodes = ps.decodes;
	out->preparations = ps.preparations;
	out->decode_ns = ps.decode_ns;
	out->prepare_ns = ps.prepare_ns;
	struct sel_input_cache_stats cs;
	sel_input_cache_stats(in->cache, &cs);
	out->bytes_memory = cs.bytes;
	out->memory_budget = in->budget;
	if (in->disk) {
		struct sel_input_disk_stats ds;
		sel_input_disk_stats(in->disk, &ds);
		out->bytes_disk = ds.bytes;
		out->records_disk = ds.records;
		out->disk_invalid = ds.invalid;
	}
	uint64_t saved = 0;
	if (in->built_desc)
		saved += in->st.desc_hits * (in->built_desc_ns / in->built_desc);
	if (in->built_tensor)
		saved += in->st.tensor_hits * (in->built_tensor_ns / in->built_tensor);
	out->saved_ns = saved;
}
