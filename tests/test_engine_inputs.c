/*
 * test_engine_inputs.c - images through the engine (src/helios/
 * engine_inputs.c; design 2.13; docs/inputs.md "Engine scheduling"): a
 * chat with an image answered exactly as a cold engine answers it; the
 * next turn skipping decoding, preparation and the image's prefill (a
 * description hit, a GPU checkpoint covering the image); the same image
 * after other text (a tensor hit, no preparation); two requests with one
 * new image at once (one preparation); evictions of inputs and of
 * checkpoints independent; a restart on the same directory
 * (disk hits from .input files); a corrupted .input file (a miss, rebuilt,
 * the same reply); the image placeholders validated at submit; a text
 * core refusing images.  Waits are by condition with deadlines.
 */
#include <dirent.h>
#include <fcntl.h>
#include <png.h>
#include <unistd.h>

#include "engine_test.h"
#include "helios/image.h"
#include "helios/vision.h"
#include "imgutil.h"
#include "inpututil.h"

static hel_core *core;

/* A chat: a system line, then a user message with text, the image, text. */
struct chat {
	hel_token tok[ET_MAXTOK * 2];
	uint32_t n;
	hel_image_input img[2];
	uint32_t n_img;
};

static uint32_t tokens_of(const struct imgbuf *b)
{
	hel_image_limits l = hel_image_limits_default();
	hel_image_format f;
	uint32_t w, h, gh, gw;
	CHECK_OK(hel_image_probe(b->b, b->n, &l, &f, &w, &h));
	hel_vision_grid(&core->image, w, h, &gh, &gw);
	return gh * gw;
}

/* sys, then "user: <before><image><after>", then optional reply and
 * another user turn; the generation prompt. */
static void build(struct chat *c, const char *sys, const struct imgbuf *b, const hel_token *reply,
		  uint32_t n_reply, const char *next)
{
	hel_message_image span = {.offset = 12, .tokens = tokens_of(b)};
	const char *u = "Look at this and tell me.";
	char rb[ET_MAXTOK + 1];
	size_t nr = hel_detokenize(reply, n_reply, rb, sizeof rb);
	hel_message m[4] = {
		{.role = "system", .content = sys, .content_len = strlen(sys)},
		{.role = "user",
		 .content = u,
		 .content_len = strlen(u),
		 .images = &span,
		 .n_images = 1},
		{.role = "assistant", .content = rb, .content_len = nr},
		{.role = "user",
		 .content = next ? next : "",
		 .content_len = next ? strlen(next) : 0},
	};
	size_t n =
		hel_chat_template(m, next ? 4 : 2, true, c->tok, sizeof c->tok / sizeof c->tok[0]);
	CHECK(n <= sizeof c->tok / sizeof c->tok[0]);
	c->n = (uint32_t)n;
	c->n_img = 1;
	uint32_t at = 0;
	while (c->tok[at] != HEL_TOK_IMAGE)
		at++;
	c->img[0] = (hel_image_input){.bytes = b->b, .len = b->n, .at = at, .tokens = span.tokens};
}

static int submit(hel_engine *e, struct et_call *call, const struct chat *c, uint32_t max_tokens)
{
	hel_request q = {.prompt = c->tok,
			 .n_prompt = c->n,
			 .images = c->img,
			 .n_images = c->n_img,
			 .max_tokens = max_tokens,
			 .ignore_eos = true,
			 .on_tokens = et_on_tokens,
			 .on_done = et_on_done,
			 .ctx = call};
	return hel_engine_submit(e, &q, &call->id);
}

static struct et_call *run(hel_engine *e, const struct chat *c, uint32_t max_tokens)
{
	struct et_call *call = et_call_new();
	CHECK_OK(submit(e, call, c, max_tokens));
	et_wait(call);
	CHECKF(call->out.error == 0, "request failed: %s", sel_strerror(call->out.error));
	return call;
}

static hel_engine *start(hel_engine_config cfg)
{
	cfg.core = core;
	hel_engine *e;
	CHECK_OK(hel_engine_open(&cfg, &e));
	CHECK_OK(hel_engine_start(e));
	return e;
}

