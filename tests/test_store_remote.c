/*
 * test_store_remote.c - the remote level as a store (issue 16 part B,
 * src/selene/store_remote*.c) against a real redis-server on loopback:
 *   - two stores over the same planes stand for two hosts: A (no local
 *     tier: every put is copied out and written to Redis) and B (a memory
 *     tier inside the remote level); B's lookup is pending, then a remote
 *     hit, restored byte for byte into other page ids and another slot,
 *     tier remote; B's own put commits to memory first (its STORED event
 *     comes after the level's copy-out), is found present on Redis, and
 *     then a memory hit is served by the inner store;
 *   - TP2: records packed where the ranks' bytes are the same, per rank
 *     where not, both restored byte for byte; a chain mixing the two is a
 *     miss unless the packed part is GPU-resident;
 *   - Redis killed during a claim: FETCH_FAILED, destinations untouched by
 *     the failed claim, the level reconnects after a restart (empty: a
 *     miss) and restores again once A writes again;
 *   - a clean stop right after a put writes the record before it returns;
 *   - Redis stopped (SIGSTOP): every store call returns at once, a lookup
 *     ends as a miss within the grace period, a close with queued writes
 *     ends by its deadline.
 *   - overlapped restores (issue 18): a tail fetched with the head's
 *     digests from the manifest; the second lookup at the split point
 *     answered from the first one's hit without a Redis command, and a
 *     record rewritten between the two failing the claim;
 * Exits 77 without redis-server.
 */
#include <poll.h>
#include <signal.h>

#include "redisfx.h"
#include "selene_store.h"
#include "storefx.h"
#include "testutil.h"

#define SEC 1000000000ull
#define MS 1000000ull

static char *dir;
static struct rfx_server srv;
static char url[256];

static const uint64_t units[] = {4096, 1000};

static sel_store *open_level(struct sfx *f, uint64_t memory)
{
	sel_store_config cfg = sfx_config(f, false);
	cfg.remote = url;
	cfg.memory_bytes = memory;
	cfg.remote_window_bytes = 8192; /* several windows per record */
	sel_store *s = NULL;
	CHECK_RC(sel_store_open(&cfg, &s), 0);
	CHECK(s != NULL);
	sel_store_info si;
	sel_store_describe(s, &si);
	CHECK(si.remote && strstr(si.remote, "1 node: 127.0.0.1:"));
	CHECK(!strcmp(si.kind, memory ? "memory" : "remote"));
	return s;
}

/* Lookup until it is not pending (10 s); events on the way are failures. */
static int lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		  sel_hit *hit)
{
	uint64_t end = eos_now_ns() + 10 * SEC;
	for (;;) {
		int rc = sel_store_lookup(s, h, resident, limit, hit);
		if (rc != SEL_LOOKUP_PENDING)
			return rc;
		CHECK(eos_now_ns() < end);
		sel_event ev[4];
		CHECKF(sfx_poll_wait(s, ev, 4) == 0, "an event while a lookup waits");
	}
}

static sel_stats stats(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	return st;
}

/* A lookup that should hit: on a loaded machine the grace period may end
 * before Redis answers (the level counts it late and the lookup misses);
 * the kept answer serves the next attempt, as the engine's next admission
 * pass does, so ask again (10 s). */
static int lookup_hit(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		      sel_hit *hit)
{
	uint64_t end = eos_now_ns() + 10 * SEC;
	for (;;) {
		int rc = lookup(s, h, resident, limit, hit);
		if (rc != 0 || eos_now_ns() >= end)
			return rc;
		sel_event ev[4];
		CHECKF(sfx_poll_wait(s, ev, 4) == 0, "an event while a lookup waits");
	}
}

/* Pump until n records were written to (or found on) Redis and nothing is
 * in flight; the events polled meanwhile go to ev (their count in *n_ev). */
static void written(sel_store *s, uint64_t n, sel_event *ev, int *n_ev, int cap)
{
	uint64_t end = eos_now_ns() + 20 * SEC;
	for (;;) {
		sel_stats st = stats(s);
		if (st.remote.stored + st.remote.present >= n && st.remote.writes_in_flight == 0 &&
		    st.inflight_out == 0)
			return;
		CHECKF(eos_now_ns() < end, "%llu records not written", (unsigned long long)n);
		int k = sfx_poll_wait(s, ev + *n_ev, cap - *n_ev);
		*n_ev += k;
		CHECK(*n_ev < cap);
	}
}

