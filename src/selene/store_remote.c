/*
 * store_remote.c - the remote level: open, lookup, put, fetch, stats and
 * close (issue 16 part B; design 2.15).  See store_remote_int.h for the
 * design and its invariants; completions are in store_remote_poll.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "eos.h"
#include "remote_url.h"
#include "remote_value.h"
#include "store_common.h"
#include "store_remote_int.h"

static const struct sel_store_ops remote_ops;
static uint32_t described_nodes(struct remote_store *rs);

static struct remote_store *rs_of(sel_store *s) { return sel_store_checked(s, &remote_ops); }

/* ---- jobs and known keys --------------------------------------------------------- */

struct rs_job *rs_job_new(struct remote_store *rs, enum rs_job_kind kind, uint32_t n_pages,
			  uint32_t flags)
{
	uint32_t rows = rs->sp->row_slots;
	uint32_t n = n_pages + rows;
	if (!sel_slab_can_alloc(rs->sp->pool, n, SEL_SLAB_INTAKE))
		return NULL;
	struct rs_job *j = calloc(1, sizeof *j);
	if (!j)
		return NULL;
	uint32_t iov_cap = rs->ns.layout.ranks * 4 + 4;
	j->slots = calloc(n, sizeof *j->slots);
	j->ids = calloc(n_pages ? n_pages : 1, sizeof *j->ids);
	j->pagev = calloc(n_pages ? n_pages : 1, sizeof *j->pagev);
	j->iov = calloc(iov_cap, sizeof *j->iov);
	if (!j->slots || !j->ids || !j->pagev || !j->iov ||
	    sel_slab_alloc(rs->sp->pool, n, SEL_SLAB_INTAKE, j->slots) != 0)
		goto fail;
	j->kind = kind;
	j->n_slots = n;
	j->n_pages = n_pages;
	j->iov_cap = iov_cap;
	if (rs_job_map(rs, j, flags) != 0) {
		(void)sel_slab_free(rs->sp->pool, j->slots, n);
		goto fail;
	}
	j->next = rs->jobs;
	rs->jobs = j;
	if (kind == RS_OUT)
		rs->n_out++;
	return j;
fail:
	free(j->slots);
	free(j->ids);
	free(j->pagev);
	free(j->iov);
	free(j);
	return NULL;
}

/* j's copy between the GPU ids j->ids (and state slot) and its slots: the
 * pages, then the row.  Packed (flags, design 2.5): IN jobs fan one share
 * out to every rank; OUT jobs at ranks > 1 compare the ranks' copies and
 * pack them in place when they are the same (rs_job_map after). */
static void job_xfer(struct remote_store *rs, struct rs_job *j, enum sel_copy_dir dir,
		     uint32_t state_slot, uint32_t flags)
{
	j->x = (struct sel_xfer_job){.id = (uint64_t)(uintptr_t)j,
				     .dir = dir,
				     .n_pages = j->n_pages,
				     .pages = j->ids,
				     .page_slots = j->slots,
				     .row = true,
				     .state_slot = state_slot,
				     .row_slots = j->slots + j->n_pages};
	if (dir == SEL_COPY_IN) {
		j->x.pages_packed = j->n_pages && (flags & SEL_RECORD_PAGES_REPLICATED);
		j->x.row_packed = flags & SEL_RECORD_ROW_REPLICATED;
	} else {
		j->x.compare = rs->ns.layout.ranks > 1;
	}
}

int rs_job_map(struct remote_store *rs, struct rs_job *j, uint32_t flags)
{
	return sel_store_pool_map(rs->sp, flags, j->slots, j->n_pages, rs->sp->row_slots, 0,
				  j->n_pages, j->pagev, j->iov, j->iov_cap, &j->n_iov);
}

void rs_job_end(struct remote_store *rs, struct rs_job *j)
{
	for (struct rs_job **p = &rs->jobs; *p; p = &(*p)->next)
		if (*p == j) {
			*p = j->next;
			break;
		}
	if (j->kind == RS_OUT)
		rs->n_out--;
	(void)sel_slab_free(rs->sp->pool, j->slots, j->n_slots);
	free(j->slots);
	free(j->ids);
	free(j->pagev);
	free(j->iov);
	free(j->chain);
	free(j);
}

bool rs_known(const struct remote_store *rs, const sel_key *k)
{
	for (uint32_t i = 0; i < rs->n_known; i++)
		if (sel_key_eq(&rs->known[i], k))
			return true;
	return false;
}

