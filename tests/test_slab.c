/*
 * test_slab.c - the host slot pool and slot layout (design 2.5; design 1 for
 * the automatic intake size).
 *
 * Covers: layout numbers for hand-built geometries and their errors; rows
 * spread over several slots written and read back byte-exact by walking
 * pieces; warm allocation stopping at the intake reserve and -ENOSPC leaving
 * the pool unchanged; reuse; 4 KiB alignment; staging release; intake sizing
 * (full, shrunk with a warning, floor, -ENOMEM, argument and overflow
 * errors); registration hooks; refused double frees; a pool over a
 * borrowed range (a split pool's identity range: addresses from its base,
 * the range untouched and still usable after destroy, argument errors); and
 * a randomised alloc/free run checked against a model after every
 * operation.
 */
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eos.h"
#include "slab.h"
#include "testutil.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

/* ---- hand-built geometries ------------------------------------------------ */

struct geo_builder {
	sel_geometry g;
	sel_rank_geometry rank[8];
	sel_plane planes[8][8];
};

/* Rank r gets n page planes with the given unit sizes and a row of row_bytes. */
static void geo_rank(struct geo_builder *b, uint32_t r, uint64_t row_bytes, uint32_t n,
		     const uint64_t *units)
{
	sel_rank_geometry *rg = &b->rank[r];
	memset(rg, 0, sizeof(*rg));
	rg->row.name = (char *)"state";
	rg->row.unit_bytes = row_bytes;
	rg->row_count = 4;
	rg->pages = b->planes[r];
	rg->n_planes = n;
	rg->page_count = 16;
	for (uint32_t i = 0; i < n; i++) {
		b->planes[r][i].name = (char *)"plane";
		b->planes[r][i].unit_bytes = units[i];
		rg->page_bytes += units[i];
	}
	if (r + 1 > b->g.ranks)
		b->g.ranks = r + 1;
	b->g.rank = b->rank;
	b->g.page_tokens = 64;
}

static void test_layout_numbers(void)
{
	sel_slot_layout l;

	/* One rank: a 64 KiB plane and a 100-byte index plane; row fits one slot. */
	{
		struct geo_builder b = {0};
		geo_rank(&b, 0, 10000, 2, (uint64_t[]){64 * KiB, 100});
		CHECK_OK(sel_slot_layout_init(&l, &b.g));
		CHECK(l.ranks == 1);
		CHECK(l.share[0] == 64 * KiB + 4 * KiB);
		CHECK(l.share_off[0] == 0);
		CHECK(l.plane_off[0][0] == 0 && l.plane_off[0][1] == 64 * KiB);
		CHECK(l.slot_bytes == 68 * KiB);
		CHECK(l.row_bytes[0] == 10000);
		CHECK(l.row_slots == 1);
		uint64_t off, len;
		sel_slot_layout_row_piece(&l, 0, 0, &off, &len);
		CHECK(off == 0 && len == 10000);
		sel_slot_layout_free(&l);
		CHECK(l.share == NULL && l.ranks == 0);
		sel_slot_layout_free(&l); /* twice is fine */
	}

	/* Two ranks with different shares; each row needs several slots. */
	{
		struct geo_builder b = {0};
		geo_rank(&b, 0, 50000, 2, (uint64_t[]){8192, 4097}); /* share 16 KiB, 4 pieces */
		geo_rank(&b, 1, 20000, 1, (uint64_t[]){1});          /* share 4 KiB, 5 pieces */
		CHECK_OK(sel_slot_layout_init(&l, &b.g));
		CHECK(l.share[0] == 16 * KiB && l.share[1] == 4 * KiB);
		CHECK(l.share_off[0] == 0 && l.share_off[1] == 16 * KiB);
		CHECK(l.plane_off[0][0] == 0 && l.plane_off[0][1] == 8 * KiB);
		CHECK(l.plane_off[1][0] == 0);
		CHECK(l.slot_bytes == 20 * KiB);
		CHECK(l.row_slots == 5);
		uint64_t off, len;
		for (uint32_t i = 0; i < 3; i++) {
			sel_slot_layout_row_piece(&l, 0, i, &off, &len);
			CHECK(off == 0 && len == 16 * KiB);
		}
		sel_slot_layout_row_piece(&l, 0, 3, &off, &len);
		CHECK(off == 0 && len == 50000 - 3 * 16 * KiB);
		sel_slot_layout_row_piece(&l, 0, 4, &off, &len);
		CHECK(len == 0);
		for (uint32_t i = 0; i < 4; i++) {
			sel_slot_layout_row_piece(&l, 1, i, &off, &len);
			CHECK(off == 16 * KiB && len == 4 * KiB);
		}
		sel_slot_layout_row_piece(&l, 1, 4, &off, &len);
		CHECK(off == 16 * KiB && len == 20000 - 4 * 4 * KiB);
		sel_slot_layout_free(&l);
	}

	/* Exact multiples: a row of exactly 3 shares needs 3 slots, not 4; a
	 * row smaller than a share still takes one whole slot. */
	{
		struct geo_builder b = {0};
		geo_rank(&b, 0, 3 * 12 * KiB, 3, (uint64_t[]){4 * KiB, 4 * KiB, 4 * KiB});
		geo_rank(&b, 1, 1, 1, (uint64_t[]){2 * MiB});
		geo_rank(&b, 2, 2 * MiB, 2, (uint64_t[]){1 * MiB, 512 * KiB + 1});
		CHECK_OK(sel_slot_layout_init(&l, &b.g));
		CHECK(l.share[0] == 12 * KiB && l.share[1] == 2 * MiB);
		CHECK(l.share[2] == MiB + 512 * KiB + 4 * KiB);
		CHECK(l.share_off[2] == 12 * KiB + 2 * MiB);
		CHECK(l.plane_off[2][1] == MiB);
		CHECK(l.slot_bytes == 12 * KiB + 2 * MiB + MiB + 516 * KiB);
		CHECK(l.slot_bytes % 4096 == 0);
		CHECK(l.row_slots ==
		      3); /* rank 0: exactly 3; rank 2: ceil(2 MiB / 1.504 MiB) = 2 */
		uint64_t off, len;
		sel_slot_layout_row_piece(&l, 0, 2, &off, &len);
		CHECK(len == 12 * KiB);
		sel_slot_layout_row_piece(&l, 1, 0, &off, &len);
		CHECK(off == 12 * KiB && len == 1);
		sel_slot_layout_row_piece(&l, 1, 1, &off, &len);
		CHECK(len == 0);
		sel_slot_layout_row_piece(&l, 2, 1, &off, &len);
		CHECK(off == 12 * KiB + 2 * MiB && len == 2 * MiB - (MiB + 516 * KiB));
		sel_slot_layout_row_piece(&l, 2, 2, &off, &len);
		CHECK(len == 0);
		sel_slot_layout_free(&l);
	}

	/* A large row (135 slots, like Qwen TP1 in design 1). */
	{
		struct geo_builder b = {0};
		geo_rank(&b, 0, 135 * 64 * KiB - 7, 2, (uint64_t[]){32 * KiB, 32 * KiB});
		CHECK_OK(sel_slot_layout_init(&l, &b.g));
		CHECK(l.row_slots == 135);
		sel_slot_layout_free(&l);
	}
}

