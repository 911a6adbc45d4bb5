/*
 * session.c - the pool manager's event loop, connections and the protocol's
 * handlers (design 2.15; pool_proto.h; docs/pool.md "Protocol").
 *
 * DESIGN
 *
 * One thread, one epoll set: the listening socket, a signalfd for SIGTERM
 * and SIGINT, and every connection.  Nothing blocks: sockets are
 * non-blocking, each connection has one input buffer (at most one frame)
 * and a bounded output queue.  A connection whose output queue would pass
 * --client-queue bytes is closed at once ("stopped reading"), so a client
 * that never reads can delay nobody; one that sends a frame that does not
 * decode, or frames of the wrong kind, is told why (a fatal M_ERROR) and
 * closed; one that names a lease it does not hold is told (a non-fatal
 * M_ERROR), counted, and closed only after 64 such frames.  Connections are
 * closed at the end of an event loop turn (mgr_kill marks them), so no
 * handler ever meets a freed session.
 *
 * Admission: SO_PEERCRED (and SO_PEERGROUPS) at accept -- the manager's
 * own uid, or the --group gid as primary or supplementary group -- then the
 * manager's hello with the arena descriptor, then the client's hello
 * within hello_ms.  The socket is created 0600, or 0660 and owned by the
 * group with --group, inside a 0117 umask so it is never more open.
 *
 * Every tick (tick_ms) runs the leases' deadlines, the quarantine, recovery,
 * hello timeouts and the max-age sweep, and publishes a statistics snapshot
 * for /metrics.
 */
#include "manager/session.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MS_NS 1000000ull
#define IN_MIN ((size_t)64 * 1024)
#define MAX_STRIKES 64u

static char listen_marker, signal_marker;

const uint8_t *mgr_session_instance(const struct mgr_session *s) { return s->instance; }

/* ---- output ------------------------------------------------------------------------------ */

static void update_events(struct mgr_session *s)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (s->out_head ? EPOLLOUT : 0),
				 .data.ptr = s};
	bool want = s->out_head != NULL;
	if (want != s->want_out) {
		s->want_out = want;
		epoll_ctl(s->srv->ep, EPOLL_CTL_MOD, s->fd, &ev);
	}
}

static void flush(struct mgr_session *s)
{
	while (s->out_head && s->state != MGR_DEAD) {
		struct mgr_out *o = s->out_head;
		ssize_t w =
			send(s->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				mgr_kill(s, "the connection broke");
			break;
		}
		o->off += (size_t)w;
		if (o->off < o->len)
			break;
		s->out_head = o->next;
		if (!s->out_head)
			s->out_tail = NULL;
		s->out_bytes -= o->len;
		free(o);
	}
	if (s->state != MGR_DEAD)
		update_events(s);
}

void mgr_kill(struct mgr_session *s, const char *why)
{
	if (s->state == MGR_DEAD)
		return;
	s->state = MGR_DEAD;
	s->why = why;
}

static int queue_bytes(struct mgr_session *s, const uint8_t *b, size_t n)
{
	if (s->state == MGR_DEAD)
		return -EPIPE;
	if (s->out_bytes + n > s->srv->o.client_queue) {
		s->srv->st.disconnects_slow++;
		mgr_kill(s, "it stopped reading (its queue is full)");
		return -ENOBUFS;
	}
	struct mgr_out *o = malloc(sizeof *o + n);
	if (!o) {
		mgr_kill(s, "out of memory");
		return -ENOMEM;
	}
	o->next = NULL;
	o->len = n;
	o->off = 0;
	memcpy(o->data, b, n);
	if (s->out_tail)
		s->out_tail->next = o;
	else
		s->out_head = o;
	s->out_tail = o;
	s->out_bytes += n;
	return 0;
}

