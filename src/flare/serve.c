/*
 * serve.c - the `flare run` command: orchestration (design 2.9 "Loader
 * integration", 2.11 "Configuration and defaults", 2.8 shutdown order;
 * docs/configuration.md).
 *
 * DESIGN
 * One function walks the life of the server: flags -> config file ->
 * precedence -> API key file -> core -> HTTP listening (503 "starting")
 * -> disk directory -> engine -> summary -> ready -> serve -> stop.  The
 * port is bound before the disk directory and the engine, so a busy port
 * fails at once, with nothing created and no minutes of model loading.  The engine comes from a factory (backend.h), so tests run
 * this whole path against a fake engine; `flare run` passes the real one.
 * The main thread does nothing while serving but wait for a signal with a
 * timeout, which is also the dashboard's tick.
 *
 * Shutdown order: new requests get 503; the engine stops, which cancels
 * running requests and delivers their on_done (so their responses go
 * out); the HTTP server closes; the engine is destroyed.  The engine's
 * deadline is the drain limit plus a grace of 30 s, or none for an
 * unlimited drain; the drain reports its progress on stderr about once a
 * second and ends with a line saying what it saved and what not.
 *
 * Invariants:
 *   1. Every failure before serving prints one line naming the flag, file
 *      or core at fault and returns 1 or 2; nothing is left running.
 *   2. The backend is destroyed only after the HTTP server stopped, so no
 *      HTTP thread calls into a destroyed engine.
 */
#include "flare/serve.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "eos.h"
#include "flare/cli.h"
#include "flare/config.h"
#include "flare/dashboard.h"
#include "flare/ranks_run.h"
#include "flare/server.h"
#include "helios/core.h"

#define STOP_GRACE_NS (30ull * 1000000000ull) /* engine stop, beyond a limited drain */
#define HTTP_GRACE_NS (5ull * 1000000000ull)  /* responses still going out */

const char *flare_disk_resolve(const struct flare_settings *s, char *note, size_t notelen)
{
	note[0] = '\0';
	if (!(s->set & (1ull << FLARE_OPT_DISK)) || !s->disk[0])
		return NULL;
	if ((s->set & (1ull << FLARE_OPT_DISK_LIMIT)) && s->disk_limit == 0) {
		snprintf(note, notelen, "--prefix-cache-disk-limit 0 selects no disk store");
		return NULL;
	}
	if (eos_mkdir_p(s->disk)) {
		snprintf(note, notelen, "'%s' is not usable: %s", s->disk, eos_errmsg());
		return NULL;
	}
	if (access(s->disk, W_OK | X_OK)) {
		snprintf(note, notelen, "'%s' is not writable: %s", s->disk, strerror(errno));
		return NULL;
	}
	/* access() says yes to root on a read-only mount: try a file. */
	char probe[FLARE_PATH_MAX + 32];
	snprintf(probe, sizeof probe, "%s/.flare-probe-XXXXXX", s->disk);
	int fd = mkstemp(probe);
	if (fd < 0) {
		snprintf(note, notelen, "'%s' is not writable: %s", s->disk, strerror(errno));
		return NULL;
	}
	close(fd);
	unlink(probe);
	return s->disk;
}

static const char *size_text(uint64_t v, char *b, size_t cap) { return eos_format_size(v, b, cap); }

const char *flare_duration_text(uint64_t ns, char *b, size_t cap)
{
	const uint64_t S = 1000000000ull;
	uint64_t ms = ns / 1000000 % 1000, sec = ns / S;
	size_t o = 0;
	b[0] = '\0';
	if (sec == 0) {
		snprintf(b, cap, "%" PRIu64 "ms", ms);
		return b;
	}
	uint64_t h = sec / 3600, m = sec / 60 % 60, x = sec % 60;
	if (h && o < cap)
		o += (size_t)snprintf(b + o, cap - o, "%" PRIu64 "h", h);
	if (m && o < cap)
		o += (size_t)snprintf(b + o, cap - o, "%" PRIu64 "m", m);
	if ((x || ms) && o < cap) {
		if (ms)
			snprintf(b + o, cap - o, "%" PRIu64 ".%03" PRIu64 "s", x, ms);
		else
			snprintf(b + o, cap - o, "%" PRIu64 "s", x);
	}
	return b;
}

