/*
 * test_store_pooled_cuda.c - the pooled store's CUDA path
 * (store_pooled_cuda.c: design 2.15 registration and the budget check's
 * device half) against a real `flare pool`, with the page planes and rows
 * in device memory and every copy through the CUDA backend:
 *
 *   - A puts from its device planes into the arena; B restores it
 *     byte-exact into poisoned device planes.  Each store's arena mapping
 *     is registered exactly once; a manager restarted over the same arena
 *     file (same generation) keeps it registered, once, and sharing works
 *     again; a manager back with another arena (generation) disables
 *     sharing and the old mapping is unregistered then, once.  The same
 *     put and restore at TP2, each rank's share on its own device.
 *   - close unregisters the arena, once, before the mapping goes.
 *   - a registration the driver refuses, or one the device sees at
 *     another address than the host's: one warning, local tiers (a memory
 *     tier answers), nothing of the arena left registered.
 *   - the budget's device half: a GPU whose free memory (cuMemGetInfo) is
 *     one byte per 512 short of the arena refuses, registers nothing and
 *     keeps the local tier; 16 KiB more fits; an integrated GPU's charge
 *     goes to the host supply.
 *
 * The driver is wrapped (a copy of its table with counting registration,
 * a failure knob and smaller free-memory figures), so the test runs alike
 * on tests/cudafake.c (SELENE_TEST_FAKE_CUDA=1: make check, through
 * tests/test_store_cuda_fake.sh) and on a GPU (scripts/check-gpu).  Exits
 * 77, saying why, without a driver or a device.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "cuda.h"
#include "pool_testlib.h"
#include "store_pooled.h"
#include "storefx.h"

static char dir[200];

/* ---- the wrapped driver ------------------------------------------------------------- */

static struct sel_cuda wrapped;
static const struct sel_cuda *base_cu;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct reg {
	void *addr;
	size_t len;
	int regs, unregs;
	bool live;
} regs[64];
static int n_regs;
static int total_regs, total_unregs;  /* every registration, every unregistration */
static size_t fail_len;               /* a registration of this length fails */
static unsigned long long free_bytes; /* cuMemGetInfo's free figure (0: the driver's) */
static int integrated;                /* CU_DEVICE_ATTRIBUTE_INTEGRATED reads 1 */
static atomic_int batches;            /* cuMemcpyBatchAsync calls */
static int other_dptr;                /* registered memory reads at another device address */

static struct reg *reg_of(void *addr)
{
	for (int i = 0; i < n_regs; i++)
		if (regs[i].addr == addr)
			return &regs[i];
	return NULL;
}

static sel_cu_result w_register(void *p, size_t n, unsigned int flags)
{
	if (fail_len && n == fail_len)
		return SEL_CU_ERROR_OUT_OF_MEMORY;
	sel_cu_result res = base_cu->cuMemHostRegister(p, n, flags);
	if (res)
		return res;
	pthread_mutex_lock(&reg_mu);
	struct reg *r = reg_of(p);
	if (!r) {
		CHECK(n_regs < 64);
		r = &regs[n_regs++];
		r->addr = p;
	}
	CHECKF(!r->live, "%p registered twice", p);
	if (r->unregs) /* a new mapping where an unregistered one was */
		*r = (struct reg){.addr = p};
	r->len = n;
	r->regs++;
	total_regs++;
	r->live = true;
	pthread_mutex_unlock(&reg_mu);
	return 0;
}

static sel_cu_result w_unregister(void *p)
{
	pthread_mutex_lock(&reg_mu);
	struct reg *r = reg_of(p);
	CHECKF(r && r->live, "%p unregistered but not registered", p);
	r->live = false;
	r->unregs++;
	total_unregs++;
	pthread_mutex_unlock(&reg_mu);
	return base_cu->cuMemHostUnregister(p);
}

