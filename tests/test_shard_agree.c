/*
 * test_shard_agree.c - the startup agreement of the ranks' record
 * directories (src/selene/shard_agree.c, design 2.14): a record is kept only
 * when every rank holds it with the same header, its row only when every
 * rank holds it, records whose parent is dropped go too, and every rank's
 * actions leave it exactly the agreed set.  Pure cases first, then real
 * record files in per-rank directories, including a peer that restarted with
 * a different record set.
 */
#include <fcntl.h>
#include <unistd.h>

#include "recutil.h"
#include "shard_agree.h"
#include "shardfx.h"
#include "testutil.h"

#define W_MAX 4
#define N_MAX 32

static struct sel_shard_entry entry(const sel_record_desc *d, bool row)
{
	struct sel_shard_entry e = {.d = *d,
				    .version = 3,
				    .header_bytes = 4096,
				    .created_ns = 1000 + d->key.consumed,
				    .page_off = 8192,
				    .has_row = row};
	e.row_off = e.page_off + (uint64_t)d->tail * 8192;
	e.row_end = e.row_off + 4096;
	return e;
}

struct world {
	uint32_t n;
	struct sel_shard_entry e[W_MAX][N_MAX];
	size_t cnt[W_MAX];
	uint8_t act[W_MAX][N_MAX];
	struct sel_shard_agree_stats st;
};

static void put(struct world *w, uint32_t r, const sel_record_desc *d, bool row)
{
	CHECK(w->cnt[r] < N_MAX);
	w->e[r][w->cnt[r]++] = entry(d, row);
}

/* Every rank: d on it with its row. */
static void put_all(struct world *w, const sel_record_desc *d)
{
	for (uint32_t r = 0; r < w->n; r++)
		put(w, r, d, true);
}

static int decide(struct world *w)
{
	const struct sel_shard_entry *ent[W_MAX];
	uint8_t *act[W_MAX];
	for (uint32_t r = 0; r < w->n; r++) {
		ent[r] = w->e[r];
		act[r] = w->act[r];
	}
	return sel_shard_agree(w->n, 64, ent, w->cnt, act, &w->st);
}

/* The action rank r takes for key k (-1: not in its summary). */
static int action(const struct world *w, uint32_t r, const sel_key *k)
{
	for (size_t i = 0; i < w->cnt[r]; i++)
		if (sel_key_eq(&w->e[r][i].d.key, k))
			return w->act[r][i];
	return -1;
}

/* The invariants of shard_agree.c, whatever the case: after the actions
 * every rank holds the same keys with the same rows; kept records that link
 * have their parent kept; kept page-only records have a kept child. */
static void check_invariants(const struct world *w)
{
	for (size_t i = 0; i < w->cnt[0]; i++) {
		const struct sel_shard_entry *x = &w->e[0][i];
		int a0 = w->act[0][i];
		bool kept = a0 != SEL_SHARD_DELETE;
		bool row = x->has_row && a0 == SEL_SHARD_KEEP;
		for (uint32_t r = 1; r < w->n; r++) {
			int a = action(w, r, &x->d.key);
			if (!kept) {
				CHECK(a == -1 || a == SEL_SHARD_DELETE);
				continue;
			}
			CHECKF(a != -1 && a != SEL_SHARD_DELETE, "kept on rank 0, gone on rank %u",
			       r);
			for (size_t j = 0; j < w->cnt[r]; j++)
				if (sel_key_eq(&w->e[r][j].d.key, &x->d.key)) {
					CHECK(sel_shard_entry_same(&w->e[r][j], x));
					CHECK((w->e[r][j].has_row && a == SEL_SHARD_KEEP) == row);
				}
		}
		if (kept && sel_record_links_parent(&x->d, 64))
			CHECK(action(w, 0, &x->d.parent) >= 0 &&
			      action(w, 0, &x->d.parent) != SEL_SHARD_DELETE);
		if (kept && !row) {
			bool child = false;
			for (size_t j = 0; j < w->cnt[0]; j++)
				if (w->act[0][j] != SEL_SHARD_DELETE &&
				    sel_record_links_parent(&w->e[0][j].d, 64) &&
				    sel_key_eq(&w->e[0][j].d.parent, &x->d.key))
					child = true;
			CHECK(child);
		}
	}
	for (uint32_t r = 1; r < w->n; r++)
		for (size_t j = 0; j < w->cnt[r]; j++)
			if (action(w, 0, &w->e[r][j].d.key) == -1)
				CHECK(w->act[r][j] == SEL_SHARD_DELETE);
}

