/*
 * test_store_expiry.c - record expiry in the stores (design 2.5, "Host
 * record expiry"; --prefix-cache-max-age), driven by a fake clock
 * (sel_store_config.clock_ns).
 *
 * Covers, for the memory store standalone: records expire oldest first
 * and the sweep stops at the first fresh one; a sweep runs at most once a
 * minute of the store's clock and drops at most 64 leaves; a reuse (touch)
 * and a restore refresh the record and its required ancestors; an interior
 * record stays while its child lives and goes in the same sweep as its
 * last child; a record a copy is reading is passed over until the copy
 * ends.  For the disk store: a restart recovers ages from file mtimes (set
 * with utimensat), an old parent stays while its fresh child lives, the
 * expired files are unlinked, and a restore from disk refreshes.  For the
 * composite: an expired DRAM-only record leaves both tiers (counted dram
 * and nvme) while one restored from memory is kept (the restore refreshes
 * the disk catalogue).  The stores' checkers run after every poll.
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "record.h"
#include "store_composite.h"
#include "store_disk.h"
#include "store_memory.h"
#include "storefx.h"

#define S 1000000000ull
#define T0 (1700000000ull * S)

static const uint64_t units2[] = {4096, 1000};
static uint64_t now_s; /* the fake clock, seconds after T0 */
static uint64_t fake_clock(void) { return T0 + now_s * S; }

static int check_mem(sel_store *s) { return sel_memory_store_check(s); }
static int check_disk(sel_store *s) { return sel_disk_store_check(s); }
static int check_comp(sel_store *s) { return sel_composite_store_check(s); }
static sfx_check_fn check;

static sel_stats stats(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	return st;
}

/* Poll once (a sweep runs here when one is due). */
static void poll_at(sel_store *s, uint64_t t)
{
	now_s = t;
	sfx_none_now(s);
	CHECK_OK(check(s));
}

static void store(sel_store *s, const sel_published *cp)
{
	sel_retry_reason why;
	sel_outcome o = sel_store_put(s, cp, &why);
	CHECKF(o == SEL_QUEUED, "put: %s: %s", sel_outcome_name(o), sel_errmsg());
	sel_event ev;
	sfx_wait_events(s, &ev, 1, check);
	CHECKF(ev.type == SEL_EV_STORED, "event %d error %d", ev.type, ev.error);
}

static bool hit(sel_store *s, struct sfx_conv *cv, uint64_t c)
{
	sel_hit h;
	sel_key k = sfx_key(cv, c);
	return sel_store_lookup(s, &cv->h, c - 1, c, &h) == 1 && sel_key_eq(&h.key, &k);
}

static sel_store *open_store(struct sfx *f, const char *dir, uint64_t warm, bool stub)
{
	sel_store_config cfg = sfx_config(f, stub);
	cfg.memory_bytes = warm * f->slot_bytes;
	cfg.disk_dir = dir;
	cfg.disk_limit = dir ? 1ull << 30 : 0;
	cfg.max_age_ns = 100 * S;
	cfg.clock_ns = fake_clock;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	check = !dir ? check_mem : !warm ? check_disk : check_comp;
	CHECK_OK(check(s));
	return s;
}

static void close_store(sel_store *s)
{
	CHECK_OK(check(s));
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
}

/* ---- the memory store ---------------------------------------------------------------- */

