/*
 * test_transfer.c - per-rank transfer threads and the host copy backend
 * (design 2.5 "Transfers", 2.10, 2.12).
 *
 * Covers, with planes in ordinary aligned host memory:
 *   - round trips on 1 and 2 ranks (TP2 with replicated planes, identical on
 *     both ranks, and with split planes, different per rank): patterns in
 *     chosen page ids and a row copied out into slots (checked in place at
 *     their slot offsets), planes poisoned, copied back into different page
 *     ids and a different state slot, compared byte-exact, and nothing
 *     outside the destinations written; jobs of 0 (row only), 1, 63, 64, 65
 *     and 200 pages, counting one backend call per window; the host
 *     backend on windows large enough for its streaming stores, with
 *     pieces off cache lines;
 *   - backend bounds: calls split by entries and bytes, long copies cut;
 *   - compare and pack: replicated records packed (pages and row) into the
 *     documented slots, the tail slots then garbage, and a packed copy-in
 *     fanning the one share out byte-exact; records differing in pages or
 *     in the row pack only the other half; split records and unequal layouts
 *     never pack; packed jobs across unequal layouts refused;
 *   - argument validation (nothing queued on error);
 *   - a full channel: -EAGAIN with nothing queued on any rank;
 *   - a backend failing one call: the failure carries the rank, arrives only
 *     after that call drained, and other jobs are unaffected;
 *   - close: draining queued jobs, and a backend stuck past the deadline
 *     (SEL_ESTOPPED, no crash, later submissions refused);
 *   - the eventfd readable exactly while completions wait;
 *   - the thread's name, the offload class (--offload-sched) and nice value
 *     seen from open_rank;
 *   - a rank whose open fails failing sel_xfer_create with its message;
 *   - a restore shared with the rank's helper (landed hook's share): every
 *     page once, byte-exact, on either thread, window calls after all of
 *     them; none after a failure on either thread.
 */
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "eos.h"
#include "slab.h"
#include "testutil.h"
#include "transfer.h"

#define MAXR 2
#define MAXP 4
#define POISON 0x5a

/* ---- A stub backend: memcpy plus recording, failing and blocking -------- */

struct stub {
	uint64_t max_bytes;
	uint32_t max_entries;
	int fail_rank, fail_call, fail_rc; /* fail call #fail_call on fail_rank */
	int open_fail_rank, open_fail_rc;
	int block_rank;    /* -1: none; else block every call */
	uint64_t delay_ns; /* sleep in every call */
	atomic_int calls[MAXR];
	atomic_ullong bytes[MAXR];
	atomic_int violations;
	atomic_int opens, closes;
	atomic_int drained; /* the failing call finished its copies */
	atomic_int sched_ok, nice_ok, name_ok;
	pthread_mutex_t m;
	pthread_cond_t cv;
	int blocked; /* calls waiting */
	bool release;
	uint32_t rank_ids[MAXR];
};

static void stub_init(struct stub *s)
{
	memset(s, 0, sizeof(*s));
	s->fail_rank = s->fail_call = s->open_fail_rank = s->block_rank = -1;
	pthread_mutex_init(&s->m, NULL);
	pthread_cond_init(&s->cv, NULL);
	for (uint32_t r = 0; r < MAXR; r++)
		s->rank_ids[r] = r;
}

static void stub_fini(struct stub *s)
{
	pthread_mutex_destroy(&s->m);
	pthread_cond_destroy(&s->cv);
}

static int stub_open(void *ctx, uint32_t rank, void **state)
{
	struct stub *s = ctx;
	char name[32] = "";
	atomic_fetch_add(&s->opens, 1);
	/* The offload class in effect (eos_offload_sched; SCHED_OTHER by default). */
	static const int policy[] = {[EOS_SCHED_OTHER] = SCHED_OTHER,
				     [EOS_SCHED_BATCH] = SCHED_BATCH,
				     [EOS_SCHED_IDLE] = SCHED_IDLE};
	if (sched_getscheduler(0) == policy[eos_offload_sched()])
		atomic_fetch_add(&s->sched_ok, 1);
	errno = 0;
	int nice = getpriority(PRIO_PROCESS, (id_t)gettid());
	if (errno == 0 && nice >= 10)
		atomic_fetch_add(&s->nice_ok, 1);
	prctl(PR_GET_NAME, name, 0, 0, 0);
	char want[32];
	snprintf(want, sizeof(want), "sel-xfer-%u", rank);
	if (strcmp(name, want) == 0)
		atomic_fetch_add(&s->name_ok, 1);
	if ((int)rank == s->open_fail_rank)
		return eos_fail(s->open_fail_rc, "cuda unavailable: test driver missing");
	*state = &s->rank_ids[rank];
	return 0;
}

static struct stub *stub_of(void *state, uint32_t *rank);

/* rank_ids[r] lives inside the stub: recover both. */
static struct stub *stub_of(void *state, uint32_t *rank)
{
	uint32_t *id = state;
	*rank = *id;
	return (struct stub *)((char *)(id - *id) - offsetof(struct stub, rank_ids));
}

static int stub_copy(void *state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	uint32_t r;
	struct stub *s = stub_of(state, &r);
	uint64_t sum = 0;
	(void)dir;
	for (uint32_t i = 0; i < n; i++)
		sum += c[i].len;
	if (n == 0 || (s->max_entries && n > s->max_entries) ||
	    (s->max_bytes && sum > s->max_bytes))
		atomic_fetch_add(&s->violations, 1);
	if ((int)r == s->block_rank) {
		pthread_mutex_lock(&s->m);
		s->blocked++;
		pthread_cond_broadcast(&s->cv);
		while (!s->release)
			pthread_cond_wait(&s->cv, &s->m);
		s->blocked--;
		pthread_mutex_unlock(&s->m);
	}
	if (s->delay_ns)
		eos_sleep_ns(s->delay_ns);
	int call = atomic_fetch_add(&s->calls[r], 1);
	if ((int)r == s->fail_rank && call == s->fail_call) {
		/* Part of the batch lands, the rest "drains" a while. */
		for (uint32_t i = 0; i < n / 2; i++)
			memcpy((void *)(uintptr_t)c[i].dst, (const void *)(uintptr_t)c[i].src,
			       c[i].len);
		eos_sleep_ns(20 * 1000000ull);
		atomic_store(&s->drained, 1);
		return s->fail_rc;
	}
	for (uint32_t i = 0; i < n; i++)
		memcpy((void *)(uintptr_t)c[i].dst, (const void *)(uintptr_t)c[i].src, c[i].len);
	atomic_fetch_add(&s->bytes[r], sum);
	return 0;
}

static void stub_close(void *state)
{
	uint32_t r;
	struct stub *s = stub_of(state, &r);
	atomic_fetch_add(&s->closes, 1);
}

static struct sel_copy_backend stub_backend(struct stub *s)
{
	return (struct sel_copy_backend){
		.name = "stub",
		.ctx = s,
		.open_rank = stub_open,
		.copy = stub_copy,
		.close_rank = stub_close,
		.max_call_bytes = s->max_bytes,
		.max_call_entries = s->max_entries,
	};
}

static void stub_wait_blocked(struct stub *s, int n)
{
	pthread_mutex_lock(&s->m);
	while (s->blocked < n)
		pthread_cond_wait(&s->cv, &s->m);
	pthread_mutex_unlock(&s->m);
}

static void stub_release(struct stub *s)
{
	pthread_mutex_lock(&s->m);
	s->release = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->m);
}

/* ---- A world: planes, geometry, layout, pool, transfer set -------------- */

struct spec {
	uint32_t ranks;
	uint32_t n_planes;
	uint64_t units[MAXR][MAXP];
	uint64_t row_bytes[MAXR];
	bool replicated; /* identical plane and row bytes on every rank */
	uint64_t pages, rows;
	uint64_t slots;
	uint32_t depth;
	const struct sel_copy_backend *be;
};

struct world {
	struct spec sp;
	uint8_t *mem[MAXR][MAXP + 1]; /* planes, then the row plane */
	uint64_t len[MAXR][MAXP + 1];
	sel_geometry *g;
	sel_slot_layout l;
	sel_slab_pool *pool;
	sel_xfer *x;
};

