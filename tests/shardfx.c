/*
 * shardfx.c - see shardfx.h.
 */
#include "shardfx.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "eos.h"
#include "internal.h"

/* ---- a rank ------------------------------------------------------------------- */

static const uint64_t units[2] = {4096, 1000};
#define ROW_BYTES 3000u

static void rank_geometry(sel_geometry *g, sel_rank_geometry *rg, sel_plane *pl)
{
	static char k[] = "k", v[] = "v", st[] = "state";
	memset(rg, 0, sizeof *rg);
	pl[0] = (sel_plane){.name = k, .unit_bytes = units[0]};
	pl[1] = (sel_plane){.name = v, .unit_bytes = units[1]};
	rg->pages = pl;
	rg->n_planes = 2;
	rg->page_count = SFX_PAGES;
	rg->page_bytes = units[0] + units[1];
	rg->row = (sel_plane){.name = st, .unit_bytes = ROW_BYTES};
	rg->row_count = SFX_SLOTS;
	*g = (sel_geometry){.ranks = 1, .page_tokens = SFX_PAGE_TOKENS, .rank = rg};
}

void sfx_identity(uint8_t out[SEL_IDENTITY_BYTES], int variant)
{
	uint8_t model[SEL_IDENTITY_BYTES];
	memset(model, 0x5e + variant, sizeof model);
	sel_offload_identity(model, SEL_MODE_ORDINARY, out);
}

void sfx_fingerprint(uint32_t world, uint32_t rank, uint8_t out[SEL_FINGERPRINT_BYTES])
{
	sel_geometry g;
	sel_rank_geometry rg;
	sel_plane pl[2];
	rank_geometry(&g, &rg, pl);
	sel_shard_rank_fingerprint(&rg, g.page_tokens, rank, world, out);
}

void sfx_rank_init(struct sfx_rank *r, uint32_t world, uint32_t rank, const char *base)
{
	memset(r, 0, sizeof *r);
	r->world = world;
	r->rank = rank;
	r->lk.fd = -1;
	snprintf(r->base, sizeof r->base, "%s", base);
	CHECK(eos_mkdir_p(base) == 0);
	sel_geometry g;
	sel_rank_geometry rg;
	sel_plane pl[2];
	rank_geometry(&g, &rg, pl);
	uint8_t id[SEL_IDENTITY_BYTES];
	sfx_identity(id, 0);
	CHECK_OK(sel_record_ns_init(&r->ns, &g, id));
	sfx_fingerprint(world, rank, r->ns.fingerprint);
	sel_record_dirname(r->ns.identity, r->ns.fingerprint, r->ns.dirname);
	snprintf(r->dir, sizeof r->dir, "%s/%s", base, r->ns.dirname);
	r->stride = r->ns.layout.sz.page_record;
	r->row_area = (uint64_t)sel_record_row_slots(&r->ns.layout, 0) * r->stride;
	size_t bytes = SFX_PAGES * r->stride + SFX_SLOTS * r->row_area;
	r->gpu = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	r->knobs = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(r->gpu != MAP_FAILED && r->knobs != MAP_FAILED);
	for (uint32_t i = 0; i < SFX_PAGES; i++)
		sfx_fill_page(r, i, 1);
	for (uint32_t i = 0; i < SFX_SLOTS; i++)
		sfx_fill_row(r, i, 1);
}

void sfx_ranks_init(struct sfx_rank *rk, uint32_t world, const char *tag)
{
	const char *tmp = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
	for (uint32_t r = 0; r < world; r++) {
		char base[512];
		snprintf(base, sizeof base, "%s/%.200s-rank%u", tmp, tag, r);
		sfx_rank_init(&rk[r], world, r, base);
	}
}

void sfx_rank_free(struct sfx_rank *r)
{
	sfx_dir_close(r);
	munmap(r->gpu, SFX_PAGES * r->stride + SFX_SLOTS * r->row_area);
	munmap(r->knobs, 4096);
	sel_record_ns_free(&r->ns);
	test_rmtree(r->base);
}

void sfx_dir_open(struct sfx_rank *r)
{
	if (r->lk.path)
		return;
	CHECK_OK(sel_record_dir_open(r->base, &r->ns, &r->lk));
}

void sfx_dir_close(struct sfx_rank *r) { eos_dirlock_release(&r->lk); }

