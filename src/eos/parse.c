/*
 * parse.c - the sizes and durations operators type ("8G", "1.5GiB", "90s",
 * "off"), and the sizes we print back (design 2.11 "Configuration and
 * defaults": --prefix-cache-memory SIZE, --prefix-cache-disk-limit SIZE;
 * design 2.5: --prefix-cache-drain-on-shutdown=DURATION, max_age).
 *
 * Pure code, no I/O (STYLE.md 3): fuzz/fuzz_parse.c links it alone.
 *
 * GRAMMAR (both parsers)
 *   text   = digits [ "." digits ] [ [ " " ] unit ]
 *   digits = one or more of 0-9
 *   No other characters: no sign, no leading or trailing whitespace, no
 *   exponent, no hex, no digit grouping.  A single space may separate the
 *   number from its unit, so that what eos_format_size prints ("1.5 GiB")
 *   parses back; anything else with whitespace is refused.  A fraction needs
 *   a digit on both sides of the point ("0.5G", not ".5G" or "5.G").
 *
 *   Sizes: units B; K, KB, KiB (1024); M, MB, MiB; G, GB, GiB; T, TB, TiB,
 *   all binary and case-insensitive.  A bare number is bytes and must be
 *   whole; a fraction needs a unit larger than B ("1.5G"), and the result
 *   is rounded down to whole bytes.
 *   Durations: units ns, us, ms, s, m, h, d (case-insensitive); a bare number
 *   is seconds and may have a fraction ("1.5" = 1.5 s); a fraction of "ns"
 *   is refused.  The result is rounded down to whole nanoseconds.  "off" in
 *   any case is a separate word, accepted only where the caller allows it.
 *
 * DESIGN
 *   Integer arithmetic only, so "1.5GiB" is exactly 1610612736 and no value
 *   depends on floating-point rounding.  The integer part is multiplied by
 *   the unit with an overflow check; the fraction 0.d1d2...dk times the unit
 *   is computed exactly, rounded down, by Horner's rule from the last digit,
 *   acc = (d_i * unit + acc) / 10: since floor(floor(x) / 10) equals
 *   floor(x / 10), every intermediate floor is harmless, acc stays below the
 *   unit, and any number of fraction digits is exact without big numbers.
 *   Syntax is checked before range, so "99999999999999999999X" is an unknown
 *   unit rather than an overflow.  Messages quote the text with
 *   non-printable bytes escaped and long texts cut, so any input yields a
 *   readable one-line message.  Stateless.
 */
#include "eos.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

struct unit {
	const char *name; /* lower case */
	uint64_t mult;
};

static const struct unit size_units[] = {
	{"b", 1},
	{"k", 1ull << 10},
	{"kb", 1ull << 10},
	{"kib", 1ull << 10},
	{"m", 1ull << 20},
	{"mb", 1ull << 20},
	{"mib", 1ull << 20},
	{"g", 1ull << 30},
	{"gb", 1ull << 30},
	{"gib", 1ull << 30},
	{"t", 1ull << 40},
	{"tb", 1ull << 40},
	{"tib", 1ull << 40},
};
#define SIZE_UNITS_TEXT "B, K, KiB, M, MiB, G, GiB, T, TiB"

#define NS_PER_S 1000000000ull
static const struct unit duration_units[] = {
	{"ns", 1},
	{"us", 1000},
	{"ms", 1000000},
	{"s", NS_PER_S},
	{"m", 60 * NS_PER_S},
	{"h", 3600 * NS_PER_S},
	{"d", 86400 * NS_PER_S},
};
#define DURATION_UNITS_TEXT "ns, us, ms, s, m, h, d"

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

/* Whole-string, ASCII-only, case-insensitive equality; lower is lower case. */
static bool eq_nocase(const char *s, const char *lower)
{
	for (; *s && *lower; s++, lower++)
		if (ascii_lower(*s) != *lower)
			return false;
	return *s == '\0' && *lower == '\0';
}

#define QUOTE_MAX 48                  /* input bytes shown before "..." */
#define QUOTE_BUF (QUOTE_MAX * 4 + 4) /* worst case: every byte as \xNN */