static hel_engine_input_stats istats(hel_engine *e)
{
	hel_engine_stats s;
	et_settle(e);
	hel_engine_stats_get(e, &s);
	return s.inputs;
}

/* A cold engine's reply to c: what every warm path must match. */
static struct et_call *cold(const struct chat *c, uint32_t max_tokens)
{
	hel_engine *e =
		start((hel_engine_config){.max_active = 2, .gpu_pages = 64, .gpu_rows = 32});
	struct et_call *call = run(e, c, max_tokens);
	hel_engine_input_stats s = istats(e);
	CHECKF(s.enabled && s.decodes == 1 && s.preparations == 1,
	       "en %d dec %llu prep %llu look %llu", s.enabled, (unsigned long long)s.decodes,
	       (unsigned long long)s.preparations, (unsigned long long)s.lookups);
	hel_engine_destroy(e);
	return call;
}

static void same(const struct et_call *a, const struct et_call *b)
{
	CHECK(a->n == b->n && a->n > 0);
	CHECK(memcmp(a->tok, b->tok, a->n * sizeof a->tok[0]) == 0);
}

static void png_of(struct imgbuf *b, uint32_t w, uint32_t h, uint32_t seed)
{
	uint8_t *px = img_pattern(w, h, 3, seed);
	img_png(b, w, h, PNG_COLOR_TYPE_RGB, 8, px, w * 3, NULL);
	free(px);
}

/* Turn one, turn two (the image covered), other text (a tensor hit). */
static void test_turns(void)
{
	struct imgbuf img = {0};
	png_of(&img, 40, 24, 7);
	hel_engine *e = start((hel_engine_config){
		.max_active = 2, .gpu_pages = 64, .gpu_rows = 32, .memory_bytes = 8 << 20});
	struct chat c1;
	build(&c1, "Be brief.", &img, NULL, 0, NULL);
	struct et_call *a = run(e, &c1, 12);
	struct et_call *a0 = cold(&c1, 12);
	same(a, a0);
	hel_engine_input_stats s = istats(e);
	CHECK(s.decodes == 1 && s.preparations == 1 && s.desc_lookups == 1 && s.desc_hits == 0);
	CHECK(s.tensor_lookups == 1 && s.tensor_hits == 0 && s.bytes_memory > 0);
	CHECK(s.memory_budget == sel_input_budget(8 << 20, true));

	/* Turn two: decoding and preparation skipped, the image's prefill
	 * too (the message checkpoint after it is reused). */
	struct chat c2;
	build(&c2, "Be brief.", &img, a->tok, a->n, "And the colours?");
	struct et_call *b = run(e, &c2, 10);
	s = istats(e);
	CHECK(s.decodes == 1 && s.preparations == 1);
	CHECK(s.desc_hits == 1 && s.hits_memory == 1 && s.images_covered == 1);
	CHECK(s.tensor_lookups == 1);
	CHECKF(b->out.reused_gpu_tokens >= c2.img[0].at + c2.img[0].tokens, "reused %llu",
	       (unsigned long long)b->out.reused_gpu_tokens);
	struct et_call *b0 = cold(&c2, 10);
	same(b, b0);

	/* Other text before the same image: no checkpoint covers it; its
	 * tensors come from memory, nothing is decoded or prepared. */
	struct chat c3;
	build(&c3, "Be very brief.", &img, NULL, 0, NULL);
	struct et_call *d = run(e, &c3, 12);
	s = istats(e);
	CHECK(s.decodes == 1 && s.preparations == 1);
	CHECK(s.tensor_lookups == 2 && s.tensor_hits == 1 && s.hits_memory == 3);
	CHECK(s.saved_ns > 0);
	struct et_call *d0 = cold(&c3, 12);
	same(d, d0);

	/* Another image in the same place: another reply. */
	struct imgbuf img2 = {0};
	png_of(&img2, 40, 24, 8);
	struct chat c4;
	build(&c4, "Be brief.", &img2, NULL, 0, NULL);
	struct et_call *f = run(e, &c4, 12);
	CHECK(f->n != a->n || memcmp(f->tok, a->tok, a->n * sizeof a->tok[0]));
	s = istats(e);
	CHECK(s.decodes == 2 && s.preparations == 2 && s.waiting == 0);

	hel_engine_destroy(e);
	struct et_call *all[] = {a, a0, b, b0, d, d0, f};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		et_call_free(all[i]);
	imgbuf_free(&img);
	imgbuf_free(&img2);
}

