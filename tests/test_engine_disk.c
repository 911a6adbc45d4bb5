/*
 * test_engine_disk.c - the engine with disk tiers (design 2.4, 2.11;
 * implementation step 12's acceptance at small size): the built-in core,
 * the host backend, a disk-only store and a composite with the drain on
 * shutdown, each on its own record directory.
 *
 * Covers: a conversation's turn-1 terminal, offered to the store, survives
 * an engine restart on the same directory (the startup info reports the
 * namespace directory, its limit and the scanned records); turn 2 on the
 * new engine restores it from disk (reused host tokens = the terminal,
 * tier disk, prefill limited to the new tokens) and its tokens equal those
 * of an engine without offload and of the model run directly.  A second
 * engine on a directory that is in use fails at open.
 *
 * Regression (stop_loses_resumed_terminal): an engine stopped right after
 * a request that resumed at turn 1's terminal -- the resume offers that
 * terminal -- must hand the publication to the store before closing it,
 * so the drain on shutdown writes it: the worker used to leave its loop
 * before servicing the store once more, and the record was missing after
 * a restart in some runs.  Repeated, each time on a fresh directory.
 */
#include <fcntl.h>

#include "engine_test.h"
#include "internal.h"
#include "recutil.h"
#include "store_composite.h"
#include "store_disk.h"

static hel_core *core;
static test_rng rng;

static hel_engine *start(hel_engine_config c) { return et_engine_start(core, c); }

static void finish(hel_engine *e) { et_engine_finish(e); }

static bool settled(const hel_engine_stats *st, void *arg)
{
	return et_settled(st, arg) && st->store.inflight_out == 0 && st->store_retries_pending == 0;
}

/* Turn 1 and a request resuming at its terminal (which offers it). */
static void turn1(hel_engine *e, uint64_t seed, struct et_chat *ch, uint64_t *t1,
		  struct et_call **out)
{
	test_rng r;
	test_rng_init(&r, seed);
	char q[160];
	size_t len = 80 + test_rng_below(&r, 60);
	et_text(&r, q, len);
	et_chat_add(ch, "user", q, len);
	uint32_t n1;
	hel_token *p1 = et_chat_prompt(ch, &n1);
	struct et_call *c = et_run(e, p1, n1, 40, NULL);
	*t1 = et_terminal(c);
	hel_token *pc = malloc(*t1 * sizeof *pc);
	memcpy(pc, p1, n1 * sizeof *pc);
	memcpy(pc + n1, c->tok, (*t1 - n1) * sizeof *pc);
	struct et_call *probe = et_run(e, pc, (uint32_t)*t1, 1, NULL);
	CHECK(probe->out.reused_gpu_tokens == *t1);
	et_call_free(probe);
	et_chat_reply(ch, c->tok, c->n);
	len = 20 + test_rng_below(&r, 40);
	et_text(&r, q, len);
	et_chat_add(ch, "user", q, len);
	*out = c;
	free(p1);
	free(pc);
}

static void scenario(const char *name, hel_engine_config cfg)
{
	uint64_t seed = test_rng_next(&rng);
	char *dir = test_mkdtemp("engine-disk");
	cfg.disk_dir = dir;
	cfg.disk_limit = 256 << 20;
	cfg.disk_limit_set = true;

	/* Engine A writes; stopped, its records stay. */
	hel_engine *a = start(cfg);
	hel_engine_info info;
	hel_engine_info_get(a, &info);
	CHECKF(!strcmp(info.store, name), "store %s", info.store);
	CHECK(strstr(info.disk_dir, dir) == info.disk_dir && info.disk_limit == 256 << 20);
	CHECK(info.scanned_records == 0);
	struct et_chat cha = {0};
	uint64_t t1;
	struct et_call *c1;
	turn1(a, seed, &cha, &t1, &c1);
	et_wait_stats(a, settled, NULL);
	/* The directory is this engine's: a second one fails at open. */
	hel_engine *busy;
	hel_engine_config cb = cfg;
	cb.core = core;
	CHECK_RC(hel_engine_open(&cb, &busy), -EBUSY);
	finish(a);

	/* Engine B on the same directory restores the terminal from disk. */
	hel_engine *b = start(cfg);
	hel_engine_info_get(b, &info);
	CHECKF(info.scanned_records >= 1, "%s: %llu records scanned", name,
	       (unsigned long long)info.scanned_records);
	uint32_t n2;
	hel_token *p2 = et_chat_prompt(&cha, &n2);
	struct et_call *c2 = et_run(b, p2, n2, 40, NULL);
	CHECKF(c2->out.reused_host_tokens == t1 && c2->out.host_tier == SEL_TIER_DISK,
	       "%s: reused host %llu (tier %s), terminal %llu", name,
	       (unsigned long long)c2->out.reused_host_tokens, sel_tier_name(c2->out.host_tier),
	       (unsigned long long)t1);
	CHECK(c2->out.cached_tokens == t1 && c2->out.prefill_tokens == n2 - t1);
	hel_engine_stats st;
	et_wait_stats(b, settled, NULL);
	hel_engine_stats_get(b, &st);
	CHECK(st.host_hits >= 1 && st.store.tier[SEL_TIER_DISK].bytes_in > 0);

	/* The same conversation without offload: the same tokens. */
	hel_engine *r = start((hel_engine_config){.max_active = cfg.max_active,
						  .gpu_pages = cfg.gpu_pages,
						  .gpu_rows = cfg.gpu_rows});
	struct et_chat chr = {0};
	uint64_t tr;
	struct et_call *r1;
	turn1(r, seed, &chr, &tr, &r1);
	CHECK(tr == t1 && r1->n == c1->n && !memcmp(r1->tok, c1->tok, c1->n * sizeof(hel_token)));
	uint32_t nr2;
	hel_token *pr2 = et_chat_prompt(&chr, &nr2);
	CHECK(nr2 == n2 && !memcmp(pr2, p2, n2 * sizeof(hel_token)));
	struct et_call *rc2 = et_run(r, pr2, nr2, 40, NULL);
	CHECK(rc2->out.reused_host_tokens == 0);
	CHECK(rc2->n == c2->n && !memcmp(rc2->tok, c2->tok, c2->n * sizeof(hel_token)));
	struct et_ref ref;
	et_reference(core, p2, n2, 40, NULL, &ref);
	et_same_as_ref(NULL, c2, &ref);
	et_ref_free(&ref);
	printf("  %s: turn 2 restored %llu tokens from disk after a restart, %u tokens as "
	       "without offload\n",
	       name, (unsigned long long)t1, c2->n);

	finish(b);
	finish(r);
	et_call_free(c1);
	et_call_free(c2);
	et_call_free(r1);
	et_call_free(rc2);
	et_chat_free(&cha);
	et_chat_free(&chr);
	free(p2);
	free(pr2);
	test_rmtree(dir);
	free(dir);
}

