/*
 * pool_client.c - an instance's connection to the pool manager: attach and
 * the arena mapping, the I/O thread, reattach, and the worker-side state of
 * tickets, claims, puts, exports and leases (design 2.15; pool_client.h;
 * docs/pool.md).
 *
 * DESIGN
 *
 * Two sides share two queues and nothing else.  The worker side (every call
 * in pool_client.h but attach, close and destroy) owns the tables of
 * tickets, pending claims and puts and live leases, encodes each submission
 * into a frame and links it onto the outbound queue; sel_pool_poll takes the
 * inbound queue's decoded messages, checks each against those tables and
 * turns it into events.  The I/O thread owns the socket: it sends the head
 * of the outbound queue (the worker only links at the tail, so the head's
 * bytes are read without the lock), reads frames, decodes them strictly and
 * links them onto the inbound queue.  The mutex covers linking and
 * unlinking only.  Two eventfds wake each side.
 *
 * Sessions are numbered (epochs).  The I/O thread tags what it reads with
 * its session's epoch and sends only frames tagged with the current one;
 * the worker learns of a new session through a queued ATTACHED marker, so a
 * frame encoded for a lost session is never sent on a new one and a message
 * of a lost session is never applied to the new one's tables.
 *
 * A lost connection: the I/O thread queues LOST and waits.  The worker, when
 * it polls LOST, fails every ticket, pending claim and pending put, marks
 * every live lease failed (GONE) and reports it; once the last lease of
 * that session has ended (the caller's copies drained) it tells the I/O
 * thread, which only then reconnects, with the DRAINED flag, so the manager
 * may free what it held for the old session at once.  A hello of another
 * generation or another arena inode disables sharing for good.
 *
 * Bounds: the outbound queue holds at most out_bytes of submissions (ends
 * of leases -- release, commit, export done -- are always accepted: they
 * are bounded by the leases, and refusing them would strand windows); the
 * inbound queue at most in_bytes of frames, beyond which the I/O thread
 * stops reading until the worker polls.
 *
 * INVARIANTS
 *   1. A lease is in the lease table from its grant until its end; its
 *      windows passed sel_pool_windows_check for exactly what was asked.
 *   2. The I/O thread reconnects only when no lease of the lost session is
 *      left (drained == lost epoch).
 *   3. Only frames whose epoch is the I/O thread's session go out.
 */
#include "pool_client_int.h"

/* ---- small helpers ------------------------------------------------------------------ */

void pc_wake(int fd)
{
	uint64_t one = 1;
	ssize_t r = write(fd, &one, sizeof one);
	(void)r;
}

void pc_drain_fd(int fd)
{
	uint64_t v;
	ssize_t r = read(fd, &v, sizeof v);
	(void)r;
}

static int evq_push(struct evq *q, const struct sel_pool_event *e)
{
	if (q->n == q->cap) {
		size_t nc = q->cap ? q->cap * 2 : 64;
		struct sel_pool_event *v = malloc(nc * sizeof *v);
		if (!v)
			return -ENOMEM;
		for (size_t i = 0; i < q->n; i++)
			v[i] = q->v[(q->head + i) % q->cap];
		free(q->v);
		q->v = v;
		q->cap = nc;
		q->head = 0;
	}
	q->v[(q->head + q->n) % q->cap] = *e;
	q->n++;
	return 0;
}

void pc_emit(sel_pool_client *c, enum sel_pool_event_type type, uint32_t reason, uint64_t request,
	     const sel_key *key, struct sel_pool_lease *l, sel_pool_ticket *t)
{
	struct sel_pool_event e = {
		.type = type, .reason = reason, .request = request, .lease = l, .ticket = t};
	if (key)
		e.key = *key;
	if (evq_push(&c->evq, &e))
		c->st.queue_full++; /* out of memory: the event is lost, and counted */
}

/* Encode m and queue it for the current session.  force: ends of leases,
 * accepted past the bound. */
