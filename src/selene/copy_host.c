/*
 * copy_host.c - the host copy backend: planes in ordinary host memory,
 * copies on the rank's transfer thread and its helper (ARCHITECTURE "Two
 * kinds of device memory"; design 2.5).
 *
 * DESIGN
 *   The reference engine computes on the CPU and every CPU test runs the
 *   store through this backend, so it is the path the transfer code is
 *   proven on.  Nothing needs registering and nothing is in flight after a
 *   call returns, so a call never fails.  One const instance serves every
 *   transfer set; a rank's only state is its helper thread (Splitting,
 *   below).  No bounds: a window is one call.
 *
 *   Bandwidth.  A window is many pieces (a page plane of 2 KiB to a few MiB,
 *   a row piece), scattered on both sides, hundreds of MB in all.  An
 *   ordinary store to a line that is not in the cache first reads the line
 *   (read for ownership), so copying B bytes with ordinary stores moves 3B
 *   over the memory bus: the source, the old destination, and later the
 *   destination written back.  Non-temporal ("streaming") stores fill whole
 *   lines in write-combining buffers and write them out without reading
 *   them: 2B.  glibc's memcpy switches to them only above a threshold
 *   derived from the cache size (3/4 of the shared cache per thread), so one
 *   large memcpy of a window's bytes streams while the window's per-piece
 *   memcpys (128 KiB, 2 MiB) do not: on the machine issue 18 was measured
 *   on, 0.53-0.62 of one large memcpy.  Where glibc's threshold is above
 *   the window too (the AMD EPYC VM of docs/performance.md reports a
 *   320 MiB L3), one large memcpy does not stream either and streaming
 *   beats it.  So a call streams when its pieces add up to
 *   STREAM_MIN_CALL or more, whatever their geometry.  Below that the
 *   destination may still be read from the cache soon (the disk thread
 *   hashes copied-out slots, the model reads restored pages), streaming
 *   would evict it to memory, and memcpy wins: with the destination left
 *   in cache, measured equal at 4 MiB and memcpy 5-15% ahead at 256 KiB to
 *   1 MiB (with a cold destination streaming led at every size).  A
 *   caller that knows nobody reads the destination soon says so
 *   (copy_cold: a restore's row in pieces, transfer.c "Landed windows"),
 *   and such a call streams at any size.
 *
 *   Streaming a piece: ordinary stores up to the destination's first
 *   64-byte line boundary, whole lines with streaming stores (sources may
 *   be unaligned: unaligned loads), ordinary stores for the last partial
 *   line, so no line is written by both kinds of store; pieces shorter than
 *   STREAM_MIN_PIECE are copied with memcpy.  Streaming stores are weakly
 *   ordered: one sfence at the end of the call makes them globally visible
 *   before the transfer thread reports the window done (the report is a
 *   mutex hand-off, which orders ordinary stores only).  AVX2 (32-byte
 *   stores) where the CPU has it (__builtin_cpu_supports, which also
 *   checks that the OS saves the AVX state), else SSE2, which every x86-64
 *   has; elsewhere plain memcpy.  sel_host_copy_run with an explicit kind
 *   lets tests prove each path byte-exact.
 *
 *   Four quarters at once (issue 18).  A piece's body streams in blocks
 *   of four 4 KiB quarters: each step loads the same line (two with AVX2)
 *   of all four quarters, then stores the four, so four streams of loads
 *   and of write-combined lines are in flight instead of one.  glibc's
 *   large memcpy copies four pages at a time the same way; a linear
 *   stream, one line after the next, reached only 0.67-0.70 of it on the
 *   Xeon VM of docs/performance.md ("Issue 18 (stop 31, 2026-12-03):
 *   streaming four quarters at once": 8.0 against 11.9 GB/s for one large
 *   copy, 7.8 against 11.2 for 128 KiB pieces with the four-quarter loop).  The rest of a body, below one
 *   block, streams line after line.
 *
 *   Splitting (issue 18).  One thread streaming a window's pieces reaches
 *   less than one thread streaming one large copy (the Qwen-like window's
 *   128 KiB and 2 KiB pieces 0.77-0.85 of it on the VM of
 *   docs/performance.md, with AVX2 or AVX-512 stores, with or without
 *   software prefetch), so below one large memcpy where glibc streams it;
 *   a second core adds bandwidth.  So a rank's thread has a helper thread
 *   (sel_host_lane, opened by open_rank, joined by close_rank) and splits
 *   calls of SPLIT_MIN_CALL (8 MiB) or more with it: the call's bytes,
 *   its pieces taken end to end, are cut into 1 MiB chunks, and both
 *   threads claim the next chunk under the lane's mutex (held for the
 *   claim only, never during a copy) until none is left; a chunk may begin
 *   or end inside a piece, and each thread copies its part of a piece with
 *   the same head, lines and tail rules, so two threads never write one
 *   byte (a destination line cut between them gets ordinary stores on both
 *   sides).  Each thread fences its streaming stores before it reports a
 *   chunk done (the helper) or returns (the caller), so every byte is
 *   visible when the call returns.  The caller waits only for chunks the
 *   helper claimed: a helper that has not woken (nice 10 on a loaded
 *   machine) claims nothing and the caller copies every chunk itself.
 *   Below 8 MiB the helper's wake (a futex, 7-15 us on this VM: transfer.c
 *   "Wakes") would be a larger share of the copy.  A rank gets a helper
 *   while the process may run on 2 CPUs per rank up to it and one more,
 *   the model worker's (rank 0 of a TP=1 store from 3 CPUs; none on this
 *   2-core machine): more copy threads than CPUs would only take turns,
 *   and a helper on the worker's CPU costs serving what it gains the copy
 *   (on this 2-core VM, serve.py --only hog served 1495-1525 tokens/s with
 *   the helper against 1604-1629 without it in consecutive runs,
 *   docs/performance.md "stop 26").  The model worker never takes the
 *   lane's mutex.  docs/performance.md
 *   "splitting a window with a helper thread" has the measurements.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "eos.h"
#include "transfer.h"

#define STREAM_MIN_CALL (4ull << 20)
#define STREAM_MIN_PIECE 256u
#define LINE 64u
/* Piece bodies of QUAD bytes or more stream four QUARTERs at a time. */
#define QUARTER 4096u
#define QUAD (4 * (size_t)QUARTER)
/* Calls of this many bytes or more are split with the rank's helper, in
 * chunks of SPLIT_CHUNK bytes of the call's pieces taken end to end. */
