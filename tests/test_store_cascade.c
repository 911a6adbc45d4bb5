/*
 * test_store_cascade.c - the end-of-chain hook of the store skeleton
 * (store_common.h sel_core_cascade_*, design 2.15 "eviction below the
 * instance") on a memory store and a disk store, with a fake next level:
 *
 *   - nothing is offered while free capacity is above the store's floor;
 *     under it, the least recently used evictable leaf is, once, and the
 *     store holds it (pinned, still found by lookups, never taken by a
 *     put's eviction) until the next level answers;
 *   - accepted: the record leaves, counted evicted but not dropped, and
 *     capacity comes back (progress);
 *   - refused at the offer, or kept after it: the record stays local and
 *     unpinned, offers pause for a backoff, and it can still be evicted
 *     for good later (dropped at the end of the chain);
 *   - clearing the hook ends what is held as kept;
 *   - the floors (design 2.5, 2.15): memory offers while free slots (warm
 *     and intake) plus held ones are under 2 x intake, from exactly there
 *     (a warm tier under 4 x intake: a quarter of warm); disk while free
 *     bytes plus held ones are under 2 x intake slots' bytes (at most a
 *     quarter of the limit), counting unlinks still in flight as room made
 *     and what a composite's parked records wait for as taken: DRAM's
 *     demotions get their room from the next level, not by dropping a
 *     committed record.
 *
 * Then the pool as the next level, a real `flare pool` started here (TP 2,
 * identical ranks: replicated and packed shares):
 *   - a disk tier's records with replicated shares (pages and row, pages
 *     only) cascade: read, checked, copied out to both ranks; another
 *     instance restores them from the arena byte-exact; a damaged file and
 *     a killed manager keep the record local, restorable;
 *   - a composite's parked records go straight from DRAM, never written,
 *     offered once (a held one is not written by maintenance), leaving
 *     both tiers when accepted; a killed manager keeps it local;
 *   - a manager that refuses (an arena too small: oversize) keeps either
 *     local, restorable, with no lease or record left at the manager.
 * The local tiers' module checkers run after every poll (and, with
 * SEL_DEBUG_CHECKS=1, after every mutation).
 */
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "eos.h"
#include "pool_testlib.h"
#include "record.h"
#include "store_common.h"
#include "store_composite.h"
#include "store_composite_int.h"
#include "store_disk.h"
#include "store_memory.h"
#include "store_pooled.h"
#include "storefx.h"
#include "testutil.h"

struct next_level {
	bool take;
	uint32_t n;
	sel_key keys[16];
};

static bool offer(void *ctx, sel_store *s, const sel_key *key)
{
	struct next_level *nl = ctx;
	(void)s;
	CHECK(nl->n < 16);
	nl->keys[nl->n++] = *key;
	return nl->take;
}

static sel_stats stats(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	return st;
}

static void store(sel_store *s, const sel_published *cp, sfx_check_fn check)
{
	sel_retry_reason why;
	sel_outcome o = sel_store_put(s, cp, &why);
	CHECKF(o == SEL_QUEUED, "put: %s: %s", sel_outcome_name(o), sel_errmsg());
	sel_event ev = sfx_one_event(s, check);
	CHECKF(ev.type == SEL_EV_STORED && ev.checkpoint == cp->checkpoint, "event %d", ev.type);
	sfx_settle(s, check);
}

static bool found(sel_store *s, struct sfx_conv *cv, uint64_t c)
{
	sel_hit hit;
	int rc = sel_store_lookup(s, &cv->h, 0, c, &hit);
	CHECK(rc >= 0);
	return rc == 1 && hit.key.consumed == c;
}

static uint32_t pins(struct sel_core *c, const sel_key *k)
{
	sel_node_id id = sel_index_find(c->ix, k);
	CHECK(id != SEL_NODE_NONE);
	return sel_core_node(c, id)->pins;
}

static const uint64_t units[] = {4096, 1000};

/* Memory: 20 warm slots, records of 2 pages and 3 row slots (5 slots), the
 * floor a quarter of warm (5 slots). */
