/*
 * shard_join.c - rank zero's startup of the rank links: the listener, the
 * HELLOs, the join (nonce, address, fingerprint and settings checks) and
 * the agreement of the record directories (design 2.14; docs/multihost.md
 * "How the ranks join"; design in shard_link.c).
 */
#include "shard_link_int.h"

/* ---- rank zero: startup ------------------------------------------------------- */

/* The listener: cfg->listen_addr, else the IPv6 wildcard (dual-stack),
 * else the IPv4 wildcard; s->port is the port it got. */
static int open_listener(sel_shard_set *s, const struct sel_shard_config *cfg)
{
	int rc;
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
			rc = eos_fail(-EINVAL,
				      "rank links: listen address '%s' is not a numeric IPv4 or "
				      "IPv6 address",
				      cfg->listen_addr);
			return rc;
		}
		s->listen_specific = true;
		s->listen_at = a;
		sl = shl_to_sockaddr(&a, cfg->listen_port, &ss);
		s->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	} else {
		any.family = 6;
		sl = shl_to_sockaddr(&any, cfg->listen_port, &ss);
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
		shl_close_fd(&s->lfd);
		if (!cfg->listen_addr) { /* no IPv6 here: the IPv4 wildcard */
			any.family = 4;
			sl = shl_to_sockaddr(&any, cfg->listen_port, &ss);
			s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			if (s->lfd >= 0)
				(void)setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one,
						 sizeof one);
			if (s->lfd >= 0 && bind(s->lfd, (struct sockaddr *)&ss, sl) == 0)
				e = 0;
			else
				e = errno;
		}
		if (e) {
			shl_close_fd(&s->lfd);
			rc = eos_fail(-e, "rank links: cannot bind the listener to %s port %u: %s",
				      cfg->listen_addr ? cfg->listen_addr : "the wildcard address",
				      cfg->listen_port, strerror(e));
			return rc;
		}
	}
	if (listen(s->lfd, 64) != 0) {
		rc = eos_fail(-errno, "rank links: listen: %s", strerror(errno));
		return rc;
	}
	sl = sizeof ss;
	if (getsockname(s->lfd, (struct sockaddr *)&ss, &sl) != 0) {
		rc = eos_fail(-errno, "rank links: getsockname: %s", strerror(errno));
		return rc;
	}
	s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
						: ((struct sockaddr_in6 *)&ss)->sin6_port);
	return 0;
}

