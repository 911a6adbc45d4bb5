/*
 * copy_host.c - the host copy backend: planes in ordinary host memory,
 * copies on the rank's transfer thread (ARCHITECTURE "Two kinds of device
 * memory"; design 2.5).
 *
 * DESIGN
 *   The reference engine computes on the CPU and every CPU test runs the
 *   store through this backend, so it is the path the transfer code is
 *   proven on.  Nothing needs registering and nothing is in flight after a
 *   call returns, so a call never fails.  Stateless: one const instance
 *   serves every transfer set and rank.  No bounds: a window is one call.
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
 *   1 MiB (with a cold destination streaming led at every size).
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
 */
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "transfer.h"

#define STREAM_MIN_CALL (4ull << 20)
#define STREAM_MIN_PIECE 256u
#define LINE 64u

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

static void stream_sse2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t i = head(d, s, n);
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

__attribute__((target("avx2"))) static void stream_avx2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t i = head(d, s, n);
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

enum sel_host_copy sel_host_copy_run(const struct sel_copy *c, uint32_t n, enum sel_host_copy kind)
{
	if (kind == SEL_HOST_COPY_AUTO) {
		uint64_t bytes = 0;
		for (uint32_t i = 0; i < n; i++)
			bytes += c[i].len;
		kind = sel_host_copy_choose(bytes);
	}
	if (!sel_host_copy_available(kind))
		kind = SEL_HOST_COPY_MEMCPY;
#if defined(__x86_64__)
	if (kind != SEL_HOST_COPY_MEMCPY) {
		void (*stream)(uint8_t *, const uint8_t *, size_t) =
			kind == SEL_HOST_COPY_STREAM_AVX2 ? stream_avx2 : stream_sse2;
		for (uint32_t i = 0; i < n; i++) {
			if (c[i].len < STREAM_MIN_PIECE)
				memcpy(ptr(c[i].dst), ptr(c[i].src), (size_t)c[i].len);
			else
				stream(ptr(c[i].dst), ptr(c[i].src), (size_t)c[i].len);
		}
		_mm_sfence();
		return kind;
	}
#endif
	for (uint32_t i = 0; i < n; i++)
		memcpy(ptr(c[i].dst), ptr(c[i].src), (size_t)c[i].len);
	return SEL_HOST_COPY_MEMCPY;
}

static int host_open_rank(void *ctx, uint32_t rank, void **rank_state)
{
	(void)ctx;
	(void)rank;
	*rank_state = NULL;
	return 0;
}

static int host_copy(void *rank_state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	(void)rank_state;
	(void)dir;
	(void)sel_host_copy_run(c, n, SEL_HOST_COPY_AUTO);
	return 0;
}

static void host_close_rank(void *rank_state) { (void)rank_state; }

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
	.close_rank = host_close_rank,
	.host_register = host_register,
	.host_unregister = host_unregister,
	.max_call_bytes = 0,
	.max_call_entries = 0,
};