int pc_submit(sel_pool_client *c, const struct sel_pool_msg *m, bool force)
{
	if (c->state != SEL_POOL_ATTACHED)
		return eos_fail(-ENOTCONN, "pool %s: %s", c->address,
				c->state == SEL_POOL_DISABLED ? "sharing is disabled" : "detached");
	int64_t n = sel_pool_encoded_size(m);
	if (n < 0)
		return (int)n;
	pthread_mutex_lock(&c->mu);
	bool full = !force && c->out_bytes + (uint64_t)n > c->out_cap;
	pthread_mutex_unlock(&c->mu);
	if (full) {
		c->st.queue_full++;
		return eos_fail(-EAGAIN, "pool %s: the send queue is full (%" PRIu64 " bytes)",
				c->address, c->out_cap);
	}
	struct qframe *f = malloc(sizeof *f + (size_t)n);
	if (!f)
		return eos_fail(-ENOMEM, "pool: out of memory for a frame");
	f->next = NULL;
	f->epoch = c->epoch;
	f->len = (size_t)n;
	int64_t w = sel_pool_encode(m, f->data, (size_t)n);
	if (w != n) {
		free(f);
		return w < 0 ? (int)w : eos_fail(-EIO, "pool: frame size changed while encoding");
	}
	pthread_mutex_lock(&c->mu);
	if (c->out_tail)
		c->out_tail->next = f;
	else
		c->out_head = f;
	c->out_tail = f;
	c->out_bytes += f->len;
	pthread_mutex_unlock(&c->mu);
	c->st.frames_out++;
	pc_wake(c->wake_io);
	return 0;
}
/* ---- attach, close, destroy -------------------------------------------------------------- */

