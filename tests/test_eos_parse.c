/*
 * test_eos_parse.c - eos_parse_size, eos_parse_duration, eos_format_size.
 *
 * Tables of accepted texts with their exact values (the boundaries of every
 * unit, fractions that must round down, the largest values that fit), of
 * refused texts with their code and a phrase their message must carry, then
 * format -> parse round trips over chosen and random values.
 */
#include "eos_test.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)
#define S 1000000000ull

struct good {
	const char *text;
	uint64_t want;
};

struct bad {
	const char *text;
	int rc;
	const char *phrase; /* the message must contain it */
};

static const struct good good_sizes[] = {
	{"0", 0},
	{"4096", 4096},
	{"007", 7},
	{"8G", 8 * GiB},
	{"8g", 8 * GiB},
	{"8GB", 8 * GiB},
	{"8gib", 8 * GiB},
	{"512MiB", 512 * MiB},
	{"512M", 512 * MiB},
	{"512mB", 512 * MiB},
	{"1.5GiB", 1610612736},
	{"1.5G", 1610612736},
	{"1.5 GiB", 1610612736},
	{"10 KiB", 10 * KiB},
	{"1K", KiB},
	{"1KB", KiB},
	{"1kb", KiB},
	{"1KIB", KiB},
	{"1B", 1},
	{"17 B", 17},
	{"0B", 0},
	{"0.0G", 0},
	{"1T", TiB},
	{"1TiB", TiB},
	{"0.5K", 512},
	{"1.3K", 1331}, /* 1331.2, rounded down */
	{"0.001K", 1},  /* 1.024 */
	{"0.0009K", 0}, /* 0.9216 */
	{"1.0000000000000000000000001G", GiB},
	{"1.9999999999999999999999999K", 2047},
	{"15.99999999999999999999T", 16 * TiB - 1},
	{"16777215T", 16777215 * TiB},
	{"16777215.999999999999T", UINT64_MAX - 1}, /* 2^64 - 1.0995 */
	{"17179869183.99999999999G", UINT64_MAX},   /* 2^64 - 0.0107 */
	{"16777215.9999999999999T", UINT64_MAX},    /* 2^64 - 0.1100 */
	{"18446744073709551615", UINT64_MAX},
	{"18446744073709551615B", UINT64_MAX},
	{"000000000000000000000000018446744073709551615", UINT64_MAX},
};

static const struct bad bad_sizes[] = {
	{"", -EINVAL, "empty"},
	{"8X", -EINVAL, "unknown unit 'X' (expected B, K, KiB, M, MiB, G, GiB, T, TiB)"},
	{"-1", -EINVAL, "negative"},
	{"+1", -EINVAL, "found '+'"},
	{" 8G", -EINVAL, "leading whitespace"},
	{"8G ", -EINVAL, "trailing whitespace"},
	{"8 ", -EINVAL, "trailing whitespace"},
	{"8G\n", -EINVAL, "trailing whitespace"},
	{"8  G", -EINVAL, "whitespace"},
	{"8\tG", -EINVAL, "whitespace"},
	{"1 000", -EINVAL, "unknown unit '000'"},
	{"1e3", -EINVAL, "unknown unit 'e3'"},
	{"0x10", -EINVAL, "unknown unit 'x10'"},
	{"1,000", -EINVAL, "unknown unit ',000'"},
	{"1_000", -EINVAL, "unknown unit '_000'"},
	{"1.5", -EINVAL, "a fraction needs a unit, e.g. '1.5G'"},
	{"1.0", -EINVAL, "a fraction needs a unit"},
	{"1.5B", -EINVAL, "fraction of a byte"},
	{"..5G", -EINVAL, "expected a digit at the start, found '.'"},
	{".5G", -EINVAL, "expected a digit at the start"},
	{"5.G", -EINVAL, "digits after the point"},
	{"1..5G", -EINVAL, "digits after the point"},
	{"1.5.5G", -EINVAL, "unknown unit '.5G'"},
	{"G", -EINVAL, "expected a digit"},
	{"8GiBs", -EINVAL, "unknown unit 'GiBs'"},
	{"8Gi", -EINVAL, "unknown unit 'Gi'"},
	{"8P", -EINVAL, "unknown unit 'P'"},
	{"inf", -EINVAL, "expected a digit"},
	{"nan", -EINVAL, "expected a digit"},
	{"8G\xc3\xa9", -EINVAL, "unknown unit 'G\\xc3\\xa9'"},
	{"\xef\xbc\x98G", -EINVAL, "found '\\xef'"},            /* fullwidth 8 */
	{"99999999999999999999X", -EINVAL, "unknown unit 'X'"}, /* syntax before range */
	{"99999999999999999999", -ERANGE, "too large"},
	{"18446744073709551616", -ERANGE, "too large"},
	{"18446744073709551616B", -ERANGE, "too large"},
	{"20000000T", -ERANGE, "too large"},
	{"16777216T", -ERANGE, "too large"},
	{"17179869184G", -ERANGE, "too large"},
	{"17179869184.5G", -ERANGE, "too large"},
};