static const char *plane_names[MAXP] = {"key", "sel", "value", "zidx"};

static void world_open(struct world *w, const struct spec *sp, test_rng *rng)
{
	sel_allocation a[MAXR * (MAXP + 1)];
	size_t na = 0;
	memset(w, 0, sizeof(*w));
	w->sp = *sp;
	uint64_t seed = test_rng_next(rng);
	for (uint32_t r = 0; r < sp->ranks; r++) {
		for (uint32_t p = 0; p <= sp->n_planes; p++) {
			bool row = p == sp->n_planes;
			uint64_t unit = row ? sp->row_bytes[r] : sp->units[r][p];
			uint64_t count = row ? sp->rows : sp->pages;
			w->len[r][p] = unit * count;
			w->mem[r][p] = eos_aligned_alloc(EOS_ALIGN, w->len[r][p]);
			CHECK(w->mem[r][p] != NULL);
			test_rng pr;
			test_rng_init(&pr, sp->replicated ? seed + p : test_rng_next(rng));
			test_rng_fill(&pr, w->mem[r][p], w->len[r][p]);
			a[na++] = (sel_allocation){
				.rank = r,
				.name = row ? "state" : plane_names[p],
				.group = row ? SEL_GROUP_STATE_ROWS : SEL_GROUP_KV_PAGES,
				.kind = SEL_MEM_HOST,
				.address = (uint64_t)(uintptr_t)w->mem[r][p],
				.unit_bytes = unit,
				.count = count,
			};
		}
	}
	CHECK_OK(sel_geometry_build(a, na, sp->ranks, 64, &w->g));
	CHECK_OK(sel_slot_layout_init(&w->l, w->g));
	CHECK_OK(sel_slab_create(w->l.slot_bytes, 0, sp->slots, false, NULL, &w->pool));
	CHECK_OK(sel_xfer_create(w->g, &w->l, w->pool, sp->be ? sp->be : &sel_copy_backend_host,
				 sp->depth ? sp->depth : 8, &w->x));
	CHECK_OK(sel_xfer_check(w->x));
}

static void world_close(struct world *w)
{
	if (w->x) {
		CHECK_OK(sel_xfer_check(w->x));
		CHECK_OK(sel_xfer_close(w->x, 0));
		sel_xfer_destroy(w->x);
	}
	sel_slab_destroy(w->pool);
	sel_slot_layout_free(&w->l);
	sel_geometry_free(w->g);
	for (uint32_t r = 0; r < MAXR; r++)
		for (uint32_t p = 0; p <= MAXP; p++)
			eos_aligned_free(w->mem[r][p]);
	memset(w, 0, sizeof(*w));
}

static uint8_t *page_at(const struct world *w, uint32_t r, uint32_t p, uint32_t id)
{
	const sel_plane *pl = &w->g->rank[r].pages[p];
	return (uint8_t *)(uintptr_t)(pl->address + (uint64_t)id * pl->unit_bytes);
}

static uint8_t *row_at(const struct world *w, uint32_t r, uint32_t slot)
{
	const sel_plane *pl = &w->g->rank[r].row;
	return (uint8_t *)(uintptr_t)(pl->address + (uint64_t)slot * pl->unit_bytes);
}

static uint8_t *share_at(const struct world *w, uint32_t r, uint32_t slot)
{
	return (uint8_t *)sel_slab_addr(w->pool, slot) + w->l.share_off[r];
}

/* The checkpoint's bytes (rank-major: pages in job order, planes, then the
 * row), saved so planes can be poisoned. */
struct snap {
	uint8_t *b;
	uint64_t len;
};

static void snap_take(const struct world *w, const uint32_t *ids, uint32_t n, bool row,
		      uint32_t state, struct snap *s)
{
	uint64_t len = 0;
	for (uint32_t r = 0; r < w->sp.ranks; r++)
		len += (uint64_t)n * w->g->rank[r].page_bytes +
		       (row ? w->g->rank[r].row.unit_bytes : 0);
	s->len = len;
	s->b = malloc(len ? len : 1);
	CHECK(s->b);
	uint8_t *o = s->b;
	for (uint32_t r = 0; r < w->sp.ranks; r++) {
		const sel_rank_geometry *rg = &w->g->rank[r];
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t p = 0; p < rg->n_planes; p++) {
				memcpy(o, page_at(w, r, p, ids[i]), rg->pages[p].unit_bytes);
				o += rg->pages[p].unit_bytes;
			}
		if (row) {
			memcpy(o, row_at(w, r, state), rg->row.unit_bytes);
			o += rg->row.unit_bytes;
		}
	}
}

/* Do the planes at ids / state hold the snapshot?  Returns a description of
 * the first difference, or NULL. */
static const char *snap_differs(const struct world *w, const uint32_t *ids, uint32_t n, bool row,
				uint32_t state, const struct snap *s)
{
	static char why[128];
	const uint8_t *o = s->b;
	for (uint32_t r = 0; r < w->sp.ranks; r++) {
		const sel_rank_geometry *rg = &w->g->rank[r];
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t p = 0; p < rg->n_planes; p++) {
				if (memcmp(o, page_at(w, r, p, ids[i]), rg->pages[p].unit_bytes) !=
				    0) {
					snprintf(why, sizeof(why),
						 "rank %u page %u (id %u) plane %u", r, i, ids[i],
						 p);
					return why;
				}
				o += rg->pages[p].unit_bytes;
			}
		if (row) {
			if (memcmp(o, row_at(w, r, state), rg->row.unit_bytes) != 0) {
				snprintf(why, sizeof(why), "rank %u row (slot %u)", r, state);
				return why;
			}
			o += rg->row.unit_bytes;
		}
	}
	return NULL;
}

static void poison(struct world *w)
{
	for (uint32_t r = 0; r < w->sp.ranks; r++)
		for (uint32_t p = 0; p <= w->sp.n_planes; p++)
			memset(w->mem[r][p], POISON, w->len[r][p]);
}

/* Everything but ids / state still holds the poison. */
static void check_poison_elsewhere(const struct world *w, const uint32_t *ids, uint32_t n, bool row,
				   uint32_t state)
{
	uint8_t *hit = calloc(w->sp.pages, 1);
	CHECK(hit);
	for (uint32_t i = 0; i < n; i++)
		hit[ids[i]] = 1;
	for (uint32_t r = 0; r < w->sp.ranks; r++) {
		const sel_rank_geometry *rg = &w->g->rank[r];
		for (uint32_t p = 0; p < rg->n_planes; p++)
			for (uint64_t id = 0; id < w->sp.pages; id++) {
				if (hit[id])
					continue;
				const uint8_t *b = page_at(w, r, p, (uint32_t)id);
				for (uint64_t k = 0; k < rg->pages[p].unit_bytes; k++)
					CHECKF(b[k] == POISON,
					       "rank %u plane %u page %" PRIu64 " byte %" PRIu64
					       " written",
					       r, p, id, k);
			}
		for (uint64_t s = 0; s < w->sp.rows; s++) {
			if (row && s == state)
				continue;
			const uint8_t *b = row_at(w, r, (uint32_t)s);
			for (uint64_t k = 0; k < rg->row.unit_bytes; k++)
				CHECKF(b[k] == POISON,
				       "rank %u row %" PRIu64 " byte %" PRIu64 " written", r, s, k);
		}
	}
	free(hit);
}

/* Collect want completions (waiting on the eventfd), in completion order. */
static void collect(sel_xfer *x, struct sel_xfer_job **out, int want)
{
	int got = 0;
	uint64_t end = eos_now_ns() + 60ull * 1000000000u;
	while (got < want) {
		struct pollfd pfd = {.fd = sel_xfer_fd(x), .events = POLLIN};
		int ready = poll(&pfd, 1, 1000);
		CHECK(ready >= 0);
		CHECKF(eos_now_ns() < end, "%d of %d completions after 60 s", got, want);
		if (ready == 0)
			continue;
		int n = sel_xfer_poll(x, out + got, (size_t)(want - got));
		CHECKF(n > 0, "eventfd readable but nothing to poll");
		got += n;
	}
}

