/*
 * store_pooled.h - the pooled store: the pool (design 2.15) as a store that
 * wraps an inner store (the local tiers: memory, disk, composite, or none
 * for pool only).  Internal to libselene; sel_store_open builds it when
 * cfg->pool is set.
 *
 * DESIGN
 *   A wrapper, not a core store: it has no index of its own (the manager's
 *   catalogue is the pool's index) and forwards everything to the inner
 *   store (store_wrap.c's helpers), adding the pool on three paths.
 *
 *   Lookups (store_pooled_lookup.c).  lookup asks the inner store, then
 *   the pool through a ticket kept in a small table keyed by the request's
 *   key at its lookup limit, its resident count and limit: the first call
 *   begins the pool lookup and answers SEL_LOOKUP_PENDING; calls within
 *   the grace period answer PENDING while the ticket waits (a timerfd in
 *   the wait fd wakes the worker at its end); the grace period is four of
 *   the recent lookup round trips (the worst of the last eight, the first
 *   measured at attach), at least 2 ms and at most 250 ms; afterwards, and
 *   once the
 *   answer is in, the deeper of the local hit and the pool's pick
 *   (sel_pool_answer_pick: every chain key compared with the history)
 *   wins, the local tier on a tie (copy priority: DRAM, NVMe, then pool).
 *   A late answer stays in the table, so a request that waits in the queue
 *   (capacity) sees it on its next admission attempt: the late-answer
 *   retry (Helios submits prefill in the iteration that admits, so an
 *   admitted request has no window to retry in).
 *
 *   Restores (store_pooled_fetch.c).  fetch of a pool hit claims the
 *   candidate; the grant is checked against the history the lookup used
 *   (sel_pool_lease_matches) and the destination's page count; then every
 *   window of SEL_WINDOW_PAGES pages (the row with the last) goes to the
 *   helper threads.  With host planes and the host copy backend a window
 *   is one fused job: each page verified against the grant's checksum and
 *   then copied from the cache into the ticket's page ids (the row into
 *   its state slot).  Otherwise the helpers verify the windows
 *   (sel_pool_lease_verify_part) and each verified window is one IN job
 *   of the arena transfer set.  The lease is released once every job
 *   drained: OK, CORRUPT (checksums or chain keys: the manager never
 *   serves that record again) or COPY_FAILED.  A refused or failed claim,
 *   a lost session or a failed lease ends the fetch with
 *   SEL_EV_FETCH_FAILED after its copy drained.  The fallback (design 2.15
 *   "One source", docs/architecture.md): a local copy of the same endpoint
 *   (a neighbour had won the tie) is fetched into the same destination
 *   once the pool's writes drained; otherwise the ticket is kept, marked
 *   failed, and the readmitted request's next lookup (the same history,
 *   resident count and limit) is answered by the local tiers alone: a
 *   shorter prefix restored from one local tier, or none and the request
 *   recomputes.  Either is counted in local_fallbacks.
 *
 *   Puts (store_pooled_put.c, store_pooled_cascade.c).  With local tiers
 *   the pool is the end of their chain: the last one (a memory store, or
 *   a disk store alone or in a composite) offers the records it would
 *   evict next (sel_core_cascade_*; a composite's parked records too,
 *   from DRAM), each is copied from its slots (or read from its files,
 *   checked; replicated shares copied out to every rank) into arena
 *   windows and checksummed on a helper, committed, and leaves the local
 *   tiers only once the manager accepted it.  Otherwise (pool only; or a
 *   local store the cascade cannot read: a split pool) every checkpoint
 *   the inner store queues
 *   (or, pool only, every checkpoint) is copied into arena windows at
 *   publication:
 *   sel_pool_put (linked under its parent when the pool took the parent,
 *   else a root with its whole chain; ORPHAN retries once as a root), an
 *   OUT job from the GPU ids into the lease, checksums on a helper,
 *   commit.  The worker's GPU pin is the source: the inner store's
 *   STORED / STORE_FAILED event is held back until the pool's copy has
 *   drained (or never started), so the pin covers both copies.
 *
 *   Exports (store_pooled_export.c).  With the engine's hooks
 *   (cfg->pool_exports) every offered checkpoint is announced as a GPU
 *   holding (its id is the generation) and withdrawn on its eviction
 *   notice; the manager's export requests pin it through the hooks, copy
 *   it into the lease's windows and commit its checksums.  A neighbour's
 *   candidate is claimed like an arena one (the manager turns the export
 *   into the grant), and wins ties with the local tiers (design 2.15 copy
 *   priority: neighbour GPU, DRAM, NVMe, pool).
 *
 *   Host holdings (store_pooled_hold.c).  The inner store's memory and disk
 *   tiers are watched through their cores (sel_core_watch): every
 *   restorable record is announced as a DRAM or NVMe holding (SP_HOLDINGS
 *   per tier, the oldest withdrawn) and withdrawn in the core's callback
 *   when it leaves the tier or loses its row; a reattach or lost notices
 *   reset and announce them again.  An export of one pins the record in
 *   its tier (a store pin) and one helper job copies it from the memory
 *   store's slots, or reads it from the disk store's files with every
 *   header, page and row checked (the cascade's reader), into the lease's
 *   windows and checksums it; a damaged file fails it (SEL_EXPORT_DAMAGED)
 *   and withdraws the holding.  Records with replicated shares are not
 *   announced.
 *
 *   Threads.  Everything runs on the model worker thread and never waits:
 *   the pool client's calls queue frames, the transfer set and the helper
 *   threads (SP_HELPERS, sharing one queue: checksums, verification, fused
 *   restore windows, cascade copies) report through eventfds that the wait
 *   fd (an epoll set) watches with the inner store's and the pool
 *   client's.  Helper i runs on the CPUs of the process's set whose
 *   index is i modulo SP_HELPERS (with at least SP_HELPERS of them), so
 *   the two never share a core: woken by the worker, both were often
 *   placed on the worker's CPU and a restore ran at half its rate on a
 *   loaded host (docs/performance.md "Restore ratio, paired").
 *
 * INVARIANTS
 *   1. A lease is ended exactly once, and only when no copy of this store
 *      can touch its windows (its job completed or was never submitted,
 *      its helper work returned).
 *   2. A fetch that returned 0 produces exactly one FETCHED or
 *      FETCH_FAILED, after its copies drained.
 *   3. An inner STORED/STORE_FAILED event for a checkpoint whose pool copy
 *      is still reading the GPU ids is held until that copy drained.
 */
