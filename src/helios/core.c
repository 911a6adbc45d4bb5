/*
 * core.c - the core file: parser, canonical form and model identity
 * (docs/core-format.md; design 2.1 "Checkpoint bytes").
 *
 * A core is a small text file of `key = value` lines with `#` comments and
 * three kinds of section: [plane NAME], [draft_plane NAME] and [row].  This
 * file turns it into a hel_core, rejecting anything unknown, duplicated,
 * missing or out of range with a message that names the file, the line and
 * the field, and derives the two things other modules build on: the
 * canonical text (and from it the model identity) and the row layout.
 *
 * DESIGN
 *   Parsing is pure: text in, struct out, no I/O (STYLE 3), so the fuzzer
 *   (fuzz/fuzz_core.c) and the tests call it directly; hel_core_load() is
 *   the only function that reads a file.
 *   The canonical form is itself a core: fields in a fixed order, planes in
 *   strcmp order of names, numbers in decimal, no comments.  The model
 *   identity is BLAKE2b-256("flare-core-v1\n" || canonical text), so
 *   comments, whitespace, units ("4KiB" vs "4096") and the order of lines
 *   and sections do not change it, and every semantic field does.
 *   Everything the model derives from a core (weights, plane salts, byte
 *   layout) uses the sorted plane order, never the file's order, so equal
 *   identities mean equal models.
 *
 * INVARIANTS (of a hel_core returned by hel_core_parse)
 *   1. Every field is within the limits of core.h; n_planes >= 1.
 *   2. planes[] and drafts[] are each strictly increasing by strcmp, and no
 *      name appears in both.
 *   3. n_drafts > 0 and draft_history > 0 exactly when a speculative state
 *      mode (copy, learned) is supported; ordinary may or may not be.
 *   4. parse(canonical) yields an equal core with the same identity.
 *   5. Every row layout is a multiple of 8 bytes, <= HEL_ROW_MAX.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "core.h"
#include "eos.h"

#define CORE_DOMAIN "flare-core-v1\n"
#define FILE_MAX (1u << 20)

/* ---- Errors ------------------------------------------------------------ */

struct parser {
	const char *file;
	char *err;
	size_t errlen;
	uint32_t lines; /* lines read so far (the last line number at the end) */
};

__attribute__((format(printf, 4, 5))) static int perr(struct parser *p, uint32_t line,
						      const char *field, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (p->err && p->errlen)
		snprintf(p->err, p->errlen, "%s:%u: %s: %s", p->file, line, field, msg);
	eos_fail(SEL_EFORMAT, "%s:%u: %s: %s", p->file, line, field, msg);
	return SEL_EFORMAT;
}

/* ---- Values ------------------------------------------------------------ */

/* A quoted copy of a value for messages, shortened. */
static const char *q(const char *v, char *buf, size_t len)
{
	size_t n = strlen(v);
	if (n + 1 <= len) {
		memcpy(buf, v, n + 1);
	} else {
		memcpy(buf, v, len - 4);
		memcpy(buf + len - 4, "...", 4);
	}
	return buf;
}

/* Whole number: decimal, or hexadecimal with 0x.  No sign, no spaces. */
static int parse_uint(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	unsigned base = 10;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
	}
	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		unsigned d;
		if (*s >= '0' && *s <= '9')
			d = (unsigned)(*s - '0');
		else if (base == 16 && *s >= 'a' && *s <= 'f')
			d = (unsigned)(*s - 'a' + 10);
		else if (base == 16 && *s >= 'A' && *s <= 'F')
			d = (unsigned)(*s - 'A' + 10);
		else
			return -EINVAL;
		if (v > (UINT64_MAX - d) / base)
			return -ERANGE;
		v = v * base + d;
	}
	*out = v;
	return 0;
}

/* Byte size: a whole decimal number and an optional unit (B, K/KB/KiB,
 * M/MB/MiB, G/GB/GiB; case-insensitive, 1024-based), optionally separated by
 * spaces.  Parsed here rather than with eos_parse_size so the core parser
 * stays self-contained (and rejects fractions: sizes here are exact). */
static int parse_size(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	const char *p = s;
	if (!(*p >= '0' && *p <= '9'))
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (v > (UINT64_MAX - 9) / 10)
			return -ERANGE;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	while (*p == ' ' || *p == '\t')
		p++;
	static const struct {
		const char *u;
		unsigned shift;
	} units[] = {
		{"", 0},    {"b", 0},    {"k", 10}, {"kb", 10}, {"kib", 10}, {"m", 20},
		{"mb", 20}, {"mib", 20}, {"g", 30}, {"gb", 30}, {"gib", 30},
	};
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (strcasecmp(p, units[i].u) == 0) {
			if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
				return -ERANGE;
			*out = v << units[i].shift;
			return 0;
		}
	}
	return -EINVAL;
}

