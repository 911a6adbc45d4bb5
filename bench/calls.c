/*
 * calls.c - wall time the model worker spends inside the memory store's
 * calls (design 2.2: every call returns without waiting; 2.10: a queued
 * copy carries page ids, address expansion runs on the transfer threads).
 *
 * For records of about 1 MiB (16 pages of 64 KiB) and about 1 GiB (128 pages
 * of 8 MiB: four 2 MiB planes), with the host copy backend and planes in
 * host memory, it times on the calling thread:
 *   store   sel_store_put() of a new checkpoint (QUEUED), including the
 *           tree evictions that make room once the pool is full;
 *   lookup  sel_store_lookup() hits;
 *   fetch   sel_store_fetch() of a hit;
 *   poll    sel_store_poll() calls, all of them (mostly empty) and those that
 *           delivered an event (poll_event).
 *   flush   sel_store_flush() after each put and fetch, as the engine calls
 *           it once per loop iteration: where the store's deferred wake of
 *           a sleeping copy thread lands (issue 18).
 * Goal: p99 <= 10 us, independent of record size.  The store's own work
 * per call is O(page ids); what varies most is waking an idle copy thread
 * (a futex wake, an IPI that costs 5-15 us in some VMs), and the first poll
 * after the worker slept on the wait fd.  After a 1 GiB copy the worker's
 * caches are cold as well.  Prints
 *   RESULT calls_<op>_<size>_{p50,p99,max}_us <v> us
 * and, where the kernel lets a thread count its own system calls (perf
 * tracepoints raw_syscalls:sys_enter and syscalls:sys_enter_futex), the
 * calling thread's system calls and futex calls (the wakes) per call:
 *   RESULT calls_<op>_<size>_syscalls_per_call <v> syscalls
 *   RESULT calls_<op>_<size>_futex_per_call <v> syscalls
 * Built with -DCALLS_NO_FLUSH it runs against a library without
 * sel_store_flush (the figures before issue 18's change).
 *
 * Two controls in the same run separate the record's size from what the
 * machine does to a thread (issue 18, docs/performance.md "What the 1 GiB
 * p99 is made of"):
 *   1MiB_128pages  1 MiB in 128 pages (2 KiB planes): the 1 GiB record's
 *                  page count at the small record's bytes, so O(pages) work
 *                  on the worker shows as calls_<op>_128pages_vs_16pages_p50;
 *   1MiB_idle      the 1 MiB case, 40 iterations, the worker asleep before
 *                  each wait for an event as long as it waited for a 1 GiB
 *                  copy (calls_idle_per_wait_ms): the 1 GiB timeline with
 *                  1 MiB records; calls_<op>_1GiB_vs_1MiB_idle_{p50,p99}
 *                  near 1 mean the 1 GiB figures are the time away, not the
 *                  size.
 * and calls_hash_{warm,after_idle}_floor_* time one 64-byte BLAKE2b back to
 * back and after the same sleep (CALLS_FLOOR_SPIN=1: the same time spent
 * spinning), with no store or copy running: the floor any call pays on
 * this machine after that long away; calls_eventfd_read_*_floor_* the
 * same for the delivering poll's one system call.
 *
 * Worker-like cases (the acceptance figures): a serving worker never
 * sleeps while it has work, it runs model steps between its store calls.
 * The cases above block on the store's wait fd until the copy completes
 * (poll(2), 100 ms at a time) or, 1MiB_idle, sleep (nanosleep): on a
 * quiet VM a vCPU that slept wakes slowly, and what those figures then
 * measure is that wake.  So the same calls run again with the worker kept
 * busy wherever it slept before:
 *   1MiB_busy, 1GiB_busy  a decode step of a synthetic model
 *                  (CALLS_STEP_CORE, default qwen-tp1) between polls, as
 *                  the engine's loop runs (the Helios worker as it is:
 *                  its steps run on this CPU and stream their weights);
 *                  calls_model_step_<size>_* their times, and
 *                  calls_hash_after_steps_floor_* the hash after as long
 *                  in steps as a 1 GiB wait;
 *   1MiB_spin, 1GiB_spin  a loop on the clock and registers of the
 *                  median step's length (calls_spin_step_us) between
 *                  polls: a worker whose steps run on a GPU, whose own
 *                  work touches little memory between the store's calls.
 *
 * Memory: the 1 GiB case holds 1 GiB of planes and a warm pool of three
 * records (about 3 GiB touched; the intake reserve is mapped, not touched).
 * The run takes two to four minutes (the 1MiB_idle case and the floor
 * sleep about 70 times as long as one 1 GiB copy takes; the worker-like
 * cases run the 1 MiB and 1 GiB cases twice more).  CALLS_ITERS overrides the iteration
 * count of the 1 GiB case (default 40); CALLS_OUTLIERS and CALLS_COLD_PROBE
 * (below) help find where a p99 comes from.
 */
