/*
 * store_pooled_cascade.c - the pool as the next level of the local chain
 * (design 2.15 "Eviction below the instance"): records the last local
 * tier would evict go to the arena first, and leave the local tier only
 * once the manager accepted them.
 *
 * DESIGN
 *
 *   The pooled store hands the last local tier (a memory store: the core of
 *   sel_store_core with tier memory) a struct sel_cascade.  The store's own
 *   maintenance (sel_core_cascade_run, each poll) offers its least recently
 *   used evictable leaves while its free capacity is under its floor (design
 *   2.5 and 2.15: memory's free slots plus the held ones under 2 x intake;
 *   disk's free bytes, unlinks in flight included and a composite's parked
 *   demand excluded, under 2 x intake slots' bytes; each capped at a
 *   quarter of a small tier: ms_cascade_low, ds_cascade_low); the
 *   offer here snapshots the record's chain -- the source address of every
 *   rank's share of every chain page, the leaf's row -- and starts a put
 *   (sp_put with cascade set).  The core holds the record with a store pin
 *   from then on: lookups still find it locally, eviction cannot take it,
 *   its slots do not change.  On the grant, the helper thread copies the
 *   shares into the lease's windows and checksums them in one job, and the
 *   put commits.  PUT_RESULT OK (or PRESENT: the pool has it already) ends
 *   the hold as accepted and the record leaves the local tier; a refusal, a
 *   failed lease, a lost session or close ends it as kept: the record stays
 *   local, and the store's offers pause for a backoff.
 *
 *   Packed records (TP > 1, identical ranks' shares stored once) are copied
 *   out to every rank's share: share j of a packed page or row slot lives
 *   in slot j / ranks at rank (j % ranks)'s offset (store_memory.c).
 *
 *   From a disk tier (a disk store alone or in a composite) the offer
 *   snapshots the chain's record files instead (sel_disk_store_file:
 *   description, span, file id), and the helper reads them into the
 *   windows with pread: each file opened as the indexed one
 *   (sel_record_open), its header decoded and matched against the index,
 *   every page record checked against the file's checksum segment and the
 *   row against the header's checksum before the pool's own checksums are
 *   computed, so a damaged file never enters the arena (the put fails and
 *   the record stays local, where the disk store's own reads find the
 *   damage).  Records with replicated shares (TP > 1, SEL_RECORD_*_
 *   REPLICATED: identical ranks' pages or row stored once) are read and
 *   checked as stored -- a page record of one share, one row -- and then
 *   copied out to every rank's share of the window slot (page_spread,
 *   read_row_replicated), so the arena holds the same per-rank record as
 *   from a memory tier.
 *
 *   A composite's parked records (complete in DRAM, no file yet: not
 *   evictable) are offered too, in their place in the disk tier's least
 *   recently used order, straight from DRAM (design 2.15's order DRAM,
 *   NVMe, manager): the core asks sp_cascade_parked, which takes a parked
 *   record with no write in flight whose whole chain the composite's
 *   memory store holds, and the offer copies it from the memory slots as
 *   from a memory tier.  While held, the composite does not start its
 *   write (store_composite.c held_below), so it is offered once, from
 *   DRAM, and not again through a disk write; accepted, it leaves both
 *   tiers without ever being written; kept, it stays parked and is written
 *   as before.  Its memory copy keeps the composite's dirty pin while the
 *   disk node is held (a held node is neither removed nor written, so the
 *   pin is not dropped), which keeps its memory chain in place.
 *
 * INVARIANTS
 *   1. Every held record ends exactly once (sel_core_cascade_end), after
 *      the helper stopped reading its slots.
 *   2. The source addresses are read only while the record is held: its
 *      chain cannot be evicted (a pinned leaf keeps its ancestors).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eos.h"
#include "internal.h"
#include "slab.h"
#include "store_common.h"
#include "store_composite.h"
#include "store_memory.h"
#include "store_pool.h"
#include "store_pooled.h"

/* Fill src for the tail pages of one chain node starting at chain page
 * pos (and, with row, the row slots after the chain's n pages). */