void rs_known_add(struct remote_store *rs, const sel_key *k)
{
	if (!rs->known || rs_known(rs, k))
		return;
	rs->known[rs->known_next] = *k;
	rs->known_next = (rs->known_next + 1) % RS_KNOWN_MAX;
	if (rs->n_known < RS_KNOWN_MAX)
		rs->n_known++;
}

/* Arm the timer at the earliest grace deadline of a pending lookup (or
 * disarm it), so the worker's sleep on the wait descriptor ends then. */
void rs_arm(struct remote_store *rs)
{
	uint64_t first = 0;
	for (int i = 0; i < RS_LOOKS; i++)
		if (rs->look[i].state == RS_PENDING && (!first || rs->look[i].deadline < first))
			first = rs->look[i].deadline;
	if (first == rs->armed || rs->tfd < 0)
		return;
	struct itimerspec its = {0};
	if (first) {
		its.it_value.tv_sec = (time_t)(first / 1000000000u);
		its.it_value.tv_nsec = (long)(first % 1000000000u);
	}
	if (timerfd_settime(rs->tfd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
		rs->armed = first;
}

/* ---- lookup ------------------------------------------------------------------------ */

/* How long admission holds a request for the remote answer.  Design 2.15
 * says four round trips, 2..250 ms; a remote lookup is three dependent
 * round trips (bucket sets, manifests, window EXISTS) on an I/O thread at
 * nice 10, so this is three times the client's grace with a floor of
 * RS_GRACE_MIN_NS (docs/architecture.md, deviations).  It bounds the wait
 * only when Redis is slow: an answer, hit or miss, ends it at once. */
static uint64_t rs_grace_ns(struct remote_store *rs)
{
	uint64_t g = 3 * sel_remote_grace_ns(rs->r);
	return g < RS_GRACE_MIN_NS ? RS_GRACE_MIN_NS : g > RS_GRACE_MAX_NS ? RS_GRACE_MAX_NS : g;
}

static struct rs_look *look_find(struct remote_store *rs, const sel_key *k, uint64_t resident,
				 uint64_t limit)
{
	for (int i = 0; i < RS_LOOKS; i++) {
		struct rs_look *l = &rs->look[i];
		if (l->state != RS_FREE && l->resident == resident && l->limit == limit &&
		    sel_key_eq(&l->key, k))
			return l;
	}
	return NULL;
}

static void look_free(struct rs_look *l)
{
	sel_remote_hit_free(l->hit);
	l->hit = NULL;
	l->state = RS_FREE;
	l->gen++;
}

/* A free entry, or the oldest answered one but keep freed; NULL when all
 * are waiting for answers. */
static struct rs_look *look_take(struct remote_store *rs, const struct rs_look *keep)
{
	struct rs_look *old = NULL;
	for (int i = 0; i < RS_LOOKS; i++) {
		struct rs_look *l = &rs->look[i];
		if (l->state == RS_FREE)
			return l;
		if ((l->state == RS_HIT || l->state == RS_MISS) && l != keep &&
		    (!old || l->answered < old->answered))
			old = l;
	}
	if (old)
		look_free(old);
	return old;
}

/* Whether node i of h gives the claim pages (a page-only record of no
 * pages, or one the GPU holds whole, gives none: its layout is moot). */
static bool node_claimed(const sel_remote_hit *h, uint32_t i)
{
	return h->node[i].tail > h->node[i].skip;
}

/* The slot layout a claim of h uses (design 2.5): its pages packed when
 * the nodes that give pages are (one share for all ranks), its row as the
 * endpoint's.  At one rank the packing flags change nothing. */
static uint32_t hit_flags(const struct remote_store *rs, const sel_remote_hit *h)
{
	if (rs->ns.layout.ranks == 1)
		return 0;
	uint32_t pages = 0;
	for (uint32_t i = 0; i < h->n_nodes; i++)
		if (node_claimed(h, i)) {
			pages = h->node[i].flags & SEL_RECORD_PAGES_REPLICATED;
			break;
		}
	return pages | (h->flags & SEL_RECORD_ROW_REPLICATED);
}

/* Whether the hit's chain can be claimed into this level's slots in one
 * copy: the pages of every node that gives any laid out alike (all per
 * rank or all packed: one transfer job has one layout), no flag we do not
 * know.  A mixed chain is a miss (safe: the request recomputes). */
static bool hit_usable(const struct remote_store *rs, const sel_remote_hit *h)
{
	const uint32_t known = SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED;
	if (rs->ns.layout.ranks == 1)
		return true;
	uint32_t pages = hit_flags(rs, h) & SEL_RECORD_PAGES_REPLICATED;
	for (uint32_t i = 0; i < h->n_nodes; i++)
		if ((h->node[i].flags & ~known) ||
		    (node_claimed(h, i) &&
		     (h->node[i].flags & SEL_RECORD_PAGES_REPLICATED) != pages))
			return false;
	return !(h->flags & ~known);
}

static int inner_answer(int irc, const sel_hit *ih, sel_hit *hit)
{
	if (irc == 1)
		*hit = *ih;
	return irc;
}

/* An answered entry as the caller's hit, when it goes deeper than the inner
 * store's depth. */
static int look_answer(struct remote_store *rs, struct rs_look *l, uint64_t depth, int irc,
		       const sel_hit *ih, sel_hit *hit)
{
	if (l->state != RS_HIT || l->hit->key.consumed <= depth || !hit_usable(rs, l->hit))
		return inner_answer(irc, ih, hit);
	const sel_remote_hit *h = l->hit;
	*hit = (sel_hit){.key = h->key,
			 .resident = l->resident,
			 .pages = h->pages,
			 .bytes = h->bytes,
			 .tier = SEL_TIER_REMOTE,
			 .cookie = ((uint64_t)l->gen << 32) | (uint64_t)(l - rs->look)};
	memcpy(hit->chain.b, h->key.digest.b, sizeof hit->chain.b);
	rs->hits++;
	return 1;
}

/* The lookup at (k, resident, limit) answered from a kept hit whose
 * endpoint is k, looked up at a resident count at most resident: the same
 * chain (k is the history's key at limit, the hit's nodes were compared
 * with the history below it), rebased to resident without a round trip
 * (issue 18: an overlapped restore's tail).  Kept as an entry answered
 * when the first was (it expires with it), linked to it (look_drop).
 * NULL when no kept hit fits. */
static struct rs_look *look_derive(struct remote_store *rs, const sel_key *k, uint64_t resident,
				   uint64_t limit, uint64_t now)
{
	struct rs_look *src = NULL;
	for (int i = 0; i < RS_LOOKS && !src; i++) {
		struct rs_look *l = &rs->look[i];
		if (l->state == RS_HIT && l->hit && sel_key_eq(&l->hit->key, k) &&
		    l->hit->resident <= resident && resident < k->consumed &&
		    now - l->answered <= RS_ANSWER_TTL_NS)
			src = l;
	}
	sel_remote_hit *h;
	if (!src || sel_remote_hit_rebase(rs->r, src->hit, resident, &h))
		return NULL;
	struct rs_look *l = look_take(rs, src);
	if (!l) {
		sel_remote_hit_free(h);
		return NULL;
	}
	*l = (struct rs_look){.state = RS_HIT,
			      .key = *k,
			      .resident = resident,
			      .limit = limit,
			      .answered = src->answered,
			      .gen = l->gen,
			      .hit = h,
			      .from = (int32_t)(src - rs->look),
			      .from_gen = src->gen};
	return l;
}

/* l's hit is being claimed: drop l and the entries linked with it (the
 * one it was rebased from, the others rebased from that one or from l).
 * Their hits name the same records: once restored, they are not answered
 * from memory again. */
static void look_drop(struct remote_store *rs, struct rs_look *l)
{
	int32_t self = (int32_t)(l - rs->look), from = l->from;
	uint32_t gen = l->gen, from_gen = l->from_gen;
	if (from >= 0 && from < RS_LOOKS && rs->look[from].gen == from_gen &&
	    rs->look[from].state != RS_FREE)
		look_free(&rs->look[from]);
	for (int i = 0; i < RS_LOOKS; i++) {
		struct rs_look *d = &rs->look[i];
		if (d != l && d->state != RS_FREE &&
		    ((d->from == self && d->from_gen == gen) ||
		     (from >= 0 && d->from == from && d->from_gen == from_gen)))
			look_free(d);
	}
	look_free(l);
}

static int lookup_once(struct remote_store *rs, const sel_history *h, uint64_t resident,
		       uint64_t limit, sel_hit *hit)
{
	sel_hit ih;
	int irc = 0;
	if (rs->inner && (irc = sel_store_lookup(rs->inner, h, resident, limit, &ih)) < 0)
		return irc;
	if (irc == SEL_LOOKUP_PENDING)
		return irc; /* a pooled level still waits: ask again later */
	uint64_t depth = irc == 1 ? ih.key.consumed : resident;
	if (rs->closed || depth >= limit || limit > sel_history_len(h))
		return inner_answer(irc, &ih, hit);
	sel_key k;
	sel_history_key_at(h, limit, &k);
	struct rs_look *l = look_find(rs, &k, resident, limit);
	uint64_t now = eos_now_ns();
	if (!l)
		l = look_derive(rs, &k, resident, limit, now);
	if (!l) {
		struct sel_remote_stats st;
		sel_remote_stats(rs->r, &st);
		if (st.state == SEL_RN_DOWN || !(l = look_take(rs, NULL)))
			return inner_answer(irc, &ih, hit);
		uint64_t id;
		uint64_t cookie = ((uint64_t)l->gen << 32) | (uint64_t)(l - rs->look);
		if (sel_remote_lookup(rs->r, h, resident, limit, cookie, &id) != 0)
			return inner_answer(irc, &ih, hit);
		*l = (struct rs_look){.state = RS_PENDING,
				      .key = k,
				      .resident = resident,
				      .limit = limit,
				      .gen = l->gen,
				      .from = -1,
				      .deadline = now + rs_grace_ns(rs)};
		rs_arm(rs);
		return SEL_LOOKUP_PENDING;
	}
	if (l->state == RS_PENDING) {
		if (now < l->deadline)
			return SEL_LOOKUP_PENDING;
		l->state = RS_LATE; /* admission goes on; a later answer is kept */
		rs->lookups_late++;
		rs_arm(rs);
	}
	return look_answer(rs, l, depth, irc, &ih, hit);
}

static int rs_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_hit *hit)
{
	struct remote_store *rs = rs_of(s);
	int rc = lookup_once(rs, h, resident, limit, hit);
	if (rc == 0 || rc == 1)
		rs->lookups++; /* answered: the level's own count without a local tier */
	return rc;
}

/* ---- put --------------------------------------------------------------------------- */

/* Start the copy-out of cp's tail and row for a background write; false
 * (counted as skipped) when there is no room now. */
static bool start_out(struct remote_store *rs, const sel_published *cp, bool inner)
{
	if (rs->n_out >= RS_OUT_MAX) {
		rs->skipped++;
		return false;
	}
	struct rs_job *j = rs_job_new(rs, RS_OUT, cp->tail, 0);
	if (!j) {
		rs->skipped++;
		return false;
	}
	memcpy(j->ids, cp->pages + (cp->n_pages - cp->tail), (size_t)cp->tail * sizeof *j->ids);
	j->checkpoint = cp->checkpoint;
	j->inner = inner;
	j->d = (sel_record_desc){
		.key = cp->key, .parent = cp->parent, .bucket = cp->bucket, .tail = cp->tail};
	job_xfer(rs, j, SEL_COPY_OUT, cp->state_slot, 0);
	if (sel_xfer_submit(rs->xfer, &j->x) != 0) {
		rs_job_end(rs, j);
		rs->skipped++;
		return false;
	}
	j->copying = true;
	return true;
}

static sel_outcome rs_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	struct remote_store *rs = rs_of(s);
	sel_outcome o;
	if (rs->inner) {
		o = sel_store_put(rs->inner, cp, why);
		if (o == SEL_QUEUED && !rs->closed && !rs_known(rs, &cp->key))
			(void)start_out(rs, cp, true);
		return o;
	}
	if (rs->closed)
		o = SEL_SKIPPED;
	else if (!sel_put_usable("remote store", cp, rs->base.page_tokens, rs->sp->min_rows) ||
		 !sel_put_pages_fit("remote store", cp, cp->tail, rs->sp->min_pages))
		o = SEL_SKIPPED;
	else if (rs_known(rs, &cp->key))
		o = SEL_PRESENT; /* on Redis already: nothing to write */
	else
		o = start_out(rs, cp, false) ? SEL_QUEUED : SEL_SKIPPED;
	rs->outcomes[o]++;
	return o;
}

