/*
 * test_store_disk.c - the disk store (design 2.4 DiskStore, Staged
 * transport; implementation step 8) through the store interface, with host
 * planes, the host copy backend and a stub backend that holds or fails
 * copies.
 *
 * Covers: put -> QUEUED then exactly one STORED once the file commits, and
 * fetch -> exactly one FETCHED, byte-exact after poisoning the planes, for
 * records of 1, 64, 65 and 200 pages (one to four windows) and restores
 * that start inside a window; chains with GPU-resident prefix skips and the
 * row drop (file truncation) of a non-root parent whose only child commits;
 * restart: records written, the store closed, a new store on the same
 * directory scans them back and restores them byte-exact; namespaces --
 * another offload identity or layout fingerprint never hits, independent
 * namespaces share a base directory, and a second process on a locked
 * namespace fails at open without scanning or deleting anything (fork);
 * the disk limit -- LRU leaf eviction (an ancestor never before its
 * children), SEL_OVERSIZE for a record (with its ancestors) that can never
 * fit, SEL_RETRY budget while the records in the way are pinned, retry
 * slabs and queue when staging is busy; corruption -- a flipped byte in a
 * page, the row, the checksum segment or the header gives FETCH_FAILED,
 * never data, removes the file and its descendants and counts it, and a
 * header flipped before a restart is a miss; faults (ENOSPC, EIO) injected
 * at open, fallocate, pwrite, fdatasync, rename, directory fsync, pread and
 * unlink -- no crash, no committed record lost, no temporary left, the
 * counters name the cause; TP2 (replicated and split planes, written
 * per-rank).  The core cases run on both disk I/O paths (io_uring and
 * pread), each with and without O_DIRECT.  sel_disk_store_check runs after
 * every poll.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "faultfs.h"
#include "record.h"
#include "store_disk.h"
#include "storefx.h"
#include "recutil.h"

#define PT SFX_PT

static test_rng rng;
static const uint64_t units2[] = {4096, 1000};

static int check(sel_store *s) { return sel_disk_store_check(s); }

static uint64_t disk_used(sel_store *s)
{
	uint64_t used;
	sel_disk_store_usage(s, &used, NULL);
	return used;
}

/* ---- fault injection (through eos_fileops, tests/faultfs.c) ------------------------- */

/* Arm op (everything else cleared; temporaries' unlinks never fail) and
 * install the failing table. */
static void fi_arm(enum faultfs_op op, int e, int skip)
{
	faultfs_reset();
	faultfs.spare_tmp_unlink = true;
	faultfs_arm(op, e, skip);
	eos_fileops_set(faultfs_ops());
}

static void fi_off(void)
{
	eos_fileops_set(NULL);
	faultfs_reset();
}

/* ---- helpers ------------------------------------------------------------------------------ */

struct opts {
	uint64_t limit;
	bool stub, fdatasync;
	uint32_t queue_depth;
	const uint8_t *model; /* another model identity */
};

