/*
 * scheduler.c - requests, two-step admission, inbound tickets, offers
 * with the deferral rules, eviction, preemption, cancellation and
 * shutdown for the reference engine (design 2.7 "Scheduler integration"
 * and implementation step 10; 2.2 for publication and deferral; 2.8 for
 * the worker's side; 2.12; 2.15 "Evictions" and "Headroom").
 * scheduler.h is the contract.  The scheduler's other files:
 * scheduler_step.c (chunked prefill with checkpoint captures, decode,
 * completion), scheduler_publish.c (publication, export fits, eviction
 * notices), scheduler_check.c (the checker); scheduler_int.h is what they
 * share.
 *
 * DESIGN
 *   Requests.  A request holds its token history (prompt, then generated
 *   tokens) twice: as a sel_history for keys and lookups and as a plain
 *   token array the steps point into.  It owns one live row and a page
 *   table whose first n_prefix entries are its prefix checkpoint's chain
 *   (shared, kept by the request's pin on that checkpoint) and whose rest
 *   are its own pages.  `consumed` counts the tokens its live row holds
 *   once every planned step has run: planning advances it, so a request in
 *   a step in flight already looks like it will after the step.  Sampled
 *   tokens arrive with complete_step.  Prefill always runs to the end of
 *   the history and samples there; a decode step is the one-token case.
 *   After a preemption the history includes the generated tokens, so
 *   re-admission resumes exactly where the request stopped.
 *
 *   Admission.  Reservation is counting, not popping: a request reserves
 *   the pages of its history past its prefix depth, and admission
 *   requires free + pending + reclaimable (with its GPU ancestor pinned)
 *   to cover every outstanding reservation and the rows it pops.  Only
 *   the live row and a new ticket's destinations are popped at admission.
 *   Capture points reserve no row: a capture takes its snapshot row when
 *   planned, from the free list or by eviction, waits for a fence when
 *   only a pending row would do, and is skipped when no row can be had
 *   (captures_failed; the request goes on with its prefix unchanged).  So
 *   rows held by copy-out pins cost a prompt its captures, never its
 *   admission (docs/architecture.md, lazy capture rows).  Decode pages are not reserved: when they run
 *   out the newest decoding request is preempted (its state becomes a
 *   checkpoint that eviction may take, it re-queues in WAITING), as is,
 *   failing that, the newest other prefilling request.
 *
 *   Allocation.  Ids come only from the cache's free lists.  sch_ensure()
 *   evicts until the free lists cover a need, but stops with -EAGAIN as
 *   soon as free + pending would (the request then waits for the fence),
 *   and with -ENOSPC when nothing is evictable.
 *
 *   Tickets.  One per inbound key, in a map by key.  Its pages, row and
 *   ancestor pin belong to the ticket, never to a request, so waiters can
 *   come and go (design 2.7).  The ticket keeps the bucket digest of its
 *   endpoint, which is all the restored checkpoint needs of the plan's
 *   history.
 *
 * INVARIANTS (hel_scheduler_check verifies each, after hel_cache_check)
 *   1. Every request in the active list is INBOUND, RESTORE, PREFILL or
 *      DECODE and owns one OUT live row; every request in the waiting list
 *      is WAITING and owns nothing (no row, prefix, pages, reservation or
 *      ticket).  At most max_active requests are active.
 *   2. An INBOUND request has no prefix and no pages and consumed ==
 *      reused; it is a waiter of its ticket exactly once, or its ticket
 *      failed.  Other active requests: table[0..n_prefix) is exactly the
 *      chain of their prefix checkpoint (which has a row), n_table ==
 *      consumed / P, and the rest of the table are OUT pages.  RESTORE:
 *      consumed == prefix depth.  Not in flight: PREFILL has tokens left
 *      to consume, DECODE has exactly the last sampled one.
 *   3. Every OUT page and OUT row belongs to exactly one request or ticket,
 *      and every request or ticket id is OUT.
 *   4. Each checkpoint's pins == requests with it as prefix + tickets with
 *      it as ancestor + worker pins.  A ticket's ancestor has a row and the
 *      ticket owns key.consumed/P - ancestor.consumed/P pages.
 *   5. The page reservation total equals the sum over requests.
 *   6. A request in flight names a fence in (completed, submitted]; the
 *      outstanding steps have consecutive fences ending at submitted.
 *   7. DEFERRED and OFFERED exclude each other; every QUEUED checkpoint is
 *      in the publication queue.  A request's pending deferred message is
 *      its prefix.
 *   8. inbound_waiting == the number of requests waiting on a ticket.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "helios/scheduler_int.h"

const char *hel_phase_name(hel_phase p)
{
	static const char *const names[] = {"waiting", "inbound",  "restore",  "prefill",
					    "decode",  "finished", "cancelled"};
	return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

/* ---- small containers ---------------------------------------------------------- */

