/*
 * test_remote_faults.c - the remote tier under faults, against real
 * redis-server processes (issue 16, "Fault tests"):
 *   - a server killed during a claim: the claim fails at once, the client
 *     reconnects and serves again; the restarted server is empty: misses;
 *   - a window deleted, or evicted by maxmemory with allkeys-lru: a miss,
 *     or a claim that fails, never partial or wrong bytes;
 *   - values rewritten by a client without the key: refused and counted
 *     (authentication with a key; checksums alone refuse random damage
 *     and damaged pages);
 *   - a server that stops answering (SIGSTOP): submissions and polls still
 *     return at once, operations fail by their deadlines, the client
 *     serves again after SIGCONT.
 * Exits 77 without redis-server.
 */
#include "redisfx.h"
#include "remote_value.h"
#include "testutil.h"

#include <poll.h>

#define SEC 1000000000ull
#define MS 1000000ull
/* Below the stopped-server lookup deadline of 400 ms (see its use). */
#define NOWAIT_NS (300 * MS)

static char *dir;
static const uint8_t key1[32] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3,
				 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5};

static struct sel_remote_event lookup_hit(sel_remote *r, const sel_history *h, uint64_t lim)
{
	struct sel_remote_event ev = rfx_lookup(r, h, 0, lim);
	CHECKF(ev.result == SEL_REMOTE_HIT, "lookup: result %d error %d (%s)", ev.result, ev.error,
	       sel_strerror(ev.error));
	return ev;
}

static void test_kill_and_restart(void)
{
	struct rfx_server srv;
	rfx_start(&srv, dir, "kill", false, false, NULL);
	char url[256];
	rfx_url(&srv, 1, false, url, sizeof url);
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 2, 32768, 20000);
	sel_history h;
	rfx_history(&t, &h, 3000, 51);
	struct rfx_rec a;
	rfx_rec_make(&a, &t, &h, 2944, 0, 0, true); /* 46 pages of 64 KiB: 3 MiB */
	sel_remote *r = rfx_client(url, &t, NULL, false, 65536);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	struct sel_remote_event ev = lookup_hit(r, &h, 3000);
	/* Stop the server so the claim is certainly in flight, then kill it. */
	rfx_signal(&srv, SIGSTOP);
	uint8_t *mem;
	uint64_t id = rfx_claim_async(r, ev.hit, &mem);
	rfx_kill(&srv);
	uint64_t t0 = eos_now_ns();
	ev = rfx_wait(r, id, 30 * SEC);
	CHECKF(ev.result == SEL_REMOTE_FAILED && (ev.error == -ECONNRESET || ev.error == -ENOTCONN),
	       "claim of a killed server: result %d error %d", ev.result, ev.error);
	CHECKF(eos_now_ns() - t0 < 5 * SEC, "the claim failed only after %llu ms",
	       (unsigned long long)((eos_now_ns() - t0) / MS));
	free(mem);
	/* While it is down: lookups are misses at once; puts fail. */
	ev = rfx_lookup(r, &h, 0, 3000);
	CHECK(ev.result == SEL_REMOTE_FAILED && !ev.hit);
	rfx_wait_state(r, SEL_RN_DOWN, 10 * SEC);
	/* Restarted empty: the client reconnects by itself; the record is a
	 * miss, never a partial. */
	rfx_restart(&srv);
	rfx_wait_state(r, SEL_RN_UP, 20 * SEC);
	ev = rfx_lookup(r, &h, 0, 3000);
	CHECK(ev.result == SEL_REMOTE_MISS && ev.error == 0);
	/* And it serves again. */
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	ev = lookup_hit(r, &h, 3000);
	CHECK_OK(rfx_claim_check(r, ev.hit));
	struct sel_remote_stats st;
	sel_remote_stats(r, &st);
	CHECK(st.reconnects >= 1 && st.claim_failures == 1);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_stop(&srv);
	rfx_rec_free(&a);
	sel_history_free(&h);
	rfx_ns_free(&t);
}

