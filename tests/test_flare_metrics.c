/*
 * test_flare_metrics.c - formatting of an engine stats snapshot: the
 * Prometheus text of /metrics (src/flare/metrics.c, docs/metrics.md;
 * design 2.11, 2.15 "Retention metrics") and the dashboard line
 * (src/flare/dashboard.c).
 *
 * Every field of hel_engine_stats and of its sel_stats gets a distinct
 * value, so a field exported under the wrong name or not at all shows.
 * Then the retention families (design 2.15) from real stores, with their
 * meaning: held counts holding events per tier; dropped counts what left
 * the last local tier (end_of_chain: disk evictions in a composite, memory
 * evictions in a memory store alone; a composite's memory evictions are
 * not drops), oversize and terminal I/O losses; expired counts age
 * removals in each tier; parked_records is the DRAM-only gauge.
 */
#include "flare/dashboard.h"
#include "flare/metrics.h"
#include "flare_testlib.h"
#include "store_composite.h"
#include "storefx.h"

static void fill(hel_engine_stats *st)
{
	memset(st, 0, sizeof *st);
	uint64_t v = 1000;
	st->requests_submitted = v++;
	st->requests_finished = v++;
	st->requests_cancelled = v++;
	st->requests_failed = v++;
	st->pending = v++;
	st->active = v++;
	st->inbound_waiting = v++;
	st->prompt_tokens = v++;
	st->completion_tokens = v++;
	st->prefill_launches = v++;
	st->prefill_tokens = v++;
	st->decode_tokens = v++;
	st->gpu_lookups = v++;
	st->gpu_hits = v++;
	st->gpu_reused_tokens = v++;
	st->host_lookups = v++;
	st->host_hits = v++;
	st->host_reused_tokens = v++;
	st->host_fetch_declined = v++;
	st->host_fetch_failed = v++;
	st->gpu_pages_free = v++;
	st->gpu_pages_total = v++;
	st->gpu_rows_free = v++;
	st->gpu_rows_total = v++;
	st->gpu_checkpoints = v++;
	st->gpu_evictions = v++;
	st->preemptions = v++;
	st->prefill_rate = v++;
	st->publications = v++;
	st->store_retries_pending = v++;
	st->copyout_pins = v++;
	st->copyout_pin_limit = v++;
	st->copyout_pin_waits = v++;
	for (int r = 0; r < SEL_RETRY_REASONS; r++)
		st->retry_abandoned[r] = v++;
	st->evictions_lost = v++;
	st->branched_requests = v++;
	st->branched_reused_tokens = v++;
	st->spec_mode = SEL_MODE_LEARNED;
	st->spec_rounds = v++;
	st->spec_proposed = 4 * st->spec_rounds;
	st->spec_accepted = v++;
	st->spec_emitted = v++;
	st->spec_copied = v++;
	hel_hist *hs[] = {&st->queue_time,
			  &st->prefill_time,
			  &st->ttft,
			  &st->tpot,
			  &st->e2e,
			  &st->restore_time[SEL_TIER_MEMORY],
			  &st->restore_time[SEL_TIER_DISK],
			  &st->spec_round_time};
	for (size_t h = 0; h < sizeof hs / sizeof hs[0]; h++)
		for (size_t i = 0; i <= HEL_HIST_BUCKETS; i++)
			hs[h]->bucket[i] = v++;
	st->store_enabled = true;
	sel_stats *s = &st->store;
	s->slots_in_use = v++;
	s->slots_total = v++;
	s->intake_slots = v++;
	s->parked_records = v++;
	for (int o = 0; o <= SEL_SKIPPED; o++)
		s->outcomes[o] = v++;
	for (int r = 0; r < SEL_RETRY_REASONS; r++)
		s->retry_reasons[r] = v++;
	s->lookups = v++;
	s->hits = v++;
	s->reused_tokens = v++;
	s->fetches = v++;
	s->fetch_failures = v++;
	s->store_failures = v++;
	s->inflight_out = v++;
	s->inflight_in = v++;
	s->packed_records = v++;
	s->per_rank_records = v++;
	s->abandoned_stores = v++;
	s->spilled_bytes = v++;
	s->read_through_bytes = v++;
	s->evictions_noticed = v++;
	for (int t = 0; t < SEL_TIERS; t++) {
		sel_tier_stats *ts = &s->tier[t];
		ts->records = v++;
		ts->bytes_used = v++;
		ts->bytes_limit = v++;
		ts->bytes_in = v++;
		ts->bytes_out = v++;
		ts->held = v++;
		ts->dropped_end_of_chain = v++;
		ts->dropped_oversize = v++;
		ts->dropped_io_error = v++;
		ts->expired = v++;
		ts->evicted = v++;
		ts->compacted = v++;
		ts->corrupt = v++;
		ts->rate_bps = v++;
		ts->stores_packed = v++;
		ts->stores_per_rank = v++;
		ts->fixed_ns = 1234567890ull * v++; /* seconds with a fraction */
	}
	st->uptime_ns = 12345678901ull;
}