static const struct good good_durations[] = {
	{"0", 0},
	{"0s", 0},
	{"1", S},
	{"90", 90 * S},
	{"1.5", 1500000000},
	{"1.5s", 1500000000},
	{"30S", 30 * S},
	{"10 ms", 10000000},
	{"250ms", 250000000},
	{"0.5ms", 500000},
	{"1us", 1000},
	{"1.5us", 1500},
	{"1.0001us", 1000},
	{"7ns", 7},
	{"7NS", 7},
	{"2m", 120 * S},
	{"2M", 120 * S},
	{"2h", 7200 * S},
	{"1.5h", 5400 * S},
	{"1d", 86400 * S},
	{"1.0000000001s", S},
	{"0.0000000019s", 1},
	{"0.000000001", 1},
	{"213503d", 213503ull * 86400 * S},
	{"18446744073709551615ns", UINT64_MAX},
	{"18446744073.709551615s", UINT64_MAX},
	{"18446744073.709551615", UINT64_MAX},
	{"18446744073.7095516159", UINT64_MAX},
};

static const struct bad bad_durations[] = {
	{"", -EINVAL, "empty"},
	{"-1s", -EINVAL, "negative"},
	{"+1s", -EINVAL, "found '+'"},
	{"5x", -EINVAL, "unknown unit 'x' (expected ns, us, ms, s, m, h, d"},
	{"1sec", -EINVAL, "unknown unit 'sec'"},
	{"1min", -EINVAL, "unknown unit 'min'"},
	{"1\xc2\xb5s", -EINVAL, "unknown unit '\\xc2\\xb5s'"},
	{"1e3s", -EINVAL, "unknown unit 'e3s'"},
	{"0x10s", -EINVAL, "unknown unit 'x10s'"},
	{"1.5ns", -EINVAL, "fraction of a nanosecond"},
	{"s", -EINVAL, "expected a digit"},
	{".5s", -EINVAL, "expected a digit"},
	{"5.s", -EINVAL, "digits after the point"},
	{" 1s", -EINVAL, "leading whitespace"},
	{"1s ", -EINVAL, "trailing whitespace"},
	{"1  s", -EINVAL, "whitespace"},
	{"on", -EINVAL, "expected a digit"},
	{"offf", -EINVAL, "expected a digit"},
	{"213504d", -ERANGE, "too long"},
	{"18446744073709551616ns", -ERANGE, "too long"},
	{"18446744074", -ERANGE, "too long"},
	{"18446744073.709551616s", -ERANGE, "too long"},
	{"99999999999999999999999h", -ERANGE, "too long"},
};

/* The message must name the text: quoted, or escaped where not printable. */
static void check_names_text(const char *what, const char *text)
{
	char want[256];
	bool printable = true;
	for (const char *p = text; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f || *p == '\\')
			printable = false;
	if (printable) {
		snprintf(want, sizeof want, "%s '%s'", what, text);
		CHECK_MSG(want);
	} else {
		snprintf(want, sizeof want, "%s '", what);
		CHECK_MSG(want);
		CHECK_MSG("\\x");
	}
	CHECK(strchr(eos_errmsg(), '\n') == NULL);
}