static sel_store *open_store(struct sfx *f, const char *base, struct opts o)
{
	sel_store_config cfg = sfx_config(f, o.stub);
	cfg.disk_dir = base;
	cfg.disk_limit = o.limit ? o.limit : 1ull << 30;
	cfg.fdatasync = o.fdatasync;
	cfg.queue_depth = o.queue_depth;
	if (o.model)
		sel_offload_identity(o.model, SEL_MODE_ORDINARY, cfg.identity);
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(s && !strcmp(s->ops->name, "disk"));
	CHECK_OK(check(s));
	sel_stats st;
	sel_store_stats(s, &st);
	const char *want = o.stub ? "stub" : sfx_device_mode() ? "cuda" : "host";
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

static struct sel_disk_record_info rec(sel_store *s, const sel_key *k)
{
	struct sel_disk_record_info ri;
	CHECK_OK(sel_disk_store_record(s, k, &ri));
	return ri;
}

static bool present(sel_store *s, const sel_key *k)
{
	struct sel_disk_record_info ri;
	return sel_disk_store_record(s, k, &ri) == 0;
}

static char *path_of(sel_store *s, const sel_key *k, char *buf, size_t len)
{
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(k, name);
	snprintf(buf, len, "%s/%s", test_store_dir(s), name);
	return buf;
}

static uint64_t fsize(sel_store *s, const sel_key *k)
{
	char p[4300];
	struct stat st;
	if (stat(path_of(s, k, p, sizeof p), &st) != 0)
		return UINT64_MAX;
	return (uint64_t)st.st_size;
}

static void flip(sel_store *s, const sel_key *k, uint64_t off)
{
	char p[4300];
	test_flip_byte(path_of(s, k, p, sizeof p), off);
}

/* Layout facts of a record of tail pages in fx's namespace. */
static sel_record_span span_of(struct sfx *f, const sel_published *cp, uint32_t tail, bool linked)
{
	sel_record_ns ns;
	uint8_t id[SEL_IDENTITY_BYTES];
	sel_offload_identity(f->model, SEL_MODE_ORDINARY, id);
	CHECK_OK(sel_record_ns_init(&ns, f->g, id));
	sel_record_desc d = {.key = cp->key, .bucket = cp->bucket, .tail = tail};
	if (linked)
		d.parent = cp->parent;
	sel_record_span sp;
	CHECK_OK(sel_record_span_of(&ns.layout.sz, &d, &sp));
	sel_record_ns_free(&ns);
	return sp;
}

static void put_ok(sel_store *s, const sel_published *cp)
{
	sel_retry_reason why = SEL_RETRY_SLABS;
	sel_outcome o = sel_store_put(s, cp, &why);
	CHECKF(o == SEL_QUEUED, "put: %s (%s): %s", sel_outcome_name(o), sel_retry_reason_name(why),
	       sel_errmsg());
	CHECK(why == SEL_RETRY_NONE);
	CHECK_OK(check(s));
}

static sel_event store(sel_store *s, const sel_published *cp)
{
	put_ok(s, cp);
	sel_event ev = sfx_one_event(s, check);
	CHECKF(ev.type == SEL_EV_STORED, "event %d error %d (%s)", ev.type, ev.error,
	       sel_strerror(ev.error));
	CHECK(ev.outcome == SEL_QUEUED && ev.checkpoint == cp->checkpoint &&
	      ev.tier == SEL_TIER_DISK);
	CHECK(sel_key_eq(&ev.key, &cp->key));
	return ev;
}

static sel_event restore(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t resident,
			 uint64_t limit, uint64_t want_c, uint32_t dst, uint32_t slot)
{
	return sfx_restore(f, s, cv, resident, limit, want_c, dst, slot, SEL_TIER_DISK, true,
			   check);
}

/* Fetch the deepest hit for cv at or below limit; return the event. */
static sel_event fetch_event(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t limit,
			     uint64_t want_c)
{
	return sfx_restore(f, s, cv, 0, limit, want_c, 300, 9, SEL_TIER_DISK, false, check);
}

/* ---- round trips --------------------------------------------------------------------------- */

static void test_roundtrip(const char *mode)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	CHECK(fx.slot_bytes == 8192 && fx.row_slots == 3);
	char *base = test_mkdtemp("rt");
	sel_store *s = open_store(&fx, base, (struct opts){0});
	CHECK(test_store_scanned(s) == 0 && test_store_limit(s) == 1ull << 30);
	sel_store_info info;
	sel_store_describe(s, &info);
	CHECK(!strcmp(info.kind, "disk") &&
	      !strcmp(info.transport, sfx_device_mode() ? "cuda" : "host"));
	CHECK(strstr(info.disk_dir, base) == info.disk_dir &&
	      info.slots_total == info.intake_slots);

	static const uint32_t sizes[] = {1, 64, 65, 200};
	struct sfx_conv cv[4];
	sel_published cp[4];
	for (int i = 0; i < 4; i++) {
		uint64_t c = (uint64_t)sizes[i] * PT + 17;
		sfx_conv_init(&fx, &cv[i], 100 + i, c + 40, (uint32_t)(i * 210));
		cp[i] = sfx_ckpt(&fx, &cv[i], c, 0, (uint32_t)i, (uint64_t)i + 1);
		sel_event ev = store(s, &cp[i]);
		CHECK(ev.bytes == sizes[i] * sfx_page_bytes_all(&fx) + fx.row_bytes);
		sel_record_span sp = span_of(&fx, &cp[i], sizes[i], false);
		CHECK(fsize(s, &cp[i].key) == sp.row_end);
		struct sel_disk_record_info ri = rec(s, &cp[i].key);
		CHECK(ri.ready && ri.file && ri.has_row && ri.is_root && ri.tail == sizes[i]);
		CHECK(ri.pins == 0 && !ri.writing && ri.bytes == sp.row_end);
		CHECK(sel_store_put(s, &cp[i], NULL) == SEL_PRESENT);
	}
	CHECK(test_count_tmp(test_store_dir(s)) == 0);
	for (int i = 0; i < 4; i++) {
		uint64_t c = cp[i].key.consumed;
		restore(&fx, s, &cv[i], 0, UINT64_MAX, c, 300, 5);
		/* A GPU-resident prefix inside the record (and a window). */
		if (sizes[i] > 2)
			restore(&fx, s, &cv[i], (sizes[i] / 2) * PT + 3, UINT64_MAX, c, 800, 6);
	}
	/* The row alone: resident at the last page boundary. */
	restore(&fx, s, &cv[0], 64, UINT64_MAX, cp[0].key.consumed, 0, 7);
	sel_stats st = stats(s);
	CHECK(st.outcomes[SEL_QUEUED] == 4 && st.outcomes[SEL_PRESENT] == 4);
	CHECK(st.fetches == 8 && st.fetch_failures == 0 && st.inflight_in == 0 &&
	      st.inflight_out == 0);
	CHECK(st.tier[SEL_TIER_DISK].records == 4 && st.tier[SEL_TIER_DISK].held == 4);
	CHECK(st.tier[SEL_TIER_DISK].bytes_in > 0 && st.tier[SEL_TIER_DISK].rate_bps > 0);
	CHECK(st.slots_in_use == 0 && st.per_rank_records == 4);
	uint64_t used, limit;
	sel_disk_store_usage(s, &used, &limit);
	CHECK(used == st.tier[SEL_TIER_DISK].bytes_used && limit == 1ull << 30);
	printf("  %s: round trips ok (%" PRIu64 " bytes on disk)\n", mode, used);
	close_store(s);
	for (int i = 0; i < 4; i++)
		sfx_conv_free(&cv[i]);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* Chains, row drops, restart. */
static void test_chains_restart(const char *mode)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("chain");
	sel_store *s = open_store(&fx, base, (struct opts){0});
	struct sfx_conv a, b;
	sfx_conv_init(&fx, &a, 31, 1100, 10);
	sfx_conv_init(&fx, &b, 32, 300, 100);
	/* Root A at 256 (4 pages), B at 640 (+6), C at 1000 (+5). */
	sel_published cpa = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	sel_published cpb = sfx_ckpt(&fx, &a, 640, 256, 2, 2);
	sel_published cpc = sfx_ckpt(&fx, &a, 1000, 640, 3, 3);
	sel_published cpx = sfx_ckpt(&fx, &b, 192, 0, 4, 4);
	store(s, &cpa);
	store(s, &cpb);
	CHECK(rec(s, &cpa.key).has_row && rec(s, &cpb.key).tail == 6 && !rec(s, &cpb.key).is_root);
	sel_record_span sb = span_of(&fx, &cpb, 6, true);
	CHECK(fsize(s, &cpb.key) == sb.row_end);
	store(s, &cpc);
	store(s, &cpx);
	/* C is B's only child and B is no root: its row goes (truncation). */
	CHECK(!rec(s, &cpb.key).has_row);
	SFX_UNTIL(s, check, fsize(s, &cpb.key) == sb.row_off);
	CHECK(fsize(s, &cpb.key) == sb.row_off);
	CHECK(rec(s, &cpa.key).has_row); /* A is a root */

	restore(&fx, s, &a, 0, UINT64_MAX, 1000, 20, 5);
	restore(&fx, s, &a, 256, UINT64_MAX, 1000, 40, 6); /* from A's endpoint */
	restore(&fx, s, &a, 300, UINT64_MAX, 1000, 60, 7); /* inside B */
	restore(&fx, s, &a, 0, 700, 256, 80, 8);           /* B is page-only: A */
	restore(&fx, s, &b, 0, UINT64_MAX, 192, 90, 9);
	uint64_t used0;
	sel_disk_store_usage(s, &used0, NULL);
	close_store(s);

	/* A new store on the same directory finds everything. */
	s = open_store(&fx, base, (struct opts){0});
	CHECK(test_store_scanned(s) == 4);
	uint64_t used1;
	sel_disk_store_usage(s, &used1, NULL);
	CHECK(used1 == used0);
	CHECK(!rec(s, &cpb.key).has_row && rec(s, &cpc.key).has_row && !rec(s, &cpc.key).is_root);
	restore(&fx, s, &a, 0, UINT64_MAX, 1000, 20, 5);
	restore(&fx, s, &a, 300, UINT64_MAX, 1000, 60, 7);
	restore(&fx, s, &b, 0, UINT64_MAX, 192, 90, 9);
	CHECK(sel_store_put(s, &cpc, NULL) == SEL_PRESENT);
	CHECK(sel_store_put(s, &cpb, NULL) == SEL_SKIPPED); /* page-only now */
	/* A new record under the recovered chain links to it. */
	sel_published cpd = sfx_ckpt(&fx, &a, 1088, 1000, 10, 11);
	store(s, &cpd);
	CHECK(rec(s, &cpd.key).tail == 2 && !rec(s, &cpd.key).is_root);
	restore(&fx, s, &a, 0, UINT64_MAX, 1088, 20, 5);
	close_store(s);
	printf("  %s: chains and restart ok\n", mode);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- corruption ------------------------------------------------------------------------------- */

static void test_corruption(const char *mode)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("corrupt");
	sel_store *s = open_store(&fx, base, (struct opts){0});
	for (int k = 0; k < 5; k++) {
		struct sfx_conv a;
		sfx_conv_init(&fx, &a, 40 + (uint64_t)k, 700, 10);
		/* P (root, 4 pages) <- Q (+4) <- R (+2). */
		sel_published p = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
		sel_published q = sfx_ckpt(&fx, &a, 512, 256, 2, 2);
		sel_published r = sfx_ckpt(&fx, &a, 640, 512, 3, 3);
		store(s, &p);
		store(s, &q);
		store(s, &r);
		sel_record_span sq = span_of(&fx, &q, 4, true);
		sel_record_span sp = span_of(&fx, &p, 4, false);
		uint64_t corrupt0 = stats(s).tier[SEL_TIER_DISK].corrupt;
		const sel_key *bad = &q.key;
		uint64_t want_after = 256; /* P still restorable */
		switch (k) {
		case 0:
			flip(s, &q.key, sq.page_off + 2 * sq.page_stride + 77);
			break; /* a page of Q */
		case 1:
			flip(s, &r.key, span_of(&fx, &r, 2, true).row_off + 9);
			bad = &r.key;
			want_after = 256;
			break;                                        /* R's row */
		case 2: flip(s, &q.key, sq.cksum_off + 8 + 3); break; /* checksum of page 1 */
		case 3: flip(s, &q.key, 100); break;                  /* header */
		case 4:
			flip(s, &p.key, sp.page_off + 5);
			bad = &p.key;
			want_after = 0;
			break;
		}
		sel_event ev = fetch_event(&fx, s, &a, 700, 640);
		CHECKF(ev.type == SEL_EV_FETCH_FAILED && ev.error == SEL_ECORRUPT,
		       "case %d: event %d %d", k, ev.type, ev.error);
		CHECK(stats(s).tier[SEL_TIER_DISK].corrupt == corrupt0 + 1);
		CHECK(!present(s, bad) && !present(s, &r.key));
		if (bad == &q.key || bad == &p.key)
			CHECK(!present(s, &q.key));
		SFX_UNTIL(s, check, fsize(s, bad) == UINT64_MAX);
		CHECK(fsize(s, bad) == UINT64_MAX);
		sel_hit hit;
		if (want_after) {
			restore(&fx, s, &a, 0, 700, want_after, 100, 4);
		} else {
			CHECK_RC(sel_store_lookup(s, &a.h, 0, 700, &hit), 0);
		}
		sfx_conv_free(&a);
	}
	/* A header flipped while the store is down: the scan removes it, a miss. */
	struct sfx_conv a;
	sfx_conv_init(&fx, &a, 49, 300, 10);
	sel_published p = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	store(s, &p);
	char path[4300];
	path_of(s, &p.key, path, sizeof path);
	close_store(s);
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	uint8_t c = 0x11;
	CHECK(pwrite(fd, &c, 1, 200) == 1);
	close(fd);
	s = open_store(&fx, base, (struct opts){0});
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 300, &hit), 0);
	CHECK(access(path, F_OK) != 0);
	close_store(s);
	sfx_conv_free(&a);
	printf("  %s: corruption ok\n", mode);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- namespaces and the directory lock ------------------------------------------------------ */

