/*
 * examples/engine.c - an engine that is not Helios hosting a Selene store
 * through the public header alone (docs/integration.md walks through it).
 *
 * It owns its "GPU" memory as host allocations: two page planes ("k", "v")
 * of 32 pages each and a row plane of 4 rows, on one rank, 64-token pages.
 * Then, for a memory store and for a composite (memory over a disk tier in
 * a temporary directory):
 *   1. a request's checkpoint at 150 tokens (two full pages in page ids 3
 *      and 7, its row in state slot 1 holding the 22 tokens past the last
 *      page and the rest of its state) is published and stored;
 *   2. the engine's GPU cache evicts it (sel_store_evicted) and poisons the
 *      planes;
 *   3. the same conversation comes back with more tokens: a lookup finds
 *      the checkpoint, a fetch restores it into other page ids (20, 21) and
 *      another state slot (3);
 *   4. the bytes are compared with what was published;
 *   5. (composite) a restart: close drains the DRAM-only record to its
 *      file, a new store on the same directory finds it on disk and
 *      restores it again into pages 22, 23 and slot 2.
 * The worker sleeps on sel_store_wait_fd between polls, as an engine's
 * event loop would with its other descriptors.
 *
 * Build (installed library): cc -std=gnu11 engine.c $(pkg-config --cflags
 * --libs selene).  Exit 0 when every restore is byte-exact, 1 otherwise,
 * with a message on stderr.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <poll.h>
#include <selene.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE_TOKENS 64
#define PAGES 32
#define ROWS 4
#define UNIT 4096 /* bytes of one page in one plane */
#define ROW_BYTES 8192

struct engine {
	unsigned char *k, *v, *rows; /* the "GPU" planes */
	sel_geometry *geometry;
	uint8_t model[SEL_IDENTITY_BYTES];
	sel_store *store;
};

static int fail(const char *what, int rc)
{
	fprintf(stderr, "engine: %s: %s (%s)\n", what, sel_strerror(rc), sel_errmsg());
	return 1;
}

/* Deterministic bytes: what the model would have computed for token
 * position p in plane `plane`. */
static void fill(unsigned char *dst, size_t n, unsigned plane, unsigned pos)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = (unsigned char)(plane * 31 + pos * 7 + i * 13);
}

static int engine_init(struct engine *e)
{
	memset(e, 0, sizeof(*e));
	e->k = calloc(PAGES, UNIT);
	e->v = calloc(PAGES, UNIT);
	e->rows = calloc(ROWS, ROW_BYTES);
	if (!e->k || !e->v || !e->rows)
		return fail("planes", -12);
	sel_allocation a[] = {
		{.rank = 0,
		 .name = "k",
		 .group = SEL_GROUP_KV_PAGES,
		 .kind = SEL_MEM_HOST,
		 .address = (uint64_t)(uintptr_t)e->k,
		 .unit_bytes = UNIT,
		 .count = PAGES},
		{.rank = 0,
		 .name = "v",
		 .group = SEL_GROUP_KV_PAGES,
		 .kind = SEL_MEM_HOST,
		 .address = (uint64_t)(uintptr_t)e->v,
		 .unit_bytes = UNIT,
		 .count = PAGES},
		{.rank = 0,
		 .name = "rows",
		 .group = SEL_GROUP_STATE_ROWS,
		 .kind = SEL_MEM_HOST,
		 .address = (uint64_t)(uintptr_t)e->rows,
		 .unit_bytes = ROW_BYTES,
		 .count = ROWS},
	};
	int rc = sel_geometry_build(a, sizeof a / sizeof a[0], 1, PAGE_TOKENS, &e->geometry);
	if (rc)
		return fail("geometry", rc);
	for (int i = 0; i < SEL_IDENTITY_BYTES; i++)
		e->model[i] = (uint8_t)(0xa0 + i); /* the model's identity */
	return 0;
}

static void engine_free(struct engine *e)
{
	sel_geometry_free(e->geometry);
	free(e->k);
	free(e->v);
	free(e->rows);
}

