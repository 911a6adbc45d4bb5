/*
 * shard_agree.c - the agreement of a multi-host core's record directories
 * at startup (design 2.14, "Peers then send rank zero a summary of the
 * records their scan kept ..."; shard_agree.h states the rules).
 *
 * DESIGN
 * Rank zero's summary is the reference: a record must be on rank zero to
 * be kept at all, so its entries are indexed by key in an open-addressing
 * table and every peer entry is looked up there once to count, per record,
 * the ranks holding a file with the same header and whether all of them
 * hold the row.  The tree rules then run on rank zero's records in
 * ascending consumed order, which puts every parent before its children
 * (a parent consumes fewer tokens), and the pruning runs as the scan's
 * does: childless page-only records from a queue, cascading up.  A second
 * lookup per peer entry turns the verdicts into that rank's actions.
 * O(total entries) time and memory, nothing of the peers' trusted beyond
 * the structure the frame decoder checked: a summary naming a record twice
 * is refused.
 *
 * sel_shard_apply is the only I/O here: the record file protocol's unlink
 * and truncate (record_io.c), deepest record first, so a crash part-way
 * leaves no child whose parent is gone that the next scan would keep.
 *
 * INVARIANTS
 *   1. A kept record is on every rank with the same header; a kept row is
 *      on every rank.
 *   2. A kept record that links under its parent has its parent kept.
 *   3. A kept record without its row has a kept child linking under it.
 *   4. Every rank's actions leave it exactly the kept set, rows included.
 */
#include "shard_agree.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"

struct rec {
	uint32_t present;  /* ranks with the same header */
	int64_t parent;    /* index of the parent it links under, -1 */
	uint32_t children; /* kept children linking under it */
	uint32_t seen;     /* last rank that named it + 1 (duplicates) */
	bool differs, all_row, kept, row;
};

struct table {
	int64_t *slot; /* index into rank zero's entries, -1 empty */
	size_t mask;
	const struct sel_shard_entry *e;
};

static uint64_t key_hash(const sel_key *k)
{
	uint64_t h;
	memcpy(&h, k->digest.b, sizeof h);
	return h ^ (k->consumed * 0x9e3779b97f4a7c15ull);
}

static int64_t table_find(const struct table *t, const sel_key *k)
{
	for (size_t i = key_hash(k) & t->mask;; i = (i + 1) & t->mask) {
		int64_t x = t->slot[i];
		if (x < 0 || sel_key_eq(&t->e[x].d.key, k))
			return x;
	}
}

bool sel_shard_entry_same(const struct sel_shard_entry *a, const struct sel_shard_entry *b)
{
	const sel_record_desc *x = &a->d, *y = &b->d;
	return sel_key_eq(&x->key, &y->key) && sel_key_eq(&x->parent, &y->parent) &&
	       !memcmp(x->bucket.b, y->bucket.b, SEL_DIGEST_BYTES) && x->tail == y->tail &&
	       x->flags == y->flags && x->parent_check == y->parent_check &&
	       a->version == b->version && a->header_bytes == b->header_bytes &&
	       a->created_ns == b->created_ns && a->page_off == b->page_off &&
	       a->row_off == b->row_off && a->row_end == b->row_end;
}

static int by_consumed(const void *pa, const void *pb, void *ctx)
{
	const struct sel_shard_entry *e = ctx;
	uint64_t a = e[*(const int64_t *)pa].d.key.consumed,
		 b = e[*(const int64_t *)pb].d.key.consumed;
	return a < b ? -1 : a > b;
}

/* What each peer holds of rank zero's records (an entry rank zero lacks
 * counts as extra). */
static int tally_peers(uint32_t world, const struct sel_shard_entry *const *ent, const size_t *n,
		       const struct table *tp, struct rec *r, struct sel_shard_agree_stats *st)
{
	const struct sel_shard_entry *e0 = ent[0];
	for (uint32_t k = 1; k < world; k++)
		for (size_t j = 0; j < n[k]; j++) {
			const struct sel_shard_entry *x = &ent[k][j];
			int64_t i = table_find(tp, &x->d.key);
			if (i < 0) {
				st->extra++;
				continue;
			}
			if (r[i].seen == k + 1) {
				int rc = eos_fail(SEL_EFORMAT,
						  "agreement: rank %" PRIu32 "'s summary names the "
						  "record of %" PRIu64 " tokens twice",
						  k, x->d.key.consumed);
				return rc;
			}
			r[i].seen = k + 1;
			if (!sel_shard_entry_same(&e0[i], x)) {
				r[i].differs = true;
				continue;
			}
			r[i].present++;
			r[i].all_row = r[i].all_row && x->has_row;
		}
	return 0;
}

