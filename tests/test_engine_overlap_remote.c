/*
 * test_engine_overlap_remote.c - overlapped restores from the remote tier
 * (issue 18; engine_overlap.c, store_remote.c look_derive) against a real
 * redis-server on loopback, two engines standing for two hosts: A (the
 * remote tier only) computes a prompt of two records (x, then y linked
 * under it) and writes them to Redis; B (the remote tier only, an empty
 * GPU cache) serves y:
 *   - split: B's remote hit is split at the policy's point
 *     (test_split_worth): the head recomputed while the tail is claimed
 *     from Redis, the head's pages checked against the manifests' page
 *     checksums, no mismatch; the tokens are those of an engine without
 *     offload and of the model run directly; the split point's lookup
 *     made no remote lookup of its own (one lookup for the request);
 *   - lying record: every record on Redis starting at page 0 gets page 0
 *     changed, window and manifest checksum both (so the claim's own
 *     checks pass): B's recompute of the head finds it, counts the
 *     mismatch and recomputes the request (the model's tokens still).
 * Exits 77 without redis-server.
 */
#include "xxh.h"

#include "engine_test.h"
#include "internal.h"
#include "redisfx.h"

static hel_core *core;
static char *dir;
static struct rfx_server srv;
static char url[256];

/* The namespace the engines' stores use (from the last store opened). */
static sel_record_ns ns;
static bool ns_ok;

static int open_ns(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	(void)ctx;
	if (!ns_ok) {
		CHECK_OK(sel_record_ns_init(&ns, cfg->geometry, cfg->identity));
		ns_ok = true;
	}
	return sel_store_open(cfg, out);
}

static hel_engine_config remote_cfg(void)
{
	return (hel_engine_config){.max_active = 3,
				   .gpu_pages = 24,
				   .gpu_rows = 30,
				   .remote = url,
				   .overlap = HEL_OVERLAP_ON,
				   .fetch = HEL_FETCH_AUTO,
				   .test_split_worth = true,
				   .store_open = open_ns};
}

static hel_engine_stats stats(hel_engine *e)
{
	hel_engine_stats st;
	et_settle(e);
	hel_engine_stats_get(e, &st);
	return st;
}

static bool written(const hel_engine_stats *st, void *arg)
{
	return et_settled(st, NULL) && st->store.remote.stored >= *(uint64_t *)arg &&
	       st->store.remote.writes_in_flight == 0;
}

struct prompts {
	hel_token *x, *y;
	uint32_t nx, ny;
};

/* A: x (a page and a bit), then y (x and four pages more), both on Redis. */
static void host_a(struct prompts *p, uint64_t seed)
{
	test_rng r;
	test_rng_init(&r, seed);
	p->x = et_random_prompt(&r, 70, &p->nx);
	p->y = et_random_prompt(&r, 330, &p->ny);
	memcpy(p->y, p->x, p->nx * sizeof *p->y);
	redisReply *x = rfx_cmd(&srv, "FLUSHALL");
	CHECK(x != NULL);
	freeReplyObject(x);
	hel_engine *a = et_engine_start(core, remote_cfg());
	et_call_free(et_run(a, p->x, p->nx, 1, NULL));
	et_settle(a);
	et_call_free(et_run(a, p->y, p->ny, 1, NULL));
	uint64_t two = 2;
	et_wait_stats(a, written, &two);
	et_engine_finish(a);
}

/* y on a fresh B: until its lookup is answered within the grace period (a
 * loaded machine may end it first: then the request recomputes and a
 * fresh engine asks again), at most five engines. */
static struct et_call *host_b(const struct prompts *p, hel_engine_stats *st)
{
	for (int i = 0;; i++) {
		hel_engine *b = et_engine_start(core, remote_cfg());
		struct et_call *c = et_run(b, p->y, p->ny, 20, NULL);
		*st = stats(b);
		et_engine_finish(b);
		if (c->out.host_tier == SEL_TIER_REMOTE || st->store.remote.lookups_late == 0 ||
		    i == 4)
			return c;
		et_call_free(c);
	}
}

static void check_ref(const struct prompts *p, const struct et_call *c)
{
	struct et_ref ref;
	et_reference(core, p->y, p->ny, 20, NULL, &ref);
	et_same_as_ref(NULL, c, &ref);
	et_ref_free(&ref);
}

