/*
 * pool_client_io.c - the pool client's I/O thread: the socket to the
 * manager, the handshake (hello, attach or reattach, the arena descriptor),
 * the arena mapping, sending the outbound queue and decoding what arrives
 * into the inbound queue, and the reconnect after a lost session once its
 * leases drained (design 2.15; pool_client.c DESIGN).
 *
 * DESIGN
 *
 * The thread owns the socket and nothing the worker reads without the
 * queues' mutex: it sends the head of the outbound queue (the worker only
 * links at the tail, so the head's bytes are read without the lock), reads
 * frames, decodes them strictly (pool_proto.c) and links them onto the
 * inbound queue, stopping reads while that queue is over its bound.  Every
 * wait is bounded (the handshake's deadline, poll with a timeout) and
 * checks the stop flag, so close joins it within a bounded time.
 *
 * INVARIANTS
 *   1. Only frames whose epoch is the thread's session go out (pool_client.c
 *      invariant 3).
 *   2. The thread reconnects only when drained equals the lost epoch.
 */
#include "pool_client_int.h"

#include "pool_budget.h"


/* ---- blocking frame I/O for the handshake ---------------------------------------------- */

/* Read exactly len bytes by the deadline (receiving at most one descriptor
 * into *rfd when rfd is given). */
static int read_exact(sel_pool_client *c, int fd, uint8_t *buf, size_t len, uint64_t deadline,
		      int *rfd)
{
	size_t got = 0;
	while (got < len) {
		if (atomic_load(&c->stop))
			return -ECANCELED;
		uint64_t now = eos_now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		uint64_t left = (deadline - now) / MS_NS + 1;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int pr = poll(&p, 1, (int)(left > 100 ? 100 : left));
		if (pr < 0 && errno != EINTR)
			return -errno;
		if (pr <= 0)
			continue;
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(4 * sizeof(int))];
		} cb;
		struct iovec iov = {buf + got, len - got};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		if (rfd) {
			mh.msg_control = cb.b;
			mh.msg_controllen = sizeof cb.b;
		}
		ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (r < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -ECONNRESET;
		if (rfd)
			for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
				if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
					continue;
				size_t nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				int *fds = (int *)CMSG_DATA(h);
				for (size_t i = 0; i < nfd; i++) {
					if (*rfd < 0)
						*rfd = fds[i];
					else
						close(fds[i]); /* more than one: keep the first */
				}
			}
		got += (size_t)r;
	}
	return 0;
}

/* One whole frame, decoded. */
static int read_msg(sel_pool_client *c, int fd, uint64_t deadline, struct sel_pool_msg *m, int *rfd)
{
	uint8_t hdr[SEL_POOL_FRAME_HEADER];
	int rc = read_exact(c, fd, hdr, sizeof hdr, deadline, rfd);
	if (rc)
		return rc;
	uint16_t type;
	uint32_t plen;
	if ((rc = sel_pool_frame_header(hdr, sizeof hdr, &type, &plen)))
		return rc;
	uint8_t *b = malloc(SEL_POOL_FRAME_HEADER + (size_t)plen);
	if (!b)
		return -ENOMEM;
	memcpy(b, hdr, sizeof hdr);
	rc = read_exact(c, fd, b + sizeof hdr, plen, deadline, rfd);
	if (!rc)
		rc = sel_pool_decode(b, SEL_POOL_FRAME_HEADER + plen, m);
	free(b);
	return rc;
}

static int write_all(int fd, const uint8_t *b, size_t len, uint64_t deadline)
{
	size_t done = 0;
	while (done < len) {
		ssize_t w = send(fd, b + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				return -errno;
			if (eos_now_ns() >= deadline)
				return -ETIMEDOUT;
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			poll(&p, 1, 100);
			continue;
		}
		done += (size_t)w;
	}
	return 0;
}