#define EXPECT(sample, want)                                                                       \
	do {                                                                                       \
		double got_ = prom_value(text, sample);                                            \
		CHECKF(got_ == (double)(want), "%s = %.0f, want %llu", sample, got_,               \
		       (unsigned long long)(want));                                                \
	} while (0)

static void test_format(void)
{
	hel_engine_stats st;
	fill(&st);
	struct flare_http_stats http = {.requests = 77,
					.responses = {0, 0, 70, 0, 5, 2},
					.streams_active = 3,
					.disconnects = 4};
	struct flare_metrics_info info = {.model = "ti\"ny",
					  .mode = "copy",
					  .store = "composite",
					  .transport = "host",
					  .slot_bytes = 8704};
	struct flare_buf b = {0};
	flare_metrics_format(&b, &st, &http, &info);
	CHECK(!flare_buf_failed(&b));
	const char *text = b.data;
	prom_check(text);

	EXPECT("flare_requests_submitted_total", st.requests_submitted);
	EXPECT("flare_requests_finished_total", st.requests_finished);
	EXPECT("flare_requests_cancelled_total", st.requests_cancelled);
	EXPECT("flare_requests_failed_total", st.requests_failed);
	EXPECT("flare_requests_pending", st.pending);
	EXPECT("flare_requests_active", st.active);
	EXPECT("flare_host_cache_inbound_waiting", st.inbound_waiting);
	EXPECT("flare_prompt_tokens_total", st.prompt_tokens);
	EXPECT("flare_completion_tokens_total", st.completion_tokens);
	EXPECT("flare_prefill_launches_total", st.prefill_launches);
	EXPECT("flare_prefill_tokens_total", st.prefill_tokens);
	EXPECT("flare_decode_tokens_total", st.decode_tokens);
	EXPECT("flare_prefill_rate_tokens_per_second", st.prefill_rate);
	EXPECT("flare_preemptions_total", st.preemptions);
	EXPECT("flare_gpu_cache_lookups_total", st.gpu_lookups);
	EXPECT("flare_gpu_cache_hits_total", st.gpu_hits);
	EXPECT("flare_gpu_cache_reused_tokens_total", st.gpu_reused_tokens);
	EXPECT("flare_host_cache_lookups_total", st.host_lookups);
	EXPECT("flare_host_cache_hits_total", st.host_hits);
	EXPECT("flare_host_cache_reused_tokens_total", st.host_reused_tokens);
	EXPECT("flare_host_cache_fetch_declined_total", st.host_fetch_declined);
	EXPECT("flare_host_cache_restore_failures_total", st.host_fetch_failed);
	EXPECT("flare_gpu_cache_pages_free", st.gpu_pages_free);
	EXPECT("flare_gpu_cache_pages_capacity", st.gpu_pages_total);
	EXPECT("flare_gpu_cache_rows_free", st.gpu_rows_free);
	EXPECT("flare_gpu_cache_rows_capacity", st.gpu_rows_total);
	EXPECT("flare_gpu_cache_checkpoints", st.gpu_checkpoints);
	EXPECT("flare_gpu_cache_evictions_total", st.gpu_evictions);
	EXPECT("flare_host_cache_publications_total", st.publications);
	EXPECT("flare_host_cache_store_retries_pending", st.store_retries_pending);
	EXPECT("flare_host_cache_copyout_pins", st.copyout_pins);
	EXPECT("flare_host_cache_copyout_pin_limit", st.copyout_pin_limit);
	EXPECT("flare_host_cache_copyout_pin_waits_total", st.copyout_pin_waits);
	EXPECT("flare_host_cache_enabled", 1);
	const char *reasons[] = {"none", "inflight", "slabs", "queue", "budget"};
	char name[160];
	for (int r = 0; r < SEL_RETRY_REASONS; r++) {
		snprintf(name, sizeof name, "flare_host_cache_retry_abandoned_total{reason=\"%s\"}",
			 reasons[r]);
		EXPECT(name, st.retry_abandoned[r]);
		snprintf(name, sizeof name,
			 "flare_host_cache_store_retry_reasons_total{reason=\"%s\"}", reasons[r]);
		EXPECT(name, st.store.retry_reasons[r]);
	}

	const sel_stats *s = &st.store;
	EXPECT("flare_host_cache_slots_in_use", s->slots_in_use);
	EXPECT("flare_host_cache_slots_capacity", s->slots_total);
	EXPECT("flare_host_cache_intake_slots", s->intake_slots);
	EXPECT("flare_host_cache_parked_records", s->parked_records);
	const char *outcomes[] = {"queued", "present", "deferred", "retry", "oversize", "skipped"};
	for (int o = 0; o <= SEL_SKIPPED; o++) {
		snprintf(name, sizeof name, "flare_host_cache_store_outcomes_total{outcome=\"%s\"}",
			 outcomes[o]);
		EXPECT(name, s->outcomes[o]);
	}
	EXPECT("flare_host_cache_store_lookups_total", s->lookups);
	EXPECT("flare_host_cache_store_hits_total", s->hits);
	EXPECT("flare_host_cache_store_reused_tokens_total", s->reused_tokens);
	EXPECT("flare_host_cache_fetches_total", s->fetches);
	EXPECT("flare_host_cache_fetch_failures_total", s->fetch_failures);
	EXPECT("flare_host_cache_store_failures_total", s->store_failures);
	EXPECT("flare_host_cache_transfers_in_flight{direction=\"out\"}", s->inflight_out);
	EXPECT("flare_host_cache_transfers_in_flight{direction=\"in\"}", s->inflight_in);
	EXPECT("flare_host_cache_abandoned_stores_total", s->abandoned_stores);
	EXPECT("flare_host_cache_spilled_bytes_total", s->spilled_bytes);
	EXPECT("flare_host_cache_read_through_bytes_total", s->read_through_bytes);
	EXPECT("flare_host_cache_evictions_noticed_total", s->evictions_noticed);
	EXPECT("flare_host_cache_evictions_lost_total", st.evictions_lost);
	EXPECT("flare_branched_requests_total", st.branched_requests);
	EXPECT("flare_branched_reused_tokens_total", st.branched_reused_tokens);
	/* Speculative decoding, by mode: the engine's mode has its counts,
	 * the other zeros. */
	EXPECT("flare_spec_rounds_total{mode=\"learned\"}", st.spec_rounds);
	EXPECT("flare_spec_rounds_total{mode=\"copy\"}", 0);
	EXPECT("flare_spec_proposed_tokens_total{mode=\"learned\"}", st.spec_proposed);
	EXPECT("flare_spec_accepted_tokens_total{mode=\"learned\"}", st.spec_accepted);
	EXPECT("flare_spec_emitted_tokens_total{mode=\"learned\"}", st.spec_emitted);
	EXPECT("flare_spec_history_rounds_total{mode=\"learned\"}", st.spec_copied);
	EXPECT("flare_spec_accepted_tokens_total{mode=\"copy\"}", 0);
	char ratio[200];
	snprintf(ratio, sizeof ratio, "\nflare_spec_acceptance_rate{mode=\"learned\"} %.6f\n",
		 (double)st.spec_accepted / (double)st.spec_proposed);
	CHECKF(strstr(text, ratio), "no %s", ratio + 1);
	snprintf(ratio, sizeof ratio, "\nflare_spec_tokens_per_round{mode=\"learned\"} %.6f\n",
		 (double)st.spec_emitted / (double)st.spec_rounds);
	CHECKF(strstr(text, ratio), "no %s", ratio + 1);
	CHECK(strstr(text, "\nflare_spec_acceptance_rate{mode=\"copy\"} 0.000000\n"));
	CHECK(strstr(text, "\nflare_spec_round_time_seconds_count{mode=\"copy\"} 0\n"));
	{
		uint64_t cum = 0;
		char le[32];
		for (size_t i = 0; i <= HEL_HIST_BUCKETS; i++) {
			cum += st.spec_round_time.bucket[i];
			if (i == HEL_HIST_BUCKETS)
				snprintf(le, sizeof le, "+Inf");
			else
				snprintf(le, sizeof le, "%g",
					 (double)hel_hist_fine_bounds_ns[i] / 1e9);
			snprintf(name, sizeof name,
				 "flare_spec_round_time_seconds_bucket{mode=\"learned\",le=\"%s\"}",
				 le);
			EXPECT(name, cum);
		}
		CHECK(strstr(
			text,
			"flare_spec_round_time_seconds_bucket{mode=\"learned\",le=\"1e-05\"}"));
	}
	/* Histograms: cumulative buckets 0.1 ms .. 60 s, +Inf, _sum, _count. */
	const struct {
		const char *name, *labels;
		const hel_hist *h;
	} hists[] = {
		{"flare_time_to_first_token_seconds", "", &st.ttft},
		{"flare_time_per_output_token_seconds", "", &st.tpot},
		{"flare_e2e_request_latency_seconds", "", &st.e2e},
		{"flare_request_queue_time_seconds", "", &st.queue_time},
		{"flare_request_prefill_time_seconds", "", &st.prefill_time},
		{"flare_host_cache_restore_time_seconds", "tier=\"dram\",",
		 &st.restore_time[SEL_TIER_MEMORY]},
		{"flare_host_cache_restore_time_seconds", "tier=\"nvme\",",
		 &st.restore_time[SEL_TIER_DISK]},
	};
	for (size_t h = 0; h < sizeof hists / sizeof hists[0]; h++) {
		uint64_t cum = 0;
		for (size_t i = 0; i <= HEL_HIST_BUCKETS; i++) {
			cum += hists[h].h->bucket[i];
			char le[32];
			if (i == HEL_HIST_BUCKETS)
				snprintf(le, sizeof le, "+Inf");
			else
				snprintf(le, sizeof le, "%g", (double)hel_hist_bounds_ns[i] / 1e9);
			snprintf(name, sizeof name, "%s_bucket{%sle=\"%s\"}", hists[h].name,
				 hists[h].labels, le);
			EXPECT(name, cum);
		}
	}
	CHECK(hel_hist_bounds_ns[0] == 100000ull &&
	      hel_hist_bounds_ns[HEL_HIST_BUCKETS - 1] == 60000000000ull);
	CHECK(strstr(text, "flare_time_to_first_token_seconds_bucket{le=\"0.0001\"}"));
	CHECK(strstr(text, "flare_time_to_first_token_seconds_bucket{le=\"60\"}"));

	const struct {
		sel_tier t;
		const char *name;
	} tiers[] = {{SEL_TIER_MEMORY, "dram"}, {SEL_TIER_DISK, "nvme"}};
	for (int i = 0; i < 2; i++) {
		const sel_tier_stats *t = &s->tier[tiers[i].t];
		const char *tn = tiers[i].name;
#define TIER(metric, field)                                                                        \
	do {                                                                                       \
		snprintf(name, sizeof name, metric "{tier=\"%s\"}", tn);                           \
		EXPECT(name, t->field);                                                            \
	} while (0)
		TIER("flare_host_cache_records", records);
		TIER("flare_host_cache_bytes_used", bytes_used);
		TIER("flare_host_cache_bytes_limit", bytes_limit);
		TIER("flare_host_cache_bytes_in_total", bytes_in);
		TIER("flare_host_cache_bytes_out_total", bytes_out);
		TIER("flare_host_cache_held_total", held);
		TIER("flare_host_cache_expired_total", expired);
		TIER("flare_host_cache_evicted_total", evicted);
		TIER("flare_host_cache_compacted_total", compacted);
		TIER("flare_host_cache_corrupt_total", corrupt);
		TIER("flare_host_cache_transfer_rate_bytes_per_second", rate_bps);
#undef TIER
		snprintf(name, sizeof name,
			 "flare_host_cache_record_stores_total{tier=\"%s\",layout=\"packed\"}", tn);
		EXPECT(name, t->stores_packed);
		snprintf(name, sizeof name,
			 "flare_host_cache_record_stores_total{tier=\"%s\",layout=\"per_rank\"}",
			 tn);
		EXPECT(name, t->stores_per_rank);
		char fixed[160];
		snprintf(fixed, sizeof fixed,
			 "\nflare_host_cache_transfer_fixed_seconds{tier=\"%s\"} %" PRIu64
			 ".%06" PRIu64 "\n",
			 tn, t->fixed_ns / 1000000000u, t->fixed_ns / 1000u % 1000000u);
		CHECKF(strstr(text, fixed), "no %s", fixed + 1);
		const char *why[] = {"end_of_chain", "oversize", "io_error"};
		uint64_t want[] = {t->dropped_end_of_chain, t->dropped_oversize,
				   t->dropped_io_error};
		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof name,
				 "flare_host_cache_dropped_total{tier=\"%s\",reason=\"%s\"}", tn,
				 why[k]);
			EXPECT(name, want[k]);
		}
	}
	/* The none and pool tiers are not exported. */
	CHECK(!strstr(text, "tier=\"pool\"") && !strstr(text, "tier=\"none\""));

	CHECK(strstr(text, "\nflare_uptime_seconds 12.345\n"));
	CHECK(strstr(text, "\nflare_info{model=\"ti\\\"ny\",speculate=\"copy\",store=\"composite\","
			   "transport=\"host\"} 1\n"));
	EXPECT("flare_host_cache_slot_bytes", 8704);
	EXPECT("flare_http_requests_total", 77);
	EXPECT("flare_http_responses_total{code=\"2xx\"}", 70);
	EXPECT("flare_http_responses_total{code=\"4xx\"}", 5);
	EXPECT("flare_http_responses_total{code=\"5xx\"}", 2);
	EXPECT("flare_http_streams_active", 3);
	EXPECT("flare_http_client_disconnects_total", 4);
	flare_buf_free(&b);

	/* An empty snapshot and no extras: every family still there, zeros. */
	hel_engine_stats zero;
	memset(&zero, 0, sizeof zero);
	flare_metrics_format(&b, &zero, NULL, NULL);
	text = b.data;
	prom_check(text);
	EXPECT("flare_host_cache_enabled", 0);
	EXPECT("flare_host_cache_dropped_total{tier=\"dram\",reason=\"oversize\"}", 0);
	EXPECT("flare_http_requests_total", 0);
	flare_buf_free(&b);
}

