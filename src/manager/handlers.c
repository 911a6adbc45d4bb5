/*
 * handlers.c - the pool manager's protocol handlers: one per client frame
 * (design 2.15; pool_proto.h; docs/pool.md "Protocol"), called by
 * mgr_dispatch for each frame session.c's input decodes.
 *
 * DESIGN
 *
 * Before the hello only a hello is taken; the welcome answers it and
 * refuses (then closes) what the manager cannot serve.  After it each
 * frame goes to its handler: holdings and lookups against the scope's
 * catalogue, claims from the arena or from a holder (an export lease),
 * puts and their commits, export replies and completions, releases and
 * progress.  A frame that names a lease or request the session does not
 * hold is a strike (a non-fatal M_ERROR); the 65th closes the session.
 * Handlers only queue output (mgr_send) and mark sessions to close
 * (mgr_kill); session.c closes them at the end of the loop's turn.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manager/session.h"

#define MS_NS 1000000ull
#define MAX_STRIKES 64u

/* A frame that names something s does not hold. */
static void strike(struct mgr_session *s, uint32_t why, uint16_t about, const char *what,
		   uint64_t id)
{
	s->srv->st.refused[why]++;
	if (++s->strikes > MAX_STRIKES) {
		s->srv->st.disconnects_protocol++;
		mgr_send_error(s, why, about, true,
			       "%u frames named leases or requests it does not hold", s->strikes);
		return;
	}
	mgr_send_error(s, why, about, false, "%s %" PRIu64 " is %s", what, id,
		       why == SEL_POOL_STALE ? "no longer valid" : "not one this session holds");
}

/* ---- the welcome ----------------------------------------------------------------------------- */

static void welcome(struct mgr_session *s, uint32_t status, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void welcome(struct mgr_session *s, uint32_t status, const char *fmt, ...)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_WELCOME};
	m.u.welcome.status = status;
	m.u.welcome.session = status ? 0 : s->id;
	m.u.welcome.recovering = s->srv->recovering;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m.u.welcome.text, sizeof m.u.welcome.text, fmt, ap);
	va_end(ap);
	mgr_send(s, &m);
	if (status) {
		s->srv->st.hellos_refused[status]++;
		mgr_kill(s, m.u.welcome.text);
	}
}

static void on_hello(struct mgr_session *s, const struct sel_pool_c_hello *h)
{
	struct mgr_server *srv = s->srv;
	if (h->version != SEL_POOL_VERSION) {
		welcome(s, SEL_POOL_VERSION_MISMATCH, "protocol version %u; this manager speaks %u",
			h->version, SEL_POOL_VERSION);
		return;
	}
	const struct sel_pool_scope *sc = &h->scope;
	uint64_t data = srv->arena.bytes - srv->arena.data_start;
	if (!sc->page_tokens || sc->page_tokens % SEL_BUCKET_TOKENS || !sc->ranks ||
	    sc->ranks > 4096 || !sc->slot_bytes || sc->slot_bytes % MGR_GRANULE || !sc->row_slots ||
	    !sc->table_bytes) {
		welcome(s, SEL_POOL_SCOPE,
			"scope: page tokens %u, ranks %u, slot bytes %" PRIu64
			", row slots %u, table %u bytes are not a record layout",
			sc->page_tokens, sc->ranks, sc->slot_bytes, sc->row_slots, sc->table_bytes);
		return;
	}
	if (((uint64_t)sc->row_slots + 1) * sc->slot_bytes > data) {
		welcome(s, SEL_POOL_SCOPE,
			"scope: one record of %" PRIu64 "-byte slots (%u for the row) "
			"does not fit the arena's %" PRIu64 " bytes",
			sc->slot_bytes, sc->row_slots, data);
		return;
	}
	for (struct mgr_session *o = srv->sessions; o; o = o->next) {
		if (o == s || o->state != MGR_ACTIVE ||
		    memcmp(o->instance, h->instance, SEL_POOL_ID_BYTES))
			continue;
		if (o->pid == s->pid && o->pid_start == s->pid_start &&
		    (h->flags & SEL_POOL_HELLO_DRAINED)) {
			/* This process lost that connection and drained its copies. */
			o->superseded = true;
			mgr_kill(o, "replaced by a new session of the same instance");
			continue;
		}
		welcome(s, SEL_POOL_DUPLICATE, "instance id already attached by pid %d",
			(int)o->pid);
		return;
	}
	struct mgr_scope *scope = mgr_scope_ref(&srv->cat, srv->o.name, sc);
	if (!scope) {
		welcome(s, SEL_POOL_TOO_MANY, "no room for another scope (--max-scopes %u)",
			srv->o.max_scopes);
		return;
	}
	s->scope = scope;
	memcpy(s->instance, h->instance, SEL_POOL_ID_BYTES);
	s->state = MGR_ACTIVE;
	s->id = ++srv->next_session;
	srv->st.sessions_total++;
	if (h->flags & SEL_POOL_HELLO_DRAINED)
		mgr_quarantine_release(srv, s->instance, s->pid, s->pid_start);
	if (srv->recovering && h->generation == srv->arena.generation)
		for (uint32_t i = 0; i < srv->arena.n_prev; i++) {
			struct mgr_prev *p = &srv->arena.prev[i];
			if (!p->done && !memcmp(p->instance, s->instance, SEL_POOL_ID_BYTES) &&
			    p->pid == s->pid && p->start == s->pid_start &&
			    (h->flags & SEL_POOL_HELLO_DRAINED))
				p->done = true;
		}
	/* In the arena header before the welcome: a manager restarted after
	 * a crash must know of every client that may be copying. */
	mgr_sessions_write(srv);
	welcome(s, SEL_POOL_OK, "%s", "");
}