static void split(void)
{
	struct prompts p;
	host_a(&p, test_seed());
	hel_engine_stats st;
	struct et_call *c = host_b(&p, &st);
	const hel_outcome *o = &c->out;
	CHECKF(o->host_tier == SEL_TIER_REMOTE && o->overlap_tokens > 0 && st.overlap_done == 1 &&
		       st.overlap_restores == 1 && st.overlap_mismatches == 0 &&
		       st.host_fetch_failed == 0,
	       "tier %d overlap %llu restores %llu done %llu mismatches %llu failed %llu",
	       (int)o->host_tier, (unsigned long long)o->overlap_tokens,
	       (unsigned long long)st.overlap_restores, (unsigned long long)st.overlap_done,
	       (unsigned long long)st.overlap_mismatches, (unsigned long long)st.host_fetch_failed);
	CHECK(o->reused_gpu_tokens == 0 && o->overlap_tokens + o->reused_host_tokens > 64);
	/* One remote lookup, answered once from Redis; the split point's
	 * lookup came from its hit. */
	CHECKF(st.store.remote.lookups == 1 && st.store.remote.hits == 1 &&
		       st.store.remote.claims == 1,
	       "remote lookups %llu hits %llu claims %llu",
	       (unsigned long long)st.store.remote.lookups,
	       (unsigned long long)st.store.remote.hits,
	       (unsigned long long)st.store.remote.claims);
	hel_engine *no = et_engine_start(
		core, (hel_engine_config){.max_active = 3, .gpu_pages = 24, .gpu_rows = 30});
	struct et_call *r = et_run(no, p.y, p.ny, 20, NULL);
	CHECKF(r->n == c->n && !memcmp(r->tok, c->tok, c->n * sizeof *c->tok),
	       "tokens differ from an engine without offload");
	check_ref(&p, c);
	printf("  remote split: %llu head tokens recomputed while %llu restored from Redis, "
	       "one remote lookup; the tokens of no offload and the model\n",
	       (unsigned long long)o->overlap_tokens, (unsigned long long)o->reused_host_tokens);
	et_call_free(r);
	et_engine_finish(no);
	et_call_free(c);
	free(p.x);
	free(p.y);
}

/* ---- a record on Redis that lies --------------------------------------------- */

static redisReply *get_value(const char *k)
{
	redisReply *x = rfx_cmd(&srv, "GET %s", k);
	CHECKF(x && x->type == REDIS_REPLY_STRING, "GET %s", k);
	return x;
}

static void set_value(const char *k, const uint8_t *v, size_t len)
{
	const char *argv[] = {"SET", k, (const char *)v};
	size_t lens[] = {3, strlen(k), len};
	redisReply *x = rfx_cmd_argv(&srv, 3, argv, lens);
	CHECK(x && x->type == REDIS_REPLY_STATUS);
	freeReplyObject(x);
}

/* Decode value k (checksums only) into a copy; *pl and *got as decoded. */
static uint8_t *decode(const struct sel_rv_keys *none, const char *k, const sel_key *key,
		       uint32_t w, struct sel_rv_hdr *got, uint8_t **pl, size_t *len)
{
	redisReply *x = get_value(k);
	uint8_t *v = malloc(x->len);
	CHECK(v != NULL);
	memcpy(v, x->str, x->len);
	*len = x->len;
	freeReplyObject(x);
	struct sel_rv_hdr want = {.kind = w == SEL_RV_MANIFEST_WINDOW ? SEL_RV_KIND_MANIFEST
								      : SEL_RV_KIND_WINDOW,
				  .key = *key,
				  .window = w};
	memcpy(want.identity, ns.identity, sizeof want.identity);
	memcpy(want.fingerprint, ns.fingerprint, sizeof want.fingerprint);
	CHECK_OK(sel_rv_decode(none, &want, v, *len, got, pl));
	return v;
}

static void reencode(const struct sel_rv_keys *none, const char *k, const struct sel_rv_hdr *got,
		     uint8_t *pl, size_t len)
{
	struct iovec iov = {pl, got->payload};
	uint8_t *out = malloc(len + 64);
	CHECK(out != NULL);
	int n = sel_rv_encode(none, got, &iov, 1, out, len + 64);
	CHECK(n == (int)len);
	set_value(k, out, (size_t)n);
	free(out);
}

