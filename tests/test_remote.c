/*
 * test_remote.c - the remote tier's client against a real standalone
 * redis-server on loopback (issue 16): records put and claimed byte-exact
 * through windows of every shape, chains, a record already there, keys
 * the history refutes, a Unix socket and a database, expiry, bounded
 * queues, encryption (Redis holds no plaintext), deployments with other
 * keys kept apart, and close flushing queued writes.
 *
 * Exits 77 without redis-server.
 */
#include "redisfx.h"
#include "remote_value.h"
#include "testutil.h"

#include <poll.h>

#include "xxh.h"

#define SEC 1000000000ull
#define MS 1000000ull

static char *dir;
static struct rfx_server srv;
static char url[256];
static const uint8_t key1[32] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7, 6, 5, 4, 3,
				 2, 1, 9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7, 6, 5};
static const uint8_t key2[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
				 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2};

static void test_open_errors(struct rfx_ns *t)
{
	struct sel_remote_config c = {.url = "redis://h:0", .ns = &t->ns};
	sel_remote *r;
	CHECK_RC(sel_remote_open(&c, &r), SEL_EFORMAT);
	CHECK(strstr(sel_errmsg(), "redis://h:0"));
	c.url = url;
	c.encrypt = true;
	CHECK_RC(sel_remote_open(&c, &r), -EINVAL);
	CHECK(strstr(sel_errmsg(), "encryption needs a key"));
	c.encrypt = false;
	c.window_bytes = 100;
	CHECK_RC(sel_remote_open(&c, &r), -EINVAL);
	c.window_bytes = 0;
	c.ns = NULL;
	CHECK_RC(sel_remote_open(&c, &r), -EINVAL);
	/* A server that is not there: open succeeds, lookups are misses. */
	c.ns = &t->ns;
	c.url = "redis://127.0.0.1:1";
	CHECK_OK(sel_remote_open(&c, &r));
	sel_history h;
	rfx_history(t, &h, 300, 1);
	struct sel_remote_event ev = rfx_lookup(r, &h, 0, 300);
	CHECK(ev.result == SEL_REMOTE_FAILED && ev.error < 0 && !ev.hit);
	char err[256];
	sel_remote_last_error(r, err, sizeof err);
	CHECKF(strstr(err, "127.0.0.1:1"), "last error '%s'", err);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	sel_history_free(&h);
}

/* Put records at every 128 tokens of h as a chain, claim from several
 * resident counts, check bytes. */
