/*
 * shard_io.c - the rank links' socket and thread helpers: deadlines, socket
 * options, addresses, whole frames sent and received with MSG_DONTWAIT and
 * poll() for the rest of a deadline, monotonic condition variables and
 * eventfds (shard_link_int.h; design in shard_link.c).
 */
#include "shard_link_int.h"

/* ---- small helpers --------------------------------------------------------- */

int shl_timeout_ms(uint64_t deadline_ns, uint64_t now)
{
	if (deadline_ns <= now)
		return 0;
	uint64_t ms = (deadline_ns - now + MS_NS - 1) / MS_NS;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}


const char *shl_hex16(const uint8_t *b, char out[33]) { return sel_hex(b, 16, out); }

/* TCP options of every link: no Nagle (jobs and completions are small and
 * latency-bound), keepalive and a user timeout so a host that vanished
 * without a reset ends the link within about a minute, and the configured
 * buffer sizes. */
static atomic_uint user_timeout_ms = 30000;

void sel_shard_test_user_timeout(unsigned int ms)
{
	atomic_store(&user_timeout_ms, ms ? ms : 30000);
}

void sel_shard_sockopts(int fd, int sock_buf)
{
	int one = 1, idle = 10, intvl = 5, cnt = 3;
	unsigned int user_ms = atomic_load(&user_timeout_ms);
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

socklen_t shl_to_sockaddr(const struct sel_shard_addr *a, uint16_t port,
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

int shl_sock_addr(int fd, bool peer, struct sel_shard_addr *out)
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
		int t = shl_timeout_ms(deadline_ns, eos_now_ns());
		if (t == 0 || poll(&pf, 1, t) == 0)
			return eos_fail(-ETIMEDOUT,
					"rank link: the other end took no data before the "
					"deadline");
	}
	return 0;
}

int sel_shard_recv_all(int fd, uint8_t *p, size_t len, uint64_t deadline_ns)
{
	while (len) {
		ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n == 0)
			return eos_fail(-ECONNRESET,
					"rank link: the other end closed the connection");
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return eos_fail(-errno, "rank link: recv: %s", strerror(errno));
		struct pollfd pf = {fd, POLLIN, 0};
		int t = shl_timeout_ms(deadline_ns, eos_now_ns());
		if (t == 0 || poll(&pf, 1, t) == 0)
			return eos_fail(-ETIMEDOUT,
					"rank link: no frame from the other end before the "
					"deadline");
	}
	return 0;
}

int64_t sel_shard_recv(int fd, void *buf, size_t cap, uint64_t deadline_ns)
{
	uint8_t *b = buf;
	if (cap < SEL_SHARD_FRAME_HEADER)
		return eos_fail(-EINVAL, "rank link: a receive buffer of %zu bytes", cap);
	int rc = sel_shard_recv_all(fd, b, SEL_SHARD_FRAME_HEADER, deadline_ns);
	uint16_t type;
	uint32_t plen;
	if (rc || (rc = sel_shard_frame_header(b, SEL_SHARD_FRAME_HEADER, &type, &plen)))
		return rc;
	if (plen > cap - SEL_SHARD_FRAME_HEADER)
		return eos_fail(SEL_EFORMAT,
				"rank link: a %s frame of %" PRIu32 " bytes, more than %zu "
				"expected here",
				sel_shard_type_name(type), plen, cap - SEL_SHARD_FRAME_HEADER);
	if ((rc = sel_shard_recv_all(fd, b + SEL_SHARD_FRAME_HEADER, plen, deadline_ns)))
		return rc;
	return (int64_t)(SEL_SHARD_FRAME_HEADER + plen);
}

/* Encode m into a fresh buffer and send it. */
int shl_send_msg(int fd, const struct sel_shard_msg *m, uint64_t deadline_ns)
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
int shl_recv_msg(int fd, uint8_t *buf, size_t cap, const struct sel_shard_limits *lim,
		 struct sel_shard_msg *m, uint64_t deadline_ns)
{
	int64_t n = sel_shard_recv(fd, buf, cap, deadline_ns);
	if (n < 0)
		return (int)n;
	return sel_shard_decode(buf, (size_t)n, lim, m);
}

/* An ERROR frame, best effort (the connection is about to close). */
void shl_send_error(int fd, int status, const char *text)
{
	struct sel_shard_msg m = {.type = SEL_SHARD_ERROR};
	m.u.status.status = sel_shard_status_valid(status) && status ? status : -EPROTO;
	sel_shard_text(m.u.status.text, text);
	uint8_t b[SEL_SHARD_FRAME_HEADER + 16 + SEL_SHARD_TEXT_MAX];
	int64_t n = sel_shard_encode(&m, b, sizeof b);
	if (n > 0)
		(void)send(fd, b, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void shl_close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

void shl_cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
}

void shl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns)
{
	struct timespec ts = {(time_t)(deadline_ns / S_NS), (long)(deadline_ns % S_NS)};
	pthread_cond_timedwait(cv, mu, &ts);
}

void shl_efd_raise(int fd)
{
	uint64_t one = 1;
	ssize_t n = write(fd, &one, sizeof one);
	(void)n;
}

void shl_efd_clear(int fd)
{
	uint64_t v;
	ssize_t n = read(fd, &v, sizeof v);
	(void)n;
}
