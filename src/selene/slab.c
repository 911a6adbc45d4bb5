/*
 * slab.c - the host slot pool: equal page-record-sized slots in one
 * registered anonymous mapping, shared by warm retention and transfer
 * staging, plus the arithmetic that places records and rows in slots and
 * sizes the automatic intake (design 2.5, "Transfers, slabs, and record
 * files"; design 1 for the intake).
 *
 * DESIGN
 *
 * A slot is one page record of the record file: rank 0's share, then rank
 * 1's, ..., each share being that rank's page planes in geometry order with
 * every plane padded to 4 KiB.  So a slot moves to or from disk as one
 * aligned direct I/O and its bytes are exactly the file's bytes.  A row is
 * cut into pieces of share[r] bytes; piece i of rank r lives in rank r's
 * share of the row's i-th slot.  The slots of a row need not be adjacent.
 *
 * The pool is a single mapping, registered once with the device (the reg
 * hook), so transfers never register memory on the fast path.  Free slots
 * sit on an array stack, so alloc and free are O(1) per slot and recently
 * freed (cache-warm, already faulted) slots are reused first.  Beside the
 * stack, where[s] gives a free slot's position in the stack, or SLOT_USED.
 * The two arrays mirror each other, which makes every free O(1)-checkable
 * (a double free finds where[s] != SLOT_USED) and lets sel_slab_check()
 * prove the stack holds no duplicates without allocating.
 *
 * A CUDA split pool (design 2.5, memory-only TP>1) brings its own reserved
 * range instead (sel_slab_create_over): the pool then only keeps the free
 * list, its slot addresses are identities inside that range, and it
 * neither maps, populates nor registers anything.
 *
 * Two classes share the free stack.  Warm (retention) allocations leave at
 * least intake slots free, so staging for a transfer window always finds
 * room once warm records have been evicted down to the reserve; intake
 * allocations may take every free slot.  Nothing here blocks or evicts:
 * callers see -ENOSPC and decide.
 *
 * A bad free (slot out of range, already free, or twice in one call) is a
 * caller bug that would otherwise hand one slot to two users.  The whole call
 * is refused, the slots it named stay allocated (a leak, never a reuse under
 * an outstanding copy, as design 2.5 prefers at close), and the pool
 * remembers it so sel_slab_check() fails from then on.  With SEL_DEBUG_CHECKS
 * every mutation runs the checker and aborts on failure.
 *
 * The pool is used from one thread (the model worker); transfer threads only
 * receive addresses.  No locks.
 *
 * INVARIANTS
 *
 *   1. 0 <= nfree <= total <= UINT32_MAX; in use = total - nfree.
 *   2. For i < nfree: stack[i] < total and where[stack[i]] == i.  Hence the
 *      free stack holds distinct slots.
 *   3. For every slot s: where[s] == SLOT_USED, or where[s] < nfree and
 *      stack[where[s]] == s.  Exactly total - nfree slots are SLOT_USED.
 *   4. base is 4 KiB aligned and slot_bytes is a positive multiple of 4 KiB,
 *      so every slot address is 4 KiB aligned; total * slot_bytes fits in
 *      the address space.
 *   5. An owned mapping is registered (reg hook) exactly once, from create
 *      until destroy, and unregistered only if reg succeeded.  A borrowed
 *      range (owns == false) is never mapped, registered or unmapped here.
 *   6. refused == 0 (no bad free was ever attempted).
 *   7. Layout: share[r] = sum of round_up(plane unit, 4 KiB) > 0,
 *      share_off[r] = sum of share[0..r), slot_bytes = sum of share,
 *      row_slots = max over r of ceil(row_bytes[r] / share[r]), at least 1.
 */
#include "slab.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "eos.h"

#define SLOT_USED UINT32_MAX

struct sel_slab_pool {
	uint8_t *base;
	uint64_t map_bytes;
	uint64_t slot_bytes;
	uint32_t total;
	uint32_t intake;
	uint32_t nfree;
	uint32_t *stack; /* [total] free slot ids; stack[0..nfree) valid */
	uint32_t *where; /* [total] index in stack, or SLOT_USED */
	struct sel_slab_hooks hooks;
	bool owns; /* base is our mapping (false: the caller's range) */
	bool registered;
	uint64_t refused;      /* bad frees attempted (invariant 6) */
	uint32_t refused_slot; /* the first offending slot id */
	const char *refused_why;
};

