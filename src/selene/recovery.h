/*
 * recovery.h - startup recovery of a record directory into an index: the
 * one routine the disk store's startup and `flare records gc` both run, so
 * a server and the tool can never decide differently what a directory
 * holds (design 2.5, the recovery paragraph; design 2.3, startup pruning).
 *
 * Internal to libselene.
 */
#ifndef SEL_RECOVERY_H
#define SEL_RECOVERY_H

#include "index.h"
#include "record.h"

struct sel_recovery_opts {
	/* The scan: removals (or a dry run), the disk limit as max_file_bytes,
	 * O_DIRECT header reads, reader threads, the on_remove report. */
	struct sel_scan_opts scan;
	/* The present (wall clock, ns): a file's mtime in the future counts as
	 * now when last use is seeded. */
	uint64_t now_ns;
	/* Called once per surviving record, in the scan's order (parents
	 * first), right after it was inserted as node id -- before any commit
	 * or prune can call the index's drop_row or remove on it, so the
	 * caller attaches its storage here.  rec is survivor i of out.  A
	 * negative return stops the recovery with that error.  NULL: none. */
	int (*inserted)(void *ctx, sel_index *ix, sel_node_id id, size_t i,
			const sel_scan_record *rec);
	void *ctx;
};

/* Recover directory dirfd (the caller holds its lock) into ix, an empty
 * index created with the caller's ops:
 *   1. sel_record_scan with o->scan: temporaries, invalid files (header,
 *      name, length, holes, over max_file_bytes), orphans and records whose
 *      parent link check fails, with everything linking under them, and
 *      childless page-only records are removed (reported through
 *      o->scan.on_remove);
 *   2. every survivor is inserted -- linked under its parent when its tail
 *      is the count since it, else as a root -- with its row when its file
 *      holds one, and handed to o->inserted;
 *   3. once every child is in, each is committed: a single child's commit
 *      drops its parent's row (design 2.3), so a compaction a crash
 *      interrupted happens now (ix's drop_row);
 *   4. sel_index_prune removes what is useless (ix's remove);
 *   5. each record's last use is its own file's mtime (no later than
 *      now_ns) and the access order is sorted by the newest time under each
 *      record (sel_index_order_by_use).
 * out receives the scan (survivors and statistics; sel_scan_free).  0, or
 * a negative errno (the directory could not be read, memory ran out, or
 * o->inserted failed) with a message; out is freed on failure. */
int sel_recover(int dirfd, const sel_record_ns *ns, const struct sel_recovery_opts *o,
		sel_index *ix, sel_scan *out);

#endif
