/*
 * session.c - the pool manager's event loop and connections: output
 * queues, input framing, accept, closing, the tick (design 2.15;
 * pool_proto.h; docs/pool.md "Protocol").  handlers.c has the protocol's
 * handlers, one per client frame.
 *
 * DESIGN
 *
 * One thread, one epoll set: the listening socket, a signalfd for SIGTERM
 * and SIGINT, and every connection.  Nothing blocks: sockets are
 * non-blocking, each connection has one input buffer (at most one frame)
 * and a bounded output queue.  A connection whose output queue would pass
 * --client-queue bytes is closed at once ("stopped reading"), so a client
 * that never reads can delay nobody; one that sends a frame that does not
 * decode, or frames of the wrong kind, is told why (a fatal M_ERROR) and
 * closed; one that names a lease it does not hold is told (a non-fatal
 * M_ERROR), counted, and closed only after 64 such frames.  Connections are
 * closed at the end of an event loop turn (mgr_kill marks them), so no
 * handler ever meets a freed session.
 *
 * Admission: SO_PEERCRED (and SO_PEERGROUPS) at accept -- the manager's
 * own uid, or the --group gid as primary or supplementary group -- then the
 * manager's hello with the arena descriptor, then the client's hello
 * within hello_ms.  The socket is created 0600, or 0660 and owned by the
 * group with --group, inside a 0117 umask so it is never more open.
 *
 * Every tick (tick_ms) runs the leases' deadlines, the quarantine, recovery,
 * hello timeouts and the max-age sweep, and publishes a statistics snapshot
 * for /metrics.
 */
#include "manager/session.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define MS_NS 1000000ull
#define IN_MIN ((size_t)64 * 1024)

static char listen_marker, signal_marker;

const uint8_t *mgr_session_instance(const struct mgr_session *s) { return s->instance; }

/* ---- output ------------------------------------------------------------------------------ */

static void update_events(struct mgr_session *s)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (s->out_head ? EPOLLOUT : 0),
				 .data.ptr = s};
	bool want = s->out_head != NULL;
	if (want != s->want_out) {
		s->want_out = want;
		epoll_ctl(s->srv->ep, EPOLL_CTL_MOD, s->fd, &ev);
	}
}

static void flush(struct mgr_session *s)
{
	while (s->out_head && s->state != MGR_DEAD) {
		struct mgr_out *o = s->out_head;
		ssize_t w =
			send(s->fd, o->data + o->off, o->len - o->off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				mgr_kill(s, "the connection broke");
			break;
		}
		o->off += (size_t)w;
		if (o->off < o->len)
			break;
		s->out_head = o->next;
		if (!s->out_head)
			s->out_tail = NULL;
		s->out_bytes -= o->len;
		free(o);
	}
	if (s->state != MGR_DEAD)
		update_events(s);
}

void mgr_kill(struct mgr_session *s, const char *why)
{
	if (s->state == MGR_DEAD)
		return;
	s->state = MGR_DEAD;
	s->why = why;
}

static int queue_bytes(struct mgr_session *s, const uint8_t *b, size_t n)
{
	if (s->state == MGR_DEAD)
		return -EPIPE;
	if (s->out_bytes + n > s->srv->o.client_queue) {
		s->srv->st.disconnects_slow++;
		mgr_kill(s, "it stopped reading (its queue is full)");
		return -ENOBUFS;
	}
	struct mgr_out *o = malloc(sizeof *o + n);
	if (!o) {
		mgr_kill(s, "out of memory");
		return -ENOMEM;
	}
	o->next = NULL;
	o->len = n;
	o->off = 0;
	memcpy(o->data, b, n);
	if (s->out_tail)
		s->out_tail->next = o;
	else
		s->out_head = o;
	s->out_tail = o;
	s->out_bytes += n;
	return 0;
}

