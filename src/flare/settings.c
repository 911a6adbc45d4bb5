/*
 * settings.c - the option table of `flare run` and the reading of values
 * (design 1 "Scope and configurations", 2.5 drain/expiry paragraphs, 2.11;
 * docs/configuration.md).
 *
 * DESIGN
 * One table describes every setting.  Flags and config keys are two
 * spellings of the same entry, so they accept the same values and report
 * errors the same way; only the prefix differs ("--port: ..." versus
 * "flare.toml:3: server.port: ...").  A config file value keeps its TOML
 * type: a size may be written "8GiB" or as an integer count of bytes, but a
 * port must be an integer, a path a string.
 *
 * Invariants:
 *   1. flare_settings_set() changes s only on success, and then marks
 *      exactly the option's bit.
 *   2. Every value that flare_settings_set() accepts is within the range
 *      the engine accepts (draft tokens 1..HEL_DRAFT_MAX, max_active >= 1,
 *      a positive GPU cache), so later stages never re-validate.
 */
#include "flare/settings.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#undef flare_bad /* settings.h's analyzer-only macro stands for this function */
#include <string.h>
#include <strings.h>

#include "eos.h"
#include "helios/model.h"

#define DEFAULT_HOST "127.0.0.1"
#define DEFAULT_PORT 8080
#define DEFAULT_MAX_ACTIVE 4
/* The built-in tiny core's pages are 8.5 KiB: 64 MiB holds ~7,700 of them,
 * far more than a test or a demo conversation needs. */
#define DEFAULT_GPU_CACHE (64ull << 20)
#define DEFAULT_DASHBOARD_NS (5ull * 1000000000ull)
#define DEFAULT_MAX_CONNECTIONS 1024u
#define DEFAULT_MAX_PER_CLIENT 64u
#define DEFAULT_IDLE_TIMEOUT_NS (30ull * 1000000000ull)
#define DEFAULT_MAX_BUFFERED (64ull << 20)

