/*
 * test_determinism.c - the reference engine's acceptance on determinism and
 * byte sensitivity (ARCHITECTURE.md "The reference engine's model",
 * requirements 1 and 2; design 2.1, 2.12 "Rows and pages are stored
 * byte-exact").
 *
 * For random multi-turn conversations, greedy and sampled, the generated
 * tokens AND the logits they were drawn from are bit-identical whether the
 * prefix was computed in one prefill (the model run directly: the
 * reference), in chunks of random sizes (the model directly, and the engine
 * with a random chunk size), taken from the GPU checkpoint cache (the
 * engine, turn after turn), or restored through the memory store with the
 * host backend (the engine with a small GPU cache, filler prompts evicting
 * each turn before the next).  The engine's logits come from its
 * debug_logits hook.
 *
 * Byte sensitivity: a checkpoint is restored through the memory store with
 * one byte flipped in the restored copy, before the engine tells the model
 * it was loaded -- in each page plane, and in each row region (hidden
 * vector, recurrent state, partial page) -- and the following tokens
 * change.  A flip in the consumed count is refused by the model's row
 * validation instead: the engine recomputes and the tokens are right.
 */
#include "engine_test.h"

static hel_core *core;
static test_rng rng;

/* ---- the model directly: chunks of random sizes ---------------------------------------- */

static void test_model_chunks(const hel_token *prompt, uint32_t n, const struct et_ref *ref)
{
	uint32_t P = core->page_tokens, V = core->vocab;
	hel_model *m;
	hel_model_opts o = {.mode = SEL_MODE_ORDINARY, .pages = n / P + 1, .rows = 1};
	CHECK_OK(hel_model_create(core, &o, &m));
	uint32_t *pages = malloc((n / P + 1) * sizeof *pages);
	for (uint32_t i = 0; i <= n / P; i++)
		pages[i] = n / P - i; /* other ids than the reference's */
	int32_t *l = malloc(V * sizeof *l);
	CHECK_OK(hel_model_row_init(m, 0));
	uint32_t done = 0;
	while (done < n) {
		uint32_t k = 1 + (uint32_t)test_rng_below(&rng, 97);
		if (k > n - done)
			k = n - done;
		CHECK_OK(hel_model_prefill(m, 0, pages, (done + k) / P, prompt + done, k,
					   done + k == n ? l : NULL));
		done += k;
	}
	CHECK(memcmp(l, ref->logits, V * sizeof *l) == 0);
	free(l);
	free(pages);
	hel_model_destroy(m);
}

/* ---- conversations through engines ------------------------------------------------------ */

struct eng {
	hel_engine *e;
	struct et_logits lg;
	struct et_gate gate;
	bool offload;
	uint64_t gpu_reuse, host_reuse, turns;
};

static void eng_open(struct eng *x, bool offload)
{
	memset(x, 0, sizeof *x);
	pthread_mutex_init(&x->lg.mu, NULL);
	x->offload = offload;
	hel_engine_config c = {
		.core = core,
		.max_active = 2,
		.chunk_tokens = 1 + (uint32_t)test_rng_below(&rng, 300),
		.step_tokens = 64 + (uint32_t)test_rng_below(&rng, 1024),
		.debug_logits = et_logits_cb,
		.debug_ctx = &x->lg,
	};
	if (offload) {
		c.gpu_pages = 24;
		c.gpu_rows = 24;
		c.memory_bytes = 16 << 20;
		c.fetch = HEL_FETCH_ALWAYS;
		c.store_open = et_gate_open;
		c.store_ctx = &x->gate;
	} else {
		c.gpu_cache_bytes = 16 << 20;
	}
	printf("engine: %s, chunk %u, step %u tokens\n",
	       offload ? "memory store, 24 pages" : "no store", c.chunk_tokens, c.step_tokens);
	CHECK_OK(hel_engine_open(&c, &x->e));
	CHECK_OK(hel_engine_start(x->e));
}

static void eng_close(struct eng *x)
{
	CHECK_OK(hel_engine_stop(x->e, 0));
	hel_engine_destroy(x->e);
	et_logits_free(&x->lg);
	pthread_mutex_destroy(&x->lg.mu);
}