int mgr_send(struct mgr_session *s, const struct sel_pool_msg *m)
{
	if (s->state == MGR_DEAD)
		return -EPIPE;
	int64_t n = sel_pool_encoded_size(m);
	if (n < 0)
		return (int)n;
	uint8_t small[512], *b = n <= (int64_t)sizeof small ? small : malloc((size_t)n);
	if (!b) {
		mgr_kill(s, "out of memory");
		return -ENOMEM;
	}
	int rc = sel_pool_encode(m, b, (size_t)n) == n ? queue_bytes(s, b, (size_t)n) : -EIO;
	if (b != small)
		free(b);
	if (!rc) {
		s->srv->st.frames_out++;
		flush(s);
	}
	return rc;
}

void mgr_send_error(struct mgr_session *s, uint32_t code, uint16_t about, bool fatal,
		    const char *fmt, ...)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_ERROR};
	m.u.error.code = code;
	m.u.error.about = about;
	m.u.error.fatal = fatal;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m.u.error.text, sizeof m.u.error.text, fmt, ap);
	va_end(ap);
	for (char *p = m.u.error.text; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = ' ';
	mgr_send(s, &m);
	if (fatal)
		mgr_kill(s, m.u.error.text);
}

/* ---- input --------------------------------------------------------------------------------------- */

static void on_readable(struct mgr_session *s)
{
	struct mgr_server *srv = s->srv;
	for (int rounds = 0; rounds < 16 && s->state != MGR_DEAD; rounds++) {
		size_t want = IN_MIN;
		uint16_t type;
		uint32_t plen;
		int hr = sel_pool_frame_header(s->in, s->in_len, &type, &plen);
		if (hr && hr != -EAGAIN) {
			srv->st.disconnects_protocol++;
			srv->st.refused[SEL_POOL_MALFORMED]++;
			mgr_send_error(s, SEL_POOL_MALFORMED, 0, true, "%s", eos_errmsg());
			return;
		}
		if (!hr)
			want = SEL_POOL_FRAME_HEADER + (size_t)plen;
		if (want > s->in_cap) {
			uint8_t *b = realloc(s->in, want);
			if (!b) {
				mgr_kill(s, "out of memory");
				return;
			}
			s->in = b;
			s->in_cap = want;
		}
		ssize_t r = recv(s->fd, s->in + s->in_len, s->in_cap - s->in_len, MSG_DONTWAIT);
		if (r < 0) {
			if (errno != EAGAIN && errno != EINTR)
				mgr_kill(s, "the connection broke");
			return;
		}
		if (r == 0) {
			srv->st.disconnects_eof++;
			mgr_kill(s, "it closed the connection");
			return;
		}
		s->in_len += (size_t)r;
		/* Every whole frame in the buffer. */
		size_t at = 0;
		while (s->state != MGR_DEAD) {
			hr = sel_pool_frame_header(s->in + at, s->in_len - at, &type, &plen);
			if (hr == -EAGAIN)
				break;
			if (hr) {
				srv->st.disconnects_protocol++;
				srv->st.refused[SEL_POOL_MALFORMED]++;
				mgr_send_error(s, SEL_POOL_MALFORMED, 0, true, "%s", eos_errmsg());
				return;
			}
			size_t flen = SEL_POOL_FRAME_HEADER + (size_t)plen;
			if (s->in_len - at < flen)
				break;
			if (s->state == MGR_HELLO && type != SEL_POOL_C_HELLO) {
				srv->st.disconnects_protocol++;
				srv->st.refused[SEL_POOL_MALFORMED]++;
				mgr_send_error(s, SEL_POOL_MALFORMED, type, true,
					       "%s before the hello", sel_pool_type_name(type));
				return;
			}
			struct sel_pool_msg m;
			if (sel_pool_decode(s->in + at, flen, &m)) {
				srv->st.disconnects_protocol++;
				srv->st.refused[SEL_POOL_MALFORMED]++;
				mgr_send_error(s, SEL_POOL_MALFORMED, type, true, "%s",
					       eos_errmsg());
				return;
			}
			mgr_dispatch(s, &m);
			sel_pool_msg_free(&m);
			at += flen;
		}
		memmove(s->in, s->in + at, s->in_len - at);
		s->in_len -= at;
		if (s->in_cap > IN_MIN && s->in_len <= IN_MIN) {
			uint8_t *b = realloc(s->in, IN_MIN);
			if (b) {
				s->in = b;
				s->in_cap = IN_MIN;
			}
		}
	}
}

