/*
 * shard_link_int.h - what the files of the rank links share (shard_io.c:
 * socket and thread helpers; shard_link.c: rank zero's objects and serving;
 * shard_join.c: rank zero's startup; shard_peer.c: a peer).  Internal to
 * libselene; shard_link.h is the API and shard_link.c's header the design.
 */
#ifndef SEL_SHARD_LINK_INT_H
#define SEL_SHARD_LINK_INT_H

#include "shard_link.h"
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "hmap.h"
#include "internal.h"

#define MS_NS 1000000ull
#define S_NS 1000000000ull
#define DONE_FRAME_MAX 4096u /* what rank zero reads while serving */
#define JOIN_FRAME_MAX 512u  /* a JOIN, header included */
#define PEER_OUT_BYTES (1ull << 20)
#define PEER_LINK_DRAIN_NS (30 * S_NS) /* the ops' drain after a link ended */

static inline int shl_popcount64(uint64_t v) { return __builtin_popcountll(v); }
int shl_timeout_ms(uint64_t deadline_ns, uint64_t now);
const char *shl_hex16(const uint8_t *b, char out[33]);
socklen_t shl_to_sockaddr(const struct sel_shard_addr *a, uint16_t port,
			  struct sockaddr_storage *ss);
int shl_sock_addr(int fd, bool peer, struct sel_shard_addr *out);
int shl_send_msg(int fd, const struct sel_shard_msg *m, uint64_t deadline_ns);
int shl_recv_msg(int fd, uint8_t *buf, size_t cap, const struct sel_shard_limits *lim,
		 struct sel_shard_msg *m, uint64_t deadline_ns);
void shl_send_error(int fd, int status, const char *text);
void shl_close_fd(int *fd);
void shl_cond_init_mono(pthread_cond_t *cv);
void shl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, uint64_t deadline_ns);
void shl_efd_raise(int fd);
void shl_efd_clear(int fd);
void shl_ranks_text(uint64_t mask, char *out, size_t len);

/* ---- rank zero: objects ----------------------------------------------------- */

enum sstate {
	S_SETUP = 0, /* open: hellos, join */
	S_JOINED,
	S_AGREED,
	S_RUNNING,
	S_CLOSING,
	S_STOPPING,
	S_STOPPED,
	S_CLOSED,
};

struct frame {
	atomic_uint refs;
	uint32_t len;
	uint8_t data[];
};

struct slot {
	struct frame *f;
	bool normal; /* a caller job (counts against queue_jobs) */
};

struct link {
	struct sel_shard_set *s;
	uint32_t rank;
	int fd;
	bool hello, joined, dead, drained;
	uint8_t nonce[SEL_SHARD_NONCE_BYTES];
	struct sel_shard_addr expect; /* the rendezvous peer */
	struct sel_shard_settings set;
	/* ring, under s->mu */
	struct slot *ring;
	uint32_t cap, head, count, normal;
	uint64_t bytes;
	pthread_cond_t cv;
	bool wstop;
	pthread_t writer;
	bool writer_on;
	/* reader thread only */
	uint8_t *in;
	size_t in_len;
	/* DRAINED */
	int drain_status;
	char drain_text[SEL_SHARD_TEXT_MAX + 1];
};

struct sjob {
	struct eos_hnode hn;
	struct sjob *prev, *next; /* outstanding, submission order */
	struct sjob *dnext;       /* completion list */
	uint64_t deadline_ns;
	uint64_t pending;
	uint64_t reported;   /* ranks that answered */
	sel_record_desc rec; /* the record (STORE, UNLINK) */
	struct sjob *held;   /* an internal cleanup: the store it finishes */
	bool internal;       /* an automatic cleanup: never reported itself */
	bool caller_cleanup; /* sel_shard_cleanup */
	bool terminal;       /* a failure other than space seen */
	int cause;
	char cause_text[EOS_ERRMSG_MAX];
	struct sel_shard_done d;
};

struct sel_shard_set {
	struct sel_shard_config cfg;
	uint64_t peers; /* mask of ranks 1..world-1 */
	int lfd;
	uint16_t port;
	bool listen_specific;
	struct sel_shard_addr listen_at;
	struct link link[SEL_SHARD_WORLD_MAX];
	uint64_t agreed_limit;
	char refusal[EOS_ERRMSG_MAX];
	uint32_t refused;

	pthread_mutex_t mu;
	pthread_cond_t cv; /* close: completions, drains, the stop */
	enum sstate st;
	atomic_uint_fast64_t next_id;
	struct eos_hmap jobs;
	struct sjob *head, *tail;
	uint32_t outstanding;
	struct sjob *dhead, *dtail;
	int efd;  /* the worker's: completions or the stop */
	int wake; /* the reader's */
	pthread_t reader;
	bool reader_on, rstop;
	char why[EOS_ERRMSG_MAX];
	uint64_t stop_deadline;
	uint32_t stop_cleaned, stop_cleanup_failed, stop_abandoned;
	struct sel_shard_stats stats;
};

#endif