#ifdef SEL_DEBUG_CHECKS
static void debug_check(const sel_slab_pool *p)
{
	if (sel_slab_check(p) != 0) {
		fprintf(stderr, "sel_slab_check: %s\n", eos_errmsg());
		abort();
	}
}
#else
static inline void debug_check(const sel_slab_pool *p) { (void)p; }
#endif

/* ---- Layout ------------------------------------------------------------- */

int sel_slot_layout_init(sel_slot_layout *l, const sel_geometry *g)
{
	int rc = 0;
	memset(l, 0, sizeof(*l));
	if (!g || g->ranks == 0 || !g->rank)
		return eos_fail(SEL_EGEOMETRY, "slot layout: geometry has no ranks");

	uint32_t ranks = g->ranks;
	l->ranks = ranks;
	l->share = calloc(ranks, sizeof(*l->share));
	l->share_off = calloc(ranks, sizeof(*l->share_off));
	l->row_bytes = calloc(ranks, sizeof(*l->row_bytes));
	l->plane_off = calloc(ranks, sizeof(*l->plane_off));
	if (!l->share || !l->share_off || !l->row_bytes || !l->plane_off) {
		rc = eos_fail(-ENOMEM, "slot layout: out of memory for %" PRIu32 " ranks", ranks);
		goto fail;
	}

	uint64_t slot = 0, row_slots = 1;
	for (uint32_t r = 0; r < ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		if (rg->n_planes == 0 || !rg->pages) {
			rc = eos_fail(SEL_EGEOMETRY,
				      "slot layout: rank %" PRIu32 " has no page planes", r);
			goto fail;
		}
		if (rg->row.unit_bytes == 0) {
			rc = eos_fail(SEL_EGEOMETRY,
				      "slot layout: rank %" PRIu32
				      " row plane '%s' has unit size 0",
				      r, rg->row.name ? rg->row.name : "?");
			goto fail;
		}
		l->plane_off[r] = calloc(rg->n_planes, sizeof(**l->plane_off));
		if (!l->plane_off[r]) {
			rc = eos_fail(-ENOMEM,
				      "slot layout: out of memory for rank %" PRIu32 " planes", r);
			goto fail;
		}
		uint64_t share = 0;
		for (uint32_t i = 0; i < rg->n_planes; i++) {
			const sel_plane *pl = &rg->pages[i];
			const char *name = pl->name ? pl->name : "?";
			if (pl->unit_bytes == 0) {
				rc = eos_fail(SEL_EGEOMETRY,
					      "slot layout: rank %" PRIu32
					      " page plane '%s' has unit size 0",
					      r, name);
				goto fail;
			}
			if (pl->unit_bytes > UINT64_MAX - (EOS_ALIGN - 1)) {
				rc = eos_fail(-EOVERFLOW,
					      "slot layout: rank %" PRIu32
					      " page plane '%s' unit size %" PRIu64
					      " cannot be padded to 4 KiB",
					      r, name, pl->unit_bytes);
				goto fail;
			}
			uint64_t padded = eos_round_up(pl->unit_bytes, EOS_ALIGN);
			l->plane_off[r][i] = share;
			if (__builtin_add_overflow(share, padded, &share)) {
				rc = eos_fail(-EOVERFLOW,
					      "slot layout: rank %" PRIu32
					      " share exceeds 64 bits at plane '%s'",
					      r, name);
				goto fail;
			}
		}
		l->share[r] = share;
		l->share_off[r] = slot;
		if (__builtin_add_overflow(slot, share, &slot)) {
			rc = eos_fail(-EOVERFLOW,
				      "slot layout: slot size exceeds 64 bits at rank %" PRIu32, r);
			goto fail;
		}
		l->row_bytes[r] = rg->row.unit_bytes;
		uint64_t need = rg->row.unit_bytes / share + (rg->row.unit_bytes % share != 0);
		if (need > row_slots)
			row_slots = need;
	}
	if (row_slots > UINT32_MAX) {
		rc = eos_fail(-EOVERFLOW,
			      "slot layout: a row needs %" PRIu64 " slots (at most %" PRIu32 ")",
			      row_slots, UINT32_MAX);
		goto fail;
	}
	l->slot_bytes = slot;
	l->row_slots = (uint32_t)row_slots;
	return 0;
fail:
	sel_slot_layout_free(l);
	return rc;
}