static void test_memory(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	now_s = 0;
	sel_store *s = open_store(&fx, NULL, 900, true);
	CHECK(!strcmp(s->ops->name, "memory"));
	struct sfx_conv a, b, c;
	sfx_conv_init(&fx, &a, 1, 300, 0);
	sfx_conv_init(&fx, &b, 2, 300, 10);
	sfx_conv_init(&fx, &c, 3, 300, 20);
	sel_published pa = sfx_ckpt(&fx, &a, 200, 0, 1, 1);
	store(s, &pa); /* at 0: the first poll sweeps (nothing to do) */
	now_s = 10;
	sel_published pb = sfx_ckpt(&fx, &b, 200, 0, 2, 2);
	store(s, &pb);
	now_s = 20;
	sel_published pc1 = sfx_ckpt(&fx, &c, 128, 0, 3, 3);
	store(s, &pc1);
	now_s = 30;
	sel_published pc2 = sfx_ckpt(&fx, &c, 256, 128, 4, 4);
	store(s, &pc2);

	/* 105 s: a (used at 0) is older than 100 s; b (10) is the first fresh
	 * record: the sweep stops there. */
	poll_at(s, 105);
	CHECK(!hit(s, &a, 200) && hit(s, &b, 200) && hit(s, &c, 256));
	sel_stats st = stats(s);
	CHECK(st.tier[SEL_TIER_MEMORY].expired == 1 && st.tier[SEL_TIER_MEMORY].evicted == 0 &&
	      st.tier[SEL_TIER_MEMORY].dropped_end_of_chain == 0);
	/* 120 s: b is expired too, but a minute has not passed since the last
	 * sweep. */
	poll_at(s, 120);
	CHECK(hit(s, &b, 200));
	/* A reuse at 120 refreshes c's endpoint and its ancestor. */
	sel_store_touch(s, &pc2.key);
	/* 166 s: b goes; c's chain is fresh. */
	poll_at(s, 166);
	CHECK(!hit(s, &b, 200) && hit(s, &c, 256) && stats(s).tier[SEL_TIER_MEMORY].expired == 2);

	/* A restore at 250 refreshes c; its copy is held while the clock
	 * runs on: the sweep at 370 passes over the records it reads. */
	now_s = 250;
	sel_hit h;
	CHECK_RC(sel_store_lookup(s, &c.h, 0, 256, &h), 1);
	uint32_t dst[4] = {100, 101, 102, 103};
	sel_inbound in = {.ticket = 9, .pages = dst, .n_pages = h.pages, .state_slot = 9};
	sfx_hold(&fx, true);
	CHECK_OK(sel_store_fetch(s, &h, &in));
	sfx_wait_blocked(&fx, 1);
	poll_at(s, 370);
	struct sel_memory_record_info mi;
	CHECK_OK(sel_memory_store_record(s, &pc2.key, &mi));
	CHECK(mi.pins > 0 && stats(s).tier[SEL_TIER_MEMORY].expired == 2);
	sfx_hold(&fx, false);
	sel_event ev;
	sfx_wait_events(s, &ev, 1, check);
	CHECK(ev.type == SEL_EV_FETCHED && ev.ticket == 9);
	/* 440 s: the endpoint expires, and its ancestor, left a leaf, with it
	 * (c1 is a root: it kept its row, and is judged in its turn). */
	poll_at(s, 440);
	CHECK(sel_memory_store_record(s, &pc2.key, &mi) == -ENOENT);
	CHECK(sel_memory_store_record(s, &pc1.key, &mi) == -ENOENT);
	CHECK(stats(s).tier[SEL_TIER_MEMORY].expired == 4 &&
	      stats(s).tier[SEL_TIER_MEMORY].records == 0);

	/* At most 64 leaves per sweep: 70 roots used at 500. */
	now_s = 500;
	struct sfx_conv m;
	sfx_conv_init(&fx, &m, 9, 200, 40);
	for (uint64_t k = 0; k < 70; k++) {
		sel_published p = sfx_ckpt(&fx, &m, 64 + k, 0, 5, 100 + k);
		store(s, &p);
	}
	CHECK(stats(s).tier[SEL_TIER_MEMORY].records == 70);
	poll_at(s, 700);
	CHECK(stats(s).tier[SEL_TIER_MEMORY].records == 6);
	poll_at(s, 759); /* not a minute yet */
	CHECK(stats(s).tier[SEL_TIER_MEMORY].records == 6);
	poll_at(s, 760);
	CHECK(stats(s).tier[SEL_TIER_MEMORY].records == 0);
	CHECK(stats(s).tier[SEL_TIER_MEMORY].expired == 74);

	close_store(s);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	sfx_conv_free(&c);
	sfx_conv_free(&m);
	sfx_free(&fx);
	printf("  memory: oldest first, once a minute, 64 a sweep, refreshes, pins\n");
}

/* ---- the disk store: ages from mtimes after a restart ------------------------------------ */

static void set_mtime(sel_store *s, const sel_key *k, int64_t rel_s)
{
	char name[SEL_RECORD_NAME_MAX], path[4400];
	sel_record_name(k, name);
	snprintf(path, sizeof path, "%s/%s", test_store_dir(s), name);
	uint64_t t = (uint64_t)((int64_t)(T0 / S) + rel_s);
	struct timespec ts[2] = {{.tv_sec = (time_t)t}, {.tv_sec = (time_t)t}};
	CHECKF(utimensat(AT_FDCWD, path, ts, 0) == 0, "utimensat %s: %s", path, strerror(errno));
}

static bool file_exists(sel_store *s, const sel_key *k)
{
	char name[SEL_RECORD_NAME_MAX], path[4400];
	struct stat st;
	sel_record_name(k, name);
	snprintf(path, sizeof path, "%s/%s", test_store_dir(s), name);
	return stat(path, &st) == 0;
}

static bool on_disk(sel_store *s, const sel_key *k)
{
	struct sel_disk_record_info ri;
	return sel_disk_store_record(s, k, &ri) == 0;
}

/* Poll until no file of keys is left that the store has forgotten. */
static void wait_unlinked(sel_store *s, const sel_key *k)
{
	SFX_UNTIL(s, check, !file_exists(s, k));
}