static sel_event fetch_event(sel_store *s, uint64_t ticket)
{
	uint64_t end = eos_now_ns() + 20 * SEC;
	for (;;) {
		sel_event ev[8];
		int n = sfx_poll_wait(s, ev, 8);
		for (int i = 0; i < n; i++)
			if ((ev[i].type == SEL_EV_FETCHED || ev[i].type == SEL_EV_FETCH_FAILED) &&
			    ev[i].ticket == ticket)
				return ev[i];
		CHECK(eos_now_ns() < end);
	}
}

static uint32_t ids[64];

static sel_inbound inbound(uint32_t first, uint32_t n, uint32_t slot, uint64_t ticket)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = first + i;
	return (sel_inbound){.ticket = ticket, .pages = ids, .n_pages = n, .state_slot = slot};
}

static void check_restored(struct sfx *f, struct sfx_conv *cv, uint64_t c, uint32_t first,
			   uint32_t slot)
{
	for (uint32_t j = 0; j < c / SFX_PT; j++)
		CHECKF(sfx_page_ok(f, first + j, cv->tag, j, false), "page %u", j);
	CHECK(sfx_row_ok(f, slot, sfx_row_seed(cv, c), false));
}

/* The last restore of a test (cv2's 192 tokens from hit into ids 200..,
 * slot 6, through s), then the end: both stores closed, all freed. */
static void restore_and_end(struct sfx *f, struct sfx_conv *cv, struct sfx_conv *cv2,
			    const sel_hit *hit, sel_store *s, sel_store *a, sel_store *b,
			    uint64_t ticket)
{
	sel_inbound in = inbound(200, 3, 6, ticket);
	CHECK_RC(sel_store_fetch(s, hit, &in), 0);
	sel_event fe = fetch_event(s, ticket);
	CHECK(fe.type == SEL_EV_FETCHED);
	check_restored(f, cv2, 192, 200, 6);
	CHECK_RC(sel_store_close(a, eos_now_ns() + 5 * SEC), 0);
	CHECK_RC(sel_store_close(b, eos_now_ns() + 5 * SEC), 0);
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(cv);
	sfx_conv_free(cv2);
	sfx_free(f);
}

