/*
 * engine_overlap.c - overlapped restores (issue 18, "Overlapped restore"):
 * the head of a host hit recomputed on the model stream while its tail's
 * pages and the endpoint row load from the host tier (docs/architecture.md
 * records how this departs from the design).
 *
 * DESIGN
 *
 * A host hit at c over a GPU checkpoint at a is, for the scheduler, an
 * ordinary inbound ticket: its pages are the chain's pages [a / P, c / P)
 * and its row the endpoint's, its waiters wait in INBOUND, and
 * finish_inbound publishes the restored checkpoint.  Overlap changes who
 * writes those ids: the store fetches only the tail, the hit looked up
 * again with resident = at (every store restores "the chain's pages past
 * resident", so a tail fetch needs nothing new from any tier), into the
 * ticket's pages past the head and its row; the worker computes the head
 * [a, at) itself into the ticket's first pages, one prefill chunk per loop
 * iteration between model steps, in the live row of the request that made
 * the ticket (its live row is unused while it waits in INBOUND: the
 * restore's RESTORE entry overwrites it with the ticket's row afterwards).
 * The ticket pins its GPU ancestor, whose row starts the head and whose
 * chain is the head's page table below a / P.  The worker never waits:
 * the tail loads on the store's threads while the head computes, and the
 * ticket finishes in whichever of the two events comes last.
 *
 * Checks.  Every head page the recompute completes is hashed
 * (sel_page_digest) when its chunk ends and compared with the stored
 * page's digest.  A store holding the pages in memory gives those at
 * admission (sel_store_page_digests); one that would need I/O for them (a
 * record on disk) delivers them with the tail's fetch instead
 * (sel_inbound.sums: the disk thread copies them from the checksum
 * segment it reads anyway for the tail), so the pages computed before the
 * tail's event are compared when it comes, the rest as they complete, and
 * always before the ticket finishes: no token of the request is released
 * unchecked, and the worker does no I/O for the check.  A store that can
 * do neither refuses the tail's fetch and the hit is restored whole
 * (engine.c start_fetch).  A difference means a
 * broken engine or a broken record: the head stops, the mismatch is
 * counted, the ticket finishes with SEL_ECORRUPT once the tail has landed
 * (its ids are quiescent only then), the record is dropped, and the
 * worker's failed-restore path requeues the waiters without host lookup,
 * so they recompute everything above their GPU checkpoint.
 *
 * Ownership.  The ticket's ids stay the scheduler's; the head writes only
 * the ticket's head pages and its request's live row, both handed out
 * FREE, and only synchronously on the worker, so nothing is in flight
 * when finish_inbound frees the ids of a failed ticket.  A head whose
 * request left (cancelled, or requeued by a store stop) stops at once and
 * its ticket fails with -ECANCELED when the tail's event comes, so later
 * waiters recompute.
 *
 * INVARIANTS
 *   1. One head per overlapped ticket, registered before its tail's fetch
 *      and removed exactly when the ticket is finished through env->finish
 *      (or cancelled, or cleared when the store stops).
 *   2. pos in [a, at]; pages [a / P, pos / P) of the head were computed;
 *      each matched its stored digest once those are here (at admission,
 *      or with_fetch once loaded; before that got holds their digests),
 *      unless the head ended with SEL_ECORRUPT.
 *   3. with_fetch: want is written by the store until the tail's event or
 *      the store's destroy, so it is freed only after the event (finish),
 *      or with the module (late) when the store stopped first.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "helios/cache.h"
#include "helios/engine_overlap.h"

struct head {
	uint64_t ticket;
	sel_key key;
	hel_req_id sid;
	uint32_t live_row;
	uint32_t anc_row;        /* the GPU ancestor's row, or HEL_NONE: start empty */
	uint32_t *table;         /* ancestor chain, then the ticket's head pages */
	uint32_t first, n_pages; /* the first head page's index in table; head pages */
	uint64_t a, at, pos;
	uint64_t *want;  /* stored digests (with_fetch: valid once loaded) */
	uint64_t *got;   /* with_fetch: the computed pages' digests */
	bool with_fetch; /* want arrives with the tail's fetch */
	bool started, done, loaded;
	int head_status, load_status;
};

