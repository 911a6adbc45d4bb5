/*
 * shard_link.c - the rank links of a multi-host core: rank zero's link set
 * (join, agreement, job fan-out, completions, stop, drain) and a peer's
 * link (join, agreement, the record service loop) (design 2.14; 2.12's
 * "A peer connection that stops accepting frames fails the job; it never
 * delays the worker" and "A transfer whose completion can no longer be
 * reported stops the store and the worker"; shard_link.h states the rules
 * callers rely on; docs/multihost.md).
 *
 * DESIGN
 *
 * Startup (join, agreement) runs on one thread with blocking calls bounded
 * by deadlines: every socket operation there is MSG_DONTWAIT with poll()
 * for the rest of the deadline, so a peer that connects and says nothing,
 * or stops in the middle of a frame, costs at most the handshake time and
 * never blocks the join of the others.
 *
 * Serving.  Rank zero has one writer thread per peer and one reader thread
 * for all of them.  A submission encodes its job once into a reference-
 * counted frame and links it onto the ring of every addressed peer; the
 * writer sends the head of its ring with a blocking send and only then
 * unlinks it, so a frame counts against the bound until it is in the
 * kernel.  A peer that stops reading fills its socket buffers, its writer
 * blocks in send, its ring fills, and the next submission fails -EAGAIN at
 * once.  The reader polls every link and a wake eventfd with a timeout
 * taken from the oldest outstanding job (jobs are listed in submission
 * order and share one timeout, so the head has the earliest deadline),
 * decodes completions and aggregates them per job.  One mutex covers the
 * rings, the job table and list, the completion list and the state; it is
 * never held across a system call that can wait (the only calls under it
 * are eventfd writes and shutdown(2), neither of which waits).
 *
 * Partial stores and the stop.  A STORE that finishes with a failure on
 * some peer and a committed file on others is held while an internal UNLINK
 * goes to the ones that committed; the store is reported when that unlink
 * finished, with its outcome.  A failed link, or a job not finished in
 * time, turns the set to STOPPING: the failed ranks are struck off every
 * job's pending set (they will never answer), nothing more is reported,
 * every STORE the survivors commit is unlinked from them, and when no job
 * remains outstanding (or the job timeout passed once more) the set is
 * STOPPED and sel_shard_poll says so.  Jobs are never reported after the
 * stop began: their ids may still be under a copy on the failed rank.
 *
 * The peer.  One thread serves: it polls its socket (for jobs, and for
 * writing completions), an eventfd that sel_shard_peer_complete raises, and
 * the ops' own descriptor.  Completions are encoded by the completing
 * thread into an output buffer under the peer's mutex; while that buffer
 * holds more than out_bytes the service stops reading jobs, so a rank zero
 * that stops reading cannot make it grow without bound.
 *
 * INVARIANTS (sel_shard_check)
 *   1. Every outstanding job is in the table and on the list exactly once;
 *      outstanding counts them; a job's pending ranks are a subset of the
 *      ranks it addressed, none of them dead.
 *   2. A ring holds count frames from head, normal of them caller jobs:
 *      normal <= queue_jobs, count <= capacity, bytes = their lengths.
 *   3. Every job on the completion list has no pending rank; none is there
 *      once the set is stopping.
 *   4. A queued frame holds a reference for every ring it is on.
 */
#include "shard_link.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "hmap.h"
#include "internal.h"

#define MS_NS 1000000ull
#define S_NS 1000000000ull
#define DONE_FRAME_MAX 4096u            /* what rank zero reads while serving */
#define JOIN_FRAME_MAX 512u             /* a JOIN, header included */
#define PEER_OUT_BYTES (1ull << 20)
#define PEER_LINK_DRAIN_NS (30 * S_NS)  /* the ops' drain after a link ended */

/* ---- small helpers --------------------------------------------------------- */

static int timeout_ms(uint64_t deadline_ns, uint64_t now)
{
	if (deadline_ns <= now)
		return 0;
	uint64_t ms = (deadline_ns - now + MS_NS - 1) / MS_NS;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int popcount64(uint64_t v) { return __builtin_popcountll(v); }

static const char *hex16(const uint8_t *b, char out[33])
{
	return sel_hex(b, 16, out);
}

/* TCP options of every link: no Nagle (jobs and completions are small and
 * latency-bound), keepalive and a user timeout so a host that vanished
 * without a reset ends the link within about a minute, and the configured
 * buffer sizes. */
static void link_sockopts(int fd, int sock_buf)
{
	int one = 1, idle = 10, intvl = 5, cnt = 3;
	unsigned int user_ms = 30000;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof user_ms);
	if (sock_buf > 0) {
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sock_buf, sizeof sock_buf);
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sock_buf, sizeof sock_buf);
	}
}

static socklen_t to_sockaddr(const struct sel_shard_addr *a, uint16_t port,
			     struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof *ss);
	if (a->family == 4) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		memcpy(&s4->sin_addr, a->a, 4);
		return sizeof *s4;
	}
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	s6->sin6_family = AF_INET6;
	s6->sin6_port = htons(port);
	memcpy(&s6->sin6_addr, a->a, 16);
	return sizeof *s6;
}

static int sock_addr(int fd, bool peer, struct sel_shard_addr *out)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	int rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &sl)
		      : getsockname(fd, (struct sockaddr *)&ss, &sl);
	if (rc)
		return eos_fail(-errno, "rank link: %s of descriptor %d: %s",
				peer ? "getpeername" : "getsockname", fd, strerror(errno));
	return sel_shard_addr_from((struct sockaddr *)&ss, out);
}

int sel_shard_send(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return eos_fail(-errno, "rank link: send: %s", strerror(errno));
		struct pollfd pf = {fd, POLLOUT, 0};
		int t = timeout_ms(deadline_ns, eos_now_ns());
		if (t == 0 || poll(&pf, 1, t) == 0)
			return eos_fail(-ETIMEDOUT, "rank link: the other end took no data before the "
					"deadline");
	}
	return 0;
}

static int recv_exact(int fd, uint8_t *p, size_t len, uint64_t deadline_ns)
{
	while (len) {
		ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return eos_fail(-ECONNRESET, "rank link: the other end closed the connection");
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return eos_fail(-errno, "rank link: recv: %s", strerror(errno));
		struct pollfd pf = {fd, POLLIN, 0};
		int t = timeout_ms(deadline_ns, eos_now_ns());
		if (t == 0 || poll(&pf, 1, t) == 0)
			return eos_fail(-ETIMEDOUT, "rank link: no frame from the other end before the "
					"deadline");
	}
	return 0;
}

int64_t sel_shard_recv(int fd, void *buf, size_t cap, uint64_t deadline_ns)
{
	uint8_t *b = buf;
	if (cap < SEL_SHARD_FRAME_HEADER)
		return eos_fail(-EINVAL, "rank link: a receive buffer of %zu bytes", cap);
	int rc = recv_exact(fd, b, SEL_SHARD_FRAME_HEADER, deadline_ns);
	uint16_t type;
	uint32_t plen;
	if (rc || (rc = sel_shard_frame_header(b, SEL_SHARD_FRAME_HEADER, &type, &plen)))
		return rc;
	if (plen > cap - SEL_SHARD_FRAME_HEADER)
		return eos_fail(SEL_EFORMAT, "rank link: a %s frame of %" PRIu32 " bytes, more than %zu "
				"expected here", sel_shard_type_name(type), plen,
				cap - SEL_SHARD_FRAME_HEADER);
	if ((rc = recv_exact(fd, b + SEL_SHARD_FRAME_HEADER, plen, deadline_ns)))
		return rc;
	return (int64_t)(SEL_SHARD_FRAME_HEADER + plen);
}

/* Encode m into a fresh buffer and send it. */
static int send_msg(int fd, const struct sel_shard_msg *m, uint64_t deadline_ns)
{
	int64_t n = sel_shard_encoded_size(m);
	if (n < 0)
		return (int)n;
	uint8_t *b = malloc((size_t)n);
	if (!b)
		return eos_fail(-ENOMEM, "rank link: out of memory for a %s frame",
				sel_shard_type_name(m->type));
	sel_shard_encode(m, b, (size_t)n);
	int rc = sel_shard_send(fd, b, (size_t)n, deadline_ns);
	free(b);
	return rc;
}

/* Receive and decode one frame (at most cap bytes) into m. */
static int recv_msg(int fd, uint8_t *buf, size_t cap, const struct sel_shard_limits *lim,
		    struct sel_shard_msg *m, uint64_t deadline_ns)
{
	int64_t n = sel_shard_recv(fd, buf, cap, deadline_ns);
	if (n < 0)
		return (int)n;
	return sel_shard_decode(buf, (size_t)n, lim, m);
}

/* An ERROR frame, best effort (the connection is about to close). */
static void send_error(int fd, int status, const char *text)
{
	struct sel_shard_msg m = {.type = SEL_SHARD_ERROR};
	m.u.status.status = sel_shard_status_valid(status) && status ? status : -EPROTO;
	sel_shard_text(m.u.status.text, text);
	uint8_t b[SEL_SHARD_FRAME_HEADER + 16 + SEL_SHARD_TEXT_MAX];
	int64_t n = sel_shard_encode(&m, b, sizeof b);
	if (n > 0)
		(void)send(fd, b, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
}

static void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns)
{
	struct timespec ts = {(time_t)(deadline_ns / S_NS), (long)(deadline_ns % S_NS)};
	pthread_cond_timedwait(cv, mu, &ts);
}

static void efd_raise(int fd)
{
	uint64_t one = 1;
	ssize_t n = write(fd, &one, sizeof one);
	(void)n;
}

static void efd_clear(int fd)
{
	uint64_t v;
	ssize_t n = read(fd, &v, sizeof v);
	(void)n;
}

/* ---- rank zero: objects ----------------------------------------------------- */

enum sstate {
	S_SETUP = 0, /* open: hellos, join */
	S_JOINED,
	S_AGREED,
	S_RUNNING,
	S_CLOSING,
	S_STOPPING,
	S_STOPPED,
	S_CLOSED,
};

struct frame {
	atomic_uint refs;
	uint32_t len;
	uint8_t data[];
};

struct slot {
	struct frame *f;
	bool normal; /* a caller job (counts against queue_jobs) */
};

struct link {
	struct sel_shard_set *s;
	uint32_t rank;
	int fd;
	bool hello, joined, dead, drained;
	uint8_t nonce[SEL_SHARD_NONCE_BYTES];
	struct sel_shard_addr expect; /* the rendezvous peer */
	struct sel_shard_settings set;
	/* ring, under s->mu */
	struct slot *ring;
	uint32_t cap, head, count, normal;
	uint64_t bytes;
	pthread_cond_t cv;
	bool wstop;
	pthread_t writer;
	bool writer_on;
	/* reader thread only */
	uint8_t *in;
	size_t in_len;
	/* DRAINED */
	int drain_status;
	char drain_text[SEL_SHARD_TEXT_MAX + 1];
};

struct sjob {
	struct eos_hnode hn;
	struct sjob *prev, *next; /* outstanding, submission order */
	struct sjob *dnext;       /* completion list */
	uint64_t deadline_ns;
	uint64_t pending;
	uint64_t reported;        /* ranks that answered */
	sel_record_desc rec;      /* the record (STORE, UNLINK) */
	struct sjob *held;        /* an internal cleanup: the store it finishes */
	bool internal;            /* an automatic cleanup: never reported itself */
	bool caller_cleanup;      /* sel_shard_cleanup */
	bool terminal;            /* a failure other than space seen */
	int cause;
	char cause_text[EOS_ERRMSG_MAX];
	struct sel_shard_done d;
};

struct sel_shard_set {
	struct sel_shard_config cfg;
	uint64_t peers; /* mask of ranks 1..world-1 */
	int lfd;
	uint16_t port;
	bool listen_specific;
	struct sel_shard_addr listen_at;
	struct link link[SEL_SHARD_WORLD_MAX];
	uint64_t agreed_limit;
	char refusal[EOS_ERRMSG_MAX];
	uint32_t refused;

	pthread_mutex_t mu;
	pthread_cond_t cv; /* close: completions, drains, the stop */
	enum sstate st;
	atomic_uint_fast64_t next_id;
	struct eos_hmap jobs;
	struct sjob *head, *tail;
	uint32_t outstanding;
	struct sjob *dhead, *dtail;
	int efd;  /* the worker's: completions or the stop */
	int wake; /* the reader's */
	pthread_t reader;
	bool reader_on, rstop;
	char why[EOS_ERRMSG_MAX];
	uint64_t stop_deadline;
	uint32_t stop_cleaned, stop_cleanup_failed, stop_abandoned;
	struct sel_shard_stats stats;
};

