/*
 * ranks_run.c - the rank flags of `flare run` (ranks_run.h).
 *
 * Rank 0 is the ordinary `flare run` with its model's calls mirrored to
 * the peers (the engine takes hel_ranks_tp); a peer serves no HTTP and
 * runs no engine: it makes its rank's model when rank 0 says START and
 * runs what rank 0 sends until rank 0 stops (src/helios/ranks.c).
 */
#include "flare/ranks_run.h"

#include "flare/serve.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eos.h"
#include "shard_link.h"

/* FLARE_TEST_RANK_LINK="queue_jobs=N,job_timeout_ms=N,sock_buf=N,block_stores"
 * (tests only; docs/multihost.md "Fault tests"). */
static void test_knobs(struct hel_ranks_config *c)
{
	const char *e = getenv("FLARE_TEST_RANK_LINK");
	if (!e)
		return;
	char buf[256];
	snprintf(buf, sizeof buf, "%s", e);
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		unsigned long long v = 0;
		if (sscanf(t, "queue_jobs=%llu", &v) == 1)
			c->test_queue_jobs = (uint32_t)v;
		else if (sscanf(t, "job_timeout_ms=%llu", &v) == 1)
			c->test_job_timeout_ns = v * 1000000ull;
		else if (sscanf(t, "sock_buf=%llu", &v) == 1)
			c->test_sock_buf = (int)v;
		else if (sscanf(t, "user_timeout_ms=%llu", &v) == 1)
			sel_shard_test_user_timeout((unsigned int)v);
		else if (sscanf(t, "join_delay_ms=%llu", &v) == 1)
			c->test_join_delay_ms = (uint32_t)v;
		else if (!strcmp(t, "block_stores"))
			c->test_block_stores = true;
	}
	fprintf(stderr, "flare: test knobs: FLARE_TEST_RANK_LINK=%s\n", e);
}

bool flare_ranks_on(const struct flare_settings *s)
{
	return (s->set & (1ull << FLARE_OPT_RANKS)) && s->ranks > 1;
}

int flare_ranks_check(const struct flare_settings *s, const hel_core *core)
{
	if (!flare_ranks_on(s)) {
		if ((s->set & (1ull << FLARE_OPT_RANK)) && s->rank > 0) {
			fprintf(stderr, "flare: --rank %u without --ranks N (N > 1)\n", s->rank);
			return -1;
		}
		return 0; /* --ranks 1: every rank in this process, as without it */
	}
	const char *why = NULL;
	char b[256];
	if (s->ranks != core->ranks) {
		snprintf(b, sizeof b, "--ranks %u: core '%s' has %u ranks", s->ranks, core->name,
			 core->ranks);
		why = b;
	} else if (s->rank >= s->ranks) {
		snprintf(b, sizeof b, "--rank %u: expected 0..%u", s->rank, s->ranks - 1);
		why = b;
	} else if (!s->rendezvous[0]) {
		why = "--ranks needs --rendezvous HOST:PORT (rank 0's address for the peers)";
	} else if (s->memory) {
		why = "--prefix-cache-memory: ranks on separate hosts keep records on disk only: a "
		      "memory tier would hold every rank's bytes in one process; set "
		      "--prefix-cache-memory 0";
	} else if (s->speculate != SEL_MODE_ORDINARY) {
		why = "--speculate: ranks in separate processes decode without speculation (not "
		      "supported yet); use --speculate off";
	}
	if (why) {
		fprintf(stderr, "flare: %s\n", why);
		return -1;
	}
	return 0;
}

int flare_ranks_peer(const struct flare_settings *s, const hel_core *core)
{
	char note[FLARE_PATH_MAX + 512];
	struct hel_ranks_config cfg = {.core = core,
				       .world = s->ranks,
				       .rank = s->rank,
				       .rendezvous = s->rendezvous,
				       .disk_dir = flare_disk_resolve(s, note, sizeof note),
				       .disk_limit = s->disk_limit,
				       .disk_limit_set =
					       (s->set & (1ull << FLARE_OPT_DISK_LIMIT)) != 0};
	test_knobs(&cfg);
	fprintf(stderr, "flare: rank %u of %u (core '%s'): joining rank 0 at %s\n", s->rank,
		s->ranks, core->name, s->rendezvous);
	int rc = hel_ranks_peer(&cfg);
	if (rc) {
		fprintf(stderr, "flare: %s\n", eos_errmsg()); /* it names the rank */
		return 1;
	}
	fprintf(stderr, "flare: rank %u: rank 0 closed the instance; stopped\n", s->rank);
	return 0;
}

static void print_links(void *ctx, uint16_t port)
{
	(void)ctx;
	fprintf(stderr,
		"flare: rank 0: the rank links of the disk store listen on port %u (plaintext: "
		"keep it on a trusted fabric)\n",
		port);
}

static void raise_stop(void *ctx, const char *why)
{
	(void)ctx;
	(void)why; /* the main thread reads hel_ranks_failure */
	kill(getpid(), SIGUSR1);
}

int flare_ranks_lead(const struct flare_settings *s, const hel_core *core, hel_ranks **out)
{
	struct hel_ranks_config cfg = {.core = core,
				       .world = s->ranks,
				       .rank = 0,
				       .rendezvous = s->rendezvous,
				       .dead = raise_stop,
				       .links = print_links};
	test_knobs(&cfg);
	if (hel_ranks_listen(&cfg, out)) {
		fprintf(stderr, "flare: %s\n", eos_errmsg());
		return -1;
	}
	fprintf(stderr,
		"flare: rank 0 of %u (core '%s'): rendezvous on %s; waiting for the peers\n",
		s->ranks, core->name, hel_ranks_address(*out));
	if (hel_ranks_join(*out)) {
		char why[EOS_ERRMSG_MAX];
		snprintf(why, sizeof why, "%s", eos_errmsg());
		fprintf(stderr, "flare: %s\n", why);
		hel_ranks_close(*out, why);
		*out = NULL;
		return -1;
	}
	fprintf(stderr, "flare: rank 0: every rank joined\n");
	return 0;
}
