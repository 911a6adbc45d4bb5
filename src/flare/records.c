/*
 * records.c - `flare records`: ls, verify, stat and gc on a prefix-cache
 * record directory without a server (design 2.5, the record-file,
 * directory-lock, recovery-scan and expiry paragraphs; design 2.3,
 * leaf-first eviction and page-only pruning; docs/records-tool.md).
 *
 * DESIGN
 *
 * The tool decides nothing the server would decide differently.  Every
 * judgement comes from the code the server runs on the same files:
 *   - a file's validity from sel_record_check_file (record_verify.c), which
 *     calls the header decoder, the length rule and the page and row
 *     checksum helpers the disk thread uses on every read;
 *   - the tree (orphans, their descendants, childless page-only records)
 *     from sel_record_scan, run as a dry run and listening to what it
 *     would remove -- or, for gc, run for real, as the server does at
 *     startup;
 *   - gc's retention from a sel_index rebuilt from the scan's survivors,
 *     with last use seeded from file mtime and the access order sorted by
 *     it as the disk store does at startup, and the index's own leaf-first
 *     removal: expired leaves go through the server's expiry walk
 *     (sel_index_expire, the rule sel_index_expired and the cutoff
 *     sel_expiry_cutoff; without the sweep's 64-leaf limit and its stop at
 *     the first fresh leaf, and once more after the limit for parents it
 *     left as expired leaves), the size limit
 *     evicts with sel_index_evict, and page-only ancestors leave with
 *     their last child through the index's cascade.  The files are unlinked in
 *     the order the index removed the nodes, children first.
 * Only the namespace itself is the tool's: a server knows its geometry and
 * identity, the tool reads them from the headers that name the directory
 * -- the layout a strict majority of them carries, since no header can
 * prove its rank table alone -- and judges every file against it; without
 * a majority gc removes nothing.  gc's recovery is the server's own
 * routine (sel_recover), so both keep the same set from one directory.
 *
 * verify and gc lock each namespace directory with eos_dirlock, the
 * server's lock, for the whole time they work on it, so they and a server
 * never share a namespace; a locked namespace is reported with the
 * holder's pid (the eos message) and skipped, and the command exits 1.
 * ls and stat only read: a namespace a server owns (the lock is busy) is
 * read without the lock, and the output says that the listing may change
 * while it is read (files come and go as the server writes and evicts).
 *
 * Output is built once per namespace: the text report as it goes, or a
 * jansson document printed whole at the end (--json), so a script always
 * reads one well-formed JSON value, failures included ("error" members).
 *
 * INVARIANTS
 *   1. Nothing is removed except by gc, and gc never unlinks a record while
 *      a record that links under it stays: removals follow the index's
 *      child-first order, and a failed unlink keeps every ancestor of the
 *      file that stayed.
 *   2. Every namespace directory is changed only while its lock is held;
 *      one a server holds is only read (ls, stat).
 *   3. The exit status is 2 only for bad arguments, before any directory is
 *      touched.
 */
#include "flare/records_int.h"

static const char *const cmd_names[] = {"ls", "verify", "stat", "gc"};
void flare_records_help(FILE *f)
{
	fprintf(f,
		"usage: flare records ls DIR [--json]\n"
		"       flare records verify DIR [--json]\n"
		"       flare records stat DIR [--json]\n"
		"       flare records gc DIR [--max-age DURATION] [--limit SIZE] [--dry-run] [--json]\n"
		"\n"
		"Work on a prefix-cache record directory without a server.  DIR is a base\n"
		"directory (--prefix-cache-disk: every namespace <16 hex>-<32 hex> under it)\n"
		"or one namespace directory.  verify and gc lock each namespace as the server\n"
		"locks it, so they refuse a namespace a running server owns, and a server\n"
		"refuses to start while they work on it.  ls and stat only read: a namespace\n"
		"a server owns is read without its lock and marked as one that may change.\n"
		"\n"
		"Commands:\n"
		"  ls      namespaces (identity, fingerprint, ranks and planes), records (key,\n"
		"          parent, tail pages, size, row or page-only, age, chain depth),\n"
		"          temporaries and other files\n"
		"  verify  read every record whole: header, header checksum, name against key,\n"
		"          length against layout, each page record's and the row's checksum;\n"
		"          also orphans, childless page-only records and temporaries.  Exit 1\n"
		"          naming each bad file with the reason\n"
		"  stat    totals per namespace, the largest and deepest chains, an age histogram\n"
		"  gc      the server's startup recovery (temporaries, invalid headers, orphans,\n"
		"          childless page-only records), then drop leaves whose file is older\n"
		"          than --max-age and evict the least recently written leaves until each\n"
		"          namespace fits --limit; page-only ancestors go with their last child,\n"
		"          never before it\n"
		"\n"
		"Options:\n"
		"  --json                   one JSON document on stdout (docs/records-tool.md)\n"
		"  --max-age DURATION|off   gc: drop leaves unmodified for longer (90s, 2h, 7d)\n"
		"  --limit SIZE             gc: bytes each namespace may keep (10GiB, 0 = none)\n"
		"  --dry-run                gc: report what would be removed, remove nothing\n"
		"  --help, -h               print this help\n"
		"\n"
		"Exit status: 0 done; 1 a namespace could not be locked or read, a removal\n"
		"failed, or verify found a problem; 2 bad arguments.\n");
}

