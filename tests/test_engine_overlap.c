/*
 * test_engine_overlap.c - overlapped restores (issue 18; engine_overlap.c):
 * the head of a host hit recomputed while its tail loads.
 *
 * Covers, on the built-in core with the host backend and a small GPU cache
 * (fillers evict turn 1's checkpoints, so turn 2 is a host hit):
 *   - same_tokens: with the memory store and --prefix-cache-overlap always,
 *     turn 2 is restored overlapped (head tokens recomputed, the rest
 *     restored, no mismatch) and its tokens equal those of the same
 *     conversation restored plainly (overlap off: the flag changes the
 *     path, no overlapped restore at all), of an engine without offload and
 *     of the model run directly;
 *   - on_against_off (issue 18 item 3): on and off with all else equal
 *     (test_split_worth: the policy's point taken whatever it gains): on
 *     splits the hit, off does not; the same tokens (fails when off is
 *     ignored);
 *   - mismatch (memory store, and the composite's warm copies): every
 *     stored page of the memory store is changed after it
 *     was stored (its digest, taken from the stored bytes, agrees with
 *     them, so only the recompute can tell): the overlapped restore finds
 *     the head page differing, counts it, drops the record and recomputes
 *     the request, whose tokens are still the reference's;
 *   - disk, built-in core (padded page records: a plane of 8 bytes a
 *     token): records this build writes (version 4, zero padding) give
 *     the head's digests with the tail's fetch, so the disk store's hit is
 *     overlapped from disk (the composite's from warm memory); the same
 *     files rewritten as version 3 (padding undefined) refuse them after a
 *     restart and the hit restores whole; the same tokens each time;
 *   - disk_overlap, a core whose page records are unpadded: the disk
 *     store's hit and the composite's after a restart are overlapped, the
 *     head's digests delivered by the tail's fetch from the records'
 *     checksum segments, with the same tokens as overlap off, no offload
 *     and the model; the restore's file calls all come from the disk
 *     thread (SELENE_DISK_IO=pread, every call through eos_fileops);
 *   - disk_mismatch: a stored page changed on disk with its checksum
 *     resealed (the disk thread's own checks pass): the recompute finds
 *     it, counts it, the request recomputes and the record is dropped.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include "xxh.h"

#include "engine_test.h"
#include "internal.h"
#include "store_disk.h"
#include "store_composite.h"
#include "store_memory_int.h"

static hel_core *core, *tiny, *flat;
static test_rng rng;

static hel_engine *start(hel_engine_config c) { return et_engine_start(core, c); }

static void finish(hel_engine *e) { et_engine_finish(e); }

static const hel_engine_config small = {.max_active = 3,
					.gpu_pages = 24,
					.gpu_rows = 30,
					.fetch = HEL_FETCH_ALWAYS,
					.overlap = HEL_OVERLAP_ALWAYS};

static void fillers(hel_engine *e, uint64_t seed, int count)
{
	test_rng r;
	test_rng_init(&r, seed);
	for (int i = 0; i < count; i++) {
		uint32_t n;
		hel_token *p = et_random_prompt(&r, 130 + test_rng_below(&r, 40), &n);
		et_call_free(et_run(e, p, n, 3, NULL));
		free(p);
	}
}

struct turns {
	uint64_t t1;
	struct et_call *turn1, *turn2;
	hel_token *p2;
	uint32_t n2;
};

/* Turn 1 (about six pages), a request resuming at its terminal (which
 * offers it), fillers, turn 2.  hook (may be NULL) runs before turn 2. */
