/*
 * bench/model.c - the synthetic model's prefill and decode speed for every
 * shipped core, so a restore's time can be set against recomputing the same
 * tokens (design 2.10's fetch decision compares exactly these), and decode
 * with speculative decoding against without (issue 19).
 *
 *   build/bench/model [CORE...]     (default: every core in cores/)
 *
 * Prints, per core (dashes in names become underscores):
 *   RESULT model_<core>_prefill_tok_s <v> tok/s
 *   RESULT model_<core>_decode_tok_s <v> tok/s
 *   RESULT model_<core>_launch_weights_us <v> us    the weight stream of one launch
 *   RESULT model_<core>_position_us <v> us          one decode position's own work
 * and for cores with speculative modes, for each prompt (repetitive: text
 * that repeats, which the model continues; ordinary: a chat message) and
 * each mode (off, copy, learned), decoding in rounds (hel_model_decode,
 * greedy, --draft-tokens MODEL_BENCH_DRAFT, default 4):
 *   RESULT model_<core>_<prompt>_<mode>_decode_tok_s <v> tok/s
 *   RESULT model_<core>_<prompt>_<mode>_acceptance <v> ratio     accepted / proposed
 *   RESULT model_<core>_<prompt>_<mode>_tokens_per_round <v> tokens
 *   RESULT model_<core>_<prompt>_<mode>_speedup <v> x            against off, same run
 * and a comment line with the page record and row sizes.  One thread;
 * prefill is one chunk with logits for its last token, decode is greedy
 * with logits every token.  Each measurement is the best of its rounds over
 * about MODEL_BENCH_SECONDS (default 0.4) of model time: the machine is
 * shared, and the best round is the least disturbed one.
 */
#include <dirent.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>

#include "benchlib.h"
#include "helios/core.h"
#include "helios/model.h"
#include "helios/tokenizer.h"
#include "../tests/testutil.h"

#define PROMPT 2048
#define DECODE 256
#define SPEC_PROMPT 600

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct bench {
	const hel_core *c;
	double budget;
	char name[HEL_NAME_MAX + 1];
	uint32_t *table;
	int32_t *logits;
};

/* Decode DECODE tokens greedily from the row slot 0 holds after prompt
 * (prefilled anew, not timed): one token per launch (launch_group 1), or
 * launch_group steps per launch.  Returns seconds. */
static double decode_steps(hel_model *m, struct bench *b, const hel_token *prompt, uint32_t n,
			   uint32_t group)
{
	const hel_core *c = b->c;
	uint32_t pt = c->page_tokens;
	CHECK_OK(hel_model_row_init(m, 0));
	CHECK_OK(hel_model_prefill(m, 0, b->table, n / pt, prompt, n, b->logits));
	hel_token next = hel_sample(b->logits, c->vocab, NULL, n);
	double t0 = now();
	for (uint32_t i = 0; i < DECODE; i++) {
		uint64_t pos = n + i;
		uint32_t np = (uint32_t)(pos / pt);
		if (group > 1 && i % group == 0)
			hel_model_launch_begin(m);
		CHECK_OK(hel_model_step(m, 0, b->table, np, next, b->table[np], b->logits));
		if (group > 1 && (i + 1) % group == 0)
			hel_model_launch_end(m);
		next = hel_sample(b->logits, c->vocab, NULL, pos + 1);
	}
	return now() - t0;
}

struct rounds {
	double seconds;
	uint64_t tokens, rounds, proposed, accepted;
};

/* DECODE tokens in rounds of hel_model_decode from the prefilled prompt. */
static void decode_rounds(hel_model *m, struct bench *b, const hel_token *prompt, uint32_t n,
			  uint32_t draft, struct rounds *out)
{
	const hel_core *c = b->c;
	uint32_t pt = c->page_tokens;
	CHECK_OK(hel_model_row_init(m, 0));
	CHECK_OK(hel_model_prefill(m, 0, b->table, n / pt, prompt, n, b->logits));
	hel_token pending = hel_sample(b->logits, c->vocab, NULL, n);
	uint64_t pos = n, done = 0;
	memset(out, 0, sizeof *out);
	double t0 = now();
	while (done < DECODE) {
		uint32_t np = (uint32_t)(pos / pt);
		hel_decode_opts o = {.max_tokens = (uint32_t)(DECODE - done),
				     .draft_tokens = draft};
		hel_round r;
		CHECK_OK(hel_model_decode(m, 0, b->table, np, b->table[np], pending, &o, &r));
		pos += r.n_tokens;
		done += r.n_tokens;
		pending = r.tokens[r.n_tokens - 1];
		out->rounds++;
		out->proposed += r.n_proposed;
		out->accepted += r.accepted;
	}
	out->seconds = now() - t0;
	out->tokens = done;
}

