/*
 * store_disk_catalog.c - the disk store's catalogue: what it knows of each
 * record, the disk limit, pins, doomed records and eviction (design 2.4
 * DiskStore; 2.3 tree eviction, row drops; 2.5 budget and expiry; 2.11
 * disk limit; 2.12 invariants; 2.15 local eviction and retention
 * counters).
 *
 * DESIGN
 *
 * A record is its index node plus a struct drec: the parent its file names
 * and that link's check, the file indexed (device and inode: a file put
 * under the name later is never read or truncated), its file bytes with
 * and without the row, what it charges against the limit, DRAM's packing
 * decisions, and whether it has a file, a write in flight or a place on
 * the park list (the composite's records complete in DRAM, without a file
 * yet, in park order).
 *
 * Budget.  Every record charges its file bytes (with or without the row)
 * against the limit (cfg->disk_limit, or a tenth of the free space at
 * startup).  A removal or compaction releases its bytes when its unlink or
 * truncate job is submitted: the disk thread runs job prologues in
 * submission order, so a later write's fallocate never precedes it.  A
 * removal that fails leaves its bytes charged as stuck until restart.
 * Eviction removes least recently used unpinned leaves (unlink) and, when
 * every leaf is pinned, compacts (truncate) until the bytes fit.
 *
 * Doom.  A read that fails verification or finds its file gone dooms the
 * record and its descendants: lookups and fetches refuse them at once
 * (the skeleton's refuse flags), and each is removed at its last unpin.
 *
 * Every removal, whatever its cause (eviction, doom, expiry, a drop), runs
 * the composite's removed hook, so its memory copy goes too.
 *
 * INVARIANTS (verified by sel_disk_store_check)
 *
 *   1. Every live index node has a live record and vice versa.
 *   2. used == the sum of charged bytes + stuck bytes; a record charges 0
 *      when uncharged, else its file bytes with its row when it has one.
 *   3. A record with a file or a write in flight is charged.  A READY
 *      record has a file or is parked; a parked record has no file and is
 *      not evictable; every parked record is on the park list once.
 *   4. A record with a write in flight is pinned by it; a fetch pins every
 *      node of its chain; store pins (mypins) <= index pins.
 *   5. inflight_out / inflight_in count the put streams and fetches not yet
 *      reported.
 *   6. unlinking == the bytes of the unlink and truncate jobs not yet
 *      completed; wanted == the wants of the uncharged records (0 for
 *      every charged one).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "slab.h"
#include "store_disk_int.h"

uint64_t ds_node_bytes(struct disk_store *ds, sel_node_id id)
{
	const struct drec *r = ds_rec(ds, id);
	return (NODE(ds, id)->flags & SEL_NODE_HAS_ROW) ? r->full : r->full - r->rowseg;
}

void ds_node_desc(struct disk_store *ds, sel_node_id id, sel_record_desc *d)
{
	const sel_index_node *n = NODE(ds, id);
	const struct drec *r = ds_rec(ds, id);
	memset(d, 0, sizeof(*d));
	d->key = n->key;
	d->parent = r->fparent;
	d->bucket = n->bucket;
	d->tail = n->tail_pages;
	d->flags = r->flags;
	d->parent_check = r->parent_check;
}

void ds_job_rec(struct disk_store *ds, sel_node_id id, struct sel_disk_job *j)
{
	ds_node_desc(ds, id, &j->rec);
	j->want = ds_rec(ds, id)->fid;
}

/* ---- park list --------------------------------------------------------------- */

void ds_park_add(struct disk_store *ds, sel_node_id id)
{
	struct drec *r = ds_rec(ds, id);
	r->pprev = ds->park_tail;
	r->pnext = SEL_NODE_NONE;
	if (ds->park_tail != SEL_NODE_NONE)
		ds_rec(ds, ds->park_tail)->pnext = id;
	else
		ds->park_head = id;
	ds->park_tail = id;
	r->parked_listed = true;
	ds->parked++;
}

