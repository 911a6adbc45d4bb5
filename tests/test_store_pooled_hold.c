/*
 * test_store_pooled_hold.c - host holdings (store_pooled_hold.c, design
 * 2.15 "announcements of GPU and host holdings", copy priority "neighbour
 * GPU, host DRAM, host NVMe, pool") against a real `flare pool`.
 *
 *   - the client's pick: GPU, DRAM, NVMe, arena in any order of the
 *     manager's answer; a deeper endpoint first.
 *   - priority: A (memory + pool, engine hooks) holds a checkpoint in its
 *     GPU cache and its memory tier, C put the same one into the arena; B
 *     (pool only) restores it from A's GPU; once A's GPU copy is gone
 *     (eviction notice) from A's DRAM holding, byte-exact, without A's
 *     engine pinning anything; once A's memory record is removed the
 *     holding is withdrawn and B restores from the arena.
 *   - NVMe: A (disk + pool) announces its disk records; B restores one
 *     byte-exact from A's files (read and checked on A's helper); a record
 *     whose file on A was damaged is refused (damaged, counted, the holding
 *     withdrawn), B's restore fails, and B's next restore of it takes the
 *     arena's copy, byte-exact.
 */
#include "pool_testlib.h"
#include "store_common.h"
#include "store_disk.h"
#include "store_memory.h"
#include "store_pooled.h"
#include "storefx.h"

static char dir[200];

/* Pump the others (holders: no events expected) and b until b has one
 * event (20 s). */
static sel_event next_event_of(sel_store *b, sel_store *o1, sel_store *o2)
{
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	for (;;) {
		if (o1)
			CHECK(sel_store_poll(o1, ev, 8) == 0);
		if (o2)
			CHECK(sel_store_poll(o2, ev, 8) == 0);
		int n = sfx_poll_wait(b, ev, 8);
		if (n) {
			CHECKF(n == 1, "%d events", n);
			return ev[0];
		}
		CHECK(eos_now_ns() < deadline);
	}
}

static sel_store *open_store(struct sfx *f, const char *sock, const char *id, uint64_t memory,
			     const char *disk, const sel_export_hooks *hooks)
{
	sel_store_config c = sfx_config(f, true);
	c.memory_bytes = memory;
	c.pool = sock;
	c.pool_instance_id = id;
	c.pool_wait_ns = 10 * S_NS;
	c.pool_exports = hooks;
	if (disk) {
		c.disk_dir = disk;
		c.disk_limit = 1ull << 30;
	}
	sel_store *s = NULL;
	CHECK_OK(sel_store_open(&c, &s));
	CHECKF(sfx_pool_counters(s).state == SEL_POOL_UP, "state %d: %s",
	       sfx_pool_counters(s).state, sel_store_warning(s));
	return s;
}

/* Put checkpoint c of cv into s, wait for STORED (pumping o too). */
static void put_wait(struct sfx *f, sel_store *s, sel_store *o, struct sfx_conv *cv, uint64_t c,
		     uint64_t id)
{
	sel_published p = sfx_ckpt(f, cv, c, 0, 1, id);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &p, &why) == SEL_QUEUED);
	sel_event e = next_event_of(s, o, NULL);
	CHECKF(e.type == SEL_EV_STORED && e.checkpoint == id, "event %d", e.type);
}

/* B's lookup with limit (each limit is a ticket of its own) until the
 * pool's hit of endpoint c arrives, pumping the holders. */
