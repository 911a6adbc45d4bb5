/*
 * test_record.c - record files: format, names and the startup scan (design
 * 2.5 record files and recovery; implementation step 5).
 *
 * Covers: layouts and aligned plane offsets for every geometry (tiny
 * planes, 36 planes, TP2 uniform and not, TP4, big rank tables) agreeing
 * with the slot layout; spans; encode/decode round trips both ways, with
 * and without replication flags; every rejection rule of the decoder
 * (magic, version, flags, sizes, padding, offsets, header checksum, tail
 * rules) and namespace mismatches (SEL_EIDENTITY, SEL_ELAYOUT); a version-1
 * vector built byte by byte from docs/record-format.md and a version-2
 * known answer; names; row pieces and slot addresses; the shared
 * verification helpers (length, page and row checks) and a namespace rebuilt
 * from a header alone; the write protocol
 * (no temporary left, replacement keeps one file); row presence by size
 * and compaction; and the scan: temporaries, invalid files by reason,
 * orphans with their descendants, full-chain children kept, cascading
 * pruning, unknown names left alone, the access order with parents first,
 * dry runs, idempotence, the directory lock, and a randomised forest
 * checked against a naive model (with every removal reported to the
 * caller, deepest first, with its reason).
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xxh.h"

#include "internal.h"
#include "recutil.h"
#include "slab.h"

#define KiB 1024ull

static test_rng rng;

/* ---- layouts ------------------------------------------------------------- */

/* Layout numbers must equal the slot layout's, offsets must be aligned. */
static void check_layout(const sel_geometry *g)
{
	sel_record_layout l;
	sel_slot_layout sl;
	CHECK_OK(sel_record_layout_init(&l, g));
	CHECK_OK(sel_slot_layout_init(&sl, g));
	CHECK(l.ranks == g->ranks && l.sz.ranks == g->ranks);
	CHECK(l.sz.page_record == sl.slot_bytes);
	uint64_t rowseg = 0;
	for (uint32_t r = 0; r < g->ranks; r++) {
		CHECK(l.share[r] == sl.share[r]);
		CHECK(l.share_off[r] == sl.share_off[r]);
		CHECK(l.row_bytes[r] == sl.row_bytes[r]);
		CHECK(l.row_off[r] == rowseg && l.row_off[r] % 4096 == 0);
		rowseg += eos_round_up(l.row_bytes[r], 4096);
		for (uint32_t i = 0; i < l.n_planes[r]; i++) {
			CHECK(l.plane_off[r][i] == sl.plane_off[r][i]);
			CHECK(l.plane_off[r][i] % 4096 == 0);
			CHECK((l.share_off[r] + l.plane_off[r][i]) % 4096 == 0);
			CHECK(l.unit[r][i] == g->rank[r].pages[i].unit_bytes);
		}
	}
	CHECK(l.sz.row_segment == rowseg);
	CHECK(sel_record_row_slots(&l, 0) == sl.row_slots);
	CHECK(l.sz.header_bytes >= 4096 && l.sz.header_bytes % 4096 == 0);

	/* Every span of random records is aligned and ordered. */
	sel_record_ns ns;
	test_ns_init(&ns, g, 7);
	uint8_t *hdr = eos_aligned_alloc(4096, SEL_RECORD_HEADER_MAX);
	for (int k = 0; k < 50; k++) {
		uint32_t pt = g->page_tokens;
		uint64_t pc = 1 + test_rng_below(&rng, 5000);
		sel_key parent;
		test_key(&rng, pc, &parent);
		bool root = test_rng_below(&rng, 3) == 0, full = test_rng_below(&rng, 3) == 0;
		sel_record_desc d;
		test_desc(&rng, pt, pc + 1 + test_rng_below(&rng, 5000), root ? NULL : &parent,
			  full, &d);
		if (g->ranks > 1 && l.sz.uniform_planes && test_rng_below(&rng, 2))
			d.flags |= SEL_RECORD_PAGES_REPLICATED;
		if (g->ranks > 1 && l.sz.uniform_row && test_rng_below(&rng, 2))
			d.flags |= SEL_RECORD_ROW_REPLICATED;
		sel_record_span s;
		CHECK_OK(sel_record_span_of(&l.sz, &d, &s));
		CHECK(s.header_bytes == l.sz.header_bytes && s.cksum_off == s.header_bytes);
		CHECK(s.cksum_bytes == eos_round_up(8ull * d.tail, 4096));
		CHECK(s.page_off == s.cksum_off + s.cksum_bytes);
		CHECK(s.page_stride ==
		      ((d.flags & SEL_RECORD_PAGES_REPLICATED) ? l.share[0] : l.sz.page_record));
		CHECK(s.row_off == s.page_off + d.tail * s.page_stride);
		CHECK(s.row_end == s.row_off + s.row_bytes);
		CHECK(s.row_bytes == ((d.flags & SEL_RECORD_ROW_REPLICATED)
					      ? eos_round_up(l.row_bytes[0], 4096)
					      : l.sz.row_segment));
		CHECK(s.page_off % 4096 == 0 && s.row_off % 4096 == 0 && s.row_end % 4096 == 0);
		CHECK(s.page_stride % 4096 == 0);
		CHECK(s.row_ranks == ((d.flags & SEL_RECORD_ROW_REPLICATED) ? 1 : g->ranks));

		/* Round trip, both ways. */
		uint64_t ck = test_rng_next(&rng), t = test_rng_next(&rng);
		int hb = sel_record_encode(&ns, &d, ck, t, SEL_RECORD_VERSION, hdr,
					   SEL_RECORD_HEADER_MAX);
		CHECK(hb == (int)s.header_bytes);
		CHECK(sel_record_header_bytes(hdr, 4096) == hb);
		sel_record_header h;
		CHECK_OK(sel_record_decode(hdr, (size_t)hb, &ns, &h));
		CHECK(sel_key_eq(&h.d.key, &d.key) && sel_key_eq(&h.d.parent, &d.parent));
		CHECK(memcmp(h.d.bucket.b, d.bucket.b, 16) == 0 && h.d.tail == d.tail &&
		      h.d.flags == d.flags);
		CHECK(h.row_checksum == ck && h.created_ns == t && h.version == SEL_RECORD_VERSION);
		CHECK(h.ranks == g->ranks && h.page_tokens == pt);
		CHECK(memcmp(&h.span, &s, sizeof s) == 0);
		CHECK_OK(sel_record_header_matches(&h, &d, &s));
		uint8_t *again = eos_aligned_alloc(4096, (size_t)hb);
		CHECK(sel_record_encode(&ns, &h.d, h.row_checksum, h.created_ns, h.version, again,
					(size_t)hb) == hb);
		CHECK(memcmp(again, hdr, (size_t)hb) == 0);
		eos_aligned_free(again);
		/* A layout parsed back from the header equals the original. */
		sel_record_layout pl;
		CHECK_OK(sel_record_layout_parse(&pl, hdr, (size_t)hb));
		CHECK(pl.table_bytes == l.table_bytes &&
		      memcmp(pl.table, l.table, l.table_bytes) == 0);
		CHECK(pl.sz.page_record == l.sz.page_record &&
		      pl.sz.row_segment == l.sz.row_segment);
		sel_record_layout_free(&pl);
	}
	eos_aligned_free(hdr);
	sel_record_ns_free(&ns);
	sel_slot_layout_free(&sl);
	sel_record_layout_free(&l);
	sel_record_layout_free(&l); /* twice is fine */
}

