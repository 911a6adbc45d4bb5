/*
 * redisfx.c - see redisfx.h.
 */
#include "redisfx.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"
#include "testutil.h"

#define SEC 1000000000ull

static char server_bin[1024], cli_bin[1024];

/* Servers alive, killed by PID if a CHECK fails, so a failing test leaves
 * no redis-server behind. */
static struct rfx_server *live[64];

static void track(struct rfx_server *s, bool on)
{
	for (int i = 0; i < 64; i++)
		if (on ? !live[i] : live[i] == s) {
			live[i] = on ? s : NULL;
			return;
		}
}

static void kill_all(void)
{
	for (int i = 0; i < 64; i++)
		if (live[i] && live[i]->pid > 0) {
			kill(live[i]->pid, SIGKILL);
			waitpid(live[i]->pid, NULL, 0);
			live[i]->pid = 0;
		}
}

static bool find_bin(const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH");
	if (!path)
		path = "/usr/bin:/bin";
	while (*path) {
		const char *c = strchr(path, ':');
		size_t n = c ? (size_t)(c - path) : strlen(path);
		snprintf(out, len, "%.*s/%s", (int)n, path, name);
		if (access(out, X_OK) == 0)
			return true;
		path += n + (c ? 1 : 0);
	}
	return false;
}

bool rfx_available(void)
{
	return find_bin("redis-server", server_bin, sizeof server_bin) &&
	       find_bin("redis-cli", cli_bin, sizeof cli_bin);
}

/* A port with it (and, for a cluster, its bus port + 10000) free now. */
static int free_port(bool cluster)
{
	for (int tries = 0; tries < 200; tries++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0), fd2 = -1;
		CHECK(fd >= 0);
		struct sockaddr_in a = {.sin_family = AF_INET};
		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		socklen_t al = sizeof a;
		CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
		CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
		int port = ntohs(a.sin_port);
		bool ok = port < 55000;
		if (ok && cluster) {
			fd2 = socket(AF_INET, SOCK_STREAM, 0);
			struct sockaddr_in b = a;
			b.sin_port = htons((uint16_t)(port + 10000));
			ok = fd2 >= 0 && bind(fd2, (struct sockaddr *)&b, sizeof b) == 0;
		}
		close(fd);
		if (fd2 >= 0)
			close(fd2);
		if (ok)
			return port;
	}
	CHECKF(0, "no free port");
	return -1;
}

/* fork and exec with the child's stdout and stderr on log, and SIGKILL
 * for the child when the test dies (even by a timeout's SIGKILL), so no
 * server outlives its test.  Between fork and exec the child makes only
 * system calls. */
static pid_t spawn(char *const argv[], const char *log)
{
	int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	CHECKF(fd >= 0, "%s: %s", log, strerror(errno));
	pid_t parent = getpid();
	pid_t pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int nul = open("/dev/null", O_RDONLY);
		if (nul >= 0)
			dup2(nul, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(argv[0], argv);
		_exit(127);
	}
	close(fd);
	return pid;
}

static void drop_ctx(struct rfx_server *s)
{
	if (s->ctx)
		redisFree(s->ctx);
	s->ctx = NULL;
}

/* Launch once; true when it answers PING within the deadline, false when
 * it exited (a port taken since we picked it). */