uint8_t *sfx_page(struct sfx_rank *r, uint32_t id)
{
	CHECK(id < SFX_PAGES);
	return r->gpu + (uint64_t)id * r->stride;
}

uint8_t *sfx_row(struct sfx_rank *r, uint32_t slot)
{
	CHECK(slot < SFX_SLOTS);
	return r->gpu + SFX_PAGES * r->stride + (uint64_t)slot * r->row_area;
}

void sfx_fill_page(struct sfx_rank *r, uint32_t id, uint64_t seed)
{
	test_rng g;
	test_rng_init(&g, seed * 1000003 + r->rank * 7919 + id);
	test_rng_fill(&g, sfx_page(r, id), r->stride);
}

void sfx_fill_row(struct sfx_rank *r, uint32_t slot, uint64_t seed)
{
	test_rng g;
	test_rng_init(&g, seed * 999331 + r->rank * 104729 + slot + (1ull << 40));
	test_rng_fill(&g, sfx_row(r, slot), r->row_area);
}

sel_record_desc sfx_desc(uint64_t c, uint8_t seed, const sel_record_desc *parent)
{
	sel_record_desc d = {.key.consumed = c};
	memset(d.key.digest.b, seed, SEL_DIGEST_BYTES);
	d.key.digest.b[0] = (uint8_t)c;
	memset(d.bucket.b, seed ^ 0x5a, SEL_DIGEST_BYTES);
	if (parent) {
		d.parent = parent->key;
		d.parent_check = sel_record_parent_check(&parent->bucket);
		d.tail = (uint32_t)(c / SFX_PAGE_TOKENS - parent->key.consumed / SFX_PAGE_TOKENS);
	} else {
		d.tail = (uint32_t)(c / SFX_PAGE_TOKENS);
	}
	return d;
}

static int row_iov(struct sfx_rank *r, uint32_t slot, struct iovec *iov)
{
	uint32_t rs = sel_record_row_slots(&r->ns.layout, 0);
	void *slots[8];
	for (uint32_t i = 0; i < rs; i++)
		slots[i] = sfx_row(r, slot) + (uint64_t)i * r->stride;
	int n = sel_record_row_iov(&r->ns.layout, 0, slots, rs, iov, 8);
	CHECK_OK(n);
	return n;
}

static int do_store(struct sfx_rank *r, const sel_record_desc *d, const uint32_t *ids, bool row,
		    uint32_t slot, uint64_t created_ns)
{
	void **pages = calloc(d->tail + 1, sizeof *pages);
	for (uint32_t i = 0; i < d->tail; i++)
		pages[i] = sfx_page(r, ids[i]);
	struct iovec iov[8];
	int n = row ? row_iov(r, slot, iov) : 0;
	struct sel_record_write_opts o = {
		.direct = false, .created_ns = created_ns, .nonce = created_ns ^ r->rank};
	int rc = sel_record_write(r->lk.fd, &r->ns, d, pages, row, iov, (uint32_t)n, &o);
	free(pages);
	return rc;
}

void sfx_write(struct sfx_rank *r, const sel_record_desc *d, uint32_t first_id, bool row,
	       uint32_t slot, uint64_t created_ns)
{
	uint32_t ids[SFX_PAGES];
	CHECK(first_id + d->tail <= SFX_PAGES);
	for (uint32_t i = 0; i < d->tail; i++)
		ids[i] = first_id + i;
	bool opened = r->lk.path != NULL;
	sfx_dir_open(r);
	CHECK_OK(do_store(r, d, ids, row, slot, created_ns));
	if (!opened)
		sfx_dir_close(r);
}

/* Read [first, first + count) of record d into ids (and its row into
 * slot), verified against the file's checksums. */
