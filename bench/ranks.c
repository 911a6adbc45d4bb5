/*
 * ranks.c - the cost of running a core's ranks as separate processes
 * (src/helios/ranks.c; docs/multihost.md "Execution"): the same prefill and
 * decode on the same core in one process (the baseline, same run) and as
 * one process per rank on loopback, whose every step adds two reductions
 * (three when it completes a page) over TCP.
 *
 *   RESULT ranks_<core>_one_decode_us <v> us       a decode step, one process
 *   RESULT ranks_<core>_procs_decode_us <v> us     the same, a process per rank
 *   RESULT ranks_<core>_decode_ratio <v> x         procs / one
 *   RESULT ranks_<core>_procs_prefill_tok_s <v> tok/s
 *   RESULT ranks_<core>_prefill_ratio <v> x        one's throughput / procs'
 *
 * Loopback is the floor of a real fabric's latency; a RoCE or TCP fabric
 * between hosts adds its round trip to each reduction.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "benchlib.h"
#include "eos.h"
#include "helios/core.h"
#include "helios/model.h"
#include "helios/ranks.h"

#define PROMPT 2048
#define DECODE 256

static double run(hel_model *m, double *prefill_tok_s)
{
	const hel_core *c = hel_model_core(m);
	uint32_t pt = c->page_tokens, pages[128], np = 0, next = 0;
	hel_token t[PROMPT];
	for (int i = 0; i < PROMPT; i++)
		t[i] = 0x20 + (uint32_t)(i * 31 % 95);
	if (hel_model_row_init(m, 0))
		return -1;
	while (np < PROMPT / pt)
		pages[np++] = next++;
	uint64_t t0 = eos_now_ns();
	if (hel_model_prefill(m, 0, pages, np, t, PROMPT, NULL))
		return -1;
	uint64_t t1 = eos_now_ns();
	*prefill_tok_s = PROMPT / ((t1 - t0) / 1e9);
	hel_token x = 'a';
	for (int i = 0; i < DECODE; i++) {
		uint64_t n = PROMPT + (uint64_t)i;
		uint32_t nx = n % pt == pt - 1 ? next++ : HEL_NO_PAGE;
		if (hel_model_step(m, 0, pages, np, x, nx, NULL))
			return -1;
		if (nx != HEL_NO_PAGE)
			pages[np++] = nx;
		x = 0x20 + (x * 7 + 3) % 95;
	}
	return (eos_now_ns() - t1) / 1e3 / DECODE;
}

static int bench(const char *name)
{
	char path[4096], err[512];
	snprintf(path, sizeof path, "%s/%s.core", bench_cores_dir(), name);
	hel_core *c;
	if (hel_core_load(path, &c, err, sizeof err)) {
		fprintf(stderr, "ranks: %s\n", err);
		return 1;
	}
	hel_model_opts o = {.mode = SEL_MODE_ORDINARY, .pages = 128, .rows = 2};
	hel_model *m;
	double p1, pn;
	if (hel_model_create(c, &o, &m))
		return 1;
	double one = run(m, &p1);
	hel_model_destroy(m);

	struct hel_ranks_config cfg = {.core = c, .world = c->ranks, .rendezvous = "127.0.0.1:0"};
	hel_ranks *g;
	pid_t pid[64];
	if (hel_ranks_listen(&cfg, &g))
		return 1;
	fflush(stdout);
	for (uint32_t r = 1; r < c->ranks; r++)
		if ((pid[r] = fork()) == 0) {
			struct hel_ranks_config pc = {.core = c,
						      .world = c->ranks,
						      .rank = r,
						      .rendezvous = hel_ranks_address(g)};
			_exit(hel_ranks_peer(&pc) ? 1 : 0);
		}
	o.tp = hel_ranks_tp(g);
	double procs = -1;
	if (hel_ranks_join(g) == 0 && hel_model_create(c, &o, &m) == 0) {
		procs = run(m, &pn);
		hel_model_destroy(m);
	}
	hel_ranks_close(g, NULL);
	for (uint32_t r = 1; r < c->ranks; r++)
		waitpid(pid[r], NULL, 0);
	if (one < 0 || procs < 0) {
		fprintf(stderr, "ranks: %s: %s\n", name, eos_errmsg());
		return 1;
	}
	printf("RESULT ranks_%s_one_decode_us %.1f us\n", name, one);
	printf("RESULT ranks_%s_procs_decode_us %.1f us\n", name, procs);
	printf("RESULT ranks_%s_decode_ratio %.2f x\n", name, procs / one);
	printf("RESULT ranks_%s_procs_prefill_tok_s %.0f tok/s\n", name, pn);
	printf("RESULT ranks_%s_prefill_ratio %.2f x\n", name, p1 / pn);
	hel_core_free(c);
	return 0;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	return bench("qwen-tp2-small") || bench("qwen-tp4-small");
}
