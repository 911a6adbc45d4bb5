/*
 * shard_peer.c - a peer's rank link: join, agreement and the record
 * service loop (design 2.14; docs/multihost.md; design in shard_link.c,
 * "The peer").
 */
#include "shard_link_int.h"

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
	shl_close_fd(&p->fd);
	shl_close_fd(&p->efd);
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
			int sock_buf, uint64_t deadline_ns)
{
	struct sockaddr_storage ss;
	socklen_t sl = shl_to_sockaddr(a, port, &ss);
	int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	char at[64];
	sel_shard_addr_text(a, at);
	if (fd < 0)
		return eos_fail(-errno, "rank link: socket: %s", strerror(errno));
	struct sel_shard_addr local = {0}; /* .family 0 should a failure return 0 */
	if (rendezvous_fd >= 0 && shl_sock_addr(rendezvous_fd, false, &local) == 0 &&
	    local.family == a->family) {
		struct sockaddr_storage ls;
		socklen_t ll = shl_to_sockaddr(&local, 0, &ls);
		if (bind(fd, (struct sockaddr *)&ls, ll) != 0) {
			int e = errno;
			close(fd);
			return eos_fail(-e,
					"rank link: binding to the rendezvous connection's local "
					"address: %s",
					strerror(e));
		}
	}
	/* Before the handshake, so the window it advertises follows. */
	if (sock_buf > 0)
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sock_buf, sizeof sock_buf);
	if (connect(fd, (struct sockaddr *)&ss, sl) != 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		return eos_fail(-e, "rank link: connecting to rank 0 at %s port %u: %s", at, port,
				strerror(e));
	}
	struct pollfd pf = {fd, POLLOUT, 0};
	int t = shl_timeout_ms(deadline_ns, eos_now_ns());
	int n = t ? poll(&pf, 1, t) : 0;
	int err = 0;
	socklen_t el = sizeof err;
	if (n <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
		close(fd);
		return eos_fail(n <= 0 ? -ETIMEDOUT : -(err ? err : errno),
				"rank link: connecting to "
				"rank 0 at %s port %u: %s",
				at, port,
				n <= 0 ? "no answer before the deadline"
				       : strerror(err ? err : errno));
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	return fd;
}

/* What this rank finds wrong with rank 0's HELLO (told after the JOIN):
 * 0, or the status with why said. */
static int hello_check(const struct sel_shard_peer_config *cfg, const struct sel_shard_hello *h,
		       char *why, size_t cap)
{
	int bad = 0;
	char a[33], b[33];
	static const uint8_t zero[SEL_FINGERPRINT_BYTES];
	if (h->world != cfg->world) {
		bad = -EINVAL;
		snprintf(why, cap,
			 "rank 0 runs a world of %" PRIu32 " ranks, rank %" PRIu32
			 " one of %" PRIu32,
			 h->world, cfg->rank, cfg->world);
	} else if (h->rank != cfg->rank) {
		bad = -EINVAL;
		snprintf(why, cap,
			 "rank 0 expects rank %" PRIu32 " on this rendezvous connection, "
			 "this process is rank %" PRIu32,
			 h->rank, cfg->rank);
	} else if (sodium_memcmp(h->identity, cfg->identity, SEL_IDENTITY_BYTES) != 0) {
		bad = SEL_EIDENTITY;
		snprintf(why, cap,
			 "rank 0 has offload identity %.16s..., rank %" PRIu32 " %.16s...: "
			 "the ranks run another core or continuation-state mode",
			 shl_hex16(h->identity, a), cfg->rank, shl_hex16(cfg->identity, b));
	} else if (memcmp(cfg->primary_fingerprint, zero, sizeof zero) &&
		   memcmp(cfg->primary_fingerprint, h->fingerprint, SEL_FINGERPRINT_BYTES)) {
		bad = SEL_ELAYOUT;
		snprintf(why, cap,
			 "rank 0's layout fingerprint is %s, rank %" PRIu32 " expects %s: "
			 "the ranks disagree on the core's geometry",
			 shl_hex16(h->fingerprint, a), cfg->rank,
			 shl_hex16(cfg->primary_fingerprint, b));
	} else if (h->set.disk != cfg->set.disk) {
		bad = -EINVAL;
		snprintf(why, cap,
			 "every rank must have a disk store or none: rank 0 has %s, "
			 "rank %" PRIu32 " %s",
			 h->set.disk ? "one" : "none", cfg->rank,
			 cfg->set.disk ? "has one" : "has none");
	}
	return bad;
}

