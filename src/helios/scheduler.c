/*
 * scheduler.c - requests, two-step admission, inbound tickets, chunked
 * prefill with checkpoint captures, decode, preemption, publication with
 * the deferral rules, and eviction notices for the reference engine
 * (design 2.7 "Scheduler integration" and implementation step 10; 2.2 for
 * publication and deferral; 2.8 for the worker's side; 2.12; 2.15
 * "Evictions" and "Headroom").  scheduler.h is the contract.
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
 *   Captures.  Capture points are the spec's message ends plus the prompt
 *   end.  A chunk never crosses the next capture point; when it ends on
 *   one, planning creates the checkpoint at once (tail = the request's own
 *   pages, row = a fresh snapshot row, ready after the step's fence) and
 *   moves the request's prefix pin onto it, so the request's own pages are
 *   always exactly the pages since its prefix.  A finished request's live
 *   row and own pages become its terminal checkpoint without any copy.
 *
 *   Admission.  Reservation is counting, not popping: a request reserves
 *   the pages of its history past its prefix depth and one row per
 *   capture point left, and admission requires free + pending +
 *   reclaimable (with its GPU ancestor pinned) to cover every outstanding
 *   reservation.  Only the live row and a new ticket's destinations are
 *   popped at admission.  Decode pages are not reserved: when they run
 *   out the newest decoding request is preempted (its state becomes a
 *   checkpoint that eviction may take, it re-queues in WAITING), as is,
 *   failing that, the newest other prefilling request.
 *
 *   Allocation.  Ids come only from the cache's free lists.  ensure()
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
 *   Publication.  A FIFO of checkpoint ids; flags in the cache node say
 *   OFFERED (counts as a parent for later publications, gets eviction
 *   notices), QUEUED, TAKEN, DEFERRED.  take_publications emits the ready
 *   ones, sorted by depth so parents precede children.
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
 *   5. Reservation totals equal the sums over requests; a request's rows
 *      reserved == capture points left.
 *   6. A request in flight names a fence in (completed, submitted]; the
 *      outstanding steps have consecutive fences ending at submitted.
 *   7. DEFERRED and OFFERED exclude each other; every QUEUED checkpoint is
 *      in the publication queue.  A request's pending deferred message is
 *      its prefix.
 *   8. inbound_waiting == the number of requests waiting on a ticket.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "list.h"
#include "helios/cache.h"
#include "helios/map.h"
#include "helios/scheduler.h"

struct ticket;

struct req {
	hel_req_id id;
	uint32_t slot;
	hel_phase phase;
	sel_history h;
	sel_token *tok; /* the same tokens, for steps to point into */
	uint64_t n_tok, cap_tok;
	uint64_t prompt_len;
	uint64_t *caps; /* capture points, ascending, last = prompt_len */
	uint32_t n_caps, next_cap;
	uint32_t max_tokens, n_gen;
	bool has_stop;
	sel_token stop;
	uint64_t user;
	uint64_t seq;    /* admission order */
	uint64_t prefix; /* pinned checkpoint or HEL_CKPT_NONE */
	uint32_t *table;
	uint32_t n_table, n_prefix, cap_table;
	uint32_t live_row;
	uint64_t consumed, reused;
	uint32_t res_pages, res_rows;
	struct ticket *ticket;
	bool inbound_failed;
	uint64_t inflight;     /* fence of the step it is in, 0 = none */
	uint64_t last_fence;   /* last step that wrote its live row, 0 = none yet */
	uint64_t deferred_msg; /* deferred message waiting on our prompt capture */
	uint64_t floor;        /* re-admitted by next_step only from this depth on */
	uint64_t held_depth;   /* held: the GPU depth its re-admission found */
	bool held;             /* WAITING, held below its floor (set_floor releases) */
	struct req *prev, *next;
};

struct ticket {
	uint64_t id;
	uint32_t slot;
	sel_key key;
	sel_digest bucket;
	uint64_t ancestor; /* pinned GPU ancestor, HEL_CKPT_NONE for none */
	uint32_t *pages;
	uint32_t n_pages;
	uint32_t row;
	hel_req_id *waiters;
	uint32_t n_waiters, cap_waiters;
};

