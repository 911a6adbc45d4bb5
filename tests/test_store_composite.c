/*
 * test_store_composite.c - the composite store (design 2.4 CompositeStore;
 * implementation step 9): warm memory over the disk store, one slot pool,
 * host planes and the host copy backend.
 *
 * Covers: a memory hit (the record parked: complete in DRAM, indexed on
 * disk, no file); maintenance under memory pressure writing the oldest
 * parked records from their memory slots, never more than 2 x intake plus
 * one record ahead, and memory eviction taking only durable records; a
 * disk hit that reads through into memory and becomes a memory resident;
 * a fetch of a record whose write is in flight (served from memory); disk
 * eviction removing the memory copy; a record larger than memory stored
 * and fetched by streaming through staging, evicting no resident; a
 * parked record under ENOSPC kept and retried after a backoff; EIO at the
 * write dropping the record from both tiers and counting it; the drain on
 * shutdown and a restart reading records through.  Backpressure (design
 * 2.10): a put that warm memory cannot take because its slots hold
 * records still being written is SEL_RETRY (inflight) with no copy and
 * nothing streamed, SEL_EV_PROGRESS follows once a write commits (none
 * while nothing commits, none after a deferral), and the retry then lands
 * in memory; a refused record larger than 2 x intake makes maintenance
 * write ahead until it fits; at most two records larger than the warm pool
 * stream at once.  The subset invariant
 * (every memory record has a disk record; every parked record a pinned
 * memory copy) and both stores' checks run after every poll
 * (sel_composite_store_check).
 */
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "record.h"
#include "store_composite.h"
#include "store_disk.h"
#include "store_memory.h"
#include "storefx.h"

static test_rng rng;
static const uint64_t units2[] = {4096, 1000};

static int check(sel_store *s) { return sel_composite_store_check(s); }

/* ---- fault injection ---------------------------------------------------------------- */

static struct {
	int fallocate_err; /* errno for the next fallocate_n calls */
	int fallocate_n;
	int block_pwrite; /* pwrite waits while set */
	int blocked;      /* pwrites waiting */
	/* The first pread at a file offset in [pread_lo, pread_hi) fails with
	 * pread_err, or (pread_flip) returns its bytes with one flipped. */
	uint64_t pread_lo, pread_hi;
	int pread_err, pread_flip;
	int pread_hits;
} fi;

static ssize_t f_pread(int fd, void *b, size_t n, off_t off)
{
	bool in = (uint64_t)off >= fi.pread_lo && (uint64_t)off < fi.pread_hi;
	if (in && fi.pread_err && __atomic_fetch_add(&fi.pread_hits, 1, __ATOMIC_SEQ_CST) == 0) {
		errno = fi.pread_err;
		return -1;
	}
	ssize_t r = eos_fileops_libc.pread(fd, b, n, off);
	if (in && r > 0 && fi.pread_flip &&
	    __atomic_fetch_add(&fi.pread_hits, 1, __ATOMIC_SEQ_CST) == 0)
		((uint8_t *)b)[r / 2] ^= 0x5a;
	return r;
}

static int f_fallocate(int fd, int mode, off_t off, off_t len)
{
	if (__atomic_load_n(&fi.fallocate_n, __ATOMIC_SEQ_CST) > 0) {
		__atomic_sub_fetch(&fi.fallocate_n, 1, __ATOMIC_SEQ_CST);
		errno = fi.fallocate_err;
		return -1;
	}
	return eos_fileops_libc.fallocate(fd, mode, off, len);
}

static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t off)
{
	if (__atomic_load_n(&fi.block_pwrite, __ATOMIC_SEQ_CST)) {
		__atomic_add_fetch(&fi.blocked, 1, __ATOMIC_SEQ_CST);
		while (__atomic_load_n(&fi.block_pwrite, __ATOMIC_SEQ_CST))
			eos_sleep_ns(1000000);
		__atomic_sub_fetch(&fi.blocked, 1, __ATOMIC_SEQ_CST);
	}
	return eos_fileops_libc.pwrite(fd, b, n, off);
}

static struct eos_fileops fault_ops;

/* ---- helpers ---------------------------------------------------------------------- */

struct opts {
	uint64_t warm;  /* slots */
	uint64_t limit; /* bytes; 0 = 1 GiB */
	bool drain;
};

static sel_store *open_store(struct sfx *f, const char *base, struct opts o)
{
	sel_store_config cfg = sfx_config(f, false);
	cfg.memory_bytes = o.warm * f->slot_bytes;
	cfg.disk_dir = base;
	cfg.disk_limit = o.limit ? o.limit : 1ull << 30;
	cfg.drain_on_shutdown = o.drain;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(s && !strcmp(s->ops->name, "composite"));
	CHECK_OK(check(s));
	sel_stats st;
	sel_store_stats(s, &st);
	const char *want = sfx_device_mode() ? "cuda" : "host";
	CHECKF(!strcmp(st.transport, want), "transport %s, want %s", st.transport, want);
	return s;
}

static void close_store(sel_store *s)
{
	CHECK_OK(check(s));
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
}

static sel_stats stats(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	return st;
}

static struct sel_composite_gauges gauges(sel_store *s)
{
	struct sel_composite_gauges g;
	sel_composite_store_gauges(s, &g);
	return g;
}

static bool in_memory(sel_store *s, const sel_key *k)
{
	struct sel_memory_view v;
	return sel_memory_store_view(sel_composite_store_memory(s), k, &v) == 0 && v.ready;
}