static void turns(hel_engine *e, uint64_t seed, struct turns *o, void (*hook)(void *), void *arg)
{
	test_rng r;
	test_rng_init(&r, seed);
	struct et_chat ch = {0};
	char q[400];
	size_t len = 300 + test_rng_below(&r, 60);
	et_text(&r, q, len);
	et_chat_add(&ch, "user", q, len);
	uint32_t n1;
	hel_token *p1 = et_chat_prompt(&ch, &n1);
	o->turn1 = et_run(e, p1, n1, 40, NULL);
	o->t1 = et_terminal(o->turn1);
	hel_token *pc = malloc(o->t1 * sizeof *pc);
	memcpy(pc, p1, n1 * sizeof *pc);
	memcpy(pc + n1, o->turn1->tok, (o->t1 - n1) * sizeof *pc);
	et_call_free(et_run(e, pc, (uint32_t)o->t1, 1, NULL));
	et_settle(e);
	fillers(e, seed ^ 0x5eed, 14);
	et_settle(e);
	if (hook)
		hook(arg);
	et_chat_reply(&ch, o->turn1->tok, o->turn1->n);
	len = 20 + test_rng_below(&r, 40);
	et_text(&r, q, len);
	et_chat_add(&ch, "user", q, len);
	o->p2 = et_chat_prompt(&ch, &o->n2);
	o->turn2 = et_run(e, o->p2, o->n2, 40, NULL);
	et_chat_free(&ch);
	free(p1);
	free(pc);
}

static void turns_free(struct turns *o)
{
	et_call_free(o->turn1);
	et_call_free(o->turn2);
	free(o->p2);
}

static void same(const struct et_call *a, const struct et_call *b, const char *what)
{
	CHECKF(a->n == b->n && !memcmp(a->tok, b->tok, a->n * sizeof(hel_token)),
	       "%s: tokens differ", what);
}

static void check_ref(const struct turns *o)
{
	struct et_ref ref;
	et_reference(core, o->p2, o->n2, 40, NULL, &ref);
	et_same_as_ref(NULL, o->turn2, &ref);
	et_ref_free(&ref);
}

static hel_engine_stats stats(hel_engine *e)
{
	hel_engine_stats st;
	et_settle(e);
	hel_engine_stats_get(e, &st);
	return st;
}

/* Issue 18 item 3: --prefix-cache-overlap off changes what on does.  Two
 * engines that differ only in the mode (on, off), both with
 * test_split_worth (the tiny core's restores are never worth a split by
 * the estimates): on splits the host hit at the policy's point (not the
 * middle page: that is always), off restores it whole or recomputes it
 * (the fetch policy's choice); the tokens are the same and the
 * reference's. */
static void on_against_off(void)
{
	uint64_t seed = test_rng_next(&rng);
	hel_engine_config con = small, coff = small;
	con.memory_bytes = coff.memory_bytes = 32 << 20;
	con.overlap = HEL_OVERLAP_ON;
	coff.overlap = HEL_OVERLAP_OFF;
	con.test_split_worth = coff.test_split_worth = true;
	con.fetch = coff.fetch = HEL_FETCH_AUTO; /* always takes the split from on */
	hel_engine *on = start(con), *off = start(coff);
	struct turns a, b;
	turns(on, seed, &a, NULL, NULL);
	turns(off, seed, &b, NULL, NULL);
	hel_engine_stats sa = stats(on), sb = stats(off);
	const hel_outcome *oa = &a.turn2->out, *ob = &b.turn2->out;
	CHECKF(oa->overlap_tokens > 0 && oa->host_tier == SEL_TIER_MEMORY &&
		       sa.overlap_done == sa.overlap_restores && sa.overlap_restores >= 1,
	       "on: overlap %llu tier %d done %llu of %llu", (unsigned long long)oa->overlap_tokens,
	       (int)oa->host_tier, (unsigned long long)sa.overlap_done,
	       (unsigned long long)sa.overlap_restores);
	/* Off: restored whole or recomputed, as the fetch policy says. */
	CHECKF(ob->overlap_tokens == 0 && sb.overlap_restores == 0 && sb.host_hits >= 1 &&
		       sb.overlap_head_tokens == 0,
	       "off: overlap %llu restores %llu", (unsigned long long)ob->overlap_tokens,
	       (unsigned long long)sb.overlap_restores);
	same(a.turn2, b.turn2, "turn 2, on and off");
	check_ref(&a);
	printf("  on against off: on split the hit (%llu head tokens at the policy's point), off "
	       "did not; the same tokens\n",
	       (unsigned long long)oa->overlap_tokens);
	turns_free(&a);
	turns_free(&b);
	finish(on);
	finish(off);
}

