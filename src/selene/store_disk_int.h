/*
 * store_disk_int.h - what the files of the disk store share (design 2.4
 * DiskStore and its Staged transport): its struct, its records, jobs,
 * windows and streams, and the calls one part makes into another.
 *
 * Private to the disk store's parts, each one concept:
 *   store_disk.c           the ops: put, lookup, fetch, poll, stats, close,
 *                          open
 *   store_disk_catalog.c   per-record state, budget, pins, doom, eviction,
 *                          expiry, the checker
 *   store_disk_staged.c    the Staged transport: windows through intake
 *                          slots, the copy and disk queues, completions
 *   store_disk_recovery.c  namespace lock, scan and rebuild at open (the
 *                          routine `flare records gc` runs too)
 *   store_disk_park.c      the composite's side: park, charge, write_from,
 *                          read_into, drop, pins
 * Everyone else uses store_disk.h.
 */
#ifndef SEL_STORE_DISK_INT_H
#define SEL_STORE_DISK_INT_H

#include <sys/uio.h>

#include "disk.h"
#include "list.h"
#include "record.h"
#include "store_common.h"
#include "store_disk.h"
#include "store_evq.h"
#include "store_pool.h"

/* Node flags (store bits, index.h): */
#define DS_FAILED SEL_CORE_FAILED /* its write failed; kept without a file for its children */
#define DS_DOOMED (1u << 9)       /* removed with its descendants at its last unpin */
#define DS_PARKED (1u << 10)      /* composite: complete in DRAM, no file yet */
#define DS_UNCHARGED (1u << 11)   /* composite: parked without disk budget */

#define WINDOWS_IN_FLIGHT 2u
/* A fetch_into's windows read into the caller's slots, not intake: more of
 * them queue at once at no cost in slots, so the disk thread always has
 * the next window of the record when one ends (issue 18, r26disk). */
#define INTO_WINDOWS_IN_FLIGHT 4u
/* Issue 18 (r18c): a put streams windows of half the size, four at once --
 * the same intake slots (design 1's 2 x 64 per stream), so one window's
 * copy-out overlaps three windows' writes, which start beside each other on
 * the disk thread (disk.c dk_part_beside).  bench/store: 1.28-1.43 ->
 * 1.64+ GB/s at load 6 (docs/performance.md, r18c). */
#define PUT_WINDOW_PAGES 32u
#define PUT_WINDOWS_IN_FLIGHT 4u
#define POLL_BATCH 32

enum jkind {
	K_PUT_WIN = 1,
	K_FETCH_WIN,
	K_TRUNCATE,
	K_UNLINK,
	K_DISCARD,
	K_WRITE_FROM,
	K_READ_INTO,
	K_SUMS,   /* a fetch's head checksums from a record it does not read (issue 18) */
	K_PUT_END /* a put's END part apart from its last window (issue 18) */
};

struct dwin;
struct dstream;

/* A disk job block. */
struct dj {
	struct sel_disk_job j;
	uint8_t kind;
	struct dwin *w;         /* window jobs */
	struct dstream *st;     /* sums: the fetch it serves */
	sel_node_id node;       /* write_from, read_into */
	void *arg;              /* write_from, read_into: the composite's, for its hook */
	uint64_t bytes;         /* truncate, unlink: bytes released at submission */
	sel_event *held;        /* discard: the failed put's event, sent once it ran */
	struct dj *qnext;       /* submission FIFO / failed-now FIFO */
	struct dj *prev, *next; /* live standalone jobs */
	bool standalone;
};

/* A window of a stream's plan. */
struct wplan {
	uint32_t node_i, first, count, dst_at;
	bool row;
};

/* One window: <= 64 page records (and maybe the row) through intake slots. */
struct dwin {
	struct dstream *st;
	struct dj dj;             /* disk stage */
	struct sel_xfer_job x;    /* copy stage */
	struct dwin *xqnext;      /* copy submission FIFO / failed-now FIFO */
	struct dwin *prev, *next; /* live windows */
	struct wplan p;           /* node, pages [first, first + count), destination, row */
	bool begin, end;
	uint32_t flags; /* record flags (fetch: packing) */
	uint32_t n_slots, n_page_slots, n_row_slots;
	uint32_t *slots;
	bool borrowed; /* slots of a fetch_into's caller: not freed here */
	void **addr;
	struct iovec *iov;
	uint32_t n_iov;
};