static bool launch(struct rfx_server *s)
{
	char port[16], log[1100], out[1100], conf[1100];
	snprintf(port, sizeof port, "%d", s->port);
	snprintf(log, sizeof log, "%s/redis.log", s->dir);
	snprintf(out, sizeof out, "%s/redis.out", s->dir);
	snprintf(conf, sizeof conf, "%s/nodes.conf", s->dir);
	char *argv[64];
	int n = 0;
	argv[n++] = server_bin;
	argv[n++] = "--port";
	argv[n++] = port;
	argv[n++] = "--bind";
	argv[n++] = "127.0.0.1";
	argv[n++] = "--dir";
	argv[n++] = s->dir;
	argv[n++] = "--logfile";
	argv[n++] = log;
	argv[n++] = "--save";
	argv[n++] = "";
	argv[n++] = "--appendonly";
	argv[n++] = "no";
	argv[n++] = "--daemonize";
	argv[n++] = "no";
	argv[n++] = "--databases";
	argv[n++] = "16";
	if (s->unix_socket) {
		argv[n++] = "--unixsocket";
		argv[n++] = s->sock;
		argv[n++] = "--unixsocketperm";
		argv[n++] = "700";
	}
	if (s->cluster) {
		argv[n++] = "--cluster-enabled";
		argv[n++] = "yes";
		argv[n++] = "--cluster-config-file";
		argv[n++] = conf;
		argv[n++] = "--cluster-node-timeout";
		argv[n++] = "3000";
		argv[n++] = "--cluster-require-full-coverage";
		argv[n++] = "no";
	}
	char extra[sizeof s->extra];
	snprintf(extra, sizeof extra, "%s", s->extra);
	for (char *save = NULL, *t = strtok_r(extra, " ", &save); t && n < 62;
	     t = strtok_r(NULL, " ", &save))
		argv[n++] = t;
	argv[n] = NULL;
	s->pid = spawn(argv, out);
	if (!test_fail_cb)
		test_fail_cb = kill_all;
	uint64_t deadline = eos_now_ns() + 20 * SEC;
	while (eos_now_ns() < deadline) {
		int st;
		if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
			s->pid = 0;
			return false;
		}
		struct timeval tv = {0, 200000};
		redisContext *c = redisConnectWithTimeout("127.0.0.1", s->port, tv);
		if (c && !c->err) {
			redisReply *r = redisCommand(c, "PING");
			bool up = r && r->type == REDIS_REPLY_STATUS;
			if (r)
				freeReplyObject(r);
			redisFree(c);
			if (up)
				return true;
		} else if (c) {
			redisFree(c);
		}
		struct pollfd none;
		poll(&none, 0, 20); /* the next probe, not a wait for the server */
	}
	kill(s->pid, SIGKILL);
	waitpid(s->pid, NULL, 0);
	s->pid = 0;
	CHECKF(0, "redis-server on %d did not answer PING in 20 s (log %s)", s->port, log);
	return false;
}

void rfx_start(struct rfx_server *s, const char *parent, const char *name, bool cluster,
	       bool unix_socket, const char *extra)
{
	memset(s, 0, sizeof *s);
	s->cluster = cluster;
	s->unix_socket = unix_socket;
	snprintf(s->dir, sizeof s->dir, "%s/%s", parent, name);
	snprintf(s->sock, sizeof s->sock, "%s/redis.sock", s->dir);
	snprintf(s->extra, sizeof s->extra, "%s", extra ? extra : "");
	CHECK(mkdir(s->dir, 0700) == 0 || errno == EEXIST);
	track(s, true);
	for (int tries = 0; tries < 10; tries++) {
		s->port = free_port(cluster);
		if (launch(s))
			return;
	}
	CHECKF(0, "redis-server in %s would not start (see its redis.log)", s->dir);
}

void rfx_restart(struct rfx_server *s)
{
	drop_ctx(s);
	for (int tries = 0; tries < 50; tries++) {
		if (launch(s))
			return;
		/* The old socket may linger a moment in the kernel. */
		struct pollfd none;
		poll(&none, 0, 100);
	}
	CHECKF(0, "redis-server on %d would not restart", s->port);
}

static void reap(struct rfx_server *s, uint64_t timeout_ns)
{
	uint64_t deadline = eos_now_ns() + timeout_ns;
	while (s->pid) {
		int st;
		pid_t p = waitpid(s->pid, &st, WNOHANG);
		if (p == s->pid || (p < 0 && errno == ECHILD)) {
			s->pid = 0;
			return;
		}
		if (eos_now_ns() > deadline) {
			kill(s->pid, SIGKILL);
			waitpid(s->pid, &st, 0);
			s->pid = 0;
			return;
		}
		struct pollfd none;
		poll(&none, 0, 10);
	}
}

void rfx_stop(struct rfx_server *s)
{
	drop_ctx(s);
	track(s, false);
	if (!s->pid)
		return;
	kill(s->pid, SIGCONT);
	kill(s->pid, SIGTERM);
	reap(s, 10 * SEC);
}

void rfx_kill(struct rfx_server *s)
{
	drop_ctx(s);
	if (!s->pid)
		return;
	kill(s->pid, SIGKILL);
	reap(s, 10 * SEC);
}

