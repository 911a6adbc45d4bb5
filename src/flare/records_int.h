/*
 * records_int.h - what the files of `flare records` share: the options,
 * one namespace as the tool sees it (its files, its layout, its lock), a
 * run's output, and the helpers the parts use.  Private to records.c (the
 * command line, ls, verify, stat, the namespaces under DIR), records_ns.c
 * (one namespace: lock, list, judge), records_input.c (.input files) and
 * records_gc.c (gc).
 */
#ifndef FLARE_RECORDS_INT_H
#define FLARE_RECORDS_INT_H

#include "flare/records.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eos.h"
#include "flare/settings.h"
#include "expiry.h"
#include "index.h"
#include "record.h"
#include "recovery.h"

#define NS 1000000000ull
#define TOP_CHAINS 10

/* ---- Arguments -------------------------------------------------------------- */

enum rcmd {
	R_LS,
	R_VERIFY,
	R_STAT,
	R_GC
};

struct ropts {
	enum rcmd cmd;
	const char *dir;
	bool json, dry_run;
	bool age, limit;     /* given (--max-age off counts as not given) */
	uint64_t max_age_ns; /* when age */
	uint64_t limit_bytes;
	char age_text[64], limit_text[64];
};

#define R_HELP 1


struct rfile {
	char name[SEL_RECORD_NAME_MAX];
	sel_key key;              /* from the name */
	enum sel_check_kind kind; /* sel_record_check_file's verdict */
	char *why;                /* its message; NULL when OK */
	bool decoded;
	sel_record_header h;
	uint64_t size, mtime_ns;
	bool has_row;
	int fate;       /* 0, or the enum sel_scan_why the startup scan would remove it for */
	int64_t parent; /* linked parent among the valid files, -1 */
	uint32_t children;
	uint32_t depth; /* 1 + the depth of its linked parent; 0 when not valid */
};

struct rother {
	char *name;
	uint64_t size, mtime_ns;
};

struct rns {
	char path[PATH_MAX];
	char name[SEL_RECORD_DIRNAME_MAX];
	struct eos_dirlock lk; /* lk.fd: the directory, locked unless unlocked */
	bool unlocked;         /* a server holds the lock: read without it */
	char *busy;            /* the lock's message then */
	char *error;           /* why the namespace could not be worked on */
	bool have_ns;          /* ns describes it (from the header of ref) */
	sel_record_ns ns;
	char ref[SEL_RECORD_NAME_MAX];
	size_t layout_votes; /* headers that carry ns's layout ... */
	size_t layout_files; /* ... of those that name this directory */
	char *undecided;     /* why no layout could be decided, or NULL */
	struct rfile *f;     /* record-named entries, by name */
	size_t nf;
	struct rother *tmp, *other; /* temporaries; names that are not ours */
	size_t ntmp, nother;        /* (a '.tmp-*' directory is among the other) */
	uint64_t bytes_read;
	json_t *j; /* the namespace's JSON object */
};

struct run {
	const struct ropts *o;
	FILE *out, *err;
	uint64_t now;
	int status;
	uint64_t problems; /* verify */
	json_t *root, *jns;
};

/* records.c: formatting, a namespace's JSON. */
const char *rec_fmt_size(uint64_t b, char *buf, size_t len);
const char *rec_fmt_age(uint64_t ns, char *buf, size_t len);
json_t *rec_json_key(const sel_key *k);
json_t *rec_json_ns(const struct rns *n);

/* records_ns.c: a namespace's failure, listing, layout, loading (lock or
 * open, list, judge, link: 0, or -1 with the namespace failed), a file by
 * name, and freeing what it holds. */
void rec_ns_fail(struct run *r, struct rns *n, const char *msg);
int rec_ns_list(struct rns *n);
void rec_ns_reference(struct rns *n);
int rec_ns_load(struct run *r, struct rns *n, bool payload, bool reader);
struct rfile *rec_find_file(struct rns *n, const char *name);
void rec_ns_free(struct rns *n);

/* Copy src into dst[cap], cut to fit (names here are bounded already). */
static inline void rec_copy_str(char *dst, size_t cap, const char *src)
{
	size_t n = strnlen(src, cap - 1);
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* The header decoded and holds: the file is OK, or only a page record's
 * or the row's checksum fails. */
static inline bool rec_header_valid(const struct rfile *f)
{
	return f->decoded &&
	       (f->kind == SEL_CHECK_OK || f->kind == SEL_CHECK_PAGE || f->kind == SEL_CHECK_ROW);
}

static inline json_t *rec_json_u64(uint64_t v) { return json_integer((json_int_t)v); }
static inline uint64_t rec_age_of(uint64_t now, uint64_t mtime)
{
	return now > mtime ? now - mtime : 0;
}

/* records_input.c: the .input files among a namespace's other names
 * (design 2.13): whether a name is one, ls (a line each, or "inputs" in
 * the JSON), verify (each bad one through problem(r, arr, file, kind,
 * reason); returns the files checked). */
bool rec_is_input_name(const char *name);
void rec_inputs_ls(struct run *r, struct rns *n);
size_t rec_inputs_verify(struct run *r, struct rns *n, json_t *arr,
			 void (*problem)(struct run *, json_t *, const char *, const char *,
					 const char *));

/* records_gc.c: `flare records gc` on one namespace. */
void rec_cmd_gc(struct run *r, struct rns *n);

#endif
