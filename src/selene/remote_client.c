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
#include "remote_client_int.h"


static void count(_Atomic uint64_t *c, uint64_t v)
{
	atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static uint64_t load(_Atomic uint64_t *c) { return atomic_load_explicit(c, memory_order_relaxed); }

void rmt_note_error(struct sel_remote *r, const char *msg)
{
	pthread_mutex_lock(&r->info_mu);
	snprintf(r->last_error, sizeof r->last_error, "%s", msg);
	pthread_mutex_unlock(&r->info_mu);
}

int32_t rmt_slot_of(const char *key, int len);

/* A value of record key failed verification: count it by kind, and for a
 * value that is bad in itself (not one of a rewrite in progress) delete
 * the record's manifest, so lookups stop finding it and the next put of
 * the record writes it again.  Deleting is no new power: whoever could
 * write the bad value could delete it. */
void rmt_refused(struct sel_remote *r, int rc, const sel_key *key)
{
	if (rc == -EBADMSG)
		count(&r->ct.auth_failures, 1);
	else if (rc != -ESTALE)
		count(&r->ct.corrupt, 1);
	rmt_note_error(r, eos_errmsg());
	if (rc != -EBADMSG && rc != SEL_ECORRUPT && rc != SEL_EFORMAT)
		return;
	char k[SEL_RV_NAME_MAX];
	int kl = sel_rv_manifest_name(&r->names, key, k);
	const char *argv[] = {"DEL", k};
	size_t lens[] = {3, (size_t)kl};
	struct sel_rn_cmd *c = sel_rn_cmd_argv(2, argv, lens);
	if (!c)
		return;
	c->slot = rmt_slot_of(k, kl);
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

void rmt_op_free(struct op *o)
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

void rmt_op_unref(struct op *o)
{
	if (--o->refs == 0)
		rmt_op_free(o);
}

void rmt_sync_error(struct sel_remote *r)
{
	uint64_t errors;
	const char *e = sel_rn_last_error(r->net, &errors);
	if (errors != r->net_errors) {
		r->net_errors = errors;
		rmt_note_error(r, e);
	}
}

/* Post o's event and let its commands drain. */
void rmt_finish(struct op *o, enum sel_remote_result res, int err, sel_remote_hit *hit,
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
		count(res == SEL_REMOTE_STORED    ? &r->ct.stored
		      : res == SEL_REMOTE_PRESENT ? &r->ct.present
						  : &r->ct.put_failures,
		      1);
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
	} else if (o->kind == SEL_REMOTE_OP_CLAIM)
		r->claim_wins -= o->u.c.inflight;
	if (err && r->net)
		rmt_sync_error(r); /* readable before the event is */
	post(r, &ev);
	rmt_op_unref(o);
}

int rmt_reply_error(struct sel_remote *r, const redisReply *rep, const char *what)
{
	char m[256];
	snprintf(m, sizeof m, "%s: Redis answered: %.*s", what,
		 (int)(rep->len > 200 ? 200 : rep->len), rep->str);
	rmt_note_error(r, m);
	return -EREMOTEIO;
}

/* ---- Commands ------------------------------------------------------------ */

void rmt_on_reply(struct sel_rn_cmd *c, redisReply *rep, int err);

void rmt_issue(struct op *o, struct sel_rn_cmd *c, uint64_t tag, int32_t slot,
	       enum sel_rn_lane lane, bool rtt)
{
	c->done = rmt_on_reply;
	c->owner = o;
	c->tag = tag;
	c->cancel = &o->cancel;
	c->slot = slot;
	c->lane = lane;
	c->rtt = rtt;
	o->refs++;
	sel_rn_submit(o->r->net, c);
}

int rmt_issue_argv(struct op *o, uint64_t tag, int32_t slot, enum sel_rn_lane lane, bool rtt,
		   int argc, const char **argv, const size_t *lens)
{
	struct sel_rn_cmd *c = sel_rn_cmd_argv(argc, argv, lens);
	if (!c)
		return -ENOMEM;
	rmt_issue(o, c, tag, slot, lane, rtt);
	return 0;
}

int32_t rmt_slot_of(const char *key, int len) { return (int32_t)sel_rc_key_slot(key, (size_t)len); }

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
struct sel_rn_cmd *rmt_set_value_cmd(struct sel_remote *r, const char *key, size_t kl,
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
struct sel_rn_cmd *rmt_set_window_cmd(struct sel_remote *r, const char *key, size_t kl,
				      const struct sel_rv_hdr *h, const struct iovec *iov,
				      uint32_t n, uint64_t px_ms, int *err)
{
	if (r->keys.encrypt)
		return rmt_set_value_cmd(r, key, kl, h, iov, n, px_ms, err);
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

void rmt_value_want(const struct sel_remote *r, uint8_t kind, const sel_key *key, uint32_t w,
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

void rmt_put_pump(struct op *o);
void rmt_cl_pump(struct op *o);

/* Hand a built op to the I/O thread: its queue's bound, an id, the
 * submission list, a wake-up.  On failure o is freed (with a claim's hit)
 * and nothing else changes.  The lock guards only these links and counts. */
int rmt_submit(struct sel_remote *r, struct op *o, uint64_t *id)
{
	static const char *const what[] = {"", "put", "lookup", "claim"};
	uint32_t *queued = o->kind == SEL_REMOTE_OP_PUT      ? &r->n_put
			   : o->kind == SEL_REMOTE_OP_LOOKUP ? &r->n_lookup
							     : &r->n_claim;
	uint32_t bound = o->kind == SEL_REMOTE_OP_PUT      ? r->cfg.put_queue
			 : o->kind == SEL_REMOTE_OP_LOOKUP ? r->cfg.lookup_queue
							   : r->cfg.claim_queue;
	const char *name = what[o->kind];
	o->submit_ns = eos_now_ns();
	pthread_mutex_lock(&r->mu);
	if (r->closing || *queued >= bound) {
		bool closing = r->closing;
		pthread_mutex_unlock(&r->mu);
		enum sel_remote_op kind = o->kind;
		rmt_op_free(o);
		if (closing)
			return eos_fail(SEL_ESTOPPED, "remote %s: the client is closing", name);
		count(kind == SEL_REMOTE_OP_PUT      ? &r->ct.skipped
		      : kind == SEL_REMOTE_OP_LOOKUP ? &r->ct.lookups_refused
						     : &r->ct.claims_refused,
		      1);
		return eos_fail(-EAGAIN, "remote %s: the queue of %u is full", name, bound);
	}
	(*queued)++;
	uint64_t my_id = o->id = ++r->next_id; /* o is the I/O thread's once linked */
	enum sel_remote_op kind = o->kind;
	ol_push(&r->sub, o);
	pthread_mutex_unlock(&r->mu);
	count(kind == SEL_REMOTE_OP_PUT      ? &r->ct.puts
	      : kind == SEL_REMOTE_OP_LOOKUP ? &r->ct.lookups
					     : &r->ct.claims,
	      1);
	uint64_t one = 1;
	ssize_t w = write(r->wake_fd, &one, sizeof one);
	(void)w;
	*id = my_id;
	return 0;
}

/* Give window budget freed by a reply or a finished op to the active ops
 * of kind, oldest first. */
void rmt_pump_all(struct sel_remote *r, enum sel_remote_op kind)
{
	for (struct op *o = r->active.head, *next; o; o = next) {
		next = o->next;
		if (o->kind != kind || o->finished)
			continue;
		if (kind == SEL_REMOTE_OP_PUT && o->u.p.step == P_WINDOWS)
			rmt_put_pump(o);
		else if (kind == SEL_REMOTE_OP_CLAIM)
			rmt_cl_pump(o);
		if ((kind == SEL_REMOTE_OP_PUT ? r->put_wins >= r->put_budget
					       : r->claim_wins >= r->claim_budget))
			break;
	}
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
	r->pool_size = sel_rv_value_bytes(&r->keys, r->cap) + 2 * (size_t)SEL_RV_NAME_MAX + 128;
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
	if ((rc = -pthread_create(&r->thread, NULL, rmt_io_main, r))) {
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

int sel_remote_wait_fd(sel_remote *r) { return r->event_fd; }

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
	s->rtt_sum_ns = load(&n->rtt_sum_ns);
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