struct step {
	uint64_t fence;
	hel_step_entry *e; /* [max_active] */
	size_t n;
	size_t *pg_off, *tk_off; /* per entry, until the pointers are fixed */
	uint32_t *pg;
	size_t npg, cappg;
	sel_token *tk;
	size_t ntk, captk;
};

struct rlist {
	struct req *head, *tail;
	uint32_t n;
};

struct ptab {
	void **p;
	uint32_t cap, nfree;
	uint32_t *free;
};

struct hel_scheduler {
	hel_scheduler_config cfg;
	uint32_t P;
	hel_cache *c;
	struct ptab reqs, tickets;
	hel_map req_map, ticket_map;
	struct rlist active, waiting;
	uint32_t n_held; /* waiting requests held below their floor */
	uint32_t n_tickets;
	uint64_t next_req, next_ticket, seq;
	uint64_t submitted, completed;
	struct step *steps; /* ring of max_inflight */
	uint32_t step_head, n_steps;
	struct req **scratch; /* [max_active] */
	uint64_t *queue;
	size_t nq, capq;
	sel_published *pubs;
	const hel_ckpt **pubk;
	size_t cap_pubs, cap_pubk;
	uint32_t *pub_pages;
	size_t cap_pub_pages;
	uint32_t *desc_pages;
	size_t cap_desc;
	hel_req_id *failed;
	size_t cap_failed;
	uint64_t res_pages, res_rows;
	hel_scheduler_stats st;
};

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

EOS_DLIST_DEFINE(list, struct rlist, struct req)

static struct req *find_req(const hel_scheduler *s, hel_req_id id)
{
	uint64_t h = hel_mix64(id);
	for (size_t p = hel_map_first(&s->req_map, h); p != HEL_MAP_END;
	     p = hel_map_next(&s->req_map, h, p)) {
		struct req *r = s->reqs.p[s->req_map.v[p]];
		if (r && r->id == id)
			return r;
	}
	return NULL;
}

static struct ticket *find_ticket(const hel_scheduler *s, const sel_key *key)
{
	uint64_t h = hel_hash_key(key);
	for (size_t p = hel_map_first(&s->ticket_map, h); p != HEL_MAP_END;
	     p = hel_map_next(&s->ticket_map, h, p)) {
		struct ticket *t = s->tickets.p[s->ticket_map.v[p]];
		if (t && sel_key_eq(&t->key, key))
			return t;
	}
	return NULL;
}

/* Builds with SEL_DEBUG_CHECKS (make check-asan) run hel_scheduler_check,
 * and with it hel_cache_check, whenever a public call that changes the
 * scheduler returns, on every path, and abort on the first violation.
 * CHECK_ON_RETURN(s) at the top of such a call arranges it. */
#ifdef SEL_DEBUG_CHECKS
static void check_on_return(hel_scheduler **sp)
{
	if (*sp && hel_scheduler_check(*sp) != 0) {
		fprintf(stderr, "hel_scheduler_check: %s\n", eos_errmsg());
		abort();
	}
}
#define CHECK_ON_RETURN(s)                                                                         \
	hel_scheduler *check_on_return_ __attribute__((cleanup(check_on_return), unused)) = (s)
#else
#define CHECK_ON_RETURN(s) ((void)0)
#endif

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

static void res_set(hel_scheduler *s, struct req *r, uint32_t pages, uint32_t rows)
{
	s->res_pages = s->res_pages - r->res_pages + pages;
	s->res_rows = s->res_rows - r->res_rows + rows;
	r->res_pages = pages;
	r->res_rows = rows;
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
static void offer(hel_scheduler *s, uint64_t id)
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
		offer(s, id);
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
		offer(s, heir->id);
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
static int ensure(hel_scheduler *s, uint32_t np, uint32_t nr)
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
 * popped ones included) fit next to every outstanding reservation, were
 * pins[0..n_pins) pinned once more? */
static bool fits_pinned(hel_scheduler *s, uint64_t need_p, uint64_t need_r, const uint64_t *pins,
			size_t n_pins)
{
	hel_cache_counts k;
	hel_cache_counts_get(s->c, &k);
	uint64_t have_p = (uint64_t)k.pages_free + k.pages_pending;
	uint64_t have_r = (uint64_t)k.rows_free + k.rows_pending;
	if (have_p >= need_p + s->res_pages && have_r >= need_r + s->res_rows)
		return true;
	uint32_t rp, rr;
	hel_cache_reclaimable_if_pinned(s->c, pins, n_pins, &rp, &rr);
	return have_p + rp >= need_p + s->res_pages && have_r + rr >= need_r + s->res_rows;
}

