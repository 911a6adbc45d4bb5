/* storefx.c - the shared store fixture (see storefx.h). */
#include "storefx.h"

#include "cudafake.h"
#include "store_composite.h"

#include <poll.h>
#include <stddef.h>
#include <time.h>
#include <unistd.h>

/* ---- stub copy backend ------------------------------------------------------ */

/* How long the test waits for the stub's copy threads (nice 10: far behind
 * any nice-0 load) to block or return: a stall, not a speed. */
#define SFX_STUB_WAIT_S 60

static const struct sel_cuda *dev_cu; /* device mode (sfx_devices) */
static int dev_ids[SFX_MAXR];
static bool dev_fake;

#define CU(f, call) CHECK_OK(sel_cuda_fail((f)->cu, (call), "%s", #call))

static struct sfx *stub_sfx(struct sfx_stub *st)
{
	return (struct sfx *)(void *)((char *)st - offsetof(struct sfx, stub));
}

static int stub_open_rank(void *ctx, uint32_t rank, void **state)
{
	struct sfx *f = stub_sfx(ctx);
	if (f->cu) { /* the rank's device current on its transfer thread */
		int rc = sel_cuda_fail(f->cu, f->cu->cuCtxSetCurrent(f->ctx[rank]),
				       "cuCtxSetCurrent");
		if (rc)
			return rc;
	}
	*state = ctx;
	return 0;
}

static int stub_copy(void *state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	struct sfx_stub *st = state;
	pthread_mutex_lock(&st->mu);
	st->calls++;
	st->waiting++;
	pthread_cond_broadcast(&st->cv);
	while (st->hold)
		pthread_cond_wait(&st->cv, &st->mu);
	st->waiting--;
	int f = st->fail && st->fail_left != 0 && (st->fail_dir < 0 || st->fail_dir == (int)dir)
			? st->fail
			: 0;
	if (f && st->fail_left > 0)
		st->fail_left--;
	pthread_mutex_unlock(&st->mu);
	const struct sel_cuda *cu = stub_sfx(st)->cu;
	for (uint32_t i = 0; i < n && !f; i++) {
		if (!cu)
			memcpy((void *)(uintptr_t)c[i].dst, (const void *)(uintptr_t)c[i].src,
			       c[i].len);
		else if (dir == SEL_COPY_OUT) /* device to host slot */
			f = sel_cuda_fail(
				cu,
				cu->cuMemcpyDtoH((void *)(uintptr_t)c[i].dst, c[i].src, c[i].len),
				"stub: cuMemcpyDtoH");
		else
			f = sel_cuda_fail(cu,
					  cu->cuMemcpyHtoD(c[i].dst,
							   (const void *)(uintptr_t)c[i].src,
							   c[i].len),
					  "stub: cuMemcpyHtoD");
	}
	pthread_mutex_lock(&st->mu);
	st->done++;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	return f;
}

static void stub_close_rank(void *state) { (void)state; }

void sfx_hold(struct sfx *f, bool hold)
{
	pthread_mutex_lock(&f->stub.mu);
	f->stub.hold = hold;
	pthread_cond_broadcast(&f->stub.cv);
	pthread_mutex_unlock(&f->stub.mu);
}

void sfx_fail_n(struct sfx *f, int err, int dir, int n)
{
	pthread_mutex_lock(&f->stub.mu);
	f->stub.fail = err;
	f->stub.fail_dir = dir;
	f->stub.fail_left = n;
	pthread_mutex_unlock(&f->stub.mu);
}

void sfx_wait_blocked(struct sfx *f, int n)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += SFX_STUB_WAIT_S;
	pthread_mutex_lock(&f->stub.mu);
	while (f->stub.waiting < n)
		CHECKF(pthread_cond_timedwait(&f->stub.cv, &f->stub.mu, &ts) != ETIMEDOUT,
		       "%d of %d copies blocked", f->stub.waiting, n);
	pthread_mutex_unlock(&f->stub.mu);
}

void sfx_wait_copies_done(struct sfx *f)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += SFX_STUB_WAIT_S;
	pthread_mutex_lock(&f->stub.mu);
	while (f->stub.done < f->stub.calls)
		CHECKF(pthread_cond_timedwait(&f->stub.cv, &f->stub.mu, &ts) != ETIMEDOUT,
		       "%" PRIu64 " of %" PRIu64 " copies returned in %d s", f->stub.done,
		       f->stub.calls, SFX_STUB_WAIT_S);
	pthread_mutex_unlock(&f->stub.mu);
}

