/*
 * store_disk_recovery.c - the disk store's start: its namespace directory
 * created and locked, the disk limit, and the index rebuilt from the files
 * by the recovery `flare records gc` runs too (design 2.5 record files,
 * directory lock, recovery; 2.3 startup pruning; 2.11 disk limit; issue
 * 12: files that lie).
 *
 * DESIGN
 *
 * Namespace.  <disk_dir>/<identity prefix>-<fingerprint> is created and
 * locked (eos_dirlock) before anything is read: a second owner of the same
 * namespace fails at open with -EBUSY before scanning or deleting; other
 * namespaces share the base directory.  The lock is held until destroy
 * (or for ever, if the disk thread could not drain).
 *
 * Startup.  sel_recover (record_recovery.c) scans -- removing temporaries,
 * invalid files, files over the limit or with holes, orphans and records
 * with a bad parent link -- inserts the survivors (linked under their
 * parents when their tails are the counts since them), with their rows
 * when the file lengths cover them, commits them all -- which applies the
 * row-drop rule to any single-child ancestor whose truncation a crash
 * interrupted -- prunes what is useless, seeds each record's last use from
 * its file's mtime (no later than now) and sorts the access order by the
 * newest time under each record.  The hook below attaches each survivor's
 * record (its file's identity, parent link, sizes and charge).  If the
 * records exceed the limit, LRU eviction brings them under it.
 *
 * INVARIANTS
 *
 *   1. Nothing in the directory is read or removed before the lock is held.
 *   2. Every rebuilt record has a file and charges its file's bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "recovery.h"
#include "store_disk_int.h"

int ds_namespace_open(struct disk_store *ds, const sel_store_config *cfg)
{
	int rc;
	if (!(ds->ns = calloc(1, sizeof(*ds->ns))) || !(ds->lk = calloc(1, sizeof(*ds->lk))))
		return eos_fail(-ENOMEM, "disk store: out of memory");
	ds->lk->fd = -1;
	if ((rc = sel_record_ns_init(ds->ns, cfg->geometry, cfg->identity)))
		return rc;
	if (cfg->ranks)
		ds_shard_namespace(ds, cfg); /* design 2.14: this rank's namespace */
	/* The lock first: a second owner fails here, before any scan. */
	if ((rc = sel_record_dir_open(cfg->disk_dir, ds->ns, ds->lk)))
		return eos_fail(rc, "disk store: %s", eos_errmsg());
	if (!(ds->dir = strdup(ds->lk->path)))
		return eos_fail(-ENOMEM, "disk store: out of memory");
	ds->limit = cfg->disk_limit;
	if (!ds->limit) {
		uint64_t avail = 0;
		if ((rc = eos_fs_space(ds->lk->path, &avail, NULL)))
			return eos_fail(rc, "disk store: free space of '%s': %s", ds->lk->path,
					eos_errmsg());
		ds->limit = avail / 10;
	}
	if (cfg->disk_share_div) {
		ds->shared = ds->limit / cfg->disk_share_div;
		ds->limit -= ds->shared;
	}
	return 0;
}

/* The startup recovery's hook: the record behind node id, from its file. */
static int rebuilt(void *ctx, sel_index *ix, sel_node_id id, size_t i, const sel_scan_record *x)
{
	(void)ix;
	(void)i;
	struct disk_store *ds = ctx;
	int rc = sel_core_ensure_rec(&ds->c, id);
	if (rc)
		return rc;
	struct drec *r = ds_rec(ds, id);
	memset(r, 0, sizeof(*r));
	r->h.live = true;
	r->file = true;
	r->pprev = r->pnext = SEL_NODE_NONE;
	r->fparent = x->d.parent;
	r->parent_check = x->d.parent_check;
	r->fid = x->id;
	r->pad_zero = x->version >= SEL_RECORD_VERSION_ZERO_PAD;
	r->flags = x->d.flags;
	r->full = x->span.row_end;
	r->rowseg = x->span.row_end - x->span.row_off;
	r->charged = x->file_bytes;
	ds->used += r->charged;
	return 0;
}

int ds_rebuild(struct disk_store *ds)
{
	sel_scan sc;
	struct sel_recovery_opts ro = {
		.scan = {.direct = false, .max_file_bytes = ds->limit},
		.now_ns = ds->c.exp.clock(),
		.inserted = rebuilt,
		.ctx = ds,
	};
	int rc = sel_recover(ds->lk->fd, ds->ns, &ro, ds->c.ix, &sc);
	if (rc)
		return eos_fail(rc, "disk store: recovering '%s': %s", ds->dir, eos_errmsg());
	/* Files the scan removed for failing header verification count as
	 * corrupt records (docs/metrics.md), like payloads failing at a read. */
	sel_tier_stats *t = &ds->c.st.tier[SEL_TIER_DISK];
	t->corrupt += sc.st.bad_format + sc.st.bad_checksum + sc.st.bad_name + sc.st.bad_size +
		      sc.st.bad_sparse + sc.st.bad_link;
	t->dropped_oversize += sc.st.bad_large;
	ds->scanned = sel_index_count(ds->c.ix);
	(void)ds_make_room(ds, 0); /* over the limit: LRU eviction */
	sel_scan_free(&sc);
	return 0;
}
