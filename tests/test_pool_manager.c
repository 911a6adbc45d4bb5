/*
 * test_pool_manager.c - `flare pool` and its clients, as real processes on
 * a Unix socket in the test's directory (design 2.15; docs/pool.md):
 *
 *   - an absent manager: attach reports it within its timeout;
 *   - SO_PEERCRED: a child that setuid()s to another uid is refused, one
 *     in the --group gid is accepted (as root; skipped otherwise);
 *   - puts, lookups and claims byte-exact through the arena, chains under
 *     a parent, a GPU-resident prefix skipped, PRESENT and ORPHAN refusals;
 *   - exports from a neighbour's GPU holding (accepted, refused with
 *     NO_HEADROOM, a stale generation, withdrawals, a reset);
 *   - scope separation: another layout fingerprint or identity never hits;
 *   - LRU eviction, a restore keeping a record warm, and max age;
 *   - /metrics and a clean SIGTERM stop (the socket unlinked).
 */
#include "pool_testlib.h"

#include <grp.h>

static char dir[200];

static void test_absent(void)
{
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct mgr_proc m = {0};
	snprintf(m.sock, sizeof m.sock, "%s/nobody.sock", dir);
	struct tc t;
	uint64_t t0 = eos_now_ns();
	int rc = tc_attach(&t, &m, &s, "x", 400 * MS_NS);
	uint64_t took = eos_now_ns() - t0;
	CHECK_RC(rc, -ETIMEDOUT);
	CHECK(t.c == NULL);
	CHECKF(strstr(sel_errmsg(), m.sock) != NULL, "message '%s'", sel_errmsg());
	CHECKF(took >= 300 * MS_NS && took < 5 * S_NS, "attach gave up after %" PRIu64 " ms",
	       took / MS_NS);
	/* Not a pool address at all. */
	struct sel_pool_client_config cfg = {.address = "tcp:host:1", .geometry = s.g};
	sel_pool_client *c;
	CHECK_RC(sel_pool_attach(&cfg, &c), -EINVAL);
	scope_free(&s);
}

/* A forked child connects as uid/gid and reports attach's result. */
static int child_attach(const struct mgr_proc *m, const char *pubdir, uid_t uid, gid_t gid)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		if (chdir(pubdir) || setgroups(0, NULL) || setgid(gid) || setuid(uid))
			_exit(90);
		struct scope s;
		scope_make(&s, 1, 4096, 1);
		struct mgr_proc rel = *m;
		snprintf(rel.sock, sizeof rel.sock, "%s", strrchr(m->sock, '/') + 1);
		struct tc t;
		int rc = tc_attach(&t, &rel, &s, "child", 3 * S_NS);
		if (!rc)
			tc_close(&t);
		_exit(rc == 0 ? 0 : rc == -EACCES ? 13 : 14);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
	return WEXITSTATUS(st);
}

static void test_peercred(void)
{
	if (geteuid() != 0) {
		printf("note: not root: the SO_PEERCRED checks with another uid are skipped\n");
		return;
	}
	char pub[300];
	snprintf(pub, sizeof pub, "%s/pub", dir);
	CHECK(!mkdir(pub, 0711));
	struct mgr_proc m;
	mgr_start(&m, pub, "cred", "--memory", "8MiB", "--group", "4242", NULL);
	struct stat st;
	CHECK(!stat(m.sock, &st) && (st.st_mode & 0777) == 0660 && st.st_gid == 4242);
	/* Open the file mode so that only SO_PEERCRED stands in the way. */
	CHECK(!chmod(m.sock, 0666));
	CHECK(child_attach(&m, pub, 65534, 65534) == 13);
	wait_metric_eq(&m, "flare_pool_peers_refused_total", 1, 5);
	CHECK(child_attach(&m, pub, 65534, 4242) == 0);
	wait_metric_eq(&m, "flare_pool_sessions_total", 1, 5);
	mgr_stop(&m);
	/* Without --group the socket is 0600. */
	mgr_start(&m, pub, "cred2", "--memory", "8MiB", NULL);
	CHECK(!stat(m.sock, &st) && (st.st_mode & 0777) == 0600);
	mgr_stop(&m);
	rmdir(pub);
}

