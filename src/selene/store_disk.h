/*
 * store_disk.h - internal calls of the disk store (design 2.4 DiskStore and
 * its Staged transport) for tests, tools and the composite.  The store
 * itself is opened with sel_disk_store_open() (selene.h) and used through
 * sel_store_*.
 */
#ifndef SEL_STORE_DISK_H
#define SEL_STORE_DISK_H

#include <sys/uio.h>

#include "record.h"
#include "selene_store.h"

struct sel_store_pool;

/* Verify the disk store's invariants (store_disk.c header).  0 or
 * SEL_ECORRUPT with sel_errmsg() naming the first violation.  O(records). */
int sel_disk_store_check(sel_store *s);

/* A committed record file for a reader outside the disk thread (the
 * pooled store's cascade, store_disk_view.c): its description (the index
 * node's, with its file's parent link and flags), span and file id; its
 * parent in the index (none for a root). */
struct sel_disk_file {
	sel_record_desc d;
	sel_record_span span;
	struct eos_file_id fid;
	bool has_row, is_root;
	sel_key parent;
};
/* 0 with *out, -ENOENT (not indexed) or -EAGAIN (no committed file now:
 * parked, being written, doomed, failed). */
int sel_disk_store_file(sel_store *s, const sel_key *key, struct sel_disk_file *out);
/* The namespace directory (open for the store's life) and its namespace. */
int sel_disk_store_dirfd(sel_store *s);
const sel_record_ns *sel_disk_store_ns(sel_store *s);

/* One record as the disk store knows it, for tests and the composite. */
struct sel_disk_record_info {
	bool ready; /* READY: its bytes are complete (on disk, or parked in DRAM) */
	bool has_row;
	bool file;    /* a committed file under its name */
	bool writing; /* a write (stream or write_from) is in flight */
	bool parked;  /* composite: complete in DRAM, no file yet */
	bool charged; /* its file bytes count against the limit */
	bool failed;  /* its write failed; kept, without a file, for its children */
	bool doomed;  /* removed (with its descendants) at its last unpin */
	bool is_root;
	uint32_t tail;  /* page records it holds */
	uint32_t flags; /* SEL_RECORD_*_REPLICATED */
	uint32_t pins;
	uint64_t bytes; /* its file bytes (charged or not) */
	sel_key parent; /* none for a root */
	sel_digest bucket;
	uint64_t tick;    /* access order: larger is more recent */
	uint64_t used_ns; /* last use (design 2.5 expiry) */
};
/* 0 with *out filled, or -ENOENT when key is not indexed. */
int sel_disk_store_record(sel_store *s, const sel_key *key, struct sel_disk_record_info *out);

/* Bytes charged against the limit (records, reservations, stuck removals)
 * and the limit. */
void sel_disk_store_usage(sel_store *s, uint64_t *used, uint64_t *limit);
/* The disk thread's counters (bench/store; zeroed when it has none). */
struct sel_disk_stats;
void sel_disk_store_thread_stats(sel_store *s, struct sel_disk_stats *out);

/* The end-of-chain cascade's byte headroom (design 2.15; store_disk.c):
 * *free_bytes (the limit less charged bytes -- the bytes of unlinks and
 * truncates still in flight, *unlinking, count as free -- and less the
 * bytes uncharged parked records want), *headroom (2 x intake slots'
 * bytes, at most a quarter of the limit); any may be NULL.  Returns whether
 * free bytes plus those of the records held for the next level are under
 * the headroom (the cascade offers records while they are). */
bool sel_disk_store_headroom(sel_store *s, uint64_t *free_bytes, uint64_t *unlinking,
			     uint64_t *headroom);

/* Every indexed key, in access order (oldest first), into keys[0..cap):
 * returns the count (which may exceed cap: only cap are written). */
size_t sel_disk_store_keys(sel_store *s, sel_key *keys, size_t cap);

/* ---- The composite's side (design 2.4 CompositeStore) -------------------- */

/* Callbacks into the composite.  removed runs whenever a record leaves the
 * disk index (eviction, corruption, a drop, expiry), from inside disk store
 * calls (parked: it had no file yet; expired: the expiry sweep removed it):
 * it must not call the disk store.  written and read run from
 * sel_store_poll on the disk store once a write_from or a read_into
 * completed, with the arg it was given (status 0, a negative errno,
 * SEL_ECORRUPT), after the store updated its own state; they may call the
 * disk store. */
struct sel_disk_store_hooks {
	void *ctx;
	void (*removed)(void *ctx, const sel_key *key, bool parked, bool expired);
	void (*written)(void *ctx, void *arg, int status);
	void (*read)(void *ctx, void *arg, int status);
};

/* A disk store over the composite's pool (it never frees or leaks the
 * pool; the owner does, after a SEL_ESTOPPED close).  hooks is copied. */
int sel_disk_store_open_shared(const sel_store_config *cfg, struct sel_store_pool *sp,
			       const struct sel_disk_store_hooks *hooks, sel_store **out);

