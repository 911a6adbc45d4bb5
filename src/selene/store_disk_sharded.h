/*
 * store_disk_sharded.h - the Sharded transport of the disk store (design
 * 2.14 "shard::Sharded"; docs/multihost.md "For part B" items 1, 3, 4):
 * rank zero of a core whose ranks run as separate processes.
 *
 * Rank zero's disk store indexes, sizes, evicts and plans every record as
 * on one host; every store, fetch, truncate and unlink runs on its own
 * Staged transport and is sent, with the same record, page ids and state
 * slot, to every peer over the rank links (shard_link.h).  A job is
 * reported only when rank zero's Staged part and every peer finished it.
 * The peers run the jobs with their record service (shard_service.h).
 *
 * The engine gives the disk store a struct sel_store_ranks through
 * sel_store_config.ranks; the store then, at open and before it builds its
 * index: names its namespace by rank zero's per-rank layout fingerprint,
 * opens the link listener, sends each peer its HELLO over that peer's
 * rendezvous connection (the callbacks below), joins every peer (the disk
 * limit becomes the smallest rank's), scans, runs the agreement of the
 * record directories, applies rank zero's share, and starts the links.
 */
#ifndef SEL_STORE_DISK_SHARDED_H
#define SEL_STORE_DISK_SHARDED_H

#include <stddef.h>
#include <stdint.h>

#include "selene.h"

struct sel_store_ranks {
	uint32_t world; /* ranks, rank zero included: 2..64 */
	void *ctx;
	/* The connected rendezvous socket of peer `rank` (its remote address is
	 * the only one that rank's link is accepted from). */
	int (*rendezvous_fd)(void *ctx, uint32_t rank);
	/* Send the HELLO frame buf[0..len) to peer `rank` over its rendezvous
	 * connection: 0 or an error with a message. */
	int (*send_hello)(void *ctx, uint32_t rank, const void *buf, size_t len);
	/* Model calls mirrored to the peers so far (the worker's thread): a
	 * STORE or FETCH carries it so that a peer copies its GPU ids only
	 * after its model ran those calls.  NULL: 0. */
	uint64_t (*calls)(void *ctx);
	uint64_t join_ns; /* the join's and agreement's deadline; 0 = 120 s */
	/* Tests (0: the defaults of shard_link.h). */
	uint64_t job_timeout_ns;
	uint32_t queue_jobs;
	uint64_t queue_bytes;
	int sock_buf;
};

/* Without a disk store on rank zero: the join still runs (every rank has a
 * disk store or none; a peer with one fails the startup of both), then the
 * links close.  0 or the join's error with a message. */
int sel_store_ranks_join_none(const struct sel_store_ranks *r, const sel_geometry *g,
			      const uint8_t identity[SEL_IDENTITY_BYTES]);

#endif
