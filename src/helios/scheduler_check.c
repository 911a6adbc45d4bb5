/*
 * scheduler_check.c - the scheduler's checker: every invariant of
 * scheduler.c's header verified over the requests, the tickets, the steps
 * in flight and the checkpoints, after hel_cache_check (SEL_DEBUG_CHECKS
 * builds run it whenever a public call that changes the scheduler
 * returns; tests call it directly).
 *
 * DESIGN
 *   One function per invariant group, each failing with -EUCLEAN naming
 *   the first violation; per-checkpoint reference counts are kept in a map
 *   for invariant 4.
 *
 * INVARIANTS: those of scheduler.c, numbered as there.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "helios/scheduler_int.h"

/* ---- check ---------------------------------------------------------------------------------- */

#undef FAIL
#define FAIL(...) return eos_fail(-EUCLEAN, "scheduler check: " __VA_ARGS__)

/* Per-checkpoint reference counts for invariant 4, kept in a map. */
struct refs {
	hel_map m;
	uint64_t *ids;
	uint32_t *cnt;
	size_t n, cap;
};

static int refs_add(struct refs *f, uint64_t id)
{
	uint64_t h = hel_mix64(id);
	for (size_t p = hel_map_first(&f->m, h); p != HEL_MAP_END; p = hel_map_next(&f->m, h, p))
		if (f->ids[f->m.v[p]] == id) {
			f->cnt[f->m.v[p]]++;
			return 0;
		}
	size_t cap = f->cap;
	if (eos_grow((void **)&f->ids, &cap, f->n + 1, sizeof(*f->ids)) ||
	    eos_grow((void **)&f->cnt, &f->cap, f->n + 1, sizeof(*f->cnt)) ||
	    hel_map_add(&f->m, h, (uint32_t)f->n))
		return -ENOMEM;
	f->ids[f->n] = id;
	f->cnt[f->n++] = 1;
	return 0;
}

static uint32_t refs_get(const struct refs *f, uint64_t id)
{
	uint64_t h = hel_mix64(id);
	for (size_t p = hel_map_first(&f->m, h); p != HEL_MAP_END; p = hel_map_next(&f->m, h, p))
		if (f->ids[f->m.v[p]] == id)
			return f->cnt[f->m.v[p]];
	return 0;
}

/* What the checks below share: ids seen as owned, the chain buffer, the
 * references to checkpoints, and the totals compared at the end. */
struct check {
	hel_cache_counts k;
	uint8_t *pseen, *rseen;
	uint32_t *chain;
	struct refs refs;
	uint32_t out_pages, out_rows;
	uint64_t res_p, waiting_on_tickets, held;
};

/* Invariant 6: fences and the steps in flight. */
static int check_steps(const hel_scheduler *s, const struct check *x)
{
	if (s->completed > s->submitted || s->completed != x->k.completed ||
	    s->submitted != x->k.submitted)
		FAIL("fences %llu/%llu, cache says %llu/%llu", (unsigned long long)s->completed,
		     (unsigned long long)s->submitted, (unsigned long long)x->k.completed,
		     (unsigned long long)x->k.submitted);
	if (s->submitted - s->completed != s->n_steps ||
	    (s->n_steps && s->steps[s->step_head].fence != s->completed + 1))
		FAIL("%u steps in flight for fences %llu..%llu", s->n_steps,
		     (unsigned long long)s->completed, (unsigned long long)s->submitted);
	if (s->active.n > s->cfg.max_active)
		FAIL("%u active requests, max %u", s->active.n, s->cfg.max_active);
	return 0;
}

/* Invariant 2 for an INBOUND request. */
static int check_inbound(const struct req *r, struct check *x)
{
	unsigned long long id = (unsigned long long)r->id;
	if (r->prefix != HEL_CKPT_NONE || r->n_table || r->consumed != r->reused || r->inflight)
		FAIL("inbound request %llu has a prefix, pages or a step", id);
	if (r->ticket) {
		uint32_t seen = 0;
		for (uint32_t i = 0; i < r->ticket->n_waiters; i++)
			seen += r->ticket->waiters[i] == r->id;
		if (seen != 1 || r->ticket->key.consumed != r->consumed)
			FAIL("inbound request %llu is %u times on its ticket", id, seen);
		x->waiting_on_tickets++;
	} else if (!r->inbound_failed) {
		FAIL("inbound request %llu has no ticket", id);
	}
	return 0;
}