static int check_locked(sel_shard_set *s);
#ifdef SEL_DEBUG_CHECKS
/* After every mutation in debug builds (make check-asan), mu held. */
static void debug_check(sel_shard_set *s)
{
	if (check_locked(s) != 0) {
		fprintf(stderr, "sel_shard_check: %s\n", eos_errmsg());
		abort();
	}
}
#else
static inline void debug_check(sel_shard_set *s) { (void)s; }
#endif

static void frame_unref(struct frame *f)
{
	if (atomic_fetch_sub(&f->refs, 1) == 1)
		free(f);
}

static struct frame *frame_of(const struct sel_shard_msg *m, int64_t *len)
{
	int64_t n = sel_shard_encoded_size(m);
	*len = n;
	if (n < 0)
		return NULL;
	struct frame *f = malloc(sizeof *f + (size_t)n);
	if (!f) {
		*len = eos_fail(-ENOMEM, "rank link: out of memory for a %s frame of %" PRId64 " bytes",
				sel_shard_type_name(m->type), n);
		return NULL;
	}
	atomic_init(&f->refs, 0);
	f->len = (uint32_t)n;
	sel_shard_encode(m, f->data, (size_t)n);
	return f;
}

/* Link f onto l's ring (room checked by the caller), mu held. */
static void ring_push(struct link *l, struct frame *f, bool normal)
{
	uint32_t at = (l->head + l->count) % l->cap;
	l->ring[at] = (struct slot){f, normal};
	l->count++;
	l->normal += normal;
	l->bytes += f->len;
	atomic_fetch_add(&f->refs, 1);
	if (l->count > l->s->stats.queued_max)
		l->s->stats.queued_max = l->count;
	pthread_cond_signal(&l->cv);
}

static uint64_t dead_mask(const sel_shard_set *s)
{
	uint64_t m = 0;
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (s->link[r].dead)
			m |= 1ull << r;
	return m;
}

static void ranks_text(uint64_t mask, char *out, size_t len)
{
	size_t at = 0;
	out[0] = '\0';
	for (uint32_t r = 0; r < 64 && at < len; r++)
		if (mask & (1ull << r))
			at += (size_t)snprintf(out + at, len - at, "%s%u", at ? ", " : "", r);
}

static void append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...)
{
	size_t at = strnlen(buf, cap);
	if (at + 1 >= cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf + at, cap - at, fmt, ap);
	va_end(ap);
}

static void job_free(struct sjob *j) { free(j); }

static void job_link(sel_shard_set *s, struct sjob *j)
{
	eos_hmap_insert(&s->jobs, &j->hn, eos_hash64(j->d.id));
	j->prev = s->tail;
	j->next = NULL;
	if (s->tail)
		s->tail->next = j;
	else
		s->head = j;
	s->tail = j;
	bool was_empty = s->outstanding++ == 0;
	if (was_empty && s->reader_on)
		efd_raise(s->wake); /* the reader now has a deadline to watch */
}

static void job_unlink(sel_shard_set *s, struct sjob *j)
{
	eos_hmap_remove(&s->jobs, &j->hn);
	if (j->prev)
		j->prev->next = j->next;
	else
		s->head = j->next;
	if (j->next)
		j->next->prev = j->prev;
	else
		s->tail = j->prev;
	j->prev = j->next = NULL;
	s->outstanding--;
}

static struct sjob *job_find(sel_shard_set *s, uint64_t id)
{
	for (struct eos_hnode *h = eos_hmap_first(&s->jobs, eos_hash64(id)); h; h = eos_hmap_next(h)) {
		struct sjob *j = (struct sjob *)h;
		if (j->d.id == id)
			return j;
	}
	return NULL;
}

static bool stopping(const sel_shard_set *s) { return s->st == S_STOPPING || s->st == S_STOPPED; }

static void check_stopped(sel_shard_set *s, uint64_t now);
static void job_finish(sel_shard_set *s, struct sjob *j);

/* Put j on the completion list (or drop it once stopping), mu held. */
static void deliver(sel_shard_set *s, struct sjob *j)
{
	if (stopping(s) || s->st == S_CLOSED) {
		job_free(j);
		return;
	}
	if (j->d.status)
		s->stats.failed++;
	else
		s->stats.completed++;
	j->dnext = NULL;
	if (s->dtail)
		s->dtail->dnext = j;
	else
		s->dhead = j;
	s->dtail = j;
	efd_raise(s->efd);
	pthread_cond_broadcast(&s->cv);
}

/* Unlink held's record from the peers in mask (the store failed elsewhere,
 * or the set is stopping), mu held.  held is reported once that finished. */
static void issue_cleanup(sel_shard_set *s, struct sjob *held, uint64_t mask)
{
	uint64_t can = 0;
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		if (!(mask & (1ull << r)))
			continue;
		struct link *l = &s->link[r];
		if (l->dead || l->count + 1 >= l->cap) {
			held->d.cleanup_failed |= 1ull << r;
			append(held->d.text, sizeof held->d.text, "; cleanup unlink on rank %u could not "
			       "be sent (%s)", r, l->dead ? "its link is down" : "its queue is full");
			continue;
		}
		can |= 1ull << r;
	}
	struct sjob *c = can ? calloc(1, sizeof *c) : NULL;
	struct frame *f = NULL;
	if (c) {
		c->d.id = atomic_fetch_add(&s->next_id, 1);
		c->d.op = SEL_SHARD_UNLINK;
		c->d.ranks = c->pending = can;
		c->rec = held->rec;
		c->held = held;
		c->internal = true;
		struct sel_shard_rec rec = {.d = held->rec};
		struct sel_shard_msg m = {.type = SEL_SHARD_JOB};
		m.u.job = (struct sel_shard_job){.id = c->d.id, .op = SEL_SHARD_UNLINK,
						 .slot = SEL_SHARD_NO_SLOT, .n_recs = 1, .recs = &rec};
		int64_t n;
		f = frame_of(&m, &n);
	}
	if (!f) {
		free(c);
		held->d.cleanup_failed |= can;
		if (can)
			append(held->d.text, sizeof held->d.text, "; cleanup unlinks could not be made: %s",
			       eos_errmsg());
		if (stopping(s))
			s->stop_cleanup_failed += (uint32_t)popcount64(mask);
		deliver(s, held);
		return;
	}
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (can & (1ull << r))
			ring_push(&s->link[r], f, false);
	c->deadline_ns = eos_now_ns() + s->cfg.job_timeout_ns;
	job_link(s, c);
	s->stats.cleanups++;
}

/* Every addressed rank answered (or was struck off), mu held. */
static void job_finish(sel_shard_set *s, struct sjob *j)
{
	job_unlink(s, j);
	struct sel_shard_done *d = &j->d;
	if (j->internal || j->caller_cleanup) {
		uint64_t ok = j->reported & ~d->failed;
		uint64_t bad = d->ranks & ~ok;
		s->stats.cleanup_failed += (uint64_t)popcount64(bad);
		if (stopping(s)) {
			s->stop_cleaned += (uint32_t)popcount64(ok);
			s->stop_cleanup_failed += (uint32_t)popcount64(bad);
		}
		struct sjob *to = j->internal ? j->held : j;
		to->d.cleaned |= ok;
		to->d.cleanup_failed |= bad;
		if (j->caller_cleanup) {
			char failed[EOS_ERRMSG_MAX];
			snprintf(failed, sizeof failed, "%s", d->text);
			d->status = j->cause;
			d->cleanup = true;
			snprintf(d->text, sizeof d->text, "%s", j->cause_text);
			if (bad)
				append(d->text, sizeof d->text, "; cleanup unlink failed: %s",
				       failed[0] ? failed : "a rank's link went down");
			deliver(s, j);
			return;
		}
		if (bad) {
			char rt[256];
			ranks_text(bad, rt, sizeof rt);
			append(to->d.text, sizeof to->d.text, "; cleanup unlink failed on rank %s%s%s", rt,
			       d->text[0] ? ": " : "", d->text);
		}
		job_free(j);
		deliver(s, to);
		return;
	}
	if (d->op == SEL_SHARD_STORE && d->committed && (d->failed || stopping(s))) {
		issue_cleanup(s, j, d->committed);
		return;
	}
	deliver(s, j);
}

/* Strike dead ranks off every outstanding job, mu held. */
static void settle_dead(sel_shard_set *s)
{
	uint64_t dead = dead_mask(s);
	struct sjob *j = s->head;
	while (j) {
		struct sjob *next = j->next;
		if (j->pending & dead) {
			j->pending &= ~dead;
			if (!j->pending) {
				s->stop_abandoned += !j->internal;
				job_finish(s, j);
				/* job_finish may have linked a cleanup at the tail: it is
				 * reached by the walk, and has no dead rank. */
			}
		}
		j = next;
	}
}

static void stop_begin(sel_shard_set *s, const char *why)
{
	if (!stopping(s)) {
		uint32_t caller = 0;
		for (struct sjob *j = s->head; j; j = j->next)
			caller += !j->internal;
		snprintf(s->why, sizeof s->why, "%s; the rank links stopped with %" PRIu32 " job%s "
			 "outstanding: the caller must stop its worker and keep those jobs' page ids "
			 "and state slots (a peer may still be copying into them)", why, caller,
			 caller == 1 ? "" : "s");
		s->st = S_STOPPING;
		s->stop_deadline = eos_now_ns() + s->cfg.job_timeout_ns;
		/* Completions not yet polled stay; nothing is added from now on. */
		pthread_cond_broadcast(&s->cv);
		if (s->reader_on)
			efd_raise(s->wake);
	}
	settle_dead(s);
	check_stopped(s, eos_now_ns());
}

static void check_stopped(sel_shard_set *s, uint64_t now)
{
	if (s->st != S_STOPPING || (s->outstanding && now < s->stop_deadline))
		return;
	if (s->outstanding) {
		uint64_t ranks = 0;
		for (struct sjob *j = s->head; j; j = j->next)
			ranks |= j->pending;
		char rt[256];
		ranks_text(ranks, rt, sizeof rt);
		append(s->why, sizeof s->why, "; %" PRIu32 " job%s still outstanding on rank %s after "
		       "the job timeout (any partial store there is not cleaned up)", s->outstanding,
		       s->outstanding == 1 ? "" : "s", rt);
	}
	if (s->stop_cleaned || s->stop_cleanup_failed)
		append(s->why, sizeof s->why, "; cleanup after the stop: %" PRIu32 " unlink%s of "
		       "partial stores done, %" PRIu32 " failed", s->stop_cleaned,
		       s->stop_cleaned == 1 ? "" : "s", s->stop_cleanup_failed);
	s->st = S_STOPPED;
	s->stats.stopped = true;
	efd_raise(s->efd);
	pthread_cond_broadcast(&s->cv);
}

/* A link failed, mu held.  Expected after its DRAINED while closing. */
static void link_failed(sel_shard_set *s, struct link *l, const char *why)
{
	if (l->dead)
		return;
	l->dead = true;
	if (l->fd >= 0)
		shutdown(l->fd, SHUT_RDWR);
	pthread_cond_broadcast(&l->cv);
	if ((s->st == S_CLOSING && l->drained) || s->st == S_CLOSED) {
		pthread_cond_broadcast(&s->cv);
		return;
	}
	stop_begin(s, why);
}

/* One rank's DONE, mu held. */
static void job_result(sel_shard_set *s, struct link *l, const struct sel_shard_result *res)
{
	uint32_t r = l->rank;
	uint64_t bit = 1ull << r;
	struct sjob *j = job_find(s, res->id);
	if (!j || !(j->pending & bit)) {
		char why[160];
		snprintf(why, sizeof why, "rank %u reported job %" PRIu64 ", which it was not sent or "
			 "had completed already", r, res->id);
		link_failed(s, l, why);
		return;
	}
	struct sel_shard_done *d = &j->d;
	d->rank_status[r] = res->status;
	d->bytes += res->bytes;
	if ((res->flags & SEL_SHARD_R_COMMITTED) && d->op == SEL_SHARD_STORE)
		d->committed |= bit;
	if (res->flags & SEL_SHARD_R_HAD_ROW)
		d->had_row |= bit;
	if (res->flags & SEL_SHARD_R_EXISTED)
		d->existed |= bit;
	if (res->status) {
		d->failed |= bit;
		bool space = sel_shard_space_status(res->status);
		if (space)
			d->space = true;
		if ((!space && !j->terminal) || (space && !j->terminal && !d->status)) {
			j->terminal = !space;
			d->status = res->status;
			snprintf(d->text, sizeof d->text, "rank %u: %s", r,
				 res->text[0] ? res->text : sel_strerror(res->status));
		}
	}
	j->pending &= ~bit;
	j->reported |= bit;
	if (!j->pending)
		job_finish(s, j);
}