static bool valid_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > HEL_NAME_MAX)
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '.' || *s == '_' || *s == '-'))
			return false;
	return true;
}

const char *hel_resize_name(hel_resize r)
{
	return r == HEL_RESIZE_CROP ? "crop" : r == HEL_RESIZE_STRETCH ? "stretch" : "fit";
}

int hel_resize_parse(const char *s, hel_resize *out)
{
	if (strcmp(s, "fit") == 0)
		*out = HEL_RESIZE_FIT;
	else if (strcmp(s, "crop") == 0)
		*out = HEL_RESIZE_CROP;
	else if (strcmp(s, "stretch") == 0)
		*out = HEL_RESIZE_STRETCH;
	else
		return -EINVAL;
	return 0;
}

int hel_state_mode_parse(const char *s, sel_state_mode *out)
{
	if (strcmp(s, "ordinary") == 0)
		*out = SEL_MODE_ORDINARY;
	else if (strcmp(s, "copy") == 0)
		*out = SEL_MODE_COPY;
	else if (strcmp(s, "learned") == 0)
		*out = SEL_MODE_LEARNED;
	else
		return -EINVAL;
	return 0;
}

/* ---- Fields ------------------------------------------------------------ */

enum section {
	SEC_TOP,
	SEC_ROW,
	SEC_PLANE,
	SEC_IMAGE
};

/* How messages name a section's place. */
static const char *sec_name(enum section s)
{
	return s == SEC_TOP     ? "the top of the file"
	       : s == SEC_ROW   ? "[row]"
	       : s == SEC_PLANE ? "a [plane] section"
				: "[image]";
}

/* Integer fields and their rules; `line` records where each was set. */
enum field {
	F_NAME,
	F_PAGE_TOKENS,
	F_RANKS,
	F_VOCAB,
	F_HIDDEN,
	F_LAYERS,
	F_SEED,
	F_MAX_CONTEXT,
	F_STATE_MODES,
	F_TOP_END,
	F_RECURRENT_BYTES = F_TOP_END,
	F_RECURRENT_SHARD,
	F_DRAFT_HISTORY,
	F_ROW_END,
	F_TOKEN_BYTES = F_ROW_END,
	F_SHARD,
	F_PLANE_END,
	F_PATCH_SIZE = F_PLANE_END,
	F_MERGE,
	F_MAX_TOKENS,
	F_RESIZE,
	F_CHANNELS,
	F_END,
};

static const struct field_rule {
	const char *key;
	enum section sec;
	bool required;
	bool size; /* accepts units */
	uint64_t min, max, multiple;
	const char *expect; /* for range messages */
} rules[F_END] = {
	[F_NAME] = {"name", SEC_TOP, true, false, 0, 0, 0, NULL},
	[F_PAGE_TOKENS] = {"page_tokens", SEC_TOP, true, false, 64, HEL_PAGE_TOKENS_MAX, 64,
			   "a multiple of 64 in 64..4096"},
	[F_RANKS] = {"ranks", SEC_TOP, true, false, 1, HEL_RANKS_MAX, 1, "1..64"},
	[F_VOCAB] = {"vocab", SEC_TOP, true, false, HEL_VOCAB_MIN, HEL_VOCAB_MAX, 1,
		     "259..65536: 256 bytes, BEGIN, END, MESSAGE and any reserved ids"},
	[F_HIDDEN] = {"hidden", SEC_TOP, true, false, 8, HEL_HIDDEN_MAX, 8,
		      "a multiple of 8 in 8..4096"},
	[F_LAYERS] = {"layers", SEC_TOP, true, false, 1, HEL_LAYERS_MAX, 1, "1..64"},
	[F_SEED] = {"seed", SEC_TOP, true, false, 0, UINT64_MAX, 1, "a 64-bit number"},
	[F_MAX_CONTEXT] = {"max_context", SEC_TOP, true, false, 64, HEL_CONTEXT_MAX, 1,
			   "page_tokens..16777216"},
	[F_STATE_MODES] = {"state_modes", SEC_TOP, false, false, 0, 0, 0, NULL},
	[F_RECURRENT_BYTES] = {"recurrent_bytes", SEC_ROW, true, true, 0, HEL_RECURRENT_MAX, 8,
			       "a multiple of 8 bytes up to 16 GiB"},
	[F_RECURRENT_SHARD] = {"recurrent_shard", SEC_ROW, true, false, 0, 0, 0, NULL},
	[F_DRAFT_HISTORY] = {"draft_history", SEC_ROW, false, false, 8, HEL_DRAFT_HISTORY_MAX, 8,
			     "a multiple of 8 tokens in 8..65536"},
	[F_TOKEN_BYTES] = {"token_bytes", SEC_PLANE, true, true, 8, HEL_TOKEN_BYTES_MAX, 8,
			   "a multiple of 8 bytes in 8..16 MiB"},
	[F_SHARD] = {"shard", SEC_PLANE, true, false, 0, 0, 0, NULL},
	[F_PATCH_SIZE] = {"patch_size", SEC_IMAGE, true, false, 2, HEL_PATCH_MAX, 1,
			  "2..64 pixels"},
	[F_MERGE] = {"merge", SEC_IMAGE, false, false, 1, HEL_MERGE_MAX, 1,
		     "1..4 patches per image-token side"},
	[F_MAX_TOKENS] = {"max_tokens", SEC_IMAGE, true, false, 1, HEL_IMAGE_TOKENS_MAX, 1,
			  "1..16384 image tokens"},
	[F_RESIZE] = {"resize", SEC_IMAGE, true, false, 0, 0, 0, NULL},
	[F_CHANNELS] = {"channels", SEC_IMAGE, true, false, 1, 4, 1,
			"1 (gray), 3 (rgb) or 4 (rgba)"},
};