/* Two requests with one new image at once (host retention on): one
 * decode, one preparation, one reply. */
static void test_concurrent(void)
{
	struct imgbuf img = {0};
	png_of(&img, 33, 17, 11);
	hel_engine *e = start((hel_engine_config){
		.max_active = 2, .gpu_pages = 64, .gpu_rows = 32, .memory_bytes = 8 << 20});
	struct chat c;
	build(&c, "Two at once.", &img, NULL, 0, NULL);
	struct et_call *x = et_call_new(), *y = et_call_new();
	CHECK_OK(submit(e, x, &c, 8));
	CHECK_OK(submit(e, y, &c, 8));
	et_wait(x);
	et_wait(y);
	CHECK(x->out.error == 0 && y->out.error == 0);
	same(x, y);
	hel_engine_input_stats s = istats(e);
	CHECKF(s.preparations == 1 && s.decodes == 1, "preparations %llu decodes %llu",
	       (unsigned long long)s.preparations, (unsigned long long)s.decodes);
	hel_engine_destroy(e);
	et_call_free(x);
	et_call_free(y);
	imgbuf_free(&img);
}

static int no_store(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	(void)ctx;
	(void)cfg;
	*out = NULL;
	return 0;
}

/* Evicting inputs never invalidates a checkpoint, nor the reverse.
 * Without host retention the input records are gone at once: turn two
 * still resumes past the image from the GPU checkpoint (the image is
 * decoded again for its identity, never prepared).  With GPU checkpoints
 * evicted by other requests, the prepared tensors in memory still serve
 * the image (a tensor hit, no preparation), with the same reply. */
static void test_independent(void)
{
	struct imgbuf img = {0};
	png_of(&img, 40, 24, 31);
	struct chat c1, c2;
	build(&c1, "Be brief.", &img, NULL, 0, NULL);

	hel_engine *e =
		start((hel_engine_config){.max_active = 2, .gpu_pages = 64, .gpu_rows = 32});
	struct et_call *a = run(e, &c1, 10);
	build(&c2, "Be brief.", &img, a->tok, a->n, "Again?");
	struct et_call *b = run(e, &c2, 6);
	hel_engine_input_stats s = istats(e);
	CHECK(s.bytes_memory == 0 && s.decodes == 2 && s.preparations == 1 &&
	      s.images_covered == 1);
	CHECK(b->out.reused_gpu_tokens >= c2.img[0].at + c2.img[0].tokens);
	struct et_call *b0 = cold(&c2, 6);
	same(b, b0);
	hel_engine_destroy(e);

	/* A warm budget for the input tier, no host store for checkpoints:
	 * what the GPU cache evicts is gone. */
	e = start((hel_engine_config){.max_active = 1,
				      .gpu_pages = 12,
				      .gpu_rows = 12,
				      .memory_bytes = 8 << 20,
				      .store_open = no_store});
	struct et_call *x = run(e, &c1, 10);
	test_rng rng;
	test_rng_init(&rng, 7);
	for (int i = 0; i < 8; i++) {
		uint32_t n;
		hel_token *p = et_random_prompt(&rng, 150 + 10 * (uint32_t)i, &n);
		et_call_free(et_run(e, p, n, 3, NULL));
		free(p);
	}
	hel_engine_stats es;
	et_settle(e);
	hel_engine_stats_get(e, &es);
	CHECK(es.gpu_evictions > 0);
	struct et_call *y = run(e, &c2, 6);
	s = istats(e);
	CHECKF(y->out.reused_gpu_tokens < c2.img[0].at + c2.img[0].tokens,
	       "the checkpoint past the image survived: reused %llu",
	       (unsigned long long)y->out.reused_gpu_tokens);
	CHECKF(s.preparations == 1 && s.decodes == 1 && s.tensor_hits == 1,
	       "prep %llu dec %llu th %llu dh %llu tl %llu cov %llu reused %llu at %u err %d "
	       "cached %llu prefill %llu",
	       (unsigned long long)s.preparations, (unsigned long long)s.decodes,
	       (unsigned long long)s.tensor_hits, (unsigned long long)s.desc_hits,
	       (unsigned long long)s.tensor_lookups, (unsigned long long)s.images_covered,
	       (unsigned long long)y->out.reused_gpu_tokens, c2.img[0].at, y->out.error,
	       (unsigned long long)y->out.cached_tokens, (unsigned long long)y->out.prefill_tokens);
	same(y, b0);
	hel_engine_destroy(e);

	struct et_call *all[] = {a, b, b0, x, y};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		et_call_free(all[i]);
	imgbuf_free(&img);
}