static int ptab_reserve(struct ptab *t)
{
	if (t->nfree)
		return 0;
	uint32_t cap = t->cap ? t->cap * 2 : 16;
	void **p = realloc(t->p, cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	t->p = p;
	uint32_t *f = realloc(t->free, cap * sizeof(*f));
	if (!f)
		return -ENOMEM;
	t->free = f;
	for (uint32_t i = cap; i-- > t->cap;) {
		t->p[i] = NULL;
		t->free[t->nfree++] = i;
	}
	t->cap = cap;
	return 0;
}

static uint32_t ptab_put(struct ptab *t, void *x)
{
	uint32_t s = t->free[--t->nfree];
	t->p[s] = x;
	return s;
}

static void ptab_del(struct ptab *t, uint32_t s)
{
	t->p[s] = NULL;
	t->free[t->nfree++] = s;
}

static void ptab_free(struct ptab *t)
{
	free(t->p);
	free(t->free);
	memset(t, 0, sizeof(*t));
}

/* ---- create / destroy ---------------------------------------------------------- */

int hel_scheduler_create(const hel_scheduler_config *cfg, hel_scheduler **out)
{
	*out = NULL;
	hel_scheduler *s = calloc(1, sizeof(*s));
	if (!s)
		return eos_fail(-ENOMEM, "scheduler: out of memory");
	s->cfg = *cfg;
	if (!s->cfg.max_active)
		s->cfg.max_active = cfg->n_rows / 2 ? cfg->n_rows / 2 : 1;
	if (!s->cfg.chunk_tokens)
		s->cfg.chunk_tokens = 256;
	if (!s->cfg.step_tokens)
		s->cfg.step_tokens = 1024;
	if (!s->cfg.max_inflight)
		s->cfg.max_inflight = 2;
	s->P = cfg->page_tokens;
	hel_cache_config cc = {.page_tokens = cfg->page_tokens,
			       .n_pages = cfg->n_pages,
			       .n_rows = cfg->n_rows,
			       .notice_cap = cfg->notice_cap};
	int rc = hel_cache_create(&cc, &s->c);
	if (rc) {
		free(s);
		return rc;
	}
	uint32_t ma = s->cfg.max_active, mi = s->cfg.max_inflight;
	s->steps = calloc(mi, sizeof(*s->steps));
	s->scratch = calloc(ma, sizeof(struct req *));
	if (!s->steps || !s->scratch)
		goto nomem;
	for (uint32_t i = 0; i < mi; i++) {
		s->steps[i].e = calloc(ma, sizeof(hel_step_entry));
		s->steps[i].pg_off = calloc(ma, sizeof(size_t));
		s->steps[i].tk_off = calloc(ma, sizeof(size_t));
		if (!s->steps[i].e || !s->steps[i].pg_off || !s->steps[i].tk_off)
			goto nomem;
	}
	*out = s;
	return 0;
nomem:
	hel_scheduler_destroy(s);
	return eos_fail(-ENOMEM, "scheduler: out of memory");
}

static void req_free(struct req *r)
{
	if (!r)
		return;
	sel_history_free(&r->h);
	free(r->tok);
	free(r->caps);
	free(r->table);
	free(r);
}

static void ticket_free(struct ticket *t)
{
	if (!t)
		return;
	free(t->pages);
	free(t->waiters);
	free(t);
}

void hel_scheduler_destroy(hel_scheduler *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->reqs.cap; i++)
		req_free(s->reqs.p[i]);
	for (uint32_t i = 0; i < s->tickets.cap; i++)
		ticket_free(s->tickets.p[i]);
	ptab_free(&s->reqs);
	ptab_free(&s->tickets);
	hel_map_free(&s->req_map);
	hel_map_free(&s->ticket_map);
	if (s->steps)
		for (uint32_t i = 0; i < s->cfg.max_inflight; i++) {
			free(s->steps[i].e);
			free(s->steps[i].pg_off);
			free(s->steps[i].tk_off);
			free(s->steps[i].pg);
			free(s->steps[i].tk);
		}
	free(s->steps);
	free(s->scratch);
	free(s->queue);
	free(s->pubs);
	free(s->pubk);
	free(s->pub_pages);
	free(s->desc_pages);
	free(s->failed);
	hel_cache_destroy(s->c);
	free(s);
}

hel_cache *hel_scheduler_cache(hel_scheduler *s) { return s->c; }

/* ---- reservations, offers, eviction, allocation -------------------------------- */

static void res_set(hel_scheduler *s, struct req *r, uint32_t pages)
{
	s->res_pages = s->res_pages - r->res_pages + pages;
	r->res_pages = pages;
}

/* Queue id for take_publications (the caller sets the flags). */
static int queue_push(hel_scheduler *s, uint64_t id)
{
	if (eos_grow((void **)&s->queue, &s->capq, s->nq + 1, sizeof(*s->queue)))
		return -ENOMEM;
	s->queue[s->nq++] = id;
	return 0;
}

/* Offer id to the store (design 2.2).  Without memory for the queue the
 * checkpoint simply stays unoffered, as if deferred. */
