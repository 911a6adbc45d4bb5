/*
 * test_pool_faults.c - `flare pool` under faults, as real processes
 * (design 2.15 "Faults"; docs/pool.md):
 *
 *   - kill -9 of a client mid-put, mid-claim, and of a holder mid-export:
 *     the leases are reclaimed, the arena bytes come back, the requester
 *     hears GONE; a requester killed mid-export cancels it at the holder;
 *   - a client that sends forged handles (refused, counted, closed after
 *     64), garbage frames (closed), nothing (closed after the hello
 *     timeout), floods of holdings (capped), half frames, and one that
 *     never reads (closed when its queue fills) -- while the manager keeps
 *     answering a well-behaved client and its RSS stays bounded;
 *   - the no-progress timeout and a put committed after it;
 *   - a duplicate instance id;
 *   - kill -9 of the manager during a claim: the client reports the lease
 *     failed, drains, releases, and reattaches to the restarted manager on
 *     a kept arena file (same generation); on a memfd arena the new
 *     generation disables sharing with one warning.
 *
 * Children are this program re-executed with --role, so they are fresh
 * processes with their own threads; they tell the parent what they reached
 * through a pipe (fd 3) and wait to be killed.
 */
#include "pool_testlib.h"

#include <sys/un.h>

#include "internal.h"

static char dir[200];
static const char *self;

/* ---- children ----------------------------------------------------------------------- */

static void say(char c)
{
	if (write(3, &c, 1) != 1)
		_exit(91);
}

static void role(const char *what, const char *sock)
{
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct mgr_proc m = {0};
	snprintf(m.sock, sizeof m.sock, "%s", sock);
	struct tc t;
	if (tc_attach(&t, &m, &s, what, 0))
		_exit(92);
	sel_history h;
	hist_make(&h, &s, 700, 77, 0);
	if (!strcmp(what, "putter")) {
		struct sel_pool_put_desc d = {key_at(&h, 256), {0}, bucket_of(&h, 256), 4};
		uint64_t id;
		CHECK_OK(sel_pool_put(t.c, &d, &id));
		struct sel_pool_event e = tc_wait(&t, SEL_POOL_EV_PUT_GRANTED, 10);
		/* Half the copy, then death. */
		uint8_t *p = sel_pool_slot_addr(t.c, e.lease->page_slots[0]);
		memset(p, 0xab, sel_pool_slot_bytes(t.c));
		say('g');
	} else if (!strcmp(what, "holder")) {
		struct sel_pool_holding hd = {SEL_POOL_SRC_GPU, key_at(&h, 640), bucket_of(&h, 640),
					      1};
		CHECK_OK(sel_pool_announce(t.c, &hd, 1));
		tc_sync(&t, &h);
		say('a');
		struct sel_pool_event e = tc_wait(&t, SEL_POOL_EV_EXPORT, 20);
		CHECK_OK(sel_pool_export_reply(t.c, e.lease, SEL_POOL_OK));
		memset(sel_pool_slot_addr(t.c, e.lease->page_slots[0]), 0xcd,
		       sel_pool_slot_bytes(t.c));
		say('x');
	} else if (!strcmp(what, "reader")) {
		sel_pool_ticket *k = lookup(&t, &h, 0, 700);
		uint32_t why;
		if (!sel_pool_ticket_answer(k)->n_cands)
			_exit(93);
		struct sel_pool_lease *l = claim(&t, k, 0, &why);
		if (!l)
			_exit(94);
		say('c');
	} else if (!strcmp(what, "requester")) {
		sel_pool_ticket *k = lookup(&t, &h, 0, 700);
		if (!sel_pool_ticket_answer(k)->n_cands)
			_exit(93);
		uint64_t id;
		CHECK_OK(sel_pool_claim(t.c, k, 0, &id));
		say('r');
	} else if (!strcmp(what, "dup")) {
		say('d');
	}
	for (;;)
		pause();
}

struct child {
	pid_t pid;
	int rd;
};