static void test_namespaces(void)
{
	struct sfx fx, fy;
	sfx_init(&fx, 1, 2, units2, 20000, 256, 8);
	sfx_init(&fy, 1, 2, (uint64_t[]){4096, 2000}, 20000, 256, 8); /* another fingerprint */
	char *base = test_mkdtemp("ns");
	uint8_t other[SEL_IDENTITY_BYTES];
	memset(other, 0x42, sizeof other);
	sel_store *a = open_store(&fx, base, (struct opts){0});
	sel_store *b = open_store(&fx, base, (struct opts){.model = other}); /* same base dir */
	sel_store *c = open_store(&fy, base, (struct opts){0});
	CHECK(strcmp(test_store_dir(a), test_store_dir(b)) &&
	      strcmp(test_store_dir(a), test_store_dir(c)));
	struct sfx_conv cv;
	sfx_conv_init(&fx, &cv, 51, 300, 10);
	sel_published cp = sfx_ckpt(&fx, &cv, 256, 0, 1, 1);
	store(a, &cp);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(b, &cv.h, 0, 300, &hit), 0);
	CHECK_RC(sel_store_lookup(c, &cv.h, 0, 300, &hit), 0);
	CHECK_RC(sel_store_lookup(a, &cv.h, 0, 300, &hit), 1);
	close_store(b);
	close_store(c);
	/* Reopened, the other namespaces still miss (nothing was written there). */
	b = open_store(&fx, base, (struct opts){.model = other});
	c = open_store(&fy, base, (struct opts){0});
	CHECK(test_store_scanned(b) == 0 && test_store_scanned(c) == 0);
	close_store(b);
	close_store(c);

	/* The lock: a second process on a's namespace fails at open, before
	 * scanning or deleting anything. */
	char junk[4300], tmp[4300];
	snprintf(junk, sizeof junk, "%s/%016x-%032x.ckpt", test_store_dir(a), 7, 7);
	snprintf(tmp, sizeof tmp, "%s/.tmp-stale", test_store_dir(a));
	for (int i = 0; i < 2; i++) {
		int fd = open(i ? tmp : junk, O_CREAT | O_WRONLY, 0644);
		CHECK(fd >= 0 && write(fd, "junk", 4) == 4);
		close(fd);
	}
	/* A CUDA context does not survive fork: on a real GPU the second
	 * process is this one only. */
	if (!sfx_device_mode() || sfx_device_fake()) {
		fflush(NULL);
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			sel_store_config cfg = sfx_config(&fx, false);
			cfg.disk_dir = base;
			cfg.disk_limit = 1 << 30;
			sel_store *s2 = NULL;
			int rc = sel_store_open(&cfg, &s2);
			_exit(rc == -EBUSY && !s2 ? 0 : 10 + (rc < 0 ? 0 : 1));
		}
		int status;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
	}
	CHECK(access(junk, F_OK) == 0 && access(tmp, F_OK) == 0);
	/* In this process too. */
	sel_store_config cfg = sfx_config(&fx, false);
	cfg.disk_dir = base;
	sel_store *s2;
	CHECK_RC(sel_store_open(&cfg, &s2), -EBUSY);
	CHECK(s2 == NULL && strstr(sel_errmsg(), "lock") != NULL);
	close_store(a);
	/* The owner gone, the next open scans: junk and temporary go. */
	a = open_store(&fx, base, (struct opts){0});
	CHECK(test_store_scanned(a) == 1 && access(junk, F_OK) != 0 && access(tmp, F_OK) != 0);
	close_store(a);
	sfx_conv_free(&cv);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
	sfx_free(&fy);
}