/* ---- planes and geometry ------------------------------------------------------ */

void sfx_init(struct sfx *f, uint32_t ranks, uint32_t n_planes, const uint64_t *unit,
	      uint64_t row_bytes, uint64_t pages, uint64_t rows)
{
	static const char *names[SFX_MAXP] = {"k", "v", "x"};
	sel_allocation a[SFX_MAXR * (SFX_MAXP + 1)];
	size_t na = 0;
	memset(f, 0, sizeof(*f));
	f->ranks = ranks;
	f->n_planes = n_planes;
	f->row_bytes = row_bytes;
	f->pages = pages;
	f->rows = rows;
	f->cu = dev_cu;
	sel_memkind kind = f->cu ? SEL_MEM_DEVICE : SEL_MEM_HOST;
	for (uint32_t r = 0; r < ranks; r++) {
		if (f->cu) {
			sel_cu_device d;
			f->dev[r] = dev_ids[r];
			CU(f, f->cu->cuDeviceGet(&d, f->dev[r]));
			CU(f, f->cu->cuDevicePrimaryCtxRetain(&f->ctx[r], d));
			CU(f, f->cu->cuCtxSetCurrent(f->ctx[r]));
		}
		for (uint32_t p = 0; p < n_planes; p++) {
			f->unit[p] = unit[p];
			f->plane[r][p] = eos_aligned_alloc(4096, unit[p] * pages);
			CHECK(f->plane[r][p]);
			uint64_t at = (uint64_t)(uintptr_t)f->plane[r][p];
			if (f->cu) {
				CU(f, f->cu->cuMemAlloc(&f->dplane[r][p], unit[p] * pages));
				at = f->dplane[r][p];
			}
			a[na++] = (sel_allocation){.rank = r,
						   .name = names[p],
						   .group = SEL_GROUP_KV_PAGES,
						   .kind = kind,
						   .address = at,
						   .unit_bytes = unit[p],
						   .count = pages};
		}
		f->row[r] = eos_aligned_alloc(4096, row_bytes * rows);
		CHECK(f->row[r]);
		uint64_t at = (uint64_t)(uintptr_t)f->row[r];
		if (f->cu) {
			CU(f, f->cu->cuMemAlloc(&f->drow[r], row_bytes * rows));
			at = f->drow[r];
		}
		a[na++] = (sel_allocation){.rank = r,
					   .name = "state",
					   .group = SEL_GROUP_STATE_ROWS,
					   .kind = kind,
					   .address = at,
					   .unit_bytes = row_bytes,
					   .count = rows};
	}
	CHECK_OK(sel_geometry_build(a, na, ranks, SFX_PT, &f->g));
	for (size_t i = 0; i < sizeof(f->model); i++)
		f->model[i] = (uint8_t)(i * 7 + 1);
	sel_slot_layout l;
	CHECK_OK(sel_slot_layout_init(&l, f->g));
	f->slot_bytes = l.slot_bytes;
	f->row_slots = l.row_slots;
	sel_slot_layout_free(&l);
	pthread_mutex_init(&f->stub.mu, NULL);
	pthread_condattr_t ca; /* monotonic: a clock step is no timeout */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->stub.cv, &ca);
	pthread_condattr_destroy(&ca);
	f->stub.fail_dir = -1;
	f->be = (struct sel_copy_backend){
		.name = "stub",
		.ctx = &f->stub,
		.open_rank = stub_open_rank,
		.copy = stub_copy,
		.close_rank = stub_close_rank,
	};
}

void sfx_free(struct sfx *f)
{
	for (uint32_t r = 0; r < f->ranks; r++) {
		if (f->cu) {
			CU(f, f->cu->cuCtxSetCurrent(f->ctx[r]));
			for (uint32_t p = 0; p < f->n_planes; p++)
				CU(f, f->cu->cuMemFree(f->dplane[r][p]));
			CU(f, f->cu->cuMemFree(f->drow[r]));
			CU(f, f->cu->cuCtxSetCurrent(NULL));
			sel_cu_device d;
			CU(f, f->cu->cuDeviceGet(&d, f->dev[r]));
			CU(f, f->cu->cuDevicePrimaryCtxRelease(d));
		}
		for (uint32_t p = 0; p < f->n_planes; p++)
			eos_aligned_free(f->plane[r][p]);
		eos_aligned_free(f->row[r]);
	}
	sel_geometry_free(f->g);
	pthread_mutex_destroy(&f->stub.mu);
	pthread_cond_destroy(&f->stub.cv);
}