static struct sel_disk_record_info drec(sel_store *s, const sel_key *k)
{
	struct sel_disk_record_info ri;
	CHECK_OK(sel_disk_store_record(sel_composite_store_disk(s), k, &ri));
	return ri;
}

static bool on_disk(sel_store *s, const sel_key *k)
{
	struct sel_disk_record_info ri;
	return sel_disk_store_record(sel_composite_store_disk(s), k, &ri) == 0;
}

/* The invariants and the write-ahead bound: at most the bound plus one
 * record (64 pages + a 3-slot row) is ever being written. */
static int check_bound(sel_store *s)
{
	int rc = check(s);
	if (rc)
		return rc;
	struct sel_composite_gauges g = gauges(s);
	CHECKF(g.writing_slots <= g.write_ahead_bound + 67,
	       "%" PRIu64 " slots being written, bound %" PRIu64, g.writing_slots,
	       g.write_ahead_bound);
	return 0;
}

/* One poll (only PROGRESS may come, counted in *progress), then a short
 * wait on the store's descriptor. */
static void pump(sel_store *s, int *progress) { sfx_pump(s, check_bound, progress); }

/* Until the maintenance the last calls started has finished; returns the
 * PROGRESS events seen. */
static int settle(sel_store *s) { return sfx_settle(s, check_bound); }

static sel_event store(sel_store *s, const sel_published *cp, sel_tier tier)
{
	sel_retry_reason why = SEL_RETRY_SLABS;
	sel_outcome o = sel_store_put(s, cp, &why);
	CHECKF(o == SEL_QUEUED, "put: %s (%s): %s", sel_outcome_name(o), sel_retry_reason_name(why),
	       sel_errmsg());
	CHECK_OK(check(s));
	sel_event ev;
	sfx_wait_events(s, &ev, 1, check);
	CHECKF(ev.type == SEL_EV_STORED, "event %d error %d (%s)", ev.type, ev.error,
	       sel_strerror(ev.error));
	CHECK(ev.checkpoint == cp->checkpoint && sel_key_eq(&ev.key, &cp->key));
	CHECKF(ev.tier == tier, "stored in %s", sel_tier_name(ev.tier));
	return ev;
}

static sel_event restore(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t resident,
			 uint64_t want_c, uint32_t dst, uint32_t slot, sel_tier tier)
{
	sel_event ev =
		sfx_restore(f, s, cv, resident, UINT64_MAX, want_c, dst, slot, tier, true, check);
	CHECKF(ev.tier == tier, "restored from %s", sel_tier_name(ev.tier));
	return ev;
}

/* ---- memory hit, pressure, durability, read-through ------------------------------------- */

