/*
 * test_scheduler.c - the scheduler's admission, inbound tickets, steps,
 * captures, publication and deferral rules (design 2.7 and step 10, 2.2,
 * 2.12, 2.15 "Evictions").
 *
 * Every test runs through sched_sim.h, a simulated worker whose fake GPU
 * memory checks that each page and row an entry reads holds exactly the
 * prefix the request expects, and that publications name GPU-ready bytes.
 * hel_scheduler_check() runs after every step.
 *
 * Step 10's list: inbound requests are never scheduled; success attaches
 * the right page chain, snapshot, consumed count and the Restore phase; a
 * full-prompt hit resumes; an existing checkpoint frees the ticket; failure
 * frees the ticket and reports waiters; two waiters share one ticket;
 * cancellation during inbound leaves the ticket's resources; free page and
 * row counts balance on every path; publications report the exact tail
 * pages and state slots.  Plus: chunked prefill with message and prompt
 * captures, GPU hits with Restore, deferral of a message less than a page
 * before its prompt checkpoint, of terminals until resumed, preemption
 * (its terminal counts as resumed), the message offered when the prompt
 * capture gets no row or the request is cancelled first, compaction
 * offering a deferred heir and refreshing descendants, bounded eviction
 * notices, no-capacity admission without side effects, pending ids across
 * a step in flight, describe/pin, and release after shutdown.
 */
#include "sched_sim.h"

static hel_scheduler_config cfg(uint32_t pages, uint32_t rows, uint32_t active, uint32_t inflight)
{
	hel_scheduler_config c = {.page_tokens = 64,
				  .n_pages = pages,
				  .n_rows = rows,
				  .max_active = active,
				  .chunk_tokens = 128,
				  .step_tokens = 1024,
				  .max_inflight = inflight};
	return c;
}

static sel_token *toks(uint64_t n, uint32_t base)
{
	sel_token *t = malloc(n * sizeof(sel_token));
	CHECK(t);
	for (uint64_t i = 0; i < n; i++)
		t[i] = base + (sel_token)i;
	return t;
}

static const hel_step *last_step(struct sim *m)
{
	CHECK(m->nq > 0);
	return &m->q[(m->qhead + m->nq - 1) % 8].st;
}

static void info(struct sim *m, hel_req_id id, hel_request_info *o)
{
	CHECK_OK(hel_scheduler_request_info(m->s, id, o));
}

static hel_scheduler_stats stats(struct sim *m)
{
	hel_scheduler_stats st;
	hel_scheduler_stats_get(m->s, &st);
	return st;
}

static const hel_ckpt *ck(struct sim *m, uint64_t id)
{
	const hel_ckpt *k = hel_cache_get(m->c, id);
	CHECK(k);
	return k;
}

static const hel_ckpt *ck_at(struct sim *m, const sel_token *t, uint64_t c)
{
	sel_key key;
	sel_key_direct(sim_model_id, NULL, 0, t, c, &key);
	return hel_cache_find(m->c, &key);
}

/* ---- prefill, captures, publications, GPU hits, terminal deferral ---------- */

static void test_prefill_captures_and_hits(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(64, 16, 4, 1);
	sim_init(&m, &c, test_seed());
	sel_token *T = toks(400, 1000);
	uint64_t ends[] = {100};
	hel_request_spec sp = sim_spec(T, 200, ends, 1, 3);
	hel_admission adm;
	CHECK_OK(sim_admit(&m, &sp, SIM_NO_HOST, 0, &adm, NULL));
	CHECK(adm.phase == HEL_PHASE_PREFILL && adm.reused_tokens == 0 && !adm.fetch);
	hel_req_id a = adm.req;

	/* Chunk 1 stops at the message boundary and captures it. */
	CHECK(sim_step(&m) == 1);
	const hel_step *st = last_step(&m);
	CHECK(st->n == 1 && st->fence == 1);
	hel_step_entry e1 = st->entries[0];
	CHECK(e1.req == a && e1.kind == HEL_ENTRY_PREFILL && e1.begin == 0 && e1.end == 100);
	CHECK(e1.reset && !e1.sample && e1.n_pages == 1 && e1.capture_row != HEL_NONE);
	CHECK(ck(&m, e1.capture)->flags & HEL_CK_MESSAGE);
	CHECK(sim_take(&m) == 0); /* not ready before the fence */
	CHECK(sim_complete(&m));
	CHECK(sim_take(&m) == 1);
	sel_published p = m.last_pub[0];
	CHECK(p.checkpoint == e1.capture && p.key.consumed == 100 && sel_key_is_none(&p.parent));
	CHECK(p.n_pages == 1 && p.tail == 1 && p.pages[0] == e1.pages[0]);
	CHECK(p.state_slot == e1.capture_row);

	/* Chunk 2 runs to the prompt end, samples, captures the prompt. */
	CHECK(sim_step(&m) == 1);
	st = last_step(&m);
	hel_step_entry e2 = st->entries[0];
	CHECK(e2.begin == 100 && e2.end == 200 && e2.sample && !e2.reset && e2.n_pages == 3);
	CHECK(e2.first_new_page == 1 && e2.pages[0] == e1.pages[0]);
	CHECK(ck(&m, e2.capture)->flags & HEL_CK_PROMPT);
	hel_request_info in;
	info(&m, a, &in);
	CHECK(in.prefix == e2.capture && in.n_shared == 3 && in.n_pages == 3);
	CHECK(ck(&m, e1.capture)->pins == 0 && ck(&m, e2.capture)->pins == 1);
	CHECK(sim_complete(&m));
	CHECK(sim_take(&m) == 1);
	p = m.last_pub[0];
	CHECK(p.checkpoint == e2.capture && p.key.consumed == 200);
	CHECK(sel_key_eq(&p.parent, &ck(&m, e1.capture)->key));
	CHECK(p.n_pages == 3 && p.tail == 2 && p.state_slot == e2.capture_row);
	for (int j = 0; j < 3; j++)
		CHECK(p.pages[j] == e2.pages[j]);
	info(&m, a, &in);
	CHECK(in.phase == HEL_PHASE_DECODE && in.generated == 1);

	/* Two decode tokens; max_tokens 3 finishes with a deferred terminal. */
	CHECK(sim_step(&m) == 1);
	st = last_step(&m);
	CHECK(st->entries[0].kind == HEL_ENTRY_DECODE && st->entries[0].begin == 200);
	sim_drain(&m, 10);
	CHECK(m.finished == 1);
	CHECK(sim_take(&m) == 0);
	const hel_ckpt *term = ck_at(&m, sim_rec_find(&m.reqs, a)->t, 202);
	CHECK(term && (term->flags & HEL_CK_TERMINAL) && (term->flags & HEL_CK_DEFERRED));
	CHECK(term->parent_id == e2.capture && term->n_tail == 0 && term->pins == 0);
	hel_cache_counts k;
	sim_counts(&m, &k);
	CHECK(k.pages_out == 0 && k.rows_out == 0 && k.pages_ckpt == 3 && k.rows_ckpt == 3);
	hel_scheduler_stats s = stats(&m);
	CHECK(s.prefill_tokens == 200 && s.captures == 2 && s.decode_tokens == 2 &&
	      s.terminals == 1);
	CHECK(s.finished == 1 && s.active == 0);

	/* A GPU hit at the prompt checkpoint: Restore, then the new tokens. */
	hel_request_spec sp2 = sim_spec(T, 250, NULL, 0, 2);
	CHECK_OK(sim_admit(&m, &sp2, SIM_NO_HOST, 0, &adm, NULL));
	CHECK(adm.phase == HEL_PHASE_RESTORE && adm.reused_tokens == 200);
	info(&m, adm.req, &in);
	CHECK(in.prefix == e2.capture && in.n_pages == 3 && in.consumed == 200);
	CHECK(sim_step(&m) == 1);
	st = last_step(&m);
	CHECK(st->entries[0].kind == HEL_ENTRY_RESTORE &&
	      st->entries[0].restore_src == e2.capture_row);
	CHECK(st->entries[0].restore_consumed == 200 && !st->entries[0].sample);
	sim_complete(&m);
	CHECK(sim_step(&m) == 1);
	CHECK(last_step(&m)->entries[0].begin == 200 && last_step(&m)->entries[0].end == 250);
	sim_drain(&m, 10);

	/* A full-prompt GPU hit samples straight from the restored row. */
	hel_request_spec sp3 = sim_spec(T, 200, NULL, 0, 2);
	CHECK_OK(sim_admit(&m, &sp3, SIM_NO_HOST, 0, &adm, NULL));
	CHECK(adm.phase == HEL_PHASE_RESTORE && adm.reused_tokens == 200);
	CHECK(sim_step(&m) == 1);
	CHECK(last_step(&m)->entries[0].kind == HEL_ENTRY_RESTORE &&
	      last_step(&m)->entries[0].sample);
	sim_complete(&m);
	info(&m, adm.req, &in);
	CHECK(in.phase == HEL_PHASE_DECODE && in.generated == 1 && in.consumed == 200);
	sim_drain(&m, 10);
	s = stats(&m);
	CHECK(s.gpu_hits == 2 && s.gpu_reused_tokens == 400 && s.restores == 2);

	CHECK(sim_take(&m) == 1 && m.last_pub[0].key.consumed == 250); /* terminals wait */
	/* Resuming at exactly the deferred terminal offers it. */
	const struct sim_rec *ra = sim_rec_find(&m.reqs, a);
	CHECK(ra->n == 203);
	sel_token cont[260];
	memcpy(cont, ra->t, 202 * sizeof(sel_token));
	for (int i = 202; i < 260; i++)
		cont[i] = 7;
	hel_request_spec sp4 = sim_spec(cont, 260, NULL, 0, 1);
	uint64_t tid = term->id;
	CHECK_OK(sim_admit(&m, &sp4, SIM_NO_HOST, 0, &adm, NULL));
	CHECK(adm.reused_tokens == 202);
	CHECK(sim_take(&m) == 1);
	p = m.last_pub[0];
	CHECK(p.checkpoint == tid && sel_key_eq(&p.parent, &ck(&m, e2.capture)->key));
	CHECK(p.tail == 0 && p.n_pages == 3);
	sim_drain(&m, 10);
	sim_release_all(&m);
	free(T);
	sim_free(&m);
}