int sel_shard_open(const struct sel_shard_config *cfg, sel_shard_set **out)
{
	*out = NULL;
	if (cfg->world < 2 || cfg->world > SEL_SHARD_WORLD_MAX)
		return eos_fail(-EINVAL, "rank links: world size %" PRIu32 " is not 2 to %u",
				cfg->world, SEL_SHARD_WORLD_MAX);
	if (cfg->page_tokens == 0 || cfg->page_tokens % SEL_BUCKET_TOKENS)
		return eos_fail(-EINVAL,
				"rank links: page tokens %" PRIu32 " is not a positive multiple "
				"of %d",
				cfg->page_tokens, SEL_BUCKET_TOKENS);
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
	shl_cond_init_mono(&s->cv);
	atomic_init(&s->next_id, 1);
	for (uint32_t r = 0; r < SEL_SHARD_WORLD_MAX; r++) {
		struct link *l = &s->link[r];
		l->s = s;
		l->rank = r;
		l->fd = -1;
		shl_cond_init_mono(&l->cv);
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

	if ((rc = open_listener(s, cfg)))
		goto fail;
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
	int rc = shl_sock_addr(rendezvous_fd, true, &l->expect);
	if (rc || shl_sock_addr(rendezvous_fd, false, &local))
		return eos_fail(-EINVAL, "rank links: rank %" PRIu32 "'s rendezvous connection: %s",
				rank, eos_errmsg());
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
	shl_send_error(p->fd, status, why);
	shl_close_fd(&p->fd);
}

/* Tell every joined peer the join failed and close them; rc with msg. */
static int join_failed(sel_shard_set *s, int rc, const char *msg)
{
	char text[EOS_ERRMSG_MAX];
	snprintf(text, sizeof text, "%s", msg);
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct link *l = &s->link[r];
		if (l->fd >= 0) {
			shl_send_error(l->fd, rc, text);
			shl_close_fd(&l->fd);
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
		refuse(s, p, -EACCES,
		       "rank %" PRIu32 "'s join presents another nonce than the one "
		       "rank 0 sent over its rendezvous connection",
		       r);
		return 0;
	}
	if (!sel_shard_addr_eq(&p->from, &l->expect)) {
		refuse(s, p, -EACCES,
		       "rank %" PRIu32 "'s join comes from %s, but its rendezvous peer "
		       "is %s",
		       r, sel_shard_addr_text(&p->from, from),
		       sel_shard_addr_text(&l->expect, want));
		return 0;
	}
	/* Authenticated: a disagreement now is the deployment's, not a forgery. */
	int rc = 0;
	char msg[EOS_ERRMSG_MAX];
	if (j->world != s->cfg.world) {
		rc = -EINVAL;
		snprintf(msg, sizeof msg,
			 "rank %" PRIu32 " runs a world of %" PRIu32 " ranks, rank 0 "
			 "one of %" PRIu32,
			 r, j->world, s->cfg.world);
	} else if (sodium_memcmp(j->identity, s->cfg.identity, SEL_IDENTITY_BYTES) != 0) {
		rc = SEL_EIDENTITY;
		snprintf(msg, sizeof msg,
			 "rank %" PRIu32 " has offload identity %.16s..., rank 0 %.16s...: "
			 "the ranks run another core or continuation-state mode",
			 r, shl_hex16(j->identity, a), shl_hex16(s->cfg.identity, b));
	} else if (memcmp(j->fingerprint, s->cfg.fingerprint[r], SEL_FINGERPRINT_BYTES) != 0) {
		rc = SEL_ELAYOUT;
		snprintf(msg, sizeof msg,
			 "rank %" PRIu32 "'s layout fingerprint is %s, rank 0 expects %s "
			 "for that rank: the ranks disagree on the core's geometry",
			 r, shl_hex16(j->fingerprint, a), shl_hex16(s->cfg.fingerprint[r], b));
	} else if (j->set.disk != s->cfg.set.disk) {
		rc = -EINVAL;
		snprintf(msg, sizeof msg,
			 "every rank must have a disk store or none: rank 0 has %s, "
			 "rank %" PRIu32 " %s",
			 s->cfg.set.disk ? "one" : "none", r, j->set.disk ? "has one" : "has none");
	}
	if (rc) {
		shl_send_error(p->fd, rc, msg);
		shl_close_fd(&p->fd);
		return join_failed(s, rc, msg);
	}
	l->fd = p->fd;
	p->fd = -1;
	l->joined = true;
	l->set = j->set;
	sodium_memzero(l->nonce, sizeof l->nonce); /* used once */
	sel_shard_sockopts(l->fd, s->cfg.sock_buf);
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
		rc = sel_shard_recv_all(fd, b + have, SEL_SHARD_FRAME_HEADER - have, until);
	if (!rc)
		rc = sel_shard_frame_header(b, SEL_SHARD_FRAME_HEADER, &type, &plen);
	if (!rc && (type != SEL_SHARD_ERROR || SEL_SHARD_FRAME_HEADER + plen > sizeof b ||
		    SEL_SHARD_FRAME_HEADER + plen < have))
		rc = eos_fail(-EPROTO, "a %s frame before ACCEPT", sel_shard_type_name(type));
	if (!rc && have < SEL_SHARD_FRAME_HEADER + plen)
		rc = sel_shard_recv_all(fd, b + have, SEL_SHARD_FRAME_HEADER + plen - have, until);
	struct sel_shard_msg m;
	if (!rc && (rc = sel_shard_decode(b, SEL_SHARD_FRAME_HEADER + plen, NULL, &m)) == 0) {
		rc = m.u.status.status;
		snprintf(msg, sizeof msg, "rank %" PRIu32 " refused the join: %s", r,
			 m.u.status.text);
		sel_shard_msg_free(&m);
		return join_failed(s, rc, msg);
	}
	snprintf(msg, sizeof msg, "rank %" PRIu32 "'s link failed during the join: %s", r,
		 eos_errmsg());
	return join_failed(s, rc, msg);
}

#define JOIN_PEND_MAX ((int)(2 * SEL_SHARD_WORLD_MAX + 8)) /* connections waiting to JOIN */

/* Accept what the listener holds into free pending slots. */
static void join_accept(sel_shard_set *s, struct pend *pend, uint64_t now)
{
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof ss;
		int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
		if (fd < 0)
			return;
		int i = 0;
		while (i < JOIN_PEND_MAX && pend[i].fd >= 0)
			i++;
		struct pend tmp = {.fd = fd};
		if (sel_shard_addr_from((struct sockaddr *)&ss, &tmp.from) != 0 ||
		    i == JOIN_PEND_MAX) {
			refuse(s, &tmp, -EBUSY, "too many connections waiting to join");
			continue;
		}
		pend[i] = tmp;
		pend[i].until = now + s->cfg.handshake_ns;
	}
}