/* A gc value through the option table of `flare run`, so --max-age and
 * --limit read and complain exactly as --prefix-cache-max-age and
 * --prefix-cache-disk-limit do. */
static int gc_value(enum flare_opt id, const char *flag, const char *v, struct flare_settings *s,
		    char *err, size_t len)
{
	char why[768];
	if (flare_settings_set(s, flare_option_get(id), v, FLARE_V_TEXT, why, sizeof why))
		return flare_bad(err, len, "%s: %s", flag, why);
	return 0;
}

static int parse_args(int argc, char **argv, struct ropts *o, char *err, size_t len)
{
	memset(o, 0, sizeof *o);
	if (argc < 2)
		return flare_bad(err, len, "missing command (ls, verify, stat or gc)");
	const char *c = argv[1];
	if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help"))
		return R_HELP;
	size_t k;
	for (k = 0; k < sizeof cmd_names / sizeof cmd_names[0]; k++)
		if (!strcmp(c, cmd_names[k]))
			break;
	if (k == sizeof cmd_names / sizeof cmd_names[0])
		return flare_bad(err, len, "unknown command '%s' (ls, verify, stat or gc)", c);
	o->cmd = (enum rcmd)k;
	struct flare_settings s;
	flare_settings_defaults(&s);
	bool flags_done = false;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		if (flags_done || a[0] != '-' || !strcmp(a, "-")) {
			if (o->dir)
				return flare_bad(err, len,
						 "unexpected argument '%s' (DIR was already given "
						 "as '%s')",
						 a, o->dir);
			if (!*a)
				return flare_bad(err, len, "DIR: '' is not a directory name");
			o->dir = a;
			continue;
		}
		if (!strcmp(a, "--")) {
			flags_done = true;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help"))
			return R_HELP;
		const char *eq = strchr(a, '=');
		size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
		char flag[64];
		snprintf(flag, sizeof flag, "%.*s", (int)(nlen < 60 ? nlen : 60), a);
		bool takes = !strcmp(flag, "--max-age") || !strcmp(flag, "--limit");
		bool plain = !strcmp(flag, "--json") || !strcmp(flag, "--dry-run");
		if (!takes && !plain)
			return flare_bad(err, len,
					 "unknown flag '%s' (flare records --help lists them)",
					 flag);
		if (plain && eq)
			return flare_bad(err, len, "%s: takes no value (got '%s')", flag, eq + 1);
		if (strcmp(flag, "--json") && o->cmd != R_GC)
			return flare_bad(err, len, "%s: only gc takes it, not %s", flag,
					 cmd_names[o->cmd]);
		if (!strcmp(flag, "--json")) {
			o->json = true;
		} else if (!strcmp(flag, "--dry-run")) {
			o->dry_run = true;
		} else {
			const char *v;
			if (eq)
				v = eq + 1;
			else if (i + 1 < argc)
				v = argv[++i];
			else
				return flare_bad(err, len, "%s: missing value (%s %s)", flag, flag,
						 !strcmp(flag, "--limit") ? "SIZE" : "DURATION");
			bool is_age = !strcmp(flag, "--max-age");
			int rc = gc_value(is_age ? FLARE_OPT_MAX_AGE : FLARE_OPT_DISK_LIMIT, flag,
					  v, &s, err, len);
			if (rc)
				return rc;
			if (is_age) {
				o->age = s.max_age_ns != 0;
				o->max_age_ns = s.max_age_ns;
				rec_copy_str(o->age_text, sizeof o->age_text, v);
			} else {
				o->limit = true;
				o->limit_bytes = s.disk_limit;
				rec_copy_str(o->limit_text, sizeof o->limit_text, v);
			}
		}
	}
	if (!o->dir)
		return flare_bad(err, len, "%s: missing DIR (a record base or namespace directory)",
				 cmd_names[o->cmd]);
	if (o->cmd == R_GC && !o->age && !o->limit)
		return flare_bad(err, len,
				 "gc: nothing to apply: give --max-age DURATION, --limit SIZE "
				 "or both");
	return 0;
}

/* ---- Small formatting helpers ------------------------------------------------ */

const char *rec_fmt_size(uint64_t b, char *buf, size_t len) { return eos_format_size(b, buf, len); }

/* "42s", "17m", "5h", "3d" (rounded down). */
const char *rec_fmt_age(uint64_t ns, char *buf, size_t len)
{
	uint64_t s = ns / NS;
	if (s < 60)
		snprintf(buf, len, "%" PRIu64 "s", s);
	else if (s < 3600)
		snprintf(buf, len, "%" PRIu64 "m", s / 60);
	else if (s < 86400)
		snprintf(buf, len, "%" PRIu64 "h", s / 3600);
	else
		snprintf(buf, len, "%" PRIu64 "d", s / 86400);
	return buf;
}

