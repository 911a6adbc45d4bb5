/*
 * cudafake.c - the fake CUDA driver (cudafake.h).
 */
#include "cudafake.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"
#include "testutil.h"


struct CUctx_st {
	int dev;
};

struct pending {
	uint64_t dst, src, len;
};

struct CUstream_st {
	int dev, prio;
	unsigned flags;
	struct pending *q;
	size_t n, cap;
};

struct CUevent_st {
	unsigned flags;
	struct CUstream_st *s;
};

static struct CUctx_st fake_ctx[FAKE_DEVICES] = {{0}, {1}};
__thread sel_cu_ctx fake_current;

struct cudafake fake;

static pthread_mutex_t bad_lock = PTHREAD_MUTEX_INITIALIZER;

static void bad(const char *why)
{
	pthread_mutex_lock(&bad_lock);
	if (atomic_fetch_add(&fake.bad, 1) == 0)
		snprintf(fake.bad_why, sizeof(fake.bad_why), "%s", why);
	pthread_mutex_unlock(&bad_lock);
}

void fake_reset(void)
{
	free(fake.reserved);
	memset(&fake, 0, sizeof(fake));
	atomic_store(&fake.fail_batch, -1);
	fake.numa_vmm = 1;
	fake.streams_at_unmap = -1;
}

static void run_stream(struct CUstream_st *s)
{
	for (size_t i = 0; i < s->n; i++)
		memcpy((void *)(uintptr_t)s->q[i].dst, (const void *)(uintptr_t)s->q[i].src,
		       s->q[i].len);
	s->n = 0;
}

static void enqueue(struct CUstream_st *s, uint64_t dst, uint64_t src, uint64_t len)
{
	if (s->n == s->cap) {
		s->cap = s->cap ? 2 * s->cap : 64;
		s->q = realloc(s->q, s->cap * sizeof(*s->q));
		CHECK(s->q);
	}
	s->q[s->n++] = (struct pending){dst, src, len};
}

static sel_cu_result f_cuInit(unsigned int flags) { return flags ? 1 : fake.init_rc; }
static sel_cu_result f_cuDriverGetVersion(int *v)
{
	*v = 13000;
	return 0;
}
static sel_cu_result f_cuGetErrorName(sel_cu_result e, const char **s)
{
	*s = e == 1     ? "CUDA_ERROR_INVALID_VALUE"
	     : e == 100 ? "CUDA_ERROR_NO_DEVICE"
			: "CUDA_ERROR_FAKE";
	return 0;
}
static sel_cu_result f_cuGetErrorString(sel_cu_result e, const char **s)
{
	(void)e;
	*s = "fake driver error";
	return 0;
}
static sel_cu_result f_cuDeviceGetCount(int *n)
{
	*n = FAKE_DEVICES;
	return 0;
}
static sel_cu_result f_cuDeviceGet(sel_cu_device *d, int ord)
{
	if (ord < 0 || ord >= FAKE_DEVICES)
		return SEL_CU_ERROR_INVALID_DEVICE;
	*d = ord;
	return 0;
}
static sel_cu_result f_cuDeviceGetAttribute(int *v, int attr, sel_cu_device dev)
{
	switch (attr) {
	case SEL_CU_DEVICE_ATTRIBUTE_INTEGRATED: *v = 0; return 0;
	case SEL_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *v = dev + 3; return 0;
	case SEL_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; return 0;
	case SEL_CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*v = fake.numa_vmm;
		return 0;
	default: return SEL_CU_ERROR_INVALID_VALUE;
	}
}
static sel_cu_result f_cuDevicePrimaryCtxRetain(sel_cu_ctx *c, sel_cu_device dev)
{
	*c = &fake_ctx[dev];
	atomic_fetch_add(&fake.retains[dev], 1);
	return 0;
}
static sel_cu_result f_cuDevicePrimaryCtxRelease(sel_cu_device dev)
{
	if (atomic_fetch_sub(&fake.retains[dev], 1) <= 0)
		bad("context released more than retained");
	return 0;
}
static sel_cu_result f_cuCtxSetCurrent(sel_cu_ctx c)
{
	fake_current = c;
	return 0;
}
static sel_cu_result f_cuCtxGetCurrent(sel_cu_ctx *c)
{
	*c = fake_current;
	return 0;
}
static sel_cu_result f_cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
	if (!fake_current)
		return SEL_CU_ERROR_INVALID_CONTEXT;
	*least = 0;
	*greatest = -5;
	return 0;
}
static sel_cu_result f_cuStreamCreateWithPriority(sel_cu_stream *s, unsigned int flags, int prio)
{
	if (!fake_current)
		return SEL_CU_ERROR_INVALID_CONTEXT;
	if (fake.stream_fail)
		return SEL_CU_ERROR_OUT_OF_MEMORY;
	if (flags != SEL_CU_STREAM_NON_BLOCKING || prio != 0)
		bad("stream not non-blocking at the least priority");
	struct CUstream_st *st = calloc(1, sizeof(*st));
	CHECK(st);
	st->dev = fake_current->dev;
	st->prio = prio;
	st->flags = flags;
	atomic_fetch_add(&fake.streams, 1);
	*s = st;
	return 0;
}
static sel_cu_result f_cuStreamDestroy(sel_cu_stream s)
{
	if (s->n)
		bad("stream destroyed with copies in flight");
	free(s->q);
	free(s);
	atomic_fetch_sub(&fake.streams, 1);
	return 0;
}
static sel_cu_result f_cuStreamSynchronize(sel_cu_stream s)
{
	run_stream(s);
	atomic_fetch_add(&fake.stream_syncs, 1);
	return 0;
}
static sel_cu_result f_cuEventCreate(sel_cu_event *e, unsigned int flags)
{
	if (flags != (SEL_CU_EVENT_BLOCKING_SYNC | SEL_CU_EVENT_DISABLE_TIMING))
		bad("event flags");
	struct CUevent_st *ev = calloc(1, sizeof(*ev));
	CHECK(ev);
	ev->flags = flags;
	atomic_fetch_add(&fake.events, 1);
	*e = ev;
	return 0;
}
static sel_cu_result f_cuEventRecord(sel_cu_event e, sel_cu_stream s)
{
	e->s = s;
	return 0;
}
static sel_cu_result f_cuEventSynchronize(sel_cu_event e)
{
	if (!e->s)
		return SEL_CU_ERROR_INVALID_HANDLE;
	bool stalled = false;
	if (atomic_load(&fake.hold)) {
		atomic_fetch_add(&fake.blocked, 1);
		while (atomic_load(&fake.hold))
			eos_sleep_ns(1000000);
		stalled = true;
	}
	run_stream(e->s); /* everything before the record */
	if (stalled)
		atomic_fetch_add(&fake.unblocked, 1);
	return 0;
}
static sel_cu_result f_cuEventDestroy(sel_cu_event e)
{
	free(e);
	atomic_fetch_sub(&fake.events, 1);
	return 0;
}
/* A copy touching the reserved range must stay inside the part mapped for
 * the stream's device (the tests map part r for device r, in order). */