/* ---- fetch ------------------------------------------------------------------------- */

static int rs_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	struct remote_store *rs = rs_of(s);
	if (!hit || !in)
		return eos_fail(-EINVAL, "remote store: fetch without a hit or destination");
	if (hit->tier != SEL_TIER_REMOTE) {
		if (!rs->inner)
			return eos_fail(-EINVAL, "remote store: a %s hit and no local tier",
					sel_tier_name(hit->tier));
		return sel_store_fetch(rs->inner, hit, in);
	}
	if (rs->closed)
		return eos_fail(SEL_ESTOPPED, "remote store: closed");
	uint32_t slot = (uint32_t)(hit->cookie & 0xffffffffu);
	struct rs_look *l = slot < RS_LOOKS ? &rs->look[slot] : NULL;
	if (!l || l->gen != (uint32_t)(hit->cookie >> 32) || l->state != RS_HIT ||
	    !sel_key_eq(&l->hit->key, &hit->key))
		return eos_fail(-ESTALE, "remote store: the hit is gone");
	if (in->n_pages != hit->pages || !in->pages)
		return eos_fail(-EINVAL,
				"remote store: %" PRIu32 " destination pages for a hit of %" PRIu32,
				in->n_pages, hit->pages);
	sel_remote_hit *h = l->hit;
	/* An overlapped restore's tail: its head's digests from the manifest
	 * the lookup verified (issue 18). */
	int src = in->n_sums ? sel_remote_hit_head_sums(h, in->n_sums, in->sums) : 0;
	if (src)
		return src;
	uint32_t flags = hit_flags(rs, h);
	struct rs_job *j = rs_job_new(rs, RS_IN, hit->pages, flags);
	if (!j)
		return eos_fail(-EAGAIN, "remote store: no intake slots for %" PRIu32 " pages",
				hit->pages);
	j->chain = calloc(h->n_nodes, sizeof *j->chain);
	for (uint32_t i = 0; j->chain && i < h->n_nodes; i++)
		j->chain[j->n_chain++] = h->node[i].key;
	memcpy(j->ids, in->pages, (size_t)in->n_pages * sizeof *j->ids);
	j->ticket = in->ticket;
	j->key = hit->key;
	j->bytes = hit->bytes;
	j->t0 = eos_now_ns();
	job_xfer(rs, j, SEL_COPY_IN, in->state_slot, flags);
	struct sel_remote_dest dest = {
		.pages = j->pagev, .n_pages = j->n_pages, .row = j->iov, .row_n = j->n_iov};
	l->hit = NULL; /* the client's now, whatever the claim says */
	look_drop(rs, l);
	uint64_t id;
	int rc = sel_remote_claim(rs->r, h, &dest, (uint64_t)(uintptr_t)j, &id);
	if (rc) {
		rs_job_end(rs, j);
		return eos_fail(rc == -EAGAIN ? -EAGAIN : -ESTALE, "remote store: claim: %s",
				sel_errmsg());
	}
	j->remote = true;
	rs->fetches++;
	rs->inflight_in++;
	return 0;
}

