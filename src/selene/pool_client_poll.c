/*
 * pool_client_poll.c - what the manager sent, turned into events: grants
 * checked against the pending claim or put they answer and made leases,
 * exports, lease statuses, answers to lookups, and the loss of a session
 * (every ticket, claim and put failed, every lease marked gone) (design
 * 2.15; pool_client.h sel_pool_poll).
 *
 * DESIGN
 *
 * sel_pool_poll takes the inbound queue's decoded messages under the mutex
 * and applies them on the worker thread.  A message of a lost session is
 * never applied to the new one's tables (epochs); a frame that names
 * nothing pending or live, or does not match what was asked, is refused and
 * counted (refused_frames), never trusted.  Claims time out here, at their
 * restore deadline, and a late grant for one is released.
 *
 * INVARIANTS
 *   1. Each pending claim or put produces exactly one event (granted,
 *      refused, timed out or lost).
 */
#include "pool_client_int.h"


static void refused(sel_pool_client *c) { c->st.refused_frames++; }

/* A claim grant against the pending claim: the chain's shape, the pages a
 * restore above its resident count needs, and the windows. */
static int grant_ok(sel_pool_client *c, const struct pending *p,
		    const struct sel_pool_m_claim_grant *g)
{
	uint32_t pt = c->g->page_tokens;
	if (g->source != p->source || !g->n_nodes)
		return eos_fail(SEL_EFORMAT, "pool grant: source %u or no nodes", g->source);
	const struct sel_pool_gnode *last = &g->nodes[g->n_nodes - 1];
	if (!sel_key_eq(&last->key, &p->key) || !last->has_row)
		return eos_fail(SEL_EFORMAT,
				"pool grant: the last node is not the claimed endpoint");
	if (g->base != p->resident / pt * pt ||
	    g->n_pages != p->key.consumed / pt - p->resident / pt)
		return eos_fail(SEL_EFORMAT,
				"pool grant: pages start at %" PRIu64 " tokens, %u pages "
				"(wanted from %" PRIu64 ")",
				g->base, g->n_pages, p->resident / pt * pt);
	uint64_t prev = 0;
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const struct sel_pool_gnode *n = &g->nodes[i];
		uint64_t cc = n->key.consumed;
		if (cc <= prev || cc <= p->resident || n->pages > n->tail ||
		    (i + 1 < g->n_nodes && n->has_row))
			return eos_fail(SEL_EFORMAT,
					"pool grant: node %u is out of order or oversized", i);
		if (i > 0 && (!sel_key_eq(&n->parent, &g->nodes[i - 1].key) ||
			      n->pages != n->tail || n->tail != cc / pt - prev / pt))
			return eos_fail(SEL_EFORMAT, "pool grant: node %u does not extend node %u",
					i, i - 1);
		if (i == 0 && (cc / pt < n->tail || cc / pt - n->tail > p->resident / pt ||
			       n->pages != cc / pt - p->resident / pt))
			return eos_fail(SEL_EFORMAT,
					"pool grant: the first node's pages do not start at the "
					"resident page");
		prev = cc;
	}
	return pc_windows_ok(c, g->windows, g->n_windows, g->n_pages, c->lay.row_slots);
}