static void round_trips(sel_remote *r, struct rfx_ns *t, uint64_t seed, uint32_t flags)
{
	uint32_t pt = t->ns.layout.sz.page_tokens;
	sel_history h;
	rfx_history(t, &h, 1000, seed);
	struct rfx_rec a, b, c;
	rfx_rec_make(&a, t, &h, 320, 0, flags, false);  /* a page-only root */
	rfx_rec_make(&b, t, &h, 645, 320, flags, true); /* linked, with a row */
	rfx_rec_make(&c, t, &h, 900, 645, flags, true);
	struct sel_remote_event ev = rfx_put(r, &a);
	CHECKF(ev.error == 0 && ev.result == SEL_REMOTE_STORED, "put: %d %s", ev.error,
	       sel_strerror(ev.error));
	CHECK(ev.bytes == a.d.tail * a.stride && sel_key_eq(&ev.key, &a.d.key));
	CHECK(rfx_put(r, &b).result == SEL_REMOTE_STORED);
	CHECK(rfx_put(r, &c).result == SEL_REMOTE_STORED);
	/* A record already complete on Redis is not written again. */
	struct sel_remote_stats s0, s1;
	sel_remote_stats(r, &s0);
	ev = rfx_put(r, &b);
	CHECK(ev.error == 0 && ev.result == SEL_REMOTE_PRESENT && ev.bytes == 0);
	sel_remote_stats(r, &s1);
	CHECK(s1.bytes_out == s0.bytes_out && s1.present == s0.present + 1);

	/* From nothing resident: the whole chain a, b, c; c is deepest. */
	ev = rfx_lookup(r, &h, 0, 1000);
	CHECKF(ev.result == SEL_REMOTE_HIT && ev.hit, "lookup: result %d error %d", ev.result,
	       ev.error);
	sel_remote_hit *hit = ev.hit;
	CHECK(sel_key_eq(&hit->key, &c.d.key) && hit->n_nodes == 3);
	CHECK(sel_key_eq(&hit->node[0].key, &a.d.key) && hit->node[0].skip == 0);
	CHECK(hit->pages == 900 / pt && hit->row_bytes == c.row_bytes);
	CHECK(hit->flags == flags);
	CHECK_OK(rfx_claim_check(r, hit));
	/* Resident inside a: a's pages below the resident count are skipped. */
	ev = rfx_lookup(r, &h, 200, 1000);
	CHECK(ev.result == SEL_REMOTE_HIT && ev.hit->n_nodes == 3);
	CHECK(ev.hit->node[0].skip == 200 / pt && ev.hit->pages == 900 / pt - 200 / pt);
	CHECK_OK(rfx_claim_check(r, ev.hit));
	/* Resident at b's parent: b and c only. */
	ev = rfx_lookup(r, &h, 320, 1000);
	CHECK(ev.result == SEL_REMOTE_HIT && ev.hit->n_nodes == 2);
	CHECK(sel_key_eq(&ev.hit->node[0].key, &b.d.key));
	CHECK_OK(rfx_claim_check(r, ev.hit));
	/* A limit below c: b is the deepest. */
	ev = rfx_lookup(r, &h, 0, 899);
	CHECK(ev.result == SEL_REMOTE_HIT && sel_key_eq(&ev.hit->key, &b.d.key));
	CHECK_OK(rfx_claim_check(r, ev.hit));
	/* Resident beyond c, or a's page-only endpoint alone: misses. */
	ev = rfx_lookup(r, &h, 900, 1000);
	CHECK(ev.result == SEL_REMOTE_MISS && ev.error == 0 && !ev.hit);
	ev = rfx_lookup(r, &h, 0, 640);
	CHECK(ev.result == SEL_REMOTE_MISS);
	/* Another conversation sharing the first 700 tokens: b, not c. */
	sel_history h2;
	rfx_history(t, &h2, 1000, seed);
	sel_history_truncate(&h2, 700);
	sel_token other[300];
	for (int i = 0; i < 300; i++)
		other[i] = (sel_token)(200000 + i);
	CHECK_OK(sel_history_append(&h2, other, 300));
	ev = rfx_lookup(r, &h2, 0, 1000);
	CHECK(ev.result == SEL_REMOTE_HIT && sel_key_eq(&ev.hit->key, &b.d.key));
	sel_remote_hit_free(ev.hit);
	rfx_rec_free(&a);
	rfx_rec_free(&b);
	rfx_rec_free(&c);
	sel_history_free(&h);
	sel_history_free(&h2);
}

/* A record that names a parent the history refutes: its chain is
 * another conversation's, so the lookup falls back to what checks out. */
static void test_refuted_chain(sel_remote *r, struct rfx_ns *t)
{
	sel_history h;
	rfx_history(t, &h, 600, 77);
	struct rfx_rec a, bad;
	rfx_rec_make(&a, t, &h, 256, 0, 0, true);
	rfx_rec_make(&bad, t, &h, 512, 256, 0, true);
	bad.d.parent.digest.b[0] ^= 1; /* claims a parent this history does not have */
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	CHECK(rfx_put(r, &bad).result == SEL_REMOTE_STORED);
	struct sel_remote_event ev = rfx_lookup(r, &h, 0, 600);
	CHECK(ev.result == SEL_REMOTE_HIT && sel_key_eq(&ev.hit->key, &a.d.key));
	sel_remote_hit_free(ev.hit);
	/* With a resident count at or above the false parent, bad's chain
	 * stops at the GPU: nothing of the false parent is read, bad hits. */
	ev = rfx_lookup(r, &h, 256, 600);
	CHECK(ev.result == SEL_REMOTE_HIT && sel_key_eq(&ev.hit->key, &bad.d.key));
	CHECK_OK(rfx_claim_check(r, ev.hit));
	rfx_rec_free(&a);
	rfx_rec_free(&bad);
	sel_history_free(&h);
}

