/*
 * test_store_pooled_fallback.c - what follows a failed pool restore
 * (design 2.15 "One source"; store_pooled_fetch.c "Fallback"), against a
 * real `flare pool`: A (pool only) puts a 320-token record into the arena;
 * B (a memory tier and the pool) holds a shorter prefix of the same
 * conversation locally, or nothing, and picks the pool's deeper copy.
 *
 *   - The arena's bytes are damaged: B's restore fails (corrupt).  The
 *     readmitted request's lookup (the same history, resident count and
 *     limit) is answered at once by B's memory tier alone, the 128-token
 *     prefix, with no new pool lookup; that restore is byte-exact and is
 *     counted in local_fallbacks.  One source each: the failed restore
 *     wrote only pool bytes, the next one only local bytes.
 *   - The same without a local copy: the readmission's lookup misses (the
 *     request recomputes), again without a new pool lookup, not counted.
 *   - A later lookup of the same history (the failed ticket used up) asks
 *     the pool again.
 *   - The manager stopped (SIGSTOP) before it grants B's claim: the claim
 *     fails at the requester's deadline (12 s plus the bytes at 8 MiB/s);
 *     the readmission gets the memory tier's prefix, byte-exact, counted;
 *     the manager's grant, once it runs again, is released unused.
 *   - (not a fallback, the same store) the two helper threads run on
 *     disjoint CPU sets, so a restore's windows never share a core.
 *   - kill -9 of the manager while B's copy of the claim is in flight:
 *     the restore fails (gone) once the copy drained; the readmission's
 *     lookup, detached, gets the memory tier's prefix, byte-exact,
 *     counted as a fallback.
 */
#include <sched.h>

#include "pool_testlib.h"
#include "store_pooled.h"
#include "storefx.h"

static char dir[200];

/* Put checkpoint c of cv (A: until the pool accepted it; B: its memory
 * tier's STORED). */
static void put(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t c, uint64_t id,
		bool pool)
{
	sel_published p = sfx_ckpt(f, cv, c, 0, 1, id);
	uint64_t acc = sfx_pool_counters(s).puts_accepted, deadline = eos_now_ns() + 20 * S_NS;
	sel_retry_reason why;
	sel_outcome o;
	while ((o = sel_store_put(s, &p, &why)) == SEL_RETRY) { /* no room yet: as the worker */
		CHECKF(eos_now_ns() < deadline, "put refused for 20 s (reason %d)", (int)why);
		sel_event ev[8];
		for (int k = sfx_poll_wait(s, ev, 8); k > 0; k--)
			CHECK(ev[k - 1].type == SEL_EV_PROGRESS);
	}
	CHECKF(o == SEL_QUEUED, "put: outcome %d", (int)o);
	sel_event e = sfx_next_event(s);
	CHECKF(e.type == SEL_EV_STORED && e.checkpoint == id, "event %d", e.type);
	if (pool)
		SFX_UNTIL(s, NULL, sfx_pool_counters(s).puts_accepted > acc);
}

