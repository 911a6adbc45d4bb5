/*
 * prepare.c - the bounded preparation worker (design 2.13, "Bounded CPU
 * work"; docs/inputs.md "The preparation worker").  See prepare.h for the
 * contract.
 *
 * DESIGN
 *   One thread runs jobs in two steps.  The description step hashes the
 *   encoded bytes into the source key and finds the source description in
 *   memory, on disk, or by decoding (probe, decode, convert, describe); the
 *   tensor step finds the prepared record in memory, on disk, or by
 *   preparing it from the consumed image.  Each lookup goes through the
 *   input cache, whose pending entries make concurrent lookups of one key
 *   -- from this worker or any other thread -- share one preparation and
 *   one disk read; what a step builds or reads is published there and
 *   written to disk.
 *   The queue is FIFO, but a PREPARE job whose tensors would be a second
 *   image tensor result waits after its description step while later jobs
 *   run: the slot is free again when the consumer calls hel_prep_done for
 *   the result holding it (packing).  A job whose tensors are the held
 *   ones shares them (one more lease) instead of waiting.
 *   The cold allowance is charged before a decode for the worst case the
 *   header allows (width x height x (4 + the core's channels) bytes: the
 *   decoded image and its consumed copy), then trued up to the buffers'
 *   capacities; cold sources kept for a later PREPARE are dropped, oldest
 *   first, to make that room.  The sum never exceeds max_pixels x 8.
 *   The caller's threads touch only the queues and counters under the
 *   mutex; the worker drops the mutex for hashing, decoding, preparing and
 *   disk I/O, so submit, poll and done never wait for them.
 *
 * INVARIANTS
 *   1. tensors_held = (a tensor is being materialized) + (a delivered
 *      tensor is not yet done) <= 1, counting shared results once.
 *   2. cold_bytes <= cold_limit at all times; cold_bytes = the charges of
 *      the cold list plus the charge of the decode in progress.
 *   3. Every job is on exactly one list: the queue (queued, described,
 *      running) or the results; queued = the queue's length <= queue_max.
 */
#include "prepare.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"
#include "list.h"
#include "vision.h"

#define WAIT_SLICE_NS (100ull * 1000000) /* waits on another owner, in slices */

enum jstate {
	J_QUEUED,
	J_DESCRIBED,
	J_RUNNING
};

struct job {
	struct job *prev, *next;
	hel_prep_job j;
	uint64_t ticket;
	int state;
	bool cancelled;
	bool has_consumed;
	hel_image consumed; /* decoded by this job, charged to the cold allowance */
	uint32_t src_color; /* the decoded source's hel_image_color */
	uint64_t charge;
	hel_prep_result r;
};

struct jlist {
	struct job *head, *tail;
	uint32_t n;
};
EOS_DLIST_DEFINE(jl, struct jlist, struct job)

struct cold {
	struct cold *next;
	sel_input_key source;
	hel_image img;
	uint64_t charge;
	uint32_t color; /* the decoded source's (sel_input_source.color) */
};

struct hel_prep {
	hel_prep_opts o;
	const hel_core *core;
	char settings[HEL_VISION_SETTINGS_MAX];
	sel_input_cache *cache;
	bool own_cache;
	pthread_t th;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int efd;
	bool stop;
	struct jlist queue, results;
	uint64_t next_ticket;
	sel_input_lease *held; /* the one tensor result alive */
	uint32_t held_refs;    /* results referencing it */
	bool building;         /* the worker materializes a tensor now */
	struct cold *cold;     /* retained cold sources, oldest first */
	hel_prep_stats st;
};

const char *hel_prep_tier_name(uint32_t t)
{
	switch (t) {
	case HEL_PREP_BUILT: return "built";
	case HEL_PREP_MEMORY: return "memory";
	case HEL_PREP_DISK: return "disk";
	case HEL_PREP_SHARED: return "shared";
	}
	return "?";
}

static void update_held(hel_prep *w)
{
	w->st.tensors_held = (w->held || w->building) ? 1 : 0;
	if (w->st.tensors_held > w->st.tensors_held_max)
		w->st.tensors_held_max = w->st.tensors_held;
}

/* ---- Cold allowance (under the lock) ------------------------------------------ */

