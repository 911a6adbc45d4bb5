/*
 * metrics.c - Prometheus text for GET /metrics (design 2.11 slot gauges,
 * 2.15 "Retention metrics", 2.7 scheduler stats, 4 "bytes per second from
 * store counters"; docs/metrics.md lists every name with its meaning).
 *
 * DESIGN
 * Every metric is written with # HELP and # TYPE once, followed by all its
 * samples, as the exposition format requires, so that `promtool check
 * metrics` accepts the page without a warning: counters end in _total and
 * nothing else does (the design's gauge flare_host_cache_slots_total is
 * flare_host_cache_slots_capacity here; docs/metrics.md maps the names),
 * and every help text says what is counted.  Tiers are labelled as the
 * design names them: dram (the memory store) and nvme (the disk store).
 * Labels take fixed values except flare_info's, which are escaped.
 * Latency histograms follow vLLM's (seconds, cumulative buckets from
 * 0.1 ms to 60 s, _sum and _count).
 *
 * Invariants:
 *   1. Each metric family appears exactly once, whatever the snapshot.
 *   2. The output depends only on the arguments (no clock, no globals).
 */
#include "flare/metrics.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static void family(struct flare_buf *b, const char *name, const char *type, const char *help)
{
	flare_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void val(struct flare_buf *b, const char *name, const char *labels, uint64_t v)
{
	if (labels)
		flare_buf_printf(b, "%s{%s} %" PRIu64 "\n", name, labels, v);
	else
		flare_buf_printf(b, "%s %" PRIu64 "\n", name, v);
}

static void one(struct flare_buf *b, const char *name, const char *type, const char *help,
		uint64_t v)
{
	family(b, name, type, help);
	val(b, name, NULL, v);
}

#define COUNTER(name, help, v) one(out, name, "counter", help, v)
#define GAUGE(name, help, v) one(out, name, "gauge", help, v)

/* A label value with \, " and newline escaped. */
static void label(struct flare_buf *b, const char *key, const char *v, bool comma)
{
	flare_buf_printf(b, "%s%s=\"", comma ? "," : "", key);
	for (const char *p = v ? v : ""; *p; p++) {
		if (*p == '\\')
			flare_buf_puts(b, "\\\\");
		else if (*p == '"')
			flare_buf_puts(b, "\\\"");
		else if (*p == '\n')
			flare_buf_puts(b, "\\n");
		else
			flare_buf_append(b, p, 1);
	}
	flare_buf_puts(b, "\"");
}

/* The local tiers, labelled by sel_tier_name() ("dram", "nvme"). */
static const sel_tier tiers[] = {SEL_TIER_MEMORY, SEL_TIER_DISK};
#define N_TIERS (sizeof tiers / sizeof tiers[0])

/* One family with a tier label: field is an offset into sel_tier_stats. */
static void per_tier(struct flare_buf *out, const sel_stats *s, const char *name, const char *type,
		     const char *help, size_t field)
{
	family(out, name, type, help);
	for (size_t i = 0; i < N_TIERS; i++) {
		uint64_t v;
		memcpy(&v, (const char *)&s->tier[tiers[i]] + field, sizeof v);
		char l[32];
		snprintf(l, sizeof l, "tier=\"%s\"", sel_tier_name(tiers[i]));
		val(out, name, l, v);
	}
}

#define TIER(name, type, help, field)                                                              \
	per_tier(out, s, name, type, help, offsetof(sel_tier_stats, field))

/* One histogram's samples (its family written by the caller), labels
 * ("tier=\"dram\"") or NULL, over the bounds it was observed in. */
static void hist_in(struct flare_buf *out, const char *name, const char *labels, const hel_hist *h,
		    const uint64_t *bounds)
{
	uint64_t cum = 0;
	for (size_t i = 0; i <= HEL_HIST_BUCKETS; i++) {
		cum += h->bucket[i];
		char le[32];
		if (i < HEL_HIST_BUCKETS)
			snprintf(le, sizeof le, "%g", (double)bounds[i] / 1e9);
		else
			snprintf(le, sizeof le, "+Inf");
		flare_buf_printf(out, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name,
				 labels ? labels : "", labels ? "," : "", le, cum);
	}
	flare_buf_printf(out, "%s_sum%s%s%s %" PRIu64 ".%09" PRIu64 "\n", name, labels ? "{" : "",
			 labels ? labels : "", labels ? "}" : "", h->sum_ns / 1000000000u,
			 h->sum_ns % 1000000000u);
	flare_buf_printf(out, "%s_count%s%s%s %" PRIu64 "\n", name, labels ? "{" : "",
			 labels ? labels : "", labels ? "}" : "", h->count);
}

static void hist_samples(struct flare_buf *out, const char *name, const char *labels,
			 const hel_hist *h)
{
	hist_in(out, name, labels, h, hel_hist_bounds_ns);
}

static void hist(struct flare_buf *out, const char *name, const char *help, const hel_hist *h)
{
	family(out, name, "histogram", help);
	hist_samples(out, name, NULL, h);
}

/* The store's pool and its disk tier's I/O path. */
static void store_pool_metrics(struct flare_buf *out, const sel_stats *s)
{
	char l[96];

	GAUGE("flare_host_cache_slots_in_use",
	      "Slots of the local host pool in use now, including row pieces and slots held by copies "
	      "in flight.",
	      s->slots_in_use);
	GAUGE("flare_host_cache_slots_capacity",
	      "Slots of the local host pool, intake included (design 2.11's flare_host_cache_slots_total).",
	      s->slots_total);
	GAUGE("flare_host_cache_intake_slots",
	      "Slots of the pool reserved for automatic intake (design 1).", s->intake_slots);
	family(out, "flare_host_cache_disk_io", "gauge",
	       "1 for the record I/O path the disk tier uses now (design 2.10 wants "
	       "io_uring+O_DIRECT); path=\"none\" 0 without a disk tier.");
	snprintf(l, sizeof l, "path=\"%s\"", s->disk_io ? s->disk_io : "none");
	val(out, "flare_host_cache_disk_io", l, s->disk_io ? 1 : 0);
	GAUGE("flare_host_cache_parked_records",
	      "DRAM-only records of a composite store now: complete in memory, their files not written "
	      "yet.",
	      s->parked_records);
}

/* What the store was asked and did: outcomes, lookups, fetches, copies. */
static void store_call_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	const sel_stats *s = &st->store;
	char l[96];

	family(out, "flare_host_cache_store_outcomes_total", "counter",
	       "Checkpoints offered to the store, by the outcome of the offer, and copies deferred after "
	       "it.");
	for (int o = 0; o <= SEL_SKIPPED; o++) {
		snprintf(l, sizeof l, "outcome=\"%s\"", sel_outcome_name((sel_outcome)o));
		val(out, "flare_host_cache_store_outcomes_total", l, s->outcomes[o]);
	}
	family(out, "flare_host_cache_store_retry_reasons_total", "counter",
	       "Offers answered retry or deferred, by cause (attempts, not checkpoints).");
	for (int r = 0; r < SEL_RETRY_REASONS; r++) {
		snprintf(l, sizeof l, "reason=\"%s\"", sel_retry_reason_name((sel_retry_reason)r));
		val(out, "flare_host_cache_store_retry_reasons_total", l, s->retry_reasons[r]);
	}
	COUNTER("flare_host_cache_store_lookups_total", "Lookups the store answered.", s->lookups);
	COUNTER("flare_host_cache_store_hits_total", "Store lookups that found a restorable chain.",
		s->hits);
	COUNTER("flare_host_cache_chains_rejected_total",
		"Lookup candidates passed over because a record on their chain has another key than "
		"the request's history gives (a forged or stale parent link).",
		s->chains_rejected);
	COUNTER("flare_host_cache_store_reused_tokens_total",
		"Tokens restored by the store's completed fetches.", s->reused_tokens);
	COUNTER("flare_host_cache_fetches_total", "Restores the store started.", s->fetches);
	COUNTER("flare_host_cache_fetch_failures_total", "Restores the store reported as failed.",
		s->fetch_failures);
	COUNTER("flare_host_cache_store_failures_total",
		"Copy-outs the store accepted that then failed.", s->store_failures);
	family(out, "flare_host_cache_transfers_in_flight", "gauge",
	       "Copy jobs submitted and not yet completed, by direction (out: GPU to host).");
	val(out, "flare_host_cache_transfers_in_flight", "direction=\"out\"", s->inflight_out);
	val(out, "flare_host_cache_transfers_in_flight", "direction=\"in\"", s->inflight_in);
	family(out, "flare_host_cache_record_stores_total", "counter",
	       "Records stored into a tier, by tier and by layout: replicated shares packed once, or "
	       "per rank (design 2.5; a read-through promotion counts as a new memory store).");
	for (size_t i = 0; i < N_TIERS; i++) {
		const sel_tier_stats *t = &s->tier[tiers[i]];
		snprintf(l, sizeof l, "tier=\"%s\",layout=\"packed\"", sel_tier_name(tiers[i]));
		val(out, "flare_host_cache_record_stores_total", l, t->stores_packed);
		snprintf(l, sizeof l, "tier=\"%s\",layout=\"per_rank\"", sel_tier_name(tiers[i]));
		val(out, "flare_host_cache_record_stores_total", l, t->stores_per_rank);
	}
	COUNTER("flare_host_cache_abandoned_stores_total",
		"Disk-only TP>1 stores abandoned because a later page window differed across ranks after "
		"the first window decided the pages were replicated (design 2.5).",
		s->abandoned_stores);
	COUNTER("flare_host_cache_evictions_noticed_total",
		"GPU evictions and compactions the store was told of.", s->evictions_noticed);
	COUNTER("flare_host_cache_evictions_lost_total",
		"Times the bounded eviction-notice queue overflowed, losing its oldest notices before the "
		"store was told of them.",
		st->evictions_lost);
	COUNTER("flare_host_cache_spilled_bytes_total",
		"Bytes a composite store wrote from its memory tier to its disk tier (part of "
		"bytes_out_total{tier=\"nvme\"}).",
		s->spilled_bytes);
	COUNTER("flare_host_cache_read_through_bytes_total",
		"Bytes a composite store read from its disk tier into its memory tier (part of "
		"bytes_in_total{tier=\"nvme\"}).",
		s->read_through_bytes);
}

