/*
 * lease.c - the pool manager's leases: arena windows or pinned records held
 * for one claim, put or export, their deadlines, and what an ended session
 * leaves behind (design 2.15 restore deadlines, "a client that dies mid-put
 * or mid-export has its leases reclaimed", "The manager holds reused regions
 * until previous clients reconnect or exit"; docs/pool.md "Leases").
 *
 * DESIGN
 *
 * Every lease has an id (a counter, never reused) and a random nonce; a
 * frame must name both, and only the session that owns the lease may name
 * it.  An id above the counter, another session's id or a wrong nonce is
 * FORGED; an id that was granted and ended is STALE.  Both are refused,
 * counted, and change nothing.
 *
 * A lease's windows stay reserved until its owner ends it (release, commit,
 * export done): the owner says so only after its copies drained.  A
 * deadline (setup, clamped to --setup-limit, plus the bytes at 8 MiB/s) or
 * the no-progress timeout fails the lease -- the owner is told, a put's
 * record is dropped, an export's requester is refused -- but does not free
 * the windows, because the owner may still be copying.
 *
 * When a session ends, its process may still be copying (it stopped reading,
 * or only its socket died).  Its leases are quarantined under the process's
 * pid and start time: claims keep their records pinned, puts and exports
 * keep their windows.  They are freed when that process is gone (checked on
 * the tick through /proc; a pid of another namespace, 0, waits
 * quarantine_ms), or when the same instance of the same process reconnects
 * with a drained hello.
 *
 * After a restart on a reused arena file the previous run's sessions come
 * from its header: the manager refuses to allocate windows (puts, exports:
 * RECOVERING) until each of those processes reconnected drained or exited,
 * or recovery_ms passed.
 *
 * INVARIANTS
 *   1. A lease is in srv->leases exactly while it exists; an owned lease is
 *      on its owner's list, a quarantined one on the quarantine list.
 *   2. An export lease with a requester is on that requester's awaiting
 *      list, and the requester counts it among its claims.
 *   3. Windows return to the arena only when no process can write them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "manager/session.h"

#define MS_NS 1000000ull

static void list_del(struct mgr_lease **head, struct mgr_lease *l)
{
	if (l->prev)
		l->prev->next = l->next;
	else
		*head = l->next;
	if (l->next)
		l->next->prev = l->prev;
	l->prev = l->next = NULL;
}

static void list_push(struct mgr_lease **head, struct mgr_lease *l)
{
	l->prev = NULL;
	l->next = *head;
	if (*head)
		(*head)->prev = l;
	*head = l;
}

struct mgr_lease *mgr_lease_new(struct mgr_server *srv, enum mgr_lease_kind kind,
				struct mgr_session *owner)
{
	struct mgr_lease *l = calloc(1, sizeof *l);
	if (!l)
		return NULL;
	l->id = ++srv->next_lease;
	randombytes_buf(&l->nonce, sizeof l->nonce);
	l->kind = kind;
	l->owner = owner;
	l->progress_ns = eos_now_ns();
	eos_hmap_insert(&srv->leases, &l->hn, eos_hash64(l->id));
	list_push(&owner->leases, l);
	if (kind == MGR_L_CLAIM)
		owner->n_claims++;
	else if (kind == MGR_L_PUT)
		owner->n_puts++;
	else
		owner->n_exports++;
	return l;
}

struct mgr_lease *mgr_lease_get(struct mgr_server *srv, struct mgr_session *s, uint64_t id,
				uint64_t nonce, int kind, uint32_t *why)
{
	for (struct eos_hnode *x = eos_hmap_first(&srv->leases, eos_hash64(id)); x;
	     x = eos_hmap_next(x)) {
		struct mgr_lease *l = (struct mgr_lease *)x;
		if (l->id != id)
			continue;
		if (l->owner != s || l->nonce != nonce || (kind >= 0 && (int)l->kind != kind)) {
			*why = SEL_POOL_FORGED;
			return NULL;
		}
		return l;
	}
	*why = id && id <= srv->next_lease ? SEL_POOL_STALE : SEL_POOL_FORGED;
	return NULL;
}

void mgr_export_detach(struct mgr_server *srv, struct mgr_lease *l, uint32_t reason)
{
	struct mgr_session *r = l->req;
	if (!r)
		return;
	if (l->rprev)
		l->rprev->rnext = l->rnext;
	else
		r->awaiting = l->rnext;
	if (l->rnext)
		l->rnext->rprev = l->rprev;
	l->rprev = l->rnext = NULL;
	l->req = NULL;
	r->n_claims--;
	if (reason) {
		struct sel_pool_msg m = {.type = SEL_POOL_M_CLAIM_REFUSED};
		m.u.refused = (struct sel_pool_m_refused){l->req_claim, reason};
		srv->st.claims_refused[reason]++;
		mgr_send(r, &m);
	}
}

void mgr_lease_free(struct mgr_server *srv, struct mgr_lease *l)
{
	eos_hmap_remove(&srv->leases, &l->hn);
	if (l->owner) {
		list_del(&l->owner->leases, l);
		if (l->kind == MGR_L_CLAIM)
			l->owner->n_claims--;
		else if (l->kind == MGR_L_PUT)
			l->owner->n_puts--;
		else
			l->owner->n_exports--;
	} else {
		list_del(&srv->quarantine, l);
		srv->n_quarantine--;
	}
	mgr_export_detach(srv, l, 0);
	if (l->rec) {
		struct sel_pool_window *w;
		uint32_t nw;
		mgr_record_abort(&srv->cat, l->rec, &w, &nw);
		l->rec = NULL;
	}
	for (uint32_t i = 0; i < l->npins; i++)
		mgr_record_unpin(&srv->cat, l->pins[i]);
	if (l->nw)
		mgr_arena_free(&srv->arena, l->w, l->nw, l->slot_bytes);
	free(l->pins);
	free(l->w);
	free(l);
}

void mgr_lease_fail(struct mgr_server *srv, struct mgr_lease *l, uint32_t reason)
{
	if (l->state == MGR_L_FAILED)
		return;
	l->state = MGR_L_FAILED;
	srv->st.leases_failed[reason]++;
	if (l->rec) {
		/* The put's record goes now; its windows stay with the lease. */
		struct sel_pool_window *w;
		uint32_t nw;
		mgr_record_abort(&srv->cat, l->rec, &w, &nw);
		l->rec = NULL;
	}
	mgr_export_detach(srv, l, reason);
	if (l->owner) {
		struct sel_pool_msg m = {.type = SEL_POOL_M_LEASE_FAILED};
		m.u.ls = (struct sel_pool_lease_status){l->id, l->nonce, reason};
		mgr_send(l->owner, &m);
	}
}