void sel_slot_layout_free(sel_slot_layout *l)
{
	if (!l)
		return;
	if (l->plane_off)
		for (uint32_t r = 0; r < l->ranks; r++)
			free(l->plane_off[r]);
	free(l->plane_off);
	free(l->share);
	free(l->share_off);
	free(l->row_bytes);
	memset(l, 0, sizeof(*l));
}

void sel_slot_layout_row_piece(const sel_slot_layout *l, uint32_t rank, uint32_t i,
			       uint64_t *off_in_slot, uint64_t *len)
{
	assert(rank < l->ranks);
	assert(i < l->row_slots);
	uint64_t share = l->share[rank], row = l->row_bytes[rank];
	*off_in_slot = l->share_off[rank];
	/* Compare by division: i * share may exceed 64 bits for a rank whose
	 * row ends long before row_slots. */
	if (i >= row / share + (row % share != 0)) {
		*len = 0;
		return;
	}
	uint64_t left = row - (uint64_t)i * share;
	*len = left < share ? left : share;
}

/* ---- Pool --------------------------------------------------------------- */

/* The free list and counts of a pool of warm + intake slots (no memory
 * yet: base stays MAP_FAILED).  0 or an error with a message. */
static int pool_new(uint64_t slot_bytes, uint64_t warm_slots, uint64_t intake_slots,
		    uint64_t *bytes, sel_slab_pool **out)
{
	sel_slab_pool *p;
	uint64_t total;
	*out = NULL;

	if (slot_bytes == 0 || slot_bytes % EOS_ALIGN != 0)
		return eos_fail(-EINVAL,
				"slab: slot size %" PRIu64 " is not a positive multiple of %u",
				slot_bytes, EOS_ALIGN);
	if (__builtin_add_overflow(warm_slots, intake_slots, &total) || total > UINT32_MAX)
		return eos_fail(-EOVERFLOW,
				"slab: %" PRIu64 " warm + %" PRIu64 " intake slots exceed %" PRIu32
				" slots",
				warm_slots, intake_slots, UINT32_MAX);
	if (total == 0)
		return eos_fail(-EINVAL, "slab: pool of 0 slots");
	if (__builtin_mul_overflow(total, slot_bytes, bytes) || *bytes > (uint64_t)PTRDIFF_MAX ||
	    *bytes > SIZE_MAX)
		return eos_fail(-EOVERFLOW,
				"slab: %" PRIu64 " slots of %" PRIu64
				" bytes exceed the address space",
				total, slot_bytes);

	p = calloc(1, sizeof(*p));
	if (!p)
		return eos_fail(-ENOMEM, "slab: out of memory");
	p->base = MAP_FAILED;
	p->slot_bytes = slot_bytes;
	p->total = (uint32_t)total;
	p->intake = (uint32_t)intake_slots;
	p->stack = malloc(total * sizeof(*p->stack));
	p->where = malloc(total * sizeof(*p->where));
	if (!p->stack || !p->where) {
		sel_slab_destroy(p);
		return eos_fail(-ENOMEM,
				"slab: out of memory for the free list of %" PRIu64 " slots",
				total);
	}
	/* Slot 0 on top, so a fresh pool hands out ascending ids. */
	for (uint32_t i = 0; i < p->total; i++) {
		uint32_t s = p->total - 1 - i;
		p->stack[i] = s;
		p->where[s] = i;
	}
	p->nfree = p->total;
	*out = p;
	return 0;
}

