/*
 * test_prepare.c - the preparation worker (src/helios/prepare.c, design
 * 2.13 "Bounded CPU work"): results from every tier (built, memory, disk,
 * shared), the same image twice skipping decoding and preparation, the
 * same pixels in another encoding sharing tensors, a restart finding the
 * disk tier, a corrupted record rebuilt from the source, two requests with
 * one new image sharing one preparation (with and without retention), the
 * one-tensor-result bound with describes running past a waiting prepare,
 * the cold decoded-source allowance, cancellation, the queue bound, bad
 * images and destruction with work outstanding.  Waits are on the
 * worker's eventfd with deadlines, never fixed sleeps.
 */
#include <fcntl.h>
#include <png.h>
#include <poll.h>
#include <unistd.h>

#include "eos.h"
#include "helios/core.h"
#include "helios/model.h"
#include "helios/prepare.h"
#include "helios/vision.h"
#include "imgutil.h"
#include "inpututil.h"
#include "testutil.h"

static hel_core *core;

#define load test_core_load

/* Wait (deadline 60 s) until n results have been polled into out; no
 * more may be waiting. */
static void wait_results(hel_prep *w, hel_prep_result *out, int n)
{
	hel_prep_result extra;
	test_prep_wait(w, out, n, 60);
	CHECK(hel_prep_poll(w, &extra, 1) == 0);
}

static uint64_t submit(hel_prep *w, uint32_t kind, const struct imgbuf *b, uint64_t tag)
{
	hel_prep_job j = {.kind = kind, .bytes = b->b, .len = b->n, .tag = tag};
	uint64_t t;
	CHECK_OK(hel_prep_submit(w, &j, &t));
	return t;
}

static void png_of(struct imgbuf *b, uint32_t w, uint32_t h, uint32_t seed)
{
	uint8_t *px = img_pattern(w, h, 3, seed);
	img_png(b, w, h, PNG_COLOR_TYPE_RGB, 8, px, w * 3, NULL);
	free(px);
}

static hel_prep_stats stats(hel_prep *w)
{
	hel_prep_stats s;
	hel_prep_stats_get(w, &s);
	return s;
}

/* The result's tensors feed the model (states computable). */
static void check_tensors(const hel_prep_result *r, hel_model *m)
{
	CHECKF(r->rc == 0, "rc %d: %s", r->rc, r->why);
	const sel_input_rec *rec = sel_input_lease_rec(r->tensors);
	CHECK(rec && sel_input_key_eq(&rec->h.key, &r->desc.identity));
	CHECK(rec->len == r->desc.prepared_bytes);
	uint32_t *st = malloc((size_t)r->desc.tokens * core->hidden * 4);
	CHECK_RC(hel_model_image_states(m, rec, st), (int)r->desc.tokens);
	free(st);
}

/* A worker over a fresh memory tier and the disk tier of dirfd: what a
 * (re)started engine has. */
struct tiers {
	sel_input_cache *cache;
	sel_input_disk *disk;
	hel_prep *w;
};

static void start(struct tiers *t, int dirfd)
{
	CHECK_OK(sel_input_cache_create(1 << 20, &t->cache));
	CHECK_OK(sel_input_disk_open(dirfd, NULL, &t->disk));
	hel_prep_opts o = {.core = core, .cache = t->cache, .disk = t->disk};
	CHECK_OK(hel_prep_create(&o, &t->w));
}

static void stop(struct tiers *t)
{
	hel_prep_destroy(t->w);
	sel_input_cache_destroy(t->cache);
	sel_input_disk_close(t->disk);
}