void ds_park_del(struct disk_store *ds, sel_node_id id)
{
	struct drec *r = ds_rec(ds, id);
	if (!r->parked_listed)
		return;
	if (r->pprev != SEL_NODE_NONE)
		ds_rec(ds, r->pprev)->pnext = r->pnext;
	else
		ds->park_head = r->pnext;
	if (r->pnext != SEL_NODE_NONE)
		ds_rec(ds, r->pnext)->pprev = r->pprev;
	else
		ds->park_tail = r->pprev;
	r->parked_listed = false;
	ds->parked--;
}

/* ---- index callbacks --------------------------------------------------------- */

/* A file job releasing bytes now (budget), or, without memory for it, the
 * bytes stay charged as stuck until a restart. */
static void file_job(struct disk_store *ds, sel_node_id id, uint8_t kind, enum sel_disk_op op,
		     uint64_t bytes)
{
	if (ds->sh)
		ds_shard_file(ds, id, op); /* the same file on every peer */
	struct dj *d = ds_job_new(ds, kind, id, op);
	if (d) {
		d->bytes = bytes;
		ds->unlinking += bytes; /* until disk_done */
		ds_disk_submit(ds, d);
	} else {
		ds->stuck += bytes;
		ds->used += bytes;
	}
}

void ds_drop_row(struct sel_core *c, sel_node_id id)
{
	struct disk_store *ds = (struct disk_store *)c;
	struct drec *r = ds_rec(ds, id);
	if (r->charged) {
		ds->used -= r->rowseg;
		r->charged -= r->rowseg;
	}
	if (r->file)
		file_job(ds, id, K_TRUNCATE, SEL_DISK_TRUNCATE, r->rowseg);
}

void ds_remove(struct sel_core *c, sel_node_id id)
{
	struct disk_store *ds = (struct disk_store *)c;
	struct drec *r = ds_rec(ds, id);
	const sel_index_node *n = NODE(ds, id);
	sel_key key = n->key;
	bool parked = n->flags & DS_PARKED;
	if (r->file)
		file_job(ds, id, K_UNLINK, SEL_DISK_UNLINK, r->charged);
	ds->used -= r->charged;
	ds_park_del(ds, id);
	if (n->flags & DS_UNCHARGED) {
		ds->uncharged--;
		ds->wanted -= r->wants;
	}
	if (ds->hooks.removed)
		ds->hooks.removed(ds->hooks.ctx, &key, parked, ds->c.why == SEL_WHY_EXPIRE);
}


/* ---- pins, doom, eviction ---------------------------------------------------- */

void ds_pin(struct sel_core *c, sel_node_id id)
{
	struct disk_store *ds = (struct disk_store *)c;
	ds_rec(ds, id)->h.mypins++;
	sel_index_pin(ds->c.ix, id);
}

/* Remove every doomed node that is unpinned and childless, until none is. */
static void reap(struct disk_store *ds)
{
	bool more = true;
	while (more) {
		more = false;
		uint32_t keep = 0;
		for (uint32_t i = 0; i < ds->n_doomed; i++) {
			sel_node_id id = ds->doomed[i];
			const sel_index_node *n = NODE(ds, id);
			if (!n || !sel_core_live(&ds->c, id) || !(n->flags & DS_DOOMED))
				continue; /* gone already */
			if (n->pins || n->children) {
				ds->doomed[keep++] = id;
				continue;
			}
			enum sel_core_why w = ds->c.why;
			ds->c.why = SEL_WHY_DOOM;
			(void)sel_index_remove(ds->c.ix, id);
			ds->c.why = w;
			more = true;
		}
		ds->n_doomed = keep;
	}
}

void ds_unpin(struct sel_core *c, sel_node_id id)
{
	struct disk_store *ds = (struct disk_store *)c;
	ds_rec(ds, id)->h.mypins--;
	sel_index_unpin(ds->c.ix, id);
	if (ds->n_doomed)
		reap(ds);
}

/* Whether x is id or below it. */
static bool is_under(struct disk_store *ds, sel_node_id x, sel_node_id id)
{
	for (sel_node_id p = x; p != SEL_NODE_NONE; p = NODE(ds, p)->parent)
		if (p == id)
			return true;
	return false;
}