/* Wait (at most 10 s) for the one event of checkpoint or ticket id. */
static int wait_event(struct engine *e, bool fetch, uint64_t id, sel_event *out)
{
	for (int turn = 0; turn < 10000; turn++) {
		sel_event ev[8];
		int n = sel_store_poll(e->store, ev, 8);
		if (n < 0)
			return fail("poll", n);
		for (int i = 0; i < n; i++) {
			bool mine = fetch ? (ev[i].type == SEL_EV_FETCHED ||
					     ev[i].type == SEL_EV_FETCH_FAILED) &&
						    ev[i].ticket == id
					  : (ev[i].type == SEL_EV_STORED ||
					     ev[i].type == SEL_EV_STORE_FAILED) &&
						    ev[i].checkpoint == id;
			if (mine) {
				*out = ev[i];
				return 0;
			}
		}
		/* The worker's sleep: the store's descriptor with our own inputs. */
		struct pollfd p = {.fd = sel_store_wait_fd(e->store), .events = POLLIN};
		(void)poll(&p, 1, 1);
	}
	fprintf(stderr, "engine: no event for %s %llu\n", fetch ? "ticket" : "checkpoint",
		(unsigned long long)id);
	return 1;
}

/* Look up h with nothing on the GPU and restore the hit into pages
 * first, first + 1 and state slot slot; check the bytes. */
static int restore(struct engine *e, const sel_history *h, uint32_t first, uint32_t slot)
{
	sel_hit hit;
	int rc = sel_store_lookup(e->store, h, 0, sel_history_len(h), &hit);
	if (rc != 1) {
		fprintf(stderr, "engine: lookup: %s\n", rc == 0 ? "miss" : sel_strerror(rc));
		return 1;
	}
	printf("hit at %llu tokens: %u pages, %llu bytes from %s\n",
	       (unsigned long long)hit.key.consumed, hit.pages, (unsigned long long)hit.bytes,
	       sel_tier_name(hit.tier));
	const uint32_t dst_pages[2] = {first, first + 1};
	sel_inbound in = {
		.ticket = 7, .pages = dst_pages, .n_pages = hit.pages, .state_slot = slot};
	sel_event ev;
	if ((rc = sel_store_fetch(e->store, &hit, &in)))
		return fail("fetch", rc);
	sel_store_flush(e->store); /* end of the pass: the copy starts now */
	if (wait_event(e, true, in.ticket, &ev) || ev.type != SEL_EV_FETCHED)
		return fail("restore", ev.error);

	/* Byte-exact, in the new ids. */
	unsigned char want[ROW_BYTES];
	for (unsigned i = 0; i < 2; i++) {
		fill(want, UNIT, 0, i);
		if (memcmp(e->k + (size_t)dst_pages[i] * UNIT, want, UNIT))
			return fail("page k differs", -5);
		fill(want, UNIT, 1, i);
		if (memcmp(e->v + (size_t)dst_pages[i] * UNIT, want, UNIT))
			return fail("page v differs", -5);
	}
	fill(want, ROW_BYTES, 2, 150);
	if (memcmp(e->rows + (size_t)slot * ROW_BYTES, want, ROW_BYTES))
		return fail("row differs", -5);
	printf("restored %llu tokens byte-exact into pages %u, %u and slot %u\n",
	       (unsigned long long)(hit.key.consumed - hit.resident), first, first + 1, slot);
	/* Poison them again for the next restore. */
	memset(e->k, 0xee, (size_t)PAGES * UNIT);
	memset(e->v, 0xee, (size_t)PAGES * UNIT);
	memset(e->rows, 0xee, (size_t)ROWS * ROW_BYTES);
	return 0;
}