/* Invariants 2, 3 and 7 for a request with a prefix and pages. */
static int check_table(const hel_scheduler *s, const struct req *r, struct check *x)
{
	unsigned long long id = (unsigned long long)r->id;
	if (r->ticket)
		FAIL("request %llu in phase %s keeps a ticket", id, hel_phase_name(r->phase));
	uint64_t pc = 0;
	if (r->prefix != HEL_CKPT_NONE) {
		const hel_ckpt *p = hel_cache_get(s->c, r->prefix);
		if (!p || !hel_ckpt_has_row(p))
			FAIL("request %llu prefix %llu is gone", id, (unsigned long long)r->prefix);
		pc = p->key.consumed;
		int nc = hel_cache_chain(s->c, p, x->chain, x->k.pages_total + 1);
		if (nc < 0 || (uint32_t)nc != r->n_prefix ||
		    memcmp(x->chain, r->table, r->n_prefix * sizeof(uint32_t)))
			FAIL("request %llu shares pages that are not its prefix chain", id);
		if (refs_add(&x->refs, r->prefix))
			FAIL("out of memory");
	} else if (r->n_prefix) {
		FAIL("request %llu shares %u pages without a prefix", id, r->n_prefix);
	}
	if (r->consumed < pc || r->n_table != r->consumed / s->P)
		FAIL("request %llu holds %u pages at %llu tokens (prefix %llu)", id, r->n_table,
		     (unsigned long long)r->consumed, (unsigned long long)pc);
	for (uint32_t i = r->n_prefix; i < r->n_table; i++) {
		uint32_t pg = r->table[i];
		if (pg >= x->k.pages_total || hel_cache_page_state(s->c, pg) != HEL_ID_OUT ||
		    x->pseen[pg]++)
			FAIL("request %llu own page %u is not its own", id, pg);
		x->out_pages++;
	}
	uint64_t len = sel_history_len(&r->h);
	if (r->phase == HEL_PHASE_RESTORE && (r->prefix == HEL_CKPT_NONE || r->consumed != pc))
		FAIL("restoring request %llu at %llu, prefix at %llu", id,
		     (unsigned long long)r->consumed, (unsigned long long)pc);
	if (!r->inflight && r->phase == HEL_PHASE_PREFILL && r->consumed >= len)
		FAIL("prefilling request %llu has nothing left", id);
	if (!r->inflight && r->phase == HEL_PHASE_DECODE && (!r->n_gen || r->consumed + 1 != len))
		FAIL("decoding request %llu at %llu of %llu", id, (unsigned long long)r->consumed,
		     (unsigned long long)len);
	if (r->deferred_msg != HEL_CKPT_NONE && r->deferred_msg != r->prefix)
		FAIL("request %llu waits to offer %llu, not its prefix", id,
		     (unsigned long long)r->deferred_msg);
	return 0;
}

