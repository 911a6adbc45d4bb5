/*
 * store_pooled_lookup.c - the pooled store's lookups: tickets with the
 * grace period, the pick among the pool's candidates and the local hit
 * (store_pooled.h has the design; restores are store_pooled_fetch.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "store_pooled.h"

/* ---- tickets --------------------------------------------------------------------------------- */

static void ticket_drop(struct sel_pooled *p, struct sp_ticket *t)
{
	sel_pool_ticket_free(p->pc, t->t);
	if (t->hist_ok)
		sel_history_free(&t->hist);
	memset(t, 0, sizeof *t);
}

void sp_tickets_free(struct sel_pooled *p, bool all)
{
	uint64_t now = eos_now_ns();
	for (uint32_t i = 0; i < SP_TICKETS; i++) {
		struct sp_ticket *t = &p->tk[i];
		if (t->used && (all || now - t->last_ns > SP_TICKET_TTL_NS))
			ticket_drop(p, t);
	}
}

/* Four recent round trips, within [2 ms, 250 ms] (design 2.15). */
static uint64_t grace_ns(const struct sel_pooled *p)
{
	uint64_t worst = 0;
	for (uint32_t i = 0; i < SP_RTTS && i < p->n_rtt; i++)
		worst = p->rtt[i] > worst ? p->rtt[i] : worst;
	uint64_t g = 4 * worst, lo = p->grace_min, hi = lo > SP_GRACE_MAX_NS ? lo : SP_GRACE_MAX_NS;
	return g < lo ? lo : g > hi ? hi : g;
}

void sp_tickets_answer(struct sel_pooled *p, sel_pool_ticket *pt)
{
	for (uint32_t i = 0; i < SP_TICKETS; i++) {
		struct sp_ticket *t = &p->tk[i];
		if (!t->used || t->t != pt)
			continue;
		uint64_t rtt = eos_now_ns() - t->t0;
		p->pc_st.answers++;
		if (rtt > t->grace_ns)
			p->pc_st.late_answers++;
		p->rtt[p->n_rtt++ % SP_RTTS] = rtt;
		return;
	}
}

/* The ticket of this lookup: the one made at this resident count, else one
 * made below it (design 2.15 "late answer": a request readmitted after a
 * shorter restore keeps its ticket and its grace period, and the pool's
 * answer is picked above the new resident count). */
static struct sp_ticket *ticket_find(struct sel_pooled *p, const sel_key *want, uint64_t resident,
				     uint64_t limit)
{
	struct sp_ticket *below = NULL;
	for (uint32_t i = 0; i < SP_TICKETS; i++) {
		struct sp_ticket *t = &p->tk[i];
		if (!t->used || t->limit != limit || t->resident > resident ||
		    !sel_key_eq(&t->want, want))
			continue;
		if (t->resident == resident)
			return t;
		below = !below || t->resident > below->resident ? t : below;
	}
	return below;
}

/* A free entry, or the least recently used one emptied. */
static struct sp_ticket *ticket_slot(struct sel_pooled *p)
{
	struct sp_ticket *old = &p->tk[0];
	for (uint32_t i = 0; i < SP_TICKETS; i++) {
		if (!p->tk[i].used)
			return &p->tk[i];
		if (p->tk[i].last_ns < old->last_ns)
			old = &p->tk[i];
	}
	ticket_drop(p, old);
	return old;
}

static int ticket_begin(struct sel_pooled *p, const sel_history *h, const sel_key *want,
			uint64_t resident, uint64_t limit)
{
	struct sp_ticket *t = ticket_slot(p);
	sel_pool_ticket *pt;
	if (sel_pool_begin_lookup(p->pc, h, resident, limit, &pt))
		return -1; /* a full queue, a lost session: the local tiers alone */
	uint64_t now = eos_now_ns();
	*t = (struct sp_ticket){.used = true,
				.seq = ++p->ticket_seq,
				.t = pt,
				.want = *want,
				.resident = resident,
				.limit = limit,
				.t0 = now,
				.last_ns = now,
				.grace_ns = grace_ns(p)};
	p->pc_st.lookups++;
	sp_arm_timer(p, now + t->grace_ns);
	return SEL_LOOKUP_PENDING;
}