static int run(struct engine *e, const char *disk_dir)
{
	uint8_t identity[SEL_IDENTITY_BYTES];
	sel_offload_identity(e->model, SEL_MODE_ORDINARY, identity);
	sel_store_config cfg = {
		.geometry = e->geometry,
		.max_active = 2,
		.memory_bytes = 16 * 2 * UNIT, /* sixteen page records of warm memory */
		.disk_dir = disk_dir,
		.disk_limit = 64 << 20,
		.host_headroom = 64 << 20,
		.drain_on_shutdown = true, /* write DRAM-only records at close */
	};
	memcpy(cfg.identity, identity, sizeof identity);
	memcpy(cfg.model_identity, e->model, sizeof e->model);
	int rc = sel_store_open(&cfg, &e->store);
	if (rc)
		return fail("open", rc);
	sel_store_info info;
	sel_store_describe(e->store, &info);
	printf("store %s, copies with %s, %llu slots of %llu bytes%s%s\n", info.kind,
	       info.transport, (unsigned long long)info.slots_total,
	       (unsigned long long)info.slot_bytes, info.disk_dir ? ", records in " : "",
	       info.disk_dir ? info.disk_dir : "");

	/* 1. A request's first 150 tokens and its checkpoint there. */
	sel_token tokens[200];
	for (int i = 0; i < 200; i++)
		tokens[i] = (sel_token)(1000 + i * 3);
	sel_history h;
	if ((rc = sel_history_init(&h, e->model, NULL, 0)) ||
	    (rc = sel_history_append(&h, tokens, 150)))
		return fail("history", rc);
	const uint32_t pub_pages[2] = {3, 7}, pub_slot = 1;
	for (unsigned i = 0; i < 2; i++) {
		fill(e->k + (size_t)pub_pages[i] * UNIT, UNIT, 0, i);
		fill(e->v + (size_t)pub_pages[i] * UNIT, UNIT, 1, i);
	}
	fill(e->rows + (size_t)pub_slot * ROW_BYTES, ROW_BYTES, 2,
	     150); /* tokens 128..149, state */
	sel_published cp = {.checkpoint = 42,
			    .pages = pub_pages,
			    .n_pages = 2,
			    .tail = 2,
			    .state_slot = pub_slot};
	sel_history_key_at(&h, 150, &cp.key);
	cp.bucket = *sel_history_bound(&h, 150 / SEL_BUCKET_TOKENS);
	sel_retry_reason why;
	sel_outcome o = sel_store_put(e->store, &cp, &why);
	if (o != SEL_QUEUED) {
		fprintf(stderr, "engine: put: %s (%s)\n", sel_outcome_name(o), sel_errmsg());
		return 1;
	}
	sel_store_flush(e->store); /* end of the pass: the copy starts now */
	sel_event ev;
	if (wait_event(e, false, cp.checkpoint, &ev) || ev.type != SEL_EV_STORED)
		return fail("store", ev.error);

	/* 2. The GPU cache lets the checkpoint go; its memory is reused. */
	sel_store_evicted(e->store, &cp.key, 1, NULL);
	memset(e->k, 0xee, (size_t)PAGES * UNIT);
	memset(e->v, 0xee, (size_t)PAGES * UNIT);
	memset(e->rows, 0xee, (size_t)ROWS * ROW_BYTES);

	/* 3. The conversation continues: 180 tokens, nothing on the GPU. */
	if ((rc = sel_history_append(&h, tokens + 150, 30)))
		return fail("history", rc);
	if (restore(e, &h, 20, 3))
		return 1;
	if (disk_dir) {
		/* A restart: the drain writes the DRAM-only record at close, and
		 * the next open finds it on disk. */
		if ((rc = sel_store_close(e->store, 0)))
			return fail("close", rc);
		sel_store_destroy(e->store);
		if ((rc = sel_store_open(&cfg, &e->store)))
			return fail("reopen", rc);
		if (restore(e, &h, 22, 2))
			return 1;
	}

	sel_history_free(&h);
	if ((rc = sel_store_close(e->store, 0)))
		return fail("close", rc);
	sel_store_destroy(e->store);
	e->store = NULL;
	return 0;
}

static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)type;
	(void)ftw;
	return remove(path);
}

int main(void)
{
	struct engine e;
	int major, minor, patch;
	printf("libselene %s\n", sel_version(&major, &minor, &patch));
	if (major != SEL_VERSION_MAJOR) {
		fprintf(stderr, "engine: built for libselene %d, running %d\n", SEL_VERSION_MAJOR,
			major);
		return 1;
	}
	if (engine_init(&e))
		return 1;
	char dir[4096];
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/selene-engine-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	int rc = run(&e, NULL);
	if (rc == 0 && !mkdtemp(dir)) {
		perror("mkdtemp");
		rc = 1;
	}
	if (rc == 0) {
		rc = run(&e, dir); /* the composite: memory over a disk tier */
		if (nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
			fprintf(stderr, "engine: could not remove %s\n", dir);
	}
	engine_free(&e);
	if (rc == 0)
		printf("ok\n");
	return rc;
}
