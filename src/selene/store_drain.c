/*
 * store_drain.c - the composite's shutdown drain: the parked (DRAM-only)
 * records written to disk at close (design 2.5 "Drain on shutdown"
 * --prefix-cache-drain-on-shutdown; 2.8 the stop; 2.12 the subset
 * invariant across a restart).
 *
 * DESIGN
 *
 * Close: first the accepted transfers (puts land and park, reads through
 * finish, maintenance writes end).  Then, with drain_on_shutdown, the
 * drain (design 2.5): a plan of the parked records -- those a committed
 * file links under first (its file needs them at the next start), then
 * the rest, each group most recently used first, which puts every
 * record after its parked ancestors (a parent is always more recent than
 * its children in the access order) -- is written in order, at most four
 * records and 2 x intake slots ahead; a record whose parked ancestor did not start is
 * skipped, an uncharged one is charged only if the limit has room
 * without evicting (committed files are preserved).  New writes stop at
 * drain_ns and at the close deadline; started ones finish.  ENOSPC and
 * EDQUOT send a record back to the park for up to three more passes
 * (100, 200, 400 ms apart); other errors drop it.  Nothing of this fails
 * the close.  Without the drain, drain_progress hears once, at close, how
 * many DRAM-only records (and bytes) the stop loses, when it loses any
 * (sel_drain_progress.off).  drain_progress hears of it about once a second and once at
 * the end.  Then both stores close (their transfers drain before memory
 * is released); if either cannot drain, the pool is leaked.
 *
 * The drain writes through the composite's own maintenance writes
 * (cs_write_start, the written hook), so a write it starts is an ordinary
 * WRITING record of the state table; it only counts them
 * (cs_drain_write_done) while it runs.
 *
 * INVARIANTS
 *
 *   1. in_flight counts the drain's writes started and not ended, and is
 *      at most DRAIN_WRITES while more than one record is in flight.
 *   2. No committed file is evicted for a drain write (charge_free).
 *   3. Exactly one final report, when drain_progress is set.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "store_composite_int.h"

#define DRAIN_WRITES 4  /* drain writes in flight at most: the time limit's overrun */
#define DRAIN_RETRIES 3 /* drain passes after a full filesystem */
#define DRAIN_BACKOFF_NS (100ull * 1000000) /* before the first; doubling, at most 400 ms */

void cs_drain_write_done(struct comp_store *cs, const struct cwrite *w, int status)
{
	struct cdrain *d = &cs->dr;
	if (d->in_flight)
		d->in_flight--;
	if (status == 0) {
		d->written++;
		d->written_bytes += w->bytes;
	} else if (status != -ENOSPC && status != -EDQUOT) {
		d->failed++;
	} else {
		d->retried++;
		d->no_space = true;
	}
}

struct dcand {
	sel_key key;
	uint64_t tick;
	bool protects; /* a committed file links under it */
};

static int by_drain_order(const void *a, const void *b)
{
	const struct dcand *x = a, *y = b;
	if (x->protects != y->protects)
		return x->protects ? -1 : 1;
	return x->tick < y->tick ? 1 : x->tick > y->tick ? -1 : 0; /* most recent first */
}

/* The write order: first the parked records committed files link under
 * (their files need them at the next start), then the rest; within each,
 * most recently used first.  A parent is always more recent than its
 * children in the access order (index invariant 5), so every record comes
 * after its parked ancestors. */
static int drain_plan(struct comp_store *cs)
{
	struct cdrain *d = &cs->dr;
	sel_stats ds;
	sel_store_stats(cs->disk, &ds);
	size_t cap = ds.parked_records, n = 0;
	struct dcand *c = malloc((cap ? cap : 1) * sizeof(*c));
	if (!c)
		return -ENOMEM;
	sel_key k = {0};
	while (n < cap && sel_disk_store_next_parked(cs->disk, &k) == 1) {
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, &k, &di) != 0)
			continue;
		c[n++] = (struct dcand){.key = k, .tick = di.tick};
	}
	/* Mark the parked chains above committed files. */
	size_t nk = sel_disk_store_keys(cs->disk, NULL, 0);
	sel_key *all = malloc((nk ? nk : 1) * sizeof(*all));
	if (all) {
		nk = sel_disk_store_keys(cs->disk, all, nk);
		for (size_t i = 0; i < nk; i++) {
			struct sel_disk_record_info di, pi;
			if (sel_disk_store_record(cs->disk, &all[i], &di) != 0 || !di.file ||
			    di.is_root)
				continue;
			for (sel_key p = di.parent;
			     sel_disk_store_record(cs->disk, &p, &pi) == 0 && pi.parked;
			     p = pi.parent) {
				for (size_t j = 0; j < n; j++)
					if (sel_key_eq(&c[j].key, &p))
						c[j].protects = true;
				if (pi.is_root)
					break;
			}
		}
		free(all);
	}
	qsort(c, n, sizeof(*c), by_drain_order);
	d->plan = malloc((n ? n : 1) * sizeof(sel_key));
	if (!d->plan) {
		free(c);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		d->plan[i] = c[i].key;
	d->n = n;
	d->next = 0;
	free(c);
	return 0;
}

/* Whether every parked ancestor of key has a write started (so key's file
 * will link under files, not under DRAM-only records). */
static bool ancestors_started(struct comp_store *cs, const struct sel_disk_record_info *di)
{
	struct sel_disk_record_info pi;
	if (di->is_root)
		return true;
	for (sel_key p = di->parent; sel_disk_store_record(cs->disk, &p, &pi) == 0; p = pi.parent) {
		if (pi.parked && !pi.writing)
			return false;
		if (pi.is_root)
			break;
	}
	return true;
}