#ifndef SEL_STORE_POOLED_H
#define SEL_STORE_POOLED_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "pool_budget.h"
#include "pool_client.h"
#include "selene_store.h"
#include "slab.h"
#include "store_disk.h"
#include "store_wrap.h"
#include "transfer.h"

struct sel_cuda;

#define SP_TICKETS 64             /* lookups remembered at once */
#define SP_GRACE_NS 2000000       /* design 2.15: 2 ms locally ... */
#define SP_GRACE_MAX_NS 250000000 /* ... to 250 ms: four measured round trips */
#define SP_RTTS 8
#define SP_TICKET_TTL_NS (30ull * 1000000000)
#define SP_KNOWN 4096                   /* keys the pool is known to hold (parents of puts) */
#define SP_SHUNNED 16                   /* endpoints whose neighbour restore failed lately ... */
#define SP_SHUN_NS (10ull * 1000000000) /* ... prefer the arena's copy this long */

struct sp_ticket {
	bool used;
	uint64_t seq; /* matches the hit cookie */
	sel_pool_ticket *t;
	sel_key want; /* the history's key at min(len, limit) */
	uint64_t resident, limit;
	uint64_t t0, last_ns, grace_ns;
	bool hit_counted, grace_counted, hist_ok;
	bool has_local; /* a neighbour won a tie with this local hit */
	sel_hit local;
	sel_history hist; /* copied when a pool hit is returned */
	/* A restore of this ticket's pick failed (and no local copy of its
	 * endpoint took over): the readmission's lookup, within SP_SHUN_NS,
	 * is answered by the local tiers alone (a shorter prefix, or none),
	 * without a new pool lookup; then the ticket goes. */
	uint64_t failed_ns;
};

/* A helper-thread job: verify part of a claim's windows (pages first ..
 * first + n, and the row), or checksum a put's or an export's. */