static void same_tokens(void)
{
	uint64_t seed = test_rng_next(&rng);
	hel_engine_config con = small, coff = small, cno = small;
	con.memory_bytes = coff.memory_bytes = 32 << 20;
	coff.overlap = HEL_OVERLAP_OFF;
	hel_engine *on = start(con), *off = start(coff), *no = start(cno);
	struct turns a, b, c;
	turns(on, seed, &a, NULL, NULL);
	turns(off, seed, &b, NULL, NULL);
	turns(no, seed, &c, NULL, NULL);
	hel_engine_stats sa = stats(on), sb = stats(off);

	/* Overlapped: the head recomputed, the rest restored, from memory. */
	const hel_outcome *oa = &a.turn2->out;
	CHECKF(oa->overlap_tokens > 0 && oa->host_tier == SEL_TIER_MEMORY &&
		       oa->reused_gpu_tokens + oa->overlap_tokens + oa->reused_host_tokens == a.t1,
	       "overlap %llu host %llu gpu %llu terminal %llu",
	       (unsigned long long)oa->overlap_tokens, (unsigned long long)oa->reused_host_tokens,
	       (unsigned long long)oa->reused_gpu_tokens, (unsigned long long)a.t1);
	CHECK(oa->cached_tokens == a.t1 - oa->overlap_tokens && oa->prefill_tokens == a.n2 - a.t1);
	CHECK(sa.overlap_restores >= 1 && sa.overlap_done == sa.overlap_restores);
	CHECK(sa.overlap_mismatches == 0 && sa.overlap_head_tokens >= oa->overlap_tokens);
	CHECK(sa.host_fetch_failed == 0);

	/* Off: restored whole, no head. */
	const hel_outcome *ob = &b.turn2->out;
	CHECK(ob->overlap_tokens == 0 && ob->reused_host_tokens + ob->reused_gpu_tokens == b.t1);
	CHECK(sb.overlap_restores == 0 && sb.overlap_head_tokens == 0 && sb.host_hits >= 1);

	same(a.turn1, b.turn1, "turn 1, on and off");
	same(a.turn2, b.turn2, "turn 2, overlapped and plain");
	same(a.turn2, c.turn2, "turn 2, overlapped and without offload");
	check_ref(&a);
	printf("  memory: %llu of %llu tokens recomputed as the head, %llu restored; the same "
	       "%u tokens as a plain restore, without offload and the model\n",
	       (unsigned long long)oa->overlap_tokens, (unsigned long long)a.t1,
	       (unsigned long long)oa->reused_host_tokens, a.turn2->n);
	turns_free(&a);
	turns_free(&b);
	turns_free(&c);
	finish(on);
	finish(off);
	finish(no);
}

/* ---- a stored page that lies --------------------------------------------------- */

/* Change one byte of every stored page of the memory store.  Its digests
 * are taken from these bytes, so they agree with them: only a recompute
 * finds the difference.  The worker is settled (nothing in flight). */
struct kept {
	sel_store *s;
	bool composite;
};

static int open_keep(void *ctx, const sel_store_config *cfg, sel_store **out)
{
	int rc = sel_store_open(cfg, out);
	((struct kept *)ctx)->s = *out;
	return rc;
}

static void corrupt_pages(void *arg)
{
	struct kept *k = arg;
	struct mem_store *ms = sel_ms_of(k->composite ? sel_composite_store_memory(k->s) : k->s);
	const sel_slot_layout *l = &ms->c.sp->layout;
	uint32_t n = 0;
	for (sel_node_id id = 0; id < ms->c.nrecs; id++) {
		if (!sel_core_live(&ms->c, id))
			continue;
		struct mrec *m = ms_rec(ms, id);
		for (uint32_t i = 0; i < m->n_page_slots; i++) {
			uint8_t *p = (uint8_t *)sel_slab_addr(ms->pool, m->slots[i]) +
				     l->share_off[0] + l->plane_off[0][0];
			p[7] ^= 0x5a;
			n++;
		}
	}
	CHECK(n > 0);
}

