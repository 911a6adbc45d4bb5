/*
 * test_remote_slots.c - Redis Cluster slot routing, the pure half
 * (src/selene/remote_cluster.c): CRC16 and key slots against the cluster
 * specification's examples and Redis 7's CLUSTER KEYSLOT answers, hash
 * tags, MOVED / ASK error strings, CLUSTER SLOTS replies decoded by
 * hiredis's reader into a slot map, and every malformed form refused with a
 * message.
 */
#include "remote_cluster.h"
#include "remote_conn.h"
#include "testutil.h"

#include <hiredis/hiredis.h>

static uint16_t slot(const char *k) { return sel_rc_key_slot(k, strlen(k)); }

static void test_crc_and_slots(void)
{
	/* The specification's check value. */
	CHECK(sel_rc_crc16("123456789", 9) == 0x31C3);
	CHECK(sel_rc_crc16("", 0) == 0);
	/* What redis-server 7.0's CLUSTER KEYSLOT answers for these keys. */
	CHECK(slot("123456789") == 12739);
	CHECK(slot("somekey") == 11058);
	CHECK(slot("foo") == 12182);
	CHECK(slot("foo{hash_tag}") == 2515);
	CHECK(slot("") == 0);
	/* Hash tags (the specification's examples). */
	CHECK(slot("{user1000}.following") == slot("{user1000}.followers"));
	CHECK(slot("{user1000}.following") == slot("user1000"));
	CHECK(slot("{user1000}.following") == 3443);
	CHECK(slot("foo{}{bar}") ==
	      sel_rc_crc16("foo{}{bar}", 10) % 16384); /* empty tag: whole key */
	CHECK(slot("foo{}{bar}") == 8363);
	CHECK(slot("foo{{bar}}zap") == slot("{bar")); /* the tag is "{bar" */
	CHECK(slot("foo{{bar}}zap") == 4015);
	CHECK(slot("foo{bar}{zap}") == slot("bar")); /* the first tag only */
	CHECK(slot("foo{bar}{zap}") == 5061);
	CHECK(slot("foo{bar") == sel_rc_crc16("foo{bar", 7) % 16384); /* no closing brace */
	size_t off, n;
	sel_rc_hash_span("a{b}c", 5, &off, &n);
	CHECK(off == 2 && n == 1);
	sel_rc_hash_span("}{", 2, &off, &n);
	CHECK(off == 0 && n == 2);
	/* Keys with NUL bytes hash by length, not by string. */
	CHECK(sel_rc_key_slot("a\0b", 3) == sel_rc_crc16("a\0b", 3) % 16384);
	/* Every slot is below 16384 over random keys; a shared tag shares. */
	test_rng r;
	test_rng_init(&r, test_seed());
	for (int i = 0; i < 20000; i++) {
		char k[40];
		size_t len = 1 + test_rng_below(&r, sizeof k - 1);
		test_rng_fill(&r, k, len);
		CHECK(sel_rc_key_slot(k, len) < SEL_RC_SLOTS);
		char a[64], b[64];
		int la = snprintf(a, sizeof a, "x%d{tag%d}:m", i, i % 97);
		int lb = snprintf(b, sizeof b, "{tag%d}:w%d", i % 97, i);
		CHECK(sel_rc_key_slot(a, (size_t)la) == sel_rc_key_slot(b, (size_t)lb));
	}
}

static void redirect_ok(const char *text, enum sel_rc_redirect_kind kind, unsigned s,
			const char *host, unsigned port)
{
	struct sel_rc_redirect rd;
	CHECK_RC(sel_rc_redirect_parse(text, strlen(text), &rd), 1);
	CHECKF(rd.kind == kind && rd.slot == s && strcmp(rd.to.host, host) == 0 &&
		       rd.to.port == port,
	       "%s -> %d %u %s %u", text, rd.kind, rd.slot, rd.to.host, rd.to.port);
}

