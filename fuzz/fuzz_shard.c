/*
 * fuzz_shard.c - libFuzzer target for the rank links' frame decoder
 * (src/selene/shard_proto.c) and the scan agreement (shard_agree.c), design
 * 2.14; STYLE.md 13.  Its corpus, fuzz/corpus/shard/ (written by
 * `test_shard_proto --write-corpus`), replays in make check through
 * build/fuzz/replay_shard.
 *
 * The input is read two ways:
 *   1. as a byte stream of frames, the way both ends read their sockets;
 *   2. as a type byte and a payload, so the fuzzer reaches every message's
 *      fields without first having to get a header right.
 * Each frame is decoded without limits and under a peer's limits (64 pages,
 * 4 slots, a one-rank layout of 64-token pages).  Besides "never crashes,
 * never reads past the input, never leaks": a failure is SEL_EFORMAT (or
 * -ENOMEM) with a one-line message; a frame that decodes is canonical (it
 * encodes back to exactly its bytes); a job that decodes under limits has
 * every page id and slot inside them; and the entries of a decoded scan
 * summary, given to the agreement as two ranks' summaries, give valid
 * actions or a refusal of duplicates.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "record.h"
#include "shard_agree.h"
#include "shard_proto.h"

static void fail(const char *what)
{
	fprintf(stderr, "fuzz_shard: %s (message '%s')\n", what, eos_errmsg());
	abort();
}

static const struct sel_record_sizes *sizes(void)
{
	static sel_record_layout l;
	static bool done;
	if (!done) {
		static sel_plane planes[2] = {{.name = (char *)"k", .unit_bytes = 4096},
					      {.name = (char *)"v", .unit_bytes = 100}};
		static sel_rank_geometry rg = {.pages = planes,
					       .n_planes = 2,
					       .page_count = 64,
					       .row = {.name = (char *)"state", .unit_bytes = 5000},
					       .row_count = 4};
		rg.page_bytes = 4196;
		sel_geometry g = {.ranks = 1, .page_tokens = 64, .rank = &rg};
		if (sel_record_layout_init(&l, &g))
			fail("layout");
		done = true;
	}
	return &l.sz;
}

static void agree(const struct sel_shard_scan *s)
{
	if (!s->n)
		return;
	struct sel_shard_entry *rev = malloc(s->n * sizeof *rev);
	uint8_t *a0 = malloc(s->n), *a1 = malloc(s->n);
	if (!rev || !a0 || !a1)
		abort();
	for (uint32_t i = 0; i < s->n; i++) {
		rev[i] = s->e[s->n - 1 - i];
		if (i % 3 == 1)
			rev[i].has_row = false;
	}
	const struct sel_shard_entry *ent[2] = {s->e, rev};
	size_t n[2] = {s->n, s->n};
	uint8_t *act[2] = {a0, a1};
	struct sel_shard_agree_stats st;
	int rc = sel_shard_agree(2, 64, ent, n, act, &st);
	if (rc && rc != SEL_EFORMAT)
		fail("agreement: unexpected error");
	if (!rc) {
		for (uint32_t i = 0; i < s->n; i++)
			if (a0[i] >= SEL_SHARD_ACTIONS || a1[i] >= SEL_SHARD_ACTIONS)
				fail("agreement: an action out of range");
		if (st.kept > s->n || st.kept_row > st.kept)
			fail("agreement: counts");
	}
	free(rev);
	free(a0);
	free(a1);
}

static void one(const uint8_t *b, size_t len, const struct sel_shard_limits *lim)
{
	struct sel_shard_msg m;
	int rc = sel_shard_decode(b, len, lim, &m);
	if (rc) {
		if (rc != SEL_EFORMAT && rc != -ENOMEM)
			fail("unexpected error code");
		if (!*eos_errmsg() || strchr(eos_errmsg(), '\n'))
			fail("a failure without a one-line message");
		return;
	}
	if (m.type == SEL_SHARD_JOB && lim) {
		for (uint32_t i = 0; i < m.u.job.n_pages; i++)
			if (m.u.job.pages[i] >= lim->pages)
				fail("a page id out of range decoded");
		if (m.u.job.slot != SEL_SHARD_NO_SLOT && m.u.job.slot >= lim->slots)
			fail("a slot out of range decoded");
	}
	if (m.type == SEL_SHARD_SCAN && !lim)
		agree(&m.u.scan);
	int64_t n = sel_shard_encoded_size(&m);
	if (n < 0)
		fail("a decoded frame does not encode");
	if ((size_t)n != len)
		fail("a decoded frame encodes to another length");
	uint8_t *e = malloc((size_t)n);
	if (!e)
		abort();
	if (sel_shard_encode(&m, e, (size_t)n) != n || memcmp(e, b, len))
		fail("a decoded frame is not canonical");
	free(e);
	sel_shard_msg_free(&m);
}

static void both(const uint8_t *b, size_t len)
{
	struct sel_shard_limits lim = {.pages = 64, .slots = 4, .sz = sizes()};
	one(b, len, NULL);
	one(b, len, &lim);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* 1: a stream of frames. */
	size_t at = 0;
	while (at < size) {
		uint16_t type;
		uint32_t plen;
		if (size - at < SEL_SHARD_FRAME_HEADER ||
		    sel_shard_frame_header(data + at, size - at, &type, &plen))
			break;
		size_t flen = SEL_SHARD_FRAME_HEADER + (size_t)plen;
		if (size - at < flen)
			break;
		both(data + at, flen);
		at += flen;
	}
	/* 2: a type byte and a payload. */
	if (size >= 1 && size - 1 <= SEL_SHARD_FRAME_MAX) {
		uint8_t *f = malloc(SEL_SHARD_FRAME_HEADER + size - 1);
		if (!f)
			abort();
		sel_put_u32(f, (uint32_t)(size - 1));
		sel_put_u16(f + 4, (uint16_t)(data[0] % SEL_SHARD_TYPES));
		sel_put_u16(f + 6, 0);
		memcpy(f + SEL_SHARD_FRAME_HEADER, data + 1, size - 1);
		both(f, SEL_SHARD_FRAME_HEADER + size - 1);
		free(f);
	}
	return 0;
}