static void test_eviction(void)
{
	struct rfx_server srv;
	rfx_start(&srv, dir, "evict", false, false,
		  "--maxmemory 12mb --maxmemory-policy allkeys-lru --maxmemory-samples 10");
	char url[256];
	rfx_url(&srv, 1, false, url, sizeof url);
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 1, 16384, 10000);
	sel_remote *r = rfx_client(url, &t, NULL, false, 65536);

	/* One window deleted: the lookup misses (EXISTS finds it gone). */
	sel_history h;
	rfx_history(&t, &h, 1024, 61);
	struct rfx_rec a, b;
	rfx_rec_make(&a, &t, &h, 512, 0, 0, true);
	rfx_rec_make(&b, &t, &h, 1000, 512, 0, true);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	CHECK(rfx_put(r, &b).result == SEL_REMOTE_STORED);
	struct sel_rv_names nm;
	struct sel_rv_keys none;
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	sel_rv_names_init(&nm, &t.ns, &none);
	char k[SEL_RV_NAME_MAX];
	sel_rv_window_name(&nm, &a.d.key, 1, k);
	CHECK(rfx_int(&srv, "DEL %s", k) == 1);
	struct sel_remote_event ev = rfx_lookup(r, &h, 0, 1024);
	CHECKF(ev.result == SEL_REMOTE_MISS, "lookup with a window of a's gone: %d", ev.result);
	/* b alone still restores when the GPU holds a's prefix. */
	ev = rfx_lookup(r, &h, 512, 1024);
	CHECK(ev.result == SEL_REMOTE_HIT);
	CHECK_OK(rfx_claim_check(r, ev.hit));
	/* A window that goes between lookup and claim: the claim fails. */
	ev = rfx_lookup(r, &h, 512, 1024);
	CHECK(ev.result == SEL_REMOTE_HIT);
	sel_rv_window_name(&nm, &b.d.key, 2, k);
	CHECK(rfx_int(&srv, "DEL %s", k) == 1);
	CHECK_RC(rfx_claim_check(r, ev.hit), -ENOENT);
	rfx_rec_free(&a);
	rfx_rec_free(&b);
	sel_history_free(&h);

	/* maxmemory with allkeys-lru: write four times what fits, then every
	 * record is a miss or a byte-exact claim (or a claim that fails when
	 * a window goes under it); some must have been evicted. */
	enum {
		N = 40
	};
	sel_history hs[N];
	int hits = 0, misses = 0, failed = 0;
	for (int i = 0; i < N; i++) {
		rfx_history(&t, &hs[i], 1100, 100 + (uint64_t)i);
		struct rfx_rec rec;
		rfx_rec_make(&rec, &t, &hs[i], 1088, 0, 0, true); /* 17 pages: 1.1 MiB */
		ev = rfx_put(r, &rec);
		CHECKF(ev.result == SEL_REMOTE_STORED || ev.result == SEL_REMOTE_FAILED,
		       "put %d: %d", i, ev.result);
		rfx_rec_free(&rec);
	}
	long long evicted = -1;
	redisReply *info = rfx_cmd(&srv, "INFO stats");
	CHECK(info && info->type == REDIS_REPLY_STRING);
	const char *e = strstr(info->str, "evicted_keys:");
	CHECK(e);
	evicted = atoll(e + 13);
	freeReplyObject(info);
	CHECKF(evicted > 0, "nothing was evicted");
	for (int i = 0; i < N; i++) {
		ev = rfx_lookup(r, &hs[i], 0, 1100);
		if (ev.result == SEL_REMOTE_HIT) {
			int rc = rfx_claim_check(r, ev.hit); /* bytes checked when it succeeds */
			if (rc == 0)
				hits++;
			else {
				CHECKF(rc == -ENOENT, "claim %d: %d", i, rc);
				failed++;
			}
		} else {
			CHECK(ev.result == SEL_REMOTE_MISS);
			misses++;
		}
		sel_history_free(&hs[i]);
	}
	printf("allkeys-lru: %lld keys evicted; %d hits, %d misses, %d claims failed\n", evicted,
	       hits, misses, failed);
	CHECK(misses + failed > 0 && hits > 0);
	struct sel_remote_stats st;
	sel_remote_stats(r, &st);
	CHECK(st.corrupt == 0 && st.auth_failures == 0);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_stop(&srv);
	rfx_ns_free(&t);
}

