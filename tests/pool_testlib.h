/*
 * pool_testlib.h - what the pool tests share: a real `flare pool` process
 * started and stopped by pid, its /metrics read over loopback, pool clients
 * with an event backlog and waits with deadlines, a small host geometry
 * (the scope), and deterministic record bytes written into and checked
 * through the arena.
 *
 * Header-only (static functions) so each test links only what it uses.
 * Every wait polls a condition with a deadline of seconds; nothing sleeps a
 * fixed time to let something happen.
 */
#ifndef POOL_TESTLIB_H
#define POOL_TESTLIB_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eos.h"
#include "pool_client.h"
#include "testutil.h"

#define UNUSED __attribute__((unused))
#define S_NS UINT64_C(1000000000)
#define MS_NS UINT64_C(1000000)

/* ---- the manager process ---------------------------------------------------------- */

struct mgr_proc {
	pid_t pid;
	int port; /* metrics port, 0 without */
	char sock[256], log[300];
};

UNUSED static const char *flare_bin(void)
{
	static char path[4096];
	const char *b = getenv("SELENE_BUILD");
	snprintf(path, sizeof path, "%s/flare", b ? b : "build");
	if (access(path, X_OK))
		SKIP("no flare binary at %s (set SELENE_BUILD)", path);
	return path;
}

UNUSED static bool file_has(const char *path, const char *needle, char *line, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	char buf[4096];
	bool found = false;
	while (fgets(buf, sizeof buf, f))
		if (strstr(buf, needle)) {
			if (line)
				snprintf(line, cap, "%s", buf);
			found = true;
			break;
		}
	fclose(f);
	return found;
}

UNUSED static void dump_log(const char *path)
{
	FILE *f = fopen(path, "r");
	char buf[4096];
	if (!f)
		return;
	fprintf(stderr, "--- %s\n", path);
	while (fgets(buf, sizeof buf, f))
		fputs(buf, stderr);
	fclose(f);
}

/* Start `flare pool --socket DIR/NAME.sock --metrics-port 0 ARGS...`
 * (NULL-terminated), its stderr in DIR/NAME.log; wait (20 s) for its
 * listening line. */
