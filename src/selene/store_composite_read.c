/*
 * store_composite_read.c - the composite's fetches that read through:
 * a chain whose nodes are not all in memory gets warm slots from the memory
 * store for the missing ones, is read into them from disk, becomes a
 * durable memory resident and is uploaded by the memory store's fetch
 * (design 2.4 CompositeStore "fetch walks the chain ... read with read_into
 * into those slabs, and uploads from them"; 2.12 the subset invariant).
 *
 * DESIGN
 *
 * Eligibility.  The disk chain above the resident count is collected from
 * the disk index and must be the chain the lookup verified (the chain
 * digest of issue 12, recomputed here over the disk records), every node
 * READY and not doomed.  A node already in memory must be a complete copy
 * (the endpoint with its row) not waiting for removal: it is pinned
 * (ROLE_RESIDENT).  A node not in memory must have a committed file and
 * link in memory -- its parent in memory or read too, or itself a root --
 * and is reserved (ROLE_READ: RESERVED in the state table).  The reads
 * must fit in free plus clean warm slots, so a read-through never evicts
 * residents for an admission that cannot succeed.  Otherwise the caller
 * streams the chain from disk instead (1).
 *
 * Overlapped reads (issue 18, r26disk).  When every node is read (none
 * resident) and the chain starts at its first node's first page, one
 * sel_disk_store_fetch_into reads the chain window by window into the
 * reserved slots and copies each window in to the destination as soon as
 * its read is verified: the upload overlaps the reads after it, where the
 * path below reads everything first and uploads after.  The disk store
 * sends the fetch's event; its read hook, in the same poll, settles the
 * copies: admitted only when every byte landed verified (status 0), else
 * released.  Where the disk store declines the shape, the path below.
 *
 * Reads.  Each reserved node with pages (and the endpoint's row) is read
 * with read_into straight into its reserved slots; a node that owns no
 * pages is not read (the empty reserved copy stands in for it).  The fetch
 * holds one count while it submits, so the last read landing -- possibly
 * synchronously -- finds every read counted.  When all landed, poll
 * settles the copies (ancestors first) and fetches from memory; should the
 * memory fetch refuse the chain after all, the disk store streams it.  A
 * failed read settles every reserved copy as failed (its slots go back),
 * unpins the residents and fails the ticket.
 *
 * INVARIANTS
 *
 *   1. A cfetch is on the fetches list from its reads' submission until it
 *      uploads or fails; every ROLE_READ key is reserved in memory and
 *      every ROLE_RESIDENT key pinned by it until then.
 *   2. pending counts the reads in flight plus the submission hold (an
 *      overlapped fetch: its one stream); read_done is set once, when it
 *      reaches 0.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "record.h"
#include "store_composite_int.h"

static void fetch_failed_event(struct comp_store *cs, uint64_t ticket, const sel_key *key,
			       uint64_t bytes, int status, uint64_t submit_ns)
{
	sel_event ev = {0};
	uint64_t now = eos_now_ns();
	ev.type = SEL_EV_FETCH_FAILED;
	ev.outcome = SEL_QUEUED;
	ev.error = status ? status : -EIO;
	ev.ticket = ticket;
	ev.key = *key;
	ev.tier = SEL_TIER_DISK;
	ev.bytes = bytes;
	ev.duration_ns = now > submit_ns ? now - submit_ns : 0;
	cs->st.fetch_failures++;
	cs->st.inflight_in--;
	sel_evq_push(&cs->evq, &ev);
}

/* Release what a read-through holds: reserved copies settle, resident
 * pins drop. */
static void cfetch_release(struct comp_store *cs, struct cfetch *f, bool ok)
{
	if (ok) {
		for (uint32_t i = 0; i < f->n; i++)
			if (f->role[i] == ROLE_READ)
				sel_memory_store_settle(cs->mem, &f->keys[i], true);
	} else {
		for (uint32_t i = f->n; i-- > 0;)
			if (f->role[i] == ROLE_READ)
				sel_memory_store_settle(cs->mem, &f->keys[i], false);
	}
	for (uint32_t i = 0; i < f->n; i++)
		if (f->role[i] == ROLE_RESIDENT)
			sel_memory_store_unpin(cs->mem, &f->keys[i]);
}

static void cfetch_free(struct comp_store *cs, struct cfetch *f)
{
	cfetches_del(&cs->fetches, f);
	free(f);
}

/* The reads landed: upload through the memory store, or stream from disk
 * when memory cannot serve the chain after all.  Returns false to retry
 * later (memory transfer queue full). */