void flare_drain_line(char *buf, size_t cap, const sel_drain_progress *p)
{
	char a[32], b[32], c[32], d[32], t[32];
	size_t o = 0;
#define ADD(...)                                                                                   \
	do {                                                                                       \
		if (o < cap)                                                                       \
			o += (size_t)snprintf(buf + o, cap - o, __VA_ARGS__);                      \
	} while (0)
	if (p->off) {
		ADD("flare: warning: stopped without a drain: %" PRIu64
		    " DRAM-only record%s (%s) not "
		    "saved to disk; --prefix-cache-drain-on-shutdown saves them for a warm restart",
		    p->records_left, p->records_left == 1 ? "" : "s",
		    size_text(p->bytes_left, a, sizeof a));
		return;
	}
	if (!p->final) {
		ADD("flare: drain: %" PRIu64 " record%s (%s) written, %s/s; %" PRIu64
		    " writing (%s), "
		    "%" PRIu64 " left (%s), %s",
		    p->records_written, p->records_written == 1 ? "" : "s",
		    size_text(p->bytes_written, a, sizeof a), size_text(p->rate_bps, b, sizeof b),
		    p->records_writing, size_text(p->bytes_writing, c, sizeof c), p->records_left,
		    size_text(p->bytes_left, d, sizeof d),
		    flare_duration_text(p->elapsed_ns, t, sizeof t));
		return;
	}
	if (!p->records_written && !p->records_left && !p->failed) {
		ADD("flare: drain: nothing to save (no DRAM-only records)");
		return;
	}
	ADD("flare: drain: saved %" PRIu64 " record%s (%s) in %s, %s/s", p->records_written,
	    p->records_written == 1 ? "" : "s", size_text(p->bytes_written, a, sizeof a),
	    flare_duration_text(p->elapsed_ns, t, sizeof t), size_text(p->rate_bps, b, sizeof b));
	if (p->records_left || p->failed) {
		ADD("; not saved %" PRIu64 " record%s (%s)", p->records_left + p->failed,
		    p->records_left + p->failed == 1 ? "" : "s",
		    size_text(p->bytes_left, c, sizeof c));
		if (p->failed)
			ADD(", %" PRIu64 " failed to write", p->failed);
		if (p->why && *p->why)
			ADD(": %s", p->why);
	} else {
		ADD("; every DRAM-only record saved");
	}
#undef ADD
}

/* Ranks on separate hosts: the store's rank links stopped (design 2.14: the
 * worker stops with them), so the instance stops. */
static char ranks_store_why[EOS_ERRMSG_MAX];
static pthread_mutex_t ranks_store_mu = PTHREAD_MUTEX_INITIALIZER;

/* The store stopped for good (design 2.12): one line, from the worker. */
static void print_store_stopped(void *ctx, int rc, const char *reason, const char *why)
{
	(void)rc;
	if (ctx) {
		pthread_mutex_lock(&ranks_store_mu);
		snprintf(ranks_store_why, sizeof ranks_store_why,
			 "the host prefix cache stopped (%s): %s", reason, why);
		pthread_mutex_unlock(&ranks_store_mu);
		kill(getpid(), SIGUSR1);
		return;
	}
	fprintf(stderr,
		"flare: warning: the host prefix cache stopped (%s): %s; serving goes on "
		"without it (flare_host_cache_enabled 0)\n",
		reason, why);
}

/* The engine's drain progress, on stderr (design 2.5). */
static void print_drain(void *ctx, const sel_drain_progress *p)
{
	(void)ctx;
	char line[512];
	flare_drain_line(line, sizeof line, p);
	fprintf(stderr, "%s\n", line);
}