/* The image request x, submitted from a text request's first token (on
 * the worker thread, in on_tokens), so that it is always admitted at the
 * same point of the others' runs: after them, the newest decoder, the
 * one preemption takes first. */
struct trigger {
	struct et_call call; /* first: on_tokens' ctx */
	hel_engine *e;
	const struct chat *c;
	uint32_t max;
	struct et_call *x;
	bool sent;
};

static uint32_t trigger_tokens(void *ctx, const hel_token *t, const hel_logprob *lp, uint32_t n)
{
	struct trigger *tg = ctx;
	uint32_t keep = et_on_tokens(&tg->call, t, lp, n);
	if (!tg->sent) {
		tg->sent = true;
		CHECK_OK(submit(tg->e, tg->x, tg->c, tg->max));
	}
	return keep;
}

/* A preempted request whose image a reused checkpoint covered (never
 * prepared) and whose checkpoints past the image were all evicted: its
 * replay starts before the image, so the engine prepares the image then
 * (through the preparation worker) and the request completes with a cold
 * run's tokens.  A GPU cache of 9 pages (no host store, no input
 * retention), two long text decodes admitted first and turn two x
 * submitted from the first one's first token (the newest decoder, the one
 * preemption takes) force the preemption and the evictions.  Whether
 * x's admission comes before the others evict the checkpoints past the
 * image depends on the preparation thread's timing (its description), so
 * rounds on fresh engines repeat, at most 40 (idle, and under three CPU
 * hogs, the first round nearly always counts): each checks the tokens
 * against a cold run, and some round must have prepared the image again. */
static void test_replay(void)
{
	struct imgbuf img = {0};
	png_of(&img, 40, 24, 41);
	test_rng rng;
	test_rng_init(&rng, 23);
	uint64_t reprepared = 0, preempted = 0;
	int round;
	for (round = 0; round < 40 && !reprepared; round++) {
		/* A fresh engine and chat each round: turn one puts the GPU
		 * checkpoints past the image there. */
		hel_engine *e = start((hel_engine_config){.max_active = 3,
							  .gpu_pages = 9,
							  .gpu_rows = 9,
							  .chunk_tokens = 64,
							  .store_open = no_store});
		char sys[64];
		snprintf(sys, sizeof sys, "Be brief, round %d.", round);
		struct chat c1, c2;
		build(&c1, sys, &img, NULL, 0, NULL);
		struct et_call *a = run(e, &c1, 8);
		build(&c2, sys, &img, a->tok, a->n, "And now a long answer.");
		const uint32_t max = 250;
		uint64_t prep0 = istats(e).preparations;
		struct trigger *tg = calloc(1, sizeof *tg);
		CHECK(tg);
		pthread_mutex_init(&tg->call.mu, NULL);
		pthread_cond_init(&tg->call.cv, NULL);
		tg->e = e;
		tg->c = &c2;
		tg->max = max;
		tg->x = et_call_new();
		uint32_t n, n2;
		hel_token *p = et_random_prompt(&rng, 20, &n);
		hel_request q = {.prompt = p,
				 .n_prompt = n,
				 .max_tokens = 350,
				 .ignore_eos = true,
				 .on_tokens = trigger_tokens,
				 .on_done = et_on_done,
				 .ctx = tg};
		CHECK_OK(hel_engine_submit(e, &q, &tg->call.id));
		struct et_call *o = et_call_new();
		hel_token *p2 = et_random_prompt(&rng, 40, &n2);
		CHECK_OK(et_submit(e, o, p2, n2, 350, NULL));
		et_wait(&tg->call);
		et_wait(o);
		CHECK(tg->call.out.error == 0 && o->out.error == 0 && tg->sent);
		struct et_call *x = tg->x;
		et_wait(x);
		CHECKF(x->out.error == 0, "round %d: the request failed: %s", round,
		       sel_strerror(x->out.error));
		hel_engine_input_stats s = istats(e);
		hel_engine_stats es;
		hel_engine_stats_get(e, &es);
		preempted += es.preemptions;
		CHECK(s.waiting == 0 && s.images_failed == 0);
		/* The case: admitted past the image (a busy machine may have let
		 * the others evict it first: then it was prepared at admission,
		 * and the round does not count), prepared for its replay. */
		if (x->out.reused_gpu_tokens >= c2.img[0].at + c2.img[0].tokens &&
		    s.images_reprepared) {
			reprepared = s.images_reprepared;
			CHECKF(s.preparations > prep0, "preparations %llu (%llu before)",
			       (unsigned long long)s.preparations, (unsigned long long)prep0);
		}
		hel_engine_destroy(e);
		struct et_call *ref = cold(&c2, max);
		same(x, ref);
		et_call_free(ref);
		et_call_free(a);
		et_call_free(x);
		et_call_free(o);
		free(p);
		free(p2);
		pthread_mutex_destroy(&tg->call.mu);
		pthread_cond_destroy(&tg->call.cv);
		free(tg);
	}
	printf("replay: round %d prepared the image again (%llu preemptions)\n", round - 1,
	       (unsigned long long)preempted);
	CHECKF(reprepared > 0, "no replay started before the image in %d rounds (%llu preemptions)",
	       round, (unsigned long long)preempted);
	imgbuf_free(&img);
}

