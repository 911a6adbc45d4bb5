/*
 * pool_client.c - an instance's connection to the pool manager: attach and
 * the arena mapping, the I/O thread, reattach, and the worker-side state of
 * tickets, claims, puts, exports and leases (design 2.15; pool_client.h;
 * docs/pool.md).
 *
 * DESIGN
 *
 * Two sides share two queues and nothing else.  The worker side (every call
 * in pool_client.h but attach, close and destroy) owns the tables of
 * tickets, pending claims and puts and live leases, encodes each submission
 * into a frame and links it onto the outbound queue; sel_pool_poll takes the
 * inbound queue's decoded messages, checks each against those tables and
 * turns it into events.  The I/O thread owns the socket: it sends the head
 * of the outbound queue (the worker only links at the tail, so the head's
 * bytes are read without the lock), reads frames, decodes them strictly and
 * links them onto the inbound queue.  The mutex covers linking and
 * unlinking only.  Two eventfds wake each side.
 *
 * Sessions are numbered (epochs).  The I/O thread tags what it reads with
 * its session's epoch and sends only frames tagged with the current one;
 * the worker learns of a new session through a queued ATTACHED marker, so a
 * frame encoded for a lost session is never sent on a new one and a message
 * of a lost session is never applied to the new one's tables.
 *
 * A lost connection: the I/O thread queues LOST and waits.  The worker, when
 * it polls LOST, fails every ticket, pending claim and pending put, marks
 * every live lease failed (GONE) and reports it; once the last lease of
 * that session has ended (the caller's copies drained) it tells the I/O
 * thread, which only then reconnects, with the DRAINED flag, so the manager
 * may free what it held for the old session at once.  A hello of another
 * generation or another arena inode disables sharing for good.
 *
 * Bounds: the outbound queue holds at most out_bytes of submissions (ends
 * of leases -- release, commit, export done -- are always accepted: they
 * are bounded by the leases, and refusing them would strand windows); the
 * inbound queue at most in_bytes of frames, beyond which the I/O thread
 * stops reading until the worker polls.
 *
 * INVARIANTS
 *   1. A lease is in the lease table from its grant until its end; its
 *      windows passed sel_pool_windows_check for exactly what was asked.
 *   2. The I/O thread reconnects only when no lease of the lost session is
 *      left (drained == lost epoch).
 *   3. Only frames whose epoch is the I/O thread's session go out.
 */
#include "pool_client.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <xxhash.h>

#include "eos.h"
#include "hmap.h"
#include "list.h"
#include "record.h"
#include "slab.h"

#define S_NS 1000000000ull
#define MS_NS 1000000ull
#define DEFAULT_OUT (8ull << 20)
#define DEFAULT_IN (16ull << 20)
#define BACKOFF_MIN_NS (100 * MS_NS)
#define BACKOFF_MAX_NS (2 * S_NS)

/* ---- queues shared with the I/O thread ------------------------------------------ */

struct qframe {
	struct qframe *next;
	uint64_t epoch;
	size_t len;
	uint8_t data[];
};

enum qkind { Q_MSG = 0, Q_LOST, Q_ATTACHED, Q_DISABLED };

struct qmsg {
	struct qmsg *next;
	enum qkind kind;
	uint64_t epoch;
	size_t bytes;
	struct sel_pool_msg m;
};

/* ---- worker-side objects --------------------------------------------------------- */

struct sel_pool_ticket {
	struct eos_hnode hn;
	uint64_t id, epoch, resident;
	enum sel_pool_ticket_state state;
	bool linked;
	struct sel_pool_msg ans;
};

struct pending {
	struct eos_hnode hn;
	struct pending *prev, *next; /* claims: the deadline list */
	uint64_t id, epoch;
	bool is_claim;
	uint8_t source;
	sel_key key;
	uint64_t resident, bytes, deadline_ns;
	uint32_t tail;
	bool dead; /* claim timed out here: a late grant is released */
};
struct plist {
	struct pending *head, *tail;
	uint32_t n;
};
EOS_DLIST_DEFINE(plist, struct plist, struct pending)

struct lease {
	struct sel_pool_lease pub; /* first: the caller's pointer */
	struct eos_hnode hn;
	uint64_t nonce, epoch;
	bool committed;            /* put: committed, waiting for M_PUT_RESULT */
	uint32_t *slots;           /* page slots then row slots */
	struct sel_pool_msg msg;   /* the grant (nodes, checksums) */
};

struct evq {
	struct sel_pool_event *v;
	size_t head, n, cap;
};

struct sel_pool_client {
	/* Immutable after attach. */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char address[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	const sel_geometry *g;
	sel_slot_layout lay;
	sel_record_layout rl;
	struct sel_pool_scope scope;
	char explicit_id[256], machine_id[256], listen[256];
	uint8_t core_identity[SEL_IDENTITY_BYTES];
	uint8_t instance[SEL_POOL_ID_BYTES];
	struct sel_pool_m_hello hello;
	uint8_t *arena;
	uint64_t arena_bytes;
	dev_t arena_dev;
	ino_t arena_ino;
	uint64_t hello_timeout_ns, out_cap, in_cap;
	uint32_t setup_ms;

	/* Shared: under mu. */
	pthread_mutex_t mu;
	struct qframe *out_head, *out_tail;
	uint64_t out_bytes;
	struct qmsg *in_head, *in_tail;
	uint64_t in_bytes;
	bool in_paused;
	int wake_io, wake_worker;
	atomic_bool stop;
	atomic_uint_fast64_t drained; /* the lost epoch whose leases all ended */
	pthread_t io;
	bool io_started, closed;

	/* I/O thread only. */
	int fd;
	uint64_t io_epoch;
	bool io_disabled;
	uint8_t *rbuf;
	size_t rlen;
	size_t sent; /* bytes of the head frame already sent */

	/* Worker side only. */
	enum sel_pool_state state;
	uint64_t epoch;
	uint64_t next_id;
	struct eos_hmap tickets, pendings, leases;
	struct plist claims;
	uint32_t n_claims, n_puts; /* pending + live, for the hello's limits */
	uint64_t n_live;           /* leases in the table (committed puts excluded) */
	struct evq evq;
	char warning[512];
	struct sel_pool_client_stats st;
};

/* ---- small helpers ------------------------------------------------------------------ */

static void wake(int fd)
{
	uint64_t one = 1;
	ssize_t r = write(fd, &one, sizeof one);
	(void)r;
}

static void drain_fd(int fd)
{
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof v);
	(void)r;
}

static int evq_push(struct evq *q, const struct sel_pool_event *e)
{
	if (q->n == q->cap) {
		size_t nc = q->cap ? q->cap * 2 : 64;
		struct sel_pool_event *v = malloc(nc * sizeof *v);
		if (!v)
			return -ENOMEM;
		for (size_t i = 0; i < q->n; i++)
			v[i] = q->v[(q->head + i) % q->cap];
		free(q->v);
		q->v = v;
		q->cap = nc;
		q->head = 0;
	}
	q->v[(q->head + q->n) % q->cap] = *e;
	q->n++;
	return 0;
}

static void emit(sel_pool_client *c, enum sel_pool_event_type type, uint32_t reason,
		 uint64_t request, const sel_key *key, struct sel_pool_lease *l, sel_pool_ticket *t)
{
	struct sel_pool_event e = {.type = type, .reason = reason, .request = request,
				   .lease = l, .ticket = t};
	if (key)
		e.key = *key;
	if (evq_push(&c->evq, &e))
		c->st.queue_full++; /* out of memory: the event is lost, and counted */
}

/* Encode m and queue it for the current session.  force: ends of leases,
 * accepted past the bound. */
