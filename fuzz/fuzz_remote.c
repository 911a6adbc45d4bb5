/*
 * fuzz_remote.c - libFuzzer target for every parser of the remote tier
 * (issue 16; STYLE.md 13).  Its corpus, fuzz/corpus/remote/, replays in
 * make check through build/fuzz/replay_remote.
 *
 * The first byte picks the parser, the rest is its input:
 *   0  a MOVED / ASK error text (sel_rc_redirect_parse)
 *   1  RESP bytes, decoded by hiredis's reader with the connections' bounded
 *      reply builders (sel_rn_reader_create), as a CLUSTER SLOTS reply
 *      (sel_rc_slotmap_parse)
 *   2  a remote URL (sel_ru_parse)
 *   3  a value under no key, a MAC key or an AEAD key (sel_rv_decode; the
 *      second byte picks the keys and the kind asked for)
 *   4  a manifest payload (sel_rv_manifest_decode) and its window layout
 *   5  a key file (sel_rv_key_parse) and a bucket member (sel_rv_member_parse)
 * Besides "never crashes, never reads past the input", it checks:
 *   1. Failures carry one of the documented codes and a one-line message.
 *   2. A URL that parses prints to a text that parses to the same URL.
 *   3. A slot map that parses passes sel_rc_slotmap_check; a redirect has
 *      a slot below 16384 and a port.
 *   4. A value that decodes re-encodes (same header fields and payload)
 *      to one that decodes again; a manifest that decodes has a layout
 *      whose windows cover its pages and row exactly.
 *   5. A member that parses prints back to itself.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "record.h"
#include "remote_cluster.h"
#include "remote_conn.h"
#include "remote_url.h"
#include "remote_value.h"

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_remote: %s (message '%s')\n", what, eos_errmsg());
	abort();
}

static void check_message(void)
{
	const char *m = eos_errmsg();
	if (!*m || strchr(m, '\n'))
		fail("a failure without a one-line message");
}

static void fuzz_redirect(const uint8_t *d, size_t n)
{
	struct sel_rc_redirect rd;
	int rc = sel_rc_redirect_parse((const char *)d, n, &rd);
	if (rc == SEL_EFORMAT) {
		check_message();
		return;
	}
	if (rc != 0 && rc != 1)
		fail("redirect: unexpected code");
	if (rc == 1 && (rd.slot >= SEL_RC_SLOTS || !rd.to.port ||
			!memchr(rd.to.host, '\0', sizeof rd.to.host)))
		fail("redirect: out of range");
}

static struct sel_rc_slotmap map;

static void fuzz_slotmap(const uint8_t *d, size_t n)
{
	redisReader *r = sel_rn_reader_create(); /* the connections' bounded builders */
	if (!r)
		return;
	void *rep = NULL;
	if (redisReaderFeed(r, (const char *)d, n) == REDIS_OK &&
	    redisReaderGetReply(r, &rep) == REDIS_OK && rep) {
		int rc = sel_rc_slotmap_parse(rep, "127.0.0.1", &map);
		if (rc == 0) {
			if (sel_rc_slotmap_check(&map))
				fail("slot map: a parsed map fails its check");
		} else if (rc == SEL_EFORMAT) {
			check_message();
		} else {
			fail("slot map: unexpected code");
		}
		freeReplyObject(rep);
	}
	redisReaderFree(r);
}

static void fuzz_url(const uint8_t *d, size_t n)
{
	char text[4096];
	if (n >= sizeof text)
		n = sizeof text - 1;
	memcpy(text, d, n);
	text[n] = '\0';
	struct sel_ru_url u, v;
	int rc = sel_ru_parse(text, &u);
	if (rc) {
		if (rc != SEL_EFORMAT)
			fail("url: unexpected code");
		check_message();
		return;
	}
	char buf[SEL_RU_TEXT_MAX];
	if (sel_ru_format(&u, buf, sizeof buf) < 0)
		fail("url: does not print");
	if (sel_ru_parse(buf, &v) || memcmp(&u, &v, sizeof u) != 0)
		fail("url: prints to a text that parses to another URL");
}

static const uint8_t secret[32] = "fuzz-remote-secret-0123456789ab";