/* The .input files of dir, by prefix ("src-", "prep-"); the first's path. */
static int count_inputs(const char *dir, const char *prefix, char *first, size_t cap)
{
	DIR *d = opendir(dir);
	CHECK(d);
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (strncmp(de->d_name, prefix, strlen(prefix)) || l < 6 ||
		    strcmp(de->d_name + l - 6, ".input"))
			continue;
		if (!n++ && first)
			snprintf(first, cap, "%s/%s", dir, de->d_name);
	}
	closedir(d);
	return n;
}

/* Flip a byte in the middle of every file of dir whose name ends with
 * suffix; the count. */
static int flip_all(const char *dir, const char *suffix)
{
	DIR *d = opendir(dir);
	CHECK(d);
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name), ls = strlen(suffix);
		if (l < ls || strcmp(de->d_name + l - ls, suffix) || de->d_name[0] == '.')
			continue;
		char path[4400];
		snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
		int fd = open(path, O_RDWR);
		CHECK(fd >= 0);
		off_t end = lseek(fd, 0, SEEK_END);
		uint8_t byte;
		CHECK(pread(fd, &byte, 1, end / 2) == 1);
		byte ^= 0x40;
		CHECK(pwrite(fd, &byte, 1, end / 2) == 1);
		close(fd);
		n++;
	}
	closedir(d);
	return n;
}

/* A restart on the same directory: turn two restores the checkpoint that
 * covers the image from disk (no preparation at all, the description from
 * disk); other text before the image finds its tensors on disk.  Then
 * with every checkpoint and the prepared record corrupted: the restore
 * fails, the request plans again from what it has (nothing), and the
 * image is rebuilt from the request's own bytes -- the same reply. */