/* A record whose bytes are complete in DRAM (the composite's parked copy):
 * indexed READY and not evictable, linked under parent when the parent is
 * indexed and tail is the count since it (else a root: tail must be the
 * whole chain), without a file.  Its file bytes are charged now if the
 * limit allows after evicting unpinned committed leaves (*charged true);
 * otherwise it is indexed uncharged and sel_disk_store_charge tries again
 * later.  Returns 0, -EEXIST (the key is indexed), SEL_EOVERSIZE (it and
 * its required ancestors can never fit the limit) or an index error. */
struct sel_disk_park {
	sel_key key, parent;
	sel_digest bucket;
	uint32_t tail;
	bool row;
	uint32_t flags; /* SEL_RECORD_*_REPLICATED: DRAM's packing decisions */
};
int sel_disk_store_park(sel_store *s, const struct sel_disk_park *p, bool *charged);
/* Parked records indexed without a charge. */
uint64_t sel_disk_store_uncharged(sel_store *s);
/* Charge a parked, uncharged record: 0, -ENOSPC (no room yet), -ENOENT. */
int sel_disk_store_charge(sel_store *s, const sel_key *key);
/* The same without evicting anything: only when the limit has room now
 * (the shutdown drain preserves committed files). */
int sel_disk_store_charge_free(sel_store *s, const sel_key *key);
/* The oldest parked record after *key (key none: the first), in park
 * order: 1 with *key set, 0 at the end. */
int sel_disk_store_next_parked(sel_store *s, sel_key *key);

/* Write a parked, charged record from the caller's slots: pages[tail] page
 * record addresses (sel_record_page_addr of its flags) and, with its row,
 * the row pieces (sel_record_row_iov).  The buffers belong to the disk
 * thread until the written hook runs with arg.  On success the record is committed
 * (file, no longer parked, evictable); -ENOSPC/-EDQUOT keep it parked and
 * charged; other failures keep it parked (the composite drops it).  0, or
 * -EBUSY (already writing), -EINVAL (not parked, or uncharged), -EAGAIN. */
int sel_disk_store_write_from(sel_store *s, const sel_key *key, void *const *pages,
			      const struct iovec *row_iov, uint32_t row_n, void *arg);
/* Read a committed record's pages [0, tail) and, with row, its row into the
 * caller's slots (same addressing), verified; the record is pinned until
 * the read hook runs with arg.  A verification failure removes it with its descendants
 * and counts it.  0, -ESTALE (no file, or no row when asked), -EAGAIN. */
int sel_disk_store_read_into(sel_store *s, const sel_key *key, bool row, void *const *pages,
			     const struct iovec *row_iov, uint32_t row_n, void *arg);

/* The slots of one chain node's reserved memory copy (the composite's):
 * its page slots, then (the endpoint) its row slots, laid out as the
 * record's flags say (sel_record_page_addr, sel_record_row_iov). */
struct sel_disk_into {
	const uint32_t *slots;
	uint32_t n_page_slots, n_row_slots;
};
/* Fetch hit into in as sel_store_fetch does -- windows read and verified
 * on the disk thread, each copied in as soon as its read is verified --
 * but each window read into the caller's slots (into[i] for node i of the
 * chain above hit->resident, ascending) instead of intake slots, and the
 * slots left the caller's (issue 18, r26disk: a read-through whose
 * uploads overlap its reads).  Whole nodes only: hit->resident must be
 * where the chain's first node starts.  The read hook runs with arg and
 * the stream's status (0: every byte of every node landed verified in the
 * slots) after the stream's last read and copy ended, in the same poll
 * that returns its SEL_EV_FETCHED or SEL_EV_FETCH_FAILED.  0 started;
 * -ENOTSUP (not this shape: sharded, not whole nodes, slots that do not
 * match a record's layout; nothing started), or sel_store_fetch's
 * errors. */
int sel_disk_store_fetch_into(sel_store *s, const sel_hit *hit, const sel_inbound *in,
			      const struct sel_disk_into *into, uint32_t n_into, void *arg);

/* Remove a record and its descendants (at their last unpin), counting each
 * as dropped for reason (SEL_DISK_DROP_*).  0 or -ENOENT. */
enum {
	SEL_DISK_DROP_IO_ERROR = 1,
	SEL_DISK_DROP_OVERSIZE,
	SEL_DISK_DROP_END_OF_CHAIN
};
int sel_disk_store_drop(sel_store *s, const sel_key *key, int reason);

/* Pin a record against eviction and removal (0 or -ENOENT). */
int sel_disk_store_pin(sel_store *s, const sel_key *key);
void sel_disk_store_unpin(sel_store *s, const sel_key *key);

/* Whether every node of key's chain above resident has a committed file
 * (so the store's own fetch can stream it). */
bool sel_disk_store_chain_on_disk(sel_store *s, const sel_key *key, uint64_t resident);

/* The epoll descriptor the store's wait_fd returns (for nesting). */
int sel_disk_store_fd(sel_store *s);

/* Whether cp could ever be stored within the limit: its file bytes (per
 * rank, with its row) plus those of the ancestors it would link under. */
bool sel_disk_store_fits(sel_store *s, const sel_published *cp);

#endif