/* ---- the rest of the table --------------------------------------------------------------- */

static void rs_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir)
{
	struct remote_store *rs = rs_of(s);
	if (rs->inner)
		sel_store_evicted(rs->inner, key, generation, heir);
}

static void rs_touch(sel_store *s, const sel_key *key)
{
	struct remote_store *rs = rs_of(s);
	if (rs->inner)
		sel_store_touch(rs->inner, key);
}

static void remote_tier_stats(struct remote_store *rs, sel_remote_tier_stats *o)
{
	struct sel_remote_stats st;
	sel_remote_stats(rs->r, &st);
	*o = (sel_remote_tier_stats){
		.enabled = true,
		.lookups = st.lookups,
		.hits = st.hits,
		.lookups_late = rs->lookups_late,
		.bytes_in = st.bytes_in,
		.bytes_out = st.bytes_out,
		.puts = st.puts,
		.stored = st.stored,
		.present = st.present,
		.put_failures = st.put_failures,
		.skipped = st.skipped + rs->skipped,
		.writes_in_flight = rs->n_out,
		.claims = st.claims,
		.claim_failures = st.claim_failures,
		.auth_failures = st.auth_failures,
		.corrupt = st.corrupt,
		.dropped = st.dropped,
		.moved = st.moved,
		.ask = st.ask,
		.reconnects = st.reconnects,
		.stalls = st.stalls,
		.state = (uint32_t)st.state,
		.nodes = st.nodes,
		.nodes_up = st.nodes_up,
		.rtt_ns = st.rtt_ns,
		.grace_ns = st.grace_ns,
	};
	for (int i = 0; i < SEL_REMOTE_RTT_BINS && i < SEL_REMOTE_RTT_BUCKETS; i++)
		o->rtt_hist[i] = st.rtt_hist[i];
	o->rtt_sum_ns = st.rtt_sum_ns;
}

