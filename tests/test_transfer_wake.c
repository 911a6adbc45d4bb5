/*
 * test_transfer_wake.c - deferred, coalesced wakes of the copy threads
 * (issue 18 "worker calls"; transfer.c DESIGN "Wakes").
 *
 * Covers, on 1 and 2 ranks with the host backend:
 *   - deferred mode, every rank asleep: many submissions send no signal;
 *     one kick wakes each rank once; every job completes byte-exact;
 *   - a kick with nothing due sends nothing;
 *   - a busy (spinning) rank: submissions and kicks send no signal at all
 *     and the jobs still complete;
 *   - a kick never sent: the sleeping rank's backstop still runs the job
 *     within a deadline (the wake is late, never lost);
 *   - immediate mode: a submission to a sleeping rank signals it, a burst
 *     no more than once per job;
 *   - two transfer sets over one pool (two stores' submissions), one kick
 *     each;
 *   - the store level: memory stores whose puts and fetches are followed
 *     by one sel_store_flush per pass deliver every event, with wakes
 *     bounded by the flushes and polls; a put never flushed or polled
 *     still makes the wait descriptor readable; the same on a disk store,
 *     whose disk thread defers its wakes too;
 *   - the completion's eventfd write after the unlock: a poll between the
 *     push and the write (held open by a test hook) takes the job and
 *     leaves the eventfd unread, the late write makes it readable with the
 *     queue empty, the next poll reads it back, the checker holds at every
 *     step, and a close started in the window waits for the write.
 * Waits are by condition with deadlines of seconds.
 */
#include <poll.h>

#include "eos.h"
#include "slab.h"
#include "storefx.h"
#include "testutil.h"
#include "transfer.h"
#include "transfer_int.h" /* sel_xfer_test_late_hook */

#define UNIT 4096u
#define PAGES 64u
#define ROWB 512u
#define DEADLINE_NS (10ull * 1000000000)

struct world {
	uint32_t ranks;
	uint8_t *plane[2], *row[2];
	sel_geometry *g;
	sel_slot_layout l;
	sel_slab_pool *pool;
};

static void world_open(struct world *w, uint32_t ranks, uint64_t slots)
{
	sel_allocation a[4];
	memset(w, 0, sizeof(*w));
	w->ranks = ranks;
	for (uint32_t r = 0; r < ranks; r++) {
		w->plane[r] = eos_aligned_alloc(EOS_ALIGN, (size_t)UNIT * PAGES);
		w->row[r] = eos_aligned_alloc(EOS_ALIGN, (size_t)ROWB * 4);
		CHECK(w->plane[r] && w->row[r]);
		for (uint32_t i = 0; i < UNIT * PAGES; i++)
			w->plane[r][i] = (uint8_t)(i * 31 + r * 7 + i / UNIT);
		memset(w->row[r], 0x40 + (int)r, (size_t)ROWB * 4);
		a[2 * r] = (sel_allocation){.rank = r,
					    .name = "kv",
					    .group = SEL_GROUP_KV_PAGES,
					    .kind = SEL_MEM_HOST,
					    .address = (uint64_t)(uintptr_t)w->plane[r],
					    .unit_bytes = UNIT,
					    .count = PAGES};
		a[2 * r + 1] = (sel_allocation){.rank = r,
						.name = "state",
						.group = SEL_GROUP_STATE_ROWS,
						.kind = SEL_MEM_HOST,
						.address = (uint64_t)(uintptr_t)w->row[r],
						.unit_bytes = ROWB,
						.count = 4};
	}
	CHECK_OK(sel_geometry_build(a, 2 * ranks, ranks, 64, &w->g));
	CHECK_OK(sel_slot_layout_init(&w->l, w->g));
	CHECK_OK(sel_slab_create(w->l.slot_bytes, 0, slots, false, NULL, &w->pool));
}

static void world_close(struct world *w)
{
	sel_slab_destroy(w->pool);
	sel_slot_layout_free(&w->l);
	sel_geometry_free(w->g);
	for (uint32_t r = 0; r < w->ranks; r++) {
		eos_aligned_free(w->plane[r]);
		eos_aligned_free(w->row[r]);
	}
}