static int send_msg(int fd, const struct sel_pool_msg *m, uint64_t deadline)
{
	int64_t n = sel_pool_encoded_size(m);
	if (n < 0)
		return (int)n;
	uint8_t *b = malloc((size_t)n);
	if (!b)
		return -ENOMEM;
	int rc = sel_pool_encode(m, b, (size_t)n) == n ? write_all(fd, b, (size_t)n, deadline)
						       : -EIO;
	free(b);
	return rc;
}

/* ---- the handshake --------------------------------------------------------------------- */

/* Whether a reattach found the same region. */
static bool same_region(sel_pool_client *c, struct hs *h)
{
	struct stat st;
	return !fstat(h->arena_fd, &st) && st.st_dev == c->arena_dev && st.st_ino == c->arena_ino &&
	       h->hello.generation == c->hello.generation &&
	       h->hello.arena_bytes == c->arena_bytes && h->hello.data_start == c->hello.data_start;
}


/* Connect, read M_HELLO (and the arena), send C_HELLO, read M_WELCOME.
 * Retryable failures (no socket yet, refused connection, closed before the
 * hello) return -EAGAIN; a refusal the manager stated is -EACCES or -EPROTO
 * with its text. */
int pc_handshake(sel_pool_client *c, uint64_t deadline, bool reattach, struct hs *h)
{
	h->fd = h->arena_fd = -1;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return eos_fail(-errno, "pool %s: socket: %s", c->address, strerror(errno));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
		int e = errno;
		close(fd);
		if (e == ENOENT || e == ECONNREFUSED || e == EAGAIN || e == EINTR)
			return eos_fail(-EAGAIN, "pool %s: no manager answers (%s)", c->address,
					strerror(e));
		if (e == EACCES || e == EPERM)
			return eos_fail(-EACCES, "pool %s: the socket refuses this process (%s)",
					c->address, strerror(e));
		return eos_fail(-e, "pool %s: connect: %s", c->address, strerror(e));
	}
	struct sel_pool_msg m;
	int afd = -1;
	int rc = read_msg(c, fd, deadline, &m, &afd);
	if (rc) {
		if (afd >= 0)
			close(afd);
		close(fd);
		if (rc == -ECONNRESET || rc == -ETIMEDOUT)
			return eos_fail(-EAGAIN, "pool %s: the manager closed or sent no hello",
					c->address);
		if (rc == SEL_EFORMAT)
			return eos_fail(rc, "pool %s: %s", c->address, eos_errmsg());
		return eos_fail(rc, "pool %s: reading the hello: %s", c->address, strerror(-rc));
	}
	if (m.type == SEL_POOL_M_ERROR) {
		char text[SEL_POOL_TEXT_MAX + 1];
		snprintf(text, sizeof text, "%s", m.u.error.text);
		sel_pool_msg_free(&m);
		if (afd >= 0)
			close(afd);
		close(fd);
		return eos_fail(-EACCES, "pool %s: the manager refused this process: %s",
				c->address, text);
	}
	if (m.type != SEL_POOL_M_HELLO || afd < 0) {
		sel_pool_msg_free(&m);
		if (afd >= 0)
			close(afd);
		close(fd);
		return eos_fail(SEL_EFORMAT,
				"pool %s: the manager's first frame is not a hello with the "
				"arena",
				c->address);
	}
	h->hello = m.u.m_hello;
	sel_pool_msg_free(&m);
	if (h->hello.version != SEL_POOL_VERSION) {
		close(afd);
		close(fd);
		return eos_fail(-EPROTO,
				"pool %s: the manager speaks protocol version %u, this instance %u",
				c->address, h->hello.version, SEL_POOL_VERSION);
	}
	if (!reattach)
		sel_pool_instance_id(h->hello.name, c->explicit_id, c->machine_id, c->core_identity,
				     c->listen, c->instance);
	h->arena_fd = afd;
	if (reattach && !same_region(c, h)) {
		/* Another region: no session on it (the caller disables sharing). */
		h->fd = fd;
		return -ESTALE;
	}
	h->arena_fd = -1;
	struct sel_pool_msg ch = {.type = SEL_POOL_C_HELLO};
	ch.u.c_hello.version = SEL_POOL_VERSION;
	ch.u.c_hello.flags = reattach ? SEL_POOL_HELLO_DRAINED : 0;
	memcpy(ch.u.c_hello.instance, c->instance, SEL_POOL_ID_BYTES);
	ch.u.c_hello.generation = reattach ? c->hello.generation : 0;
	ch.u.c_hello.scope = c->scope;
	if ((rc = send_msg(fd, &ch, deadline)) || (rc = read_msg(c, fd, deadline, &m, NULL))) {
		close(afd);
		close(fd);
		if (rc == SEL_EFORMAT)
			return eos_fail(rc, "pool %s: %s", c->address, eos_errmsg());
		return eos_fail(-EAGAIN, "pool %s: the handshake broke off (%s)", c->address,
				strerror(-rc));
	}
	if (m.type != SEL_POOL_M_WELCOME) {
		int type = m.type;
		sel_pool_msg_free(&m);
		close(afd);
		close(fd);
		return eos_fail(SEL_EFORMAT, "pool %s: expected a welcome, got %s", c->address,
				sel_pool_type_name((uint16_t)type));
	}
	h->welcome = m.u.welcome;
	sel_pool_msg_free(&m);
	if (h->welcome.status != SEL_POOL_OK) {
		close(afd);
		close(fd);
		return eos_fail(-EPROTO, "pool %s: the manager refused this instance (%s): %s",
				c->address, sel_pool_reason_name(h->welcome.status),
				h->welcome.text);
	}
	h->fd = fd;
	h->arena_fd = afd;
	return 0;
}