sel_store_config sfx_config(struct sfx *f, bool stub)
{
	sel_store_config cfg = {0};
	cfg.geometry = f->g;
	cfg.max_active = 1;
	cfg.host_headroom = 1ull << 30;
	memcpy(cfg.model_identity, f->model, SEL_IDENTITY_BYTES);
	sel_offload_identity(f->model, SEL_MODE_ORDINARY, cfg.identity);
	cfg.copy_backend = stub ? &f->be : NULL;
	if (f->cu)
		cfg.cuda_devices = f->dev;
	return cfg;
}

/* ---- device mode ------------------------------------------------------------------ */

void sfx_devices(const struct sel_cuda *cu, const int *devices)
{
	dev_cu = cu;
	for (uint32_t r = 0; r < SFX_MAXR && cu; r++)
		dev_ids[r] = devices[r];
}

const struct sel_cuda *sfx_device_mode(void) { return dev_cu; }
bool sfx_device_fake(void) { return dev_cu && dev_fake; }

const struct sel_cuda *sfx_cuda_or_skip(int *count)
{
	const struct sel_cuda *cu;
	int rc = sel_cuda_load(&cu);
	if (rc) {
		CHECK_RC(rc, SEL_ECUDA);
		CHECK(strncmp(sel_errmsg(), "cuda unavailable: ", 18) == 0);
		SKIP("%s", sel_errmsg());
	}
	CHECK_OK(sel_cuda_device_count(cu, count));
	if (*count == 0)
		SKIP("cuda: the driver sees no device");
	return cu;
}

int sfx_cuda_main(const char *name, int (*test_main)(void))
{
	const char *env = getenv("SELENE_TEST_FAKE_CUDA");
	struct sel_cuda *fake_cu = NULL;
	const struct sel_cuda *cu;
	int count = 0;
	if (env && *env && strcmp(env, "0") != 0) {
		fake_reset();
		fake_cu = fake_load();
		sel_cuda_override(fake_cu);
		dev_fake = true;
		cu = fake_cu;
		printf("%s: the fake CUDA driver (tests/cudafake.c)\n", name);
	} else {
		cu = sfx_cuda_or_skip(&count);
	}
	CHECK_OK(sel_cuda_device_count(cu, &count));
	if (count == 0)
		SKIP("cuda: the driver sees no device");
	int devices[SFX_MAXR] = {0, count > 1 ? 1 : 0};
	printf("%s: device planes on devices %d and %d (%d visible), driver %d\n", name, devices[0],
	       devices[1], count, cu->driver_version);
	sfx_devices(cu, devices);
	int rc = test_main();
	sfx_devices(NULL, NULL);
	if (fake_cu) {
		CHECKF(atomic_load(&fake.bad) == 0, "fake driver: %s", fake.bad_why);
		CHECKF(atomic_load(&fake.batches) > 0,
		       "no batch copy went through the fake driver");
		printf("%s: %d batch copies through the fake driver\n", name,
		       atomic_load(&fake.batches));
		sel_cuda_override(NULL);
		sel_cuda_unload(fake_cu);
		fake_reset();
	}
	return rc;
}

uint64_t sfx_page_bytes_all(struct sfx *f)
{
	uint64_t b = 0;
	for (uint32_t p = 0; p < f->n_planes; p++)
		b += f->unit[p];
	return b * f->ranks;
}

/* ---- patterns ------------------------------------------------------------------ */

uint64_t sfx_mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	uint64_t x =
		a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
	x ^= (c + 17) * 0x94D049BB133111EBull;
	x ^= (d + 91) * 0xD6E8FEB86659FD93ull;
	x ^= x >> 31;
	return x ? x : 1;
}

static void fill(uint8_t *dst, uint64_t len, uint64_t seed)
{
	uint64_t x = seed;
	for (uint64_t k = 0; k < len; k += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		uint64_t n = len - k < 8 ? len - k : 8;
		memcpy(dst + k, &x, n);
	}
}