static sel_xfer *xfer_open(struct world *w, bool defer, uint64_t spin_ns)
{
	sel_xfer *x;
	CHECK_OK(sel_xfer_create(w->g, &w->l, w->pool, &sel_copy_backend_host, 64, &x));
	sel_xfer_defer_wakes(x, defer);
	sel_xfer_set_spin(x, spin_ns);
	return x;
}

/* Every rank thread asleep (it spins first, then sleeps). */
static void wait_asleep(sel_xfer *x, uint32_t ranks)
{
	uint64_t end = eos_now_ns() + DEADLINE_NS;
	while (sel_xfer_sleeping(x) < ranks) {
		CHECKF(eos_now_ns() < end, "rank threads never slept (%u of %u)",
		       sel_xfer_sleeping(x), ranks);
		eos_sleep_ns(100000);
	}
}

/* One copy-out job per page: page i into slot base + i. */
struct jobs {
	struct sel_xfer_job j[PAGES];
	uint32_t page[PAGES], slot[PAGES];
	uint32_t n;
};

static void jobs_make(struct jobs *js, uint32_t n, uint32_t base)
{
	memset(js, 0, sizeof(*js));
	js->n = n;
	for (uint32_t i = 0; i < n; i++) {
		js->page[i] = i;
		js->slot[i] = base + i;
		js->j[i] = (struct sel_xfer_job){.id = base + i,
						 .dir = SEL_COPY_OUT,
						 .n_pages = 1,
						 .pages = &js->page[i],
						 .page_slots = &js->slot[i]};
	}
}

static void submit_all(sel_xfer *x, struct jobs *js)
{
	for (uint32_t i = 0; i < js->n; i++)
		CHECK_OK(sel_xfer_submit(x, &js->j[i]));
}

/* Poll (sleeping on the eventfd, never kicking) until n jobs completed;
 * each ok and copied byte-exact. */
static void collect(struct world *w, sel_xfer *x, struct jobs *js)
{
	uint64_t end = eos_now_ns() + DEADLINE_NS;
	uint32_t got = 0;
	while (got < js->n) {
		struct sel_xfer_job *done[PAGES];
		int k = sel_xfer_poll(x, done, PAGES);
		for (int i = 0; i < k; i++) {
			CHECK_RC(done[i]->status, 0);
			CHECK(done[i]->id == js->j[got].id); /* submission order */
			got++;
		}
		if (got == js->n)
			break;
		CHECKF(eos_now_ns() < end, "%u of %u jobs completed", got, js->n);
		struct pollfd pfd = {.fd = sel_xfer_fd(x), .events = POLLIN};
		(void)poll(&pfd, 1, 100);
	}
	CHECK_OK(sel_xfer_check(x));
	for (uint32_t i = 0; i < js->n; i++)
		for (uint32_t r = 0; r < w->ranks; r++) {
			const uint8_t *slot = (const uint8_t *)sel_slab_base(w->pool) +
					      (uint64_t)js->slot[i] * w->l.slot_bytes +
					      w->l.share_off[r] + w->l.plane_off[r][0];
			CHECK(memcmp(slot, w->plane[r] + (uint64_t)js->page[i] * UNIT, UNIT) == 0);
		}
}

static void test_deferred_asleep(uint32_t ranks)
{
	struct world w;
	struct jobs js;
	world_open(&w, ranks, 2 * PAGES);
	sel_xfer *x = xfer_open(&w, true, 0);
	CHECK_RC(sel_xfer_kick(x), 0); /* nothing due */
	for (int round = 0; round < 3; round++) {
		wait_asleep(x, ranks);
		uint64_t before = sel_xfer_wakes(x);
		jobs_make(&js, 40, (uint32_t)round * 40 % PAGES);
		submit_all(x, &js);
		CHECK(sel_xfer_wakes(x) == before); /* submissions never signal */
		CHECK_OK(sel_xfer_check(x));
		/* One kick: at most one signal per rank (a rank woken by its
		 * backstop meanwhile needs none). */
		int k = sel_xfer_kick(x);
		CHECKF(k >= 0 && (uint32_t)k <= ranks, "kick sent %d signals", k);
		CHECK_RC(sel_xfer_kick(x), 0); /* coalesced: nothing left due */
		collect(&w, x, &js);
		CHECK(sel_xfer_wakes(x) - before == (uint64_t)k);
	}
	sel_xfer_destroy(x);
	world_close(&w);
}