void rfx_signal(struct rfx_server *s, int sig)
{
	CHECK(s->pid > 0);
	kill(s->pid, sig);
}

static redisContext *ctx_of(struct rfx_server *s)
{
	if (s->ctx && s->ctx->err)
		drop_ctx(s);
	if (!s->ctx) {
		struct timeval tv = {5, 0};
		s->ctx = redisConnectWithTimeout("127.0.0.1", s->port, tv);
		if (!s->ctx || s->ctx->err) {
			drop_ctx(s);
			return NULL;
		}
		redisSetTimeout(s->ctx, tv);
	}
	return s->ctx;
}

redisReply *rfx_cmd(struct rfx_server *s, const char *fmt, ...)
{
	redisContext *c = ctx_of(s);
	if (!c)
		return NULL;
	va_list ap;
	va_start(ap, fmt);
	redisReply *r = redisvCommand(c, fmt, ap);
	va_end(ap);
	if (!r)
		drop_ctx(s);
	return r;
}

redisReply *rfx_cmd_argv(struct rfx_server *s, int argc, const char **argv, const size_t *lens)
{
	redisContext *c = ctx_of(s);
	if (!c)
		return NULL;
	redisReply *r = redisCommandArgv(c, argc, argv, lens);
	if (!r)
		drop_ctx(s);
	return r;
}

long long rfx_int(struct rfx_server *s, const char *fmt, ...)
{
	redisContext *c = ctx_of(s);
	if (!c)
		return -1;
	va_list ap;
	va_start(ap, fmt);
	redisReply *r = redisvCommand(c, fmt, ap);
	va_end(ap);
	if (!r) {
		drop_ctx(s);
		return -1;
	}
	long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
	freeReplyObject(r);
	return v;
}

void rfx_node_id(struct rfx_server *s, char out[64])
{
	redisReply *r = rfx_cmd(s, "CLUSTER MYID");
	CHECK(r && r->type == REDIS_REPLY_STRING && r->len < 64);
	memcpy(out, r->str, r->len);
	out[r->len] = '\0';
	freeReplyObject(r);
}

static bool cluster_ok(struct rfx_server *s)
{
	redisReply *r = rfx_cmd(s, "CLUSTER INFO");
	bool ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") &&
		  strstr(r->str, "cluster_slots_assigned:16384");
	if (r)
		freeReplyObject(r);
	return ok;
}

void rfx_cluster_create(struct rfx_server *s, int n, const char *parent)
{
	char addr[16][32], log[1100];
	char *argv[32];
	int a = 0;
	argv[a++] = cli_bin;
	argv[a++] = "--cluster";
	argv[a++] = "create";
	for (int i = 0; i < n && i < 16; i++) {
		snprintf(addr[i], sizeof addr[i], "127.0.0.1:%d", s[i].port);
		argv[a++] = addr[i];
	}
	argv[a++] = "--cluster-replicas";
	argv[a++] = "0";
	argv[a++] = "--cluster-yes";
	argv[a] = NULL;
	snprintf(log, sizeof log, "%s/cluster.log", parent);
	pid_t pid = spawn(argv, log);
	uint64_t deadline = eos_now_ns() + 90 * SEC;
	int st = 0;
	for (;;) {
		pid_t p = waitpid(pid, &st, WNOHANG);
		if (p == pid)
			break;
		CHECKF(eos_now_ns() < deadline, "redis-cli --cluster create did not finish (%s)",
		       log);
		struct pollfd none;
		poll(&none, 0, 50);
	}
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "redis-cli --cluster create failed (%s)",
	       log);
	deadline = eos_now_ns() + 60 * SEC;
	for (;;) {
		bool all = true;
		for (int i = 0; i < n; i++)
			all &= cluster_ok(&s[i]);
		if (all)
			return;
		CHECKF(eos_now_ns() < deadline, "the cluster did not settle in 60 s");
		struct pollfd none;
		poll(&none, 0, 50);
	}
}

void rfx_url(const struct rfx_server *s, int n, bool cluster, char *buf, size_t len)
{
	if (!cluster) {
		snprintf(buf, len, "redis://127.0.0.1:%d", s[0].port);
		return;
	}
	size_t at = (size_t)snprintf(buf, len, "redis-cluster://");
	for (int i = 0; i < n && at < len; i++)
		at += (size_t)snprintf(buf + at, len - at, "%s127.0.0.1:%d", i ? "," : "",
				       s[i].port);
}

