/*
 * test_shard_proto.c - the rank links' frames (src/selene/shard_proto.c,
 * design 2.14): every type round-trips byte for byte, every truncation and
 * every broken rule is refused with SEL_EFORMAT and a message, lengths, ids,
 * slots and records out of range are refused under the receiver's limits,
 * and the encoder refuses what the decoder would.
 *
 * `test_shard_proto --write-corpus DIR` writes the sample frames as the
 * seed corpus of fuzz/fuzz_shard.c (fuzz/corpus/shard/).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include "eos.h"
#include "internal.h"
#include "recutil.h"
#include "shard_agree.h"
#include "shard_proto.h"
#include "testutil.h"
#include "wire.h"

static sel_key key(uint64_t c, uint8_t fill)
{
	sel_key k = {.consumed = c};
	memset(k.digest.b, fill, SEL_DIGEST_BYTES);
	return k;
}

/* A chain root (128 tokens, 2 pages of 64) and a child linking under it. */
static sel_record_desc desc_root(void)
{
	sel_record_desc d = {.key = key(128, 1), .tail = 2};
	memset(d.bucket.b, 0x31, SEL_DIGEST_BYTES);
	return d;
}
static sel_record_desc desc_child(void)
{
	sel_record_desc d = {.key = key(320, 2),
			     .parent = key(128, 1),
			     .tail = 3,
			     .parent_check = 0x3131313131313131ull};
	memset(d.bucket.b, 0x32, SEL_DIGEST_BYTES);
	return d;
}

static struct sel_shard_entry entries[3];
static uint8_t actions[5] = {0, 1, 2, 0, 2};
static struct sel_shard_rec recs[2];
static uint32_t pages[5] = {7, 8, 9, 10, 11};

/* One sample of every type (two of JOB, ERROR). */
static int samples(struct sel_shard_msg *m)
{
	int n = 0;
	memset(m, 0, 16 * sizeof *m);
	m[n].type = SEL_SHARD_HELLO;
	m[n].u.hello = (struct sel_shard_hello){
		.world = 4, .rank = 2, .port = 40123, .set = {true, 1ull << 30}};
	memset(m[n].u.hello.nonce, 0xa5, SEL_SHARD_NONCE_BYTES);
	m[n].u.hello.addr.family = 4;
	m[n].u.hello.addr.a[0] = 10;
	m[n].u.hello.addr.a[3] = 1;
	memset(m[n].u.hello.identity, 0x11, SEL_IDENTITY_BYTES);
	memset(m[n].u.hello.fingerprint, 0x22, SEL_FINGERPRINT_BYTES);
	n++;
	m[n].type = SEL_SHARD_JOIN;
	m[n].u.join = (struct sel_shard_join){.world = 4, .rank = 2, .set = {true, 1ull << 29}};
	memset(m[n].u.join.nonce, 0xa5, SEL_SHARD_NONCE_BYTES);
	memset(m[n].u.join.identity, 0x11, SEL_IDENTITY_BYTES);
	memset(m[n].u.join.fingerprint, 0x23, SEL_FINGERPRINT_BYTES);
	n++;
	m[n].type = SEL_SHARD_ACCEPT;
	m[n].u.accept = (struct sel_shard_accept){4, 1ull << 29};
	n++;
	m[n].type = SEL_SHARD_ERROR;
	m[n].u.status.status = -EACCES;
	snprintf(m[n].u.status.text, sizeof m[n].u.status.text,
		 "rank 2's join presents another nonce");
	n++;
	entries[0] = (struct sel_shard_entry){.d = desc_root(),
					      .version = 3,
					      .header_bytes = 4096,
					      .created_ns = 1700000000000000000ull,
					      .page_off = 8192,
					      .row_off = 8192 + 2 * 8192,
					      .row_end = 8192 + 3 * 8192,
					      .has_row = true};
	entries[1] = entries[0];
	entries[1].d = desc_child();
	entries[1].has_row = false;
	entries[2] = entries[0];
	entries[2].version = 1;
	m[n].type = SEL_SHARD_SCAN;
	m[n].u.scan = (struct sel_shard_scan){10, 3, entries};
	n++;
	m[n].type = SEL_SHARD_SCAN_END;
	m[n].u.total.total = 13;
	n++;
	m[n].type = SEL_SHARD_DECIDE;
	m[n].u.decide = (struct sel_shard_decide){0, 5, actions};
	n++;
	m[n].type = SEL_SHARD_DECIDE_END;
	m[n].u.total.total = 5;
	n++;
	m[n].type = SEL_SHARD_APPLIED;
	m[n].u.status = (struct sel_shard_status){0, 3, 1, ""};
	n++;
	recs[0] = (struct sel_shard_rec){desc_root(), 1, 1};
	recs[1] = (struct sel_shard_rec){desc_child(), 0, 3};
	m[n].type = SEL_SHARD_JOB;
	m[n].u.job = (struct sel_shard_job){.id = 77,
					    .op = SEL_SHARD_FETCH,
					    .row = true,
					    .slot = 3,
					    .n_recs = 2,
					    .recs = recs,
					    .n_pages = 4,
					    .pages = pages};
	n++;
	m[n].type = SEL_SHARD_JOB;
	m[n].u.job = (struct sel_shard_job){.id = 78,
					    .op = SEL_SHARD_STORE,
					    .row = true,
					    .slot = 1,
					    .created_ns = 5,
					    .after = 77,
					    .n_recs = 1,
					    .recs = &recs[1],
					    .n_pages = 3,
					    .pages = pages + 2};
	n++;
	m[n].type = SEL_SHARD_DONE;
	m[n].u.done = (struct sel_shard_result){
		.id = 77, .status = -ENOSPC, .flags = SEL_SHARD_R_COMMITTED, .bytes = 1 << 20};
	snprintf(m[n].u.done.text, sizeof m[n].u.done.text, "no space left on device");
	n++;
	m[n].type = SEL_SHARD_DRAIN;
	m[n].u.drain.ms = 30000;
	n++;
	m[n].type = SEL_SHARD_DRAINED;
	m[n].u.status.status = SEL_ESTOPPED;
	snprintf(m[n].u.status.text, sizeof m[n].u.status.text, "disk thread did not finish");
	n++;
	return n;
}

