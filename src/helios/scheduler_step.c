/*
 * scheduler_step.c - the scheduler's steps: re-admission of waiting
 * requests (and the floors that hold them), planning a step (restores,
 * decode tokens, prefill chunks with checkpoint captures) and completing
 * it (sampled tokens, finishes, terminal checkpoints) (design 2.7
 * "Scheduler integration"; 2.2 for deferred captures; 2.8 for the
 * worker's side).  scheduler.h is the contract, scheduler.c has the rest
 * of the design, scheduler_int.h what the files share.
 *
 * DESIGN
 *   Captures.  Capture points are the spec's message ends plus the prompt
 *   end.  A chunk never crosses the next capture point; when it ends on
 *   one, planning creates the checkpoint at once (tail = the request's own
 *   pages, row = a fresh snapshot row, ready after the step's fence) and
 *   moves the request's prefix pin onto it, so the request's own pages are
 *   always exactly the pages since its prefix.  The row is not reserved at
 *   admission: the capture takes it now, evicting for it; when only a row
 *   awaiting a fence would do, the chunk waits for that fence; when no row
 *   can be had (copy-out pins and live rows hold them all) the capture is
 *   skipped and the request goes on with its prefix and pages as they
 *   were, so its terminal or a later capture covers the tokens.  A finished request's live
 *   row and own pages become its terminal checkpoint without any copy.
 *
 * INVARIANTS: those of scheduler.c, numbered as there (2 and 6 are the
 *   ones planning and completion keep).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "helios/scheduler_int.h"

/* ---- steps --------------------------------------------------------------------------- */

/* Oldest first; a request whose GPU checkpoint lies below its floor is
 * held (hel_scheduler_set_floor) and passed over. */
static void readmit(hel_scheduler *s)
{
	for (struct req *r = s->waiting.head, *nx; r; r = nx) {
		nx = r->next;
		if (r->held)
			continue;
		hel_admission adm;
		const hel_ckpt *A = hel_cache_lookup(s->c, &r->h, sel_history_len(&r->h));
		uint64_t a = A ? A->key.consumed : 0;
		if (a < r->floor) {
			r->held = true;
			r->held_depth = a;
			s->n_held++;
			continue;
		}
		list_del(&s->waiting, r);
		if (sch_place(s, r, A, NULL, &adm)) {
			list_push_front(&s->waiting, r);
			return;
		}
		s->st.readmitted++;
	}
}

int hel_scheduler_set_floor(hel_scheduler *s, hel_req_id id, uint64_t floor)
{
	CHECK_ON_RETURN(s);
	struct req *r = find_req(s, id);
	if (!r)
		return eos_fail(-ENOENT, "set_floor: no request %llu", (unsigned long long)id);
	r->floor = floor;
	if (r->held) {
		r->held = false;
		s->n_held--;
	}
	return 0;
}

static int arena_reserve(struct step *st, size_t pages, size_t tokens)
{
	if (eos_grow((void **)&st->pg, &st->cappg, st->npg + pages, sizeof(*st->pg)) ||
	    eos_grow((void **)&st->tk, &st->captk, st->ntk + tokens, sizeof(*st->tk)))
		return -ENOMEM;
	return 0;
}

/* Append an entry for r covering [begin, end) with its current table. */
static hel_step_entry *add_entry(struct step *st, struct req *r, hel_entry_kind kind,
				 uint64_t begin, uint64_t end, uint32_t P)
{
	hel_step_entry *e = &st->e[st->n];
	memset(e, 0, sizeof(*e));
	e->req = r->id;
	e->kind = kind;
	e->live_row = r->live_row;
	e->restore_src = HEL_NONE;
	e->capture_row = HEL_NONE;
	e->emit_max = 1;
	e->has_stop = r->has_stop;
	e->begin = begin;
	e->end = end;
	e->n_pages = (uint32_t)(end / P);
	e->first_new_page = (uint32_t)(begin / P);
	st->pg_off[st->n] = st->npg;
	if (e->n_pages)
		memcpy(st->pg + st->npg, r->table, e->n_pages * sizeof(uint32_t));
	st->npg += e->n_pages;
	st->tk_off[st->n] = st->ntk;
	if (end > begin)
		memcpy(st->tk + st->ntk, r->tok + begin, (end - begin) * sizeof(sel_token));
	st->ntk += end - begin;
	st->n++;
	return e;
}

