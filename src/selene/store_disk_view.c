/*
 * store_disk_view.c - a committed record file of the disk store as a reader
 * outside the disk thread sees it (the pooled store's end-of-chain cascade,
 * design 2.15): its description and span, the file id the index holds, and
 * the namespace the reader checks the header against.  Read-only: nothing
 * here changes the store.  The caller holds a store pin on the record
 * (sel_core_cascade_run does) while it reads the file, so the record is
 * neither evicted nor compacted under it; a doomed or unlinked file still
 * reads as what it was, or fails the reader's checks.
 */
#include <errno.h>
#include <string.h>

#include "store_disk_int.h"

int sel_disk_store_file(sel_store *s, const sel_key *key, struct sel_disk_file *out)
{
	struct disk_store *ds = sel_ds_of(s);
	sel_node_id id = sel_index_find(ds->c.ix, key);
	if (id == SEL_NODE_NONE)
		return -ENOENT;
	const sel_index_node *n = NODE(ds, id);
	const struct drec *r = ds_rec(ds, id);
	if (!r->file || r->writing || n->state != SEL_NODE_READY || (n->flags & DS_DOOMED))
		return -EAGAIN;
	memset(out, 0, sizeof *out);
	ds_node_desc(ds, id, &out->d);
	if (sel_record_span_of(&ds->ns->layout.sz, &out->d, &out->span))
		return -EAGAIN;
	out->fid = r->fid;
	out->has_row = n->flags & SEL_NODE_HAS_ROW;
	out->is_root = n->parent == SEL_NODE_NONE;
	if (!out->is_root)
		out->parent = NODE(ds, n->parent)->key;
	return 0;
}

int sel_disk_store_dirfd(sel_store *s) { return sel_ds_of(s)->lk->fd; }

const sel_record_ns *sel_disk_store_ns(sel_store *s) { return sel_ds_of(s)->ns; }