/* ---- holdings and lookups -------------------------------------------------------------------- */

static void on_holdings(struct mgr_session *s, const struct sel_pool_msg *m)
{
	struct mgr_server *srv = s->srv;
	const struct sel_pool_c_holdings *h = &m->u.holdings;
	if (m->type == SEL_POOL_C_WITHDRAW) {
		for (uint32_t i = 0; i < h->n; i++)
			mgr_hold_withdraw(&srv->cat, s->scope, s, &s->holds, &h->h[i]);
		return;
	}
	uint32_t full = 0, bad = 0;
	for (uint32_t i = 0; i < h->n; i++) {
		if (s->holds.n >= srv->o.max_holdings ||
		    srv->cat.holds >= srv->o.max_holdings_total) {
			full++;
			continue;
		}
		if (mgr_hold_add(&srv->cat, s->scope, s, &s->holds, &h->h[i]))
			bad++;
	}
	if (full) {
		srv->st.refused[SEL_POOL_FULL] += full;
		mgr_send_error(s, SEL_POOL_FULL, m->type, false,
			       "%u holdings dropped: at most %u per "
			       "session and %" PRIu64 " in all",
			       full, srv->o.max_holdings, srv->o.max_holdings_total);
	}
	if (bad) {
		srv->st.refused[SEL_POOL_BAD_REQUEST] += bad;
		mgr_send_error(s, SEL_POOL_BAD_REQUEST, m->type, false,
			       "%u holdings refused: no tokens, "
			       "or a key filed under another bucket",
			       bad);
	}
}

static void on_lookup(struct mgr_session *s, const struct sel_pool_c_lookup *l)
{
	struct mgr_server *srv = s->srv;
	struct sel_pool_msg a;
	if (l->resident >= l->limit || !l->n) {
		srv->st.refused[SEL_POOL_BAD_REQUEST]++;
		a = (struct sel_pool_msg){.type = SEL_POOL_M_ANSWER};
		a.u.answer.ticket = l->ticket;
		mgr_send(s, &a);
		return;
	}
	if (mgr_catalog_answer(&srv->cat, s->scope, s, l, eos_now_ns(), &a)) {
		a = (struct sel_pool_msg){.type = SEL_POOL_M_ANSWER};
		a.u.answer.ticket = l->ticket;
	}
	mgr_send(s, &a);
	sel_pool_msg_free(&a);
}

