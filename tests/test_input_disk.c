/*
 * test_input_disk.c - .input record files (src/selene/input_disk.c, design
 * 2.13): atomic writes and verified reads, a restart that finds them again,
 * corrupted, truncated, foreign, linked and non-regular files as misses
 * (removed), the startup scan (temporaries, bounds, others' files left
 * alone), the 4,096-record index bound, the byte budget callback and its
 * reclaim, injected write faults (a temporary that cannot be removed stops
 * writes), and independence from checkpoint records in the same directory.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eos.h"
#include "input_disk.h"
#include "inpututil.h"
#include "recutil.h"
#include "testutil.h"

#define key_of test_input_key
#define make_prepared test_input_prepared

static void make_source(sel_input_rec *r, uint32_t n)
{
	sel_input_source s = {.identity = key_of(n + 1000000),
			      .encoding = 1,
			      .color = 3,
			      .width = 64,
			      .height = 48,
			      .tokens = 12,
			      .grid_h = 3,
			      .grid_w = 4,
			      .prepared_bytes = 4096};
	sel_input_key k = key_of(n);
	CHECK_OK(sel_input_source_init(r, &k, &s, 1));
}

static int count_files(int dirfd, const char *suffix)
{
	int fd = dup(dirfd), n = 0;
	DIR *d = fdopendir(fd);
	rewinddir(d);
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name), s = strlen(suffix);
		if (l >= s && strcmp(e->d_name + l - s, suffix) == 0)
			n++;
	}
	closedir(d);
	return n;
}

static bool exists(int dirfd, const char *name)
{
	struct stat st;
	return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

static void path_of(uint32_t kind, uint32_t n, char out[SEL_INPUT_NAME_LEN])
{
	sel_input_key k = key_of(n);
	sel_input_name(kind, &k, out);
}

static void check(sel_input_disk *d) { CHECK_OK(sel_input_disk_check(d)); }

/* ---- Fault injection ------------------------------------------------------- */

static struct {
	int pwrite, rename, unlink_tmp; /* errno to inject, 0 = pass */
} fault;

static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t off)
{
	if (fault.pwrite) {
		errno = fault.pwrite;
		return -1;
	}
	return pwrite(fd, b, n, off);
}

static int f_renameat(int a, const char *p, int b, const char *q)
{
	if (fault.rename) {
		errno = fault.rename;
		return -1;
	}
	return renameat(a, p, b, q);
}

static int f_unlinkat(int dfd, const char *p, int flags)
{
	if (fault.unlink_tmp && strncmp(p, ".tmp-", 5) == 0) {
		errno = fault.unlink_tmp;
		return -1;
	}
	return unlinkat(dfd, p, flags);
}

static struct eos_fileops faulty;

/* ---- Tests ----------------------------------------------------------------------- */