int sel_slab_create(uint64_t slot_bytes, uint64_t warm_slots, uint64_t intake_slots, bool populate,
		    const struct sel_slab_hooks *hooks, sel_slab_pool **out)
{
	sel_slab_pool *p = NULL;
	uint64_t bytes = 0;
	int rc;

	*out = NULL;
	if ((rc = pool_new(slot_bytes, warm_slots, intake_slots, &bytes, &p)))
		return rc;
	if (hooks)
		p->hooks = *hooks;
	p->owns = true;

	int flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0);
	void *m = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (m == MAP_FAILED) {
		char buf[32];
		rc = -errno;
		eos_fail(rc, "slab: cannot map %s (%" PRIu32 " slots of %" PRIu64 " bytes): %s",
			 eos_format_size(bytes, buf, sizeof(buf)), p->total, slot_bytes,
			 strerror(-rc));
		goto fail;
	}
	p->base = m;
	p->map_bytes = bytes;
	if (madvise(m, (size_t)bytes, MADV_HUGEPAGE) != 0 && errno != EINVAL) {
		rc = -errno;
		eos_fail(rc, "slab: madvise(MADV_HUGEPAGE) failed: %s", strerror(-rc));
		goto fail;
	}
	if (p->hooks.reg) {
		eos_errclear();
		rc = p->hooks.reg(p->hooks.ctx, m, bytes);
		if (rc != 0) {
			char buf[32], why[256];
			if (rc > 0)
				rc = -EIO;
			/* Keep the hook's own message when it left one. */
			snprintf(why, sizeof(why), "%s", eos_errmsg());
			eos_fail(rc, "slab: registering %s failed: %s",
				 eos_format_size(bytes, buf, sizeof(buf)),
				 *why ? why : strerror(-rc));
			goto fail;
		}
		p->registered = true;
	}
	debug_check(p);
	*out = p;
	return 0;
fail:
	sel_slab_destroy(p);
	return rc;
}

int sel_slab_create_over(void *base, uint64_t slot_bytes, uint64_t warm_slots,
			 uint64_t intake_slots, sel_slab_pool **out)
{
	sel_slab_pool *p = NULL;
	uint64_t bytes = 0;
	int rc;

	*out = NULL;
	if (!base || (uintptr_t)base % EOS_ALIGN != 0)
		return eos_fail(-EINVAL, "slab: range %p is not 4 KiB aligned", base);
	if ((rc = pool_new(slot_bytes, warm_slots, intake_slots, &bytes, &p)))
		return rc;
	if ((uintptr_t)base > UINTPTR_MAX - bytes) {
		sel_slab_destroy(p);
		return eos_fail(-EOVERFLOW,
				"slab: %" PRIu64 " bytes from %p exceed the address space", bytes,
				base);
	}
	p->base = base;
	p->map_bytes = bytes;
	debug_check(p);
	*out = p;
	return 0;
}

void sel_slab_destroy(sel_slab_pool *p)
{
	if (!p)
		return;
	if (p->registered && p->hooks.unreg)
		p->hooks.unreg(p->hooks.ctx, p->base, p->map_bytes);
	if (p->owns && p->base != MAP_FAILED && p->base)
		munmap(p->base, (size_t)p->map_bytes);
	free(p->stack);
	free(p->where);
	free(p);
}

/* Slots an allocation of class cls may take now. */
static uint32_t avail(const sel_slab_pool *p, enum sel_slab_class cls)
{
	if (cls == SEL_SLAB_INTAKE)
		return p->nfree;
	return p->nfree > p->intake ? p->nfree - p->intake : 0;
}

bool sel_slab_can_alloc(const sel_slab_pool *p, uint32_t n, enum sel_slab_class cls)
{
	return n <= avail(p, cls);
}

uint32_t sel_slab_warm(const sel_slab_pool *p, uint32_t n)
{
	uint32_t acc = 0;
	if (n > p->nfree)
		n = p->nfree;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = p->stack[p->nfree - 1 - i];
		acc += s + p->where[s];
	}
	return acc;
}

int sel_slab_alloc(sel_slab_pool *p, uint32_t n, enum sel_slab_class cls, uint32_t *out)
{
	assert(cls == SEL_SLAB_WARM || cls == SEL_SLAB_INTAKE);
	if (n > avail(p, cls)) {
		if (cls == SEL_SLAB_WARM)
			return eos_fail(-ENOSPC,
					"slab: %" PRIu32 " warm slots wanted, %" PRIu32
					" free of which %" PRIu32 " are the intake reserve",
					n, p->nfree, p->intake);
		return eos_fail(-ENOSPC, "slab: %" PRIu32 " intake slots wanted, %" PRIu32 " free",
				n, p->nfree);
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t s = p->stack[--p->nfree];
		p->where[s] = SLOT_USED;
		out[i] = s;
	}
	debug_check(p);
	return 0;
}