static bool same(const uint8_t *p, uint64_t len, uint64_t seed)
{
	uint64_t x = seed;
	for (uint64_t k = 0; k < len; k += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		uint64_t n = len - k < 8 ? len - k : 8;
		if (memcmp(p + k, &x, n) != 0)
			return false;
	}
	return true;
}

/* Device mode: the host mirror [off, off + len) of rank r's plane p (p ==
 * SFX_MAXP: the row) to the device, or back from it. */
static void mirror(struct sfx *f, uint32_t r, uint32_t p, uint64_t off, uint64_t len, bool to_dev)
{
	if (!f->cu)
		return;
	uint8_t *h = (p == SFX_MAXP ? f->row[r] : f->plane[r][p]) + off;
	sel_cu_dptr d = (p == SFX_MAXP ? f->drow[r] : f->dplane[r][p]) + off;
	CU(f, f->cu->cuCtxSetCurrent(f->ctx[r]));
	if (to_dev)
		CU(f, f->cu->cuMemcpyHtoD(d, h, len));
	else
		CU(f, f->cu->cuMemcpyDtoH(h, d, len));
}

void sfx_put_page(struct sfx *f, uint32_t id, uint64_t tag, uint64_t j, bool split)
{
	for (uint32_t r = 0; r < f->ranks; r++)
		for (uint32_t p = 0; p < f->n_planes; p++) {
			fill(f->plane[r][p] + id * f->unit[p], f->unit[p],
			     sfx_mix(tag, j, split ? r : 0, p));
			mirror(f, r, p, id * f->unit[p], f->unit[p], true);
		}
}

bool sfx_page_ok(struct sfx *f, uint32_t id, uint64_t tag, uint64_t j, bool split)
{
	for (uint32_t r = 0; r < f->ranks; r++)
		for (uint32_t p = 0; p < f->n_planes; p++) {
			mirror(f, r, p, id * f->unit[p], f->unit[p], false);
			if (!same(f->plane[r][p] + id * f->unit[p], f->unit[p],
				  sfx_mix(tag, j, split ? r : 0, p)))
				return false;
		}
	return true;
}

void sfx_put_row(struct sfx *f, uint32_t slot, uint64_t seed, bool split)
{
	for (uint32_t r = 0; r < f->ranks; r++) {
		fill(f->row[r] + slot * f->row_bytes, f->row_bytes,
		     sfx_mix(seed, 1u << 30, split ? r : 0, 99));
		mirror(f, r, SFX_MAXP, slot * f->row_bytes, f->row_bytes, true);
	}
}

bool sfx_row_ok(struct sfx *f, uint32_t slot, uint64_t seed, bool split)
{
	for (uint32_t r = 0; r < f->ranks; r++) {
		mirror(f, r, SFX_MAXP, slot * f->row_bytes, f->row_bytes, false);
		if (!same(f->row[r] + slot * f->row_bytes, f->row_bytes,
			  sfx_mix(seed, 1u << 30, split ? r : 0, 99)))
			return false;
	}
	return true;
}

void sfx_poison(struct sfx *f)
{
	for (uint32_t r = 0; r < f->ranks; r++) {
		for (uint32_t p = 0; p < f->n_planes; p++) {
			memset(f->plane[r][p], 0xA5, f->unit[p] * f->pages);
			mirror(f, r, p, 0, f->unit[p] * f->pages, true);
		}
		memset(f->row[r], 0x5A, f->row_bytes * f->rows);
		mirror(f, r, SFX_MAXP, 0, f->row_bytes * f->rows, true);
	}
}

/* ---- conversations ----------------------------------------------------------------- */

void sfx_conv_init(struct sfx *f, struct sfx_conv *cv, uint64_t tag, uint64_t tokens,
		   uint32_t first_id)
{
	memset(cv, 0, sizeof(*cv));
	cv->tag = tag;
	cv->n = tokens;
	CHECK_OK(sel_history_init(&cv->h, f->model, NULL, 0));
	sel_token *t = malloc(tokens * sizeof(*t));
	CHECK(t);
	for (uint64_t i = 0; i < tokens; i++)
		t[i] = (sel_token)(sfx_mix(tag, i, 3, 4) % 50000);
	CHECK_OK(sel_history_append(&cv->h, t, tokens));
	free(t);
	cv->gid = malloc((tokens / SFX_PT + 1) * sizeof(*cv->gid));
	CHECK(cv->gid);
	for (uint64_t j = 0; j <= tokens / SFX_PT; j++) {
		cv->gid[j] = (uint32_t)(first_id + j);
		CHECK(cv->gid[j] < f->pages);
	}
}

