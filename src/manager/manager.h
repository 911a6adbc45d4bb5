/*
 * manager.h - the pool manager, `flare pool` (design 2.15; docs/pool.md).
 *
 * Internal to the manager (prefix mgr_).  One thread runs everything but
 * the metrics HTTP server: the event loop (manager.c) over the Unix socket,
 * its connections (session.c), the leases and what ended sessions leave
 * behind (lease.c), the per-scope catalogue of records and holdings
 * (catalog.c) and the arena (arena.c).  stats.c formats the counters and
 * serves /metrics from a snapshot; options.c reads flags and the config
 * file.
 *
 * Memory is bounded whatever clients send: at most max_clients sessions,
 * each with one input frame (<= SEL_POOL_FRAME_MAX), client_queue bytes of
 * output (a client that does not read is disconnected when it fills),
 * max_holdings holdings (and max_holdings_total over all sessions), and
 * max_claims + max_puts + max_exports leases; records are bounded by the
 * arena (each takes at least one 4 KiB slot); scopes by max_scopes.
 */
#ifndef MGR_MANAGER_H
#define MGR_MANAGER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "eos.h"
#include "hmap.h"
#include "pool_proto.h"

/* `flare pool ARGS` (argv[0] is "pool"): the exit status. */
int mgr_pool_main(int argc, char **argv);

/* ---- options (options.c) ------------------------------------------------------------ */

struct mgr_options {
	char socket[108];
	uint64_t memory;
	char name[SEL_POOL_NAME_MAX + 1];
	uint64_t max_age_ns; /* 0: off */
	char config[4096];
	int metrics_port; /* -1: none, 0: any free port */
	char metrics_host[64];
	bool group_set;
	gid_t gid;
	char arena[4096]; /* "": a memfd */
	uint32_t max_clients, max_scopes;
	uint64_t client_queue; /* bytes of output per client */
	uint32_t max_holdings; /* per session */
	uint64_t max_holdings_total;
	uint32_t max_claims, max_puts, max_exports;
	uint32_t window_limit, window_credits;
	uint32_t setup_limit_ms, progress_ms;
	uint32_t hello_ms;      /* a connection's time to send its hello */
	uint32_t recovery_ms;   /* a restarted manager waits this long for old clients */
	uint32_t quarantine_ms; /* leases of a session whose pid is unknown */
	uint32_t tick_ms;
};

enum {
	MGR_OPTS_HELP = 1
};
/* Defaults, then the config file (when --config names one), then flags.
 * 0, MGR_OPTS_HELP (printed), or -EINVAL with one line in err. */
int mgr_options_parse(int argc, char **argv, struct mgr_options *o, char *err, size_t errlen);
/* The config file's text (pure): keys of [pool] set fields of o not set by
 * flags (flag_mask bits, by option index).  0 or -EINVAL with err. */
int mgr_config_parse(const char *text, size_t len, const char *file, struct mgr_options *o,
		     uint64_t flag_mask, char *err, size_t errlen);
void mgr_options_help(FILE *f);

/* ---- the arena (arena.c) ------------------------------------------------------------- */

#define MGR_ARENA_HEADER (64u * 1024u) /* header bytes before the first window */
#define MGR_GRANULE 4096u
#define MGR_PREV_MAX 512u /* sessions remembered in the header */

struct mgr_prev {
	uint8_t instance[SEL_POOL_ID_BYTES];
	int32_t pid;
	uint64_t start; /* the pid's start time (clock ticks since boot) */
	bool done;      /* reattached or exited */
};

struct mgr_arena {
	int fd;
	int share_fd; /* what clients get: the memfd, or the file opened
					  again (the lock on fd must stay the manager's alone) */
	bool file;    /* a named file (kept across restarts), else a memfd */
	bool reused;  /* the file's header and generation were kept */
	char path[4096];
	uint64_t bytes, data_start, generation;
	uint64_t *bits;          /* one bit per granule: set = in use */
	uint64_t granules, used; /* granules in [data_start, bytes), in use */
	uint64_t cursor;         /* next-fit start, in granules */
	struct mgr_prev *prev;   /* clients of the previous run (file arenas) */
	uint32_t n_prev;
};

/* Create (or, for a file whose header matches its size, reopen) the arena:
 * a memfd sealed against resizing, or the file at o->arena locked against a
 * second manager; every byte allocated up front.  0 or a negative errno
 * with err. */