static void test_tiers(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 2048, 16);
	char *base = test_mkdtemp("tiers");
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 600});
	sel_stats st = stats(s);
	CHECK(st.intake_slots == 134 && st.slots_total == 734);
	sel_store_info info;
	sel_store_describe(s, &info);
	CHECK(!strcmp(info.kind, "composite") && info.disk_dir && info.scanned_records == 0);

	/* A memory hit: parked (no file), restorable, announced. */
	struct sfx_conv a;
	sfx_conv_init(&fx, &a, 1, 300, 0);
	sel_published cpa = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	store(s, &cpa, SEL_TIER_MEMORY);
	struct sel_disk_record_info di = drec(s, &cpa.key);
	CHECK(di.parked && di.ready && !di.file && di.charged && !di.writing);
	CHECK(in_memory(s, &cpa.key) && stats(s).parked_records == 1);
	CHECK(sel_store_put(s, &cpa, NULL) == SEL_PRESENT);
	restore(&fx, s, &a, 0, 256, 500, 2, SEL_TIER_MEMORY);
	restore(&fx, s, &a, 128, 256, 500, 3, SEL_TIER_MEMORY);
	CHECK(gauges(s).writes_started == 0); /* plenty of room: no write yet */

	/* Pressure: 64-page records (67 slots) until free + clean falls below
	 * 2 x intake = 268; the oldest parked records get written, at most
	 * 268 slots (+ one record) ahead, and memory evicts durable records
	 * only (the check: every parked record keeps a pinned copy). */
	enum {
		N = 14
	};
	uint64_t streamed = 0; /* puts memory could not take now: straight to disk */
	struct sfx_conv cv[N];
	sel_published cp[N];
	for (int i = 0; i < N; i++) {
		sfx_conv_init(&fx, &cv[i], 10 + (uint64_t)i, 64 * 64 + 30, (uint32_t)(70 + i * 66));
		cp[i] = sfx_ckpt(&fx, &cv[i], 64 * 64, 0, 4, (uint64_t)i + 10);
		sel_retry_reason why;
		sel_outcome o;
		uint64_t deadline = eos_now_ns() + 10000000000ull;
		while ((o = sel_store_put(s, &cp[i], &why)) == SEL_RETRY) {
			CHECK(eos_now_ns() < deadline);
			pump(s, NULL);
		}
		CHECKF(o == SEL_QUEUED, "put %d: %s", i, sel_outcome_name(o));
		sel_event ev;
		sfx_wait_events(s, &ev, 1, check);
		CHECK(ev.type == SEL_EV_STORED && ev.checkpoint == cp[i].checkpoint);
		streamed += ev.tier == SEL_TIER_DISK;
		settle(s);
	}
	settle(s);
	struct sel_composite_gauges g = gauges(s);
	st = stats(s);
	printf("  pressure: %" PRIu64 " writes, max %" PRIu64 " slots ahead (bound %" PRIu64
	       "), %" PRIu64 " parked, %" PRIu64 " memory evictions\n",
	       g.writes_done, g.max_writing_slots, g.write_ahead_bound, st.parked_records,
	       st.tier[SEL_TIER_MEMORY].evicted);
	CHECK(g.writes_done > 0 && g.max_writing_slots <= g.write_ahead_bound + 67);
	CHECK(st.tier[SEL_TIER_MEMORY].evicted > 0);
	CHECK(st.tier[SEL_TIER_DISK].held == g.writes_done + streamed); /* held once written */
	/* The oldest record left memory but not the disk. */
	CHECK(!in_memory(s, &cp[0].key) && drec(s, &cp[0].key).file);

	/* A disk hit reads through and becomes a memory resident. */
	uint64_t rt = g.read_through;
	restore(&fx, s, &cv[0], 0, 64 * 64, 0, 5, SEL_TIER_DISK);
	CHECK(gauges(s).read_through == rt + 1 && in_memory(s, &cp[0].key));
	restore(&fx, s, &cv[0], 100, 64 * 64, 0, 6, SEL_TIER_MEMORY);
	st = stats(s);
	CHECK(st.tier[SEL_TIER_DISK].bytes_in > 0 && st.fetch_failures == 0);
	g = gauges(s);
	bool parked[N];
	int n_parked = 0;
	for (int i = 0; i < N; i++) { /* parked and not being written: lost at close */
		struct sel_disk_record_info ri = drec(s, &cp[i].key);
		n_parked += parked[i] = ri.parked && !ri.writing;
	}
	CHECK(n_parked > 0 && drec(s, &cpa.key).file);
	close_store(s);

	/* A restart: every written record is there; the parked ones (never
	 * written, no drain) are gone, and reads go through memory again. */
	s = open_store(&fx, base, (struct opts){.warm = 600});
	CHECKF(test_store_scanned(s) == (uint64_t)(N + 1 - n_parked), "%" PRIu64 " scanned",
	       test_store_scanned(s));
	for (int i = 0; i < N; i++) /* parked only: lost without a drain */
		CHECK(on_disk(s, &cp[i].key) == !parked[i]);
	restore(&fx, s, &cv[0], 0, 64 * 64, 0, 5, SEL_TIER_DISK);
	restore(&fx, s, &cv[0], 0, 64 * 64, 200, 5, SEL_TIER_MEMORY);
	close_store(s);

	sfx_conv_free(&a);
	for (int i = 0; i < N; i++)
		sfx_conv_free(&cv[i]);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* A chain: read-through of non-resident ancestors links in memory. */
static void test_chain_read_through(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("chainrt");
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 600, .drain = true});
	struct sfx_conv a;
	sfx_conv_init(&fx, &a, 20, 1100, 10);
	sel_published p = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	sel_published q = sfx_ckpt(&fx, &a, 640, 256, 2, 2);
	sel_published r = sfx_ckpt(&fx, &a, 1000, 640, 3, 3);
	store(s, &p, SEL_TIER_MEMORY);
	store(s, &q, SEL_TIER_MEMORY);
	store(s, &r, SEL_TIER_MEMORY);
	CHECK(!drec(s, &q.key).is_root && !drec(s, &r.key).is_root);
	CHECK(!drec(s, &q.key).has_row); /* only child committed: its row goes */
	close_store(s);                  /* drains: all three written */
	s = open_store(&fx, base, (struct opts){.warm = 600});
	CHECK(test_store_scanned(s) == 3);
	restore(&fx, s, &a, 0, 1000, 100, 4, SEL_TIER_DISK);
	CHECK(in_memory(s, &p.key) && in_memory(s, &q.key) && in_memory(s, &r.key));
	restore(&fx, s, &a, 300, 1000, 100, 5, SEL_TIER_MEMORY);
	/* From a GPU-resident prefix whose parent is not in memory: a resident
	 * chain is found in memory all the same. */
	restore(&fx, s, &a, 700, 1000, 100, 6, SEL_TIER_MEMORY);
	close_store(s);
	/* After another restart, a restore from inside q: q's parent p is not
	 * in memory and q is no root, so the chain streams. */
	s = open_store(&fx, base, (struct opts){.warm = 600});
	uint64_t streamed = gauges(s).streamed;
	restore(&fx, s, &a, 300, 1000, 100, 7, SEL_TIER_DISK);
	CHECK(gauges(s).streamed == streamed + 1 && !in_memory(s, &r.key));
	close_store(s);
	sfx_conv_free(&a);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- read-through window by window (issue 18, r26disk) ------------------------------------ */

/* A 256-page record on disk only: its read-through reads four windows and
 * the row into the reserved memory slots and uploads each as it lands. */
struct ovl {
	struct sfx fx;
	char *base;
	struct sfx_conv a;
	sel_published cp;
	uint64_t lo, hi; /* file offsets of the second half of its page records */
};