static void test_two_hosts(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 21, 300, 10);
	sel_store *a = open_level(&f, 0);
	sel_store *b = open_level(&f, 8ull << 20);

	/* A: the record is copied out and written; its STORED event says the
	 * GPU pages are free again. */
	sel_published cp = sfx_ckpt_row(&f, &cv, 256, 0, 1, 77, false);
	sel_retry_reason why;
	CHECK(sel_store_put(a, &cp, &why) == SEL_QUEUED);
	sel_event ev[16];
	int n_ev = 0;
	written(a, 1, ev, &n_ev, 16);
	CHECK(n_ev == 1 && ev[0].type == SEL_EV_STORED && ev[0].checkpoint == 77);
	CHECK(stats(a).remote.stored == 1);
	/* Known on Redis: offered again, nothing is copied. */
	CHECK(sel_store_put(a, &cp, &why) == SEL_PRESENT);

	/* B: pending, then a remote hit, restored into ids 100.. slot 5. */
	sel_hit hit;
	CHECK(sel_store_lookup(b, &cv.h, 0, 300, &hit) == SEL_LOOKUP_PENDING);
	CHECK_RC(lookup_hit(b, &cv.h, 0, 300, &hit), 1);
	CHECK(hit.tier == SEL_TIER_REMOTE && hit.pages == 4 && sel_key_eq(&hit.key, &cp.key));
	sfx_poison(&f);
	sfx_ckpt_row(&f, &cv, 256, 0, 1, 77, false); /* A's GPU bytes back for later */
	sel_inbound in = inbound(100, 4, 5, 9);
	CHECK_RC(sel_store_fetch(b, &hit, &in), 0);
	sel_event fe = fetch_event(b, 9);
	CHECKF(fe.type == SEL_EV_FETCHED && fe.tier == SEL_TIER_REMOTE, "fetch: %d error %d",
	       fe.type, fe.error);
	check_restored(&f, &cv, 256, 100, 5);
	CHECK(stats(b).remote.hits == 1 && stats(b).remote.bytes_in > 0);
	/* The hit was consumed: a second fetch of it is stale. */
	sel_inbound whole = inbound(100, 4, 5, 14);
	CHECK(sel_store_fetch(b, &hit, &whole) == -ESTALE);

	/* B publishes the restored checkpoint: the memory tier commits it, the
	 * level finds it present on Redis (known from the claim: no write). */
	sel_published rp = cp;
	rp.checkpoint = 78;
	rp.pages = ids;
	rp.state_slot = 5;
	CHECK(sel_store_put(b, &rp, &why) == SEL_QUEUED);
	n_ev = 0;
	written(b, 0, ev, &n_ev, 16);
	CHECK(n_ev == 1 && ev[0].type == SEL_EV_STORED && ev[0].checkpoint == 78);
	CHECK(stats(b).remote.puts == 0);
	/* Now the inner store has it: Redis is asked for more (the limit is
	 * past it), has no deeper record, and the closest level serves. */
	CHECK_RC(lookup_hit(b, &cv.h, 0, 300, &hit), 1);
	CHECK(hit.tier == SEL_TIER_MEMORY);
	/* Up to the limit the inner store answers at once. */
	CHECK_RC(sel_store_lookup(b, &cv.h, 0, 256, &hit), 1);
	CHECK(hit.tier == SEL_TIER_MEMORY);

	/* A longer conversation on B: copied out for Redis after its memory
	 * commit, its STORED event after both. */
	struct sfx_conv cv2;
	sfx_conv_init(&f, &cv2, 22, 200, 40);
	sel_published cp2 = sfx_ckpt_row(&f, &cv2, 192, 0, 2, 79, false);
	CHECK(sel_store_put(b, &cp2, &why) == SEL_QUEUED);
	n_ev = 0;
	written(b, 1, ev, &n_ev, 16);
	CHECK(n_ev == 1 && ev[0].type == SEL_EV_STORED && ev[0].checkpoint == 79);
	CHECK(stats(b).remote.stored == 1);
	/* ... and A restores it from Redis (no local tier). */
	CHECK_RC(lookup_hit(a, &cv2.h, 0, 200, &hit), 1);
	CHECK(hit.tier == SEL_TIER_REMOTE && hit.pages == 3);
	restore_and_end(&f, &cv, &cv2, &hit, a, a, b, 10);
}

static void test_killed_during_claim(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 31, 300, 10);
	sel_store *a = open_level(&f, 0);
	sel_store *b = open_level(&f, 0);
	sel_published cp = sfx_ckpt_row(&f, &cv, 256, 0, 1, 7, false);
	sel_retry_reason why;
	CHECK(sel_store_put(a, &cp, &why) == SEL_QUEUED);
	sel_event ev[16];
	int n_ev = 0;
	written(a, 1, ev, &n_ev, 16);

	sel_hit hit;
	CHECK_RC(lookup_hit(b, &cv.h, 0, 300, &hit), 1);
	/* The claim's window reads reach a server that no longer answers,
	 * which is then killed: the claim fails, nothing was copied in. */
	rfx_signal(&srv, SIGSTOP);
	sel_inbound in = inbound(100, 4, 5, 11);
	for (uint32_t i = 0; i < 4; i++)
		memset(f.plane[0][0] + (size_t)(100 + i) * units[0], 0x5a, units[0]);
	CHECK_RC(sel_store_fetch(b, &hit, &in), 0);
	rfx_kill(&srv);
	sel_event fe = fetch_event(b, 11);
	CHECKF(fe.type == SEL_EV_FETCH_FAILED && fe.error != 0, "type %d", fe.type);
	for (uint32_t i = 0; i < 4; i++)
		CHECK(f.plane[0][0][(size_t)(100 + i) * units[0]] == 0x5a);
	CHECK(stats(b).remote.claim_failures == 1);

	/* Down: lookups miss without waiting for the network. */
	uint64_t t0 = eos_now_ns();
	CHECK_RC(lookup(b, &cv.h, 0, 300, &hit), 0);
	CHECK(eos_now_ns() - t0 < 2 * SEC);

	/* Restarted empty: a miss; A writes again (its key is still known,
	 * so a new conversation), B restores it. */
	rfx_restart(&srv);
	struct sfx_conv cv2;
	sfx_conv_init(&f, &cv2, 32, 200, 40);
	sel_published cp2 = sfx_ckpt_row(&f, &cv2, 192, 0, 2, 8, false);
	uint64_t end = eos_now_ns() + 20 * SEC;
	uint64_t before = stats(a).remote.stored;
	while (stats(a).remote.stored == before) {
		/* Until A's connection is back, its writes fail and are
		 * retried by the next offer, as the worker does. */
		CHECK(eos_now_ns() < end);
		sel_outcome o = sel_store_put(a, &cp2, &why);
		CHECK(o == SEL_QUEUED || o == SEL_SKIPPED);
		n_ev = 0;
		written(a, 0, ev, &n_ev, 16);
	}
	/* B reconnects by itself (its backoff, at most 2 s). */
	end = eos_now_ns() + 20 * SEC;
	for (;;) {
		sel_stats st = stats(b);
		if (st.remote.state == 1 && st.remote.reconnects >= 1)
			break;
		CHECK(eos_now_ns() < end);
		n_ev = 0;
		CHECK(sfx_poll_wait(b, ev, 16) == 0);
	}
	CHECK_RC(lookup_hit(b, &cv2.h, 0, 200, &hit), 1);
	restore_and_end(&f, &cv, &cv2, &hit, b, a, b, 12);
}