int mgr_arena_open(struct mgr_arena *a, const struct mgr_options *o, char *err, size_t errlen);
void mgr_arena_close(struct mgr_arena *a);
/* Take `slots` slots of slot_bytes as windows of at most max_slots slots,
 * each on a multiple of slot_bytes, appended to w[*n] (room for cap).  All
 * or nothing: 0 or -ENOSPC (nothing taken). */
int mgr_arena_alloc(struct mgr_arena *a, uint64_t slot_bytes, uint32_t slots, uint32_t max_slots,
		    uint8_t kind, struct sel_pool_window *w, uint32_t *n, uint32_t cap);
void mgr_arena_free(struct mgr_arena *a, const struct sel_pool_window *w, uint32_t n,
		    uint64_t slot_bytes);
/* Free granules; whether slots of slot_bytes (would) fit is another matter. */
static inline uint64_t mgr_arena_free_bytes(const struct mgr_arena *a)
{
	return (a->granules - a->used) * MGR_GRANULE;
}
/* Verify the bitmap counts (used == set bits): 0 or SEL_ECORRUPT. */
int mgr_arena_check(const struct mgr_arena *a);
/* Record the live sessions in the header (file arenas; a no-op for a memfd
 * is fine too): n entries of (instance, pid, start). */
void mgr_arena_write_sessions(struct mgr_arena *a, const struct mgr_prev *s, uint32_t n);
/* A process's start time from /proc/PID/stat (0: gone or unknown). */
uint64_t mgr_pid_start(int32_t pid);

/* ---- the catalogue (catalog.c) ---------------------------------------------------------- */

struct mgr_session;
struct mgr_record;
struct mgr_hold;
struct mgr_bucket;

struct mgr_scope {
	struct mgr_scope *prev, *next;
	uint8_t id[SEL_POOL_ID_BYTES];
	struct sel_pool_scope s; /* table points to table_copy */
	uint8_t *table_copy;
	struct eos_hmap keys;    /* entries by key */
	struct eos_hmap buckets; /* struct mgr_bucket by bucket digest */
	uint32_t sessions;
	uint64_t entries, records;
};

struct mgr_entry {
	struct eos_hnode hn;
	struct mgr_scope *scope;
	sel_key key;
	sel_digest bucket;
	struct mgr_bucket *bk;
	struct mgr_entry *bprev, *bnext; /* in its bucket, consumed descending */
	struct mgr_record *rec;
	struct mgr_hold *holds;
};

struct mgr_record {
	struct mgr_entry *e;
	struct mgr_record *parent; /* linked parent, or NULL (a root) */
	sel_key parent_key;        /* as put (informational when not linked) */
	uint32_t children;
	uint32_t tail;
	bool ready; /* committed */
	bool bad;   /* a reader found it corrupt: never served again */
	uint32_t pins;
	uint64_t used_ns;          /* last put or restore (max age) */
	struct sel_pool_window *w; /* page windows, then row windows */
	uint32_t nw;
	uint64_t *cksum; /* [tail] */
	uint64_t row_cksum;
	uint64_t bytes;
	struct mgr_record *lprev, *lnext; /* every ready record, least recently used first */
	uint32_t mark, idx;               /* answer building */
};

struct mgr_hold {
	struct mgr_hold *enext;         /* the entry's holders */
	struct mgr_hold *sprev, *snext; /* the session's holdings */
	struct mgr_entry *e;
	struct mgr_session *s;
	uint8_t source;
	uint64_t generation;
};

struct mgr_stats;

struct mgr_catalog {
	struct mgr_arena *arena;
	struct mgr_stats *st;
	struct mgr_scope *scopes;
	uint32_t n_scopes, max_scopes;
	struct mgr_record *lru_head, *lru_tail;
	uint64_t records, record_bytes, holds;
	uint64_t max_age_ns;
	uint64_t next_sweep_ns;
	uint32_t mark;
	uint32_t window_limit; /* bytes */
};

void mgr_catalog_init(struct mgr_catalog *cat, struct mgr_arena *a, struct mgr_stats *st,
		      uint32_t max_scopes, uint64_t max_age_ns, uint32_t window_limit);
/* Free everything (windows go back to the arena). */
void mgr_catalog_free(struct mgr_catalog *cat);