static void fillers(hel_engine *e, int count)
{
	for (int i = 0; i < count; i++) {
		uint32_t n;
		hel_token *p = et_random_prompt(&rng, 130 + test_rng_below(&rng, 40), &n);
		et_call_free(et_run(e, p, n, 3, NULL));
		free(p);
	}
	et_settle(e); /* their checkpoints in the store, the GPU cache evicted */
}

static void conversation(struct eng *engs, int n_engs)
{
	int turns = 2 + (int)test_rng_below(&rng, 2);
	hel_sampler sm = {0};
	if (test_rng_below(&rng, 2))
		sm = (hel_sampler){.temperature = 0.3 + (double)test_rng_below(&rng, 100) / 100,
				   .seed = test_rng_next(&rng)};
	struct et_chat ch = {0};
	char text[160];
	for (int turn = 0; turn < turns; turn++) {
		size_t len = 5 + test_rng_below(&rng, 150);
		et_text(&rng, text, len);
		et_chat_add(&ch, "user", text, len);
		uint32_t n, max = 1 + (uint32_t)test_rng_below(&rng, 32);
		hel_token *p = et_chat_prompt(&ch, &n);
		struct et_ref ref;
		et_reference(core, p, n, max, &sm, &ref);
		test_model_chunks(p, n, &ref);
		for (int i = 0; i < n_engs; i++) {
			struct eng *x = &engs[i];
			if (x->offload && turn > 0)
				fillers(x->e, 12);
			struct et_call *c = et_run(x->e, p, n, max, &sm);
			if (x->offload)
				et_settle(x->e); /* this turn's checkpoints reached the store */
			et_same_as_ref(&x->lg, c, &ref);
			x->turns++;
			x->gpu_reuse += c->out.reused_gpu_tokens;
			x->host_reuse += c->out.reused_host_tokens;
			if (turn > 0 && !x->offload)
				CHECK(c->out.reused_gpu_tokens > 0);
			if (turn > 0 && x->offload)
				CHECKF(c->out.reused_host_tokens > 0,
				       "turn %d after the fillers: host reuse %llu, gpu %llu", turn,
				       (unsigned long long)c->out.reused_host_tokens,
				       (unsigned long long)c->out.reused_gpu_tokens);
			et_call_free(c);
		}
		/* Every engine generated the reference reply: continue with it. */
		et_chat_reply(&ch, ref.tok, ref.n);
		et_ref_free(&ref);
		free(p);
	}
	et_chat_free(&ch);
}

static void test_conversations(void)
{
	static struct eng engs[2];
	eng_open(&engs[0], false);
	eng_open(&engs[1], true);
	for (int i = 0; i < 8 * ET_SCALE; i++)
		conversation(engs, 2);
	printf("reused: no store %llu GPU tokens; memory store %llu GPU and %llu host tokens\n",
	       (unsigned long long)engs[0].gpu_reuse, (unsigned long long)engs[1].gpu_reuse,
	       (unsigned long long)engs[1].host_reuse);
	CHECK(engs[0].gpu_reuse > 0 && engs[1].host_reuse > 0);
	eng_close(&engs[0]);
	eng_close(&engs[1]);
}

/* ---- byte sensitivity --------------------------------------------------------------------- */

struct target {
	const char *what;
	int kind;        /* ET_FLIP_PAGE / ET_FLIP_ROW */
	uint32_t plane;  /* page: plane index (name order) */
	uint32_t index;  /* page: restored page index */
	uint64_t offset; /* byte offset in the page unit or the row */
	bool rejected;   /* the model must refuse the row (recompute) */
};

