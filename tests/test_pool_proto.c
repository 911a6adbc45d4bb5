/*
 * test_pool_proto.c - the pool protocol's pure encode/decode and shared
 * rules (src/selene/pool_proto.c; design 2.15; docs/pool.md "Protocol").
 *
 *   - every message type round-trips field by field, and re-encodes to the
 *     same bytes;
 *   - every truncation, a trailing byte, non-zero padding, values out of
 *     range, counts over their limits or over the payload, unknown types and
 *     a non-zero reserved header field are refused with SEL_EFORMAT;
 *   - the window rule: alignment, bounds, overlap, counts, order;
 *   - restore deadlines, scope ids and instance ids.
 *
 * `test_pool_proto --write-corpus DIR` writes the sample frames as the
 * seed corpus of fuzz/fuzz_pool_proto.c (fuzz/corpus/pool_proto/).
 */
#include <sys/stat.h>

#include "internal.h"
#include "pool_proto.h"
#include "testutil.h"

static sel_key key(uint64_t c, uint8_t fill)
{
	sel_key k = {.consumed = c};
	memset(k.digest.b, fill, SEL_DIGEST_BYTES);
	return k;
}

static struct sel_pool_window wins[3] = {{65536, 3, 0}, {65536 + 4 * 8192, 1, 0}, {1 << 20, 2, 1}};
static struct sel_pool_holding holds[2];
static struct sel_pool_anode anodes[3];
static struct sel_pool_candidate cands[2];
static struct sel_pool_gnode gnodes[2];
static uint64_t cks[4] = {1, 2, 3, 0xffffffffffffffffull};
static sel_digest bounds[3];
static uint8_t table[24] = {1, 0, 0, 0, 0, 0,  0, 0, 200, 0, 0, 0,
			    0, 0, 0, 0, 0, 16, 0, 0, 0,   0, 0, 0};