static void run(sel_xfer *x, struct sel_xfer_job *job)
{
	struct sel_xfer_job *done;
	CHECK_OK(sel_xfer_submit(x, job));
	collect(x, &done, 1);
	CHECK(done == job);
	CHECK_OK(sel_xfer_check(x));
}

/* n distinct ids below limit: the first n of a shuffled 0..limit-1, and
 * the next n as a second, disjoint set when dst is non-NULL. */
static void pick_ids(test_rng *rng, uint64_t limit, uint32_t n, uint32_t *src, uint32_t *dst)
{
	uint32_t *all = malloc(limit * sizeof(*all));
	CHECK(all);
	for (uint32_t i = 0; i < limit; i++)
		all[i] = i;
	for (uint32_t i = (uint32_t)limit - 1; i > 0; i--) {
		uint32_t j = (uint32_t)test_rng_below(rng, i + 1), t = all[i];
		all[i] = all[j];
		all[j] = t;
	}
	CHECK(n * (dst ? 2ull : 1ull) <= limit);
	memcpy(src, all, n * sizeof(*src));
	if (dst)
		memcpy(dst, all + n, n * sizeof(*dst));
	free(all);
}

/* Slot bytes of page i / the row hold the snapshot, unpacked. */
static void check_slots_unpacked(const struct world *w, const uint32_t *ids, uint32_t n, bool row,
				 uint32_t state, const uint32_t *ps, const uint32_t *rs)
{
	for (uint32_t r = 0; r < w->sp.ranks; r++) {
		const sel_rank_geometry *rg = &w->g->rank[r];
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t p = 0; p < rg->n_planes; p++)
				CHECKF(memcmp(share_at(w, r, ps[i]) + w->l.plane_off[r][p],
					      page_at(w, r, p, ids[i]),
					      rg->pages[p].unit_bytes) == 0,
				       "slot of rank %u page %u plane %u", r, i, p);
		if (row)
			for (uint32_t k = 0; k < w->l.row_slots; k++) {
				uint64_t off, len;
				sel_slot_layout_row_piece(&w->l, r, k, &off, &len);
				CHECK(off == w->l.share_off[r]);
				if (len)
					CHECKF(memcmp(share_at(w, r, rs[k]),
						      row_at(w, r, state) + k * w->l.share[r],
						      len) == 0,
					       "slot of rank %u row piece %u", r, k);
			}
	}
}

/* ---- Round trips --------------------------------------------------------- */

static void roundtrip(struct world *w, struct stub *st, test_rng *rng, uint32_t n, bool row)
{
	uint32_t *src = malloc((n + 1) * sizeof(*src)), *dst = malloc((n + 1) * sizeof(*dst));
	uint32_t *ps = malloc((n + 1) * sizeof(*ps)), *rs = malloc(w->l.row_slots * sizeof(*rs));
	CHECK(src && dst && ps && rs);
	pick_ids(rng, w->sp.pages, n, src, dst);
	uint32_t s_state = (uint32_t)test_rng_below(rng, w->sp.rows);
	uint32_t d_state = (s_state + 1 + (uint32_t)test_rng_below(rng, w->sp.rows - 1)) %
			   (uint32_t)w->sp.rows;
	CHECK_OK(sel_slab_alloc(w->pool, n, SEL_SLAB_INTAKE, ps));
	if (row)
		CHECK_OK(sel_slab_alloc(w->pool, w->l.row_slots, SEL_SLAB_INTAKE, rs));

	struct snap snap;
	snap_take(w, src, n, row, s_state, &snap);

	int calls0[MAXR];
	for (uint32_t r = 0; r < MAXR; r++)
		calls0[r] = st ? atomic_load(&st->calls[r]) : 0;

	struct sel_xfer_job out = {
		.id = 1,
		.dir = SEL_COPY_OUT,
		.n_pages = n,
		.pages = src,
		.page_slots = ps,
		.row = row,
		.state_slot = s_state,
		.row_slots = rs,
	};
	run(w->x, &out);
	CHECKF(out.status == 0, "copy-out of %u pages: %s", n, sel_strerror(out.status));
	CHECK(!out.pages_replicated && !out.row_replicated);
	CHECK(out.bytes == snap.len);
	CHECK(out.done_ns >= out.submit_ns && out.submit_ns > 0);
	check_slots_unpacked(w, src, n, row, s_state, ps, rs);

	if (st) {
		/* One backend call per window (no bounds): the row rides along. */
		uint32_t windows = n ? (n + SEL_WINDOW_PAGES - 1) / SEL_WINDOW_PAGES : 1;
		for (uint32_t r = 0; r < w->sp.ranks; r++)
			CHECKF(atomic_load(&st->calls[r]) - calls0[r] == (int)windows,
			       "rank %u: %d calls for %u pages, want %u", r,
			       atomic_load(&st->calls[r]) - calls0[r], n, windows);
	}

	poison(w);
	struct sel_xfer_job in = {
		.id = 2,
		.dir = SEL_COPY_IN,
		.n_pages = n,
		.pages = dst,
		.page_slots = ps,
		.row = row,
		.state_slot = d_state,
		.row_slots = rs,
	};
	run(w->x, &in);
	CHECK(in.status == 0);
	CHECK(in.bytes == snap.len);
	const char *why = snap_differs(w, dst, n, row, d_state, &snap);
	CHECKF(!why, "%u pages round trip on %u ranks: %s differs", n, w->sp.ranks, why);
	check_poison_elsewhere(w, dst, n, row, d_state);

	CHECK_OK(sel_slab_free(w->pool, ps, n));
	if (row)
		CHECK_OK(sel_slab_free(w->pool, rs, w->l.row_slots));
	CHECK(sel_xfer_inflight(w->x) == 0);
	free(snap.b);
	free(src);
	free(dst);
	free(ps);
	free(rs);
}

static struct spec spec_tp1(void)
{
	return (struct spec){
		.ranks = 1,
		.n_planes = 3,
		.units = {{16384, 100, 4608}},
		.row_bytes = {70000},
		.pages = 420,
		.rows = 6,
		.slots = 220,
	};
}

static struct spec spec_tp2(bool replicated)
{
	return (struct spec){
		.ranks = 2,
		.n_planes = 3,
		.units = {{16384, 100, 4608}, {16384, 100, 4608}},
		.row_bytes = {70000, 70000},
		.replicated = replicated,
		.pages = 420,
		.rows = 6,
		.slots = 220,
	};
}

static void test_roundtrips(test_rng *rng)
{
	static const uint32_t sizes[] = {1, 63, 64, 65, 200};
	for (int c = 0; c < 3; c++) {
		struct spec sp = c == 0 ? spec_tp1() : spec_tp2(c == 1);
		struct stub st;
		stub_init(&st);
		struct sel_copy_backend be = stub_backend(&st);
		sp.be = &be;
		struct world w;
		world_open(&w, &sp, rng);
		CHECK(w.l.row_slots == 3); /* 70000 bytes in shares of 28 KiB */
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			roundtrip(&w, &st, rng, sizes[i], true);
		roundtrip(&w, &st, rng, 0, true);   /* row only */
		roundtrip(&w, &st, rng, 70, false); /* pages only */
		CHECK(atomic_load(&st.violations) == 0);
		world_close(&w);
		CHECK(atomic_load(&st.opens) == (int)sp.ranks &&
		      atomic_load(&st.closes) == (int)sp.ranks);
		stub_fini(&st);
	}
	/* The plain host backend, as the stores use it. */
	struct spec sp = spec_tp2(false);
	struct world w;
	world_open(&w, &sp, rng);
	roundtrip(&w, NULL, rng, 65, true);
	world_close(&w);

	/* Windows of more than 4 MiB per rank, which the host backend copies
	 * with streaming stores where the CPU has them (copy_host.c): odd unit
	 * sizes, so plane pieces start and end off cache lines, and a piece
	 * below the streaming minimum among them. */
	sp = (struct spec){
		.ranks = 2,
		.n_planes = 3,
		.units = {{65536 + 3, 100, 4096 + 17}, {65536 + 3, 100, 4096 + 17}},
		.row_bytes = {300001, 300001},
		.pages = 300,
		.rows = 4,
		.slots = 150,
	};
	CHECK(sel_host_copy_choose(64 * (65536 + 3 + 100 + 4096 + 17)) != SEL_HOST_COPY_MEMCPY ||
	      !sel_host_copy_available(SEL_HOST_COPY_STREAM_SSE2));
	world_open(&w, &sp, rng);
	roundtrip(&w, NULL, rng, 130, true);
	roundtrip(&w, NULL, rng, 64, false);
	world_close(&w);

	/* Windows of more than 8 MiB per rank, which rank 0 splits with its
	 * helper thread where the process has 2 CPUs (copy_host.c DESIGN
	 * "Splitting"): its 1 MiB chunks begin and end inside pieces. */
	sp.units[0][0] = sp.units[1][0] = 131072 + 3;
	world_open(&w, &sp, rng);
	roundtrip(&w, NULL, rng, 130, true);
	roundtrip(&w, NULL, rng, 64, false);
	world_close(&w);
}