void sfx_conv_free(struct sfx_conv *cv)
{
	sel_history_free(&cv->h);
	free(cv->gid);
}

sel_published sfx_ckpt(struct sfx *f, struct sfx_conv *cv, uint64_t c, uint64_t parent_c,
		       uint32_t slot, uint64_t checkpoint)
{
	return sfx_ckpt_row(f, cv, c, parent_c, slot, checkpoint, cv->split);
}

sel_published sfx_ckpt_row(struct sfx *f, struct sfx_conv *cv, uint64_t c, uint64_t parent_c,
			   uint32_t slot, uint64_t checkpoint, bool row_split)
{
	sel_published cp = {0};
	for (uint64_t j = 0; j < c / SFX_PT; j++)
		sfx_put_page(f, cv->gid[j], cv->tag, j, sfx_conv_split(cv, j));
	sfx_put_row(f, slot, sfx_row_seed(cv, c), row_split);
	cp.checkpoint = checkpoint;
	sel_history_key_at(&cv->h, c, &cp.key);
	if (parent_c)
		sel_history_key_at(&cv->h, parent_c, &cp.parent);
	cp.bucket = *sel_history_bound(&cv->h, c / SEL_BUCKET_TOKENS);
	cp.pages = cv->gid;
	cp.n_pages = (uint32_t)(c / SFX_PT);
	cp.tail = (uint32_t)(c / SFX_PT - parent_c / SFX_PT);
	cp.state_slot = slot;
	return cp;
}

sel_key sfx_key(struct sfx_conv *cv, uint64_t c)
{
	sel_key k;
	sel_history_key_at(&cv->h, c, &k);
	return k;
}

/* ---- events ---------------------------------------------------------------------------- */

/* Drop SEL_EV_PROGRESS events from ev[0..n): the fixture's callers wait
 * for the events of their own puts and fetches (tests of PROGRESS poll
 * directly).  Returns the count left. */
static int drop_progress(sel_event *ev, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		if (ev[i].type != SEL_EV_PROGRESS)
			ev[k++] = ev[i];
	return k;
}

static void wait_events(sel_store *s, sel_event *ev, int want, sfx_check_fn check, bool all)
{
	int got = 0;
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	while (got < want) {
		int n = sel_store_poll(s, ev + got, (size_t)(want - got));
		CHECK_OK(n);
		got += all ? n : drop_progress(ev + got, n);
		if (check)
			CHECK_OK(check(s));
		if (got >= want)
			break;
		CHECKF(eos_now_ns() < deadline, "%d of %d events", got, want);
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		CHECK(pfd.fd >= 0);
		poll(&pfd, 1, 10);
	}
}

void sfx_wait_events(sel_store *s, sel_event *ev, int want, sfx_check_fn check)
{
	wait_events(s, ev, want, check, false);
}

void sfx_wait_events_all(sel_store *s, sel_event *ev, int want, sfx_check_fn check)
{
	wait_events(s, ev, want, check, true);
}

/* Any event in ev[0..n) (PROGRESS only with all) fails the test. */
static void forbid(const sel_event *ev, int n, bool all)
{
	for (int i = 0; i < n; i++)
		CHECKF(!all && ev[i].type == SEL_EV_PROGRESS,
		       "unexpected event %d (checkpoint %" PRIu64 ", ticket %" PRIu64 ", error %d)",
		       ev[i].type, ev[i].checkpoint, ev[i].ticket, ev[i].error);
}

/* Poll until every accepted put and fetch has reported (the store's
 * in-flight counts are 0), at most 20 s; no event may arrive on the way,
 * nor in a last poll after it. */