static void test_shapes(void)
{
	/* Pages of 3 x 12 KiB planes, windows of 64 KiB: several pages a window. */
	struct rfx_ns t1;
	rfx_ns_init(&t1, 1, 64, 3, 12288, 20000);
	sel_remote *r = rfx_client(url, &t1, NULL, false, 65536);
	rfx_wait_state(r, SEL_RN_UP, 20 * SEC);
	CHECK(sel_remote_rtt_ns(r) > 0);
	uint64_t g = sel_remote_grace_ns(r);
	CHECK(g >= 2 * MS && g <= 250 * MS);
	round_trips(r, &t1, 11, 0);
	test_refuted_chain(r, &t1);
	struct sel_remote_stats st;
	sel_remote_stats(r, &st);
	CHECK(st.state == SEL_RN_UP && st.nodes == 1 && st.nodes_up == 1);
	CHECK(st.lookups >= 9 && st.hits >= 7 && st.claimed >= 5 && st.claim_failures == 0);
	CHECK(st.bytes_in > 0 && st.bytes_out > 0 && st.wire_in > st.bytes_in);
	CHECK(st.auth_failures == 0 && st.corrupt == 0);
	uint64_t hist = 0;
	for (int i = 0; i < SEL_REMOTE_RTT_BUCKETS; i++)
		hist += st.rtt_hist[i];
	CHECK(hist >= st.lookups);
	char desc[256];
	sel_remote_describe(r, desc, sizeof desc);
	CHECKF(strstr(desc, "127.0.0.1:"), "describe '%s'", desc);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_ns_free(&t1);

	/* Pages larger than a window (40 KiB in 16 KiB windows), two ranks,
	 * replicated pages and rows, a row over several windows. */
	struct rfx_ns t2;
	rfx_ns_init(&t2, 2, 128, 2, 20000, 50000);
	r = rfx_client(url, &t2, key1, false, 16384);
	round_trips(r, &t2, 12, 0);
	round_trips(r, &t2, 13, SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);

	/* An endpoint sharing its parent's last page: a row-only restore. */
	r = rfx_client(url, &t2, NULL, false, 0);
	sel_history h;
	rfx_history(&t2, &h, 400, 14);
	struct rfx_rec a, b;
	rfx_rec_make(&a, &t2, &h, 300, 0, 0, true);
	rfx_rec_make(&b, &t2, &h, 310, 300, 0, true);
	CHECK(b.d.tail == 0);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	CHECK(rfx_put(r, &b).result == SEL_REMOTE_STORED);
	struct sel_remote_event ev = rfx_lookup(r, &h, 300, 400);
	CHECK(ev.result == SEL_REMOTE_HIT && ev.hit->pages == 0 && ev.hit->n_nodes == 1);
	CHECK_OK(rfx_claim_check(r, ev.hit));
	ev = rfx_lookup(r, &h, 0, 400);
	CHECK(ev.result == SEL_REMOTE_HIT && ev.hit->n_nodes == 2 && ev.hit->pages == 300 / 128);
	CHECK_OK(rfx_claim_check(r, ev.hit));
	rfx_rec_free(&a);
	rfx_rec_free(&b);
	sel_history_free(&h);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_ns_free(&t2);
}

