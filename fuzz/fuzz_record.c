/*
 * fuzz_record.c - libFuzzer target for the record header decoder and record
 * names (design 2.5; STYLE.md 13).  Its corpus, fuzz/corpus/record/, replays
 * in make check through build/fuzz/replay_record.
 *
 * The input is taken as a record file's first bytes.  Besides "never
 * crashes, never reads past the input", it checks:
 *   1. Failures are one of the decoder's codes, with a one-line message.
 *   2. sel_record_header_bytes agrees with decode about the header size.
 *   3. A header that decodes is canonical: rebuilding a namespace from it
 *      (identity, fingerprint, the rank table parsed back) and encoding the
 *      decoded fields gives back exactly the input's header bytes, and it
 *      decodes again against that namespace.
 *   4. Its span is aligned and ordered.
 * The checks run twice: on the input as it is, and on a copy whose v2
 * header checksum is recomputed, so the fuzzer reaches the structural rules
 * behind the checksum.  The input's first 64 bytes, as a string, also go
 * through the record name parser, whose successes must print back to the
 * same name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"

#include "internal.h"
#include "record.h"

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_record: %s (message '%s')\n", what, eos_errmsg());
	abort();
}

static void check_name(const uint8_t *data, size_t size)
{
	char s[SEL_RECORD_NAME_MAX + 1];
	size_t n = size < SEL_RECORD_NAME_MAX ? size : SEL_RECORD_NAME_MAX;
	memcpy(s, data, n);
	s[n] = '\0';
	sel_key k;
	if (sel_record_name_parse(s, &k) != 0)
		return;
	char back[SEL_RECORD_NAME_MAX];
	sel_record_name(&k, back);
	if (strcmp(back, s) != 0)
		fail("a parsed name does not print back to itself");
}

static void check_header(const uint8_t *data, size_t size)
{
	sel_record_header h;
	int rc = sel_record_decode(data, size, NULL, &h);
	int hb = sel_record_header_bytes(data, size);
	if (rc != 0) {
		if (rc != SEL_EFORMAT && rc != SEL_ECORRUPT && rc != -EOVERFLOW)
			fail("unexpected error code");
		const char *m = eos_errmsg();
		if (!*m || strchr(m, '\n'))
			fail("failure without a one-line message");
		return;
	}
	if (hb < 0 || (uint32_t)hb != h.span.header_bytes || (size_t)hb > size)
		fail("header size disagrees with decode");
	const sel_record_span *s = &h.span;
	if (s->page_off % 4096 || s->row_off % 4096 || s->row_end % 4096 || s->page_stride % 4096 ||
	    s->page_off != s->cksum_off + s->cksum_bytes || s->row_off < s->page_off ||
	    s->row_end <= s->row_off)
		fail("span not aligned or not ordered");

	sel_record_ns ns;
	memset(&ns, 0, sizeof(ns));
	memcpy(ns.identity, h.identity, sizeof ns.identity);
	memcpy(ns.fingerprint, h.fingerprint, sizeof ns.fingerprint);
	rc = sel_record_layout_parse(&ns.layout, data, size);
	if (rc == -ENOMEM)
		return;
	if (rc != 0)
		fail("a decodable header's rank table does not parse");
	uint8_t *again = malloc((size_t)hb);
	if (!again)
		fail("out of memory");
	if (sel_record_encode(&ns, &h.d, h.row_checksum, h.created_ns, h.version, again,
			      (size_t)hb) != hb)
		fail("a decoded header does not encode");
	if (memcmp(again, data, (size_t)hb) != 0)
		fail("re-encoding a decoded header changes its bytes");
	sel_record_header h2;
	if (sel_record_decode(again, (size_t)hb, &ns, &h2) != 0)
		fail("a header does not decode against its own namespace");
	if (memcmp(&h2.span, &h.span, sizeof h.span) != 0)
		fail("spans differ after a round trip");
	free(again);
	sel_record_layout_free(&ns.layout);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_name(data, size);
	check_header(data, size);
	int hb = sel_record_header_bytes(data, size);
	if (hb > 0 && (size_t)hb <= size && sel_get_u32(data + 8) >= 2) {
		uint8_t *copy = malloc(size);
		if (!copy)
			return 0;
		memcpy(copy, data, size);
		memset(copy + 176, 0, 8);
		sel_put_u64(copy + 176, XXH3_64bits(copy, (size_t)hb));
		check_header(copy, size);
		free(copy);
	}
	return 0;
}