/* B's lookup until the pool's hit of c arrives. */
static sel_hit pool_hit(sel_store *b, struct sfx_conv *cv, uint64_t c, uint64_t limit)
{
	sel_hit hit;
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	int rc;
	while ((rc = sel_store_lookup(b, &cv->h, 0, limit, &hit)) != 1 ||
	       hit.tier != SEL_TIER_POOL) {
		CHECK(rc >= 0 && eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECK(hit.key.consumed == c);
	return hit;
}

/* Flip one byte of every arena slot (B's mapping: the manager's memory). */
static void damage(sel_store *b)
{
	struct sel_pooled *pb = (struct sel_pooled *)b;
	uint64_t len, sb = sel_pool_slot_bytes(pb->pc);
	uint8_t *base = sel_pool_arena(pb->pc, &len);
	for (uint64_t o = sel_pool_hello(pb->pc)->data_start; o + sb <= len; o += sb)
		base[o + 17] ^= 0x5a;
}

/* One case: A's record of conversation tag at 320 tokens in the arena, B's
 * local prefix of it at `local` tokens (0: none); B's restore of the pool's
 * copy fails; what B's readmission gets. */
static void one_case(sel_store *a, sel_store *b, struct sfx *fa, struct sfx *fb, uint64_t tag,
		     uint64_t local)
{
	const uint64_t c = 320;
	struct sfx_conv ca, cb;
	sfx_conv_init(fa, &ca, tag, c, 0);
	sfx_conv_init(fb, &cb, tag, c, 0);
	put(fa, a, &ca, c, 100 + tag, true);
	if (local)
		put(fb, b, &cb, local, 200 + tag, false);
	sel_hit hit = pool_hit(b, &cb, c, c);
	sel_pool_counters before = sfx_pool_counters(b);
	damage(b);
	sfx_poison(fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 300 + tag));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 300 + tag && e.tier == SEL_TIER_POOL,
	       "event %d tier %d", e.type, e.tier);
	damage(b); /* undone: what follows must not depend on it */
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_CORRUPT] ==
	      before.claims_failed[SEL_POOL_FAIL_CORRUPT] + 1);
	CHECK(sfx_pool_counters(b).local_fallbacks == before.local_fallbacks);

	/* The readmission: the same lookup, answered at once by the local
	 * tiers alone, no new pool lookup. */
	sel_hit h2;
	int rc = sel_store_lookup(b, &cb.h, 0, c, &h2);
	CHECK(sfx_pool_counters(b).lookups == before.lookups);
	if (local) {
		CHECKF(rc == 1 && h2.tier == SEL_TIER_MEMORY && h2.key.consumed == local,
		       "rc %d tier %d at %" PRIu64, rc, rc == 1 ? (int)h2.tier : -1,
		       rc == 1 ? h2.key.consumed : 0);
		CHECK(sfx_pool_counters(b).local_fallbacks == before.local_fallbacks + 1);
		sfx_poison(fb);
		CHECK_OK(sfx_fetch_at(b, &h2, 40, 3, 400 + tag));
		e = sfx_next_event(b);
		CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 400 + tag &&
			       e.tier == SEL_TIER_MEMORY,
		       "event %d tier %d", e.type, e.tier);
		CHECK(sfx_restored_ok(fb, &cb, local, 40, 3));
	} else {
		CHECKF(rc == 0, "rc %d: expected a miss (recompute)", rc);
		CHECK(sfx_pool_counters(b).local_fallbacks == before.local_fallbacks);
	}
	/* Used up: the next lookup of it asks the pool again. */
	rc = sel_store_lookup(b, &cb.h, 0, c, &h2);
	CHECK(rc >= 0 && sfx_pool_counters(b).lookups == before.lookups + 1);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
}

static bool blocked(struct sfx *f)
{
	pthread_mutex_lock(&f->stub.mu);
	bool b = f->stub.waiting > 0;
	pthread_mutex_unlock(&f->stub.mu);
	return b;
}

/* The manager stopped before it grants B's claim; B holds the 128-token
 * prefix locally. */
static void deadline_case(struct mgr_proc *m, sel_store *a, sel_store *b, struct sfx *fa,
			  struct sfx *fb)
{
	const uint64_t c = 320, local = 128, tag = 4;
	struct sfx_conv ca, cb;
	sfx_conv_init(fa, &ca, tag, c, 0);
	sfx_conv_init(fb, &cb, tag, c, 0);
	put(fa, a, &ca, c, 100 + tag, true);
	put(fb, b, &cb, local, 200 + tag, false);
	sel_hit hit = pool_hit(b, &cb, c, c);
	sel_pool_counters before = sfx_pool_counters(b);
	CHECK(!kill(m->pid, SIGSTOP));
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 300 + tag));
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 60 * S_NS; /* the claim's own: about 12 s */
	int n;
	while ((n = sfx_poll_wait(b, ev, 8)) == 0)
		CHECK(eos_now_ns() < deadline);
	CHECKF(n == 1 && ev[0].type == SEL_EV_FETCH_FAILED && ev[0].ticket == 300 + tag,
	       "%d events, the first %d", n, ev[0].type);
	CHECK(!kill(m->pid, SIGCONT));
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_TIMEOUT] ==
	      before.claims_failed[SEL_POOL_FAIL_TIMEOUT] + 1);
	sel_hit h2;
	int rc = sel_store_lookup(b, &cb.h, 0, c, &h2);
	CHECKF(rc == 1 && h2.tier == SEL_TIER_MEMORY && h2.key.consumed == local, "rc %d", rc);
	CHECK(sfx_pool_counters(b).local_fallbacks == before.local_fallbacks + 1);
	CHECK(sfx_pool_counters(b).lookups == before.lookups);
	sfx_poison(fb);
	CHECK_OK(sfx_fetch_at(b, &h2, 40, 3, 400 + tag));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 400 + tag && e.tier == SEL_TIER_MEMORY,
	       "event %d tier %d", e.type, e.tier);
	CHECK(sfx_restored_ok(fb, &cb, local, 40, 3));
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
}