/* "<consumed>:<first 8 hex of the digest>" */
static const char *fmt_key(const sel_key *k, char *buf, size_t len)
{
	char hex[2 * SEL_DIGEST_BYTES + 1];
	sel_hex(k->digest.b, SEL_DIGEST_BYTES, hex);
	snprintf(buf, len, "%" PRIu64 ":%.8s", k->consumed, hex);
	return buf;
}

json_t *rec_json_key(const sel_key *k)
{
	char hex[2 * SEL_DIGEST_BYTES + 1];
	sel_hex(k->digest.b, SEL_DIGEST_BYTES, hex);
	return json_pack("{s:I, s:s}", "consumed", (json_int_t)k->consumed, "digest", hex);
}


/* ---- JSON and text pieces shared by the commands ------------------------------- */

static const char *state_of(const struct rfile *f)
{
	switch (f->kind) {
	case SEL_CHECK_UNREADABLE: return "unreadable";
	case SEL_CHECK_NOT_FILE: return "not a file";
	case SEL_CHECK_PAGE:
	case SEL_CHECK_ROW: return "corrupt";
	case SEL_CHECK_OK: break;
	default: return "invalid";
	}
	switch (f->fate) {
	case SEL_SCAN_ORPHAN: return "orphan";
	case SEL_SCAN_DESCENDANT: return "descendant";
	case SEL_SCAN_PRUNED: return "prunable";
	default: return "ok";
	}
}

static json_t *json_layout(const sel_record_layout *l)
{
	json_t *planes = json_array(), *rows = json_array(), *units = json_array();
	for (uint32_t r = 0; r < l->ranks; r++) {
		json_array_append_new(planes, rec_json_u64(l->n_planes[r]));
		json_array_append_new(rows, rec_json_u64(l->row_bytes[r]));
		json_t *u = json_array();
		for (uint32_t p = 0; p < l->n_planes[r]; p++)
			json_array_append_new(u, rec_json_u64(l->unit[r][p]));
		json_array_append_new(units, u);
	}
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "ranks", (json_int_t)l->ranks,
			 "page_tokens", (json_int_t)l->sz.page_tokens, "header_bytes",
			 (json_int_t)l->sz.header_bytes, "page_record_bytes",
			 (json_int_t)l->sz.page_record, "row_segment_bytes",
			 (json_int_t)l->sz.row_segment, "planes", planes, "row_bytes", rows,
			 "plane_bytes", units);
}

/* The namespace's JSON object with what every command reports. */
json_t *rec_json_ns(const struct rns *n)
{
	json_t *j = json_pack("{s:s, s:s}", "name", n->name, "dir", n->path);
	char idp[SEL_RECORD_ID_PREFIX_HEX + 1];
	memcpy(idp, n->name, SEL_RECORD_ID_PREFIX_HEX);
	idp[SEL_RECORD_ID_PREFIX_HEX] = '\0';
	json_object_set_new(j, "identity_prefix", json_string(idp));
	json_object_set_new(j, "fingerprint", json_string(n->name + SEL_RECORD_ID_PREFIX_HEX + 1));
	json_object_set_new(j, "layout", n->have_ns ? json_layout(&n->ns.layout) : json_null());
	json_object_set_new(j, "layout_from", n->have_ns ? json_string(n->ref) : json_null());
	if (n->undecided)
		json_object_set_new(j, "layout_undecided", json_string(n->undecided));
	return j;
}

static void text_ns_head(struct run *r, const struct rns *n)
{
	fprintf(r->out, "namespace %s  %s\n", n->name, n->path);
}

static void text_layout(struct run *r, const struct rns *n)
{
	if (!n->have_ns) {
		if (n->undecided)
			fprintf(r->out, "  layout: undecided (%s)\n", n->undecided);
		else
			fprintf(r->out,
				"  layout: unknown (no record header names this directory)\n");
		return;
	}
	const sel_record_layout *l = &n->ns.layout;
	char a[32], b[32];
	fprintf(r->out, "  identity %.16s..., fingerprint %s (from %s, as %zu of %zu headers)\n",
		n->name, n->name + SEL_RECORD_ID_PREFIX_HEX + 1, n->ref, n->layout_votes,
		n->layout_files);
	fprintf(r->out, "  %" PRIu32 " rank%s, %" PRIu32 " tokens per page, planes ", l->ranks,
		l->ranks == 1 ? "" : "s", l->sz.page_tokens);
	for (uint32_t k = 0; k < l->ranks && k < 8; k++)
		fprintf(r->out, "%s%" PRIu32, k ? "+" : "", l->n_planes[k]);
	fprintf(r->out, "%s, row bytes ", l->ranks > 8 ? "+..." : "");
	for (uint32_t k = 0; k < l->ranks && k < 8; k++)
		fprintf(r->out, "%s%" PRIu64, k ? "+" : "", l->row_bytes[k]);
	fprintf(r->out, "%s; page record %s, header %s\n", l->ranks > 8 ? "+..." : "",
		rec_fmt_size(l->sz.page_record, a, sizeof a),
		rec_fmt_size(l->sz.header_bytes, b, sizeof b));
}

