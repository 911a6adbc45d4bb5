/*
 * test_ranks_proto.c - the execution protocol's frames (src/helios/
 * ranks_proto.c): every frame round-trips byte for byte; every truncation,
 * a trailing byte, an unknown type or operation, non-zero reserved bytes,
 * counts over their limits or beyond the bytes present, and a text with a
 * control byte are refused with a message naming the field; the encoder
 * refuses what the decoder would.
 *
 * `test_ranks_proto --write-corpus DIR` writes the sample frames as the
 * seed corpus of fuzz/fuzz_ranks.c (fuzz/corpus/ranks/).
 */
#include <sys/stat.h>

#include "eos.h"
#include "helios/ranks_proto.h"
#include "testutil.h"

static uint32_t pages[5] = {7, 3, 9, 1, 0};
static uint32_t words[6] = {'h', 'e', 'l', 'l', 'o', 10};
static uint64_t sums[3] = {1, UINT64_MAX, 42};

static int samples(struct hel_rp_msg *m)
{
	int n = 0;
	m[n] = (struct hel_rp_msg){.type = HEL_RP_JOIN, .join = {.world = 4, .rank = 3}};
	memset(m[n++].join.identity, 0xab, SEL_IDENTITY_BYTES);
	m[n++] = (struct hel_rp_msg){.type = HEL_RP_START, .start = {0, 1366, 311}};
	m[n] = (struct hel_rp_msg){.type = HEL_RP_READY};
	memset(m[n++].ready.fingerprint, 0x5c, HEL_RP_FP_BYTES);
	m[n++] = (struct hel_rp_msg){.type = HEL_RP_CALL,
				     .call = {.op = HEL_TP_PREFILL,
					      .slot = 2,
					      .pages = pages,
					      .n_pages = 5,
					      .words = words,
					      .n_words = 6,
					      .n = 6}};
	m[n++] = (struct hel_rp_msg){.type = HEL_RP_CALL,
				     .call = {.op = HEL_TP_STEP,
					      .slot = 1,
					      .arg = 12,
					      .value = 'x',
					      .pages = pages,
					      .n_pages = 2}};
	m[n++] = (struct hel_rp_msg){.type = HEL_RP_CALL,
				     .call = {.op = HEL_TP_ROW_LOADED, .slot = 3, .value = 640}};
	m[n++] = (struct hel_rp_msg){.type = HEL_RP_PART, .sum = {3, sums}};
	m[n++] = (struct hel_rp_msg){.type = HEL_RP_SUM, .sum = {1, sums}};
	m[n] = (struct hel_rp_msg){.type = HEL_RP_ERROR, .error = {.status = -71}};
	snprintf(m[n++].error.text, sizeof m[0].error.text, "rank 1 runs another core");
	m[n++] = (struct hel_rp_msg){.type = HEL_RP_BYE};
	m[n] = (struct hel_rp_msg){.type = HEL_RP_STORE, .store = {.n = 77}};
	memset(m[n++].store.b, 0x3c, 77); /* the rank links' HELLO, opaque here */
	return n;
}

static uint8_t *encode(const struct hel_rp_msg *m, size_t *len)
{
	int64_t n = hel_rp_encode(m, NULL, 0);
	CHECKF(n > 0, "encode %s: %s", hel_rp_type_name(m->type), eos_errmsg());
	uint8_t *b = malloc((size_t)n);
	CHECK(hel_rp_encode(m, b, (size_t)n) == n);
	*len = (size_t)n;
	return b;
}

static void test_round_trips(void)
{
	struct hel_rp_msg m[16];
	int n = samples(m);
	for (int i = 0; i < n; i++) {
		size_t len;
		uint8_t *b = encode(&m[i], &len);
		struct hel_rp_msg d;
		CHECKF(hel_rp_decode(b, len, &d) == 0, "%s: %s", hel_rp_type_name(m[i].type),
		       eos_errmsg());
		size_t len2;
		uint8_t *b2 = encode(&d, &len2);
		CHECK(len2 == len && !memcmp(b, b2, len));
		if (d.type == HEL_RP_CALL)
			CHECK(d.call.n_pages == m[i].call.n_pages && d.call.n == m[i].call.n);
		hel_rp_free(&d);
		/* Every truncation and one byte more are refused. */
		for (size_t cut = 0; cut < len; cut++) {
			CHECK(hel_rp_decode(b, cut, &d) != 0);
			hel_rp_free(&d);
		}
		uint8_t *more = malloc(len + 1);
		memcpy(more, b, len);
		more[len] = 0;
		more[0]++; /* the header counts it */
		CHECK_RC(hel_rp_decode(more, len + 1, &d), SEL_EFORMAT);
		CHECK(strstr(eos_errmsg(), "after the last field"));
		hel_rp_free(&d);
		free(more);
		free(b);
		free(b2);
	}
}