/* Rank 0's answer to the JOIN: ACCEPT (the agreed limit), or its refusal. */
static int wait_accept(sel_shard_peer *p, const struct sel_shard_peer_config *cfg,
		       uint64_t deadline_ns)
{
	int rc;
	uint8_t buf[SEL_SHARD_FRAME_HEADER + 16 + SEL_SHARD_TEXT_MAX];
	struct sel_shard_msg am;
	if ((rc = shl_recv_msg(p->fd, buf, sizeof buf, NULL, &am, deadline_ns)) != 0) {
		rc = eos_fail(rc, "rank %" PRIu32 ": waiting for rank 0 to accept the join: %s",
			      cfg->rank, eos_errmsg());
		return rc;
	}
	if (am.type == SEL_SHARD_ERROR) {
		rc = eos_fail(am.u.status.status, "rank %" PRIu32 ": rank 0 refused the join: %s",
			      cfg->rank, am.u.status.text);
		sel_shard_msg_free(&am);
		return rc;
	}
	if (am.type != SEL_SHARD_ACCEPT || am.u.accept.world != cfg->world) {
		rc = eos_fail(SEL_EFORMAT,
			      "rank %" PRIu32 ": rank 0 answered the join with a %s frame",
			      cfg->rank, sel_shard_type_name(am.type));
		sel_shard_msg_free(&am);
		return rc;
	}
	p->limit = am.u.accept.disk_limit;
	sel_shard_msg_free(&am);
	return 0;
}