/* ---- ls --------------------------------------------------------------------------- */

static json_t *json_file(const struct run *r, const struct rfile *f)
{
	json_t *j = json_pack("{s:s, s:o}", "name", f->name, "key", rec_json_key(&f->key));
	json_object_set_new(j, "state", json_string(state_of(f)));
	if (f->kind != SEL_CHECK_OK) {
		json_object_set_new(j, "kind", json_string(sel_check_kind_name(f->kind)));
		json_object_set_new(j, "reason", json_string(f->why ? f->why : ""));
	} else if (f->fate) {
		json_object_set_new(j, "kind", json_string(sel_scan_why_name(f->fate)));
	}
	json_object_set_new(j, "bytes", rec_json_u64(f->size));
	json_object_set_new(j, "mtime_ns", rec_json_u64(f->mtime_ns));
	json_object_set_new(j, "age_s", rec_json_u64(rec_age_of(r->now, f->mtime_ns) / NS));
	if (!f->decoded)
		return j;
	const sel_record_header *h = &f->h;
	json_object_set_new(j, "parent",
			    sel_key_is_none(&h->d.parent) ? json_null()
							  : rec_json_key(&h->d.parent));
	bool links = sel_record_links_parent(&h->d, h->page_tokens);
	json_object_set_new(j, "links_parent", json_boolean(links));
	json_object_set_new(j, "parent_present", json_boolean(links && f->parent >= 0));
	json_object_set_new(j, "tail_pages", rec_json_u64(h->d.tail));
	json_object_set_new(j, "row", json_boolean(f->has_row));
	json_object_set_new(j, "replicated_pages",
			    json_boolean(h->d.flags & SEL_RECORD_PAGES_REPLICATED));
	json_object_set_new(j, "replicated_row",
			    json_boolean(h->d.flags & SEL_RECORD_ROW_REPLICATED));
	json_object_set_new(j, "version", rec_json_u64(h->version));
	json_object_set_new(j, "created_ns", rec_json_u64(h->created_ns));
	json_object_set_new(j, "depth", f->depth ? rec_json_u64(f->depth) : json_null());
	return j;
}

static json_t *json_others(const struct run *r, const struct rother *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(
			a, json_pack("{s:s, s:I, s:I}", "name", v[i].name, "bytes",
				     (json_int_t)v[i].size, "age_s",
				     (json_int_t)(rec_age_of(r->now, v[i].mtime_ns) / NS)));
	return a;
}

static void cmd_ls(struct run *r, struct rns *n)
{
	uint64_t bytes = 0;
	for (size_t i = 0; i < n->nf; i++)
		bytes += n->f[i].size;
	if (r->o->json) {
		json_t *a = json_array();
		for (size_t i = 0; i < n->nf; i++)
			json_array_append_new(a, json_file(r, &n->f[i]));
		json_object_set_new(n->j, "records", a);
		json_object_set_new(n->j, "temporaries", json_others(r, n->tmp, n->ntmp));
		json_object_set_new(n->j, "other", json_others(r, n->other, n->nother));
		rec_inputs_ls(r, n);
		return;
	}
	char a[32], b[32], c[32], d[32];
	text_layout(r, n);
	fprintf(r->out, "  %zu record%s (%s), %zu temporar%s, %zu other file%s\n", n->nf,
		n->nf == 1 ? "" : "s", rec_fmt_size(bytes, a, sizeof a), n->ntmp,
		n->ntmp == 1 ? "y" : "ies", n->nother, n->nother == 1 ? "" : "s");
	if (n->nf) {
		fprintf(r->out, "  %-26s %-26s %5s %10s %-5s %5s %5s  %s\n", "KEY", "PARENT",
			"TAIL", "SIZE", "ROW", "AGE", "DEPTH", "STATE");
		for (size_t i = 0; i < n->nf; i++) {
			const struct rfile *f = &n->f[i];
			char kt[48], pt[48] = "-", tail[16] = "?", depth[16] = "-";
			fmt_key(&f->key, kt, sizeof kt);
			const char *row = "?";
			if (f->decoded) {
				if (!sel_key_is_none(&f->h.d.parent)) {
					fmt_key(&f->h.d.parent, pt, sizeof pt);
					bool links =
						sel_record_links_parent(&f->h.d, f->h.page_tokens);
					if (!links)
						strncat(pt, " (full)", sizeof pt - strlen(pt) - 1);
					else if (rec_header_valid(f) && f->parent < 0)
						strncat(pt, " (absent)",
							sizeof pt - strlen(pt) - 1);
				}
				snprintf(tail, sizeof tail, "%" PRIu32, f->h.d.tail);
				if (rec_header_valid(f))
					row = f->has_row ? "row" : "pages";
			}
			if (f->depth)
				snprintf(depth, sizeof depth, "%" PRIu32, f->depth);
			fprintf(r->out, "  %-26s %-26s %5s %10s %-5s %5s %5s  %s", kt, pt, tail,
				rec_fmt_size(f->size, b, sizeof b), row,
				rec_fmt_age(rec_age_of(r->now, f->mtime_ns), c, sizeof c), depth,
				state_of(f));
			if (f->kind != SEL_CHECK_OK)
				fprintf(r->out, ": %s: %s", sel_check_kind_name(f->kind), f->why);
			fputc('\n', r->out);
		}
	}
	for (size_t i = 0; i < n->ntmp; i++)
		fprintf(r->out, "  temporary %s  %s  %s\n", n->tmp[i].name,
			rec_fmt_size(n->tmp[i].size, b, sizeof b),
			rec_fmt_age(rec_age_of(r->now, n->tmp[i].mtime_ns), d, sizeof d));
	for (size_t i = 0; i < n->nother; i++)
		if (!rec_is_input_name(n->other[i].name))
			fprintf(r->out, "  other     %s  %s (not a record name; left alone)\n",
				n->other[i].name, rec_fmt_size(n->other[i].size, b, sizeof b));
	rec_inputs_ls(r, n);
}

