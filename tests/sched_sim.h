/*
 * sched_sim.h - a simulated model worker with fake GPU memory, for the
 * scheduler tests (header-only; static functions).
 *
 * The "GPU" stores, for every page id and row slot, the PrefixKey of the
 * token prefix its bytes would describe: a page holding tokens [jP, jP+P)
 * of a history holds key_at((j+1)P), a row holding c tokens holds
 * key_at(c).  Executing an entry checks what it reads (the row it resumes,
 * every page of its table, a restore source) against the request's own
 * history and writes what the model would write, so a wrong, stale or
 * shared-by-mistake id shows up as a wrong key.  The simulated store
 * writes a ticket's destinations the same way.
 *
 * The fake also tracks, per id, the last fence that used it; a ticket's
 * destinations must not be in use by a step in flight (design 2.12), and a
 * published checkpoint's bytes must all have been written by completed
 * steps (GPU-ready).
 *
 * Entries run when planned (as a GPU would start them); complete_step is
 * called later, oldest step first, so several steps can be in flight.
 */
#ifndef SCHED_SIM_H
#define SCHED_SIM_H

#include "helios/cache.h"
#include "helios/map.h"
#include "helios/scheduler.h"
#include "testutil.h"

static const uint8_t sim_model_id[SEL_IDENTITY_BYTES] = {42, 1, 2, 3};

static void sim_check_ok(hel_scheduler *s)
{
	int rc = hel_scheduler_check(s);
	CHECKF(rc == 0, "%s", sel_errmsg());
}

/* Tokens of a request or checkpoint, kept by id. */
struct sim_rec {
	uint64_t id;
	sel_token *t;
	uint64_t n;
	const void *salt;
	size_t salt_len;
};

struct sim_recs {
	hel_map m;
	struct sim_rec *r;
	size_t n, cap;
};

static struct sim_rec *sim_rec_find(struct sim_recs *rs, uint64_t id)
{
	uint64_t h = hel_mix64(id);
	for (size_t p = hel_map_first(&rs->m, h); p != HEL_MAP_END; p = hel_map_next(&rs->m, h, p))
		if (rs->r[rs->m.v[p]].id == id)
			return &rs->r[rs->m.v[p]];
	return NULL;
}

static struct sim_rec *sim_rec_put(struct sim_recs *rs, uint64_t id, const sel_token *t, uint64_t n,
				   const void *salt, size_t salt_len)
{
	struct sim_rec *x = sim_rec_find(rs, id);
	if (!x) {
		if (rs->n == rs->cap) {
			rs->cap = rs->cap ? 2 * rs->cap : 64;
			rs->r = realloc(rs->r, rs->cap * sizeof(*rs->r));
			CHECK(rs->r);
		}
		CHECK_OK(hel_map_add(&rs->m, hel_mix64(id), (uint32_t)rs->n));
		x = &rs->r[rs->n++];
		memset(x, 0, sizeof(*x));
		x->id = id;
	}
	free(x->t);
	x->t = malloc((n + 1) * sizeof(sel_token));
	CHECK(x->t);
	memcpy(x->t, t, n * sizeof(sel_token));
	x->n = n;
	x->salt = salt;
	x->salt_len = salt_len;
	return x;
}

static void sim_recs_free(struct sim_recs *rs)
{
	for (size_t i = 0; i < rs->n; i++)
		free(rs->r[i].t);
	free(rs->r);
	hel_map_free(&rs->m);
	memset(rs, 0, sizeof(*rs));
}

struct sim_step {
	hel_step st;
	hel_step_result res[256];
};

struct sim {
	hel_scheduler *s;
	hel_cache *c;
	uint32_t P, np, nr;
	sel_key *page, *row;          /* contents; consumed UINT64_MAX = garbage */
	uint64_t *page_use, *row_use; /* last fence reading or writing the id */
	uint64_t *page_wr, *row_wr;   /* last fence writing the id */
	test_rng rng;
	uint32_t stop_one_in; /* sample the stop token one time in N (0 never) */
	uint32_t spec;        /* decode entries emit up to 1 + spec tokens (rounds) */
	sel_token stop;
	struct sim_step q[8];
	int qhead, nq;
	struct sim_recs reqs, ckpts; /* request and checkpoint tokens */
	uint64_t completed;
	/* counters */
	uint64_t finished, entries, restores, captures, published;
	/* the last take's publications (copied) */
	sel_published last_pub[512];
	size_t n_last_pub;
};