struct sp_hjob {
	struct sp_hjob *next;
	struct sel_pool_lease *lease;
	bool verify;
	uint32_t first, n;
	bool row;
	int status;       /* verify: 0 or SEL_ECORRUPT */
	uint64_t *cksums; /* checksum: [n_pages] */
	uint64_t row_cksum;
	/* A cascade put: copy first (sp_cascade_copy), from src[(chain page or
	 * src_n + row slot) * ranks + rank]; the lease's pages start at chain
	 * page src_skip. */
	const uint8_t **src;
	uint32_t src_n, src_skip;
	/* A cascade put from the disk tier: read and check these files (the
	 * chain, ancestor first) into the windows instead; rstatus is the
	 * helper's result (0 or why the files did not hold the record). */
	struct sel_disk_file *files;
	uint32_t n_files;
	int rstatus;
	/* A fused restore window (sp_restore_window): verify each page, then
	 * copy it into dst[first ..] (and the row into state_slot). */
	bool restore;
	const uint32_t *dst; /* lease page i goes to dst[i - dst_skip] */
	uint32_t dst_skip;
	uint32_t state_slot;
	uint64_t bytes; /* what it copied */
	/* An overlapped restore's head (issue 18, sel_inbound.sums): verify
	 * lease pages [first, +n), which are not restored, and write their
	 * page digests (sel_slot_page_digest_padded) into sums. */
	uint64_t *sums;
};

/* A restore from the pool, window by window (SEL_WINDOW_PAGES pages, the
 * row with the last): every window is handed to the helper at the grant
 * and verified in order, and each verified window is submitted to copy at
 * once, so the copies of the first windows overlap the verification of
 * the later ones and the copy threads never wait for the worker between
 * windows. */
struct sp_fetch {
	struct sp_fetch *next;
	bool granted;
	uint64_t ticket, claim, t0;
	uint64_t tk_seq; /* the lookup's ticket: dropped when the restore fails */
	uint32_t tk_slot;
	sel_key key;
	uint64_t resident;
	uint32_t *pages, n_pages, state_slot;
	sel_history hist;
	struct sel_pool_lease *lease;
	uint32_t n_win, verified, submitted, copied; /* windows */
	uint32_t verifying;                          /* hjs with the helpers */
	uint8_t *vdone;                              /* [n_win]: verified (out of order) */
	bool failed;    /* the lease failed, a window did not verify or copy */
	bool neighbour; /* the hit was another instance's (an export) */
	sel_tier ntier; /* of a neighbour's: its MEMORY or DISK tier, else NONE */
	bool has_local; /* the local tiers' hit of the same endpoint: the fallback */
	sel_hit local;
	sel_pool_fail why;
	uint32_t release; /* the status the lease ends with after a failure */
	uint64_t bytes;
	struct sp_hjob *hjs;       /* [n_win]: the windows' verification */
	struct sel_xfer_job *jobs; /* [n_win] */
	/* An overlapped restore's tail (issue 18): the claim starts n_head
	 * pages below resident (at claimed), and the lease's first n_head
	 * pages are the head, checked and digested by sum_job into sums
	 * (the caller's sel_inbound.sums), never copied. */
	uint64_t claimed;
	uint32_t n_head;
	uint64_t *sums;
	bool sums_live; /* sum_job is with the helpers */
	struct sp_hjob sum_job;
};

enum sp_pstate {
	SPP_ASK = 0,
	SPP_SUBMIT,
	SPP_COPY,
	SPP_SUM,
	SPP_COMMIT
};

struct sp_put {
	struct sp_put *next;
	enum sp_pstate st;
	uint64_t checkpoint, put, t0;
	sel_key key, parent;
	sel_digest bucket;
	uint32_t *pages, n_pages; /* the whole chain */
	uint32_t tail, state_slot;
	bool linked, retried;
	bool own_event; /* pool only: this put's event is the engine's */
	bool copied;    /* the OUT copy landed (the GPU source is free) */
	bool released;  /* the engine's event went out (or is held below) */
	bool held;      /* ev holds the inner store's event */
	bool cascade;   /* the local tier's record (sp_cascade_offer), not the GPU's */
	bool ended;     /* cascade: its hold ended */
	sel_event ev;
	struct sel_pool_lease *lease;
	struct sp_hjob hj;
	struct sel_xfer_job job;
};