static void node_sources(const struct sel_pooled *p, const sel_slab_pool *pool,
			 const struct sel_memory_view *v, uint32_t pos, uint32_t n, bool row,
			 const uint8_t **src)
{
	uint32_t R = p->lay.ranks;
	for (uint32_t j = 0; j < v->tail_pages; j++)
		for (uint32_t r = 0; r < R; r++) {
			uint32_t s = v->pages_packed ? v->slots[j / R] : v->slots[j];
			uint32_t rr = v->pages_packed ? j % R : r;
			src[(size_t)(pos + j) * R + r] =
				(const uint8_t *)sel_slab_addr(pool, s) + p->lay.share_off[rr];
		}
	if (!row)
		return;
	const uint32_t *rs = v->slots + v->n_page_slots;
	for (uint32_t i = 0; i < p->lay.row_slots; i++)
		for (uint32_t r = 0; r < R; r++) {
			uint32_t s = v->row_packed ? rs[i / R] : rs[i];
			uint32_t rr = v->row_packed ? i % R : r;
			src[(size_t)(n + i) * R + r] =
				(const uint8_t *)sel_slab_addr(pool, s) + p->lay.share_off[rr];
		}
}

/* The source of every share of key's whole chain and its row, or NULL
 * when the memory store's record is not a complete chain. */
static const uint8_t **chain_sources(struct sel_pooled *p, sel_store *s, const sel_key *key,
				     uint32_t n, sel_key *parent, uint32_t *tail)
{
	const sel_slab_pool *pool = sel_memory_store_pool(s)->pool;
	uint32_t R = p->lay.ranks;
	const uint8_t **src = calloc(((size_t)n + p->lay.row_slots) * R, sizeof *src);
	struct sel_memory_view v;
	if (!src || sel_memory_store_view(s, key, &v) || !v.ready || !v.has_row)
		goto fail;
	*tail = v.tail_pages;
	*parent = v.is_root ? (sel_key){0} : v.parent;
	uint32_t pos = n;
	for (bool leaf = true;; leaf = false) {
		if (v.tail_pages > pos || !v.ready)
			goto fail;
		pos -= v.tail_pages;
		node_sources(p, pool, &v, pos, n, leaf, src);
		if (v.is_root)
			break;
		sel_key up = v.parent;
		if (sel_memory_store_view(s, &up, &v))
			goto fail;
	}
	if (pos == 0)
		return src;
fail:
	free(src);
	return NULL;
}

/* The committed files of key's whole chain, ancestor first, or NULL. */
static struct sel_disk_file *chain_files(sel_store *s, const sel_key *key, uint32_t n,
					 uint32_t *n_files, sel_key *parent, uint32_t *tail)
{
	struct sel_core *c = sel_store_core(s);
	uint32_t k = 0;
	for (sel_node_id id = sel_index_find(c->ix, key); id != SEL_NODE_NONE;
	     id = sel_core_node(c, id)->parent)
		k++;
	struct sel_disk_file *f = k ? calloc(k, sizeof *f) : NULL;
	if (!f)
		return NULL;
	uint32_t pages = 0;
	sel_key at = *key;
	for (uint32_t i = k; i-- > 0;) {
		if (sel_disk_store_file(s, &at, &f[i]) || (i == k - 1 && !f[i].has_row) ||
		    f[i].is_root != (i == 0))
			goto fail;
		pages += f[i].d.tail;
		at = f[i].parent;
	}
	if (pages != n)
		goto fail;
	*n_files = k;
	*tail = f[k - 1].d.tail;
	*parent = f[k - 1].is_root ? (sel_key){0} : f[k - 1].parent;
	return f;
fail:
	free(f);
	return NULL;
}

/* Whether key's memory chain in a composite's memory store is whole:
 * every node READY, down to a root, its pages the whole chain, the leaf
 * with its row. */
static bool mem_chain_whole(sel_store *mem, const sel_key *key, uint32_t n)
{
	struct sel_memory_view v;
	uint32_t pages = 0;
	sel_key at = *key;
	for (bool leaf = true;; leaf = false) {
		if (sel_memory_store_view(mem, &at, &v) || !v.ready || (leaf && !v.has_row))
			return false;
		pages += v.tail_pages;
		if (v.is_root)
			return pages == n;
		at = v.parent;
	}
}

