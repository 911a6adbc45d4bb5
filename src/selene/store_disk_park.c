/*
 * store_disk_park.c - the disk store's side of the composite (design 2.4
 * CompositeStore; 2.5 write-behind, durability; store_disk.h "The
 * composite's side"): parked records, their charges, write_from and
 * read_into between record files and the composite's memory slots, drops
 * and pins.
 *
 * DESIGN
 *
 * A parked record is complete in DRAM: indexed READY (lookups may use it)
 * but not evictable, without a file, on the park list in park order, its
 * file bytes charged -- or, when the limit has no room even after
 * eviction, indexed uncharged (DS_UNCHARGED) until sel_disk_store_charge
 * succeeds.  write_from writes it from the composite's own slots with one
 * whole-record job (no copy) and commits it: a file, off the park list,
 * evictable.  read_into reads a committed record into the composite's
 * slots, verified; a verification failure dooms it like a fetch's.  Both
 * pin the record until their hook (written / read) runs from poll, after
 * this store updated its own state.
 *
 * INVARIANTS (the catalogue's, store_disk_catalog.c)
 *
 *   1. A record with a write_from in flight is parked, charged and pinned
 *      by it (writing).
 *   2. A record with a read_into in flight has a file and is pinned by it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "internal.h"
#include "store_disk_int.h"

int sel_disk_store_park(sel_store *s, const struct sel_disk_park *p, bool *charged)
{
	struct disk_store *ds = sel_ds_of(s);
	*charged = false;
	int rc = sel_core_refuse_stopped(&ds->c);
	if (rc)
		return rc;
	if (sel_index_find(ds->c.ix, &p->key) != SEL_NODE_NONE)
		return -EEXIST;
	sel_node_id pid =
		sel_key_is_none(&p->parent) ? SEL_NODE_NONE : sel_index_find(ds->c.ix, &p->parent);
	if (pid != SEL_NODE_NONE && (NODE(ds, pid)->flags & DS_DOOMED))
		pid = SEL_NODE_NONE;
	bool linked = false;
	if (pid != SEL_NODE_NONE) {
		uint64_t pc = NODE(ds, pid)->key.consumed, c = p->key.consumed;
		linked = pc < c && p->tail == (uint32_t)(c / ds->c.pt - pc / ds->c.pt);
		if (!linked)
			pid = SEL_NODE_NONE;
	}
	sel_record_desc d = {
		.key = p->key, .bucket = p->bucket, .tail = p->tail, .flags = p->flags};
	if (linked) {
		d.parent = p->parent;
		d.parent_check = sel_record_parent_check(&NODE(ds, pid)->bucket);
	}
	sel_record_span span;
	if ((rc = sel_record_span_of(&ds->ns->layout.sz, &d, &span)))
		return rc;
	uint64_t bytes = p->row ? span.row_end : span.row_off;
	if (bytes + ds_ancestors_bytes(ds, pid) > ds->limit)
		return eos_fail(SEL_EOVERSIZE,
				"disk store: record of %" PRIu64 " bytes with its "
				"ancestors exceeds the limit",
				bytes);
	sel_node_id id;
	if ((rc = sel_core_insert(&ds->c, &p->key, linked ? &p->parent : NULL, &p->bucket, p->tail,
				  p->row, &id)))
		return rc;
	struct drec *r = ds_rec(ds, id);
	r->pprev = r->pnext = SEL_NODE_NONE;
	r->fparent = d.parent;
	r->parent_check = d.parent_check;
	r->flags = p->flags;
	r->full = span.row_end;
	r->rowseg = span.row_end - span.row_off;
	sel_index_set_evictable(ds->c.ix, id, false);
	sel_index_get(ds->c.ix, id)->flags |= DS_PARKED | DS_UNCHARGED;
	ds->uncharged++;
	r->wants = ds_node_bytes(ds, id);
	ds->wanted += r->wants;
	ds_park_add(ds, id);
	sel_index_commit(ds->c.ix, id); /* complete in DRAM: lookups may use it */
	*charged = ds_charge(ds, &p->key, true) == 0;
	debug_check(ds);
	return 0;
}

int sel_disk_store_charge(sel_store *s, const sel_key *key)
{
	return ds_charge(sel_ds_of(s), key, true);
}

int sel_disk_store_charge_free(sel_store *s, const sel_key *key)
{
	return ds_charge(sel_ds_of(s), key, false);
}

int sel_disk_store_next_parked(sel_store *s, sel_key *key)
{
	struct disk_store *ds = sel_ds_of(s);
	sel_node_id id;
	if (sel_key_is_none(key)) {
		id = ds->park_head;
	} else {
		id = sel_index_find(ds->c.ix, key);
		if (id == SEL_NODE_NONE || !ds_rec(ds, id)->parked_listed)
			return 0;
		id = ds_rec(ds, id)->pnext;
	}
	if (id == SEL_NODE_NONE)
		return 0;
	*key = NODE(ds, id)->key;
	return 1;
}

/* A whole-record job for write_from / read_into on node id: its page
 * addresses and row pieces copied into the block. */
