/*
 * remote_url.c - parse and print the remote tier's URL (issue 16: redis://,
 * unix://, redis-cluster://).  Pure: no resolution, no I/O;
 * fuzz/fuzz_remote.c checks that every URL that parses prints back to a
 * text that parses to the same value.
 *
 * DESIGN
 *   One pass over the text with explicit expectations, so every error
 *   names the text and the part that is wrong.  Hosts are checked for
 *   shape only (name characters, or an IPv6 literal in brackets); whether
 *   they resolve is for the connection to find out.
 *
 * INVARIANTS
 *   1. parse(format(u)) == u for every u that parse produced.
 *   2. A parsed URL has kind set, 1 <= n <= SEL_RU_SEEDS_MAX seeds with
 *      ports 1..65535 for TCP and CLUSTER, an absolute NUL-terminated path
 *      for UNIX.
 */
#include "remote_url.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "eos.h"
#include "selene.h"

#define EXPECTED                                                                                   \
	"expected redis://HOST[:PORT][/DB], unix:///PATH or "                                      \
	"redis-cluster://HOST[:PORT][,HOST[:PORT]...]"

static bool name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '-' || c == '_';
}

static bool v6_char(char c)
{
	return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || (c >= '0' && c <= '9') ||
	       c == ':' || c == '.' || c == '%';
}

/* Parse one HOST[:PORT] from s[0..len). */
static int parse_addr(const char *url, const char *s, size_t len, struct sel_rc_addr *out)
{
	size_t i = 0, hl;
	const char *h;
	if (len && s[0] == '[') {
		const char *close = memchr(s, ']', len);
		if (!close)
			return eos_fail(SEL_EFORMAT,
					"remote URL '%s': '[' without ']' around an "
					"IPv6 address",
					url);
		h = s + 1;
		hl = (size_t)(close - h);
		const char *zone = memchr(h, '%', hl); /* fe80::1%eth0: a zone names an interface */
		for (size_t k = 0; k < hl; k++)
			if (zone && h + k > zone ? !name_char(h[k]) : !v6_char(h[k]))
				return eos_fail(SEL_EFORMAT,
						"remote URL '%s': '%.*s' is not an IPv6 "
						"address",
						url, (int)hl, h);
		if (!memchr(h, ':', hl))
			return eos_fail(SEL_EFORMAT,
					"remote URL '%s': '%.*s' in brackets is not "
					"an IPv6 address",
					url, (int)hl, h);
		i = (size_t)(close - s) + 1;
	} else {
		h = s;
		while (i < len && s[i] != ':')
			i++;
		hl = i;
		for (size_t k = 0; k < hl; k++)
			if (!name_char(h[k]))
				return eos_fail(SEL_EFORMAT,
						"remote URL '%s': host '%.*s' has a '%c' "
						"(expected a name, an IPv4 address or [IPv6])",
						url, (int)hl, h,
						h[k] >= 0x20 && h[k] < 0x7f ? h[k] : '?');
	}
	if (hl == 0)
		return eos_fail(SEL_EFORMAT, "remote URL '%s': empty host (%s)", url, EXPECTED);
	if (hl >= SEL_RC_HOST_MAX)
		return eos_fail(SEL_EFORMAT, "remote URL '%s': host of %zu bytes (at most %u)", url,
				hl, SEL_RC_HOST_MAX - 1);
	memcpy(out->host, h, hl);
	out->host[hl] = '\0';
	out->port = SEL_RU_DEFAULT_PORT;
	if (i == len)
		return 0;
	if (s[i] != ':')
		return eos_fail(SEL_EFORMAT, "remote URL '%s': unexpected '%.*s' after the host",
				url, (int)(len - i), s + i);
	const char *p = s + i + 1;
	size_t pl = len - i - 1;
	unsigned long v = 0;
	if (pl == 0 || pl > 5)
		return eos_fail(SEL_EFORMAT, "remote URL '%s': port '%.*s' is not in 1..65535", url,
				(int)pl, p);
	for (size_t k = 0; k < pl; k++) {
		if (p[k] < '0' || p[k] > '9')
			return eos_fail(SEL_EFORMAT,
					"remote URL '%s': port '%.*s' is not in 1..65535", url,
					(int)pl, p);
		v = v * 10 + (unsigned long)(p[k] - '0');
	}
	if (v < 1 || v > 65535)
		return eos_fail(SEL_EFORMAT, "remote URL '%s': port '%.*s' is not in 1..65535", url,
				(int)pl, p);
	out->port = (uint16_t)v;
	return 0;
}

static int no_extras(const char *url, const char *rest, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		if (rest[i] == '@')
			return eos_fail(SEL_EFORMAT,
					"remote URL '%s': user names and passwords are "
					"not supported (Redis AUTH)",
					url);
		if (rest[i] == '?' || rest[i] == '#')
			return eos_fail(SEL_EFORMAT,
					"remote URL '%s': '%c' options are not "
					"supported (%s)",
					url, rest[i], EXPECTED);
	}
	return 0;
}

