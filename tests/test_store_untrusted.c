/*
 * test_store_untrusted.c - a record directory anyone may have written
 * (issue 12's acceptance; design 2.3, 2.5, 2.12): every restore is
 * byte-exact for the request's own prefix or a counted miss, `flare records
 * verify` names each lying file, and nothing outside the directory changes.
 *
 * A real disk store writes thousands of records: conversations of three
 * chained checkpoints at the same consumed counts (130, 200, 330 tokens:
 * tails of 2, 1 and 2 pages), so every record has others of its length to be
 * re-parented to.  Then each record gets one of:
 *   - re-parent, forged: its parent key rewritten to another conversation's
 *     record of the same consumed count, with the parent check that
 *     record's bucket gives, header resealed (only the lookup's comparison
 *     with the history can catch it);
 *   - re-parent, naive: the parent key only, resealed;
 *   - swap names with another record;
 *   - a symbolic link to a valid copy of it in a decoy tree outside;
 *   - a FIFO;
 *   - sparse-extend: a hole past its end;
 *   - sparse, huge: a root resealed to claim 2^26 pages, the file that long
 *     as a hole;
 *   - one header bit flipped, resealed;
 *   - nothing (one in eight).
 * A quarter of the conversations are left alone as controls, so restores
 * that must succeed are checked to succeed, byte-exact, among the lies.
 * Half the conversations are mutated while the store is down (the startup
 * scan meets them), half while a store has them indexed (its reads meet
 * them).  Then every conversation is restored through the store, and again
 * after a restart: a hit must carry exactly the conversation's bytes for its
 * endpoint (pages and row against the oracle), else it must be a miss the
 * store counts (lookups without a hit, fetch failures); a conversation none
 * of whose records was touched must restore whole.  verify, run on the
 * directory the scan is about to meet, must exit 1 and name every mutated
 * file -- except a flip in the bucket digest or the creation time of a
 * record, which no offline check can judge (the bucket is a hash of tokens
 * the directory does not hold; a wrong one only hides the record from
 * lookups: a miss), and a re-parent forged together with its parent check
 * (whether one prefix extends another cannot be known without their tokens;
 * the lookup, which has the request's history, refuses the chain); those
 * are counted and printed, and the restores prove them harmless.  A decoy tree next to the
 * namespace (the links' targets among it) hashes the same before and after.
 *
 * 720 conversations (2,160 records) in make check, 4,000 with SELENE_SOAK=1.
 */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flare/records.h"
#include "internal.h"
#include "recutil.h"
#include "store_disk.h"
#include "storefx.h"

#define PT SFX_PT
#define BATCH 16
static const uint64_t ends[3] = {130, 200, 330};
static test_rng rng;

enum mut {
	M_NONE = 0,
	M_REPARENT,
	M_REPARENT_NAIVE,
	M_SWAP,
	M_LINK,
	M_FIFO,
	M_EXTEND,
	M_HUGE,
	M_FLIP,
	M_KINDS
};
static const char *const mut_name[M_KINDS] = {
	"none", "re-parent",     "re-parent (key only)", "swap names", "symbolic link",
	"FIFO", "sparse-extend", "sparse, huge",         "header bit"};

struct conv {
	struct sfx_conv cv;
	sel_published cp[3];
	uint8_t mut[3];
	bool runtime; /* mutated while a store has it indexed */
	bool control; /* never mutated: must restore whole, every time */
	bool touched; /* a record of it was mutated */
};

struct run {
	struct sfx fx;
	sel_record_ns ns;
	char base[4096], dir[4300], decoy[4300];
	int dfd;
	struct conv *c;
	size_t n;
	char **lies;       /* names verify must report */
	uint8_t *lie_kind; /* and the mutation that made each lie */
	uint32_t *lie_at;  /* the flipped byte, for a header flip */
	uint8_t last_kind;
	uint32_t last_at;
	size_t n_lies, cap_lies;
	uint64_t unjudgeable;          /* header flips no offline check can judge */
	uint64_t consistent_forgeries; /* parent key and check both forged */
	uint64_t count[M_KINDS];
};

static void lie(struct run *r, const char *name)
{
	if (r->n_lies == r->cap_lies) {
		r->cap_lies = r->cap_lies ? 2 * r->cap_lies : 64;
		CHECK((r->lies = realloc(r->lies, r->cap_lies * sizeof *r->lies)));
		CHECK((r->lie_kind = realloc(r->lie_kind, r->cap_lies)));
		CHECK((r->lie_at = realloc(r->lie_at, r->cap_lies * sizeof *r->lie_at)));
	}
	r->lie_kind[r->n_lies] = r->last_kind;
	r->lie_at[r->n_lies] = r->last_at;
	CHECK((r->lies[r->n_lies++] = strdup(name)));
}

