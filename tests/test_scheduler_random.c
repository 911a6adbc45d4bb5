/*
 * test_scheduler_random.c - thousands of random scheduler operations
 * against the simulated worker of sched_sim.h (design 2.7, 2.2, 2.12).
 *
 * Operations: admissions of prompts that share prefixes and continue
 * earlier conversations (so GPU hits, deferred terminals and message
 * checkpoints recur), with random message boundaries, salts, stop tokens
 * and simulated host hits (new and joined tickets); steps planned and
 * completed out of step with everything else, so several are in flight;
 * inbound successes and failures (failed waiters cancelled); cancellations
 * in every phase; publications with copy-out pins taken and dropped;
 * explicit evictions; notices and describe.  After every operation
 * hel_scheduler_check() (which runs hel_cache_check()) must pass, and the
 * fake GPU verifies every byte an entry reads.  At the end every request
 * finishes, every ticket completes, and after release_after_shutdown every
 * page and row is free.
 *
 * TEST_SEED replays a run; SELENE_SOAK=1 runs ten times longer.
 */
#include <time.h>

#include "sched_sim.h"

enum {
	NBASE = 5,
	BASELEN = 700,
	MAXPROMPT = 520
};

struct run {
	struct sim m;
	test_rng rng;
	sel_token base[NBASE][BASELEN];
	hel_req_id *ids;
	size_t nids, capids;
	sel_key tickets[256];
	size_t ntickets;
	uint64_t pins[256];
	size_t npins;
	bool long_gen;
	uint64_t admitted, again, inbound_ok, inbound_fail, cancels, evictions, notices, lost;
};