UNUSED static void mgr_start(struct mgr_proc *m, const char *dir, const char *name, ...)
{
	memset(m, 0, sizeof *m);
	snprintf(m->sock, sizeof m->sock, "%s/%s.sock", dir, name);
	snprintf(m->log, sizeof m->log, "%s/%s.log", dir, name);
	const char *argv[64];
	int n = 0;
	argv[n++] = flare_bin();
	argv[n++] = "pool";
	argv[n++] = "--socket";
	argv[n++] = m->sock;
	argv[n++] = "--metrics-port";
	argv[n++] = "0";
	va_list ap;
	va_start(ap, name);
	const char *a;
	while ((a = va_arg(ap, const char *)) && n < 62)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	int lf = open(m->log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
	CHECK(lf >= 0);
	pid_t parent = getpid();
	m->pid = fork();
	CHECK(m->pid >= 0);
	if (m->pid == 0) {
		/* Dies with the test, even one a failed CHECK ends. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(lf, 2);
		dup2(lf, 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(lf);
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	char line[4096];
	while (!file_has(m->log, "listening on unix:", NULL, 0)) {
		int st;
		if (waitpid(m->pid, &st, WNOHANG) == m->pid) {
			dump_log(m->log);
			CHECKF(false, "flare pool exited before listening (status %d)", st);
		}
		CHECKF(eos_now_ns() < deadline, "flare pool did not start in 20 s");
		eos_sleep_ns(10 * MS_NS);
	}
	if (file_has(m->log, "metrics on http://", line, sizeof line)) {
		char *p = strrchr(line, ':');
		m->port = p ? atoi(p + 1) : 0;
	}
}

/* SIGTERM, a clean exit within 20 s, the socket gone. */
UNUSED static void mgr_stop(struct mgr_proc *m)
{
	if (m->pid <= 0)
		return;
	kill(m->pid, SIGTERM);
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	int st = 0;
	while (waitpid(m->pid, &st, WNOHANG) != m->pid) {
		CHECKF(eos_now_ns() < deadline, "flare pool did not stop within 20 s of SIGTERM");
		eos_sleep_ns(10 * MS_NS);
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		dump_log(m->log);
		CHECKF(false, "flare pool exited with status %d", st);
	}
	CHECKF(access(m->sock, F_OK) && errno == ENOENT, "the socket %s was left behind", m->sock);
	CHECK(file_has(m->log, "flare pool: stopped", NULL, 0));
	m->pid = 0;
}

UNUSED static void mgr_kill9(struct mgr_proc *m)
{
	kill(m->pid, SIGKILL);
	int st;
	CHECK(waitpid(m->pid, &st, 0) == m->pid);
	m->pid = 0;
}

/* GET /metrics: the body (malloc'd), or NULL. */
UNUSED static char *http_metrics(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
	if (write(fd, req, strlen(req)) < 0) {
		close(fd);
		return NULL;
	}
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap);
	for (;;) {
		if (n + 4096 > cap)
			b = realloc(b, cap *= 2);
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 5000) <= 0)
			break;
		ssize_t r = read(fd, b + n, cap - n - 1);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	b[n] = '\0';
	return b;
}

/* The value of one series ("name" or "name{label=\"v\"}"), or -1. */
UNUSED static long long metric(const struct mgr_proc *m, const char *series)
{
	char *b = http_metrics(m->port);
	if (!b)
		return -1;
	long long v = -1;
	size_t sl = strlen(series);
	for (char *p = b; (p = strstr(p, series)); p += sl)
		if ((p == b || p[-1] == '\n') && p[sl] == ' ') {
			v = atoll(p + sl + 1);
			break;
		}
	free(b);
	return v;
}

/* Wait (deadline seconds) until the series reaches at least want (or, with
 * at_most, at most want). */
UNUSED static long long wait_metric(const struct mgr_proc *m, const char *series, long long want,
				    bool at_most, unsigned seconds)
{
	uint64_t deadline = eos_now_ns() + seconds * S_NS;
	long long v;
	for (;;) {
		v = metric(m, series);
		if (v >= 0 && (at_most ? v <= want : v >= want))
			return v;
		if (eos_now_ns() > deadline) {
			dump_log(m->log);
			CHECKF(false, "%s stayed at %lld (wanted %s %lld) for %u s", series, v,
			       at_most ? "<=" : ">=", want, seconds);
		}
		eos_sleep_ns(20 * MS_NS);
	}
}

/* Wait until the series equals want. */
UNUSED static void wait_metric_eq(const struct mgr_proc *m, const char *series, long long want,
				  unsigned seconds)
{
	uint64_t deadline = eos_now_ns() + seconds * S_NS;
	long long v;
	while ((v = metric(m, series)) != want) {
		if (eos_now_ns() > deadline) {
			dump_log(m->log);
			CHECKF(false, "%s is %lld, not %lld, after %u s", series, v, want, seconds);
		}
		eos_sleep_ns(20 * MS_NS);
	}
}

/* VmRSS of a process in KiB. */
UNUSED static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	long v = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "VmRSS:", 6))
			v = atol(line + 6);
	fclose(f);
	return v;
}

/* ---- the scope: a small host geometry -------------------------------------------------- */

struct scope {
	sel_geometry *g;
	uint8_t identity[SEL_IDENTITY_BYTES];
	uint8_t model[SEL_IDENTITY_BYTES];
	void *mem;
};

/* ranks ranks, two page planes of plane0 and 1000 bytes, a row of 6000
 * bytes, 64 tokens per page; model picks the identity. */
