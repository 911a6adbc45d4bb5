/*
 * test_store_pooled.c - the pooled store (store_pooled.h) against a real
 * `flare pool`: two pool-only stores, A and B, of one scope.
 *
 *   - A's put lands in the arena; B's lookup answers PENDING within the
 *     grace period, then the pool's hit; B restores it byte-exact.
 *   - A record whose arena bytes were changed fails B's checksums: the
 *     restore fails (corrupt), and the manager never offers it again.
 *   - kill -9 of the manager while B's copy of a claim is in flight: the
 *     restore fails once the copy drained (gone); both stores reattach to
 *     the restarted manager (kept arena file) by themselves, and sharing
 *     works again.
 *   - exports: a neighbour's GPU copy (engine hooks) announced, exported
 *     on a claim, pinned for the copy only; refused for headroom, after
 *     which the arena's copy serves; the eviction notice withdraws it.
 *   - a neighbour that won the tie with B's memory tier refuses: B's
 *     restore falls back to its local copy of the same endpoint.
 *   - a pooled store over a memory store: the local tier answers first.
 *   - a lookup above a shorter restore (the late-answer retry) is answered
 *     by the first ticket and restores only the pages above it.
 *   - the budget check before registration: an arena over the host supply
 *     (or an unobservable supply) leaves the local tier alone, one warning.
 *   - a replica of the same model identity whose layout differs (page
 *     plane bytes, plane count, row bytes) never hits: its lookups are
 *     answered in its own scope, without the record; one of the same
 *     layout does (the control).
 */
#include <fcntl.h>
#include <sys/vfs.h>

#include "pool_budget.h"
#include "pool_testlib.h"
#include "store_common.h"
#include "store_composite.h"
#include "store_disk.h"
#include "store_pooled.h"
#include "storefx.h"

static char dir[200];

/* Put checkpoint c of cv from A and wait until the pool accepted it.  A
 * restarted manager refuses puts (RECOVERING) until its previous clients
 * are back: the put is offered again then, as the worker would. */
static void put_shared(struct sfx *f, sel_store *a, struct sfx_conv *cv, uint64_t c, uint64_t id)
{
	sel_published p = sfx_ckpt(f, cv, c, 0, 1, id);
	uint64_t acc = sfx_pool_counters(a).puts_accepted, deadline = eos_now_ns() + 20 * S_NS;
	sel_retry_reason why;
	for (;;) {
		uint64_t refused = sfx_pool_counters(a).puts_refused;
		sel_outcome put = sel_store_put(a, &p, &why);
		if (put == SEL_RETRY) { /* no room yet (a loaded machine): as the worker, retry */
			CHECKF(eos_now_ns() < deadline, "put refused for 20 s (reason %d)",
			       (int)why);
			sel_event ev[8];
			for (int k = sfx_poll_wait(a, ev, 8); k > 0; k--)
				CHECK(ev[k - 1].type == SEL_EV_PROGRESS);
			continue;
		}
		CHECKF(put == SEL_QUEUED,
		       "put: outcome %d (pool state %d, sessions %" PRIu64 ", detaches %" PRIu64
		       "): %s",
		       (int)put, sfx_pool_counters(a).state, sfx_pool_counters(a).sessions,
		       sfx_pool_counters(a).detaches, sel_errmsg());
		sel_event e = sfx_next_event(a);
		CHECK(e.checkpoint == id);
		if (e.type == SEL_EV_STORED)
			break;
		CHECKF(sfx_pool_counters(a).puts_refused > refused && eos_now_ns() < deadline,
		       "event %d error %d (puts %" PRIu64 ", failed %" PRIu64 ")", e.type, e.error,
		       sfx_pool_counters(a).puts, sfx_pool_counters(a).puts_failed);
		sel_event ev[8];
		CHECK(sfx_poll_wait(a, ev, 8) == 0);
	}
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).puts_accepted > acc);
}

/* Put checkpoint c of cv into s's local tier (no pool copy: the cascade
 * moves it later) and wait for STORED. */
static void put_local(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t c, uint64_t id)
{
	sel_published p = sfx_ckpt(f, cv, c, 0, 1, id);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &p, &why) == SEL_QUEUED);
	sel_event e = sfx_next_event(s);
	CHECKF(e.type == SEL_EV_STORED && e.checkpoint == id, "event %d", e.type);
}

/* B's lookup until the pool's hit arrives (a miss while the answer is
 * late is retried: the late-answer path). */