/* ---- the disk limit and staging ---------------------------------------------------------------- */

static void test_limit(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *base = test_mkdtemp("limit");
	struct sfx_conv cv[8];
	sel_published cp[8];
	for (int i = 0; i < 8; i++) {
		sfx_conv_init(&fx, &cv[i], 60 + (uint64_t)i, 600, (uint32_t)(i * 12));
		cp[i] = sfx_ckpt(&fx, &cv[i], 256, 0, (uint32_t)i, (uint64_t)i + 1);
	}
	uint64_t one = span_of(&fx, &cp[0], 4, false).row_end; /* a 4-page root */
	sel_store *s = open_store(&fx, base, (struct opts){.limit = 3 * one + one / 2});
	store(s, &cp[0]);
	store(s, &cp[1]);
	store(s, &cp[2]);
	store(s, &cp[3]); /* evicts 0, the least recently used */
	CHECK(!present(s, &cp[0].key) && present(s, &cp[1].key));
	sel_store_touch(s, &cp[1].key);
	store(s, &cp[4]); /* evicts 2: 1 was touched */
	CHECK(present(s, &cp[1].key) && !present(s, &cp[2].key));
	sel_stats st = stats(s);
	CHECK(st.tier[SEL_TIER_DISK].evicted == 2 &&
	      st.tier[SEL_TIER_DISK].dropped_end_of_chain == 2);
	SFX_UNTIL(s, check,
		  fsize(s, &cp[0].key) == UINT64_MAX && fsize(s, &cp[2].key) == UINT64_MAX);
	CHECK(fsize(s, &cp[0].key) == UINT64_MAX && fsize(s, &cp[2].key) == UINT64_MAX);
	uint64_t used;
	sel_disk_store_usage(s, &used, NULL);
	CHECK(used == 3 * one);

	/* Leaf first: a chain P <- Q and a root R; two evictions take Q,
	 * then P -- never P while Q is there. */
	struct sfx_conv ch;
	sfx_conv_init(&fx, &ch, 70, 700, 200);
	sel_published p = sfx_ckpt(&fx, &ch, 128, 0, 10, 20);
	sel_published q = sfx_ckpt(&fx, &ch, 256, 128, 11, 21);
	store(s, &p);
	store(s, &q);
	CHECK(present(s, &p.key) && present(s, &q.key) && !rec(s, &q.key).is_root);
	for (int i = 5; i < 8; i++) {
		store(s, &cp[i]);
		CHECK(!present(s, &q.key) || present(s, &p.key));
		CHECK_OK(check(s));
	}
	CHECK(!present(s, &p.key) && !present(s, &q.key));

	/* Oversize: alone, and with the ancestors a child needs. */
	struct sfx_conv big;
	sfx_conv_init(&fx, &big, 71, 40 * 64 + 10, 300);
	sel_published bp = sfx_ckpt(&fx, &big, 40 * 64, 0, 12, 30);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &bp, &why) == SEL_OVERSIZE);
	CHECK(stats(s).tier[SEL_TIER_DISK].dropped_oversize == 1);
	sfx_none_now(s);

	/* Retry (budget): every record in the way is pinned by a held copy. */
	close_store(s);
	test_rmtree(base);
	s = open_store(&fx, base, (struct opts){.limit = one + one / 2, .stub = true});
	sfx_hold(&fx, true);
	put_ok(s, &cp[0]);
	sfx_wait_blocked(&fx, 1);
	CHECK(sel_store_put(s, &cp[1], &why) == SEL_RETRY && why == SEL_RETRY_BUDGET);
	CHECK(stats(s).retry_reasons[SEL_RETRY_BUDGET] == 1);
	sfx_hold(&fx, false);
	sel_event ev = sfx_one_event(s, check);
	CHECK(ev.type == SEL_EV_STORED && ev.checkpoint == 1);
	store(s, &cp[1]); /* now 0 can go */
	CHECK(!present(s, &cp[0].key));
	close_store(s);
	test_rmtree(base);

	/* Staging: two windows of a 200-page record take the intake (134
	 * slots); another put is retried (slabs); a one-deep queue gives
	 * retry (queue). */
	struct sfx_conv w;
	sfx_conv_init(&fx, &w, 72, 200 * 64 + 5, 400);
	sel_published wp = sfx_ckpt(&fx, &w, 200 * 64, 0, 13, 40);
	s = open_store(&fx, base, (struct opts){.stub = true});
	CHECK(stats(s).intake_slots == 2 * 3 + 128);
	sfx_hold(&fx, true);
	put_ok(s, &wp);
	sfx_wait_blocked(&fx, 1);
	CHECK(stats(s).slots_in_use == 128);
	CHECK(sel_store_put(s, &cp[2], &why) == SEL_RETRY && why == SEL_RETRY_SLABS);
	sfx_hold(&fx, false);
	/* The refused put hears of the slots the first window gives back
	 * (SEL_EV_PROGRESS), before or with the record's STORED. */
	int progress = 0;
	bool stored = false;
	while (!stored || !progress) {
		sfx_wait_events_all(s, &ev, 1, check);
		if (ev.type == SEL_EV_PROGRESS) {
			progress++;
			continue;
		}
		CHECK(!stored && ev.type == SEL_EV_STORED && ev.checkpoint == 40);
		stored = true;
	}
	restore(&fx, s, &w, 0, UINT64_MAX, 200 * 64, 0, 1);
	close_store(s);
	test_rmtree(base);
	s = open_store(&fx, base, (struct opts){.stub = true, .queue_depth = 1});
	sfx_hold(&fx, true);
	put_ok(s, &cp[3]);
	sfx_wait_blocked(&fx, 1);
	put_ok(s, &cp[4]); /* the channel holds one more job */
	CHECK(sel_store_put(s, &cp[5], &why) == SEL_RETRY && why == SEL_RETRY_QUEUE);
	sfx_hold(&fx, false);
	sel_event two[2];
	sfx_wait_events(s, two, 2, check);
	CHECK(two[0].type == SEL_EV_STORED && two[1].type == SEL_EV_STORED);
	store(s, &cp[5]);
	close_store(s);

	for (int i = 0; i < 8; i++)
		sfx_conv_free(&cv[i]);
	sfx_conv_free(&ch);
	sfx_conv_free(&big);
	sfx_conv_free(&w);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- faults --------------------------------------------------------------------------------- */