static void test_layout_errors(void)
{
	sel_slot_layout l;
	struct geo_builder b = {0};

	CHECK_RC(sel_slot_layout_init(&l, &b.g), SEL_EGEOMETRY); /* no ranks */
	CHECK(l.share == NULL);
	sel_slot_layout_free(&l);

	geo_rank(&b, 0, 100, 0, NULL);
	CHECK_RC(sel_slot_layout_init(&l, &b.g), SEL_EGEOMETRY);
	CHECK(strstr(sel_errmsg(), "rank 0") != NULL);

	memset(&b, 0, sizeof(b));
	geo_rank(&b, 0, 100, 1, (uint64_t[]){4096});
	geo_rank(&b, 1, 100, 2, (uint64_t[]){4096, 0});
	CHECK_RC(sel_slot_layout_init(&l, &b.g), SEL_EGEOMETRY);
	CHECK(strstr(sel_errmsg(), "rank 1") != NULL);
	CHECK(l.share == NULL && l.plane_off == NULL && l.ranks == 0);
	sel_slot_layout_free(&l);

	memset(&b, 0, sizeof(b));
	geo_rank(&b, 0, 0, 1, (uint64_t[]){4096});
	CHECK_RC(sel_slot_layout_init(&l, &b.g), SEL_EGEOMETRY);

	/* Padding one plane overflows. */
	memset(&b, 0, sizeof(b));
	geo_rank(&b, 0, 100, 1, (uint64_t[]){UINT64_MAX - 100});
	CHECK_RC(sel_slot_layout_init(&l, &b.g), -EOVERFLOW);

	/* The share overflows. */
	memset(&b, 0, sizeof(b));
	geo_rank(&b, 0, 100, 2, (uint64_t[]){1ull << 63, 1ull << 63});
	CHECK_RC(sel_slot_layout_init(&l, &b.g), -EOVERFLOW);

	/* The slot (sum over ranks) overflows. */
	memset(&b, 0, sizeof(b));
	geo_rank(&b, 0, 100, 1, (uint64_t[]){1ull << 63});
	geo_rank(&b, 1, 100, 1, (uint64_t[]){1ull << 63});
	CHECK_RC(sel_slot_layout_init(&l, &b.g), -EOVERFLOW);
	CHECK(l.share == NULL);

	/* A row needing more than UINT32_MAX slots. */
	memset(&b, 0, sizeof(b));
	geo_rank(&b, 0, 1ull << 50, 1, (uint64_t[]){4096});
	CHECK_RC(sel_slot_layout_init(&l, &b.g), -EOVERFLOW);

	/* A rank with a huge share whose row ends in piece 0, beside a rank
	 * that needs 1000 pieces: later pieces are empty, with no overflow. */
	memset(&b, 0, sizeof(b));
	geo_rank(&b, 0, 1, 1, (uint64_t[]){1ull << 40});
	geo_rank(&b, 1, 1000ull * 4096, 1, (uint64_t[]){4096});
	CHECK_OK(sel_slot_layout_init(&l, &b.g));
	CHECK(l.row_slots == 1000);
	uint64_t off, len;
	sel_slot_layout_row_piece(&l, 0, 999, &off, &len);
	CHECK(len == 0);
	sel_slot_layout_row_piece(&l, 1, 999, &off, &len);
	CHECK(off == 1ull << 40 && len == 4096);
	sel_slot_layout_free(&l);
}

/* ---- pool basics ------------------------------------------------------------ */

static void fill_check(sel_slab_pool *p)
{
	CHECK_OK(sel_slab_check(p));
	CHECK(sel_slab_free_count(p) + sel_slab_in_use(p) == sel_slab_total(p));
}