static long long dbsize(int db)
{
	redisReply *x = rfx_cmd(&srv, "SELECT %d", db);
	CHECK(x);
	freeReplyObject(x);
	long long n = rfx_int(&srv, "DBSIZE");
	x = rfx_cmd(&srv, "SELECT 0");
	freeReplyObject(x);
	return n;
}

static void test_unix_db_expiry(void)
{
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 2, 8192, 9000);
	sel_history h;
	rfx_history(&t, &h, 500, 21);
	struct rfx_rec a;
	rfx_rec_make(&a, &t, &h, 448, 0, 0, true);

	/* A Unix socket. */
	char u[1200];
	snprintf(u, sizeof u, "unix://%s", srv.sock);
	sel_remote *r = rfx_client(u, &t, NULL, false, 32768);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	struct sel_remote_event ev = rfx_lookup(r, &h, 0, 500);
	CHECK(ev.result == SEL_REMOTE_HIT);
	CHECK_OK(rfx_claim_check(r, ev.hit));
	char desc[1200];
	sel_remote_describe(r, desc, sizeof desc);
	CHECK(strstr(desc, "unix:"));
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);

	/* Database 5: the keys land there, and only there. */
	long long before0 = dbsize(0);
	snprintf(u, sizeof u, "redis://127.0.0.1:%d/5", srv.port);
	r = rfx_client(u, &t, NULL, false, 32768);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	long long in5 = dbsize(5);
	CHECK(in5 >= 3 && dbsize(0) == before0);
	/* No max age: nothing expires, the provisional expiry of the windows
	 * was cleared once the manifest was in. */
	redisReply *x = rfx_cmd(&srv, "SELECT 5");
	freeReplyObject(x);
	x = rfx_cmd(&srv, "KEYS *");
	CHECK(x && x->type == REDIS_REPLY_ARRAY && (long long)x->elements == in5);
	for (size_t i = 0; i < x->elements; i++)
		CHECKF(rfx_int(&srv, "PTTL %s", x->element[i]->str) == -1, "%s has a TTL",
		       x->element[i]->str);
	freeReplyObject(x);
	x = rfx_cmd(&srv, "FLUSHDB");
	freeReplyObject(x);
	x = rfx_cmd(&srv, "SELECT 0");
	freeReplyObject(x);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	/* A database the server does not have: a clear error, misses. */
	snprintf(u, sizeof u, "redis://127.0.0.1:%d/99", srv.port);
	r = rfx_client(u, &t, NULL, false, 32768);
	ev = rfx_lookup(r, &h, 0, 500);
	CHECK(ev.result == SEL_REMOTE_FAILED);
	char err[256];
	sel_remote_last_error(r, err, sizeof err);
	CHECKF(strstr(err, "SELECT"), "last error '%s'", err);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);

	/* Max age: every key of the record and its bucket expire. */
	struct sel_remote_config c = {
		.url = url, .ns = &t.ns, .window_bytes = 32768, .max_age_ns = 600 * SEC};
	CHECK_OK(sel_remote_open(&c, &r));
	struct rfx_rec b;
	rfx_rec_make(&b, &t, &h, 384, 0, 0, true);
	CHECK(rfx_put(r, &b).result == SEL_REMOTE_STORED);
	struct sel_rv_names nm;
	struct sel_rv_keys none;
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	sel_rv_names_init(&nm, &t.ns, &none);
	char k[SEL_RV_NAME_MAX];
	sel_rv_manifest_name(&nm, &b.d.key, k);
	long long ttl = rfx_int(&srv, "PTTL %s", k);
	CHECK(ttl > 500 * 1000 && ttl <= 600 * 1000);
	sel_rv_window_name(&nm, &b.d.key, 0, k);
	ttl = rfx_int(&srv, "PTTL %s", k);
	CHECK(ttl > 500 * 1000 && ttl <= 600 * 1000);
	sel_rv_bucket_name(&nm, &b.d.bucket, k);
	ttl = rfx_int(&srv, "PTTL %s", k);
	CHECK(ttl > 500 * 1000 && ttl <= 600 * 1000);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_rec_free(&a);
	rfx_rec_free(&b);
	sel_history_free(&h);
	rfx_ns_free(&t);
}