/* Replace key k's value with v (a client without the key). */
static void set_raw(struct rfx_server *s, const char *k, const void *v, size_t len)
{
	const char *argv[] = {"SET", k, v};
	size_t lens[] = {3, strlen(k), len};
	redisReply *x = rfx_cmd_argv(s, 3, argv, lens);
	CHECK(x && x->type == REDIS_REPLY_STATUS);
	freeReplyObject(x);
}

static redisReply *get_raw(struct rfx_server *s, const char *k)
{
	redisReply *x = rfx_cmd(s, "GET %s", k);
	CHECK(x && x->type == REDIS_REPLY_STRING);
	return x;
}

static void want_window(const struct rfx_ns *t, const sel_key *key, uint32_t w,
			struct sel_rv_hdr *want)
{
	memset(want, 0, sizeof *want);
	want->kind = SEL_RV_KIND_WINDOW;
	memcpy(want->identity, t->ns.identity, sizeof want->identity);
	memcpy(want->fingerprint, t->ns.fingerprint, sizeof want->fingerprint);
	want->key = *key;
	want->window = w;
}

/* After a refusal the client deletes the record's manifest: the lookup
 * misses and the next put writes the record again. */
static void healed(sel_remote *r, const sel_history *h, const struct rfx_rec *a)
{
	struct sel_remote_event ev = rfx_lookup(r, h, 0, 800);
	CHECKF(ev.result == SEL_REMOTE_MISS, "a refused record still found: %d", ev.result);
	CHECK(rfx_put(r, a).result == SEL_REMOTE_STORED);
}