static void test_busy(void)
{
	struct world w;
	struct jobs js;
	world_open(&w, 2, 2 * PAGES);
	/* A spin far longer than the test: the ranks never sleep. */
	sel_xfer *x = xfer_open(&w, true, 60ull * 1000000000);
	/* The threads may have slept before the spin was set: one job, kicked,
	 * and from its end on they spin. */
	jobs_make(&js, 1, 0);
	submit_all(x, &js);
	(void)sel_xfer_kick(x);
	collect(&w, x, &js);
	uint64_t wakes = sel_xfer_wakes(x);
	CHECK(wakes <= 2);
	for (int round = 0; round < 3; round++) {
		jobs_make(&js, 30, 0);
		submit_all(x, &js);
		CHECK_RC(sel_xfer_kick(x), 0);
		collect(&w, x, &js);
	}
	CHECK(sel_xfer_sleeping(x) == 0);
	CHECK(sel_xfer_wakes(x) == wakes);
	sel_xfer_destroy(x); /* close ends the spin */
	world_close(&w);
}

static void test_backstop(void)
{
	struct world w;
	struct jobs js;
	world_open(&w, 2, 2 * PAGES);
	sel_xfer *x = xfer_open(&w, true, 0);
	wait_asleep(x, 2);
	jobs_make(&js, 5, 0);
	submit_all(x, &js);
	collect(&w, x, &js); /* never kicked: the backstop runs them */
	CHECK(sel_xfer_wakes(x) == 0);
	sel_xfer_destroy(x);
	world_close(&w);
}

static void test_immediate(void)
{
	struct world w;
	struct jobs js;
	world_open(&w, 2, 2 * PAGES);
	sel_xfer *x = xfer_open(&w, false, 0);
	wait_asleep(x, 2);
	jobs_make(&js, 1, 0);
	submit_all(x, &js);
	CHECK(sel_xfer_wakes(x) == 2); /* each sleeping rank signalled once */
	CHECK_RC(sel_xfer_kick(x), 0);
	collect(&w, x, &js);
	wait_asleep(x, 2);
	jobs_make(&js, 40, 0);
	submit_all(x, &js);
	CHECK(sel_xfer_wakes(x) >= 2 + 2 && sel_xfer_wakes(x) <= 2 + 2 * 40);
	collect(&w, x, &js);
	sel_xfer_destroy(x);
	world_close(&w);
}

static void test_two_sets(void)
{
	struct world w;
	struct jobs a, b;
	world_open(&w, 1, 2 * PAGES);
	sel_xfer *x = xfer_open(&w, true, 0), *y = xfer_open(&w, true, 0);
	wait_asleep(x, 1);
	wait_asleep(y, 1);
	jobs_make(&a, 20, 0);
	jobs_make(&b, 20, PAGES);
	for (uint32_t i = 0; i < 20; i++) { /* interleaved, as two stores' calls */
		CHECK_OK(sel_xfer_submit(x, &a.j[i]));
		CHECK_OK(sel_xfer_submit(y, &b.j[i]));
	}
	CHECK(sel_xfer_wakes(x) == 0 && sel_xfer_wakes(y) == 0);
	CHECK(sel_xfer_kick(x) <= 1 && sel_xfer_kick(y) <= 1);
	collect(&w, x, &a);
	collect(&w, y, &b);
	CHECK(sel_xfer_wakes(x) <= 1 && sel_xfer_wakes(y) <= 1);
	sel_xfer_destroy(x);
	sel_xfer_destroy(y);
	world_close(&w);
}

/* ---- the store level --------------------------------------------------------- */

