/*
 * test_shard_link.c - the rank links with real processes on loopback
 * (src/selene/shard_link.c, design 2.14): three ranks, each a process with
 * its own record directory and its own fake GPU, join, agree on their
 * directories at startup, then run stores, fetches, truncations and unlinks
 * through the links, a partial store's cleanup, a store rank zero itself
 * failed, a drained close, and a restart of every rank.  After each phase
 * every rank's directory holds the same file names and lengths, and every
 * fetch put each rank's own bytes into each rank's GPU ids.
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eos.h"
#include "shardfx.h"
#include "testutil.h"

#define WORLD 3

static struct sfx_rank rk[WORLD];
static sel_record_desc R, C, D;

static uint64_t deadline(uint64_t s) { return eos_now_ns() + s * SFX_S; }

struct life {
	sel_shard_set *s;
	struct sfx_rdv v;
	struct sfx_peer_opts o[WORLD];
	pid_t pid[WORLD];
};

/* Start every peer and rank zero, through the join and the agreement. */
static void start(struct life *L, struct sel_shard_agree_stats *st)
{
	sfx_rdv_listen(&L->v, "127.0.0.1");
	struct sel_shard_config cfg;
	sfx_primary_config(&cfg, WORLD);
	cfg.set.disk_limit = 3ull << 30; /* rank 0 has the most room */
	for (uint32_t r = 1; r < WORLD; r++) {
		L->o[r] = (struct sfx_peer_opts){.rdv_port = L->v.port,
						 .wait_fd = -1,
						 .signal_fd = -1,
						 .disk_limit = (1ull << 30) + r};
		L->pid[r] = sfx_fork(&rk[r], &L->o[r]);
	}
	CHECK_OK(sel_shard_open(&cfg, &L->s));
	CHECK(sel_shard_port(L->s) != 0);
	CHECK_OK(sfx_primary_join(L->s, &L->v, WORLD, deadline(60)));
	CHECK(sel_shard_disk_limit(L->s) == (1ull << 30) + 1); /* the smallest rank's */
	CHECK_OK(sfx_primary_agree(L->s, &rk[0], st, deadline(60)));
	CHECK_OK(sel_shard_start(L->s));
	CHECK_OK(sel_shard_check(L->s));
}

static void stop(struct life *L)
{
	struct sel_shard_stats st;
	sel_shard_stats(L->s, &st);
	CHECK_OK(sel_shard_close(L->s, deadline(60)));
	printf("closed: %" PRIu64 " jobs, %" PRIu64 " failed, %" PRIu64 " cleanups, %" PRIu64
	       " frames sent, %" PRIu64 " received, most queued %u\n",
	       st.completed + st.failed, st.failed, st.cleanups, st.frames_sent, st.frames_received,
	       st.queued_max);
	sel_shard_destroy(L->s);
	for (uint32_t r = 1; r < WORLD; r++) {
		int code = sfx_wait_exit(L->pid[r], deadline(60));
		CHECKF(code == 0, "rank %u exited %d after a drained close", r, code);
	}
	sfx_rdv_close(&L->v);
	sfx_dir_close(&rk[0]);
}

static struct sel_shard_job store_job(const sel_record_desc *d, uint32_t *ids, uint32_t first_id,
				      uint32_t slot, struct sel_shard_rec *rec)
{
	*rec = (struct sel_shard_rec){*d, 0, d->tail};
	for (uint32_t i = 0; i < d->tail; i++)
		ids[i] = first_id + i;
	return (struct sel_shard_job){.op = SEL_SHARD_STORE,
				      .row = true,
				      .slot = slot,
				      .created_ns = 1000 + d->key.consumed,
				      .n_recs = 1,
				      .recs = rec,
				      .n_pages = d->tail,
				      .pages = ids};
}

static struct sel_shard_job one_rec(uint32_t op, const sel_record_desc *d,
				    struct sel_shard_rec *rec)
{
	*rec = (struct sel_shard_rec){.d = *d};
	return (struct sel_shard_job){
		.op = op, .slot = SEL_SHARD_NO_SLOT, .n_recs = 1, .recs = rec};
}