static sel_hit pool_hit(sel_store *b, struct sfx_conv *cv, uint64_t c, bool *pending)
{
	sel_hit hit;
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	for (;;) {
		int rc = sel_store_lookup(b, &cv->h, 0, c, &hit);
		CHECK(rc >= 0);
		if (rc == SEL_LOOKUP_PENDING)
			*pending = true;
		if (rc == 1)
			break;
		CHECK(eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECK(hit.tier == SEL_TIER_POOL && hit.key.consumed == c);
	return hit;
}

static bool blocked(struct sfx *f)
{
	pthread_mutex_lock(&f->stub.mu);
	bool b = f->stub.waiting > 0;
	pthread_mutex_unlock(&f->stub.mu);
	return b;
}

static void test_share_corrupt_kill(void)
{
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, 64, 8);
	sfx_init(&fb, 1, 2, unit, 6000, 64, 8);
	char arena[300];
	snprintf(arena, sizeof arena, "%s/arena", dir);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr", "--memory", "16MiB", "--arena", arena, "--recovery-timeout",
		  "10s", NULL);
	sel_store *a = sfx_open_pooled(&fa, m.sock, "A", 0),
		  *b = sfx_open_pooled(&fb, m.sock, "B", 0);

	/* Shared, byte-exact, through the grace period. */
	struct sfx_conv c1a, c1b;
	sfx_conv_init(&fa, &c1a, 1, 256, 0);
	sfx_conv_init(&fb, &c1b, 1, 256, 0);
	put_shared(&fa, a, &c1a, 256, 11);
	bool pending = false;
	sel_hit hit = pool_hit(b, &c1b, 256, &pending);
	CHECK(pending); /* the first lookup held admission for the answer */
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 101));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 101 && e.tier == SEL_TIER_POOL,
	       "event %d %d", e.type, e.error);
	CHECK(sfx_restored_ok(&fb, &c1b, 256, 20, 2));
	CHECK(sfx_pool_counters(b).restores == 1 && sfx_pool_counters(b).reused_tokens == 256);

	/* Bytes changed in the arena: B's checksums catch it. */
	struct sfx_conv c2a, c2b;
	sfx_conv_init(&fa, &c2a, 2, 192, 0);
	sfx_conv_init(&fb, &c2b, 2, 192, 0);
	put_shared(&fa, a, &c2a, 192, 12);
	hit = pool_hit(b, &c2b, 192, &pending);
	struct sel_pooled *pb = (struct sel_pooled *)b;
	uint64_t len, sb = sel_pool_slot_bytes(pb->pc);
	uint8_t *base = sel_pool_arena(pb->pc, &len);
	uint64_t from = sel_pool_hello(pb->pc)->data_start;
	for (uint64_t o = from; o + sb <= len; o += sb)
		base[o + 17] ^= 0x5a; /* every slot: the record's pages and row too */
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 102));
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 102, "event %d", e.type);
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_CORRUPT] == 1);
	for (uint64_t o = from; o + sb <= len; o += sb)
		base[o + 17] ^= 0x5a;
	/* The readmission's lookup: the failed ticket, the local tiers alone
	 * (none here); then never served again: the next lookup asks afresh
	 * and finds nothing. */
	sel_hit h2;
	uint64_t asked = sfx_pool_counters(b).lookups;
	int rc = sel_store_lookup(b, &c2b.h, 0, 192, &h2);
	CHECK(rc == 0 && sfx_pool_counters(b).lookups == asked);
	uint64_t deadline = eos_now_ns() + 5 * S_NS;
	sel_event ev[8];
	while ((rc = sel_store_lookup(b, &c2b.h, 0, 192, &h2)) == SEL_LOOKUP_PENDING ||
	       sfx_pool_counters(b).answers < sfx_pool_counters(b).lookups) {
		CHECK(eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECKF(rc == 0, "a corrupt record was offered again (rc %d)", rc);

	/* kill -9 of the manager during a claim's copy. */
	struct sfx_conv c3a, c3b;
	sfx_conv_init(&fa, &c3a, 3, 320, 0);
	sfx_conv_init(&fb, &c3b, 3, 320, 0);
	put_shared(&fa, a, &c3a, 320, 13);
	hit = pool_hit(b, &c3b, 320, &pending);
	sfx_hold(&fb, true);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 103));
	SFX_UNTIL(b, NULL, blocked(&fb)); /* verified, then copying */
	mgr_kill9(&m);
	SFX_UNTIL(b, NULL, sfx_pool_counters(b).state == SEL_POOL_DOWN);
	sfx_none_now(b); /* the copy still runs: nothing is reported yet */
	sfx_hold(&fb, false);
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 103, "event %d", e.type);
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_GONE] == 1);
	sel_store_lookup(b, &c3b.h, 0, 320, &h2); /* detached: local tiers only */

	mgr_start(&m, dir, "mgr", "--memory", "16MiB", "--arena", arena, "--recovery-timeout",
		  "10s", NULL);
	/* A was idle since the kill: its state may still be its first
	 * session's UP until a poll hears the loss, so wait for its second
	 * session, not for UP. */
	SFX_UNTIL(a, NULL,
		  sfx_pool_counters(a).sessions == 2 && sfx_pool_counters(a).state == SEL_POOL_UP);
	SFX_UNTIL(b, NULL,
		  sfx_pool_counters(b).sessions == 2 && sfx_pool_counters(b).state == SEL_POOL_UP);
	CHECK(sfx_pool_counters(a).detaches == 1);
	CHECK(sfx_pool_counters(b).detaches == 1);
	struct sfx_conv c4a, c4b;
	sfx_conv_init(&fa, &c4a, 4, 128, 0);
	sfx_conv_init(&fb, &c4b, 4, 128, 0);
	put_shared(&fa, a, &c4a, 128, 14);
	hit = pool_hit(b, &c4b, 128, &pending);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 30, 3, 104));
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 104, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &c4b, 128, 30, 3));

	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	struct sfx_conv *cvs[] = {&c1a, &c1b, &c2a, &c2b, &c3a, &c3b, &c4a, &c4b};
	for (size_t i = 0; i < 8; i++)
		sfx_conv_free(cvs[i]);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
	unlink(arena);
}

/* The engine's side of exports, over a fixture: one checkpoint. */
struct hooks_ctx {
	sel_published cp;
	int pins, pinned_ever;
	int refuse; /* 0, or what pin returns */
};

static int h_pin(void *ctx, const sel_key *key, uint64_t id, sel_published *out)
{
	struct hooks_ctx *h = ctx;
	if (h->refuse)
		return h->refuse;
	if (id != h->cp.checkpoint)
		return -ENOENT;
	if (!sel_key_eq(key, &h->cp.key))
		return -ESTALE;
	*out = h->cp;
	h->pins++;
	h->pinned_ever++;
	return 0;
}

static void h_unpin(void *ctx, uint64_t id)
{
	struct hooks_ctx *h = ctx;
	CHECK(id == h->cp.checkpoint && h->pins > 0);
	h->pins--;
}

static int h_describe(void *ctx, uint64_t id, sel_published *out)
{
	struct hooks_ctx *h = ctx;
	if (id != h->cp.checkpoint)
		return -ENOENT;
	*out = h->cp;
	return 0;
}

/* Pump a (the exporter) and b until b has one event. */
static sel_event next_event2(sel_store *b, sel_store *a)
{
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	for (;;) {
		CHECK(sel_store_poll(a, ev, 8) == 0);
		int n = sfx_poll_wait(b, ev, 8);
		if (n) {
			CHECKF(n == 1, "%d events", n);
			return ev[0];
		}
		CHECK(eos_now_ns() < deadline);
	}
}