static void ovl_init(struct ovl *o)
{
	sfx_init(&o->fx, 1, 2, units2, 20000, 1024, 16);
	o->base = test_mkdtemp("overlap");
	sfx_conv_init(&o->fx, &o->a, 77, 256 * SFX_PT + 10, 10);
	o->cp = sfx_ckpt(&o->fx, &o->a, 256 * SFX_PT, 0, 1, 1);
	sel_store *s = open_store(&o->fx, o->base, (struct opts){.warm = 600, .drain = true});
	store(s, &o->cp, SEL_TIER_MEMORY);
	char name[SEL_RECORD_NAME_MAX], path[4200];
	sel_record_name(&o->cp.key, name);
	snprintf(path, sizeof path, "%s/%s", test_store_dir(s), name);
	close_store(s); /* drains: the record is written */
	struct stat st;
	CHECK(stat(path, &st) == 0);
	/* Pages, then the row (about 20 KB) at the end of the file. */
	o->lo = (uint64_t)st.st_size / 2;
	o->hi = (uint64_t)st.st_size - (64u << 10);
	CHECK(o->lo < o->hi);
}

static void ovl_free(struct ovl *o)
{
	sfx_conv_free(&o->a);
	test_rmtree(o->base);
	free(o->base);
	sfx_free(&o->fx);
}

/* Fetch the record into pages 100.. and row slot 5; its event. */
static sel_event ovl_fetch(sel_store *s, struct ovl *o, uint64_t ticket)
{
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &o->a.h, 0, UINT64_MAX, &hit), 1);
	CHECKF(hit.tier == SEL_TIER_DISK && hit.pages == 256, "%s, %" PRIu32 " pages",
	       sel_tier_name(hit.tier), hit.pages);
	CHECK_OK(sfx_fetch_at(s, &hit, 100, 5, ticket));
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	for (;;) {
		CHECK(eos_now_ns() < deadline);
		int n = sfx_poll_wait(s, ev, 8);
		CHECK_OK(check(s));
		for (int i = 0; i < n; i++)
			if (ev[i].type != SEL_EV_PROGRESS) {
				CHECK(ev[i].ticket == ticket && n == i + 1);
				return ev[i];
			}
	}
}

/* A read that fails mid-stream (err: EIO; else a flipped byte): the fetch
 * fails, nothing is admitted to memory, every reserved slot comes back. */
static void ovl_fault(struct ovl *o, int err)
{
	sel_store *s = open_store(&o->fx, o->base, (struct opts){.warm = 600});
	uint64_t used = stats(s).slots_in_use;
	uint64_t ovl0 = gauges(s).read_through_overlapped;
	fi.pread_lo = o->lo;
	fi.pread_hi = o->hi;
	fi.pread_err = err;
	fi.pread_flip = !err;
	fi.pread_hits = 0;
	eos_fileops_set(&fault_ops);
	sfx_poison(&o->fx);
	sel_event ev = ovl_fetch(s, o, 9);
	eos_fileops_set(NULL);
	fi.pread_err = fi.pread_flip = 0;
	CHECKF(ev.type == SEL_EV_FETCH_FAILED, "event %d", ev.type);
	CHECK(err ? ev.error == -err : ev.error == SEL_ECORRUPT);
	CHECK(fi.pread_hits >= 1 && gauges(s).read_through_overlapped == ovl0 + 1);
	CHECK(!in_memory(s, &o->cp.key));
	/* Every reserved slot comes back once the failed stream is torn down. */
	SFX_UNTIL(s, check_bound, stats(s).slots_in_use == used);
	sel_stats st = stats(s);
	CHECK(st.fetch_failures == 1);
	if (!err) {
		/* A record that lied is gone from both tiers: a miss. */
		sel_hit hit;
		CHECK_RC(sel_store_lookup(s, &o->a.h, 0, UINT64_MAX, &hit), 0);
	} else if (on_disk(s, &o->cp.key)) {
		/* Still indexed: read through again, byte-exact. */
		restore(&o->fx, s, &o->a, 0, 256 * SFX_PT, 100, 5, SEL_TIER_DISK);
		CHECK(in_memory(s, &o->cp.key));
	}
	close_store(s);
}

static void test_overlapped_read_through(void)
{
	setenv("SELENE_DISK_IO", "pread", 1); /* the fault hooks see every payload read */
	struct ovl o;
	ovl_init(&o);

	/* Clean: byte-exact in the destination, admitted to memory, served
	 * from memory next. */
	sel_store *s = open_store(&o.fx, o.base, (struct opts){.warm = 600});
	struct sel_composite_gauges g = gauges(s);
	restore(&o.fx, s, &o.a, 0, 256 * SFX_PT, 100, 5, SEL_TIER_DISK);
	CHECK(gauges(s).read_through == g.read_through + 1 &&
	      gauges(s).read_through_overlapped == g.read_through_overlapped + 1 &&
	      gauges(s).streamed == g.streamed);
	CHECK(in_memory(s, &o.cp.key) && stats(s).read_through_bytes > 0);
	restore(&o.fx, s, &o.a, 0, 256 * SFX_PT, 400, 6, SEL_TIER_MEMORY);
	close_store(s);

	ovl_fault(&o, EIO);
	ovl_free(&o);
	ovl_init(&o); /* (a fresh directory: the fault may have dropped it) */
	ovl_fault(&o, 0);
	ovl_free(&o);

	/* A stop during the fetch: the close lets it finish, and the store
	 * closes clean with nothing held. */
	ovl_init(&o);
	s = open_store(&o.fx, o.base, (struct opts){.warm = 600});
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &o.a.h, 0, UINT64_MAX, &hit), 1);
	CHECK_OK(sfx_fetch_at(s, &hit, 100, 5, 11));
	CHECK(gauges(s).busy || !sfx_quiet(s));
	close_store(s);
	ovl_free(&o);
	unsetenv("SELENE_DISK_IO");
}