static void refused(const uint8_t *b, size_t len, const char *want)
{
	struct hel_rp_msg d;
	CHECK_RC(hel_rp_decode(b, len, &d), SEL_EFORMAT);
	CHECKF(strstr(eos_errmsg(), want), "'%s' does not say '%s'", eos_errmsg(), want);
	hel_rp_free(&d);
}

static void test_rejections(void)
{
	struct hel_rp_msg m[16];
	samples(m);
	size_t len;
	uint8_t *b = encode(&m[3], &len); /* CALL PREFILL */
	b[4] = 99;
	refused(b, len, "unknown type");
	b[4] = HEL_RP_CALL;
	b[6] = 1;
	refused(b, len, "reserved header bytes");
	b[6] = 0;
	b[8] = 0x55; /* op */
	refused(b, len, "op: unknown operation");
	b[8] = HEL_TP_PREFILL;
	b[10] = 1;
	refused(b, len, "reserved");
	b[10] = 0;
	/* The page count over what the payload holds. */
	size_t at = HEL_RP_HEADER + 2 + 2 + 4 + 4 + 8 + 4;
	b[at] = 200;
	refused(b, len, "pages");
	b[at] = 5;
	b[at + 3] = 0x7f; /* a count over its limit */
	refused(b, len, "count over its limit");
	free(b);
	uint32_t huge = HEL_RP_FRAME_MAX + 1;
	uint8_t h[HEL_RP_HEADER] = {0};
	memcpy(h, &huge, 4);
	h[4] = HEL_RP_BYE;
	uint16_t t;
	uint32_t pl;
	CHECK_RC(hel_rp_header(h, sizeof h, &t, &pl), SEL_EFORMAT);
	CHECK(strstr(eos_errmsg(), "at most"));
	b = encode(&m[0], &len); /* JOIN: the magic */
	b[HEL_RP_HEADER] ^= 1;
	refused(b, len, "magic");
	free(b);
	b = encode(&m[8], &len); /* ERROR: a control byte */
	b[len - 1] = '\n';
	refused(b, len, "control byte");
	free(b);
	b = encode(&m[10], &len); /* STORE: a length over its bound, or none */
	uint32_t big = HEL_RP_STORE_MAX + 1;
	memcpy(b + HEL_RP_HEADER, &big, 4);
	refused(b, len, "not 1..1024");
	memset(b + HEL_RP_HEADER, 0, 4);
	refused(b, len, "not 1..1024");
	free(b);
}

static void test_encoder(void)
{
	struct hel_rp_msg e = {.type = HEL_RP_ERROR};
	snprintf(e.error.text, sizeof e.error.text, "a\tb");
	CHECK_RC(hel_rp_encode(&e, NULL, 0), -EINVAL);
	struct hel_rp_msg c = {.type = HEL_RP_CALL, .call = {.op = 0}};
	CHECK_RC(hel_rp_encode(&c, NULL, 0), -EINVAL);
	c.call.op = HEL_TP_STEP;
	c.call.n_pages = 3; /* no pages */
	CHECK_RC(hel_rp_encode(&c, NULL, 0), -EINVAL);
	struct hel_rp_msg s = {.type = HEL_RP_SUM, .sum = {HEL_RP_MAX_SUM + 1, sums}};
	CHECK_RC(hel_rp_encode(&s, NULL, 0), -EINVAL);
	struct hel_rp_msg u = {.type = 0};
	CHECK_RC(hel_rp_encode(&u, NULL, 0), -EINVAL);
	struct hel_rp_msg st = {.type = HEL_RP_STORE, .store = {.n = 0}};
	CHECK_RC(hel_rp_encode(&st, NULL, 0), -EINVAL);
	st.store.n = HEL_RP_STORE_MAX + 1;
	CHECK_RC(hel_rp_encode(&st, NULL, 0), -EINVAL);
}

static int write_corpus(const char *dir)
{
	struct hel_rp_msg m[16];
	int n = samples(m);
	mkdir(dir, 0755);
	for (int i = 0; i < n; i++) {
		size_t len;
		uint8_t *b = encode(&m[i], &len);
		char path[4096];
		snprintf(path, sizeof path, "%s/%02d-%s", dir, i, hel_rp_type_name(m[i].type));
		FILE *f = fopen(path, "wb");
		CHECK(f && fwrite(b, 1, len, f) == len);
		fclose(f);
		free(b);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--write-corpus"))
		return write_corpus(argv[2]);
	test_round_trips();
	test_rejections();
	test_encoder();
	printf("ok\n");
	return 0;
}
