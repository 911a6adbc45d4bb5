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
	snprintf(p->err, p->errlen, "%s:%u: %s", p->file, p->line, msg);
	flare_message_tidy(p->err, p->errlen);
	return -EINVAL;
}

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
			return perr(p, "%s: control character 0x%02x in a string (use an escape)", key, c);
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
				int v = h >= '0' && h <= '9' ? h - '0'
					: h >= 'a' && h <= 'f' ? h - 'a' + 10
					: h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
				if (v < 0)
					return perr(p, "%s: \\%c needs %d hexadecimal digits", key, e, digits);
				cp = cp << 4 | (uint32_t)v;
			}
			if (cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
				return perr(p, "%s: \\%c%0*X is not an allowed character", key, e, digits, cp);
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
				return perr(p, "%s: an underscore in a number must sit between digits", key);
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
		return perr(p, "%s: floats are not supported (write sizes and durations as strings, "
			       "\"1.5GiB\", \"2.5s\")", key);
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

int flare_config_parse(const char *text, size_t len, const char *filename,
		       struct flare_settings *out, char *err, size_t errlen)
{
	struct parser p = {filename ? filename : "config", 0, err, errlen};
	char section[64] = "";
	bool in_section = false;
	unsigned key_line[FLARE_OPT_COUNT] = {0};
	struct {
		char name[64];
		unsigned line;
	} seen[8];
	size_t nseen = 0;
	char *value = malloc(VALUE_MAX);
	int rc = 0;
	if (!value) {
		snprintf(err, errlen, "%s: out of memory", p.file);
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
		const char *next = nl ? nl + 1 : end_all;
		p.line++;
		if (end > pos && end[-1] == '\r')
			end--;
		if (end > pos && memchr(pos, '\0', (size_t)(end - pos))) {
			rc = perr(&p, "NUL byte in the file");
			break;
		}
		const char *s = skip_ws(pos, end);
		pos = next;
		if (s == end || *s == '#')
			continue;
		char piece[96];

		if (*s == '[') {
			if (s + 1 < end && s[1] == '[') {
				rc = perr(&p, "arrays of tables ([[...]]) are not supported");
				break;
			}
			const char *n0 = skip_ws(s + 1, end), *n1 = n0;
			while (n1 < end && is_bare(*n1))
				n1++;
			const char *close = skip_ws(n1, end);
			if (n1 < end && (*n1 == '.' || *n1 == '"' || *n1 == '\'')) {
				rc = perr(&p, "section '%s': dotted and quoted section names are not supported",
					  quote_piece(s, end, piece, sizeof piece));
				break;
			}
			if (n1 == n0 || close >= end || *close != ']') {
				rc = perr(&p, "'%s' is not a section header ([name])",
					  quote_piece(s, end, piece, sizeof piece));
				break;
			}
			if (!rest_is_empty(close + 1, end)) {
				rc = perr(&p, "unexpected text after the section header [%.*s]",
					  (int)(n1 - n0), n0);
				break;
			}
			size_t nlen = (size_t)(n1 - n0);
			if (nlen >= sizeof section) {
				rc = perr(&p, "unknown section [%.40s...]", n0);
				break;
			}
			memcpy(section, n0, nlen);
			section[nlen] = '\0';
			if (strcmp(section, "server") && strcmp(section, "prefix_cache")) {
				rc = perr(&p, "unknown section [%s] (known: [server], [prefix_cache])", section);
				break;
			}
			for (size_t i = 0; i < nseen; i++)
				if (!strcmp(seen[i].name, section)) {
					rc = perr(&p, "section [%s] appears twice (first on line %u)", section,
						  seen[i].line);
					break;
				}
			if (rc)
				break;
			snprintf(seen[nseen].name, sizeof seen[nseen].name, "%s", section);
			seen[nseen++].line = p.line;
			in_section = true;
			continue;
		}

		/* key = value */
		const char *k0 = s, *k1 = s;
		while (k1 < end && is_bare(*k1))
			k1++;
		if (k1 == k0) {
			if (*s == '"' || *s == '\'')
				rc = perr(&p, "quoted keys are not supported");
			else
				rc = perr(&p, "'%s' is not a 'key = value' line",
					  quote_piece(s, end, piece, sizeof piece));
			break;
		}
		char key[64];
		size_t klen = (size_t)(k1 - k0);
		snprintf(key, sizeof key, "%.*s", (int)(klen < 63 ? klen : 63), k0);
		const char *eq = skip_ws(k1, end);
		if (eq < end && *eq == '.') {
			rc = perr(&p, "%s: dotted keys are not supported", key);
			break;
		}
		if (eq >= end || *eq != '=') {
			rc = perr(&p, "%s: expected '=' after the key", key);
			break;
		}
		if (!in_section) {
			rc = perr(&p, "key '%s' outside a section (put it under [server] or [prefix_cache])",
				  key);
			break;
		}
		const struct flare_option *o = klen < 63 ? flare_option_by_key(section, key) : NULL;
		if (!o) {
			rc = perr(&p, "unknown key '%s' in [%s]", key, section);
			break;
		}
		char qkey[160];
		snprintf(qkey, sizeof qkey, "%s.%s", section, key);
		if (key_line[o->id]) {
			rc = perr(&p, "%s: set twice (first on line %u)", qkey, key_line[o->id]);
			break;
		}
		key_line[o->id] = p.line;

		const char *v = skip_ws(eq + 1, end);
		enum flare_vtype vt = FLARE_V_STRING;
		if (v >= end || *v == '#') {
			rc = perr(&p, "%s: expected a value after '='", qkey);
			break;
		}
		if (*v == '"' || *v == '\'') {
			vt = FLARE_V_STRING;
			rc = read_string(&p, qkey, &v, end, value);
		} else if ((*v >= '0' && *v <= '9') || *v == '+' || *v == '-') {
			vt = FLARE_V_INTEGER;
			rc = read_integer(&p, qkey, &v, end, value);
		} else if (end - v >= 4 && !memcmp(v, "true", 4) && (end - v == 4 || !is_bare(v[4]))) {
			vt = FLARE_V_BOOL;
			strcpy(value, "true");
			v += 4;
		} else if (end - v >= 5 && !memcmp(v, "false", 5) && (end - v == 5 || !is_bare(v[5]))) {
			vt = FLARE_V_BOOL;
			strcpy(value, "false");
			v += 5;
		} else if (*v == '[') {
			rc = perr(&p, "%s: arrays are not supported", qkey);
		} else if (*v == '{') {
			rc = perr(&p, "%s: inline tables are not supported", qkey);
		} else {
			rc = perr(&p, "%s: '%s' is not a value (strings need quotes: \"%s\")", qkey,
				  quote_piece(v, end, piece, sizeof piece), piece);
		}
		if (rc)
			break;
		if (!rest_is_empty(v, end)) {
			rc = perr(&p, "%s: unexpected text after the value: '%s'", qkey,
				  quote_piece(skip_ws(v, end), end, piece, sizeof piece));
			break;
		}
		if (vt == FLARE_V_INTEGER && value[0] == '-') {
			rc = perr(&p, "%s: %s is negative", qkey, value);
			break;
		}
		char why[768];
		if (flare_settings_set(out, o, value, vt, why, sizeof why)) {
			rc = perr(&p, "%s: %s", qkey, why);
			break;
		}
	}
	free(value);
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