static void test_create_errors(void)
{
	sel_slab_pool *p = (sel_slab_pool *)1;
	CHECK_RC(sel_slab_create(0, 1, 1, false, NULL, &p), -EINVAL);
	CHECK(p == NULL);
	CHECK_RC(sel_slab_create(4097, 1, 1, false, NULL, &p), -EINVAL);
	CHECK(strstr(sel_errmsg(), "4097") != NULL);
	CHECK_RC(sel_slab_create(4096, 0, 0, false, NULL, &p), -EINVAL);
	CHECK_RC(sel_slab_create(4096, UINT32_MAX, 1, false, NULL, &p), -EOVERFLOW);
	CHECK_RC(sel_slab_create(4096, UINT64_MAX, 1, false, NULL, &p), -EOVERFLOW);
	CHECK_RC(sel_slab_create(1ull << 62, 2, 2, false, NULL, &p), -EOVERFLOW);
	CHECK_RC(sel_slab_create(1ull << 52, 1u << 12, 0, false, NULL, &p), -EOVERFLOW);
	CHECK(p == NULL);
	sel_slab_destroy(NULL);
}

static void test_alignment(void)
{
	for (int populate = 0; populate < 2; populate++) {
		sel_slab_pool *p;
		uint64_t sb = 12 * KiB;
		CHECK_OK(sel_slab_create(sb, 37, 11, populate, NULL, &p));
		CHECK(sel_slab_total(p) == 48 && sel_slab_intake(p) == 11);
		CHECK(sel_slab_slot_bytes(p) == sb);
		CHECK(sel_slab_free_count(p) == 48 && sel_slab_in_use(p) == 0);
		uint8_t *base = sel_slab_base(p);
		CHECK(((uintptr_t)base & 4095) == 0);
		for (uint32_t s = 0; s < 48; s++) {
			uint8_t *a = sel_slab_addr(p, s);
			CHECK(((uintptr_t)a & 4095) == 0);
			CHECK(a == base + s * sb);
			a[0] = (uint8_t)s;
			a[sb - 1] = (uint8_t)~s;
		}
		for (uint32_t s = 0; s < 48; s++) {
			uint8_t *a = sel_slab_addr(p, s);
			CHECK(a[0] == (uint8_t)s && a[sb - 1] == (uint8_t)~s);
		}
		fill_check(p);
		sel_slab_destroy(p);
	}
}

static void test_exhaustion(void)
{
	sel_slab_pool *p;
	uint32_t got[32], more[32];
	CHECK_OK(sel_slab_create(4096, 10, 4, false, NULL, &p));

	/* All-or-nothing: 11 warm slots never fit, and nothing moves. */
	CHECK(!sel_slab_can_alloc(p, 11, SEL_SLAB_WARM));
	memset(more, 0xee, sizeof(more));
	CHECK_RC(sel_slab_alloc(p, 11, SEL_SLAB_WARM, more), -ENOSPC);
	CHECK(strlen(sel_errmsg()) > 0);
	CHECK(more[0] == 0xeeeeeeeeu);
	CHECK(sel_slab_free_count(p) == 14);
	fill_check(p);

	/* Warm stops at the reserve. */
	CHECK(sel_slab_can_alloc(p, 10, SEL_SLAB_WARM));
	CHECK_OK(sel_slab_alloc(p, 10, SEL_SLAB_WARM, got));
	fill_check(p);
	CHECK(sel_slab_free_count(p) == 4);
	CHECK(!sel_slab_can_alloc(p, 1, SEL_SLAB_WARM));
	CHECK_RC(sel_slab_alloc(p, 1, SEL_SLAB_WARM, more), -ENOSPC);
	CHECK(sel_slab_free_count(p) == 4 && sel_slab_in_use(p) == 10);
	CHECK_OK(sel_slab_alloc(p, 0, SEL_SLAB_WARM, more)); /* n = 0 always fits */

	/* Intake can use the rest, all or nothing. */
	CHECK(!sel_slab_can_alloc(p, 5, SEL_SLAB_INTAKE));
	CHECK_RC(sel_slab_alloc(p, 5, SEL_SLAB_INTAKE, more), -ENOSPC);
	CHECK(sel_slab_free_count(p) == 4);
	fill_check(p);
	CHECK(sel_slab_can_alloc(p, 4, SEL_SLAB_INTAKE));
	CHECK_OK(sel_slab_alloc(p, 4, SEL_SLAB_INTAKE, got + 10));
	CHECK(sel_slab_free_count(p) == 0 && sel_slab_in_use(p) == 14);
	CHECK_RC(sel_slab_alloc(p, 1, SEL_SLAB_INTAKE, more), -ENOSPC);
	fill_check(p);

	/* Every slot handed out once. */
	bool seen[14] = {false};
	for (int i = 0; i < 14; i++) {
		CHECK(got[i] < 14 && !seen[got[i]]);
		seen[got[i]] = true;
	}

	/* Intake slots taken first shrink what warm may take. */
	CHECK_OK(sel_slab_free(p, got, 14));
	CHECK_OK(sel_slab_alloc(p, 3, SEL_SLAB_INTAKE, got));
	CHECK(sel_slab_can_alloc(p, 7, SEL_SLAB_WARM) && !sel_slab_can_alloc(p, 8, SEL_SLAB_WARM));
	CHECK_OK(sel_slab_alloc(p, 7, SEL_SLAB_WARM, got + 3));
	CHECK(sel_slab_free_count(p) == 4);
	CHECK_OK(sel_slab_free(p, got, 10));
	CHECK(sel_slab_free_count(p) == 14);
	fill_check(p);
	sel_slab_destroy(p);

	/* No intake at all: warm may take everything. */
	CHECK_OK(sel_slab_create(4096, 3, 0, false, NULL, &p));
	CHECK_OK(sel_slab_alloc(p, 3, SEL_SLAB_WARM, got));
	CHECK_RC(sel_slab_alloc(p, 1, SEL_SLAB_INTAKE, got), -ENOSPC);
	sel_slab_destroy(p);
}