uint64_t ds_doom(struct disk_store *ds, sel_node_id id)
{
	uint64_t below = 0;
	for (sel_node_id x = sel_index_next_lru(ds->c.ix, SEL_NODE_NONE); x != SEL_NODE_NONE;
	     x = sel_index_next_lru(ds->c.ix, x)) {
		if ((NODE(ds, x)->flags & DS_DOOMED) || !is_under(ds, x, id))
			continue;
		if (x != id)
			below++;
		sel_index_get(ds->c.ix, x)->flags |= DS_DOOMED;
		if (ds->n_doomed == ds->cap_doomed) {
			uint32_t n = ds->cap_doomed ? ds->cap_doomed * 2 : 16;
			sel_node_id *p = realloc(ds->doomed, n * sizeof(*p));
			if (!p)
				continue; /* stays doomed: refused by lookup and fetch */
			ds->doomed = p;
			ds->cap_doomed = n;
		}
		ds->doomed[ds->n_doomed++] = x;
	}
	reap(ds);
	return below;
}

/* A read status that makes the record useless for good: it failed
 * verification, or the file is gone.  (An I/O error may be transient: the
 * fetch fails, the committed record stays.) */
static bool doom_status(int rc) { return rc == SEL_ECORRUPT || rc == -ENOENT; }

void ds_read_failed(struct disk_store *ds, sel_node_id id, int rc)
{
	if (!doom_status(rc) || (NODE(ds, id)->flags & DS_DOOMED))
		return;
	sel_tier_stats *t = &ds->c.st.tier[SEL_TIER_DISK];
	if (rc == SEL_ECORRUPT)
		t->corrupt++;
	else
		t->dropped_io_error++;
	t->dropped_io_error += ds_doom(ds, id);
}

static bool budget_fits(struct sel_core *c, uint64_t need)
{
	struct disk_store *ds = (struct disk_store *)c;
	return ds->used + need <= ds->limit;
}

bool ds_make_room(struct disk_store *ds, uint64_t need)
{
	return sel_core_evict_until(&ds->c, budget_fits, need);
}

uint64_t ds_ancestors_bytes(struct disk_store *ds, sel_node_id pid)
{
	uint64_t b = 0;
	for (; pid != SEL_NODE_NONE; pid = NODE(ds, pid)->parent)
		b += ds_node_bytes(ds, pid);
	return b;
}

