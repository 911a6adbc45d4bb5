/*
 * records_gc.c - `flare records gc`: a record directory cleaned as a server
 * start would clean it, then kept within --max-age and --limit (design 2.5
 * recovery and expiry; 2.3 leaf-first eviction and page-only pruning;
 * docs/records-tool.md; records.c DESIGN).
 *
 * DESIGN
 *
 * gc's recovery is the server's own routine (sel_recover, record_recovery.c)
 * run on a sel_index the tool rebuilds, so both keep the same set from one
 * directory.  Retention then uses the index's own removals: expired leaves
 * through the server's expiry walk (sel_index_expire with the rule
 * sel_index_expired and the cutoff sel_expiry_cutoff; without the sweep's
 * 64-leaf limit and its stop at the first fresh leaf, and once more after
 * the limit for parents it left as expired leaves), the size limit with
 * sel_index_evict, and page-only ancestors with their last child through
 * the index's cascade.  The index reports each removal (its remove and
 * drop_row callbacks) into a list of actions, and the files are unlinked
 * or truncated in that order, children first.  The namespace is locked for
 * the whole time, and without a layout a strict majority of its headers
 * carries, gc removes nothing.
 *
 * INVARIANTS
 *   1. A record is unlinked only after every record linking under it went;
 *      a failed unlink keeps every ancestor of the file that stayed.
 *   2. --dry-run removes nothing and reports the same actions.
 */
#include "flare/records_int.h"

/* ---- gc --------------------------------------------------------------------------- */

enum gc_op {
	GC_UNLINK,
	GC_TRUNCATE
};

struct gc_act {
	size_t rec; /* index into the scan's survivors */
	enum gc_op op;
	const char *reason; /* "expired", "limit", "page-only ancestor", ... */
	uint64_t bytes;     /* what the action frees */
};

struct gc {
	sel_scan sc;
	struct gc_act *act;
	size_t n, cap;
	const char *primary; /* reason of the next removal the index reports */
	bool first;
	bool oom;
	uint64_t bytes; /* survivors' bytes not yet removed */
	uint64_t records;
	json_t *recovery; /* the real (or dry) scan's removals */
	struct run *r;
	uint64_t recovered, recovered_bytes;
	bool recovering; /* inside sel_recover: its commits and prunes */
};

static void gc_push(struct gc *g, sel_index *ix, sel_node_id id, enum gc_op op)
{
	const sel_index_node *node = sel_index_cget(ix, id);
	if (g->n == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 64;
		struct gc_act *na = realloc(g->act, cap * sizeof(*na));
		if (!na) {
			g->oom = true;
			return;
		}
		g->act = na;
		g->cap = cap;
	}
	const sel_scan_record *rec = &g->sc.rec[node->loc];
	const char *why = g->recovering ? (op == GC_TRUNCATE ? "interrupted compaction"
							     : "childless page-only")
			  : g->first    ? g->primary
					: "page-only ancestor";
	/* What the file holds when its action runs: a record compacted
	 * earlier (its row dropped) is only its pages by then. */
	uint64_t has = (node->flags & SEL_NODE_HAS_ROW) ? rec->span.row_end : rec->span.row_off;
	uint64_t gone = op == GC_UNLINK ? has : rec->span.row_end - rec->span.row_off;
	g->act[g->n++] = (struct gc_act){.rec = node->loc, .op = op, .reason = why, .bytes = gone};
	g->first = false;
	g->bytes -= gone;
	if (op == GC_UNLINK)
		g->records--;
}

static void gc_remove(void *ctx, sel_index *ix, sel_node_id id) { gc_push(ctx, ix, id, GC_UNLINK); }

/* Recovery inserted survivor i as node id: the tree's bookkeeping. */
static int gc_inserted(void *ctx, sel_index *ix, sel_node_id id, size_t i,
		       const sel_scan_record *rec)
{
	struct gc *g = ctx;
	sel_index_get(ix, id)->loc = i;
	g->bytes += rec->file_bytes;
	g->records++;
	return 0;
}

static void gc_drop_row(void *ctx, sel_index *ix, sel_node_id id)
{
	gc_push(ctx, ix, id, GC_TRUNCATE);
}