static void check_part(int dev, uint64_t a, uint64_t len)
{
	uint64_t base = (uintptr_t)fake.reserved;
	if (!fake.reserved || a + len <= base || a >= base + fake.reserved_size)
		return;
	for (int m = 0; m < fake.nmapped; m++)
		if (a >= fake.mapped[m].ptr &&
		    a + len <= fake.mapped[m].ptr + fake.mapped[m].size) {
			if (m != dev)
				bad("a device copied into another device's part");
			return;
		}
	bad("a copy outside the mapped parts");
}

static sel_cu_result f_cuMemcpyBatchAsync(sel_cu_dptr *dsts, sel_cu_dptr *srcs, size_t *sizes,
					  size_t count, struct sel_cu_memcpy_attributes *attrs,
					  size_t *idxs, size_t num, sel_cu_stream s)
{
	uint64_t sum = 0;
	if (!fake_current || fake_current->dev != s->dev)
		bad("batch without the stream's context fake_current");
	if (s->n)
		atomic_fetch_add(&fake.inflight_at_entry, 1);
	for (size_t i = 0; i < count; i++) {
		sum += sizes[i];
		check_part(s->dev, dsts[i], sizes[i]);
		check_part(s->dev, srcs[i], sizes[i]);
	}
	if (count == 0 || count > 4096 || sum > (16u << 20))
		bad("batch beyond 4096 entries or 16 MiB");
	if (num != 1 || idxs[0] != 0 ||
	    attrs[0].src_access_order != SEL_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
	    attrs[0].flags != 0)
		bad("batch attributes");
	int m = atomic_load(&fake.max_count);
	while ((int)count > m && !atomic_compare_exchange_weak(&fake.max_count, &m, (int)count))
		;
	unsigned long long mb = atomic_load(&fake.max_bytes);
	while (sum > mb && !atomic_compare_exchange_weak(&fake.max_bytes, &mb, sum))
		;
	int b = atomic_fetch_add(&fake.batches, 1);
	if (b == atomic_load(&fake.fail_batch)) {
		for (size_t i = 0; i < count / 2; i++)
			enqueue(s, dsts[i], srcs[i], sizes[i]);
		return SEL_CU_ERROR_INVALID_VALUE;
	}
	for (size_t i = 0; i < count; i++)
		enqueue(s, dsts[i], srcs[i], sizes[i]);
	return 0;
}
static sel_cu_result f_cuMemcpyAsync(sel_cu_dptr dst, sel_cu_dptr src, size_t n, sel_cu_stream s)
{
	enqueue(s, dst, src, n);
	return 0;
}
static sel_cu_result f_cuMemcpyHtoD(sel_cu_dptr dst, const void *src, size_t n)
{
	memcpy((void *)(uintptr_t)dst, src, n);
	return 0;
}
static sel_cu_result f_cuMemcpyDtoH(void *dst, sel_cu_dptr src, size_t n)
{
	memcpy(dst, (const void *)(uintptr_t)src, n);
	return 0;
}
static sel_cu_result f_cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
	(void)p;
	(void)n;
	if (!fake_current)
		bad("registration without a fake_current context");
	if (flags != SEL_CU_MEMHOSTREGISTER_PORTABLE)
		bad("registration not PORTABLE");
	atomic_fetch_add(&fake.registers, 1);
	return 0;
}
static sel_cu_result f_cuMemHostUnregister(void *p)
{
	(void)p;
	atomic_fetch_add(&fake.unregisters, 1);
	return 0;
}
static sel_cu_result f_cuMemAlloc(sel_cu_dptr *p, size_t n)
{
	void *m = malloc(n);
	*p = (uintptr_t)m;
	return m ? 0 : SEL_CU_ERROR_OUT_OF_MEMORY;
}
static sel_cu_result f_cuMemFree(sel_cu_dptr p)
{
	free((void *)(uintptr_t)p);
	return 0;
}
static sel_cu_result f_cuMemAddressReserve(sel_cu_dptr *p, size_t size, size_t align,
					   sel_cu_dptr addr, unsigned long long flags)
{
	if (addr || flags || fake.reserved || align == 0 || size % align)
		bad("address reservation arguments");
	fake.reserved = aligned_alloc(align, size);
	CHECK(fake.reserved);
	memset(fake.reserved, 0, size);
	fake.reserved_size = size;
	fake.reserved_align = align;
	*p = (uintptr_t)fake.reserved;
	return 0;
}
static sel_cu_result f_cuMemAddressFree(sel_cu_dptr p, size_t size)
{
	if ((void *)(uintptr_t)p != fake.reserved || size != fake.reserved_size)
		bad("freeing another range");
	free(fake.reserved);
	fake.reserved = NULL;
	fake.freed++;
	return 0;
}
static sel_cu_result f_cuMemCreate(sel_cu_mem_handle *h, size_t size,
				   const struct sel_cu_mem_alloc_prop *prop,
				   unsigned long long flags)
{
	if (flags || fake.ncreated >= 4)
		bad("cuMemCreate arguments");
	fake.created[fake.ncreated].size = size;
	fake.created[fake.ncreated].prop = *prop;
	*h = 100 + (sel_cu_mem_handle)fake.ncreated++;
	return 0;
}
static sel_cu_result f_cuMemRelease(sel_cu_mem_handle h)
{
	(void)h;
	fake.nreleased++;
	return 0;
}
static sel_cu_result f_cuMemMap(sel_cu_dptr p, size_t size, size_t off, sel_cu_mem_handle h,
				unsigned long long flags)
{
	uint64_t base = (uintptr_t)fake.reserved;
	if (off || flags || fake.nmapped >= 4 || p < base || p + size > base + fake.reserved_size)
		bad("cuMemMap outside the range");
	fake.mapped[fake.nmapped].ptr = p;
	fake.mapped[fake.nmapped].size = size;
	fake.mapped[fake.nmapped++].h = h;
	return 0;
}
static sel_cu_result f_cuMemUnmap(sel_cu_dptr p, size_t size)
{
	(void)p;
	(void)size;
	if (fake.nunmapped == 0)
		fake.streams_at_unmap = atomic_load(&fake.streams);
	fake.nunmapped++;
	return 0;
}
static sel_cu_result f_cuMemSetAccess(sel_cu_dptr p, size_t size,
				      const struct sel_cu_mem_access_desc *d, size_t n)
{
	if (fake.naccess >= 4 || n > 4)
		bad("cuMemSetAccess arguments");
	fake.access[fake.naccess].ptr = p;
	fake.access[fake.naccess].size = size;
	fake.access[fake.naccess].n = n;
	memcpy(fake.access[fake.naccess++].d, d, n * sizeof(*d));
	return 0;
}
static sel_cu_result
f_cuMemGetAllocationGranularity(size_t *g, const struct sel_cu_mem_alloc_prop *prop, int option)
{
	if (prop->location.type != SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA)
		bad("granularity for a non-host-NUMA location");
	*g = option == SEL_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED ? 65536 : 4096;
	return 0;
}
static sel_cu_result f_cuMemHostGetDevicePointer(sel_cu_dptr *d, void *p, unsigned int flags)
{
	if (!fake_current || flags)
		return SEL_CU_ERROR_INVALID_VALUE;
	*d = (uintptr_t)p; /* unified addressing */
	return 0;
}
static sel_cu_result f_cuMemGetInfo(size_t *fr, size_t *tot)
{
	if (!fake_current)
		return SEL_CU_ERROR_INVALID_CONTEXT;
	*tot = (size_t)80 << 30;
	*fr = *tot - ((size_t)1 << 30); /* tests wrap it for smaller figures */
	return 0;
}

