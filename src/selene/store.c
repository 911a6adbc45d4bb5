/*
 * store.c - the store interface: dispatch of sel_store_* through a store's
 * ops table, and the names of outcomes, retry reasons and tiers (design 2.2).
 *
 * DESIGN
 *
 * Every store (memory, disk, composite, a test double) embeds struct
 * sel_store first and points it at a static ops table (selene_store.h, the
 * implementer's header; selene.h keeps sel_store opaque).  The dispatch
 * functions here are the only callers of those tables, and they supply the
 * defaults of the optional entries: evicted counts the notice in the base
 * struct (added to sel_stats.evictions_noticed), touch does nothing,
 * describe adds nothing to what kind, stats and the defaults say.  A table is checked
 * on every call: one whose version is not SEL_STORE_OPS_VERSION, or that
 * lacks the entry a call needs, is refused with -EPROTO (SEL_SKIPPED for
 * put, nothing for the void calls) and a message naming the store -- so an
 * implementation built against another revision of selene.h fails loudly
 * instead of calling through a misplaced pointer.  The check is two loads and
 * compares, cheap enough for the model worker's hot path.
 *
 * INVARIANTS
 *
 *   1. No ops entry is called unless the table's version equals
 *      SEL_STORE_OPS_VERSION and the entry is non-NULL.
 *   2. A refused call changes nothing and produces no event, like any
 *      failed call (selene.h).
 */
#include <errno.h>

#include "eos.h"
#include "selene_store.h"

/* 0 when s may use op; else -EPROTO (or -EINVAL for a NULL store) with a
 * message (OPS_OK). */
static int bad_store(const sel_store *s, const char *what)
{
	return eos_fail(-EINVAL, "store: %s on %s", what, s ? "a store without ops" : "NULL");
}

/* s and s->ops are not NULL (OPS_OK tests them where the analyzer sees it). */
static int ops_ok(const sel_store *s, const void *op, const char *what)
{
	if (s->ops->version != SEL_STORE_OPS_VERSION)
		return eos_fail(-EPROTO, "store '%s': ops table version %u, this library speaks %u",
				s->ops->name ? s->ops->name : "?", s->ops->version,
				SEL_STORE_OPS_VERSION);
	if (!op)
		return eos_fail(-EPROTO, "store '%s': no %s operation",
				s->ops->name ? s->ops->name : "?", what);
	return 0;
}

#define OPS_OK(s, field, what)                                                                     \
	((s) && (s)->ops ? ops_ok(s, (const void *)(s)->ops->field, what) : bad_store(s, what))

int sel_store_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		     sel_hit *hit)
{
	int rc = OPS_OK(s, lookup, "lookup");
	if (rc)
		return rc;
	return s->ops->lookup(s, h, resident, limit, hit);
}

sel_outcome sel_store_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	if (why)
		*why = SEL_RETRY_NONE;
	if (OPS_OK(s, put, "put"))
		return SEL_SKIPPED;
	return s->ops->put(s, cp, why);
}

int sel_store_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in)
{
	int rc = OPS_OK(s, fetch, "fetch");
	if (rc)
		return rc;
	if (in && in->n_sums) { /* overlapped restores (issue 18) */
		if (!s->ops->fetch_sums)
			return eos_fail(-ENOTSUP, "%s store: no page digests with a fetch",
					s->ops->name);
		if (!in->sums || !hit || !s->page_tokens ||
		    in->n_sums > hit->resident / s->page_tokens)
			return eos_fail(-EINVAL,
					"fetch: the digests of %u pages below a resident %llu",
					in->n_sums, hit ? (unsigned long long)hit->resident : 0ULL);
	}
	return s->ops->fetch(s, hit, in);
}

int sel_store_poll(sel_store *s, sel_event *ev, size_t cap)
{
	int rc = OPS_OK(s, poll, "poll");
	if (rc)
		return rc;
	return s->ops->poll(s, ev, cap);
}

/* The table of s is usable at all (optional entries may be NULL). */
static int table_ok(const sel_store *s, const char *what)
{
	return s && s->ops ? ops_ok(s, s->ops, what) : bad_store(s, what);
}

void sel_store_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir)
{
	if (table_ok(s, "evicted"))
		return;
	if (s->ops->evicted)
		s->ops->evicted(s, key, generation, heir);
	else
		s->evictions_noticed++;
}

void sel_store_evictions_lost(sel_store *s)
{
	if (s && table_ok(s, "evictions_lost") == 0 && s->ops->evictions_lost)
		s->ops->evictions_lost(s);
}

void sel_store_touch(sel_store *s, const sel_key *key)
{
	if (table_ok(s, "touch") == 0 && s->ops->touch)
		s->ops->touch(s, key);
}

