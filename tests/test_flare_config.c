/*
 * test_flare_config.c - `flare run` settings: flags, the config file (the
 * TOML subset), precedence, --help, the disk directory decision and the
 * startup summary (src/flare/settings.c, cli.c, config.c, serve.c;
 * docs/configuration.md; design 2.11).
 *
 * Every error must name the flag and the value, or the file, the line and
 * the key: the tests check the message text, not only the return code.
 */
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eos.h"
#include "flare/cli.h"
#include "flare/config.h"
#include "flare/serve.h"
#include "helios/core.h"
#include "testutil.h"

#define NS 1000000000ull

static int parse_flags(struct flare_settings *s, char *err, size_t errlen, ...)
{
	char *argv[64];
	int argc = 0;
	argv[argc++] = "run";
	va_list ap;
	va_start(ap, errlen);
	for (char *a; (a = va_arg(ap, char *));)
		argv[argc++] = a;
	va_end(ap);
	err[0] = '\0';
	return flare_cli_parse(argc, argv, s, err, errlen);
}

#define FLAGS(s, ...) parse_flags(s, err, sizeof err, __VA_ARGS__, (char *)NULL)

static bool has(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* A flag error: -EINVAL and a message starting with the flag and quoting
 * the value. */
static void flag_bad(const char *flag, const char *value, const char *expect)
{
	struct flare_settings s;
	char err[1024];
	char eq[512];
	snprintf(eq, sizeof eq, "%s=%s", flag, value);
	/* Both spellings: --flag VALUE and --flag=VALUE. */
	for (int form = 0; form < 2; form++) {
		int rc = form ? FLAGS(&s, eq) : FLAGS(&s, flag, value);
		CHECKF(rc == -EINVAL, "%s %s accepted", flag, value);
		char head[128], quoted[300];
		snprintf(head, sizeof head, "%s: ", flag);
		snprintf(quoted, sizeof quoted, "'%s'", value);
		CHECKF(!strncmp(err, head, strlen(head)), "message '%s' does not start with %s",
		       err, head);
		CHECKF(has(err, quoted) || !*value, "message '%s' does not quote %s", err, quoted);
		if (expect)
			CHECKF(has(err, expect), "message '%s' lacks '%s'", err, expect);
	}
}

static void test_defaults(void)
{
	struct flare_settings s;
	flare_settings_defaults(&s);
	CHECK(s.set == 0);
	CHECK(!strcmp(s.host, "127.0.0.1"));
	CHECK(s.port == 8080);
	CHECK(s.max_active == 4);
	CHECK(s.gpu_cache == 64ull << 20);
	CHECK(s.speculate == SEL_MODE_ORDINARY);
	CHECK(s.draft_tokens == 4);
	CHECK(s.memory == 0 && s.disk[0] == 0 && !s.drain && s.max_age_ns == 0);
	CHECK(s.fetch == HEL_FETCH_AUTO);
	CHECK(s.dashboard == FLARE_DASHBOARD_AUTO && s.dashboard_ns == 5 * NS);
	CHECK(s.core[0] == 0);
}

static void test_flags(void)
{
	struct flare_settings s;
	char err[1024];
	CHECK_OK(FLAGS(&s, "--prefix-cache-memory", "8GiB", "--prefix-cache-disk", "/tmp/pc",
		       "--prefix-cache-disk-limit=100G", "--host", "0.0.0.0", "--port", "0",
		       "--gpu-cache", "1.5GiB", "--max-active", "16", "--speculate", "learned",
		       "--draft-tokens", "8", "--prefix-cache-max-age", "2h", "--dashboard=on",
		       "--dashboard-interval", "250ms", "--prefix-cache-fetch", "never",
		       "my.core"));
	CHECK(s.memory == 8ull << 30);
	CHECK(!strcmp(s.disk, "/tmp/pc"));
	CHECK(s.disk_limit == 100ull << 30);
	CHECK(!strcmp(s.host, "0.0.0.0"));
	CHECK(s.port == 0);
	CHECK(s.gpu_cache == 1610612736ull);
	CHECK(s.max_active == 16);
	CHECK(s.speculate == SEL_MODE_LEARNED);
	CHECK(s.draft_tokens == 8);
	CHECK(s.max_age_ns == 2 * 3600 * NS);
	CHECK(s.fetch == HEL_FETCH_NEVER);
	CHECK(s.dashboard == FLARE_DASHBOARD_ON && s.dashboard_ns == NS / 4);
	CHECK(!strcmp(s.core, "my.core"));
	uint64_t want = 0;
	for (int o = FLARE_OPT_HOST; o <= FLARE_OPT_DASHBOARD_INTERVAL; o++)
		if (o != FLARE_OPT_DRAIN)
			want |= 1ull << o;
	want |= 1ull << FLARE_OPT_CORE;
	CHECKF(s.set == want, "set %#llx want %#llx", (unsigned long long)s.set,
	       (unsigned long long)want);

	/* Only what was given is marked. */
	CHECK_OK(FLAGS(&s, "--port", "9000"));
	CHECK(s.set == 1ull << FLARE_OPT_PORT && s.port == 9000);
	CHECK_OK(parse_flags(&s, err, sizeof err, (char *)NULL));
	CHECK(s.set == 0);

	/* The drain flag: bare, =DURATION, =off, =on. */
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown"));
	CHECK(s.drain && s.drain_ns == 0 && (s.set & 1ull << FLARE_OPT_DRAIN));
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown=90s"));
	CHECK(s.drain && s.drain_ns == 90 * NS);
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown=off"));
	CHECK(!s.drain && (s.set & 1ull << FLARE_OPT_DRAIN));
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown=on"));
	CHECK(s.drain && s.drain_ns == 0);
	/* Issue 14 item 6: a value after a space is the flag's when it reads
	 * as one; otherwise the flag is bare and the argument is CORE. */
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown", "90s"));
	CHECK(s.drain && s.drain_ns == 90 * NS && !(s.set & 1ull << FLARE_OPT_CORE));
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown", "off", "my.core"));
	CHECK(!s.drain && !strcmp(s.core, "my.core"));
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown", "2m", "--port", "0"));
	CHECK(s.drain && s.drain_ns == 120 * NS && s.port == 0);
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown", "--port", "0"));
	CHECK(s.drain && s.drain_ns == 0 && s.port == 0);
	CHECK_OK(FLAGS(&s, "--prefix-cache-drain-on-shutdown", "x.core"));
	CHECK(s.drain && s.drain_ns == 0 && !strcmp(s.core, "x.core"));
	CHECK_OK(FLAGS(&s, "--prefix-cache-max-age", "off"));
	CHECK(s.max_age_ns == 0 && (s.set & 1ull << FLARE_OPT_MAX_AGE));
	CHECK_OK(FLAGS(&s, "--prefix-cache-max-age", "1.5"));
	CHECK(s.max_age_ns == 3 * NS / 2);
	CHECK_OK(FLAGS(&s, "--prefix-cache-fetch=always"));
	CHECK(s.fetch == HEL_FETCH_ALWAYS && s.set == 1ull << FLARE_OPT_FETCH);
	CHECK_OK(FLAGS(&s, "--prefix-cache-fetch", "auto"));
	CHECK(s.fetch == HEL_FETCH_AUTO && s.set == 1ull << FLARE_OPT_FETCH);
	CHECK_OK(FLAGS(&s, "--offload-sched", "batch"));
	CHECK(s.offload_sched == EOS_SCHED_BATCH && s.set == 1ull << FLARE_OPT_OFFLOAD_SCHED);
	CHECK_OK(FLAGS(&s, "--offload-sched=idle"));
	CHECK(s.offload_sched == EOS_SCHED_IDLE);
	CHECK_OK(FLAGS(&s, "--port", "1"));
	CHECK(s.offload_sched == EOS_SCHED_OTHER); /* the default */
	CHECK_OK(FLAGS(&s, "--speculate", "off"));
	CHECK(s.speculate == SEL_MODE_ORDINARY);
	CHECK_OK(FLAGS(&s, "--speculate", "copy", "--port", "1", "--port", "2"));
	CHECK(s.speculate == SEL_MODE_COPY && s.port == 2); /* the last wins */
	CHECK_OK(FLAGS(&s, "--", "--weird.core"));
	CHECK(!strcmp(s.core, "--weird.core"));
	CHECK_OK(FLAGS(&s, "--prefix-cache-memory", "0", "--prefix-cache-disk-limit", "0"));
	CHECK(s.memory == 0 && s.disk_limit == 0 && (s.set & 1ull << FLARE_OPT_DISK_LIMIT));

	/* Access and limits (issue 14 items 4, 12; issue 12 item 6). */
	CHECK_OK(FLAGS(&s, "--allowed-origins", "https://a.example, http://localhost:3000",
		       "--api-key", "sk-1", "--metrics-auth", "on", "--max-connections", "100",
		       "--max-connections-per-client", "0", "--idle-timeout", "5s",
		       "--max-buffered-bytes", "16MiB"));
	CHECK(!strcmp(s.allowed_origins, "https://a.example,http://localhost:3000"));
	CHECK(!strcmp(s.api_key, "sk-1") && s.metrics_auth);
	CHECK(s.max_connections == 100 && s.max_per_client == 0 && s.idle_timeout_ns == 5 * NS);
	CHECK(s.max_buffered == 16ull << 20);
	CHECK_OK(FLAGS(&s, "--allowed-origins", "*", "--api-key-file", "/run/key"));
	CHECK(!strcmp(s.allowed_origins, "*") && !strcmp(s.api_key_file, "/run/key"));
	struct flare_settings d;
	flare_settings_defaults(&d);
	CHECK(!d.allowed_origins[0] && !d.api_key[0] && !d.metrics_auth);
	CHECK(d.max_connections == 1024 && d.max_per_client == 64 && d.idle_timeout_ns == 30 * NS);
	CHECK(d.max_buffered == 64ull << 20);

	CHECK(FLAGS(&s, "--help") == FLARE_CLI_HELP);
	CHECK(FLAGS(&s, "--port", "x", "--help") == -EINVAL); /* in order */
	CHECK(FLAGS(&s, "-h") == FLARE_CLI_HELP);
	CHECK(FLAGS(&s, "a.core", "--help") == FLARE_CLI_HELP);
}

static void test_flag_errors(void)
{
	struct flare_settings s;
	char err[1024];
	flag_bad("--prefix-cache-memory", "8X", "is not a size: unknown unit 'X'");
	flag_bad("--prefix-cache-memory", "-1", "not a size");
	flag_bad("--prefix-cache-disk-limit", "lots", "not a size");
	flag_bad("--gpu-cache", "0", "positive");
	flag_bad("--gpu-cache", "1.5", "not a size");
	flag_bad("--port", "80x", "port number");
	flag_bad("--port", "65536", "port number");
	flag_bad("--port", "-1", "port number");
	flag_bad("--max-active", "0", "from 1 to 4096");
	flag_bad("--max-active", "4097", "from 1 to 4096");
	flag_bad("--max-active", "two", "whole number");
	flag_bad("--draft-tokens", "17", "from 1 to 16");
	flag_bad("--speculate", "fast", "off, copy, learned");
	flag_bad("--prefix-cache-max-age", "0", "positive");
	flag_bad("--prefix-cache-max-age", "2y", "not a duration");
	flag_bad("--dashboard", "sometimes", "auto, on or off");
	flag_bad("--prefix-cache-fetch", "sometimes", "not a fetch mode (auto, always, never)");
	flag_bad("--prefix-cache-fetch", "Always", "not a fetch mode");
	flag_bad("--offload-sched", "fifo",
		 "'fifo' is not a scheduling class (other, batch, idle)");
	flag_bad("--dashboard-interval", "0", "positive");
	flag_bad("--dashboard-interval", "off", "not a duration");
	flag_bad("--host", "a b", "not an address");
	flag_bad("--prefix-cache-disk", "", "not a path");
	flag_bad("--config", "", "not a path");
	flag_bad("--allowed-origins", "example.com", "not an origin list");
	flag_bad("--allowed-origins", "https://a.example/path", "not an origin list");
	flag_bad("--allowed-origins", "https://a.example,,", "not an origin list");
	flag_bad("--metrics-auth", "maybe", "on or off");
	flag_bad("--max-connections", "0", "from 1 to");
	flag_bad("--idle-timeout", "0", "positive");
	flag_bad("--max-buffered-bytes", "0", "positive");
	/* A bad key is refused without being quoted back. */
	CHECK(FLAGS(&s, "--api-key", "has space") == -EINVAL);
	CHECKF(has(err, "--api-key: the key must be") && !has(err, "has space"), "%s", err);
	CHECK(FLAGS(&s, "--api-key", "") == -EINVAL);

	/* The drain flag's bad values after '='. */
	CHECK(FLAGS(&s, "--prefix-cache-drain-on-shutdown=0") == -EINVAL);
	CHECKF(!strncmp(err, "--prefix-cache-drain-on-shutdown: '0'", 37), "%s", err);
	CHECK(FLAGS(&s, "--prefix-cache-drain-on-shutdown=soon") == -EINVAL);
	CHECKF(has(err, "'soon' is not on, off or a duration"), "%s", err);

	CHECK(FLAGS(&s, "--prefix-cache-memroy", "8G") == -EINVAL);
	CHECKF(has(err, "unknown flag '--prefix-cache-memroy'"), "%s", err);
	CHECK(FLAGS(&s, "--nope=3") == -EINVAL);
	CHECKF(has(err, "unknown flag '--nope'"), "%s", err);
	CHECK(FLAGS(&s, "--port") == -EINVAL);
	CHECKF(has(err, "--port: missing value"), "%s", err);
	CHECK(FLAGS(&s, "--help=yes") == -EINVAL);
	CHECKF(has(err, "--help: takes no value"), "%s", err);
	CHECK(FLAGS(&s, "a.core", "b.core") == -EINVAL);
	CHECKF(has(err, "'b.core'") && has(err, "'a.core'"), "%s", err);
}

static void test_help(void)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	CHECK(f);
	flare_cli_help(f);
	fclose(f);
	size_t n;
	const struct flare_option *o = flare_options(&n);
	CHECK(n >= 15);
	for (size_t i = 0; i < n; i++) {
		CHECKF(has(text, o[i].flag), "--help lacks %s", o[i].flag);
		if (o[i].kind == FLARE_K_NONE)
			continue;
		/* The flag's line is followed by its default (and file key). */
		char word[64]; /* the flag as a word: --rank is not --ranks */
		snprintf(word, sizeof word, "%s ", o[i].flag);
		const char *at = strstr(text, word);
		CHECKF(at, "--help lacks '%s'", word);
		const char *def = strstr(at, "default: ");
		CHECKF(def, "%s has no default in --help", o[i].flag);
		CHECKF(!strncmp(def + 9, o[i].defval, strlen(o[i].defval)),
		       "%s: default in --help is not '%s'", o[i].flag, o[i].defval);
		if (o[i].section) {
			char key[96];
			snprintf(key, sizeof key, "file: [%s] %s", o[i].section, o[i].key);
			CHECKF(has(text, key), "--help lacks '%s'", key);
		}
	}
	CHECK(has(text, "default: 8080"));
	CHECK(has(text, "default: 127.0.0.1"));
	CHECK(has(text, "default: 64MiB"));
	CHECK(has(text, "--prefix-cache-drain-on-shutdown [DURATION|on|off]"));
	CHECK(has(text, "usage: flare run [OPTIONS] [CORE]"));
	free(text);
}