/* A neighbour's GPU copy: announced at its offer, exported on B's claim
 * (the neighbour wins the tie with the arena's copy), pinned through the
 * hooks for the copy only; refused for headroom, after which B takes the
 * arena's copy of the same endpoint. */
static void test_exports(void)
{
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, 64, 8);
	sfx_init(&fb, 1, 2, unit, 6000, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr3", "--memory", "16MiB", NULL);
	struct hooks_ctx hc = {0};
	sel_export_hooks hooks = {
		.ctx = &hc, .pin = h_pin, .unpin = h_unpin, .describe = h_describe};
	sel_store_config c = sfx_config(&fa, true);
	c.pool = m.sock;
	c.pool_instance_id = "EA";
	c.pool_exports = &hooks;
	sel_store *a = NULL, *b = sfx_open_pooled(&fb, m.sock, "EB", 0);
	CHECK_OK(sel_store_open(&c, &a));
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 7, 256, 0);
	sfx_conv_init(&fb, &cb, 7, 256, 0);
	hc.cp = sfx_ckpt(&fa, &ca, 256, 0, 1, 41);
	put_shared(&fa, a, &ca, 256, 41);
	CHECK(sfx_pool_counters(a).announced == 1);
	bool pending = false;
	sel_hit hit = pool_hit(b, &cb, 256, &pending);
	CHECK(hit.neighbour);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 201));
	sel_event e = next_event2(b, a);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 201, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb, 256, 20, 2));
	CHECK(sfx_pool_counters(a).exports_served == 1 && hc.pins == 0 && hc.pinned_ever == 1);
	CHECK(sfx_pool_counters(b).neighbour_restores == 1);

	/* No headroom: B's restore fails, the next one uses the arena. */
	hc.refuse = -ENOSPC;
	struct sfx_conv cb2;
	sfx_conv_init(&fb, &cb2, 7, 256, 0);
	hit = pool_hit(b, &cb2, 256, &pending);
	CHECK(hit.neighbour);
	CHECK_OK(sfx_fetch_at(b, &hit, 30, 3, 202));
	e = next_event2(b, a);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 202, "event %d", e.type);
	CHECK(sfx_pool_counters(a).exports_refused[SEL_EXPORT_NO_HEADROOM] == 1 && hc.pins == 0);
	hit = pool_hit(b, &cb2, 256, &pending);
	CHECK(!hit.neighbour);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 30, 3, 203));
	e = next_event2(b, a);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 203, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb2, 256, 30, 3));

	/* Lost notices: what the GPU still holds is announced again. */
	uint64_t ann = sfx_pool_counters(a).announced;
	sel_store_evictions_lost(a);
	CHECK(sfx_pool_counters(a).evictions_lost == 1 &&
	      sfx_pool_counters(a).announced == ann + 1);
	/* The eviction notice withdraws the holding. */
	sel_store_evicted(a, &hc.cp.key, 1, NULL);
	CHECK(sfx_pool_counters(a).withdrawn == 1);

	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	sfx_conv_free(&cb2);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* A neighbour wins the tie with B's own memory tier, then refuses the
 * export: B's restore falls back to its local copy of the same endpoint. */
static void test_fallback(void)
{
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, 64, 8);
	sfx_init(&fb, 1, 2, unit, 6000, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr4", "--memory", "16MiB", NULL);
	struct hooks_ctx hc = {.refuse = -ENOSPC};
	sel_export_hooks hooks = {.ctx = &hc, .pin = h_pin, .unpin = h_unpin};
	sel_store_config c = sfx_config(&fa, true);
	c.pool = m.sock;
	c.pool_instance_id = "FA";
	c.pool_exports = &hooks;
	sel_store *a = NULL, *b = sfx_open_pooled(&fb, m.sock, "FB", 4 << 20);
	CHECK_OK(sel_store_open(&c, &a));
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 8, 320, 0);
	sfx_conv_init(&fb, &cb, 8, 320, 0);
	put_shared(&fa, a, &ca, 256, 51);
	put_local(&fb, b, &cb, 256, 52); /* B's memory tier holds it too */
	sel_hit hit;
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	int rc;
	while ((rc = sel_store_lookup(b, &cb.h, 0, 320, &hit)) != 1 || hit.tier != SEL_TIER_POOL) {
		CHECK(rc >= 0 && eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECK(hit.neighbour && hit.key.consumed == 256);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 301));
	sel_event e = next_event2(b, a);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 301 && e.tier == SEL_TIER_MEMORY,
	       "event %d tier %d", e.type, e.tier);
	CHECK(sfx_restored_ok(&fb, &cb, 256, 20, 2));
	CHECK(sfx_pool_counters(b).local_fallbacks == 1 &&
	      sfx_pool_counters(a).exports_refused[SEL_EXPORT_NO_HEADROOM] == 1);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* Over a memory store: the local hit answers without asking the pool. */
static void test_local_first(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx f;
	sfx_init(&f, 1, 1, unit, 4096, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr2", "--memory", "8MiB", NULL);
	sel_store *s = sfx_open_pooled(&f, m.sock, "L", 4 << 20);
	sel_store_info si;
	sel_store_describe(s, &si);
	CHECKF(!strcmp(si.kind, "memory+pool") && si.pool && strstr(si.pool, "pool 'default'"),
	       "kind %s pool %s", si.kind, si.pool ? si.pool : "(null)");
	struct sfx_conv cv;
	sfx_conv_init(&f, &cv, 9, 128, 0);
	sel_published p = sfx_ckpt(&f, &cv, 128, 0, 1, 21);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &p, &why) == SEL_QUEUED);
	sel_event e = sfx_next_event(s);
	CHECK(e.type == SEL_EV_STORED && e.checkpoint == 21);
	CHECK(sfx_pool_counters(s).puts ==
	      0); /* no write-through: the cascade moves it when evicted */
	sel_hit hit;
	uint64_t asked = sfx_pool_counters(s).lookups; /* the one at attach */
	CHECK(sel_store_lookup(s, &cv.h, 0, 128, &hit) == 1 && hit.tier == SEL_TIER_MEMORY);
	CHECK(sfx_pool_counters(s).lookups == asked);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	sfx_conv_free(&cv);
	mgr_stop(&m);
	sfx_free(&f);
}