/* Per tier: records, bytes, retention, the fitted estimates, restore times. */
static void store_tier_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	const sel_stats *s = &st->store;
	char l[96];

	TIER("flare_host_cache_records", "gauge",
	     "Records indexed in the tier now (nvme: includes reservations of DRAM-only records).",
	     records);
	TIER("flare_host_cache_bytes_used", "gauge", "Bytes the tier holds now.", bytes_used);
	TIER("flare_host_cache_bytes_limit", "gauge", "The tier's byte budget.", bytes_limit);
	TIER("flare_host_cache_bytes_in_total", "counter",
	     "Bytes read from the tier for restores (nvme: also a composite's read-through into memory).",
	     bytes_in);
	TIER("flare_host_cache_bytes_out_total", "counter",
	     "Bytes copied into the tier (dram: every landed copy, design 5; nvme: also a composite's "
	     "spills).",
	     bytes_out);
	TIER("flare_host_cache_held_total", "counter",
	     "Records the tier took in (a copy landed in memory, a file committed).", held);
	family(out, "flare_host_cache_dropped_total", "counter",
	       "Records discarded from the last local tier, by reason: end of the local chain, "
	       "oversize, terminal I/O error.");
	for (size_t i = 0; i < N_TIERS; i++) {
		const sel_tier_stats *t = &s->tier[tiers[i]];
		const struct {
			const char *reason;
			uint64_t v;
		} d[] = {{"end_of_chain", t->dropped_end_of_chain},
			 {"oversize", t->dropped_oversize},
			 {"io_error", t->dropped_io_error}};
		for (size_t k = 0; k < 3; k++) {
			snprintf(l, sizeof l, "tier=\"%s\",reason=\"%s\"", sel_tier_name(tiers[i]),
				 d[k].reason);
			val(out, "flare_host_cache_dropped_total", l, d[k].v);
		}
	}
	TIER("flare_host_cache_expired_total", "counter",
	     "Records removed for age (--prefix-cache-max-age).", expired);
	TIER("flare_host_cache_evicted_total", "counter", "Records evicted for room (not for age).",
	     evicted);
	TIER("flare_host_cache_compacted_total", "counter",
	     "Records whose row was dropped, keeping their pages.", compacted);
	TIER("flare_host_cache_corrupt_total", "counter",
	     "Records that failed checksum or header verification.", corrupt);
	TIER("flare_host_cache_transfer_rate_bytes_per_second", "gauge",
	     "Bandwidth fitted to the tier's recent restores (the fetch policy's estimate).",
	     rate_bps);
	family(out, "flare_host_cache_transfer_fixed_seconds", "gauge",
	       "Fixed cost per restore fitted to the tier's recent restores (the fetch policy's estimate).");
	for (size_t i = 0; i < N_TIERS; i++) {
		uint64_t ns = s->tier[tiers[i]].fixed_ns;
		flare_buf_printf(out,
				 "flare_host_cache_transfer_fixed_seconds{tier=\"%s\"} %" PRIu64
				 ".%06" PRIu64 "\n",
				 sel_tier_name(tiers[i]), ns / 1000000000u, ns / 1000u % 1000000u);
	}

	family(out, "flare_host_cache_restore_time_seconds", "histogram",
	       "Restores from a host tier, by tier: seconds from the fetch's start to its bytes "
	       "landing in the GPU cache.");
	for (size_t i = 0; i < N_TIERS; i++) {
		snprintf(l, sizeof l, "tier=\"%s\"", sel_tier_name(tiers[i]));
		hist_samples(out, "flare_host_cache_restore_time_seconds", l,
			     &st->restore_time[tiers[i]]);
	}
	family(out, "flare_host_cache_restore_summaries_total", "counter",
	       "Restored page and row shares (per rank) whose model summaries were computed on the "
	       "transfer threads as they landed (where=\"landed\") or on the worker afterwards "
	       "(where=\"worker\").");
	val(out, "flare_host_cache_restore_summaries_total", "kind=\"page\",where=\"landed\"",
	    st->landed_pages);
	val(out, "flare_host_cache_restore_summaries_total", "kind=\"page\",where=\"worker\"",
	    st->computed_pages);
	val(out, "flare_host_cache_restore_summaries_total", "kind=\"row\",where=\"landed\"",
	    st->landed_rows);
	val(out, "flare_host_cache_restore_summaries_total", "kind=\"row\",where=\"worker\"",
	    st->computed_rows);
}