void sp_lookup_warmup(struct sel_pooled *p, const uint8_t model_identity[SEL_IDENTITY_BYTES])
{
	sel_history h;
	sel_token tok[SEL_BUCKET_TOKENS] = {0};
	sel_key want;
	if (sel_history_init(&h, model_identity, "flare-pool-warmup", 17))
		return;
	if (sel_history_append(&h, tok, SEL_BUCKET_TOKENS) == 0) {
		sel_history_key_at(&h, SEL_BUCKET_TOKENS, &want);
		(void)ticket_begin(p, &h, &want, 0, SEL_BUCKET_TOKENS); /* counted */
	}
	sel_history_free(&h);
}

static bool shunned(const struct sel_pooled *p, const sel_key *k)
{
	uint64_t now = eos_now_ns();
	for (uint32_t i = 0; i < SP_SHUNNED; i++)
		if (p->shun[i].until > now && sel_key_eq(&p->shun[i].key, k))
			return true;
	return false;
}

/* answer_pick, except that a neighbour whose restore of that endpoint
 * failed lately (no headroom, gone) gives way to the arena's copy of the
 * same endpoint when there is one. */
static int pick(const struct sel_pooled *p, const struct sel_pool_m_answer *a, const sel_history *h,
		uint64_t resident)
{
	int i = sel_pool_answer_pick(a, h, resident);
	if (i < 0 || a->cands[i].source == SEL_POOL_SRC_ARENA)
		return i;
	const sel_key *k = &a->nodes[a->cands[i].node].key;
	if (!shunned(p, k))
		return i;
	for (uint32_t j = 0; j < a->n_cands; j++)
		if (a->cands[j].source == SEL_POOL_SRC_ARENA &&
		    sel_key_eq(&a->nodes[a->cands[j].node].key, k) &&
		    sel_pool_candidate_matches(a, j, h, resident))
			return (int)j;
	return i;
}

/* The pool's pick for t, when it is deeper than the local hit (lrc, hit):
 * 1 with *hit replaced, else lrc. */
static int ticket_pick(struct sel_pooled *p, struct sp_ticket *t, const sel_history *h,
		       uint64_t resident, int lrc, sel_hit *hit)
{
	const struct sel_pool_m_answer *a = sel_pool_ticket_answer(t->t);
	int i = a ? pick(p, a, h, resident) : -1;
	if (i < 0)
		return lrc;
	const sel_key *k = &a->nodes[a->cands[i].node].key;
	bool gpu = a->cands[i].source == SEL_POOL_SRC_GPU;
	/* The deeper prefix wins; at equal depth the copy priority: a
	 * neighbour's GPU, then the local DRAM and NVMe, then the arena. */
	if ((lrc == 1 &&
	     (hit->key.consumed > k->consumed || (hit->key.consumed == k->consumed && !gpu))) ||
	    k->consumed <= resident)
		return lrc;
	if (!t->hist_ok) {
		if (sel_history_copy(&t->hist, h))
			return lrc;
		t->hist_ok = true;
	}
	uint32_t pt = p->w.base.page_tokens;
	/* A tie the neighbour won: the same endpoint locally is the fallback. */
	t->has_local = lrc == 1 && sel_key_eq(&hit->key, k);
	if (t->has_local)
		t->local = *hit;
	*hit = (sel_hit){
		.key = *k,
		.resident = resident,
		.pages = (uint32_t)(k->consumed / pt - resident / pt),
		.bytes = a->cands[i].bytes,
		.tier = SEL_TIER_POOL,
		.cookie = t->seq << 16 | (uint64_t)(t - p->tk) << 8 | (uint64_t)i,
		.neighbour = a->cands[i].source != SEL_POOL_SRC_ARENA,
		.neighbour_tier = a->cands[i].source == SEL_POOL_SRC_DRAM   ? SEL_TIER_MEMORY
				  : a->cands[i].source == SEL_POOL_SRC_NVME ? SEL_TIER_DISK
									    : SEL_TIER_NONE,
	};
	return 1;
}