static void test_put_claim(void)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "flows", "--memory", "32MiB", "--name", "team", NULL);
	struct scope s;
	scope_make(&s, 2, 4096, 1);
	struct tc a, b;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	CHECK_OK(tc_attach(&b, &m, &s, "B", 0));
	CHECK(strcmp(sel_pool_hello(a.c)->name, "team") == 0);
	CHECK(memcmp(sel_pool_instance(a.c), sel_pool_instance(b.c), SEL_POOL_ID_BYTES));
	CHECK(sel_pool_slot_bytes(a.c) == 2 * 8192 && sel_pool_row_slots(a.c) == 1);

	sel_history h, h2;
	hist_make(&h, &s, 600, 1, 600);
	hist_make(&h2, &s, 600, 2, 300); /* shares 300 tokens with h */
	/* A puts a root of 4 pages and a child of 3 more. */
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_OK);
	CHECK(put_record(&a, &h, 448, 256) == SEL_POOL_OK);
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_PRESENT);
	/* An orphan: its parent is not in the pool. */
	CHECK(put_record(&a, &h, 576, 512) == SEL_POOL_ORPHAN);
	wait_metric_eq(&m, "flare_pool_records", 2, 5);

	/* B finds the deeper one and restores it whole. */
	sel_pool_ticket *k = lookup(&b, &h, 0, 600);
	const struct sel_pool_m_answer *ans = sel_pool_ticket_answer(k);
	CHECK(ans->n_cands == 2);
	int i = sel_pool_answer_pick(ans, &h, 0);
	CHECK(i == 0 && ans->nodes[ans->cands[i].node].key.consumed == 448);
	uint32_t why;
	struct sel_pool_lease *l = claim(&b, k, i, &why);
	CHECKF(l, "claim failed: %s", sel_pool_reason_name(why));
	CHECK(l->source == SEL_POOL_SRC_ARENA && l->n_nodes == 2 && l->n_pages == 7 &&
	      l->base == 0);
	lease_check(b.c, l, &h, 0);
	CHECK(!sel_pool_lease_matches(l, &h2, 0)); /* not h2's chain */
	CHECK_OK(sel_pool_release(b.c, l, SEL_POOL_OK));
	sel_pool_ticket_free(b.c, k);

	/* With 2 pages resident on the GPU only 5 come from the pool. */
	k = lookup(&b, &h, 128, 600);
	i = sel_pool_answer_pick(sel_pool_ticket_answer(k), &h, 128);
	CHECK(i >= 0);
	l = claim(&b, k, i, &why);
	CHECK(l && l->n_pages == 5 && l->base == 128 && l->nodes[0].pages == 2 &&
	      l->nodes[1].pages == 3);
	lease_check(b.c, l, &h, 128);
	CHECK_OK(sel_pool_release(b.c, l, SEL_POOL_OK));
	sel_pool_ticket_free(b.c, k);

	/* h2 shares only the root: the deeper candidate's keys are not h2's. */
	k = lookup(&b, &h2, 0, 600);
	ans = sel_pool_ticket_answer(k);
	i = sel_pool_answer_pick(ans, &h2, 0);
	CHECK(i >= 0 && ans->nodes[ans->cands[i].node].key.consumed == 256);
	sel_pool_ticket_free(b.c, k);
	/* A limit below the records: nothing. */
	k = lookup(&b, &h, 0, 200);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(b.c, k);

	/* A reader that finds bad bytes says so; the record is never served
	 * again. */
	uint64_t *p = sel_pool_arena(a.c, NULL);
	(void)p;
	k = lookup(&b, &h, 0, 300);
	l = claim(&b, k, 0, &why);
	CHECK(l);
	uint8_t *byte = sel_pool_slot_addr(b.c, l->page_slots[1]);
	byte[17] ^= 0x40; /* a stray write */
	CHECK_RC(sel_pool_lease_verify(b.c, l), SEL_ECORRUPT);
	CHECK(strstr(sel_errmsg(), "page 1") != NULL);
	CHECK_OK(sel_pool_release(b.c, l, SEL_POOL_CORRUPT));
	sel_pool_ticket_free(b.c, k);
	wait_metric(&m, "flare_pool_claims_corrupt_total", 1, false, 5);
	k = lookup(&b, &h, 0, 300);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(b.c, k);

	wait_metric_eq(&m, "flare_pool_claims_granted_total{source=\"pool\"}", 3, 5);
	wait_metric_eq(&m, "flare_pool_puts_accepted_total", 2, 5);
	wait_metric_eq(&m, "flare_pool_puts_refused_total{reason=\"present\"}", 1, 5);
	wait_metric_eq(&m, "flare_pool_puts_refused_total{reason=\"orphan\"}", 1, 5);
	wait_metric_eq(&m, "flare_pool_sessions", 2, 5);
	wait_metric_eq(&m, "flare_pool_leases", 0, 5);
	sel_history_free(&h);
	sel_history_free(&h2);
	tc_close(&a);
	tc_close(&b);
	wait_metric(&m, "flare_pool_sessions", 0, true, 5);
	mgr_stop(&m);
	scope_free(&s);
}

