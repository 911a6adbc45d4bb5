/*
 * restorelib.c - restores through the pooled store against one memcpy of
 * the same bytes (restorelib.h).
 */
#include "restorelib.h"

#include <poll.h>

#include "benchlib.h"
#include "pool_testlib.h"
#include "store_pooled.h"
#include "storefx.h"

static sel_store *open_store(struct sfx *f, const char *sock, const char *id)
{
	sel_store_config c = sfx_config(f, false);
	c.pool = sock;
	c.pool_instance_id = id;
	c.pool_grace_ns = 1000000000ull;
	sel_store *s = NULL;
	CHECK_OK(sel_store_open(&c, &s));
	return s;
}

static sel_event wait_one(sel_store *s)
{
	sel_event ev[4];
	for (;;) {
		struct pollfd p = {sel_store_wait_fd(s), POLLIN, 0};
		(void)poll(&p, 1, 100);
		int n = sel_store_poll(s, ev, 4);
		CHECK(n >= 0 && n <= 1);
		if (n == 1)
			return ev[0];
	}
}

/* One poll with a short wait; no event may come. */
static void pump_once(sel_store *s)
{
	sel_event ev[4];
	struct pollfd pf = {sel_store_wait_fd(s), POLLIN, 0};
	(void)poll(&pf, 1, 10);
	CHECK(sel_store_poll(s, ev, 4) == 0);
}

/* The record's span of arena slots, as B maps it: the slot whose bytes are
 * B's restored page 0 (plane 0 then plane 1), checked at the last page too,
 * so the baseline copies exactly the bytes the restore read. */
static const uint8_t *find_record(sel_store *b, struct sfx *f, uint64_t span, const char *name)
{
	sel_pool_client *pc = ((struct sel_pooled *)b)->pc;
	uint64_t abytes, sb = sel_pool_slot_bytes(pc);
	const uint8_t *arena = sel_pool_arena(pc, &abytes);
	uint64_t u0 = f->unit[0], u1 = f->unit[1], last = span / sb - 1;
	for (uint64_t off = 0; off + span <= abytes; off += 4096) {
		const uint8_t *s = arena + off;
		if (!memcmp(s, f->plane[0][0], u0) && !memcmp(s + u0, f->plane[0][1], u1) &&
		    !memcmp(s + last * sb, f->plane[0][0] + last * u0, u0) &&
		    !memcmp(s + last * sb + u0, f->plane[0][1] + last * u1, u1))
			return s;
	}
	fprintf(stderr, "%s: the record's slots are not one span of the arena\n", name);
	exit(1);
}

int bench_rounds(const char *name, int def)
{
	const char *env = getenv("BENCH_ROUNDS");
	int r = env ? atoi(env) : def;
	if (r < 3 || r > 1001) {
		fprintf(stderr, "%s: BENCH_ROUNDS=%s: expected 3..1001 rounds\n", name, env);
		exit(2);
	}
	return r;
}

/* One round: a restore and a memcpy of src (NULL in the warm-up round,
 * which restores only), in the order the round's parity says. */
static void one_round(sel_store *b, struct sfx_conv *cb, uint64_t c, int r, const uint32_t *ids,
		      uint32_t pages, const uint8_t *src, uint8_t *y, uint64_t span,
		      double *t_restore, double *t_copy, uint64_t *bytes)
{
	sel_hit hit;
	int rc;
	while ((rc = sel_store_lookup(b, &cb->h, 0, c, &hit)) != 1) {
		CHECK(rc == SEL_LOOKUP_PENDING || rc == 0);
		pump_once(b);
	}
	CHECK(hit.tier == SEL_TIER_POOL && hit.pages == pages);
	for (int side = 0; side < 2; side++) {
		bool restore = (side == 0) == (r % 2 == 0);
		if (!restore && !src)
			continue; /* the warm-up round has no src yet */
		bench_cold_caches();
		uint64_t t0 = eos_now_ns();
		if (restore) {
			sel_inbound in = {.ticket = (uint64_t)(r + 2),
					  .pages = ids,
					  .n_pages = pages,
					  .state_slot = 2};
			CHECK_OK(sel_store_fetch(b, &hit, &in));
			sel_event e = wait_one(b);
			*t_restore = (double)(eos_now_ns() - t0) / 1e9;
			CHECK(e.type == SEL_EV_FETCHED);
			*bytes = e.bytes;
		} else {
			memcpy(y, src, span);
			*t_copy = (double)(eos_now_ns() - t0) / 1e9;
		}
	}
}