/* The core's parked(): a composite's parked record (complete in DRAM, no
 * file yet, no write in flight) whose whole chain is in DRAM is offered
 * from there, straight from the memory slots. */
static bool sp_cascade_parked(void *ctx, sel_store *s, const sel_key *key)
{
	struct sel_pooled *p = ctx;
	struct sel_disk_record_info di;
	if (!p->casc_mem || sel_disk_store_record(s, key, &di) || !di.parked || di.writing ||
	    di.doomed || !di.ready || !di.has_row)
		return false;
	return mem_chain_whole(p->casc_mem, key, (uint32_t)(key->consumed / sel_store_core(s)->pt));
}

static bool sp_cascade_offer(void *ctx, sel_store *s, const sel_key *key)
{
	struct sel_pooled *p = ctx;
	if (!p->pc || p->closed || sel_pool_state(p->pc) != SEL_POOL_ATTACHED)
		return false;
	struct sel_core *c = sel_store_core(s);
	sel_node_id id = sel_index_find(c->ix, key);
	if (id == SEL_NODE_NONE)
		return false;
	uint32_t n = (uint32_t)(key->consumed / c->pt), tail = 0, n_files = 0;
	sel_key parent;
	const uint8_t **src = NULL;
	struct sel_disk_file *files = NULL;
	if (c->tier == SEL_TIER_DISK && !sp_cascade_parked(p, s, key))
		files = chain_files(s, key, n, &n_files, &parent, &tail);
	else /* a memory tier, or a parked record: from DRAM */
		src = chain_sources(p, c->tier == SEL_TIER_DISK ? p->casc_mem : s, key, n, &parent,
				    &tail);
	if (!src && !files)
		return false;
	sel_published cp = {.key = *key,
			    .parent = parent,
			    .bucket = sel_core_node(c, id)->bucket,
			    .n_pages = n,
			    .tail = tail};
	if (sp_put_cascade(p, &cp, src, files, n_files)) {
		free(src);
		free(files);
		return false;
	}
	return true;
}

void sp_cascade_attach(struct sel_pooled *p)
{
	sel_store *last = p->w.inner; /* the end of the local chain */
	if (last && !strcmp(last->ops->name, "composite"))
		last = sel_composite_store_disk(last);
	struct sel_core *c = sel_store_core(last);
	if (!p->pc || !c || (c->tier != SEL_TIER_MEMORY && c->tier != SEL_TIER_DISK) ||
	    c->sp->split)
		return;
	if (c->tier == SEL_TIER_DISK) {
		p->casc_dirfd = sel_disk_store_dirfd(last);
		p->casc_ns = sel_disk_store_ns(last);
	}
	if (last != p->w.inner) /* a composite's: its DRAM holds the parked records */
		p->casc_mem = sel_composite_store_memory(p->w.inner);
	struct sel_cascade k = {.offer = sp_cascade_offer, .parked = sp_cascade_parked, .ctx = p};
	sel_core_cascade_set(c, &k);
	p->casc = c;
}

void sp_cascade_detach(struct sel_pooled *p)
{
	if (p->casc)
		sel_core_cascade_set(p->casc, NULL); /* whatever is held stays local */
	p->casc = NULL;
	p->casc_mem = NULL;
}

void sp_cascade_end(struct sel_pooled *p, const sel_key *key, bool accepted)
{
	if (!p->casc)
		return;
	if (accepted)
		p->pc_st.cascaded++;
	else
		p->pc_st.cascade_kept++;
	sel_core_cascade_end(p->casc, key, accepted);
}

/* pread exactly len bytes at off: 0 or a negative errno (a short file:
 * SEL_ECORRUPT). */