static void test_queues_and_close(void)
{
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 1, 16384, 4096);
	sel_history h;
	rfx_history(&t, &h, 2000, 31);
	struct rfx_rec rec[6];
	for (int i = 0; i < 6; i++)
		rfx_rec_make(&rec[i], &t, &h, 256 + 256 * (uint64_t)i, 0, 0, true);
	struct sel_remote_config c = {
		.url = url, .ns = &t.ns, .put_queue = 4, .lookup_queue = 2, .window_bytes = 16384};
	sel_remote *r;
	CHECK_OK(sel_remote_open(&c, &r));
	/* Queue slots are held until events are polled, so this is exact:
	 * four puts queue, the fifth is refused at once and counted. */
	uint64_t id[6];
	for (int i = 0; i < 6; i++) {
		struct sel_remote_put p = {.d = rec[i].d,
					   .has_row = true,
					   .pages = rec[i].pages,
					   .row = rec[i].row,
					   .row_n = 1};
		int rc = sel_remote_put(r, &p, &id[i]);
		CHECK_RC(rc, i < 4 ? 0 : -EAGAIN);
	}
	uint64_t lid[3];
	CHECK_OK(sel_remote_lookup(r, &h, 0, 2000, 7, &lid[0]));
	CHECK_OK(sel_remote_lookup(r, &h, 0, 2000, 8, &lid[1]));
	CHECK_RC(sel_remote_lookup(r, &h, 0, 2000, 9, &lid[2]), -EAGAIN);
	CHECK_RC(sel_remote_lookup(r, &h, 100, 50, 9, &lid[2]), -EINVAL);
	CHECK_RC(sel_remote_lookup(r, &h, 0, 2001, 9, &lid[2]), -EINVAL);
	struct sel_remote_stats st;
	sel_remote_stats(r, &st);
	CHECK(st.skipped == 2 && st.lookups_refused == 1 && st.queued_puts == 4);
	/* Close flushes the queued puts (and ends the lookups one way or
	 * another); every op has its event when close returns. */
	CHECK_OK(sel_remote_close(r, eos_now_ns() + 30 * SEC));
	struct sel_remote_event ev[16];
	int n = sel_remote_poll(r, ev, 16);
	CHECK(n == 6);
	int stored = 0;
	for (int i = 0; i < n; i++) {
		if (ev[i].op == SEL_REMOTE_OP_PUT) {
			CHECK(ev[i].result == SEL_REMOTE_STORED);
			stored++;
		} else {
			CHECK(ev[i].op == SEL_REMOTE_OP_LOOKUP &&
			      (ev[i].user == 7 || ev[i].user == 8));
			sel_remote_hit_free(ev[i].hit);
		}
	}
	CHECK(stored == 4);
	struct sel_remote_put p = {.d = rec[5].d,
				   .has_row = true,
				   .pages = rec[5].pages,
				   .row = rec[5].row,
				   .row_n = 1};
	uint64_t x;
	CHECK_RC(sel_remote_put(r, &p, &x), SEL_ESTOPPED);
	CHECK_RC(sel_remote_lookup(r, &h, 0, 2000, 0, &x), SEL_ESTOPPED);
	sel_remote_destroy(r);
	/* What close flushed is there for another client. */
	r = rfx_client(url, &t, NULL, false, 16384);
	struct sel_remote_event e = rfx_lookup(r, &h, 0, 1024);
	CHECK(e.result == SEL_REMOTE_HIT && sel_key_eq(&e.hit->key, &rec[3].d.key));
	CHECK_OK(rfx_claim_check(r, e.hit));
	/* Bad put arguments are refused at once. */
	p.d.tail = 7;
	CHECK_RC(sel_remote_put(r, &p, &x), -EINVAL);
	p = (struct sel_remote_put){.d = rec[5].d,
				    .has_row = true,
				    .pages = rec[5].pages,
				    .row = rec[5].row,
				    .row_n = 0};
	CHECK_RC(sel_remote_put(r, &p, &x), -EINVAL);
	CHECK(strstr(sel_errmsg(), "row pieces"));
	/* Close with lookups queued ends them with -ECANCELED or their
	 * answer, at once. */
	CHECK_OK(sel_remote_lookup(r, &h, 0, 2000, 1, &x));
	CHECK_OK(sel_remote_close(r, 0));
	CHECK(sel_remote_poll(r, ev, 16) == 1);
	CHECK(ev[0].error == 0 || ev[0].error == -ECANCELED);
	sel_remote_hit_free(ev[0].hit);
	sel_remote_destroy(r);
	for (int i = 0; i < 6; i++)
		rfx_rec_free(&rec[i]);
	sel_history_free(&h);
	rfx_ns_free(&t);
}

