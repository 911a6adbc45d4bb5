/*
 * remote_resp.c - the remote tier's RESP messages (issue 16): the bounded
 * reply builders every connection's reader uses, and the commands the
 * client builds -- formatted by libhiredis, raw bytes, or segments that
 * point into the caller's pages (remote_conn.h).
 *
 * DESIGN
 *
 * Pure code, no I/O: a reply is parsed by libhiredis's reader into
 * redisReply objects our builders allocate, so a hostile server cannot
 * make hiredis allocate (and abort on) billions of elements; a command
 * owns its buffer (freed by the function it was given) and its segment
 * array.
 *
 * INVARIANTS
 *   1. No reply object holds more than SEL_RN_REPLY_ELEMENTS_MAX elements
 *      or a string longer than SEL_RN_REPLY_STRING_MAX bytes.
 *   2. A command that could not be made frees what it was given.
 */
#include "remote_conn.h"

#include <stdlib.h>
#include <string.h>

/* ---- Replies, bounded ---------------------------------------------------- */

/* libhiredis 0.14 allocates a multi-bulk reply's element array as soon as
 * it reads "*<count>", and aborts the process when that fails; a server
 * could announce billions.  Our reply builders -- hiredis's documented
 * extension point, building the same redisReply objects that
 * freeReplyObject frees -- refuse more than SEL_RN_REPLY_ELEMENTS_MAX elements
 * and strings beyond SEL_RN_REPLY_STRING_MAX, which the reader reports as an
 * error (the connection is then closed).  conn_read (remote_conn.c) also
 * bounds the bytes a reply may have buffered before it completes. */

static void *reply_new(const redisReadTask *task, int type)
{
	redisReply *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->type = type;
	if (task->parent) {
		redisReply *parent = task->parent->obj;
		if (parent->type != REDIS_REPLY_ARRAY || task->idx < 0 ||
		    (size_t)task->idx >= parent->elements) {
			free(r);
			return NULL;
		}
		parent->element[task->idx] = r;
	}
	return r;
}

static void *reply_string(const redisReadTask *task, char *str, size_t len)
{
	if (len > SEL_RN_REPLY_STRING_MAX)
		return NULL;
	char *buf = malloc(len + 1);
	if (!buf)
		return NULL;
	redisReply *r = reply_new(task, task->type);
	if (!r) {
		free(buf);
		return NULL;
	}
	memcpy(buf, str, len);
	buf[len] = '\0';
	r->str = buf;
	r->len = len;
	return r;
}

static void *reply_array(const redisReadTask *task, int elements)
{
	if (elements < 0 || elements > SEL_RN_REPLY_ELEMENTS_MAX)
		return NULL;
	redisReply **el = NULL;
	if (elements > 0 && !(el = calloc((size_t)elements, sizeof(redisReply *))))
		return NULL;
	redisReply *r = reply_new(task, REDIS_REPLY_ARRAY);
	if (!r) {
		free(el);
		return NULL;
	}
	r->element = el;
	r->elements = (size_t)elements;
	return r;
}

static void *reply_integer(const redisReadTask *task, long long value)
{
	redisReply *r = reply_new(task, REDIS_REPLY_INTEGER);
	if (r)
		r->integer = value;
	return r;
}

static void *reply_nil(const redisReadTask *task) { return reply_new(task, REDIS_REPLY_NIL); }

static redisReplyObjectFunctions bounded_replies = {
	reply_string, reply_array, reply_integer, reply_nil, freeReplyObject,
};

void sel_rn_reader_bound(redisReader *r) { r->fn = &bounded_replies; }

redisReader *sel_rn_reader_create(void) { return redisReaderCreateWithFunctions(&bounded_replies); }

/* ---- Commands ------------------------------------------------------------ */

static void free_formatted(void *ctx, char *buf)
{
	(void)ctx;
	redisFreeCommand(buf);
}

struct sel_rn_cmd *sel_rn_cmd_argv(int argc, const char **argv, const size_t *argvlen)
{
	char *buf = NULL;
	int len = redisFormatCommandArgv(&buf, argc, argv, argvlen);
	if (len < 0)
		return NULL;
	struct sel_rn_cmd *c = sel_rn_cmd_raw(buf, (size_t)len, free_formatted, NULL);
	return c;
}

struct sel_rn_cmd *sel_rn_cmd_raw(char *buf, size_t len, void (*free_buf)(void *, char *),
				  void *ctx)
{
	struct sel_rn_cmd *c = calloc(1, sizeof *c);
	if (!c) {
		if (free_buf)
			free_buf(ctx, buf);
		else
			free(buf);
		return NULL;
	}
	c->buf = buf;
	c->len = len;
	c->free_buf = free_buf;
	c->free_ctx = ctx;
	c->slot = -1;
	return c;
}

struct sel_rn_cmd *sel_rn_cmd_segs(struct iovec *seg, uint32_t nseg, char *buf,
				   void (*free_buf)(void *, char *), void *ctx)
{
	size_t len = 0;
	for (uint32_t i = 0; i < nseg; i++)
		len += seg[i].iov_len;
	struct sel_rn_cmd *c = sel_rn_cmd_raw(buf, len, free_buf, ctx);
	if (!c) {
		free(seg);
		return NULL;
	}
	c->seg = seg;
	c->nseg = nseg;
	return c;
}