static int do_read(struct sfx_rank *r, const sel_record_desc *d, uint32_t first, uint32_t count,
		   const uint32_t *ids, bool row, uint32_t slot)
{
	sel_record_span sp;
	int rc = sel_record_span_of(&r->ns.layout.sz, d, &sp);
	if (rc)
		return rc;
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&d->key, name);
	bool direct = false;
	struct stat st;
	int fd = sel_record_open(r->lk.fd, name, &direct, NULL, &st);
	if (fd < 0)
		return fd;
	uint8_t *hdr = malloc(sp.header_bytes);
	uint64_t *ck = malloc(sp.cksum_bytes ? sp.cksum_bytes : 8);
	sel_record_header h;
	bool has_row = false;
	rc = 0;
	if (pread(fd, hdr, sp.header_bytes, 0) != (ssize_t)sp.header_bytes)
		rc = eos_fail(-EIO, "short header read of %s", name);
	else if ((rc = sel_record_decode(hdr, sp.header_bytes, &r->ns, &h)) == 0 &&
		 (rc = sel_record_header_matches(&h, d, &sp)) == 0 &&
		 (rc = sel_record_check_length(&sp, (uint64_t)st.st_size, &has_row)) == 0) {
		if (row && !has_row)
			rc = eos_fail(-ESTALE, "%s has no row", name);
		else if (pread(fd, ck, sp.cksum_bytes, (off_t)sp.cksum_off) !=
			 (ssize_t)sp.cksum_bytes)
			rc = eos_fail(-EIO, "short checksum read of %s", name);
	}
	for (uint32_t i = 0; !rc && i < count; i++) {
		uint8_t *p = sfx_page(r, ids[i]);
		uint64_t off = sp.page_off + (uint64_t)(first + i) * sp.page_stride;
		if (pread(fd, p, sp.page_stride, (off_t)off) != (ssize_t)sp.page_stride)
			rc = eos_fail(-EIO, "short page read of %s", name);
		else
			rc = sel_record_check_page(p, sp.page_stride, ck[first + i], first + i);
	}
	if (!rc && row) {
		struct iovec iov[8];
		struct sel_record_piece pc[8];
		int n = row_iov(r, slot, iov);
		CHECK_OK(sel_record_row_plan(&r->ns.layout, 0, iov, (uint32_t)n, pc));
		for (int i = 0; !rc && i < n; i++)
			if (pread(fd, pc[i].addr, pc[i].len, (off_t)(sp.row_off + pc[i].off)) !=
			    (ssize_t)pc[i].len)
				rc = eos_fail(-EIO, "short row read of %s", name);
		if (!rc)
			rc = sel_record_check_row(iov, (uint32_t)n, h.row_checksum);
	}
	free(hdr);
	free(ck);
	close(fd);
	return rc;
}