static struct child spawn(const char *what, const struct mgr_proc *m)
{
	int p[2];
	CHECK(!pipe(p));
	struct child c = {fork(), p[0]};
	CHECK(c.pid >= 0);
	if (c.pid == 0) {
		close(p[0]);
		if (dup2(p[1], 3) < 0)
			_exit(95);
		execl(self, self, "--role", what, m->sock, (char *)NULL);
		_exit(96);
	}
	close(p[1]);
	return c;
}

/* The child's next word, within seconds. */
static char hear(struct child *c, unsigned seconds)
{
	struct pollfd p = {c->rd, POLLIN, 0};
	CHECKF(poll(&p, 1, (int)(seconds * 1000)) == 1, "child %d said nothing in %u s",
	       (int)c->pid, seconds);
	char x = 0;
	if (read(c->rd, &x, 1) != 1) {
		int st = 0;
		waitpid(c->pid, &st, 0);
		CHECKF(false, "child %d ended (status %d) before speaking", (int)c->pid, st);
	}
	return x;
}

static void kill9(struct child *c)
{
	kill(c->pid, SIGKILL);
	int st;
	CHECK(waitpid(c->pid, &st, 0) == c->pid);
	close(c->rd);
}

/* ---- kill -9 of clients --------------------------------------------------------------- */

static void test_dead_clients(void)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "dead", "--memory", "16MiB", NULL);
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct tc a;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	sel_history h;
	hist_make(&h, &s, 700, 77, 0); /* the children's history */

	/* A putter dies with its windows half written. */
	struct child c = spawn("putter", &m);
	CHECK(hear(&c, 20) == 'g');
	wait_metric_eq(&m, "flare_pool_leases", 1, 5);
	CHECK(metric(&m, "flare_pool_arena_used_bytes") == 5 * 8192);
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_IN_FLIGHT);
	kill9(&c);
	wait_metric_eq(&m, "flare_pool_leases", 0, 10);
	wait_metric_eq(&m, "flare_pool_arena_used_bytes", 0, 5);
	CHECK(metric(&m, "flare_pool_leases_reclaimed_total") == 1);
	CHECK(metric(&m, "flare_pool_records") == 0);
	/* The key is free again, and the record is A's. */
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_OK);

	/* A reader dies holding its claim: the record stays pinned until the
	 * process is gone, then is evictable again. */
	c = spawn("reader", &m);
	CHECK(hear(&c, 20) == 'c');
	wait_metric_eq(&m, "flare_pool_leases", 1, 5);
	kill9(&c);
	wait_metric_eq(&m, "flare_pool_leases", 0, 10);
	CHECK(metric(&m, "flare_pool_records") == 1);

	/* A holder dies mid-export: the requester hears GONE. */
	c = spawn("holder", &m);
	CHECK(hear(&c, 20) == 'a');
	sel_pool_ticket *k = lookup(&a, &h, 0, 700);
	const struct sel_pool_m_answer *ans = sel_pool_ticket_answer(k);
	CHECK(ans->n_cands == 2 && ans->cands[0].source == SEL_POOL_SRC_GPU);
	uint64_t id;
	CHECK_OK(sel_pool_claim(a.c, k, 0, &id));
	CHECK(hear(&c, 20) == 'x');
	kill9(&c);
	struct sel_pool_event e = tc_wait(&a, SEL_POOL_EV_CLAIM_FAILED, 10);
	CHECK(e.request == id && e.reason == SEL_POOL_GONE);
	wait_metric_eq(&m, "flare_pool_leases", 0, 10);
	wait_metric_eq(&m, "flare_pool_arena_used_bytes", 5 * 8192, 5); /* only A's record */
	wait_metric_eq(&m, "flare_pool_holdings", 0, 5);
	sel_pool_ticket_free(a.c, k);

	/* A requester dies while A exports for it: A hears of it, finishes,
	 * and the windows come back. */
	struct sel_pool_holding hd = {SEL_POOL_SRC_GPU, key_at(&h, 640), bucket_of(&h, 640), 1};
	CHECK_OK(sel_pool_announce(a.c, &hd, 1));
	tc_sync(&a, &h);
	c = spawn("requester", &m);
	CHECK(hear(&c, 20) == 'r');
	e = tc_wait(&a, SEL_POOL_EV_EXPORT, 10);
	CHECK_OK(sel_pool_export_reply(a.c, e.lease, SEL_POOL_OK));
	kill9(&c);
	struct sel_pool_event x = tc_wait(&a, SEL_POOL_EV_EXPORT_CANCEL, 10);
	CHECK(x.lease == e.lease);
	uint64_t *ck = calloc(e.lease->n_pages + 1, sizeof *ck);
	CHECK_OK(sel_pool_export_done(a.c, e.lease, ck, 0));
	free(ck);
	wait_metric_eq(&m, "flare_pool_leases", 0, 10);
	wait_metric_eq(&m, "flare_pool_arena_used_bytes", 5 * 8192, 5);
	sel_history_free(&h);
	tc_close(&a);
	mgr_stop(&m);
	scope_free(&s);
}