struct dstream {
	bool put;
	int status;
	uint64_t id; /* checkpoint (put) or ticket (fetch) */
	sel_key key;
	uint64_t resident;
	uint64_t bytes;
	uint64_t submit_ns, done_ns;
	uint32_t state_slot;
	uint32_t *ids; /* put: tail GPU page ids; fetch: destination ids */
	uint32_t n_ids;
	struct wplan *plan;
	uint32_t n_win, next_win, live_win;
	sel_node_id *nodes; /* put: the node; fetch: the chain, ascending, pinned */
	uint32_t n_nodes;
	bool parts_sent; /* put: a part reached the disk thread */
	bool decide;     /* put, TP > 1: representation from the first window */
	bool decided;    /* put: that window's copy-out completed */
	uint32_t flags;  /* put: the representation decided (SEL_RECORD_*) */
	/* put, deciding over several windows: the row travels with the first
	 * window, and its slots and pieces stay here for the last part. */
	uint32_t *rslots, n_rslots;
	struct iovec *riov;
	uint32_t n_riov;
	bool disk_failed; /* put: a write part failed on the disk thread */
	struct dj *endj;  /* put: its K_PUT_END job in flight (the stream ends after it) */
	/* fetch with sel_inbound.n_sums (issue 18): the first window's read
	 * copies node 0's checksums [sums_first, +n_sums) into sums. */
	uint64_t *sums;
	uint32_t sums_first, n_sums;
	uint32_t sums_live; /* K_SUMS jobs in flight: the stream ends after them */
	bool waiting;
	/* fetch_into (issue 18, r26disk): each node's slots, and the hook's
	 * arg (into NULL: an ordinary fetch through intake slots). */
	struct sel_disk_into *into;
	void *into_arg;
	/* The sharded transport (store_disk_sharded.c): the put's header
	 * creation time (every rank's), and the stream's link job. */
	uint64_t created_ns;
	uint8_t link;    /* DS_LINK_* */
	bool local_done; /* this rank's part ended; the link job has not */
	int link_status; /* the link job's aggregate, once done */
	uint64_t link_committed;
	struct dstream *wnext; /* streams waiting for intake slots */
	struct dstream *prev, *next;
};

EOS_DLIST(jobs, dj_list, struct dj)
EOS_DLIST(wins, dwin_list, struct dwin)
EOS_DLIST(streams, dstream_list, struct dstream)
EOS_FIFO(djq, dj_fifo, struct dj, qnext)
EOS_FIFO(dwq, dwin_fifo, struct dwin, xqnext)
EOS_FIFO(waitq, dstream_fifo, struct dstream, wnext)

struct drec {
	struct sel_core_rec h;  /* store pins, live */
	sel_key fparent;        /* the parent its file names */
	uint64_t parent_check;  /* its file's parent link check (record.h) */
	struct eos_file_id fid; /* the file indexed: the scan's, or the last commit's */
	uint64_t full;          /* file bytes with the row */
	uint64_t rowseg;        /* row segment bytes */
	uint64_t charged;
	uint64_t wants;           /* uncharged (parked): the bytes counted in disk_store.wanted */
	uint32_t flags;           /* SEL_RECORD_*_REPLICATED */
	sel_node_id pprev, pnext; /* park list */
	bool file, writing, parked_listed;
	bool pad_zero; /* its file is version 4 (zero page padding): a scan's
			  version >= 4, or a commit of this build */
};

/* A composite hook to run from poll: a write_from or read_into ended. */
struct hookdone {
	uint8_t kind; /* K_WRITE_FROM, K_READ_INTO */
	void *arg;
	int status;
};

struct disk_store {
	struct sel_core c; /* first: index, pool numbers, counters, transfers */
	sel_slab_pool *pool;
	sel_disk *disk;
	sel_record_ns *ns;
	struct eos_dirlock *lk;
	struct sel_disk_store_hooks hooks;
	struct sel_evq evq; /* events, the eventfd and the epoll set (wait_fd) */

	/* What describe reports (design 2.11 startup summary). */
	char *dir; /* the namespace directory */
	const char *disk_io, *disk_io_note;
	uint64_t scanned; /* records the startup scan kept */