static uint8_t *enc(const struct sel_shard_msg *m, size_t *len)
{
	int64_t n = sel_shard_encoded_size(m);
	CHECKF(n > 0, "%s: %s", sel_shard_type_name(m->type), sel_errmsg());
	uint8_t *b = malloc((size_t)n);
	CHECK(sel_shard_encode(m, b, (size_t)n) == n);
	*len = (size_t)n;
	return b;
}

static void expect_refused(const void *b, size_t len, const struct sel_shard_limits *lim,
			   const char *want)
{
	struct sel_shard_msg m;
	int rc = sel_shard_decode(b, len, lim, &m);
	CHECKF(rc == SEL_EFORMAT, "decoded (rc %d), expected a refusal naming '%s'", rc, want);
	CHECKF(strstr(sel_errmsg(), want), "message '%s' does not name '%s'", sel_errmsg(), want);
}

static void test_round_trips(void)
{
	struct sel_shard_msg m[16];
	int n = samples(m);
	for (int i = 0; i < n; i++) {
		size_t len;
		uint8_t *b = enc(&m[i], &len);
		struct sel_shard_msg d;
		CHECKF(sel_shard_decode(b, len, NULL, &d) == 0, "%s: %s",
		       sel_shard_type_name(m[i].type), sel_errmsg());
		CHECK(d.type == m[i].type);
		size_t len2;
		uint8_t *b2 = enc(&d, &len2);
		CHECK(len2 == len && !memcmp(b, b2, len));
		/* Every truncation and an extra byte are refused. */
		for (size_t cut = 0; cut < len; cut++) {
			struct sel_shard_msg x;
			CHECK(sel_shard_decode(b, cut, NULL, &x) == SEL_EFORMAT);
		}
		uint8_t *longer = malloc(len + 1);
		memcpy(longer, b, len);
		longer[len] = 0;
		sel_put_u32(longer, (uint32_t)(len + 1 - SEL_SHARD_FRAME_HEADER));
		expect_refused(longer, len + 1, NULL, "");
		free(longer);
		sel_shard_msg_free(&d);
		free(b);
		free(b2);
	}
	/* Field values survive. */
	size_t len;
	uint8_t *b = enc(&m[9], &len);
	struct sel_shard_msg d;
	CHECK_OK(sel_shard_decode(b, len, NULL, &d));
	CHECK(d.u.job.id == 77 && d.u.job.op == SEL_SHARD_FETCH && d.u.job.row &&
	      d.u.job.slot == 3);
	CHECK(d.u.job.n_recs == 2 && sel_key_eq(&d.u.job.recs[1].d.parent, &recs[0].d.key));
	CHECK(d.u.job.recs[1].d.parent_check == recs[1].d.parent_check);
	CHECK(d.u.job.n_pages == 4 && d.u.job.pages[3] == 10);
	sel_shard_msg_free(&d);
	free(b);
	b = enc(&m[4], &len);
	CHECK_OK(sel_shard_decode(b, len, NULL, &d));
	CHECK(d.u.scan.first == 10 && d.u.scan.n == 3 && !d.u.scan.e[1].has_row);
	for (int i = 0; i < 3; i++)
		CHECK(sel_shard_entry_same(&d.u.scan.e[i], &entries[i]) &&
		      d.u.scan.e[i].has_row == entries[i].has_row);
	sel_shard_msg_free(&d);
	free(b);
	b = enc(&m[0], &len);
	CHECK_OK(sel_shard_decode(b, len, NULL, &d));
	CHECK(d.u.hello.port == 40123 && d.u.hello.addr.family == 4 && d.u.hello.addr.a[0] == 10);
	CHECK(d.u.hello.set.disk && d.u.hello.set.disk_limit == 1ull << 30);
	sel_shard_msg_free(&d);
	free(b);
	printf("round trips: %d frames\n", n);
}