static void test_keys_and_encryption(void)
{
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 2, 8192, 12000);
	sel_history h;
	rfx_history(&t, &h, 700, 41);
	struct rfx_rec a;
	rfx_rec_make(&a, &t, &h, 640, 0, 0, true);
	sel_remote *enc = rfx_client(url, &t, key1, true, 32768);
	CHECK(rfx_put(enc, &a).result == SEL_REMOTE_STORED);
	/* Redis holds no plaintext: no 32-byte run of a page or of the row
	 * appears in any value. */
	redisReply *keys = rfx_cmd(&srv, "KEYS flare-*");
	CHECK(keys && keys->type == REDIS_REPLY_ARRAY && keys->elements >= 3);
	for (size_t i = 0; i < keys->elements; i++) {
		redisReply *v =
			rfx_cmd(&srv, "GET %b", keys->element[i]->str, keys->element[i]->len);
		CHECK(v);
		if (v->type == REDIS_REPLY_STRING) {
			for (uint32_t pg = 0; pg < a.d.tail; pg++)
				for (uint64_t off = 0; off + 32 <= a.stride; off += 4096)
					CHECK(!memmem(v->str, v->len, (uint8_t *)a.pages[pg] + off,
						      32));
			CHECK(!memmem(v->str, v->len, a.row[0].iov_base, 32));
		}
		freeReplyObject(v);
	}
	freeReplyObject(keys);
	/* The same key without encryption reads it; claims are exact. */
	sel_remote *mac = rfx_client(url, &t, key1, false, 32768);
	struct sel_remote_event ev = rfx_lookup(mac, &h, 0, 700);
	CHECK(ev.result == SEL_REMOTE_HIT);
	CHECK_OK(rfx_claim_check(mac, ev.hit));
	ev = rfx_lookup(enc, &h, 0, 700);
	CHECK(ev.result == SEL_REMOTE_HIT);
	CHECK_OK(rfx_claim_check(enc, ev.hit));
	/* No key, or another key: another deployment, which sees nothing
	 * (and refuses nothing: its keys are elsewhere). */
	sel_remote *none = rfx_client(url, &t, NULL, false, 32768);
	sel_remote *other = rfx_client(url, &t, key2, true, 32768);
	CHECK(rfx_lookup(none, &h, 0, 700).result == SEL_REMOTE_MISS);
	CHECK(rfx_lookup(other, &h, 0, 700).result == SEL_REMOTE_MISS);
	struct sel_remote_stats st;
	sel_remote_stats(other, &st);
	CHECK(st.auth_failures == 0);
	sel_remote *all[] = {enc, mac, none, other};
	for (int i = 0; i < 4; i++) {
		CHECK_OK(sel_remote_close(all[i], 0));
		sel_remote_destroy(all[i]);
	}
	rfx_rec_free(&a);
	sel_history_free(&h);
	rfx_ns_free(&t);
}

