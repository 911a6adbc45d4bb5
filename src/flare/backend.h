/*
 * backend.h - the engine as the flare front end calls it: a small function
 * table, so the HTTP server and `flare run` can be tested against a fake
 * engine (STYLE.md 4, "function tables at the edges").
 *
 * The real table (backend_engine.c) wraps hel_engine_* one to one; the
 * contract of each entry is that of the hel_engine_* call it wraps
 * (src/helios/engine.h): submit copies the request and returns at once,
 * on_tokens/on_done run on the engine's thread and must not block, exactly
 * one on_done follows a successful submit and none a failed one.
 *
 * Threads: the HTTP threads call only submit, cancel and stats.  open,
 * info, start, stop and destroy are called by flare_serve's main thread.
 */
#ifndef FLARE_BACKEND_H
#define FLARE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "helios/engine.h"

struct flare_backend_ops {
	/* hel_engine_info_get: after open, before start. */
	void (*info)(void *ctx, hel_engine_info *out);
	/* hel_engine_start. */
	int (*start)(void *ctx);
	/* hel_engine_submit: 0 with *id; -EAGAIN queue full; -EINVAL (message
	 * in sel_errmsg() names the field); -ESHUTDOWN when stopping. */
	int (*submit)(void *ctx, const hel_request *r, uint64_t *id);
	/* hel_engine_cancel: 0 (on_done follows with "cancelled") or -ENOENT. */
	int (*cancel)(void *ctx, uint64_t id);
	/* hel_engine_stats_get: a consistent snapshot. */
	void (*stats)(void *ctx, hel_engine_stats *out);
	/* hel_engine_stop: refuse new requests, cancel running ones (each gets
	 * its on_done), close the store by deadline_ns (monotonic, 0 = none). */
	int (*stop)(void *ctx, uint64_t deadline_ns);
	/* hel_engine_destroy (after stop). */
	void (*destroy)(void *ctx);
};

struct flare_backend {
	const struct flare_backend_ops *ops;
	void *ctx;
};

/* How flare_serve obtains its backend.  open builds an engine from cfg
 * (which, with cfg->core, outlives the backend) without starting it; on
 * failure it returns a negative code and writes one line to err naming the
 * setting at fault. */
struct flare_backend_factory {
	const char *name;
	int (*open)(const struct flare_backend_factory *f, const hel_engine_config *cfg,
		    struct flare_backend *out, char *err, size_t errlen);
	void *arg; /* the factory's own (tests keep their fake here) */
};

/* The real engine (backend_engine.c).  Referencing it links hel_engine_*
 * from libhelios: only `flare run`'s entry point in main.c does. */
extern const struct flare_backend_factory flare_engine_backend;

#endif