static int read_at(int fd, void *buf, uint64_t len, uint64_t off)
{
	uint8_t *b = buf;
	while (len) {
		ssize_t k = pread(fd, b, len, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return eos_fail(-errno, "cascade read: %s", strerror(errno));
		if (k == 0)
			return eos_fail(SEL_ECORRUPT, "cascade read: the file ends early");
		b += k;
		off += (uint64_t)k;
		len -= (uint64_t)k;
	}
	return 0;
}

/* The endpoint's row from fd into the lease's row slots, checked. */
static int read_row(const struct sel_pooled *p, const struct sel_pool_lease *l, int fd,
		    const sel_record_span *sp, uint64_t row_checksum)
{
	const sel_record_layout *rl = &p->casc_ns->layout;
	uint32_t cap = l->n_row_slots * rl->ranks;
	void **slots = calloc(l->n_row_slots, sizeof *slots);
	struct iovec *iov = calloc(cap, sizeof *iov);
	struct sel_record_piece *plan = calloc(cap, sizeof *plan);
	int rc = slots && iov && plan ? 0 : -ENOMEM, n = 0;
	for (uint32_t k = 0; rc == 0 && k < l->n_row_slots; k++)
		slots[k] = sel_pool_slot_addr(p->pc, l->row_slots[k]);
	if (rc == 0 && (n = sel_record_row_iov(rl, 0, slots, l->n_row_slots, iov, cap)) < 0)
		rc = n;
	if (rc == 0)
		rc = sel_record_row_plan(rl, 0, iov, (uint32_t)n, plan);
	for (int i = 0; rc == 0 && i < n; i++)
		rc = read_at(fd, plan[i].addr, plan[i].len, sp->row_off + plan[i].off);
	if (rc == 0)
		rc = sel_record_check_row(iov, (uint32_t)n, row_checksum);
	free(slots);
	free(iov);
	free(plan);
	return rc;
}

/* A replicated row (one row for every rank, SEL_RECORD_ROW_REPLICATED):
 * read whole, checked against the header's checksum, then copied into
 * every rank's pieces of the lease's row slots, as a per-rank row. */
static int read_row_replicated(const struct sel_pooled *p, const struct sel_pool_lease *l, int fd,
			       const sel_record_span *sp, uint64_t row_checksum)
{
	const sel_record_layout *rl = &p->casc_ns->layout;
	uint64_t rb = rl->row_bytes[0];
	uint8_t *row = malloc(sp->row_bytes ? sp->row_bytes : 1);
	int rc = row ? read_at(fd, row, sp->row_bytes, sp->row_off) : -ENOMEM;
	if (rc == 0)
		rc = sel_record_check_row(&(struct iovec){row, rb}, 1, row_checksum);
	for (uint32_t r = 0; rc == 0 && r < p->lay.ranks; r++) {
		uint64_t at = 0;
		for (uint32_t i = 0; i < l->n_row_slots && at < rb; i++) {
			uint64_t off, len;
			sel_slot_layout_row_piece(&p->lay, r, i, &off, &len);
			if (len > rb - at)
				len = rb - at;
			memcpy((uint8_t *)sel_pool_slot_addr(p->pc, l->row_slots[i]) + off,
			       row + at, len);
			at += len;
		}
		if (at != rb)
			rc = eos_fail(SEL_ECORRUPT,
				      "cascade read: rank %u's row of %llu bytes "
				      "does not fit the lease",
				      r, (unsigned long long)rb);
	}
	free(row);
	return rc;
}

/* A replicated page record (one share for every rank), read and checked
 * at the start of the slot dst: copied into every other rank's share. */
static void page_spread(const struct sel_pooled *p, uint8_t *dst)
{
	for (uint32_t r = 1; r < p->lay.ranks; r++)
		memcpy(dst + p->lay.share_off[r], dst, p->lay.share[r]);
}

/* One chain file: its pages at chain page pos.. (those in the lease) and,
 * for the endpoint, its row.  Replicated shares (TP > 1: identical ranks'
 * pages or row stored once) are checked as stored and then copied out to
 * every rank, so the arena holds per-rank records either way. */
static int read_file(const struct sel_pooled *p, const struct sp_hjob *j,
		     const struct sel_disk_file *df, uint32_t pos, bool endpoint)
{
	const struct sel_pool_lease *l = j->lease;
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&df->d.key, name);
	bool direct = false;
	struct stat st;
	int fd = sel_record_open(p->casc_dirfd, name, &direct, &df->fid, &st);
	if (fd < 0)
		return fd;
	const sel_record_span *sp = &df->span;
	uint8_t *head = malloc(sp->header_bytes);
	size_t ckn = 8 * (size_t)df->d.tail; /* the checksum segment's entries */
	uint8_t *ck = calloc(ckn + 8, 1);
	sel_record_header h;
	int rc = head && ck ? read_at(fd, head, sp->header_bytes, 0) : -ENOMEM;
	if (rc == 0)
		rc = sel_record_decode(head, sp->header_bytes, p->casc_ns, &h);
	if (rc == 0)
		rc = sel_record_header_matches(&h, &df->d, sp);
	bool prep = df->d.flags & SEL_RECORD_PAGES_REPLICATED;
	uint64_t stride = prep ? p->lay.share[0] : p->lay.slot_bytes;
	for (uint32_t r = 1; rc == 0 && prep && r < p->lay.ranks; r++)
		if (p->lay.share[r] != stride)
			rc = eos_fail(SEL_ECORRUPT,
				      "cascade read: replicated pages, but rank %u's share "
				      "of %llu bytes is not rank 0's %llu",
				      r, (unsigned long long)p->lay.share[r],
				      (unsigned long long)stride);
	if (rc == 0 && sp->page_stride != stride)
		rc = eos_fail(SEL_ECORRUPT, "cascade read: page records of %llu bytes, not %llu",
			      (unsigned long long)sp->page_stride, (unsigned long long)stride);
	if (rc == 0 && ckn)
		rc = read_at(fd, ck, ckn, sp->cksum_off);
	for (uint32_t i = 0; rc == 0 && i < df->d.tail; i++) {
		if (pos + i < j->src_skip)
			continue; /* below the pool's parent */
		uint8_t *dst = sel_pool_slot_addr(p->pc, l->page_slots[pos + i - j->src_skip]);
		rc = read_at(fd, dst, sp->page_stride,
			     sp->page_off + (uint64_t)i * sp->page_stride);
		if (rc == 0)
			rc = sel_record_check_page(dst, sp->page_stride,
						   sel_get_u64(ck + 8 * (size_t)i), i);
		if (rc == 0 && prep)
			page_spread(p, dst);
	}
	if (rc == 0 && endpoint && (df->d.flags & SEL_RECORD_ROW_REPLICATED))
		rc = read_row_replicated(p, l, fd, sp, h.row_checksum);
	else if (rc == 0 && endpoint)
		rc = read_row(p, l, fd, sp, h.row_checksum);
	free(head);
	free(ck);
	close(fd);
	return rc;
}