struct raw_plane {
	hel_core_plane p;
	uint32_t line;       /* of the section header */
	uint32_t set[F_END]; /* line each field was set on, 0 if not */
};

struct raw {
	hel_core *c;
	uint32_t set[F_END];
	uint32_t row_line;
	uint32_t image_line;
	struct raw_plane *planes;
	uint32_t n, cap;
};

static int parse_shard(const char *v, hel_shard *out)
{
	if (strcmp(v, "replicated") == 0)
		*out = HEL_SHARD_REPLICATED;
	else if (strcmp(v, "split") == 0)
		*out = HEL_SHARD_SPLIT;
	else
		return -EINVAL;
	return 0;
}

static const char *r_expect(enum field f) { return rules[f].expect; }

static int set_number(struct parser *p, uint32_t line, enum field f, const char *v, uint64_t *out)
{
	const struct field_rule *r = &rules[f];
	char b[48];
	uint64_t x;
	int rc = r->size ? parse_size(v, &x) : parse_uint(v, &x);
	if (rc == -ERANGE)
		return perr(p, line, r->key, "'%s' is too large (expected %s)", q(v, b, sizeof b),
			    r->expect);
	if (rc)
		return perr(
			p, line, r->key,
			r->size ? "'%s' is not a size (expected a whole number of bytes with an "
				  "optional unit B, KiB, MiB or GiB)"
				: "'%s' is not a number (expected decimal or 0x hexadecimal)",
			q(v, b, sizeof b));
	if (x < r->min || x > r->max || (r->multiple > 1 && x % r->multiple))
		return perr(p, line, r->key, "%llu is out of range (expected %s)",
			    (unsigned long long)x, r->expect);
	*out = x;
	return 0;
}

static int set_field(struct parser *p, struct raw *raw, enum section sec, uint32_t line,
		     const char *key, const char *v)
{
	hel_core *c = raw->c;
	struct raw_plane *pl = sec == SEC_PLANE ? &raw->planes[raw->n - 1] : NULL;
	uint32_t *set = pl ? pl->set : raw->set;
	enum field f = F_END;
	char b[48];
	uint64_t x = 0;
	int rc;

	for (int i = 0; i < F_END; i++)
		if (rules[i].sec == sec && strcmp(rules[i].key, key) == 0)
			f = (enum field)i;
	if (f == F_END) {
		for (int i = 0; i < F_END; i++)
			if (strcmp(rules[i].key, key) == 0)
				return perr(p, line, key, "belongs in %s, not %s",
					    sec_name(rules[i].sec), sec_name(sec));
		return perr(p, line, key, "unknown key%s%s", sec == SEC_TOP ? "" : " in ",
			    sec == SEC_TOP ? "" : sec_name(sec));
	}
	if (set[f])
		return perr(p, line, key, "set twice (first on line %u)", set[f]);
	set[f] = line;

	switch (f) {
	case F_NAME:
		if (!valid_name(v))
			return perr(p, line, key,
				    "'%s' is not a name (expected 1..63 of A-Z a-z 0-9 . _ -)",
				    q(v, b, sizeof b));
		snprintf(c->name, sizeof c->name, "%s", v);
		return 0;
	case F_STATE_MODES: {
		char tmp[256];
		if (strlen(v) >= sizeof tmp)
			return perr(p, line, key, "value too long");
		snprintf(tmp, sizeof tmp, "%s", v);
		uint32_t modes = 0;
		char *save = NULL;
		for (char *w = strtok_r(tmp, " \t,", &save); w; w = strtok_r(NULL, " \t,", &save)) {
			sel_state_mode m;
			if (hel_state_mode_parse(w, &m))
				return perr(
					p, line, key,
					"'%s' is not a state mode (expected ordinary, copy or learned)",
					q(w, b, sizeof b));
			if (modes >> m & 1u)
				return perr(p, line, key, "'%s' listed twice", w);
			modes |= 1u << m;
		}
		if (!modes)
			return perr(p, line, key, "no state mode listed");
		c->modes = modes;
		return 0;
	}
	case F_RESIZE:
		if (hel_resize_parse(v, &c->image.resize))
			return perr(p, line, key,
				    "'%s' is not a resize mode (expected fit, crop or stretch)",
				    q(v, b, sizeof b));
		return 0;
	case F_RECURRENT_SHARD:
	case F_SHARD: {
		hel_shard s;
		if (parse_shard(v, &s))
			return perr(p, line, key,
				    "'%s' is not a shard kind (expected replicated or split)",
				    q(v, b, sizeof b));
		if (f == F_SHARD)
			pl->p.shard = s;
		else
			c->recurrent_shard = s;
		return 0;
	}
	default: break;
	}
	if ((rc = set_number(p, line, f, v, &x)))
		return rc;
	switch (f) {
	case F_PAGE_TOKENS: c->page_tokens = (uint32_t)x; break;
	case F_RANKS: c->ranks = (uint32_t)x; break;
	case F_VOCAB: c->vocab = (uint32_t)x; break;
	case F_HIDDEN: c->hidden = (uint32_t)x; break;
	case F_LAYERS: c->layers = (uint32_t)x; break;
	case F_SEED: c->seed = x; break;
	case F_MAX_CONTEXT: c->max_context = x; break;
	case F_RECURRENT_BYTES: c->recurrent_bytes = x; break;
	case F_DRAFT_HISTORY: c->draft_history = (uint32_t)x; break;
	case F_TOKEN_BYTES: pl->p.token_bytes = x; break;
	case F_PATCH_SIZE: c->image.patch = (uint32_t)x; break;
	case F_MERGE: c->image.merge = (uint32_t)x; break;
	case F_MAX_TOKENS: c->image.max_tokens = (uint32_t)x; break;
	case F_CHANNELS:
		if (x == 2)
			return perr(p, line, key, "2 is out of range (expected %s)", r_expect(f));
		c->image.channels = (uint32_t)x;
		break;
	default: break;
	}
	return 0;
}