static bool fits(hel_scheduler *s, uint64_t need_p, uint64_t need_r, uint64_t extra_pin)
{
	return fits_pinned(s, need_p, need_r, &extra_pin, 1);
}

/* Design 2.15 admission_pages: what admission reserves and pops for a
 * request of len tokens admitted at depth c (its GPU prefix, or an
 * inbound hit's end) with caps_left capture points above c: the pages of
 * its history past c, a new ticket's tpages, one live row, one row per
 * capture point left and a new ticket's row.  place() and export_fits
 * both use it. */
static void admission_pages(const hel_scheduler *s, uint64_t len, uint64_t c, uint32_t caps_left,
			    uint32_t tpages, bool create, uint64_t *need_p, uint64_t *need_r)
{
	*need_p = len / s->P - c / s->P + tpages;
	*need_r = 1 + (uint64_t)caps_left + (create ? 1 : 0);
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
static uint64_t to_terminal(hel_scheduler *s, struct req *r, bool preempted)
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
					offer(s, id);
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
static void req_forget(hel_scheduler *s, struct req *r)
{
	res_set(s, r, 0, 0);
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
		offer(s, v->deferred_msg);
	v->deferred_msg = HEL_CKPT_NONE;
	to_terminal(s, v, true);
	res_set(s, v, 0, 0);
	v->phase = HEL_PHASE_WAITING;
	list_del(&s->active, v);
	list_push(&s->waiting, v);
	s->st.preempted++;
}

/* Pop up to want pages onto r's table, evicting and (allow_preempt)
 * preempting as needed.  Returns the number obtained; r itself may have
 * been preempted (phase WAITING) when it was the victim. */
static uint32_t get_pages(hel_scheduler *s, struct req *r, uint32_t want, bool allow_preempt)
{
	uint32_t got = 0;
	for (;;) {
		int rc = ensure(s, want - got, 0);
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
static void unget_pages(hel_scheduler *s, struct req *r, uint32_t n, uint32_t res)
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

static int validate_spec(const hel_scheduler *s, const hel_request_spec *sp)
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
	int rc = validate_spec(s, spec);
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
 * evictions ensure() made. */
static int place(hel_scheduler *s, struct req *r, const hel_ckpt *A, const sel_hit *hit,
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
	uint32_t caps_left = r->n_caps - next_cap;
	uint64_t need_p, need_r;
	admission_pages(s, len, c, caps_left, tpages, create, &need_p, &need_r);
	bool pin_a = A && (!hit || create);

	if (s->active.n >= s->cfg.max_active)
		return eos_fail(-EAGAIN, "no capacity: %u requests active", s->active.n);
	if (!fits(s, need_p, need_r, pin_a ? a_id : HEL_CKPT_NONE))
		return eos_fail(
			-EAGAIN,
			"no capacity: needs %llu pages and %llu rows beyond %llu and %llu reserved",
			(unsigned long long)need_p, (unsigned long long)need_r,
			(unsigned long long)s->res_pages, (unsigned long long)s->res_rows);
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
	int rc = ensure(s, tpages, 1 + (create ? 1 : 0));
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
	res_set(s, r, (uint32_t)(len / P - c / P), caps_left);
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
	int rc = validate_spec(s, spec);
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
	rc = place(s, r, A, inbound, out);
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
			offer(s, r->deferred_msg);
		release_own(s, r);
		hel_cache_release_row(s->c, r->live_row);
		unpin_prefix(s, r);
		list_del(&s->active, r);
		break;
	}
	s->st.cancelled++;
	req_forget(s, r);
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

/* ---- steps --------------------------------------------------------------------------- */

/* Oldest first; a request whose GPU checkpoint lies below its floor is
 * held (hel_scheduler_set_floor) and passed over. */
static void readmit(hel_scheduler *s)
{
	for (struct req *r = s->waiting.head, *nx; r; r = nx) {
		nx = r->next;
		if (r->held)
			continue;
		hel_admission adm;
		const hel_ckpt *A = hel_cache_lookup(s->c, &r->h, sel_history_len(&r->h));
		uint64_t a = A ? A->key.consumed : 0;
		if (a < r->floor) {
			r->held = true;
			r->held_depth = a;
			s->n_held++;
			continue;
		}
		list_del(&s->waiting, r);
		if (place(s, r, A, NULL, &adm)) {
			list_push_front(&s->waiting, r);
			return;
		}
		s->st.readmitted++;
	}
}

int hel_scheduler_set_floor(hel_scheduler *s, hel_req_id id, uint64_t floor)
{
	CHECK_ON_RETURN(s);
	struct req *r = find_req(s, id);
	if (!r)
		return eos_fail(-ENOENT, "set_floor: no request %llu", (unsigned long long)id);
	r->floor = floor;
	if (r->held) {
		r->held = false;
		s->n_held--;
	}
	return 0;
}

static int arena_reserve(struct step *st, size_t pages, size_t tokens)
{
	if (eos_grow((void **)&st->pg, &st->cappg, st->npg + pages, sizeof(*st->pg)) ||
	    eos_grow((void **)&st->tk, &st->captk, st->ntk + tokens, sizeof(*st->tk)))
		return -ENOMEM;
	return 0;
}

/* Append an entry for r covering [begin, end) with its current table. */
static hel_step_entry *add_entry(struct step *st, struct req *r, hel_entry_kind kind,
				 uint64_t begin, uint64_t end, uint32_t P)
{
	hel_step_entry *e = &st->e[st->n];
	memset(e, 0, sizeof(*e));
	e->req = r->id;
	e->kind = kind;
	e->live_row = r->live_row;
	e->restore_src = HEL_NONE;
	e->capture_row = HEL_NONE;
	e->emit_max = 1;
	e->has_stop = r->has_stop;
	e->begin = begin;
	e->end = end;
	e->n_pages = (uint32_t)(end / P);
	e->first_new_page = (uint32_t)(begin / P);
	st->pg_off[st->n] = st->npg;
	if (e->n_pages)
		memcpy(st->pg + st->npg, r->table, e->n_pages * sizeof(uint32_t));
	st->npg += e->n_pages;
	st->tk_off[st->n] = st->ntk;
	if (end > begin)
		memcpy(st->tk + st->ntk, r->tok + begin, (end - begin) * sizeof(sel_token));
	st->ntk += end - begin;
	st->n++;
	return e;
}

static void plan_restore(hel_scheduler *s, struct step *st, struct req *r, uint64_t fence)
{
	const hel_ckpt *src = hel_cache_get(s->c, r->prefix);
	if (!src || !hel_cache_ready(s->c, src))
		return; /* restore after the capture that fills src completes */
	if (arena_reserve(st, r->n_table, 0))
		return;
	uint64_t len = sel_history_len(&r->h);
	hel_step_entry *e = add_entry(st, r, HEL_ENTRY_RESTORE, r->consumed, r->consumed, s->P);
	e->restore_src = src->row;
	e->restore_consumed = r->consumed;
	e->sample = r->consumed == len;
	if (e->sample)
		r->phase = HEL_PHASE_DECODE;
	else
		r->phase =
			r->n_gen && r->consumed + 1 == len ? HEL_PHASE_DECODE : HEL_PHASE_PREFILL;
	r->inflight = fence;
	r->last_fence = fence;
	s->st.restores++;
}

static void plan_decode(hel_scheduler *s, struct step *st, struct req *r, uint64_t fence,
			uint32_t *budget)
{
	uint64_t pos = r->consumed, end = pos + 1;
	if (!*budget || arena_reserve(st, end / s->P, 1))
		return;
	if (end % s->P == 0 && get_pages(s, r, 1, true) != 1)
		return; /* waits for a fence, or was preempted itself */
	hel_step_entry *e = add_entry(st, r, HEL_ENTRY_DECODE, pos, end, s->P);
	e->sample = true;
	e->emit_max = r->max_tokens - r->n_gen; /* >= 1: a request stops at max_tokens */
	r->consumed = end;
	r->inflight = fence;
	r->last_fence = fence;
	(*budget)--;
	s->st.decode_tokens++;
}

/* Capture r at its consumed count `end` into a new checkpoint; returns
 * its id, HEL_CKPT_NONE when skipped (key present) or failed, or -EAGAIN
 * through *wait when the snapshot row is pending. */
static uint64_t capture(hel_scheduler *s, struct req *r, uint64_t end, uint64_t fence,
			uint32_t *row_out, bool *wait)
{
	bool is_prompt = end == r->prompt_len;
	uint64_t id = HEL_CKPT_NONE;
	sel_key key;
	*wait = false;
	*row_out = HEL_NONE;
	sel_history_key_at(&r->h, end, &key);
	if (hel_cache_find(s->c, &key)) {
		s->st.captures_skipped++;
		goto passed;
	}
	int rc = ensure(s, 0, 1);
	if (rc == -EAGAIN) {
		*wait = true;
		return HEL_CKPT_NONE;
	}
	uint32_t row;
	/* The message's planned prompt checkpoint is its direct child less
	 * than one page later: defer it (design 2.2). */
	bool defer =
		!is_prompt && r->next_cap + 2 == r->n_caps && r->caps[r->n_caps - 1] - end < s->P;
	if (rc == 0 && hel_cache_alloc_row(s->c, &row) == 0) {
		hel_ckpt_spec sp = {
			.key = key,
			.bucket = *sel_history_bound(&r->h, end / SEL_BUCKET_TOKENS),
			.parent = r->prefix,
			.tail = r->table + r->n_prefix,
			.n_tail = r->n_table - r->n_prefix,
			.row = row,
			.ready_after = fence,
			.flags = (is_prompt ? HEL_CK_PROMPT : HEL_CK_MESSAGE) |
				 (defer ? HEL_CK_DEFERRED : 0),
		};
		if (hel_cache_insert(s->c, &sp, &id)) {
			hel_cache_unalloc_row(s->c, row);
			id = HEL_CKPT_NONE;
		}
	}
	if (id == HEL_CKPT_NONE) {
		s->st.captures_failed++;
		/* No snapshot for the prompt: offer the deferred message while
		 * the request still pins it (design 2.2). */
		if (is_prompt && r->deferred_msg != HEL_CKPT_NONE)
			offer(s, r->deferred_msg);
		goto passed;
	}
	s->st.captures++;
	hel_cache_pin(s->c, id, false);
	if (r->prefix != HEL_CKPT_NONE)
		hel_cache_unpin(s->c, r->prefix, false);
	r->prefix = id;
	r->n_prefix = r->n_table;
	if (defer)
		r->deferred_msg = id;
	else
		offer(s, id);
	*row_out = row;
passed:
	if (is_prompt)
		r->deferred_msg = HEL_CKPT_NONE;
	r->next_cap++;
	if (r->res_rows) {
		r->res_rows--;
		s->res_rows--;
	}
	return id;
}

static void plan_prefill(hel_scheduler *s, struct step *st, struct req *r, uint64_t fence,
			 uint32_t *budget)
{
	uint64_t P = s->P, len = sel_history_len(&r->h), begin = r->consumed;
	uint64_t want = s->cfg.chunk_tokens < *budget ? s->cfg.chunk_tokens : *budget;
	if (!want)
		return;
	uint64_t end = begin + want < len ? begin + want : len;
	if (r->next_cap < r->n_caps && r->caps[r->next_cap] < end)
		end = r->caps[r->next_cap];
	if (arena_reserve(st, end / P, end - begin))
		return;
	uint32_t need = (uint32_t)(end / P - begin / P), res_before = r->res_pages;
	uint32_t got = need ? get_pages(s, r, need, true) : 0;
	if (got < need) {
		uint64_t lim = (begin / P + got + 1) * P - 1;
		if (lim < end)
			end = lim;
		if (end <= begin)
			return; /* got == 0 here: nothing to give back */
	}
	uint32_t cap_row = HEL_NONE;
	uint64_t cap_id = HEL_CKPT_NONE;
	if (r->next_cap < r->n_caps && r->caps[r->next_cap] == end) {
		bool wait;
		cap_id = capture(s, r, end, fence, &cap_row, &wait);
		if (wait) {
			unget_pages(s, r, got, res_before - r->res_pages);
			return;
		}
	}
	hel_step_entry *e = add_entry(st, r, HEL_ENTRY_PREFILL, begin, end, s->P);
	e->reset = begin == 0;
	e->sample = end == len;
	e->capture_row = cap_row;
	e->capture = cap_id;
	r->consumed = end;
	if (e->sample)
		r->phase = HEL_PHASE_DECODE;
	r->inflight = fence;
	r->last_fence = fence;
	*budget -= (uint32_t)(end - begin);
	s->st.prefill_tokens += end - begin;
	s->st.prefill_launches++;
}

int hel_scheduler_next_step(hel_scheduler *s, hel_step *out)
{
	CHECK_ON_RETURN(s);
	memset(out, 0, sizeof(*out));
	if (s->n_steps == s->cfg.max_inflight)
		return eos_fail(-EBUSY, "next_step: %u steps in flight", s->n_steps);
	readmit(s);
	uint64_t fence = s->submitted + 1;
	struct step *st = &s->steps[(s->step_head + s->n_steps) % s->cfg.max_inflight];
	st->fence = fence;
	st->n = st->npg = st->ntk = 0;
	uint32_t budget = s->cfg.step_tokens;
	/* Snapshot the active list: preemption moves requests out of it. */
	uint32_t n = 0;
	for (struct req *r = s->active.head; r; r = r->next)
		s->scratch[n++] = r;
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t i = 0; i < n; i++) {
			struct req *r = s->scratch[i];
			if (r->inflight)
				continue;
			if (pass == 0 && r->phase == HEL_PHASE_RESTORE)
				plan_restore(s, st, r, fence);
			else if (pass == 0 && r->phase == HEL_PHASE_DECODE)
				plan_decode(s, st, r, fence, &budget);
			else if (pass == 1 && r->phase == HEL_PHASE_PREFILL)
				plan_prefill(s, st, r, fence, &budget);
		}
	if (!st->n)
		return 0;
	for (size_t i = 0; i < st->n; i++) {
		st->e[i].pages = st->pg + st->pg_off[i];
		st->e[i].tokens = st->tk + st->tk_off[i];
	}
	s->submitted = fence;
	hel_cache_submit_fence(s->c, fence);
	s->n_steps++;
	s->st.launches++;
	out->fence = fence;
	out->entries = st->e;
	out->n = st->n;
	return 1;
}

int hel_scheduler_complete_step(hel_scheduler *s, uint64_t fence, hel_step_result *results,
				size_t n)
{
	CHECK_ON_RETURN(s);
	if (!s->n_steps)
		return eos_fail(-EINVAL, "complete_step: no step in flight");
	struct step *st = &s->steps[s->step_head];
	if (st->fence != fence || st->n != n)
		return eos_fail(
			-EINVAL,
			"complete_step: fence %llu with %zu results, expected %llu with %zu",
			(unsigned long long)fence, n, (unsigned long long)st->fence, st->n);
	for (size_t i = 0; i < n; i++) {
		const hel_step_result *res = &results[i];
		const hel_step_entry *e = &st->e[i];
		if (res->n_more >= HEL_STEP_TOKENS_MAX ||
		    (res->n_more && (e->kind != HEL_ENTRY_DECODE || 1 + res->n_more > e->emit_max)))
			return eos_fail(-EINVAL,
					"complete_step: entry %zu emitted %u tokens, at most %u", i,
					1 + res->n_more, e->emit_max);
		const struct req *r = find_req(s, e->req);
		for (uint32_t t = 0; r && e->has_stop && t < res->n_more; t++)
			if ((t ? res->more[t - 1] : res->token) == r->stop)
				return eos_fail(-EINVAL,
						"complete_step: entry %zu emitted tokens after "
						"the stop token",
						i);
	}
	s->completed = fence;
	hel_cache_complete_fence(s->c, fence);
	for (size_t i = 0; i < n; i++) {
		const hel_step_entry *e = &st->e[i];
		hel_step_result *res = &results[i];
		res->finished = HEL_FINISH_NONE;
		res->terminal = HEL_CKPT_NONE;
		struct req *r = find_req(s, e->req);
		if (!r || r->inflight != fence)
			continue; /* cancelled meanwhile */
		r->inflight = 0;
		if (!e->sample)
			continue;
		hel_finish fin = HEL_FINISH_NONE;
		uint32_t n_tok = 1 + res->n_more;
		for (uint32_t t = 0; t < n_tok && fin == HEL_FINISH_NONE; t++) {
			sel_token tk = t ? res->more[t - 1] : res->token;
			if (r->n_tok < r->cap_tok && sel_history_append(&r->h, &tk, 1) == 0) {
				r->tok[r->n_tok++] = tk;
				r->n_gen++;
				if (r->has_stop && tk == r->stop)
					fin = HEL_FINISH_STOP;
				else if (r->n_gen >= r->max_tokens)
					fin = HEL_FINISH_LENGTH;
			} else {
				fin = HEL_FINISH_ERROR;
			}
		}
		s->st.decode_tokens += n_tok - 1;
		/* A round consumed every token it emitted but the last.  Should
		 * the history not hold them all (out of memory), the row is no
		 * checkpoint of it: no terminal (last_fence 0). */
		r->consumed += n_tok - 1;
		if (r->n_tok < r->consumed)
			r->last_fence = 0;
		if (fin == HEL_FINISH_NONE) {
			r->phase = HEL_PHASE_DECODE;
			continue;
		}
		res->terminal = to_terminal(s, r, false);
		res->finished = fin;
		list_del(&s->active, r);
		s->st.finished++;
		req_forget(s, r);
	}
	s->step_head = (s->step_head + 1) % s->cfg.max_inflight;
	s->n_steps--;
	return 0;
}

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

static uint32_t spec_caps_above(const hel_request_spec *spec, uint64_t c)
{
	uint32_t n = spec->prompt_len > c;
	for (size_t i = 0; i < spec->n_message_ends; i++)
		n += spec->message_ends[i] > c && spec->message_ends[i] < spec->prompt_len;
	return n;
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
		uint32_t left = 0;
		for (uint32_t i = 0; i < w->n_caps; i++)
			left += w->caps[i] > a;
		admission_pages(s, sel_history_len(&w->h), a, left, 0, false, &need_p, &need_r);
	} else if (next && validate_spec(s, next) == 0) { /* else admission fails it */
		if (spec_prefix(s, next, &A)) {           /* unknown prefix: charged whole */
			need_p = next->prompt_len / s->P;
			need_r = next->n_message_ends + 3ull;
		} else {
			uint64_t a = A ? A->key.consumed : 0;
			admission_pages(s, next->prompt_len, a, spec_caps_above(next, a), 0, false,
					&need_p, &need_r);
			/* A host hit adds a new ticket's row (its pages are the same
			 * len/P - a/P); the store is not asked from here. */
			need_r += next_host && a < next->prompt_len;
		}
	}
	if (A)
		pins[1] = A->id; /* admission pins its GPU prefix */
	return fits_pinned(s, need_p + decode, need_r, pins, 2);
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
		req_forget(s, r);
	}
	s->n_held = 0;
	while (s->active.head) {
		struct req *r = s->active.head;
		release_own(s, r);
		hel_cache_release_row(s->c, r->live_row);
		unpin_prefix(s, r);
		list_del(&s->active, r);
		req_forget(s, r);
	}
	hel_cache_drop_all(s->c);
	s->nq = 0;
	hel_notice drain[64];
	while (hel_scheduler_take_evictions(s, drain, 64, NULL))
		;
}

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
	uint64_t res_p, res_r, waiting_on_tickets, held;
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
	x->res_r += r->res_rows;
	if (sel_history_len(&r->h) != r->n_tok || r->n_tok != r->prompt_len + r->n_gen)
		FAIL("request %llu history %llu tokens, mirror %llu, prompt %llu + %u", id,
		     (unsigned long long)sel_history_len(&r->h), (unsigned long long)r->n_tok,
		     (unsigned long long)r->prompt_len, r->n_gen);
	if (l) {
		if (r->phase != HEL_PHASE_WAITING || r->live_row != HEL_NONE ||
		    r->prefix != HEL_CKPT_NONE || r->n_table || r->res_pages || r->res_rows ||
		    r->ticket || r->inflight)
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
	if (r->res_rows != r->n_caps - r->next_cap)
		FAIL("request %llu reserves %u rows for %u capture points", id, r->res_rows,
		     r->n_caps - r->next_cap);
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
	if (x->res_p != s->res_pages || x->res_r != s->res_rows)
		FAIL("reservations sum to %llu pages and %llu rows, totals %llu and %llu",
		     (unsigned long long)x->res_p, (unsigned long long)x->res_r,
		     (unsigned long long)s->res_pages, (unsigned long long)s->res_rows);
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