static void rec_name(const struct conv *c, int i, char out[SEL_RECORD_NAME_MAX])
{
	sel_record_name(&c->cp[i].key, out);
}

/* ---- writing ------------------------------------------------------------------------------- */

static void write_all(struct run *r)
{
	sel_store_config cfg = sfx_config(&r->fx, false);
	cfg.disk_dir = r->base;
	cfg.disk_limit = 1ull << 30;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	snprintf(r->dir, sizeof r->dir, "%s", test_store_dir(s));
	for (size_t b0 = 0; b0 < r->n; b0 += BATCH) {
		size_t nb = r->n - b0 < BATCH ? r->n - b0 : BATCH;
		sel_published todo[3 * BATCH];
		size_t nt = 0, done = 0;
		for (size_t k = 0; k < nb; k++) {
			struct conv *c = &r->c[b0 + k];
			sfx_conv_init(&r->fx, &c->cv, 7000 + b0 + k, 400, (uint32_t)k * 8);
			for (int i = 0; i < 3; i++) {
				c->cp[i] = sfx_ckpt(&r->fx, &c->cv, ends[i], i ? ends[i - 1] : 0,
						    (uint32_t)(3 * k + (size_t)i),
						    1 + 3 * (b0 + k) + (size_t)i);
				todo[nt++] = c->cp[i];
			}
		}
		/* Parents first; a refused put waits for the next event. */
		size_t next = 0;
		while (done < nt) {
			while (next < nt) {
				sel_retry_reason why;
				sel_outcome o = sel_store_put(s, &todo[next], &why);
				if (o == SEL_RETRY)
					break;
				CHECKF(o == SEL_QUEUED, "put: %s: %s", sel_outcome_name(o),
				       sel_errmsg());
				next++;
			}
			sel_event ev[8];
			int k = sel_store_poll(s, ev, 8);
			CHECK_OK(k);
			for (int i = 0; i < k; i++) {
				if (ev[i].type == SEL_EV_PROGRESS)
					continue;
				CHECKF(ev[i].type == SEL_EV_STORED, "event %d: %s", ev[i].type,
				       sel_strerror(ev[i].error));
				done++;
			}
			if (!k) {
				struct pollfd pf = {.fd = sel_store_wait_fd(s), .events = POLLIN};
				(void)poll(&pf, 1, 10);
			}
		}
	}
	CHECK_OK(sel_disk_store_check(s));
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
}

/* ---- mutations ------------------------------------------------------------------------------ */

struct flip {
	uint32_t at;
	uint8_t bit;
};

static void flip_bit(uint8_t *h, void *ctx)
{
	const struct flip *f = ctx;
	h[f->at] ^= f->bit;
}

/* Whether a header flip left a record that claims nothing else than before
 * about what a read uses: the same key, tail, offsets, flags and row
 * checksum, and the same parent if it links -- only the bucket digest, the
 * creation time, the version (2 and 3 read alike when there is no parent
 * check), or the parent key of a record that does not link under it
 * changed.  Those no offline check can judge (a wrong bucket only hides the
 * record from lookups: a miss). */
static bool flip_harmless(struct run *r, const char *name, const sel_record_header *old)
{
	int fd = openat(r->dfd, name, O_RDONLY | O_CLOEXEC);
	CHECK(fd >= 0);
	uint8_t *b = malloc(SEL_RECORD_HEADER_MAX);
	CHECK(b);
	ssize_t n = pread(fd, b, SEL_RECORD_HEADER_MAX, 0);
	struct stat st;
	CHECK(fstat(fd, &st) == 0);
	close(fd);
	sel_record_header h;
	bool ok = n >= 4096 && sel_record_decode(b, (size_t)n, &r->ns, &h) == 0;
	free(b);
	if (!ok)
		return false;
	uint32_t pt = r->ns.layout.sz.page_tokens;
	bool links = sel_record_links_parent(&h.d, pt), was = sel_record_links_parent(&old->d, pt);
	bool row = (uint64_t)st.st_size == h.span.row_end; /* a compacted file has none */
	return sel_key_eq(&h.d.key, &old->d.key) && h.d.tail == old->d.tail &&
	       h.d.flags == old->d.flags && (!row || h.row_checksum == old->row_checksum) &&
	       !memcmp(&h.span, &old->span, sizeof h.span) && links == was &&
	       (!links || (sel_key_eq(&h.d.parent, &old->d.parent) &&
			   h.d.parent_check == old->d.parent_check));
}