/* Sample i encoded, a field of the payload overwritten, then refused. */
static void patch(int i, size_t off, unsigned width, uint64_t v, const struct sel_shard_limits *lim,
		  const char *want)
{
	struct sel_shard_msg m[16];
	samples(m);
	size_t len;
	uint8_t *b = enc(&m[i], &len);
	uint8_t *p = b + SEL_SHARD_FRAME_HEADER + off;
	CHECK(SEL_SHARD_FRAME_HEADER + off + width <= len);
	if (width == 1)
		p[0] = (uint8_t)v;
	else if (width == 2)
		sel_put_u16(p, (uint16_t)v);
	else if (width == 4)
		sel_put_u32(p, (uint32_t)v);
	else
		sel_put_u64(p, v);
	expect_refused(b, len, lim, want);
	free(b);
}

/* A frame of type built from raw payload bytes. */
static void raw(uint16_t type, const struct sel_wr *w, const struct sel_shard_limits *lim,
		const char *want)
{
	uint8_t *f = malloc(SEL_SHARD_FRAME_HEADER + w->n);
	sel_put_u32(f, (uint32_t)w->n);
	sel_put_u16(f + 4, type);
	sel_put_u16(f + 6, 0);
	memcpy(f + SEL_SHARD_FRAME_HEADER, w->b, w->n);
	expect_refused(f, SEL_SHARD_FRAME_HEADER + w->n, lim, want);
	free(f);
}

enum {
	HELLO = 0,
	JOIN,
	ACCEPT,
	ERROR,
	SCAN,
	SCAN_END,
	DECIDE,
	DECIDE_END,
	APPLIED,
	FETCH,
	STORE,
	DONE,
	DRAIN,
	DRAINED
};