static int submit(sel_pool_client *c, const struct sel_pool_msg *m, bool force)
{
	if (c->state != SEL_POOL_ATTACHED)
		return eos_fail(-ENOTCONN, "pool %s: %s", c->address,
				c->state == SEL_POOL_DISABLED ? "sharing is disabled" : "detached");
	int64_t n = sel_pool_encoded_size(m);
	if (n < 0)
		return (int)n;
	pthread_mutex_lock(&c->mu);
	bool full = !force && c->out_bytes + (uint64_t)n > c->out_cap;
	pthread_mutex_unlock(&c->mu);
	if (full) {
		c->st.queue_full++;
		return eos_fail(-EAGAIN, "pool %s: the send queue is full (%" PRIu64 " bytes)",
				c->address, c->out_cap);
	}
	struct qframe *f = malloc(sizeof *f + (size_t)n);
	if (!f)
		return eos_fail(-ENOMEM, "pool: out of memory for a frame");
	f->next = NULL;
	f->epoch = c->epoch;
	f->len = (size_t)n;
	int64_t w = sel_pool_encode(m, f->data, (size_t)n);
	if (w != n) {
		free(f);
		return w < 0 ? (int)w : eos_fail(-EIO, "pool: frame size changed while encoding");
	}
	pthread_mutex_lock(&c->mu);
	if (c->out_tail)
		c->out_tail->next = f;
	else
		c->out_head = f;
	c->out_tail = f;
	c->out_bytes += f->len;
	pthread_mutex_unlock(&c->mu);
	c->st.frames_out++;
	wake(c->wake_io);
	return 0;
}

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
	int rc = sel_pool_encode(m, b, (size_t)n) == n ? write_all(fd, b, (size_t)n, deadline) : -EIO;
	free(b);
	return rc;
}

/* ---- the handshake --------------------------------------------------------------------- */

struct hs {
	int fd, arena_fd;
	struct sel_pool_m_hello hello;
	struct sel_pool_m_welcome welcome;
};

/* Whether a reattach found the same region. */
static bool same_region(sel_pool_client *c, struct hs *h)
{
	struct stat st;
	return !fstat(h->arena_fd, &st) && st.st_dev == c->arena_dev && st.st_ino == c->arena_ino &&
	       h->hello.generation == c->hello.generation && h->hello.arena_bytes == c->arena_bytes &&
	       h->hello.data_start == c->hello.data_start;
}


/* Connect, read M_HELLO (and the arena), send C_HELLO, read M_WELCOME.
 * Retryable failures (no socket yet, refused connection, closed before the
 * hello) return -EAGAIN; a refusal the manager stated is -EACCES or -EPROTO
 * with its text. */
static int handshake(sel_pool_client *c, uint64_t deadline, bool reattach, struct hs *h)
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
			return eos_fail(-EAGAIN, "pool %s: no manager answers (%s)", c->address, strerror(e));
		if (e == EACCES || e == EPERM)
			return eos_fail(-EACCES, "pool %s: the socket refuses this process (%s)", c->address,
					strerror(e));
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
			return eos_fail(-EAGAIN, "pool %s: the manager closed or sent no hello", c->address);
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
		return eos_fail(-EACCES, "pool %s: the manager refused this process: %s", c->address, text);
	}
	if (m.type != SEL_POOL_M_HELLO || afd < 0) {
		sel_pool_msg_free(&m);
		if (afd >= 0)
			close(afd);
		close(fd);
		return eos_fail(SEL_EFORMAT, "pool %s: the manager's first frame is not a hello with the "
				"arena", c->address);
	}
	h->hello = m.u.m_hello;
	sel_pool_msg_free(&m);
	if (h->hello.version != SEL_POOL_VERSION) {
		close(afd);
		close(fd);
		return eos_fail(-EPROTO, "pool %s: the manager speaks protocol version %u, this instance %u",
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
	if ((rc = send_msg(fd, &ch, deadline)) ||
	    (rc = read_msg(c, fd, deadline, &m, NULL))) {
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
		return eos_fail(-EPROTO, "pool %s: the manager refused this instance (%s): %s", c->address,
				sel_pool_reason_name(h->welcome.status), h->welcome.text);
	}
	h->fd = fd;
	h->arena_fd = afd;
	return 0;
}

/* Map the arena the first time, after checking the hello's numbers against
 * the descriptor. */
static int map_arena(sel_pool_client *c, struct hs *h)
{
	struct stat st;
	const struct sel_pool_m_hello *mh = &h->hello;
	if (fstat(h->arena_fd, &st))
		return eos_fail(-errno, "pool %s: fstat of the arena: %s", c->address, strerror(errno));
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < mh->arena_bytes || !mh->arena_bytes ||
	    mh->data_start >= mh->arena_bytes || mh->data_start % EOS_ALIGN)
		return eos_fail(SEL_EFORMAT, "pool %s: the arena descriptor (%" PRIu64 " bytes) does not "
				"match the hello (%" PRIu64 " bytes from %" PRIu64 ")", c->address,
				(uint64_t)st.st_size, mh->arena_bytes, mh->data_start);
	if (mh->arena_bytes > SIZE_MAX)
		return eos_fail(-EOVERFLOW, "pool %s: the arena does not fit the address space", c->address);
	void *p = mmap(NULL, (size_t)mh->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, h->arena_fd, 0);
	if (p == MAP_FAILED)
		return eos_fail(-errno, "pool %s: mapping the arena of %" PRIu64 " bytes: %s", c->address,
				mh->arena_bytes, strerror(errno));
	c->arena = p;
	c->arena_bytes = mh->arena_bytes;
	c->arena_dev = st.st_dev;
	c->arena_ino = st.st_ino;
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
	wake(c->wake_worker);
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

static void *io_main(void *arg)
{
	sel_pool_client *c = arg;
	eos_thread_name("sel-pool-io");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		return NULL;
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = c->wake_io};
	epoll_ctl(ep, EPOLL_CTL_ADD, c->wake_io, &ev);
	bool want_out = false, reading = true;
	if (c->fd >= 0) {
		ev = (struct epoll_event){.events = EPOLLIN | EPOLLRDHUP, .data.fd = c->fd};
		epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
	}
	uint64_t backoff = BACKOFF_MIN_NS;
	while (!atomic_load(&c->stop)) {
		if (c->fd < 0) {
			int timeout = -1;
			if (!c->io_disabled && atomic_load(&c->drained) == c->io_epoch) {
				struct hs h;
				int rc = handshake(c, eos_now_ns() + c->hello_timeout_ns, true, &h);
				if (rc == -ESTALE) {
					snprintf(c->warning, sizeof c->warning,
						 "pool %s: the manager came back with another arena (generation "
						 "%016" PRIx64 ", was %016" PRIx64 "): sharing is disabled until "
						 "this instance restarts", c->address, h.hello.generation,
						 c->hello.generation);
					close(h.fd);
					close(h.arena_fd);
					c->io_disabled = true;
					push_marker(c, Q_DISABLED);
					continue;
				}
				if (!rc) {
					close(h.arena_fd);
					c->fd = h.fd;
					c->io_epoch++;
					c->rlen = c->sent = 0;
					reading = true;
					want_out = false;
					ev = (struct epoll_event){.events = EPOLLIN | EPOLLRDHUP, .data.fd = c->fd};
					epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
					backoff = BACKOFF_MIN_NS;
					push_marker(c, Q_ATTACHED);
					continue;
				}
				if (rc != -EAGAIN && rc != -ECANCELED && rc != -ETIMEDOUT) {
					/* A stated refusal: keep trying, slowly. */
					backoff = BACKOFF_MAX_NS;
				}
				timeout = (int)(backoff / MS_NS);
				backoff = backoff * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : backoff * 2;
			}
			struct epoll_event got;
			if (epoll_wait(ep, &got, 1, timeout) > 0)
				drain_fd(c->wake_io);
			io_send(c); /* drops frames of the lost session */
			continue;
		}
		struct epoll_event got[4];
		int n = epoll_wait(ep, got, 4, 1000);
		bool lost = false;
		for (int i = 0; i < n; i++) {
			if (got[i].data.fd == c->wake_io) {
				drain_fd(c->wake_io);
				continue;
			}
			if (got[i].events & (EPOLLERR | EPOLLHUP))
				lost = true;
			if ((got[i].events & (EPOLLIN | EPOLLRDHUP)) && io_recv(c) < 0)
				lost = true;
		}
		if (!lost) {
			/* Resume reading once the worker made room. */
			pthread_mutex_lock(&c->mu);
			bool paused = c->in_paused && c->in_bytes >= c->in_cap;
			if (!paused)
				c->in_paused = false;
			pthread_mutex_unlock(&c->mu);
			if (paused == reading) {
				reading = !paused;
				ev = (struct epoll_event){.events = (reading ? EPOLLIN : 0) | EPOLLRDHUP |
								    (want_out ? EPOLLOUT : 0),
							  .data.fd = c->fd};
				epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
			}
			if (reading && io_recv(c) < 0)
				lost = true;
		}
		if (!lost) {
			int s = io_send(c);
			if (s < 0) {
				lost = true;
			} else if ((s == 1) != want_out) {
				want_out = s == 1;
				ev = (struct epoll_event){.events = (reading ? EPOLLIN : 0) | EPOLLRDHUP |
								    (want_out ? EPOLLOUT : 0),
							  .data.fd = c->fd};
				epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
			}
		}
		if (lost) {
			io_lost(c, ep);
			backoff = BACKOFF_MIN_NS;
		}
	}
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	close(ep);
	return NULL;
}

