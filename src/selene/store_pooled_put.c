/*
 * store_pooled_put.c - the pooled store's puts: a copy into arena windows,
 * committed with its checksums -- of a checkpoint from the GPU ids the
 * worker pins (pool only: no local tier, or one the cascade cannot read
 * yet), or of a record the last local tier cascades (store_pooled_cascade.c)
 * from its host slots (store_pooled.h has the design and invariant 3).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "store_pooled.h"

#define SP_PUT_ASK_NS (12ull * 1000000000) /* a grant later than this finds no source */

/* ---- keys the pool holds ------------------------------------------------------------------------ */

bool sp_known_has(const struct sel_pooled *p, const sel_key *k)
{
	if (!k->consumed)
		return false;
	uint32_t n = p->n_known < SP_KNOWN ? p->n_known : SP_KNOWN;
	for (uint32_t i = 0; i < n; i++)
		if (sel_key_eq(&p->known[i], k))
			return true;
	return false;
}

void sp_known_add(struct sel_pooled *p, const sel_key *k)
{
	if (!sp_known_has(p, k))
		p->known[p->n_known++ % SP_KNOWN] = *k;
}

void sp_known_del(struct sel_pooled *p, const sel_key *k)
{
	uint32_t n = p->n_known < SP_KNOWN ? p->n_known : SP_KNOWN;
	for (uint32_t i = 0; i < n; i++)
		if (sel_key_eq(&p->known[i], k))
			memset(&p->known[i], 0, sizeof p->known[i]);
}

/* ---- the engine's side: its pin on the source ----------------------------------------------------- */

/* The GPU source is no longer read: the engine's event goes (ok: the copy
 * landed). */
static void source_free(struct sel_pooled *p, struct sp_put *u, bool ok)
{
	if (u->released)
		return;
	u->released = true;
	if (u->own_event) {
		sel_event ev = {.type = ok ? SEL_EV_STORED : SEL_EV_STORE_FAILED,
				.outcome = ok ? SEL_QUEUED : SEL_SKIPPED,
				.checkpoint = u->checkpoint,
				.key = u->key,
				.tier = SEL_TIER_POOL};
		(void)sp_emit(p, &ev);
	} else if (u->held) {
		(void)sp_emit(p, &u->ev);
		u->held = false;
	}
}

bool sp_put_hold(struct sel_pooled *p, const sel_event *ev)
{
	for (struct sp_put *u = p->puts; u; u = u->next)
		if (!u->cascade && !u->own_event && !u->released && !u->held &&
		    u->checkpoint == ev->checkpoint) {
			u->ev = *ev;
			u->held = true;
			return true;
		}
	return false;
}

/* u is over: the engine's event out, the lease (if any) released, u freed. */
static void put_finish(struct sel_pooled *p, struct sp_put *u, uint32_t release)
{
	source_free(p, u, false);
	if (u->cascade && !u->ended)
		sp_cascade_end(p, &u->key, false); /* kept local */
	if (u->lease)
		(void)sel_pool_release(p->pc, u->lease, release);
	for (struct sp_put **pp = &p->puts; *pp; pp = &(*pp)->next)
		if (*pp == u) {
			*pp = u->next;
			break;
		}
	free(u->hj.cksums);
	free(u->hj.src);
	free(u->hj.files);
	free(u->pages);
	free(u);
}

/* A cascade put the pool took (committed, or present already): the local
 * record may go. */
static void cascade_accepted(struct sel_pooled *p, struct sp_put *u)
{
	if (!u->cascade || u->ended)
		return;
	u->ended = true;
	sp_cascade_end(p, &u->key, true);
}

/* ---- asking ------------------------------------------------------------------------------------- */

static int put_ask(struct sel_pooled *p, struct sp_put *u)
{
	struct sel_pool_put_desc d = {.key = u->key, .bucket = u->bucket, .tail = u->n_pages};
	u->linked = !u->retried && !sel_key_is_none(&u->parent) && u->tail < u->n_pages &&
		    sp_known_has(p, &u->parent);
	if (u->linked) {
		d.parent = u->parent;
		d.tail = u->tail;
	}
	return sel_pool_put(p->pc, &d, &u->put);
}

/* Ask for u's windows (u filled from cp but for its source): on success
 * it is on the puts list; else freed with its pages (the caller keeps
 * what else it allocated). */
static int put_begin(struct sel_pooled *p, struct sp_put *u, const sel_published *cp)
{
	u->n_pages = cp->n_pages;
	u->tail = cp->tail;
	u->state_slot = cp->state_slot;
	u->key = cp->key;
	u->parent = cp->parent;
	u->bucket = cp->bucket;
	u->checkpoint = cp->checkpoint;
	u->t0 = eos_now_ns();
	int rc = put_ask(p, u);
	if (rc) {
		free(u->pages);
		free(u);
		return rc;
	}
	u->next = p->puts;
	p->puts = u;
	p->pc_st.puts++;
	return 0;
}

