/*
 * diskfx.h - the fixture the disk thread's tests share (test_disk.c and
 * test_disk_faults.c; header-only, static functions, as sched_sim.h is
 * for the scheduler tests): the io_uring and file-operation hooks the
 * tests steer (hk, fk), the modes and the fixture (a record namespace, a
 * slab pool and a disk thread), records in slots and the jobs that write
 * and read them, and disk_main: a program's tests on every mode this
 * filesystem and kernel allow, over three geometries, with the checks
 * after each (no temporary left, no direct I/O fallback, the ring's file
 * operations used where on, the slab pool balanced).
 */
#ifndef DISKFX_H
#define DISKFX_H

#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "disk.h"
#include "internal.h"
#include "faultfs.h"
#include "recutil.h"
#include "slab.h"

static test_rng rng;
static uint64_t leaked_slots; /* slots given up to a stopped disk thread */

/* ---- io_uring hooks ------------------------------------------------------------ */

static struct {
	int submit_mode; /* 0 real, 1 fail after the first call, 2 EAGAIN twice, 3 slow */
	int submit_calls;
	int submitted;       /* requests the kernel took */
	int completions;     /* completions seen */
	int fail_completion; /* fail the n-th completion (1-based), 0 = none */
	bool halve;          /* report half of every transfer */
	int shortened;       /* completions halved */
} hk;

static int h_submit(void *ctx, struct io_uring *ring)
{
	(void)ctx;
	int call = ++hk.submit_calls;
	if (hk.submit_mode == 1 && call > 1)
		return -EIO;
	if (hk.submit_mode == 2 && call <= 2)
		return -EAGAIN;
	int rc = io_uring_submit(ring);
	if (rc > 0)
		hk.submitted += rc;
	return rc;
}

static int h_complete(void *ctx, int res)
{
	(void)ctx;
	int n = ++hk.completions;
	if (hk.fail_completion && n == hk.fail_completion)
		return -EIO;
	if (hk.halve && res >= 8192) {
		hk.shortened++;
		return res / 2 / 4096 * 4096;
	}
	return res;
}

/* File operations on the ring: their completions count with the requests'
 * (the kernel took both), by kind; fail[k] fails the next one of kind k. */
static struct {
	int done[SEL_DISK_FOPS];      /* completions seen, by kind */
	int cancelled[SEL_DISK_FOPS]; /* of which -ECANCELED */
	int fail[SEL_DISK_FOPS];      /* errno to inject in the next of kind k (then 0) */
	int prepared;                 /* operations prepared (fileop calls) */
	int total;                    /* completions seen */
	char log[64];                 /* O: an openat prepared, U: an unlink prepared, u: done */
	int log_n;
} fk;

static void fk_log(char c)
{
	if (fk.log_n + 1 < (int)sizeof fk.log)
		fk.log[fk.log_n++] = c;
}

static int h_fileop(void *ctx, int op)
{
	(void)ctx;
	fk.prepared++;
	if (op == SEL_DISK_FOP_OPEN || op == SEL_DISK_FOP_UNLINK)
		fk_log(op == SEL_DISK_FOP_OPEN ? 'O' : 'U');
	int e = fk.fail[op];
	fk.fail[op] = 0;
	return -e;
}

static void h_fileop_done(void *ctx, int op, int res)
{
	(void)ctx;
	fk.total++;
	fk.done[op]++;
	if (op == SEL_DISK_FOP_UNLINK)
		fk_log('u');
	if (res == -ECANCELED)
		fk.cancelled[op]++;
}

static const struct sel_disk_hooks hooks = {.submit = h_submit,
					    .complete = h_complete,
					    .fileop = h_fileop,
					    .fileop_done = h_fileop_done};

static void hk_reset(void)
{
	memset(&hk, 0, sizeof hk);
	memset(&fk, 0, sizeof fk);
}

/* ---- fixture ---------------------------------------------------------------------- */

struct mode {
	const char *name;
	enum sel_disk_io io;
	int direct;
	enum sel_disk_fileops fileops;
};

struct fx {
	const struct mode *mode;
	struct test_geo t;
	sel_record_ns ns;
	char *base;
	char dir[4096];
	struct eos_dirlock lk;
	sel_slab_pool *pool;
	sel_disk *d;
	struct sel_disk_config cfg;
};