/* ---- the config file --------------------------------------------------------- */

static int cfg(struct flare_settings *s, char *err, size_t errlen, const char *text)
{
	err[0] = '\0';
	return flare_config_parse(text, strlen(text), "t.toml", s, err, errlen);
}

#define CFG(s, text) cfg(s, err, sizeof err, text)

static void cfg_bad(const char *text, const char *line_prefix, const char *expect)
{
	struct flare_settings s;
	char err[1024];
	CHECKF(CFG(&s, text) == -EINVAL, "accepted: %s", text);
	CHECKF(!strncmp(err, line_prefix, strlen(line_prefix)), "'%s' does not start with '%s'",
	       err, line_prefix);
	CHECKF(has(err, expect), "'%s' lacks '%s'", err, expect);
}

static void test_config(void)
{
	struct flare_settings s;
	char err[1024];
	CHECK_OK(CFG(&s, "# flare.toml\n"
			 "\n"
			 "[prefix_cache]\n"
			 "memory = \"8GiB\"            # warm tier\n"
			 "disk = '/var/cache/flare'\n"
			 "disk_limit = 1_000_000_000\n"
			 "drain_on_shutdown = \"90s\"\n"
			 "max_age = \"2h\"\n"
			 "fetch = \"always\"\n"
			 "\r\n"
			 "  [ server ]  \n"
			 "\thost = \"::1\"\n"
			 "port = 0\n"
			 "max_active = 8\n"
			 "gpu_cache = \"256MiB\"\n"
			 "speculate = \"copy\"\n"
			 "draft_tokens = 2\n"
			 "dashboard = false\n"
			 "dashboard_interval = 10"));
	CHECK(s.memory == 8ull << 30);
	CHECK(!strcmp(s.disk, "/var/cache/flare"));
	CHECK(s.disk_limit == 1000000000ull);
	CHECK(s.drain && s.drain_ns == 90 * NS);
	CHECK(s.max_age_ns == 7200 * NS);
	CHECK(s.fetch == HEL_FETCH_ALWAYS && (s.set & 1ull << FLARE_OPT_FETCH));
	CHECK(!strcmp(s.host, "::1"));
	CHECK(s.port == 0 && (s.set & 1ull << FLARE_OPT_PORT));
	CHECK(s.max_active == 8 && s.gpu_cache == 256ull << 20);
	CHECK(s.speculate == SEL_MODE_COPY && s.draft_tokens == 2);
	CHECK(s.dashboard == FLARE_DASHBOARD_OFF && s.dashboard_ns == 10 * NS);

	/* The access and limit keys. */
	CHECK_OK(CFG(&s,
		     "[server]\nallowed_origins = \"*\"\napi_key_file = \"/run/flare.key\"\n"
		     "metrics_auth = true\nmax_connections = 10\nmax_connections_per_client = 2\n"
		     "idle_timeout = 5\nmax_buffered_bytes = \"1MiB\"\n"));
	CHECK(!strcmp(s.allowed_origins, "*") && !strcmp(s.api_key_file, "/run/flare.key"));
	CHECK(s.metrics_auth && s.max_connections == 10 && s.max_per_client == 2);
	CHECK(s.idle_timeout_ns == 5 * NS && s.max_buffered == 1ull << 20);
	CHECK_OK(CFG(
		&s,
		"[server]\napi_key = \"sk-file\"\nmetrics_auth = \"off\"\nallowed_origins = \"\"\n"));
	CHECK(!strcmp(s.api_key, "sk-file") && !s.metrics_auth && !s.allowed_origins[0]);

	/* Other spellings. */
	CHECK_OK(CFG(&s, "\xef\xbb\xbf[prefix_cache]\ndrain_on_shutdown = true\nmax_age = \"off\"\n"
			 "memory = 0\n"));
	CHECK(s.drain && s.drain_ns == 0 && s.max_age_ns == 0 && s.memory == 0);
	CHECK(s.set ==
	      (1ull << FLARE_OPT_DRAIN | 1ull << FLARE_OPT_MAX_AGE | 1ull << FLARE_OPT_MEMORY));
	CHECK_OK(CFG(&s, "[prefix_cache]\ndrain_on_shutdown = \"on\"\nmax_age = 3600\n"));
	CHECK(s.drain && s.drain_ns == 0 && s.max_age_ns == 3600 * NS);
	CHECK_OK(CFG(&s, "[prefix_cache]\ndrain_on_shutdown = \"off\"\n"));
	CHECK(!s.drain);
	CHECK_OK(
		CFG(&s, "[prefix_cache]\ndrain_on_shutdown = 30\ndisk = \"a\\\"b\\\\c\\u00e9\"\n"));
	CHECK(s.drain && s.drain_ns == 30 * NS);
	CHECK(!strcmp(s.disk, "a\"b\\c\xc3\xa9"));
	CHECK_OK(CFG(&s, ""));
	CHECK(s.set == 0);
	CHECK_OK(CFG(&s, "[server]\n[prefix_cache]\n# nothing\n"));
	CHECK(s.set == 0);
	CHECK_OK(CFG(&s, "[server]\nport = +80"));
	CHECK(s.port == 80);
	/* Ranks in separate processes (docs/multihost.md "Execution"). */
	CHECK_OK(CFG(&s, "[ranks]\nranks = 4\nrank = 3\nrendezvous = \"[fd00::1]:7000\"\n"));
	CHECK(s.ranks == 4 && s.rank == 3 && !strcmp(s.rendezvous, "[fd00::1]:7000"));
	CHECK(s.set ==
	      (1ull << FLARE_OPT_RANKS | 1ull << FLARE_OPT_RANK | 1ull << FLARE_OPT_RENDEZVOUS));
	cfg_bad("[ranks]\nrendezvous = \"10.0.0.1\"\n",
		"t.toml:2: ranks.rendezvous: ", "is not HOST:PORT");
	cfg_bad("[ranks]\nranks = 65\n", "t.toml:2: ranks.ranks: ", "from 1 to 64");
}