/* The holder's side of one export: wait for the request, then accept and
 * fill it, or refuse it with reason. */
static void serve_export(struct tc *a, const sel_history *h, uint32_t reason)
{
	struct sel_pool_event e = tc_wait(a, SEL_POOL_EV_EXPORT, 10);
	struct sel_pool_lease *l = e.lease;
	CHECK(l && l->kind == SEL_POOL_EXPORT && l->n_row_slots == sel_pool_row_slots(a->c));
	if (reason) {
		CHECK_OK(sel_pool_export_reply(a->c, l, reason));
		return;
	}
	CHECK_OK(sel_pool_export_reply(a->c, l, SEL_POOL_OK));
	lease_fill(a->c, l, h, &l->key, l->start_page);
	CHECK_OK(sel_pool_progress(a->c, l, 1));
	uint64_t *ck = malloc((l->n_pages + 1) * sizeof *ck), row;
	sel_pool_lease_checksums(a->c, l, ck, &row);
	CHECK_OK(sel_pool_export_done(a->c, l, ck, row));
	free(ck);
}

static void test_export(void)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "export", "--memory", "32MiB", NULL);
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct tc a, b;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	CHECK_OK(tc_attach(&b, &m, &s, "B", 0));
	sel_history h;
	hist_make(&h, &s, 700, 3, 0);
	struct sel_pool_holding hd = {SEL_POOL_SRC_GPU, key_at(&h, 640), bucket_of(&h, 640), 5};
	CHECK_OK(sel_pool_announce(a.c, &hd, 1));
	wait_metric(&m, "flare_pool_holdings", 1, false, 5);

	/* A's own holding never answers A. */
	sel_pool_ticket *k = lookup(&a, &h, 0, 700);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(a.c, k);

	/* B: the neighbour's GPU, 64 tokens (one page) already resident. */
	k = lookup(&b, &h, 64, 700);
	const struct sel_pool_m_answer *ans = sel_pool_ticket_answer(k);
	CHECK(ans->n_cands == 1 && ans->cands[0].source == SEL_POOL_SRC_GPU &&
	      ans->cands[0].generation == 5 &&
	      !memcmp(ans->cands[0].holder, sel_pool_instance(a.c), 16));
	int i = sel_pool_answer_pick(ans, &h, 64);
	CHECK(i == 0);
	uint64_t id;
	CHECK_OK(sel_pool_claim(b.c, k, 0, &id));
	serve_export(&a, &h, 0);
	struct sel_pool_event e = tc_wait(&b, SEL_POOL_EV_CLAIM_GRANTED, 10);
	struct sel_pool_lease *l = e.lease;
	CHECK(e.request == id && l->source == SEL_POOL_SRC_GPU && l->n_pages == 9 && l->base == 64);
	lease_check(b.c, l, &h, 64);
	CHECK_OK(sel_pool_release(b.c, l, SEL_POOL_OK));
	wait_metric(&m, "flare_pool_exports_served_total", 1, false, 5);
	wait_metric_eq(&m, "flare_pool_claims_granted_total{source=\"gpu\"}", 1, 5);

	/* The holder refuses: the requester hears why. */
	uint32_t why;
	CHECK_OK(sel_pool_claim(b.c, k, 0, &id));
	serve_export(&a, &h, SEL_POOL_NO_HEADROOM);
	e = tc_wait(&b, SEL_POOL_EV_CLAIM_FAILED, 10);
	CHECK(e.request == id && e.reason == SEL_POOL_NO_HEADROOM);

	/* A newer generation: the old answer's claim is refused. */
	hd.generation = 6;
	CHECK_OK(sel_pool_announce(a.c, &hd, 1));
	tc_sync(&a, &h);
	sel_pool_ticket *k2 = lookup(&b, &h, 0, 700);
	CHECK(sel_pool_ticket_answer(k2)->cands[0].generation == 6);
	CHECK(claim(&b, k, 0, &why) == NULL && why == SEL_POOL_GENERATION_CHANGED);
	sel_pool_ticket_free(b.c, k);
	sel_pool_ticket_free(b.c, k2);

	/* An eviction notice of the old generation changes nothing; of the
	 * current one, the holding goes. */
	hd.generation = 5;
	CHECK_OK(sel_pool_withdraw(a.c, &hd, 1));
	tc_sync(&a, &h);
	k = lookup(&b, &h, 0, 700);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 1);
	sel_pool_ticket_free(b.c, k);
	hd.generation = 6;
	CHECK_OK(sel_pool_withdraw(a.c, &hd, 1));
	tc_sync(&a, &h);
	k = lookup(&b, &h, 0, 700);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(b.c, k);
	/* evictions_lost: forget the GPU holdings, announce again. */
	struct sel_pool_holding two[2] = {
		hd, {SEL_POOL_SRC_DRAM, key_at(&h, 320), bucket_of(&h, 320), 1}};
	CHECK_OK(sel_pool_announce(a.c, two, 2));
	CHECK_OK(sel_pool_reset_holdings(a.c, 1u << SEL_POOL_SRC_GPU));
	tc_sync(&a, &h);
	k = lookup(&b, &h, 0, 700);
	ans = sel_pool_ticket_answer(k);
	CHECKF(ans->n_cands == 1 && ans->cands[0].source == SEL_POOL_SRC_DRAM,
	       "%u candidates, source %u", ans->n_cands, ans->n_cands ? ans->cands[0].source : 99);
	sel_pool_ticket_free(b.c, k);
	/* When A goes, its holdings go with its session. */
	tc_close(&a);
	wait_metric(&m, "flare_pool_holdings", 0, true, 5);
	k = lookup(&b, &h, 0, 700);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(b.c, k);
	sel_history_free(&h);
	tc_close(&b);
	mgr_stop(&m);
	scope_free(&s);
}

