/*
 * test_engine_overlap.c - overlapped restores (issue 18; engine_overlap.c):
 * the head of a host hit recomputed while its tail loads.
 *
 * Covers, on the built-in core with the host backend and a small GPU cache
 * (fillers evict turn 1's checkpoints, so turn 2 is a host hit):
 *   - same_tokens: with the memory store and --prefix-cache-overlap always,
 *     turn 2 is restored overlapped (head tokens recomputed, the rest
 *     restored, no mismatch) and its tokens equal those of the same
 *     conversation restored plainly (overlap off: the flag changes the
 *     path, no overlapped restore at all), of an engine without offload and
 *     of the model run directly;
 *   - mismatch (memory store, and the composite's warm copies): every
 *     stored page of the memory store is changed after it
 *     was stored (its digest, taken from the stored bytes, agrees with
 *     them, so only the recompute can tell): the overlapped restore finds
 *     the head page differing, counts it, drops the record and recomputes
 *     the request, whose tokens are still the reference's;
 *   - disk: the disk store cannot give digests without reading the pages,
 *     so its hits restore plainly with overlap on (and the same tokens); the
 *     composite gives them for chains in warm memory (overlapped), not for
 *     records on disk after a restart (whole).
 */
#include "engine_test.h"
#include "internal.h"
#include "store_composite.h"
#include "store_memory_int.h"

static hel_core *core;
static test_rng rng;

static hel_engine *start(hel_engine_config c) { return et_engine_start(core, c); }

static void finish(hel_engine *e) { et_engine_finish(e); }

static const hel_engine_config small = {.max_active = 3,
					.gpu_pages = 24,
					.gpu_rows = 30,
					.fetch = HEL_FETCH_ALWAYS,
					.overlap = HEL_OVERLAP_ALWAYS};

static void fillers(hel_engine *e, uint64_t seed, int count)
{
	test_rng r;
	test_rng_init(&r, seed);
	for (int i = 0; i < count; i++) {
		uint32_t n;
		hel_token *p = et_random_prompt(&r, 130 + test_rng_below(&r, 40), &n);
		et_call_free(et_run(e, p, n, 3, NULL));
		free(p);
	}
}

struct turns {
	uint64_t t1;
	struct et_call *turn1, *turn2;
	hel_token *p2;
	uint32_t n2;
};

/* Turn 1 (about six pages), a request resuming at its terminal (which
 * offers it), fillers, turn 2.  hook (may be NULL) runs before turn 2. */
static void turns(hel_engine *e, uint64_t seed, struct turns *o, void (*hook)(void *), void *arg)
{
	test_rng r;
	test_rng_init(&r, seed);
	struct et_chat ch = {0};
	char q[400];
	size_t len = 300 + test_rng_below(&r, 60);
	et_text(&r, q, len);
	et_chat_add(&ch, "user", q, len);
	uint32_t n1;
	hel_token *p1 = et_chat_prompt(&ch, &n1);
	o->turn1 = et_run(e, p1, n1, 40, NULL);
	o->t1 = et_terminal(o->turn1);
	hel_token *pc = malloc(o->t1 * sizeof *pc);
	memcpy(pc, p1, n1 * sizeof *pc);
	memcpy(pc + n1, o->turn1->tok, (o->t1 - n1) * sizeof *pc);
	et_call_free(et_run(e, pc, (uint32_t)o->t1, 1, NULL));
	et_settle(e);
	fillers(e, seed ^ 0x5eed, 14);
	et_settle(e);
	if (hook)
		hook(arg);
	et_chat_reply(&ch, o->turn1->tok, o->turn1->n);
	len = 20 + test_rng_below(&r, 40);
	et_text(&r, q, len);
	et_chat_add(&ch, "user", q, len);
	o->p2 = et_chat_prompt(&ch, &o->n2);
	o->turn2 = et_run(e, o->p2, o->n2, 40, NULL);
	et_chat_free(&ch);
	free(p1);
	free(pc);
}

static void turns_free(struct turns *o)
{
	et_call_free(o->turn1);
	et_call_free(o->turn2);
	free(o->p2);
}

static void same(const struct et_call *a, const struct et_call *b, const char *what)
{
	CHECKF(a->n == b->n && !memcmp(a->tok, b->tok, a->n * sizeof(hel_token)),
	       "%s: tokens differ", what);
}

static void check_ref(const struct turns *o)
{
	struct et_ref ref;
	et_reference(core, o->p2, o->n2, 40, NULL, &ref);
	et_same_as_ref(NULL, o->turn2, &ref);
	et_ref_free(&ref);
}