static void test_rejections(void)
{
	/* Headers. */
	uint8_t h[8];
	uint16_t type;
	uint32_t plen;
	sel_put_u32(h, 4);
	sel_put_u16(h + 4, SEL_SHARD_DRAIN);
	sel_put_u16(h + 6, 1);
	CHECK(sel_shard_frame_header(h, 8, &type, &plen) == SEL_EFORMAT &&
	      strstr(sel_errmsg(), "reserved"));
	sel_put_u16(h + 6, 0);
	sel_put_u16(h + 4, SEL_SHARD_TYPES);
	CHECK(sel_shard_frame_header(h, 8, &type, &plen) == SEL_EFORMAT &&
	      strstr(sel_errmsg(), "unknown type"));
	sel_put_u16(h + 4, 0);
	CHECK(sel_shard_frame_header(h, 8, &type, &plen) == SEL_EFORMAT);
	sel_put_u16(h + 4, SEL_SHARD_JOB);
	sel_put_u32(h, SEL_SHARD_FRAME_MAX + 1);
	CHECK(sel_shard_frame_header(h, 8, &type, &plen) == SEL_EFORMAT &&
	      strstr(sel_errmsg(), "more than"));
	sel_put_u32(h, SEL_SHARD_FRAME_MAX);
	CHECK_OK(sel_shard_frame_header(h, 8, &type, &plen));
	CHECK(sel_shard_frame_header(h, 7, &type, &plen) == SEL_EFORMAT);

	/* HELLO and JOIN. */
	patch(HELLO, 0, 4, 0x12345678, NULL, "not a rank link");
	patch(HELLO, 4, 4, 3, NULL, "protocol version 3");
	patch(HELLO, 8, 4, 1, NULL, "world size");
	patch(HELLO, 8, 4, 65, NULL, "world size");
	patch(HELLO, 12, 4, 0, NULL, "rank");
	patch(HELLO, 12, 4, 4, NULL, "rank");
	patch(HELLO, 32, 1, 5, NULL, "address family");
	patch(HELLO, 33 + 5, 1, 1, NULL, "after its fourth");
	patch(HELLO, 49, 1, 2, NULL, "neither 0 nor 1");
	patch(HELLO, 50, 2, 0, NULL, "port");
	patch(HELLO, 49, 1, 0, NULL, "set without a disk store");
	patch(HELLO, 100, 8, 0, NULL, "0 with a disk store");
	{
		/* An IPv4-mapped IPv6 address must travel as IPv4. */
		struct sel_shard_msg m[16];
		samples(m);
		size_t len;
		uint8_t *b = enc(&m[HELLO], &len);
		uint8_t *a = b + SEL_SHARD_FRAME_HEADER + 32;
		a[0] = 6;
		memset(a + 1, 0, 16);
		a[1 + 10] = a[1 + 11] = 0xff;
		a[1 + 12] = 10;
		expect_refused(b, len, NULL, "IPv4-mapped");
		free(b);
	}
	patch(JOIN, 81, 1, 1, NULL, "reserved bytes");
	patch(JOIN, 88, 8, 0, NULL, "0 with a disk store");
	patch(JOIN, 12, 4, 9, NULL, "rank");
	patch(ACCEPT, 0, 4, 70, NULL, "world size");
	patch(ACCEPT, 4, 1, 1, NULL, "reserved");

	/* Statuses and texts. */
	patch(ERROR, 0, 4, 0, NULL, "0 in an error");
	patch(ERROR, 0, 4, 5, NULL, "status");
	patch(ERROR, 0, 4, (uint32_t)-5000, NULL, "status");
	patch(ERROR, 8, 1, '\n', NULL, "control byte");
	patch(ERROR, 4, 4, 300, NULL, "longer than allowed");
	patch(DRAINED, 0, 4, 1, NULL, "status");
	{
		uint8_t text[300];
		memset(text, 'a', sizeof text);
		uint8_t pb[512];
		struct sel_wr w = {pb, sizeof pb, 0};
		sel_wr_u32(&w, (uint32_t)-EIO);
		sel_wr_u32(&w, 256);
		sel_wr_bytes(&w, text, 256);
		raw(SEL_SHARD_ERROR, &w, NULL, "longer than allowed");
	}

	/* Scan summaries. */
	size_t e0 = 8, e1 = 8 + SEL_SHARD_ENTRY_BYTES;
	patch(SCAN, 4, 4, SEL_SHARD_SCAN_CHUNK + 1, NULL, "count over its limit");
	patch(SCAN, 4, 4, 4, NULL, "count larger than the payload holds");
	patch(SCAN, 0, 4, SEL_SHARD_MAX_SCAN, NULL, "beyond the largest summary");
	patch(SCAN, e0 + 80, 4, 9, NULL, "version");
	patch(SCAN, e0 + 84, 4, 5000, NULL, "header bytes");
	patch(SCAN, e0 + 96, 8, 8193, NULL, "multiples of 4096");
	patch(SCAN, e0 + 104, 8, 4096, NULL, "order");
	patch(SCAN, e0 + 120, 1, 2, NULL, "neither 0 nor 1");
	patch(SCAN, e0 + 125, 1, 1, NULL, "reserved");
	patch(SCAN, e0 + 0, 8, 0, NULL, "consumes 0 tokens");
	patch(SCAN, e1 + 24, 8, 320, NULL, "parent consumes 320");
	patch(SCAN, e0 + 72, 8, 1, NULL, "parent link check without a parent");
	patch(SCAN, e0 + 68, 4, 1, NULL, "unknown record flags");
	patch(SCAN, e0 + 64, 4, SEL_SHARD_MAX_PAGES + 1, NULL, "tail of");
	patch(SCAN_END, 0, 4, SEL_SHARD_MAX_SCAN + 1, NULL, "total");
	patch(DECIDE, 8 + 2, 1, 3, NULL, "neither keep");
	patch(DECIDE, 4, 4, 6, NULL, "count larger");

	/* Jobs: FETCH (2 records, 4 pages, row to slot 3) and STORE. */
	size_t r0 = 44, r1 = 44 + 88; /* after id, op, row, slot, creation, after, counts */
	patch(FETCH, 0, 8, 0, NULL, "id 0");
	patch(FETCH, 8, 4, 9, NULL, "unknown operation");
	patch(FETCH, 12, 1, 2, NULL, "neither 0 nor 1");
	patch(FETCH, 13, 1, 1, NULL, "reserved");
	patch(FETCH, 16, 4, SEL_SHARD_NO_SLOT, NULL, "a row without a state slot");
	patch(FETCH, 12, 1, 0, NULL, "a state slot without a row");
	patch(FETCH, 20, 8, 5, NULL, "a creation time on a job that writes nothing");
	patch(STORE, 20, 8, 0, NULL, "a store without a creation time");
	patch(FETCH, r0 + 80, 4, 2, NULL, "beyond its tail");
	patch(FETCH, r1 + 24 + 8, 1, 0xee, NULL, "not the record before it");
	patch(FETCH, 36, 4, 3, NULL, "count larger than the payload holds");
	patch(FETCH, 36, 4, 0, NULL, "not exactly the rest");
	patch(FETCH, 40, 4, SEL_SHARD_MAX_PAGES + 1, NULL, "count over its limit");
	patch(FETCH, r1 + 84, 4, 2, NULL, "page ids for");
	patch(STORE, 44 + 84, 4, 2, NULL, "not its whole tail");
	patch(FETCH, r0 + 0, 8, 0, NULL, "consumes 0 tokens");
	{
		/* Under the receiver's limits. */
		struct sel_shard_limits lim = {.pages = 11, .slots = 4};
		struct sel_shard_msg m[16];
		samples(m);
		size_t len;
		uint8_t *b = enc(&m[FETCH], &len);
		struct sel_shard_msg d;
		CHECK_OK(sel_shard_decode(b, len, &lim, &d));
		sel_shard_msg_free(&d);
		lim.pages = 10; /* page 10 is the last id of the fetch */
		expect_refused(b, len, &lim, "page id 10 out of range (this rank has 10)");
		lim.pages = 11;
		lim.slots = 3;
		expect_refused(b, len, &lim, "state slot 3 out of range");
		/* A layout of 128-token pages: a 128-token root holds 1 page, not 2. */
		struct test_geo tg;
		uint64_t units[2] = {4096, 100};
		test_geo_init(&tg, 1, 128, 2, units, 5000);
		sel_record_layout lay;
		CHECK_OK(sel_record_layout_init(&lay, &tg.g));
		lim = (struct sel_shard_limits){.sz = &lay.sz};
		expect_refused(b, len, &lim, "full chain");
		sel_record_layout_free(&lay);
		free(b);
	}
	{
		/* A truncate that moves pages; an unlink of two records; a store of
		 * records out of order. */
		uint8_t pb[1024];
		struct sel_wr w = {pb, sizeof pb, 0};
		sel_record_desc d = desc_root();
		sel_wr_u64(&w, 5);
		sel_wr_u32(&w, SEL_SHARD_TRUNCATE);
		sel_wr_u8(&w, 0);
		sel_wr_zeros(&w, 3);
		sel_wr_u32(&w, SEL_SHARD_NO_SLOT);
		sel_wr_u64(&w, 0);
		sel_wr_u64(&w, 0); /* after */
		sel_wr_u32(&w, 1);
		sel_wr_u32(&w, 1);
		sel_wr_key(&w, &d.key);
		sel_wr_key(&w, &d.parent);
		sel_wr_bytes(&w, d.bucket.b, 16);
		sel_wr_u32(&w, d.tail);
		sel_wr_u32(&w, 0);
		sel_wr_u64(&w, 0);
		sel_wr_u32(&w, 0);
		sel_wr_u32(&w, 1);
		sel_wr_u32(&w, 42);
		raw(SEL_SHARD_JOB, &w, NULL, "moves none");
		sel_put_u32(pb + 36, 0);
		w.n -= 4 + 88;
		sel_put_u32(pb + 40, 0);
		raw(SEL_SHARD_JOB, &w, NULL, "records, not 1 to");
	}
	patch(DONE, 0, 8, 0, NULL, "job id");
	patch(DONE, 8, 4, 1, NULL, "status");
	patch(DONE, 12, 4, 0x10, NULL, "unknown bits");
	patch(DRAIN, 4, 1, 1, NULL, "reserved");
	printf("rejections: ok\n");
}