/* ---- claims ------------------------------------------------------------------------------------ */

static void refuse_claim(struct mgr_session *s, uint64_t claim, uint32_t reason)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_CLAIM_REFUSED};
	m.u.refused = (struct sel_pool_m_refused){claim, reason};
	s->srv->st.claims_refused[reason]++;
	mgr_send(s, &m);
}

/* The part of window list w (nw) after its first `skip` slots. */
static uint32_t trim(const struct sel_pool_window *w, uint32_t nw, uint8_t kind, uint32_t skip,
		     uint64_t sb, struct sel_pool_window *out)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < nw; i++) {
		if (w[i].kind != kind)
			continue;
		if (skip >= w[i].slots) {
			skip -= w[i].slots;
			continue;
		}
		out[n++] = (struct sel_pool_window){w[i].off + skip * sb, w[i].slots - skip, kind};
		skip = 0;
	}
	return n;
}

static void claim_arena(struct mgr_session *s, const struct sel_pool_c_claim *c)
{
	struct mgr_server *srv = s->srv;
	struct mgr_scope *sc = s->scope;
	uint64_t now = eos_now_ns();
	struct mgr_record **chain = malloc(SEL_POOL_MAX_NODES * sizeof(struct mgr_record *));
	if (!chain) {
		refuse_claim(s, c->claim, SEL_POOL_NO_ROOM);
		return;
	}
	uint32_t n;
	uint64_t base;
	uint32_t why = mgr_catalog_chain(&srv->cat, sc, &c->key, c->resident, now, chain,
					 SEL_POOL_MAX_NODES, &n, &base);
	uint32_t pt = sc->s.page_tokens, rs = sc->s.row_slots;
	uint64_t sb = sc->s.slot_bytes;
	uint64_t pages = c->key.consumed / pt - c->resident / pt;
	uint32_t windows = 0;
	if (!why) {
		for (uint32_t i = 0; i < n; i++)
			windows += chain[i]->nw;
		if (pages > SEL_POOL_MAX_PAGES || windows > SEL_POOL_MAX_WINDOWS)
			why = SEL_POOL_OVERSIZE;
	}
	struct sel_pool_msg m = {.type = SEL_POOL_M_CLAIM_GRANT};
	struct sel_pool_m_claim_grant *g = &m.u.grant;
	struct mgr_lease *l = NULL;
	if (!why) {
		g->nodes = calloc(n, sizeof *g->nodes);
		g->windows = calloc(windows ? windows : 1, sizeof *g->windows);
		g->page_cksum = calloc(pages ? pages : 1, sizeof *g->page_cksum);
		l = mgr_lease_new(srv, MGR_L_CLAIM, s);
		if (!g->nodes || !g->windows || !g->page_cksum || !l ||
		    !(l->pins = malloc(n * sizeof(struct mgr_record *))))
			why = SEL_POOL_NO_ROOM;
	}
	if (why) {
		if (l)
			mgr_lease_free(srv, l);
		free(g->nodes);
		free(g->windows);
		free(g->page_cksum);
		free(chain);
		refuse_claim(s, c->claim, why);
		return;
	}
	/* Pages: the first node's after the resident page, every later node's. */
	uint32_t skip =
		chain[0]->tail - (uint32_t)(chain[0]->e->key.consumed / pt - c->resident / pt);
	uint32_t np = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct mgr_record *r = chain[i];
		uint32_t sk = i == 0 ? skip : 0;
		g->nodes[i] = (struct sel_pool_gnode){r->e->key, r->parent_key, r->e->bucket,
						      r->tail,   r->tail - sk,  i + 1 == n};
		g->n_windows +=
			trim(r->w, r->nw, SEL_POOL_WIN_PAGES, sk, sb, g->windows + g->n_windows);
		for (uint32_t k = sk; k < r->tail; k++)
			g->page_cksum[np++] = r->cksum[k];
		mgr_record_pin(r);
		mgr_record_touch(&srv->cat, r, now);
		l->pins[l->npins++] = r;
	}
	struct mgr_record *end = chain[n - 1];
	g->n_windows += trim(end->w, end->nw, SEL_POOL_WIN_ROW, 0, sb, g->windows + g->n_windows);
	g->claim = c->claim;
	g->lease = l->id;
	g->nonce = l->nonce;
	g->source = SEL_POOL_SRC_ARENA;
	g->base = c->resident / pt * pt;
	g->n_nodes = n;
	g->n_pages = np;
	g->row_cksum = end->row_cksum;
	l->bytes = ((uint64_t)np + rs) * sb;
	g->deadline_ms = sel_pool_deadline_ms(c->setup_ms, srv->o.setup_limit_ms, l->bytes);
	l->deadline_ns = now + (uint64_t)g->deadline_ms * MS_NS;
	l->slot_bytes = sb;
	l->progress_ns = now;
	srv->st.claims_granted[SEL_POOL_SRC_ARENA]++;
	srv->st.bytes_granted += l->bytes;
	(void)base;
	mgr_send(s, &m);
	free(g->nodes);
	free(g->windows);
	free(g->page_cksum);
	free(chain);
}