struct hel_overlap {
	struct head *h;
	size_t n, cap;
	/* Digest buffers of heads forgotten while their fetch may still
	 * write them (sel_inbound.sums: until the event or the store's
	 * destroy): freed with the module, after the store. */
	uint64_t **late;
	size_t n_late, cap_late;
};

int hel_ovl_create(hel_overlap **out)
{
	*out = calloc(1, sizeof **out);
	return *out ? 0 : eos_fail(-ENOMEM, "engine: out of memory for overlapped restores");
}

static void head_free(struct head *h)
{
	free(h->table);
	free(h->want);
	free(h->got);
}

void hel_ovl_clear(hel_overlap *o)
{
	for (size_t i = 0; o && i < o->n; i++) {
		struct head *h = &o->h[i];
		/* A stopped store may still run the fetch that writes want. */
		if (h->with_fetch && !h->loaded &&
		    eos_grow((void **)&o->late, &o->cap_late, o->n_late + 1, sizeof *o->late) ==
			    0) {
			o->late[o->n_late++] = h->want;
			h->want = NULL;
		}
		head_free(h);
	}
	if (o)
		o->n = 0;
}

void hel_ovl_destroy(hel_overlap *o)
{
	hel_ovl_clear(o);
	for (size_t i = 0; o && i < o->n_late; i++)
		free(o->late[i]);
	if (o) {
		free(o->late);
		free(o->h);
	}
	free(o);
}

uint32_t hel_ovl_count(const hel_overlap *o) { return o ? (uint32_t)o->n : 0; }

void hel_ovl_prep_free(hel_ovl_prep *p)
{
	free(p->want);
	memset(p, 0, sizeof *p);
}

static uint64_t page_bytes(const sel_geometry *g, uint64_t *row)
{
	uint64_t pb = 0;
	*row = 0;
	for (uint32_t r = 0; r < g->ranks; r++) {
		pb += g->rank[r].page_bytes;
		*row += g->rank[r].row.unit_bytes;
	}
	return pb;
}

int hel_ovl_prepare(const hel_ovl_env *env, const sel_hit *hit, const sel_history *h, uint64_t a,
		    hel_ovl_prep *p)
{
	memset(p, 0, sizeof *p);
	if (env->mode == HEL_OVERLAP_OFF || env->fetch == HEL_FETCH_NEVER ||
	    (env->fetch == HEL_FETCH_ALWAYS && env->mode != HEL_OVERLAP_ALWAYS) || !env->store)
		return 0;
	uint64_t P = env->page_tokens, c = hit->key.consumed, rb;
	uint64_t pb = page_bytes(env->geo, &rb);
	bool worth = sel_policy_split(env->policy, hit->tier, pb, rb, env->page_tokens, a, c,
				      &p->split) ||
		     env->split_worth;
	if (!p->split.at || (!worth && env->mode != HEL_OVERLAP_ALWAYS))
		return 0;
	if (env->mode == HEL_OVERLAP_ALWAYS) { /* the middle page boundary: tests */
		uint64_t lo = a / P + 1, hi = c / P;
		p->split.at = (lo + (hi - lo) / 2) * P;
	}
	uint64_t at = p->split.at;
	p->head_pages = (uint32_t)(at / P - a / P);
	if (p->head_pages == 0 || p->head_pages > hit->pages)
		goto no;
	if (!(p->want = malloc(p->head_pages * sizeof *p->want)))
		goto no;
	int rc = sel_store_page_digests(env->store, hit, 0, p->head_pages, p->want);
	if (rc == -ENOTSUP)
		p->with_fetch = true; /* this tier cannot say without I/O: ask its fetch */
	else if (rc)
		goto no;
	if (sel_store_lookup(env->store, h, at, c, &p->tail) != 1 ||
	    !sel_key_eq(&p->tail.key, &hit->key) || p->tail.pages != hit->pages - p->head_pages)
		goto no;
	return 1;
no:
	hel_ovl_prep_free(p);
	return 0;
}

static struct head *find(hel_overlap *o, uint64_t ticket);