static void test_memory(void)
{
	struct sfx f;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sel_store_config cfg = sfx_config(&f, false);
	cfg.memory_bytes = 20 * f.slot_bytes;
	sel_store *s;
	CHECK_OK(sel_memory_store_open(&cfg, &s));
	struct sel_core *c = sel_store_core(s);
	CHECK(c && c->warm == 20 && f.row_slots == 3);
	struct next_level nl = {.take = true};
	struct sel_cascade k = {.offer = offer, .ctx = &nl};
	sel_core_cascade_set(c, &k);

	struct sfx_conv cv[8];
	sel_published cp[8];
	for (int i = 0; i < 8; i++) {
		sfx_conv_init(&f, &cv[i], 60 + i, 200, 10 + 10 * i);
		cp[i] = sfx_ckpt_row(&f, &cv[i], 128, 0, 1, 100 + i, false);
	}
	for (int i = 0; i < 3; i++)
		store(s, &cp[i], sel_memory_store_check);
	CHECK(nl.n == 0); /* 5 free slots: not under the floor */
	store(s, &cp[3], sel_memory_store_check);
	/* Full: the oldest leaf is offered, once, and held. */
	CHECK(nl.n == 1 && sel_key_eq(&nl.keys[0], &cp[0].key));
	CHECK(sel_core_cascade_holds(c, &cp[0].key) && pins(c, &cp[0].key) == 1);
	CHECK(found(s, &cv[0], 128)); /* the source is kept until the answer */
	sel_tier_stats t0 = stats(s).tier[SEL_TIER_MEMORY];
	/* A put's eviction passes over the held record. */
	store(s, &cp[4], sel_memory_store_check);
	CHECK(found(s, &cv[0], 128) && !found(s, &cv[1], 128));
	sel_tier_stats t1 = stats(s).tier[SEL_TIER_MEMORY];
	CHECK(t1.evicted == t0.evicted + 1 &&
	      t1.dropped_end_of_chain == t0.dropped_end_of_chain + 1);
	CHECK(nl.n == 1); /* free 0 + held 5: not under the floor */

	/* Accepted: it leaves, evicted but not dropped; capacity is back. */
	sel_core_cascade_end(c, &cp[0].key, true);
	CHECK(!found(s, &cv[0], 128) && !sel_core_cascade_holds(c, &cp[0].key));
	sel_tier_stats t2 = stats(s).tier[SEL_TIER_MEMORY];
	CHECK(t2.evicted == t1.evicted + 1 && t2.dropped_end_of_chain == t1.dropped_end_of_chain);
	CHECK(c->casc_accepted == 1 && c->casc_units == 0);
	CHECK_OK(sel_memory_store_check(s));
	sel_core_cascade_end(c, &cp[0].key, true); /* a second end finds nothing */
	CHECK(stats(s).tier[SEL_TIER_MEMORY].evicted == t2.evicted);

	/* Refused at the offer: it stays, unpinned; offers pause (a loaded
	 * machine may outlast a backoff: then it is offered, and refused,
	 * again). */
	nl.take = false;
	store(s, &cp[5], sel_memory_store_check); /* full again: cp[2] is the oldest */
	CHECK(nl.n >= 2);
	for (uint32_t i = 1; i < nl.n; i++)
		CHECK(sel_key_eq(&nl.keys[i], &cp[2].key));
	CHECK(!sel_core_cascade_holds(c, &cp[2].key) && pins(c, &cp[2].key) == 0);
	CHECK(found(s, &cv[2], 128) && c->casc_after && c->casc_wait >= 50000000ull);
	/* After the backoff it is offered again; kept: still local. */
	nl.take = true;
	c->casc_after = 0;
	uint32_t before = nl.n;
	sfx_pump(s, sel_memory_store_check, NULL);
	CHECK(nl.n == before + 1 && sel_key_eq(&nl.keys[before], &cp[2].key));
	CHECK(sel_core_cascade_holds(c, &cp[2].key));
	sel_core_cascade_end(c, &cp[2].key, false);
	CHECK(found(s, &cv[2], 128) && pins(c, &cp[2].key) == 0 && c->casc_kept == 1);
	CHECK(c->casc_after > 0 && c->casc_wait >= 100000000ull); /* doubled */
	/* A kept record is still the local end: a put's eviction drops it. */
	uint64_t dropped = stats(s).tier[SEL_TIER_MEMORY].dropped_end_of_chain;
	store(s, &cp[6], sel_memory_store_check);
	CHECK(!found(s, &cv[2], 128));
	CHECK(stats(s).tier[SEL_TIER_MEMORY].dropped_end_of_chain == dropped + 1);

	/* Clearing the hook ends what is held as kept. */
	c->casc_after = 0;
	sfx_pump(s, sel_memory_store_check, NULL);
	CHECK(c->casc_n == 1);
	sel_key held = c->casc_held[0].key;
	sel_core_cascade_set(c, NULL);
	CHECK(c->casc_n == 0 && pins(c, &held) == 0 && c->casc_units == 0);
	CHECK_OK(sel_memory_store_check(s));

	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	for (int i = 0; i < 8; i++)
		sfx_conv_free(&cv[i]);
	sfx_free(&f);
}

static sel_store *open_disk(struct sfx *f, const char *dir, uint64_t limit)
{
	sel_store_config cfg = sfx_config(f, false);
	cfg.disk_dir = dir;
	cfg.disk_limit = limit;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(!strcmp(s->ops->name, "disk"));
	return s;
}