static void claim_holder(struct mgr_session *s, const struct sel_pool_c_claim *c)
{
	struct mgr_server *srv = s->srv;
	struct mgr_scope *sc = s->scope;
	uint32_t pt = sc->s.page_tokens, rs = sc->s.row_slots;
	if (srv->recovering) {
		refuse_claim(s, c->claim, SEL_POOL_RECOVERING);
		return;
	}
	struct mgr_hold *h = mgr_hold_find(sc, &c->key, c->holder, c->source);
	if (!h) {
		refuse_claim(s, c->claim, SEL_POOL_NOT_FOUND);
		return;
	}
	struct mgr_session *holder = h->s;
	uint32_t why = 0;
	uint64_t pages = c->key.consumed / pt - c->resident / pt;
	if (holder == s || c->key.consumed <= c->resident)
		why = SEL_POOL_BAD_REQUEST;
	else if (h->generation != c->generation)
		why = SEL_POOL_GENERATION_CHANGED;
	else if (holder->n_exports >= srv->o.max_exports || holder->state != MGR_ACTIVE)
		why = SEL_POOL_BUSY;
	else if (pages > SEL_POOL_MAX_PAGES)
		why = SEL_POOL_OVERSIZE;
	struct sel_pool_window *w = NULL;
	uint32_t nw = 0;
	if (!why && mgr_catalog_alloc(&srv->cat, sc, (uint32_t)pages, rs, &w, &nw))
		why = SEL_POOL_NO_ROOM;
	struct mgr_lease *l = NULL;
	if (!why && !(l = mgr_lease_new(srv, MGR_L_EXPORT, holder))) {
		mgr_arena_free(&srv->arena, w, nw, sc->s.slot_bytes);
		why = SEL_POOL_NO_ROOM;
	}
	if (why) {
		free(w);
		refuse_claim(s, c->claim, why);
		return;
	}
	uint64_t now = eos_now_ns();
	l->slot_bytes = sc->s.slot_bytes;
	l->w = w;
	l->nw = nw;
	l->req = s;
	l->req_claim = c->claim;
	l->req_setup_ms = c->setup_ms;
	l->source = c->source;
	l->key = c->key;
	l->bucket = h->e->bucket;
	l->generation = c->generation;
	l->start_page = (uint32_t)(c->resident / pt);
	l->pages = (uint32_t)pages;
	l->bytes = (pages + rs) * sc->s.slot_bytes;
	uint32_t ms = sel_pool_deadline_ms(c->setup_ms, srv->o.setup_limit_ms, l->bytes);
	l->deadline_ns = now + (uint64_t)ms * MS_NS;
	l->progress_ns = now;
	l->rnext = s->awaiting;
	if (s->awaiting)
		s->awaiting->rprev = l;
	s->awaiting = l;
	s->n_claims++;
	struct sel_pool_msg m = {.type = SEL_POOL_M_EXPORT_REQUEST};
	m.u.export_req = (struct sel_pool_m_export_request){.lease = l->id,
							    .nonce = l->nonce,
							    .deadline_ms = ms,
							    .source = l->source,
							    .key = l->key,
							    .generation = l->generation,
							    .start_page = l->start_page,
							    .n_pages = l->pages,
							    .row = 1,
							    .n_windows = nw,
							    .windows = w};
	srv->st.exports_requested++;
	mgr_send(holder, &m);
}

