/*
 * cuda.c - the CUDA driver table (dlopen), the CUDA copy backend and split
 * pools (design 2.5 "Transfers", the bindings paragraph and split pools;
 * 2.10 "Copy engine queueing"; 2.12).
 *
 * DESIGN
 *
 * Loading.  The driver is libcuda.so.1, opened with dlopen so that neither
 * the build nor CPU-only machines need CUDA.  Every entry point is looked up
 * by the symbol the driver exports for the CUDA 13 API.  CUDA's header
 * renames several calls to versioned symbols (cuMemAlloc -> cuMemAlloc_v2
 * and so on); for the batched copy this matters most: the export
 * "cuMemcpyBatchAsync" is CUDA 12.8's signature with a failIdx argument,
 * and CUDA 13's (dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
 * stream) is exported as "cuMemcpyBatchAsync_v2".  Resolving exact export
 * names (rather than cuGetProcAddress) keeps the loader one table and lets
 * tests feed it a fake driver through a resolver.  A driver without a
 * symbol is too old for this code and is reported as "cuda unavailable",
 * like a missing library or a failing cuInit; the process-wide load runs
 * once and remembers its result.
 *
 * The copy backend.  Each rank's transfer thread makes the rank's primary
 * context current, owns one non-blocking stream at the least priority and
 * one event created with CU_EVENT_BLOCKING_SYNC (the wait sleeps, it does
 * not spin a core) and CU_EVENT_DISABLE_TIMING.  A copy call is one
 * cuMemcpyBatchAsync with a single attribute (source accessed in stream
 * order) for all its entries, bounded to 16 MiB and 4,096 entries so the
 * work queued on the shared copy engines stays small (design 2.10); the
 * transfer thread splits windows to respect the bounds, and the backend
 * asserts them.  The event is recorded and synchronised after every call:
 * host-observed completion is what orders later model-stream work, and the
 * model stream never waits on ours.  On any error the stream is
 * synchronised before the call returns, so a reported failure leaves no
 * copy in flight (design 2.12).
 *
 * Registration pins the slab pool once at startup with
 * cuMemHostRegister_v2(PORTABLE), so every context can use it.  It runs
 * on the caller's thread with device 0's primary context current and the
 * caller's own current context restored afterwards.
 *
 * Split pools: see cuda.h for the addressing.  All virtual memory calls run
 * with devices[0]'s primary context current.  Parts are laid out in the
 * reserved range one after another, each at a multiple of its granularity.
 * Each part is opened to its rank's device and to the host (a
 * CU_MEM_LOCATION_TYPE_HOST_NUMA access descriptor, valid for host-NUMA
 * allocations), as design 2.5 says: "that device and the host only".  The
 * host grant costs no device memory; no store code reads a part on the CPU
 * (records stay per-rank), but tests and tools may.  No other device gets
 * access, which is the whole saving.
 *
 * INVARIANTS
 *   1. A loaded table has every entry non-NULL and cuInit(0) succeeded.
 *   2. The backend holds one primary-context retain per rank from create to
 *      destroy; a rank state owns a stream and an event exactly between a
 *      successful open_rank and close_rank.
 *   3. When copy returns, nothing it issued is in flight on its stream.
 *   4. A split pool's part r is mapped at [base + off_r, + bytes_r) inside
 *      [base, base + bytes), parts do not overlap, and bytes_r >=
 *      slots * share[r]; bytes >= slots * slot_bytes.
 */
#include "cuda.h"

#include <assert.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eos.h"

_Static_assert(sizeof(struct sel_cu_mem_location) == 8, "CUmemLocation layout");
_Static_assert(sizeof(struct sel_cu_mem_alloc_prop) == 32, "CUmemAllocationProp layout");
_Static_assert(offsetof(struct sel_cu_mem_alloc_prop, win32_handle_meta_data) == 16,
	       "CUmemAllocationProp layout");
_Static_assert(offsetof(struct sel_cu_mem_alloc_prop, alloc_flags) == 24,
	       "CUmemAllocationProp layout");
_Static_assert(sizeof(struct sel_cu_mem_access_desc) == 12, "CUmemAccessDesc layout");
_Static_assert(sizeof(struct sel_cu_memcpy_attributes) == 24, "CUmemcpyAttributes layout");
_Static_assert(offsetof(struct sel_cu_memcpy_attributes, flags) == 20, "CUmemcpyAttributes layout");

/* ---- Loading ------------------------------------------------------------- */