static sel_cu_result w_batch(sel_cu_dptr *dsts, sel_cu_dptr *srcs, size_t *sizes, size_t count,
			     struct sel_cu_memcpy_attributes *attrs, size_t *idxs, size_t num,
			     sel_cu_stream stream)
{
	atomic_fetch_add(&batches, 1);
	return base_cu->cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, idxs, num, stream);
}

static sel_cu_result w_devptr(sel_cu_dptr *d, void *p, unsigned int flags)
{
	sel_cu_result res = base_cu->cuMemHostGetDevicePointer(d, p, flags);
	if (!res && other_dptr)
		*d += 1u << 20;
	return res;
}

static sel_cu_result w_meminfo(size_t *fr, size_t *tot)
{
	sel_cu_result res = base_cu->cuMemGetInfo(fr, tot);
	if (!res && free_bytes)
		*fr = (size_t)free_bytes;
	return res;
}

static sel_cu_result w_attr(int *v, int attr, sel_cu_device dev)
{
	sel_cu_result res = base_cu->cuDeviceGetAttribute(v, attr, dev);
	if (!res && attr == SEL_CU_DEVICE_ATTRIBUTE_INTEGRATED && integrated)
		*v = 1;
	return res;
}

/* The registration record of s's arena (NULL: never registered). */
static struct reg arena_reg(sel_store *s, void **addr)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	uint64_t len;
	*addr = sel_pool_arena(p->pc, &len);
	pthread_mutex_lock(&reg_mu);
	struct reg *r = reg_of(*addr), out = r ? *r : (struct reg){0};
	pthread_mutex_unlock(&reg_mu);
	CHECK(!r || r->len == len);
	return out;
}

static struct reg reg_at(void *addr)
{
	pthread_mutex_lock(&reg_mu);
	struct reg *r = reg_of(addr), out = r ? *r : (struct reg){0};
	pthread_mutex_unlock(&reg_mu);
	return out;
}

static int live_regs(void)
{
	int n = 0;
	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < n_regs; i++)
		n += regs[i].live;
	pthread_mutex_unlock(&reg_mu);
	return n;
}

/* ---- stores ------------------------------------------------------------------------ */

static sel_store *open_store(struct sfx *f, const char *sock, const char *id, uint64_t memory)
{
	sel_store_config c = sfx_config(f, false); /* device planes: the CUDA backend */
	c.memory_bytes = memory;
	c.pool = sock;
	c.pool_instance_id = id;
	c.pool_wait_ns = 10 * S_NS;
	sel_store *s = NULL;
	CHECK_OK(sel_store_open(&c, &s));
	CHECK(s != NULL);
	return s;
}

static sel_store *open_pooled(struct sfx *f, const char *sock, const char *id)
{
	sel_store *s = open_store(f, sock, id, 0);
	CHECKF(sfx_pool_counters(s).state == SEL_POOL_UP, "state %d: %s",
	       sfx_pool_counters(s).state, sel_store_warning(s));
	sel_store_info info;
	sel_store_describe(s, &info);
	CHECKF(!strcmp(info.transport, "cuda"), "transport %s", info.transport);
	return s;
}

/* Put checkpoint c from A's device planes until the pool accepted it (a
 * restarted manager refuses puts while it recovers: offered again). */
static void put_shared(struct sfx *f, sel_store *a, struct sfx_conv *cv, uint64_t c, uint64_t id)
{
	sel_published p = sfx_ckpt(f, cv, c, 0, 1, id);
	uint64_t acc = sfx_pool_counters(a).puts_accepted, deadline = eos_now_ns() + 20 * S_NS;
	int b0 = atomic_load(&batches);
	sel_retry_reason why;
	for (;;) {
		sel_outcome put = sel_store_put(a, &p, &why);
		if (put == SEL_RETRY) {
			CHECKF(eos_now_ns() < deadline, "put refused for 20 s (%d)", (int)why);
			sel_event ev[8];
			for (int k = sfx_poll_wait(a, ev, 8); k > 0; k--)
				CHECK(ev[k - 1].type == SEL_EV_PROGRESS);
			continue;
		}
		CHECKF(put == SEL_QUEUED, "put %" PRIu64 ": outcome %d: %s", id, (int)put,
		       sel_errmsg());
		sel_event e = sfx_next_event(a);
		CHECK(e.checkpoint == id);
		if (e.type == SEL_EV_STORED)
			break;
		CHECKF(eos_now_ns() < deadline, "event %d", e.type);
	}
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).puts_accepted > acc);
	CHECK(atomic_load(&batches) > b0); /* out of the device planes through CUDA */
}