static const struct flare_option options[] = {
	{FLARE_OPT_CONFIG, "--config", "FILE", NULL, NULL, FLARE_K_PATH, 0, 0, false, "none",
	 "read settings from FILE (TOML subset; flags win over the file)"},
	{FLARE_OPT_HOST, "--host", "ADDR", "server", "host", FLARE_K_HOST, 0, 0, false,
	 DEFAULT_HOST, "address to listen on"},
	{FLARE_OPT_PORT, "--port", "N", "server", "port", FLARE_K_PORT, 0, 65535, false, "8080",
	 "TCP port; 0 picks a free port (the startup line names it)"},
	{FLARE_OPT_MAX_ACTIVE, "--max-active", "N", "server", "max_active", FLARE_K_COUNT, 1,
	 FLARE_MAX_ACTIVE_MAX, false, "4", "requests running at once; more wait in the queue"},
	{FLARE_OPT_GPU_CACHE, "--gpu-cache", "SIZE", "server", "gpu_cache", FLARE_K_SIZE, 1, 0,
	 false, "64MiB", "GPU checkpoint cache budget (page planes and rows)"},
	{FLARE_OPT_SPECULATE, "--speculate", "MODE", "server", "speculate", FLARE_K_MODE, 0, 0,
	 false, "off", "speculative decoding: off (ordinary), copy or learned"},
	{FLARE_OPT_DRAFT_TOKENS, "--draft-tokens", "N", "server", "draft_tokens", FLARE_K_COUNT, 1,
	 HEL_DRAFT_MAX, false, "4", "proposals per speculative round (1-16)"},
	{FLARE_OPT_MEMORY, "--prefix-cache-memory", "SIZE", "prefix_cache", "memory", FLARE_K_SIZE,
	 0, 0, false, "0", "host memory for warm prefix checkpoints; 0 = none"},
	{FLARE_OPT_DISK, "--prefix-cache-disk", "DIR", "prefix_cache", "disk", FLARE_K_PATH, 0, 0,
	 false, "none", "base directory for the model's prefix record directory"},
	{FLARE_OPT_DISK_LIMIT, "--prefix-cache-disk-limit", "SIZE", "prefix_cache", "disk_limit",
	 FLARE_K_SIZE, 0, 0, false, "1/10 of free space",
	 "disk budget for prefix records; 0 = no disk store"},
	{FLARE_OPT_DRAIN, "--prefix-cache-drain-on-shutdown", " [DURATION|on|off]", "prefix_cache",
	 "drain_on_shutdown", FLARE_K_DRAIN, 0, 0, true, "off",
	 "at shutdown write DRAM-only records to disk: bare = until done, 90s = at most that long"},
	{FLARE_OPT_MAX_AGE, "--prefix-cache-max-age", "DURATION|off", "prefix_cache", "max_age",
	 FLARE_K_AGE, 0, 0, false, "off", "drop host records unused for longer than this"},
	{FLARE_OPT_FETCH, "--prefix-cache-fetch", "auto|always|never", "prefix_cache", "fetch",
	 FLARE_K_FETCH, 0, 0, false, "auto",
	 "restore host hits: auto = when faster than recomputing, always, never"},
	{FLARE_OPT_OVERLAP, "--prefix-cache-overlap", "on|off|always", "prefix_cache", "overlap",
	 FLARE_K_OVERLAP, 0, 0, false, "on",
	 "recompute a host hit's head while its tail loads, where the policy finds it faster"},
	{FLARE_OPT_DASHBOARD, "--dashboard", "auto|on|off", "server", "dashboard", FLARE_K_SWITCH,
	 0, 0, false, "auto",
	 "one status line on stderr per interval; auto = when stderr is a terminal"},
	{FLARE_OPT_DASHBOARD_INTERVAL, "--dashboard-interval", "DURATION", "server",
	 "dashboard_interval", FLARE_K_INTERVAL, 0, 0, false, "5s",
	 "how often the dashboard prints"},
	{FLARE_OPT_ALLOWED_ORIGINS, "--allowed-origins", "LIST", "server", "allowed_origins",
	 FLARE_K_ORIGINS, 0, 0, false, "none (CORS off)",
	 "browser origins allowed to call the API: * or scheme://host[:port],..."},
	{FLARE_OPT_API_KEY, "--api-key", "KEY", "server", "api_key", FLARE_K_SECRET, 0, 0, false,
	 "none", "require Authorization: Bearer KEY everywhere but /health (and /metrics)"},
	{FLARE_OPT_API_KEY_FILE, "--api-key-file", "FILE", "server", "api_key_file", FLARE_K_PATH,
	 0, 0, false, "none", "the API key from FILE's first line (keeps it out of ps)"},
	{FLARE_OPT_METRICS_AUTH, "--metrics-auth", "on|off", "server", "metrics_auth", FLARE_K_BOOL,
	 0, 0, false, "off", "whether /metrics needs the API key too"},
	{FLARE_OPT_MAX_CONNECTIONS, "--max-connections", "N", "server", "max_connections",
	 FLARE_K_COUNT, 1, FLARE_CONNECTIONS_MAX, false, "1024", "TCP connections open at once"},
	{FLARE_OPT_MAX_PER_CLIENT, "--max-connections-per-client", "N", "server",
	 "max_connections_per_client", FLARE_K_COUNT, 0, FLARE_CONNECTIONS_MAX, false, "64",
	 "connections open at once from one address; 0 = no limit (behind a proxy)"},
	{FLARE_OPT_IDLE_TIMEOUT, "--idle-timeout", "DURATION", "server", "idle_timeout",
	 FLARE_K_INTERVAL, 0, 0, false, "30s",
	 "close a connection idle this long (waiting requests are not idle)"},
	{FLARE_OPT_MAX_BUFFERED, "--max-buffered-bytes", "SIZE", "server", "max_buffered_bytes",
	 FLARE_K_SIZE, 1, 0, false, "64MiB",
	 "request body bytes held at once, all connections; beyond it 503"},
	{FLARE_OPT_RANKS, "--ranks", "N", "ranks", "ranks", FLARE_K_COUNT, 1, 64, false, "1",
	 "run a multi-host core as N processes, one per rank (docs/multihost.md)"},
	{FLARE_OPT_RANK, "--rank", "R", "ranks", "rank", FLARE_K_COUNT, 0, 63, false, "0",
	 "this process's rank: 0 serves HTTP and schedules, the others compute"},
	{FLARE_OPT_RENDEZVOUS, "--rendezvous", "HOST:PORT", "ranks", "rendezvous", FLARE_K_ENDPOINT,
	 0, 0, false, "none",
	 "rank 0 listens there (port 0: any; it prints it), the peers connect"},
	{FLARE_OPT_MAX_IMAGE_BYTES, "--max-image-bytes", "SIZE", "images", "max_image_bytes",
	 FLARE_K_SIZE, 1, 0, false, "16MiB",
	 "an image part's encoded bytes at most (vision cores); beyond it 400"},
	{FLARE_OPT_MAX_IMAGE_PIXELS, "--max-image-pixels", "N", "images", "max_image_pixels",
	 FLARE_K_COUNT, 1, 65535ull * 65535ull, false, "16777216",
	 "an image's width x height at most, from its header before decoding; beyond it 400"},
	{FLARE_OPT_MAX_IMAGES, "--max-images", "N", "images", "max_images", FLARE_K_COUNT, 1, 1024,
	 false, "16", "image parts in one request at most; beyond it 400"},
	{FLARE_OPT_POOL, "--prefix-cache-pool", "unix:PATH", "prefix_cache", "pool", FLARE_K_POOL,
	 0, 0, false, "none",
	 "share prefix checkpoints through the pool manager at PATH (flare pool)"},
	{FLARE_OPT_POOL_INSTANCE_ID, "--prefix-cache-instance-id", "ID", "prefix_cache",
	 "instance_id", FLARE_K_NAME, 0, 0, false, "machine id + core + listen address",
	 "this instance's stable id in the pool"},
	{FLARE_OPT_POOL_WAIT, "--prefix-cache-pool-wait", "DURATION", "prefix_cache", "pool_wait",
	 FLARE_K_INTERVAL, 0, 0, false, "10s", "how long startup waits for the pool manager"},
	{FLARE_OPT_POOL_GRACE, "--prefix-cache-pool-grace", "DURATION", "prefix_cache",
	 "pool_grace", FLARE_K_INTERVAL, 0, 0, false, "2ms",
	 "shortest time admission waits for the pool's answer (longer: 4 round trips)"},
	{FLARE_OPT_REMOTE, "--prefix-cache-remote", "URL", "prefix_cache", "remote", FLARE_K_REMOTE,
	 0, 0, false, "none",
	 "share prefixes across hosts through Redis: redis://HOST:PORT[/DB], unix:///PATH, "
	 "redis-cluster://HOST:PORT[,HOST:PORT...]"},
	{FLARE_OPT_REMOTE_KEY, "--prefix-cache-remote-key", "FILE", "prefix_cache", "remote_key",
	 FLARE_K_PATH, 0, 0, false, "none",
	 "32-byte secret shared by the hosts (chmod 600): every remote value authenticated"},
	{FLARE_OPT_REMOTE_ENCRYPT, "--prefix-cache-remote-encrypt", " [on|off]", "prefix_cache",
	 "remote_encrypt", FLARE_K_ENCRYPT, 0, 0, true, "off",
	 "encrypt remote values (XChaCha20-Poly1305; needs the key)"},
	{FLARE_OPT_OFFLOAD_SCHED, "--offload-sched", "other|batch|idle", "prefix_cache",
	 "offload_sched", FLARE_K_SCHED, 0, 0, false, "other",
	 "scheduling class of the copy, disk and remote threads (all at nice 10)"},
	{FLARE_OPT_HELP, "--help", "", NULL, NULL, FLARE_K_NONE, 0, 0, false, "",
	 "print this help and exit"},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

const struct flare_option *flare_options(size_t *n)
{
	*n = N_OPTIONS;
	return options;
}

const struct flare_option *flare_option_by_flag(const char *flag, size_t len)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (strlen(options[i].flag) == len && memcmp(options[i].flag, flag, len) == 0)
			return &options[i];
	return NULL;
}