static void test_config_errors(void)
{
	cfg_bad("[prefix_cache]\nmemory = \"8X\"\n",
		"t.toml:2: prefix_cache.memory: ", "'8X' is not a size");
	cfg_bad("[prefix_cache]\nmemroy = \"8G\"\n",
		"t.toml:2: ", "unknown key 'memroy' in [prefix_cache]");
	cfg_bad("[server]\nmemory = \"8G\"\n", "t.toml:2: ", "unknown key 'memory' in [server]");
	cfg_bad("\n[cache]\n", "t.toml:2: ", "unknown section [cache]");
	cfg_bad("port = 80\n", "t.toml:1: ", "key 'port' outside a section");
	cfg_bad("[server]\nport = 80\nport = 81\n", "t.toml:3: server.port: ", "first on line 2");
	cfg_bad("[server]\n[prefix_cache]\n[server]\n",
		"t.toml:3: ", "section [server] appears twice");
	cfg_bad("[server]\nport = \"80\"\n", "t.toml:2: server.port: ", "expected an integer");
	cfg_bad("[server]\nport = 65536\n", "t.toml:2: server.port: ", "'65536' is not a port");
	cfg_bad("[server]\nport = -1\n", "t.toml:2: server.port: ", "negative");
	cfg_bad("[server]\nport = 080\n", "t.toml:2: server.port: ", "leading zeros");
	cfg_bad("[server]\nport = 0x50\n", "t.toml:2: server.port: ", "decimal");
	cfg_bad("[server]\nport = 1__0\n", "t.toml:2: server.port: ", "underscore");
	cfg_bad("[server]\nhost = 127\n", "t.toml:2: server.host: ", "expected a string");
	cfg_bad("[server]\nhost = true\n", "t.toml:2: server.host: ", "boolean");
	cfg_bad("[server]\nhost = localhost\n", "t.toml:2: server.host: ", "strings need quotes");
	cfg_bad("[prefix_cache]\nmemory = 8G\n",
		"t.toml:2: prefix_cache.memory: ", "strings need quotes");
	cfg_bad("[prefix_cache]\nmemory = 1.5\n",
		"t.toml:2: prefix_cache.memory: ", "floats are not supported");
	cfg_bad("[prefix_cache]\nmemory = [1]\n",
		"t.toml:2: prefix_cache.memory: ", "arrays are not supported");
	cfg_bad("[prefix_cache]\nmemory = {a = 1}\n",
		"t.toml:2: prefix_cache.memory: ", "inline tables are not supported");
	cfg_bad("[prefix_cache]\nmemory = \"8G\n", "t.toml:2: prefix_cache.memory: ", "no closing");
	cfg_bad("[prefix_cache]\nmemory = \"\"\"8G\"\"\"\n",
		"t.toml:2: prefix_cache.memory: ", "multi-line");
	cfg_bad("[prefix_cache]\ndisk = \"a\\qb\"\n",
		"t.toml:2: prefix_cache.disk: ", "unknown escape \\q");
	cfg_bad("[prefix_cache]\ndisk = \"a\\u00\"\n",
		"t.toml:2: prefix_cache.disk: ", "hexadecimal digits");
	cfg_bad("[prefix_cache]\ndisk = \"a\\u0000\"\n",
		"t.toml:2: prefix_cache.disk: ", "not an allowed");
	cfg_bad("[prefix_cache]\ndisk = \"a\tb\x01\"\n",
		"t.toml:2: prefix_cache.disk: ", "control character");
	cfg_bad("[prefix_cache]\nmemory \"8G\"\n", "t.toml:2: memory: ", "expected '='");
	cfg_bad("[prefix_cache]\nmemory =\n",
		"t.toml:2: prefix_cache.memory: ", "expected a value");
	cfg_bad("[prefix_cache]\nmemory = # none\n",
		"t.toml:2: prefix_cache.memory: ", "expected a value");
	cfg_bad("[prefix_cache]\nmemory = \"8G\" \"9G\"\n",
		"t.toml:2: prefix_cache.memory: ", "unexpected text after the value");
	cfg_bad("[prefix_cache]\nmemory.x = 1\n", "t.toml:2: memory: ", "dotted keys");
	cfg_bad("[prefix_cache]\n\"memory\" = 1\n", "t.toml:2: ", "quoted keys");
	cfg_bad("[[prefix_cache]]\n", "t.toml:1: ", "arrays of tables");
	cfg_bad("[prefix_cache.x]\n", "t.toml:1: ", "dotted and quoted section names");
	cfg_bad("[prefix_cache\n", "t.toml:1: ", "not a section header");
	cfg_bad("[server] port = 1\n",
		"t.toml:1: ", "unexpected text after the section header [server]");
	cfg_bad("[server]\n= 1\n", "t.toml:2: ", "not a 'key = value' line");
	cfg_bad("[server]\nspeculate = \"fast\"\n",
		"t.toml:2: server.speculate: ", "off, copy, learned");
	cfg_bad("[server]\ndashboard_interval = \"0s\"\n",
		"t.toml:2: server.dashboard_interval: ", "positive");
	cfg_bad("[prefix_cache]\ndrain_on_shutdown = \"soon\"\n",
		"t.toml:2: prefix_cache.drain_on_shutdown: ",
		"'soon' is not on, off or a duration");
	cfg_bad("[prefix_cache]\ndrain_on_shutdown = 0\n",
		"t.toml:2: prefix_cache.drain_on_shutdown: ", "positive");
	cfg_bad("[prefix_cache]\nmax_age = \"0\"\n",
		"t.toml:2: prefix_cache.max_age: ", "positive");
	cfg_bad("[prefix_cache]\nmax_age = true\n", "t.toml:2: prefix_cache.max_age: ", "boolean");
	cfg_bad("[prefix_cache]\nfetch = \"maybe\"\n", "t.toml:2: prefix_cache.fetch: ",
		"'maybe' is not a fetch mode (auto, always, never)");
	cfg_bad("[prefix_cache]\nfetch = true\n", "t.toml:2: prefix_cache.fetch: ", "boolean");
	cfg_bad("[prefix_cache]\noffload_sched = 10\n",
		"t.toml:2: prefix_cache.offload_sched: ", "expected a string");
	cfg_bad("[prefix_cache]\nfetch = 1\n",
		"t.toml:2: prefix_cache.fetch: ", "expected a string");
	cfg_bad("[server]\nmax_active = 1979-05-27\n", "t.toml:2: server.max_active: ", "dates");

	/* A NUL byte (the text is not a C string). */
	struct flare_settings s;
	char err[512];
	CHECK(flare_config_parse("[server]\nport = 1\0\n", 19, "t.toml", &s, err, sizeof err) ==
	      -EINVAL);
	CHECKF(!strncmp(err, "t.toml:2: ", 10) && has(err, "NUL"), "%s", err);

	/* Loading: a missing file names its path. */
	CHECK(flare_config_load("/nonexistent/flare.toml", &s, err, sizeof err) < 0);
	CHECKF(has(err, "--config: cannot open '/nonexistent/flare.toml'"), "%s", err);
	char *dir = test_mkdtemp("flare-config");
	char path[4096];
	snprintf(path, sizeof path, "%s/flare.toml", dir);
	FILE *f = fopen(path, "w");
	CHECK(f);
	fputs("[server]\nport = 9000\n[prefix_cache]\nmemory = \"1GiB\"\nmax_age = \"x\"\n", f);
	fclose(f);
	CHECK(flare_config_load(path, &s, err, sizeof err) == -EINVAL);
	char want[4200];
	snprintf(want, sizeof want, "%s:5: prefix_cache.max_age: 'x' is not a duration", path);
	CHECKF(!strncmp(err, want, strlen(want)), "%s", err);
	test_rmtree(dir);
	free(dir);
}

