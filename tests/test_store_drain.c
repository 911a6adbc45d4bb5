/*
 * test_store_drain.c - the composite's shutdown drain (design 2.5,
 * --prefix-cache-drain-on-shutdown; 2.8 shutdown).
 *
 * Covers: a composite holding only DRAM-resident (parked) records, closed
 * with the drain on, restarts with disk hits for every one of them; closed
 * without it, restarts cold for them (the design's default); a drain
 * limited by a duration, with slow writes, saves the most recently used
 * endpoints first, each after its parked ancestors, and reports progress
 * (a line about once a second, then a final one saying what was saved and
 * what not, and why); write errors and a full filesystem do not fail the
 * close and leave no temporary; a parked record with no disk budget is
 * not saved by evicting committed files (they are preserved).
 */
#include <fcntl.h>
#include <unistd.h>

#include "record.h"
#include "store_composite.h"
#include "store_disk.h"
#include "store_memory.h"
#include "storefx.h"
#include "recutil.h"

static const uint64_t units2[] = {4096, 1000};

static int check(sel_store *s) { return sel_composite_store_check(s); }

/* ---- fault injection: slow or failing writes ---------------------------------------- */

static struct {
	uint64_t gate_until; /* pwrite waits until this monotonic time */
	int pwrite_err;      /* errno for every pwrite while set */
	int fallocate_err;   /* errno for every fallocate while set */
} fi;

static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t off)
{
	uint64_t until = __atomic_load_n(&fi.gate_until, __ATOMIC_SEQ_CST);
	while (eos_now_ns() < until)
		eos_sleep_ns(1000000);
	int e = __atomic_load_n(&fi.pwrite_err, __ATOMIC_SEQ_CST);
	if (e) {
		errno = e;
		return -1;
	}
	return eos_fileops_libc.pwrite(fd, b, n, off);
}

static int f_fallocate(int fd, int mode, off_t off, off_t len)
{
	int e = __atomic_load_n(&fi.fallocate_err, __ATOMIC_SEQ_CST);
	if (e) {
		errno = e;
		return -1;
	}
	return eos_fileops_libc.fallocate(fd, mode, off, len);
}

static struct eos_fileops fault_ops;

/* ---- progress reports ------------------------------------------------------------------- */

struct reports {
	int n, finals;
	sel_drain_progress last, final;
	char why[32];
};

static void on_progress(void *ctx, const sel_drain_progress *p)
{
	struct reports *r = ctx;
	r->n++;
	r->last = *p;
	if (p->final) {
		r->finals++;
		r->final = *p;
		snprintf(r->why, sizeof r->why, "%s", p->why ? p->why : "");
	}
}

/* ---- helpers ---------------------------------------------------------------------------- */

struct opts {
	bool drain;
	uint64_t drain_ns;
	uint64_t limit;
	struct reports *rep;
};

static sel_store *open_store(struct sfx *f, const char *dir, struct opts o)
{
	sel_store_config cfg = sfx_config(f, false);
	cfg.memory_bytes = 900 * f->slot_bytes;
	cfg.disk_dir = dir;
	cfg.disk_limit = o.limit ? o.limit : 1ull << 30;
	cfg.drain_on_shutdown = o.drain;
	cfg.drain_ns = o.drain_ns;
	cfg.drain_progress = o.rep ? on_progress : NULL;
	cfg.drain_ctx = o.rep;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(!strcmp(s->ops->name, "composite"));
	return s;
}

static void store(sel_store *s, const sel_published *cp)
{
	sel_retry_reason why;
	sel_outcome o = sel_store_put(s, cp, &why);
	CHECKF(o == SEL_QUEUED, "put: %s: %s", sel_outcome_name(o), sel_errmsg());
	sel_event ev;
	sfx_wait_events(s, &ev, 1, check);
	CHECKF(ev.type == SEL_EV_STORED && ev.tier == SEL_TIER_MEMORY, "event %d tier %s", ev.type,
	       sel_tier_name(ev.tier));
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
	return sel_disk_store_record(sel_composite_store_disk(s), k, &ri) == 0 && ri.file;
}