/* ---- in-flight writes, disk eviction, streaming ------------------------------------------- */

static bool has_writing(void *arg)
{
	return __atomic_load_n(&fi.blocked, __ATOMIC_SEQ_CST) > 0 && arg;
}

static void test_inflight_write(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("inflight");
	setenv("SELENE_DISK_IO", "pread", 1);
	/* Warm 60 slots < 2 x intake: every parked record is written at once. */
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 60});
	eos_fileops_set(&fault_ops);
	__atomic_store_n(&fi.block_pwrite, 1, __ATOMIC_SEQ_CST);
	struct sfx_conv a;
	sfx_conv_init(&fx, &a, 30, 300, 10);
	sel_published cp = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	store(s, &cp, SEL_TIER_MEMORY);
	sfx_pump_until(s, has_writing, s, NULL, NULL, 0, check);
	CHECK(drec(s, &cp.key).writing && drec(s, &cp.key).parked);
	/* Its write is in flight: the DRAM copy serves it. */
	restore(&fx, s, &a, 0, 256, 100, 2, SEL_TIER_MEMORY);
	CHECK(drec(s, &cp.key).writing);
	__atomic_store_n(&fi.block_pwrite, 0, __ATOMIC_SEQ_CST);
	uint64_t deadline = eos_now_ns() + 10000000000ull;
	while (!drec(s, &cp.key).file) {
		CHECK(eos_now_ns() < deadline);
		pump(s, NULL);
	}
	CHECK(!drec(s, &cp.key).parked && stats(s).parked_records == 0);
	eos_fileops_set(NULL);
	close_store(s);
	unsetenv("SELENE_DISK_IO");
	sfx_conv_free(&a);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

static void test_disk_eviction(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("deviction");
	struct sfx_conv cv[6];
	sel_published cp[6];
	for (int i = 0; i < 6; i++) {
		sfx_conv_init(&fx, &cv[i], 40 + (uint64_t)i, 300, (uint32_t)(10 + 5 * i));
		cp[i] = sfx_ckpt(&fx, &cv[i], 256, 0, (uint32_t)i, (uint64_t)i + 1);
	}
	/* A 4-page record is 61440 bytes: the limit holds three. */
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 60, .limit = 3 * 61440 + 1000});
	for (int i = 0; i < 3; i++) {
		cp[i] = sfx_ckpt(&fx, &cv[i], 256, 0, (uint32_t)i, (uint64_t)i + 1);
		store(s, &cp[i], SEL_TIER_MEMORY);
		uint64_t deadline = eos_now_ns() + 10000000000ull;
		while (!drec(s, &cp[i].key).file) {
			CHECK(eos_now_ns() < deadline);
			pump(s, NULL);
		}
	}
	CHECK(in_memory(s, &cp[0].key));
	/* The fourth evicts the least recently used committed record on disk,
	 * and with it its memory copy. */
	cp[3] = sfx_ckpt(&fx, &cv[3], 256, 0, 3, 4);
	store(s, &cp[3], SEL_TIER_MEMORY);
	settle(s);
	CHECK(!on_disk(s, &cp[0].key) && !in_memory(s, &cp[0].key));
	CHECK(on_disk(s, &cp[1].key) && in_memory(s, &cp[1].key));
	sel_stats st = stats(s);
	CHECK(st.tier[SEL_TIER_DISK].evicted == 1);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &cv[0].h, 0, 300, &hit), 0);
	close_store(s);
	for (int i = 0; i < 6; i++)
		sfx_conv_free(&cv[i]);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

static void test_streaming(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *base = test_mkdtemp("stream");
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 60});
	struct sfx_conv r1, r2, big;
	sfx_conv_init(&fx, &r1, 50, 300, 0);
	sfx_conv_init(&fx, &r2, 51, 300, 10);
	sfx_conv_init(&fx, &big, 52, 100 * 64 + 10, 100);
	sel_published c1 = sfx_ckpt(&fx, &r1, 256, 0, 1, 1);
	sel_published c2 = sfx_ckpt(&fx, &r2, 256, 0, 2, 2);
	store(s, &c1, SEL_TIER_MEMORY);
	store(s, &c2, SEL_TIER_MEMORY);
	/* 100 pages: more than the warm pool -- streamed to disk, no DRAM copy. */
	sel_published cb = sfx_ckpt(&fx, &big, 100 * 64, 0, 3, 3);
	store(s, &cb, SEL_TIER_DISK);
	CHECK(drec(s, &cb.key).file && !in_memory(s, &cb.key));
	settle(s);
	CHECK(in_memory(s, &c1.key) && in_memory(s, &c2.key));
	uint64_t ev0 = stats(s).tier[SEL_TIER_MEMORY].evicted;
	/* Its restore streams through intake and evicts no resident. */
	restore(&fx, s, &big, 0, 100 * 64, 200, 4, SEL_TIER_DISK);
	restore(&fx, s, &big, 70 * 64 + 5, 100 * 64, 200, 5, SEL_TIER_DISK);
	CHECK(in_memory(s, &c1.key) && in_memory(s, &c2.key) && !in_memory(s, &cb.key));
	CHECK(stats(s).tier[SEL_TIER_MEMORY].evicted == ev0);
	restore(&fx, s, &r1, 0, 256, 300, 6, SEL_TIER_MEMORY);
	close_store(s);
	sfx_conv_free(&r1);
	sfx_conv_free(&r2);
	sfx_conv_free(&big);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- write failures ------------------------------------------------------------------------ */

