/*
 * pool_client_int.h - what the files of the pool client share (design
 * 2.15; pool_client.h is the interface): the client's struct, the queues
 * between the worker and the I/O thread, the worker's tables, and the
 * calls one part makes into another.  Private to pool_client.c (attach,
 * close, destroy, the shared helpers), pool_client_io.c (the I/O thread and
 * the handshake), pool_client_lease.c (tickets, claims, puts, exports and
 * leases: the worker's calls) and pool_client_poll.c (inbound messages into
 * events).
 */
#ifndef SEL_POOL_CLIENT_INT_H
#define SEL_POOL_CLIENT_INT_H

#include "pool_client.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "xxh.h"

#include "eos.h"
#include "hmap.h"
#include "list.h"
#include "record.h"
#include "slab.h"

#define S_NS 1000000000ull
#define MS_NS 1000000ull
#define DEFAULT_OUT (8ull << 20)
#define DEFAULT_IN (16ull << 20)
#define BACKOFF_MIN_NS (100 * MS_NS)
#define BACKOFF_MAX_NS (2 * S_NS)

/* ---- queues shared with the I/O thread ------------------------------------------ */

struct qframe {
	struct qframe *next;
	uint64_t epoch;
	size_t len;
	uint8_t data[];
};

enum qkind {
	Q_MSG = 0,
	Q_LOST,
	Q_ATTACHED,
	Q_DISABLED
};

struct qmsg {
	struct qmsg *next;
	enum qkind kind;
	uint64_t epoch;
	size_t bytes;
	struct sel_pool_msg m;
};

/* ---- worker-side objects --------------------------------------------------------- */

struct sel_pool_ticket {
	struct eos_hnode hn;
	uint64_t id, epoch, resident;
	enum sel_pool_ticket_state state;
	bool linked;
	struct sel_pool_msg ans;
};

struct pending {
	struct eos_hnode hn;
	struct pending *prev, *next; /* claims: the deadline list */
	uint64_t id, epoch;
	bool is_claim;
	uint8_t source;
	sel_key key;
	uint64_t resident, bytes, deadline_ns;
	uint32_t tail;
	bool dead; /* claim timed out here: a late grant is released */
};
struct plist {
	struct pending *head, *tail;
	uint32_t n;
};
EOS_DLIST_DEFINE(plist, struct plist, struct pending)

struct lease {
	struct sel_pool_lease pub; /* first: the caller's pointer */
	struct eos_hnode hn;
	uint64_t nonce, epoch;
	bool committed;          /* put: committed, waiting for M_PUT_RESULT */
	uint32_t *slots;         /* page slots then row slots */
	struct sel_pool_msg msg; /* the grant (nodes, checksums) */
};

struct evq {
	struct sel_pool_event *v;
	size_t head, n, cap;
};

struct sel_pool_client {
	/* Immutable after attach. */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char address[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	const sel_geometry *g;
	sel_slot_layout lay;
	sel_record_layout rl;
	struct sel_pool_scope scope;
	char explicit_id[256], machine_id[256], listen[256];
	uint8_t core_identity[SEL_IDENTITY_BYTES];
	uint8_t instance[SEL_POOL_ID_BYTES];
	struct sel_pool_m_hello hello;
	uint8_t *arena;
	uint64_t arena_bytes;
	dev_t arena_dev;
	ino_t arena_ino;
	uint64_t arena_resident; /* of arena_bytes, resident when mapped (pool_budget.h) */
	uint64_t hello_timeout_ns, out_cap, in_cap;
	uint32_t setup_ms;

	/* Shared: under mu. */
	pthread_mutex_t mu;
	struct qframe *out_head, *out_tail;
	uint64_t out_bytes;
	struct qmsg *in_head, *in_tail;
	uint64_t in_bytes;
	bool in_paused;
	int wake_io, wake_worker;
	atomic_bool stop;
	atomic_uint_fast64_t drained; /* the lost epoch whose leases all ended */
	pthread_t io;
	bool io_started, closed;

	/* I/O thread only. */
	int fd;
	uint64_t io_epoch;
	bool io_disabled;
	uint8_t *rbuf;
	size_t rlen;
	size_t sent; /* bytes of the head frame already sent */

	/* Worker side only. */
	enum sel_pool_state state;
	uint64_t epoch;
	uint64_t next_id;
	struct eos_hmap tickets, pendings, leases;
	struct plist claims;
	uint32_t n_claims, n_puts; /* pending + live, for the hello's limits */
	uint64_t n_live;           /* leases in the table (committed puts excluded) */
	uint64_t claim_bytes;      /* bytes of the claim leases in the table (still copying) */
	struct evq evq;
	char warning[512];
	struct sel_pool_client_stats st;
};

/* A handshake's result. */
struct hs {
	int fd, arena_fd;
	struct sel_pool_m_hello hello;
	struct sel_pool_m_welcome welcome;
};

#define CONTAINER(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

/* pool_client.c: the eventfds, the event queue, submissions. */
void pc_wake(int fd);
void pc_drain_fd(int fd);
void pc_emit(sel_pool_client *c, enum sel_pool_event_type type, uint32_t reason, uint64_t request,
	     const sel_key *key, struct sel_pool_lease *l, sel_pool_ticket *t);
int pc_submit(sel_pool_client *c, const struct sel_pool_msg *m, bool force);
void pc_lease_free(struct lease *l);

/* pool_client_io.c: the handshake, the arena mapping, the I/O thread. */
int pc_handshake(sel_pool_client *c, uint64_t deadline, bool reattach, struct hs *h);
int pc_map_arena(sel_pool_client *c, struct hs *h);
void *pc_io_main(void *arg);

/* pool_client_lease.c: the worker's tables. */
struct pending *pc_pending_find(sel_pool_client *c, uint64_t id, bool claim);
void pc_pending_drop(sel_pool_client *c, struct pending *p);
struct lease *pc_lease_find(sel_pool_client *c, uint64_t id);
void pc_maybe_drained(sel_pool_client *c);
void pc_lease_end(sel_pool_client *c, struct lease *l);
struct lease *pc_lease_new(sel_pool_client *c, enum sel_pool_lease_kind kind, uint64_t id,
			   uint64_t nonce, uint32_t deadline_ms, const struct sel_pool_window *w,
			   uint32_t nw, uint32_t pages, uint32_t rows);
int pc_windows_ok(sel_pool_client *c, const struct sel_pool_window *w, uint32_t n, uint32_t pages,
		  uint32_t rows);
void pc_send_ls(sel_pool_client *c, uint16_t type, uint64_t lease, uint64_t nonce, uint32_t status);
sel_pool_ticket *pc_ticket_find(sel_pool_client *c, uint64_t id);

#endif
