/*
 * remote_client_int.h - what the files of the remote tier's client share
 * (issue 16; remote_client.h is the interface): the client's struct, its
 * ops and their state machines' state, and the calls one part makes into
 * another.  Private to remote_client.c (events, commands, submission, open,
 * poll, stats, close), remote_put.c, remote_lookup.c, remote_claim.c (the
 * three ops) and remote_io.c (the I/O thread).
 */
#ifndef SEL_REMOTE_CLIENT_INT_H
#define SEL_REMOTE_CLIENT_INT_H

#define XXH_STATIC_LINKING_ONLY
#include "remote_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <sodium.h>
#include "xxh.h"

#include "eos.h"
#include "internal.h"
#include "list.h"
#include "remote_cluster.h"
#include "remote_value.h"

#define PUT_PARALLEL 2
#define PUT_WINDOWS_INFLIGHT SEL_RN_BULK_LANES /* window SETs in flight, one a lane */
#define CLAIM_WINDOWS_INFLIGHT 2               /* window GETs in flight, all claims together */
#define CANDIDATES_MAX 32
#define MEMBERS_MAX 1024 /* bucket members looked at per bucket */
#define CHAIN_MAX 64
#define POOL_KEEP 4 /* spare window buffers */
#define IO_NICE 10
#define MS (1000ull * 1000)
#define SEC (1000ull * MS)

enum put_step {
	P_CHECK,
	P_WINDOWS,
	P_MANIFEST,
	P_BUCKET
};
enum lookup_step {
	L_BUCKETS,
	L_MANIFESTS,
	L_CHAIN,
	L_EXISTS
};

struct cand {
	sel_key key;
	bool fetched, good, from_bucket;
	uint8_t *val; /* the manifest value (owns m.cksum) */
	struct sel_rv_manifest m;
	uint64_t generation;
};

struct hnode {
	struct sel_rv_manifest m;
	uint8_t *val;
	uint64_t generation;
	int32_t slot;
};
struct hit_priv {
	uint32_t n;
	/* A hit rebased to a higher resident (sel_remote_hit_rebase): the
	 * page checksums of the n_below pages just below its resident, from
	 * the manifests of the hit it came from (sel_remote_hit_head_sums). */
	uint64_t *below;
	uint32_t n_below;
	struct hnode node[];
};

struct op;
struct op_list {
	struct op *head, *tail;
	uint32_t n;
};

struct op {
	struct op *prev, *next;
	struct sel_remote *r;
	enum sel_remote_op kind;
	uint64_t id, user;
	uint64_t submit_ns, start_ns, deadline_ns;
	int refs;
	bool started, finished, cancel;
	union {
		struct {
			struct sel_remote_put in;
			void **pages;
			struct iovec *row;
			struct iovec *iov; /* scratch: one window's pieces */
			uint32_t iov_cap;
			sel_record_span span;
			struct sel_rv_layout lay;
			uint64_t generation, row_cksum, *cksum;
			char mname[SEL_RV_NAME_MAX];
			int32_t slot;
			enum put_step step;
			uint32_t next_w, acked, inflight, pending, have;
			uint32_t lanes; /* bulk lanes its windows in flight use */
			struct sel_rn_cmd *wcmd[SEL_RN_BULK_LANES]; /* ... and their commands */
			bool present;
		} p;
		struct {
			uint64_t a, lim, k_lo, k_hi;
			sel_digest *bounds;
			sel_token *tok;
			struct cand *cand;
			uint32_t n_cand;
			enum lookup_step step;
			uint32_t pending, at, answered;
			int err;
			uint32_t chain[CHAIN_MAX], n_chain;
			uint64_t exists_want, exists_got;
		} l;
		struct {
			sel_remote_hit *hit;
			struct hit_priv *hp;
			void **pages;
			struct iovec *row;
			uint32_t row_n;
			uint32_t *base; /* [nodes] first dest page of each node */
			uint64_t *got;  /* [hit pages] bytes received (split pages) */
			struct {
				uint32_t node, w;
			} * wins;
			uint32_t n_wins, next, acked, inflight;
		} c;
	} u;
};
EOS_DLIST_DEFINE(ol, struct op_list, struct op)