/* Under ThreadSanitizer auto means the synchronous file operations
 * (disk.c fileops_choice): the ring modes ask for the ring by name there. */
#ifdef __SANITIZE_THREAD__
#define RING_FILEOPS SEL_DISK_FILEOPS_RING
#else
#define RING_FILEOPS SEL_DISK_FILEOPS_AUTO
#endif

static void fx_open_disk(struct fx *f)
{
	CHECK_OK(sel_disk_create(&f->cfg, &f->d));
	struct sel_disk_stats st;
	sel_disk_stats(f->d, &st);
	CHECK(st.uring == (f->mode->io == SEL_DISK_IO_URING));
	CHECK(st.direct == (f->mode->direct == 1));
	CHECK(st.ring_fileops_on ==
	      (f->mode->io == SEL_DISK_IO_URING && f->mode->fileops != SEL_DISK_FILEOPS_SYNC));
}

static void fx_init(struct fx *f, const struct mode *m, const struct test_geo *t)
{
	memset(f, 0, sizeof(*f));
	f->mode = m;
	f->t = *t;
	f->t.g.rank = f->t.rank;
	for (uint32_t r = 0; r < f->t.g.ranks; r++) {
		f->t.rank[r].pages = f->t.planes[r];
		for (uint32_t i = 0; i < f->t.rank[r].n_planes; i++)
			f->t.planes[r][i].name = f->t.names[r][i];
	}
	test_ns_init(&f->ns, &f->t.g, 1);
	f->base = test_mkdtemp("disk");
	CHECK(f->base);
	CHECK_OK(sel_record_dir_open(f->base, &f->ns, &f->lk));
	snprintf(f->dir, sizeof f->dir, "%s", f->lk.path);
	CHECK_OK(sel_slab_create(f->ns.layout.sz.page_record, 512, 0, false, NULL, &f->pool));
	f->cfg = (struct sel_disk_config){
		.dirfd = f->lk.fd,
		.dir = f->dir,
		.ns = &f->ns,
		.io = m->io,
		.direct = m->direct,
		.fileops = m->fileops,
		.hooks = &hooks,
	};
	fx_open_disk(f);
}

static void fx_free(struct fx *f)
{
	if (f->d) {
		CHECK_OK(sel_disk_close(f->d, 0));
		sel_disk_destroy(f->d);
	}
	sel_slab_destroy(f->pool);
	eos_dirlock_release(&f->lk);
	test_rmtree(f->base);
	free(f->base);
	sel_record_ns_free(&f->ns);
}

/* Wait for job j (the only one outstanding) and return its status. */
static int wait_job(struct fx *f, struct sel_disk_job *j)
{
	struct pollfd p = {.fd = sel_disk_fd(f->d), .events = POLLIN};
	struct sel_disk_job *got = NULL;
	for (int tries = 0; tries < 600 && !got; tries++) {
		poll(&p, 1, 100);
		struct sel_disk_job *out[4];
		int n = sel_disk_poll(f->d, out, 4);
		CHECK(n <= 1);
		if (n == 1)
			got = out[0];
	}
	CHECK(got == j);
	CHECK(j->done_ns >= j->submit_ns);
	if (j->status)
		CHECK(j->errmsg[0] != '\0');
	return j->status;
}

static int run(struct fx *f, struct sel_disk_job *j)
{
	CHECK_OK(sel_disk_submit(f->d, j));
	return wait_job(f, j);
}

/* A record's bytes in slots. */
struct rec {
	sel_record_desc d;
	sel_record_span s;
	uint32_t slots[256];
	uint32_t n_slots;
	void *pages[128];
	void *rslots[64];
	struct iovec iov[128];
	int n_iov;
};