#include <errno.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "benchlib.h"
#include "eos.h"
#include "helios/core.h"
#include "helios/model.h"
#include "selene.h"
#include "../tests/testutil.h"

#define PT 64u
#define NPLANES 4

struct samples {
	uint64_t *ns;
	size_t n, cap;
	uint64_t syscalls, futex; /* the calls' own, on this thread */
};

/* This thread's system calls: counters on the tracepoints, -1 where the
 * kernel has none or refuses. */
static int sc_fd[2] = {-1, -1};
static uint64_t sc_base[2]; /* what reading both costs (the reads count) */

static int tracepoint(const char *name)
{
	char path[128];
	snprintf(path, sizeof path, "/sys/kernel/tracing/events/%s/id", name);
	FILE *f = fopen(path, "r");
	if (!f) {
		snprintf(path, sizeof path, "/sys/kernel/debug/tracing/events/%s/id", name);
		f = fopen(path, "r");
	}
	long long id = -1;
	if (f) {
		if (fscanf(f, "%lld", &id) != 1)
			id = -1;
		fclose(f);
	}
	if (id < 0)
		return -1;
	struct perf_event_attr a = {.type = PERF_TYPE_TRACEPOINT,
				    .size = sizeof a,
				    .config = (uint64_t)id,
				    .exclude_kernel = 0};
	return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
}

static void sc_read(uint64_t v[2])
{
	for (int i = 0; i < 2; i++) {
		v[i] = 0;
		if (sc_fd[i] >= 0 && read(sc_fd[i], &v[i], sizeof v[i]) != (ssize_t)sizeof v[i])
			v[i] = 0;
	}
}

static void sc_open(void)
{
	sc_fd[0] = tracepoint("raw_syscalls/sys_enter");
	sc_fd[1] = tracepoint("syscalls/sys_enter_futex");
	if (sc_fd[0] < 0 || sc_fd[1] < 0) {
		printf("# system call counting unavailable (perf tracepoints): no per-call"
		       " syscall figures\n");
		return;
	}
	uint64_t a[2], b[2];
	sc_read(a);
	sc_read(b);
	sc_base[0] = b[0] - a[0];
	sc_base[1] = b[1] - a[1];
}

/* The syscalls between two reads, less the reading's own. */
static void sc_add(struct samples *s, const uint64_t a[2], const uint64_t b[2])
{
	s->syscalls += b[0] - a[0] > sc_base[0] ? b[0] - a[0] - sc_base[0] : 0;
	s->futex += b[1] - a[1] > sc_base[1] ? b[1] - a[1] - sc_base[1] : 0;
}

static void add(struct samples *s, uint64_t ns)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 1024;
		s->ns = realloc(s->ns, s->cap * sizeof(*s->ns));
		CHECK(s->ns);
	}
	s->ns[s->n++] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Prints the figures of s and frees it; returns its p99 in us (and its
 * p50 in *p50_out). */
