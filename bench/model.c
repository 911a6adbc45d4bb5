/*
 * bench/model.c - the synthetic model's prefill and decode speed for every
 * shipped core, so a restore's time can be set against recomputing the same
 * tokens (design 2.10's fetch decision compares exactly these).
 *
 *   build/bench/model [CORE...]     (default: every core in cores/)
 *
 * Prints, per core (dashes in names become underscores):
 *   RESULT model_<core>_prefill_tok_s <v> tok/s
 *   RESULT model_<core>_decode_tok_s <v> tok/s
 * and a comment line with the page record and row sizes.  Ordinary mode,
 * one thread; prefill is one chunk with logits for its last token, decode
 * is greedy with logits every token.  Each measurement runs for about
 * MODEL_BENCH_SECONDS (default 0.4) of model time.
 */
#include <dirent.h>
#include <limits.h>
#include <time.h>
#include <unistd.h>

#include "benchlib.h"
#include "helios/core.h"
#include "helios/model.h"
#include "../tests/testutil.h"

#define PROMPT 2048
#define DECODE 256

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench_core(const char *path, double budget)
{
	hel_core *c;
	char err[512];
	if (hel_core_load(path, &c, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	uint32_t pt = c->page_tokens;
	uint32_t prompt_n = PROMPT + DECODE < c->max_context ? PROMPT : (uint32_t)c->max_context / 2;
	uint32_t pages = (prompt_n + DECODE) / pt + 2;
	hel_model *m;
	hel_model_opts o = { .mode = SEL_MODE_ORDINARY, .pages = pages, .rows = 1 };
	if (hel_model_create(c, &o, &m)) {
		fprintf(stderr, "%s: %s\n", path, sel_errmsg());
		exit(1);
	}
	hel_token *prompt = malloc(prompt_n * sizeof *prompt);
	uint32_t *table = malloc(pages * sizeof *table);
	int32_t *logits = malloc(c->vocab * 4);
	test_rng rng;
	test_rng_init(&rng, 1);
	for (uint32_t i = 0; i < prompt_n; i++)
		prompt[i] = (hel_token)test_rng_below(&rng, 256);
	for (uint32_t i = 0; i < pages; i++)
		table[i] = i;

	/* Prefill: whole prompts into a fresh row (initialising it is not
	 * counted), repeated until the budget is spent. */
	double spent = 0;
	uint64_t tokens = 0;
	do {
		CHECK_OK(hel_model_row_init(m, 0));
		double t0 = now();
		CHECK_OK(hel_model_prefill(m, 0, table, prompt_n / pt, prompt, prompt_n, logits));
		spent += now() - t0;
		tokens += prompt_n;
	} while (spent < budget && tokens < 64ull * prompt_n);
	double prefill = (double)tokens / spent;

	/* Decode: greedy, logits every token, from the prefilled row. */
	spent = 0;
	tokens = 0;
	do {
		CHECK_OK(hel_model_row_init(m, 0));
		CHECK_OK(hel_model_prefill(m, 0, table, prompt_n / pt, prompt, prompt_n, logits));
		hel_token next = hel_sample(logits, c->vocab, NULL, prompt_n);
		double t0 = now();
		for (uint32_t i = 0; i < DECODE; i++) {
			uint64_t pos = prompt_n + i;
			uint32_t np = (uint32_t)(pos / pt);
			CHECK_OK(hel_model_step(m, 0, table, np, next, table[np], logits));
			next = hel_sample(logits, c->vocab, NULL, pos + 1);
		}
		spent += now() - t0;
		tokens += DECODE;
	} while (spent < budget && tokens < 64ull * DECODE);
	double decode = (double)tokens / spent;

	char name[HEL_NAME_MAX + 1];
	snprintf(name, sizeof name, "%s", c->name);
	for (char *p = name; *p; p++)
		if (*p == '-' || *p == '.')
			*p = '_';
	printf("# %s: %u ranks, page record %llu B, row %llu B per rank, %u-token prompt\n", c->name,
	       c->ranks, (unsigned long long)hel_core_page_bytes(c, SEL_MODE_ORDINARY),
	       (unsigned long long)hel_model_layout(m)->bytes, prompt_n);
	printf("RESULT model_%s_prefill_tok_s %.0f tok/s\n", name, prefill);
	printf("RESULT model_%s_decode_tok_s %.0f tok/s\n", name, decode);
	fflush(stdout);
	free(prompt);
	free(table);
	free(logits);
	hel_model_destroy(m);
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