/* Calls bounded to 5 entries and 10,000 bytes: 16 KiB copies are cut. */
static void test_bounds(test_rng *rng)
{
	struct stub st;
	stub_init(&st);
	st.max_bytes = 10000;
	st.max_entries = 5;
	struct sel_copy_backend be = stub_backend(&st);
	struct spec sp = spec_tp2(false);
	sp.be = &be;
	struct world w;
	world_open(&w, &sp, rng);
	roundtrip(&w, NULL, rng, 70, true);
	CHECK(atomic_load(&st.violations) == 0);
	/* At least one call per 10,000 bytes. */
	uint64_t bytes = atomic_load(&st.bytes[0]);
	CHECK((uint64_t)atomic_load(&st.calls[0]) >= bytes / 10000);
	world_close(&w);
	stub_fini(&st);
}

/* ---- Compare and pack ----------------------------------------------------- */

enum diff {
	DIFF_NONE,
	DIFF_PAGE,
	DIFF_ROW
};

static void pack_case(test_rng *rng, uint32_t n, enum diff diff)
{
	struct spec sp = spec_tp2(true);
	struct world w;
	world_open(&w, &sp, rng);
	const uint32_t R = 2, RS = w.l.row_slots;
	uint32_t *src = malloc(n * sizeof(*src)), *dst = malloc(n * sizeof(*dst));
	uint32_t *ps = malloc(n * sizeof(*ps)), rs[8];
	CHECK(src && dst && ps && RS <= 8);
	pick_ids(rng, w.sp.pages, n, src, dst);
	uint32_t s_state = 1, d_state = 4;
	if (diff == DIFF_PAGE) /* last byte of the last page's last plane on rank 1 */
		page_at(&w, 1, 2, src[n - 1])[w.g->rank[1].pages[2].unit_bytes - 1] ^= 1;
	if (diff == DIFF_ROW)
		row_at(&w, 1, s_state)[12345] ^= 0x80;
	CHECK_OK(sel_slab_alloc(w.pool, n, SEL_SLAB_INTAKE, ps));
	CHECK_OK(sel_slab_alloc(w.pool, RS, SEL_SLAB_INTAKE, rs));
	struct snap snap;
	snap_take(&w, src, n, true, s_state, &snap);

	struct sel_xfer_job out = {
		.dir = SEL_COPY_OUT,
		.n_pages = n,
		.pages = src,
		.page_slots = ps,
		.row = true,
		.state_slot = s_state,
		.row_slots = rs,
		.compare = true,
	};
	run(w.x, &out);
	CHECK(out.status == 0);
	CHECK(out.pages_replicated == (diff != DIFF_PAGE));
	CHECK(out.row_replicated == (diff != DIFF_ROW));

	/* Packed layout: share i of rank 0 in slot ps[i / 2] at rank i % 2. */
	uint32_t np = out.pages_replicated ? (n + R - 1) / R : n;
	uint32_t nr = out.row_replicated ? (RS + R - 1) / R : RS;
	if (out.pages_replicated) {
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t p = 0; p < 3; p++)
				CHECKF(memcmp(share_at(&w, i % R, ps[i / R]) + w.l.plane_off[0][p],
					      page_at(&w, 0, p, src[i]),
					      w.g->rank[0].pages[p].unit_bytes) == 0,
				       "packed page %u plane %u", i, p);
		/* The tail is the store's to free: scribble over it. */
		for (uint32_t j = np; j < n; j++)
			memset(sel_slab_addr(w.pool, ps[j]), 0xee, w.l.slot_bytes);
	} else {
		check_slots_unpacked(&w, src, n, false, 0, ps, NULL);
	}
	if (out.row_replicated) {
		for (uint32_t k = 0; k < RS; k++) {
			uint64_t off, len;
			sel_slot_layout_row_piece(&w.l, 0, k, &off, &len);
			CHECK(memcmp(share_at(&w, k % R, rs[k / R]),
				     row_at(&w, 0, s_state) + k * w.l.share[0], len) == 0);
		}
		for (uint32_t j = nr; j < RS; j++)
			memset(sel_slab_addr(w.pool, rs[j]), 0xee, w.l.slot_bytes);
	} else {
		check_slots_unpacked(&w, NULL, 0, true, s_state, NULL, rs);
	}

	poison(&w);
	struct sel_xfer_job in = {
		.dir = SEL_COPY_IN,
		.n_pages = n,
		.pages = dst,
		.page_slots = ps,
		.row = true,
		.state_slot = d_state,
		.row_slots = rs,
		.pages_packed = out.pages_replicated,
		.row_packed = out.row_replicated,
	};
	run(w.x, &in);
	CHECK(in.status == 0);
	CHECK(in.bytes == snap.len);
	const char *why = snap_differs(&w, dst, n, true, d_state, &snap);
	CHECKF(!why, "packed round trip of %u pages (diff %d): %s differs", n, (int)diff, why);
	check_poison_elsewhere(&w, dst, n, true, d_state);

	CHECK_OK(sel_slab_free(w.pool, ps, n));
	CHECK_OK(sel_slab_free(w.pool, rs, RS));
	free(snap.b);
	free(src);
	free(dst);
	free(ps);
	world_close(&w);
}

static void test_pack(test_rng *rng)
{
	pack_case(rng, 65, DIFF_NONE);
	pack_case(rng, 1, DIFF_NONE);
	pack_case(rng, 130, DIFF_NONE);
	pack_case(rng, 65, DIFF_PAGE);
	pack_case(rng, 64, DIFF_ROW);

	/* Split planes never pack. */
	struct spec sp = spec_tp2(false);
	struct world w;
	world_open(&w, &sp, rng);
	uint32_t src[10], ps[10], rs[3];
	pick_ids(rng, w.sp.pages, 10, src, NULL);
	CHECK_OK(sel_slab_alloc(w.pool, 10, SEL_SLAB_INTAKE, ps));
	CHECK_OK(sel_slab_alloc(w.pool, 3, SEL_SLAB_INTAKE, rs));
	struct sel_xfer_job out = {
		.dir = SEL_COPY_OUT,
		.n_pages = 10,
		.pages = src,
		.page_slots = ps,
		.row = true,
		.state_slot = 2,
		.row_slots = rs,
		.compare = true,
	};
	run(w.x, &out);
	CHECK(out.status == 0 && !out.pages_replicated && !out.row_replicated);
	check_slots_unpacked(&w, src, 10, true, 2, ps, rs);
	world_close(&w);

	/* Unequal share layouts: identical leading bytes, never packed, and
	 * packed copy-ins are refused. */
	sp = spec_tp2(true);
	sp.units[1][1] = 200;
	world_open(&w, &sp, rng);
	CHECK_OK(sel_slab_alloc(w.pool, 10, SEL_SLAB_INTAKE, ps));
	CHECK_OK(sel_slab_alloc(w.pool, 3, SEL_SLAB_INTAKE, rs));
	out.pages = src;
	run(w.x, &out);
	CHECK(out.status == 0 && !out.pages_replicated && !out.row_replicated);
	struct sel_xfer_job in = {
		.dir = SEL_COPY_IN,
		.n_pages = 10,
		.pages = src,
		.page_slots = ps,
		.pages_packed = true,
	};
	CHECK_RC(sel_xfer_submit(w.x, &in), -EINVAL);
	CHECK(strstr(sel_errmsg(), "equal share layouts"));
	in.pages_packed = false;
	in.row = true;
	in.row_slots = rs;
	in.row_packed = true;
	CHECK_RC(sel_xfer_submit(w.x, &in), -EINVAL);
	CHECK(sel_xfer_inflight(w.x) == 0);
	world_close(&w);
}