	uint64_t limit, used, stuck;
	/* Bytes of unlink and truncate jobs submitted and not yet completed:
	 * released from used at submission (the disk thread orders them before
	 * any later fallocate) and counted in the cascade's headroom as room
	 * made (design 2.15), though still on the filesystem until the job
	 * ends. */
	uint64_t unlinking;
	uint64_t shared; /* of the configured limit, set aside for other records (disk_share_div) */
	uint32_t iov_cap; /* row pieces of one row, all ranks */

	sel_node_id park_head, park_tail;
	uint64_t parked, uncharged;
	/* Of the uncharged parked records, the bytes their charges will take:
	 * demand the cascade's headroom counts (the composite's DRAM cannot
	 * demote them until the disk has room). */
	uint64_t wanted;
	sel_node_id *doomed;
	uint32_t n_doomed, cap_doomed;

	struct dj_fifo dq;           /* waiting for disk queue room */
	struct dj_fifo df;           /* refused at submission: complete at poll */
	struct dwin_fifo xq;         /* waiting for copy queue room */
	struct dwin_fifo xf;         /* copy refused at submission */
	struct dstream_list streams; /* live streams */
	struct dstream_fifo wait;    /* streams waiting for intake slots */
	struct dwin_list wins;       /* live windows */
	struct dj_list jobs;         /* live standalone jobs */
	struct hookdone *hd;
	size_t hd_n, hd_cap;
	uint32_t disk_out;   /* jobs handed to the disk thread, not polled */
	struct ds_shard *sh; /* ranks on separate hosts: the sharded transport, or NULL */
};

#define debug_check(ds) SEL_DEBUG_CHECK(sel_disk_store_check, &(ds)->c.base)

/* The disk store behind s (checked: aborts on another store). */
struct disk_store *sel_ds_of(sel_store *s);

static inline struct drec *ds_rec(struct disk_store *ds, sel_node_id id)
{
	return SEL_CORE_REC(&ds->c, struct drec, id);
}

static inline const sel_index_node *NODE(const struct disk_store *ds, sel_node_id id)
{
	return sel_index_cget(ds->c.ix, id);
}

/* The fetch check's predicate: id has a committed file. */
static inline bool ds_has_file(struct sel_core *c, sel_node_id id)
{
	return SEL_CORE_REC(c, struct drec, id)->file;
}

/* ---- store_disk_catalog.c ---- */
/* The core's index callbacks (sel_core_ops). */
void ds_drop_row(struct sel_core *c, sel_node_id id);
void ds_remove(struct sel_core *c, sel_node_id id);
/* Its file bytes, with the row while the node has it. */
uint64_t ds_node_bytes(struct disk_store *ds, sel_node_id id);
/* The record as its file describes it. */
void ds_node_desc(struct disk_store *ds, sel_node_id id, sel_record_desc *d);
/* A disk job on record id's file: its description and the file indexed,
 * so the disk thread refuses anything else under the name. */
void ds_job_rec(struct disk_store *ds, sel_node_id id, struct sel_disk_job *j);
void ds_park_add(struct disk_store *ds, sel_node_id id);
void ds_park_del(struct disk_store *ds, sel_node_id id);
void ds_pin(struct sel_core *c, sel_node_id id);
/* May remove id (a useless page-only leaf, or doomed). */
void ds_unpin(struct sel_core *c, sel_node_id id);
/* Doom id and everything below it: each is removed at its last unpin.
 * Returns the number of descendants. */
uint64_t ds_doom(struct disk_store *ds, sel_node_id id);
/* A read of id failed with rc: a verification failure or a vanished file
 * dooms it and its descendants (counted corrupt / io_error); an I/O error
 * may be transient and keeps it. */
void ds_read_failed(struct disk_store *ds, sel_node_id id, int rc);
/* Evict least recently used unpinned leaves (compacting when none) until
 * need more bytes fit the limit.  True when they do. */
bool ds_make_room(struct disk_store *ds, uint64_t need);
/* Bytes the ancestors from pid up hold (or would, uncharged). */
uint64_t ds_ancestors_bytes(struct disk_store *ds, sel_node_id pid);
/* Charge a parked, uncharged record: 0, -ENOSPC, -ENOENT; evict: may make
 * room by eviction. */
int ds_charge(struct disk_store *ds, const sel_key *key, bool evict);
/* The once-a-minute expiry sweep (design 2.5). */
void ds_expire(struct disk_store *ds);