static void test_dashboard(void)
{
	hel_engine_stats a, c;
	memset(&a, 0, sizeof a);
	memset(&c, 0, sizeof c);
	c.active = 2;
	c.pending = 1;
	c.prefill_tokens = 12000;
	c.decode_tokens = 700;
	c.gpu_pages_total = 200;
	c.gpu_pages_free = 150;
	c.uptime_ns = 2000000000ull;
	char line[512];
	/* Store off. */
	flare_dashboard_line(line, sizeof line, NULL, &c, 0);
	CHECKF(!strcmp(line, "flare: 2 active, 1 pending | prefill 6.0k tok/s, decode 350 tok/s | "
			     "gpu cache 25% (50/200 pages) | host cache off"),
	       "%s", line);
	/* Store on, over a 2 s interval. */
	a = c;
	c.store_enabled = true;
	c.prefill_tokens += 200000;
	c.decode_tokens += 100;
	c.store.slots_in_use = 10;
	c.store.slots_total = 512;
	c.host_hits = 3;
	c.host_lookups = 4;
	c.store.tier[SEL_TIER_MEMORY].bytes_in =
		a.store.tier[SEL_TIER_MEMORY].bytes_in + (4u << 20);
	c.store.tier[SEL_TIER_DISK].bytes_out = 2u << 20;
	flare_dashboard_line(line, sizeof line, &a, &c, 2000000000ull);
	CHECKF(!strcmp(line, "flare: 2 active, 1 pending | prefill 100k tok/s, decode 50 tok/s | "
			     "gpu cache 25% (50/200 pages) | host 10/512 slots, hits 3/4 | "
			     "in 2 MiB/s, out 1 MiB/s"),
	       "%s", line);
	/* Counters that went backwards read as zero; a short buffer is cut. */
	flare_dashboard_line(line, sizeof line, &c, &a, 1000000000ull);
	CHECK(strstr(line, "prefill 0 tok/s, decode 0 tok/s"));
	/* A composite's read-through (disk to memory, then memory to the GPU)
	 * and its spills (memory to disk after the GPU copy) count once. */
	hel_engine_stats d = c;
	d.store.tier[SEL_TIER_DISK].bytes_in += 6u << 20;
	d.store.read_through_bytes += 6u << 20;
	d.store.tier[SEL_TIER_MEMORY].bytes_in += 6u << 20;
	d.store.tier[SEL_TIER_MEMORY].bytes_out += 4u << 20;
	d.store.tier[SEL_TIER_DISK].bytes_out += 4u << 20;
	d.store.spilled_bytes += 4u << 20;
	flare_dashboard_line(line, sizeof line, &c, &d, 2000000000ull);
	CHECKF(strstr(line, "in 3 MiB/s, out 2 MiB/s"), "%s", line);
	/* With a pool: its state and restores end the line. */
	d.store.pool.state = SEL_POOL_DOWN;
	d.store.pool.restores = 5;
	d.store.pool.neighbour_restores = 2;
	d.store.pool.exports_served = 1;
	flare_dashboard_line(line, sizeof line, &c, &d, 2000000000ull);
	CHECKF(strstr(line, "| pool detached, restores 5 (2 neighbour), exports 1"), "%s", line);
	char small[20];
	flare_dashboard_line(small, sizeof small, &a, &c, 1);
	CHECK(strlen(small) == sizeof small - 1);
}