/* "[kind name]" with the brackets already checked; inner is trimmed. */
static int open_section(struct parser *p, struct raw *raw, uint32_t line, char *inner,
			enum section *sec)
{
	char *save = NULL, b[48];
	char *kind = strtok_r(inner, " \t", &save);
	char *name = kind ? strtok_r(NULL, " \t", &save) : NULL;
	char *extra = name ? strtok_r(NULL, " \t", &save) : NULL;

	if (!kind)
		return perr(p, line, "[]", "empty section header");
	if (strcmp(kind, "row") == 0) {
		if (name)
			return perr(p, line, "[row]", "takes no name (found '%s')",
				    q(name, b, sizeof b));
		if (raw->row_line)
			return perr(p, line, "[row]", "section repeated (first on line %u)",
				    raw->row_line);
		raw->row_line = line;
		*sec = SEC_ROW;
		return 0;
	}
	if (strcmp(kind, "image") == 0) {
		if (name)
			return perr(p, line, "[image]", "takes no name (found '%s')",
				    q(name, b, sizeof b));
		if (raw->image_line)
			return perr(p, line, "[image]", "section repeated (first on line %u)",
				    raw->image_line);
		raw->image_line = line;
		*sec = SEC_IMAGE;
		return 0;
	}
	bool draft = strcmp(kind, "draft_plane") == 0;
	if (!draft && strcmp(kind, "plane") != 0)
		return perr(
			p, line, "[section]",
			"'%s' is not a section (expected [plane NAME], [draft_plane NAME], [row] "
			"or [image])",
			q(kind, b, sizeof b));
	const char *sname = draft ? "[draft_plane]" : "[plane]";
	if (!name)
		return perr(p, line, sname, "missing plane name");
	if (extra)
		return perr(p, line, sname, "unexpected '%s' after the plane name",
			    q(extra, b, sizeof b));
	if (!valid_name(name))
		return perr(p, line, sname,
			    "'%s' is not a name (expected 1..63 of A-Z a-z 0-9 . _ -)",
			    q(name, b, sizeof b));
	for (uint32_t i = 0; i < raw->n; i++)
		if (strcmp(raw->planes[i].p.name, name) == 0)
			return perr(p, line, sname, "plane '%s' already declared on line %u", name,
				    raw->planes[i].line);
	if (raw->n == HEL_PLANES_MAX + HEL_DRAFT_PLANES_MAX)
		return perr(p, line, sname, "too many planes");
	if (raw->n == raw->cap) {
		uint32_t cap = raw->cap ? raw->cap * 2 : 16;
		struct raw_plane *np = realloc(raw->planes, cap * sizeof *np);
		if (!np)
			return -ENOMEM;
		raw->planes = np;
		raw->cap = cap;
	}
	struct raw_plane *pl = &raw->planes[raw->n++];
	memset(pl, 0, sizeof *pl);
	snprintf(pl->p.name, sizeof pl->p.name, "%s", name);
	pl->p.draft = draft;
	pl->line = line;
	*sec = SEC_PLANE;
	return 0;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\r')
		s++;
	char *e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
		*--e = 0;
	return s;
}