/* s (at most n bytes, stopping at NUL) made safe to show inside quotes in a
 * one-line message: backslash and non-printable bytes as \xNN, long texts
 * cut with "...". */
static const char *quote(const char *s, size_t n, char buf[QUOTE_BUF])
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0, i;
	for (i = 0; i < n && s[i] && i < QUOTE_MAX; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c < 0x7f && c != '\\') {
			buf[o++] = (char)c;
		} else {
			buf[o++] = '\\';
			buf[o++] = 'x';
			buf[o++] = hex[c >> 4];
			buf[o++] = hex[c & 15];
		}
	}
	if (i < n && s[i]) {
		memcpy(buf + o, "...", 3);
		o += 3;
	}
	buf[o] = '\0';
	return buf;
}

/* A number as the grammar above splits it. */
struct number {
	uint64_t whole;   /* integer part, valid when !too_big */
	bool too_big;     /* integer part exceeds UINT64_MAX */
	const char *frac; /* fraction digits, NULL when no point */
	size_t nfrac;
	const char *unit; /* unit text, NULL when bare */
};

/* Split text into a number and a unit per the grammar.  what is "size" or
 * "duration"; example, valid text already quoted, ends some messages. */
static int split(const char *what, const char *text, const char *example, struct number *n)
{
	char q[QUOTE_BUF], c[QUOTE_BUF];
	const char *p = text;

	memset(n, 0, sizeof *n);
	if (*p == '\0')
		return eos_fail(-EINVAL,
				"%s '': empty (expected a number with an optional unit, "
				"e.g. %s)",
				what, example);
	if (is_space(*p))
		return eos_fail(-EINVAL, "%s '%s': leading whitespace (expected a number, e.g. %s)",
				what, quote(text, SIZE_MAX, q), example);
	if (is_space(text[strlen(text) - 1]))
		return eos_fail(-EINVAL,
				"%s '%s': trailing whitespace (expected a number with an "
				"optional unit, e.g. %s)",
				what, quote(text, SIZE_MAX, q), example);
	if (*p == '-')
		return eos_fail(-EINVAL, "%s '%s': cannot be negative", what,
				quote(text, SIZE_MAX, q));
	if (!is_digit(*p))
		return eos_fail(-EINVAL,
				"%s '%s': expected a digit at the start, found '%s' (e.g. "
				"%s; no signs, no leading point)",
				what, quote(text, SIZE_MAX, q), quote(p, 1, c), example);

	for (; is_digit(*p); p++) {
		unsigned d = (unsigned)(*p - '0');
		if (n->whole > (UINT64_MAX - d) / 10)
			n->too_big = true;
		else
			n->whole = n->whole * 10 + d;
	}
	if (*p == '.') {
		p++;
		n->frac = p;
		while (is_digit(*p))
			p++;
		n->nfrac = (size_t)(p - n->frac);
		if (n->nfrac == 0)
			return eos_fail(-EINVAL, "%s '%s': expected digits after the point", what,
					quote(text, SIZE_MAX, q));
	}
	if (*p == ' ')
		p++; /* the one space allowed; the unit cannot be empty (no trailing space) */
	if (*p == '\0')
		return 0;
	n->unit = p;
	for (const char *u = p; *u; u++)
		if (is_space(*u))
			return eos_fail(-EINVAL,
					"%s '%s': unexpected whitespace (at most one space, "
					"between the number and the unit)",
					what, quote(text, SIZE_MAX, q));
	return 0;
}

static const struct unit *find_unit(const struct unit *units, size_t nunits, const char *name)
{
	for (size_t i = 0; i < nunits; i++)
		if (eq_nocase(name, units[i].name))
			return &units[i];
	return NULL;
}

/* whole.frac * mult rounded down, or -ERANGE when it exceeds UINT64_MAX. */
static int scale(const struct number *n, uint64_t mult, uint64_t *out)
{
	if (n->too_big || n->whole > UINT64_MAX / mult)
		return -ERANGE;
	uint64_t v = n->whole * mult, acc = 0;
	for (size_t i = n->frac ? n->nfrac : 0; i-- > 0;) /* frac is NULL when nfrac is 0 */
		acc = ((uint64_t)(n->frac[i] - '0') * mult + acc) / 10;
	if (v > UINT64_MAX - acc)
		return -ERANGE;
	*out = v + acc;
	return 0;
}

