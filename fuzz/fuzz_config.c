/*
 * fuzz_config.c - libFuzzer target for the `flare run` config file parser
 * (src/flare/config.c, the TOML subset of docs/configuration.md; STYLE.md
 * 13).  Its corpus, fuzz/corpus/config/, replays in make check through
 * build/fuzz/replay_config.
 *
 * Besides "never crashes, never reads past the text", it checks:
 *   1. The result is 0 or -EINVAL.
 *   2. A failure leaves one line that starts with "fuzz.toml:LINE: " and
 *      LINE is a line of the input.
 *   3. Whatever parses lies within the ranges the engine accepts
 *      (invariant 2 of settings.c), and only known settings are marked.
 *   4. Parsing is deterministic: the same text gives the same settings.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flare/config.h"
#include "helios/model.h"

static void fail(const char *what, const char *err)
{
	fprintf(stderr, "fuzz_config: %s (message '%s')\n", what, err);
	abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct flare_settings *a = malloc(sizeof *a), *b = malloc(sizeof *b);
	char err[2048], err2[2048];
	if (!a || !b) {
		free(a);
		free(b);
		return 0;
	}
	int rc = flare_config_parse((const char *)data, size, "fuzz.toml", a, err, sizeof err);
	int rc2 = flare_config_parse((const char *)data, size, "fuzz.toml", b, err2, sizeof err2);
	if (rc != rc2)
		fail("not deterministic", err);
	if (rc == 0) {
		if (memcmp(a, b, sizeof *a))
			fail("settings differ between two parses", "");
		uint32_t allowed = 0;
		for (int o = FLARE_OPT_HOST; o <= FLARE_OPT_DASHBOARD_INTERVAL; o++)
			allowed |= 1u << o;
		if (a->set & ~allowed)
			fail("a setting the file cannot hold is marked", "");
		if ((a->set & 1ull << FLARE_OPT_MAX_ACTIVE) &&
		    (a->max_active < 1 || a->max_active > FLARE_MAX_ACTIVE_MAX))
			fail("max_active out of range", "");
		if ((a->set & 1ull << FLARE_OPT_DRAFT_TOKENS) &&
		    (a->draft_tokens < 1 || a->draft_tokens > HEL_DRAFT_MAX))
			fail("draft_tokens out of range", "");
		if ((a->set & 1ull << FLARE_OPT_GPU_CACHE) && a->gpu_cache == 0)
			fail("gpu_cache zero", "");
		if ((a->set & 1ull << FLARE_OPT_DASHBOARD_INTERVAL) && a->dashboard_ns == 0)
			fail("dashboard interval zero", "");
		if ((a->set & 1ull << FLARE_OPT_DISK) && !a->disk[0])
			fail("empty disk path", "");
		if ((a->set & 1ull << FLARE_OPT_HOST) && !a->host[0])
			fail("empty host", "");
	} else {
		if (rc != -EINVAL)
			fail("unexpected return code", err);
		if (strcmp(err, err2))
			fail("messages differ between two parses", err);
		if (strncmp(err, "fuzz.toml:", 10))
			fail("message does not name the file", err);
		char *end;
		unsigned long line = strtoul(err + 10, &end, 10);
		if (line == 0 || strncmp(end, ": ", 2))
			fail("message does not name the line", err);
		size_t lines = 1;
		for (size_t i = 0; i < size; i++)
			lines += data[i] == '\n';
		if (line > lines)
			fail("line number past the end of the text", err);
		if (strchr(err, '\n'))
			fail("message is not one line", err);
	}
	free(a);
	free(b);
	return 0;
}