static void test_round_trip(int dirfd)
{
	sel_input_disk *d;
	struct sel_input_disk_opts o = {.datasync = true, .dir_fsync = true};
	CHECK_OK(sel_input_disk_open(dirfd, &o, &d));
	sel_input_rec p, s, back;
	make_prepared(&p, 1, 5000);
	make_source(&s, 2);
	sel_input_key k1 = key_of(1), k2 = key_of(2);
	CHECK_RC(sel_input_disk_read(d, SEL_INPUT_PREPARED, &k1, &back), -ENOENT);
	CHECK_OK(sel_input_disk_write(d, &p));
	CHECK_OK(sel_input_disk_write(d, &s));
	CHECK_OK(sel_input_disk_write(d, &p)); /* already there: nothing to do */
	check(d);
	CHECK(count_files(dirfd, ".input") == 2);
	CHECK(count_files(dirfd, "") - count_files(dirfd, ".input") == 2); /* . and .. only */
	CHECK(sel_input_disk_contains(d, SEL_INPUT_PREPARED, &k1));
	CHECK(!sel_input_disk_contains(d, SEL_INPUT_SOURCE, &k1));
	CHECK_OK(sel_input_disk_read(d, SEL_INPUT_PREPARED, &k1, &back));
	CHECK(back.len == p.len && memcmp(back.bytes, p.bytes, p.len) == 0);
	sel_input_rec_free(&back);
	sel_input_header h;
	CHECK_OK(sel_input_disk_read_header(d, SEL_INPUT_PREPARED, &k1, &h));
	CHECK(h.count == 1 && h.tensors[0].bytes == 5000 && h.file_bytes == p.len);
	CHECK_OK(sel_input_disk_read(d, SEL_INPUT_SOURCE, &k2, &back));
	CHECK(back.h.src.tokens == 12 && back.h.src.grid_w == 4);
	sel_input_rec_free(&back);
	struct sel_input_disk_stats st;
	sel_input_disk_stats(d, &st);
	CHECK(st.records == 2 && st.bytes == p.len + s.len && st.writes == 2 && st.hits == 3);
	sel_input_disk_close(d);

	/* A restart finds both (a disk hit after a restart). */
	CHECK_OK(sel_input_disk_open(dirfd, &o, &d));
	sel_input_disk_stats(d, &st);
	CHECK(st.records == 2 && st.bytes == p.len + s.len);
	CHECK_OK(sel_input_disk_read(d, SEL_INPUT_PREPARED, &k1, &back));
	CHECK(memcmp(back.bytes, p.bytes, p.len) == 0);
	sel_input_rec_free(&back);
	check(d);
	CHECK_OK(sel_input_disk_remove(d, SEL_INPUT_PREPARED, &k1));
	CHECK_OK(sel_input_disk_remove(d, SEL_INPUT_SOURCE, &k2));
	CHECK_RC(sel_input_disk_remove(d, SEL_INPUT_SOURCE, &k2), -ENOENT);
	CHECK(count_files(dirfd, ".input") == 0);
	sel_input_disk_close(d);
	sel_input_rec_free(&p);
	sel_input_rec_free(&s);
}

/* Write record n, then replace its file with what damage() makes of it;
 * the next read must miss and remove the file. */
static void expect_miss(int dirfd, uint32_t n, void (*damage)(int dirfd, const char *name),
			int want)
{
	sel_input_disk *d;
	CHECK_OK(sel_input_disk_open(dirfd, NULL, &d));
	sel_input_rec p, back;
	make_prepared(&p, n, 3000);
	CHECK_OK(sel_input_disk_write(d, &p));
	char name[SEL_INPUT_NAME_LEN];
	path_of(SEL_INPUT_PREPARED, n, name);
	damage(dirfd, name);
	sel_input_key k = key_of(n);
	int rc = sel_input_disk_read(d, SEL_INPUT_PREPARED, &k, &back);
	CHECKF(rc == want, "record %u: rc %d (%s), want %d", n, rc, sel_errmsg(), want);
	CHECK(strstr(sel_errmsg(), "a miss"));
	CHECK(back.bytes == NULL);
	CHECK(!exists(dirfd, name) && !sel_input_disk_contains(d, SEL_INPUT_PREPARED, &k));
	CHECK_RC(sel_input_disk_read(d, SEL_INPUT_PREPARED, &k, &back), -ENOENT);
	struct sel_input_disk_stats st;
	sel_input_disk_stats(d, &st);
	CHECK(st.invalid == 1 && st.records == 0 && st.bytes == 0);
	check(d);
	/* The original source rebuilds it: write again, read again. */
	CHECK_OK(sel_input_disk_write(d, &p));
	CHECK_OK(sel_input_disk_read(d, SEL_INPUT_PREPARED, &k, &back));
	sel_input_rec_free(&back);
	CHECK_OK(sel_input_disk_remove(d, SEL_INPUT_PREPARED, &k));
	sel_input_disk_close(d);
	sel_input_rec_free(&p);
}

static void flip_at(int dirfd, const char *name, off_t off)
{
	int fd = openat(dirfd, name, O_RDWR);
	uint8_t b;
	CHECK(pread(fd, &b, 1, off) == 1);
	b ^= 0x10;
	CHECK(pwrite(fd, &b, 1, off) == 1);
	close(fd);
}

static void flip_payload(int dirfd, const char *name) { flip_at(dirfd, name, 1000); }