static const struct {
	const char *field;  /* the API name */
	const char *symbol; /* the export for the CUDA 13 API */
	size_t off;
} symbols[] = {
#define SYM(f, s)                                                                                  \
	{                                                                                          \
#f, s, offsetof(struct sel_cuda, f)                                                \
	}
	SYM(cuInit, "cuInit"),
	SYM(cuDriverGetVersion, "cuDriverGetVersion"),
	SYM(cuGetErrorName, "cuGetErrorName"),
	SYM(cuGetErrorString, "cuGetErrorString"),
	SYM(cuDeviceGetCount, "cuDeviceGetCount"),
	SYM(cuDeviceGet, "cuDeviceGet"),
	SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
	SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
	SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
	SYM(cuCtxSetCurrent, "cuCtxSetCurrent"),
	SYM(cuCtxGetCurrent, "cuCtxGetCurrent"),
	SYM(cuCtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange"),
	SYM(cuStreamCreateWithPriority, "cuStreamCreateWithPriority"),
	SYM(cuStreamDestroy, "cuStreamDestroy_v2"),
	SYM(cuStreamSynchronize, "cuStreamSynchronize"),
	SYM(cuEventCreate, "cuEventCreate"),
	SYM(cuEventRecord, "cuEventRecord"),
	SYM(cuEventSynchronize, "cuEventSynchronize"),
	SYM(cuEventDestroy, "cuEventDestroy_v2"),
	SYM(cuMemcpyBatchAsync, "cuMemcpyBatchAsync_v2"),
	SYM(cuMemcpyAsync, "cuMemcpyAsync"),
	SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2"),
	SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
	SYM(cuMemHostRegister, "cuMemHostRegister_v2"),
	SYM(cuMemHostUnregister, "cuMemHostUnregister"),
	SYM(cuMemAlloc, "cuMemAlloc_v2"),
	SYM(cuMemFree, "cuMemFree_v2"),
	SYM(cuMemAddressReserve, "cuMemAddressReserve"),
	SYM(cuMemAddressFree, "cuMemAddressFree"),
	SYM(cuMemCreate, "cuMemCreate"),
	SYM(cuMemRelease, "cuMemRelease"),
	SYM(cuMemMap, "cuMemMap"),
	SYM(cuMemUnmap, "cuMemUnmap"),
	SYM(cuMemSetAccess, "cuMemSetAccess"),
	SYM(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
	SYM(cuMemGetInfo, "cuMemGetInfo_v2"),
	SYM(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
#undef SYM
};

const char *sel_cuda_symbol(const char *name)
{
	for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++)
		if (strcmp(symbols[i].field, name) == 0)
			return symbols[i].symbol;
	return NULL;
}

/* Names for the codes a driver that cannot describe itself (a stub library,
 * a fake) may return. */
static const char *builtin_name(sel_cu_result r)
{
	switch (r) {
	case SEL_CU_SUCCESS: return "CUDA_SUCCESS";
	case SEL_CU_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
	case SEL_CU_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
	case SEL_CU_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
	case SEL_CU_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
	case SEL_CU_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
	case SEL_CU_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
	case SEL_CU_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
	case SEL_CU_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
	case SEL_CU_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
	case SEL_CU_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
	case SEL_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
		return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
	case SEL_CU_ERROR_HOST_MEMORY_NOT_REGISTERED:
		return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
	case SEL_CU_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
	case SEL_CU_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
	case SEL_CU_ERROR_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
	case SEL_CU_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
	default: return "CUDA error";
	}
}

/* "NAME (code): description" into buf. */
static const char *describe(const struct sel_cuda *cu, sel_cu_result res, char *buf, size_t len)
{
	const char *name = NULL, *str = NULL;
	if (cu && cu->cuGetErrorName && cu->cuGetErrorName(res, &name) != SEL_CU_SUCCESS)
		name = NULL;
	if (cu && cu->cuGetErrorString && cu->cuGetErrorString(res, &str) != SEL_CU_SUCCESS)
		str = NULL;
	if (!name)
		name = builtin_name(res);
	if (str)
		snprintf(buf, len, "%s (%d): %s", name, res, str);
	else
		snprintf(buf, len, "%s (%d)", name, res);
	return buf;
}

/* The name in parentheses: cuda.h's analyzer-only macro stays in force below. */
int(sel_cuda_fail)(const struct sel_cuda *cu, sel_cu_result res, const char *what, ...)
{
	char w[256], d[192];
	va_list ap;
	if (res == SEL_CU_SUCCESS)
		return 0;
	va_start(ap, what);
	vsnprintf(w, sizeof(w), what, ap);
	va_end(ap);
	return eos_fail(SEL_ECUDA, "cuda: %s: %s", w, describe(cu, res, d, sizeof(d)));
}

/* Fill cu from resolve and run cuInit.  "cuda unavailable: ..." on failure. */
static int fill(struct sel_cuda *cu, sel_cuda_resolve_fn resolve, void *ctx)
{
	for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
		void *fn = resolve(ctx, symbols[i].symbol);
		if (!fn)
			return eos_fail(
				SEL_ECUDA,
				"cuda unavailable: symbol %s missing from %s (driver too old"
				" for CUDA 13?)",
				symbols[i].symbol, cu->source);
		memcpy((char *)cu + symbols[i].off, &fn, sizeof(fn));
	}
	sel_cu_result res = cu->cuInit(0);
	if (res != SEL_CU_SUCCESS) {
		char d[192];
		return eos_fail(SEL_ECUDA, "cuda unavailable: cuInit: %s",
				describe(cu, res, d, sizeof(d)));
	}
	if (cu->cuDriverGetVersion(&cu->driver_version) != SEL_CU_SUCCESS)
		cu->driver_version = 0;
	return 0;
}

static void *dl_resolve(void *ctx, const char *symbol) { return dlsym(ctx, symbol); }

int sel_cuda_load_from(const char *label, sel_cuda_resolve_fn resolve, void *ctx,
		       struct sel_cuda **out)
{
	struct sel_cuda *cu = calloc(1, sizeof(*cu));
	int rc;
	*out = NULL;
	if (!cu)
		return eos_fail(-ENOMEM, "cuda: out of memory");
	snprintf(cu->source, sizeof(cu->source), "%s", label ? label : "resolver");
	if ((rc = fill(cu, resolve, ctx))) {
		free(cu);
		return rc;
	}
	*out = cu;
	return 0;
}

static int open_library(const char *path, struct sel_cuda *cu)
{
	snprintf(cu->source, sizeof(cu->source), "%s", path);
	dlerror();
	cu->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!cu->lib) {
		const char *e = dlerror();
		return eos_fail(SEL_ECUDA, "cuda unavailable: %s", e ? e : path);
	}
	int rc = fill(cu, dl_resolve, cu->lib);
	if (rc) {
		dlclose(cu->lib);
		cu->lib = NULL;
	}
	return rc;
}

