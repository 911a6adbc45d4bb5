/*
 * shard_service.h - a peer's record service (design 2.14; docs/multihost.md
 * "For part B" item 2): the jobs rank zero's sharded transport sends, run
 * on this rank's own Staged transport -- intake slots, its transfer
 * threads, its disk thread -- over its own record directory and its own
 * model's page planes and rows.
 *
 * Internal to libselene.  A peer process (src/helios/ranks.c) starts the
 * service when rank zero's HELLO arrives over the rendezvous connection;
 * the service's thread opens the record directory (the per-rank namespace:
 * its layout fingerprint is sel_shard_rank_fingerprint of this rank), the
 * intake pool, the transfer set and the disk thread, joins rank zero's
 * link set, scans with the agreed disk limit, sends its summary, applies
 * the agreement and serves jobs until rank zero closes the store (or the
 * link ends).  With no disk directory it joins (so that a disk store on one
 * rank only fails the startup of both) and ends.
 */
#ifndef SEL_SHARD_SERVICE_H
#define SEL_SHARD_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "selene.h"

typedef struct sel_shard_service sel_shard_service;

struct sel_shard_service_config {
	uint32_t world, rank;
	const sel_geometry *geometry; /* this rank's one-rank geometry; outlives the service */
	uint8_t identity[SEL_IDENTITY_BYTES]; /* the offload identity */
	const char *disk_dir;                 /* the base directory, or NULL: no disk store */
	uint64_t disk_limit;                  /* this rank's limit; 0 = a tenth of the free space */
	bool fdatasync;
	int rendezvous_fd;   /* the connection the HELLO came over */
	uint32_t max_active; /* intake sizing (0: 4) */
	uint64_t join_ns;    /* the join's and agreement's deadline (0: 120 s) */
	int sock_buf;        /* tests: the link's socket buffers (0: the system's) */
	/* Tests: the first STORE blocks the serving thread (which then stops
	 * reading its link) for up to two minutes, as a peer that stalls. */
	bool test_block_stores;
	uint32_t test_join_delay_ms; /* tests: wait this long before joining */
	/* Wait until this rank's model executed n of the calls rank zero
	 * mirrored (a STORE's or FETCH's `after`): 0, or a failure.  NULL:
	 * no wait (every call is synchronous). */
	int (*wait_calls)(void *ctx, uint64_t n, uint64_t deadline_ns);
	void *calls_ctx;
};

/* Start the service's thread for hello[0..len) (the HELLO frame).  0 with
 * *out, or an error with a message (nothing started). */
int sel_shard_service_start(const struct sel_shard_service_config *cfg, const void *hello,
			    size_t len, sel_shard_service **out);
/* Whether the service's thread ended (never blocks). */
bool sel_shard_service_done(sel_shard_service *sv);
/* Wait for the thread to end: its status (0 after rank zero closed the
 * store and every job drained), the reason in why. */
int sel_shard_service_wait(sel_shard_service *sv, char *why, size_t cap);
/* Free after wait.  When the transport could not drain (SEL_ESTOPPED) the
 * pool, transfer set and disk thread are kept (leaked), never reused. */
void sel_shard_service_free(sel_shard_service *sv);

#endif