static void test_tampering(void)
{
	struct rfx_server srv;
	rfx_start(&srv, dir, "tamper", false, false, NULL);
	char url[256];
	rfx_url(&srv, 1, false, url, sizeof url);
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 2, 8192, 9000);
	sel_history h;
	rfx_history(&t, &h, 800, 71);
	struct rfx_rec a;
	rfx_rec_make(&a, &t, &h, 768, 0, 0, true);
	char k[SEL_RV_NAME_MAX], k1[SEL_RV_NAME_MAX];
	test_rng rng;
	test_rng_init(&rng, 5);
	struct sel_remote_stats s0, s1;
	struct sel_rv_hdr want, got;
	uint8_t *pl;

	/* With a key: values rewritten by someone without it are refused. */
	sel_remote *r = rfx_client(url, &t, key1, false, 32768);
	struct sel_rv_keys keyed, none;
	CHECK_OK(sel_rv_keys_init(&keyed, key1, false));
	CHECK_OK(sel_rv_keys_init(&none, NULL, false));
	struct sel_rv_names nm;
	sel_rv_names_init(&nm, &t.ns, &keyed);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	sel_rv_window_name(&nm, &a.d.key, 0, k);
	sel_rv_window_name(&nm, &a.d.key, 1, k1);
	/* Random bytes. */
	uint8_t junk[5000];
	test_rng_fill(&rng, junk, sizeof junk);
	set_raw(&srv, k, junk, sizeof junk);
	struct sel_remote_event ev = lookup_hit(r, &h, 800); /* the manifest is intact */
	CHECK_RC(rfx_claim_check(r, ev.hit), SEL_EFORMAT);
	healed(r, &h, &a);
	/* A well-framed value with a valid checksum (our own encoder without
	 * a key): the real header, pages of the forger's choosing. */
	redisReply *orig = get_raw(&srv, k);
	uint8_t *copy = malloc(orig->len);
	memcpy(copy, orig->str, orig->len);
	want_window(&t, &a.d.key, 0, &want);
	CHECK_OK(sel_rv_decode(&keyed, &want, copy, orig->len, &got, &pl));
	uint8_t *fp = malloc(got.payload), *forged = malloc(got.payload + 512);
	memset(fp, 0x66, got.payload);
	struct iovec fi = {fp, got.payload};
	int fl = sel_rv_encode(&none, &got, &fi, 1, forged, got.payload + 512);
	CHECK(fl > 0);
	set_raw(&srv, k, forged, (size_t)fl);
	sel_remote_stats(r, &s0);
	ev = lookup_hit(r, &h, 800);
	CHECK_RC(rfx_claim_check(r, ev.hit), -EBADMSG);
	sel_remote_stats(r, &s1);
	CHECK(s1.auth_failures == s0.auth_failures + 1 && s1.dropped == s0.dropped + 1);
	healed(r, &h, &a);
	/* The real value with one payload byte changed. */
	freeReplyObject(orig);
	orig = get_raw(&srv, k);
	copy = realloc(copy, orig->len);
	memcpy(copy, orig->str, orig->len);
	copy[SEL_RV_HEADER + 10] ^= 1;
	set_raw(&srv, k, copy, orig->len);
	ev = lookup_hit(r, &h, 800);
	CHECK_RC(rfx_claim_check(r, ev.hit), -EBADMSG);
	healed(r, &h, &a);
	/* Window 1 copied over window 0: a valid MAC, the wrong window. */
	redisReply *w1 = get_raw(&srv, k1);
	set_raw(&srv, k, w1->str, w1->len);
	freeReplyObject(w1);
	ev = lookup_hit(r, &h, 800);
	CHECK_RC(rfx_claim_check(r, ev.hit), SEL_ECORRUPT);
	healed(r, &h, &a);
	/* The manifest rewritten: the lookup misses and counts it. */
	sel_rv_manifest_name(&nm, &a.d.key, k);
	set_raw(&srv, k, junk, 3000);
	sel_remote_stats(r, &s0);
	ev = rfx_lookup(r, &h, 0, 800);
	CHECK(ev.result == SEL_REMOTE_MISS);
	sel_remote_stats(r, &s1);
	CHECK(s1.corrupt == s0.corrupt + 1);
	healed(r, &h, &a);
	ev = lookup_hit(r, &h, 800);
	CHECK_OK(rfx_claim_check(r, ev.hit));
	freeReplyObject(orig);
	free(copy);
	free(fp);
	free(forged);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);

	/* Checksums only (no key): random damage is refused, and so is a
	 * damaged page whose value checksum was recomputed (the manifest's
	 * page checksums catch it). */
	r = rfx_client(url, &t, NULL, false, 32768);
	sel_rv_names_init(&nm, &t.ns, &none);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	sel_rv_window_name(&nm, &a.d.key, 3, k);
	for (int trial = 0; trial < 20; trial++) {
		orig = get_raw(&srv, k);
		copy = malloc(orig->len);
		memcpy(copy, orig->str, orig->len);
		size_t at = test_rng_below(&rng, orig->len);
		copy[at] ^= (uint8_t)(1 + test_rng_below(&rng, 255));
		set_raw(&srv, k, copy, orig->len);
		ev = lookup_hit(r, &h, 800);
		int rc = rfx_claim_check(r, ev.hit);
		CHECKF(rc == SEL_ECORRUPT || rc == SEL_EFORMAT, "damage at %zu: %d", at, rc);
		healed(r, &h, &a);
		freeReplyObject(orig);
		free(copy);
	}
	orig = get_raw(&srv, k);
	copy = malloc(orig->len);
	memcpy(copy, orig->str, orig->len);
	want_window(&t, &a.d.key, 3, &want);
	CHECK_OK(sel_rv_decode(&none, &want, copy, orig->len, &got, &pl));
	pl[100] ^= 1; /* a page byte */
	struct iovec pi = {pl, got.payload};
	uint8_t *re = malloc(orig->len + 64);
	int rl = sel_rv_encode(&none, &got, &pi, 1, re, orig->len + 64);
	CHECK(rl == (int)orig->len);
	set_raw(&srv, k, re, (size_t)rl);
	ev = lookup_hit(r, &h, 800);
	CHECK_RC(rfx_claim_check(r, ev.hit), SEL_ECORRUPT);
	char err[256];
	sel_remote_last_error(r, err, sizeof err);
	CHECKF(strstr(err, "checksum"), "last error '%s'", err);
	healed(r, &h, &a);
	freeReplyObject(orig);
	free(copy);
	free(re);
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_stop(&srv);
	rfx_rec_free(&a);
	sel_history_free(&h);
	rfx_ns_free(&t);
}