static bool valid_key(const char *k)
{
	if (!*k)
		return false;
	for (; *k; k++)
		if (!((*k >= 'a' && *k <= 'z') || *k == '_' || (*k >= '0' && *k <= '9')))
			return false;
	return true;
}

static int parse_lines(struct parser *p, struct raw *raw, const char *text, size_t len)
{
	enum section sec = SEC_TOP;
	char *buf = NULL;
	size_t cap = 0;
	int rc = 0;

	for (size_t pos = 0; pos < len && !rc;) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
		uint32_t line = ++p->lines;
		if (memchr(text + pos, 0, n)) {
			rc = perr(p, line, "syntax", "NUL byte in the text");
			break;
		}
		if (!buf || n + 1 > cap) {
			char *nb = realloc(buf, n + 1);
			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			buf = nb;
			cap = n + 1;
		}
		memcpy(buf, text + pos, n);
		buf[n] = 0;
		pos += n + (nl ? 1 : 0);

		char *hash = strchr(buf, '#');
		if (hash)
			*hash = 0;
		char *s = trim(buf);
		if (!*s)
			continue;
		if (*s == '[') {
			size_t sl = strlen(s);
			if (s[sl - 1] != ']') {
				rc = perr(p, line, "syntax",
					  "section header without a closing ']'");
				break;
			}
			s[sl - 1] = 0;
			rc = open_section(p, raw, line, trim(s + 1), &sec);
			continue;
		}
		char *eq = strchr(s, '=');
		if (!eq) {
			char b[48];
			rc = perr(p, line, "syntax", "'%s' is not 'key = value' or '[section]'",
				  q(s, b, sizeof b));
			break;
		}
		*eq = 0;
		char *key = trim(s), *val = trim(eq + 1);
		if (!valid_key(key)) {
			char b[48];
			rc = perr(p, line, "syntax", "'%s' is not a key (expected a-z, 0-9 and _)",
				  q(key, b, sizeof b));
			break;
		}
		if (!*val) {
			rc = perr(p, line, key, "missing value");
			break;
		}
		rc = set_field(p, raw, sec, line, key, val);
	}
	free(buf);
	return rc;
}

/* ---- Checks across fields ------------------------------------------------ */

static int plane_cmp(const void *a, const void *b)
{
	return strcmp(((const hel_core_plane *)a)->name, ((const hel_core_plane *)b)->name);
}

static bool speculative(uint32_t modes)
{
	return (modes & (1u << SEL_MODE_COPY | 1u << SEL_MODE_LEARNED)) != 0;
}

/* The [image] section: required keys, and what the model needs of it. */
static int check_image(struct parser *p, struct raw *raw)
{
	hel_core *c = raw->c;
	hel_core_image *im = &c->image;
	for (int f = F_PLANE_END; f < F_END; f++)
		if (rules[f].required && !raw->set[f])
			return perr(p, raw->image_line, rules[f].key,
				    "missing in [image] (required)");
	if (!raw->set[F_MERGE])
		im->merge = 1;
	if (c->vocab <= HEL_TOK_IMAGE)
		return perr(
			p, raw->set[F_VOCAB], "vocab",
			"%u leaves no id for image tokens (a core with [image] needs at least %u)",
			c->vocab, HEL_TOK_IMAGE + 1);
	if (im->max_tokens > c->max_context)
		return perr(p, raw->set[F_MAX_TOKENS], "max_tokens",
			    "%u image tokens do not fit in max_context (%llu)", im->max_tokens,
			    (unsigned long long)c->max_context);
	uint64_t side = (uint64_t)im->patch * im->merge;
	uint64_t bytes = (uint64_t)im->max_tokens * side * side * im->channels;
	if (bytes > HEL_PREPARED_MAX)
		return perr(p, raw->set[F_MAX_TOKENS], "max_tokens",
			    "%u tokens of %llu x %llu pixels x %u channels are %llu prepared bytes "
			    "(at most %llu MiB per image)",
			    im->max_tokens, (unsigned long long)side, (unsigned long long)side,
			    im->channels, (unsigned long long)bytes,
			    (unsigned long long)(HEL_PREPARED_MAX >> 20));
	c->has_image = true;
	return 0;
}