static void on_claim(struct mgr_session *s, const struct sel_pool_c_claim *c)
{
	if (s->n_claims >= s->srv->o.max_claims) {
		refuse_claim(s, c->claim, SEL_POOL_BUSY);
		return;
	}
	if (c->source == SEL_POOL_SRC_ARENA)
		claim_arena(s, c);
	else
		claim_holder(s, c);
}

/* ---- puts -------------------------------------------------------------------------------------- */

static void refuse_put(struct mgr_session *s, uint64_t put, uint32_t reason)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_PUT_REFUSED};
	m.u.refused = (struct sel_pool_m_refused){put, reason};
	s->srv->st.puts_refused[reason]++;
	mgr_send(s, &m);
}

static void on_put(struct mgr_session *s, const struct sel_pool_c_put *p)
{
	struct mgr_server *srv = s->srv;
	struct mgr_scope *sc = s->scope;
	if (s->n_puts >= srv->o.max_puts) {
		refuse_put(s, p->put, SEL_POOL_BUSY);
		return;
	}
	if (srv->recovering) {
		refuse_put(s, p->put, SEL_POOL_RECOVERING);
		return;
	}
	struct mgr_record *r;
	uint32_t why = mgr_record_begin(&srv->cat, sc, p, &r);
	if (why) {
		refuse_put(s, p->put, why);
		return;
	}
	struct sel_pool_window *w;
	uint32_t nw;
	struct mgr_lease *l = NULL;
	if (mgr_catalog_alloc(&srv->cat, sc, p->tail, sc->s.row_slots, &w, &nw) ||
	    !(l = mgr_lease_new(srv, MGR_L_PUT, s))) {
		if (!l && w)
			mgr_arena_free(&srv->arena, w, nw, sc->s.slot_bytes);
		struct sel_pool_window *x;
		uint32_t nx;
		mgr_record_abort(&srv->cat, r, &x, &nx);
		refuse_put(s, p->put, SEL_POOL_NO_ROOM);
		return;
	}
	uint64_t now = eos_now_ns();
	l->rec = r;
	l->w = w;
	l->nw = nw;
	l->slot_bytes = sc->s.slot_bytes;
	l->key = p->key;
	l->bytes = r->bytes;
	uint32_t ms = sel_pool_deadline_ms(p->setup_ms, srv->o.setup_limit_ms, l->bytes);
	l->deadline_ns = now + (uint64_t)ms * MS_NS;
	l->progress_ns = now;
	struct sel_pool_msg m = {.type = SEL_POOL_M_PUT_GRANT};
	m.u.put_grant = (struct sel_pool_m_put_grant){p->put, l->id, l->nonce, ms, nw, w};
	srv->st.puts_granted++;
	mgr_send(s, &m);
}

static void put_result(struct mgr_session *s, struct mgr_lease *l, uint32_t status)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_PUT_RESULT};
	m.u.ls = (struct sel_pool_lease_status){l->id, l->nonce, status};
	if (status)
		s->srv->st.puts_rejected[status]++;
	else
		s->srv->st.puts_accepted++;
	mgr_send(s, &m);
}