static bool cfetch_upload(struct comp_store *cs, struct cfetch *f)
{
	sel_inbound in = {.ticket = f->ticket,
			  .pages = f->dst,
			  .n_pages = f->n_dst,
			  .state_slot = f->state_slot};
	if (f->overlapped) {
		/* The disk store uploaded each window and sends the event;
		 * the copies are admitted only when every byte landed
		 * verified. */
		cfetch_release(cs, f, f->status == 0);
		if (f->status)
			cs->pg.released = true; /* the reserved slots */
		cfetch_free(cs, f);
		return true;
	}
	if (f->status) {
		cfetch_release(cs, f, false);
		cs->pg.released = true; /* the reserved slots, the residents' pins */
		fetch_failed_event(cs, f->ticket, &f->hit.key, f->hit.bytes, f->status,
				   f->submit_ns);
		cfetch_free(cs, f);
		return true;
	}
	/* Commit the copies (ancestors first) while still pinned, then fetch:
	 * the memory fetch pins them itself before ours drop. */
	for (uint32_t i = 0; i < f->n; i++) {
		if (f->role[i] != ROLE_READ)
			continue;
		(void)sel_memory_store_pin(cs->mem, &f->keys[i]);
		sel_memory_store_settle(cs->mem, &f->keys[i], true);
		f->role[i] = ROLE_RESIDENT;
	}
	int rc = sel_store_fetch(cs->mem, &f->hit, &in);
	if (rc == -EAGAIN)
		return false;
	if (rc == 0) {
		(void)cs_tk_add(cs, f->ticket, SEL_TIER_DISK, f->hit.bytes, f->submit_ns);
		cs->g.read_through++;
	} else {
		rc = sel_disk_store_chain_on_disk(cs->disk, &f->hit.key, f->hit.resident)
			     ? sel_store_fetch(cs->disk, &f->hit, &in)
			     : -ESTALE;
		if (rc == 0)
			cs->g.streamed++;
		else
			fetch_failed_event(cs, f->ticket, &f->hit.key, f->hit.bytes, rc,
					   f->submit_ns);
	}
	cfetch_release(cs, f, true);
	cfetch_free(cs, f);
	return true;
}

static void read_done(struct comp_store *cs, struct cfetch *f, int status)
{
	if (status && !f->status)
		f->status = status;
	if (--f->pending == 0) {
		f->read_done = true;
		sel_evq_wake(&cs->evq); /* may be synchronous, with nothing else to wake poll */
	}
}

void cs_read_done(void *ctx, void *arg, int status) { read_done(ctx, arg, status); }

void cs_fetches_advance(struct comp_store *cs)
{
	for (struct cfetch *f = cs->fetches.head, *next; f; f = next) {
		next = f->next;
		if (f->read_done)
			(void)cfetch_upload(cs, f);
	}
}

/* ---- eligibility ------------------------------------------------------------------ */

/* The disk chain of hit above its resident count, ascending. */
struct dchain {
	sel_key *keys;
	struct sel_disk_record_info *info;
	uint32_t n, cap;
};

static void dchain_free(struct dchain *c)
{
	free(c->keys);
	free(c->info);
}

static int dchain_grow(struct dchain *c)
{
	uint32_t cap = c->cap ? c->cap * 2 : 8;
	sel_key *k = realloc(c->keys, cap * sizeof(*k));
	if (k)
		c->keys = k;
	struct sel_disk_record_info *i = realloc(c->info, cap * sizeof(*i));
	if (i)
		c->info = i;
	if (!k || !i)
		return -ENOMEM;
	c->cap = cap;
	return 0;
}

/* Collect it: 0, 1 (a node is not READY or doomed: not eligible), or
 * -ENOMEM. */
static int dchain_collect(struct comp_store *cs, const sel_hit *hit, struct dchain *c)
{
	for (sel_key k = hit->key;;) {
		if (c->n == c->cap && dchain_grow(c))
			return -ENOMEM;
		struct sel_disk_record_info *x = &c->info[c->n];
		if (sel_disk_store_record(cs->disk, &k, x) != 0 || !x->ready || x->doomed)
			return 1;
		c->keys[c->n++] = k;
		if (x->is_root || x->parent.consumed <= hit->resident)
			break;
		k = x->parent;
	}
	for (uint32_t i = 0; i < c->n / 2; i++) { /* ascending */
		uint32_t j = c->n - 1 - i;
		sel_key t = c->keys[i];
		c->keys[i] = c->keys[j];
		c->keys[j] = t;
		struct sel_disk_record_info u = c->info[i];
		c->info[i] = c->info[j];
		c->info[j] = u;
	}
	return 0;
}