#define SPLIT_MIN_CALL (8ull << 20)
#define SPLIT_CHUNK (1ull << 20)
/* The transfer threads' nice value (transfer.c XFER_NICE). */
#define LANE_NICE 10

static inline void *ptr(uint64_t a) { return (void *)(uintptr_t)a; }

#if defined(__x86_64__)

/* Ordinary stores up to dst's next line boundary; returns the bytes done. */
static size_t head(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t h = (size_t)(-(uintptr_t)d & (LINE - 1));
	if (h > n)
		h = n;
	memcpy(d, s, h);
	return h;
}

/* Streams whole blocks of QUAD bytes from the start of d, which is
 * line-aligned, four 4 KiB quarters at a time (DESIGN "Four quarters at
 * once"); returns the bytes done, a multiple of QUAD.  One step loads a
 * line at the same offset of each quarter, then stores the four. */
static size_t quad_sse2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t i = 0;
	for (; n - i >= QUAD; i += QUAD)
		for (size_t j = i; j < i + QUARTER; j += LINE) {
#define LD(q, w) _mm_loadu_si128((const __m128i *)(s + j + (size_t)(q)*QUARTER + (size_t)16 * (w)))
#define ST(q, w, v) _mm_stream_si128((__m128i *)(d + j + (size_t)(q)*QUARTER + (size_t)16 * (w)), v)
#define LD4(q)                                                                                     \
	__m128i x##q##0 = LD(q, 0), x##q##1 = LD(q, 1), x##q##2 = LD(q, 2), x##q##3 = LD(q, 3)
#define ST4(q) ST(q, 0, x##q##0), ST(q, 1, x##q##1), ST(q, 2, x##q##2), ST(q, 3, x##q##3)
			LD4(0);
			LD4(1);
			LD4(2);
			LD4(3);
			ST4(0);
			ST4(1);
			ST4(2);
			ST4(3);
#undef LD
#undef ST
#undef LD4
#undef ST4
		}
	return i;
}

static void stream_sse2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t i = head(d, s, n);
	i += quad_sse2(d + i, s + i, n - i);
	for (; n - i >= LINE; i += LINE) {
		__m128i a = _mm_loadu_si128((const __m128i *)(s + i));
		__m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
		_mm_stream_si128((__m128i *)(d + i), a);
		_mm_stream_si128((__m128i *)(d + i + 16), b);
		_mm_stream_si128((__m128i *)(d + i + 32), c);
		_mm_stream_si128((__m128i *)(d + i + 48), e);
	}
	memcpy(d + i, s + i, n - i);
}