void flare_serve_summary(struct flare_buf *out, const struct flare_settings *s,
			 const hel_core *core, const hel_engine_info *info, const char *disk_note)
{
	char a[32], b[32], c[32];
	flare_buf_printf(
		out,
		"flare: core '%s' (%" PRIu64 "-token context), speculate %s, max-active %u, "
		"GPU cache %s: %u pages, %u rows\n",
		core->name, core->max_context, flare_mode_name(s->speculate), info->max_active,
		size_text(s->gpu_cache, a, sizeof a), info->gpu_pages, info->gpu_rows);
	const char *store = info->store && *info->store ? info->store : "disabled";
	const char *note = disk_note && *disk_note               ? disk_note
			   : info->disk_note && *info->disk_note ? info->disk_note
								 : "";
	/* A disk directory that was asked for and cannot be used is a warning;
	 * "--prefix-cache-disk-limit 0" is a choice. */
	bool warn = disk_note && *disk_note
			    ? !((s->set & (1ull << FLARE_OPT_DISK_LIMIT)) && s->disk_limit == 0)
			    : info->disk_warning;
	if (!strcmp(store, "disabled")) {
		flare_buf_printf(out, "flare: prefix cache: disabled");
	} else if (!info->slots_total) { /* pool only: no local slots */
		flare_buf_printf(out,
				 "flare: prefix cache: %s store, transport %s, no local tier; "
				 "shared through %s",
				 store, info->transport ? info->transport : "none",
				 info->pool[0] ? info->pool : "no pool");
		if (info->remote[0]) /* issue 16: pool and remote, no local tier */
			flare_buf_printf(out, "; remote tier %s", info->remote);
	} else {
		flare_buf_printf(out,
				 "flare: prefix cache: %s store, transport %s; pool %" PRIu64
				 " slots of %s = %s (intake %" PRIu64 " slots, %s)",
				 store, info->transport ? info->transport : "none",
				 info->slots_total, size_text(info->slot_bytes, a, sizeof a),
				 size_text(info->slots_total * info->slot_bytes, b, sizeof b),
				 info->intake_slots,
				 size_text(info->intake_slots * info->slot_bytes, c, sizeof c));
		if (info->memory_bytes)
			flare_buf_printf(out, "; memory %s",
					 size_text(info->memory_bytes, a, sizeof a));
		if (info->remote[0]) /* issue 16: the last level, its nodes, key, encryption */
			flare_buf_printf(out, "; remote tier %s", info->remote);
		if (info->disk_dir[0])
			flare_buf_printf(
				out,
				"; directory %s, limit %s, I/O %s, %" PRIu64 " records scanned",
				info->disk_dir, size_text(info->disk_limit, a, sizeof a),
				info->disk_io ? info->disk_io : "unknown", info->scanned_records);
		if (info->input_memory || info->disk_shared) /* a vision core (docs/inputs.md) */
			flare_buf_printf(out,
					 "; image inputs: memory %s, disk %s, host allowances %s",
					 size_text(info->input_memory, a, sizeof a),
					 size_text(info->disk_shared, b, sizeof b),
					 size_text(info->input_reserved, c, sizeof c));
		if (info->pool[0])
			flare_buf_printf(out, "; shared through %s", info->pool);
		/* Retention over time (design 2.5). */
		if (s->max_age_ns)
			flare_buf_printf(out, "; records expire after %s unused",
					 flare_duration_text(s->max_age_ns, a, sizeof a));
		if (s->fetch != HEL_FETCH_AUTO)
			flare_buf_printf(out, "; host hits %s",
					 s->fetch == HEL_FETCH_ALWAYS
						 ? "always restored (--prefix-cache-fetch always)"
						 : "never restored (--prefix-cache-fetch never)");
		if (s->overlap != HEL_OVERLAP_ON)
			flare_buf_printf(out, "; overlapped restores %s",
					 s->overlap == HEL_OVERLAP_OFF
						 ? "off (--prefix-cache-overlap off)"
						 : "always (--prefix-cache-overlap always)");
		if (s->drain && !strcmp(store, "composite")) {
			if (s->drain_ns)
				flare_buf_printf(out, "; drain on shutdown for at most %s",
						 flare_duration_text(s->drain_ns, a, sizeof a));
			else
				flare_buf_printf(out, "; drain on shutdown until done");
		} else if (s->drain) {
			flare_buf_printf(out, "; drain on shutdown: nothing to drain in a %s store",
					 store);
		}
	}
	if (*note)
		flare_buf_printf(out, "; %sno disk store: %s", warn ? "warning: " : "", note);
	flare_buf_puts(out, "\n");
	if (info->warning[0])
		flare_buf_printf(out, "flare: warning: %s\n", info->warning);
	/* Design 2.10: record I/O is direct, so disk writes neither grow the
	 * page cache nor evict the core's mappings.  Say so when it is not. */
	if (info->disk_io && info->disk_io_note[0])
		flare_buf_printf(
			out, "flare: warning: record I/O is %s, not io_uring+O_DIRECT: %s%s\n",
			info->disk_io, info->disk_io_note,
			strstr(info->disk_io, "buffered") ? " (records go through the page cache)"
							  : "");
}