/* A record of another conversation, not mutated yet, for a swap. */
static struct conv *partner(struct run *r, struct conv *self, int *which)
{
	for (int tries = 0; tries < 64; tries++) {
		struct conv *o = &r->c[test_rng_below(&rng, r->n)];
		int i = (int)test_rng_below(&rng, 3);
		if (o != self && o->runtime == self->runtime && o->mut[i] == M_NONE &&
		    !o->touched && !o->control) {
			*which = i;
			return o;
		}
	}
	return NULL;
}

static void mutate(struct run *r, struct conv *c, int i)
{
	char name[SEL_RECORD_NAME_MAX], path[4400];
	rec_name(c, i, name);
	snprintf(path, sizeof path, "%s/%s", r->dir, name);
	if (c->mut[i] != M_NONE || !test_has_file(r->dir, name))
		return; /* a swap partner already, or removed by the store */
	enum mut m = (enum mut)test_rng_below(&rng, 8) == 0
			     ? M_NONE
			     : (enum mut)(1 + test_rng_below(&rng, M_KINDS - 1));
	if ((m == M_REPARENT || m == M_REPARENT_NAIVE) && i == 0)
		m = M_FLIP; /* a root has no parent to forge */
	if (m == M_HUGE && i != 0)
		m = M_EXTEND; /* the claim needs a root's tail rule */
	int pi = 0;
	struct conv *o = NULL;
	if (m == M_SWAP && !(o = partner(r, c, &pi)))
		m = M_FLIP;
	c->mut[i] = (uint8_t)m;
	r->count[m]++;
	r->last_kind = (uint8_t)m;
	r->last_at = 0;
	if (m == M_NONE)
		return;
	c->touched = true;
	switch (m) {
	case M_REPARENT:
	case M_REPARENT_NAIVE: {
		struct conv *t;
		do
			t = &r->c[test_rng_below(&rng, r->n)];
		while (t == c);
		test_forge_parent(r->dfd, name, &t->cp[i - 1].key,
				  m == M_REPARENT ? sel_record_parent_check(&t->cp[i - 1].bucket)
						  : 0);
		/* The key only: the parent check (the old parent's bucket) no
		 * longer matches, and verify says so.  Both: no offline check can
		 * know one prefix does not extend another without their tokens;
		 * only the lookup, which has the request's history, refuses it. */
		if (m == M_REPARENT)
			r->consistent_forgeries++;
		else
			lie(r, name);
		break;
	}
	case M_SWAP: {
		char on[SEL_RECORD_NAME_MAX], tmp[SEL_RECORD_NAME_MAX + 8];
		rec_name(o, pi, on);
		snprintf(tmp, sizeof tmp, "x%s", name);
		CHECK(renameat(r->dfd, name, r->dfd, tmp) == 0);
		CHECK(renameat(r->dfd, on, r->dfd, name) == 0);
		CHECK(renameat(r->dfd, tmp, r->dfd, on) == 0);
		o->touched = true;
		o->mut[pi] = M_SWAP;
		lie(r, name);
		lie(r, on);
		break;
	}
	case M_LINK: {
		char target[4400];
		snprintf(target, sizeof target, "%s/%s", r->decoy, name);
		test_copy_file(path, target); /* following the link would read valid bytes */
		CHECK(unlink(path) == 0 && symlink(target, path) == 0);
		lie(r, name);
		break;
	}
	case M_FIFO:
		CHECK(unlink(path) == 0 && mkfifo(path, 0644) == 0);
		lie(r, name);
		break;
	case M_EXTEND: {
		struct stat st;
		CHECK(stat(path, &st) == 0 && truncate(path, st.st_size + (1 << 20)) == 0);
		lie(r, name);
		break;
	}
	case M_HUGE: {
		sel_key k;
		char nn[SEL_RECORD_NAME_MAX];
		test_make_sparse(r->dfd, name, &r->ns, 1u << 26, &k);
		sel_record_name(&k, nn);
		lie(r, nn);
		break;
	}
	case M_FLIP: {
		sel_record_header h;
		test_header_read(r->dfd, name, &h);
		uint32_t span = 192 + r->ns.layout.table_bytes;
		struct flip f;
		do
			f.at = (uint32_t)test_rng_below(&rng, span);
		while (f.at >= 176 && f.at < 184); /* the checksum itself: resealed anyway */
		f.bit = (uint8_t)(1u << test_rng_below(&rng, 8));
		r->last_at = f.at;
		test_header_edit(r->dfd, name, flip_bit, &f);
		if (flip_harmless(r, name, &h))
			r->unjudgeable++;
		else
			lie(r, name);
		break;
	}
	default: break;
	}
}

