/*
 * test_flare_records.c - `flare records` (src/flare/records.c): ls, verify,
 * stat and gc on record directories built with the record API, run
 * in-process (flare_records with memory streams) and, where the build is
 * known ($SELENE_BUILD), through the flare binary.
 *
 * Covers: ls and stat, text and JSON (parsed with jansson), on a base
 * directory and on one namespace; verify clean, and verify naming each
 * corruption with its kind -- a flipped byte in a page, the row, the
 * checksum segment and the header, a short and a truncated file, a file
 * renamed to another key, an orphan and its descendant, a childless
 * page-only record, a temporary -- with exit 1; gc by age and by limit
 * (exact victims; ancestors never before their children; a verify after gc
 * is clean; an expired parent the limit leaves childless goes too) and a randomized gc over random forests checking the same
 * rules; --dry-run removes nothing; the directory lock held by another
 * descriptor and by a forked process makes every command fail naming the
 * directory; bad arguments exit 2 naming the flag and value.
 *
 * Consistency with the store: files corrupted as tests/test_disk.c does,
 * and single bytes flipped at random offsets, are rejected by a disk-thread
 * read (disk.h) exactly when `flare records verify` rejects them; renamed
 * and orphaned files are refused by the startup scan and by verify alike.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "disk.h"
#include "flare/records.h"
#include "recutil.h"

static test_rng rng;

/* ---- running the command ----------------------------------------------------------- */

struct res {
	int rc;
	char *out, *err;
	json_t *j; /* parsed out, when --json */
};

static void res_free(struct res *r)
{
	free(r->out);
	free(r->err);
	json_decref(r->j);
	memset(r, 0, sizeof *r);
}

/* flare records ARGS... (NULL-terminated), in-process. */
static struct res run_tool(const char *a0, ...)
{
	const char *argv[32];
	int argc = 0;
	argv[argc++] = "records";
	va_list ap;
	va_start(ap, a0);
	bool json = false;
	for (const char *a = a0; a; a = va_arg(ap, const char *)) {
		CHECK(argc < 31);
		argv[argc++] = a;
		json |= !strcmp(a, "--json");
	}
	va_end(ap);
	argv[argc] = NULL;
	struct res r = {0};
	size_t no, ne;
	FILE *o = open_memstream(&r.out, &no), *e = open_memstream(&r.err, &ne);
	CHECK(o && e);
	r.rc = flare_records(argc, (char **)argv, o, e);
	fclose(o);
	fclose(e);
	if (json && r.rc != 2) {
		json_error_t je;
		r.j = json_loads(r.out, 0, &je);
		CHECKF(r.j, "not JSON (%s): %s", je.text, r.out);
	}
	return r;
}

/* ---- building record directories --------------------------------------------------- */

struct fx {
	struct test_geo t;
	sel_record_ns ns;
	char *base;
	char dir[PATH_MAX];
};

static void fx_init(struct fx *f, uint32_t ranks)
{
	memset(f, 0, sizeof *f);
	if (ranks == 1)
		test_geo_init(&f->t, 1, 64, 2, (uint64_t[]){4096, 100}, 5000);
	else
		test_geo_init(&f->t, 2, 64, 2, (uint64_t[]){4096, 300}, 6000);
	test_ns_init(&f->ns, &f->t.g, 1);
	f->base = test_mkdtemp("records");
	CHECK(f->base);
	snprintf(f->dir, sizeof f->dir, "%s/%s", f->base, f->ns.dirname);
	struct eos_dirlock lk;
	CHECK_OK(sel_record_dir_open(f->base, &f->ns, &lk));
	eos_dirlock_release(&lk);
}

static void fx_free(struct fx *f)
{
	test_rmtree(f->base);
	free(f->base);
	sel_record_ns_free(&f->ns);
}

static char *path_of(const struct fx *f, const sel_key *k, char *buf, size_t len)
{
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(k, name);
	CHECK(snprintf(buf, len, "%s/%s", f->dir, name) < (int)len);
	return buf;
}

static void set_age(const char *path, uint64_t age_s)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	struct timespec ts[2] = {{.tv_sec = now.tv_sec - (time_t)age_s, .tv_nsec = 0},
				 {.tv_sec = now.tv_sec - (time_t)age_s, .tv_nsec = 0}};
	CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
}

/* A record's payload in aligned buffers, as slots would hold it. */
struct payload {
	void *pages[64];
	void *slots[16];
	struct iovec iov[64];
	uint32_t n_slots;
	int n_iov;
};

static void payload_alloc(const struct fx *f, const sel_record_desc *d, struct payload *p,
			  bool fill)
{
	const sel_record_layout *l = &f->ns.layout;
	sel_record_span s;
	memset(p, 0, sizeof *p);
	CHECK_OK(sel_record_span_of(&l->sz, d, &s));
	CHECK(d->tail <= 64);
	for (uint32_t i = 0; i < d->tail; i++) {
		p->pages[i] = eos_aligned_alloc(EOS_ALIGN, s.page_stride);
		CHECK(p->pages[i]);
		if (fill)
			test_rng_fill(&rng, p->pages[i], s.page_stride);
	}
	p->n_slots = sel_record_row_slots(l, d->flags);
	CHECK(p->n_slots <= 16);
	for (uint32_t i = 0; i < p->n_slots; i++) {
		p->slots[i] = eos_aligned_alloc(EOS_ALIGN, l->sz.page_record);
		CHECK(p->slots[i]);
		if (fill)
			test_rng_fill(&rng, p->slots[i], l->sz.page_record);
	}
	p->n_iov = sel_record_row_iov(l, d->flags, p->slots, p->n_slots, p->iov, 64);
	CHECK_OK(p->n_iov);
}

static void payload_free(struct payload *p)
{
	for (int i = 0; i < 64; i++)
		eos_aligned_free(p->pages[i]);
	for (int i = 0; i < 16; i++)
		eos_aligned_free(p->slots[i]);
	memset(p, 0, sizeof *p);
}

static void write_payload(struct fx *f, const sel_record_desc *d, bool row, struct payload *p)
{
	struct eos_dirlock lk;
	CHECK_OK(sel_record_dir_open(f->base, &f->ns, &lk));
	struct sel_record_write_opts wo = {.no_dir_fsync = true};
	CHECK_OK(
		sel_record_write(lk.fd, &f->ns, d, p->pages, row, p->iov, (uint32_t)p->n_iov, &wo));
	eos_dirlock_release(&lk);
}