/* ---- rank zero: startup ------------------------------------------------------- */

int sel_shard_open(const struct sel_shard_config *cfg, sel_shard_set **out)
{
	*out = NULL;
	if (cfg->world < 2 || cfg->world > SEL_SHARD_WORLD_MAX)
		return eos_fail(-EINVAL, "rank links: world size %" PRIu32 " is not 2 to %u",
				cfg->world, SEL_SHARD_WORLD_MAX);
	if (cfg->page_tokens == 0 || cfg->page_tokens % SEL_BUCKET_TOKENS)
		return eos_fail(-EINVAL, "rank links: page tokens %" PRIu32 " is not a positive multiple "
				"of %d", cfg->page_tokens, SEL_BUCKET_TOKENS);
	if (cfg->set.disk != (cfg->set.disk_limit != 0))
		return eos_fail(-EINVAL, "rank links: disk limit %" PRIu64 " %s a disk store",
				cfg->set.disk_limit, cfg->set.disk ? "with" : "without");
	sel_crypto_init();
	sel_shard_set *s = calloc(1, sizeof *s);
	if (!s)
		return eos_fail(-ENOMEM, "rank links: out of memory");
	s->cfg = *cfg;
	s->cfg.listen_addr = NULL;
	if (!s->cfg.queue_jobs)
		s->cfg.queue_jobs = SEL_SHARD_QUEUE_JOBS;
	if (!s->cfg.queue_bytes)
		s->cfg.queue_bytes = SEL_SHARD_QUEUE_BYTES;
	if (!s->cfg.job_timeout_ns)
		s->cfg.job_timeout_ns = SEL_SHARD_JOB_TIMEOUT_NS;
	if (!s->cfg.handshake_ns)
		s->cfg.handshake_ns = SEL_SHARD_HANDSHAKE_NS;
	if (!s->cfg.drain_ms)
		s->cfg.drain_ms = SEL_SHARD_DRAIN_MS;
	if (!s->cfg.max_scan || s->cfg.max_scan > SEL_SHARD_MAX_SCAN)
		s->cfg.max_scan = SEL_SHARD_MAX_SCAN;
	s->lfd = s->efd = s->wake = -1;
	pthread_mutex_init(&s->mu, NULL);
	cond_init_mono(&s->cv);
	atomic_init(&s->next_id, 1);
	for (uint32_t r = 0; r < SEL_SHARD_WORLD_MAX; r++) {
		struct link *l = &s->link[r];
		l->s = s;
		l->rank = r;
		l->fd = -1;
		cond_init_mono(&l->cv);
	}
	for (uint32_t r = 1; r < cfg->world; r++)
		s->peers |= 1ull << r;
	int rc = eos_hmap_init(&s->jobs);
	if (rc) {
		rc = eos_fail(rc, "rank links: out of memory");
		goto fail;
	}
	s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	s->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->efd < 0 || s->wake < 0) {
		rc = eos_fail(-errno, "rank links: eventfd: %s", strerror(errno));
		goto fail;
	}

	/* The listener. */
	struct sockaddr_storage ss;
	socklen_t sl;
	struct sel_shard_addr any = {0};
	if (cfg->listen_addr) {
		struct sel_shard_addr a = {0};
		if (inet_pton(AF_INET, cfg->listen_addr, a.a) == 1) {
			a.family = 4;
		} else if (inet_pton(AF_INET6, cfg->listen_addr, a.a) == 1) {
			a.family = 6;
			struct sockaddr_in6 tmp = {.sin6_family = AF_INET6};
			memcpy(&tmp.sin6_addr, a.a, 16);
			sel_shard_addr_from((struct sockaddr *)&tmp, &a); /* v4-mapped becomes v4 */
		} else {
			rc = eos_fail(-EINVAL, "rank links: listen address '%s' is not a numeric IPv4 or "
				      "IPv6 address", cfg->listen_addr);
			goto fail;
		}
		s->listen_specific = true;
		s->listen_at = a;
		sl = to_sockaddr(&a, cfg->listen_port, &ss);
		s->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	} else {
		any.family = 6;
		sl = to_sockaddr(&any, cfg->listen_port, &ss);
		s->lfd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (s->lfd >= 0) {
			int zero = 0;
			(void)setsockopt(s->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
		}
	}
	int one = 1;
	if (s->lfd >= 0)
		(void)setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&ss, sl) != 0) {
		int e = errno;
		close_fd(&s->lfd);
		if (!cfg->listen_addr) { /* no IPv6 here: the IPv4 wildcard */
			any.family = 4;
			sl = to_sockaddr(&any, cfg->listen_port, &ss);
			s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			if (s->lfd >= 0)
				(void)setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
			if (s->lfd >= 0 && bind(s->lfd, (struct sockaddr *)&ss, sl) == 0)
				e = 0;
			else
				e = errno;
		}
		if (e) {
			close_fd(&s->lfd);
			rc = eos_fail(-e, "rank links: cannot bind the listener to %s port %u: %s",
				      cfg->listen_addr ? cfg->listen_addr : "the wildcard address",
				      cfg->listen_port, strerror(e));
			goto fail;
		}
	}
	if (listen(s->lfd, 64) != 0) {
		rc = eos_fail(-errno, "rank links: listen: %s", strerror(errno));
		goto fail;
	}
	sl = sizeof ss;
	if (getsockname(s->lfd, (struct sockaddr *)&ss, &sl) != 0) {
		rc = eos_fail(-errno, "rank links: getsockname: %s", strerror(errno));
		goto fail;
	}
	s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
					       : ((struct sockaddr_in6 *)&ss)->sin6_port);
	*out = s;
	return 0;
fail:
	sel_shard_destroy(s);
	return rc;
}

uint16_t sel_shard_port(const sel_shard_set *s) { return s->port; }
const char *sel_shard_refusal(const sel_shard_set *s) { return s->refusal; }
uint64_t sel_shard_disk_limit(const sel_shard_set *s) { return s->agreed_limit; }

int sel_shard_hello(sel_shard_set *s, uint32_t rank, int rendezvous_fd, void *buf, size_t cap)
{
	if (s->st != S_SETUP || rank == 0 || rank >= s->cfg.world)
		return eos_fail(-EINVAL, "rank links: a HELLO for rank %" PRIu32 " %s", rank,
				s->st != S_SETUP ? "after the join" : "out of range");
	struct link *l = &s->link[rank];
	if (l->joined)
		return eos_fail(-EINVAL, "rank links: rank %" PRIu32 " joined already", rank);
	struct sel_shard_msg m = {.type = SEL_SHARD_HELLO};
	struct sel_shard_hello *h = &m.u.hello;
	struct sel_shard_addr local;
	int rc = sock_addr(rendezvous_fd, true, &l->expect);
	if (rc || sock_addr(rendezvous_fd, false, &local))
		return eos_fail(-EINVAL, "rank links: rank %" PRIu32 "'s rendezvous connection: %s", rank,
				eos_errmsg());
	h->world = s->cfg.world;
	h->rank = rank;
	randombytes_buf(l->nonce, sizeof l->nonce);
	memcpy(h->nonce, l->nonce, sizeof h->nonce);
	h->addr = s->listen_specific ? s->listen_at : local;
	h->port = s->port;
	memcpy(h->identity, s->cfg.identity, SEL_IDENTITY_BYTES);
	memcpy(h->fingerprint, s->cfg.fingerprint[0], SEL_FINGERPRINT_BYTES);
	h->set = s->cfg.set;
	int64_t n = sel_shard_encode(&m, buf, cap);
	sodium_memzero(h->nonce, sizeof h->nonce);
	if (n < 0)
		return (int)n;
	l->hello = true;
	return (int)n;
}

struct pend {
	int fd;
	struct sel_shard_addr from;
	uint64_t until;
	size_t n;
	uint8_t buf[JOIN_FRAME_MAX];
};

/* A refused connection: counted, told why, closed. */
static void refuse(sel_shard_set *s, struct pend *p, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void refuse(sel_shard_set *s, struct pend *p, int status, const char *fmt, ...)
{
	char why[EOS_ERRMSG_MAX], from[64];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	snprintf(s->refusal, sizeof s->refusal, "a join from %s refused: %.400s",
		 sel_shard_addr_text(&p->from, from), why);
	s->refused++;
	send_error(p->fd, status, why);
	close_fd(&p->fd);
}

/* Tell every joined peer the join failed and close them; rc with msg. */
static int join_failed(sel_shard_set *s, int rc, const char *msg)
{
	char text[EOS_ERRMSG_MAX];
	snprintf(text, sizeof text, "%s", msg);
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct link *l = &s->link[r];
		if (l->fd >= 0) {
			send_error(l->fd, rc, text);
			close_fd(&l->fd);
		}
		l->joined = false;
	}
	return eos_fail(rc, "%s", text);
}

/* Judge a whole JOIN: 1 joined, 0 refused (go on), < 0 the join fails. */
static int judge(sel_shard_set *s, struct pend *p, const struct sel_shard_join *j)
{
	char a[33], b[33], from[64], want[64];
	uint32_t r = j->rank;
	if (r >= s->cfg.world) {
		refuse(s, p, -EACCES, "rank %" PRIu32 " is not a peer of this world of %" PRIu32, r,
		       s->cfg.world);
		return 0;
	}
	struct link *l = &s->link[r];
	if (l->joined) {
		refuse(s, p, -EACCES, "rank %" PRIu32 " joined already (a duplicate join)", r);
		return 0;
	}
	if (sodium_memcmp(j->nonce, l->nonce, SEL_SHARD_NONCE_BYTES) != 0) {
		refuse(s, p, -EACCES, "rank %" PRIu32 "'s join presents another nonce than the one "
		       "rank 0 sent over its rendezvous connection", r);
		return 0;
	}
	if (!sel_shard_addr_eq(&p->from, &l->expect)) {
		refuse(s, p, -EACCES, "rank %" PRIu32 "'s join comes from %s, but its rendezvous peer "
		       "is %s", r, sel_shard_addr_text(&p->from, from), sel_shard_addr_text(&l->expect, want));
		return 0;
	}
	/* Authenticated: a disagreement now is the deployment's, not a forgery. */
	int rc = 0;
	char msg[EOS_ERRMSG_MAX];
	if (j->world != s->cfg.world) {
		rc = -EINVAL;
		snprintf(msg, sizeof msg, "rank %" PRIu32 " runs a world of %" PRIu32 " ranks, rank 0 "
			 "one of %" PRIu32, r, j->world, s->cfg.world);
	} else if (sodium_memcmp(j->identity, s->cfg.identity, SEL_IDENTITY_BYTES) != 0) {
		rc = SEL_EIDENTITY;
		snprintf(msg, sizeof msg, "rank %" PRIu32 " has offload identity %.16s..., rank 0 %.16s...: "
			 "the ranks run another core or continuation-state mode", r,
			 hex16(j->identity, a), hex16(s->cfg.identity, b));
	} else if (memcmp(j->fingerprint, s->cfg.fingerprint[r], SEL_FINGERPRINT_BYTES) != 0) {
		rc = SEL_ELAYOUT;
		snprintf(msg, sizeof msg, "rank %" PRIu32 "'s layout fingerprint is %s, rank 0 expects %s "
			 "for that rank: the ranks disagree on the core's geometry", r,
			 hex16(j->fingerprint, a), hex16(s->cfg.fingerprint[r], b));
	} else if (j->set.disk != s->cfg.set.disk) {
		rc = -EINVAL;
		snprintf(msg, sizeof msg, "every rank must have a disk store or none: rank 0 has %s, "
			 "rank %" PRIu32 " %s", s->cfg.set.disk ? "one" : "none", r,
			 j->set.disk ? "has one" : "has none");
	}
	if (rc) {
		send_error(p->fd, rc, msg);
		close_fd(&p->fd);
		return join_failed(s, rc, msg);
	}
	l->fd = p->fd;
	p->fd = -1;
	l->joined = true;
	l->set = j->set;
	sodium_memzero(l->nonce, sizeof l->nonce); /* used once */
	link_sockopts(l->fd, s->cfg.sock_buf);
	return 1;
}

