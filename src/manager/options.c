/*
 * options.c - `flare pool` flags and its config file (docs/pool.md
 * "Running the manager").
 *
 * DESIGN
 * One table names every option once: its flag, its [pool] key and its
 * type.  Flags win over the file, the file over the defaults.  The file is
 * the same TOML subset `flare run --config` reads (docs/configuration.md):
 * one [pool] section of `key = value` lines with "basic" or 'literal'
 * strings, decimal integers and booleans, and # comments; anything else is
 * an error naming the file, the line and the key.  Sizes and durations take
 * the units of eos_parse_size / eos_parse_duration as strings, or a bare
 * integer of bytes or seconds.
 *
 * INVARIANTS
 *   1. mgr_config_parse is pure (no I/O) and never reads past text + len.
 *   2. Every error message names the flag or the FILE:LINE: key.
 */
#include "manager/manager.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define S_MS 1000u
#define MS_NS 1000000ull

enum otype {
	T_PATH,
	T_NAME,
	T_SIZE,
	T_AGE,
	T_MS,
	T_U32,
	T_U64,
	T_PORT,
	T_GROUP,
	T_HOST
};

struct opt {
	const char *flag, *key;
	enum otype t;
	size_t off;
	uint64_t min, max;
	const char *help;
};

#define F(field) offsetof(struct mgr_options, field)
static const struct opt opts[] = {
	{"--socket", "socket", T_PATH, F(socket), 0, 0,
	 "PATH  the Unix socket instances connect to (required)"},
	{"--memory", "memory", T_SIZE, F(memory), 0, 0,
	 "SIZE  arena bytes, shared by every scope (required)"},
	{"--name", "name", T_NAME, F(name), 0, 0,
	 "NAME  pool name: salts scopes and instance ids (default 'default')"},
	{"--max-age", "max_age", T_AGE, F(max_age_ns), 0, 0,
	 "D|off  drop records unused (no put or restore) this long (default off)"},
	{"--config", NULL, T_PATH, F(config), 0, 0,
	 "FILE  read a [pool] section of these keys first"},
	{"--metrics-port", "metrics_port", T_PORT, F(metrics_port), 0, 65535,
	 "N  serve GET /metrics on this TCP port (0: any free one)"},
	{"--metrics-host", "metrics_host", T_HOST, F(metrics_host), 0, 0,
	 "ADDR  address of the metrics port (default 127.0.0.1)"},
	{"--group", "group", T_GROUP, F(gid), 0, 0,
	 "G  also accept clients of this group (name or gid); socket 0660"},
	{"--arena", "arena", T_PATH, F(arena), 0, 0,
	 "PATH  keep the arena in this file (e.g. under /dev/shm) so it survives a restart"},
	{"--max-clients", "max_clients", T_U32, F(max_clients), 1, 65536,
	 "N  connections at once (default 256)"},
	{"--max-scopes", "max_scopes", T_U32, F(max_scopes), 1, 65536,
	 "N  distinct record layouts at once (default 64)"},
	{"--client-queue", "client_queue", T_SIZE, F(client_queue), 4096, 1ull << 32,
	 "SIZE  output a client may leave unread before it is closed (default 4MiB)"},
	{"--max-holdings", "max_holdings", T_U32, F(max_holdings), 0, UINT32_MAX,
	 "N  announced holdings per client (default 65536)"},
	{"--max-holdings-total", "max_holdings_total", T_U64, F(max_holdings_total), 0, UINT64_MAX,
	 "N  announced holdings in all (default 1048576)"},
	{"--max-claims", "max_claims", T_U32, F(max_claims), 1, 65536,
	 "N  open claims per client (default 16)"},
	{"--max-puts", "max_puts", T_U32, F(max_puts), 1, 65536,
	 "N  open puts per client (default 16)"},
	{"--max-exports", "max_exports", T_U32, F(max_exports), 1, 65536,
	 "N  exports one client serves at once (default 8)"},
	{"--window-limit", "window_limit", T_SIZE, F(window_limit), 4096, 1ull << 31,
	 "SIZE  bytes per window beyond one slot (default 4MiB)"},
	{"--window-credits", "window_credits", T_U32, F(window_credits), 1, 65536,
	 "N  windows in flight per lease on data channels (default 16)"},
	{"--setup-limit", "setup_limit", T_MS, F(setup_limit_ms), 1, UINT32_MAX,
	 "D  clamp on a restore's setup time (default 30s)"},
	{"--progress-timeout", "progress_timeout", T_MS, F(progress_ms), 1, UINT32_MAX,
	 "D  fail a lease without progress this long (default 3s)"},
	{"--hello-timeout", "hello_timeout", T_MS, F(hello_ms), 1, UINT32_MAX,
	 "D  a connection's time to send its hello (default 10s)"},
	{"--recovery-timeout", "recovery_timeout", T_MS, F(recovery_ms), 0, UINT32_MAX,
	 "D  after a restart on a kept arena, wait this long for old clients (default 30s)"},
	{"--quarantine-timeout", "quarantine_timeout", T_MS, F(quarantine_ms), 0, UINT32_MAX,
	 "D  hold a vanished client's windows this long when its pid is unknown (default 60s)"},
};
#undef F
#define NOPTS (sizeof opts / sizeof opts[0])