/* quad_sse2 with 32-byte stores: two lines of each quarter per step. */
__attribute__((target("avx2"))) static size_t quad_avx2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t i = 0;
	for (; n - i >= QUAD; i += QUAD)
		for (size_t j = i; j < i + QUARTER; j += 2 * (size_t)LINE) {
#define LDY(q, w)                                                                                  \
	_mm256_loadu_si256((const __m256i *)(s + j + (size_t)(q)*QUARTER + (size_t)32 * (w)))
#define STY(q, w, v)                                                                               \
	_mm256_stream_si256((__m256i *)(d + j + (size_t)(q)*QUARTER + (size_t)32 * (w)), v)
#define LDY4(q)                                                                                    \
	__m256i y##q##0 = LDY(q, 0), y##q##1 = LDY(q, 1), y##q##2 = LDY(q, 2), y##q##3 = LDY(q, 3)
#define STY4(q) STY(q, 0, y##q##0), STY(q, 1, y##q##1), STY(q, 2, y##q##2), STY(q, 3, y##q##3)
			LDY4(0);
			LDY4(1);
			LDY4(2);
			LDY4(3);
			STY4(0);
			STY4(1);
			STY4(2);
			STY4(3);
#undef LDY
#undef STY
#undef LDY4
#undef STY4
		}
	return i;
}

__attribute__((target("avx2"))) static void stream_avx2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t i = head(d, s, n);
	i += quad_avx2(d + i, s + i, n - i);
	for (; n - i >= 2 * (size_t)LINE; i += 2 * (size_t)LINE) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
		_mm256_stream_si256((__m256i *)(d + i), a);
		_mm256_stream_si256((__m256i *)(d + i + 32), b);
		_mm256_stream_si256((__m256i *)(d + i + 64), c);
		_mm256_stream_si256((__m256i *)(d + i + 96), e);
	}
	if (n - i >= LINE) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
		_mm256_stream_si256((__m256i *)(d + i), a);
		_mm256_stream_si256((__m256i *)(d + i + 32), b);
		i += LINE;
	}
	memcpy(d + i, s + i, n - i);
}

static bool have_avx2(void) { return __builtin_cpu_supports("avx2"); }

#endif

bool sel_host_copy_available(enum sel_host_copy kind)
{
	switch (kind) {
	case SEL_HOST_COPY_AUTO:
	case SEL_HOST_COPY_MEMCPY: return true;
#if defined(__x86_64__)
	case SEL_HOST_COPY_STREAM_SSE2: return true;
	case SEL_HOST_COPY_STREAM_AVX2: return have_avx2();
#else
	case SEL_HOST_COPY_STREAM_SSE2:
	case SEL_HOST_COPY_STREAM_AVX2: return false;
#endif
	}
	return false;
}

enum sel_host_copy sel_host_copy_choose(uint64_t bytes)
{
	if (bytes < STREAM_MIN_CALL)
		return SEL_HOST_COPY_MEMCPY;
	if (sel_host_copy_available(SEL_HOST_COPY_STREAM_AVX2))
		return SEL_HOST_COPY_STREAM_AVX2;
	if (sel_host_copy_available(SEL_HOST_COPY_STREAM_SSE2))
		return SEL_HOST_COPY_STREAM_SSE2;
	return SEL_HOST_COPY_MEMCPY;
}

/* The kind a call copies with: AUTO chosen by its bytes, and MEMCPY where
 * the kind asked for is not on this CPU. */
static enum sel_host_copy resolve(const struct sel_copy *c, uint32_t n, enum sel_host_copy kind,
				  uint64_t *bytes)
{
	uint64_t b = 0;
	for (uint32_t i = 0; i < n; i++)
		b += c[i].len;
	*bytes = b;
	if (kind == SEL_HOST_COPY_AUTO)
		kind = sel_host_copy_choose(b);
	if (!sel_host_copy_available(kind))
		kind = SEL_HOST_COPY_MEMCPY;
	return kind;
}

/* One piece (or part of one) with kind, which is available. */
static void copy_piece(enum sel_host_copy kind, uint64_t dst, uint64_t src, uint64_t len)
{
#if defined(__x86_64__)
	if (kind != SEL_HOST_COPY_MEMCPY && len >= STREAM_MIN_PIECE) {
		if (kind == SEL_HOST_COPY_STREAM_AVX2)
			stream_avx2(ptr(dst), ptr(src), (size_t)len);
		else
			stream_sse2(ptr(dst), ptr(src), (size_t)len);
		return;
	}
#else
	(void)kind;
#endif
	memcpy(ptr(dst), ptr(src), (size_t)len);
}

