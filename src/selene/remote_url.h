/*
 * remote_url.h - the remote tier's address (issue 16, --prefix-cache-remote
 * URL), parsed by a pure function.
 *
 *   redis://HOST[:PORT][/DB]                 one server; PORT defaults to 6379,
 *                                            DB (SELECT) to 0
 *   unix:///PATH                             one server on a Unix socket
 *   redis-cluster://HOST[:PORT][,HOST[:PORT]...]   seed nodes of a cluster
 *
 * HOST is a name, an IPv4 address or an IPv6 address in brackets.  Nothing
 * else is accepted: no user or password (Redis AUTH is not supported yet),
 * no query, no fragment, no trailing text.
 *
 * Internal to libselene.
 */
#ifndef SEL_REMOTE_URL_H
#define SEL_REMOTE_URL_H

#include <stddef.h>
#include <stdint.h>

#include "remote_cluster.h"

#define SEL_RU_SEEDS_MAX 16
#define SEL_RU_PATH_MAX 108 /* sun_path, NUL included */
#define SEL_RU_DEFAULT_PORT 6379
#define SEL_RU_TEXT_MAX (SEL_RU_SEEDS_MAX * (SEL_RC_HOST_MAX + 8) + 32)

enum sel_ru_kind {
	SEL_RU_TCP = 1,     /* redis:// */
	SEL_RU_UNIX = 2,    /* unix:// */
	SEL_RU_CLUSTER = 3, /* redis-cluster:// */
};

struct sel_ru_url {
	enum sel_ru_kind kind;
	uint32_t n; /* seeds (TCP: 1, UNIX: 0) */
	struct sel_rc_addr seed[SEL_RU_SEEDS_MAX];
	char path[SEL_RU_PATH_MAX]; /* UNIX */
	uint32_t db;                /* TCP */
};

/* Parse text.  0, or SEL_EFORMAT with a message that quotes the text and
 * says what was expected ("remote URL 'redis://h:0': port '0' is not in
 * 1..65535").  *out is written only on success. */
int sel_ru_parse(const char *text, struct sel_ru_url *out);

/* The canonical text of u (ports always written, IPv6 in brackets, a DB
 * only when non-zero) into buf; parsing it gives u back.  Returns the
 * length, or -ENOBUFS when buf is too small (SEL_RU_TEXT_MAX always
 * suffices). */
int sel_ru_format(const struct sel_ru_url *u, char *buf, size_t len);

#endif