static double report(const char *op, const char *size, struct samples *s, double *p50_out)
{
	CHECK(s->n > 0);
	qsort(s->ns, s->n, sizeof(*s->ns), cmp_u64);
	double p50 = s->ns[(s->n - 1) / 2] / 1e3;
	double p99 = s->ns[(size_t)((s->n - 1) * 0.99)] / 1e3;
	double max = s->ns[s->n - 1] / 1e3;
	printf("RESULT calls_%s_%s_p50_us %.2f us\n", op, size, p50);
	printf("RESULT calls_%s_%s_p99_us %.2f us\n", op, size, p99);
	printf("RESULT calls_%s_%s_max_us %.2f us\n", op, size, max);
	if (sc_fd[0] >= 0) {
		printf("RESULT calls_%s_%s_syscalls_per_call %.3f syscalls\n", op, size,
		       (double)s->syscalls / (double)s->n);
		printf("RESULT calls_%s_%s_futex_per_call %.3f syscalls\n", op, size,
		       (double)s->futex / (double)s->n);
	}
	printf("# %s %s: %zu samples\n", op, size, s->n);
	if (p50_out)
		*p50_out = p50;
	free(s->ns);
	*s = (struct samples){0};
	return p99;
}

struct bench {
	const char *size;
	uint64_t plane_unit; /* bytes per page per plane */
	uint32_t pages;      /* pages per record */
	uint64_t row_bytes;
	uint32_t warm_records; /* records the warm pool holds */
	uint32_t keys;         /* distinct records cycled through */
	uint32_t iters;
	uint64_t idle_ns; /* the worker sleeps this long before each wait for an event */
};

/* What one case measured, for the same-run comparisons in main. */
struct outcome {
	double p50[4], p99[4]; /* store, lookup, fetch, poll delivering an event */
	uint64_t stored_wait;  /* median wait for a put's STORED event, ns */
};

/* A poll that delivers, not all polls: in the 1MiB_idle case the copy is
 * done when the worker wakes, so every poll delivers there. */
static const char *const ops[4] = {"store", "lookup", "fetch", "poll_event"};

/* Time one call, with its system calls. */
#define TIMED(smp, call)                                                                           \
	do {                                                                                       \
		uint64_t c0_[2], c1_[2];                                                           \
		sc_read(c0_);                                                                      \
		uint64_t t0_ = eos_now_ns();                                                       \
		call;                                                                              \
		uint64_t dt_ = eos_now_ns() - t0_;                                                 \
		sc_read(c1_);                                                                      \
		add((smp), dt_);                                                                   \
		sc_add((smp), c0_, c1_);                                                           \
	} while (0)

/* The engine's end of a pass: wake what the call queued. */
#ifdef CALLS_NO_FLUSH
#define FLUSH(smp, s) ((void)(smp), (void)(s))
#else
#define FLUSH(smp, s) TIMED(smp, sel_store_flush(s))
#endif

/* CALLS_OUTLIERS=us: print every timed store or lookup call slower than
 * that, with its iteration (where a p99 comes from). */
static double outlier_us = -1;

static void outlier(const char *op, const char *size, uint32_t it, int r, uint64_t ns)
{
	if (outlier_us >= 0 && ns / 1e3 > outlier_us)
		printf("# outlier %s %s iteration %u call %d: %.2f us\n", op, size, it, r,
		       ns / 1e3);
}

/* CALLS_COLD_PROBE=1: time one BLAKE2b of 64 bytes (the hash a lookup and
 * a put compute) right before each iteration's first lookup, as
 * calls_cold_hash_<size>: what the first call after a transfer pays for
 * caches the copy evicted, whatever the store does.  It warms them for the
 * lookup that follows, so lookup figures of such a run are not comparable. */
static bool cold_probe;

static void cold_hash(void)
{
	static uint8_t in[64], out[32];
	crypto_generichash(out, sizeof out, in, sizeof in, NULL, 0);
	in[0] = out[0];
}