/* Make this thread's streaming stores globally visible (before a report
 * or an unlock, which order ordinary stores only). */
static void fence(enum sel_host_copy kind)
{
#if defined(__x86_64__)
	if (kind != SEL_HOST_COPY_MEMCPY)
		_mm_sfence();
#else
	(void)kind;
#endif
}

enum sel_host_copy sel_host_copy_run(const struct sel_copy *c, uint32_t n, enum sel_host_copy kind)
{
	uint64_t bytes;
	kind = resolve(c, n, kind, &bytes);
	for (uint32_t i = 0; i < n; i++)
		copy_piece(kind, c[i].dst, c[i].src, c[i].len);
	fence(kind);
	return kind;
}

/* ---- Splitting a call with a helper thread (DESIGN "Splitting") ---------- */

/* Where a thread is in a call's pieces: piece i begins at byte base of the
 * call's bytes taken end to end.  Each thread claims chunks in ascending
 * order, so its cursor only moves forward within one call. */
struct cursor {
	uint32_t i;
	uint64_t base;
};

/* Copy bytes [a, b) of the call's pieces taken end to end. */
static void copy_span(const struct sel_copy *c, uint32_t n, enum sel_host_copy kind,
		      struct cursor *cur, uint64_t a, uint64_t b)
{
	while (cur->i < n && cur->base + c[cur->i].len <= a) {
		cur->base += c[cur->i].len;
		cur->i++;
	}
	uint64_t base = cur->base;
	for (uint32_t i = cur->i; i < n && base < b; base += c[i].len, i++) {
		uint64_t lo = a > base ? a - base : 0;
		uint64_t hi = b - base < c[i].len ? b - base : c[i].len;
		if (hi > lo)
			copy_piece(kind, c[i].dst + lo, c[i].src + lo, hi - lo);
	}
}

struct sel_host_lane {
	pthread_t tid;
	pthread_mutex_t lock; /* the fields below; never held during a copy */
	pthread_cond_t go;    /* helper: chunks to claim, or stop */
	pthread_cond_t idle;  /* owner: the last chunk finished */
	bool stop, owner_waiting;
	uint64_t gen; /* calls posted */
	const struct sel_copy *c;
	uint32_t n;
	enum sel_host_copy kind;
	uint64_t bytes, nchunks, next, finished;
	uint64_t helped; /* chunks the helper copied, ever */
};

/* Claim the next chunk of the posted call (lock held): its index, or
 * UINT64_MAX when every chunk is claimed. */
static uint64_t claim(struct sel_host_lane *l)
{
	return l->next < l->nchunks ? l->next++ : UINT64_MAX;
}

static uint64_t chunk_end(const struct sel_host_lane *l, uint64_t k)
{
	uint64_t e = (k + 1) * SPLIT_CHUNK;
	return e < l->bytes ? e : l->bytes;
}

static void *lane_main(void *arg)
{
	struct sel_host_lane *l = arg;
	struct cursor cur = {0, 0};
	uint64_t cur_gen = 0;
	eos_thread_name("sel-xfer-lane");
	(void)eos_thread_lower_priority(LANE_NICE);
	pthread_mutex_lock(&l->lock);
	for (;;) {
		uint64_t k;
		while (!l->stop && (k = claim(l)) == UINT64_MAX)
			pthread_cond_wait(&l->go, &l->lock);
		if (l->stop)
			break;
		/* The call stays posted until its last chunk (this one
		 * among them) is finished. */
		const struct sel_copy *c = l->c;
		uint32_t n = l->n;
		enum sel_host_copy kind = l->kind;
		uint64_t a = k * SPLIT_CHUNK, b = chunk_end(l, k);
		if (cur_gen != l->gen) {
			cur_gen = l->gen;
			cur = (struct cursor){0, 0};
		}
		pthread_mutex_unlock(&l->lock);
		copy_span(c, n, kind, &cur, a, b);
		fence(kind);
		pthread_mutex_lock(&l->lock);
		l->helped++;
		if (++l->finished == l->nchunks && l->owner_waiting)
			pthread_cond_signal(&l->idle);
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

int sel_host_lane_open(struct sel_host_lane **out)
{
	struct sel_host_lane *l = calloc(1, sizeof(*l));
	*out = NULL;
	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->go, NULL);
	pthread_cond_init(&l->idle, NULL);
	int e = pthread_create(&l->tid, NULL, lane_main, l);
	if (e) {
		pthread_cond_destroy(&l->idle);
		pthread_cond_destroy(&l->go);
		pthread_mutex_destroy(&l->lock);
		free(l);
		return -e;
	}
	*out = l;
	return 0;
}

void sel_host_lane_close(struct sel_host_lane *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->lock);
	l->stop = true;
	pthread_cond_signal(&l->go);
	pthread_mutex_unlock(&l->lock);
	pthread_join(l->tid, NULL);
	pthread_cond_destroy(&l->idle);
	pthread_cond_destroy(&l->go);
	pthread_mutex_destroy(&l->lock);
	free(l);
}