/* ---- drain on, drain off ------------------------------------------------------------------- */

static void on_off(bool drain)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *dir = test_mkdtemp(drain ? "drain-on" : "drain-off");
	struct reports rep = {0};
	sel_store *s = open_store(&fx, dir, (struct opts){.drain = drain, .rep = &rep});
	struct sfx_conv a, b;
	sfx_conv_init(&fx, &a, 1, 1100, 0);
	sfx_conv_init(&fx, &b, 2, 300, 40);
	sel_published a1 = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	sel_published a2 = sfx_ckpt(&fx, &a, 640, 256, 2, 2);
	sel_published a3 = sfx_ckpt(&fx, &a, 1000, 640, 3, 3);
	sel_published b1 = sfx_ckpt(&fx, &b, 256, 0, 4, 4);
	store(s, &a1);
	store(s, &a2);
	store(s, &a3);
	store(s, &b1);
	/* Only DRAM-resident: parked, no file. */
	CHECK(drec(s, &a3.key).parked && !drec(s, &a3.key).file);
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.parked_records == 4);
	CHECK_OK(check(s));
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	if (drain) {
		CHECK(rep.finals == 1 && rep.final.records_written == 4 &&
		      rep.final.records_left == 0);
		CHECK(rep.final.bytes_written > 0 && rep.why[0] == '\0');
	} else {
		/* Regression (stop_without_drain_is_silent): a stop without the
		 * drain dropped its DRAM-only records without a word.  One final
		 * report now says what was lost (flare prints it with the flag
		 * that would have saved them). */
		CHECKF(rep.n == 1 && rep.finals == 1 && rep.final.off &&
			       rep.final.records_left == 4 && rep.final.bytes_left > 0 &&
			       rep.final.records_written == 0 && !strcmp(rep.why, "drain off"),
		       "%d reports, off %d, %" PRIu64 " left", rep.n, rep.final.off,
		       rep.final.records_left);
	}

	s = open_store(&fx, dir, (struct opts){0});
	if (drain) {
		CHECK(test_store_scanned(s) == 4);
		CHECK(test_count_tmp(test_store_dir(s)) == 0);
		sfx_restore(&fx, s, &a, 0, UINT64_MAX, 1000, 100, 5, SEL_TIER_DISK, true, check);
		sfx_restore(&fx, s, &b, 0, UINT64_MAX, 256, 100, 6, SEL_TIER_DISK, true, check);
	} else {
		sel_hit h;
		CHECK(test_store_scanned(s) == 0);
		CHECK(sel_store_lookup(s, &a.h, 0, UINT64_MAX, &h) == 0);
		CHECK(sel_store_lookup(s, &b.h, 0, UINT64_MAX, &h) == 0);
	}
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	test_rmtree(dir);
	free(dir);
	sfx_free(&fx);
	printf("  drain %s: restart %s\n", drain ? "on" : "off",
	       drain ? "hits every DRAM-only record on disk" : "cold for DRAM-only records");
}

/* ---- a limited drain: recent endpoints first, with their ancestors ------------------------- */