static void test_sensitivity(void)
{
	static struct eng x;
	eng_open(&x, true);
	hel_row_layout lay;
	CHECK_OK(hel_core_row_layout(core, SEL_MODE_ORDINARY, &lay));
	uint32_t P = core->page_tokens;
	/* A prompt with two complete pages and a partial third, whose reply
	 * is long enough for a change to show (one that ends at once leaves
	 * only the first token, which depends on the row's hidden vector). */
	uint32_t n, max = 96;
	hel_token *p = NULL;
	struct et_ref ref = {0};
	for (int tries = 0; ref.n < max; tries++) {
		CHECK(tries < 400);
		free(p);
		et_ref_free(&ref);
		p = et_random_prompt(&rng, 150, &n);
		et_reference(core, p, n, max, NULL, &ref);
	}
	CHECK(n / P == 2 && n % P > 8);
	uint32_t partial = n % P;
	et_call_free(et_run(x.e, p, n, 2, NULL)); /* its prompt checkpoint reaches the store */
	et_settle(x.e); /* ... before the fillers: a copy in flight pins it in the GPU */

	struct target t[16];
	int nt = 0;
	for (uint32_t pl = 0; pl < core->n_planes; pl++) {
		uint64_t unit = (uint64_t)P * core->planes[pl].token_bytes;
		t[nt++] = (struct target){core->planes[pl].name,
					  ET_FLIP_PAGE,
					  pl,
					  (uint32_t)test_rng_below(&rng, 2),
					  test_rng_below(&rng, unit),
					  false};
	}
	t[nt++] = (struct target){
		"hidden", ET_FLIP_ROW, 0, 0, lay.hidden + test_rng_below(&rng, lay.hidden_bytes),
		false};
	/* Past word 0 (the previous token, whose flip the logits refuse). */
	t[nt++] = (struct target){"recurrent",
				  ET_FLIP_ROW,
				  0,
				  0,
				  lay.recurrent + 8 + test_rng_below(&rng, lay.recurrent_bytes - 8),
				  false};
	uint64_t poff = 0;
	static char names[16][80];
	for (uint32_t pl = 0; pl < core->n_planes; pl++) {
		uint64_t tb = core->planes[pl].token_bytes;
		snprintf(names[pl], sizeof names[pl], "partial %s", core->planes[pl].name);
		t[nt++] = (struct target){names[pl],
					  ET_FLIP_ROW,
					  0,
					  0,
					  lay.partial + poff + test_rng_below(&rng, partial * tb),
					  false};
		poff += (uint64_t)P * tb;
	}
	t[nt++] = (struct target){"consumed", ET_FLIP_ROW, 0, 0, lay.consumed, true};

	for (int i = 0; i < nt; i++) {
		fillers(x.e, 12);
		int flipped = __atomic_load_n(&x.gate.flipped, __ATOMIC_SEQ_CST);
		x.gate.flip_plane = t[i].plane;
		x.gate.flip_index = t[i].index;
		x.gate.flip_offset = t[i].offset;
		__atomic_store_n(&x.gate.flip_kind, t[i].kind, __ATOMIC_SEQ_CST);
		hel_engine_stats st0, st1;
		hel_engine_stats_get(x.e, &st0);
		struct et_call *c = et_run(x.e, p, n, max, NULL);
		hel_engine_stats_get(x.e, &st1);
		CHECKF(__atomic_load_n(&x.gate.flipped, __ATOMIC_SEQ_CST) == flipped + 1,
		       "%s: no restore to corrupt", t[i].what);
		if (t[i].rejected) {
			/* Refused by row_loaded: recomputed, right tokens. */
			CHECK(st1.host_fetch_failed == st0.host_fetch_failed + 1);
			CHECK(c->out.reused_host_tokens == 0);
			et_same_as_ref(&x.lg, c, &ref);
		} else {
			CHECK(c->out.reused_host_tokens == n); /* the whole prompt came back */
			bool same =
				c->n == ref.n && !memcmp(c->tok, ref.tok, ref.n * sizeof *c->tok);
			CHECKF(!same,
			       "a flipped byte in %s (offset %llu) changed no token (%u and %u tokens)",
			       t[i].what, (unsigned long long)t[i].offset, c->n, ref.n);
		}
		printf("flip in %-18s offset %6llu: %s\n", t[i].what,
		       (unsigned long long)t[i].offset,
		       t[i].rejected ? "row refused, recomputed" : "tokens changed");
		et_call_free(c);
	}
	et_ref_free(&ref);
	free(p);
	eng_close(&x);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	test_conversations();
	test_sensitivity();
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