static void read_machine_id(const char *path, char *out, size_t cap)
{
	out[0] = '\0';
	int fd = open(path ? path : "/etc/machine-id", O_RDONLY | O_CLOEXEC);
	if (fd < 0 && !path)
		fd = open("/var/lib/dbus/machine-id", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	ssize_t n = read(fd, out, cap - 1);
	close(fd);
	if (n < 0)
		n = 0;
	out[n] = '\0';
	while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '))
		out[--n] = '\0';
}

int sel_pool_attach(const struct sel_pool_client_config *cfg, sel_pool_client **out)
{
	*out = NULL;
	if (!cfg || !cfg->address || !cfg->geometry)
		return eos_fail(-EINVAL, "pool: no address or no geometry");
	const char *path = cfg->address;
	if (!strncmp(path, "unix:", 5))
		path += 5;
	else if (strstr(path, "://") || !strncmp(path, "tcp:", 4))
		return eos_fail(-EINVAL,
				"pool address '%s': only unix:PATH (a manager on this host) is "
				"supported",
				cfg->address);
	sel_pool_client *c = calloc(1, sizeof *c);
	if (!c)
		return eos_fail(-ENOMEM, "pool: out of memory");
	c->fd = -1;
	c->wake_io = c->wake_worker = -1;
	pthread_mutex_init(&c->mu, NULL);
	int rc = 0;
	if (!*path || strlen(path) >= sizeof c->path) {
		rc = eos_fail(-EINVAL,
			      "pool address '%s': the socket path is empty or longer than %zu "
			      "bytes",
			      cfg->address, sizeof c->path - 1);
		goto fail;
	}
	snprintf(c->path, sizeof c->path, "%s", path);
	snprintf(c->address, sizeof c->address, "unix:%s", path);
	c->g = cfg->geometry;
	c->hello_timeout_ns = cfg->hello_timeout_ns ? cfg->hello_timeout_ns : 10 * S_NS;
	c->out_cap = cfg->out_bytes ? cfg->out_bytes : DEFAULT_OUT;
	c->in_cap = cfg->in_bytes ? cfg->in_bytes : DEFAULT_IN;
	c->setup_ms = cfg->setup_ms ? cfg->setup_ms : SEL_POOL_SETUP_MS;
	snprintf(c->explicit_id, sizeof c->explicit_id, "%s",
		 cfg->instance_id ? cfg->instance_id : "");
	snprintf(c->listen, sizeof c->listen, "%s", cfg->listen ? cfg->listen : "");
	memcpy(c->core_identity, cfg->core_identity, SEL_IDENTITY_BYTES);
	read_machine_id(cfg->machine_id_path, c->machine_id, sizeof c->machine_id);
	if ((rc = sel_slot_layout_init(&c->lay, c->g)) ||
	    (rc = sel_record_layout_init(&c->rl, c->g)))
		goto fail;
	memcpy(c->scope.identity, cfg->identity, SEL_IDENTITY_BYTES);
	sel_layout_fingerprint(c->g, c->scope.fingerprint);
	c->scope.page_tokens = c->g->page_tokens;
	c->scope.ranks = c->g->ranks;
	c->scope.slot_bytes = c->lay.slot_bytes;
	c->scope.row_slots = c->lay.row_slots;
	c->scope.table_bytes = c->rl.table_bytes;
	c->scope.table = c->rl.table;
	if (c->scope.table_bytes > SEL_POOL_TABLE_MAX) {
		rc = eos_fail(SEL_EOVERSIZE,
			      "pool: the rank table of %u bytes is over the protocol's %u",
			      c->scope.table_bytes, SEL_POOL_TABLE_MAX);
		goto fail;
	}
	c->rbuf = malloc(SEL_POOL_FRAME_HEADER + SEL_POOL_FRAME_MAX);
	c->wake_io = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->wake_worker = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!c->rbuf || c->wake_io < 0 || c->wake_worker < 0 || eos_hmap_init(&c->tickets) ||
	    eos_hmap_init(&c->pendings) || eos_hmap_init(&c->leases)) {
		rc = eos_fail(-ENOMEM, "pool: out of memory or descriptors");
		goto fail;
	}
	/* Silent retries until the deadline (design 2.15 startup). */
	uint64_t deadline = eos_now_ns() + c->hello_timeout_ns;
	struct hs h;
	for (;;) {
		rc = pc_handshake(c, deadline, false, &h);
		if (rc != -EAGAIN)
			break;
		if (eos_now_ns() + BACKOFF_MIN_NS >= deadline) {
			rc = eos_fail(-ETIMEDOUT,
				      "pool %s: no manager answered within %" PRIu64 " s (%s)",
				      c->address, (uint64_t)(c->hello_timeout_ns / S_NS),
				      eos_errmsg());
			break;
		}
		eos_sleep_ns(BACKOFF_MIN_NS);
	}
	if (rc)
		goto fail;
	rc = pc_map_arena(c, &h);
	close(h.arena_fd);
	if (rc) {
		close(h.fd);
		goto fail;
	}
	if (c->scope.slot_bytes > c->arena_bytes - c->hello.data_start)
		snprintf(c->warning, sizeof c->warning,
			 "pool %s: the arena (%" PRIu64 " bytes) cannot "
			 "hold one page record of %" PRIu64 " bytes",
			 c->address, c->arena_bytes, c->scope.slot_bytes);
	c->fd = h.fd;
	c->io_epoch = c->epoch = 1;
	c->state = SEL_POOL_ATTACHED;
	c->st.sessions = 1;
	c->next_id = 1;
	if ((rc = pthread_create(&c->io, NULL, pc_io_main, c))) {
		rc = eos_fail(-rc, "pool: cannot start the I/O thread: %s", strerror(rc));
		goto fail;
	}
	c->io_started = true;
	*out = c;
	return 0;
fail:
	sel_pool_destroy(c);
	return rc;
}

int sel_pool_close(sel_pool_client *c)
{
	if (!c || c->closed)
		return 0;
	c->closed = true;
	atomic_store(&c->stop, true);
	if (c->io_started) {
		pc_wake(c->wake_io);
		pthread_join(c->io, NULL);
		c->io_started = false;
	}
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	c->state = c->state == SEL_POOL_DISABLED ? SEL_POOL_DISABLED : SEL_POOL_DETACHED;
	return 0;
}