/* ---- store_disk_staged.c ---- */
/* Hand d to the disk thread in FIFO order; never fails: a refusal other
 * than a full queue completes d with that status at the next poll. */
void ds_disk_submit(struct disk_store *ds, struct dj *d);
/* A standalone job on node id (unlink, truncate, discard), or NULL. */
struct dj *ds_job_new(struct disk_store *ds, uint8_t kind, sel_node_id id, enum sel_disk_op op);
void ds_job_free(struct disk_store *ds, struct dj *d);
void ds_win_free(struct disk_store *ds, struct dwin *w);
void ds_stream_free(struct disk_store *ds, struct dstream *st);
/* A put's stream: its window plan over tail pages; NULL (-ENOMEM). */
struct dstream *ds_put_stream(struct disk_store *ds, const sel_published *cp, uint32_t tail,
			      bool row);
/* Start the stream's next window: 0, 1 when no slots are free now, or a
 * submission error (direct: the put's first window, submitted at once). */
int ds_win_start(struct disk_store *ds, struct dstream *st, bool direct);
void ds_stream_pump(struct disk_store *ds, struct dstream *st);
/* A fetch's stream over a checked chain, started. */
/* into: NULL, or fetch_into's slots per node (the stream owns the block
 * once this returns 0), arg its hook's. */
int ds_fetch_stream(struct disk_store *ds, const sel_hit *hit, const sel_inbound *in,
		    const struct sel_chain_walk *w, struct sel_disk_into *into, void *arg);
/* Drive every stage: completions, queued submissions, waiting streams.
 * Returns whether anything happened. */
bool ds_progress(struct disk_store *ds);
/* Composite hooks queued by completions. */
void ds_hook_push(struct disk_store *ds, uint8_t kind, void *arg, int status);
void ds_run_hooks(struct disk_store *ds);
/* Something is in flight or queued. */
bool ds_busy(const struct disk_store *ds);

/* ---- store_disk_recovery.c ---- */
/* The namespace directory created and locked (before anything is read),
 * and the limit (cfg->disk_limit or a tenth of the free space). */
int ds_namespace_open(struct disk_store *ds, const sel_store_config *cfg);
/* Startup: scan, rebuild and the limit (LRU eviction when over it). */
int ds_rebuild(struct disk_store *ds);

/* ---- store_disk_sharded.c (ranks on separate hosts; NULL ds->sh: no-ops) ---- */
enum {
	DS_LINK_NONE = 0,
	DS_LINK_OUT,
	DS_LINK_CLEANUP,
	DS_LINK_DONE
};
/* The namespace named by this rank's per-rank layout fingerprint. */
void ds_shard_namespace(struct disk_store *ds, const sel_store_config *cfg);
/* Join the peers, agree on the record directories, start the links:
 * before ds_rebuild. */
int ds_shard_open(struct disk_store *ds, const sel_store_config *cfg);
/* A put's or a fetch's stream started on this rank: send its job. */
void ds_shard_put(struct disk_store *ds, struct dstream *st);
void ds_shard_fetch(struct disk_store *ds, struct dstream *st);
/* A truncate or unlink of node id's file on this rank: the same on every peer. */
void ds_shard_file(struct disk_store *ds, sel_node_id id, enum sel_disk_op op);
/* stream_finish's first step: true while the stream must wait for its link
 * job (it is finished again once that completed); false with st->status
 * combined from both. */
bool ds_shard_hold(struct disk_store *ds, struct dstream *st);
/* Finish a stream (store_disk_staged.c). */
void ds_stream_finish(struct disk_store *ds, struct dstream *st);
/* Link completions; whether anything happened. */
bool ds_shard_progress(struct disk_store *ds);
bool ds_shard_busy(const struct disk_store *ds);
/* SEL_ESTOPPED with the links' reason once they stopped, else 0. */
int ds_shard_stopped(struct disk_store *ds);
int ds_shard_close(struct disk_store *ds, uint64_t deadline_ns);
void ds_shard_destroy(struct disk_store *ds, bool leak);

/* ---- store_disk_park.c ---- */
/* The disk thread finished a write_from / read_into. */
void ds_write_from_done(struct disk_store *ds, struct dj *d);
void ds_read_into_done(struct disk_store *ds, struct dj *d);

#endif