/* A put of c tokens whose write fails with e at op (after skip calls of
 * it succeeded): the earlier record survives, no temporary stays, the
 * outcome and counters name the cause. */
static void write_fault_at(struct sfx *f, sel_store *s, struct sfx_conv *cv,
			   const sel_published *good, enum faultfs_op op, int e, uint64_t ckpt,
			   uint64_t c, int skip)
{
	sel_published cp = sfx_ckpt(f, cv, c, 0, 2, ckpt);
	sel_stats st0 = stats(s);
	fi_arm(op, e, skip);
	put_ok(s, &cp);
	sel_event ev = sfx_one_event(s, check);
	fi_off();
	if (op == F_FSYNC) {
		/* The directory fsync comes after the rename: the file is in place. */
		CHECKF(ev.type == SEL_EV_STORED, "fsync %s: event %d", strerror(e), ev.type);
		CHECK(present(s, &cp.key) && rec(s, &cp.key).file);
	} else {
		CHECKF(ev.type == SEL_EV_STORE_FAILED && ev.error == -e, "%s %s: event %d error %d",
		       faultfs_op_name[op], strerror(e), ev.type, ev.error);
		CHECK(ev.outcome == (e == ENOSPC ? SEL_DEFERRED : SEL_SKIPPED));
		CHECK(!present(s, &cp.key) && fsize(s, &cp.key) == UINT64_MAX);
		sel_stats st = stats(s);
		CHECK(st.store_failures == st0.store_failures + 1);
		if (e == ENOSPC)
			CHECK(st.outcomes[SEL_DEFERRED] == st0.outcomes[SEL_DEFERRED] + 1 &&
			      st.retry_reasons[SEL_RETRY_BUDGET] ==
				      st0.retry_reasons[SEL_RETRY_BUDGET] + 1);
		else
			CHECK(st.tier[SEL_TIER_DISK].dropped_io_error ==
			      st0.tier[SEL_TIER_DISK].dropped_io_error + 1);
	}
	SFX_UNTIL(s, check, test_count_tmp(test_store_dir(s)) == 0);
	CHECK(test_count_tmp(test_store_dir(s)) == 0);
	CHECK(present(s, &good->key) && rec(s, &good->key).file);
}

static void write_fault(struct sfx *f, sel_store *s, struct sfx_conv *cv, const sel_published *good,
			enum faultfs_op op, int e, uint64_t ckpt)
{
	write_fault_at(f, s, cv, good, op, e, ckpt, 3 * 64 + (ckpt % 50), 0);
}

/* Issue 18: write_fault_at on a conversation of its own, a whole record
 * of four windows (193 to 242 pages, no stored prefix), whose last
 * window's pages go to the disk thread apart from the END part that
 * commits. */
#define FRESH_PAGES(seed) (3 * 64 + 1 + (seed) % 50)
static void fresh_fault(struct sfx *f, sel_store *s, const sel_published *good, enum faultfs_op op,
			int e, uint64_t seed, int skip)
{
	struct sfx_conv m;
	sfx_conv_init(f, &m, seed, 256 * SFX_PT, 200);
	write_fault_at(f, s, &m, good, op, e, seed, FRESH_PAGES(seed) * SFX_PT, skip);
	sfx_conv_free(&m);
}