static void on_claim_grant(sel_pool_client *c, struct qmsg *q)
{
	struct sel_pool_m_claim_grant *g = &q->m.u.grant;
	struct pending *p = pc_pending_find(c, g->claim, true);
	if (!p || p->dead || pc_lease_find(c, g->lease)) {
		/* Not ours, or too late: release it so nothing stays reserved. */
		refused(c);
		pc_send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce,
			   p ? SEL_POOL_CANCELLED : SEL_POOL_FORGED);
		if (p && p->dead)
			pc_pending_drop(c, p);
		return;
	}
	if (grant_ok(c, p, g)) {
		refused(c);
		pc_send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_BAD_REQUEST);
		pc_emit(c, SEL_POOL_EV_CLAIM_FAILED, SEL_POOL_BAD_REQUEST, p->id, &p->key, NULL,
			NULL);
		c->st.claims_failed++;
		pc_pending_drop(c, p);
		return;
	}
	struct lease *l = pc_lease_new(c, SEL_POOL_CLAIM, g->lease, g->nonce, g->deadline_ms,
				       g->windows, g->n_windows, g->n_pages, c->lay.row_slots);
	if (!l) {
		pc_send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_CANCELLED);
		pc_emit(c, SEL_POOL_EV_CLAIM_FAILED, SEL_POOL_NO_ROOM, p->id, &p->key, NULL, NULL);
		c->st.claims_failed++;
		pc_pending_drop(c, p);
		return;
	}
	l->pub.request = p->id;
	l->pub.source = g->source;
	l->pub.key = p->key;
	l->pub.base = g->base;
	l->pub.n_nodes = g->n_nodes;
	l->pub.nodes = g->nodes;
	l->pub.page_cksum = g->page_cksum;
	l->pub.row_cksum = g->row_cksum;
	l->msg = q->m; /* the lease owns the arrays now */
	q->m.mem = NULL;
	/* The claim's slot moves from pending to the lease. */
	eos_hmap_remove(&c->pendings, &p->hn);
	plist_del(&c->claims, p);
	free(p);
	c->st.claims_granted++;
	pc_emit(c, SEL_POOL_EV_CLAIM_GRANTED, SEL_POOL_OK, l->pub.request, &l->pub.key, &l->pub,
		NULL);
}

static void on_put_grant(sel_pool_client *c, struct qmsg *q)
{
	struct sel_pool_m_put_grant *g = &q->m.u.put_grant;
	struct pending *p = pc_pending_find(c, g->put, false);
	if (!p || pc_lease_find(c, g->lease)) {
		refused(c);
		pc_send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_FORGED);
		return;
	}
	struct lease *l = NULL;
	if (pc_windows_ok(c, g->windows, g->n_windows, p->tail, c->lay.row_slots) ||
	    !(l = pc_lease_new(c, SEL_POOL_PUT, g->lease, g->nonce, g->deadline_ms, g->windows,
			       g->n_windows, p->tail, c->lay.row_slots))) {
		if (!l)
			refused(c);
		pc_send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_BAD_REQUEST);
		pc_emit(c, SEL_POOL_EV_PUT_REFUSED, SEL_POOL_BAD_REQUEST, p->id, &p->key, NULL,
			NULL);
		c->st.puts_refused++;
		pc_pending_drop(c, p);
		return;
	}
	l->pub.request = p->id;
	l->pub.key = p->key;
	eos_hmap_remove(&c->pendings, &p->hn);
	free(p);
	c->st.puts_granted++;
	pc_emit(c, SEL_POOL_EV_PUT_GRANTED, SEL_POOL_OK, l->pub.request, &l->pub.key, &l->pub,
		NULL);
}

static void on_export(sel_pool_client *c, struct qmsg *q)
{
	struct sel_pool_m_export_request *e = &q->m.u.export_req;
	uint32_t pt = c->g->page_tokens;
	uint64_t chain = e->key.consumed / pt;
	c->st.exports++;
	if (pc_lease_find(c, e->lease)) {
		refused(c);
		return; /* a second request under a live lease's id: ignore it */
	}
	uint32_t rows = e->row ? c->lay.row_slots : 0;
	struct lease *l = NULL;
	if (!e->key.consumed || e->start_page > chain || e->n_pages != chain - e->start_page ||
	    pc_windows_ok(c, e->windows, e->n_windows, e->n_pages, rows) ||
	    !(l = pc_lease_new(c, SEL_POOL_EXPORT, e->lease, e->nonce, e->deadline_ms, e->windows,
			       e->n_windows, e->n_pages, rows))) {
		refused(c);
		pc_send_ls(c, SEL_POOL_C_EXPORT_REPLY, e->lease, e->nonce, SEL_POOL_BAD_REQUEST);
		c->st.exports_refused++;
		return;
	}
	l->pub.source = e->source;
	l->pub.key = e->key;
	l->pub.generation = e->generation;
	l->pub.start_page = e->start_page;
	l->pub.base = (uint64_t)e->start_page * pt;
	pc_emit(c, SEL_POOL_EV_EXPORT, SEL_POOL_OK, 0, &l->pub.key, &l->pub, NULL);
}

