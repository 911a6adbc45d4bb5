/*
 * remote_client.c - the remote tier's client: puts, lookups and claims of
 * records on Redis, on one I/O thread (issue 16; design 2.3 lookup, 2.15
 * grace period, restore deadlines and one source; 2.12 "the model worker
 * thread never waits").  The API and its rules are in remote_client.h, the
 * bytes on Redis in remote_value.h and docs/remote.md.
 *
 * DESIGN
 *   The caller's thread only links an op into a submission list under a
 *   mutex and writes an eventfd; everything else -- hashing, encoding,
 *   encryption, copying, the network -- happens on the I/O thread, which
 *   sleeps in poll() over the eventfd and the network's sockets.  Finished
 *   ops post an event into a ring sized to every queue's bound, so posting
 *   never fails; an op keeps its queue slot until the caller has polled
 *   its event, which is what bounds memory when the caller stops polling.
 *
 *   Ops are small state machines driven by command replies.  Each command
 *   holds a reference on its op; an op that finishes early (deadline,
 *   close, an error) sets its cancel flag, so its commands not yet written
 *   are dropped, and replies still due are consumed and ignored.  A
 *   command owns its own bytes (window values are encoded into buffers the
 *   command frees), so finishing a put never leaves the network reading
 *   the caller's pages, and a claim copies into the caller's buffers only
 *   while it is unfinished: after its event nothing writes them.
 *
 *   Put: EXISTS of the manifest and every window (pipelined, one key per
 *   command so a slot in migration answers ASK, not TRYAGAIN), then --
 *   unless all are there -- the windows, the manifest, and the bucket entry
 *   (SADD) with the bucket's expiry.  Windows go out sealed (header and tag
 *   around the caller's pages, no copy; encrypted ones from a buffer), one
 *   at a time on each of the node's bulk connections, within a client-wide
 *   budget of windows in flight shared by the puts running (two at a time,
 *   oldest first).  Without a max age the windows are written with a
 *   provisional expiry that PERSIST clears once the manifest is in: a put
 *   cut short leaves nothing that lasts.  Page checksums are computed as
 *   the windows are sealed.
 *
 *   Lookup (design 2.3 on Redis): one SMEMBERS per aligned boundary from
 *   the limit down to the resident count, pipelined; members whose key is
 *   the history's key at their length (one hash of at most 63 tokens per
 *   distinct length) are candidates; their manifests are read in one
 *   pipeline; the deepest whose chain checks out wins: every node's key
 *   equals the history's key at its length, the chain stops at a parent
 *   at or below the resident count or at a record holding its full chain,
 *   and EXISTS finds every window the restore needs.  A candidate that
 *   fails any of this gives way to the next.
 *
 *   Claim: GET of the needed windows within a client-wide budget (two in
 *   flight), each value decoded (authenticated, decrypted in place) and
 *   copied to its page buffers; every page is checked against the
 *   manifest's XXH3-64 as it completes and the row against the header's row
 *   checksum at the end.  A value bad in itself gets its record's manifest
 *   deleted (refused()), so the record stops being found and its next put
 *   writes it again.
 *
 * INVARIANTS
 *   1. Every op submitted successfully produces exactly one event.
 *   2. An op's memory lives until its last command is done (refs == 0) and
 *      its event is posted; its caller buffers are touched only before the
 *      event.
 *   3. The event ring never overflows: queued ops (each kind bounded)
 *      never exceed its size.
 *   4. No call from the caller's thread waits for the I/O thread's work.
 */
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
#include <xxhash.h>

#include "eos.h"
#include "internal.h"
#include "list.h"
#include "remote_cluster.h"
#include "remote_value.h"

#define PUT_PARALLEL 2
#define PUT_WINDOWS_INFLIGHT SEL_RN_BULK_LANES /* window SETs in flight, one a lane */
#define CLAIM_WINDOWS_INFLIGHT 2 /* window GETs in flight, all claims together */
#define CANDIDATES_MAX 32
#define MEMBERS_MAX 1024   /* bucket members looked at per bucket */
#define CHAIN_MAX 64
#define POOL_KEEP 4         /* spare window buffers */
#define IO_NICE 10
#define MS (1000ull * 1000)
#define SEC (1000ull * MS)

enum put_step { P_CHECK, P_WINDOWS, P_MANIFEST, P_BUCKET };
enum lookup_step { L_BUCKETS, L_MANIFESTS, L_CHAIN, L_EXISTS };

