/*
 * bench/inputs.c - what reusing a CPU input record saves (design 2.13):
 * the time to prepare an image from its encoded bytes, against a memory
 * hit and a disk hit for the same image, through the preparation worker
 * (src/helios/prepare.c) as a request would see it: submit, wait, poll.
 *
 *   build/bench/inputs [CORE...]     (default: vision vision-small)
 *
 * For each core and each image (a 1024 x 768 and a 1920 x 1080 photo-like
 * picture, as PNG and as JPEG q90) it prints, medians of INPUTS_ROUNDS
 * (default 7) rounds:
 *   RESULT inputs_<core>_<image>_prepare_ms <v> ms      decode + prepare, cold
 *   RESULT inputs_<core>_<image>_memory_hit_ms <v> ms   both records in memory
 *   RESULT inputs_<core>_<image>_disk_hit_ms <v> ms     both records on disk (page cache warm)
 *   RESULT inputs_<core>_<image>_memory_speedup <v> x   prepare / memory hit
 *   RESULT inputs_<core>_<image>_disk_speedup <v> x     prepare / disk hit
 *   RESULT inputs_<core>_<image>_disk_vs_memcpy <v> x   disk hit / memcpy of the record
 * The memcpy of the prepared record's bytes, measured in the same run, is
 * the physical floor a hit of that size cannot beat.  A hit still hashes
 * the encoded bytes (the source key), so it costs more than a lookup.
 */
#include <fcntl.h>
#include <limits.h>
#include <png.h>
#include <time.h>
#include <unistd.h>

#include "benchlib.h"
#include "eos.h"
#include "helios/core.h"
#include "helios/prepare.h"
#include "helios/vision.h"
#include "imgutil.h"
#include "inpututil.h"
#include "testutil.h"

static double now_ms(void) { return (double)eos_now_ns() / 1e6; }

/* A photo-like picture: smooth gradients, a few shapes, sensor noise. */
static uint8_t *photo(uint32_t w, uint32_t h)
{
	uint8_t *p = img_smooth(w, h, 3, 3);
	test_rng r;
	test_rng_init(&r, 42);
	for (uint32_t y = 0; y < h; y++)
		for (uint32_t x = 0; x < w; x++) {
			uint8_t *px = p + ((size_t)y * w + x) * 3;
			int64_t dx = (int64_t)x - w / 3, dy = (int64_t)y - h / 2;
			if (dx * dx + dy * dy < (int64_t)(h / 5) * (h / 5))
				px[0] = (uint8_t)(px[0] / 2 + 100);
			for (int c = 0; c < 3; c++)
				px[c] = (uint8_t)(px[c] + test_rng_below(&r, 9) - 4);
		}
	return p;
}

/* One job through the worker; the result's record length and tiers. */
static double run(hel_prep *w, const struct imgbuf *b, uint32_t *tier, uint32_t *dtier, size_t *len)
{
	hel_prep_job j = {.kind = HEL_PREP_PREPARE, .bytes = b->b, .len = b->n};
	hel_prep_result r;
	double t0 = now_ms();
	CHECK_OK(hel_prep_submit(w, &j, NULL));
	test_prep_wait(w, &r, 1, 600);
	double dt = now_ms() - t0;
	CHECKF(r.rc == 0, "%s", r.why);
	*tier = r.tensor_tier;
	*dtier = r.desc_tier;
	*len = sel_input_lease_rec(r.tensors)->len;
	hel_prep_done(w, &r);
	return dt;
}