/* A clean stop right after a put: the copy-out and the queued remote write
 * finish within the close's deadline, and another host finds the record. */
static void test_clean_stop(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 51, 300, 10);
	sel_store *a = open_level(&f, 4ull << 20);
	sel_published cp = sfx_ckpt_row(&f, &cv, 256, 0, 1, 3, false);
	sel_retry_reason why;
	CHECK(sel_store_put(a, &cp, &why) == SEL_QUEUED);
	CHECK_RC(sel_store_close(a, eos_now_ns() + 10 * SEC), 0);
	CHECK(stats(a).remote.stored == 1);
	sel_store_destroy(a);
	sel_store *b = open_level(&f, 0);
	sel_hit hit;
	CHECK_RC(lookup_hit(b, &cv.h, 0, 300, &hit), 1);
	CHECK(hit.tier == SEL_TIER_REMOTE && sel_key_eq(&hit.key, &cp.key));
	CHECK_RC(sel_store_close(b, eos_now_ns() + 5 * SEC), 0);
	sel_store_destroy(b);
	sfx_conv_free(&cv);
	sfx_free(&f);
}

/* Every call of the worker returns at once while Redis hangs. */
#define QUICK_NS (500 * MS)

static void test_stopped(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 41, 300, 10);
	sel_store *a = open_level(&f, 4ull << 20);
	rfx_signal(&srv, SIGSTOP);
	uint64_t worst = 0, t0, end = eos_now_ns() + 10 * SEC;
	sel_published cp = sfx_ckpt_row(&f, &cv, 256, 0, 1, 5, false);
	sel_retry_reason why;
	t0 = eos_now_ns();
	CHECK(sel_store_put(a, &cp, &why) == SEL_QUEUED);
	worst = eos_now_ns() - t0;
	/* The memory tier commits; the remote write waits on a stalled
	 * server, the lookup ends as a memory hit or, above it, a miss. */
	struct sfx_conv cv2;
	sfx_conv_init(&f, &cv2, 42, 200, 40);
	int rc;
	sel_hit hit;
	do {
		CHECK(eos_now_ns() < end);
		t0 = eos_now_ns();
		rc = sel_store_lookup(a, &cv2.h, 0, 200, &hit);
		sel_event ev[4];
		(void)sfx_poll_wait(a, ev, 4);
		uint64_t d = eos_now_ns() - t0;
		worst = d > worst ? d : worst;
	} while (rc == SEL_LOOKUP_PENDING);
	CHECK_RC(rc, 0);
	CHECKF(worst < QUICK_NS, "a store call took %llu ms", (unsigned long long)(worst / MS));
	/* A close with the write still queued ends by its deadline. */
	t0 = eos_now_ns();
	CHECK_RC(sel_store_close(a, eos_now_ns() + SEC), 0);
	CHECK(eos_now_ns() - t0 < 3 * SEC);
	sel_store_destroy(a);
	rfx_signal(&srv, SIGCONT);
	sfx_conv_free(&cv);
	sfx_conv_free(&cv2);
	sfx_free(&f);
}