/* One sample of every type. */
static int samples(struct sel_pool_msg *m)
{
	int n = 0;
	holds[0] = (struct sel_pool_holding){SEL_POOL_SRC_GPU, key(640, 1), {{9}}, 77};
	holds[1] = (struct sel_pool_holding){SEL_POOL_SRC_NVME, key(64, 2), {{8}}, 78};
	anodes[0] = (struct sel_pool_anode){key(1000, 3), 5, 1, 1};
	anodes[1] = (struct sel_pool_anode){key(700, 4), 10, SEL_POOL_NONE, 1};
	anodes[2] = (struct sel_pool_anode){key(1000, 3), 15, SEL_POOL_NONE, 1};
	cands[0] = (struct sel_pool_candidate){SEL_POOL_SRC_GPU, 2, 0, 5, {1, 2, 3}, 4096};
	cands[1] = (struct sel_pool_candidate){SEL_POOL_SRC_ARENA, 0, 0, 0, {0}, 8192};
	gnodes[0] = (struct sel_pool_gnode){key(700, 4), key(0, 0), {{5}}, 10, 2, 0};
	gnodes[1] = (struct sel_pool_gnode){key(1000, 3), key(700, 4), {{6}}, 5, 2, 1};
	for (int i = 0; i < 3; i++)
		memset(bounds[i].b, 0x40 + i, SEL_DIGEST_BYTES);

	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_HELLO};
	m[n].u.m_hello = (struct sel_pool_m_hello){SEL_POOL_VERSION,
						   0x1122334455667788ull,
						   64 << 20,
						   65536,
						   4 << 20,
						   16,
						   16,
						   16,
						   8,
						   30000,
						   3000,
						   0,
						   "team-a"};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_WELCOME};
	m[n].u.welcome = (struct sel_pool_m_welcome){SEL_POOL_OK, 42, 1, "hi"};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_ANSWER};
	m[n].u.answer = (struct sel_pool_m_answer){9, 3, 2, anodes, cands};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_CLAIM_GRANT};
	m[n].u.grant = (struct sel_pool_m_claim_grant){
		5, 6, 7, 11000, SEL_POOL_SRC_ARENA, 512, 2, 3, 4, gnodes, wins, cks, 99};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_CLAIM_REFUSED};
	m[n].u.refused = (struct sel_pool_m_refused){5, SEL_POOL_CHAIN_GAP};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_PUT_GRANT};
	m[n].u.put_grant = (struct sel_pool_m_put_grant){8, 9, 10, 12000, 3, wins};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_PUT_REFUSED};
	m[n].u.refused = (struct sel_pool_m_refused){8, SEL_POOL_PRESENT};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_PUT_RESULT};
	m[n].u.ls = (struct sel_pool_lease_status){9, 10, SEL_POOL_OK};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_EXPORT_REQUEST};
	m[n].u.export_req = (struct sel_pool_m_export_request){
		11, 12, 13000, SEL_POOL_SRC_DRAM, key(1000, 3), 3, 8, 4, 1, 3, wins};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_EXPORT_CANCEL};
	m[n].u.ls = (struct sel_pool_lease_status){11, 12, SEL_POOL_GONE};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_LEASE_FAILED};
	m[n].u.ls = (struct sel_pool_lease_status){11, 12, SEL_POOL_NO_PROGRESS};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_M_ERROR};
	m[n].u.error = (struct sel_pool_m_error){SEL_POOL_FORGED, SEL_POOL_C_RELEASE, 0, "lease 3"};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_HELLO};
	m[n].u.c_hello.version = SEL_POOL_VERSION;
	m[n].u.c_hello.flags = SEL_POOL_HELLO_DRAINED;
	memset(m[n].u.c_hello.instance, 0x5a, SEL_POOL_ID_BYTES);
	m[n].u.c_hello.generation = 0x1122334455667788ull;
	memset(m[n].u.c_hello.scope.identity, 1, SEL_IDENTITY_BYTES);
	memset(m[n].u.c_hello.scope.fingerprint, 2, SEL_FINGERPRINT_BYTES);
	m[n].u.c_hello.scope.page_tokens = 64;
	m[n].u.c_hello.scope.ranks = 1;
	m[n].u.c_hello.scope.slot_bytes = 8192;
	m[n].u.c_hello.scope.row_slots = 1;
	m[n].u.c_hello.scope.table_bytes = sizeof table;
	m[n].u.c_hello.scope.table = table;
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_ANNOUNCE};
	m[n].u.holdings = (struct sel_pool_c_holdings){2, holds};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_WITHDRAW};
	m[n].u.holdings = (struct sel_pool_c_holdings){2, holds};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_RESET};
	m[n].u.reset.sources = 1u << SEL_POOL_SRC_GPU | 1u << SEL_POOL_SRC_DRAM;
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_LOOKUP};
	m[n].u.lookup = (struct sel_pool_c_lookup){13, 64, 200, 3, 3, bounds};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_CLAIM};
	m[n].u.claim = (struct sel_pool_c_claim){
		14, SEL_POOL_SRC_GPU, {7, 7}, 77, key(640, 1), 128, 10000};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_RELEASE};
	m[n].u.ls = (struct sel_pool_lease_status){6, 7, SEL_POOL_CORRUPT};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_PROGRESS};
	m[n].u.progress = (struct sel_pool_c_progress){6, 7, 2};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_PUT};
	m[n].u.put = (struct sel_pool_c_put){15, key(1000, 3), key(700, 4), {{6}}, 5, 1, 10000};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_COMMIT};
	m[n].u.cksums = (struct sel_pool_c_cksums){9, 10, 0, 4, cks, 55};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_EXPORT_REPLY};
	m[n].u.ls = (struct sel_pool_lease_status){11, 12, SEL_POOL_NO_HEADROOM};
	n++;
	m[n] = (struct sel_pool_msg){.type = SEL_POOL_C_EXPORT_DONE};
	m[n].u.cksums = (struct sel_pool_c_cksums){11, 12, SEL_POOL_OK, 4, cks, 66};
	n++;
	return n;
}