static void test_tiers(const char *dir)
{
	int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	hel_model *m;
	hel_model_opts mo = {.mode = SEL_MODE_ORDINARY, .pages = 4, .rows = 1};
	CHECK_OK(hel_model_create(core, &mo, &m));
	struct tiers t;
	start(&t, dirfd);
	hel_prep *w = t.w;

	struct imgbuf a = {0}, a16 = {0};
	png_of(&a, 40, 30, 1);
	uint8_t *px = img_pattern(40, 30, 3, 1), *wide = malloc(40 * 30 * 6);
	for (int i = 0; i < 40 * 30 * 3; i++)
		wide[2 * i] = wide[2 * i + 1] = px[i];
	img_png(&a16, 40, 30, PNG_COLOR_TYPE_RGB, 16, wide, 40 * 6, NULL);
	free(px);
	free(wide);

	hel_prep_result r[4];
	/* First time: decoded and prepared. */
	uint64_t tk = submit(w, HEL_PREP_PREPARE, &a, 7);
	wait_results(w, r, 1);
	CHECK(r[0].ticket == tk && r[0].tag == 7 && r[0].kind == HEL_PREP_PREPARE);
	CHECK(r[0].desc_tier == HEL_PREP_BUILT && r[0].tensor_tier == HEL_PREP_BUILT);
	CHECK(r[0].desc.tokens == 12 /* 4 x 5 shrunk to 3 x 4 */ &&
	      r[0].desc.encoding == HEL_IMAGE_PNG && r[0].desc.color == HEL_COLOR_RGB &&
	      r[0].desc.width == 40);
	CHECK(r[0].decode_ns > 0 && r[0].prepare_ns > 0);
	check_tensors(&r[0], m);
	sel_input_rec first;
	const sel_input_rec *fr = sel_input_lease_rec(r[0].tensors);
	first.len = fr->len;
	first.bytes = malloc(fr->len);
	memcpy(first.bytes, fr->bytes, fr->len);
	hel_prep_done(w, &r[0]);
	CHECK(r[0].tensors == NULL);
	hel_prep_stats s = stats(w);
	CHECK(s.decodes == 1 && s.preparations == 1 && s.disk_writes == 2 && s.tensors_held == 0);

	/* The same image again: no decoding, no preparation. */
	submit(w, HEL_PREP_PREPARE, &a, 8);
	wait_results(w, r, 1);
	CHECK(r[0].desc_tier == HEL_PREP_MEMORY && r[0].tensor_tier == HEL_PREP_MEMORY);
	CHECK(r[0].decode_ns == 0 && r[0].prepare_ns == 0);
	fr = sel_input_lease_rec(r[0].tensors);
	CHECK(fr->len == first.len && memcmp(fr->bytes, first.bytes, first.len) == 0);
	hel_prep_done(w, &r[0]);
	s = stats(w);
	CHECK(s.decodes == 1 && s.preparations == 1);

	/* The same pixels as a 16-bit PNG: decoded (another source) but the
	 * tensors are the same record. */
	submit(w, HEL_PREP_PREPARE, &a16, 9);
	wait_results(w, r, 1);
	CHECK(r[0].desc_tier == HEL_PREP_BUILT && r[0].tensor_tier == HEL_PREP_MEMORY);
	CHECK(memcmp(r[0].desc.identity.b, first.bytes + 32, 32) == 0); /* the record's key */
	fr = sel_input_lease_rec(r[0].tensors);
	CHECK(memcmp(fr->bytes, first.bytes, first.len) == 0);
	hel_prep_done(w, &r[0]);
	s = stats(w);
	CHECK(s.decodes == 2 && s.preparations == 1);
	stop(&t);

	/* A restart: an empty memory tier, the same directory: disk hits. */
	start(&t, dirfd);
	w = t.w;
	submit(w, HEL_PREP_PREPARE, &a, 10);
	wait_results(w, r, 1);
	CHECK(r[0].desc_tier == HEL_PREP_DISK && r[0].tensor_tier == HEL_PREP_DISK);
	fr = sel_input_lease_rec(r[0].tensors);
	CHECK(memcmp(fr->bytes, first.bytes, first.len) == 0);
	check_tensors(&r[0], m);
	hel_prep_done(w, &r[0]);
	s = stats(w);
	CHECK(s.decodes == 0 && s.preparations == 0 && s.desc_disk == 1 && s.tensor_disk == 1);
	stop(&t);

	/* A corrupted prepared record on disk: a miss, rebuilt from the
	 * request's own bytes, the same tensors. */
	char name[SEL_INPUT_NAME_LEN];
	sel_input_key id;
	memcpy(id.b, first.bytes + 32, 32);
	sel_input_name(SEL_INPUT_PREPARED, &id, name);
	int fd = openat(dirfd, name, O_RDWR);
	CHECK(fd >= 0);
	uint8_t byte;
	CHECK(pread(fd, &byte, 1, 400) == 1);
	byte ^= 0x80;
	CHECK(pwrite(fd, &byte, 1, 400) == 1);
	close(fd);
	start(&t, dirfd);
	w = t.w;
	submit(w, HEL_PREP_PREPARE, &a, 11);
	wait_results(w, r, 1);
	CHECK(r[0].desc_tier == HEL_PREP_DISK && r[0].tensor_tier == HEL_PREP_BUILT);
	fr = sel_input_lease_rec(r[0].tensors);
	CHECK(fr->len == first.len &&
	      memcmp(fr->bytes + fr->h.header_bytes, first.bytes + fr->h.header_bytes,
		     first.len - fr->h.header_bytes) == 0);
	hel_prep_done(w, &r[0]);
	s = stats(w);
	CHECK(s.decodes == 1 && s.preparations == 1 && s.disk_writes == 1);
	struct sel_input_disk_stats ds;
	sel_input_disk_stats(t.disk, &ds);
	CHECK(ds.invalid == 1);
	stop(&t);

	free(first.bytes);
	imgbuf_free(&a);
	imgbuf_free(&a16);
	hel_model_destroy(m);
	close(dirfd);
}