/* Disk: a limit of 4.5 records, the floor a quarter of it (byte headroom). */
static void test_disk(void)
{
	struct sfx f;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	struct sfx_conv cv[6];
	sel_published cp[6];
	for (int i = 0; i < 6; i++) {
		sfx_conv_init(&f, &cv[i], 80 + i, 200, 10 + 10 * i);
		cp[i] = sfx_ckpt_row(&f, &cv[i], 128, 0, 1, 200 + i, false);
	}
	char *d0 = test_mkdtemp("cascade-size");
	sel_store *s = open_disk(&f, d0, 1ull << 30);
	store(s, &cp[0], NULL);
	uint64_t rec = stats(s).tier[SEL_TIER_DISK].bytes_used;
	CHECK(rec > 0);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(d0));
	free(d0);

	char *dir = test_mkdtemp("cascade");
	s = open_disk(&f, dir, 4 * rec + rec / 2);
	struct sel_core *c = sel_store_core(s);
	CHECK(c);
	struct next_level nl = {.take = true};
	struct sel_cascade k = {.offer = offer, .ctx = &nl};
	sel_core_cascade_set(c, &k);
	for (int i = 0; i < 3; i++)
		store(s, &cp[i], NULL);
	CHECK(nl.n == 0); /* 1.5 records free: above the floor */
	store(s, &cp[3], NULL);
	CHECK(nl.n == 1 && sel_key_eq(&nl.keys[0], &cp[0].key));
	CHECK(found(s, &cv[0], 128) && pins(c, &cp[0].key) == 1);
	uint64_t dropped = stats(s).tier[SEL_TIER_DISK].dropped_end_of_chain;
	sel_core_cascade_end(c, &cp[0].key, true);
	CHECK(!found(s, &cv[0], 128));
	CHECK(stats(s).tier[SEL_TIER_DISK].dropped_end_of_chain == dropped);
	sfx_settle(s, NULL); /* the unlink */
	CHECK(stats(s).tier[SEL_TIER_DISK].bytes_used == 3 * rec);
	/* Kept: stays on disk. */
	store(s, &cp[4], NULL);
	CHECK(nl.n == 2 && sel_key_eq(&nl.keys[1], &cp[1].key));
	sel_core_cascade_end(c, &cp[1].key, false);
	CHECK(found(s, &cv[1], 128) && pins(c, &cp[1].key) == 0);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(dir));
	free(dir);
	for (int i = 0; i < 6; i++)
		sfx_conv_free(&cv[i]);
	sfx_free(&f);
}

/* Records of 64 pages and 3 row slots (67 slots), written at GPU ids 0..63
 * just before each is stored. */
static sel_published big_ckpt(struct sfx *f, struct sfx_conv *cv, int i)
{
	sfx_conv_init(f, cv, 300 + (uint64_t)i, 64 * SFX_PT + 10, 0);
	return sfx_ckpt_row(f, cv, 64 * SFX_PT, 0, 1, 400 + (uint64_t)i, false);
}

/* Memory's floor at exactly 2 x intake (design 2.5): warm = intake + 7
 * records, so seven records leave free + held == 2 x intake (no offer) and
 * the eighth one record under it (one offer: held slots count as free, so
 * no second). */
static void test_memory_floor(void)
{
	struct sfx f;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sel_store_config cfg = sfx_config(&f, false);
	const uint64_t intake = 2 * (64 + 3), rec = 64 + 3; /* max_active 1, row_slots 3 */
	uint64_t warm = intake + 7 * rec;
	CHECK(warm >= 4 * intake); /* not the small-tier quarter */
	cfg.memory_bytes = warm * f.slot_bytes;
	sel_store *s;
	CHECK_OK(sel_memory_store_open(&cfg, &s));
	struct sel_core *c = sel_store_core(s);
	CHECK(c && c->warm == warm && c->intake == intake && f.row_slots == 3);
	struct next_level nl = {.take = true};
	struct sel_cascade k = {.offer = offer, .ctx = &nl};
	sel_core_cascade_set(c, &k);
	struct sfx_conv cv[9];
	sel_published cp[9];
	for (int i = 0; i < 7; i++) {
		cp[i] = big_ckpt(&f, &cv[i], i);
		store(s, &cp[i], sel_memory_store_check);
	}
	sel_stats st = stats(s);
	CHECK(st.slots_total - st.slots_in_use == 2 * intake);
	CHECK(nl.n == 0); /* at the floor, not under it */
	cp[7] = big_ckpt(&f, &cv[7], 7);
	store(s, &cp[7], sel_memory_store_check);
	CHECK(nl.n == 1 && sel_key_eq(&nl.keys[0], &cp[0].key) && c->casc_units == rec);
	sfx_pump(s, sel_memory_store_check, NULL);
	CHECK(nl.n == 1); /* free + held == 2 x intake again */
	/* Accepted: its slots are free; the next record brings it back under. */
	sel_core_cascade_end(c, &cp[0].key, true);
	cp[8] = big_ckpt(&f, &cv[8], 8);
	store(s, &cp[8], sel_memory_store_check);
	CHECK(nl.n == 2 && sel_key_eq(&nl.keys[1], &cp[1].key));
	CHECK(stats(s).tier[SEL_TIER_MEMORY].dropped_end_of_chain == 0);
	sel_core_cascade_set(c, NULL);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	for (int i = 0; i < 9; i++)
		sfx_conv_free(&cv[i]);
	sfx_free(&f);
}

/* Disk's byte headroom (design 2.15): 2 x intake slots' bytes when that is
 * under a quarter of the limit (here the limit is 20 records, the headroom
 * just under 4), and it includes the unlinks still in flight. */