/* B's lookup until the pool's hit arrives, then the restore into poisoned
 * device planes, checked byte for byte. */
static void restore_exact(struct sfx *f, sel_store *b, struct sfx_conv *cv, uint64_t c,
			  uint64_t ticket)
{
	sel_hit hit;
	sel_event ev[8];
	uint64_t deadline = eos_now_ns() + 20 * S_NS;
	int rc;
	while ((rc = sel_store_lookup(b, &cv->h, 0, c, &hit)) != 1) {
		CHECK(rc >= 0 && eos_now_ns() < deadline);
		CHECK(sfx_poll_wait(b, ev, 8) == 0);
	}
	CHECK(hit.tier == SEL_TIER_POOL && hit.key.consumed == c);
	uint32_t ids[64];
	for (uint32_t i = 0; i < hit.pages; i++)
		ids[i] = 10 + i;
	sel_inbound in = {.ticket = ticket, .pages = ids, .n_pages = hit.pages, .state_slot = 2};
	sfx_poison(f);
	int b0 = atomic_load(&batches);
	CHECK_OK(sel_store_fetch(b, &hit, &in));
	sel_event e = sfx_next_event(b);
	CHECKF(e.type == SEL_EV_FETCHED && e.ticket == ticket && e.tier == SEL_TIER_POOL,
	       "event %d error %d", e.type, e.error);
	for (uint32_t j = 0; j < c / SFX_PT; j++)
		CHECKF(sfx_page_ok(f, 10 + j, cv->tag, j, false), "page %u", j);
	CHECK(sfx_row_ok(f, 2, sfx_row_seed(cv, c), false));
	CHECK(atomic_load(&batches) > b0); /* into the device planes through CUDA */
}

static void check_registered_once(sel_store *s)
{
	void *a;
	struct reg r = arena_reg(s, &a);
	CHECKF(r.regs == 1 && r.live && r.unregs == 0,
	       "arena %p: %d registrations, %d live, %d off", a, r.regs, r.live, r.unregs);
}

/* ---- the tests ---------------------------------------------------------------------- */