/* Charge need bytes, dropping retained cold sources oldest first; their
 * images go on *drop for the caller to free unlocked.  Whether it fits. */
static bool cold_charge(hel_prep *w, uint64_t need, struct cold **drop)
{
	while (w->st.cold_bytes + need > w->st.cold_limit && w->cold) {
		struct cold *c = w->cold;
		w->cold = c->next;
		w->st.cold_bytes -= c->charge;
		w->st.cold_sources--;
		c->next = *drop;
		*drop = c;
	}
	if (w->st.cold_bytes + need > w->st.cold_limit)
		return false;
	w->st.cold_bytes += need;
	if (w->st.cold_bytes > w->st.cold_peak)
		w->st.cold_peak = w->st.cold_bytes;
	return true;
}

static void cold_free(struct cold *c)
{
	for (struct cold *n; c; c = n) {
		n = c->next;
		hel_image_free(&c->img);
		free(c);
	}
}

/* Take the cold source of key src (one use), or NULL. */
static struct cold *cold_take(hel_prep *w, const sel_input_key *src)
{
	for (struct cold **p = &w->cold; *p; p = &(*p)->next)
		if (sel_input_key_eq(&(*p)->source, src)) {
			struct cold *c = *p;
			*p = c->next;
			c->next = NULL;
			w->st.cold_sources--;
			return c;
		}
	return NULL;
}

/* The job's consumed image from its retained cold source (one use, its
 * charge moving to the job): whether there was one. */
static bool use_cold(hel_prep *w, struct job *j)
{
	pthread_mutex_lock(&w->mu);
	struct cold *c = cold_take(w, &j->r.source);
	pthread_mutex_unlock(&w->mu);
	if (!c)
		return false;
	j->consumed = c->img;
	j->charge = c->charge;
	j->src_color = c->color;
	j->has_consumed = true;
	free(c);
	return true;
}

static void uncharge(hel_prep *w, uint64_t bytes)
{
	pthread_mutex_lock(&w->mu);
	w->st.cold_bytes -= bytes;
	pthread_mutex_unlock(&w->mu);
}

/* ---- Steps (worker thread, unlocked) --------------------------------------------- */

static int fail_job(struct job *j, int rc)
{
	j->r.rc = rc < 0 ? rc : -EIO;
	snprintf(j->r.why, sizeof j->r.why, "%s", eos_errmsg());
	return j->r.rc;
}

/* Decode the job's image into its consumed representation, charged. */
static int decode(hel_prep *w, struct job *j)
{
	uint32_t iw, ih;
	int rc = hel_image_probe(j->j.bytes, j->j.len, &w->o.limits, NULL, &iw, &ih);
	if (rc)
		return rc;
	uint64_t need = (uint64_t)iw * ih * (4 + w->core->image.channels);
	struct cold *drop = NULL;
	pthread_mutex_lock(&w->mu);
	bool ok = cold_charge(w, need, &drop);
	pthread_mutex_unlock(&w->mu);
	cold_free(drop);
	if (!ok)
		return eos_fail(SEL_EOVERSIZE,
				"image: %u x %u needs %" PRIu64 " bytes of the cold "
				"decoded-source allowance of %" PRIu64,
				iw, ih, need, w->st.cold_limit);
	uint64_t t0 = eos_now_ns();
	hel_image dec;
	rc = hel_image_decode(j->j.bytes, j->j.len, &w->o.limits, &dec);
	if (!rc) {
		j->src_color = dec.color;
		rc = hel_vision_convert(w->core, &dec, &j->consumed);
		hel_image_free(&dec);
	}
	j->r.decode_ns += eos_now_ns() - t0;
	pthread_mutex_lock(&w->mu);
	w->st.decodes++;
	w->st.decode_ns += eos_now_ns() - t0;
	pthread_mutex_unlock(&w->mu);
	if (rc) {
		uncharge(w, need);
		return rc;
	}
	/* True up: only the consumed copy stays. */
	uncharge(w, need - j->consumed.capacity);
	j->charge = j->consumed.capacity;
	j->has_consumed = true;
	return 0;
}

static void drop_consumed(hel_prep *w, struct job *j)
{
	if (!j->has_consumed)
		return;
	hel_image_free(&j->consumed);
	uncharge(w, j->charge);
	j->charge = 0;
	j->has_consumed = false;
}