void mgr_options_help(FILE *f)
{
	fprintf(f, "usage: flare pool --socket PATH --memory SIZE [flags]\n\n"
		   "The pool manager: instances on this host share one prefix cache through it\n"
		   "(docs/pool.md).\n\n");
	for (size_t i = 0; i < NOPTS; i++) {
		const char *sp = strchr(opts[i].help, ' ');
		char col[64];
		snprintf(col, sizeof col, "%s %.*s", opts[i].flag,
			 sp ? (int)(sp - opts[i].help) : 0, opts[i].help);
		fprintf(f, "  %-30s %s\n", col, sp ? sp + 2 : "");
	}
	fprintf(f, "  %-30s %s\n", "--help", "this text");
}

static void defaults(struct mgr_options *o)
{
	memset(o, 0, sizeof *o);
	snprintf(o->name, sizeof o->name, "default");
	o->metrics_port = -1;
	snprintf(o->metrics_host, sizeof o->metrics_host, "127.0.0.1");
	o->max_clients = 256;
	o->max_scopes = 64;
	o->client_queue = 4u << 20;
	o->max_holdings = 65536;
	o->max_holdings_total = 1u << 20;
	o->max_claims = 16;
	o->max_puts = 16;
	o->max_exports = 8;
	o->window_limit = 4u << 20;
	o->window_credits = 16;
	o->setup_limit_ms = SEL_POOL_SETUP_LIMIT_MS;
	o->progress_ms = SEL_POOL_PROGRESS_MS;
	o->hello_ms = 10 * S_MS;
	o->recovery_ms = 30 * S_MS;
	o->quarantine_ms = 60 * S_MS;
	o->tick_ms = 100;
}

