/*
 * scheduler_int.h - what the files of the scheduler share (scheduler.h is
 * the contract; scheduler.c has the design and the invariants): the
 * request, ticket and step structs, the scheduler's struct, the lookups
 * by id and key, the debug-build check on return, and the calls the steps
 * and the publications make into scheduler.c.  Private to scheduler.c,
 * scheduler_step.c, scheduler_publish.c and scheduler_check.c.
 */
#ifndef HEL_SCHEDULER_INT_H
#define HEL_SCHEDULER_INT_H

#include <stdio.h>
#include <stdlib.h>

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
	uint32_t res_pages; /* capture rows are taken at the capture, never reserved */
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
	uint64_t res_pages;
	hel_scheduler_stats st;
};

EOS_DLIST_DEFINE(list, struct rlist, struct req)

static inline struct req *find_req(const hel_scheduler *s, hel_req_id id)
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

static inline struct ticket *find_ticket(const hel_scheduler *s, const sel_key *key)
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
static inline void check_on_return(hel_scheduler **sp)
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

/* Design 2.15 admission_pages: what admission reserves and pops for a
 * request of len tokens admitted at depth c (its GPU prefix, or an
 * inbound hit's end): the pages of its history past c and a new ticket's
 * tpages, one live row and a new ticket's row.  Capture points reserve
 * no row (a deviation from design 2.7, docs/architecture.md): each
 * capture takes a snapshot row when it happens, evicting for it, and is
 * skipped (captures_failed) when none can be had.  Reserving them made a
 * copy-out pin on a finished request's checkpoint refuse the next
 * prompt's admission outright (docs/performance.md, isolation), where now
 * only that prompt's captures may go without.  sch_place() and
 * export_fits both use it. */
static inline void admission_pages(const hel_scheduler *s, uint64_t len, uint64_t c,
				   uint32_t tpages, bool create, uint64_t *need_p, uint64_t *need_r)
{
	*need_p = len / s->P - c / s->P + tpages;
	*need_r = 1 + (create ? 1 : 0);
}


/* ---- scheduler.c's calls for the other files ------------------------------------ */

/* Reservations, offers, eviction, allocation (scheduler.c has each one's
 * rules). */
void sch_offer(hel_scheduler *s, uint64_t id);
int sch_ensure(hel_scheduler *s, uint32_t np, uint32_t nr);
bool sch_fits_pinned(hel_scheduler *s, uint64_t need_p, uint64_t need_r, const uint64_t *pins,
		     size_t n_pins);

/* Request lifecycle. */
uint64_t sch_to_terminal(hel_scheduler *s, struct req *r, bool preempted);
void sch_req_forget(hel_scheduler *s, struct req *r);
uint32_t sch_get_pages(hel_scheduler *s, struct req *r, uint32_t want, bool allow_preempt);
void sch_unget_pages(hel_scheduler *s, struct req *r, uint32_t n, uint32_t res);

/* Admission. */
int sch_validate_spec(const hel_scheduler *s, const hel_request_spec *sp);
int sch_place(hel_scheduler *s, struct req *r, const hel_ckpt *A, const sel_hit *hit,
	      hel_admission *out);

#endif