/* A pending connection that polled readable (or timed out): read, and
 * judge its JOIN once whole.  0 (refused or not yet whole), 1 joined, or a
 * failure of the join. */
static int join_pending(sel_shard_set *s, struct pend *p, short revents, uint64_t now)
{
	if (revents & (POLLIN | POLLHUP | POLLERR)) {
		ssize_t got = recv(p->fd, p->buf + p->n, sizeof p->buf - p->n, MSG_DONTWAIT);
		if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
			refuse(s, p, -EPROTO, "the connection closed before a whole JOIN");
			return 0;
		}
		if (got > 0)
			p->n += (size_t)got;
	}
	if (p->n >= SEL_SHARD_FRAME_HEADER) {
		uint16_t type;
		uint32_t plen;
		if (sel_shard_frame_header(p->buf, p->n, &type, &plen) != 0 ||
		    type != SEL_SHARD_JOIN || plen > sizeof p->buf - SEL_SHARD_FRAME_HEADER) {
			refuse(s, p, -EPROTO, "the first frame is not a JOIN");
			return 0;
		}
		size_t flen = SEL_SHARD_FRAME_HEADER + plen;
		if (p->n >= flen) {
			struct sel_shard_msg m;
			if (sel_shard_decode(p->buf, flen, NULL, &m) != 0) {
				refuse(s, p, -EPROTO, "a JOIN that does not decode: %s",
				       eos_errmsg());
				return 0;
			}
			uint32_t r = m.u.join.rank;
			int v = judge(s, p, &m.u.join);
			sel_shard_msg_free(&m);
			if (v == 1 && p->n > flen)
				v = early_frame(s, r, p->buf + flen, p->n - flen);
			return v;
		}
	}
	if (p->fd >= 0 && now >= p->until)
		refuse(s, p, -ETIMEDOUT, "no whole JOIN within the handshake time");
	return 0;
}

/* A joined peer says something before ACCEPT: its refusal, which fails
 * the join. */
static int join_early_word(sel_shard_set *s, uint32_t r, uint64_t now)
{
	uint8_t b[SEL_SHARD_FRAME_HEADER + 16 + SEL_SHARD_TEXT_MAX];
	struct sel_shard_msg m;
	char msg[EOS_ERRMSG_MAX];
	int e = shl_recv_msg(s->link[r].fd, b, sizeof b, NULL, &m, now + S_NS);
	if (e == 0 && m.type == SEL_SHARD_ERROR) {
		e = m.u.status.status;
		snprintf(msg, sizeof msg, "rank %" PRIu32 " refused the join: %s", r,
			 m.u.status.text);
	} else {
		snprintf(msg, sizeof msg, "rank %" PRIu32 "'s link failed during the join: %s", r,
			 e ? eos_errmsg() : "an unexpected frame");
		e = e ? e : -EPROTO;
	}
	if (e == 0)
		e = -EPROTO;
	sel_shard_msg_free(&m);
	return join_failed(s, e, msg);
}