UNUSED static void scope_make(struct scope *s, uint32_t ranks, uint64_t plane0, uint8_t model)
{
	memset(s, 0, sizeof *s);
	s->mem = calloc(1, 1 << 20);
	sel_allocation a[16];
	int n = 0;
	for (uint32_t r = 0; r < ranks; r++) {
		a[n++] = (sel_allocation){
			r,      "k", SEL_GROUP_KV_PAGES, SEL_MEM_HOST, (uint64_t)(uintptr_t)s->mem,
			plane0, 16};
		a[n++] = (sel_allocation){
			r,    "v", SEL_GROUP_KV_PAGES, SEL_MEM_HOST, (uint64_t)(uintptr_t)s->mem,
			1000, 16};
		a[n++] = (sel_allocation){r,
					  "row",
					  SEL_GROUP_STATE_ROWS,
					  SEL_MEM_HOST,
					  (uint64_t)(uintptr_t)s->mem,
					  6000,
					  4};
	}
	CHECK_OK(sel_geometry_build(a, (size_t)n, ranks, 64, &s->g));
	memset(s->model, model, sizeof s->model);
	sel_offload_identity(s->model, SEL_MODE_ORDINARY, s->identity);
}

UNUSED static void scope_free(struct scope *s)
{
	sel_geometry_free(s->g);
	free(s->mem);
}

/* ---- clients ------------------------------------------------------------------------------ */

struct tc {
	sel_pool_client *c;
	struct sel_pool_event ev[256];
	size_t n;
};

UNUSED static int tc_attach(struct tc *t, const struct mgr_proc *m, const struct scope *s,
			    const char *id, uint64_t timeout_ns)
{
	memset(t, 0, sizeof *t);
	struct sel_pool_client_config cfg = {.address = m->sock,
					     .geometry = s->g,
					     .instance_id = id,
					     .hello_timeout_ns =
						     timeout_ns ? timeout_ns : 10 * S_NS,
					     .listen = "127.0.0.1:0"};
	memcpy(cfg.identity, s->identity, SEL_IDENTITY_BYTES);
	memcpy(cfg.core_identity, s->model, SEL_IDENTITY_BYTES);
	return sel_pool_attach(&cfg, &t->c);
}

UNUSED static void tc_close(struct tc *t)
{
	sel_pool_destroy(t->c);
	t->c = NULL;
}

/* Poll into the backlog for up to ms. */
UNUSED static void tc_pump(struct tc *t, int ms)
{
	struct pollfd p = {sel_pool_wait_fd(t->c), POLLIN, 0};
	poll(&p, 1, ms);
	if (t->n < 256)
		t->n += (size_t)sel_pool_poll(t->c, t->ev + t->n, 256 - t->n);
}

/* The first backlog event of this type (removed), waiting up to seconds. */
UNUSED static struct sel_pool_event tc_wait(struct tc *t, enum sel_pool_event_type type,
					    unsigned seconds)
{
	uint64_t deadline = eos_now_ns() + seconds * S_NS;
	for (;;) {
		for (size_t i = 0; i < t->n; i++)
			if (t->ev[i].type == type) {
				struct sel_pool_event e = t->ev[i];
				memmove(t->ev + i, t->ev + i + 1, (t->n - i - 1) * sizeof *t->ev);
				t->n--;
				return e;
			}
		CHECKF(eos_now_ns() < deadline, "no event %d within %u s (backlog %zu, state %s)",
		       type, seconds, t->n, sel_pool_state_name(sel_pool_state(t->c)));
		tc_pump(t, 20);
	}
}

/* Whether an event of this type is in the backlog now (after one pump). */
UNUSED static bool tc_has(struct tc *t, enum sel_pool_event_type type)
{
	tc_pump(t, 0);
	for (size_t i = 0; i < t->n; i++)
		if (t->ev[i].type == type)
			return true;
	return false;
}

/* ---- histories and record bytes ------------------------------------------------------------- */

/* Tokens: seed-dependent from `from` on, shared before it. */
UNUSED static void hist_make(sel_history *h, const struct scope *s, uint64_t len, uint32_t seed,
			     uint64_t from)
{
	CHECK_OK(sel_history_init(h, s->model, NULL, 0));
	for (uint64_t i = 0; i < len; i++) {
		sel_token t =
			(sel_token)(i < from ? i * 2654435761u : i * 40503u + seed * 7919u + 1);
		CHECK_OK(sel_history_append(h, &t, 1));
	}
}