/* Two requests with the same new image at once: one preparation. */
static void test_shared(bool retained)
{
	sel_input_cache *cache = NULL;
	if (retained)
		CHECK_OK(sel_input_cache_create(1 << 20, &cache));
	hel_prep_opts o = {.core = core, .cache = cache};
	hel_prep *w;
	CHECK_OK(hel_prep_create(&o, &w));
	struct imgbuf a = {0};
	png_of(&a, 33, 17, 2);
	submit(w, HEL_PREP_PREPARE, &a, 1);
	submit(w, HEL_PREP_PREPARE, &a, 2);
	hel_prep_result r[2];
	wait_results(w, r, 2);
	CHECK(r[0].rc == 0 && r[1].rc == 0);
	CHECK(r[0].tensor_tier == HEL_PREP_BUILT);
	/* The second job found the first's tensors still held: shared. */
	CHECK(r[1].tensor_tier == HEL_PREP_SHARED);
	CHECK(r[1].desc_tier == (retained ? HEL_PREP_MEMORY : HEL_PREP_BUILT));
	CHECK(sel_input_lease_rec(r[0].tensors) == sel_input_lease_rec(r[1].tensors));
	hel_prep_stats s = stats(w);
	CHECK(s.preparations == 1 && s.tensors_held == 1 && s.tensors_held_max == 1);
	hel_prep_done(w, &r[0]);
	CHECK(stats(w).tensors_held == 1); /* r[1] still holds the same tensors */
	hel_prep_done(w, &r[1]);
	CHECK(stats(w).tensors_held == 0);
	hel_prep_destroy(w);
	sel_input_cache_destroy(cache);
	imgbuf_free(&a);
}

/* At most one image tensor result: later prepares wait for hel_prep_done,
 * describes run past them. */
static void test_bound(void)
{
	hel_prep_opts o = {.core = core};
	hel_prep *w;
	CHECK_OK(hel_prep_create(&o, &w));
	struct imgbuf img[4] = {0};
	for (int i = 0; i < 4; i++)
		png_of(&img[i], 20 + i, 20, 10 + i);
	uint64_t t[4];
	for (int i = 0; i < 3; i++)
		t[i] = submit(w, HEL_PREP_PREPARE, &img[i], i);
	t[3] = submit(w, HEL_PREP_DESCRIBE, &img[3], 3);
	hel_prep_result r[4];
	wait_results(w, r, 2);
	/* P0 holds the slot; P1 and P2 were described and wait; D3 ran. */
	CHECK(r[0].ticket == t[0] && r[0].tensors && r[1].ticket == t[3] && !r[1].tensors);
	CHECK(r[1].rc == 0 && r[1].desc.tokens > 0);
	hel_prep_stats s = stats(w);
	CHECK(s.preparations == 1 && s.tensors_held == 1 && s.queued == 2);
	CHECK(hel_prep_poll(w, r + 2, 2) == 0);
	/* Cancel P2 while it waits; P1 gets the slot once P0 is packed. */
	CHECK_OK(hel_prep_cancel(w, t[2]));
	hel_prep_done(w, &r[0]);
	wait_results(w, r + 2, 2);
	hel_prep_result *p1 = r[2].ticket == t[1] ? &r[2] : &r[3];
	hel_prep_result *p2 = r[2].ticket == t[2] ? &r[2] : &r[3];
	CHECK(p1->ticket == t[1] && p1->rc == 0 && p1->tensors);
	CHECK(p2->ticket == t[2] && p2->rc == -ECANCELED && !p2->tensors);
	hel_prep_done(w, p1);
	hel_prep_done(w, p2);
	hel_prep_done(w, &r[1]);
	s = stats(w);
	CHECK(s.tensors_held_max == 1 && s.tensors_held == 0 && s.preparations == 2 &&
	      s.cancelled == 1 && s.queued == 0);
	CHECK_RC(hel_prep_cancel(w, t[1]), -ENOENT);

	/* The queue bound: with the slot held, parked prepares fill it. */
	hel_prep_destroy(w);
	o.queue_max = 2;
	CHECK_OK(hel_prep_create(&o, &w));
	submit(w, HEL_PREP_PREPARE, &img[0], 0);
	wait_results(w, r, 1);
	submit(w, HEL_PREP_PREPARE, &img[1], 1);
	submit(w, HEL_PREP_PREPARE, &img[2], 2);
	hel_prep_job j = {.kind = HEL_PREP_DESCRIBE, .bytes = img[3].b, .len = img[3].n};
	CHECK_RC(hel_prep_submit(w, &j, NULL), -EAGAIN);
	/* Destroyed with a result held by the caller returned, two jobs
	 * queued: everything released (ASan and the checker see leaks). */
	hel_prep_done(w, &r[0]);
	hel_prep_destroy(w);
	for (int i = 0; i < 4; i++)
		imgbuf_free(&img[i]);
}