static void gc_on_scan(void *ctx, const char *name, enum sel_scan_why why, uint64_t bytes, int err)
{
	struct gc *g = ctx;
	g->recovered++;
	g->recovered_bytes += bytes;
	if (g->r->o->json) {
		json_t *j = json_pack("{s:s, s:s, s:I}", "name", name, "reason",
				      sel_scan_why_name(why), "bytes", (json_int_t)bytes);
		if (err)
			json_object_set_new(j, "error", json_string(strerror(-err)));
		json_array_append_new(g->recovery, j);
	} else {
		char a[32];
		fprintf(g->r->out, "    %-56s %s", name, sel_scan_why_name(why));
		if (bytes)
			fprintf(g->r->out, "  %s", rec_fmt_size(bytes, a, sizeof a));
		if (err)
			fprintf(g->r->out, "  FAILED: %s", strerror(-err));
		fputc('\n', g->r->out);
	}
	if (err) {
		fprintf(g->r->err, "flare records: remove '%s': %s\n", name, strerror(-err));
		g->r->status = 1;
	}
}

/* The index asks before each leaf it may expire: the removal that follows
 * (if the leaf is expired) is the primary one, its cascade the page-only
 * ancestors. */
static bool gc_expiring(void *ctx, const sel_index *ix, sel_node_id id)
{
	struct gc *g = ctx;
	(void)ix;
	(void)id;
	g->primary = "expired";
	g->first = true;
	return true;
}

/* The server's expiry rule and walk (sel_index_expire, design 2.5) without
 * the sweep's bounds (64 leaves, the stop at the first fresh leaf): every
 * leaf last used before cutoff, oldest first, and the parents that leaves,
 * once expired leaves themselves. */
static void gc_expire(struct gc *g, sel_index *ix, uint64_t cutoff)
{
	(void)sel_index_expire(ix, cutoff, UINT32_MAX, true, gc_expiring, g);
}

static int key_cmp(const sel_key *a, const sel_key *b)
{
	if (a->consumed != b->consumed)
		return a->consumed < b->consumed ? -1 : 1;
	return memcmp(a->digest.b, b->digest.b, SEL_DIGEST_BYTES);
}

static int rec_idx_cmp(const void *a, const void *b, void *base)
{
	const sel_scan_record *rec = base;
	return key_cmp(&rec[*(const size_t *)a].d.key, &rec[*(const size_t *)b].d.key);
}