/* A chain R (2 pages) -> C (+3) -> G (+1), all linked. */
static sel_record_desc R, C, G, F, X;
static void chain(void)
{
	R = sfx_desc(128, 1, NULL);
	C = sfx_desc(320, 2, &R);
	G = sfx_desc(384, 3, &C);
	/* F names C as its parent but holds its full chain: it stands alone. */
	F = sfx_desc(448, 4, &C);
	F.tail = 448 / 64;
	X = sfx_desc(512, 5, NULL);
}

static void test_cases(void)
{
	chain();
	struct world w;

	/* Every rank holds everything: all kept. */
	memset(&w, 0, sizeof w);
	w.n = 3;
	put_all(&w, &R);
	put_all(&w, &C);
	put_all(&w, &G);
	CHECK_OK(decide(&w));
	CHECK(w.st.kept == 3 && w.st.kept_row == 3 && w.st.deletes == 0 && w.st.truncates == 0);
	check_invariants(&w);

	/* Rank 2 lacks the leaf: it goes from ranks 0 and 1. */
	memset(&w, 0, sizeof w);
	w.n = 3;
	put_all(&w, &R);
	put_all(&w, &C);
	put(&w, 0, &G, true);
	put(&w, 1, &G, true);
	CHECK_OK(decide(&w));
	CHECK(action(&w, 0, &G.key) == SEL_SHARD_DELETE &&
	      action(&w, 1, &G.key) == SEL_SHARD_DELETE);
	CHECK(w.st.kept == 2 && w.st.missing == 1);
	check_invariants(&w);

	/* Rank 1 lacks the middle: C goes, and G, which links under it; F holds
	 * its whole chain and stays; R stays. */
	memset(&w, 0, sizeof w);
	w.n = 3;
	put_all(&w, &R);
	put(&w, 0, &C, true);
	put(&w, 2, &C, true);
	put_all(&w, &G);
	put_all(&w, &F);
	CHECK_OK(decide(&w));
	CHECK(action(&w, 0, &C.key) == SEL_SHARD_DELETE &&
	      action(&w, 2, &C.key) == SEL_SHARD_DELETE);
	for (uint32_t r = 0; r < 3; r++)
		CHECK(action(&w, r, &G.key) == SEL_SHARD_DELETE);
	CHECK(action(&w, 0, &F.key) == SEL_SHARD_KEEP && action(&w, 0, &R.key) == SEL_SHARD_KEEP);
	CHECK(w.st.orphaned == 1 && w.st.missing == 1 && w.st.kept == 2);
	check_invariants(&w);

	/* Rank 2 holds C without its row: C keeps its pages everywhere (G needs
	 * them) and loses its row on ranks 0 and 1. */
	memset(&w, 0, sizeof w);
	w.n = 3;
	put_all(&w, &R);
	put(&w, 0, &C, true);
	put(&w, 1, &C, true);
	put(&w, 2, &C, false);
	put_all(&w, &G);
	CHECK_OK(decide(&w));
	CHECK(action(&w, 0, &C.key) == SEL_SHARD_TRUNCATE_ROW &&
	      action(&w, 1, &C.key) == SEL_SHARD_TRUNCATE_ROW);
	CHECK(action(&w, 2, &C.key) == SEL_SHARD_KEEP);
	CHECK(w.st.rows_dropped == 1 && w.st.kept == 3 && w.st.kept_row == 2 &&
	      w.st.truncates == 2);
	check_invariants(&w);

	/* Rank 2 holds the leaf without its row: a childless page-only record
	 * is pruned, as the scan would. */
	memset(&w, 0, sizeof w);
	w.n = 3;
	put_all(&w, &R);
	put_all(&w, &C);
	put(&w, 0, &G, true);
	put(&w, 1, &G, true);
	put(&w, 2, &G, false);
	CHECK_OK(decide(&w));
	for (uint32_t r = 0; r < 3; r++)
		CHECK(action(&w, r, &G.key) == SEL_SHARD_DELETE);
	CHECK(w.st.pruned == 1 && w.st.kept == 2);
	check_invariants(&w);

	/* Pruning cascades: C page-only everywhere, G loses its row on one
	 * rank: G pruned, then C, which no kept child needs any more. */
	memset(&w, 0, sizeof w);
	w.n = 2;
	put_all(&w, &R);
	put(&w, 0, &C, false);
	put(&w, 1, &C, false);
	put(&w, 0, &G, true);
	put(&w, 1, &G, false);
	CHECK_OK(decide(&w));
	CHECK(action(&w, 0, &C.key) == SEL_SHARD_DELETE &&
	      action(&w, 0, &G.key) == SEL_SHARD_DELETE);
	CHECK(action(&w, 0, &R.key) == SEL_SHARD_KEEP && w.st.pruned == 2);
	check_invariants(&w);

	/* A header that differs (another creation time, another tail): dropped
	 * everywhere with what links under it. */
	const char *what[] = {"creation time", "flags", "bucket", "row offset"};
	for (int k = 0; k < 4; k++) {
		memset(&w, 0, sizeof w);
		w.n = 3;
		put_all(&w, &R);
		put_all(&w, &C);
		put_all(&w, &G);
		struct sel_shard_entry *c1 = &w.e[1][1];
		CHECK(sel_key_eq(&c1->d.key, &C.key));
		if (k == 0)
			c1->created_ns++;
		else if (k == 1)
			c1->d.flags = SEL_RECORD_ROW_REPLICATED;
		else if (k == 2)
			c1->d.bucket.b[3] ^= 1;
		else
			c1->row_off += 4096;
		CHECK_OK(decide(&w));
		CHECKF(w.st.differ == 1 && w.st.orphaned == 1 && w.st.kept == 1, "%s", what[k]);
		for (uint32_t r = 0; r < 3; r++)
			CHECK(action(&w, r, &C.key) == SEL_SHARD_DELETE &&
			      action(&w, r, &G.key) == SEL_SHARD_DELETE);
		check_invariants(&w);
	}

	/* A record only a peer holds is deleted there. */
	memset(&w, 0, sizeof w);
	w.n = 3;
	put_all(&w, &R);
	put(&w, 2, &X, true);
	CHECK_OK(decide(&w));
	CHECK(action(&w, 2, &X.key) == SEL_SHARD_DELETE && w.st.extra == 1 && w.st.kept == 1);
	check_invariants(&w);

	/* Summaries in any order (children before parents). */
	memset(&w, 0, sizeof w);
	w.n = 2;
	put(&w, 0, &G, true);
	put(&w, 0, &C, true);
	put(&w, 0, &R, true);
	put(&w, 1, &R, true);
	put(&w, 1, &G, true);
	CHECK_OK(decide(&w));
	CHECK(action(&w, 0, &G.key) == SEL_SHARD_DELETE &&
	      action(&w, 0, &C.key) == SEL_SHARD_DELETE);
	CHECK(action(&w, 1, &G.key) == SEL_SHARD_DELETE && w.st.orphaned == 1);
	check_invariants(&w);

	/* A summary naming a record twice is no scan's: refused. */
	memset(&w, 0, sizeof w);
	w.n = 2;
	put_all(&w, &R);
	put(&w, 1, &R, true);
	CHECK(decide(&w) == SEL_EFORMAT && strstr(sel_errmsg(), "rank 1's summary names"));
	memset(&w, 0, sizeof w);
	w.n = 2;
	put(&w, 0, &R, true);
	put(&w, 0, &R, true);
	CHECK(decide(&w) == SEL_EFORMAT && strstr(sel_errmsg(), "rank 0's summary"));

	/* Empty summaries; a world of one; bad arguments. */
	memset(&w, 0, sizeof w);
	w.n = 3;
	CHECK_OK(decide(&w));
	CHECK(w.st.kept == 0);
	put(&w, 1, &R, true);
	CHECK_OK(decide(&w));
	CHECK(w.act[1][0] == SEL_SHARD_DELETE);
	memset(&w, 0, sizeof w);
	w.n = 1;
	put(&w, 0, &R, true);
	CHECK_OK(decide(&w));
	CHECK(w.act[0][0] == SEL_SHARD_KEEP);
	const struct sel_shard_entry *ent[1] = {w.e[0]};
	uint8_t *act[1] = {w.act[0]};
	CHECK(sel_shard_agree(0, 64, ent, w.cnt, act, NULL) == -EINVAL);
	CHECK(sel_shard_agree(SEL_SHARD_WORLD_MAX + 1, 64, ent, w.cnt, act, NULL) == -EINVAL);
	printf("cases: ok\n");
}

