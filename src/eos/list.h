/*
 * list.h - intrusive doubly linked lists with a head, a tail and a count.
 *
 * The worker's queues (pending, active, waiting requests) are lists of
 * structs that carry their own prev/next links, so moving a request between
 * queues allocates nothing.  EOS_DLIST_DEFINE(prefix, LIST, NODE) defines
 * prefix_push (append), prefix_push_front and prefix_del for a list type
 * LIST { NODE *head, *tail; uint32_t n; } over nodes NODE { NODE *prev,
 * *next; ... }, and prefix_pop (delete and return the head, or NULL).  A
 * deleted node's links are cleared.  prefix_del tests the list's ends by
 * identity (head == x) and its neighbours for NULL: the same under the
 * lists' invariant, and it shows the analyzer that a deleted head leaves.
 */
#ifndef EOS_LIST_H
#define EOS_LIST_H

/* The arguments are type names and a member name, which cannot be
 * parenthesized. */
/* NOLINTBEGIN(bugprone-macro-parentheses) */
#define EOS_DLIST_DEFINE(prefix, list_t, node_t)                                                   \
	static inline void prefix##_push(list_t *l, node_t *x)                                     \
	{                                                                                          \
		x->next = NULL;                                                                    \
		x->prev = l->tail;                                                                 \
		if (l->tail)                                                                       \
			l->tail->next = x;                                                         \
		else                                                                               \
			l->head = x;                                                               \
		l->tail = x;                                                                       \
		l->n++;                                                                            \
	}                                                                                          \
	static inline void prefix##_push_front(list_t *l, node_t *x)                               \
	{                                                                                          \
		x->prev = NULL;                                                                    \
		x->next = l->head;                                                                 \
		if (l->head)                                                                       \
			l->head->prev = x;                                                         \
		else                                                                               \
			l->tail = x;                                                               \
		l->head = x;                                                                       \
		l->n++;                                                                            \
	}                                                                                          \
	static inline void prefix##_del(list_t *l, node_t *x)                                      \
	{                                                                                          \
		if (l->head == x)                                                                  \
			l->head = x->next;                                                         \
		else if (x->prev)                                                                  \
			x->prev->next = x->next;                                                   \
		if (l->tail == x)                                                                  \
			l->tail = x->prev;                                                         \
		else if (x->next)                                                                  \
			x->next->prev = x->prev;                                                   \
		x->prev = x->next = NULL;                                                          \
		l->n--;                                                                            \
	}                                                                                          \
	static inline node_t *prefix##_pop(list_t *l)                                              \
	{                                                                                          \
		node_t *x = l->head;                                                               \
		if (x)                                                                             \
			prefix##_del(l, x);                                                        \
		return x;                                                                          \
	}

#define EOS_FIFO_DEFINE(prefix, fifo_t, node_t, link)                                              \
	static inline void prefix##_push(fifo_t *q, node_t *x)                                     \
	{                                                                                          \
		x->link = NULL;                                                                    \
		if (q->tail)                                                                       \
			q->tail->link = x;                                                         \
		else                                                                               \
			q->head = x;                                                               \
		q->tail = x;                                                                       \
	}                                                                                          \
	static inline node_t *prefix##_pop(fifo_t *q)                                              \
	{                                                                                          \
		node_t *x = q->head;                                                               \
		if (x) {                                                                           \
			q->head = x->link;                                                         \
			if (!q->head)                                                              \
				q->tail = NULL;                                                    \
			x->link = NULL;                                                            \
		}                                                                                  \
		return x;                                                                          \
	}

#define EOS_DLIST(prefix, tag, node_t)                                                             \
	struct tag {                                                                               \
		node_t *head, *tail;                                                               \
		uint32_t n;                                                                        \
	};                                                                                         \
	EOS_DLIST_DEFINE(prefix, struct tag, node_t)

#define EOS_FIFO(prefix, tag, node_t, link)                                                        \
	struct tag {                                                                               \
		node_t *head, *tail;                                                               \
	};                                                                                         \
	EOS_FIFO_DEFINE(prefix, struct tag, node_t, link)
/* NOLINTEND(bugprone-macro-parentheses) */

#endif
