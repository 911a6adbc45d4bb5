/*
 * ranks.c - one core's ranks as separate processes (ranks.h; design 2.8,
 * 2.14; docs/multihost.md "Execution").
 *
 * DESIGN
 *   The step's combine is the model's own: hel_model with a tp mirrors
 *   each call to the peers and, at each point where the one-process model
 *   sums over its ranks, calls tp.reduce.  Here that is a star over the
 *   rendezvous connections: every peer sends rank 0 its PART, rank 0 adds
 *   them to its own in rank order (sums modulo 2^64 do not depend on the
 *   order anyway) and sends the SUM back.  Everything is lockstep and
 *   blocking with deadlines, on the thread that calls the model: like a
 *   GPU engine's NCCL all-reduce inside a step, the step cannot go on
 *   without every rank's share, so there is nothing else for that thread
 *   to do meanwhile.  TCP_NODELAY keeps each exchange to one round trip.
 *   A watcher thread on rank 0 polls the connections for a hang-up while
 *   nothing is computing, so a peer that dies idle stops the instance too.
 *
 * INVARIANTS
 *   1. Once stopped, the group stays stopped: no frame is sent or read and
 *      every call returns SEL_ESTOPPED with the first reason.
 *   2. cfg.dead is called at most once.
 */
#include "ranks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "eos.h"
#include "ranks_proto.h"
#include "shard_link.h"
#include "shard_service.h"
#include "shard_proto.h"

#define JOIN_NS_DEFAULT (120ull * 1000000000ull)
#define STEP_NS_DEFAULT (30ull * 1000000000ull)
#define HELLO_NS (10ull * 1000000000ull) /* a connection's JOIN */
#define JOIN_PAYLOAD_MAX 1024u           /* a frame while rank 0 joins */
/* Every rank is connected when the store's links join: the join and the
 * agreement need no more than this. */
#define STORE_JOIN_NS (30ull * 1000000000ull)

struct hel_ranks {
	struct hel_ranks_config cfg;
	char rendezvous[300];
	char addr[320];
	int lfd;
	int *fd; /* [world]: rank 0's connection to each peer (fd[0] unused) */
	hel_model_tp tp;
	uint8_t *buf; /* an encoded frame */
	size_t cap;
	uint64_t *acc; /* a reduction's total */
	pthread_mutex_t mu;
	bool stopped;
	char why[1024];
	atomic_bool dead_called;
	pthread_t watcher;
	bool watching;
	int wake[2];                  /* stops the watcher */
	struct sel_store_ranks store; /* rank 0: the disk store's rank links */
	/* Model calls mirrored (rank 0) or executed (a peer): a peer's record
	 * service runs a job only after the calls rank 0 sent before it. */
	atomic_uint_fast64_t calls_sent;
	uint64_t calls_done; /* under mu; done_cv signals */
	pthread_cond_t done_cv;
	sel_shard_service *svc; /* a peer: its record service, once rank 0 sent STORE */
	sel_geometry *svc_geo;  /* the geometry it runs over */
};

/* ---- failures --------------------------------------------------------------- */