const struct flare_option *flare_option_by_key(const char *section, const char *key)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].section && !strcmp(options[i].section, section) &&
		    !strcmp(options[i].key, key))
			return &options[i];
	return NULL;
}

const struct flare_option *flare_option_get(enum flare_opt id)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].id == id)
			return &options[i];
	return NULL;
}

const char *flare_mode_name(sel_state_mode m)
{
	switch (m) {
	case SEL_MODE_ORDINARY: return "off";
	case SEL_MODE_COPY: return "copy";
	case SEL_MODE_LEARNED: return "learned";
	}
	return "?";
}

void flare_settings_defaults(struct flare_settings *s)
{
	memset(s, 0, sizeof *s);
	snprintf(s->host, sizeof s->host, "%s", DEFAULT_HOST);
	s->port = DEFAULT_PORT;
	s->max_active = DEFAULT_MAX_ACTIVE;
	s->gpu_cache = DEFAULT_GPU_CACHE;
	s->speculate = SEL_MODE_ORDINARY;
	s->draft_tokens = HEL_DRAFT_DEFAULT;
	s->dashboard = FLARE_DASHBOARD_AUTO;
	s->dashboard_ns = DEFAULT_DASHBOARD_NS;
	s->max_connections = DEFAULT_MAX_CONNECTIONS;
	s->max_per_client = DEFAULT_MAX_PER_CLIENT;
	s->idle_timeout_ns = DEFAULT_IDLE_TIMEOUT_NS;
	s->max_buffered = DEFAULT_MAX_BUFFERED;
	s->max_image_bytes = HEL_IMAGE_ENCODED_DEFAULT;
	s->max_image_pixels = HEL_IMAGE_PIXELS_DEFAULT;
	s->max_images = HEL_IMAGE_COUNT_DEFAULT;
	s->offload_sched = EOS_SCHED_OTHER;
	s->pool_wait_ns = 10ull * 1000000000ull; /* design 2.15: ten seconds for the hello */
	s->pool_grace_ns = 2000000ull;           /* design 2.15: 2 ms locally */
}

/* "*", or origins scheme://host[:port] (http or https, no path) joined by
 * commas, spaces around them dropped, into out. */