static void test_write_failures(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("wfail");
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 60});
	eos_fileops_set(&fault_ops);
	struct sfx_conv a, b;
	sfx_conv_init(&fx, &a, 60, 300, 10);
	sfx_conv_init(&fx, &b, 61, 300, 20);

	/* ENOSPC: parked, retried after a backoff, durable in the end. */
	__atomic_store_n(&fi.fallocate_err, ENOSPC, __ATOMIC_SEQ_CST);
	__atomic_store_n(&fi.fallocate_n, 2, __ATOMIC_SEQ_CST);
	sel_published ca = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	store(s, &ca, SEL_TIER_MEMORY);
	uint64_t t0 = eos_now_ns(), deadline = t0 + 10000000000ull;
	while (!drec(s, &ca.key).file) {
		CHECK(eos_now_ns() < deadline);
		struct sel_composite_gauges g = gauges(s);
		if (!drec(s, &ca.key).file && g.writes_retried)
			CHECK(drec(s, &ca.key).parked && in_memory(s, &ca.key));
		pump(s, NULL);
	}
	struct sel_composite_gauges g = gauges(s);
	CHECK(g.writes_retried == 2 && g.writes_done == 3);
	CHECK(eos_now_ns() - t0 >= 50 * 1000000ull); /* backed off */
	restore(&fx, s, &a, 0, 256, 100, 2, SEL_TIER_MEMORY);

	/* EIO: dropped from both tiers, counted. */
	__atomic_store_n(&fi.fallocate_err, EIO, __ATOMIC_SEQ_CST);
	__atomic_store_n(&fi.fallocate_n, 1, __ATOMIC_SEQ_CST);
	sel_published cb = sfx_ckpt(&fx, &b, 256, 0, 2, 2);
	store(s, &cb, SEL_TIER_MEMORY);
	deadline = eos_now_ns() + 10000000000ull;
	while (on_disk(s, &cb.key)) {
		CHECK(eos_now_ns() < deadline);
		pump(s, NULL);
	}
	settle(s);
	CHECK(!in_memory(s, &cb.key));
	sel_stats st = stats(s);
	CHECK(st.tier[SEL_TIER_DISK].dropped_io_error == 1);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &b.h, 0, 300, &hit), 0);
	CHECK(on_disk(s, &ca.key) && in_memory(s, &ca.key));
	eos_fileops_set(NULL);
	close_store(s);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- backpressure (design 2.10) ------------------------------------------------------------- */

/* Poll (checking) until a SEL_EV_PROGRESS arrives or ms pass; events of
 * other kinds are counted in *other (may be NULL). */
static bool wait_progress(sel_store *s, int ms, int *other)
{
	uint64_t end = eos_now_ns() + (uint64_t)ms * 1000000;
	for (;;) {
		sel_event ev[8];
		int n = sel_store_poll(s, ev, 8);
		CHECK_OK(n);
		CHECK_OK(check(s));
		bool got = false;
		for (int i = 0; i < n; i++) {
			if (ev[i].type == SEL_EV_PROGRESS)
				got = true;
			else if (other)
				(*other)++;
		}
		if (got)
			return true;
		if (eos_now_ns() >= end)
			return false;
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		poll(&pfd, 1, 5);
	}
}

/* Put cp, and after each refusal wait for the progress that announces
 * room: every refusal must be followed by one.  Returns the refusals. */
static int put_after_progress(sel_store *s, const sel_published *cp, int max_refusals)
{
	int refusals = 0;
	sel_retry_reason why;
	sel_outcome o;
	while ((o = sel_store_put(s, cp, &why)) == SEL_RETRY) {
		CHECKF(why == SEL_RETRY_INFLIGHT || why == SEL_RETRY_SLABS, "retry for %s",
		       sel_retry_reason_name(why));
		CHECKF(++refusals <= max_refusals, "%d refusals", refusals);
		CHECKF(wait_progress(s, 10000, NULL), "no progress after refusal %d", refusals);
	}
	CHECKF(o == SEL_QUEUED, "put: %s", sel_outcome_name(o));
	return refusals;
}

