/*
 * test_ranks.c - one core's ranks as separate processes (src/helios/ranks.c,
 * the model's tp mode; design 2.8, 2.14; docs/multihost.md "Execution").
 *
 * Rank 0 in this process, each peer a forked process, on loopback:
 *   - the same calls give bit-identical logits and tokens to the same core
 *     in one process (prefill in chunks, decode, a row copy, reloaded pages
 *     and rows, a refused row), for the TP2 and TP4 small cores;
 *   - the peers exit 0 after rank 0's BYE;
 *   - a peer killed stops the group: the next call fails naming the rank,
 *     the dead callback runs once (also when it dies idle);
 *   - a peer with another core fails the join (SEL_EIDENTITY) and exits 1;
 *     a stray connection sending garbage is refused and the join goes on;
 *   - a peer that finds no rank 0 gives up at its deadline.
 */
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netdb.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"
#include "helios/core.h"
#include "helios/model.h"
#include "helios/ranks.h"
#include "testutil.h"

static hel_core *load(const char *name)
{
	char path[4096], exe[4000], err[512];
	const char *src = getenv("SELENE_SRCDIR");
	if (src && *src) {
		snprintf(path, sizeof path, "%s/cores/%s.core", src, name);
	} else {
		ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
		CHECK(n > 0);
		exe[n] = 0;
		for (;;) {
			char *slash = strrchr(exe, '/');
			CHECK(slash && slash != exe);
			*slash = 0;
			snprintf(path, sizeof path, "%s/cores/%s.core", exe, name);
			if (access(path, R_OK) == 0)
				break;
		}
	}
	hel_core *c;
	CHECKF(hel_core_load(path, &c, err, sizeof err) == 0, "%s", err);
	return c;
}

static pid_t spawn_peer(const hel_core *c, uint32_t rank, const char *addr, uint64_t join_ns)
{
	fflush(stdout); /* a child must not print the parent's buffer again */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct hel_ranks_config pc = {.core = c,
					      .world = c->ranks,
					      .rank = rank,
					      .rendezvous = addr,
					      .join_ns = join_ns};
		int rc = hel_ranks_peer(&pc);
		if (rc)
			fprintf(stderr, "peer %u: %s\n", rank, eos_errmsg());
		_exit(rc ? 1 : 0);
	}
	return pid;
}

