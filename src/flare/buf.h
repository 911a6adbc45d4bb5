/*
 * buf.h - a growable byte buffer for the flare front end's text output
 * (JSON bodies, SSE frames, Prometheus text, the dashboard line).
 *
 * A failed allocation latches: every later append is a no-op and
 * flare_buf_failed() reports it, so builders append freely and check once.
 * The contents are always NUL-terminated (when data is non-NULL).
 */
#ifndef FLARE_BUF_H
#define FLARE_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct flare_buf {
	char *data;
	size_t len, cap;
	bool failed;
};

void flare_buf_append(struct flare_buf *b, const void *p, size_t n);
/* Room for extra more bytes (and the NUL) without another allocation;
 * capacity grows by doubling from 256.  false after a failed allocation. */
bool flare_buf_reserve(struct flare_buf *b, size_t extra);
static inline void flare_buf_puts(struct flare_buf *b, const char *s)
{
	flare_buf_append(b, s, strlen(s));
}
void flare_buf_printf(struct flare_buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Drop the first n bytes. */
void flare_buf_consume(struct flare_buf *b, size_t n);
void flare_buf_reset(struct flare_buf *b);
/* Hand the bytes to the caller (malloc'd, NUL-terminated; NULL after a
 * failed allocation) and leave the buffer empty. */
char *flare_buf_take(struct flare_buf *b, size_t *len);
void flare_buf_free(struct flare_buf *b);
static inline bool flare_buf_failed(const struct flare_buf *b) { return b->failed; }

#endif
