/*
 * ranks.h - one core's tensor-parallel ranks as separate processes (design
 * 2.8 "process-peer tensor parallelism", 2.14; docs/multihost.md
 * "Execution"): `flare run CORE --ranks N --rank R --rendezvous HOST:PORT`.
 *
 * Rank 0 listens on the rendezvous address, accepts one connection per
 * peer and checks its JOIN (the world size, its rank, the core's identity);
 * it serves HTTP and schedules.  Its model (hel_model_tp from
 * hel_ranks_tp) mirrors every model call to the peers and combines each
 * step's partial sums with theirs over those connections; each peer runs
 * hel_ranks_peer: it joins, makes its own rank's model when rank 0 says
 * START (and answers with its layout fingerprint, which rank 0 compares
 * with the one it computes for that rank), then runs what rank 0 sends
 * until BYE.  Every rank owns its own page planes and rows.
 *
 * Failures: a connection that closes, resets, sends a frame that does not
 * decode or an ERROR, or does not answer within the step deadline stops
 * the group for good: every later model call fails with SEL_ESTOPPED and
 * the reason (hel_ranks_failure), and rank 0's cfg.dead is called once, so
 * that the instance stops (a peer dying while idle is noticed by a watcher
 * thread).  The links are plaintext and authenticate nothing but the JOIN:
 * run them on a trusted fabric (docs/multihost.md).
 *
 * Threads: the model's calls run on the thread that uses the model (the
 * engine's worker); join and close on the startup/shutdown thread.
 */
#ifndef HEL_RANKS_H
#define HEL_RANKS_H

#include <stdint.h>

#include "core.h"
#include "model.h"
#include "store_disk_sharded.h"

typedef struct hel_ranks hel_ranks;

struct hel_ranks_config {
	const hel_core *core;   /* must outlive the group */
	uint32_t world, rank;   /* world == core->ranks; rank < world */
	const char *rendezvous; /* "HOST:PORT" or "[V6]:PORT"; rank 0 may give port 0 */
	uint64_t join_ns;       /* rank 0's wait for every peer, a peer's for rank 0 (0: 120 s) */
	uint64_t step_ns;       /* one frame's deadline while computing (0: 30 s) */
	/* A peer's record service (design 2.14): its disk store's base
	 * directory (NULL: none), limit (0 with disk_limit_set: none; 0 without:
	 * a tenth of the free space). */
	const char *disk_dir;
	uint64_t disk_limit;
	bool disk_limit_set;
	bool fdatasync;
	/* Tests (FLARE_TEST_RANK_LINK, docs/multihost.md "Fault tests"): rank
	 * 0's link queue bound and job timeout, both sides' socket buffers, and
	 * a peer whose record service blocks in its first STORE (stops reading
	 * its link) for up to two minutes.  0 / false: the defaults. */
	uint32_t test_queue_jobs;
	uint64_t test_job_timeout_ns;
	int test_sock_buf;
	bool test_block_stores;
	uint32_t test_join_delay_ms; /* a peer's record service waits before its link joins */
	/* Rank 0: the disk store's rank links listen on port (called once, on
	 * the thread opening the engine, before the peers join them). */
	void (*links)(void *ctx, uint16_t port);
	/* Rank 0: the group stopped (any thread, once, must not block). */
	void (*dead)(void *ctx, const char *why);
	void *dead_ctx;
};

/* Rank 0: bind the rendezvous address.  0, or an error with a message. */
int hel_ranks_listen(const struct hel_ranks_config *cfg, hel_ranks **out);
/* The bound address ("127.0.0.1:40123"), for the peers. */
const char *hel_ranks_address(const hel_ranks *g);
/* Rank 0: accept every peer and check its JOIN, by the join deadline.
 * Fails with the disagreement named (another world size: -EINVAL; another
 * core: SEL_EIDENTITY) or -ETIMEDOUT naming the missing ranks. */
int hel_ranks_join(hel_ranks *g);
/* Rank 0: what the model takes (hel_model_opts.tp), valid until close. */
const hel_model_tp *hel_ranks_tp(hel_ranks *g);
/* Rank 0: what the disk store takes (sel_store_config.ranks) to run the
 * sharded transport to the peers: the HELLO of each peer goes over its
 * rendezvous connection as a STORE frame.  Valid until close. */
const struct sel_store_ranks *hel_ranks_store(hel_ranks *g);
/* Why the group stopped, or NULL. */
const char *hel_ranks_failure(hel_ranks *g);
/* Rank 0: BYE to every peer (they exit 0); when the group stopped, an
 * ERROR with the reason it stopped, or when why is given (rank 0 could not
 * start), one with why (they exit 1 saying it).  Then close and free.
 * NULL-safe.  Call after the model is destroyed. */
void hel_ranks_close(hel_ranks *g, const char *why);

/* A peer: connect (retrying until the join deadline), JOIN, make the model
 * on START, serve until BYE.  0 after BYE; else an error with a message
 * (rank 0 refused the join, rank 0's connection ended, a frame that does
 * not decode). */
int hel_ranks_peer(const struct hel_ranks_config *cfg);

#endif