int mgr_send(struct mgr_session *s, const struct sel_pool_msg *m)
{
	if (s->state == MGR_DEAD)
		return -EPIPE;
	int64_t n = sel_pool_encoded_size(m);
	if (n < 0)
		return (int)n;
	uint8_t small[512], *b = n <= (int64_t)sizeof small ? small : malloc((size_t)n);
	if (!b) {
		mgr_kill(s, "out of memory");
		return -ENOMEM;
	}
	int rc = sel_pool_encode(m, b, (size_t)n) == n ? queue_bytes(s, b, (size_t)n) : -EIO;
	if (b != small)
		free(b);
	if (!rc) {
		s->srv->st.frames_out++;
		flush(s);
	}
	return rc;
}

void mgr_send_error(struct mgr_session *s, uint32_t code, uint16_t about, bool fatal,
		    const char *fmt, ...)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_ERROR};
	m.u.error.code = code;
	m.u.error.about = about;
	m.u.error.fatal = fatal;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m.u.error.text, sizeof m.u.error.text, fmt, ap);
	va_end(ap);
	for (char *p = m.u.error.text; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = ' ';
	mgr_send(s, &m);
	if (fatal)
		mgr_kill(s, m.u.error.text);
}

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

/* ---- input --------------------------------------------------------------------------------------- */

static void dispatch(struct mgr_session *s, const struct sel_pool_msg *m)
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

static void on_readable(struct mgr_session *s)
{
	struct mgr_server *srv = s->srv;
	for (int rounds = 0; rounds < 16 && s->state != MGR_DEAD; rounds++) {
		size_t want = IN_MIN;
		uint16_t type;
		uint32_t plen;
		int hr = sel_pool_frame_header(s->in, s->in_len, &type, &plen);
		if (hr && hr != -EAGAIN) {
			srv->st.disconnects_protocol++;
			srv->st.refused[SEL_POOL_MALFORMED]++;
			mgr_send_error(s, SEL_POOL_MALFORMED, 0, true, "%s", eos_errmsg());
			return;
		}
		if (!hr)
			want = SEL_POOL_FRAME_HEADER + (size_t)plen;
		if (want > s->in_cap) {
			uint8_t *b = realloc(s->in, want);
			if (!b) {
				mgr_kill(s, "out of memory");
				return;
			}
			s->in = b;
			s->in_cap = want;
		}
		ssize_t r = recv(s->fd, s->in + s->in_len, s->in_cap - s->in_len, MSG_DONTWAIT);
		if (r < 0) {
			if (errno != EAGAIN && errno != EINTR)
				mgr_kill(s, "the connection broke");
			return;
		}
		if (r == 0) {
			srv->st.disconnects_eof++;
			mgr_kill(s, "it closed the connection");
			return;
		}
		s->in_len += (size_t)r;
		/* Every whole frame in the buffer. */
		size_t at = 0;
		while (s->state != MGR_DEAD) {
			hr = sel_pool_frame_header(s->in + at, s->in_len - at, &type, &plen);
			if (hr == -EAGAIN)
				break;
			if (hr) {
				srv->st.disconnects_protocol++;
				srv->st.refused[SEL_POOL_MALFORMED]++;
				mgr_send_error(s, SEL_POOL_MALFORMED, 0, true, "%s", eos_errmsg());
				return;
			}
			size_t flen = SEL_POOL_FRAME_HEADER + (size_t)plen;
			if (s->in_len - at < flen)
				break;
			if (s->state == MGR_HELLO && type != SEL_POOL_C_HELLO) {
				srv->st.disconnects_protocol++;
				srv->st.refused[SEL_POOL_MALFORMED]++;
				mgr_send_error(s, SEL_POOL_MALFORMED, type, true,
					       "%s before the hello", sel_pool_type_name(type));
				return;
			}
			struct sel_pool_msg m;
			if (sel_pool_decode(s->in + at, flen, &m)) {
				srv->st.disconnects_protocol++;
				srv->st.refused[SEL_POOL_MALFORMED]++;
				mgr_send_error(s, SEL_POOL_MALFORMED, type, true, "%s",
					       eos_errmsg());
				return;
			}
			dispatch(s, &m);
			sel_pool_msg_free(&m);
			at += flen;
		}
		memmove(s->in, s->in + at, s->in_len - at);
		s->in_len -= at;
		if (s->in_cap > IN_MIN && s->in_len <= IN_MIN) {
			uint8_t *b = realloc(s->in, IN_MIN);
			if (b) {
				s->in = b;
				s->in_cap = IN_MIN;
			}
		}
	}
}