static void sim_garbage(sel_key *k)
{
	memset(k, 0, sizeof(*k));
	k->consumed = UINT64_MAX;
}

static void sim_init(struct sim *m, const hel_scheduler_config *cfg0, uint64_t seed)
{
	memset(m, 0, sizeof(*m));
	hel_scheduler_config cfg = *cfg0;
	memcpy(cfg.model_identity, sim_model_id, SEL_IDENTITY_BYTES);
	CHECK_OK(hel_scheduler_create(&cfg, &m->s));
	m->c = hel_scheduler_cache(m->s);
	m->P = cfg.page_tokens;
	m->np = cfg.n_pages;
	m->nr = cfg.n_rows;
	m->page = calloc(m->np, sizeof(sel_key));
	m->row = calloc(m->nr, sizeof(sel_key));
	m->page_use = calloc(m->np, sizeof(uint64_t));
	m->row_use = calloc(m->nr, sizeof(uint64_t));
	m->page_wr = calloc(m->np, sizeof(uint64_t));
	m->row_wr = calloc(m->nr, sizeof(uint64_t));
	CHECK(m->page && m->row && m->page_use && m->row_use && m->page_wr && m->row_wr);
	for (uint32_t i = 0; i < m->np; i++)
		sim_garbage(&m->page[i]);
	for (uint32_t i = 0; i < m->nr; i++)
		sim_garbage(&m->row[i]);
	test_rng_init(&m->rng, seed);
	sim_check_ok(m->s);
}

static void sim_free(struct sim *m)
{
	hel_scheduler_destroy(m->s);
	free(m->page);
	free(m->row);
	free(m->page_use);
	free(m->row_use);
	free(m->page_wr);
	free(m->row_wr);
	sim_recs_free(&m->reqs);
	sim_recs_free(&m->ckpts);
}

static void sim_history(sel_history *h, const sel_token *t, uint64_t n, const void *salt, size_t sl)
{
	CHECK_OK(sel_history_init(h, sim_model_id, salt, sl));
	CHECK_OK(sel_history_append(h, t, n));
}

static bool key_eq_dbg(const sel_key *a, const sel_key *b) { return sel_key_eq(a, b); }

/* ---- admission ---------------------------------------------------------------- */

enum sim_inbound {
	SIM_NO_HOST = 0,
	SIM_HOST_RANDOM,
	SIM_HOST_AT
};

/* Plan and admit spec.  With SIM_HOST_AT an inbound hit at consumed `at`
 * (above the GPU hit) is passed; with SIM_HOST_RANDOM one is made up one
 * time in two where possible.  A new ticket's destinations are written as
 * the store would.  Returns admit_planned's result. */
