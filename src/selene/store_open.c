/*
 * store_open.c - the one constructor: design 1's configuration table turned
 * into a store (design 1 "Scope and configurations"; 2.4 the three stores;
 * 2.9 loader integration; 2.11 disk limit).
 *
 * DESIGN
 *
 * The engine asks for a store once, with the resolved sizes; this file
 * decides which one exists:
 *
 *     warm memory  disk dir  pool   store
 *     0            none      none   none (disabled: *out = NULL, 0)
 *     > 0          none      none   MemoryStore
 *     0            set       none   DiskStore (intake-only slot pool)
 *     > 0          set       none   CompositeStore
 *     any          any       set    the pooled store (store_pooled.h) over the
 *                                   row's local store, or over none (pool only:
 *                                   the manager's arena supplies intake)
 *
 * With cfg->remote (issue 16) the store of that table, or none, is wrapped
 * in the remote level (store_remote.c): the last level of the cascade;
 * with no local tier every restore comes from Redis.
 *
 * The memory store alone never reads its slots on the CPU, so on the CUDA
 * backend at TP>1 its slot pool is split by rank by default (design 2.5;
 * cfg->split_pool, store_pool.c); stores with a disk tier keep the one
 * registered mapping and refuse split_pool on.  Nothing here decides it:
 * the zero value of the config is the design's default.
 *
 * The disk limit (0 = one tenth of the free space of the directory's
 * filesystem at startup) and the namespace directory belong to the disk
 * store; "limit 0 selects no disk store" is the caller's decision, made by
 * not passing a directory.
 *
 * INVARIANTS
 *   1. On success *out is a store of the table's kind, or NULL exactly when
 *      neither tier is configured; on failure *out is NULL.
 */
#include <errno.h>

#include "eos.h"
#include "selene.h"
#include "store_pooled.h"
#include "store_remote_int.h"

/* The local store of the table, or none. */
static int open_local(const sel_store_config *cfg, sel_store **out)
{
	bool memory = cfg->memory_bytes > 0;
	bool disk = cfg->disk_dir && *cfg->disk_dir;
	if (memory && disk)
		return sel_composite_store_open(cfg, out);
	if (disk)
		return sel_disk_store_open(cfg, out);
	if (memory)
		return sel_memory_store_open(cfg, out);
	return 0;
}

/* The local store (or none), then the pooled store over it when cfg->pool
 * names a manager (design 2.15). */
static int open_pooled(const sel_store_config *cfg, sel_store **out)
{
	if (!cfg->pool || !*cfg->pool)
		return open_local(cfg, out);
	sel_store *inner = NULL;
	int rc = open_local(cfg, &inner);
	if (rc)
		return rc;
	return sel_pooled_store_open(cfg, inner, out);
}

/* DRAM -> NVMe -> pool -> remote: the remote level (issue 16) over what
 * open_pooled gives, when cfg->remote names one: the last level of the
 * cascade. */
int sel_store_open(const sel_store_config *cfg, sel_store **out)
{
	*out = NULL;
	if (!cfg || !cfg->geometry)
		return eos_fail(-EINVAL, "store: no geometry");
	if (!cfg->remote || !*cfg->remote)
		return open_pooled(cfg, out);
	if (cfg->remote_encrypt && !cfg->remote_key)
		return eos_fail(-EINVAL,
				"prefix cache remote '%s': encryption needs a key "
				"(--prefix-cache-remote-key)",
				cfg->remote);
	if (sel_remote_url_check(cfg->remote))
		return eos_fail(SEL_EFORMAT, "%s", sel_errmsg());
	sel_store *inner = NULL;
	int rc = open_pooled(cfg, &inner);
	if (rc)
		return rc;
	return sel_remote_store_open(cfg, inner, out);
}