static void rs_stats(sel_store *s, sel_stats *out)
{
	struct remote_store *rs = rs_of(s);
	if (rs->inner) {
		sel_store_stats(rs->inner, out);
	} else {
		*out = (sel_stats){.transport = rs->sp->backend->name};
		for (int i = 0; i <= SEL_SKIPPED; i++)
			out->outcomes[i] = rs->outcomes[i];
		out->slot_bytes = rs->sp->slot_bytes;
		out->slots_total = sel_slab_total(rs->sp->pool);
		out->intake_slots = sel_slab_intake(rs->sp->pool);
		out->slots_in_use = sel_slab_in_use(rs->sp->pool);
	}
	remote_tier_stats(rs, &out->remote);
	sel_tier_stats *t = &out->tier[SEL_TIER_REMOTE];
	t->bytes_in = out->remote.bytes_in;
	t->bytes_out = out->remote.bytes_out;
	t->held = out->remote.stored;
	t->corrupt = out->remote.corrupt + out->remote.auth_failures;
	t->rate_bps = 400ull << 20;
	if (!rs->inner)
		out->lookups = rs->lookups;
	out->hits += rs->hits;
	out->fetches += rs->fetches;
	out->fetch_failures += rs->fetch_failures;
	out->reused_tokens += rs->reused_tokens;
	out->inflight_in += rs->inflight_in;
	out->inflight_out += rs->n_out;
}