static void on_commit(struct mgr_session *s, const struct sel_pool_c_cksums *c)
{
	struct mgr_server *srv = s->srv;
	uint32_t why;
	struct mgr_lease *l = mgr_lease_get(srv, s, c->lease, c->nonce, MGR_L_PUT, &why);
	if (!l) {
		strike(s, why, SEL_POOL_C_COMMIT, "put lease", c->lease);
		return;
	}
	if (l->state == MGR_L_FAILED || !l->rec) {
		put_result(s, l, SEL_POOL_TIMEOUT);
		mgr_lease_free(srv, l);
		return;
	}
	mgr_record_set_windows(l->rec, l->w, l->nw);
	why = mgr_record_commit(&srv->cat, l->rec, c->page_cksum, c->n, c->row_cksum, eos_now_ns());
	if (why) {
		mgr_record_set_windows(l->rec, NULL, 0);
		put_result(s, l, why);
		mgr_lease_free(srv, l); /* aborts the record, frees the windows */
		return;
	}
	l->rec = NULL; /* the record owns the windows now */
	l->w = NULL;
	l->nw = 0;
	put_result(s, l, SEL_POOL_OK);
	mgr_lease_free(srv, l);
}

/* ---- exports ----------------------------------------------------------------------------------- */

static void on_export_reply(struct mgr_session *s, const struct sel_pool_lease_status *r)
{
	struct mgr_server *srv = s->srv;
	uint32_t why;
	struct mgr_lease *l = mgr_lease_get(srv, s, r->lease, r->nonce, MGR_L_EXPORT, &why);
	if (!l) {
		strike(s, why, SEL_POOL_C_EXPORT_REPLY, "export lease", r->lease);
		return;
	}
	if (r->status == SEL_POOL_OK) {
		if (l->state == MGR_L_ACTIVE) {
			l->state = MGR_L_ACCEPTED;
			l->progress_ns = eos_now_ns();
		}
		return;
	}
	srv->st.exports_refused[r->status]++;
	mgr_export_detach(srv, l, r->status);
	mgr_lease_free(srv, l); /* nothing was copied: the windows are free */
}

static void on_export_done(struct mgr_session *s, const struct sel_pool_c_cksums *c)
{
	struct mgr_server *srv = s->srv;
	uint32_t why;
	struct mgr_lease *l = mgr_lease_get(srv, s, c->lease, c->nonce, MGR_L_EXPORT, &why);
	if (!l) {
		strike(s, why, SEL_POOL_C_EXPORT_DONE, "export lease", c->lease);
		return;
	}
	struct mgr_session *req = l->req;
	uint32_t status = c->status;
	if (!status && c->n != l->pages)
		status = SEL_POOL_BAD_REQUEST;
	if (status || !req || l->state == MGR_L_FAILED || req->state != MGR_ACTIVE) {
		if (status)
			srv->st.exports_refused[status]++;
		mgr_export_detach(srv, l, status ? status : SEL_POOL_GONE);
		mgr_lease_free(srv, l);
		return;
	}
	/* Hand the filled windows to the requester as its claim. */
	struct mgr_lease *g = mgr_lease_new(srv, MGR_L_CLAIM, req);
	struct sel_pool_gnode node = {
		l->key,   {0}, l->bucket, (uint32_t)(l->key.consumed / s->scope->s.page_tokens),
		l->pages, 1};
	if (!g) {
		mgr_export_detach(srv, l, SEL_POOL_NO_ROOM);
		mgr_lease_free(srv, l);
		return;
	}
	uint64_t claim = l->req_claim;
	mgr_export_detach(srv, l, 0); /* the new lease counts the claim now */
	uint64_t now = eos_now_ns();
	g->slot_bytes = l->slot_bytes;
	g->w = l->w;
	g->nw = l->nw;
	l->w = NULL;
	l->nw = 0;
	g->bytes = l->bytes;
	uint32_t ms = sel_pool_deadline_ms(l->req_setup_ms, srv->o.setup_limit_ms, g->bytes);
	g->deadline_ns = now + (uint64_t)ms * MS_NS;
	g->progress_ns = now;
	struct sel_pool_msg m = {.type = SEL_POOL_M_CLAIM_GRANT};
	m.u.grant = (struct sel_pool_m_claim_grant){.claim = claim,
						    .lease = g->id,
						    .nonce = g->nonce,
						    .deadline_ms = ms,
						    .source = l->source,
						    .base = (uint64_t)l->start_page *
							    s->scope->s.page_tokens,
						    .n_nodes = 1,
						    .n_windows = g->nw,
						    .n_pages = l->pages,
						    .nodes = &node,
						    .windows = g->w,
						    .page_cksum = c->page_cksum,
						    .row_cksum = c->row_cksum};
	srv->st.exports_served++;
	srv->st.claims_granted[l->source]++;
	srv->st.bytes_granted += g->bytes;
	mgr_lease_free(srv, l);
	mgr_send(req, &m);
}