static const uint64_t units2[2] = {4096, 1000};

static int count_events(sel_store *s, int *stored, int *fetched, uint64_t *polls)
{
	sel_event ev[16];
	int n = sel_store_poll(s, ev, 16);
	CHECK(n >= 0);
	++*polls;
	for (int i = 0; i < n; i++) {
		if (ev[i].type == SEL_EV_STORED)
			++*stored;
		else if (ev[i].type == SEL_EV_FETCHED)
			++*fetched;
		else
			CHECKF(ev[i].type == SEL_EV_PROGRESS, "event %d", (int)ev[i].type);
	}
	return n;
}

static void test_stores(void)
{
	struct sfx f;
	sfx_init(&f, 1, 2, units2, 2000, 256, 8);
	sel_store *s[2];
	for (int i = 0; i < 2; i++) {
		sel_store_config cfg = sfx_config(&f, false);
		cfg.memory_bytes = 200 * f.slot_bytes;
		CHECK_OK(sel_memory_store_open(&cfg, &s[i]));
		sel_store_flush(s[i]); /* a caller that flushes: wakes deferred from now on */
	}
	struct sfx_conv cv[2][8];
	sel_published cp[2][8];
	uint64_t flushes = 0, polls = 0;
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 8; k++) {
			sfx_conv_init(&f, &cv[i][k], 100 + (uint64_t)(8 * i + k), 128,
				      (uint32_t)(16 * k + 4 * i));
			cp[i][k] = sfx_ckpt(&f, &cv[i][k], 128, 0, 0, (uint64_t)(8 * i + k));
		}
	/* One pass: eight puts on each store, one flush each. */
	for (int k = 0; k < 8; k++)
		for (int i = 0; i < 2; i++) {
			sel_retry_reason why;
			CHECK(sel_store_put(s[i], &cp[i][k], &why) == SEL_QUEUED);
		}
	/* Deferred: the puts themselves signalled no thread (each store's
	 * ops table must have its flush, or the calls keep waking). */
	for (int i = 0; i < 2; i++) {
		sel_stats w;
		sel_store_stats(s[i], &w);
		CHECKF(w.thread_wakes == 0, "store %d: %" PRIu64 " wakes before its flush", i,
		       w.thread_wakes);
	}
	for (int i = 0; i < 2; i++) {
		sel_store_flush(s[i]);
		flushes += 2; /* with the one after open */
	}
	int stored = 0, fetched = 0;
	uint64_t end = eos_now_ns() + DEADLINE_NS;
	while (stored < 16) {
		for (int i = 0; i < 2; i++)
			(void)count_events(s[i], &stored, &fetched, &polls);
		CHECKF(eos_now_ns() < end, "%d of 16 stored", stored);
		struct pollfd pfd[2] = {{.fd = sel_store_wait_fd(s[0]), .events = POLLIN},
					{.fd = sel_store_wait_fd(s[1]), .events = POLLIN}};
		if (stored < 16)
			(void)poll(pfd, 2, 100);
	}
	/* One pass of fetches: each hit restored into other page ids. */
	uint32_t dst[2][8][2];
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 8; k++) {
			sel_hit hit;
			CHECK_RC(sel_store_lookup(s[i], &cv[i][k].h, 0, 128, &hit), 1);
			dst[i][k][0] = (uint32_t)(128 + 16 * k + 4 * i);
			dst[i][k][1] = dst[i][k][0] + 1;
			sel_inbound in = {.ticket = (uint64_t)(8 * i + k),
					  .pages = dst[i][k],
					  .n_pages = 2,
					  .state_slot = 3 + (uint32_t)i}; /* a row per store */
			CHECK_OK(sel_store_fetch(s[i], &hit, &in));
		}
	for (int i = 0; i < 2; i++) {
		sel_store_flush(s[i]);
		flushes++;
	}
	end = eos_now_ns() + DEADLINE_NS;
	while (fetched < 16) {
		for (int i = 0; i < 2; i++)
			(void)count_events(s[i], &stored, &fetched, &polls);
		CHECKF(eos_now_ns() < end, "%d of 16 fetched", fetched);
		if (fetched < 16) {
			struct pollfd pfd[2] = {{.fd = sel_store_wait_fd(s[0]), .events = POLLIN},
						{.fd = sel_store_wait_fd(s[1]), .events = POLLIN}};
			(void)poll(pfd, 2, 100);
		}
	}
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 8; k++)
			for (uint32_t j = 0; j < 2; j++)
				CHECK(sfx_page_ok(&f, dst[i][k][j], cv[i][k].tag, j, false));
	sel_stats a, b;
	sel_store_stats(s[0], &a);
	sel_store_stats(s[1], &b);
	/* 32 submissions: at most one wake per flush or poll, not per call. */
	CHECKF(a.thread_wakes + b.thread_wakes <= flushes + polls,
	       "%" PRIu64 " wakes for %" PRIu64 " flushes and %" PRIu64 " polls",
	       a.thread_wakes + b.thread_wakes, flushes, polls);

	/* A put never flushed nor polled: the wait descriptor still becomes
	 * readable (the copy thread's backstop), and the event comes. */
	struct sfx_conv late;
	sfx_conv_init(&f, &late, 999, 128, 200);
	sel_published lp = sfx_ckpt(&f, &late, 128, 0, 2, 999);
	sel_retry_reason why;
	CHECK(sel_store_put(s[0], &lp, &why) == SEL_QUEUED);
	struct pollfd pfd = {.fd = sel_store_wait_fd(s[0]), .events = POLLIN};
	CHECKF(poll(&pfd, 1, 10000) == 1, "the unflushed put never completed");
	stored = 0;
	end = eos_now_ns() + DEADLINE_NS;
	while (stored < 1) {
		(void)count_events(s[0], &stored, &fetched, &polls);
		CHECKF(eos_now_ns() < end, "no STORED event for the unflushed put");
	}
	sfx_conv_free(&late);

	for (int i = 0; i < 2; i++) {
		for (int k = 0; k < 8; k++)
			sfx_conv_free(&cv[i][k]);
		CHECK_RC(sel_store_close(s[i], 0), 0);
		sel_store_destroy(s[i]);
	}
	sel_store_flush(NULL); /* NULL-safe */

	/* A store never flushed (an engine, or a wrapping store, that does not
	 * call it): each put wakes its thread itself, as before. */
	sel_store *n;
	sel_store_config cfg = sfx_config(&f, false);
	cfg.memory_bytes = 200 * f.slot_bytes;
	CHECK_OK(sel_memory_store_open(&cfg, &n));
	struct sfx_conv nc;
	sfx_conv_init(&f, &nc, 777, 128, 220);
	sel_published np = sfx_ckpt(&f, &nc, 128, 0, 4, 777);
	CHECK(sel_store_put(n, &np, &why) == SEL_QUEUED);
	sel_stats ns;
	sel_store_stats(n, &ns);
	CHECK(ns.thread_wakes <= 1); /* 1 unless the thread was still awake */
	stored = 0;
	end = eos_now_ns() + DEADLINE_NS;
	while (stored < 1) {
		struct pollfd npf = {.fd = sel_store_wait_fd(n), .events = POLLIN};
		(void)poll(&npf, 1, 100);
		(void)count_events(n, &stored, &fetched, &polls);
		CHECKF(eos_now_ns() < end, "no STORED event on the never-flushed store");
	}
	sfx_conv_free(&nc);
	CHECK_RC(sel_store_close(n, 0), 0);
	sel_store_destroy(n);
	sfx_free(&f);
}