/* ---- attach, close, destroy -------------------------------------------------------------- */

static void read_machine_id(const char *path, char *out, size_t cap)
{
	out[0] = '\0';
	int fd = open(path ? path : "/etc/machine-id", O_RDONLY | O_CLOEXEC);
	if (fd < 0 && !path)
		fd = open("/var/lib/dbus/machine-id", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	ssize_t n = read(fd, out, cap - 1);
	close(fd);
	if (n < 0)
		n = 0;
	out[n] = '\0';
	while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
		out[--n] = '\0';
}

int sel_pool_attach(const struct sel_pool_client_config *cfg, sel_pool_client **out)
{
	*out = NULL;
	if (!cfg || !cfg->address || !cfg->geometry)
		return eos_fail(-EINVAL, "pool: no address or no geometry");
	const char *path = cfg->address;
	if (!strncmp(path, "unix:", 5))
		path += 5;
	else if (strstr(path, "://") || !strncmp(path, "tcp:", 4))
		return eos_fail(-EINVAL, "pool address '%s': only unix:PATH (a manager on this host) is "
				"supported", cfg->address);
	sel_pool_client *c = calloc(1, sizeof *c);
	if (!c)
		return eos_fail(-ENOMEM, "pool: out of memory");
	c->fd = -1;
	c->wake_io = c->wake_worker = -1;
	pthread_mutex_init(&c->mu, NULL);
	int rc = 0;
	if (!*path || strlen(path) >= sizeof c->path) {
		rc = eos_fail(-EINVAL, "pool address '%s': the socket path is empty or longer than %zu "
			      "bytes", cfg->address, sizeof c->path - 1);
		goto fail;
	}
	snprintf(c->path, sizeof c->path, "%s", path);
	snprintf(c->address, sizeof c->address, "unix:%s", path);
	c->g = cfg->geometry;
	c->hello_timeout_ns = cfg->hello_timeout_ns ? cfg->hello_timeout_ns : 10 * S_NS;
	c->out_cap = cfg->out_bytes ? cfg->out_bytes : DEFAULT_OUT;
	c->in_cap = cfg->in_bytes ? cfg->in_bytes : DEFAULT_IN;
	c->setup_ms = cfg->setup_ms ? cfg->setup_ms : SEL_POOL_SETUP_MS;
	snprintf(c->explicit_id, sizeof c->explicit_id, "%s", cfg->instance_id ? cfg->instance_id : "");
	snprintf(c->listen, sizeof c->listen, "%s", cfg->listen ? cfg->listen : "");
	memcpy(c->core_identity, cfg->core_identity, SEL_IDENTITY_BYTES);
	read_machine_id(cfg->machine_id_path, c->machine_id, sizeof c->machine_id);
	if ((rc = sel_slot_layout_init(&c->lay, c->g)) || (rc = sel_record_layout_init(&c->rl, c->g)))
		goto fail;
	memcpy(c->scope.identity, cfg->identity, SEL_IDENTITY_BYTES);
	sel_layout_fingerprint(c->g, c->scope.fingerprint);
	c->scope.page_tokens = c->g->page_tokens;
	c->scope.ranks = c->g->ranks;
	c->scope.slot_bytes = c->lay.slot_bytes;
	c->scope.row_slots = c->lay.row_slots;
	c->scope.table_bytes = c->rl.table_bytes;
	c->scope.table = c->rl.table;
	if (c->scope.table_bytes > SEL_POOL_TABLE_MAX) {
		rc = eos_fail(SEL_EOVERSIZE, "pool: the rank table of %u bytes is over the protocol's %u",
			      c->scope.table_bytes, SEL_POOL_TABLE_MAX);
		goto fail;
	}
	c->rbuf = malloc(SEL_POOL_FRAME_HEADER + SEL_POOL_FRAME_MAX);
	c->wake_io = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->wake_worker = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!c->rbuf || c->wake_io < 0 || c->wake_worker < 0 || eos_hmap_init(&c->tickets) ||
	    eos_hmap_init(&c->pendings) || eos_hmap_init(&c->leases)) {
		rc = eos_fail(-ENOMEM, "pool: out of memory or descriptors");
		goto fail;
	}
	/* Silent retries until the deadline (design 2.15 startup). */
	uint64_t deadline = eos_now_ns() + c->hello_timeout_ns;
	struct hs h;
	for (;;) {
		rc = handshake(c, deadline, false, &h);
		if (rc != -EAGAIN)
			break;
		if (eos_now_ns() + BACKOFF_MIN_NS >= deadline) {
			rc = eos_fail(-ETIMEDOUT, "pool %s: no manager answered within %" PRIu64 " s (%s)",
				      c->address, (uint64_t)(c->hello_timeout_ns / S_NS), eos_errmsg());
			break;
		}
		eos_sleep_ns(BACKOFF_MIN_NS);
	}
	if (rc)
		goto fail;
	rc = map_arena(c, &h);
	close(h.arena_fd);
	if (rc) {
		close(h.fd);
		goto fail;
	}
	if (c->scope.slot_bytes > c->arena_bytes - c->hello.data_start)
		snprintf(c->warning, sizeof c->warning, "pool %s: the arena (%" PRIu64 " bytes) cannot "
			 "hold one page record of %" PRIu64 " bytes", c->address, c->arena_bytes,
			 c->scope.slot_bytes);
	c->fd = h.fd;
	c->io_epoch = c->epoch = 1;
	c->state = SEL_POOL_ATTACHED;
	c->st.sessions = 1;
	c->next_id = 1;
	if ((rc = pthread_create(&c->io, NULL, io_main, c))) {
		rc = eos_fail(-rc, "pool: cannot start the I/O thread: %s", strerror(rc));
		goto fail;
	}
	c->io_started = true;
	*out = c;
	return 0;
fail:
	sel_pool_destroy(c);
	return rc;
}

int sel_pool_close(sel_pool_client *c)
{
	if (!c || c->closed)
		return 0;
	c->closed = true;
	atomic_store(&c->stop, true);
	if (c->io_started) {
		wake(c->wake_io);
		pthread_join(c->io, NULL);
		c->io_started = false;
	}
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	c->state = c->state == SEL_POOL_DISABLED ? SEL_POOL_DISABLED : SEL_POOL_DETACHED;
	return 0;
}

static void lease_free(struct lease *l)
{
	sel_pool_msg_free(&l->msg);
	free(l->slots);
	free(l);
}