/* Map the arena the first time, after checking the hello's numbers against
 * the descriptor. */
int pc_map_arena(sel_pool_client *c, struct hs *h)
{
	struct stat st;
	const struct sel_pool_m_hello *mh = &h->hello;
	if (fstat(h->arena_fd, &st))
		return eos_fail(-errno, "pool %s: fstat of the arena: %s", c->address,
				strerror(errno));
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < mh->arena_bytes || !mh->arena_bytes ||
	    mh->data_start >= mh->arena_bytes || mh->data_start % EOS_ALIGN)
		return eos_fail(SEL_EFORMAT,
				"pool %s: the arena descriptor (%" PRIu64 " bytes) does not "
				"match the hello (%" PRIu64 " bytes from %" PRIu64 ")",
				c->address, (uint64_t)st.st_size, mh->arena_bytes, mh->data_start);
	if (mh->arena_bytes > SIZE_MAX)
		return eos_fail(-EOVERFLOW, "pool %s: the arena does not fit the address space",
				c->address);
	void *p = mmap(NULL, (size_t)mh->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
		       h->arena_fd, 0);
	if (p == MAP_FAILED)
		return eos_fail(-errno, "pool %s: mapping the arena of %" PRIu64 " bytes: %s",
				c->address, mh->arena_bytes, strerror(errno));
	c->arena = p;
	c->arena_bytes = mh->arena_bytes;
	c->arena_dev = st.st_dev;
	c->arena_ino = st.st_ino;
	c->arena_resident = sel_pool_budget_resident(h->arena_fd, mh->arena_bytes);
	c->hello = *mh;
	return 0;
}

/* ---- the I/O thread ------------------------------------------------------------------- */

static void push_in(sel_pool_client *c, struct qmsg *q)
{
	pthread_mutex_lock(&c->mu);
	if (c->in_tail)
		c->in_tail->next = q;
	else
		c->in_head = q;
	c->in_tail = q;
	c->in_bytes += q->bytes;
	pthread_mutex_unlock(&c->mu);
	pc_wake(c->wake_worker);
}

