/*
 * store_wrap.c - forwarding helpers of a wrapping store (store_wrap.h).
 *
 * Each entry forwards to the inner store through the public dispatch
 * (sel_store_*), so the inner store's own version check and defaults
 * apply; without an inner store it answers as an empty store would.
 */
#include "store_wrap.h"

#include <errno.h>
#include <string.h>

#include "eos.h"

void sel_wrap_init(struct sel_wrap *w, const struct sel_store_ops *ops, uint32_t page_tokens,
		   sel_store *inner)
{
	memset(&w->base, 0, sizeof w->base);
	w->base.ops = ops;
	w->base.page_tokens = page_tokens;
	w->inner = inner;
}

int sel_wrap_lookup(sel_store *s, const sel_history *h, uint64_t resident, uint64_t limit,
		    sel_hit *hit)
{
	sel_store *in = sel_wrap_of(s)->inner;
	return in ? sel_store_lookup(in, h, resident, limit, hit) : 0;
}

sel_outcome sel_wrap_put(sel_store *s, const sel_published *cp, sel_retry_reason *why)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (!in) {
		eos_fail(-ENOTSUP, "store '%s': no local tier", s->ops->name);
		return SEL_SKIPPED;
	}
	return sel_store_put(in, cp, why);
}

int sel_wrap_fetch(sel_store *s, const sel_hit *hit, const sel_inbound *in_)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (!in)
		return eos_fail(-ESTALE, "store '%s': no local tier holds that hit", s->ops->name);
	return sel_store_fetch(in, hit, in_);
}

int sel_wrap_poll(sel_store *s, sel_event *ev, size_t cap)
{
	sel_store *in = sel_wrap_of(s)->inner;
	return in ? sel_store_poll(in, ev, cap) : 0;
}

void sel_wrap_evicted(sel_store *s, const sel_key *key, uint64_t generation, const sel_key *heir)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (in)
		sel_store_evicted(in, key, generation, heir);
	else
		s->evictions_noticed++;
}

void sel_wrap_touch(sel_store *s, const sel_key *key)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (in)
		sel_store_touch(in, key);
}

void sel_wrap_stats(sel_store *s, sel_stats *out)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (in) {
		sel_store_stats(in, out);
		return;
	}
	*out = (sel_stats){.transport = "host"};
}

int sel_wrap_wait_fd(sel_store *s)
{
	sel_store *in = sel_wrap_of(s)->inner;
	return in ? sel_store_wait_fd(in) : -1;
}

int sel_wrap_close(sel_store *s, uint64_t deadline_ns)
{
	sel_store *in = sel_wrap_of(s)->inner;
	return in ? sel_store_close(in, deadline_ns) : 0;
}

void sel_wrap_describe(sel_store *s, sel_store_info *out)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (in)
		sel_store_describe(in, out);
}

void sel_wrap_destroy_inner(struct sel_wrap *w)
{
	sel_store_destroy(w->inner);
	w->inner = NULL;
}

void sel_wrap_flush(sel_store *s)
{
	sel_store *in = sel_wrap_of(s)->inner;
	if (in)
		sel_store_flush(in);
}