static const struct {
	const char *name;
	void *fn;
} fake_syms[] = {
#define F(n, f)                                                                                    \
	{                                                                                          \
		n, (void *)f                                                                       \
	}
	F("cuInit", f_cuInit),
	F("cuDriverGetVersion", f_cuDriverGetVersion),
	F("cuGetErrorName", f_cuGetErrorName),
	F("cuGetErrorString", f_cuGetErrorString),
	F("cuDeviceGetCount", f_cuDeviceGetCount),
	F("cuDeviceGet", f_cuDeviceGet),
	F("cuDeviceGetAttribute", f_cuDeviceGetAttribute),
	F("cuDevicePrimaryCtxRetain", f_cuDevicePrimaryCtxRetain),
	F("cuDevicePrimaryCtxRelease_v2", f_cuDevicePrimaryCtxRelease),
	F("cuCtxSetCurrent", f_cuCtxSetCurrent),
	F("cuCtxGetCurrent", f_cuCtxGetCurrent),
	F("cuCtxGetStreamPriorityRange", f_cuCtxGetStreamPriorityRange),
	F("cuStreamCreateWithPriority", f_cuStreamCreateWithPriority),
	F("cuStreamDestroy_v2", f_cuStreamDestroy),
	F("cuStreamSynchronize", f_cuStreamSynchronize),
	F("cuEventCreate", f_cuEventCreate),
	F("cuEventRecord", f_cuEventRecord),
	F("cuEventSynchronize", f_cuEventSynchronize),
	F("cuEventDestroy_v2", f_cuEventDestroy),
	F("cuMemcpyBatchAsync_v2", f_cuMemcpyBatchAsync),
	F("cuMemcpyAsync", f_cuMemcpyAsync),
	F("cuMemcpyHtoD_v2", f_cuMemcpyHtoD),
	F("cuMemcpyDtoH_v2", f_cuMemcpyDtoH),
	F("cuMemHostRegister_v2", f_cuMemHostRegister),
	F("cuMemHostUnregister", f_cuMemHostUnregister),
	F("cuMemAlloc_v2", f_cuMemAlloc),
	F("cuMemFree_v2", f_cuMemFree),
	F("cuMemAddressReserve", f_cuMemAddressReserve),
	F("cuMemAddressFree", f_cuMemAddressFree),
	F("cuMemCreate", f_cuMemCreate),
	F("cuMemRelease", f_cuMemRelease),
	F("cuMemMap", f_cuMemMap),
	F("cuMemUnmap", f_cuMemUnmap),
	F("cuMemSetAccess", f_cuMemSetAccess),
	F("cuMemGetAllocationGranularity", f_cuMemGetAllocationGranularity),
	F("cuMemGetInfo_v2", f_cuMemGetInfo),
	F("cuMemHostGetDevicePointer_v2", f_cuMemHostGetDevicePointer),
#undef F
};

void *fake_resolve(void *ctx, const char *sym)
{
	(void)ctx;
	if (strcmp(sym, "cuMemcpyBatchAsync") == 0)
		atomic_fetch_add(&fake.plain_batch_asked, 1);
	if (fake.missing && strcmp(sym, fake.missing) == 0)
		return NULL;
	for (size_t i = 0; i < sizeof(fake_syms) / sizeof(fake_syms[0]); i++)
		if (strcmp(fake_syms[i].name, sym) == 0)
			return fake_syms[i].fn;
	return NULL;
}

struct sel_cuda *fake_load(void)
{
	struct sel_cuda *cu;
	CHECK_OK(sel_cuda_load_from("fake", fake_resolve, NULL, &cu));
	CHECK(cu->driver_version == 13000);
	return cu;
}