static void test_reuse(void)
{
	sel_slab_pool *p;
	uint32_t a[5], b[5];
	CHECK_OK(sel_slab_create(8192, 20, 8, false, NULL, &p));
	CHECK_OK(sel_slab_alloc(p, 5, SEL_SLAB_WARM, a));
	CHECK_OK(sel_slab_free(p, a, 5));
	CHECK_OK(sel_slab_alloc(p, 5, SEL_SLAB_WARM, b));
	/* The same five come back (as a set). */
	for (int i = 0; i < 5; i++) {
		bool found = false;
		for (int j = 0; j < 5; j++)
			found |= a[i] == b[j];
		CHECK(found);
	}
	/* Fill the pool completely, empty it, fill it again. */
	uint32_t all[28];
	CHECK_OK(sel_slab_free(p, b, 5));
	for (int round = 0; round < 3; round++) {
		CHECK_OK(sel_slab_alloc(p, 20, SEL_SLAB_WARM, all));
		CHECK_OK(sel_slab_alloc(p, 8, SEL_SLAB_INTAKE, all + 20));
		CHECK(sel_slab_free_count(p) == 0);
		fill_check(p);
		CHECK_OK(sel_slab_free(p, all, 28));
		CHECK(sel_slab_free_count(p) == 28);
		fill_check(p);
	}
	sel_slab_destroy(p);
}

/* sel_slab_warm reads exactly what the next allocation of n takes (the
 * stack's top n and their positions) and changes nothing; n beyond the
 * free count reads only what is free. */
static void test_warm(void)
{
	sel_slab_pool *p;
	uint32_t a[7], b[5];
	CHECK_OK(sel_slab_create(8192, 20, 8, false, NULL, &p));
	CHECK_OK(sel_slab_alloc(p, 7, SEL_SLAB_WARM, a));
	CHECK_OK(sel_slab_free(p, a + 2, 3)); /* the stack's top is no longer in id order */
	uint64_t f = sel_slab_free_count(p);
	uint32_t w = sel_slab_warm(p, 5);
	CHECK(sel_slab_free_count(p) == f);
	CHECK_OK(sel_slab_check(p));
	CHECK(sel_slab_warm(p, 5) == w); /* nothing moved */
	CHECK_OK(sel_slab_alloc(p, 5, SEL_SLAB_WARM, b));
	uint32_t want = 0;
	for (uint32_t i = 0; i < 5; i++)
		want += b[i] + (uint32_t)(f - 1 - i);
	CHECK(w == want);
	CHECK_OK(sel_slab_free(p, b, 5));
	/* More than is free: only the free part, and still nothing moved. */
	uint32_t all[28];
	uint64_t left = sel_slab_free_count(p);
	CHECK_OK(sel_slab_alloc(p, (uint32_t)left, SEL_SLAB_INTAKE, all));
	CHECK(sel_slab_warm(p, 1000) == 0);
	CHECK_OK(sel_slab_free(p, all, (uint32_t)left));
	(void)sel_slab_warm(p, 1000);
	CHECK(sel_slab_free_count(p) == left);
	CHECK_OK(sel_slab_check(p));
	CHECK_OK(sel_slab_free(p, a, 2));
	CHECK_OK(sel_slab_free(p, a + 5, 2));
	CHECK(sel_slab_free_count(p) == 28);
	sel_slab_destroy(p);
}

/* Staging: take intake slots for a window, use them, release them; nothing
 * is retained, so the counts return to where they started. */
static void test_staging_release(void)
{
	sel_slab_pool *p;
	uint32_t warm[6], win[SEL_WINDOW_PAGES];
	CHECK_OK(sel_slab_create(4096, 16, SEL_WINDOW_PAGES, false, NULL, &p));
	CHECK_OK(sel_slab_alloc(p, 6, SEL_SLAB_WARM, warm));
	uint64_t free0 = sel_slab_free_count(p), used0 = sel_slab_in_use(p);
	for (uint32_t round = 1; round <= 50; round++) {
		uint32_t n = round % 7 == 0 ? SEL_WINDOW_PAGES : 1 + round % SEL_WINDOW_PAGES;
		if (n > free0)
			n = (uint32_t)free0;
		CHECK_OK(sel_slab_alloc(p, n, SEL_SLAB_INTAKE, win));
		for (uint32_t i = 0; i < n; i++)
			memset(sel_slab_addr(p, win[i]), (int)round, 4096);
		fill_check(p);
		CHECK_OK(sel_slab_free(p, win, n));
		CHECK(sel_slab_free_count(p) == free0 && sel_slab_in_use(p) == used0);
		fill_check(p);
	}
	CHECK_OK(sel_slab_free(p, warm, 6));
	CHECK(sel_slab_in_use(p) == 0);
	sel_slab_destroy(p);
}

/* ---- multi-slot rows ----------------------------------------------------------- */

static uint8_t pattern(uint32_t rank, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 56);
	return (uint8_t)(x >> 29) ^ (uint8_t)rank;
}