/* Write record d (with its row or page-only), aged age_s seconds. */
static void write_rec(struct fx *f, const sel_record_desc *d, bool row, uint64_t age_s)
{
	struct payload p;
	payload_alloc(f, d, &p, true);
	write_payload(f, d, row, &p);
	payload_free(&p);
	char path[PATH_MAX];
	set_age(path_of(f, &d->key, path, sizeof path), age_s);
}

/* A new record at c tokens: a root (parent NULL) or linked under parent. */
static sel_record_desc mk(struct fx *f, uint64_t c, const sel_record_desc *parent)
{
	sel_record_desc d;
	test_desc(&rng, f->t.g.page_tokens, c, parent ? &parent->key : NULL, false, &d);
	return d;
}

static void name_of(const sel_record_desc *d, char *out) { sel_record_name(&d->key, out); }

static bool exists(const struct fx *f, const sel_record_desc *d)
{
	char p[PATH_MAX];
	struct stat st;
	return stat(path_of(f, &d->key, p, sizeof p), &st) == 0;
}

static void touch_file(const char *dir, const char *name, size_t bytes)
{
	char p[PATH_MAX];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	CHECK(fd >= 0);
	CHECK(ftruncate(fd, (off_t)bytes) == 0);
	close(fd);
}

/* ---- JSON helpers ---------------------------------------------------------------------- */

static json_t *ns0(const struct res *r)
{
	json_t *a = json_object_get(r->j, "namespaces");
	CHECK(json_is_array(a) && json_array_size(a) >= 1);
	return json_array_get(a, 0);
}

static json_t *find_named(json_t *arr, const char *member, const char *name)
{
	size_t i;
	json_t *v;
	json_array_foreach(arr, i, v)
	{
		const char *n = json_string_value(json_object_get(v, member));
		if (n && !strcmp(n, name))
			return v;
	}
	return NULL;
}

static json_int_t jint(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	CHECKF(json_is_integer(v), "member %s is not an integer", k);
	return json_integer_value(v);
}

static const char *jstr(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	CHECKF(json_is_string(v), "member %s is not a string", k);
	return json_string_value(v);
}

/* verify --json: the kind reported for file (NULL: none). */
static const char *problem_kind(const struct res *r, const char *file)
{
	json_t *p = find_named(json_object_get(ns0(r), "problems"), "file", file);
	return p ? jstr(p, "kind") : NULL;
}

static void expect_verify_clean(struct fx *f)
{
	struct res r = run_tool("verify", f->base, "--json", NULL);
	CHECKF(r.rc == 0, "verify: %s %s", r.out, r.err);
	CHECK(json_is_true(json_object_get(r.j, "ok")));
	CHECK(jint(r.j, "problems") == 0);
	res_free(&r);
}

/* ---- ls ----------------------------------------------------------------------------------- */

static void test_ls(void)
{
	struct fx f;
	fx_init(&f, 2);
	uint32_t pt = f.t.g.page_tokens;
	sel_record_desc a = mk(&f, 3 * pt, NULL), b = mk(&f, 5 * pt + 10, &a),
			c = mk(&f, 8 * pt, &b), d = mk(&f, 2 * pt, NULL);
	write_rec(&f, &a, true, 30);
	write_rec(&f, &b, false, 20); /* page-only interior */
	write_rec(&f, &c, true, 10);
	write_rec(&f, &d, true, 7200);
	char an[SEL_RECORD_NAME_MAX], bn[SEL_RECORD_NAME_MAX], cn[SEL_RECORD_NAME_MAX],
		tmp[SEL_RECORD_TMPNAME_MAX];
	name_of(&a, an);
	name_of(&b, bn);
	name_of(&c, cn);
	sel_record_tmp_name(cn, 0x1234, tmp);
	touch_file(f.dir, tmp, 8192);
	touch_file(f.dir, "notes.txt", 3);

	/* JSON, on the base directory. */
	struct res r = run_tool("ls", f.base, "--json", NULL);
	CHECKF(r.rc == 0, "%s", r.err);
	CHECK(!strcmp(jstr(r.j, "command"), "ls"));
	json_t *n = ns0(&r);
	CHECK(!strcmp(jstr(n, "name"), f.ns.dirname));
	CHECK(!strcmp(jstr(n, "fingerprint"), f.ns.dirname + 17));
	json_t *lay = json_object_get(n, "layout");
	CHECK(jint(lay, "ranks") == 2 && jint(lay, "page_tokens") == 64);
	CHECK(jint(lay, "page_record_bytes") == (json_int_t)f.ns.layout.sz.page_record);
	CHECK(json_array_size(json_object_get(lay, "planes")) == 2);
	json_t *recs = json_object_get(n, "records");
	CHECK(json_array_size(recs) == 4);
	json_t *ja = find_named(recs, "name", an), *jb = find_named(recs, "name", bn),
	       *jc = find_named(recs, "name", cn);
	CHECK(ja && jb && jc);
	CHECK(jint(ja, "depth") == 1 && jint(jb, "depth") == 2 && jint(jc, "depth") == 3);
	CHECK(json_is_true(json_object_get(ja, "row")) &&
	      json_is_false(json_object_get(jb, "row")));
	CHECK(jint(jb, "tail_pages") == 2 && jint(jc, "tail_pages") == 3);
	CHECK(jint(json_object_get(jc, "parent"), "consumed") == (json_int_t)b.key.consumed);
	CHECK(json_is_null(json_object_get(ja, "parent")));
	CHECK(json_is_true(json_object_get(jc, "links_parent")));
	CHECK(json_is_true(json_object_get(jc, "parent_present")));
	CHECK(json_is_false(json_object_get(ja, "links_parent")));
	CHECK(!strcmp(jstr(jc, "state"), "ok"));
	CHECK(jint(jc, "age_s") >= 9 && jint(jc, "age_s") < 600);
	CHECK(jint(jc, "bytes") > 0);
	CHECK(json_array_size(json_object_get(n, "temporaries")) == 1);
	CHECK(!strcmp(jstr(json_array_get(json_object_get(n, "temporaries"), 0), "name"), tmp));
	CHECK(json_array_size(json_object_get(n, "other")) == 1);
	res_free(&r);

	/* Text, on the namespace directory itself. */
	r = run_tool("ls", f.dir, NULL);
	CHECKF(r.rc == 0, "%s", r.err);
	char kt[64];
	snprintf(kt, sizeof kt, "%" PRIu64 ":", c.key.consumed);
	CHECK(strstr(r.out, f.ns.dirname));
	CHECK(strstr(r.out, "2 ranks, 64 tokens per page"));
	CHECK(strstr(r.out, "4 records"));
	CHECK(strstr(r.out, kt));
	CHECK(strstr(r.out, "pages"));
	CHECK(strstr(r.out, tmp));
	CHECK(strstr(r.out, "notes.txt"));
	res_free(&r);

	/* An empty base: no namespaces, fine. */
	char *empty = test_mkdtemp("empty");
	r = run_tool("ls", empty, NULL);
	CHECK(r.rc == 0 && strstr(r.out, "no record namespaces"));
	res_free(&r);
	r = run_tool("ls", empty, "--json", NULL);
	CHECK(r.rc == 0 && json_array_size(json_object_get(r.j, "namespaces")) == 0);
	res_free(&r);
	test_rmtree(empty);
	free(empty);
	fx_free(&f);
}