/* Invariants 1-3 and 5 for one request of list l (1: waiting). */
static int check_request(const hel_scheduler *s, const struct req *r, int l, struct check *x)
{
	unsigned long long id = (unsigned long long)r->id;
	x->res_p += r->res_pages;
	if (sel_history_len(&r->h) != r->n_tok || r->n_tok != r->prompt_len + r->n_gen)
		FAIL("request %llu history %llu tokens, mirror %llu, prompt %llu + %u", id,
		     (unsigned long long)sel_history_len(&r->h), (unsigned long long)r->n_tok,
		     (unsigned long long)r->prompt_len, r->n_gen);
	if (l) {
		if (r->phase != HEL_PHASE_WAITING || r->live_row != HEL_NONE ||
		    r->prefix != HEL_CKPT_NONE || r->n_table || r->res_pages || r->ticket ||
		    r->inflight)
			FAIL("waiting request %llu holds something (phase %s)", id,
			     hel_phase_name(r->phase));
		x->held += r->held;
		return 0;
	}
	if (r->phase < HEL_PHASE_INBOUND || r->phase > HEL_PHASE_DECODE)
		FAIL("active request %llu in phase %s", id, hel_phase_name(r->phase));
	if (r->live_row >= x->k.rows_total ||
	    hel_cache_row_state(s->c, r->live_row) != HEL_ID_OUT || x->rseen[r->live_row]++)
		FAIL("request %llu live row %u is not its own", id, r->live_row);
	x->out_rows++;
	if (r->inflight && (r->inflight <= s->completed || r->inflight > s->submitted))
		FAIL("request %llu in flight on fence %llu", id, (unsigned long long)r->inflight);
	return r->phase == HEL_PHASE_INBOUND ? check_inbound(r, x) : check_table(s, r, x);
}

/* Both request lists, the request table and the reservation totals. */
static int check_requests(const hel_scheduler *s, struct check *x)
{
	uint32_t nreq = 0;
	int rc;
	for (int l = 0; l < 2; l++) {
		const struct rlist *list = l ? &s->waiting : &s->active;
		uint32_t cnt = 0;
		const struct req *prev = NULL;
		for (const struct req *r = list->head; r; prev = r, r = r->next) {
			if (++cnt > list->n || r->prev != prev || find_req(s, r->id) != r)
				FAIL("request list %d broken at request %llu", l,
				     (unsigned long long)r->id);
			if ((rc = check_request(s, r, l, x)))
				return rc;
		}
		if (cnt != list->n || list->tail != prev)
			FAIL("request list %d counts %u, holds %u", l, list->n, cnt);
		nreq += cnt;
	}
	uint32_t nslots = 0;
	for (uint32_t i = 0; i < s->reqs.cap; i++)
		nslots += s->reqs.p[i] != NULL;
	if (nslots != nreq || s->req_map.n != nreq)
		FAIL("%u requests in lists, %u in the table, %zu in the map", nreq, nslots,
		     s->req_map.n);
	if (x->res_p != s->res_pages)
		FAIL("page reservations sum to %llu, the total is %llu",
		     (unsigned long long)x->res_p, (unsigned long long)s->res_pages);
	return 0;
}

/* Invariants 3, 4 and 8 for the tickets, then the ids handed out. */
static int check_tickets(const hel_scheduler *s, struct check *x)
{
	uint32_t ntk = 0;
	for (uint32_t i = 0; i < s->tickets.cap; i++) {
		const struct ticket *t = s->tickets.p[i];
		if (!t)
			continue;
		ntk++;
		unsigned long long id = (unsigned long long)t->id;
		if (find_ticket(s, &t->key) != t || t->slot != i)
			FAIL("ticket %llu is not found by its key", id);
		uint64_t ac = 0;
		if (t->ancestor != HEL_CKPT_NONE) {
			const hel_ckpt *a = hel_cache_get(s->c, t->ancestor);
			if (!a || !hel_ckpt_has_row(a))
				FAIL("ticket %llu ancestor %llu is gone", id,
				     (unsigned long long)t->ancestor);
			ac = a->key.consumed;
			if (refs_add(&x->refs, t->ancestor))
				FAIL("out of memory");
		}
		if (t->n_pages != t->key.consumed / s->P - ac / s->P)
			FAIL("ticket %llu holds %u pages for %llu over %llu", id, t->n_pages,
			     (unsigned long long)t->key.consumed, (unsigned long long)ac);
		for (uint32_t j = 0; j < t->n_pages; j++) {
			uint32_t pg = t->pages[j];
			if (pg >= x->k.pages_total ||
			    hel_cache_page_state(s->c, pg) != HEL_ID_OUT || x->pseen[pg]++)
				FAIL("ticket %llu page %u is not its own", id, pg);
			x->out_pages++;
		}
		if (t->row >= x->k.rows_total || hel_cache_row_state(s->c, t->row) != HEL_ID_OUT ||
		    x->rseen[t->row]++)
			FAIL("ticket %llu row %u is not its own", id, t->row);
		x->out_rows++;
		for (uint32_t j = 0; j < t->n_waiters; j++) {
			const struct req *r = find_req(s, t->waiters[j]);
			if (!r || r->phase != HEL_PHASE_INBOUND || r->ticket != t)
				FAIL("ticket %llu waiter %llu does not wait on it", id,
				     (unsigned long long)t->waiters[j]);
		}
	}
	if (ntk != s->n_tickets || s->ticket_map.n != ntk)
		FAIL("%u tickets, counted %u, map %zu", ntk, s->n_tickets, s->ticket_map.n);
	if (x->out_pages != x->k.pages_out || x->out_rows != x->k.rows_out)
		FAIL("requests and tickets own %u pages and %u rows, the cache handed out %u and %u",
		     x->out_pages, x->out_rows, x->k.pages_out, x->k.rows_out);
	if (x->waiting_on_tickets != s->st.inbound_waiting)
		FAIL("%llu requests wait on tickets, stats say %llu",
		     (unsigned long long)x->waiting_on_tickets,
		     (unsigned long long)s->st.inbound_waiting);
	if (x->held != s->n_held)
		FAIL("%llu waiting requests are held, the count says %u",
		     (unsigned long long)x->held, s->n_held);
	return 0;
}

