/*
 * scheduler_publish.c - what the scheduler hands the store and the
 * worker: the publications of offered checkpoints, their descriptions and
 * the worker's pins, the export fit check, eviction notices and the stats
 * (design 2.2 for publication; 2.15 "Evictions" and "Headroom").
 * scheduler.h is the contract, scheduler.c has the rest of the design and
 * the offers that fill the queue, scheduler_int.h what the files share.
 *
 * DESIGN
 *   Publication.  A FIFO of checkpoint ids; flags in the cache node say
 *   OFFERED (counts as a parent for later publications, gets eviction
 *   notices), QUEUED, TAKEN, DEFERRED.  take_publications emits the ready
 *   ones, sorted by depth so parents precede children.
 *
 * INVARIANTS: those of scheduler.c, numbered as there (7 is the one the
 *   publication queue keeps).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "helios/scheduler_int.h"

/* ---- publications ----------------------------------------------------------------------- */

static void describe(const hel_scheduler *s, const hel_ckpt *k, uint32_t *pages, sel_published *p)
{
	const hel_ckpt *x = k->parent;
	while (x && !(x->flags & HEL_CK_OFFERED))
		x = x->parent;
	memset(p, 0, sizeof(*p));
	p->checkpoint = k->id;
	p->key = k->key;
	if (x)
		p->parent = x->key;
	p->bucket = k->bucket;
	p->n_pages = (uint32_t)hel_cache_chain(s->c, k, pages, hel_cache_chain_len(s->c, k));
	p->pages = pages;
	p->tail = p->n_pages - (x ? (uint32_t)(x->key.consumed / s->P) : 0);
	p->state_slot = k->row;
}