/* Look (kind, key) up, waiting (in slices, so destroy is heard) when
 * another owner is preparing it.  A failed owner means try again: the
 * retry makes this caller the owner. */
static int lookup(hel_prep *w, uint32_t kind, const sel_input_key *key, sel_input_lease **l)
{
	for (int tries = 0;; tries++) {
		int rc = sel_input_cache_lookup(w->cache, kind, key, l);
		if (rc != SEL_INPUT_WAIT)
			return rc;
		for (;;) {
			rc = sel_input_cache_wait(w->cache, *l, WAIT_SLICE_NS);
			if (rc != -ETIMEDOUT)
				break;
			pthread_mutex_lock(&w->mu);
			bool stop = w->stop;
			pthread_mutex_unlock(&w->mu);
			if (stop) {
				sel_input_cache_release(w->cache, *l);
				*l = NULL;
				return eos_fail(-ECANCELED, "preparation: stopping");
			}
		}
		if (rc == 0)
			return SEL_INPUT_HIT;
		sel_input_cache_release(w->cache, *l);
		*l = NULL;
		if (tries == 2)
			return rc;
	}
}

static void disk_write(hel_prep *w, const sel_input_rec *r)
{
	if (!w->o.disk)
		return;
	int rc = sel_input_disk_write(w->o.disk, r);
	pthread_mutex_lock(&w->mu);
	if (rc == 0)
		w->st.disk_writes++;
	else
		w->st.disk_write_failures++;
	pthread_mutex_unlock(&w->mu);
}

static int describe(hel_prep *w, struct job *j)
{
	hel_image_format fmt;
	sel_input_lease *l;
	int rc;
	if ((rc = hel_image_detect(j->j.bytes, j->j.len, &fmt)))
		return rc;
	if (j->j.len > w->o.limits.max_encoded_bytes)
		return eos_fail(SEL_EOVERSIZE, "image: %zu encoded bytes (at most %" PRIu64 ")",
				j->j.len, w->o.limits.max_encoded_bytes);
	sel_input_source_key(hel_image_format_name(fmt), j->j.bytes, j->j.len, w->settings,
			     &j->r.source);
	if ((rc = lookup(w, SEL_INPUT_SOURCE, &j->r.source, &l)) < 0)
		return rc;
	if (rc == SEL_INPUT_HIT) {
		j->r.desc = sel_input_lease_rec(l)->h.src;
		j->r.desc_tier = HEL_PREP_MEMORY;
		sel_input_cache_release(w->cache, l);
		pthread_mutex_lock(&w->mu);
		w->st.desc_memory++;
		pthread_mutex_unlock(&w->mu);
		return 0;
	}
	/* The owner: the disk tier, else decode. */
	sel_input_rec rec;
	if (w->o.disk &&
	    sel_input_disk_read(w->o.disk, SEL_INPUT_SOURCE, &j->r.source, &rec) == 0) {
		j->r.desc = rec.h.src;
		j->r.desc_tier = HEL_PREP_DISK;
		pthread_mutex_lock(&w->mu);
		w->st.desc_disk++;
		pthread_mutex_unlock(&w->mu);
		sel_input_cache_publish(w->cache, l, &rec);
		sel_input_cache_release(w->cache, l);
		return 0;
	}
	/* Without retention the description is not kept: a PREPARE after a
	 * DESCRIBE of the same source describes again from its cold source
	 * instead of decoding twice. */
	bool cold = use_cold(w, j);
	if ((!cold && (rc = decode(w, j))) ||
	    (rc = hel_vision_describe(w->core, &j->consumed, &j->r.desc))) {
		int e = rc;
		sel_input_cache_fail(w->cache, l, e);
		return e;
	}
	j->r.desc.encoding = fmt;
	j->r.desc.color = j->src_color;
	j->r.desc_tier = HEL_PREP_BUILT;
	if ((rc = sel_input_source_init(&rec, &j->r.source, &j->r.desc, 0))) {
		sel_input_cache_fail(w->cache, l, rc);
		return rc;
	}
	disk_write(w, &rec);
	sel_input_cache_publish(w->cache, l, &rec);
	sel_input_cache_release(w->cache, l);
	return 0;
}