/* ---- Validation ------------------------------------------------------------ */

static void test_validation(test_rng *rng)
{
	struct spec sp = spec_tp2(false);
	struct world w;
	world_open(&w, &sp, rng);
	uint32_t ids[2] = {3, 4}, ps[2] = {0, 1}, rs[3] = {2, 3, 4};
	struct sel_xfer_job ok = {
		.dir = SEL_COPY_OUT,
		.n_pages = 2,
		.pages = ids,
		.page_slots = ps,
		.row = true,
		.state_slot = 5,
		.row_slots = rs,
	};
	struct sel_xfer_job j;

	j = ok;
	uint32_t bad_ids[2] = {3, 420};
	j.pages = bad_ids;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	CHECK(strstr(sel_errmsg(), "page id 420"));
	j = ok;
	uint32_t bad_ps[2] = {0, 220};
	j.page_slots = bad_ps;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	j = ok;
	uint32_t bad_rs[3] = {2, 3, 999};
	j.row_slots = bad_rs;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	j = ok;
	j.state_slot = 6;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	j = ok;
	j.pages_packed = true;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	j = ok;
	j.dir = SEL_COPY_IN;
	j.compare = true;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	j = ok;
	j.pages = NULL;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	j = ok;
	j.row_slots = NULL;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	j = ok;
	j.dir = (enum sel_copy_dir)7;
	CHECK_RC(sel_xfer_submit(w.x, &j), -EINVAL);
	CHECK(sel_xfer_inflight(w.x) == 0);
	CHECK_OK(sel_xfer_check(w.x));
	/* The unbroken job still runs. */
	j = ok;
	run(w.x, &j);
	CHECK(j.status == 0);

	/* Creation arguments. */
	sel_xfer *x;
	CHECK_RC(sel_xfer_create(w.g, &w.l, w.pool, &sel_copy_backend_host, 0, &x), -EINVAL);
	CHECK(x == NULL);
	sel_slab_pool *other;
	CHECK_OK(sel_slab_create(w.l.slot_bytes + EOS_ALIGN, 0, 4, false, NULL, &other));
	CHECK_RC(sel_xfer_create(w.g, &w.l, other, &sel_copy_backend_host, 4, &x), -EINVAL);
	sel_slab_destroy(other);
	world_close(&w);
	sel_xfer_destroy(NULL);
}

/* ---- Queue full ------------------------------------------------------------- */

static void test_queue_full(test_rng *rng)
{
	struct stub st;
	stub_init(&st);
	st.block_rank = 0;
	struct sel_copy_backend be = stub_backend(&st);
	struct spec sp = spec_tp2(false);
	sp.be = &be;
	sp.depth = 2;
	struct world w;
	world_open(&w, &sp, rng);

	uint32_t ids[4] = {1, 2, 3, 4}, ps[4] = {0, 1, 2, 3};
	struct sel_xfer_job job[5];
	for (int i = 0; i < 5; i++)
		job[i] = (struct sel_xfer_job){.id = (uint64_t)i,
					       .dir = SEL_COPY_OUT,
					       .n_pages = 1,
					       .pages = &ids[i % 4],
					       .page_slots = &ps[i % 4]};
	/* Rank 0 takes job 0 and blocks in its copy; 1 and 2 fill its ring.
	 * Rank 1 runs all three. */
	CHECK_OK(sel_xfer_submit(w.x, &job[0]));
	stub_wait_blocked(&st, 1);
	for (int i = 1; i <= 2; i++) {
		CHECK_OK(sel_xfer_submit(w.x, &job[i]));
		uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
		while (atomic_load(&st.calls[1]) < i + 1) { /* rank 1 keeps its ring empty */
			CHECK(eos_now_ns() < deadline);
			eos_sleep_ns(1000000);
		}
	}
	CHECK_OK(sel_xfer_check(w.x));
	CHECK_RC(sel_xfer_submit(w.x, &job[3]), -EAGAIN);
	CHECK(strstr(sel_errmsg(), "rank 0"));
	CHECK(sel_xfer_inflight(w.x) == 3);
	/* Refused at submission, so rank 1 never saw job 3 (and, below, sees
	 * it exactly once when it is submitted again). */
	CHECK(atomic_load(&st.calls[1]) == 3);
	CHECK_OK(sel_xfer_check(w.x));
	struct sel_xfer_job *done[5];
	CHECK(sel_xfer_poll(w.x, done, 5) == 0);

	stub_release(&st);
	collect(w.x, done, 3);
	for (int i = 0; i < 3; i++)
		CHECK(done[i] == &job[i] && job[i].status == 0);
	CHECK_OK(sel_xfer_submit(w.x, &job[3]));
	collect(w.x, done, 1);
	CHECK(done[0] == &job[3] && atomic_load(&st.calls[1]) == 4 &&
	      atomic_load(&st.calls[0]) == 4);
	world_close(&w);
	stub_fini(&st);
}

/* ---- Failures ------------------------------------------------------------------ */

static void test_failure(test_rng *rng)
{
	struct stub st;
	stub_init(&st);
	st.fail_rank = 1;
	st.fail_call = 2; /* rank 1's first call of job 1 (jobs of 70 pages: 2 calls) */
	st.fail_rc = SEL_ECUDA;
	struct sel_copy_backend be = stub_backend(&st);
	struct spec sp = spec_tp2(false);
	sp.be = &be;
	struct world w;
	world_open(&w, &sp, rng);

	enum {
		N = 70
	};
	uint32_t src[3][N], dst[3][N], ps[3][N], rs[3][3];
	struct snap snap[3];
	struct sel_xfer_job job[3];
	for (int j = 0; j < 3; j++) {
		pick_ids(rng, 140, N, src[j], NULL);
		for (uint32_t i = 0; i < N; i++)
			src[j][i] += 140 * (uint32_t)j; /* disjoint per job */
		CHECK_OK(sel_slab_alloc(w.pool, N, SEL_SLAB_INTAKE, ps[j]));
		CHECK_OK(sel_slab_alloc(w.pool, 3, SEL_SLAB_INTAKE, rs[j]));
		snap_take(&w, src[j], N, true, (uint32_t)j, &snap[j]);
		job[j] = (struct sel_xfer_job){.id = (uint64_t)j,
					       .dir = SEL_COPY_OUT,
					       .n_pages = N,
					       .pages = src[j],
					       .page_slots = ps[j],
					       .row = true,
					       .state_slot = (uint32_t)j,
					       .row_slots = rs[j]};
		CHECK_OK(sel_xfer_submit(w.x, &job[j]));
	}
	struct sel_xfer_job *done[3];
	collect(w.x, done, 3);
	for (int j = 0; j < 3; j++)
		CHECK(done[j] == &job[j]);
	CHECK(job[0].status == 0 && job[2].status == 0);
	CHECK_RC(job[1].status, SEL_ECUDA);
	CHECK(job[1].failed_rank == 1);
	CHECK(atomic_load(&st.drained) == 1);
	/* Rank 1 stopped job 1 at the failed window: 1 call, not 2... */
	CHECK(atomic_load(&st.calls[1]) == 2 + 1 + 2);
	CHECK(atomic_load(&st.calls[0]) == 2 + 2 + 2);
	CHECK_OK(sel_xfer_check(w.x));

	/* ...and jobs 0 and 2 are intact: bring them back. */
	poison(&w);
	for (int j = 0; j < 3; j += 2) {
		pick_ids(rng, w.sp.pages, N, dst[j], NULL);
		struct sel_xfer_job in = {.dir = SEL_COPY_IN,
					  .n_pages = N,
					  .pages = dst[j],
					  .page_slots = ps[j],
					  .row = true,
					  .state_slot = 5,
					  .row_slots = rs[j]};
		run(w.x, &in);
		CHECK(in.status == 0);
		const char *why = snap_differs(&w, dst[j], N, true, 5, &snap[j]);
		CHECKF(!why, "job %d after a failed neighbour: %s", j, why);
	}
	for (int j = 0; j < 3; j++)
		free(snap[j].b);
	world_close(&w);
	stub_fini(&st);
}