static void test_layouts(void)
{
	struct test_geo t;

	/* Tiny planes: everything pads to 4 KiB. */
	test_geo_init(&t, 1, 64, 3, (uint64_t[]){1, 100, 4095}, 1);
	check_layout(&t.g);

	/* 36 planes (12 layers of key, value, selector), a big row. */
	uint64_t units[36];
	for (int i = 0; i < 36; i++)
		units[i] = i % 3 == 2 ? 2048 : 64 * KiB;
	test_geo_init(&t, 1, 256, 36, units, 3 * 1024 * KiB + 17);
	check_layout(&t.g);

	/* TP2, identical ranks: replication allowed. */
	test_geo_init(&t, 2, 64, 3, (uint64_t[]){4096, 100, 8192}, 10000);
	check_layout(&t.g);
	{
		sel_record_layout l;
		CHECK_OK(sel_record_layout_init(&l, &t.g));
		CHECK(l.sz.uniform_planes && l.sz.uniform_row);
		sel_record_layout_free(&l);
	}

	/* TP2, different ranks: no replication. */
	test_geo_rank(&t, 1, 2, (uint64_t[]){4096, 12288}, 9000);
	check_layout(&t.g);
	{
		sel_record_layout l;
		CHECK_OK(sel_record_layout_init(&l, &t.g));
		CHECK(!l.sz.uniform_planes && !l.sz.uniform_row);
		sel_record_desc d;
		test_desc(&rng, 64, 640, NULL, true, &d);
		d.flags = SEL_RECORD_PAGES_REPLICATED;
		sel_record_span s;
		CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
		d.flags = SEL_RECORD_ROW_REPLICATED;
		CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
		sel_record_layout_free(&l);
	}

	/* TP4 uniform planes, different rows: pages may replicate, rows not. */
	test_geo_init(&t, 4, 128, 4, (uint64_t[]){8192, 8192, 300, 70000}, 20000);
	test_geo_rank(&t, 3, 4, (uint64_t[]){8192, 8192, 300, 70000}, 20001);
	check_layout(&t.g);

	/* A rank table beyond 4 KiB: 4 ranks of 122 planes (v2 header grows). */
	uint64_t many[122];
	for (int i = 0; i < 122; i++)
		many[i] = 1000 + (uint64_t)i;
	struct test_geo *big = calloc(1, sizeof(*big));
	test_geo_init(big, 4, 64, 122, many, 5000);
	big->g.rank = big->rank;
	{
		sel_record_layout l;
		CHECK_OK(sel_record_layout_init(&l, &big->g));
		CHECK(l.sz.header_bytes == 8192);
		sel_record_layout_free(&l);
	}
	check_layout(&big->g);
	/* ... which version 1 cannot encode. */
	{
		sel_record_ns ns;
		test_ns_init(&ns, &big->g, 1);
		sel_record_desc d;
		test_desc(&rng, 64, 100, NULL, true, &d);
		uint8_t *b = eos_aligned_alloc(4096, 8192);
		CHECK_RC(sel_record_encode(&ns, &d, 0, 0, 1, b, 8192), SEL_EOVERSIZE);
		CHECK_RC(sel_record_encode(&ns, &d, 0, 0, 2, b, 4096), -EINVAL);
		CHECK_RC(sel_record_encode(&ns, &d, 0, 0, SEL_RECORD_VERSION + 1, b, 8192),
			 -EINVAL);
		eos_aligned_free(b);
		sel_record_ns_free(&ns);
	}
	free(big);

	/* Geometry errors. */
	{
		sel_record_layout l;
		test_geo_init(&t, 1, 64, 1, (uint64_t[]){0}, 10);
		CHECK_RC(sel_record_layout_init(&l, &t.g), SEL_EGEOMETRY);
		test_geo_init(&t, 1, 64, 1, (uint64_t[]){10}, 0);
		CHECK_RC(sel_record_layout_init(&l, &t.g), SEL_EGEOMETRY);
		test_geo_init(&t, 1, 100, 1, (uint64_t[]){10}, 10);
		CHECK_RC(sel_record_layout_init(&l, &t.g), SEL_EGEOMETRY);
		test_geo_init(&t, 1, 64, 0, NULL, 10);
		CHECK_RC(sel_record_layout_init(&l, &t.g), SEL_EGEOMETRY);
		CHECK(l.table == NULL && l.ranks == 0);
	}
}

/* ---- span rules ------------------------------------------------------------ */

static void test_span_rules(void)
{
	struct test_geo t;
	test_geo_init(&t, 1, 64, 1, (uint64_t[]){4096}, 100);
	sel_record_layout l;
	CHECK_OK(sel_record_layout_init(&l, &t.g));
	sel_record_span s;
	sel_record_desc d;
	sel_key p;
	test_key(&rng, 130, &p);

	test_desc(&rng, 64, 300, &p, false, &d); /* 300/64 - 130/64 = 4 - 2 */
	CHECK(d.tail == 2);
	CHECK_OK(sel_record_span_of(&l.sz, &d, &s));
	CHECK(sel_record_links_parent(&d, 64));
	d.tail = 4; /* the full chain: a root although the parent exists */
	CHECK_OK(sel_record_span_of(&l.sz, &d, &s));
	CHECK(!sel_record_links_parent(&d, 64));
	d.tail = 3;
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
	d.tail = 2;
	d.flags = 1;
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
	d.flags = SEL_RECORD_PAGES_REPLICATED; /* TP1 never replicates */
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
	d.flags = 0;

	/* A root holds its full chain. */
	test_desc(&rng, 64, 300, NULL, false, &d);
	CHECK(d.tail == 4);
	CHECK_OK(sel_record_span_of(&l.sz, &d, &s));
	d.tail = 3;
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
	/* Endpoints inside the parent's last page own no pages. */
	sel_key p2;
	test_key(&rng, 129, &p2);
	test_desc(&rng, 64, 150, &p2, false, &d);
	CHECK(d.tail == 0);
	CHECK_OK(sel_record_span_of(&l.sz, &d, &s));
	CHECK(s.cksum_bytes == 0 && s.page_off == 4096 && s.row_off == 4096 && s.row_end == 8192);
	/* Parent inside the first page: derived == full; it links. */
	sel_key p3;
	test_key(&rng, 10, &p3);
	test_desc(&rng, 64, 150, &p3, false, &d);
	CHECK(d.tail == 2 && sel_record_links_parent(&d, 64));
	/* Keys. */
	test_desc(&rng, 64, 300, &p, false, &d);
	d.key.consumed = 0;
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
	test_desc(&rng, 64, 130, &p, false, &d);
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT); /* parent not below */
	test_desc(&rng, 64, 300, &p, false, &d);
	d.parent.consumed = 0; /* a digest without tokens is not "none" */
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), SEL_EFORMAT);
	/* Huge tails overflow cleanly. */
	test_desc(&rng, 64, UINT64_MAX, NULL, false, &d);
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s),
		 SEL_EFORMAT); /* tail is u32: not the full chain */
	test_desc(&rng, 64, 64ull * UINT32_MAX, NULL, false, &d);
	CHECK(d.tail == UINT32_MAX);
	CHECK_OK(sel_record_span_of(&l.sz, &d, &s)); /* 2^32 * 8 KiB fits */
	sel_record_layout_free(&l);

	uint64_t huge[1] = {UINT64_MAX / 2};
	test_geo_init(&t, 1, 64, 1, huge, 100);
	CHECK_OK(sel_record_layout_init(&l, &t.g));
	test_desc(&rng, 64, 64 * 3, NULL, false, &d);
	CHECK_RC(sel_record_span_of(&l.sz, &d, &s), -EOVERFLOW);
	sel_record_layout_free(&l);
}

