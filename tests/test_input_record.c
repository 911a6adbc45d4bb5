/*
 * test_input_record.c - the .input record format (src/selene/input_record.c,
 * docs/record-format.md "Input records"): round trips of both kinds, a
 * known answer, canonical headers, rejection of every corrupted, truncated,
 * extended and foreign file, the structural rules behind the checksum,
 * names, and the identities of input_key.c (docs/identity.md).
 *
 *   test_input_record --write-corpus DIR   writes fuzz/corpus/input_record/
 */
#include <sys/stat.h>
#include "xxh.h"

#include "input_key.h"
#include "input_record.h"
#include "internal.h"
#include "testutil.h"

#include <sodium.h>

/* docs/identity.md: the source key of ("png", "abc", "s") */
#define KA_SOURCE "636cf6eb53bace60c82d13f308ff0408a69977032765842ab04929037e2d6d50"

static sel_input_key key_of(uint8_t seed)
{
	sel_input_key k;
	for (int i = 0; i < SEL_INPUT_KEY_BYTES; i++)
		k.b[i] = (uint8_t)(seed * 31 + i);
	return k;
}

/* A prepared record with three tensors of fixed contents. */
static void build(sel_input_rec *r, uint64_t created)
{
	sel_input_tensor t[3] = {0};
	strcpy(t[0].name, "pixels");
	t[0].dtype = SEL_DT_U8;
	t[0].rank = 2;
	t[0].dims[0] = 5;
	t[0].dims[1] = 13;
	strcpy(t[1].name, "grid");
	t[1].dtype = SEL_DT_U32;
	t[1].rank = 1;
	t[1].dims[0] = 2;
	strcpy(t[2].name, "scale.f32");
	t[2].dtype = SEL_DT_F32;
	t[2].rank = 3;
	t[2].dims[0] = 2;
	t[2].dims[1] = 3;
	t[2].dims[2] = 4;
	sel_input_key id = key_of(7);
	CHECK_OK(sel_input_prepared_init(r, &id, t, 3));
	for (uint32_t i = 0; i < 3; i++) {
		uint8_t *d = sel_input_data(r, i);
		for (uint64_t k = 0; k < r->h.tensors[i].bytes; k++)
			d[k] = (uint8_t)(i * 100 + k * 7);
	}
	CHECK_OK(sel_input_seal(r, created));
}

static void build_source(sel_input_rec *r, uint64_t created)
{
	sel_input_source s = {.identity = key_of(9),
			      .encoding = 1,
			      .color = 3,
			      .width = 640,
			      .height = 480,
			      .tokens = 391,
			      .grid_h = 17,
			      .grid_w = 23,
			      .prepared_bytes = 920000};
	sel_input_key k = key_of(8);
	CHECK_OK(sel_input_source_init(r, &k, &s, created));
}