static int join_timed_out(sel_shard_set *s)
{
	uint64_t missing = 0;
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (!s->link[r].joined)
			missing |= 1ull << r;
	char rt[256], msg[EOS_ERRMSG_MAX];
	shl_ranks_text(missing, rt, sizeof rt);
	snprintf(msg, sizeof msg, "rank %.200s did not join before the deadline%s%.250s", rt,
		 s->refusal[0] ? "; last refusal: " : "", s->refusal);
	return join_failed(s, -ETIMEDOUT, msg);
}

/* Every peer joined: the smallest limit holds (design 2.14); ACCEPT. */
static int join_accepted(sel_shard_set *s, uint64_t deadline_ns)
{
	s->agreed_limit = s->cfg.set.disk_limit;
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (s->link[r].set.disk_limit < s->agreed_limit)
			s->agreed_limit = s->link[r].set.disk_limit;
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct sel_shard_msg m = {.type = SEL_SHARD_ACCEPT};
		m.u.accept = (struct sel_shard_accept){s->cfg.world, s->agreed_limit};
		int rc = shl_send_msg(s->link[r].fd, &m, deadline_ns);
		if (rc != 0) {
			char msg[EOS_ERRMSG_MAX];
			snprintf(msg, sizeof msg,
				 "rank links: sending ACCEPT to rank %" PRIu32 ": %s", r,
				 eos_errmsg());
			return join_failed(s, rc, msg);
		}
	}
	s->st = S_JOINED;
	return 0;
}

/* One poll of the listener, the pending connections and the joined links:
 * 0 to go on, or a failure of the join. */
static int join_round(sel_shard_set *s, struct pend *pend, uint64_t deadline_ns, uint32_t *joined)
{
	struct pollfd pf[1 + JOIN_PEND_MAX + SEL_SHARD_WORLD_MAX];
	int who[1 + JOIN_PEND_MAX + SEL_SHARD_WORLD_MAX]; /* >= 0 pend index, < 0 -rank */
	int np = 0;
	uint64_t now = eos_now_ns(), wake = deadline_ns;
	pf[np] = (struct pollfd){s->lfd, POLLIN, 0};
	who[np++] = INT_MIN;
	for (int i = 0; i < JOIN_PEND_MAX; i++)
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
	int n = poll(pf, (nfds_t)np, shl_timeout_ms(wake, now));
	if (n < 0 && errno != EINTR)
		return join_failed(s, -errno, "rank links: poll failed during the join");
	now = eos_now_ns();
	for (int k = 0; k < np; k++) {
		if (who[k] == INT_MIN) {
			if (pf[k].revents & POLLIN)
				join_accept(s, pend, now);
		} else if (who[k] >= 0) {
			int v = join_pending(s, &pend[who[k]], pf[k].revents, now);
			if (v < 0)
				return v;
			*joined += (uint32_t)v;
		} else if (pf[k].revents) {
			return join_early_word(s, (uint32_t)-who[k], now);
		}
	}
	return 0;
}

