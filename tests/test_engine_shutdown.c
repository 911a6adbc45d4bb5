/*
 * test_engine_shutdown.c - stopping the engine under load (design 2.8
 * shutdown, 2.5 the drain on shutdown; the retention issue's acceptance):
 * the built-in core, a composite store (warm memory small enough that
 * maintenance spills to disk while requests run), slow disk writes.
 *
 * Each cycle opens an engine on the same record directory, checks that
 * every record committed at the previous stop came back (no committed
 * record lost), submits requests without waiting for them, stops the
 * engine while requests, publications and spills are in flight, and
 * checks that the stop returned 0 within its bound (drain limit plus a
 * grace; none for an unlimited drain), every request got its on_done, no
 * temporary file is left, and a drain reported its end once.  Cycles rotate
 * through an unlimited drain, a drain limited to 100 ms (with writes slowed
 * so that the limit cuts it short), and no drain.
 *
 * "Committed" excludes what the design lets a stop lose: a record whose
 * parent's file was never written (an orphan at the next start) and a
 * page-only record left without a committed child (pruned at the next
 * start).  After an unlimited drain nothing is excluded.
 *
 * A handful of cycles by default; 200 with SELENE_SOAK=1.
 */

#include "engine_test.h"
#include "record.h"
#include "store_composite.h"
#include "store_disk.h"
#include "recutil.h"

#define GRACE_NS (3ull * 1000000000ull)
#define SLACK_NS (500ull * 1000000ull)

static hel_core *core;
static test_rng rng;
static int total_cancelled;

/* ---- slow disk writes ---------------------------------------------------------------- */

static uint64_t write_delay_ns = 200000; /* per pwrite; slower for limited drains */

static ssize_t slow_pwrite(int fd, const void *b, size_t n, off_t off)
{
	eos_sleep_ns(__atomic_load_n(&write_delay_ns, __ATOMIC_RELAXED));
	return eos_fileops_libc.pwrite(fd, b, n, off);
}

static struct eos_fileops slow_ops;

/* ---- the store, kept for inspection after the stop ------------------------------------- */

struct holder {
	sel_store *s;
	int reports, finals, offs;
	uint64_t off_left;
	sel_drain_progress final;
};

static int open_real(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	struct holder *h = ctx;
	int rc = sel_store_open(cfg, out);
	h->s = rc == 0 ? *out : NULL;
	return rc;
}

static void on_drain(void *ctx, const sel_drain_progress *p)
{
	struct holder *h = ctx;
	h->reports++;
	if (p->off) { /* no drain: what the stop did not save */
		h->offs++;
		h->off_left = p->records_left;
		return;
	}
	if (p->final) {
		h->finals++;
		h->final = *p;
	}
}

/* ---- what a restart must find ------------------------------------------------------------ */

struct expect {
	sel_key *k;
	size_t n, cap;
	size_t excluded;
};

/* The records committed at the stop that the next start keeps. */
static void committed(sel_store *disk, struct expect *x)
{
	size_t n = sel_disk_store_keys(disk, NULL, 0);
	sel_key *all = malloc((n + 1) * sizeof(*all));
	struct sel_disk_record_info *ri = malloc((n + 1) * sizeof(*ri));
	bool *in = calloc(n + 1, sizeof(*in));
	CHECK(all && ri && in);
	n = sel_disk_store_keys(disk, all, n);
	size_t files = 0;
	for (size_t i = 0; i < n; i++) {
		CHECK_OK(sel_disk_store_record(disk, &all[i], &ri[i]));
		in[i] = ri[i].file;
		files += in[i];
	}
	for (bool changed = true; changed;) {
		changed = false;
		for (size_t i = 0; i < n; i++) {
			if (!in[i])
				continue;
			bool keep = true;
			if (!ri[i].is_root) { /* its parent's file is needed */
				bool parent = false;
				for (size_t j = 0; j < n && !parent; j++)
					parent = in[j] && sel_key_eq(&all[j], &ri[i].parent);
				keep = parent;
			}
			if (keep && !ri[i].has_row) { /* page-only: needs a child */
				bool child = false;
				for (size_t j = 0; j < n && !child; j++)
					child = in[j] && !ri[j].is_root &&
						sel_key_eq(&ri[j].parent, &all[i]);
				keep = child;
			}
			if (!keep) {
				in[i] = false;
				changed = true;
			}
		}
	}
	x->n = 0;
	for (size_t i = 0; i < n; i++) {
		if (!in[i])
			continue;
		if (x->n == x->cap) {
			x->cap = x->cap ? 2 * x->cap : 64;
			x->k = realloc(x->k, x->cap * sizeof(*x->k));
			CHECK(x->k);
		}
		x->k[x->n++] = all[i];
	}
	x->excluded = files - x->n;
	free(all);
	free(ri);
	free(in);
}