UNUSED static sel_key key_at(const sel_history *h, uint64_t c)
{
	sel_key k;
	sel_history_key_at(h, c, &k);
	return k;
}

UNUSED static sel_digest bucket_of(const sel_history *h, uint64_t c)
{
	return *sel_history_bound(h, c / SEL_BUCKET_TOKENS);
}

/* The byte at offset o of chain page p of h: it depends on the prefix
 * that ends with the page (the boundary digest there), as a GPU page's
 * bytes do; a row's bytes on its endpoint key. */
static inline uint8_t page_byte(const sel_history *h, uint32_t p, uint64_t o)
{
	const sel_digest *d = sel_history_bound(h, (uint64_t)(p + 1) * 64 / SEL_BUCKET_TOKENS);
	return (uint8_t)(d->b[o % 16] + p * 131u + o * 7u + (o >> 9));
}
static inline uint8_t row_byte(const sel_key *k, uint64_t o)
{
	return (uint8_t)(k->digest.b[o % 16] ^ (uint8_t)(o * 13u) ^ (uint8_t)k->consumed);
}

/* Fill a put or export lease with h's bytes: page i of the lease is chain
 * page first + i; the row slots get the endpoint's row. */
UNUSED static void lease_fill(sel_pool_client *c, const struct sel_pool_lease *l,
			      const sel_history *h, const sel_key *end, uint32_t first)
{
	uint64_t sb = sel_pool_slot_bytes(c);
	for (uint32_t i = 0; i < l->n_pages; i++) {
		uint8_t *p = sel_pool_slot_addr(c, l->page_slots[i]);
		for (uint64_t o = 0; o < sb; o++)
			p[o] = page_byte(h, first + i, o);
	}
	for (uint32_t k = 0; k < l->n_row_slots; k++) {
		uint8_t *p = sel_pool_slot_addr(c, l->row_slots[k]);
		for (uint64_t o = 0; o < sb; o++)
			p[o] = row_byte(end, k * sb + o);
	}
}

/* Check a claim lease against h: its chain is h's, it verifies, and page i
 * holds chain page base/pt + i of h, byte for byte, and the row h's. */
UNUSED static void lease_check(sel_pool_client *c, const struct sel_pool_lease *l,
			       const sel_history *h, uint64_t resident)
{
	uint64_t sb = sel_pool_slot_bytes(c);
	uint32_t first = (uint32_t)(l->base / l->page_tokens);
	CHECK(sel_pool_lease_matches(l, h, resident));
	CHECK_OK(sel_pool_lease_verify(c, l));
	for (uint32_t i = 0; i < l->n_pages; i++) {
		const uint8_t *p = sel_pool_slot_addr(c, l->page_slots[i]);
		for (uint64_t o = 0; o < sb; o++)
			CHECKF(p[o] == page_byte(h, first + i, o), "page %u byte %" PRIu64, i, o);
	}
	for (uint32_t k = 0; k < l->n_row_slots; k++) {
		const uint8_t *p = sel_pool_slot_addr(c, l->row_slots[k]);
		for (uint64_t o = 0; o < sb; o++)
			CHECKF(p[o] == row_byte(&l->key, k * sb + o), "row slot %u byte %" PRIu64,
			       k, o);
	}
}

/* Put the record of h's prefix [0, c) under parent p (0: a root) and wait
 * for the result; returns the result's reason (or the refusal's). */