static void on_lease_status(sel_pool_client *c, struct qmsg *q)
{
	const struct sel_pool_lease_status *s = &q->m.u.ls;
	struct lease *l = pc_lease_find(c, s->lease);
	if (!l || l->nonce != s->nonce) {
		refused(c);
		return;
	}
	switch (q->m.type) {
	case SEL_POOL_M_PUT_RESULT:
		if (!l->committed) {
			refused(c);
			return;
		}
		if (s->status == SEL_POOL_OK)
			c->st.puts_accepted++;
		else
			c->st.puts_rejected++;
		pc_emit(c, SEL_POOL_EV_PUT_RESULT, s->status, l->pub.request, &l->pub.key, NULL,
			NULL);
		pc_lease_end(c, l);
		return;
	case SEL_POOL_M_EXPORT_CANCEL:
		if (l->pub.kind != SEL_POOL_EXPORT) {
			refused(c);
			return;
		}
		pc_emit(c, SEL_POOL_EV_EXPORT_CANCEL, s->status, 0, &l->pub.key, &l->pub, NULL);
		return;
	case SEL_POOL_M_LEASE_FAILED:
		if (l->committed) {
			refused(c);
			return;
		}
		if (!l->pub.failed) {
			l->pub.failed = s->status ? s->status : SEL_POOL_TIMEOUT;
			c->st.leases_failed++;
			pc_emit(c, SEL_POOL_EV_LEASE_FAILED, l->pub.failed, l->pub.request,
				&l->pub.key, &l->pub, NULL);
		}
		return;
	default: return;
	}
}

static void on_msg(sel_pool_client *c, struct qmsg *q)
{
	c->st.frames_in++;
	switch (q->m.type) {
	case SEL_POOL_M_ANSWER: {
		sel_pool_ticket *t = pc_ticket_find(c, q->m.u.answer.ticket);
		if (!t || t->epoch != c->epoch || t->state != SEL_POOL_TICKET_PENDING) {
			c->st.answers_dropped++;
			return;
		}
		t->ans = q->m;
		q->m.mem = NULL;
		t->state = SEL_POOL_TICKET_READY;
		c->st.answers++;
		pc_emit(c, SEL_POOL_EV_ANSWER, SEL_POOL_OK, t->id, NULL, NULL, t);
		return;
	}
	case SEL_POOL_M_CLAIM_GRANT: on_claim_grant(c, q); return;
	case SEL_POOL_M_CLAIM_REFUSED:
	case SEL_POOL_M_PUT_REFUSED: {
		bool claim = q->m.type == SEL_POOL_M_CLAIM_REFUSED;
		struct pending *p = pc_pending_find(c, q->m.u.refused.id, claim);
		if (!p) {
			refused(c);
			return;
		}
		if (!p->dead) {
			pc_emit(c, claim ? SEL_POOL_EV_CLAIM_FAILED : SEL_POOL_EV_PUT_REFUSED,
				q->m.u.refused.reason, p->id, &p->key, NULL, NULL);
			if (claim)
				c->st.claims_failed++;
			else
				c->st.puts_refused++;
		}
		pc_pending_drop(c, p);
		return;
	}
	case SEL_POOL_M_PUT_GRANT: on_put_grant(c, q); return;
	case SEL_POOL_M_EXPORT_REQUEST: on_export(c, q); return;
	case SEL_POOL_M_PUT_RESULT:
	case SEL_POOL_M_EXPORT_CANCEL:
	case SEL_POOL_M_LEASE_FAILED: on_lease_status(c, q); return;
	case SEL_POOL_M_ERROR: c->st.manager_errors++; return;
	default:
		refused(c); /* hellos after the handshake, client types */
		return;
	}
}