/* Record a refused free for sel_slab_check() and fail the call. */
static int refuse(sel_slab_pool *p, uint32_t slot, const char *why)
{
	if (p->refused++ == 0) {
		p->refused_slot = slot;
		p->refused_why = why;
	}
	int rc = eos_fail(-EINVAL, "slab: refused to free slot %" PRIu32 ": %s", slot, why);
	debug_check(p); /* aborts under SEL_DEBUG_CHECKS: invariant 6 */
	return rc;
}

int sel_slab_free(sel_slab_pool *p, const uint32_t *slots, uint32_t n)
{
	/* Pass 1: validate, marking each slot so a second mention in this same
	 * call is caught.  where[s] = nfree + j (beyond the stack top) marks
	 * slot s as the j-th pending free; nothing is pushed until all pass. */
	for (uint32_t j = 0; j < n; j++) {
		uint32_t s = slots[j];
		const char *why = NULL;
		if (s >= p->total)
			why = "out of range";
		else if (p->where[s] != SLOT_USED)
			why = p->where[s] >= p->nfree ? "named twice in one call" : "already free";
		if (why) {
			for (uint32_t k = 0; k < j; k++)
				p->where[slots[k]] = SLOT_USED;
			return refuse(p, s, why);
		}
		p->where[s] = p->nfree + j;
	}
	/* Pass 2: push in order; slot slots[j] lands exactly at index nfree + j,
	 * where pass 1 already pointed it. */
	for (uint32_t j = 0; j < n; j++)
		p->stack[p->nfree + j] = slots[j];
	p->nfree += n;
	debug_check(p);
	return 0;
}

void *sel_slab_addr(const sel_slab_pool *p, uint32_t slot)
{
	assert(slot < p->total);
	return p->base + (uint64_t)slot * p->slot_bytes;
}

void *sel_slab_base(const sel_slab_pool *p) { return p->base; }
uint64_t sel_slab_slot_bytes(const sel_slab_pool *p) { return p->slot_bytes; }
uint64_t sel_slab_total(const sel_slab_pool *p) { return p->total; }
uint64_t sel_slab_intake(const sel_slab_pool *p) { return p->intake; }
uint64_t sel_slab_free_count(const sel_slab_pool *p) { return p->nfree; }
uint64_t sel_slab_in_use(const sel_slab_pool *p) { return p->total - p->nfree; }
bool sel_slab_owns_memory(const sel_slab_pool *p) { return p->owns; }

int sel_slab_check(const sel_slab_pool *p)
{
	if (p->refused)
		return eos_fail(SEL_ECORRUPT,
				"slab: %" PRIu64 " free(s) refused, first slot %" PRIu32 " (%s)",
				p->refused, p->refused_slot, p->refused_why);
	if (p->nfree > p->total)
		return eos_fail(SEL_ECORRUPT, "slab: %" PRIu32 " free of %" PRIu32 " slots",
				p->nfree, p->total);
	if (!p->owns && p->registered)
		return eos_fail(SEL_ECORRUPT, "slab: a borrowed range is registered");
	if (((uintptr_t)p->base | p->slot_bytes) % EOS_ALIGN != 0 || p->slot_bytes == 0)
		return eos_fail(SEL_ECORRUPT,
				"slab: base %p or slot size %" PRIu64 " not 4 KiB aligned",
				(void *)p->base, p->slot_bytes);
	for (uint32_t i = 0; i < p->nfree; i++) {
		uint32_t s = p->stack[i];
		if (s >= p->total)
			return eos_fail(SEL_ECORRUPT,
					"slab: free list entry %" PRIu32 " is slot %" PRIu32
					", beyond %" PRIu32,
					i, s, p->total);
		if (p->where[s] != i)
			return eos_fail(
				SEL_ECORRUPT,
				"slab: free list entry %" PRIu32 " (slot %" PRIu32 ") is %s", i, s,
				p->where[s] == SLOT_USED ? "marked in use" : "a duplicate");
	}
	uint64_t used = 0;
	for (uint32_t s = 0; s < p->total; s++) {
		uint32_t w = p->where[s];
		if (w == SLOT_USED)
			used++;
		else if (w >= p->nfree || p->stack[w] != s)
			return eos_fail(SEL_ECORRUPT,
					"slab: slot %" PRIu32 " marked free at %" PRIu32
					" but the free list disagrees",
					s, w);
	}
	if (used + p->nfree != p->total)
		return eos_fail(SEL_ECORRUPT,
				"slab: %" PRIu64 " in use + %" PRIu32 " free != %" PRIu32 " slots",
				used, p->nfree, p->total);
	return 0;
}