/* The worker kept busy (the *_busy cases): a serving worker does not
 * sleep while it has work, it runs model steps between its store calls and
 * polls the store once per step.  These cases run real decode steps of a
 * synthetic model (CALLS_STEP_CORE, default qwen-tp1, the realistic core
 * of bench/serve.py) on this thread wherever the sleeping cases block on
 * the wait fd or sleep; everything else is the same. */
struct stepper {
	hel_core *core;
	hel_model *m;
	uint32_t *table;
	int32_t *logits;
	uint64_t pos, limit; /* the row's position; re-initialised at limit */
	hel_token next;
	struct samples ns; /* each step's time */
	uint64_t spin_ns;  /* set: a *_spin case, a compute loop this long instead */
};

static struct stepper *busy; /* set: the running case is a *_busy one */

static struct stepper *stepper_open(void)
{
	const char *name = getenv("CALLS_STEP_CORE");
	char path[4200], err[512];
	snprintf(path, sizeof path, "%s/%s.core", bench_cores_dir(),
		 name && *name ? name : "qwen-tp1");
	struct stepper *w = calloc(1, sizeof *w);
	CHECK(w);
	CHECKF(hel_core_load(path, &w->core, err, sizeof err) == 0, "%s", err);
	uint32_t pt = w->core->page_tokens;
	w->limit = 1024 < w->core->max_context ? 1024 : w->core->max_context - 1;
	hel_model_opts o = {
		.mode = SEL_MODE_ORDINARY, .pages = (uint32_t)(w->limit / pt) + 2, .rows = 1};
	CHECKF(hel_model_create(w->core, &o, &w->m) == 0, "%s: %s", path, sel_errmsg());
	w->table = malloc(o.pages * sizeof *w->table);
	w->logits = malloc(w->core->vocab * sizeof *w->logits);
	CHECK(w->table && w->logits);
	for (uint32_t i = 0; i < o.pages; i++)
		w->table[i] = i;
	w->pos = w->limit; /* the first step initialises the row */
	return w;
}

/* One decode step, as the engine's loop runs between two polls; in a
 * *_spin case a loop on the clock and registers of a step's length. */
static void model_step(struct stepper *w)
{
	if (w->spin_ns) {
		volatile uint64_t x = 0;
		for (uint64_t t0 = eos_now_ns(); eos_now_ns() - t0 < w->spin_ns;)
			x = x * 6364136223846793005u + 1;
		return;
	}
	if (w->pos >= w->limit) {
		CHECK_OK(hel_model_row_init(w->m, 0));
		w->pos = 0;
		w->next = 1;
	}
	uint32_t np = (uint32_t)(w->pos / w->core->page_tokens);
	uint64_t t0 = eos_now_ns();
	CHECK_OK(hel_model_step(w->m, 0, w->table, np, w->next, w->table[np], w->logits));
	add(&w->ns, eos_now_ns() - t0);
	w->pos++;
	w->next = hel_sample(w->logits, w->core->vocab, NULL, w->pos);
}

static void stepper_close(struct stepper *w)
{
	hel_model_destroy(w->m);
	hel_core_free(w->core);
	free(w->table);
	free(w->logits);
	free(w->ns.ns);
	free(w);
}

/* Poll until one event arrives, timing every poll call: between polls the
 * sleeping cases block on the wait fd (the thread sleeps until the copy
 * thread's completion write), the busy ones run a model step. */
static sel_event wait_one(sel_store *s, struct samples *all, struct samples *with_event)
{
	sel_event ev;
	for (;;) {
		uint64_t c0[2], c1[2];
		sc_read(c0);
		uint64_t t0 = eos_now_ns();
		int n = sel_store_poll(s, &ev, 1);
		uint64_t dt = eos_now_ns() - t0;
		sc_read(c1);
		CHECK_OK(n);
		add(all, dt);
		sc_add(all, c0, c1);
		if (n == 1) {
			add(with_event, dt);
			sc_add(with_event, c0, c1);
			return ev;
		}
		if (busy) {
			model_step(busy);
			continue;
		}
		struct pollfd pfd = {.fd = sel_store_wait_fd(s), .events = POLLIN};
		poll(&pfd, 1, 100);
	}
}