static void no_events(sel_store *s, bool all)
{
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	for (;;) {
		sel_event ev[4];
		sel_stats st;
		sel_store_stats(s, &st);
		bool idle = st.inflight_out == 0 && st.inflight_in == 0;
		int n = sel_store_poll(s, ev, 4);
		CHECK_OK(n);
		forbid(ev, n, all);
		if (idle)
			return;
		CHECKF(eos_now_ns() < deadline,
		       "%" PRIu64 " puts and %" PRIu64 " fetches still in "
		       "flight after 20 s",
		       st.inflight_out, st.inflight_in);
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		poll(&pfd, 1, 10);
	}
}

void sfx_no_events(sel_store *s) { no_events(s, false); }

void sfx_no_events_all(sel_store *s) { no_events(s, true); }

static void none_now(sel_store *s, bool all)
{
	sel_event ev[4];
	int n = sel_store_poll(s, ev, 4);
	CHECK_OK(n);
	forbid(ev, n, all);
}

void sfx_none_now(sel_store *s) { none_now(s, false); }

void sfx_none_now_all(sel_store *s) { none_now(s, true); }

void sfx_pump(sel_store *s, sfx_check_fn check, int *progress)
{
	sel_event ev[8];
	int n = sel_store_poll(s, ev, 8);
	CHECK_OK(n);
	forbid(ev, n, false);
	if (progress)
		*progress += n;
	if (check)
		CHECK_OK(check(s));
	struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
	CHECK(pfd.fd >= 0);
	poll(&pfd, 1, 5);
}

bool sfx_quiet(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	if (st.inflight_out || st.inflight_in)
		return false;
	if (strcmp(s->ops->name, "composite") != 0)
		return true;
	struct sel_composite_gauges g;
	sel_composite_store_gauges(s, &g);
	sel_stats m, d;
	sel_store_stats(sel_composite_store_memory(s), &m);
	sel_store_stats(sel_composite_store_disk(s), &d);
	return !g.busy && g.writing_slots == 0 && !m.inflight_out && !m.inflight_in &&
	       !d.inflight_out && !d.inflight_in &&
	       (!g.backoff_until_ns || eos_now_ns() >= g.backoff_until_ns);
}

int sfx_settle(sel_store *s, sfx_check_fn check)
{
	int progress = 0;
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	for (;;) {
		sfx_pump(s, check, &progress);
		/* Quiet after two polls in a row: the second let maintenance,
		 * which runs in the poll, look at the state the first left. */
		if (sfx_quiet(s)) {
			sfx_pump(s, check, &progress);
			if (sfx_quiet(s))
				return progress;
		}
		CHECKF(eos_now_ns() < deadline, "the store did not settle in 20 s");
	}
}

sel_event sfx_one_event(sel_store *s, sfx_check_fn check)
{
	sel_event ev;
	sfx_wait_events(s, &ev, 1, check);
	sfx_no_events(s);
	return ev;
}

void sfx_pump_until(sel_store *s, bool (*pred)(void *), void *ctx, sel_event *ev, int *n_ev,
		    int cap, sfx_check_fn check)
{
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	sel_event scratch[8];
	while (!pred(ctx)) {
		int room = ev ? cap - *n_ev : 8;
		int n = sel_store_poll(s, ev ? ev + *n_ev : scratch, (size_t)(room > 0 ? room : 0));
		CHECK_OK(n);
		if (ev)
			*n_ev += drop_progress(ev + *n_ev, n);
		if (check)
			CHECK_OK(check(s));
		if (pred(ctx))
			break;
		CHECKF(eos_now_ns() < deadline, "condition not reached");
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		poll(&pfd, 1, 5);
	}
}

sel_event sfx_restore(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t resident,
		      uint64_t limit, uint64_t want_c, uint32_t dst_first, uint32_t slot,
		      sel_tier tier, bool verify, sfx_check_fn check)
{
	return sfx_restore_with(f, s, cv, resident, limit, want_c, dst_first, slot, tier, verify,
				check, (struct sfx_restore_opts){.row_split = cv->split});
}

