/*
 * record_recovery.c - startup recovery: a record directory back into an
 * index, for the disk store at startup and for `flare records gc` alike
 * (design 2.5, "The disk store's startup scan reads each file's header ...",
 * and expiry's "recovery uses file mtime"; design 2.3, "Startup prunes
 * childless page-only records ...").
 *
 * DESIGN
 *
 * The server and the tool used to rebuild their trees each in its own way
 * (the tool inserted without committing, so it never truncated the row a
 * crash left on a single-child parent; it took its layout from the first
 * header that decoded), and a damaged directory could lose every good
 * record to one and keep them with the other.  Now both call sel_recover,
 * which does the whole sequence -- scan, insert, commit, prune, seed last
 * use, sort -- on an index whose callbacks belong to the caller: the store
 * turns drop_row and remove into truncate and unlink jobs, the tool into
 * the actions it reports (and performs unless it is a dry run).  What is
 * kept, compacted and removed is therefore decided by one piece of code
 * given the same directory and the same namespace; only what each does
 * afterwards (the store's limit, the tool's --max-age and --limit) is its
 * own.
 *
 * INVARIANTS
 *   1. Every survivor the index holds afterwards was inserted with its
 *      parent present (the scan returns parents first) and committed.
 *   2. o->inserted has run for a node before the index can call drop_row or
 *      remove on it.
 */
#include "recovery.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sel_recover(int dirfd, const sel_record_ns *ns, const struct sel_recovery_opts *o,
		sel_index *ix, sel_scan *out)
{
	uint32_t pt = ns->layout.sz.page_tokens;
	int rc = sel_record_scan(dirfd, ns, &o->scan, out);
	if (rc)
		return rc;
	sel_node_id *ids = malloc((out->n ? out->n : 1) * sizeof(*ids));
	if (!ids) {
		rc = eos_fail(-ENOMEM, "recovery: out of memory for %zu records", out->n);
		goto fail;
	}
	size_t n = 0;
	for (size_t i = 0; i < out->n; i++) {
		const sel_scan_record *x = &out->rec[i];
		bool links = sel_record_links_parent(&x->d, pt);
		sel_node_id id;
		rc = sel_index_insert(ix, &x->d.key, links ? &x->d.parent : NULL, &x->d.bucket,
				      x->d.tail, x->has_row, &id);
		if (rc == -ENOMEM)
			goto fail;
		if (rc)
			continue; /* cannot happen after the scan: the file is left alone */
		if (o->inserted && (rc = o->inserted(o->ctx, ix, id, i, x)) < 0)
			goto fail;
		ids[n++] = id;
	}
	/* Committed once every child is in: the row-drop rule sees the final
	 * child counts (a truncation a crash interrupted happens now). */
	for (size_t i = 0; i < n; i++)
		if (sel_index_cget(ix, ids[i]))
			sel_index_commit(ix, ids[i]);
	sel_index_prune(ix);
	/* Last use from the files' mtimes (a parent is as recent as its newest
	 * descendant once sorted); a future mtime counts as now. */
	for (size_t i = 0; i < out->n; i++) {
		sel_node_id id = sel_index_find(ix, &out->rec[i].d.key);
		uint64_t m = out->rec[i].mtime_ns;
		if (id != SEL_NODE_NONE)
			sel_index_seed_used(ix, id, m < o->now_ns ? m : o->now_ns);
	}
	if ((rc = sel_index_order_by_use(ix)) != 0)
		goto fail;
	free(ids);
	return 0;
fail:
	free(ids);
	sel_scan_free(out);
	return eos_fail(rc, "recovery: %s", eos_errmsg());
}