static void test_disk_headroom(void)
{
	struct sfx f;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	struct sfx_conv cv[18];
	sel_published cp[18];
	char *d0 = test_mkdtemp("cascade-size");
	sel_store *s = open_disk(&f, d0, 1ull << 30);
	cp[0] = big_ckpt(&f, &cv[0], 0);
	store(s, &cp[0], NULL);
	uint64_t rec = stats(s).tier[SEL_TIER_DISK].bytes_used;
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(d0));
	free(d0);
	sfx_conv_free(&cv[0]);

	char *dir = test_mkdtemp("cascade-room");
	uint64_t limit = 20 * rec, want = 2 * 134 * f.slot_bytes, room = 0, fr = 0, unl = 0;
	CHECK(want < limit / 4 && want > 3 * rec && want < 4 * rec);
	s = open_disk(&f, dir, limit);
	struct sel_core *c = sel_store_core(s);
	CHECK(!sel_disk_store_headroom(s, &fr, &unl, &room));
	CHECK(room == want && fr == limit && unl == 0);
	struct next_level nl = {.take = true};
	struct sel_cascade k = {.offer = offer, .ctx = &nl};
	sel_core_cascade_set(c, &k);
	for (int i = 0; i < 16; i++) {
		cp[i] = big_ckpt(&f, &cv[i], i);
		store(s, &cp[i], NULL);
	}
	CHECK(nl.n == 0); /* 4 records free: above the headroom (a quarter would not be) */
	cp[16] = big_ckpt(&f, &cv[16], 16);
	store(s, &cp[16], NULL);
	CHECK(nl.n == 1 && sel_key_eq(&nl.keys[0], &cp[0].key));
	/* Accepted: the record leaves and its unlink is submitted.  Until the
	 * disk thread's completion is polled the file is still there, but the
	 * headroom counts its bytes as room made: nothing more is offered. */
	sel_core_cascade_end(c, &cp[0].key, true);
	CHECK(!sel_disk_store_headroom(s, &fr, &unl, NULL));
	CHECK(unl == rec && fr == 4 * rec);
	sfx_pump(s, NULL, NULL);
	CHECK(nl.n == 1);
	sfx_settle(s, NULL);
	CHECK(!sel_disk_store_headroom(s, &fr, &unl, NULL));
	CHECK(unl == 0 && fr == 4 * rec && nl.n == 1);
	cp[17] = big_ckpt(&f, &cv[17], 17);
	store(s, &cp[17], NULL);
	CHECK(nl.n == 2 && sel_key_eq(&nl.keys[1], &cp[1].key));
	CHECK(stats(s).tier[SEL_TIER_DISK].dropped_end_of_chain == 0);
	sel_core_cascade_set(c, NULL);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(dir));
	free(dir);
	for (int i = 0; i < 18; i++)
		sfx_conv_free(&cv[i]);
	sfx_free(&f);
}

static struct sel_disk_record_info info(sel_store *disk, const sel_key *k)
{
	struct sel_disk_record_info di;
	CHECK_OK(sel_disk_store_record(disk, k, &di));
	return di;
}

static bool committed(sel_store *disk, const sel_key *k)
{
	struct sel_disk_record_info di;
	return sel_disk_store_record(disk, k, &di) == 0 && di.file && !di.writing;
}

/* A composite (design 2.15 "DRAM demotes cold records to disk, and the
 * last local tier to the manager, before they fill"): a record parked in
 * DRAM that the disk cannot charge (the two committed records pinned, a
 * limit of 2.8 records) counts against the disk's headroom, though the
 * free bytes alone (0.8 records) are above it (0.7): once a committed
 * record can move, it is offered to the next level, and the parked record
 * is charged and written when that one was accepted -- nothing dropped. */
static void test_composite_demand(void)
{
	struct sfx f;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	struct sfx_conv cv[3];
	sel_published cp[3];
	for (int i = 0; i < 3; i++) {
		sfx_conv_init(&f, &cv[i], 90 + i, 200, 10 + 10 * i);
		cp[i] = sfx_ckpt_row(&f, &cv[i], 128, 0, 1, 500 + i, false);
	}
	char *d0 = test_mkdtemp("cascade-size");
	sel_store *s = open_disk(&f, d0, 1ull << 30);
	store(s, &cp[0], NULL);
	uint64_t rec = stats(s).tier[SEL_TIER_DISK].bytes_used;
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(d0));
	free(d0);

	char *dir = test_mkdtemp("cascade-comp");
	sel_store_config cfg = sfx_config(&f, false);
	cfg.memory_bytes = 40 * f.slot_bytes;
	cfg.disk_dir = dir;
	cfg.disk_limit = 2 * rec + rec * 4 / 5;
	CHECK_OK(sel_store_open(&cfg, &s));
	CHECK(!strcmp(s->ops->name, "composite"));
	sel_store *disk = sel_composite_store_disk(s);
	struct sel_core *c = sel_store_core(disk);
	for (int i = 0; i < 2; i++) {
		store(s, &cp[i], NULL);
		SFX_UNTIL(s, NULL, committed(disk, &cp[i].key));
	}
	uint64_t fr = 0, room = 0;
	CHECK(!sel_disk_store_headroom(disk, &fr, NULL, &room));
	CHECK(fr == cfg.disk_limit - 2 * rec && room == cfg.disk_limit / 4 && fr >= room);
	CHECK_OK(sel_disk_store_pin(disk, &cp[0].key));
	CHECK_OK(sel_disk_store_pin(disk, &cp[1].key));
	store(s, &cp[2], NULL);
	struct sel_disk_record_info di = info(disk, &cp[2].key);
	CHECK(di.parked && !di.charged);
	CHECK(sel_disk_store_headroom(disk, &fr, NULL, NULL) && fr == 0); /* it wants a record */

	struct next_level nl = {.take = true};
	struct sel_cascade k = {.offer = offer, .ctx = &nl};
	sel_core_cascade_set(c, &k);
	sel_disk_store_unpin(disk, &cp[0].key);
	SFX_UNTIL(s, NULL, nl.n == 1);
	CHECK(sel_key_eq(&nl.keys[0], &cp[0].key) && sel_core_cascade_holds(c, &cp[0].key));
	di = info(disk, &cp[2].key);
	CHECK(di.parked && !di.charged); /* held, cp[0] makes no room yet */
	sel_core_cascade_end(c, &cp[0].key, true);
	SFX_UNTIL(s, NULL, committed(disk, &cp[2].key));
	CHECK(sel_disk_store_record(disk, &cp[0].key, &di) == -ENOENT);
	CHECK(stats(s).tier[SEL_TIER_DISK].dropped_end_of_chain == 0);
	CHECK(found(s, &cv[1], 128) && found(s, &cv[2], 128));
	sel_disk_store_unpin(disk, &cp[1].key);
	sel_core_cascade_set(c, NULL);
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(dir));
	free(dir);
	for (int i = 0; i < 3; i++)
		sfx_conv_free(&cv[i]);
	sfx_free(&f);
}