/* ---- misbehaving clients --------------------------------------------------------------------- */

static int raw_connect(const char *sock)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
	CHECK(fd >= 0 && !connect(fd, (struct sockaddr *)&sa, sizeof sa));
	return fd;
}

/* Send m: true, or false when the manager closed the connection already
 * (EPIPE, ECONNRESET). */
static bool raw_try_send(int fd, const struct sel_pool_msg *m)
{
	uint8_t b[1 << 16];
	int64_t n = sel_pool_encode(m, b, sizeof b);
	CHECK(n > 0);
	ssize_t k = send(fd, b, (size_t)n, MSG_NOSIGNAL);
	CHECKF(k == n || (k < 0 && (errno == EPIPE || errno == ECONNRESET)), "send: %zd", k);
	return k == n;
}

static void raw_send(int fd, const struct sel_pool_msg *m) { CHECK(raw_try_send(fd, m)); }

/* Read one frame (decoded) within seconds: 0, or -1 at EOF. */
static int raw_read(int fd, struct sel_pool_msg *m, unsigned seconds)
{
	uint8_t h[8];
	size_t got = 0;
	while (got < 8) {
		struct pollfd p = {fd, POLLIN, 0};
		CHECKF(poll(&p, 1, (int)seconds * 1000) == 1, "no frame in %u s", seconds);
		union {
			struct cmsghdr c;
			char b[CMSG_SPACE(sizeof(int))];
		} cb;
		struct iovec iov = {h + got, 8 - got};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = cb.b,
				    .msg_controllen = sizeof cb.b};
		ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
		if (r <= 0)
			return -1;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_type == SCM_RIGHTS) {
				int afd;
				memcpy(&afd, CMSG_DATA(c), sizeof afd);
				close(afd);
			}
		got += (size_t)r;
	}
	uint16_t t;
	uint32_t pl;
	CHECK_OK(sel_pool_frame_header(h, 8, &t, &pl));
	uint8_t *b = malloc(8 + pl);
	memcpy(b, h, 8);
	for (got = 0; got < pl;) {
		ssize_t r = recv(fd, b + 8 + got, pl - got, 0);
		if (r <= 0) {
			free(b);
			return -1;
		}
		got += (size_t)r;
	}
	CHECK_OK(sel_pool_decode(b, 8 + pl, m));
	free(b);
	return 0;
}

static bool closed_within(int fd, unsigned seconds)
{
	uint64_t deadline = eos_now_ns() + seconds * S_NS;
	char b[4096];
	while (eos_now_ns() < deadline) {
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 100) == 1) {
			ssize_t r = recv(fd, b, sizeof b, 0);
			if (r <= 0)
				return true;
		}
	}
	return false;
}

static uint8_t table[24] = {1, 0, 0, 0, 0, 0,  0, 0, 0x70, 0x17, 0, 0,
			    0, 0, 0, 0, 0, 16, 0, 0, 0,    0,    0, 0};