static int put_start(struct sel_pooled *p, const sel_published *cp, bool own)
{
	struct sp_put *u = calloc(1, sizeof *u);
	if (!u || !(u->pages = malloc(((size_t)cp->n_pages + 1) * sizeof *u->pages))) {
		free(u);
		return eos_fail(-ENOMEM, "pooled store: out of memory");
	}
	if (cp->n_pages)
		memcpy(u->pages, cp->pages, (size_t)cp->n_pages * sizeof *u->pages);
	u->own_event = own;
	return put_begin(p, u, cp);
}

int sp_put_cascade(struct sel_pooled *p, const sel_published *cp, const uint8_t **src,
		   struct sel_disk_file *files, uint32_t n_files)
{
	struct sp_put *u = calloc(1, sizeof *u);
	if (!u)
		return eos_fail(-ENOMEM, "pooled store: out of memory");
	u->cascade = true;
	u->hj.src_n = cp->n_pages;
	u->hj.src = src;
	u->hj.files = files;
	u->hj.n_files = n_files;
	return put_begin(p, u, cp);
}

sel_outcome sp_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	if (!cp) /* store.c passes what the caller gave */
		return eos_fail(-EINVAL, "pooled store: put of no checkpoint"), SEL_SKIPPED;
	bool pool = p->pc && !p->closed && sel_pool_state(p->pc) == SEL_POOL_ATTACHED &&
		    !sp_known_has(p, &cp->key);
	if (p->pc && !p->closed && !sp_held(p, cp->checkpoint))
		sp_announce(p, cp); /* the GPU holds it, whatever the outcome */
	if (p->w.inner) {
		sel_outcome o = sel_wrap_put(s, cp, why);
		if (o == SEL_QUEUED && pool && !p->casc) /* no cascade: write-through */
			(void)put_start(p, cp, false);   /* no room now: the local copy alone */
		return o;
	}
	if (!pool) {
		eos_fail(-ENOTCONN, "pooled store %s: %s", p->address,
			 p->pc ? "not attached now, or the pool has the record" : "not attached");
		return SEL_SKIPPED;
	}
	int rc = put_start(p, cp, true);
	if (rc == -EAGAIN || rc == -EBUSY) {
		*why = rc == -EAGAIN ? SEL_RETRY_QUEUE : SEL_RETRY_INFLIGHT;
		return SEL_RETRY;
	}
	return rc ? SEL_SKIPPED : SEL_QUEUED;
}

/* ---- the copy --------------------------------------------------------------------------------- */

static void put_submit(struct sel_pooled *p, struct sp_put *u)
{
	int rc = sel_xfer_submit(p->x, &u->job);
	if (rc == 0)
		u->st = SPP_COPY;
	else if (rc != -EAGAIN) {
		p->pc_st.puts_failed++;
		put_finish(p, u, SEL_POOL_COPY_FAILED);
	}
}

void sp_put_retry(struct sel_pooled *p)
{
	uint64_t now = eos_now_ns();
	for (struct sp_put *u = p->puts, *n; u; u = n) {
		n = u->next;
		if (u->st == SPP_SUBMIT)
			put_submit(p, u);
		else if (u->st == SPP_ASK && now - u->t0 > SP_PUT_ASK_NS && u->cascade)
			put_finish(p, u, SEL_POOL_OK); /* kept local; a later grant is released */
		else if (u->st == SPP_ASK && now - u->t0 > SP_PUT_ASK_NS)
			source_free(p, u, false); /* a later grant is released unused */
	}
}

static void put_granted(struct sel_pooled *p, struct sp_put *u, struct sel_pool_lease *l)
{
	u->lease = l;
	uint32_t want = u->linked ? u->tail : u->n_pages;
	if (u->released || l->n_pages != want || !l->n_row_slots ||
	    (u->cascade && l->n_row_slots != p->lay.row_slots)) {
		p->pc_st.puts_failed++;
		put_finish(p, u, SEL_POOL_COPY_FAILED);
		return;
	}
	if (u->cascade) { /* one helper job: copy from the local slots, checksum */
		if (!(u->hj.cksums = malloc(((size_t)l->n_pages + 1) * sizeof *u->hj.cksums))) {
			p->pc_st.puts_failed++;
			put_finish(p, u, SEL_POOL_COPY_FAILED);
			return;
		}
		u->hj.lease = l;
		u->hj.verify = false;
		u->hj.src_skip = u->n_pages - l->n_pages;
		u->st = SPP_SUM;
		p->pc_st.put_bytes += l->bytes;
		sp_helper_submit(p, &u->hj);
		return;
	}
	u->job = (struct sel_xfer_job){.id = u->checkpoint,
				       .dir = SEL_COPY_OUT,
				       .n_pages = l->n_pages,
				       .pages = u->pages + (u->n_pages - l->n_pages),
				       .page_slots = l->page_slots,
				       .row = true,
				       .state_slot = u->state_slot,
				       .row_slots = l->row_slots};
	u->st = SPP_SUBMIT;
	put_submit(p, u);
}