/* ---- stat --------------------------------------------------------------------------------- */

static void test_stat(void)
{
	struct fx f;
	fx_init(&f, 1);
	uint32_t pt = f.t.g.page_tokens;
	/* A chain of three (depth 3), a big root (most bytes), two small roots. */
	sel_record_desc a = mk(&f, 2 * pt, NULL), b = mk(&f, 3 * pt, &a), c = mk(&f, 4 * pt, &b);
	sel_record_desc big = mk(&f, 30 * pt, NULL), s1 = mk(&f, pt, NULL),
			s2 = mk(&f, pt + 5, NULL);
	write_rec(&f, &a, true, 30);           /* <1m */
	write_rec(&f, &b, false, 5 * 60);      /* <10m */
	write_rec(&f, &c, true, 2 * 3600);     /* <1d */
	write_rec(&f, &big, true, 3 * 86400);  /* <1w */
	write_rec(&f, &s1, false, 30 * 86400); /* older; childless page-only: prunable */
	write_rec(&f, &s2, true, 30 * 86400 + 5);
	char bign[SEL_RECORD_NAME_MAX], cn[SEL_RECORD_NAME_MAX], an[SEL_RECORD_NAME_MAX];
	name_of(&big, bign);
	name_of(&c, cn);
	name_of(&a, an);

	struct res r = run_tool("stat", f.base, "--json", NULL);
	CHECKF(r.rc == 0, "%s", r.err);
	json_t *n = ns0(&r), *t = json_object_get(n, "totals");
	CHECK(jint(t, "records") == 6 && jint(t, "with_row") == 4 && jint(t, "page_only") == 2);
	CHECK(jint(t, "prunable") == 1 && jint(t, "orphans") == 0 && jint(t, "invalid") == 0);
	json_t *largest = json_object_get(n, "largest_chains"),
	       *deepest = json_object_get(n, "deepest_chains");
	CHECK(json_array_size(largest) == 4); /* leaves: c, big, s1, s2 */
	CHECK(!strcmp(jstr(json_array_get(largest, 0), "leaf"), bign));
	CHECK(jint(json_array_get(largest, 0), "depth") == 1);
	CHECK(!strcmp(jstr(json_array_get(deepest, 0), "leaf"), cn));
	CHECK(!strcmp(jstr(json_array_get(deepest, 0), "root"), an));
	CHECK(jint(json_array_get(deepest, 0), "depth") == 3);
	json_t *h = json_object_get(n, "age_histogram");
	CHECK(json_array_size(h) == 6);
	static const json_int_t want[6] = {1, 1, 0, 1, 1, 2};
	for (size_t i = 0; i < 6; i++)
		CHECKF(jint(json_array_get(h, i), "records") == want[i], "bucket %s",
		       jstr(json_array_get(h, i), "age"));
	res_free(&r);

	r = run_tool("stat", f.dir, NULL);
	CHECKF(r.rc == 0, "%s", r.err);
	CHECK(strstr(r.out, "records 6"));
	CHECK(strstr(r.out, "largest chains"));
	CHECK(strstr(r.out, "<10m"));
	CHECK(strstr(r.out, "older"));
	res_free(&r);
	fx_free(&f);
}

/* ---- verify ------------------------------------------------------------------------------- */