static int check(struct parser *p, struct raw *raw)
{
	hel_core *c = raw->c;
	uint32_t end = p->lines ? p->lines : 1;
	int rc;

	for (int f = 0; f < F_TOP_END; f++)
		if (rules[f].required && !raw->set[f])
			return perr(p, end, rules[f].key, "missing (required)");
	if (!raw->set[F_STATE_MODES])
		c->modes = 1u << SEL_MODE_ORDINARY;
	if (!raw->row_line)
		return perr(p, end, "[row]", "missing section (required)");
	for (int f = F_TOP_END; f < F_ROW_END; f++)
		if (rules[f].required && !raw->set[f])
			return perr(p, raw->row_line, rules[f].key, "missing in [row] (required)");
	for (uint32_t i = 0; i < raw->n; i++)
		for (int f = F_ROW_END; f < F_PLANE_END; f++)
			if (rules[f].required && !raw->planes[i].set[f])
				return perr(p, raw->planes[i].line, rules[f].key,
					    "missing in [%s %s] (required)",
					    raw->planes[i].p.draft ? "draft_plane" : "plane",
					    raw->planes[i].p.name);
	if (raw->image_line && (rc = check_image(p, raw)))
		return rc;
	if ((uint64_t)c->vocab * c->hidden > HEL_WEIGHTS_MAX)
		return perr(p, raw->set[F_HIDDEN], "hidden",
			    "vocab x hidden = %llu (at most %u weights per matrix)",
			    (unsigned long long)c->vocab * c->hidden, HEL_WEIGHTS_MAX);
	if (c->max_context < c->page_tokens)
		return perr(p, raw->set[F_MAX_CONTEXT], "max_context",
			    "%llu is less than page_tokens (%u)",
			    (unsigned long long)c->max_context, c->page_tokens);

	uint32_t n_main = 0, n_draft = 0;
	for (uint32_t i = 0; i < raw->n; i++) {
		struct raw_plane *pl = &raw->planes[i];
		if (pl->p.draft && !speculative(c->modes))
			return perr(p, pl->line, "[draft_plane]",
				    "'%s': draft planes need a speculative state mode "
				    "(state_modes = ... copy or learned)",
				    pl->p.name);
		if (pl->p.draft)
			n_draft++;
		else
			n_main++;
	}
	if (n_main == 0)
		return perr(p, end, "[plane]",
			    "no page planes (expected at least one [plane NAME])");
	if (n_main > HEL_PLANES_MAX)
		return perr(p, end, "[plane]", "%u page planes (at most %u)", n_main,
			    HEL_PLANES_MAX);
	if (n_draft > HEL_DRAFT_PLANES_MAX)
		return perr(p, end, "[draft_plane]", "%u draft planes (at most %u)", n_draft,
			    HEL_DRAFT_PLANES_MAX);
	if (speculative(c->modes)) {
		if (n_draft == 0)
			return perr(p, raw->set[F_STATE_MODES], "state_modes",
				    "speculative modes need at least one [draft_plane NAME]");
		if (!raw->set[F_DRAFT_HISTORY])
			return perr(p, raw->row_line, "draft_history",
				    "missing in [row] (required by speculative state modes)");
	} else if (raw->set[F_DRAFT_HISTORY]) {
		return perr(p, raw->set[F_DRAFT_HISTORY], "draft_history",
			    "only meaningful with a speculative state mode (copy or learned)");
	}

	/* Row size bound, per rank, in the largest mode. */
	uint64_t row =
		8 + 2ull * c->hidden * 4 + c->recurrent_bytes + (uint64_t)c->draft_history * 4;
	for (uint32_t i = 0; i < raw->n; i++) {
		row += c->page_tokens * raw->planes[i].p.token_bytes;
		if (row > HEL_ROW_MAX)
			return perr(p, raw->planes[i].set[F_TOKEN_BYTES], "token_bytes",
				    "the row would exceed %llu GiB per rank",
				    (unsigned long long)(HEL_ROW_MAX >> 30));
	}

	c->planes = calloc(n_main, sizeof *c->planes);
	c->drafts = calloc(n_draft ? n_draft : 1, sizeof *c->drafts);
	if (!c->planes || !c->drafts)
		return -ENOMEM;
	for (uint32_t i = 0; i < raw->n; i++) {
		if (raw->planes[i].p.draft)
			c->drafts[c->n_drafts++] = raw->planes[i].p;
		else
			c->planes[c->n_planes++] = raw->planes[i].p;
	}
	qsort(c->planes, c->n_planes, sizeof *c->planes, plane_cmp);
	qsort(c->drafts, c->n_drafts, sizeof *c->drafts, plane_cmp);
	return 0;
}

/* ---- Canonical form and identity ------------------------------------------ */