struct counters {
	_Atomic uint64_t lookups, hits, lookup_errors, lookups_refused;
	_Atomic uint64_t puts, stored, present, put_failures, skipped;
	_Atomic uint64_t claims, claimed, claim_failures, claims_refused;
	_Atomic uint64_t bytes_in, bytes_out, auth_failures, corrupt, dropped;
};

struct pool_buf {
	struct pool_buf *next;
};

struct sel_remote {
	struct sel_remote_config cfg;
	const sel_record_ns *ns;
	struct sel_ru_url url;
	struct sel_rv_keys keys;
	struct sel_rv_names names;
	uint32_t cap; /* window payload bytes */
	/* Shared with the caller's thread, under mu. */
	pthread_mutex_t mu;
	struct op_list sub;
	struct sel_remote_event *ring;
	uint32_t ring_cap, ring_head, ring_n;
	uint32_t n_put, n_lookup, n_claim;
	uint64_t next_id;
	bool closing, stopped, thread_started, joined;
	uint64_t close_deadline;
	int close_rc;
	int wake_fd, event_fd;
	pthread_t thread;
	/* Stats and info, any thread. */
	struct counters ct;
	struct sel_rn_counters net_ct;
	pthread_mutex_t info_mu;
	char desc[1024];
	char last_error[256];
	/* I/O thread only. */
	struct sel_rn *net;
	struct op_list active, put_wait;
	uint32_t puts_running;
	struct pool_buf *pool;
	uint32_t pool_n;
	size_t pool_size;
	uint64_t info_ns, net_errors;
	uint32_t put_wins, claim_wins;     /* windows in flight */
	uint32_t bulk_busy;                /* bulk lanes with a window in flight */
	uint32_t put_budget, claim_budget; /* ... at most */
};

/* remote_client.c: errors, ops, events, commands, submission. */
void rmt_note_error(struct sel_remote *r, const char *msg);
void rmt_refused(struct sel_remote *r, int rc, const sel_key *key);
void rmt_op_free(struct op *o);
void rmt_op_unref(struct op *o);
void rmt_sync_error(struct sel_remote *r);
void rmt_finish(struct op *o, enum sel_remote_result res, int err, sel_remote_hit *hit,
		uint64_t bytes);
int rmt_reply_error(struct sel_remote *r, const redisReply *rep, const char *what);
void rmt_issue(struct op *o, struct sel_rn_cmd *c, uint64_t tag, int32_t slot,
	       enum sel_rn_lane lane, bool rtt);
int rmt_issue_argv(struct op *o, uint64_t tag, int32_t slot, enum sel_rn_lane lane, bool rtt,
		   int argc, const char **argv, const size_t *lens);
int32_t rmt_slot_of(const char *key, int len);
struct sel_rn_cmd *rmt_set_value_cmd(struct sel_remote *r, const char *key, size_t kl,
				     const struct sel_rv_hdr *h, const struct iovec *iov,
				     uint32_t n, uint64_t px_ms, int *err);
struct sel_rn_cmd *rmt_set_window_cmd(struct sel_remote *r, const char *key, size_t kl,
				      const struct sel_rv_hdr *h, const struct iovec *iov,
				      uint32_t n, uint64_t px_ms, int *err);
void rmt_value_want(const struct sel_remote *r, uint8_t kind, const sel_key *key, uint32_t w,
		    uint64_t gen, struct sel_rv_hdr *h);
int rmt_submit(struct sel_remote *r, struct op *o, uint64_t *id);
void rmt_pump_all(struct sel_remote *r, enum sel_remote_op kind);

/* remote_put.c, remote_lookup.c, remote_claim.c: each op's start, pump and
 * replies. */
void rmt_put_pump(struct op *o);
void rmt_put_start(struct op *o);
void rmt_put_reply(struct op *o, uint64_t tag, redisReply *rep, int err);
void rmt_lk_reply(struct op *o, uint64_t tag, redisReply *rep, int err);
void rmt_lk_start(struct op *o);
void rmt_cl_pump(struct op *o);
void rmt_cl_reply(struct op *o, uint64_t tag, redisReply *rep, int err);
void rmt_cl_start(struct op *o);

/* remote_io.c: a command's reply routed to its op; the thread. */
void rmt_on_reply(struct sel_rn_cmd *c, redisReply *rep, int err);
void *rmt_io_main(void *arg);

#endif