static void test_verify(void)
{
	struct fx f;
	fx_init(&f, 1);
	uint32_t pt = f.t.g.page_tokens;
	char p[PATH_MAX];

	/* Clean first. */
	sel_record_desc good = mk(&f, 6 * pt, NULL), kid = mk(&f, 8 * pt, &good);
	write_rec(&f, &good, true, 100);
	write_rec(&f, &kid, true, 50);
	expect_verify_clean(&f);
	struct res r = run_tool("verify", f.dir, NULL);
	CHECK(r.rc == 0 && strstr(r.out, "verify ok"));
	res_free(&r);

	/* One file per corruption, all roots (so no tree effect between them). */
	enum {
		PAGE,
		ROW,
		CKSUM,
		HEADER,
		HEADER2,
		TRUNC,
		SHORT,
		RENAMED,
		N_BAD
	};
	static const char *kind[N_BAD] = {
		"page checksum",   "row checksum", "page checksum", "header checksum",
		"header checksum", "size",         "format",        "name"};
	sel_record_desc bad[N_BAD];
	char bn[N_BAD][SEL_RECORD_NAME_MAX];
	for (int i = 0; i < N_BAD; i++) {
		bad[i] = mk(&f, (uint64_t)(6 + i) * pt + 3, NULL);
		write_rec(&f, &bad[i], true, 10);
		name_of(&bad[i], bn[i]);
	}
	sel_record_span sb[N_BAD];
	for (int i = 0; i < N_BAD; i++)
		CHECK_OK(sel_record_span_of(&f.ns.layout.sz, &bad[i], &sb[i]));
	test_flip_byte(path_of(&f, &bad[PAGE].key, p, sizeof p),
		       sb[PAGE].page_off + 2 * sb[PAGE].page_stride + 77);
	test_flip_byte(path_of(&f, &bad[ROW].key, p, sizeof p), sb[ROW].row_off + 5);
	test_flip_byte(path_of(&f, &bad[CKSUM].key, p, sizeof p), sb[CKSUM].cksum_off + 8 * 4 + 3);
	test_flip_byte(path_of(&f, &bad[HEADER].key, p, sizeof p), 90);
	test_flip_byte(path_of(&f, &bad[HEADER2].key, p, sizeof p),
		       1000 + test_rng_below(&rng, 3000));
	CHECK(truncate(path_of(&f, &bad[TRUNC].key, p, sizeof p),
		       (off_t)sb[TRUNC].row_off - 4096) == 0);
	CHECK(truncate(path_of(&f, &bad[SHORT].key, p, sizeof p), 100) == 0);
	{
		/* Rename a good record to a key nobody has. */
		sel_key other;
		test_key(&rng, bad[RENAMED].key.consumed, &other);
		char to[PATH_MAX];
		path_of(&f, &bad[RENAMED].key, p, sizeof p);
		path_of(&f, &other, to, sizeof to);
		CHECK(rename(p, to) == 0);
		sel_record_name(&other, bn[RENAMED]);
	}
	/* An orphan (its parent never written) and a record linked under it. */
	sel_record_desc ghost = mk(&f, 2 * pt, NULL), orphan = mk(&f, 4 * pt, &ghost),
			grand = mk(&f, 5 * pt, &orphan);
	write_rec(&f, &orphan, true, 10);
	write_rec(&f, &grand, true, 10);
	/* A childless page-only record, and a temporary. */
	sel_record_desc lonely = mk(&f, 3 * pt, NULL);
	write_rec(&f, &lonely, false, 10);
	char on[SEL_RECORD_NAME_MAX], gn[SEL_RECORD_NAME_MAX], ln[SEL_RECORD_NAME_MAX],
		tmp[SEL_RECORD_TMPNAME_MAX], goodn[SEL_RECORD_NAME_MAX];
	name_of(&orphan, on);
	name_of(&grand, gn);
	name_of(&lonely, ln);
	name_of(&good, goodn);
	sel_record_tmp_name(goodn, 77, tmp);
	touch_file(f.dir, tmp, 4096);

	r = run_tool("verify", f.base, "--json", NULL);
	CHECK(r.rc == 1);
	CHECK(json_is_false(json_object_get(r.j, "ok")));
	for (int i = 0; i < N_BAD; i++) {
		const char *k = problem_kind(&r, bn[i]);
		CHECKF(k && !strcmp(k, kind[i]), "file %d (%s): kind %s, want %s", i, bn[i],
		       k ? k : "(none)", kind[i]);
	}
	json_t *pp = find_named(json_object_get(ns0(&r), "problems"), "file", bn[PAGE]);
	CHECK(strstr(jstr(pp, "reason"), "page record 2"));
	pp = find_named(json_object_get(ns0(&r), "problems"), "file", bn[CKSUM]);
	CHECK(strstr(jstr(pp, "reason"), "page record 4"));
	CHECK(problem_kind(&r, on) && !strcmp(problem_kind(&r, on), "orphan"));
	CHECK(problem_kind(&r, gn) && !strcmp(problem_kind(&r, gn), "orphan"));
	CHECK(problem_kind(&r, ln) && !strcmp(problem_kind(&r, ln), "childless page-only"));
	CHECK(problem_kind(&r, tmp) && !strcmp(problem_kind(&r, tmp), "temporary"));
	CHECK(!problem_kind(&r, goodn));
	CHECK(jint(r.j, "problems") == N_BAD + 4);
	res_free(&r);

	/* Text names each file with its reason. */
	r = run_tool("verify", f.dir, NULL);
	CHECK(r.rc == 1);
	for (int i = 0; i < N_BAD; i++) {
		char want[1024];
		snprintf(want, sizeof want, "BAD %s: %s", bn[i], kind[i]);
		CHECKF(strstr(r.out, want), "missing '%s' in\n%s", want, r.out);
	}
	CHECK(strstr(r.out, "verify FAILED"));
	res_free(&r);

	/* ls reports the same files without reading payloads: headers only. */
	r = run_tool("ls", f.dir, "--json", NULL);
	CHECK(r.rc == 0);
	json_t *recs = json_object_get(ns0(&r), "records");
	CHECK(!strcmp(jstr(find_named(recs, "name", bn[PAGE]), "state"), "ok"));
	CHECK(!strcmp(jstr(find_named(recs, "name", bn[HEADER]), "state"), "invalid"));
	CHECK(!strcmp(jstr(find_named(recs, "name", on), "state"), "orphan"));
	CHECK(json_is_true(json_object_get(find_named(recs, "name", on), "links_parent")));
	CHECK(json_is_false(json_object_get(find_named(recs, "name", on), "parent_present")));
	CHECK(!strcmp(jstr(find_named(recs, "name", gn), "state"), "descendant"));
	CHECK(!strcmp(jstr(find_named(recs, "name", ln), "state"), "prunable"));
	res_free(&r);

	/* verify removed nothing. */
	CHECK(exists(&f, &orphan) && exists(&f, &lonely));
	fx_free(&f);
}

/* ---- gc ----------------------------------------------------------------------------------- */

static json_t *gc_json(struct fx *f, int want_rc, const char *a1, const char *a2, const char *a3,
		       const char *a4)
{
	struct res r = run_tool("gc", f->base, "--json", a1, a2, a3, a4, NULL);
	CHECKF(r.rc == want_rc, "gc rc %d: %s %s", r.rc, r.out, r.err);
	json_t *j = json_incref(r.j);
	res_free(&r);
	return j;
}

static size_t removed_index(json_t *removed, const char *name)
{
	size_t i;
	json_t *v;
	/* Removals only: a truncation (the row of a single-child parent, as the
	 * server's recovery compacts it) leaves the record in place. */
	json_array_foreach(removed, i, v) if (!strcmp(jstr(v, "name"), name) &&
					      !strcmp(jstr(v, "action"), "unlink")) return i;
	return SIZE_MAX;
}