static int sim_admit(struct sim *m, const hel_request_spec *spec, enum sim_inbound mode,
		     uint64_t at, hel_admission *adm, sel_hit *hit_out)
{
	hel_admission_plan plan;
	int rc = hel_scheduler_plan_admission(m->s, spec, &plan);
	if (rc)
		return rc;
	/* The GPU hit is a prefix of the prompt. */
	if (plan.gpu) {
		sel_key k;
		sel_history_key_at(&plan.history, plan.gpu_consumed, &k);
		CHECK(sel_key_eq(&k, &plan.gpu_key) && plan.gpu_consumed <= spec->prompt_len);
		const hel_ckpt *g = hel_cache_get(m->c, plan.gpu);
		CHECK(g && hel_cache_ready(m->c, g) && hel_ckpt_has_row(g));
	}
	sel_hit hit, *hp = NULL;
	uint64_t a = plan.gpu_consumed;
	if (mode == SIM_HOST_RANDOM && a < spec->prompt_len && test_rng_below(&m->rng, 2)) {
		/* Half the time the whole prompt, a capture point others reach too. */
		at = test_rng_below(&m->rng, 2)
			     ? spec->prompt_len
			     : a + 1 + test_rng_below(&m->rng, spec->prompt_len - a);
		mode = SIM_HOST_AT;
	}
	if (mode == SIM_HOST_AT) {
		CHECK(at > a && at <= spec->prompt_len);
		memset(&hit, 0, sizeof(hit));
		sel_history_key_at(&plan.history, at, &hit.key);
		hit.resident = a;
		hit.pages = (uint32_t)(at / m->P - a / m->P);
		hit.tier = SEL_TIER_MEMORY;
		hp = &hit;
		plan.host_lookup = true;
		if (hit_out)
			*hit_out = hit;
	}
	rc = hel_scheduler_admit_planned(m->s, spec, &plan, hp, adm);
	if (rc) {
		hel_admission_plan_free(&plan);
		return rc;
	}
	CHECK(plan.history.tokens == NULL); /* moved into the request */
	sim_rec_put(&m->reqs, adm->req, spec->prompt, spec->prompt_len, spec->salt, spec->salt_len);
	if (hp)
		CHECK(adm->phase == HEL_PHASE_INBOUND && adm->reused_tokens == at);
	if (adm->fetch) {
		/* The store writes the ticket: chain pages past a, then the row. */
		hel_request_info inf;
		CHECK_OK(hel_scheduler_request_info(m->s, adm->req, &inf));
		const sel_inbound *in = &adm->inbound;
		CHECK(in->n_pages == hit.pages);
		for (uint32_t j = 0; j < in->n_pages; j++) {
			uint32_t pg = in->pages[j];
			CHECK(hel_cache_page_state(m->c, pg) == HEL_ID_OUT);
			CHECKF(m->page_use[pg] <= m->completed,
			       "ticket page %u in use by fence %llu", pg,
			       (unsigned long long)m->page_use[pg]);
			sel_history_key_at(inf.history, (a / m->P + j + 1) * m->P, &m->page[pg]);
			m->page_wr[pg] = 0;
		}
		CHECK(hel_cache_row_state(m->c, in->state_slot) == HEL_ID_OUT);
		CHECK(m->row_use[in->state_slot] <= m->completed);
		sel_history_key_at(inf.history, at, &m->row[in->state_slot]);
		m->row_wr[in->state_slot] = 0;
	}
	return 0;
}

/* ---- steps ------------------------------------------------------------------------- */

static void sim_read_page(struct sim *m, uint32_t pg, const sel_history *h, uint64_t j,
			  uint64_t fence)
{
	sel_key want;
	hel_id_state st = hel_cache_page_state(m->c, pg);
	CHECKF(st == HEL_ID_OUT || st == HEL_ID_CKPT, "page %u read in state %d", pg, st);
	sel_history_key_at(h, (j + 1) * m->P, &want);
	CHECKF(key_eq_dbg(&m->page[pg], &want), "page %u (chain index %llu) holds the wrong prefix",
	       pg, (unsigned long long)j);
	m->page_use[pg] = fence;
}

