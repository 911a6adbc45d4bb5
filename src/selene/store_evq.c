/*
 * store_evq.c - a store's event queue, eventfd and epoll set
 * (store_evq.h; design 2.2, 2.8).
 *
 * DESIGN
 *
 * The queue is a ring that doubles when full.  The eventfd is level
 * signalled by its counter: push and wake write it, rearm reads it (EFD
 * non-blocking, so an empty read is harmless) and writes it once more when
 * the store still has something, so the worker's next epoll_wait returns at
 * once instead of sleeping on work that nothing will announce.  Only this
 * queue touches the eventfd, so armed says whether its counter is non-zero
 * and each of those syscalls is made only where it changes that: a poll
 * with nothing to say makes none, a burst of pushes one.
 *
 * INVARIANTS
 *
 *   1. 0 <= n <= cap; the events are q[(head + i) % cap] for i < n, oldest
 *      first.
 *   2. After sel_evq_rearm(q, more), the eventfd is readable iff n > 0 or
 *      more (until a thread in the set signals its own descriptor).
 *   3. armed iff the eventfd's counter is non-zero.
 */
#include "store_evq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "eos.h"

int sel_evq_init(struct sel_evq *q, const char *who)
{
	memset(q, 0, sizeof(*q));
	q->epfd = epoll_create1(EPOLL_CLOEXEC);
	q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (q->epfd < 0 || q->efd < 0)
		return eos_fail(-errno, "%s: epoll/eventfd: %s", who, strerror(errno));
	return sel_evq_watch(q, q->efd, who);
}

int sel_evq_watch(struct sel_evq *q, int fd, const char *who)
{
	struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
	if (epoll_ctl(q->epfd, EPOLL_CTL_ADD, fd, &e) != 0)
		return eos_fail(-errno, "%s: epoll: %s", who, strerror(errno));
	return 0;
}

void sel_evq_free(struct sel_evq *q)
{
	if (q->epfd >= 0)
		close(q->epfd);
	if (q->efd >= 0)
		close(q->efd);
	free(q->q);
	memset(q, 0, sizeof(*q));
	q->epfd = q->efd = -1;
}

void sel_evq_wake(struct sel_evq *q)
{
	uint64_t v = 1;
	if (q->efd >= 0 && !q->armed) {
		ssize_t w = write(q->efd, &v, sizeof v);
		q->armed = w == (ssize_t)sizeof v;
	}
}

void sel_evq_push(struct sel_evq *q, const sel_event *ev)
{
	if (q->n == q->cap) {
		size_t n = q->cap ? q->cap * 2 : 64;
		sel_event *r = malloc(n * sizeof(*r));
		if (!r)
			abort(); /* an event may never be lost: its pins would leak */
		for (size_t i = 0; i < q->n; i++)
			r[i] = q->q[(q->head + i) % q->cap];
		free(q->q);
		q->q = r;
		q->cap = n;
		q->head = 0;
	}
	q->q[(q->head + q->n) % q->cap] = *ev;
	q->n++;
	sel_evq_wake(q);
}

size_t sel_evq_take(struct sel_evq *q, sel_event *out, size_t cap)
{
	size_t n = 0;
	while (n < cap && q->n) {
		out[n++] = q->q[q->head];
		q->head = (q->head + 1) % q->cap;
		q->n--;
	}
	return n;
}

void sel_evq_rearm(struct sel_evq *q, bool more)
{
	uint64_t v;
	bool want = q->n || more;
	if (q->armed && !want) {
		ssize_t r = read(q->efd, &v, sizeof v);
		(void)r;
		q->armed = false;
	} else if (want) {
		sel_evq_wake(q); /* a no-op while armed */
	}
}

void sel_evq_nap(struct sel_evq *q, int ms)
{
	struct epoll_event e;
	(void)epoll_wait(q->epfd, &e, 1, ms);
}