/* ---- verify ----------------------------------------------------------------------- */

/* Report one problem: a line, or an entry of arr (--json). */
static void add_problem(struct run *r, json_t *arr, const char *file, const char *kind,
			const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void add_problem(struct run *r, json_t *arr, const char *file, const char *kind,
			const char *fmt, ...)
{
	char reason[EOS_ERRMSG_MAX + 256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof reason, fmt, ap);
	va_end(ap);
	r->problems++;
	if (r->status < 1)
		r->status = 1;
	if (r->o->json)
		json_array_append_new(arr, json_pack("{s:s, s:s, s:s}", "file", file, "kind", kind,
						     "reason", reason));
	else
		fprintf(r->out, "  BAD %s: %s: %s\n", file, kind, reason);
}

/* A bad .input file (records_input.c). */
static void input_problem(struct run *r, json_t *arr, const char *file, const char *kind,
			  const char *reason)
{
	add_problem(r, arr, file, kind,
		    "%s; the server's disk tier removes it and rebuilds the "
		    "input from the next request that sends it",
		    reason);
}

static void cmd_verify(struct run *r, struct rns *n)
{
	json_t *arr = r->o->json ? json_array() : NULL;
	uint64_t before = r->problems, records = 0;
	char a[32];
	for (size_t i = 0; i < n->nf; i++)
		records += n->f[i].kind != SEL_CHECK_NOT_FILE;
	/* Entries named like records that are not regular files: the server
	 * never opens them (nor does this tool), but they are not records. */
	if (n->undecided)
		add_problem(r, arr, n->name, "layout",
			    "undecided: %s; every record is judged on "
			    "its own and gc removes nothing here",
			    n->undecided);
	if (!r->o->json) {
		if (!n->have_ns && n->nf && !n->undecided)
			fprintf(r->out, "  no record header names this directory: every record is "
					"judged on its own\n");
		fprintf(r->out, "  %" PRIu64 " record%s checked, %s read\n", records,
			records == 1 ? "" : "s", rec_fmt_size(n->bytes_read, a, sizeof a));
	}
	for (size_t i = 0; i < n->nf; i++) {
		const struct rfile *f = &n->f[i];
		if (f->kind == SEL_CHECK_NOT_FILE) {
			add_problem(r, arr, f->name, sel_check_kind_name(f->kind),
				    "%s; the server "
				    "ignores it",
				    f->why);
			continue;
		}
		if (f->kind != SEL_CHECK_OK)
			add_problem(r, arr, f->name, sel_check_kind_name(f->kind), "%s", f->why);
		/* The scan's header verdicts repeat what the check found; its tree
		 * verdicts are new. */
		if (f->fate == SEL_SCAN_ORPHAN) {
			char pn[SEL_RECORD_NAME_MAX];
			sel_record_name(&f->h.d.parent, pn);
			add_problem(r, arr, f->name, "orphan",
				    "it links under %s, which is %s; the "
				    "next server start removes it",
				    pn, rec_find_file(n, pn) ? "not a valid record" : "absent");
		} else if (f->fate == SEL_SCAN_DESCENDANT) {
			char pn[SEL_RECORD_NAME_MAX];
			sel_record_name(&f->h.d.parent, pn);
			add_problem(
				r, arr, f->name, "orphan",
				"it links under %s, which the next "
				"server start removes (an orphan, or a bad parent link); it goes "
				"too",
				pn);
		} else if (f->fate == SEL_SCAN_LINK) {
			char pn[SEL_RECORD_NAME_MAX];
			sel_record_name(&f->h.d.parent, pn);
			add_problem(
				r, arr, f->name, "parent link",
				"it links under %s, whose bucket "
				"is not the one it was written under (a parent key rewritten to "
				"another record's); the next server start removes it",
				pn);
		} else if (f->fate == SEL_SCAN_PRUNED) {
			add_problem(r, arr, f->name, "childless page-only",
				    "no row and no record "
				    "links under it; the next server start removes it");
		} else if (f->fate && f->kind == SEL_CHECK_OK) {
			add_problem(r, arr, f->name, sel_scan_why_name(f->fate),
				    "the startup scan "
				    "removes it");
		}
	}
	for (size_t i = 0; i < n->ntmp; i++)
		add_problem(r, arr, n->tmp[i].name, "temporary",
			    "left by an interrupted write; "
			    "the next server start removes it");
	size_t inputs = rec_inputs_verify(r, n, arr, input_problem);
	if (!r->o->json && inputs)
		fprintf(r->out, "  %zu input record%s checked\n", inputs, inputs == 1 ? "" : "s");
	if (r->o->json)
		json_object_set_new(n->j, "inputs_checked", rec_json_u64(inputs));
	if (r->o->json) {
		json_object_set_new(n->j, "checked", rec_json_u64(records));
		json_object_set_new(n->j, "bytes_read", rec_json_u64(n->bytes_read));
		json_object_set_new(n->j, "ok", json_boolean(r->problems == before));
		json_object_set_new(n->j, "problems", arr);
	} else if (r->problems == before) {
		fprintf(r->out, "  ok\n");
	}
}

/* ---- stat ------------------------------------------------------------------------- */

struct chain {
	size_t leaf;
	uint32_t depth;
	uint64_t bytes;
};

static int chain_by_bytes(const void *a, const void *b)
{
	const struct chain *x = a, *y = b;
	if (x->bytes != y->bytes)
		return x->bytes > y->bytes ? -1 : 1;
	if (x->depth != y->depth)
		return x->depth > y->depth ? -1 : 1;
	return x->leaf < y->leaf ? -1 : x->leaf > y->leaf;
}

static int chain_by_depth(const void *a, const void *b)
{
	const struct chain *x = a, *y = b;
	if (x->depth != y->depth)
		return x->depth > y->depth ? -1 : 1;
	return chain_by_bytes(a, b);
}

static const struct {
	const char *name;
	uint64_t below_s; /* 0: no bound */
} age_buckets[] = {
	{"<1m", 60},    {"<10m", 600},         {"<1h", 3600},
	{"<1d", 86400}, {"<1w", 7 * 86400ull}, {"older", 0},
};
#define N_AGE (sizeof age_buckets / sizeof age_buckets[0])

static json_t *json_chains(struct rns *n, const struct chain *c, size_t k)
{
	json_t *a = json_array();
	for (size_t i = 0; i < k; i++) {
		const struct rfile *leaf = &n->f[c[i].leaf], *root = leaf;
		while (root->parent >= 0)
			root = &n->f[root->parent];
		json_array_append_new(
			a, json_pack("{s:s, s:s, s:o, s:I, s:I}", "leaf", leaf->name, "root",
				     root->name, "key", rec_json_key(&leaf->key), "depth",
				     (json_int_t)c[i].depth, "bytes", (json_int_t)c[i].bytes));
	}
	return a;
}

static void text_chains(struct run *r, struct rns *n, const char *title, const struct chain *c,
			size_t k)
{
	char a[48], b[32];
	fprintf(r->out, "  %s:\n", title);
	for (size_t i = 0; i < k; i++)
		fprintf(r->out, "    %-26s depth %4" PRIu32 "  %10s  %s\n",
			fmt_key(&n->f[c[i].leaf].key, a, sizeof a), c[i].depth,
			rec_fmt_size(c[i].bytes, b, sizeof b), n->f[c[i].leaf].name);
}

static void cmd_stat(struct run *r, struct rns *n)
{
	uint64_t records = 0, bytes = 0, with_row = 0, page_only = 0, invalid = 0,
		 invalid_bytes = 0;
	uint64_t orphans = 0, prunable = 0, tmp_bytes = 0;
	uint64_t age_n[N_AGE] = {0}, age_b[N_AGE] = {0};
	size_t nleaves = 0;
	struct chain *ch = calloc(n->nf ? n->nf : 1, sizeof *ch);
	if (!ch) {
		rec_ns_fail(r, n, "out of memory");
		return;
	}
	for (size_t i = 0; i < n->nf; i++) {
		const struct rfile *f = &n->f[i];
		if (!rec_header_valid(f)) {
			invalid += f->kind != SEL_CHECK_NOT_FILE;
			invalid_bytes += f->size;
			continue;
		}
		records++;
		bytes += f->size;
		with_row += f->has_row;
		page_only += !f->has_row;
		orphans += f->fate == SEL_SCAN_ORPHAN || f->fate == SEL_SCAN_DESCENDANT;
		prunable += f->fate == SEL_SCAN_PRUNED;
		uint64_t age_s = rec_age_of(r->now, f->mtime_ns) / NS;
		size_t b = 0;
		while (age_buckets[b].below_s && age_s >= age_buckets[b].below_s)
			b++;
		age_n[b]++;
		age_b[b] += f->size;
		if (f->children == 0) {
			struct chain *c = &ch[nleaves++];
			c->leaf = i;
			c->depth = f->depth;
			for (const struct rfile *x = f;; x = &n->f[x->parent]) {
				c->bytes += x->size;
				if (x->parent < 0)
					break;
			}
		}
	}
	for (size_t i = 0; i < n->ntmp; i++)
		tmp_bytes += n->tmp[i].size;
	size_t k = nleaves < TOP_CHAINS ? nleaves : TOP_CHAINS;
	char a[32], b[32], c[32];
	if (r->o->json) {
		json_object_set_new(
			n->j, "totals",
			json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
				  "records", (json_int_t)records, "bytes", (json_int_t)bytes,
				  "with_row", (json_int_t)with_row, "page_only",
				  (json_int_t)page_only, "orphans", (json_int_t)orphans, "prunable",
				  (json_int_t)prunable, "invalid", (json_int_t)invalid,
				  "invalid_bytes", (json_int_t)invalid_bytes, "temporaries",
				  (json_int_t)n->ntmp, "temporary_bytes", (json_int_t)tmp_bytes,
				  "other", (json_int_t)n->nother));
		qsort(ch, nleaves, sizeof *ch, chain_by_bytes);
		json_object_set_new(n->j, "largest_chains", json_chains(n, ch, k));
		qsort(ch, nleaves, sizeof *ch, chain_by_depth);
		json_object_set_new(n->j, "deepest_chains", json_chains(n, ch, k));
		json_t *h = json_array();
		for (size_t i = 0; i < N_AGE; i++)
			json_array_append_new(h, json_pack("{s:s, s:I, s:I}", "age",
							   age_buckets[i].name, "records",
							   (json_int_t)age_n[i], "bytes",
							   (json_int_t)age_b[i]));
		json_object_set_new(n->j, "age_histogram", h);
	} else {
		text_layout(r, n);
		fprintf(r->out,
			"  records %" PRIu64 " (%s): %" PRIu64 " with row, %" PRIu64
			" page-only; %" PRIu64 " orphaned, %" PRIu64 " prunable\n",
			records, rec_fmt_size(bytes, a, sizeof a), with_row, page_only, orphans,
			prunable);
		fprintf(r->out,
			"  invalid %" PRIu64 " (%s), temporaries %zu (%s), other files %zu\n",
			invalid, rec_fmt_size(invalid_bytes, b, sizeof b), n->ntmp,
			rec_fmt_size(tmp_bytes, c, sizeof c), n->nother);
		if (k) {
			qsort(ch, nleaves, sizeof *ch, chain_by_bytes);
			text_chains(r, n, "largest chains (leaf, depth, bytes)", ch, k);
			qsort(ch, nleaves, sizeof *ch, chain_by_depth);
			text_chains(r, n, "deepest chains", ch, k);
		}
		fprintf(r->out, "  age (file mtime):\n");
		for (size_t i = 0; i < N_AGE; i++)
			fprintf(r->out, "    %-6s %8" PRIu64 "  %s\n", age_buckets[i].name,
				age_n[i], rec_fmt_size(age_b[i], a, sizeof a));
	}
	free(ch);
}