void sel_pool_destroy(sel_pool_client *c)
{
	if (!c)
		return;
	sel_pool_close(c);
	for (size_t i = 0; c->leases.b && i <= c->leases.mask; i++)
		for (struct eos_hnode *x = c->leases.b[i], *nx; x; x = nx) {
			nx = x->next;
			lease_free((struct lease *)((char *)x - offsetof(struct lease, hn)));
		}
	for (size_t i = 0; c->pendings.b && i <= c->pendings.mask; i++)
		for (struct eos_hnode *x = c->pendings.b[i], *nx; x; x = nx) {
			nx = x->next;
			free((char *)x - offsetof(struct pending, hn));
		}
	for (size_t i = 0; c->tickets.b && i <= c->tickets.mask; i++)
		for (struct eos_hnode *x = c->tickets.b[i], *nx; x; x = nx) {
			nx = x->next;
			sel_pool_ticket *t = (sel_pool_ticket *)((char *)x - offsetof(sel_pool_ticket, hn));
			t->linked = false; /* the caller still owns it; it only loses its answer */
		}
	eos_hmap_free(&c->leases);
	eos_hmap_free(&c->pendings);
	eos_hmap_free(&c->tickets);
	while (c->out_head) {
		struct qframe *f = c->out_head;
		c->out_head = f->next;
		free(f);
	}
	while (c->in_head) {
		struct qmsg *q = c->in_head;
		c->in_head = q->next;
		sel_pool_msg_free(&q->m);
		free(q);
	}
	free(c->evq.v);
	if (c->arena)
		munmap(c->arena, (size_t)c->arena_bytes);
	if (c->wake_io >= 0)
		close(c->wake_io);
	if (c->wake_worker >= 0)
		close(c->wake_worker);
	free(c->rbuf);
	sel_record_layout_free(&c->rl);
	sel_slot_layout_free(&c->lay);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* ---- accessors ------------------------------------------------------------------------------ */

enum sel_pool_state sel_pool_state(const sel_pool_client *c) { return c->state; }

const char *sel_pool_state_name(enum sel_pool_state s)
{
	return s == SEL_POOL_ATTACHED ? "attached" : s == SEL_POOL_DETACHED ? "detached" : "disabled";
}

const struct sel_pool_m_hello *sel_pool_hello(const sel_pool_client *c) { return &c->hello; }
const uint8_t *sel_pool_instance(const sel_pool_client *c) { return c->instance; }
const char *sel_pool_warning(const sel_pool_client *c) { return c->warning; }
uint64_t sel_pool_slot_bytes(const sel_pool_client *c) { return c->lay.slot_bytes; }
uint32_t sel_pool_row_slots(const sel_pool_client *c) { return c->lay.row_slots; }
int sel_pool_wait_fd(const sel_pool_client *c) { return c->wake_worker; }
void sel_pool_stats(const sel_pool_client *c, struct sel_pool_client_stats *out) { *out = c->st; }

void *sel_pool_arena(const sel_pool_client *c, uint64_t *bytes)
{
	if (bytes)
		*bytes = c->arena_bytes;
	return c->arena;
}

uint64_t sel_pool_xfer_parts(const sel_pool_client *c, struct sel_xfer_part *parts)
{
	for (uint32_t r = 0; r < c->lay.ranks; r++)
		parts[r] = (struct sel_xfer_part){(uint64_t)(uintptr_t)c->arena + c->lay.share_off[r],
						  c->lay.slot_bytes};
	return c->arena_bytes / c->lay.slot_bytes;
}

void *sel_pool_slot_addr(const sel_pool_client *c, uint32_t s)
{
	return c->arena + (uint64_t)s * c->lay.slot_bytes;
}

/* ---- tables ---------------------------------------------------------------------------------- */

#define CONTAINER(p, type, member) ((type *)((char *)(p) - offsetof(type, member)))

static struct pending *pending_find(sel_pool_client *c, uint64_t id, bool claim)
{
	for (struct eos_hnode *x = eos_hmap_first(&c->pendings, eos_hash64(id)); x; x = eos_hmap_next(x)) {
		struct pending *p = CONTAINER(x, struct pending, hn);
		if (p->id == id && p->is_claim == claim && p->epoch == c->epoch)
			return p;
	}
	return NULL;
}

static void pending_drop(sel_pool_client *c, struct pending *p)
{
	eos_hmap_remove(&c->pendings, &p->hn);
	if (p->is_claim) {
		plist_del(&c->claims, p);
		c->n_claims--;
	} else {
		c->n_puts--;
	}
	free(p);
}

static struct lease *lease_find(sel_pool_client *c, uint64_t id)
{
	for (struct eos_hnode *x = eos_hmap_first(&c->leases, eos_hash64(id)); x; x = eos_hmap_next(x)) {
		struct lease *l = CONTAINER(x, struct lease, hn);
		if (l->pub.id == id)
			return l;
	}
	return NULL;
}

static void maybe_drained(sel_pool_client *c)
{
	if (c->state == SEL_POOL_DETACHED && c->n_live == 0 && atomic_load(&c->drained) != c->epoch) {
		atomic_store(&c->drained, c->epoch);
		wake(c->wake_io);
	}
}

/* Remove a lease from the table and free it. */
static void lease_end(sel_pool_client *c, struct lease *l)
{
	eos_hmap_remove(&c->leases, &l->hn);
	if (!l->committed) {
		c->n_live--;
		if (l->pub.kind == SEL_POOL_CLAIM)
			c->n_claims--;
		else if (l->pub.kind == SEL_POOL_PUT)
			c->n_puts--;
	} else {
		c->n_puts--;
	}
	lease_free(l);
	maybe_drained(c);
}

static struct lease *lease_new(sel_pool_client *c, enum sel_pool_lease_kind kind, uint64_t id,
			       uint64_t nonce, uint32_t deadline_ms, const struct sel_pool_window *w,
			       uint32_t nw, uint32_t pages, uint32_t rows)
{
	struct lease *l = calloc(1, sizeof *l);
	if (!l)
		return NULL;
	l->slots = malloc(((size_t)pages + rows + 1) * sizeof *l->slots);
	if (!l->slots) {
		free(l);
		return NULL;
	}
	uint32_t k = 0;
	for (uint32_t i = 0; i < nw; i++)
		for (uint32_t s = 0; s < w[i].slots; s++)
			l->slots[k++] = (uint32_t)(w[i].off / c->lay.slot_bytes) + s;
	l->pub.kind = kind;
	l->pub.id = id;
	l->pub.n_pages = pages;
	l->pub.page_slots = l->slots;
	l->pub.n_row_slots = rows;
	l->pub.row_slots = l->slots + pages;
	l->pub.bytes = ((uint64_t)pages + rows) * c->lay.slot_bytes;
	l->pub.deadline_ns = eos_now_ns() + (uint64_t)deadline_ms * MS_NS;
	l->pub.windows = nw;
	l->pub.page_tokens = c->g->page_tokens;
	l->nonce = nonce;
	l->epoch = c->epoch;
	eos_hmap_insert(&c->leases, &l->hn, eos_hash64(id));
	c->n_live++;
	return l;
}

/* Windows of a grant: the protocol's rule, and slot numbers that fit u32. */
static int windows_ok(sel_pool_client *c, const struct sel_pool_window *w, uint32_t n, uint32_t pages,
		      uint32_t rows)
{
	if (c->arena_bytes / c->lay.slot_bytes > UINT32_MAX)
		return eos_fail(SEL_EFORMAT, "pool: the arena has more slots than slot numbers");
	return sel_pool_windows_check(w, n, c->arena_bytes, c->hello.data_start, c->lay.slot_bytes,
				      pages, rows);
}

static void send_ls(sel_pool_client *c, uint16_t type, uint64_t lease, uint64_t nonce, uint32_t status)
{
	struct sel_pool_msg m = {.type = type};
	m.u.ls = (struct sel_pool_lease_status){lease, nonce, status};
	submit(c, &m, true);
}

/* ---- holdings and lookups ---------------------------------------------------------------------- */

static int holdings(sel_pool_client *c, uint16_t type, const struct sel_pool_holding *h, uint32_t n)
{
	if (n > SEL_POOL_MAX_HOLDINGS)
		return eos_fail(-EINVAL, "pool: %u holdings in one call (at most %u)", n,
				SEL_POOL_MAX_HOLDINGS);
	for (uint32_t i = 0; i < n; i++)
		if (h[i].source == SEL_POOL_SRC_ARENA || h[i].source >= SEL_POOL_SOURCES)
			return eos_fail(-EINVAL, "pool: holding %u has source %u (gpu, dram or nvme)", i,
					h[i].source);
	struct sel_pool_msg m = {.type = type};
	m.u.holdings.n = n;
	m.u.holdings.h = (struct sel_pool_holding *)h;
	return submit(c, &m, false);
}

int sel_pool_announce(sel_pool_client *c, const struct sel_pool_holding *h, uint32_t n)
{
	return holdings(c, SEL_POOL_C_ANNOUNCE, h, n);
}

int sel_pool_withdraw(sel_pool_client *c, const struct sel_pool_holding *h, uint32_t n)
{
	return holdings(c, SEL_POOL_C_WITHDRAW, h, n);
}

int sel_pool_reset_holdings(sel_pool_client *c, uint32_t sources)
{
	if (sources & ~0xeu)
		return eos_fail(-EINVAL, "pool: unknown source bits 0x%x", sources);
	struct sel_pool_msg m = {.type = SEL_POOL_C_RESET};
	m.u.reset.sources = sources;
	return submit(c, &m, false);
}

int sel_pool_begin_lookup(sel_pool_client *c, const sel_history *h, uint64_t resident,
			  uint64_t limit, sel_pool_ticket **out)
{
	*out = NULL;
	uint64_t len = sel_history_len(h);
	uint64_t top = limit < len ? limit : len;
	if (resident >= top)
		return eos_fail(-EINVAL, "pool lookup: nothing above the resident %" PRIu64 " tokens "
				"(history %" PRIu64 ", limit %" PRIu64 ")", resident, len, limit);
	uint64_t k_hi = top / SEL_BUCKET_TOKENS, k_lo = resident / SEL_BUCKET_TOKENS;
	uint64_t n = k_hi - k_lo + 1;
	if (n > SEL_POOL_MAX_BOUNDS)
		n = SEL_POOL_MAX_BOUNDS;
	sel_digest *b = malloc(n * sizeof *b);
	sel_pool_ticket *t = calloc(1, sizeof *t);
	if (!b || !t) {
		free(b);
		free(t);
		return eos_fail(-ENOMEM, "pool lookup: out of memory");
	}
	for (uint64_t i = 0; i < n; i++)
		b[i] = *sel_history_bound(h, k_hi - i);
	t->id = c->next_id++;
	t->epoch = c->epoch;
	t->resident = resident;
	struct sel_pool_msg m = {.type = SEL_POOL_C_LOOKUP};
	m.u.lookup = (struct sel_pool_c_lookup){t->id, resident, top, k_hi, (uint32_t)n, b};
	int rc = submit(c, &m, false);
	free(b);
	if (rc) {
		free(t);
		return rc;
	}
	t->linked = true;
	eos_hmap_insert(&c->tickets, &t->hn, eos_hash64(t->id));
	c->st.lookups++;
	*out = t;
	return 0;
}

enum sel_pool_ticket_state sel_pool_ticket_state(const sel_pool_ticket *t) { return t->state; }
uint64_t sel_pool_ticket_id(const sel_pool_ticket *t) { return t->id; }
uint64_t sel_pool_ticket_resident(const sel_pool_ticket *t) { return t->resident; }

const struct sel_pool_m_answer *sel_pool_ticket_answer(const sel_pool_ticket *t)
{
	return t->state == SEL_POOL_TICKET_READY ? &t->ans.u.answer : NULL;
}

void sel_pool_ticket_free(sel_pool_client *c, sel_pool_ticket *t)
{
	if (!t)
		return;
	if (t->linked && c)
		eos_hmap_remove(&c->tickets, &t->hn);
	sel_pool_msg_free(&t->ans);
	free(t);
}

static sel_pool_ticket *ticket_find(sel_pool_client *c, uint64_t id)
{
	for (struct eos_hnode *x = eos_hmap_first(&c->tickets, eos_hash64(id)); x; x = eos_hmap_next(x)) {
		sel_pool_ticket *t = CONTAINER(x, sel_pool_ticket, hn);
		if (t->id == id)
			return t;
	}
	return NULL;
}

bool sel_pool_candidate_matches(const struct sel_pool_m_answer *a, uint32_t i,
				const sel_history *h, uint64_t resident)
{
	if (i >= a->n_cands)
		return false;
	const struct sel_pool_candidate *cd = &a->cands[i];
	if (cd->base > resident || cd->node >= a->n_nodes || !a->nodes[cd->node].has_row)
		return false;
	uint64_t len = sel_history_len(h), prev = UINT64_MAX;
	uint32_t n = cd->node, steps = 0;
	while (n != SEL_POOL_NONE) {
		if (n >= a->n_nodes || ++steps > a->n_nodes)
			return false;
		const struct sel_pool_anode *x = &a->nodes[n];
		uint64_t cc = x->key.consumed;
		if (cc > len || cc >= prev || cc <= cd->base || cc <= resident)
			return false;
		sel_key k;
		sel_history_key_at(h, cc, &k);
		if (!sel_key_eq(&k, &x->key))
			return false;
		prev = cc;
		n = x->up;
	}
	return true;
}

static int source_rank(uint8_t s)
{
	return s == SEL_POOL_SRC_GPU ? 0 : s == SEL_POOL_SRC_DRAM ? 1 : s == SEL_POOL_SRC_NVME ? 2 : 3;
}

int sel_pool_answer_pick(const struct sel_pool_m_answer *a, const sel_history *h, uint64_t resident)
{
	int best = -1;
	for (uint32_t i = 0; i < a->n_cands; i++) {
		uint64_t ci = a->nodes[a->cands[i].node].key.consumed;
		if (best >= 0) {
			uint64_t cb = a->nodes[a->cands[best].node].key.consumed;
			if (ci < cb)
				break;
			if (ci > cb || source_rank(a->cands[i].source) >= source_rank(a->cands[best].source))
				continue;
		}
		if (sel_pool_candidate_matches(a, i, h, resident))
			best = (int)i;
	}
	return best;
}

/* ---- claims, puts, exports ------------------------------------------------------------------------ */

int sel_pool_claim(sel_pool_client *c, const sel_pool_ticket *t, uint32_t i, uint64_t *claim)
{
	if (t->state != SEL_POOL_TICKET_READY || t->epoch != c->epoch || i >= t->ans.u.answer.n_cands)
		return eos_fail(-EINVAL, "pool claim: the ticket has no candidate %u of this session", i);
	if (c->n_claims >= c->hello.max_claims)
		return eos_fail(-EBUSY, "pool claim: %u claims open (the manager allows %u)", c->n_claims,
				c->hello.max_claims);
	const struct sel_pool_m_answer *a = &t->ans.u.answer;
	const struct sel_pool_candidate *cd = &a->cands[i];
	struct pending *p = calloc(1, sizeof *p);
	if (!p)
		return eos_fail(-ENOMEM, "pool claim: out of memory");
	p->id = c->next_id++;
	p->epoch = c->epoch;
	p->is_claim = true;
	p->source = cd->source;
	p->key = a->nodes[cd->node].key;
	p->resident = t->resident;
	p->bytes = cd->bytes;
	p->deadline_ns = eos_now_ns() +
			 (uint64_t)sel_pool_deadline_ms(SEL_POOL_REQUESTER_SETUP_MS,
							SEL_POOL_REQUESTER_SETUP_MS, cd->bytes) * MS_NS;
	struct sel_pool_msg m = {.type = SEL_POOL_C_CLAIM};
	m.u.claim.claim = p->id;
	m.u.claim.source = cd->source;
	memcpy(m.u.claim.holder, cd->holder, SEL_POOL_ID_BYTES);
	m.u.claim.generation = cd->generation;
	m.u.claim.key = p->key;
	m.u.claim.resident = t->resident;
	m.u.claim.setup_ms = c->setup_ms;
	int rc = submit(c, &m, false);
	if (rc) {
		free(p);
		return rc;
	}
	eos_hmap_insert(&c->pendings, &p->hn, eos_hash64(p->id));
	plist_push(&c->claims, p);
	c->n_claims++;
	c->st.claims++;
	*claim = p->id;
	return 0;
}

int sel_pool_put(sel_pool_client *c, const struct sel_pool_put_desc *d, uint64_t *put)
{
	uint32_t pt = c->g->page_tokens;
	uint64_t cc = d->key.consumed, pc = d->parent.consumed;
	bool root = d->tail == cc / pt;
	bool linked = !sel_key_is_none(&d->parent) && pc < cc && d->tail == cc / pt - pc / pt;
	if (!cc || (!root && !linked) || d->tail > SEL_POOL_MAX_PAGES)
		return eos_fail(-EINVAL, "pool put: tail %u is neither the whole chain (%" PRIu64 ") nor "
				"the pages past the parent's %" PRIu64 " tokens", d->tail, cc / pt, pc);
	if (c->n_puts >= c->hello.max_puts)
		return eos_fail(-EBUSY, "pool put: %u puts open (the manager allows %u)", c->n_puts,
				c->hello.max_puts);
	struct pending *p = calloc(1, sizeof *p);
	if (!p)
		return eos_fail(-ENOMEM, "pool put: out of memory");
	p->id = c->next_id++;
	p->epoch = c->epoch;
	p->key = d->key;
	p->tail = d->tail;
	struct sel_pool_msg m = {.type = SEL_POOL_C_PUT};
	m.u.put = (struct sel_pool_c_put){.put = p->id, .key = d->key, .parent = d->parent,
					  .bucket = d->bucket, .tail = d->tail, .has_row = 1,
					  .setup_ms = c->setup_ms};
	int rc = submit(c, &m, false);
	if (rc) {
		free(p);
		return rc;
	}
	eos_hmap_insert(&c->pendings, &p->hn, eos_hash64(p->id));
	c->n_puts++;
	c->st.puts++;
	*put = p->id;
	return 0;
}

static bool live(sel_pool_client *c, struct sel_pool_lease *pub, enum sel_pool_lease_kind kind)
{
	struct lease *l = (struct lease *)pub;
	return pub && pub->kind == kind && !l->committed && lease_find(c, pub->id) == l;
}

/* The session that granted the lease is still open. */
static bool same_session(sel_pool_client *c, struct lease *l)
{
	return c->state == SEL_POOL_ATTACHED && l->epoch == c->epoch;
}

int sel_pool_commit(sel_pool_client *c, struct sel_pool_lease *pub, const uint64_t *page_cksum,
		    uint64_t row_cksum)
{
	if (!live(c, pub, SEL_POOL_PUT))
		return eos_fail(-EINVAL, "pool commit: not a live put lease");
	struct lease *l = (struct lease *)pub;
	if (!same_session(c, l)) {
		/* The session is gone: nothing to commit to. */
		emit(c, SEL_POOL_EV_PUT_RESULT, SEL_POOL_GONE, l->pub.request, &l->pub.key, NULL, NULL);
		lease_end(c, l);
		return 0;
	}
	struct sel_pool_msg m = {.type = SEL_POOL_C_COMMIT};
	m.u.cksums = (struct sel_pool_c_cksums){l->pub.id, l->nonce, 0, l->pub.n_pages,
						(uint64_t *)page_cksum, row_cksum};
	int rc = submit(c, &m, true);
	if (rc)
		return rc;
	/* Committed: the windows are the manager's; keep the id for the result. */
	l->committed = true;
	c->n_live--;
	maybe_drained(c);
	return 0;
}

int sel_pool_export_reply(sel_pool_client *c, struct sel_pool_lease *pub, uint32_t reason)
{
	if (!live(c, pub, SEL_POOL_EXPORT) || reason >= SEL_POOL_REASONS)
		return eos_fail(-EINVAL, "pool export reply: not a live export lease");
	struct lease *l = (struct lease *)pub;
	if (same_session(c, l))
		send_ls(c, SEL_POOL_C_EXPORT_REPLY, l->pub.id, l->nonce, reason);
	if (reason == SEL_POOL_OK) {
		c->st.exports_accepted++;
		return 0;
	}
	c->st.exports_refused++;
	lease_end(c, l);
	return 0;
}

int sel_pool_export_done(sel_pool_client *c, struct sel_pool_lease *pub, const uint64_t *page_cksum,
			 uint64_t row_cksum)
{
	if (!live(c, pub, SEL_POOL_EXPORT))
		return eos_fail(-EINVAL, "pool export done: not a live export lease");
	struct lease *l = (struct lease *)pub;
	if (same_session(c, l)) {
		struct sel_pool_msg m = {.type = SEL_POOL_C_EXPORT_DONE};
		m.u.cksums = (struct sel_pool_c_cksums){l->pub.id, l->nonce, SEL_POOL_OK, l->pub.n_pages,
							(uint64_t *)page_cksum, row_cksum};
		submit(c, &m, true);
	}
	c->st.exports_done++;
	lease_end(c, l);
	return 0;
}

int sel_pool_progress(sel_pool_client *c, struct sel_pool_lease *pub, uint32_t windows_done)
{
	struct lease *l = (struct lease *)pub;
	if (!pub || l->committed || lease_find(c, pub->id) != l)
		return eos_fail(-EINVAL, "pool progress: not a live lease");
	if (!same_session(c, l))
		return eos_fail(-ENOTCONN, "pool progress: the lease's session is gone");
	struct sel_pool_msg m = {.type = SEL_POOL_C_PROGRESS};
	m.u.progress = (struct sel_pool_c_progress){l->pub.id, l->nonce, windows_done};
	return submit(c, &m, false);
}

int sel_pool_release(sel_pool_client *c, struct sel_pool_lease *pub, uint32_t status)
{
	struct lease *l = (struct lease *)pub;
	if (!pub || l->committed || lease_find(c, pub->id) != l || status >= SEL_POOL_REASONS)
		return eos_fail(-EINVAL, "pool release: not a live lease");
	if (same_session(c, l)) {
		if (l->pub.kind == SEL_POOL_EXPORT) {
			struct sel_pool_msg m = {.type = SEL_POOL_C_EXPORT_DONE};
			m.u.cksums = (struct sel_pool_c_cksums){l->pub.id, l->nonce,
								status ? status : SEL_POOL_COPY_FAILED,
								0, NULL, 0};
			submit(c, &m, true);
		} else {
			uint32_t s = l->pub.kind == SEL_POOL_PUT && !status ? SEL_POOL_CANCELLED : status;
			send_ls(c, SEL_POOL_C_RELEASE, l->pub.id, l->nonce, s);
		}
	}
	lease_end(c, l);
	return 0;
}

bool sel_pool_lease_matches(const struct sel_pool_lease *l, const sel_history *h, uint64_t resident)
{
	if (l->kind != SEL_POOL_CLAIM || !l->n_nodes)
		return false;
	uint32_t pt = l->page_tokens;
	if (l->base != resident / pt * pt || !sel_key_eq(&l->nodes[l->n_nodes - 1].key, &l->key))
		return false;
	uint64_t len = sel_history_len(h), prev = 0;
	for (uint32_t i = 0; i < l->n_nodes; i++) {
		uint64_t cc = l->nodes[i].key.consumed;
		if (cc > len || cc <= prev || cc <= resident)
			return false;
		sel_key k;
		sel_history_key_at(h, cc, &k);
		if (!sel_key_eq(&k, &l->nodes[i].key))
			return false;
		prev = cc;
	}
	return true;
}

/* ---- verification and checksums (copier threads) ---------------------------------------------------- */

static uint64_t row_checksum(const sel_pool_client *c, const struct sel_pool_lease *l, bool *ok)
{
	uint32_t cap = l->n_row_slots * c->lay.ranks;
	struct iovec small[64], *iov = cap <= 64 ? small : malloc(cap * sizeof *iov);
	void *sm[64], **slots = l->n_row_slots <= 64 ? sm : malloc(l->n_row_slots * sizeof *slots);
	uint64_t v = 0;
	*ok = false;
	if (iov && slots) {
		for (uint32_t k = 0; k < l->n_row_slots; k++)
			slots[k] = sel_pool_slot_addr(c, l->row_slots[k]);
		int n = sel_record_row_iov(&c->rl, 0, slots, l->n_row_slots, iov, cap);
		if (n >= 0) {
			v = sel_record_row_checksum(iov, (uint32_t)n);
			*ok = true;
		}
	}
	if (iov != small)
		free(iov);
	if (slots != sm)
		free(slots);
	return v;
}

int sel_pool_lease_verify(const sel_pool_client *c, const struct sel_pool_lease *l)
{
	if (l->kind != SEL_POOL_CLAIM || !l->page_cksum)
		return eos_fail(-EINVAL, "pool verify: not a claim lease");
	for (uint32_t i = 0; i < l->n_pages; i++) {
		uint64_t got = XXH3_64bits(sel_pool_slot_addr(c, l->page_slots[i]), c->lay.slot_bytes);
		if (got != l->page_cksum[i])
			return eos_fail(SEL_ECORRUPT, "pool claim %" PRIu64 ": page %u (arena slot %u) fails "
					"its checksum (%016" PRIx64 ", expected %016" PRIx64 ")", l->id, i,
					l->page_slots[i], got, l->page_cksum[i]);
	}
	if (l->n_row_slots) {
		bool ok;
		uint64_t got = row_checksum(c, l, &ok);
		if (!ok)
			return eos_fail(-ENOMEM, "pool verify: out of memory for the row");
		if (got != l->row_cksum)
			return eos_fail(SEL_ECORRUPT, "pool claim %" PRIu64 ": the row fails its checksum "
					"(%016" PRIx64 ", expected %016" PRIx64 ")", l->id, got, l->row_cksum);
	}
	return 0;
}

void sel_pool_lease_checksums(const sel_pool_client *c, const struct sel_pool_lease *l,
			      uint64_t *page_cksum, uint64_t *row_cksum)
{
	for (uint32_t i = 0; i < l->n_pages; i++)
		page_cksum[i] = XXH3_64bits(sel_pool_slot_addr(c, l->page_slots[i]), c->lay.slot_bytes);
	bool ok;
	*row_cksum = l->n_row_slots ? row_checksum(c, l, &ok) : 0;
}

/* ---- poll: applying what the manager sent ---------------------------------------------------------- */

static void refused(sel_pool_client *c) { c->st.refused_frames++; }

/* A claim grant against the pending claim: the chain's shape, the pages a
 * restore above its resident count needs, and the windows. */
static int grant_ok(sel_pool_client *c, const struct pending *p, const struct sel_pool_m_claim_grant *g)
{
	uint32_t pt = c->g->page_tokens;
	if (g->source != p->source || !g->n_nodes)
		return eos_fail(SEL_EFORMAT, "pool grant: source %u or no nodes", g->source);
	const struct sel_pool_gnode *last = &g->nodes[g->n_nodes - 1];
	if (!sel_key_eq(&last->key, &p->key) || !last->has_row)
		return eos_fail(SEL_EFORMAT, "pool grant: the last node is not the claimed endpoint");
	if (g->base != p->resident / pt * pt || g->n_pages != p->key.consumed / pt - p->resident / pt)
		return eos_fail(SEL_EFORMAT, "pool grant: pages start at %" PRIu64 " tokens, %u pages "
				"(wanted from %" PRIu64 ")", g->base, g->n_pages, p->resident / pt * pt);
	uint64_t prev = 0;
	for (uint32_t i = 0; i < g->n_nodes; i++) {
		const struct sel_pool_gnode *n = &g->nodes[i];
		uint64_t cc = n->key.consumed;
		if (cc <= prev || cc <= p->resident || n->pages > n->tail || (i + 1 < g->n_nodes && n->has_row))
			return eos_fail(SEL_EFORMAT, "pool grant: node %u is out of order or oversized", i);
		if (i > 0 && (!sel_key_eq(&n->parent, &g->nodes[i - 1].key) || n->pages != n->tail ||
			      n->tail != cc / pt - prev / pt))
			return eos_fail(SEL_EFORMAT, "pool grant: node %u does not extend node %u", i, i - 1);
		if (i == 0 && (cc / pt < n->tail || cc / pt - n->tail > p->resident / pt ||
			       n->pages != cc / pt - p->resident / pt))
			return eos_fail(SEL_EFORMAT, "pool grant: the first node's pages do not start at the "
					"resident page");
		prev = cc;
	}
	return windows_ok(c, g->windows, g->n_windows, g->n_pages, c->lay.row_slots);
}

static void on_claim_grant(sel_pool_client *c, struct qmsg *q)
{
	struct sel_pool_m_claim_grant *g = &q->m.u.grant;
	struct pending *p = pending_find(c, g->claim, true);
	if (!p || p->dead || lease_find(c, g->lease)) {
		/* Not ours, or too late: release it so nothing stays reserved. */
		refused(c);
		send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, p ? SEL_POOL_CANCELLED : SEL_POOL_FORGED);
		if (p && p->dead)
			pending_drop(c, p);
		return;
	}
	if (grant_ok(c, p, g)) {
		refused(c);
		send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_BAD_REQUEST);
		emit(c, SEL_POOL_EV_CLAIM_FAILED, SEL_POOL_BAD_REQUEST, p->id, &p->key, NULL, NULL);
		c->st.claims_failed++;
		pending_drop(c, p);
		return;
	}
	struct lease *l = lease_new(c, SEL_POOL_CLAIM, g->lease, g->nonce, g->deadline_ms, g->windows,
				    g->n_windows, g->n_pages, c->lay.row_slots);
	if (!l) {
		send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_CANCELLED);
		emit(c, SEL_POOL_EV_CLAIM_FAILED, SEL_POOL_NO_ROOM, p->id, &p->key, NULL, NULL);
		c->st.claims_failed++;
		pending_drop(c, p);
		return;
	}
	l->pub.request = p->id;
	l->pub.source = g->source;
	l->pub.key = p->key;
	l->pub.base = g->base;
	l->pub.n_nodes = g->n_nodes;
	l->pub.nodes = g->nodes;
	l->pub.page_cksum = g->page_cksum;
	l->pub.row_cksum = g->row_cksum;
	l->msg = q->m; /* the lease owns the arrays now */
	q->m.mem = NULL;
	/* The claim's slot moves from pending to the lease. */
	eos_hmap_remove(&c->pendings, &p->hn);
	plist_del(&c->claims, p);
	free(p);
	c->st.claims_granted++;
	emit(c, SEL_POOL_EV_CLAIM_GRANTED, SEL_POOL_OK, l->pub.request, &l->pub.key, &l->pub, NULL);
}