int sel_cuda_load_library(const char *path, struct sel_cuda **out)
{
	struct sel_cuda *cu = calloc(1, sizeof(*cu));
	int rc;
	*out = NULL;
	if (!cu)
		return eos_fail(-ENOMEM, "cuda: out of memory");
	if ((rc = open_library(path, cu))) {
		free(cu);
		return rc;
	}
	*out = cu;
	return 0;
}

void sel_cuda_unload(struct sel_cuda *cu)
{
	if (!cu)
		return;
	if (cu->lib)
		dlclose(cu->lib);
	free(cu);
}

static pthread_once_t process_once = PTHREAD_ONCE_INIT;
static struct sel_cuda process_cu;
static int process_rc;
static char process_msg[EOS_ERRMSG_MAX];

static void process_load(void)
{
	process_rc = open_library("libcuda.so.1", &process_cu);
	if (process_rc)
		snprintf(process_msg, sizeof(process_msg), "%s", eos_errmsg());
}

static const struct sel_cuda *_Atomic override_cu;

void sel_cuda_override(const struct sel_cuda *cu) { atomic_store(&override_cu, cu); }

int sel_cuda_load(const struct sel_cuda **out)
{
	const struct sel_cuda *o = atomic_load(&override_cu);
	if (o) {
		*out = o;
		return 0;
	}
	pthread_once(&process_once, process_load);
	if (process_rc) {
		*out = NULL;
		return eos_fail(process_rc, "%s", process_msg);
	}
	*out = &process_cu;
	return 0;
}

int sel_cuda_device_count(const struct sel_cuda *cu, int *count)
{
	*count = 0;
	sel_cu_result res = cu->cuDeviceGetCount(count);
	if (res == SEL_CU_ERROR_NO_DEVICE) {
		*count = 0;
		return 0;
	}
	return sel_cuda_fail(cu, res, "cuDeviceGetCount");
}

int sel_cuda_device_info(const struct sel_cuda *cu, int ordinal, struct sel_cuda_device_info *out)
{
	sel_cu_device dev;
	int v;
	sel_cu_result res;
	memset(out, 0, sizeof(*out));
	out->ordinal = ordinal;
	if ((res = cu->cuDeviceGet(&dev, ordinal)))
		return sel_cuda_fail(cu, res, "cuDeviceGet(%d)", ordinal);
	if ((res = cu->cuDeviceGetAttribute(&v, SEL_CU_DEVICE_ATTRIBUTE_INTEGRATED, dev)))
		return sel_cuda_fail(cu, res, "device %d: integrated attribute", ordinal);
	out->integrated = v != 0;
	/* Attributes newer than the driver read as unsupported. */
	if (cu->cuDeviceGetAttribute(&v, SEL_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) ==
	    SEL_CU_SUCCESS)
		out->host_numa_id = v;
	else
		out->host_numa_id = -1;
	if (cu->cuDeviceGetAttribute(&v,
				     SEL_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
				     dev) == SEL_CU_SUCCESS)
		out->vmm = v != 0;
	if (cu->cuDeviceGetAttribute(
		    &v, SEL_CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
		    dev) == SEL_CU_SUCCESS)
		out->host_numa_vmm = v != 0;
	return 0;
}