/* ---- Landed windows (transfer.h sel_xfer_set_landed) ---------------- */

#define MAXPAGES_SEEN 200

struct landing {
	const struct world *w;
	const struct sel_xfer_job *job; /* the IN job whose windows land */
	atomic_int calls[MAXR], pages[MAXR], rows[MAXR];
	atomic_int violations; /* a window reported before its bytes landed, or out of order */
	atomic_int next[MAXR]; /* the window's expected first index */
	/* row_piece: calls, and the row's bytes landed so far (in order). */
	atomic_int piece_calls[MAXR];
	atomic_ullong piece_end[MAXR];
	bool pieces; /* the hook has row_piece: the row window needs them all */
	/* page: the pages reported alone so far, in the job's order. */
	atomic_int alone[MAXR];
	/* A shared restore (transfer.c "Sharing a restore"): pages in any
	 * order, each once (seen[r][k] for the job's index k), all before the
	 * first window's call; share answers share_now; calls by the helper
	 * thread; with wait_helper the rank's thread waits in its first page
	 * until the helper reported one. */
	bool shared, wait_helper;
	atomic_bool share_now;
	atomic_int seen[MAXR][MAXPAGES_SEEN];
	atomic_int by_helper, waited;
};

/* The IN job's row of rank r, bytes [off, off + len), equals its slots'. */
static bool row_landed_equal(const struct landing *L, uint32_t r, uint32_t slot, uint64_t off,
			     uint64_t len)
{
	const struct world *w = L->w;
	uint64_t share = w->l.share[r];
	const uint8_t *d = row_at(w, r, slot);
	for (uint64_t o = off; o < off + len;) {
		uint64_t k = o / share,
			 end = (k + 1) * share < off + len ? (k + 1) * share : off + len;
		const uint8_t *src = share_at(w, r, L->job->row_slots[k]) + (o - k * share);
		if (memcmp(d + o, src, end - o))
			return false;
		o = end;
	}
	return true;
}

/* The job's index of page id, or -1. */
static int job_index(const struct sel_xfer_job *job, uint32_t id)
{
	for (uint32_t k = 0; job && k < job->n_pages; k++)
		if (job->pages[k] == id)
			return (int)k;
	return -1;
}

/* A shared restore's page id landed on thread name: once, and on the
 * helper's thread or (with wait_helper, its first time) after the helper
 * took part.  The page's index in the job, or -1. */
static int shared_page(struct landing *L, uint32_t r, uint32_t id)
{
	char name[32] = "", helper[32];
	prctl(PR_GET_NAME, name, 0, 0, 0);
	snprintf(helper, sizeof helper, "sel-xfer-h%u", r);
	if (strcmp(name, helper) == 0)
		atomic_fetch_add(&L->by_helper, 1);
	else if (L->wait_helper && atomic_fetch_add(&L->waited, 1) == 0)
		TEST_UNTIL(atomic_load(&L->by_helper) > 0, 20);
	int k = job_index(L->job, id);
	if (k < 0 || atomic_fetch_add(&L->seen[r][k], 1) != 0)
		return -1;
	return k;
}

/* On the rank's thread (or its helper's, shared): the job's next page
 * landed alone, with one copy per plane from its slot's share. */
static void page_fn(void *ctx, uint32_t r, uint32_t id, const sel_landed_copy *c, uint32_t n)
{
	struct landing *L = ctx;
	const struct world *w = L->w;
	const struct sel_xfer_job *job = L->job;
	int k = L->shared ? shared_page(L, r, id) : atomic_load(&L->alone[r]);
	if (!L->shared && k < (int)MAXPAGES_SEEN)
		atomic_fetch_add(&L->seen[r][k], 1);
	bool bad = !job || k < 0 || k >= (int)job->n_pages || job->pages[k] != id ||
		   n != w->g->rank[r].n_planes;
	for (uint32_t p = 0; !bad && p < n; p++) {
		const uint8_t *src = share_at(w, r, job->page_slots[k]) + w->l.plane_off[r][p];
		bad = c[p].dst != page_at(w, r, p, id) || c[p].src != src ||
		      c[p].len != w->g->rank[r].pages[p].unit_bytes ||
		      memcmp(c[p].dst, c[p].src, c[p].len);
	}
	if (bad)
		atomic_fetch_add(&L->violations, 1);
	atomic_fetch_add(&L->alone[r], 1);
}

/* On the rank's thread: the row's next piece landed. */
static void row_piece_fn(void *ctx, uint32_t r, uint32_t slot, uint64_t off, uint64_t len,
			 const void *src)
{
	struct landing *L = ctx;
	atomic_fetch_add(&L->piece_calls[r], 1);
	if (!L->job || slot != L->job->state_slot || off != atomic_load(&L->piece_end[r]) ||
	    len == 0 || len > (256u << 10) || off + len > L->w->sp.row_bytes[r] ||
	    !row_landed_equal(L, r, slot, off, len) ||
	    memcmp(src, row_at(L->w, r, slot) + off, len)) {
		atomic_fetch_add(&L->violations, 1);
		return;
	}
	atomic_fetch_add(&L->piece_end[r], len);
}

/* On the rank's thread: the window's bytes are in the planes already. */
static void landed_fn(void *ctx, uint32_t r, const uint32_t *pages, uint32_t n, bool row,
		      uint32_t slot)
{
	struct landing *L = ctx;
	const struct sel_xfer_job *job = L->job;
	atomic_fetch_add(&L->calls[r], 1);
	if (!job || pages < job->pages || pages + n > job->pages + job->n_pages ||
	    (uint32_t)(pages - job->pages) != (uint32_t)atomic_load(&L->next[r]) ||
	    (row && (pages + n != job->pages + job->n_pages || slot != job->state_slot))) {
		atomic_fetch_add(&L->violations, 1);
		return;
	}
	atomic_fetch_add(&L->next[r], (int)n);
	int want = L->shared ? (int)job->n_pages : atomic_load(&L->next[r]);
	if (L->pieces && atomic_load(&L->alone[r]) != want)
		atomic_fetch_add(&L->violations, 1); /* a page not reported alone first */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t k = (uint32_t)(pages - job->pages) + i;
		const uint8_t *share = share_at(L->w, r, job->page_slots[k]);
		for (uint32_t p = 0; p < L->w->g->rank[r].n_planes; p++)
			if (memcmp(page_at(L->w, r, p, pages[i]), share + L->w->l.plane_off[r][p],
				   L->w->g->rank[r].pages[p].unit_bytes))
				atomic_fetch_add(&L->violations, 1);
	}
	atomic_fetch_add(&L->pages[r], (int)n);
	if (row) {
		atomic_fetch_add(&L->rows[r], 1);
		if (L->pieces && atomic_load(&L->piece_end[r]) != L->w->sp.row_bytes[r])
			atomic_fetch_add(&L->violations, 1);
		if (memcmp(row_at(L->w, r, slot), share_at(L->w, r, job->row_slots[0]),
			   L->w->l.share[r] < L->w->sp.row_bytes[r] ? L->w->l.share[r]
								    : L->w->sp.row_bytes[r]))
			atomic_fetch_add(&L->violations, 1);
	}
}

/* One OUT job of n pages and the row, then its IN job to other ids, with
 * the hook counting; returns the IN job's status. */