/* ---- accept --------------------------------------------------------------------------------------- */

static bool allowed(struct mgr_server *srv, int fd, const struct ucred *cr)
{
	if (cr->uid == srv->euid)
		return true;
	if (!srv->o.group_set)
		return false;
	if (cr->gid == srv->o.gid)
		return true;
	gid_t groups[256];
	socklen_t len = sizeof groups;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len))
		return false;
	for (socklen_t i = 0; i < len / sizeof groups[0]; i++)
		if (groups[i] == srv->o.gid)
			return true;
	return false;
}

static int send_hello(struct mgr_server *srv, struct mgr_session *s)
{
	struct sel_pool_msg m = {.type = SEL_POOL_M_HELLO};
	struct sel_pool_m_hello *h = &m.u.m_hello;
	h->version = SEL_POOL_VERSION;
	h->generation = srv->arena.generation;
	h->arena_bytes = srv->arena.bytes;
	h->data_start = srv->arena.data_start;
	h->window_limit = srv->o.window_limit;
	h->window_credits = srv->o.window_credits;
	h->max_claims = srv->o.max_claims;
	h->max_puts = srv->o.max_puts;
	h->max_exports = srv->o.max_exports;
	h->setup_limit_ms = srv->o.setup_limit_ms;
	h->progress_ms = srv->o.progress_ms;
	h->staging_bytes = 0;
	snprintf(h->name, sizeof h->name, "%s", srv->o.name);
	uint8_t buf[512];
	int64_t n = sel_pool_encode(&m, buf, sizeof buf);
	if (n < 0)
		return (int)n;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cb;
	memset(&cb, 0, sizeof cb);
	struct iovec iov = {buf, (size_t)n};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cb.b,
			    .msg_controllen = sizeof cb.b};
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &srv->arena.share_fd, sizeof(int));
	ssize_t w = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (w < 0)
		return -errno;
	srv->st.frames_out++;
	if (w < n)
		return queue_bytes(s, buf + w, (size_t)(n - w));
	return 0;
}

static void accept_all(struct mgr_server *srv)
{
	for (int i = 0; i < 64; i++) {
		int fd = accept4(srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		struct ucred cr;
		socklen_t len = sizeof cr;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len)) {
			close(fd);
			continue;
		}
		bool ok = allowed(srv, fd, &cr);
		if (!ok || srv->n_sessions >= srv->o.max_clients) {
			struct sel_pool_msg m = {.type = SEL_POOL_M_ERROR};
			m.u.error.fatal = 1;
			if (!ok) {
				srv->st.peers_refused++;
				m.u.error.code = SEL_POOL_FORGED;
				snprintf(m.u.error.text, sizeof m.u.error.text,
					 "uid %u gid %u may not use this pool (manager uid %u%s)",
					 (unsigned)cr.uid, (unsigned)cr.gid, (unsigned)srv->euid,
					 srv->o.group_set ? ", or its --group" : "");
			} else {
				srv->st.hellos_refused[SEL_POOL_TOO_MANY]++;
				m.u.error.code = SEL_POOL_TOO_MANY;
				snprintf(m.u.error.text, sizeof m.u.error.text,
					 "%u clients already attached", srv->n_sessions);
			}
			uint8_t buf[512];
			int64_t n = sel_pool_encode(&m, buf, sizeof buf);
			if (n > 0)
				(void)!send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
			close(fd);
			continue;
		}
		struct mgr_session *s = calloc(1, sizeof *s);
		if (!s || !(s->in = malloc(IN_MIN))) {
			free(s);
			close(fd);
			continue;
		}
		s->in_cap = IN_MIN;
		s->srv = srv;
		s->fd = fd;
		s->uid = cr.uid;
		s->gid = cr.gid;
		s->pid = cr.pid;
		s->pid_start = mgr_pid_start(cr.pid);
		s->hello_deadline_ns = eos_now_ns() + (uint64_t)srv->o.hello_ms * MS_NS;
		struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = s};
		if (epoll_ctl(srv->ep, EPOLL_CTL_ADD, fd, &ev)) {
			free(s->in);
			free(s);
			close(fd);
			continue;
		}
		s->next = srv->sessions;
		if (srv->sessions)
			srv->sessions->prev = s;
		srv->sessions = s;
		srv->n_sessions++;
		srv->st.sessions = srv->n_sessions;
		if (send_hello(srv, s))
			mgr_kill(s, "the hello could not be sent");
	}
}