/* Sleep for ns, as the worker sleeps on the wait fd while a 1 GiB copy
 * runs (the small copy may complete meanwhile: its event waits); in a busy
 * case, model steps for that long instead. */
static void idle(uint64_t ns)
{
	if (busy) {
		for (uint64_t t0 = eos_now_ns(); eos_now_ns() - t0 < ns;)
			model_step(busy);
		return;
	}
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
			      .tv_nsec = (long)(ns % 1000000000u)};
	while (nanosleep(&ts, &ts) != 0)
		CHECK(errno == EINTR);
}

static uint64_t median(struct samples *s)
{
	CHECK(s->n > 0);
	qsort(s->ns, s->n, sizeof(*s->ns), cmp_u64);
	uint64_t m = s->ns[(s->n - 1) / 2];
	free(s->ns);
	*s = (struct samples){0};
	return m;
}

/* Distinct keys: one salted history per record, all of b->pages pages. */
struct keys {
	sel_history *h;
	sel_published *cp;
	uint32_t *ids;
};

static struct keys make_keys(const struct bench *b, uint64_t c)
{
	uint8_t model[SEL_IDENTITY_BYTES] = {1, 2, 3};
	sel_token *tok = malloc(c * sizeof(*tok));
	CHECK(tok);
	for (uint64_t i = 0; i < c; i++)
		tok[i] = (sel_token)(i * 2654435761u % 50000);
	struct keys k = {.h = calloc(b->keys, sizeof(*k.h)),
			 .cp = calloc(b->keys, sizeof(*k.cp)),
			 .ids = malloc(b->pages * sizeof(*k.ids))};
	CHECK(k.h && k.cp && k.ids);
	for (uint32_t i = 0; i < b->pages; i++)
		k.ids[i] = i;
	for (uint32_t i = 0; i < b->keys; i++) {
		uint32_t salt = i;
		CHECK_OK(sel_history_init(&k.h[i], model, &salt, sizeof(salt)));
		CHECK_OK(sel_history_append(&k.h[i], tok, c));
		k.cp[i].checkpoint = i;
		sel_history_key_at(&k.h[i], c, &k.cp[i].key);
		k.cp[i].bucket = *sel_history_bound(&k.h[i], c / SEL_BUCKET_TOKENS);
		k.cp[i].pages = k.ids;
		k.cp[i].n_pages = b->pages;
		k.cp[i].tail = b->pages;
		k.cp[i].state_slot = 0;
	}
	free(tok);
	return k;
}

static void free_keys(const struct bench *b, struct keys *k)
{
	for (uint32_t i = 0; i < b->keys; i++)
		sel_history_free(&k->h[i]);
	free(k->h);
	free(k->cp);
	free(k->ids);
}

static struct outcome run(const struct bench *b)
{
	uint8_t *plane[NPLANES], *row;
	sel_allocation a[NPLANES + 1];
	static const char *names[NPLANES] = {"k0", "k1", "v0", "v1"};
	uint32_t gpu_pages = b->pages + 1;