/* Speculative decoding (issue 19, design 4 "speculative round time"): by
 * mode, both modes always present (the one the server does not run at 0). */
static void spec_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	static const sel_state_mode modes[] = {SEL_MODE_COPY, SEL_MODE_LEARNED};
	static const hel_hist none;
	static const struct {
		const char *name, *help;
		size_t field;
	} counters[] = {
		{"flare_spec_rounds_total",
		 "Speculative decoding rounds (a request's decode step: draft, verify, emit), by mode.",
		 offsetof(hel_engine_stats, spec_rounds)},
		{"flare_spec_proposed_tokens_total", "Tokens the draft proposed, by mode.",
		 offsetof(hel_engine_stats, spec_proposed)},
		{"flare_spec_accepted_tokens_total",
		 "Proposed tokens verification accepted (emitted), by mode.",
		 offsetof(hel_engine_stats, spec_accepted)},
		{"flare_spec_emitted_tokens_total",
		 "Tokens speculative rounds emitted: accepted proposals plus each round's own, by mode.",
		 offsetof(hel_engine_stats, spec_emitted)},
		{"flare_spec_history_rounds_total",
		 "Copy-mode rounds whose proposals came from the draft history (the rest fell back "
		 "to the draft head), by mode.",
		 offsetof(hel_engine_stats, spec_copied)},
	};
	char l[32];
	for (size_t c = 0; c < sizeof counters / sizeof counters[0]; c++) {
		family(out, counters[c].name, "counter", counters[c].help);
		for (size_t i = 0; i < 2; i++) {
			uint64_t v = 0;
			if (st->spec_mode == modes[i])
				memcpy(&v, (const char *)st + counters[c].field, sizeof v);
			snprintf(l, sizeof l, "mode=\"%s\"", sel_state_mode_name(modes[i]));
			val(out, counters[c].name, l, v);
		}
	}
	family(out, "flare_spec_acceptance_rate", "gauge",
	       "Accepted over proposed tokens since the start (0 before any proposal), by mode.");
	for (size_t i = 0; i < 2; i++) {
		bool on = st->spec_mode == modes[i] && st->spec_proposed;
		flare_buf_printf(out, "flare_spec_acceptance_rate{mode=\"%s\"} %.6f\n",
				 sel_state_mode_name(modes[i]),
				 on ? (double)st->spec_accepted / (double)st->spec_proposed : 0.0);
	}
	family(out, "flare_spec_tokens_per_round", "gauge",
	       "Tokens emitted per speculative round since the start (0 before any round), by mode.");
	for (size_t i = 0; i < 2; i++) {
		bool on = st->spec_mode == modes[i] && st->spec_rounds;
		flare_buf_printf(out, "flare_spec_tokens_per_round{mode=\"%s\"} %.6f\n",
				 sel_state_mode_name(modes[i]),
				 on ? (double)st->spec_emitted / (double)st->spec_rounds : 0.0);
	}
	family(out, "flare_spec_round_time_seconds", "histogram",
	       "Speculative rounds by the model's time for the round (draft and verification), by mode.");
	for (size_t i = 0; i < 2; i++) {
		snprintf(l, sizeof l, "mode=\"%s\"", sel_state_mode_name(modes[i]));
		hist_in(out, "flare_spec_round_time_seconds", l,
			st->spec_mode == modes[i] ? &st->spec_round_time : &none,
			hel_hist_fine_bounds_ns);
	}
}