/* ---- the pool as the next level: a real `flare pool` (design 2.15) ------------------------ */

/* TP 2, one page plane of 4096 bytes, a row of 4096: identical ranks'
 * pages and rows are stored once (replicated) on disk and packed in DRAM. */
static const uint64_t tp_unit[1] = {4096};

static char pdir[200];

static sel_store *pooled_inner(sel_store *s) { return ((struct sel_pooled *)s)->w.inner; }

static bool local_has(sel_store *s, struct sfx_conv *cv, uint64_t c)
{
	return found(pooled_inner(s), cv, c);
}

/* Publish checkpoint c of cv (its row split across ranks or not) into s's
 * local tiers and wait for STORED. */
static void put_local(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t c, uint64_t id,
		      bool row_split)
{
	sel_published p = sfx_ckpt_row(f, cv, c, 0, 1, id, row_split);
	sel_retry_reason why;
	sel_outcome o = sel_store_put(s, &p, &why);
	CHECKF(o == SEL_QUEUED, "put: %s: %s", sel_outcome_name(o), sel_errmsg());
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	for (;;) {
		int n = sfx_poll_wait(s, ev, 8);
		CHECK(n <= 1);
		if (n == 1 && ev[0].type == SEL_EV_PROGRESS)
			continue;
		if (n == 1) {
			CHECKF(ev[0].type == SEL_EV_STORED && ev[0].checkpoint == id, "event %d",
			       ev[0].type);
			return;
		}
		CHECK(eos_now_ns() < deadline);
	}
}

/* A pool-only instance B of f's scope restores checkpoint c of a
 * conversation with cv's tokens from the arena, byte-exact on every rank. */