int ds_charge(struct disk_store *ds, const sel_key *key, bool evict)
{
	sel_node_id id = sel_index_find(ds->c.ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	if (!(NODE(ds, id)->flags & DS_UNCHARGED))
		return 0;
	uint64_t bytes = ds_node_bytes(ds, id);
	if (evict) {
		ds_pin(&ds->c, id);
		bool ok = ds_make_room(ds, bytes);
		ds_unpin(&ds->c, id);
		if (!ok || sel_index_find(ds->c.ix, key) != id)
			return -ENOSPC;
	} else if (ds->used + bytes > ds->limit) {
		return -ENOSPC;
	}
	ds_rec(ds, id)->charged = bytes;
	ds->used += bytes;
	sel_index_get(ds->c.ix, id)->flags &= (uint16_t)~DS_UNCHARGED;
	ds->uncharged--;
	ds->wanted -= ds_rec(ds, id)->wants;
	ds_rec(ds, id)->wants = 0;
	debug_check(ds);
	return 0;
}

/* Expiry may drop a committed or parked record that is not doomed (pinned
 * ones -- streams, write_from, read_into -- are passed over by the index). */
static bool ds_droppable(void *ctx, const sel_index *ix, sel_node_id id)
{
	struct disk_store *ds = ctx;
	const sel_index_node *n = sel_index_cget(ix, id);
	return n->state == SEL_NODE_READY && !(n->flags & DS_DOOMED) && !ds_rec(ds, id)->writing;
}

void ds_expire(struct disk_store *ds)
{
	/* Unlinks and memory copies through the usual removal path. */
	sel_core_expire(&ds->c, ds_droppable);
}

/* ---- checks and introspection ------------------------------------------------------------ */

int sel_disk_store_record(sel_store *s, const sel_key *key, struct sel_disk_record_info *out)
{
	struct disk_store *ds = sel_ds_of(s);
	sel_node_id id = sel_index_find(ds->c.ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = NODE(ds, id);
	const struct drec *r = ds_rec(ds, id);
	memset(out, 0, sizeof(*out));
	out->ready = n->state == SEL_NODE_READY;
	out->has_row = n->flags & SEL_NODE_HAS_ROW;
	out->file = r->file;
	out->writing = r->writing;
	out->parked = n->flags & DS_PARKED;
	out->charged = !(n->flags & DS_UNCHARGED);
	out->failed = n->flags & DS_FAILED;
	out->doomed = n->flags & DS_DOOMED;
	out->is_root = n->parent == SEL_NODE_NONE;
	out->tail = n->tail_pages;
	out->flags = r->flags;
	out->pins = n->pins;
	out->bytes = ds_node_bytes(ds, id);
	out->bucket = n->bucket;
	out->tick = n->tick;
	out->used_ns = sel_index_used_ns(ds->c.ix, id);
	if (!out->is_root)
		out->parent = NODE(ds, n->parent)->key;
	return 0;
}

uint64_t sel_disk_store_uncharged(sel_store *s) { return sel_ds_of(s)->uncharged; }

void sel_disk_store_usage(sel_store *s, uint64_t *used, uint64_t *limit)
{
	struct disk_store *ds = sel_ds_of(s);
	if (used)
		*used = ds->used;
	if (limit)
		*limit = ds->limit;
}

void sel_disk_store_thread_stats(sel_store *s, struct sel_disk_stats *out)
{
	struct disk_store *ds = sel_ds_of(s);
	memset(out, 0, sizeof(*out));
	if (ds->disk)
		sel_disk_stats(ds->disk, out);
}

size_t sel_disk_store_keys(sel_store *s, sel_key *keys, size_t cap)
{
	return sel_core_keys(&sel_ds_of(s)->c, keys, cap);
}

struct check_ctx {
	uint64_t charged, parked, unch, wanted;
};

/* Invariants 2-4 for one record. */
static int check_rec(struct sel_core *c, sel_node_id id, const sel_index_node *n, void *arg)
{
	struct disk_store *ds = (struct disk_store *)c;
	struct check_ctx *x = arg;
	const struct drec *r = ds_rec(ds, id);
	bool unch = n->flags & DS_UNCHARGED, park = n->flags & DS_PARKED;
	x->unch += unch;
	x->wanted += r->wants;
	if (!unch && r->wants)
		return eos_fail(SEL_ECORRUPT,
				"disk store: charged node %" PRIu32 " still wants %" PRIu64
				" bytes",
				id, r->wants);
	uint64_t want = unch ? 0 : ds_node_bytes(ds, id);
	if (!(n->flags & DS_FAILED) && r->charged != want)
		return eos_fail(SEL_ECORRUPT,
				"disk store: node %" PRIu32 " charges %" PRIu64
				", expected %" PRIu64,
				id, r->charged, want);
	if ((n->flags & DS_FAILED) && (r->charged || r->file))
		return eos_fail(SEL_ECORRUPT,
				"disk store: failed node %" PRIu32 " holds a file "
				"or charge",
				id);
	x->charged += r->charged;
	if ((r->file || r->writing) && unch)
		return eos_fail(SEL_ECORRUPT,
				"disk store: node %" PRIu32 " has a file or a write "
				"but no charge",
				id);
	if (n->state == SEL_NODE_READY && !r->file && !park)
		return eos_fail(SEL_ECORRUPT,
				"disk store: ready node %" PRIu32 " has no file and "
				"is not parked",
				id);
	if (park && (r->file || !(n->flags & SEL_NODE_NOEVICT) || !r->parked_listed))
		return eos_fail(SEL_ECORRUPT,
				"disk store: parked node %" PRIu32 " has a file, is "
				"evictable or is off the park list",
				id);
	if (!park && r->parked_listed)
		return eos_fail(SEL_ECORRUPT,
				"disk store: node %" PRIu32 " on the park list is "
				"not parked",
				id);
	x->parked += r->parked_listed;
	if (r->writing && !r->h.mypins)
		return eos_fail(SEL_ECORRUPT, "disk store: node %" PRIu32 " is written unpinned",
				id);
	return 0;
}

/* Invariant 5: the streams in flight, and their pins. */
static int check_streams(struct disk_store *ds)
{
	uint64_t puts = 0, fetches = 0;
	for (const struct dstream *st = ds->streams.head; st; st = st->next) {
		if (st->put)
			puts++;
		else
			fetches++;
		for (uint32_t i = 0; i < (st->put ? 1 : st->n_nodes); i++)
			if (!sel_core_live(&ds->c, st->nodes[i]) ||
			    !ds_rec(ds, st->nodes[i])->h.mypins)
				return eos_fail(SEL_ECORRUPT,
						"disk store: a stream uses unpinned node %" PRIu32,
						st->nodes[i]);
	}
	uint64_t unlinking = 0;
	for (const struct dj *d = ds->jobs.head; d; d = d->next) {
		puts += d->held != NULL;
		if (d->kind == K_UNLINK || d->kind == K_TRUNCATE)
			unlinking += d->bytes;
	}
	if (unlinking != ds->unlinking)
		return eos_fail(SEL_ECORRUPT,
				"disk store: %" PRIu64
				" bytes of removals in flight, counted %" PRIu64,
				unlinking, ds->unlinking);
	return sel_core_check_inflight(&ds->c, puts, fetches, "streams");
}

int sel_disk_store_check(sel_store *s)
{
	struct disk_store *ds = sel_ds_of(s);
	int rc;
	if (ds->c.own_sp && (rc = sel_slab_check(ds->pool)))
		return rc;
	struct check_ctx x = {0};
	if ((rc = sel_core_check(&ds->c, check_rec, &x)))
		return rc;
	if (x.charged + ds->stuck != ds->used)
		return eos_fail(SEL_ECORRUPT,
				"disk store: charges %" PRIu64 " + stuck %" PRIu64
				" != used %" PRIu64,
				x.charged, ds->stuck, ds->used);
	if (x.wanted != ds->wanted)
		return eos_fail(SEL_ECORRUPT,
				"disk store: uncharged records want %" PRIu64
				" bytes, counted %" PRIu64,
				x.wanted, ds->wanted);
	if (x.unch != ds->uncharged)
		return eos_fail(SEL_ECORRUPT, "disk store: %" PRIu64 " uncharged, counted %" PRIu64,
				x.unch, ds->uncharged);
	if (x.parked != ds->parked)
		return eos_fail(SEL_ECORRUPT, "disk store: %" PRIu64 " parked, counted %" PRIu64,
				x.parked, ds->parked);
	return check_streams(ds);
}

bool sel_disk_store_fits(sel_store *s, const sel_published *cp)
{
	struct disk_store *ds = sel_ds_of(s);
	uint64_t c = cp->key.consumed;
	sel_node_id pid = sel_key_is_none(&cp->parent) ? SEL_NODE_NONE
						       : sel_index_find(ds->c.ix, &cp->parent);
	sel_record_desc d = {.key = cp->key, .bucket = cp->bucket, .tail = cp->n_pages};
	if (pid != SEL_NODE_NONE) {
		uint64_t p = NODE(ds, pid)->key.consumed;
		if (p < c && cp->tail == (uint32_t)(c / ds->c.pt - p / ds->c.pt)) {
			d.parent = cp->parent;
			d.tail = cp->tail;
		} else {
			pid = SEL_NODE_NONE;
		}
	}
	sel_record_span span;
	if (sel_record_span_of(&ds->ns->layout.sz, &d, &span) != 0)
		return false;
	return span.row_end + ds_ancestors_bytes(ds, pid) <= ds->limit;
}