static int wait_exit(pid_t pid)
{
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static atomic_int dead_calls;
static char dead_why[1024];
static void on_dead(void *ctx, const char *why)
{
	(void)ctx;
	snprintf(dead_why, sizeof dead_why, "%s", why);
	atomic_fetch_add(&dead_calls, 1);
}

struct group {
	hel_ranks *g;
	pid_t pid[8];
	hel_model *m;
};

static uint64_t step_ns; /* 0: the default */

static void group_open(struct group *gr, const hel_core *c, uint32_t pages, uint32_t rows)
{
	struct hel_ranks_config cfg = {.core = c,
				       .world = c->ranks,
				       .rank = 0,
				       .rendezvous = "127.0.0.1:0",
				       .join_ns = 20000000000ull,
				       .step_ns = step_ns,
				       .dead = on_dead};
	CHECK_OK(hel_ranks_listen(&cfg, &gr->g));
	for (uint32_t r = 1; r < c->ranks; r++)
		gr->pid[r] = spawn_peer(c, r, hel_ranks_address(gr->g), 20000000000ull);
	CHECK_OK(hel_ranks_join(gr->g));
	hel_model_opts o = {
		.mode = SEL_MODE_ORDINARY, .pages = pages, .rows = rows, .tp = hel_ranks_tp(gr->g)};
	CHECK_OK(hel_model_create(c, &o, &gr->m));
}

static void group_close(struct group *gr, const hel_core *c, int want_exit)
{
	hel_model_destroy(gr->m);
	hel_ranks_close(gr->g, NULL);
	for (uint32_t r = 1; r < c->ranks; r++) {
		int st = wait_exit(gr->pid[r]);
		CHECKF(st == want_exit, "peer %u exited %d, expected %d", r, st, want_exit);
	}
}

/* ---- the same tokens ---------------------------------------------------------- */

#define NP 96
struct seq {
	uint32_t slot, pages[NP], np, next;
};

static void prefill(hel_model *m, struct seq *s, const hel_token *t, size_t n, int32_t *lg)
{
	uint32_t pt = hel_model_core(m)->page_tokens;
	uint64_t c;
	CHECK_OK(hel_model_row_consumed(m, s->slot, &c));
	while (s->np < (c + n) / pt)
		s->pages[s->np++] = s->next++;
	CHECK_OK(hel_model_prefill(m, s->slot, s->pages, s->np, t, n, lg));
}

static hel_token decode(hel_model *m, struct seq *s, hel_token pending, int32_t *lg)
{
	uint32_t pt = hel_model_core(m)->page_tokens, V = hel_model_core(m)->vocab;
	uint64_t c;
	CHECK_OK(hel_model_row_consumed(m, s->slot, &c));
	uint32_t next = c % pt == pt - 1 ? s->next++ : HEL_NO_PAGE;
	hel_decode_opts o = {.max_tokens = 1, .stop_on_end = false};
	hel_round r;
	CHECK_OK(hel_model_decode(m, s->slot, s->pages, s->np, next, pending, &o, &r));
	if (r.page_used)
		s->pages[s->np++] = next;
	CHECK(r.n_tokens == 1);
	memcpy(lg, r.logits[0], V * 4);
	return r.tokens[0];
}

/* Run one script on a model; logits and tokens into out. */
static void script(hel_model *m, int32_t *out, size_t per)
{
	const hel_core *c = hel_model_core(m);
	uint32_t V = c->vocab;
	hel_token prompt[300];
	for (int i = 0; i < 300; i++)
		prompt[i] = 0x20 + (uint32_t)((i * 7919 + i / 5) % 95);
	struct seq a = {.slot = 0}, b = {.slot = 1};
	CHECK_OK(hel_model_row_init(m, 0));
	prefill(m, &a, prompt, 100, NULL);
	prefill(m, &a, prompt + 100, 1, NULL);
	prefill(m, &a, prompt + 101, 99, out);
	hel_token t = hel_sample(out, V, NULL, 200);
	for (int i = 1; i <= 40; i++) {
		t = decode(m, &a, t, out + (size_t)i * V);
		out[(size_t)i * V] ^= (int32_t)t; /* the token too */
	}
	/* A branch: the row copied, then its pages reloaded (a restore of the
	 * same bytes), the row reloaded, and decoding on. */
	CHECK_OK(hel_model_row_copy(m, 0, 1));
	b = a;
	b.slot = 1;
	for (uint32_t i = 0; i < b.np; i++)
		CHECK_OK(hel_model_page_loaded(m, b.pages[i]));
	uint64_t n;
	CHECK_OK(hel_model_row_consumed(m, 1, &n));
	CHECK_RC(hel_model_row_loaded(m, 1, n + 1), SEL_ECORRUPT);
	CHECK_OK(hel_model_row_loaded(m, 1, n));
	b.next = a.next + 10;
	for (int i = 41; i < (int)per; i++)
		t = decode(m, &b, t, out + (size_t)i * V);
	CHECK_OK(hel_model_logits(m, 1, b.pages, b.np, out + (size_t)per * V));
}

static void test_same_tokens(const char *name)
{
	hel_core *c = load(name);
	size_t per = 60, V = c->vocab;
	int32_t *one = calloc((per + 1) * V, 4), *many = calloc((per + 1) * V, 4);
	hel_model *m;
	hel_model_opts o = {.mode = SEL_MODE_ORDINARY, .pages = 64, .rows = 4};
	CHECK_OK(hel_model_create(c, &o, &m));
	script(m, one, per);
	hel_model_destroy(m);

	struct group gr;
	group_open(&gr, c, 64, 4);
	script(gr.m, many, per);
	CHECK_OK(hel_model_check(gr.m));
	group_close(&gr, c, 0);
	CHECKF(memcmp(one, many, (per + 1) * V * 4) == 0,
	       "%s: %u processes differ from one process", name, c->ranks);
	printf("%s: %u processes give the logits and tokens of one\n", name, c->ranks);
	free(one);
	free(many);
	hel_core_free(c);
}

/* ---- faults ----------------------------------------------------------------------- */

static bool wait_dead(int want)
{
	uint64_t dl = eos_now_ns() + 10000000000ull;
	while (atomic_load(&dead_calls) < want && eos_now_ns() < dl) {
		struct timespec ts = {0, 2000000};
		nanosleep(&ts, NULL);
	}
	return atomic_load(&dead_calls) == want;
}

static void test_killed(void)
{
	hel_core *c = load("qwen-tp2-small");
	struct group gr;
	atomic_store(&dead_calls, 0);
	group_open(&gr, c, 16, 2);
	CHECK_OK(hel_model_row_init(gr.m, 0));
	hel_token t[10] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'};
	CHECK_OK(hel_model_prefill(gr.m, 0, NULL, 0, t, 10, NULL));
	kill(gr.pid[1], SIGKILL);
	CHECK(wait_exit(gr.pid[1]) == 128 + SIGKILL);
	/* Idle: the watcher says so; then every call fails with the reason. */
	CHECKF(wait_dead(1), "the dead callback ran %d times", atomic_load(&dead_calls));
	CHECK(strstr(dead_why, "rank 1") && strstr(dead_why, "closed"));
	CHECK_RC(hel_model_prefill(gr.m, 0, NULL, 0, t, 1, NULL), SEL_ESTOPPED);
	CHECK(strstr(eos_errmsg(), "rank 1"));
	CHECK_RC(hel_model_row_init(gr.m, 1), SEL_ESTOPPED);
	CHECK(atomic_load(&dead_calls) == 1);
	CHECK(hel_ranks_failure(gr.g) != NULL);
	hel_model_destroy(gr.m);
	hel_ranks_close(gr.g, NULL);
	printf("a killed peer stops the group: %s\n", dead_why);
	hel_core_free(c);
}

/* A peer that stops (SIGSTOP): the step's exchange times out and stops
 * the group; nothing hangs. */
static void test_stalled(void)
{
	hel_core *c = load("qwen-tp2-small");
	struct group gr;
	atomic_store(&dead_calls, 0);
	step_ns = 300000000ull;
	group_open(&gr, c, 16, 2);
	step_ns = 0;
	CHECK_OK(hel_model_row_init(gr.m, 0));
	hel_token t[4] = {'a', 'b', 'c', 'd'};
	kill(gr.pid[1], SIGSTOP);
	uint64_t t0 = eos_now_ns();
	CHECK_RC(hel_model_prefill(gr.m, 0, NULL, 0, t, 4, NULL), SEL_ESTOPPED);
	uint64_t took = eos_now_ns() - t0;
	CHECKF(strstr(eos_errmsg(), "rank 1") && strstr(eos_errmsg(), "in time"), "%s",
	       eos_errmsg());
	CHECKF(took < 20000000000ull, "the stop took %llu ms",
	       (unsigned long long)(took / 1000000));
	CHECK(atomic_load(&dead_calls) == 1);
	hel_model_destroy(gr.m);
	hel_ranks_close(gr.g, NULL);
	kill(gr.pid[1], SIGCONT);
	CHECK(wait_exit(gr.pid[1]) == 1); /* rank 0's connection closed */
	printf("a stopped peer stops the group after the step deadline (%llu ms)\n",
	       (unsigned long long)(took / 1000000));
	hel_core_free(c);
}

/* Another core on rank 1; before it, a stray connection sending garbage. */
static void test_refused(void)
{
	hel_core *c = load("qwen-tp2-small"), *other = load("deepseek-tp2-small");
	struct hel_ranks_config cfg = {.core = c,
				       .world = 2,
				       .rank = 0,
				       .rendezvous = "127.0.0.1:0",
				       .join_ns = 20000000000ull};
	hel_ranks *g;
	CHECK_OK(hel_ranks_listen(&cfg, &g));
	/* A stray connection first: refused, the join goes on. */
	struct addrinfo *ai, hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
	char host[64], *port;
	snprintf(host, sizeof host, "%s", hel_ranks_address(g));
	port = strrchr(host, ':');
	*port++ = 0;
	CHECK(getaddrinfo(host, port, &hints, &ai) == 0);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(connect(fd, ai->ai_addr, ai->ai_addrlen) == 0);
	freeaddrinfo(ai);
	CHECK(write(fd, "GET / HTTP/1.0\r\n\r\n", 18) == 18);
	pid_t pid = spawn_peer(other, 1, hel_ranks_address(g), 20000000000ull);
	CHECK_RC(hel_ranks_join(g), SEL_EIDENTITY);
	CHECK(strstr(eos_errmsg(), "rank 1 runs another core"));
	printf("refused: %s\n", eos_errmsg());
	CHECK(wait_exit(pid) == 1);
	close(fd);
	hel_ranks_close(g, NULL);

	/* No rank 0 at all: the peer gives up at its deadline. */
	CHECK_OK(hel_ranks_listen(&cfg, &g));
	char addr[128];
	snprintf(addr, sizeof addr, "%s", hel_ranks_address(g));
	hel_ranks_close(g, NULL); /* nobody listens there now */
	struct hel_ranks_config pc = {
		.core = c, .world = 2, .rank = 1, .rendezvous = addr, .join_ns = 300000000ull};
	CHECK_RC(hel_ranks_peer(&pc), -ETIMEDOUT);
	CHECK(strstr(eos_errmsg(), "cannot reach rank 0"));
	/* Settings refused before anything. */
	pc.rendezvous = "nohostport";
	CHECK_RC(hel_ranks_peer(&pc), -EINVAL);
	pc.rendezvous = addr;
	pc.world = 3;
	CHECK_RC(hel_ranks_peer(&pc), -EINVAL);
	CHECK(strstr(eos_errmsg(), "has 2 ranks"));
	hel_core_free(c);
	hel_core_free(other);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	test_same_tokens("qwen-tp2-small");
	test_same_tokens("deepseek-tp2-small");
	test_same_tokens("qwen-tp4-small");
	test_killed();
	test_stalled();
	test_refused();
	printf("ok\n");
	return 0;
}