/* The encoder refuses what the decoder would. */
static void test_encoder(void)
{
	struct sel_shard_msg m[16];
	samples(m);
	struct sel_shard_msg x = m[FETCH];
	x.u.job.slot = SEL_SHARD_NO_SLOT;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	x = m[FETCH];
	x.u.job.n_pages = 3;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT && strstr(sel_errmsg(), "page ids for"));
	x = m[ERROR];
	snprintf(x.u.status.text, sizeof x.u.status.text, "two\nlines");
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	sel_shard_text(x.u.status.text, "two\nlines\x7f");
	CHECK(!strcmp(x.u.status.text, "two?lines?"));
	CHECK(sel_shard_encoded_size(&x) > 0);
	char longer[600];
	memset(longer, 'x', sizeof longer - 1);
	longer[sizeof longer - 1] = 0;
	sel_shard_text(x.u.status.text, longer);
	CHECK(strlen(x.u.status.text) == SEL_SHARD_TEXT_MAX);
	x = m[SCAN];
	x.u.scan.n = SEL_SHARD_SCAN_CHUNK + 1;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	x = m[SCAN];
	struct sel_shard_entry bad = entries[0];
	bad.header_bytes = 100;
	x.u.scan.e = &bad;
	x.u.scan.n = 1;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	x = m[HELLO];
	x.u.hello.port = 0;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	x = m[JOIN];
	x.u.join.set.disk_limit = 0;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	x = m[DONE];
	x.u.done.flags = 8;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	x = m[DECIDE];
	uint8_t bad_act = 7;
	x.u.decide.act = &bad_act;
	x.u.decide.n = 1;
	CHECK(sel_shard_encoded_size(&x) == SEL_EFORMAT);
	uint8_t small[16];
	CHECK(sel_shard_encode(&m[FETCH], small, sizeof small) == -ENOBUFS);
	/* The largest jobs fit a frame. */
	static uint32_t many[SEL_SHARD_MAX_PAGES];
	static struct sel_shard_rec chain[SEL_SHARD_MAX_RECS];
	uint64_t c = 0;
	for (uint32_t i = 0; i < SEL_SHARD_MAX_RECS; i++) {
		sel_key prev = i ? chain[i - 1].d.key : (sel_key){0};
		uint32_t tail = i == SEL_SHARD_MAX_RECS - 1 ? SEL_SHARD_MAX_PAGES - 128 * i : 128;
		c += (uint64_t)tail * 64;
		chain[i].d =
			(sel_record_desc){.key = key(c, (uint8_t)i), .parent = prev, .tail = tail};
		chain[i].first = 0;
		chain[i].count = tail;
	}
	x = (struct sel_shard_msg){.type = SEL_SHARD_JOB};
	x.u.job = (struct sel_shard_job){.id = 1,
					 .op = SEL_SHARD_FETCH,
					 .slot = SEL_SHARD_NO_SLOT,
					 .n_recs = SEL_SHARD_MAX_RECS,
					 .recs = chain,
					 .n_pages = SEL_SHARD_MAX_PAGES,
					 .pages = many};
	int64_t n = sel_shard_encoded_size(&x);
	CHECKF(n > 0 && n <= SEL_SHARD_FRAME_HEADER + SEL_SHARD_FRAME_MAX, "%" PRId64 ": %s", n,
	       sel_errmsg());
	uint8_t *b = malloc((size_t)n);
	CHECK(sel_shard_encode(&x, b, (size_t)n) == n);
	struct sel_shard_msg d;
	CHECK_OK(sel_shard_decode(b, (size_t)n, NULL, &d));
	sel_shard_msg_free(&d);
	free(b);
	struct sel_shard_entry *full = calloc(SEL_SHARD_SCAN_CHUNK, sizeof *full);
	for (uint32_t i = 0; i < SEL_SHARD_SCAN_CHUNK; i++)
		full[i] = entries[0];
	x = (struct sel_shard_msg){.type = SEL_SHARD_SCAN};
	x.u.scan = (struct sel_shard_scan){0, SEL_SHARD_SCAN_CHUNK, full};
	n = sel_shard_encoded_size(&x);
	CHECK(n > 0 && n <= SEL_SHARD_FRAME_HEADER + SEL_SHARD_FRAME_MAX);
	free(full);
	printf("encoder: ok\n");
}