static void test_share_reattach(void)
{
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, 64, 8);
	sfx_init(&fb, 1, 2, unit, 6000, 64, 8);
	char arena[300];
	/* On a GPU, where docs/pool.md puts a kept arena (tmpfs pages register
	 * like the memfd's); the fake registers anything. */
	if (!sfx_device_fake() && access("/dev/shm", W_OK) == 0)
		snprintf(arena, sizeof arena, "/dev/shm/flare-test-pooled-cuda-%d", (int)getpid());
	else
		snprintf(arena, sizeof arena, "%s/arena", dir);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr", "--memory", "16MiB", "--arena", arena, "--recovery-timeout",
		  "10s", NULL);
	sel_store *a = open_pooled(&fa, m.sock, "A"), *b = open_pooled(&fb, m.sock, "B");
	check_registered_once(a);
	check_registered_once(b);
	pthread_mutex_lock(&reg_mu);
	int regs0 = total_regs, unregs0 = total_unregs;
	pthread_mutex_unlock(&reg_mu);

	struct sfx_conv c1a, c1b, c2a, c2b;
	sfx_conv_init(&fa, &c1a, 1, 256, 0);
	sfx_conv_init(&fb, &c1b, 1, 256, 0);
	put_shared(&fa, a, &c1a, 256, 11);
	restore_exact(&fb, b, &c1b, 256, 101);
	CHECK(sfx_pool_counters(b).restores == 1);

	/* The same region generation after a restart: still registered, once. */
	mgr_kill9(&m);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).state == SEL_POOL_DOWN);
	SFX_UNTIL(b, NULL, sfx_pool_counters(b).state == SEL_POOL_DOWN);
	mgr_start(&m, dir, "mgr", "--memory", "16MiB", "--arena", arena, "--recovery-timeout",
		  "10s", NULL);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).state == SEL_POOL_UP);
	SFX_UNTIL(b, NULL, sfx_pool_counters(b).state == SEL_POOL_UP);
	CHECK(sfx_pool_counters(a).sessions == 2 && sfx_pool_counters(b).sessions == 2);
	check_registered_once(a);
	check_registered_once(b);
	pthread_mutex_lock(&reg_mu);
	CHECKF(total_regs == regs0 && total_unregs == unregs0,
	       "the reattach registered %d and unregistered %d", total_regs - regs0,
	       total_unregs - unregs0);
	pthread_mutex_unlock(&reg_mu);
	sfx_conv_init(&fa, &c2a, 2, 128, 0);
	sfx_conv_init(&fb, &c2b, 2, 128, 0);
	put_shared(&fa, a, &c2a, 128, 12);
	restore_exact(&fb, b, &c2b, 128, 102);

	/* Another arena (a new generation): sharing off, the old mapping
	 * unregistered once every lease had ended. */
	void *aa, *ab;
	(void)arena_reg(a, &aa);
	(void)arena_reg(b, &ab);
	mgr_stop(&m);
	mgr_start(&m, dir, "mgr", "--memory", "16MiB", NULL);
	SFX_UNTIL(a, NULL, sfx_pool_counters(a).state == SEL_POOL_GONE_FOR_GOOD);
	SFX_UNTIL(b, NULL, sfx_pool_counters(b).state == SEL_POOL_GONE_FOR_GOOD);
	CHECKF(strstr(sel_store_warning(b), "another arena"), "warning '%s'", sel_store_warning(b));
	pthread_mutex_lock(&reg_mu);
	CHECK(total_regs == regs0 && total_unregs == unregs0 + 2);
	pthread_mutex_unlock(&reg_mu);
	struct reg ra = reg_at(aa), rb = reg_at(ab);
	CHECKF(ra.regs == 1 && !ra.live && ra.unregs == 1, "A: %d registrations, %d live", ra.regs,
	       ra.live);
	CHECKF(rb.regs == 1 && !rb.live && rb.unregs == 1, "B: %d registrations, %d live", rb.regs,
	       rb.live);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	ra = reg_at(aa);
	CHECK(ra.unregs == 1); /* not again at close */
	CHECK(live_regs() == 0);
	struct sfx_conv *cvs[] = {&c1a, &c1b, &c2a, &c2b};
	for (size_t i = 0; i < 4; i++)
		sfx_conv_free(cvs[i]);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
	unlink(arena);
}

/* TP2: each rank's share between its device and the arena (rank r on
 * device r where there are two). */
static void test_share_tp2(void)
{
	const uint64_t unit[2] = {4096, 8192};
	struct sfx fa, fb;
	sfx_init(&fa, 2, 2, unit, 6000, 64, 8);
	sfx_init(&fb, 2, 2, unit, 6000, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgr2", "--memory", "16MiB", NULL);
	sel_store *a = open_pooled(&fa, m.sock, "A2"), *b = open_pooled(&fb, m.sock, "B2");
	check_registered_once(a);
	check_registered_once(b);
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 7, 192, 0);
	sfx_conv_init(&fb, &cb, 7, 192, 0);
	put_shared(&fa, a, &ca, 192, 21);
	restore_exact(&fb, b, &cb, 192, 201);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	CHECK(live_regs() == 0);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	mgr_stop(&m);
	sfx_free(&fa);
	sfx_free(&fb);
}