static void test_multi_piece_rows(void)
{
	struct geo_builder b = {0};
	/* Three ranks, three share sizes, rows of 3-9 pieces. */
	geo_rank(&b, 0, 70000, 2, (uint64_t[]){8192, 100});         /* share 12 KiB, 6 pieces */
	geo_rank(&b, 1, 9 * 4096 - 1, 1, (uint64_t[]){4096});       /* share 4 KiB, 9 pieces */
	geo_rank(&b, 2, 3 * 20480, 3, (uint64_t[]){8192, 8192, 1}); /* share 20 KiB, 3 pieces */
	sel_slot_layout l;
	CHECK_OK(sel_slot_layout_init(&l, &b.g));
	CHECK(l.row_slots == 9);
	CHECK(l.slot_bytes == 36 * KiB);

	sel_slab_pool *p;
	CHECK_OK(sel_slab_create(l.slot_bytes, 24, 2 * (SEL_WINDOW_PAGES + l.row_slots), false,
				 NULL, &p));
	/* Interleave allocations so the row's slots are not adjacent. */
	uint32_t a[18], row[9], keep[9];
	CHECK_OK(sel_slab_alloc(p, 18, SEL_SLAB_WARM, a));
	for (int i = 0; i < 9; i++) {
		row[i] = a[2 * i + 1];
		keep[i] = a[2 * i];
	}
	CHECK_OK(sel_slab_free(p, row, 9));
	CHECK_OK(sel_slab_alloc(p, 9, SEL_SLAB_INTAKE, row));
	bool adjacent = true;
	for (int i = 1; i < 9; i++)
		adjacent &= row[i] == row[i - 1] + 1;
	CHECK(!adjacent);

	const uint8_t poison = 0xa5;
	for (uint32_t i = 0; i < l.row_slots; i++)
		memset(sel_slab_addr(p, row[i]), poison, l.slot_bytes);
	/* Write each rank's row into its pieces. */
	for (uint32_t r = 0; r < l.ranks; r++) {
		uint64_t pos = 0;
		for (uint32_t i = 0; i < l.row_slots; i++) {
			uint64_t off, len;
			sel_slot_layout_row_piece(&l, r, i, &off, &len);
			CHECK(off == l.share_off[r]);
			CHECK(len <= l.share[r]);
			uint8_t *d = (uint8_t *)sel_slab_addr(p, row[i]) + off;
			for (uint64_t k = 0; k < len; k++)
				d[k] = pattern(r, pos + k);
			pos += len;
		}
		CHECK(pos == l.row_bytes[r]);
	}
	/* Read back by walking pieces in rank order into one buffer per rank. */
	for (uint32_t r = 0; r < l.ranks; r++) {
		uint8_t *buf = malloc(l.row_bytes[r]), *want = malloc(l.row_bytes[r]);
		CHECK(buf && want);
		uint64_t pos = 0;
		for (uint32_t i = 0; i < l.row_slots; i++) {
			uint64_t off, len;
			sel_slot_layout_row_piece(&l, r, i, &off, &len);
			if (len == 0)
				continue;
			memcpy(buf + pos, (uint8_t *)sel_slab_addr(p, row[i]) + off, len);
			pos += len;
		}
		CHECK(pos == l.row_bytes[r]);
		for (uint64_t k = 0; k < l.row_bytes[r]; k++)
			want[k] = pattern(r, k);
		CHECKF(memcmp(buf, want, l.row_bytes[r]) == 0, "rank %u row differs", r);
		free(buf);
		free(want);
	}
	/* No piece strayed outside its rank's share: everything else is poison. */
	for (uint32_t i = 0; i < l.row_slots; i++) {
		const uint8_t *s = sel_slab_addr(p, row[i]);
		for (uint64_t k = 0; k < l.slot_bytes; k++) {
			bool inside = false;
			for (uint32_t r = 0; r < l.ranks; r++) {
				uint64_t off, len;
				sel_slot_layout_row_piece(&l, r, i, &off, &len);
				inside |= k >= off && k < off + len;
			}
			if (!inside)
				CHECKF(s[k] == poison, "slot %u byte %" PRIu64 " overwritten", i,
				       k);
		}
	}
	CHECK_OK(sel_slab_free(p, row, 9));
	CHECK_OK(sel_slab_free(p, keep, 9));
	CHECK(sel_slab_in_use(p) == 0);
	fill_check(p);
	sel_slab_destroy(p);
	sel_slot_layout_free(&l);
}

/* ---- intake sizing ---------------------------------------------------------------- */