static void push_marker(sel_pool_client *c, enum qkind k)
{
	struct qmsg *q = calloc(1, sizeof *q);
	if (!q)
		return; /* out of memory: the worker will not hear of it */
	q->kind = k;
	q->epoch = c->io_epoch;
	push_in(c, q);
}

static void io_lost(sel_pool_client *c, int ep)
{
	if (c->fd >= 0) {
		epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	c->fd = -1;
	c->rlen = 0;
	c->sent = 0;
	push_marker(c, Q_LOST);
}

/* Send queued frames of this session; drop those of another.  -1 when the
 * connection broke, 1 when the socket is full, 0 when the queue is empty. */
static int io_send(sel_pool_client *c)
{
	for (;;) {
		pthread_mutex_lock(&c->mu);
		struct qframe *f = c->out_head;
		pthread_mutex_unlock(&c->mu);
		if (!f)
			return 0;
		bool drop = f->epoch != c->io_epoch || c->fd < 0;
		while (!drop && c->sent < f->len) {
			ssize_t w = send(c->fd, f->data + c->sent, f->len - c->sent,
					 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (w < 0) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN)
					return 1;
				return -1;
			}
			c->sent += (size_t)w;
		}
		pthread_mutex_lock(&c->mu);
		c->out_head = f->next;
		if (!c->out_head)
			c->out_tail = NULL;
		c->out_bytes -= f->len;
		pthread_mutex_unlock(&c->mu);
		free(f);
		c->sent = 0;
	}
}

/* Read and queue whole frames.  -1 when the connection broke or a frame
 * does not decode. */
