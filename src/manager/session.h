/*
 * session.h - the pool manager's connections and leases, shared by
 * session.c (the event loop, connections), handlers.c (the protocol's
 * handlers) and lease.c (leases, timeouts, what ended sessions leave
 * behind, recovery).
 *
 * Internal to the manager; see manager.h for the whole.
 */
#ifndef MGR_SESSION_H
#define MGR_SESSION_H

#include "manager/manager.h"

struct mgr_out {
	struct mgr_out *next;
	size_t len, off;
	uint8_t data[];
};

enum mgr_conn_state {
	MGR_HELLO = 0,
	MGR_ACTIVE,
	MGR_DEAD
};

struct mgr_lease;

struct mgr_session {
	struct mgr_session *prev, *next;
	struct mgr_server *srv;
	int fd;
	uint32_t uid, gid;
	int32_t pid;
	uint64_t pid_start;
	enum mgr_conn_state state;
	bool superseded; /* replaced by a drained hello of the same process */
	uint64_t id;
	uint8_t instance[SEL_POOL_ID_BYTES];
	struct mgr_scope *scope;
	uint64_t hello_deadline_ns;
	uint8_t *in;
	size_t in_len, in_cap;
	struct mgr_out *out_head, *out_tail;
	uint64_t out_bytes;
	bool want_out;
	struct mgr_session_holds holds;
	struct mgr_lease *leases;   /* owned: claims, puts, exports (as holder) */
	struct mgr_lease *awaiting; /* exports others run for this session's claims */
	uint32_t n_claims, n_puts, n_exports;
	uint32_t strikes; /* forged or stale frames */
	const char *why;  /* why it is being closed */
};

enum mgr_lease_kind {
	MGR_L_CLAIM = 0,
	MGR_L_PUT,
	MGR_L_EXPORT
};
enum mgr_lease_state {
	MGR_L_ACTIVE = 0,
	MGR_L_ACCEPTED,
	MGR_L_FAILED
};

struct mgr_lease {
	struct eos_hnode hn;
	struct mgr_lease *prev, *next;   /* owner's list, or the quarantine */
	struct mgr_lease *rprev, *rnext; /* the requester's awaiting list (exports) */
	uint64_t id, nonce;
	enum mgr_lease_kind kind;
	enum mgr_lease_state state;
	struct mgr_session *owner; /* NULL: quarantined */
	uint64_t slot_bytes;
	struct sel_pool_window *w; /* owned windows (puts, exports, exported claims) */
	uint32_t nw;
	struct mgr_record **pins; /* arena claims: the chain, pinned */
	uint32_t npins;
	struct mgr_record *rec; /* puts: the pending record */
	/* Exports: who asked, and for what. */
	struct mgr_session *req;
	uint64_t req_claim;
	uint32_t req_setup_ms;
	uint8_t source;
	sel_key key;
	sel_digest bucket;
	uint64_t generation;
	uint32_t start_page, pages;
	uint64_t bytes, deadline_ns, progress_ns;
	/* Quarantined: the process that may still touch the windows. */
	int32_t qpid;
	uint64_t qstart, qsince_ns;
	uint8_t qinstance[SEL_POOL_ID_BYTES];
};

struct mgr_server {
	struct mgr_options o;
	struct mgr_arena arena;
	struct mgr_catalog cat;
	struct mgr_stats st;
	struct mgr_http *http;
	int lfd, ep, sfd;
	bool bound;
	uid_t euid;
	struct mgr_session *sessions;
	uint32_t n_sessions;
	uint64_t next_session, next_lease;
	struct eos_hmap leases; /* every lease by id */
	struct mgr_lease *quarantine;
	uint64_t n_quarantine;
	bool recovering;
	uint64_t recovery_deadline_ns;
	uint64_t next_tick_ns;
	bool sessions_dirty;
};

/* session.c */
int mgr_send(struct mgr_session *s, const struct sel_pool_msg *m);
void mgr_send_error(struct mgr_session *s, uint32_t code, uint16_t about, bool fatal,
		    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void mgr_kill(struct mgr_session *s, const char *why);

/* handlers.c: handle one decoded frame of s (the hello first). */
void mgr_dispatch(struct mgr_session *s, const struct sel_pool_msg *m);

/* lease.c */
struct mgr_lease *mgr_lease_new(struct mgr_server *srv, enum mgr_lease_kind kind,
				struct mgr_session *owner);
/* The lease a frame of s names: kind must match (any kind: -1).  NULL with
 * *why FORGED (never granted to s, another nonce) or STALE (ended). */
struct mgr_lease *mgr_lease_get(struct mgr_server *srv, struct mgr_session *s, uint64_t id,
				uint64_t nonce, int kind, uint32_t *why);
/* End a lease: windows back to the arena, pins dropped, lists unlinked. */
void mgr_lease_free(struct mgr_server *srv, struct mgr_lease *l);
/* A deadline or the no-progress timeout passed: tell the owner (it still
 * ends the lease), refuse the export's requester, drop a put's record. */
void mgr_lease_fail(struct mgr_server *srv, struct mgr_lease *l, uint32_t reason);
/* Unlink an export from its requester (refusing the claim with reason, or
 * not when reason is 0). */
void mgr_export_detach(struct mgr_server *srv, struct mgr_lease *l, uint32_t reason);
/* s ended: quarantine what its process may still touch (or free it, when a
 * drained hello of the same process replaced it), cancel exports run for
 * it. */
void mgr_session_leases_end(struct mgr_server *srv, struct mgr_session *s);
/* A drained hello: free what this process's earlier sessions left. */
void mgr_quarantine_release(struct mgr_server *srv, const uint8_t *instance, int32_t pid,
			    uint64_t start);
/* The tick: deadlines, the quarantine, recovery. */
void mgr_leases_tick(struct mgr_server *srv, uint64_t now);
uint64_t mgr_quarantined_bytes(const struct mgr_server *srv);
/* Rewrite the arena's session table (live sessions, previous clients not yet
 * done). */
void mgr_sessions_write(struct mgr_server *srv);

#endif
