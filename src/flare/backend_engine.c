/*
 * backend_engine.c - the real backend: the function table of backend.h over
 * hel_engine_* (src/helios/engine.h; design 2.8, 2.9).
 *
 * DESIGN
 * Kept in its own file so that nothing but `flare run`'s entry point pulls
 * hel_engine_* into a link: libflare.a holds this object, and an archive
 * member is linked only when something references it.  Tests and the fuzz
 * replays use fakes and never name flare_engine_backend.
 */
#include "flare/backend.h"

#include <stdio.h>

static void eng_info(void *ctx, hel_engine_info *out) { hel_engine_info_get(ctx, out); }
static int eng_start(void *ctx) { return hel_engine_start(ctx); }
static int eng_submit(void *ctx, const hel_request *r, uint64_t *id)
{
	return hel_engine_submit(ctx, r, id);
}
static int eng_cancel(void *ctx, uint64_t id) { return hel_engine_cancel(ctx, id); }
static void eng_stats(void *ctx, hel_engine_stats *out) { hel_engine_stats_get(ctx, out); }
static int eng_stop(void *ctx, uint64_t deadline_ns) { return hel_engine_stop(ctx, deadline_ns); }
static void eng_destroy(void *ctx) { hel_engine_destroy(ctx); }

static const struct flare_backend_ops engine_ops = {
	.info = eng_info,
	.start = eng_start,
	.submit = eng_submit,
	.cancel = eng_cancel,
	.stats = eng_stats,
	.stop = eng_stop,
	.destroy = eng_destroy,
};

static int eng_open(const struct flare_backend_factory *f, const hel_engine_config *cfg,
		    struct flare_backend *out, char *err, size_t errlen)
{
	(void)f;
	hel_engine *e = NULL;
	int rc = hel_engine_open(cfg, &e);
	if (rc) {
		const char *m = sel_errmsg();
		snprintf(err, errlen, "cannot start the engine: %s%s%s", sel_strerror(rc),
			 *m ? ": " : "", m);
		return rc;
	}
	out->ops = &engine_ops;
	out->ctx = e;
	return 0;
}

const struct flare_backend_factory flare_engine_backend = {
	.name = "engine",
	.open = eng_open,
	.arg = NULL,
};