void bench_pooled_restore(const char *sock, int rounds, const char *name, int verbose,
			  struct bench_restore *out)
{
	/* 64 KiB page records: 1024 pages are 64 MiB (65,536 tokens). */
	const uint64_t unit[2] = {32768, 32768};
	const uint32_t pages = 1024;
	struct sfx fa, fb;
	sfx_init(&fa, 1, 2, unit, 6000, pages + 8, 4);
	sfx_init(&fb, 1, 2, unit, 6000, pages + 8, 4);
	sel_store *a = open_store(&fa, sock, "bench-a"), *b = open_store(&fb, sock, "bench-b");
	uint64_t c = (uint64_t)pages * SFX_PT;
	struct sfx_conv ca, cb;
	sfx_conv_init(&fa, &ca, 3, c, 0);
	sfx_conv_init(&fb, &cb, 3, c, 0);
	sel_published p = sfx_ckpt(&fa, &ca, c, 0, 1, 1);
	sel_retry_reason why;
	CHECK(sel_store_put(a, &p, &why) == SEL_QUEUED);
	CHECK(wait_one(a).type == SEL_EV_STORED);
	while (((struct sel_pooled *)a)->pc_st.puts_accepted < 1)
		pump_once(a);

	CHECK(rounds >= 3 && rounds <= 1001);
	out->rounds = rounds;
	out->restore_bps = calloc((size_t)rounds, sizeof(double));
	out->memcpy_bps = calloc((size_t)rounds, sizeof(double));
	out->ratio = calloc((size_t)rounds, sizeof(double));
	uint64_t span = (uint64_t)pages * (unit[0] + unit[1]);
	uint32_t *ids = malloc(pages * sizeof *ids);
	uint8_t *y = aligned_alloc(4096, span);
	CHECK(out->restore_bps && out->memcpy_bps && out->ratio && ids && y);
	for (uint32_t i = 0; i < pages; i++)
		ids[i] = i;
	memset(y, 2, span);
	const uint8_t *src = NULL;          /* the record's slots in B's mapping of the arena */
	for (int r = -1; r < rounds; r++) { /* round -1: warms up, finds src */
		double tr = 0, tc = 0;
		one_round(b, &cb, c, r, ids, pages, src, y, span, &tr, &tc, &out->bytes);
		if (!src)
			src = find_record(b, &fb, span, name);
		if (r < 0)
			continue;
		out->restore_bps[r] = (double)out->bytes / tr;
		out->memcpy_bps[r] = (double)span / tc;
		out->ratio[r] = out->restore_bps[r] / out->memcpy_bps[r];
		if (verbose)
			printf("%s round %2d (%s first): restore %.2f GB/s, memcpy %.2f GB/s, "
			       "ratio %.3f\n",
			       name, r, r % 2 ? "memcpy" : "restore", out->restore_bps[r] / 1e9,
			       out->memcpy_bps[r] / 1e9, out->ratio[r]);
	}
	CHECK(sfx_page_ok(&fb, pages - 1, cb.tag, pages - 1, false));
	free(y);
	free(ids);
	CHECK_OK(sel_store_close(a, 0));
	CHECK_OK(sel_store_close(b, 0));
	sel_store_destroy(a);
	sel_store_destroy(b);
	sfx_conv_free(&ca);
	sfx_conv_free(&cb);
	sfx_free(&fa);
	sfx_free(&fb);
}

void bench_restore_free(struct bench_restore *r)
{
	free(r->restore_bps);
	free(r->memcpy_bps);
	free(r->ratio);
	r->restore_bps = r->memcpy_bps = r->ratio = NULL;
}