static void test_disk(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *dir = test_mkdtemp("expiry-disk");
	now_s = 0;
	sel_store *s = open_store(&fx, dir, 0, false);
	CHECK(!strcmp(s->ops->name, "disk"));
	struct sfx_conv a, b, c;
	sfx_conv_init(&fx, &a, 11, 600, 0);
	sfx_conv_init(&fx, &b, 12, 300, 20);
	sfx_conv_init(&fx, &c, 13, 300, 30);
	sel_published p = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	sel_published q = sfx_ckpt(&fx, &a, 512, 256, 2, 2);
	sel_published x = sfx_ckpt(&fx, &b, 256, 0, 3, 3);
	sel_published y = sfx_ckpt(&fx, &c, 256, 0, 4, 4);
	store(s, &p);
	store(s, &q);
	store(s, &x);
	store(s, &y);
	CHECK_OK(sel_store_close(s, 0));
	/* Ages as the files will say after the restart: p old, its child q
	 * fresh, x old, y freshest. */
	set_mtime(s, &p.key, -500);
	set_mtime(s, &q.key, -50);
	set_mtime(s, &x.key, -200);
	set_mtime(s, &y.key, -20);
	sel_store_destroy(s);

	now_s = 0;
	s = open_store(&fx, dir, 0, false);
	CHECK(test_store_scanned(s) == 4);
	poll_at(s, 0); /* the first sweep: x expired; q is fresh, p interior */
	CHECK(!on_disk(s, &x.key) && on_disk(s, &p.key) && on_disk(s, &q.key) &&
	      on_disk(s, &y.key));
	wait_unlinked(s, &x.key);
	CHECK(stats(s).tier[SEL_TIER_DISK].expired == 1);
	/* 60 s: q (50 s old at the restart) has expired; p, left a leaf with
	 * its own file's old time, goes in the same sweep; y is fresh. */
	poll_at(s, 60);
	CHECK(!on_disk(s, &q.key) && !on_disk(s, &p.key) && on_disk(s, &y.key));
	wait_unlinked(s, &q.key);
	wait_unlinked(s, &p.key);
	CHECK(stats(s).tier[SEL_TIER_DISK].expired == 3);
	/* A restore from disk at 70 refreshes y: kept at 150 (it would have
	 * expired at 80 by its file's time). */
	now_s = 70;
	sfx_restore(&fx, s, &c, 0, UINT64_MAX, 256, 100, 5, SEL_TIER_DISK, true, check);
	poll_at(s, 150);
	CHECK(on_disk(s, &y.key) && file_exists(s, &y.key));
	poll_at(s, 210);
	CHECK(!on_disk(s, &y.key));
	wait_unlinked(s, &y.key);
	CHECK(stats(s).tier[SEL_TIER_DISK].expired == 4 &&
	      stats(s).tier[SEL_TIER_DISK].evicted == 0);
	close_store(s);

	sfx_conv_free(&a);
	sfx_conv_free(&b);
	sfx_conv_free(&c);
	test_rmtree(dir);
	free(dir);
	sfx_free(&fx);
	printf("  disk: ages from mtimes, an old parent kept while its child lives, unlinked\n");
}

/* ---- the composite: both tiers ----------------------------------------------------------- */

static bool in_memory(sel_store *s, const sel_key *k)
{
	struct sel_memory_view v;
	return sel_memory_store_view(sel_composite_store_memory(s), k, &v) == 0;
}

static void test_composite(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *dir = test_mkdtemp("expiry-comp");
	now_s = 0;
	sel_store *s = open_store(&fx, dir, 600, false);
	CHECK(!strcmp(s->ops->name, "composite"));
	struct sfx_conv a, b;
	sfx_conv_init(&fx, &a, 21, 300, 0);
	sfx_conv_init(&fx, &b, 22, 300, 10);
	sel_published pa = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	sel_published pb = sfx_ckpt(&fx, &b, 256, 0, 2, 2);
	store(s, &pa);
	store(s, &pb);
	sel_store *disk = sel_composite_store_disk(s);
	CHECK(stats(s).parked_records == 2);
	/* A restore from memory at 50 refreshes a in the disk catalogue. */
	now_s = 50;
	sfx_restore(&fx, s, &a, 0, UINT64_MAX, 256, 100, 5, SEL_TIER_MEMORY, true, check);
	/* 120 s: b (DRAM-only, used at 0) leaves both tiers; a stays. */
	poll_at(s, 120);
	CHECK(!on_disk(disk, &pb.key) && !in_memory(s, &pb.key));
	CHECK(on_disk(disk, &pa.key) && in_memory(s, &pa.key));
	sel_stats st = stats(s);
	CHECK(st.tier[SEL_TIER_DISK].expired == 1 && st.tier[SEL_TIER_MEMORY].expired == 1);
	CHECK(st.parked_records == 1 && st.tier[SEL_TIER_MEMORY].dropped_end_of_chain == 0);
	poll_at(s, 180);
	CHECK(!on_disk(disk, &pa.key) && !in_memory(s, &pa.key));
	CHECK(stats(s).tier[SEL_TIER_MEMORY].expired == 2 && stats(s).parked_records == 0);
	close_store(s);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	test_rmtree(dir);
	free(dir);
	sfx_free(&fx);
	printf("  composite: an expired DRAM-only record leaves both tiers; a restore refreshes\n");
}

int main(void)
{
	test_memory();
	test_disk();
	test_composite();
	printf("ok\n");
	return 0;
}