/* Record format version 4 on Redis: the manifest says version 4, so the
 * writer zeroes each page record's padding before hashing and sending it
 * (the fixture's pages hold non-zero bytes there): every page checksum is
 * XXH3-64 of the planes followed by zeros, and a claim reads zeros there. */
static void test_zero_padding(void)
{
	struct rfx_ns t; /* two 9000-byte planes: 3288 bytes of padding each */
	rfx_ns_init(&t, 1, 64, 2, 9000, 9000);
	sel_remote *r = rfx_client(url, &t, NULL, false, 16384);
	sel_history h;
	rfx_history(&t, &h, 400, 41);
	struct rfx_rec a;
	rfx_rec_make(&a, &t, &h, 256, 0, 0, true);
	uint8_t *want = malloc(a.stride);
	CHECK(want && a.d.tail == 4 && a.stride == 2 * 12288);
	rfx_page_want(&t.ns, &a.d.key, 0, 0, want, a.stride);
	CHECK(memcmp(a.pages[0], want, a.stride) != 0); /* the padding is not zero yet */
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);

	struct sel_rv_names n;
	sel_rv_names_init(&n, &t.ns, NULL);
	char name[SEL_RV_NAME_MAX];
	int nl = sel_rv_manifest_name(&n, &a.d.key, name);
	redisReply *rep = rfx_cmd(&srv, "GET %b", name, (size_t)nl);
	CHECKF(rep && rep->type == REDIS_REPLY_STRING, "GET %s", name);
	struct sel_rv_keys k;
	CHECK_OK(sel_rv_keys_init(&k, NULL, false));
	struct sel_rv_hdr wh = {
		.kind = SEL_RV_KIND_MANIFEST, .key = a.d.key, .window = SEL_RV_MANIFEST_WINDOW};
	memcpy(wh.identity, t.ns.identity, SEL_IDENTITY_BYTES);
	memcpy(wh.fingerprint, t.ns.fingerprint, SEL_FINGERPRINT_BYTES);
	struct sel_rv_hdr got;
	uint8_t *payload;
	CHECK_OK(sel_rv_decode(&k, &wh, (uint8_t *)rep->str, rep->len, &got, &payload));
	struct sel_rv_manifest m;
	CHECK_OK(sel_rv_manifest_decode(&t.ns, &a.d.key, payload, got.payload, &m));
	CHECKF(m.h.version == SEL_RECORD_VERSION_ZERO_PAD, "manifest version %u", m.h.version);
	for (uint32_t i = 0; i < a.d.tail; i++) {
		rfx_page_want(&t.ns, &a.d.key, i, 0, want, a.stride);
		CHECKF(sel_rv_manifest_cksum(&m, i) == XXH3_64bits(want, a.stride),
		       "page %u: the checksum covers non-zero padding", i);
	}
	freeReplyObject(rep);
	struct sel_remote_event ev = rfx_lookup(r, &h, 0, 400);
	CHECK(ev.result == SEL_REMOTE_HIT && sel_key_eq(&ev.hit->key, &a.d.key));
	CHECK_OK(rfx_claim_check(r, ev.hit)); /* zeros where the put had padding */
	free(want);
	rfx_rec_free(&a);
	sel_history_free(&h);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_ns_free(&t);
}

int main(void)
{
	if (!rfx_available())
		SKIP("redis-server or redis-cli is not installed (scripts/install-deps)");
	dir = test_mkdtemp("remote");
	rfx_start(&srv, dir, "standalone", false, true, NULL);
	rfx_url(&srv, 1, false, url, sizeof url);
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 2, 8192, 9000);
	test_open_errors(&t);
	rfx_ns_free(&t);
	test_shapes();
	test_unix_db_expiry();
	test_queues_and_close();
	test_keys_and_encryption();
	test_zero_padding();
	rfx_stop(&srv);
	test_rmtree(dir);
	free(dir);
	printf("ok\n");
	return 0;
}