static int parse_tcp(const char *url, const char *s, struct sel_ru_url *u)
{
	size_t len = strlen(s);
	int rc = no_extras(url, s, len);
	if (rc)
		return rc;
	/* The first '/' outside brackets starts the DB. */
	size_t hp = 0;
	bool in_br = false;
	while (hp < len && (in_br || s[hp] != '/')) {
		if (s[hp] == '[')
			in_br = true;
		else if (s[hp] == ']')
			in_br = false;
		hp++;
	}
	if ((rc = parse_addr(url, s, hp, &u->seed[0])))
		return rc;
	u->n = 1;
	if (hp == len)
		return 0;
	const char *d = s + hp + 1;
	size_t dl = len - hp - 1;
	uint64_t v = 0;
	if (dl == 0 || dl > 9)
		return eos_fail(SEL_EFORMAT,
				"remote URL '%s': database '%s' is not a number "
				"0..999999999",
				url, d);
	for (size_t k = 0; k < dl; k++) {
		if (d[k] < '0' || d[k] > '9')
			return eos_fail(SEL_EFORMAT,
					"remote URL '%s': database '%s' is not a number "
					"0..999999999",
					url, d);
		v = v * 10 + (uint64_t)(d[k] - '0');
	}
	u->db = (uint32_t)v;
	return 0;
}

static int parse_cluster(const char *url, const char *s, struct sel_ru_url *u)
{
	size_t len = strlen(s);
	int rc = no_extras(url, s, len);
	if (rc)
		return rc;
	if (memchr(s, '/', len))
		return eos_fail(SEL_EFORMAT,
				"remote URL '%s': a cluster has no databases (a '/' "
				"after the nodes)",
				url);
	size_t i = 0;
	for (;;) {
		const char *c = memchr(s + i, ',', len - i);
		size_t end = c ? (size_t)(c - s) : len;
		if (u->n == SEL_RU_SEEDS_MAX)
			return eos_fail(SEL_EFORMAT, "remote URL '%s': more than %d seed nodes",
					url, SEL_RU_SEEDS_MAX);
		if ((rc = parse_addr(url, s + i, end - i, &u->seed[u->n])))
			return rc;
		u->n++;
		if (!c)
			break;
		i = end + 1;
	}
	return 0;
}

static int parse_unix(const char *url, const char *s, struct sel_ru_url *u)
{
	size_t len = strlen(s);
	if (len < 2 || s[0] != '/')
		return eos_fail(SEL_EFORMAT,
				"remote URL '%s': expected unix:///PATH with an "
				"absolute path",
				url);
	if (len >= SEL_RU_PATH_MAX)
		return eos_fail(SEL_EFORMAT,
				"remote URL '%s': a socket path of %zu bytes (at most "
				"%d)",
				url, len, SEL_RU_PATH_MAX - 1);
	memcpy(u->path, s, len + 1);
	return 0;
}

int sel_ru_parse(const char *text, struct sel_ru_url *out)
{
	struct sel_ru_url u;
	memset(&u, 0, sizeof u);
	if (!text || !*text)
		return eos_fail(SEL_EFORMAT, "remote URL '': %s", EXPECTED);
	char url[192];
	snprintf(url, sizeof url, "%s", text); /* quoted in messages, cut */
	for (const char *p = text; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f) {
			for (char *q = url; *q; q++)
				if ((unsigned char)*q < 0x20 || *q == 0x7f)
					*q = '?';
			return eos_fail(SEL_EFORMAT,
					"remote URL '%s': a control byte at offset %zu", url,
					(size_t)(p - text));
		}
	int rc;
	if (strncmp(text, "redis://", 8) == 0) {
		u.kind = SEL_RU_TCP;
		rc = parse_tcp(url, text + 8, &u);
	} else if (strncmp(text, "redis-cluster://", 16) == 0) {
		u.kind = SEL_RU_CLUSTER;
		rc = parse_cluster(url, text + 16, &u);
	} else if (strncmp(text, "unix://", 7) == 0) {
		u.kind = SEL_RU_UNIX;
		rc = parse_unix(url, text + 7, &u);
	} else if (strncmp(text, "rediss://", 9) == 0) {
		rc = eos_fail(SEL_EFORMAT, "remote URL '%s': TLS (rediss://) is not supported",
			      url);
	} else {
		rc = eos_fail(SEL_EFORMAT, "remote URL '%s': unknown scheme (%s)", url, EXPECTED);
	}
	if (rc)
		return rc;
	*out = u;
	return 0;
}

int sel_ru_format(const struct sel_ru_url *u, char *buf, size_t len)
{
	size_t at = 0;
	int n;
	const char *scheme = u->kind == SEL_RU_TCP       ? "redis://"
			     : u->kind == SEL_RU_CLUSTER ? "redis-cluster://"
							 : "unix://";
	n = snprintf(buf, len, "%s", scheme);
	if (n < 0 || (size_t)n >= len)
		return -ENOBUFS;
	at = (size_t)n;
	if (u->kind == SEL_RU_UNIX) {
		n = snprintf(buf + at, len - at, "%s", u->path);
		if (n < 0 || (size_t)n >= len - at)
			return -ENOBUFS;
		return (int)(at + (size_t)n);
	}
	for (uint32_t i = 0; i < u->n; i++) {
		if (i) {
			if (at + 1 >= len)
				return -ENOBUFS;
			buf[at++] = ',';
			buf[at] = '\0';
		}
		char a[SEL_RC_HOST_MAX + 16];
		sel_rc_addr_text(&u->seed[i], a, sizeof a);
		n = snprintf(buf + at, len - at, "%s", a);
		if (n < 0 || (size_t)n >= len - at)
			return -ENOBUFS;
		at += (size_t)n;
	}
	if (u->kind == SEL_RU_TCP && u->db) {
		n = snprintf(buf + at, len - at, "/%u", u->db);
		if (n < 0 || (size_t)n >= len - at)
			return -ENOBUFS;
		at += (size_t)n;
	}
	return (int)at;
}