int sel_shard_join(sel_shard_set *s, uint64_t deadline_ns)
{
	if (s->st != S_SETUP)
		return eos_fail(-EINVAL, "rank links: join called twice");
	for (uint32_t r = 1; r < s->cfg.world; r++)
		if (!s->link[r].hello)
			return eos_fail(-EINVAL, "rank links: no HELLO was made for rank %" PRIu32,
					r);
	struct pend *pend = calloc(JOIN_PEND_MAX, sizeof *pend);
	if (!pend)
		return eos_fail(-ENOMEM, "rank links: out of memory");
	for (int i = 0; i < JOIN_PEND_MAX; i++)
		pend[i].fd = -1;
	uint32_t joined = 0;
	int rc = 0;
	while (rc == 0 && joined < s->cfg.world - 1)
		rc = eos_now_ns() >= deadline_ns ? join_timed_out(s)
						 : join_round(s, pend, deadline_ns, &joined);
	if (rc == 0)
		rc = join_accepted(s, deadline_ns);
	for (int i = 0; i < JOIN_PEND_MAX; i++)
		shl_close_fd(&pend[i].fd);
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
		int rc = shl_recv_msg(fd, buf, cap, NULL, &m, deadline_ns);
		if (rc) {
			free(e);
			return eos_fail(rc, "rank %" PRIu32 "'s scan summary: %s", r, eos_errmsg());
		}
		if (m.type == SEL_SHARD_SCAN_END) {
			uint32_t total = m.u.total.total;
			sel_shard_msg_free(&m);
			if (total != have) {
				free(e);
				return eos_fail(SEL_EFORMAT,
						"rank %" PRIu32 "'s scan summary ends at %" PRIu32
						" entries after %zu",
						r, total, have);
			}
			*ents = e;
			*n = have;
			return 0;
		}
		if (m.type != SEL_SHARD_SCAN) {
			int st = m.type == SEL_SHARD_ERROR ? m.u.status.status : SEL_EFORMAT;
			char t[SEL_SHARD_TEXT_MAX + 1];
			snprintf(t, sizeof t, "%s",
				 m.type == SEL_SHARD_ERROR ? m.u.status.text : "");
			uint16_t type = m.type;
			sel_shard_msg_free(&m);
			free(e);
			if (type == SEL_SHARD_ERROR)
				return eos_fail(
					st, "rank %" PRIu32 " failed before its scan summary: %s",
					r, t);
			return eos_fail(SEL_EFORMAT,
					"rank %" PRIu32 " sent a %s frame instead of its scan "
					"summary",
					r, sel_shard_type_name(type));
		}
		if (m.u.scan.first != have || have + m.u.scan.n > s->cfg.max_scan) {
			uint32_t first = m.u.scan.first;
			sel_shard_msg_free(&m);
			free(e);
			return eos_fail(SEL_EFORMAT,
					"rank %" PRIu32 "'s scan summary: entries from %" PRIu32
					" after %zu, limit %" PRIu32,
					r, first, have, s->cfg.max_scan);
		}
		if (have + m.u.scan.n > room) {
			size_t want = room ? room * 2 : 1024;
			while (want < have + m.u.scan.n)
				want *= 2;
			struct sel_shard_entry *ne = realloc(e, want * sizeof *e);
			if (!ne) {
				sel_shard_msg_free(&m);
				free(e);
				return eos_fail(-ENOMEM,
						"rank %" PRIu32 "'s scan summary: out of memory",
						r);
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
			size_t k = n[r] - at < SEL_SHARD_DECIDE_CHUNK ? n[r] - at
								      : SEL_SHARD_DECIDE_CHUNK;
			m.u.decide =
				(struct sel_shard_decide){(uint32_t)at, (uint32_t)k, act[r] + at};
			rc = shl_send_msg(s->link[r].fd, &m, deadline_ns);
		}
		struct sel_shard_msg end = {.type = SEL_SHARD_DECIDE_END};
		end.u.total.total = (uint32_t)n[r];
		if (rc || (rc = shl_send_msg(s->link[r].fd, &end, deadline_ns))) {
			rc = eos_fail(rc, "sending rank %" PRIu32 " its actions: %s", r,
				      eos_errmsg());
			goto fail;
		}
	}
	for (uint32_t r = 1; r < w; r++) {
		struct sel_shard_msg m;
		if ((rc = shl_recv_msg(s->link[r].fd, buf, cap, NULL, &m, deadline_ns))) {
			rc = eos_fail(rc, "waiting for rank %" PRIu32 " to apply the agreement: %s",
				      r, eos_errmsg());
			goto fail;
		}
		bool ok = m.type == SEL_SHARD_APPLIED && m.u.status.status == 0;
		if (!ok) {
			rc = m.type == SEL_SHARD_APPLIED || m.type == SEL_SHARD_ERROR
				     ? m.u.status.status
				     : SEL_EFORMAT;
			if (m.type == SEL_SHARD_APPLIED || m.type == SEL_SHARD_ERROR)
				eos_fail(rc, "rank %" PRIu32 " could not apply the agreement: %s",
					 r, m.u.status.text);
			else
				eos_fail(rc, "rank %" PRIu32 " sent a %s frame instead of APPLIED",
					 r, sel_shard_type_name(m.type));
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