void sch_offer(hel_scheduler *s, uint64_t id)
{
	const hel_ckpt *k = hel_cache_get(s->c, id);
	if (!k || !hel_ckpt_has_row(k) || (k->flags & HEL_CK_OFFERED))
		return;
	if (queue_push(s, id))
		return;
	hel_cache_set_flags(s->c, id, HEL_CK_OFFERED | HEL_CK_QUEUED, HEL_CK_DEFERRED);
	s->st.offered++;
}

/* A request resumes at exactly id: a deferred checkpoint is offered. */
static void resumed_at(hel_scheduler *s, uint64_t id)
{
	const hel_ckpt *k = hel_cache_get(s->c, id);
	if (k && (k->flags & HEL_CK_DEFERRED))
		sch_offer(s, id);
}

/* After compaction made heir take its parent's pages and offered it: the
 * nearest published descendants below it are offered again, so they name
 * heir as their parent. */
static void refresh_below(hel_scheduler *s, const hel_ckpt *heir)
{
	const hel_ckpt **stack = NULL;
	size_t n = 0, cap = 0;
	for (const hel_ckpt *ch = heir->first_child; ch; ch = ch->next_sibling) {
		if (eos_grow((void **)&stack, &cap, n + 1, sizeof(const hel_ckpt *)))
			goto out;
		stack[n++] = ch;
	}
	while (n) {
		const hel_ckpt *x = stack[--n];
		if (x->flags & HEL_CK_OFFERED) {
			if ((x->flags & HEL_CK_TAKEN) && !(x->flags & HEL_CK_QUEUED) &&
			    hel_ckpt_has_row(x) && !queue_push(s, x->id)) {
				hel_cache_set_flags(s->c, x->id, HEL_CK_QUEUED, 0);
				s->st.refreshed++;
			}
			continue;
		}
		for (const hel_ckpt *ch = x->first_child; ch; ch = ch->next_sibling) {
			if (eos_grow((void **)&stack, &cap, n + 1, sizeof(const hel_ckpt *)))
				goto out;
			stack[n++] = ch;
		}
	}
out:
	free(stack);
}

/* One cache eviction with the scheduler's rules; false if none possible. */
static bool evict_one(hel_scheduler *s)
{
	hel_eviction ev;
	int kind = hel_cache_evict(s->c, &ev);
	if (kind == HEL_EVICT_NONE)
		return false;
	if (kind == HEL_EVICT_LEAF) {
		s->st.evictions++;
		return true;
	}
	s->st.compactions++;
	const hel_ckpt *heir = hel_cache_get(s->c, ev.heir);
	if (heir && (heir->flags & HEL_CK_DEFERRED) && !(heir->flags & HEL_CK_OFFERED)) {
		sch_offer(s, heir->id);
		if (heir->flags & HEL_CK_OFFERED)
			refresh_below(s, heir);
	}
	return true;
}

uint32_t hel_scheduler_evict(hel_scheduler *s, uint32_t steps)
{
	CHECK_ON_RETURN(s);
	uint32_t n = 0;
	while (n < steps && evict_one(s))
		n++;
	return n;
}

/* Make the free lists hold np pages and nr rows: 0, -EAGAIN when pending
 * ids will cover the rest at a fence, -ENOSPC when eviction cannot. */
int sch_ensure(hel_scheduler *s, uint32_t np, uint32_t nr)
{
	for (;;) {
		hel_cache_counts k;
		hel_cache_counts_get(s->c, &k);
		if (k.pages_free >= np && k.rows_free >= nr)
			return 0;
		if (k.pages_free + k.pages_pending >= np && k.rows_free + k.rows_pending >= nr)
			return -EAGAIN;
		if (!evict_one(s))
			return -ENOSPC;
	}
}

/* Would a request needing need_p pages and need_r rows (all counted, the
 * popped ones included) fit next to every outstanding page reservation,
 * were pins[0..n_pins) pinned once more?  Rows are never reserved beyond
 * what is popped (captures take theirs when they happen). */
bool sch_fits_pinned(hel_scheduler *s, uint64_t need_p, uint64_t need_r, const uint64_t *pins,
		     size_t n_pins)
{
	hel_cache_counts k;
	hel_cache_counts_get(s->c, &k);
	uint64_t have_p = (uint64_t)k.pages_free + k.pages_pending;
	uint64_t have_r = (uint64_t)k.rows_free + k.rows_pending;
	if (have_p >= need_p + s->res_pages && have_r >= need_r)
		return true;
	uint32_t rp, rr;
	hel_cache_reclaimable_if_pinned(s->c, pins, n_pins, &rp, &rr);
	return have_p + rp >= need_p + s->res_pages && have_r + rr >= need_r;
}

static bool fits(hel_scheduler *s, uint64_t need_p, uint64_t need_r, uint64_t extra_pin)
{
	return sch_fits_pinned(s, need_p, need_r, &extra_pin, 1);
}

/* ---- request lifecycle ------------------------------------------------------------ */