/* TP2 (issue 16 part B, gap 1): a record whose ranks' pages and row are the
 * same goes to Redis packed (design 2.5: one share for all ranks), one
 * whose ranks differ per rank; both restore byte for byte.  A chain whose
 * page-giving nodes mix the two is a miss; the same chain with the packed
 * node resident on the GPU restores. */
static void test_tp2_packed(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 2, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 41, 300, 10);
	cv.split = true;
	cv.split_from = 2; /* pages 0, 1 the same on both ranks; 2, 3 not */
	sel_store *a = open_level(&f, 0);
	sel_store *b = open_level(&f, 0);
	sel_retry_reason why;
	sel_event ev[16];
	int n_ev = 0;
	sel_published cp = sfx_ckpt_row(&f, &cv, 128, 0, 1, 81, false);
	CHECK(sel_store_put(a, &cp, &why) == SEL_QUEUED);
	written(a, 1, ev, &n_ev, 16);
	uint64_t packed = stats(a).remote.bytes_out;
	sel_published cp2 = sfx_ckpt_row(&f, &cv, 256, 128, 2, 82, true);
	CHECK(sel_store_put(a, &cp2, &why) == SEL_QUEUED);
	written(a, 2, ev, &n_ev, 16);
	uint64_t per_rank = stats(a).remote.bytes_out - packed;
	/* The same tail and row sizes: per rank is twice the packed record. */
	CHECKF(packed > 0 && per_rank + 8192 >= 2 * packed, "packed %llu bytes, per rank %llu",
	       (unsigned long long)packed, (unsigned long long)per_rank);

	/* The packed record alone: one share fanned out to both ranks. */
	sel_hit hit;
	CHECK_RC(lookup_hit(b, &cv.h, 0, 128, &hit), 1);
	CHECK(hit.tier == SEL_TIER_REMOTE && hit.pages == 2 && sel_key_eq(&hit.key, &cp.key));
	sfx_poison(&f);
	sel_inbound in = inbound(100, 2, 5, 11);
	CHECK_RC(sel_store_fetch(b, &hit, &in), 0);
	sel_event fe = fetch_event(b, 11);
	CHECKF(fe.type == SEL_EV_FETCHED, "fetch: %d error %d", fe.type, fe.error);
	for (uint32_t j = 0; j < 2; j++)
		CHECKF(sfx_page_ok(&f, 100 + j, cv.tag, j, false), "packed page %u", j);
	CHECK(sfx_row_ok(&f, 5, sfx_row_seed(&cv, 128), false));

	/* Both records from nothing resident: Redis has the chain (its hit is
	 * in, late or not), the level refuses it: a mixed chain, a miss. */
	uint64_t hits = stats(b).remote.hits;
	CHECK_RC(lookup(b, &cv.h, 0, 300, &hit), 0);
	SFX_UNTIL(b, NULL, stats(b).remote.hits > hits);
	CHECK_RC(lookup(b, &cv.h, 0, 300, &hit), 0);
	/* With the packed node on the GPU only per-rank pages are claimed. */
	CHECK_RC(lookup_hit(b, &cv.h, 128, 300, &hit), 1);
	CHECK(hit.tier == SEL_TIER_REMOTE && hit.pages == 2 && sel_key_eq(&hit.key, &cp2.key));
	in = inbound(110, 2, 6, 12);
	CHECK_RC(sel_store_fetch(b, &hit, &in), 0);
	fe = fetch_event(b, 12);
	CHECKF(fe.type == SEL_EV_FETCHED, "fetch: %d error %d", fe.type, fe.error);
	for (uint32_t j = 2; j < 4; j++)
		CHECKF(sfx_page_ok(&f, 110 + j - 2, cv.tag, j, true), "per-rank page %u", j);
	CHECK(sfx_row_ok(&f, 6, sfx_row_seed(&cv, 256), true));
	CHECK(stats(b).remote.corrupt == 0 && stats(b).remote.auth_failures == 0);
	CHECK_RC(sel_store_close(a, eos_now_ns() + 5 * SEC), 0);
	CHECK_RC(sel_store_close(b, eos_now_ns() + 5 * SEC), 0);
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&cv);
	sfx_free(&f);
}

