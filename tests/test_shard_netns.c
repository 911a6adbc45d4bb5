/*
 * test_shard_netns.c - the rank links over real interfaces (design 2.14):
 * rank zero in a network namespace of its own with one veth per peer
 * (multi-homed), each peer in its own namespace, so every byte of the
 * rendezvous and the links crosses a veth, never loopback.  The link
 * listener binds the wildcard address and each HELLO names the address the
 * peer's rendezvous connection reached -- the only one of rank zero's that
 * peer can route to.  The ranks join, agree on their directories, store,
 * fetch (each rank's own bytes into its own GPU ids), truncate and drain;
 * after each phase every rank's directory holds the same file names and
 * lengths.  Exit 77 without root or `ip netns` (tests/netnsfx.h).
 */
#include <signal.h>
#include <unistd.h>

#include "eos.h"
#include "netnsfx.h"
#include "shardfx.h"
#include "testutil.h"

#define WORLD 3

static struct nfx nx;
static struct sfx_rank rk[WORLD];
static sel_record_desc R, C, D;
static int port_pipe[2];

static uint64_t deadline(uint64_t s) { return eos_now_ns() + s * SFX_S; }

static void check_traffic(const char *ifname, const char *who)
{
	unsigned long long rx, tx;
	CHECKF(nfx_if_bytes(ifname, &rx, &tx) == 0, "%s: no interface %s", who, ifname);
	printf("%s: %s received %llu bytes, sent %llu\n", who, ifname, rx, tx);
	CHECK(rx > 1000 && tx > 1000);
}

static struct sel_shard_job store(const sel_record_desc *d, uint32_t first, uint32_t slot,
				  uint32_t *ids, struct sel_shard_rec *rec)
{
	*rec = (struct sel_shard_rec){*d, 0, d->tail};
	for (uint32_t i = 0; i < d->tail; i++)
		ids[i] = first + i;
	return (struct sel_shard_job){.op = SEL_SHARD_STORE,
				      .row = true,
				      .slot = slot,
				      .created_ns = 5000 + d->key.consumed,
				      .n_recs = 1,
				      .recs = rec,
				      .n_pages = d->tail,
				      .pages = ids};
}

static int rank0_fn(void *arg)
{
	(void)arg;
	CHECK_OK(nfx_enter(&nx, 0));
	struct sfx_rdv v;
	sfx_rdv_listen(&v, "0.0.0.0");
	CHECK(write(port_pipe[1], &v.port, sizeof v.port) == sizeof v.port);
	struct sel_shard_config cfg;
	sfx_primary_config(&cfg, WORLD);
	cfg.listen_addr = NULL; /* the wildcard, as in production */
	sel_shard_set *s;
	CHECK_OK(sel_shard_open(&cfg, &s));
	CHECK_OK(sfx_primary_join(s, &v, WORLD, deadline(60)));
	struct sel_shard_agree_stats st;
	CHECK_OK(sfx_primary_agree(s, &rk[0], &st, deadline(60)));
	printf("rank 0: joined over veths; agreement kept %" PRIu64 ", deleted %" PRIu64 "\n",
	       st.kept, st.deletes);
	CHECK(st.kept == 1 && st.deletes == 2);
	CHECK_OK(sel_shard_start(s));

	uint32_t ids[SFX_PAGES];
	struct sel_shard_rec rec;
	struct sel_shard_result local;
	struct sel_shard_done d;
	struct sel_shard_job j = store(&C, 10, 1, ids, &rec);
	sfx_job_all(s, &rk[0], &j, &local, &d);
	CHECK(local.status == 0 && d.status == 0 && d.committed == 6);
	j = store(&D, 20, 2, ids, &rec);
	sfx_job_all(s, &rk[0], &j, &local, &d);
	CHECK(local.status == 0 && d.status == 0 && d.committed == 6);

	/* Fetch the chain into ids 40.. and slot 3 on every rank. */
	struct sel_shard_rec recs[3] = {{R, 0, R.tail}, {C, 0, C.tail}, {D, 0, D.tail}};
	uint32_t n = R.tail + C.tail + D.tail;
	for (uint32_t i = 0; i < n; i++)
		ids[i] = 40 + i;
	j = (struct sel_shard_job){.op = SEL_SHARD_FETCH,
				   .row = true,
				   .slot = 3,
				   .n_recs = 3,
				   .recs = recs,
				   .n_pages = n,
				   .pages = ids};
	sfx_job_all(s, &rk[0], &j, &local, &d);
	CHECK(local.status == 0 && d.status == 0);

	struct sel_shard_rec trec = {.d = C};
	j = (struct sel_shard_job){
		.op = SEL_SHARD_TRUNCATE, .slot = SEL_SHARD_NO_SLOT, .n_recs = 1, .recs = &trec};
	sfx_job_all(s, &rk[0], &j, &local, &d);
	CHECK(local.status == 0 && d.status == 0 && d.had_row == 6);
	check_traffic(nx.if0[1], "rank 0");
	check_traffic(nx.if0[2], "rank 0");
	CHECK_OK(sel_shard_close(s, deadline(60)));
	sel_shard_destroy(s);
	sfx_rdv_close(&v);
	sfx_dir_close(&rk[0]);
	return 0;
}

