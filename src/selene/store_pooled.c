/*
 * store_pooled.c - the pooled store's life: open (attach), the helper
 * thread, poll, the wait fd, stats, close and destroy (store_pooled.h has
 * the design; lookups and restores are in store_pooled_lookup.c, puts in
 * store_pooled_put.c).
 */
#include "store_pooled.h"

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "eos.h"
#include "pool_budget.h"
#include "store_common.h"

static int sp_poll(sel_store *s, sel_event *ev, size_t cap);
static void sp_stats(sel_store *s, sel_stats *out);
static int sp_wait_fd(sel_store *s);
static int sp_close(sel_store *s, uint64_t deadline_ns);
static void sp_destroy(sel_store *s);
static void sp_describe(sel_store *s, sel_store_info *out);

/* Overlapped restores (issue 18): a pool hit's digests come with its
 * tail's fetch (store_pooled_fetch.c); a local tier's hit is its own. */
static int sp_page_digests(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t n,
			   uint64_t *out)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (hit->tier == SEL_TIER_POOL || !in)
		return eos_fail(-ENOTSUP, "pooled store: a pool hit's digests come with its fetch");
	return sel_store_page_digests(in, hit, first, n, out);
}

/* The local tiers' record; the pool's records are the manager's to drop. */
static int sp_drop(sel_store *s, const sel_key *key)
{
	sel_store *in = sel_wrap_of(s)->inner;
	return in ? sel_store_drop(in, key)
		  : eos_fail(-ENOTSUP, "pooled store: no local tier to drop from");
}

static const struct sel_store_ops sp_ops = {
	.version = SEL_STORE_OPS_VERSION,
	.name = "pooled",
	.lookup = sp_lookup,
	.put = sp_put,
	.fetch = sp_fetch,
	.poll = sp_poll,
	.evicted = sp_evicted,
	.touch = sel_wrap_touch,
	.stats = sp_stats,
	.wait_fd = sp_wait_fd,
	.close = sp_close,
	.destroy = sp_destroy,
	.describe = sp_describe,
	.evictions_lost = sp_evictions_lost,
	.flush = sel_wrap_flush,
	.page_digests = sp_page_digests,
	.drop = sp_drop,
	.fetch_sums = true, /* pool hits: sp_fetch; others: the inner store's answer */
};

const char *sel_pool_fail_name(sel_pool_fail f)
{
	switch (f) {
	case SEL_POOL_FAIL_REFUSED: return "refused";
	case SEL_POOL_FAIL_TIMEOUT: return "timeout";
	case SEL_POOL_FAIL_GONE: return "gone";
	case SEL_POOL_FAIL_MISMATCH: return "mismatch";
	case SEL_POOL_FAIL_CORRUPT: return "corrupt";
	case SEL_POOL_FAIL_COPY: return "copy";
	case SEL_POOL_FAILS: break;
	}
	return "unknown";
}

/* ---- the engine's event queue --------------------------------------------------------------- */

int sp_emit(struct sel_pooled *p, const sel_event *ev)
{
	if (p->n_evq == p->cap_evq) {
		uint32_t cap = p->cap_evq ? 2 * p->cap_evq : 64;
		sel_event *q = realloc(p->evq, (size_t)cap * sizeof *q);
		if (!q)
			return eos_fail(-ENOMEM, "pooled store: out of memory");
		p->evq = q;
		p->cap_evq = cap;
	}
	p->evq[p->n_evq++] = *ev;
	return 0;
}

/* ---- the grace timer ------------------------------------------------------------------------- */

void sp_arm_timer(struct sel_pooled *p, uint64_t at)
{
	uint64_t now = eos_now_ns();
	/* An armed timer that fires no later is enough; one that fired
	 * already (not yet drained) is rearmed for the new deadline. */
	if (p->tfd < 0 || (p->timer_armed && p->timer_at <= at && p->timer_at > now))
		return;
	uint64_t d = at > now ? at - now : 1000;
	struct itimerspec its = {.it_value = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)}};
	if (timerfd_settime(p->tfd, 0, &its, NULL) == 0) {
		p->timer_armed = true;
		p->timer_at = at;
	}
}