/* An overlapped restore's tail from Redis (issue 18, fetch_sums): over a
 * 4-page record, B looks up at resident 128 and fetches pages 2 and 3
 * with the digests of pages 0 and 1, the head its engine recomputes: the
 * tail lands byte for byte and the digests, the manifest's version-4 page
 * checksums, equal sel_page_digest_padded of A's planes (the second plane
 * is padded: 1000 bytes to 4 KiB), and a changed head page's digest
 * differs from them (what the engine compares, engine_overlap.c). */
static void test_overlap_tail(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 23, 300, 10);
	sel_store *a = open_level(&f, 0), *b = open_level(&f, 0);
	CHECK(a->ops->fetch_sums && b->ops->fetch_sums);
	sel_published cp = sfx_ckpt_row(&f, &cv, 256, 0, 1, 81, false);
	sel_retry_reason why;
	CHECK(sel_store_put(a, &cp, &why) == SEL_QUEUED);
	sel_event ev[16];
	int n_ev = 0;
	written(a, 1, ev, &n_ev, 16);
	uint64_t want[2];
	for (uint32_t j = 0; j < 2; j++)
		CHECK_RC(sel_page_digest_padded(f.g, cp.pages[j], &want[j]), 0);
	sel_hit hit;
	CHECK_RC(lookup_hit(b, &cv.h, 128, 256, &hit), 1);
	CHECK(hit.tier == SEL_TIER_REMOTE && hit.pages == 2 && hit.resident == 128);
	uint64_t sums[2] = {0, 0};
	sel_inbound in = inbound(100, 2, 5, 11);
	in.sums = sums;
	in.n_sums = 2;
	CHECK_RC(sel_store_fetch(b, &hit, &in), 0);
	sel_event fe = fetch_event(b, 11);
	CHECKF(fe.type == SEL_EV_FETCHED, "fetch: %d error %d", fe.type, fe.error);
	for (uint32_t j = 2; j < 4; j++)
		CHECKF(sfx_page_ok(&f, 100 + j - 2, cv.tag, j, false), "page %u", j);
	CHECK(sfx_row_ok(&f, 5, sfx_row_seed(&cv, 256), false));
	CHECKF(sums[0] == want[0] && sums[1] == want[1],
	       "head digests %016" PRIx64 " %016" PRIx64 ", the planes' %016" PRIx64 " %016" PRIx64,
	       sums[0], sums[1], want[0], want[1]);
	/* A head page recomputed wrong would not match. */
	const sel_plane *pl = &f.g->rank[0].pages[0];
	((uint8_t *)(uintptr_t)pl->address)[(uint64_t)cp.pages[1] * pl->unit_bytes + 9] ^= 1;
	uint64_t bad;
	CHECK_RC(sel_page_digest_padded(f.g, cp.pages[1], &bad), 0);
	CHECK(bad != sums[1]);
	printf("  remote overlap tail: 2 pages with the head's 2 digests (the manifest's, "
	       "the planes')\n");
	CHECK_RC(sel_store_close(a, eos_now_ns() + 5 * SEC), 0);
	CHECK_RC(sel_store_close(b, eos_now_ns() + 5 * SEC), 0);
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&cv);
	sfx_free(&f);
}

/* Calls of one command so far (INFO commandstats), 0 before its first. */
static long long calls(const char *cmd)
{
	redisReply *x = rfx_cmd(&srv, "INFO commandstats");
	CHECK(x && x->type == REDIS_REPLY_STRING);
	char want[64];
	snprintf(want, sizeof want, "cmdstat_%s:calls=", cmd);
	const char *at = strstr(x->str, want);
	long long n = at ? atoll(at + strlen(want)) : 0;
	freeReplyObject(x);
	return n;
}

/* Redis commands a lookup or claim sends (not INFO, not SET). */
static long long reads(void) { return calls("smembers") + calls("get") + calls("exists"); }

/* Issue 18, the engine's path for a remote hit split at 128: B's lookup at
 * resident 0 finds the 4-page record; the second lookup, at 128 (the split
 * point), is answered at once from that hit (no Redis command, no new
 * remote lookup, not pending), the tail's fetch gives the head's digests
 * from the same manifest and restores pages 2-3 byte for byte; the claim
 * drops both answers (the next lookup asks Redis).  Only the same key is
 * answered so: a lookup at another limit goes to Redis.  And a record
 * rewritten on Redis between the two lookups (other bytes, a new
 * generation) fails the claim instead of restoring other bytes. */