/* The disk store: its transfer set and its disk thread both defer.  Puts
 * of one pass and one flush store everything (copy-out, then the disk
 * thread's write), with at most two wakes (copy thread, disk thread) per
 * flush or poll; a put never flushed reaches disk too (both backstops). */
static void test_disk_store(void)
{
	struct sfx f;
	sfx_init(&f, 1, 2, units2, 2000, 256, 8);
	char *base = test_mkdtemp("wake");
	CHECK(base);
	sel_store_config cfg = sfx_config(&f, false);
	cfg.disk_dir = base;
	cfg.disk_limit = 1ull << 30;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	sel_store_flush(s); /* deferred wakes from now on */
	struct sfx_conv cv[9];
	sel_published cp[9];
	for (int k = 0; k < 9; k++) {
		sfx_conv_init(&f, &cv[k], 500 + (uint64_t)k, 128, (uint32_t)(16 * k));
		cp[k] = sfx_ckpt(&f, &cv[k], 128, 0, 0, (uint64_t)k);
	}
	for (int k = 0; k < 8; k++) {
		sel_retry_reason why;
		CHECK(sel_store_put(s, &cp[k], &why) == SEL_QUEUED);
	}
	sel_store_flush(s);
	uint64_t polls = 1; /* the flush after open */
	int stored = 0, fetched = 0;
	uint64_t end = eos_now_ns() + DEADLINE_NS;
	while (stored < 8) {
		(void)count_events(s, &stored, &fetched, &polls);
		CHECKF(eos_now_ns() < end, "%d of 8 stored on disk", stored);
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		if (stored < 8)
			(void)poll(&pfd, 1, 100);
	}
	sel_stats st;
	sel_store_stats(s, &st);
	CHECKF(st.thread_wakes <= 2 * (1 + polls),
	       "%" PRIu64 " wakes for 1 flush and %" PRIu64 " polls", st.thread_wakes, polls);
	/* Never flushed: waiting on the descriptor alone still sees it. */
	sel_retry_reason why;
	CHECK(sel_store_put(s, &cp[8], &why) == SEL_QUEUED);
	stored = 0;
	end = eos_now_ns() + DEADLINE_NS;
	while (stored < 1) {
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		CHECKF(poll(&pfd, 1, 10000) == 1, "the unflushed disk put never completed");
		(void)count_events(s, &stored, &fetched, &polls);
		CHECKF(eos_now_ns() < end, "no STORED event for the unflushed disk put");
	}
	for (int k = 0; k < 9; k++) {
		sel_hit hit;
		CHECK_RC(sel_store_lookup(s, &cv[k].h, 0, 128, &hit), 1);
		sfx_conv_free(&cv[k]);
	}
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	test_rmtree(base);
	free(base);
	sfx_free(&f);
}