static void redirect_bad(const char *text, const char *msg_part)
{
	struct sel_rc_redirect rd;
	CHECK_RC(sel_rc_redirect_parse(text, strlen(text), &rd), SEL_EFORMAT);
	CHECKF(strstr(sel_errmsg(), msg_part), "'%s': message '%s' lacks '%s'", text, sel_errmsg(),
	       msg_part);
}

static void test_redirects(void)
{
	redirect_ok("MOVED 3999 127.0.0.1:6381", SEL_RC_MOVED, 3999, "127.0.0.1", 6381);
	redirect_ok("ASK 3999 127.0.0.1:6381", SEL_RC_ASK, 3999, "127.0.0.1", 6381);
	redirect_ok("MOVED 0 redis-3.example:7000", SEL_RC_MOVED, 0, "redis-3.example", 7000);
	redirect_ok("MOVED 16383 ::1:6380", SEL_RC_MOVED, 16383, "::1", 6380);
	redirect_ok("ASK 12 [fe80::1]:6380", SEL_RC_ASK, 12, "fe80::1", 6380);
	redirect_ok("MOVED 7 :6380", SEL_RC_MOVED, 7, "", 6380); /* the answering node's host */
	struct sel_rc_redirect rd;
	CHECK_RC(sel_rc_redirect_parse("MOVED 7 ?:6380", 14, &rd), 1);
	CHECK(rd.unknown_endpoint && rd.to.host[0] == '\0');
	/* Other errors are not redirects. */
	static const char *other[] = {"ERR unknown command",
				      "TRYAGAIN Multiple keys request",
				      "CLUSTERDOWN The cluster is down",
				      "MOVEDX 1 a:1",
				      "ASKING",
				      "",
				      "moved 1 a:1",
				      "OOM command not allowed"};
	for (size_t i = 0; i < sizeof other / sizeof *other; i++)
		CHECK_RC(sel_rc_redirect_parse(other[i], strlen(other[i]), &rd), 0);
	/* Malformed redirects are errors naming the text. */
	redirect_bad("MOVED 16384 a:1", "slot");
	redirect_bad("MOVED -1 a:1", "slot");
	redirect_bad("MOVED  a:1", "slot");
	redirect_bad("MOVED 1a a:1", "slot");
	redirect_bad("MOVED 12", "slot");
	redirect_bad("MOVED 12 host", "HOST:PORT");
	redirect_bad("MOVED 12 host:", "HOST:PORT");
	redirect_bad("MOVED 12 host:0", "HOST:PORT");
	redirect_bad("MOVED 12 host:65536", "HOST:PORT");
	redirect_bad("MOVED 12 host:80 extra", "HOST:PORT");
	redirect_bad("ASK 12 ho st:80", "host");
	redirect_bad("ASK 12 h\x01:80", "host");
	char big[400];
	int n = snprintf(big, sizeof big, "MOVED 1 ");
	memset(big + n, 'h', 300);
	snprintf(big + n + 300, sizeof big - (size_t)n - 300, ":80");
	redirect_bad(big, "host");
	/* A text with a NUL inside is bounded by its length. */
	CHECK_RC(sel_rc_redirect_parse("MOVED 5 a:1\0zz", 11, &rd), 1);
	CHECK(rd.to.port == 1);
	CHECK_RC(sel_rc_redirect_parse("MOVED 5 a:1\0zz", 14, &rd), SEL_EFORMAT);
}

/* Decode RESP bytes with the connections' bounded reader. */
static redisReply *decode(const char *resp, size_t len)
{
	redisReader *rd = sel_rn_reader_create();
	CHECK(rd);
	CHECK(redisReaderFeed(rd, resp, len) == REDIS_OK);
	void *rep = NULL;
	CHECK(redisReaderGetReply(rd, &rep) == REDIS_OK && rep);
	redisReaderFree(rd);
	return rep;
}

#define ID40 "$40\r\n0123456789012345678901234567890123456789\r\n"