static void flip_header(int dirfd, const char *name) { flip_at(dirfd, name, 40); }

static void truncate_it(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDWR);
	CHECK(ftruncate(fd, 1500) == 0);
	close(fd);
}

static void extend_it(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDWR);
	struct stat st;
	fstat(fd, &st);
	CHECK(pwrite(fd, "x", 1, st.st_size) == 1);
	close(fd);
}

/* Another record's bytes under this name: a foreign file. */
static void foreign(int dirfd, const char *name)
{
	sel_input_rec o;
	make_prepared(&o, 777, 3000);
	int fd = openat(dirfd, name, O_WRONLY | O_TRUNC);
	CHECK(write(fd, o.bytes, o.len) == (ssize_t)o.len);
	close(fd);
	sel_input_rec_free(&o);
}

/* A checkpoint record's magic and junk under this name. */
static void not_input(int dirfd, const char *name)
{
	uint8_t b[4096] = {0};
	memcpy(b, "FLARECKP", 8);
	int fd = openat(dirfd, name, O_WRONLY | O_TRUNC);
	CHECK(write(fd, b, sizeof b) == (ssize_t)sizeof b);
	close(fd);
}

static void symlinked(int dirfd, const char *name)
{
	/* A link to a perfectly valid copy: still never followed. */
	CHECK(renameat(dirfd, name, dirfd, "valid-copy") == 0);
	CHECK(symlinkat("valid-copy", dirfd, name) == 0);
}

static void fifo(int dirfd, const char *name)
{
	CHECK(unlinkat(dirfd, name, 0) == 0);
	CHECK(mkfifoat(dirfd, name, 0644) == 0);
}

static void test_misses(int dirfd)
{
	expect_miss(dirfd, 10, flip_payload, SEL_ECORRUPT);
	expect_miss(dirfd, 11, flip_header, SEL_ECORRUPT);
	expect_miss(dirfd, 12, truncate_it, SEL_EFORMAT);
	expect_miss(dirfd, 13, extend_it, SEL_EFORMAT);
	expect_miss(dirfd, 14, foreign, SEL_EIDENTITY);
	expect_miss(dirfd, 15, not_input, SEL_EFORMAT);
	expect_miss(dirfd, 16, symlinked, -ELOOP);
	CHECK(exists(dirfd, "valid-copy")); /* the link went, not its target */
	CHECK(unlinkat(dirfd, "valid-copy", 0) == 0);
	expect_miss(dirfd, 17, fifo, -EINVAL); /* and no hang on open */
	CHECK(count_files(dirfd, ".input") == 0);
}

/* A real checkpoint record in the directory (recutil's geometry). */
static void write_ckpt(int dirfd, sel_record_ns *ns, sel_record_desc *d)
{
	struct test_geo g;
	uint64_t units[2] = {4096, 2048};
	test_geo_init(&g, 1, 64, 2, units, 5000);
	test_ns_init(ns, &g.g, 3);
	test_rng r;
	test_rng_init(&r, 5);
	test_desc(&r, 64, 128, NULL, true, d);
	test_record_write(dirfd, ns, d, true);
}