/* No manager: one warning, the local tier alone. */
static void test_absent(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx f;
	sfx_init(&f, 1, 1, unit, 4096, 64, 8);
	char sock[300];
	snprintf(sock, sizeof sock, "unix:%s/nobody.sock", dir);
	sel_store_config c = sfx_config(&f, true);
	c.memory_bytes = 4 << 20;
	c.pool = sock;
	c.pool_wait_ns = 200 * MS_NS;
	sel_store *s = NULL;
	CHECK_OK(sel_store_open(&c, &s));
	CHECKF(strstr(sel_store_warning(s), "will not attach later") &&
		       strstr(sel_store_warning(s), "nobody.sock"),
	       "warning '%s'", sel_store_warning(s));
	CHECK(sfx_pool_counters(s).state == SEL_POOL_GONE_FOR_GOOD);
	struct sfx_conv cv;
	sfx_conv_init(&f, &cv, 5, 64, 0);
	sel_published p = sfx_ckpt(&f, &cv, 64, 0, 1, 31);
	sel_retry_reason why;
	CHECK(sel_store_put(s, &p, &why) == SEL_QUEUED);
	CHECK(sfx_next_event(s).type == SEL_EV_STORED);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	sfx_conv_free(&cv);
	sfx_free(&f);
}

/* The late-answer retry's store side (design 2.15 "Lookups"): a request
 * admitted on a shorter restore asks again with the restored prefix as
 * its resident count.  The ticket made at resident 0 answers it (no new
 * pool lookup, so no new grace period), and the pool's hit covers only
 * the pages above the new resident count: claimed from there and restored
 * byte-exact. */
static void test_late_above(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 1, unit, 4096, 64, 8);
	sfx_init(&fb, 1, 1, unit, 4096, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgrl", "--memory", "8MiB", NULL);
	sel_store *a = sfx_open_pooled(&fa, m.sock, "LA", 0),
		  *b = sfx_open_pooled(&fb, m.sock, "LB", 0);
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 7, 320, 0);
	sfx_conv_init(&fb, &cb, 7, 320, 0);
	put_shared(&fa, a, &ca, 320, 51);
	sel_hit hit;
	uint64_t asked = sfx_pool_counters(b).lookups;
	CHECK(sel_store_lookup(b, &cb.h, 0, 320, &hit) == SEL_LOOKUP_PENDING);
	CHECK(sfx_pool_counters(b).lookups == asked + 1);
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	int rc;
	while ((rc = sel_store_lookup(b, &cb.h, 128, 320, &hit)) != 1) {
		CHECK(rc == SEL_LOOKUP_PENDING || rc == 0);
		CHECK(eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECK(sfx_pool_counters(b).lookups == asked + 1); /* the first ticket answered it */
	CHECKF(hit.tier == SEL_TIER_POOL && hit.key.consumed == 320 && hit.resident == 128 &&
		       hit.pages == 3,
	       "tier %d consumed %" PRIu64 " resident %" PRIu64 " pages %u", hit.tier,
	       hit.key.consumed, hit.resident, hit.pages);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 30, 3, 501));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 501, "event %d %d", e.type, e.error);
	for (uint32_t j = 2; j < 5; j++)
		CHECK(sfx_page_ok(&fb, 30 + j - 2, cb.tag, j, false));
	CHECK(sfx_row_ok(&fb, 3, sfx_row_seed(&cb, 320), false));
	CHECK(sfx_pool_counters(b).reused_tokens == 320 - 128);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* The budget check before registration (design 2.15, pool_budget.h): a
 * manager whose arena's part not yet resident is over the host supply
 * (SELENE_TEST_MEMAVAILABLE: 1 GiB available, less the 2 GiB allowance)
 * or a supply that cannot be observed: nothing registered, one warning
 * naming the sizes and the reason, the local tier alone.  That arena is a
 * file in dir: on a tmpfs the manager committed it (fallocate) and the
 * test punches out its second half, elsewhere none of it is shared
 * memory, so 4 or 8 MiB are charged.  Then the same manager with the real
 * supply: attached (the control). */
static void budget_refused(struct sfx *f)
{
	char arena[300];
	snprintf(arena, sizeof arena, "%s/arena-budget", dir);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgrb", "--memory", "8MiB", "--arena", arena, NULL);
	struct statfs fs;
	CHECK(statfs(dir, &fs) == 0);
	const char *charged = "8 MiB of it not yet resident";
	if (fs.f_type == 0x01021994) { /* TMPFS_MAGIC */
		int fd = open(arena, O_RDWR | O_CLOEXEC);
		CHECK(fd >= 0);
		CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4 << 20, 4 << 20) ==
		      0);
		close(fd);
		charged = "4 MiB of it not yet resident";
	}
	const char *knob[2] = {"1GiB", "unobservable"},
		   *why[2] = {"exceeds the host supply", "cannot be observed"};
	for (int i = 0; i < 2; i++) {
		setenv("SELENE_TEST_MEMAVAILABLE", knob[i], 1);
		sel_store_config c = sfx_config(f, true);
		c.memory_bytes = 4 << 20;
		c.pool = m.sock;
		c.pool_instance_id = "budget";
		c.pool_wait_ns = 10 * S_NS;
		sel_store *s = NULL;
		CHECK_OK(sel_store_open(&c, &s));
		const char *w = sel_store_warning(s);
		CHECKF(strstr(w, "pool budget") && strstr(w, why[i]) && strstr(w, "arena 8 MiB") &&
			       strstr(w, "will not attach later") && strstr(w, m.sock),
		       "warning '%s'", w);
		CHECKF(i == 1 || (strstr(w, "host supply of 0 B") && strstr(w, charged)),
		       "warning '%s', expected '%s'", w, charged);
		CHECK(sfx_pool_counters(s).state == SEL_POOL_GONE_FOR_GOOD &&
		      sfx_pool_counters(s).lookups == 0);
		struct sfx_conv cv;
		sfx_conv_init(f, &cv, 5, 64, 0);
		sel_published p = sfx_ckpt(f, &cv, 64, 0, 1, 41);
		sel_retry_reason r;
		CHECK(sel_store_put(s, &p, &r) == SEL_QUEUED);
		CHECK(sfx_next_event(s).type == SEL_EV_STORED);
		sel_hit hit;
		CHECK(sel_store_lookup(s, &cv.h, 0, 64, &hit) == 1 && hit.tier == SEL_TIER_MEMORY);
		CHECK_OK(sel_store_close(s, 0));
		sel_store_destroy(s);
		sfx_conv_free(&cv);
	}
	unsetenv("SELENE_TEST_MEMAVAILABLE");
	sel_store *s = sfx_open_pooled(f, m.sock, "budget", 4 << 20); /* fits: attached */
	CHECK(!strstr(sel_store_warning(s), "pool budget"));
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	mgr_stop(&m);
	CHECK(unlink(arena) == 0);
}

