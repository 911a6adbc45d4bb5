/*
 * remote_cluster.c - Redis Cluster slot routing, the pure half: CRC16 key
 * slots with hash tags, MOVED / ASK redirects, CLUSTER SLOTS into a slot
 * map (issue 16; the Redis Cluster specification's "Keys distribution
 * model", "Hash tags", "Redirection and resharding").
 *
 * Written here because Debian 12 packages no cluster client: libhiredis
 * 0.14 speaks RESP to one server, and hiredis-cluster is not packaged.  The
 * I/O half (connections per node, following redirects, refreshing the map)
 * is remote_conn.c.
 *
 * DESIGN
 *   A key's slot is CRC16/XMODEM of its hash span mod 16384; the hash span
 *   is the text inside the first {...} when non-empty, so every key of one
 *   record, which share one tag, lands in one slot.  The parsers trust
 *   nothing they are given: every element's type is checked before use,
 *   integers are range-checked, hosts are bounded and printable, ranges
 *   may not overlap.  A malformed reply is an error naming the element,
 *   never a partial map.
 *
 * INVARIANTS
 *   1. sel_rc_key_slot(k) < 16384; keys with the same non-empty tag share
 *      a slot.
 *   2. A map that parses passes sel_rc_slotmap_check.
 *   3. A redirect that parses has slot < 16384, a port in 1..65535 and a
 *      NUL-terminated host shorter than SEL_RC_HOST_MAX.
 */
#include "remote_cluster.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "eos.h"
#include "selene.h"

uint16_t sel_rc_crc16(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint16_t crc = 0;
	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
	}
	return crc;
}

void sel_rc_hash_span(const char *key, size_t len, size_t *off, size_t *n)
{
	const char *open = memchr(key, '{', len);
	if (open) {
		size_t o = (size_t)(open - key) + 1;
		const char *close = memchr(key + o, '}', len - o);
		if (close && close > key + o) {
			*off = o;
			*n = (size_t)(close - (key + o));
			return;
		}
	}
	*off = 0;
	*n = len;
}

uint16_t sel_rc_key_slot(const char *key, size_t len)
{
	size_t off, n;
	sel_rc_hash_span(key, len, &off, &n);
	return (uint16_t)(sel_rc_crc16(key + off, n) & (SEL_RC_SLOTS - 1));
}

const char *sel_rc_addr_text(const struct sel_rc_addr *a, char *buf, size_t len)
{
	if (strchr(a->host, ':'))
		snprintf(buf, len, "[%s]:%u", a->host, a->port);
	else
		snprintf(buf, len, "%s:%u", a->host, a->port);
	return buf;
}

/* The printable excerpt of an untrusted text for a message. */
static const char *excerpt(const char *s, size_t len, char *buf, size_t cap)
{
	size_t n = 0;
	for (size_t i = 0; i < len && n + 5 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7f)
			buf[n++] = (char)c;
		else
			n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", c);
	}
	if (n >= cap)
		n = cap - 1;
	buf[n] = '\0';
	return buf;
}

static bool parse_uint(const char *s, size_t len, uint64_t max, uint64_t *out)
{
	if (len == 0 || len > 20)
		return false;
	uint64_t v = 0;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
		if (v > max)
			return false;
	}
	*out = v;
	return true;
}

/* Host text: printable, no spaces, short enough; brackets around an IPv6
 * address are dropped. */
static bool copy_host(const char *s, size_t len, char out[SEL_RC_HOST_MAX])
{
	if (len >= 2 && s[0] == '[' && s[len - 1] == ']') {
		s++;
		len -= 2;
	}
	if (len >= SEL_RC_HOST_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f || s[i] == '[' ||
		    s[i] == ']')
			return false;
	memcpy(out, s, len);
	out[len] = '\0';
	return true;
}

int sel_rc_redirect_parse(const char *text, size_t len, struct sel_rc_redirect *out)
{
	char ex[160];
	enum sel_rc_redirect_kind kind;
	size_t w;
	if (len >= 6 && memcmp(text, "MOVED ", 6) == 0) {
		kind = SEL_RC_MOVED;
		w = 6;
	} else if (len >= 4 && memcmp(text, "ASK ", 4) == 0) {
		kind = SEL_RC_ASK;
		w = 4;
	} else {
		return 0;
	}
	const char *s = text + w, *end = text + len;
	const char *sp = memchr(s, ' ', (size_t)(end - s));
	uint64_t slot, port;
	if (!sp || !parse_uint(s, (size_t)(sp - s), SEL_RC_SLOTS - 1, &slot))
		return eos_fail(SEL_EFORMAT, "redirect '%s': expected a slot 0..16383 after %s",
				excerpt(text, len, ex, sizeof ex),
				kind == SEL_RC_MOVED ? "MOVED" : "ASK");
	const char *addr = sp + 1;
	const char *colon = NULL;
	for (const char *p = end; p > addr; p--)
		if (p[-1] == ':') {
			colon = p - 1;
			break;
		}
	if (!colon || !parse_uint(colon + 1, (size_t)(end - colon - 1), 65535, &port) || port == 0)
		return eos_fail(SEL_EFORMAT,
				"redirect '%s': expected HOST:PORT with a port 1..65535",
				excerpt(text, len, ex, sizeof ex));
	memset(out, 0, sizeof *out);
	if (!copy_host(addr, (size_t)(colon - addr), out->to.host))
		return eos_fail(SEL_EFORMAT,
				"redirect '%s': the host is not a printable name of "
				"fewer than %u bytes",
				excerpt(text, len, ex, sizeof ex), SEL_RC_HOST_MAX);
	out->kind = kind;
	out->slot = (uint16_t)slot;
	out->to.port = (uint16_t)port;
	if (strcmp(out->to.host, "?") == 0) {
		out->unknown_endpoint = 1;
		out->to.host[0] = '\0';
	}
	return 1;
}