static void test_restart(void)
{
	char *dir = test_mkdtemp("engine-inputs");
	struct imgbuf img = {0};
	png_of(&img, 40, 24, 21);
	hel_engine_config cfg = {.max_active = 2,
				 .gpu_pages = 64,
				 .gpu_rows = 32,
				 .fetch = HEL_FETCH_ALWAYS,
				 .disk_dir = dir,
				 .disk_limit = 64 << 20,
				 .disk_limit_set = true};
	struct chat c1, c2, t2;
	build(&c1, "Be brief.", &img, NULL, 0, NULL);
	build(&c2, "Other text first.", &img, NULL, 0, NULL);

	hel_engine *e = start(cfg);
	hel_engine_info info;
	hel_engine_info_get(e, &info);
	char ns[4096];
	snprintf(ns, sizeof ns, "%s", info.disk_dir);
	struct et_call *a = run(e, &c1, 10);
	hel_engine_input_stats s = istats(e);
	CHECK(s.decodes == 1 && s.preparations == 1 && s.records_disk == 2 && s.bytes_disk > 0);
	CHECK(s.memory_budget == 0 && s.bytes_memory == 0); /* no warm budget: nothing kept */
	hel_engine_destroy(e);
	CHECK(count_inputs(ns, "src-", NULL, 0) == 1);
	CHECK(count_inputs(ns, "prep-", NULL, 0) == 1);
	build(&t2, "Be brief.", &img, a->tok, a->n, "More, please.");
	struct et_call *t0 = cold(&t2, 8);

	/* Restarted: turn two resumes from the disk checkpoint past the image. */
	e = start(cfg);
	struct et_call *b = run(e, &t2, 8);
	s = istats(e);
	CHECKF(s.decodes == 0 && s.preparations == 0 && s.tensor_lookups == 0 &&
		       s.images_covered == 1 && s.hits_disk == 1,
	       "decodes %llu preparations %llu tensor lookups %llu covered %llu disk hits %llu",
	       (unsigned long long)s.decodes, (unsigned long long)s.preparations,
	       (unsigned long long)s.tensor_lookups, (unsigned long long)s.images_covered,
	       (unsigned long long)s.hits_disk);
	CHECK(b->out.reused_host_tokens >= t2.img[0].at + t2.img[0].tokens);
	same(b, t0);
	/* Other text before the image: description and tensors from disk. */
	struct et_call *d = run(e, &c2, 10);
	s = istats(e);
	CHECK(s.decodes == 0 && s.preparations == 0 && s.hits_disk == 3 && s.tensor_hits == 1);
	struct et_call *d0 = cold(&c2, 10);
	same(d, d0);
	hel_engine_destroy(e);

	/* Every checkpoint and the prepared record corrupted. */
	CHECK(flip_all(ns, ".ckpt") > 0);
	CHECK(flip_all(ns, ".input") == 2);
	e = start(cfg);
	struct et_call *f = run(e, &t2, 8);
	s = istats(e);
	hel_engine_stats es;
	hel_engine_stats_get(e, &es);
	CHECKF(s.decodes == 1 && s.preparations == 1 && s.disk_invalid >= 1,
	       "decodes %llu preparations %llu invalid %llu (restores failed %llu)",
	       (unsigned long long)s.decodes, (unsigned long long)s.preparations,
	       (unsigned long long)s.disk_invalid, (unsigned long long)es.host_fetch_failed);
	CHECK(f->out.reused_host_tokens == 0);
	same(f, t0);
	printf("corrupted checkpoints: %llu restores failed and were recomputed\n",
	       (unsigned long long)es.host_fetch_failed);
	hel_engine_destroy(e);

	struct et_call *all[] = {a, t0, b, d, d0, f};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		et_call_free(all[i]);
	imgbuf_free(&img);
	test_rmtree(dir);
	free(dir);
}

/* unlinkat failing with EIO for .input files (the input scan's removals). */
static int unlink_no_inputs(int dfd, const char *path, int flags)
{
	size_t l = strlen(path);
	if (l >= 6 && !strcmp(path + l - 6, ".input")) {
		errno = EIO;
		return -1;
	}
	return eos_fileops_libc.unlinkat(dfd, path, flags);
}

/* Startup fails when the input scan fails (its disk usage would be
 * unknown): an invalid .input file the scan cannot remove (EIO injected)
 * fails hel_engine_open with a message naming the scan; nothing is left
 * held (the next open on the same directory succeeds and removes it). */