/* Rules 1 to 3, parents before children. */
static void apply_rules(uint32_t world, uint32_t page_tokens, const struct sel_shard_entry *e0,
			size_t n0, const struct table *tp, struct rec *r, int64_t *order,
			struct sel_shard_agree_stats *st)
{
	qsort_r(order, n0, sizeof *order, by_consumed, (void *)e0);
	for (size_t o = 0; o < n0; o++) {
		int64_t i = order[o];
		struct rec *x = &r[i];
		if (x->differs) {
			st->differ++;
			continue;
		}
		if (x->present < world) {
			st->missing++;
			continue;
		}
		x->kept = true;
		if (sel_record_links_parent(&e0[i].d, page_tokens)) {
			int64_t p = table_find(tp, &e0[i].d.parent);
			if (p < 0 || !r[p].kept) {
				x->kept = false;
				st->orphaned++;
				continue;
			}
			x->parent = p;
		}
		x->row = x->all_row;
		if (e0[i].has_row && !x->row)
			st->rows_dropped++;
	}
}

/* Rule 4: childless page-only records, cascading up. */
static void prune(size_t n0, struct rec *r, int64_t *queue, struct sel_shard_agree_stats *st)
{
	for (size_t i = 0; i < n0; i++)
		if (r[i].kept && r[i].parent >= 0)
			r[r[i].parent].children++;
	size_t qn = 0;
	for (size_t i = 0; i < n0; i++)
		if (r[i].kept && !r[i].row && r[i].children == 0)
			queue[qn++] = (int64_t)i;
	while (qn) {
		struct rec *x = &r[queue[--qn]];
		x->kept = false;
		st->pruned++;
		if (x->parent >= 0) {
			struct rec *p = &r[x->parent];
			if (--p->children == 0 && !p->row && p->kept)
				queue[qn++] = x->parent;
		}
	}
}

int sel_shard_agree(uint32_t world, uint32_t page_tokens, const struct sel_shard_entry *const *ent,
		    const size_t *n, uint8_t *const *act, struct sel_shard_agree_stats *st)
{
	struct sel_shard_agree_stats dummy;
	if (!st)
		st = &dummy;
	memset(st, 0, sizeof *st);
	if (world < 1 || world > SEL_SHARD_WORLD_MAX || page_tokens == 0)
		return eos_fail(-EINVAL, "agreement: world %" PRIu32 ", page tokens %" PRIu32,
				world, page_tokens);
	size_t n0 = n[0];
	const struct sel_shard_entry *e0 = ent[0];
	struct table t = {0};
	size_t cap = 16;
	while (cap < 2 * n0)
		cap *= 2;
	t.slot = malloc(cap * sizeof *t.slot);
	struct rec *r = calloc(n0 ? n0 : 1, sizeof *r);
	int64_t *order = malloc((n0 ? n0 : 1) * sizeof *order);
	int64_t *queue = malloc((n0 ? n0 : 1) * sizeof *queue);
	int rc = 0;
	if (!t.slot || !r || !order || !queue) {
		rc = eos_fail(-ENOMEM, "agreement: out of memory for %zu records", n0);
		goto out;
	}
	memset(t.slot, 0xff, cap * sizeof *t.slot);
	t.mask = cap - 1;
	t.e = e0;

	/* Rank zero's records. */
	for (size_t i = 0; i < n0; i++) {
		size_t s = key_hash(&e0[i].d.key) & t.mask;
		while (t.slot[s] >= 0) {
			if (sel_key_eq(&e0[t.slot[s]].d.key, &e0[i].d.key)) {
				rc = eos_fail(
					SEL_EFORMAT,
					"agreement: rank 0's summary names the record of %" PRIu64
					" tokens twice",
					e0[i].d.key.consumed);
				goto out;
			}
			s = (s + 1) & t.mask;
		}
		t.slot[s] = (int64_t)i;
		r[i] = (struct rec){
			.present = 1, .parent = -1, .seen = 1, .all_row = e0[i].has_row};
		order[i] = (int64_t)i;
	}
	if ((rc = tally_peers(world, ent, n, &t, r, st)))
		goto out;
	apply_rules(world, page_tokens, e0, n0, &t, r, order, st);
	prune(n0, r, queue, st);
	/* Actions. */
	for (size_t i = 0; i < n0; i++) {
		if (r[i].kept) {
			st->kept++;
			st->kept_row += r[i].row;
		}
	}
	for (uint32_t k = 0; k < world; k++)
		for (size_t j = 0; j < n[k]; j++) {
			const struct sel_shard_entry *x = &ent[k][j];
			int64_t i = k == 0 ? (int64_t)j : table_find(&t, &x->d.key);
			uint8_t a = SEL_SHARD_KEEP;
			if (i < 0 || !r[i].kept)
				a = SEL_SHARD_DELETE;
			else if (x->has_row && !r[i].row)
				a = SEL_SHARD_TRUNCATE_ROW;
			st->deletes += a == SEL_SHARD_DELETE;
			st->truncates += a == SEL_SHARD_TRUNCATE_ROW;
			act[k][j] = a;
		}
out:
	free(t.slot);
	free(r);
	free(order);
	free(queue);
	return rc;
}