static int landed_case(struct world *w, struct landing *L, test_rng *rng, uint32_t n)
{
	uint32_t src[200], dst[200], ps[200], rs[128];
	CHECK(w->l.row_slots <= 128);
	CHECK(n <= 200);
	pick_ids(rng, w->sp.pages, n, src, dst);
	CHECK_OK(sel_slab_alloc(w->pool, n, SEL_SLAB_INTAKE, ps));
	CHECK_OK(sel_slab_alloc(w->pool, w->l.row_slots, SEL_SLAB_INTAKE, rs));
	struct sel_xfer_job out = {.dir = SEL_COPY_OUT,
				   .n_pages = n,
				   .pages = src,
				   .page_slots = ps,
				   .row = true,
				   .state_slot = 1,
				   .row_slots = rs};
	run(w->x, &out);
	CHECK(out.status == 0);
	for (uint32_t r = 0; r < MAXR; r++)
		CHECK(atomic_load(&L->calls[r]) == 0); /* copy-outs never land */
	struct sel_xfer_job in = out;
	in.dir = SEL_COPY_IN;
	in.pages = dst;
	in.state_slot = 4;
	L->job = &in;
	run(w->x, &in);
	L->job = NULL;
	sel_slab_free(w->pool, ps, n);
	sel_slab_free(w->pool, rs, w->l.row_slots);
	return in.status;
}

/* The hook runs after each landed copy-in window, in order, with the
 * window's ids and the row in the last one, on every rank; never for
 * copy-outs, and not for a failed window or those after it. */
static void test_landed(test_rng *rng)
{
	struct stub st;
	stub_init(&st);
	struct sel_copy_backend be = stub_backend(&st);
	struct spec sp = spec_tp2(false);
	sp.be = &be;
	struct world w;
	world_open(&w, &sp, rng);
	static struct landing L;
	memset(&L, 0, sizeof L);
	L.w = &w;
	sel_xfer_set_landed(w.x, &(sel_landed_hook){.fn = landed_fn, .ctx = &L});
	CHECK(landed_case(&w, &L, rng, 130) == 0); /* windows of 64, 64, 2 */
	for (uint32_t r = 0; r < 2; r++)
		CHECK(atomic_load(&L.calls[r]) == 3 && atomic_load(&L.pages[r]) == 130 &&
		      atomic_load(&L.rows[r]) == 1);
	CHECK(atomic_load(&L.violations) == 0);

	/* Rank 1's second call of the next IN job fails (calls so far: OUT 3
	 * and IN 3 per rank, then OUT 3): its first window landed, no more. */
	memset(&L, 0, sizeof L);
	L.w = &w;
	st.fail_rank = 1;
	st.fail_call = 3 + 3 + 3 + 1;
	st.fail_rc = SEL_ECUDA;
	CHECK(landed_case(&w, &L, rng, 130) == SEL_ECUDA);
	CHECK(atomic_load(&L.calls[0]) == 3 && atomic_load(&L.rows[0]) == 1);
	CHECK(atomic_load(&L.calls[1]) == 1 && atomic_load(&L.rows[1]) == 0 &&
	      atomic_load(&L.pages[1]) == 64);
	CHECK(atomic_load(&L.violations) == 0);
	world_close(&w);
	stub_fini(&st);
}

/* With row_piece the row's window hands the row over in pieces: in order,
 * each landed when reported with its source (equal bytes), together the
 * row, all before the window's call, one per row share here; with page,
 * every page is reported alone with its planes' copies before its
 * window's call. */
static void test_landed_pieces(test_rng *rng)
{
	for (int c = 0; c < 2; c++) {
		struct stub st;
		stub_init(&st);
		struct sel_copy_backend be = stub_backend(&st);
		struct spec sp = spec_tp2(false);
		if (c == 1)
			sp.row_bytes[0] = sp.row_bytes[1] = (3ull << 19) + 12345; /* 1.5 MiB + */
		sp.be = &be;
		struct world w;
		world_open(&w, &sp, rng);
		static struct landing L;
		memset(&L, 0, sizeof L);
		L.w = &w;
		L.pieces = true;
		sel_xfer_set_landed(w.x, &(sel_landed_hook){.fn = landed_fn,
							    .ctx = &L,
							    .row_piece = row_piece_fn,
							    .page = page_fn});
		CHECK(landed_case(&w, &L, rng, c == 0 ? 130 : 10) == 0);
		for (uint32_t r = 0; r < 2; r++) {
			CHECK(atomic_load(&L.rows[r]) == 1);
			CHECK(atomic_load(&L.alone[r]) == (c == 0 ? 130 : 10) &&
			      atomic_load(&L.pages[r]) == atomic_load(&L.alone[r]));
			CHECK(atomic_load(&L.piece_end[r]) == sp.row_bytes[r]);
			int pc = atomic_load(&L.piece_calls[r]);
			/* One a row share (28 KiB here), or more for a share over 256 KiB. */
			CHECKF(pc == (int)w.l.row_slots, "rank %u: %d pieces of %u shares", r, pc,
			       w.l.row_slots);
		}
		CHECK(atomic_load(&L.violations) == 0);
		CHECK(atomic_load(&st.violations) == 0);
		world_close(&w);
		stub_fini(&st);
	}
}

static bool share_fn(void *ctx)
{
	struct landing *L = ctx;
	return atomic_load(&L->share_now);
}

/* A restore shared with the rank's helper (transfer.c "Sharing a
 * restore"): with share true and two CPUs for rank 0 the helper copies
 * pages too (the rank's thread waits in its first page until it did);
 * either way every page lands once with its copies, byte-exact, the row in
 * pieces, and every window's call follows all pages, in order.  With share
 * false the rank's thread copies alone.  A cold call failing (on either
 * thread) fails the job with no window's call, and the next job is whole. */
static void test_landed_shared(test_rng *rng)
{
	cpu_set_t set;
	CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
	bool two = CPU_COUNT(&set) >= 2;
	struct stub st;
	stub_init(&st);
	struct sel_copy_backend be = stub_backend(&st);
	be.copy_cold = stub_copy;
	be.cold_any_thread = true;
	struct spec sp = spec_tp1();
	sp.be = &be;
	struct world w;
	world_open(&w, &sp, rng);
	static struct landing L;
	sel_xfer_set_landed(w.x, &(sel_landed_hook){.fn = landed_fn,
						    .ctx = &L,
						    .row_piece = row_piece_fn,
						    .page = page_fn,
						    .share = share_fn});
	if (!two)
		printf("one CPU allowed: no helper, so this checks the unshared path only\n");
	for (int c = 0; c < 5; c++) {
		memset(&L, 0, sizeof L);
		L.w = &w;
		/* Without a second CPU the rank has no helper and copies the job
		 * window by window, in order (test_landed_pieces' rules). */
		L.pieces = true;
		L.shared = two;
		atomic_store(&L.share_now, c != 1);
		L.wait_helper = two && c == 0;
		bool fail = c == 2 || c == 3;
		/* After the copy-out's 3 calls, the job's 2nd or 100th call past
		 * the row's pieces: a page's or a piece's, on either thread (the
		 * helper starts on pages while the rank's thread copies the row). */
		st.fail_rank = fail ? 0 : -1;
		st.fail_call =
			atomic_load(&st.calls[0]) + 3 + (int)w.l.row_slots + (c == 2 ? 1 : 99);
		st.fail_rc = SEL_ECUDA;
		uint64_t helped = sel_xfer_helped(w.x);
		int rc = landed_case(&w, &L, rng, 130);
		uint64_t by = sel_xfer_helped(w.x) - helped;
		CHECKF(by == (uint64_t)atomic_load(&L.by_helper),
		       "case %d: %" PRIu64 " helped, %d seen", c, by, atomic_load(&L.by_helper));
		CHECK(atomic_load(&L.violations) == 0);
		CHECK(atomic_load(&st.violations) == 0);
		if (fail) {
			CHECKF(rc == SEL_ECUDA, "case %d: %d", c, rc);
			CHECK(atomic_load(&L.rows[0]) == 0);
			CHECK(!two || atomic_load(&L.calls[0]) == 0); /* shared: no window at all */
			continue;
		}
		CHECKF(rc == 0, "case %d: %d", c, rc);
		CHECK(atomic_load(&L.calls[0]) == 3 && atomic_load(&L.pages[0]) == 130 &&
		      atomic_load(&L.rows[0]) == 1 && atomic_load(&L.alone[0]) == 130);
		for (uint32_t k = 0; k < 130; k++)
			CHECK(atomic_load(&L.seen[0][k]) == 1);
		CHECK(atomic_load(&L.piece_end[0]) == sp.row_bytes[0]);
		if (c == 0 && two)
			CHECK(by > 0);
		if (c == 1)
			CHECK(by == 0);
	}
	world_close(&w);
	stub_fini(&st);
}