static void test_scan_and_neighbours(int dirfd)
{
	/* Our files, our temporaries, a checkpoint, a checkpoint temporary, a
	 * foreign file, a directory and a FIFO under our names. */
	sel_record_ns ns;
	sel_record_desc cd;
	write_ckpt(dirfd, &ns, &cd);
	char ckpt[SEL_RECORD_NAME_MAX];
	sel_record_name(&cd.key, ckpt);
	sel_input_disk *d;
	CHECK_OK(sel_input_disk_open(dirfd, NULL, &d));
	sel_input_rec p;
	uint64_t plen = 0;
	for (uint32_t n = 0; n < 6; n++) {
		make_prepared(&p, 100 + n, 2000);
		CHECK_OK(sel_input_disk_write(d, &p));
		plen = p.len;
		sel_input_rec_free(&p);
	}
	sel_input_disk_close(d);
	char n1[SEL_INPUT_NAME_LEN], tmp[200];
	path_of(SEL_INPUT_PREPARED, 100, n1);
	snprintf(tmp, sizeof tmp, ".tmp-%s-0123456789abcdef", n1);
	int fd = openat(dirfd, tmp, O_CREAT | O_WRONLY, 0644);
	close(fd);
	char ctmp[200];
	snprintf(ctmp, sizeof ctmp, ".tmp-%s-0123456789abcdef", ckpt);
	fd = openat(dirfd, ctmp, O_CREAT | O_WRONLY, 0644);
	close(fd);
	fd = openat(dirfd, "notes.txt", O_CREAT | O_WRONLY, 0644);
	close(fd);
	char dname[SEL_INPUT_NAME_LEN], fname[SEL_INPUT_NAME_LEN], small[SEL_INPUT_NAME_LEN];
	path_of(SEL_INPUT_SOURCE, 200, dname);
	path_of(SEL_INPUT_SOURCE, 201, fname);
	path_of(SEL_INPUT_SOURCE, 202, small);
	CHECK(mkdirat(dirfd, dname, 0755) == 0);
	CHECK(mkfifoat(dirfd, fname, 0644) == 0);
	fd = openat(dirfd, small, O_CREAT | O_WRONLY, 0644);
	close(fd);
	/* Reopen with a bound of four: the two oldest go. */
	struct sel_input_disk_opts o = {.max_records = 4};
	CHECK_OK(sel_input_disk_open(dirfd, &o, &d));
	struct sel_input_disk_stats st;
	sel_input_disk_stats(d, &st);
	CHECK(st.records == 4 && st.scan_removed == 5); /* tmp, fifo, empty, 2 beyond */
	CHECK(!exists(dirfd, tmp) && !exists(dirfd, fname) && !exists(dirfd, small));
	CHECK(exists(dirfd, ctmp) && exists(dirfd, ckpt) && exists(dirfd, "notes.txt"));
	CHECK(exists(dirfd, dname));
	check(d);
	/* Input eviction never touches the checkpoint. */
	CHECK(sel_input_disk_reclaim(d, UINT64_MAX) == 4 * plen);
	sel_input_disk_stats(d, &st);
	CHECK(st.records == 0 && st.bytes == 0);
	CHECK(exists(dirfd, ckpt) && exists(dirfd, ctmp));
	/* Nor does the checkpoint scan touch inputs: write some again and run it. */
	for (uint32_t n = 0; n < 3; n++) {
		make_prepared(&p, 300 + n, 2000);
		CHECK_OK(sel_input_disk_write(d, &p));
		sel_input_rec_free(&p);
	}
	sel_input_disk_close(d);
	sel_scan sc;
	struct sel_scan_opts so = {.threads = 1};
	CHECK_OK(sel_record_scan(dirfd, &ns, &so, &sc));
	CHECK(sc.n == 1 && sc.st.tmp_removed == 1); /* its own temporary, its record kept */
	sel_scan_free(&sc);
	CHECKF(count_files(dirfd, ".input") == 3 + 1 /* the directory */,
	       "%d .input files, %d in all", count_files(dirfd, ".input"), count_files(dirfd, ""));
	CHECK_OK(sel_input_disk_open(dirfd, NULL, &d));
	sel_input_disk_stats(d, &st);
	CHECK(st.records == 3);
	/* And removing the checkpoint leaves them readable. */
	CHECK(unlinkat(dirfd, ckpt, 0) == 0);
	sel_input_key k = key_of(301);
	sel_input_rec back;
	CHECK_OK(sel_input_disk_read(d, SEL_INPUT_PREPARED, &k, &back));
	sel_input_rec_free(&back);
	sel_input_disk_reclaim(d, UINT64_MAX);
	sel_input_disk_close(d);
	CHECK(unlinkat(dirfd, "notes.txt", 0) == 0);
	CHECK(unlinkat(dirfd, dname, AT_REMOVEDIR) == 0);
	sel_record_ns_free(&ns);
}

