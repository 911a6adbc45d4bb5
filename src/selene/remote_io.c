/*
 * remote_io.c - the remote client's I/O thread: submissions taken from the
 * caller's list, ops started and driven by replies, the network polled,
 * the checker run after every pass in sanitizer builds (issue 16;
 * remote_client.c DESIGN).
 *
 * DESIGN
 *
 * The thread sleeps in poll() over the submission eventfd and the
 * network's sockets, at nice 10 in the offload class (eos_sched).  Each pass takes what was
 * submitted (under the mutex, which covers linking only), starts ops within
 * their bounds (puts two at a time, oldest first), runs the network, and
 * refreshes the description and counters the caller's thread reads.  At
 * close it finishes every op (their events still post) and ends.
 *
 * INVARIANTS
 *   1. No call from the caller's thread waits for this thread's work
 *      (remote_client.c invariant 4).
 */
#include "remote_client_int.h"

/* ---- The I/O thread ------------------------------------------------------ */

void rmt_on_reply(struct sel_rn_cmd *c, redisReply *rep, int err)
{
	struct op *o = c->owner;
	if (o->kind == SEL_REMOTE_OP_PUT && (c->tag >> 32) < SEL_RN_BULK_LANES &&
	    o->u.p.wcmd[c->tag >> 32] == c)
		o->u.p.wcmd[c->tag >> 32] = NULL; /* done: nothing left to detach */
	if (!o->finished) {
		switch (o->kind) {
		case SEL_REMOTE_OP_PUT: rmt_put_reply(o, c->tag, rep, err); break;
		case SEL_REMOTE_OP_LOOKUP: rmt_lk_reply(o, c->tag, rep, err); break;
		case SEL_REMOTE_OP_CLAIM: rmt_cl_reply(o, c->tag, rep, err); break;
		}
	}
	rmt_op_unref(o);
}

static void start_puts(struct sel_remote *r)
{
	while (r->puts_running < PUT_PARALLEL && r->put_wait.head) {
		struct op *o = r->put_wait.head;
		ol_del(&r->put_wait, o);
		rmt_put_start(o);
	}
}

static void take_submissions(struct sel_remote *r, bool *closing, uint64_t *deadline)
{
	struct op_list got = {0};
	pthread_mutex_lock(&r->mu);
	got = r->sub;
	memset(&r->sub, 0, sizeof r->sub);
	*closing = r->closing;
	*deadline = r->close_deadline;
	pthread_mutex_unlock(&r->mu);
	while (got.head) {
		struct op *o = got.head;
		ol_del(&got, o);
		switch (o->kind) {
		case SEL_REMOTE_OP_PUT: ol_push(&r->put_wait, o); break;
		case SEL_REMOTE_OP_LOOKUP:
			if (*closing)
				rmt_finish(o, SEL_REMOTE_FAILED, -ECANCELED, NULL, 0);
			else
				rmt_lk_start(o);
			break;
		case SEL_REMOTE_OP_CLAIM:
			if (*closing)
				rmt_finish(o, SEL_REMOTE_FAILED, -ECANCELED, NULL, 0);
			else
				rmt_cl_start(o);
			break;
		}
	}
}

/* The network's last error as soon as it changes; the node list at most
 * every 50 ms. */
static void update_info(struct sel_remote *r, uint64_t now)
{
	rmt_sync_error(r);
	if (now - r->info_ns < 50 * MS)
		return;
	r->info_ns = now;
	char d[sizeof r->desc];
	sel_rn_describe(r->net, d, sizeof d);
	pthread_mutex_lock(&r->info_mu);
	memcpy(r->desc, d, sizeof d);
	pthread_mutex_unlock(&r->info_mu);
}

#if defined(SEL_SANITIZED) || defined(SEL_DEBUG_CHECKS)
/* Invariants of the I/O thread's state (INVARIANTS 2, 3): the window
 * budgets and bulk lanes in use are exactly those of the running ops,
 * every active op is unfinished and referenced, and the queues' counts
 * cover what is active.  0 or -EINVAL with a message. */
static int client_check(struct sel_remote *r)
{
	uint32_t put_wins = 0, claim_wins = 0, lanes = 0, running = 0, n[4] = {0};
	for (const struct op *o = r->active.head; o; o = o->next) {
		if (o->finished || o->refs < 1 || !o->started)
			return eos_fail(-EINVAL,
					"remote: active op %llu finished, unreferenced or "
					"not started",
					(unsigned long long)o->id);
		n[o->kind]++;
		if (o->kind == SEL_REMOTE_OP_PUT) {
			running++;
			put_wins += o->u.p.inflight;
			if (lanes & o->u.p.lanes)
				return eos_fail(-EINVAL, "remote: two puts on one bulk lane");
			lanes |= o->u.p.lanes;
		} else if (o->kind == SEL_REMOTE_OP_CLAIM) {
			claim_wins += o->u.c.inflight;
		}
	}
	for (const struct op *o = r->put_wait.head; o; o = o->next)
		n[SEL_REMOTE_OP_PUT]++;
	if (put_wins != r->put_wins || claim_wins != r->claim_wins || lanes != r->bulk_busy ||
	    running != r->puts_running || put_wins > r->put_budget || claim_wins > r->claim_budget)
		return eos_fail(-EINVAL,
				"remote: windows in flight %u/%u puts, %u/%u claims, lanes "
				"0x%x/0x%x, %u/%u puts running",
				put_wins, r->put_wins, claim_wins, r->claim_wins, lanes,
				r->bulk_busy, running, r->puts_running);
	pthread_mutex_lock(&r->mu);
	bool over = n[SEL_REMOTE_OP_PUT] > r->n_put || n[SEL_REMOTE_OP_LOOKUP] > r->n_lookup ||
		    n[SEL_REMOTE_OP_CLAIM] > r->n_claim || r->ring_n > r->ring_cap;
	pthread_mutex_unlock(&r->mu);
	if (over)
		return eos_fail(-EINVAL, "remote: more ops active than queued");
	return 0;
}
#endif

