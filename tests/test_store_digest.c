/*
 * test_store_digest.c - the store calls of overlapped restores (issue 18;
 * page_digest.c): sel_store_page_digests, sel_store_drop, sel_page_digest.
 *
 * Covers: the memory store's digests of a hit's pages equal the digests of
 * the pages the checkpoints were stored from (sel_page_digest of the
 * planes, padding excluded: a plane of 1000 bytes), for a chain of three
 * records and for GPU-resident prefixes inside it, in any sub-range; a
 * stored page changed afterwards changes its digest (what the engine's
 * recompute is compared with); packed TP2 records give the same digests as
 * their planes; ranges beyond the hit are -EINVAL, a hit whose record was
 * dropped -ESTALE; the disk store has none (-ENOTSUP).  Drop: a leaf is
 * removed (the lookup then finds its deepest ancestor with a row), counted
 * as corrupt; an unknown key is -ENOENT; a record a fetch still reads is
 * -EBUSY and stays.
 */
#include "eos.h"
#include "internal.h"
#include "store_memory_int.h"
#include "storefx.h"
#include "testutil.h"

#define PT SFX_PT

static const uint64_t units2[] = {4096, 1000};

static void store_one(sel_store *s, const sel_published *cp)
{
	sel_retry_reason why;
	CHECK(sel_store_put(s, cp, &why) == SEL_QUEUED);
	sel_event ev;
	sfx_wait_events_all(s, &ev, 1, sel_memory_store_check);
	CHECK(ev.type == SEL_EV_STORED);
}

/* The store's digests of hit's pages [first, first + n) against the
 * planes' digests of the GPU pages they were stored from. */
static void same_digests(struct sfx *f, sel_store *s, const sel_hit *hit, struct sfx_conv *cv,
			 uint32_t first, uint32_t n)
{
	uint64_t got[64], want;
	CHECK(n <= 64);
	CHECK_OK(sel_store_page_digests(s, hit, first, n, got));
	uint64_t base = hit->resident / PT;
	for (uint32_t i = 0; i < n; i++) {
		CHECK_OK(sel_page_digest(f->g, cv->gid[base + first + i], &want));
		CHECKF(got[i] == want, "page %u of the hit at %llu: digest differs", first + i,
		       (unsigned long long)hit->resident);
	}
}

static void test_memory(void)
{
	struct sfx f;
	struct sfx_conv a;
	sel_store *s;
	sfx_init(&f, 1, 2, units2, 20000, 256, 8);
	sel_store_config cfg = sfx_config(&f, false);
	cfg.memory_bytes = 64 * f.slot_bytes;
	CHECK_OK(sel_memory_store_open(&cfg, &s));
	sfx_conv_init(&f, &a, 41, 1100, 10);
	/* Root at 256 (4 pages), then 640 (+6), 1000 (+5). */
	sel_published pa = sfx_ckpt_row(&f, &a, 256, 0, 1, 1, false);
	sel_published pb = sfx_ckpt_row(&f, &a, 640, 256, 2, 2, false);
	sel_published pc = sfx_ckpt_row(&f, &a, 1000, 640, 3, 3, false);
	store_one(s, &pa);
	store_one(s, &pb);
	store_one(s, &pc);

	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 1100, &hit), 1);
	CHECK(hit.key.consumed == 1000 && hit.pages == 15);
	same_digests(&f, s, &hit, &a, 0, 15);
	same_digests(&f, s, &hit, &a, 3, 5);
	same_digests(&f, s, &hit, &a, 14, 1);
	uint64_t d[16];
	CHECK_RC(sel_store_page_digests(s, &hit, 10, 6, d), -EINVAL);
	CHECK_RC(sel_store_page_digests(s, NULL, 0, 1, d), -EINVAL);
	CHECK_OK(sel_store_page_digests(s, &hit, 15, 0, d));
	/* GPU-resident prefixes: at a parent, inside the second record. */
	CHECK_RC(sel_store_lookup(s, &a.h, 256, 1100, &hit), 1);
	CHECK(hit.pages == 11);
	same_digests(&f, s, &hit, &a, 0, 11);
	CHECK_RC(sel_store_lookup(s, &a.h, 300, 1100, &hit), 1);
	same_digests(&f, s, &hit, &a, 0, hit.pages);

	/* A stored page changed afterwards: its digest follows its bytes. */
	struct mem_store *ms = sel_ms_of(s);
	sel_node_id id = sel_index_find(ms->c.ix, &pc.key);
	struct mrec *m = ms_rec(ms, id);
	uint8_t *p =
		(uint8_t *)sel_slab_addr(ms->pool, m->slots[2]) + ms->c.sp->layout.plane_off[0][1];
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 1100, &hit), 1);
	uint64_t before, after;
	CHECK_OK(sel_store_page_digests(s, &hit, 12, 1, &before));
	p[999] ^= 1;
	CHECK_OK(sel_store_page_digests(s, &hit, 12, 1, &after));
	CHECK(before != after);
	/* ... and only its unpadded bytes count. */
	p[1000] ^= 0xff;
	CHECK_OK(sel_store_page_digests(s, &hit, 12, 1, &before));
	CHECK(before == after);

	/* Drop the leaf: the lookup finds the root (the middle lost its row
	 * when the leaf committed). */
	sel_stats st;
	CHECK_RC(sel_store_drop(s, &pc.key), 0);
	CHECK_OK(sel_memory_store_check(s));
	CHECK_RC(sel_store_page_digests(s, &hit, 0, 1, d), -ESTALE);
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 1100, &hit), 1);
	CHECK(sel_key_eq(&hit.key, &pa.key));
	sel_store_stats(s, &st);
	CHECK(st.tier[SEL_TIER_MEMORY].corrupt == 1);
	CHECK_RC(sel_store_drop(s, &pc.key), -ENOENT);
	CHECK_RC(sel_store_drop(s, NULL), -EINVAL);

	/* A record a fetch reads stays. */
	uint32_t dst[4] = {100, 101, 102, 103};
	sel_inbound in = {.ticket = 7, .pages = dst, .n_pages = hit.pages, .state_slot = 5};
	CHECK_OK(sel_store_fetch(s, &hit, &in));
	CHECK_RC(sel_store_drop(s, &pa.key), -EBUSY);
	sel_event ev;
	sfx_wait_events_all(s, &ev, 1, sel_memory_store_check);
	CHECK(ev.type == SEL_EV_FETCHED);
	CHECK_RC(sel_store_drop(s, &pa.key), 0);
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 1100, &hit), 0);
	CHECK_OK(sel_memory_store_check(s));

	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	sfx_conv_free(&a);
	sfx_free(&f);
}