static uint8_t *enc(const struct sel_pool_msg *m, size_t *len)
{
	int64_t n = sel_pool_encoded_size(m);
	CHECKF(n > 0, "%s: %s", sel_pool_type_name(m->type), sel_errmsg());
	uint8_t *b = malloc((size_t)n);
	CHECK(sel_pool_encode(m, b, (size_t)n) == n);
	CHECK(sel_pool_encode(m, b, (size_t)n - 1) == -ENOBUFS);
	*len = (size_t)n;
	return b;
}

static void test_round_trips(void)
{
	struct sel_pool_msg m[32];
	int n = samples(m);
	CHECK(n == 24);
	for (int i = 0; i < n; i++) {
		size_t len;
		uint8_t *b = enc(&m[i], &len);
		struct sel_pool_msg d;
		CHECK_OK(sel_pool_decode(b, len, &d));
		CHECK(d.type == m[i].type);
		size_t len2;
		uint8_t *b2 = enc(&d, &len2);
		CHECKF(len2 == len && !memcmp(b, b2, len), "%s does not re-encode to itself",
		       sel_pool_type_name(m[i].type));
		uint16_t t;
		uint32_t pl;
		CHECK_OK(sel_pool_frame_header(b, len, &t, &pl));
		CHECK(t == m[i].type && pl + SEL_POOL_FRAME_HEADER == len);
		/* Every truncation and one trailing byte fail. */
		for (size_t k = 0; k < len; k++)
			CHECK_RC(sel_pool_decode(b, k, &(struct sel_pool_msg){0}), SEL_EFORMAT);
		uint8_t *x = malloc(len + 1);
		memcpy(x, b, len);
		x[len] = 0;
		sel_put_u32(x, pl + 1);
		CHECK_RC(sel_pool_decode(x, len + 1, &(struct sel_pool_msg){0}), SEL_EFORMAT);
		free(x);
		sel_pool_msg_free(&d);
		free(b);
		free(b2);
	}
	/* Field spot checks. */
	size_t len;
	uint8_t *b = enc(&m[3], &len);
	struct sel_pool_msg d;
	CHECK_OK(sel_pool_decode(b, len, &d));
	CHECK(d.u.grant.n_nodes == 2 && d.u.grant.nodes[1].has_row == 1 &&
	      sel_key_eq(&d.u.grant.nodes[1].parent, &gnodes[0].key));
	CHECK(d.u.grant.n_windows == 3 && d.u.grant.windows[2].kind == SEL_POOL_WIN_ROW &&
	      d.u.grant.windows[1].off == 65536 + 4 * 8192);
	CHECK(d.u.grant.page_cksum[3] == cks[3] && d.u.grant.row_cksum == 99 &&
	      d.u.grant.base == 512);
	sel_pool_msg_free(&d);
	free(b);
	b = enc(&m[12], &len);
	CHECK_OK(sel_pool_decode(b, len, &d));
	CHECK(d.u.c_hello.scope.table_bytes == sizeof table &&
	      !memcmp(d.u.c_hello.scope.table, table, sizeof table) &&
	      d.u.c_hello.scope.slot_bytes == 8192);
	sel_pool_msg_free(&d);
	free(b);
	b = enc(&m[2], &len);
	CHECK_OK(sel_pool_decode(b, len, &d));
	CHECK(d.u.answer.n_cands == 2 && d.u.answer.cands[0].holder[2] == 3 &&
	      d.u.answer.nodes[0].up == 1 && d.u.answer.nodes[1].up == SEL_POOL_NONE);
	sel_pool_msg_free(&d);
	free(b);
	/* A hello of another version carries only its version. */
	struct sel_pool_msg h = {.type = SEL_POOL_C_HELLO};
	h.u.c_hello.version = 7;
	b = enc(&h, &len);
	CHECK(len == SEL_POOL_FRAME_HEADER + 8);
	CHECK_OK(sel_pool_decode(b, len, &d));
	CHECK(d.u.c_hello.version == 7);
	free(b);
}