static void sp_drain_timer(struct sel_pooled *p)
{
	uint64_t v;
	if (p->timer_armed && eos_now_ns() >= p->timer_at) {
		if (read(p->tfd, &v, sizeof v) < 0) {
			/* not expired yet by the kernel's clock: keep it armed */
			return;
		}
		p->timer_armed = false;
	}
}

/* ---- the helper thread (checksums: never on the worker) -------------------------------------- */

void sp_helper_submit(struct sel_pooled *p, struct sp_hjob *j)
{
	j->next = NULL;
	pthread_mutex_lock(&p->mu);
	if (p->hq_tail)
		p->hq_tail->next = j;
	else
		p->hq = j;
	p->hq_tail = j;
	p->h_out++;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* Best effort: this helper on its own share of the process's CPUs (every
 * SP_HELPERS-th of them, from its index on), so that no two helpers share
 * a core and a restore's windows run side by side.  With fewer CPUs than
 * helpers, or a kernel that refuses, the scheduler places them. */
static void sp_helper_spread(struct sel_pooled *p)
{
	uint32_t i = __atomic_fetch_add(&p->th_next, 1, __ATOMIC_RELAXED) % SP_HELPERS;
	cpu_set_t all, mine;
	if (pthread_getaffinity_np(pthread_self(), sizeof all, &all) ||
	    CPU_COUNT(&all) < SP_HELPERS)
		return;
	CPU_ZERO(&mine);
	for (int cpu = 0, k = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, &all) && k++ % SP_HELPERS == (int)i)
			CPU_SET(cpu, &mine);
	(void)pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
}

static void *sp_helper_main(void *arg)
{
	struct sel_pooled *p = arg;
	sp_helper_spread(p);
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->hq && !p->th_stop)
			pthread_cond_wait(&p->cv, &p->mu);
		struct sp_hjob *j = p->hq;
		if (!j)
			break;
		p->hq = j->next;
		if (!p->hq)
			p->hq_tail = NULL;
		pthread_mutex_unlock(&p->mu);
		if (j->restore)
			j->status = sp_restore_window(p, j);
		else if (j->sums)
			j->status = sp_head_sums(p, j);
		else if (j->verify)
			j->status =
				sel_pool_lease_verify_part(p->pc, j->lease, j->first, j->n, j->row);
		else {
			if (j->src || j->files)
				sp_cascade_copy(p, j);
			sel_pool_lease_checksums(p->pc, j->lease, j->cksums, &j->row_cksum);
		}
		pthread_mutex_lock(&p->mu);
		j->next = p->hdone;
		p->hdone = j;
		(void)eventfd_write(p->hfd, 1);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void sp_take_helped(struct sel_pooled *p)
{
	uint64_t v;
	(void)eventfd_read(p->hfd, &v);
	pthread_mutex_lock(&p->mu);
	struct sp_hjob *j = p->hdone, *rev = NULL;
	p->hdone = NULL;
	pthread_mutex_unlock(&p->mu);
	while (j) { /* oldest first */
		struct sp_hjob *n = j->next;
		j->next = rev;
		rev = j;
		j = n;
	}
	for (j = rev; j; j = rev) {
		rev = j->next;
		pthread_mutex_lock(&p->mu);
		p->h_out--;
		pthread_mutex_unlock(&p->mu);
		if (!sp_fetch_helped(p, j) && !sp_put_helped(p, j))
			(void)sp_export_helped(p, j);
	}
}

/* ---- poll -------------------------------------------------------------------------------- */

