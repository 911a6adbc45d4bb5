/*
 * cudafake.h - a fake CUDA driver for machines without a GPU (design 2.5
 * Bindings: the driver table is the fault-injection point).
 *
 * Device memory is host memory (cuMemAlloc is malloc), and copies really
 * are deferred: cuMemcpyBatchAsync and cuMemcpyAsync queue them on the
 * stream, and they land only at cuEventSynchronize or cuStreamSynchronize,
 * so a backend that forgets to wait reads stale bytes.  Each entry point
 * also checks how it is called (the stream's context current, batch bounds
 * and attributes, registration flags, ...) and counts into `fake`; the
 * first misuse is named in fake.bad_why.  Two devices, NUMA nodes 3 and 4.
 *
 * test_cuda_driver.c tests the driver table, backend and split pools on
 * it; storefx's device mode (sfx_devices) runs the disk, composite and
 * pooled store tests on it (SELENE_TEST_FAKE_CUDA=1,
 * tests/test_store_cuda_fake.sh).
 */
#ifndef CUDAFAKE_H
#define CUDAFAKE_H

#include <stdatomic.h>

#include "cuda.h"

#define FAKE_DEVICES 2

struct cudafake {
	atomic_int retains[FAKE_DEVICES];
	atomic_int batches, bad, inflight_at_entry, stream_syncs, streams, events;
	atomic_int fail_batch; /* -1: none */
	atomic_int registers, unregisters;
	atomic_int max_count;
	atomic_ullong max_bytes;
	atomic_int plain_batch_asked;
	atomic_int hold, blocked; /* event waits stall while hold is set */
	atomic_int unblocked;     /* stalled waits that have run their stream since */
	int streams_at_unmap;     /* streams alive at the first cuMemUnmap, -1 before */
	int stream_fail;          /* cuStreamCreateWithPriority fails */
	int init_rc;
	int numa_vmm;
	const char *missing; /* symbol the resolver hides */
	char bad_why[128];
	/* Virtual memory records (main thread only). */
	void *reserved;
	size_t reserved_size, reserved_align;
	int freed, ncreated, nmapped, nunmapped, nreleased, naccess;
	struct {
		size_t size;
		struct sel_cu_mem_alloc_prop prop;
	} created[4];
	struct {
		uint64_t ptr;
		size_t size;
		sel_cu_mem_handle h;
	} mapped[4];
	struct {
		uint64_t ptr;
		size_t size;
		struct sel_cu_mem_access_desc d[4];
		size_t n;
	} access[4];
};

extern struct cudafake fake;
/* The calling thread's current context (cuCtxSetCurrent). */
extern __thread sel_cu_ctx fake_current;

/* Forget every count and knob (the reserved range is freed). */
void fake_reset(void);
/* The resolver for sel_cuda_load_from. */
void *fake_resolve(void *ctx, const char *sym);
/* A driver table over the fake (sel_cuda_unload frees it). */
struct sel_cuda *fake_load(void);

#endif