/* The tensor step; w->building is set (or the job shares the held lease
 * and never gets here). */
static int tensors(hel_prep *w, struct job *j)
{
	const sel_input_key *id = &j->r.desc.identity;
	sel_input_lease *l;
	int rc;
	if ((rc = lookup(w, SEL_INPUT_PREPARED, id, &l)) < 0)
		return rc;
	if (rc == SEL_INPUT_HIT) {
		j->r.tensors = l;
		j->r.tensor_tier = HEL_PREP_MEMORY;
		pthread_mutex_lock(&w->mu);
		w->st.tensor_memory++;
		pthread_mutex_unlock(&w->mu);
		return 0;
	}
	sel_input_rec rec;
	if (w->o.disk && sel_input_disk_read(w->o.disk, SEL_INPUT_PREPARED, id, &rec) == 0) {
		/* The read checked kind and key; the identity covers the
		 * settings, so the shape fits unless the file lies well. */
		if (hel_vision_check(w->core, &rec, NULL) == 0) {
			if ((rc = sel_input_cache_publish(w->cache, l, &rec))) {
				sel_input_cache_release(w->cache, l);
				return rc;
			}
			j->r.tensors = l;
			j->r.tensor_tier = HEL_PREP_DISK;
			pthread_mutex_lock(&w->mu);
			w->st.tensor_disk++;
			pthread_mutex_unlock(&w->mu);
			return 0;
		}
		sel_input_rec_free(&rec); /* a miss: built again below */
		sel_input_disk_remove(w->o.disk, SEL_INPUT_PREPARED, id);
	}
	/* Build: from this job's decode, a cold source, or a fresh decode. */
	if (!j->has_consumed && !use_cold(w, j)) {
		if ((rc = decode(w, j))) {
			sel_input_cache_fail(w->cache, l, rc);
			return rc;
		}
	}
	uint64_t t0 = eos_now_ns();
	rc = hel_vision_prepare(w->core, &j->consumed, &j->r.desc, &rec);
	uint64_t dt = eos_now_ns() - t0;
	j->r.prepare_ns += dt;
	pthread_mutex_lock(&w->mu);
	w->st.preparations++;
	w->st.prepare_ns += dt;
	pthread_mutex_unlock(&w->mu);
	drop_consumed(w, j);
	if (rc) {
		sel_input_cache_fail(w->cache, l, rc);
		return rc;
	}
	disk_write(w, &rec);
	if ((rc = sel_input_cache_publish(w->cache, l, &rec))) {
		sel_input_cache_release(w->cache, l);
		return rc;
	}
	j->r.tensors = l;
	j->r.tensor_tier = HEL_PREP_BUILT;
	return 0;
}

/* ---- The worker ------------------------------------------------------------------ */

/* Finish j (under the lock): to the results, announced on the eventfd. */
static void deliver(hel_prep *w, struct job *j)
{
	if (j->has_consumed) {
		hel_image_free(&j->consumed);
		w->st.cold_bytes -= j->charge;
		j->charge = 0;
		j->has_consumed = false;
	}
	jl_del(&w->queue, j);
	w->st.queued = w->queue.n;
	if (j->cancelled && j->r.rc == 0) {
		j->r.rc = -ECANCELED;
		snprintf(j->r.why, sizeof j->r.why, "preparation cancelled");
	}
	if (j->r.rc == -ECANCELED)
		w->st.cancelled++;
	else if (j->r.rc)
		w->st.failed++;
	jl_push(&w->results, j);
	w->st.delivered++;
	(void)eventfd_write(w->efd, 1);
}

/* The held tensor's identity, if any. */
static bool is_held(const hel_prep *w, const sel_input_key *id)
{
	const sel_input_rec *r = w->held ? sel_input_lease_rec(w->held) : NULL;
	return r && sel_input_key_eq(&r->h.key, id);
}

/* The next job to run, or NULL.  Cancelled queued jobs are delivered on
 * the way. */