/* A committed arena (a memfd: the manager fallocates it) larger than the
 * supply left once it was allocated -- more than half the memory that was
 * free before -- costs this instance nothing: it attaches.  The knob is
 * MemAvailable after the manager's allocation, as the kernel reports it:
 * the supply is 4 MiB, the arena 8 MiB, all resident.  Charged whole
 * (design 2.15's words), it was refused. */
static void budget_resident(struct sfx *f)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "mgrr", "--memory", "8MiB", NULL);
	uint64_t total, avail;
	CHECK_OK(eos_mem_info(&total, &avail));
	sel_store_config c = sfx_config(f, true);
	c.memory_bytes = 4 << 20;
	uint64_t local = (c.populate ? 0 : c.memory_bytes) + c.host_reserved,
		 sys = total / 100 * SEL_POOL_SYSTEM_PERCENT +
		       total % 100 * SEL_POOL_SYSTEM_PERCENT / 100;
	char knob[32];
	snprintf(knob, sizeof knob, "%llu",
		 (unsigned long long)(SEL_POOL_SERVER_ALLOWANCE + sys + local + (4 << 20)));
	setenv("SELENE_TEST_MEMAVAILABLE", knob, 1);
	c.pool = m.sock;
	c.pool_instance_id = "resident";
	c.pool_wait_ns = 10 * S_NS;
	sel_store *s = NULL;
	CHECK_OK(sel_store_open(&c, &s));
	unsetenv("SELENE_TEST_MEMAVAILABLE");
	CHECKF(sfx_pool_counters(s).state == SEL_POOL_UP && !strstr(sel_store_warning(s), "budget"),
	       "state %d, warning '%s'", sfx_pool_counters(s).state, sel_store_warning(s));
	CHECK(sel_pool_arena_resident(((struct sel_pooled *)s)->pc) == 8 << 20);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	mgr_stop(&m);
}

static void test_budget(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx f;
	sfx_init(&f, 1, 1, unit, 4096, 64, 8);
	budget_refused(&f);
	budget_resident(&f);
	sfx_free(&f);
}

/* B's lookups of checkpoint c until the manager answered one: none may hit
 * (a replica of another layout).  The store's pool hits stay 0. */
