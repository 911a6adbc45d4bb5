/*
 * buf.c - the growable byte buffer of buf.h.
 *
 * Invariants: len < cap whenever data is non-NULL (room for the NUL);
 * failed never clears except through flare_buf_free/reset.
 */
#include "flare/buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool flare_buf_reserve(struct flare_buf *b, size_t extra)
{
	if (b->failed)
		return false;
	if (extra > (size_t)-1 / 2 - b->len) {
		b->failed = true;
		return false;
	}
	size_t need = b->len + extra + 1;
	if (need <= b->cap && b->data) /* data is NULL only while cap is 0 */
		return true;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap *= 2;
	char *p = realloc(b->data, cap);
	if (!p) {
		b->failed = true;
		return false;
	}
	b->data = p;
	b->cap = cap;
	return true;
}

void flare_buf_append(struct flare_buf *b, const void *p, size_t n)
{
	if (!flare_buf_reserve(b, n))
		return;
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = '\0';
}

void flare_buf_printf(struct flare_buf *b, const char *fmt, ...)
{
	char small[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->failed = true;
		return;
	}
	if ((size_t)n < sizeof small) {
		flare_buf_append(b, small, (size_t)n);
		return;
	}
	if (!flare_buf_reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

void flare_buf_consume(struct flare_buf *b, size_t n)
{
	if (n >= b->len) {
		b->len = 0;
	} else {
		memmove(b->data, b->data + n, b->len - n);
		b->len -= n;
	}
	if (b->data)
		b->data[b->len] = '\0';
}

void flare_buf_reset(struct flare_buf *b)
{
	b->len = 0;
	b->failed = false;
	if (b->data)
		b->data[0] = '\0';
}

char *flare_buf_take(struct flare_buf *b, size_t *len)
{
	char *p = NULL;
	if (!b->failed) {
		if (!b->data)
			flare_buf_reserve(b, 0);
		if (!b->failed) {
			b->data[b->len] = '\0';
			p = b->data;
			if (len)
				*len = b->len;
			b->data = NULL;
		}
	}
	flare_buf_free(b);
	return p;
}

void flare_buf_free(struct flare_buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
	b->failed = false;
}