/* One family's values by restore source: the arena, a neighbour's GPU
 * cache (neighbour counts every neighbour), its DRAM and its NVMe. */
static void pool_by_source(struct flare_buf *out, const char *name, uint64_t all,
			   uint64_t neighbour, const uint64_t host[2])
{
	val(out, name, "source=\"pool\"", all - neighbour);
	val(out, name, "source=\"neighbour\"", neighbour - host[0] - host[1]);
	val(out, name, "source=\"neighbour_memory\"", host[0]);
	val(out, name, "source=\"neighbour_disk\"", host[1]);
}

/* The pool (design 2.15 "Visible"): zero without --prefix-cache-pool. */
static void shared_pool_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	const sel_pool_counters *p = &st->store.pool;
	static const char *const states[] = {"off", "attached", "detached", "disabled"};
	char l[96];

	family(out, "flare_pool_client_state", "gauge",
	       "1 for the pool attachment now: off (no --prefix-cache-pool), attached, detached "
	       "(reattach follows) or disabled (local tiers only until a restart).");
	for (int i = 0; i < 4; i++) {
		snprintf(l, sizeof l, "state=\"%s\"", states[i]);
		val(out, "flare_pool_client_state", l, (int)p->state == i ? 1 : 0);
	}
	COUNTER("flare_pool_client_sessions_total", "Pool sessions opened (attach and reattaches).",
		p->sessions);
	COUNTER("flare_pool_client_detaches_total", "Pool connections lost.", p->detaches);
	COUNTER("flare_pool_lookups_total", "Pool lookups asked (tickets).", p->lookups);
	COUNTER("flare_pool_answers_total", "Pool lookups answered.", p->answers);
	COUNTER("flare_pool_late_answers_total",
		"Pool lookups answered after the 2 ms grace period.", p->late_answers);
	COUNTER("flare_pool_grace_expired_total",
		"Admissions that went on with the local tiers' answer when the grace period ended.",
		p->grace_expired);
	COUNTER("flare_pool_hits_total", "Pool lookups whose answer was the deepest prefix.",
		p->hits);
	COUNTER("flare_pool_claims_total", "Restores claimed from the pool.", p->claims);
	COUNTER("flare_pool_restores_total", "Restores from the pool that landed.", p->restores);
	family(out, "flare_pool_claims_failed_total", "counter",
	       "Pool restores that failed (the request recomputed), by reason.");
	for (int i = 0; i < SEL_POOL_FAILS; i++) {
		snprintf(l, sizeof l, "reason=\"%s\"", sel_pool_fail_name((sel_pool_fail)i));
		val(out, "flare_pool_claims_failed_total", l, p->claims_failed[i]);
	}
	family(out, "flare_pool_reused_tokens_total", "counter",
	       "Prompt tokens restored instead of computed, by source (pool: the manager's arena; "
	       "neighbour: another instance's GPU cache, neighbour_memory / neighbour_disk: its "
	       "host DRAM / NVMe tier, exported).");
	pool_by_source(out, "flare_pool_reused_tokens_total", p->reused_tokens, p->neighbour_tokens,
		       p->neighbour_host_tokens);
	family(out, "flare_pool_reused_bytes_total", "counter", "Bytes restored, by source.");
	pool_by_source(out, "flare_pool_reused_bytes_total", p->reused_bytes, p->neighbour_bytes,
		       p->neighbour_host_bytes);
	COUNTER("flare_pool_puts_total", "Checkpoints this instance asked the pool to take.",
		p->puts);
	COUNTER("flare_pool_puts_accepted_total", "Of them, committed or already present.",
		p->puts_accepted);
	COUNTER("flare_pool_puts_refused_total",
		"Of them, refused by the manager (no room, limits).", p->puts_refused);
	COUNTER("flare_pool_puts_failed_total", "Of them, failed (copy, lost session, commit).",
		p->puts_failed);
	COUNTER("flare_pool_put_bytes_total", "Bytes copied into the arena.", p->put_bytes);
	COUNTER("flare_pool_cascaded_total",
		"Local records the pool accepted at the end of the local chain (they left it).",
		p->cascaded);
	COUNTER("flare_pool_cascade_kept_total",
		"Local records kept local after a refused or failed cascade into the pool.",
		p->cascade_kept);
	COUNTER("flare_pool_neighbour_restores_total",
		"Restores from the pool whose bytes another instance exported (its GPU cache or its "
		"host tiers).",
		p->neighbour_restores);
	family(out, "flare_pool_host_holdings_announced_total", "counter",
	       "Host holdings (records of this instance's memory and disk tiers) announced, by "
	       "tier.");
	val(out, "flare_pool_host_holdings_announced_total", "tier=\"memory\"",
	    p->host_announced[0]);
	val(out, "flare_pool_host_holdings_announced_total", "tier=\"disk\"", p->host_announced[1]);
	family(out, "flare_pool_host_holdings_withdrawn_total", "counter",
	       "Host holdings withdrawn (the record left its tier), by tier.");
	val(out, "flare_pool_host_holdings_withdrawn_total", "tier=\"memory\"",
	    p->host_withdrawn[0]);
	val(out, "flare_pool_host_holdings_withdrawn_total", "tier=\"disk\"", p->host_withdrawn[1]);
	COUNTER("flare_pool_holdings_announced_total", "GPU holdings this instance announced.",
		p->announced);
	COUNTER("flare_pool_holdings_withdrawn_total",
		"GPU holdings withdrawn (eviction notices, the oldest beyond the table).",
		p->withdrawn);
	COUNTER("flare_pool_exports_served_total",
		"Exports this instance copied for a neighbour (from its GPU cache or host tiers).",
		p->exports_served);
	family(out, "flare_pool_exports_refused_total", "counter",
	       "Exports this instance refused or failed, by reason.");
	for (int i = 0; i < SEL_EXPORT_REFUSALS; i++) {
		snprintf(l, sizeof l, "reason=\"%s\"",
			 sel_export_refusal_name((sel_export_refusal)i));
		val(out, "flare_pool_exports_refused_total", l, p->exports_refused[i]);
	}
	COUNTER("flare_pool_export_bytes_total", "Bytes exported into the arena.", p->export_bytes);
	COUNTER("flare_pool_holdings_reannounced_total",
		"Times the GPU holdings were announced again after eviction notices were lost.",
		p->evictions_lost);
	COUNTER("flare_pool_local_fallbacks_total",
		"Failed pool restores that the local tiers' copy of the same endpoint took over.",
		p->local_fallbacks);
}

