/*
 * cli.c - the flags of `flare run`: parsing and --help (design 2.11;
 * docs/configuration.md).
 *
 * DESIGN
 * A small hand-written parser instead of getopt_long: getopt prints its own
 * messages and keeps global state, while ours must name the flag and the
 * value in one line the caller prints ("flare: --port: 'x' is not a port
 * number (0-65535)") and must be callable from tests any number of times.
 * Values are read by settings.c, the same code that reads the config file.
 *
 * Invariants:
 *   1. A flag given twice takes its last value (the usual convention).
 *   2. On error, *out is unspecified; nothing else is touched.
 */
#include "flare/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

static const struct flare_option core_option = {
	FLARE_OPT_CORE,       NULL, "CORE", NULL,  NULL,
	FLARE_K_PATH,         0,    0,      false, "the built-in tiny core",
	"core file to serve",
};

static int set_value(struct flare_settings *out, const struct flare_option *o, const char *name,
		     const char *value, char *err, size_t errlen)
{
	char why[768];
	if (flare_settings_set(out, o, value, FLARE_V_TEXT, why, sizeof why))
		return flare_bad(err, errlen, "%s: %s", name, why);
	return 0;
}

int flare_cli_parse(int argc, char *const argv[], struct flare_settings *out, char *err,
		    size_t errlen)
{
	memset(out, 0, sizeof *out);
	bool flags_done = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (flags_done || a[0] != '-' || !strcmp(a, "-")) {
			if (out->set & (1ull << FLARE_OPT_CORE))
				return flare_bad(
					err, errlen,
					"unexpected argument '%s' (CORE was already given as '%s')",
					a, out->core);
			int rc = set_value(out, &core_option, "CORE", a, err, errlen);
			if (rc)
				return rc;
			continue;
		}
		if (!strcmp(a, "--")) {
			flags_done = true;
			continue;
		}
		if (!strcmp(a, "-h"))
			return FLARE_CLI_HELP;
		const char *eq = strchr(a, '=');
		size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
		const struct flare_option *o = flare_option_by_flag(a, nlen);
		if (!o)
			return flare_bad(err, errlen,
					 "unknown flag '%.*s' (flare run --help lists them)",
					 (int)nlen, a);
		char name[64];
		snprintf(name, sizeof name, "%s", o->flag);
		if (o->kind == FLARE_K_NONE) {
			if (eq)
				return flare_bad(err, errlen, "%s: takes no value (got '%s')", name,
						 eq + 1);
			if (o->id == FLARE_OPT_HELP)
				return FLARE_CLI_HELP;
			continue;
		}
		const char *value;
		if (eq) {
			value = eq + 1;
		} else if (o->optional_value) {
			/* The next argument is the value when it reads as one
			 * (--prefix-cache-drain-on-shutdown 90s); else the flag
			 * is bare and the argument is whatever it is (CORE). */
			struct flare_settings probe = {0};
			char why[256];
			value = "on";
			if (i + 1 < argc && argv[i + 1][0] != '-' &&
			    flare_settings_set(&probe, o, argv[i + 1], FLARE_V_TEXT, why,
					       sizeof why) == 0)
				value = argv[++i];
		} else {
			if (i + 1 >= argc)
				return flare_bad(err, errlen, "%s: missing value (%s %s)", name,
						 name, o->metavar);
			value = argv[++i];
		}
		int rc = set_value(out, o, name, value, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

void flare_cli_help(FILE *f)
{
	size_t n;
	const struct flare_option *opts = flare_options(&n);
	fprintf(f,
		"usage: flare run [OPTIONS] [CORE]\n"
		"\n"
		"Serve CORE (a core file; default: the built-in tiny core) over an\n"
		"OpenAI-compatible HTTP API until SIGINT or SIGTERM.  Settings come from\n"
		"the defaults, then the --config file, then these flags (the last wins).\n"
		"SIZE: 8GiB, 512MiB, 1.5G, 4096 (bytes).  DURATION: 90s, 250ms, 2h, 30 (seconds).\n"
		"\n"
		"Options:\n");
	for (size_t i = 0; i < n; i++) {
		const struct flare_option *o = &opts[i];
		char head[96];
		if (o->optional_value)
			snprintf(head, sizeof head, "%s%s", o->flag, o->metavar);
		else if (*o->metavar)
			snprintf(head, sizeof head, "%s %s", o->flag, o->metavar);
		else
			snprintf(head, sizeof head, "%s", o->flag);
		if (strlen(head) > 40)
			fprintf(f, "  %s\n  %-40s %s\n", head, "", o->help);
		else
			fprintf(f, "  %-40s %s\n", head, o->help);
		if (o->kind == FLARE_K_NONE)
			continue;
		fprintf(f, "  %-40s default: %s", "", o->defval);
		if (o->section)
			fprintf(f, "; file: [%s] %s", o->section, o->key);
		fputc('\n', f);
	}
	fprintf(f,
		"\nSee docs/configuration.md for the config file and docs/metrics.md for /metrics.\n");
}