static int rs_wait_fd(sel_store *s) { return rs_of(s)->evq.epfd; }

static void rs_describe(sel_store *s, sel_store_info *out)
{
	struct remote_store *rs = rs_of(s);
	if (rs->inner) {
		sel_store_describe(rs->inner, out);
	} else {
		out->kind = "remote";
		out->slot_bytes = rs->sp->slot_bytes;
	}
	char nodes[512];
	sel_remote_describe(rs->r, nodes, sizeof nodes);
	uint32_t n = described_nodes(rs);
	snprintf(rs->desc, sizeof rs->desc, "%s (%" PRIu32 " node%s: %s), %s, encryption %s",
		 rs->url, n, n == 1 ? "" : "s", nodes[0] ? nodes : "none answered yet", rs->keydesc,
		 rs->encrypt ? "on" : "off");
	out->remote = rs->desc;
	if (rs->warning[0] && (!out->warning || !out->warning[0]))
		out->warning = rs->warning;
}

/* ---- close, destroy, open --------------------------------------------------------- */

/* OUT jobs whose copy or inner event is still to come. */
static bool out_waiting(const struct remote_store *rs)
{
	for (const struct rs_job *j = rs->jobs; j; j = j->next)
		if (j->kind == RS_OUT && !j->remote && (!j->copied || (j->inner && !j->have_held)))
			return true;
	return false;
}

#define RS_CLOSE_WAIT_NS (5000ull * 1000000) /* without a deadline */
#define RS_XFER_GRACE_NS (200ull * 1000000)

static int rs_close(sel_store *s, uint64_t deadline_ns)
{
	struct remote_store *rs = rs_of(s);
	if (rs->closed && rs->close_done)
		return rs->close_rc;
	rs->closed = true;
	uint64_t end = deadline_ns ? deadline_ns : eos_now_ns() + RS_CLOSE_WAIT_NS;
	while (out_waiting(rs) && eos_now_ns() < end)
		if (!rs_service(rs))
			sel_evq_nap(&rs->evq, 10);
	int rc = rs->inner ? sel_store_close(rs->inner, deadline_ns) : 0;
	rs->inner_closed = true;
	/* Queued remote writes finish within the shutdown bound. */
	int rrc = sel_remote_close(rs->r, deadline_ns);
	(void)rs_service(rs);
	if (rrc)
		rs->close_note = "remote writes cut short by the shutdown deadline";
	/* The level's copies are host copies of a few records, finished or
	 * about to: a deadline the remote writes used up still lets them
	 * drain (RS_XFER_GRACE_NS) instead of leaking the slots. */
	uint64_t xd = deadline_ns;
	if (xd && xd < eos_now_ns() + RS_XFER_GRACE_NS)
		xd = eos_now_ns() + RS_XFER_GRACE_NS;
	int xrc = sel_xfer_close(rs->xfer, xd);
	(void)rs_service(rs);
	if (xrc == SEL_ESTOPPED) {
		rs->leak = true;
		rc = SEL_ESTOPPED;
	}
	rs->close_done = true;
	rs->close_rc = rc;
	return rc;
}