sel_inbound hel_ovl_tail(hel_overlap *o, const hel_ovl_prep *p, const sel_inbound *in)
{
	sel_inbound t = *in;
	t.pages = in->pages + p->head_pages;
	t.n_pages = in->n_pages - p->head_pages;
	struct head *h = find(o, in->ticket);
	if (h && h->with_fetch) {
		t.sums = h->want;
		t.n_sums = h->n_pages;
	}
	return t;
}

int hel_ovl_start(hel_overlap *o, const hel_ovl_env *env, hel_ovl_prep *p, const sel_key *key,
		  const sel_inbound *in, uint64_t gpu, hel_req_id sid, uint64_t a)
{
	hel_cache *cache = hel_scheduler_cache(env->sched);
	const hel_ckpt *k = gpu != HEL_CKPT_NONE ? hel_cache_get(cache, gpu) : NULL;
	hel_request_info inf;
	if ((gpu != HEL_CKPT_NONE && (!k || !hel_ckpt_has_row(k))) ||
	    hel_scheduler_request_info(env->sched, sid, &inf))
		return eos_fail(-ESTALE, "overlap: the GPU ancestor or the request is gone");
	uint32_t first = (uint32_t)(a / env->page_tokens);
	if (eos_grow((void **)&o->h, &o->cap, o->n + 1, sizeof *o->h))
		return eos_fail(-ENOMEM, "overlap: out of memory");
	struct head *h = &o->h[o->n];
	memset(h, 0, sizeof *h);
	if (!(h->table = malloc(((size_t)first + p->head_pages) * sizeof *h->table)) ||
	    (p->with_fetch && !(h->got = malloc(p->head_pages * sizeof *h->got)))) {
		free(h->table);
		return eos_fail(-ENOMEM, "overlap: out of memory");
	}
	if (k && hel_cache_chain(cache, k, h->table, first) != (int)first) {
		free(h->table);
		free(h->got);
		return eos_fail(-ESTALE, "overlap: the GPU ancestor's chain is not %u pages",
				first);
	}
	memcpy(h->table + first, in->pages, p->head_pages * sizeof *h->table);
	h->ticket = in->ticket;
	h->key = *key;
	h->sid = sid;
	h->live_row = inf.live_row;
	h->anc_row = k ? k->row : HEL_NONE;
	h->first = first;
	h->n_pages = p->head_pages;
	h->a = h->pos = a;
	h->at = p->split.at;
	h->want = p->want;
	h->with_fetch = p->with_fetch;
	p->want = NULL;
	o->n++;
	env->ws->overlap_restores++;
	return 0;
}

static struct head *find(hel_overlap *o, uint64_t ticket)
{
	for (size_t i = 0; i < o->n; i++)
		if (o->h[i].ticket == ticket)
			return &o->h[i];
	return NULL;
}

static void forget(hel_overlap *o, struct head *h)
{
	size_t i = (size_t)(h - o->h);
	head_free(h);
	o->n--;
	if (i != o->n)
		o->h[i] = o->h[o->n];
	memset(&o->h[o->n], 0, sizeof *o->h);
}

void hel_ovl_cancel(hel_overlap *o, uint64_t ticket)
{
	struct head *h = find(o, ticket);
	if (h)
		forget(o, h);
}

void hel_ovl_unstart(hel_overlap *o, const hel_ovl_env *env, uint64_t ticket)
{
	struct head *h = find(o, ticket);
	if (!h)
		return;
	forget(o, h);
	env->ws->overlap_restores--;
}

/* Both halves are over: finish the ticket (invariant 1). */
static void finish(hel_overlap *o, const hel_ovl_env *env, struct head *h)
{
	int status = h->load_status ? h->load_status : h->head_status;
	sel_key key = h->key;
	if (status == SEL_ECORRUPT)
		(void)sel_store_drop(env->store, &key); /* -EBUSY: another restore reads it */
	else if (status == 0)
		env->ws->overlap_done++;
	forget(o, h);
	env->finish(env->ctx, &key, status);
}

/* Head page i's digest in the form its stored one takes: a record file's
 * page checksum (zero padded) when the fetch delivers them, else the
 * planes' bytes unpadded (the memory store's). */