static void mismatch(bool composite)
{
	uint64_t seed = test_rng_next(&rng);
	struct kept k = {.composite = composite};
	char *dir = composite ? test_mkdtemp("engine-overlap") : NULL;
	hel_engine_config cfg = small;
	cfg.memory_bytes = 32 << 20;
	cfg.store_open = open_keep;
	cfg.store_ctx = &k;
	if (composite) {
		cfg.disk_dir = dir;
		cfg.disk_limit = 256 << 20;
		cfg.disk_limit_set = true;
	}
	hel_engine *e = start(cfg);
	struct turns a;
	turns(e, seed, &a, corrupt_pages, &k);
	hel_engine_stats st = stats(e);
	const hel_outcome *o = &a.turn2->out;
	CHECKF(st.overlap_mismatches == 1 && st.overlap_restores == 1 && st.overlap_done == 0,
	       "mismatches %llu restores %llu done %llu", (unsigned long long)st.overlap_mismatches,
	       (unsigned long long)st.overlap_restores, (unsigned long long)st.overlap_done);
	/* Failed, recomputed (no host lookup on the retry), record dropped. */
	CHECK(st.host_fetch_failed == 1 && o->reused_host_tokens == 0 && o->overlap_tokens == 0);
	CHECK(o->prefill_tokens == a.n2 - o->reused_gpu_tokens);
	CHECK(st.store.tier[composite ? SEL_TIER_DISK : SEL_TIER_MEMORY].corrupt == 1);
	check_ref(&a);
	/* Dropped: the turn-1 terminal's record is gone from memory. */
	sel_key t1;
	struct sel_memory_record_info ri;
	sel_key_direct(core->identity, NULL, 0, a.p2, a.t1, &t1);
	CHECK_RC(sel_memory_store_record(composite ? sel_composite_store_memory(k.s) : k.s, &t1,
					 &ri),
		 -ENOENT);
	printf("  mismatch (%s): a stored page that differs from its recompute was found, "
	       "counted, dropped and recomputed (%u tokens as the model's)\n",
	       composite ? "composite" : "memory", a.turn2->n);
	turns_free(&a);
	finish(e);
	if (dir) {
		test_rmtree(dir);
		free(dir);
	}
}

/* ---- disk tiers ------------------------------------------------------------------- */

/* Rewrite every record file under dir as version 3 (header checksum
 * resealed): its padding no longer promised zero.  Returns the files. */