static void never_hits(sel_store *b, struct sfx_conv *cv, uint64_t c)
{
	uint64_t answers = sfx_pool_counters(b).answers, deadline = eos_now_ns() + 20 * S_NS;
	sel_event ev[8];
	for (;;) {
		sel_hit hit;
		int rc = sel_store_lookup(b, &cv->h, 0, c, &hit);
		CHECKF(rc == 0 || rc == SEL_LOOKUP_PENDING, "lookup %d (tier %d)", rc, hit.tier);
		if (rc == 0 && sfx_pool_counters(b).answers > answers)
			break;
		CHECK(eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECK(sfx_pool_counters(b).hits == 0 && sfx_pool_counters(b).claims == 0);
}

/* Same model identity (storefx's), same tokens, another layout: never a
 * hit.  The scope (sel_pool_scope_id) covers the layout fingerprint, the
 * page tokens, the slot and row geometry and the record's rank table. */
static void test_other_layout(void)
{
	const uint64_t unit[2] = {4096, 4096}, big[1] = {8192};
	struct sfx fa;
	sfx_init(&fa, 1, 1, unit, 4096, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr3", "--memory", "8MiB", NULL);
	sel_store *a = sfx_open_pooled(&fa, m.sock, "LA", 0);
	struct sfx_conv cva;
	sfx_conv_init(&fa, &cva, 9, 128, 0);
	put_shared(&fa, a, &cva, 128, 41);
	struct {
		uint32_t planes;
		const uint64_t *unit;
		uint64_t row;
	} other[] = {
		{1, big, 4096},  /* page plane bytes (page geometry) */
		{2, unit, 4096}, /* another plane layout */
		{1, unit, 8192}, /* row bytes */
	};
	for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
		struct sfx fb;
		sfx_init(&fb, 1, other[i].planes, other[i].unit, other[i].row, 64, 8);
		CHECK(!memcmp(fa.model, fb.model, sizeof fa.model));
		char id[8];
		snprintf(id, sizeof id, "LB%zu", i);
		sel_store *b = sfx_open_pooled(&fb, m.sock, id, 0);
		struct sfx_conv cvb;
		sfx_conv_init(&fb, &cvb, 9, 128, 0);
		never_hits(b, &cvb, 128);
		CHECK_OK(sel_store_close(b, 0));
		sel_store_destroy(b);
		sfx_conv_free(&cvb);
		sfx_free(&fb);
	}
	/* The control: the same layout hits and restores byte-exact. */
	struct sfx fc;
	sfx_init(&fc, 1, 1, unit, 4096, 64, 8);
	sel_store *c = sfx_open_pooled(&fc, m.sock, "LC", 0);
	struct sfx_conv cvc;
	sfx_conv_init(&fc, &cvc, 9, 128, 0);
	bool pending = false;
	sel_hit hit = pool_hit(c, &cvc, 128, &pending);
	CHECK_OK(sfx_fetch_at(c, &hit, 20, 2, 301));
	sel_event e = sfx_next_event(c);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 301, "event %d", e.type);
	CHECK(sfx_restored_ok(&fc, &cvc, 128, 20, 2));
	CHECK_OK(sel_store_close(c, 0));
	sel_store_destroy(c);
	sfx_conv_free(&cvc);
	sfx_free(&fc);
	CHECK_OK(sel_store_close(a, 0));
	sel_store_destroy(a);
	sfx_conv_free(&cva);
	mgr_stop(&m);
	sfx_free(&fa);
}

static bool local_has(sel_store *s, struct sfx_conv *cv, uint64_t c)
{
	sel_store *in = ((struct sel_pooled *)s)->w.inner;
	sel_hit hit;
	int rc = sel_store_lookup(in, &cv->h, 0, c, &hit);
	CHECK(rc >= 0);
	return rc == 1 && hit.key.consumed == c;
}

/* The end-of-chain cascade: A (memory + pool) keeps its records local
 * until its memory runs under its floor; then its oldest record goes to
 * the pool, held locally until the manager accepted it (a stopped manager
 * answers nothing: the record stays), and leaves A; B (pool only)
 * restores it byte-exact from the arena.  A manager killed while a
 * cascade put waits fails the put: the record stays local, and A restores
 * it from its memory tier. */
/* The holdings s has queued for the manager and not withdrawn (GPU and
 * host tiers). */
static long long holds(sel_store *s)
{
	sel_pool_counters p = sfx_pool_counters(s);
	long long n = (long long)p.announced - (long long)p.withdrawn;
	for (int t = 0; t < 2; t++)
		n += (long long)p.host_announced[t] - (long long)p.host_withdrawn[t];
	return n;
}

/* Wait until the manager's catalogue has what a and b sent: a store counts
 * a withdrawal when it queues the frame, and B's lookup on its own socket
 * could reach the manager first and be answered with A's holding of a
 * record A already gave to the arena (an export A is not polled to refuse
 * here: B's claim would then time out). */
static void wait_manager_holds(const struct mgr_proc *m, sel_store *a, sel_store *b)
{
	wait_metric_eq(m, "flare_pool_holdings", holds(a) + holds(b), 10);
}

static void test_cascade(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 1, unit, 4096, 64, 8);
	sfx_init(&fb, 1, 1, unit, 4096, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr5", "--memory", "8MiB", NULL);
	/* 12 warm slots, records of 2 pages and their row: 3 slots each. */
	sel_store *a = sfx_open_pooled(&fa, m.sock, "CA", 12 * fa.slot_bytes);
	sel_store *b = sfx_open_pooled(&fb, m.sock, "CB", 0);
	struct sel_core *core = sel_store_core(((struct sel_pooled *)a)->w.inner);
	CHECK(core && core->warm == 12 && fa.row_slots == 1);
	struct sfx_conv ca[5], cb0;
	for (int i = 0; i < 5; i++)
		sfx_conv_init(&fa, &ca[i], 30 + i, 128, 10 * i);
	sfx_conv_init(&fb, &cb0, 30, 128, 0);
	for (int i = 0; i < 3; i++)
		put_local(&fa, a, &ca[i], 128, 60 + i);
	CHECK(sfx_pool_counters(a).puts == 0);
	/* The manager stopped: A's memory fills, the oldest is offered and
	 * held, found locally, while the put waits. */
	CHECK(kill(m.pid, SIGSTOP) == 0);
	put_local(&fa, a, &ca[3], 128, 63);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).puts == 1);
	sel_key k0 = sfx_key(&ca[0], 128), k1 = sfx_key(&ca[1], 128);
	CHECK(local_has(a, &ca[0], 128) && core->casc_n == 1 && sel_core_cascade_holds(core, &k0));
	CHECK(kill(m.pid, SIGCONT) == 0);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).cascaded == 1);
	CHECK(!local_has(a, &ca[0], 128) && sfx_pool_counters(a).puts_accepted == 1);
	sel_stats st;
	sel_store_stats(a, &st);
	CHECK(st.tier[SEL_TIER_MEMORY].dropped_end_of_chain == 0);
	/* B restores it from the arena, byte-exact. */
	wait_manager_holds(&m, a, b);
	bool pending = false;
	sel_hit hit = pool_hit(b, &cb0, 128, &pending);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 501));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.tier == SEL_TIER_POOL, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb0, 128, 20, 2));

	/* A killed manager fails a waiting cascade put: nothing local lost. */
	CHECK(kill(m.pid, SIGSTOP) == 0);
	put_local(&fa, a, &ca[4], 128, 64);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).puts == 2 && core->casc_n == 1);
	CHECK(sel_core_cascade_holds(core, &k1));
	mgr_kill9(&m);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).cascade_kept == 1);
	CHECK(core->casc_n == 0 && local_has(a, &ca[1], 128));
	sfx_poison(&fa);
	sfx_restore(&fa, a, &ca[1], 0, 128, 128, 50, 3, SEL_TIER_MEMORY, true, NULL);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	for (int i = 0; i < 5; i++)
		sfx_conv_free(&ca[i]);
	sfx_conv_free(&cb0);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* The cascade from a disk tier: A (disk + pool, a limit of 4.5 records;
 * composite: warm memory in front of it) moves its oldest record into the
 * pool once its disk runs under its floor, reading the file back with
 * every check, and B restores it byte-exact; a record whose file was
 * damaged is not cascaded: the put fails, the record stays local. */