void mgr_session_leases_end(struct mgr_server *srv, struct mgr_session *s)
{
	uint64_t now = eos_now_ns();
	/* Exports others run for s: their holders need not finish them. */
	while (s->awaiting) {
		struct mgr_lease *l = s->awaiting;
		mgr_export_detach(srv, l, 0);
		if (l->owner && l->state != MGR_L_FAILED) {
			struct sel_pool_msg m = {.type = SEL_POOL_M_EXPORT_CANCEL};
			m.u.ls = (struct sel_pool_lease_status){l->id, l->nonce, SEL_POOL_GONE};
			mgr_send(l->owner, &m);
		}
	}
	while (s->leases) {
		struct mgr_lease *l = s->leases;
		if (s->superseded) {
			mgr_lease_free(srv, l);
			continue;
		}
		list_del(&s->leases, l);
		if (l->kind == MGR_L_CLAIM)
			s->n_claims--;
		else if (l->kind == MGR_L_PUT)
			s->n_puts--;
		else
			s->n_exports--;
		if (l->rec) {
			struct sel_pool_window *w;
			uint32_t nw;
			mgr_record_abort(&srv->cat, l->rec, &w, &nw);
			l->rec = NULL;
		}
		if (l->kind == MGR_L_EXPORT && l->req) {
			/* The holder died mid-export: a failed export (gone). */
			srv->st.exports_refused[SEL_POOL_GONE]++;
			mgr_export_detach(srv, l, SEL_POOL_GONE);
		}
		l->owner = NULL;
		l->qpid = s->pid;
		l->qstart = s->pid_start;
		l->qsince_ns = now;
		memcpy(l->qinstance, s->instance, SEL_POOL_ID_BYTES);
		list_push(&srv->quarantine, l);
		srv->n_quarantine++;
		srv->st.leases_quarantined++;
	}
}