static int io_recv(sel_pool_client *c)
{
	for (int rounds = 0; rounds < 64; rounds++) {
		pthread_mutex_lock(&c->mu);
		bool full = c->in_bytes >= c->in_cap;
		if (full)
			c->in_paused = true;
		pthread_mutex_unlock(&c->mu);
		if (full)
			return 0;
		size_t cap = SEL_POOL_FRAME_HEADER + SEL_POOL_FRAME_MAX;
		ssize_t r = recv(c->fd, c->rbuf + c->rlen, cap - c->rlen, MSG_DONTWAIT);
		if (r < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -1;
		if (r == 0)
			return -1;
		c->rlen += (size_t)r;
		size_t at = 0;
		for (;;) {
			uint16_t type;
			uint32_t plen;
			int rc = sel_pool_frame_header(c->rbuf + at, c->rlen - at, &type, &plen);
			if (rc == -EAGAIN)
				break;
			if (rc)
				return -1;
			size_t flen = SEL_POOL_FRAME_HEADER + (size_t)plen;
			if (c->rlen - at < flen)
				break;
			struct qmsg *q = calloc(1, sizeof *q);
			if (!q)
				return -1;
			if (sel_pool_decode(c->rbuf + at, flen, &q->m)) {
				free(q);
				return -1; /* the stream cannot be trusted any more */
			}
			q->kind = Q_MSG;
			q->epoch = c->io_epoch;
			q->bytes = flen;
			push_in(c, q);
			at += flen;
		}
		memmove(c->rbuf, c->rbuf + at, c->rlen - at);
		c->rlen -= at;
	}
	return 0;
}

/* The I/O loop's state between iterations. */
struct io_loop {
	int ep;
	bool want_out, reading;
	uint64_t backoff;
};

/* (Re)arm the connection's events for what the loop wants now. */
static void io_arm(sel_pool_client *c, struct io_loop *L, int op)
{
	struct epoll_event ev = {.events = (L->reading ? EPOLLIN : 0) | EPOLLRDHUP |
					   (L->want_out ? EPOLLOUT : 0),
				 .data.fd = c->fd};
	epoll_ctl(L->ep, op, c->fd, &ev);
}

/* Detached: reconnect once the lost session's leases drained, backing off;
 * or wait for the worker's wake-up. */
static void io_reconnect(sel_pool_client *c, struct io_loop *L)
{
	int timeout = -1;
	if (!c->io_disabled && atomic_load(&c->drained) == c->io_epoch) {
		struct hs h = {0};
		int rc = pc_handshake(c, eos_now_ns() + c->hello_timeout_ns, true, &h);
		if (rc == -ESTALE) {
			snprintf(c->warning, sizeof c->warning,
				 "pool %s: the manager came back with another arena (generation "
				 "%016" PRIx64 ", was %016" PRIx64
				 "): sharing is disabled until this instance restarts",
				 c->address, h.hello.generation, c->hello.generation);
			close(h.fd);
			close(h.arena_fd);
			c->io_disabled = true;
			push_marker(c, Q_DISABLED);
			return;
		}
		if (!rc) {
			close(h.arena_fd);
			c->fd = h.fd;
			c->io_epoch++;
			c->rlen = c->sent = 0;
			L->reading = true;
			L->want_out = false;
			io_arm(c, L, EPOLL_CTL_ADD);
			L->backoff = BACKOFF_MIN_NS;
			push_marker(c, Q_ATTACHED);
			return;
		}
		if (rc != -EAGAIN && rc != -ECANCELED && rc != -ETIMEDOUT)
			L->backoff = BACKOFF_MAX_NS; /* a stated refusal: keep trying, slowly */
		timeout = (int)(L->backoff / MS_NS);
		L->backoff = L->backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : L->backoff * 2;
	}
	struct epoll_event got;
	if (epoll_wait(L->ep, &got, 1, timeout) > 0)
		pc_drain_fd(c->wake_io);
	io_send(c); /* drops frames of the lost session */
}

/* Connected: one round of reading and sending.  Returns true when the
 * connection was lost. */
static bool io_serve(sel_pool_client *c, struct io_loop *L)
{
	struct epoll_event got[4];
	int n = epoll_wait(L->ep, got, 4, 1000);
	bool lost = false;
	for (int i = 0; i < n; i++) {
		if (got[i].data.fd == c->wake_io) {
			pc_drain_fd(c->wake_io);
			continue;
		}
		if (got[i].events & (EPOLLERR | EPOLLHUP))
			lost = true;
		if ((got[i].events & (EPOLLIN | EPOLLRDHUP)) && io_recv(c) < 0)
			lost = true;
	}
	if (lost)
		return true;
	/* Resume reading once the worker made room. */
	pthread_mutex_lock(&c->mu);
	bool paused = c->in_paused && c->in_bytes >= c->in_cap;
	if (!paused)
		c->in_paused = false;
	pthread_mutex_unlock(&c->mu);
	if (paused == L->reading) {
		L->reading = !paused;
		io_arm(c, L, EPOLL_CTL_MOD);
	}
	if (L->reading && io_recv(c) < 0)
		return true;
	int s = io_send(c);
	if (s < 0)
		return true;
	if ((s == 1) != L->want_out) {
		L->want_out = s == 1;
		io_arm(c, L, EPOLL_CTL_MOD);
	}
	return false;
}

void *pc_io_main(void *arg)
{
	sel_pool_client *c = arg;
	eos_thread_name("sel-pool-io");
	struct io_loop L = {
		.ep = epoll_create1(EPOLL_CLOEXEC), .reading = true, .backoff = BACKOFF_MIN_NS};
	if (L.ep < 0)
		return NULL;
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = c->wake_io};
	epoll_ctl(L.ep, EPOLL_CTL_ADD, c->wake_io, &ev);
	if (c->fd >= 0)
		io_arm(c, &L, EPOLL_CTL_ADD);
	while (!atomic_load(&c->stop)) {
		if (c->fd < 0) {
			io_reconnect(c, &L);
		} else if (io_serve(c, &L)) {
			io_lost(c, L.ep);
			L.backoff = BACKOFF_MIN_NS;
		}
	}
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	close(L.ep);
	return NULL;
}