static void bench(const hel_core *core, const char *dir, const char *label, const struct imgbuf *b,
		  int rounds)
{
	double prep[32], mem[32], disk[32], cpy[32];
	size_t len = 0;
	uint32_t tier, dtier;
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dirfd >= 0);
	for (int i = 0; i < rounds; i++) {
		/* Cold: nothing anywhere. */
		sel_input_cache *cache;
		sel_input_disk *d;
		CHECK_OK(sel_input_cache_create(64 << 20, &cache));
		CHECK_OK(sel_input_disk_open(dirfd, NULL, &d));
		sel_input_disk_reclaim(d, UINT64_MAX);
		hel_prep_opts o = {.core = core, .cache = cache, .disk = d};
		hel_prep *w;
		CHECK_OK(hel_prep_create(&o, &w));
		prep[i] = run(w, b, &tier, &dtier, &len);
		CHECK(tier == HEL_PREP_BUILT && dtier == HEL_PREP_BUILT);
		/* Memory hit. */
		mem[i] = run(w, b, &tier, &dtier, &len);
		CHECK(tier == HEL_PREP_MEMORY && dtier == HEL_PREP_MEMORY);
		hel_prep_destroy(w);
		sel_input_cache_destroy(cache);
		sel_input_disk_close(d);
		/* Disk hit: an empty memory tier over the same directory (a
		 * restart); the page cache holds the files. */
		CHECK_OK(sel_input_cache_create(64 << 20, &cache));
		CHECK_OK(sel_input_disk_open(dirfd, NULL, &d));
		o.cache = cache;
		o.disk = d;
		CHECK_OK(hel_prep_create(&o, &w));
		disk[i] = run(w, b, &tier, &dtier, &len);
		CHECK(tier == HEL_PREP_DISK && dtier == HEL_PREP_DISK);
		hel_prep_destroy(w);
		sel_input_cache_destroy(cache);
		sel_input_disk_close(d);
		/* The floor: copying the record once. */
		uint8_t *src = malloc(len), *dst = malloc(len);
		memset(src, i, len);
		memset(dst, 0, len);
		double t0 = now_ms();
		memcpy(dst, src, len);
		cpy[i] = now_ms() - t0;
		CHECK(dst[len - 1] == (uint8_t)i);
		free(src);
		free(dst);
	}
	close(dirfd);
	double p = bench_median(prep, rounds), m = bench_median(mem, rounds),
	       dk = bench_median(disk, rounds), c = bench_median(cpy, rounds);
	char name[128];
	snprintf(name, sizeof name, "inputs_%s_%s", core->name, label);
	for (char *s = name; *s; s++)
		if (*s == '-')
			*s = '_';
	printf("# %s: %zu encoded bytes, prepared record %zu bytes\n", name, b->n, len);
	printf("RESULT %s_prepare_ms %.3f ms\n", name, p);
	printf("RESULT %s_memory_hit_ms %.3f ms\n", name, m);
	printf("RESULT %s_disk_hit_ms %.3f ms\n", name, dk);
	printf("RESULT %s_memory_speedup %.1f x\n", name, p / m);
	printf("RESULT %s_disk_speedup %.1f x\n", name, p / dk);
	printf("RESULT %s_disk_vs_memcpy %.1f x\n", name, dk / (c > 0 ? c : 1e-6));
	fflush(stdout);
}

int main(int argc, char **argv)
{
	const char *def[] = {"vision", "vision-small"};
	const char **names = argc > 1 ? (const char **)argv + 1 : def;
	int n = argc > 1 ? argc - 1 : 2;
	const char *env = getenv("INPUTS_ROUNDS");
	int rounds = env ? atoi(env) : 7;
	if (rounds < 1 || rounds > 32)
		rounds = 7;
	char *dir = test_mkdtemp("bench-inputs");
	static const uint32_t sizes[][2] = {{1024, 768}, {1920, 1080}};
	struct imgbuf imgs[4] = {0};
	const char *labels[4] = {"1024x768_png", "1024x768_jpeg", "1920x1080_png",
				 "1920x1080_jpeg"};
	for (int s = 0; s < 2; s++) {
		uint8_t *px = photo(sizes[s][0], sizes[s][1]);
		img_png(&imgs[2 * s], sizes[s][0], sizes[s][1], PNG_COLOR_TYPE_RGB, 8, px,
			sizes[s][0] * 3, NULL);
		img_jpeg(&imgs[2 * s + 1], sizes[s][0], sizes[s][1], 3, px, 90, false);
		free(px);
	}
	for (int i = 0; i < n; i++) {
		char path[PATH_MAX], err[512];
		hel_core *c;
		snprintf(path, sizeof path, "%s/cores/%s.core", test_srcdir(), names[i]);
		if (hel_core_load(path, &c, err, sizeof err)) {
			fprintf(stderr, "inputs: %s\n", err);
			return 1;
		}
		if (!c->has_image) {
			printf("# %s: a text-only core, skipped\n", c->name);
			hel_core_free(c);
			continue;
		}
		for (int k = 0; k < 4; k++)
			bench(c, dir, labels[k], &imgs[k], rounds);
		hel_core_free(c);
	}
	for (int k = 0; k < 4; k++)
		imgbuf_free(&imgs[k]);
	test_rmtree(dir);
	free(dir);
	return 0;
}