/* The remote tier on Redis (issue 16, docs/remote.md), only with one. */
static void remote_metrics(struct flare_buf *out, const sel_remote_tier_stats *r)
{
	if (!r->enabled)
		return;
	COUNTER("flare_remote_lookups_total", "Remote tier lookups submitted.", r->lookups);
	COUNTER("flare_remote_hits_total", "Remote lookups that found a restorable chain.",
		r->hits);
	COUNTER("flare_remote_lookups_late_total",
		"Remote answers that came after the grace period (admission went on without them).",
		r->lookups_late);
	COUNTER("flare_remote_bytes_in_total",
		"Bytes restored from the remote tier (pages and rows).", r->bytes_in);
	COUNTER("flare_remote_bytes_out_total",
		"Bytes written to the remote tier (window payload).", r->bytes_out);
	family(out, "flare_remote_puts_total", "counter",
	       "Background writes to the remote tier by result.");
	val(out, "flare_remote_puts_total", "result=\"stored\"", r->stored);
	val(out, "flare_remote_puts_total", "result=\"present\"", r->present);
	val(out, "flare_remote_puts_total", "result=\"failed\"", r->put_failures);
	COUNTER("flare_remote_skipped_total",
		"Background writes skipped: queue or slots full (never waited for).", r->skipped);
	GAUGE("flare_remote_writes_in_flight",
	      "Background writes copying out of the GPU or on their way to Redis.",
	      r->writes_in_flight);
	COUNTER("flare_remote_claims_total", "Remote restores started.", r->claims);
	COUNTER("flare_remote_claim_failures_total", "Remote restores that failed (recomputed).",
		r->claim_failures);
	COUNTER("flare_remote_auth_failures_total",
		"Remote values refused by their MAC or AEAD tag, or unauthenticated with a key.",
		r->auth_failures);
	COUNTER("flare_remote_corrupt_total",
		"Remote values or pages refused by checksum or structure.", r->corrupt);
	COUNTER("flare_remote_dropped_total", "Records deleted from Redis after such a refusal.",
		r->dropped);
	family(out, "flare_remote_redirects_total", "counter", "Redis Cluster redirects followed.");
	val(out, "flare_remote_redirects_total", "kind=\"moved\"", r->moved);
	val(out, "flare_remote_redirects_total", "kind=\"ask\"", r->ask);
	COUNTER("flare_remote_reconnects_total", "Connections to Redis made again after a loss.",
		r->reconnects);
	COUNTER("flare_remote_stalls_total", "Connections closed because Redis stopped answering.",
		r->stalls);
	GAUGE("flare_remote_connection_state", "0 connecting, 1 up, 2 degraded, 3 down.", r->state);
	GAUGE("flare_remote_nodes", "Redis nodes known.", r->nodes);
	GAUGE("flare_remote_nodes_up", "Redis nodes answering.", r->nodes_up);
	family(out, "flare_remote_grace_seconds", "gauge",
	       "Lookup grace period: four measured round trips, 2-250 ms.");
	flare_buf_printf(out, "flare_remote_grace_seconds %g\n", (double)r->grace_ns / 1e9);
	family(out, "flare_remote_round_trip_seconds", "histogram",
	       "Round trips of small commands to Redis (bucket i: 16 us * 2^i).");
	uint64_t cum = 0;
	for (int i = 0; i < SEL_REMOTE_RTT_BINS; i++) {
		cum += r->rtt_hist[i];
		if (i + 1 < SEL_REMOTE_RTT_BINS)
			flare_buf_printf(
				out,
				"flare_remote_round_trip_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
				16e-6 * (double)(1ull << i), cum);
	}
	flare_buf_printf(out, "flare_remote_round_trip_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n",
			 cum);
	flare_buf_printf(out, "flare_remote_round_trip_seconds_sum %" PRIu64 ".%09" PRIu64 "\n",
			 r->rtt_sum_ns / 1000000000u, r->rtt_sum_ns % 1000000000u);
	flare_buf_printf(out, "flare_remote_round_trip_seconds_count %" PRIu64 "\n", cum);
}