static bool read_origins(const char *t, char *out, size_t cap)
{
	if (!strcmp(t, "*")) {
		snprintf(out, cap, "*");
		return true;
	}
	size_t o = 0;
	for (const char *p = t;;) {
		while (*p == ' ')
			p++;
		size_t l = strcspn(p, ",");
		while (l && p[l - 1] == ' ')
			l--;
		const char *host = !strncmp(p, "http://", 7)    ? p + 7
				   : !strncmp(p, "https://", 8) ? p + 8
								: NULL;
		if (!host || host >= p + l || o + l + 2 > cap)
			return false;
		for (const char *q = host; q < p + l; q++)
			if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
			      (*q >= '0' && *q <= '9') || strchr(".-:[]", *q)))
				return false;
		if (o)
			out[o++] = ',';
		memcpy(out + o, p, l);
		o += l;
		out[o] = '\0';
		p += strcspn(p, ",");
		if (!*p)
			return true;
		p++;
	}
}

/* ---- reading values ------------------------------------------------------ */

int flare_bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	flare_message_tidy(err, errlen);
	return -EINVAL;
}

void flare_message_tidy(char *msg, size_t cap)
{
	if (cap == 0)
		return;
	size_t n = strlen(msg), ctl = 0;
	for (size_t i = 0; i < n; i++)
		ctl += (unsigned char)msg[i] < 0x20 || msg[i] == 0x7f;
	if (!ctl)
		return;
	char tmp[2048];
	size_t o = 0;
	for (size_t i = 0; i < n && o + 5 < sizeof tmp; i++) {
		unsigned char c = (unsigned char)msg[i];
		if (c < 0x20 || c == 0x7f)
			o += (size_t)snprintf(tmp + o, sizeof tmp - o, "\\x%02x", c);
		else
			tmp[o++] = (char)c;
	}
	tmp[o] = '\0';
	snprintf(msg, cap, "%s", tmp);
}

/* eos messages begin with "size 'TEXT': " or "duration 'TEXT': "; ours
 * already quote the text, so keep only the explanation. */
static const char *eos_reason(const char *what, const char *text)
{
	const char *m = eos_errmsg();
	size_t wl = strlen(what), tl = strlen(text);
	if (!strncmp(m, what, wl) && m[wl] == ' ' && m[wl + 1] == '\'' &&
	    !strncmp(m + wl + 2, text, tl) && !strncmp(m + wl + 2 + tl, "': ", 3))
		return m + wl + 2 + tl + 3;
	return m;
}

/* Decimal digits only, no sign, into *out (<= max). */
static bool parse_uint(const char *t, uint64_t max, uint64_t *out)
{
	if (!*t)
		return false;
	uint64_t v = 0;
	for (const char *p = t; *p; p++) {
		if (*p < '0' || *p > '9')
			return false;
		unsigned d = (unsigned)(*p - '0');
		if (v > (max - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*out = v;
	return true;
}

/* A positive duration or (allow_off) "off": *ns = 0 for off. */
static int read_duration(const char *t, enum flare_vtype vt, bool allow_off, uint64_t *ns,
			 char *err, size_t errlen)
{
	bool off = false;
	uint64_t v;
	if (vt == FLARE_V_INTEGER) {
		/* A bare integer in the file counts seconds, as on the command line. */
		if (!parse_uint(t, UINT64_MAX / 1000000000ull, &v))
			return flare_bad(err, errlen, "%s is not a duration in seconds", t);
		v *= 1000000000ull;
	} else {
		if (eos_parse_duration(t, &v, allow_off ? &off : NULL))
			return flare_bad(err, errlen, "'%s' is not a duration: %s", t,
					 eos_reason("duration", t));
	}
	if (off) {
		*ns = 0;
		return 0;
	}
	if (v == 0)
		return flare_bad(err, errlen, "'%s' is not a positive duration%s", t,
				 allow_off ? " (write 'off' to disable)" : "");
	*ns = v;
	return 0;
}

static const char *vtype_name(enum flare_vtype vt)
{
	switch (vt) {
	case FLARE_V_STRING: return "the string";
	case FLARE_V_INTEGER: return "the integer";
	case FLARE_V_BOOL: return "the boolean";
	case FLARE_V_TEXT: break;
	}
	return "text";
}

/* One setter per kind of option: the value in t (its TOML type vt)
 * checked and stored; the failure's message into err. */
static int set_none(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)s;
	(void)o;
	(void)t;
	(void)vt;
	return flare_bad(err, errlen, "takes no value");
}

static int set_path(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)vt;
	char *dst = o->id == FLARE_OPT_DISK           ? s->disk
		    : o->id == FLARE_OPT_CONFIG       ? s->config
		    : o->id == FLARE_OPT_API_KEY_FILE ? s->api_key_file
		    : o->id == FLARE_OPT_REMOTE_KEY   ? s->remote_key
						      : s->core;
	if (!*t)
		return flare_bad(err, errlen, "'' is not a path (empty)");
	if (strlen(t) >= FLARE_PATH_MAX)
		return flare_bad(err, errlen, "path is longer than %d bytes", FLARE_PATH_MAX - 1);
	snprintf(dst, FLARE_PATH_MAX, "%s", t);
	return 0;
}

static int set_host(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!*t || strlen(t) >= FLARE_HOST_MAX || strpbrk(t, " \t/"))
		return flare_bad(err, errlen,
				 "'%s' is not an address (e.g. 127.0.0.1, ::1, 0.0.0.0)", t);
	snprintf(s->host, sizeof s->host, "%s", t);
	return 0;
}