/* The cold decoded-source allowance: a describe's decode serves one later
 * prepare; a decode needing the room drops older cold sources. */
static void test_cold(void)
{
	sel_input_cache *cache;
	CHECK_OK(sel_input_cache_create(1 << 20, &cache));
	hel_prep_opts o = {
		.core = core,
		.cache = cache,
		.limits = {.max_encoded_bytes = 1 << 20, .max_pixels = 64 * 64, .max_images = 4}};
	hel_prep *w;
	CHECK_OK(hel_prep_create(&o, &w));
	CHECK(stats(w).cold_limit == 64 * 64 * 8);
	struct imgbuf img[4] = {0};
	for (int i = 0; i < 4; i++)
		png_of(&img[i], 64, 64, 20 + i);
	hel_prep_result r[3];
	/* A describe decodes and keeps the consumed image (64 x 64 x 3). */
	submit(w, HEL_PREP_DESCRIBE, &img[0], 0);
	wait_results(w, r, 1);
	hel_prep_stats s = stats(w);
	CHECK(s.decodes == 1 && s.cold_sources == 1 && s.cold_bytes == 64 * 64 * 3);
	hel_prep_done(w, &r[0]);
	/* The prepare of that source: description from memory, tensors from
	 * the cold source -- no second decode -- which is then gone. */
	submit(w, HEL_PREP_PREPARE, &img[0], 1);
	wait_results(w, r, 1);
	CHECK(r[0].rc == 0 && r[0].desc_tier == HEL_PREP_MEMORY &&
	      r[0].tensor_tier == HEL_PREP_BUILT && r[0].decode_ns == 0);
	s = stats(w);
	CHECK(s.decodes == 1 && s.preparations == 1 && s.cold_sources == 0 && s.cold_bytes == 0);
	hel_prep_done(w, &r[0]);
	/* Three describes: each decode needs 64 x 64 x 7 bytes of the 64 x 64 x 8
	 * allowance, so the older cold source goes to make room. */
	for (int i = 1; i < 4; i++)
		submit(w, HEL_PREP_DESCRIBE, &img[i], 10 + i);
	wait_results(w, r, 3);
	s = stats(w);
	CHECK(s.decodes == 4 && s.cold_peak <= s.cold_limit && s.cold_sources == 1 &&
	      s.cold_bytes == 64 * 64 * 3);
	for (int i = 0; i < 3; i++) {
		CHECK(r[i].rc == 0);
		hel_prep_done(w, &r[i]);
	}
	/* Prefix coverage (or the request going away) drops a cold source. */
	hel_prep_forget(w, &r[0].source); /* img[1]'s: already dropped, nothing happens */
	CHECK(stats(w).cold_sources == 1);
	hel_prep_forget(w, &r[2].source); /* img[3]'s */
	s = stats(w);
	CHECK(s.cold_sources == 0 && s.cold_bytes == 0);
	/* img[1]'s cold source was dropped: its prepare decodes again. */
	submit(w, HEL_PREP_PREPARE, &img[1], 2);
	wait_results(w, r, 1);
	CHECK(r[0].rc == 0 && r[0].desc_tier == HEL_PREP_MEMORY && r[0].decode_ns > 0);
	hel_prep_done(w, &r[0]);
	s = stats(w);
	CHECK(s.decodes == 5 && s.cold_sources == 0 && s.cold_bytes == 0);
	/* Over the pixel limit: refused from the header. */
	struct imgbuf big = {0};
	png_of(&big, 65, 64, 30);
	submit(w, HEL_PREP_PREPARE, &big, 20);
	wait_results(w, r, 1);
	CHECK(r[0].rc == SEL_EOVERSIZE && strstr(r[0].why, "refused before decoding"));
	hel_prep_done(w, &r[0]);
	imgbuf_free(&big);
	/* Not an image. */
	struct imgbuf junk = {0};
	imgbuf_put(&junk, "GIF89a, not ours", 16);
	submit(w, HEL_PREP_DESCRIBE, &junk, 21);
	wait_results(w, r, 1);
	CHECK(r[0].rc == SEL_EFORMAT && strstr(r[0].why, "not a PNG or JPEG"));
	hel_prep_done(w, &r[0]);
	imgbuf_free(&junk);
	hel_prep_destroy(w);
	sel_input_cache_destroy(cache);
	for (int i = 0; i < 4; i++)
		imgbuf_free(&img[i]);
}