static void test_scopes(void)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "scopes", "--memory", "16MiB", NULL);
	struct scope s, wide, other;
	scope_make(&s, 1, 4096, 1);
	scope_make(&wide, 1, 8192, 1);  /* another plane size: another fingerprint */
	scope_make(&other, 1, 4096, 2); /* another model */
	struct tc a, w, o;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	CHECK_OK(tc_attach(&w, &m, &wide, "W", 0));
	CHECK_OK(tc_attach(&o, &m, &other, "O", 0));
	sel_history h;
	hist_make(&h, &s, 300, 4, 0);
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_OK);
	struct sel_pool_holding hd = {SEL_POOL_SRC_GPU, key_at(&h, 192), bucket_of(&h, 192), 1};
	CHECK_OK(sel_pool_announce(a.c, &hd, 1));
	tc_sync(&a, &h);
	wait_metric_eq(&m, "flare_pool_holdings", 1, 5);
	sel_pool_ticket *k = lookup(&w, &h, 0, 300);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(w.c, k);
	/* The other model's histories differ anyway; look up with A's to show
	 * that the scope alone keeps them apart. */
	k = lookup(&o, &h, 0, 300);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(o.c, k);
	wait_metric_eq(&m, "flare_pool_scopes", 3, 5);
	/* The same record put in the wide scope is a separate record. */
	CHECK(put_record(&w, &h, 256, 0) == SEL_POOL_OK);
	wait_metric_eq(&m, "flare_pool_records", 2, 5);
	sel_history_free(&h);
	tc_close(&a);
	tc_close(&w);
	tc_close(&o);
	mgr_stop(&m);
	scope_free(&s);
	scope_free(&wide);
	scope_free(&other);
}