/* For each survivor, the survivor it links under (or -1). */
static int64_t *gc_parents(const sel_scan *sc, uint32_t pt)
{
	size_t n = sc->n;
	size_t *ord = malloc((n ? n : 1) * sizeof *ord);
	int64_t *par = malloc((n ? n : 1) * sizeof *par);
	if (!ord || !par) {
		free(ord);
		free(par);
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		ord[i] = i;
	qsort_r(ord, n, sizeof *ord, rec_idx_cmp, sc->rec);
	for (size_t i = 0; i < n; i++) {
		par[i] = -1;
		if (!sel_record_links_parent(&sc->rec[i].d, pt))
			continue;
		size_t lo = 0, hi = n;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			int c = key_cmp(&sc->rec[ord[mid]].d.key, &sc->rec[i].d.parent);
			if (c == 0) {
				par[i] = (int64_t)ord[mid];
				break;
			}
			if (c < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
	}
	free(ord);
	return par;
}

/* Lock and list the namespace and decide its layout: true to go on.  A
 * namespace without a decided layout, or without records, is reported
 * (nothing is removed) and false returned. */
static bool gc_ready(struct run *r, struct rns *n)
{
	const struct ropts *o = r->o;
	if (eos_dirlock_acquire(&n->lk, n->path) != 0 || rec_ns_list(n) != 0) {
		rec_ns_fail(r, n, NULL);
		return false;
	}
	rec_ns_reference(n);
	if (o->json) {
		json_t *head = rec_json_ns(n);
		json_object_update(n->j, head);
		json_decref(head);
	}
	if (!n->have_ns && n->undecided) {
		/* Deleting by a layout a minority of files carries is what lost
		 * every good record once: refuse instead. */
		char msg[PATH_MAX + 1024];
		snprintf(msg, sizeof msg,
			 "'%s': cannot decide the namespace's layout (%s); nothing "
			 "removed",
			 n->path, n->undecided);
		rec_ns_fail(r, n, msg);
		if (o->json) {
			json_object_set_new(n->j, "recovery", json_array());
			json_object_set_new(n->j, "removed", json_array());
		}
		return false;
	}
	if (n->have_ns)
		return true;
	if (!o->json)
		fprintf(r->out,
			"  no record header names this directory: nothing to do "
			"(%zu record-named files, %zu temporaries left alone)\n",
			n->nf, n->ntmp);
	if (o->json) {
		json_object_set_new(n->j, "recovery", json_array());
		json_object_set_new(n->j, "removed", json_array());
		json_object_set_new(
			n->j, "kept",
			json_pack("{s:I, s:I}", "records", (json_int_t)0, "bytes", (json_int_t)0));
	}
	return false;
}

/* 1-2. The server's startup recovery, by the server's own routine
 * (sel_recover): the scan's removals, then the tree in access order (file
 * mtime, parents first), a compaction a crash interrupted and the pruning
 * of useless page-only records.  0 or an error (reported). */
static int gc_recover(struct run *r, struct rns *n, struct gc *g, sel_index **ix)
{
	const struct ropts *o = r->o;
	char a[32];
	if (o->json)
		g->recovery = json_array();
	else
		fprintf(r->out, "  startup recovery (%s):\n",
			o->dry_run ? "dry run"
				   : "as a server "
				     "start would do it");
	struct sel_index_ops ops = {.drop_row = gc_drop_row, .remove = gc_remove};
	if (sel_index_create(n->ns.layout.sz.page_tokens, &ops, g, ix) != 0)
		return -ENOMEM;
	struct sel_recovery_opts ro = {
		/* No max_file_bytes: --limit is what gc keeps in all, not the
		 * server's disk limit; its eviction below applies it. */
		.scan = {.dry_run = o->dry_run, .threads = 4, .on_remove = gc_on_scan, .ctx = g},
		.now_ns = r->now,
		.inserted = gc_inserted,
		.ctx = g,
	};
	g->recovering = true;
	int rc = sel_recover(n->lk.fd, &n->ns, &ro, *ix, &g->sc);
	if (rc)
		return rc;
	g->recovering = false;
	if (!o->json)
		fprintf(r->out, "    %s %" PRIu64 " file%s (%s)\n",
			o->dry_run ? "would remove" : "removed", g->recovered,
			g->recovered == 1 ? "" : "s",
			rec_fmt_size(g->recovered_bytes, a, sizeof a));
	/* A '.tmp-*' directory is nobody's interrupted write: reported, left
	 * alone, and no reason to fail. */
	json_t *alone = o->json ? json_array() : NULL;
	for (size_t i = 0; i < n->nother; i++) {
		if (!sel_record_is_tmp_name(n->other[i].name))
			continue;
		if (o->json)
			json_array_append_new(alone, json_string(n->other[i].name));
		else
			fprintf(r->out,
				"    left alone: %s (a directory, not a temporary record)\n",
				n->other[i].name);
	}
	if (o->json) {
		json_object_set_new(n->j, "left_alone", alone);
		json_object_set_new(n->j, "recovery", g->recovery);
		g->recovery = NULL;
	}
	return 0;
}

/* 3. Expiry, 4. the limit (least recently written leaves first), and expiry
 * again for parents the limit left as expired leaves. */
static void gc_retain(struct run *r, struct gc *g, sel_index *ix)
{
	const struct ropts *o = r->o;
	uint64_t cutoff = sel_expiry_cutoff(r->now, o->max_age_ns);
	if (o->age)
		gc_expire(g, ix, cutoff);
	bool evicted = false;
	while (o->limit && g->bytes > o->limit_bytes) {
		g->primary = "limit";
		g->first = true;
		if (sel_index_evict(ix, NULL) == 0)
			break;
		evicted = true;
	}
	if (o->age && evicted)
		gc_expire(g, ix, cutoff);
}

/* Carry out action x (unless blocked or a dry run) and report it; returns
 * the bytes it freed.  A failure blocks every record x links under. */
static uint64_t gc_act_one(struct run *r, struct rns *n, struct gc *g, const struct gc_act *x,
			   const int64_t *par, bool *blocked, json_t *removed)
{
	const struct ropts *o = r->o;
	const sel_scan_record *rec = &g->sc.rec[x->rec];
	char name[SEL_RECORD_NAME_MAX], a[32], b[32];
	const char *err = NULL;
	sel_record_name(&rec->d.key, name);
	if (blocked[x->rec]) {
		err = "kept: a record linking under it could not be removed";
	} else if (!o->dry_run) {
		int rc = x->op == GC_UNLINK
				 ? sel_record_unlink(n->lk.fd, name, NULL)
				 : sel_record_truncate(n->lk.fd, name, &rec->span, &rec->id, NULL);
		if (rc)
			err = eos_errmsg();
	}
	if (err) {
		fprintf(r->err, "flare records: %s '%s': %s\n",
			x->op == GC_UNLINK ? "remove" : "compact", name, err);
		r->status = 1;
		for (int64_t p = par[x->rec]; p >= 0; p = par[p])
			blocked[p] = true;
	}
	uint64_t age = rec_age_of(r->now, rec->mtime_ns);
	if (o->json) {
		json_t *j =
			json_pack("{s:s, s:o, s:s, s:s, s:I, s:I}", "name", name, "key",
				  rec_json_key(&rec->d.key), "action",
				  x->op == GC_UNLINK ? "unlink" : "truncate", "reason", x->reason,
				  "bytes", (json_int_t)x->bytes, "age_s", (json_int_t)(age / NS));
		if (err)
			json_object_set_new(j, "error", json_string(err));
		json_array_append_new(removed, j);
	} else {
		fprintf(r->out, "    %-56s %-24s %10s  age %-5s%s%s\n", name, x->reason,
			rec_fmt_size(x->bytes, a, sizeof a), rec_fmt_age(age, b, sizeof b),
			err ? "  FAILED: " : "", err ? err : "");
	}
	return err ? 0 : x->bytes;
}

/* 5. The files, in the index's order: children before parents.  A record
 * whose removal failed keeps every record it links under.  0 or -ENOMEM. */
static int gc_files(struct run *r, struct rns *n, struct gc *g)
{
	const struct ropts *o = r->o;
	char a[32], c[48];
	int64_t *par = gc_parents(&g->sc, n->ns.layout.sz.page_tokens);
	bool *blocked = calloc(g->sc.n ? g->sc.n : 1, sizeof *blocked);
	if (!par || !blocked) {
		free(par);
		free(blocked);
		return -ENOMEM;
	}
	uint64_t freed = 0;
	json_t *removed = o->json ? json_array() : NULL;
	if (!o->json) {
		fprintf(r->out, "  retention (");
		if (o->age)
			fprintf(r->out, "max age %s", o->age_text);
		if (o->limit)
			fprintf(r->out, "%slimit %s", o->age ? ", " : "", o->limit_text);
		fprintf(r->out, "):\n");
	}
	for (size_t i = 0; i < g->n; i++)
		freed += gc_act_one(r, n, g, &g->act[i], par, blocked, removed);
	if (!o->dry_run && (g->n || g->recovered) && eos_fileops()->fsync(n->lk.fd) != 0) {
		fprintf(r->err, "flare records: '%s': fsync of the directory: %s\n", n->path,
			strerror(errno));
		r->status = 1;
	}
	if (o->json) {
		json_object_set_new(n->j, "removed", removed);
		json_object_set_new(n->j, "removed_bytes", rec_json_u64(freed));
		json_object_set_new(n->j, "kept",
				    json_pack("{s:I, s:I}", "records", (json_int_t)g->records,
					      "bytes", (json_int_t)g->bytes));
	} else {
		fprintf(r->out, "    %s %zu record%s (%s)\n",
			o->dry_run ? "would remove" : "removed", g->n, g->n == 1 ? "" : "s",
			rec_fmt_size(freed, a, sizeof a));
		fprintf(r->out, "  kept %" PRIu64 " record%s (%s)\n", g->records,
			g->records == 1 ? "" : "s", rec_fmt_size(g->bytes, c, sizeof c));
	}
	free(par);
	free(blocked);
	return 0;
}

void rec_cmd_gc(struct run *r, struct rns *n)
{
	struct gc g = {.r = r};
	sel_index *ix = NULL;
	if (!gc_ready(r, n))
		return;
	if (gc_recover(r, n, &g, &ix) != 0) {
		rec_ns_fail(r, n, NULL);
	} else {
		gc_retain(r, &g, ix);
		if (g.oom || gc_files(r, n, &g) != 0)
			rec_ns_fail(r, n, "out of memory");
	}
	json_decref(g.recovery);
	sel_index_destroy(ix);
	sel_scan_free(&g.sc);
	free(g.act);
}