/* ---- Records ------------------------------------------------------------- */

void rfx_ns_init(struct rfx_ns *t, uint32_t ranks, uint32_t page_tokens, uint32_t n, uint64_t unit,
		 uint64_t row)
{
	uint64_t units[TG_MAX_PLANES];
	for (uint32_t i = 0; i < n; i++)
		units[i] = unit;
	test_geo_init(&t->tg, ranks, page_tokens, n, units, row);
	memset(t->model, 0x42, sizeof t->model);
	uint8_t id[SEL_IDENTITY_BYTES];
	sel_offload_identity(t->model, SEL_MODE_ORDINARY, id);
	CHECK_OK(sel_record_ns_init(&t->ns, &t->tg.g, id));
}

void rfx_ns_free(struct rfx_ns *t) { sel_record_ns_free(&t->ns); }

void rfx_history(struct rfx_ns *t, sel_history *h, uint64_t n, uint64_t seed)
{
	test_rng r;
	test_rng_init(&r, seed);
	sel_token *tok = malloc((n ? n : 1) * sizeof *tok);
	for (uint64_t i = 0; i < n; i++)
		tok[i] = (sel_token)test_rng_below(&r, 100000);
	CHECK_OK(sel_history_init(h, t->model, NULL, 0));
	CHECK_OK(sel_history_append(h, tok, n));
	free(tok);
}

void rfx_fill(const sel_key *k, uint64_t what, uint8_t *buf, uint64_t len)
{
	uint64_t x = what * 0x9e3779b97f4a7c15ull ^ k->consumed;
	for (int i = 0; i < 8; i++)
		x ^= (uint64_t)k->digest.b[i] << (8 * i);
	for (uint64_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		uint64_t n = len - i < 8 ? len - i : 8;
		memcpy(buf + i, &x, n);
	}
}

void rfx_rec_make(struct rfx_rec *rec, const struct rfx_ns *t, const sel_history *h, uint64_t c,
		  uint64_t parent, uint32_t flags, bool has_row)
{
	memset(rec, 0, sizeof *rec);
	uint32_t pt = t->ns.layout.sz.page_tokens;
	sel_history_key_at(h, c, &rec->d.key);
	rec->d.bucket = *sel_history_bound(h, c / SEL_BUCKET_TOKENS);
	rec->d.flags = flags;
	if (parent) {
		sel_history_key_at(h, parent, &rec->d.parent);
		rec->d.tail = (uint32_t)(c / pt - parent / pt);
	} else {
		rec->d.tail = (uint32_t)(c / pt);
	}
	sel_record_span span;
	CHECK_OK(sel_record_span_of(&t->ns.layout.sz, &rec->d, &span));
	rec->stride = span.page_stride;
	rec->has_row = has_row;
	rec->row_bytes = has_row ? sel_rv_row_bytes(&t->ns.layout, flags) : 0;
	rec->mem = malloc(rec->d.tail * rec->stride + rec->row_bytes + 1);
	rec->pages = malloc((rec->d.tail ? rec->d.tail : 1) * sizeof(void *));
	CHECK(rec->mem && rec->pages);
	for (uint32_t i = 0; i < rec->d.tail; i++) {
		rec->pages[i] = rec->mem + i * rec->stride;
		rfx_fill(&rec->d.key, i, rec->pages[i], rec->stride);
	}
	rec->row[0].iov_base = rec->mem + rec->d.tail * rec->stride;
	rec->row[0].iov_len = rec->row_bytes;
	rfx_fill(&rec->d.key, 1u << 30, rec->row[0].iov_base, rec->row_bytes);
}

void rfx_rec_free(struct rfx_rec *rec)
{
	free(rec->mem);
	free(rec->pages);
	memset(rec, 0, sizeof *rec);
}

/* Events seen while waiting for another op. */
static struct sel_remote_event stash[512];
static int n_stash;