/* ---- stop right after a resume (regression) ---------------------------------------- */

struct holder {
	sel_store *s;
};

static int open_held(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct holder *h = ctx;
	int rc = sel_store_open(cfg, out);
	h->s = rc == 0 ? *out : NULL;
	return rc;
}

/* The probe's on_done: report, then keep the worker a moment, so the stop
 * the test thread makes at once lands before the worker's next iteration
 * (the window a SIGTERM right after a response hits in flare run). */
static void done_then_linger(void *ctx, const hel_outcome *o)
{
	et_on_done(ctx, o);
	eos_sleep_ns(20 * 1000000ull);
}

static void stop_loses_resumed_terminal(int rounds)
{
	int missing = 0;
	for (int i = 0; i < rounds; i++) {
		char *dir = test_mkdtemp("engine-stop");
		struct holder h = {0};
		hel_engine_config cfg = {.max_active = 3,
					 .gpu_pages = 20,
					 .gpu_rows = 30,
					 .fetch = HEL_FETCH_ALWAYS,
					 .memory_bytes = 16 << 20,
					 .disk_dir = dir,
					 .disk_limit = 256 << 20,
					 .disk_limit_set = true,
					 .drain_on_shutdown = true,
					 .store_open = open_held,
					 .store_ctx = &h};
		hel_engine *e = start(cfg);
		uint32_t n1;
		hel_token *p1 = et_random_prompt(&rng, 80 + test_rng_below(&rng, 60), &n1);
		struct et_call *c =
			et_run(e, p1, n1, 20 + (uint32_t)test_rng_below(&rng, 20), NULL);
		uint64_t t1 = et_terminal(c);
		hel_token *pc = malloc(t1 * sizeof *pc);
		CHECK(pc);
		memcpy(pc, p1, n1 * sizeof *pc);
		memcpy(pc + n1, c->tok, (t1 - n1) * sizeof *pc);
		sel_key key;
		sel_key_direct(core->identity, NULL, 0, pc, t1, &key);
		/* The resume offers the terminal; stop as soon as it answered. */
		struct et_call *probe = et_call_new();
		hel_request q = {.prompt = pc,
				 .n_prompt = (uint32_t)t1,
				 .max_tokens = 1,
				 .on_tokens = et_on_tokens,
				 .on_done = done_then_linger,
				 .ctx = probe};
		CHECK_OK(hel_engine_submit(e, &q, &probe->id));
		et_wait(probe);
		CHECK(probe->out.error == 0 && probe->out.reused_gpu_tokens == t1);
		CHECK_OK(hel_engine_stop(e, 0));
		hel_engine_destroy(e);

		/* A restart finds the terminal's file. */
		h.s = NULL;
		e = start(cfg);
		CHECK(h.s);
		struct sel_disk_record_info ri;
		bool found = sel_disk_store_record(sel_composite_store_disk(h.s), &key, &ri) == 0 &&
			     ri.file && ri.has_row;
		missing += !found;
		finish(e);
		et_call_free(c);
		et_call_free(probe);
		free(p1);
		free(pc);
		test_rmtree(dir);
		free(dir);
	}
	CHECKF(missing == 0, "the resumed terminal was missing after %d of %d stops", missing,
	       rounds);
	printf("  stop right after a resume: the terminal on disk after %d of %d restarts\n",
	       rounds - missing, rounds);
}