/* A raw session: hello in, hello out, welcome. */
static int raw_session(const char *sock, uint8_t tag)
{
	int fd = raw_connect(sock);
	struct sel_pool_msg m;
	CHECK(raw_read(fd, &m, 10) == 0 && m.type == SEL_POOL_M_HELLO);
	struct sel_pool_msg h = {.type = SEL_POOL_C_HELLO};
	h.u.c_hello.version = SEL_POOL_VERSION;
	memset(h.u.c_hello.instance, tag, SEL_POOL_ID_BYTES);
	h.u.c_hello.scope = (struct sel_pool_scope){.page_tokens = 64,
						    .ranks = 1,
						    .slot_bytes = 8192,
						    .row_slots = 1,
						    .table_bytes = sizeof table,
						    .table = table};
	raw_send(fd, &h);
	CHECK(raw_read(fd, &m, 10) == 0 && m.type == SEL_POOL_M_WELCOME && m.u.welcome.status == 0);
	return fd;
}

static void test_misbehaving(void)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "bad", "--memory", "16MiB", "--client-queue", "64KiB", "--max-holdings",
		  "10000", "--hello-timeout", "1s", NULL);
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct tc b;
	CHECK_OK(tc_attach(&b, &m, &s, "B", 0));
	sel_history h;
	hist_make(&h, &s, 300, 5, 0);
	CHECK(put_record(&b, &h, 256, 0) == SEL_POOL_OK);
	wait_metric_eq(&m, "flare_pool_sessions", 1, 5);
	long rss0 = rss_kib(m.pid);

	/* Forged handles: refused one by one, then the connection closes. */
	int fd = raw_session(m.sock, 1);
	for (int i = 0; i < 70; i++) {
		struct sel_pool_msg r = {.type = i % 2 ? SEL_POOL_C_RELEASE : SEL_POOL_C_PROGRESS};
		if (i % 2)
			r.u.ls = (struct sel_pool_lease_status){1000 + (uint64_t)i, 7, 0};
		else
			r.u.progress = (struct sel_pool_c_progress){1 + (uint64_t)i, 9, 0};
		if (!raw_try_send(fd,
				  &r)) { /* closed after 64: a fast manager may be there first */
			CHECK(i >= 64);
			break;
		}
	}
	struct sel_pool_msg e;
	CHECK(raw_read(fd, &e, 10) == 0 && e.type == SEL_POOL_M_ERROR && !e.u.error.fatal &&
	      (e.u.error.code == SEL_POOL_FORGED || e.u.error.code == SEL_POOL_STALE));
	CHECK(closed_within(fd, 10));
	close(fd);
	/* /metrics is a snapshot of the manager's last tick: wait for it. */
	long long forged;
	uint64_t until = eos_now_ns() + 10 * S_NS;
	while ((forged = metric(&m, "flare_pool_frames_refused_total{reason=\"forged\"}") +
			 metric(&m, "flare_pool_frames_refused_total{reason=\"stale\"}")) < 65 &&
	       eos_now_ns() < until)
		eos_sleep_ns(20 * MS_NS);
	CHECKF(forged >= 65, "forged %lld", forged);
	/* A commit naming B's lease id space from another session is forged too:
	 * covered above by ids that exist (1..) and do not. */

	/* Garbage after the hello, and before it. */
	fd = raw_session(m.sock, 2);
	uint8_t junk[64];
	memset(junk, 0x5a, sizeof junk);
	CHECK(send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
	CHECK(raw_read(fd, &e, 10) == 0 && e.type == SEL_POOL_M_ERROR && e.u.error.fatal &&
	      e.u.error.code == SEL_POOL_MALFORMED);
	CHECK(closed_within(fd, 10));
	close(fd);
	fd = raw_connect(m.sock);
	CHECK(send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
	CHECK(closed_within(fd, 10));
	close(fd);
	/* A frame of the manager's kind from a client. */
	fd = raw_session(m.sock, 3);
	struct sel_pool_msg w = {.type = SEL_POOL_M_WELCOME};
	raw_send(fd, &w);
	CHECK(closed_within(fd, 10));
	close(fd);
	/* Silence: closed after the hello timeout. */
	fd = raw_connect(m.sock);
	CHECK(closed_within(fd, 10));
	close(fd);
	wait_metric(&m, "flare_pool_disconnects_total{cause=\"hello_timeout\"}", 1, false, 5);

	/* Half frames: eight connections each leave most of a 1 MiB frame. */
	int half[8];
	uint8_t *big = calloc(1, SEL_POOL_FRAME_MAX);
	for (int i = 0; i < 8; i++) {
		half[i] = raw_session(m.sock, (uint8_t)(10 + i));
		uint8_t hd[8];
		sel_put_u32(hd, SEL_POOL_FRAME_MAX);
		sel_put_u16(hd + 4, SEL_POOL_C_ANNOUNCE);
		sel_put_u16(hd + 6, 0);
		CHECK(send(half[i], hd, 8, MSG_NOSIGNAL) == 8);
		size_t sent = 0;
		while (sent < SEL_POOL_FRAME_MAX - 4096) {
			ssize_t r = send(half[i], big + sent, SEL_POOL_FRAME_MAX - 4096 - sent,
					 MSG_NOSIGNAL);
			CHECK(r > 0);
			sent += (size_t)r;
		}
	}
	free(big);

	/* A flood of holdings: capped at --max-holdings. */
	struct tc f;
	CHECK_OK(tc_attach(&f, &m, &s, "F", 0));
	struct sel_pool_holding *hs = calloc(SEL_POOL_MAX_HOLDINGS, sizeof *hs);
	for (int round = 0; round < 12; round++) {
		for (uint32_t i = 0; i < SEL_POOL_MAX_HOLDINGS; i++) {
			hs[i].source = SEL_POOL_SRC_DRAM;
			hs[i].key.consumed = 1 + i;
			memset(hs[i].key.digest.b, round, 16);
			sel_put_u32(hs[i].key.digest.b, i);
			hs[i].generation = 1;
		}
		int rc;
		while ((rc = sel_pool_announce(f.c, hs, SEL_POOL_MAX_HOLDINGS)) == -EAGAIN)
			tc_pump(&f, 10);
		CHECK_OK(rc);
	}
	free(hs);
	tc_sync(&f, &h);
	wait_metric_eq(&m, "flare_pool_holdings", 10000, 10);
	wait_metric(&m, "flare_pool_frames_refused_total{reason=\"full\"}", 12 * 4096 - 10000,
		    false, 10);

	/* One that never reads: its answers pile up until it is closed. */
	fd = raw_session(m.sock, 4);
	int flags = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	sel_digest bd = bucket_of(&h, 256);
	struct sel_pool_msg lk = {.type = SEL_POOL_C_LOOKUP};
	lk.u.lookup = (struct sel_pool_c_lookup){1, 0, 300, 4, 1, &bd};
	uint8_t frame[256];
	int64_t fl = sel_pool_encode(&lk, frame, sizeof frame);
	CHECK(fl > 0);
	uint64_t deadline = eos_now_ns() + 30 * S_NS;
	bool closed = false;
	uint64_t lookups = 0;
	while (!closed) {
		CHECKF(eos_now_ns() < deadline,
		       "a client that never reads was not closed (%" PRIu64 " lookups)", lookups);
		ssize_t r = send(fd, frame, (size_t)fl, MSG_NOSIGNAL);
		if (r < 0 && errno == EAGAIN) {
			struct pollfd p = {fd, POLLOUT, 0};
			poll(&p, 1, 50);
			/* Meanwhile B is served. */
			sel_pool_ticket_free(b.c, lookup(&b, &h, 0, 300));
			continue;
		}
		if (r < 0) {
			closed = true;
			break;
		}
		CHECK(r == fl);
		lookups++;
	}
	close(fd);
	wait_metric(&m, "flare_pool_disconnects_total{cause=\"slow_reader\"}", 1, false, 5);

	/* The manager still serves B, and its memory stayed bounded. */
	sel_pool_ticket *k = lookup(&b, &h, 0, 300);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 1);
	uint32_t why;
	struct sel_pool_lease *l = claim(&b, k, 0, &why);
	CHECK(l);
	lease_check(b.c, l, &h, 0);
	CHECK_OK(sel_pool_release(b.c, l, SEL_POOL_OK));
	sel_pool_ticket_free(b.c, k);
	long rss1 = rss_kib(m.pid);
	printf("manager RSS: %ld KiB before the misbehaving clients, %ld KiB after\n", rss0, rss1);
#ifdef SEL_SANITIZED
	/* AddressSanitizer keeps freed memory in its quarantine (256 MiB by
	 * default) and ThreadSanitizer its shadow: RSS says nothing there. */
	printf("note: sanitized build: the manager's RSS bound is checked in the plain build only\n");
#else
	CHECKF(rss1 - rss0 < 48 * 1024, "RSS grew from %ld to %ld KiB", rss0, rss1);
#endif
	for (int i = 0; i < 8; i++)
		close(half[i]);
	tc_close(&f);
	sel_history_free(&h);
	tc_close(&b);
	mgr_stop(&m);
	scope_free(&s);
}