/* Invariants 4 and 7 for every checkpoint. */
static int check_checkpoints(hel_scheduler *s, const struct check *x)
{
	hel_map qset = {0};
	int rc = 0;
	for (size_t i = 0; i < s->nq && !rc; i++)
		if (hel_map_add(&qset, hel_mix64(s->queue[i]), 0))
			rc = eos_fail(-ENOMEM, "scheduler check: out of memory");
	size_t cur = 0;
	for (const hel_ckpt *c; !rc && (c = hel_cache_iter(s->c, &cur));) {
		unsigned long long id = (unsigned long long)c->id;
		uint32_t want = refs_get(&x->refs, c->id) + c->xpins;
		if (c->pins != want)
			rc = eos_fail(-EUCLEAN,
				      "scheduler check: checkpoint %llu has %u pins, "
				      "references account for %u",
				      id, c->pins, want);
		else if ((c->flags & HEL_CK_DEFERRED) && (c->flags & HEL_CK_OFFERED))
			rc = eos_fail(-EUCLEAN,
				      "scheduler check: checkpoint %llu is both deferred "
				      "and offered",
				      id);
		else if ((c->flags & HEL_CK_QUEUED) &&
			 hel_map_first(&qset, hel_mix64(c->id)) == HEL_MAP_END)
			rc = eos_fail(-EUCLEAN,
				      "scheduler check: checkpoint %llu is flagged queued "
				      "but not in the queue",
				      id);
	}
	hel_map_free(&qset);
	return rc;
}

int hel_scheduler_check(hel_scheduler *s)
{
	int rc = hel_cache_check(s->c);
	if (rc)
		return rc;
	struct check x = {0};
	hel_cache_counts_get(s->c, &x.k);
	x.pseen = calloc(x.k.pages_total, 1);
	x.rseen = calloc(x.k.rows_total, 1);
	x.chain = malloc((x.k.pages_total + 1) * sizeof(uint32_t));
	if (!x.pseen || !x.rseen || !x.chain)
		rc = eos_fail(-ENOMEM, "scheduler check: out of memory");
	if (!rc)
		rc = check_steps(s, &x);
	if (!rc)
		rc = check_requests(s, &x);
	if (!rc)
		rc = check_tickets(s, &x);
	if (!rc)
		rc = check_checkpoints(s, &x);
	free(x.pseen);
	free(x.rseen);
	free(x.chain);
	hel_map_free(&x.refs.m);
	free(x.refs.ids);
	free(x.refs.cnt);
	return rc;
}