/* ---- accept --------------------------------------------------------------------------------------- */

static bool allowed(struct mgr_server *srv, int fd, const struct ucred *cr)
{
	if (cr->uid == srv->euid)
		return true;
	if (!srv->o.group_set)
		return false;
	if (cr->gid == srv->o.gid)
		return true;
	gid_t groups[256];
	socklen_t len = sizeof groups;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len))
		return false;
	for (socklen_t i = 0; i < len / sizeof groups[0]; i++)
		if (groups[i] == srv->o.gid)
			return true;
	return false;
}

static int send_hello(struct mgr_server *srv, struct mgr_session *s)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_HELLO};
	struct sel_pool_m_hello *h = &m.u.m_hello;
	h->version = SEL_POOL_VERSION;
	h->generation = srv->arena.generation;
	h->arena_bytes = srv->arena.bytes;
	h->data_start = srv->arena.data_start;
	h->window_limit = srv->o.window_limit;
	h->window_credits = srv->o.window_credits;
	h->max_claims = srv->o.max_claims;
	h->max_puts = srv->o.max_puts;
	h->max_exports = srv->o.max_exports;
	h->setup_limit_ms = srv->o.setup_limit_ms;
	h->progress_ms = srv->o.progress_ms;
	h->staging_bytes = 0;
	snprintf(h->name, sizeof h->name, "%s", srv->o.name);
	uint8_t buf[512];
	int64_t n = sel_pool_encode(&m, buf, sizeof buf);
	if (n < 0)
		return (int)n;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	memset(&cb, 0, sizeof cb);
	struct iovec iov = {buf, (size_t)n};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cb.b,
			    .msg_controllen = sizeof cb.b};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &srv->arena.share_fd, sizeof(int));
	ssize_t w = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (w < 0)
		return -errno;
	srv->st.frames_out++;
	if (w < n)
		return queue_bytes(s, buf + w, (size_t)(n - w));
	return 0;
}

static void accept_all(struct mgr_server *srv)
{
	for (int i = 0; i < 64; i++) {
		int fd = accept4(srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct ucred cr;
		socklen_t len = sizeof cr;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len)) {
			close(fd);
			continue;
		}
		bool ok = allowed(srv, fd, &cr);
		if (!ok || srv->n_sessions >= srv->o.max_clients) {
			struct sel_pool_msg m = {.type = SEL_POOL_M_ERROR};
			m.u.error.fatal = 1;
			if (!ok) {
				srv->st.peers_refused++;
				m.u.error.code = SEL_POOL_FORGED;
				snprintf(m.u.error.text, sizeof m.u.error.text,
					 "uid %u gid %u may not use this pool (manager uid %u%s)",
					 (unsigned)cr.uid, (unsigned)cr.gid, (unsigned)srv->euid,
					 srv->o.group_set ? ", or its --group" : "");
			} else {
				srv->st.hellos_refused[SEL_POOL_TOO_MANY]++;
				m.u.error.code = SEL_POOL_TOO_MANY;
				snprintf(m.u.error.text, sizeof m.u.error.text,
					 "%u clients already attached", srv->n_sessions);
			}
			uint8_t buf[512];
			int64_t n = sel_pool_encode(&m, buf, sizeof buf);
			if (n > 0)
				(void)!send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
			close(fd);
			continue;
		}
		struct mgr_session *s = calloc(1, sizeof *s);
		if (!s || !(s->in = malloc(IN_MIN))) {
			free(s);
			close(fd);
			continue;
		}
		s->in_cap = IN_MIN;
		s->srv = srv;
		s->fd = fd;
		s->uid = cr.uid;
		s->gid = cr.gid;
		s->pid = cr.pid;
		s->pid_start = mgr_pid_start(cr.pid);
		s->hello_deadline_ns = eos_now_ns() + (uint64_t)srv->o.hello_ms * MS_NS;
		struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = s};
		if (epoll_ctl(srv->ep, EPOLL_CTL_ADD, fd, &ev)) {
			free(s->in);
			free(s);
			close(fd);
			continue;
		}
		s->next = srv->sessions;
		if (srv->sessions)
			srv->sessions->prev = s;
		srv->sessions = s;
		srv->n_sessions++;
		srv->st.sessions = srv->n_sessions;
		if (send_hello(srv, s))
			mgr_kill(s, "the hello could not be sent");
	}
}