sel_event sfx_restore_with(struct sfx *f, sel_store *s, struct sfx_conv *cv, uint64_t resident,
			   uint64_t limit, uint64_t want_c, uint32_t dst_first, uint32_t slot,
			   sel_tier tier, bool verify, sfx_check_fn check,
			   struct sfx_restore_opts o)
{
	sel_hit hit;
	CHECK_RC(sel_store_lookup(s, &cv->h, resident, limit, &hit), 1);
	sel_key want = sfx_key(cv, want_c);
	CHECKF(sel_key_eq(&hit.key, &want), "hit at %" PRIu64 ", wanted %" PRIu64, hit.key.consumed,
	       want_c);
	CHECK(hit.resident == resident);
	CHECKF(hit.tier == tier || tier == SEL_TIER_NONE, "hit tier %s", sel_tier_name(hit.tier));
	CHECKF(hit.pages == want_c / SFX_PT - resident / SFX_PT, "hit pages %u", hit.pages);
	CHECK(hit.bytes == hit.pages * sfx_page_bytes_all(f) + f->row_bytes * f->ranks);
	uint32_t *dst = malloc((hit.pages + 1) * sizeof(*dst));
	CHECK(dst);
	for (uint32_t i = 0; i < hit.pages; i++)
		dst[i] = dst_first + i;
	sel_inbound in = {.ticket = 1000 + dst_first + slot,
			  .pages = dst,
			  .n_pages = hit.pages,
			  .state_slot = slot};
	sfx_poison(f);
	CHECK_OK(sel_store_fetch(s, &hit, &in));
	if (check)
		CHECK_OK(check(s));
	sel_event ev;
	wait_events(s, &ev, 1, check, o.all_events);
	CHECK(ev.ticket == in.ticket);
	if (verify) {
		CHECKF(ev.type == SEL_EV_FETCHED, "event %d error %d (%s)", ev.type, ev.error,
		       sel_strerror(ev.error));
		CHECK(ev.bytes == hit.bytes && sel_key_eq(&ev.key, &want));
		for (uint32_t i = 0; i < hit.pages; i++) {
			uint64_t j = resident / SFX_PT + i;
			CHECKF(sfx_page_ok(f, dst[i], cv->tag, j, sfx_conv_split(cv, j)),
			       "page %" PRIu64 " at id %u", j, dst[i]);
		}
		CHECK(sfx_row_ok(f, slot, sfx_row_seed(cv, want_c), o.row_split));
	}
	free(dst);
	return ev;
}

int sfx_poll_wait(sel_store *s, sel_event *ev, int cap)
{
	struct pollfd pf = {.fd = sel_store_wait_fd(s), .events = POLLIN};
	(void)poll(&pf, 1, 5);
	int n = sel_store_poll(s, ev, (size_t)cap);
	CHECK(n >= 0);
	return n;
}

sel_pool_counters sfx_pool_counters(sel_store *s)
{
	sel_stats st;
	sel_store_stats(s, &st);
	return st.pool;
}

sel_event sfx_next_event(sel_store *s)
{
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20ull * 1000000000;
	for (;;) {
		int n = sfx_poll_wait(s, ev, 8);
		if (n) {
			CHECKF(n == 1, "%d events", n);
			return ev[0];
		}
		CHECK(eos_now_ns() < deadline);
	}
}

sel_store *sfx_open_pooled(struct sfx *f, const char *sock, const char *id, uint64_t memory)
{
	sel_store_config c = sfx_config(f, true);
	c.memory_bytes = memory;
	c.pool = sock;
	c.pool_instance_id = id;
	c.pool_wait_ns = 10ull * 1000000000;
	sel_store *s = NULL;
	CHECK_OK(sel_store_open(&c, &s));
	CHECK(s != NULL);
	sel_pool_counters pc = sfx_pool_counters(s);
	CHECKF(pc.state == SEL_POOL_UP, "state %d: %s", pc.state, sel_store_warning(s));
	return s;
}

int sfx_fetch_at(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t slot, uint64_t ticket)
{
	uint32_t ids[1024];
	CHECKF(hit->pages <= 1024, "%" PRIu32 " pages", hit->pages);
	for (uint32_t i = 0; i < hit->pages; i++)
		ids[i] = first + i;
	sel_inbound in = {
		.ticket = ticket, .pages = ids, .n_pages = hit->pages, .state_slot = slot};
	return sel_store_fetch(s, hit, &in);
}

bool sfx_restored_ok(struct sfx *f, struct sfx_conv *cv, uint64_t c, uint32_t first, uint32_t slot)
{
	for (uint32_t j = 0; j < c / SFX_PT; j++)
		if (!sfx_page_ok(f, first + j, cv->tag, j, false))
			return false;
	return sfx_row_ok(f, slot, sfx_row_seed(cv, c), false);
}