static void ok_everywhere(const struct sel_shard_result *local, const struct sel_shard_done *d)
{
	CHECKF(local->status == 0, "rank 0: %s", local->text);
	CHECKF(d->status == 0 && d->failed == 0, "%s", d->text);
	CHECK(d->ranks == ((1u << WORLD) - 2));
}

/* Fetch the chain R -> C -> D (all of C's and D's pages and D's row, R's
 * pages) into ids from dst and slot 3; every rank's destinations then hold
 * that rank's source bytes. */
static void fetch_and_check(struct life *L, uint32_t dst)
{
	struct sel_shard_rec recs[3] = {{R, 0, R.tail}, {C, 0, C.tail}, {D, 0, D.tail}};
	uint32_t n = R.tail + C.tail + D.tail, ids[SFX_PAGES];
	for (uint32_t i = 0; i < n; i++)
		ids[i] = dst + i;
	struct sel_shard_job j = {.op = SEL_SHARD_FETCH,
				  .row = true,
				  .slot = 3,
				  .n_recs = 3,
				  .recs = recs,
				  .n_pages = n,
				  .pages = ids};
	for (uint32_t r = 0; r < WORLD; r++) {
		for (uint32_t i = 0; i < n; i++)
			memset(sfx_page(&rk[r], dst + i), 0xee, rk[r].stride);
		memset(sfx_row(&rk[r], 3), 0xee, rk[r].row_area);
	}
	struct sel_shard_result local;
	struct sel_shard_done d;
	sfx_job_all(L->s, &rk[0], &j, &local, &d);
	ok_everywhere(&local, &d);
	CHECK(d.bytes == 2ull * n * rk[1].stride);
	/* R was stored from ids 0.., C from 10.., D from 20.. with slot 2. */
	uint32_t src[3] = {0, 10, 20}, tails[3] = {R.tail, C.tail, D.tail};
	for (uint32_t r = 0; r < WORLD; r++) {
		sfx_check_restored(&rk[r], dst, src, tails, 3, 3, 2);
		/* Another rank's bytes differ: each rank restored its own. */
		if (r)
			CHECK(memcmp(sfx_page(&rk[r], dst), sfx_page(&rk[0], dst), rk[r].stride));
	}
	printf("fetch of %u pages and a row: every rank holds its own bytes\n", n);
}

