/*
 * test_core.c - the core file: parser, canonical form, model identity, row
 * layout, shipped cores and the geometry a model built from them presents
 * (docs/core-format.md, design 2.1).
 */
#include <dirent.h>
#include <limits.h>
#include <unistd.h>

#include "helios/core.h"
#include "helios/model.h"
#include "testutil.h"

/* ---- helpers ------------------------------------------------------------- */

/* The source tree (testutil.h). */
static const char *srcdir(void) { return test_srcdir(); }

static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	CHECKF(f, "%s: %s", path, strerror(errno));
	char *b = malloc(1 << 20);
	CHECK(b);
	*len = fread(b, 1, (1 << 20) - 1, f);
	b[*len] = 0;
	fclose(f);
	return b;
}

static hel_core *parse_ok(const char *text)
{
	hel_core *c;
	char err[512];
	int rc = hel_core_parse(text, strlen(text), "t.core", &c, err, sizeof err);
	CHECKF(rc == 0, "parse failed: %s\n--- text ---\n%s", err, text);
	return c;
}

static void identity_of(const char *text, uint8_t id[32])
{
	hel_core *c = parse_ok(text);
	memcpy(id, c->identity, 32);
	hel_core_free(c);
}

/* Expect a failure whose message starts "t.core:<line>: <field>: " and
 * contains needle. */
static void expect_error(const char *text, unsigned line, const char *field, const char *needle)
{
	hel_core *c = (hel_core *)1;
	char err[512], want[128];
	int rc = hel_core_parse(text, strlen(text), "t.core", &c, err, sizeof err);
	CHECKF(rc == SEL_EFORMAT, "rc %d for:\n%s", rc, text);
	CHECK(c == NULL);
	snprintf(want, sizeof want, "t.core:%u: %s: ", line, field);
	CHECKF(strncmp(err, want, strlen(want)) == 0, "message '%s' does not start '%s'", err,
	       want);
	CHECKF(strstr(err, needle), "message '%s' lacks '%s'", err, needle);
	CHECKF(strcmp(sel_errmsg(), err) == 0, "sel_errmsg '%s' differs", sel_errmsg());
}

/* A small valid core; line numbers below refer to it. */
static const char *BASE = "name = t\n"                    /* 1 */
			  "page_tokens = 64\n"            /* 2 */
			  "ranks = 2\n"                   /* 3 */
			  "vocab = 300\n"                 /* 4 */
			  "hidden = 16\n"                 /* 5 */
			  "layers = 1\n"                  /* 6 */
			  "seed = 7\n"                    /* 7 */
			  "max_context = 1024\n"          /* 8 */
			  "state_modes = ordinary copy\n" /* 9 */
			  "\n"                            /* 10 */
			  "[row]\n"                       /* 11 */
			  "recurrent_bytes = 64\n"        /* 12 */
			  "recurrent_shard = split\n"     /* 13 */
			  "draft_history = 16\n"          /* 14 */
			  "\n"                            /* 15 */
			  "[plane k]\n"                   /* 16 */
			  "token_bytes = 16\n"            /* 17 */
			  "shard = split\n"               /* 18 */
			  "\n"                            /* 19 */
			  "[plane s]\n"                   /* 20 */
			  "token_bytes = 8\n"             /* 21 */
			  "shard = replicated\n"          /* 22 */
			  "\n"                            /* 23 */
			  "[draft_plane d]\n"             /* 24 */
			  "token_bytes = 8\n"             /* 25 */
			  "shard = replicated\n";         /* 26 */

/* text with line `line` (1-based) replaced by repl (a whole line with its
 * newline, or "" to delete it).  Results live in rotating static buffers. */
static char *edit(const char *text, unsigned line, const char *repl)
{
	static char bufs[4][4096];
	static int next;
	char *buf = bufs[next++ % 4];
	const char *p = text;
	size_t k = 0;
	for (unsigned ln = 1; *p; ln++) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
		if (ln == line) {
			k += (size_t)snprintf(buf + k, 4096 - k, "%s", repl);
		} else {
			memcpy(buf + k, p, n);
			k += n;
		}
		p += n;
	}
	buf[k] = 0;
	return buf;
}

static char *with_line(unsigned line, const char *repl) { return edit(BASE, line, repl); }

