/*
 * recutil.c - see recutil.h.
 */
#include "recutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#define XXH_STATIC_LINKING_ONLY
#include "xxh.h"

#include "internal.h"

void test_geo_rank(struct test_geo *t, uint32_t r, uint32_t n, const uint64_t *units,
		   uint64_t row_bytes)
{
	sel_rank_geometry *rg = &t->rank[r];
	CHECK(r < TG_MAX_RANKS && n <= TG_MAX_PLANES);
	memset(rg, 0, sizeof(*rg));
	rg->row.name = (char *)"state";
	rg->row.unit_bytes = row_bytes;
	rg->row_count = 4;
	rg->pages = t->planes[r];
	rg->n_planes = n;
	rg->page_count = 64;
	for (uint32_t i = 0; i < n; i++) {
		snprintf(t->names[r][i], sizeof t->names[r][i], "p%03u", i % 1000);
		t->planes[r][i].name = t->names[r][i];
		t->planes[r][i].unit_bytes = units[i];
		rg->page_bytes += units[i];
	}
}

void test_geo_init(struct test_geo *t, uint32_t ranks, uint32_t page_tokens, uint32_t n,
		   const uint64_t *units, uint64_t row_bytes)
{
	memset(t, 0, sizeof(*t));
	t->g.ranks = ranks;
	t->g.page_tokens = page_tokens;
	t->g.rank = t->rank;
	for (uint32_t r = 0; r < ranks; r++)
		test_geo_rank(t, r, n, units, row_bytes);
}

void test_ns_init(sel_record_ns *ns, const sel_geometry *g, uint8_t model)
{
	uint8_t mid[SEL_IDENTITY_BYTES], id[SEL_IDENTITY_BYTES];
	memset(mid, model, sizeof mid);
	sel_offload_identity(mid, SEL_MODE_ORDINARY, id);
	CHECK_OK(sel_record_ns_init(ns, g, id));
}

void test_key(test_rng *r, uint64_t consumed, sel_key *k)
{
	k->consumed = consumed;
	test_rng_fill(r, k->digest.b, sizeof k->digest.b);
}

void test_desc(test_rng *r, uint32_t page_tokens, uint64_t c, const sel_key *parent, bool full,
	       sel_record_desc *d)
{
	memset(d, 0, sizeof(*d));
	test_key(r, c, &d->key);
	test_rng_fill(r, d->bucket.b, sizeof d->bucket.b);
	if (parent)
		d->parent = *parent;
	if (!parent || full)
		d->tail = (uint32_t)(c / page_tokens);
	else
		d->tail = (uint32_t)(c / page_tokens - parent->consumed / page_tokens);
}

int test_count_tmp(const char *dir)
{
	DIR *d = opendir(dir);
	CHECKF(d, "opendir %s", dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += sel_record_is_tmp_name(e->d_name);
	closedir(d);
	return n;
}

void test_flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	CHECKF(fd >= 0, "open %s", path);
	uint8_t c;
	CHECK(pread(fd, &c, 1, (off_t)off) == 1);
	c ^= 0x5a;
	CHECK(pwrite(fd, &c, 1, (off_t)off) == 1);
	close(fd);
}

void test_reseal(uint8_t *hdr, uint32_t hb)
{
	CHECK(hb >= 4096 && hb <= SEL_RECORD_HEADER_MAX);
	memset(hdr + 176, 0, 8);
	sel_put_u64(hdr + 176, XXH3_64bits(hdr, hb));
}

/* Open record `name` (flags) and read up to 64 KiB of its header into a
 * new buffer: the descriptor, with the buffer and its length. */
static int header_open(int dirfd, const char *name, int flags, uint8_t **buf, size_t *len)
{
	uint8_t *b = calloc(1, SEL_RECORD_HEADER_MAX);
	CHECK(b);
	int fd = openat(dirfd, name, flags | O_NOFOLLOW | O_CLOEXEC);
	CHECKF(fd >= 0, "open %s: %s", name, strerror(errno));
	ssize_t n = pread(fd, b, SEL_RECORD_HEADER_MAX, 0);
	CHECK(n >= 4096);
	*buf = b;
	*len = (size_t)n;
	return fd;
}

