/*
 * faultfs.h - file operations that fail on demand, for the disk thread and
 * disk store tests (through eos_fileops_set).
 *
 * Each operation can be armed with an errno, optionally after letting a
 * number of matching calls through.  open and unlink fail only for record
 * files (".ckpt" in the path); with spare_tmp_unlink, unlinks of temporaries
 * are never failed.  Calls are counted, preads past the first 4 KiB
 * (payload, not header) too, and every pwrite can be slowed by slow_ms,
 * every unlink by slow_unlink_ms.
 * Everything is atomic: the disk thread calls these.
 */
#ifndef FAULTFS_H
#define FAULTFS_H

#include <stdbool.h>

#include "eos.h"

enum faultfs_op {
	F_NONE = 0,
	F_OPEN,
	F_FALLOCATE,
	F_PWRITE,
	F_PREAD,
	F_FDATASYNC,
	F_FSYNC,
	F_RENAME,
	F_UNLINK,
	F_NOPS
};
extern const char *const faultfs_op_name[F_NOPS];

struct faultfs {
	int armed[F_NOPS];     /* errno to inject, 0 = pass */
	int skip[F_NOPS];      /* matching calls to let through first */
	int calls[F_NOPS];     /* calls seen */
	int payload_preads;    /* preads at offsets past the first 4 KiB */
	int slow_ms;           /* sleep in every pwrite */
	int slow_unlink_ms;    /* sleep in every unlink (widens the window of a late removal) */
	bool spare_tmp_unlink; /* never fail the unlink of a temporary */
};
extern struct faultfs faultfs;

/* The table to install with eos_fileops_set: libc's, each call through the
 * injection above. */
const struct eos_fileops *faultfs_ops(void);
/* Clear every arming, count and option. */
void faultfs_reset(void);
/* Fail op with errno e after skip matching calls. */
void faultfs_arm(enum faultfs_op op, int e, int skip);

#endif