/* The fixed index bound: 4,096 records, the oldest replaced. */
static void test_bound(int dirfd)
{
	sel_input_disk *d;
	CHECK_OK(sel_input_disk_open(dirfd, NULL, &d));
	sel_input_rec s;
	for (uint32_t n = 0; n < SEL_INPUT_DISK_RECORDS + 5; n++) {
		make_source(&s, 1000 + n);
		CHECK_OK(sel_input_disk_write(d, &s));
		sel_input_rec_free(&s);
	}
	struct sel_input_disk_stats st;
	sel_input_disk_stats(d, &st);
	CHECKF(st.records == SEL_INPUT_DISK_RECORDS && st.evictions == 5,
	       "%llu records, %llu evictions", (unsigned long long)st.records,
	       (unsigned long long)st.evictions);
	CHECK(count_files(dirfd, ".input") == (int)SEL_INPUT_DISK_RECORDS);
	sel_input_key first = key_of(1000), last = key_of(1000 + SEL_INPUT_DISK_RECORDS + 4);
	CHECK(!sel_input_disk_contains(d, SEL_INPUT_SOURCE, &first));
	CHECK(sel_input_disk_contains(d, SEL_INPUT_SOURCE, &last));
	check(d);
	sel_input_disk_close(d);
	/* Reopened with the bound: the same files, no more. */
	CHECK_OK(sel_input_disk_open(dirfd, NULL, &d));
	sel_input_disk_stats(d, &st);
	CHECK(st.records == SEL_INPUT_DISK_RECORDS && st.scan_removed == 0);
	sel_input_disk_reclaim(d, UINT64_MAX);
	sel_input_disk_close(d);
	CHECK(count_files(dirfd, ".input") == 0);
}

/* A shared limit through the budget callback. */
struct budget {
	uint64_t used, limit;
	int reserves, releases, refused;
};

static int b_reserve(void *ctx, uint64_t n)
{
	struct budget *b = ctx;
	b->reserves++;
	if (b->used + n > b->limit) {
		b->refused++;
		return -ENOSPC;
	}
	b->used += n;
	return 0;
}

static void b_release(void *ctx, uint64_t n)
{
	struct budget *b = ctx;
	b->releases++;
	CHECK(b->used >= n);
	b->used -= n;
}

static void test_budget(int dirfd)
{
	sel_input_rec p;
	make_prepared(&p, 400, 10000);
	struct budget b = {.limit = 3 * p.len + 100};
	struct sel_input_disk_budget cb = {b_reserve, b_release, &b};
	struct sel_input_disk_opts o = {.budget = &cb};
	sel_input_disk *d;
	CHECK_OK(sel_input_disk_open(dirfd, &o, &d));
	for (uint32_t n = 0; n < 5; n++) {
		sel_input_rec q;
		make_prepared(&q, 400 + n, 10000);
		CHECK_OK(sel_input_disk_write(d, &q)); /* the oldest reclaimed to fit */
		sel_input_rec_free(&q);
		CHECK(b.used <= b.limit);
	}
	struct sel_input_disk_stats st;
	sel_input_disk_stats(d, &st);
	CHECK(st.records == 3 && b.used == 3 * p.len && st.evictions == 2);
	/* Checkpoints (someone else on the budget) take all but half a record
	 * while the inputs hold nothing: the write is skipped, not an error. */
	CHECK(sel_input_disk_reclaim(d, UINT64_MAX) == 3 * p.len);
	CHECK(b.used == 0);
	b.used = b.limit - p.len / 2;
	sel_input_rec big;
	make_prepared(&big, 500, 10000);
	CHECK_RC(sel_input_disk_write(d, &big), -ENOSPC);
	sel_input_disk_stats(d, &st);
	CHECK(st.write_skipped == 1 && st.records == 0);
	CHECK(count_files(dirfd, ".input") == 0);
	/* They go away; the write fits; part B's pressure reclaims on demand. */
	b.used = 0;
	CHECK_OK(sel_input_disk_write(d, &big));
	CHECK(b.used == big.len);
	CHECK(sel_input_disk_reclaim(d, 1) == big.len);
	CHECK_OK(sel_input_disk_write(d, &big));
	sel_input_disk_close(d); /* every charge given back */
	CHECK(b.used == 0 && b.releases == b.reserves - b.refused && b.refused == 4);
	sel_input_rec_free(&p);
	sel_input_rec_free(&big);

	/* The scan charges existing files through the budget too, dropping the
	 * oldest that do not fit. */
	struct budget b2 = {.limit = 1ull << 30};
	struct sel_input_disk_budget cb2 = {b_reserve, b_release, &b2};
	struct sel_input_disk_opts o2 = {.budget = &cb2};
	CHECK_OK(sel_input_disk_open(dirfd, &o2, &d));
	for (uint32_t n = 0; n < 4; n++) {
		make_prepared(&p, 600 + n, 10000);
		CHECK_OK(sel_input_disk_write(d, &p));
		sel_input_rec_free(&p);
	}
	sel_input_disk_close(d);
	CHECK(b2.used == 0);
	make_prepared(&p, 600, 10000);
	b2.limit = 2 * p.len;
	CHECK_OK(sel_input_disk_open(dirfd, &o2, &d));
	sel_input_disk_stats(d, &st);
	CHECK(st.records == 2 && b2.used == 2 * p.len && count_files(dirfd, ".input") == 2);
	sel_input_disk_reclaim(d, UINT64_MAX);
	sel_input_disk_close(d);
	CHECK(b2.used == 0);
	sel_input_rec_free(&p);
}