static void test_lru(void)
{
	/* 1 MiB of windows: each record here is 4 pages + 1 row slot of 8 KiB
	 * = 40 KiB, so about 24 fit. */
	struct mgr_proc m;
	mgr_start(&m, dir, "lru", "--memory", "1088KiB", NULL);
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct tc a;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	sel_history h[40];
	for (int i = 0; i < 40; i++)
		hist_make(&h[i], &s, 256, 100 + (uint32_t)i, 0);
	for (int i = 0; i < 40; i++) {
		CHECK(put_record(&a, &h[i], 256, 0) == SEL_POOL_OK);
		if (i >= 10) {
			/* Record 0 restored after each put: it stays warm. */
			sel_pool_ticket *k = lookup(&a, &h[0], 0, 256);
			uint32_t why;
			CHECK(sel_pool_ticket_answer(k)->n_cands == 1);
			struct sel_pool_lease *l = claim(&a, k, 0, &why);
			CHECK(l);
			lease_check(a.c, l, &h[0], 0);
			CHECK_OK(sel_pool_release(a.c, l, SEL_POOL_OK));
			sel_pool_ticket_free(a.c, k);
		}
	}
	long long ev = metric(&m, "flare_pool_evicted_total");
	if (ev < 10)
		fprintf(stderr, "%s\n", http_metrics(m.port));
	CHECKF(ev >= 10, "evicted %lld", ev);
	/* The oldest unused went first, the newest and the warm one stayed. */
	sel_pool_ticket *k = lookup(&a, &h[1], 0, 256);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 0);
	sel_pool_ticket_free(a.c, k);
	k = lookup(&a, &h[39], 0, 256);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 1);
	sel_pool_ticket_free(a.c, k);
	k = lookup(&a, &h[0], 0, 256);
	CHECK(sel_pool_ticket_answer(k)->n_cands == 1);
	sel_pool_ticket_free(a.c, k);
	CHECK(metric(&m, "flare_pool_records") + ev == 40);
	/* A record larger than the whole arena can never be put. */
	sel_history big;
	hist_make(&big, &s, 64 * 200, 7, 0);
	CHECK(put_record(&a, &big, 64 * 200, 0) == SEL_POOL_OVERSIZE);
	sel_history_free(&big);
	for (int i = 0; i < 40; i++)
		sel_history_free(&h[i]);
	tc_close(&a);
	mgr_stop(&m);
	scope_free(&s);
}

static void test_max_age(void)
{
	struct mgr_proc m;
	mgr_start(&m, dir, "age", "--memory", "8MiB", "--max-age", "1s", NULL);
	CHECK(file_has(m.log, "records expire 1 s after", NULL, 0));
	struct scope s;
	scope_make(&s, 1, 4096, 1);
	struct tc a;
	CHECK_OK(tc_attach(&a, &m, &s, "A", 0));
	sel_history h;
	hist_make(&h, &s, 256, 9, 0);
	uint64_t t0 = eos_now_ns();
	CHECK(put_record(&a, &h, 256, 0) == SEL_POOL_OK);
	sel_pool_ticket *k = lookup(&a, &h, 0, 256);
	bool fresh = eos_now_ns() - t0 < 900 * MS_NS;
	CHECK(!fresh || sel_pool_ticket_answer(k)->n_cands == 1);
	sel_pool_ticket_free(a.c, k);
	/* Once a max age passed it is not served, and the sweep drops it. */
	uint64_t deadline = eos_now_ns() + 10 * S_NS;
	for (;;) {
		k = lookup(&a, &h, 0, 256);
		uint32_t n = sel_pool_ticket_answer(k)->n_cands;
		sel_pool_ticket_free(a.c, k);
		if (!n)
			break;
		CHECK(eos_now_ns() < deadline);
		tc_pump(&a, 50);
	}
	CHECK(eos_now_ns() - t0 >= S_NS);
	wait_metric(&m, "flare_pool_expired_total", 1, false, 10);
	wait_metric(&m, "flare_pool_records", 0, true, 5);
	wait_metric_eq(&m, "flare_pool_max_age_seconds", 1, 5);
	sel_history_free(&h);
	tc_close(&a);
	mgr_stop(&m);
	scope_free(&s);
}