static void release_own(hel_scheduler *s, struct req *r)
{
	for (uint32_t i = r->n_prefix; i < r->n_table; i++)
		hel_cache_release_page(s->c, r->table[i]);
	r->n_table = r->n_prefix;
}

static void unpin_prefix(hel_scheduler *s, struct req *r)
{
	if (r->prefix != HEL_CKPT_NONE)
		hel_cache_unpin(s->c, r->prefix, false);
	r->prefix = HEL_CKPT_NONE;
	r->n_prefix = r->n_table = 0;
}

/* Turn r's live state into its terminal checkpoint (finish or preemption):
 * live row and own pages move into it when its row holds valid state and
 * the key is new; otherwise they are released.  Returns the checkpoint. */
uint64_t sch_to_terminal(hel_scheduler *s, struct req *r, bool preempted)
{
	uint64_t id = HEL_CKPT_NONE, c = r->consumed;
	if (r->last_fence && c > 0 && r->phase != HEL_PHASE_RESTORE) {
		sel_key key;
		sel_history_key_at(&r->h, c, &key);
		const hel_ckpt *ex = hel_cache_find(s->c, &key);
		if (ex) {
			if (preempted)
				resumed_at(s, ex->id);
		} else {
			hel_ckpt_spec sp = {
				.key = key,
				.bucket = *sel_history_bound(&r->h, c / SEL_BUCKET_TOKENS),
				.parent = r->prefix,
				.tail = r->table + r->n_prefix,
				.n_tail = r->n_table - r->n_prefix,
				.row = r->live_row,
				.ready_after = r->last_fence,
				.flags = HEL_CK_TERMINAL | (preempted ? 0 : HEL_CK_DEFERRED),
			};
			if (hel_cache_insert(s->c, &sp, &id) == 0) {
				s->st.terminals++;
				r->n_table = r->n_prefix; /* the pages are the checkpoint's now */
				r->live_row = HEL_NONE;
				if (preempted)
					sch_offer(s, id);
			} else {
				id = HEL_CKPT_NONE;
			}
		}
	}
	release_own(s, r);
	if (r->live_row != HEL_NONE)
		hel_cache_release_row(s->c, r->live_row);
	r->live_row = HEL_NONE;
	unpin_prefix(s, r);
	return id;
}

/* Forget a request that holds nothing any more. */
void sch_req_forget(hel_scheduler *s, struct req *r)
{
	res_set(s, r, 0);
	hel_map_del(&s->req_map, hel_mix64(r->id), r->slot);
	ptab_del(&s->reqs, r->slot);
	req_free(r);
}

static void ticket_drop_waiter(struct ticket *t, hel_req_id id)
{
	for (uint32_t i = 0; i < t->n_waiters; i++)
		if (t->waiters[i] == id) {
			memmove(t->waiters + i, t->waiters + i + 1,
				(t->n_waiters - i - 1) * sizeof(*t->waiters));
			t->n_waiters--;
			return;
		}
}

/* Newest request that can give its resources back: a decoder first, else
 * a prefilling request other than the one asking; never one in flight. */
static struct req *pick_victim(hel_scheduler *s, const struct req *asking)
{
	for (struct req *x = s->active.tail; x; x = x->prev)
		if (x->phase == HEL_PHASE_DECODE && !x->inflight)
			return x;
	for (struct req *x = s->active.tail; x; x = x->prev)
		if (x->phase == HEL_PHASE_PREFILL && !x->inflight && x != asking)
			return x;
	return NULL;
}

static void preempt(hel_scheduler *s, struct req *v)
{
	if (v->deferred_msg != HEL_CKPT_NONE)
		sch_offer(s, v->deferred_msg);
	v->deferred_msg = HEL_CKPT_NONE;
	sch_to_terminal(s, v, true);
	res_set(s, v, 0);
	v->phase = HEL_PHASE_WAITING;
	list_del(&s->active, v);
	list_push(&s->waiting, v);
	s->st.preempted++;
}

/* Pop up to want pages onto r's table, evicting and (allow_preempt)
 * preempting as needed.  Returns the number obtained; r itself may have
 * been preempted (phase WAITING) when it was the victim. */
uint32_t sch_get_pages(hel_scheduler *s, struct req *r, uint32_t want, bool allow_preempt)
{
	uint32_t got = 0;
	for (;;) {
		int rc = sch_ensure(s, want - got, 0);
		uint32_t page;
		while (got < want && hel_cache_alloc_page(s->c, &page) == 0) {
			r->table[r->n_table++] = page;
			got++;
			if (r->res_pages) {
				r->res_pages--;
				s->res_pages--;
			}
		}
		if (got == want || rc == -EAGAIN || !allow_preempt)
			return got;
		struct req *v = pick_victim(s, r);
		if (!v)
			return got;
		preempt(s, v);
		if (v == r)
			return got;
	}
}

/* Give back pages popped by get_pages and not used. */
void sch_unget_pages(hel_scheduler *s, struct req *r, uint32_t n, uint32_t res)
{
	for (uint32_t i = 0; i < n; i++)
		hel_cache_unalloc_page(s->c, r->table[--r->n_table]);
	r->res_pages += res;
	s->res_pages += res;
}

