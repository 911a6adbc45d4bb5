/*
 * test_remote_cluster.c - the remote tier on a real three-master Redis
 * Cluster made with redis-cli --cluster create (issue 16): records spread
 * over every master and claimed byte-exact through one seed; a slot
 * migrated under traffic (ASK while keys are half moved, MOVED after the
 * slot changes owner); a master killed during a claim (the claim fails,
 * the other masters keep serving, the restarted master rejoins empty:
 * misses, then serves again).
 * Exits 77 without redis-server.
 */
#include "redisfx.h"
#include "remote_cluster.h"
#include "remote_value.h"
#include "testutil.h"

#include <poll.h>

#define SEC 1000000000ull

enum {
	NODES = 3,
	RECS = 24
};

static char *dir;
static struct rfx_server node[NODES];
static struct rfx_ns t;
static sel_history hist[RECS];
static struct rfx_rec rec[RECS];
static struct sel_rv_names names;

/* The master holding slot s (by its keys). */
static int owner_of(int slot)
{
	for (int i = 0; i < NODES; i++)
		if (node[i].pid && rfx_int(&node[i], "CLUSTER COUNTKEYSINSLOT %d", slot) > 0)
			return i;
	return -1;
}

static int slot_of_rec(int i)
{
	char k[SEL_RV_NAME_MAX];
	int kl = sel_rv_manifest_name(&names, &rec[i].d.key, k);
	return sel_rc_key_slot(k, (size_t)kl);
}

static int bucket_slot_of_rec(int i)
{
	char k[SEL_RV_NAME_MAX];
	int kl = sel_rv_bucket_name(&names, &rec[i].d.bucket, k);
	return sel_rc_key_slot(k, (size_t)kl);
}

static void hit_and_claim(sel_remote *r, int i)
{
	struct sel_remote_event ev = rfx_lookup(r, &hist[i], 0, 1100);
	char err[256];
	sel_remote_last_error(r, err, sizeof err);
	CHECKF(ev.result == SEL_REMOTE_HIT, "record %d: lookup %d error %d (%s)", i, ev.result,
	       ev.error, err);
	CHECK(sel_key_eq(&ev.hit->key, &rec[i].d.key));
	int rc = rfx_claim_check(r, ev.hit);
	CHECKF(rc == 0, "record %d: claim %d (%s)", i, rc, sel_strerror(rc));
}

static void wait_nodes_up(sel_remote *r, uint32_t want)
{
	uint64_t deadline = eos_now_ns() + 30 * SEC;
	for (;;) {
		struct sel_remote_stats st;
		sel_remote_stats(r, &st);
		if (st.state == SEL_RN_UP && st.nodes == want && st.nodes_up == want)
			return;
		CHECKF(eos_now_ns() < deadline, "cluster client: %s, %u of %u nodes up",
		       sel_remote_state_name(st.state), st.nodes_up, st.nodes);
		struct pollfd none;
		poll(&none, 0, 10);
	}
}

static void test_spread(sel_remote *r)
{
	for (int i = 0; i < RECS; i++) {
		struct sel_remote_event ev = rfx_put(r, &rec[i]);
		CHECKF(ev.result == SEL_REMOTE_STORED, "put %d: %d %d", i, ev.result, ev.error);
	}
	for (int i = 0; i < RECS; i++)
		hit_and_claim(r, i);
	for (int i = 0; i < NODES; i++) {
		long long n = rfx_int(&node[i], "DBSIZE");
		CHECKF(n > 0, "master %d holds no key", i);
	}
	/* Every record's keys on one master: its manifest's. */
	for (int i = 0; i < RECS; i++) {
		int s = slot_of_rec(i), o = owner_of(s);
		CHECK(o >= 0);
		long long keys = rfx_int(&node[o], "CLUSTER COUNTKEYSINSLOT %d", s);
		CHECK(keys >= 1 + 1); /* the manifest and its windows (and maybe other records) */
	}
}