/* Issue 18: such a put fails at each of its pwrites in turn (the pread
 * path's payload writes: each window's pages, then the END part's row and
 * header): every one leaves no record, no temporary, and the good record. */
static void pwrite_everywhere(struct sfx *f, sel_store *s, const sel_published *good, int e,
			      uint64_t seed)
{
	struct sfx_conv m;
	sfx_conv_init(f, &m, seed, 256 * SFX_PT, 200);
	sel_published cp = sfx_ckpt(f, &m, FRESH_PAGES(seed) * SFX_PT, 0, 2, seed);
	fi_arm(F_NONE, 0, 0);
	store(s, &cp);
	int n = faultfs.calls[F_PWRITE];
	fi_off();
	sfx_conv_free(&m);
	CHECKF(n >= 5, "%d pwrites for a put of four windows", n);
	for (int skip = 1; skip < n; skip += 1 + skip / 8)
		fresh_fault(f, s, good, F_PWRITE, e, seed + 50 * (uint64_t)skip, skip);
}

/* A deferral is no progress: a fresh store's put refused with ENOSPC at
 * its fallocate gives its intake slots back with the refusal, and no
 * SEL_EV_PROGRESS comes, before the event or after it (the composite
 * forwarded one when the discard ran ahead of the poll: a flaky
 * test_store_composite). */
static void test_deferral_no_progress(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("deferral");
	sel_store *s = open_store(&fx, base, (struct opts){0});
	struct sfx_conv cv;
	sfx_conv_init(&fx, &cv, 82, 20 * 64 + 10, 40);
	sel_published cp = sfx_ckpt(&fx, &cv, 20 * 64, 0, 2, 7);
	fi_arm(F_FALLOCATE, ENOSPC, 0);
	put_ok(s, &cp);
	sel_event ev;
	int progress = 0;
	for (;;) {
		sfx_wait_events_all(s, &ev, 1, check);
		if (ev.type != SEL_EV_PROGRESS)
			break;
		progress++;
	}
	fi_off();
	CHECKF(ev.type == SEL_EV_STORE_FAILED && ev.outcome == SEL_DEFERRED, "event %d outcome %s",
	       ev.type, sel_outcome_name(ev.outcome));
	progress += sfx_settle(s, check);
	CHECKF(progress == 0, "%d PROGRESS events after a deferral", progress);
	close_store(s);
	sfx_conv_free(&cv);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

static void test_faults(const char *mode, bool pread_path)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 512, 16);
	char *base = test_mkdtemp("faults");
	sel_store *s = open_store(&fx, base, (struct opts){.fdatasync = true});
	struct sfx_conv g, cv;
	sfx_conv_init(&fx, &g, 80, 300, 10);
	sfx_conv_init(&fx, &cv, 81, 300, 30);
	sel_published good = sfx_ckpt(&fx, &g, 256, 0, 1, 1);
	store(s, &good);
	uint64_t ck = 100;
	const int errs[2] = {ENOSPC, EIO};
	for (int k = 0; k < 2; k++) {
		write_fault(&fx, s, &cv, &good, F_OPEN, errs[k], ck++);
		write_fault(&fx, s, &cv, &good, F_FALLOCATE, errs[k], ck++);
		if (pread_path) {
			write_fault(&fx, s, &cv, &good, F_PWRITE, errs[k], ck++);
			pwrite_everywhere(&fx, s, &good, errs[k], 1000 + 1000 * (uint64_t)k);
		}
		fresh_fault(&fx, s, &good, F_FDATASYNC, errs[k], 3000 + (uint64_t)k, 0);
		fresh_fault(&fx, s, &good, F_RENAME, errs[k], 3010 + (uint64_t)k, 0);
		fresh_fault(&fx, s, &good, F_FSYNC, errs[k], 3020 + (uint64_t)k, 0);
		write_fault(&fx, s, &cv, &good, F_FDATASYNC, errs[k], ck++);
		write_fault(&fx, s, &cv, &good, F_RENAME, errs[k], ck++);
		write_fault(&fx, s, &cv, &good, F_FSYNC, errs[k], ck++);
	}
	/* Reads: the open and the header pread fail the fetch; the committed
	 * record stays and reads back afterwards. */
	for (int k = 0; k < 2; k++) {
		for (int op = 0; op < 2; op++) {
			fi_arm(op ? F_PREAD : F_OPEN, errs[k], 0);
			sel_event ev = fetch_event(&fx, s, &g, 300, 256);
			fi_off();
			CHECKF(ev.type == SEL_EV_FETCH_FAILED && ev.error == -errs[k],
			       "read %s: %d %d", op ? "pread" : "open", ev.type, ev.error);
			CHECK(present(s, &good.key) && rec(s, &good.key).file);
			restore(&fx, s, &g, 0, 300, 256, 50, 3);
		}
	}
	if (pread_path) { /* a payload read */
		fi_arm(F_PREAD, EIO, 2);
		sel_event ev = fetch_event(&fx, s, &g, 300, 256);
		fi_off();
		CHECK(ev.type == SEL_EV_FETCH_FAILED && ev.error == -EIO);
		restore(&fx, s, &g, 0, 300, 256, 50, 3);
	}
	CHECK(stats(s).tier[SEL_TIER_DISK].corrupt == 0);
	close_store(s);

	/* Unlink: an eviction whose unlink fails keeps its bytes charged
	 * (stuck); the file stays and a restart finds it again. */
	uint64_t one = span_of(&fx, &good, 4, false).row_end;
	test_rmtree(base);
	s = open_store(&fx, base, (struct opts){.limit = one + one / 2});
	good = sfx_ckpt(&fx, &g, 256, 0, 1, 1); /* the planes again: restores poisoned them */
	store(s, &good);
	sel_published other = sfx_ckpt(&fx, &cv, 256, 0, 2, 50);
	fi_arm(F_UNLINK, EIO, 0);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &other, &why) == SEL_QUEUED); /* evicts good */
	sel_event ev = sfx_one_event(s, check);
	/* Until the failed unlink has been polled: its bytes come back
	 * charged, as stuck. */
	SFX_UNTIL(s, check, disk_used(s) == 2 * one);
	CHECK(faultfs.calls[F_UNLINK] >= 1);
	fi_off();
	CHECK(ev.type == SEL_EV_STORED && !present(s, &good.key));
	uint64_t used;
	sel_disk_store_usage(s, &used, NULL);
	CHECK(used == 2 * one); /* the stuck file is still charged */
	CHECK(fsize(s, &good.key) == one);
	close_store(s);
	s = open_store(&fx, base, (struct opts){.limit = 4 * one});
	CHECK(test_store_scanned(s) == 2);
	restore(&fx, s, &g, 0, 300, 256, 50, 3);
	close_store(s);
	printf("  %s: faults ok\n", mode);
	sfx_conv_free(&g);
	sfx_conv_free(&cv);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- TP2 -------------------------------------------------------------------------------------- */