void sfx_run_job(struct sfx_rank *r, const struct sel_shard_job *j, struct sel_shard_result *res)
{
	memset(res, 0, sizeof *res);
	res->id = j->id;
	sfx_dir_open(r);
	const sel_record_desc *d = &j->recs[j->n_recs - 1].d;
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&d->key, name);
	int rc = 0;
	switch (j->op) {
	case SEL_SHARD_STORE: {
		int e = atomic_load(&r->knobs->store_errno);
		if (e) {
			rc = eos_fail(-e, "injected: store of %s fails: %s", name, strerror(e));
			break;
		}
		if (atomic_load(&r->knobs->block_store)) {
			/* Killed during a write: the temporary exists, nothing commits. */
			bool direct = false;
			char tmp[SEL_RECORD_TMPNAME_MAX];
			int fd = sel_record_tmp_create(r->lk.fd, name, 4096, 7, &direct, tmp);
			CHECK(fd >= 0);
			atomic_store(&r->knobs->in_write, 1);
			for (;;)
				pause();
		}
		rc = do_store(r, d, j->pages, j->row, j->slot, j->created_ns);
		if (!rc) {
			res->flags |= SEL_SHARD_R_COMMITTED;
			struct stat st;
			if (fstatat(r->lk.fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
				res->bytes = (uint64_t)st.st_size;
		}
		break;
	}
	case SEL_SHARD_FETCH: {
		uint32_t at = 0;
		for (uint32_t i = 0; !rc && i < j->n_recs; i++) {
			const struct sel_shard_rec *x = &j->recs[i];
			bool last = i == j->n_recs - 1;
			rc = do_read(r, &x->d, x->first, x->count, j->pages + at, last && j->row,
				     j->slot);
			at += x->count;
			res->bytes += (uint64_t)x->count * r->stride;
		}
		break;
	}
	case SEL_SHARD_TRUNCATE: {
		sel_record_span sp;
		bool had_row = false;
		rc = sel_record_span_of(&r->ns.layout.sz, d, &sp);
		if (!rc)
			rc = sel_record_truncate(r->lk.fd, name, &sp, NULL, &had_row);
		if (!rc && had_row)
			res->flags |= SEL_SHARD_R_HAD_ROW;
		break;
	}
	case SEL_SHARD_UNLINK: {
		int e = atomic_load(&r->knobs->unlink_errno);
		bool existed = false;
		if (e)
			rc = eos_fail(-e, "injected: unlink of %s fails: %s", name, strerror(e));
		else
			rc = sel_record_unlink(r->lk.fd, name, &existed);
		if (!rc && existed)
			res->flags |= SEL_SHARD_R_EXISTED;
		break;
	}
	}
	res->status = rc;
	if (rc)
		sel_shard_text(res->text, eos_errmsg());
}

static int ops_submit(void *ctx, sel_shard_peer *p, const struct sel_shard_job *j)
{
	struct sfx_rank *r = ctx;
	atomic_fetch_add(&r->knobs->jobs, 1);
	if (j->op == SEL_SHARD_STORE && atomic_load(&r->knobs->hold_store)) {
		CHECK(r->n_held < 256);
		r->held[r->n_held++] = j->id;
		return 0;
	}
	struct sel_shard_result res;
	sfx_run_job(r, j, &res);
	CHECK_OK(sel_shard_peer_complete(p, &res));
	return 0;
}

static int ops_drain(void *ctx, sel_shard_peer *p, uint64_t deadline_ns)
{
	(void)deadline_ns;
	struct sfx_rank *r = ctx;
	for (int i = 0; i < r->n_held; i++) {
		struct sel_shard_result res = {.id = r->held[i], .status = -ECANCELED};
		sel_shard_text(res.text, "held store drained");
		CHECK_OK(sel_shard_peer_complete(p, &res));
	}
	r->n_held = 0;
	return 0;
}

const struct sel_shard_ops sfx_ops = {.submit = ops_submit, .drain = ops_drain};

/* ---- listings ------------------------------------------------------------------------ */

static int by_name(const void *a, const void *b) { return strcmp(a, b); }

void sfx_list(const struct sfx_rank *r, struct sfx_listing *out)
{
	memset(out, 0, sizeof *out);
	DIR *d = opendir(r->dir);
	if (!d)
		return;
	struct dirent *e;
	char names[128][96];
	int n = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		CHECK(n < 128);
		CHECK(strlen(e->d_name) < 96);
		memcpy(names[n++], e->d_name, strlen(e->d_name) + 1);
	}
	closedir(d);
	qsort(names, (size_t)n, 96, by_name);
	for (int i = 0; i < n; i++) {
		struct stat st;
		char path[1200];
		CHECK(snprintf(path, sizeof path, "%.1000s/%.95s", r->dir, names[i]) > 0);
		CHECK(lstat(path, &st) == 0);
		memcpy(out->name[i], names[i], 96);
		out->len[i] = (uint64_t)st.st_size;
	}
	out->n = n;
}

void sfx_check_same(struct sfx_rank *ranks, uint32_t world, const char *what)
{
	struct sfx_listing a, b;
	sfx_list(&ranks[0], &a);
	printf("%s: every rank holds %d files:", what, a.n);
	for (int i = 0; i < a.n; i++)
		printf(" %.6s..(%" PRIu64 ")", a.name[i] + 10, a.len[i]);
	printf("\n");
	for (uint32_t r = 1; r < world; r++) {
		sfx_list(&ranks[r], &b);
		CHECKF(a.n == b.n, "%s: rank 0 holds %d files, rank %u %d", what, a.n, r, b.n);
		for (int i = 0; i < a.n; i++)
			CHECKF(!strcmp(a.name[i], b.name[i]) && a.len[i] == b.len[i],
			       "%s: rank 0 holds %s (%" PRIu64 "), rank %u %s (%" PRIu64 ")", what,
			       a.name[i], a.len[i], r, b.name[i], b.len[i]);
	}
}

bool sfx_has(const struct sfx_rank *r, const sel_key *k, uint64_t *len)
{
	char name[SEL_RECORD_NAME_MAX], path[1200];
	sel_record_name(k, name);
	snprintf(path, sizeof path, "%s/%s", r->dir, name);
	struct stat st;
	if (lstat(path, &st) != 0)
		return false;
	if (len)
		*len = (uint64_t)st.st_size;
	return true;
}