static void ordinary(struct bench *b, const char *path)
{
	const hel_core *c = b->c;
	uint32_t pt = c->page_tokens;
	uint32_t prompt_n =
		PROMPT + DECODE < c->max_context ? PROMPT : (uint32_t)c->max_context / 2;
	uint32_t pages = (prompt_n + DECODE) / pt + 2;
	hel_model *m;
	hel_model_opts o = {.mode = SEL_MODE_ORDINARY, .pages = pages, .rows = 1};
	if (hel_model_create(c, &o, &m)) {
		fprintf(stderr, "%s: %s\n", path, sel_errmsg());
		exit(1);
	}
	hel_token *prompt = malloc(prompt_n * sizeof *prompt);
	test_rng rng;
	test_rng_init(&rng, 1);
	for (uint32_t i = 0; i < prompt_n; i++)
		prompt[i] = (hel_token)test_rng_below(&rng, 256);

	/* Prefill: whole prompts into a fresh row (initialising it is not
	 * counted), the best of rounds until the budget is spent. */
	double spent = 0, best = 1e30;
	int rounds = 0;
	do {
		CHECK_OK(hel_model_row_init(m, 0));
		double t0 = now();
		CHECK_OK(hel_model_prefill(m, 0, b->table, prompt_n / pt, prompt, prompt_n,
					   b->logits));
		double t = now() - t0;
		spent += t;
		best = t < best ? t : best;
	} while (spent < b->budget && ++rounds < 64);
	double prefill = prompt_n / best;

	/* Decode: greedy, logits every token, one launch per token; then
	 * eight tokens per launch, which tells the weight stream a launch
	 * pays from the work of a position. */
	double one = 1e30, eight = 1e30;
	spent = 0;
	rounds = 0;
	do {
		double t1 = decode_steps(m, b, prompt, prompt_n, 1);
		double t8 = decode_steps(m, b, prompt, prompt_n, 8);
		spent += t1 + t8;
		one = t1 < one ? t1 : one;
		eight = t8 < eight ? t8 : eight;
	} while (spent < 2 * b->budget && ++rounds < 64);
	double per_tok = one / DECODE, per_tok8 = eight / DECODE;
	double launch = (per_tok - per_tok8) * 8 / 7, position = per_tok - launch;

	printf("# %s: %u ranks, page record %llu B, row %llu B per rank, %u-token prompt\n",
	       c->name, c->ranks, (unsigned long long)hel_core_page_bytes(c, SEL_MODE_ORDINARY),
	       (unsigned long long)hel_model_layout(m)->bytes, prompt_n);
	printf("RESULT model_%s_prefill_tok_s %.0f tok/s\n", b->name, prefill);
	printf("RESULT model_%s_decode_tok_s %.0f tok/s\n", b->name, 1.0 / per_tok);
	printf("RESULT model_%s_launch_weights_us %.2f us\n", b->name, launch * 1e6);
	printf("RESULT model_%s_position_us %.2f us\n", b->name, position * 1e6);
	fflush(stdout);
	free(prompt);
	hel_model_destroy(m);
}

/* The two prompts of the speculative comparison. */
static uint32_t spec_prompt(int kind, hel_token *t, uint32_t cap)
{
	static const char *fox = "the quick brown fox jumps over the lazy dog. ";
	static const char *note =
		"Please write a short note to the team about the planning meeting on Thursday "
		"afternoon. We will go through the schedule for the next release, the open issues in "
		"the tracker that still need an owner, and who takes the on-call shift next week. "
		"Ask everyone to read the design notes before the meeting and to bring questions. "
		"Keep it friendly and brief, and thank the people who fixed the build last week.";
	if (kind == 0) {
		t[0] = HEL_TOK_BEGIN;
		for (uint32_t i = 1; i < cap && i < SPEC_PROMPT; i++)
			t[i] = (hel_token)fox[(i - 1) % strlen(fox)];
		return cap < SPEC_PROMPT ? cap : SPEC_PROMPT;
	}
	hel_message msg = {.role = "user", .content = note, .content_len = strlen(note)};
	size_t n = hel_chat_template(&msg, 1, true, t, cap);
	return (uint32_t)(n < cap ? n : cap);
}