void *rmt_io_main(void *arg)
{
	struct sel_remote *r = arg;
	eos_thread_name("sel-remote");
	(void)eos_thread_lower_priority(IO_NICE); /* below serving threads (design 2.12) */
	struct pollfd pfd[1 + 2 * (SEL_RC_NODES_MAX + SEL_RU_SEEDS_MAX)];
	int nfds = 0;
	bool closing = false, cancelled = false;
	uint64_t close_deadline = 0;
	int close_rc = 0;
	for (;;) {
		uint64_t now = eos_now_ns();
		take_submissions(r, &closing, &close_deadline);
		if (closing && !cancelled) {
			cancelled = true;
			for (struct op *o = r->active.head, *next; o; o = next) {
				next = o->next;
				if (o->kind != SEL_REMOTE_OP_PUT)
					rmt_finish(o, SEL_REMOTE_FAILED, -ECANCELED, NULL, 0);
			}
		}
		sel_rn_run(r->net, nfds ? pfd + 1 : NULL, nfds ? nfds - 1 : 0, now);
		update_info(r, now);
		now = eos_now_ns();
		for (struct op *o = r->active.head, *next; o; o = next) {
			next = o->next;
			if (o->deadline_ns && now >= o->deadline_ns) {
				char m[96];
				snprintf(m, sizeof m, "remote %s: deadline passed",
					 o->kind == SEL_REMOTE_OP_PUT      ? "put"
					 : o->kind == SEL_REMOTE_OP_LOOKUP ? "lookup"
									   : "claim");
				rmt_note_error(r, m);
				rmt_finish(o, SEL_REMOTE_FAILED, -ETIMEDOUT, NULL, 0);
			}
		}
		if (closing && close_deadline && now >= close_deadline) {
			while (r->active.head) {
				close_rc = -ETIMEDOUT;
				rmt_finish(r->active.head, SEL_REMOTE_FAILED, -ETIMEDOUT, NULL, 0);
			}
			while (r->put_wait.head) {
				close_rc = -ETIMEDOUT;
				rmt_finish(r->put_wait.head, SEL_REMOTE_FAILED, -ETIMEDOUT, NULL,
					   0);
			}
		}
		start_puts(r);
		rmt_pump_all(r, SEL_REMOTE_OP_PUT); /* budget freed by ops that finished early */
		rmt_pump_all(r, SEL_REMOTE_OP_CLAIM);
		update_info(r, now);
#if defined(SEL_SANITIZED) || defined(SEL_DEBUG_CHECKS)
		if (client_check(r)) { /* after every pass, in the sanitizer builds */
			fprintf(stderr, "selene: %s\n", sel_errmsg());
			abort();
		}
#endif
		if (closing && !r->active.head && !r->put_wait.head)
			break;
		/* Write what the ops just queued, then sleep. */
		sel_rn_run(r->net, NULL, 0, now);
		uint64_t next = UINT64_MAX;
		pfd[0].fd = r->wake_fd;
		pfd[0].events = POLLIN;
		pfd[0].revents = 0;
		nfds = 1 + sel_rn_pollfds(r->net, pfd + 1, (int)(sizeof pfd / sizeof pfd[0]) - 1,
					  &next);
		for (struct op *o = r->active.head; o; o = o->next)
			if (o->deadline_ns && o->deadline_ns < next)
				next = o->deadline_ns;
		if (closing && close_deadline && close_deadline < next)
			next = close_deadline;
		now = eos_now_ns();
		int timeout = next == UINT64_MAX ? 1000
			      : next <= now      ? 0
						 : (int)((next - now + MS - 1) / MS);
		if (timeout > 1000)
			timeout = 1000;
		int pr = poll(pfd, (nfds_t)nfds, timeout);
		if (pr < 0)
			nfds = 0;
		if (pr > 0 && (pfd[0].revents & POLLIN)) {
			uint64_t v;
			ssize_t rd = read(r->wake_fd, &v, sizeof v);
			(void)rd;
		}
	}
	sel_rn_close(r->net); /* every command's done runs: the ops' last references */
	r->net = NULL;
	pthread_mutex_lock(&r->mu);
	r->close_rc = close_rc;
	r->stopped = true;
	pthread_mutex_unlock(&r->mu);
	return NULL;
}
