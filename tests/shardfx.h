/*
 * shardfx.h - fixtures of the rank link tests (tests/test_shard_*.c):
 * ranks as processes with their own record directories and their own fake
 * GPU memory, a rendezvous over TCP, a peer's whole life (join, scan,
 * agreement, serve), and a job table that really writes, reads, truncates
 * and unlinks record files (design 2.14).
 *
 * A rank's "GPU" is a MAP_SHARED mapping made before the fork: SFX_PAGES
 * page records and SFX_SLOTS rows, each filled with a pattern of its rank,
 * so the test process can check every rank's bytes after a fetch.  Knobs in
 * shared memory make a rank's jobs fail, block or hold.  Each rank's record
 * file holds that rank's planes only (a one-rank layout) and its layout
 * fingerprint covers the rank and the world size (sfx_fingerprint), as
 * design 2.14 asks.
 */
#ifndef SHARDFX_H
#define SHARDFX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "record.h"
#include "shard_agree.h"
#include "shard_link.h"
#include "shard_proto.h"
#include "testutil.h"

#define SFX_PAGES 64u
#define SFX_SLOTS 4u
#define SFX_PAGE_TOKENS 64u
#define SFX_LIMIT (1ull << 30) /* a rank's default disk limit */
#define SFX_S 1000000000ull

struct sfx_knobs {
	atomic_int store_errno;  /* STOREs fail with -this (0: no) */
	atomic_int unlink_errno; /* UNLINKs fail with -this */
	atomic_int block_store;  /* a STORE creates its temporary, sets in_write, and blocks */
	atomic_int hold_store;   /* STOREs are accepted and not completed (until drain) */
	atomic_int in_write;
	atomic_int jobs;   /* jobs the rank's ops accepted */
	atomic_int served; /* the rank is serving */
};

struct sfx_rank {
	uint32_t world, rank;
	char base[512]; /* its disk directory */
	char dir[1024]; /* base/<namespace> */
	sel_record_ns ns;
	struct eos_dirlock lk;
	uint8_t *gpu;            /* MAP_SHARED: pages, then rows */
	uint64_t stride;         /* a page record */
	uint64_t row_area;       /* a slot's row slots */
	struct sfx_knobs *knobs; /* MAP_SHARED */
	uint64_t held[256];      /* ops: held STOREs */
	int n_held;
};

/* Rank `rank` of `world` with its directory under base (created). */
void sfx_rank_init(struct sfx_rank *r, uint32_t world, uint32_t rank, const char *base);
void sfx_rank_free(struct sfx_rank *r);
/* Ranks 0..world-1 with directories $TEST_TMPDIR/<tag>-rank<r>. */
void sfx_ranks_init(struct sfx_rank *rk, uint32_t world, const char *tag);
/* The offload identity every rank shares (variant != 0: another one). */
void sfx_identity(uint8_t out[SEL_IDENTITY_BYTES], int variant);
/* Rank rank's layout fingerprint in a world of world ranks. */
void sfx_fingerprint(uint32_t world, uint32_t rank, uint8_t out[SEL_FINGERPRINT_BYTES]);

/* Lock (and create) the namespace directory; release it. */
void sfx_dir_open(struct sfx_rank *r);
void sfx_dir_close(struct sfx_rank *r);

uint8_t *sfx_page(struct sfx_rank *r, uint32_t id);
uint8_t *sfx_row(struct sfx_rank *r, uint32_t slot);
/* Fill page id / slot with the rank's pattern for seed. */
void sfx_fill_page(struct sfx_rank *r, uint32_t id, uint64_t seed);
void sfx_fill_row(struct sfx_rank *r, uint32_t slot, uint64_t seed);

/* Run any job against r's directory (open) and GPU, synchronously, as a
 * peer's transport would (knobs apply): res filled. */
void sfx_run_job(struct sfx_rank *r, const struct sel_shard_job *j, struct sel_shard_result *res);
/* The ops table over sfx_run_job (ctx: the sfx_rank). */
extern const struct sel_shard_ops sfx_ops;

/* A desc at c tokens (digest from seed) under parent (NULL: a root). */
sel_record_desc sfx_desc(uint64_t c, uint8_t seed, const sel_record_desc *parent);
/* Write record d from page ids [first_id, first_id + tail) and slot (row)
 * into r's directory, created at created_ns. */