/* Exactly the nodes the lookup compared with the request's history (else
 * the disk fetch refuses the hit as stale). */
static bool dchain_verified(const struct comp_store *cs, const sel_hit *hit, const struct dchain *c)
{
	uint64_t base = c->info[0].is_root ? 0 : c->info[0].parent.consumed;
	uint32_t skip = (uint32_t)(hit->resident / cs->pt - base / cs->pt);
	sel_digest dg;
	memset(&dg, 0, sizeof dg);
	for (uint32_t i = 0; i < c->n; i++) {
		uint32_t used = c->info[i].tail - (i == 0 ? skip : 0);
		if (used || i + 1 == c->n)
			sel_chain_digest_add(&dg, &c->keys[i], used);
	}
	return memcmp(dg.b, hit->chain.b, SEL_DIGEST_BYTES) == 0;
}

static bool linked_in_memory(struct comp_store *cs, const struct dchain *c, uint32_t i)
{
	struct sel_memory_view pv;
	if (c->info[i].is_root)
		return true;
	return (i > 0 && sel_key_eq(&c->keys[i - 1], &c->info[i].parent)) ||
	       (sel_memory_store_view(cs->mem, &c->info[i].parent, &pv) == 0 && pv.ready);
}

/* Roles: a node read must link in memory.  Returns whether the chain is
 * eligible, with the warm slots its reads need and the slots of the
 * residents it pins. */
static bool assign_roles(struct comp_store *cs, const struct dchain *c, struct cfetch *f,
			 uint64_t *need, uint64_t *have_pinned)
{
	*need = *have_pinned = 0;
	for (uint32_t i = 0; i < c->n; i++) {
		const struct sel_disk_record_info *x = &c->info[i];
		struct sel_memory_view v;
		bool endpoint = i + 1 == c->n;
		if (sel_memory_store_view(cs->mem, &c->keys[i], &v) == 0) {
			if (!v.ready || (endpoint && !v.has_row) || cs_rm_pending(cs, &c->keys[i]))
				return false; /* a copy in another state: stream */
			f->role[i] = ROLE_RESIDENT;
			*have_pinned += v.n_page_slots + v.n_row_slots;
			continue;
		}
		if (!x->file || !linked_in_memory(cs, c, i))
			return false;
		f->role[i] = ROLE_READ;
		*need += sel_memory_store_record_slots(cs->mem, x->tail, endpoint,
						       x->flags & SEL_RECORD_PAGES_REPLICATED,
						       x->flags & SEL_RECORD_ROW_REPLICATED);
	}
	return true;
}

/* Pin the residents, reserve the rest (ancestors first): 0, or an error
 * with everything undone. */
static int reserve_chain(struct comp_store *cs, const struct dchain *c, struct cfetch *f)
{
	for (uint32_t i = 0; i < c->n; i++)
		if (f->role[i] == ROLE_RESIDENT)
			(void)sel_memory_store_pin(cs->mem, &c->keys[i]);
	for (uint32_t i = 0; i < c->n; i++) {
		if (f->role[i] != ROLE_READ)
			continue;
		const struct sel_disk_record_info *x = &c->info[i];
		bool endpoint = i + 1 == c->n;
		int r = sel_memory_store_reserve(
			cs->mem, &c->keys[i], x->is_root ? NULL : &x->parent, &x->bucket, x->tail,
			endpoint, x->flags & SEL_RECORD_PAGES_REPLICATED,
			endpoint && (x->flags & SEL_RECORD_ROW_REPLICATED));
		if (r != 0) {
			/* Undo: settle what was reserved, unpin residents. */
			for (uint32_t j = i; j < c->n; j++)
				if (f->role[j] == ROLE_READ)
					f->role[j] = 0;
			cfetch_release(cs, f, false);
			return r;
		}
	}
	return 0;
}

