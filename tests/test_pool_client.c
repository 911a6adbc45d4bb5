/*
 * test_pool_client.c - the pool client (src/selene/pool_client.c; design
 * 2.15) against a scripted fake manager on a Unix socket in the test's
 * directory, so every manager frame can be forged:
 *
 *   - the handshake: the arena arrives with the hello and is mapped, the
 *     client's hello carries its scope;
 *   - a grant for a claim it never made, windows outside the arena or
 *     overlapping, a grant for another endpoint, a lease failure with the
 *     wrong nonce, a put grant of the wrong size, an export request with
 *     bad windows, a result for an unknown lease: each refused (released or
 *     replied to), counted, never followed;
 *   - a valid grant verifies and matches the history; a late answer to a
 *     freed ticket is dropped;
 *   - a malformed frame ends the session: pending claims fail, the client
 *     reconnects on its own with a drained hello and the same generation,
 *     and a manager with another generation disables sharing.
 */
#include <pthread.h>
#include <sys/mman.h>
#include <sys/un.h>

#include "xxh.h"

#include "internal.h"
#include "pool_testlib.h"

#define ARENA (MGR_HEADER + 64 * 8192)
#define MGR_HEADER 65536u

static char dir[80], sock[100];
static int lfd = -1, afd = -1;
static uint8_t *arena;
static struct scope sc;

static void fm_send(int fd, const struct sel_pool_msg *m)
{
	static uint8_t b[1 << 20];
	int64_t n = sel_pool_encode(m, b, sizeof b);
	CHECK(n > 0 && send(fd, b, (size_t)n, MSG_NOSIGNAL) == n);
}

static void fm_hello(int fd, uint64_t gen, int arena_fd)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_HELLO};
	m.u.m_hello = (struct sel_pool_m_hello){SEL_POOL_VERSION,
						gen,
						ARENA,
						MGR_HEADER,
						4 << 20,
						16,
						4,
						4,
						4,
						30000,
						3000,
						0,
						"fake"};
	uint8_t b[512];
	int64_t n = sel_pool_encode(&m, b, sizeof b);
	union {
		struct cmsghdr h;
		char c[CMSG_SPACE(sizeof(int))];
	} cb;
	memset(&cb, 0, sizeof cb);
	struct iovec iov = {b, (size_t)n};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cb.c,
			    .msg_controllen = sizeof cb.c};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &arena_fd, sizeof(int));
	CHECK(sendmsg(fd, &mh, MSG_NOSIGNAL) == n);
}

static struct tc t;

/* One frame from the client: 0, or -1 at EOF.  The client is polled
 * meanwhile: it answers manager frames only when its worker polls. */
static int fm_read(int fd, struct sel_pool_msg *m, unsigned seconds)
{
	uint8_t h[8];
	uint64_t deadline = eos_now_ns() + seconds * S_NS;
	for (size_t got = 0; got < 8;) {
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 20) != 1) {
			CHECKF(eos_now_ns() < deadline, "the client sent nothing in %u s", seconds);
			if (t.c)
				tc_pump(&t, 0);
			continue;
		}
		ssize_t r = recv(fd, h + got, 8 - got, 0);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	uint16_t t;
	uint32_t pl;
	CHECK_OK(sel_pool_frame_header(h, 8, &t, &pl));
	uint8_t *b = malloc(8 + pl);
	memcpy(b, h, 8);
	for (size_t got = 0; got < pl;) {
		ssize_t r = recv(fd, b + 8 + got, pl - got, 0);
		CHECK(r > 0);
		got += (size_t)r;
	}
	CHECK_OK(sel_pool_decode(b, 8 + pl, m));
	free(b);
	return 0;
}

static int fm_accept(unsigned seconds)
{
	struct pollfd p = {lfd, POLLIN, 0};
	CHECKF(poll(&p, 1, (int)seconds * 1000) == 1, "no connection in %u s", seconds);
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	CHECK(fd >= 0);
	return fd;
}