/* The scope of a hello (created on first use; max_scopes: NULL).  Each
 * session holds one reference (mgr_scope_unref when it ends). */
struct mgr_scope *mgr_scope_ref(struct mgr_catalog *cat, const char *name,
				const struct sel_pool_scope *s);
void mgr_scope_unref(struct mgr_catalog *cat, struct mgr_scope *sc);

/* Holdings of a session. */
struct mgr_session_holds {
	struct mgr_hold *head;
	uint32_t n;
};
/* Add or refresh (a newer generation) one holding: 0, or -ENOMEM. */
int mgr_hold_add(struct mgr_catalog *cat, struct mgr_scope *sc, struct mgr_session *s,
		 struct mgr_session_holds *sh, const struct sel_pool_holding *h);
/* Remove the holding of key and source when it has this generation. */
void mgr_hold_withdraw(struct mgr_catalog *cat, struct mgr_scope *sc, struct mgr_session *s,
		       struct mgr_session_holds *sh, const struct sel_pool_holding *h);
/* Remove every holding of these sources (bits 1 << source; ~0: all). */
void mgr_hold_reset(struct mgr_catalog *cat, struct mgr_session_holds *sh, uint32_t sources);
/* The holding of key by the session with this instance id and source, or NULL. */
struct mgr_hold *mgr_hold_find(struct mgr_scope *sc, const sel_key *key, const uint8_t *instance,
			       uint8_t source);
struct mgr_entry *mgr_entry_find(struct mgr_scope *sc, const sel_key *key);
/* A session's instance id (session.c). */
const uint8_t *mgr_session_instance(const struct mgr_session *s);

/* Build the answer to a lookup from session s (its own holdings never
 * count): candidates deepest first, holders before the arena's copy of the
 * same endpoint, at most SEL_POOL_MAX_CANDIDATES and SEL_POOL_MAX_NODES.
 * The arrays are malloc'd into out->mem.  0 or -ENOMEM. */
int mgr_catalog_answer(struct mgr_catalog *cat, struct mgr_scope *sc, const struct mgr_session *s,
		       const struct sel_pool_c_lookup *l, uint64_t now, struct sel_pool_msg *out);

/* The arena chain of endpoint key above resident: chain[] ascending
 * (ancestor first), *n nodes, *base the stopping parent's consumed count.
 * 0, or SEL_POOL_NOT_FOUND (no such ready, servable record, or a chain with
 * a missing, bad or expired link), SEL_POOL_BAD_REQUEST (resident at or
 * above it), SEL_POOL_OVERSIZE (more than cap nodes). */
uint32_t mgr_catalog_chain(struct mgr_catalog *cat, struct mgr_scope *sc, const sel_key *key,
			   uint64_t resident, uint64_t now, struct mgr_record **chain, uint32_t cap,
			   uint32_t *n, uint64_t *base);

/* Windows for pages + rows slots of a scope, evicting least recently used
 * unpinned leaves until they fit: 0 with *w (malloc'd) and *nw, or
 * -ENOSPC. */
int mgr_catalog_alloc(struct mgr_catalog *cat, const struct mgr_scope *sc, uint32_t pages,
		      uint32_t rows, struct sel_pool_window **w, uint32_t *nw);

/* A put's record, pending: validates against the scope (SEL_POOL_* reason
 * on refusal: PRESENT, IN_FLIGHT, ORPHAN, OVERSIZE, BAD_REQUEST), pins the
 * linked parent.  The record owns w from here. */
uint32_t mgr_record_begin(struct mgr_catalog *cat, struct mgr_scope *sc,
			  const struct sel_pool_c_put *p, struct mgr_record **out);
/* Check a put's size and links before allocating: the same reasons. */
uint32_t mgr_record_precheck(struct mgr_catalog *cat, struct mgr_scope *sc,
			     const struct sel_pool_c_put *p);
void mgr_record_set_windows(struct mgr_record *r, struct sel_pool_window *w, uint32_t nw);
/* Commit: checksums (n must be the tail), ready, linked, recent. */
uint32_t mgr_record_commit(struct mgr_catalog *cat, struct mgr_record *r, const uint64_t *cksum,
			   uint32_t n, uint64_t row_cksum, uint64_t now);
/* Forget a pending record; its windows go back to the caller (*w, *nw) to
 * free or keep. */