/* The lookup of a request readmitted after its pool restore failed
 * (design 2.15 "One source"): the local tiers' answer alone (lrc, a
 * shorter prefix or none), no new pool lookup, so the next restore has
 * one source; the ticket goes.  Later than SP_SHUN_NS it is an ordinary
 * lookup again. */
static bool failed_lookup(struct sel_pooled *p, struct sp_ticket *t, int lrc)
{
	bool fresh = eos_now_ns() - t->failed_ns < SP_SHUN_NS;
	ticket_drop(p, t);
	if (fresh && lrc == 1)
		p->pc_st.local_fallbacks++;
	return fresh;
}

int sp_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit, sel_hit *hit)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	int lrc = sel_wrap_lookup(s, h, resident, limit, hit);
	if (lrc < 0 || !p->pc || p->closed)
		return lrc;
	uint64_t len = sel_history_len(h), top = limit < len ? limit : len;
	if (top <= resident || (lrc == 1 && hit->key.consumed >= top))
		return lrc;
	sel_key want;
	sel_history_key_at(h, top, &want);
	struct sp_ticket *t = ticket_find(p, &want, resident, limit);
	/* Its pool restore failed (also when the session went with it): this
	 * once, the local tiers. */
	if (t && t->failed_ns) {
		if (failed_lookup(p, t, lrc))
			return lrc;
		t = NULL;
	}
	if (sel_pool_state(p->pc) != SEL_POOL_ATTACHED)
		return lrc;
	if (t && sel_pool_ticket_state(t->t) == SEL_POOL_TICKET_FAILED) {
		ticket_drop(p, t); /* a session that ended: ask the new one */
		t = NULL;
	}
	if (!t) {
		int rc = ticket_begin(p, h, &want, resident, limit);
		return rc < 0 ? lrc : rc;
	}
	uint64_t now = eos_now_ns();
	t->last_ns = now;
	if (sel_pool_ticket_state(t->t) == SEL_POOL_TICKET_PENDING) {
		if (now < t->t0 + t->grace_ns) {
			sp_arm_timer(p, t->t0 + t->grace_ns);
			return SEL_LOOKUP_PENDING;
		}
		if (!t->grace_counted) {
			t->grace_counted = true;
			p->pc_st.grace_expired++;
		}
		return lrc;
	}
	int rc = ticket_pick(p, t, h, resident, lrc, hit);
	if (rc == 1 && hit->tier == SEL_TIER_POOL && !t->hit_counted) {
		t->hit_counted = true; /* counted once per ticket */
		p->pc_st.hits++;
	}
	return rc;
}

void sp_ticket_failed(struct sel_pooled *p, uint32_t slot, uint64_t seq, bool keep)
{
	struct sp_ticket *t = slot < SP_TICKETS ? &p->tk[slot] : NULL;
	if (!t || !t->used || t->seq != seq)
		return;
	if (keep) { /* the readmission asks the local tiers alone */
		t->failed_ns = eos_now_ns();
		t->last_ns = t->failed_ns;
	} else {
		ticket_drop(p, t); /* its answer named what failed: ask again next time */
	}
}

struct sp_ticket *sp_ticket_of(struct sel_pooled *p, const sel_hit *hit, uint32_t *cand)
{
	uint32_t slot = (uint32_t)(hit->cookie >> 8 & 0xff);
	struct sp_ticket *t = slot < SP_TICKETS ? &p->tk[slot] : NULL;
	*cand = (uint32_t)(hit->cookie & 0xff);
	if (!t || !t->used || t->seq != hit->cookie >> 16 || !t->hist_ok ||
	    sel_pool_ticket_state(t->t) != SEL_POOL_TICKET_READY)
		return NULL;
	return t;
}