/* Change one byte of page 0 of the record keyed key (in window 0) and its
 * manifest checksum to match: a consistent record with a wrong page. */
static void lie(const struct sel_rv_keys *none, const struct sel_rv_names *nm, const sel_key *key)
{
	char mk[SEL_RV_NAME_MAX], wk[SEL_RV_NAME_MAX];
	sel_rv_manifest_name(nm, key, mk);
	sel_rv_window_name(nm, key, 0, wk);
	struct sel_rv_hdr mg, wg;
	uint8_t *mp, *wp;
	size_t ml, wl;
	uint8_t *mv = decode(none, mk, key, SEL_RV_MANIFEST_WINDOW, &mg, &mp, &ml);
	struct sel_rv_manifest m;
	CHECK_OK(sel_rv_manifest_decode(&ns, key, mp, mg.payload, &m));
	CHECK(m.layout.ppw >= 1 && m.h.d.tail >= 1);
	uint8_t *wv = decode(none, wk, key, 0, &wg, &wp, &wl);
	wp[7] ^= 0x5a;
	sel_put_u64((uint8_t *)(uintptr_t)m.cksum, XXH3_64bits(wp, m.layout.stride));
	reencode(none, wk, &wg, wp, wl);
	reencode(none, mk, &mg, mp, ml);
	free(mv);
	free(wv);
}

/* Every record of y on Redis whose first stored page is page 0. */
static int lie_at_page0(const struct prompts *p)
{
	struct sel_rv_keys none;
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	struct sel_rv_names nm;
	sel_rv_names_init(&nm, &ns, &none);
	uint32_t P = core->page_tokens;
	int n = 0;
	for (uint64_t c = 1; c <= p->ny; c++) {
		sel_key key;
		char mk[SEL_RV_NAME_MAX];
		sel_key_direct(core->identity, NULL, 0, p->y, c, &key);
		sel_rv_manifest_name(&nm, &key, mk);
		if (rfx_int(&srv, "EXISTS %s", mk) != 1)
			continue;
		struct sel_rv_hdr g;
		uint8_t *pl;
		size_t len;
		uint8_t *v = decode(&none, mk, &key, SEL_RV_MANIFEST_WINDOW, &g, &pl, &len);
		struct sel_rv_manifest m;
		CHECK_OK(sel_rv_manifest_decode(&ns, &key, pl, g.payload, &m));
		bool first = m.h.d.tail && c / P == m.h.d.tail;
		free(v);
		if (first) {
			lie(&none, &nm, &key);
			n++;
		}
	}
	return n;
}

static void lying_record(void)
{
	struct prompts p;
	host_a(&p, test_seed() ^ 0x11e);
	int n = lie_at_page0(&p);
	CHECK(n >= 1);
	hel_engine_stats st;
	struct et_call *c = host_b(&p, &st);
	const hel_outcome *o = &c->out;
	CHECKF(st.overlap_mismatches == 1 && st.overlap_restores == 1 && st.overlap_done == 0 &&
		       st.host_fetch_failed == 1,
	       "mismatches %llu restores %llu done %llu failed %llu",
	       (unsigned long long)st.overlap_mismatches, (unsigned long long)st.overlap_restores,
	       (unsigned long long)st.overlap_done, (unsigned long long)st.host_fetch_failed);
	CHECK(o->reused_host_tokens == 0 && o->overlap_tokens == 0 &&
	      o->prefill_tokens == p.ny - o->reused_gpu_tokens);
	check_ref(&p, c);
	printf("  remote lying record: page 0 of %d record%s changed with its checksum; the head's "
	       "recompute found it, counted it, recomputed (the model's %u tokens)\n",
	       n, n == 1 ? "" : "s", c->n);
	et_call_free(c);
	free(p.x);
	free(p.y);
}

int main(void)
{
	if (!rfx_available())
		SKIP("redis-server or redis-cli is not installed (scripts/install-deps)");
	dir = test_mkdtemp("engine-overlap-remote");
	rfx_start(&srv, dir, "redis", false, false, NULL);
	rfx_url(&srv, 1, false, url, sizeof url);
	CHECK_OK(hel_core_builtin(&core));
	split();
	lying_record();
	hel_core_free(core);
	if (ns_ok)
		sel_record_ns_free(&ns);
	rfx_stop(&srv);
	test_rmtree(dir);
	free(dir);
	printf("ok\n");
	return 0;
}