/* ---- the retention families from real stores --------------------------------------------- */

static uint64_t now_s;
static uint64_t fake_clock(void) { return 1700000000ull * 1000000000ull + now_s * 1000000000ull; }

static double sample(sel_store *s, const char *name)
{
	hel_engine_stats st;
	memset(&st, 0, sizeof st);
	st.store_enabled = true;
	sel_store_stats(s, &st.store);
	struct flare_buf b = {0};
	flare_metrics_format(&b, &st, NULL, NULL);
	prom_check(b.data);
	double v = prom_value(b.data, name);
	flare_buf_free(&b);
	return v;
}

static void put_wait(sel_store *s, const sel_published *cp)
{
	sel_retry_reason why;
	sel_outcome o;
	uint64_t deadline = eos_now_ns() + 10000000000ull;
	while ((o = sel_store_put(s, cp, &why)) == SEL_RETRY) {
		CHECK(eos_now_ns() < deadline);
		sfx_pump(s, NULL, NULL);
	}
	CHECKF(o == SEL_QUEUED, "put: %s", sel_outcome_name(o));
	sel_event ev;
	sfx_wait_events(s, &ev, 1, NULL);
	CHECK(ev.type == SEL_EV_STORED);
}

/* Until the maintenance the last calls set off has finished. */
static void settle(sel_store *s) { (void)sfx_settle(s, NULL); }