/* BASE without its [draft_plane] section (lines 1..23). */
static char *without_draft(void)
{
	static char buf[4096];
	snprintf(buf, sizeof buf, "%s", BASE);
	*strstr(buf, "[draft_plane d]") = 0;
	return buf;
}

static char *with_extra(const char *tail)
{
	static char buf[4096];
	snprintf(buf, sizeof buf, "%s%s", BASE, tail);
	return buf;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_base_fields(void)
{
	hel_core *c = parse_ok(BASE);
	CHECK(strcmp(c->name, "t") == 0);
	CHECK(c->page_tokens == 64 && c->ranks == 2 && c->vocab == 300 && c->hidden == 16);
	CHECK(c->layers == 1 && c->seed == 7 && c->max_context == 1024);
	CHECK(c->modes == (1u << SEL_MODE_ORDINARY | 1u << SEL_MODE_COPY));
	CHECK(hel_core_supports(c, SEL_MODE_COPY) && !hel_core_supports(c, SEL_MODE_LEARNED));
	CHECK(c->n_planes == 2 && c->n_drafts == 1);
	CHECK(strcmp(c->planes[0].name, "k") == 0 && c->planes[0].token_bytes == 16);
	CHECK(c->planes[0].shard == HEL_SHARD_SPLIT && c->planes[1].shard == HEL_SHARD_REPLICATED);
	CHECK(strcmp(c->drafts[0].name, "d") == 0 && c->drafts[0].draft);
	CHECK(c->recurrent_bytes == 64 && c->recurrent_shard == HEL_SHARD_SPLIT);
	CHECK(c->draft_history == 16);
	CHECK(hel_plane_unit_bytes(c, &c->planes[0]) == 64 * 16);
	CHECK(hel_core_page_bytes(c, SEL_MODE_ORDINARY) == 64 * 24);
	CHECK(hel_core_page_bytes(c, SEL_MODE_COPY) == 64 * 32);

	/* Row layout: contiguous regions in the documented order. */
	hel_row_layout o, s;
	CHECK_OK(hel_core_row_layout(c, SEL_MODE_ORDINARY, &o));
	CHECK(o.consumed == 0 && o.hidden == 8 && o.hidden_bytes == 64);
	CHECK(o.recurrent == 72 && o.recurrent_bytes == 64);
	CHECK(o.partial == 136 && o.partial_bytes == 64 * 24);
	CHECK(o.draft_history_bytes == 0 && o.draft_hidden_bytes == 0 &&
	      o.draft_partial_bytes == 0);
	CHECK(o.bytes == 136 + 64 * 24);
	CHECK_OK(hel_core_row_layout(c, SEL_MODE_COPY, &s));
	CHECK(s.partial == o.partial && s.draft_history == o.bytes && s.draft_history_bytes == 64);
	CHECK(s.draft_hidden == s.draft_history + 64 && s.draft_hidden_bytes == 64);
	CHECK(s.draft_partial == s.draft_hidden + 64 && s.draft_partial_bytes == 64 * 8);
	CHECK(s.bytes == s.draft_partial + 64 * 8 && s.bytes % 8 == 0);
	CHECK_RC(hel_core_row_layout(c, SEL_MODE_LEARNED, &s), -EINVAL);

	/* The canonical text is a core with the same identity. */
	hel_core *c2 = parse_ok(c->canonical);
	CHECK(memcmp(c->identity, c2->identity, 32) == 0);
	CHECK(c2->canonical_len == c->canonical_len &&
	      memcmp(c2->canonical, c->canonical, c->canonical_len) == 0);
	hel_core_free(c2);
	hel_core_free(c);

	/* Defaults: no state_modes means ordinary only. */
	c = parse_ok("name=x\npage_tokens=128\nranks=1\nvocab=259\nhidden=8\nlayers=1\nseed=0\n"
		     "max_context=128\n[row]\nrecurrent_bytes=0\nrecurrent_shard=replicated\n"
		     "[plane a]\ntoken_bytes=8\nshard=split\n");
	CHECK(c->modes == 1u << SEL_MODE_ORDINARY && c->n_drafts == 0 && c->draft_history == 0);
	hel_core_free(c);
}

static void test_identity(void)
{
	uint8_t base[32], id[32];
	identity_of(BASE, base);

	/* Comments, blank lines, whitespace, units, hex, order: no change. */
	const char *same = "# a comment line\n"
			   "\n"
			   "   [draft_plane   d ]   # drafts first\n"
			   "shard=replicated\n"
			   "token_bytes = 8B\n"
			   "[plane s]\r\n"
			   "\tshard = replicated\t\r\n"
			   "token_bytes = 8\n"
			   "[row]\n"
			   "draft_history = 16\n"
			   "recurrent_shard = split # trailing\n"
			   "recurrent_bytes = 64 b\n"
			   "[plane k]\n"
			   "token_bytes = 16\n"
			   "shard = split\n";
	char buf[2048];
	snprintf(buf, sizeof buf,
		 "seed = 0x7\nmax_context = 0x400\nstate_modes = copy, ordinary\nlayers = 1\n"
		 "hidden = 16\nvocab = 300\nranks = 2\npage_tokens = 64\nname = t\n%s",
		 same);
	identity_of(buf, id);
	CHECK(memcmp(base, id, 32) == 0);

	/* Every semantic field changes it, and each change differently. */
	static const struct {
		unsigned line;
		const char *repl;
	} edits[] = {
		{1, "name = u\n"},
		{2, "page_tokens = 128\n"},
		{3, "ranks = 1\n"},
		{4, "vocab = 301\n"},
		{5, "hidden = 24\n"},
		{6, "layers = 2\n"},
		{7, "seed = 8\n"},
		{8, "max_context = 1025\n"},
		{9, "state_modes = ordinary copy learned\n"},
		{9, "state_modes = copy\n"},
		{12, "recurrent_bytes = 72\n"},
		{13, "recurrent_shard = replicated\n"},
		{14, "draft_history = 24\n"},
		{16, "[plane k2]\n"},
		{17, "token_bytes = 24\n"},
		{18, "shard = replicated\n"},
		{21, "token_bytes = 16\n"},
		{22, "shard = split\n"},
		{24, "[draft_plane d2]\n"},
		{25, "token_bytes = 16\n"},
		{26, "shard = split\n"},
		{20, "[draft_plane s]\n"}, /* a plane becoming a draft plane */
	};
	size_t n = sizeof edits / sizeof edits[0];
	uint8_t(*ids)[32] = calloc(n, 32);
	for (size_t i = 0; i < n; i++) {
		identity_of(with_line(edits[i].line, edits[i].repl), ids[i]);
		CHECKF(memcmp(ids[i], base, 32) != 0, "edit %zu left the identity unchanged", i);
		for (size_t j = 0; j < i; j++)
			CHECKF(memcmp(ids[i], ids[j], 32) != 0, "edits %zu and %zu collide", i, j);
	}
	/* An added plane changes it too. */
	identity_of(with_extra("[plane z]\ntoken_bytes = 8\nshard = split\n"), id);
	CHECK(memcmp(id, base, 32) != 0);
	free(ids);

	/* Known answer for the built-in core: pins the canonical encoding. */
	hel_core *c;
	CHECK_OK(hel_core_builtin(&c));
	char hex[65];
	sel_hex(c->identity, 32, hex);
	printf("tiny identity %s\n", hex);
	CHECK(strcmp(c->name, "tiny") == 0);
	hel_core_free(c);
}

static void test_errors(void)
{
	/* Values. */
	expect_error(with_line(17, "token_bytes = 12X\n"), 17, "token_bytes",
		     "'12X' is not a size");
	expect_error(with_line(17, "token_bytes = 12\n"), 17, "token_bytes", "12 is out of range");
	expect_error(with_line(17, "token_bytes = 1.5KiB\n"), 17, "token_bytes", "is not a size");
	expect_error(with_line(17, "token_bytes = 32MiB\n"), 17, "token_bytes", "out of range");
	expect_error(with_line(17, "token_bytes = 99999999999999999999\n"), 17, "token_bytes",
		     "too large");
	expect_error(with_line(17, "token_bytes = 17179869184GiB\n"), 17, "token_bytes",
		     "too large");
	expect_error(with_line(2, "page_tokens = 100\n"), 2, "page_tokens", "100 is out of range");
	expect_error(with_line(2, "page_tokens = 8192\n"), 2, "page_tokens", "out of range");
	expect_error(with_line(2, "page_tokens = 64KiB\n"), 2, "page_tokens", "is not a number");
	expect_error(with_line(3, "ranks = 0\n"), 3, "ranks", "0 is out of range");
	expect_error(with_line(3, "ranks = 65\n"), 3, "ranks", "out of range");
	expect_error(with_line(4, "vocab = 258\n"), 4, "vocab", "258 is out of range");
	expect_error(with_line(5, "hidden = 12\n"), 5, "hidden", "out of range");
	expect_error(with_line(6, "layers = 0\n"), 6, "layers", "out of range");
	expect_error(with_line(7, "seed = -1\n"), 7, "seed", "'-1' is not a number");
	expect_error(with_line(7, "seed = 0x\n"), 7, "seed", "is not a number");
	expect_error(with_line(7, "seed = 0x1ffffffffffffffff\n"), 7, "seed", "too large");
	expect_error(with_line(8, "max_context = 32\n"), 8, "max_context", "out of range");
	expect_error(with_line(8, "max_context = 99999999\n"), 8, "max_context", "out of range");
	expect_error(with_line(1, "name = a b\n"), 1, "name", "is not a name");
	expect_error(with_line(9, "state_modes = ordinary fast\n"), 9, "state_modes",
		     "'fast' is not a state mode");
	expect_error(with_line(9, "state_modes = copy copy\n"), 9, "state_modes", "listed twice");
	expect_error(with_line(9, "state_modes = ,\n"), 9, "state_modes", "no state mode");
	expect_error(with_line(13, "recurrent_shard = sharded\n"), 13, "recurrent_shard",
		     "not a shard kind");
	expect_error(with_line(18, "shard = both\n"), 18, "shard", "not a shard kind");
	expect_error(with_line(12, "recurrent_bytes = 20\n"), 12, "recurrent_bytes",
		     "out of range");
	expect_error(with_line(14, "draft_history = 4\n"), 14, "draft_history", "out of range");
	/* Cross-field ranges. */
	expect_error(with_line(2, "page_tokens = 2048\n"), 8, "max_context",
		     "less than page_tokens");
	expect_error(edit(with_line(4, "vocab = 65536\n"), 5, "hidden = 512\n"), 5, "hidden",
		     "weights per matrix");
	{
		/* 4096-token pages of 16 MiB per token: a 64 GiB partial page. */
		char *t = with_line(2, "page_tokens = 4096\n");
		t = edit(t, 8, "max_context = 8192\n");
		t = edit(t, 12, "recurrent_bytes = 16GiB\n");
		t = edit(t, 17, "token_bytes = 16MiB\n");
		expect_error(t, 17, "token_bytes", "exceed 64 GiB");
	}

	/* Keys and sections. */
	expect_error(with_line(10, "colour = blue\n"), 10, "colour", "unknown key");
	expect_error(with_line(15, "colour = blue\n"), 15, "colour", "unknown key in [row]");
	expect_error(with_line(19, "colour = blue\n"), 19, "colour", "unknown key in a [plane]");
	expect_error(with_line(10, "token_bytes = 8\n"), 10, "token_bytes", "belongs in a [plane]");
	expect_error(with_line(19, "recurrent_bytes = 8\n"), 19, "recurrent_bytes",
		     "belongs in [row]");
	expect_error(with_line(15, "seed = 1\n"), 15, "seed", "belongs in the top of the file");
	expect_error(with_line(10, "name = u\n"), 10, "name", "set twice (first on line 1)");
	expect_error(with_line(19, "shard = split\n"), 19, "shard", "set twice (first on line 18)");
	expect_error(with_line(10, "[colours]\n"), 10, "[section]", "'colours' is not a section");
	expect_error(with_line(10, "[]\n"), 10, "[]", "empty section");
	expect_error(with_line(10, "[row\n"), 10, "syntax", "closing ']'");
	expect_error(with_line(15, "[row]\n"), 15, "[row]", "repeated (first on line 11)");
	expect_error(with_line(11, "[row x]\n"), 11, "[row]", "takes no name");
	expect_error(with_line(16, "[plane]\n"), 16, "[plane]", "missing plane name");
	expect_error(with_line(16, "[plane k x]\n"), 16, "[plane]", "unexpected 'x'");
	expect_error(with_line(16, "[plane k/0]\n"), 16, "[plane]", "is not a name");
	expect_error(with_line(20, "[plane k]\n"), 20, "[plane]", "already declared on line 16");
	expect_error(with_line(24, "[draft_plane k]\n"), 24, "[draft_plane]",
		     "already declared on line 16");
	expect_error(with_line(10, "just words\n"), 10, "syntax", "is not 'key = value'");
	expect_error(with_line(10, "Name = x\n"), 10, "syntax", "is not a key");
	expect_error(with_line(10, " = x\n"), 10, "syntax", "is not a key");
	expect_error(with_line(1, "name =   # nothing\n"), 1, "name", "missing value");

	/* Missing things: top-level fields at the last line, section fields
	 * at their section's header. */
	expect_error(with_line(4, ""), 25, "vocab", "missing (required)");
	expect_error(with_line(1, ""), 25, "name", "missing (required)");
	expect_error(with_line(12, ""), 11, "recurrent_bytes", "missing in [row]");
	expect_error(with_line(13, ""), 11, "recurrent_shard", "missing in [row]");
	expect_error(with_line(14, ""), 11, "draft_history", "required by speculative");
	expect_error(with_line(17, ""), 16, "token_bytes", "missing in [plane k]");
	expect_error(with_line(26, ""), 24, "shard", "missing in [draft_plane d]");
	expect_error("name = t\npage_tokens = 64\nranks = 1\nvocab = 300\nhidden = 16\nlayers = 1\n"
		     "seed = 7\nmax_context = 1024\n[plane a]\ntoken_bytes=8\nshard=split\n",
		     11, "[row]", "missing section");
	expect_error(
		"name = t\npage_tokens = 64\nranks = 1\nvocab = 300\nhidden = 16\nlayers = 1\n"
		"seed = 7\nmax_context = 1024\n[row]\nrecurrent_bytes=0\nrecurrent_shard=split\n",
		11, "[plane]", "no page planes");
	expect_error("", 1, "name", "missing (required)");

	/* Speculative consistency. */
	expect_error(edit(without_draft(), 9, "state_modes = ordinary\n"), 14, "draft_history",
		     "only meaningful with a speculative");
	expect_error(edit(with_line(9, "state_modes = ordinary\n"), 14, ""), 23, "[draft_plane]",
		     "need a speculative state mode");
	expect_error(without_draft(), 9, "state_modes", "at least one [draft_plane");

	/* Bytes no text file has. */
	{
		static const char buf[] = "name = t\n\0page_tokens = 64\n";
		hel_core *c;
		char err[256];
		CHECK_RC(hel_core_parse(buf, sizeof buf - 1, "t.core", &c, err, sizeof err),
			 SEL_EFORMAT);
		CHECKF(strstr(err, "t.core:2: syntax: NUL byte"), "%s", err);
	}
	/* Long values are shortened in messages, never overflow. */
	{
		char buf[4096], longv[1500];
		memset(longv, 'x', sizeof longv - 1);
		longv[sizeof longv - 1] = 0;
		snprintf(buf, sizeof buf, "name = %s\n", longv);
		expect_error(buf, 1, "name", "...' is not a name");
		char err[40];
		hel_core *c;
		CHECK_RC(hel_core_parse(buf, strlen(buf), "t.core", &c, err, sizeof err),
			 SEL_EFORMAT);
		CHECK(strlen(err) == sizeof err - 1);
	}
}

static void test_load_and_builtin(void)
{
	char path[PATH_MAX + 64], err[512];
	hel_core *c = NULL, *b = NULL;
	size_t len;

	snprintf(path, sizeof path, "%s/cores/tiny.core", srcdir());
	char *text = read_all(path, &len);
	CHECKF(len == strlen(hel_core_builtin_text()) &&
		       memcmp(text, hel_core_builtin_text(), len) == 0,
	       "cores/tiny.core and the compiled-in core differ");
	free(text);
	CHECK_OK(hel_core_load(path, &c, err, sizeof err));
	CHECK_OK(hel_core_builtin(&b));
	CHECK(memcmp(c->identity, b->identity, 32) == 0);
	CHECK(hel_core_supports(b, SEL_MODE_ORDINARY) && hel_core_supports(b, SEL_MODE_COPY) &&
	      hel_core_supports(b, SEL_MODE_LEARNED));
	hel_core_free(c);
	hel_core_free(b);

	CHECK_RC(hel_core_load("/nonexistent/x.core", &c, err, sizeof err), -ENOENT);
	CHECK(c == NULL && strstr(err, "/nonexistent/x.core"));
	/* Messages of a loaded file name its path. */
	char *dir = test_mkdtemp("core");
	snprintf(path, sizeof path, "%s/bad.core", dir);
	FILE *f = fopen(path, "w");
	CHECK(f);
	fputs("name = x\nranks = lots\n", f);
	fclose(f);
	CHECK_RC(hel_core_load(path, &c, err, sizeof err), SEL_EFORMAT);
	char want[PATH_MAX + 200];
	snprintf(want, sizeof want, "%s:2: ranks: 'lots' is not a number", path);
	CHECKF(strncmp(err, want, strlen(want)) == 0, "%s", err);
	test_rmtree(dir);
	free(dir);
}

/* The geometry a model of core c presents through sel_geometry_build. */
static void check_geometry(const hel_core *c, sel_state_mode mode)
{
	hel_model *m;
	hel_model_opts o = {.mode = mode, .pages = 3, .rows = 2};
	CHECK_OK(hel_model_create(c, &o, &m));
	sel_geometry *g;
	CHECK_OK(hel_model_geometry(m, &g));
	hel_row_layout lay;
	CHECK_OK(hel_core_row_layout(c, mode, &lay));
	uint32_t nplanes = c->n_planes + (mode == SEL_MODE_ORDINARY ? 0 : c->n_drafts);
	CHECK(g->ranks == c->ranks && g->page_tokens == c->page_tokens);
	CHECK(hel_model_plane_count(m) == nplanes);
	for (uint32_t r = 0; r < c->ranks; r++) {
		const sel_rank_geometry *rg = &g->rank[r];
		CHECK(rg->n_planes == nplanes && rg->page_count == 3 && rg->row_count == 2);
		CHECK(strcmp(rg->row.name, "row") == 0 && rg->row.unit_bytes == lay.bytes);
		CHECK(rg->row.kind == SEL_MEM_HOST);
		CHECK(rg->row.address == (uint64_t)(uintptr_t)hel_model_row_ptr(m, r, 0));
		CHECK(rg->page_bytes == hel_core_page_bytes(c, mode));
		/* Every active plane appears once, with its unit size; the
		 * geometry orders them by name. */
		for (uint32_t p = 0; p < nplanes; p++) {
			const hel_core_plane *cp = hel_model_plane(m, p);
			uint32_t found = 0;
			for (uint32_t i = 0; i < rg->n_planes; i++)
				if (strcmp(rg->pages[i].name, cp->name) == 0) {
					found++;
					CHECK(rg->pages[i].unit_bytes ==
					      hel_plane_unit_bytes(c, cp));
					CHECK(rg->pages[i].address ==
					      (uint64_t)(uintptr_t)hel_model_page_ptr(m, r, p, 0));
				}
			CHECK(found == 1);
		}
		for (uint32_t i = 1; i < rg->n_planes; i++)
			CHECK(strcmp(rg->pages[i - 1].name, rg->pages[i].name) < 0);
	}
	sel_geometry_free(g);
	hel_model_destroy(m);
}

static uint64_t row_slots(const hel_core *c, sel_state_mode mode)
{
	hel_row_layout lay;
	CHECK_OK(hel_core_row_layout(c, mode, &lay));
	uint64_t rec = hel_core_page_bytes(c, mode);
	return (lay.bytes + rec - 1) / rec;
}

static void test_shipped(void)
{
	char dir[PATH_MAX + 16];
	snprintf(dir, sizeof dir, "%s/cores", srcdir());
	DIR *d = opendir(dir);
	CHECKF(d, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	int n = 0;
	bool seen_qwen = false, seen_deepseek = false;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l < 6 || strcmp(e->d_name + l - 5, ".core"))
			continue;
		char path[PATH_MAX + 300], err[512];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		hel_core *c;
		int rc = hel_core_load(path, &c, err, sizeof err);
		CHECKF(rc == 0, "%s", err);
		n++;
		/* The name is the file name. */
		CHECKF(strlen(c->name) == l - 5 && strncmp(c->name, e->d_name, l - 5) == 0, "%s",
		       path);
		uint64_t slots = row_slots(c, SEL_MODE_ORDINARY);
		hel_row_layout lay;
		CHECK_OK(hel_core_row_layout(c, SEL_MODE_ORDINARY, &lay));
		printf("%-24s ranks %u planes %3u+%u page record %8llu B row %10llu B (%llu slots)\n",
		       e->d_name, c->ranks, c->n_planes, c->n_drafts,
		       (unsigned long long)hel_core_page_bytes(c, SEL_MODE_ORDINARY),
		       (unsigned long long)lay.bytes, (unsigned long long)slots);
		if (strncmp(c->name, "qwen", 4) == 0) {
			CHECK(c->n_planes == 36);
			if (strcmp(c->name, "qwen-tp1") == 0) {
				CHECK(slots == 135); /* design 1 */
				seen_qwen = true;
			}
		}
		if (strncmp(c->name, "deepseek", 8) == 0) {
			CHECK(c->n_planes == 122);
			if (strcmp(c->name, "deepseek") == 0) {
				CHECK(slots == 23); /* design 1 */
				seen_deepseek = true;
			}
		}
		/* Realistic plane units are tens to hundreds of KiB. */
		if (!strstr(c->name, "small") && strcmp(c->name, "tiny") != 0) {
			uint64_t biggest = 0;
			for (uint32_t i = 0; i < c->n_planes; i++)
				if (hel_plane_unit_bytes(c, &c->planes[i]) > biggest)
					biggest = hel_plane_unit_bytes(c, &c->planes[i]);
			CHECK(biggest >= 16 * 1024 && biggest <= 1024 * 1024);
		}
		/* Canonical round trip. */
		hel_core *c2 = parse_ok(c->canonical);
		CHECK(memcmp(c->identity, c2->identity, 32) == 0);
		hel_core_free(c2);
		/* Geometry in every mode (the big cores' planes are mapped but
		 * never touched, so this is cheap). */
		for (int mode = 0; mode < 3; mode++)
			if (hel_core_supports(c, (sel_state_mode)mode))
				check_geometry(c, (sel_state_mode)mode);
		hel_core_free(c);
	}
	closedir(d);
	CHECK(n >= 11 && seen_qwen && seen_deepseek);
}