static void test_close_unregisters(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx f;
	sfx_init(&f, 1, 1, unit, 4096, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgrc", "--memory", "8MiB", NULL);
	sel_store *s = open_pooled(&f, m.sock, "close");
	check_registered_once(s);
	void *addr;
	(void)arena_reg(s, &addr);
	CHECK_OK(sel_store_close(s, 0));
	struct reg r = reg_at(addr);
	CHECKF(r.regs == 1 && !r.live && r.unregs == 1, "%d registrations, %d live, %d off", r.regs,
	       r.live, r.unregs);
	sel_store_destroy(s);
	CHECK(live_regs() == 0);
	mgr_stop(&m);
	sfx_free(&f);
}

/* s did not attach (why in its warning) and serves from its memory tier. */
static void check_local(struct sfx *f, sel_store *s, const char *sock, const char *why)
{
	const char *w = sel_store_warning(s);
	CHECKF(strstr(w, why) && strstr(w, "local tiers will be used") && strstr(w, sock) &&
		       strstr(w, "nothing was registered"),
	       "warning '%s'", w);
	CHECK(sfx_pool_counters(s).state == SEL_POOL_GONE_FOR_GOOD);
	struct sfx_conv cv;
	sfx_conv_init(f, &cv, 5, 64, 0);
	sel_published p = sfx_ckpt(f, &cv, 64, 0, 1, 41);
	sel_retry_reason r;
	CHECK(sel_store_put(s, &p, &r) == SEL_QUEUED);
	CHECK(sfx_next_event(s).type == SEL_EV_STORED);
	sel_hit hit;
	CHECK(sel_store_lookup(s, &cv.h, 0, 64, &hit) == 1 && hit.tier == SEL_TIER_MEMORY);
	sfx_conv_free(&cv);
}

/* No live registration of len bytes (the arena's). */
static bool none_of(size_t len)
{
	bool none = true;
	pthread_mutex_lock(&reg_mu);
	for (int i = 0; i < n_regs; i++)
		none &= !(regs[i].live && regs[i].len == len);
	pthread_mutex_unlock(&reg_mu);
	return none;
}

static void test_register_fails(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx f;
	sfx_init(&f, 1, 1, unit, 4096, 64, 8);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgrf", "--memory", "8MiB", NULL);
	fail_len = 8u << 20;
	sel_store *s = open_store(&f, m.sock, "fail", 4 << 20);
	check_local(&f, s, m.sock, "registering the arena of 8 MiB with the CUDA driver failed");
	CHECK(none_of(8u << 20));
	CHECK(((struct sel_pooled *)s)->pc == NULL);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	fail_len = 0;
	CHECK(live_regs() == 0);

	/* Registered, but the device sees it at another address: undone. */
	other_dptr = 1;
	pthread_mutex_lock(&reg_mu);
	int unregs0 = total_unregs;
	pthread_mutex_unlock(&reg_mu);
	s = open_store(&f, m.sock, "fail", 4 << 20);
	check_local(&f, s, m.sock, "the device address");
	CHECK(none_of(8u << 20));
	pthread_mutex_lock(&reg_mu);
	CHECK(total_unregs > unregs0); /* the arena's, at once */
	pthread_mutex_unlock(&reg_mu);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	other_dptr = 0;
	CHECK(live_regs() == 0);
	mgr_stop(&m);
	sfx_free(&f);
}

static void test_budget_device(void)
{
	const uint64_t unit[1] = {4096};
	struct sfx f;
	sfx_init(&f, 2, 1, unit, 4096, 64, 8); /* TP2: both ranks' GPUs register it */
	/* The arena is a file of dir, not a memfd, so none of it counts as
	 * already resident (pool_budget.h): the host half charges all 8 MiB.
	 * On a tmpfs the manager committed it, so the test punches out all but
	 * the header, the one part the manager writes (charged: 8 MiB less
	 * 64 KiB). */
	char arena[300];
	snprintf(arena, sizeof arena, "%s/arena-budget", dir);
	struct mgr_proc m;
	mgr_start(&m, dir, "mgrb", "--memory", "8MiB", "--arena", arena, NULL);
	struct statfs fs;
	CHECK(statfs(dir, &fs) == 0);
	uint64_t charged = 8u << 20;
	if (fs.f_type == 0x01021994) { /* TMPFS_MAGIC */
		int fd = open(arena, O_RDWR | O_CLOEXEC);
		CHECK(fd >= 0);
		CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 64 << 10,
				(8 << 20) - (64 << 10)) == 0);
		close(fd);
		charged -= 64u << 10;
	}
	/* 8 MiB registered charges each GPU 16 KiB; 16 MiB stay for streams. */
	free_bytes = SP_CUDA_RESERVE + (8u << 10);
	sel_store *s = open_store(&f, m.sock, "budget", 4 << 20);
	check_local(&f, s, m.sock, "pool budget");
	const char *w = sel_store_warning(s);
	CHECKF(strstr(w, "16 KiB of device memory") && strstr(w, "over its budget of 8 KiB") &&
		       strstr(w, "arena 8 MiB"),
	       "warning '%s'", w);
	CHECK(none_of(8u << 20));
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	CHECK(live_regs() == 0);

	free_bytes = SP_CUDA_RESERVE + (16u << 10); /* exactly enough */
	s = open_pooled(&f, m.sock, "budget");
	check_registered_once(s);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);

	/* An integrated GPU's charge comes out of the host supply: a supply of
	 * exactly the arena fits a discrete GPU and refuses an integrated one. */
	free_bytes = 0;
	uint64_t total, avail;
	CHECK_OK(eos_mem_info(&total, &avail));
	uint64_t system = total / 100 * 5 + total % 100 * 5 / 100;
	char knob[64];
	snprintf(knob, sizeof knob, "%" PRIu64, (uint64_t)(2ull << 30) + system + charged);
	setenv("SELENE_TEST_MEMAVAILABLE", knob, 1);
	s = open_pooled(&f, m.sock, "budget");
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	integrated = 1;
	s = open_store(&f, m.sock, "budget", 0);
	w = sel_store_warning(s);
	char plan[80], supply[80], sz[32];
	snprintf(plan, sizeof plan, "the plan of %s",
		 eos_format_size(charged + (16u << 10), sz, sizeof sz));
	snprintf(supply, sizeof supply, "host supply of %s",
		 eos_format_size(charged, sz, sizeof sz));
	CHECKF(strstr(w, "pool budget") && strstr(w, plan) && strstr(w, supply),
	       "warning '%s', expected '%s' and '%s'", w, plan, supply);
	CHECK(sfx_pool_counters(s).state == SEL_POOL_GONE_FOR_GOOD);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	integrated = 0;
	unsetenv("SELENE_TEST_MEMAVAILABLE");
	CHECK(live_regs() == 0);
	mgr_stop(&m);
	CHECK(unlink(arena) == 0);
	sfx_free(&f);
}

static int pooled_cuda_main(void)
{
	base_cu = sfx_device_mode();
	wrapped = *base_cu;
	snprintf(wrapped.source, sizeof wrapped.source, "%.100s (counted)", base_cu->source);
	wrapped.lib = NULL;
	wrapped.cuMemHostRegister = w_register;
	wrapped.cuMemHostUnregister = w_unregister;
	wrapped.cuMemGetInfo = w_meminfo;
	wrapped.cuMemcpyBatchAsync = w_batch;
	wrapped.cuMemHostGetDevicePointer = w_devptr;
	wrapped.cuDeviceGetAttribute = w_attr;
	sel_cuda_override(&wrapped);
	char *d = test_mkdtemp("pooledcuda");
	snprintf(dir, sizeof dir, "%s", d);
	test_close_unregisters();
	test_register_fails();
	test_budget_device();
	test_share_reattach();
	test_share_tp2();
	test_rmtree(d);
	free(d);
	sel_cuda_override(sfx_device_fake() ? base_cu : NULL);
	printf("ok\n");
	return 0;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	return sfx_cuda_main("test_store_pooled_cuda", pooled_cuda_main);
}