static void test_gc_age(void)
{
	struct fx f;
	fx_init(&f, 1);
	uint32_t pt = f.t.g.page_tokens;
	/* a (row) - b (page-only) - c (row): all old.  d: a fresh root.
	 * e (old) under x (fresh): e goes, x stays.  y (old) with a fresh
	 * child z: both stay (y is interior). */
	sel_record_desc a = mk(&f, 2 * pt, NULL), b = mk(&f, 4 * pt, &a), c = mk(&f, 6 * pt, &b);
	sel_record_desc d = mk(&f, 3 * pt, NULL);
	sel_record_desc x = mk(&f, 5 * pt, NULL), e = mk(&f, 7 * pt, &x);
	sel_record_desc y = mk(&f, 9 * pt, NULL), z = mk(&f, 10 * pt, &y);
	write_rec(&f, &a, true, 5 * 3600);
	write_rec(&f, &b, false, 4 * 3600);
	write_rec(&f, &c, true, 3 * 3600);
	write_rec(&f, &d, true, 60);
	write_rec(&f, &x, true, 60);
	write_rec(&f, &e, true, 3 * 3600);
	write_rec(&f, &y, true, 9 * 3600);
	write_rec(&f, &z, true, 60);
	char an[64], bn[64], cn[64], en[64];
	name_of(&a, an);
	name_of(&b, bn);
	name_of(&c, cn);
	name_of(&e, en);

	/* Dry run: the report, no removal. */
	json_t *j = gc_json(&f, 0, "--max-age", "1h", "--dry-run", NULL);
	CHECK(json_is_true(json_object_get(j, "dry_run")));
	CHECK(jint(j, "max_age_ns") == 3600 * 1000000000ll);
	json_t *rm =
		json_object_get(json_array_get(json_object_get(j, "namespaces"), 0), "removed");
	CHECK(json_array_size(rm) == 4);
	json_decref(j);
	CHECK(exists(&f, &a) && exists(&f, &b) && exists(&f, &c) && exists(&f, &e));

	j = gc_json(&f, 0, "--max-age", "1h", NULL, NULL);
	json_t *n = json_array_get(json_object_get(j, "namespaces"), 0);
	rm = json_object_get(n, "removed");
	CHECK(json_array_size(rm) == 4);
	size_t ic = removed_index(rm, cn), ib = removed_index(rm, bn), ia = removed_index(rm, an),
	       ie = removed_index(rm, en);
	CHECK(ic != SIZE_MAX && ib != SIZE_MAX && ia != SIZE_MAX && ie != SIZE_MAX);
	CHECK(ic < ib && ib < ia); /* children first */
	CHECK(!strcmp(jstr(json_array_get(rm, ic), "reason"), "expired"));
	CHECK(!strcmp(jstr(json_array_get(rm, ib), "reason"), "page-only ancestor"));
	CHECK(!strcmp(jstr(json_array_get(rm, ia), "reason"), "expired"));
	CHECK(jint(json_object_get(n, "kept"), "records") == 4);
	json_decref(j);
	CHECK(!exists(&f, &a) && !exists(&f, &b) && !exists(&f, &c) && !exists(&f, &e));
	CHECK(exists(&f, &d) && exists(&f, &x) && exists(&f, &y) && exists(&f, &z));
	expect_verify_clean(&f);

	/* Text output, and nothing more to do. */
	struct res r = run_tool("gc", f.dir, "--max-age", "1h", NULL);
	CHECKF(r.rc == 0, "%s", r.err);
	CHECK(strstr(r.out, "removed 0 records") && strstr(r.out, "kept 4 records"));
	res_free(&r);
	fx_free(&f);
}

static void test_gc_limit(void)
{
	struct fx f;
	fx_init(&f, 1);
	uint32_t pt = f.t.g.page_tokens;
	sel_record_desc r1 = mk(&f, 4 * pt, NULL), r2 = mk(&f, 4 * pt + 1, NULL),
			r3 = mk(&f, 4 * pt + 2, NULL);
	write_rec(&f, &r1, true, 3 * 3600);
	write_rec(&f, &r2, true, 2 * 3600);
	write_rec(&f, &r3, true, 1 * 3600);
	/* Also a temporary and a corrupt header: recovery removes them. */
	char n1[64], n2[64], tmp[SEL_RECORD_TMPNAME_MAX], p[PATH_MAX];
	name_of(&r1, n1);
	name_of(&r2, n2);
	sel_record_tmp_name(n1, 5, tmp);
	touch_file(f.dir, tmp, 100);
	sel_record_desc badh = mk(&f, 9 * pt, NULL);
	write_rec(&f, &badh, true, 10);
	test_flip_byte(path_of(&f, &badh.key, p, sizeof p), 100);

	struct stat st;
	CHECK(stat(path_of(&f, &r1.key, p, sizeof p), &st) == 0);
	char lim[32];
	snprintf(lim, sizeof lim, "%" PRIu64, (uint64_t)st.st_size * 3 / 2);
	json_t *j = gc_json(&f, 0, "--limit", lim, NULL, NULL);
	json_t *n = json_array_get(json_object_get(j, "namespaces"), 0);
	json_t *rec = json_object_get(n, "recovery"), *rm = json_object_get(n, "removed");
	CHECK(json_array_size(rec) == 2);
	CHECK(!strcmp(jstr(find_named(rec, "name", tmp), "reason"), "temporary"));
	CHECK(json_array_size(rm) == 2);
	CHECK(!strcmp(jstr(json_array_get(rm, 0), "name"), n1)); /* oldest first */
	CHECK(!strcmp(jstr(json_array_get(rm, 1), "name"), n2));
	CHECK(!strcmp(jstr(json_array_get(rm, 0), "reason"), "limit"));
	CHECK(jint(json_object_get(n, "kept"), "records") == 1);
	CHECK(jint(json_object_get(n, "kept"), "bytes") == (json_int_t)st.st_size);
	json_decref(j);
	CHECK(!exists(&f, &r1) && !exists(&f, &r2) && exists(&f, &r3) && !exists(&f, &badh));
	expect_verify_clean(&f);

	/* --limit 0 empties it. */
	j = gc_json(&f, 0, "--limit", "0", NULL, NULL);
	json_decref(j);
	CHECK(!exists(&f, &r3));
	fx_free(&f);
}

/* Regression: an expired parent that the limit leaves as a leaf (by
 * evicting its fresh child) is expired too, not kept. */
static void test_gc_expired_parent_after_limit(void)
{
	struct fx f;
	fx_init(&f, 1);
	uint32_t pt = f.t.g.page_tokens;
	sel_record_desc p = mk(&f, 4 * pt, NULL), c = mk(&f, 5 * pt, &p),
			x = mk(&f, 4 * pt + 9, NULL);
	write_rec(&f, &p, true, 5 * 3600);
	write_rec(&f, &c, true, 2 * 3600);
	write_rec(&f, &x, true, 60);
	char path[PATH_MAX], lim[32];
	struct stat sp, sx;
	CHECK(stat(path_of(&f, &p.key, path, sizeof path), &sp) == 0);
	CHECK(stat(path_of(&f, &x.key, path, sizeof path), &sx) == 0);
	snprintf(lim, sizeof lim, "%" PRIu64, (uint64_t)(sp.st_size + sx.st_size));
	json_t *j = gc_json(&f, 0, "--max-age", "3h", "--limit", lim);
	json_t *rm =
		json_object_get(json_array_get(json_object_get(j, "namespaces"), 0), "removed");
	CHECK(json_array_size(rm) == 2);
	CHECK(!strcmp(jstr(json_array_get(rm, 0), "reason"), "limit"));
	CHECK(!strcmp(jstr(json_array_get(rm, 1), "reason"), "expired"));
	json_decref(j);
	CHECK(!exists(&f, &p) && !exists(&f, &c) && exists(&f, &x));
	fx_free(&f);
}