static void test_round_trip(void)
{
	sel_input_rec r, s;
	build(&r, 1700000000000000000ull);
	CHECK(r.h.header_bytes == 384 && r.h.count == 3); /* round_up(80 + 3 x 96, 64) */
	CHECK(r.h.tensors[0].offset == 384 && r.h.tensors[0].bytes == 65);
	CHECK(r.h.tensors[1].offset == 384 + 128 && r.h.tensors[1].bytes == 8);
	CHECK(r.h.tensors[2].offset == 384 + 128 + 64 && r.h.tensors[2].bytes == 96);
	CHECK(r.len == 384 + 128 + 64 + 128 && r.h.file_bytes == r.len);
	sel_input_header h;
	CHECK_OK(sel_input_decode(r.bytes, r.len, &h));
	CHECK_OK(sel_input_decode(r.bytes, r.h.header_bytes, &h)); /* the header alone */
	CHECK(h.kind == SEL_INPUT_PREPARED && h.count == 3 && h.file_bytes == r.len);
	CHECK(h.created_ns == 1700000000000000000ull && sel_input_key_eq(&h.key, &r.h.key));
	for (int i = 0; i < 3; i++)
		CHECK(memcmp(&h.tensors[i], &r.h.tensors[i], sizeof h.tensors[i]) == 0);
	CHECK_OK(sel_input_verify(&h, r.bytes, r.len));
	CHECK(sel_input_find(&r, "grid") == 1 && sel_input_find(&r, "nope") == -ENOENT);
	CHECK(sel_input_header_bytes(r.bytes, r.len) == 384);

	/* Known answer: pins every byte of the format. */
	uint64_t ka = XXH3_64bits(r.bytes, r.len);
	printf("prepared known answer %016llx\n", (unsigned long long)ka);
	CHECK(ka == 0x9550d11ea697c5dcull);

	/* Adopt: ownership moves on success only. */
	uint8_t *copy = malloc(r.len);
	memcpy(copy, r.bytes, r.len);
	sel_input_key want = key_of(7), other = key_of(6);
	CHECK_RC(sel_input_rec_adopt(&s, copy, r.len, SEL_INPUT_PREPARED, &other), SEL_EIDENTITY);
	CHECK_RC(sel_input_rec_adopt(&s, copy, r.len, SEL_INPUT_SOURCE, NULL), SEL_EIDENTITY);
	CHECK_OK(sel_input_rec_adopt(&s, copy, r.len, SEL_INPUT_PREPARED, &want));
	CHECK(s.bytes == copy && memcmp(sel_input_data(&s, 2), sel_input_data(&r, 2), 96) == 0);
	sel_input_rec_free(&s);
	CHECK(s.bytes == NULL);

	build_source(&s, 1700000000000000001ull);
	CHECK(s.len == 192 && s.h.header_bytes == 192 && s.h.count == 0);
	CHECK_OK(sel_input_decode(s.bytes, s.len, &h));
	CHECK(h.kind == SEL_INPUT_SOURCE && h.src.width == 640 && h.src.height == 480);
	CHECK(h.src.tokens == 391 && h.src.grid_h == 17 && h.src.grid_w == 23);
	CHECK(h.src.prepared_bytes == 920000 && h.src.encoding == 1 && h.src.color == 3);
	sel_input_key id9 = key_of(9);
	CHECK(sel_input_key_eq(&h.src.identity, &id9));
	CHECK_OK(sel_input_verify(&h, s.bytes, s.len));
	/* The source record byte by byte from docs/record-format.md. */
	uint8_t want_b[192] = {0};
	memcpy(want_b, "FLAREINP", 8);
	sel_put_u32(want_b + 8, 1);
	sel_put_u32(want_b + 12, 1);
	sel_put_u32(want_b + 16, 192);
	sel_input_key k8 = key_of(8);
	memcpy(want_b + 32, k8.b, 32);
	sel_put_u64(want_b + 64, 1700000000000000001ull);
	memcpy(want_b + 80, id9.b, 32);
	sel_put_u32(want_b + 112, 1);
	sel_put_u32(want_b + 116, 3);
	sel_put_u32(want_b + 120, 640);
	sel_put_u32(want_b + 124, 480);
	sel_put_u32(want_b + 128, 391);
	sel_put_u32(want_b + 132, 17);
	sel_put_u32(want_b + 136, 23);
	sel_put_u64(want_b + 144, 920000);
	sel_put_u64(want_b + 72, XXH3_64bits(want_b, 192));
	CHECK(memcmp(want_b, s.bytes, 192) == 0);

	/* Canonical: rebuilding from what was decoded gives the same bytes. */
	sel_input_rec b;
	CHECK_OK(sel_input_decode(r.bytes, r.len, &h));
	CHECK_OK(sel_input_prepared_init(&b, &h.key, h.tensors, h.count));
	for (uint32_t i = 0; i < h.count; i++)
		memcpy(sel_input_data(&b, i), r.bytes + h.tensors[i].offset, h.tensors[i].bytes);
	CHECK_OK(sel_input_seal(&b, h.created_ns));
	CHECK(b.len == r.len && memcmp(b.bytes, r.bytes, r.len) == 0);
	sel_input_rec_free(&b);
	sel_input_rec_free(&s);
	sel_input_rec_free(&r);
}

static int decode_verify(const uint8_t *b, size_t n)
{
	sel_input_header h;
	int rc = sel_input_decode(b, n, &h);
	if (rc)
		return rc;
	return sel_input_verify(&h, b, n);
}