static void test_retry_instead_of_stream(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *base = test_mkdtemp("backpressure");
	setenv("SELENE_DISK_IO", "pread", 1);
	/* Warm 60 slots < 2 x intake: every parked record is written at once. */
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 60});
	eos_fileops_set(&fault_ops);
	__atomic_store_n(&fi.block_pwrite, 1, __ATOMIC_SEQ_CST);
	/* 4-page records of 7 slots: eight fill the pool, dirty, their writes
	 * stuck behind a blocked pwrite. */
	enum {
		N = 9
	};
	struct sfx_conv cv[N];
	sel_published cp[N];
	for (int i = 0; i < N; i++) {
		sfx_conv_init(&fx, &cv[i], 80 + (uint64_t)i, 300, (uint32_t)(10 * i));
		cp[i] = sfx_ckpt(&fx, &cv[i], 256, 0, (uint32_t)(i % 15) + 1, (uint64_t)i + 1);
	}
	for (int i = 0; i < N - 1; i++)
		store(s, &cp[i], SEL_TIER_MEMORY);
	/* Maintenance starts the oldest record's write, which blocks. */
	uint64_t deadline = eos_now_ns() + 10000000000ull;
	while (!has_writing(s)) {
		CHECK(eos_now_ns() < deadline);
		pump(s, NULL);
	}
	CHECK(drec(s, &cp[0].key).writing);
	/* The ninth: memory is held by records not yet durable.  Retry, with
	 * no copy (so no GPU pin) and nothing streamed to disk. */
	sel_stats st0 = stats(s);
	struct sel_composite_gauges g0 = gauges(s);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &cp[N - 1], &why) == SEL_RETRY && why == SEL_RETRY_INFLIGHT);
	sel_stats st = stats(s);
	struct sel_composite_gauges g = gauges(s);
	CHECK(st.inflight_out == st0.inflight_out && g.streamed == g0.streamed);
	CHECK(g.refused_full == g0.refused_full + 1 &&
	      st.outcomes[SEL_RETRY] == st0.outcomes[SEL_RETRY] + 1);
	CHECK(!on_disk(s, &cp[N - 1].key) && !in_memory(s, &cp[N - 1].key));
	/* Nothing commits while the write is blocked in pwrite: no progress. */
	int other = 0, progress = 0;
	CHECK(has_writing(s));
	pump(s, &progress);
	CHECK(progress == 0);
	/* A write commits: progress, and the retry lands in memory (evicting
	 * the durable record). */
	__atomic_store_n(&fi.block_pwrite, 0, __ATOMIC_SEQ_CST);
	CHECK(wait_progress(s, 10000, &other) && other == 0);
	CHECK(gauges(s).progress == g0.progress + 1);
	put_after_progress(s, &cp[N - 1], 4);
	sel_event ev;
	sfx_wait_events(s, &ev, 1, check);
	CHECK(ev.type == SEL_EV_STORED && ev.tier == SEL_TIER_MEMORY && ev.checkpoint == N);
	CHECK(in_memory(s, &cp[N - 1].key));
	settle(s);

	/* Records larger than the warm pool (60 pages + a 3-slot row) still
	 * stream, at most two at once. */
	struct sfx_conv big[3];
	sel_published cb[3];
	for (int i = 0; i < 3; i++) {
		sfx_conv_init(&fx, &big[i], 90 + (uint64_t)i, 60 * 64 + 10,
			      (uint32_t)(100 + 70 * i));
		cb[i] = sfx_ckpt(&fx, &big[i], 60 * 64, 0, (uint32_t)(12 + i), 20 + (uint64_t)i);
	}
	__atomic_store_n(&fi.block_pwrite, 1, __ATOMIC_SEQ_CST);
	g0 = gauges(s);
	CHECK(sel_store_put(s, &cb[0], &why) == SEL_QUEUED);
	CHECK(sel_store_put(s, &cb[1], &why) == SEL_QUEUED);
	CHECK(gauges(s).streaming == 2 && gauges(s).streamed == g0.streamed + 2);
	CHECK(sel_store_put(s, &cb[2], &why) == SEL_RETRY && why == SEL_RETRY_INFLIGHT);
	CHECK_OK(check(s));
	__atomic_store_n(&fi.block_pwrite, 0, __ATOMIC_SEQ_CST);
	sel_event two[2];
	sfx_wait_events(s, two, 2, check);
	CHECK(two[0].type == SEL_EV_STORED && two[1].type == SEL_EV_STORED);
	CHECK(two[0].tier == SEL_TIER_DISK && gauges(s).streaming == 0);
	CHECK(sel_store_put(s, &cb[2], &why) == SEL_QUEUED);
	sfx_wait_events(s, &ev, 1, check);
	CHECK(ev.type == SEL_EV_STORED && ev.checkpoint == 22 && drec(s, &cb[2].key).file);
	settle(s);

	/* A deferral is no progress: a streamed record the disk refuses with
	 * ENOSPC is deferred, and no PROGRESS follows it. */
	struct sfx_conv dv;
	sfx_conv_init(&fx, &dv, 95, 60 * 64 + 10, 400);
	sel_published cd = sfx_ckpt(&fx, &dv, 60 * 64, 0, 15, 30);
	__atomic_store_n(&fi.fallocate_err, ENOSPC, __ATOMIC_SEQ_CST);
	__atomic_store_n(&fi.fallocate_n, 1, __ATOMIC_SEQ_CST);
	CHECK(sel_store_put(s, &cd, &why) == SEL_QUEUED);
	sfx_wait_events(s, &ev, 1, check);
	CHECKF(ev.type == SEL_EV_STORE_FAILED && ev.outcome == SEL_DEFERRED &&
		       ev.why == SEL_RETRY_BUDGET,
	       "event %d outcome %s", ev.type, sel_outcome_name(ev.outcome));
	/* Everything the deferral set off has finished: no progress came. */
	CHECK(settle(s) == 0);
	__atomic_store_n(&fi.fallocate_n, 0, __ATOMIC_SEQ_CST);

	eos_fileops_set(NULL);
	close_store(s);
	unsetenv("SELENE_DISK_IO");
	for (int i = 0; i < N; i++)
		sfx_conv_free(&cv[i]);
	for (int i = 0; i < 3; i++)
		sfx_conv_free(&big[i]);
	sfx_conv_free(&dv);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* A refused record that needs more than the free and clean warm slots
 * while the floor (free + clean >= 2 x intake, intake slots counting as
 * free) is met: maintenance writes ahead until it fits (the design's "one
 * largest record" of write-ahead), so its retry is not left waiting for
 * progress that the floor alone would never make. */
static void test_refused_need_writes_ahead(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *base = test_mkdtemp("wantslots");
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 600});
	enum {
		N = 8
	};
	struct sfx_conv cv[N];
	for (int i = 0; i < N; i++) {
		sfx_conv_init(&fx, &cv[i], 100 + (uint64_t)i, 64 * 64 + 30, (uint32_t)(65 * i));
		sel_published cp =
			sfx_ckpt(&fx, &cv[i], 64 * 64, 0, (uint32_t)i + 1, (uint64_t)i + 1);
		put_after_progress(s, &cp, 8);
		sel_event ev;
		sfx_wait_events(s, &ev, 1, check);
		CHECK(ev.type == SEL_EV_STORED);
		settle(s);
	}
	settle(s);
	uint64_t in_use, pinned, free_warm;
	sel_memory_store_counts(sel_composite_store_memory(s), &in_use, &pinned, &free_warm);
	uint64_t room = free_warm + in_use - pinned;
	uint32_t pages = (uint32_t)(room + 20 - fx.row_slots);
	/* The floor is met (no write in flight), yet dirty records hold what
	 * the record needs. */
	CHECKF(pinned > 20 && room + 20 <= 600 && 520 + pages < 1024 &&
		       gauges(s).writing_slots == 0,
	       "free %" PRIu64 ", in use %" PRIu64 ", dirty %" PRIu64, free_warm, in_use, pinned);
	struct sfx_conv bv;
	sfx_conv_init(&fx, &bv, 120, (uint64_t)pages * 64 + 10, 520);
	sel_published cb = sfx_ckpt(&fx, &bv, (uint64_t)pages * 64, 0, 12, 50);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &cb, &why) == SEL_RETRY && why == SEL_RETRY_INFLIGHT);
	CHECK(gauges(s).want_slots == room + 20 && gauges(s).write_ahead_bound >= room + 20);
	CHECK(wait_progress(s, 10000, NULL));
	int refusals = put_after_progress(s, &cb, 16);
	sel_event ev;
	sfx_wait_events(s, &ev, 1, check);
	CHECK(ev.type == SEL_EV_STORED && ev.tier == SEL_TIER_MEMORY);
	printf("  a record of %u slots, %" PRIu64 " warm slots free or clean: written ahead, "
	       "stored after %d more refusals\n",
	       pages + fx.row_slots, room, refusals);
	close_store(s);
	for (int i = 0; i < N; i++)
		sfx_conv_free(&cv[i]);
	sfx_conv_free(&bv);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- TP2: DRAM's packing decisions reach the files -------------------------------------------- */