void mgr_quarantine_release(struct mgr_server *srv, const uint8_t *instance, int32_t pid,
			    uint64_t start)
{
	for (struct mgr_lease *l = srv->quarantine, *nx; l; l = nx) {
		nx = l->next;
		if (l->qpid == pid && l->qstart == start && pid > 0 &&
		    !memcmp(l->qinstance, instance, SEL_POOL_ID_BYTES)) {
			srv->st.leases_reclaimed++;
			mgr_lease_free(srv, l);
		}
	}
}

uint64_t mgr_quarantined_bytes(const struct mgr_server *srv)
{
	uint64_t b = 0;
	for (const struct mgr_lease *l = srv->quarantine; l; l = l->next)
		for (uint32_t i = 0; i < l->nw; i++)
			b += (uint64_t)l->w[i].slots * l->slot_bytes;
	return b;
}

void mgr_sessions_write(struct mgr_server *srv)
{
	struct mgr_prev *v = calloc(MGR_PREV_MAX, sizeof *v);
	if (!v)
		return;
	uint32_t n = 0;
	for (struct mgr_session *s = srv->sessions; s && n < MGR_PREV_MAX; s = s->next)
		if (s->state == MGR_ACTIVE) {
			memcpy(v[n].instance, s->instance, SEL_POOL_ID_BYTES);
			v[n].pid = s->pid;
			v[n++].start = s->pid_start;
		}
	for (uint32_t i = 0; i < srv->arena.n_prev && n < MGR_PREV_MAX; i++)
		if (!srv->arena.prev[i].done)
			v[n++] = srv->arena.prev[i];
	mgr_arena_write_sessions(&srv->arena, v, n);
	free(v);
	srv->sessions_dirty = false;
}

static void recovery_tick(struct mgr_server *srv, uint64_t now)
{
	if (!srv->recovering)
		return;
	uint32_t waiting = 0;
	for (uint32_t i = 0; i < srv->arena.n_prev; i++) {
		struct mgr_prev *p = &srv->arena.prev[i];
		if (!p->done && (p->pid <= 0 || mgr_pid_start(p->pid) != p->start)) {
			p->done = true;
			srv->sessions_dirty = true;
		}
		waiting += !p->done;
	}
	if (waiting && now < srv->recovery_deadline_ns)
		return;
	srv->recovering = false;
	srv->sessions_dirty = true;
	if (waiting)
		fprintf(stderr,
			"flare pool: warning: %u client%s of the previous run neither reconnected "
			"nor exited within %u ms; sharing resumes (their late writes are caught by "
			"checksums)\n",
			waiting, waiting == 1 ? "" : "s", srv->o.recovery_ms);
	else
		fprintf(stderr,
			"flare pool: every client of the previous run reconnected or exited; "
			"sharing resumes\n");
	for (uint32_t i = 0; i < srv->arena.n_prev; i++)
		srv->arena.prev[i].done = true;
}

void mgr_leases_tick(struct mgr_server *srv, uint64_t now)
{
	uint64_t idle = (uint64_t)srv->o.progress_ms * MS_NS;
	for (struct mgr_session *s = srv->sessions; s; s = s->next)
		for (struct mgr_lease *l = s->leases, *nx; l; l = nx) {
			nx = l->next;
			if (l->state == MGR_L_FAILED)
				continue;
			if (now > l->deadline_ns)
				mgr_lease_fail(srv, l, SEL_POOL_TIMEOUT);
			else if (now - l->progress_ns > idle)
				mgr_lease_fail(srv, l, SEL_POOL_NO_PROGRESS);
		}
	uint64_t grace = (uint64_t)srv->o.quarantine_ms * MS_NS;
	for (struct mgr_lease *l = srv->quarantine, *nx; l; l = nx) {
		nx = l->next;
		bool gone = l->qpid > 0 ? mgr_pid_start(l->qpid) != l->qstart
					: now - l->qsince_ns > grace;
		if (gone) {
			srv->st.leases_reclaimed++;
			mgr_lease_free(srv, l);
		}
	}
	recovery_tick(srv, now);
}