static void phase_one(void)
{
	/* Before the first start: every rank holds R; ranks 0 and 1 hold an old
	 * record rank 2 lost; rank 1 holds one only it knows. */
	sel_record_desc old = sfx_desc(704, 9, NULL), only1 = sfx_desc(768, 10, NULL);
	for (uint32_t r = 0; r < WORLD; r++)
		sfx_write(&rk[r], &R, 0, true, 0, 1000 + R.key.consumed);
	sfx_write(&rk[0], &old, 30, true, 1, 7);
	sfx_write(&rk[1], &old, 30, true, 1, 7);
	sfx_write(&rk[1], &only1, 30, true, 1, 8);

	struct life L = {0};
	struct sel_shard_agree_stats st;
	start(&L, &st);
	CHECK(st.kept == 1 && st.missing == 1 && st.extra == 1 && st.deletes == 3);
	sfx_check_same(rk, WORLD, "after the join");

	/* Store C (links under R) and D (links under C) on every rank. */
	uint32_t ids[SFX_PAGES];
	struct sel_shard_rec rec;
	struct sel_shard_result local;
	struct sel_shard_done d;
	struct sel_shard_job j = store_job(&C, ids, 10, 1, &rec);
	sfx_job_all(L.s, &rk[0], &j, &local, &d);
	ok_everywhere(&local, &d);
	CHECK(d.committed == 6 && d.cleaned == 0);
	j = store_job(&D, ids, 20, 2, &rec);
	sfx_job_all(L.s, &rk[0], &j, &local, &d);
	ok_everywhere(&local, &d);
	sfx_check_same(rk, WORLD, "after two stores");

	fetch_and_check(&L, 32);

	/* C's only child committed: compaction truncates its row everywhere. */
	j = one_rec(SEL_SHARD_TRUNCATE, &C, &rec);
	sfx_job_all(L.s, &rk[0], &j, &local, &d);
	ok_everywhere(&local, &d);
	CHECK(d.had_row == 6);
	sfx_check_same(rk, WORLD, "after a truncation");

	/* A store that fails on rank 2 (the filesystem is full) after rank 1
	 * committed: rank 1's file is unlinked before the failure is reported,
	 * and the failure says space, so the caller can defer. */
	sel_record_desc E = sfx_desc(576, 11, &D);
	atomic_store(&rk[2].knobs->store_errno, ENOSPC);
	j = store_job(&E, ids, 40, 0, &rec);
	sfx_job_all(L.s, &rk[0], &j, &local, &d);
	CHECK(local.status == 0);
	CHECKF(d.status == -ENOSPC && d.space && d.failed == 4, "%d %s", d.status, d.text);
	CHECK(d.committed == 2 && d.cleaned == 2 && d.cleanup_failed == 0);
	CHECK(strstr(d.text, "rank 2:") && strstr(d.text, "injected"));
	CHECK(d.rank_status[1] == 0 && d.rank_status[2] == -ENOSPC);
	CHECK(!sfx_has(&rk[1], &E.key, NULL) && !sfx_has(&rk[2], &E.key, NULL));
	/* Rank 0's own copy goes as its caller would remove it. */
	j = one_rec(SEL_SHARD_UNLINK, &E, &rec);
	sfx_run_job(&rk[0], &j, &local);
	CHECK(local.status == 0 && (local.flags & SEL_SHARD_R_EXISTED));
	sfx_check_same(rk, WORLD, "after a store that failed on rank 2");

	/* A terminal failure on rank 2 and a cleanup unlink that fails on rank
	 * 1: both are reported with the store. */
	atomic_store(&rk[2].knobs->store_errno, EIO);
	atomic_store(&rk[1].knobs->unlink_errno, EROFS);
	j = store_job(&E, ids, 40, 0, &rec);
	sfx_job_all(L.s, &rk[0], &j, &local, &d);
	CHECKF(d.status == -EIO && !d.space && d.committed == 2 && d.cleanup_failed == 2, "%s",
	       d.text);
	CHECKF(strstr(d.text, "cleanup unlink failed on rank 1") &&
		       strstr(d.text, "injected: unlink"),
	       "%s", d.text);
	printf("reported: %s\n", d.text);
	atomic_store(&rk[2].knobs->store_errno, 0);
	atomic_store(&rk[1].knobs->unlink_errno, 0);
	CHECK(sfx_has(&rk[1], &E.key, NULL));
	j = one_rec(SEL_SHARD_UNLINK, &E, &rec);
	sfx_run_job(&rk[0], &j, &local); /* rank 0's own copy, as before */
	CHECK(local.status == 0);
	/* Space on one rank, a terminal error on the other: terminal wins,
	 * space is still said. */
	atomic_store(&rk[1].knobs->store_errno, EDQUOT);
	atomic_store(&rk[2].knobs->store_errno, EIO);
	sel_record_desc E2 = sfx_desc(640, 12, &D);
	j = store_job(&E2, ids, 40, 0, &rec);
	uint64_t id;
	CHECK_OK(sel_shard_submit(L.s, &j, 0, 7, &id));
	CHECK(sfx_wait_done(L.s, &d, deadline(60)) == 1);
	CHECK(d.status == -EIO && d.space && d.failed == 6 && d.committed == 0 && d.cleaned == 0);
	atomic_store(&rk[1].knobs->store_errno, 0);
	atomic_store(&rk[2].knobs->store_errno, 0);

	/* Rank 0's own write failed while the peers committed: the caller
	 * removes theirs with sel_shard_cleanup before it reports. */
	j = store_job(&E, ids, 40, 0, &rec);
	CHECK_OK(sel_shard_submit(L.s, &j, 0, 8, &id));
	CHECK(sfx_wait_done(L.s, &d, deadline(60)) == 1 && d.status == 0 && d.committed == 6);
	CHECK_OK(sel_shard_cleanup(L.s, &E, d.committed, -EIO, "rank 0: injected: its write failed",
				   9, &id));
	CHECK(sfx_wait_done(L.s, &d, deadline(60)) == 1);
	CHECK(d.cleanup && d.status == -EIO && d.cleaned == 6 && d.cleanup_failed == 0);
	CHECK(d.cookie == 9 && !strcmp(d.text, "rank 0: injected: its write failed"));
	CHECK(!sfx_has(&rk[1], &E.key, NULL) && !sfx_has(&rk[2], &E.key, NULL));
	sfx_check_same(rk, WORLD, "after cleanups");

	/* Unlinks of a record, and of one no rank has. */
	sel_record_desc gone = sfx_desc(1024, 13, NULL);
	j = one_rec(SEL_SHARD_UNLINK, &gone, &rec);
	sfx_job_all(L.s, &rk[0], &j, &local, &d);
	ok_everywhere(&local, &d);
	CHECK(d.existed == 0);
	/* A job addressed to one peer only. */
	j = store_job(&E, ids, 40, 0, &rec);
	CHECK_OK(sel_shard_submit(L.s, &j, 4, 10, &id));
	CHECK(sfx_wait_done(L.s, &d, deadline(60)) == 1 && d.ranks == 4 && d.committed == 4);
	CHECK(sfx_has(&rk[2], &E.key, NULL) && !sfx_has(&rk[1], &E.key, NULL));
	j = one_rec(SEL_SHARD_UNLINK, &E, &rec);
	CHECK_OK(sel_shard_submit(L.s, &j, 4, 11, &id));
	CHECK(sfx_wait_done(L.s, &d, deadline(60)) == 1 && d.existed == 4);
	CHECK(sel_shard_submit(L.s, &j, 1, 12, &id) == -EINVAL); /* rank 0 is no peer */
	CHECK(sel_shard_submit(L.s, &j, 8, 12, &id) == -EINVAL); /* nor is rank 3 */
	j.op = 99;
	CHECK(sel_shard_submit(L.s, &j, 0, 12, &id) == SEL_EFORMAT);
	sfx_check_same(rk, WORLD, "after phase one");
	stop(&L);
}