/* Start plan writes while the time limit and the write-ahead bound allow:
 * at most DRAIN_WRITES records and 2 x intake slots in flight (one record
 * at a time above that), so the limit is overrun by a few writes at most. */
static void drain_step(struct comp_store *cs, uint64_t deadline_ns)
{
	struct cdrain *d = &cs->dr;
	uint64_t now = eos_now_ns();
	if (now < d->resume_ns)
		return;
	while (d->next < d->n) {
		if (d->end_ns && now >= d->end_ns) {
			d->time_up = true;
			return;
		}
		if (deadline_ns && now >= deadline_ns) {
			d->deadline_hit = true;
			return;
		}
		if (cs->writes.head &&
		    (cs->writing_slots >= 2 * cs->intake || d->in_flight >= DRAIN_WRITES))
			return;
		const sel_key *k = &d->plan[d->next++];
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, k, &di) != 0 || !di.parked || di.writing ||
		    di.doomed)
			continue; /* gone, written, or being written */
		if (!di.charged && sel_disk_store_charge_free(cs->disk, k) != 0) {
			d->no_room = true; /* committed files are not evicted for it */
			continue;
		}
		if (!ancestors_started(cs, &di))
			continue; /* its file would not link: not saved */
		if (cs_write_start(cs, k) != 0)
			d->failed++;
		else
			d->in_flight++;
	}
	/* The plan is done.  Records a full filesystem sent back to the park
	 * get another pass after the backoff, a few times. */
	if (!cs->writes.head && d->retries_left && d->retried) {
		bool again = false;
		sel_key k = {0};
		while (!again && sel_disk_store_next_parked(cs->disk, &k) == 1) {
			struct sel_disk_record_info di;
			again = sel_disk_store_record(cs->disk, &k, &di) == 0 && di.charged &&
				!di.writing;
		}
		d->retried = 0;
		if (again) {
			uint32_t k = DRAIN_RETRIES - (uint32_t)d->retries_left;
			d->resume_ns = now + (DRAIN_BACKOFF_NS << (k < 2 ? k : 2));
			d->retries_left--;
			d->next = 0;
		}
	}
}

/* The parked (DRAM-only) records no write has started for, and their bytes. */
static void parked_left(struct comp_store *cs, uint64_t *records, uint64_t *bytes)
{
	sel_key k = {0};
	while (sel_disk_store_next_parked(cs->disk, &k) == 1) {
		struct sel_disk_record_info di;
		if (sel_disk_store_record(cs->disk, &k, &di) == 0 && !di.writing) {
			(*records)++;
			*bytes += di.bytes;
		}
	}
}

static void drain_report(struct comp_store *cs, bool final, bool stopped)
{
	struct cdrain *d = &cs->dr;
	if (!cs->drain_cb)
		return;
	uint64_t now = eos_now_ns();
	sel_drain_progress p = {.final = final};
	p.elapsed_ns = now - d->start_ns;
	p.records_written = d->written;
	p.bytes_written = d->written_bytes;
	for (const struct cwrite *w = cs->writes.head; w; w = w->next) {
		p.records_writing++;
		p.bytes_writing += w->bytes;
	}
	parked_left(cs, &p.records_left, &p.bytes_left);
	p.rate_bps = p.elapsed_ns
			     ? (uint64_t)((double)d->written_bytes * 1e9 / (double)p.elapsed_ns)
			     : 0;
	p.failed = d->failed;
	p.why = "";
	if (final && (p.records_left || d->failed))
		p.why = stopped                     ? "stopped"
			: d->deadline_hit           ? "deadline"
			: d->time_up                ? "time limit"
			: d->no_room                ? "disk limit"
			: d->no_space && !d->failed ? "disk full"
						    : "write errors";
	cs->drain_cb(cs->drain_ctx, &p);
}

/* Without the drain on shutdown: say what a stop loses (the DRAM-only
 * records and their bytes), once, when it loses anything. */
void cs_report_not_drained(struct comp_store *cs)
{
	if (!cs->drain_cb)
		return;
	sel_drain_progress p = {.final = true, .off = true, .why = "drain off"};
	parked_left(cs, &p.records_left, &p.bytes_left);
	if (p.records_left)
		cs->drain_cb(cs->drain_ctx, &p);
}

/* Write the parked records to disk within the drain limit and the close
 * deadline; writes started finish (or the deadline passes). */
void cs_drain(struct comp_store *cs, uint64_t deadline_ns)
{
	struct cdrain *d = &cs->dr;
	memset(d, 0, sizeof(*d));
	d->start_ns = eos_now_ns();
	d->report_ns = d->start_ns + 1000000000ull;
	if (cs->drain_ns)
		d->end_ns = d->start_ns + cs->drain_ns;
	d->retries_left = DRAIN_RETRIES;
	cs->draining = true;
	cs->backoff_until = 0;
	if (drain_plan(cs) != 0)
		d->n = 0; /* out of memory: nothing drains, the rest closes */
	for (;;) {
		cs_step(cs);
		if (!cs->stopped)
			drain_step(cs, deadline_ns);
		/* Writes in flight, plan left to start, or a pass after a full
		 * filesystem's backoff. */
		bool retry = d->retried && d->retries_left;
		bool more = cs->writes.head || (!cs->stopped && !d->time_up && !d->deadline_hit &&
						(d->next < d->n || retry));
		if (!more || cs_past(deadline_ns)) {
			d->deadline_hit |= more;
			break;
		}
		if (eos_now_ns() >= d->report_ns) {
			drain_report(cs, false, false);
			d->report_ns += 1000000000ull;
		}
		sel_evq_nap(&cs->evq, 5);
	}
	cs_step(cs);
	drain_report(cs, true, cs->stopped);
	cs->draining = false;
	free(d->plan);
	d->plan = NULL;
}