static int downgrade(const char *dir)
{
	int n = 0;
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	struct dirent *de;
	while ((de = readdir(d))) {
		char path[4096];
		size_t len = strlen(de->d_name);
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
		if (len < 5 || strcmp(de->d_name + len - 5, ".ckpt")) {
			if (de->d_type == DT_DIR)
				n += downgrade(path);
			continue;
		}
		int fd = open(path, O_RDWR);
		CHECK(fd >= 0);
		uint8_t h[4096];
		CHECK(pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
		CHECK(sel_get_u32(h + 8) == 4 && sel_get_u32(h + 16) == sizeof h);
		sel_put_u32(h + 8, 3);
		memset(h + 176, 0, 8);
		sel_put_u64(h + 176, XXH3_64bits(h, sizeof h));
		CHECK(pwrite(fd, h, sizeof h, 0) == (ssize_t)sizeof h && fsync(fd) == 0);
		close(fd);
		n++;
	}
	closedir(d);
	return n;
}

/* Records written by this build (version 4: zero padding) give their head's
 * digests with the tail's fetch: the disk store's turn 2 is overlapped from
 * disk; the composite's from warm memory.  After a restart with the files
 * rewritten as version 3 (padding undefined, as older builds wrote it),
 * the fetch refuses the digests and the hit restores whole.  The same
 * tokens each time. */
static void disk(bool composite)
{
	uint64_t seed = test_rng_next(&rng);
	char *dir = test_mkdtemp("engine-overlap");
	hel_engine_config cfg = small, cno = small;
	cfg.disk_dir = dir;
	cfg.disk_limit = 256 << 20;
	cfg.disk_limit_set = true;
	if (composite) {
		cfg.memory_bytes = 32 << 20;
		cfg.drain_on_shutdown = true;
	}
	hel_engine *e = start(cfg), *no = start(cno);
	struct turns a, c;
	turns(e, seed, &a, NULL, NULL);
	turns(no, seed, &c, NULL, NULL);
	hel_engine_stats st = stats(e);
	const hel_outcome *o = &a.turn2->out;
	CHECKF(o->overlap_tokens > 0 && st.overlap_done == 1 && st.overlap_mismatches == 0 &&
		       o->host_tier == (composite ? SEL_TIER_MEMORY : SEL_TIER_DISK),
	       "%s: tier %d overlap %llu done %llu", composite ? "composite" : "disk",
	       (int)o->host_tier, (unsigned long long)o->overlap_tokens,
	       (unsigned long long)st.overlap_done);
	same(a.turn2, c.turn2, "disk: turn 2 and without offload");
	check_ref(&a);
	finish(e);
	int n3 = downgrade(dir);
	CHECK(n3 > 0);
	e = start(cfg); /* after a restart: version-3 files, from disk, whole */
	struct et_call *r = et_run(e, a.p2, a.n2, 40, NULL);
	st = stats(e);
	CHECKF(r->out.host_tier == SEL_TIER_DISK && r->out.overlap_tokens == 0 &&
		       st.overlap_restores == 0 && r->out.reused_host_tokens > 0,
	       "version 3: tier %d overlap %llu restores %llu host %llu", (int)r->out.host_tier,
	       (unsigned long long)r->out.overlap_tokens, (unsigned long long)st.overlap_restores,
	       (unsigned long long)r->out.reused_host_tokens);
	same(r, a.turn2, "disk: version-3 records after a restart");
	et_call_free(r);
	finish(e);
	printf("  %s, padded records: overlapped from %s (version 4); %d files rewritten as "
	       "version 3 restore whole after a restart; the same tokens\n",
	       composite ? "composite" : "disk store",
	       composite ? "warm memory" : "disk, digests from the fetch", n3);
	turns_free(&a);
	turns_free(&c);
	finish(no);
	test_rmtree(dir);
	free(dir);
}

/* ---- disk records that give their digests ------------------------------------- */

/* The built-in core with every page plane 64 bytes a token (4 KiB a page):
 * stored page records without padding. */
static hel_core *flat_core(void)
{
	const char *t = hel_core_builtin_text();
	size_t n = strlen(t);
	char *x = malloc(2 * n + 1), *o = x;
	CHECK(x != NULL);
	for (const char *p = t; *p;) {
		if (!strncmp(p, "token_bytes = 8\n", 16) || !strncmp(p, "token_bytes = 32\n", 17)) {
			o += sprintf(o, "token_bytes = 64\n");
			p = strchr(p, '\n') + 1;
		} else {
			*o++ = *p++;
		}
	}
	*o = '\0';
	hel_core *c;
	char err[256];
	CHECKF(hel_core_parse(x, strlen(x), "flat.core", &c, err, sizeof err) == 0, "%s", err);
	free(x);
	return c;
}

/* File calls by thread: on the disk thread, and on any other. */
static int io_other, io_disk;
static const struct eos_fileops *libc_ops;
static struct eos_fileops watch_ops;

static void io_note(void)
{
	char name[16] = "";
	pthread_getname_np(pthread_self(), name, sizeof name);
	__atomic_add_fetch(strcmp(name, "sel-disk") ? &io_other : &io_disk, 1, __ATOMIC_RELAXED);
}
static int w_openat(int d, const char *p, int f, mode_t m)
{
	io_note();
	return libc_ops->openat(d, p, f, m);
}
static int w_open(const char *p, int f, mode_t m)
{
	io_note();
	return libc_ops->open(p, f, m);
}
static ssize_t w_pread(int fd, void *b, size_t n, off_t off)
{
	io_note();
	return libc_ops->pread(fd, b, n, off);
}
static ssize_t w_pwrite(int fd, const void *b, size_t n, off_t off)
{
	io_note();
	return libc_ops->pwrite(fd, b, n, off);
}

/* Run p on a fresh engine cfg with every file call watched (the pread
 * path: no call bypasses eos_fileops). */
static struct et_call *watched_run(hel_engine_config cfg, const hel_token *p, uint32_t n,
				   hel_engine_stats *st, int *other, int *on_disk)
{
	setenv("SELENE_DISK_IO", "pread", 1);
	libc_ops = eos_fileops();
	watch_ops = *libc_ops;
	watch_ops.open = w_open;
	watch_ops.openat = w_openat;
	watch_ops.pread = w_pread;
	watch_ops.pwrite = w_pwrite;
	eos_fileops_set(&watch_ops);
	hel_engine *e = start(cfg);
	__atomic_store_n(&io_other, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&io_disk, 0, __ATOMIC_RELAXED);
	struct et_call *r = et_run(e, p, n, 40, NULL);
	*st = stats(e);
	*other = __atomic_load_n(&io_other, __ATOMIC_RELAXED);
	*on_disk = __atomic_load_n(&io_disk, __ATOMIC_RELAXED);
	finish(e);
	eos_fileops_set(NULL);
	unsetenv("SELENE_DISK_IO");
	return r;
}

static void disk_overlap(bool composite)
{
	uint64_t seed = test_rng_next(&rng);
	char *dir = test_mkdtemp("engine-overlap"), *dir2 = test_mkdtemp("engine-overlap");
	hel_engine_config cfg = small, coff, cno = small;
	cfg.disk_dir = dir;
	cfg.disk_limit = 256 << 20;
	cfg.disk_limit_set = true;
	if (composite) {
		cfg.memory_bytes = 32 << 20;
		cfg.drain_on_shutdown = true;
	}
	coff = cfg;
	coff.disk_dir = dir2;
	coff.overlap = HEL_OVERLAP_OFF;
	hel_engine *e = start(cfg), *off = start(coff), *no = start(cno);
	struct turns a, b, c;
	turns(e, seed, &a, NULL, NULL);
	turns(off, seed, &b, NULL, NULL);
	turns(no, seed, &c, NULL, NULL);
	hel_engine_stats st = stats(e), sb = stats(off);
	const hel_outcome *o = &a.turn2->out;
	if (!composite) { /* from disk, overlapped: the digests came with the fetch */
		CHECKF(o->host_tier == SEL_TIER_DISK && o->overlap_tokens > 0 &&
			       st.overlap_done == 1 && st.overlap_mismatches == 0,
		       "disk: tier %d overlap %llu done %llu", (int)o->host_tier,
		       (unsigned long long)o->overlap_tokens, (unsigned long long)st.overlap_done);
		CHECK(o->reused_gpu_tokens + o->overlap_tokens + o->reused_host_tokens == a.t1);
	}
	CHECK(b.turn2->out.overlap_tokens == 0 && sb.overlap_restores == 0);
	same(a.turn2, b.turn2, "disk overlap: overlapped and plain");
	same(a.turn2, c.turn2, "disk overlap: overlapped and without offload");
	check_ref(&a);
	uint64_t head = o->overlap_tokens;
	finish(e);
	if (composite) { /* after a restart: records on disk only */
		int other, on_disk;
		struct et_call *r = watched_run(cfg, a.p2, a.n2, &st, &other, &on_disk);
		CHECKF(r->out.host_tier == SEL_TIER_DISK && r->out.overlap_tokens > 0 &&
			       st.overlap_done == 1 && st.overlap_mismatches == 0,
		       "composite restart: tier %d overlap %llu done %llu", (int)r->out.host_tier,
		       (unsigned long long)r->out.overlap_tokens,
		       (unsigned long long)st.overlap_done);
		CHECKF(other == 0 && on_disk > 0, "file calls: %d off the disk thread, %d on it",
		       other, on_disk);
		same(r, a.turn2, "composite: overlapped from disk after a restart");
		head = r->out.overlap_tokens;
		et_call_free(r);
	}
	printf("  %s, unpadded records: %llu head tokens recomputed while the tail loaded, "
	       "their digests from the tail's fetch%s; the same tokens as plain, no offload "
	       "and the model\n",
	       composite ? "composite from disk after a restart" : "disk store",
	       (unsigned long long)head, composite ? " (every file call on the disk thread)" : "");
	turns_free(&a);
	turns_free(&b);
	turns_free(&c);
	finish(off);
	finish(no);
	test_rmtree(dir);
	test_rmtree(dir2);
	free(dir);
	free(dir2);
}

/* Change one byte of page record 0 of every record file under dir and
 * reseal its checksum entry: the disk thread's checks pass, only the
 * recompute can tell.  Returns the pages changed. */
static int reseal(const char *dir)
{
	int n = 0;
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	struct dirent *de;
	while ((de = readdir(d))) {
		char path[4096];
		size_t len = strlen(de->d_name);
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
		if (len < 5 || strcmp(de->d_name + len - 5, ".ckpt")) {
			if (de->d_type == DT_DIR)
				n += reseal(path);
			continue;
		}
		int fd = open(path, O_RDWR);
		CHECK(fd >= 0);
		uint8_t h[4096];
		CHECK(pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
		uint32_t hb = sel_get_u32(h + 16), tail = sel_get_u32(h + 28);
		uint64_t po = sel_get_u64(h + 144), ro = sel_get_u64(h + 152);
		if (tail) {
			size_t stride = (size_t)((ro - po) / tail);
			uint8_t *pg = malloc(stride), ck[8];
			CHECK(pg && pread(fd, pg, stride, (off_t)po) == (ssize_t)stride);
			pg[7] ^= 0x5a;
			sel_put_u64(ck, XXH3_64bits(pg, stride));
			CHECK(pwrite(fd, pg, stride, (off_t)po) == (ssize_t)stride);
			CHECK(pwrite(fd, ck, 8, (off_t)hb) == 8);
			CHECK(fsync(fd) == 0);
			free(pg);
			n++;
		}
		close(fd);
	}
	closedir(d);
	return n;
}

/* A hit over two records whose head reaches into the ancestor the tail's
 * fetch does not read: that record's checksums come through a job of
 * their own (K_SUMS in store_disk_staged.c).  Request x (a page and a
 * bit) stores its record, y (x's prompt and four pages more) one linking
 * under it; after fillers, y again is split at its middle page. */
static void disk_chain(void)
{
	uint64_t seed = test_rng_next(&rng);
	char *dir = test_mkdtemp("engine-overlap");
	struct kept k = {0};
	hel_engine_config cfg = small;
	cfg.disk_dir = dir;
	cfg.disk_limit = 256 << 20;
	cfg.disk_limit_set = true;
	cfg.store_open = open_keep;
	cfg.store_ctx = &k;
	hel_engine *e = start(cfg), *no = start(small);
	test_rng r;
	test_rng_init(&r, seed);
	uint32_t nx, ny;
	hel_token *x = et_random_prompt(&r, 70, &nx), *y = et_random_prompt(&r, 330, &ny);
	memcpy(y, x, nx * sizeof *y);
	et_call_free(et_run(e, x, nx, 1, NULL));
	et_settle(e);
	et_call_free(et_run(e, y, ny, 1, NULL));
	et_settle(e);
	fillers(e, seed ^ 0x5eed, 14);
	et_settle(e);
	struct et_call *a = et_run(e, y, ny, 20, NULL), *c = et_run(no, y, ny, 20, NULL);
	hel_engine_stats st = stats(e);
	CHECKF(a->out.host_tier == SEL_TIER_DISK && a->out.overlap_tokens > 64 &&
		       st.overlap_done == 1 && st.overlap_mismatches == 0,
	       "chain: tier %d overlap %llu done %llu", (int)a->out.host_tier,
	       (unsigned long long)a->out.overlap_tokens, (unsigned long long)st.overlap_done);
	same(a, c, "chain: overlapped and without offload");
	/* y's record links under x's, and the head went past x's pages. */
	sel_key ky;
	struct sel_disk_record_info ri;
	sel_key_direct(core->identity, NULL, 0, y, ny, &ky);
	CHECK_OK(sel_disk_store_record(k.s, &ky, &ri));
	CHECKF(!ri.is_root && ri.parent.consumed >= 64 &&
		       ri.parent.consumed / 64 * 64 < a->out.overlap_tokens,
	       "chain: parent at %llu, head %llu", (unsigned long long)ri.parent.consumed,
	       (unsigned long long)a->out.overlap_tokens);
	printf("  disk store, a head over two records: %llu head tokens, the ancestor's "
	       "digests by a job of their own; the same tokens\n",
	       (unsigned long long)a->out.overlap_tokens);
	et_call_free(a);
	et_call_free(c);
	free(x);
	free(y);
	finish(e);
	finish(no);
	test_rmtree(dir);
	free(dir);
}

static void disk_mismatch(void)
{
	uint64_t seed = test_rng_next(&rng);
	char *dir = test_mkdtemp("engine-overlap");
	struct kept k = {0};
	hel_engine_config cfg = small;
	cfg.disk_dir = dir;
	cfg.disk_limit = 256 << 20;
	cfg.disk_limit_set = true;
	cfg.store_open = open_keep;
	cfg.store_ctx = &k;
	hel_engine *e = start(cfg);
	struct turns a;
	turns(e, seed, &a, NULL, NULL); /* its records on disk */
	finish(e);
	int changed = reseal(dir);
	CHECK(changed > 0);
	e = start(cfg);
	struct et_call *r = et_run(e, a.p2, a.n2, 40, NULL);
	hel_engine_stats st = stats(e);
	CHECKF(st.overlap_mismatches == 1 && st.overlap_restores == 1 && st.overlap_done == 0,
	       "mismatches %llu restores %llu done %llu", (unsigned long long)st.overlap_mismatches,
	       (unsigned long long)st.overlap_restores, (unsigned long long)st.overlap_done);
	CHECK(st.host_fetch_failed == 1 && r->out.reused_host_tokens == 0 &&
	      r->out.overlap_tokens == 0);
	CHECK(st.store.tier[SEL_TIER_DISK].corrupt == 1);
	same(r, a.turn2, "disk mismatch: recomputed");
	/* Dropped: the record no longer answers (gone, or its row dropped). */
	sel_key t1;
	struct sel_disk_record_info ri;
	sel_key_direct(core->identity, NULL, 0, a.p2, a.t1, &t1);
	int rc = sel_disk_store_record(k.s, &t1, &ri);
	CHECKF(rc == -ENOENT || (rc == 0 && !ri.has_row), "record at %llu: rc %d",
	       (unsigned long long)a.t1, rc);
	printf("  disk mismatch: %d stored pages changed on disk with resealed checksums; the "
	       "recompute found it: counted, dropped, recomputed (%u tokens as before)\n",
	       changed, r->n);
	et_call_free(r);
	turns_free(&a);
	finish(e);
	test_rmtree(dir);
	free(dir);
}

int main(void)
{
	test_rng_init(&rng, test_seed());
	CHECK_OK(hel_core_builtin(&tiny));
	flat = flat_core();
	core = tiny;
	same_tokens();
	on_against_off();
	mismatch(false);
	mismatch(true);
	disk(false);
	disk(true);
	core = flat;
	disk_overlap(false);
	disk_overlap(true);
	core = tiny; /* padded page records, version 4 */
	disk_chain();
	disk_mismatch();
	hel_core_free(tiny);
	hel_core_free(flat);

	printf("ok\n");
	return 0;
}