/* TP2 on a disk-only store (design 2.5): the representation is decided
 * from each record's first window, which carries the row too.  rep (70
 * pages: two windows) matches on both ranks, so pages and row are stored
 * once; one (3 pages: one window) likewise; prow (one window, row split)
 * pages once, row per rank; prow2 (two windows, row split) the same;
 * prep (two windows, pages split, row equal) pages per rank, row once;
 * split (pages and row differ) per rank; mixed matches in its first window
 * and differs from page 64 on, so its write is abandoned (no file, no
 * temporary).  Files have the size their flags give; everything restores
 * byte-exact, before and after a restart, and no intake slot stays held. */
static uint64_t span_bytes(struct sfx *f, const sel_published *cp, uint32_t flags)
{
	sel_record_ns ns;
	uint8_t id[SEL_IDENTITY_BYTES];
	sel_offload_identity(f->model, SEL_MODE_ORDINARY, id);
	CHECK_OK(sel_record_ns_init(&ns, f->g, id));
	sel_record_desc d = {
		.key = cp->key, .bucket = cp->bucket, .tail = cp->tail, .flags = flags};
	sel_record_span sp;
	CHECK_OK(sel_record_span_of(&ns.layout.sz, &d, &sp));
	sel_record_ns_free(&ns);
	return sp.row_end;
}

struct tp2_convs {
	struct sfx_conv rep, one, prow, prow2, prep, split, mixed;
};

static void tp2_restore_all(struct sfx *fx, sel_store *s, struct tp2_convs *v)
{
	const struct sfx_restore_opts rsplit = {.row_split = true}, requal = {.row_split = false};
	restore(fx, s, &v->rep, 0, UINT64_MAX, 70 * 64 + 9, 300, 3);
	restore(fx, s, &v->rep, 65 * 64 + 1, UINT64_MAX, 70 * 64 + 9, 300, 4);
	restore(fx, s, &v->one, 0, UINT64_MAX, 3 * 64 + 5, 400, 5);
	sfx_restore_with(fx, s, &v->prow, 0, UINT64_MAX, 2 * 64, 410, 6, SEL_TIER_DISK, true, check,
			 rsplit);
	sfx_restore_with(fx, s, &v->prow2, 0, UINT64_MAX, 66 * 64, 300, 2, SEL_TIER_DISK, true,
			 check, rsplit);
	sfx_restore_with(fx, s, &v->prep, 0, UINT64_MAX, 66 * 64 + 1, 300, 1, SEL_TIER_DISK, true,
			 check, requal);
	restore(fx, s, &v->split, 64, UINT64_MAX, 256, 420, 7);
}