static void track(struct run *r, hel_req_id id)
{
	if (r->nids == r->capids) {
		r->capids = r->capids ? 2 * r->capids : 256;
		r->ids = realloc(r->ids, r->capids * sizeof(*r->ids));
		CHECK(r->ids);
	}
	r->ids[r->nids++] = id;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void op_admit(struct run *r, bool allow_host)
{
	test_rng *g = &r->rng;
	sel_token prompt[MAXPROMPT];
	uint64_t len;
	if (r->m.reqs.n && test_rng_below(g, 5) < 2) {
		/* Continue an earlier conversation. */
		const struct sim_rec *q = &r->m.reqs.r[test_rng_below(g, r->m.reqs.n)];
		if (q->salt)
			return;
		len = q->n < MAXPROMPT - 100 ? q->n : MAXPROMPT - 100;
		memcpy(prompt, q->t, len * sizeof(sel_token));
		uint64_t extra = test_rng_below(g, 100);
		for (uint64_t i = 0; i < extra; i++)
			prompt[len++] = (sel_token)(300 + test_rng_below(g, 50));
	} else {
		const sel_token *b = r->base[test_rng_below(g, NBASE)];
		len = 1 + test_rng_below(g, 450);
		memcpy(prompt, b, len * sizeof(sel_token));
	}
	if (!len)
		return;
	uint64_t ends[4];
	size_t nends = 0;
	for (uint64_t i = test_rng_below(g, 4); i > 0; i--)
		ends[nends++] = 1 + test_rng_below(g, len);
	qsort(ends, nends, sizeof(*ends), cmp_u64);
	size_t u = 0;
	for (size_t i = 0; i < nends; i++)
		if (!u || ends[i] != ends[u - 1])
			ends[u++] = ends[i];
	uint32_t max_tokens =
		1 + (uint32_t)(test_rng_below(g, r->long_gen ? 2 : 4) ? test_rng_below(g, 40)
								      : test_rng_below(g, 150));
	hel_request_spec sp = sim_spec(prompt, len, ends, u, max_tokens);
	if (test_rng_below(g, 10) == 0) {
		sp.salt = "tenant-b";
		sp.salt_len = 8;
	}
	sp.has_stop = test_rng_below(g, 2);
	sp.stop = 0;
	hel_admission adm;
	sel_hit hit;
	enum sim_inbound mode =
		allow_host && test_rng_below(g, 3) == 0 ? SIM_HOST_RANDOM : SIM_NO_HOST;
	/* Join a live ticket now and then: same prompt prefix as its key. */
	int rc = sim_admit(&r->m, &sp, mode, 0, &adm, &hit);
	if (rc == -EAGAIN) {
		r->again++;
		return;
	}
	CHECKF(rc == 0, "admit: %d %s", rc, sel_errmsg());
	r->admitted++;
	track(r, adm.req);
	if (adm.fetch) {
		CHECK(r->ntickets < 256);
		r->tickets[r->ntickets++] = hit.key;
	}
	/* The same prompt again at once: both compute the same captures (one
	 * is skipped), or the GPU computes a ticket's key meanwhile. */
	if (test_rng_below(g, 4) == 0) {
		hel_admission a3;
		rc = sim_admit(&r->m, &sp, SIM_NO_HOST, 0, &a3, NULL);
		CHECK(rc == 0 || rc == -EAGAIN);
		if (rc == 0) {
			track(r, a3.req);
			r->admitted++;
		}
	}
	/* A second waiter on the same ticket. */
	if (adm.phase == HEL_PHASE_INBOUND && test_rng_below(g, 3) == 0) {
		hel_request_spec sp2 = sp;
		sp2.message_ends = NULL;
		sp2.n_message_ends = 0;
		hel_admission_plan plan;
		CHECK_OK(hel_scheduler_plan_admission(r->m.s, &sp2, &plan));
		if (plan.gpu_consumed < hit.key.consumed) {
			hit.resident = plan.gpu_consumed;
			hit.pages =
				(uint32_t)(hit.key.consumed / r->m.P - plan.gpu_consumed / r->m.P);
			hel_admission a2;
			rc = hel_scheduler_admit_planned(r->m.s, &sp2, &plan, &hit, &a2);
			if (rc == 0) {
				CHECK(!a2.fetch && a2.inbound.ticket == adm.inbound.ticket);
				sim_rec_put(&r->m.reqs, a2.req, sp2.prompt, sp2.prompt_len,
					    sp2.salt, sp2.salt_len);
				track(r, a2.req);
				r->admitted++;
			} else {
				CHECK(rc == -EAGAIN);
			}
		}
		hel_admission_plan_free(&plan);
	}
}

static void op_finish_inbound(struct run *r, bool ok)
{
	if (!r->ntickets)
		return;
	size_t i = test_rng_below(&r->rng, r->ntickets);
	sel_key key = r->tickets[i];
	r->tickets[i] = r->tickets[--r->ntickets];
	const hel_req_id *failed;
	size_t nf;
	CHECK_OK(hel_scheduler_finish_inbound(r->m.s, &key, ok ? 0 : -EIO, &failed, &nf));
	if (ok) {
		r->inbound_ok++;
		CHECK(nf == 0);
		return;
	}
	r->inbound_fail++;
	hel_req_id ids[64];
	CHECK(nf <= 64);
	if (nf)
		memcpy(ids, failed, nf * sizeof(*ids));
	sim_check_ok(r->m.s);
	for (size_t j = 0; j < nf; j++) {
		hel_request_info in;
		CHECK_OK(hel_scheduler_request_info(r->m.s, ids[j], &in));
		CHECK(in.phase == HEL_PHASE_INBOUND && in.ticket == 0);
		CHECK_OK(hel_scheduler_cancel(r->m.s, ids[j]));
	}
}

static void op_cancel(struct run *r)
{
	if (!r->nids)
		return;
	size_t i = test_rng_below(&r->rng, r->nids);
	int rc = hel_scheduler_cancel(r->m.s, r->ids[i]);
	CHECK(rc == 0 || rc == -ENOENT);
	r->cancels += rc == 0;
	r->ids[i] = r->ids[--r->nids];
}

static void op_take(struct run *r)
{
	sim_take(&r->m);
	for (size_t i = 0; i < r->m.n_last_pub; i++)
		if (r->npins < 256 && test_rng_below(&r->rng, 2)) {
			CHECK_OK(hel_scheduler_pin(r->m.s, r->m.last_pub[i].checkpoint));
			r->pins[r->npins++] = r->m.last_pub[i].checkpoint;
		}
}

static void op_unpin(struct run *r)
{
	if (!r->npins)
		return;
	size_t i = test_rng_below(&r->rng, r->npins);
	CHECK_OK(hel_scheduler_unpin(r->m.s, r->pins[i]));
	r->pins[i] = r->pins[--r->npins];
}

static void op_notices(struct run *r)
{
	hel_notice nt[8];
	bool lost;
	size_t n = hel_scheduler_take_evictions(r->m.s, nt, 8, &lost);
	r->notices += n;
	r->lost += lost;
	for (size_t i = 0; i < n; i++) {
		CHECK(!sel_key_is_none(&nt[i].key) && nt[i].generation);
		if (!sel_key_is_none(&nt[i].heir))
			CHECK(nt[i].heir.consumed > nt[i].key.consumed);
	}
}

static void op_describe(struct run *r)
{
	size_t cur = test_rng_below(&r->rng, 64);
	const hel_ckpt *k = hel_cache_iter(r->m.c, &cur);
	if (!k)
		return;
	sel_published d;
	int rc = hel_scheduler_describe(r->m.s, k->id, &d);
	if (hel_ckpt_has_row(k) && (k->flags & HEL_CK_OFFERED)) {
		CHECK_OK(rc);
		CHECK(d.checkpoint == k->id && d.state_slot == k->row &&
		      d.n_pages == k->key.consumed / r->m.P);
	} else {
		CHECK(rc == -ENOENT);
	}
}

static void one_run(uint64_t seed, int ops, bool tight)
{
	struct run *r = calloc(1, sizeof(*r));
	CHECK(r);
	test_rng_init(&r->rng, seed);
	test_rng *g = &r->rng;
	hel_scheduler_config c = {
		.page_tokens = 64,
		.n_pages = 16 + (uint32_t)test_rng_below(g, 80),
		.n_rows = 10 + (uint32_t)test_rng_below(g, 24),
		.max_active = 3 + (uint32_t)test_rng_below(g, 8),
		.chunk_tokens = 32 + (uint32_t)test_rng_below(g, 256),
		.step_tokens = 64 + (uint32_t)test_rng_below(g, 1024),
		.max_inflight = 1 + (uint32_t)test_rng_below(g, 3),
		.notice_cap = 4 + (uint32_t)test_rng_below(g, 16),
	};
	if (tight) {
		/* Few pages, long generations: decoders run out and preempt. */
		c.n_pages = 12 + (uint32_t)test_rng_below(g, 8);
		r->long_gen = true;
	}
	printf("run: seed %llu, %u pages, %u rows, %u active, chunk %u, step %u, %u in flight\n",
	       (unsigned long long)seed, c.n_pages, c.n_rows, c.max_active, c.chunk_tokens,
	       c.step_tokens, c.max_inflight);
	sim_init(&r->m, &c, seed ^ 0x5eed);
	/* Half the runs decode in speculative rounds of up to 1 + spec tokens. */
	r->m.spec = test_rng_below(g, 2) ? 1 + (uint32_t)test_rng_below(g, 16) : 0;
	printf("     rounds of up to %u tokens\n", 1 + r->m.spec);
	r->m.stop_one_in = 25;
	r->m.stop = 0;
	for (int b = 0; b < NBASE; b++)
		for (int i = 0; i < BASELEN; i++)
			/* Bases share their first 64*b tokens with base 0. */
			r->base[b][i] = (sel_token)(i < 64 * b ? i + 1 : 1000 * (b + 1) + i);

	for (int it = 0; it < ops; it++) {
		uint64_t op = test_rng_below(g, 100);
		if (op < 15)
			op_admit(r, true);
		else if (op < 45)
			sim_step(&r->m);
		else if (op < 70)
			sim_complete(&r->m);
		else if (op < 74)
			op_finish_inbound(r, true);
		else if (op < 75)
			op_finish_inbound(r, false);
		else if (op < 77)
			op_cancel(r);
		else if (op < 85)
			op_take(r);
		else if (op < 91)
			op_unpin(r);
		else if (op < 95)
			r->evictions +=
				hel_scheduler_evict(r->m.s, 1 + (uint32_t)test_rng_below(g, 3));
		else if (op < 98)
			op_notices(r);
		else
			op_describe(r);
		sim_check_ok(r->m.s);
	}

	/* Wind down: tickets complete, pins drop, everything runs to the end. */
	while (r->ntickets)
		op_finish_inbound(r, test_rng_below(g, 4) != 0);
	while (r->npins)
		op_unpin(r);
	sim_drain(&r->m, 20000);
	sim_take(&r->m);
	op_notices(r);
	hel_scheduler_stats st;
	hel_scheduler_stats_get(r->m.s, &st);
	CHECKF(st.active == 0 && st.waiting == 0, "%llu active, %llu waiting at the end",
	       (unsigned long long)st.active, (unsigned long long)st.waiting);
	hel_cache_counts k;
	sim_counts(&r->m, &k);
	CHECK(k.pages_out == 0 && k.rows_out == 0 && k.pages_pending == 0 && k.rows_pending == 0);
	CHECK(k.pages_free + k.pages_ckpt == k.pages_total &&
	      k.rows_free + k.rows_ckpt == k.rows_total);
	printf("  %llu admitted (%llu refused), %llu finished, %llu cancelled, %llu preempted, "
	       "%llu readmitted\n  gpu hits %llu (%llu tokens), host hits %llu (%llu tokens), inbound ok "
	       "%llu existing %llu failed %llu\n  %llu steps, %llu prefill + %llu decode tokens, %llu "
	       "restores, %llu captures (%llu skipped, %llu failed), %llu terminals\n  %llu offered, "
	       "%llu published, %llu refreshed, %llu evictions, %llu compactions, %llu notices%s\n",
	       (unsigned long long)st.admitted, (unsigned long long)r->again,
	       (unsigned long long)st.finished, (unsigned long long)st.cancelled,
	       (unsigned long long)st.preempted, (unsigned long long)st.readmitted,
	       (unsigned long long)st.gpu_hits, (unsigned long long)st.gpu_reused_tokens,
	       (unsigned long long)st.host_hits, (unsigned long long)st.host_reused_tokens,
	       (unsigned long long)st.inbound_ok, (unsigned long long)st.inbound_existing,
	       (unsigned long long)st.inbound_failed, (unsigned long long)st.launches,
	       (unsigned long long)st.prefill_tokens, (unsigned long long)st.decode_tokens,
	       (unsigned long long)st.restores, (unsigned long long)st.captures,
	       (unsigned long long)st.captures_skipped, (unsigned long long)st.captures_failed,
	       (unsigned long long)st.terminals, (unsigned long long)st.offered,
	       (unsigned long long)st.published, (unsigned long long)st.refreshed,
	       (unsigned long long)st.evictions, (unsigned long long)st.compactions,
	       (unsigned long long)r->notices, r->lost ? " (some lost)" : "");
	CHECK(st.finished > 0 && st.launches > 0);
	sim_release_all(&r->m);
	sim_free(&r->m);
	free(r->ids);
	free(r);
}

int main(void)
{
	uint64_t seed = test_seed();
	int runs = test_soak() ? 60 : 6;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < runs; i++)
		one_run(seed + (uint64_t)i * 0x9e3779b97f4a7c15ull, 12000, i % 2);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("test_scheduler_random: ok (%.1f s)\n",
	       (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
	return 0;
}