/* Bytes that followed a joined peer's JOIN: its refusal of rank 0 (the
 * peer found rank 0's HELLO disagreeing), read whole within a second. */
static int early_frame(sel_shard_set *s, uint32_t r, const uint8_t *got, size_t n)
{
	uint8_t b[SEL_SHARD_FRAME_HEADER + 16 + SEL_SHARD_TEXT_MAX];
	char msg[EOS_ERRMSG_MAX];
	uint64_t until = eos_now_ns() + S_NS;
	int fd = s->link[r].fd;
	size_t have = n < sizeof b ? n : sizeof b;
	memcpy(b, got, have);
	uint16_t type = 0;
	uint32_t plen = 0;
	int rc = 0;
	if (have < SEL_SHARD_FRAME_HEADER)
		rc = recv_exact(fd, b + have, SEL_SHARD_FRAME_HEADER - have, until);
	if (!rc)
		rc = sel_shard_frame_header(b, SEL_SHARD_FRAME_HEADER, &type, &plen);
	if (!rc && (type != SEL_SHARD_ERROR || SEL_SHARD_FRAME_HEADER + plen > sizeof b ||
		    SEL_SHARD_FRAME_HEADER + plen < have))
		rc = eos_fail(-EPROTO, "a %s frame before ACCEPT", sel_shard_type_name(type));
	if (!rc && have < SEL_SHARD_FRAME_HEADER + plen)
		rc = recv_exact(fd, b + have, SEL_SHARD_FRAME_HEADER + plen - have, until);
	struct sel_shard_msg m;
	if (!rc && (rc = sel_shard_decode(b, SEL_SHARD_FRAME_HEADER + plen, NULL, &m)) == 0) {
		rc = m.u.status.status;
		snprintf(msg, sizeof msg, "rank %" PRIu32 " refused the join: %s", r, m.u.status.text);
		sel_shard_msg_free(&m);
		return join_failed(s, rc, msg);
	}
	snprintf(msg, sizeof msg, "rank %" PRIu32 "'s link failed during the join: %s", r,
		 eos_errmsg());
	return join_failed(s, rc, msg);
}

int sel_shard_join(sel_shard_set *s, uint64_t deadline_ns)
{
	if (s->st != S_SETUP)
		return eos_fail(-EINVAL, "rank links: join called twice");
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (!s->link[r].hello)
			return eos_fail(-EINVAL, "rank links: no HELLO was made for rank %" PRIu32, r);
	enum { MAXP = 2 * SEL_SHARD_WORLD_MAX + 8 };
	struct pend *pend = calloc(MAXP, sizeof *pend);
	if (!pend)
		return eos_fail(-ENOMEM, "rank links: out of memory");
	for (int i = 0; i < MAXP; i++)
		pend[i].fd = -1;
	uint32_t joined = 0;
	int rc = 0;
	while (joined < s->cfg.world - 1) {
		uint64_t now = eos_now_ns();
		if (now >= deadline_ns) {
			uint64_t missing = 0;
			for (uint32_t r = 1; r < s->cfg.world; r++)
				if (!s->link[r].joined)
					missing |= 1ull << r;
			char rt[256], msg[EOS_ERRMSG_MAX];
			ranks_text(missing, rt, sizeof rt);
			snprintf(msg, sizeof msg, "rank %.200s did not join before the deadline%s%.250s", rt,
				 s->refusal[0] ? "; last refusal: " : "", s->refusal);
			rc = join_failed(s, -ETIMEDOUT, msg);
			goto out;
		}
		struct pollfd pf[1 + MAXP + SEL_SHARD_WORLD_MAX];
		int who[1 + MAXP + SEL_SHARD_WORLD_MAX]; /* >= 0 pend index, < 0 -rank */
		int np = 0;
		uint64_t wake = deadline_ns;
		pf[np] = (struct pollfd){s->lfd, POLLIN, 0};
		who[np++] = INT_MIN;
		for (int i = 0; i < MAXP; i++)
			if (pend[i].fd >= 0) {
				pf[np] = (struct pollfd){pend[i].fd, POLLIN, 0};
				who[np++] = i;
				if (pend[i].until < wake)
					wake = pend[i].until;
			}
		for (uint32_t r = 1; r < s->cfg.world; r++)
			if (s->link[r].joined) {
				pf[np] = (struct pollfd){s->link[r].fd, POLLIN, 0};
				who[np++] = -(int)r;
			}
		int n = poll(pf, (nfds_t)np, timeout_ms(wake, now));
		if (n < 0 && errno != EINTR) {
			rc = join_failed(s, -errno, "rank links: poll failed during the join");
			goto out;
		}
		now = eos_now_ns();
		for (int k = 0; k < np; k++) {
			if (who[k] == INT_MIN) {
				if (!(pf[k].revents & POLLIN))
					continue;
				for (;;) {
					struct sockaddr_storage ss;
					socklen_t sl = sizeof ss;
					int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
					if (fd < 0)
						break;
					int i = 0;
					while (i < MAXP && pend[i].fd >= 0)
						i++;
					struct pend tmp = {.fd = fd};
					if (sel_shard_addr_from((struct sockaddr *)&ss, &tmp.from) != 0 ||
					    i == MAXP) {
						refuse(s, &tmp, -EBUSY, "too many connections waiting to join");
						continue;
					}
					pend[i] = tmp;
					pend[i].until = now + s->cfg.handshake_ns;
				}
			} else if (who[k] >= 0) {
				struct pend *p = &pend[who[k]];
				if (pf[k].revents & (POLLIN | POLLHUP | POLLERR)) {
					ssize_t got = recv(p->fd, p->buf + p->n, sizeof p->buf - p->n,
							   MSG_DONTWAIT);
					if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
						refuse(s, p, -EPROTO, "the connection closed before a whole JOIN");
						continue;
					}
					if (got > 0)
						p->n += (size_t)got;
				}
				if (p->n >= SEL_SHARD_FRAME_HEADER) {
					uint16_t type;
					uint32_t plen;
					if (sel_shard_frame_header(p->buf, p->n, &type, &plen) != 0 ||
					    type != SEL_SHARD_JOIN ||
					    plen > sizeof p->buf - SEL_SHARD_FRAME_HEADER) {
						refuse(s, p, -EPROTO, "the first frame is not a JOIN");
						continue;
					}
					size_t flen = SEL_SHARD_FRAME_HEADER + plen;
					if (p->n >= flen) {
						struct sel_shard_msg m;
						if (sel_shard_decode(p->buf, flen, NULL, &m) != 0) {
							refuse(s, p, -EPROTO, "a JOIN that does not decode: %s",
							       eos_errmsg());
							continue;
						}
						uint32_t r = m.u.join.rank;
						int v = judge(s, p, &m.u.join);
						sel_shard_msg_free(&m);
						if (v == 1 && p->n > flen)
							v = early_frame(s, r, p->buf + flen, p->n - flen);
						if (v < 0) {
							rc = v;
							goto out;
						}
						joined += (uint32_t)v;
						continue;
					}
				}
				if (p->fd >= 0 && now >= p->until)
					refuse(s, p, -ETIMEDOUT, "no whole JOIN within the handshake time");
			} else if (pf[k].revents) {
				/* A joined peer says something before ACCEPT: its refusal. */
				uint32_t r = (uint32_t)-who[k];
				uint8_t b[SEL_SHARD_FRAME_HEADER + 16 + SEL_SHARD_TEXT_MAX];
				struct sel_shard_msg m;
				char msg[EOS_ERRMSG_MAX];
				int e = recv_msg(s->link[r].fd, b, sizeof b, NULL, &m, now + S_NS);
				if (e == 0 && m.type == SEL_SHARD_ERROR) {
					e = m.u.status.status;
					snprintf(msg, sizeof msg, "rank %" PRIu32 " refused the join: %s", r,
						 m.u.status.text);
				} else {
					snprintf(msg, sizeof msg, "rank %" PRIu32 "'s link failed during the "
						 "join: %s", r, e ? eos_errmsg() : "an unexpected frame");
					e = e ? e : -EPROTO;
				}
				if (e == 0)
					e = -EPROTO;
				sel_shard_msg_free(&m);
				rc = join_failed(s, e, msg);
				goto out;
			}
		}
	}
	/* Every peer joined: the smallest limit holds (design 2.14). */
	s->agreed_limit = s->cfg.set.disk_limit;
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (s->link[r].set.disk_limit < s->agreed_limit)
			s->agreed_limit = s->link[r].set.disk_limit;
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct sel_shard_msg m = {.type = SEL_SHARD_ACCEPT};
		m.u.accept = (struct sel_shard_accept){s->cfg.world, s->agreed_limit};
		if ((rc = send_msg(s->link[r].fd, &m, deadline_ns)) != 0) {
			char msg[EOS_ERRMSG_MAX];
			snprintf(msg, sizeof msg, "rank links: sending ACCEPT to rank %" PRIu32 ": %s", r,
				 eos_errmsg());
			rc = join_failed(s, rc, msg);
			goto out;
		}
	}
	s->st = S_JOINED;
out:
	for (int i = 0; i < MAXP; i++)
		close_fd(&pend[i].fd);
	free(pend);
	return rc;
}

/* Read rank r's summary into *ents (grown), *n entries. */
static int read_summary(sel_shard_set *s, uint32_t r, uint8_t *buf, size_t cap,
			struct sel_shard_entry **ents, size_t *n, uint64_t deadline_ns)
{
	size_t have = 0, room = 0;
	struct sel_shard_entry *e = NULL;
	int fd = s->link[r].fd;
	for (;;) {
		struct sel_shard_msg m;
		int rc = recv_msg(fd, buf, cap, NULL, &m, deadline_ns);
		if (rc) {
			free(e);
			return eos_fail(rc, "rank %" PRIu32 "'s scan summary: %s", r, eos_errmsg());
		}
		if (m.type == SEL_SHARD_SCAN_END) {
			uint32_t total = m.u.total.total;
			sel_shard_msg_free(&m);
			if (total != have) {
				free(e);
				return eos_fail(SEL_EFORMAT, "rank %" PRIu32 "'s scan summary ends at %" PRIu32
						" entries after %zu", r, total, have);
			}
			*ents = e;
			*n = have;
			return 0;
		}
		if (m.type != SEL_SHARD_SCAN) {
			int st = m.type == SEL_SHARD_ERROR ? m.u.status.status : SEL_EFORMAT;
			char t[SEL_SHARD_TEXT_MAX + 1];
			snprintf(t, sizeof t, "%s", m.type == SEL_SHARD_ERROR ? m.u.status.text : "");
			uint16_t type = m.type;
			sel_shard_msg_free(&m);
			free(e);
			if (type == SEL_SHARD_ERROR)
				return eos_fail(st, "rank %" PRIu32 " failed before its scan summary: %s", r, t);
			return eos_fail(SEL_EFORMAT, "rank %" PRIu32 " sent a %s frame instead of its scan "
					"summary", r, sel_shard_type_name(type));
		}
		if (m.u.scan.first != have || have + m.u.scan.n > s->cfg.max_scan) {
			uint32_t first = m.u.scan.first;
			sel_shard_msg_free(&m);
			free(e);
			return eos_fail(SEL_EFORMAT, "rank %" PRIu32 "'s scan summary: entries from %" PRIu32
					" after %zu, limit %" PRIu32, r, first, have, s->cfg.max_scan);
		}
		if (have + m.u.scan.n > room) {
			size_t want = room ? room * 2 : 1024;
			while (want < have + m.u.scan.n)
				want *= 2;
			struct sel_shard_entry *ne = realloc(e, want * sizeof *e);
			if (!ne) {
				sel_shard_msg_free(&m);
				free(e);
				return eos_fail(-ENOMEM, "rank %" PRIu32 "'s scan summary: out of memory", r);
			}
			e = ne;
			room = want;
		}
		if (m.u.scan.n) /* e is still NULL before the first entries */
			memcpy(e + have, m.u.scan.e, m.u.scan.n * sizeof *e);
		have += m.u.scan.n;
		sel_shard_msg_free(&m);
	}
}