static void restore_from_pool(struct sfx *fb, sel_store *b, struct sfx_conv *cv, uint64_t c,
			      bool row_split, uint64_t ticket)
{
	sel_hit hit;
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	int rc;
	while ((rc = sel_store_lookup(b, &cv->h, 0, c, &hit)) != 1) {
		CHECK((rc == 0 || rc == SEL_LOOKUP_PENDING) && eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECKF(hit.tier == SEL_TIER_POOL && hit.key.consumed == c && !hit.neighbour,
	       "tier %d consumed %" PRIu64, hit.tier, hit.key.consumed);
	sfx_poison(fb);
	uint32_t ids[8];
	for (uint32_t i = 0; i < hit.pages; i++)
		ids[i] = 20 + i;
	sel_inbound in = {.ticket = ticket, .pages = ids, .n_pages = hit.pages, .state_slot = 2};
	CHECK_OK(sel_store_fetch(b, &hit, &in));
	int n;
	while ((n = sfx_poll_wait(b, ev, 8)) == 0)
		CHECK(eos_now_ns() < deadline);
	CHECKF(n == 1 && ev[0].type == SEL_EV_FETCHED && ev[0].ticket == ticket &&
		       ev[0].tier == SEL_TIER_POOL,
	       "event %d tier %d", ev[0].type, ev[0].tier);
	for (uint32_t j = 0; j < c / SFX_PT; j++)
		CHECKF(sfx_page_ok(fb, 20 + j, cv->tag, j, false), "page %u", j);
	CHECK(sfx_row_ok(fb, 2, sfx_row_seed(cv, c), row_split));
}

/* The file bytes of one replicated record of f (a disk store of its own). */
static uint64_t record_bytes(struct sfx *f, struct sfx_conv *cv)
{
	char *d0 = test_mkdtemp("cascade-size");
	sel_store *s = open_disk(f, d0, 1ull << 30);
	sel_published cp = sfx_ckpt_row(f, cv, 128, 0, 1, 1, false);
	store(s, &cp, NULL);
	uint64_t rec = stats(s).tier[SEL_TIER_DISK].bytes_used;
	CHECK(info(s, &cp.key).flags == (SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED));
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(d0));
	free(d0);
	return rec;
}

/* A disk (or, with memory, composite) store over dir with the pool of m. */
static sel_store *open_local_pooled(struct sfx *f, const struct mgr_proc *m, const char *id,
				    const char *dir, uint64_t limit, uint64_t memory)
{
	sel_store_config c = sfx_config(f, true);
	c.disk_dir = dir;
	c.disk_limit = limit;
	c.memory_bytes = memory;
	c.pool = m->sock;
	c.pool_instance_id = id;
	c.pool_wait_ns = 10ull * 1000000000;
	sel_store *s;
	CHECK_OK(sel_store_open(&c, &s));
	CHECKF(sfx_pool_counters(s).state == SEL_POOL_UP, "%s", sel_store_warning(s));
	return s;
}

static sel_store *open_pool_only(struct sfx *f, const struct mgr_proc *m, const char *id)
{
	sel_store_config c = sfx_config(f, true);
	c.pool = m->sock;
	c.pool_instance_id = id;
	c.pool_wait_ns = 10ull * 1000000000;
	sel_store *s;
	CHECK_OK(sel_store_open(&c, &s));
	CHECKF(sfx_pool_counters(s).state == SEL_POOL_UP, "%s", sel_store_warning(s));
	return s;
}

/* The module checkers of s's local tiers (design 2.12). */
static int check_local(sel_store *s)
{
	sel_store *in = pooled_inner(s);
	return strcmp(in->ops->name, "composite") ? sel_disk_store_check(in)
						  : sel_composite_store_check(in);
}

/* Flip one byte of key's first page record in its file. */
static void damage(sel_store *disk, const sel_key *k)
{
	struct sel_disk_file df;
	CHECK_OK(sel_disk_store_file(disk, k, &df));
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(k, name);
	int fd = openat(sel_disk_store_dirfd(disk), name, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0);
	uint8_t byte;
	CHECK(pread(fd, &byte, 1, (off_t)df.span.page_off + 9) == 1);
	byte ^= 0x40;
	CHECK(pwrite(fd, &byte, 1, (off_t)df.span.page_off + 9) == 1);
	close(fd);
}

/* Records with replicated shares cascade from disk (design 2.15, TP 2): A
 * (disk + pool, a limit of 8 records less a page, so a put's worst-case
 * per-rank reservation always fits the headroom the cascade keeps) moves
 * its oldest record -- pages and row stored once for both ranks -- into
 * the arena once its disk is under its headroom, each share read and
 * checked against the file's checksums and copied out to both ranks, and
 * B restores it byte-exact; then one whose pages are replicated and whose
 * row is per rank.  A damaged file is not cascaded (the put fails, the
 * record stays); a manager that stops answering and is killed leaves the
 * held record local, restorable byte-exact from A's disk.  Nothing is
 * dropped. */
static void test_pool_replicated_disk(void)
{
	struct sfx fa, fb;
	sfx_init(&fa, 2, 1, tp_unit, 4096, 64, 8);
	sfx_init(&fb, 2, 1, tp_unit, 4096, 64, 8);
	struct sfx_conv ca[9], cb[2];
	for (int i = 0; i < 9; i++)
		sfx_conv_init(&fa, &ca[i], 140 + i, 128, 4 * i);
	for (int i = 0; i < 2; i++)
		sfx_conv_init(&fb, &cb[i], 140 + i, 128, 0);
	uint64_t rec = record_bytes(&fa, &ca[8]);
	struct mgr_proc m;
	mgr_start(&m, pdir, "mgr-rep", "--memory", "8MiB", NULL);
	char *dd = test_mkdtemp("pool-rep");
	sel_store *a = open_local_pooled(&fa, &m, "RA", dd, 8 * rec - 4096, 0);
	sel_store *b = open_pool_only(&fb, &m, "RB");
	sel_store *disk = pooled_inner(a);
	struct sel_core *core = sel_store_core(disk);
	CHECK(!strcmp(disk->ops->name, "disk") && ((struct sel_pooled *)a)->casc == core);
	sel_key k[8];
	for (int i = 0; i < 8; i++)
		k[i] = sfx_key(&ca[i], 128);
	for (int i = 0; i < 6; i++) {
		CHECK(sfx_pool_counters(a).puts == 0); /* above the headroom: nothing */
		put_local(&fa, a, &ca[i], 128, 80 + i, i == 1);
		struct sel_disk_file df;
		SFX_UNTIL(a, check_local, sel_disk_store_file(disk, &k[i], &df) == 0);
		if (i == 1) /* both replicated; pages replicated, the row per rank */
			CHECK(df.d.flags == SEL_RECORD_PAGES_REPLICATED &&
			      info(disk, &k[0]).flags ==
				      (SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED));
	}
	SFX_UNTIL(a, check_local, sfx_pool_counters(a).cascaded == 1);
	CHECK(!local_has(a, &ca[0], 128) && local_has(a, &ca[1], 128));
	restore_from_pool(&fb, b, &cb[0], 128, false, 701);
	/* Pages replicated, the row per rank. */
	put_local(&fa, a, &ca[6], 128, 86, false);
	SFX_UNTIL(a, check_local, sfx_pool_counters(a).cascaded == 2);
	CHECK(!local_has(a, &ca[1], 128));
	restore_from_pool(&fb, b, &cb[1], 128, true, 702);
	CHECK(stats(a).tier[SEL_TIER_DISK].dropped_end_of_chain == 0);

	/* ca[2] is next: a byte of its first (replicated) page record changed. */
	damage(disk, &k[2]);
	put_local(&fa, a, &ca[7], 128, 87, false);
	SFX_UNTIL(a, check_local, sfx_pool_counters(a).cascade_kept >= 1);
	CHECK(local_has(a, &ca[2], 128) && sfx_pool_counters(a).cascaded == 2 &&
	      sfx_pool_counters(a).puts_failed >= 1);
	/* Stopped, the file repaired: the next offer of ca[2] waits on the
	 * manager, held; killed, the record stays local and restores. */
	CHECK(kill(m.pid, SIGSTOP) == 0);
	damage(disk, &k[2]);
	uint64_t kept = sfx_pool_counters(a).cascade_kept;
	core->casc_after = 0;
	SFX_UNTIL(a, check_local, core->casc_n == 1 && sel_core_cascade_holds(core, &k[2]));
	CHECK(local_has(a, &ca[2], 128));
	mgr_kill9(&m);
	SFX_UNTIL(a, check_local, core->casc_n == 0 && sfx_pool_counters(a).cascade_kept > kept);
	CHECK(local_has(a, &ca[2], 128) && sfx_pool_counters(a).cascaded == 2);
	sfx_poison(&fa);
	sfx_restore(&fa, a, &ca[2], 0, 128, 128, 40, 3, SEL_TIER_DISK, true, check_local);
	CHECK(stats(a).tier[SEL_TIER_DISK].dropped_end_of_chain == 0);
	CHECK_OK(check_local(a));
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	CHECK_OK(test_rmtree(dd));
	free(dd);
	for (int i = 0; i < 9; i++)
		sfx_conv_free(&ca[i]);
	for (int i = 0; i < 2; i++)
		sfx_conv_free(&cb[i]);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* A composite's parked records go to the pool straight from DRAM (design
 * 2.15's order DRAM, NVMe, manager): A (warm memory with room, so nothing
 * is demoted; a disk limit of 2.5 records) parks its records in DRAM with
 * their disk bytes charged; the second one takes the disk under its
 * headroom, and the oldest parked record -- never written -- is offered
 * from its memory slots (packed: one share for both ranks), accepted, and
 * leaves both tiers; B restores it byte-exact.  A parked record held for
 * the pool is not written to disk meanwhile (even when maintenance writes
 * every other parked record), so it is offered once, from DRAM; a manager
 * killed while it waits leaves it local and restorable. */
static void test_pool_parked_dram(void)
{
	struct sfx fa, fb;
	sfx_init(&fa, 2, 1, tp_unit, 4096, 64, 8);
	sfx_init(&fb, 2, 1, tp_unit, 4096, 64, 8);
	struct sfx_conv ca[4], cb0;
	for (int i = 0; i < 4; i++)
		sfx_conv_init(&fa, &ca[i], 150 + i, 128, 10 * i);
	sfx_conv_init(&fb, &cb0, 150, 128, 0);
	uint64_t rec = record_bytes(&fa, &ca[3]);
	struct mgr_proc m;
	mgr_start(&m, pdir, "mgr-park", "--memory", "8MiB", NULL);
	char *dd = test_mkdtemp("pool-park");
	sel_store *a = open_local_pooled(&fa, &m, "PA", dd, 2 * rec + rec / 2, 512 * fa.slot_bytes);
	sel_store *b = open_pool_only(&fb, &m, "PB");
	sel_store *comp = pooled_inner(a), *disk = sel_composite_store_disk(comp);
	struct sel_core *core = sel_store_core(disk);
	CHECK(!strcmp(comp->ops->name, "composite") && ((struct sel_pooled *)a)->casc == core);
	sel_key k[3];
	for (int i = 0; i < 3; i++)
		k[i] = sfx_key(&ca[i], 128);
	put_local(&fa, a, &ca[0], 128, 90, false);
	struct sel_disk_record_info di = info(disk, &k[0]);
	CHECK(di.parked && di.charged && !di.file && di.flags != 0);
	CHECK(sfx_pool_counters(a).puts == 0 && !sel_disk_store_headroom(disk, NULL, NULL, NULL));
	put_local(&fa, a, &ca[1], 128, 91, false);
	SFX_UNTIL(a, check_local, sfx_pool_counters(a).cascaded == 1);
	CHECK(sel_disk_store_record(disk, &k[0], &di) == -ENOENT && !local_has(a, &ca[0], 128));
	struct sel_memory_view v;
	CHECK(sel_memory_store_view(sel_composite_store_memory(comp), &k[0], &v) == -ENOENT);
	struct sel_composite_gauges g;
	sel_composite_store_gauges(comp, &g);
	CHECK(g.writes_started == 0 && sfx_pool_counters(a).puts == 1); /* once, from DRAM */
	CHECK(stats(a).tier[SEL_TIER_DISK].dropped_end_of_chain == 0);
	restore_from_pool(&fb, b, &cb0, 128, false, 801);

	/* The manager stopped: ca[1], now the oldest, is offered and held. */
	CHECK(kill(m.pid, SIGSTOP) == 0);
	put_local(&fa, a, &ca[2], 128, 92, false);
	SFX_UNTIL(a, check_local, core->casc_n == 1 && sel_core_cascade_holds(core, &k[1]));
	CHECK(sfx_pool_counters(a).puts == 2);
	/* Maintenance demotes what is parked (as if a refused put needed
	 * every warm slot): ca[2] is written, the held ca[1] is not. */
	struct comp_store *cs = sel_cs_of(comp);
	SFX_UNTIL(a, check_local, (cs->want_slots = 1u << 30, committed(disk, &k[2])));
	di = info(disk, &k[1]);
	CHECK(di.parked && !di.file && !di.writing && sel_core_cascade_holds(core, &k[1]));
	CHECK(local_has(a, &ca[1], 128));
	mgr_kill9(&m);
	SFX_UNTIL(a, check_local, core->casc_n == 0 && sfx_pool_counters(a).cascade_kept == 1);
	CHECK(local_has(a, &ca[1], 128) && sfx_pool_counters(a).cascaded == 1);
	cs->want_slots = 0;
	sfx_poison(&fa);
	sfx_restore(&fa, a, &ca[1], 0, 128, 128, 40, 3, SEL_TIER_MEMORY, true, check_local);
	CHECK(stats(a).tier[SEL_TIER_DISK].dropped_end_of_chain == 0);
	CHECK_OK(check_local(a));
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	CHECK_OK(test_rmtree(dd));
	free(dd);
	for (int i = 0; i < 4; i++)
		sfx_conv_free(&ca[i]);
	sfx_conv_free(&cb0);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* A manager whose arena cannot hold a record refuses the put (oversize):
 * the record -- on disk with replicated shares, or (parked) parked in DRAM
 * -- stays local and restores byte-exact; nothing dropped, no lease left
 * at the manager. */
static void test_pool_refused(bool parked)
{
	struct sfx fa;
	sfx_init(&fa, 2, 1, tp_unit, 4096, 64, 8);
	struct sfx_conv ca[7];
	for (int i = 0; i < 7; i++)
		sfx_conv_init(&fa, &ca[i], 160 + i, 128, 4 * i);
	uint64_t rec = record_bytes(&fa, &ca[6]);
	/* The arena's header, then room for two slots: a record needs three. */
	char mem[32];
	snprintf(mem, sizeof mem, "%" PRIu64, (uint64_t)65536 + 2 * fa.slot_bytes);
	struct mgr_proc m;
	mgr_start(&m, pdir, parked ? "mgr-ref-park" : "mgr-ref", "--memory", mem, NULL);
	char *dd = test_mkdtemp("pool-ref");
	sel_store *a = parked ? open_local_pooled(&fa, &m, "FA", dd, 2 * rec + rec / 2,
						  512 * fa.slot_bytes)
			      : open_local_pooled(&fa, &m, "FA", dd, 8 * rec - 4096, 0);
	sel_store *disk = pooled_inner(a);
	if (parked)
		disk = sel_composite_store_disk(disk);
	struct sel_core *core = sel_store_core(disk);
	sel_key k0 = sfx_key(&ca[0], 128);
	int n = parked ? 2 : 6;
	for (int i = 0; i < n; i++) {
		put_local(&fa, a, &ca[i], 128, 95 + i, false);
		sel_key ki = sfx_key(&ca[i], 128);
		struct sel_disk_file df;
		if (!parked)
			SFX_UNTIL(a, check_local, sel_disk_store_file(disk, &ki, &df) == 0);
	}
	SFX_UNTIL(a, check_local, sfx_pool_counters(a).cascade_kept >= 1);
	CHECK(sfx_pool_counters(a).puts_refused >= 1 && sfx_pool_counters(a).cascaded == 0);
	SFX_UNTIL(a, check_local, core->casc_n == 0);
	struct sel_disk_record_info di = info(disk, &k0);
	CHECK(parked ? di.parked && !di.file : di.file && di.flags != 0);
	CHECK(local_has(a, &ca[0], 128));
	wait_metric_eq(&m, "flare_pool_leases", 0, 10);
	wait_metric_eq(&m, "flare_pool_records", 0, 10);
	sfx_poison(&fa);
	sfx_restore(&fa, a, &ca[0], 0, 128, 128, 40, 3, parked ? SEL_TIER_MEMORY : SEL_TIER_DISK,
		    true, check_local);
	CHECK(stats(a).tier[SEL_TIER_DISK].dropped_end_of_chain == 0);
	CHECK_OK(sel_store_close(a, 0));
	sel_store_destroy(a);
	mgr_stop(&m);
	CHECK_OK(test_rmtree(dd));
	free(dd);
	for (int i = 0; i < 7; i++)
		sfx_conv_free(&ca[i]);
	sfx_free(&fa);
}

int main(void)
{
	test_memory();
	test_memory_floor();
	test_disk();
	test_disk_headroom();
	test_composite_demand();
	/* With a real manager: the flare binary (SELENE_BUILD) or a skip. */
	signal(SIGPIPE, SIG_IGN);
	(void)flare_bin();
	char *d = test_mkdtemp("cascade-pool");
	snprintf(pdir, sizeof pdir, "%s", d);
	test_pool_replicated_disk();
	test_pool_parked_dram();
	test_pool_refused(false);
	test_pool_refused(true);
	test_rmtree(d);
	free(d);
	printf("test_store_cascade: ok\n");
	return 0;
}