static hel_engine_stats stats(hel_engine *e)
{
	hel_engine_stats st;
	et_settle(e);
	hel_engine_stats_get(e, &st);
	return st;
}

static void same_tokens(void)
{
	uint64_t seed = test_rng_next(&rng);
	hel_engine_config con = small, coff = small, cno = small;
	con.memory_bytes = coff.memory_bytes = 32 << 20;
	coff.overlap = HEL_OVERLAP_OFF;
	hel_engine *on = start(con), *off = start(coff), *no = start(cno);
	struct turns a, b, c;
	turns(on, seed, &a, NULL, NULL);
	turns(off, seed, &b, NULL, NULL);
	turns(no, seed, &c, NULL, NULL);
	hel_engine_stats sa = stats(on), sb = stats(off);

	/* Overlapped: the head recomputed, the rest restored, from memory. */
	const hel_outcome *oa = &a.turn2->out;
	CHECKF(oa->overlap_tokens > 0 && oa->host_tier == SEL_TIER_MEMORY &&
		       oa->reused_gpu_tokens + oa->overlap_tokens + oa->reused_host_tokens == a.t1,
	       "overlap %llu host %llu gpu %llu terminal %llu",
	       (unsigned long long)oa->overlap_tokens, (unsigned long long)oa->reused_host_tokens,
	       (unsigned long long)oa->reused_gpu_tokens, (unsigned long long)a.t1);
	CHECK(oa->cached_tokens == a.t1 - oa->overlap_tokens && oa->prefill_tokens == a.n2 - a.t1);
	CHECK(sa.overlap_restores >= 1 && sa.overlap_done == sa.overlap_restores);
	CHECK(sa.overlap_mismatches == 0 && sa.overlap_head_tokens >= oa->overlap_tokens);
	CHECK(sa.host_fetch_failed == 0);

	/* Off: restored whole, no head. */
	const hel_outcome *ob = &b.turn2->out;
	CHECK(ob->overlap_tokens == 0 && ob->reused_host_tokens + ob->reused_gpu_tokens == b.t1);
	CHECK(sb.overlap_restores == 0 && sb.overlap_head_tokens == 0 && sb.host_hits >= 1);

	same(a.turn1, b.turn1, "turn 1, on and off");
	same(a.turn2, b.turn2, "turn 2, overlapped and plain");
	same(a.turn2, c.turn2, "turn 2, overlapped and without offload");
	check_ref(&a);
	printf("  memory: %llu of %llu tokens recomputed as the head, %llu restored; the same "
	       "%u tokens as a plain restore, without offload and the model\n",
	       (unsigned long long)oa->overlap_tokens, (unsigned long long)a.t1,
	       (unsigned long long)oa->reused_host_tokens, a.turn2->n);
	turns_free(&a);
	turns_free(&b);
	turns_free(&c);
	finish(on);
	finish(off);
	finish(no);
}

/* ---- a stored page that lies --------------------------------------------------- */

/* Change one byte of every stored page of the memory store.  Its digests
 * are taken from these bytes, so they agree with them: only a recompute
 * finds the difference.  The worker is settled (nothing in flight). */
struct kept {
	sel_store *s;
	bool composite;
};

static int open_keep(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	int rc = sel_store_open(cfg, out);
	((struct kept *)ctx)->s = *out;
	return rc;
}

static void corrupt_pages(void *arg)
{
	struct kept *k = arg;
	struct mem_store *ms = sel_ms_of(k->composite ? sel_composite_store_memory(k->s) : k->s);
	const sel_slot_layout *l = &ms->c.sp->layout;
	uint32_t n = 0;
	for (sel_node_id id = 0; id < ms->c.nrecs; id++) {
		if (!sel_core_live(&ms->c, id))
			continue;
		struct mrec *m = ms_rec(ms, id);
		for (uint32_t i = 0; i < m->n_page_slots; i++) {
			uint8_t *p = (uint8_t *)sel_slab_addr(ms->pool, m->slots[i]) +
				     l->share_off[0] + l->plane_off[0][0];
			p[7] ^= 0x5a;
			n++;
		}
	}
	CHECK(n > 0);
}