/* ---- decoder rejections ------------------------------------------------------ */

static void put32(uint8_t *b, size_t off, uint32_t v) { sel_put_u32(b + off, v); }

/* Re-seal a modified v2 header so the checksum passes and the structural
 * rule under test is what fails. */
static void reseal(uint8_t *b, size_t hb)
{
	memset(b + 176, 0, 8);
	uint64_t h = XXH3_64bits(b, hb);
	sel_put_u64(b + 176, h);
}

static void test_decode_rejects(void)
{
	struct test_geo t;
	test_geo_init(&t, 2, 64, 3, (uint64_t[]){4096, 100, 8192}, 10000);
	sel_record_ns ns, other_id, other_fp;
	test_ns_init(&ns, &t.g, 1);
	test_ns_init(&other_id, &t.g, 2);
	struct test_geo t2;
	test_geo_init(&t2, 2, 64, 3, (uint64_t[]){4096, 100, 8193}, 10000);
	test_ns_init(&other_fp, &t2.g, 1);

	sel_record_desc d;
	sel_key p;
	test_key(&rng, 100, &p);
	test_desc(&rng, 64, 1000, &p, false, &d);
	d.flags = SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED;
	uint8_t good[4096], b[4096];
	CHECK(sel_record_encode(&ns, &d, 42, 43, 2, good, sizeof good) == 4096);
	sel_record_header h;
	CHECK_OK(sel_record_decode(good, 4096, &ns, &h));
	CHECK_OK(sel_record_decode(good, 4096, NULL, &h));

	/* Namespace. */
	CHECK_RC(sel_record_decode(good, 4096, &other_id, &h), SEL_EIDENTITY);
	CHECK_RC(sel_record_decode(good, 4096, &other_fp, &h), SEL_ELAYOUT);
	/* Same fingerprint, different table (a crafted file): still refused. */
	{
		sel_record_ns twin;
		test_ns_init(&twin, &t2.g, 1);
		memcpy(twin.fingerprint, ns.fingerprint, 16);
		CHECK_RC(sel_record_decode(good, 4096, &twin, &h), SEL_ELAYOUT);
		sel_record_ns_free(&twin);
	}

	/* Every single-byte change is caught (checksum or structure). */
	for (size_t i = 0; i < 4096; i++) {
		memcpy(b, good, 4096);
		b[i] ^= (uint8_t)(1 + test_rng_below(&rng, 255));
		int rc = sel_record_decode(b, 4096, &ns, &h);
		CHECKF(rc != 0, "byte %zu changed and still decodes", i);
	}
	/* Short buffers. */
	for (size_t n = 0; n < 4096; n += 511)
		CHECK_RC(sel_record_decode(good, n, &ns, &h), SEL_EFORMAT);

	/* Structural rules, each re-sealed so only the rule fails. */
	struct {
		size_t off;
		uint32_t v;
		const char *what;
	} bad32[] = {
		{8, 0, "version 0"},       {8, 5, "version 5"},        {12, 1, "unknown flag"},
		{16, 0, "header size 0"},  {16, 8192, "header size"},  {16, 4097, "header size"},
		{20, 0, "0 ranks"},        {20, 3, "3 ranks"},         {20, 100000, "many ranks"},
		{24, 0, "page tokens 0"},  {24, 96, "page tokens 96"}, {28, 5, "tail"},
		{144, 12288, "page off"},  {152, 4096, "row off"},     {184, 1, "reserved"},
		{196, 1, "rank reserved"}, {192, 0, "0 planes"},       {192, 400, "many planes"},
		{200, 0, "row 0"},         {216, 0, "unit 0"},         {4092, 1, "padding"},
	};
	for (size_t k = 0; k < sizeof bad32 / sizeof bad32[0]; k++) {
		memcpy(b, good, 4096);
		put32(b, bad32[k].off, bad32[k].v);
		reseal(b, 4096);
		int rc = sel_record_decode(b, 4096, NULL, &h);
		CHECKF(rc == SEL_EFORMAT || rc == -EOVERFLOW, "%s: rc %d", bad32[k].what, rc);
	}
	memcpy(b, good, 8);
	memcpy(b, good, 4096);
	memcpy(b, "FLARECKQ", 8);
	reseal(b, 4096);
	CHECK_RC(sel_record_decode(b, 4096, NULL, &h), SEL_EFORMAT);
	/* Unpaddable unit sizes. */
	memcpy(b, good, 4096);
	sel_put_u64(b + 216, UINT64_MAX);
	reseal(b, 4096);
	CHECK_RC(sel_record_decode(b, 4096, NULL, &h), -EOVERFLOW);
	/* The header checksum itself. */
	memcpy(b, good, 4096);
	b[176] ^= 1;
	CHECK_RC(sel_record_decode(b, 4096, NULL, &h), SEL_ECORRUPT);
	/* Replication on a non-uniform table. */
	{
		struct test_geo t3;
		test_geo_init(&t3, 2, 64, 3, (uint64_t[]){4096, 100, 8192}, 10000);
		test_geo_rank(&t3, 1, 3, (uint64_t[]){4096, 100, 8192}, 10001);
		sel_record_ns ns3;
		test_ns_init(&ns3, &t3.g, 1);
		sel_record_desc d2 = d;
		d2.flags = SEL_RECORD_PAGES_REPLICATED;
		CHECK(sel_record_encode(&ns3, &d2, 0, 0, 2, b, 4096) == 4096);
		CHECK_OK(sel_record_decode(b, 4096, &ns3, &h));
		put32(b, 12, SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED);
		reseal(b, 4096);
		CHECK_RC(sel_record_decode(b, 4096, NULL, &h), SEL_EFORMAT);
		sel_record_ns_free(&ns3);
	}

	/* header_matches names the first differing field. */
	sel_record_desc m = d;
	CHECK_OK(sel_record_decode(good, 4096, &ns, &h));
	m.tail++;
	CHECK_RC(sel_record_header_matches(&h, &m, &h.span), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "tail") != NULL);
	m = d;
	m.bucket.b[3] ^= 1;
	CHECK_RC(sel_record_header_matches(&h, &m, &h.span), SEL_ECORRUPT);
	m = d;
	m.parent.digest.b[0] ^= 1;
	CHECK_RC(sel_record_header_matches(&h, &m, &h.span), SEL_ECORRUPT);
	m = d;
	m.flags = SEL_RECORD_PAGES_REPLICATED;
	CHECK_RC(sel_record_header_matches(&h, &m, &h.span), SEL_ECORRUPT);

	/* Version 3: the parent link check travels in the header, is covered
	 * by its checksum, is compared by header_matches, needs a parent, and
	 * versions 1 and 2 cannot carry it. */
	{
		sel_digest pb;
		for (int i = 0; i < SEL_DIGEST_BYTES; i++)
			pb.b[i] = (uint8_t)(0x30 + i);
		sel_record_desc d3 = d;
		d3.parent_check = sel_record_parent_check(&pb);
		CHECK(d3.parent_check == sel_get_u64(pb.b));
		uint8_t v3[4096];
		CHECK(sel_record_encode(&ns, &d3, 42, 43, 3, v3, sizeof v3) == 4096);
		CHECK(sel_get_u32(v3 + 8) == 3 && sel_get_u64(v3 + 184) == d3.parent_check);
		CHECK_OK(sel_record_decode(v3, 4096, &ns, &h));
		CHECK(h.version == 3 && h.d.parent_check == d3.parent_check);
		CHECK_OK(sel_record_header_matches(&h, &d3, &h.span));
		CHECK_RC(sel_record_header_matches(&h, &d, &h.span), SEL_ECORRUPT);
		CHECK(strstr(sel_errmsg(), "parent link check") != NULL);
		v3[184] ^= 1;
		CHECK_RC(sel_record_decode(v3, 4096, &ns, &h), SEL_ECORRUPT);
		CHECK_RC(sel_record_encode(&ns, &d3, 42, 43, 2, v3, sizeof v3), SEL_EFORMAT);
		sel_record_desc root;
		test_desc(&rng, 64, 1000, NULL, false, &root);
		root.parent_check = 5;
		CHECK_RC(sel_record_encode(&ns, &root, 0, 0, 3, v3, sizeof v3), SEL_EFORMAT);
		/* 0 means "not known": a digest starting with 8 zero bytes maps to 1. */
		memset(pb.b, 0, 8);
		CHECK(sel_record_parent_check(&pb) == 1);
	}

	sel_record_ns_free(&ns);
	sel_record_ns_free(&other_id);
	sel_record_ns_free(&other_fp);
}