/* ---- the late completion write ------------------------------------------- */

struct late {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool hold, in_window;
	int windows;
	int closed_at_write; /* atomic: close had returned when the write came */
	int closed;          /* atomic */
};

static void late_hook(void *arg)
{
	struct late *l = arg;
	pthread_mutex_lock(&l->mu);
	l->in_window = true;
	l->windows++;
	pthread_cond_broadcast(&l->cv);
	uint64_t end = eos_now_ns() + DEADLINE_NS;
	while (l->hold && eos_now_ns() < end) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 10 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&l->cv, &l->mu, &ts);
	}
	l->in_window = false;
	pthread_mutex_unlock(&l->mu);
	if (__atomic_load_n(&l->closed, __ATOMIC_SEQ_CST))
		__atomic_store_n(&l->closed_at_write, 1, __ATOMIC_SEQ_CST);
}

static void late_wait_window(struct late *l)
{
	uint64_t end = eos_now_ns() + DEADLINE_NS;
	pthread_mutex_lock(&l->mu);
	while (!l->in_window) {
		CHECKF(eos_now_ns() < end, "the rank thread never reached the write");
		pthread_mutex_unlock(&l->mu);
		eos_sleep_ns(100000);
		pthread_mutex_lock(&l->mu);
	}
	pthread_mutex_unlock(&l->mu);
}

static void late_release(struct late *l)
{
	pthread_mutex_lock(&l->mu);
	l->hold = false;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

static bool fd_readable(int fd, int ms)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	return poll(&pfd, 1, ms) == 1;
}

struct closer {
	sel_xfer *x;
	struct late *l;
	int rc;
};