static bool name_ok(const char *s)
{
	size_t n = strlen(s);
	if (!n || n > SEL_POOL_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

/* Set one option from text ("1GiB", "30s", "off", "12", a path).
 * integer: the value was a TOML integer (bytes or seconds). */
static int set_opt(struct mgr_options *o, const struct opt *p, const char *text, char *why,
		   size_t wl)
{
	char *base = (char *)o + p->off;
	uint64_t v = 0, ns = 0;
	bool off = false;
	char *end;
	switch (p->t) {
	case T_PATH:
	case T_HOST: {
		size_t cap = p->t == T_HOST ? sizeof o->metrics_host
			     : p->off == offsetof(struct mgr_options, socket) ? sizeof o->socket
									      : sizeof o->config;
		if (!*text || strlen(text) >= cap) {
			snprintf(why, wl, "'%s' is empty or longer than %zu bytes", text, cap - 1);
			return -EINVAL;
		}
		snprintf(base, cap, "%s", text);
		return 0;
	}
	case T_NAME:
		if (!name_ok(text)) {
			snprintf(why, wl, "'%s' is not a pool name (1 to %u of A-Z a-z 0-9 . _ -)",
				 text, SEL_POOL_NAME_MAX);
			return -EINVAL;
		}
		snprintf(o->name, sizeof o->name, "%s", text);
		return 0;
	case T_SIZE:
		if (eos_parse_size(text, &v)) {
			snprintf(why, wl, "%s", eos_errmsg());
			return -EINVAL;
		}
		break;
	case T_AGE:
		if (eos_parse_duration(text, &ns, &off)) {
			snprintf(why, wl, "%s", eos_errmsg());
			return -EINVAL;
		}
		if (!off && !ns) {
			snprintf(why, wl, "'%s': a max age must be positive, or off", text);
			return -EINVAL;
		}
		o->max_age_ns = off ? 0 : ns;
		return 0;
	case T_MS:
		if (eos_parse_duration(text, &ns, NULL)) {
			snprintf(why, wl, "%s", eos_errmsg());
			return -EINVAL;
		}
		v = ns / MS_NS;
		break;
	case T_U32:
	case T_U64:
	case T_PORT:
		errno = 0;
		v = strtoull(text, &end, 10);
		if (!*text || *end || errno || *text == '-' || *text == '+') {
			snprintf(why, wl, "'%s' is not a whole number", text);
			return -EINVAL;
		}
		break;
	case T_GROUP: {
		errno = 0;
		unsigned long g = strtoul(text, &end, 10);
		if (*text && !*end && !errno && *text != '-' && g < UINT32_MAX) {
			o->gid = (gid_t)g;
		} else {
			struct group gr, *res = NULL;
			char buf[4096];
			if (getgrnam_r(text, &gr, buf, sizeof buf, &res) || !res) {
				snprintf(why, wl, "'%s' is no group name or gid", text);
				return -EINVAL;
			}
			o->gid = gr.gr_gid;
		}
		o->group_set = true;
		return 0;
	}
	}
	uint64_t max = p->max ? p->max : UINT64_MAX;
	if (v < p->min || v > max) {
		snprintf(why, wl, "%s is out of range (%" PRIu64 " to %" PRIu64 ")", text, p->min,
			 max);
		return -EINVAL;
	}
	if (p->t == T_SIZE && p->off == offsetof(struct mgr_options, memory)) {
		o->memory = v;
	} else if (p->t == T_SIZE && p->off == offsetof(struct mgr_options, client_queue)) {
		o->client_queue = v;
	} else if (p->t == T_PORT) {
		o->metrics_port = (int)v;
	} else if (p->t == T_U64) {
		memcpy(base, &v, sizeof v);
	} else {
		uint32_t x = (uint32_t)(v > UINT32_MAX ? UINT32_MAX : v);
		memcpy(base, &x, sizeof x);
	}
	return 0;
}

/* ---- the config file ------------------------------------------------------------------ */

static int cerr(char *err, size_t errlen, const char *file, unsigned line, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static int cerr(char *err, size_t errlen, const char *file, unsigned line, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	snprintf(err, errlen, "%s:%u: %s", file, line, msg);
	return -EINVAL;
}

static bool is_bare(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '-';
}

/* Where the parse is. */
struct mparse {
	const char *file;
	unsigned line;
	char *err;
	size_t errlen;
	bool in_pool, seen_pool;
	uint64_t seen; /* options set, by index */
};

/* cerr returns -EINVAL; said here too for the analyzer, which does not
 * follow variadic calls. */
#define MERR(m, ...) ((void)cerr((m)->err, (m)->errlen, (m)->file, (m)->line, __VA_ARGS__), -EINVAL)

static const char *skip_blank(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t'))
		p++;
	return p;
}

/* "[pool]", the one section. */
static int m_section(struct mparse *m, const char *p, const char *e)
{
	const char *q = p + 1;
	while (q < e && *q == ' ')
		q++;
	const char *n0 = q;
	while (q < e && is_bare(*q))
		q++;
	size_t nlen = (size_t)(q - n0);
	while (q < e && *q == ' ')
		q++;
	if (q >= e || *q != ']')
		return MERR(m, "not a section header ([pool])");
	q = skip_blank(q + 1, e);
	if (q < e && *q != '#')
		return MERR(m, "text after the section header");
	if (nlen != 4 || memcmp(n0, "pool", 4))
		return MERR(m, "unknown section [%.*s] (known: [pool])",
			    (int)(nlen < 40 ? nlen : 40), n0);
	if (m->seen_pool)
		return MERR(m, "section [pool] appears twice");
	m->seen_pool = m->in_pool = true;
	return 0;
}

/* The key of a "key = value" line: its option and name; *pp moves past
 * the '='. */
static int m_key(struct mparse *m, const char **pp, const char *e, const struct opt **op,
		 char key[64])
{
	const char *p = *pp, *k0 = p;
	while (p < e && is_bare(*p))
		p++;
	size_t klen = (size_t)(p - k0);
	if (!klen)
		return MERR(m, "not a 'key = value' line");
	snprintf(key, 64, "%.*s", (int)(klen < 63 ? klen : 63), k0);
	p = skip_blank(p, e);
	if (p >= e || *p != '=')
		return MERR(m, "%s: expected '=' after the key", key);
	if (!m->in_pool)
		return MERR(m, "key '%s' outside [pool]", key);
	*op = NULL;
	for (size_t i = 0; i < NOPTS; i++)
		if (opts[i].key && strlen(opts[i].key) == klen && !memcmp(opts[i].key, k0, klen))
			*op = &opts[i];
	if (!*op)
		return MERR(m, "unknown key '%s' in [pool]", key);
	size_t idx = (size_t)(*op - opts);
	if (m->seen & (1ull << idx))
		return MERR(m, "pool.%s: set twice", key);
	m->seen |= 1ull << idx;
	*pp = skip_blank(p + 1, e);
	return 0;
}

/* A quoted string (basic with \" \\ \n \t, or literal) into val[cap]. */
static int m_string(struct mparse *m, const char *key, const char **pp, const char *e, char *val,
		    size_t cap, size_t *vn)
{
	const char *p = *pp;
	char qc = *p++;
	while (p < e) {
		char c = *p++;
		if (c == qc) {
			*pp = p;
			return 0;
		}
		if (qc == '"' && c == '\\') {
			if (p >= e)
				break;
			char x = *p++;
			c = x == 'n'    ? '\n'
			    : x == 't'  ? '\t'
			    : x == '"'  ? '"'
			    : x == '\\' ? '\\'
					: 0;
			if (!c)
				return MERR(
					m,
					"pool.%s: escape \\%c is not supported (use \\\" \\\\ \\n \\t)",
					key, x);
		}
		if ((unsigned char)c < 0x20 && c != '\t')
			return MERR(m, "pool.%s: a control byte in the string", key);
		if (*vn + 1 >= cap)
			return MERR(m, "pool.%s: the value is too long", key);
		val[(*vn)++] = c;
	}
	return MERR(m, "pool.%s: unterminated string", key);
}

/* A decimal integer with '_' between digits into val. */
static int m_integer(struct mparse *m, const char *key, const char **pp, const char *e, char *val,
		     size_t *vn)
{
	const char *p = *pp;
	while (p < e && ((*p >= '0' && *p <= '9') || *p == '_')) {
		if (*p == '_' && (p[-1] == '_' || p + 1 >= e || p[1] < '0' || p[1] > '9'))
			return MERR(m, "pool.%s: misplaced '_'", key);
		if (*p != '_') {
			if (*vn + 1 >= 32)
				return MERR(m, "pool.%s: the number is too long", key);
			val[(*vn)++] = *p;
		}
		p++;
	}
	*pp = p;
	return 0;
}

/* The value at p: a string or an integer into val[4096], *integer saying
 * which; nothing but a comment after it. */
static int m_value(struct mparse *m, const char *key, const char *p, const char *e, char *val,
		   bool *integer)
{
	size_t vn = 0;
	int rc;
	*integer = false;
	if (p < e && (*p == '"' || *p == '\'')) {
		rc = m_string(m, key, &p, e, val, 4096, &vn);
	} else if (p < e && *p >= '0' && *p <= '9') {
		*integer = true;
		rc = m_integer(m, key, &p, e, val, &vn);
	} else if ((e - p >= 4 && !memcmp(p, "true", 4)) ||
		   (e - p >= 5 && !memcmp(p, "false", 5))) {
		return MERR(m, "pool.%s: takes no boolean", key);
	} else {
		return MERR(m, "pool.%s: expected a \"string\" or a number", key);
	}
	if (rc)
		return rc;
	val[vn] = '\0';
	p = skip_blank(p, e);
	if (p < e && *p != '#')
		return MERR(m, "pool.%s: text after the value", key);
	return 0;
}

/* A "key = value" line: the option set unless a flag set it (flags win). */
static int m_setting(struct mparse *m, const char *p, const char *e, struct mgr_options *o,
		     uint64_t flag_mask)
{
	const struct opt *op = NULL;
	char key[64], val[4096];
	bool integer;
	int rc;
	if ((rc = m_key(m, &p, e, &op, key)) || (rc = m_value(m, key, p, e, val, &integer)))
		return rc;
	/* A bare number means bytes (sizes) or seconds (durations). */
	char tmp[4200];
	const char *v = val;
	if (integer && (op->t == T_AGE || op->t == T_MS)) {
		snprintf(tmp, sizeof tmp, "%ss", val);
		v = tmp;
	}
	if (!integer && (op->t == T_U32 || op->t == T_U64 || op->t == T_PORT))
		return MERR(m, "pool.%s: expected a number, not a string", key);
	if (flag_mask & (1ull << (size_t)(op - opts)))
		return 0; /* the flag wins */
	char why[1024];
	if (set_opt(o, op, v, why, sizeof why))
		return MERR(m, "pool.%s: %s", key, why);
	return 0;
}

int mgr_config_parse(const char *text, size_t len, const char *file, struct mgr_options *o,
		     uint64_t flag_mask, char *err, size_t errlen)
{
	struct mparse m = {.file = file, .err = err, .errlen = errlen};
	const char *p = text, *end_all = text + len;
	int rc = 0;
	if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
		p += 3;
	while (p < end_all && !rc) {
		const char *nl = memchr(p, '\n', (size_t)(end_all - p));
		const char *e = nl ? nl : end_all, *next = nl ? nl + 1 : end_all;
		m.line++;
		if (e > p && e[-1] == '\r')
			e--;
		if (e > p && memchr(p, 0, (size_t)(e - p)))
			return MERR(&m, "NUL byte in the file");
		p = skip_blank(p, e);
		if (p < e && *p == '[')
			rc = m_section(&m, p, e);
		else if (p < e && *p != '#')
			rc = m_setting(&m, p, e, o, flag_mask);
		p = next;
	}
	return rc;
}

static int load_config(struct mgr_options *o, uint64_t mask, char *err, size_t errlen)
{
	FILE *f = fopen(o->config, "rb");
	if (!f) {
		snprintf(err, errlen, "--config: cannot open '%s': %s", o->config, strerror(errno));
		return -EINVAL;
	}
	size_t cap = 1u << 20;
	char *buf = malloc(cap + 1);
	size_t n = buf ? fread(buf, 1, cap + 1, f) : 0;
	bool bad = !buf || ferror(f);
	fclose(f);
	if (bad || n > cap) {
		free(buf);
		snprintf(err, errlen, "--config '%s': %s", o->config,
			 n > cap ? "larger than 1 MiB" : "cannot read it");
		return -EINVAL;
	}
	int rc = mgr_config_parse(buf, n, o->config, o, mask, err, errlen);
	free(buf);
	return rc;
}

int mgr_options_parse(int argc, char **argv, struct mgr_options *o, char *err, size_t errlen)
{
	defaults(o);
	uint64_t mask = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			mgr_options_help(stdout);
			return MGR_OPTS_HELP;
		}
		const char *val = NULL;
		size_t alen = strlen(a);
		const char *eq = strchr(a, '=');
		if (eq)
			alen = (size_t)(eq - a);
		const struct opt *p = NULL;
		for (size_t k = 0; k < NOPTS; k++)
			if (strlen(opts[k].flag) == alen && !strncmp(opts[k].flag, a, alen))
				p = &opts[k];
		if (!p) {
			snprintf(err, errlen, "unknown flag '%s' (flare pool --help)", a);
			return -EINVAL;
		}
		if (eq)
			val = eq + 1;
		else if (i + 1 < argc)
			val = argv[++i];
		else {
			snprintf(err, errlen, "%s needs a value", p->flag);
			return -EINVAL;
		}
		size_t idx = (size_t)(p - opts);
		if (mask & (1ull << idx)) {
			snprintf(err, errlen, "%s given twice", p->flag);
			return -EINVAL;
		}
		mask |= 1ull << idx;
		char why[1024];
		if (set_opt(o, p, val, why, sizeof why)) {
			snprintf(err, errlen, "%s: %s", p->flag, why);
			return -EINVAL;
		}
	}
	if (o->config[0]) {
		int rc = load_config(o, mask, err, errlen);
		if (rc)
			return rc;
	}
	if (!o->socket[0]) {
		snprintf(err, errlen, "--socket PATH is required (flare pool --help)");
		return -EINVAL;
	}
	if (!o->memory) {
		snprintf(err, errlen, "--memory SIZE is required (flare pool --help)");
		return -EINVAL;
	}
	return 0;
}
