/*
 * shard_link.c - the rank links of a multi-host core: rank zero's link set
 * (job fan-out, completions, stop, drain); its startup (join, agreement)
 * is in shard_join.c, a peer's link (join, agreement, the record service
 * loop) in shard_peer.c, their socket helpers in shard_io.c, what they
 * share in shard_link_int.h (design 2.14; 2.12's
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
#include "shard_link_int.h"

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
		*len = eos_fail(-ENOMEM,
				"rank link: out of memory for a %s frame of %" PRId64 " bytes",
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

void shl_ranks_text(uint64_t mask, char *out, size_t len)
{
	size_t at = 0;
	out[0] = '\0';
	for (uint32_t r = 0; r < 64 && at < len; r++)
		if (mask & (1ull << r))
			at += (size_t)snprintf(out + at, len - at, "%s%u", at ? ", " : "", r);
}

static void append(char *buf, size_t cap, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
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
		shl_efd_raise(s->wake); /* the reader now has a deadline to watch */
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
	for (struct eos_hnode *h = eos_hmap_first(&s->jobs, eos_hash64(id)); h;
	     h = eos_hmap_next(h)) {
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
	shl_efd_raise(s->efd);
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
			append(held->d.text, sizeof held->d.text,
			       "; cleanup unlink on rank %u could not "
			       "be sent (%s)",
			       r, l->dead ? "its link is down" : "its queue is full");
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
		m.u.job = (struct sel_shard_job){.id = c->d.id,
						 .op = SEL_SHARD_UNLINK,
						 .slot = SEL_SHARD_NO_SLOT,
						 .n_recs = 1,
						 .recs = &rec};
		int64_t n;
		f = frame_of(&m, &n);
	}
	if (!f) {
		free(c);
		held->d.cleanup_failed |= can;
		if (can)
			append(held->d.text, sizeof held->d.text,
			       "; cleanup unlinks could not be made: %s", eos_errmsg());
		if (stopping(s))
			s->stop_cleanup_failed += (uint32_t)shl_popcount64(mask);
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
		s->stats.cleanup_failed += (uint64_t)shl_popcount64(bad);
		if (stopping(s)) {
			s->stop_cleaned += (uint32_t)shl_popcount64(ok);
			s->stop_cleanup_failed += (uint32_t)shl_popcount64(bad);
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
			shl_ranks_text(bad, rt, sizeof rt);
			append(to->d.text, sizeof to->d.text,
			       "; cleanup unlink failed on rank %s%s%s", rt, d->text[0] ? ": " : "",
			       d->text);
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
		snprintf(
			s->why, sizeof s->why,
			"%s; the rank links stopped with %" PRIu32 " job%s "
			"outstanding: the caller must stop its worker and keep those jobs' page ids "
			"and state slots (a peer may still be copying into them)",
			why, caller, caller == 1 ? "" : "s");
		s->st = S_STOPPING;
		s->stop_deadline = eos_now_ns() + s->cfg.job_timeout_ns;
		/* Completions not yet polled stay; nothing is added from now on. */
		pthread_cond_broadcast(&s->cv);
		if (s->reader_on)
			shl_efd_raise(s->wake);
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
		shl_ranks_text(ranks, rt, sizeof rt);
		append(s->why, sizeof s->why,
		       "; %" PRIu32 " job%s still outstanding on rank %s after "
		       "the job timeout (any partial store there is not cleaned up)",
		       s->outstanding, s->outstanding == 1 ? "" : "s", rt);
	}
	if (s->stop_cleaned || s->stop_cleanup_failed)
		append(s->why, sizeof s->why,
		       "; cleanup after the stop: %" PRIu32 " unlink%s of "
		       "partial stores done, %" PRIu32 " failed",
		       s->stop_cleaned, s->stop_cleaned == 1 ? "" : "s", s->stop_cleanup_failed);
	s->st = S_STOPPED;
	s->stats.stopped = true;
	shl_efd_raise(s->efd);
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
		snprintf(why, sizeof why,
			 "rank %u reported job %" PRIu64 ", which it was not sent or "
			 "had completed already",
			 r, res->id);
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
			snprintf(why, sizeof why, "rank %u's link failed while sending: %s",
				 l->rank, strerror(err));
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
			snprintf(why, sizeof why, "rank %u sent a frame rank 0 cannot read: %s",
				 l->rank, eos_errmsg());
			link_failed(s, l, why);
			return;
		}
		if (plen > DONE_FRAME_MAX - SEL_SHARD_FRAME_HEADER) {
			snprintf(why, sizeof why,
				 "rank %u sent a %s frame of %" PRIu32 " bytes while "
				 "serving, more than a completion takes",
				 l->rank, sel_shard_type_name(type), plen);
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
			snprintf(why, sizeof why, "rank %u sent a frame that does not decode: %s",
				 l->rank, eos_errmsg());
			link_failed(s, l, why);
			return;
		}
		switch (m.type) {
		case SEL_SHARD_DONE: job_result(s, l, &m.u.done); break;
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
			timeout = shl_timeout_ms(s->head->deadline_ns, now);
		else if (s->st == S_STOPPING)
			timeout = shl_timeout_ms(s->stop_deadline, now);
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
			shl_efd_clear(s->wake);
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
		if ((s->st == S_RUNNING || s->st == S_CLOSING) && s->head &&
		    now >= s->head->deadline_ns) {
			struct sjob *j = s->head;
			char rt[256], why[EOS_ERRMSG_MAX];
			shl_ranks_text(j->pending, rt, sizeof rt);
			snprintf(why, sizeof why,
				 "job %" PRIu64 " (%s of the record of %" PRIu64 " tokens) "
				 "was not completed by rank %s within the job timeout of %" PRIu64
				 " ms",
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
		return eos_fail(-rc, "rank links: cannot start the reader thread: %s",
				strerror(rc));
	}
	s->reader_on = true;
	for (uint32_t r = 1; r < s->cfg.world; r++) {
		struct link *l = &s->link[r];
		if ((rc = pthread_create(&l->writer, NULL, writer_main, l)) != 0) {
			pthread_mutex_lock(&s->mu);
			stop_begin(s, "rank links: cannot start a writer thread");
			pthread_mutex_unlock(&s->mu);
			return eos_fail(-rc, "rank links: cannot start rank %u's writer thread: %s",
					r, strerror(rc));
		}
		l->writer_on = true;
	}
	return 0;
}

static int refused_state(sel_shard_set *s)
{
	if (stopping(s))
		return eos_fail(SEL_ESTOPPED, "%s", s->why);
	return eos_fail(SEL_ESTOPPED, "rank links: %s",
			s->st == S_CLOSING || s->st == S_CLOSED ? "closing" : "not started");
}

static int submit(sel_shard_set *s, const struct sel_shard_job *job, uint64_t ranks,
		  uint64_t cookie, uint64_t *id, bool cleanup, int cause, const char *cause_text)
{
	if (!ranks)
		ranks = s->peers;
	if (ranks & ~s->peers)
		return eos_fail(-EINVAL,
				"rank links: ranks 0x%" PRIx64 " are not this world's peers",
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
				    : l->normal >= s->cfg.queue_jobs ||
					      l->bytes + f->len > s->cfg.queue_bytes;
		if (full) {
			s->stats.refused_full++;
			rc = eos_fail(-EAGAIN,
				      "rank links: rank %u's queue is full (%u frames, %" PRIu64
				      " bytes): the peer is not taking jobs fast enough",
				      r, l->count, l->bytes);
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
	struct sel_shard_job job = {.id = 1,
				    .op = SEL_SHARD_UNLINK,
				    .slot = SEL_SHARD_NO_SLOT,
				    .n_recs = 1,
				    .recs = &x};
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
			shl_efd_clear(s->efd);
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
		shl_efd_raise(s->wake);
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
		shl_cond_wait_until(&s->cv, &s->mu, deadline_ns);
	/* A stop in progress: let its cleanup of the survivors finish. */
	while (s->st == S_STOPPING && eos_now_ns() < deadline_ns)
		shl_cond_wait_until(&s->cv, &s->mu, deadline_ns);
	if (s->st == S_CLOSING && s->outstanding) {
		char why[160];
		snprintf(why, sizeof why,
			 "close: %" PRIu32 " job%s still outstanding at the deadline",
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
			shl_cond_wait_until(&s->cv, &s->mu, deadline_ns);
		}
		for (uint32_t r = 1; r < s->cfg.world && !rc; r++) {
			struct link *l = &s->link[r];
			if (!l->drained)
				rc = eos_fail(SEL_ESTOPPED,
					      "rank links: rank %u did not confirm its drain "
					      "before the deadline",
					      r);
			else if (l->drain_status)
				rc = eos_fail(SEL_ESTOPPED,
					      "rank links: rank %u could not drain: %s (%s)", r,
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
		shl_close_fd(&l->fd);
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
	shl_close_fd(&s->lfd);
	shl_close_fd(&s->efd);
	shl_close_fd(&s->wake);
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
			rc = eos_fail(SEL_ECORRUPT,
				      "rank links: job %" PRIu64 " is listed, not in the table",
				      j->d.id);
		else if (j->pending & ~j->d.ranks)
			rc = eos_fail(SEL_ECORRUPT,
				      "rank links: job %" PRIu64 " waits for ranks it never "
				      "addressed",
				      j->d.id);
		else if (j->pending & dead)
			rc = eos_fail(SEL_ECORRUPT,
				      "rank links: job %" PRIu64 " waits for a dead rank", j->d.id);
		else if (!j->pending)
			rc = eos_fail(SEL_ECORRUPT,
				      "rank links: job %" PRIu64 " is outstanding with no "
				      "rank pending",
				      j->d.id);
	}
	if (!rc && (n != s->outstanding || s->jobs.n != n))
		rc = eos_fail(SEL_ECORRUPT,
			      "rank links: %" PRIu32 " jobs listed, %" PRIu32 " counted, %zu "
			      "in the table",
			      n, s->outstanding, s->jobs.n);
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
				rc = eos_fail(SEL_ECORRUPT,
					      "rank links: a queued frame without a reference");
		}
		if (!rc && (l->count > l->cap || normal != l->normal || bytes != l->bytes ||
			    l->normal > s->cfg.queue_jobs))
			rc = eos_fail(
				SEL_ECORRUPT,
				"rank links: rank %u's ring counts %u frames (%u jobs, %" PRIu64
				" bytes), holds %u jobs and %" PRIu64 " bytes",
				r, l->count, l->normal, l->bytes, normal, bytes);
	}
	for (struct sjob *j = s->dhead; j && !rc; j = j->dnext)
		if (j->pending)
			rc = eos_fail(SEL_ECORRUPT,
				      "rank links: completed job %" PRIu64 " has ranks "
				      "pending",
				      j->d.id);
	return rc;
}