	for (int p = 0; p < NPLANES; p++) {
		plane[p] = eos_aligned_alloc(4096, b->plane_unit * gpu_pages);
		CHECK(plane[p]);
		memset(plane[p], 0x11 * (p + 1), b->plane_unit * gpu_pages);
		a[p] = (sel_allocation){.rank = 0,
					.name = names[p],
					.group = SEL_GROUP_KV_PAGES,
					.kind = SEL_MEM_HOST,
					.address = (uint64_t)(uintptr_t)plane[p],
					.unit_bytes = b->plane_unit,
					.count = gpu_pages};
	}
	row = eos_aligned_alloc(4096, b->row_bytes * 4);
	CHECK(row);
	a[NPLANES] = (sel_allocation){.rank = 0,
				      .name = "state",
				      .group = SEL_GROUP_STATE_ROWS,
				      .kind = SEL_MEM_HOST,
				      .address = (uint64_t)(uintptr_t)row,
				      .unit_bytes = b->row_bytes,
				      .count = 4};
	sel_geometry *g;
	CHECK_OK(sel_geometry_build(a, NPLANES + 1, 1, PT, &g));

	uint64_t slot_bytes = NPLANES * b->plane_unit;
	uint64_t row_slots = (b->row_bytes + slot_bytes - 1) / slot_bytes;
	sel_store_config cfg = {0};
	cfg.geometry = g;
	cfg.max_active = 1;
	cfg.memory_bytes = (uint64_t)b->warm_records * (b->pages + row_slots) * slot_bytes;
	cfg.host_headroom = 1ull << 40; /* the intake reserve is mapped, never touched here */
	sel_store *s;
	CHECK_OK(sel_memory_store_open(&cfg, &s));

	uint64_t c = (uint64_t)b->pages * PT;
	struct keys k = make_keys(b, c);
	sel_history *h = k.h;
	sel_published *cp = k.cp;

	struct samples st = {0}, lk = {0}, fe = {0}, pa = {0}, pe = {0}, fl = {0}, ch = {0},
		       sw = {0};
	uint32_t dst[b->pages];
	for (uint32_t i = 0; i < b->pages; i++)
		dst[i] = b->pages - i; /* other ids than the source */
	uint64_t t_start = eos_now_ns();
	for (uint32_t it = 0; it < b->iters; it++) {
		sel_published *p = &cp[it % b->keys];
		sel_retry_reason why;
		sel_outcome o;
		/* Evicted by now (keys > warm records), so a real store. */
		TIMED(&st, o = sel_store_put(s, p, &why));
		outlier("store", b->size, it, 0, st.ns[st.n - 1]);
		CHECKF(o == SEL_QUEUED, "iteration %u: %s (%s): %s", it, sel_outcome_name(o),
		       sel_retry_reason_name(why), sel_errmsg());
		FLUSH(&fl, s);
		uint64_t w0 = eos_now_ns();
		if (b->idle_ns)
			idle(b->idle_ns);
		sel_event ev = wait_one(s, &pa, &pe);
		add(&sw, eos_now_ns() - w0);
		CHECK(ev.type == SEL_EV_STORED);

		sel_hit hit;
		int rc;
		if (cold_probe)
			TIMED(&ch, cold_hash());
		for (int r = 0; r < 8; r++) {
			TIMED(&lk, rc = sel_store_lookup(s, &h[it % b->keys], 0, c, &hit));
			CHECK_RC(rc, 1);
			outlier("lookup", b->size, it, r, lk.ns[lk.n - 1]);
		}
		CHECK(hit.pages == b->pages);
		if (it % 4 == 0) {
			sel_inbound in = {
				.ticket = it, .pages = dst, .n_pages = b->pages, .state_slot = 1};
			TIMED(&fe, rc = sel_store_fetch(s, &hit, &in));
			CHECK_OK(rc);
			FLUSH(&fl, s);
			if (b->idle_ns)
				idle(b->idle_ns);
			ev = wait_one(s, &pa, &pe);
			CHECK(ev.type == SEL_EV_FETCHED);
		}
	}
	double secs = (eos_now_ns() - t_start) / 1e9;
	sel_stats ss;
	sel_store_stats(s, &ss);
	printf("# %s: %u stores, %" PRIu64 " evictions, %.1f s, memory rate %.2f GB/s\n", b->size,
	       b->iters, ss.tier[SEL_TIER_MEMORY].evicted, secs,
	       ss.tier[SEL_TIER_MEMORY].rate_bps / 1e9);
	struct outcome out = {.stored_wait = median(&sw)};
	out.p99[0] = report("store", b->size, &st, &out.p50[0]);
	out.p99[1] = report("lookup", b->size, &lk, &out.p50[1]);
	out.p99[2] = report("fetch", b->size, &fe, &out.p50[2]);
	report("poll", b->size, &pa, NULL);
	out.p99[3] = report("poll_event", b->size, &pe, &out.p50[3]);
	if (cold_probe)
		report("cold_hash", b->size, &ch, NULL);
#ifndef CALLS_NO_FLUSH
	report("flush", b->size, &fl, NULL);
	printf("RESULT calls_thread_wakes_%s %" PRIu64 " wakes\n", b->size, ss.thread_wakes);
#endif

	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	free_keys(b, &k);
	sel_geometry_free(g);
	for (int p = 0; p < NPLANES; p++)
		eos_aligned_free(plane[p]);
	eos_aligned_free(row);
	return out;
}