void sfx_write(struct sfx_rank *r, const sel_record_desc *d, uint32_t first_id, bool row,
	       uint32_t slot, uint64_t created_ns);

/* The namespace directory's files: names and lengths, sorted. */
struct sfx_listing {
	int n;
	char name[128][96];
	uint64_t len[128];
};
void sfx_list(const struct sfx_rank *r, struct sfx_listing *out);
/* Every rank's directory holds the same file names and lengths; prints
 * them under what. */
void sfx_check_same(struct sfx_rank *ranks, uint32_t world, const char *what);
/* Whether r's directory holds a record of key k, and its length. */
bool sfx_has(const struct sfx_rank *r, const sel_key *k, uint64_t *len);

/* Rank r's page ids from dst hold, in order, its pages src[k] ..
 * src[k] + tails[k] - 1 for k < n, and slot row_dst its row of slot
 * row_src: what a fetch of a chain stored from those ids restores. */
void sfx_check_restored(struct sfx_rank *r, uint32_t dst, const uint32_t *src,
			const uint32_t *tails, int n, uint32_t row_dst, uint32_t row_src);

/* Scan r's directory (limit as max_file_bytes) into s and its summary. */
void sfx_scan(struct sfx_rank *r, uint64_t limit, sel_scan *s, struct sel_shard_entry **e);

/* ---- processes -------------------------------------------------------------- */

/* The rendezvous: rank zero listens; each peer connects and sends its rank. */
struct sfx_rdv {
	int lfd;
	uint16_t port;
	int fd[SEL_SHARD_WORLD_MAX];
};
void sfx_rdv_listen(struct sfx_rdv *v, const char *addr);
void sfx_rdv_accept(struct sfx_rdv *v, uint32_t world, uint64_t deadline_ns);
void sfx_rdv_close(struct sfx_rdv *v);
/* Connect to addr:port from src (NULL: any) and send rank: the fd. */
int sfx_rdv_connect(const char *addr, uint16_t port, const char *src, uint32_t rank,
		    uint64_t deadline_ns);

/* How a peer deviates from its rank. */
struct sfx_peer_opts {
	const char *rdv_addr;
	uint16_t rdv_port;
	uint32_t world; /* 0: the rank's */
	bool bad_fingerprint, bad_identity, no_disk;
	uint64_t disk_limit; /* 0: SFX_LIMIT */
	int sock_buf;
	int expect_join; /* the join's expected status (0: success) */
	int wait_fd;     /* >= 0: read a byte from it once the HELLO is in, before joining */
	int signal_fd;   /* >= 0: write a byte to it once the join returned */
};
/* A peer's whole life; its exit code: 0 (served and drained), 10 (the join
 * failed as expected), 3 (SEL_ESTOPPED), 4 (the link ended), 1 (broke). */
int sfx_peer_main(struct sfx_rank *r, const struct sfx_peer_opts *o);
/* Fork a child that runs sfx_peer_main (it dies with the test). */
pid_t sfx_fork(struct sfx_rank *r, const struct sfx_peer_opts *o);
/* Fork a child running fn(arg), which returns the exit code. */
pid_t sfx_fork_fn(int (*fn)(void *), void *arg);
/* Wait for pid's exit by deadline: its exit code, 128 + signal, or -1 on
 * timeout. */
int sfx_wait_exit(pid_t pid, uint64_t deadline_ns);

/* Rank zero's config for world ranks (disk, limit, loopback listener). */
void sfx_primary_config(struct sel_shard_config *cfg, uint32_t world);
/* Hellos over the rendezvous and the join. */
int sfx_primary_join(sel_shard_set *s, struct sfx_rdv *v, uint32_t world, uint64_t deadline_ns);
/* Scan r0's directory, run the agreement, apply rank zero's actions. */
int sfx_primary_agree(sel_shard_set *s, struct sfx_rank *r0, struct sel_shard_agree_stats *st,
		      uint64_t deadline_ns);

/* The next completion by deadline: 1 with *d, SEL_ESTOPPED, -ETIMEDOUT. */
int sfx_wait_done(sel_shard_set *s, struct sel_shard_done *d, uint64_t deadline_ns);
/* Run job on rank zero (r0, locally) and every peer; wait for it. */
void sfx_job_all(sel_shard_set *s, struct sfx_rank *r0, const struct sel_shard_job *j,
		 struct sel_shard_result *local, struct sel_shard_done *d);

#endif