/* ---- closing ---------------------------------------------------------------------------------------- */

static void session_free(struct mgr_server *srv, struct mgr_session *s)
{
	if (s->why && s->state == MGR_DEAD && s->id &&
	    (strstr(s->why, "stopped reading") || strstr(s->why, "frames") ||
	     strstr(s->why, "before") || strstr(s->why, "pool frame")))
		fprintf(stderr, "flare pool: closed session %" PRIu64 " (pid %d): %s\n", s->id,
			(int)s->pid, s->why);
	mgr_session_leases_end(srv, s);
	mgr_hold_reset(&srv->cat, &s->holds, ~0u);
	mgr_scope_unref(&srv->cat, s->scope);
	epoll_ctl(srv->ep, EPOLL_CTL_DEL, s->fd, NULL);
	close(s->fd);
	while (s->out_head) {
		struct mgr_out *o = s->out_head;
		s->out_head = o->next;
		free(o);
	}
	free(s->in);
	if (s->prev)
		s->prev->next = s->next;
	else
		srv->sessions = s->next;
	if (s->next)
		s->next->prev = s->prev;
	srv->n_sessions--;
	srv->st.sessions = srv->n_sessions;
	if (s->id)
		srv->sessions_dirty = true;
	free(s);
}

static void reap(struct mgr_server *srv)
{
	for (struct mgr_session *s = srv->sessions, *nx; s; s = nx) {
		nx = s->next;
		if (s->state != MGR_DEAD)
			continue;
		/* A last attempt to deliver what explains the close. */
		while (s->out_head) {
			struct mgr_out *o = s->out_head;
			ssize_t w = send(s->fd, o->data + o->off, o->len - o->off,
					 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (w <= 0 || (size_t)w < o->len - o->off)
				break;
			s->out_head = o->next;
			free(o);
		}
		s->out_tail = NULL;
		session_free(srv, s);
		nx = srv->sessions; /* freeing may have killed others: start over */
	}
}

/* ---- open, run, close ----------------------------------------------------------------------------- */

static int bind_socket(struct mgr_server *srv, char *err, size_t errlen)
{
	const char *path = srv->o.socket;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, path, strlen(path) + 1);
	struct stat st;
	if (!lstat(path, &st)) {
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "--socket '%s' exists and is not a socket", path);
			return -EEXIST;
		}
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int alive = probe >= 0 && !connect(probe, (struct sockaddr *)&sa, sizeof sa);
		if (probe >= 0)
			close(probe);
		if (alive) {
			snprintf(err, errlen, "--socket '%s': another manager is listening there",
				 path);
			return -EADDRINUSE;
		}
		unlink(path); /* a stale socket of a manager that died */
	}
	srv->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (srv->lfd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	mode_t old = umask(0177);
	int rc = bind(srv->lfd, (struct sockaddr *)&sa, sizeof sa);
	int e = errno;
	umask(old);
	if (rc) {
		snprintf(err, errlen, "--socket '%s': bind: %s", path, strerror(e));
		return -e;
	}
	srv->bound = true;
	if (srv->o.group_set) {
		if (chown(path, (uid_t)-1, srv->o.gid) || chmod(path, 0660)) {
			e = errno;
			snprintf(err, errlen, "--socket '%s': cannot give it to group %u: %s", path,
				 (unsigned)srv->o.gid, strerror(e));
			return -e;
		}
	}
	if (listen(srv->lfd, 128)) {
		snprintf(err, errlen, "--socket '%s': listen: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

int mgr_server_open(const struct mgr_options *o, struct mgr_server **out, char *err, size_t errlen)
{
	*out = NULL;
	struct mgr_server *srv = calloc(1, sizeof *srv);
	if (!srv) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	srv->o = *o;
	srv->lfd = srv->ep = srv->sfd = -1;
	srv->arena.fd = srv->arena.share_fd = -1;
	srv->euid = geteuid();
	int rc;
	if ((rc = eos_hmap_init(&srv->leases))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if ((rc = mgr_arena_open(&srv->arena, o, err, errlen)))
		goto fail;
	mgr_catalog_init(&srv->cat, &srv->arena, &srv->st, o->max_scopes, o->max_age_ns,
			 o->window_limit);
	if (srv->arena.reused && srv->arena.n_prev) {
		srv->recovering = true;
		srv->recovery_deadline_ns = eos_now_ns() + (uint64_t)o->recovery_ms * MS_NS;
	}
	if ((rc = bind_socket(srv, err, errlen)))
		goto fail;
	srv->ep = epoll_create1(EPOLL_CLOEXEC);
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	srv->sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
	if (srv->ep < 0 || srv->sfd < 0) {
		rc = -errno;
		snprintf(err, errlen, "epoll or signalfd: %s", strerror(errno));
		goto fail;
	}
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_marker};
	epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->lfd, &ev);
	ev.data.ptr = &signal_marker;
	epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->sfd, &ev);
	srv->st.arena_bytes = srv->arena.bytes;
	*out = srv;
	return 0;
fail:
	mgr_server_close(srv);
	return rc;
}

void mgr_server_describe(const struct mgr_server *srv, char *buf, size_t cap)
{
	char a[32], b[32];
	const struct mgr_options *o = &srv->o;
	size_t n = (size_t)snprintf(
		buf, cap,
		"flare pool: pool '%s', arena %s (%s%s%s, generation %016" PRIx64
		"%s), clients: uid %u",
		o->name, eos_format_size(srv->arena.bytes, a, sizeof a),
		srv->arena.file ? "file " : "memfd", srv->arena.file ? srv->arena.path : "", "",
		srv->arena.generation, srv->arena.reused ? ", reused" : "", (unsigned)srv->euid);
	if (n < cap && o->group_set)
		n += (size_t)snprintf(buf + n, cap - n, " or group %u", (unsigned)o->gid);
	if (n < cap) {
		if (o->max_age_ns)
			n += (size_t)snprintf(buf + n, cap - n,
					      ", records expire %" PRIu64 " s after their "
					      "last put or restore",
					      (uint64_t)(o->max_age_ns / 1000000000ull));
		else
			n += (size_t)snprintf(buf + n, cap - n, ", no max age");
	}
	if (n < cap)
		n += (size_t)snprintf(buf + n, cap - n,
				      ", at most %u clients, %s queued per client", o->max_clients,
				      eos_format_size(o->client_queue, b, sizeof b));
	if (n < cap && srv->recovering)
		snprintf(buf + n, cap - n,
			 "; waiting up to %u ms for %u client%s of the previous run",
			 o->recovery_ms, srv->arena.n_prev, srv->arena.n_prev == 1 ? "" : "s");
}

struct mgr_stats *mgr_server_stats(struct mgr_server *srv) { return &srv->st; }
uint64_t mgr_server_generation(const struct mgr_server *srv) { return srv->arena.generation; }
void mgr_server_set_http(struct mgr_server *srv, struct mgr_http *h) { srv->http = h; }

static void publish(struct mgr_server *srv)
{
	struct mgr_stats *st = &srv->st;
	st->scopes = srv->cat.n_scopes;
	st->records = srv->cat.records;
	st->record_bytes = srv->cat.record_bytes;
	st->holdings = srv->cat.holds;
	st->leases = srv->leases.n;
	st->quarantined = srv->n_quarantine;
	st->quarantined_bytes = mgr_quarantined_bytes(srv);
	st->arena_bytes = srv->arena.bytes;
	st->arena_used = srv->arena.used * MGR_GRANULE;
	st->recovering = srv->recovering;
	st->sessions = srv->n_sessions;
	if (srv->http)
		mgr_http_publish(srv->http, st);
}

static void tick(struct mgr_server *srv, uint64_t now)
{
	for (struct mgr_session *s = srv->sessions; s; s = s->next)
		if (s->state == MGR_HELLO && now > s->hello_deadline_ns) {
			srv->st.disconnects_timeout++;
			mgr_kill(s, "no hello in time");
		}
	mgr_leases_tick(srv, now);
	mgr_catalog_sweep(&srv->cat, now);
	if (srv->sessions_dirty)
		mgr_sessions_write(srv);
#ifdef SEL_DEBUG_CHECKS
	if (mgr_catalog_check(&srv->cat)) {
		fprintf(stderr, "flare pool: %s\n", eos_errmsg());
		abort();
	}
#endif
}

int mgr_server_run(struct mgr_server *srv)
{
	uint64_t tick_ns = (uint64_t)srv->o.tick_ms * MS_NS;
	srv->next_tick_ns = eos_now_ns();
	publish(srv);
	for (;;) {
		struct epoll_event evs[64];
		uint64_t now = eos_now_ns();
		int timeout =
			now >= srv->next_tick_ns ? 0 : (int)((srv->next_tick_ns - now) / MS_NS) + 1;
		int n = epoll_wait(srv->ep, evs, 64, timeout);
		if (n < 0 && errno != EINTR)
			return -errno;
		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			if (p == &listen_marker) {
				accept_all(srv);
			} else if (p == &signal_marker) {
				struct signalfd_siginfo si;
				if (read(srv->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
					fprintf(stderr, "flare pool: %s: stopping\n",
						si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
					return 0;
				}
			} else {
				struct mgr_session *s = p;
				if (s->state == MGR_DEAD)
					continue;
				if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
					on_readable(s);
				if (s->state != MGR_DEAD && (evs[i].events & EPOLLOUT))
					flush(s);
				if (s->state != MGR_DEAD &&
				    (evs[i].events & (EPOLLHUP | EPOLLERR)) &&
				    !(evs[i].events & EPOLLIN)) {
					srv->st.disconnects_eof++;
					mgr_kill(s, "the connection broke");
				}
			}
		}
		now = eos_now_ns();
		bool ticked = now >= srv->next_tick_ns;
		if (ticked) {
			tick(srv, now);
			srv->next_tick_ns = now + tick_ns;
		}
		reap(srv);
		/* /metrics sees every turn's effects (a copy of a few hundred
		 * bytes under the HTTP side's mutex). */
		if (n > 0 || ticked)
			publish(srv);
	}
}

void mgr_server_close(struct mgr_server *srv)
{
	if (!srv)
		return;
	for (struct mgr_session *s = srv->sessions; s; s = s->next)
		if (s->state != MGR_DEAD) {
			mgr_send_error(s, SEL_POOL_SHUTDOWN, 0, true, "the manager is stopping");
			mgr_kill(s, "the manager is stopping");
		}
	if (srv->ep >= 0)
		reap(srv);
	/* Nobody can write the arena through this manager any more. */
	while (srv->quarantine)
		mgr_lease_free(srv, srv->quarantine);
	/* The arena file keeps the session table: clients may still be
	 * draining copies, and a restarted manager must wait for them. */
	if (srv->arena.fd >= 0)
		mgr_catalog_free(&srv->cat);
	if (srv->bound)
		unlink(srv->o.socket);
	if (srv->lfd >= 0)
		close(srv->lfd);
	if (srv->ep >= 0)
		close(srv->ep);
	if (srv->sfd >= 0)
		close(srv->sfd);
	mgr_arena_close(&srv->arena);
	eos_hmap_free(&srv->leases);
	free(srv);
}