static void plan_restore(hel_scheduler *s, struct step *st, struct req *r, uint64_t fence)
{
	const hel_ckpt *src = hel_cache_get(s->c, r->prefix);
	if (!src || !hel_cache_ready(s->c, src))
		return; /* restore after the capture that fills src completes */
	if (arena_reserve(st, r->n_table, 0))
		return;
	uint64_t len = sel_history_len(&r->h);
	hel_step_entry *e = add_entry(st, r, HEL_ENTRY_RESTORE, r->consumed, r->consumed, s->P);
	e->restore_src = src->row;
	e->restore_consumed = r->consumed;
	e->sample = r->consumed == len;
	if (e->sample)
		r->phase = HEL_PHASE_DECODE;
	else
		r->phase =
			r->n_gen && r->consumed + 1 == len ? HEL_PHASE_DECODE : HEL_PHASE_PREFILL;
	r->inflight = fence;
	r->last_fence = fence;
	s->st.restores++;
}

static void plan_decode(hel_scheduler *s, struct step *st, struct req *r, uint64_t fence,
			uint32_t *budget)
{
	uint64_t pos = r->consumed, end = pos + 1;
	if (!*budget || arena_reserve(st, end / s->P, 1))
		return;
	if (end % s->P == 0 && sch_get_pages(s, r, 1, true) != 1)
		return; /* waits for a fence, or was preempted itself */
	hel_step_entry *e = add_entry(st, r, HEL_ENTRY_DECODE, pos, end, s->P);
	e->sample = true;
	e->emit_max = r->max_tokens - r->n_gen; /* >= 1: a request stops at max_tokens */
	r->consumed = end;
	r->inflight = fence;
	r->last_fence = fence;
	(*budget)--;
	s->st.decode_tokens++;
}

/* Capture r at its consumed count `end` into a new checkpoint; returns
 * its id, HEL_CKPT_NONE when skipped (key present) or failed, or -EAGAIN
 * through *wait when the snapshot row is pending. */
static uint64_t capture(hel_scheduler *s, struct req *r, uint64_t end, uint64_t fence,
			uint32_t *row_out, bool *wait)
{
	bool is_prompt = end == r->prompt_len;
	uint64_t id = HEL_CKPT_NONE;
	sel_key key;
	*wait = false;
	*row_out = HEL_NONE;
	sel_history_key_at(&r->h, end, &key);
	if (hel_cache_find(s->c, &key)) {
		s->st.captures_skipped++;
		goto passed;
	}
	int rc = sch_ensure(s, 0, 1);
	if (rc == -EAGAIN) {
		*wait = true;
		return HEL_CKPT_NONE;
	}
	uint32_t row;
	/* The message's planned prompt checkpoint is its direct child less
	 * than one page later: defer it (design 2.2). */
	bool defer =
		!is_prompt && r->next_cap + 2 == r->n_caps && r->caps[r->n_caps - 1] - end < s->P;
	if (rc == 0 && hel_cache_alloc_row(s->c, &row) == 0) {
		hel_ckpt_spec sp = {
			.key = key,
			.bucket = *sel_history_bound(&r->h, end / SEL_BUCKET_TOKENS),
			.parent = r->prefix,
			.tail = r->table + r->n_prefix,
			.n_tail = r->n_table - r->n_prefix,
			.row = row,
			.ready_after = fence,
			.flags = (is_prompt ? HEL_CK_PROMPT : HEL_CK_MESSAGE) |
				 (defer ? HEL_CK_DEFERRED : 0),
		};
		if (hel_cache_insert(s->c, &sp, &id)) {
			hel_cache_unalloc_row(s->c, row);
			id = HEL_CKPT_NONE;
		}
	}
	if (id == HEL_CKPT_NONE) {
		s->st.captures_failed++;
		/* No snapshot for the prompt: offer the deferred message while
		 * the request still pins it (design 2.2). */
		if (is_prompt && r->deferred_msg != HEL_CKPT_NONE)
			sch_offer(s, r->deferred_msg);
		goto passed;
	}
	s->st.captures++;
	hel_cache_pin(s->c, id, false);
	if (r->prefix != HEL_CKPT_NONE)
		hel_cache_unpin(s->c, r->prefix, false);
	r->prefix = id;
	r->n_prefix = r->n_table;
	if (defer)
		r->deferred_msg = id;
	else
		sch_offer(s, id);
	*row_out = row;
passed:
	if (is_prompt)
		r->deferred_msg = HEL_CKPT_NONE;
	r->next_cap++;
	return id;
}