struct cand {
	sel_key key;
	bool fetched, good, from_bucket;
	uint8_t *val;                 /* the manifest value (owns m.cksum) */
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
			struct iovec *iov;       /* scratch: one window's pieces */
			uint32_t iov_cap;
			sel_record_span span;
			struct sel_rv_layout lay;
			uint64_t generation, row_cksum, *cksum;
			char mname[SEL_RV_NAME_MAX];
			int32_t slot;
			enum put_step step;
			uint32_t next_w, acked, inflight, pending, have;
			uint32_t lanes;          /* bulk lanes its windows in flight use */
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
			uint32_t *base;          /* [nodes] first dest page of each node */
			uint64_t *got;           /* [hit pages] bytes received (split pages) */
			struct { uint32_t node, w; } *wins;
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
	uint32_t cap;          /* window payload bytes */
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

static void count(_Atomic uint64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static uint64_t load(_Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static void note_error(struct sel_remote *r, const char *msg)
{
	pthread_mutex_lock(&r->info_mu);
	snprintf(r->last_error, sizeof r->last_error, "%s", msg);
	pthread_mutex_unlock(&r->info_mu);
}

static int32_t slot_of(const char *key, int len);

/* A value of record key failed verification: count it by kind, and for a
 * value that is bad in itself (not one of a rewrite in progress) delete
 * the record's manifest, so lookups stop finding it and the next put of
 * the record writes it again.  Deleting is no new power: whoever could
 * write the bad value could delete it. */
static void refused(struct sel_remote *r, int rc, const sel_key *key)
{
	if (rc == -EBADMSG)
		count(&r->ct.auth_failures, 1);
	else if (rc != -ESTALE)
		count(&r->ct.corrupt, 1);
	note_error(r, eos_errmsg());
	if (rc != -EBADMSG && rc != SEL_ECORRUPT && rc != SEL_EFORMAT)
		return;
	char k[SEL_RV_NAME_MAX];
	int kl = sel_rv_manifest_name(&r->names, key, k);
	const char *argv[] = {"DEL", k};
	size_t lens[] = {3, (size_t)kl};
	struct sel_rn_cmd *c = sel_rn_cmd_argv(2, argv, lens);
	if (!c)
		return;
	c->slot = slot_of(k, kl);
	c->lane = SEL_RN_FAST;
	sel_rn_submit(r->net, c);
	count(&r->ct.dropped, 1);
}

/* ---- Window buffers ------------------------------------------------------ */

/* A buffer of pool_size bytes (len must fit). */
static char *buf_get(struct sel_remote *r)
{
	if (r->pool) {
		struct pool_buf *b = r->pool;
		r->pool = b->next;
		r->pool_n--;
		return (char *)b;
	}
	return malloc(r->pool_size);
}

static void buf_put(void *ctx, char *buf)
{
	struct sel_remote *r = ctx;
	if (r->pool_n >= POOL_KEEP) {
		free(buf);
		return;
	}
	struct pool_buf *b = (struct pool_buf *)(void *)buf;
	b->next = r->pool;
	r->pool = b;
	r->pool_n++;
}

/* ---- Events -------------------------------------------------------------- */

static void post(struct sel_remote *r, const struct sel_remote_event *ev)
{
	pthread_mutex_lock(&r->mu);
	/* Cannot overflow: queued ops <= ring_cap (invariant 3). */
	r->ring[(r->ring_head + r->ring_n) % r->ring_cap] = *ev;
	r->ring_n++;
	pthread_mutex_unlock(&r->mu);
	uint64_t one = 1;
	ssize_t w = write(r->event_fd, &one, sizeof one);
	(void)w; /* a full counter is still readable */
}

static void op_free(struct op *o)
{
	switch (o->kind) {
	case SEL_REMOTE_OP_PUT:
		free(o->u.p.pages);
		free(o->u.p.row);
		free(o->u.p.iov);
		free(o->u.p.cksum);
		break;
	case SEL_REMOTE_OP_LOOKUP:
		free(o->u.l.bounds);
		free(o->u.l.tok);
		for (uint32_t i = 0; i < o->u.l.n_cand; i++)
			free(o->u.l.cand[i].val);
		free(o->u.l.cand);
		break;
	case SEL_REMOTE_OP_CLAIM:
		sel_remote_hit_free(o->u.c.hit);
		free(o->u.c.pages);
		free(o->u.c.row);
		free(o->u.c.base);
		free(o->u.c.got);
		free(o->u.c.wins);
		break;
	}
	free(o);
}

static void op_unref(struct op *o)
{
	if (--o->refs == 0)
		op_free(o);
}

static void sync_error(struct sel_remote *r)
{
	uint64_t errors;
	const char *e = sel_rn_last_error(r->net, &errors);
	if (errors != r->net_errors) {
		r->net_errors = errors;
		note_error(r, e);
	}
}

/* Post o's event and let its commands drain. */
static void finish(struct op *o, enum sel_remote_result res, int err, sel_remote_hit *hit,
		   uint64_t bytes)
{
	struct sel_remote *r = o->r;
	if (o->finished)
		return;
	o->finished = true;
	o->cancel = true;
	struct sel_remote_event ev = {
		.op = o->kind,
		.result = res,
		.error = err,
		.id = o->id,
		.user = o->user,
		.hit = hit,
		.bytes = bytes,
		.duration_ns = eos_now_ns() - o->submit_ns,
	};
	switch (o->kind) {
	case SEL_REMOTE_OP_PUT:
		ev.key = o->u.p.in.d.key;
		count(res == SEL_REMOTE_STORED ? &r->ct.stored
		      : res == SEL_REMOTE_PRESENT ? &r->ct.present : &r->ct.put_failures, 1);
		if (res == SEL_REMOTE_STORED)
			count(&r->ct.bytes_out, bytes);
		if (o->started)
			r->puts_running--;
		break;
	case SEL_REMOTE_OP_LOOKUP:
		if (hit) {
			ev.key = hit->key;
			count(&r->ct.hits, 1);
		}
		if (err)
			count(&r->ct.lookup_errors, 1);
		break;
	case SEL_REMOTE_OP_CLAIM:
		ev.key = o->u.c.hit->key;
		count(res == SEL_REMOTE_CLAIMED ? &r->ct.claimed : &r->ct.claim_failures, 1);
		if (res == SEL_REMOTE_CLAIMED)
			count(&r->ct.bytes_in, bytes);
		break;
	}
	if (o->started)
		ol_del(&r->active, o);
	else if (o->kind == SEL_REMOTE_OP_PUT)
		ol_del(&r->put_wait, o);
	/* Windows still in flight leave the budget: their replies, if any,
	 * are ignored. */
	if (o->kind == SEL_REMOTE_OP_PUT) {
		r->put_wins -= o->u.p.inflight;
		r->bulk_busy &= ~o->u.p.lanes;
		/* Window commands read the caller's pages until written: after
		 * this event the pages are the caller's again. */
		for (uint32_t l = 0; l < SEL_RN_BULK_LANES; l++)
			if (o->u.p.wcmd[l])
				sel_rn_cmd_detach(r->net, o->u.p.wcmd[l]);
	}
	else if (o->kind == SEL_REMOTE_OP_CLAIM)
		r->claim_wins -= o->u.c.inflight;
	if (err && r->net)
		sync_error(r); /* readable before the event is */
	post(r, &ev);
	op_unref(o);
}

static int remote_error(struct sel_remote *r, const redisReply *rep, const char *what)
{
	char m[256];
	snprintf(m, sizeof m, "%s: Redis answered: %.*s", what,
		 (int)(rep->len > 200 ? 200 : rep->len), rep->str);
	note_error(r, m);
	return -EREMOTEIO;
}

/* ---- Commands ------------------------------------------------------------ */

static void on_reply(struct sel_rn_cmd *c, redisReply *rep, int err);

static void issue(struct op *o, struct sel_rn_cmd *c, uint64_t tag, int32_t slot,
		  enum sel_rn_lane lane, bool rtt)
{
	c->done = on_reply;
	c->owner = o;
	c->tag = tag;
	c->cancel = &o->cancel;
	c->slot = slot;
	c->lane = lane;
	c->rtt = rtt;
	o->refs++;
	sel_rn_submit(o->r->net, c);
}

static int issue_argv(struct op *o, uint64_t tag, int32_t slot, enum sel_rn_lane lane, bool rtt,
		      int argc, const char **argv, const size_t *lens)
{
	struct sel_rn_cmd *c = sel_rn_cmd_argv(argc, argv, lens);
	if (!c)
		return -ENOMEM;
	issue(o, c, tag, slot, lane, rtt);
	return 0;
}

static int32_t slot_of(const char *key, int len)
{
	return (int32_t)sel_rc_key_slot(key, (size_t)len);
}

/* "*<argc>\r\n$3\r\nSET\r\n$<kl>\r\n<key>\r\n$<vl>\r\n" before a value and
 * "\r\n" plus "$2\r\nPX\r\n$<n>\r\n<ms>\r\n" after it. */
static size_t set_prefix(char *out, const char *key, size_t kl, size_t vl, bool px)
{
	int n = sprintf(out, "*%d\r\n$3\r\nSET\r\n$%zu\r\n", px ? 5 : 3, kl);
	memcpy(out + n, key, kl);
	n += (int)kl;
	n += sprintf(out + n, "\r\n$%zu\r\n", vl);
	return (size_t)n;
}

static size_t set_suffix(char *out, uint64_t px_ms)
{
	if (!px_ms)
		return (size_t)sprintf(out, "\r\n");
	char ms[24];
	int ml = sprintf(ms, "%llu", (unsigned long long)px_ms);
	return (size_t)sprintf(out, "\r\n$2\r\nPX\r\n$%d\r\n%s\r\n", ml, ms);
}

/* SET key <value of hdr and iov> [PX ms] into one buffer, encoded in place. */
static struct sel_rn_cmd *set_value_cmd(struct sel_remote *r, const char *key, size_t kl,
					const struct sel_rv_hdr *h, const struct iovec *iov,
					uint32_t n, uint64_t px_ms, int *err)
{
	size_t vl = sel_rv_value_bytes(&r->keys, h->payload);
	size_t total = kl + vl + 128;
	bool pooled = total <= r->pool_size; /* windows; a large manifest is not */
	char *buf = pooled ? buf_get(r) : malloc(total);
	if (!buf) {
		*err = -ENOMEM;
		return NULL;
	}
	size_t at = set_prefix(buf, key, kl, vl, px_ms != 0);
	int rc = sel_rv_encode(&r->keys, h, iov, n, (uint8_t *)buf + at, total - at);
	if (rc < 0) {
		if (pooled)
			buf_put(r, buf);
		else
			free(buf);
		*err = rc;
		return NULL;
	}
	at += (size_t)rc;
	at += set_suffix(buf + at, px_ms);
	struct sel_rn_cmd *c = sel_rn_cmd_raw(buf, at, pooled ? buf_put : NULL, r);
	if (!c)
		*err = -ENOMEM;
	return c;
}

/* SET key <value> [PX ms] for a window whose payload stays in iov (the
 * caller's pages): RESP framing and the value header in one small buffer,
 * the pages as segments, the tag and the rest of the framing after them.
 * Nothing is copied; under encryption (ciphertext has to be written
 * somewhere) this is set_value_cmd. */
static struct sel_rn_cmd *set_window_cmd(struct sel_remote *r, const char *key, size_t kl,
					 const struct sel_rv_hdr *h, const struct iovec *iov,
					 uint32_t n, uint64_t px_ms, int *err)
{
	if (r->keys.encrypt)
		return set_value_cmd(r, key, kl, h, iov, n, px_ms, err);
	size_t vl = sel_rv_value_bytes(&r->keys, h->payload);
	char *buf = malloc(kl + 64 + SEL_RV_HEADER + 32 + 64);
	struct iovec *seg = malloc((n + 2) * sizeof *seg);
	if (!buf || !seg) {
		free(buf);
		free(seg);
		*err = -ENOMEM;
		return NULL;
	}
	size_t at = set_prefix(buf, key, kl, vl, px_ms != 0);
	uint8_t *hdr = (uint8_t *)buf + at, *tail = hdr + SEL_RV_HEADER;
	int tl = sel_rv_seal(&r->keys, h, iov, n, hdr, tail);
	if (tl < 0) {
		free(buf);
		free(seg);
		*err = tl;
		return NULL;
	}
	size_t sl = set_suffix((char *)tail + tl, px_ms);
	seg[0] = (struct iovec){buf, at + SEL_RV_HEADER};
	memcpy(seg + 1, iov, n * sizeof *iov);
	seg[n + 1] = (struct iovec){tail, (size_t)tl + sl};
	struct sel_rn_cmd *c = sel_rn_cmd_segs(seg, n + 2, buf, NULL, NULL);
	if (!c)
		*err = -ENOMEM;
	return c;
}

static void value_want(const struct sel_remote *r, uint8_t kind, const sel_key *key, uint32_t w,
		       uint64_t gen, struct sel_rv_hdr *h)
{
	memset(h, 0, sizeof *h);
	h->kind = kind;
	memcpy(h->identity, r->ns->identity, SEL_IDENTITY_BYTES);
	memcpy(h->fingerprint, r->ns->fingerprint, SEL_FINGERPRINT_BYTES);
	h->key = *key;
	h->window = w;
	h->generation = gen;
}

static void put_pump(struct op *o);
static void cl_pump(struct op *o);

/* Hand a built op to the I/O thread: its queue's bound, an id, the
 * submission list, a wake-up.  On failure o is freed (with a claim's hit)
 * and nothing else changes.  The lock guards only these links and counts. */
static int submit(struct sel_remote *r, struct op *o, uint64_t *id)
{
	static const char *const what[] = {"", "put", "lookup", "claim"};
	uint32_t *queued = o->kind == SEL_REMOTE_OP_PUT ? &r->n_put
			   : o->kind == SEL_REMOTE_OP_LOOKUP ? &r->n_lookup : &r->n_claim;
	uint32_t bound = o->kind == SEL_REMOTE_OP_PUT ? r->cfg.put_queue
			 : o->kind == SEL_REMOTE_OP_LOOKUP ? r->cfg.lookup_queue : r->cfg.claim_queue;
	const char *name = what[o->kind];
	o->submit_ns = eos_now_ns();
	pthread_mutex_lock(&r->mu);
	if (r->closing || *queued >= bound) {
		bool closing = r->closing;
		pthread_mutex_unlock(&r->mu);
		enum sel_remote_op kind = o->kind;
		op_free(o);
		if (closing)
			return eos_fail(SEL_ESTOPPED, "remote %s: the client is closing", name);
		count(kind == SEL_REMOTE_OP_PUT ? &r->ct.skipped
		      : kind == SEL_REMOTE_OP_LOOKUP ? &r->ct.lookups_refused : &r->ct.claims_refused,
		      1);
		return eos_fail(-EAGAIN, "remote %s: the queue of %u is full", name, bound);
	}
	(*queued)++;
	uint64_t my_id = o->id = ++r->next_id; /* o is the I/O thread's once linked */
	enum sel_remote_op kind = o->kind;
	ol_push(&r->sub, o);
	pthread_mutex_unlock(&r->mu);
	count(kind == SEL_REMOTE_OP_PUT ? &r->ct.puts
	      : kind == SEL_REMOTE_OP_LOOKUP ? &r->ct.lookups : &r->ct.claims, 1);
	uint64_t one = 1;
	ssize_t w = write(r->wake_fd, &one, sizeof one);
	(void)w;
	*id = my_id;
	return 0;
}

/* Give window budget freed by a reply or a finished op to the active ops
 * of kind, oldest first. */
static void pump_all(struct sel_remote *r, enum sel_remote_op kind)
{
	for (struct op *o = r->active.head, *next; o; o = next) {
		next = o->next;
		if (o->kind != kind || o->finished)
			continue;
		if (kind == SEL_REMOTE_OP_PUT && o->u.p.step == P_WINDOWS)
			put_pump(o);
		else if (kind == SEL_REMOTE_OP_CLAIM)
			cl_pump(o);
		if ((kind == SEL_REMOTE_OP_PUT ? r->put_wins >= r->put_budget
					       : r->claim_wins >= r->claim_budget))
			break;
	}
}

/* ---- Put ----------------------------------------------------------------- */

/* The expiry of a put's keys: the max age; without one, none for the
 * manifest and, for the windows until PERSIST, twice the put's deadline
 * plus a minute -- longer than the put can take, short enough that what a
 * put cut short leaves goes away. */
static uint64_t put_ttl_ms(const struct op *o, bool window)
{
	const struct sel_remote *r = o->r;
	if (r->cfg.max_age_ns)
		return r->cfg.max_age_ns / MS ? r->cfg.max_age_ns / MS : 1;
	return window ? 2 * (o->deadline_ns - o->start_ns) / MS + 60000 : 0;
}

/* The payload pieces of window w of a put. */
static uint32_t put_pieces(struct op *o, uint32_t w)
{
	struct sel_rv_extent e;
	sel_rv_extent(&o->u.p.lay, w, &e);
	uint32_t n = 0;
	if (!e.row) {
		for (uint32_t i = 0; i < e.pages; i++) {
			uint32_t pg = e.page + i;
			if (e.off == 0) /* the page starts here: its checksum */
				o->u.p.cksum[pg] = XXH3_64bits(o->u.p.pages[pg], o->u.p.lay.stride);
			o->u.p.iov[n].iov_base = (uint8_t *)o->u.p.pages[pg] + e.off;
			o->u.p.iov[n++].iov_len = e.pages == 1 ? e.len : o->u.p.lay.stride;
		}
		return n;
	}
	uint64_t at = 0, lo = e.off, hi = e.off + e.len;
	for (uint32_t i = 0; i < o->u.p.in.row_n && at < hi; i++) {
		uint64_t len = o->u.p.row[i].iov_len, s = at, t = at + len;
		if (t > lo && s < hi) {
			uint64_t a = s > lo ? s : lo, b = t < hi ? t : hi;
			o->u.p.iov[n].iov_base = (uint8_t *)o->u.p.row[i].iov_base + (a - s);
			o->u.p.iov[n++].iov_len = b - a;
		}
		at = t;
	}
	return n;
}

static void put_fail(struct op *o, int err)
{
	finish(o, SEL_REMOTE_FAILED, err, NULL, 0);
}

static void put_pump(struct op *o)
{
	struct sel_remote *r = o->r;
	while (!o->finished && r->put_wins < r->put_budget && o->u.p.next_w < o->u.p.lay.windows) {
		uint32_t lane = 0; /* a bulk connection with no window in flight */
		while (lane < SEL_RN_BULK_LANES && (r->bulk_busy & (1u << lane)))
			lane++;
		if (lane == SEL_RN_BULK_LANES)
			return;
		uint32_t w = o->u.p.next_w;
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_window_name(&r->names, &o->u.p.in.d.key, w, key);
		uint32_t n = put_pieces(o, w);
		struct sel_rv_extent e;
		sel_rv_extent(&o->u.p.lay, w, &e);
		struct sel_rv_hdr h;
		value_want(r, SEL_RV_KIND_WINDOW, &o->u.p.in.d.key, w, o->u.p.generation, &h);
		h.payload = (uint32_t)e.len;
		int err = 0;
		struct sel_rn_cmd *c = set_window_cmd(r, key, (size_t)kl, &h, o->u.p.iov, n,
						      put_ttl_ms(o, true), &err);
		if (!c) {
			put_fail(o, err);
			return;
		}
		o->u.p.wcmd[lane] = c;
		o->u.p.next_w++;
		o->u.p.inflight++;
		o->u.p.lanes |= 1u << lane;
		r->put_wins++;
		r->bulk_busy |= 1u << lane;
		issue(o, c, w | (uint64_t)lane << 32, o->u.p.slot,
		      (enum sel_rn_lane)(SEL_RN_BULK + lane), false);
	}
}

static void put_done(struct op *o)
{
	finish(o, o->u.p.present ? SEL_REMOTE_PRESENT : SEL_REMOTE_STORED, 0, NULL,
	       o->u.p.present ? 0 : o->u.p.in.d.tail * o->u.p.lay.stride + o->u.p.lay.row);
}

/* After the manifest: announce the record in its bucket (only a record
 * with its row can be an endpoint; a page-only one is found through its
 * children's parent links) and, without a max age, end the windows'
 * provisional expiry. */
static void put_bucket(struct op *o)
{
	struct sel_remote *r = o->r;
	int rc;
	o->u.p.step = P_BUCKET;
	o->u.p.pending = 0;
	if (o->u.p.in.has_row) {
		char bkey[SEL_RV_NAME_MAX], member[SEL_RECORD_NAME_MAX];
		int bl = sel_rv_bucket_name(&r->names, &o->u.p.in.d.bucket, bkey);
		sel_record_name(&o->u.p.in.d.key, member);
		int32_t bslot = slot_of(bkey, bl);
		const char *sadd[] = {"SADD", bkey, member};
		size_t sl[] = {4, (size_t)bl, strlen(member)};
		if ((rc = issue_argv(o, 0, bslot, SEL_RN_BULK, false, 3, sadd, sl))) {
			put_fail(o, rc);
			return;
		}
		o->u.p.pending++;
		if (r->cfg.max_age_ns) {
			char ms[24];
			int ml = snprintf(ms, sizeof ms, "%llu",
					  (unsigned long long)put_ttl_ms(o, false));
			const char *pe[] = {"PEXPIRE", bkey, ms};
			size_t pl[] = {7, (size_t)bl, (size_t)ml};
			if ((rc = issue_argv(o, 0, bslot, SEL_RN_BULK, false, 3, pe, pl))) {
				put_fail(o, rc);
				return;
			}
			o->u.p.pending++;
		}
	}
	if (!r->cfg.max_age_ns && !o->u.p.present) {
		for (uint32_t w = 0; w < o->u.p.lay.windows; w++) {
			char key[SEL_RV_NAME_MAX];
			int kl = sel_rv_window_name(&r->names, &o->u.p.in.d.key, w, key);
			const char *pa[] = {"PERSIST", key};
			size_t pl[] = {7, (size_t)kl};
			if ((rc = issue_argv(o, 0, o->u.p.slot, SEL_RN_BULK, false, 2, pa, pl))) {
				put_fail(o, rc);
				return;
			}
			o->u.p.pending++;
		}
	}
	if (!o->u.p.pending)
		put_done(o);
}

static void put_manifest(struct op *o)
{
	struct sel_remote *r = o->r;
	size_t ml = sel_rv_manifest_bytes(r->ns, o->u.p.in.d.tail);
	uint8_t *m = malloc(ml);
	if (!m) {
		put_fail(o, -ENOMEM);
		return;
	}
	int rc = sel_rv_manifest_encode(r->ns, &o->u.p.in.d, o->u.p.in.has_row, o->u.p.row_cksum,
					o->u.p.in.created_ns, r->cap, o->u.p.cksum, m, ml);
	if (rc < 0) {
		free(m);
		note_error(r, eos_errmsg());
		put_fail(o, rc);
		return;
	}
	struct sel_rv_hdr h;
	value_want(r, SEL_RV_KIND_MANIFEST, &o->u.p.in.d.key, SEL_RV_MANIFEST_WINDOW,
		   o->u.p.generation, &h);
	h.payload = (uint32_t)rc;
	struct iovec iov = {m, (size_t)rc};
	int err = 0;
	struct sel_rn_cmd *c = set_value_cmd(r, o->u.p.mname, strlen(o->u.p.mname), &h, &iov, 1,
					     put_ttl_ms(o, false), &err);
	free(m);
	if (!c) {
		put_fail(o, err);
		return;
	}
	o->u.p.step = P_MANIFEST;
	issue(o, c, 0, o->u.p.slot, SEL_RN_BULK, false);
}

static void put_start(struct op *o)
{
	struct sel_remote *r = o->r;
	struct sel_remote_put *in = &o->u.p.in;
	o->started = true;
	o->start_ns = eos_now_ns();
	r->puts_running++;
	ol_push(&r->active, o);
	uint64_t bytes = in->d.tail * o->u.p.span.page_stride + o->u.p.lay.row;
	o->deadline_ns = o->start_ns + sel_remote_claim_budget_ns(r, bytes);
	if (in->has_row)
		o->u.p.row_cksum = sel_record_row_checksum(o->u.p.row, in->row_n);
	randombytes_buf(&o->u.p.generation, sizeof o->u.p.generation);
	o->u.p.generation |= 1; /* never 0 */
	/* EXISTS of the manifest and every window, one key per command (see
	 * lk_exists): all there means the record is complete on Redis. */
	o->u.p.step = P_CHECK;
	o->u.p.pending = 0;
	o->u.p.have = 0;
	for (uint32_t w = 0; w <= o->u.p.lay.windows; w++) {
		char key[SEL_RV_NAME_MAX];
		int kl = w == o->u.p.lay.windows
				 ? (int)strlen(strcpy(key, o->u.p.mname))
				 : sel_rv_window_name(&r->names, &in->d.key, w, key);
		const char *argv[] = {"EXISTS", key};
		size_t lens[] = {6, (size_t)kl};
		int rc = issue_argv(o, 0, o->u.p.slot, SEL_RN_BULK, false, 2, argv, lens);
		if (rc) {
			put_fail(o, rc);
			return;
		}
		o->u.p.pending++;
	}
}

static void put_reply(struct op *o, uint64_t tag, redisReply *rep, int err)
{
	struct sel_remote *r = o->r;
	if (err) {
		put_fail(o, err);
		return;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		put_fail(o, remote_error(r, rep, "remote put"));
		return;
	}
	switch (o->u.p.step) {
	case P_CHECK:
		if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 1)
			o->u.p.have++;
		if (--o->u.p.pending)
			return;
		if (o->u.p.have == o->u.p.lay.windows + 1) {
			o->u.p.present = true; /* complete there: announce it again, write nothing */
			put_bucket(o);
			return;
		}
		o->u.p.step = P_WINDOWS;
		put_pump(o);
		if (!o->finished && o->u.p.lay.windows == 0)
			put_manifest(o);
		return;
	case P_WINDOWS:
		o->u.p.inflight--;
		o->u.p.lanes &= ~(1u << (tag >> 32));
		r->bulk_busy &= ~(1u << (tag >> 32));
		r->put_wins--;
		if (++o->u.p.acked == o->u.p.lay.windows)
			put_manifest(o);
		pump_all(r, SEL_REMOTE_OP_PUT);
		return;
	case P_MANIFEST:
		put_bucket(o);
		return;
	case P_BUCKET:
		if (--o->u.p.pending == 0)
			put_done(o);
		return;
	}
}

int sel_remote_put(sel_remote *r, const struct sel_remote_put *p, uint64_t *id)
{
	const sel_record_ns *ns = r->ns;
	sel_record_span span;
	int rc = sel_record_span_of(&ns->layout.sz, &p->d, &span);
	if (rc)
		return eos_fail(-EINVAL, "remote put: %s", eos_errmsg());
	if (p->d.tail && !p->pages)
		return eos_fail(-EINVAL, "remote put: %u pages and no page buffers", p->d.tail);
	uint64_t row = p->has_row ? sel_rv_row_bytes(&ns->layout, p->d.flags) : 0, sum = 0;
	for (uint32_t i = 0; p->has_row && i < p->row_n; i++)
		sum += p->row[i].iov_len;
	if (sum != row)
		return eos_fail(-EINVAL, "remote put: row pieces of %llu bytes for a row of %llu",
				(unsigned long long)sum, (unsigned long long)row);
	if (!sel_rv_manifest_bytes(ns, p->d.tail))
		return eos_fail(SEL_EOVERSIZE, "remote put: %u pages need a manifest beyond one "
				"value", p->d.tail);
	struct op *o = calloc(1, sizeof *o);
	if (!o)
		return eos_fail(-ENOMEM, "remote put: out of memory");
	o->kind = SEL_REMOTE_OP_PUT;
	o->r = r;
	o->refs = 1;
	o->user = p->user;
	o->u.p.in = *p;
	o->u.p.span = span;
	if ((rc = sel_rv_layout_init(&o->u.p.lay, span.page_stride, p->d.tail, row, r->cap))) {
		free(o);
		return rc;
	}
	uint32_t iov_cap = o->u.p.lay.ppw > p->row_n ? o->u.p.lay.ppw : p->row_n;
	o->u.p.iov_cap = iov_cap ? iov_cap : 1;
	o->u.p.pages = p->d.tail ? malloc(p->d.tail * sizeof(void *)) : NULL;
	o->u.p.row = malloc((p->row_n ? p->row_n : 1) * sizeof(struct iovec));
	o->u.p.iov = malloc(o->u.p.iov_cap * sizeof(struct iovec));
	o->u.p.cksum = calloc(p->d.tail ? p->d.tail : 1, sizeof(uint64_t));
	if ((p->d.tail && !o->u.p.pages) || !o->u.p.row || !o->u.p.iov || !o->u.p.cksum) {
		op_free(o);
		return eos_fail(-ENOMEM, "remote put: out of memory");
	}
	if (p->d.tail)
		memcpy(o->u.p.pages, p->pages, p->d.tail * sizeof(void *));
	if (p->has_row && p->row_n)
		memcpy(o->u.p.row, p->row, p->row_n * sizeof(struct iovec));
	if (!p->has_row)
		o->u.p.in.row_n = 0;
	o->u.p.in.pages = NULL;
	o->u.p.in.row = NULL;
	if (!o->u.p.in.created_ns)
		o->u.p.in.created_ns = eos_wall_ns();
	int ml = sel_rv_manifest_name(&r->names, &p->d.key, o->u.p.mname);
	o->u.p.slot = slot_of(o->u.p.mname, ml);
	return submit(r, o, id);
}

/* ---- Lookup -------------------------------------------------------------- */

static void lk_key_at(const struct op *o, uint64_t c, sel_key *out)
{
	uint64_t k = c / SEL_BUCKET_TOKENS;
	sel_key_from_bound(&o->u.l.bounds[k - o->u.l.k_lo],
			   o->u.l.tok + (k - o->u.l.k_lo) * SEL_BUCKET_TOKENS, c, out);
}

/* Whether the history covers c for key checks. */
static bool lk_covers(const struct op *o, uint64_t c)
{
	return c > o->u.l.a && c <= o->u.l.lim && c / SEL_BUCKET_TOKENS >= o->u.l.k_lo;
}

static int lk_find(const struct op *o, const sel_key *k)
{
	for (uint32_t i = 0; i < o->u.l.n_cand; i++)
		if (sel_key_eq(&o->u.l.cand[i].key, k))
			return (int)i;
	return -1;
}

static void lk_bucket(struct op *o, uint64_t k, const redisReply *rep)
{
	if (rep->type != REDIS_REPLY_ARRAY)
		return;
	/* One hash per distinct length in the bucket: at most 64. */
	bool tried[SEL_BUCKET_TOKENS] = {false};
	sel_key want[SEL_BUCKET_TOKENS];
	size_t n = rep->elements < MEMBERS_MAX ? rep->elements : MEMBERS_MAX;
	for (size_t i = 0; i < n; i++) {
		const redisReply *e = rep->element[i];
		sel_key key;
		if (!e || e->type != REDIS_REPLY_STRING || sel_rv_member_parse(e->str, e->len, &key))
			continue;
		uint64_t c = key.consumed;
		if (c / SEL_BUCKET_TOKENS != k || !lk_covers(o, c))
			continue;
		uint32_t j = (uint32_t)(c % SEL_BUCKET_TOKENS);
		if (!tried[j]) {
			lk_key_at(o, c, &want[j]);
			tried[j] = true;
		}
		if (!sel_key_eq(&want[j], &key) || lk_find(o, &key) >= 0 ||
		    o->u.l.n_cand >= CANDIDATES_MAX + CHAIN_MAX)
			continue;
		struct cand *cd = &o->u.l.cand[o->u.l.n_cand++];
		memset(cd, 0, sizeof *cd);
		cd->key = key;
		cd->from_bucket = true;
	}
}

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return x->key.consumed < y->key.consumed ? 1 : x->key.consumed > y->key.consumed ? -1 : 0;
}

static int lk_get_manifest(struct op *o, uint32_t i)
{
	char key[SEL_RV_NAME_MAX];
	int kl = sel_rv_manifest_name(&o->r->names, &o->u.l.cand[i].key, key);
	const char *argv[] = {"GET", key};
	size_t lens[] = {3, (size_t)kl};
	o->u.l.pending++;
	return issue_argv(o, i, slot_of(key, kl), SEL_RN_FAST, true, 2, argv, lens);
}

static void lk_manifest(struct op *o, uint32_t i, redisReply *rep)
{
	struct sel_remote *r = o->r;
	struct cand *cd = &o->u.l.cand[i];
	cd->fetched = true;
	if (rep->type != REDIS_REPLY_STRING)
		return; /* nil: expired or evicted; anything else: not ours */
	cd->val = malloc(rep->len ? rep->len : 1);
	if (!cd->val)
		return;
	memcpy(cd->val, rep->str, rep->len);
	struct sel_rv_hdr want, got;
	uint8_t *payload;
	value_want(r, SEL_RV_KIND_MANIFEST, &cd->key, SEL_RV_MANIFEST_WINDOW, 0, &want);
	int rc = sel_rv_decode(&r->keys, &want, cd->val, rep->len, &got, &payload);
	if (!rc)
		rc = sel_rv_manifest_decode(r->ns, &cd->key, payload, got.payload, &cd->m);
	if (rc) {
		refused(r, rc, &cd->key);
		return;
	}
	cd->generation = got.generation;
	cd->good = true;
}

static void lk_finish_miss(struct op *o, int err)
{
	finish(o, err ? SEL_REMOTE_FAILED : SEL_REMOTE_MISS, err, NULL, 0);
}

static void lk_evaluate(struct op *o);
static void lk_hit(struct op *o);

/* Page geometry of chain node j (ascending chain order in hit terms). */
static uint32_t node_skip(const struct op *o, const struct sel_rv_manifest *m)
{
	uint32_t pt = o->r->ns->layout.sz.page_tokens;
	uint64_t first = m->h.d.key.consumed / pt - m->h.d.tail; /* global page of its first */
	uint64_t need = o->u.l.a / pt;
	return need > first ? (uint32_t)(need - first) : 0;
}

/* EXISTS of every window the chain's restore reads, one key per command
 * (pipelined): a multi-key EXISTS meets TRYAGAIN while a slot migrates,
 * one key follows ASK. */
static void lk_exists(struct op *o)
{
	struct sel_remote *r = o->r;
	o->u.l.step = L_EXISTS;
	o->u.l.pending = 0;
	o->u.l.exists_want = o->u.l.exists_got = 0;
	for (uint32_t j = 0; j < o->u.l.n_chain; j++) {
		const struct cand *cd = &o->u.l.cand[o->u.l.chain[j]];
		const struct sel_rv_layout *lay = &cd->m.layout;
		uint32_t skip = node_skip(o, &cd->m);
		uint32_t w0 = skip < lay->tail ? sel_rv_page_window(lay, skip) : lay->page_windows;
		uint32_t w1 = j == 0 ? lay->windows : lay->page_windows; /* chain[0]: the endpoint */
		for (uint32_t w = w0; w < w1; w++) {
			char key[SEL_RV_NAME_MAX];
			int kl = sel_rv_window_name(&r->names, &cd->key, w, key);
			const char *argv[] = {"EXISTS", key};
			size_t lens[] = {6, (size_t)kl};
			if (issue_argv(o, 0, slot_of(key, kl), SEL_RN_FAST, true, 2, argv, lens)) {
				lk_finish_miss(o, -ENOMEM);
				return;
			}
			o->u.l.pending++;
			o->u.l.exists_want++;
		}
	}
	if (!o->u.l.pending)
		lk_hit(o); /* no window to check */
}

static void lk_hit(struct op *o)
{
	struct sel_remote *r = o->r;
	uint32_t n = o->u.l.n_chain;
	sel_remote_hit *h = calloc(1, sizeof *h);
	struct hit_priv *hp = calloc(1, sizeof *hp + n * sizeof(struct hnode));
	struct sel_remote_node *nodes = calloc(n, sizeof *nodes);
	if (!h || !hp || !nodes) {
		free(h);
		free(hp);
		free(nodes);
		lk_finish_miss(o, -ENOMEM);
		return;
	}
	h->resident = o->u.l.a;
	h->n_nodes = n;
	h->node = nodes;
	h->priv = hp;
	hp->n = n;
	for (uint32_t j = 0; j < n; j++) {
		/* chain[] runs from the endpoint down; the hit ascends. */
		struct cand *cd = &o->u.l.cand[o->u.l.chain[n - 1 - j]];
		struct sel_remote_node *nd = &nodes[j];
		struct hnode *hn = &hp->node[j];
		const struct sel_rv_layout *lay = &cd->m.layout;
		hn->m = cd->m;
		hn->val = cd->val; /* the hit owns the manifest now */
		cd->val = NULL;
		hn->generation = cd->generation;
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_manifest_name(&r->names, &cd->key, key);
		hn->slot = slot_of(key, kl);
		nd->key = cd->key;
		nd->flags = cd->m.h.d.flags;
		nd->tail = cd->m.h.d.tail;
		nd->skip = node_skip(o, &cd->m);
		if (nd->skip > nd->tail)
			nd->skip = nd->tail;
		nd->stride = cd->m.h.span.page_stride;
		h->pages += nd->tail - nd->skip;
		h->bytes += (uint64_t)(nd->tail - nd->skip) * nd->stride;
		uint32_t w0 = nd->skip < lay->tail ? sel_rv_page_window(lay, nd->skip)
						   : lay->page_windows;
		uint32_t w1 = j == n - 1 ? lay->windows : lay->page_windows;
		for (uint32_t w = w0; w < w1; w++) {
			struct sel_rv_extent e;
			sel_rv_extent(lay, w, &e);
			h->wire_bytes += sel_rv_value_bytes(&r->keys, e.len);
		}
		if (j == n - 1) {
			h->key = cd->key;
			h->flags = nd->flags;
			h->row_bytes = cd->m.row_bytes;
			h->bytes += cd->m.row_bytes;
		}
	}
	finish(o, SEL_REMOTE_HIT, 0, h, 0);
}

/* Try candidates from o->u.l.at: build the chain of the first good one,
 * fetching a parent manifest it lacks (the reply resumes here, at the same
 * candidate), then check its windows (lk_reply moves on to the next
 * candidate when one is missing). */
static void lk_evaluate(struct op *o)
{
	uint32_t pt = o->r->ns->layout.sz.page_tokens;
	o->u.l.step = L_MANIFESTS;
	for (; o->u.l.at < o->u.l.n_cand; o->u.l.at++) {
		struct cand *end = &o->u.l.cand[o->u.l.at];
		if (!end->from_bucket || !end->fetched || !end->good || !end->m.has_row)
			continue; /* parents fetched for a chain are not endpoints */
		o->u.l.n_chain = 0;
		uint32_t cur = o->u.l.at;
		bool ok = true;
		for (;;) {
			struct cand *cd = &o->u.l.cand[cur];
			if (o->u.l.n_chain == CHAIN_MAX) {
				ok = false;
				break;
			}
			o->u.l.chain[o->u.l.n_chain++] = cur;
			const sel_record_desc *d = &cd->m.h.d;
			if (!sel_record_links_parent(d, pt) || d->parent.consumed <= o->u.l.a)
				break; /* complete: a full chain, or the GPU holds the rest */
			/* Design 2.3: every node's key must be the history's key at
			 * its length, or the chain is another conversation's. */
			sel_key want;
			if (!lk_covers(o, d->parent.consumed)) {
				ok = false;
				break;
			}
			lk_key_at(o, d->parent.consumed, &want);
			if (!sel_key_eq(&want, &d->parent)) {
				ok = false;
				break;
			}
			int pi = lk_find(o, &d->parent);
			if (pi < 0) {
				if (o->u.l.n_cand >= CANDIDATES_MAX + CHAIN_MAX) {
					ok = false;
					break;
				}
				pi = (int)o->u.l.n_cand++;
				memset(&o->u.l.cand[pi], 0, sizeof o->u.l.cand[pi]);
				o->u.l.cand[pi].key = d->parent;
			}
			struct cand *pc = &o->u.l.cand[pi];
			if (!pc->fetched) {
				o->u.l.step = L_CHAIN;
				o->u.l.pending = 0;
				if (lk_get_manifest(o, (uint32_t)pi))
					lk_finish_miss(o, -ENOMEM);
				return;
			}
			if (!pc->good) {
				ok = false;
				break;
			}
			cur = (uint32_t)pi;
		}
		if (ok) {
			lk_exists(o);
			return;
		}
	}
	lk_finish_miss(o, 0);
}

/* A read that failed (a node down, an error reply) is a read that found
 * nothing: the lookup goes on with what the other nodes answered, so one
 * master down in a cluster costs only the records (and buckets) it holds.
 * The lookup fails only when no bucket read was answered at all. */
static void lk_reply(struct op *o, uint64_t tag, redisReply *rep, int err)
{
	if (!err && rep->type == REDIS_REPLY_ERROR)
		err = remote_error(o->r, rep, "remote lookup");
	if (err && !o->u.l.err)
		o->u.l.err = err;
	static const redisReply nil = {.type = REDIS_REPLY_NIL};
	if (err)
		rep = (redisReply *)&nil;
	switch (o->u.l.step) {
	case L_BUCKETS:
		if (!err)
			o->u.l.answered++;
		lk_bucket(o, tag, rep);
		if (--o->u.l.pending)
			return;
		if (!o->u.l.answered) {
			lk_finish_miss(o, o->u.l.err); /* nothing answered: a failure */
			return;
		}
		qsort(o->u.l.cand, o->u.l.n_cand, sizeof *o->u.l.cand, cand_cmp);
		if (o->u.l.n_cand > CANDIDATES_MAX)
			o->u.l.n_cand = CANDIDATES_MAX;
		if (!o->u.l.n_cand) {
			lk_finish_miss(o, 0);
			return;
		}
		o->u.l.step = L_MANIFESTS;
		for (uint32_t i = 0; i < o->u.l.n_cand; i++)
			if (lk_get_manifest(o, i)) {
				lk_finish_miss(o, -ENOMEM);
				return;
			}
		return;
	case L_MANIFESTS:
	case L_CHAIN:
		lk_manifest(o, (uint32_t)tag, rep);
		if (--o->u.l.pending)
			return;
		lk_evaluate(o);
		return;
	case L_EXISTS:
		if (rep->type == REDIS_REPLY_INTEGER && rep->integer > 0)
			o->u.l.exists_got += (uint64_t)rep->integer;
		if (--o->u.l.pending)
			return;
		if (o->u.l.exists_got == o->u.l.exists_want) {
			lk_hit(o);
			return;
		}
		o->u.l.at++; /* a window is gone (or unreachable): a miss, never partial */
		lk_evaluate(o);
		return;
	}
}

static void lk_start(struct op *o)
{
	struct sel_remote *r = o->r;
	o->started = true;
	o->start_ns = eos_now_ns();
	o->deadline_ns = o->submit_ns + r->cfg.lookup_timeout_ns;
	ol_push(&r->active, o);
	o->u.l.step = L_BUCKETS;
	for (uint64_t k = o->u.l.k_hi + 1; k-- > o->u.l.k_lo;) {
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_bucket_name(&r->names, &o->u.l.bounds[k - o->u.l.k_lo], key);
		const char *argv[] = {"SMEMBERS", key};
		size_t lens[] = {8, (size_t)kl};
		if (issue_argv(o, k, slot_of(key, kl), SEL_RN_FAST, true, 2, argv, lens)) {
			lk_finish_miss(o, -ENOMEM);
			return;
		}
		o->u.l.pending++;
	}
}

int sel_remote_lookup(sel_remote *r, const sel_history *h, uint64_t resident, uint64_t limit,
		      uint64_t user, uint64_t *id)
{
	if (limit > sel_history_len(h) || resident >= limit)
		return eos_fail(-EINVAL, "remote lookup: resident %llu and limit %llu for a history "
				"of %llu tokens", (unsigned long long)resident,
				(unsigned long long)limit, (unsigned long long)sel_history_len(h));
	struct op *o = calloc(1, sizeof *o);
	if (!o)
		return eos_fail(-ENOMEM, "remote lookup: out of memory");
	o->kind = SEL_REMOTE_OP_LOOKUP;
	o->r = r;
	o->refs = 1;
	o->user = user;
	o->u.l.a = resident;
	o->u.l.lim = limit;
	o->u.l.k_hi = limit / SEL_BUCKET_TOKENS;
	o->u.l.k_lo = resident / SEL_BUCKET_TOKENS;
	if (o->u.l.k_hi - o->u.l.k_lo + 1 > r->cfg.max_buckets)
		o->u.l.k_lo = o->u.l.k_hi + 1 - r->cfg.max_buckets;
	uint64_t nb = o->u.l.k_hi - o->u.l.k_lo + 1, nt = limit - o->u.l.k_lo * SEL_BUCKET_TOKENS;
	o->u.l.bounds = malloc(nb * sizeof *o->u.l.bounds);
	o->u.l.tok = malloc((nt ? nt : 1) * sizeof *o->u.l.tok);
	o->u.l.cand = calloc(CANDIDATES_MAX + CHAIN_MAX, sizeof *o->u.l.cand);
	if (!o->u.l.bounds || !o->u.l.tok || !o->u.l.cand) {
		op_free(o);
		return eos_fail(-ENOMEM, "remote lookup: out of memory");
	}
	/* The new tokens and their boundaries: what every key check needs. */
	for (uint64_t k = o->u.l.k_lo; k <= o->u.l.k_hi; k++)
		o->u.l.bounds[k - o->u.l.k_lo] = *sel_history_bound(h, k);
	memcpy(o->u.l.tok, h->tokens + o->u.l.k_lo * SEL_BUCKET_TOKENS, nt * sizeof *o->u.l.tok);
	return submit(r, o, id);
}

void sel_remote_hit_free(sel_remote_hit *h)
{
	if (!h)
		return;
	struct hit_priv *hp = h->priv;
	if (hp)
		for (uint32_t i = 0; i < hp->n; i++)
			free(hp->node[i].val);
	free(hp);
	free(h->node);
	free(h);
}

/* ---- Claim --------------------------------------------------------------- */

static void cl_fail(struct op *o, int err)
{
	finish(o, SEL_REMOTE_FAILED, err, NULL, 0);
}

static void cl_pump(struct op *o)
{
	struct sel_remote *r = o->r;
	while (!o->finished && r->claim_wins < r->claim_budget && o->u.c.next < o->u.c.n_wins) {
		uint32_t i = o->u.c.next++;
		const struct hnode *hn = &o->u.c.hp->node[o->u.c.wins[i].node];
		char key[SEL_RV_NAME_MAX];
		int kl = sel_rv_window_name(&r->names, &hn->m.h.d.key, o->u.c.wins[i].w, key);
		const char *argv[] = {"GET", key};
		size_t lens[] = {3, (size_t)kl};
		if (issue_argv(o, i, hn->slot, SEL_RN_FAST, false, 2, argv, lens)) {
			cl_fail(o, -ENOMEM);
			return;
		}
		o->u.c.inflight++;
		r->claim_wins++;
	}
}

/* Copy window i's payload to its destinations, checking completed pages. */
static int cl_place(struct op *o, uint32_t i, const uint8_t *p)
{
	uint32_t j = o->u.c.wins[i].node, w = o->u.c.wins[i].w;
	const struct hnode *hn = &o->u.c.hp->node[j];
	const struct sel_remote_node *nd = &o->u.c.hit->node[j];
	const struct sel_rv_layout *lay = &hn->m.layout;
	struct sel_rv_extent e;
	sel_rv_extent(lay, w, &e);
	if (e.row) {
		uint64_t at = 0, lo = e.off, hi = e.off + e.len;
		for (uint32_t k = 0; k < o->u.c.row_n && at < hi; k++) {
			uint64_t len = o->u.c.row[k].iov_len, s = at, t = at + len;
			if (t > lo && s < hi) {
				uint64_t a = s > lo ? s : lo, b = t < hi ? t : hi;
				memcpy((uint8_t *)o->u.c.row[k].iov_base + (a - s), p + (a - lo), b - a);
			}
			at = t;
		}
		return 0;
	}
	for (uint32_t k = 0; k < e.pages; k++) {
		uint32_t pg = e.page + k;
		if (pg < nd->skip)
			continue;
		uint32_t di = o->u.c.base[j] + (pg - nd->skip);
		uint8_t *dst = o->u.c.pages[di];
		uint64_t len = e.pages == 1 ? e.len : lay->stride;
		memcpy(dst + e.off, p + (uint64_t)k * lay->stride, len);
		if ((o->u.c.got[di] += len) == lay->stride) {
			int rc = sel_record_check_page(dst, lay->stride, sel_rv_manifest_cksum(&hn->m, pg),
						       pg);
			if (rc)
				return rc;
		}
	}
	return 0;
}

static void cl_reply(struct op *o, uint64_t tag, redisReply *rep, int err)
{
	struct sel_remote *r = o->r;
	if (err) {
		cl_fail(o, err);
		return;
	}
	if (rep->type == REDIS_REPLY_NIL) {
		char m[160];
		snprintf(m, sizeof m, "remote claim: window %u of %llu tokens is gone",
			 o->u.c.wins[tag].w,
			 (unsigned long long)o->u.c.hit->node[o->u.c.wins[tag].node].key.consumed);
		note_error(r, m);
		cl_fail(o, -ENOENT);
		return;
	}
	if (rep->type != REDIS_REPLY_STRING) {
		cl_fail(o, rep->type == REDIS_REPLY_ERROR ? remote_error(r, rep, "remote claim")
							    : -EPROTO);
		return;
	}
	uint32_t j = o->u.c.wins[tag].node, w = o->u.c.wins[tag].w;
	const struct hnode *hn = &o->u.c.hp->node[j];
	struct sel_rv_hdr want, got;
	uint8_t *payload;
	value_want(r, SEL_RV_KIND_WINDOW, &hn->m.h.d.key, w, hn->generation, &want);
	int rc = sel_rv_decode(&r->keys, &want, (uint8_t *)rep->str, rep->len, &got, &payload);
	if (!rc) {
		struct sel_rv_extent e;
		sel_rv_extent(&hn->m.layout, w, &e);
		if (got.payload != e.len)
			rc = eos_fail(SEL_EFORMAT, "remote window %u: %u payload bytes, the manifest "
				      "says %llu", w, got.payload, (unsigned long long)e.len);
	}
	if (!rc)
		rc = cl_place(o, (uint32_t)tag, payload);
	if (rc) {
		refused(r, rc, &hn->m.h.d.key);
		cl_fail(o, rc);
		return;
	}
	o->u.c.inflight--;
	r->claim_wins--;
	if (++o->u.c.acked < o->u.c.n_wins) {
		pump_all(r, SEL_REMOTE_OP_CLAIM);
		return;
	}
	const struct hnode *end = &o->u.c.hp->node[o->u.c.hp->n - 1];
	if ((rc = sel_record_check_row(o->u.c.row, o->u.c.row_n, end->m.h.row_checksum))) {
		refused(r, rc, &end->m.h.d.key);
		cl_fail(o, rc);
		return;
	}
	finish(o, SEL_REMOTE_CLAIMED, 0, NULL, o->u.c.hit->bytes);
}

static void cl_start(struct op *o)
{
	struct sel_remote *r = o->r;
	o->started = true;
	o->start_ns = eos_now_ns();
	o->deadline_ns = o->submit_ns + sel_remote_claim_budget_ns(r, o->u.c.hit->wire_bytes);
	ol_push(&r->active, o);
	if (!o->u.c.n_wins) {
		finish(o, SEL_REMOTE_CLAIMED, 0, NULL, o->u.c.hit->bytes);
		return;
	}
	cl_pump(o);
}

int sel_remote_claim(sel_remote *r, sel_remote_hit *hit, const struct sel_remote_dest *dest,
		     uint64_t user, uint64_t *id)
{
	struct hit_priv *hp = hit ? hit->priv : NULL;
	uint64_t rs = 0;
	for (uint32_t i = 0; dest && i < dest->row_n; i++)
		rs += dest->row[i].iov_len;
	if (!hp || !dest || dest->n_pages != hit->pages || (hit->pages && !dest->pages) ||
	    rs != hit->row_bytes) {
		int rc = eos_fail(-EINVAL, "remote claim: destination of %u pages and %llu row "
				  "bytes for a hit of %u pages and %llu row bytes",
				  dest ? dest->n_pages : 0, (unsigned long long)rs,
				  hit ? hit->pages : 0, hit ? (unsigned long long)hit->row_bytes : 0ull);
		sel_remote_hit_free(hit);
		return rc;
	}
	struct op *o = calloc(1, sizeof *o);
	int rc = -ENOMEM;
	if (!o)
		goto fail;
	o->kind = SEL_REMOTE_OP_CLAIM;
	o->r = r;
	o->refs = 1;
	o->user = user;
	o->u.c.hit = hit;
	o->u.c.hp = hp;
	o->u.c.row_n = dest->row_n;
	o->u.c.pages = malloc((hit->pages ? hit->pages : 1) * sizeof(void *));
	o->u.c.row = malloc((dest->row_n ? dest->row_n : 1) * sizeof(struct iovec));
	o->u.c.base = calloc(hit->n_nodes, sizeof(uint32_t));
	o->u.c.got = calloc(hit->pages ? hit->pages : 1, sizeof(uint64_t));
	uint64_t nw = 0;
	for (uint32_t j = 0; j < hp->n; j++) {
		const struct sel_rv_layout *lay = &hp->node[j].m.layout;
		uint32_t skip = hit->node[j].skip;
		uint32_t w0 = skip < lay->tail ? sel_rv_page_window(lay, skip) : lay->page_windows;
		nw += (j == hp->n - 1 ? lay->windows : lay->page_windows) - w0;
	}
	o->u.c.wins = malloc((nw ? nw : 1) * sizeof *o->u.c.wins);
	if (!o->u.c.pages || !o->u.c.row || !o->u.c.base || !o->u.c.got || !o->u.c.wins)
		goto fail;
	if (hit->pages)
		memcpy(o->u.c.pages, dest->pages, hit->pages * sizeof(void *));
	if (dest->row_n)
		memcpy(o->u.c.row, dest->row, dest->row_n * sizeof(struct iovec));
	uint32_t base = 0;
	for (uint32_t j = 0; j < hp->n; j++) {
		const struct sel_rv_layout *lay = &hp->node[j].m.layout;
		uint32_t skip = hit->node[j].skip;
		uint32_t w0 = skip < lay->tail ? sel_rv_page_window(lay, skip) : lay->page_windows;
		uint32_t w1 = j == hp->n - 1 ? lay->windows : lay->page_windows;
		o->u.c.base[j] = base;
		base += hit->node[j].tail - skip;
		for (uint32_t w = w0; w < w1; w++) {
			o->u.c.wins[o->u.c.n_wins].node = j;
			o->u.c.wins[o->u.c.n_wins++].w = w;
		}
	}
	return submit(r, o, id);
fail:
	if (rc == -ENOMEM)
		eos_fail(rc, "remote claim: out of memory");
	if (o)
		op_free(o); /* frees the hit */
	else
		sel_remote_hit_free(hit);
	return rc;
}

/* ---- The I/O thread ------------------------------------------------------ */

static void on_reply(struct sel_rn_cmd *c, redisReply *rep, int err)
{
	struct op *o = c->owner;
	if (o->kind == SEL_REMOTE_OP_PUT && (c->tag >> 32) < SEL_RN_BULK_LANES &&
	    o->u.p.wcmd[c->tag >> 32] == c)
		o->u.p.wcmd[c->tag >> 32] = NULL; /* done: nothing left to detach */
	if (!o->finished) {
		switch (o->kind) {
		case SEL_REMOTE_OP_PUT:
			put_reply(o, c->tag, rep, err);
			break;
		case SEL_REMOTE_OP_LOOKUP:
			lk_reply(o, c->tag, rep, err);
			break;
		case SEL_REMOTE_OP_CLAIM:
			cl_reply(o, c->tag, rep, err);
			break;
		}
	}
	op_unref(o);
}

static void start_puts(struct sel_remote *r)
{
	while (r->puts_running < PUT_PARALLEL && r->put_wait.head) {
		struct op *o = r->put_wait.head;
		ol_del(&r->put_wait, o);
		put_start(o);
	}
}

static void take_submissions(struct sel_remote *r, bool *closing, uint64_t *deadline)
{
	struct op_list got = {0};
	pthread_mutex_lock(&r->mu);
	got = r->sub;
	memset(&r->sub, 0, sizeof r->sub);
	*closing = r->closing;
	*deadline = r->close_deadline;
	pthread_mutex_unlock(&r->mu);
	while (got.head) {
		struct op *o = got.head;
		ol_del(&got, o);
		switch (o->kind) {
		case SEL_REMOTE_OP_PUT:
			ol_push(&r->put_wait, o);
			break;
		case SEL_REMOTE_OP_LOOKUP:
			if (*closing)
				finish(o, SEL_REMOTE_FAILED, -ECANCELED, NULL, 0);
			else
				lk_start(o);
			break;
		case SEL_REMOTE_OP_CLAIM:
			if (*closing)
				finish(o, SEL_REMOTE_FAILED, -ECANCELED, NULL, 0);
			else
				cl_start(o);
			break;
		}
	}
}

/* The network's last error as soon as it changes; the node list at most
 * every 50 ms. */
static void update_info(struct sel_remote *r, uint64_t now)
{
	sync_error(r);
	if (now - r->info_ns < 50 * MS)
		return;
	r->info_ns = now;
	char d[sizeof r->desc];
	sel_rn_describe(r->net, d, sizeof d);
	pthread_mutex_lock(&r->info_mu);
	memcpy(r->desc, d, sizeof d);
	pthread_mutex_unlock(&r->info_mu);
}

#if defined(SEL_SANITIZED) || defined(SEL_DEBUG_CHECKS)
/* Invariants of the I/O thread's state (INVARIANTS 2, 3): the window
 * budgets and bulk lanes in use are exactly those of the running ops,
 * every active op is unfinished and referenced, and the queues' counts
 * cover what is active.  0 or -EINVAL with a message. */
static int client_check(struct sel_remote *r)
{
	uint32_t put_wins = 0, claim_wins = 0, lanes = 0, running = 0, n[4] = {0};
	for (const struct op *o = r->active.head; o; o = o->next) {
		if (o->finished || o->refs < 1 || !o->started)
			return eos_fail(-EINVAL, "remote: active op %llu finished, unreferenced or "
					"not started", (unsigned long long)o->id);
		n[o->kind]++;
		if (o->kind == SEL_REMOTE_OP_PUT) {
			running++;
			put_wins += o->u.p.inflight;
			if (lanes & o->u.p.lanes)
				return eos_fail(-EINVAL, "remote: two puts on one bulk lane");
			lanes |= o->u.p.lanes;
		} else if (o->kind == SEL_REMOTE_OP_CLAIM) {
			claim_wins += o->u.c.inflight;
		}
	}
	for (const struct op *o = r->put_wait.head; o; o = o->next)
		n[SEL_REMOTE_OP_PUT]++;
	if (put_wins != r->put_wins || claim_wins != r->claim_wins || lanes != r->bulk_busy ||
	    running != r->puts_running || put_wins > r->put_budget || claim_wins > r->claim_budget)
		return eos_fail(-EINVAL, "remote: windows in flight %u/%u puts, %u/%u claims, lanes "
				"0x%x/0x%x, %u/%u puts running", put_wins, r->put_wins, claim_wins,
				r->claim_wins, lanes, r->bulk_busy, running, r->puts_running);
	pthread_mutex_lock(&r->mu);
	bool over = n[SEL_REMOTE_OP_PUT] > r->n_put || n[SEL_REMOTE_OP_LOOKUP] > r->n_lookup ||
		    n[SEL_REMOTE_OP_CLAIM] > r->n_claim || r->ring_n > r->ring_cap;
	pthread_mutex_unlock(&r->mu);
	if (over)
		return eos_fail(-EINVAL, "remote: more ops active than queued");
	return 0;
}
#endif

static void *io_main(void *arg)
{
	struct sel_remote *r = arg;
	eos_thread_name("sel-remote");
	(void)eos_thread_lower_priority(IO_NICE); /* below serving threads (design 2.12) */
	struct pollfd pfd[1 + 2 * (SEL_RC_NODES_MAX + SEL_RU_SEEDS_MAX)];
	int nfds = 0;
	bool closing = false, cancelled = false;
	uint64_t close_deadline = 0;
	int close_rc = 0;
	for (;;) {
		uint64_t now = eos_now_ns();
		take_submissions(r, &closing, &close_deadline);
		if (closing && !cancelled) {
			cancelled = true;
			for (struct op *o = r->active.head, *next; o; o = next) {
				next = o->next;
				if (o->kind != SEL_REMOTE_OP_PUT)
					finish(o, SEL_REMOTE_FAILED, -ECANCELED, NULL, 0);
			}
		}
		sel_rn_run(r->net, nfds ? pfd + 1 : NULL, nfds ? nfds - 1 : 0, now);
		update_info(r, now);
		now = eos_now_ns();
		for (struct op *o = r->active.head, *next; o; o = next) {
			next = o->next;
			if (o->deadline_ns && now >= o->deadline_ns) {
				char m[96];
				snprintf(m, sizeof m, "remote %s: deadline passed",
					 o->kind == SEL_REMOTE_OP_PUT ? "put"
					 : o->kind == SEL_REMOTE_OP_LOOKUP ? "lookup" : "claim");
				note_error(r, m);
				finish(o, SEL_REMOTE_FAILED, -ETIMEDOUT, NULL, 0);
			}
		}
		if (closing && close_deadline && now >= close_deadline) {
			while (r->active.head) {
				close_rc = -ETIMEDOUT;
				finish(r->active.head, SEL_REMOTE_FAILED, -ETIMEDOUT, NULL, 0);
			}
			while (r->put_wait.head) {
				close_rc = -ETIMEDOUT;
				finish(r->put_wait.head, SEL_REMOTE_FAILED, -ETIMEDOUT, NULL, 0);
			}
		}
		start_puts(r);
		pump_all(r, SEL_REMOTE_OP_PUT); /* budget freed by ops that finished early */
		pump_all(r, SEL_REMOTE_OP_CLAIM);
		update_info(r, now);
#if defined(SEL_SANITIZED) || defined(SEL_DEBUG_CHECKS)
		if (client_check(r)) { /* after every pass, in the sanitizer builds */
			fprintf(stderr, "selene: %s\n", sel_errmsg());
			abort();
		}
#endif
		if (closing && !r->active.head && !r->put_wait.head)
			break;
		/* Write what the ops just queued, then sleep. */
		sel_rn_run(r->net, NULL, 0, now);
		uint64_t next = UINT64_MAX;
		pfd[0].fd = r->wake_fd;
		pfd[0].events = POLLIN;
		pfd[0].revents = 0;
		nfds = 1 + sel_rn_pollfds(r->net, pfd + 1, (int)(sizeof pfd / sizeof pfd[0]) - 1,
					  &next);
		for (struct op *o = r->active.head; o; o = o->next)
			if (o->deadline_ns && o->deadline_ns < next)
				next = o->deadline_ns;
		if (closing && close_deadline && close_deadline < next)
			next = close_deadline;
		now = eos_now_ns();
		int timeout = next == UINT64_MAX ? 1000
			      : next <= now      ? 0
						 : (int)((next - now + MS - 1) / MS);
		if (timeout > 1000)
			timeout = 1000;
		int pr = poll(pfd, (nfds_t)nfds, timeout);
		if (pr < 0)
			nfds = 0;
		if (pr > 0 && (pfd[0].revents & POLLIN)) {
			uint64_t v;
			ssize_t rd = read(r->wake_fd, &v, sizeof v);
			(void)rd;
		}
	}
	sel_rn_close(r->net); /* every command's done runs: the ops' last references */
	r->net = NULL;
	pthread_mutex_lock(&r->mu);
	r->close_rc = close_rc;
	r->stopped = true;
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* ---- Open, poll, stats, close -------------------------------------------- */

int sel_remote_open(const struct sel_remote_config *cfg, sel_remote **out)
{
	*out = NULL;
	if (!cfg->ns)
		return eos_fail(-EINVAL, "remote: no namespace");
	struct sel_remote *r = calloc(1, sizeof *r);
	if (!r)
		return eos_fail(-ENOMEM, "remote: out of memory");
	r->wake_fd = r->event_fd = -1;
	pthread_mutex_init(&r->mu, NULL);
	pthread_mutex_init(&r->info_mu, NULL);
	r->cfg = *cfg;
	r->cfg.url = NULL;
	r->cfg.key = NULL;
	r->ns = cfg->ns;
	int rc = sel_ru_parse(cfg->url ? cfg->url : "", &r->url);
	if (rc)
		goto fail;
	if ((rc = sel_rv_keys_init(&r->keys, cfg->key, cfg->encrypt)))
		goto fail;
	sel_rv_names_init(&r->names, cfg->ns, &r->keys);
	r->cap = cfg->window_bytes ? cfg->window_bytes : SEL_RV_CAP_MAX;
	if (r->cap < SEL_RV_CAP_MIN || r->cap > SEL_RV_CAP_MAX) {
		rc = eos_fail(-EINVAL, "remote: window of %u bytes (expected %u..%u)", r->cap,
			      SEL_RV_CAP_MIN, SEL_RV_CAP_MAX);
		goto fail;
	}
	if (!r->cfg.put_queue)
		r->cfg.put_queue = 32;
	if (!r->cfg.lookup_queue)
		r->cfg.lookup_queue = 64;
	if (!r->cfg.claim_queue)
		r->cfg.claim_queue = 8;
	if (!r->cfg.lookup_timeout_ns)
		r->cfg.lookup_timeout_ns = SEC;
	if (!r->cfg.restore_setup_ns)
		r->cfg.restore_setup_ns = 10 * SEC;
	if (!r->cfg.restore_rate_bps)
		r->cfg.restore_rate_bps = 8ull << 20;
	if (!r->cfg.max_buckets)
		r->cfg.max_buckets = 4096;
	r->pool_size = sel_rv_value_bytes(&r->keys, r->cap) + 2 * SEL_RV_NAME_MAX + 128;
	r->put_budget = cfg->put_windows ? cfg->put_windows : PUT_WINDOWS_INFLIGHT;
	r->claim_budget = cfg->claim_windows ? cfg->claim_windows : CLAIM_WINDOWS_INFLIGHT;
	if (r->put_budget > SEL_RN_BULK_LANES)
		r->put_budget = SEL_RN_BULK_LANES; /* one window a bulk connection */
	if (r->claim_budget > 64)
		r->claim_budget = 64;
	r->ring_cap = r->cfg.put_queue + r->cfg.lookup_queue + r->cfg.claim_queue;
	r->ring = calloc(r->ring_cap, sizeof *r->ring);
	r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	r->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!r->ring || r->wake_fd < 0 || r->event_fd < 0) {
		rc = eos_fail(r->ring ? -errno : -ENOMEM, "remote: %s",
			      r->ring ? strerror(errno) : "out of memory");
		goto fail;
	}
	if ((rc = sel_rn_open(&r->url, &cfg->net, &r->net_ct, &r->net)))
		goto fail;
	sel_rn_describe(r->net, r->desc, sizeof r->desc);
	if ((rc = -pthread_create(&r->thread, NULL, io_main, r))) {
		eos_fail(rc, "remote: cannot start the I/O thread: %s", strerror(-rc));
		goto fail;
	}
	r->thread_started = true;
	*out = r;
	return 0;
fail:
	sel_remote_destroy(r);
	return rc;
}

int sel_remote_poll(sel_remote *r, struct sel_remote_event *ev, size_t cap)
{
	uint64_t v;
	ssize_t rd = read(r->event_fd, &v, sizeof v);
	(void)rd;
	pthread_mutex_lock(&r->mu);
	size_t n = 0;
	while (n < cap && r->ring_n) {
		ev[n] = r->ring[r->ring_head];
		r->ring_head = (r->ring_head + 1) % r->ring_cap;
		r->ring_n--;
		switch (ev[n].op) {
		case SEL_REMOTE_OP_PUT: r->n_put--; break;
		case SEL_REMOTE_OP_LOOKUP: r->n_lookup--; break;
		case SEL_REMOTE_OP_CLAIM: r->n_claim--; break;
		}
		n++;
	}
	bool more = r->ring_n > 0;
	pthread_mutex_unlock(&r->mu);
	if (more) {
		uint64_t one = 1;
		ssize_t w = write(r->event_fd, &one, sizeof one);
		(void)w;
	}
	return (int)n;
}

int sel_remote_wait_fd(sel_remote *r)
{
	return r->event_fd;
}

uint64_t sel_remote_rtt_ns(sel_remote *r)
{
	return atomic_load_explicit(&r->net_ct.rtt_ns, memory_order_relaxed);
}

uint64_t sel_remote_grace_ns(sel_remote *r)
{
	uint64_t rtt = sel_remote_rtt_ns(r);
	if (!rtt)
		return 250 * MS;
	uint64_t g = 4 * rtt;
	return g < 2 * MS ? 2 * MS : g > 250 * MS ? 250 * MS : g;
}

uint64_t sel_remote_claim_budget_ns(const sel_remote *r, uint64_t bytes)
{
	uint64_t rate = r->cfg.restore_rate_bps;
	return r->cfg.restore_setup_ns + bytes / rate * SEC + (bytes % rate) * SEC / rate;
}

const char *sel_remote_state_name(enum sel_rn_state s)
{
	switch (s) {
	case SEL_RN_CONNECTING: return "connecting";
	case SEL_RN_UP: return "up";
	case SEL_RN_DEGRADED: return "degraded";
	case SEL_RN_DOWN: return "down";
	}
	return "?";
}

void sel_remote_stats(sel_remote *r, struct sel_remote_stats *s)
{
	memset(s, 0, sizeof *s);
	s->lookups = load(&r->ct.lookups);
	s->hits = load(&r->ct.hits);
	s->lookup_errors = load(&r->ct.lookup_errors);
	s->lookups_refused = load(&r->ct.lookups_refused);
	s->puts = load(&r->ct.puts);
	s->stored = load(&r->ct.stored);
	s->present = load(&r->ct.present);
	s->put_failures = load(&r->ct.put_failures);
	s->skipped = load(&r->ct.skipped);
	s->claims = load(&r->ct.claims);
	s->claimed = load(&r->ct.claimed);
	s->claim_failures = load(&r->ct.claim_failures);
	s->claims_refused = load(&r->ct.claims_refused);
	s->bytes_in = load(&r->ct.bytes_in);
	s->bytes_out = load(&r->ct.bytes_out);
	s->auth_failures = load(&r->ct.auth_failures);
	s->corrupt = load(&r->ct.corrupt);
	s->dropped = load(&r->ct.dropped);
	struct sel_rn_counters *n = &r->net_ct;
	s->wire_in = load(&n->wire_in);
	s->wire_out = load(&n->wire_out);
	s->moved = load(&n->moved);
	s->ask = load(&n->ask);
	s->tryagain = load(&n->tryagain);
	s->reconnects = load(&n->reconnects);
	s->connect_failures = load(&n->connect_failures);
	s->stalls = load(&n->stalls);
	s->map_refreshes = load(&n->map_refreshes);
	s->nodes = atomic_load_explicit(&n->nodes, memory_order_relaxed);
	s->nodes_up = atomic_load_explicit(&n->nodes_up, memory_order_relaxed);
	s->state = (enum sel_rn_state)atomic_load_explicit(&n->state, memory_order_relaxed);
	s->rtt_ns = load(&n->rtt_ns);
	s->grace_ns = sel_remote_grace_ns(r);
	for (int i = 0; i < SEL_REMOTE_RTT_BUCKETS; i++)
		s->rtt_hist[i] = load(&n->rtt_hist[i]);
	pthread_mutex_lock(&r->mu);
	s->queued_puts = r->n_put;
	s->queued_lookups = r->n_lookup;
	s->queued_claims = r->n_claim;
	pthread_mutex_unlock(&r->mu);
}

void sel_remote_describe(sel_remote *r, char *buf, size_t len)
{
	pthread_mutex_lock(&r->info_mu);
	snprintf(buf, len, "%s", r->desc);
	pthread_mutex_unlock(&r->info_mu);
}

void sel_remote_last_error(sel_remote *r, char *buf, size_t len)
{
	pthread_mutex_lock(&r->info_mu);
	snprintf(buf, len, "%s", r->last_error);
	pthread_mutex_unlock(&r->info_mu);
}

int sel_remote_close(sel_remote *r, uint64_t deadline_ns)
{
	pthread_mutex_lock(&r->mu);
	if (!r->closing) {
		r->closing = true;
		r->close_deadline = deadline_ns;
	}
	bool join = r->thread_started && !r->joined;
	r->joined = true;
	pthread_mutex_unlock(&r->mu);
	uint64_t one = 1;
	if (r->wake_fd >= 0) {
		ssize_t w = write(r->wake_fd, &one, sizeof one);
		(void)w;
	}
	if (join)
		pthread_join(r->thread, NULL);
	return r->close_rc;
}

void sel_remote_destroy(sel_remote *r)
{
	if (!r)
		return;
	if (r->thread_started)
		sel_remote_close(r, 0);
	if (r->net)
		sel_rn_close(r->net);
	/* Events never polled may carry hits: they are the caller's only once
	 * polled, so free them here. */
	for (uint32_t i = 0; r->ring && i < r->ring_n; i++)
		sel_remote_hit_free(r->ring[(r->ring_head + i) % r->ring_cap].hit);
	while (r->pool) {
		struct pool_buf *b = r->pool;
		r->pool = b->next;
		free(b);
	}
	free(r->ring);
	if (r->wake_fd >= 0)
		close(r->wake_fd);
	if (r->event_fd >= 0)
		close(r->event_fd);
	sel_rv_keys_wipe(&r->keys);
	pthread_mutex_destroy(&r->mu);
	pthread_mutex_destroy(&r->info_mu);
	free(r);
}