void sel_shard_entries_from_scan(const sel_scan *s, struct sel_shard_entry *out)
{
	for (size_t i = 0; i < s->n; i++) {
		const sel_scan_record *x = &s->rec[i];
		out[i] = (struct sel_shard_entry){
			.d = x->d,
			.version = x->version,
			.header_bytes = x->span.header_bytes,
			.created_ns = x->created_ns,
			.page_off = x->span.page_off,
			.row_off = x->span.row_off,
			.row_end = x->span.row_end,
			.has_row = x->has_row,
		};
	}
}

static int deepest_first(const void *pa, const void *pb, void *ctx)
{
	const sel_scan_record *rec = ctx;
	uint64_t a = rec[*(const size_t *)pa].d.key.consumed,
		 b = rec[*(const size_t *)pb].d.key.consumed;
	return a > b ? -1 : a < b;
}

int sel_shard_apply(int dirfd, const sel_scan *s, const uint8_t *act, uint32_t *deleted,
		    uint32_t *truncated)
{
	uint32_t del = 0, tr = 0;
	size_t *order = malloc((s->n ? s->n : 1) * sizeof *order);
	if (!order)
		return eos_fail(-ENOMEM, "agreement: out of memory for %zu records", s->n);
	for (size_t i = 0; i < s->n; i++)
		order[i] = i;
	qsort_r(order, s->n, sizeof *order, deepest_first, s->rec);
	int first = 0;
	char why[EOS_ERRMSG_MAX] = "";
	for (size_t o = 0; o < s->n; o++) {
		size_t i = order[o];
		const sel_scan_record *x = &s->rec[i];
		if (act[i] == SEL_SHARD_KEEP)
			continue;
		char name[SEL_RECORD_NAME_MAX];
		sel_record_name(&x->d.key, name);
		int rc;
		if (act[i] == SEL_SHARD_DELETE) {
			bool existed;
			rc = sel_record_unlink(dirfd, name, &existed);
			del += rc == 0;
		} else if (act[i] == SEL_SHARD_TRUNCATE_ROW) {
			bool had_row;
			rc = sel_record_truncate(dirfd, name, &x->span, &x->id, &had_row);
			tr += rc == 0;
		} else {
			rc = eos_fail(-EINVAL, "action %u", act[i]);
		}
		if (rc && !first) {
			first = rc;
			snprintf(why, sizeof why, "agreement: %s %s: %s",
				 act[i] == SEL_SHARD_DELETE ? "deleting" : "truncating", name,
				 eos_errmsg());
		}
	}
	free(order);
	if (deleted)
		*deleted = del;
	if (truncated)
		*truncated = tr;
	return first ? eos_fail(first, "%s", why) : 0;
}