/* ---- version 1 and known answers ----------------------------------------------- */

static void test_v1_vector(void)
{
	/* docs/record-format.md, "Version 1": one rank, planes 4096 and 100
	 * bytes, a 5000-byte row, 64-token pages; a root of 200 tokens. */
	struct test_geo t;
	test_geo_init(&t, 1, 64, 2, (uint64_t[]){4096, 100}, 5000);
	sel_record_ns ns;
	test_ns_init(&ns, &t.g, 0);
	sel_key key = {.consumed = 200};
	for (int i = 0; i < 16; i++)
		key.digest.b[i] = (uint8_t)(0xa0 + i);
	sel_digest bucket;
	for (int i = 0; i < 16; i++)
		bucket.b[i] = (uint8_t)(0x10 + i);

	uint8_t b[4096] = {0};
	memcpy(b, "FLARECKP", 8);
	sel_put_u32(b + 8, 1);  /* version */
	sel_put_u32(b + 12, 0); /* flags: none in v1 */
	sel_put_u32(b + 16, 0); /* v1: reserved, header is 4 KiB */
	sel_put_u32(b + 20, 1); /* ranks */
	sel_put_u32(b + 24, 64);
	sel_put_u32(b + 28, 3); /* tail = 200 / 64 */
	memcpy(b + 32, ns.identity, 32);
	memcpy(b + 64, ns.fingerprint, 16);
	sel_put_u64(b + 80, 200);
	memcpy(b + 88, key.digest.b, 16);
	/* parent: none (zero) at 104..128 */
	memcpy(b + 128, bucket.b, 16);
	sel_put_u64(b + 144, 8192);            /* 4096 header + 4096 checksums */
	sel_put_u64(b + 152, 8192 + 3 * 8192); /* 3 page records of 4096 + 4096 */
	sel_put_u64(b + 160, 0x0123456789abcdefull);
	sel_put_u64(b + 168, 1700000000000000000ull);
	/* 176: v1 reserved (no header checksum); 184: reserved */
	sel_put_u32(b + 192, 2); /* rank 0: 2 planes */
	sel_put_u32(b + 196, 0);
	sel_put_u64(b + 200, 5000); /* row bytes */
	sel_put_u64(b + 208, 4096);
	sel_put_u64(b + 216, 100);

	sel_record_header h;
	CHECK_OK(sel_record_decode(b, sizeof b, &ns, &h));
	CHECK(h.version == 1 && h.d.flags == 0 && h.header_checksum == 0);
	CHECK(sel_key_eq(&h.d.key, &key) && sel_key_is_none(&h.d.parent));
	CHECK(memcmp(h.d.bucket.b, bucket.b, 16) == 0 && h.d.tail == 3);
	CHECK(h.span.header_bytes == 4096 && h.span.page_off == 8192 && h.span.page_stride == 8192);
	CHECK(h.span.row_off == 32768 && h.span.row_end == 32768 + 8192);
	CHECK(h.row_checksum == 0x0123456789abcdefull && h.created_ns == 1700000000000000000ull);

	/* The encoder writes exactly these bytes for version 1. */
	uint8_t e[4096];
	sel_record_desc d = h.d;
	CHECK(sel_record_encode(&ns, &d, h.row_checksum, h.created_ns, 1, e, sizeof e) == 4096);
	CHECK(memcmp(e, b, 4096) == 0);
	/* v1 has no flags and no checksum. */
	d.flags = SEL_RECORD_PAGES_REPLICATED;
	CHECK_RC(sel_record_encode(&ns, &d, 0, 0, 1, e, sizeof e), SEL_EFORMAT);
	memcpy(e, b, 4096);
	sel_put_u32(e + 12, SEL_RECORD_PAGES_REPLICATED);
	CHECK_RC(sel_record_decode(e, 4096, NULL, &h), SEL_EFORMAT);
	memcpy(e, b, 4096);
	e[176] = 1;
	CHECK_RC(sel_record_decode(e, 4096, NULL, &h), SEL_EFORMAT);
	memcpy(e, b, 4096);
	sel_put_u32(e + 16, 4096);
	CHECK_RC(sel_record_decode(e, 4096, NULL, &h), SEL_EFORMAT);

	/* Version 2 of the same record: a known answer that pins the format
	 * (offsets, table, checksum rule). */
	CHECK(sel_record_decode(b, sizeof b, &ns, &h) == 0);
	d = h.d;
	CHECK(sel_record_encode(&ns, &d, h.row_checksum, h.created_ns, 2, e, sizeof e) == 4096);
	CHECK(sel_get_u32(e + 16) == 4096);
	uint64_t hc = sel_get_u64(e + 176);
	for (int i = 0; i < 4096; i++)
		if (i < 8 || i >= 24)
			CHECK(i >= 176 && i < 184 ? 1 : e[i] == b[i]);
	printf("v2 header checksum of the vector: %016llx\n", (unsigned long long)hc);
	CHECK(hc == 0xc69cc90f87d2a92dull);
	sel_record_ns_free(&ns);
}

/* ---- names ------------------------------------------------------------------ */