/* ---- admission --------------------------------------------------------------------- */

void hel_admission_plan_free(hel_admission_plan *p)
{
	if (!p)
		return;
	sel_history_free(&p->history);
	memset(p, 0, sizeof(*p));
}

int sch_validate_spec(const hel_scheduler *s, const hel_request_spec *sp)
{
	if (!sp->prompt || !sp->prompt_len)
		return eos_fail(-EINVAL, "admission: empty prompt");
	if (!sp->max_tokens)
		return eos_fail(-EINVAL, "admission: max_tokens is 0");
	for (size_t i = 0; i < sp->n_message_ends; i++) {
		uint64_t m = sp->message_ends[i];
		if (!m || m > sp->prompt_len || (i && m <= sp->message_ends[i - 1]))
			return eos_fail(
				-EINVAL,
				"admission: message end %zu (%llu) is not ascending within [1, %llu]",
				i, (unsigned long long)m, (unsigned long long)sp->prompt_len);
	}
	uint64_t pages = (sp->prompt_len + sp->max_tokens) / s->P;
	uint64_t rows = 1 + sp->n_message_ends + 1;
	if (pages > s->cfg.n_pages || rows > s->cfg.n_rows)
		return eos_fail(
			-E2BIG,
			"admission: needs up to %llu pages and %llu rows, the pools hold %u and %u",
			(unsigned long long)pages, (unsigned long long)rows, s->cfg.n_pages,
			s->cfg.n_rows);
	return 0;
}

int hel_scheduler_plan_admission(hel_scheduler *s, const hel_request_spec *spec,
				 hel_admission_plan *plan)
{
	CHECK_ON_RETURN(s);
	memset(plan, 0, sizeof(*plan));
	int rc = sch_validate_spec(s, spec);
	if (rc)
		return rc;
	rc = sel_history_init(&plan->history, s->cfg.model_identity, spec->salt, spec->salt_len);
	if (rc == 0)
		rc = sel_history_append(&plan->history, spec->prompt, spec->prompt_len);
	if (rc) {
		hel_admission_plan_free(plan);
		return eos_fail(rc, "admission: cannot build the history");
	}
	plan->lookup_limit = spec->prompt_len;
	const hel_ckpt *a = hel_cache_lookup(s->c, &plan->history, spec->prompt_len);
	if (a) {
		plan->gpu = a->id;
		plan->gpu_key = a->key;
		plan->gpu_consumed = a->key.consumed;
	}
	return 0;
}

/* Reserve for r (not in any list) and make it active: GPU prefix A (or
 * none), inbound hit (or NULL).  Nothing changes on -EAGAIN/-ENOMEM except
 * evictions sch_ensure() made. */