void sfx_check_restored(struct sfx_rank *r, uint32_t dst, const uint32_t *src,
			const uint32_t *tails, int n, uint32_t row_dst, uint32_t row_src)
{
	uint32_t at = dst;
	for (int k = 0; k < n; k++)
		for (uint32_t i = 0; i < tails[k]; i++, at++)
			CHECKF(!memcmp(sfx_page(r, at), sfx_page(r, src[k] + i), r->stride),
			       "rank %u: page id %u does not hold its page %u", r->rank, at,
			       src[k] + i);
	CHECKF(!memcmp(sfx_row(r, row_dst), sfx_row(r, row_src), ROW_BYTES),
	       "rank %u: slot %u does not hold its row of slot %u", r->rank, row_dst, row_src);
}

void sfx_scan(struct sfx_rank *r, uint64_t limit, sel_scan *s, struct sel_shard_entry **e)
{
	sfx_dir_open(r);
	struct sel_scan_opts o = {.max_file_bytes = limit, .threads = 2};
	CHECK_OK(sel_record_scan(r->lk.fd, &r->ns, &o, s));
	*e = calloc(s->n ? s->n : 1, sizeof **e);
	sel_shard_entries_from_scan(s, *e);
}

/* ---- processes ------------------------------------------------------------------------- */

static int tcp_socket(const char *addr, uint16_t port, struct sockaddr_in *sa)
{
	memset(sa, 0, sizeof *sa);
	sa->sin_family = AF_INET;
	sa->sin_port = htons(port);
	CHECK(inet_pton(AF_INET, addr, &sa->sin_addr) == 1);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	return fd;
}