/* ---- a forged parent link (issue 12, item 1) ------------------------------------------------- */

/* [BEGIN, 100 tokens, MESSAGE, 100 tokens, MESSAGE]: checkpoints at 102 and
 * 203 for every seed, so two such prompts have records of the same lengths. */
static hel_token *two_messages(uint64_t seed, uint32_t *n)
{
	test_rng r;
	test_rng_init(&r, seed);
	hel_token *t = malloc(203 * sizeof *t);
	CHECK(t);
	t[0] = HEL_TOK_BEGIN;
	for (int i = 1; i < 203; i++)
		t[i] = (hel_token)('a' + test_rng_below(&r, 26));
	t[101] = HEL_TOK_MESSAGE;
	t[202] = HEL_TOK_MESSAGE;
	*n = 203;
	return t;
}

/* Regression (forged_parent_gives_wrong_answer): a child record whose
 * parent key was rewritten -- parent check included, header resealed -- to
 * an unrelated record of the same consumed count used to answer the child's
 * prompt from the unrelated prefix.  After a restart the reply must equal
 * the reply without offload. */
static void forged_parent_gives_wrong_answer(void)
{
	char *dir = test_mkdtemp("engine-forged");
	hel_engine_config cfg = {.max_active = 3,
				 .gpu_pages = 40,
				 .gpu_rows = 30,
				 .fetch = HEL_FETCH_ALWAYS,
				 .disk_dir = dir,
				 .disk_limit = 256 << 20,
				 .disk_limit_set = true};
	uint32_t nx, ny;
	hel_token *x = two_messages(test_rng_next(&rng), &nx);
	hel_token *y = two_messages(test_rng_next(&rng), &ny);
	hel_engine *a = start(cfg);
	hel_engine_info info;
	hel_engine_info_get(a, &info);
	char ns[4096];
	snprintf(ns, sizeof ns, "%s", info.disk_dir);
	et_call_free(et_run(a, x, nx, 8, NULL));
	et_call_free(et_run(a, y, ny, 8, NULL));
	et_wait_stats(a, settled, NULL);
	finish(a);

	/* X's record at 203 links under X's at 102; Y has one at 102 too. */
	sel_key x2, x1, y1;
	sel_key_direct(core->identity, NULL, 0, x, 203, &x2);
	sel_key_direct(core->identity, NULL, 0, x, 102, &x1);
	sel_key_direct(core->identity, NULL, 0, y, 102, &y1);
	char n2[SEL_RECORD_NAME_MAX], ny1[SEL_RECORD_NAME_MAX];
	sel_record_name(&x2, n2);
	sel_record_name(&y1, ny1);
	int dfd = open(ns, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dfd >= 0);
	sel_record_header h2, hy;
	test_header_read(dfd, n2, &h2);
	test_header_read(dfd, ny1, &hy);
	CHECKF(sel_key_eq(&h2.d.parent, &x1) && sel_record_links_parent(&h2.d, core->page_tokens),
	       "X's 203-token record does not link under its 102-token one");
	test_forge_parent(dfd, n2, &y1, sel_record_parent_check(&hy.d.bucket));
	close(dfd);

	hel_engine *b = start(cfg);
	hel_engine_info_get(b, &info);
	CHECK(info.scanned_records >= 3); /* the forgery passes the scan */
	struct et_call *c = et_run(b, x, nx, 24, NULL);
	struct et_ref ref;
	et_reference(core, x, nx, 24, NULL, &ref);
	et_same_as_ref(NULL, c, &ref);
	et_ref_free(&ref);
	hel_engine_stats st;
	et_wait_stats(b, settled, NULL);
	hel_engine_stats_get(b, &st);
	CHECKF(st.store.chains_rejected >= 1, "%llu chains rejected",
	       (unsigned long long)st.store.chains_rejected);
	printf("  forged parent link: X's prompt restored %llu tokens (not the forged chain), "
	       "reply as without offload\n",
	       (unsigned long long)c->out.reused_host_tokens);
	finish(b);
	et_call_free(c);
	free(x);
	free(y);
	test_rmtree(dir);
	free(dir);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	hel_engine_config base = {
		.max_active = 3, .gpu_pages = 20, .gpu_rows = 30, .fetch = HEL_FETCH_ALWAYS};
	scenario("disk", base);
	hel_engine_config comp = base;
	comp.memory_bytes = 16 << 20;
	comp.drain_on_shutdown = true;
	scenario("composite", comp);
	stop_loses_resumed_terminal(20 * ET_SCALE);
	forged_parent_gives_wrong_answer();
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