int sch_place(hel_scheduler *s, struct req *r, const hel_ckpt *A, const sel_hit *hit,
	      hel_admission *out)
{
	uint64_t len = sel_history_len(&r->h), P = s->P;
	uint64_t a = A ? A->key.consumed : 0, a_id = A ? A->id : HEL_CKPT_NONE;
	uint64_t c = hit ? hit->key.consumed : a;
	struct ticket *t = hit ? find_ticket(s, &hit->key) : NULL;
	bool create = hit && !t;
	uint32_t tpages = create ? hit->pages : 0;
	uint32_t next_cap = 0;
	while (next_cap < r->n_caps && r->caps[next_cap] <= c)
		next_cap++;
	uint64_t need_p, need_r;
	admission_pages(s, len, c, tpages, create, &need_p, &need_r);
	bool pin_a = A && (!hit || create);

	if (s->active.n >= s->cfg.max_active)
		return eos_fail(-EAGAIN, "no capacity: %u requests active", s->active.n);
	if (!fits(s, need_p, need_r, pin_a ? a_id : HEL_CKPT_NONE))
		return eos_fail(-EAGAIN,
				"no capacity: needs %llu pages beyond %llu reserved and %llu rows",
				(unsigned long long)need_p, (unsigned long long)s->res_pages,
				(unsigned long long)need_r);
	/* Memory before state. */
	struct ticket *nt = NULL;
	if (create) {
		nt = calloc(1, sizeof(*nt));
		if (!nt || !(nt->pages = malloc((tpages ? tpages : 1) * sizeof(uint32_t))) ||
		    !(nt->waiters = malloc(4 * sizeof(hel_req_id))) || ptab_reserve(&s->tickets) ||
		    hel_map_reserve(&s->ticket_map, 1)) {
			ticket_free(nt);
			return eos_fail(-ENOMEM, "admission: out of memory for a ticket");
		}
		nt->cap_waiters = 4;
		t = nt;
	} else if (t && t->n_waiters == t->cap_waiters) {
		hel_req_id *w = realloc(t->waiters, 2 * (size_t)t->cap_waiters * sizeof(*w));
		if (!w)
			return eos_fail(-ENOMEM, "admission: out of memory for a waiter");
		t->waiters = w;
		t->cap_waiters *= 2;
	}
	if (pin_a)
		hel_cache_pin(s->c, a_id, false);
	int rc = sch_ensure(s, tpages, 1 + (create ? 1 : 0));
	if (rc) {
		if (pin_a)
			hel_cache_unpin(s->c, a_id, false);
		ticket_free(nt);
		return eos_fail(-EAGAIN, "no capacity: %s",
				rc == -EAGAIN ? "ids wait for a fence" : "nothing left to evict");
	}
	(void)hel_cache_alloc_row(s->c, &r->live_row);
	memset(out, 0, sizeof(*out));
	if (A) {
		s->st.gpu_hits++;
		s->st.gpu_reused_tokens += a;
		resumed_at(s, a_id);
		hel_cache_touch(s->c, a_id);
	}
	if (!hit) {
		r->prefix = a_id;
		r->n_prefix = r->n_table = 0;
		if (A)
			r->n_prefix = r->n_table =
				(uint32_t)hel_cache_chain(s->c, A, r->table, r->cap_table);
		r->phase = A ? HEL_PHASE_RESTORE : HEL_PHASE_PREFILL;
	} else {
		if (create) {
			nt->id = ++s->next_ticket;
			nt->key = hit->key;
			nt->bucket = *sel_history_bound(&r->h, c / SEL_BUCKET_TOKENS);
			nt->ancestor = pin_a ? a_id : HEL_CKPT_NONE;
			nt->n_pages = tpages;
			for (uint32_t i = 0; i < tpages; i++)
				(void)hel_cache_alloc_page(s->c, &nt->pages[i]);
			(void)hel_cache_alloc_row(s->c, &nt->row);
			nt->slot = ptab_put(&s->tickets, nt);
			(void)hel_map_add(&s->ticket_map, hel_hash_key(&nt->key), nt->slot);
			s->n_tickets++;
			out->fetch = true;
		}
		t->waiters[t->n_waiters++] = r->id;
		r->ticket = t;
		r->prefix = HEL_CKPT_NONE;
		r->n_prefix = r->n_table = 0;
		r->phase = HEL_PHASE_INBOUND;
		s->st.host_hits++;
		s->st.host_reused_tokens += c - a;
		s->st.inbound_waiting++;
		out->inbound.ticket = t->id;
		out->inbound.pages = t->pages;
		out->inbound.n_pages = t->n_pages;
		out->inbound.state_slot = t->row;
	}
	r->consumed = c;
	r->reused = c;
	r->next_cap = next_cap;
	r->inbound_failed = false;
	r->inflight = 0;
	r->last_fence = 0;
	r->deferred_msg = HEL_CKPT_NONE;
	res_set(s, r, (uint32_t)(len / P - c / P));
	r->seq = ++s->seq;
	list_push(&s->active, r);
	out->req = r->id;
	out->phase = r->phase;
	out->reused_tokens = c;
	return 0;
}

static struct req *req_new(hel_scheduler *s, const hel_request_spec *sp)
{
	struct req *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	uint64_t maxlen = sp->prompt_len + sp->max_tokens;
	r->cap_tok = maxlen;
	r->tok = malloc(maxlen * sizeof(sel_token));
	r->cap_table = (uint32_t)(maxlen / s->P + 1);
	r->table = malloc(r->cap_table * sizeof(uint32_t));
	r->caps = malloc((sp->n_message_ends + 1) * sizeof(uint64_t));
	if (!r->tok || !r->table || !r->caps) {
		req_free(r);
		return NULL;
	}
	memcpy(r->tok, sp->prompt, sp->prompt_len * sizeof(sel_token));
	r->n_tok = sp->prompt_len;
	for (size_t i = 0; i < sp->n_message_ends; i++)
		if (sp->message_ends[i] < sp->prompt_len)
			r->caps[r->n_caps++] = sp->message_ends[i];
	r->caps[r->n_caps++] = sp->prompt_len;
	r->prompt_len = sp->prompt_len;
	r->max_tokens = sp->max_tokens;
	r->has_stop = sp->has_stop;
	r->stop = sp->stop;
	r->user = sp->user;
	r->live_row = HEL_NONE;
	r->prefix = HEL_CKPT_NONE;
	r->deferred_msg = HEL_CKPT_NONE;
	return r;
}

