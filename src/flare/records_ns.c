/*
 * records_ns.c - one namespace as `flare records` sees it: lock it (or,
 * for a reader while a server holds the lock, open it), list its entries,
 * decide its layout from the headers that name the directory, judge every
 * file with the server's own checks and scan, and link the tree (design
 * 2.5, the record-file, directory-lock and recovery-scan paragraphs;
 * docs/records-tool.md).
 *
 * DESIGN: records.c's, whose paragraphs on the namespace ("Only the
 *   namespace itself is the tool's": the layout a strict majority of the
 *   headers carries) and on locking apply here.
 *
 * INVARIANTS: those of records.c (2: a directory is changed only under
 *   its lock; one a server holds is only read).
 */
#include "flare/records_int.h"

void rec_ns_free(struct rns *n)
{
	for (size_t i = 0; i < n->nf; i++)
		free(n->f[i].why);
	for (size_t i = 0; i < n->ntmp; i++)
		free(n->tmp[i].name);
	for (size_t i = 0; i < n->nother; i++)
		free(n->other[i].name);
	free(n->f);
	free(n->tmp);
	free(n->other);
	free(n->error);
	free(n->undecided);
	n->undecided = NULL;
	free(n->busy);
	sel_record_ns_free(&n->ns);
	if (n->unlocked && n->lk.fd >= 0)
		close(n->lk.fd);
	n->unlocked = false;
	n->busy = NULL;
	eos_dirlock_release(&n->lk);
	n->f = NULL;
	n->tmp = n->other = NULL;
	n->nf = n->ntmp = n->nother = 0;
	n->error = NULL;
}

/* Mark the namespace failed with the calling thread's eos message (or
 * msg), print it and set exit status 1. */
void rec_ns_fail(struct run *r, struct rns *n, const char *msg)
{
	if (!msg)
		msg = eos_errmsg();
	if (!n->error)
		n->error = strdup(msg);
	fprintf(r->err, "flare records: %s\n", msg);
	if (r->status < 1)
		r->status = 1;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct rfile *)a)->name, ((const struct rfile *)b)->name);
}

static int other_by_name(const void *a, const void *b)
{
	return strcmp(((const struct rother *)a)->name, ((const struct rother *)b)->name);
}

struct rfile *rec_find_file(struct rns *n, const char *name)
{
	struct rfile key;
	if (!n->nf)
		return NULL;
	rec_copy_str(key.name, sizeof key.name, name);
	return bsearch(&key, n->f, n->nf, sizeof *n->f, by_name);
}

static struct rfile *find_key(struct rns *n, const sel_key *k)
{
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(k, name);
	return rec_find_file(n, name);
}

static int push_other(struct rother **v, size_t *n, size_t *cap, const char *name, int dirfd)
{
	if (*n == *cap) {
		*cap = *cap ? 2 * *cap : 16;
		struct rother *nv = realloc(*v, *cap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		*v = nv;
	}
	struct stat st;
	struct rother *x = &(*v)[*n];
	memset(x, 0, sizeof *x);
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		x->size = (uint64_t)st.st_size;
		x->mtime_ns = (uint64_t)st.st_mtim.tv_sec * NS + (uint64_t)st.st_mtim.tv_nsec;
	}
	if (!(x->name = strdup(name)))
		return -ENOMEM;
	(*n)++;
	return 0;
}