/* The manager's side of a handshake; the client's hello is returned. */
static int fm_handshake(uint64_t gen, int arena_fd, struct sel_pool_c_hello *out)
{
	int fd = fm_accept(10);
	fm_hello(fd, gen, arena_fd);
	struct sel_pool_msg m;
	if (fm_read(fd, &m, 10)) {
		close(fd);
		return -1;
	}
	CHECK(m.type == SEL_POOL_C_HELLO);
	*out = m.u.c_hello;
	sel_pool_msg_free(&m);
	struct sel_pool_msg w = {.type = SEL_POOL_M_WELCOME};
	w.u.welcome.session = 1;
	fm_send(fd, &w);
	return fd;
}

static sel_pool_client *attached;
static void *attach_thread(void *arg)
{
	(void)arg;
	struct mgr_proc m = {0};
	snprintf(m.sock, sizeof m.sock, "%s", sock);
	struct tc t;
	CHECK_OK(tc_attach(&t, &m, &sc, "client", 0));
	attached = t.c;
	return NULL;
}

static void expect(int fd, uint16_t type, uint64_t lease, uint32_t status)
{
	struct sel_pool_msg m;
	CHECK(fm_read(fd, &m, 10) == 0);
	CHECKF(m.type == type, "got %s, wanted %s", sel_pool_type_name(m.type),
	       sel_pool_type_name(type));
	if (type == SEL_POOL_C_RELEASE || type == SEL_POOL_C_EXPORT_REPLY)
		CHECKF(m.u.ls.lease == lease && m.u.ls.status == status,
		       "lease %" PRIu64 " status %s", m.u.ls.lease,
		       sel_pool_reason_name(m.u.ls.status));
	sel_pool_msg_free(&m);
}

static uint64_t refused(struct tc *tt)
{
	struct sel_pool_client_stats st;
	sel_pool_stats(tt->c, &st);
	return st.refused_frames;
}

/* Wait until the client counted n refusals in all. */
static void refused_reaches(struct tc *tt, uint64_t n)
{
	uint64_t deadline = eos_now_ns() + 10 * S_NS;
	while (refused(tt) < n) {
		CHECK(eos_now_ns() < deadline);
		tc_pump(tt, 20);
	}
	CHECK(refused(tt) == n);
}

/* A claim grant of the 256-token record: pages 0..3 at slots 8..11, the
 * row at slot 12, checksums of what the arena holds. */
static struct sel_pool_msg grant(uint64_t claim, uint64_t lease, const sel_history *h,
				 struct sel_pool_gnode *node, struct sel_pool_window *w,
				 uint64_t *ck)
{
	*node = (struct sel_pool_gnode){key_at(h, 256), {0}, bucket_of(h, 256), 4, 4, 1};
	w[0] = (struct sel_pool_window){8 * 8192, 4, SEL_POOL_WIN_PAGES};
	w[1] = (struct sel_pool_window){12 * 8192, 1, SEL_POOL_WIN_ROW};
	for (int i = 0; i < 4; i++)
		ck[i] = XXH3_64bits(arena + (8 + i) * 8192, 8192);
	struct iovec iov = {arena + 12 * 8192, 6000};
	struct sel_pool_msg m = {.type = SEL_POOL_M_CLAIM_GRANT};
	m.u.grant = (struct sel_pool_m_claim_grant){claim,
						    lease,
						    77,
						    11000,
						    SEL_POOL_SRC_ARENA,
						    0,
						    1,
						    2,
						    4,
						    node,
						    w,
						    ck,
						    XXH3_64bits(iov.iov_base, iov.iov_len)};
	return m;
}

