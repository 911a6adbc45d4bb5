/*
 * shard_agree.h - the startup agreement of a multi-host core's record
 * directories (design 2.14): which records every rank keeps, with or
 * without their rows, before rank zero builds its index.
 *
 * Internal to libselene.  sel_shard_agree is pure; sel_shard_apply does the
 * file operations one rank's share of the decision asks for.
 *
 * Each rank scans its own directory (sel_record_scan or sel_recover's scan)
 * and summarises what the scan kept (sel_shard_entries_from_scan); the
 * peers send their summaries to rank zero (shard_link.c), which decides:
 *   1. a record is kept only when every rank holds a file of its name whose
 *      header is the same on every rank, but for the layout fingerprint
 *      (which covers each rank) and the row checksum (each rank's row
 *      differs): same key, parent, bucket, tail, flags, parent link check,
 *      format version, header size, creation time and offsets;
 *   2. its row is kept only when every rank's file holds it;
 *   3. a record that links under its parent (its tail is the count since
 *      it, sel_record_links_parent) is dropped when its parent is dropped,
 *      and so on down its descendants;
 *   4. a kept record without its row and without kept children linking
 *      under it is dropped too, cascading upwards -- the scan's own pruning
 *      rule, so a rank's next scan of the agreed set removes nothing more.
 * Every rank then deletes what is dropped and truncates to the row segment
 * what keeps its pages only, so every rank holds the same file names and
 * lengths; a file a peer holds that rank zero does not is deleted.
 */
#ifndef SEL_SHARD_AGREE_H
#define SEL_SHARD_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "record.h"
#include "shard_proto.h"

struct sel_shard_agree_stats {
	uint64_t kept;         /* records every rank keeps */
	uint64_t kept_row;     /* ... with their row */
	uint64_t missing;      /* on rank zero but not on every peer */
	uint64_t extra;        /* peer entries of records rank zero does not hold */
	uint64_t differ;       /* on every rank, with headers that differ */
	uint64_t rows_dropped; /* kept without the row some rank lacks */
	uint64_t orphaned;     /* dropped because their parent was */
	uint64_t pruned;       /* childless page-only records dropped */
	uint64_t deletes;      /* DELETE actions, all ranks */
	uint64_t truncates;    /* TRUNCATE_ROW actions, all ranks */
};

/* Decide.  ent[r][0..n[r]) is rank r's summary (rank zero's own at 0),
 * act[r][0..n[r]) receives an action (enum sel_shard_action) for each of
 * its entries; page_tokens is the layout's.  Returns 0, or SEL_EFORMAT when
 * one rank's summary names a record twice (a summary no scan produces),
 * -EINVAL for bad arguments, -ENOMEM, with a message; act is unspecified
 * then.  st may be NULL. */
int sel_shard_agree(uint32_t world, uint32_t page_tokens, const struct sel_shard_entry *const *ent,
		    const size_t *n, uint8_t *const *act, struct sel_shard_agree_stats *st);

/* Rank r's summary of its scan: out[i] from s->rec[i] (s->n entries). */
void sel_shard_entries_from_scan(const sel_scan *s, struct sel_shard_entry *out);

/* Whether two entries describe the same header in the sense of rule 1. */
bool sel_shard_entry_same(const struct sel_shard_entry *a, const struct sel_shard_entry *b);

/* Apply one rank's actions to its directory dirfd (the caller holds its
 * lock): act[i] for the scan's record s->rec[i], deepest records first.
 * DELETE unlinks the file (a file already gone is fine); TRUNCATE_ROW
 * truncates it to its row segment (sel_record_truncate, which refuses a
 * file that is not the one the scan read).  Every action is tried; returns
 * 0 or the first failure (a negative errno or SEL_ECORRUPT) with a message
 * naming the file.  *deleted and *truncated (may be NULL) count what was
 * done.  The scan then no longer describes the directory: scan again. */
int sel_shard_apply(int dirfd, const sel_scan *s, const uint8_t *act, uint32_t *deleted,
		    uint32_t *truncated);

#endif