static void test_names(void)
{
	sel_key k = {.consumed = 0x1234};
	for (int i = 0; i < 16; i++)
		k.digest.b[i] = (uint8_t)(i * 17);
	char name[SEL_RECORD_NAME_MAX], tmp[SEL_RECORD_TMPNAME_MAX];
	sel_record_name(&k, name);
	CHECK(strcmp(name, "0000000000001234-00112233445566778899aabbccddeeff.ckpt") == 0);
	sel_key back;
	CHECK_OK(sel_record_name_parse(name, &back));
	CHECK(sel_key_eq(&back, &k));
	k.consumed = UINT64_MAX;
	sel_record_name(&k, name);
	CHECK_OK(sel_record_name_parse(name, &back));
	CHECK(back.consumed == UINT64_MAX);

	const char *bad[] = {
		"",
		"x.ckpt",
		"0000000000001234-00112233445566778899aabbccddeeff.ckp",
		"0000000000001234-00112233445566778899AABBCCDDEEFF.ckpt",
		"0000000000001234_00112233445566778899aabbccddeeff.ckpt",
		"0000000000001234-00112233445566778899aabbccddeeff.ckpt.bak",
		"000000000000123-400112233445566778899aabbccddeeff.ckpt",
		"000000000000123g-00112233445566778899aabbccddeeff.ckpt",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		CHECK_RC(sel_record_name_parse(bad[i], &back), SEL_EFORMAT);

	sel_record_tmp_name(name, 0xfeed, tmp);
	CHECK(sel_record_is_tmp_name(tmp));
	CHECK(strncmp(tmp, ".tmp-", 5) == 0 && strstr(tmp, name) &&
	      strstr(tmp, "000000000000feed"));
	CHECK(!sel_record_is_tmp_name(name));
	CHECK(!sel_record_is_tmp_name(".tm"));

	uint8_t id[32], fp[16];
	for (int i = 0; i < 32; i++)
		id[i] = (uint8_t)i;
	for (int i = 0; i < 16; i++)
		fp[i] = (uint8_t)(0xf0 + i);
	char dn[SEL_RECORD_DIRNAME_MAX];
	sel_record_dirname(id, fp, dn);
	CHECK(strcmp(dn, "0001020304050607-f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff") == 0);
}

/* ---- slots and row pieces ---------------------------------------------------- */

static void test_row_pieces(void)
{
	struct test_geo t;
	/* Shares: rank 0 8 KiB + 4 KiB = 12 KiB; row 30000 -> 3 pieces. */
	test_geo_init(&t, 2, 64, 2, (uint64_t[]){8192, 100}, 30000);
	sel_record_layout l;
	CHECK_OK(sel_record_layout_init(&l, &t.g));
	CHECK(l.share[0] == 12288 && l.sz.page_record == 24576);
	uint8_t *slots_mem = eos_aligned_alloc(4096, 8 * 24576);
	void *slots[8];
	for (int i = 0; i < 8; i++)
		slots[i] = slots_mem + i * 24576;
	struct iovec iov[16];

	CHECK(sel_record_row_slots(&l, 0) == 3);
	int n = sel_record_row_iov(&l, 0, slots, 3, iov, 16);
	CHECK(n == 6);
	CHECK(iov[0].iov_base == slots[0] && iov[0].iov_len == 12288);
	CHECK(iov[1].iov_base == slots[1] && iov[2].iov_base == slots[2] &&
	      iov[2].iov_len == 30000 - 24576);
	CHECK(iov[3].iov_base == (uint8_t *)slots[0] + 12288 && iov[5].iov_len == 30000 - 24576);
	CHECK_RC(sel_record_row_iov(&l, 0, slots, 2, iov, 16), -ENOBUFS);
	CHECK_RC(sel_record_row_iov(&l, 0, slots, 3, iov, 5), -ENOBUFS);
	struct sel_record_piece plan[16];
	CHECK_OK(sel_record_row_plan(&l, 0, iov, 6, plan));
	CHECK(plan[2].len == 8192 && plan[2].data == 30000 - 24576 && plan[2].off == 24576);
	CHECK(plan[3].off == 32768 && plan[5].off == 32768 + 24576);
	CHECK_OK(sel_record_row_plan(&l, 0, iov, 6, NULL));
	CHECK(sel_record_row_checksum(iov, 6) != 0);
	/* Broken piece lists. */
	CHECK_RC(sel_record_row_plan(&l, 0, iov, 5, plan), -EINVAL);
	struct iovec bad[6];
	memcpy(bad, iov, sizeof bad);
	bad[0].iov_len = 12000;
	CHECK_RC(sel_record_row_plan(&l, 0, bad, 6, plan), -EINVAL);
	memcpy(bad, iov, sizeof bad);
	bad[1].iov_base = (uint8_t *)bad[1].iov_base + 8;
	CHECK_RC(sel_record_row_plan(&l, 0, bad, 6, plan), -EINVAL);
	memcpy(bad, iov, sizeof bad);
	bad[2].iov_len += 1;
	CHECK_RC(sel_record_row_plan(&l, 0, bad, 6, plan), -EINVAL);

	/* Replicated row: pieces j at slot j/2, rank j%2's share. */
	CHECK(sel_record_row_slots(&l, SEL_RECORD_ROW_REPLICATED) == 2);
	n = sel_record_row_iov(&l, SEL_RECORD_ROW_REPLICATED, slots, 2, iov, 16);
	CHECK(n == 3);
	CHECK(iov[0].iov_base == slots[0] && iov[1].iov_base == (uint8_t *)slots[0] + 12288);
	CHECK(iov[2].iov_base == slots[1] && iov[2].iov_len == 30000 - 24576);
	CHECK_OK(sel_record_row_plan(&l, SEL_RECORD_ROW_REPLICATED, iov, 3, plan));
	CHECK(plan[2].off == 24576 && plan[2].len == 8192);

	/* Replicated pages: share i in slot i/2 at rank i%2's offset. */
	CHECK(sel_record_page_addr(&l, 0, slots, 5) == slots[5]);
	CHECK(sel_record_page_addr(&l, SEL_RECORD_PAGES_REPLICATED, slots, 5) ==
	      (uint8_t *)slots[2] + 12288);
	CHECK(sel_record_page_addr(&l, SEL_RECORD_PAGES_REPLICATED, slots, 4) == slots[2]);
	eos_aligned_free(slots_mem);
	sel_record_layout_free(&l);
}

/* The shared verification helpers (disk thread, flare records) and a
 * namespace rebuilt from a header alone. */
static void test_verify_helpers(void)
{
	struct test_geo t;
	sel_record_ns ns, back;
	test_geo_init(&t, 2, 128, 2, (uint64_t[]){8192, 300}, 10000);
	test_ns_init(&ns, &t.g, 3);
	sel_record_desc d;
	test_desc(&rng, 128, 5 * 128 + 1, NULL, false, &d);
	uint8_t *hdr = calloc(1, SEL_RECORD_HEADER_MAX);
	CHECK(sel_record_encode(&ns, &d, 42, 7, SEL_RECORD_VERSION, hdr, SEL_RECORD_HEADER_MAX) >
	      0);
	CHECK_OK(sel_record_ns_from_header(&back, hdr, SEL_RECORD_HEADER_MAX));
	CHECK(!strcmp(back.dirname, ns.dirname));
	CHECK(!memcmp(back.identity, ns.identity, SEL_IDENTITY_BYTES));
	CHECK(back.layout.table_bytes == ns.layout.table_bytes &&
	      !memcmp(back.layout.table, ns.layout.table, ns.layout.table_bytes));
	sel_record_header h;
	CHECK_OK(sel_record_decode(hdr, SEL_RECORD_HEADER_MAX, &back, &h)); /* judges like ns */
	sel_record_ns_free(&back);
	hdr[0] ^= 1;
	CHECK_RC(sel_record_ns_from_header(&back, hdr, SEL_RECORD_HEADER_MAX), SEL_EFORMAT);
	sel_record_ns_free(&back); /* zeroed on failure: safe */

	bool has_row = false;
	CHECK_OK(sel_record_check_length(&h.span, h.span.row_end, &has_row));
	CHECK(has_row);
	CHECK_OK(sel_record_check_length(&h.span, h.span.row_off, &has_row));
	CHECK(!has_row);
	CHECK_RC(sel_record_check_length(&h.span, h.span.row_off + 4096, NULL), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "length"));

	uint8_t page[8192];
	test_rng_fill(&rng, page, sizeof page);
	uint64_t want = XXH3_64bits(page, sizeof page);
	CHECK_OK(sel_record_check_page(page, sizeof page, want, 3));
	page[100] ^= 1;
	CHECK_RC(sel_record_check_page(page, sizeof page, want, 3), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "page record 3"));
	struct iovec iov[2] = {{page, 1000}, {page + 4096, 500}};
	want = sel_record_row_checksum(iov, 2);
	CHECK_OK(sel_record_check_row(iov, 2, want));
	CHECK_RC(sel_record_check_row(iov, 1, want), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "row"));
	free(hdr);
	sel_record_ns_free(&ns);
}