/* The caller's calls never wait for the worker's work: hold the worker
 * inside a job (it waits on a cache entry this thread owns) and submit,
 * poll, cancel, forget and read stats meanwhile; if any of them waited for
 * the job, this test would hang (and time out). */
static void test_never_blocks(void)
{
	sel_input_cache *cache;
	CHECK_OK(sel_input_cache_create(1 << 20, &cache));
	hel_prep_opts o = {.core = core, .cache = cache};
	hel_prep *w;
	CHECK_OK(hel_prep_create(&o, &w));
	struct imgbuf a = {0}, b = {0};
	png_of(&a, 16, 16, 40);
	png_of(&b, 16, 16, 41);
	char st[HEL_VISION_SETTINGS_MAX];
	CHECK_OK(hel_vision_settings(core, st));
	sel_input_key src;
	sel_input_source_key("png", a.b, a.n, st, &src);
	sel_input_lease *mine;
	CHECK_RC(sel_input_cache_lookup(cache, SEL_INPUT_SOURCE, &src, &mine), SEL_INPUT_MISS);
	submit(w, HEL_PREP_PREPARE, &a, 1); /* the worker will wait on `mine` */
	/* Wait until it does: the entry gains a waiter. */
	uint64_t deadline = eos_now_ns() + 60ull * 1000000000ull;
	struct sel_input_cache_stats cs;
	do {
		sel_input_cache_stats(cache, &cs);
		CHECK(eos_now_ns() < deadline);
		if (cs.waits == 0)
			eos_sleep_ns(1000000);
	} while (cs.waits == 0);
	uint64_t t2 = submit(w, HEL_PREP_DESCRIBE, &b, 2);
	hel_prep_result r[2];
	CHECK(hel_prep_poll(w, r, 2) == 0);
	CHECK(stats(w).queued == 2);
	CHECK_OK(hel_prep_cancel(w, t2));
	hel_prep_forget(w, &src);
	/* Let it go: this owner fails, the worker becomes the owner itself. */
	sel_input_cache_fail(cache, mine, -EIO);
	wait_results(w, r, 2);
	CHECK(r[0].tag == 1 && r[0].rc == 0 && r[0].desc_tier == HEL_PREP_BUILT);
	CHECK(r[1].tag == 2 && r[1].rc == -ECANCELED);
	hel_prep_done(w, &r[0]);
	hel_prep_done(w, &r[1]);
	hel_prep_destroy(w);
	sel_input_cache_destroy(cache);
	imgbuf_free(&a);
	imgbuf_free(&b);
}

int main(void)
{
	core = load("vision-small");
	char *dir = test_mkdtemp("prepare");
	test_tiers(dir);
	test_shared(true);
	test_shared(false);
	test_bound();
	test_cold();
	test_never_blocks();
	CHECK_OK(test_rmtree(dir));
	free(dir);
	hel_core_free(core);
	printf("test_prepare: ok\n");
	return 0;
}