static void rec_alloc(struct fx *f, struct rec *r, const sel_record_desc *d, bool fill)
{
	const sel_record_layout *l = &f->ns.layout;
	memset(r, 0, sizeof(*r));
	r->d = *d;
	CHECK_OK(sel_record_span_of(&l->sz, d, &r->s));
	uint32_t ps = (d->flags & SEL_RECORD_PAGES_REPLICATED) ? (d->tail + l->ranks - 1) / l->ranks
							       : d->tail;
	uint32_t rs = sel_record_row_slots(l, d->flags);
	r->n_slots = ps + rs;
	CHECK(r->n_slots <= 256 && d->tail <= 128 && rs <= 64);
	CHECK_OK(sel_slab_alloc(f->pool, r->n_slots, SEL_SLAB_WARM, r->slots));
	void *addr[256];
	for (uint32_t i = 0; i < r->n_slots; i++) {
		addr[i] = sel_slab_addr(f->pool, r->slots[i]);
		if (fill)
			test_rng_fill(&rng, addr[i], l->sz.page_record);
		else
			memset(addr[i], 0xee, l->sz.page_record);
	}
	for (uint32_t i = 0; i < d->tail; i++)
		r->pages[i] = sel_record_page_addr(l, d->flags, addr, i);
	for (uint32_t i = 0; i < rs; i++)
		r->rslots[i] = addr[ps + i];
	r->n_iov = sel_record_row_iov(l, d->flags, r->rslots, rs, r->iov, 128);
	CHECK_OK(r->n_iov);
}

static void rec_free(struct fx *f, struct rec *r)
{
	CHECK_OK(sel_slab_free(f->pool, r->slots, r->n_slots));
}

static void job_write(struct sel_disk_job *j, struct rec *r, bool row)
{
	memset(j, 0, sizeof(*j));
	j->id = 1;
	j->op = SEL_DISK_WRITE;
	j->rec = r->d;
	j->row = row;
	j->pages = r->pages;
	j->row_iov = row ? r->iov : NULL;
	j->row_n = row ? (uint32_t)r->n_iov : 0;
}

/* Read pages [first, tail) into dst's pages (dst->pages[first..]) and the row. */
static void job_read(struct sel_disk_job *j, struct rec *dst, uint32_t first, bool row)
{
	memset(j, 0, sizeof(*j));
	j->id = 2;
	j->op = SEL_DISK_READ;
	j->rec = dst->d;
	j->first = first;
	j->pages = dst->pages + first;
	j->row = row;
	j->row_iov = row ? dst->iov : NULL;
	j->row_n = row ? (uint32_t)dst->n_iov : 0;
}

static void job_simple(struct sel_disk_job *j, enum sel_disk_op op, const sel_record_desc *d)
{
	memset(j, 0, sizeof(*j));
	j->id = 3;
	j->op = op;
	j->rec = *d;
}

static void check_same(const struct rec *a, const struct rec *b, uint32_t first, bool row)
{
	for (uint32_t i = first; i < a->d.tail; i++)
		CHECKF(memcmp(a->pages[i], b->pages[i], a->s.page_stride) == 0, "page %u differs",
		       i);
	if (row)
		for (int i = 0; i < a->n_iov; i++)
			CHECKF(memcmp(a->iov[i].iov_base, b->iov[i].iov_base, a->iov[i].iov_len) ==
				       0,
			       "row piece %d differs", i);
}

static char *path_of(struct fx *f, const sel_key *k, char *buf, size_t len)
{
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(k, name);
	snprintf(buf, len, "%s/%s", f->dir, name);
	return buf;
}

static uint64_t fsize(struct fx *f, const sel_key *k)
{
	char p[4200];
	struct stat st;
	if (stat(path_of(f, k, p, sizeof p), &st) != 0)
		return UINT64_MAX;
	return (uint64_t)st.st_size;
}

/* Part `part` (SEL_DISK_PART_BEGIN / END bits) of a windowed write of r:
 * pages [first, first + count), and the row with the END part. */
static void job_part(struct sel_disk_job *j, struct rec *r, uint32_t first, uint32_t count,
		     bool row, unsigned part)
{
	memset(j, 0, sizeof(*j));
	j->id = 4;
	j->op = SEL_DISK_WRITE_PART;
	j->rec = r->d;
	j->first = first;
	j->count = count;
	j->part = part;
	j->row = row;
	j->pages = r->pages + first;
	if (row && (part & SEL_DISK_PART_END)) {
		j->row_iov = r->iov;
		j->row_n = (uint32_t)r->n_iov;
	}
}

/* File operations that went through the ring, of every kind. */
static uint64_t fop_sum(const struct sel_disk_stats *st)
{
	uint64_t n = 0;
	for (int k = 0; k < SEL_DISK_FOPS; k++)
		n += st->ring_fileops[k];
	return n;
}

/* ---- every mode -------------------------------------------------------------------------- */