static void plan_prefill(hel_scheduler *s, struct step *st, struct req *r, uint64_t fence,
			 uint32_t *budget)
{
	uint64_t P = s->P, len = sel_history_len(&r->h), begin = r->consumed;
	uint64_t want = s->cfg.chunk_tokens < *budget ? s->cfg.chunk_tokens : *budget;
	if (!want)
		return;
	uint64_t end = begin + want < len ? begin + want : len;
	if (r->next_cap < r->n_caps && r->caps[r->next_cap] < end)
		end = r->caps[r->next_cap];
	if (arena_reserve(st, end / P, end - begin))
		return;
	uint32_t need = (uint32_t)(end / P - begin / P), res_before = r->res_pages;
	uint32_t got = need ? sch_get_pages(s, r, need, true) : 0;
	if (got < need) {
		uint64_t lim = (begin / P + got + 1) * P - 1;
		if (lim < end)
			end = lim;
		if (end <= begin)
			return; /* got == 0 here: nothing to give back */
	}
	uint32_t cap_row = HEL_NONE;
	uint64_t cap_id = HEL_CKPT_NONE;
	if (r->next_cap < r->n_caps && r->caps[r->next_cap] == end) {
		bool wait;
		cap_id = capture(s, r, end, fence, &cap_row, &wait);
		if (wait) {
			sch_unget_pages(s, r, got, res_before - r->res_pages);
			return;
		}
	}
	hel_step_entry *e = add_entry(st, r, HEL_ENTRY_PREFILL, begin, end, s->P);
	e->reset = begin == 0;
	e->sample = end == len;
	e->capture_row = cap_row;
	e->capture = cap_id;
	r->consumed = end;
	if (e->sample)
		r->phase = HEL_PHASE_DECODE;
	r->inflight = fence;
	r->last_fence = fence;
	*budget -= (uint32_t)(end - begin);
	s->st.prefill_tokens += end - begin;
	s->st.prefill_launches++;
}

int hel_scheduler_next_step(hel_scheduler *s, hel_step *out)
{
	CHECK_ON_RETURN(s);
	memset(out, 0, sizeof(*out));
	if (s->n_steps == s->cfg.max_inflight)
		return eos_fail(-EBUSY, "next_step: %u steps in flight", s->n_steps);
	readmit(s);
	uint64_t fence = s->submitted + 1;
	struct step *st = &s->steps[(s->step_head + s->n_steps) % s->cfg.max_inflight];
	st->fence = fence;
	st->n = st->npg = st->ntk = 0;
	uint32_t budget = s->cfg.step_tokens;
	/* Snapshot the active list: preemption moves requests out of it. */
	uint32_t n = 0;
	for (struct req *r = s->active.head; r; r = r->next)
		s->scratch[n++] = r;
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t i = 0; i < n; i++) {
			struct req *r = s->scratch[i];
			if (r->inflight)
				continue;
			if (pass == 0 && r->phase == HEL_PHASE_RESTORE)
				plan_restore(s, st, r, fence);
			else if (pass == 0 && r->phase == HEL_PHASE_DECODE)
				plan_decode(s, st, r, fence, &budget);
			else if (pass == 1 && r->phase == HEL_PHASE_PREFILL)
				plan_prefill(s, st, r, fence, &budget);
		}
	if (!st->n)
		return 0;
	for (size_t i = 0; i < st->n; i++) {
		st->e[i].pages = st->pg + st->pg_off[i];
		st->e[i].tokens = st->tk + st->tk_off[i];
	}
	s->submitted = fence;
	hel_cache_submit_fence(s->c, fence);
	s->n_steps++;
	s->st.launches++;
	out->fence = fence;
	out->entries = st->e;
	out->n = st->n;
	return 1;
}