static void *close_thread(void *arg)
{
	struct closer *c = arg;
	c->rc = sel_xfer_close(c->x, 0);
	__atomic_store_n(&c->l->closed, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void test_late_write(void)
{
	struct world w;
	struct jobs js;
	struct late l = {.hold = true};
	pthread_mutex_init(&l.mu, NULL);
	pthread_cond_init(&l.cv, NULL);
	world_open(&w, 1, 2 * PAGES);
	sel_xfer *x = xfer_open(&w, false, 0);
	sel_xfer_test_late_hook(x, late_hook, &l);
	int fd = sel_xfer_fd(x);

	/* The job is in the queue, its write not made: poll takes it and
	 * leaves the eventfd for later. */
	jobs_make(&js, 1, 0);
	submit_all(x, &js);
	late_wait_window(&l);
	CHECK_OK(sel_xfer_check(x));
	CHECK(!fd_readable(fd, 0));
	struct sel_xfer_job *done[4];
	CHECK(sel_xfer_poll(x, done, 4) == 1 && done[0] == &js.j[0]);
	CHECK_RC(done[0]->status, 0);
	CHECK_OK(sel_xfer_check(x));
	CHECK(!fd_readable(fd, 0));
	late_release(&l);
	/* The late write: readable with nothing queued, until a poll. */
	CHECK(fd_readable(fd, 10000));
	uint64_t end = eos_now_ns() + DEADLINE_NS;
	while (!__atomic_load_n(&x->written, __ATOMIC_SEQ_CST) && eos_now_ns() < end)
		eos_sleep_ns(100000);
	CHECK_OK(sel_xfer_check(x));
	CHECK(sel_xfer_poll(x, done, 4) == 0);
	CHECK(!fd_readable(fd, 0));
	CHECK_OK(sel_xfer_check(x));

	/* Jobs pushed behind a held write: the queue stays readable once the
	 * write lands, and every job still comes back in order. */
	pthread_mutex_lock(&l.mu);
	l.hold = true;
	pthread_mutex_unlock(&l.mu);
	jobs_make(&js, 8, 0);
	submit_all(x, &js);
	late_wait_window(&l);
	late_release(&l);
	collect(&w, x, &js);
	CHECK(sel_xfer_poll(x, done, 4) == 0);
	CHECK_OK(sel_xfer_check(x));

	/* A close begun while a write is held waits for it: the write never
	 * reaches a closed (or reused) descriptor. */
	pthread_mutex_lock(&l.mu);
	l.hold = true;
	pthread_mutex_unlock(&l.mu);
	jobs_make(&js, 1, 0);
	submit_all(x, &js);
	late_wait_window(&l);
	struct closer c = {.x = x, .l = &l, .rc = -1};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, close_thread, &c) == 0);
	/* Until close has begun (it refuses submissions), then a while for a
	 * close that would not wait to return. */
	end = eos_now_ns() + DEADLINE_NS;
	for (bool closing = false; !closing;) {
		pthread_mutex_lock(&x->submit);
		closing = x->closing;
		pthread_mutex_unlock(&x->submit);
		CHECKF(closing || eos_now_ns() < end, "close never began");
		eos_sleep_ns(100000);
	}
	end = eos_now_ns() + 100 * 1000000ull;
	while (!__atomic_load_n(&l.closed, __ATOMIC_SEQ_CST) && eos_now_ns() < end)
		eos_sleep_ns(1000000);
	CHECKF(!__atomic_load_n(&l.closed, __ATOMIC_SEQ_CST),
	       "close returned while a completion write was held");
	late_release(&l);
	pthread_join(t, NULL);
	CHECK_RC(c.rc, 0);
	CHECK(!__atomic_load_n(&l.closed_at_write, __ATOMIC_SEQ_CST));
	CHECK(l.windows >= 3);
	sel_xfer_destroy(x);
	world_close(&w);
	pthread_mutex_destroy(&l.mu);
	pthread_cond_destroy(&l.cv);
}

int main(void)
{
	test_deferred_asleep(1);
	test_deferred_asleep(2);
	test_busy();
	test_backstop();
	test_immediate();
	test_two_sets();
	test_stores();
	test_disk_store();
	test_late_write();
	printf("test_transfer_wake: ok\n");
	return 0;
}