/* Stop the group for good (invariant 1) and say so once (invariant 2). */
static int stop(hel_ranks *g, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int stop(hel_ranks *g, int rc, const char *fmt, ...)
{
	char text[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&g->mu);
	if (!g->stopped) {
		g->stopped = true;
		snprintf(g->why, sizeof g->why, "%s", text);
	}
	snprintf(text, sizeof text, "%s", g->why);
	pthread_mutex_unlock(&g->mu);
	if (g->cfg.dead && !atomic_exchange(&g->dead_called, true))
		g->cfg.dead(g->cfg.dead_ctx, text);
	return eos_fail(rc ? rc : SEL_ESTOPPED, "%s", text);
}

static int stopped(hel_ranks *g)
{
	char text[1024];
	pthread_mutex_lock(&g->mu);
	bool s = g->stopped;
	if (s)
		snprintf(text, sizeof text, "%s", g->why);
	pthread_mutex_unlock(&g->mu);
	return s ? eos_fail(SEL_ESTOPPED, "the ranks stopped: %s", text) : 0;
}

const char *hel_ranks_failure(hel_ranks *g)
{
	pthread_mutex_lock(&g->mu);
	const char *w = g->stopped ? g->why : NULL;
	pthread_mutex_unlock(&g->mu);
	return w;
}

/* ---- sockets ------------------------------------------------------------------ */

static uint64_t deadline_in(uint64_t ns) { return eos_now_ns() + ns; }

static int wait_fd(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		uint64_t now = eos_now_ns();
		int ms = deadline == UINT64_MAX ? -1
			 : now >= deadline      ? 0
						: (int)((deadline - now + 999999) / 1000000);
		struct pollfd p = {fd, ev, 0};
		int n = poll(&p, 1, ms);
		if (n > 0)
			return 0;
		if (n == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

/* Encode m into g->buf and send it on fd. */
static int send_msg(hel_ranks *g, int fd, const struct hel_rp_msg *m, uint64_t deadline)
{
	int64_t n = hel_rp_encode(m, NULL, 0);
	if (n < 0)
		return (int)n;
	if ((size_t)n > g->cap) {
		uint8_t *b = realloc(g->buf, (size_t)n);
		if (!b)
			return eos_fail(-ENOMEM, "ranks: out of memory");
		g->buf = b;
		g->cap = (size_t)n;
	}
	hel_rp_encode(m, g->buf, g->cap);
	return sel_shard_send(fd, g->buf, (size_t)n, deadline);
}

/* Read one frame and decode it (release with hel_rp_free). */
static int recv_msg(hel_ranks *g, int fd, struct hel_rp_msg *m, uint64_t deadline)
{
	uint8_t h[HEL_RP_HEADER];
	uint16_t type;
	uint32_t plen;
	memset(m, 0, sizeof *m);
	int rc = sel_shard_recv_all(fd, h, sizeof h, deadline);
	if (rc)
		return rc;
	if ((rc = hel_rp_header(h, sizeof h, &type, &plen)))
		return rc;
	if (g->lfd >= 0 && plen > JOIN_PAYLOAD_MAX) /* joining: a stray allocates nothing */
		return eos_fail(SEL_EFORMAT, "ranks frame %s of %u bytes while joining",
				hel_rp_type_name(type), plen);
	if (HEL_RP_HEADER + (size_t)plen > g->cap) {
		uint8_t *b = realloc(g->buf, HEL_RP_HEADER + (size_t)plen);
		if (!b)
			return eos_fail(-ENOMEM, "ranks: out of memory");
		g->buf = b;
		g->cap = HEL_RP_HEADER + (size_t)plen;
	}
	memcpy(g->buf, h, sizeof h);
	if ((rc = sel_shard_recv_all(fd, g->buf + HEL_RP_HEADER, plen, deadline)))
		return rc;
	return hel_rp_decode(g->buf, HEL_RP_HEADER + plen, m);
}

static const char *io_text(int rc, char *b, size_t cap)
{
	if (rc == -ECONNRESET)
		return "its connection was closed (the process exited or its host went away)";
	if (rc == -ETIMEDOUT)
		return "it did not answer in time";
	if (rc == SEL_EFORMAT || rc == -ENOMEM || rc == -EINVAL)
		snprintf(b, cap, "%s", eos_errmsg());
	else
		snprintf(b, cap, "%s", strerror(-rc));
	return b;
}

/* "HOST:PORT" or "[V6]:PORT" into host and port texts. */
static int split_addr(const char *a, char *host, size_t hcap, char *port, size_t pcap)
{
	const char *colon = strrchr(a, ':');
	if (!a[0] || !colon || !colon[1])
		return eos_fail(-EINVAL, "--rendezvous '%s': expected HOST:PORT", a);
	size_t hl = (size_t)(colon - a);
	const char *h = a;
	if (hl >= 2 && a[0] == '[' && a[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl == 0 || hl >= hcap || strlen(colon + 1) >= pcap)
		return eos_fail(-EINVAL, "--rendezvous '%s': expected HOST:PORT", a);
	memcpy(host, h, hl);
	host[hl] = '\0';
	snprintf(port, pcap, "%s", colon + 1);
	char *end;
	unsigned long p = strtoul(port, &end, 10);
	if (*end || p > 65535)
		return eos_fail(-EINVAL, "--rendezvous '%s': port '%s' is not 0..65535", a, port);
	return 0;
}

static int resolve(const char *a, bool passive, struct addrinfo **out)
{
	char host[256], port[16];
	int rc = split_addr(a, host, sizeof host, port, sizeof port);
	if (rc)
		return rc;
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = passive ? AI_PASSIVE : 0};
	int e = getaddrinfo(host, port, &hints, out);
	if (e)
		return eos_fail(-EINVAL, "--rendezvous '%s': %s", a, gai_strerror(e));
	return 0;
}

static struct hel_ranks *alloc_group(const struct hel_ranks_config *cfg)
{
	struct hel_ranks *g = calloc(1, sizeof *g);
	if (!g)
		return NULL;
	g->cfg = *cfg;
	snprintf(g->rendezvous, sizeof g->rendezvous, "%s", cfg->rendezvous ? cfg->rendezvous : "");
	g->cfg.rendezvous = g->rendezvous;
	if (!g->cfg.join_ns)
		g->cfg.join_ns = JOIN_NS_DEFAULT;
	if (!g->cfg.step_ns)
		g->cfg.step_ns = STEP_NS_DEFAULT;
	g->lfd = -1;
	g->wake[0] = g->wake[1] = -1;
	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->done_cv, &ca);
	pthread_condattr_destroy(&ca);
	g->fd = malloc(cfg->world * sizeof *g->fd);
	g->acc = malloc(HEL_RP_MAX_SUM * sizeof *g->acc);
	if (!g->fd || !g->acc) {
		free(g->fd);
		free(g->acc);
		free(g);
		return NULL;
	}
	for (uint32_t r = 0; r < cfg->world; r++)
		g->fd[r] = -1;
	return g;
}

static void free_group(hel_ranks *g)
{
	for (uint32_t r = 0; r < g->cfg.world; r++)
		if (g->fd[r] >= 0)
			close(g->fd[r]);
	if (g->lfd >= 0)
		close(g->lfd);
	pthread_mutex_destroy(&g->mu);
	pthread_cond_destroy(&g->done_cv);
	free(g->fd);
	free(g->acc);
	free(g->buf);
	free(g);
}

static int check_config(const struct hel_ranks_config *cfg)
{
	if (!cfg->core || cfg->world < 2 || cfg->world > SEL_SHARD_WORLD_MAX)
		return eos_fail(-EINVAL, "--ranks %u: expected 2..%u ranks in separate processes",
				cfg->world, SEL_SHARD_WORLD_MAX);
	if (cfg->world != cfg->core->ranks)
		return eos_fail(-EINVAL, "--ranks %u: core '%s' has %u ranks", cfg->world,
				cfg->core->name, cfg->core->ranks);
	if (cfg->rank >= cfg->world)
		return eos_fail(-EINVAL, "--rank %u: expected 0..%u", cfg->rank, cfg->world - 1);
	if (!cfg->rendezvous || !cfg->rendezvous[0])
		return eos_fail(-EINVAL, "--ranks %u needs --rendezvous HOST:PORT", cfg->world);
	return 0;
}

/* ---- rank 0: the model's callbacks --------------------------------------------- */

static int tp_call(void *ctx, const hel_tp_call *c)
{
	hel_ranks *g = ctx;
	int rc = stopped(g);
	if (rc)
		return rc;
	struct hel_rp_msg m = {.type = HEL_RP_CALL, .call = *c};
	uint64_t dl = deadline_in(g->cfg.step_ns);
	for (uint32_t r = 1; r < g->cfg.world; r++) {
		char b[512];
		if ((rc = send_msg(g, g->fd[r], &m, dl)))
			return stop(g, 0, "rank %u: %s", r, io_text(rc, b, sizeof b));
	}
	atomic_fetch_add(&g->calls_sent, 1);
	return 0;
}

static int leader_reduce(void *ctx, uint64_t *w, size_t n)
{
	hel_ranks *g = ctx;
	int rc = stopped(g);
	if (rc)
		return rc;
	if (n > HEL_RP_MAX_SUM)
		return stop(g, -EINVAL, "a reduction of %zu words (at most %u)", n, HEL_RP_MAX_SUM);
	uint64_t dl = deadline_in(g->cfg.step_ns);
	memcpy(g->acc, w, n * 8);
	for (uint32_t r = 1; r < g->cfg.world; r++) {
		struct hel_rp_msg m;
		char b[512];
		rc = recv_msg(g, g->fd[r], &m, dl);
		if (rc == 0 && m.type == HEL_RP_ERROR)
			rc = stop(g, 0, "rank %u failed: %s", r, m.error.text);
		else if (rc == 0 && (m.type != HEL_RP_PART || m.sum.n != n))
			rc = stop(g, SEL_EFORMAT,
				  "rank %u sent %s (%u words) where its share of %zu "
				  "words was due: the ranks are out of step",
				  r, hel_rp_type_name(m.type), m.sum.n, n);
		else if (rc)
			rc = stop(g, 0, "rank %u: %s", r, io_text(rc, b, sizeof b));
		else
			for (size_t i = 0; i < n; i++)
				g->acc[i] += m.sum.w[i];
		hel_rp_free(&m);
		if (rc)
			return rc;
	}
	struct hel_rp_msg s = {.type = HEL_RP_SUM, .sum = {(uint32_t)n, g->acc}};
	for (uint32_t r = 1; r < g->cfg.world; r++) {
		char b[512];
		if ((rc = send_msg(g, g->fd[r], &s, dl)))
			return stop(g, 0, "rank %u: %s", r, io_text(rc, b, sizeof b));
	}
	memcpy(w, g->acc, n * 8);
	return 0;
}

/* The layout fingerprint rank `rank` presents: its one-rank geometry. */
static int rank_fingerprint(hel_model *m, uint32_t rank, uint32_t world, uint8_t *out)
{
	sel_geometry *geo;
	int rc = hel_model_geometry(m, &geo);
	if (rc)
		return rc;
	sel_shard_rank_fingerprint(&geo->rank[0], geo->page_tokens, rank, world, out);
	sel_geometry_free(geo);
	return 0;
}

static void fp_hex(const uint8_t *f, char *out)
{
	for (unsigned i = 0; i < 8; i++)
		sprintf(out + 2 * (size_t)i, "%02x", f[i]);
}

/* START: every peer makes its model and answers with its fingerprint. */
static int leader_start(void *ctx, hel_model *model)
{
	hel_ranks *g = ctx;
	uint64_t dl = deadline_in(g->cfg.join_ns);
	struct hel_rp_msg s = {.type = HEL_RP_START,
			       .start = {hel_model_mode(model), hel_model_page_count(model),
					 hel_model_row_count(model)}};
	int rc;
	for (uint32_t r = 1; r < g->cfg.world; r++) {
		char b[512];
		if ((rc = send_msg(g, g->fd[r], &s, dl)))
			return stop(g, 0, "rank %u: %s", r, io_text(rc, b, sizeof b));
	}
	for (uint32_t r = 1; r < g->cfg.world; r++) {
		uint8_t want[HEL_RP_FP_BYTES];
		struct hel_rp_msg m;
		char b[512], hw[20], hg[20];
		if ((rc = rank_fingerprint(model, r, g->cfg.world, want)))
			return rc;
		rc = recv_msg(g, g->fd[r], &m, dl);
		if (rc)
			return stop(g, 0, "rank %u did not start: %s", r, io_text(rc, b, sizeof b));
		if (m.type == HEL_RP_ERROR)
			return stop(g, m.error.status ? m.error.status : -EINVAL,
				    "rank %u could not start: %s", r, m.error.text);
		if (m.type != HEL_RP_READY)
			return stop(g, SEL_EFORMAT, "rank %u answered START with %s", r,
				    hel_rp_type_name(m.type));
		if (memcmp(m.ready.fingerprint, want, HEL_RP_FP_BYTES)) {
			fp_hex(m.ready.fingerprint, hg);
			fp_hex(want, hw);
			return stop(g, SEL_ELAYOUT,
				    "rank %u's layout fingerprint %s differs from the %s rank 0 "
				    "computes for it: the ranks disagree on the core's geometry",
				    r, hg, hw);
		}
	}
	return 0;
}

const hel_model_tp *hel_ranks_tp(hel_ranks *g) { return &g->tp; }

/* ---- rank 0: the disk store's rank links (design 2.14) ------------------------- */

static uint64_t store_calls(void *ctx)
{
	hel_ranks *g = ctx;
	return atomic_load(&g->calls_sent);
}

static int store_fd(void *ctx, uint32_t rank)
{
	hel_ranks *g = ctx;
	return rank > 0 && rank < g->cfg.world ? g->fd[rank] : -1;
}

/* A peer's HELLO goes over its rendezvous connection as a STORE frame. */
static int store_hello(void *ctx, uint32_t rank, const void *buf, size_t len)
{
	hel_ranks *g = ctx;
	struct hel_rp_msg m = {.type = HEL_RP_STORE};
	if (len == 0 || len > HEL_RP_STORE_MAX)
		return eos_fail(-EINVAL, "ranks: a HELLO of %zu bytes", len);
	m.store.n = (uint32_t)len;
	memcpy(m.store.b, buf, len);
	struct sel_shard_msg h;
	if (rank == 1 && g->cfg.links && sel_shard_decode(buf, len, NULL, &h) == 0) {
		g->cfg.links(g->cfg.dead_ctx, h.u.hello.port);
		sel_shard_msg_free(&h);
	}
	char b[512];
	int rc = send_msg(g, g->fd[rank], &m, deadline_in(HELLO_NS));
	return rc ? stop(g, rc, "rank %u: %s", rank, io_text(rc, b, sizeof b)) : 0;
}

const struct sel_store_ranks *hel_ranks_store(hel_ranks *g)
{
	g->store = (struct sel_store_ranks){.world = g->cfg.world,
					    .ctx = g,
					    .rendezvous_fd = store_fd,
					    .send_hello = store_hello,
					    .calls = store_calls,
					    .join_ns = STORE_JOIN_NS,
					    .queue_jobs = g->cfg.test_queue_jobs,
					    .job_timeout_ns = g->cfg.test_job_timeout_ns,
					    .sock_buf = g->cfg.test_sock_buf};
	return &g->store;
}

/* ---- rank 0: listen, join, watch, close ----------------------------------------- */

static int bind_listener(hel_ranks *g)
{
	struct addrinfo *ai;
	int rc = resolve(g->rendezvous, true, &ai), err = 0;
	if (rc)
		return rc;
	for (struct addrinfo *a = ai; a && g->lfd < 0; a = a->ai_next) {
		int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
		if (fd < 0)
			continue;
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0)
			g->lfd = fd;
		else {
			err = errno;
			close(fd);
		}
	}
	freeaddrinfo(ai);
	if (g->lfd < 0)
		return eos_fail(-(err ? err : EADDRNOTAVAIL), "--rendezvous %s: cannot listen: %s",
				g->rendezvous, strerror(err ? err : EADDRNOTAVAIL));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	char host[NI_MAXHOST], port[NI_MAXSERV];
	if (getsockname(g->lfd, (struct sockaddr *)&ss, &sl) ||
	    getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, port, sizeof port,
			NI_NUMERICHOST | NI_NUMERICSERV))
		return eos_fail(-errno, "--rendezvous %s: cannot read the bound address",
				g->rendezvous);
	snprintf(g->addr, sizeof g->addr, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
	return 0;
}

int hel_ranks_listen(const struct hel_ranks_config *cfg, hel_ranks **out)
{
	*out = NULL;
	int rc = check_config(cfg);
	if (rc)
		return rc;
	if (cfg->rank != 0)
		return eos_fail(-EINVAL, "ranks: only rank 0 listens");
	hel_ranks *g = alloc_group(cfg);
	if (!g)
		return eos_fail(-ENOMEM, "ranks: out of memory");
	g->tp = (hel_model_tp){.rank = 0,
			       .reduce = leader_reduce,
			       .call = tp_call,
			       .start = leader_start,
			       .ctx = g};
	if ((rc = bind_listener(g))) {
		free_group(g);
		return rc;
	}
	*out = g;
	return 0;
}

const char *hel_ranks_address(const hel_ranks *g) { return g->addr; }

static void refuse(hel_ranks *g, int fd, int status, const char *text)
{
	struct hel_rp_msg e = {.type = HEL_RP_ERROR};
	e.error.status = status;
	snprintf(e.error.text, sizeof e.error.text, "%s", text);
	(void)send_msg(g, fd, &e, deadline_in(1000000000ull));
}

static void hex(const uint8_t *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

/* Judge one connection's JOIN: 1 joined, 0 refused (go on waiting), or a
 * failure of the join (another core or world: the deployment is wrong). */
static int judge(hel_ranks *g, int fd)
{
	struct hel_rp_msg m;
	int rc = recv_msg(g, fd, &m, deadline_in(HELLO_NS));
	if (rc || m.type != HEL_RP_JOIN) {
		hel_rp_free(&m);
		refuse(g, fd, -EPROTO, "expected a JOIN");
		return 0;
	}
	const hel_core *c = g->cfg.core;
	char text[400], a[2 * SEL_IDENTITY_BYTES + 1], b[2 * SEL_IDENTITY_BYTES + 1];
	if (m.join.world != g->cfg.world) {
		snprintf(text, sizeof text, "rank %u runs %u ranks, rank 0 %u", m.join.rank,
			 m.join.world, g->cfg.world);
		refuse(g, fd, -EINVAL, text);
		return eos_fail(-EINVAL, "the ranks disagree: %s", text);
	}
	if (memcmp(m.join.identity, c->identity, SEL_IDENTITY_BYTES)) {
		hex(m.join.identity, 8, a);
		hex(c->identity, 8, b);
		snprintf(text, sizeof text,
			 "rank %u runs another core (identity %s..., rank 0's '%s' %s...)",
			 m.join.rank, a, c->name, b);
		refuse(g, fd, SEL_EIDENTITY, text);
		return eos_fail(SEL_EIDENTITY, "the ranks disagree: %s", text);
	}
	if (m.join.rank == 0 || m.join.rank >= g->cfg.world || g->fd[m.join.rank] >= 0) {
		snprintf(text, sizeof text, "rank %u %s", m.join.rank,
			 m.join.rank && m.join.rank < g->cfg.world ? "joined already"
								   : "is out of range");
		refuse(g, fd, -EINVAL, text);
		fprintf(stderr, "flare: rank 0: refused a join: %s\n", text);
		return 0;
	}
	g->fd[m.join.rank] = fd;
	return 1;
}

static void *watch(void *arg);

int hel_ranks_join(hel_ranks *g)
{
	uint64_t dl = deadline_in(g->cfg.join_ns);
	uint32_t joined = 1;
	while (joined < g->cfg.world) {
		int rc = wait_fd(g->lfd, POLLIN, dl);
		if (rc == -ETIMEDOUT) {
			char miss[256] = "";
			for (uint32_t r = 1; r < g->cfg.world; r++)
				if (g->fd[r] < 0)
					snprintf(miss + strlen(miss), sizeof miss - strlen(miss),
						 " %u", r);
			return eos_fail(-ETIMEDOUT, "rank 0: ranks%s did not join %s in time", miss,
					g->addr);
		}
		if (rc)
			return eos_fail(rc, "rank 0: %s", strerror(-rc));
		int fd = accept4(g->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		sel_shard_sockopts(fd, 0);
		if ((rc = judge(g, fd)) < 0) {
			close(fd);
			return rc;
		}
		if (rc == 0)
			close(fd);
		else
			joined++;
	}
	close(g->lfd);
	g->lfd = -1;
	if (pipe2(g->wake, O_CLOEXEC))
		return eos_fail(-errno, "ranks: pipe: %s", strerror(errno));
	if (pthread_create(&g->watcher, NULL, watch, g))
		return eos_fail(-EAGAIN, "ranks: cannot start the watcher thread");
	g->watching = true;
	return 0;
}

/* A peer's connection that hangs up stops the group, computing or not. */
static void *watch(void *arg)
{
	hel_ranks *g = arg;
	uint32_t n = g->cfg.world;
	struct pollfd p[SEL_SHARD_WORLD_MAX + 1];
	for (uint32_t r = 1; r < n; r++)
		p[r - 1] = (struct pollfd){g->fd[r], POLLRDHUP, 0};
	p[n - 1] = (struct pollfd){g->wake[0], POLLIN, 0};
	for (;;) {
		if (poll(p, n, -1) < 0 && errno == EINTR)
			continue;
		if (p[n - 1].revents)
			return NULL;
		for (uint32_t r = 1; r < n; r++)
			if (p[r - 1].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
				(void)stop(g, 0,
					   "rank %u: its connection was closed (the process "
					   "exited or its host went away)",
					   r);
				return NULL;
			}
	}
}

void hel_ranks_close(hel_ranks *g, const char *why)
{
	if (!g)
		return;
	if (g->watching) {
		char c = 1;
		(void)!write(g->wake[1], &c, 1);
		pthread_join(g->watcher, NULL);
	}
	if (g->wake[0] >= 0)
		close(g->wake[0]);
	if (g->wake[1] >= 0)
		close(g->wake[1]);
	/* BYE, or the reason every surviving peer stops with (best effort: a
	 * dead peer's connection just fails). */
	const char *failed = hel_ranks_failure(g);
	struct hel_rp_msg m = {.type = failed || why ? HEL_RP_ERROR : HEL_RP_BYE};
	if (m.type == HEL_RP_ERROR) {
		m.error.status = SEL_ESTOPPED;
		sel_shard_text(m.error.text, failed ? failed : why);
	}
	for (uint32_t r = 1; r < g->cfg.world; r++)
		if (g->fd[r] >= 0)
			(void)send_msg(g, g->fd[r], &m, deadline_in(1000000000ull));
	free_group(g);
}

/* ---- a peer ----------------------------------------------------------------------- */

static int peer_connect(hel_ranks *g)
{
	uint64_t dl = deadline_in(g->cfg.join_ns);
	int last = 0;
	for (;;) {
		struct addrinfo *ai;
		int rc = resolve(g->rendezvous, false, &ai);
		if (rc)
			return rc;
		for (struct addrinfo *a = ai; a; a = a->ai_next) {
			int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (fd < 0)
				continue;
			if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
				freeaddrinfo(ai);
				sel_shard_sockopts(fd, 0);
				g->fd[0] = fd;
				return 0;
			}
			last = errno;
			close(fd);
		}
		freeaddrinfo(ai);
		if (eos_now_ns() >= dl)
			return eos_fail(-ETIMEDOUT, "rank %u: cannot reach rank 0 at %s: %s",
					g->cfg.rank, g->rendezvous, strerror(last));
		struct timespec ts = {0, 100000000}; /* rank 0 may not listen yet */
		nanosleep(&ts, NULL);
	}
}

static int peer_reduce(void *ctx, uint64_t *w, size_t n)
{
	hel_ranks *g = ctx;
	int rc = stopped(g);
	if (rc)
		return rc;
	uint64_t dl = deadline_in(g->cfg.step_ns);
	struct hel_rp_msg m = {.type = HEL_RP_PART, .sum = {(uint32_t)n, w}};
	char b[512];
	if ((rc = send_msg(g, g->fd[0], &m, dl)))
		return stop(g, 0, "rank 0: %s", io_text(rc, b, sizeof b));
	if ((rc = recv_msg(g, g->fd[0], &m, dl)))
		return stop(g, 0, "rank 0: %s", io_text(rc, b, sizeof b));
	if (m.type != HEL_RP_SUM || m.sum.n != n) {
		rc = stop(g, SEL_EFORMAT, "rank 0 sent %s where the sum of %zu words was due",
			  hel_rp_type_name(m.type), n);
		hel_rp_free(&m);
		return rc;
	}
	memcpy(w, m.sum.w, n * 8);
	hel_rp_free(&m);
	return 0;
}

/* START: the model rank 0 describes, and this rank's fingerprint. */
static int peer_start(hel_ranks *g, const struct hel_rp_msg *s, hel_model **model)
{
	hel_model_opts o = {0};
	o.mode = (sel_state_mode)s->start.mode;
	o.pages = s->start.pages;
	o.rows = s->start.rows;
	o.tp = &g->tp;
	struct hel_rp_msg r = {.type = HEL_RP_READY};
	int rc = hel_model_create(g->cfg.core, &o, model);
	if (rc == 0)
		rc = rank_fingerprint(*model, g->cfg.rank, g->cfg.world, r.ready.fingerprint);
	if (rc) {
		char text[HEL_RP_TEXT_MAX + 1];
		sel_shard_text(text, eos_errmsg());
		rc = eos_fail(rc, "%s", text);
		refuse(g, g->fd[0], rc, text);
		return rc;
	}
	return send_msg(g, g->fd[0], &r, deadline_in(g->cfg.step_ns));
}

/* The record service's wait for the model calls rank 0 sent before a job
 * (any thread but the serving one): 0, or -ETIMEDOUT. */
static int wait_calls(void *ctx, uint64_t n, uint64_t deadline_ns)
{
	hel_ranks *g = ctx;
	int rc = 0;
	pthread_mutex_lock(&g->mu);
	while (g->calls_done < n && !g->stopped && rc == 0) {
		uint64_t now = eos_now_ns();
		if (now >= deadline_ns) {
			rc = -ETIMEDOUT;
			break;
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec +
			     (deadline_ns - now < 100000000ull ? deadline_ns - now : 100000000ull);
		ts.tv_sec = (time_t)(t / 1000000000ull);
		ts.tv_nsec = (long)(t % 1000000000ull);
		(void)pthread_cond_timedwait(&g->done_cv, &g->mu, &ts);
	}
	if (rc == 0 && g->calls_done < n)
		rc = -ECANCELED; /* the group stopped: the calls never come */
	pthread_mutex_unlock(&g->mu);
	return rc;
}

/* STORE: this rank's record service over its model's planes (design
 * 2.14), its transport started before it joins. */
static int peer_store(hel_ranks *g, hel_model *model, const struct hel_rp_msg *m)
{
	const struct hel_ranks_config *c = &g->cfg;
	int rc = hel_model_geometry(model, &g->svc_geo);
	if (rc)
		return rc;
	bool disk = c->disk_dir && *c->disk_dir && !(c->disk_limit_set && c->disk_limit == 0);
	struct sel_shard_service_config sc = {.world = c->world,
					      .rank = c->rank,
					      .geometry = g->svc_geo,
					      .disk_dir = disk ? c->disk_dir : NULL,
					      .disk_limit = c->disk_limit,
					      .fdatasync = c->fdatasync,
					      .rendezvous_fd = g->fd[0],
					      .join_ns = STORE_JOIN_NS,
					      .sock_buf = c->test_sock_buf,
					      .test_join_delay_ms = c->test_join_delay_ms,
					      .wait_calls = wait_calls,
					      .calls_ctx = g,
					      .test_block_stores = c->test_block_stores};
	hel_model_offload_identity(model, sc.identity);
	if ((rc = sel_shard_service_start(&sc, m->store.b, m->store.n, &g->svc))) {
		char text[HEL_RP_TEXT_MAX + 1];
		sel_shard_text(text, eos_errmsg());
		rc = eos_fail(rc, "rank %u: %s", c->rank, text);
		refuse(g, g->fd[0], rc, text);
	}
	return rc;
}

/* The record service's end, after rank 0's BYE or a failure. */
static int peer_store_end(hel_ranks *g, int rc)
{
	if (!g->svc)
		return rc;
	char why[EOS_ERRMSG_MAX], keep[EOS_ERRMSG_MAX];
	snprintf(keep, sizeof keep, "%s", rc ? eos_errmsg() : "");
	int src = sel_shard_service_wait(g->svc, why, sizeof why);
	sel_shard_service_free(g->svc);
	g->svc = NULL;
	if (rc)
		return eos_fail(rc, "%s", keep);
	if (src)
		return eos_fail(src, "%s", why);
	return 0;
}

/* Serve rank 0's frames until BYE. */
static int peer_serve(hel_ranks *g, hel_model **model)
{
	for (;;) {
		struct hel_rp_msg m;
		char b[512];
		/* Idle as long as rank 0 is (keepalive ends a vanished host's
		 * connection); a frame once begun must arrive by the deadline. */
		int rc = wait_fd(g->fd[0], POLLIN, UINT64_MAX);
		if (rc == 0)
			rc = recv_msg(g, g->fd[0], &m, deadline_in(g->cfg.step_ns));
		else
			memset(&m, 0, sizeof m);
		if (rc) {
			hel_rp_free(&m);
			return eos_fail(rc == -ECONNRESET ? -ECONNRESET : rc, "rank %u: rank 0: %s",
					g->cfg.rank, io_text(rc, b, sizeof b));
		}
		if (m.type == HEL_RP_BYE)
			return 0;
		if (m.type == HEL_RP_ERROR) {
			rc = eos_fail(m.error.status < 0 ? m.error.status : -EPROTO,
				      "rank %u: rank 0 ended the instance: %s", g->cfg.rank,
				      m.error.text);
		} else if (m.type == HEL_RP_START && !*model) {
			rc = peer_start(g, &m, model);
		} else if (m.type == HEL_RP_STORE && *model && !g->svc) {
			rc = peer_store(g, *model, &m);
		} else if (m.type == HEL_RP_CALL && *model) {
			/* A call that fails fails on rank 0 alike (the same state,
			 * the same checks); only the reductions carry data back. */
			(void)hel_model_tp_run(*model, &m.call);
			pthread_mutex_lock(&g->mu);
			g->calls_done++;
			pthread_cond_broadcast(&g->done_cv);
			pthread_mutex_unlock(&g->mu);
			rc = stopped(g);
		} else {
			rc = eos_fail(SEL_EFORMAT, "rank %u: rank 0 sent %s out of order",
				      g->cfg.rank, hel_rp_type_name(m.type));
		}
		hel_rp_free(&m);
		if (rc)
			return rc;
	}
}

int hel_ranks_peer(const struct hel_ranks_config *cfg)
{
	int rc = check_config(cfg);
	if (rc)
		return rc;
	if (cfg->rank == 0)
		return eos_fail(-EINVAL, "ranks: rank 0 listens (hel_ranks_listen)");
	hel_ranks *g = alloc_group(cfg);
	if (!g)
		return eos_fail(-ENOMEM, "ranks: out of memory");
	g->cfg.dead = NULL;
	g->tp = (hel_model_tp){.rank = cfg->rank, .reduce = peer_reduce, .ctx = g};
	hel_model *model = NULL;
	if ((rc = peer_connect(g)) == 0) {
		struct hel_rp_msg j = {.type = HEL_RP_JOIN,
				       .join = {.world = cfg->world, .rank = cfg->rank}};
		memcpy(j.join.identity, cfg->core->identity, SEL_IDENTITY_BYTES);
		char b[512];
		if ((rc = send_msg(g, g->fd[0], &j, deadline_in(HELLO_NS))))
			rc = eos_fail(rc, "rank %u: rank 0: %s", cfg->rank,
				      io_text(rc, b, sizeof b));
		else
			rc = peer_serve(g, &model);
	}
	rc = peer_store_end(g, rc);
	char keep[1024];
	snprintf(keep, sizeof keep, "%s", rc ? eos_errmsg() : "");
	hel_model_destroy(model);
	sel_geometry_free(g->svc_geo);
	free_group(g);
	return rc ? eos_fail(rc, "%s", keep) : 0;
}