static void put_refused(struct sel_pooled *p, struct sp_put *u, uint32_t reason)
{
	if (reason == SEL_POOL_PRESENT) {
		sp_known_add(p, &u->key);
		p->pc_st.puts_accepted++;
		cascade_accepted(p, u);
		put_finish(p, u, SEL_POOL_OK);
		return;
	}
	if (reason == SEL_POOL_ORPHAN && u->linked && !u->retried && !u->released) {
		sp_known_del(p, &u->parent); /* evicted from the pool: put the whole chain */
		u->retried = true;
		if (put_ask(p, u) == 0)
			return;
	}
	p->pc_st.puts_refused++;
	put_finish(p, u, SEL_POOL_OK);
}

static void put_result(struct sel_pooled *p, struct sp_put *u, uint32_t reason)
{
	if (reason == SEL_POOL_OK) {
		sp_known_add(p, &u->key);
		p->pc_st.puts_accepted++;
		p->tier.held++;
		cascade_accepted(p, u);
	} else {
		p->pc_st.puts_failed++;
	}
	put_finish(p, u, SEL_POOL_OK);
}

bool sp_put_event(struct sel_pooled *p, const struct sel_pool_event *ev)
{
	bool by_lease = ev->type == SEL_POOL_EV_LEASE_FAILED;
	if (ev->type != SEL_POOL_EV_PUT_GRANTED && ev->type != SEL_POOL_EV_PUT_REFUSED &&
	    ev->type != SEL_POOL_EV_PUT_RESULT &&
	    !(by_lease && ev->lease && ev->lease->kind == SEL_POOL_PUT))
		return false;
	enum sp_pstate want = ev->type == SEL_POOL_EV_PUT_RESULT ? SPP_COMMIT : SPP_ASK;
	struct sp_put *u = p->puts;
	while (u && (by_lease ? u->lease != ev->lease : (u->st != want || u->put != ev->request)))
		u = u->next;
	if (!u) {
		if (ev->type == SEL_POOL_EV_PUT_GRANTED || by_lease)
			(void)sel_pool_release(p->pc, ev->lease, SEL_POOL_OK);
		return true;
	}
	switch (ev->type) {
	case SEL_POOL_EV_PUT_GRANTED: put_granted(p, u, ev->lease); break;
	case SEL_POOL_EV_PUT_REFUSED: put_refused(p, u, ev->reason); break;
	case SEL_POOL_EV_PUT_RESULT: put_result(p, u, ev->reason); break;
	default:
		if (u->st == SPP_SUBMIT) {
			p->pc_st.puts_failed++;
			put_finish(p, u, SEL_POOL_COPY_FAILED);
		} else {
			/* failed: end it when the copy or the checksums return */
			u->hj.status = -ECANCELED;
		}
		break;
	}
	return true;
}

bool sp_put_copied(struct sel_pooled *p, struct sel_xfer_job *j)
{
	struct sp_put *u = p->puts;
	while (u && &u->job != j)
		u = u->next;
	if (!u)
		return false;
	if (j->status || u->hj.status) {
		p->pc_st.puts_failed++;
		put_finish(p, u, SEL_POOL_COPY_FAILED);
		return true;
	}
	u->copied = true;
	p->pc_st.put_bytes += j->bytes;
	p->tier.bytes_out += j->bytes;
	source_free(p, u, true);
	if (!(u->hj.cksums = malloc(((size_t)u->lease->n_pages + 1) * sizeof *u->hj.cksums))) {
		p->pc_st.puts_failed++;
		put_finish(p, u, SEL_POOL_COPY_FAILED);
		return true;
	}
	u->hj.lease = u->lease;
	u->hj.verify = false;
	u->st = SPP_SUM;
	sp_helper_submit(p, &u->hj);
	return true;
}

bool sp_put_helped(struct sel_pooled *p, struct sp_hjob *j)
{
	struct sp_put *u = p->puts;
	while (u && &u->hj != j)
		u = u->next;
	if (!u)
		return false;
	if (u->hj.status || u->hj.rstatus) {
		p->pc_st.puts_failed++;
		put_finish(p, u, SEL_POOL_COPY_FAILED);
		return true;
	}
	struct sel_pool_lease *l = u->lease;
	u->lease = NULL; /* commit ends it, whatever it returns */
	if (sel_pool_commit(p->pc, l, j->cksums, j->row_cksum)) {
		(void)sel_pool_release(p->pc, l, SEL_POOL_COPY_FAILED);
		p->pc_st.puts_failed++;
		put_finish(p, u, SEL_POOL_OK);
		return true;
	}
	u->st = SPP_COMMIT;
	return true;
}