static void migrate_keys(int from, int to, int slot, size_t first, size_t count)
{
	redisReply *keys = rfx_cmd(&node[from], "CLUSTER GETKEYSINSLOT %d 1000", slot);
	CHECK(keys && keys->type == REDIS_REPLY_ARRAY);
	size_t n = keys->elements;
	if (first >= n) {
		freeReplyObject(keys);
		return;
	}
	if (count > n - first)
		count = n - first;
	const char *argv[1100];
	size_t lens[1100];
	char port[16];
	snprintf(port, sizeof port, "%d", node[to].port);
	int a = 0;
	argv[a] = "MIGRATE", lens[a++] = 7;
	argv[a] = "127.0.0.1", lens[a++] = 9;
	argv[a] = port, lens[a++] = strlen(port);
	argv[a] = "", lens[a++] = 0;
	argv[a] = "0", lens[a++] = 1;
	argv[a] = "10000", lens[a++] = 5;
	argv[a] = "KEYS", lens[a++] = 4;
	for (size_t i = first; i < first + count; i++) {
		argv[a] = keys->element[i]->str;
		lens[a++] = keys->element[i]->len;
	}
	redisReply *m = rfx_cmd_argv(&node[from], a, argv, lens);
	CHECKF(m && m->type == REDIS_REPLY_STATUS, "MIGRATE: %s", m ? m->str : "no reply");
	freeReplyObject(m);
	freeReplyObject(keys);
}

static void setslot(int on, int slot, const char *how, const char *id)
{
	redisReply *x = rfx_cmd(&node[on], "CLUSTER SETSLOT %d %s %s", slot, how, id);
	CHECKF(x && x->type == REDIS_REPLY_STATUS, "CLUSTER SETSLOT %d %s on %d: %s", slot, how, on,
	       x ? x->str : "no reply");
	freeReplyObject(x);
}

static void test_migration(sel_remote *r)
{
	int i = 5, s = slot_of_rec(i), a = owner_of(s);
	CHECK(a >= 0);
	int b = (a + 1) % NODES;
	char ida[64], idb[64];
	rfx_node_id(&node[a], ida);
	rfx_node_id(&node[b], idb);
	struct sel_remote_stats s0, s1, s2;
	sel_remote_stats(r, &s0);
	setslot(b, s, "IMPORTING", ida);
	setslot(a, s, "MIGRATING", idb);
	hit_and_claim(r, i); /* nothing moved yet */
	/* Half the keys moved: the source answers ASK for those. */
	long long in_slot = rfx_int(&node[a], "CLUSTER COUNTKEYSINSLOT %d", s);
	CHECK(in_slot >= 2);
	migrate_keys(a, b, s, 0, (size_t)in_slot / 2);
	for (int k = 0; k < 3; k++)
		hit_and_claim(r, i);
	for (int j = 0; j < RECS; j++) /* traffic on every other slot goes on */
		if (slot_of_rec(j) != s)
			hit_and_claim(r, j);
	sel_remote_stats(r, &s1);
	CHECKF(s1.ask > s0.ask, "no ASK followed (%llu)", (unsigned long long)s1.ask);
	/* The rest moved, the slot assigned to b everywhere: MOVED. */
	migrate_keys(a, b, s, 0, 1000);
	CHECK(rfx_int(&node[a], "CLUSTER COUNTKEYSINSLOT %d", s) == 0);
	for (int n = 0; n < NODES; n++)
		setslot(n, s, "NODE", idb);
	hit_and_claim(r, i);
	hit_and_claim(r, i);
	sel_remote_stats(r, &s2);
	CHECKF(s2.moved > s1.moved, "no MOVED followed (%llu)", (unsigned long long)s2.moved);
	CHECK(s2.claim_failures == s0.claim_failures);
	/* A record put into the moved slot's neighbourhood still lands. */
	for (int j = 0; j < RECS; j++)
		if (slot_of_rec(j) == s)
			hit_and_claim(r, j);
}