void mgr_record_abort(struct mgr_catalog *cat, struct mgr_record *r, struct sel_pool_window **w,
		      uint32_t *nw);
void mgr_record_pin(struct mgr_record *r);
void mgr_record_unpin(struct mgr_catalog *cat, struct mgr_record *r);
/* Refresh (a restore): used now, most recently used. */
void mgr_record_touch(struct mgr_catalog *cat, struct mgr_record *r, uint64_t now);

/* One least recently used unpinned ready leaf: removed (1), or none (0). */
int mgr_catalog_evict_one(struct mgr_catalog *cat);
/* The max-age sweep (at most once a minute, or once a max age when that is
 * shorter): expired unpinned leaves, at most 64. */
void mgr_catalog_sweep(struct mgr_catalog *cat, uint64_t now);
/* Whether r has outlived the max age. */
bool mgr_record_expired(const struct mgr_catalog *cat, const struct mgr_record *r, uint64_t now);
/* Verify every invariant (catalog.c): 0 or SEL_ECORRUPT with a message. */
int mgr_catalog_check(const struct mgr_catalog *cat);

/* ---- statistics (stats.c) ------------------------------------------------------------------ */

struct mgr_stats {
	uint64_t sessions_total, sessions;
	uint64_t peers_refused, hellos_refused[SEL_POOL_REASONS];
	uint64_t disconnects_slow, disconnects_protocol, disconnects_eof, disconnects_timeout;
	uint64_t frames_in, frames_out;
	uint64_t refused[SEL_POOL_REASONS]; /* frames refused: forged, stale, malformed, full */
	uint64_t lookups, lookup_hits, candidates;
	uint64_t claims_granted[SEL_POOL_SOURCES], claims_refused[SEL_POOL_REASONS];
	uint64_t claims_released, claims_corrupt;
	uint64_t puts_granted, puts_refused[SEL_POOL_REASONS], puts_accepted,
		puts_rejected[SEL_POOL_REASONS];
	uint64_t exports_requested, exports_served, exports_refused[SEL_POOL_REASONS];
	uint64_t leases_failed[SEL_POOL_REASONS], leases_reclaimed, leases_quarantined;
	uint64_t evicted, expired, bad_records;
	uint64_t bytes_granted, bytes_put;
	/* Gauges, refreshed before each snapshot. */
	uint64_t scopes, records, record_bytes, holdings, leases, quarantined, quarantined_bytes;
	uint64_t arena_bytes, arena_used, recovering;
};

struct mgr_metrics_info {
	const char *name;
	uint64_t generation;
	const char *arena_kind; /* "memfd", "file" */
	uint64_t max_age_ns;
};

struct flare_buf;
/* Prometheus text of a snapshot (docs/pool.md "Metrics"). */
void mgr_metrics_format(struct flare_buf *out, const struct mgr_stats *st,
			const struct mgr_metrics_info *info);

struct mgr_http;
/* Serve GET /metrics on host:port (port 0: any) from the snapshots given to
 * mgr_http_publish.  0 with *out and the bound port in *port, or -errno
 * with err. */
int mgr_http_start(const char *host, int port, const struct mgr_metrics_info *info,
		   struct mgr_http **out, int *bound, char *err, size_t errlen);
void mgr_http_publish(struct mgr_http *h, const struct mgr_stats *st);
void mgr_http_stop(struct mgr_http *h);

/* ---- the server (session.c, lease.c) --------------------------------------------------------- */

struct mgr_server;
/* Bind the socket (mode 0600, or 0660 with the group), open the arena and
 * get ready.  0 or -errno with err. */
int mgr_server_open(const struct mgr_options *o, struct mgr_server **out, char *err, size_t errlen);
/* The startup summary line(s). */
void mgr_server_describe(const struct mgr_server *srv, char *buf, size_t cap);
/* Run the event loop until SIGTERM or SIGINT (blocked by the caller and
 * read through a signalfd).  0, or -errno. */
int mgr_server_run(struct mgr_server *srv);
/* Close every connection, unlink the socket, free everything. */
void mgr_server_close(struct mgr_server *srv);
/* The stats struct, for the HTTP server wiring. */
struct mgr_stats *mgr_server_stats(struct mgr_server *srv);
uint64_t mgr_server_generation(const struct mgr_server *srv);
void mgr_server_set_http(struct mgr_server *srv, struct mgr_http *h);

#endif