int hel_scheduler_complete_step(hel_scheduler *s, uint64_t fence, hel_step_result *results,
				size_t n)
{
	CHECK_ON_RETURN(s);
	if (!s->n_steps)
		return eos_fail(-EINVAL, "complete_step: no step in flight");
	struct step *st = &s->steps[s->step_head];
	if (st->fence != fence || st->n != n)
		return eos_fail(
			-EINVAL,
			"complete_step: fence %llu with %zu results, expected %llu with %zu",
			(unsigned long long)fence, n, (unsigned long long)st->fence, st->n);
	for (size_t i = 0; i < n; i++) {
		const hel_step_result *res = &results[i];
		const hel_step_entry *e = &st->e[i];
		if (res->n_more >= HEL_STEP_TOKENS_MAX ||
		    (res->n_more && (e->kind != HEL_ENTRY_DECODE || 1 + res->n_more > e->emit_max)))
			return eos_fail(-EINVAL,
					"complete_step: entry %zu emitted %u tokens, at most %u", i,
					1 + res->n_more, e->emit_max);
		const struct req *r = find_req(s, e->req);
		for (uint32_t t = 0; r && e->has_stop && t < res->n_more; t++)
			if ((t ? res->more[t - 1] : res->token) == r->stop)
				return eos_fail(-EINVAL,
						"complete_step: entry %zu emitted tokens after "
						"the stop token",
						i);
	}
	s->completed = fence;
	hel_cache_complete_fence(s->c, fence);
	for (size_t i = 0; i < n; i++) {
		const hel_step_entry *e = &st->e[i];
		hel_step_result *res = &results[i];
		res->finished = HEL_FINISH_NONE;
		res->terminal = HEL_CKPT_NONE;
		struct req *r = find_req(s, e->req);
		if (!r || r->inflight != fence)
			continue; /* cancelled meanwhile */
		r->inflight = 0;
		if (!e->sample)
			continue;
		hel_finish fin = HEL_FINISH_NONE;
		uint32_t n_tok = 1 + res->n_more;
		for (uint32_t t = 0; t < n_tok && fin == HEL_FINISH_NONE; t++) {
			sel_token tk = t ? res->more[t - 1] : res->token;
			if (r->n_tok < r->cap_tok && sel_history_append(&r->h, &tk, 1) == 0) {
				r->tok[r->n_tok++] = tk;
				r->n_gen++;
				if (r->has_stop && tk == r->stop)
					fin = HEL_FINISH_STOP;
				else if (r->n_gen >= r->max_tokens)
					fin = HEL_FINISH_LENGTH;
			} else {
				fin = HEL_FINISH_ERROR;
			}
		}
		s->st.decode_tokens += n_tok - 1;
		/* A round consumed every token it emitted but the last.  Should
		 * the history not hold them all (out of memory), the row is no
		 * checkpoint of it: no terminal (last_fence 0). */
		r->consumed += n_tok - 1;
		if (r->n_tok < r->consumed)
			r->last_fence = 0;
		if (fin == HEL_FINISH_NONE) {
			r->phase = HEL_PHASE_DECODE;
			continue;
		}
		res->terminal = sch_to_terminal(s, r, false);
		res->finished = fin;
		list_del(&s->active, r);
		s->st.finished++;
		sch_req_forget(s, r);
	}
	s->step_head = (s->step_head + 1) % s->cfg.max_inflight;
	s->n_steps--;
	return 0;
}