/* Random summaries over a random forest: the invariants always hold. */
static void test_random(void)
{
	test_rng g;
	test_rng_init(&g, test_seed());
	for (int round = 0; round < 400; round++) {
		struct world w;
		memset(&w, 0, sizeof w);
		w.n = 2 + (uint32_t)test_rng_below(&g, 3);
		sel_record_desc d[N_MAX];
		int n = 1 + (int)test_rng_below(&g, 20);
		for (int i = 0; i < n; i++) {
			int parent = i ? (int)test_rng_below(&g, (uint64_t)i + 1) - 1 : -1;
			uint64_t base = parent >= 0 ? d[parent].key.consumed : 0;
			uint64_t c = base + 64 * (1 + test_rng_below(&g, 3));
			/* Unique consumed counts keep keys apart. */
			c += (uint64_t)i * 64 * 8;
			d[i] = sfx_desc(c, (uint8_t)(i + 1), parent >= 0 ? &d[parent] : NULL);
			if (parent >= 0 && test_rng_below(&g, 4) == 0)
				d[i].tail = (uint32_t)(c / 64); /* holds its full chain */
		}
		for (uint32_t r = 0; r < w.n; r++)
			for (int i = 0; i < n; i++) {
				uint64_t roll = test_rng_below(&g, 10);
				if (roll == 0)
					continue; /* missing */
				put(&w, r, &d[i], roll != 1);
				if (roll == 2)
					w.e[r][w.cnt[r] - 1].created_ns ^= 1; /* differs */
			}
		CHECK_OK(decide(&w));
		check_invariants(&w);
	}
	printf("random: 400 worlds ok\n");
}