/* Restart every rank: nothing is lost, and the chain restores again. */
static void phase_restart(void)
{
	struct life L = {0};
	struct sel_shard_agree_stats st;
	start(&L, &st);
	printf("restart: kept %" PRIu64 ", deletes %" PRIu64 "\n", st.kept, st.deletes);
	CHECK(st.kept == 3 && st.deletes == 0 && st.truncates == 0);
	sfx_check_same(rk, WORLD, "after restarting every rank");
	fetch_and_check(&L, 40);
	/* Submissions after close are refused. */
	CHECK_OK(sel_shard_close(L.s, deadline(60)));
	struct sel_shard_rec rec;
	struct sel_shard_job j = one_rec(SEL_SHARD_UNLINK, &R, &rec);
	CHECK(sel_shard_submit(L.s, &j, 0, 1, NULL) == SEL_ESTOPPED);
	sel_shard_destroy(L.s);
	for (uint32_t r = 1; r < WORLD; r++)
		CHECK(sfx_wait_exit(L.pid[r], deadline(60)) == 0);
	sfx_rdv_close(&L.v);
	sfx_dir_close(&rk[0]);
}

int main(void)
{
	sfx_ranks_init(rk, WORLD, "link");
	R = sfx_desc(128, 1, NULL);
	C = sfx_desc(320, 2, &R);
	D = sfx_desc(384, 3, &C);
	phase_one();
	phase_restart();
	for (uint32_t r = 0; r < WORLD; r++)
		sfx_rank_free(&rk[r]);
	printf("ok\n");
	return 0;
}
