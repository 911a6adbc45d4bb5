/*
 * input_disk.h - .input record files in a record directory (design 2.13:
 * "Versioned .input files ... Writes replace records atomically ...
 * Failed or invalid records are cache misses"; "The disk input index has
 * a fixed 4,096-record bound and a 1 MiB host allowance").
 *
 * The module owns the .input files of one directory, given as a directory
 * descriptor the caller keeps open and locked (the model's locked record
 * directory, design 2.11; part B passes the disk store's lock fd).  It
 * never touches another name: .ckpt records, their temporaries and foreign
 * files are left alone, so evicting an input never touches a checkpoint.
 * Its disk usage is charged through a budget the caller supplies (part B:
 * the disk limit shared with checkpoints) or, without one, against a limit
 * of its own.
 *
 * Files: "src-<key>.input" and "prep-<key>.input" (input_record.h), each
 * written whole as ".tmp-<name>-<16 hex>" and renamed into place; opened
 * relative to the directory with O_NOFOLLOW and O_NONBLOCK and used only
 * when fstat says a regular file.  Every read decodes and verifies the
 * whole record against the wanted kind and key; a file that fails is
 * removed and reported as a miss.
 *
 * Threads: one thread (the preparation worker) calls everything but
 * sel_input_disk_stats, which any thread may call.  Calls do file I/O:
 * never from the model worker.
 */
#ifndef SEL_INPUT_DISK_H
#define SEL_INPUT_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include "input_record.h"

#define SEL_INPUT_DISK_RECORDS 4096u        /* design 2.13: the index bound */
#define SEL_INPUT_DISK_ALLOWANCE (1u << 20) /* host bytes the index may use */

typedef struct sel_input_disk sel_input_disk;

/* The disk limit the files share (part B: with checkpoints). */
struct sel_input_disk_budget {
	/* Charge bytes for a file about to be written: 0, or -ENOSPC when the
	 * limit cannot take them now (the write is skipped after the module
	 * has reclaimed what it can of its own files). */
	int (*reserve)(void *ctx, uint64_t bytes);
	/* Give back bytes charged before (a removed file, a failed write). */
	void (*release)(void *ctx, uint64_t bytes);
	void *ctx;
};

struct sel_input_disk_opts {
	const struct sel_input_disk_budget *budget; /* NULL: limit_bytes below */
	uint64_t limit_bytes; /* without a budget: bytes of .input files at most; 0 none */
	uint32_t max_records; /* 0: SEL_INPUT_DISK_RECORDS; at most that */
	bool datasync;        /* fdatasync each file before its rename */
	bool dir_fsync;       /* fsync the directory after each rename */
};

/* Open over dirfd (not owned; it must stay open until close): scan it,
 * remove the temporaries of interrupted .input writes and .input names
 * that are not regular files or cannot be records (wrong size), charge
 * the rest through the budget, and index the newest max_records of them
 * (older ones, and any the budget refuses, are removed, oldest first).
 * Fails -- nothing charged -- when the directory cannot be read or a file
 * that must go cannot be removed: its disk usage would be unknown. */
int sel_input_disk_open(int dirfd, const struct sel_input_disk_opts *o, sel_input_disk **out);
/* NULL-safe.  Releases every charge (the files stay). */
void sel_input_disk_close(sel_input_disk *d);

/* Whether (kind, key) is indexed (no I/O). */
bool sel_input_disk_contains(sel_input_disk *d, uint32_t kind, const sel_input_key *key);

/* Read record (kind, key) whole: 0 with a verified record in *out (the
 * caller frees it), -ENOENT when none is indexed, or the reason it is a
 * miss -- SEL_EFORMAT, SEL_ECORRUPT, SEL_EIDENTITY, -ELOOP (a symbolic
 * link), -EINVAL (not a regular file), -EIO, ... -- after removing the
 * file.  A hit refreshes the file's recency (its mtime, which the next
 * open's scan orders by). */
int sel_input_disk_read(sel_input_disk *d, uint32_t kind, const sel_input_key *key,
			sel_input_rec *out);
/* The header alone (a description lookup or a window plan): like
 * sel_input_disk_read but reads and checks header bytes only. */
int sel_input_disk_read_header(sel_input_disk *d, uint32_t kind, const sel_input_key *key,
			       sel_input_header *out);

/* Write rec (sealed) unless its (kind, key) is already indexed (records are
 * immutable: 0).  At the record bound the least recently used record goes
 * first; a budget refusal reclaims least recently used records and tries
 * once more.  0, -ENOSPC (skipped), -EROFS (writes stopped: an earlier
 * failure left a temporary that could not be removed; its bytes stay
 * charged until restart), or the failing errno (the temporary removed). */
int sel_input_disk_write(sel_input_disk *d, const sel_input_rec *rec);

/* Remove least recently used records until at least bytes are freed (the
 * shared limit's pressure, part B).  Returns the bytes freed. */
uint64_t sel_input_disk_reclaim(sel_input_disk *d, uint64_t bytes);
/* Remove one record: 0, -ENOENT when not indexed, or the unlink's errno. */
int sel_input_disk_remove(sel_input_disk *d, uint32_t kind, const sel_input_key *key);

struct sel_input_disk_stats {
	uint64_t records, bytes;      /* indexed, charged */
	uint64_t reads, hits, misses; /* misses: not indexed */
	uint64_t invalid;             /* failed reads: removed, a miss */
	uint64_t writes, write_skipped, write_failed;
	uint64_t evictions;    /* removed for the bound, the budget or reclaim */
	uint64_t scan_removed; /* at open: temporaries, non-files, excess */
	bool writes_stopped;
};
void sel_input_disk_stats(sel_input_disk *d, struct sel_input_disk_stats *out);

/* Checker (STYLE 9): the index, its LRU order and the charges agree.  0 or
 * SEL_ECORRUPT. */
int sel_input_disk_check(sel_input_disk *d);

#endif