int sel_rc_slotmap_node(struct sel_rc_slotmap *map, const struct sel_rc_addr *addr)
{
	for (uint32_t i = 0; i < map->n_nodes; i++)
		if (map->node[i].port == addr->port && strcmp(map->node[i].host, addr->host) == 0)
			return (int)i;
	if (map->n_nodes >= SEL_RC_NODES_MAX)
		return -ENOSPC;
	map->node[map->n_nodes] = *addr;
	return (int)map->n_nodes++;
}

static const char *type_name(int t)
{
	switch (t) {
	case REDIS_REPLY_STRING: return "a string";
	case REDIS_REPLY_ARRAY: return "an array";
	case REDIS_REPLY_INTEGER: return "an integer";
	case REDIS_REPLY_NIL: return "nil";
	case REDIS_REPLY_STATUS: return "a status";
	case REDIS_REPLY_ERROR: return "an error";
	default: return "an unknown type";
	}
}

int sel_rc_slotmap_parse(const redisReply *reply, const char *asked_host,
			 struct sel_rc_slotmap *out)
{
	memset(out, 0, sizeof *out);
	for (uint32_t s = 0; s < SEL_RC_SLOTS; s++)
		out->owner[s] = SEL_RC_NO_NODE;
	if (!reply || reply->type != REDIS_REPLY_ARRAY)
		return eos_fail(SEL_EFORMAT, "CLUSTER SLOTS: the reply is %s, expected an array",
				reply ? type_name(reply->type) : "missing");
	for (size_t i = 0; i < reply->elements; i++) {
		const redisReply *r = reply->element[i];
		if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3)
			return eos_fail(SEL_EFORMAT,
					"CLUSTER SLOTS: range %zu is %s, expected an "
					"array [start, end, master, ...]",
					i, r ? type_name(r->type) : "missing");
		const redisReply *a = r->element[0], *b = r->element[1], *m = r->element[2];
		if (!a || !b || a->type != REDIS_REPLY_INTEGER || b->type != REDIS_REPLY_INTEGER ||
		    a->integer < 0 || b->integer < a->integer ||
		    b->integer >= (long long)SEL_RC_SLOTS)
			return eos_fail(SEL_EFORMAT,
					"CLUSTER SLOTS: range %zu does not start with "
					"two slots start <= end in 0..16383",
					i);
		if (!m || m->type != REDIS_REPLY_ARRAY || m->elements < 2 || !m->element[0] ||
		    !m->element[1] || m->element[0]->type != REDIS_REPLY_STRING ||
		    m->element[1]->type != REDIS_REPLY_INTEGER)
			return eos_fail(SEL_EFORMAT,
					"CLUSTER SLOTS: range %zu: the master is not "
					"[host, port, ...]",
					i);
		const redisReply *h = m->element[0];
		long long port = m->element[1]->integer;
		if (port < 1 || port > 65535)
			return eos_fail(SEL_EFORMAT,
					"CLUSTER SLOTS: range %zu: master port %lld, "
					"expected 1..65535",
					i, port);
		struct sel_rc_addr addr = {.port = (uint16_t)port};
		if (!copy_host(h->str, h->len, addr.host))
			return eos_fail(SEL_EFORMAT,
					"CLUSTER SLOTS: range %zu: the master host is "
					"not a printable name of fewer than %u bytes",
					i, SEL_RC_HOST_MAX);
		for (long long s = a->integer; s <= b->integer; s++)
			if (out->owner[s] != SEL_RC_NO_NODE)
				return eos_fail(SEL_EFORMAT,
						"CLUSTER SLOTS: range %zu: slot %lld is "
						"in an earlier range too",
						i, s);
		if (strcmp(addr.host, "?") == 0)
			continue; /* no endpoint: these slots stay unassigned */
		if (!addr.host[0]) {
			if (!asked_host || !copy_host(asked_host, strlen(asked_host), addr.host))
				return eos_fail(SEL_EFORMAT,
						"CLUSTER SLOTS: range %zu: an empty "
						"master host and no asked host",
						i);
		}
		int idx = sel_rc_slotmap_node(out, &addr);
		if (idx < 0)
			return eos_fail(SEL_EFORMAT, "CLUSTER SLOTS: more than %u masters",
					SEL_RC_NODES_MAX);
		for (long long s = a->integer; s <= b->integer; s++)
			out->owner[s] = (uint16_t)idx;
		out->assigned += (uint32_t)(b->integer - a->integer + 1);
	}
	return 0;
}

int sel_rc_slotmap_check(const struct sel_rc_slotmap *map)
{
	if (map->n_nodes > SEL_RC_NODES_MAX)
		return eos_fail(SEL_EFORMAT, "slot map: %u nodes", map->n_nodes);
	uint32_t assigned = 0;
	for (uint32_t s = 0; s < SEL_RC_SLOTS; s++) {
		if (map->owner[s] == SEL_RC_NO_NODE)
			continue;
		if (map->owner[s] >= map->n_nodes)
			return eos_fail(SEL_EFORMAT, "slot map: slot %u owned by node %u of %u", s,
					map->owner[s], map->n_nodes);
		assigned++;
	}
	if (assigned != map->assigned)
		return eos_fail(SEL_EFORMAT, "slot map: %u slots owned, %u counted", assigned,
				map->assigned);
	for (uint32_t i = 0; i < map->n_nodes; i++)
		if (!map->node[i].port || !memchr(map->node[i].host, '\0', SEL_RC_HOST_MAX))
			return eos_fail(SEL_EFORMAT, "slot map: node %u has no port or host", i);
	return 0;
}