static void test_overlap_second_lookup(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 24, 300, 10);
	sel_store *a = open_level(&f, 0), *b = open_level(&f, 0);
	sel_published cp = sfx_ckpt_row(&f, &cv, 256, 0, 1, 82, false);
	sel_retry_reason why;
	CHECK(sel_store_put(a, &cp, &why) == SEL_QUEUED);
	sel_event ev[16];
	int n_ev = 0;
	written(a, 1, ev, &n_ev, 16);
	uint64_t want[2];
	for (uint32_t j = 0; j < 2; j++)
		CHECK_RC(sel_page_digest_padded(f.g, cp.pages[j], &want[j]), 0);

	sel_hit hit, tail;
	CHECK_RC(lookup_hit(b, &cv.h, 0, 256, &hit), 1);
	CHECK(hit.tier == SEL_TIER_REMOTE && hit.pages == 4 && hit.resident == 0);
	sel_stats s0 = stats(b);
	long long r0 = reads();
	CHECK_RC(sel_store_lookup(b, &cv.h, 128, 256, &tail), 1); /* at once */
	CHECK(tail.tier == SEL_TIER_REMOTE && tail.pages == 2 && tail.resident == 128 &&
	      sel_key_eq(&tail.key, &hit.key));
	CHECK_RC(sel_store_lookup(b, &cv.h, 128, 256, &tail), 1); /* asked again: kept */
	sel_stats s1 = stats(b);
	CHECKF(reads() == r0 && s1.remote.lookups == s0.remote.lookups,
	       "the second lookup went to Redis: %lld commands, %llu lookups", reads() - r0,
	       (unsigned long long)(s1.remote.lookups - s0.remote.lookups));
	/* Another key (the history at 200): not this hit's, so Redis is asked. */
	sel_hit other;
	CHECK(sel_store_lookup(b, &cv.h, 128, 200, &other) == SEL_LOOKUP_PENDING);

	uint64_t sums[2] = {0, 0};
	sel_inbound in = inbound(100, 2, 5, 12);
	in.sums = sums;
	in.n_sums = 2;
	CHECK_RC(sel_store_fetch(b, &tail, &in), 0);
	sel_event fe = fetch_event(b, 12);
	CHECKF(fe.type == SEL_EV_FETCHED, "fetch: %d error %d", fe.type, fe.error);
	for (uint32_t j = 2; j < 4; j++)
		CHECKF(sfx_page_ok(&f, 100 + j - 2, cv.tag, j, false), "page %u", j);
	CHECK(sfx_row_ok(&f, 5, sfx_row_seed(&cv, 256), false));
	CHECK(sums[0] == want[0] && sums[1] == want[1]);
	/* Claimed: neither answer is kept, the whole hit is stale. */
	sel_inbound whole = inbound(100, 4, 5, 14);
	CHECK(sel_store_fetch(b, &hit, &whole) == -ESTALE);
	CHECK(sel_store_lookup(b, &cv.h, 128, 256, &tail) == SEL_LOOKUP_PENDING);

	/* The record rewritten between the lookups: other bytes in page 3,
	 * checksums and a generation of their own, written by a fresh host. */
	CHECK_RC(lookup_hit(b, &cv.h, 0, 256, &hit), 1);
	CHECK_RC(sel_store_lookup(b, &cv.h, 128, 256, &tail), 1);
	redisReply *x = rfx_cmd(&srv, "FLUSHALL");
	CHECK(x != NULL);
	freeReplyObject(x);
	sel_store *c = open_level(&f, 0);
	sfx_ckpt_row(&f, &cv, 256, 0, 1, 83, false);
	const sel_plane *pl = &f.g->rank[0].pages[0];
	((uint8_t *)(uintptr_t)pl->address)[(uint64_t)cp.pages[3] * pl->unit_bytes + 5] ^= 0x21;
	cp.checkpoint = 83;
	CHECK(sel_store_put(c, &cp, &why) == SEL_QUEUED);
	n_ev = 0;
	written(c, 1, ev, &n_ev, 16);
	sfx_poison(&f);
	in = inbound(100, 2, 5, 13);
	in.sums = sums;
	in.n_sums = 2;
	CHECK_RC(sel_store_fetch(b, &tail, &in), 0);
	fe = fetch_event(b, 13);
	CHECKF(fe.type == SEL_EV_FETCH_FAILED, "a rewritten record: fetch %d error %d", fe.type,
	       fe.error);
	printf("  remote overlap, second lookup: answered from the first hit (no Redis command), "
	       "tail restored with the head's digests; a rewritten record fails the claim (%s)\n",
	       sel_strerror(fe.error));
	CHECK_RC(sel_store_close(a, eos_now_ns() + 5 * SEC), 0);
	CHECK_RC(sel_store_close(b, eos_now_ns() + 5 * SEC), 0);
	CHECK_RC(sel_store_close(c, eos_now_ns() + 5 * SEC), 0);
	sel_store_destroy(a);
	sel_store_destroy(b);
	sel_store_destroy(c);
	sfx_conv_free(&cv);
	sfx_free(&f);
}