/* ---- closing ---------------------------------------------------------------------------------------- */

static void session_free(struct mgr_server *srv, struct mgr_session *s)
{
	if (s->why && s->state == MGR_DEAD && s->id &&
	    (strstr(s->why, "stopped reading") || strstr(s->why, "frames") ||
	     strstr(s->why, "before") || strstr(s->why, "pool frame")))
		fprintf(stderr, "flare pool: closed session %" PRIu64 " (pid %d): %s\n", s->id,
			(int)s->pid, s->why);
	mgr_session_leases_end(srv, s);
	mgr_hold_reset(&srv->cat, &s->holds, ~0u);
	mgr_scope_unref(&srv->cat, s->scope);
	epoll_ctl(srv->ep, EPOLL_CTL_DEL, s->fd, NULL);
	close(s->fd);
	while (s->out_head) {
		struct mgr_out *o = s->out_head;
		s->out_head = o->next;
		free(o);
	}
	free(s->in);
	if (s->prev)
		s->prev->next = s->next;
	else
		srv->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	srv->n_sessions--;
	srv->st.sessions = srv->n_sessions;
	if (s->id)
		srv->sessions_dirty = true;
	free(s);
}

static void reap(struct mgr_server *srv)
{
	for (struct mgr_session *s = srv->sessions, *nx; s; s = nx) {
		nx = s->next;
		if (s->state != MGR_DEAD)
			continue;
		/* A last attempt to deliver what explains the close. */
		while (s->out_head) {
			struct mgr_out *o = s->out_head;
			ssize_t w = send(s->fd, o->data + o->off, o->len - o->off,
					 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (w <= 0 || (size_t)w < o->len - o->off)
				break;
			s->out_head = o->next;
			free(o);
		}
		s->out_tail = NULL;
		session_free(srv, s);
		nx = srv->sessions; /* freeing may have killed others: start over */
	}
}

/* ---- open, run, close ----------------------------------------------------------------------------- */

static int bind_socket(struct mgr_server *srv, char *err, size_t errlen)
{
	const char *path = srv->o.socket;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, path, strlen(path) + 1);
	struct stat st;
	if (!lstat(path, &st)) {
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "--socket '%s' exists and is not a socket", path);
			return -EEXIST;
		}
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int alive = probe >= 0 && !connect(probe, (struct sockaddr *)&sa, sizeof sa);
		if (probe >= 0)
			close(probe);
		if (alive) {
			snprintf(err, errlen, "--socket '%s': another manager is listening there",
				 path);
			return -EADDRINUSE;
		}
		unlink(path); /* a stale socket of a manager that died */
	}
	srv->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (srv->lfd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	mode_t old = umask(0177);
	int rc = bind(srv->lfd, (struct sockaddr *)&sa, sizeof sa);
	int e = errno;
	umask(old);
	if (rc) {
		snprintf(err, errlen, "--socket '%s': bind: %s", path, strerror(e));
		return -e;
	}
	srv->bound = true;
	if (srv->o.group_set) {
		if (chown(path, (uid_t)-1, srv->o.gid) || chmod(path, 0660)) {
			e = errno;
			snprintf(err, errlen, "--socket '%s': cannot give it to group %u: %s", path,
				 (unsigned)srv->o.gid, strerror(e));
			return -e;
		}
	}
	if (listen(srv->lfd, 128)) {
		snprintf(err, errlen, "--socket '%s': listen: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

int mgr_server_open(const struct mgr_options *o, struct mgr_server **out, char *err, size_t errlen)
{
	*out = NULL;
	struct mgr_server *srv = calloc(1, sizeof *srv);
	if (!srv) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	srv->o = *o;
	srv->lfd = srv->ep = srv->sfd = -1;
	srv->arena.fd = srv->arena.share_fd = -1;
	srv->euid = geteuid();
	int rc;
	if ((rc = eos_hmap_init(&srv->leases))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if ((rc = mgr_arena_open(&srv->arena, o, err, errlen)))
		goto fail;
	mgr_catalog_init(&srv->cat, &srv->arena, &srv->st, o->max_scopes, o->max_age_ns,
			 o->window_limit);
	if (srv->arena.reused && srv->arena.n_prev) {
		srv->recovering = true;
		srv->recovery_deadline_ns = eos_now_ns() + (uint64_t)o->recovery_ms * MS_NS;
	}
	if ((rc = bind_socket(srv, err, errlen)))
		goto fail;
	srv->ep = epoll_create1(EPOLL_CLOEXEC);
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	srv->sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
	if (srv->ep < 0 || srv->sfd < 0) {
		rc = -errno;
		snprintf(err, errlen, "epoll or signalfd: %s", strerror(errno));
		goto fail;
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_marker};
	epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->lfd, &ev);
	ev.data.ptr = &signal_marker;
	epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->sfd, &ev);
	srv->st.arena_bytes = srv->arena.bytes;
	*out = srv;
	return 0;
fail:
	mgr_server_close(srv);
	return rc;
}

void mgr_server_describe(const struct mgr_server *srv, char *buf, size_t cap)
{
	char a[32], b[32];
	const struct mgr_options *o = &srv->o;
	size_t n = (size_t)snprintf(
		buf, cap,
		"flare pool: pool '%s', arena %s (%s%s%s, generation %016" PRIx64
		"%s), clients: uid %u",
		o->name, eos_format_size(srv->arena.bytes, a, sizeof a),
		srv->arena.file ? "file " : "memfd", srv->arena.file ? srv->arena.path : "", "",
		srv->arena.generation, srv->arena.reused ? ", reused" : "", (unsigned)srv->euid);
	if (n < cap && o->group_set)
		n += (size_t)snprintf(buf + n, cap - n, " or group %u", (unsigned)o->gid);
	if (n < cap) {
		if (o->max_age_ns)
			n += (size_t)snprintf(buf + n, cap - n,
					      ", records expire %" PRIu64 " s after their "
					      "last put or restore",
					      (uint64_t)(o->max_age_ns / 1000000000ull));
		else
			n += (size_t)snprintf(buf + n, cap - n, ", no max age");
	}
	if (n < cap)
		n += (size_t)snprintf(buf + n, cap - n,
				      ", at most %u clients, %s queued per client", o->max_clients,
				      eos_format_size(o->client_queue, b, sizeof b));
	if (n < cap && srv->recovering)
		snprintf(buf + n, cap - n,
			 "; waiting up to %u ms for %u client%s of the previous run",
			 o->recovery_ms, srv->arena.n_prev, srv->arena.n_prev == 1 ? "" : "s");
}

struct mgr_stats *mgr_server_stats(struct mgr_server *srv) { return &srv->st; }
uint64_t mgr_server_generation(const struct mgr_server *srv) { return srv->arena.generation; }
void mgr_server_set_http(struct mgr_server *srv, struct mgr_http *h) { srv->http = h; }

static void publish(struct mgr_server *srv)
{
	struct mgr_stats *st = &srv->st;
	st->scopes = srv->cat.n_scopes;
	st->records = srv->cat.records;
	st->record_bytes = srv->cat.record_bytes;
	st->holdings = srv->cat.holds;
	st->leases = srv->leases.n;
	st->quarantined = srv->n_quarantine;
	st->quarantined_bytes = mgr_quarantined_bytes(srv);
	st->arena_bytes = srv->arena.bytes;
	st->arena_used = srv->arena.used * MGR_GRANULE;
	st->recovering = srv->recovering;
	st->sessions = srv->n_sessions;
	if (srv->http)
		mgr_http_publish(srv->http, st);
}

static void tick(struct mgr_server *srv, uint64_t now)
{
	for (struct mgr_session *s = srv->sessions; s; s = s->next)
		if (s->state == MGR_HELLO && now > s->hello_deadline_ns) {
			srv->st.disconnects_timeout++;
			mgr_kill(s, "no hello in time");
		}
	mgr_leases_tick(srv, now);
	mgr_catalog_sweep(&srv->cat, now);
	if (srv->sessions_dirty)
		mgr_sessions_write(srv);
#ifdef SEL_DEBUG_CHECKS
	if (mgr_catalog_check(&srv->cat)) {
		fprintf(stderr, "flare pool: %s\n", eos_errmsg());
		abort();
	}
#endif
}

int mgr_server_run(struct mgr_server *srv)
{
	uint64_t tick_ns = (uint64_t)srv->o.tick_ms * MS_NS;
	srv->next_tick_ns = eos_now_ns();
	publish(srv);
	for (;;) {
		struct epoll_event evs[64];
		uint64_t now = eos_now_ns();
		int timeout =
			now >= srv->next_tick_ns ? 0 : (int)((srv->next_tick_ns - now) / MS_NS) + 1;
		int n = epoll_wait(srv->ep, evs, 64, timeout);
		if (n < 0 && errno != EINTR)
			return -errno;
		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			if (p == &listen_marker) {
				accept_all(srv);
			} else if (p == &signal_marker) {
				struct signalfd_siginfo si;
				if (read(srv->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
					fprintf(stderr, "flare pool: %s: stopping\n",
						si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
					return 0;
				}
			} else {
				struct mgr_session *s = p;
				if (s->state == MGR_DEAD)
					continue;
				if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
					on_readable(s);
				if (s->state != MGR_DEAD && (evs[i].events & EPOLLOUT))
					flush(s);
				if (s->state != MGR_DEAD &&
				    (evs[i].events & (EPOLLHUP | EPOLLERR)) &&
				    !(evs[i].events & EPOLLIN)) {
					srv->st.disconnects_eof++;
					mgr_kill(s, "the connection broke");
				}
			}
		}
		now = eos_now_ns();
		bool ticked = now >= srv->next_tick_ns;
		if (ticked) {
			tick(srv, now);
			srv->next_tick_ns = now + tick_ns;
		}
		reap(srv);
		/* /metrics sees every turn's effects (a copy of a few hundred
		 * bytes under the HTTP side's mutex). */
		if (n > 0 || ticked)
			publish(srv);
	}
}

void mgr_server_close(struct mgr_server *srv)
{
	if (!srv)
		return;
	for (struct mgr_session *s = srv->sessions; s; s = s->next)
		if (s->state != MGR_DEAD) {
			mgr_send_error(s, SEL_POOL_SHUTDOWN, 0, true, "the manager is stopping");
			mgr_kill(s, "the manager is stopping");
		}
	if (srv->ep >= 0)
		reap(srv);
	/* Nobody can write the arena through this manager any more. */
	while (srv->quarantine)
		mgr_lease_free(srv, srv->quarantine);
	/* The arena file keeps the session table: clients may still be
	 * draining copies, and a restarted manager must wait for them. */
	if (srv->arena.fd >= 0)
		mgr_catalog_free(&srv->cat);
	if (srv->bound)
		unlink(srv->o.socket);
	if (srv->lfd >= 0)
		close(srv->lfd);
	if (srv->ep >= 0)
		close(srv->ep);
	if (srv->sfd >= 0)
		close(srv->sfd);
	mgr_arena_close(&srv->arena);
	eos_hmap_free(&srv->leases);
	free(srv);
}