void test_header_edit(int dirfd, const char *name, void (*edit)(uint8_t *hdr, void *ctx), void *ctx)
{
	uint8_t *b;
	size_t n;
	int fd = header_open(dirfd, name, O_RDWR, &b, &n);
	uint32_t version = sel_get_u32(b + 8);
	uint32_t hb = version >= 2 ? sel_get_u32(b + 16) : 4096;
	CHECK(hb <= (uint32_t)n);
	edit(b, ctx);
	if (sel_get_u32(b + 8) >= 2)
		test_reseal(b, hb);
	CHECK(pwrite(fd, b, hb, 0) == (ssize_t)hb);
	close(fd);
	free(b);
}

void test_header_read(int dirfd, const char *name, sel_record_header *h)
{
	uint8_t *b;
	size_t n;
	int fd = header_open(dirfd, name, O_RDONLY, &b, &n);
	CHECK_OK(sel_record_decode(b, n, NULL, h));
	close(fd);
	free(b);
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void tree_hash(XXH3_state_t *st, const char *dir)
{
	DIR *d = opendir(dir);
	CHECKF(d, "opendir %s: %s", dir, strerror(errno));
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (n == cap)
			CHECK((names = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names)));
		CHECK((names[n++] = strdup(e->d_name)));
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof *names, name_cmp);
	for (size_t i = 0; i < n; i++) {
		char p[PATH_MAX];
		struct stat st2;
		snprintf(p, sizeof p, "%s/%s", dir, names[i]);
		CHECK(lstat(p, &st2) == 0);
		XXH3_64bits_update(st, names[i], strlen(names[i]) + 1);
		uint64_t meta[2] = {(uint64_t)st2.st_mode, (uint64_t)st2.st_size};
		XXH3_64bits_update(st, meta, sizeof meta);
		if (S_ISLNK(st2.st_mode)) {
			char t[PATH_MAX];
			ssize_t k = readlink(p, t, sizeof t);
			CHECK(k >= 0);
			XXH3_64bits_update(st, t, (size_t)k);
		} else if (S_ISDIR(st2.st_mode)) {
			tree_hash(st, p);
		} else if (S_ISREG(st2.st_mode)) {
			int fd = open(p, O_RDONLY | O_CLOEXEC);
			CHECK(fd >= 0);
			char buf[65536];
			ssize_t k;
			while ((k = read(fd, buf, sizeof buf)) > 0)
				XXH3_64bits_update(st, buf, (size_t)k);
			close(fd);
		}
		free(names[i]);
	}
	free(names);
}

void test_tree_hash(const char *dir, uint8_t out[16])
{
	XXH3_state_t st;
	XXH3_64bits_reset(&st);
	tree_hash(&st, dir);
	uint64_t h = XXH3_64bits_digest(&st);
	memset(out, 0, 16);
	memcpy(out, &h, sizeof h);
}

struct forged {
	sel_key parent;
	uint64_t check;
};

static void forge(uint8_t *h, void *ctx)
{
	const struct forged *f = ctx;
	sel_put_u64(h + 104, f->parent.consumed);
	memcpy(h + 112, f->parent.digest.b, SEL_DIGEST_BYTES);
	if (f->check)
		sel_put_u64(h + 184, f->check);
}

void test_forge_parent(int dirfd, const char *name, const sel_key *parent, uint64_t check)
{
	struct forged f = {*parent, check};
	test_header_edit(dirfd, name, forge, &f);
}

void test_copy_file(const char *from, const char *to)
{
	int in = open(from, O_RDONLY | O_CLOEXEC);
	int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECKF(in >= 0 && out >= 0, "copy %s to %s: %s", from, to, strerror(errno));
	char buf[65536];
	ssize_t k;
	while ((k = read(in, buf, sizeof buf)) > 0)
		CHECK(write(out, buf, (size_t)k) == k);
	close(in);
	close(out);
}