static void test_tp2(void)
{
	struct sfx fx;
	sfx_init(&fx, 2, 2, units2, 10000, 512, 8);
	char *base = test_mkdtemp("ctp2");
	sel_store *s = open_store(&fx, base, (struct opts){.warm = 600, .drain = true});
	struct sfx_conv rep, split;
	sfx_conv_init(&fx, &rep, 70, 700, 0);
	sfx_conv_init(&fx, &split, 71, 300, 100);
	split.split = true;
	sel_published a = sfx_ckpt(&fx, &rep, 640, 0, 1, 1);
	sel_published b = sfx_ckpt(&fx, &split, 256, 0, 2, 2);
	store(s, &a, SEL_TIER_MEMORY);
	store(s, &b, SEL_TIER_MEMORY);
	CHECK(drec(s, &a.key).flags == (SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED));
	CHECK(drec(s, &b.key).flags == 0);
	close_store(s); /* drain: written with DRAM's decisions */
	s = open_store(&fx, base, (struct opts){.warm = 600});
	CHECK(test_store_scanned(s) == 2);
	restore(&fx, s, &rep, 0, 640, 200, 3, SEL_TIER_DISK); /* read through, packed */
	restore(&fx, s, &rep, 3 * 64 + 1, 640, 200, 4, SEL_TIER_MEMORY);
	restore(&fx, s, &split, 0, 256, 300, 5, SEL_TIER_DISK);
	close_store(s);
	/* And streamed (warm too small to read through). */
	s = open_store(&fx, base, (struct opts){.warm = 8});
	restore(&fx, s, &rep, 64 + 1, 640, 200, 3, SEL_TIER_DISK);
	close_store(s);
	sfx_conv_free(&rep);
	sfx_conv_free(&split);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* tests/test_store_composite_cuda.c runs these with device planes through
 * the CUDA backend: it includes this file with STORE_TEST_MAIN defined. */
#ifndef STORE_TEST_MAIN
#define STORE_TEST_MAIN main
#endif
int STORE_TEST_MAIN(void)
{
	test_rng_init(&rng, test_seed());
	unsetenv("SELENE_DISK_IO");
	unsetenv("SELENE_DISK_DIRECT");
	fault_ops = eos_fileops_libc;
	fault_ops.fallocate = f_fallocate;
	fault_ops.pwrite = f_pwrite;
	fault_ops.pread = f_pread;
	test_tiers();
	test_chain_read_through();
	test_overlapped_read_through();
	test_inflight_write();
	test_disk_eviction();
	test_streaming();
	test_write_failures();
	test_retry_instead_of_stream();
	test_refused_need_writes_ahead();
	test_tp2();
	printf("test_store_composite: ok\n");
	return 0;
}