static void sp_session_event(struct sel_pooled *p, const struct sel_pool_event *e)
{
	switch (e->type) {
	case SEL_POOL_EV_DETACHED:
		p->pc_st.detaches++;
		p->pc_st.state = SEL_POOL_DOWN;
		break;
	case SEL_POOL_EV_ATTACHED:
		p->pc_st.sessions++;
		p->pc_st.state = SEL_POOL_UP;
		sp_reannounce(p); /* a new session knows none of them */
		sp_hold_reannounce(p);
		break;
	case SEL_POOL_EV_DISABLED:
		/* another region generation: every lease of the lost session
		 * ended, no copy touches the old mapping */
		sp_cuda_unregister(p);
		p->pc_st.state = SEL_POOL_GONE_FOR_GOOD;
		snprintf(p->warn, sizeof p->warn, "%s", sel_pool_warning(p->pc));
		break;
	default: break;
	}
}

static void sp_pump_pool(struct sel_pooled *p)
{
	struct sel_pool_event pe[16];
	int n;
	do {
		n = sel_pool_poll(p->pc, pe, 16);
		for (int i = 0; i < n; i++) {
			if (pe[i].type == SEL_POOL_EV_ANSWER) {
				sp_tickets_answer(p, pe[i].ticket);
				continue;
			}
			if (sp_fetch_event(p, &pe[i]) || sp_put_event(p, &pe[i]) ||
			    sp_export_event(p, &pe[i]))
				continue;
			sp_session_event(p, &pe[i]);
		}
	} while (n == 16);
}

static void sp_pump_xfer(struct sel_pooled *p)
{
	struct sel_xfer_job *done[32];
	int n;
	do {
		n = sel_xfer_poll(p->x, done, 32);
		for (int i = 0; i < n; i++)
			if (!sp_fetch_copied(p, done[i]) && !sp_put_copied(p, done[i]))
				(void)sp_export_copied(p, done[i]);
	} while (n == 32);
}

static int sp_poll(sel_store *s, sel_event *ev, size_t cap)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	if (p->pc && !p->closed) {
		sp_drain_timer(p);
		sp_pump_pool(p);
		sp_take_helped(p);
		sp_pump_xfer(p);
		sp_fetch_retry(p);
		sp_put_retry(p);
		sp_export_retry(p);
		sp_hold_pump(p);
		sp_tickets_free(p, false);
	}
	size_t n = 0;
	while (n < cap && n < p->n_evq)
		ev[n] = p->evq[n], n++;
	if (n) {
		memmove(p->evq, p->evq + n, (p->n_evq - n) * sizeof *p->evq);
		p->n_evq -= (uint32_t)n;
	}
	if (n == cap || !p->w.inner)
		return (int)n;
	int m = sel_wrap_poll(s, ev + n, cap - n);
	if (m < 0)
		return n ? (int)n : m;
	size_t k = n;
	for (int i = 0; i < m; i++) {
		sel_event *e = &ev[n + (size_t)i];
		if ((e->type == SEL_EV_STORED || e->type == SEL_EV_STORE_FAILED) &&
		    sp_put_hold(p, e))
			continue;
		ev[k++] = *e;
	}
	return (int)k;
}

/* ---- stats, describe, wait fd ---------------------------------------------------------------- */

static void sp_stats(sel_store *s, sel_stats *out)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	sel_wrap_stats(s, out);
	if (!p->w.inner && p->cuda_be)
		out->transport = "cuda"; /* pool only: the pool's copier is the transport */
	out->tier[SEL_TIER_POOL] = p->tier;
	out->pool = p->pc_st;
	out->lookups += p->pc_st.lookups;
	out->hits += p->pc_st.hits;
	out->reused_tokens += p->pc_st.reused_tokens;
	out->fetches += p->pc_st.restores;
	for (int i = 0; i < SEL_POOL_FAILS; i++)
		out->fetch_failures += p->pc_st.claims_failed[i];
}

static void sp_describe(sel_store *s, sel_store_info *out)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	sel_wrap_describe(s, out);
	out->kind = p->kind;
	out->pool = p->desc;
	if (p->warn[0])
		out->warning = p->warn;
}