static void sim_execute(struct sim *m, const hel_step *st, hel_step_result *res)
{
	uint32_t P = m->P;
	for (size_t i = 0; i < st->n; i++) {
		const hel_step_entry *e = &st->entries[i];
		hel_request_info inf;
		CHECK_OK(hel_scheduler_request_info(m->s, e->req, &inf));
		const sel_history *h = inf.history;
		uint64_t len = sel_history_len(h);
		CHECK(inf.in_flight && inf.phase != HEL_PHASE_INBOUND);
		CHECK(e->live_row == inf.live_row);
		CHECK(hel_cache_row_state(m->c, e->live_row) == HEL_ID_OUT);
		CHECK(e->n_pages == e->end / P && e->begin <= e->end && e->end <= len);
		CHECK(e->first_new_page == e->begin / P);
		sel_key want;
		m->entries++;
		if (e->kind == HEL_ENTRY_RESTORE) {
			CHECK(e->begin == e->end && e->restore_consumed == e->end);
			CHECK(hel_cache_row_state(m->c, e->restore_src) == HEL_ID_CKPT);
			sel_history_key_at(h, e->restore_consumed, &want);
			CHECKF(key_eq_dbg(&m->row[e->restore_src], &want),
			       "restore source row %u is wrong", e->restore_src);
			CHECK(m->row_wr[e->restore_src] <= m->completed); /* GPU-ready */
			m->row[e->live_row] = m->row[e->restore_src];
			m->row_use[e->restore_src] = st->fence;
			m->restores++;
		} else {
			if (e->kind == HEL_ENTRY_DECODE)
				CHECK(e->end - e->begin == 1 && e->sample && e->begin + 1 == len);
			else
				CHECK(e->kind == HEL_ENTRY_PREFILL && e->end > e->begin);
			if (e->reset) {
				CHECK(e->begin == 0);
				sel_history_key_at(h, 0, &m->row[e->live_row]);
			}
			sel_history_key_at(h, e->begin, &want);
			CHECKF(key_eq_dbg(&m->row[e->live_row], &want),
			       "request %llu live row %u does not hold %llu tokens",
			       (unsigned long long)e->req, e->live_row,
			       (unsigned long long)e->begin);
			for (uint64_t t = e->begin; t < e->end; t++)
				CHECK(e->tokens[t - e->begin] == inf.tokens[t]);
			for (uint64_t j = 0; j < e->begin / P; j++)
				sim_read_page(m, e->pages[j], h, j, st->fence);
			for (uint64_t j = e->begin / P; j < e->end / P; j++) {
				uint32_t pg = e->pages[j];
				hel_id_state s = hel_cache_page_state(m->c, pg);
				CHECK(s == HEL_ID_OUT || s == HEL_ID_CKPT);
				sel_history_key_at(h, (j + 1) * P, &m->page[pg]);
				m->page_use[pg] = m->page_wr[pg] = st->fence;
			}
			sel_history_key_at(h, e->end, &m->row[e->live_row]);
		}
		m->row_use[e->live_row] = m->row_wr[e->live_row] = st->fence;
		if (e->capture_row != HEL_NONE) {
			const hel_ckpt *k = hel_cache_get(m->c, e->capture);
			CHECK(k && k->row == e->capture_row && k->key.consumed == e->end);
			CHECK(k->ready_after == st->fence && !hel_cache_ready(m->c, k));
			m->row[e->capture_row] = m->row[e->live_row];
			m->row_use[e->capture_row] = m->row_wr[e->capture_row] = st->fence;
			const struct sim_rec *rq = sim_rec_find(&m->reqs, e->req);
			sim_rec_put(&m->ckpts, e->capture, inf.tokens, e->end, rq->salt,
				    rq->salt_len);
			m->captures++;
		} else {
			CHECK(e->capture == HEL_CKPT_NONE);
		}
		res[i].token = 0;
		res[i].n_more = 0;
		if (e->sample) {
			CHECK(e->end == len && e->emit_max >= 1);
			CHECK(e->kind == HEL_ENTRY_DECODE || e->emit_max == 1);
			/* A speculative round emits several, consuming all but the
			 * last, none of them on a page's last slot (the first, at
			 * e->end, only if the round could go on past it). */
			uint32_t n = 1;
			if (m->spec && e->emit_max > 1) {
				uint32_t want = 1 + (uint32_t)test_rng_below(&m->rng, m->spec + 1);
				while (n < want && n < e->emit_max && n < HEL_STEP_TOKENS_MAX &&
				       (e->end + n - 1) % P != P - 1)
					n++;
			}
			for (uint32_t k = 0; k < n; k++) {
				sel_token t = (sel_token)(1 + test_rng_below(&m->rng, 200));
				if (t == m->stop)
					t++;
				if (k + 1 == n && m->stop_one_in &&
				    test_rng_below(&m->rng, m->stop_one_in) == 0)
					t = m->stop;
				if (k == 0)
					res[i].token = t;
				else
					res[i].more[res[i].n_more++] = t;
			}
		}
	}
}

/* Plan and run a step; 1 if one was planned. */
static int sim_step(struct sim *m)
{
	if (m->nq == 8)
		return 0;
	hel_step st;
	int rc = hel_scheduler_next_step(m->s, &st);
	if (rc == -EBUSY)
		return 0;
	CHECK_OK(rc);
	sim_check_ok(m->s);
	if (rc == 0)
		return 0;
	struct sim_step *q = &m->q[(m->qhead + m->nq) % 8];
	CHECK(st.n <= 256);
	q->st = st;
	sim_execute(m, &st, q->res);
	m->nq++;
	return 1;
}