static void test_intake_slots(void)
{
	uint64_t slots = 0;
	char warn[512], want[64];
	const uint64_t sb = MiB;
	/* full = 2 * 8 * 23 + 128 = 496; floor = 2 * (64 + 23) = 174 */

	memset(warn, 'x', sizeof(warn));
	CHECK_OK(sel_intake_slots(8, 23, sb, UINT64_MAX, &slots, warn, sizeof(warn)));
	CHECK(slots == 496 && warn[0] == '\0');
	CHECK_OK(sel_intake_slots(8, 23, sb, 496 * sb, &slots, warn, sizeof(warn)));
	CHECK(slots == 496 && warn[0] == '\0');
	CHECK_OK(sel_intake_slots(8, 23, sb, 496 * sb, &slots, NULL, 0));
	CHECK(slots == 496);
	CHECK_OK(sel_intake_slots(1, 1, 4096, UINT64_MAX, &slots, warn, sizeof(warn)));
	CHECK(slots == 2 + 128);

	/* Shrunk: the largest count that fits, with one warning naming what
	 * full intake needs and what is used. */
	CHECK_OK(sel_intake_slots(8, 23, sb, 496 * sb - 1, &slots, warn, sizeof(warn)));
	CHECK(slots == 495);
	CHECK_OK(sel_intake_slots(8, 23, sb, 300 * sb + 5, &slots, warn, sizeof(warn)));
	CHECK(slots == 300);
	printf("warning: %s\n", warn);
	CHECK(strstr(warn, "full intake") != NULL);
	CHECKF(strstr(warn, eos_format_size(496 * sb, want, sizeof(want))) != NULL, "%s", warn);
	CHECKF(strstr(warn, eos_format_size(300 * sb, want, sizeof(want))) != NULL, "%s", warn);
	CHECK(strstr(warn, "300 slots") != NULL);
	CHECK(strchr(warn, '\n') == NULL);
	/* A short buffer is cut, not overrun. */
	char tiny[8];
	memset(tiny, 'x', sizeof(tiny));
	CHECK_OK(sel_intake_slots(8, 23, sb, 300 * sb, &slots, tiny, sizeof(tiny)));
	CHECK(tiny[7] == '\0' && strlen(tiny) == 7);

	/* Exactly the floor still works; one byte less fails. */
	CHECK_OK(sel_intake_slots(8, 23, sb, 174 * sb, &slots, warn, sizeof(warn)));
	CHECK(slots == 174 && warn[0] != '\0');
	slots = 12345;
	CHECK_RC(sel_intake_slots(8, 23, sb, 174 * sb - 1, &slots, warn, sizeof(warn)), -ENOMEM);
	CHECK(slots == 12345);
	CHECK(strstr(sel_errmsg(), "174") != NULL);
	CHECK_RC(sel_intake_slots(8, 23, sb, 0, &slots, NULL, 0), -ENOMEM);

	/* Argument errors name the bad value. */
	CHECK_RC(sel_intake_slots(0, 23, sb, UINT64_MAX, &slots, warn, sizeof(warn)), -EINVAL);
	CHECK(strstr(sel_errmsg(), "max_active 0") != NULL);
	CHECK_RC(sel_intake_slots(8, 0, sb, UINT64_MAX, &slots, warn, sizeof(warn)), -EINVAL);
	CHECK(strstr(sel_errmsg(), "row_slots 0") != NULL);
	CHECK_RC(sel_intake_slots(8, 23, 0, UINT64_MAX, &slots, warn, sizeof(warn)), -EINVAL);
	CHECK_RC(sel_intake_slots(8, 23, 5000, UINT64_MAX, &slots, warn, sizeof(warn)), -EINVAL);
	CHECK(strstr(sel_errmsg(), "5000") != NULL);
	CHECK(slots == 12345);

	/* Huge counts: full intake's bytes overflow. */
	CHECK_RC(sel_intake_slots(UINT32_MAX, UINT32_MAX, 4096, UINT64_MAX, &slots, warn,
				  sizeof(warn)),
		 -EOVERFLOW);
	CHECK_RC(
		sel_intake_slots(UINT32_MAX, 1, 1ull << 40, UINT64_MAX, &slots, warn, sizeof(warn)),
		-EOVERFLOW);
	CHECK_OK(sel_intake_slots(UINT32_MAX, 1, 1ull << 40, 1ull << 60, &slots, warn,
				  sizeof(warn)));
	CHECK(slots == 1u << 20 && warn[0] != '\0');
	CHECK_RC(sel_intake_slots(UINT32_MAX, UINT32_MAX, 4096, 1ull << 40, &slots, warn,
				  sizeof(warn)),
		 -ENOMEM);
}

/* ---- hooks ---------------------------------------------------------------------------- */

struct hook_log {
	int reg, unreg;
	void *reg_addr, *unreg_addr;
	uint64_t reg_len, unreg_len;
	int fail_with;
};

static int hook_reg(void *ctx, void *addr, uint64_t len)
{
	struct hook_log *h = ctx;
	h->reg++;
	h->reg_addr = addr;
	h->reg_len = len;
	if (h->fail_with)
		return eos_fail(h->fail_with, "test: refusing registration");
	return 0;
}

static void hook_unreg(void *ctx, void *addr, uint64_t len)
{
	struct hook_log *h = ctx;
	h->unreg++;
	h->unreg_addr = addr;
	h->unreg_len = len;
}

static void test_hooks(void)
{
	struct hook_log log = {0};
	struct sel_slab_hooks hooks = {hook_reg, hook_unreg, &log};
	sel_slab_pool *p;
	uint32_t s[3];

	CHECK_OK(sel_slab_create(16 * KiB, 5, 3, false, &hooks, &p));
	hooks.reg = NULL; /* the pool keeps its own copy */
	CHECK(log.reg == 1 && log.unreg == 0);
	CHECK(log.reg_addr == sel_slab_base(p) && log.reg_len == 8 * 16 * KiB);
	CHECK_OK(sel_slab_alloc(p, 3, SEL_SLAB_INTAKE, s));
	CHECK_OK(sel_slab_free(p, s, 3));
	CHECK(log.reg == 1 && log.unreg == 0);
	void *base = sel_slab_base(p);
	sel_slab_destroy(p);
	CHECK(log.reg == 1 && log.unreg == 1);
	CHECK(log.unreg_addr == base && log.unreg_len == 8 * 16 * KiB);

	/* A failing registration fails create, unmaps, and never unregisters. */
	memset(&log, 0, sizeof(log));
	hooks.reg = hook_reg;
	log.fail_with = -EFAULT;
	p = (sel_slab_pool *)1;
	CHECK_RC(sel_slab_create(4096, 2, 2, false, &hooks, &p), -EFAULT);
	CHECK(p == NULL);
	CHECK(strstr(sel_errmsg(), "refusing registration") != NULL);
	CHECK(log.reg == 1 && log.unreg == 0);

	/* Partial and absent tables: host backend. */
	struct sel_slab_hooks only_unreg = {NULL, hook_unreg, &log};
	memset(&log, 0, sizeof(log));
	CHECK_OK(sel_slab_create(4096, 2, 2, false, &only_unreg, &p));
	sel_slab_destroy(p);
	CHECK(log.unreg == 0); /* never registered, so never unregistered */
	CHECK_OK(sel_slab_create(4096, 2, 2, false, NULL, &p));
	sel_slab_destroy(p);
}