static int set_port(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	uint64_t v = 0;
	if (!parse_uint(t, 65535, &v))
		return flare_bad(err, errlen, "'%s' is not a port number (0-65535)", t);
	s->port = (uint16_t)v;
	return 0;
}

static int set_count(struct flare_settings *s, const struct flare_option *o, const char *t,
		     enum flare_vtype vt, char *err, size_t errlen)
{
	(void)vt;
	uint64_t v = 0;
	if (!parse_uint(t, UINT64_MAX, &v) || v < o->min || v > o->max)
		return flare_bad(err, errlen,
				 "'%s' is not a whole number from %" PRIu64 " to %" PRIu64, t,
				 o->min, o->max);
	if (o->id == FLARE_OPT_MAX_ACTIVE)
		s->max_active = (uint32_t)v;
	else if (o->id == FLARE_OPT_MAX_CONNECTIONS)
		s->max_connections = (uint32_t)v;
	else if (o->id == FLARE_OPT_MAX_PER_CLIENT)
		s->max_per_client = (uint32_t)v;
	else if (o->id == FLARE_OPT_RANKS)
		s->ranks = (uint32_t)v;
	else if (o->id == FLARE_OPT_RANK)
		s->rank = (uint32_t)v;
	else if (o->id == FLARE_OPT_MAX_IMAGE_PIXELS)
		s->max_image_pixels = v;
	else if (o->id == FLARE_OPT_MAX_IMAGES)
		s->max_images = (uint32_t)v;
	else
		s->draft_tokens = (uint32_t)v;
	return 0;
}

static int set_size(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	uint64_t v = 0;
	if (vt == FLARE_V_INTEGER) {
		if (!parse_uint(t, UINT64_MAX, &v))
			return flare_bad(err, errlen, "%s is not a size in bytes", t);
	} else if (eos_parse_size(t, &v)) {
		return flare_bad(err, errlen, "'%s' is not a size: %s", t, eos_reason("size", t));
	}
	if (v < o->min)
		return flare_bad(err, errlen, "'%s' is too small (it must be positive)", t);
	if (o->id == FLARE_OPT_MEMORY)
		s->memory = v;
	else if (o->id == FLARE_OPT_DISK_LIMIT)
		s->disk_limit = v;
	else if (o->id == FLARE_OPT_MAX_BUFFERED)
		s->max_buffered = v;
	else if (o->id == FLARE_OPT_MAX_IMAGE_BYTES)
		s->max_image_bytes = v;
	else
		s->gpu_cache = v;
	return 0;
}

static int set_mode(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!strcmp(t, "off") || !strcmp(t, "ordinary"))
		s->speculate = SEL_MODE_ORDINARY;
	else if (!strcmp(t, "copy"))
		s->speculate = SEL_MODE_COPY;
	else if (!strcmp(t, "learned"))
		s->speculate = SEL_MODE_LEARNED;
	else
		return flare_bad(err, errlen, "'%s' is not a speculation mode (off, copy, learned)",
				 t);
	return 0;
}

static int set_drain(struct flare_settings *s, const struct flare_option *o, const char *t,
		     enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	uint64_t ns = 0;
	if (vt == FLARE_V_BOOL ||
	    (vt != FLARE_V_INTEGER && (!strcasecmp(t, "on") || !strcasecmp(t, "off")))) {
		s->drain = !strcasecmp(t, "on") || !strcmp(t, "true");
		s->drain_ns = 0;
		return 0;
	}
	if (vt != FLARE_V_INTEGER && eos_parse_duration(t, &ns, NULL))
		return flare_bad(err, errlen, "'%s' is not on, off or a duration: %s", t,
				 eos_reason("duration", t));
	if (read_duration(t, vt, false, &ns, err, errlen))
		return -EINVAL;
	s->drain = true;
	s->drain_ns = ns;
	return 0;
}

static int set_age(struct flare_settings *s, const struct flare_option *o, const char *t,
		   enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	uint64_t ns = 0;
	if (read_duration(t, vt, true, &ns, err, errlen))
		return -EINVAL;
	s->max_age_ns = ns;
	return 0;
}