static int sp_wait_fd(sel_store *s)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	return p->ep >= 0 ? p->ep : sel_wrap_wait_fd(s);
}

/* ---- open -------------------------------------------------------------------------------- */

static int sp_watch(struct sel_pooled *p, int fd)
{
	struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
	if (fd < 0)
		return 0;
	if (epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &e))
		return eos_fail(-errno, "pooled store: epoll_ctl: %s", strerror(errno));
	return 0;
}

/* The budget check before registration (design 2.15, pool_budget.h): the
 * Hello plan (the arena's part not yet resident, staging) against the
 * host supply less the local tiers still to be
 * allocated (the warm tier unless pre-faulted, the other allocations the
 * loader reserved) and, with GPUs registering it, their device budget.
 * The host copy backend registers with no GPU.  A plan that does not fit
 * detaches before anything is registered, with one warning. */
static bool sp_budget_fits(struct sel_pooled *p, const sel_store_config *cfg)
{
	const struct sel_pool_m_hello *h = sel_pool_hello(p->pc);
	struct sel_pool_budget_in in = {
		.local_future = (cfg->populate ? 0 : cfg->memory_bytes) + cfg->host_reserved,
		.arena_bytes = h->arena_bytes,
		.arena_resident = sel_pool_arena_resident(p->pc),
		.staging_bytes = h->staging_bytes,
	};
	char msg[360];
	int drc = sp_cuda_budget(p, &in, msg, sizeof msg); /* the device half */
	sel_pool_budget_observe(&in);
	struct sel_pool_budget_out out;
	if (!drc && sel_pool_budget_check(&in, &out, msg, sizeof msg) == SEL_POOL_BUDGET_FITS)
		return true;
	snprintf(
		p->warn, sizeof p->warn,
		"prefix cache pool %.120s: %s; nothing was registered, local tiers will be used and "
		"this instance will not attach later",
		p->address, msg);
	snprintf(p->desc, sizeof p->desc, "%s (not attached: budget)", p->address);
	(void)sel_pool_close(p->pc);
	sel_pool_destroy(p->pc);
	p->pc = NULL;
	return false;
}

/* The pool client, the arena's transfer set, the helper and the wait set.
 * Attach failures are not errors: the warning says local tiers only. */