static struct job *pick(hel_prep *w)
{
	for (struct job *j = w->queue.head, *n; j; j = n) {
		n = j->next;
		if (j->state == J_RUNNING)
			continue;
		if (j->cancelled) {
			j->r.rc = -ECANCELED;
			snprintf(j->r.why, sizeof j->r.why, "preparation cancelled");
			deliver(w, j);
			continue;
		}
		if (j->state == J_QUEUED)
			return j;
		/* Described, wanting tensors: the slot, or the held ones. */
		if ((!w->held && !w->building) || is_held(w, &j->r.desc.identity))
			return j;
	}
	return NULL;
}

static void *worker(void *arg)
{
	hel_prep *w = arg;
	eos_thread_name("flare-prep");
	pthread_mutex_lock(&w->mu);
	for (;;) {
		struct job *j = NULL;
		while (!w->stop && !(j = pick(w)))
			pthread_cond_wait(&w->cv, &w->mu);
		if (w->stop)
			break;
		int step = j->state;
		j->state = J_RUNNING;
		if (step == J_QUEUED) {
			pthread_mutex_unlock(&w->mu);
			int rc = describe(w, j);
			if (rc)
				fail_job(j, rc);
			struct cold *c = j->has_consumed && !rc ? malloc(sizeof *c) : NULL;
			pthread_mutex_lock(&w->mu);
			if (c) {
				/* A cold source now: kept for this job's tensor step or a
				 * later PREPARE of the source, one use, and the first to
				 * go when a decode needs the room. */
				c->source = j->r.source;
				c->img = j->consumed;
				c->charge = j->charge;
				c->color = j->src_color;
				c->next = NULL;
				struct cold **p = &w->cold;
				while (*p)
					p = &(*p)->next;
				*p = c;
				w->st.cold_sources++;
				j->has_consumed = false;
				j->charge = 0;
			}
			if (rc || j->j.kind == HEL_PREP_DESCRIBE || j->cancelled)
				deliver(w, j);
			else
				j->state = J_DESCRIBED; /* next: tensors, when the slot allows */
			continue;
		}
		/* The tensor step. */
		if (is_held(w, &j->r.desc.identity)) {
			j->r.tensors = sel_input_cache_ref(w->cache, w->held);
			j->r.tensor_tier = HEL_PREP_SHARED;
			w->held_refs++;
			w->st.tensor_shared++;
			deliver(w, j);
			continue;
		}
		w->building = true;
		update_held(w);
		pthread_mutex_unlock(&w->mu);
		int rc = tensors(w, j);
		if (rc)
			fail_job(j, rc);
		drop_consumed(w, j);
		pthread_mutex_lock(&w->mu);
		w->building = false;
		if (j->r.tensors && (j->cancelled || w->stop)) {
			sel_input_lease *l = j->r.tensors;
			j->r.tensors = NULL;
			pthread_mutex_unlock(&w->mu);
			sel_input_cache_release(w->cache, l);
			pthread_mutex_lock(&w->mu);
		}
		if (j->r.tensors) {
			w->held = j->r.tensors;
			w->held_refs = 1;
		}
		update_held(w);
		deliver(w, j);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* ---- Calls ----------------------------------------------------------------------- */

int hel_prep_create(const hel_prep_opts *o, hel_prep **out)
{
	*out = NULL;
	if (!o || !o->core)
		return eos_fail(-EINVAL, "preparation: no core");
	hel_prep *w = calloc(1, sizeof *w);
	if (!w)
		return eos_fail(-ENOMEM, "preparation: out of memory");
	w->o = *o;
	w->core = o->core;
	w->efd = -1;
	int rc = hel_vision_settings(o->core, w->settings);
	if (rc)
		goto fail;
	if (!w->o.limits.max_pixels)
		w->o.limits = hel_image_limits_default();
	if (!w->o.queue_max)
		w->o.queue_max = 64;
	w->st.cold_limit = hel_image_cold_allowance(&w->o.limits);
	w->cache = o->cache;
	if (!w->cache) {
		if ((rc = sel_input_cache_create(0, &w->cache)))
			goto fail;
		w->own_cache = true;
	}
	if ((w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
		rc = eos_fail(-errno, "preparation: eventfd: %s", strerror(errno));
		goto fail;
	}
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	if ((rc = -pthread_create(&w->th, NULL, worker, w))) {
		eos_fail(rc, "preparation: cannot start its thread: %s", strerror(-rc));
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		goto fail;
	}
	w->started = true;
	*out = w;
	return 0;
fail:
	if (w->efd >= 0)
		close(w->efd);
	if (w->own_cache)
		sel_input_cache_destroy(w->cache);
	free(w);
	return rc;
}

static void release_result(hel_prep *w, hel_prep_result *r)
{
	if (!r->tensors)
		return;
	pthread_mutex_lock(&w->mu);
	if (r->tensors == w->held && --w->held_refs == 0) {
		w->held = NULL;
		update_held(w);
		pthread_cond_broadcast(&w->cv);
	}
	pthread_mutex_unlock(&w->mu);
	sel_input_cache_release(w->cache, r->tensors);
	r->tensors = NULL;
}

static void free_job(hel_prep *w, struct job *j)
{
	release_result(w, &j->r);
	drop_consumed(w, j);
	free(j);
}

void hel_prep_destroy(hel_prep *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->th, NULL);
	for (struct job *j; (j = w->queue.head);) {
		jl_del(&w->queue, j);
		free_job(w, j);
	}
	for (struct job *j; (j = w->results.head);) {
		jl_del(&w->results, j);
		free_job(w, j);
	}
	cold_free(w->cold);
	close(w->efd);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	if (w->own_cache)
		sel_input_cache_destroy(w->cache);
	free(w);
}

int hel_prep_submit(hel_prep *w, const hel_prep_job *job, uint64_t *ticket)
{
	if (!job || (job->kind != HEL_PREP_DESCRIBE && job->kind != HEL_PREP_PREPARE) ||
	    (!job->bytes && job->len))
		return eos_fail(-EINVAL,
				"preparation: a job needs a kind (describe or prepare) and "
				"its encoded bytes");
	struct job *j = calloc(1, sizeof *j);
	if (!j)
		return eos_fail(-ENOMEM, "preparation: out of memory");
	j->j = *job;
	pthread_mutex_lock(&w->mu);
	if (w->queue.n >= w->o.queue_max) {
		pthread_mutex_unlock(&w->mu);
		free(j);
		return eos_fail(-EAGAIN,
				"preparation: %u jobs queued (the bound); try again after "
				"polling",
				w->o.queue_max);
	}
	j->ticket = ++w->next_ticket;
	j->r.ticket = j->ticket;
	j->r.tag = job->tag;
	j->r.kind = job->kind;
	j->state = J_QUEUED;
	jl_push(&w->queue, j);
	w->st.submitted++;
	w->st.queued = w->queue.n;
	if (ticket)
		*ticket = j->ticket;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return 0;
}

int hel_prep_poll(hel_prep *w, hel_prep_result *out, uint32_t max)
{
	uint32_t n = 0;
	pthread_mutex_lock(&w->mu);
	while (n < max && w->results.head) {
		struct job *j = w->results.head;
		jl_del(&w->results, j);
		out[n++] = j->r; /* the result now owns the lease */
		free(j);
	}
	if (!w->results.head) {
		eventfd_t v;
		(void)eventfd_read(w->efd, &v);
	}
	pthread_mutex_unlock(&w->mu);
	return (int)n;
}

int hel_prep_wait_fd(const hel_prep *w) { return w->efd; }

void hel_prep_done(hel_prep *w, hel_prep_result *r) { release_result(w, r); }

int hel_prep_cancel(hel_prep *w, uint64_t ticket)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&w->mu);
	for (struct job *j = w->queue.head; j; j = j->next)
		if (j->ticket == ticket) {
			j->cancelled = true;
			rc = 0;
			pthread_cond_signal(&w->cv);
			break;
		}
	pthread_mutex_unlock(&w->mu);
	return rc;
}

void hel_prep_forget(hel_prep *w, const sel_input_key *source)
{
	pthread_mutex_lock(&w->mu);
	struct cold *c = cold_take(w, source);
	if (c)
		w->st.cold_bytes -= c->charge;
	pthread_mutex_unlock(&w->mu);
	cold_free(c);
}

void hel_prep_stats_get(hel_prep *w, hel_prep_stats *out)
{
	pthread_mutex_lock(&w->mu);
	*out = w->st;
	pthread_mutex_unlock(&w->mu);
}