static void mutate_phase(struct run *r, bool runtime)
{
	for (size_t k = 0; k < r->n; k++)
		if (r->c[k].runtime == runtime && !r->c[k].control)
			for (int i = 0; i < 3; i++)
				mutate(r, &r->c[k], i);
}

/* ---- verify and restore --------------------------------------------------------------------------- */

static void verify_reports_lies(struct run *r)
{
	const char *argv[] = {"records", "verify", r->dir, "--json", NULL};
	char *buf = NULL;
	size_t len = 0;
	FILE *o = open_memstream(&buf, &len), *e = fopen("/dev/null", "w");
	CHECK(o && e);
	int rc = flare_records(4, (char **)argv, o, e);
	fclose(o);
	fclose(e);
	CHECKF(rc == 1, "verify exit %d with %zu lying files", rc, r->n_lies);
	json_error_t err;
	json_t *j = json_loads(buf, 0, &err);
	CHECK(j);
	json_t *ns = json_array_get(json_object_get(j, "namespaces"), 0);
	json_t *probs = json_object_get(ns, "problems");
	size_t missed = 0;
	for (size_t l = 0; l < r->n_lies; l++) {
		bool found = false;
		size_t i;
		json_t *p;
		json_array_foreach(probs, i,
				   p) if (!strcmp(json_string_value(json_object_get(p, "file")),
						  r->lies[l])) found = true;
		if (!found && missed++ < 20)
			fprintf(stderr, "verify did not report %s (%s, byte %u)\n", r->lies[l],
				mut_name[r->lie_kind[l]], r->lie_at[l]);
	}
	CHECKF(missed == 0, "verify missed %zu of %zu lying files", missed, r->n_lies);
	printf("  verify: exit 1, %zu problems naming all %zu lying files it can judge (not: %" PRIu64
	       " header flips that change nothing a read uses, %" PRIu64 " parent links "
	       "forged with their check)\n",
	       json_array_size(probs), r->n_lies, r->unjudgeable, r->consistent_forgeries);
	json_decref(j);
	free(buf);
}

struct tally {
	uint64_t exact, lookup_miss, fetch_refused, fetch_failed;
};

/* Restore c's history at resident 0: exact, or a miss (counted in t). */
static void restore(struct run *r, sel_store *s, struct conv *c, struct tally *t)
{
	sel_hit h;
	int rc = sel_store_lookup(s, &c->cv.h, 0, UINT64_MAX, &h);
	CHECK_OK(rc);
	if (rc == 0) {
		CHECKF(c->touched, "conversation %" PRIu64 ": untouched, and a miss", c->cv.tag);
		t->lookup_miss++;
		return;
	}
	sel_key want;
	sel_history_key_at(&c->cv.h, h.key.consumed, &want);
	CHECK(sel_key_eq(&want, &h.key));
	uint32_t dst[8];
	CHECK(h.pages <= 8);
	for (uint32_t i = 0; i < h.pages; i++)
		dst[i] = 200 + i;
	sel_inbound in = {.ticket = c->cv.tag, .pages = dst, .n_pages = h.pages, .state_slot = 60};
	sfx_poison(&r->fx);
	if (sel_store_fetch(s, &h, &in) != 0) {
		t->fetch_refused++;
		return;
	}
	sel_event ev;
	sfx_wait_events(s, &ev, 1, NULL);
	CHECK(ev.ticket == in.ticket);
	if (ev.type == SEL_EV_FETCH_FAILED) {
		t->fetch_failed++;
		return;
	}
	CHECK(ev.type == SEL_EV_FETCHED);
	for (uint32_t i = 0; i < h.pages; i++)
		CHECKF(sfx_page_ok(&r->fx, dst[i], c->cv.tag, i, false),
		       "conversation %" PRIu64 ": page %u of the hit at %" PRIu64 " is not its own",
		       c->cv.tag, i, h.key.consumed);
	CHECKF(sfx_row_ok(&r->fx, 60, sfx_row_seed(&c->cv, h.key.consumed), false),
	       "conversation %" PRIu64 ": the row of the hit at %" PRIu64 " is not its own",
	       c->cv.tag, h.key.consumed);
	CHECKF(c->touched || h.key.consumed == ends[2],
	       "conversation %" PRIu64 " untouched, hit "
	       "at %" PRIu64,
	       c->cv.tag, h.key.consumed);
	t->exact++;
}