static struct dj *record_job(struct disk_store *ds, uint8_t kind, sel_node_id id, bool row,
			     void *const *pages, const struct iovec *row_iov, uint32_t row_n,
			     void *arg)
{
	uint32_t tail = NODE(ds, id)->tail_pages;
	size_t sz = sizeof(struct dj) + (size_t)tail * sizeof(void *) +
		    (size_t)(row ? row_n : 0) * sizeof(struct iovec);
	struct dj *d = calloc(1, sz);
	if (!d) {
		eos_fail(-ENOMEM, "disk store: out of memory");
		return NULL;
	}
	void **pa = (void **)(d + 1);
	struct iovec *iov = (struct iovec *)(pa + tail);
	memcpy(pa, pages, (size_t)tail * sizeof(void *));
	if (row)
		memcpy(iov, row_iov, (size_t)row_n * sizeof(*iov));
	d->kind = kind;
	d->standalone = true;
	d->node = id;
	d->arg = arg;
	d->j.pages = pa;
	d->j.row = row;
	d->j.row_iov = row ? iov : NULL;
	d->j.row_n = row ? row_n : 0;
	return d;
}

/* A running store and key's node: 0 with *id, SEL_ESTOPPED, or missing
 * (the caller's error for an absent record). */
static int record_of(struct disk_store *ds, const sel_key *key, int missing, sel_node_id *id)
{
	int rc = sel_core_refuse_stopped(&ds->c);
	if (rc)
		return rc;
	if ((*id = sel_index_find(ds->c.ix, key)) == SEL_NODE_NONE)
		return eos_fail(missing, "disk store: no such record");
	return 0;
}

int sel_disk_store_write_from(sel_store *s, const sel_key *key, void *const *pages,
			      const struct iovec *row_iov, uint32_t row_n, void *arg)
{
	struct disk_store *ds = sel_ds_of(s);
	sel_node_id id;
	int rc = record_of(ds, key, -ENOENT, &id);
	if (rc)
		return rc;
	const sel_index_node *n = NODE(ds, id);
	struct drec *r = ds_rec(ds, id);
	if (r->writing)
		return eos_fail(-EBUSY, "disk store: a write of this record is in flight");
	if (!(n->flags & DS_PARKED) || (n->flags & (DS_UNCHARGED | DS_DOOMED)))
		return eos_fail(-EINVAL,
				"disk store: write_from of a record that is not parked and "
				"charged");
	bool row = n->flags & SEL_NODE_HAS_ROW;
	if (row && (!row_iov || !row_n))
		return eos_fail(-EINVAL, "disk store: write_from without the row");
	struct dj *d = record_job(ds, K_WRITE_FROM, id, row, pages, row_iov, row_n, arg);
	if (!d)
		return -ENOMEM;
	d->j.op = SEL_DISK_WRITE;
	ds_node_desc(ds, id, &d->j.rec);
	jobs_push(&ds->jobs, d);
	r->writing = true;
	ds_pin(&ds->c, id);
	ds_disk_submit(ds, d);
	debug_check(ds);
	return 0;
}

void ds_write_from_done(struct disk_store *ds, struct dj *d)
{
	sel_node_id id = d->node;
	struct drec *r = ds_rec(ds, id);
	int rc = d->j.status;
	r->writing = false;
	if (rc && d->j.committed)
		rc = 0; /* in place; only the directory fsync failed */
	if (rc == 0) {
		r->file = true;
		r->fid = d->j.file;
		r->pad_zero = true; /* written by this build: version 4 */
		sel_index_get(ds->c.ix, id)->flags &= (uint16_t) ~(DS_PARKED | DS_UNCHARGED);
		ds_park_del(ds, id);
		sel_core_count_stored(&ds->c, d->j.bytes, r->flags != 0);
		ds->c.st.spilled_bytes += d->j.bytes;
		sel_index_set_evictable(ds->c.ix, id, true);
	} else {
		ds->c.st.store_failures++;
	}
	ds_hook_push(ds, K_WRITE_FROM, d->arg, rc);
	ds_unpin(&ds->c, id);
}

int sel_disk_store_read_into(sel_store *s, const sel_key *key, bool row, void *const *pages,
			     const struct iovec *row_iov, uint32_t row_n, void *arg)
{
	struct disk_store *ds = sel_ds_of(s);
	sel_node_id id;
	int rc = record_of(ds, key, -ESTALE, &id);
	if (rc)
		return rc;
	const sel_index_node *n = NODE(ds, id);
	if (!ds_rec(ds, id)->file || (n->flags & DS_DOOMED) ||
	    (row && !(n->flags & SEL_NODE_HAS_ROW)))
		return eos_fail(-ESTALE, "disk store: the record has no file%s",
				row ? " or no row" : "");
	struct dj *d = record_job(ds, K_READ_INTO, id, row, pages, row_iov, row_n, arg);
	if (!d)
		return -ENOMEM;
	d->j.op = SEL_DISK_READ;
	ds_job_rec(ds, id, &d->j);
	jobs_push(&ds->jobs, d);
	ds_pin(&ds->c, id);
	sel_index_touch(ds->c.ix, id);
	ds_disk_submit(ds, d);
	debug_check(ds);
	return 0;
}