struct sbuf {
	char *b;
	size_t n, cap;
	bool oom;
};

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sbuf *s, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		if (s->oom)
			return;
		va_start(ap, fmt);
		int k = vsnprintf(s->b ? s->b + s->n : NULL, s->b ? s->cap - s->n : 0, fmt, ap);
		va_end(ap);
		if (k < 0) {
			s->oom = true;
			return;
		}
		if (s->b && s->n + (size_t)k < s->cap) {
			s->n += (size_t)k;
			return;
		}
		size_t cap = s->cap ? s->cap * 2 : 1024;
		while (cap < s->n + (size_t)k + 1)
			cap *= 2;
		char *nb = realloc(s->b, cap);
		if (!nb) {
			s->oom = true;
			return;
		}
		s->b = nb;
		s->cap = cap;
	}
}

static const char *shard_name(hel_shard s) { return s == HEL_SHARD_SPLIT ? "split" : "replicated"; }

static int canonicalize(hel_core *c)
{
	struct sbuf s = {0};
	sb_printf(&s, "name = %s\n", c->name);
	sb_printf(&s, "page_tokens = %u\n", c->page_tokens);
	sb_printf(&s, "ranks = %u\n", c->ranks);
	sb_printf(&s, "vocab = %u\n", c->vocab);
	sb_printf(&s, "hidden = %u\n", c->hidden);
	sb_printf(&s, "layers = %u\n", c->layers);
	sb_printf(&s, "seed = %llu\n", (unsigned long long)c->seed);
	sb_printf(&s, "max_context = %llu\n", (unsigned long long)c->max_context);
	sb_printf(&s, "state_modes =");
	for (int m = 0; m < 3; m++)
		if (c->modes >> m & 1u)
			sb_printf(&s, " %s", sel_state_mode_name((sel_state_mode)m));
	sb_printf(&s, "\n\n[row]\nrecurrent_bytes = %llu\nrecurrent_shard = %s\n",
		  (unsigned long long)c->recurrent_bytes, shard_name(c->recurrent_shard));
	if (c->draft_history)
		sb_printf(&s, "draft_history = %u\n", c->draft_history);
	if (c->has_image)
		sb_printf(&s,
			  "\n[image]\npatch_size = %u\nmerge = %u\nmax_tokens = %u\nresize = %s\n"
			  "channels = %u\n",
			  c->image.patch, c->image.merge, c->image.max_tokens,
			  hel_resize_name(c->image.resize), c->image.channels);
	for (uint32_t i = 0; i < c->n_planes; i++)
		sb_printf(&s, "\n[plane %s]\ntoken_bytes = %llu\nshard = %s\n", c->planes[i].name,
			  (unsigned long long)c->planes[i].token_bytes,
			  shard_name(c->planes[i].shard));
	for (uint32_t i = 0; i < c->n_drafts; i++)
		sb_printf(&s, "\n[draft_plane %s]\ntoken_bytes = %llu\nshard = %s\n",
			  c->drafts[i].name, (unsigned long long)c->drafts[i].token_bytes,
			  shard_name(c->drafts[i].shard));
	if (s.oom) {
		free(s.b);
		return -ENOMEM;
	}
	c->canonical = s.b;
	c->canonical_len = s.n;

	crypto_generichash_blake2b_state st;
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_IDENTITY_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)CORE_DOMAIN,
					  strlen(CORE_DOMAIN));
	crypto_generichash_blake2b_update(&st, (const unsigned char *)c->canonical,
					  c->canonical_len);
	crypto_generichash_blake2b_final(&st, c->identity, SEL_IDENTITY_BYTES);
	return 0;
}

/* ---- Entry points ------------------------------------------------------- */

int hel_core_parse(const char *text, size_t len, const char *filename, hel_core **out, char *err,
		   size_t errlen)
{
	struct parser p = {.file = filename ? filename : "core", .err = err, .errlen = errlen};
	struct raw raw = {0};
	int rc;

	*out = NULL;
	if (err && errlen)
		err[0] = 0;
	if (!text && len)
		return perr(&p, 0, "text", "no text");
	if (len > FILE_MAX)
		return perr(&p, 0, "text", "%zu bytes (a core is at most %u)", len, FILE_MAX);
	raw.c = calloc(1, sizeof *raw.c);
	if (!raw.c) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = parse_lines(&p, &raw, text ? text : "", len)))
		goto fail;
	if ((rc = check(&p, &raw)))
		goto fail;
	if ((rc = canonicalize(raw.c)))
		goto fail;
	free(raw.planes);
	*out = raw.c;
	return 0;
fail:
	if (rc == -ENOMEM) {
		if (err && errlen)
			snprintf(err, errlen, "%s: out of memory", p.file);
		eos_fail(-ENOMEM, "%s: out of memory", p.file);
	}
	free(raw.planes);
	hel_core_free(raw.c);
	return rc;
}