/* --api-key-file: the key is the file's first line. */
static int read_key_file(struct flare_settings *s, char *err, size_t errlen)
{
	FILE *f = fopen(s->api_key_file, "re");
	if (!f) {
		snprintf(err, errlen, "--api-key-file: '%.1024s': %s", s->api_key_file,
			 strerror(errno));
		return -1;
	}
	char line[FLARE_API_KEY_MAX + 3];
	size_t n = fread(line, 1, sizeof line - 1, f);
	fclose(f);
	line[n] = '\0';
	line[strcspn(line, "\r\n")] = '\0';
	const struct flare_option *o = flare_option_get(FLARE_OPT_API_KEY);
	char why[256];
	int rc = flare_settings_set(s, o, line, FLARE_V_TEXT, why, sizeof why);
	sodium_memzero(line, sizeof line);
	if (rc) {
		snprintf(err, errlen, "--api-key-file: '%.1024s': %s", s->api_key_file, why);
		return -1;
	}
	return 0;
}

/* File descriptors for --max-connections beside the engine's own: raise
 * the soft limit as far as the hard one allows; returns the connections
 * that fit (with a warning when fewer than asked). */
#define FD_RESERVE 256u
static uint32_t fit_connections(uint32_t want)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl))
		return want;
	rlim_t need = (rlim_t)want + FD_RESERVE;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
		rlim_t to = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
		struct rlimit nr = {to, rl.rlim_max};
		if (setrlimit(RLIMIT_NOFILE, &nr) == 0)
			rl.rlim_cur = to;
	}
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
		uint32_t fit =
			rl.rlim_cur > FD_RESERVE + 16 ? (uint32_t)(rl.rlim_cur - FD_RESERVE) : 16;
		fprintf(stderr,
			"flare: warning: --max-connections %u needs %llu file descriptors; the limit is "
			"%llu (ulimit -n): at most %u connections\n",
			want, (unsigned long long)need, (unsigned long long)rl.rlim_cur, fit);
		return fit;
	}
	return want;
}

static const char *signame(int sig)
{
	return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal";
}

/* The settings: defaults, then the config file, then the flags, then the
 * key file.  0 to go on, 1 when --help was printed, else -1 (the message
 * printed). */
/* The remote tier's settings that depend on each other, and its key file
 * (issue 16), once the settings are final: errors name the file and what
 * was expected (exit status 2, as for any bad setting).  0 (the secret in
 * out when a key file is set) or -1 with the message printed. */
static int remote_key(const struct flare_settings *s, uint8_t out[32])
{
	if (s->remote_key[0] && !s->remote[0]) {
		fprintf(stderr,
			"flare: --prefix-cache-remote-key %s: no remote tier "
			"(--prefix-cache-remote URL) to use it with\n",
			s->remote_key);
		return -1;
	}
	if (s->remote_encrypt && !s->remote_key[0]) {
		fprintf(stderr, "flare: --prefix-cache-remote-encrypt needs a key: "
				"--prefix-cache-remote-key FILE (a 32-byte secret, chmod 600)\n");
		return -1;
	}
	if (s->remote_encrypt && !s->remote[0]) {
		fprintf(stderr, "flare: --prefix-cache-remote-encrypt: no remote tier "
				"(--prefix-cache-remote URL)\n");
		return -1;
	}
	if (s->remote_key[0] && sel_remote_key_load(s->remote_key, out)) {
		fprintf(stderr, "flare: --prefix-cache-remote-key: %s\n", sel_errmsg());
		return -1;
	}
	return 0;
}