static void fuzz_value(const uint8_t *d, size_t n)
{
	if (n < 1)
		return;
	struct sel_rv_keys k;
	unsigned sel = d[0];
	if (sel_rv_keys_init(&k, sel % 3 ? secret : NULL, sel % 3 == 2))
		fail("value: keys");
	d++;
	n--;
	/* Ask for what the value says it is, so the field checks are reached. */
	struct sel_rv_hdr want, got;
	memset(&want, 0, sizeof want);
	if (n >= SEL_RV_HEADER) {
		want.kind = d[5];
		memcpy(want.identity, d + 8, SEL_IDENTITY_BYTES);
		memcpy(want.fingerprint, d + 40, SEL_FINGERPRINT_BYTES);
		memcpy(&want.key.consumed, d + 56, 8);
		memcpy(want.key.digest.b, d + 64, SEL_DIGEST_BYTES);
		memcpy(&want.window, d + 80, 4);
	}
	if (sel & 0x80)
		want.kind = SEL_RV_KIND_MANIFEST;
	uint8_t *buf = malloc(n ? n : 1), *payload;
	memcpy(buf, d, n);
	int rc = sel_rv_decode(&k, &want, buf, n, &got, &payload);
	if (rc) {
		if (rc != SEL_EFORMAT && rc != SEL_ECORRUPT && rc != -EBADMSG && rc != -ENOKEY &&
		    rc != SEL_EIDENTITY && rc != SEL_ELAYOUT && rc != -ESTALE)
			fail("value: unexpected code");
		check_message();
		free(buf);
		return;
	}
	if (payload != buf + SEL_RV_HEADER || got.payload + SEL_RV_HEADER > n)
		fail("value: payload outside the value");
	/* Re-encode what was decoded: it must decode to the same. */
	size_t len = sel_rv_value_bytes(&k, got.payload);
	uint8_t *again = malloc(len);
	struct iovec iov = {payload, got.payload};
	if (sel_rv_encode(&k, &got, &iov, 1, again, len) != (int)len)
		fail("value: a decoded value does not encode");
	struct sel_rv_hdr got2;
	uint8_t *p2;
	if (sel_rv_decode(&k, &got, again, len, &got2, &p2) ||
	    memcmp(p2, payload, got.payload) != 0 || got2.generation != got.generation)
		fail("value: a re-encoded value does not decode to the same");
	free(again);
	free(buf);
}

static sel_record_ns ns;
static bool ns_ready;

static void fuzz_manifest(const uint8_t *d, size_t n)
{
	if (!ns_ready) {
		/* One rank, three planes, a row: a fixed namespace to decode against. */
		sel_plane planes[3] = {{"a", SEL_MEM_HOST, 0, 5000},
				       {"b", SEL_MEM_HOST, 0, 4096},
				       {"c", SEL_MEM_HOST, 0, 100}};
		sel_rank_geometry rg = {.row = {"row", SEL_MEM_HOST, 0, 9000},
					.row_count = 4,
					.pages = planes,
					.n_planes = 3,
					.page_count = 64};
		sel_geometry g = {.ranks = 1, .page_tokens = 64, .rank = &rg};
		uint8_t id[SEL_IDENTITY_BYTES];
		memset(id, 0x11, sizeof id);
		if (sel_record_ns_init(&ns, &g, id))
			fail("manifest: namespace");
		ns_ready = true;
	}
	if (n < 16 + 88 + 16)
		return;
	/* Ask for the key the embedded header names, so decoding goes deep. */
	sel_key want;
	memcpy(&want.consumed, d + 16 + 80, 8);
	memcpy(want.digest.b, d + 16 + 88, 16);
	struct sel_rv_manifest m;
	int rc = sel_rv_manifest_decode(&ns, &want, d, n, &m);
	if (rc) {
		if (rc != SEL_EFORMAT && rc != SEL_ECORRUPT && rc != SEL_EIDENTITY &&
		    rc != SEL_ELAYOUT && rc != -EOVERFLOW && rc != SEL_EOVERSIZE)
			fail("manifest: unexpected code");
		check_message();
		return;
	}
	if (m.cksum + 8ull * m.h.d.tail != d + n)
		fail("manifest: checksums not at the end");
	uint64_t pages = 0, row = 0;
	for (uint32_t w = 0; w < m.layout.windows; w++) {
		struct sel_rv_extent e;
		sel_rv_extent(&m.layout, w, &e);
		if (!e.len || e.len > m.cap)
			fail("manifest: a window beyond its cap");
		if (e.row)
			row += e.len;
		else
			pages += e.len;
	}
	if (pages != m.h.d.tail * m.layout.stride || row != m.row_bytes)
		fail("manifest: windows do not cover the record");
}

static void fuzz_keys(const uint8_t *d, size_t n)
{
	uint8_t k[32];
	int rc = sel_rv_key_parse(d, n, k);
	if (rc && rc != SEL_EFORMAT)
		fail("key file: unexpected code");
	if (rc)
		check_message();
	sel_key key;
	if (sel_rv_member_parse((const char *)d, n, &key) == 0) {
		char back[SEL_RECORD_NAME_MAX];
		sel_record_name(&key, back);
		if (strlen(back) != n || memcmp(back, d, n) != 0)
			fail("member: does not print back to itself");
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const uint8_t *d = data + 1;
	size_t n = size - 1;
	switch (data[0] % 6) {
	case 0: fuzz_redirect(d, n); break;
	case 1: fuzz_slotmap(d, n); break;
	case 2: fuzz_url(d, n); break;
	case 3: fuzz_value(d, n); break;
	case 4: fuzz_manifest(d, n); break;
	case 5: fuzz_keys(d, n); break;
	}
	return 0;
}