static void on_put_grant(sel_pool_client *c, struct qmsg *q)
{
	struct sel_pool_m_put_grant *g = &q->m.u.put_grant;
	struct pending *p = pending_find(c, g->put, false);
	if (!p || lease_find(c, g->lease)) {
		refused(c);
		send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_FORGED);
		return;
	}
	struct lease *l = NULL;
	if (windows_ok(c, g->windows, g->n_windows, p->tail, c->lay.row_slots) ||
	    !(l = lease_new(c, SEL_POOL_PUT, g->lease, g->nonce, g->deadline_ms, g->windows,
			    g->n_windows, p->tail, c->lay.row_slots))) {
		if (!l)
			refused(c);
		send_ls(c, SEL_POOL_C_RELEASE, g->lease, g->nonce, SEL_POOL_BAD_REQUEST);
		emit(c, SEL_POOL_EV_PUT_REFUSED, SEL_POOL_BAD_REQUEST, p->id, &p->key, NULL, NULL);
		c->st.puts_refused++;
		pending_drop(c, p);
		return;
	}
	l->pub.request = p->id;
	l->pub.key = p->key;
	eos_hmap_remove(&c->pendings, &p->hn);
	free(p);
	c->st.puts_granted++;
	emit(c, SEL_POOL_EV_PUT_GRANTED, SEL_POOL_OK, l->pub.request, &l->pub.key, &l->pub, NULL);
}