static void test_rules(void)
{
	CHECK(sel_shard_status_valid(0) && sel_shard_status_valid(-ENOSPC));
	CHECK(sel_shard_status_valid(SEL_ECORRUPT) && sel_shard_status_valid(SEL_ESTOPPED));
	CHECK(!sel_shard_status_valid(1) && !sel_shard_status_valid(-4096));
	CHECK(!sel_shard_status_valid(SEL_ELAST) && !sel_shard_status_valid(SEL_EBASE + 1 - 4096));
	CHECK(sel_shard_space_status(-ENOSPC) && sel_shard_space_status(-EDQUOT));
	CHECK(!sel_shard_space_status(-EIO) && !sel_shard_space_status(0));
	CHECK(!strcmp(sel_shard_op_name(SEL_SHARD_TRUNCATE), "truncate"));
	CHECK(!strcmp(sel_shard_type_name(SEL_SHARD_DRAINED), "DRAINED"));
	CHECK(!strcmp(sel_shard_type_name(99), "?"));
	/* Addresses: IPv4-mapped IPv6 is IPv4. */
	struct sockaddr_in6 s6 = {.sin6_family = AF_INET6};
	CHECK(inet_pton(AF_INET6, "::ffff:10.1.2.3", &s6.sin6_addr) == 1);
	struct sockaddr_in s4 = {.sin_family = AF_INET};
	CHECK(inet_pton(AF_INET, "10.1.2.3", &s4.sin_addr) == 1);
	struct sel_shard_addr a, b;
	CHECK_OK(sel_shard_addr_from((struct sockaddr *)&s6, &a));
	CHECK_OK(sel_shard_addr_from((struct sockaddr *)&s4, &b));
	CHECK(a.family == 4 && sel_shard_addr_eq(&a, &b));
	char t[64];
	CHECK(!strcmp(sel_shard_addr_text(&a, t), "10.1.2.3"));
	CHECK(inet_pton(AF_INET6, "fd00::7", &s6.sin6_addr) == 1);
	CHECK_OK(sel_shard_addr_from((struct sockaddr *)&s6, &a));
	CHECK(a.family == 6 && !sel_shard_addr_eq(&a, &b));
	CHECK(!strcmp(sel_shard_addr_text(&a, t), "fd00::7"));
	struct sockaddr un = {.sa_family = AF_UNIX};
	CHECK(sel_shard_addr_from(&un, &a) == -EAFNOSUPPORT);

	/* A rank's fingerprint covers its geometry, its rank and the world. */
	struct test_geo tg;
	uint64_t units[2] = {4096, 100};
	test_geo_init(&tg, 2, 64, 2, units, 5000);
	uint8_t f[6][SEL_FINGERPRINT_BYTES], again[SEL_FINGERPRINT_BYTES];
	sel_shard_rank_fingerprint(&tg.rank[0], 64, 0, 2, f[0]);
	sel_shard_rank_fingerprint(&tg.rank[1], 64, 1, 2, f[1]);  /* same geometry, rank 1 */
	sel_shard_rank_fingerprint(&tg.rank[1], 64, 1, 4, f[2]);  /* world 4 */
	sel_shard_rank_fingerprint(&tg.rank[1], 128, 1, 2, f[3]); /* page tokens */
	tg.planes[1][1].unit_bytes = 101;
	sel_shard_rank_fingerprint(&tg.rank[1], 64, 1, 2, f[4]); /* a plane's size */
	tg.planes[1][1].unit_bytes = 100;
	tg.rank[1].row.unit_bytes = 5001;
	sel_shard_rank_fingerprint(&tg.rank[1], 64, 1, 2, f[5]); /* the row's */
	for (int i = 0; i < 6; i++)
		for (int k = i + 1; k < 6; k++)
			CHECKF(memcmp(f[i], f[k], SEL_FINGERPRINT_BYTES), "fingerprints %d and %d",
			       i, k);
	tg.rank[1].row.unit_bytes = 5000;
	sel_shard_rank_fingerprint(&tg.rank[1], 64, 1, 2, again);
	CHECK(!memcmp(again, f[1], SEL_FINGERPRINT_BYTES));
	uint8_t whole[SEL_FINGERPRINT_BYTES];
	sel_layout_fingerprint(&tg.g, whole); /* the one-process namespace is another */
	CHECK(memcmp(whole, f[0], SEL_FINGERPRINT_BYTES) &&
	      memcmp(whole, f[1], SEL_FINGERPRINT_BYTES));
	printf("rules: ok\n");
}

