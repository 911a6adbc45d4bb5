/*
 * main.c - the flare command.
 *
 * Until the serving engine lands (`flare run` with the HTTP API), `flare run`
 * runs a short demonstration of the store's primitives on the built-in
 * geometry: it builds a cache geometry, names its layout, derives keys for a
 * conversation and reserves slots the way the memory store will, printing
 * what it did.  It exits 0 when every step worked.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "selene.h"
#include "slab.h"

static int usage(FILE *f)
{
	fprintf(f, "usage: flare run      demonstrate the store primitives\n"
		   "       flare --help   this text\n");
	return f == stderr ? 2 : 0;
}

static int demo(void)
{
	/* A tiny two-rank geometry: key/value planes and one row per slot. */
	enum { PAGES = 64, ROWS = 8, PT = 64 };
	sel_allocation a[] = {
		{0, "key.0", SEL_GROUP_KV_PAGES, SEL_MEM_HOST, 0x10000, 8192, PAGES},
		{0, "value.0", SEL_GROUP_KV_PAGES, SEL_MEM_HOST, 0x20000, 8192, PAGES},
		{0, "rows", SEL_GROUP_STATE_ROWS, SEL_MEM_HOST, 0x30000, 40000, ROWS},
		{1, "key.0", SEL_GROUP_KV_PAGES, SEL_MEM_HOST, 0x40000, 8192, PAGES},
		{1, "value.0", SEL_GROUP_KV_PAGES, SEL_MEM_HOST, 0x50000, 8192, PAGES},
		{1, "rows", SEL_GROUP_STATE_ROWS, SEL_MEM_HOST, 0x60000, 40000, ROWS},
	};
	sel_geometry *g = NULL;
	sel_slab_pool *pool = NULL;
	sel_slot_layout layout = {0};
	sel_history h = {0};
	int rc = sel_geometry_build(a, sizeof a / sizeof a[0], 2, PT, &g);
	if (rc)
		goto fail;
	uint8_t fp[SEL_FINGERPRINT_BYTES], model[SEL_IDENTITY_BYTES] = {0}, id[SEL_IDENTITY_BYTES];
	char hex[65];
	sel_layout_fingerprint(g, fp);
	sel_offload_identity(model, SEL_MODE_ORDINARY, id);
	printf("geometry: %u ranks, %u planes per rank, %llu-byte rows\n", g->ranks,
	       g->rank[0].n_planes, (unsigned long long)g->rank[0].row.unit_bytes);
	printf("layout fingerprint %s\n", sel_hex(fp, sizeof fp, hex));
	printf("namespace identity %s\n", sel_hex(id, sizeof id, hex));

	if ((rc = sel_history_init(&h, model, NULL, 0)))
		goto fail;
	const char *text = "<user> What is the capital of France? <assistant> Paris.";
	sel_token toks[512];
	size_t n = 0;
	for (int rep = 0; rep < 8; rep++)
		for (const char *p = text; *p && n < 512; p++)
			toks[n++] = (unsigned char)*p;
	if ((rc = sel_history_append(&h, toks, n)))
		goto fail;
	for (uint64_t c = 64; c <= n; c += 128) {
		sel_key k;
		sel_history_key_at(&h, c, &k);
		printf("key at %4llu tokens: %s (bucket %s)\n", (unsigned long long)c,
		       sel_hex(k.digest.b, 16, hex), sel_hex(sel_history_bound(&h, c / 64)->b, 4, hex + 40));
	}

	if ((rc = sel_slot_layout_init(&layout, g)))
		goto fail;
	uint64_t intake;
	char warn[256];
	if ((rc = sel_intake_slots(4, layout.row_slots, layout.slot_bytes, UINT64_MAX, &intake, warn,
				   sizeof warn)))
		goto fail;
	if ((rc = sel_slab_create(layout.slot_bytes, 256, intake, false, NULL, &pool)))
		goto fail;
	uint32_t slots[16];
	if ((rc = sel_slab_alloc(pool, 4 + layout.row_slots, SEL_SLAB_WARM, slots)))
		goto fail;
	printf("slots: %llu bytes each, a row takes %u; pool %llu slots (%llu intake), %llu in use\n",
	       (unsigned long long)layout.slot_bytes, layout.row_slots,
	       (unsigned long long)sel_slab_total(pool), (unsigned long long)sel_slab_intake(pool),
	       (unsigned long long)sel_slab_in_use(pool));
	sel_slab_free(pool, slots, 4 + layout.row_slots);
	if ((rc = sel_slab_check(pool)))
		goto fail;
	printf("ok\n");
fail:
	if (rc)
		fprintf(stderr, "flare: %s: %s\n", sel_strerror(rc), sel_errmsg());
	sel_slab_destroy(pool);
	sel_slot_layout_free(&layout);
	sel_history_free(&h);
	sel_geometry_free(g);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
		return usage(stdout);
	/* switch to flare_serve once src/helios/engine.c exists:
	 *	return flare_serve(argc - 1, argv + 1, &flare_engine_backend);
	 * (serve.h, backend.h; that reference is what links hel_engine_*). */
	if (!strcmp(argv[1], "run"))
		return demo();
	fprintf(stderr, "flare: unknown command '%s'\n", argv[1]);
	return usage(stderr);
}