static void test_cascade_disk(bool composite)
{
	const uint64_t unit[1] = {4096};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 1, unit, 4096, 64, 8);
	sfx_init(&fb, 1, 1, unit, 4096, 64, 8);
	struct sfx_conv ca[5], cb0;
	for (int i = 0; i < 5; i++)
		sfx_conv_init(&fa, &ca[i], 40 + i, 128, 10 * i);
	sfx_conv_init(&fb, &cb0, 40, 128, 0);
	char *d0 = test_mkdtemp("pdisk-size"), *dd = test_mkdtemp("pdisk");
	sel_store_config c = sfx_config(&fa, true);
	c.disk_dir = d0;
	c.disk_limit = 1ull << 30;
	sel_store *s;
	CHECK_OK(sel_store_open(&c, &s));
	put_local(&fa, s, &ca[4], 128, 90);
	sel_stats st;
	sel_store_stats(s, &st);
	uint64_t rec = st.tier[SEL_TIER_DISK].bytes_used;
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	CHECK_OK(test_rmtree(d0));
	free(d0);

	struct mgr_proc m;
	mgr_start(&m, dir, "mgr7", "--memory", "8MiB", NULL);
	c.disk_dir = dd;
	c.disk_limit = 4 * rec + rec / 2;
	c.pool = m.sock;
	c.pool_instance_id = "DA";
	c.pool_wait_ns = 10 * S_NS;
	c.memory_bytes = composite ? 12 * fa.slot_bytes : 0;
	sel_store *a, *b = sfx_open_pooled(&fb, m.sock, "DB", 0);
	CHECK_OK(sel_store_open(&c, &a));
	sel_store *inner = ((struct sel_pooled *)a)->w.inner;
	CHECK(!strcmp(inner->ops->name, composite ? "composite" : "disk"));
	if (composite)
		inner = sel_composite_store_disk(inner);
	struct sel_core *core = sel_store_core(inner);
	CHECK(core && core->tier == SEL_TIER_DISK && ((struct sel_pooled *)a)->casc == core);
	for (int i = 0; i < 3; i++) {
		put_local(&fa, a, &ca[i], 128, 80 + i);
		/* The disk tier's age order is its commit order, and its writes run
		 * concurrently: let each commit before the next, so ca[0] is the
		 * oldest. */
		sel_key ki = sfx_key(&ca[i], 128);
		struct sel_disk_file dfi;
		SFX_UNTIL(a, NULL, sel_disk_store_file(inner, &ki, &dfi) == 0);
	}
	CHECK(sfx_pool_counters(a).puts == 0); /* nothing at publication */
	put_local(&fa, a, &ca[3], 128, 83);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).cascaded == 1);
	CHECK(!local_has(a, &ca[0], 128) && local_has(a, &ca[1], 128)); /* memory too */
	sel_store_stats(a, &st);
	CHECK(st.tier[SEL_TIER_DISK].dropped_end_of_chain == 0);
	wait_manager_holds(&m, a, b);
	bool pending = false;
	sel_hit hit = pool_hit(b, &cb0, 128, &pending);
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &hit, 20, 2, 701));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.tier == SEL_TIER_POOL, "event %d", e.type);
	CHECK(sfx_restored_ok(&fb, &cb0, 128, 20, 2));

	/* ca[1] is next: a byte of its first page record changed on disk. */
	sel_key k1 = sfx_key(&ca[1], 128);
	struct sel_disk_file df;
	SFX_UNTIL(a, NULL, sel_disk_store_file(inner, &k1, &df) == 0); /* composite: written */
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&k1, name);
	int fd = openat(sel_disk_store_dirfd(inner), name, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0);
	uint8_t byte;
	CHECK(pread(fd, &byte, 1, (off_t)df.span.page_off + 9) == 1);
	byte ^= 0x40;
	CHECK(pwrite(fd, &byte, 1, (off_t)df.span.page_off + 9) == 1);
	close(fd);
	core->casc_after = 0; /* past the backoff, if any */
	put_local(&fa, a, &ca[4], 128, 84);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).cascade_kept == 1);
	CHECK(local_has(a, &ca[1], 128) && sfx_pool_counters(a).cascaded == 1);
	CHECK(sfx_pool_counters(a).puts_failed == 1);

	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	mgr_stop(&m);
	CHECK_OK(test_rmtree(dd));
	free(dd);
	for (int i = 0; i < 5; i++)
		sfx_conv_free(&ca[i]);
	sfx_conv_free(&cb0);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* Fused restores (host planes, the host copy backend): three windows
 * verified and copied on the helpers, byte-exact; a page changed in the
 * arena fails the restore (corrupt) and is never served again. */
static void test_fused(void)
{
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, 200, 8);
	sfx_init(&fb, 1, 2, unit, 6000, 200, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr6", "--memory", "16MiB", NULL);
	sel_store *st[2];
	struct sfx *fs[2] = {&fa, &fb};
	for (int i = 0; i < 2; i++) {
		sel_store_config c = sfx_config(fs[i], false);
		c.pool = m.sock;
		c.pool_instance_id = i ? "FUB" : "FUA";
		c.pool_wait_ns = 10 * S_NS;
		CHECK_OK(sel_store_open(&c, &st[i]));
		CHECK(((struct sel_pooled *)st[i])->fused);
	}
	sel_store *a = st[0], *b = st[1];
	const uint64_t c = 150 * SFX_PT; /* 150 pages: three windows */
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 5, c, 0);
	sfx_conv_init(&fb, &cb, 5, c, 0);
	put_shared(&fa, a, &ca, c, 71);
	bool pending = false;
	sel_hit hit = pool_hit(b, &cb, c, &pending);
	sfx_poison(&fb);
	uint32_t ids[150];
	for (uint32_t i = 0; i < 150; i++)
		ids[i] = 40 + i;
	sel_inbound in = {.ticket = 601, .pages = ids, .n_pages = 150, .state_slot = 3};
	CHECK_OK(sel_store_fetch(b, &hit, &in));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 601, "event %d", e.type);
	CHECK(e.bytes == sfx_page_bytes_all(&fb) * 150 + 6000);
	CHECK(sfx_restored_ok(&fb, &cb, c, 40, 3));
	/* Again (ticket 602): the same bytes. */
	hit = pool_hit(b, &cb, c, &pending);
	sfx_poison(&fb);
	in.ticket = 602;
	CHECK_OK(sel_store_fetch(b, &hit, &in));
	e = sfx_next_event(b);
	CHECK(e.type == SEL_EV_FETCHED && sfx_restored_ok(&fb, &cb, c, 40, 3));
	/* A byte of every arena slot changed: the first bad page fails it. */
	struct sel_pooled *pb = (struct sel_pooled *)b;
	uint64_t len, sb = sel_pool_slot_bytes(pb->pc);
	uint8_t *base = sel_pool_arena(pb->pc, &len);
	uint64_t from = sel_pool_hello(pb->pc)->data_start;
	for (uint64_t o = from; o + sb <= len; o += sb)
		base[o + 100] ^= 0x11;
	hit = pool_hit(b, &cb, c, &pending);
	in.ticket = 603;
	CHECK_OK(sel_store_fetch(b, &hit, &in));
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 603, "event %d", e.type);
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_CORRUPT] == 1);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
}

