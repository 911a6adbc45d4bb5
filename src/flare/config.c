/*
 * config.c - the config file of `flare run`: a documented TOML subset
 * (design 2.11 "[prefix_cache] memory", 2.5 drain_on_shutdown and max_age;
 * docs/configuration.md).
 *
 * DESIGN
 * Line-oriented: every construct we accept fits on one line, so the parser
 * walks lines and reports the first problem with its line number.  A value
 * keeps its TOML type (string, integer, boolean) and settings.c decides
 * whether that type suits the key.  Unknown sections and keys are errors,
 * not warnings: a misspelt key silently ignored would leave a cache
 * disabled that the operator believes enabled.
 *
 * Invariants:
 *   1. The parser never reads past text + len and never needs a NUL.
 *   2. Every error message starts with "FILE:LINE: " and names the key,
 *      the section or the construct at fault.
 *   3. A key or section may appear once (as in TOML).
 */
#include "flare/config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VALUE_MAX FLARE_PATH_MAX

struct parser {
	const char *file;
	unsigned line;
	char *err;
	size_t errlen;
};

static int perr(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(struct parser *p, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	return flare_bad(p->err, p->errlen, "%s:%u: %s", p->file, p->line, msg);
}
#ifdef __clang_analyzer__
/* The analyzer does not follow variadic calls: perr returns -EINVAL. */
#define perr(p, ...) ((void)perr(p, __VA_ARGS__), -EINVAL)
#endif

static bool is_bare(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-';
}

static const char *skip_ws(const char *s, const char *end)
{
	while (s < end && (*s == ' ' || *s == '\t'))
		s++;
	return s;
}

/* Only whitespace and an optional comment may follow. */
static bool rest_is_empty(const char *s, const char *end)
{
	s = skip_ws(s, end);
	return s == end || *s == '#';
}

/* A printable rendering of a short piece of the line for messages. */
static const char *quote_piece(const char *s, const char *end, char *buf, size_t cap)
{
	size_t n = 0;
	for (; s < end && n + 5 < cap && *s != '#'; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 0x20 && c != 0x7f)
			buf[n++] = (char)c;
		else
			n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", c);
	}
	while (n > 0 && (buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	buf[n] = '\0';
	return buf;
}

static void put_utf8(char *out, size_t *n, uint32_t cp)
{
	if (cp < 0x80) {
		out[(*n)++] = (char)cp;
	} else if (cp < 0x800) {
		out[(*n)++] = (char)(0xc0 | cp >> 6);
		out[(*n)++] = (char)(0x80 | (cp & 0x3f));
	} else if (cp < 0x10000) {
		out[(*n)++] = (char)(0xe0 | cp >> 12);
		out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[(*n)++] = (char)(0x80 | (cp & 0x3f));
	} else {
		out[(*n)++] = (char)(0xf0 | cp >> 18);
		out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3f));
		out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3f));
		out[(*n)++] = (char)(0x80 | (cp & 0x3f));
	}
}

/* A string value starting at *sp (the opening quote).  The result, at most
 * VALUE_MAX - 1 bytes, goes to out; *sp moves past the closing quote. */