int eos_parse_size(const char *text, uint64_t *out)
{
	char q[QUOTE_BUF], u[QUOTE_BUF];
	struct number n;
	if (!text || !out)
		return eos_fail(-EINVAL, "size: no text to parse");
	int rc = split("size", text, "'8G'", &n);
	if (rc)
		return rc;
	const struct unit *unit = NULL;
	if (n.unit) {
		unit = find_unit(size_units, sizeof size_units / sizeof size_units[0], n.unit);
		if (!unit)
			return eos_fail(-EINVAL,
					"size '%s': unknown unit '%s' (expected " SIZE_UNITS_TEXT
					")",
					quote(text, SIZE_MAX, q), quote(n.unit, SIZE_MAX, u));
	}
	if (n.frac && !unit)
		return eos_fail(-EINVAL,
				"size '%s': a fraction needs a unit, e.g. '%sG' (a bare "
				"number is whole bytes)",
				quote(text, SIZE_MAX, q), q);
	if (n.frac && unit->mult == 1)
		return eos_fail(-EINVAL,
				"size '%s': a fraction of a byte (use a larger unit or "
				"whole bytes)",
				quote(text, SIZE_MAX, q));
	uint64_t v;
	if (scale(&n, unit ? unit->mult : 1, &v) != 0)
		return eos_fail(-ERANGE,
				"size '%s': too large (the largest size is %" PRIu64
				" bytes, just under 16 EiB)",
				quote(text, SIZE_MAX, q), UINT64_MAX);
	*out = v;
	return 0;
}

int eos_parse_duration(const char *text, uint64_t *out_ns, bool *off)
{
	char q[QUOTE_BUF], u[QUOTE_BUF];
	struct number n;
	if (!text || !out_ns)
		return eos_fail(-EINVAL, "duration: no text to parse");
	if (eq_nocase(text, "off")) {
		if (!off)
			return eos_fail(-EINVAL,
					"duration '%s': 'off' is not allowed here (expected a "
					"duration such as '30s')",
					quote(text, SIZE_MAX, q));
		*out_ns = 0;
		*off = true;
		return 0;
	}
	int rc = split("duration", text, off ? "'30s' or 'off'" : "'30s'", &n);
	if (rc)
		return rc;
	const struct unit *unit = &duration_units[3]; /* bare number: seconds */
	if (n.unit) {
		unit = find_unit(duration_units, sizeof duration_units / sizeof duration_units[0],
				 n.unit);
		if (!unit)
			return eos_fail(
				-EINVAL,
				"duration '%s': unknown unit '%s' (expected " DURATION_UNITS_TEXT
				"%s)",
				quote(text, SIZE_MAX, q), quote(n.unit, SIZE_MAX, u),
				off ? ", or 'off'" : "");
	}
	if (n.frac && unit->mult == 1)
		return eos_fail(-EINVAL, "duration '%s': a fraction of a nanosecond",
				quote(text, SIZE_MAX, q));
	uint64_t v;
	if (scale(&n, unit->mult, &v) != 0)
		return eos_fail(-ERANGE,
				"duration '%s': too long (the longest is %" PRIu64
				" ns, about 584 years)",
				quote(text, SIZE_MAX, q), UINT64_MAX);
	*out_ns = v;
	if (off)
		*off = false;
	return 0;
}

const char *eos_format_size(uint64_t bytes, char *buf, size_t len)
{
	static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	if (!buf || len == 0)
		return "";
	int i = 0;
	while (i < 4 && bytes >= 1ull << (10 * (i + 1)))
		i++;
	uint64_t unit = 1ull << (10 * i);
	uint64_t whole = bytes / unit;
	/* Hundredths, rounded down: the text never claims more than there is. */
	unsigned hund = (unsigned)((bytes % unit) * 100 / unit);
	if (hund == 0)
		snprintf(buf, len, "%" PRIu64 " %s", whole, names[i]);
	else if (hund % 10 == 0)
		snprintf(buf, len, "%" PRIu64 ".%u %s", whole, hund / 10, names[i]);
	else
		snprintf(buf, len, "%" PRIu64 ".%02u %s", whole, hund, names[i]);
	return buf;
}