/* ---- deferral of a message just before its prompt checkpoint ------------------ */

static void test_message_deferral(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(64, 16, 4, 1);
	sim_init(&m, &c, test_seed() + 1);
	sel_token *T = toks(300, 5000);
	uint64_t ends[] = {100};
	hel_request_spec sp = sim_spec(T, 150, ends, 1, 1);
	hel_admission adm;
	CHECK_OK(sim_admit(&m, &sp, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);
	const hel_ckpt *M = ck_at(&m, T, 100), *Pc = ck_at(&m, T, 150);
	CHECK(M && Pc && Pc->parent == M);
	CHECK((M->flags & HEL_CK_DEFERRED) && !(M->flags & HEL_CK_OFFERED));
	/* The prompt checkpoint's parent is the nearest offered ancestor:
	 * none, so it carries its whole chain. */
	CHECK(sim_take(&m) == 1);
	CHECK(m.last_pub[0].checkpoint == Pc->id && sel_key_is_none(&m.last_pub[0].parent));
	CHECK(m.last_pub[0].tail == 2 && m.last_pub[0].n_pages == 2);
	uint64_t mid = M->id;

	/* A request resuming at exactly M offers it. */
	sel_token U[160];
	memcpy(U, T, 100 * sizeof(sel_token));
	for (int i = 100; i < 160; i++)
		U[i] = 99;
	hel_request_spec sp2 = sim_spec(U, 160, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &sp2, SIM_NO_HOST, 0, &adm, NULL));
	CHECK(adm.reused_tokens == 100);
	CHECK(sim_take(&m) == 1);
	CHECK(m.last_pub[0].checkpoint == mid && sel_key_is_none(&m.last_pub[0].parent));
	CHECK(m.last_pub[0].tail == 1 && m.last_pub[0].n_pages == 1);
	sim_drain(&m, 10);
	CHECK(sim_take(&m) == 1 && sel_key_eq(&m.last_pub[0].parent, &ck(&m, mid)->key));

	/* Not deferred: a full page before the prompt end, or another
	 * message between. */
	sel_token *V = toks(300, 9000);
	uint64_t ends2[] = {30, 100};
	hel_request_spec sp3 = sim_spec(V, 164, ends2, 2, 1);
	CHECK_OK(sim_admit(&m, &sp3, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);
	CHECK(!(ck_at(&m, V, 30)->flags & HEL_CK_DEFERRED));
	CHECK(!(ck_at(&m, V, 100)->flags & HEL_CK_DEFERRED)); /* 164 - 100 = 64 */
	CHECK(sim_take(&m) == 3);
	sim_release_all(&m);
	free(T);
	free(V);
	sim_free(&m);
}

/* ---- the prompt capture gets no row: the message is offered while pinned ---- */

static void test_prompt_capture_without_row(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(32, 4, 2, 1);
	sim_init(&m, &c, test_seed() + 2);
	sel_token *X = toks(100, 100), *T = toks(200, 7000);
	hel_request_spec spx = sim_spec(X, 70, NULL, 0, 2);
	hel_admission adm;
	CHECK_OK(sim_admit(&m, &spx, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);
	CHECK(sim_take(&m) == 1);
	hel_cache_counts k;
	sim_counts(&m, &k);
	CHECK(k.rows_ckpt == 2 && k.rows_free == 2);
	/* R needs 3 rows: 2 free + 2 reclaimable. */
	uint64_t ends[] = {100};
	hel_request_spec sp = sim_spec(T, 150, ends, 1, 2);
	CHECK_OK(sim_admit(&m, &sp, SIM_NO_HOST, 0, &adm, NULL));
	hel_req_id r = adm.req;
	/* Copy-outs pin X's checkpoints after R was admitted. */
	size_t cur = 0;
	uint64_t pinned[2];
	int np = 0;
	for (const hel_ckpt *x; (x = hel_cache_iter(m.c, &cur));)
		pinned[np++] = x->id;
	CHECK(np == 2);
	CHECK_OK(hel_scheduler_pin(m.s, pinned[0]));
	CHECK_OK(hel_scheduler_pin(m.s, pinned[1]));
	sim_check_ok(m.s);
	CHECK(sim_step(&m) && sim_complete(&m));
	const hel_ckpt *M = ck_at(&m, T, 100);
	CHECK(M && (M->flags & HEL_CK_DEFERRED));
	CHECK(sim_take(&m) == 0);
	CHECK(sim_step(&m) && sim_complete(&m));
	CHECK(ck_at(&m, T, 150) == NULL && stats(&m).captures_failed == 1);
	hel_request_info in;
	info(&m, r, &in);
	CHECK(in.prefix == M->id && M->pins == 1);
	CHECK(sim_take(&m) == 1 && m.last_pub[0].checkpoint == M->id);
	CHECK_OK(hel_scheduler_unpin(m.s, pinned[0]));
	CHECK_OK(hel_scheduler_unpin(m.s, pinned[1]));
	CHECK(hel_scheduler_unpin(m.s, pinned[1]) == -EINVAL);
	sim_drain(&m, 10);
	sim_release_all(&m);
	free(X);
	free(T);
	sim_free(&m);
}

/* ---- capture rows are taken when the capture happens, not reserved ---------- */

/* Copy-outs pin a finished request's two checkpoints (its prompt and its
 * terminal), as the engine's pins outlive the request that made them.
 * Two prompts with a message end each follow: reserving a row per capture
 * point at admission (3 rows each) refused the second one outright, with
 * 4 rows left.  Lazily, both are admitted on their live rows, their
 * message captures take the 2 rows left, and their prompt captures, which
 * find none free or reclaimable, are skipped: every entry still reads
 * exactly its own prefix (the simulated GPU checks each page and row),
 * both finish with terminals of their whole history, and every id comes
 * back once the pins go. */
static void test_lazy_capture_rows(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(64, 6, 2, 1);
	sim_init(&m, &c, test_seed() + 30);
	sel_token *X = toks(100, 100), *T = toks(300, 7000), *U = toks(300, 40000);
	hel_request_spec spx = sim_spec(X, 70, NULL, 0, 2);
	hel_admission adm;
	CHECK_OK(sim_admit(&m, &spx, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);
	sim_take(&m);
	size_t cur = 0;
	uint64_t pinned[2];
	int np = 0;
	for (const hel_ckpt *x; (x = hel_cache_iter(m.c, &cur));) {
		CHECK(np < 2);
		pinned[np++] = x->id;
	}
	CHECK(np == 2);
	CHECK_OK(hel_scheduler_pin(m.s, pinned[0]));
	CHECK_OK(hel_scheduler_pin(m.s, pinned[1]));
	hel_cache_counts k;
	sim_counts(&m, &k);
	CHECK(k.rows_free == 4 && k.rows_ckpt == 2);

	uint64_t ends[] = {100};
	hel_request_spec sa = sim_spec(T, 200, ends, 1, 3), sb = sim_spec(U, 200, ends, 1, 3);
	hel_admission aa, ab;
	CHECK_OK(sim_admit(&m, &sa, SIM_NO_HOST, 0, &aa, NULL));
	CHECK_OK(sim_admit(&m, &sb, SIM_NO_HOST, 0, &ab, NULL)); /* eager: -EAGAIN */
	sim_check_ok(m.s);
	hel_scheduler_stats s0 = stats(&m);

	/* Both message captures get a row: the last two. */
	CHECK(sim_step(&m) == 1);
	const hel_step *st = last_step(&m);
	CHECK(st->n == 2);
	for (size_t i = 0; i < 2; i++)
		CHECK(st->entries[i].end == 100 && st->entries[i].capture_row != HEL_NONE);
	CHECK(sim_complete(&m));
	sim_counts(&m, &k);
	CHECK(k.rows_free == 0 && k.rows_pending == 0);
	const hel_ckpt *ma = ck_at(&m, T, 100), *mb = ck_at(&m, U, 100);
	CHECK(ma && mb);
	uint64_t ma_id = ma->id, mb_id = mb->id;

	/* The prompt captures find no row: skipped, not waited for. */
	CHECK(sim_step(&m) == 1);
	st = last_step(&m);
	CHECK(st->n == 2);
	for (size_t i = 0; i < 2; i++)
		CHECK(st->entries[i].end == 200 && st->entries[i].sample &&
		      st->entries[i].capture_row == HEL_NONE &&
		      st->entries[i].capture == HEL_CKPT_NONE);
	CHECK(stats(&m).captures_failed == s0.captures_failed + 2);
	CHECK(ck_at(&m, T, 200) == NULL && ck_at(&m, U, 200) == NULL);
	hel_request_info in;
	info(&m, aa.req, &in);
	CHECK(in.prefix == ma_id && in.n_shared == 1 && in.n_pages == 3);
	info(&m, ab.req, &in);
	CHECK(in.prefix == mb_id && in.n_shared == 1 && in.n_pages == 3);
	sim_check_ok(m.s);

	/* Both decode to the end on their live rows, which become terminals. */
	sim_drain(&m, 20);
	CHECK(stats(&m).finished == s0.finished + 2);
	int terms = 0;
	cur = 0;
	for (const hel_ckpt *x; (x = hel_cache_iter(m.c, &cur));)
		if ((x->flags & HEL_CK_TERMINAL) && x->key.consumed == 202 && x->parent &&
		    (x->parent->id == ma_id || x->parent->id == mb_id))
			terms++;
	CHECK(terms == 2);
	sim_take(&m);
	CHECK_OK(hel_scheduler_unpin(m.s, pinned[0]));
	CHECK_OK(hel_scheduler_unpin(m.s, pinned[1]));
	sim_check_ok(m.s);

	/* With the rows back, the same prompt resumes from its terminal's
	 * chain and captures again. */
	hel_request_spec sc = sim_spec(T, 260, ends, 1, 2);
	CHECK_OK(sim_admit(&m, &sc, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 20);
	CHECK(ck_at(&m, T, 260) != NULL);
	sim_take(&m);
	sim_release_all(&m);
	free(X);
	free(T);
	free(U);
	sim_free(&m);
}

/* ---- cancelled before the prompt capture: offered at retirement -------------- */

static void test_cancel_offers_message(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(32, 8, 2, 1);
	sim_init(&m, &c, test_seed() + 3);
	sel_token *T = toks(200, 300);
	uint64_t ends[] = {100};
	hel_request_spec sp = sim_spec(T, 150, ends, 1, 2);
	hel_admission adm;
	CHECK_OK(sim_admit(&m, &sp, SIM_NO_HOST, 0, &adm, NULL));
	CHECK(sim_step(&m) && sim_complete(&m));
	CHECK(sim_take(&m) == 0);
	CHECK_OK(hel_scheduler_cancel(m.s, adm.req));
	CHECK(hel_scheduler_cancel(m.s, adm.req) == -ENOENT);
	sim_check_ok(m.s);
	CHECK(sim_take(&m) == 1 && m.last_pub[0].key.consumed == 100);
	CHECK(ck_at(&m, T, 100)->pins == 0);
	sim_release_all(&m);
	free(T);
	sim_free(&m);
}

/* ---- preemption: its terminal counts as resumed --------------------------------- */

/* Two 120-token prompts, 80 tokens each, on 4 pages: A admitted, then B. */
static void two_decoders(struct sim *m, uint64_t seed, sel_token **A, sel_token **B,
			 hel_admission *aa, hel_admission *ab)
{
	hel_scheduler_config c = cfg(4, 16, 4, 1);
	sim_init(m, &c, seed);
	*A = toks(120, 10);
	*B = toks(120, 20000);
	hel_request_spec spa = sim_spec(*A, 120, NULL, 0, 80), spb = sim_spec(*B, 120, NULL, 0, 80);
	CHECK_OK(sim_admit(m, &spa, SIM_NO_HOST, 0, aa, NULL));
	CHECK_OK(sim_admit(m, &spb, SIM_NO_HOST, 0, ab, NULL));
}

static void test_preemption(void)
{
	struct sim m;
	sel_token *A, *B;
	hel_admission aa, ab;
	two_decoders(&m, test_seed() + 4, &A, &B, &aa, &ab);
	CHECK(sim_take(&m) == 0);
	/* Both prefill, then decode in lockstep until position 191 needs a
	 * third page each. */
	for (int i = 0; i < 80 && !stats(&m).preempted; i++) {
		CHECK(sim_step(&m));
		CHECK(sim_complete(&m));
	}
	hel_scheduler_stats s = stats(&m);
	CHECK(s.preempted == 1 && s.waiting == 1);
	hel_request_info in;
	info(&m, ab.req, &in);
	CHECK(in.phase == HEL_PHASE_WAITING && in.live_row == HEL_NONE && in.n_pages == 0);
	CHECK(in.generated == 72); /* 191 = 120 + 72 - 1 */
	/* Its terminal was offered at once (it counts as resumed), then
	 * evicted to give the page to A: the notice proves the offer. */
	hel_notice nt[8];
	bool lost;
	size_t nn = hel_scheduler_take_evictions(m.s, nt, 8, &lost);
	CHECK(nn == 1 && !lost && nt[0].key.consumed == 191 && sel_key_is_none(&nt[0].heir));
	CHECK(s.evictions == 1);
	sim_drain(&m, 400);
	s = stats(&m);
	CHECK(s.finished == 2 && s.readmitted == 1 && s.waiting == 0);
	CHECK(sim_rec_find(&m.reqs, ab.req)->n == 200 && sim_rec_find(&m.reqs, aa.req)->n == 200);
	sim_take(&m);
	sim_release_all(&m);
	free(A);
	free(B);
	sim_free(&m);
}

/* ---- a floor: a preempted request held below it --------------------------------- */

/* The preemption above with B's floor at 150: once its terminal at 191 is
 * evicted, re-admission finds nothing at or past 150 and holds B (no
 * re-admission, no block on new admissions: C is admitted) until the
 * floor is set again; then B resumes and ends as before. */
static void test_floor_hold(void)
{
	struct sim m;
	sel_token *A, *B;
	hel_admission aa, ab;
	two_decoders(&m, test_seed() + 14, &A, &B, &aa, &ab);
	CHECK_OK(hel_scheduler_set_floor(m.s, ab.req, 150));
	CHECK(hel_scheduler_set_floor(m.s, 999999, 1) == -ENOENT);
	for (int i = 0; i < 80 && !stats(&m).preempted; i++) {
		CHECK(sim_step(&m));
		CHECK(sim_complete(&m));
	}
	CHECK(stats(&m).preempted == 1);
	hel_request_info in;
	/* A runs to its end; B stays held however much capacity comes back. */
	for (int i = 0; i < 200 && stats(&m).finished < 1; i++) {
		if (sim_step(&m))
			CHECK(sim_complete(&m));
	}
	hel_scheduler_stats s = stats(&m);
	CHECK(s.finished == 1 && s.readmitted == 0 && s.waiting == 1);
	info(&m, ab.req, &in);
	CHECKF(in.phase == HEL_PHASE_WAITING && in.held && in.held_depth < 150,
	       "phase %s held %d depth %llu", hel_phase_name(in.phase), in.held,
	       (unsigned long long)in.held_depth);
	CHECK(sim_step(&m) == 0); /* nothing runs: B is held */
	/* A held request does not keep new ones out. */
	sel_token *C = toks(30, 30000);
	hel_request_spec spc = sim_spec(C, 30, NULL, 0, 4);
	hel_admission ac;
	CHECK_OK(sim_admit(&m, &spc, SIM_NO_HOST, 0, &ac, NULL));
	/* Released: re-admitted from what it found, it ends with 200 tokens. */
	CHECK_OK(hel_scheduler_set_floor(m.s, ab.req, in.held_depth));
	sim_drain(&m, 400);
	s = stats(&m);
	CHECK(s.finished == 3 && s.readmitted == 1 && s.waiting == 0);
	CHECK(sim_rec_find(&m.reqs, ab.req)->n == 200 && sim_rec_find(&m.reqs, aa.req)->n == 200);
	sim_take(&m);
	sim_release_all(&m);
	free(A);
	free(B);
	free(C);
	sim_free(&m);
}

/* ---- inbound (design 2.7; step 10) -------------------------------------------------- */

static void test_inbound(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(64, 24, 8, 1);
	sim_init(&m, &c, test_seed() + 5);
	sel_token *T = toks(400, 40000);
	hel_cache_counts k0, k1;
	hel_admission adm, adm2;
	hel_request_info in;
	sel_hit hit;
	const hel_req_id *failed;
	size_t nfailed;

	/* GPU ancestor A at 100. */
	hel_request_spec spz = sim_spec(T, 100, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &spz, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);
	const hel_ckpt *A = ck_at(&m, T, 100);
	CHECK(A && sim_take(&m) == 1);
	uint64_t aid = A->id;

	/* A host hit at 256 over A: 4 - 1 = 3 pages. */
	sim_counts(&m, &k0);
	hel_request_spec sp1 = sim_spec(T, 300, NULL, 0, 2);
	CHECK_OK(sim_admit(&m, &sp1, SIM_HOST_AT, 256, &adm, &hit));
	hel_req_id r1 = adm.req;
	CHECK(adm.fetch && adm.inbound.n_pages == 3 && adm.reused_tokens == 256);
	uint32_t tpages[3] = {adm.inbound.pages[0], adm.inbound.pages[1], adm.inbound.pages[2]};
	uint32_t trow = adm.inbound.state_slot;
	info(&m, r1, &in);
	CHECK(in.phase == HEL_PHASE_INBOUND && in.consumed == 256 && in.reused_tokens == 256);
	CHECK(in.prefix == HEL_CKPT_NONE && in.n_pages == 0 && in.ticket == adm.inbound.ticket);
	CHECK(ck(&m, aid)->pins == 1);
	sim_counts(&m, &k1);
	CHECK(k1.pages_out == k0.pages_out + 3 && k1.rows_out == k0.rows_out + 2);
	hel_scheduler_stats s = stats(&m);
	CHECK(s.host_hits == 1 && s.host_reused_tokens == 156 && s.inbound_waiting == 1);
	CHECK(s.host_lookups == 1 && s.tickets == 1);
	/* Inbound requests are never scheduled. */
	CHECK(sim_step(&m) == 0);
	/* Success: chain = A's pages + the ticket pages, Restore. */
	CHECK_OK(hel_scheduler_finish_inbound(m.s, &hit.key, 0, &failed, &nfailed));
	CHECK(nfailed == 0);
	sim_check_ok(m.s);
	info(&m, r1, &in);
	CHECK(in.phase == HEL_PHASE_RESTORE && in.consumed == 256 && in.n_pages == 4 &&
	      in.n_shared == 4);
	CHECK(in.pages[0] == ck(&m, aid)->tail[0]);
	for (int j = 0; j < 3; j++)
		CHECK(in.pages[1 + j] == tpages[j]);
	const hel_ckpt *N = ck(&m, in.prefix);
	CHECK(N->parent_id == aid && N->row == trow && N->pins == 1 && hel_cache_ready(m.c, N));
	CHECK((N->flags & HEL_CK_RESTORED) && (N->flags & HEL_CK_OFFERED));
	CHECK(ck(&m, aid)->pins == 0);
	CHECK(stats(&m).inbound_waiting == 0 && stats(&m).tickets == 0);
	CHECK(hel_scheduler_finish_inbound(m.s, &hit.key, 0, NULL, NULL) == -ENOENT);
	CHECK(sim_step(&m) == 1);
	const hel_step_entry *e = &last_step(&m)->entries[0];
	CHECK(e->kind == HEL_ENTRY_RESTORE && e->restore_src == trow && e->restore_consumed == 256);
	sim_drain(&m, 10);
	/* The prompt capture names the restored checkpoint as its parent; the
	 * restored one is not offered back. */
	CHECK(sim_take(&m) == 1);
	CHECK(m.last_pub[0].key.consumed == 300 && sel_key_eq(&m.last_pub[0].parent, &N->key));
	CHECK(m.last_pub[0].tail == 0 && m.last_pub[0].n_pages == 4);

	/* A full-prompt host hit (no GPU ancestor) resumes by sampling. */
	sel_token *U = toks(200, 60000);
	hel_request_spec sp2 = sim_spec(U, 200, NULL, 0, 2);
	CHECK_OK(sim_admit(&m, &sp2, SIM_HOST_AT, 200, &adm, &hit));
	CHECK(adm.fetch && adm.inbound.n_pages == 3);
	CHECK_OK(hel_scheduler_finish_inbound(m.s, &hit.key, 0, NULL, NULL));
	CHECK(sim_step(&m) == 1);
	e = &last_step(&m)->entries[0];
	CHECK(e->kind == HEL_ENTRY_RESTORE && e->sample && e->restore_consumed == 200);
	sim_complete(&m);
	info(&m, adm.req, &in);
	CHECK(in.phase == HEL_PHASE_DECODE && in.generated == 1);
	sim_drain(&m, 10);

	/* The key gets cached meanwhile: the ticket's ids go straight back. */
	sel_token *V = toks(200, 70000);
	hel_request_spec sp3 = sim_spec(V, 180, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &sp3, SIM_HOST_AT, 128, &adm, &hit));
	hel_req_id r3 = adm.req;
	uint32_t t3p[2] = {adm.inbound.pages[0], adm.inbound.pages[1]},
		 t3r = adm.inbound.state_slot;
	hel_request_spec sp4 = sim_spec(V, 128, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &sp4, SIM_NO_HOST, 0, &adm2, NULL));
	sim_drain(&m, 10);
	const hel_ckpt *E = ck_at(&m, V, 128);
	CHECK(E);
	sim_counts(&m, &k0);
	CHECK_OK(hel_scheduler_finish_inbound(m.s, &hit.key, 0, NULL, NULL));
	sim_check_ok(m.s);
	sim_counts(&m, &k1);
	CHECK(k1.pages_free == k0.pages_free + 2 && k1.rows_free == k0.rows_free + 1);
	CHECK(k1.checkpoints == k0.checkpoints);
	CHECK(hel_cache_page_state(m.c, t3p[0]) == HEL_ID_FREE &&
	      hel_cache_page_state(m.c, t3p[1]) == HEL_ID_FREE);
	CHECK(hel_cache_row_state(m.c, t3r) == HEL_ID_FREE);
	info(&m, r3, &in);
	CHECK(in.phase == HEL_PHASE_RESTORE && in.prefix == E->id && E->pins == 1 &&
	      in.n_pages == 2);
	CHECK(stats(&m).inbound_existing == 1);
	sim_drain(&m, 10);

	/* Failure: ids back, waiters reported and still inbound. */
	sel_token *W = toks(200, 80000);
	hel_request_spec sp5 = sim_spec(W, 150, NULL, 0, 1);
	sim_counts(&m, &k0);
	CHECK_OK(sim_admit(&m, &sp5, SIM_HOST_AT, 128, &adm, &hit));
	hel_req_id r5 = adm.req;
	CHECK_OK(hel_scheduler_finish_inbound(m.s, &hit.key, -EIO, &failed, &nfailed));
	CHECK(nfailed == 1 && failed[0] == r5);
	sim_check_ok(m.s);
	info(&m, r5, &in);
	CHECK(in.phase == HEL_PHASE_INBOUND && in.ticket == 0);
	CHECK(sim_step(&m) == 0);
	CHECK_OK(hel_scheduler_cancel(m.s, r5));
	sim_check_ok(m.s);
	sim_counts(&m, &k1);
	CHECK(k1.pages_free == k0.pages_free && k1.rows_free == k0.rows_free && k1.pages_out == 0);
	CHECK(stats(&m).inbound_failed == 1);
	/* Re-admitted without the store it prefills from scratch. */
	CHECK_OK(sim_admit(&m, &sp5, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);

	/* Two waiters share one ticket; a cancelled one leaves it intact. */
	sel_token *X = toks(300, 90000);
	hel_request_spec sp6 = sim_spec(X, 200, NULL, 0, 2), sp7 = sim_spec(X, 260, NULL, 0, 2),
			 sp8 = sim_spec(X, 140, NULL, 0, 2);
	sim_counts(&m, &k0);
	hel_admission a6, a7, a8;
	CHECK_OK(sim_admit(&m, &sp6, SIM_HOST_AT, 128, &a6, &hit));
	CHECK_OK(sim_admit(&m, &sp7, SIM_HOST_AT, 128, &a7, NULL));
	CHECK_OK(sim_admit(&m, &sp8, SIM_HOST_AT, 128, &a8, NULL));
	CHECK(a6.fetch && !a7.fetch && !a8.fetch);
	CHECK(a7.inbound.ticket == a6.inbound.ticket && a7.inbound.pages == a6.inbound.pages);
	sim_counts(&m, &k1);
	CHECK(k1.pages_out == k0.pages_out + 2 && k1.rows_out == k0.rows_out + 4);
	CHECK(stats(&m).inbound_waiting == 3 && stats(&m).tickets == 1);
	uint32_t t6p0 = a6.inbound.pages[0]; /* valid until finish_inbound */
	CHECK_OK(hel_scheduler_cancel(m.s, a8.req));
	sim_check_ok(m.s);
	sim_counts(&m, &k1);
	CHECK(k1.pages_out == k0.pages_out + 2 && k1.rows_out == k0.rows_out + 3);
	CHECK(stats(&m).inbound_waiting == 2);
	CHECK_OK(hel_scheduler_finish_inbound(m.s, &hit.key, 0, NULL, NULL));
	sim_check_ok(m.s);
	hel_request_info i6, i7;
	info(&m, a6.req, &i6);
	info(&m, a7.req, &i7);
	CHECK(i6.phase == HEL_PHASE_RESTORE && i7.phase == HEL_PHASE_RESTORE &&
	      i6.prefix == i7.prefix);
	CHECK(ck(&m, i6.prefix)->pins == 2 && i6.n_pages == 2 && i6.pages[0] == t6p0);
	sim_drain(&m, 20);

	/* Every waiter cancelled: the ticket still completes into a checkpoint. */
	sel_token *Y = toks(300, 100000);
	hel_request_spec sp9 = sim_spec(Y, 150, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &sp9, SIM_HOST_AT, 128, &adm, &hit));
	CHECK_OK(hel_scheduler_cancel(m.s, adm.req));
	sim_counts(&m, &k0);
	CHECK(k0.pages_out == 2 && k0.rows_out == 1 && stats(&m).tickets == 1);
	CHECK_OK(hel_scheduler_finish_inbound(m.s, &hit.key, 0, NULL, NULL));
	sim_check_ok(m.s);
	const hel_ckpt *Z = ck_at(&m, Y, 128);
	CHECK(Z && Z->pins == 0 && Z->n_tail == 2);
	sim_counts(&m, &k1);
	CHECK(k1.pages_out == 0 && k1.rows_out == 0);

	/* Tickets and requests outstanding at shutdown: everything returns. */
	CHECK_OK(sim_admit(&m, &sp9, SIM_NO_HOST, 0, &adm, NULL));
	sel_token *Q = toks(300, 110000);
	hel_request_spec sp10 = sim_spec(Q, 250, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &sp10, SIM_HOST_AT, 192, &adm, &hit));
	CHECK(sim_step(&m) == 1);
	sim_release_all(&m);
	CHECK(stats(&m).tickets == 0 && stats(&m).active == 0);
	free(T);
	free(U);
	free(V);
	free(W);
	free(X);
	free(Y);
	free(Q);
	sim_free(&m);
}

/* ---- compaction offers a deferred heir and refreshes descendants ----------------- */

static void test_compaction_heir(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(32, 16, 2, 1);
	sim_init(&m, &c, test_seed() + 6);
	sel_token *T = toks(200, 3000);
	uint64_t ends[] = {30, 100};
	hel_request_spec sp = sim_spec(T, 150, ends, 2, 2);
	hel_admission adm;
	CHECK_OK(sim_admit(&m, &sp, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);
	const hel_ckpt *X = ck_at(&m, T, 30), *M = ck_at(&m, T, 100), *Pc = ck_at(&m, T, 150);
	CHECK(X && M && Pc && M->parent == X && Pc->parent == M && Pc->children == 1);
	const hel_ckpt *Tm = Pc->first_child;
	CHECK(Tm->flags & HEL_CK_TERMINAL);
	CHECK(!(X->flags & HEL_CK_DEFERRED) && (M->flags & HEL_CK_DEFERRED));
	CHECK(sim_take(&m) == 2); /* X, then Pc with parent X */
	CHECK(m.last_pub[0].checkpoint == X->id && m.last_pub[1].checkpoint == Pc->id);
	CHECK(sel_key_eq(&m.last_pub[1].parent, &X->key) && m.last_pub[1].tail == 2);
	/* Pin everything but X: compaction must take X, heir M. */
	CHECK_OK(hel_scheduler_pin(m.s, Tm->id));
	CHECK_OK(hel_scheduler_pin(m.s, Pc->id));
	CHECK_OK(hel_scheduler_pin(m.s, M->id));
	CHECK(hel_scheduler_evict(m.s, 1) == 1);
	sim_check_ok(m.s);
	CHECK(!hel_ckpt_has_row(X) && (M->flags & HEL_CK_OFFERED) && !(M->flags & HEL_CK_DEFERRED));
	hel_notice nt[4];
	CHECK(hel_scheduler_take_evictions(m.s, nt, 4, NULL) == 1);
	CHECK(sel_key_eq(&nt[0].key, &X->key) && sel_key_eq(&nt[0].heir, &M->key));
	CHECK(sim_take(&m) == 2);
	CHECK(m.last_pub[0].checkpoint == M->id && sel_key_eq(&m.last_pub[0].parent, &X->key));
	CHECK(m.last_pub[0].tail == 1 && m.last_pub[0].n_pages == 1);
	CHECK(m.last_pub[1].checkpoint == Pc->id && sel_key_eq(&m.last_pub[1].parent, &M->key));
	CHECK(m.last_pub[1].tail == 1 && m.last_pub[1].n_pages == 2);
	hel_scheduler_stats s = stats(&m);
	CHECK(s.compactions == 1 && s.refreshed == 1);
	CHECK(hel_scheduler_evict(m.s, 5) == 0);
	/* describe: the same description again; not for page-only X */
	sel_published d;
	CHECK_OK(hel_scheduler_describe(m.s, Pc->id, &d));
	CHECK(d.n_pages == 2 && d.tail == 1 && d.state_slot == Pc->row &&
	      sel_key_eq(&d.parent, &M->key));
	CHECK(hel_scheduler_describe(m.s, X->id, &d) == -ENOENT);
	CHECK(hel_scheduler_describe(m.s, Tm->id, &d) == -ENOENT); /* deferred: never offered */
	CHECK(hel_scheduler_pin(m.s, X->id) == -EINVAL);
	CHECK(hel_scheduler_pin(m.s, 99999) == -ENOENT);
	CHECK_OK(hel_scheduler_unpin(m.s, Tm->id));
	CHECK_OK(hel_scheduler_unpin(m.s, Pc->id));
	CHECK_OK(hel_scheduler_unpin(m.s, M->id));
	/* Everything evicts now; the terminal was never offered: no notice. */
	CHECK(hel_scheduler_evict(m.s, 100) >= 1);
	sim_check_ok(m.s);
	size_t nn = hel_scheduler_take_evictions(m.s, nt, 4, NULL);
	for (size_t i = 0; i < nn; i++)
		CHECK(nt[i].key.consumed != 151);
	sim_release_all(&m);
	free(T);
	sim_free(&m);
}

/* ---- bounded notices --------------------------------------------------------------- */

static void test_notice_bound(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(32, 16, 4, 1);
	c.notice_cap = 2;
	sim_init(&m, &c, test_seed() + 7);
	hel_admission adm;
	sel_token *T[3];
	for (int i = 0; i < 3; i++) {
		T[i] = toks(70, 1000000u * (uint32_t)(i + 1));
		hel_request_spec sp = sim_spec(T[i], 70, NULL, 0, 1);
		CHECK_OK(sim_admit(&m, &sp, SIM_NO_HOST, 0, &adm, NULL));
	}
	sim_drain(&m, 10);
	CHECK(sim_take(&m) == 3);
	CHECK(stats(&m).terminals == 0); /* the terminal is the prompt checkpoint */
	CHECK(hel_scheduler_evict(m.s, 10) == 3);
	hel_notice nt[4];
	bool lost;
	CHECK(hel_scheduler_take_evictions(m.s, nt, 4, &lost) == 2 && lost);
	CHECK(hel_scheduler_take_evictions(m.s, nt, 4, &lost) == 0 && !lost);
	sim_release_all(&m);
	for (int i = 0; i < 3; i++)
		free(T[i]);
	sim_free(&m);
}

/* ---- admission without capacity, limits, and pending ids ------------------------- */

static void test_capacity_and_fences(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(8, 8, 2, 2);
	sim_init(&m, &c, test_seed() + 8);
	sel_token *T = toks(1000, 500), *U = toks(1000, 90000);
	hel_admission adm;
	hel_request_spec big = sim_spec(T, 1000, NULL, 0, 1);
	CHECK(sim_admit(&m, &big, SIM_NO_HOST, 0, &adm, NULL) == -E2BIG);
	hel_request_spec bad = sim_spec(T, 100, (uint64_t[]){50, 40}, 2, 1);
	CHECK(sim_admit(&m, &bad, SIM_NO_HOST, 0, &adm, NULL) == -EINVAL);
	bad.max_tokens = 0;
	CHECK(sim_admit(&m, &bad, SIM_NO_HOST, 0, &adm, NULL) == -EINVAL);

	hel_request_spec sa = sim_spec(T, 400, NULL, 0, 2), sb = sim_spec(U, 400, NULL, 0, 2);
	CHECK_OK(sim_admit(&m, &sa, SIM_NO_HOST, 0, &adm, NULL));
	hel_req_id ra = adm.req;
	hel_cache_counts k0, k1;
	sim_counts(&m, &k0);
	hel_scheduler_stats s0 = stats(&m);
	CHECK(sim_admit(&m, &sb, SIM_NO_HOST, 0, &adm, NULL) == -EAGAIN);
	CHECK(strstr(sel_errmsg(), "no capacity"));
	sim_check_ok(m.s);
	sim_counts(&m, &k1);
	CHECK(!memcmp(&k0, &k1, sizeof(k0)));
	CHECK(stats(&m).rejected_capacity == s0.rejected_capacity + 1 &&
	      stats(&m).admitted == s0.admitted);

	/* A step in flight: a cancelled request's pages wait for its fence. */
	CHECK(sim_step(&m) == 1);
	CHECK(sim_step(&m) == 0); /* the only request is in flight */
	const hel_step *st = last_step(&m);
	CHECK(st->entries[0].end == 128 && st->entries[0].n_pages == 2);
	CHECK_OK(hel_scheduler_cancel(m.s, ra));
	sim_check_ok(m.s);
	sim_counts(&m, &k1);
	CHECK(k1.pages_pending == 2 && k1.rows_pending == 1 && k1.pages_out == 0);
	while (sim_complete(&m))
		;
	sim_counts(&m, &k1);
	CHECK(k1.pages_pending == 0 && k1.rows_pending == 0 && k1.pages_free == 8 &&
	      k1.rows_free == 8);

	/* max_active */
	hel_request_spec s1 = sim_spec(T, 10, NULL, 0, 1), s2 = sim_spec(U, 10, NULL, 0, 1),
			 s3 = sim_spec(T + 20, 10, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &s1, SIM_NO_HOST, 0, &adm, NULL));
	CHECK_OK(sim_admit(&m, &s2, SIM_NO_HOST, 0, &adm, NULL));
	CHECK(sim_admit(&m, &s3, SIM_NO_HOST, 0, &adm, NULL) == -EAGAIN);
	sim_drain(&m, 10);
	CHECK_OK(sim_admit(&m, &s3, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 10);
	/* Stale plan: its GPU checkpoint was evicted meanwhile. */
	hel_admission_plan plan;
	CHECK_OK(hel_scheduler_plan_admission(m.s, &s3, &plan));
	CHECK(plan.gpu != HEL_CKPT_NONE);
	hel_scheduler_evict(m.s, 100);
	CHECK(hel_scheduler_admit_planned(m.s, &s3, &plan, NULL, &adm) == -ESTALE);
	hel_admission_plan_free(&plan);
	hel_admission_plan_free(&plan);
	sim_release_all(&m);
	free(T);
	free(U);
	sim_free(&m);
}

/* Design 2.15 export_fits: read-only, and the pin is what it weighs.  The
 * next admission is charged from its GPU prefix (admission_pages): a
 * pending prompt extending the exported checkpoint needs only its pages
 * past it, where the earlier estimate charged the whole prompt (and
 * refused); a prefilling request's next step is reserved already, and a
 * decode is charged a page only when its next token completes one. */
static void test_export_fits(void)
{
	struct sim m;
	hel_scheduler_config c = cfg(24, 8, 2, 2);
	sim_init(&m, &c, test_seed() + 9);
	sel_token *T = toks(2000, 700);
	hel_admission adm;
	hel_request_spec sa = sim_spec(T, 260, NULL, 0, 1),
			 sf = sim_spec(T + 1500, 400, NULL, 0, 1);
	CHECK_OK(sim_admit(&m, &sa, SIM_NO_HOST, 0, &adm, NULL));
	CHECK_OK(sim_admit(&m, &sf, SIM_NO_HOST, 0, &adm, NULL));
	sim_drain(&m, 20);
	/* F's 6 pages held by a worker pin: the rest of the cache is A's and free. */
	const hel_ckpt *f = ck_at(&m, T + 1500, 400);
	CHECK(f && hel_cache_ready(m.c, f));
	uint64_t fid = f->id;
	CHECK_OK(hel_scheduler_pin(m.s, fid));
	const hel_ckpt *k = ck_at(&m, T, 260); /* the prompt's checkpoint */
	CHECK(k && hel_cache_ready(m.c, k) && k->key.consumed == 260);
	uint64_t id = k->id;
	hel_cache_counts k0, k1;
	sim_counts(&m, &k0);
	uint32_t rp, rr, rp_pin, rr_pin;
	hel_cache_reclaimable(m.c, HEL_CKPT_NONE, &rp, &rr);
	hel_cache_reclaimable(m.c, id, &rp_pin, &rr_pin);
	CHECK(rp_pin < rp); /* pinned, its pages are not reclaimable */
	uint64_t have = (uint64_t)k0.pages_free + k0.pages_pending + rp_pin;
	CHECK(hel_scheduler_export_fits(m.s, id, NULL, false));
	/* A prompt of 4 + have pages beginning with A's 260 tokens: from its
	 * GPU prefix (A's prompt, pinned by the export) it needs `have` pages
	 * -- it fits; charged whole (4 + have pages) it would not. */
	CHECKF(5 + have <= 23 && have >= 2, "have %llu free %u pending %u rp %u",
	       (unsigned long long)have, k0.pages_free, k0.pages_pending, rp_pin);
	hel_request_spec sc = sim_spec(T, (4 + have) * 64 + 10, NULL, 0, 1);
	CHECK(hel_scheduler_export_fits(m.s, id, &sc, false));
	CHECK(hel_scheduler_export_fits(m.s, id, &sc, true)); /* a ticket's row: rows to spare */
	hel_request_spec sd = sim_spec(T, (5 + have) * 64 + 10, NULL, 0, 1); /* one page more */
	CHECK(!hel_scheduler_export_fits(m.s, id, &sd, false));
	/* Unpinned by the export, A's prompt is still sd's prefix, which its
	 * admission pins: refused all the same. */
	CHECK(!hel_scheduler_export_fits(m.s, HEL_CKPT_NONE, &sd, false));
	/* Another prompt of the same length but no common prefix: charged whole. */
	hel_request_spec so = sim_spec(T + 300, have * 64 + 10, NULL, 0, 1);
	CHECK(hel_scheduler_export_fits(m.s, id, &so, false));
	so.prompt_len += 64;
	CHECK(!hel_scheduler_export_fits(m.s, id, &so, false));
	CHECK(hel_scheduler_export_fits(m.s, HEL_CKPT_NONE, &so,
					false)); /* A's pages reclaimable */
	/* Rows: the live row and a host hit's ticket row.  Capture points
	 * reserve none (their rows are taken at the capture), so six of them,
	 * more than the rows left, change nothing (charged a row each, as
	 * admission once reserved them, the export was refused). */
	uint64_t rows_have = (uint64_t)k0.rows_free + k0.rows_pending + rr_pin, ends[6];
	CHECK(rows_have >= 2 && rows_have + 1 <= 8);
	for (uint32_t i = 0; i < 6; i++)
		ends[i] = 270 + 10 * (uint64_t)i;
	hel_request_spec sr = sim_spec(T, 335, ends, 6, 1);
	CHECK(6 + 2 > rows_have);
	CHECK(hel_scheduler_export_fits(m.s, id, &sr, false));
	CHECK(hel_scheduler_export_fits(m.s, id, &sr, true)); /* a host hit's ticket row */
	/* A request in prefill: its pages are reserved, its next step is
	 * charged nothing more (the earlier estimate charged it a page). */
	hel_request_spec sb = sim_spec(T + 1100, 63, NULL, 0, 4);
	CHECK_OK(sim_admit(&m, &sb, SIM_NO_HOST, 0, &adm, NULL));
	sim_counts(&m, &k1);
	hel_cache_reclaimable(m.c, id, &rp_pin, &rr_pin);
	CHECK((uint64_t)k1.pages_free + k1.pages_pending + rp_pin == have); /* 63 tokens: no page */
	CHECK(hel_scheduler_export_fits(m.s, id, &sc, false));
	sim_counts(&m, &k0);
	CHECK(!memcmp(&k0, &k1, sizeof k0)); /* read-only */
	/* Prefilled, it decodes at 63: its next token completes a page. */
	CHECK(sim_step(&m) == 1 && sim_complete(&m));
	hel_request_info in;
	info(&m, adm.req, &in);
	CHECK(in.phase == HEL_PHASE_DECODE);
	sim_counts(&m, &k1);
	hel_cache_reclaimable(m.c, id, &rp_pin, &rr_pin);
	CHECK((uint64_t)k1.pages_free + k1.pages_pending + rp_pin == have);
	CHECK(!hel_scheduler_export_fits(m.s, id, &sc, false));
	hel_request_spec sc1 = sim_spec(T, (3 + have) * 64 + 10, NULL, 0, 1); /* a page less */
	CHECK(hel_scheduler_export_fits(m.s, id, &sc1, false));
	sim_check_ok(m.s);
	CHECK_OK(hel_scheduler_unpin(m.s, fid));
	sim_drain(&m, 20);
	sim_release_all(&m);
	free(T);
	sim_free(&m);
}

/* A parked request (preempted, waiting for capacity) is the next
 * admission, before any pending one: export_fits charges it, from its GPU
 * prefix, with nothing pending.  The earlier estimate left it out. */
static void test_export_fits_parked(void)
{
	struct sim m;
	sel_token *A, *B;
	hel_admission aa, ab;
	two_decoders(&m, test_seed() + 24, &A, &B, &aa, &ab);
	for (int i = 0; i < 80 && !stats(&m).preempted; i++) {
		CHECK(sim_step(&m));
		CHECK(sim_complete(&m));
	}
	CHECK(stats(&m).preempted == 1 && stats(&m).waiting == 1);
	hel_request_info in;
	info(&m, ab.req, &in);
	CHECK(in.phase == HEL_PHASE_WAITING);
	/* B's history of 191 tokens, from its GPU prefix: the pages it needs. */
	uint64_t len = sel_history_len(in.history);
	const hel_ckpt *g = hel_cache_lookup(m.c, in.history, len);
	uint64_t gid = g ? g->id : HEL_CKPT_NONE, a = g ? g->key.consumed : 0;
	uint64_t need = len / 64 - a / 64;
	CHECK(need >= 1);
	hel_cache_counts k;
	sim_counts(&m, &k);
	uint64_t pins[1] = {gid};
	uint32_t rp, rr;
	hel_cache_reclaimable_if_pinned(m.c, pins, 1, &rp, &rr);
	uint64_t have = (uint64_t)k.pages_free + k.pages_pending + rp;
	/* What the other decoder's next token takes. */
	info(&m, aa.req, &in);
	uint64_t decode = in.phase == HEL_PHASE_DECODE && (in.consumed + 1) % 64 == 0;
	CHECKF((need + decode > have) ==
		       !hel_scheduler_export_fits(m.s, HEL_CKPT_NONE, NULL, false),
	       "need %llu + %llu, have %llu", (unsigned long long)need, (unsigned long long)decode,
	       (unsigned long long)have);
	CHECK(need + decode > have); /* B was preempted for lack of pages */
	/* Parked before pending: a one-token prompt behind it changes nothing. */
	hel_request_spec tiny = sim_spec(A + 50, 1, NULL, 0, 1);
	CHECK(!hel_scheduler_export_fits(m.s, HEL_CKPT_NONE, &tiny, false));
	sim_drain(&m, 400);
	CHECK(stats(&m).waiting == 0 && stats(&m).finished == 2);
	CHECK(hel_scheduler_export_fits(m.s, HEL_CKPT_NONE, &tiny, false)); /* readmitted, done */
	sim_take(&m);
	sim_release_all(&m);
	free(A);
	free(B);
	sim_free(&m);
}

int main(void)
{
	test_prefill_captures_and_hits();
	test_message_deferral();
	test_prompt_capture_without_row();
	test_lazy_capture_rows();
	test_cancel_offers_message();
	test_preemption();
	test_floor_hold();
	test_inbound();
	test_compaction_heir();
	test_notice_bound();
	test_capacity_and_fences();
	test_export_fits();
	test_export_fits_parked();
	printf("test_scheduler: ok\n");
	return 0;
}