static int set_fetch(struct flare_settings *s, const struct flare_option *o, const char *t,
		     enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!strcmp(t, "auto"))
		s->fetch = HEL_FETCH_AUTO;
	else if (!strcmp(t, "always"))
		s->fetch = HEL_FETCH_ALWAYS;
	else if (!strcmp(t, "never"))
		s->fetch = HEL_FETCH_NEVER;
	else
		return flare_bad(err, errlen, "'%s' is not a fetch mode (auto, always, never)", t);
	return 0;
}

static int set_overlap(struct flare_settings *s, const struct flare_option *o, const char *t,
		       enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!strcmp(t, "on"))
		s->overlap = HEL_OVERLAP_ON;
	else if (!strcmp(t, "off"))
		s->overlap = HEL_OVERLAP_OFF;
	else if (!strcmp(t, "always"))
		s->overlap = HEL_OVERLAP_ALWAYS;
	else
		return flare_bad(err, errlen, "'%s' is not an overlap mode (on, off, always)", t);
	return 0;
}

static int set_sched(struct flare_settings *s, const struct flare_option *o, const char *t,
		     enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	enum eos_sched_class c;
	if (eos_sched_class_parse(t, &c))
		return flare_bad(err, errlen, "'%s' is not a scheduling class (other, batch, idle)",
				 t);
	s->offload_sched = (int)c;
	return 0;
}

static int set_switch(struct flare_settings *s, const struct flare_option *o, const char *t,
		      enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!strcasecmp(t, "auto"))
		s->dashboard = FLARE_DASHBOARD_AUTO;
	else if (!strcasecmp(t, "on") || !strcmp(t, "true"))
		s->dashboard = FLARE_DASHBOARD_ON;
	else if (!strcasecmp(t, "off") || !strcmp(t, "false"))
		s->dashboard = FLARE_DASHBOARD_OFF;
	else
		return flare_bad(err, errlen, "'%s' is not auto, on or off", t);
	return 0;
}

static int set_interval(struct flare_settings *s, const struct flare_option *o, const char *t,
			enum flare_vtype vt, char *err, size_t errlen)
{
	uint64_t ns = 0;
	if (read_duration(t, vt, false, &ns, err, errlen))
		return -EINVAL;
	if (o->id == FLARE_OPT_IDLE_TIMEOUT)
		s->idle_timeout_ns = ns;
	else if (o->id == FLARE_OPT_POOL_WAIT)
		s->pool_wait_ns = ns;
	else if (o->id == FLARE_OPT_POOL_GRACE)
		s->pool_grace_ns = ns;
	else
		s->dashboard_ns = ns;
	return 0;
}

static int set_origins(struct flare_settings *s, const struct flare_option *o, const char *t,
		       enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	char tmp[FLARE_ORIGINS_MAX] = "";
	if (*t && (strlen(t) >= sizeof tmp || !read_origins(t, tmp, sizeof tmp)))
		return flare_bad(err, errlen,
				 "'%.200s' is not an origin list (* for any, or "
				 "http(s)://host[:port] separated by commas)",
				 t);
	snprintf(s->allowed_origins, sizeof s->allowed_origins, "%s", tmp);
	return 0;
}

/* 1 to max printable ASCII characters, no spaces (API keys, instance ids). */
static bool printable_word(const char *t, size_t max)
{
	size_t l = strlen(t);
	bool ok = l > 0 && l <= max;
	for (size_t i = 0; ok && i < l; i++)
		ok = t[i] > 0x20 && t[i] < 0x7f;
	return ok;
}

static int set_secret(struct flare_settings *s, const struct flare_option *o, const char *t,
		      enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	/* Never quoted back: it is a secret. */
	if (!printable_word(t, FLARE_API_KEY_MAX))
		return flare_bad(err, errlen,
				 "the key must be 1 to %d printable characters without "
				 "spaces",
				 FLARE_API_KEY_MAX);
	snprintf(s->api_key, sizeof s->api_key, "%s", t);
	return 0;
}

static int set_bool(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!strcasecmp(t, "on") || !strcmp(t, "true"))
		s->metrics_auth = true;
	else if (!strcasecmp(t, "off") || !strcmp(t, "false"))
		s->metrics_auth = false;
	else
		return flare_bad(err, errlen, "'%s' is not on or off", t);
	return 0;
}

/* Rank 0's rendezvous address: HOST:PORT, the host part checked as --host. */
static int set_endpoint(struct flare_settings *s, const struct flare_option *o, const char *t,
			enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	const char *colon = strrchr(t, ':');
	uint64_t port = 0;
	if (!colon || colon == t || strlen(t) >= sizeof s->rendezvous || strpbrk(t, " \t/") ||
	    !parse_uint(colon + 1, 65535, &port))
		return flare_bad(err, errlen,
				 "'%s' is not HOST:PORT (e.g. 10.0.0.1:7000, [fd00::1]:7000)", t);
	snprintf(s->rendezvous, sizeof s->rendezvous, "%s", t);
	return 0;
}