/* The machine's own floor, with no store and no copy anywhere: right
 * after sleeping ns, against the same thing back to back, one BLAKE2b of
 * 64 bytes (a lookup computes at least two) or one read of a readable
 * eventfd (the one system call of a poll that delivers), alternately. */
static void floor_case(uint64_t ns)
{
	/* CALLS_FLOOR_SPIN=1: spin on the clock instead of sleeping: the
	 * thread never sleeps (a core burnt for the case's length). */
	bool spin = getenv("CALLS_FLOOR_SPIN") && atoi(getenv("CALLS_FLOOR_SPIN")) > 0;
	struct samples warm[2] = {{0}}, away[2] = {{0}};
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	eventfd_t v;
	CHECK(efd >= 0);
	for (int i = 0; i < 24; i++) {
		int k = i % 2;
		cold_hash();
		CHECK(eventfd_write(efd, 1) == 0);
		if (k)
			TIMED(&warm[k], CHECK(eventfd_read(efd, &v) == 0));
		else
			TIMED(&warm[k], cold_hash());
		CHECK(eventfd_write(efd, 1) == 0);
		if (spin)
			for (uint64_t t0 = eos_now_ns(); eos_now_ns() - t0 < ns;)
				;
		else
			idle(ns);
		if (k)
			TIMED(&away[k], CHECK(eventfd_read(efd, &v) == 0));
		else
			TIMED(&away[k], cold_hash());
		if (!k)
			CHECK(eventfd_read(efd, &v) == 0);
	}
	close(efd);
	report("hash_warm", "floor", &warm[0], NULL);
	report("hash_after_idle", "floor", &away[0], NULL);
	report("eventfd_read_warm", "floor", &warm[1], NULL);
	report("eventfd_read_after_idle", "floor", &away[1], NULL);
}

/* The floor of the busy cases: one 64-byte BLAKE2b back to back, and
 * after model steps for ns (as long as the worker waited for a 1 GiB copy
 * in the busy case), with no store or copy running. */
static void steps_floor(struct stepper *w, uint64_t ns)
{
	struct samples warm = {0}, away = {0};
	for (int i = 0; i < 12; i++) {
		cold_hash();
		TIMED(&warm, cold_hash());
		for (uint64_t t0 = eos_now_ns(); eos_now_ns() - t0 < ns;)
			model_step(w);
		TIMED(&away, cold_hash());
	}
	free(w->ns.ns);
	w->ns = (struct samples){0};
	report("hash_warm_busy", "floor", &warm, NULL);
	report("hash_after_steps", "floor", &away, NULL);
}

/* Print RESULT calls_<op>_<name>_<pct> a/b for each op. */
static void ratios(const char *name, const char *pct, const double *a, const double *b)
{
	for (int i = 0; i < 4; i++)
		printf("RESULT calls_%s_%s_%s %.2f ratio\n", ops[i], name, pct, a[i] / b[i]);
}