/* Real files: three ranks' directories, a restart of rank 2 with another
 * record set, the agreement, the actions, and every directory the same. */
static void test_files(void)
{
	chain();
	struct sfx_rank rk[3];
	sfx_ranks_init(rk, 3, "agree");
	for (uint32_t r = 0; r < 3; r++)
		sfx_dir_open(&rk[r]);
	/* Before the restart every rank wrote R, C, G and F. */
	for (uint32_t r = 0; r < 3; r++) {
		sfx_write(&rk[r], &R, 0, true, 0, 111);
		sfx_write(&rk[r], &C, 2, true, 1, 222);
		sfx_write(&rk[r], &G, 5, true, 2, 333);
		sfx_write(&rk[r], &F, 6, true, 3, 444);
	}
	sfx_check_same(rk, 3, "before the restart");
	/* Rank 2 restarts with another record set: G was lost, C lost its row
	 * (a compaction the others never made), and X is one it kept from
	 * another life.  Rank 1 holds F under another creation time. */
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(&G.key, name);
	CHECK(unlinkat(rk[2].lk.fd, name, 0) == 0);
	sel_record_span sp;
	CHECK_OK(sel_record_span_of(&rk[2].ns.layout.sz, &C, &sp));
	sel_record_name(&C.key, name);
	CHECK_OK(sel_record_truncate(rk[2].lk.fd, name, &sp, NULL, NULL));
	sfx_write(&rk[2], &X, 10, true, 0, 555);
	sfx_write(&rk[1], &F, 6, true, 3, 445);

	sel_scan s[3];
	struct sel_shard_entry *e[3];
	uint8_t *act[3];
	for (uint32_t r = 0; r < 3; r++) {
		sfx_scan(&rk[r], SFX_LIMIT, &s[r], &e[r]);
		act[r] = malloc(s[r].n + 1);
	}
	/* Rank 2's own scan already pruned C: page-only, and F does not link
	 * under it (it holds its full chain). */
	CHECK(s[2].n == 3 && s[2].st.pruned == 1);
	const struct sel_shard_entry *ent[3] = {e[0], e[1], e[2]};
	size_t n[3] = {s[0].n, s[1].n, s[2].n};
	struct sel_shard_agree_stats st;
	CHECK_OK(sel_shard_agree(3, SFX_PAGE_TOKENS, ent, n, act, &st));
	printf("agreement: kept %" PRIu64 " (%" PRIu64 " with rows), missing %" PRIu64
	       ", differ %" PRIu64 ", extra %" PRIu64 ", rows dropped %" PRIu64 ", pruned %" PRIu64
	       "\n",
	       st.kept, st.kept_row, st.missing, st.extra, st.differ, st.rows_dropped, st.pruned);
	for (uint32_t r = 0; r < 3; r++) {
		uint32_t del, tr;
		CHECK_OK(sel_shard_apply(rk[r].lk.fd, &s[r], act[r], &del, &tr));
		printf("rank %u: deleted %u, truncated %u\n", r, del, tr);
	}
	sfx_check_same(rk, 3, "after the agreement");
	/* What is left: R with its row.  C and G are missing on rank 2, F
	 * differs on rank 1, X is rank 2's alone. */
	uint64_t len;
	CHECK(sfx_has(&rk[0], &R.key, &len));
	CHECK(!sfx_has(&rk[0], &C.key, NULL) && !sfx_has(&rk[0], &G.key, NULL));
	CHECK(!sfx_has(&rk[0], &F.key, NULL) && !sfx_has(&rk[2], &X.key, NULL));
	CHECK(st.kept == 1 && st.extra == 1 && st.differ == 1 && st.missing == 2);
	/* The agreed set is a fixed point: every rank's next scan keeps all of
	 * it and the next agreement changes nothing. */
	for (uint32_t r = 0; r < 3; r++) {
		sel_scan_free(&s[r]);
		free(e[r]);
		sfx_scan(&rk[r], SFX_LIMIT, &s[r], &e[r]);
		CHECK(s[r].n == 1 && s[r].st.records == 1);
		ent[r] = e[r];
		n[r] = s[r].n;
	}
	CHECK_OK(sel_shard_agree(3, SFX_PAGE_TOKENS, ent, n, act, &st));
	CHECK(st.deletes == 0 && st.truncates == 0 && st.kept == 1);
	/* A truncation that compacts a shared parent, when every rank has the
	 * child: C page-only on one rank, C and G full elsewhere. */
	for (uint32_t r = 0; r < 3; r++) {
		sfx_write(&rk[r], &C, 2, true, 1, 222);
		sfx_write(&rk[r], &G, 5, true, 2, 333);
	}
	sel_record_name(&C.key, name);
	CHECK_OK(sel_record_truncate(rk[1].lk.fd, name, &sp, NULL, NULL));
	for (uint32_t r = 0; r < 3; r++) {
		sel_scan_free(&s[r]);
		free(e[r]);
		sfx_scan(&rk[r], SFX_LIMIT, &s[r], &e[r]);
		ent[r] = e[r];
		n[r] = s[r].n;
		free(act[r]);
		act[r] = malloc(s[r].n + 1);
	}
	CHECK_OK(sel_shard_agree(3, SFX_PAGE_TOKENS, ent, n, act, &st));
	CHECK(st.kept == 3 && st.truncates == 2 && st.rows_dropped == 1);
	for (uint32_t r = 0; r < 3; r++)
		CHECK_OK(sel_shard_apply(rk[r].lk.fd, &s[r], act[r], NULL, NULL));
	sfx_check_same(rk, 3, "after compaction by agreement");
	uint64_t page_only = sp.row_off;
	CHECK(sfx_has(&rk[0], &C.key, &len) && len == page_only);
	/* An action that cannot be done is reported, naming the file. */
	sel_scan_free(&s[0]);
	free(e[0]);
	sfx_scan(&rk[0], SFX_LIMIT, &s[0], &e[0]);
	CHECK(s[0].n == 3);
	for (size_t i = 0; i < s[0].n; i++)
		act[0][i] = SEL_SHARD_TRUNCATE_ROW;
	sel_record_name(&R.key, name);
	CHECK(unlinkat(rk[0].lk.fd, name, 0) == 0);
	int fd = openat(rk[0].lk.fd, name, O_CREAT | O_WRONLY,
			0644); /* another file under R's name */
	CHECK(fd >= 0 && write(fd, "x", 1) == 1);
	close(fd);
	int rc = sel_shard_apply(rk[0].lk.fd, &s[0], act[0], NULL, NULL);
	CHECKF(rc == SEL_ECORRUPT && strstr(sel_errmsg(), name), "%d %s", rc, sel_errmsg());
	for (uint32_t r = 0; r < 3; r++) {
		sel_scan_free(&s[r]);
		free(e[r]);
		free(act[r]);
		sfx_rank_free(&rk[r]);
	}
	printf("files: ok\n");
}

int main(void)
{
	test_cases();
	test_random();
	test_files();
	printf("ok\n");
	return 0;
}