int hel_scheduler_admit_planned(hel_scheduler *s, const hel_request_spec *spec,
				hel_admission_plan *plan, const sel_hit *inbound,
				hel_admission *out)
{
	CHECK_ON_RETURN(s);
	memset(out, 0, sizeof(*out));
	int rc = sch_validate_spec(s, spec);
	if (rc)
		return rc;
	if (sel_history_len(&plan->history) != spec->prompt_len)
		return eos_fail(-EINVAL, "admission: the plan is not for this spec");
	if (s->waiting.n > s->n_held) { /* held ones wait for their caller, not for capacity */
		s->st.rejected_capacity++;
		return eos_fail(-EAGAIN, "no capacity: %u preempted requests wait first",
				s->waiting.n);
	}
	const hel_ckpt *A = NULL;
	if (plan->gpu != HEL_CKPT_NONE) {
		A = hel_cache_get(s->c, plan->gpu);
		if (!A || !hel_ckpt_has_row(A) || !hel_cache_ready(s->c, A))
			return eos_fail(-ESTALE,
					"admission: GPU checkpoint %llu of the plan is gone",
					(unsigned long long)plan->gpu);
	}
	if (inbound) {
		uint64_t a = plan->gpu_consumed, c = inbound->key.consumed;
		sel_key want;
		if (c <= a || c > spec->prompt_len || inbound->pages != c / s->P - a / s->P)
			return eos_fail(
				-EINVAL,
				"admission: inbound hit at %llu with %u pages does not extend %llu",
				(unsigned long long)c, inbound->pages, (unsigned long long)a);
		sel_history_key_at(&plan->history, c, &want);
		if (!sel_key_eq(&want, &inbound->key))
			return eos_fail(-EINVAL,
					"admission: inbound key is not the prompt's key at %llu",
					(unsigned long long)c);
	}
	struct req *r = req_new(s, spec);
	if (!r || ptab_reserve(&s->reqs) || hel_map_reserve(&s->req_map, 1)) {
		req_free(r);
		return eos_fail(-ENOMEM, "admission: out of memory");
	}
	r->h = plan->history; /* borrowed until success */
	r->id = s->next_req + 1;
	rc = sch_place(s, r, A, inbound, out);
	if (rc) {
		memset(&r->h, 0, sizeof(r->h));
		req_free(r);
		if (rc == -EAGAIN)
			s->st.rejected_capacity++;
		return rc;
	}
	s->next_req++;
	memset(&plan->history, 0, sizeof(plan->history));
	r->slot = ptab_put(&s->reqs, r);
	(void)hel_map_add(&s->req_map, hel_mix64(r->id), r->slot);
	s->st.admitted++;
	if (plan->host_lookup)
		s->st.host_lookups++;
	return 0;
}

int hel_scheduler_admit(hel_scheduler *s, const hel_request_spec *spec, hel_admission *out)
{
	CHECK_ON_RETURN(s);
	hel_admission_plan plan;
	int rc = hel_scheduler_plan_admission(s, spec, &plan);
	if (rc == 0)
		rc = hel_scheduler_admit_planned(s, spec, &plan, NULL, out);
	hel_admission_plan_free(&plan);
	return rc;
}

/* ---- inbound --------------------------------------------------------------------- */

static void ticket_forget(hel_scheduler *s, struct ticket *t)
{
	if (t->ancestor != HEL_CKPT_NONE)
		hel_cache_unpin(s->c, t->ancestor, false);
	hel_map_del(&s->ticket_map, hel_hash_key(&t->key), t->slot);
	ptab_del(&s->tickets, t->slot);
	s->n_tickets--;
	ticket_free(t);
}

int hel_scheduler_finish_inbound(hel_scheduler *s, const sel_key *key, int status,
				 const hel_req_id **failed, size_t *n_failed)
{
	CHECK_ON_RETURN(s);
	if (failed)
		*failed = NULL;
	if (n_failed)
		*n_failed = 0;
	struct ticket *t = find_ticket(s, key);
	if (!t)
		return eos_fail(-ENOENT, "finish_inbound: no ticket for the key at %llu",
				(unsigned long long)key->consumed);
	uint64_t target = HEL_CKPT_NONE;
	bool existing = false;
	if (status == 0) {
		const hel_ckpt *ex = hel_cache_find(s->c, key);
		if (ex) {
			target = ex->id;
			existing = true;
		} else {
			hel_ckpt_spec sp = {
				.key = t->key,
				.bucket = t->bucket,
				.parent = t->ancestor,
				.tail = t->pages,
				.n_tail = t->n_pages,
				.row = t->row,
				.ready_after = s->completed,
				.flags = HEL_CK_RESTORED | HEL_CK_OFFERED,
			};
			if (hel_cache_insert(s->c, &sp, &target))
				target = HEL_CKPT_NONE; /* treated as a failed restore */
		}
	}
	if (target == HEL_CKPT_NONE || existing) {
		/* Written at most by the store's drained transfer: free at once. */
		for (uint32_t i = 0; i < t->n_pages; i++)
			hel_cache_unalloc_page(s->c, t->pages[i]);
		hel_cache_unalloc_row(s->c, t->row);
	}
	if (target != HEL_CKPT_NONE) {
		const hel_ckpt *k = hel_cache_get(s->c, target);
		for (uint32_t i = 0; i < t->n_waiters; i++) {
			struct req *r = find_req(s, t->waiters[i]);
			hel_cache_pin(s->c, target, false);
			r->prefix = target;
			r->n_prefix = r->n_table =
				(uint32_t)hel_cache_chain(s->c, k, r->table, r->cap_table);
			r->phase = HEL_PHASE_RESTORE;
			r->ticket = NULL;
		}
		s->st.inbound_waiting -= t->n_waiters;
		if (existing) {
			s->st.inbound_existing++;
			if (t->n_waiters)
				resumed_at(s, target);
		} else {
			s->st.inbound_ok++;
		}
		hel_cache_touch(s->c, target);
	} else {
		s->st.inbound_failed++;
		if (t->n_waiters && eos_grow((void **)&s->failed, &s->cap_failed, t->n_waiters,
					     sizeof(*s->failed)) == 0) {
			memcpy(s->failed, t->waiters, t->n_waiters * sizeof(*s->failed));
			if (failed)
				*failed = s->failed;
			if (n_failed)
				*n_failed = t->n_waiters;
		}
		/* Without memory for the list the waiters stay visible through
		 * hel_request_info (ticket 0); they are never lost. */
		for (uint32_t i = 0; i < t->n_waiters; i++) {
			struct req *r = find_req(s, t->waiters[i]);
			r->ticket = NULL;
			r->inbound_failed = true;
		}
		s->st.inbound_waiting -= t->n_waiters;
	}
	ticket_forget(s, t);
	return 0;
}