void sel_store_flush(sel_store *s)
{
	if (s && table_ok(s, "flush") == 0 && s->ops->flush)
		s->ops->flush(s);
}

void sel_store_stats(sel_store *s, sel_stats *out)
{
	if (OPS_OK(s, stats, "stats") == 0) {
		s->ops->stats(s, out);
		out->evictions_noticed += s->evictions_noticed;
		return;
	}
	*out = (sel_stats){0};
}

int sel_store_wait_fd(sel_store *s)
{
	if (OPS_OK(s, wait_fd, "wait_fd"))
		return -1;
	return s->ops->wait_fd(s);
}

int sel_store_close(sel_store *s, uint64_t deadline_ns)
{
	if (!s)
		return 0;
	int rc = OPS_OK(s, close, "close");
	if (rc)
		return rc;
	return s->ops->close(s, deadline_ns);
}

void sel_store_destroy(sel_store *s)
{
	if (!s)
		return;
	if (OPS_OK(s, destroy, "destroy") == 0)
		s->ops->destroy(s);
}

const char *sel_store_warning(const sel_store *s)
{
	sel_store_info info;
	/* describe reads stats, which change nothing the caller can see */
	sel_store_describe((sel_store *)s, &info);
	return info.warning;
}

const char *sel_version(int *major, int *minor, int *patch)
{
	if (major)
		*major = SEL_VERSION_MAJOR;
	if (minor)
		*minor = SEL_VERSION_MINOR;
	if (patch)
		*patch = SEL_VERSION_PATCH;
	return SEL_VERSION_STRING;
}

const char *sel_outcome_name(sel_outcome o)
{
	switch (o) {
	case SEL_QUEUED: return "queued";
	case SEL_PRESENT: return "present";
	case SEL_DEFERRED: return "deferred";
	case SEL_RETRY: return "retry";
	case SEL_OVERSIZE: return "oversize";
	case SEL_SKIPPED: return "skipped";
	}
	return "unknown";
}

const char *sel_retry_reason_name(sel_retry_reason r)
{
	switch (r) {
	case SEL_RETRY_NONE: return "none";
	case SEL_RETRY_INFLIGHT: return "inflight";
	case SEL_RETRY_SLABS: return "slabs";
	case SEL_RETRY_QUEUE: return "queue";
	case SEL_RETRY_BUDGET: return "budget";
	case SEL_RETRY_REASONS: break;
	}
	return "unknown";
}

const char *sel_tier_name(sel_tier t)
{
	switch (t) {
	case SEL_TIER_NONE: return "none";
	case SEL_TIER_MEMORY: return "dram";
	case SEL_TIER_DISK: return "nvme";
	case SEL_TIER_POOL: return "pool";
	case SEL_TIER_REMOTE: return "remote";
	case SEL_TIERS: break;
	}
	return "unknown";
}

void sel_store_describe(sel_store *s, sel_store_info *out)
{
	*out = (sel_store_info){.kind = "disabled", .transport = "none", .warning = ""};
	if (!s || table_ok(s, "describe"))
		return;
	out->kind = s->ops->name ? s->ops->name : "?";
	sel_stats st;
	sel_store_stats(s, &st);
	out->transport = st.transport ? st.transport : "host";
	out->slot_bytes = st.slot_bytes;
	out->slots_total = st.slots_total;
	out->intake_slots = st.intake_slots;
	if (s->ops->describe)
		s->ops->describe(s, out);
	if (out->disk_io && !out->disk_io_note)
		out->disk_io_note = "";
	if (!out->warning)
		out->warning = "";
}

int sel_store_page_digests(sel_store *s, const sel_hit *hit, uint32_t first, uint32_t n,
			   uint64_t *out)
{
	int rc = table_ok(s, "page_digests");
	if (rc)
		return rc;
	if (!s->ops->page_digests)
		return eos_fail(-ENOTSUP, "%s store: no page digests", s->ops->name);
	if (!hit || (n && !out) || (uint64_t)first + n > hit->pages)
		return eos_fail(-EINVAL, "page digests: pages %u+%u of a hit of %u", first, n,
				hit ? hit->pages : 0);
	return s->ops->page_digests(s, hit, first, n, out);
}

int sel_store_drop(sel_store *s, const sel_key *key)
{
	int rc = table_ok(s, "drop");
	if (rc)
		return rc;
	if (!s->ops->drop)
		return eos_fail(-ENOTSUP, "%s store: cannot drop records", s->ops->name);
	if (!key)
		return eos_fail(-EINVAL, "drop: no key");
	return s->ops->drop(s, key);
}