static const uint64_t units2[] = {4096, 1000};

static void test_retention_composite(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 2048, 16);
	char *dir = test_mkdtemp("metrics-retention");
	sel_store_config cfg = sfx_config(&fx, false);
	cfg.memory_bytes = 600 * fx.slot_bytes;
	cfg.disk_dir = dir;
	cfg.disk_limit = 6ull << 20; /* about ten 64-page records */
	cfg.max_age_ns = 3600ull * 1000000000ull;
	cfg.clock_ns = fake_clock;
	now_s = 0;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	enum {
		N = 14
	};
	struct sfx_conv cv[N];
	for (int i = 0; i < N; i++) {
		sfx_conv_init(&fx, &cv[i], 10 + (uint64_t)i, 64 * 64 + 30, (uint32_t)(i * 66));
		sel_published cp = sfx_ckpt(&fx, &cv[i], 64 * 64, 0, 4, (uint64_t)i + 10);
		put_wait(s, &cp);
		settle(s);
	}
	sel_stats st;
	sel_store_stats(s, &st);
	struct sel_composite_gauges g;
	sel_composite_store_gauges(s, &g);
	/* Held: every landed memory copy; every committed file. */
	CHECK(sample(s, "flare_host_cache_held_total{tier=\"dram\"}") == (double)N - g.streamed);
	CHECK(sample(s, "flare_host_cache_held_total{tier=\"nvme\"}") ==
	      (double)(g.writes_done + g.streamed));
	/* Stores by tier: every landed memory copy, every committed file. */
	CHECK(sample(s, "flare_host_cache_record_stores_total{tier=\"dram\",layout=\"per_rank\"}") +
		      sample(s,
			     "flare_host_cache_record_stores_total{tier=\"dram\",layout=\"packed\"}") ==
	      (double)N - g.streamed);
	CHECK(sample(s, "flare_host_cache_record_stores_total{tier=\"nvme\",layout=\"per_rank\"}") +
		      sample(s,
			     "flare_host_cache_record_stores_total{tier=\"nvme\",layout=\"packed\"}") ==
	      (double)(g.writes_done + g.streamed));
	/* Spills from memory are in the disk tier's bytes out, so the dashboard
	 * takes them away (they left the GPU once, into memory). */
	double spilled = sample(s, "flare_host_cache_spilled_bytes_total");
	double nvme_out = sample(s, "flare_host_cache_bytes_out_total{tier=\"nvme\"}");
	CHECK(g.writes_done > 0 && spilled > 0 && spilled <= nvme_out);
	if (g.streamed == 0)
		CHECK(spilled == nvme_out);
	CHECK(spilled == (double)st.spilled_bytes);
	/* Memory evicted durable copies: not drops (the disk keeps them). */
	CHECK(st.tier[SEL_TIER_MEMORY].evicted > 0);
	CHECK(sample(s, "flare_host_cache_dropped_total{tier=\"dram\",reason=\"end_of_chain\"}") ==
	      0);
	/* The disk limit evicted committed records: the end of the chain. */
	double ev = sample(s, "flare_host_cache_evicted_total{tier=\"nvme\"}");
	CHECK(ev > 0 && sample(s, "flare_host_cache_dropped_total{tier=\"nvme\","
				  "reason=\"end_of_chain\"}") == ev);
	CHECK(sample(s, "flare_host_cache_parked_records") == (double)st.parked_records);
	/* A record the disk limit can never hold: oversize on nvme only. */
	struct sfx_conv big;
	sfx_conv_init(&fx, &big, 99, 13 * 64 * 64 + 10, 1000);
	sel_published cb = sfx_ckpt(&fx, &big, 13 * 64 * 64, 0, 5, 99);
	CHECK(sel_store_put(s, &cb, NULL) == SEL_OVERSIZE);
	CHECK(sample(s, "flare_host_cache_dropped_total{tier=\"nvme\",reason=\"oversize\"}") == 1);
	CHECK(sample(s, "flare_host_cache_dropped_total{tier=\"dram\",reason=\"oversize\"}") == 0);
	/* Two hours later every record has expired, in both tiers. */
	sel_store_stats(s, &st);
	uint64_t disk_n = st.tier[SEL_TIER_DISK].records, mem_n = st.tier[SEL_TIER_MEMORY].records;
	now_s = 7200;
	/* The sweep runs in a poll; what it removed is counted there. */
	SFX_UNTIL(s, NULL,
		  sample(s, "flare_host_cache_expired_total{tier=\"nvme\"}") >= (double)disk_n);
	settle(s);
	CHECK(disk_n <= 64 && mem_n > 0);
	CHECK(sample(s, "flare_host_cache_expired_total{tier=\"nvme\"}") == (double)disk_n);
	CHECK(sample(s, "flare_host_cache_expired_total{tier=\"dram\"}") == (double)mem_n);
	CHECK(sample(s, "flare_host_cache_parked_records") == 0);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	for (int i = 0; i < N; i++)
		sfx_conv_free(&cv[i]);
	sfx_conv_free(&big);
	test_rmtree(dir);
	free(dir);
	sfx_free(&fx);
}