static void test_precedence(void)
{
	struct flare_settings def, file, flags;
	char err[1024];
	flare_settings_defaults(&def);
	CHECK_OK(cfg(&file, err, sizeof err,
		     "[server]\nport = 9000\nmax_active = 2\n"
		     "[prefix_cache]\nmemory = \"1GiB\"\ndrain_on_shutdown = \"on\"\n"));
	CHECK_OK(FLAGS(&flags, "--port", "9001", "--prefix-cache-drain-on-shutdown=off", "x.core"));
	flare_settings_merge(&def, &file);
	CHECK(def.port == 9000 && def.max_active == 2 && def.memory == 1ull << 30 && def.drain);
	flare_settings_merge(&def, &flags);
	CHECK(def.port == 9001);             /* the flag wins */
	CHECK(def.max_active == 2);          /* the file's */
	CHECK(def.memory == 1ull << 30);     /* the file's */
	CHECK(!def.drain);                   /* =off overrides the file's on */
	CHECK(def.gpu_cache == 64ull << 20); /* the default */
	CHECK(!strcmp(def.host, "127.0.0.1"));
	CHECK(!strcmp(def.core, "x.core"));
}

/* ---- the disk directory (design 2.11) and the summary ---------------------------- */

static void test_disk_resolve(void)
{
	char *dir = test_mkdtemp("flare-disk");
	struct flare_settings s;
	char err[1024], note[8192], path[4096];
	flare_settings_defaults(&s);
	CHECK(flare_disk_resolve(&s, note, sizeof note) == NULL && note[0] == 0);

	/* A missing directory is created. */
	snprintf(path, sizeof path, "%s/a/b", dir);
	CHECK_OK(FLAGS(&s, "--prefix-cache-disk", path));
	const char *d = flare_disk_resolve(&s, note, sizeof note);
	CHECK(d && !strcmp(d, path) && note[0] == 0);
	struct stat st;
	CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));

	/* Limit 0: no disk store, nothing created. */
	snprintf(path, sizeof path, "%s/never", dir);
	CHECK_OK(FLAGS(&s, "--prefix-cache-disk", path, "--prefix-cache-disk-limit", "0"));
	CHECK(flare_disk_resolve(&s, note, sizeof note) == NULL);
	CHECKF(has(note, "--prefix-cache-disk-limit 0"), "%s", note);
	CHECK(stat(path, &st) == -1 && errno == ENOENT);

	/* Unusable: a file where a directory should be. */
	snprintf(path, sizeof path, "%s/file", dir);
	FILE *f = fopen(path, "w");
	CHECK(f);
	fclose(f);
	char sub[4200];
	snprintf(sub, sizeof sub, "%s/sub", path);
	CHECK_OK(FLAGS(&s, "--prefix-cache-disk", sub));
	CHECK(flare_disk_resolve(&s, note, sizeof note) == NULL);
	CHECKF(has(note, sub) && has(note, "not usable"), "%s", note);
	/* Unwritable (when not root: root writes anyway). */
	if (geteuid() != 0) {
		snprintf(path, sizeof path, "%s/ro", dir);
		CHECK(mkdir(path, 0555) == 0);
		CHECK_OK(FLAGS(&s, "--prefix-cache-disk", path));
		CHECK(flare_disk_resolve(&s, note, sizeof note) == NULL);
		CHECKF(has(note, "not writable"), "%s", note);
		chmod(path, 0755);
	}
	/* The probe leaves nothing behind. */
	snprintf(path, sizeof path, "%s/a/b", dir);
	CHECK_OK(FLAGS(&s, "--prefix-cache-disk", path));
	CHECK(flare_disk_resolve(&s, note, sizeof note));
	CHECK(rmdir(path) == 0);
	test_rmtree(dir);
	free(dir);
}