static int settle(int argc, char **argv, struct flare_settings *flags, struct flare_settings *file,
		  struct flare_settings *s)
{
	char err[2048];
	int rc = flare_cli_parse(argc, argv, flags, err, sizeof err);
	if (rc == FLARE_CLI_HELP) {
		flare_cli_help(stdout);
		return 1;
	}
	if (rc) {
		fprintf(stderr, "flare: %s\n", err);
		return -1;
	}
	flare_settings_defaults(s);
	if (flags->set & (1ull << FLARE_OPT_CONFIG)) {
		if (flare_config_load(flags->config, file, err, sizeof err)) {
			fprintf(stderr, "flare: %s\n", err);
			return -1;
		}
		flare_settings_merge(s, file);
	}
	flare_settings_merge(s, flags);
	if (s->api_key[0] && s->api_key_file[0]) {
		fprintf(stderr, "flare: --api-key and --api-key-file: give one of them\n");
		return -1;
	}
	if (s->api_key_file[0] && read_key_file(s, err, sizeof err)) {
		fprintf(stderr, "flare: %s\n", err);
		return -1;
	}
	return remote_key(s, s->remote_secret);
}

/* The core file (or the built-in core), able to run the speculation mode
 * asked for.  0, or -1 with the message printed. */
static int load_core(const struct flare_settings *s, hel_core **core)
{
	char err[2048];
	struct stat cst;
	int rc;
	if (s->core[0] && stat(s->core, &cst) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
		/* The one argument that is not a flag is the core file. */
		fprintf(stderr, "flare: core file '%s' not found (flare run [OPTIONS] [CORE])\n",
			s->core);
		return -1;
	}
	if (s->core[0])
		rc = hel_core_load(s->core, core, err, sizeof err);
	else
		rc = hel_core_builtin(core);
	if (rc) {
		if (s->core[0])
			fprintf(stderr, "flare: core file %s\n", err);
		else
			fprintf(stderr, "flare: the built-in core does not parse\n");
		return -1;
	}
	if (!hel_core_supports(*core, s->speculate)) {
		fprintf(stderr, "flare: --speculate: core '%s' does not support %s speculation\n",
			(*core)->name, flare_mode_name(s->speculate));
		return -1;
	}
	return 0;
}

/* Listen first: a busy port is found before the engine loads. */
static int listen_first(struct flare_settings *s, const hel_core *core, struct flare_server **srv)
{
	char err[2048];
	struct flare_server_config sc = {
		.host = s->host,
		.port = s->port,
		.limits = {.model = core->name,
			   .vocab = core->vocab,
			   .max_context = core->max_context,
			   .core = core,
			   .images = flare_image_limits(s)},
		.info = {.model = core->name,
			 .mode = flare_mode_name(s->speculate),
			 .store = "disabled",
			 .transport = "none"},
		.allowed_origins = s->allowed_origins,
		.api_key = s->api_key,
		.metrics_auth = s->metrics_auth,
		.max_connections = fit_connections(s->max_connections),
		.max_per_client = s->max_per_client,
		.idle_timeout_s = (unsigned)((s->idle_timeout_ns + 999999999ull) / 1000000000ull),
		.max_buffered = s->max_buffered,
	};
	if (flare_server_start(&sc, NULL, srv, err, sizeof err)) {
		fprintf(stderr, "flare: %s\n", err);
		return -1;
	}
	sodium_memzero(s->api_key, sizeof s->api_key);
	return 0;
}

/* The engine behind the server, with the startup summary: 0 (be open),
 * -1 when it could not be opened, -2 when it opened but did not start. */