/* TP2 with replicated planes: packed records, one share for both ranks. */
static void test_packed(void)
{
	struct sfx f;
	struct sfx_conv a;
	sel_store *s;
	sfx_init(&f, 2, 2, units2, 20000, 256, 8);
	sel_store_config cfg = sfx_config(&f, false);
	cfg.memory_bytes = 64 * f.slot_bytes;
	CHECK_OK(sel_memory_store_open(&cfg, &s));
	sfx_conv_init(&f, &a, 42, 800, 10);
	sel_published pa = sfx_ckpt_row(&f, &a, 448, 0, 1, 1, false);
	store_one(s, &pa);
	sel_stats st;
	sel_store_stats(s, &st);
	CHECK(st.packed_records == 1);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 800, &hit), 1);
	same_digests(&f, s, &hit, &a, 0, hit.pages);
	CHECK_RC(sel_store_lookup(s, &a.h, 64, 800, &hit), 1); /* from an odd share */
	same_digests(&f, s, &hit, &a, 0, hit.pages);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	sfx_conv_free(&a);
	sfx_free(&f);
}

static void test_disk(void)
{
	struct sfx f;
	struct sfx_conv a;
	sel_store *s;
	char *dir = test_mkdtemp("store-digest");
	sfx_init(&f, 1, 2, units2, 20000, 256, 8);
	sel_store_config cfg = sfx_config(&f, false);
	cfg.disk_dir = dir;
	cfg.disk_limit = 64 << 20;
	CHECK_OK(sel_disk_store_open(&cfg, &s));
	sfx_conv_init(&f, &a, 43, 600, 10);
	sel_published pa = sfx_ckpt_row(&f, &a, 512, 0, 1, 1, false);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &pa, &why) == SEL_QUEUED);
	sel_event ev;
	sfx_wait_events(s, &ev, 1, NULL);
	CHECK(ev.type == SEL_EV_STORED);
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 600, &hit), 1);
	uint64_t d[8];
	CHECK_RC(sel_store_page_digests(s, &hit, 0, 2, d), -ENOTSUP);
	/* Every core store drops. */
	CHECK_OK(sel_store_drop(s, &pa.key));
	CHECK_RC(sel_store_lookup(s, &a.h, 0, 600, &hit), 0);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	sfx_conv_free(&a);
	sfx_free(&f);
	test_rmtree(dir);
	free(dir);
}

int main(void)
{
	test_memory();
	test_packed();
	test_disk();
	printf("ok\n");
	return 0;
}