static void store_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	shared_pool_metrics(out, st);
	remote_metrics(out, &st->store.remote);
	store_pool_metrics(out, &st->store);
	store_call_metrics(out, st);
	store_tier_metrics(out, st);
}

static void request_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	/* Requests and tokens. */
	COUNTER("flare_requests_submitted_total", "Requests (choices) the engine accepted.",
		st->requests_submitted);
	COUNTER("flare_requests_finished_total",
		"Requests that finished with stop (end token or stop sequence) or length.",
		st->requests_finished);
	COUNTER("flare_requests_cancelled_total", "Requests cancelled: client gone or shutdown.",
		st->requests_cancelled);
	COUNTER("flare_requests_failed_total", "Requests that ended with an error.",
		st->requests_failed);
	GAUGE("flare_requests_pending", "Requests queued now, not yet admitted.", st->pending);
	GAUGE("flare_requests_active", "Requests admitted and running now.", st->active);
	COUNTER("flare_prompt_tokens_total", "Prompt tokens of admitted requests.",
		st->prompt_tokens);
	COUNTER("flare_completion_tokens_total", "Tokens generated, every request's.",
		st->completion_tokens);
	COUNTER("flare_prefill_launches_total", "Prefill chunks run.", st->prefill_launches);
	COUNTER("flare_prefill_tokens_total", "Prompt tokens computed in prefill (not reused).",
		st->prefill_tokens);
	COUNTER("flare_decode_tokens_total", "Tokens produced by decode steps.", st->decode_tokens);
	GAUGE("flare_prefill_rate_tokens_per_second",
	      "Measured prefill throughput, a recent average: the fetch policy's prefill rate.",
	      st->prefill_rate);
	COUNTER("flare_preemptions_total",
		"Decoding requests preempted for GPU pages (resumed later from their terminal).",
		st->preemptions);
	COUNTER("flare_branched_requests_total",
		"Requests admitted as branches of a sibling with the same prompt (the choices of an n > 1 "
		"request after the first: design 4's branching).",
		st->branched_requests);
	COUNTER("flare_branched_reused_tokens_total",
		"Prompt tokens those branched requests reused from the GPU cache.",
		st->branched_reused_tokens);
}

static void latency_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	/* Latencies, vLLM's set. */
	hist(out, "flare_time_to_first_token_seconds",
	     "Requests by seconds from submission to their first token.", &st->ttft);
	hist(out, "flare_time_per_output_token_seconds",
	     "Generated tokens after a request's first, by seconds since the token before.",
	     &st->tpot);
	hist(out, "flare_e2e_request_latency_seconds",
	     "Requests that finished (stop or length), by seconds from submission to the end.",
	     &st->e2e);
	hist(out, "flare_request_queue_time_seconds",
	     "Requests by seconds from submission to admission.", &st->queue_time);
	hist(out, "flare_request_prefill_time_seconds",
	     "Requests by seconds from admission to their first token (prefill, restores included).",
	     &st->prefill_time);
}

static void gpu_cache_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	/* The GPU checkpoint cache. */
	COUNTER("flare_gpu_cache_lookups_total", "GPU checkpoint cache lookups at admission.",
		st->gpu_lookups);
	COUNTER("flare_gpu_cache_hits_total", "GPU lookups that found a reusable checkpoint.",
		st->gpu_hits);
	COUNTER("flare_gpu_cache_reused_tokens_total", "Prompt tokens reused from GPU checkpoints.",
		st->gpu_reused_tokens);
	GAUGE("flare_gpu_cache_pages_free", "GPU pages free now.", st->gpu_pages_free);
	GAUGE("flare_gpu_cache_pages_capacity", "GPU pages in the cache's page planes.",
	      st->gpu_pages_total);
	GAUGE("flare_gpu_cache_rows_free", "GPU state rows free now.", st->gpu_rows_free);
	GAUGE("flare_gpu_cache_rows_capacity", "GPU state rows in the cache's row plane.",
	      st->gpu_rows_total);
	GAUGE("flare_gpu_cache_checkpoints", "Checkpoints in the GPU cache now.",
	      st->gpu_checkpoints);
	COUNTER("flare_gpu_cache_evictions_total", "GPU checkpoints evicted or compacted.",
		st->gpu_evictions);
}