static sel_hit pool_hit(sel_store *b, sel_store *a, struct sfx_conv *cv, uint64_t c, uint64_t limit)
{
	sel_hit hit;
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	for (;;) {
		int rc = sel_store_lookup(b, &cv->h, 0, limit, &hit);
		CHECK(rc >= 0);
		if (rc == 1)
			break;
		CHECK(eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
		if (a)
			CHECK(sel_store_poll(a, ev, 8) == 0);
	}
	CHECKF(hit.tier == SEL_TIER_POOL && hit.key.consumed == c, "tier %d at %" PRIu64, hit.tier,
	       hit.key.consumed);
	return hit;
}

/* pool_hit until the pick is no longer what want_gone says (the
 * manager sees A's withdrawal after B's earlier lookups): each try with a
 * limit of its own, below limit. */
static sel_hit pool_hit_after(sel_store *b, sel_store *a, struct sfx_conv *cv, uint64_t c,
			      uint64_t limit, bool gone_neighbour, sel_tier gone_tier)
{
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	for (uint64_t l = limit;; l--) {
		CHECK(l > c && eos_now_ns() < deadline);
		sel_hit hit = pool_hit(b, a, cv, c, l);
		if (hit.neighbour != gone_neighbour || hit.neighbour_tier != gone_tier)
			return hit;
	}
}

/* Wait (pumping s) until cond. */
#define UNTIL(s, cond)                                                                             \
	do {                                                                                       \
		sel_event until_ev_[8];                                                            \
		uint64_t until_d_ = eos_now_ns() + 20 * S_NS;                                      \
		while (!(cond)) {                                                                  \
			CHECKF(eos_now_ns() < until_d_, "not reached in 20 s: %s", #cond);         \
			(void)sfx_poll_wait((s), until_ev_, 8);                                    \
		}                                                                                  \
	} while (0)

/* The client's pick (sel_pool_answer_pick) over one endpoint's
 * candidates in every order: the copy priority neighbour GPU, DRAM, NVMe,
 * then the arena; a deeper endpoint beats a closer source. */
static void test_pick_priority(void)
{
	uint8_t id[SEL_IDENTITY_BYTES] = {7};
	sel_history h;
	CHECK_OK(sel_history_init(&h, id, NULL, 0));
	sel_token tok[256];
	for (uint32_t i = 0; i < 256; i++)
		tok[i] = (sel_token)(i * 7 + 1);
	CHECK_OK(sel_history_append(&h, tok, 256));
	struct sel_pool_anode nodes[2];
	sel_history_key_at(&h, 128, &nodes[0].key);
	sel_history_key_at(&h, 256, &nodes[1].key);
	nodes[0].tail = 2;
	nodes[1].tail = 4;
	nodes[0].up = nodes[1].up = SEL_POOL_NONE;
	nodes[0].has_row = nodes[1].has_row = 1;
	const uint8_t src[4] = {SEL_POOL_SRC_ARENA, SEL_POOL_SRC_NVME, SEL_POOL_SRC_DRAM,
				SEL_POOL_SRC_GPU};
	/* Every permutation of the four at endpoint 256 (as the manager lists
	 * holders GPU first, the order must not matter). */
	uint32_t perm[24][4], np = 0;
	for (uint32_t a = 0; a < 4; a++)
		for (uint32_t b = 0; b < 4; b++)
			for (uint32_t c = 0; c < 4; c++)
				for (uint32_t d = 0; d < 4; d++)
					if (a != b && a != c && a != d && b != c && b != d &&
					    c != d) {
						perm[np][0] = a, perm[np][1] = b;
						perm[np][2] = c, perm[np++][3] = d;
					}
	CHECK(np == 24);
	for (uint32_t n = 4; n >= 1; n--) /* drop the closest source each round */
		for (uint32_t q = 0; q < np; q++) {
			struct sel_pool_candidate cands[4];
			uint32_t k = 0;
			for (uint32_t j = 0; j < 4; j++)
				if (perm[q][j] < n)
					cands[k++] = (struct sel_pool_candidate){
						.source = src[perm[q][j]], .node = 1};
			struct sel_pool_m_answer a = {
				.n_nodes = 2, .n_cands = k, .nodes = nodes, .cands = cands};
			int i = sel_pool_answer_pick(&a, &h, 0);
			CHECK(i >= 0 && cands[i].source == src[n - 1]);
		}
	/* The arena's deeper copy beats a neighbour's GPU copy of less. */
	struct sel_pool_candidate c2[2] = {{.source = SEL_POOL_SRC_ARENA, .node = 1},
					   {.source = SEL_POOL_SRC_GPU, .node = 0}};
	struct sel_pool_m_answer a2 = {.n_nodes = 2, .n_cands = 2, .nodes = nodes, .cands = c2};
	CHECK(sel_pool_answer_pick(&a2, &h, 0) == 0);
	sel_history_free(&h);
}

/* The engine's hooks for one GPU checkpoint. */
struct hooks_ctx {
	sel_published cp;
	int pins, pinned_ever;
};

static int h_pin(void *ctx, const sel_key *key, uint64_t id, sel_published *out)
{
	struct hooks_ctx *h = ctx;
	if (id != h->cp.checkpoint || !sel_key_eq(key, &h->cp.key))
		return -ENOENT;
	*out = h->cp;
	h->pins++;
	h->pinned_ever++;
	return 0;
}

static void h_unpin(void *ctx, uint64_t id)
{
	struct hooks_ctx *h = ctx;
	CHECK(id == h->cp.checkpoint && h->pins > 0);
	h->pins--;
}

/* Neighbour GPU, then DRAM (also above a resident page), then the arena,
 * as each copy goes. */
static void test_priority_dram(void)
{
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb, fc;
	sfx_init(&fa, 1, 2, unit, 6000, 64, 8);
	sfx_init(&fb, 1, 2, unit, 6000, 64, 8);
	sfx_init(&fc, 1, 2, unit, 6000, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "hmgr1", "--memory", "16MiB", NULL);
	struct hooks_ctx hc = {0};
	sel_export_hooks hooks = {.ctx = &hc, .pin = h_pin, .unpin = h_unpin};
	sel_store *a = open_store(&fa, m.sock, "HA", 4 << 20, NULL, &hooks);
	sel_store *b = open_store(&fb, m.sock, "HB", 0, NULL, NULL);
	sel_store *c = open_store(&fc, m.sock, "HC", 0, NULL, NULL);
	struct sfx_conv ca, cb, cc;
	sfx_conv_init(&fa, &ca, 9, 320, 0);
	sfx_conv_init(&fb, &cb, 9, 320, 0);
	sfx_conv_init(&fc, &cc, 9, 320, 0);
	hc.cp = sfx_ckpt(&fa, &ca, 256, 0, 1, 41);
	put_wait(&fa, a, NULL, &ca, 256, 41); /* A's GPU and memory tier */
	UNTIL(a, sfx_pool_counters(a).host_announced[0] == 1);
	CHECK(sfx_pool_counters(a).announced == 1 && sfx_pool_counters(a).host_announced[1] == 0);
	put_wait(&fc, c, a, &cc, 256, 42); /* C: the arena's copy */
	UNTIL(c, sfx_pool_counters(c).puts_accepted == 1);
	wait_metric_eq(&m, "flare_pool_holdings", 2, 10); /* the manager has A's two */

	/* The neighbour's GPU first. */
	sel_hit hit = pool_hit(b, a, &cb, 256, 320);
	CHECK(hit.neighbour && hit.neighbour_tier == SEL_TIER_NONE);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 201));
	sel_event e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 201, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb, 256, 20, 2) && hc.pinned_ever == 1 && hc.pins == 0);

	/* A's GPU copy gone: its DRAM holding, no engine pin. */
	sel_store_evicted(a, &hc.cp.key, 41, NULL);
	CHECK(sfx_pool_counters(a).withdrawn == 1);
	wait_metric_eq(&m, "flare_pool_holdings", 1, 10);
	hit = pool_hit_after(b, a, &cb, 256, 300, true, SEL_TIER_NONE);
	CHECKF(hit.neighbour && hit.neighbour_tier == SEL_TIER_MEMORY, "neighbour %d tier %d",
	       hit.neighbour, hit.neighbour_tier);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 30, 3, 202));
	e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 202, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb, 256, 30, 3));
	CHECK(hc.pinned_ever == 1 && sfx_pool_counters(a).exports_served == 2);
	CHECK(sfx_pool_counters(b).neighbour_restores == 2 &&
	      sfx_pool_counters(b).neighbour_host_restores[0] == 1);
	/* Above a resident page: the export copies the chain from page 1. */
	sel_event evs[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	int rc;
	while ((rc = sel_store_lookup(b, &cb.h, 64, 310, &hit)) != 1) {
		CHECK(rc >= 0 && eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, evs, 8) == 0);
		CHECK(sel_store_poll(a, evs, 8) == 0);
	}
	CHECK(hit.neighbour_tier == SEL_TIER_MEMORY && hit.pages == 3 && hit.resident == 64);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 50, 5, 204));
	e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 204, "event %d", e.type);
	for (uint32_t j = 1; j < 4; j++)
		CHECK(sfx_page_ok(&fb, 50 + j - 1, cb.tag, j, false));
	CHECK(sfx_row_ok(&fb, 5, sfx_row_seed(&cb, 256), false));

	/* A's memory record removed: withdrawn; the arena serves. */
	sel_store *mem = ((struct sel_pooled *)a)->w.inner;
	CHECK_OK(sel_memory_store_remove(mem, &hc.cp.key));
	CHECK(sfx_pool_counters(a).host_withdrawn[0] == 1);
	wait_metric_eq(&m, "flare_pool_holdings", 0, 10);
	hit = pool_hit_after(b, a, &cb, 256, 290, true, SEL_TIER_MEMORY);
	CHECKF(!hit.neighbour, "neighbour tier %d", hit.neighbour_tier);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 40, 4, 203));
	e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 203, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb, 256, 40, 4));

	sel_store *all[3] = {a, b, c};
	for (int i = 0; i < 3; i++) {
		CHECK_OK(sel_store_close(all[i], 0));
		sel_store_destroy(all[i]);
	}
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	sfx_conv_free(&cc);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
	sfx_free(&fc);
}