/* Random forests, random ages and limits: the rules hold whatever the shape. */
static void test_gc_random(void)
{
	int rounds = test_soak() ? 200 : 16;
	for (int round = 0; round < rounds; round++) {
		struct fx f;
		fx_init(&f, 1);
		uint32_t pt = f.t.g.page_tokens;
		enum {
			N = 24
		};
		sel_record_desc d[N];
		int parent[N];
		uint64_t age[N];
		bool row[N];
		int children[N] = {0};
		for (int i = 0; i < N; i++) {
			parent[i] = i && test_rng_below(&rng, 4)
					    ? (int)test_rng_below(&rng, (uint64_t)i)
					    : -1;
			uint64_t c = parent[i] < 0 ? 1 + test_rng_below(&rng, 4 * pt)
						   : d[parent[i]].key.consumed + 1 +
							     test_rng_below(&rng, 3 * pt);
			d[i] = mk(&f, c, parent[i] < 0 ? NULL : &d[parent[i]]);
			if (parent[i] >= 0)
				children[parent[i]]++;
			age[i] = (1 + test_rng_below(&rng, 24)) * 600; /* 10-minute steps */
		}
		for (int i = 0; i < N; i++) {
			row[i] = children[i] == 0 || test_rng_below(&rng, 2);
			write_rec(&f, &d[i], row[i], age[i]);
		}
		const char *args[4] = {NULL, NULL, NULL, NULL};
		int na = 0;
		char agebuf[32], limbuf[32];
		uint64_t total = 0, limit = 0;
		struct stat st;
		char p[PATH_MAX];
		for (int i = 0; i < N; i++) {
			CHECK(stat(path_of(&f, &d[i].key, p, sizeof p), &st) == 0);
			total += (uint64_t)st.st_size;
		}
		int mode = (int)test_rng_below(&rng, 3);
		uint64_t max_age_s = (1 + test_rng_below(&rng, 24)) * 600 - 300;
		snprintf(agebuf, sizeof agebuf, "%" PRIu64 "s", max_age_s);
		limit = test_rng_below(&rng, total + 1);
		snprintf(limbuf, sizeof limbuf, "%" PRIu64, limit);
		if (mode != 1) {
			args[na++] = "--max-age";
			args[na++] = agebuf;
		}
		if (mode != 0) {
			args[na++] = "--limit";
			args[na++] = limbuf;
		}
		json_t *j = gc_json(&f, 0, args[0], args[1], args[2], args[3]);
		json_t *n = json_array_get(json_object_get(j, "namespaces"), 0);
		json_t *rm = json_object_get(n, "removed");
		CHECK(json_array_size(json_object_get(n, "recovery")) == 0);
		/* Ancestors never before their children, and no orphan left. */
		for (int i = 0; i < N; i++) {
			char nm[64];
			name_of(&d[i], nm);
			size_t at = removed_index(rm, nm);
			CHECKF((at == SIZE_MAX) == exists(&f, &d[i]), "round %d: record %d", round,
			       i);
			if (at == SIZE_MAX)
				continue;
			for (int k = 0; k < N; k++) {
				if (parent[k] != i)
					continue;
				char kn[64];
				name_of(&d[k], kn);
				size_t kat = removed_index(rm, kn);
				CHECKF(kat != SIZE_MAX && kat < at,
				       "round %d: %d removed before its "
				       "child %d",
				       round, i, k);
			}
		}
		/* The rules were applied: no expired leaf left, the limit met. */
		uint64_t kept = 0;
		for (int i = 0; i < N; i++) {
			if (!exists(&f, &d[i]))
				continue;
			CHECK(stat(path_of(&f, &d[i].key, p, sizeof p), &st) == 0);
			kept += (uint64_t)st.st_size;
			bool leaf = true;
			for (int k = 0; k < N; k++)
				leaf &= !(parent[k] == i && exists(&f, &d[k]));
			if (mode != 1 && leaf)
				CHECKF(age[i] < max_age_s, "round %d: expired leaf %d kept", round,
				       i);
		}
		if (mode != 0)
			CHECKF(kept <= limit, "round %d: kept %" PRIu64 " > limit %" PRIu64, round,
			       kept, limit);
		CHECK(jint(json_object_get(n, "kept"), "bytes") == (json_int_t)kept);
		json_decref(j);
		expect_verify_clean(&f);
		fx_free(&f);
	}
}

/* ---- the lock -------------------------------------------------------------------------- */

/* While a server owns the namespace: verify and gc refuse it, naming the
 * lock's holder; ls and stat read it anyway (issue 14: they only read) and
 * say that the listing may change. */
static void check_locked(struct fx *f, const char *holder)
{
	static const char *cmds[][4] = {{"verify", NULL}, {"gc", "--max-age", "1s", NULL}};
	for (size_t i = 0; i < 2; i++) {
		struct res r = run_tool(cmds[i][0], f->base, cmds[i][1], cmds[i][2], NULL);
		CHECKF(r.rc == 1, "%s: rc %d", cmds[i][0], r.rc);
		CHECKF(strstr(r.err, f->dir) && strstr(r.err, "locked"), "%s: %s", cmds[i][0],
		       r.err);
		if (holder && !strstr(r.err, holder))
			fprintf(stderr, "note: holder not named: %s", r.err);
		res_free(&r);
	}
	static const char *readers[] = {"ls", "stat"};
	for (size_t i = 0; i < 2; i++) {
		struct res r = run_tool(readers[i], f->base, NULL);
		CHECKF(r.rc == 0, "%s: rc %d: %s", readers[i], r.rc, r.err);
		CHECKF(strstr(r.out, "note: a running server owns this namespace") &&
			       strstr(r.out, "may change") && strstr(r.out, "locked"),
		       "%s: %s", readers[i], r.out);
		CHECKF(strstr(r.out, i ? "records 1 (" : ".ckpt"), "%s: %s", readers[i], r.out);
		res_free(&r);
	}
	struct res r = run_tool("ls", f->base, "--json", NULL);
	CHECK(r.rc == 0);
	json_t *n = ns0(&r);
	CHECK(json_is_true(json_object_get(n, "in_use")) && strstr(jstr(n, "note"), "may change"));
	CHECK(json_array_size(json_object_get(n, "records")) == 1);
	CHECK(json_is_true(json_object_get(r.j, "ok")));
	res_free(&r);
}