static void host_cache_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	char l[96];

	/* The host prefix cache, as the scheduler sees it (design 2.7). */
	GAUGE("flare_host_cache_enabled",
	      "1 when a host store is configured and serving; 0 without one or after it stopped.",
	      st->store_enabled && !st->store_stopped ? 1 : 0);
	family(out, "flare_host_cache_stopped", "gauge",
	       "1 when the host store stopped for good (serving goes on without it), by reason; "
	       "reason=\"none\" 0 while it serves.");
	snprintf(l, sizeof l, "reason=\"%s\"",
		 st->store_stopped && st->store_stop_reason ? st->store_stop_reason : "none");
	val(out, "flare_host_cache_stopped", l, st->store_stopped ? 1 : 0);
	COUNTER("flare_host_cache_lookups_total", "Host store lookups made at admission.",
		st->host_lookups);
	COUNTER("flare_host_cache_hits_total", "Admissions that restored from a host tier.",
		st->host_hits);
	COUNTER("flare_host_cache_reused_tokens_total", "Prompt tokens restored from host tiers.",
		st->host_reused_tokens);
	GAUGE("flare_host_cache_inbound_waiting",
	      "Requests waiting for a restore now (Inbound phase).", st->inbound_waiting);
	COUNTER("flare_host_cache_fetch_declined_total",
		"Host hits recomputed instead: the policy judged prefill faster, or --prefix-cache-fetch never.",
		st->host_fetch_declined);
	COUNTER("flare_host_cache_lookups_held_total",
		"Admission passes that held a request for a pool or remote tier answer (its grace period).",
		st->host_lookups_held);
	COUNTER("flare_host_cache_late_retries_total",
		"Admitted requests readmitted for a late, deeper pool or remote answer before their prefill.",
		st->late_retries);
	COUNTER("flare_host_cache_restore_failures_total",
		"Restores that failed; their requests were recomputed.", st->host_fetch_failed);
	COUNTER("flare_host_cache_publications_total", "Checkpoints offered to the host store.",
		st->publications);
	GAUGE("flare_host_cache_store_retries_pending",
	      "Checkpoints waiting now to be offered again after a retry outcome.",
	      st->store_retries_pending);
	GAUGE("flare_host_cache_copyout_pins", "GPU checkpoints pinned now by queued copy-outs.",
	      st->copyout_pins);
	GAUGE("flare_host_cache_copyout_pin_limit",
	      "The most GPU checkpoints queued copy-outs may pin: max(1, rows / 4).",
	      st->copyout_pin_limit);
	COUNTER("flare_host_cache_copyout_pin_waits_total",
		"Puts not attempted because copy-outs held their share of the GPU cache "
		"(kept as unpinned retries, reason inflight).",
		st->copyout_pin_waits);
	family(out, "flare_host_cache_retry_abandoned_total", "counter",
	       "Retries given up because the GPU checkpoint disappeared, by the last retry cause.");
	for (int r = 0; r < SEL_RETRY_REASONS; r++) {
		snprintf(l, sizeof l, "reason=\"%s\"", sel_retry_reason_name((sel_retry_reason)r));
		val(out, "flare_host_cache_retry_abandoned_total", l, st->retry_abandoned[r]);
	}
}

static void process_metrics(struct flare_buf *out, const hel_engine_stats *st,
			    const struct flare_metrics_info *info)
{
	/* The model worker's loop: a caller that must see every publication
	 * offered and every copy-out reported waits for quiet (engine.h). */
	COUNTER("flare_worker_loops_total", "Iterations of the model worker's loop.", st->loops);
	GAUGE("flare_worker_quiet",
	      "1 when the worker's last iteration found nothing to do and it went to sleep.",
	      st->quiet ? 1 : 0);

	/* The process. */
	family(out, "flare_uptime_seconds", "gauge", "Seconds since the engine started.");
	flare_buf_printf(out, "flare_uptime_seconds %" PRIu64 ".%03" PRIu64 "\n",
			 (uint64_t)(st->uptime_ns / 1000000000u),
			 (uint64_t)(st->uptime_ns / 1000000u % 1000u));
	family(out, "flare_info", "gauge",
	       "Always 1; its labels name the served model and host store configuration.");
	flare_buf_puts(out, "flare_info{");
	label(out, "model", info ? info->model : "", false);
	label(out, "speculate", info ? info->mode : "", true);
	label(out, "store", info ? info->store : "", true);
	label(out, "transport", info ? info->transport : "", true);
	flare_buf_puts(out, "} 1\n");
	GAUGE("flare_host_cache_slot_bytes", "Bytes per host pool slot (one page record).",
	      info ? info->slot_bytes : 0);
}