/* A memory store alone is the last local tier: its evictions are drops. */
static void test_retention_memory(void)
{
	struct sfx fx;
	sfx_init(&fx, 1, 2, units2, 20000, 2048, 16);
	sel_store_config cfg = sfx_config(&fx, false);
	cfg.memory_bytes = 300 * fx.slot_bytes;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	struct sfx_conv cv[6];
	for (int i = 0; i < 6; i++) {
		sfx_conv_init(&fx, &cv[i], 30 + (uint64_t)i, 64 * 64 + 30, (uint32_t)(i * 66));
		sel_published cp = sfx_ckpt(&fx, &cv[i], 64 * 64, 0, 4, (uint64_t)i + 30);
		put_wait(s, &cp);
	}
	double ev = sample(s, "flare_host_cache_evicted_total{tier=\"dram\"}");
	CHECK(ev > 0 && sample(s, "flare_host_cache_dropped_total{tier=\"dram\","
				  "reason=\"end_of_chain\"}") == ev);
	CHECK(sample(s, "flare_host_cache_held_total{tier=\"dram\"}") == 6);
	/* A record the warm pool can never hold is dropped as oversize. */
	struct sfx_conv big;
	sfx_conv_init(&fx, &big, 99, 5 * 64 * 64 + 10, 1000);
	sel_published cb = sfx_ckpt(&fx, &big, 5 * 64 * 64, 0, 5, 99);
	CHECK(sel_store_put(s, &cb, NULL) == SEL_OVERSIZE);
	CHECK(sample(s, "flare_host_cache_dropped_total{tier=\"dram\",reason=\"oversize\"}") == 1);
	CHECK_OK(sel_store_close(s, 0));
	sel_store_destroy(s);
	for (int i = 0; i < 6; i++)
		sfx_conv_free(&cv[i]);
	sfx_conv_free(&big);
	sfx_free(&fx);
}