static void restore_all(struct run *r, sel_store *s, const char *when)
{
	struct tally t = {0};
	sel_stats before, after;
	sel_store_stats(s, &before);
	for (size_t k = 0; k < r->n; k++)
		restore(r, s, &r->c[k], &t);
	sel_store_stats(s, &after);
	CHECK_OK(sel_disk_store_check(s));
	/* Every miss is one the store counted. */
	uint64_t lookups = after.lookups - before.lookups, hits = after.hits - before.hits;
	CHECK(lookups == r->n && lookups - hits == t.lookup_miss);
	CHECK(after.fetch_failures - before.fetch_failures == t.fetch_failed);
	printf("  %s: %" PRIu64 " exact, %" PRIu64 " misses (%" PRIu64 " no hit, %" PRIu64
	       " fetch refused, %" PRIu64 " fetch failed); %" PRIu64 " chains rejected, %" PRIu64
	       " corrupt\n",
	       when, t.exact, t.lookup_miss + t.fetch_refused + t.fetch_failed, t.lookup_miss,
	       t.fetch_refused, t.fetch_failed, after.chains_rejected - before.chains_rejected,
	       after.tier[SEL_TIER_DISK].corrupt - before.tier[SEL_TIER_DISK].corrupt);
}

static sel_store *open_store(struct run *r)
{
	sel_store_config cfg = sfx_config(&r->fx, false);
	cfg.disk_dir = r->base;
	cfg.disk_limit = 1ull << 30;
	sel_store *s;
	CHECK_OK(sel_store_open(&cfg, &s));
	return s;
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	struct run r;
	memset(&r, 0, sizeof r);
	r.n = test_soak() ? 4000 : 720;
	sfx_init(&r.fx, 1, 1, (uint64_t[]){4096}, 1000, 8 * BATCH + 256, 3 * BATCH + 64);
	char *base = test_mkdtemp("untrusted");
	snprintf(r.base, sizeof r.base, "%s", base);
	snprintf(r.decoy, sizeof r.decoy, "%s/decoy", base);
	CHECK(mkdir(r.decoy, 0755) == 0);
	FILE *f = fopen(strcat(strcpy((char[4400]){0}, r.decoy), "/notes"), "w");
	CHECK(f && fputs("not the store's", f) >= 0 && fclose(f) == 0);
	sel_store_config cfg = sfx_config(&r.fx, false);
	CHECK_OK(sel_record_ns_init(&r.ns, r.fx.g, cfg.identity));
	CHECK((r.c = calloc(r.n, sizeof *r.c)));
	for (size_t k = 0; k < r.n; k++) {
		r.c[k].runtime = k % 2;
		r.c[k].control = k % 8 >= 6; /* a quarter: the restores that must succeed */
	}

	uint64_t t0 = eos_now_ns();
	write_all(&r);
	uint64_t t1 = eos_now_ns();
	r.dfd = open(r.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(r.dfd >= 0);

	/* While down: half the conversations lie; verify must name them. */
	mutate_phase(&r, false);
	uint8_t decoy_before[16], decoy_after[16];
	test_tree_hash(r.decoy, decoy_before);
	verify_reports_lies(&r);

	/* The scan meets those; then the other half lies under a live store. */
	sel_store *s = open_store(&r);
	uint64_t scanned = test_store_scanned(s);
	mutate_phase(&r, true);
	test_tree_hash(r.decoy, decoy_before); /* the links' targets are in it now */
	restore_all(&r, s, "live store (scan-time and runtime lies)");
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);

	s = open_store(&r);
	restore_all(&r, s, "after a restart");
	CHECK_RC(sel_store_close(s, 0), 0);
	sel_store_destroy(s);
	test_tree_hash(r.decoy, decoy_after);
	CHECKF(!memcmp(decoy_before, decoy_after, 16),
	       "the decoy tree outside the directory changed");

	printf("  %zu records written by a disk store in %.1f s; %" PRIu64 " kept by the scan;"
	       " mutations:",
	       3 * r.n, (double)(t1 - t0) / 1e9, scanned);
	for (int m = 0; m < M_KINDS; m++)
		printf(" %s %" PRIu64 "%s", mut_name[m], r.count[m], m + 1 < M_KINDS ? "," : "\n");
	printf("  nothing outside the directory changed (decoy tree hashed before and after)\n");

	close(r.dfd);
	for (size_t k = 0; k < r.n; k++)
		sfx_conv_free(&r.c[k].cv);
	for (size_t l = 0; l < r.n_lies; l++)
		free(r.lies[l]);
	free(r.lies);
	free(r.lie_kind);
	free(r.lie_at);
	free(r.c);
	sel_record_ns_free(&r.ns);
	test_rmtree(base);
	free(base);
	sfx_free(&r.fx);
	printf("ok\n");
	return 0;
}