static void test_tp2(void)
{
	const uint32_t P = SEL_RECORD_PAGES_REPLICATED, R = SEL_RECORD_ROW_REPLICATED;
	struct sfx fx;
	sfx_init(&fx, 2, 2, units2, 10000, 512, 8);
	char *base = test_mkdtemp("tp2");
	sel_store *s = open_store(&fx, base, (struct opts){0});
	struct tp2_convs v;
	sfx_conv_init(&fx, &v.rep, 90, 70 * 64 + 9, 0);
	sfx_conv_init(&fx, &v.one, 92, 3 * 64 + 5, 100);
	sfx_conv_init(&fx, &v.prow, 93, 2 * 64, 110);
	sfx_conv_init(&fx, &v.prow2, 95, 66 * 64, 120);
	sfx_conv_init(&fx, &v.prep, 96, 66 * 64 + 1, 190);
	sfx_conv_init(&fx, &v.split, 91, 300, 260);
	sfx_conv_init(&fx, &v.mixed, 94, 70 * 64, 300);
	v.split.split = true;
	v.prep.split = true;
	v.mixed.split = true;
	v.mixed.split_from = 64;
	sel_published a = sfx_ckpt(&fx, &v.rep, 70 * 64 + 9, 0, 1, 1);
	sel_published b = sfx_ckpt(&fx, &v.split, 256, 0, 2, 2);
	sel_published c = sfx_ckpt(&fx, &v.one, 3 * 64 + 5, 0, 3, 3);
	sel_published d = sfx_ckpt_row(&fx, &v.prow, 2 * 64, 0, 4, 4, true);
	sel_published e = sfx_ckpt_row(&fx, &v.prow2, 66 * 64, 0, 5, 6, true);
	sel_published g = sfx_ckpt_row(&fx, &v.prep, 66 * 64 + 1, 0, 6, 7, false);
	const sel_published *all[] = {&a, &b, &c, &d, &e, &g};
	const uint32_t want[] = {P | R, 0, P | R, P, P, R};
	uint64_t used = 0;
	for (int i = 0; i < 6; i++) {
		store(s, all[i]);
		uint32_t fl = rec(s, &all[i]->key).flags;
		CHECKF(fl == want[i], "record %d: flags 0x%x, want 0x%x", i, fl, want[i]);
		CHECK(fsize(s, &all[i]->key) == span_bytes(&fx, all[i], want[i]));
		CHECK(rec(s, &all[i]->key).bytes == fsize(s, &all[i]->key));
		used += fsize(s, &all[i]->key);
	}
	CHECK(span_bytes(&fx, &a, P | R) < span_bytes(&fx, &a, P));
	CHECK(span_bytes(&fx, &a, P) < span_bytes(&fx, &a, 0));
	sel_stats st = stats(s);
	CHECK(st.packed_records == 5 && st.per_rank_records == 1 && st.slots_in_use == 0);
	CHECK(st.tier[SEL_TIER_DISK].bytes_used == used);

	/* Pages 64.. of mixed differ across ranks: abandoned, nothing kept.
	 * The failure is reported only once its temporary is gone, however
	 * slowly the disk thread removes it. */
	faultfs_reset();
	faultfs.slow_unlink_ms = 200;
	eos_fileops_set(faultfs_ops());
	sel_published m = sfx_ckpt(&fx, &v.mixed, 70 * 64, 0, 7, 5);
	put_ok(s, &m);
	sel_event ev = sfx_one_event(s, check);
	CHECKF(ev.type == SEL_EV_STORE_FAILED && ev.outcome == SEL_SKIPPED && ev.error == -EILSEQ,
	       "event %d outcome %d error %d", ev.type, ev.outcome, ev.error);
	CHECK(!present(s, &m.key) && fsize(s, &m.key) == UINT64_MAX);
	CHECK(test_count_tmp(test_store_dir(s)) == 0);
	CHECK(faultfs.calls[F_UNLINK] > 0);
	eos_fileops_set(NULL);
	faultfs_reset();
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &v.mixed.h, 0, UINT64_MAX, &hit), 0);
	st = stats(s);
	CHECK(st.packed_records == 5 && st.per_rank_records == 1 && st.slots_in_use == 0);
	CHECK(st.tier[SEL_TIER_DISK].dropped_io_error == 0);
	CHECK(st.tier[SEL_TIER_DISK].bytes_used == used);

	sfx_poison(&fx);
	tp2_restore_all(&fx, s, &v);
	close_store(s);
	s = open_store(&fx, base, (struct opts){0});
	for (int i = 0; i < 6; i++)
		CHECK(rec(s, &all[i]->key).flags == want[i]);
	sfx_poison(&fx);
	tp2_restore_all(&fx, s, &v);
	CHECK(stats(s).slots_in_use == 0);
	close_store(s);
	sfx_conv_free(&v.rep);
	sfx_conv_free(&v.one);
	sfx_conv_free(&v.prow);
	sfx_conv_free(&v.prow2);
	sfx_conv_free(&v.prep);
	sfx_conv_free(&v.split);
	sfx_conv_free(&v.mixed);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* ---- the store_open table ------------------------------------------------------------------------ */

static void test_open_table(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 64, 4);
	sel_store_config cfg = sfx_config(&fx, false);
	sel_store *s = (sel_store *)1;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(s == NULL);          /* neither tier: disabled */
	cfg.pool = "manager:7000"; /* only unix:PATH (test_store_pooled.c has the pool) */
	CHECK_RC(sel_store_open(&cfg, &s), -EINVAL);
	CHECK(s == NULL && strstr(sel_errmsg(), "unix:PATH"));
	cfg.pool = NULL;
	cfg.memory_bytes = 1 << 20;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(s && !strcmp(s->ops->name, "memory") && test_store_dir(s) == NULL);
	sel_store_close(s, 0);
	sel_store_destroy(s);
	/* Limit 0: a tenth of the free space. */
	char *base = test_mkdtemp("open");
	cfg.memory_bytes = 0;
	cfg.disk_dir = base;
	CHECK_OK(sel_store_open(&cfg, &s));
	uint64_t avail = 0;
	CHECK_OK(eos_fs_space(base, &avail, NULL));
	CHECK(test_store_limit(s) > 0 && test_store_limit(s) <= avail / 10 + (64 << 20) &&
	      test_store_limit(s) + (64 << 20) >= avail / 10);
	sel_store_close(s, 0);
	sel_store_destroy(s);
	/* An unusable base directory. */
	cfg.disk_dir = "/proc/no/such/place";
	CHECK(sel_store_open(&cfg, &s) < 0 && s == NULL);
	test_rmtree(base);
	free(base);
	sfx_free(&fx);
}

/* tests/test_store_disk_cuda.c runs these with device planes through the
 * CUDA backend: it includes this file with STORE_TEST_MAIN defined. */
#ifndef STORE_TEST_MAIN
#define STORE_TEST_MAIN main
#endif
int STORE_TEST_MAIN(void)
{
	test_rng_init(&rng, test_seed());
	unsetenv("SELENE_DISK_IO");
	unsetenv("SELENE_DISK_DIRECT");

	char *probe = test_mkdtemp("probe");
	bool direct = eos_direct_io_probe(probe) == 1;
	test_rmtree(probe);
	free(probe);

	test_open_table();
	test_namespaces();
	test_limit();
	test_tp2();
	test_deferral_no_progress();
	static const struct {
		const char *name, *io, *direct;
	} modes[] = {
		{"io_uring + O_DIRECT", "uring", "1"},
		{"io_uring, buffered", "uring", "0"},
		{"pread + O_DIRECT", "pread", "1"},
		{"pread, buffered", "pread", "0"},
	};
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
		if (!direct && modes[i].direct[0] == '1') {
			printf("  %s: skipped (no direct I/O here)\n", modes[i].name);
			continue;
		}
		setenv("SELENE_DISK_IO", modes[i].io, 1);
		setenv("SELENE_DISK_DIRECT", modes[i].direct, 1);
		test_roundtrip(modes[i].name);
		test_chains_restart(modes[i].name);
		test_corruption(modes[i].name);
		test_faults(modes[i].name, !strcmp(modes[i].io, "pread"));
	}
	unsetenv("SELENE_DISK_IO");
	unsetenv("SELENE_DISK_DIRECT");
	printf("test_store_disk: ok\n");
	return 0;
}