/* ---- Namespaces under DIR ------------------------------------------------------------- */

static bool is_ns_name(const char *s)
{
	if (strlen(s) != 2 * SEL_FINGERPRINT_BYTES + SEL_RECORD_ID_PREFIX_HEX + 1 ||
	    s[SEL_RECORD_ID_PREFIX_HEX] != '-')
		return false;
	for (const char *p = s; *p; p++)
		if (p - s != SEL_RECORD_ID_PREFIX_HEX &&
		    !((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The namespace directories DIR means: itself when its name is one, else
 * every such subdirectory, sorted.  0, or 1 with a message on err. */
static int find_namespaces(const char *dir, char ***out, size_t *n_out, bool *single, char *err,
			   size_t errlen)
{
	char path[PATH_MAX];
	struct stat st;
	*out = NULL;
	*n_out = 0;
	if (strlen(dir) >= sizeof path) {
		snprintf(err, errlen, "'%.64s...': path too long", dir);
		return 1;
	}
	rec_copy_str(path, sizeof path, dir);
	for (size_t l = strlen(path); l > 1 && path[l - 1] == '/'; l--)
		path[l - 1] = '\0';
	if (stat(path, &st) != 0) {
		snprintf(err, errlen, "'%s': %s", dir,
			 errno == ENOENT ? "no such directory" : strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "'%s': not a directory", dir);
		return 1;
	}
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	*single = is_ns_name(base);
	if (*single) {
		*out = calloc(1, sizeof **out);
		if (!*out || !((*out)[0] = strdup(path)))
			goto nomem;
		*n_out = 1;
		return 0;
	}
	DIR *d = opendir(path);
	if (!d) {
		snprintf(err, errlen, "'%s': cannot read the directory: %s", dir, strerror(errno));
		return 1;
	}
	size_t cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		char sub[PATH_MAX];
		if (!is_ns_name(de->d_name))
			continue;
		if ((size_t)snprintf(sub, sizeof sub, "%s/%s", path, de->d_name) >= sizeof sub)
			continue;
		if (stat(sub, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		if (*n_out == cap) {
			cap = cap ? 2 * cap : 8;
			char **nv = realloc(*out, cap * sizeof *nv);
			if (!nv) {
				closedir(d);
				goto nomem;
			}
			*out = nv;
		}
		if (!((*out)[*n_out] = strdup(sub))) {
			closedir(d);
			goto nomem;
		}
		(*n_out)++;
	}
	closedir(d);
	if (*n_out)
		qsort(*out, *n_out, sizeof **out, str_cmp);
	return 0;
nomem:
	for (size_t i = 0; i < *n_out; i++)
		free((*out)[i]);
	free(*out);
	*out = NULL;
	*n_out = 0;
	snprintf(err, errlen, "out of memory");
	return 1;
}

static void run_ns(struct run *r, const char *path)
{
	struct rns n;
	memset(&n, 0, sizeof n);
	n.lk.fd = -1;
	rec_copy_str(n.path, sizeof n.path, path);
	const char *base = strrchr(path, '/');
	rec_copy_str(n.name, sizeof n.name, base ? base + 1 : path);
	if (!r->o->json) {
		text_ns_head(r, &n);
	} else {
		n.j = json_pack("{s:s, s:s}", "name", n.name, "dir", n.path);
		json_array_append(r->jns, n.j);
	}
	if (r->o->cmd == R_GC) {
		rec_cmd_gc(r, &n);
	} else if (rec_ns_load(r, &n, r->o->cmd == R_VERIFY, r->o->cmd != R_VERIFY) == 0) {
		static const char note[] = "a running server owns this namespace; read without its "
					   "lock, so the listing may change while it is read";
		if (r->o->json) {
			json_t *head = rec_json_ns(&n);
			json_object_update(n.j, head);
			json_decref(head);
			json_object_set_new(n.j, "in_use", json_boolean(n.unlocked));
			if (n.unlocked)
				json_object_set_new(n.j, "note", json_pack("s+", note, ""));
		} else if (n.unlocked) {
			fprintf(r->out, "  note: %s (%s)\n", note, n.busy);
		}
		switch (r->o->cmd) {
		case R_LS: cmd_ls(r, &n); break;
		case R_VERIFY: cmd_verify(r, &n); break;
		case R_STAT: cmd_stat(r, &n); break;
		case R_GC: break;
		}
	}
	if (n.error) {
		if (r->o->json)
			json_object_set_new(n.j, "error", json_string(n.error));
		else
			fprintf(r->out, "  error: %s\n", n.error);
	}
	json_decref(n.j);
	rec_ns_free(&n);
}

int flare_records(int argc, char **argv, FILE *out, FILE *err)
{
	struct ropts o;
	char msg[1024];
	int rc = parse_args(argc, argv, &o, msg, sizeof msg);
	if (rc == R_HELP) {
		flare_records_help(out);
		return 0;
	}
	if (rc) {
		fprintf(err, "flare records: %s\n", msg);
		return 2;
	}
	struct run r = {.o = &o, .out = out, .err = err, .now = eos_wall_ns()};
	char **dirs = NULL;
	size_t nd = 0;
	bool single = false;
	if (find_namespaces(o.dir, &dirs, &nd, &single, msg, sizeof msg) != 0) {
		fprintf(err, "flare records: %s\n", msg);
		r.status = 1;
	}
	if (o.json) {
		r.root = json_pack("{s:s, s:s}", "command", cmd_names[o.cmd], "dir", o.dir);
		r.jns = json_array();
		if (o.cmd == R_GC) {
			json_object_set_new(r.root, "dry_run", json_boolean(o.dry_run));
			json_object_set_new(r.root, "max_age_ns",
					    o.age ? rec_json_u64(o.max_age_ns) : json_null());
			json_object_set_new(r.root, "limit_bytes",
					    o.limit ? rec_json_u64(o.limit_bytes) : json_null());
		}
	} else if (nd == 0 && !r.status) {
		fprintf(out, "no record namespaces (<16 hex>-<32 hex>) under %s\n", o.dir);
	}
	for (size_t i = 0; i < nd; i++) {
		if (!o.json && i)
			fputc('\n', out);
		run_ns(&r, dirs[i]);
		free(dirs[i]);
	}
	free(dirs);
	if (o.cmd == R_VERIFY && !o.json)
		fprintf(out, "%s: %" PRIu64 " problem%s in %zu namespace%s\n",
			r.problems ? "verify FAILED" : "verify ok", r.problems,
			r.problems == 1 ? "" : "s", nd, nd == 1 ? "" : "s");
	if (o.json) {
		if (r.status && !nd)
			json_object_set_new(r.root, "error", json_string(msg));
		json_object_set_new(r.root, "namespaces", r.jns);
		json_object_set_new(r.root, "ok", json_boolean(r.status == 0));
		if (o.cmd == R_VERIFY)
			json_object_set_new(r.root, "problems", rec_json_u64(r.problems));
		json_dumpf(r.root, out, JSON_INDENT(2));
		fputc('\n', out);
		json_decref(r.root);
	}
	fflush(out);
	return r.status;
}