static void rs_free(struct remote_store *rs)
{
	if (rs->leak) {
		/* A copy may still touch the slots: keep them (design 2.8). */
		void *keep[] = {rs->sp, rs->jobs};
		sel_store_pool_leak(rs->sp);
		sel_leak(keep, 2);
		rs->sp = NULL;
		rs->jobs = NULL;
		rs->xfer = NULL;
	}
	sel_store_destroy(rs->inner);
	sel_remote_destroy(rs->r);
	sel_xfer_destroy(rs->xfer);
	while (rs->jobs)
		rs_job_end(rs, rs->jobs);
	for (int i = 0; i < RS_LOOKS; i++)
		sel_remote_hit_free(rs->look[i].hit);
	sel_store_pool_destroy(rs->sp);
	if (rs->ns_ok)
		sel_record_ns_free(&rs->ns);
	sel_evq_free(&rs->evq);
	if (rs->tfd >= 0)
		close(rs->tfd);
	free(rs->known);
	free(rs);
}

static void rs_destroy(sel_store *s)
{
	struct remote_store *rs = rs_of(s);
	if (!rs->close_done)
		(void)rs_close(s, 0);
	rs_free(rs);
}

/* The local tiers' deferred thread wakes (issue 18). */
static void rs_flush(sel_store *s)
{
	struct remote_store *rs = rs_of(s);
	if (rs->inner)
		sel_store_flush(rs->inner);
}

static const struct sel_store_ops remote_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "remote",
	.lookup = rs_lookup,
	.put = rs_put,
	.fetch = rs_fetch,
	.poll = rs_poll,
	.evicted = rs_evicted,
	.touch = rs_touch,
	.stats = rs_stats,
	.wait_fd = rs_wait_fd,
	.close = rs_close,
	.destroy = rs_destroy,
	.describe = rs_describe,
	.flush = rs_flush,
	.fetch_sums = true, /* remote hits: the manifest's; others: the inner store's answer */
};

#define RS_STARTUP_WAIT_NS (2000ull * 1000000)

/* Nodes the client's description names (host:port, comma separated). */
static uint32_t described_nodes(struct remote_store *rs)
{
	char nodes[512];
	sel_remote_describe(rs->r, nodes, sizeof nodes);
	uint32_t n = nodes[0] ? 1 : 0;
	for (const char *c = nodes; *c; c++)
		n += *c == ',';
	return n;
}

/* The startup wait for a first answer (open may block; the worker never
 * does): the startup line can name the nodes, and a Redis that does not
 * answer is said once. */
static void first_contact(struct remote_store *rs)
{
	uint64_t end = eos_now_ns() + RS_STARTUP_WAIT_NS;
	struct sel_remote_stats st;
	for (;;) {
		sel_remote_stats(rs->r, &st);
		/* A cluster: its slot map and every master it names. */
		bool settled = st.state == SEL_RN_UP && (!rs->cluster || st.map_refreshes > 0) &&
			       described_nodes(rs) == st.nodes;
		if (settled || eos_now_ns() >= end)
			break;
		eos_sleep_ns(5ull * 1000000);
	}
	if (st.state == SEL_RN_UP)
		return;
	char err[512];
	sel_remote_last_error(rs->r, err, sizeof err);
	snprintf(rs->warning, sizeof rs->warning,
		 "remote tier %s: %s (%s); lookups miss and writes are skipped until it answers",
		 rs->url,
		 st.state == SEL_RN_DEGRADED ? "some nodes do not answer" : "no node answers",
		 err[0] ? err : "no answer yet");
}