/* Complete the oldest step in flight; 1 if there was one. */
static int sim_complete(struct sim *m)
{
	if (!m->nq)
		return 0;
	struct sim_step *q = &m->q[m->qhead];
	/* Terminals are taken at the request's consumed count: remember the
	 * tokens of each sampling request before it may retire. */
	struct {
		hel_req_id id;
		sel_token *t;
		uint64_t n;
	} pre[256];
	size_t npre = 0;
	for (size_t i = 0; i < q->st.n; i++) {
		hel_request_info inf;
		if (!q->st.entries[i].sample ||
		    hel_scheduler_request_info(m->s, q->st.entries[i].req, &inf))
			continue;
		pre[npre].id = q->st.entries[i].req;
		pre[npre].t = malloc((inf.n_tokens + 1) * sizeof(sel_token));
		memcpy(pre[npre].t, inf.tokens, inf.n_tokens * sizeof(sel_token));
		pre[npre].n = inf.n_tokens;
		npre++;
	}
	CHECK_OK(hel_scheduler_complete_step(m->s, q->st.fence, q->res, q->st.n));
	m->completed = q->st.fence;
	for (size_t i = 0; i < q->st.n; i++) {
		hel_req_id id = q->st.entries[i].req;
		struct sim_rec *rec = sim_rec_find(&m->reqs, id);
		for (size_t k = 0; k < npre; k++) {
			if (pre[k].id != id)
				continue;
			/* The tokens the step added; a round's all but the last
			 * are in the live row (and its terminal) now. */
			uint32_t nm = q->res[i].n_more;
			pre[k].t = realloc(pre[k].t, (pre[k].n + 1 + nm) * sizeof(sel_token));
			CHECK(pre[k].t);
			pre[k].t[pre[k].n] = q->res[i].token;
			memcpy(pre[k].t + pre[k].n + 1, q->res[i].more, nm * sizeof(sel_token));
			if (q->res[i].terminal)
				sim_rec_put(&m->ckpts, q->res[i].terminal, pre[k].t, pre[k].n + nm,
					    rec->salt, rec->salt_len);
			sim_rec_put(&m->reqs, id, pre[k].t, pre[k].n + 1 + nm, rec->salt,
				    rec->salt_len);
			if (nm) {
				sel_history h;
				sim_history(&h, pre[k].t, pre[k].n + nm, rec->salt, rec->salt_len);
				sel_history_key_at(&h, pre[k].n + nm,
						   &m->row[q->st.entries[i].live_row]);
				sel_history_free(&h);
			}
		}
		if (q->res[i].finished) {
			m->finished++;
			hel_request_info inf;
			CHECK(hel_scheduler_request_info(m->s, id, &inf) == -ENOENT);
			if (q->res[i].terminal) {
				const hel_ckpt *t = hel_cache_get(m->c, q->res[i].terminal);
				CHECK(t && (t->flags & HEL_CK_TERMINAL) &&
				      hel_cache_ready(m->c, t));
				CHECK(t->flags & HEL_CK_DEFERRED);
			}
		}
	}
	for (size_t k = 0; k < npre; k++)
		free(pre[k].t);
	m->qhead = (m->qhead + 1) % 8;
	m->nq--;
	sim_check_ok(m->s);
	return 1;
}

/* Find the tokens of checkpoint k: recorded, else from any request whose
 * history has its key (a preempted terminal). */
static const struct sim_rec *sim_ckpt_tokens(struct sim *m, const hel_ckpt *k)
{
	const struct sim_rec *r = sim_rec_find(&m->ckpts, k->id);
	if (r)
		return r;
	for (size_t i = 0; i < m->reqs.n; i++) {
		const struct sim_rec *q = &m->reqs.r[i];
		if (q->n < k->key.consumed)
			continue;
		sel_key kk;
		sel_key_direct(sim_model_id, q->salt, q->salt_len, q->t, k->key.consumed, &kk);
		if (sel_key_eq(&kk, &k->key))
			return sim_rec_put(&m->ckpts, k->id, q->t, k->key.consumed, q->salt,
					   q->salt_len);
	}
	return NULL;
}

/* Take and verify publications: exact chains, rows, tails, parents,
 * readiness.  Returns the count. */