/* The longest a submission or poll took while the server was stopped. */
static uint64_t worst_call_ns;

static void timed_poll_until(sel_remote *r, uint64_t *ids, struct sel_remote_event *out, int n,
			     uint64_t timeout_ns)
{
	uint64_t deadline = eos_now_ns() + timeout_ns;
	int got = 0;
	while (got < n) {
		struct sel_remote_event ev[8];
		uint64_t t0 = eos_now_ns();
		int k = sel_remote_poll(r, ev, 8);
		uint64_t dt = eos_now_ns() - t0;
		if (dt > worst_call_ns)
			worst_call_ns = dt;
		for (int i = 0; i < k; i++)
			for (int j = 0; j < n; j++)
				if (ev[i].id == ids[j]) {
					out[j] = ev[i];
					got++;
				}
		CHECKF(eos_now_ns() < deadline, "%d of %d events by the deadline", got, n);
		struct pollfd p = {.fd = sel_remote_wait_fd(r), .events = POLLIN};
		poll(&p, 1, 5);
	}
}

static void test_stopped_server(void)
{
	struct rfx_server srv;
	rfx_start(&srv, dir, "stop", false, false, NULL);
	char url[256];
	rfx_url(&srv, 1, false, url, sizeof url);
	struct rfx_ns t;
	rfx_ns_init(&t, 1, 64, 2, 16384, 9000);
	sel_history h;
	rfx_history(&t, &h, 1200, 81);
	struct rfx_rec a, b;
	rfx_rec_make(&a, &t, &h, 1152, 0, 0, true);
	rfx_rec_make(&b, &t, &h, 640, 0, 0, true);
	struct sel_remote_config c = {
		.url = url,
		.ns = &t.ns,
		.window_bytes = 65536,
		.lookup_timeout_ns = 400 * MS,
		.restore_setup_ns = 1 * SEC,
		.net = {.stall_ns = 1500 * MS,
			.backoff_min_ns = 20 * MS,
			.backoff_max_ns = 300 * MS,
			.connect_timeout_ns = 1 * SEC},
	};
	sel_remote *r;
	CHECK_OK(sel_remote_open(&c, &r));
	rfx_track(r, c.ns);
	CHECK(rfx_put(r, &a).result == SEL_REMOTE_STORED);
	struct sel_remote_event hit = lookup_hit(r, &h, 1200);
	uint64_t grace_before = sel_remote_grace_ns(r);
	CHECK(grace_before >= 2 * MS && grace_before <= 250 * MS);

	rfx_signal(&srv, SIGSTOP);
	uint64_t ids[3];
	struct sel_remote_event ev[3];
	uint64_t t0 = eos_now_ns();
	CHECK_OK(sel_remote_lookup(r, &h, 0, 1200, 0, &ids[0]));
	uint8_t *mem;
	ids[1] = rfx_claim_async(r, hit.hit, &mem);
	struct sel_remote_put p = {
		.d = b.d, .has_row = true, .pages = b.pages, .row = b.row, .row_n = 1};
	CHECK_OK(sel_remote_put(r, &p, &ids[2]));
	/* "At once" here is "before the stopped server could have answered":
	 * a submission or poll that waited on the socket would take at least
	 * the lookup's 400 ms deadline (the server never answers while
	 * stopped), so the bound sits below that and far above scheduling
	 * noise on a loaded machine under the sanitizers. */
	uint64_t submit_ns = eos_now_ns() - t0;
	CHECKF(submit_ns < NOWAIT_NS, "three submissions took %llu ms with the server stopped",
	       (unsigned long long)(submit_ns / MS));
	timed_poll_until(r, ids, ev, 3, 20 * SEC);
	CHECKF(worst_call_ns < NOWAIT_NS, "a poll took %llu ms",
	       (unsigned long long)(worst_call_ns / MS));
	/* The lookup by its 400 ms deadline (or the stall, whichever first). */
	CHECK(ev[0].result == SEL_REMOTE_FAILED && !ev[0].hit);
	CHECKF(ev[0].duration_ns < 3 * SEC, "lookup failed after %llu ms",
	       (unsigned long long)(ev[0].duration_ns / MS));
	/* The claim by its deadline: 1 s of setup here plus the bytes at
	 * 8 MiB/s, or the 1.5 s stall. */
	CHECK(ev[1].result == SEL_REMOTE_FAILED);
	CHECK(ev[1].error == -ETIMEDOUT || ev[1].error == -ECONNRESET);
	CHECKF(ev[1].duration_ns < 5 * SEC, "claim failed after %llu ms",
	       (unsigned long long)(ev[1].duration_ns / MS));
	CHECK(ev[2].result == SEL_REMOTE_FAILED);
	free(mem);
	/* Submissions keep returning at once while it hangs. */
	for (int i = 0; i < 20; i++) {
		uint64_t id, s = eos_now_ns();
		CHECK_OK(sel_remote_lookup(r, &h, 0, 1200, 0, &id));
		CHECK(eos_now_ns() - s < NOWAIT_NS);
		timed_poll_until(r, &id, ev, 1, 10 * SEC);
		CHECK(ev[0].result == SEL_REMOTE_FAILED);
	}
	struct sel_remote_stats st;
	sel_remote_stats(r, &st);
	CHECK(st.stalls >= 1);
	CHECK(st.state != SEL_RN_UP);
	/* SIGCONT: it serves again. */
	rfx_signal(&srv, SIGCONT);
	uint64_t deadline = eos_now_ns() + 20 * SEC;
	for (;;) {
		struct sel_remote_event e = rfx_lookup(r, &h, 0, 1200);
		if (e.result == SEL_REMOTE_HIT) {
			CHECK_OK(rfx_claim_check(r, e.hit));
			break;
		}
		CHECKF(eos_now_ns() < deadline, "no hit 20 s after SIGCONT");
	}
	/* Puts too, once every connection has come back from the stall
	 * (one still waiting out its stall may fail a put first). */
	deadline = eos_now_ns() + 20 * SEC;
	for (;;) {
		struct sel_remote_event e = rfx_put(r, &b);
		if (e.result == SEL_REMOTE_STORED)
			break;
		CHECKF(e.result == SEL_REMOTE_FAILED && eos_now_ns() < deadline,
		       "no put 20 s after SIGCONT: %d %d", e.result, e.error);
	}
	CHECK_OK(sel_remote_close(r, 0));
	sel_remote_destroy(r);
	rfx_stop(&srv);
	rfx_rec_free(&a);
	rfx_rec_free(&b);
	sel_history_free(&h);
	rfx_ns_free(&t);
}

int main(void)
{
	if (!rfx_available())
		SKIP("redis-server or redis-cli is not installed (scripts/install-deps)");
	dir = test_mkdtemp("remote-faults");
	test_kill_and_restart();
	test_eviction();
	test_tampering();
	test_stopped_server();
	test_rmtree(dir);
	free(dir);
	printf("ok\n");
	return 0;
}