UNUSED static uint32_t put_record(struct tc *t, const sel_history *h, uint64_t c, uint64_t p)
{
	uint32_t pt = 64;
	struct sel_pool_put_desc d = {.key = key_at(h, c),
				      .bucket = bucket_of(h, c),
				      .tail = (uint32_t)(c / pt - p / pt)};
	if (p)
		d.parent = key_at(h, p);
	uint64_t id;
	CHECK_OK(sel_pool_put(t->c, &d, &id));
	uint64_t deadline = eos_now_ns() + 10 * S_NS;
	for (;;) {
		for (size_t i = 0; i < t->n; i++) {
			struct sel_pool_event e = t->ev[i];
			if (e.request != id ||
			    (e.type != SEL_POOL_EV_PUT_GRANTED &&
			     e.type != SEL_POOL_EV_PUT_REFUSED && e.type != SEL_POOL_EV_PUT_RESULT))
				continue;
			memmove(t->ev + i, t->ev + i + 1, (t->n - i - 1) * sizeof *t->ev);
			t->n--;
			if (e.type == SEL_POOL_EV_PUT_REFUSED)
				return e.reason ? e.reason : 1000;
			if (e.type == SEL_POOL_EV_PUT_RESULT)
				return e.reason;
			struct sel_pool_lease *l = e.lease;
			lease_fill(t->c, l, h, &d.key, (uint32_t)(p / pt));
			uint64_t *ck = malloc((l->n_pages + 1) * sizeof *ck), row;
			sel_pool_lease_checksums(t->c, l, ck, &row);
			CHECK_OK(sel_pool_commit(t->c, l, ck, row));
			free(ck);
			i = (size_t)-1;
		}
		CHECKF(eos_now_ns() < deadline, "no put result for %" PRIu64 " tokens", c);
		tc_pump(t, 20);
	}
}

/* Look h up above resident; the READY ticket (caller frees), waiting 10 s. */
UNUSED static sel_pool_ticket *lookup(struct tc *t, const sel_history *h, uint64_t resident,
				      uint64_t limit)
{
	sel_pool_ticket *k;
	CHECK_OK(sel_pool_begin_lookup(t->c, h, resident, limit, &k));
	uint64_t deadline = eos_now_ns() + 10 * S_NS;
	while (sel_pool_ticket_state(k) == SEL_POOL_TICKET_PENDING) {
		CHECKF(eos_now_ns() < deadline, "no answer in 10 s");
		tc_pump(t, 20);
	}
	CHECK(sel_pool_ticket_state(k) == SEL_POOL_TICKET_READY);
	/* Drop the answer event from the backlog. */
	for (size_t i = 0; i < t->n; i++)
		if (t->ev[i].type == SEL_POOL_EV_ANSWER && t->ev[i].ticket == k) {
			memmove(t->ev + i, t->ev + i + 1, (t->n - i - 1) * sizeof *t->ev);
			t->n--;
			break;
		}
	return k;
}

/* A round trip on t: every frame t sent before has been handled. */
UNUSED static void tc_sync(struct tc *t, const sel_history *h)
{
	sel_pool_ticket_free(t->c, lookup(t, h, 0, sel_history_len(h)));
}

/* Claim candidate i and wait for the grant (NULL: *reason is the failure). */
UNUSED static struct sel_pool_lease *claim(struct tc *t, sel_pool_ticket *k, int i,
					   uint32_t *reason)
{
	uint64_t id;
	CHECK_OK(sel_pool_claim(t->c, k, (uint32_t)i, &id));
	uint64_t deadline = eos_now_ns() + 15 * S_NS;
	for (;;) {
		for (size_t j = 0; j < t->n; j++) {
			struct sel_pool_event e = t->ev[j];
			if (e.request != id || (e.type != SEL_POOL_EV_CLAIM_GRANTED &&
						e.type != SEL_POOL_EV_CLAIM_FAILED))
				continue;
			memmove(t->ev + j, t->ev + j + 1, (t->n - j - 1) * sizeof *t->ev);
			t->n--;
			*reason = e.reason;
			return e.type == SEL_POOL_EV_CLAIM_GRANTED ? e.lease : NULL;
		}
		CHECKF(eos_now_ns() < deadline, "no claim result in 15 s");
		tc_pump(t, 20);
	}
}

#endif