static size_t sim_take(struct sim *m)
{
	const sel_published *p;
	size_t n;
	CHECK_OK(hel_scheduler_take_publications(m->s, &p, &n));
	m->n_last_pub = 0;
	for (size_t i = 0; i < n; i++) {
		const hel_ckpt *k = hel_cache_get(m->c, p[i].checkpoint);
		CHECK(k && hel_ckpt_has_row(k) && hel_cache_ready(m->c, k));
		CHECK(sel_key_eq(&k->key, &p[i].key) && k->row == p[i].state_slot);
		CHECK((k->flags & HEL_CK_OFFERED) && (k->flags & HEL_CK_TAKEN) &&
		      !(k->flags & HEL_CK_QUEUED));
		CHECK(p[i].n_pages == p[i].key.consumed / m->P && p[i].tail <= p[i].n_pages);
		CHECK(p[i].n_pages - p[i].tail == p[i].parent.consumed / m->P);
		CHECK(i == 0 || p[i - 1].key.consumed <= p[i].key.consumed);
		CHECK(key_eq_dbg(&m->row[p[i].state_slot], &p[i].key));
		CHECK(m->row_wr[p[i].state_slot] <= m->completed);
		const struct sim_rec *r = sim_ckpt_tokens(m, k);
		CHECKF(r, "no tokens known for checkpoint %llu", (unsigned long long)k->id);
		sel_history h;
		sim_history(&h, r->t, k->key.consumed, r->salt, r->salt_len);
		for (uint32_t j = 0; j < p[i].n_pages; j++) {
			sel_key want;
			sel_history_key_at(&h, (uint64_t)(j + 1) * m->P, &want);
			CHECKF(key_eq_dbg(&m->page[p[i].pages[j]], &want),
			       "published page %u wrong", j);
			CHECK(m->page_wr[p[i].pages[j]] <= m->completed);
		}
		sel_key bk;
		CHECK(hel_digest_eq(&p[i].bucket, sel_history_bound(&h, k->key.consumed / 64)));
		if (!sel_key_is_none(&p[i].parent)) {
			sel_history_key_at(&h, p[i].parent.consumed, &bk);
			CHECK(sel_key_eq(&bk, &p[i].parent) &&
			      p[i].parent.consumed < k->key.consumed);
			/* the parent is the nearest offered ancestor */
			const hel_ckpt *x = k->parent;
			while (x && !(x->flags & HEL_CK_OFFERED))
				x = x->parent;
			CHECK(x && sel_key_eq(&x->key, &p[i].parent));
		}
		sel_history_free(&h);
		if (m->n_last_pub < 512)
			m->last_pub[m->n_last_pub++] = p[i];
	}
	m->published += n;
	return n;
}

/* Run steps until nothing is runnable and nothing is in flight. */
static void sim_drain(struct sim *m, int max_steps)
{
	for (int i = 0; i < max_steps; i++) {
		int planned = sim_step(m);
		int done = sim_complete(m);
		if (!planned && !done)
			return;
	}
	CHECKF(0, "no quiescence after %d steps", max_steps);
}

static void sim_counts(struct sim *m, hel_cache_counts *k)
{
	hel_cache_counts_get(m->c, k);
	CHECK(k->pages_free + k->pages_pending + k->pages_ckpt + k->pages_out == k->pages_total);
	CHECK(k->rows_free + k->rows_pending + k->rows_ckpt + k->rows_out == k->rows_total);
}

/* After release_after_shutdown every id is free. */
static void sim_release_all(struct sim *m)
{
	hel_scheduler_release_after_shutdown(m->s);
	m->nq = 0;
	sim_check_ok(m->s);
	hel_cache_counts k;
	sim_counts(m, &k);
	CHECKF(k.pages_free == k.pages_total && k.rows_free == k.rows_total && !k.checkpoints,
	       "after release: %u/%u pages and %u/%u rows free, %u checkpoints", k.pages_free,
	       k.pages_total, k.rows_free, k.rows_total, k.checkpoints);
}

/* A prompt: tokens base[0..n) */
static hel_request_spec sim_spec(const sel_token *t, uint64_t n, const uint64_t *ends, size_t nends,
				 uint32_t max_tokens)
{
	hel_request_spec sp = {.prompt = t,
			       .prompt_len = n,
			       .message_ends = ends,
			       .n_message_ends = nends,
			       .max_tokens = max_tokens};
	return sp;
}

#endif