/* Read the namespace directory: record names, temporaries, the rest. */
int rec_ns_list(struct rns *n)
{
	size_t cap = 0, tcap = 0, ocap = 0;
	int rc = 0;
	int fd = openat(n->lk.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		rc = eos_fail(-errno, "'%s': cannot read the directory: %s", n->path,
			      strerror(errno));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	for (;;) {
		errno = 0;
		struct dirent *de = readdir(d);
		if (!de) {
			if (errno)
				rc = eos_fail(-errno, "'%s': reading the directory: %s", n->path,
					      strerror(errno));
			break;
		}
		const char *nm = de->d_name;
		sel_key k;
		if (!strcmp(nm, ".") || !strcmp(nm, ".."))
			continue;
		struct stat tst;
		if (sel_record_is_tmp_name(nm) &&
		    fstatat(n->lk.fd, nm, &tst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(tst.st_mode)) {
			/* Not a temporary of ours: the server leaves it alone. */
			rc = push_other(&n->other, &n->nother, &ocap, nm, n->lk.fd);
		} else if (sel_record_is_tmp_name(nm)) {
			rc = push_other(&n->tmp, &n->ntmp, &tcap, nm, n->lk.fd);
		} else if (strlen(nm) < SEL_RECORD_NAME_MAX && sel_record_name_parse(nm, &k) == 0) {
			if (n->nf == cap) {
				cap = cap ? 2 * cap : 256;
				struct rfile *nf = realloc(n->f, cap * sizeof(*nf));
				if (!nf) {
					rc = -ENOMEM;
					break;
				}
				n->f = nf;
			}
			struct rfile *f = &n->f[n->nf++];
			memset(f, 0, sizeof *f);
			rec_copy_str(f->name, sizeof f->name, nm);
			f->key = k;
			f->parent = -1;
		} else {
			rc = push_other(&n->other, &n->nother, &ocap, nm, n->lk.fd);
		}
		if (rc)
			break;
	}
	closedir(d);
	if (rc == -ENOMEM)
		rc = eos_fail(rc, "'%s': out of memory listing the directory", n->path);
	if (rc)
		return rc;
	if (n->nf)
		qsort(n->f, n->nf, sizeof *n->f, by_name);
	if (n->ntmp)
		qsort(n->tmp, n->ntmp, sizeof *n->tmp, other_by_name);
	if (n->nother)
		qsort(n->other, n->nother, sizeof *n->other, other_by_name);
	return 0;
}

/* Whether two namespaces read from headers are the same: identity,
 * fingerprint and the layout their rank tables give. */
static bool same_ns(const sel_record_ns *a, const sel_record_ns *b)
{
	const sel_record_layout *x = &a->layout, *y = &b->layout;
	return !memcmp(a->identity, b->identity, SEL_IDENTITY_BYTES) &&
	       !memcmp(a->fingerprint, b->fingerprint, SEL_FINGERPRINT_BYTES) &&
	       x->sz.ranks == y->sz.ranks && x->sz.page_tokens == y->sz.page_tokens &&
	       x->table_bytes == y->table_bytes && !memcmp(x->table, y->table, x->table_bytes);
}

/* The namespace's layout, by agreement of its files.  A header carries the
 * fingerprint but not the plane names it hashes, so no single header can
 * prove its rank table is the namespace's: a one-bit flip in a version-1
 * header (no header checksum) changes a plane size and keeps the
 * fingerprint.  So every header that decodes and names this directory
 * votes, and the layout is the one a strict majority of them carry --
 * what the server, which knows its geometry, would judge those files by;
 * ref is the first file (by name) that carries it.  Without a majority
 * (a tie) the layout is undecided: nothing is judged against it and gc
 * removes nothing. */
void rec_ns_reference(struct rns *n)
{
	struct vote {
		sel_record_ns ns;
		size_t files, first;
	} *v = NULL;
	size_t nv = 0, cap = 0, total = 0;
	for (size_t i = 0; i < n->nf; i++) {
		sel_record_ns ns;
		if (sel_record_ns_load(n->lk.fd, n->f[i].name, &ns) != 0)
			continue;
		if (strcmp(ns.dirname, n->name)) {
			sel_record_ns_free(&ns);
			continue;
		}
		total++;
		size_t k = 0;
		while (k < nv && !same_ns(&v[k].ns, &ns))
			k++;
		if (k < nv) {
			v[k].files++;
			sel_record_ns_free(&ns);
			continue;
		}
		if (nv == cap) {
			struct vote *g = realloc(v, (cap = cap ? 2 * cap : 4) * sizeof *v);
			if (!g) {
				sel_record_ns_free(&ns);
				break;
			}
			v = g;
		}
		v[nv++] = (struct vote){.ns = ns, .files = 1, .first = i};
	}
	size_t best = 0;
	for (size_t k = 1; k < nv; k++)
		if (v[k].files > v[best].files)
			best = k;
	if (nv && 2 * v[best].files > total) {
		n->ns = v[best].ns;
		n->have_ns = true;
		rec_copy_str(n->ref, sizeof n->ref, n->f[v[best].first].name);
		n->layout_votes = v[best].files;
	} else if (nv) {
		char buf[512];
		size_t o = (size_t)snprintf(buf, sizeof buf,
					    "%zu headers name this directory but "
					    "no layout has a majority:",
					    total);
		for (size_t k = 0; k < nv && o < sizeof buf; k++)
			o += (size_t)snprintf(buf + o, sizeof buf - o, "%s %zu like %s",
					      k ? "," : "", v[k].files, n->f[v[k].first].name);
		free(n->undecided);
		n->undecided = strdup(buf);
	}
	n->layout_files = total;
	for (size_t k = 0; k < nv; k++)
		if (!n->have_ns || k != best)
			sel_record_ns_free(&v[k].ns);
	free(v);
}

/* A file that decoded on its own where no header names the directory. */
static void judge_without_ns(struct rns *n, struct rfile *f)
{
	char dn[SEL_RECORD_DIRNAME_MAX];
	sel_record_dirname(f->h.identity, f->h.fingerprint, dn);
	f->kind = strncmp(dn, n->name, SEL_RECORD_ID_PREFIX_HEX) ? SEL_CHECK_IDENTITY
								 : SEL_CHECK_LAYOUT;
	char buf[256];
	snprintf(buf, sizeof buf, "its header belongs to namespace %s, not this directory's", dn);
	free(f->why);
	f->why = strdup(buf);
}

static void on_scan_remove(void *ctx, const char *name, enum sel_scan_why why, uint64_t bytes,
			   int err)
{
	(void)bytes;
	(void)err;
	struct rns *n = ctx;
	struct rfile *f = why == SEL_SCAN_TMP ? NULL : rec_find_file(n, name);
	if (f)
		f->fate = (int)why;
}

/* The directory for reading only, when a server holds its lock. */
static int ns_open_unlocked(struct rns *n)
{
	if (!(n->busy = strdup(eos_errmsg())))
		return eos_fail(-ENOMEM, "out of memory");
	int fd = open(n->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return eos_fail(-errno, "'%s': cannot open the directory: %s", n->path,
				strerror(errno));
	n->lk.fd = fd;
	n->unlocked = true;
	return 0;
}

/* Lock (or, for a reader when a server holds the lock, open), list, judge
 * every file (payload too for verify), learn the scan's verdicts and link
 * the tree.  0, or -1 with the namespace failed. */
int rec_ns_load(struct run *r, struct rns *n, bool payload, bool reader)
{
	int rc = eos_dirlock_acquire(&n->lk, n->path);
	if (rc == -EBUSY && reader)
		rc = ns_open_unlocked(n);
	if (rc != 0 || rec_ns_list(n) != 0) {
		rec_ns_fail(r, n, NULL);
		return -1;
	}
	rec_ns_reference(n);
	for (size_t i = 0; i < n->nf; i++) {
		struct rfile *f = &n->f[i];
		struct sel_record_check c;
		if (sel_record_check_file(n->lk.fd, f->name, n->have_ns ? &n->ns : NULL, payload,
					  &c) != 0) {
			rec_ns_fail(r, n, NULL);
			return -1;
		}
		f->kind = c.kind;
		f->decoded = c.decoded;
		f->h = c.h;
		f->size = c.size;
		f->mtime_ns = c.mtime_ns;
		f->has_row = c.has_row;
		n->bytes_read += c.bytes_read;
		if (c.kind != SEL_CHECK_OK && !(f->why = strdup(c.why))) {
			rec_ns_fail(r, n, "out of memory");
			return -1;
		}
		if (!n->have_ns && c.decoded &&
		    (c.kind == SEL_CHECK_OK || c.kind >= SEL_CHECK_NAME))
			judge_without_ns(n, f);
	}
	if (n->have_ns) {
		/* The server's own tree rules, removing nothing. */
		sel_scan sc;
		struct sel_scan_opts so = {
			.dry_run = true, .threads = 4, .on_remove = on_scan_remove, .ctx = n};
		if (sel_record_scan(n->lk.fd, &n->ns, &so, &sc) != 0) {
			rec_ns_fail(r, n, NULL);
			return -1;
		}
		sel_scan_free(&sc);
	}
	/* Links among the valid files; a parent sorts before its children. */
	uint32_t pt = n->have_ns ? n->ns.layout.sz.page_tokens : 0;
	for (size_t i = 0; i < n->nf; i++) {
		struct rfile *f = &n->f[i];
		if (!rec_header_valid(f))
			continue;
		f->depth = 1;
		if (!sel_record_links_parent(&f->h.d, pt))
			continue;
		struct rfile *p = find_key(n, &f->h.d.parent);
		if (p && rec_header_valid(p)) {
			f->parent = p - n->f;
			p->children++;
			f->depth = p->depth + 1;
		}
	}
	return 0;
}