static void test_limited(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *dir = test_mkdtemp("drain-limit");
	struct reports rep = {0};
	/* 64-page records (67 slots each): the write-ahead bound of 2 x intake
	 * (268 slots) lets four be written at once. */
	const uint64_t P = 64 * 64;
	sel_store *s = open_store(&fx, dir,
				  (struct opts){.drain = true, .drain_ns = 300000000, .rep = &rep});
	struct sfx_conv a, b, c, d;
	sfx_conv_init(&fx, &a, 11, 2 * P + 10, 0);
	sfx_conv_init(&fx, &b, 12, 2 * P + 10, 200);
	sfx_conv_init(&fx, &c, 13, P + 10, 400);
	sfx_conv_init(&fx, &d, 14, P + 10, 600);
	sel_published a1 = sfx_ckpt(&fx, &a, P, 0, 1, 1), a2 = sfx_ckpt(&fx, &a, 2 * P, P, 2, 2);
	sel_published b1 = sfx_ckpt(&fx, &b, P, 0, 3, 3), b2 = sfx_ckpt(&fx, &b, 2 * P, P, 4, 4);
	sel_published c1 = sfx_ckpt(&fx, &c, P, 0, 5, 5);
	sel_published d1 = sfx_ckpt(&fx, &d, P, 0, 6, 6);
	store(s, &a1);
	store(s, &a2);
	store(s, &b1);
	store(s, &b2);
	store(s, &c1);
	store(s, &d1);
	/* A reuse makes conversation a the most recent; then d, c, b. */
	sel_store_touch(s, &a2.key);
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.parked_records == 6);
	/* Writes take 1.3 s: the drain starts a1, a2, d1, c1 (the bound), then
	 * its 300 ms pass; the started writes finish. */
	__atomic_store_n(&fi.gate_until, eos_now_ns() + 1300000000ull, __ATOMIC_SEQ_CST);
	uint64_t t0 = eos_now_ns();
	CHECK_RC(sel_store_close(s, 0), 0);
	uint64_t took = eos_now_ns() - t0;
	sel_store_destroy(s);
	CHECKF(rep.finals == 1 && rep.n >= 2, "%d reports, %d final", rep.n, rep.finals);
	CHECKF(rep.final.records_written == 4 && rep.final.records_left == 2,
	       "%" PRIu64 " written, %" PRIu64 " left", rep.final.records_written,
	       rep.final.records_left);
	CHECKF(!strcmp(rep.why, "time limit"), "why: %s", rep.why);
	CHECK(rep.final.bytes_left > 0 && rep.final.rate_bps > 0);
	CHECKF(took < 5000000000ull, "close took %" PRIu64 " ms", took / 1000000);
	printf("  limited drain: %d reports, %" PRIu64 " saved, %" PRIu64 " not (%s), %" PRIu64
	       " ms\n",
	       rep.n, rep.final.records_written, rep.final.records_left, rep.why, took / 1000000);

	s = open_store(&fx, dir, (struct opts){0});
	CHECK(test_store_scanned(s) == 4);
	CHECK(on_disk(s, &a1.key) && on_disk(s, &a2.key) && on_disk(s, &d1.key) &&
	      on_disk(s, &c1.key));
	CHECK(!on_disk(s, &b1.key) && !on_disk(s, &b2.key));
	CHECK(test_count_tmp(test_store_dir(s)) == 0);
	sfx_restore(&fx, s, &a, 0, UINT64_MAX, 2 * P, 100, 7, SEL_TIER_DISK, true, check);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	sfx_conv_free(&c);
	sfx_conv_free(&d);
	test_rmtree(dir);
	free(dir);
	sfx_free(&fx);
}

/* ---- failures do not fail shutdown -------------------------------------------------------- */

static void test_failures(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	for (int mode = 0; mode < 2; mode++) {
		char *dir = test_mkdtemp("drain-fail");
		struct reports rep = {0};
		sel_store *s = open_store(&fx, dir, (struct opts){.drain = true, .rep = &rep});
		struct sfx_conv a;
		sfx_conv_init(&fx, &a, 21, 700, 0);
		sel_published a1 = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
		sel_published a2 = sfx_ckpt(&fx, &a, 640, 256, 2, 2);
		store(s, &a1);
		store(s, &a2);
		if (mode == 0)
			__atomic_store_n(&fi.pwrite_err, EIO, __ATOMIC_SEQ_CST);
		else
			__atomic_store_n(&fi.fallocate_err, ENOSPC, __ATOMIC_SEQ_CST);
		char ns[4096];
		snprintf(ns, sizeof ns, "%s", test_store_dir(s));
		uint64_t t0 = eos_now_ns();
		CHECK_RC(sel_store_close(s, 0), 0);
		uint64_t took = eos_now_ns() - t0;
		sel_store_destroy(s);
		__atomic_store_n(&fi.pwrite_err, 0, __ATOMIC_SEQ_CST);
		__atomic_store_n(&fi.fallocate_err, 0, __ATOMIC_SEQ_CST);
		CHECK(rep.finals == 1 && rep.final.records_written == 0);
		if (mode == 0)
			CHECKF(rep.final.failed >= 1 && !strcmp(rep.why, "write errors"),
			       "failed %" PRIu64 " why %s", rep.final.failed, rep.why);
		else
			CHECKF(rep.final.records_left == 2 && !strcmp(rep.why, "disk full"),
			       "left %" PRIu64 " why %s", rep.final.records_left, rep.why);
		CHECK(test_count_tmp(ns) == 0);
		CHECKF(took < 20000000000ull, "close took %" PRIu64 " ms", took / 1000000);
		s = open_store(&fx, dir, (struct opts){0});
		CHECK(test_store_scanned(s) == 0);
		CHECK_RC(sel_store_close(s, 0), 0);
		sel_store_destroy(s);
		sfx_conv_free(&a);
		test_rmtree(dir);
		free(dir);
		printf("  %s at the drain: close succeeds (%s), %" PRIu64 " ms\n",
		       mode ? "ENOSPC" : "EIO", rep.why, took / 1000000);
	}
	sfx_free(&fx);
}

