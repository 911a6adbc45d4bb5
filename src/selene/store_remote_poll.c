/*
 * store_remote_poll.c - the remote level's completions (issue 16 part B):
 * the inner store's events (held until the level's copy-out of the same
 * checkpoint landed), the level's transfers, the remote client's events.
 * See store_remote_int.h.  Worker thread only; nothing here waits.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "eos.h"
#include "store_remote_int.h"

#define BATCH 32

static struct rs_job *job_of(uint64_t user) { return (struct rs_job *)(uintptr_t)user; }

/* A landed copy-out whose record committed locally (or that has no local
 * tier) goes to Redis; anything else ends here. */
static void out_finish(struct remote_store *rs, struct rs_job *j, bool committed)
{
	if (j->x.status != 0 || !committed) {
		rs_job_end(rs, j);
		return;
	}
	struct sel_remote_put p = {.d = j->d,
				   .has_row = true,
				   .pages = j->pagev,
				   .row = j->iov,
				   .row_n = j->n_iov,
				   .user = (uint64_t)(uintptr_t)j};
	uint64_t id;
	int rc = sel_remote_put(rs->r, &p, &id);
	if (rc) {
		if (rc != -EAGAIN) /* -EAGAIN is counted by the client */
			rs->skipped++;
		rs_job_end(rs, j);
		return;
	}
	j->remote = true;
}

/* The ranks' copies were the same and the transfer packed them in place
 * (design 2.5): the record goes to Redis packed, one share for all ranks.
 * The tail slots the packing freed stay with the job until its end. */
static void out_packed(struct remote_store *rs, struct rs_job *j, const struct sel_xfer_job *x)
{
	uint32_t flags = (x->pages_replicated ? SEL_RECORD_PAGES_REPLICATED : 0) |
			 (x->row_replicated ? SEL_RECORD_ROW_REPLICATED : 0);
	if (rs_job_map(rs, j, flags) == 0)
		j->d.flags = flags;
	else
		j->x.status = -EINVAL; /* no addresses for it: the write is skipped */
}

static void inner_event(struct remote_store *rs, const sel_event *ev)
{
	if (ev->type == SEL_EV_STORED || ev->type == SEL_EV_STORE_FAILED) {
		for (struct rs_job *j = rs->jobs; j; j = j->next) {
			if (j->kind != RS_OUT || !j->inner || j->have_held || j->remote ||
			    j->checkpoint != ev->checkpoint)
				continue;
			if (!j->copied) { /* the GPU pin must outlive our copy too */
				j->held = *ev;
				j->have_held = true;
				return;
			}
			out_finish(rs, j, ev->type == SEL_EV_STORED);
			break;
		}
	}
	sel_evq_push(&rs->evq, ev);
}

static void fetch_failed(struct remote_store *rs, struct rs_job *j, int error)
{
	sel_event ev = {.type = SEL_EV_FETCH_FAILED,
			.error = error ? error : -EIO,
			.ticket = j->ticket,
			.key = j->key,
			.tier = SEL_TIER_REMOTE,
			.duration_ns = eos_now_ns() - j->t0};
	sel_evq_push(&rs->evq, &ev);
	rs->fetch_failures++;
	rs->inflight_in--;
	rs_job_end(rs, j);
}

static void xfer_done(struct remote_store *rs, struct sel_xfer_job *x)
{
	struct rs_job *j = job_of(x->id);
	j->copying = false;
	if (j->kind == RS_IN) {
		if (x->status) {
			fetch_failed(rs, j, x->status);
			return;
		}
		sel_event ev = {.type = SEL_EV_FETCHED,
				.ticket = j->ticket,
				.key = j->key,
				.tier = SEL_TIER_REMOTE,
				.bytes = j->bytes,
				.duration_ns = eos_now_ns() - j->t0};
		sel_evq_push(&rs->evq, &ev);
		for (uint32_t i = 0; i < j->n_chain; i++)
			rs_known_add(rs, &j->chain[i]);
		rs->inflight_in--;
		rs_job_end(rs, j);
		return;
	}
	j->copied = true;
	if (!x->status && (x->pages_replicated || x->row_replicated))
		out_packed(rs, j, x);
	if (!j->inner) { /* the level is the store: its own event */
		sel_event ev = {.type = x->status ? SEL_EV_STORE_FAILED : SEL_EV_STORED,
				.outcome = x->status ? SEL_SKIPPED : SEL_QUEUED,
				.error = x->status,
				.checkpoint = j->checkpoint,
				.key = j->d.key,
				.tier = SEL_TIER_REMOTE,
				.bytes = x->bytes,
				.duration_ns = x->done_ns - x->submit_ns};
		sel_evq_push(&rs->evq, &ev);
		out_finish(rs, j, true);
	} else if (j->have_held) {
		sel_event held = j->held;
		out_finish(rs, j, held.type == SEL_EV_STORED);
		sel_evq_push(&rs->evq, &held);
	}
}