/* ---- cancel / info ------------------------------------------------------------------- */

int hel_scheduler_cancel(hel_scheduler *s, hel_req_id id)
{
	CHECK_ON_RETURN(s);
	struct req *r = find_req(s, id);
	if (!r)
		return eos_fail(-ENOENT, "cancel: no request %llu", (unsigned long long)id);
	switch (r->phase) {
	case HEL_PHASE_WAITING:
		list_del(&s->waiting, r);
		s->n_held -= r->held;
		break;
	case HEL_PHASE_INBOUND:
		if (r->ticket) {
			ticket_drop_waiter(r->ticket, r->id);
			s->st.inbound_waiting--;
		}
		hel_cache_release_row(s->c, r->live_row);
		list_del(&s->active, r);
		break;
	default:
		/* Cancelled before its prompt capture: the deferred message is
		 * offered at retirement (design 2.2). */
		if (r->deferred_msg != HEL_CKPT_NONE)
			sch_offer(s, r->deferred_msg);
		release_own(s, r);
		hel_cache_release_row(s->c, r->live_row);
		unpin_prefix(s, r);
		list_del(&s->active, r);
		break;
	}
	s->st.cancelled++;
	sch_req_forget(s, r);
	return 0;
}

int hel_scheduler_request_info(hel_scheduler *s, hel_req_id id, hel_request_info *o)
{
	struct req *r = find_req(s, id);
	if (!r)
		return eos_fail(-ENOENT, "request_info: no request %llu", (unsigned long long)id);
	memset(o, 0, sizeof(*o));
	o->phase = r->phase;
	o->user = r->user;
	o->prompt_len = r->prompt_len;
	o->consumed = r->consumed;
	o->reused_tokens = r->reused;
	o->generated = r->n_gen;
	o->prefix = r->prefix;
	o->live_row = r->live_row;
	o->pages = r->table;
	o->n_pages = r->n_table;
	o->n_shared = r->n_prefix;
	o->ticket = r->ticket ? r->ticket->id : 0;
	o->in_flight = r->inflight != 0;
	o->history = &r->h;
	o->tokens = r->tok;
	o->n_tokens = r->n_tok;
	o->held = r->held;
	o->held_depth = r->held_depth;
	return 0;
}

/* ---- shutdown ---------------------------------------------------------------------------- */

void hel_scheduler_release_after_shutdown(hel_scheduler *s)
{
	CHECK_ON_RETURN(s);
	/* The executor is closed: every submitted step is over. */
	s->completed = s->submitted;
	hel_cache_complete_fence(s->c, s->submitted);
	s->n_steps = 0;
	for (uint32_t i = 0; i < s->tickets.cap; i++) {
		struct ticket *t = s->tickets.p[i];
		if (!t)
			continue;
		for (uint32_t j = 0; j < t->n_pages; j++)
			hel_cache_unalloc_page(s->c, t->pages[j]);
		hel_cache_unalloc_row(s->c, t->row);
		for (uint32_t j = 0; j < t->n_waiters; j++) {
			struct req *r = find_req(s, t->waiters[j]);
			r->ticket = NULL;
			r->inbound_failed = true;
		}
		ticket_forget(s, t);
	}
	s->st.inbound_waiting = 0;
	while (s->waiting.head) {
		struct req *r = s->waiting.head;
		list_del(&s->waiting, r);
		sch_req_forget(s, r);
	}
	s->n_held = 0;
	while (s->active.head) {
		struct req *r = s->active.head;
		release_own(s, r);
		hel_cache_release_row(s->c, r->live_row);
		unpin_prefix(s, r);
		list_del(&s->active, r);
		sch_req_forget(s, r);
	}
	hel_cache_drop_all(s->c);
	s->nq = 0;
	hel_notice drain[64];
	while (hel_scheduler_take_evictions(s, drain, 64, NULL))
		;
}