static void test_corruption(void)
{
	sel_input_rec recs[2];
	build(&recs[0], 5);
	build_source(&recs[1], 6);
	for (int k = 0; k < 2; k++) {
		sel_input_rec *r = &recs[k];
		uint8_t *b = malloc(r->len + 64);
		/* Every bit of every byte. */
		for (size_t i = 0; i < r->len; i++)
			for (int bit = 0; bit < 8; bit++) {
				memcpy(b, r->bytes, r->len);
				b[i] ^= (uint8_t)(1u << bit);
				int rc = decode_verify(b, r->len);
				CHECKF(rc == SEL_EFORMAT || rc == SEL_ECORRUPT,
				       "record %d: bit %d of byte %zu flipped: rc %d", k, bit, i,
				       rc);
				CHECK(*sel_errmsg() && !strchr(sel_errmsg(), '\n'));
			}
		/* Every truncation, and a longer file. */
		for (size_t n = 0; n < r->len; n++) {
			memcpy(b, r->bytes, n);
			uint8_t *exact = malloc(n ? n : 1);
			memcpy(exact, b, n);
			int rc = decode_verify(exact, n);
			CHECKF(rc == SEL_EFORMAT, "record %d cut at %zu: rc %d", k, n, rc);
			free(exact);
		}
		memcpy(b, r->bytes, r->len);
		b[r->len] = 0;
		CHECK_RC(decode_verify(b, r->len + 1), SEL_EFORMAT);
		free(b);
	}
	/* Foreign files. */
	uint8_t f[256] = {0};
	memcpy(f, "FLARECKP", 8); /* a checkpoint record's magic */
	CHECK_RC(decode_verify(f, sizeof f), SEL_EFORMAT);
	CHECKF(strstr(sel_errmsg(), "magic"), "%s", sel_errmsg());
	memcpy(f, recs[1].bytes, recs[1].len);
	sel_put_u32(f + 8, 2);
	CHECK_RC(decode_verify(f, recs[1].len), SEL_EFORMAT);
	CHECKF(strstr(sel_errmsg(), "version 2"), "%s", sel_errmsg());
	CHECK_RC(decode_verify((const uint8_t *)"hello", 5), SEL_EFORMAT);
	sel_input_rec_free(&recs[0]);
	sel_input_rec_free(&recs[1]);
}

/* Rules behind the checksum: change a field, recompute the checksum, and
 * the decoder must still refuse. */
static void expect_structural(const sel_input_rec *r, size_t off, const void *v, size_t n,
			      const char *needle)
{
	uint8_t *b = malloc(r->len);
	memcpy(b, r->bytes, r->len);
	memcpy(b + off, v, n);
	uint32_t hb = r->h.header_bytes;
	memset(b + 72, 0, 8);
	sel_put_u64(b + 72, XXH3_64bits(b, hb));
	int rc = decode_verify(b, r->len);
	CHECKF(rc == SEL_EFORMAT, "offset %zu: rc %d (%s)", off, rc, sel_errmsg());
	CHECKF(strstr(sel_errmsg(), needle), "offset %zu: '%s' lacks '%s'", off, sel_errmsg(),
	       needle);
	free(b);
}

