/*
 * test_remote_value.c - the bytes of the remote tier (src/selene/remote_value.c,
 * docs/remote.md): key files, value framing under each protection (a
 * known-answer header, round trips, every kind of damage and forgery
 * refused with its own code), the cut of records into windows, manifests,
 * and key names that keep one record in one cluster slot.
 */
#include "recutil.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "testutil.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xxh.h"

static test_rng rng;

static const uint8_t secret[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
				   17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static void test_key_files(void)
{
	uint8_t k[32];
	CHECK_OK(sel_rv_key_parse(secret, 32, k));
	CHECK(memcmp(k, secret, 32) == 0);
	char hex[70];
	sel_hex(secret, 32, hex);
	CHECK_OK(sel_rv_key_parse(hex, 64, k));
	CHECK(memcmp(k, secret, 32) == 0);
	strcat(hex, "\n");
	CHECK_OK(sel_rv_key_parse(hex, 65, k));
	CHECK(memcmp(k, secret, 32) == 0);
	hex[5] = 'g';
	CHECK_RC(sel_rv_key_parse(hex, 65, k), SEL_EFORMAT);
	CHECK(strstr(sel_errmsg(), "hex digit"));
	CHECK_RC(sel_rv_key_parse(hex, 31, k), SEL_EFORMAT);
	CHECK(strstr(sel_errmsg(), "31 bytes"));
	CHECK_RC(sel_rv_key_parse(hex, 0, k), SEL_EFORMAT);
	uint8_t zero[32] = {0};
	CHECK_RC(sel_rv_key_parse(zero, 32, k), SEL_EFORMAT);
	CHECK(strstr(sel_errmsg(), "all zero"));

	char *dir = test_mkdtemp("rvkey");
	char path[4200];
	snprintf(path, sizeof path, "%s/key", dir);
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	CHECK(fd >= 0 && write(fd, secret, 32) == 32);
	close(fd);
	CHECK_OK(sel_rv_key_load(path, k));
	CHECK(memcmp(k, secret, 32) == 0);
	CHECK(chmod(path, 0644) == 0);
	CHECK_RC(sel_rv_key_load(path, k), -EPERM);
	CHECK(strstr(sel_errmsg(), "chmod 600") && strstr(sel_errmsg(), path));
	CHECK(chmod(path, 0640) == 0);
	CHECK_OK(sel_rv_key_load(path, k)); /* a group may share it */
	snprintf(path, sizeof path, "%s/long", dir);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	char junk[200];
	memset(junk, 'a', sizeof junk);
	CHECK(fd >= 0 && write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
	close(fd);
	CHECK_RC(sel_rv_key_load(path, k), SEL_EFORMAT);
	CHECK(strstr(sel_errmsg(), "200 bytes"));
	snprintf(path, sizeof path, "%s/missing", dir);
	CHECK_RC(sel_rv_key_load(path, k), -ENOENT);
	CHECK(strstr(sel_errmsg(), path));
	CHECK_RC(sel_rv_key_load(dir, k), -EINVAL);
	CHECK(strstr(sel_errmsg(), "regular file"));
	test_rmtree(dir);
	free(dir);

	struct sel_rv_keys a, b, none;
	CHECK_OK(sel_rv_keys_init(&a, secret, false));
	CHECK_OK(sel_rv_keys_init(&b, secret, true));
	CHECK(memcmp(a.mac, b.mac, 32) == 0 && strcmp(a.id, b.id) == 0 && strlen(a.id) == 16);
	CHECK(memcmp(a.mac, a.aead, 32) != 0 && memcmp(a.mac, secret, 32) != 0);
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	CHECK(!none.keyed && none.id[0] == '\0');
	CHECK_RC(sel_rv_keys_init(&none, NULL, true), -EINVAL);
	CHECK(strstr(sel_errmsg(), "encryption needs a key"));
	sel_rv_keys_wipe(&a);
	CHECK(!a.keyed && a.mac[0] == 0);
}

static void hdr_init(struct sel_rv_hdr *h, uint8_t kind, uint32_t window, uint32_t payload)
{
	memset(h, 0, sizeof *h);
	h->kind = kind;
	memset(h->identity, 0xab, sizeof h->identity);
	memset(h->fingerprint, 0xcd, sizeof h->fingerprint);
	h->key.consumed = 0x1234;
	for (int i = 0; i < 16; i++)
		h->key.digest.b[i] = (uint8_t)i;
	h->window = window;
	h->payload = payload;
	h->generation = 0x0102030405060708ull;
}

static void test_known_header(void)
{
	struct sel_rv_keys none;
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	struct sel_rv_hdr h;
	hdr_init(&h, SEL_RV_KIND_WINDOW, 7, 5);
	struct iovec iov = {(void *)"hello", 5};
	uint8_t v[256];
	CHECK_RC(sel_rv_encode(&none, &h, &iov, 1, v, sizeof v), SEL_RV_HEADER + 5 + 8);
	/* docs/remote.md, "Values": the header byte by byte. */
	uint8_t want[SEL_RV_HEADER];
	memset(want, 0, sizeof want);
	memcpy(want, "FLRV", 4);
	want[4] = 1; /* version */
	want[5] = 2; /* window */
	want[6] = 0; /* checksum */
	memset(want + 8, 0xab, 32);
	memset(want + 40, 0xcd, 16);
	want[56] = 0x34;
	want[57] = 0x12;
	for (int i = 0; i < 16; i++)
		want[64 + i] = (uint8_t)i;
	want[80] = 7;
	want[84] = 5;
	for (int i = 0; i < 8; i++)
		want[88 + i] = (uint8_t)(8 - i);
	CHECK(memcmp(v, want, sizeof want) == 0);
	CHECK(memcmp(v + SEL_RV_HEADER, "hello", 5) == 0);
	/* A window's checksum covers its header (the manifest's page
	 * checksums cover its payload); a manifest's covers it all. */
	uint64_t t = XXH3_64bits(v, SEL_RV_HEADER);
	for (int i = 0; i < 8; i++)
		CHECK(v[SEL_RV_HEADER + 5 + i] == (uint8_t)(t >> (8 * i)));
	hdr_init(&h, SEL_RV_KIND_MANIFEST, SEL_RV_MANIFEST_WINDOW, 5);
	CHECK_RC(sel_rv_encode(&none, &h, &iov, 1, v, sizeof v), SEL_RV_HEADER + 5 + 8);
	t = XXH3_64bits(v, SEL_RV_HEADER + 5);
	for (int i = 0; i < 8; i++)
		CHECK(v[SEL_RV_HEADER + 5 + i] == (uint8_t)(t >> (8 * i)));
	/* Sealing gives the same header and tag without copying the payload. */
	struct sel_rv_keys mac;
	CHECK_OK(sel_rv_keys_init(&mac, secret, false));
	struct sel_rv_keys *both[] = {&none, &mac};
	for (int ki = 0; ki < 2; ki++)
		for (uint8_t kind = SEL_RV_KIND_MANIFEST; kind <= SEL_RV_KIND_WINDOW; kind++) {
			hdr_init(&h, kind, kind == SEL_RV_KIND_WINDOW ? 2 : SEL_RV_MANIFEST_WINDOW,
				 5);
			struct iovec two[2] = {{(void *)"he", 2}, {(void *)"llo", 3}};
			int n = sel_rv_encode(both[ki], &h, two, 2, v, sizeof v);
			uint8_t hb[SEL_RV_HEADER], tag[32];
			int tl = sel_rv_seal(both[ki], &h, two, 2, hb, tag);
			CHECK(tl == (ki ? 32 : 8) && n == (int)SEL_RV_HEADER + 5 + tl);
			CHECK(memcmp(hb, v, SEL_RV_HEADER) == 0);
			CHECK(memcmp(tag, v + SEL_RV_HEADER + 5, (size_t)tl) == 0);
		}
	struct sel_rv_keys aead;
	CHECK_OK(sel_rv_keys_init(&aead, secret, true));
	uint8_t hb[SEL_RV_HEADER], tag[32];
	CHECK_RC(sel_rv_seal(&aead, &h, &iov, 1, hb, tag), -EINVAL);
}

/* Decode a copy of v[0..len) expecting rc. */
static int dec(const struct sel_rv_keys *k, const struct sel_rv_hdr *want, const uint8_t *v,
	       size_t len)
{
	uint8_t *c = malloc(len ? len : 1);
	memcpy(c, v, len);
	struct sel_rv_hdr got;
	uint8_t *p;
	int rc = sel_rv_decode(k, want, c, len, &got, &p);
	if (rc == 0) {
		CHECK(got.kind == want->kind && sel_key_eq(&got.key, &want->key));
		CHECK(p == c + SEL_RV_HEADER);
	} else {
		CHECK(*sel_errmsg() && !strchr(sel_errmsg(), '\n'));
	}
	free(c);
	return rc;
}

static void test_values(void)
{
	struct sel_rv_keys none, mac, aead, other;
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	CHECK_OK(sel_rv_keys_init(&mac, secret, false));
	CHECK_OK(sel_rv_keys_init(&aead, secret, true));
	uint8_t s2[32];
	memcpy(s2, secret, 32);
	s2[0] ^= 1;
	CHECK_OK(sel_rv_keys_init(&other, s2, true));
	const struct sel_rv_keys *all[] = {&none, &mac, &aead};
	enum {
		PL = 10000
	};
	uint8_t *payload = malloc(PL), *v = malloc(PL + 512), *c = malloc(PL + 512);
	test_rng_fill(&rng, payload, PL);
	for (int ki = 0; ki < 3; ki++) {
		const struct sel_rv_keys *k = all[ki];
		struct sel_rv_hdr h, got;
		hdr_init(&h, SEL_RV_KIND_WINDOW, 3, PL);
		/* Pieces gathered into one payload. */
		struct iovec iov[3] = {
			{payload, 1}, {payload + 1, 4000}, {payload + 4001, PL - 4001}};
		int len = sel_rv_encode(k, &h, iov, 3, v, PL + 512);
		CHECK(len == (int)sel_rv_value_bytes(k, PL));
		CHECK(v[6] == (ki == 0 ? SEL_RV_CHECKSUM : ki == 1 ? SEL_RV_MAC : SEL_RV_AEAD));
		if (ki == 2) {
			/* Encrypted: the payload does not appear; a second encoding
			 * differs (random nonce). */
			CHECK(memcmp(v + SEL_RV_HEADER, payload, 64) != 0);
			int l2 = sel_rv_encode(k, &h, iov, 3, c, PL + 512);
			CHECK(l2 == len && memcmp(c, v, (size_t)len) != 0);
		} else {
			CHECK(memcmp(v + SEL_RV_HEADER, payload, PL) == 0);
		}
		memcpy(c, v, (size_t)len);
		uint8_t *p;
		CHECK_OK(sel_rv_decode(k, &h, c, (size_t)len, &got, &p));
		CHECK(memcmp(p, payload, PL) == 0 && got.payload == PL && got.window == 3);
		CHECK(got.generation == h.generation && got.prot == v[6]);
		/* Any generation accepted with 0; another one is stale. */
		struct sel_rv_hdr w = h;
		w.generation = 0;
		CHECK_OK(dec(k, &w, v, (size_t)len));
		w.generation = 99;
		CHECK_RC(dec(k, &w, v, (size_t)len), -ESTALE);
		/* Asked as another window, key or kind: a copy from elsewhere. */
		w = h;
		w.window = 4;
		CHECK_RC(dec(k, &w, v, (size_t)len), SEL_ECORRUPT);
		w = h;
		w.key.digest.b[3] ^= 1;
		CHECK_RC(dec(k, &w, v, (size_t)len), SEL_ECORRUPT);
		CHECK(strstr(sel_errmsg(), "another key"));
		w = h;
		w.kind = SEL_RV_KIND_MANIFEST;
		CHECK_RC(dec(k, &w, v, (size_t)len), SEL_ECORRUPT);
		w = h;
		w.identity[0] ^= 1;
		CHECK_RC(dec(k, &w, v, (size_t)len), SEL_EIDENTITY);
		w = h;
		w.fingerprint[15] ^= 1;
		CHECK_RC(dec(k, &w, v, (size_t)len), SEL_ELAYOUT);
		/* Damage is refused: checksum without a key, the tag with one.
		 * Structure first where it applies.  Without a key a window's
		 * payload is left to the manifest's page checksums (a claim
		 * checks every page it copies). */
		int integrity = ki == 0 ? SEL_ECORRUPT : -EBADMSG;
		size_t spots[] = {8,
				  40,
				  57,
				  70,
				  80,
				  88,
				  100,
				  SEL_RV_HEADER,
				  SEL_RV_HEADER + 5000,
				  (size_t)len - 1};
		for (size_t i = 0; i < sizeof spots / sizeof *spots; i++) {
			memcpy(c, v, (size_t)len);
			c[spots[i]] ^= 0x10;
			int want_rc =
				spots[i] >= 96 && spots[i] < SEL_RV_HEADER && ki != 2
					? SEL_EFORMAT /* a nonce without encryption */
				: ki == 0 && spots[i] >= SEL_RV_HEADER && spots[i] < (size_t)len - 8
					? 0 /* payload: the page checksums' job */
					: integrity;
			CHECK_RC(dec(k, &h, c, (size_t)len), want_rc);
		}
		for (int trial = 0; trial < 200; trial++) { /* random damage */
			memcpy(c, v, (size_t)len);
			size_t at = 8 + test_rng_below(&rng, (uint64_t)len - 8);
			c[at] ^= (uint8_t)(1 + test_rng_below(&rng, 255));
			bool payload = at >= SEL_RV_HEADER && at < (size_t)len - 8;
			CHECK(dec(k, &h, c, (size_t)len) != 0 || (ki == 0 && payload));
		}
		static const size_t structural[] = {0, 4, 5, 6, 7, 84};
		for (size_t i = 0; i < sizeof structural / sizeof *structural; i++) {
			memcpy(c, v, (size_t)len);
			c[structural[i]] ^= 0x40;
			CHECK_RC(dec(k, &h, c, (size_t)len), SEL_EFORMAT);
		}
		CHECK_RC(dec(k, &h, v, (size_t)len - 1), SEL_EFORMAT);
		CHECK_RC(dec(k, &h, v, 20), SEL_EFORMAT);
		CHECK_RC(dec(k, &h, v, 0), SEL_EFORMAT);
	}
	/* Protection against the configuration. */
	struct sel_rv_hdr h;
	hdr_init(&h, SEL_RV_KIND_MANIFEST, SEL_RV_MANIFEST_WINDOW, 100);
	struct iovec iov = {payload, 100};
	int ln = sel_rv_encode(&none, &h, &iov, 1, v, PL);
	CHECK_RC(dec(&mac, &h, v, (size_t)ln), -EBADMSG); /* written without the key */
	CHECK(strstr(sel_errmsg(), "not authenticated"));
	CHECK_RC(dec(&aead, &h, v, (size_t)ln), -EBADMSG);
	int lm = sel_rv_encode(&mac, &h, &iov, 1, v, PL);
	CHECK_RC(dec(&none, &h, v, (size_t)lm), -ENOKEY); /* keyed, and we have none */
	CHECK_OK(dec(&aead, &h, v, (size_t)lm));          /* MAC values read under encryption */
	int la = sel_rv_encode(&aead, &h, &iov, 1, v, PL);
	CHECK_OK(dec(&mac, &h, v, (size_t)la));             /* and AEAD ones without */
	CHECK_RC(dec(&other, &h, v, (size_t)la), -EBADMSG); /* another deployment's key */
	lm = sel_rv_encode(&mac, &h, &iov, 1, v, PL);
	CHECK_RC(dec(&other, &h, v, (size_t)lm), -EBADMSG);
	/* A forger without the key who recomputes the checksum is refused
	 * under a key: the protection byte says checksum. */
	ln = sel_rv_encode(&none, &h, &iov, 1, v, PL);
	CHECK_RC(dec(&mac, &h, v, (size_t)ln), -EBADMSG);
	/* Encoder refusals. */
	struct sel_rv_hdr bad = h;
	bad.generation = 0;
	CHECK_RC(sel_rv_encode(&none, &bad, &iov, 1, v, PL), -EINVAL);
	bad = h;
	bad.kind = 9;
	CHECK_RC(sel_rv_encode(&none, &bad, &iov, 1, v, PL), -EINVAL);
	bad = h;
	bad.payload = 99;
	CHECK_RC(sel_rv_encode(&none, &bad, &iov, 1, v, PL), -EINVAL);
	bad.payload = 101;
	CHECK_RC(sel_rv_encode(&none, &bad, &iov, 1, v, PL), -EINVAL);
	bad.payload = SEL_RV_VALUE_MAX;
	CHECK_RC(sel_rv_encode(&none, &bad, &iov, 1, v, PL), -EINVAL);
	CHECK_RC(sel_rv_encode(&none, &h, &iov, 1, v, 100), -ENOBUFS);
	/* The largest window value is exactly within 4 MiB. */
	CHECK(sel_rv_value_bytes(&mac, SEL_RV_CAP_MAX) <= SEL_RV_VALUE_MAX);
	CHECK(sel_rv_value_bytes(&aead, SEL_RV_CAP_MAX) <= SEL_RV_VALUE_MAX);
	free(payload);
	free(v);
	free(c);
}

/* Windows cover pages and row exactly once, in order, within cap. */
static void check_layout(uint64_t stride, uint32_t tail, uint64_t row, uint32_t cap)
{
	struct sel_rv_layout l;
	CHECK_OK(sel_rv_layout_init(&l, stride, tail, row, cap));
	CHECK(l.windows == l.page_windows + l.row_windows);
	uint64_t *got = calloc(tail ? tail : 1, sizeof *got);
	uint64_t row_at = 0;
	for (uint32_t w = 0; w < l.windows; w++) {
		struct sel_rv_extent e;
		sel_rv_extent(&l, w, &e);
		CHECK(e.len > 0 && e.len <= cap);
		if (e.row) {
			CHECK(w >= sel_rv_row_window(&l) && e.off == row_at);
			row_at += e.len;
			continue;
		}
		CHECK(w < l.page_windows && e.pages >= 1 && e.page + e.pages <= tail);
		if (e.pages > 1 || e.off == 0)
			CHECK(sel_rv_page_window(&l, e.page) == w);
		for (uint32_t i = 0; i < e.pages; i++) {
			CHECK(got[e.page + i] == (e.pages == 1 ? e.off : 0));
			got[e.page + i] += e.pages == 1 ? e.len : stride;
		}
		CHECK(e.len == (e.pages == 1 ? e.len : e.pages * stride));
	}
	for (uint32_t i = 0; i < tail; i++)
		CHECK(got[i] == stride);
	CHECK(row_at == row);
	free(got);
}

static void test_layouts(void)
{
	check_layout(4096, 100, 0, SEL_RV_CAP_MAX);
	check_layout(4096, 100, 9000, 16384);  /* 4 pages a window, 1 row window */
	check_layout(16384, 3, 100000, 16384); /* one page a window */
	check_layout(40000, 5, 7, 16384);      /* split pages: 3 windows each */
	check_layout(3 << 20, 64, 2 << 20, SEL_RV_CAP_MAX);
	check_layout(8 << 20, 4, 12 << 20, SEL_RV_CAP_MAX); /* 8 MiB pages: 3 windows each */
	check_layout(4096, 0, 5000, 4096);                  /* no pages (the parent's last page) */
	check_layout(4096, 0, 0, 4096);
	for (int i = 0; i < 300; i++) {
		uint32_t cap = SEL_RV_CAP_MIN + (uint32_t)test_rng_below(&rng, 200000);
		check_layout(1 + test_rng_below(&rng, 300000), (uint32_t)test_rng_below(&rng, 70),
			     test_rng_below(&rng, 400000), cap);
	}
	struct sel_rv_layout l;
	struct sel_rv_extent e;
	CHECK_OK(sel_rv_layout_init(&l, 4096, 10, 5000, 3 * 4096 + 100));
	CHECK(l.ppw == 3 && l.page_windows == 4 && l.row_windows == 1);
	sel_rv_extent(&l, 3, &e);
	CHECK(!e.row && e.page == 9 && e.pages == 1 && e.len == 4096);
	sel_rv_extent(&l, 4, &e);
	CHECK(e.row && e.off == 0 && e.len == 5000);
	CHECK_RC(sel_rv_layout_init(&l, 4096, 10, 0, 4095), -EINVAL);
	CHECK_RC(sel_rv_layout_init(&l, 4096, 10, 0, SEL_RV_CAP_MAX + 1), -EINVAL);
	CHECK_RC(sel_rv_layout_init(&l, 0, 10, 0, 4096), -EINVAL);
	CHECK_RC(sel_rv_layout_init(&l, 1ull << 40, 2, 0, 4096), SEL_EOVERSIZE);
	CHECK_RC(sel_rv_layout_init(&l, 4096, 1, 1ull << 40, 4096), SEL_EOVERSIZE);
}

static void test_manifest(void)
{
	uint64_t units[3] = {5000, 4096, 100};
	struct test_geo tg;
	test_geo_init(&tg, 2, 64, 3, units, 9000);
	sel_record_ns ns, ns2;
	test_ns_init(&ns, &tg.g, 1);
	test_ns_init(&ns2, &tg.g, 2);
	sel_key parent;
	test_key(&rng, 128, &parent);
	sel_record_desc d;
	test_desc(&rng, 64, 640, &parent, false, &d);
	CHECK(d.tail == 8);
	uint64_t ck[8];
	for (int i = 0; i < 8; i++)
		ck[i] = test_rng_next(&rng);
	size_t ml = sel_rv_manifest_bytes(&ns, d.tail);
	CHECK(ml == 16 + ns.layout.sz.header_bytes + 64);
	uint8_t *m = malloc(ml + 16);
	int len = sel_rv_manifest_encode(&ns, &d, true, 0xfeed, 77, 65536, ck, m, ml);
	CHECK(len == (int)ml);
	struct sel_rv_manifest out;
	CHECK_OK(sel_rv_manifest_decode(&ns, &d.key, m, ml, &out));
	CHECK(out.has_row && out.cap == 65536 && out.h.row_checksum == 0xfeed);
	CHECK(out.h.created_ns == 77 && out.h.d.tail == 8 && sel_key_eq(&out.h.d.parent, &parent));
	CHECK(out.row_bytes == 2 * 9000 && out.layout.stride == ns.layout.sz.page_record);
	CHECK(out.windows == out.layout.windows);
	for (uint32_t i = 0; i < 8; i++)
		CHECK(sel_rv_manifest_cksum(&out, i) == ck[i]);
	CHECK(out.h.version == SEL_RECORD_VERSION_ZERO_PAD); /* the writer zeroes padding */
	/* Manifests written before version 4 (page padding undefined) still
	 * decode: their embedded header re-encoded as version 3 and 2. */
	for (uint32_t v = 2; v <= 3; v++) {
		uint8_t *old = malloc(ml);
		memcpy(old, m, ml);
		CHECK(sel_record_encode(&ns, &d, 0xfeed, 77, v, old + 16,
					ns.layout.sz.header_bytes) ==
		      (int)ns.layout.sz.header_bytes);
		CHECK_OK(sel_rv_manifest_decode(&ns, &d.key, old, ml, &out));
		CHECK(out.h.version == v && out.has_row && out.h.row_checksum == 0xfeed);
		CHECK(sel_rv_manifest_cksum(&out, 7) == ck[7]);
		free(old);
	}
	/* Another namespace, another key. */
	CHECK_RC(sel_rv_manifest_decode(&ns2, &d.key, m, ml, &out), SEL_EIDENTITY);
	sel_key k2 = d.key;
	k2.consumed++;
	CHECK_RC(sel_rv_manifest_decode(&ns, &k2, m, ml, &out), SEL_ECORRUPT);
	/* Lengths, flags, counts. */
	CHECK_RC(sel_rv_manifest_decode(&ns, &d.key, m, ml - 8, &out), SEL_EFORMAT);
	CHECK_RC(sel_rv_manifest_decode(&ns, &d.key, m, 100, &out), SEL_EFORMAT);
	uint8_t *c = malloc(ml);
	memcpy(c, m, ml);
	c[8] |= 2; /* unknown flag */
	CHECK_RC(sel_rv_manifest_decode(&ns, &d.key, c, ml, &out), SEL_EFORMAT);
	memcpy(c, m, ml);
	c[4]++; /* window count */
	CHECK_RC(sel_rv_manifest_decode(&ns, &d.key, c, ml, &out), SEL_EFORMAT);
	memcpy(c, m, ml);
	c[2] = 0; /* cap 65536 -> 0, below 4096 */
	CHECK_RC(sel_rv_manifest_decode(&ns, &d.key, c, ml, &out), SEL_EFORMAT);
	memcpy(c, m, ml);
	c[12] = 0xff; /* header bytes beyond the payload */
	c[13] = 0xff;
	CHECK_RC(sel_rv_manifest_decode(&ns, &d.key, c, ml, &out), SEL_EFORMAT);
	memcpy(c, m, ml);
	c[16 + 200] ^= 1; /* inside the record header: its own checksum */
	CHECK_RC(sel_rv_manifest_decode(&ns, &d.key, c, ml, &out), SEL_ECORRUPT);
	/* Page-only: no row checksum, no row windows. */
	len = sel_rv_manifest_encode(&ns, &d, false, 0xfeed, 77, 65536, ck, m, ml);
	CHECK_OK(sel_rv_manifest_decode(&ns, &d.key, m, (size_t)len, &out));
	CHECK(!out.has_row && out.h.row_checksum == 0 && out.layout.row_windows == 0);
	/* Encoder refusals. */
	CHECK_RC(sel_rv_manifest_encode(&ns, &d, true, 1, 1, 65536, ck, m, ml - 1), -ENOBUFS);
	CHECK_RC(sel_rv_manifest_encode(&ns, &d, true, 1, 1, 100, ck, m, ml), -EINVAL);
	sel_record_desc bd = d;
	bd.tail = 3; /* neither linked nor the full chain */
	CHECK_RC(sel_rv_manifest_encode(&ns, &bd, true, 1, 1, 65536, ck, m, ml), SEL_EFORMAT);
	CHECK(sel_rv_manifest_bytes(&ns, 1u << 20) == 0);
	/* Replicated rows are one row. */
	CHECK(sel_rv_row_bytes(&ns.layout, SEL_RECORD_ROW_REPLICATED) == 9000);
	CHECK(sel_rv_row_bytes(&ns.layout, 0) == 18000);
	free(m);
	free(c);
	sel_record_ns_free(&ns);
	sel_record_ns_free(&ns2);
}

static void test_names(void)
{
	uint64_t units[1] = {4096};
	struct test_geo tg;
	test_geo_init(&tg, 1, 64, 1, units, 4096);
	sel_record_ns ns;
	test_ns_init(&ns, &tg.g, 1);
	struct sel_rv_keys none, mac;
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	CHECK_OK(sel_rv_keys_init(&mac, secret, false));
	struct sel_rv_names a, b;
	sel_rv_names_init(&a, &ns, &none);
	sel_rv_names_init(&b, &ns, &mac);
	CHECK(strcmp(a.prefix, "flare") == 0);
	CHECK(strncmp(b.prefix, "flare-", 6) == 0 && strlen(b.prefix) == 22);
	sel_key k = {.consumed = 0x1234};
	for (int i = 0; i < 16; i++)
		k.digest.b[i] = (uint8_t)(0x10 * (i % 16) + i % 16);
	char m[SEL_RV_NAME_MAX], w[SEL_RV_NAME_MAX], bk[SEL_RV_NAME_MAX], want[400];
	int ml = sel_rv_manifest_name(&a, &k, m);
	snprintf(want, sizeof want,
		 "flare:{%s/0000000000001234-00112233445566778899aabbccddeeff.ckpt}:m", ns.dirname);
	CHECKF(strcmp(m, want) == 0, "%s", m);
	CHECK(ml == (int)strlen(m) && ml < (int)SEL_RV_NAME_MAX);
	int wl = sel_rv_window_name(&b, &k, 4000000, w);
	CHECK(strstr(w, ":w4000000") && wl < (int)SEL_RV_NAME_MAX);
	/* One record, one slot: manifest and every window share the tag. */
	int wl0 = sel_rv_window_name(&a, &k, 17, w);
	CHECK(sel_rc_key_slot(m, (size_t)ml) == sel_rc_key_slot(w, (size_t)wl0));
	sel_digest bucket;
	memset(bucket.b, 0xee, sizeof bucket.b);
	int bl = sel_rv_bucket_name(&a, &bucket, bk);
	snprintf(want, sizeof want, "flare:{%s/b/eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee}", ns.dirname);
	CHECK(strcmp(bk, want) == 0 && bl == (int)strlen(bk));
	/* Members are record names. */
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&k, name);
	sel_key back;
	CHECK_OK(sel_rv_member_parse(name, strlen(name), &back));
	CHECK(sel_key_eq(&back, &k));
	CHECK_RC(sel_rv_member_parse(name, strlen(name) - 1, &back), SEL_EFORMAT);
	CHECK_RC(sel_rv_member_parse("x", 1, &back), SEL_EFORMAT);
	char withnul[80];
	memcpy(withnul, name, strlen(name));
	withnul[3] = '\0';
	CHECK_RC(sel_rv_member_parse(withnul, strlen(name), &back), SEL_EFORMAT);
	char big[200];
	memset(big, '0', sizeof big);
	CHECK_RC(sel_rv_member_parse(big, sizeof big, &back), SEL_EFORMAT);
	sel_record_ns_free(&ns);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	test_key_files();
	test_known_header();
	test_values();
	test_layouts();
	test_manifest();
	test_names();
	printf("ok\n");
	return 0;
}