/* The slot of B's arena holding the page whose digest is d, or NULL. */
static uint8_t *slot_of_digest(sel_store *b, const sel_geometry *g, uint64_t d)
{
	struct sel_pooled *pb = (struct sel_pooled *)b;
	uint64_t len, got;
	(void)sel_pool_arena(pb->pc, &len);
	for (uint32_t i = 0; (uint64_t)(i + 1) * pb->lay.slot_bytes <= len; i++) {
		uint8_t *slot = sel_pool_slot_addr(pb->pc, i);
		if (sel_slot_page_digest_padded(g, &pb->lay, slot, &got) == 0 && got == d)
			return slot;
	}
	return NULL;
}

/* An overlapped restore's tail from the pool (issue 18, fetch_sums): B
 * looks up at resident 128 over a 5-page record and fetches pages 2..4
 * with the digests of pages 0 and 1, the head its engine recomputes.
 * The tail lands byte-exact, the digests equal those of the same pages
 * restored whole (sel_page_digest_padded of the planes), and a head page
 * changed in the arena fails the restore (corrupt, counted) while a tail
 * fetch without the head's digests still succeeds (the head's check, not
 * the tail's, caught it). */
static void test_overlap_tail(void)
{
	const uint64_t unit[2] = {4096, 6000}; /* the second plane padded */
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 4096, 64, 8);
	sfx_init(&fb, 1, 2, unit, 4096, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgro", "--memory", "8MiB", NULL);
	sel_store *a = sfx_open_pooled(&fa, m.sock, "OA", 0),
		  *b = sfx_open_pooled(&fb, m.sock, "OB", 0);
	CHECK(a->ops->fetch_sums && b->ops->fetch_sums);
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 9, 320, 0);
	sfx_conv_init(&fb, &cb, 9, 320, 0);
	put_shared(&fa, a, &ca, 320, 61);
	bool pending = false;
	sel_hit whole = pool_hit(b, &cb, 320, &pending), tail;
	CHECK(sel_store_lookup(b, &cb.h, 128, 320, &tail) == 1);
	CHECK(tail.tier == SEL_TIER_POOL && tail.resident == 128 && tail.pages == 3);
	/* The reference: the whole hit into ids 10..14. */
	sfx_poison(&fb);
	CHECK_OK(sfx_fetch_at(b, &whole, 10, 2, 701));
	sel_event e = sfx_next_event(b);
	CHECK(e.type == SEL_EV_FETCHED && sfx_restored_ok(&fb, &cb, 320, 10, 2));
	uint64_t want[2];
	for (uint32_t j = 0; j < 2; j++)
		CHECK_OK(sel_page_digest_padded(fb.g, 10 + j, &want[j]));
	CHECK(want[0] != want[1]);
	/* The tail with its head's digests into ids 30..32. */
	uint32_t ids[3] = {30, 31, 32};
	uint64_t sums[2] = {0, 0};
	sel_inbound in = {.ticket = 702,
			  .pages = ids,
			  .n_pages = 3,
			  .state_slot = 3,
			  .sums = sums,
			  .n_sums = 2};
	CHECK(sel_store_lookup(b, &cb.h, 128, 320, &tail) == 1);
	CHECK_OK(sel_store_fetch(b, &tail, &in));
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 702, "event %d %d", e.type, e.error);
	CHECK(e.bytes == sfx_page_bytes_all(&fb) * 3 + 4096);
	for (uint32_t j = 2; j < 5; j++)
		CHECK(sfx_page_ok(&fb, 30 + j - 2, cb.tag, j, false));
	CHECK(sfx_row_ok(&fb, 3, sfx_row_seed(&cb, 320), false));
	CHECKF(sums[0] == want[0] && sums[1] == want[1],
	       "head digests %016" PRIx64 " %016" PRIx64 ", the planes' %016" PRIx64 " %016" PRIx64,
	       sums[0], sums[1], want[0], want[1]);
	/* Head page 1 changed in the arena: the head's check fails it. */
	uint8_t *slot = slot_of_digest(b, fb.g, want[1]);
	CHECK(slot != NULL);
	slot[17] ^= 0x40;
	uint64_t corrupt = sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_CORRUPT];
	/* The control: the same tail without the head's digests restores. */
	CHECK(sel_store_lookup(b, &cb.h, 128, 320, &tail) == 1);
	CHECK_OK(sfx_fetch_at(b, &tail, 40, 4, 704));
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == 704, "event %d %d", e.type, e.error);
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_CORRUPT] == corrupt);
	CHECK(sel_store_lookup(b, &cb.h, 128, 320, &tail) == 1);
	in.ticket = 703;
	CHECK_OK(sel_store_fetch(b, &tail, &in));
	e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCH_FAILED && e.ticket == 703, "event %d", e.type);
	CHECK(sfx_pool_counters(b).claims_failed[SEL_POOL_FAIL_CORRUPT] == corrupt + 1);
	printf("  pool overlap tail: 3 pages with the head's 2 digests (the planes'); a head "
	       "page changed in the arena: the restore failed corrupt\n");
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
}

int main(void)
{
	char *d = test_mkdtemp("pooled");
	snprintf(dir, sizeof dir, "%s", d);
	signal(SIGPIPE, SIG_IGN);
	test_absent();
	test_budget();
	test_late_above();
	test_overlap_tail();
	test_local_first();
	test_cascade();
	test_cascade_disk(false);
	test_cascade_disk(true);
	test_fused();
	test_share_corrupt_kill();
	test_exports();
	test_fallback();
	test_other_layout();
	test_rmtree(d);
	free(d);
	printf("ok\n");
	return 0;
}