static int open_engine(const struct flare_backend_factory *factory, const struct flare_settings *s,
		       const hel_core *core, struct flare_server *srv, struct flare_backend *be,
		       hel_ranks *ranks)
{
	char err[2048], note[FLARE_PATH_MAX + 512];
	const char *disk = flare_disk_resolve(s, note, sizeof note);
	hel_engine_config ec = {
		.core = core,
		.mode = s->speculate,
		.draft_tokens = s->speculate != SEL_MODE_ORDINARY ? s->draft_tokens : 0,
		.max_active = s->max_active,
		.gpu_cache_bytes = s->gpu_cache,
		.queue_limit = 0,
		.memory_bytes = s->memory,
		.disk_dir = disk,
		.disk_limit = s->disk_limit,
		.disk_limit_set = (s->set & (1ull << FLARE_OPT_DISK_LIMIT)) != 0,
		.drain_on_shutdown = s->drain,
		.drain_limit_ns = s->drain_ns,
		.drain_progress = print_drain,
		.store_stopped = print_store_stopped,
		.store_stopped_ctx = ranks,
		.max_age_ns = s->max_age_ns,
		.fetch = s->fetch,
		.overlap = s->overlap,
		.fdatasync = false,
		.test_hold_inbound = getenv("FLARE_TEST_HOLD_INBOUND"),
		.tp = ranks ? hel_ranks_tp(ranks) : NULL,
		.store_ranks = ranks ? hel_ranks_store(ranks) : NULL,
		.image_limits = flare_image_limits(s),
		.pool = s->pool[0] ? s->pool : NULL,
		.pool_instance_id = s->pool_instance_id[0] ? s->pool_instance_id : NULL,
		.pool_listen = flare_server_url(srv),
		.pool_wait_ns = s->pool_wait_ns,
		.pool_grace_ns = s->pool_grace_ns,
		.remote = s->remote[0] ? s->remote : NULL,
		.remote_key = s->remote_key[0] ? s->remote_secret : NULL,
		.remote_encrypt = s->remote_encrypt,
	};
	if (factory->open(factory, &ec, be, err, sizeof err)) {
		fprintf(stderr, "flare: %s\n", err);
		return -1;
	}
	hel_engine_info info;
	memset(&info, 0, sizeof info);
	be->ops->info(be->ctx, &info);
	struct flare_buf sum = {0};
	flare_serve_summary(&sum, s, core, &info, note);
	if (sum.data)
		fputs(sum.data, stderr);
	flare_buf_free(&sum);
	struct flare_metrics_info mi = {.model = core->name,
					.mode = flare_mode_name(s->speculate),
					.store = info.store ? info.store : "disabled",
					.transport = info.transport ? info.transport : "none",
					.slot_bytes = info.slot_bytes};
	flare_server_attach(srv, be, &mi);
	int rc = be->ops->start(be->ctx);
	if (rc) {
		fprintf(stderr, "flare: cannot start the engine: %s: %s\n", sel_strerror(rc),
			sel_errmsg());
		return -2;
	}
	flare_server_set_ready(srv);
	fprintf(stderr, "flare: listening on %s\n", flare_server_url(srv));
	return 0;
}

/* Serve until SIGINT or SIGTERM, printing the dashboard line when asked;
 * returns the signal. */
static int serve_until_signal(const struct flare_settings *s, struct flare_backend *be,
			      const sigset_t *sigs)
{
	bool dash = s->dashboard == FLARE_DASHBOARD_ON ||
		    (s->dashboard == FLARE_DASHBOARD_AUTO && isatty(STDERR_FILENO));
	hel_engine_stats prev, cur;
	memset(&prev, 0, sizeof prev);
	bool have_prev = false;
	uint64_t prev_ns = eos_now_ns();
	for (;;) {
		int sig;
		if (dash) {
			struct timespec ts = {.tv_sec = (time_t)(s->dashboard_ns / 1000000000ull),
					      .tv_nsec = (long)(s->dashboard_ns % 1000000000ull)};
			sig = sigtimedwait(sigs, NULL, &ts);
		} else {
			sig = sigwaitinfo(sigs, NULL);
		}
		if (sig > 0)
			return sig;
		if (errno != EAGAIN)
			continue; /* EINTR */
		be->ops->stats(be->ctx, &cur);
		uint64_t now = eos_now_ns();
		char line[512];
		flare_dashboard_line(line, sizeof line, have_prev ? &prev : NULL, &cur,
				     now - prev_ns);
		fprintf(stderr, "%s\n", line);
		prev = cur;
		prev_ns = now;
		have_prev = true;
	}
}

