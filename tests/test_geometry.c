/*
 * test_geometry.c - CacheGeometry, layout fingerprint, offload identity
 * (design 2.1, implementation step 1 acceptance).
 */
#include "testutil.h"

#define A(rk, nm, grp, knd, unit, cnt)                                                             \
	{                                                                                          \
		.rank = (rk), .name = (nm), .group = (grp), .kind = (knd), .address = 0x1000,      \
		.unit_bytes = (unit), .count = (cnt)                                               \
	}

/* A synthetic core: one row allocation, several page planes (given out of
 * name order), a peer allocation and a weight allocation. */
static sel_allocation base[] = {
	A(0, "weights", SEL_GROUP_OTHER, SEL_MEM_DEVICE, 4096, 100),
	A(0, "value.0", SEL_GROUP_KV_PAGES, SEL_MEM_DEVICE, 65536, 512),
	A(0, "key.0", SEL_GROUP_KV_PAGES, SEL_MEM_DEVICE, 65536, 512),
	A(0, "selector.0", SEL_GROUP_KV_PAGES, SEL_MEM_DEVICE, 2048, 512),
	A(0, "key.peer", SEL_GROUP_KV_PAGES, SEL_MEM_PEER, 65536, 512),
	A(0, "rows", SEL_GROUP_STATE_ROWS, SEL_MEM_DEVICE, 300000, 16),
	A(0, "rows.peer", SEL_GROUP_STATE_ROWS, SEL_MEM_PEER, 300000, 16),
};
#define NBASE (sizeof base / sizeof base[0])

static void fp_of(const sel_allocation *a, size_t n, uint32_t ranks, uint32_t pt, uint8_t out[16])
{
	sel_geometry *g;
	CHECK_OK(sel_geometry_build(a, n, ranks, pt, &g));
	sel_layout_fingerprint(g, out);
	sel_geometry_free(g);
}

static void expect_error(const sel_allocation *a, size_t n, uint32_t ranks, uint32_t pt,
			 const char *needle)
{
	sel_geometry *g = (sel_geometry *)1;
	CHECK_RC(sel_geometry_build(a, n, ranks, pt, &g), SEL_EGEOMETRY);
	CHECK(g == NULL);
	CHECKF(strstr(sel_errmsg(), needle), "message '%s' lacks '%s'", sel_errmsg(), needle);
}