/* The pool manager's address: "unix:PATH", or a path with a '/' (design
 * 2.15: only a manager on this host in this build). */
static int set_pool(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	const char *path = !strncmp(t, "unix:", 5) ? t + 5 : strchr(t, '/') ? t : NULL;
	if (!path || !*path || strchr(t, ' '))
		return flare_bad(err, errlen,
				 "'%.200s' is not a pool address (unix:PATH, the socket of flare "
				 "pool on this host)",
				 t);
	if (strlen(t) >= sizeof s->pool - 6)
		return flare_bad(err, errlen, "address is longer than %d bytes",
				 FLARE_PATH_MAX - 7);
	snprintf(s->pool, sizeof s->pool, "%s%s", path == t ? "unix:" : "", t);
	return 0;
}

static int set_name(struct flare_settings *s, const struct flare_option *o, const char *t,
		    enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!printable_word(t, FLARE_POOL_ID_MAX))
		return flare_bad(err, errlen,
				 "'%.80s' is not an instance id (1 to %d printable characters "
				 "without spaces)",
				 t, FLARE_POOL_ID_MAX);
	snprintf(s->pool_instance_id, sizeof s->pool_instance_id, "%s", t);
	return 0;
}

static int set_remote(struct flare_settings *s, const struct flare_option *o, const char *t,
		      enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (strlen(t) >= FLARE_REMOTE_URL_MAX)
		return flare_bad(err, errlen, "URL is longer than %d bytes",
				 FLARE_REMOTE_URL_MAX - 1);
	if (sel_remote_url_check(t))
		return flare_bad(err, errlen, "%s", sel_errmsg());
	snprintf(s->remote, sizeof s->remote, "%s", t);
	return 0;
}

static int set_encrypt(struct flare_settings *s, const struct flare_option *o, const char *t,
		       enum flare_vtype vt, char *err, size_t errlen)
{
	(void)o;
	(void)vt;
	if (!strcasecmp(t, "on") || !strcmp(t, "true"))
		s->remote_encrypt = true;
	else if (!strcasecmp(t, "off") || !strcmp(t, "false"))
		s->remote_encrypt = false;
	else
		return flare_bad(err, errlen, "'%s' is not on or off", t);
	return 0;
}

typedef int setter(struct flare_settings *s, const struct flare_option *o, const char *t,
		   enum flare_vtype vt, char *err, size_t errlen);
/* The setter of each kind: a table is the clearest form of "one rule per
 * kind of value". */
static setter *const setters[] = {
	[FLARE_K_NONE] = set_none,       [FLARE_K_PATH] = set_path,
	[FLARE_K_HOST] = set_host,       [FLARE_K_PORT] = set_port,
	[FLARE_K_COUNT] = set_count,     [FLARE_K_SIZE] = set_size,
	[FLARE_K_MODE] = set_mode,       [FLARE_K_DRAIN] = set_drain,
	[FLARE_K_AGE] = set_age,         [FLARE_K_FETCH] = set_fetch,
	[FLARE_K_SWITCH] = set_switch,   [FLARE_K_INTERVAL] = set_interval,
	[FLARE_K_ORIGINS] = set_origins, [FLARE_K_SECRET] = set_secret,
	[FLARE_K_BOOL] = set_bool,       [FLARE_K_ENDPOINT] = set_endpoint,
	[FLARE_K_POOL] = set_pool,       [FLARE_K_NAME] = set_name,
	[FLARE_K_REMOTE] = set_remote,   [FLARE_K_ENCRYPT] = set_encrypt,
	[FLARE_K_OVERLAP] = set_overlap, [FLARE_K_SCHED] = set_sched,
};

/* A value from the config file must have the TOML type its option takes. */
static int check_vtype(const struct flare_option *o, const char *t, enum flare_vtype vt, char *err,
		       size_t errlen)
{
	bool want_string = false, want_int = false;
	switch (o->kind) {
	case FLARE_K_PATH:
	case FLARE_K_HOST:
	case FLARE_K_MODE:
	case FLARE_K_ORIGINS:
	case FLARE_K_SECRET:
	case FLARE_K_FETCH:
	case FLARE_K_OVERLAP:
	case FLARE_K_SCHED:
	case FLARE_K_ENDPOINT:
	case FLARE_K_POOL:
	case FLARE_K_NAME:
	case FLARE_K_REMOTE: want_string = true; break;
	case FLARE_K_PORT:
	case FLARE_K_COUNT: want_int = true; break;
	default: break;
	}
	if (vt == FLARE_V_TEXT)
		return 0; /* from the command line: the setter reads it */
	if (vt == FLARE_V_BOOL && o->kind != FLARE_K_DRAIN && o->kind != FLARE_K_SWITCH &&
	    o->kind != FLARE_K_BOOL && o->kind != FLARE_K_ENCRYPT)
		return flare_bad(err, errlen, "expected %s, not the boolean %s",
				 want_int ? "an integer" : "a string", t);
	if (want_string && vt != FLARE_V_STRING)
		return flare_bad(err, errlen, "expected a string, not %s %s (write it in quotes)",
				 vtype_name(vt), t);
	if (want_int && vt != FLARE_V_INTEGER)
		return flare_bad(err, errlen, "expected an integer, not %s \"%s\"", vtype_name(vt),
				 t);
	return 0;
}