enum sel_host_copy sel_host_lane_run(struct sel_host_lane *l, const struct sel_copy *c, uint32_t n,
				     enum sel_host_copy kind)
{
	uint64_t bytes, k, mine = 0;
	struct cursor cur = {0, 0};
	kind = resolve(c, n, kind, &bytes);
	pthread_mutex_lock(&l->lock);
	l->gen++;
	l->c = c;
	l->n = n;
	l->kind = kind;
	l->bytes = bytes;
	l->nchunks = bytes / SPLIT_CHUNK + (bytes % SPLIT_CHUNK != 0);
	l->next = l->finished = 0;
	pthread_cond_signal(&l->go);
	while ((k = claim(l)) != UINT64_MAX) {
		uint64_t b = chunk_end(l, k);
		pthread_mutex_unlock(&l->lock);
		copy_span(c, n, kind, &cur, k * SPLIT_CHUNK, b);
		mine++;
		pthread_mutex_lock(&l->lock);
	}
	fence(kind);
	l->finished += mine;
	/* Only chunks the helper claimed and is copying remain. */
	while (l->finished < l->nchunks) {
		l->owner_waiting = true;
		pthread_cond_wait(&l->idle, &l->lock);
	}
	l->owner_waiting = false;
	pthread_mutex_unlock(&l->lock);
	return kind;
}

uint64_t sel_host_lane_helped(struct sel_host_lane *l)
{
	pthread_mutex_lock(&l->lock);
	uint64_t h = l->helped;
	pthread_mutex_unlock(&l->lock);
	return h;
}

/* Whether rank's thread gets a helper: while every rank up to it can have
 * two CPUs of those this process may run on, and the model worker one. */
static bool lane_wanted(uint32_t rank)
{
	return eos_cpus_allowed() >= 2 * ((uint64_t)rank + 1) + 1;
}

/* The rank's state is its helper, or NULL: a helper that cannot start
 * leaves the rank copying alone (a call never fails). */
static int host_open_rank(void *ctx, uint32_t rank, void **rank_state)
{
	struct sel_host_lane *l = NULL;
	(void)ctx;
	if (lane_wanted(rank))
		(void)sel_host_lane_open(&l);
	*rank_state = l;
	return 0;
}

static int host_copy(void *rank_state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	struct sel_host_lane *l = rank_state;
	uint64_t bytes = 0;
	(void)dir;
	for (uint32_t i = 0; i < n && l; i++)
		bytes += c[i].len;
	if (l && bytes >= SPLIT_MIN_CALL)
		(void)sel_host_lane_run(l, c, n, SEL_HOST_COPY_AUTO);
	else
		(void)sel_host_copy_run(c, n, SEL_HOST_COPY_AUTO);
	return 0;
}

/* Streams whatever the call's size (transfer.h copy_cold). */
static int host_copy_cold(void *rank_state, const struct sel_copy *c, uint32_t n,
			  enum sel_copy_dir dir)
{
	(void)rank_state;
	(void)dir;
	(void)sel_host_copy_run(c, n, sel_host_copy_choose(STREAM_MIN_CALL));
	return 0;
}

static void host_close_rank(void *rank_state) { sel_host_lane_close(rank_state); }

static int host_register(void *ctx, void *addr, uint64_t len)
{
	(void)ctx;
	(void)addr;
	(void)len;
	return 0;
}

static void host_unregister(void *ctx, void *addr, uint64_t len)
{
	(void)ctx;
	(void)addr;
	(void)len;
}

const struct sel_copy_backend sel_copy_backend_host = {
	.name = "host",
	.ctx = NULL,
	.open_rank = host_open_rank,
	.copy = host_copy,
	.copy_cold = host_copy_cold,
	.close_rank = host_close_rank,
	.host_register = host_register,
	.host_unregister = host_unregister,
	.max_call_bytes = 0,
	.max_call_entries = 0,
	.cold_any_thread = true,
};