static void http_metrics(struct flare_buf *out, const struct flare_http_stats *http)
{
	char l[96];

	/* The HTTP front end. */
	struct flare_http_stats none = {0};
	if (!http)
		http = &none;
	COUNTER("flare_http_requests_total", "HTTP requests answered.", http->requests);
	family(out, "flare_http_responses_total", "counter",
	       "HTTP responses sent, by status class.");
	for (int c = 2; c <= 5; c++) {
		snprintf(l, sizeof l, "code=\"%dxx\"", c);
		val(out, "flare_http_responses_total", l, http->responses[c]);
	}
	GAUGE("flare_http_streams_active", "Streamed (SSE) responses open now.",
	      http->streams_active);
	COUNTER("flare_http_client_disconnects_total",
		"Clients that went away before their request finished (the request was cancelled).",
		http->disconnects);
	GAUGE("flare_http_connections", "TCP connections open now.", http->connections);
	GAUGE("flare_http_buffered_request_bytes",
	      "Request body bytes held now while they arrive (bounded by --max-buffered-bytes).",
	      http->buffered_bytes);
	COUNTER("flare_http_buffer_refusals_total",
		"Requests refused with 503 because their body would pass --max-buffered-bytes.",
		http->buffer_refusals);
	COUNTER("flare_http_unauthorized_total",
		"Requests refused with 401 for a missing or wrong API key.", http->unauthorized);
}

/* Image inputs (docs/inputs.md, design 2.13): the memory and disk input
 * tiers, labelled like the checkpoint tiers ("dram", "nvme"). */
static void input_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	const hel_engine_input_stats *in = &st->inputs;
	const char *dram = "tier=\"dram\"", *nvme = "tier=\"nvme\"";
	COUNTER("flare_input_cache_lookups_total",
		"Image input lookups: a description per image of every request, prepared tensors "
		"per image past the reused checkpoint.",
		in->lookups);
	family(out, "flare_input_cache_hits_total", "counter",
	       "Image input lookups served by a tier (a preparation shared with a concurrent "
	       "request counts as dram), by tier.");
	val(out, "flare_input_cache_hits_total", dram, in->hits_memory);
	val(out, "flare_input_cache_hits_total", nvme, in->hits_disk);
	family(out, "flare_input_cache_bytes", "gauge",
	       "Bytes of CPU input records held (descriptions and prepared tensors), by tier.");
	val(out, "flare_input_cache_bytes", dram, in->bytes_memory);
	val(out, "flare_input_cache_bytes", nvme, in->bytes_disk);
	GAUGE("flare_input_cache_budget_bytes",
	      "The memory input tier's budget: one eighth of --prefix-cache-memory on a vision core.",
	      in->memory_budget);
	COUNTER("flare_input_decodes_total", "Images decoded by the preparation worker.",
		in->decodes);
	COUNTER("flare_input_preparations_total",
		"Images resized and patched into prepared tensors.", in->preparations);
	family(out, "flare_input_preparation_seconds_total", "counter",
	       "Time the preparation worker spent decoding and preparing images.");
	flare_buf_printf(out, "flare_input_preparation_seconds_total %.9f\n",
			 (double)(in->decode_ns + in->prepare_ns) / 1e9);
	family(out, "flare_input_preparation_saved_seconds_total", "counter",
	       "Decoding and preparation time input cache hits saved (each hit times the mean "
	       "time of built results).");
	flare_buf_printf(out, "flare_input_preparation_saved_seconds_total %.9f\n",
			 (double)in->saved_ns / 1e9);
	COUNTER("flare_input_covered_total",
		"Images a reused checkpoint covered: never prepared, never replayed.",
		in->images_covered);
	COUNTER("flare_input_reprepared_total",
		"Images a checkpoint covered that were prepared after all: a replay or a failed "
		"restore started before them.",
		in->images_reprepared);
	COUNTER("flare_input_failed_total", "Images that failed to decode (their request failed).",
		in->images_failed);
	COUNTER("flare_input_disk_invalid_total",
		".input files that failed verification: removed, a miss, rebuilt from the request.",
		in->disk_invalid);
	GAUGE("flare_input_waiting_requests", "Requests waiting for their image inputs.",
	      in->waiting);
}

/* Overlapped restores (issue 18; engine_overlap.c). */
static void overlap_metrics(struct flare_buf *out, const hel_engine_stats *st)
{
	COUNTER("flare_host_cache_overlapped_restores_total",
		"Host hits restored overlapped: the head recomputed while the tail loaded.",
		st->overlap_restores);
	COUNTER("flare_host_cache_overlapped_completed_total",
		"Overlapped restores whose head and tail both completed and matched.",
		st->overlap_done);
	COUNTER("flare_host_cache_overlap_head_tokens_total",
		"Tokens recomputed as the heads of overlapped restores.", st->overlap_head_tokens);
	COUNTER("flare_host_cache_overlap_mismatches_total",
		"Recomputed head pages that differed from the stored page: the record was dropped and the request recomputed.",
		st->overlap_mismatches);
}

void flare_metrics_format(struct flare_buf *out, const hel_engine_stats *st,
			  const struct flare_http_stats *http,
			  const struct flare_metrics_info *info)
{
	request_metrics(out, st);
	spec_metrics(out, st);
	latency_metrics(out, st);
	gpu_cache_metrics(out, st);
	host_cache_metrics(out, st);
	overlap_metrics(out, st);
	store_metrics(out, st);
	if (st->inputs.enabled)
		input_metrics(out, st);
	process_metrics(out, st, info);
	http_metrics(out, http);
}