int main(void)
{
	sel_geometry *g;
	CHECK_OK(sel_geometry_build(base, NBASE, 1, 64, &g));
	CHECK(g->ranks == 1 && g->page_tokens == 64);
	sel_rank_geometry *r = &g->rank[0];
	CHECK(r->n_planes == 3);
	CHECK(strcmp(r->pages[0].name, "key.0") == 0);
	CHECK(strcmp(r->pages[1].name, "selector.0") == 0);
	CHECK(strcmp(r->pages[2].name, "value.0") == 0);
	CHECK(r->pages[1].unit_bytes == 2048);
	CHECK(strcmp(r->row.name, "rows") == 0 && r->row.unit_bytes == 300000);
	CHECK(r->row_count == 16 && r->page_count == 512);
	CHECK(r->page_bytes == 65536 * 2 + 2048);
	sel_geometry_free(g);

	/* The fingerprint ignores addresses and counts (load-time options such
	 * as concurrency or verification width change those). */
	uint8_t fp0[16], fp1[16];
	fp_of(base, NBASE, 1, 64, fp0);
	sel_allocation alt[NBASE];
	memcpy(alt, base, sizeof alt);
	for (size_t i = 0; i < NBASE; i++) {
		alt[i].address += 0x100000 * (i + 1);
		alt[i].count *= 3;
	}
	fp_of(alt, NBASE, 1, 64, fp1);
	CHECK(memcmp(fp0, fp1, 16) == 0);
	/* ... and the order allocations are listed in. */
	for (size_t i = 0; i < NBASE; i++)
		alt[i] = base[NBASE - 1 - i];
	fp_of(alt, NBASE, 1, 64, fp1);
	CHECK(memcmp(fp0, fp1, 16) == 0);

	/* It changes with any plane name or size, the page tokens, the rank
	 * count, the row name or row size. */
	for (size_t i = 1; i < NBASE; i++) {
		if (base[i].kind == SEL_MEM_PEER)
			continue;
		memcpy(alt, base, sizeof alt);
		alt[i].unit_bytes += 4096;
		fp_of(alt, NBASE, 1, 64, fp1);
		CHECKF(memcmp(fp0, fp1, 16), "size of %s not in the fingerprint", base[i].name);
		memcpy(alt, base, sizeof alt);
		char name[64];
		snprintf(name, sizeof name, "%s.x", base[i].name);
		alt[i].name = name;
		fp_of(alt, NBASE, 1, 64, fp1);
		CHECKF(memcmp(fp0, fp1, 16), "name of %s not in the fingerprint", base[i].name);
	}
	fp_of(base, NBASE, 1, 128, fp1);
	CHECK(memcmp(fp0, fp1, 16));
	/* Peer and weight allocations do not matter. */
	memcpy(alt, base, sizeof alt);
	alt[0].unit_bytes = 1;
	alt[4].unit_bytes = 7;
	fp_of(alt, NBASE, 1, 64, fp1);
	CHECK(memcmp(fp0, fp1, 16) == 0);

	/* Two ranks: the same planes on rank 1 change the fingerprint (rank
	 * count), and the per-rank lists are independent. */
	sel_allocation two[2 * NBASE];
	memcpy(two, base, sizeof base);
	memcpy(two + NBASE, base, sizeof base);
	for (size_t i = NBASE; i < 2 * NBASE; i++)
		two[i].rank = 1;
	fp_of(two, 2 * NBASE, 2, 64, fp1);
	CHECK(memcmp(fp0, fp1, 16));
	uint8_t fp2[16];
	two[NBASE + 1].unit_bytes *= 2; /* rank 1 value plane differs */
	fp_of(two, 2 * NBASE, 2, 64, fp2);
	CHECK(memcmp(fp1, fp2, 16));

	/* Errors name the rank and what is wrong. */
	expect_error(base, 5, 1, 64, "no STATE_ROWS"); /* rows missing */
	memcpy(alt, base, sizeof alt);
	alt[1].group = alt[2].group = alt[3].group = SEL_GROUP_OTHER;
	expect_error(alt, NBASE, 1, 64, "no KV_PAGES");
	memcpy(alt, base, sizeof alt);
	alt[6].kind = SEL_MEM_DEVICE; /* two row allocations */
	expect_error(alt, NBASE, 1, 64, "two STATE_ROWS");
	memcpy(alt, base, sizeof alt);
	alt[2].name = "value.0";
	expect_error(alt, NBASE, 1, 64, "two KV_PAGES allocations named 'value.0'");
	expect_error(base, NBASE, 2, 64, "rank 1 has no STATE_ROWS");
	expect_error(base, NBASE, 1, 100, "page tokens 100");
	expect_error(base, NBASE, 0, 64, "rank count 0");
	memcpy(alt, base, sizeof alt);
	alt[3].unit_bytes = 0;
	expect_error(alt, NBASE, 1, 64, "selector.0");
	memcpy(alt, base, sizeof alt);
	alt[1].rank = 5;
	expect_error(alt, NBASE, 1, 64, "rank 5 of 1");

	/* Offload identities differ across state modes and models, and are
	 * stable. */
	uint8_t model[32] = {1, 2, 3}, ids[3][32], again[32];
	for (int m = 0; m < 3; m++)
		sel_offload_identity(model, (sel_state_mode)m, ids[m]);
	CHECK(memcmp(ids[0], ids[1], 32) && memcmp(ids[0], ids[2], 32) &&
	      memcmp(ids[1], ids[2], 32));
	sel_offload_identity(model, SEL_MODE_ORDINARY, again);
	CHECK(memcmp(ids[0], again, 32) == 0);
	model[31] ^= 0x80;
	sel_offload_identity(model, SEL_MODE_ORDINARY, again);
	CHECK(memcmp(ids[0], again, 32));
	CHECK(strcmp(sel_state_mode_name(SEL_MODE_COPY), "copy") == 0);

	/* Known-answer values pin the canonical encodings of docs/identity.md:
	 * a change here is a change of on-disk namespace. */
	char hex[65];
	uint8_t zero[32] = {0};
	sel_offload_identity(zero, SEL_MODE_ORDINARY, again);
	printf("identity(zero, ordinary) = %s\n", sel_hex(again, 32, hex));
	CHECK(strcmp(hex, "56fba6211096b21fe87e04f4a00e4d387dc46da520c4ca7d0f07ac1edb9847ef") == 0);
	printf("fingerprint(base) = %s\n", sel_hex(fp0, 16, hex));
	CHECK(strcmp(hex, "f470e3636616251fb0b8fc8920807bb5") == 0);
	CHECK(strcmp(sel_strerror(SEL_EGEOMETRY),
		     "allocations do not form a valid cache geometry") == 0);
	CHECK(strcmp(sel_strerror(-ENOENT), strerror(ENOENT)) == 0);
	printf("ok\n");
	return 0;
}