static void on_export(sel_pool_client *c, struct qmsg *q)
{
	struct sel_pool_m_export_request *e = &q->m.u.export_req;
	uint32_t pt = c->g->page_tokens;
	uint64_t chain = e->key.consumed / pt;
	c->st.exports++;
	if (lease_find(c, e->lease)) {
		refused(c);
		return; /* a second request under a live lease's id: ignore it */
	}
	uint32_t rows = e->row ? c->lay.row_slots : 0;
	struct lease *l = NULL;
	if (!e->key.consumed || e->start_page > chain || e->n_pages != chain - e->start_page ||
	    windows_ok(c, e->windows, e->n_windows, e->n_pages, rows) ||
	    !(l = lease_new(c, SEL_POOL_EXPORT, e->lease, e->nonce, e->deadline_ms, e->windows,
			    e->n_windows, e->n_pages, rows))) {
		refused(c);
		send_ls(c, SEL_POOL_C_EXPORT_REPLY, e->lease, e->nonce, SEL_POOL_BAD_REQUEST);
		c->st.exports_refused++;
		return;
	}
	l->pub.source = e->source;
	l->pub.key = e->key;
	l->pub.generation = e->generation;
	l->pub.start_page = e->start_page;
	l->pub.base = (uint64_t)e->start_page * pt;
	emit(c, SEL_POOL_EV_EXPORT, SEL_POOL_OK, 0, &l->pub.key, &l->pub, NULL);
}