#define SP_HELPERS 2     /* helper threads: checksums, verification, fused restores */
#define SP_HOLDINGS 1024 /* GPU holdings announced at once (the oldest withdrawn) */

struct sp_holding {
	bool used;
	sel_key key;
	sel_digest bucket;
	uint64_t id; /* the checkpoint id: the holding's generation */
};

/* The host holdings of one local tier (store_pooled_hold.c): its records
 * announced as DRAM or NVMe holdings, SP_HOLDINGS at most (the oldest
 * withdrawn), and the records committed since the last poll. */
#define SP_HOST_PENDING 256                  /* committed records waiting to be announced */
#define SP_HOST_WAIT_NS (30ull * 1000000000) /* one not readable yet (parked) waits this long */

struct sp_htier {
	struct sel_core *c;   /* the tier's core (NULL: no such tier) */
	sel_store *s;         /* its store */
	uint8_t source;       /* SEL_POOL_SRC_DRAM or _NVME */
	struct sp_holding *h; /* [SP_HOLDINGS]: id is the holding's generation */
	uint64_t n;
	struct {
		sel_key key;
		uint64_t since;
	} * pend; /* ring [SP_HOST_PENDING] */
	uint32_t p_head, p_n;
	bool rescan; /* pend overflowed (or attach): walk the index instead */
};

struct sp_export {
	struct sp_export *next;
	struct sel_pool_lease *lease;
	uint64_t checkpoint;
	uint32_t *pages;
	bool pinned, submitted, summing, cancelled;
	sel_export_refusal why; /* counted when it ends without done */
	/* A host holding's export: the record pinned in tier core hc. */
	struct sel_core *hc;
	sel_key hkey;
	bool hpinned;
	struct sp_hjob hj;
	struct sel_xfer_job job;
};

struct sel_pooled {
	struct sel_wrap w; /* first: base + inner */
	char address[256];
	char desc[512], warn[640], kind[32];
	sel_pool_client *pc;
	sel_slot_layout lay;
	sel_xfer *x;
	const sel_geometry *g;
	bool fused; /* host planes, the host copy backend: restores on the helper */
	int ep, tfd;
	bool timer_armed;
	uint64_t timer_at;
	bool closed;
	int close_rc;
	uint64_t ticket_seq;
	struct sp_ticket tk[SP_TICKETS];
	uint64_t rtt[SP_RTTS]; /* recent lookup round trips */
	uint64_t grace_min;    /* cfg->pool_grace_ns, or SP_GRACE_NS */
	struct {
		sel_key key;
		uint64_t until;
	} shun[SP_SHUNNED];
	uint32_t n_shun;
	uint32_t n_rtt;
	struct sp_fetch *fetches;
	struct sp_put *puts;
	sel_key *known;
	uint32_t n_known;
	/* events for the engine, waiting for poll */
	sel_event *evq;
	uint32_t n_evq, cap_evq;
	/* helper threads (SP_HELPERS: a restore's windows run on both) */
	pthread_t th[SP_HELPERS];
	uint32_t th_started;
	uint32_t th_next; /* atomic: the helpers' indices (sp_helper_spread) */
	bool th_stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct sp_hjob *hq, *hq_tail, *hdone;
	int hfd;
	uint32_t h_out;                /* jobs handed to the helper, not yet taken back */
	const sel_export_hooks *hooks; /* NULL: no exports, no announcements */
	struct sp_holding hold[SP_HOLDINGS];
	uint64_t n_hold;
	struct sp_export *exports;
	struct sel_core *casc; /* the last local tier, cascading into the pool (or NULL) */
	sel_store *casc_store; /* its store */
	sel_store *casc_mem;   /* a composite's memory store: parked records go from there */
	int casc_dirfd;        /* a disk tier's namespace directory */
	const sel_record_ns *casc_ns;
	struct sp_htier host[2]; /* DRAM, NVMe holdings (store_pooled_hold.c) */
	uint64_t hgen;           /* the last host holding generation given */
	sel_pool_counters pc_st;
	sel_tier_stats tier; /* the pool tier's slot of sel_stats */
	/* The CUDA path (store_pooled_cuda.c): the driver and the ranks'
	 * devices, the pool's own copy backend, the arena's registration. */
	const struct sel_cuda *cu;
	int *cu_dev; /* [ranks] */
	struct sel_copy_backend *cuda_be;
	void *reg_addr; /* registered arena mapping, or NULL */
	uint64_t reg_len;
};