static void mismatch(bool composite)
{
	uint64_t seed = test_rng_next(&rng);
	struct kept k = {.composite = composite};
	char *dir = composite ? test_mkdtemp("engine-overlap") : NULL;
	hel_engine_config cfg = small;
	cfg.memory_bytes = 32 << 20;
	cfg.store_open = open_keep;
	cfg.store_ctx = &k;
	if (composite) {
		cfg.disk_dir = dir;
		cfg.disk_limit = 256 << 20;
		cfg.disk_limit_set = true;
	}
	hel_engine *e = start(cfg);
	struct turns a;
	turns(e, seed, &a, corrupt_pages, &k);
	hel_engine_stats st = stats(e);
	const hel_outcome *o = &a.turn2->out;
	CHECKF(st.overlap_mismatches == 1 && st.overlap_restores == 1 && st.overlap_done == 0,
	       "mismatches %llu restores %llu done %llu", (unsigned long long)st.overlap_mismatches,
	       (unsigned long long)st.overlap_restores, (unsigned long long)st.overlap_done);
	/* Failed, recomputed (no host lookup on the retry), record dropped. */
	CHECK(st.host_fetch_failed == 1 && o->reused_host_tokens == 0 && o->overlap_tokens == 0);
	CHECK(o->prefill_tokens == a.n2 - o->reused_gpu_tokens);
	CHECK(st.store.tier[composite ? SEL_TIER_DISK : SEL_TIER_MEMORY].corrupt == 1);
	check_ref(&a);
	/* Dropped: the turn-1 terminal's record is gone from memory. */
	sel_key t1;
	struct sel_memory_record_info ri;
	sel_key_direct(core->identity, NULL, 0, a.p2, a.t1, &t1);
	CHECK_RC(sel_memory_store_record(composite ? sel_composite_store_memory(k.s) : k.s, &t1,
					 &ri),
		 -ENOENT);
	printf("  mismatch (%s): a stored page that differs from its recompute was found, "
	       "counted, dropped and recomputed (%u tokens as the model's)\n",
	       composite ? "composite" : "memory", a.turn2->n);
	turns_free(&a);
	finish(e);
	if (dir) {
		test_rmtree(dir);
		free(dir);
	}
}

/* ---- disk tiers ------------------------------------------------------------------- */

/* The disk store has no digests without reading the pages: its hits restore
 * whole.  The composite gives them for chains it holds in memory: turn 2,
 * whose record is still in warm memory, is overlapped; after a restart
 * (records on disk only) it restores whole.  The same tokens each time. */
static void disk(bool composite)
{
	uint64_t seed = test_rng_next(&rng);
	char *dir = test_mkdtemp("engine-overlap");
	hel_engine_config cfg = small, cno = small;
	cfg.disk_dir = dir;
	cfg.disk_limit = 256 << 20;
	cfg.disk_limit_set = true;
	if (composite) {
		cfg.memory_bytes = 32 << 20;
		cfg.drain_on_shutdown = true;
	}
	hel_engine *e = start(cfg), *no = start(cno);
	struct turns a, c;
	turns(e, seed, &a, NULL, NULL);
	turns(no, seed, &c, NULL, NULL);
	hel_engine_stats st = stats(e);
	const hel_outcome *o = &a.turn2->out;
	if (composite) {
		CHECKF(o->overlap_tokens > 0 && st.overlap_done == 1 && st.overlap_mismatches == 0,
		       "composite: overlap %llu done %llu", (unsigned long long)o->overlap_tokens,
		       (unsigned long long)st.overlap_done);
	} else {
		CHECK(o->host_tier == SEL_TIER_DISK && o->overlap_tokens == 0);
		CHECK(st.overlap_restores == 0 && st.host_hits >= 1);
	}
	same(a.turn2, c.turn2, "disk: turn 2 and without offload");
	check_ref(&a);
	finish(e);
	if (composite) { /* after a restart: from disk, whole */
		e = start(cfg);
		struct et_call *r = et_run(e, a.p2, a.n2, 40, NULL);
		st = stats(e);
		CHECK(r->out.host_tier == SEL_TIER_DISK && r->out.overlap_tokens == 0);
		CHECK(st.overlap_restores == 0 && r->out.reused_host_tokens > 0);
		same(r, a.turn2, "composite: after a restart");
		et_call_free(r);
		finish(e);
	}
	printf("  %s: %s; the same tokens\n", composite ? "composite" : "disk",
	       composite ? "overlapped from warm memory, whole from disk after a restart"
			 : "restored whole (no digests without reading the pages)");
	turns_free(&a);
	turns_free(&c);
	finish(no);
	test_rmtree(dir);
	free(dir);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	same_tokens();
	mismatch(false);
	mismatch(true);
	disk(false);
	disk(true);
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