static void on_lease_status(sel_pool_client *c, struct qmsg *q)
{
	const struct sel_pool_lease_status *s = &q->m.u.ls;
	struct lease *l = lease_find(c, s->lease);
	if (!l || l->nonce != s->nonce) {
		refused(c);
		return;
	}
	switch (q->m.type) {
	case SEL_POOL_M_PUT_RESULT:
		if (!l->committed) {
			refused(c);
			return;
		}
		if (s->status == SEL_POOL_OK)
			c->st.puts_accepted++;
		else
			c->st.puts_rejected++;
		emit(c, SEL_POOL_EV_PUT_RESULT, s->status, l->pub.request, &l->pub.key, NULL, NULL);
		lease_end(c, l);
		return;
	case SEL_POOL_M_EXPORT_CANCEL:
		if (l->pub.kind != SEL_POOL_EXPORT) {
			refused(c);
			return;
		}
		emit(c, SEL_POOL_EV_EXPORT_CANCEL, s->status, 0, &l->pub.key, &l->pub, NULL);
		return;
	case SEL_POOL_M_LEASE_FAILED:
		if (l->committed) {
			refused(c);
			return;
		}
		if (!l->pub.failed) {
			l->pub.failed = s->status ? s->status : SEL_POOL_TIMEOUT;
			c->st.leases_failed++;
			emit(c, SEL_POOL_EV_LEASE_FAILED, l->pub.failed, l->pub.request, &l->pub.key,
			     &l->pub, NULL);
		}
		return;
	default:
		return;
	}
}