static void test_slot_map(void)
{
	struct sel_rc_slotmap *m = malloc(sizeof *m);
	/* Redis 7's form: [start, end, [ip, port, id, {meta}], replicas...]. */
	static const char three[] =
		"*3\r\n"
		"*4\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n" ID40 "*0\r\n"
		"*4\r\n$9\r\n127.0.0.1\r\n:7003\r\n" ID40 "*0\r\n"
		"*3\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n127.0.0.1\r\n:7001\r\n" ID40
		"*2\r\n$8\r\nhostname\r\n$2\r\nh1\r\n"
		"*3\r\n:10923\r\n:16383\r\n*3\r\n$0\r\n\r\n:7002\r\n" ID40;
	redisReply *r = decode(three, sizeof three - 1);
	CHECK_OK(sel_rc_slotmap_parse(r, "10.0.0.9", m));
	CHECK_OK(sel_rc_slotmap_check(m));
	CHECK(m->n_nodes == 3 && m->assigned == SEL_RC_SLOTS);
	CHECK(strcmp(m->node[m->owner[0]].host, "127.0.0.1") == 0 &&
	      m->node[m->owner[0]].port == 7000);
	CHECK(m->node[m->owner[5460]].port == 7000 && m->node[m->owner[5461]].port == 7001);
	CHECK(m->node[m->owner[16383]].port == 7002);
	CHECK(strcmp(m->node[m->owner[16383]].host, "10.0.0.9") == 0); /* "" = the asked node */
	freeReplyObject(r);

	/* Two ranges of one master share its node; an unassigned gap stays so;
	 * "?" leaves its range unassigned. */
	static const char gaps[] = "*3\r\n"
				   "*3\r\n:0\r\n:99\r\n*2\r\n$1\r\na\r\n:1\r\n"
				   "*3\r\n:200\r\n:299\r\n*2\r\n$1\r\na\r\n:1\r\n"
				   "*3\r\n:300\r\n:399\r\n*2\r\n$1\r\n?\r\n:1\r\n";
	r = decode(gaps, sizeof gaps - 1);
	CHECK_OK(sel_rc_slotmap_parse(r, NULL, m));
	CHECK_OK(sel_rc_slotmap_check(m));
	CHECK(m->n_nodes == 1 && m->assigned == 200);
	CHECK(m->owner[150] == SEL_RC_NO_NODE && m->owner[350] == SEL_RC_NO_NODE);
	freeReplyObject(r);

	/* An empty cluster: nothing assigned, not an error. */
	r = decode("*0\r\n", 4);
	CHECK_OK(sel_rc_slotmap_parse(r, NULL, m));
	CHECK(m->assigned == 0 && m->n_nodes == 0);
	freeReplyObject(r);

	/* Malformed replies: each refused with a message naming the element. */
	static const struct {
		const char *resp, *msg;
	} bad[] = {
		{"$3\r\nfoo\r\n", "a string"},
		{"-ERR This instance has cluster support disabled\r\n", "an error"},
		{"*1\r\n:5\r\n", "range 0"},
		{"*1\r\n*2\r\n:0\r\n:1\r\n", "range 0"},
		{"*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\na\r\n:1\r\n", "start <= end"},
		{"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\na\r\n:1\r\n", "start <= end"},
		{"*1\r\n*3\r\n:-1\r\n:3\r\n*2\r\n$1\r\na\r\n:1\r\n", "start <= end"},
		{"*1\r\n*3\r\n$1\r\n0\r\n:3\r\n*2\r\n$1\r\na\r\n:1\r\n", "start <= end"},
		{"*1\r\n*3\r\n:0\r\n:3\r\n*1\r\n$1\r\na\r\n", "master"},
		{"*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n:1\r\n:1\r\n", "master"},
		{"*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\na\r\n$1\r\n1\r\n", "master"},
		{"*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\na\r\n:0\r\n", "port"},
		{"*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\na\r\n:65536\r\n", "port"},
		{"*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$3\r\na b\r\n:1\r\n", "host"},
		{"*1\r\n*3\r\n:0\r\n:3\r\n*2\r\n$0\r\n\r\n:1\r\n", "asked host"},
		{"*2\r\n*3\r\n:0\r\n:3\r\n*2\r\n$1\r\na\r\n:1\r\n*3\r\n:3\r\n:4\r\n*2\r\n$1\r\nb\r\n:1\r\n",
		 "earlier range"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		r = decode(bad[i].resp, strlen(bad[i].resp));
		CHECK_RC(sel_rc_slotmap_parse(r, NULL, m), SEL_EFORMAT);
		CHECKF(strstr(sel_errmsg(), bad[i].msg), "case %zu: '%s' lacks '%s'", i,
		       sel_errmsg(), bad[i].msg);
		freeReplyObject(r);
	}
	CHECK_RC(sel_rc_slotmap_parse(NULL, NULL, m), SEL_EFORMAT);

	/* More masters than a map holds. */
	size_t cap = 64 * (SEL_RC_NODES_MAX + 2), at = 0;
	char *big = malloc(cap);
	at += (size_t)snprintf(big, cap, "*%u\r\n", SEL_RC_NODES_MAX + 1);
	for (unsigned i = 0; i <= SEL_RC_NODES_MAX; i++)
		at += (size_t)snprintf(big + at, cap - at,
				       "*3\r\n:%u\r\n:%u\r\n*2\r\n$4\r\nnode\r\n:%u\r\n", i, i,
				       1000 + i);
	r = decode(big, at);
	CHECK_RC(sel_rc_slotmap_parse(r, NULL, m), SEL_EFORMAT);
	CHECK(strstr(sel_errmsg(), "masters"));
	freeReplyObject(r);
	free(big);

	/* The checker catches a corrupted map. */
	r = decode(three, sizeof three - 1);
	CHECK_OK(sel_rc_slotmap_parse(r, "h", m));
	freeReplyObject(r);
	m->owner[77] = 9;
	CHECK_RC(sel_rc_slotmap_check(m), SEL_EFORMAT);
	m->owner[77] = SEL_RC_NO_NODE;
	CHECK_RC(sel_rc_slotmap_check(m), SEL_EFORMAT); /* assigned no longer balances */
	free(m);
}

/* A server announcing a huge reply gets a reader error, not an abort in
 * libhiredis 0.14's allocator. */
static void test_bounded_replies(void)
{
	static const char *huge[] = {"*3999999999\r\n", "*2000000\r\n", "*1\r\n*1048577\r\n"};
	for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
		redisReader *rd = sel_rn_reader_create();
		CHECK(redisReaderFeed(rd, huge[i], strlen(huge[i])) == REDIS_OK);
		void *rep = NULL;
		CHECK(redisReaderGetReply(rd, &rep) == REDIS_ERR && !rep);
		redisReaderFree(rd);
	}
	/* The largest array allowed, and nested values, decode and free. */
	redisReader *rd = sel_rn_reader_create();
	const char *ok = "*3\r\n$3\r\nabc\r\n:-7\r\n*2\r\n$-1\r\n+OK\r\n";
	CHECK(redisReaderFeed(rd, ok, strlen(ok)) == REDIS_OK);
	void *rep = NULL;
	CHECK(redisReaderGetReply(rd, &rep) == REDIS_OK && rep);
	redisReply *r = rep;
	CHECK(r->type == REDIS_REPLY_ARRAY && r->elements == 3);
	CHECK(r->element[0]->len == 3 && strcmp(r->element[0]->str, "abc") == 0);
	CHECK(r->element[1]->integer == -7 && r->element[2]->elements == 2);
	CHECK(r->element[2]->element[0]->type == REDIS_REPLY_NIL);
	CHECK(r->element[2]->element[1]->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	redisReaderFree(rd);
}

int main(void)
{
	test_bounded_replies();
	test_crc_and_slots();
	test_redirects();
	test_slot_map();
	printf("ok\n");
	return 0;
}