/* Decode b after patching byte at (payload offset) off with v. */
static int patched(const struct sel_pool_msg *m, size_t off, uint8_t v)
{
	size_t len;
	uint8_t *b = enc(m, &len);
	CHECK(SEL_POOL_FRAME_HEADER + off < len);
	b[SEL_POOL_FRAME_HEADER + off] = v;
	struct sel_pool_msg d;
	int rc = sel_pool_decode(b, len, &d);
	if (!rc)
		sel_pool_msg_free(&d);
	free(b);
	return rc;
}

static void test_rejections(void)
{
	struct sel_pool_msg m[32];
	samples(m);
	/* Header: reserved field, unknown type, oversized payload. */
	uint8_t h[8] = {0, 0, 0, 0, SEL_POOL_C_RESET, 0, 1, 0};
	uint16_t t;
	uint32_t pl;
	CHECK_RC(sel_pool_frame_header(h, 8, &t, &pl), SEL_EFORMAT);
	h[6] = 0;
	h[4] = 0x77;
	CHECK_RC(sel_pool_frame_header(h, 8, &t, &pl), SEL_EFORMAT);
	h[4] = SEL_POOL_C_RESET;
	sel_put_u32(h, SEL_POOL_FRAME_MAX + 1);
	CHECK_RC(sel_pool_frame_header(h, 8, &t, &pl), SEL_EFORMAT);
	CHECK_RC(sel_pool_frame_header(h, 7, &t, &pl), -EAGAIN);
	/* Window padding (grant: window 0 at payload offset 8+8+8+4+1+3+8+4 +
	 * 2 nodes * 80 + 4 = 204, so 208, its kind at +12, padding at +13). */
	CHECK_OK(patched(&m[3], 208 + 12, 1));
	CHECK_RC(patched(&m[3], 208 + 12, 2), SEL_EFORMAT);
	CHECK_RC(patched(&m[3], 208 + 13, 1), SEL_EFORMAT);
	/* Grant: source out of range (offset 28), node has_row 2 (node 0 at 44, +72). */
	CHECK_RC(patched(&m[3], 28, SEL_POOL_SOURCES), SEL_EFORMAT);
	CHECK_RC(patched(&m[3], 44 + 72, 2), SEL_EFORMAT);
	/* Grant: node pages no longer sum to n_pages (node 0 pages at 44+68). */
	CHECK_RC(patched(&m[3], 44 + 68, 3), SEL_EFORMAT);
	/* Refusal reason out of range. */
	CHECK_RC(patched(&m[4], 8, SEL_POOL_REASONS), SEL_EFORMAT);
	/* Announce: source arena (entry 0 at 4), padding. */
	CHECK_RC(patched(&m[13], 4, SEL_POOL_SRC_ARENA), SEL_EFORMAT);
	CHECK_RC(patched(&m[13], 5, 1), SEL_EFORMAT);
	/* Withdraw: a bucket that is not zero (entry 0 bucket at 4+32). */
	CHECK_RC(patched(&m[14], 4 + 32, 1), SEL_EFORMAT);
	/* Reset: an unknown source bit (bit 0 is the arena). */
	CHECK_RC(patched(&m[15], 0, 1), SEL_EFORMAT);
	/* Lookup: more boundaries than k_hi + 1 (k_hi at 24). */
	CHECK_RC(patched(&m[16], 24, 1), SEL_EFORMAT);
	/* Commit: status not 0 (at 16). */
	CHECK_RC(patched(&m[21], 16, 1), SEL_EFORMAT);
	/* Answer: node up beyond the nodes (node 0 up at 12+28), candidate node (cands at 12+120+4, node at +4). */
	CHECK_RC(patched(&m[2], 12 + 28, 9), SEL_EFORMAT);
	CHECK_RC(patched(&m[2], 12 + 120 + 4 + 4, 9), SEL_EFORMAT);
	/* Hellos: magic; an unknown flag bit (at 8). */
	CHECK_RC(patched(&m[0], 0, 'X'), SEL_EFORMAT);
	CHECK_RC(patched(&m[12], 8, 0x80), SEL_EFORMAT);
	/* Error text with a control byte (text at 8 + 2). */
	CHECK_RC(patched(&m[11], 10, 0x07), SEL_EFORMAT);
	/* Counts over their limits, or over the payload. */
	struct sel_pool_msg big = {.type = SEL_POOL_C_ANNOUNCE};
	big.u.holdings.n = SEL_POOL_MAX_HOLDINGS + 1;
	big.u.holdings.h = holds;
	CHECK_RC(sel_pool_encoded_size(&big), SEL_EFORMAT);
	size_t len;
	uint8_t *b = enc(&m[13], &len);
	sel_put_u32(b + SEL_POOL_FRAME_HEADER, 3); /* says 3, holds 2 */
	CHECK_RC(sel_pool_decode(b, len, &(struct sel_pool_msg){0}), SEL_EFORMAT);
	sel_put_u32(b + SEL_POOL_FRAME_HEADER, 0xffffffffu);
	CHECK_RC(sel_pool_decode(b, len, &(struct sel_pool_msg){0}), SEL_EFORMAT);
	free(b);
	/* A string longer than allowed does not encode. */
	struct sel_pool_msg e = {.type = SEL_POOL_M_ERROR};
	memset(e.u.error.text, 'a', SEL_POOL_TEXT_MAX);
	CHECK(sel_pool_encoded_size(&e) > 0);
	/* A payload over the frame limit does not encode. */
	static uint64_t many[SEL_POOL_MAX_PAGES];
	struct sel_pool_msg c = {.type = SEL_POOL_C_COMMIT};
	c.u.cksums.n = SEL_POOL_MAX_PAGES;
	c.u.cksums.page_cksum = many;
	CHECK(sel_pool_encoded_size(&c) > 0); /* 512 KiB: fits */
	CHECK(strcmp(sel_pool_reason_name(SEL_POOL_NO_HEADROOM), "no_headroom") == 0);
	CHECK(strcmp(sel_pool_reason_name(SEL_POOL_REASONS), "?") == 0);
	CHECK(strcmp(sel_pool_source_name(SEL_POOL_SRC_GPU), "gpu") == 0);
}

