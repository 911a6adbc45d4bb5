/*
 * transfer_check.c - sel_xfer_check: the invariants of transfer.c's header,
 * verified under every lock of the set (transfer.h).
 */
#include <inttypes.h>
#include <poll.h>

#include "transfer_int.h"

int sel_xfer_check(const sel_xfer *cx)
{
	sel_xfer *x = (sel_xfer *)cx;
	int rc = 0;

	pthread_mutex_lock(&x->submit);
	for (uint32_t r = 0; r < x->ranks; r++)
		pthread_mutex_lock(&x->rank[r].ring.lock);
	pthread_mutex_lock(&x->done);

	uint32_t inflight = atomic_load(&x->inflight);
	if (inflight != x->running + x->ndone) {
		rc = eos_fail(SEL_ECORRUPT,
			      "transfer: %" PRIu32 " in flight but %" PRIu32 " running + %" PRIu32
			      " completed",
			      inflight, x->running, x->ndone);
		goto out;
	}
	for (uint32_t r = 0; r < x->ranks && !rc; r++) {
		const struct ring *q = &x->rank[r].ring;
		if (q->count > q->cap || q->head >= q->cap) {
			rc = eos_fail(SEL_ECORRUPT,
				      "transfer: rank %" PRIu32 " ring holds %" PRIu32
				      " from %" PRIu32 " of %" PRIu32,
				      r, q->count, q->head, q->cap);
			break;
		}
		if (q->count > x->running) {
			rc = eos_fail(SEL_ECORRUPT,
				      "transfer: rank %" PRIu32 " ring holds %" PRIu32
				      " jobs but only %" PRIu32 " are running",
				      r, q->count, x->running);
			break;
		}
		if (q->count && q->asleep &&
		    (!q->kick || !atomic_load(&x->defer) || !atomic_load(&x->kick_any))) {
			rc = eos_fail(SEL_ECORRUPT,
				      "transfer: rank %" PRIu32 " sleeps on %" PRIu32
				      " queued jobs with no kick pending",
				      r, q->count);
			break;
		}
		for (uint32_t i = 0; i < q->count; i++) {
			const struct sel_xfer_job *job = q->q[(q->head + i) % q->cap];
			if (job->priv.pending == 0 || job->priv.pending > x->ranks) {
				rc = eos_fail(SEL_ECORRUPT,
					      "transfer: job %" PRIu64 " queued on rank %" PRIu32
					      " has %" PRIu32 " ranks pending",
					      job->id, r, job->priv.pending);
				break;
			}
		}
	}
	if (rc)
		goto out;
	uint32_t n = 0;
	const struct sel_xfer_job *last = NULL;
	for (const struct sel_xfer_job *j = x->head; j; j = j->priv.next) {
		if (j->priv.pending != 0 || ++n > x->ndone) {
			rc = eos_fail(SEL_ECORRUPT,
				      "transfer: completion queue entry %" PRIu32 " (job %" PRIu64
				      ") has %" PRIu32
				      " ranks pending or the queue is longer than %" PRIu32,
				      n, j->id, j->priv.pending, x->ndone);
			goto out;
		}
		last = j;
	}
	if (n != x->ndone || last != x->tail) {
		rc = eos_fail(SEL_ECORRUPT,
			      "transfer: completion queue has %" PRIu32
			      " entries, count says %" PRIu32 " (or its tail is wrong)",
			      n, x->ndone);
		goto out;
	}
	/* Sampled before the poll: when every owed write had been made by
	 * then, the eventfd's readiness is exact. */
	uint64_t written = atomic_load_explicit(&x->written, memory_order_acquire);
	if (x->consumed > x->owed || written > x->owed ||
	    (x->ndone > 0 && x->owed == x->consumed)) {
		rc = eos_fail(SEL_ECORRUPT,
			      "transfer: eventfd accounting broken: %" PRIu64
			      " writes owed, %" PRIu64 " made, %" PRIu64 " read back, %" PRIu32
			      " completions waiting",
			      x->owed, written, x->consumed, x->ndone);
		goto out;
	}
	struct pollfd pfd = {.fd = x->efd, .events = POLLIN};
	int ready = poll(&pfd, 1, 0);
	if (ready < 0 || (written == x->owed && (ready == 1) != (x->owed != x->consumed)))
		rc = eos_fail(SEL_ECORRUPT,
			      "transfer: eventfd %s with %" PRIu32 " completions waiting (%" PRIu64
			      " writes, all made, %" PRIu64 " read back)",
			      ready == 1 ? "readable" : "not readable", x->ndone, x->owed,
			      x->consumed);
out:
	pthread_mutex_unlock(&x->done);
	for (uint32_t r = x->ranks; r-- > 0;)
		pthread_mutex_unlock(&x->rank[r].ring.lock);
	pthread_mutex_unlock(&x->submit);
	return rc;
}