/* ---- Automatic intake (design 1) ---------------------------------------- */

int sel_intake_slots(uint32_t max_active, uint32_t row_slots, uint64_t slot_bytes,
		     uint64_t headroom_bytes, uint64_t *slots, char *warn, size_t warn_len)
{
	char a[32], b[32], c[32];
	uint64_t full, full_bytes, floor_slots, use;

	if (warn && warn_len)
		warn[0] = '\0';
	if (max_active == 0)
		return eos_fail(-EINVAL, "intake: max_active %" PRIu32 " (must be at least 1)",
				max_active);
	if (row_slots == 0)
		return eos_fail(-EINVAL, "intake: row_slots %" PRIu32 " (must be at least 1)",
				row_slots);
	if (slot_bytes == 0 || slot_bytes % EOS_ALIGN != 0)
		return eos_fail(-EINVAL,
				"intake: slot size %" PRIu64 " is not a positive multiple of %u",
				slot_bytes, EOS_ALIGN);

	/* 2 * (2^32-1)^2 exceeds 64 bits; the floor cannot. */
	floor_slots = 2 * ((uint64_t)SEL_WINDOW_PAGES + row_slots);
	bool full_ok = !__builtin_mul_overflow((uint64_t)max_active, (uint64_t)row_slots, &full) &&
		       !__builtin_mul_overflow(full, 2, &full) &&
		       !__builtin_add_overflow(full, 2 * (uint64_t)SEL_WINDOW_PAGES, &full);
	bool bytes_ok = full_ok && !__builtin_mul_overflow(full, slot_bytes, &full_bytes);

	if (bytes_ok && full_bytes <= headroom_bytes) {
		*slots = full;
		return 0;
	}
	if (headroom_bytes == UINT64_MAX)
		return eos_fail(-EOVERFLOW,
				"intake: 2 x %" PRIu32 " active x %" PRIu32 " row slots + 2 x %u"
				" slots of %" PRIu64 " bytes exceed 64 bits",
				max_active, row_slots, SEL_WINDOW_PAGES, slot_bytes);

	use = headroom_bytes / slot_bytes;
	if (use < floor_slots) {
		uint64_t floor_bytes;
		if (__builtin_mul_overflow(floor_slots, slot_bytes, &floor_bytes))
			snprintf(c, sizeof(c), "over 16 EiB");
		else
			eos_format_size(floor_bytes, c, sizeof(c));
		return eos_fail(-ENOMEM,
				"intake: host headroom %s holds %" PRIu64 " slots of %s, below the"
				" minimum of 2 x (%u + %" PRIu32 ") = %" PRIu64 " slots (%s)",
				eos_format_size(headroom_bytes, a, sizeof(a)), use,
				eos_format_size(slot_bytes, b, sizeof(b)), SEL_WINDOW_PAGES,
				row_slots, floor_slots, c);
	}
	if (warn && warn_len) {
		char need[96];
		if (bytes_ok)
			snprintf(need, sizeof(need), "%s (%" PRIu64 " slots of %s)",
				 eos_format_size(full_bytes, a, sizeof(a)), full,
				 eos_format_size(slot_bytes, b, sizeof(b)));
		else
			snprintf(need, sizeof(need), "over 16 EiB");
		snprintf(warn, warn_len,
			 "intake: full intake for %" PRIu32 " active requests needs %s but"
			 " host headroom is %s; using %" PRIu64 " slots (%s)",
			 max_active, need, eos_format_size(headroom_bytes, c, sizeof(c)), use,
			 eos_format_size(use * slot_bytes, a, sizeof(a)));
	}
	*slots = use;
	return 0;
}