/* A refused mmap leaves nothing behind (not under sanitizers, whose shadow
 * memory does not mix with RLIMIT_AS). */
/* A free list over someone else's range (design 2.5 split pools): slot
 * addresses count from the given base, nothing is mapped or written, and
 * destroy leaves the range alone. */
static void test_create_over(void)
{
	const uint64_t sb = 8 * KiB;
	uint8_t *range = eos_aligned_alloc(64 * KiB, 10 * sb);
	sel_slab_pool *p;
	uint32_t s[10];
	CHECK(range);
	memset(range, 0x77, 10 * sb);
	CHECK_OK(sel_slab_create_over(range, sb, 6, 4, &p));
	CHECK(!sel_slab_owns_memory(p));
	CHECK(sel_slab_base(p) == range && sel_slab_total(p) == 10 && sel_slab_intake(p) == 4);
	CHECK(sel_slab_addr(p, 7) == range + 7 * sb);
	CHECK_RC(sel_slab_alloc(p, 7, SEL_SLAB_WARM, s), -ENOSPC);
	CHECK_OK(sel_slab_alloc(p, 6, SEL_SLAB_WARM, s));
	CHECK_OK(sel_slab_alloc(p, 4, SEL_SLAB_INTAKE, s + 6));
	CHECK(sel_slab_free_count(p) == 0 && sel_slab_in_use(p) == 10);
	CHECK_OK(sel_slab_check(p));
	CHECK_OK(sel_slab_free(p, s, 10));
	CHECK_OK(sel_slab_check(p));
	sel_slab_destroy(p);
	for (uint64_t i = 0; i < 10 * sb; i++)
		CHECK(range[i] == 0x77);
	range[0] = 1; /* still ours */

	/* A real mapping owns its memory. */
	CHECK_OK(sel_slab_create(sb, 1, 1, false, NULL, &p));
	CHECK(sel_slab_owns_memory(p));
	sel_slab_destroy(p);

	p = (sel_slab_pool *)1;
	CHECK_RC(sel_slab_create_over(NULL, sb, 1, 1, &p), -EINVAL);
	CHECK(p == NULL);
	CHECK_RC(sel_slab_create_over(range + 512, sb, 1, 1, &p), -EINVAL);
	CHECK(strstr(sel_errmsg(), "not 4 KiB aligned"));
	CHECK_RC(sel_slab_create_over(range, 1000, 1, 1, &p), -EINVAL);
	CHECK_RC(sel_slab_create_over(range, sb, 0, 0, &p), -EINVAL);
	CHECK_RC(sel_slab_create_over((void *)(uintptr_t)(UINTPTR_MAX & ~(uintptr_t)4095), sb, 2, 0,
				      &p),
		 -EOVERFLOW);
	CHECK(p == NULL);
	eos_aligned_free(range);
}

static void test_map_failure(void)
{
#ifndef SEL_SANITIZED
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct rlimit rl = {512 * MiB, 512 * MiB};
		if (setrlimit(RLIMIT_AS, &rl) != 0)
			_exit(2);
		struct hook_log log = {0};
		struct sel_slab_hooks hooks = {hook_reg, hook_unreg, &log};
		sel_slab_pool *p = NULL;
		int rc = sel_slab_create(MiB, 1024, 64, false, &hooks, &p);
		if (rc != -ENOMEM || p || log.reg || log.unreg ||
		    !strstr(sel_errmsg(), "cannot map")) {
			fprintf(stderr, "map failure: rc %d, reg %d: %s\n", rc, log.reg,
				sel_errmsg());
			_exit(1);
		}
		_exit(0);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
#endif
}

/* ---- refused frees ------------------------------------------------------------------ */