static void test_cli(void)
{
	/* Usage errors name the flag; nothing is left behind. */
	char cmd[16384], log[300];
	snprintf(log, sizeof log, "%s/cli.log", dir);
	snprintf(cmd, sizeof cmd, "%s pool --memory 1GiB 2>%s", flare_bin(), log);
	CHECK(WEXITSTATUS(system(cmd)) == 2 && file_has(log, "--socket PATH is required", NULL, 0));
	snprintf(cmd, sizeof cmd, "%s pool --socket %s/x.sock --memory 8X 2>%s", flare_bin(), dir,
		 log);
	CHECK(WEXITSTATUS(system(cmd)) == 2 && file_has(log, "--memory", NULL, 0));
	snprintf(cmd, sizeof cmd, "%s pool --socket %s/x.sock --memory 8MiB --name 'a b' 2>%s",
		 flare_bin(), dir, log);
	CHECK(WEXITSTATUS(system(cmd)) == 2 && file_has(log, "not a pool name", NULL, 0));
	/* A config file, with a flag overriding it. */
	char conf[300];
	snprintf(conf, sizeof conf, "%s/pool.toml", dir);
	FILE *f = fopen(conf, "w");
	fprintf(f, "# the pool\n[pool]\nmemory = \"8MiB\"\nname = 'from-file'\nmax_age = 3600\n"
		   "max_clients = 4\n");
	fclose(f);
	struct mgr_proc m;
	mgr_start(&m, dir, "conf", "--config", conf, "--name", "from-flag", NULL);
	CHECK(file_has(m.log, "pool 'from-flag', arena 8 MiB", NULL, 0));
	CHECK(file_has(m.log, "records expire 3600 s", NULL, 0));
	CHECK(file_has(m.log, "at most 4 clients", NULL, 0));
	/* A second manager on the same socket is refused; the first keeps it. */
	snprintf(cmd, sizeof cmd, "%s pool --socket %s --memory 8MiB 2>%s", flare_bin(), m.sock,
		 log);
	CHECK(WEXITSTATUS(system(cmd)) == 1 &&
	      file_has(log, "another manager is listening", NULL, 0));
	CHECK(!access(m.sock, F_OK));
	mgr_stop(&m);
	f = fopen(conf, "w");
	fprintf(f, "[pool]\nmemroy = \"8MiB\"\n");
	fclose(f);
	snprintf(cmd, sizeof cmd, "%s pool --socket %s/y.sock --config %s 2>%s", flare_bin(), dir,
		 conf, log);
	CHECK(WEXITSTATUS(system(cmd)) == 2 &&
	      file_has(log, "pool.toml:2: unknown key 'memroy'", NULL, 0));
	unlink(conf);
	unlink(log);
}

int main(void)
{
	const char *t = getenv("TEST_TMPDIR");
	snprintf(dir, sizeof dir, "%s", t ? t : "/tmp");
	char *d = test_mkdtemp("pool");
	snprintf(dir, sizeof dir, "%s", d);
	signal(SIGPIPE, SIG_IGN);
	test_absent();
	test_peercred(); /* forks: before this process has client threads */
	test_put_claim();
	test_export();
	test_scopes();
	test_lru();
	test_max_age();
	test_cli();
	test_rmtree(d);
	free(d);
	printf("ok\n");
	return 0;
}