static void test_lock(void)
{
	struct fx f;
	fx_init(&f, 1);
	sel_record_desc a = mk(&f, 128, NULL);
	write_rec(&f, &a, true, 100);

	/* Another descriptor in this process (a server's store). */
	struct eos_dirlock lk;
	CHECK_OK(sel_record_dir_open(f.base, &f.ns, &lk));
	check_locked(&f, NULL);
	CHECK(exists(&f, &a)); /* gc removed nothing */
	eos_dirlock_release(&lk);
	struct res r = run_tool("ls", f.base, NULL);
	CHECK(r.rc == 0);
	res_free(&r);

	/* Another process. */
	int to_child[2], to_parent[2];
	CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0);
	fflush(NULL);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct eos_dirlock c;
		char ch = eos_dirlock_acquire(&c, f.dir) == 0 ? 'l' : 'x';
		if (write(to_parent[1], &ch, 1) != 1 || read(to_child[0], &ch, 1) != 1)
			_exit(3);
		_exit(0);
	}
	char ch = 0;
	CHECK(read(to_parent[0], &ch, 1) == 1 && ch == 'l');
	char holder[64];
	snprintf(holder, sizeof holder, "pid %ld", (long)pid);
	check_locked(&f, holder);
	CHECK(write(to_child[1], "q", 1) == 1);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(to_child[0]);
	close(to_child[1]);
	close(to_parent[0]);
	close(to_parent[1]);
	expect_verify_clean(&f);

	/* And the other way: while the tool holds it (between its calls, a
	 * lock taken the tool's way), a server cannot open the namespace. */
	struct eos_dirlock tool;
	CHECK_OK(eos_dirlock_acquire(&tool, f.dir));
	CHECK_RC(sel_record_dir_open(f.base, &f.ns, &lk), -EBUSY);
	eos_dirlock_release(&tool);
	fx_free(&f);
}

/* ---- arguments --------------------------------------------------------------------------- */

static void expect_bad(const char *want, const char *a0, const char *a1, const char *a2,
		       const char *a3)
{
	struct res r = run_tool(a0, a1, a2, a3, NULL);
	CHECKF(r.rc == 2, "rc %d for %s %s: %s", r.rc, a0 ? a0 : "", a1 ? a1 : "", r.err);
	CHECKF(strstr(r.err, want), "want '%s' in: %s", want, r.err);
	CHECK(r.out[0] == '\0');
	res_free(&r);
}

static void test_args(void)
{
	expect_bad("missing command", NULL, NULL, NULL, NULL);
	expect_bad("unknown command 'frob'", "frob", "/tmp", NULL, NULL);
	expect_bad("ls: missing DIR", "ls", NULL, NULL, NULL);
	expect_bad("ls: missing DIR", "ls", "--json", NULL, NULL);
	expect_bad("unexpected argument 'b'", "ls", "a", "b", NULL);
	expect_bad("unknown flag '--jsno'", "ls", "a", "--jsno", NULL);
	expect_bad("--max-age: only gc takes it", "verify", "a", "--max-age", "1h");
	expect_bad("--dry-run: only gc takes it", "stat", "a", "--dry-run", NULL);
	expect_bad("gc: nothing to apply", "gc", "a", NULL, NULL);
	expect_bad("gc: nothing to apply", "gc", "a", "--max-age", "off");
	expect_bad("--max-age: '0' is not a positive duration", "gc", "a", "--max-age", "0");
	expect_bad("--max-age: '1x' is not a duration", "gc", "a", "--max-age", "1x");
	expect_bad("--limit: '8X' is not a size", "gc", "a", "--limit", "8X");
	expect_bad("--limit: missing value", "gc", "a", "--limit", NULL);
	expect_bad("--json: takes no value", "ls", "a", "--json=1", NULL);

	struct res r = run_tool("--help", NULL);
	CHECK(r.rc == 0 && strstr(r.out, "usage: flare records ls DIR"));
	res_free(&r);
	r = run_tool("gc", "-h", NULL);
	CHECK(r.rc == 0 && strstr(r.out, "--max-age"));
	res_free(&r);
	r = run_tool("ls", "/nonexistent/records/dir", NULL);
	CHECK(r.rc == 1 && strstr(r.err, "no such directory"));
	res_free(&r);
	/* --limit=SIZE and --max-age=D forms. */
	char *empty = test_mkdtemp("args");
	r = run_tool("gc", empty, "--limit=1GiB", "--max-age=2h", "--dry-run", NULL);
	CHECKF(r.rc == 0, "%s", r.err);
	res_free(&r);
	test_rmtree(empty);
	free(empty);
}

/* ---- consistency with the disk thread --------------------------------------------------- */

struct store {
	struct eos_dirlock lk;
	sel_disk *d;
};

static void store_open(struct fx *f, struct store *s)
{
	CHECK_OK(sel_record_dir_open(f->base, &f->ns, &s->lk));
	struct sel_disk_config cfg = {.dirfd = s->lk.fd, .dir = f->dir, .ns = &f->ns, .direct = -1};
	CHECK_OK(sel_disk_create(&cfg, &s->d));
}

static void store_close(struct store *s)
{
	CHECK_OK(sel_disk_close(s->d, 0));
	sel_disk_destroy(s->d);
	eos_dirlock_release(&s->lk);
}

/* Read the whole record (every page, the row when the file has it) with
 * the disk thread, as a restore would: its status. */
static int store_read(struct fx *f, const sel_record_desc *d, bool row)
{
	struct store s;
	struct payload dst;
	payload_alloc(f, d, &dst, false);
	store_open(f, &s);
	struct sel_disk_job j = {.id = 1,
				 .op = SEL_DISK_READ,
				 .rec = *d,
				 .pages = dst.pages,
				 .row = row,
				 .row_iov = row ? dst.iov : NULL,
				 .row_n = row ? (uint32_t)dst.n_iov : 0};
	CHECK_OK(sel_disk_submit(s.d, &j));
	struct sel_disk_job *got = NULL;
	struct pollfd pfd = {.fd = sel_disk_fd(s.d), .events = POLLIN};
	for (int tries = 0; tries < 600 && !got; tries++) {
		poll(&pfd, 1, 100);
		if (sel_disk_poll(s.d, &got, 1) != 1)
			got = NULL;
	}
	CHECK(got == &j);
	store_close(&s);
	payload_free(&dst);
	return j.status;
}

/* The tool's verdict on one file: the kind, or NULL when clean. */
static char *tool_verdict(struct fx *f, const sel_record_desc *d)
{
	char name[SEL_RECORD_NAME_MAX];
	name_of(d, name);
	struct res r = run_tool("verify", f->dir, "--json", NULL);
	CHECK(r.rc == 0 || r.rc == 1);
	const char *k = problem_kind(&r, name);
	char *out = k ? strdup(k) : NULL;
	CHECK((r.rc == 1) == (jint(r.j, "problems") > 0));
	res_free(&r);
	return out;
}

