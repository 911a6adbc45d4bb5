/*
 * fuzz_ranks.c - libFuzzer target for the execution protocol's frame
 * decoder (src/helios/ranks_proto.c; docs/multihost.md "Execution").  Its
 * corpus, fuzz/corpus/ranks/ (written by `test_ranks_proto --write-corpus`),
 * replays in make check through build/fuzz/replay_ranks.
 *
 * The input is read as a byte stream of frames, the way both ends read
 * their sockets, and as a type byte and a payload behind a made header.
 * Besides "never crashes, never reads past the input, never leaks": a
 * failure is SEL_EFORMAT or -ENOMEM with a message; a frame that decodes
 * encodes back to exactly its bytes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "helios/ranks_proto.h"
#include "internal.h"

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_ranks: %s (message '%s')\n", what, eos_errmsg());
	abort();
}

static void one(const uint8_t *b, size_t len)
{
	struct hel_rp_msg m;
	int rc = hel_rp_decode(b, len, &m);
	if (rc == 0) {
		int64_t n = hel_rp_encode(&m, NULL, 0);
		uint8_t *e = n > 0 ? malloc((size_t)n) : NULL;
		if (n != (int64_t)len || !e || hel_rp_encode(&m, e, (size_t)n) != n ||
		    memcmp(e, b, len))
			fail("a decoded frame does not encode back to its bytes");
		free(e);
	} else if (rc != SEL_EFORMAT && rc != -ENOMEM) {
		fail("a refusal other than SEL_EFORMAT");
	} else if (!eos_errmsg()[0]) {
		fail("a refusal without a message");
	}
	hel_rp_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* 1: a stream of frames. */
	size_t at = 0;
	while (size - at >= HEL_RP_HEADER) {
		uint16_t type;
		uint32_t plen;
		if (hel_rp_header(data + at, size - at, &type, &plen))
			break;
		size_t whole = HEL_RP_HEADER + (size_t)plen;
		if (whole > size - at)
			break;
		one(data + at, whole);
		at += whole;
	}
	/* 2: a type byte and a payload. */
	if (size >= 1 && size - 1 <= (1u << 20)) {
		uint8_t *f = malloc(HEL_RP_HEADER + size - 1);
		if (!f)
			return 0;
		sel_put_u32(f, (uint32_t)(size - 1));
		sel_put_u16(f + 4, (uint16_t)(1 + data[0] % HEL_RP_TYPE_MAX));
		sel_put_u16(f + 6, 0);
		memcpy(f + HEL_RP_HEADER, data + 1, size - 1);
		one(f, HEL_RP_HEADER + size - 1);
		free(f);
	}
	return 0;
}