int sel_shard_peer_join(const struct sel_shard_peer_config *cfg, const void *hello, size_t len,
			uint64_t deadline_ns, sel_shard_peer **out)
{
	*out = NULL;
	if (cfg->world < 2 || cfg->world > SEL_SHARD_WORLD_MAX || cfg->rank == 0 ||
	    cfg->rank >= cfg->world)
		return eos_fail(-EINVAL, "rank link: rank %" PRIu32 " of a world of %" PRIu32,
				cfg->rank, cfg->world);
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
		return eos_fail(SEL_EFORMAT,
				"rank %" PRIu32 ": rank 0 sent a %s frame, not a HELLO", cfg->rank,
				sel_shard_type_name(t));
	}
	const struct sel_shard_hello *h = &hm.u.hello;
	char why[EOS_ERRMSG_MAX];
	int bad = hello_check(cfg, h, why, sizeof why);
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
	rc = peer_connect(&h->addr, h->port, cfg->rendezvous_fd, cfg->sock_buf, deadline_ns);
	if (rc < 0)
		goto fail;
	p->fd = rc;
	sel_shard_sockopts(p->fd, cfg->sock_buf);
	struct sel_shard_msg jm = {.type = SEL_SHARD_JOIN};
	struct sel_shard_join *j = &jm.u.join;
	j->world = cfg->world;
	j->rank = cfg->rank;
	memcpy(j->nonce, h->nonce, SEL_SHARD_NONCE_BYTES);
	memcpy(j->identity, cfg->identity, SEL_IDENTITY_BYTES);
	memcpy(j->fingerprint, cfg->fingerprint, SEL_FINGERPRINT_BYTES);
	j->set = cfg->set;
	rc = shl_send_msg(p->fd, &jm, deadline_ns);
	sodium_memzero(j->nonce, sizeof j->nonce);
	if (rc) {
		rc = eos_fail(rc, "rank %" PRIu32 ": sending JOIN to rank 0: %s", cfg->rank,
			      eos_errmsg());
		goto fail;
	}
	if (bad) {
		shl_send_error(p->fd, bad, why);
		rc = eos_fail(bad, "rank %" PRIu32 ": %s", cfg->rank, why);
		goto fail;
	}
	if ((rc = wait_accept(p, cfg, deadline_ns)))
		goto fail;
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
		return eos_fail(-E2BIG,
				"rank %" PRIu32 ": %zu records, more than a summary holds (%u)",
				p->cfg.rank, n, SEL_SHARD_MAX_SCAN);
	int rc = 0;
	struct sel_shard_msg m = {.type = SEL_SHARD_SCAN};
	for (size_t at = 0; at < n && !rc; at += SEL_SHARD_SCAN_CHUNK) {
		size_t k = n - at < SEL_SHARD_SCAN_CHUNK ? n - at : SEL_SHARD_SCAN_CHUNK;
		m.u.scan = (struct sel_shard_scan){(uint32_t)at, (uint32_t)k,
						   (struct sel_shard_entry *)(e + at)};
		rc = shl_send_msg(p->fd, &m, deadline_ns);
	}
	struct sel_shard_msg end = {.type = SEL_SHARD_SCAN_END};
	end.u.total.total = (uint32_t)n;
	if (rc || (rc = shl_send_msg(p->fd, &end, deadline_ns)))
		return eos_fail(rc, "rank %" PRIu32 ": sending the scan summary: %s", p->cfg.rank,
				eos_errmsg());
	size_t cap = SEL_SHARD_FRAME_HEADER + SEL_SHARD_FRAME_MAX;
	uint8_t *buf = malloc(cap);
	if (!buf)
		return eos_fail(-ENOMEM, "rank link: out of memory");
	size_t have = 0;
	for (;;) {
		struct sel_shard_msg d;
		if ((rc = shl_recv_msg(p->fd, buf, cap, NULL, &d, deadline_ns))) {
			rc = eos_fail(rc, "rank %" PRIu32 ": waiting for the agreement: %s",
				      p->cfg.rank, eos_errmsg());
			break;
		}
		if (d.type == SEL_SHARD_DECIDE && d.u.decide.first == have &&
		    have + d.u.decide.n <= n) {
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
			rc = eos_fail(d.u.status.status,
				      "rank %" PRIu32 ": rank 0 ended the agreement: %s",
				      p->cfg.rank, d.u.status.text);
		else
			rc = eos_fail(SEL_EFORMAT,
				      "rank %" PRIu32 ": a %s frame that does not match the "
				      "summary of %zu records (%zu decided)",
				      p->cfg.rank, sel_shard_type_name(d.type), n, have);
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
	int rc = shl_send_msg(p->fd, &m, deadline_ns);
	return rc ? eos_fail(rc, "rank %" PRIu32 ": sending APPLIED: %s", p->cfg.rank, eos_errmsg())
		  : 0;
}

static struct pjob *peer_find(sel_shard_peer *p, uint64_t id)
{
	for (struct eos_hnode *h = eos_hmap_first(&p->jobs, eos_hash64(id)); h;
	     h = eos_hmap_next(h))
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
		return eos_fail(SEL_EFORMAT,
				"rank %" PRIu32 ": job %" PRIu64 " completed with status %" PRId32
				" and flags 0x%" PRIx32 ", which a frame cannot carry",
				p->cfg.rank, r->id, r->status, r->flags);
	int64_t n = sel_shard_encoded_size(&m);
	if (n < 0)
		return (int)n;
	pthread_mutex_lock(&p->mu);
	struct pjob *j = peer_find(p, r->id);
	int rc = 0;
	if (!j) {
		rc = eos_fail(-ENOENT,
			      "rank %" PRIu32 ": job %" PRIu64 " is not an accepted job (or "
			      "completed already)",
			      p->cfg.rank, r->id);
	} else if (eos_grow((void **)&p->out, &p->out_cap, p->out_len + (size_t)n, 1) != 0) {
		rc = eos_fail(-ENOMEM, "rank %" PRIu32 ": out of memory for a completion",
			      p->cfg.rank);
	} else {
		sel_shard_encode(&m, p->out + p->out_len, (size_t)n);
		p->out_len += (size_t)n;
		eos_hmap_remove(&p->jobs, &j->hn);
		free(j);
	}
	pthread_mutex_unlock(&p->mu);
	if (!rc)
		shl_efd_raise(p->efd);
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
				int t = shl_timeout_ms(deadline_ns, eos_now_ns());
				if (t == 0 || poll(&pf, 1, t) == 0) {
					rc = eos_fail(-ETIMEDOUT,
						      "rank link: rank 0 took no completions "
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
				return eos_fail(-ENOMEM,
						"rank link: out of memory for completions");
			}
			memmove(b, b + sent, rest);
			if (p->out_len) /* p->out may be NULL */
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
		return eos_fail(SEL_ESTOPPED,
				"rank %" PRIu32 ": %s; the transport could not drain: %s "
				"(keep its resources)",
				p->cfg.rank, msg, eos_errmsg());
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
		rc = shl_send_msg(p->fd, &m, deadline);
	if (!rc) {
		/* Rank 0 closes once every rank drained. */
		uint8_t b[64];
		for (;;) {
			struct pollfd pf = {p->fd, POLLIN, 0};
			int t = shl_timeout_ms(deadline, eos_now_ns());
			if (t == 0 || poll(&pf, 1, t) <= 0)
				break; /* it did not: nothing is lost, the drain is done */
			ssize_t n = recv(p->fd, b, sizeof b, MSG_DONTWAIT);
			if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR)))
				break;
		}
	}
	if (d)
		return eos_fail(SEL_ESTOPPED,
				"rank %" PRIu32 ": the transport could not drain: %s (keep "
				"its resources)",
				p->cfg.rank, text);
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
		pf[np++] = (struct pollfd){p->fd,
					   (short)((pending < p->cfg.out_bytes ? POLLIN : 0) |
						   (pending ? POLLOUT : 0)),
					   0};
		pf[np++] = (struct pollfd){p->efd, POLLIN, 0};
		if (wfd >= 0)
			pf[np++] = (struct pollfd){wfd, POLLIN, 0};
		if (poll(pf, (nfds_t)np, -1) < 0 && errno != EINTR)
			return peer_end(p, ops, -errno, "poll failed");
		if (pf[1].revents & POLLIN)
			shl_efd_clear(p->efd);
		if (np > 2 && (pf[2].revents & POLLIN) && ops->service)
			ops->service(ops->ctx, p);
		int rc = peer_flush(p, false, 0);
		if (rc)
			return peer_end(p, ops, rc, eos_errmsg());
		if (!(pf[0].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		ssize_t got = recv(p->fd, p->in + p->in_len, p->in_cap - p->in_len, MSG_DONTWAIT);
		if (got == 0)
			return peer_end(p, ops, -ECONNRESET,
					"rank 0 closed the link without draining");
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
				snprintf(why, sizeof why,
					 "rank 0 sent a frame this rank refuses: %s", eos_errmsg());
				shl_send_error(p->fd, SEL_EFORMAT, why);
				return peer_end(p, ops, SEL_EFORMAT, why);
			}
			if (p->in_len - at < SEL_SHARD_FRAME_HEADER + plen)
				break;
			struct sel_shard_msg m;
			rc = sel_shard_decode(p->in + at, SEL_SHARD_FRAME_HEADER + plen,
					      &p->cfg.lim, &m);
			at += SEL_SHARD_FRAME_HEADER + plen;
			if (rc) {
				snprintf(why, sizeof why,
					 "rank 0 sent a frame this rank refuses: %s", eos_errmsg());
				shl_send_error(p->fd, SEL_EFORMAT, why);
				return peer_end(p, ops, SEL_EFORMAT, why);
			}
			if (m.type == SEL_SHARD_DRAIN) {
				uint32_t ms = m.u.drain.ms;
				sel_shard_msg_free(&m);
				return peer_drain(p, ops, ms);
			}
			if (m.type != SEL_SHARD_JOB) {
				int st =
					m.type == SEL_SHARD_ERROR ? m.u.status.status : SEL_EFORMAT;
				if (m.type == SEL_SHARD_ERROR)
					snprintf(why, sizeof why, "rank 0 ended the link: %s",
						 m.u.status.text);
				else
					snprintf(why, sizeof why,
						 "rank 0 sent a %s frame while serving",
						 sel_shard_type_name(m.type));
				sel_shard_msg_free(&m);
				if (st == SEL_EFORMAT)
					shl_send_error(p->fd, st, why);
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
				snprintf(why, sizeof why,
					 dup ? "rank 0 sent job %" PRIu64 " twice"
					     : "out of memory for job %" PRIu64,
					 id);
				shl_send_error(p->fd, dup ? SEL_EFORMAT : -ENOMEM, why);
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