/* Claim the answer's candidate; the manager's side reads the claim. */
static uint64_t do_claim(struct tc *tt, int fd, sel_pool_ticket *k)
{
	uint64_t id;
	CHECK_OK(sel_pool_claim(tt->c, k, 0, &id));
	struct sel_pool_msg m;
	CHECK(fm_read(fd, &m, 10) == 0 && m.type == SEL_POOL_C_CLAIM && m.u.claim.claim == id &&
	      m.u.claim.source == SEL_POOL_SRC_ARENA && m.u.claim.key.consumed == 256);
	return id;
}

int main(void)
{
	char *d = test_mkdtemp("poolc");
	CHECKF(strlen(d) < sizeof dir, "the temporary directory %s is too long for a socket path",
	       d);
	snprintf(dir, sizeof dir, "%s", d);
	snprintf(sock, sizeof sock, "%s/fake.sock", dir);
	signal(SIGPIPE, SIG_IGN);
	scope_make(&sc, 1, 4096, 1);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
	CHECK(lfd >= 0 && !bind(lfd, (struct sockaddr *)&sa, sizeof sa) && !listen(lfd, 8));
	afd = memfd_create("fake-arena", MFD_CLOEXEC);
	CHECK(afd >= 0 && !ftruncate(afd, ARENA));
	arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
	CHECK(arena != MAP_FAILED);
	for (uint32_t i = 0; i < ARENA; i++)
		arena[i] = (uint8_t)(i * 31 + (i >> 13));

	/* The handshake. */
	pthread_t th;
	CHECK(!pthread_create(&th, NULL, attach_thread, NULL));
	struct sel_pool_c_hello ch;
	int fd = fm_handshake(0x77, afd, &ch);
	CHECK(fd >= 0 && !pthread_join(th, NULL) && attached);
	t.c = attached;
	CHECK(ch.version == SEL_POOL_VERSION && ch.flags == 0 && ch.generation == 0);
	CHECK(ch.scope.slot_bytes == 8192 && ch.scope.row_slots == 1 && ch.scope.page_tokens == 64);
	CHECK(!memcmp(ch.instance, sel_pool_instance(t.c), SEL_POOL_ID_BYTES));
	uint64_t bytes;
	uint8_t *mine = sel_pool_arena(t.c, &bytes);
	CHECK(bytes == ARENA && mine[70000] == arena[70000]); /* the same memory */

	struct sel_pool_gnode node;
	struct sel_pool_window w[4];
	uint64_t ck[4];
	sel_history h;
	hist_make(&h, &sc, 300, 1, 0);

	/* 1. A grant for a claim never made. */
	struct sel_pool_msg g = grant(999, 5, &h, &node, w, ck);
	fm_send(fd, &g);
	expect(fd, SEL_POOL_C_RELEASE, 5, SEL_POOL_FORGED);
	refused_reaches(&t, 1);
	CHECK(!tc_has(&t, SEL_POOL_EV_CLAIM_GRANTED));

	/* 2. A lookup and its answer; then an answer for a freed ticket. */
	sel_pool_ticket *k;
	CHECK_OK(sel_pool_begin_lookup(t.c, &h, 0, 300, &k));
	struct sel_pool_msg m;
	CHECK(fm_read(fd, &m, 10) == 0 && m.type == SEL_POOL_C_LOOKUP);
	CHECK(m.u.lookup.k_hi == 4 && m.u.lookup.n == 5 && m.u.lookup.limit == 300 &&
	      !memcmp(m.u.lookup.bounds[0].b, sel_history_bound(&h, 4)->b, 16));
	uint64_t ticket = m.u.lookup.ticket;
	sel_pool_msg_free(&m);
	struct sel_pool_anode an = {key_at(&h, 256), 4, SEL_POOL_NONE, 1};
	struct sel_pool_candidate cd = {SEL_POOL_SRC_ARENA, 0, 0, 0, {0}, 5 * 8192};
	struct sel_pool_msg a = {.type = SEL_POOL_M_ANSWER};
	a.u.answer = (struct sel_pool_m_answer){ticket, 1, 1, &an, &cd};
	fm_send(fd, &a);
	tc_wait(&t, SEL_POOL_EV_ANSWER, 10);
	CHECK(sel_pool_ticket_state(k) == SEL_POOL_TICKET_READY);
	CHECK(sel_pool_answer_pick(sel_pool_ticket_answer(k), &h, 0) == 0);
	sel_history h2;
	hist_make(&h2, &sc, 300, 2, 0);
	CHECK(sel_pool_answer_pick(sel_pool_ticket_answer(k), &h2, 0) == -1); /* not h2's */
	a.u.answer.ticket = ticket + 1000;
	fm_send(fd, &a);

	/* 2b. Restore deadlines (design 2.15): a claim waiting behind another
	 * budgets for its bytes too; both refused. */
	{
		uint64_t c1, c2, allow = 5ull * 8192 * 1000 / SEL_POOL_DEADLINE_BPS;
		CHECK_OK(sel_pool_claim(t.c, k, 0, &c1));
		CHECK_OK(sel_pool_claim(t.c, k, 0, &c2));
		uint64_t d1 = sel_pool_claim_deadline(t.c, c1),
			 d2 = sel_pool_claim_deadline(t.c, c2);
		CHECK(d1 && d2 && d2 >= d1 + allow * MS_NS);
		for (int i = 0; i < 2; i++) {
			CHECK(fm_read(fd, &m, 10) == 0 && m.type == SEL_POOL_C_CLAIM);
			sel_pool_msg_free(&m);
		}
		struct sel_pool_msg r = {.type = SEL_POOL_M_CLAIM_REFUSED};
		r.u.refused = (struct sel_pool_m_refused){c1, SEL_POOL_NOT_FOUND};
		fm_send(fd, &r);
		r.u.refused.id = c2;
		fm_send(fd, &r);
		tc_wait(&t, SEL_POOL_EV_CLAIM_FAILED, 10);
		tc_wait(&t, SEL_POOL_EV_CLAIM_FAILED, 10);
	}

	/* 3. Bad grants for a real claim: windows out of the arena, another
	 * endpoint, overlapping windows.  Each is released and fails the claim. */
	for (int bad = 0; bad < 3; bad++) {
		uint64_t id = do_claim(&t, fd, k);
		g = grant(id, 10 + (uint64_t)bad, &h, &node, w, ck);
		if (bad == 0)
			w[0].off = ARENA - 2 * 8192;
		else if (bad == 1)
			node.key.digest.b[0] ^= 1;
		else
			w[1].off = 9 * 8192;
		fm_send(fd, &g);
		expect(fd, SEL_POOL_C_RELEASE, 10 + (uint64_t)bad, SEL_POOL_BAD_REQUEST);
		struct sel_pool_event e = tc_wait(&t, SEL_POOL_EV_CLAIM_FAILED, 10);
		CHECK(e.request == id && e.reason == SEL_POOL_BAD_REQUEST);
	}
	refused_reaches(&t, 4);

	/* 4. A good grant: it verifies and is h's; a failure notice with the
	 * wrong nonce is refused, with the right one reported. */
	uint64_t id = do_claim(&t, fd, k);
	g = grant(id, 20, &h, &node, w, ck);
	fm_send(fd, &g);
	struct sel_pool_event e = tc_wait(&t, SEL_POOL_EV_CLAIM_GRANTED, 10);
	struct sel_pool_lease *l = e.lease;
	CHECK(l->id == 20 && l->n_pages == 4 && l->page_slots[0] == 8 && l->row_slots[0] == 12);
	/* 4a. Restore deadlines (design 2.15): a claim made while this granted
	 * one still copies budgets for the granted bytes too. */
	{
		uint64_t c3, t0 = eos_now_ns();
		CHECK_OK(sel_pool_claim(t.c, k, 0, &c3));
		uint64_t ms =
			sel_pool_deadline_ms(SEL_POOL_REQUESTER_SETUP_MS,
					     SEL_POOL_REQUESTER_SETUP_MS, 5 * 8192 + l->bytes);
		CHECK(sel_pool_claim_deadline(t.c, c3) >= t0 + ms * MS_NS);
		CHECK(fm_read(fd, &m, 10) == 0 && m.type == SEL_POOL_C_CLAIM);
		sel_pool_msg_free(&m);
		struct sel_pool_msg r = {.type = SEL_POOL_M_CLAIM_REFUSED};
		r.u.refused = (struct sel_pool_m_refused){c3, SEL_POOL_NOT_FOUND};
		fm_send(fd, &r);
		tc_wait(&t, SEL_POOL_EV_CLAIM_FAILED, 10);
	}
	CHECK_OK(sel_pool_lease_verify(t.c, l));
	CHECK(sel_pool_lease_matches(l, &h, 0) && !sel_pool_lease_matches(l, &h2, 0));
	CHECK(!sel_pool_lease_matches(l, &h, 64)); /* granted for resident 0 */
	arena[9 * 8192 + 5] ^= 1;
	CHECK_RC(sel_pool_lease_verify(t.c, l), SEL_ECORRUPT);
	arena[9 * 8192 + 5] ^= 1;
	arena[12 * 8192 + 5999] ^= 1; /* the row's last byte */
	CHECK_RC(sel_pool_lease_verify(t.c, l), SEL_ECORRUPT);
	arena[12 * 8192 + 5999] ^= 1;
	arena[12 * 8192 + 6000] ^= 1; /* padding after the row: not row bytes */
	CHECK_OK(sel_pool_lease_verify(t.c, l));
	struct sel_pool_msg f = {.type = SEL_POOL_M_LEASE_FAILED};
	f.u.ls = (struct sel_pool_lease_status){20, 78, SEL_POOL_TIMEOUT};
	fm_send(fd, &f);
	refused_reaches(&t, 5); /* the freed ticket's answer counts as dropped, not refused */
	f.u.ls.nonce = 77;
	fm_send(fd, &f);
	e = tc_wait(&t, SEL_POOL_EV_LEASE_FAILED, 10);
	CHECK(e.lease == l && l->failed == SEL_POOL_TIMEOUT);
	CHECK_OK(sel_pool_release(t.c, l, SEL_POOL_OK));
	expect(fd, SEL_POOL_C_RELEASE, 20, SEL_POOL_OK);
	struct sel_pool_client_stats st;
	sel_pool_stats(t.c, &st);
	CHECK(st.answers_dropped == 1 && st.claims_granted == 1 &&
	      st.claims_failed == 6); /* 2b: two, 4a: one */

	/* 5. Export requests: bad windows are refused; a good one is the
	 * caller's, who refuses it with a reason. */
	struct sel_pool_window ew[2] = {{20 * 8192, 3, 0}, {21 * 8192, 1, 1}};
	struct sel_pool_msg x = {.type = SEL_POOL_M_EXPORT_REQUEST};
	x.u.export_req = (struct sel_pool_m_export_request){
		30, 31, 11000, SEL_POOL_SRC_GPU, key_at(&h, 256), 4, 1, 3, 1, 2, ew};
	fm_send(fd, &x);
	expect(fd, SEL_POOL_C_EXPORT_REPLY, 30, SEL_POOL_BAD_REQUEST);
	ew[1].off = 23 * 8192;
	x.u.export_req.lease = 32;
	fm_send(fd, &x);
	e = tc_wait(&t, SEL_POOL_EV_EXPORT, 10);
	CHECK(e.lease->start_page == 1 && e.lease->n_pages == 3 && e.lease->generation == 4);
	CHECK_OK(sel_pool_export_reply(t.c, e.lease, SEL_POOL_CHAIN_GAP));
	expect(fd, SEL_POOL_C_EXPORT_REPLY, 32, SEL_POOL_CHAIN_GAP);

	/* 6. A put grant of the wrong size; a result for an unknown lease. */
	struct sel_pool_put_desc pd = {key_at(&h, 256), {0}, bucket_of(&h, 256), 4};
	uint64_t pid;
	CHECK_OK(sel_pool_put(t.c, &pd, &pid));
	CHECK(fm_read(fd, &m, 10) == 0 && m.type == SEL_POOL_C_PUT && m.u.put.tail == 4);
	sel_pool_msg_free(&m);
	struct sel_pool_window pw[1] = {{30 * 8192, 4, 0}}; /* no row */
	struct sel_pool_msg pg = {.type = SEL_POOL_M_PUT_GRANT};
	pg.u.put_grant = (struct sel_pool_m_put_grant){pid, 40, 41, 11000, 1, pw};
	fm_send(fd, &pg);
	expect(fd, SEL_POOL_C_RELEASE, 40, SEL_POOL_BAD_REQUEST);
	e = tc_wait(&t, SEL_POOL_EV_PUT_REFUSED, 10);
	CHECK(e.request == pid && e.reason == SEL_POOL_BAD_REQUEST);
	struct sel_pool_msg pr = {.type = SEL_POOL_M_PUT_RESULT};
	pr.u.ls = (struct sel_pool_lease_status){12345, 1, SEL_POOL_OK};
	fm_send(fd, &pr);
	refused_reaches(&t, 8); /* the bad export, the bad put, the unknown result */

	/* 7. A malformed frame ends the session: the pending claim fails. */
	id = do_claim(&t, fd, k);
	uint8_t junk[16] = {4, 0, 0, 0, 0x7e, 0, 0, 0};
	CHECK(send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
	e = tc_wait(&t, SEL_POOL_EV_CLAIM_FAILED, 10);
	CHECK(e.request == id && e.reason == SEL_POOL_GONE);
	tc_wait(&t, SEL_POOL_EV_DETACHED, 10);
	CHECK(sel_pool_ticket_state(k) == SEL_POOL_TICKET_READY); /* answered before */
	CHECK_RC(sel_pool_claim(t.c, k, 0, &id), -ENOTCONN);      /* detached */
	sel_pool_ticket_free(t.c, k);
	close(fd);

	/* 8. It reconnects by itself, drained, to the same region. */
	fd = fm_handshake(0x77, afd, &ch);
	CHECK(fd >= 0 && (ch.flags & SEL_POOL_HELLO_DRAINED) && ch.generation == 0x77);
	tc_wait(&t, SEL_POOL_EV_ATTACHED, 10);
	CHECK(sel_pool_state(t.c) == SEL_POOL_ATTACHED);
	CHECK_OK(sel_pool_begin_lookup(t.c, &h, 0, 300, &k));
	CHECK(fm_read(fd, &m, 10) == 0 && m.type == SEL_POOL_C_LOOKUP);
	sel_pool_msg_free(&m);
	sel_pool_ticket_free(t.c, k);

	/* 9. The manager comes back with another generation: sharing is off. */
	close(fd);
	tc_wait(&t, SEL_POOL_EV_DETACHED, 10);
	int other = memfd_create("other", MFD_CLOEXEC);
	CHECK(other >= 0 && !ftruncate(other, ARENA));
	fd = fm_accept(10);
	fm_hello(fd, 0x78, other);
	CHECK(fm_read(fd, &m, 10) == -1); /* it hangs up without a hello */
	tc_wait(&t, SEL_POOL_EV_DISABLED, 10);
	CHECK(strstr(sel_pool_warning(t.c), "another arena") != NULL);
	CHECK_RC(sel_pool_begin_lookup(t.c, &h, 0, 300, &k), -ENOTCONN);
	close(fd);
	close(other);
	sel_history_free(&h);
	sel_history_free(&h2);
	tc_close(&t);
	munmap(arena, ARENA);
	close(afd);
	close(lfd);
	unlink(sock);
	scope_free(&sc);
	test_rmtree(d);
	free(d);
	printf("ok\n");
	return 0;
}
