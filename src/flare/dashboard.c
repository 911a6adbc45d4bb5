/*
 * dashboard.c - the stderr status line (design 3.1 step 11, 2.11 slot
 * gauges).
 *
 *   flare: 2 active, 0 pending | prefill 1.2k tok/s, decode 356 tok/s |
 *   gpu cache 37% (2841/7710 pages) | host 120/512 slots, hits 14/20 |
 *   in 1.5 MiB/s, out 12 MiB/s
 *
 * (one line).  Rates are differences of cumulative counters over the
 * interval; a counter that went backwards (a restarted engine) reads as 0.
 * in and out are bytes restored to and copied from the GPU: a composite
 * store's spills and read-throughs between its tiers are not counted.
 */
#include "flare/dashboard.h"

#include <inttypes.h>
#include <stdio.h>

#include "eos.h"

static double rate(uint64_t now, uint64_t before, uint64_t ns)
{
	if (ns == 0 || now < before)
		return 0.0;
	return (double)(now - before) * 1e9 / (double)ns;
}

/* 950, 1.2k, 35k, 1.2M */
static const char *short_num(char *b, size_t cap, double v)
{
	if (v < 1000)
		snprintf(b, cap, "%.0f", v);
	else if (v < 10000)
		snprintf(b, cap, "%.1fk", v / 1000);
	else if (v < 1e6)
		snprintf(b, cap, "%.0fk", v / 1000);
	else
		snprintf(b, cap, "%.1fM", v / 1e6);
	return b;
}

/* Bytes between the GPU and the host tiers: a composite's moves between
 * its own tiers (read-through, spills) are in its disk tier's counters
 * too and would count twice. */
static uint64_t bytes_in(const hel_engine_stats *s)
{
	uint64_t t = 0;
	for (int i = 0; i < SEL_TIERS; i++)
		t += s->store.tier[i].bytes_in;
	return t >= s->store.read_through_bytes ? t - s->store.read_through_bytes : 0;
}

static uint64_t bytes_out(const hel_engine_stats *s)
{
	uint64_t t = 0;
	for (int i = 0; i < SEL_TIERS; i++)
		t += s->store.tier[i].bytes_out;
	return t >= s->store.spilled_bytes ? t - s->store.spilled_bytes : 0;
}

const char *flare_dashboard_line(char *buf, size_t cap, const hel_engine_stats *prev,
				 const hel_engine_stats *cur, uint64_t ns)
{
	static const hel_engine_stats zero;
	if (!prev) {
		prev = &zero;
		ns = cur->uptime_ns;
	}
	char pf[16], dc[16], in[24], out[24];
	short_num(pf, sizeof pf, rate(cur->prefill_tokens, prev->prefill_tokens, ns));
	short_num(dc, sizeof dc, rate(cur->decode_tokens, prev->decode_tokens, ns));
	uint64_t used = cur->gpu_pages_total >= cur->gpu_pages_free
				? cur->gpu_pages_total - cur->gpu_pages_free
				: 0;
	unsigned pct = cur->gpu_pages_total ? (unsigned)(used * 100 / cur->gpu_pages_total) : 0;
	int n = snprintf(buf, cap,
			 "flare: %" PRIu64 " active, %" PRIu64
			 " pending | prefill %s tok/s, decode %s "
			 "tok/s | gpu cache %u%% (%" PRIu64 "/%" PRIu64 " pages)",
			 cur->active, cur->pending, pf, dc, pct, used, cur->gpu_pages_total);
	if (n < 0 || (size_t)n >= cap)
		return buf;
	if (!cur->store_enabled) {
		snprintf(buf + n, cap - (size_t)n, " | host cache off");
		return buf;
	}
	eos_format_size((uint64_t)rate(bytes_in(cur), bytes_in(prev), ns), in, sizeof in);
	eos_format_size((uint64_t)rate(bytes_out(cur), bytes_out(prev), ns), out, sizeof out);
	int m = snprintf(buf + n, cap - (size_t)n,
			 " | host %" PRIu64 "/%" PRIu64 " slots, hits %" PRIu64 "/%" PRIu64
			 " | in %s/s, out %s/s",
			 cur->store.slots_in_use, cur->store.slots_total, cur->host_hits,
			 cur->host_lookups, in, out);
	const sel_pool_counters *pl = &cur->store.pool;
	static const char *const states[] = {"off", "attached", "detached", "disabled"};
	if (pl->state != SEL_POOL_OFF && m >= 0 && (size_t)n + (size_t)m < cap)
		snprintf(buf + n + m, cap - (size_t)n - (size_t)m,
			 " | pool %s, restores %" PRIu64 " (%" PRIu64
			 " neighbour), exports %" PRIu64,
			 (unsigned)pl->state < 4 ? states[pl->state] : "?", pl->restores,
			 pl->neighbour_restores, pl->exports_served);
	return buf;
}