int sel_shard_agreement(sel_shard_set *s, const struct sel_shard_entry *own, size_t n_own,
			uint8_t *own_act, struct sel_shard_agree_stats *st, uint64_t deadline_ns)
{
	if (s->st != S_JOINED)
		return eos_fail(-EINVAL, "rank links: the agreement needs a completed join");
	uint32_t w = s->cfg.world;
	const struct sel_shard_entry *ents[SEL_SHARD_WORLD_MAX] = {own};
	struct sel_shard_entry *mine[SEL_SHARD_WORLD_MAX] = {0};
	size_t n[SEL_SHARD_WORLD_MAX] = {n_own};
	uint8_t *act[SEL_SHARD_WORLD_MAX] = {own_act};
	size_t cap = SEL_SHARD_FRAME_HEADER + SEL_SHARD_FRAME_MAX;
	uint8_t *buf = malloc(cap);
	int rc = 0;
	char msg[EOS_ERRMSG_MAX];
	if (!buf) {
		rc = eos_fail(-ENOMEM, "rank links: out of memory");
		goto fail;
	}
	for (uint32_t r = 1; r < w; r++) {
		if ((rc = read_summary(s, r, buf, cap, &mine[r], &n[r], deadline_ns)))
			goto fail;
		ents[r] = mine[r];
		act[r] = malloc(n[r] ? n[r] : 1);
		if (!act[r]) {
			rc = eos_fail(-ENOMEM, "rank links: out of memory");
			goto fail;
		}
	}
	if ((rc = sel_shard_agree(w, s->cfg.page_tokens, ents, n, act, st)))
		goto fail;
	for (uint32_t r = 1; r < w; r++) {
		struct sel_shard_msg m = {.type = SEL_SHARD_DECIDE};
		for (size_t at = 0; at < n[r] && !rc; at += SEL_SHARD_DECIDE_CHUNK) {
			size_t k = n[r] - at < SEL_SHARD_DECIDE_CHUNK ? n[r] - at : SEL_SHARD_DECIDE_CHUNK;
			m.u.decide = (struct sel_shard_decide){(uint32_t)at, (uint32_t)k, act[r] + at};
			rc = send_msg(s->link[r].fd, &m, deadline_ns);
		}
		struct sel_shard_msg end = {.type = SEL_SHARD_DECIDE_END};
		end.u.total.total = (uint32_t)n[r];
		if (rc || (rc = send_msg(s->link[r].fd, &end, deadline_ns))) {
			rc = eos_fail(rc, "sending rank %" PRIu32 " its actions: %s", r, eos_errmsg());
			goto fail;
		}
	}
	for (uint32_t r = 1; r < w; r++) {
		struct sel_shard_msg m;
		if ((rc = recv_msg(s->link[r].fd, buf, cap, NULL, &m, deadline_ns))) {
			rc = eos_fail(rc, "waiting for rank %" PRIu32 " to apply the agreement: %s", r,
				      eos_errmsg());
			goto fail;
		}
		bool ok = m.type == SEL_SHARD_APPLIED && m.u.status.status == 0;
		if (!ok) {
			rc = m.type == SEL_SHARD_APPLIED || m.type == SEL_SHARD_ERROR ? m.u.status.status
										       : SEL_EFORMAT;
			if (m.type == SEL_SHARD_APPLIED || m.type == SEL_SHARD_ERROR)
				eos_fail(rc, "rank %" PRIu32 " could not apply the agreement: %s", r,
					 m.u.status.text);
			else
				eos_fail(rc, "rank %" PRIu32 " sent a %s frame instead of APPLIED", r,
					 sel_shard_type_name(m.type));
			sel_shard_msg_free(&m);
			goto fail;
		}
		sel_shard_msg_free(&m);
	}
	s->st = S_AGREED;
	goto out;
fail:
	snprintf(msg, sizeof msg, "the scan agreement failed: %s", eos_errmsg());
	rc = join_failed(s, rc ? rc : -EPROTO, msg);
out:
	for (uint32_t r = 1; r < w; r++) {
		free(mine[r]);
		free(act[r]);
	}
	free(buf);
	return rc;
}

/* ---- rank zero: serving ---------------------------------------------------------- */

static void *writer_main(void *arg)
{
	struct link *l = arg;
	sel_shard_set *s = l->s;
	char name[16];
	snprintf(name, sizeof name, "shard-w%u", l->rank);
	eos_thread_name(name);
	(void)eos_thread_lower_priority(10);
	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!l->count && !l->wstop)
			pthread_cond_wait(&l->cv, &s->mu);
		if (l->wstop)
			break;
		struct slot head = l->ring[l->head];
		int fd = l->fd;
		pthread_mutex_unlock(&s->mu);
		int err = 0;
		const uint8_t *p = head.f->data;
		size_t left = head.f->len;
		while (left) {
			ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				err = n < 0 ? errno : EPIPE;
				break;
			}
			p += n;
			left -= (size_t)n;
		}
		pthread_mutex_lock(&s->mu);
		l->ring[l->head].f = NULL;
		l->head = (l->head + 1) % l->cap;
		l->count--;
		l->normal -= head.normal;
		l->bytes -= head.f->len;
		if (!err) {
			s->stats.frames_sent++;
			s->stats.bytes_sent += head.f->len;
		}
		frame_unref(head.f);
		debug_check(s);
		if (err) {
			char why[EOS_ERRMSG_MAX];
			snprintf(why, sizeof why, "rank %u's link failed while sending: %s", l->rank,
				 strerror(err));
			link_failed(s, l, why);
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* Frames from link l's buffer, mu held. */
static void read_frames(sel_shard_set *s, struct link *l)
{
	size_t at = 0;
	while (!l->dead && l->in_len - at >= SEL_SHARD_FRAME_HEADER) {
		uint16_t type;
		uint32_t plen;
		char why[EOS_ERRMSG_MAX];
		if (sel_shard_frame_header(l->in + at, l->in_len - at, &type, &plen) != 0) {
			snprintf(why, sizeof why, "rank %u sent a frame rank 0 cannot read: %s", l->rank,
				 eos_errmsg());
			link_failed(s, l, why);
			return;
		}
		if (plen > DONE_FRAME_MAX - SEL_SHARD_FRAME_HEADER) {
			snprintf(why, sizeof why, "rank %u sent a %s frame of %" PRIu32 " bytes while "
				 "serving, more than a completion takes", l->rank,
				 sel_shard_type_name(type), plen);
			link_failed(s, l, why);
			return;
		}
		if (l->in_len - at < SEL_SHARD_FRAME_HEADER + plen)
			break;
		struct sel_shard_msg m;
		int rc = sel_shard_decode(l->in + at, SEL_SHARD_FRAME_HEADER + plen, NULL, &m);
		at += SEL_SHARD_FRAME_HEADER + plen;
		s->stats.frames_received++;
		if (rc) {
			snprintf(why, sizeof why, "rank %u sent a frame that does not decode: %s", l->rank,
				 eos_errmsg());
			link_failed(s, l, why);
			return;
		}
		switch (m.type) {
		case SEL_SHARD_DONE:
			job_result(s, l, &m.u.done);
			break;
		case SEL_SHARD_DRAINED:
			if (s->st != S_CLOSING || l->drained) {
				link_failed(s, l, "a DRAINED rank 0 did not ask for");
				break;
			}
			l->drained = true;
			l->drain_status = m.u.status.status;
			snprintf(l->drain_text, sizeof l->drain_text, "%s", m.u.status.text);
			pthread_cond_broadcast(&s->cv);
			break;
		case SEL_SHARD_ERROR:
			snprintf(why, sizeof why, "rank %u reported a failure: %s (%s)", l->rank,
				 m.u.status.text, sel_strerror(m.u.status.status));
			link_failed(s, l, why);
			break;
		default:
			snprintf(why, sizeof why, "rank %u sent a %s frame while serving", l->rank,
				 sel_shard_type_name(m.type));
			link_failed(s, l, why);
		}
		sel_shard_msg_free(&m);
	}
	memmove(l->in, l->in + at, l->in_len - at);
	l->in_len -= at;
}

static void *reader_main(void *arg)
{
	sel_shard_set *s = arg;
	eos_thread_name("shard-read");
	(void)eos_thread_lower_priority(10);
	struct pollfd pf[SEL_SHARD_WORLD_MAX + 1];
	struct link *who[SEL_SHARD_WORLD_MAX + 1];
	pthread_mutex_lock(&s->mu);
	while (!s->rstop) {
		uint64_t now = eos_now_ns();
		int timeout = -1;
		if ((s->st == S_RUNNING || s->st == S_CLOSING) && s->head)
			timeout = timeout_ms(s->head->deadline_ns, now);
		else if (s->st == S_STOPPING)
			timeout = timeout_ms(s->stop_deadline, now);
		int np = 0;
		pf[np] = (struct pollfd){s->wake, POLLIN, 0};
		who[np++] = NULL;
		for (uint32_t r = 1; r < s->cfg.world; r++) {
			struct link *l = &s->link[r];
			if (l->fd >= 0 && !l->dead) {
				pf[np] = (struct pollfd){l->fd, POLLIN, 0};
				who[np++] = l;
			}
		}
		pthread_mutex_unlock(&s->mu);
		int n = poll(pf, (nfds_t)np, timeout);
		if (n > 0 && (pf[0].revents & POLLIN))
			efd_clear(s->wake);
		/* Read without the lock; decode and apply with it. */
		ssize_t got[SEL_SHARD_WORLD_MAX + 1] = {0};
		int err[SEL_SHARD_WORLD_MAX + 1] = {0};
		for (int k = 1; n > 0 && k < np; k++) {
			if (!pf[k].revents)
				continue;
			struct link *l = who[k];
			size_t room = (size_t)DONE_FRAME_MAX * 16 - l->in_len;
			got[k] = recv(l->fd, l->in + l->in_len, room, MSG_DONTWAIT);
			err[k] = got[k] < 0 ? errno : 0;
		}
		pthread_mutex_lock(&s->mu);
		for (int k = 1; n > 0 && k < np; k++) {
			struct link *l = who[k];
			if (!pf[k].revents || l->dead)
				continue;
			if (got[k] > 0) {
				l->in_len += (size_t)got[k];
				read_frames(s, l);
			} else if (got[k] == 0 || (err[k] != EAGAIN && err[k] != EINTR)) {
				char why[EOS_ERRMSG_MAX];
				snprintf(why, sizeof why, "rank %u's link %s", l->rank,
					 got[k] == 0 ? "was closed by the peer" : strerror(err[k]));
				link_failed(s, l, why);
			}
		}
		now = eos_now_ns();
		if ((s->st == S_RUNNING || s->st == S_CLOSING) && s->head && now >= s->head->deadline_ns) {
			struct sjob *j = s->head;
			char rt[256], why[EOS_ERRMSG_MAX];
			ranks_text(j->pending, rt, sizeof rt);
			snprintf(why, sizeof why, "job %" PRIu64 " (%s of the record of %" PRIu64 " tokens) "
				 "was not completed by rank %s within the job timeout of %" PRIu64 " ms",
				 j->d.id, sel_shard_op_name(j->d.op), j->rec.key.consumed, rt,
				 (uint64_t)(s->cfg.job_timeout_ns / MS_NS));
			uint64_t late = j->pending;
			for (uint32_t r = 1; r < s->cfg.world; r++)
				if (late & (1ull << r)) {
					struct link *l = &s->link[r];
					l->dead = true;
					if (l->fd >= 0)
						shutdown(l->fd, SHUT_RDWR);
					pthread_cond_broadcast(&l->cv);
				}
			stop_begin(s, why);
		}
		check_stopped(s, now);
		debug_check(s);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

int sel_shard_start(sel_shard_set *s)
{
	if (s->st != S_AGREED)
		return eos_fail(-EINVAL, "rank links: start needs a completed agreement");
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct link *l = &s->link[r];
		l->cap = 2 * s->cfg.queue_jobs + 1; /* jobs, cleanups beyond the bound, DRAIN */
		l->ring = calloc(l->cap, sizeof *l->ring);
		l->in = malloc((size_t)DONE_FRAME_MAX * 16);
		if (!l->ring || !l->in)
			return eos_fail(-ENOMEM, "rank links: out of memory");
	}
	s->st = S_RUNNING;
	int rc = pthread_create(&s->reader, NULL, reader_main, s);
	if (rc) {
		s->st = S_STOPPED;
		return eos_fail(-rc, "rank links: cannot start the reader thread: %s", strerror(rc));
	}
	s->reader_on = true;
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct link *l = &s->link[r];
		if ((rc = pthread_create(&l->writer, NULL, writer_main, l)) != 0) {
			pthread_mutex_lock(&s->mu);
			stop_begin(s, "rank links: cannot start a writer thread");
			pthread_mutex_unlock(&s->mu);
			return eos_fail(-rc, "rank links: cannot start rank %u's writer thread: %s", r,
					strerror(rc));
		}
		l->writer_on = true;
	}
	return 0;
}

static int refused_state(sel_shard_set *s)
{
	if (stopping(s))
		return eos_fail(SEL_ESTOPPED, "%s", s->why);
	return eos_fail(SEL_ESTOPPED, "rank links: %s", s->st == S_CLOSING || s->st == S_CLOSED
							? "closing" : "not started");
}

static int submit(sel_shard_set *s, const struct sel_shard_job *job, uint64_t ranks, uint64_t cookie,
		  uint64_t *id, bool cleanup, int cause, const char *cause_text)
{
	if (!ranks)
		ranks = s->peers;
	if (ranks & ~s->peers)
		return eos_fail(-EINVAL, "rank links: ranks 0x%" PRIx64 " are not this world's peers",
				ranks);
	struct sjob *j = calloc(1, sizeof *j);
	if (!j)
		return eos_fail(-ENOMEM, "rank links: out of memory for a job");
	j->d.id = atomic_fetch_add(&s->next_id, 1);
	j->d.cookie = cookie;
	j->d.op = job->op;
	j->d.ranks = j->pending = ranks;
	if (job->n_recs && job->recs)
		j->rec = job->recs[job->n_recs - 1].d;
	j->caller_cleanup = cleanup;
	j->cause = cause;
	if (cause_text)
		snprintf(j->cause_text, sizeof j->cause_text, "%s", cause_text);
	struct sel_shard_msg m = {.type = SEL_SHARD_JOB};
	m.u.job = *job;
	m.u.job.id = j->d.id;
	int64_t n;
	struct frame *f = frame_of(&m, &n);
	if (!f) {
		free(j);
		return (int)n;
	}
	pthread_mutex_lock(&s->mu);
	int rc = 0;
	if (s->st != S_RUNNING) {
		rc = refused_state(s);
		goto refused;
	}
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		if (!(ranks & (1ull << r)))
			continue;
		struct link *l = &s->link[r];
		bool full = cleanup ? l->count + 1 >= l->cap
				    : l->normal >= s->cfg.queue_jobs || l->bytes + f->len > s->cfg.queue_bytes;
		if (full) {
			s->stats.refused_full++;
			rc = eos_fail(-EAGAIN, "rank links: rank %u's queue is full (%u frames, %" PRIu64
				      " bytes): the peer is not taking jobs fast enough", r, l->count,
				      l->bytes);
			goto refused;
		}
	}
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (ranks & (1ull << r))
			ring_push(&s->link[r], f, !cleanup);
	j->deadline_ns = eos_now_ns() + s->cfg.job_timeout_ns;
	job_link(s, j);
	if (cleanup)
		s->stats.cleanups++;
	else
		s->stats.submitted++;
	debug_check(s);
	pthread_mutex_unlock(&s->mu);
	if (id)
		*id = j->d.id;
	return 0;
refused:
	pthread_mutex_unlock(&s->mu);
	free(f);
	free(j);
	return rc;
}