int sel_cuda_device_memory(const struct sel_cuda *cu, int ordinal, uint64_t *free_bytes,
			   uint64_t *total_bytes)
{
	sel_cu_device dev;
	sel_cu_ctx ctx = NULL, prev = NULL;
	sel_cu_result res;
	size_t fr = 0, tot = 0;
	int rc;
	*free_bytes = *total_bytes = 0;
	if ((res = cu->cuDeviceGet(&dev, ordinal)))
		return sel_cuda_fail(cu, res, "cuDeviceGet(%d)", ordinal);
	if ((res = cu->cuCtxGetCurrent(&prev)))
		return sel_cuda_fail(cu, res, "cuCtxGetCurrent");
	if ((res = cu->cuDevicePrimaryCtxRetain(&ctx, dev)))
		return sel_cuda_fail(cu, res, "device %d: cuDevicePrimaryCtxRetain", ordinal);
	if ((res = cu->cuCtxSetCurrent(ctx)))
		rc = sel_cuda_fail(cu, res, "device %d: cuCtxSetCurrent", ordinal);
	else
		rc = sel_cuda_fail(cu, cu->cuMemGetInfo(&fr, &tot), "device %d: cuMemGetInfo",
				   ordinal);
	(void)cu->cuCtxSetCurrent(prev);
	(void)cu->cuDevicePrimaryCtxRelease(dev);
	if (rc == 0) {
		*free_bytes = fr;
		*total_bytes = tot;
	}
	return rc;
}

/* ---- The copy backend ------------------------------------------------------ */

struct cuda_backend {
	struct sel_copy_backend be; /* first: the handle callers hold */
	const struct sel_cuda *cu;
	uint32_t ranks;
	int *ordinal;       /* [ranks] */
	sel_cu_device *dev; /* [ranks] */
	sel_cu_ctx *ctx;    /* [ranks] retained primary contexts */
	bool *retained;     /* [ranks] */
};

struct cuda_rank {
	struct cuda_backend *b;
	uint32_t rank;
	sel_cu_stream stream;
	sel_cu_event event;
	sel_cu_dptr *dsts, *srcs; /* [SEL_CUDA_MAX_CALL_ENTRIES] */
	size_t *sizes;
};

static void cuda_close_rank(void *state)
{
	struct cuda_rank *cr = state;
	if (!cr)
		return;
	const struct sel_cuda *cu = cr->b->cu;
	if (cr->event)
		(void)cu->cuEventDestroy(cr->event);
	if (cr->stream) {
		(void)cu->cuStreamSynchronize(cr->stream);
		(void)cu->cuStreamDestroy(cr->stream);
	}
	(void)cu->cuCtxSetCurrent(NULL);
	free(cr->dsts);
	free(cr->srcs);
	free(cr->sizes);
	free(cr);
}

static int cuda_open_rank(void *ctx, uint32_t rank, void **state)
{
	struct cuda_backend *b = ctx;
	const struct sel_cuda *cu = b->cu;
	struct cuda_rank *cr;
	sel_cu_result res;
	int least = 0, greatest = 0, rc = 0;

	*state = NULL;
	if (rank >= b->ranks)
		return eos_fail(-EINVAL,
				"cuda: rank %" PRIu32 " of a backend for %" PRIu32 " ranks", rank,
				b->ranks);
	cr = calloc(1, sizeof(*cr));
	if (!cr)
		return eos_fail(-ENOMEM, "cuda: out of memory");
	cr->b = b;
	cr->rank = rank;
	cr->dsts = calloc(SEL_CUDA_MAX_CALL_ENTRIES, sizeof(*cr->dsts));
	cr->srcs = calloc(SEL_CUDA_MAX_CALL_ENTRIES, sizeof(*cr->srcs));
	cr->sizes = calloc(SEL_CUDA_MAX_CALL_ENTRIES, sizeof(*cr->sizes));
	if (!cr->dsts || !cr->srcs || !cr->sizes) {
		rc = eos_fail(-ENOMEM, "cuda: out of memory for rank %" PRIu32 " batch arrays",
			      rank);
		goto fail;
	}
	if ((res = cu->cuCtxSetCurrent(b->ctx[rank]))) {
		rc = sel_cuda_fail(cu, res, "rank %" PRIu32 " (device %d): cuCtxSetCurrent", rank,
				   b->ordinal[rank]);
		goto fail;
	}
	if ((res = cu->cuCtxGetStreamPriorityRange(&least, &greatest))) {
		rc = sel_cuda_fail(cu, res,
				   "rank %" PRIu32 " (device %d): cuCtxGetStreamPriorityRange",
				   rank, b->ordinal[rank]);
		goto fail;
	}
	if ((res = cu->cuStreamCreateWithPriority(&cr->stream, SEL_CU_STREAM_NON_BLOCKING,
						  least))) {
		cr->stream = NULL;
		rc = sel_cuda_fail(cu, res,
				   "rank %" PRIu32 " (device %d): cuStreamCreateWithPriority(%d)",
				   rank, b->ordinal[rank], least);
		goto fail;
	}
	if ((res = cu->cuEventCreate(&cr->event,
				     SEL_CU_EVENT_BLOCKING_SYNC | SEL_CU_EVENT_DISABLE_TIMING))) {
		cr->event = NULL;
		rc = sel_cuda_fail(cu, res, "rank %" PRIu32 " (device %d): cuEventCreate", rank,
				   b->ordinal[rank]);
		goto fail;
	}
	*state = cr;
	return 0;
fail:
	cuda_close_rank(cr);
	return rc;
}