static void test_windows(void)
{
	const uint64_t A = 1 << 20, D = 65536, S = 8192;
	struct sel_pool_window ok[] = {{D, 2, 0}, {D + 4 * S, 1, 0}, {D + 2 * S, 1, 1}};
	CHECK_OK(sel_pool_windows_check(ok, 3, A, D, S, 3, 1));
	CHECK_RC(sel_pool_windows_check(ok, 3, A, D, S, 2, 1), SEL_EFORMAT); /* page count */
	CHECK_RC(sel_pool_windows_check(ok, 3, A, D, S, 3, 2), SEL_EFORMAT); /* row count */
	struct sel_pool_window over[] = {{D, 2, 0}, {D + S, 1, 0}};
	CHECK_RC(sel_pool_windows_check(over, 2, A, D, S, 3, 0), SEL_EFORMAT); /* overlap */
	struct sel_pool_window mis[] = {{D + 4096, 1, 0}};
	CHECK_RC(sel_pool_windows_check(mis, 1, A, D, S, 1, 0), SEL_EFORMAT); /* not a slot */
	struct sel_pool_window low[] = {{0, 1, 0}};
	CHECK_RC(sel_pool_windows_check(low, 1, A, D, S, 1, 0), SEL_EFORMAT); /* the header */
	struct sel_pool_window high[] = {{A - S, 2, 0}};
	CHECK_RC(sel_pool_windows_check(high, 1, A, D, S, 2, 0), SEL_EFORMAT); /* past the end */
	struct sel_pool_window far[] = {{UINT64_MAX - S + 1, 1, 0}};
	CHECK_RC(sel_pool_windows_check(far, 1, A, D, S, 1, 0), SEL_EFORMAT);
	struct sel_pool_window order[] = {{D, 1, 1}, {D + S, 1, 0}};
	CHECK_RC(sel_pool_windows_check(order, 2, A, D, S, 1, 1),
		 SEL_EFORMAT); /* pages after the row */
	struct sel_pool_window empty[] = {{D, 0, 0}};
	CHECK_RC(sel_pool_windows_check(empty, 1, A, D, S, 0, 0), SEL_EFORMAT);
	CHECK_RC(sel_pool_windows_check(ok, 3, A, D, 1000, 3, 1), SEL_EFORMAT); /* slot size */
	CHECK_OK(sel_pool_windows_check(NULL, 0, A, D, S, 0, 0));
}