static void test_sizes(void)
{
	for (size_t i = 0; i < sizeof good_sizes / sizeof good_sizes[0]; i++) {
		const struct good *g = &good_sizes[i];
		uint64_t v = 12345;
		int rc = eos_parse_size(g->text, &v);
		CHECKF(rc == 0, "size '%s': rc %d: %s", g->text, rc, eos_errmsg());
		CHECKF(v == g->want, "size '%s' = %" PRIu64 ", want %" PRIu64, g->text, v, g->want);
	}
	for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
		const struct bad *b = &bad_sizes[i];
		uint64_t v = 12345;
		eos_errclear();
		int rc = eos_parse_size(b->text, &v);
		CHECKF(rc == b->rc, "size '%s': rc %d, want %d (%s)", b->text, rc, b->rc,
		       eos_errmsg());
		CHECKF(v == 12345, "size '%s': output written on failure", b->text);
		CHECK_MSG(b->phrase);
		check_names_text("size", b->text);
	}
	uint64_t v;
	CHECK_RC(eos_parse_size(NULL, &v), -EINVAL);
	CHECK_RC(eos_parse_size("1", NULL), -EINVAL);

	/* A long text is cut in the message, which stays one readable line. */
	char longtext[400];
	memset(longtext, '9', sizeof longtext - 2);
	longtext[sizeof longtext - 2] = 'X';
	longtext[sizeof longtext - 1] = '\0';
	CHECK_RC(eos_parse_size(longtext, &v), -EINVAL);
	CHECK_MSG("...");
	CHECK(strlen(eos_errmsg()) < EOS_ERRMSG_MAX);
}

static void test_durations(void)
{
	for (size_t i = 0; i < sizeof good_durations / sizeof good_durations[0]; i++) {
		const struct good *g = &good_durations[i];
		uint64_t v = 12345;
		bool off = true;
		int rc = eos_parse_duration(g->text, &v, &off);
		CHECKF(rc == 0, "duration '%s': rc %d: %s", g->text, rc, eos_errmsg());
		CHECKF(v == g->want, "duration '%s' = %" PRIu64 ", want %" PRIu64, g->text, v,
		       g->want);
		CHECK(!off);
		/* Without an off pointer the same text parses the same. */
		v = 0;
		CHECK_RC(eos_parse_duration(g->text, &v, NULL), 0);
		CHECK(v == g->want);
	}
	for (size_t i = 0; i < sizeof bad_durations / sizeof bad_durations[0]; i++) {
		const struct bad *b = &bad_durations[i];
		uint64_t v = 12345;
		bool off = true;
		int rc = eos_parse_duration(b->text, &v, &off);
		CHECKF(rc == b->rc, "duration '%s': rc %d, want %d (%s)", b->text, rc, b->rc,
		       eos_errmsg());
		CHECKF(v == 12345 && off, "duration '%s': outputs written on failure", b->text);
		CHECK_MSG(b->phrase);
		check_names_text("duration", b->text);
	}

	static const char *const offs[] = {"off", "OFF", "Off", "oFf"};
	for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
		uint64_t v = 12345;
		bool off = false;
		CHECK_RC(eos_parse_duration(offs[i], &v, &off), 0);
		CHECK(off && v == 0);
		v = 12345;
		CHECK_RC(eos_parse_duration(offs[i], &v, NULL), -EINVAL);
		CHECK(v == 12345);
		CHECK_MSG("'off' is not allowed here");
		check_names_text("duration", offs[i]);
	}
	/* Where off is allowed, an unknown unit says so; elsewhere not. */
	uint64_t v;
	bool off;
	CHECK_RC(eos_parse_duration("5x", &v, &off), -EINVAL);
	CHECK_MSG("(expected ns, us, ms, s, m, h, d, or 'off')");
	CHECK_RC(eos_parse_duration("5x", &v, NULL), -EINVAL);
	CHECK_MSG("(expected ns, us, ms, s, m, h, d)");
	CHECK_RC(eos_parse_duration(NULL, &v, &off), -EINVAL);
	CHECK_RC(eos_parse_duration("1s", NULL, &off), -EINVAL);
}

struct fmt {
	uint64_t v;
	const char *text;
};

static const struct fmt formats[] = {
	{0, "0 B"},
	{17, "17 B"},
	{1023, "1023 B"},
	{1024, "1 KiB"},
	{1025, "1 KiB"}, /* 1.0009: two decimals, rounded down */
	{1034, "1 KiB"},
	{1035, "1.01 KiB"},
	{1536, "1.5 KiB"},
	{2047, "1.99 KiB"}, /* never rounds up to 2 */
	{512 * MiB, "512 MiB"},
	{1610612736, "1.5 GiB"},
	{GiB + GiB / 4, "1.25 GiB"},
	{TiB, "1 TiB"},
	{1024 * TiB, "1024 TiB"},
	{UINT64_MAX, "16777215.99 TiB"},
};