/* Random damage never crashes the parser; whatever it accepts has a
 * canonical form with the same identity. */
static void test_mutations(void)
{
	test_rng rng;
	test_rng_init(&rng, test_seed());
	const char *src = hel_core_builtin_text();
	size_t len = strlen(src);
	char *buf = malloc(len + 64);
	int accepted = 0, runs = 3000;
	for (int i = 0; i < runs; i++) {
		memcpy(buf, src, len);
		size_t n = len;
		int edits = 1 + (int)test_rng_below(&rng, 4);
		for (int k = 0; k < edits; k++) {
			size_t at = test_rng_below(&rng, n);
			switch (test_rng_below(&rng, 4)) {
			case 0: buf[at] ^= (char)(1u << test_rng_below(&rng, 8)); break;
			case 1: buf[at] = "=#[] \n0x9Kk"[test_rng_below(&rng, 11)]; break;
			case 2: n = at; break;
			default:
				memmove(buf + at, buf + at + 1, n - at - 1);
				n--;
				break;
			}
			if (n == 0)
				break;
		}
		hel_core *c;
		char err[256];
		int rc = hel_core_parse(buf, n, "m.core", &c, err, sizeof err);
		if (rc == 0) {
			accepted++;
			hel_core *c2 = parse_ok(c->canonical);
			CHECK(memcmp(c->identity, c2->identity, 32) == 0);
			hel_core_free(c2);
			hel_core_free(c);
		} else {
			CHECK(rc == SEL_EFORMAT && strncmp(err, "m.core:", 7) == 0);
		}
	}
	printf("mutations: %d of %d accepted\n", accepted, runs);
	free(buf);
}

int main(void)
{
	test_base_fields();
	test_identity();
	test_errors();
	test_load_and_builtin();
	test_shipped();
	test_mutations();
	printf("ok\n");
	return 0;
}