static void test_rules(void)
{
	CHECK(sel_pool_deadline_ms(10000, 30000, 0) == 10000);
	CHECK(sel_pool_deadline_ms(10000, 30000, 8ull << 20) == 11000);
	CHECK(sel_pool_deadline_ms(60000, 30000, 16ull << 20) == 32000); /* clamped setup */
	CHECK(sel_pool_deadline_ms(0, 30000, 1) == 1);                   /* rounds up */
	CHECK(sel_pool_deadline_ms(10000, 30000, UINT64_MAX) == UINT32_MAX);
	struct sel_pool_msg m[32];
	samples(m);
	struct sel_pool_scope s = m[12].u.c_hello.scope, t = s;
	uint8_t a[16], b[16];
	sel_pool_scope_id("p", &s, a);
	sel_pool_scope_id("p", &t, b);
	CHECK(!memcmp(a, b, 16));
	t.fingerprint[3] ^= 1;
	sel_pool_scope_id("p", &t, b);
	CHECK(memcmp(a, b, 16)); /* another layout: another scope */
	sel_pool_scope_id("q", &s, b);
	CHECK(memcmp(a, b, 16)); /* another pool name */
	t = s;
	t.slot_bytes += 4096;
	sel_pool_scope_id("p", &t, b);
	CHECK(memcmp(a, b, 16));
	uint8_t core[32] = {1};
	sel_pool_instance_id("p", NULL, "m1", core, "127.0.0.1:8000", a);
	sel_pool_instance_id("p", "", "m1", core, "127.0.0.1:8000", b);
	CHECK(!memcmp(a, b, 16)); /* stable */
	sel_pool_instance_id("p", NULL, "m1", core, "127.0.0.1:8001", b);
	CHECK(memcmp(a, b, 16));
	sel_pool_instance_id("p", NULL, "m2", core, "127.0.0.1:8000", b);
	CHECK(memcmp(a, b, 16));
	sel_pool_instance_id("other", NULL, "m1", core, "127.0.0.1:8000", b);
	CHECK(memcmp(a, b, 16));
	sel_pool_instance_id("p", "replica-7", "m1", core, "127.0.0.1:8000", a);
	sel_pool_instance_id("p", "replica-7", "m9", NULL, "x", b);
	CHECK(!memcmp(a, b, 16)); /* an explicit id ignores the rest */
}

static int write_corpus(const char *dir)
{
	struct sel_pool_msg m[32];
	int n = samples(m);
	mkdir(dir, 0755);
	for (int i = 0; i < n; i++) {
		size_t len;
		uint8_t *b = enc(&m[i], &len);
		char path[4096];
		snprintf(path, sizeof path, "%s/%02d-%s", dir, i + 1,
			 sel_pool_type_name(m[i].type));
		FILE *f = fopen(path, "wb");
		CHECK(f && fwrite(b, 1, len, f) == len && !fclose(f));
		free(b);
	}
	printf("wrote %d frames to %s\n", n, dir);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--write-corpus"))
		return write_corpus(argv[2]);
	test_round_trips();
	test_rejections();
	test_windows();
	test_rules();
	printf("ok\n");
	return 0;
}