/* ---- one cycle --------------------------------------------------------------------------- */

enum {
	N_REQ = 24
};

static void cycle(int i, const char *dir, struct expect *x, uint64_t *max_stop_ns)
{
	int mode = i % 3; /* 0: drain until done, 1: drain 100 ms, 2: no drain */
	struct holder h = {0};
	hel_engine_config c = {
		.core = core,
		.max_active = 4,
		.gpu_pages = 96,
		.gpu_rows = 48,
		.memory_bytes = 3 << 20,
		.disk_dir = dir,
		.disk_limit = 64 << 20,
		.disk_limit_set = true,
		.drain_on_shutdown = mode != 2,
		.drain_limit_ns = mode == 1 ? 100000000ull : 0,
		.drain_progress = on_drain,
		.drain_ctx = &h,
		.fetch = HEL_FETCH_ALWAYS,
		.store_open = open_real,
		.store_ctx = &h,
	};
	hel_engine *e;
	CHECK_OK(hel_engine_open(&c, &e));
	CHECK(h.s && !strcmp(h.s->ops->name, "composite"));
	sel_store *disk = sel_composite_store_disk(h.s);
	/* Nothing committed at the last stop is lost. */
	for (size_t k = 0; k < x->n; k++) {
		struct sel_disk_record_info ri;
		CHECKF(sel_disk_store_record(disk, &x->k[k], &ri) == 0 && ri.file,
		       "cycle %d: record of %" PRIu64 " tokens committed at the last stop is gone",
		       i, x->k[k].consumed);
	}
	CHECK_OK(sel_composite_store_check(h.s));
	CHECK_OK(hel_engine_start(e));

	/* Load: requests that share prefixes (so records chain), not awaited. */
	struct et_call *calls[N_REQ];
	hel_token *prompts[N_REQ];
	uint32_t base_n;
	hel_token *base = et_random_prompt(&rng, 300 + test_rng_below(&rng, 300), &base_n);
	for (int r = 0; r < N_REQ; r++) {
		uint32_t extra_n;
		hel_token *extra = et_random_prompt(&rng, 50 + test_rng_below(&rng, 400), &extra_n);
		uint32_t n = (r % 2 ? base_n : 0) + extra_n;
		prompts[r] = malloc(n * sizeof(hel_token));
		CHECK(prompts[r]);
		if (r % 2)
			memcpy(prompts[r], base, base_n * sizeof(hel_token));
		memcpy(prompts[r] + (r % 2 ? base_n : 0), extra, extra_n * sizeof(hel_token));
		free(extra);
		calls[r] = et_call_new();
		CHECK_OK(et_submit(e, calls[r], prompts[r], n,
				   40 + (uint32_t)test_rng_below(&rng, 100), NULL));
	}
	free(base);
	eos_sleep_ns((5 + test_rng_below(&rng, 40)) * 1000000ull);
	hel_engine_stats st;
	hel_engine_stats_get(e, &st);

	uint64_t bound = mode == 0 ? 0 : (mode == 1 ? 100000000ull : 0) + GRACE_NS;
	/* A limited drain meets writes slow enough for its limit to matter. */
	if (mode == 1)
		__atomic_store_n(&write_delay_ns, 3000000, __ATOMIC_RELAXED);
	uint64_t t0 = eos_now_ns();
	CHECK_RC(hel_engine_stop(e, bound ? t0 + bound : 0), 0);
	uint64_t took = eos_now_ns() - t0;
	__atomic_store_n(&write_delay_ns, 200000, __ATOMIC_RELAXED);
	if (took > *max_stop_ns)
		*max_stop_ns = took;
	CHECKF(!bound || took <= bound + SLACK_NS,
	       "cycle %d: stop took %" PRIu64 " ms, bound %" PRIu64 " ms", i, took / 1000000,
	       bound / 1000000);
	CHECKF(took < 20000000000ull, "cycle %d: stop took %" PRIu64 " ms", i, took / 1000000);
	int cancelled = 0;
	for (int r = 0; r < N_REQ; r++) {
		et_wait(calls[r]);
		cancelled += !strcmp(calls[r]->out.finish_reason, "cancelled");
		et_call_free(calls[r]);
		free(prompts[r]);
	}
	CHECK(h.finals == (mode != 2));
	CHECK(mode == 2 ? h.offs <= 1 && (h.offs == 0 || h.off_left > 0) : h.offs == 0);
	if (mode == 0)
		CHECKF(h.final.records_left == 0 && h.final.failed == 0,
		       "cycle %d: %" PRIu64 " records not saved (%s)", i, h.final.records_left,
		       h.final.why);
	CHECK(test_count_tmp(test_store_dir(h.s)) == 0);
	CHECK_OK(sel_composite_store_check(h.s));
	committed(disk, x);
	if (mode == 0)
		CHECKF(x->excluded == 0, "cycle %d: %zu committed records would not come back", i,
		       x->excluded);
	total_cancelled += cancelled;
	if (i < 3 || test_soak())
		printf("  cycle %d (%s): stop %" PRIu64 " ms with %d requests cancelled, %" PRIu64
		       " copies out, %" PRIu64
		       " parked; %zu records committed (%zu excluded), drain "
		       "saved %" PRIu64 ", %" PRIu64 " not\n",
		       i,
		       mode == 0   ? "drain"
		       : mode == 1 ? "drain 100 ms"
				   : "no drain",
		       took / 1000000, cancelled, st.store.inflight_out, st.store.parked_records,
		       x->n, x->excluded, h.final.records_written, h.final.records_left);
	hel_engine_destroy(e);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&core));
	setenv("SELENE_DISK_IO", "pread", 1);
	slow_ops = eos_fileops_libc;
	slow_ops.pwrite = slow_pwrite;
	eos_fileops_set(&slow_ops);
	char *dir = test_mkdtemp("engine-shutdown");
	int cycles = test_soak() ? 200 : 6;
	struct expect x = {0};
	uint64_t max_stop = 0;
	for (int i = 0; i < cycles; i++)
		cycle(i, dir, &x, &max_stop);
	/* A last start checks the last stop. */
	struct holder h = {0};
	hel_engine_config c = {.core = core,
			       .max_active = 4,
			       .gpu_pages = 96,
			       .gpu_rows = 48,
			       .memory_bytes = 768 << 10,
			       .disk_dir = dir,
			       .disk_limit = 64 << 20,
			       .disk_limit_set = true,
			       .store_open = open_real,
			       .store_ctx = &h};
	hel_engine *e;
	CHECK_OK(hel_engine_open(&c, &e));
	for (size_t k = 0; k < x.n; k++) {
		struct sel_disk_record_info ri;
		CHECK(sel_disk_store_record(sel_composite_store_disk(h.s), &x.k[k], &ri) == 0 &&
		      ri.file);
	}
	CHECK_OK(hel_engine_stop(e, 0));
	hel_engine_destroy(e);
	eos_fileops_set(NULL);
	printf("%d cycles, longest stop %" PRIu64 " ms\n", cycles, max_stop / 1000000);
	free(x.k);
	test_rmtree(dir);
	free(dir);
	hel_core_free(core);
	printf("ok\n");
	return 0;
}