/* store_pooled.c */
/* Wrap inner (NULL: pool only; owned from now on, destroyed on failure)
 * in the pooled store of cfg->pool.  A manager that does not answer is no
 * error: the store then serves the local tiers with one warning. */
int sel_pooled_store_open(const sel_store_config *cfg, sel_store *inner, sel_store **out);
int sp_emit(struct sel_pooled *p, const sel_event *ev);
void sp_arm_timer(struct sel_pooled *p, uint64_t at);
void sp_helper_submit(struct sel_pooled *p, struct sp_hjob *j);

/* store_pooled_lookup.c */
int sp_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit, sel_hit *hit);
void sp_tickets_answer(struct sel_pooled *p, sel_pool_ticket *t);
/* One lookup at attach, so the grace period starts from a measured round
 * trip. */
void sp_lookup_warmup(struct sel_pooled *p, const uint8_t model_identity[SEL_IDENTITY_BYTES]);
void sp_tickets_free(struct sel_pooled *p, bool all);
/* The ticket a pool hit came from (and its candidate), or NULL when it
 * is gone; drop the ticket of a failed restore, or (keep) mark it failed
 * so the readmission's lookup is answered by the local tiers alone. */
struct sp_ticket *sp_ticket_of(struct sel_pooled *p, const sel_hit *hit, uint32_t *cand);
void sp_ticket_failed(struct sel_pooled *p, uint32_t slot, uint64_t seq, bool keep);

/* store_pooled_fetch.c */
int sp_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in);
/* Pool events and completions for restores: true when ev was one. */
bool sp_fetch_event(struct sel_pooled *p, const struct sel_pool_event *ev);
bool sp_fetch_helped(struct sel_pooled *p, struct sp_hjob *j);
bool sp_fetch_copied(struct sel_pooled *p, struct sel_xfer_job *j);
/* On the helper thread: one fused restore window, each page verified and
 * then copied from the cache.  0 or SEL_ECORRUPT (nothing after the bad
 * page copied). */
int sp_restore_window(const struct sel_pooled *p, struct sp_hjob *j);
/* On the helper thread: an overlapped restore's head pages verified and
 * digested (sp_hjob.sums).  0 or SEL_ECORRUPT. */
int sp_head_sums(const struct sel_pooled *p, struct sp_hjob *j);
void sp_fetch_retry(struct sel_pooled *p);
void sp_fetch_free(struct sp_fetch *f);

/* store_pooled_export.c */
void sp_announce(struct sel_pooled *p, const sel_published *cp);
bool sp_held(const struct sel_pooled *p, uint64_t id);
void sp_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir);
void sp_reannounce(struct sel_pooled *p);
/* ops->evictions_lost: the holdings table may name checkpoints the GPU
 * evicted; reset it at the manager and announce what is still held. */
void sp_evictions_lost(sel_store *s);
bool sp_export_event(struct sel_pooled *p, const struct sel_pool_event *ev);
bool sp_export_copied(struct sel_pooled *p, struct sel_xfer_job *j);
bool sp_export_helped(struct sel_pooled *p, struct sp_hjob *j);
void sp_export_retry(struct sel_pooled *p);
void sp_exports_end(struct sel_pooled *p);

/* store_pooled_hold.c: the local tiers' records as DRAM / NVMe holdings
 * (design 2.15 "announcements of GPU and host holdings"). */
/* Watch the memory and disk tiers of the inner store (after the attach and
 * the cascade's); detach stops watching. */
void sp_hold_attach(struct sel_pooled *p);
void sp_hold_detach(struct sel_pooled *p);
/* Each poll: announce the records committed since (bounded). */
void sp_hold_pump(struct sel_pooled *p);
/* A new session (reattach) or lost notices: reset the DRAM and NVMe
 * sources at the manager and announce what the tiers still hold. */