/* ---- timeouts and duplicates ----------------------------------------------------------------- */

static void test_timeouts(void)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "slow", "--memory", "8MiB", "--progress-timeout", "300ms", NULL);
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct tc a;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	sel_history h;
	hist_make(&h, &s, 300, 6, 0);
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_OK);
	/* A claim held without progress fails; its release still counts. */
	sel_pool_ticket *k = lookup(&a, &h, 0, 300);
	uint32_t why;
	struct sel_pool_lease *l = claim(&a, k, 0, &why);
	CHECK(l);
	struct sel_pool_event e = tc_wait(&a, SEL_POOL_EV_LEASE_FAILED, 10);
	CHECK(e.lease == l && l->failed == SEL_POOL_NO_PROGRESS);
	wait_metric_eq(&m, "flare_pool_leases", 1, 5); /* held until the release */
	CHECK_OK(sel_pool_release(a.c, l, SEL_POOL_OK));
	wait_metric_eq(&m, "flare_pool_leases", 0, 5);
	sel_pool_ticket_free(a.c, k);
	/* A put committed after its lease failed is refused. */
	struct sel_pool_put_desc d = {key_at(&h, 128), {0}, bucket_of(&h, 128), 2};
	uint64_t id;
	CHECK_OK(sel_pool_put(a.c, &d, &id));
	e = tc_wait(&a, SEL_POOL_EV_PUT_GRANTED, 10);
	l = e.lease;
	struct sel_pool_event f = tc_wait(&a, SEL_POOL_EV_LEASE_FAILED, 10);
	CHECK(f.lease == l);
	uint64_t ck[2] = {0, 0};
	CHECK_OK(sel_pool_commit(a.c, l, ck, 0));
	e = tc_wait(&a, SEL_POOL_EV_PUT_RESULT, 10);
	CHECK(e.request == id && e.reason == SEL_POOL_TIMEOUT);
	wait_metric(&m, "flare_pool_leases_failed_total{reason=\"no_progress\"}", 2, false, 5);
	wait_metric_eq(&m, "flare_pool_records", 1, 5);
	/* The same instance id twice is refused while the first is attached. */
	struct tc dup;
	CHECK_RC(tc_attach(&dup, &m, &s, "A", 2 * S_NS), -EPROTO);
	CHECK(strstr(sel_errmsg(), "duplicate") != NULL);
	struct child c = spawn("dup", &m);
	CHECK(hear(&c, 20) == 'd');
	CHECK_RC(tc_attach(&dup, &m, &s, "dup", 2 * S_NS), -EPROTO);
	kill9(&c);
	sel_history_free(&h);
	tc_close(&a);
	mgr_stop(&m);
	scope_free(&s);
}