/* After a failure: wait for whatever reached the stream, keeping rc and
 * its message (extended when the wait fails too). */
static int drain(struct cuda_rank *cr, int rc)
{
	const struct sel_cuda *cu = cr->b->cu;
	sel_cu_result res = cu->cuStreamSynchronize(cr->stream);
	if (res != SEL_CU_SUCCESS) {
		char first[EOS_ERRMSG_MAX], d[192];
		snprintf(first, sizeof(first), "%s", eos_errmsg());
		eos_fail(rc, "%s; then cuStreamSynchronize: %s", first,
			 describe(cu, res, d, sizeof(d)));
	}
	return rc;
}

static int cuda_copy(void *state, const struct sel_copy *c, uint32_t n, enum sel_copy_dir dir)
{
	struct cuda_rank *cr = state;
	const struct sel_cuda *cu = cr->b->cu;
	uint64_t bytes = 0;
	sel_cu_result res;
	(void)dir; /* unified addressing tells the driver */

	if (n == 0)
		return 0;
	assert(n <= SEL_CUDA_MAX_CALL_ENTRIES);
	for (uint32_t i = 0; i < n; i++) {
		cr->dsts[i] = c[i].dst;
		cr->srcs[i] = c[i].src;
		cr->sizes[i] = (size_t)c[i].len;
		bytes += c[i].len;
	}
	assert(bytes <= SEL_CUDA_MAX_CALL_BYTES);

	struct sel_cu_memcpy_attributes attr = {.src_access_order =
							SEL_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
	size_t attr_idx = 0;
	res = cu->cuMemcpyBatchAsync(cr->dsts, cr->srcs, cr->sizes, n, &attr, &attr_idx, 1,
				     cr->stream);
	if (res)
		return drain(cr, sel_cuda_fail(cu, res,
					       "rank %" PRIu32 ": cuMemcpyBatchAsync of %" PRIu32
					       " copies (%" PRIu64 " bytes)",
					       cr->rank, n, bytes));
	if ((res = cu->cuEventRecord(cr->event, cr->stream)))
		return drain(cr,
			     sel_cuda_fail(cu, res, "rank %" PRIu32 ": cuEventRecord", cr->rank));
	if ((res = cu->cuEventSynchronize(cr->event)))
		return drain(cr, sel_cuda_fail(cu, res,
					       "rank %" PRIu32 ": cuEventSynchronize after %" PRIu32
					       " copies (%" PRIu64 " bytes)",
					       cr->rank, n, bytes));
	return 0;
}

static int cuda_host_register(void *ctx, void *addr, uint64_t len)
{
	struct cuda_backend *b = ctx;
	const struct sel_cuda *cu = b->cu;
	sel_cu_ctx prev = NULL;
	sel_cu_result res;
	int rc = 0;
	if ((res = cu->cuCtxGetCurrent(&prev)))
		return sel_cuda_fail(cu, res, "cuCtxGetCurrent");
	if ((res = cu->cuCtxSetCurrent(b->ctx[0])))
		return sel_cuda_fail(cu, res, "cuCtxSetCurrent (device %d)", b->ordinal[0]);
	if ((res = cu->cuMemHostRegister(addr, (size_t)len, SEL_CU_MEMHOSTREGISTER_PORTABLE)))
		rc = sel_cuda_fail(cu, res, "cuMemHostRegister of %" PRIu64 " bytes at %p", len,
				   addr);
	(void)cu->cuCtxSetCurrent(prev);
	return rc;
}

static void cuda_host_unregister(void *ctx, void *addr, uint64_t len)
{
	struct cuda_backend *b = ctx;
	const struct sel_cuda *cu = b->cu;
	sel_cu_ctx prev = NULL;
	(void)len;
	if (cu->cuCtxGetCurrent(&prev) != SEL_CU_SUCCESS)
		prev = NULL;
	(void)cu->cuCtxSetCurrent(b->ctx[0]);
	(void)cu->cuMemHostUnregister(addr);
	(void)cu->cuCtxSetCurrent(prev);
}

int sel_cuda_host_identical(const struct sel_copy_backend *backend, void *addr)
{
	const struct cuda_backend *b = (const struct cuda_backend *)backend;
	const struct sel_cuda *cu = b->cu;
	sel_cu_ctx prev = NULL;
	sel_cu_dptr d = 0;
	sel_cu_result res;
	int rc;
	if ((res = cu->cuCtxGetCurrent(&prev)))
		return sel_cuda_fail(cu, res, "cuCtxGetCurrent");
	if ((res = cu->cuCtxSetCurrent(b->ctx[0])))
		return sel_cuda_fail(cu, res, "cuCtxSetCurrent (device %d)", b->ordinal[0]);
	rc = sel_cuda_fail(cu, cu->cuMemHostGetDevicePointer(&d, addr, 0),
			   "cuMemHostGetDevicePointer of %p", addr);
	(void)cu->cuCtxSetCurrent(prev);
	if (rc == 0 && d != (sel_cu_dptr)(uintptr_t)addr)
		rc = eos_fail(SEL_ECUDA,
			      "cuda: host memory registered at %p has the device address 0x%llx, "
			      "not the same",
			      addr, d);
	return rc;
}

void sel_copy_backend_cuda_destroy(struct sel_copy_backend *backend)
{
	struct cuda_backend *b = (struct cuda_backend *)backend;
	if (!b)
		return;
	if (b->retained)
		for (uint32_t r = 0; r < b->ranks; r++)
			if (b->retained[r])
				(void)b->cu->cuDevicePrimaryCtxRelease(b->dev[r]);
	free(b->ordinal);
	free(b->dev);
	free(b->ctx);
	free(b->retained);
	free(b);
}

int sel_copy_backend_cuda_create(const struct sel_cuda *cu, const int *devices, uint32_t ranks,
				 struct sel_copy_backend **out)
{
	struct cuda_backend *b;
	sel_cu_result res;
	int count = 0, rc;

	*out = NULL;
	if (!cu || !devices || ranks == 0)
		return eos_fail(-EINVAL, "cuda backend: no driver, devices or ranks");
	if ((rc = sel_cuda_device_count(cu, &count)))
		return rc;
	b = calloc(1, sizeof(*b));
	if (!b)
		return eos_fail(-ENOMEM, "cuda backend: out of memory");
	b->cu = cu;
	b->ranks = ranks;
	b->ordinal = calloc(ranks, sizeof(*b->ordinal));
	b->dev = calloc(ranks, sizeof(*b->dev));
	b->ctx = calloc(ranks, sizeof(sel_cu_ctx));
	b->retained = calloc(ranks, sizeof(*b->retained));
	if (!b->ordinal || !b->dev || !b->ctx || !b->retained) {
		rc = eos_fail(-ENOMEM, "cuda backend: out of memory for %" PRIu32 " ranks", ranks);
		goto fail;
	}
	for (uint32_t r = 0; r < ranks; r++) {
		b->ordinal[r] = devices[r];
		if (devices[r] < 0 || devices[r] >= count) {
			rc = eos_fail(SEL_ECUDA,
				      "cuda: rank %" PRIu32
				      " names device %d but %d device%s visible",
				      r, devices[r], count, count == 1 ? " is" : "s are");
			goto fail;
		}
		if ((res = cu->cuDeviceGet(&b->dev[r], devices[r]))) {
			rc = sel_cuda_fail(cu, res, "rank %" PRIu32 ": cuDeviceGet(%d)", r,
					   devices[r]);
			goto fail;
		}
		if ((res = cu->cuDevicePrimaryCtxRetain(&b->ctx[r], b->dev[r]))) {
			rc = sel_cuda_fail(cu, res,
					   "rank %" PRIu32 ": cuDevicePrimaryCtxRetain (device %d)",
					   r, devices[r]);
			goto fail;
		}
		b->retained[r] = true;
	}
	b->be = (struct sel_copy_backend){
		.name = "cuda",
		.ctx = b,
		.open_rank = cuda_open_rank,
		.copy = cuda_copy,
		.close_rank = cuda_close_rank,
		.host_register = cuda_host_register,
		.host_unregister = cuda_host_unregister,
		.max_call_bytes = SEL_CUDA_MAX_CALL_BYTES,
		.max_call_entries = SEL_CUDA_MAX_CALL_ENTRIES,
	};
	*out = &b->be;
	return 0;
fail:
	sel_copy_backend_cuda_destroy(&b->be);
	return rc;
}

/* ---- Split pools -------------------------------------------------------------- */

/* Make p's context current, returning the caller's in *prev. */
static int pool_enter(const sel_cuda_split_pool *p, sel_cu_ctx *prev)
{
	const struct sel_cuda *cu = p->cu;
	sel_cu_result res;
	if ((res = cu->cuCtxGetCurrent(prev)))
		return sel_cuda_fail(cu, res, "split pool: cuCtxGetCurrent");
	if ((res = cu->cuCtxSetCurrent(p->ctx0)))
		return sel_cuda_fail(cu, res, "split pool: cuCtxSetCurrent");
	return 0;
}

void sel_cuda_split_pool_destroy(sel_cuda_split_pool *p)
{
	if (!p)
		return;
	const struct sel_cuda *cu = p->cu;
	sel_cu_ctx prev = NULL;
	bool entered = p->ctx_retained && pool_enter(p, &prev) == 0;
	if (p->part)
		for (uint32_t r = 0; r < p->ranks; r++) {
			struct sel_cuda_split_part *pt = &p->part[r];
			if (pt->mapped)
				(void)cu->cuMemUnmap(pt->base, (size_t)pt->bytes);
			if (pt->created)
				(void)cu->cuMemRelease(pt->handle);
		}
	if (p->reserved)
		(void)cu->cuMemAddressFree(p->base, (size_t)p->bytes);
	if (entered)
		(void)cu->cuCtxSetCurrent(prev);
	if (p->ctx_retained)
		(void)cu->cuDevicePrimaryCtxRelease(p->dev0);
	free(p->part);
	free(p);
}

/* Size rank r's part from its own allocation properties (*prop): its
 * device's host NUMA node, the allocation granularity, its offset in the
 * range to be reserved (*off advanced past it) and the range's alignment. */
static int size_part(sel_cuda_split_pool *p, const int *devices, const sel_slot_layout *l,
		     uint32_t r, struct sel_cu_mem_alloc_prop *prop, uint64_t *off, uint64_t *align)
{
	const struct sel_cuda *cu = p->cu;
	struct sel_cuda_split_part *pt = &p->part[r];
	struct sel_cuda_device_info info;
	sel_cu_result res;
	size_t gran = 0;
	int rc;
	if ((rc = sel_cuda_device_info(cu, devices[r], &info)))
		return rc;
	if (!info.host_numa_vmm)
		return eos_fail(
			SEL_ECUDA,
			"cuda: split pool: device %d (rank %" PRIu32 ") cannot create"
			" host NUMA allocations (CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_"
			"MANAGEMENT_SUPPORTED is 0); use the registered pool",
			devices[r], r);
	pt->device = devices[r];
	pt->numa = info.host_numa_id < 0 ? 0 : info.host_numa_id; /* no NUMA: id 0 */
	pt->share = l->share[r];
	pt->share_off = l->share_off[r];
	*prop = (struct sel_cu_mem_alloc_prop){
		.type = SEL_CU_MEM_ALLOCATION_TYPE_PINNED,
		.requested_handle_types = SEL_CU_MEM_HANDLE_TYPE_NONE,
		.location = {.type = SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = pt->numa},
	};
	if ((res = cu->cuMemGetAllocationGranularity(&gran, prop,
						     SEL_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) ||
	    gran == 0)
		return res ? sel_cuda_fail(
				     cu, res,
				     "split pool: cuMemGetAllocationGranularity (rank %" PRIu32
				     ", NUMA node %d)",
				     r, pt->numa)
			   : eos_fail(SEL_ECUDA, "cuda: split pool: granularity 0 for NUMA node %d",
				      pt->numa);
	uint64_t need, bytes, start, end;
	if (__builtin_mul_overflow(p->slots, pt->share, &need) ||
	    __builtin_add_overflow(need, (uint64_t)gran - 1, &bytes) ||
	    __builtin_add_overflow(*off, (uint64_t)gran - 1, &start) ||
	    __builtin_add_overflow(start / gran * gran, bytes / gran * gran, &end))
		return eos_fail(-EOVERFLOW,
				"split pool: rank %" PRIu32 " part of %" PRIu64 " slots exceeds"
				" 64 bits",
				r, p->slots);
	pt->bytes = bytes / gran * gran;
	pt->base = start / gran * gran; /* an offset until the range exists */
	*off = end;
	if (gran > *align)
		*align = gran;
	return 0;
}

/* Create rank r's pinned allocation, map it at its place in the range and
 * open it to the rank's device and the host only. */
static int map_part(sel_cuda_split_pool *p, uint32_t r, const struct sel_cu_mem_alloc_prop *prop)
{
	const struct sel_cuda *cu = p->cu;
	struct sel_cuda_split_part *pt = &p->part[r];
	sel_cu_result res;
	pt->base += p->base;
	if ((res = cu->cuMemCreate(&pt->handle, (size_t)pt->bytes, prop, 0)))
		return sel_cuda_fail(cu, res,
				     "split pool: cuMemCreate of %" PRIu64
				     " pinned bytes on NUMA node"
				     " %d (rank %" PRIu32 ")",
				     pt->bytes, pt->numa, r);
	pt->created = true;
	if ((res = cu->cuMemMap(pt->base, (size_t)pt->bytes, 0, pt->handle, 0)))
		return sel_cuda_fail(cu, res, "split pool: cuMemMap (rank %" PRIu32 ")", r);
	pt->mapped = true;
	/* The rank's device and the host; no other device maps it. */
	struct sel_cu_mem_access_desc access[2] = {
		{.location = {.type = SEL_CU_MEM_LOCATION_TYPE_DEVICE, .id = pt->device},
		 .flags = SEL_CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
		{.location = {.type = SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = pt->numa},
		 .flags = SEL_CU_MEM_ACCESS_FLAGS_PROT_READWRITE},
	};
	if ((res = cu->cuMemSetAccess(pt->base, (size_t)pt->bytes, access, 2)))
		return sel_cuda_fail(
			cu, res,
			"split pool: cuMemSetAccess for device %d and the host (rank %" PRIu32 ")",
			pt->device, r);
	return 0;
}

int sel_cuda_split_pool_create(const struct sel_cuda *cu, const int *devices,
			       const sel_slot_layout *l, uint64_t slots, sel_cuda_split_pool **out)
{
	sel_cuda_split_pool *p;
	struct sel_cu_mem_alloc_prop *prop = NULL;
	sel_cu_ctx prev = NULL;
	bool entered = false;
	sel_cu_result res;
	uint64_t off = 0, align = 0, identity_bytes;
	int rc = 0;

	*out = NULL;
	if (!cu || !devices || !l || l->ranks == 0 || slots == 0)
		return eos_fail(-EINVAL, "split pool: no driver, devices, layout or slots");
	if (__builtin_mul_overflow(slots, l->slot_bytes, &identity_bytes))
		return eos_fail(-EOVERFLOW,
				"split pool: %" PRIu64 " slots of %" PRIu64 " bytes exceed 64 bits",
				slots, l->slot_bytes);
	p = calloc(1, sizeof(*p));
	if (!p)
		return eos_fail(-ENOMEM, "split pool: out of memory");
	p->cu = cu;
	p->ranks = l->ranks;
	p->slots = slots;
	p->slot_bytes = l->slot_bytes;
	p->part = calloc(l->ranks, sizeof(*p->part));
	prop = calloc(l->ranks, sizeof(*prop));
	if (!p->part || !prop) {
		rc = eos_fail(-ENOMEM, "split pool: out of memory for %" PRIu32 " ranks", l->ranks);
		goto fail;
	}
	if ((res = cu->cuDeviceGet(&p->dev0, devices[0]))) {
		rc = sel_cuda_fail(cu, res, "split pool: cuDeviceGet(%d)", devices[0]);
		goto fail;
	}
	if ((res = cu->cuDevicePrimaryCtxRetain(&p->ctx0, p->dev0))) {
		rc = sel_cuda_fail(cu, res, "split pool: cuDevicePrimaryCtxRetain (device %d)",
				   devices[0]);
		goto fail;
	}
	p->ctx_retained = true;
	if ((rc = pool_enter(p, &prev)))
		goto fail;
	entered = true;
	for (uint32_t r = 0; r < l->ranks; r++)
		if ((rc = size_part(p, devices, l, r, &prop[r], &off, &align)))
			goto fail;
	p->bytes = eos_round_up(off, align);
	assert(p->bytes >= identity_bytes);

	sel_cu_dptr range = 0;
	if ((res = cu->cuMemAddressReserve(&range, (size_t)p->bytes, (size_t)align, 0, 0))) {
		rc = sel_cuda_fail(cu, res, "split pool: cuMemAddressReserve of %" PRIu64 " bytes",
				   p->bytes);
		goto fail;
	}
	p->base = range;
	p->reserved = true;
	for (uint32_t r = 0; r < l->ranks; r++)
		if ((rc = map_part(p, r, &prop[r])))
			goto fail;
	(void)cu->cuCtxSetCurrent(prev);
	free(prop);
	*out = p;
	return 0;
fail:
	if (entered)
		(void)cu->cuCtxSetCurrent(prev);
	if (!p->reserved && p->part)
		for (uint32_t r = 0; r < p->ranks; r++)
			p->part[r].base = 0;
	free(prop);
	sel_cuda_split_pool_destroy(p);
	return rc;
}

void sel_cuda_split_pool_parts(const sel_cuda_split_pool *p, struct sel_xfer_part *parts)
{
	for (uint32_t r = 0; r < p->ranks; r++) {
		parts[r].base = p->part[r].base;
		parts[r].stride = p->part[r].share;
	}
}

uint64_t sel_cuda_split_pool_translate(const sel_cuda_split_pool *p, uint32_t rank, uint64_t id)
{
	if (rank >= p->ranks || id < p->base)
		return 0;
	uint64_t rel = id - p->base, s = rel / p->slot_bytes, in = rel % p->slot_bytes;
	const struct sel_cuda_split_part *pt = &p->part[rank];
	if (s >= p->slots || in < pt->share_off || in - pt->share_off >= pt->share)
		return 0;
	return pt->base + s * pt->share + (in - pt->share_off);
}