void pc_lease_free(struct lease *l)
{
	sel_pool_msg_free(&l->msg);
	free(l->slots);
	free(l);
}

void sel_pool_destroy(sel_pool_client *c)
{
	if (!c)
		return;
	sel_pool_close(c);
	for (size_t i = 0; c->leases.b && i <= c->leases.mask; i++)
		for (struct eos_hnode *x = c->leases.b[i], *nx; x; x = nx) {
			nx = x->next;
			pc_lease_free((struct lease *)((char *)x - offsetof(struct lease, hn)));
		}
	for (size_t i = 0; c->pendings.b && i <= c->pendings.mask; i++)
		for (struct eos_hnode *x = c->pendings.b[i], *nx; x; x = nx) {
			nx = x->next;
			free((char *)x - offsetof(struct pending, hn));
		}
	for (size_t i = 0; c->tickets.b && i <= c->tickets.mask; i++)
		for (struct eos_hnode *x = c->tickets.b[i], *nx; x; x = nx) {
			nx = x->next;
			sel_pool_ticket *t =
				(sel_pool_ticket *)((char *)x - offsetof(sel_pool_ticket, hn));
			t->linked = false; /* the caller still owns it; it only loses its answer */
		}
	eos_hmap_free(&c->leases);
	eos_hmap_free(&c->pendings);
	eos_hmap_free(&c->tickets);
	while (c->out_head) {
		struct qframe *f = c->out_head;
		c->out_head = f->next;
		free(f);
	}
	while (c->in_head) {
		struct qmsg *q = c->in_head;
		c->in_head = q->next;
		sel_pool_msg_free(&q->m);
		free(q);
	}
	free(c->evq.v);
	if (c->arena)
		munmap(c->arena, (size_t)c->arena_bytes);
	if (c->wake_io >= 0)
		close(c->wake_io);
	if (c->wake_worker >= 0)
		close(c->wake_worker);
	free(c->rbuf);
	sel_record_layout_free(&c->rl);
	sel_slot_layout_free(&c->lay);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* ---- accessors ------------------------------------------------------------------------------ */

enum sel_pool_state sel_pool_state(const sel_pool_client *c) { return c->state; }

const char *sel_pool_state_name(enum sel_pool_state s)
{
	return s == SEL_POOL_ATTACHED   ? "attached"
	       : s == SEL_POOL_DETACHED ? "detached"
					: "disabled";
}

const struct sel_pool_m_hello *sel_pool_hello(const sel_pool_client *c) { return &c->hello; }
const uint8_t *sel_pool_instance(const sel_pool_client *c) { return c->instance; }
const char *sel_pool_warning(const sel_pool_client *c) { return c->warning; }
uint64_t sel_pool_slot_bytes(const sel_pool_client *c) { return c->lay.slot_bytes; }
uint32_t sel_pool_row_slots(const sel_pool_client *c) { return c->lay.row_slots; }
int sel_pool_wait_fd(const sel_pool_client *c) { return c->wake_worker; }
void sel_pool_stats(const sel_pool_client *c, struct sel_pool_client_stats *out) { *out = c->st; }

void *sel_pool_arena(const sel_pool_client *c, uint64_t *bytes)
{
	if (bytes)
		*bytes = c->arena_bytes;
	return c->arena;
}

uint64_t sel_pool_arena_resident(const sel_pool_client *c) { return c->arena_resident; }

uint64_t sel_pool_xfer_parts(const sel_pool_client *c, struct sel_xfer_part *parts)
{
	for (uint32_t r = 0; r < c->lay.ranks; r++)
		parts[r] = (struct sel_xfer_part){
			(uint64_t)(uintptr_t)c->arena + c->lay.share_off[r], c->lay.slot_bytes};
	return c->arena_bytes / c->lay.slot_bytes;
}

void *sel_pool_slot_addr(const sel_pool_client *c, uint32_t s)
{
	return c->arena + (uint64_t)s * c->lay.slot_bytes;
}

/* ---- tables ---------------------------------------------------------------------------------- */