static int write_corpus(const char *dir)
{
	mkdir(dir, 0755);
	struct sel_shard_msg m[16];
	int n = samples(m);
	char path[4096];
	FILE *stream;
	snprintf(path, sizeof path, "%s/stream-all", dir);
	CHECK((stream = fopen(path, "wb")) != NULL);
	for (int i = 0; i < n; i++) {
		size_t len;
		uint8_t *b = enc(&m[i], &len);
		snprintf(path, sizeof path, "%s/%02d-%s", dir, i + 1,
			 sel_shard_type_name(m[i].type));
		FILE *f = fopen(path, "wb");
		CHECK(f && fwrite(b, 1, len, f) == len && fclose(f) == 0);
		CHECK(fwrite(b, 1, len, stream) == len);
		/* The typed form the fuzzer's second reading takes: type, payload. */
		snprintf(path, sizeof path, "%s/t%02d-%s", dir, i + 1,
			 sel_shard_type_name(m[i].type));
		f = fopen(path, "wb");
		uint8_t t = (uint8_t)m[i].type;
		CHECK(f && fwrite(&t, 1, 1, f) == 1);
		CHECK(fwrite(b + SEL_SHARD_FRAME_HEADER, 1, len - SEL_SHARD_FRAME_HEADER, f) ==
			      len - SEL_SHARD_FRAME_HEADER &&
		      fclose(f) == 0);
		free(b);
	}
	CHECK(fclose(stream) == 0);
	printf("wrote %d frames to %s\n", n, dir);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--write-corpus"))
		return write_corpus(argv[2]);
	test_round_trips();
	test_rejections();
	test_encoder();
	test_rules();
	printf("ok\n");
	return 0;
}