static int sp_attach(struct sel_pooled *p, const sel_store_config *cfg)
{
	const struct sel_copy_backend *be =
		cfg->copy_backend ? cfg->copy_backend : &sel_copy_backend_host;
	struct sel_pool_client_config pcc = {
		.address = cfg->pool,
		.geometry = cfg->geometry,
		.instance_id = cfg->pool_instance_id,
		.machine_id_path = cfg->pool_machine_id_path,
		.listen = cfg->pool_listen ? cfg->pool_listen : "",
		.hello_timeout_ns = cfg->pool_wait_ns,
	};
	memcpy(pcc.identity, cfg->identity, SEL_IDENTITY_BYTES);
	memcpy(pcc.core_identity, cfg->model_identity, SEL_IDENTITY_BYTES);
	p->pc_st.state = SEL_POOL_GONE_FOR_GOOD;
	p->g = cfg->geometry;
	bool cuda = sp_cuda_wanted(cfg);
	int rc = cuda ? sp_cuda_load(p, cfg) : 0;
	if (rc)
		return rc;
	rc = sel_pool_attach(&pcc, &p->pc);
	if (rc) {
		snprintf(p->warn, sizeof p->warn,
			 "%s; local tiers will be used and this instance will not attach later",
			 eos_errmsg());
		snprintf(p->desc, sizeof p->desc, "%s (not attached)", p->address);
		return 0;
	}
	if (!sp_budget_fits(p, cfg) || (cuda && !sp_cuda_register(p)))
		return 0;
	if (p->cuda_be)
		be = p->cuda_be;
	struct sel_xfer_part *parts = calloc(cfg->geometry->ranks, sizeof *parts);
	if (!parts)
		return eos_fail(-ENOMEM, "pooled store: out of memory");
	uint64_t nslots = sel_pool_xfer_parts(p->pc, parts);
	p->fused = be == &sel_copy_backend_host;
	for (uint32_t r = 0; r < cfg->geometry->ranks; r++)
		for (uint32_t k = 0; k < cfg->geometry->rank[r].n_planes; k++)
			p->fused &= cfg->geometry->rank[r].pages[k].kind == SEL_MEM_HOST;
	if (!(rc = sel_slot_layout_init(&p->lay, cfg->geometry)))
		rc = sel_xfer_create_parts(cfg->geometry, &p->lay, parts, nslots, be,
					   cfg->queue_depth ? cfg->queue_depth : 64, &p->x);
	free(parts);
	if (rc)
		return rc;
	if ((p->hfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
	    (p->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0 ||
	    (p->ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
		return eos_fail(-errno, "pooled store: %s", strerror(errno));
	if ((rc = sp_watch(p, sel_pool_wait_fd(p->pc))) || (rc = sp_watch(p, sel_xfer_fd(p->x))) ||
	    (rc = sp_watch(p, p->hfd)) || (rc = sp_watch(p, p->tfd)) ||
	    (p->w.inner && (rc = sp_watch(p, sel_store_wait_fd(p->w.inner)))))
		return rc;
	for (; p->th_started < SP_HELPERS; p->th_started++)
		if ((rc = pthread_create(&p->th[p->th_started], NULL, sp_helper_main, p)))
			return eos_fail(-rc, "pooled store: helper thread: %s", strerror(rc));
	p->pc_st.state = SEL_POOL_UP;
	p->pc_st.sessions = 1;
	sp_lookup_warmup(p, cfg->model_identity);
	sp_cascade_attach(p);
	sp_hold_attach(p);
	const struct sel_pool_m_hello *h = sel_pool_hello(p->pc);
	char a[32];
	snprintf(p->desc, sizeof p->desc, "%s, pool '%s', arena %s", p->address, h->name,
		 eos_format_size(h->arena_bytes, a, sizeof a));
	return 0;
}

int sel_pooled_store_open(const sel_store_config *cfg, sel_store *inner, sel_store **out)
{
	*out = NULL;
	const char *path = !strncmp(cfg->pool, "unix:", 5) ? cfg->pool + 5
			   : strchr(cfg->pool, '/')        ? cfg->pool
							   : NULL;
	if (!path || !*path) {
		sel_store_destroy(inner);
		return eos_fail(-EINVAL,
				"prefix cache pool '%s': not an address of this build (unix:PATH, "
				"the socket of flare pool on this host)",
				cfg->pool);
	}
	struct sel_pooled *p = calloc(1, sizeof *p);
	if (!p) {
		sel_store_destroy(inner);
		return eos_fail(-ENOMEM, "pooled store: out of memory");
	}
	sel_wrap_init(&p->w, &sp_ops, cfg->geometry->page_tokens, inner);
	p->ep = p->tfd = p->hfd = -1;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	const char *a = cfg->pool;
	snprintf(p->address, sizeof p->address, "%s%s", strncmp(a, "unix:", 5) ? "unix:" : "", a);
	snprintf(p->desc, sizeof p->desc, "%s", p->address);
	sel_store_info ii;
	sel_store_describe(inner, &ii);
	snprintf(p->kind, sizeof p->kind, "%s", inner ? ii.kind : "pool");
	if (inner)
		snprintf(p->kind, sizeof p->kind, "%s+pool", ii.kind);
	p->known = calloc(SP_KNOWN, sizeof *p->known);
	p->grace_min = cfg->pool_grace_ns ? cfg->pool_grace_ns : SP_GRACE_NS;
	p->hooks = cfg->pool_exports && cfg->pool_exports->pin && cfg->pool_exports->unpin
			   ? cfg->pool_exports
			   : NULL;
	int rc = p->known ? sp_attach(p, cfg) : eos_fail(-ENOMEM, "pooled store: out of memory");
	if (rc == 0 && inner && ii.warning && *ii.warning) {
		/* the inner store's warning first, then the pool's */
		char w[sizeof p->warn];
		size_t k = strlen(ii.warning), m = strlen(p->warn);
		k = k < sizeof w - 1 ? k : sizeof w - 1;
		memcpy(w, ii.warning, k);
		if (m && k + 2 + m < sizeof w) {
			memcpy(w + k, "; ", 2);
			memcpy(w + k + 2, p->warn, m);
			k += 2 + m;
		}
		w[k] = 0;
		memcpy(p->warn, w, sizeof w);
	}
	if (rc) {
		char msg[512];
		snprintf(msg, sizeof msg, "%s", eos_errmsg());
		sp_destroy(&p->w.base);
		return eos_fail(rc, "prefix cache pool %s: %s", a, msg);
	}
	*out = &p->w.base;
	return 0;
}

/* ---- close and destroy ---------------------------------------------------------------------- */

static int sp_close(sel_store *s, uint64_t deadline_ns)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	if (p->closed)
		return p->close_rc;
	p->closed = true;
	int rc = 0;
	if (p->x && sel_xfer_close(p->x, deadline_ns) == SEL_ESTOPPED)
		rc = SEL_ESTOPPED;
	if (p->th_started) {
		pthread_mutex_lock(&p->mu);
		p->th_stop = true;
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
		while (p->th_started)
			pthread_join(p->th[--p->th_started], NULL);
	}
	if (rc == 0)
		sp_cuda_unregister(p); /* drained: before the client unmaps the arena */
	if (p->pc && rc == 0) {
		/* Every copy drained: end the leases still held, then the session. */
		sp_take_helped(p);
		sp_pump_xfer(p);
		for (struct sp_fetch *f = p->fetches; f; f = f->next)
			if (f->lease) {
				(void)sel_pool_release(p->pc, f->lease, SEL_POOL_COPY_FAILED);
				f->lease = NULL;
			}
		for (struct sp_put *u = p->puts; u; u = u->next)
			if (u->lease) {
				(void)sel_pool_release(p->pc, u->lease, SEL_POOL_COPY_FAILED);
				u->lease = NULL;
			}
		sp_exports_end(p);
		(void)sel_pool_close(p->pc);
	}
	sp_cascade_detach(p); /* what is held stays local */
	sp_hold_detach(p);
	int irc = sel_wrap_close(s, deadline_ns);
	p->close_rc = rc ? rc : irc;
	return p->close_rc;
}

static void sp_destroy(sel_store *s)
{
	struct sel_pooled *p = (struct sel_pooled *)s;
	if (!p->closed)
		(void)sp_close(s, eos_now_ns() + 5000000000ull);
	bool leak = p->close_rc == SEL_ESTOPPED;
	sp_tickets_free(p, true);
	while (p->fetches) {
		struct sp_fetch *f = p->fetches;
		p->fetches = f->next;
		sp_fetch_free(f);
	}
	while (p->puts) {
		struct sp_put *u = p->puts;
		p->puts = u->next;
		free(u->hj.src);
		free(u->hj.files);
		free(u->hj.cksums);
		free(u->pages);
		free(u);
	}
	if (leak) {
		/* A copy may still touch the arena and the planes (design 2.8). */
		void *keep[] = {p->pc, p->x};
		sel_leak(keep, 2);
	} else {
		sel_xfer_destroy(p->x);
		sel_pool_destroy(p->pc);
	}
	sp_cuda_free(p, leak); /* after the transfer set: its threads use the backend */
	sel_slot_layout_free(&p->lay);
	sel_wrap_destroy_inner(&p->w);
	if (p->ep >= 0)
		close(p->ep);
	if (p->tfd >= 0)
		close(p->tfd);
	if (p->hfd >= 0)
		close(p->hfd);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p->known);
	free(p->evq);
	free(p);
}