/* The manager dies mid-claim; B holds the 128-token prefix locally. */
static void killed_case(struct mgr_proc *m, sel_store *a, sel_store *b, struct sfx *fa,
			struct sfx *fb)
{
	const uint64_t c = 320, local = 128, tag = 3;
	struct sfx_conv ca, cb;
	sfx_conv_init(fa, &ca, tag, c, 0);
	sfx_conv_init(fb, &cb, tag, c, 0);
	put(fa, a, &ca, c, 100 + tag, true);
	put(fb, b, &cb, local, 200 + tag, false);
	sel_hit hit = pool_hit(b, &cb, c, c);
	sel_pool_counters before = sfx_pool_counters(b);
	sfx_hold(fb, true);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 300 + tag));
	SFX_UNTIL(b, NULL, blocked(fb)); /* verified, then copying */
	mgr_kill9(m);
	SFX_UNTIL(b, NULL, sfx_pool_counters(b).state == SEL_POOL_DOWN);
	sfx_none_now(b); /* the copy still runs: nothing is reported yet */
	sfx_hold(fb, false);
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 300 + tag, "event %d", e.type);
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_GONE] ==
	      before.claims_failed[SEL_POOL_FAIL_GONE] + 1);
	sel_hit h2;
	int rc = sel_store_lookup(b, &cb.h, 0, c, &h2);
	CHECKF(rc == 1 && h2.tier == SEL_TIER_MEMORY && h2.key.consumed == local, "rc %d", rc);
	CHECK(sfx_pool_counters(b).local_fallbacks == before.local_fallbacks + 1);
	sfx_poison(fb);
	CHECK_OK(sfx_fetch_at(b, &h2, 40, 3, 400 + tag));
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 400 + tag && e.tier == SEL_TIER_MEMORY,
	       "event %d tier %d", e.type, e.tier);
	CHECK(sfx_restored_ok(fb, &cb, local, 40, 3));
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
}

/* Whether b's helpers have spread (store_pooled.c sp_helper_spread). */
static bool helpers_apart(sel_store *b)
{
	struct sel_pooled *p = (struct sel_pooled *)b;
	cpu_set_t m[SP_HELPERS], both;
	for (uint32_t i = 0; i < SP_HELPERS; i++)
		CHECK(!pthread_getaffinity_np(p->th[i], sizeof m[i], &m[i]));
	CPU_AND(&both, &m[0], &m[1]);
	return CPU_COUNT(&both) == 0 && CPU_COUNT(&m[0]) > 0 && CPU_COUNT(&m[1]) > 0;
}

int main(void)
{
	char *d = test_mkdtemp("pooled-fallback");
	snprintf(dir, sizeof dir, "%s", d);
	signal(SIGPIPE, SIG_IGN);
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, 64, 8);
	sfx_init(&fb, 1, 2, unit, 6000, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgrf", "--memory", "16MiB", NULL);
	sel_store *a = sfx_open_pooled(&fa, m.sock, "FA", 0),
		  *b = sfx_open_pooled(&fb, m.sock, "FB", 4 << 20);
	cpu_set_t cpus;
	CHECK(!sched_getaffinity(0, sizeof cpus, &cpus));
	if (CPU_COUNT(&cpus) >= SP_HELPERS)
		TEST_UNTIL(helpers_apart(b), 10);
	else
		printf("one CPU: the helpers' spread is not checked\n");
	one_case(a, b, &fa, &fb, 1, 128); /* a shorter local prefix */
	one_case(a, b, &fa, &fb, 2, 0);   /* none: recompute */
	deadline_case(&m, a, b, &fa, &fb);
	killed_case(&m, a, b, &fa, &fb);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
	test_rmtree(d);
	free(d);
	printf("ok\n");
	return 0;
}