static int read_string(struct parser *p, const char *key, const char **sp, const char *end,
		       char *out)
{
	const char *s = *sp;
	char q = *s++;
	size_t n = 0;
	if (end - s >= 2 && s[0] == q && s[1] == q)
		return perr(p, "%s: multi-line strings are not supported", key);
	for (;;) {
		if (s >= end)
			return perr(p, "%s: string has no closing %c", key, q);
		unsigned char c = (unsigned char)*s;
		if (c == (unsigned char)q) {
			s++;
			break;
		}
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return perr(p, "%s: control character 0x%02x in a string (use an escape)",
				    key, c);
		if (n + 4 >= VALUE_MAX)
			return perr(p, "%s: string is longer than %d bytes", key, VALUE_MAX - 1);
		if (c != '\\' || q == '\'') {
			out[n++] = (char)c;
			s++;
			continue;
		}
		if (++s >= end)
			return perr(p, "%s: string has no closing %c", key, q);
		char e = *s++;
		switch (e) {
		case 'b': out[n++] = '\b'; break;
		case 't': out[n++] = '\t'; break;
		case 'n': out[n++] = '\n'; break;
		case 'f': out[n++] = '\f'; break;
		case 'r': out[n++] = '\r'; break;
		case '"': out[n++] = '"'; break;
		case '\\': out[n++] = '\\'; break;
		case 'u':
		case 'U': {
			int digits = e == 'u' ? 4 : 8;
			uint32_t cp = 0;
			for (int i = 0; i < digits; i++, s++) {
				char h = s < end ? *s : '\0';
				int v = h >= '0' && h <= '9'   ? h - '0'
					: h >= 'a' && h <= 'f' ? h - 'a' + 10
					: h >= 'A' && h <= 'F' ? h - 'A' + 10
							       : -1;
				if (v < 0)
					return perr(p, "%s: \\%c needs %d hexadecimal digits", key,
						    e, digits);
				cp = cp << 4 | (uint32_t)v;
			}
			if (cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
				return perr(p, "%s: \\%c%0*X is not an allowed character", key, e,
					    digits, cp);
			put_utf8(out, &n, cp);
			break;
		}
		default:
			if ((unsigned char)e < 0x20 || (unsigned char)e >= 0x7f)
				return perr(p, "%s: unknown escape in a string", key);
			return perr(p, "%s: unknown escape \\%c in a string", key, e);
		}
	}
	out[n] = '\0';
	*sp = s;
	return 0;
}

/* An integer value: [+-]digits with single underscores between digits, no
 * leading zeros.  out receives the digits (a leading '-' kept). */
static int read_integer(struct parser *p, const char *key, const char **sp, const char *end,
			char *out)
{
	const char *s = *sp;
	size_t n = 0;
	if (*s == '+' || *s == '-') {
		if (*s == '-')
			out[n++] = '-';
		s++;
	}
	const char *digits = s;
	bool prev_digit = false;
	while (s < end && ((*s >= '0' && *s <= '9') || *s == '_')) {
		if (*s == '_') {
			if (!prev_digit || s + 1 >= end || s[1] < '0' || s[1] > '9')
				return perr(p,
					    "%s: an underscore in a number must sit between digits",
					    key);
			prev_digit = false;
		} else {
			if (n + 1 >= 32)
				return perr(p, "%s: number is too long", key);
			out[n++] = *s;
			prev_digit = true;
		}
		s++;
	}
	if (s == digits)
		return perr(p, "%s: expected a value", key);
	if (s < end && (*s == '.' || *s == 'e' || *s == 'E'))
		return perr(p,
			    "%s: floats are not supported (write sizes and durations as strings, "
			    "\"1.5GiB\", \"2.5s\")",
			    key);
	if (s < end && (*s == 'x' || *s == 'o' || *s == 'b') && s - digits == 1 && *digits == '0')
		return perr(p, "%s: only decimal integers are supported", key);
	if (s < end && (*s == '-' || *s == ':'))
		return perr(p, "%s: dates and times are not supported", key);
	if (s < end && is_bare(*s)) {
		const char *w = *sp;
		while (s < end && is_bare(*s))
			s++;
		return perr(p, "%s: '%.*s' is not a value (strings need quotes: \"%.*s\")", key,
			    (int)(s - w), w, (int)(s - w), w);
	}
	if (*digits == '0' && s - digits > 1)
		return perr(p, "%s: integers may not have leading zeros", key);
	out[n] = '\0';
	*sp = s;
	return 0;
}

/* What the parse has seen so far. */
struct cstate {
	struct parser p;
	char section[64];
	bool in_section;
	unsigned key_line[FLARE_OPT_COUNT];
	struct {
		char name[64];
		unsigned line;
	} seen[8];
	size_t nseen;
	char *value; /* VALUE_MAX bytes: the value being read */
	struct flare_settings *out;
};

/* A section header "[name]" in s..end: 0 or an error. */
static int parse_section(struct cstate *c, const char *s, const char *end)
{
	struct parser *p = &c->p;
	char piece[96];
	if (s + 1 < end && s[1] == '[')
		return perr(p, "arrays of tables ([[...]]) are not supported");
	const char *n0 = skip_ws(s + 1, end), *n1 = n0;
	while (n1 < end && is_bare(*n1))
		n1++;
	const char *close = skip_ws(n1, end);
	if (n1 < end && (*n1 == '.' || *n1 == '"' || *n1 == '\''))
		return perr(p, "section '%s': dotted and quoted section names are not supported",
			    quote_piece(s, end, piece, sizeof piece));
	if (n1 == n0 || close >= end || *close != ']')
		return perr(p, "'%s' is not a section header ([name])",
			    quote_piece(s, end, piece, sizeof piece));
	if (!rest_is_empty(close + 1, end))
		return perr(p, "unexpected text after the section header [%.*s]", (int)(n1 - n0),
			    n0);
	size_t nlen = (size_t)(n1 - n0);
	if (nlen >= sizeof c->section)
		return perr(p, "unknown section [%.40s...]", n0);
	memcpy(c->section, n0, nlen);
	c->section[nlen] = '\0';
	if (strcmp(c->section, "server") && strcmp(c->section, "prefix_cache") &&
	    strcmp(c->section, "ranks"))
		return perr(p, "unknown section [%s] (known: [server], [prefix_cache], [ranks])",
			    c->section);
	for (size_t i = 0; i < c->nseen; i++)
		if (!strcmp(c->seen[i].name, c->section))
			return perr(p, "section [%s] appears twice (first on line %u)", c->section,
				    c->seen[i].line);
	snprintf(c->seen[c->nseen].name, sizeof c->seen[c->nseen].name, "%s", c->section);
	c->seen[c->nseen++].line = p->line;
	c->in_section = true;
	return 0;
}

/* The key of a "key = value" line: its option, "section.key" in qkey and
 * where the value starts.  0 or an error. */
static int parse_key(struct cstate *c, const char *s, const char *end,
		     const struct flare_option **o, char qkey[160], const char **v)
{
	struct parser *p = &c->p;
	char piece[96], key[64];
	const char *k1 = s;
	while (k1 < end && is_bare(*k1))
		k1++;
	if (k1 == s) {
		if (*s == '"' || *s == '\'')
			return perr(p, "quoted keys are not supported");
		return perr(p, "'%s' is not a 'key = value' line",
			    quote_piece(s, end, piece, sizeof piece));
	}
	size_t klen = (size_t)(k1 - s);
	snprintf(key, sizeof key, "%.*s", (int)(klen < 63 ? klen : 63), s);
	const char *eq = skip_ws(k1, end);
	if (eq < end && *eq == '.')
		return perr(p, "%s: dotted keys are not supported", key);
	if (eq >= end || *eq != '=')
		return perr(p, "%s: expected '=' after the key", key);
	if (!c->in_section)
		return perr(p,
			    "key '%s' outside a section (put it under [server] or [prefix_cache])",
			    key);
	*o = klen < 63 ? flare_option_by_key(c->section, key) : NULL;
	if (!*o)
		return perr(p, "unknown key '%s' in [%s]", key, c->section);
	snprintf(qkey, 160, "%s.%s", c->section, key);
	if (c->key_line[(*o)->id])
		return perr(p, "%s: set twice (first on line %u)", qkey, c->key_line[(*o)->id]);
	c->key_line[(*o)->id] = p->line;
	*v = skip_ws(eq + 1, end);
	return 0;
}

/* The value at v into c->value and its TOML type: 0 or an error. */
static int parse_value(struct cstate *c, const char *qkey, const char *v, const char *end,
		       enum flare_vtype *vt)
{
	struct parser *p = &c->p;
	char piece[96];
	int rc = 0;
	*vt = FLARE_V_STRING;
	if (v >= end || *v == '#')
		return perr(p, "%s: expected a value after '='", qkey);
	if (*v == '"' || *v == '\'') {
		rc = read_string(p, qkey, &v, end, c->value);
	} else if ((*v >= '0' && *v <= '9') || *v == '+' || *v == '-') {
		*vt = FLARE_V_INTEGER;
		rc = read_integer(p, qkey, &v, end, c->value);
	} else if (end - v >= 4 && !memcmp(v, "true", 4) && (end - v == 4 || !is_bare(v[4]))) {
		*vt = FLARE_V_BOOL;
		memcpy(c->value, "true", sizeof "true");
		v += 4;
	} else if (end - v >= 5 && !memcmp(v, "false", 5) && (end - v == 5 || !is_bare(v[5]))) {
		*vt = FLARE_V_BOOL;
		memcpy(c->value, "false", sizeof "false");
		v += 5;
	} else if (*v == '[') {
		return perr(p, "%s: arrays are not supported", qkey);
	} else if (*v == '{') {
		return perr(p, "%s: inline tables are not supported", qkey);
	} else {
		return perr(p, "%s: '%s' is not a value (strings need quotes: \"%s\")", qkey,
			    quote_piece(v, end, piece, sizeof piece), piece);
	}
	if (rc)
		return rc;
	if (!rest_is_empty(v, end))
		return perr(p, "%s: unexpected text after the value: '%s'", qkey,
			    quote_piece(skip_ws(v, end), end, piece, sizeof piece));
	if (*vt == FLARE_V_INTEGER && c->value[0] == '-')
		return perr(p, "%s: %s is negative", qkey, c->value);
	return 0;
}

/* One line (without its newline): a comment, a section header or a
 * setting.  0 or an error. */
static int parse_line(struct cstate *c, const char *pos, const char *end)
{
	if (end > pos && memchr(pos, '\0', (size_t)(end - pos)))
		return perr(&c->p, "NUL byte in the file");
	const char *s = skip_ws(pos, end);
	if (s == end || *s == '#')
		return 0;
	if (*s == '[')
		return parse_section(c, s, end);
	const struct flare_option *o = NULL;
	const char *v = NULL;
	char qkey[160], why[768];
	enum flare_vtype vt = FLARE_V_STRING;
	int rc;
	if ((rc = parse_key(c, s, end, &o, qkey, &v)) || (rc = parse_value(c, qkey, v, end, &vt)))
		return rc;
	if (flare_settings_set(c->out, o, c->value, vt, why, sizeof why))
		return perr(&c->p, "%s: %s", qkey, why);
	return 0;
}

int flare_config_parse(const char *text, size_t len, const char *filename,
		       struct flare_settings *out, char *err, size_t errlen)
{
	struct cstate c = {.p = {filename ? filename : "config", 0, err, errlen}, .out = out};
	int rc = 0;
	if (!(c.value = malloc(VALUE_MAX))) {
		snprintf(err, errlen, "%s: out of memory", c.p.file);
		return -ENOMEM;
	}
	memset(out, 0, sizeof *out);
	const char *pos = text, *end_all = text + len;
	/* A UTF-8 byte order mark is allowed at the very start. */
	if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
		pos += 3;
	while (pos < end_all && !rc) {
		const char *nl = memchr(pos, '\n', (size_t)(end_all - pos));
		const char *end = nl ? nl : end_all;
		c.p.line++;
		if (end > pos && end[-1] == '\r')
			end--;
		rc = parse_line(&c, pos, end);
		pos = nl ? nl + 1 : end_all;
	}
	free(c.value);
	return rc;
}

int flare_config_load(const char *path, struct flare_settings *out, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "--config: cannot open '%s': %s", path, strerror(errno));
		return -errno;
	}
	char *buf = malloc(FLARE_CONFIG_MAX_BYTES + 1);
	if (!buf) {
		fclose(f);
		snprintf(err, errlen, "--config: '%s': out of memory", path);
		return -ENOMEM;
	}
	size_t n = fread(buf, 1, FLARE_CONFIG_MAX_BYTES + 1, f);
	int rerr = ferror(f) ? errno : 0;
	fclose(f);
	int rc;
	if (rerr) {
		snprintf(err, errlen, "--config: cannot read '%s': %s", path, strerror(rerr));
		rc = -rerr;
	} else if (n > FLARE_CONFIG_MAX_BYTES) {
		snprintf(err, errlen, "--config: '%s' is larger than %u bytes", path,
			 FLARE_CONFIG_MAX_BYTES);
		rc = -EFBIG;
	} else {
		rc = flare_config_parse(buf, n, path, out, err, errlen);
	}
	free(buf);
	return rc;
}