/* The largest unit eos_format_size uses for v. */
static uint64_t unit_of(uint64_t v)
{
	uint64_t u = 1;
	while (u < TiB && v >= u * 1024)
		u *= 1024;
	return u;
}

/* format(v) parses back to v exactly when two decimals hold it, else to a
 * value below v by less than a hundredth of the unit plus one byte (the
 * printed hundredths are rounded down, then the parse rounds down). */
static void check_round_trip(uint64_t v)
{
	char buf[16];
	const char *s = eos_format_size(v, buf, sizeof buf);
	CHECK(s == buf);
	CHECK(strlen(s) < sizeof buf);
	uint64_t back = 0;
	int rc = eos_parse_size(s, &back);
	CHECKF(rc == 0, "format(%" PRIu64 ") = '%s' does not parse: %s", v, s, eos_errmsg());
	uint64_t u = unit_of(v), r = v % u;
	CHECKF(back <= v && (v - back) * 100 < u + 100,
	       "format(%" PRIu64 ") = '%s' parses to %" PRIu64, v, s, back);
	if (r * 100 % u == 0)
		CHECKF(back == v, "format(%" PRIu64 ") = '%s' is exact but parses to %" PRIu64, v,
		       s, back);
}

static void test_format(void)
{
	char buf[16];
	for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
		const char *s = eos_format_size(formats[i].v, buf, sizeof buf);
		CHECKF(strcmp(s, formats[i].text) == 0, "format(%" PRIu64 ") = '%s', want '%s'",
		       formats[i].v, s, formats[i].text);
		check_round_trip(formats[i].v);
	}
	/* A short buffer is cut, still terminated; no buffer gives "". */
	char small[5];
	CHECK(strcmp(eos_format_size(1610612736, small, sizeof small), "1.5 ") == 0);
	CHECK(strcmp(eos_format_size(1, NULL, 0), "") == 0);

	/* Every unit boundary and its neighbours. */
	for (int sh = 0; sh < 64; sh++) {
		uint64_t b = 1ull << sh;
		check_round_trip(b - 1);
		check_round_trip(b);
		check_round_trip(b + 1);
	}
	test_rng rng;
	test_rng_init(&rng, test_seed());
	for (int i = 0; i < 200000; i++) {
		uint64_t v = test_rng_next(&rng) >> test_rng_below(&rng, 64);
		check_round_trip(v);
	}
}

/* Random well-formed texts against values computed here independently. */
static void test_random_texts(void)
{
	static const struct {
		const char *name;
		int shift;
	} units[] = {{"", 0},   {"B", 0},     {"k", 10}, {"KiB", 10}, {"MB", 20},
		     {"m", 20}, {" GiB", 30}, {"g", 30}, {"TB", 40},  {"t", 40}};
	test_rng rng;
	test_rng_init(&rng, test_seed() ^ 0x5eed);
	for (int i = 0; i < 100000; i++) {
		int u = (int)test_rng_below(&rng, sizeof units / sizeof units[0]);
		uint64_t whole = test_rng_next(&rng) >> test_rng_below(&rng, 64);
		unsigned frac = (unsigned)test_rng_below(&rng, 1000);
		bool has_frac = units[u].shift > 0 && test_rng_below(&rng, 2);
		char text[64];
		if (has_frac)
			snprintf(text, sizeof text, "%" PRIu64 ".%03u%s", whole, frac,
				 units[u].name);
		else
			snprintf(text, sizeof text, "%" PRIu64 "%s", whole, units[u].name);
		/* want = whole << shift + floor(frac * 2^shift / 1000), in 128 bits */
		unsigned __int128 want = ((unsigned __int128)whole << units[u].shift);
		if (has_frac)
			want += ((unsigned __int128)frac << units[u].shift) / 1000;
		uint64_t v = 0;
		int rc = eos_parse_size(text, &v);
		if (want > UINT64_MAX) {
			CHECKF(rc == -ERANGE, "size '%s': rc %d, want -ERANGE", text, rc);
		} else {
			CHECKF(rc == 0 && v == (uint64_t)want,
			       "size '%s': rc %d value %" PRIu64 ", want %" PRIu64, text, rc, v,
			       (uint64_t)want);
		}
	}
}

int main(void)
{
	test_sizes();
	test_durations();
	test_format();
	test_random_texts();
	printf("ok\n");
	return 0;
}