/* ---- releases and progress ------------------------------------------------------------------------ */

static void on_release(struct mgr_session *s, const struct sel_pool_lease_status *r)
{
	struct mgr_server *srv = s->srv;
	uint32_t why;
	struct mgr_lease *l = mgr_lease_get(srv, s, r->lease, r->nonce, -1, &why);
	if (!l) {
		strike(s, why, SEL_POOL_C_RELEASE, "lease", r->lease);
		return;
	}
	if (l->kind == MGR_L_CLAIM) {
		srv->st.claims_released++;
		if (r->status == SEL_POOL_CORRUPT) {
			srv->st.claims_corrupt++;
			for (uint32_t i = 0; i < l->npins; i++)
				if (!l->pins[i]->bad) {
					l->pins[i]->bad = true;
					srv->st.bad_records++;
				}
		}
	} else if (l->kind == MGR_L_EXPORT) {
		srv->st.exports_refused[r->status ? r->status : SEL_POOL_COPY_FAILED]++;
		mgr_export_detach(srv, l, r->status ? r->status : SEL_POOL_COPY_FAILED);
	}
	mgr_lease_free(srv, l);
}

static void on_progress(struct mgr_session *s, const struct sel_pool_c_progress *p)
{
	uint32_t why;
	struct mgr_lease *l = mgr_lease_get(s->srv, s, p->lease, p->nonce, -1, &why);
	if (!l) {
		strike(s, why, SEL_POOL_C_PROGRESS, "lease", p->lease);
		return;
	}
	if (l->state != MGR_L_FAILED)
		l->progress_ns = eos_now_ns();
}

void mgr_dispatch(struct mgr_session *s, const struct sel_pool_msg *m)
{
	struct mgr_server *srv = s->srv;
	srv->st.frames_in++;
	if (s->state == MGR_HELLO) {
		if (m->type != SEL_POOL_C_HELLO) {
			srv->st.disconnects_protocol++;
			srv->st.refused[SEL_POOL_MALFORMED]++;
			mgr_send_error(s, SEL_POOL_MALFORMED, m->type, true, "%s before the hello",
				       sel_pool_type_name(m->type));
			return;
		}
		on_hello(s, &m->u.c_hello);
		return;
	}
	switch (m->type) {
	case SEL_POOL_C_ANNOUNCE:
	case SEL_POOL_C_WITHDRAW: on_holdings(s, m); return;
	case SEL_POOL_C_RESET: mgr_hold_reset(&srv->cat, &s->holds, m->u.reset.sources); return;
	case SEL_POOL_C_LOOKUP: on_lookup(s, &m->u.lookup); return;
	case SEL_POOL_C_CLAIM: on_claim(s, &m->u.claim); return;
	case SEL_POOL_C_RELEASE: on_release(s, &m->u.ls); return;
	case SEL_POOL_C_PROGRESS: on_progress(s, &m->u.progress); return;
	case SEL_POOL_C_PUT: on_put(s, &m->u.put); return;
	case SEL_POOL_C_COMMIT: on_commit(s, &m->u.cksums); return;
	case SEL_POOL_C_EXPORT_REPLY: on_export_reply(s, &m->u.ls); return;
	case SEL_POOL_C_EXPORT_DONE: on_export_done(s, &m->u.cksums); return;
	default:
		srv->st.disconnects_protocol++;
		srv->st.refused[SEL_POOL_MALFORMED]++;
		mgr_send_error(s, SEL_POOL_MALFORMED, m->type, true, "%s is not a client's frame",
			       sel_pool_type_name(m->type));
		return;
	}
}
