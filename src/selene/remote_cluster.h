/*
 * remote_cluster.h - Redis Cluster slot routing, the pure half: key slots
 * (CRC16 of the hash tag), MOVED / ASK error replies and CLUSTER SLOTS
 * replies parsed into a slot map (issue 16, design 2.15's remote level).
 *
 * Ours because Debian 12 packages no Redis Cluster client (libhiredis 0.14
 * speaks RESP to one server; hiredis-cluster is not in Debian).  Nothing
 * here does I/O: remote_conn.c routes commands with it, and
 * tests/test_remote_slots.c and fuzz/fuzz_remote.c call it directly.
 *
 * Internal to libselene.
 */
#ifndef SEL_REMOTE_CLUSTER_H
#define SEL_REMOTE_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#define SEL_RC_SLOTS 16384u
#define SEL_RC_HOST_MAX 256u   /* host text, NUL included (DNS names are <= 253) */
#define SEL_RC_NODES_MAX 256u  /* distinct masters one slot map may name */
#define SEL_RC_NO_NODE 0xffffu /* slot owner: unassigned */

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection,
 * no final xor.  The cluster specification's check value: "123456789" ->
 * 0x31C3. */
uint16_t sel_rc_crc16(const void *buf, size_t len);

/* The bytes of key that a cluster hashes: the text between the first '{'
 * and the first '}' after it when that is non-empty, else the whole key.
 * *off and *n receive the span. */
void sel_rc_hash_span(const char *key, size_t len, size_t *off, size_t *n);

/* The slot of a key: crc16(hash span) mod 16384. */
uint16_t sel_rc_key_slot(const char *key, size_t len);

/* A node address: host text (IPv4, IPv6 without brackets, or a name) and a
 * port. */
struct sel_rc_addr {
	char host[SEL_RC_HOST_MAX];
	uint16_t port;
};

/* "host:port" (IPv6 hosts in brackets) into buf; returns buf. */
const char *sel_rc_addr_text(const struct sel_rc_addr *a, char *buf, size_t len);

/* An error reply that redirects a command (the reply's text without the
 * leading '-'). */
enum sel_rc_redirect_kind {
	SEL_RC_MOVED = 1, /* the slot moved for good: update the map */
	SEL_RC_ASK = 2,   /* this command only: ASKING, then the command, there */
};
struct sel_rc_redirect {
	enum sel_rc_redirect_kind kind;
	uint16_t slot;
	struct sel_rc_addr to; /* host "" = the host of the node that answered */
	int unknown_endpoint;  /* host was "?": the node has no endpoint to give */
};
/* Parse "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>": the
 * port is the text after the last ':', so IPv6 hosts ("::1:6380", with or
 * without brackets) work; an empty host means the answering node's host.
 * Returns 1 with *out filled, 0 when text is another error (no MOVED / ASK
 * word), or SEL_EFORMAT with a message naming the text when it starts with
 * MOVED or ASK but is malformed (slot beyond 16383, no port, port 0 or
 * beyond 65535, a host that is too long or holds control bytes, trailing
 * text). */
int sel_rc_redirect_parse(const char *text, size_t len, struct sel_rc_redirect *out);

/* The owner of each slot among a list of masters. */
struct sel_rc_slotmap {
	uint16_t owner[SEL_RC_SLOTS]; /* index into node[], or SEL_RC_NO_NODE */
	uint32_t n_nodes;
	struct sel_rc_addr node[SEL_RC_NODES_MAX];
	uint32_t assigned; /* slots with an owner */
};

/* Parse a CLUSTER SLOTS reply, as hiredis decodes it, into *out: an array
 * of ranges [start, end, master, replica...], where each node is [host,
 * port, (id, (metadata))].  Only masters are routed.  A master whose host
 * is "" is the node that was asked (asked_host); "?" (no known endpoint)
 * leaves its slots unassigned.  Ranges must lie in 0..16383, start <= end,
 * and not overlap; ports 1..65535; at most SEL_RC_NODES_MAX masters.
 * Returns 0, or SEL_EFORMAT with a message naming the first bad element
 * (*out is then undefined).  An empty reply (a cluster with no slots) is a
 * valid map with nothing assigned. */
int sel_rc_slotmap_parse(const redisReply *reply, const char *asked_host,
			 struct sel_rc_slotmap *out);

/* Index of addr in map->node[] (host compared as text), adding it when
 * absent.  Returns the index, or -ENOSPC when the map is full. */
int sel_rc_slotmap_node(struct sel_rc_slotmap *map, const struct sel_rc_addr *addr);

/* Invariants: every owner is SEL_RC_NO_NODE or < n_nodes, assigned counts
 * the owned slots, node ports are non-zero and hosts NUL-terminated.
 * 0 or SEL_EFORMAT with a message. */
int sel_rc_slotmap_check(const struct sel_rc_slotmap *map);

#endif
