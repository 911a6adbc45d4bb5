/*
 * store_evq.h - a store's queue of events for sel_store_poll, with the
 * eventfd that says it holds some and the epoll set a store's wait_fd
 * returns (design 2.2 "poll drains completions"; 2.8 the worker sleeps on
 * the store's descriptor with its other inputs).
 *
 * Internal to libselene, used by the disk store and the composite (and by
 * any store whose completions come from several threads or inner stores).
 * Worker thread only: nothing locks.
 *
 * Rules: push never loses an event (a store would leak the worker's pins:
 * out of memory aborts); the eventfd is readable whenever events are queued
 * or the store said there is work no thread's completion will announce
 * (sel_evq_wake); poll ends with sel_evq_rearm, which reads the eventfd and
 * writes it again if work is still there, so an edge is never lost and an
 * idle store never wakes its worker.
 */
#ifndef SEL_STORE_EVQ_H
#define SEL_STORE_EVQ_H

#include <stdbool.h>
#include <stddef.h>

#include "selene.h"

struct sel_evq {
	sel_event *q;
	size_t head, n, cap;
	int efd;  /* eventfd, in the set */
	int epfd; /* epoll set: the store's wait_fd */
	/* The eventfd's counter is non-zero: only this queue writes and reads
	 * it, so it is known without a syscall, and push, wake and rearm make
	 * one only to change it (issue 18: a call that changes nothing costs
	 * the worker no syscall). */
	bool armed;
};

/* The eventfd and an epoll set holding it; who names the store in
 * messages.  On failure q may be passed to sel_evq_free.  A store whose
 * open can fail before this sets efd and epfd to -1 first (sel_evq_free
 * closes what is not -1). */
int sel_evq_init(struct sel_evq *q, const char *who);
/* Add fd (readable when the store has completions) to the set. */
int sel_evq_watch(struct sel_evq *q, int fd, const char *who);
void sel_evq_free(struct sel_evq *q);

/* Queue ev and wake the set. */
void sel_evq_push(struct sel_evq *q, const sel_event *ev);
/* Up to cap queued events, oldest first, into out; returns the count. */
size_t sel_evq_take(struct sel_evq *q, sel_event *out, size_t cap);
/* Make the set readable: work waits that no thread will announce. */
void sel_evq_wake(struct sel_evq *q);
/* At the end of a poll: clear the eventfd, and wake again when events are
 * still queued or more is true. */
void sel_evq_rearm(struct sel_evq *q, bool more);
/* Sleep on the set until something is readable, at most ms (close's
 * drains). */
void sel_evq_nap(struct sel_evq *q, int ms);

#endif