struct sel_remote_event rfx_wait(sel_remote *r, uint64_t id, uint64_t timeout_ns)
{
	for (int i = 0; i < n_stash; i++)
		if (stash[i].id == id) {
			struct sel_remote_event e = stash[i];
			stash[i] = stash[--n_stash];
			return e;
		}
	uint64_t deadline = eos_now_ns() + timeout_ns;
	for (;;) {
		struct sel_remote_event ev[16];
		int n = sel_remote_poll(r, ev, 16);
		struct sel_remote_event found = {0};
		bool got = false;
		for (int i = 0; i < n; i++) {
			if (ev[i].id == id) {
				found = ev[i];
				got = true;
			} else {
				CHECK(n_stash < (int)(sizeof stash / sizeof *stash));
				stash[n_stash++] = ev[i];
			}
		}
		if (got)
			return found;
		uint64_t now = eos_now_ns();
		CHECKF(now < deadline, "no event for op %llu in %llu ms", (unsigned long long)id,
		       (unsigned long long)(timeout_ns / 1000000));
		struct pollfd p = {.fd = sel_remote_wait_fd(r), .events = POLLIN};
		uint64_t ms = (deadline - now) / 1000000 + 1;
		poll(&p, 1, ms > 1000 ? 1000 : (int)ms);
	}
}

struct sel_remote_event rfx_put(sel_remote *r, const struct rfx_rec *rec)
{
	struct sel_remote_put p = {
		.d = rec->d,
		.has_row = rec->has_row,
		.pages = rec->pages,
		.row = rec->row,
		.row_n = rec->has_row ? 1 : 0,
	};
	uint64_t id;
	CHECK_OK(sel_remote_put(r, &p, &id));
	return rfx_wait(r, id, 30 * SEC);
}

struct sel_remote_event rfx_lookup(sel_remote *r, const sel_history *h, uint64_t resident,
				   uint64_t limit)
{
	uint64_t id;
	CHECK_OK(sel_remote_lookup(r, h, resident, limit, 0, &id));
	return rfx_wait(r, id, 30 * SEC);
}

/* The namespace of each client the tests opened, for what a claim must give
 * back: the put pages with their padding zeroed (record version 4). */
static struct {
	const sel_remote *r;
	const sel_record_ns *ns;
} tracked[64];

void rfx_track(const sel_remote *r, const sel_record_ns *ns)
{
	int free_i = -1;
	for (int i = 0; i < 64; i++) {
		if (tracked[i].r == r) {
			tracked[i].ns = ns;
			return;
		}
		if (free_i < 0 && !tracked[i].r)
			free_i = i;
	}
	CHECKF(free_i >= 0, "rfx_track: more than 64 clients");
	tracked[free_i].r = r;
	tracked[free_i].ns = ns;
}

static const sel_record_ns *ns_of(const sel_remote *r)
{
	for (int i = 0; i < 64; i++)
		if (tracked[i].r == r)
			return tracked[i].ns;
	CHECKF(false, "rfx: a client neither rfx_client nor rfx_track opened");
	return NULL;
}

void rfx_page_want(const sel_record_ns *ns, const sel_key *k, uint32_t i, uint32_t flags,
		   uint8_t *buf, uint64_t stride)
{
	rfx_fill(k, i, buf, stride);
	sel_record_zero_padding(&ns->layout, flags, buf);
}