/* ---- files --------------------------------------------------------------------- */

struct fixture {
	struct test_geo t;
	sel_record_ns ns;
	char *base;
	struct eos_dirlock lk;
	int dirfd;
};

static void fixture_init(struct fixture *f, const char *tag)
{
	test_geo_init(&f->t, 1, 64, 2, (uint64_t[]){4096, 100}, 5000);
	test_ns_init(&f->ns, &f->t.g, 1);
	f->base = test_mkdtemp(tag);
	CHECK(f->base);
	CHECK_OK(sel_record_dir_open(f->base, &f->ns, &f->lk));
	f->dirfd = f->lk.fd;
}

static void fixture_free(struct fixture *f)
{
	eos_dirlock_release(&f->lk);
	test_rmtree(f->base);
	free(f->base);
	sel_record_ns_free(&f->ns);
}

/* Write record d with pattern bytes (seeded by its key) in ns. */
static void write_rec(int dirfd, const sel_record_ns *ns, const sel_record_desc *d, bool row)
{
	test_record_write(dirfd, ns, d, row);
}

static uint64_t file_size(int dirfd, const char *name)
{
	struct stat st;
	if (fstatat(dirfd, name, &st, 0) != 0)
		return UINT64_MAX;
	return (uint64_t)st.st_size;
}

static int count_entries(int dirfd, const char *prefix)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY);
	DIR *dp = fdopendir(fd);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dp)))
		if (e->d_name[0] != '.' || strncmp(e->d_name, ".tmp-", 5) == 0)
			n += !prefix || strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(dp);
	return n;
}

static void set_mtime(int dirfd, const sel_key *k, int64_t sec)
{
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(k, name);
	struct timespec ts[2] = {{sec, 0}, {sec, 0}};
	CHECK(utimensat(dirfd, name, ts, 0) == 0);
}

static void test_write_protocol(void)
{
	struct fixture f;
	fixture_init(&f, "recwrite");
	sel_record_desc d;
	test_desc(&rng, 64, 200, NULL, false, &d);
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&d.key, name);
	sel_record_span s;
	CHECK_OK(sel_record_span_of(&f.ns.layout.sz, &d, &s));

	/* Full, then replaced by a page-only rewrite of the same key. */
	write_rec(f.dirfd, &f.ns, &d, true);
	CHECK(file_size(f.dirfd, name) == s.row_end);
	CHECK(count_entries(f.dirfd, NULL) == 1);
	write_rec(f.dirfd, &f.ns, &d, false);
	CHECK(file_size(f.dirfd, name) == s.row_off);
	CHECK(count_entries(f.dirfd, NULL) == 1);

	/* Compaction. */
	write_rec(f.dirfd, &f.ns, &d, true);
	bool had;
	CHECK_OK(sel_record_truncate(f.dirfd, name, &s, NULL, &had));
	CHECK(had && file_size(f.dirfd, name) == s.row_off);
	CHECK_OK(sel_record_truncate(f.dirfd, name, &s, NULL, &had));
	CHECK(!had);

	/* Deletion. */
	bool existed;
	CHECK_OK(sel_record_unlink(f.dirfd, name, &existed));
	CHECK(existed && count_entries(f.dirfd, NULL) == 0);
	CHECK_OK(sel_record_unlink(f.dirfd, name, &existed));
	CHECK(!existed);

	/* The lock: a second owner of the namespace fails at once. */
	struct eos_dirlock lk2;
	CHECK_RC(sel_record_dir_open(f.base, &f.ns, &lk2), -EBUSY);
	/* ... while another namespace under the same base is fine. */
	sel_record_ns other;
	test_ns_init(&other, &f.t.g, 9);
	CHECK_OK(sel_record_dir_open(f.base, &other, &lk2));
	eos_dirlock_release(&lk2);
	sel_record_ns_free(&other);
	fixture_free(&f);
}

/* ---- scan ------------------------------------------------------------------------ */

static const sel_scan_record *find(const sel_scan *sc, const sel_key *k, size_t *pos)
{
	for (size_t i = 0; i < sc->n; i++)
		if (sel_key_eq(&sc->rec[i].d.key, k)) {
			if (pos)
				*pos = i;
			return &sc->rec[i];
		}
	return NULL;
}

