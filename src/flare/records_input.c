/*
 * records_input.c - `flare records ls` and `verify` of the .input files
 * (reusable CPU inputs, design 2.13; docs/record-format.md "Input
 * records") that share a model's record directory with its checkpoints.
 * ls reads each file's header; verify reads it whole and checks every
 * tensor's checksum, the name against the header's kind and key, and the
 * file's length.  gc leaves them to the input module's own bound (the
 * server's disk tier removes what fails and keeps at most 4,096).
 */
#include "flare/records_int.h"

#include "input_record.h"

/* One .input file as the tool sees it. */
struct rinput {
	const struct rother *o;
	uint32_t kind;
	sel_input_key key;
	bool ok;
	sel_input_header h;
	char why[EOS_ERRMSG_MAX];
};

bool rec_is_input_name(const char *name)
{
	uint32_t kind;
	sel_input_key k;
	return sel_input_name_parse(name, &kind, &k) == 0;
}

/* Open name under the directory: a regular file, no link.  Its size in
 * *size, or -1 with x->why. */
static int open_input(struct rns *n, struct rinput *x, uint64_t *size)
{
	int fd = openat(n->lk.fd, x->o->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st)) {
		snprintf(x->why, sizeof x->why, "cannot open: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(x->why, sizeof x->why, "not a regular file");
		close(fd);
		return -1;
	}
	*size = (uint64_t)st.st_size;
	return fd;
}

/* Read len bytes at 0 into a new buffer, or NULL with x->why. */
static uint8_t *read_bytes(int fd, size_t len, struct rinput *x)
{
	uint8_t *b = malloc(len ? len : 1);
	if (!b) {
		snprintf(x->why, sizeof x->why, "out of memory for %zu bytes", len);
		return NULL;
	}
	size_t got = 0;
	while (got < len) {
		ssize_t k = pread(fd, b + got, len - got, (off_t)got);
		if (k <= 0) {
			snprintf(x->why, sizeof x->why, "read: %s",
				 k ? strerror(errno) : "short file");
			free(b);
			return NULL;
		}
		got += (size_t)k;
	}
	return b;
}

/* Judge one file: its header (ls), or all of it (verify). */
static void judge(struct rns *n, struct rinput *x, bool whole)
{
	(void)sel_input_name_parse(x->o->name, &x->kind, &x->key);
	uint64_t size;
	int fd = open_input(n, x, &size);
	if (fd < 0)
		return;
	size_t len = whole ? (size_t)(size < SEL_INPUT_FILE_MAX ? size : SEL_INPUT_FILE_MAX)
			   : (size_t)(size < SEL_INPUT_HEADER_MAX ? size : SEL_INPUT_HEADER_MAX);
	uint8_t *b = read_bytes(fd, len, x);
	close(fd);
	if (!b)
		return;
	n->bytes_read += len;
	if (sel_input_decode(b, len, &x->h)) {
		snprintf(x->why, sizeof x->why, "%s", sel_errmsg());
	} else if (x->h.kind != x->kind || !sel_input_key_eq(&x->h.key, &x->key)) {
		snprintf(x->why, sizeof x->why, "the header names another record (kind %u)",
			 x->h.kind);
	} else if (x->h.file_bytes != size) {
		snprintf(x->why, sizeof x->why, "%" PRIu64 " bytes; the header says %" PRIu64, size,
			 x->h.file_bytes);
	} else if (whole && sel_input_verify(&x->h, b, len)) {
		snprintf(x->why, sizeof x->why, "%s", sel_errmsg());
	} else {
		x->ok = true;
	}
	free(b);
}

static const char *kind_name(uint32_t kind)
{
	return kind == SEL_INPUT_SOURCE ? "source" : "prepared";
}

static json_t *json_input(const struct run *r, const struct rinput *x)
{
	json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:s}", "name", x->o->name, "kind",
			      kind_name(x->kind), "bytes", (json_int_t)x->o->size, "age_s",
			      (json_int_t)(rec_age_of(r->now, x->o->mtime_ns) / NS), "state",
			      x->ok ? "ok" : "invalid");
	if (!x->ok)
		json_object_set_new(j, "reason", json_string(x->why));
	else if (x->kind == SEL_INPUT_SOURCE)
		json_object_set_new(j, "tokens", rec_json_u64(x->h.src.tokens));
	else
		json_object_set_new(j, "tensors", rec_json_u64(x->h.count));
	return j;
}

/* Every .input file of n, judged; calls fn for each. */
static size_t each_input(struct run *r, struct rns *n, bool whole,
			 void (*fn)(struct run *, struct rns *, const struct rinput *, void *),
			 void *ctx)
{
	size_t k = 0;
	for (size_t i = 0; i < n->nother; i++) {
		if (!rec_is_input_name(n->other[i].name))
			continue;
		struct rinput x = {.o = &n->other[i]};
		judge(n, &x, whole);
		fn(r, n, &x, ctx);
		k++;
	}
	return k;
}

static void ls_one(struct run *r, struct rns *n, const struct rinput *x, void *ctx)
{
	json_t *a = ctx;
	char b[32], c[32];
	if (a) {
		json_array_append_new(a, json_input(r, x));
		return;
	}
	(void)n;
	fprintf(r->out, "  input     %s  %-8s %10s %5s  ", x->o->name, kind_name(x->kind),
		rec_fmt_size(x->o->size, b, sizeof b),
		rec_fmt_age(rec_age_of(r->now, x->o->mtime_ns), c, sizeof c));
	if (!x->ok)
		fprintf(r->out, "invalid: %s\n", x->why);
	else if (x->kind == SEL_INPUT_SOURCE)
		fprintf(r->out, "%u x %u, %u tokens\n", x->h.src.width, x->h.src.height,
			x->h.src.tokens);
	else
		fprintf(r->out, "%u tensors\n", x->h.count);
}

void rec_inputs_ls(struct run *r, struct rns *n)
{
	json_t *a = r->o->json ? json_array() : NULL;
	each_input(r, n, false, ls_one, a);
	if (a)
		json_object_set_new(n->j, "inputs", a);
}

struct verify_ctx {
	void (*problem)(struct run *, json_t *, const char *, const char *, const char *);
	json_t *arr;
};

static void verify_one(struct run *r, struct rns *n, const struct rinput *x, void *ctx)
{
	struct verify_ctx *v = ctx;
	(void)n;
	if (!x->ok)
		v->problem(r, v->arr, x->o->name, "input", x->why);
}

size_t rec_inputs_verify(struct run *r, struct rns *n, json_t *arr,
			 void (*problem)(struct run *, json_t *, const char *, const char *,
					 const char *))
{
	struct verify_ctx v = {.problem = problem, .arr = arr};
	return each_input(r, n, true, verify_one, &v);
}
