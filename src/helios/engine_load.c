/*
 * engine_load.c - a restore's pages and row loaded into the model for the
 * engine's worker (engine_load.h; engine.c fetch_event calls it).
 */
#include <pthread.h>
#include <unistd.h>

#include "helios/engine_load.h"

/* A restore's pages and row as the model loads them (model.h loading
 * rule), split over helper threads: the summaries read every restored
 * byte on the worker, and were two thirds of a 500 MiB memory restore
 * (bench/serve.py inbound, 32K prefix of Qwen TP1: 95 ms from the fetch
 * to its event, 185 ms more loading).  Smaller restores (below
 * hel_engine_config.load_split_bytes, HEL_LOAD_SPLIT_BYTES by default: a
 * thread's start is not worth it), and any when a rank is in another
 * process, the worker loads alone.  Each part is run by exactly one thread;
 * a part whose thread did not start runs on the worker. */
#define LOAD_THREADS 4

struct load_part {
	hel_model *m;
	const uint32_t *pages;
	uint32_t n, first, step, row; /* the row as well, when row_too */
	uint64_t consumed;
	bool row_too;
	int rc;
};

static void *load_part_run(void *arg)
{
	struct load_part *p = arg;
	if (p->row_too)
		p->rc = hel_model_row_loaded(p->m, p->row, p->consumed);
	for (uint32_t i = p->first; i < p->n && p->rc == 0; i += p->step)
		p->rc = hel_model_page_loaded(p->m, p->pages[i]);
	return NULL;
}

int hel_load_restored(hel_model *m, const uint32_t *pages, uint32_t n, uint32_t row,
		      uint64_t consumed, bool split)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t k = cpus < 1 ? 1 : cpus > LOAD_THREADS ? LOAD_THREADS : (uint32_t)cpus;
	struct load_part part[LOAD_THREADS];
	pthread_t th[LOAD_THREADS];
	uint32_t started = 1;
	if (split && k > 1 && hel_model_loads_concurrent(m)) {
		for (uint32_t i = 0; i < k; i++)
			part[i] = (struct load_part){.m = m,
						     .pages = pages,
						     .n = n,
						     .first = i,
						     .step = k,
						     .row = row,
						     .consumed = consumed,
						     .row_too = i == k - 1};
		for (; started < k; started++)
			if (pthread_create(&th[started], NULL, load_part_run, &part[started]))
				break;
		for (uint32_t i = started; i < k; i++)
			load_part_run(&part[i]); /* the shares of threads not started */
		load_part_run(&part[0]);
		for (uint32_t i = 1; i < started; i++)
			pthread_join(th[i], NULL);
		int rc = 0;
		for (uint32_t i = 0; i < k; i++)
			rc = rc ? rc : part[i].rc;
		if (rc == 0)
			return 0;
		/* Again on the worker: its error message is the one kept. */
	}
	int rc = 0;
	for (uint32_t i = 0; i < n && rc == 0; i++)
		rc = hel_model_page_loaded(m, pages[i]);
	return rc ? rc : hel_model_row_loaded(m, row, consumed);
}