static void test_scan_fails(void)
{
	char *dir = test_mkdtemp("engine-inputs-scan");
	struct imgbuf img = {0};
	png_of(&img, 24, 16, 5);
	hel_engine_config cfg = {.core = core,
				 .max_active = 2,
				 .gpu_pages = 64,
				 .gpu_rows = 32,
				 .disk_dir = dir,
				 .disk_limit = 64 << 20,
				 .disk_limit_set = true};
	struct chat c;
	build(&c, "Scan.", &img, NULL, 0, NULL);
	hel_engine *e = start(cfg);
	hel_engine_info info;
	hel_engine_info_get(e, &info);
	char ns[4096], first[4400];
	snprintf(ns, sizeof ns, "%s", info.disk_dir);
	et_call_free(run(e, &c, 4));
	hel_engine_destroy(e);
	CHECK(count_inputs(ns, "src-", first, sizeof first) == 1);
	CHECK(truncate(first, 10) == 0); /* shorter than a header: invalid */

	struct eos_fileops ops = eos_fileops_libc;
	ops.unlinkat = unlink_no_inputs;
	eos_fileops_set(&ops);
	e = NULL;
	int rc = hel_engine_open(&cfg, &e);
	eos_fileops_set(NULL);
	CHECKF(rc == -EIO && !e, "open: %d", rc);
	CHECKF(strstr(sel_errmsg(), "image inputs: scanning") && strstr(sel_errmsg(), "remove"),
	       "message: %s", sel_errmsg());
	CHECK(count_inputs(ns, "src-", NULL, 0) == 1);

	e = start(cfg); /* the directory's lock was let go; the scan removes it */
	CHECK(count_inputs(ns, "src-", NULL, 0) == 0);
	struct et_call *b = run(e, &c, 4);
	CHECK(b->out.error == 0);
	et_call_free(b);
	hel_engine_destroy(e);
	imgbuf_free(&img);
	test_rmtree(dir);
	free(dir);
}

/* Bad requests: placeholders that are not an image's, an image whose
 * bytes do not decode (the request fails, others go on), a text core. */
static void test_refused(void)
{
	struct imgbuf img = {0};
	png_of(&img, 16, 16, 3);
	hel_engine *e =
		start((hel_engine_config){.max_active = 2, .gpu_pages = 64, .gpu_rows = 32});
	struct chat c;
	build(&c, "x", &img, NULL, 0, NULL);
	struct et_call *call = et_call_new();
	c.img[0].tokens--;
	CHECK(submit(e, call, &c, 4) == -EINVAL);
	CHECK(strstr(sel_errmsg(), "placeholder"));
	c.img[0].tokens++;
	c.n_img = 0;
	CHECK(submit(e, call, &c, 4) == -EINVAL);
	c.n_img = 1;

	/* A header that probes but data that does not decode. */
	struct imgbuf bad = {0};
	imgbuf_put(&bad, img.b, img.n);
	for (size_t i = 60; i < bad.n - 20; i++)
		bad.b[i] ^= 0x5a;
	c.img[0].bytes = bad.b;
	c.img[0].len = bad.n;
	CHECK_OK(submit(e, call, &c, 4));
	et_wait(call);
	CHECK(call->out.error != 0 && !strcmp(call->out.finish_reason, "error"));
	hel_engine_input_stats s = istats(e);
	CHECK(s.images_failed == 1 && s.waiting == 0);
	c.img[0].bytes = img.b;
	c.img[0].len = img.n;
	et_call_free(run(e, &c, 4)); /* the engine goes on */
	hel_engine_destroy(e);
	et_call_free(call);

	hel_core *text = test_core_load("tiny");
	hel_engine_config tc = {.core = text, .max_active = 2, .gpu_pages = 64, .gpu_rows = 32};
	CHECK_OK(hel_engine_open(&tc, &e));
	call = et_call_new();
	hel_request q = {.prompt = c.tok,
			 .n_prompt = c.n,
			 .images = c.img,
			 .n_images = 1,
			 .max_tokens = 4,
			 .on_tokens = et_on_tokens,
			 .on_done = et_on_done,
			 .ctx = call};
	CHECK(hel_engine_submit(e, &q, &call->id) == -EINVAL);
	CHECK(strstr(sel_errmsg(), "takes no images"));
	hel_engine_destroy(e);
	hel_core_free(text);
	et_call_free(call);
	imgbuf_free(&bad);
	imgbuf_free(&img);
}

int main(void)
{
	core = test_core_load("vision-small");
	test_turns();
	test_concurrent();
	test_independent();
	test_replay();
	test_restart();
	test_scan_fails();
	test_refused();
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