void ds_read_into_done(struct disk_store *ds, struct dj *d)
{
	int rc = d->j.status;
	if (rc == 0) {
		ds->c.st.tier[SEL_TIER_DISK].bytes_in += d->j.bytes;
		ds->c.st.read_through_bytes += d->j.bytes;
	} else {
		ds_read_failed(ds, d->node, rc);
	}
	ds_hook_push(ds, K_READ_INTO, d->arg, rc);
	ds_unpin(&ds->c, d->node);
}

/* fetch_into's shape: whole nodes, each node's slots its record's layout
 * (the windows' slots are cut from them, win_new), not sharded.  The
 * caller's slots copied into one block; NULL with *rc otherwise. */
static struct sel_disk_into *into_copy(struct disk_store *ds, const struct sel_chain_walk *w,
				       const struct sel_disk_into *into, uint32_t n_into, int *rc)
{
	*rc = -ENOTSUP;
	if (ds->sh || w->skip || n_into != w->n)
		return NULL;
	size_t slots = 0;
	for (uint32_t i = 0; i < w->n; i++) {
		uint32_t tail = NODE(ds, w->ids[i])->tail_pages, fl = ds_rec(ds, w->ids[i])->flags;
		bool packed = ds->c.ranks > 1 && (fl & SEL_RECORD_PAGES_REPLICATED);
		if (packed && SEL_WINDOW_PAGES % ds->c.ranks)
			return NULL;
		if (into[i].n_page_slots != (packed ? sel_div_up(tail, ds->c.ranks) : tail))
			return NULL;
		if (i + 1 == w->n &&
		    into[i].n_row_slots != sel_record_row_slots(&ds->ns->layout, fl))
			return NULL;
		slots += (size_t)into[i].n_page_slots + (i + 1 == w->n ? into[i].n_row_slots : 0);
	}
	struct sel_disk_into *b = malloc(w->n * sizeof(*b) + slots * sizeof(uint32_t));
	if (!b) {
		*rc = eos_fail(-ENOMEM, "disk store: out of memory");
		return NULL;
	}
	uint32_t *at = (uint32_t *)(b + w->n);
	for (uint32_t i = 0; i < w->n; i++) {
		uint32_t k = into[i].n_page_slots + (i + 1 == w->n ? into[i].n_row_slots : 0);
		memcpy(at, into[i].slots, k * sizeof(uint32_t));
		b[i] = (struct sel_disk_into){.slots = at,
					      .n_page_slots = into[i].n_page_slots,
					      .n_row_slots =
						      i + 1 == w->n ? into[i].n_row_slots : 0};
		at += k;
	}
	*rc = 0;
	return b;
}

int sel_disk_store_fetch_into(sel_store *s, const sel_hit *hit, const sel_inbound *in,
			      const struct sel_disk_into *into, uint32_t n_into, void *arg)
{
	struct disk_store *ds = sel_ds_of(s);
	struct sel_chain_walk w;
	int rc = sel_core_fetch_check(&ds->c, hit, in, ds_has_file,
				      "part of the hit chain has no file yet", &w);
	if (rc)
		return rc;
	if (in->n_sums)
		return -ENOTSUP;
	struct sel_disk_into *b = into_copy(ds, &w, into, n_into, &rc);
	if (!b)
		return rc;
	if ((rc = ds_fetch_stream(ds, hit, in, &w, b, arg)) != 0)
		free(b);
	debug_check(ds);
	return rc;
}

int sel_disk_store_drop(sel_store *s, const sel_key *key, int reason)
{
	struct disk_store *ds = sel_ds_of(s);
	sel_node_id id = sel_index_find(ds->c.ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	if (NODE(ds, id)->flags & DS_DOOMED)
		return 0;
	sel_tier_stats *t = &ds->c.st.tier[SEL_TIER_DISK];
	uint64_t n = 1 + ds_doom(ds, id); /* doom counts nothing itself */
	if (reason == SEL_DISK_DROP_OVERSIZE)
		t->dropped_oversize += n;
	else if (reason == SEL_DISK_DROP_END_OF_CHAIN)
		t->dropped_end_of_chain += n;
	else
		t->dropped_io_error += n;
	debug_check(ds);
	return 0;
}

int sel_disk_store_pin(sel_store *s, const sel_key *key)
{
	return sel_core_pin_key(&sel_ds_of(s)->c, key);
}

void sel_disk_store_unpin(sel_store *s, const sel_key *key)
{
	sel_core_unpin_key(&sel_ds_of(s)->c, key);
}

bool sel_disk_store_chain_on_disk(sel_store *s, const sel_key *key, uint64_t resident)
{
	struct disk_store *ds = sel_ds_of(s);
	struct sel_chain_walk w;
	if (sel_core_walk(&ds->c, key, resident, &w) != 0)
		return false;
	for (uint32_t i = 0; i < w.n; i++)
		if (!ds_has_file(&ds->c, w.ids[i]))
			return false;
	return true;
}
