/*
 * fuzz_pool_proto.c - libFuzzer target for the pool protocol's decoder
 * (src/selene/pool_proto.c; design 2.15; STYLE.md 13).  Its corpus,
 * fuzz/corpus/pool_proto/ (written by `test_pool_proto --write-corpus`),
 * replays in make check through build/fuzz/replay_pool_proto.
 *
 * The input is read two ways:
 *   1. as a byte stream of frames, the way both ends read their socket:
 *      header, then the whole frame, then the next;
 *   2. as a type byte followed by a payload, so the fuzzer reaches every
 *      message's fields without first having to get a header right.
 * Besides "never crashes, never reads past the input, never leaks", every
 * frame that decodes must be canonical: it encodes back to exactly its own
 * bytes.  A failure must be SEL_EFORMAT (or -ENOMEM) with a message.  The
 * windows of a decoded grant, put grant or export request also go through
 * sel_pool_windows_check, which must not crash either.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "pool_proto.h"

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_pool_proto: %s (message '%s')\n", what, eos_errmsg());
	abort();
}

static void windows(const struct sel_pool_window *w, uint32_t n)
{
	(void)sel_pool_windows_check(w, n, 1ull << 30, 65536, 8192, n ? w[0].slots : 0, 1);
	(void)sel_pool_windows_check(w, n, UINT64_MAX, 0, 4096, 0, 0);
}

static void one(const uint8_t *b, size_t len)
{
	struct sel_pool_msg m;
	int rc = sel_pool_decode(b, len, &m);
	if (rc) {
		if (rc != SEL_EFORMAT && rc != -ENOMEM)
			fail("unexpected error code");
		if (!*eos_errmsg() || strchr(eos_errmsg(), '\n'))
			fail("a failure without a one-line message");
		return;
	}
	if (m.type == SEL_POOL_M_CLAIM_GRANT)
		windows(m.u.grant.windows, m.u.grant.n_windows);
	else if (m.type == SEL_POOL_M_PUT_GRANT)
		windows(m.u.put_grant.windows, m.u.put_grant.n_windows);
	else if (m.type == SEL_POOL_M_EXPORT_REQUEST)
		windows(m.u.export_req.windows, m.u.export_req.n_windows);
	int64_t n = sel_pool_encoded_size(&m);
	if (n < 0)
		fail("a decoded frame does not encode");
	if ((size_t)n != len)
		fail("a decoded frame encodes to another length");
	uint8_t *e = malloc((size_t)n);
	if (!e)
		abort();
	if (sel_pool_encode(&m, e, (size_t)n) != n || memcmp(e, b, len))
		fail("a decoded frame is not canonical");
	free(e);
	sel_pool_msg_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* 1: a stream of frames. */
	size_t at = 0;
	while (at < size) {
		uint16_t type;
		uint32_t plen;
		int rc = sel_pool_frame_header(data + at, size - at, &type, &plen);
		if (rc)
			break;
		size_t flen = SEL_POOL_FRAME_HEADER + (size_t)plen;
		if (size - at < flen)
			break;
		one(data + at, flen);
		at += flen;
	}
	/* 2: a type byte and a payload. */
	if (size >= 1 && size - 1 <= SEL_POOL_FRAME_MAX) {
		uint8_t *f = malloc(SEL_POOL_FRAME_HEADER + size - 1);
		if (!f)
			abort();
		sel_put_u32(f, (uint32_t)(size - 1));
		sel_put_u16(f + 4, (uint16_t)(data[0] & 0x4f));
		sel_put_u16(f + 6, 0);
		memcpy(f + SEL_POOL_FRAME_HEADER, data + 1, size - 1);
		one(f, SEL_POOL_FRAME_HEADER + size - 1);
		free(f);
	}
	return 0;
}