/* read_into node i of the chain into its reserved slots. */
static int read_node(struct comp_store *cs, const struct dchain *c, uint32_t i, struct cfetch *f)
{
	const struct sel_disk_record_info *x = &c->info[i];
	bool endpoint = i + 1 == c->n;
	struct sel_memory_view v;
	if (sel_memory_store_view(cs->mem, &c->keys[i], &v) != 0)
		return -ESTALE;
	uint32_t icap = cs->ranks * (v.n_row_slots + 1), n_iov = 0;
	void **pages = malloc(((size_t)x->tail + 1) * sizeof(void *));
	struct iovec *iov = malloc((size_t)icap * sizeof(*iov));
	int r = -ENOMEM;
	if (pages && iov)
		r = sel_store_pool_map(cs->sp, x->flags, v.slots, v.n_page_slots,
				       endpoint ? v.n_row_slots : 0, 0, x->tail, pages, iov, icap,
				       &n_iov);
	if (r == 0)
		r = sel_disk_store_read_into(cs->disk, &c->keys[i], endpoint, pages, iov, n_iov, f);
	free(pages);
	free(iov);
	return r;
}

/* Every node read (none resident): one fetch_into reads the chain into its
 * reserved slots window by window and uploads each window as soon as its
 * read is verified, so the upload overlaps the reads that follow.  0
 * started (the read hook ends f), else nothing started. */
static int read_overlapped(struct comp_store *cs, const struct dchain *c, struct cfetch *f,
			   const sel_hit *hit, const sel_inbound *in)
{
	for (uint32_t i = 0; i < c->n; i++)
		if (f->role[i] != ROLE_READ)
			return -ENOTSUP;
	struct sel_disk_into *into = calloc(c->n, sizeof(*into));
	if (!into)
		return -ENOMEM;
	int rc = 0;
	for (uint32_t i = 0; i < c->n && !rc; i++) {
		struct sel_memory_view v;
		if ((rc = sel_memory_store_view(cs->mem, &c->keys[i], &v)) == 0)
			into[i] = (struct sel_disk_into){.slots = v.slots,
							 .n_page_slots = v.n_page_slots,
							 .n_row_slots = v.n_row_slots};
	}
	if (rc == 0)
		rc = sel_disk_store_fetch_into(cs->disk, hit, in, into, c->n, f);
	free(into);
	return rc;
}

int cs_read_through(struct comp_store *cs, const sel_hit *hit, const sel_inbound *in)
{
	struct dchain c = {0};
	struct cfetch *f = NULL;
	int rc = dchain_collect(cs, hit, &c);
	if (rc == 0 && !dchain_verified(cs, hit, &c))
		rc = 1;
	if (rc)
		goto out;
	rc = -ENOMEM;
	f = calloc(1, sizeof(*f) + c.n * (sizeof(sel_key) + 1) +
			      (size_t)in->n_pages * sizeof(uint32_t));
	if (!f)
		goto out;
	f->keys = (sel_key *)(f + 1);
	f->dst = (uint32_t *)(f->keys + c.n);
	f->role = (uint8_t *)(f->dst + in->n_pages);
	f->n = c.n;
	memcpy(f->keys, c.keys, c.n * sizeof(sel_key));
	memcpy(f->dst, in->pages, (size_t)in->n_pages * sizeof(uint32_t));
	f->n_dst = in->n_pages;
	f->state_slot = in->state_slot;
	f->ticket = in->ticket;
	f->hit = *hit;
	f->submit_ns = eos_now_ns();

	rc = 1;
	uint64_t need, have_pinned, in_use, pinned, free_warm;
	if (!assign_roles(cs, &c, f, &need, &have_pinned))
		goto out;
	sel_memory_store_counts(cs->mem, &in_use, &pinned, &free_warm);
	uint64_t clean = in_use - pinned;
	clean = clean > have_pinned ? clean - have_pinned : 0;
	if (need > free_warm + clean || reserve_chain(cs, &c, f) != 0)
		goto out; /* would evict residents for an impossible admission */
	cfetches_push(&cs->fetches, f);
	f->pending = 1; /* held while submitting */
	if (read_overlapped(cs, &c, f, hit, in) == 0) {
		f->overlapped = true; /* pending: the stream, until its hook */
		cs->g.read_through++;
		cs->g.read_through_overlapped++;
		f = NULL;
		rc = 0;
		goto out;
	}
	for (uint32_t i = 0; i < c.n; i++) {
		if (f->role[i] != ROLE_READ || (i + 1 < c.n && c.info[i].tail == 0))
			continue; /* a node that owns no pages: the empty reserved copy stands in */
		f->pending++;
		int r = read_node(cs, &c, i, f);
		if (r != 0)
			read_done(cs, f, r);
	}
	read_done(cs, f, 0); /* the submission hold */
	f = NULL;
	rc = 0;
out:
	free(f);
	dchain_free(&c);
	return rc;
}