int rfx_claim_check(sel_remote *r, sel_remote_hit *hit)
{
	const sel_record_ns *ns = ns_of(r);
	uint64_t total = 0;
	for (uint32_t j = 0; j < hit->n_nodes; j++)
		total += (hit->node[j].tail - hit->node[j].skip) * hit->node[j].stride;
	uint8_t *mem = malloc(total + hit->row_bytes + 1);
	void **pages = malloc((hit->pages ? hit->pages : 1) * sizeof(void *));
	CHECK(mem && pages);
	memset(mem, 0xa5, total + hit->row_bytes);
	uint64_t at = 0;
	uint32_t pi = 0;
	for (uint32_t j = 0; j < hit->n_nodes; j++)
		for (uint32_t i = hit->node[j].skip; i < hit->node[j].tail; i++) {
			pages[pi++] = mem + at;
			at += hit->node[j].stride;
		}
	/* The row in two pieces, as slots would hold it. */
	struct iovec row[2] = {
		{mem + total, hit->row_bytes / 3},
		{mem + total + hit->row_bytes / 3, hit->row_bytes - hit->row_bytes / 3}};
	struct sel_remote_dest d = {.pages = pages, .n_pages = hit->pages, .row = row, .row_n = 2};
	/* Copy what checking needs: the claim takes the hit. */
	uint32_t n = hit->n_nodes;
	struct sel_remote_node nodes[64];
	CHECK(n <= 64);
	memcpy(nodes, hit->node, n * sizeof *nodes);
	sel_key end = hit->key;
	uint64_t row_bytes = hit->row_bytes, want_bytes = hit->bytes;
	uint64_t id;
	CHECK_OK(sel_remote_claim(r, hit, &d, 0, &id));
	struct sel_remote_event ev = rfx_wait(r, id, 60 * SEC);
	CHECK(ev.op == SEL_REMOTE_OP_CLAIM);
	if (ev.error == 0) {
		CHECK(ev.result == SEL_REMOTE_CLAIMED && ev.bytes == want_bytes);
		CHECK(sel_key_eq(&ev.key, &end));
		uint8_t *want = malloc(nodes[n - 1].stride > row_bytes ? nodes[n - 1].stride + 1
								       : row_bytes + 1);
		at = 0;
		for (uint32_t j = 0; j < n; j++)
			for (uint32_t i = nodes[j].skip; i < nodes[j].tail; i++) {
				free(want);
				want = malloc(nodes[j].stride + 1);
				rfx_page_want(ns, &nodes[j].key, i, nodes[j].flags, want,
					      nodes[j].stride);
				CHECKF(memcmp(mem + at, want, nodes[j].stride) == 0,
				       "node %u page %u differs", j, i);
				at += nodes[j].stride;
			}
		free(want);
		want = malloc(row_bytes + 1);
		rfx_fill(&end, 1u << 30, want, row_bytes);
		CHECK(memcmp(mem + total, want, row_bytes) == 0);
		free(want);
	} else {
		CHECK(ev.result == SEL_REMOTE_FAILED);
	}
	free(mem);
	free(pages);
	return ev.error;
}

uint64_t rfx_claim_async(sel_remote *r, sel_remote_hit *hit, uint8_t **mem)
{
	uint64_t total = 0;
	for (uint32_t j = 0; j < hit->n_nodes; j++)
		total += (hit->node[j].tail - hit->node[j].skip) * hit->node[j].stride;
	*mem = malloc(total + hit->row_bytes + 1);
	void **pages = malloc((hit->pages ? hit->pages : 1) * sizeof(void *));
	CHECK(*mem && pages);
	uint64_t at = 0;
	uint32_t pi = 0;
	for (uint32_t j = 0; j < hit->n_nodes; j++)
		for (uint32_t i = hit->node[j].skip; i < hit->node[j].tail; i++) {
			pages[pi++] = *mem + at;
			at += hit->node[j].stride;
		}
	struct iovec row = {*mem + total, hit->row_bytes};
	struct sel_remote_dest d = {.pages = pages, .n_pages = hit->pages, .row = &row, .row_n = 1};
	uint64_t id;
	CHECK_OK(sel_remote_claim(r, hit, &d, 0, &id)); /* the client copies the arrays */
	free(pages);
	return id;
}

void rfx_wait_state(sel_remote *r, enum sel_rn_state want, uint64_t timeout_ns)
{
	uint64_t deadline = eos_now_ns() + timeout_ns;
	for (;;) {
		struct sel_remote_stats st;
		sel_remote_stats(r, &st);
		if (st.state == want)
			return;
		CHECKF(eos_now_ns() < deadline, "remote state %s, want %s after %llu ms",
		       sel_remote_state_name(st.state), sel_remote_state_name(want),
		       (unsigned long long)(timeout_ns / 1000000));
		struct pollfd none;
		poll(&none, 0, 10);
	}
}

sel_remote *rfx_client(const char *url, const struct rfx_ns *t, const uint8_t *key, bool encrypt,
		       uint32_t window)
{
	struct sel_remote_config c = {
		.url = url,
		.ns = &t->ns,
		.key = key,
		.encrypt = encrypt,
		.window_bytes = window,
		.lookup_timeout_ns = 10 * SEC, /* a busy 2-core machine */
		.net = {.backoff_min_ns = 20000000ull, .backoff_max_ns = 500000000ull},
	};
	sel_remote *r;
	CHECK_OK(sel_remote_open(&c, &r));
	rfx_track(r, &t->ns);
	return r;
}