void sfx_rdv_listen(struct sfx_rdv *v, const char *addr)
{
	memset(v, 0, sizeof *v);
	for (int i = 0; i < (int)SEL_SHARD_WORLD_MAX; i++)
		v->fd[i] = -1;
	struct sockaddr_in sa;
	v->lfd = tcp_socket(addr, 0, &sa);
	int one = 1;
	setsockopt(v->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(bind(v->lfd, (struct sockaddr *)&sa, sizeof sa) == 0);
	CHECK(listen(v->lfd, 16) == 0);
	socklen_t sl = sizeof sa;
	CHECK(getsockname(v->lfd, (struct sockaddr *)&sa, &sl) == 0);
	v->port = ntohs(sa.sin_port);
}

void sfx_rdv_accept(struct sfx_rdv *v, uint32_t world, uint64_t deadline_ns)
{
	for (uint32_t got = 1; got < world; got++) {
		struct pollfd pf = {v->lfd, POLLIN, 0};
		uint64_t now = eos_now_ns();
		CHECKF(now < deadline_ns &&
			       poll(&pf, 1, (int)((deadline_ns - now) / 1000000) + 1) == 1,
		       "rendezvous: %u of %u peers connected before the deadline", got - 1,
		       world - 1);
		int fd = accept4(v->lfd, NULL, NULL, SOCK_CLOEXEC);
		CHECK(fd >= 0);
		uint8_t b[4];
		CHECK(recv(fd, b, 4, MSG_WAITALL) == 4);
		uint32_t r = sel_get_u32(b);
		CHECK(r > 0 && r < world && v->fd[r] < 0);
		v->fd[r] = fd;
	}
}

void sfx_rdv_close(struct sfx_rdv *v)
{
	for (int i = 0; i < (int)SEL_SHARD_WORLD_MAX; i++)
		if (v->fd[i] >= 0)
			close(v->fd[i]);
	if (v->lfd >= 0)
		close(v->lfd);
	v->lfd = -1;
	for (int i = 0; i < (int)SEL_SHARD_WORLD_MAX; i++)
		v->fd[i] = -1;
}

int sfx_rdv_connect(const char *addr, uint16_t port, const char *src, uint32_t rank,
		    uint64_t deadline_ns)
{
	for (;;) {
		struct sockaddr_in sa;
		int fd = tcp_socket(addr, port, &sa);
		if (src) {
			struct sockaddr_in ls;
			close(fd);
			fd = tcp_socket(src, 0, &ls);
			CHECK(bind(fd, (struct sockaddr *)&ls, sizeof ls) == 0);
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
			uint8_t b[4];
			sel_put_u32(b, rank);
			CHECK(send(fd, b, 4, MSG_NOSIGNAL) == 4);
			return fd;
		}
		close(fd);
		/* The listener is made before any peer forks: a refusal means
		 * the network (a namespace's veth) is not up yet. */
		CHECKF(eos_now_ns() < deadline_ns, "rendezvous: cannot connect to %s:%u: %s", addr,
		       port, strerror(errno));
		struct pollfd none = {-1, 0, 0};
		poll(&none, 0, 20); /* bounded by the deadline above */
	}
}

int sfx_peer_main(struct sfx_rank *r, const struct sfx_peer_opts *o)
{
	uint64_t deadline = eos_now_ns() + 60 * SFX_S;
	int fd = sfx_rdv_connect(o->rdv_addr ? o->rdv_addr : "127.0.0.1", o->rdv_port, NULL,
				 r->rank, deadline);
	uint8_t hello[256];
	int64_t n = sel_shard_recv(fd, hello, sizeof hello, deadline);
	CHECK_OK(n);
	if (o->wait_fd >= 0) {
		uint8_t b;
		CHECK(read(o->wait_fd, &b, 1) == 1);
	}
	struct sel_shard_peer_config cfg = {.world = o->world ? o->world : r->world,
					    .rank = r->rank,
					    .rendezvous_fd = fd,
					    .sock_buf = o->sock_buf};
	sfx_identity(cfg.identity, o->bad_identity);
	memcpy(cfg.fingerprint, r->ns.fingerprint, SEL_FINGERPRINT_BYTES);
	if (o->bad_fingerprint)
		cfg.fingerprint[5] ^= 0xff;
	sfx_fingerprint(r->world, 0, cfg.primary_fingerprint);
	cfg.set.disk = !o->no_disk;
	cfg.set.disk_limit = o->no_disk ? 0 : o->disk_limit ? o->disk_limit : SFX_LIMIT;
	cfg.lim = (struct sel_shard_limits){
		.pages = SFX_PAGES, .slots = SFX_SLOTS, .sz = &r->ns.layout.sz};
	sel_shard_peer *p;
	int rc = sel_shard_peer_join(&cfg, hello, (size_t)n, deadline, &p);
	if (o->signal_fd >= 0)
		CHECK(write(o->signal_fd, "j", 1) == 1);
	if (o->expect_join) {
		fprintf(stderr, "rank %u: join: %s (%d)\n", r->rank, sel_errmsg(), rc);
		return rc == o->expect_join ? 10 : 1;
	}
	if (rc) {
		fprintf(stderr, "rank %u: join failed: %s\n", r->rank, sel_errmsg());
		return 1;
	}
	sel_scan s;
	struct sel_shard_entry *e;
	sfx_scan(r, sel_shard_peer_disk_limit(p), &s, &e);
	uint8_t *act = malloc(s.n ? s.n : 1);
	rc = sel_shard_peer_agreement(p, e, s.n, act, deadline);
	if (rc) {
		fprintf(stderr, "rank %u: agreement: %s\n", r->rank, sel_errmsg());
		return 1;
	}
	uint32_t del = 0, tr = 0;
	rc = sel_shard_apply(r->lk.fd, &s, act, &del, &tr);
	CHECK_OK(sel_shard_peer_applied(p, rc, del, tr, rc ? sel_errmsg() : "", deadline));
	free(act);
	free(e);
	sel_scan_free(&s);
	struct sel_shard_ops ops = sfx_ops;
	ops.ctx = r;
	atomic_store(&r->knobs->served, 1);
	rc = sel_shard_peer_serve(p, &ops);
	fprintf(stderr, "rank %u: serve returned %d: %s\n", r->rank, rc,
		rc ? sel_errmsg() : "drained");
	sel_shard_peer_destroy(p);
	close(fd);
	sfx_dir_close(r);
	return rc == 0 ? 0 : rc == SEL_ESTOPPED ? 3 : 4;
}

struct peer_arg {
	struct sfx_rank *r;
	const struct sfx_peer_opts *o;
};
static int peer_fn(void *arg)
{
	struct peer_arg *a = arg;
	return sfx_peer_main(a->r, a->o);
}

pid_t sfx_fork_fn(int (*fn)(void *), void *arg)
{
	fflush(stdout);
	fflush(stderr);
	pid_t parent = getpid();
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		int code = fn(arg);
		fflush(stdout);
		fflush(stderr);
		_exit(code);
	}
	return pid;
}