/* The stop: the server stops taking requests, the engine stops within its
 * grace (drain included), the server finishes. */
static void shut_down(const struct flare_settings *s, struct flare_server *srv,
		      struct flare_backend *be, bool be_open)
{
	if (srv)
		flare_server_begin_stop(srv);
	if (be_open) {
		uint64_t deadline = 0; /* an unlimited drain was asked for */
		if (!(s->drain && s->drain_ns == 0))
			deadline = eos_now_ns() + STOP_GRACE_NS + (s->drain ? s->drain_ns : 0);
		int rc = be->ops->stop(be->ctx, deadline);
		if (rc)
			fprintf(stderr, "flare: warning: the engine did not stop cleanly: %s: %s\n",
				sel_strerror(rc), sel_errmsg());
	}
	if (srv) {
		flare_server_stop(srv, HTTP_GRACE_NS);
		flare_server_destroy(srv);
	}
	if (be_open)
		be->ops->destroy(be->ctx);
}

int flare_serve(int argc, char **argv, const struct flare_backend_factory *factory)
{
	struct flare_settings *flags = malloc(sizeof *flags), *file = malloc(sizeof *file),
			      *s = malloc(sizeof *s);
	hel_core *core = NULL;
	hel_ranks *ranks = NULL;
	struct flare_backend be = {0};
	bool be_open = false;
	struct flare_server *srv = NULL;
	int status = 2, rc;
	sigset_t sigs, old;
	bool masked = false;

	if (!flags || !file || !s) {
		fprintf(stderr, "flare: out of memory\n");
		status = 1;
		goto out;
	}
	if ((rc = settle(argc, argv, flags, file, s)) != 0) {
		status = rc > 0 ? 0 : 2;
		goto out;
	}
	if (load_core(s, &core) || flare_ranks_check(s, core))
		goto out;
	/* Before any offload thread starts, on every rank. */
	eos_offload_sched_set((enum eos_sched_class)s->offload_sched);
	if (flare_ranks_on(s) && s->rank > 0) {
		status = flare_ranks_peer(s, core); /* no HTTP, no engine */
		goto out;
	}
	/* Before any thread exists: threads inherit the mask. */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGUSR1); /* the ranks stopped (flare_ranks_lead) */
	pthread_sigmask(SIG_BLOCK, &sigs, &old);
	masked = true;
	status = 1;
	if (listen_first(s, core, &srv))
		goto out;
	if (flare_ranks_on(s) && flare_ranks_lead(s, core, &ranks))
		goto out;
	rc = open_engine(factory, s, core, srv, &be, ranks);
	be_open = rc != -1;
	if (rc)
		goto out;
	int sig = serve_until_signal(s, &be, &sigs);
	/* A later "the ranks stopped" (the store's links after the group's)
	 * must not end the process while it shuts down: discarded. */
	if (ranks)
		signal(SIGUSR1, SIG_IGN);
	char store_why[EOS_ERRMSG_MAX];
	pthread_mutex_lock(&ranks_store_mu);
	snprintf(store_why, sizeof store_why, "%s", ranks_store_why);
	pthread_mutex_unlock(&ranks_store_mu);
	if (sig == SIGUSR1 && ranks && (hel_ranks_failure(ranks) || store_why[0])) {
		fprintf(stderr, "flare: error: the instance stops: %s\n",
			hel_ranks_failure(ranks) ? hel_ranks_failure(ranks) : store_why);
		status = 1;
		goto out;
	}
	fprintf(stderr, "flare: %s: stopping\n", signame(sig));
	/* A second signal now ends the process the ordinary way. */
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	masked = false;
	status = 0;
out:
	if (s)
		shut_down(s, srv, &be, be_open);
	/* After the engine and its model; the peers stop with rank 0's word. */
	hel_ranks_close(ranks, status ? "rank 0 stopped with an error (its log says why)" : NULL);
	if (masked)
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (be_open && status == 0)
		fprintf(stderr, "flare: stopped\n");
	hel_core_free(core);
	free(flags);
	free(file);
	if (s)
		explicit_bzero(s->remote_secret, sizeof s->remote_secret);
	free(s);
	return status;
}