/* A program's tests on one fixture: mode m, geometry k (0: TP1, the one
 * the tests that do not depend on the geometry run on). */
typedef void dfx_tests(struct fx *f, const struct mode *m, int k);

static void run_mode(const struct mode *m, const struct test_geo *t, int k, dfx_tests *tests)
{
	struct fx f;
	printf("== %s, geometry %d (%u rank(s))\n", m->name, k, t->g.ranks);
	fx_init(&f, m, t);
	tests(&f, m, k);
	CHECK(test_count_tmp(f.dir) == 0);
	struct sel_disk_stats st;
	sel_disk_stats(f.d, &st);
	CHECK(st.direct_fallbacks == 0);
	/* Forced off, nothing went through the ring; on, the writes did. */
	if (m->io == SEL_DISK_IO_URING && m->fileops != SEL_DISK_FILEOPS_SYNC)
		CHECK(st.ring_fileops[SEL_DISK_FOP_OPEN] > 0 &&
		      st.ring_fileops[SEL_DISK_FOP_RENAME] > 0);
	else
		CHECK(fop_sum(&st) == 0);
	CHECK_OK(sel_slab_check(f.pool));
	CHECK(sel_slab_in_use(f.pool) == leaked_slots);
	leaked_slots = 0;
	fx_free(&f);
}

static int disk_main(const char *name, dfx_tests *tests)
{
	test_rng_init(&rng, test_seed());
	/* Forcing variables would make every mode the same one. */
	unsetenv("SELENE_DISK_IO");
	unsetenv("SELENE_DISK_DIRECT");
	unsetenv("SELENE_DISK_FILEOPS");

	/* What this filesystem and kernel allow: the modes they refuse are
	 * left out (and named); pread, buffered always runs. */
	char *probe_dir = test_mkdtemp("probe");
	int dio = eos_direct_io_probe(probe_dir);
	char dio_why[EOS_ERRMSG_MAX];
	snprintf(dio_why, sizeof dio_why, "%s", dio == 1 ? "" : eos_errmsg());
	test_rmtree(probe_dir);
	free(probe_dir);
	struct io_uring ring;
	int uring_rc = io_uring_queue_init(4, &ring, 0);
	if (uring_rc == 0)
		io_uring_queue_exit(&ring);

	static const struct mode modes[] = {
		{"io_uring + O_DIRECT", SEL_DISK_IO_URING, 1, RING_FILEOPS},
		{"io_uring, buffered", SEL_DISK_IO_URING, 0, RING_FILEOPS},
		/* The file operations' synchronous path, kept tested. */
		{"io_uring + O_DIRECT, file operations on the thread", SEL_DISK_IO_URING, 1,
		 SEL_DISK_FILEOPS_SYNC},
		{"pread + O_DIRECT", SEL_DISK_IO_PREAD, 1, SEL_DISK_FILEOPS_AUTO},
		{"pread, buffered", SEL_DISK_IO_PREAD, 0, SEL_DISK_FILEOPS_AUTO},
	};
	int ran = 0;
	/* TP1 with a tiny plane and a row over three slots; TP2 uniform
	 * (replication); TP2 uneven shares. */
	struct test_geo *g = calloc(3, sizeof(*g));
	test_geo_init(&g[0], 1, 64, 3, (uint64_t[]){4096, 100, 8192}, 40000);
	test_geo_init(&g[1], 2, 128, 2, (uint64_t[]){8192, 300}, 10000);
	test_geo_init(&g[2], 2, 64, 2, (uint64_t[]){4096, 5000}, 7000);
	test_geo_rank(&g[2], 1, 1, (uint64_t[]){20000}, 30000);
	for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
		const struct mode *m = &modes[i];
		if (m->direct && dio != 1) {
			printf("== %s: not run, direct I/O refused here: %s\n", m->name, dio_why);
			continue;
		}
		if (m->io == SEL_DISK_IO_URING && uring_rc != 0) {
			printf("== %s: not run, io_uring refused here: %s\n", m->name,
			       strerror(-uring_rc));
			continue;
		}
		for (int k = 0; k < 3; k++)
			run_mode(m, &g[k], k, tests);
		ran++;
	}
	free(g);
	CHECK(ran >= 1); /* pread, buffered needs nothing the kernel may refuse */
	printf("%s: ok (%d of 5 modes)\n", name, ran);
	return 0;
}

#endif
