/*
 * copy_host.c - the host copy backend: planes in ordinary host memory,
 * copies are memcpy on the rank's transfer thread (ARCHITECTURE "Two kinds
 * of device memory"; design 2.5).
 *
 * DESIGN
 *   The reference engine computes on the CPU and every CPU test runs the
 *   store through this backend, so it is the path the transfer code is
 *   proven on.  Nothing needs registering and nothing is in flight after a
 *   call returns, so a call never fails.  Stateless: one const instance
 *   serves every transfer set and rank.  No bounds: a window is one call.
 */
#include <string.h>

#include "transfer.h"

static int host_open_rank(void *ctx, uint32_t rank, void **rank_state)
{
	(void)ctx;
	(void)rank;
	*rank_state = NULL;
	return 0;
}

static int host_copy(void *rank_state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	(void)rank_state;
	(void)dir;
	for (uint32_t i = 0; i < n; i++)
		memcpy((void *)(uintptr_t)c[i].dst, (const void *)(uintptr_t)c[i].src, (size_t)c[i].len);
	return 0;
}

static void host_close_rank(void *rank_state)
{
	(void)rank_state;
}

static int host_register(void *ctx, void *addr, uint64_t len)
{
	(void)ctx;
	(void)addr;
	(void)len;
	return 0;
}

static void host_unregister(void *ctx, void *addr, uint64_t len)
{
	(void)ctx;
	(void)addr;
	(void)len;
}

const struct sel_copy_backend sel_copy_backend_host = {
	.name = "host",
	.ctx = NULL,
	.open_rank = host_open_rank,
	.copy = host_copy,
	.close_rank = host_close_rank,
	.host_register = host_register,
	.host_unregister = host_unregister,
	.max_call_bytes = 0,
	.max_call_entries = 0,
};