/* ---- committed files are preserved -------------------------------------------------------- */

static void test_preserved(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 1024, 16);
	char *dir = test_mkdtemp("drain-keep");
	struct sfx_conv a, b;
	sfx_conv_init(&fx, &a, 31, 1100, 0);
	sfx_conv_init(&fx, &b, 32, 300, 40);
	sel_published a1 = sfx_ckpt(&fx, &a, 256, 0, 1, 1);
	sel_published a2 = sfx_ckpt(&fx, &a, 640, 256, 2, 2);
	sel_published b1 = sfx_ckpt(&fx, &b, 256, 0, 3, 3);
	/* Session 1 commits a1 and a2; the limit is their bytes. */
	sel_store *s = open_store(&fx, dir, (struct opts){.drain = true});
	store(s, &a1);
	store(s, &a2);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	uint64_t used, limit;
	s = open_store(&fx, dir, (struct opts){0});
	sel_disk_store_usage(sel_composite_store_disk(s), &used, NULL);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);

	/* Session 2: the committed records are held while b1 parks, so it
	 * parks uncharged; at close the drain would have to evict them. */
	struct reports rep = {0};
	s = open_store(&fx, dir, (struct opts){.drain = true, .limit = used + 4096, .rep = &rep});
	sel_store *disk = sel_composite_store_disk(s);
	sel_disk_store_usage(disk, &used, &limit);
	CHECK(test_store_scanned(s) == 2);
	CHECK_OK(sel_disk_store_pin(disk, &a1.key));
	CHECK_OK(sel_disk_store_pin(disk, &a2.key));
	store(s, &b1);
	CHECK(!drec(s, &b1.key).charged);
	sel_disk_store_unpin(disk, &a1.key);
	sel_disk_store_unpin(disk, &a2.key);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECKF(rep.finals == 1 && rep.final.records_written == 0 && rep.final.records_left == 1 &&
		       !strcmp(rep.why, "disk limit"),
	       "written %" PRIu64 " left %" PRIu64 " why %s", rep.final.records_written,
	       rep.final.records_left, rep.why);
	s = open_store(&fx, dir, (struct opts){0});
	CHECK(test_store_scanned(s) == 2 && on_disk(s, &a1.key) && on_disk(s, &a2.key));
	CHECK(!on_disk(s, &b1.key));
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	sfx_conv_free(&a);
	sfx_conv_free(&b);
	test_rmtree(dir);
	free(dir);
	sfx_free(&fx);
	printf("  no budget: not saved (disk limit), committed files kept\n");
}

int main(void)
{
	setenv("SELENE_DISK_IO", "pread", 1);
	fault_ops = eos_fileops_libc;
	fault_ops.pwrite = f_pwrite;
	fault_ops.fallocate = f_fallocate;
	eos_fileops_set(&fault_ops);
	on_off(true);
	on_off(false);
	test_limited();
	test_failures();
	test_preserved();
	eos_fileops_set(NULL);
	printf("ok\n");
	return 0;
}