/* A's disk tier as NVMe holdings; a damaged file refused. */
static void test_nvme_damaged(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx fa, fb, fc;
	sfx_init(&fa, 1, 1, unit, 4096, 64, 8);
	sfx_init(&fb, 1, 1, unit, 4096, 64, 8);
	sfx_init(&fc, 1, 1, unit, 4096, 64, 8);
	char *dd = test_mkdtemp("hdisk");
	struct mgr_proc m;
	mgr_start(&m, dir, "hmgr2", "--memory", "8MiB", NULL);
	sel_store *a = open_store(&fa, m.sock, "NA", 0, dd, NULL);
	sel_store *b = open_store(&fb, m.sock, "NB", 0, NULL, NULL);
	sel_store *c = open_store(&fc, m.sock, "NC", 0, NULL, NULL);
	sel_store *disk = ((struct sel_pooled *)a)->w.inner;
	CHECK(!strcmp(disk->ops->name, "disk"));
	struct sfx_conv ca[2], cb[2], cc1;
	for (int i = 0; i < 2; i++) {
		sfx_conv_init(&fa, &ca[i], 50 + i, 192, 10 * i);
		sfx_conv_init(&fb, &cb[i], 50 + i, 192, 0);
	}
	sfx_conv_init(&fc, &cc1, 51, 192, 0);
	for (int i = 0; i < 2; i++) {
		put_wait(&fa, a, NULL, &ca[i], 128, 60 + i);
		sel_key k = sfx_key(&ca[i], 128);
		struct sel_disk_file df;
		SFX_UNTIL(a, NULL, sel_disk_store_file(disk, &k, &df) == 0);
	}
	UNTIL(a, sfx_pool_counters(a).host_announced[1] == 2);
	CHECK(sfx_pool_counters(a).host_announced[0] == 0);
	wait_metric_eq(&m, "flare_pool_holdings", 2, 10);

	/* B restores ca[0] from A's files. */
	sel_hit hit = pool_hit(b, a, &cb[0], 128, 192);
	CHECKF(hit.neighbour && hit.neighbour_tier == SEL_TIER_DISK, "neighbour %d tier %d",
	       hit.neighbour, hit.neighbour_tier);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 401));
	sel_event e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 401, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb[0], 128, 20, 2));
	CHECK(sfx_pool_counters(a).exports_served == 1 &&
	      sfx_pool_counters(b).neighbour_host_restores[1] == 1);
	/* With B's GPU holding the first page: only the second is read. */
	sel_event evs[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	int rc;
	while ((rc = sel_store_lookup(b, &cb[0].h, 64, 192, &hit)) != 1) {
		CHECK(rc >= 0 && eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, evs, 8) == 0);
		CHECK(sel_store_poll(a, evs, 8) == 0);
	}
	CHECK(hit.neighbour_tier == SEL_TIER_DISK && hit.pages == 1 && hit.resident == 64);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 50, 5, 404));
	e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 404, "event %d", e.type);
	CHECK(sfx_page_ok(&fb, 50, cb[0].tag, 1, false) &&
	      sfx_row_ok(&fb, 5, sfx_row_seed(&cb[0], 128), false));

	/* ca[1]: C puts the arena's copy, then a byte of A's file changes. */
	put_wait(&fc, c, a, &cc1, 128, 70);
	UNTIL(c, sfx_pool_counters(c).puts_accepted == 1);
	sel_key k1 = sfx_key(&ca[1], 128);
	struct sel_disk_file df;
	CHECK_OK(sel_disk_store_file(disk, &k1, &df));
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&k1, name);
	int fd = openat(sel_disk_store_dirfd(disk), name, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0);
	uint8_t byte;
	CHECK(pread(fd, &byte, 1, (off_t)df.span.page_off + 17) == 1);
	byte ^= 0x20;
	CHECK(pwrite(fd, &byte, 1, (off_t)df.span.page_off + 17) == 1);
	close(fd);
	hit = pool_hit(b, a, &cb[1], 128, 192);
	CHECK(hit.neighbour && hit.neighbour_tier == SEL_TIER_DISK); /* NVMe before the arena */
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 30, 3, 402));
	e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 402, "event %d", e.type);
	CHECK(sfx_pool_counters(a).exports_refused[SEL_EXPORT_DAMAGED] == 1);
	CHECK(sfx_pool_counters(a).host_withdrawn[1] == 1);
	wait_metric_eq(&m, "flare_pool_holdings", 1, 10);
	/* B's next restore: the arena's copy, byte-exact. */
	hit = pool_hit(b, a, &cb[1], 128, 192);
	CHECK(!hit.neighbour);
	CHECK_OK(sfx_fetch_at(b, &hit, 30, 3, 403));
	e = next_event_of(b, a, c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 403, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb[1], 128, 30, 3));

	sel_store *all[3] = {a, b, c};
	for (int i = 0; i < 3; i++) {
		CHECK_OK(sel_store_close(all[i], 0));
		sel_store_destroy(all[i]);
	}
	for (int i = 0; i < 2; i++) {
		sfx_conv_free(&ca[i]);
		sfx_conv_free(&cb[i]);
	}
	sfx_conv_free(&cc1);
	mgr_stop(&m);
	CHECK_OK(test_rmtree(dd));
	free(dd);
	sfx_free(&fa);
	sfx_free(&fb);
	sfx_free(&fc);
}

int main(void)
{
	char *d = test_mkdtemp("phold");
	snprintf(dir, sizeof dir, "%s", d);
	signal(SIGPIPE, SIG_IGN);
	test_pick_priority();
	test_priority_dram();
	test_nvme_damaged();
	test_rmtree(d);
	free(d);
	printf("ok\n");
	return 0;
}