int main(void)
{
	uint32_t big_iters = 40;
	const char *e = getenv("CALLS_ITERS");
	if (e && atoi(e) > 0)
		big_iters = (uint32_t)atoi(e);
	/* 16 pages x 4 planes x 16 KiB = 1 MiB. */
	const struct bench small = {.size = "1MiB",
				    .plane_unit = 16 << 10,
				    .pages = 16,
				    .row_bytes = 64 << 10,
				    .warm_records = 16,
				    .keys = 40,
				    .iters = 2000};
	/* 128 pages x 4 planes x 2 KiB = 1 MiB: the page count of the 1 GiB
	 * record at the bytes of the small one, so O(pages) work shows. */
	struct bench paged = small;
	paged.size = "1MiB_128pages";
	paged.plane_unit = 2 << 10;
	paged.pages = 128;
	/* 128 pages x 4 planes x 2 MiB = 1 GiB. */
	const struct bench big = {.size = "1GiB",
				  .plane_unit = 2 << 20,
				  .pages = 128,
				  .row_bytes = 1 << 20,
				  .warm_records = 3,
				  .keys = 5,
				  .iters = big_iters};
	cold_probe = getenv("CALLS_COLD_PROBE") && atoi(getenv("CALLS_COLD_PROBE")) > 0;
	if ((e = getenv("CALLS_OUTLIERS")))
		outlier_us = atof(e);
	sc_open();
	struct outcome o_small = run(&small);
	struct outcome o_paged = run(&paged);
	struct outcome o_big = run(&big);
	/* The 1 MiB record again, the worker asleep before each wait for an
	 * event as long as it waited for a 1 GiB copy: the 1 GiB case's
	 * timeline with 1 MiB records, so what is left of a 1 GiB / 1 MiB_idle
	 * ratio above 1 is the record's size, not the time away. */
	struct bench idled = small;
	idled.size = "1MiB_idle";
	idled.iters = big.iters;
	idled.idle_ns = o_big.stored_wait;
	printf("RESULT calls_idle_per_wait_ms %.1f ms\n", idled.idle_ns / 1e6);
	struct outcome o_idled = run(&idled);
	floor_case(idled.idle_ns);
	ratios("128pages_vs_16pages", "p50", o_paged.p50, o_small.p50);
	ratios("1GiB_vs_1MiB_idle", "p50", o_big.p50, o_idled.p50);
	ratios("1GiB_vs_1MiB_idle", "p99", o_big.p99, o_idled.p99);

	/* The worker-like cases: the same calls, model steps between them
	 * instead of sleeps (the acceptance figures; docs/performance.md). */
	busy = stepper_open();
	struct bench small_busy = small, big_busy = big;
	small_busy.size = "1MiB_busy";
	big_busy.size = "1GiB_busy";
	struct outcome o_small_busy = run(&small_busy);
	report("model_step", small_busy.size, &busy->ns, NULL);
	struct outcome o_big_busy = run(&big_busy);
	double step_p50;
	report("model_step", big_busy.size, &busy->ns, &step_p50);
	steps_floor(busy, o_big_busy.stored_wait);
	ratios("1MiB_busy_vs_1MiB", "p99", o_small_busy.p99, o_small.p99);
	ratios("1GiB_busy_vs_1GiB", "p99", o_big_busy.p99, o_big.p99);
	/* The same with a loop of the median step's length that touches no
	 * memory: a worker whose steps run elsewhere (a GPU's), so that its
	 * own caches hold little but the loop and the store. */
	busy->spin_ns = (uint64_t)(step_p50 * 1e3);
	struct bench small_spin = small, big_spin = big;
	small_spin.size = "1MiB_spin";
	big_spin.size = "1GiB_spin";
	run(&small_spin);
	run(&big_spin);
	printf("RESULT calls_spin_step_us %.2f us\n", step_p50);
	stepper_close(busy);
	busy = NULL;
	return 0;
}