/* A disk tier's chain into the windows (on the helper). */
static int read_files(const struct sel_pooled *p, const struct sp_hjob *j)
{
	uint32_t pos = 0;
	for (uint32_t k = 0; k < j->n_files; k++) {
		const struct sel_disk_file *df = &j->files[k];
		bool endpoint = k + 1 == j->n_files;
		if (pos + df->d.tail > j->src_skip || endpoint) {
			int rc = read_file(p, j, df, pos, endpoint);
			if (rc)
				return rc;
		}
		pos += df->d.tail;
	}
	return 0;
}

void sp_cascade_copy(const struct sel_pooled *p, struct sp_hjob *j)
{
	const struct sel_pool_lease *l = j->lease;
	if (j->files) {
		j->rstatus = read_files(p, j);
		return;
	}
	uint32_t R = p->lay.ranks;
	for (uint32_t k = 0; k < l->n_pages + l->n_row_slots; k++) {
		bool row = k >= l->n_pages;
		uint32_t slot = row ? l->row_slots[k - l->n_pages] : l->page_slots[k];
		size_t at = row ? (size_t)j->src_n + (k - l->n_pages) : (size_t)j->src_skip + k;
		uint8_t *dst = sel_pool_slot_addr(p->pc, slot);
		for (uint32_t r = 0; r < R; r++)
			memcpy(dst + p->lay.share_off[r], j->src[at * R + r], p->lay.share[r]);
	}
}

/* ---- shared with host exports (store_pooled_hold.c) --------------------------------------- */

const uint8_t **sp_chain_sources(struct sel_pooled *p, sel_store *s, const sel_key *key, uint32_t n,
				 sel_key *parent, uint32_t *tail)
{
	return chain_sources(p, s, key, n, parent, tail);
}

struct sel_disk_file *sp_chain_files(sel_store *s, const sel_key *key, uint32_t n,
				     uint32_t *n_files, sel_key *parent, uint32_t *tail)
{
	return chain_files(s, key, n, n_files, parent, tail);
}