int hel_core_load(const char *path, hel_core **out, char *err, size_t errlen)
{
	char *buf = NULL;
	size_t n = 0;
	int rc;

	*out = NULL;
	FILE *f = fopen(path, "rb");
	if (!f) {
		rc = -errno;
		if (err && errlen)
			snprintf(err, errlen, "%s: %s", path, strerror(-rc));
		return eos_fail(rc, "%s: %s", path, strerror(-rc));
	}
	buf = malloc(FILE_MAX + 1);
	if (!buf) {
		fclose(f);
		return eos_fail(-ENOMEM, "%s: out of memory", path);
	}
	n = fread(buf, 1, FILE_MAX + 1, f);
	rc = ferror(f) ? -EIO : 0;
	fclose(f);
	if (!rc && n > FILE_MAX)
		rc = -EFBIG;
	if (rc) {
		if (err && errlen)
			snprintf(err, errlen, "%s: %s", path,
				 rc == -EFBIG ? "larger than 1 MiB: not a core" : strerror(-rc));
		free(buf);
		return eos_fail(rc, "%s: cannot read", path);
	}
	rc = hel_core_parse(buf, n, path, out, err, errlen);
	free(buf);
	return rc;
}

void hel_core_free(hel_core *c)
{
	if (!c)
		return;
	free(c->planes);
	free(c->drafts);
	free(c->canonical);
	free(c);
}

uint64_t hel_core_page_bytes(const hel_core *c, sel_state_mode mode)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < c->n_planes; i++)
		b += hel_plane_unit_bytes(c, &c->planes[i]);
	if (mode != SEL_MODE_ORDINARY)
		for (uint32_t i = 0; i < c->n_drafts; i++)
			b += hel_plane_unit_bytes(c, &c->drafts[i]);
	return b;
}

int hel_core_row_layout(const hel_core *c, sel_state_mode mode, hel_row_layout *o)
{
	if (!hel_core_supports(c, mode))
		return eos_fail(-EINVAL, "core '%s' does not support the %s state mode", c->name,
				sel_state_mode_name(mode));
	memset(o, 0, sizeof *o);
	uint64_t off = 0;
	o->consumed = off;
	off += 8;
	o->hidden = off;
	o->hidden_bytes = (uint64_t)c->hidden * 4;
	off += o->hidden_bytes;
	o->recurrent = off;
	o->recurrent_bytes = c->recurrent_bytes;
	off += o->recurrent_bytes;
	o->partial = off;
	for (uint32_t i = 0; i < c->n_planes; i++)
		o->partial_bytes += hel_plane_unit_bytes(c, &c->planes[i]);
	off += o->partial_bytes;
	o->draft_history = off;
	if (mode != SEL_MODE_ORDINARY)
		o->draft_history_bytes = (uint64_t)c->draft_history * 4;
	off += o->draft_history_bytes;
	o->draft_hidden = off;
	if (mode != SEL_MODE_ORDINARY)
		o->draft_hidden_bytes = (uint64_t)c->hidden * 4;
	off += o->draft_hidden_bytes;
	o->draft_partial = off;
	if (mode != SEL_MODE_ORDINARY)
		for (uint32_t i = 0; i < c->n_drafts; i++)
			o->draft_partial_bytes += hel_plane_unit_bytes(c, &c->drafts[i]);
	off += o->draft_partial_bytes;
	o->bytes = off;
	return 0;
}

/* ---- The built-in core ----------------------------------------------------- */

/* Must stay byte-identical to cores/tiny.core (test_core checks). */
static const char builtin_tiny[] =
	"# tiny.core - the built-in core: flare run's default and the tests'.\n"
	"#\n"
	"# Small enough that a test can run thousands of tokens in milliseconds, yet\n"
	"# with every feature of a real core: several page planes of different sizes,\n"
	"# a recurrent state in the row, and draft planes for speculative modes.\n"
	"# The same text is compiled into Helios (src/helios/core.c).\n"
	"\n"
	"name = tiny\n"
	"page_tokens = 64\n"
	"ranks = 1\n"
	"vocab = 320\n"
	"hidden = 64\n"
	"layers = 2\n"
	"seed = 0x74696e79\n"
	"max_context = 8192\n"
	"state_modes = ordinary copy learned\n"
	"\n"
	"[row]\n"
	"recurrent_bytes = 4KiB\n"
	"recurrent_shard = split\n"
	"draft_history = 64\n"
	"\n"
	"[plane key.0]\n"
	"token_bytes = 64\n"
	"shard = split\n"
	"\n"
	"[plane value.0]\n"
	"token_bytes = 64\n"
	"shard = split\n"
	"\n"
	"[plane selector.0]\n"
	"token_bytes = 8\n"
	"shard = replicated\n"
	"\n"
	"[draft_plane draft.key]\n"
	"token_bytes = 32\n"
	"shard = replicated\n";

const char *hel_core_builtin_text(void) { return builtin_tiny; }

int hel_core_builtin(hel_core **out)
{
	char err[256];
	return hel_core_parse(builtin_tiny, sizeof builtin_tiny - 1, "tiny.core", out, err,
			      sizeof err);
}