static uint16_t rdv_port;

static int peer_fn(void *arg)
{
	uint32_t r = (uint32_t)(uintptr_t)arg;
	CHECK_OK(nfx_enter(&nx, (int)r));
	struct sfx_peer_opts o = {
		.rdv_addr = nx.addr0[r], .rdv_port = rdv_port, .wait_fd = -1, .signal_fd = -1};
	int code = sfx_peer_main(&rk[r], &o);
	char who[32];
	snprintf(who, sizeof who, "rank %u", r);
	check_traffic(nx.ifp[r], who);
	return code;
}

int main(void)
{
	char why[512];
	if (nfx_create(&nx, WORLD - 1, why, sizeof why) != 0)
		SKIP("%s", why);
	sfx_ranks_init(rk, WORLD, "netns");
	R = sfx_desc(128, 1, NULL);
	C = sfx_desc(320, 2, &R);
	D = sfx_desc(384, 3, &C);
	/* Every rank holds R; rank 2 lost a record the others hold. */
	sel_record_desc old = sfx_desc(704, 9, NULL);
	for (uint32_t r = 0; r < WORLD; r++) {
		sfx_write(&rk[r], &R, 0, true, 0, 5000 + R.key.consumed);
		if (r != 2)
			sfx_write(&rk[r], &old, 30, true, 1, 77);
	}
	CHECK(pipe(port_pipe) == 0);
	pid_t p0 = sfx_fork_fn(rank0_fn, NULL);
	CHECK(read(port_pipe[0], &rdv_port, sizeof rdv_port) == sizeof rdv_port);
	pid_t pp[WORLD];
	for (uint32_t r = 1; r < WORLD; r++)
		pp[r] = sfx_fork_fn(peer_fn, (void *)(uintptr_t)r);
	int c0 = sfx_wait_exit(p0, deadline(120));
	int code[WORLD] = {c0};
	for (uint32_t r = 1; r < WORLD; r++)
		code[r] = sfx_wait_exit(pp[r], deadline(60));
	for (uint32_t r = 0; r < WORLD; r++)
		if (code[r] != 0) {
			for (uint32_t q = 0; q < WORLD; q++)
				kill(q ? pp[q] : p0, SIGKILL);
			nfx_destroy(&nx);
			CHECKF(false, "rank %u exited %d", r, code[r]);
		}
	sfx_check_same(rk, WORLD, "after the namespaces' run");
	/* Each rank restored its own bytes into its own ids. */
	uint32_t src[3] = {0, 10, 20}, tails[3] = {R.tail, C.tail, D.tail};
	for (uint32_t r = 0; r < WORLD; r++)
		sfx_check_restored(&rk[r], 40, src, tails, 3, 3, 2);
	uint64_t len;
	CHECK(sfx_has(&rk[2], &C.key, &len) && !sfx_has(&rk[1], &old.key, NULL));
	nfx_destroy(&nx);
	for (uint32_t r = 0; r < WORLD; r++)
		sfx_rank_free(&rk[r]);
	printf("ok\n");
	return 0;
}