static int rs_open_parts(struct remote_store *rs, const sel_store_config *cfg)
{
	int rc;
	if ((rc = sel_record_ns_init(&rs->ns, cfg->geometry, cfg->identity)))
		return rc;
	rs->ns_ok = true;
	if ((rc = sel_evq_init(&rs->evq, "remote store")))
		return rc;
	rs->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (rs->tfd < 0)
		return eos_fail(-errno, "remote store: timerfd: %s", strerror(errno));
	if ((rc = sel_evq_watch(&rs->evq, rs->tfd, "remote store")))
		return rc;
	if ((rc = sel_store_pool_open(cfg, 0, "remote store", &rs->sp)))
		return rc;
	if ((rc = sel_store_pool_xfer_create(rs->sp, cfg->queue_depth ? cfg->queue_depth : 64,
					     &rs->xfer)))
		return rc;
	sel_store_landed_install(cfg, rs->xfer);
	if ((rc = sel_evq_watch(&rs->evq, sel_xfer_fd(rs->xfer), "remote store")))
		return rc;
	struct sel_remote_config rcfg = {
		.url = cfg->remote,
		.ns = &rs->ns,
		.key = cfg->remote_key,
		.encrypt = cfg->remote_encrypt,
		.max_age_ns = cfg->max_age_ns,
		.window_bytes = cfg->remote_window_bytes,
	};
	if ((rc = sel_remote_open(&rcfg, &rs->r)))
		return eos_fail(rc, "prefix cache remote '%s': %s", cfg->remote, sel_errmsg());
	if ((rc = sel_evq_watch(&rs->evq, sel_remote_wait_fd(rs->r), "remote store")))
		return rc;
	int ifd = rs->inner ? sel_store_wait_fd(rs->inner) : -1;
	if (ifd >= 0 && (rc = sel_evq_watch(&rs->evq, ifd, "remote store")))
		return rc;
	if (!(rs->known = calloc(RS_KNOWN_MAX, sizeof *rs->known)))
		return eos_fail(-ENOMEM, "remote store: out of memory");
	return 0;
}

static void key_text(struct remote_store *rs, const sel_store_config *cfg)
{
	if (!cfg->remote_key) {
		snprintf(rs->keydesc, sizeof rs->keydesc, "no key (checksums only)");
		return;
	}
	struct sel_rv_keys k;
	struct sel_rv_names n;
	if (sel_rv_keys_init(&k, cfg->remote_key, cfg->remote_encrypt) != 0) {
		snprintf(rs->keydesc, sizeof rs->keydesc, "key");
		return;
	}
	sel_rv_names_init(&n, &rs->ns, &k);
	sel_rv_keys_wipe(&k);
	snprintf(rs->keydesc, sizeof rs->keydesc, "key %s", n.prefix);
}

int sel_remote_store_open(const sel_store_config *cfg, sel_store *inner, sel_store **out)
{
	*out = NULL;
	struct sel_ru_url u;
	int rc = sel_ru_parse(cfg->remote, &u);
	struct remote_store *rs = rc ? NULL : calloc(1, sizeof *rs);
	if (!rs) {
		if (!rc)
			rc = eos_fail(-ENOMEM, "remote store: out of memory");
		if (inner) {
			char m[512];
			snprintf(m, sizeof m, "%s", sel_errmsg());
			(void)sel_store_close(inner, 0);
			sel_store_destroy(inner);
			eos_fail(rc, "%s", m);
		}
		return rc;
	}
	rs->base.ops = &remote_ops;
	rs->base.page_tokens = cfg->geometry->page_tokens;
	rs->inner = inner;
	rs->tfd = -1;
	rs->evq.efd = rs->evq.epfd = -1;
	rs->encrypt = cfg->remote_encrypt;
	rs->cluster = u.kind == SEL_RU_CLUSTER;
	(void)sel_ru_format(&u, rs->url, sizeof rs->url);
	if ((rc = rs_open_parts(rs, cfg))) {
		char m[512];
		snprintf(m, sizeof m, "%s", sel_errmsg());
		if (rs->inner)
			(void)sel_store_close(rs->inner, 0);
		rs->close_done = true;
		rs_free(rs);
		return eos_fail(rc, "%s", m);
	}
	key_text(rs, cfg);
	first_contact(rs);
	*out = &rs->base;
	return 0;
}

/* ---- public helpers ---------------------------------------------------------------------- */

int sel_remote_key_load(const char *path, uint8_t out[32]) { return sel_rv_key_load(path, out); }

int sel_remote_url_check(const char *url)
{
	struct sel_ru_url u;
	return sel_ru_parse(url, &u);
}

const char *sel_remote_state_label(uint32_t state)
{
	return sel_remote_state_name((enum sel_rn_state)state);
}