static void on_msg(sel_pool_client *c, struct qmsg *q)
{
	c->st.frames_in++;
	switch (q->m.type) {
	case SEL_POOL_M_ANSWER: {
		sel_pool_ticket *t = ticket_find(c, q->m.u.answer.ticket);
		if (!t || t->epoch != c->epoch || t->state != SEL_POOL_TICKET_PENDING) {
			c->st.answers_dropped++;
			return;
		}
		t->ans = q->m;
		q->m.mem = NULL;
		t->state = SEL_POOL_TICKET_READY;
		c->st.answers++;
		emit(c, SEL_POOL_EV_ANSWER, SEL_POOL_OK, t->id, NULL, NULL, t);
		return;
	}
	case SEL_POOL_M_CLAIM_GRANT:
		on_claim_grant(c, q);
		return;
	case SEL_POOL_M_CLAIM_REFUSED:
	case SEL_POOL_M_PUT_REFUSED: {
		bool claim = q->m.type == SEL_POOL_M_CLAIM_REFUSED;
		struct pending *p = pending_find(c, q->m.u.refused.id, claim);
		if (!p) {
			refused(c);
			return;
		}
		if (!p->dead) {
			emit(c, claim ? SEL_POOL_EV_CLAIM_FAILED : SEL_POOL_EV_PUT_REFUSED,
			     q->m.u.refused.reason, p->id, &p->key, NULL, NULL);
			if (claim)
				c->st.claims_failed++;
			else
				c->st.puts_refused++;
		}
		pending_drop(c, p);
		return;
	}
	case SEL_POOL_M_PUT_GRANT:
		on_put_grant(c, q);
		return;
	case SEL_POOL_M_EXPORT_REQUEST:
		on_export(c, q);
		return;
	case SEL_POOL_M_PUT_RESULT:
	case SEL_POOL_M_EXPORT_CANCEL:
	case SEL_POOL_M_LEASE_FAILED:
		on_lease_status(c, q);
		return;
	case SEL_POOL_M_ERROR:
		c->st.manager_errors++;
		return;
	default:
		refused(c); /* hellos after the handshake, client types */
		return;
	}
}

/* The session ended: fail what waits for it, report every live lease. */
static void on_lost(sel_pool_client *c)
{
	c->state = SEL_POOL_DETACHED;
	c->st.detaches++;
	for (size_t i = 0; i <= c->tickets.mask; i++)
		for (struct eos_hnode *x = c->tickets.b[i]; x; x = x->next) {
			sel_pool_ticket *t = CONTAINER(x, sel_pool_ticket, hn);
			if (t->state == SEL_POOL_TICKET_PENDING)
				t->state = SEL_POOL_TICKET_FAILED;
		}
	for (size_t i = 0; i <= c->pendings.mask; i++)
		for (struct eos_hnode *x = c->pendings.b[i], *nx; x; x = nx) {
			nx = x->next;
			struct pending *p = CONTAINER(x, struct pending, hn);
			if (!p->dead)
				emit(c, p->is_claim ? SEL_POOL_EV_CLAIM_FAILED : SEL_POOL_EV_PUT_REFUSED,
				     SEL_POOL_GONE, p->id, &p->key, NULL, NULL);
			pending_drop(c, p);
		}
	for (size_t i = 0; i <= c->leases.mask; i++)
		for (struct eos_hnode *x = c->leases.b[i], *nx; x; x = nx) {
			nx = x->next;
			struct lease *l = CONTAINER(x, struct lease, hn);
			if (l->committed) {
				emit(c, SEL_POOL_EV_PUT_RESULT, SEL_POOL_GONE, l->pub.request, &l->pub.key,
				     NULL, NULL);
				lease_end(c, l);
				continue;
			}
			if (!l->pub.failed) {
				l->pub.failed = SEL_POOL_GONE;
				c->st.leases_failed++;
			}
			emit(c, SEL_POOL_EV_LEASE_FAILED, SEL_POOL_GONE, l->pub.request, &l->pub.key,
			     &l->pub, NULL);
		}
	emit(c, SEL_POOL_EV_DETACHED, SEL_POOL_GONE, 0, NULL, NULL, NULL);
	maybe_drained(c);
}

static void expire_claims(sel_pool_client *c, uint64_t now)
{
	for (struct pending *p = c->claims.head, *nx; p; p = nx) {
		nx = p->next;
		if (!p->dead && now >= p->deadline_ns) {
			p->dead = true; /* a late grant is released on arrival */
			c->st.claims_failed++;
			emit(c, SEL_POOL_EV_CLAIM_FAILED, SEL_POOL_TIMEOUT, p->id, &p->key, NULL, NULL);
		}
	}
}

int sel_pool_poll(sel_pool_client *c, struct sel_pool_event *ev, size_t cap)
{
	drain_fd(c->wake_worker);
	if (c->evq.n < cap) {
		pthread_mutex_lock(&c->mu);
		struct qmsg *q = c->in_head;
		c->in_head = c->in_tail = NULL;
		c->in_bytes = 0;
		bool paused = c->in_paused;
		pthread_mutex_unlock(&c->mu);
		if (paused)
			wake(c->wake_io);
		while (q) {
			struct qmsg *nx = q->next;
			switch (q->kind) {
			case Q_MSG:
				if (q->epoch == c->epoch && c->state == SEL_POOL_ATTACHED)
					on_msg(c, q);
				break;
			case Q_LOST:
				if (q->epoch == c->epoch && c->state == SEL_POOL_ATTACHED)
					on_lost(c);
				break;
			case Q_ATTACHED:
				c->epoch = q->epoch;
				c->state = SEL_POOL_ATTACHED;
				c->st.sessions++;
				emit(c, SEL_POOL_EV_ATTACHED, SEL_POOL_OK, 0, NULL, NULL, NULL);
				break;
			case Q_DISABLED:
				c->state = SEL_POOL_DISABLED;
				emit(c, SEL_POOL_EV_DISABLED, SEL_POOL_GONE, 0, NULL, NULL, NULL);
				break;
			}
			sel_pool_msg_free(&q->m);
			free(q);
			q = nx;
		}
		expire_claims(c, eos_now_coarse_ns());
	}
	size_t n = 0;
	while (n < cap && c->evq.n) {
		ev[n++] = c->evq.v[c->evq.head];
		c->evq.head = (c->evq.head + 1) % c->evq.cap;
		c->evq.n--;
	}
	if (c->evq.n)
		wake(c->wake_worker);
	return (int)n;
}