static void test_structure(void)
{
	sel_input_rec r, s;
	build(&r, 11);
	build_source(&s, 12);
	uint8_t v[8];
	sel_put_u32(v, 3);
	expect_structural(&r, 12, v, 4, "kind 3");
	sel_put_u32(v, 4);
	expect_structural(&r, 20, v, 4, "header bytes 384"); /* count 4, size for 3 */
	sel_put_u32(v, 448);
	expect_structural(&r, 16, v, 4, "header bytes 448");
	sel_put_u32(v, 17);
	expect_structural(&r, 20, v, 4, "17 tensors");
	sel_put_u32(v, 1);
	expect_structural(&s, 20, v, 4, "tensors in a source record");
	sel_put_u64(v, 1);
	expect_structural(&r, 24, v, 8, "payload");
	expect_structural(&r, 80 + 7, "x", 1, "not NUL padded"); /* "pixels\0x" */
	expect_structural(&r, 80 + 96, "pixels", 7, "twice");    /* second name = first */
	expect_structural(&r, 80, "Pix", 3, "valid name");
	sel_put_u32(v, 9);
	expect_structural(&r, 80 + 32, v, 4, "unknown type 9");
	sel_put_u32(v, 0);
	expect_structural(&r, 80 + 36, v, 4, "rank 0");
	sel_put_u32(v, 5);
	expect_structural(&r, 80 + 36, v, 4, "rank 5");
	sel_put_u64(v, 1);
	expect_structural(&r, 80 + 40 + 16, v, 8, "past its rank"); /* dims[2] of a rank-2 tensor */
	sel_put_u64(v, 0);
	expect_structural(&r, 80 + 40, v, 8, "dimension 0 is 0");
	sel_put_u64(v, 1ull << 40);
	expect_structural(&r, 80 + 40, v, 8, "1 byte .. 1 GiB");
	sel_put_u64(v, 448);
	expect_structural(&r, 80 + 72, v, 8, "at offset 448");
	sel_put_u64(v, 66);
	expect_structural(&r, 80 + 80, v, 8, "says 66 bytes");
	expect_structural(&r, 80 + 3 * 96, "\1", 1, "padding byte");
	sel_put_u32(v, 1);
	expect_structural(&s, 80 + 60, v, 4, "reserved");
	sel_put_u32(v, 0);
	expect_structural(&s, 80 + 48, v, 4, "0 tokens");
	/* Payload padding (after the checksummed bytes) must be zero. */
	uint8_t *b = malloc(r.len);
	memcpy(b, r.bytes, r.len);
	b[384 + 65] = 1;
	sel_input_header h;
	CHECK_OK(sel_input_decode(b, r.len, &h));
	CHECK_RC(sel_input_verify(&h, b, r.len), SEL_EFORMAT);
	b[384 + 65] = 0;
	b[384] ^= 1;
	CHECK_RC(sel_input_verify(&h, b, r.len), SEL_ECORRUPT);
	CHECKF(strstr(sel_errmsg(), "'pixels' fails its checksum"), "%s", sel_errmsg());
	free(b);

	/* Building refuses what decoding would. */
	sel_input_tensor t[SEL_INPUT_TENSORS_MAX + 1] = {0};
	for (int i = 0; i <= (int)SEL_INPUT_TENSORS_MAX; i++) {
		snprintf(t[i].name, sizeof t[i].name, "t%d", i);
		t[i].dtype = SEL_DT_U8;
		t[i].rank = 1;
		t[i].dims[0] = 1;
	}
	sel_input_key k = key_of(1);
	sel_input_rec x;
	CHECK_RC(sel_input_prepared_init(&x, &k, t, SEL_INPUT_TENSORS_MAX + 1), -EINVAL);
	CHECK_RC(sel_input_prepared_init(&x, &k, t, 0), -EINVAL);
	CHECK_OK(sel_input_prepared_init(&x, &k, t, SEL_INPUT_TENSORS_MAX));
	CHECK_OK(sel_input_seal(&x, 1));
	CHECK(x.h.header_bytes == 1664);
	CHECK_OK(decode_verify(x.bytes, x.len));
	sel_input_rec_free(&x);
	t[1].dims[0] = (1ull << 30) + 1;
	CHECK_RC(sel_input_prepared_init(&x, &k, t, 2), -EINVAL);
	t[1].dims[0] = 1;
	strcpy(t[1].name, "t0");
	CHECK_RC(sel_input_prepared_init(&x, &k, t, 2), -EINVAL);
	strcpy(t[1].name, "Bad");
	CHECK_RC(sel_input_prepared_init(&x, &k, t, 2), -EINVAL);
	sel_input_rec_free(&r);
	sel_input_rec_free(&s);
}

static void test_names(void)
{
	sel_input_key k = key_of(3), back;
	char n[SEL_INPUT_NAME_LEN];
	uint32_t kind;
	sel_input_name(SEL_INPUT_PREPARED, &k, n);
	CHECK(strncmp(n, "prep-", 5) == 0 && strlen(n) == 5 + 64 + 6);
	CHECK_OK(sel_input_name_parse(n, &kind, &back));
	CHECK(kind == SEL_INPUT_PREPARED && sel_input_key_eq(&k, &back));
	sel_input_name(SEL_INPUT_SOURCE, &k, n);
	CHECK(strncmp(n, "src-", 4) == 0);
	CHECK_OK(sel_input_name_parse(n, &kind, &back));
	CHECK(kind == SEL_INPUT_SOURCE && sel_input_key_eq(&k, &back));
	char bad[SEL_INPUT_NAME_LEN + 8];
	snprintf(bad, sizeof bad, "%s", n);
	bad[10] = 'A';
	CHECK_RC(sel_input_name_parse(bad, &kind, &back), SEL_EFORMAT);
	snprintf(bad, sizeof bad, "%s.tmp", n);
	CHECK_RC(sel_input_name_parse(bad, &kind, &back), SEL_EFORMAT);
	snprintf(bad, sizeof bad, "%.20s.input", n);
	CHECK_RC(sel_input_name_parse(bad, &kind, &back), SEL_EFORMAT);
	CHECK_RC(sel_input_name_parse("0000000000000001-00112233445566778899aabbccddeeff.ckpt",
				      &kind, &back),
		 SEL_EFORMAT);
}

/* The encodings of docs/identity.md "CPU inputs", rebuilt here byte by
 * byte and hashed in one call, against input_key.c. */
static void blake(const uint8_t *b, size_t n, sel_input_key *out)
{
	crypto_generichash_blake2b(out->b, SEL_INPUT_KEY_BYTES, b, n, NULL, 0);
}