/* A head over two records (issue 18): A writes the record at 128 (pages 0
 * and 1) and the one at 256 linked under it (pages 2 and 3); B's lookup at
 * resident 0 finds the chain, the second at 192 is answered from it with
 * only page 3 to claim, and the tail's fetch gives the digests of pages
 * 0-2, from both records' manifests (the first lookup's). */
static void test_overlap_chain_head(void)
{
	struct sfx f;
	struct sfx_conv cv;
	sfx_init(&f, 1, 2, units, 20000, 256, 8);
	sfx_conv_init(&f, &cv, 25, 300, 10);
	sel_store *a = open_level(&f, 0), *b = open_level(&f, 0);
	sel_retry_reason why;
	sel_published p1 = sfx_ckpt_row(&f, &cv, 128, 0, 1, 84, false);
	CHECK(sel_store_put(a, &p1, &why) == SEL_QUEUED);
	sel_event ev[16];
	int n_ev = 0;
	written(a, 1, ev, &n_ev, 16);
	sel_published p2 = sfx_ckpt_row(&f, &cv, 256, 128, 2, 85, false);
	CHECK(p2.tail == 2);
	CHECK(sel_store_put(a, &p2, &why) == SEL_QUEUED);
	n_ev = 0;
	written(a, 2, ev, &n_ev, 16);
	uint64_t want[3];
	for (uint32_t j = 0; j < 3; j++)
		CHECK_RC(sel_page_digest_padded(f.g, p2.pages[j], &want[j]), 0);
	sel_hit hit, tail;
	CHECK_RC(lookup_hit(b, &cv.h, 0, 256, &hit), 1);
	CHECK(hit.pages == 4);
	CHECK_RC(sel_store_lookup(b, &cv.h, 192, 256, &tail), 1);
	CHECK(tail.pages == 1 && tail.resident == 192);
	uint64_t sums[3] = {0, 0, 0};
	sel_inbound in = inbound(100, 1, 5, 15);
	in.sums = sums;
	in.n_sums = 3;
	CHECK_RC(sel_store_fetch(b, &tail, &in), 0);
	sel_event fe = fetch_event(b, 15);
	CHECKF(fe.type == SEL_EV_FETCHED, "fetch: %d error %d", fe.type, fe.error);
	CHECK(sfx_page_ok(&f, 100, cv.tag, 3, false));
	CHECK(sfx_row_ok(&f, 5, sfx_row_seed(&cv, 256), false));
	for (uint32_t j = 0; j < 3; j++)
		CHECKF(sums[j] == want[j], "head page %u: %016" PRIx64 ", the planes' %016" PRIx64,
		       j, sums[j], want[j]);
	printf("  remote overlap, a head over two records: 3 digests from both manifests, "
	       "1 page claimed\n");
	CHECK_RC(sel_store_close(a, eos_now_ns() + 5 * SEC), 0);
	CHECK_RC(sel_store_close(b, eos_now_ns() + 5 * SEC), 0);
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&cv);
	sfx_free(&f);
}

int main(void)
{
	if (!rfx_available())
		SKIP("redis-server or redis-cli is not installed (scripts/install-deps)");
	dir = test_mkdtemp("store-remote");
	rfx_start(&srv, dir, "redis", false, false, NULL);
	rfx_url(&srv, 1, false, url, sizeof url);
	test_two_hosts();
	test_overlap_tail();
	test_overlap_second_lookup();
	test_overlap_chain_head();
	test_tp2_packed();
	test_clean_stop();
	test_stopped();
	test_killed_during_claim();
	rfx_stop(&srv);
	test_rmtree(dir);
	free(dir);
	printf("ok\n");
	return 0;
}