static void write_raw(int dirfd, const char *name, const void *buf, size_t len)
{
	int fd = openat(dirfd, name, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	CHECK(fd >= 0);
	CHECK(write(fd, buf, len) == (ssize_t)len);
	close(fd);
}

static void test_scan_scenario(void)
{
	struct fixture f;
	fixture_init(&f, "recscan");
	int dfd = f.dirfd;
	const uint32_t pt = 64;
	sel_record_desc A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, P, Q, R;
	sel_key X;

	test_desc(&rng, pt, 128, NULL, false, &A);   /* root, row */
	test_desc(&rng, pt, 256, &A.key, false, &B); /* compacted: page-only, children C, D */
	test_desc(&rng, pt, 320, &B.key, false, &C); /* row (written as version 1) */
	test_desc(&rng, pt, 384, &B.key, false, &D); /* row */
	test_desc(&rng, pt, 192, NULL, false, &E);   /* page-only root, childless: pruned */
	test_desc(&rng, pt, 64, NULL, false, &F);    /* page-only, only child G */
	test_desc(&rng, pt, 128, &F.key, false, &G); /* page-only leaf: pruned, then F */
	test_key(&rng, 64, &X);                      /* never written */
	test_desc(&rng, pt, 192, &X, false, &H);     /* orphan */
	test_desc(&rng, pt, 256, &H.key, false, &I); /* descendant of the orphan */
	test_desc(&rng, pt, 320, &H.key, true, &J);  /* full chain under the orphan: kept */
	test_desc(&rng, pt, 448, &A.key, true, &K);  /* full chain under A: kept */
	test_desc(&rng, pt, 130, &A.key, false, &L); /* no pages of its own, links A */
	CHECK(L.tail == 0 && J.tail == 5 && K.tail == 7);
	test_desc(&rng, pt, 200, NULL, false, &M); /* another identity */
	test_desc(&rng, pt, 200, NULL, false, &N); /* another fingerprint */
	test_desc(&rng, pt, 200, NULL, false, &O); /* renamed to another key */
	test_desc(&rng, pt, 200, NULL, false, &P); /* bad length */
	test_desc(&rng, pt, 200, NULL, false, &Q); /* garbage */
	test_desc(&rng, pt, 200, NULL, false, &R); /* header byte flipped */

	const sel_record_desc *rows[] = {&A, &B, &C, &D, &I, &J, &K, &L, &O, &P, &R};
	const sel_record_desc *nrows[] = {&E, &F, &G, &H};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
		write_rec(dfd, &f.ns, rows[i], true);
	for (size_t i = 0; i < sizeof nrows / sizeof nrows[0]; i++)
		write_rec(dfd, &f.ns, nrows[i], false);
	char name[SEL_RECORD_NAME_MAX], name2[SEL_RECORD_NAME_MAX];
	sel_record_span s;
	/* B compacted after its children were written. */
	sel_record_name(&B.key, name);
	CHECK_OK(sel_record_span_of(&f.ns.layout.sz, &B, &s));
	bool had;
	CHECK_OK(sel_record_truncate(dfd, name, &s, NULL, &had));
	CHECK(had);
	/* C's header rewritten as version 1 (same layout otherwise). */
	{
		sel_record_name(&C.key, name);
		int fd = openat(dfd, name, O_RDWR);
		uint8_t hb[4096];
		CHECK(pread(fd, hb, 4096, 0) == 4096);
		sel_record_header h;
		CHECK_OK(sel_record_decode(hb, 4096, &f.ns, &h));
		CHECK(sel_record_encode(&f.ns, &C, h.row_checksum, h.created_ns, 1, hb, 4096) ==
		      4096);
		CHECK(pwrite(fd, hb, 4096, 0) == 4096);
		close(fd);
	}
	/* M and N: other namespaces' records dropped into ours. */
	{
		sel_record_ns other;
		test_ns_init(&other, &f.t.g, 2);
		write_rec(dfd, &other, &M, true);
		sel_record_ns_free(&other);
		struct test_geo t2;
		test_geo_init(&t2, 1, 64, 2, (uint64_t[]){4096, 200}, 5000);
		test_ns_init(&other, &t2.g, 1);
		write_rec(dfd, &other, &N, true);
		sel_record_ns_free(&other);
	}
	/* O renamed to a name that is not its key. */
	sel_record_name(&O.key, name);
	sel_key notO;
	test_key(&rng, 200, &notO);
	sel_record_name(&notO, name2);
	CHECK(renameat(dfd, name, dfd, name2) == 0);
	/* P with a length that is neither page-only nor full. */
	sel_record_name(&P.key, name);
	CHECK_OK(sel_record_span_of(&f.ns.layout.sz, &P, &s));
	{
		int fd = openat(dfd, name, O_RDWR);
		CHECK(ftruncate(fd, (off_t)s.row_off + 4096) == 0);
		close(fd);
	}
	/* Q: garbage under a record name. */
	{
		uint8_t junk[8192];
		test_rng_fill(&rng, junk, sizeof junk);
		sel_record_name(&Q.key, name);
		write_raw(dfd, name, junk, sizeof junk);
	}
	/* R: one header byte flipped. */
	{
		sel_record_name(&R.key, name);
		int fd = openat(dfd, name, O_RDWR);
		uint8_t c;
		CHECK(pread(fd, &c, 1, 100) == 1);
		c ^= 0x40;
		CHECK(pwrite(fd, &c, 1, 100) == 1);
		close(fd);
	}
	/* Temporaries of interrupted writes, and names that are not ours. */
	write_raw(dfd, ".tmp-0000000000000080-00000000000000000000000000000000.ckpt-1", "x", 1);
	write_raw(dfd, ".tmp-whatever", "", 0);
	write_raw(dfd, "README", "keep me", 7);
	sel_key dk;
	test_key(&rng, 999, &dk);
	sel_record_name(&dk, name);
	CHECK(mkdirat(dfd, name, 0755) == 0);

	/* Access times: C older than its parent B (compaction touched B). */
	set_mtime(dfd, &A.key, 1000);
	set_mtime(dfd, &L.key, 1500);
	set_mtime(dfd, &C.key, 2000);
	set_mtime(dfd, &D.key, 3000);
	set_mtime(dfd, &J.key, 4000);
	set_mtime(dfd, &B.key, 5000);
	set_mtime(dfd, &K.key, 6000);

	int before = count_entries(dfd, NULL);
	sel_scan sc;
	struct sel_scan_opts dry = {.direct = true, .dry_run = true, .threads = 3};
	CHECK_OK(sel_record_scan(dfd, &f.ns, &dry, &sc));
	CHECK(count_entries(dfd, NULL) == before);
	sel_scan_stats dst = sc.st;
	sel_scan_free(&sc);

	struct sel_scan_opts opts = {.direct = true};
	CHECK_OK(sel_record_scan(dfd, &f.ns, &opts, &sc));
	const sel_scan_stats *st = &sc.st;
	printf("scan: %llu entries, %llu kept (%llu with row), tmp %llu, format %llu, checksum %llu, "
	       "identity %llu, layout %llu, name %llu, size %llu, orphans %llu, descendants %llu, "
	       "pruned %llu, ignored %llu\n",
	       (unsigned long long)st->entries, (unsigned long long)st->records,
	       (unsigned long long)st->with_row, (unsigned long long)st->tmp_removed,
	       (unsigned long long)st->bad_format, (unsigned long long)st->bad_checksum,
	       (unsigned long long)st->bad_identity, (unsigned long long)st->bad_layout,
	       (unsigned long long)st->bad_name, (unsigned long long)st->bad_size,
	       (unsigned long long)st->orphans, (unsigned long long)st->descendants,
	       (unsigned long long)st->pruned, (unsigned long long)st->ignored);
	CHECK(st->records == 7 && sc.n == 7 && st->with_row == 6);
	CHECK(st->tmp_removed == 2);
	CHECK(st->bad_format == 1 && st->bad_checksum == 1 && st->bad_identity == 1);
	CHECK(st->bad_layout == 1 && st->bad_name == 1 && st->bad_size == 1);
	CHECK(st->orphans == 1 && st->descendants == 1 && st->pruned == 3);
	CHECK(st->ignored == 2 && st->unreadable == 0 && st->unlink_failed == 0);
	CHECK(dst.records == st->records && dst.pruned == st->pruned && dst.orphans == st->orphans);

	/* Exactly the survivors, with their fields, in access order, parents first. */
	const sel_record_desc *want[] = {&A, &L, &B, &C, &D, &J, &K};
	const bool want_row[] = {true, true, false, true, true, true, true};
	for (size_t i = 0; i < 7; i++) {
		const sel_scan_record *r = &sc.rec[i];
		CHECKF(sel_key_eq(&r->d.key, &want[i]->key), "position %zu", i);
		CHECK(sel_key_eq(&r->d.parent, &want[i]->parent));
		CHECK(memcmp(r->d.bucket.b, want[i]->bucket.b, 16) == 0);
		CHECK(r->d.tail == want[i]->tail && r->d.flags == 0);
		CHECK(r->has_row == want_row[i]);
		CHECK(r->file_bytes == (r->has_row ? r->span.row_end : r->span.row_off));
		CHECK(r->version == (want[i] == &C ? 1u : SEL_RECORD_VERSION));
	}
	CHECK(sc.rec[0].mtime_ns == 1000000000000ull);
	/* What is left on disk: the 7 records, README and the directory. */
	CHECK(count_entries(dfd, NULL) == 9);
	sel_scan_free(&sc);

	/* A second scan keeps everything and removes nothing. */
	CHECK_OK(sel_record_scan(dfd, &f.ns, &opts, &sc));
	CHECK(sc.n == 7 && sc.st.bytes_removed == 0 && sc.st.ignored == 2);
	sel_scan_free(&sc);
	/* Buffered header reads find the same. */
	opts.direct = false;
	opts.threads = 1;
	CHECK_OK(sel_record_scan(dfd, &f.ns, &opts, &sc));
	CHECK(sc.n == 7);
	sel_scan_free(&sc);
	fixture_free(&f);
}

/* A random forest, some files lost, checked against a naive model. */
struct mrec {
	sel_record_desc d;
	int parent; /* index of the linked parent, -1 */
	bool row, present, alive;
	int64_t mtime;
};

struct removals {
	const struct mrec *m;
	int n;
	uint64_t calls, why[SEL_SCAN_PRUNED + 1];
	uint64_t last_consumed;
};

static void on_remove(void *ctx, const char *name, enum sel_scan_why why, uint64_t bytes, int err)
{
	struct removals *rm = ctx;
	sel_key k;
	CHECK(err == 0 && bytes > 0);
	CHECK_OK(sel_record_name_parse(name, &k));
	CHECK(k.consumed <= rm->last_consumed); /* deepest first */
	rm->last_consumed = k.consumed;
	int i;
	for (i = 0; i < rm->n && !sel_key_eq(&rm->m[i].d.key, &k); i++)
		;
	CHECK(i < rm->n && rm->m[i].present && !rm->m[i].alive);
	CHECK(why >= SEL_SCAN_ORPHAN && why <= SEL_SCAN_PRUNED);
	CHECK(strcmp(sel_scan_why_name(why), "?") != 0);
	rm->why[why]++;
	rm->calls++;
}

static void test_scan_random(void)
{
	struct fixture f;
	fixture_init(&f, "recrand");
	enum {
		NREC = 300
	};
	static struct mrec m[NREC];
	const uint32_t pt = 64;
	for (int i = 0; i < NREC; i++) {
		int p = i && test_rng_below(&rng, 5) ? (int)test_rng_below(&rng, (uint64_t)i) : -1;
		bool full = test_rng_below(&rng, 6) == 0;
		uint64_t base = p >= 0 ? m[p].d.key.consumed : 0;
		uint64_t c = base + 1 + test_rng_below(&rng, 300);
		test_desc(&rng, pt, c, p >= 0 ? &m[p].d.key : NULL, full, &m[i].d);
		m[i].parent = p >= 0 && sel_record_links_parent(&m[i].d, pt) ? p : -1;
		m[i].row = test_rng_below(&rng, 10) < 6;
		m[i].present = test_rng_below(&rng, 10) != 0;
		m[i].mtime = 1000 + (int64_t)test_rng_below(&rng, 100000);
		if (m[i].present) {
			write_rec(f.dirfd, &f.ns, &m[i].d, m[i].row);
			set_mtime(f.dirfd, &m[i].d.key, m[i].mtime);
		}
	}
	/* Model: alive = present and every linked ancestor alive... */
	for (int i = 0; i < NREC; i++)
		m[i].alive = m[i].present && (m[i].parent < 0 || m[m[i].parent].alive);
	/* ... then prune childless page-only records to a fixpoint. */
	for (bool changed = true; changed;) {
		changed = false;
		for (int i = 0; i < NREC; i++) {
			if (!m[i].alive || m[i].row)
				continue;
			bool child = false;
			for (int k = 0; k < NREC && !child; k++)
				child = m[k].alive && m[k].parent == i;
			if (!child) {
				m[i].alive = false;
				changed = true;
			}
		}
	}
	sel_scan sc;
	struct removals rm = {.m = m, .n = NREC, .last_consumed = UINT64_MAX};
	struct sel_scan_opts opts = {
		.direct = true, .threads = 4, .on_remove = on_remove, .ctx = &rm};
	CHECK_OK(sel_record_scan(f.dirfd, &f.ns, &opts, &sc));
	/* Every removal was reported, deepest first, for a record the model
	 * drops, with the reason the statistics count. */
	CHECK(rm.calls == sc.st.orphans + sc.st.descendants + sc.st.pruned);
	CHECK(rm.why[SEL_SCAN_ORPHAN] == sc.st.orphans);
	CHECK(rm.why[SEL_SCAN_DESCENDANT] == sc.st.descendants);
	CHECK(rm.why[SEL_SCAN_PRUNED] == sc.st.pruned);
	size_t alive = 0;
	for (int i = 0; i < NREC; i++) {
		size_t pos;
		const sel_scan_record *r = find(&sc, &m[i].d.key, &pos);
		CHECKF((r != NULL) == m[i].alive, "record %d: found %d, model %d", i, r != NULL,
		       m[i].alive);
		if (!r)
			continue;
		alive++;
		CHECK(r->has_row == m[i].row && r->d.tail == m[i].d.tail);
		CHECK(sel_key_eq(&r->d.parent, &m[i].d.parent));
		if (m[i].parent >= 0) {
			size_t ppos;
			CHECK(find(&sc, &m[m[i].parent].d.key, &ppos) && ppos < pos);
		}
	}
	CHECK(sc.n == alive);
	/* Out-of-order pairs are explained by a pulled-up ancestor. */
	for (size_t a = 0; a < sc.n; a++)
		for (size_t b = a + 1; b < sc.n; b++) {
			if (sc.rec[a].mtime_ns <= sc.rec[b].mtime_ns)
				continue;
			bool ok = false;
			for (size_t z = 0; z < sc.n && !ok; z++) {
				if (sc.rec[z].mtime_ns > sc.rec[b].mtime_ns)
					continue;
				/* is a a linked ancestor of z? */
				const sel_scan_record *x = &sc.rec[z];
				while (!ok && sel_record_links_parent(&x->d, pt)) {
					x = find(&sc, &x->d.parent, NULL);
					if (!x)
						break;
					ok = sel_key_eq(&x->d.key, &sc.rec[a].d.key);
				}
			}
			CHECKF(ok, "records %zu and %zu out of access order", a, b);
		}
	printf("random scan: %zu of %d kept, %llu orphans, %llu descendants, %llu pruned\n", sc.n,
	       NREC, (unsigned long long)sc.st.orphans, (unsigned long long)sc.st.descendants,
	       (unsigned long long)sc.st.pruned);
	sel_scan_free(&sc);
	fixture_free(&f);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	test_layouts();
	test_span_rules();
	test_decode_rejects();
	test_v1_vector();
	test_names();
	test_row_pieces();
	test_verify_helpers();
	test_write_protocol();
	test_scan_scenario();
	test_scan_random();
	printf("test_record: ok\n");
	return 0;
}