void sp_hold_reannounce(struct sel_pooled *p);
/* The holding of (source, key), or NULL; *t its tier. */
struct sp_holding *sp_hold_find(struct sel_pooled *p, uint8_t source, const sel_key *key,
				struct sp_htier **t);
void sp_hold_withdraw(struct sel_pooled *p, uint8_t source, const sel_key *key);
/* An export request for a DRAM or NVMe holding (store_pooled_export.c). */
void sp_export_host(struct sel_pooled *p, struct sel_pool_lease *l);

/* store_pooled_cuda.c: the arena registered with the CUDA driver (design
 * 2.15 "registration"; the budget check's device half). */
/* Whether cfg copies with CUDA (device planes or backend CUDA, no test
 * backend); sp_cuda_load then loads the driver and names the devices (an
 * error when it cannot: a configured GPU is never replaced by memcpy). */
bool sp_cuda_wanted(const sel_store_config *cfg);
int sp_cuda_load(struct sel_pooled *p, const sel_store_config *cfg);
/* The budget's device half into *in (nothing without the driver): the
 * GPUs, the least free device memory less SP_CUDA_RESERVE, integrated.
 * Nonzero with msg[cap] saying why when a figure cannot be read. */
#define SP_CUDA_RESERVE (16ull << 20) /* design 2.5: for transfer streams */
int sp_cuda_budget(struct sel_pooled *p, struct sel_pool_budget_in *in, char *msg, size_t cap);
/* After the budget fits: the backend, then the arena registered once.
 * False after a failure: one warning, nothing registered, the session
 * closed (local tiers). */
bool sp_cuda_register(struct sel_pooled *p);
/* Unregister the arena (no copy may touch it any more); NULL-safe twice. */
void sp_cuda_unregister(struct sel_pooled *p);
void sp_cuda_free(struct sel_pooled *p, bool leak);

/* store_pooled_cascade.c */
/* Cascade from the inner store when it is a memory store (the end of the
 * local chain); detach ends every held record as kept. */
void sp_cascade_attach(struct sel_pooled *p);
void sp_cascade_detach(struct sel_pooled *p);
/* A cascade put ended: the local record goes (accepted) or stays. */
void sp_cascade_end(struct sel_pooled *p, const sel_key *key, bool accepted);
/* On the helper thread: a cascade job's shares into its lease's windows
 * (a disk tier's: its files read and checked, rstatus set). */
void sp_cascade_copy(const struct sel_pooled *p, struct sp_hjob *j);
/* The cascade's snapshots, shared with host exports: the source of every
 * share of key's whole chain of n pages and its row in memory store s, or
 * the committed files of the chain in disk store s (ancestor first); NULL
 * when the store does not hold a complete chain. */
const uint8_t **sp_chain_sources(struct sel_pooled *p, sel_store *s, const sel_key *key, uint32_t n,
				 sel_key *parent, uint32_t *tail);
struct sel_disk_file *sp_chain_files(sel_store *s, const sel_key *key, uint32_t n,
				     uint32_t *n_files, sel_key *parent, uint32_t *tail);

/* store_pooled_put.c */
/* Start the put of a local record (cp's key, parent, bucket, n_pages,
 * tail) from src (owned from now on when it returns 0). */
int sp_put_cascade(struct sel_pooled *p, const sel_published *cp, const uint8_t **src,
		   struct sel_disk_file *files, uint32_t n_files);
sel_outcome sp_put(sel_store *s, const sel_published *cp, sel_retry_reason *why);
bool sp_put_event(struct sel_pooled *p, const struct sel_pool_event *ev);
bool sp_put_helped(struct sel_pooled *p, struct sp_hjob *j);
bool sp_put_copied(struct sel_pooled *p, struct sel_xfer_job *j);
void sp_put_retry(struct sel_pooled *p);
/* An inner store event: held when its checkpoint's pool copy still reads
 * the GPU ids (true), else false (the caller forwards it). */
bool sp_put_hold(struct sel_pooled *p, const sel_event *ev);
void sp_known_add(struct sel_pooled *p, const sel_key *k);
bool sp_known_has(const struct sel_pooled *p, const sel_key *k);
void sp_known_del(struct sel_pooled *p, const sel_key *k);

#endif
