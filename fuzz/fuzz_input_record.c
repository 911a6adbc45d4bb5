/*
 * fuzz_input_record.c - libFuzzer target for the .input record decoder
 * (src/selene/input_record.c, design 2.13; STYLE.md 13).  Its corpus,
 * fuzz/corpus/input_record/ (written by `build/tests/test_input_record
 * --write-corpus DIR`), replays in make check through
 * build/fuzz/replay_input_record.
 *
 * The input is taken as a record file.  Besides "never crashes, never reads
 * past the input", it checks:
 *   1. Failures are one of the decoder's codes, with a one-line message.
 *   2. sel_input_header_bytes agrees with decode about the header size.
 *   3. A record that decodes and verifies is canonical: building one from
 *      the decoded fields and the input's payload and sealing it at the
 *      same creation time gives back exactly the input's bytes.
 *   4. Adopting the input succeeds exactly when decode and verify do.
 * The checks run twice: on the input as it is, and on a copy whose header
 * checksum is recomputed, so the fuzzer reaches the rules behind it.  The
 * first bytes, as a string, also go through the name parser, whose
 * successes must print back to the same name.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xxh.h"

#include "eos.h"
#include "input_record.h"
#include "internal.h"

#define REBUILD_MAX (4u << 20)

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_input_record: %s (message '%s')\n", what, eos_errmsg());
	abort();
}

static void check_name(const uint8_t *data, size_t size)
{
	char s[SEL_INPUT_NAME_LEN + 1];
	size_t n = size < SEL_INPUT_NAME_LEN ? size : SEL_INPUT_NAME_LEN;
	memcpy(s, data, n);
	s[n] = 0;
	uint32_t kind;
	sel_input_key k;
	if (sel_input_name_parse(s, &kind, &k) != 0)
		return;
	char back[SEL_INPUT_NAME_LEN];
	sel_input_name(kind, &k, back);
	if (strcmp(back, s) != 0)
		fail("a parsed name does not print back to itself");
}

static void check(const uint8_t *data, size_t size)
{
	sel_input_header h;
	int rc = sel_input_decode(data, size, &h);
	int hb = sel_input_header_bytes(data, size);
	if (rc != 0) {
		if (rc != SEL_EFORMAT && rc != SEL_ECORRUPT)
			fail("unexpected error code");
		const char *m = eos_errmsg();
		if (!*m || strchr(m, '\n'))
			fail("failure without a one-line message");
		return;
	}
	if (hb < 0 || (uint32_t)hb != h.header_bytes || (size_t)hb > size)
		fail("header size disagrees with decode");
	if (h.file_bytes != h.header_bytes + h.payload_bytes || h.header_bytes % 64)
		fail("sizes do not add up");
	int vrc = sel_input_verify(&h, data, size);
	if (vrc != 0 && vrc != SEL_EFORMAT && vrc != SEL_ECORRUPT)
		fail("unexpected verify code");

	if (h.file_bytes <= size && h.file_bytes <= REBUILD_MAX) {
		sel_input_rec r;
		if (h.kind == SEL_INPUT_SOURCE) {
			rc = sel_input_source_init(&r, &h.key, &h.src, h.created_ns);
		} else {
			rc = sel_input_prepared_init(&r, &h.key, h.tensors, h.count);
			for (uint32_t i = 0; !rc && i < h.count; i++)
				memcpy(sel_input_data(&r, i), data + h.tensors[i].offset,
				       (size_t)h.tensors[i].bytes);
			if (!rc)
				rc = sel_input_seal(&r, h.created_ns);
		}
		if (rc == -ENOMEM)
			return;
		if (rc)
			fail("a decoded header does not build");
		if (vrc == 0 && h.created_ns && memcmp(r.bytes, data, (size_t)h.file_bytes) != 0)
			fail("rebuilding a verified record changes its bytes");
		sel_input_rec_free(&r);
	}

	uint8_t *copy = malloc(size ? size : 1);
	if (!copy)
		return;
	memcpy(copy, data, size);
	sel_input_rec a;
	rc = sel_input_rec_adopt(&a, copy, size, h.kind, &h.key);
	if ((rc == 0) != (vrc == 0))
		fail("adopt disagrees with decode and verify");
	if (rc == 0)
		sel_input_rec_free(&a);
	else
		free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_name(data, size);
	check(data, size);
	int hb = sel_input_header_bytes(data, size);
	if (hb > 0 && (size_t)hb <= size) {
		uint8_t *copy = malloc(size);
		if (!copy)
			return 0;
		memcpy(copy, data, size);
		memset(copy + 72, 0, 8);
		sel_put_u64(copy + 72, XXH3_64bits(copy, (size_t)hb));
		check(copy, size);
		free(copy);
	}
	return 0;
}