/* ---- kill -9 of the manager --------------------------------------------------------------------- */

static void test_dead_manager(void)
{
	char arena[300];
	snprintf(arena, sizeof arena, "%s/arena.shm", dir);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr", "--memory", "8MiB", "--arena", arena, NULL);
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct tc a, b;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	CHECK_OK(tc_attach(&b, &m, &s, "B", 0));
	uint64_t gen = sel_pool_hello(b.c)->generation;
	sel_history h;
	hist_make(&h, &s, 300, 8, 0);
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_OK);
	sel_pool_ticket *k = lookup(&b, &h, 0, 300);
	uint32_t why;
	struct sel_pool_lease *l = claim(&b, k, 0, &why);
	CHECK(l);
	sel_pool_ticket_free(b.c, k);

	/* The manager dies during the claim. */
	mgr_kill9(&m);
	struct sel_pool_event e = tc_wait(&b, SEL_POOL_EV_LEASE_FAILED, 10);
	CHECK(e.lease == l && e.reason == SEL_POOL_GONE);
	tc_wait(&b, SEL_POOL_EV_DETACHED, 10);
	CHECK(sel_pool_state(b.c) == SEL_POOL_DETACHED);
	CHECK_RC(sel_pool_begin_lookup(b.c, &h, 0, 300, &k), -ENOTCONN);
	/* Its copies drain (here: the check of what it read), then it
	 * reports the restore failed by releasing. */
	lease_check(b.c, l, &h, 0);
	CHECK_OK(sel_pool_release(b.c, l, SEL_POOL_OK));
	tc_wait(&a, SEL_POOL_EV_DETACHED, 10);

	/* Back on the same arena file: the same generation, both reattach. */
	mgr_start(&m, dir, "mgr", "--memory", "8MiB", "--arena", arena, NULL);
	CHECK(file_has(m.log, "reused", NULL, 0));
	tc_wait(&b, SEL_POOL_EV_ATTACHED, 20);
	tc_wait(&a, SEL_POOL_EV_ATTACHED, 20);
	CHECK(sel_pool_state(b.c) == SEL_POOL_ATTACHED && sel_pool_hello(b.c)->generation == gen);
	wait_metric_eq(&m, "flare_pool_recovering", 0, 20);
	CHECK(file_has(m.log, "every client of the previous run reconnected or exited", NULL, 0));
	/* The new manager starts with an empty catalogue; sharing works. */
	k = lookup(&b, &h, 0, 300);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(b.c, k);
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_OK);
	k = lookup(&b, &h, 0, 300);
	l = claim(&b, k, 0, &why);
	CHECK(l);
	lease_check(b.c, l, &h, 0);
	CHECK_OK(sel_pool_release(b.c, l, SEL_POOL_OK));
	sel_pool_ticket_free(b.c, k);
	struct sel_pool_client_stats st;
	sel_pool_stats(b.c, &st);
	CHECK(st.sessions == 2 && st.detaches == 1);
	tc_close(&a);
	tc_close(&b);
	mgr_stop(&m);
	unlink(arena);

	/* On a memfd arena a restarted manager is another region. */
	mgr_start(&m, dir, "mem", "--memory", "8MiB", NULL);
	struct tc c;
	CHECK_OK(tc_attach(&c, &m, &s, "C", 0));
	mgr_kill9(&m);
	tc_wait(&c, SEL_POOL_EV_DETACHED, 10);
	mgr_start(&m, dir, "mem", "--memory", "8MiB", NULL);
	tc_wait(&c, SEL_POOL_EV_DISABLED, 20);
	CHECK(sel_pool_state(c.c) == SEL_POOL_DISABLED);
	CHECKF(strstr(sel_pool_warning(c.c), "another arena") != NULL, "warning '%s'",
	       sel_pool_warning(c.c));
	CHECK_RC(sel_pool_begin_lookup(c.c, &h, 0, 300, &k), -ENOTCONN);
	tc_close(&c);
	sel_history_free(&h);
	mgr_stop(&m);
	scope_free(&s);
}

int main(int argc, char **argv)
{
	self = "/proc/self/exe";
	if (argc == 4 && !strcmp(argv[1], "--role")) {
		role(argv[2], argv[3]);
		return 0;
	}
	char *d = test_mkdtemp("poolf");
	snprintf(dir, sizeof dir, "%s", d);
	signal(SIGPIPE, SIG_IGN);
	static char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	CHECK(n > 0);
	exe[n] = '\0';
	self = exe;
	test_dead_clients();
	test_misbehaving();
	test_timeouts();
	test_dead_manager();
	test_rmtree(d);
	free(d);
	printf("ok\n");
	return 0;
}