static void claim_done(struct remote_store *rs, const struct sel_remote_event *ev)
{
	struct rs_job *j = job_of(ev->user);
	j->remote = false;
	if (ev->result != SEL_REMOTE_CLAIMED) {
		fetch_failed(rs, j, ev->error);
		return;
	}
	int rc = sel_xfer_submit(rs->xfer, &j->x);
	if (rc == -EAGAIN)
		j->queued = true;
	else if (rc)
		fetch_failed(rs, j, rc);
	else
		j->copying = true;
}

static void lookup_done(struct remote_store *rs, const struct sel_remote_event *ev)
{
	uint32_t slot = (uint32_t)(ev->user & 0xffffffffu);
	struct rs_look *l = slot < RS_LOOKS ? &rs->look[slot] : NULL;
	if (!l || l->gen != (uint32_t)(ev->user >> 32) ||
	    (l->state != RS_PENDING && l->state != RS_LATE)) {
		sel_remote_hit_free(ev->hit);
		return;
	}
	l->answered = eos_now_ns();
	if (ev->result == SEL_REMOTE_HIT && ev->hit) {
		l->hit = ev->hit;
		l->state = RS_HIT;
	} else {
		sel_remote_hit_free(ev->hit);
		l->state = RS_MISS;
	}
}

static void remote_event(struct remote_store *rs, const struct sel_remote_event *ev)
{
	switch (ev->op) {
	case SEL_REMOTE_OP_PUT:
		if (ev->result == SEL_REMOTE_STORED || ev->result == SEL_REMOTE_PRESENT)
			rs_known_add(rs, &ev->key);
		rs_job_end(rs, job_of(ev->user));
		return;
	case SEL_REMOTE_OP_LOOKUP: lookup_done(rs, ev); return;
	case SEL_REMOTE_OP_CLAIM: claim_done(rs, ev); return;
	}
}

/* Copy-ins that found the transfer channel full, answers past their TTL. */
static void housekeeping(struct remote_store *rs)
{
	for (struct rs_job *j = rs->jobs, *nx; j; j = nx) {
		nx = j->next;
		if (!j->queued)
			continue;
		int rc = sel_xfer_submit(rs->xfer, &j->x);
		if (rc == -EAGAIN)
			continue;
		j->queued = false;
		if (rc)
			fetch_failed(rs, j, rc);
		else
			j->copying = true;
	}
	uint64_t now = eos_now_ns();
	for (int i = 0; i < RS_LOOKS; i++) {
		struct rs_look *l = &rs->look[i];
		if ((l->state == RS_HIT || l->state == RS_MISS) &&
		    now - l->answered > RS_ANSWER_TTL_NS) {
			sel_remote_hit_free(l->hit);
			l->hit = NULL;
			l->state = RS_FREE;
			l->gen++;
		}
	}
}

bool rs_service(struct remote_store *rs)
{
	bool any = false;
	uint64_t v;
	if (rs->tfd >= 0 && read(rs->tfd, &v, sizeof v) == (ssize_t)sizeof v) {
		rs->armed = 0; /* fired: rs_arm sets the next one */
		any = true;
	}
	int n;
	if (rs->inner && !rs->inner_closed) {
		sel_event ev[BATCH];
		while ((n = sel_store_poll(rs->inner, ev, BATCH)) > 0) {
			for (int i = 0; i < n; i++)
				inner_event(rs, &ev[i]);
			any = true;
			if (n < BATCH)
				break;
		}
	}
	if (rs->xfer) {
		struct sel_xfer_job *done[BATCH];
		while ((n = sel_xfer_poll(rs->xfer, done, BATCH)) > 0) {
			for (int i = 0; i < n; i++)
				xfer_done(rs, done[i]);
			any = true;
			if (n < BATCH)
				break;
		}
	}
	struct sel_remote_event rev[BATCH];
	while ((n = sel_remote_poll(rs->r, rev, BATCH)) > 0) {
		for (int i = 0; i < n; i++)
			remote_event(rs, &rev[i]);
		any = true;
		if (n < BATCH)
			break;
	}
	housekeeping(rs);
	rs_arm(rs);
	return any;
}

int rs_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct remote_store *rs = (struct remote_store *)s;
	(void)rs_service(rs);
	size_t n = sel_evq_take(&rs->evq, ev, cap);
	bool queued_in = false;
	for (const struct rs_job *j = rs->jobs; j; j = j->next)
		queued_in |= j->queued;
	sel_evq_rearm(&rs->evq, queued_in);
	return (int)n;
}