/* A rank whose backend cannot open fails the whole set with its message. */
static void test_open_failure(test_rng *rng)
{
	struct stub st;
	stub_init(&st);
	st.open_fail_rank = 1;
	st.open_fail_rc = SEL_ECUDA;
	struct sel_copy_backend be = stub_backend(&st);
	struct spec sp = spec_tp2(false);
	struct world w;
	sp.be = &sel_copy_backend_host;
	world_open(&w, &sp, rng);
	sel_xfer *x = (sel_xfer *)1;
	CHECK_RC(sel_xfer_create(w.g, &w.l, w.pool, &be, 4, &x), SEL_ECUDA);
	CHECK(x == NULL);
	CHECK(strstr(sel_errmsg(), "cuda unavailable: test driver missing"));
	CHECK(strstr(sel_errmsg(), "rank 1"));
	CHECK(atomic_load(&st.opens) == 2 && atomic_load(&st.closes) == 1);
	world_close(&w);
	stub_fini(&st);
}

/* ---- Close ------------------------------------------------------------------------ */

static void test_close(test_rng *rng)
{
	/* Draining: queued jobs finish before close returns. */
	{
		struct stub st;
		stub_init(&st);
		st.delay_ns = 5 * 1000000ull;
		struct sel_copy_backend be = stub_backend(&st);
		struct spec sp = spec_tp2(false);
		sp.be = &be;
		struct world w;
		world_open(&w, &sp, rng);
		uint32_t ids[8], ps[8];
		struct sel_xfer_job job[8];
		for (uint32_t i = 0; i < 8; i++) {
			ids[i] = i;
			ps[i] = i;
			job[i] = (struct sel_xfer_job){.dir = SEL_COPY_OUT,
						       .n_pages = 1,
						       .pages = &ids[i],
						       .page_slots = &ps[i]};
			CHECK_OK(sel_xfer_submit(w.x, &job[i]));
		}
		CHECK_OK(sel_xfer_close(w.x, eos_now_ns() + 30ull * 1000000000u));
		CHECK_OK(sel_xfer_close(w.x, 1)); /* idempotent */
		struct sel_xfer_job extra = job[0];
		CHECK_RC(sel_xfer_submit(w.x, &extra), SEL_ESTOPPED);
		struct sel_xfer_job *done[8];
		CHECK(sel_xfer_poll(w.x, done, 8) == 8);
		for (uint32_t i = 0; i < 8; i++)
			CHECK(done[i] == &job[i] && job[i].status == 0);
		CHECK(sel_xfer_inflight(w.x) == 0);
		CHECK(atomic_load(&st.closes) == 2);
		world_close(&w);
		stub_fini(&st);
	}
	/* Stuck: rank 1 blocks past the deadline. */
	{
		/* Static: the detached thread may use all of it (the caller leaks). */
		static struct stub st;
		static struct sel_copy_backend be;
		static struct world w;
		static uint32_t ids[2] = {1, 2}, ps[2] = {0, 1};
		static struct sel_xfer_job job[2];
		stub_init(&st);
		st.block_rank = 1;
		be = stub_backend(&st);
		struct spec sp = spec_tp2(false);
		sp.be = &be;
		int before[64];
		int n_before = test_threads_named("sel-xfer-1", before, 64);
		CHECK(n_before <= 64);
		world_open(&w, &sp, rng);
		int rank1 = test_new_thread("sel-xfer-1", before, n_before);
		for (int i = 0; i < 2; i++) {
			job[i] = (struct sel_xfer_job){.dir = SEL_COPY_OUT,
						       .n_pages = 1,
						       .pages = &ids[i],
						       .page_slots = &ps[i]};
			CHECK_OK(sel_xfer_submit(w.x, &job[i]));
		}
		stub_wait_blocked(&st, 1);
		uint64_t t0 = eos_now_ns();
		CHECK_RC(sel_xfer_close(w.x, t0 + 100 * 1000000ull), SEL_ESTOPPED);
		CHECK(eos_now_ns() - t0 >= 90 * 1000000ull);
		CHECK(strstr(sel_errmsg(), "1 of 2 rank threads"));
		CHECK_RC(sel_xfer_close(w.x, 0), SEL_ESTOPPED);
		CHECK_RC(sel_xfer_submit(w.x, &job[0]), SEL_ESTOPPED);
		sel_xfer_destroy(w.x); /* leaves it alone */
		/* Let the stuck call return: the thread exits without reporting
		 * job 0 (never completed) or taking job 1.  The pool, planes,
		 * backend and jobs stay allocated, as the contract requires. */
		stub_release(&st);
		test_wait_thread_gone(rank1);
		CHECK(atomic_load(&st.calls[1]) == 1);
		CHECK(atomic_load(&st.closes) == 1); /* rank 0 only */
	}
}

/* ---- Eventfd and priority ------------------------------------------------------------ */

static bool readable(int fd)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	int n = poll(&pfd, 1, 0);
	CHECK(n >= 0);
	return n == 1;
}

static void test_eventfd_and_priority(test_rng *rng)
{
	struct stub st;
	stub_init(&st);
	struct sel_copy_backend be = stub_backend(&st);
	struct spec sp = spec_tp2(false);
	sp.be = &be;
	struct world w;
	eos_offload_sched_set(EOS_SCHED_BATCH); /* a class other than the default reaches them */
	world_open(&w, &sp, rng);
	eos_offload_sched_set(EOS_SCHED_OTHER);
	CHECK(atomic_load(&st.name_ok) == 2);
	CHECK(atomic_load(&st.sched_ok) == 2);
	CHECK(atomic_load(&st.nice_ok) == 2);
	/* The creating thread keeps its own policy. */
	CHECK(sched_getscheduler(0) == SCHED_OTHER);

	int fd = sel_xfer_fd(w.x);
	CHECK(fd >= 0 && !readable(fd));
	/* The warm pass's read (sel_xfer_warm) with nothing owed: it reads,
	 * and changes nothing. */
	CHECK(sel_xfer_warm(w.x) && !readable(fd));
	CHECK_OK(sel_xfer_check(w.x));
	uint32_t ids[2] = {7, 8}, ps[2] = {0, 1};
	struct sel_xfer_job job[2];
	for (int i = 0; i < 2; i++) {
		job[i] = (struct sel_xfer_job){
			.dir = SEL_COPY_OUT, .n_pages = 1, .pages = &ids[i], .page_slots = &ps[i]};
		CHECK_OK(sel_xfer_submit(w.x, &job[i]));
	}
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 10000) == 1);
	/* Closing joins the threads: both completions now wait. */
	CHECK_OK(sel_xfer_close(w.x, 0));
	CHECK(sel_xfer_inflight(w.x) == 2);
	CHECK_OK(sel_xfer_check(w.x));
	struct sel_xfer_job *done[2];
	/* Completions wait: the warm pass leaves the eventfd alone. */
	CHECK(!sel_xfer_warm(w.x) && readable(fd));
	CHECK(sel_xfer_poll(w.x, done, 1) == 1 && done[0] == &job[0]);
	CHECK(readable(fd)); /* job 1 still waits */
	CHECK(!sel_xfer_warm(w.x) && readable(fd));
	CHECK_OK(sel_xfer_check(w.x));
	CHECK(sel_xfer_poll(w.x, done, 2) == 1 && done[0] == &job[1]);
	CHECK(!readable(fd));
	CHECK(sel_xfer_warm(w.x) && !readable(fd));
	CHECK(sel_xfer_poll(w.x, done, 2) == 0);
	CHECK(!readable(fd));
	CHECK_OK(sel_xfer_check(w.x));
	world_close(&w);
	stub_fini(&st);
}

int main(void)
{
	test_rng rng;
	test_rng_init(&rng, test_seed());
	test_roundtrips(&rng);
	test_bounds(&rng);
	test_pack(&rng);
	test_validation(&rng);
	test_queue_full(&rng);
	test_failure(&rng);
	test_landed(&rng);
	test_landed_pieces(&rng);
	test_landed_shared(&rng);
	test_open_failure(&rng);
	test_close(&rng);
	test_eventfd_and_priority(&rng);
	printf("ok\n");
	return 0;
}