static int cmp_depth(const void *a, const void *b)
{
	const hel_ckpt *x = *(const hel_ckpt *const *)a, *y = *(const hel_ckpt *const *)b;
	if (x->key.consumed != y->key.consumed)
		return x->key.consumed < y->key.consumed ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

int hel_scheduler_take_publications(hel_scheduler *s, const sel_published **out, size_t *nout)
{
	CHECK_ON_RETURN(s);
	*out = NULL;
	*nout = 0;
	size_t n = 0, pages = 0;
	for (size_t i = 0; i < s->nq; i++) {
		const hel_ckpt *k = hel_cache_get(s->c, s->queue[i]);
		if (k && hel_ckpt_has_row(k) && (k->flags & HEL_CK_QUEUED) &&
		    hel_cache_ready(s->c, k)) {
			n++;
			pages += hel_cache_chain_len(s->c, k);
		}
	}
	if (eos_grow((void **)&s->pubs, &s->cap_pubs, n, sizeof(*s->pubs)) ||
	    eos_grow((void **)&s->pubk, &s->cap_pubk, n, sizeof(const hel_ckpt *)) ||
	    eos_grow((void **)&s->pub_pages, &s->cap_pub_pages, pages, sizeof(*s->pub_pages)))
		return eos_fail(-ENOMEM, "take_publications: out of memory");
	size_t m = 0, keep = 0;
	for (size_t i = 0; i < s->nq; i++) {
		uint64_t id = s->queue[i];
		const hel_ckpt *k = hel_cache_get(s->c, id);
		if (!k || !(k->flags & HEL_CK_QUEUED))
			continue; /* evicted, or a duplicate entry already handled */
		if (!hel_ckpt_has_row(k)) {
			hel_cache_set_flags(s->c, id, 0,
					    HEL_CK_QUEUED); /* compacted before its offer */
			continue;
		}
		if (!hel_cache_ready(s->c, k)) {
			s->queue[keep++] = id;
			continue;
		}
		s->pubk[m++] = k;
		hel_cache_set_flags(s->c, id, HEL_CK_TAKEN, HEL_CK_QUEUED);
	}
	s->nq = keep;
	if (m > 1)
		qsort(s->pubk, m, sizeof(const hel_ckpt *), cmp_depth);
	size_t off = 0;
	for (size_t i = 0; i < m; i++) {
		describe(s, s->pubk[i], s->pub_pages + off, &s->pubs[i]);
		off += s->pubs[i].n_pages;
	}
	s->st.published += m;
	*out = s->pubs;
	*nout = m;
	return 0;
}

int hel_scheduler_describe(hel_scheduler *s, uint64_t id, sel_published *out)
{
	const hel_ckpt *k = hel_cache_get(s->c, id);
	if (!k || !hel_ckpt_has_row(k) || !(k->flags & HEL_CK_OFFERED))
		return eos_fail(-ENOENT, "describe: checkpoint %llu left the GPU cache",
				(unsigned long long)id);
	if (eos_grow((void **)&s->desc_pages, &s->cap_desc, hel_cache_chain_len(s->c, k) + 1,
		     sizeof(*s->desc_pages)))
		return eos_fail(-ENOMEM, "describe: out of memory");
	describe(s, k, s->desc_pages, out);
	return 0;
}

int hel_scheduler_pin(hel_scheduler *s, uint64_t id)
{
	CHECK_ON_RETURN(s);
	return hel_cache_pin(s->c, id, true);
}
int hel_scheduler_unpin(hel_scheduler *s, uint64_t id)
{
	CHECK_ON_RETURN(s);
	return hel_cache_unpin(s->c, id, true);
}

/* The request readmit() would place next: the oldest waiting one not held
 * and whose GPU depth reaches its floor (readmit holds the others); its
 * GPU prefix in *A.  NULL for none. */
static struct req *next_parked(hel_scheduler *s, const hel_ckpt **A)
{
	for (struct req *r = s->waiting.head; r; r = r->next) {
		if (r->held)
			continue;
		*A = hel_cache_lookup(s->c, &r->h, sel_history_len(&r->h));
		if ((*A ? (*A)->key.consumed : 0) >= r->floor)
			return r;
	}
	return NULL;
}

/* The GPU prefix admission would find for a valid spec (as
 * plan_admission looks it up); -errno when no history can be built. */
static int spec_prefix(hel_scheduler *s, const hel_request_spec *spec, const hel_ckpt **A)
{
	sel_history h;
	*A = NULL;
	int rc = sel_history_init(&h, s->cfg.model_identity, spec->salt, spec->salt_len);
	if (rc == 0 && (rc = sel_history_append(&h, spec->prompt, spec->prompt_len)) == 0)
		*A = hel_cache_lookup(s->c, &h, spec->prompt_len);
	sel_history_free(&h);
	return rc;
}

bool hel_scheduler_export_fits(hel_scheduler *s, uint64_t id, const hel_request_spec *next,
			       bool next_host)
{
	uint64_t need_p = 0, need_r = 0, pins[2] = {id, HEL_CKPT_NONE};
	/* The next step of every running decode: a page when its token
	 * completes one (plan_decode); prefill pages are reserved. */
	uint64_t decode = 0;
	for (const struct req *r = s->active.head; r; r = r->next)
		decode += r->phase == HEL_PHASE_DECODE && (r->consumed + 1) % s->P == 0;
	/* The request admission would take next: a parked one first, as
	 * admit_planned refuses new ones while they wait. */
	const hel_ckpt *A = NULL;
	const struct req *w = next_parked(s, &A);
	if (w) {
		uint64_t a = A ? A->key.consumed : 0;
		admission_pages(s, sel_history_len(&w->h), a, 0, false, &need_p, &need_r);
	} else if (next && sch_validate_spec(s, next) == 0) { /* else admission fails it */
		if (spec_prefix(s, next, &A)) { /* unknown prefix: charged whole, with a ticket */
			admission_pages(s, next->prompt_len, 0, 0, true, &need_p, &need_r);
		} else {
			uint64_t a = A ? A->key.consumed : 0;
			admission_pages(s, next->prompt_len, a, 0, false, &need_p, &need_r);
			/* A host hit adds a new ticket's row (its pages are the same
			 * len/P - a/P); the store is not asked from here. */
			need_r += next_host && a < next->prompt_len;
		}
	}
	if (A)
		pins[1] = A->id; /* admission pins its GPU prefix */
	return sch_fits_pinned(s, need_p + decode, need_r, pins, 2);
}

size_t hel_scheduler_take_evictions(hel_scheduler *s, hel_notice *out, size_t cap, bool *lost)
{
	CHECK_ON_RETURN(s);
	return hel_cache_take_notices(s->c, out, cap, lost);
}

void hel_scheduler_stats_get(hel_scheduler *s, hel_scheduler_stats *out)
{
	s->st.tickets = s->n_tickets;
	s->st.active = s->active.n;
	s->st.waiting = s->waiting.n;
	*out = s->st;
}