static void test_identity_encodings(void)
{
	uint8_t buf[256];
	size_t n = 0;
	sel_input_key k, want;
#define PUT(p, len) (memcpy(buf + n, p, len), n += (len))
	PUT("flare-input-source-v1", 21);
	sel_put_u32(buf + n, 3), n += 4;
	PUT("png", 3);
	sel_put_u64(buf + n, 3), n += 8;
	PUT("abc", 3);
	sel_put_u32(buf + n, 1), n += 4;
	PUT("s", 1);
	blake(buf, n, &want);
	sel_input_source_key("png", "abc", 3, "s", &k);
	CHECK(sel_input_key_eq(&k, &want));

	uint8_t px[6] = {1, 2, 3, 4, 5, 6};
	n = 0;
	PUT("flare-input-image-v1", 20);
	sel_put_u32(buf + n, 1), n += 4;
	PUT("s", 1);
	sel_put_u32(buf + n, 2), n += 4;
	sel_put_u32(buf + n, 1), n += 4;
	sel_put_u32(buf + n, 3), n += 4;
	PUT(px, 6);
	blake(buf, n, &want);
	sel_input_image_identity("s", 2, 1, 3, px, &k);
	CHECK(sel_input_key_eq(&k, &want));
	/* The streaming form agrees, split anywhere. */
	sel_input_key k2;
	sel_input_id_state st;
	sel_input_image_identity_init(&st, "s", 2, 1, 3);
	sel_input_image_identity_update(&st, px, 1);
	sel_input_image_identity_update(&st, px + 1, 5);
	sel_input_image_identity_final(&st, &k2);
	CHECK(sel_input_key_eq(&k, &k2));

	/* Tokens: blocks of eight from B32(domain || id || u32(block)). */
	sel_token t[9];
	sel_input_tokens(&k, 9, t);
	for (uint32_t blk = 0; blk < 2; blk++) {
		n = 0;
		PUT("flare-input-tokens-v1", 21);
		PUT(k.b, 32);
		sel_put_u32(buf + n, blk), n += 4;
		blake(buf, n, &want);
		for (uint32_t j = 0; j < 8 && blk * 8 + j < 9; j++)
			CHECK(t[blk * 8 + j] ==
			      (0x80000000u | (sel_get_u32(want.b + 4 * j) & 0x7fffffffu)));
	}
#undef PUT
	/* Fields are length-prefixed: moving a byte between them changes it. */
	sel_input_source_key("png", "abc", 3, "s", &k);
	sel_input_source_key("pn", "gabc", 4, "s", &k2);
	CHECK(!sel_input_key_eq(&k, &k2));
	char hex[65];
	printf("known answer: source key of (png, abc, s) %s\n", sel_input_key_hex(&k, hex));
	CHECK(strcmp(hex, KA_SOURCE) == 0);
}

/* Write the fuzz corpus: records of both kinds, and broken ones. */
static int write_corpus(const char *dir)
{
	mkdir(dir, 0755);
	sel_input_rec r, s;
	build(&r, 21);
	build_source(&s, 22);
	struct {
		const char *name;
		const uint8_t *b;
		size_t n;
	} files[] = {
		{"01-prepared", r.bytes, r.len},
		{"02-source", s.bytes, s.len},
		{"03-prepared-header-only", r.bytes, r.h.header_bytes},
		{"04-truncated", r.bytes, r.len - 7},
		{"05-short", r.bytes, 40},
	};
	char path[4200];
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
		FILE *f = fopen(path, "wb");
		CHECK(f && fwrite(files[i].b, 1, files[i].n, f) == files[i].n);
		fclose(f);
	}
	uint8_t *b = malloc(r.len);
	memcpy(b, r.bytes, r.len);
	b[400] ^= 0x40;
	snprintf(path, sizeof path, "%s/06-payload-flip", dir);
	FILE *f = fopen(path, "wb");
	CHECK(f && fwrite(b, 1, r.len, f) == r.len);
	fclose(f);
	memcpy(b, r.bytes, r.len);
	sel_put_u64(b + 80 + 72, 448); /* an offset, checksum recomputed */
	memset(b + 72, 0, 8);
	sel_put_u64(b + 72, XXH3_64bits(b, r.h.header_bytes));
	snprintf(path, sizeof path, "%s/07-bad-offset", dir);
	f = fopen(path, "wb");
	CHECK(f && fwrite(b, 1, r.len, f) == r.len);
	fclose(f);
	free(b);
	sel_input_rec_free(&r);
	sel_input_rec_free(&s);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0)
		return write_corpus(argv[2]);
	test_round_trip();
	test_corruption();
	test_structure();
	test_names();
	test_identity_encodings();
	printf("test_input_record: ok\n");
	return 0;
}