static void test_bad_free(void)
{
#ifdef SEL_DEBUG_CHECKS
	/* This build aborts at the first refused free (test_debug_checks
	 * shows it); what follows is the behaviour of the others. */
	printf("  refused frees: abort under SEL_DEBUG_CHECKS (test_debug_checks)\n");
	return;
#endif
	sel_slab_pool *p;
	uint32_t s[4];

	/* Double free. */
	CHECK_OK(sel_slab_create(4096, 6, 2, false, NULL, &p));
	CHECK_OK(sel_slab_alloc(p, 4, SEL_SLAB_WARM, s));
	CHECK_OK(sel_slab_free(p, s, 1));
	CHECK(sel_slab_free_count(p) == 5);
	CHECK_RC(sel_slab_free(p, s, 1), -EINVAL);
	CHECK(strstr(sel_errmsg(), "already free") != NULL);
	CHECK(sel_slab_free_count(p) == 5 && sel_slab_in_use(p) == 3);
	CHECK_RC(sel_slab_check(p), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "refused") != NULL);
	/* The pool itself still works and never hands out a slot twice. */
	uint32_t t[5];
	CHECK_OK(sel_slab_alloc(p, 5, SEL_SLAB_INTAKE, t));
	for (int i = 0; i < 5; i++)
		for (int j = 1; j < 4; j++)
			CHECK(t[i] != s[j]);
	CHECK_RC(sel_slab_alloc(p, 1, SEL_SLAB_INTAKE, t), -ENOSPC);
	sel_slab_destroy(p);

	/* A batch with a bad entry frees nothing, whatever its position. */
	CHECK_OK(sel_slab_create(4096, 6, 2, false, NULL, &p));
	CHECK_OK(sel_slab_alloc(p, 4, SEL_SLAB_WARM, s));
	uint32_t dup[3] = {s[0], s[1], s[0]};
	CHECK_RC(sel_slab_free(p, dup, 3), -EINVAL);
	CHECK(strstr(sel_errmsg(), "twice") != NULL);
	CHECK(sel_slab_free_count(p) == 4 && sel_slab_in_use(p) == 4);
	uint32_t out_of_range[2] = {s[2], 8};
	CHECK_RC(sel_slab_free(p, out_of_range, 2), -EINVAL);
	CHECK(strstr(sel_errmsg(), "out of range") != NULL);
	CHECK(sel_slab_free_count(p) == 4);
	uint32_t free_one;
	CHECK_OK(sel_slab_alloc(p, 1, SEL_SLAB_INTAKE, &free_one));
	CHECK_OK(sel_slab_free(p, &free_one, 1));
	uint32_t mixed[2] = {s[3], free_one};
	CHECK_RC(sel_slab_free(p, mixed, 2), -EINVAL);
	CHECK(sel_slab_free_count(p) == 4);
	CHECK_RC(sel_slab_check(p), SEL_ECORRUPT);
	/* The refused batches left their valid slots allocated: freeing them
	 * properly now works and the pool drains exactly. */
	CHECK_OK(sel_slab_free(p, s, 4));
	CHECK(sel_slab_free_count(p) == 8 && sel_slab_in_use(p) == 0);
	sel_slab_destroy(p);
}

/* ---- randomised run against a model ------------------------------------------------- */

static void test_random(void)
{
	test_rng rng;
	test_rng_init(&rng, test_seed());
	const uint32_t warm = 200, intake = 50, total = warm + intake;
	const uint64_t sb = 4096;
	sel_slab_pool *p;
	CHECK_OK(sel_slab_create(sb, warm, intake, false, NULL, &p));

	bool used[250] = {false};
	uint32_t held[250], nheld = 0, nfree = total;
	uint32_t buf[32];
	const int ops = 100000;
	for (int op = 0; op < ops; op++) {
		if (test_rng_below(&rng, 2) == 0) {
			enum sel_slab_class cls =
				test_rng_below(&rng, 2) ? SEL_SLAB_INTAKE : SEL_SLAB_WARM;
			uint32_t n = (uint32_t)test_rng_below(&rng, 33);
			uint32_t room = cls == SEL_SLAB_INTAKE
						? nfree
						: (nfree > intake ? nfree - intake : 0);
			bool fits = n <= room;
			CHECK(sel_slab_can_alloc(p, n, cls) == fits);
			int rc = sel_slab_alloc(p, n, cls, buf);
			CHECKF(rc == (fits ? 0 : -ENOSPC), "op %d: alloc %u cls %d rc %d", op, n,
			       cls, rc);
			if (rc == 0) {
				for (uint32_t i = 0; i < n; i++) {
					CHECK(buf[i] < total && !used[buf[i]]);
					used[buf[i]] = true;
					held[nheld++] = buf[i];
					/* Tag the slot with its owner. */
					uint64_t tag = buf[i] * 0x9e3779b97f4a7c15ull;
					memcpy(sel_slab_addr(p, buf[i]), &tag, 8);
				}
				nfree -= n;
			}
		} else {
			uint32_t n = (uint32_t)test_rng_below(&rng, (nheld < 32 ? nheld : 32) + 1);
			for (uint32_t i = 0; i < n; i++) {
				uint32_t k = (uint32_t)test_rng_below(&rng, nheld);
				buf[i] = held[k];
				held[k] = held[--nheld];
				uint64_t tag;
				memcpy(&tag, sel_slab_addr(p, buf[i]), 8);
				CHECK(tag == buf[i] * 0x9e3779b97f4a7c15ull);
				used[buf[i]] = false;
			}
			CHECK_OK(sel_slab_free(p, buf, n));
			nfree += n;
		}
		CHECKF(sel_slab_check(p) == 0, "op %d: %s", op, sel_errmsg());
		CHECK(sel_slab_free_count(p) == nfree);
		CHECK(sel_slab_in_use(p) == total - nfree && nheld == total - nfree);
	}
	CHECK_OK(sel_slab_free(p, held, nheld));
	CHECK(sel_slab_free_count(p) == total);
	fill_check(p);
	sel_slab_destroy(p);
}

int main(void)
{
	test_layout_numbers();
	test_layout_errors();
	test_create_errors();
	test_alignment();
	test_exhaustion();
	test_reuse();
	test_warm();
	test_staging_release();
	test_multi_piece_rows();
	test_intake_slots();
	test_hooks();
	test_create_over();
	test_map_failure();
	test_bad_free();
	test_random();
	printf("ok\n");
	return 0;
}