pid_t sfx_fork(struct sfx_rank *r, const struct sfx_peer_opts *o)
{
	struct peer_arg a = {r, o};
	return sfx_fork_fn(peer_fn, &a);
}

int sfx_wait_exit(pid_t pid, uint64_t deadline_ns)
{
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	for (;;) {
		int st;
		pid_t w = waitpid(pid, &st, WNOHANG);
		if (w == pid) {
			if (pfd >= 0)
				close(pfd);
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		}
		uint64_t now = eos_now_ns();
		if (now >= deadline_ns) {
			if (pfd >= 0)
				close(pfd);
			return -1;
		}
		int t = (int)((deadline_ns - now) / 1000000) + 1;
		struct pollfd pf = {pfd, POLLIN, 0};
		if (pfd >= 0)
			poll(&pf, 1, t);
		else
			poll(NULL, 0, t < 10 ? t : 10);
	}
}

void sfx_primary_config(struct sel_shard_config *cfg, uint32_t world)
{
	memset(cfg, 0, sizeof *cfg);
	cfg->world = world;
	cfg->page_tokens = SFX_PAGE_TOKENS;
	sfx_identity(cfg->identity, 0);
	for (uint32_t r = 0; r < world; r++)
		sfx_fingerprint(world, r, cfg->fingerprint[r]);
	cfg->set = (struct sel_shard_settings){true, SFX_LIMIT};
	cfg->listen_addr = "127.0.0.1";
}

int sfx_primary_join(sel_shard_set *s, struct sfx_rdv *v, uint32_t world, uint64_t deadline_ns)
{
	sfx_rdv_accept(v, world, deadline_ns);
	for (uint32_t r = 1; r < world; r++) {
		uint8_t hello[256];
		int n = sel_shard_hello(s, r, v->fd[r], hello, sizeof hello);
		CHECK_OK(n);
		CHECK_OK(sel_shard_send(v->fd[r], hello, (size_t)n, deadline_ns));
	}
	return sel_shard_join(s, deadline_ns);
}

int sfx_primary_agree(sel_shard_set *s, struct sfx_rank *r0, struct sel_shard_agree_stats *st,
		      uint64_t deadline_ns)
{
	sel_scan sc;
	struct sel_shard_entry *e;
	sfx_scan(r0, sel_shard_disk_limit(s), &sc, &e);
	uint8_t *act = malloc(sc.n ? sc.n : 1);
	int rc = sel_shard_agreement(s, e, sc.n, act, st, deadline_ns);
	if (!rc)
		rc = sel_shard_apply(r0->lk.fd, &sc, act, NULL, NULL);
	free(act);
	free(e);
	sel_scan_free(&sc);
	return rc;
}

int sfx_wait_done(sel_shard_set *s, struct sel_shard_done *d, uint64_t deadline_ns)
{
	for (;;) {
		int n = sel_shard_poll(s, d, 1);
		if (n != 0)
			return n;
		uint64_t now = eos_now_ns();
		if (now >= deadline_ns)
			return -ETIMEDOUT;
		struct pollfd pf = {sel_shard_wait_fd(s), POLLIN, 0};
		poll(&pf, 1, (int)((deadline_ns - now) / 1000000) + 1);
	}
}

void sfx_job_all(sel_shard_set *s, struct sfx_rank *r0, const struct sel_shard_job *j,
		 struct sel_shard_result *local, struct sel_shard_done *d)
{
	uint64_t id;
	CHECK_OK(sel_shard_submit(s, j, 0, 42, &id));
	sfx_run_job(r0, j, local);
	CHECK_OK(sel_shard_check(s));
	int rc = sfx_wait_done(s, d, eos_now_ns() + 60 * SFX_S);
	CHECKF(rc == 1, "job %" PRIu64 ": %d %s", id, rc, sel_errmsg());
	CHECK(d->id == id && d->cookie == 42 && d->op == j->op);
	CHECK_OK(sel_shard_check(s));
}