static void test_faults(int dirfd)
{
	faulty = eos_fileops_libc;
	faulty.pwrite = f_pwrite;
	faulty.renameat = f_renameat;
	faulty.unlinkat = f_unlinkat;
	eos_fileops_set(&faulty);
	struct sel_input_disk_opts o = {.limit_bytes = 1 << 20};
	sel_input_disk *d;
	CHECK_OK(sel_input_disk_open(dirfd, &o, &d));
	sel_input_rec p;
	make_prepared(&p, 700, 4000);
	fault.pwrite = ENOSPC;
	CHECK_RC(sel_input_disk_write(d, &p), -ENOSPC);
	CHECK(strstr(sel_errmsg(), "No space"));
	fault.pwrite = 0;
	check(d);
	CHECK(count_files(dirfd, "") == 2); /* no temporary left */
	fault.rename = EIO;
	CHECK_RC(sel_input_disk_write(d, &p), -EIO);
	fault.rename = 0;
	CHECK(count_files(dirfd, "") == 2);
	check(d);
	struct sel_input_disk_stats st;
	sel_input_disk_stats(d, &st);
	CHECK(st.write_failed == 2 && st.records == 0 && st.bytes == 0 && !st.writes_stopped);
	/* A temporary that cannot be removed: its bytes stay charged and
	 * writes stop until restart. */
	fault.pwrite = EIO;
	fault.unlink_tmp = EACCES;
	CHECK_RC(sel_input_disk_write(d, &p), -EIO);
	CHECKF(strstr(sel_errmsg(), "writes stop until restart"), "%s", sel_errmsg());
	fault.pwrite = 0;
	fault.unlink_tmp = 0;
	sel_input_disk_stats(d, &st);
	CHECK(st.writes_stopped && st.bytes == p.len);
	check(d);
	CHECK_RC(sel_input_disk_write(d, &p), -EROFS);
	sel_input_disk_close(d);
	eos_fileops_set(NULL);
	/* The restart's scan removes the temporary and writes work again. */
	CHECK(count_files(dirfd, "") == 3);
	CHECK_OK(sel_input_disk_open(dirfd, &o, &d));
	sel_input_disk_stats(d, &st);
	CHECK(st.scan_removed == 1 && count_files(dirfd, "") == 2);
	CHECK_OK(sel_input_disk_write(d, &p));
	sel_input_disk_reclaim(d, UINT64_MAX);
	sel_input_disk_close(d);
	sel_input_rec_free(&p);
}

int main(void)
{
	char *dir = test_mkdtemp("input-disk");
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dirfd >= 0);
	test_round_trip(dirfd);
	test_misses(dirfd);
	test_scan_and_neighbours(dirfd);
	test_bound(dirfd);
	test_budget(dirfd);
	test_faults(dirfd);
	close(dirfd);
	CHECK_OK(test_rmtree(dir));
	free(dir);
	printf("test_input_disk: ok\n");
	return 0;
}