static void speculative(struct bench *b)
{
	const hel_core *c = b->c;
	static const char *prompts[] = {"repetitive", "ordinary"};
	static const sel_state_mode modes[] = {SEL_MODE_ORDINARY, SEL_MODE_COPY, SEL_MODE_LEARNED};
	static const char *mode_names[] = {"off", "copy", "learned"};
	const char *env = getenv("MODEL_BENCH_DRAFT");
	uint32_t draft = env ? (uint32_t)atoi(env) : HEL_DRAFT_DEFAULT;
	uint32_t pages = (SPEC_PROMPT + DECODE) / c->page_tokens + 2;
	hel_model *m[3];
	for (int k = 0; k < 3; k++) {
		hel_model_opts o = {
			.mode = modes[k], .pages = pages, .rows = 1, .draft_tokens = draft};
		CHECK_OK(hel_model_create(c, &o, &m[k]));
	}
	hel_token prompt[SPEC_PROMPT];
	for (int p = 0; p < 2; p++) {
		uint32_t n = spec_prompt(p, prompt, SPEC_PROMPT);
		struct rounds best[3], r;
		for (int k = 0; k < 3; k++)
			best[k].seconds = 1e30;
		/* The modes interleaved, the best of each. */
		double spent = 0;
		int rounds = 0;
		do {
			for (int k = 0; k < 3; k++) {
				decode_rounds(m[k], b, prompt, n, draft, &r);
				spent += r.seconds;
				if (r.seconds < best[k].seconds)
					best[k] = r;
			}
		} while (spent < 3 * b->budget && ++rounds < 64);
		double base = best[0].tokens / best[0].seconds;
		for (int k = 0; k < 3; k++) {
			double rate = best[k].tokens / best[k].seconds;
			const char *mn = mode_names[k];
			printf("RESULT model_%s_%s_%s_decode_tok_s %.0f tok/s\n", b->name,
			       prompts[p], mn, rate);
			printf("RESULT model_%s_%s_%s_acceptance %.3f ratio\n", b->name, prompts[p],
			       mn,
			       best[k].proposed ? (double)best[k].accepted / best[k].proposed
						: 0.0);
			printf("RESULT model_%s_%s_%s_tokens_per_round %.2f tokens\n", b->name,
			       prompts[p], mn, (double)best[k].tokens / best[k].rounds);
			printf("RESULT model_%s_%s_%s_speedup %.2f x\n", b->name, prompts[p], mn,
			       rate / base);
		}
		fflush(stdout);
	}
	for (int k = 0; k < 3; k++)
		hel_model_destroy(m[k]);
}

static void bench_core(const char *path, double budget)
{
	hel_core *c;
	char err[512];
	if (hel_core_load(path, &c, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	struct bench b = {.c = c, .budget = budget};
	snprintf(b.name, sizeof b.name, "%s", c->name);
	for (char *p = b.name; *p; p++)
		if (*p == '-' || *p == '.')
			*p = '_';
	uint32_t pages = (PROMPT + 2 * DECODE + SPEC_PROMPT) / c->page_tokens + 4;
	b.table = malloc(pages * sizeof *b.table);
	b.logits = malloc(c->vocab * 4);
	for (uint32_t i = 0; i < pages; i++)
		b.table[i] = i;
	ordinary(&b, path);
	if (hel_core_supports(c, SEL_MODE_COPY) && hel_core_supports(c, SEL_MODE_LEARNED))
		speculative(&b);
	free(b.table);
	free(b.logits);
	hel_core_free(c);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	const char *env = getenv("MODEL_BENCH_SECONDS");
	double budget = env ? atof(env) : 0.4;
	const char *dir = bench_cores_dir();
	char path[PATH_MAX + 300];

	if (argc > 1) {
		for (int i = 1; i < argc; i++) {
			if (strchr(argv[i], '/'))
				snprintf(path, sizeof path, "%s", argv[i]);
			else
				snprintf(path, sizeof path, "%s/%s.core", dir, argv[i]);
			bench_core(path, budget);
		}
		return 0;
	}
	DIR *d = opendir(dir);
	if (!d) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		return 1;
	}
	char *names[256];
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < 256) {
		size_t l = strlen(e->d_name);
		if (l > 5 && strcmp(e->d_name + l - 5, ".core") == 0)
			names[n++] = strdup(e->d_name);
	}
	closedir(d);
	qsort(names, (size_t)n, sizeof *names, name_cmp);
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		bench_core(path, budget);
		free(names[i]);
	}
	return 0;
}