int flare_settings_set(struct flare_settings *s, const struct flare_option *o, const char *t,
		       enum flare_vtype vt, char *err, size_t errlen)
{
	int rc = check_vtype(o, t, vt, err, errlen);
	if (rc)
		return rc;
	if ((size_t)o->kind >= sizeof setters / sizeof setters[0] || !setters[o->kind])
		return flare_bad(err, errlen, "takes no value");
	if ((rc = setters[o->kind](s, o, t, vt, err, errlen)))
		return rc;
	s->set |= 1ull << o->id;
	return 0;
}

void flare_settings_merge(struct flare_settings *d, const struct flare_settings *s)
{
	uint64_t m = s->set;
#define TAKE(opt, field)                                                                           \
	do {                                                                                       \
		if (m & (1ull << (opt)))                                                           \
			memcpy(&d->field, &s->field, sizeof d->field);                             \
	} while (0)
	TAKE(FLARE_OPT_CORE, core);
	TAKE(FLARE_OPT_CONFIG, config);
	TAKE(FLARE_OPT_HOST, host);
	TAKE(FLARE_OPT_PORT, port);
	TAKE(FLARE_OPT_MAX_ACTIVE, max_active);
	TAKE(FLARE_OPT_GPU_CACHE, gpu_cache);
	TAKE(FLARE_OPT_SPECULATE, speculate);
	TAKE(FLARE_OPT_DRAFT_TOKENS, draft_tokens);
	TAKE(FLARE_OPT_MEMORY, memory);
	TAKE(FLARE_OPT_DISK, disk);
	TAKE(FLARE_OPT_DISK_LIMIT, disk_limit);
	TAKE(FLARE_OPT_DRAIN, drain);
	TAKE(FLARE_OPT_DRAIN, drain_ns);
	TAKE(FLARE_OPT_MAX_AGE, max_age_ns);
	TAKE(FLARE_OPT_FETCH, fetch);
	TAKE(FLARE_OPT_OVERLAP, overlap);
	TAKE(FLARE_OPT_DASHBOARD, dashboard);
	TAKE(FLARE_OPT_DASHBOARD_INTERVAL, dashboard_ns);
	TAKE(FLARE_OPT_ALLOWED_ORIGINS, allowed_origins);
	TAKE(FLARE_OPT_API_KEY, api_key);
	TAKE(FLARE_OPT_API_KEY_FILE, api_key_file);
	TAKE(FLARE_OPT_METRICS_AUTH, metrics_auth);
	TAKE(FLARE_OPT_MAX_CONNECTIONS, max_connections);
	TAKE(FLARE_OPT_MAX_PER_CLIENT, max_per_client);
	TAKE(FLARE_OPT_IDLE_TIMEOUT, idle_timeout_ns);
	TAKE(FLARE_OPT_MAX_BUFFERED, max_buffered);
	TAKE(FLARE_OPT_RANKS, ranks);
	TAKE(FLARE_OPT_RANK, rank);
	TAKE(FLARE_OPT_RENDEZVOUS, rendezvous);
	TAKE(FLARE_OPT_MAX_IMAGE_BYTES, max_image_bytes);
	TAKE(FLARE_OPT_MAX_IMAGE_PIXELS, max_image_pixels);
	TAKE(FLARE_OPT_MAX_IMAGES, max_images);
	TAKE(FLARE_OPT_POOL, pool);
	TAKE(FLARE_OPT_POOL_INSTANCE_ID, pool_instance_id);
	TAKE(FLARE_OPT_POOL_WAIT, pool_wait_ns);
	TAKE(FLARE_OPT_POOL_GRACE, pool_grace_ns);
	TAKE(FLARE_OPT_REMOTE, remote);
	TAKE(FLARE_OPT_REMOTE_KEY, remote_key);
	TAKE(FLARE_OPT_REMOTE_ENCRYPT, remote_encrypt);
	TAKE(FLARE_OPT_OFFLOAD_SCHED, offload_sched);
#undef TAKE
	d->set |= m;
}