int sel_shard_submit(sel_shard_set *s, const struct sel_shard_job *job, uint64_t ranks,
		     uint64_t cookie, uint64_t *id)
{
	return submit(s, job, ranks, cookie, id, false, 0, NULL);
}

int sel_shard_cleanup(sel_shard_set *s, const sel_record_desc *rec, uint64_t ranks, int cause,
		      const char *cause_text, uint64_t cookie, uint64_t *id)
{
	struct sel_shard_rec x = {.d = *rec};
	struct sel_shard_job job = {.id = 1, .op = SEL_SHARD_UNLINK, .slot = SEL_SHARD_NO_SLOT,
				    .n_recs = 1, .recs = &x};
	return submit(s, &job, ranks, cookie, id, true, cause, cause_text);
}

int sel_shard_poll(sel_shard_set *s, struct sel_shard_done *out, size_t cap)
{
	pthread_mutex_lock(&s->mu);
	size_t n = 0;
	while (n < cap && s->dhead) {
		struct sjob *j = s->dhead;
		s->dhead = j->dnext;
		if (!s->dhead)
			s->dtail = NULL;
		out[n++] = j->d;
		job_free(j);
	}
	int rc = (int)n;
	if (!s->dhead) {
		if (s->st == S_STOPPED) {
			/* The eventfd stays readable: the worker keeps seeing the stop. */
			if (n == 0)
				rc = eos_fail(SEL_ESTOPPED, "%s", s->why);
		} else {
			efd_clear(s->efd);
		}
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int sel_shard_wait_fd(const sel_shard_set *s) { return s->efd; }

bool sel_shard_stopped(sel_shard_set *s, char *why, size_t len)
{
	pthread_mutex_lock(&s->mu);
	bool st = stopping(s);
	if (why && len)
		snprintf(why, len, "%s", st ? s->why : "");
	pthread_mutex_unlock(&s->mu);
	return st;
}

static void stop_threads(sel_shard_set *s)
{
	pthread_mutex_lock(&s->mu);
	s->rstop = true;
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct link *l = &s->link[r];
		l->wstop = true;
		if (l->fd >= 0)
			shutdown(l->fd, SHUT_RDWR);
		pthread_cond_broadcast(&l->cv);
	}
	pthread_mutex_unlock(&s->mu);
	if (s->wake >= 0)
		efd_raise(s->wake);
	if (s->reader_on)
		pthread_join(s->reader, NULL);
	s->reader_on = false;
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (s->link[r].writer_on) {
			pthread_join(s->link[r].writer, NULL);
			s->link[r].writer_on = false;
		}
}

int sel_shard_close(sel_shard_set *s, uint64_t deadline_ns)
{
	pthread_mutex_lock(&s->mu);
	int rc = 0;
	if (s->st == S_RUNNING)
		s->st = S_CLOSING;
	while (s->st == S_CLOSING && s->outstanding && eos_now_ns() < deadline_ns)
		cond_wait_until(&s->cv, &s->mu, deadline_ns);
	/* A stop in progress: let its cleanup of the survivors finish. */
	while (s->st == S_STOPPING && eos_now_ns() < deadline_ns)
		cond_wait_until(&s->cv, &s->mu, deadline_ns);
	if (s->st == S_CLOSING && s->outstanding) {
		char why[160];
		snprintf(why, sizeof why, "close: %" PRIu32 " job%s still outstanding at the deadline",
			 s->outstanding, s->outstanding == 1 ? "" : "s");
		stop_begin(s, why);
	}
	if (s->st == S_CLOSING) {
		struct sel_shard_msg m = {.type = SEL_SHARD_DRAIN};
		uint64_t now = eos_now_ns();
		uint64_t left = deadline_ns > now ? (deadline_ns - now) / MS_NS : 0;
		m.u.drain.ms = left < s->cfg.drain_ms ? (uint32_t)left : s->cfg.drain_ms;
		int64_t n;
		struct frame *f = frame_of(&m, &n);
		if (!f) {
			rc = (int)n;
		} else {
			atomic_fetch_add(&f->refs, 1); /* ours until every push is done */
			for (uint32_t r = 1; r < s->cfg.world; r++)
				if (!s->link[r].dead)
					ring_push(&s->link[r], f, false);
			frame_unref(f);
		}
		for (;;) {
			bool all = true;
			for (uint32_t r = 1; r < s->cfg.world; r++)
				all = all && s->link[r].drained;
			if (all || s->st != S_CLOSING || eos_now_ns() >= deadline_ns || rc)
				break;
			cond_wait_until(&s->cv, &s->mu, deadline_ns);
		}
		for (uint32_t r = 1; r < s->cfg.world && !rc; r++) {
			struct link *l = &s->link[r];
			if (!l->drained)
				rc = eos_fail(SEL_ESTOPPED, "rank links: rank %u did not confirm its drain "
					      "before the deadline", r);
			else if (l->drain_status)
				rc = eos_fail(SEL_ESTOPPED, "rank links: rank %u could not drain: %s (%s)", r,
					      l->drain_text, sel_strerror(l->drain_status));
		}
		if (s->st == S_CLOSING)
			s->st = S_CLOSED;
	}
	if (stopping(s) && !rc)
		rc = eos_fail(SEL_ESTOPPED, "%s", s->why);
	else if (s->st == S_SETUP || s->st == S_JOINED || s->st == S_AGREED)
		s->st = S_CLOSED;
	pthread_mutex_unlock(&s->mu);
	stop_threads(s);
	return rc;
}

void sel_shard_destroy(sel_shard_set *s)
{
	if (!s)
		return;
	stop_threads(s);
	for (uint32_t r = 0; r < SEL_SHARD_WORLD_MAX; r++) {
		struct link *l = &s->link[r];
		for (uint32_t i = 0; l->ring && i < l->count; i++)
			frame_unref(l->ring[(l->head + i) % l->cap].f);
		free(l->ring);
		free(l->in);
		close_fd(&l->fd);
		pthread_cond_destroy(&l->cv);
	}
	while (s->head) {
		struct sjob *j = s->head;
		job_unlink(s, j);
		if (j->internal && j->held)
			job_free(j->held);
		job_free(j);
	}
	while (s->dhead) {
		struct sjob *j = s->dhead;
		s->dhead = j->dnext;
		job_free(j);
	}
	eos_hmap_free(&s->jobs);
	close_fd(&s->lfd);
	close_fd(&s->efd);
	close_fd(&s->wake);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

void sel_shard_stats(sel_shard_set *s, struct sel_shard_stats *out)
{
	pthread_mutex_lock(&s->mu);
	*out = s->stats;
	out->outstanding = s->outstanding;
	out->refused_joins = s->refused;
	out->stopped = stopping(s);
	pthread_mutex_unlock(&s->mu);
}

int sel_shard_check(sel_shard_set *s)
{
	pthread_mutex_lock(&s->mu);
	int rc = check_locked(s);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

static int check_locked(sel_shard_set *s)
{
	int rc = 0;
	uint32_t n = 0;
	uint64_t dead = dead_mask(s);
	for (struct sjob *j = s->head; j && !rc; j = j->next) {
		n++;
		if (job_find(s, j->d.id) != j)
			rc = eos_fail(SEL_ECORRUPT, "rank links: job %" PRIu64 " is listed, not in the table",
				      j->d.id);
		else if (j->pending & ~j->d.ranks)
			rc = eos_fail(SEL_ECORRUPT, "rank links: job %" PRIu64 " waits for ranks it never "
				      "addressed", j->d.id);
		else if (j->pending & dead)
			rc = eos_fail(SEL_ECORRUPT, "rank links: job %" PRIu64 " waits for a dead rank",
				      j->d.id);
		else if (!j->pending)
			rc = eos_fail(SEL_ECORRUPT, "rank links: job %" PRIu64 " is outstanding with no "
				      "rank pending", j->d.id);
	}
	if (!rc && (n != s->outstanding || s->jobs.n != n))
		rc = eos_fail(SEL_ECORRUPT, "rank links: %" PRIu32 " jobs listed, %" PRIu32 " counted, %zu "
			      "in the table", n, s->outstanding, s->jobs.n);
	for (uint32_t r = 1; r < s->cfg.world && !rc; r++) {
		struct link *l = &s->link[r];
		if (!l->ring)
			continue;
		uint64_t bytes = 0;
		uint32_t normal = 0;
		for (uint32_t i = 0; i < l->count; i++) {
			struct slot *x = &l->ring[(l->head + i) % l->cap];
			bytes += x->f->len;
			normal += x->normal;
			if (atomic_load(&x->f->refs) == 0)
				rc = eos_fail(SEL_ECORRUPT, "rank links: a queued frame without a reference");
		}
		if (!rc && (l->count > l->cap || normal != l->normal || bytes != l->bytes ||
			    l->normal > s->cfg.queue_jobs))
			rc = eos_fail(SEL_ECORRUPT, "rank links: rank %u's ring counts %u frames (%u jobs, %"
				      PRIu64 " bytes), holds %u jobs and %" PRIu64 " bytes", r, l->count,
				      l->normal, l->bytes, normal, bytes);
	}
	for (struct sjob *j = s->dhead; j && !rc; j = j->dnext)
		if (j->pending)
			rc = eos_fail(SEL_ECORRUPT, "rank links: completed job %" PRIu64 " has ranks "
				      "pending", j->d.id);
	return rc;
}

/* ---- a peer ---------------------------------------------------------------------- */

struct pjob {
	struct eos_hnode hn;
	uint64_t id;
};

struct sel_shard_peer {
	struct sel_shard_peer_config cfg;
	int fd;
	uint64_t limit;
	pthread_mutex_t mu; /* jobs, out */
	struct eos_hmap jobs;
	uint8_t *out;
	size_t out_len, out_cap;
	int efd;
	uint8_t *in;
	size_t in_len, in_cap;
};

static void peer_free_jobs(sel_shard_peer *p)
{
	for (size_t b = 0; p->jobs.b && b <= p->jobs.mask; b++)
		while (p->jobs.b[b]) {
			struct eos_hnode *h = p->jobs.b[b];
			eos_hmap_remove(&p->jobs, h);
			free(h);
		}
}

void sel_shard_peer_destroy(sel_shard_peer *p)
{
	if (!p)
		return;
	close_fd(&p->fd);
	close_fd(&p->efd);
	peer_free_jobs(p);
	eos_hmap_free(&p->jobs);
	free(p->out);
	free(p->in);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

uint64_t sel_shard_peer_disk_limit(const sel_shard_peer *p) { return p->limit; }

/* Connect to a:port by deadline, from the local address of the rendezvous
 * connection when given. */
static int peer_connect(const struct sel_shard_addr *a, uint16_t port, int rendezvous_fd,
			uint64_t deadline_ns)
{
	struct sockaddr_storage ss;
	socklen_t sl = to_sockaddr(a, port, &ss);
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	char at[64];
	sel_shard_addr_text(a, at);
	if (fd < 0)
		return eos_fail(-errno, "rank link: socket: %s", strerror(errno));
	struct sel_shard_addr local = {0}; /* .family 0 should a failure return 0 */
	if (rendezvous_fd >= 0 && sock_addr(rendezvous_fd, false, &local) == 0 &&
	    local.family == a->family) {
		struct sockaddr_storage ls;
		socklen_t ll = to_sockaddr(&local, 0, &ls);
		if (bind(fd, (struct sockaddr *)&ls, ll) != 0) {
			int e = errno;
			close(fd);
			return eos_fail(-e, "rank link: binding to the rendezvous connection's local "
					"address: %s", strerror(e));
		}
	}
	if (connect(fd, (struct sockaddr *)&ss, sl) != 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		return eos_fail(-e, "rank link: connecting to rank 0 at %s port %u: %s", at, port,
				strerror(e));
	}
	struct pollfd pf = {fd, POLLOUT, 0};
	int t = timeout_ms(deadline_ns, eos_now_ns());
	int n = t ? poll(&pf, 1, t) : 0;
	int err = 0;
	socklen_t el = sizeof err;
	if (n <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
		close(fd);
		return eos_fail(n <= 0 ? -ETIMEDOUT : -(err ? err : errno), "rank link: connecting to "
				"rank 0 at %s port %u: %s", at, port,
				n <= 0 ? "no answer before the deadline" : strerror(err ? err : errno));
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	return fd;
}

int sel_shard_peer_join(const struct sel_shard_peer_config *cfg, const void *hello, size_t len,
			uint64_t deadline_ns, sel_shard_peer **out)
{
	*out = NULL;
	if (cfg->world < 2 || cfg->world > SEL_SHARD_WORLD_MAX || cfg->rank == 0 ||
	    cfg->rank >= cfg->world)
		return eos_fail(-EINVAL, "rank link: rank %" PRIu32 " of a world of %" PRIu32, cfg->rank,
				cfg->world);
	if (cfg->set.disk != (cfg->set.disk_limit != 0))
		return eos_fail(-EINVAL, "rank link: disk limit %" PRIu64 " %s a disk store",
				cfg->set.disk_limit, cfg->set.disk ? "with" : "without");
	struct sel_shard_msg hm;
	int rc = sel_shard_decode(hello, len, NULL, &hm);
	if (rc)
		return eos_fail(rc, "rank %" PRIu32 ": the HELLO from rank 0 does not decode: %s",
				cfg->rank, eos_errmsg());
	if (hm.type != SEL_SHARD_HELLO) {
		uint16_t t = hm.type;
		sel_shard_msg_free(&hm);
		return eos_fail(SEL_EFORMAT, "rank %" PRIu32 ": rank 0 sent a %s frame, not a HELLO",
				cfg->rank, sel_shard_type_name(t));
	}
	const struct sel_shard_hello *h = &hm.u.hello;
	/* What this rank finds wrong with rank 0: told after the JOIN. */
	int bad = 0;
	char why[EOS_ERRMSG_MAX], a[33], b[33];
	static const uint8_t zero[SEL_FINGERPRINT_BYTES];
	if (h->world != cfg->world) {
		bad = -EINVAL;
		snprintf(why, sizeof why, "rank 0 runs a world of %" PRIu32 " ranks, rank %" PRIu32
			 " one of %" PRIu32, h->world, cfg->rank, cfg->world);
	} else if (h->rank != cfg->rank) {
		bad = -EINVAL;
		snprintf(why, sizeof why, "rank 0 expects rank %" PRIu32 " on this rendezvous connection, "
			 "this process is rank %" PRIu32, h->rank, cfg->rank);
	} else if (sodium_memcmp(h->identity, cfg->identity, SEL_IDENTITY_BYTES) != 0) {
		bad = SEL_EIDENTITY;
		snprintf(why, sizeof why, "rank 0 has offload identity %.16s..., rank %" PRIu32 " %.16s...: "
			 "the ranks run another core or continuation-state mode", hex16(h->identity, a),
			 cfg->rank, hex16(cfg->identity, b));
	} else if (memcmp(cfg->primary_fingerprint, zero, sizeof zero) &&
		   memcmp(cfg->primary_fingerprint, h->fingerprint, SEL_FINGERPRINT_BYTES)) {
		bad = SEL_ELAYOUT;
		snprintf(why, sizeof why, "rank 0's layout fingerprint is %s, rank %" PRIu32 " expects %s: "
			 "the ranks disagree on the core's geometry", hex16(h->fingerprint, a), cfg->rank,
			 hex16(cfg->primary_fingerprint, b));
	} else if (h->set.disk != cfg->set.disk) {
		bad = -EINVAL;
		snprintf(why, sizeof why, "every rank must have a disk store or none: rank 0 has %s, "
			 "rank %" PRIu32 " %s", h->set.disk ? "one" : "none", cfg->rank,
			 cfg->set.disk ? "has one" : "has none");
	}
	sel_shard_peer *p = calloc(1, sizeof *p);
	if (!p) {
		sel_shard_msg_free(&hm);
		return eos_fail(-ENOMEM, "rank link: out of memory");
	}
	p->cfg = *cfg;
	p->fd = p->efd = -1;
	pthread_mutex_init(&p->mu, NULL);
	if (!p->cfg.out_bytes)
		p->cfg.out_bytes = PEER_OUT_BYTES;
	if ((rc = eos_hmap_init(&p->jobs)) != 0) {
		rc = eos_fail(rc, "rank link: out of memory");
		goto fail;
	}
	p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (p->efd < 0) {
		rc = eos_fail(-errno, "rank link: eventfd: %s", strerror(errno));
		goto fail;
	}
	rc = peer_connect(&h->addr, h->port, cfg->rendezvous_fd, deadline_ns);
	if (rc < 0)
		goto fail;
	p->fd = rc;
	link_sockopts(p->fd, cfg->sock_buf);
	struct sel_shard_msg jm = {.type = SEL_SHARD_JOIN};
	struct sel_shard_join *j = &jm.u.join;
	j->world = cfg->world;
	j->rank = cfg->rank;
	memcpy(j->nonce, h->nonce, SEL_SHARD_NONCE_BYTES);
	memcpy(j->identity, cfg->identity, SEL_IDENTITY_BYTES);
	memcpy(j->fingerprint, cfg->fingerprint, SEL_FINGERPRINT_BYTES);
	j->set = cfg->set;
	rc = send_msg(p->fd, &jm, deadline_ns);
	sodium_memzero(j->nonce, sizeof j->nonce);
	if (rc) {
		rc = eos_fail(rc, "rank %" PRIu32 ": sending JOIN to rank 0: %s", cfg->rank, eos_errmsg());
		goto fail;
	}
	if (bad) {
		send_error(p->fd, bad, why);
		rc = eos_fail(bad, "rank %" PRIu32 ": %s", cfg->rank, why);
		goto fail;
	}
	uint8_t buf[SEL_SHARD_FRAME_HEADER + 16 + SEL_SHARD_TEXT_MAX];
	struct sel_shard_msg am;
	if ((rc = recv_msg(p->fd, buf, sizeof buf, NULL, &am, deadline_ns)) != 0) {
		rc = eos_fail(rc, "rank %" PRIu32 ": waiting for rank 0 to accept the join: %s",
			      cfg->rank, eos_errmsg());
		goto fail;
	}
	if (am.type == SEL_SHARD_ERROR) {
		rc = eos_fail(am.u.status.status, "rank %" PRIu32 ": rank 0 refused the join: %s",
			      cfg->rank, am.u.status.text);
		sel_shard_msg_free(&am);
		goto fail;
	}
	if (am.type != SEL_SHARD_ACCEPT || am.u.accept.world != cfg->world) {
		rc = eos_fail(SEL_EFORMAT, "rank %" PRIu32 ": rank 0 answered the join with a %s frame",
			      cfg->rank, sel_shard_type_name(am.type));
		sel_shard_msg_free(&am);
		goto fail;
	}
	p->limit = am.u.accept.disk_limit;
	sel_shard_msg_free(&am);
	sel_shard_msg_free(&hm);
	*out = p;
	return 0;
fail:
	sel_shard_msg_free(&hm);
	sel_shard_peer_destroy(p);
	return rc;
}

int sel_shard_peer_agreement(sel_shard_peer *p, const struct sel_shard_entry *e, size_t n,
			     uint8_t *act, uint64_t deadline_ns)
{
	if (n > SEL_SHARD_MAX_SCAN)
		return eos_fail(-E2BIG, "rank %" PRIu32 ": %zu records, more than a summary holds (%u)",
				p->cfg.rank, n, SEL_SHARD_MAX_SCAN);
	int rc = 0;
	struct sel_shard_msg m = {.type = SEL_SHARD_SCAN};
	for (size_t at = 0; at < n && !rc; at += SEL_SHARD_SCAN_CHUNK) {
		size_t k = n - at < SEL_SHARD_SCAN_CHUNK ? n - at : SEL_SHARD_SCAN_CHUNK;
		m.u.scan = (struct sel_shard_scan){(uint32_t)at, (uint32_t)k,
						   (struct sel_shard_entry *)(e + at)};
		rc = send_msg(p->fd, &m, deadline_ns);
	}
	struct sel_shard_msg end = {.type = SEL_SHARD_SCAN_END};
	end.u.total.total = (uint32_t)n;
	if (rc || (rc = send_msg(p->fd, &end, deadline_ns)))
		return eos_fail(rc, "rank %" PRIu32 ": sending the scan summary: %s", p->cfg.rank,
				eos_errmsg());
	size_t cap = SEL_SHARD_FRAME_HEADER + SEL_SHARD_FRAME_MAX;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return eos_fail(-ENOMEM, "rank link: out of memory");
	size_t have = 0;
	for (;;) {
		struct sel_shard_msg d;
		if ((rc = recv_msg(p->fd, buf, cap, NULL, &d, deadline_ns))) {
			rc = eos_fail(rc, "rank %" PRIu32 ": waiting for the agreement: %s", p->cfg.rank,
				      eos_errmsg());
			break;
		}
		if (d.type == SEL_SHARD_DECIDE && d.u.decide.first == have && have + d.u.decide.n <= n) {
			memcpy(act + have, d.u.decide.act, d.u.decide.n);
			have += d.u.decide.n;
			sel_shard_msg_free(&d);
			continue;
		}
		if (d.type == SEL_SHARD_DECIDE_END && d.u.total.total == n && have == n) {
			sel_shard_msg_free(&d);
			break;
		}
		if (d.type == SEL_SHARD_ERROR)
			rc = eos_fail(d.u.status.status, "rank %" PRIu32 ": rank 0 ended the agreement: %s",
				      p->cfg.rank, d.u.status.text);
		else
			rc = eos_fail(SEL_EFORMAT, "rank %" PRIu32 ": a %s frame that does not match the "
				      "summary of %zu records (%zu decided)", p->cfg.rank,
				      sel_shard_type_name(d.type), n, have);
		sel_shard_msg_free(&d);
		break;
	}
	free(buf);
	return rc;
}

int sel_shard_peer_applied(sel_shard_peer *p, int status, uint32_t deleted, uint32_t truncated,
			   const char *text, uint64_t deadline_ns)
{
	struct sel_shard_msg m = {.type = SEL_SHARD_APPLIED};
	m.u.status.status = sel_shard_status_valid(status) ? status : -EIO;
	m.u.status.deleted = deleted;
	m.u.status.truncated = truncated;
	sel_shard_text(m.u.status.text, text ? text : "");
	int rc = send_msg(p->fd, &m, deadline_ns);
	return rc ? eos_fail(rc, "rank %" PRIu32 ": sending APPLIED: %s", p->cfg.rank, eos_errmsg()) : 0;
}

static struct pjob *peer_find(sel_shard_peer *p, uint64_t id)
{
	for (struct eos_hnode *h = eos_hmap_first(&p->jobs, eos_hash64(id)); h; h = eos_hmap_next(h))
		if (((struct pjob *)h)->id == id)
			return (struct pjob *)h;
	return NULL;
}

int sel_shard_peer_complete(sel_shard_peer *p, const struct sel_shard_result *r)
{
	struct sel_shard_msg m = {.type = SEL_SHARD_DONE};
	m.u.done = *r;
	sel_shard_text(m.u.done.text, r->text);
	if (!sel_shard_status_valid(r->status) || (r->flags & ~SEL_SHARD_R_KNOWN) || !r->id)
		return eos_fail(SEL_EFORMAT, "rank %" PRIu32 ": job %" PRIu64 " completed with status %"
				PRId32 " and flags 0x%" PRIx32 ", which a frame cannot carry",
				p->cfg.rank, r->id, r->status, r->flags);
	int64_t n = sel_shard_encoded_size(&m);
	if (n < 0)
		return (int)n;
	pthread_mutex_lock(&p->mu);
	struct pjob *j = peer_find(p, r->id);
	int rc = 0;
	if (!j) {
		rc = eos_fail(-ENOENT, "rank %" PRIu32 ": job %" PRIu64 " is not an accepted job (or "
			      "completed already)", p->cfg.rank, r->id);
	} else if (eos_grow((void **)&p->out, &p->out_cap, p->out_len + (size_t)n, 1) != 0) {
		rc = eos_fail(-ENOMEM, "rank %" PRIu32 ": out of memory for a completion", p->cfg.rank);
	} else {
		sel_shard_encode(&m, p->out + p->out_len, (size_t)n);
		p->out_len += (size_t)n;
		eos_hmap_remove(&p->jobs, &j->hn);
		free(j);
	}
	pthread_mutex_unlock(&p->mu);
	if (!rc)
		efd_raise(p->efd);
	return rc;
}

/* Send what completions are buffered, without waiting (wait: up to the
 * deadline for all of it).  0 or the socket error. */
static int peer_flush(sel_shard_peer *p, bool wait, uint64_t deadline_ns)
{
	for (;;) {
		pthread_mutex_lock(&p->mu);
		if (!p->out_len) {
			pthread_mutex_unlock(&p->mu);
			return 0;
		}
		/* Take the buffer: completions arriving meanwhile start a new one. */
		uint8_t *b = p->out;
		size_t len = p->out_len;
		p->out = NULL;
		p->out_len = p->out_cap = 0;
		pthread_mutex_unlock(&p->mu);
		size_t sent = 0;
		int rc = 0;
		while (sent < len) {
			ssize_t n = send(p->fd, b + sent, len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (n > 0) {
				sent += (size_t)n;
				continue;
			}
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
				if (!wait)
					break;
				struct pollfd pf = {p->fd, POLLOUT, 0};
				int t = timeout_ms(deadline_ns, eos_now_ns());
				if (t == 0 || poll(&pf, 1, t) == 0) {
					rc = eos_fail(-ETIMEDOUT, "rank link: rank 0 took no completions "
						      "before the deadline");
					break;
				}
				continue;
			}
			rc = eos_fail(n < 0 ? -errno : -EPIPE, "rank link: sending completions: %s",
				      n < 0 ? strerror(errno) : "nothing sent");
			break;
		}
		/* Put the rest back in front of anything new. */
		pthread_mutex_lock(&p->mu);
		size_t rest = len - sent;
		if (rest) {
			if (eos_grow((void **)&b, &len, rest + p->out_len, 1) != 0) {
				pthread_mutex_unlock(&p->mu);
				free(b);
				return eos_fail(-ENOMEM, "rank link: out of memory for completions");
			}
			memmove(b, b + sent, rest);
			memcpy(b + rest, p->out, p->out_len);
			free(p->out);
			p->out = b;
			p->out_cap = len;
			p->out_len += rest;
			b = NULL;
		}
		pthread_mutex_unlock(&p->mu);
		free(b);
		if (rc || (rest && !wait))
			return rc;
	}
}

/* The ops drain after the link ended for reason rc: SEL_ESTOPPED when they
 * could not, else rc, with a message. */
static int peer_end(sel_shard_peer *p, const struct sel_shard_ops *ops, int rc, const char *why)
{
	char msg[EOS_ERRMSG_MAX];
	snprintf(msg, sizeof msg, "%s", why);
	int d = ops->drain ? ops->drain(ops->ctx, p, eos_now_ns() + PEER_LINK_DRAIN_NS) : 0;
	if (d)
		return eos_fail(SEL_ESTOPPED, "rank %" PRIu32 ": %s; the transport could not drain: %s "
				"(keep its resources)", p->cfg.rank, msg, eos_errmsg());
	return eos_fail(rc, "rank %" PRIu32 ": %s", p->cfg.rank, msg);
}

/* The DRAIN exchange. */
static int peer_drain(sel_shard_peer *p, const struct sel_shard_ops *ops, uint32_t ms)
{
	uint64_t deadline = eos_now_ns() + (uint64_t)ms * MS_NS;
	int d = ops->drain ? ops->drain(ops->ctx, p, deadline) : 0;
	char text[EOS_ERRMSG_MAX];
	snprintf(text, sizeof text, "%s", d ? eos_errmsg() : "");
	int rc = peer_flush(p, true, deadline);
	struct sel_shard_msg m = {.type = SEL_SHARD_DRAINED};
	m.u.status.status = d && sel_shard_status_valid(d) ? d : (d ? -EIO : 0);
	sel_shard_text(m.u.status.text, text);
	if (!rc)
		rc = send_msg(p->fd, &m, deadline);
	if (!rc) {
		/* Rank 0 closes once every rank drained. */
		uint8_t b[64];
		for (;;) {
			struct pollfd pf = {p->fd, POLLIN, 0};
			int t = timeout_ms(deadline, eos_now_ns());
			if (t == 0 || poll(&pf, 1, t) <= 0)
				break; /* it did not: nothing is lost, the drain is done */
			ssize_t n = recv(p->fd, b, sizeof b, MSG_DONTWAIT);
			if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR)))
				break;
		}
	}
	if (d)
		return eos_fail(SEL_ESTOPPED, "rank %" PRIu32 ": the transport could not drain: %s (keep "
				"its resources)", p->cfg.rank, text);
	return rc;
}

int sel_shard_peer_serve(sel_shard_peer *p, const struct sel_shard_ops *ops)
{
	size_t cap = SEL_SHARD_FRAME_HEADER + SEL_SHARD_FRAME_MAX;
	if (!p->in && !(p->in = malloc(cap)))
		return peer_end(p, ops, -ENOMEM, "out of memory for the link's buffer");
	p->in_cap = cap;
	for (;;) {
		pthread_mutex_lock(&p->mu);
		size_t pending = p->out_len;
		pthread_mutex_unlock(&p->mu);
		struct pollfd pf[3];
		int np = 0, wfd = ops->wait_fd ? ops->wait_fd(ops->ctx) : -1;
		pf[np++] = (struct pollfd){p->fd, (short)((pending < p->cfg.out_bytes ? POLLIN : 0) |
							  (pending ? POLLOUT : 0)), 0};
		pf[np++] = (struct pollfd){p->efd, POLLIN, 0};
		if (wfd >= 0)
			pf[np++] = (struct pollfd){wfd, POLLIN, 0};
		if (poll(pf, (nfds_t)np, -1) < 0 && errno != EINTR)
			return peer_end(p, ops, -errno, "poll failed");
		if (pf[1].revents & POLLIN)
			efd_clear(p->efd);
		if (np > 2 && (pf[2].revents & POLLIN) && ops->service)
			ops->service(ops->ctx, p);
		int rc = peer_flush(p, false, 0);
		if (rc)
			return peer_end(p, ops, rc, eos_errmsg());
		if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		ssize_t got = recv(p->fd, p->in + p->in_len, p->in_cap - p->in_len, MSG_DONTWAIT);
		if (got == 0)
			return peer_end(p, ops, -ECONNRESET, "rank 0 closed the link without draining");
		if (got < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			char why[128];
			snprintf(why, sizeof why, "the link to rank 0 failed: %s", strerror(errno));
			return peer_end(p, ops, -errno, why);
		}
		p->in_len += (size_t)got;
		size_t at = 0;
		while (p->in_len - at >= SEL_SHARD_FRAME_HEADER) {
			uint16_t type;
			uint32_t plen;
			char why[EOS_ERRMSG_MAX];
			if (sel_shard_frame_header(p->in + at, p->in_len - at, &type, &plen) != 0) {
				snprintf(why, sizeof why, "rank 0 sent a frame this rank refuses: %s",
					 eos_errmsg());
				send_error(p->fd, SEL_EFORMAT, why);
				return peer_end(p, ops, SEL_EFORMAT, why);
			}
			if (p->in_len - at < SEL_SHARD_FRAME_HEADER + plen)
				break;
			struct sel_shard_msg m;
			rc = sel_shard_decode(p->in + at, SEL_SHARD_FRAME_HEADER + plen, &p->cfg.lim, &m);
			at += SEL_SHARD_FRAME_HEADER + plen;
			if (rc) {
				snprintf(why, sizeof why, "rank 0 sent a frame this rank refuses: %s",
					 eos_errmsg());
				send_error(p->fd, SEL_EFORMAT, why);
				return peer_end(p, ops, SEL_EFORMAT, why);
			}
			if (m.type == SEL_SHARD_DRAIN) {
				uint32_t ms = m.u.drain.ms;
				sel_shard_msg_free(&m);
				return peer_drain(p, ops, ms);
			}
			if (m.type != SEL_SHARD_JOB) {
				int st = m.type == SEL_SHARD_ERROR ? m.u.status.status : SEL_EFORMAT;
				if (m.type == SEL_SHARD_ERROR)
					snprintf(why, sizeof why, "rank 0 ended the link: %s", m.u.status.text);
				else
					snprintf(why, sizeof why, "rank 0 sent a %s frame while serving",
						 sel_shard_type_name(m.type));
				sel_shard_msg_free(&m);
				if (st == SEL_EFORMAT)
					send_error(p->fd, st, why);
				return peer_end(p, ops, st, why);
			}
			uint64_t id = m.u.job.id;
			pthread_mutex_lock(&p->mu);
			struct pjob *dup = peer_find(p, id);
			struct pjob *j = dup ? NULL : calloc(1, sizeof *j);
			if (j) {
				j->id = id;
				eos_hmap_insert(&p->jobs, &j->hn, eos_hash64(id));
			}
			pthread_mutex_unlock(&p->mu);
			if (!j) {
				sel_shard_msg_free(&m);
				snprintf(why, sizeof why, dup ? "rank 0 sent job %" PRIu64 " twice"
							      : "out of memory for job %" PRIu64, id);
				send_error(p->fd, dup ? SEL_EFORMAT : -ENOMEM, why);
				return peer_end(p, ops, dup ? SEL_EFORMAT : -ENOMEM, why);
			}
			int jrc = ops->submit(ops->ctx, p, &m.u.job);
			if (jrc) {
				struct sel_shard_result r = {.id = id};
				r.status = sel_shard_status_valid(jrc) ? jrc : -EIO;
				sel_shard_text(r.text, eos_errmsg());
				(void)sel_shard_peer_complete(p, &r);
			}
			sel_shard_msg_free(&m);
		}
		memmove(p->in, p->in + at, p->in_len - at);
		p->in_len -= at;
	}
}