static void test_killed_master(sel_remote *r)
{
	/* A record on a master that is not the URL's seed. */
	int victim = -1, x = -1;
	for (int i = 0; i < RECS && victim < 0; i++) {
		int o = owner_of(slot_of_rec(i));
		if (o > 0) {
			victim = o;
			x = i;
		}
	}
	CHECK(victim > 0);
	struct sel_remote_event ev = rfx_lookup(r, &hist[x], 0, 1100);
	CHECK(ev.result == SEL_REMOTE_HIT);
	rfx_signal(&node[victim], SIGSTOP);
	uint8_t *mem;
	uint64_t id = rfx_claim_async(r, ev.hit, &mem);
	rfx_kill(&node[victim]);
	ev = rfx_wait(r, id, 30 * SEC);
	CHECKF(ev.result == SEL_REMOTE_FAILED && ev.error < 0, "claim on a killed master: %d %d",
	       ev.result, ev.error);
	free(mem);
	/* The other masters keep serving: every record whose manifest and
	 * bucket they hold (a lookup's other bucket reads that meet the dead
	 * master find nothing, they do not fail it). */
	int served = 0;
	for (int i = 0; i < RECS; i++) {
		int o = owner_of(slot_of_rec(i)), ob = owner_of(bucket_slot_of_rec(i));
		if (o >= 0 && o != victim && ob >= 0 && ob != victim) {
			hit_and_claim(r, i);
			served++;
		}
	}
	CHECK(served > 0);
	ev = rfx_lookup(r, &hist[x], 0, 1100);
	CHECK(ev.result == SEL_REMOTE_FAILED || ev.result == SEL_REMOTE_MISS);
	/* It comes back with its slots (nodes.conf) and no data. */
	rfx_restart(&node[victim]);
	uint64_t deadline = eos_now_ns() + 60 * SEC;
	for (;;) {
		redisReply *info = rfx_cmd(&node[victim], "CLUSTER INFO");
		bool ok = info && info->type == REDIS_REPLY_STRING &&
			  strstr(info->str, "cluster_state:ok");
		if (info)
			freeReplyObject(info);
		if (ok)
			break;
		CHECKF(eos_now_ns() < deadline, "the restarted master did not rejoin");
		struct pollfd none;
		poll(&none, 0, 20);
	}
	wait_nodes_up(r, NODES);
	deadline = eos_now_ns() + 30 * SEC;
	for (;;) { /* a miss, once its node answers again */
		ev = rfx_lookup(r, &hist[x], 0, 1100);
		if (ev.result == SEL_REMOTE_MISS)
			break;
		CHECKF(ev.result == SEL_REMOTE_FAILED, "record %d on the restarted master: %d", x,
		       ev.result);
		CHECKF(eos_now_ns() < deadline, "record %d: no clean miss after the restart", x);
	}
	deadline = eos_now_ns() + 30 * SEC;
	for (;;) {
		ev = rfx_put(r, &rec[x]);
		if (ev.result == SEL_REMOTE_STORED)
			break;
		CHECKF(eos_now_ns() < deadline, "put on the restarted master: %d", ev.error);
	}
	hit_and_claim(r, x);
}

int main(void)
{
	if (!rfx_available())
		SKIP("redis-server or redis-cli is not installed (scripts/install-deps)");
	dir = test_mkdtemp("remote-cluster");
	for (int i = 0; i < NODES; i++) {
		char name[16];
		snprintf(name, sizeof name, "node%d", i);
		rfx_start(&node[i], dir, name, true, false, getenv("RFX_EXTRA"));
	}
	rfx_cluster_create(node, NODES, dir);
	rfx_ns_init(&t, 1, 64, 2, 16384, 12000);
	struct sel_rv_keys none;
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	sel_rv_names_init(&names, &t.ns, &none);
	for (int i = 0; i < RECS; i++) {
		rfx_history(&t, &hist[i], 1100, 1000 + (uint64_t)i);
		rfx_rec_make(&rec[i], &t, &hist[i], 1024, 0, 0, true); /* 16 pages: 512 KiB */
	}
	char url[256];
	rfx_url(node, 1, true, url, sizeof url); /* one seed: the rest is learnt */
	sel_remote *r = rfx_client(url, &t, NULL, false, 65536);
	wait_nodes_up(r, NODES);
	test_spread(r);
	test_migration(r);
	test_killed_master(r);
	struct sel_remote_stats st;
	sel_remote_stats(r, &st);
	printf("cluster: %llu MOVED, %llu ASK, %llu TRYAGAIN, %llu map refreshes, %llu reconnects\n",
	       (unsigned long long)st.moved, (unsigned long long)st.ask,
	       (unsigned long long)st.tryagain, (unsigned long long)st.map_refreshes,
	       (unsigned long long)st.reconnects);
	CHECK(st.corrupt == 0 && st.auth_failures == 0 && st.map_refreshes >= 2);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	for (int i = 0; i < RECS; i++) {
		rfx_rec_free(&rec[i]);
		sel_history_free(&hist[i]);
	}
	for (int i = 0; i < NODES; i++)
		rfx_stop(&node[i]);
	rfx_ns_free(&t);
	test_rmtree(dir);
	free(dir);
	printf("ok\n");
	return 0;
}