static int page_digest(const hel_ovl_env *env, const struct head *h, uint32_t i, uint64_t *d)
{
	uint32_t page = h->table[h->first + i];
	return h->with_fetch ? sel_page_digest_padded(env->geo, page, d)
			     : sel_page_digest(env->geo, page, d);
}

/* Compare head pages [from, to) (indexes in the head) with their stored
 * digests; d: their computed digests, or NULL to compute them now. */
static int compare(const hel_ovl_env *env, struct head *h, uint32_t from, uint32_t to,
		   const uint64_t *d)
{
	for (uint32_t i = from; i < to; i++) {
		uint64_t got = d ? d[i] : 0;
		if (!d && page_digest(env, h, i, &got))
			return -EIO;
		if (got != h->want[i]) {
			env->ws->overlap_mismatches++;
			return eos_fail(
				SEL_ECORRUPT,
				"overlap: page %llu of the restore at %llu differs from its "
				"recompute",
				(unsigned long long)(h->first + i),
				(unsigned long long)h->key.consumed);
		}
	}
	return 0;
}

/* The head pages completed by the chunk that ended at h->pos: compared
 * now, or (their stored digests not here yet) hashed for the comparison
 * when the tail's event brings them. */
static int check_pages(const hel_ovl_env *env, struct head *h, uint64_t from)
{
	uint64_t P = env->page_tokens;
	uint32_t a = (uint32_t)(from / P - h->first), b = (uint32_t)(h->pos / P - h->first);
	if (!h->with_fetch || h->loaded)
		return compare(env, h, a, b, NULL);
	for (uint32_t i = a; i < b; i++)
		if (page_digest(env, h, i, &h->got[i]))
			return -EIO;
	return 0;
}

/* One prefill chunk of h: 0, or the error that ends the head. */
static int chunk(const hel_ovl_env *env, struct head *h)
{
	hel_request_info inf;
	if (hel_scheduler_request_info(env->sched, h->sid, &inf) ||
	    inf.phase != HEL_PHASE_INBOUND || inf.ticket != h->ticket)
		return -ECANCELED; /* its request left: nobody owns the row for it */
	int rc = 0;
	if (!h->started)
		rc = h->anc_row != HEL_NONE
			     ? hel_model_row_copy(env->model, h->anc_row, h->live_row)
			     : hel_model_row_init(env->model, h->live_row);
	h->started = true;
	uint64_t from = h->pos, end = from + env->chunk_tokens;
	if (end > h->at)
		end = h->at;
	uint64_t t0 = eos_now_ns();
	if (rc == 0)
		rc = hel_model_prefill(env->model, h->live_row, h->table,
				       (uint32_t)(end / env->page_tokens), inf.tokens + from,
				       (uint32_t)(end - from), NULL);
	if (rc)
		return rc;
	sel_policy_observe_prefill(env->policy, from, end, eos_now_ns() - t0);
	env->ws->overlap_head_tokens += end - from;
	h->pos = end;
	return check_pages(env, h, from);
}

int hel_ovl_run(hel_overlap *o, const hel_ovl_env *env)
{
	int work = 0;
	for (size_t i = 0; i < o->n;) {
		struct head *h = &o->h[i];
		if (h->done) {
			i++;
			continue;
		}
		int rc = chunk(env, h);
		work++;
		if (rc || h->pos == h->at) {
			h->done = true;
			h->head_status = rc;
		}
		if (h->done && h->loaded) {
			finish(o, env, h); /* moves the last head into slot i */
			continue;
		}
		i++;
	}
	return work;
}

bool hel_ovl_loaded(hel_overlap *o, const hel_ovl_env *env, uint64_t ticket, int status)
{
	struct head *h = find(o, ticket);
	if (!h)
		return false;
	h->loaded = true;
	h->load_status = status;
	/* The stored digests came with the tail: the pages computed so far
	 * are compared now, the head's later ones as they complete. */
	if (status == 0 && h->with_fetch && !h->head_status) {
		uint32_t done = (uint32_t)(h->pos / env->page_tokens - h->first);
		int rc = compare(env, h, 0, done, h->got);
		if (rc) {
			h->done = true;
			h->head_status = rc;
		}
	}
	if (status || h->done) /* a failed load ends the head too: nothing waits on it */
		finish(o, env, h);
	return true;
}