/* The input families appear only for a vision core, each with its own field. */
static void test_inputs(void)
{
	hel_engine_stats st;
	fill(&st);
	hel_engine_input_stats *in = &st.inputs;
	memset(in, 0, sizeof *in);
	in->enabled = true;
	in->lookups = 501;
	in->images_covered = 502;
	in->images_failed = 503;
	in->images_reprepared = 504;
	in->disk_invalid = 505;
	in->waiting = 506;
	struct flare_http_stats http = {0};
	struct flare_metrics_info info = {.model = "m", .store = "memory", .transport = "host"};
	struct flare_buf b = {0};
	flare_metrics_format(&b, &st, &http, &info);
	CHECK(!flare_buf_failed(&b));
	const char *text = b.data;
	prom_check(text);
	EXPECT("flare_input_cache_lookups_total", in->lookups);
	EXPECT("flare_input_covered_total", in->images_covered);
	EXPECT("flare_input_failed_total", in->images_failed);
	EXPECT("flare_input_reprepared_total", in->images_reprepared);
	EXPECT("flare_input_disk_invalid_total", in->disk_invalid);
	EXPECT("flare_input_waiting_requests", in->waiting);
	flare_buf_free(&b);

	in->enabled = false;
	flare_metrics_format(&b, &st, &http, &info);
	CHECK(!flare_buf_failed(&b) && !strstr(b.data, "flare_input_"));
	flare_buf_free(&b);
}

int main(void)
{
	test_format();
	test_inputs();
	test_retention_composite();
	test_retention_memory();
	test_dashboard();
	printf("ok\n");
	return 0;
}