/* The session ended: fail what waits for it, report every live lease. */
static void on_lost(sel_pool_client *c)
{
	c->state = SEL_POOL_DETACHED;
	c->st.detaches++;
	for (size_t i = 0; i <= c->tickets.mask; i++)
		for (struct eos_hnode *x = c->tickets.b[i]; x; x = x->next) {
			sel_pool_ticket *t = CONTAINER(x, sel_pool_ticket, hn);
			if (t->state == SEL_POOL_TICKET_PENDING)
				t->state = SEL_POOL_TICKET_FAILED;
		}
	for (size_t i = 0; i <= c->pendings.mask; i++)
		for (struct eos_hnode *x = c->pendings.b[i], *nx; x; x = nx) {
			nx = x->next;
			struct pending *p = CONTAINER(x, struct pending, hn);
			if (!p->dead)
				pc_emit(c,
					p->is_claim ? SEL_POOL_EV_CLAIM_FAILED
						    : SEL_POOL_EV_PUT_REFUSED,
					SEL_POOL_GONE, p->id, &p->key, NULL, NULL);
			pc_pending_drop(c, p);
		}
	for (size_t i = 0; i <= c->leases.mask; i++)
		for (struct eos_hnode *x = c->leases.b[i], *nx; x; x = nx) {
			nx = x->next;
			struct lease *l = CONTAINER(x, struct lease, hn);
			if (l->committed) {
				pc_emit(c, SEL_POOL_EV_PUT_RESULT, SEL_POOL_GONE, l->pub.request,
					&l->pub.key, NULL, NULL);
				pc_lease_end(c, l);
				continue;
			}
			if (!l->pub.failed) {
				l->pub.failed = SEL_POOL_GONE;
				c->st.leases_failed++;
			}
			pc_emit(c, SEL_POOL_EV_LEASE_FAILED, SEL_POOL_GONE, l->pub.request,
				&l->pub.key, &l->pub, NULL);
		}
	pc_emit(c, SEL_POOL_EV_DETACHED, SEL_POOL_GONE, 0, NULL, NULL, NULL);
	pc_maybe_drained(c);
}

static void expire_claims(sel_pool_client *c, uint64_t now)
{
	for (struct pending *p = c->claims.head, *nx; p; p = nx) {
		nx = p->next;
		if (!p->dead && now >= p->deadline_ns) {
			p->dead = true; /* a late grant is released on arrival */
			c->st.claims_failed++;
			pc_emit(c, SEL_POOL_EV_CLAIM_FAILED, SEL_POOL_TIMEOUT, p->id, &p->key, NULL,
				NULL);
		}
	}
}

int sel_pool_poll(sel_pool_client *c, struct sel_pool_event *ev, size_t cap)
{
	pc_drain_fd(c->wake_worker);
	if (c->evq.n < cap) {
		pthread_mutex_lock(&c->mu);
		struct qmsg *q = c->in_head;
		c->in_head = c->in_tail = NULL;
		c->in_bytes = 0;
		bool paused = c->in_paused;
		pthread_mutex_unlock(&c->mu);
		if (paused)
			pc_wake(c->wake_io);
		while (q) {
			struct qmsg *nx = q->next;
			switch (q->kind) {
			case Q_MSG:
				if (q->epoch == c->epoch && c->state == SEL_POOL_ATTACHED)
					on_msg(c, q);
				break;
			case Q_LOST:
				if (q->epoch == c->epoch && c->state == SEL_POOL_ATTACHED)
					on_lost(c);
				break;
			case Q_ATTACHED:
				c->epoch = q->epoch;
				c->state = SEL_POOL_ATTACHED;
				c->st.sessions++;
				pc_emit(c, SEL_POOL_EV_ATTACHED, SEL_POOL_OK, 0, NULL, NULL, NULL);
				break;
			case Q_DISABLED:
				c->state = SEL_POOL_DISABLED;
				pc_emit(c, SEL_POOL_EV_DISABLED, SEL_POOL_GONE, 0, NULL, NULL,
					NULL);
				break;
			}
			sel_pool_msg_free(&q->m);
			free(q);
			q = nx;
		}
		expire_claims(c, eos_now_coarse_ns());
	}
	size_t n = 0;
	while (n < cap && c->evq.n) {
		ev[n++] = c->evq.v[c->evq.head];
		c->evq.head = (c->evq.head + 1) % c->evq.cap;
		c->evq.n--;
	}
	if (c->evq.n)
		pc_wake(c->wake_worker);
	return (int)n;
}