static void test_summary(void)
{
	hel_core *core;
	CHECK_OK(hel_core_builtin(&core));
	struct flare_settings s;
	flare_settings_defaults(&s);
	hel_engine_info info;
	memset(&info, 0, sizeof info);
	info.store = "composite";
	info.transport = "host";
	info.disk_note = "";
	info.slots_total = 1000;
	info.intake_slots = 200;
	info.slot_bytes = 8704;
	info.memory_bytes = 1ull << 30;
	snprintf(info.disk_dir, sizeof info.disk_dir, "/var/cache/tiny-00-11");
	info.disk_limit = 10ull << 30;
	info.scanned_records = 42;
	info.gpu_pages = 7710;
	info.gpu_rows = 64;
	info.max_active = 4;
	snprintf(info.warning, sizeof info.warning, "intake shrunk");
	struct flare_buf b = {0};
	flare_serve_summary(&b, &s, core, &info, "");
	const char *want[] = {"core 'tiny'",
			      "8192-token context",
			      "speculate off",
			      "max-active 4",
			      "GPU cache 64 MiB: 7710 pages, 64 rows",
			      "composite store",
			      "transport host",
			      "pool 1000 slots of 8.5 KiB",
			      "intake 200 slots",
			      "memory 1 GiB",
			      "directory /var/cache/tiny-00-11",
			      "limit 10 GiB",
			      "42 records scanned",
			      "flare: warning: intake shrunk\n"};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		CHECKF(has(b.data, want[i]), "summary lacks '%s':\n%s", want[i], b.data);
	flare_buf_free(&b);

	info.store = "disabled";
	info.warning[0] = 0;
	flare_serve_summary(&b, &s, core, &info, "'/x' is not usable: Not a directory");
	CHECKF(has(b.data, "prefix cache: disabled; warning: no disk store: '/x' is not usable"),
	       "%s", b.data);
	flare_buf_free(&b);
	hel_core_free(core);
}

int main(void)
{
	test_defaults();
	test_flags();
	test_flag_errors();
	test_help();
	test_config();
	test_config_errors();
	test_precedence();
	test_disk_resolve();
	test_summary();
	printf("ok\n");
	return 0;
}