void test_copy_dir(const char *src, const char *dst)
{
	CHECK(mkdir(dst, 0755) == 0 || errno == EEXIST);
	DIR *d = opendir(src);
	CHECK(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		char a[PATH_MAX], b[PATH_MAX];
		struct stat st;
		snprintf(a, sizeof a, "%s/%s", src, e->d_name);
		snprintf(b, sizeof b, "%s/%s", dst, e->d_name);
		if (lstat(a, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		test_copy_file(a, b);
		struct timespec ts[2] = {st.st_atim, st.st_mtim};
		CHECK(utimensat(AT_FDCWD, b, ts, 0) == 0);
	}
	closedir(d);
}

bool test_has_file(const char *dir, const char *name)
{
	char p[PATH_MAX];
	struct stat st;
	snprintf(p, sizeof p, "%s/%s", dir, name);
	return lstat(p, &st) == 0;
}

struct huge {
	uint32_t tail;
	uint64_t consumed, page_off, row_off;
};

static void claim_tail(uint8_t *h, void *ctx)
{
	const struct huge *x = ctx;
	sel_put_u32(h + 28, x->tail);
	sel_put_u64(h + 80, x->consumed);
	sel_put_u64(h + 144, x->page_off);
	sel_put_u64(h + 152, x->row_off);
}

uint64_t test_make_sparse(int dirfd, const char *name, const sel_record_ns *ns, uint32_t tail,
			  sel_key *key)
{
	sel_record_header h;
	test_header_read(dirfd, name, &h);
	CHECK(sel_key_is_none(&h.d.parent));
	sel_record_desc d = h.d;
	d.tail = tail;
	d.key.consumed = (uint64_t)tail * ns->layout.sz.page_tokens + 1;
	sel_record_span sp;
	CHECK_OK(sel_record_span_of(&ns->layout.sz, &d, &sp));
	char nn[SEL_RECORD_NAME_MAX];
	sel_record_name(&d.key, nn);
	CHECK(renameat(dirfd, name, dirfd, nn) == 0);
	struct huge x = {tail, d.key.consumed, sp.page_off, sp.row_off};
	test_header_edit(dirfd, nn, claim_tail, &x);
	int fd = openat(dirfd, nn, O_RDWR | O_CLOEXEC);
	CHECK(fd >= 0 && ftruncate(fd, (off_t)sp.row_end) == 0);
	close(fd);
	if (key)
		*key = d.key;
	return sp.row_end;
}

void test_record_write(int dirfd, const sel_record_ns *ns, const sel_record_desc *d, bool row)
{
	const sel_record_layout *l = &ns->layout;
	uint64_t stride = l->sz.page_record;
	uint32_t rs = sel_record_row_slots(l, d->flags);
	uint32_t n = d->tail + rs;
	uint8_t *mem = eos_aligned_alloc(4096, (n ? n : 1) * stride);
	test_rng r;
	test_rng_init(&r, d->key.consumed ^ d->key.digest.b[0]);
	test_rng_fill(&r, mem, n * stride);
	void **pages = calloc(d->tail + 1, sizeof(*pages)), **rslots = calloc(rs, sizeof(*rslots));
	for (uint32_t i = 0; i < d->tail; i++)
		pages[i] = mem + i * stride;
	for (uint32_t i = 0; i < rs; i++)
		rslots[i] = mem + (d->tail + i) * stride;
	struct iovec iov[64];
	int pieces = sel_record_row_iov(l, d->flags, rslots, rs, iov, 64);
	CHECK_OK(pieces);
	struct sel_record_write_opts o = {.direct = true};
	CHECK_OK(sel_record_write(dirfd, ns, d, pages, row, iov, (uint32_t)pieces, &o));
	free(pages);
	free(rslots);
	eos_aligned_free(mem);
}