static void test_consistency(uint32_t ranks)
{
	struct fx f;
	fx_init(&f, ranks);
	uint32_t pt = f.t.g.page_tokens;
	sel_record_desc d = mk(&f, 6 * pt, NULL);
	if (ranks > 1)
		d.flags = SEL_RECORD_PAGES_REPLICATED | SEL_RECORD_ROW_REPLICATED;
	sel_record_span s;
	CHECK_OK(sel_record_span_of(&f.ns.layout.sz, &d, &s));
	struct payload src;
	payload_alloc(&f, &d, &src, true);
	char p[PATH_MAX];
	path_of(&f, &d.key, p, sizeof p);

	/* Clean: both accept. */
	write_payload(&f, &d, true, &src);
	CHECK_OK(store_read(&f, &d, true));
	CHECK(tool_verdict(&f, &d) == NULL);

	/* test_disk.c's corruptions: both reject. */
	const uint64_t offs[] = {s.page_off + 2 * s.page_stride + 77, s.row_off + 5,
				 s.cksum_off + 8 * 4 + 3, 90};
	for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
		write_payload(&f, &d, true, &src);
		test_flip_byte(p, offs[i]);
		CHECK_RC(store_read(&f, &d, true), SEL_ECORRUPT);
		char *k = tool_verdict(&f, &d);
		CHECKF(k, "verify missed the flip at %" PRIu64, offs[i]);
		free(k);
	}
	for (int i = 0; i < 4; i++) {
		write_payload(&f, &d, true, &src);
		test_flip_byte(p, test_rng_below(&rng, 4096));
		CHECK_RC(store_read(&f, &d, true), SEL_ECORRUPT);
		char *k = tool_verdict(&f, &d);
		CHECK(k);
		free(k);
	}
	write_payload(&f, &d, true, &src);
	CHECK(truncate(p, (off_t)s.row_off - 4096) == 0);
	CHECK_RC(store_read(&f, &d, false), SEL_ECORRUPT);
	char *k = tool_verdict(&f, &d);
	CHECK(k && !strcmp(k, "size"));
	free(k);

	/* Any single byte: the same verdict.  (Padding the checksums do not
	 * cover -- after the checksum entries, after each row -- is accepted
	 * by both.) */
	int rounds = test_soak() ? 200 : 24, rejected = 0;
	for (int i = 0; i < rounds; i++) {
		write_payload(&f, &d, true, &src);
		uint64_t off = i % 4 == 0 ? s.row_off + test_rng_below(&rng, s.row_bytes)
					  : test_rng_below(&rng, s.row_end);
		test_flip_byte(p, off);
		int st = store_read(&f, &d, true);
		CHECK(st == 0 || st == SEL_ECORRUPT);
		k = tool_verdict(&f, &d);
		CHECKF((st != 0) == (k != NULL),
		       "byte %" PRIu64 " of %" PRIu64 ": store %d, verify %s", off, s.row_end, st,
		       k ? k : "clean");
		rejected += k != NULL;
		free(k);
	}
	CHECK(rejected > 0);

	/* Renamed and orphaned: the startup scan refuses them, and verify. */
	write_payload(&f, &d, true, &src);
	sel_record_desc child = mk(&f, 9 * pt, &d);
	write_rec(&f, &child, true, 10);
	sel_key other;
	test_key(&rng, d.key.consumed, &other);
	char to[PATH_MAX];
	CHECK(rename(p, path_of(&f, &other, to, sizeof to)) == 0);
	{
		struct eos_dirlock lk;
		sel_scan sc;
		CHECK_OK(sel_record_dir_open(f.base, &f.ns, &lk));
		struct sel_scan_opts so = {.dry_run = true};
		CHECK_OK(sel_record_scan(lk.fd, &f.ns, &so, &sc));
		CHECK(sc.st.bad_name == 1 && sc.st.orphans == 1 && sc.n == 0);
		sel_scan_free(&sc);
		eos_dirlock_release(&lk);
	}
	struct res r = run_tool("verify", f.dir, "--json", NULL);
	char on[SEL_RECORD_NAME_MAX], cn[SEL_RECORD_NAME_MAX];
	sel_record_name(&other, on);
	name_of(&child, cn);
	CHECK(r.rc == 1 && !strcmp(problem_kind(&r, on), "name"));
	CHECK(!strcmp(problem_kind(&r, cn), "orphan"));
	res_free(&r);
	payload_free(&src);
	fx_free(&f);
}

/* ---- the binary ---------------------------------------------------------------------------- */

static void test_binary(void)
{
	const char *b = getenv("SELENE_BUILD");
	char flare[PATH_MAX];
	if (!b || snprintf(flare, sizeof flare, "%s/flare", b) >= (int)sizeof flare ||
	    access(flare, X_OK) != 0) {
		printf("note: no $SELENE_BUILD/flare: binary checks skipped\n");
		return;
	}
	struct fx f;
	fx_init(&f, 1);
	sel_record_desc a = mk(&f, 256, NULL);
	write_rec(&f, &a, true, 10);
	char cmd[3 * PATH_MAX], outp[PATH_MAX];
	char *tmpd = test_mkdtemp("bin");
	snprintf(outp, sizeof outp, "%s/out", tmpd);

	CHECK(snprintf(cmd, sizeof cmd, "'%s' records ls '%s' --json > '%s' 2>&1", flare, f.base,
		       outp) < (int)sizeof cmd);
	int st = system(cmd);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	json_error_t je;
	json_t *j = json_load_file(outp, 0, &je);
	CHECKF(j, "%s", je.text);
	CHECK(!strcmp(jstr(j, "command"), "ls"));
	json_decref(j);

	CHECK(snprintf(cmd, sizeof cmd, "'%s' records --help > '%s' 2>&1", flare, outp) <
	      (int)sizeof cmd);
	st = system(cmd);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(snprintf(cmd, sizeof cmd, "'%s' records gc '%s' --max-age 0 > '%s' 2>&1", flare,
		       f.base, outp) < (int)sizeof cmd);
	st = system(cmd);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	char path[PATH_MAX];
	test_flip_byte(path_of(&f, &a.key, path, sizeof path), 9000); /* page 0 */
	CHECK(snprintf(cmd, sizeof cmd, "'%s' records verify '%s' > '%s' 2>&1", flare, f.dir,
		       outp) < (int)sizeof cmd);
	st = system(cmd);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	test_rmtree(tmpd);
	free(tmpd);
	fx_free(&f);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	test_lock(); /* forks: first, before any thread */
	test_args();
	test_ls();
	test_stat();
	test_verify();
	test_gc_age();
	test_gc_limit();
	test_gc_expired_parent_after_limit();
	test_gc_random();
	test_consistency(1);
	test_consistency(2);
	test_binary();
	printf("test_flare_records: ok\n");
	return 0;
}
