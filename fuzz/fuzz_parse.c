/*
 * fuzz_parse.c - libFuzzer target for eos_parse_size, eos_parse_duration and
 * eos_format_size (STYLE.md 13).  Its corpus, fuzz/corpus/parse/, replays
 * in make check through build/fuzz/replay_parse.
 *
 * Besides "never crashes, never reads past the text", it checks:
 *   1. Failure returns -EINVAL or -ERANGE, leaves the output untouched and
 *      a one-line message that starts by naming what was parsed.
 *   2. A size formats to a text that parses back: exactly when the format
 *      needs no more than two decimals, else a little below.
 *   3. Texts of plain digits agree with strtoull.
 *   4. A duration parses the same with and without an off pointer, except
 *      "off" itself, which only the former accepts.
 * The first 8 bytes, read as a number, also go through the format check,
 * so formatting is fuzzed over the whole uint64 range, not only over the
 * values that parse.
 */
#include "eos.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TiB (1ull << 40)

static void fail(const char *what, const char *text)
{
	fprintf(stderr, "fuzz_parse: %s (text '%s', message '%s')\n", what, text, eos_errmsg());
	abort();
}

static void check_failure(int rc, const char *what, const char *text)
{
	if (rc != -EINVAL && rc != -ERANGE)
		fail("unexpected return code", text);
	const char *m = eos_errmsg();
	if (strncmp(m, what, strlen(what)) != 0)
		fail("message does not name what was parsed", text);
	if (strchr(m, '\n') || strlen(m) >= EOS_ERRMSG_MAX)
		fail("message is not one line", text);
}

static void check_format(uint64_t v)
{
	char buf[16];
	const char *s = eos_format_size(v, buf, sizeof buf);
	uint64_t back = 0;
	if (eos_parse_size(s, &back) != 0)
		fail("formatted size does not parse", s);
	uint64_t u = 1;
	while (u < TiB && v >= u * 1024)
		u *= 1024;
	if (back > v || (v - back) * 100 >= u + 100)
		fail("formatted size parses too far off", s);
	if ((v % u) * 100 % u == 0 && back != v)
		fail("exact formatted size parses to another value", s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';

	uint64_t v = 0xdeadbeef;
	int rc = eos_parse_size(text, &v);
	if (rc == 0) {
		check_format(v);
	} else {
		check_failure(rc, "size", text);
		if (v != 0xdeadbeef)
			fail("size written on failure", text);
	}

	/* Plain digits: the value strtoull gives, or -ERANGE where it overflows. */
	size_t n = strlen(text);
	if (n > 0 && strspn(text, "0123456789") == n) {
		errno = 0;
		unsigned long long want = strtoull(text, NULL, 10);
		if (errno == ERANGE ? rc != -ERANGE : (rc != 0 || v != want))
			fail("digits disagree with strtoull", text);
	}

	uint64_t d1 = 0xdeadbeef, d2 = 0xdeadbeef;
	bool off = true;
	int r1 = eos_parse_duration(text, &d1, &off);
	if (r1 != 0) {
		check_failure(r1, "duration", text);
		if (d1 != 0xdeadbeef || !off)
			fail("duration written on failure", text);
	}
	int r2 = eos_parse_duration(text, &d2, NULL);
	if (r2 != 0)
		check_failure(r2, "duration", text);
	bool is_off = strcasecmp(text, "off") == 0;
	if (is_off && (r1 != 0 || !off || d1 != 0 || r2 != -EINVAL))
		fail("'off' mishandled", text);
	if (!is_off && (r1 != r2 || (r1 == 0 && (d1 != d2 || off))))
		fail("duration differs with and without an off pointer", text);

	if (size >= 8) {
		uint64_t raw;
		memcpy(&raw, data, 8);
		check_format(raw);
	}
	free(text);
	return 0;
}
