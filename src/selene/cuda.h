/*
 * cuda.h - the CUDA driver, loaded at run time, the CUDA copy backend and
 * split pools (design 2.5: "Bindings", "Transfers", split pools;
 * ARCHITECTURE "Two kinds of device memory").
 *
 * Internal to libselene.
 *
 * The build never needs the CUDA toolkit: the few driver types, enum values
 * and struct layouts used here are declared below, copied from CUDA 13's
 * cuda.h (sizes checked by static assertions in cuda.c), and every driver
 * entry point is a pointer in struct sel_cuda, filled by
 * dlopen("libcuda.so.1") and dlsym of the symbol the driver exports for the
 * CUDA 13 API (several are versioned: cuMemcpyBatchAsync_v2 is the CUDA 13
 * signature without failIdx, while the plain cuMemcpyBatchAsync export is
 * CUDA 12.8's).  The table is also the fault-injection point (STYLE.md 4):
 * tests fill it from a resolver of their own.
 *
 * Failures return SEL_ECUDA with a message: "cuda unavailable: <reason>"
 * when the driver cannot be used at all (library, symbol, cuInit), and
 * "cuda: <call>: <CUDA error name> (<code>): <description>" afterwards.
 */
#ifndef SEL_CUDA_H
#define SEL_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slab.h"
#include "transfer.h"

/* ---- Driver types (CUDA 13 cuda.h) --------------------------------------- */

typedef int sel_cu_result;                    /* CUresult */
typedef int sel_cu_device;                    /* CUdevice */
typedef unsigned long long sel_cu_dptr;       /* CUdeviceptr */
typedef unsigned long long sel_cu_mem_handle; /* CUmemGenericAllocationHandle */
typedef struct CUctx_st *sel_cu_ctx;          /* CUcontext */
typedef struct CUstream_st *sel_cu_stream;    /* CUstream */
typedef struct CUevent_st *sel_cu_event;      /* CUevent */

enum {
	SEL_CU_SUCCESS = 0,
	SEL_CU_ERROR_INVALID_VALUE = 1,
	SEL_CU_ERROR_OUT_OF_MEMORY = 2,
	SEL_CU_ERROR_NOT_INITIALIZED = 3,
	SEL_CU_ERROR_DEINITIALIZED = 4,
	SEL_CU_ERROR_STUB_LIBRARY = 34,
	SEL_CU_ERROR_NO_DEVICE = 100,
	SEL_CU_ERROR_INVALID_DEVICE = 101,
	SEL_CU_ERROR_INVALID_CONTEXT = 201,
	SEL_CU_ERROR_INVALID_HANDLE = 400,
	SEL_CU_ERROR_ILLEGAL_ADDRESS = 700,
	SEL_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	SEL_CU_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	SEL_CU_ERROR_NOT_PERMITTED = 800,
	SEL_CU_ERROR_NOT_SUPPORTED = 801,
	SEL_CU_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
	SEL_CU_ERROR_UNKNOWN = 999,
};

/* CUdevice_attribute values used. */
enum {
	SEL_CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
	SEL_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	SEL_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134,
	SEL_CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 141,
};

enum {
	SEL_CU_STREAM_NON_BLOCKING = 0x1,        /* CU_STREAM_NON_BLOCKING */
	SEL_CU_EVENT_BLOCKING_SYNC = 0x1,        /* CU_EVENT_BLOCKING_SYNC */
	SEL_CU_EVENT_DISABLE_TIMING = 0x2,       /* CU_EVENT_DISABLE_TIMING */
	SEL_CU_MEMHOSTREGISTER_PORTABLE = 0x1,   /* CU_MEMHOSTREGISTER_PORTABLE */
	SEL_CU_MEM_ALLOCATION_TYPE_PINNED = 0x1, /* CUmemAllocationType */
	SEL_CU_MEM_HANDLE_TYPE_NONE = 0x0,       /* CUmemAllocationHandleType */
	SEL_CU_MEM_LOCATION_TYPE_DEVICE = 0x1,   /* CUmemLocationType */
	SEL_CU_MEM_LOCATION_TYPE_HOST = 0x2,
	SEL_CU_MEM_LOCATION_TYPE_HOST_NUMA = 0x3,
	SEL_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3, /* CUmemAccess_flags */
	SEL_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,   /* CUmemAllocationGranularity_flags */
	SEL_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1,
	SEL_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 0x1, /* CUmemcpySrcAccessOrder */
};

/* CUmemLocation (8 bytes). */
struct sel_cu_mem_location {
	int type; /* CUmemLocationType */
	int id;
};

/* CUmemAllocationProp (32 bytes). */
struct sel_cu_mem_alloc_prop {
	int type;                   /* CUmemAllocationType */
	int requested_handle_types; /* CUmemAllocationHandleType */
	struct sel_cu_mem_location location;
	void *win32_handle_meta_data;
	struct {
		unsigned char compression_type;
		unsigned char gpu_direct_rdma_capable;
		unsigned short usage;
		unsigned char reserved[4];
	} alloc_flags;
};

/* CUmemAccessDesc (12 bytes). */
struct sel_cu_mem_access_desc {
	struct sel_cu_mem_location location;
	int flags; /* CUmemAccess_flags */
};

/* CUmemcpyAttributes (24 bytes). */
struct sel_cu_memcpy_attributes {
	int src_access_order; /* CUmemcpySrcAccessOrder */
	struct sel_cu_mem_location src_loc_hint;
	struct sel_cu_mem_location dst_loc_hint;
	unsigned int flags; /* CUmemcpyFlags */
};

/* ---- The driver table --------------------------------------------------- */

/* Field names are the CUDA API names; the comment gives the exported
 * symbol where it differs (the versioned ABI the CUDA 13 header maps the
 * name to). */
struct sel_cuda {
	char source[128];   /* "libcuda.so.1", a path, or a test's label */
	void *lib;          /* dlopen handle, NULL for a resolver's table */
	int driver_version; /* cuDriverGetVersion, e.g. 13000 */

	sel_cu_result (*cuInit)(unsigned int flags);
	sel_cu_result (*cuDriverGetVersion)(int *version);
	sel_cu_result (*cuGetErrorName)(sel_cu_result error, const char **str);
	sel_cu_result (*cuGetErrorString)(sel_cu_result error, const char **str);
	sel_cu_result (*cuDeviceGetCount)(int *count);
	sel_cu_result (*cuDeviceGet)(sel_cu_device *device, int ordinal);
	sel_cu_result (*cuDeviceGetAttribute)(int *value, int attrib, sel_cu_device device);
	sel_cu_result (*cuDevicePrimaryCtxRetain)(sel_cu_ctx *ctx, sel_cu_device device);
	sel_cu_result (*cuDevicePrimaryCtxRelease)(sel_cu_device device); /* _v2 */
	sel_cu_result (*cuCtxSetCurrent)(sel_cu_ctx ctx);
	sel_cu_result (*cuCtxGetCurrent)(sel_cu_ctx *ctx);
	sel_cu_result (*cuCtxGetStreamPriorityRange)(int *least, int *greatest);
	sel_cu_result (*cuStreamCreateWithPriority)(sel_cu_stream *stream, unsigned int flags,
						    int priority);
	sel_cu_result (*cuStreamDestroy)(sel_cu_stream stream); /* _v2 */
	sel_cu_result (*cuStreamSynchronize)(sel_cu_stream stream);
	sel_cu_result (*cuEventCreate)(sel_cu_event *event, unsigned int flags);
	sel_cu_result (*cuEventRecord)(sel_cu_event event, sel_cu_stream stream);
	sel_cu_result (*cuEventSynchronize)(sel_cu_event event);
	sel_cu_result (*cuEventDestroy)(sel_cu_event event); /* _v2 */
	/* _v2: CUDA 13's (dsts, srcs, sizes, count, attrs, attrsIdxs,
	 * numAttrs, stream). */
	sel_cu_result (*cuMemcpyBatchAsync)(sel_cu_dptr *dsts, sel_cu_dptr *srcs, size_t *sizes,
					    size_t count, struct sel_cu_memcpy_attributes *attrs,
					    size_t *attrs_idxs, size_t num_attrs,
					    sel_cu_stream stream);
	sel_cu_result (*cuMemcpyAsync)(sel_cu_dptr dst, sel_cu_dptr src, size_t bytes,
				       sel_cu_stream stream);
	sel_cu_result (*cuMemcpyHtoD)(sel_cu_dptr dst, const void *src, size_t bytes); /* _v2 */
	sel_cu_result (*cuMemcpyDtoH)(void *dst, sel_cu_dptr src, size_t bytes);       /* _v2 */
	sel_cu_result (*cuMemHostRegister)(void *p, size_t bytes, unsigned int flags); /* _v2 */
	sel_cu_result (*cuMemHostUnregister)(void *p);
	sel_cu_result (*cuMemAlloc)(sel_cu_dptr *p, size_t bytes); /* _v2 */
	sel_cu_result (*cuMemFree)(sel_cu_dptr p);                 /* _v2 */
	sel_cu_result (*cuMemAddressReserve)(sel_cu_dptr *p, size_t size, size_t alignment,
					     sel_cu_dptr addr, unsigned long long flags);
	sel_cu_result (*cuMemAddressFree)(sel_cu_dptr p, size_t size);
	sel_cu_result (*cuMemCreate)(sel_cu_mem_handle *handle, size_t size,
				     const struct sel_cu_mem_alloc_prop *prop,
				     unsigned long long flags);
	sel_cu_result (*cuMemRelease)(sel_cu_mem_handle handle);
	sel_cu_result (*cuMemMap)(sel_cu_dptr p, size_t size, size_t offset,
				  sel_cu_mem_handle handle, unsigned long long flags);
	sel_cu_result (*cuMemUnmap)(sel_cu_dptr p, size_t size);
	sel_cu_result (*cuMemSetAccess)(sel_cu_dptr p, size_t size,
					const struct sel_cu_mem_access_desc *desc, size_t count);
	sel_cu_result (*cuMemGetAllocationGranularity)(size_t *granularity,
						       const struct sel_cu_mem_alloc_prop *prop,
						       int option);
	sel_cu_result (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes); /* _v2 */
	sel_cu_result (*cuMemHostGetDevicePointer)(sel_cu_dptr *dptr, void *p,
						   unsigned int flags); /* _v2 */
};

/* The process-wide driver: dlopen("libcuda.so.1"), every symbol, cuInit(0),
 * once per process (thread-safe); later calls return the same table or the
 * same failure.  SEL_ECUDA with "cuda unavailable: <reason>" when the
 * library, a symbol ("symbol cuMemcpyBatchAsync_v2 missing (driver too old
 * for CUDA 13)") or cuInit fails.  Never unloaded. */
int sel_cuda_load(const struct sel_cuda **out);

/* Tests: from now on sel_cuda_load hands out cu (a table from
 * sel_cuda_load_from over a fake driver) instead of libcuda.so.1, so the
 * stores' CUDA paths run without a GPU; NULL restores the real driver.  cu
 * must outlive every store opened meanwhile.  Call it between store
 * lifetimes, not concurrently with opens. */
void sel_cuda_override(const struct sel_cuda *cu);

/* A private table from the library at path (dlopen, RTLD_LOCAL), same
 * checks and messages.  Free with sel_cuda_unload. */
int sel_cuda_load_library(const char *path, struct sel_cuda **out);

/* A private table whose symbols come from resolve(ctx, exported name)
 * (tests: a fake driver).  label names it in messages. */
typedef void *(*sel_cuda_resolve_fn)(void *ctx, const char *symbol);
int sel_cuda_load_from(const char *label, sel_cuda_resolve_fn resolve, void *ctx,
		       struct sel_cuda **out);

/* Free a table from sel_cuda_load_library / sel_cuda_load_from.  NULL-safe. */
void sel_cuda_unload(struct sel_cuda *cu);

/* The exported symbol the table's field `name` is loaded from
 * ("cuMemcpyBatchAsync" -> "cuMemcpyBatchAsync_v2"), or NULL. */
const char *sel_cuda_symbol(const char *name);

/* SEL_ECUDA with "cuda: <what>: <name> (<res>): <description>" (what is a
 * printf format).  For res == SEL_CU_SUCCESS, returns 0 and sets nothing. */
int sel_cuda_fail(const struct sel_cuda *cu, sel_cu_result res, const char *what, ...)
	__attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__
/* The analyzer does not follow variadic calls; say what this one returns. */
#define sel_cuda_fail(cu, res, ...)                                                                \
	((void)sel_cuda_fail(cu, res, __VA_ARGS__), (res) == SEL_CU_SUCCESS ? 0 : SEL_ECUDA)
#endif

/* Visible devices (0 is not an error). */
int sel_cuda_device_count(const struct sel_cuda *cu, int *count);

struct sel_cuda_device_info {
	int ordinal;
	bool integrated;    /* GPU and host share physical memory (DGX Spark) */
	int host_numa_id;   /* nearest host NUMA node, -1 when the system has no NUMA */
	bool vmm;           /* cuMemCreate / cuMemMap supported */
	bool host_numa_vmm; /* ... with CU_MEM_LOCATION_TYPE_HOST_NUMA (split pools) */
};
int sel_cuda_device_info(const struct sel_cuda *cu, int ordinal, struct sel_cuda_device_info *out);

/* Device ordinal's free and total memory (cuMemGetInfo_v2 with its primary
 * context current, retained for the call only; the caller's context is
 * restored).  SEL_ECUDA naming the call and the device. */
int sel_cuda_device_memory(const struct sel_cuda *cu, int ordinal, uint64_t *free_bytes,
			   uint64_t *total_bytes);

/* ---- The CUDA copy backend (design 2.5) ----------------------------------- */

#define SEL_CUDA_MAX_CALL_BYTES (16ull << 20) /* per batch call */
#define SEL_CUDA_MAX_CALL_ENTRIES 4096u

/* A copy backend for ranks on devices[0..ranks) (a device may serve
 * several ranks).  Retains each device's primary context until destroy.
 *   open_rank (on the rank's thread): makes the rank's primary context
 *     current, creates a non-blocking stream at the least priority
 *     (cuCtxGetStreamPriorityRange) and an event with blocking sync and no
 *     timing;
 *   copy: one cuMemcpyBatchAsync of at most 16 MiB and 4,096 entries (the
 *     backend's bounds; asserted), one stream-ordered attribute for all
 *     entries, then cuEventRecord + cuEventSynchronize, so the thread sleeps
 *     until the copies landed; on any error it synchronises the stream
 *     before returning, so nothing is in flight;
 *   host_register / host_unregister: cuMemHostRegister_v2 (PORTABLE) /
 *     cuMemHostUnregister with device[0]'s context current, the caller's
 *     current context restored afterwards.
 * cu must outlive the backend.  SEL_ECUDA for a device that does not exist
 * or a context that cannot be retained. */
int sel_copy_backend_cuda_create(const struct sel_cuda *cu, const int *devices, uint32_t ranks,
				 struct sel_copy_backend **out);
void sel_copy_backend_cuda_destroy(struct sel_copy_backend *backend);
/* Whether host memory registered at addr through backend (a CUDA one) has
 * the same device address (cuMemHostGetDevicePointer_v2 with device[0]'s
 * context current): 0, or SEL_ECUDA naming both addresses.  The pool's
 * registrar requires it (design 2.15): its copies name the arena's windows
 * by host address. */
int sel_cuda_host_identical(const struct sel_copy_backend *backend, void *addr);

/* ---- Split pools (design 2.5, memory-only TP>1) ---------------------------- */
/*
 * Registering host memory maps it into every device's page tables, which
 * costs each device device memory in proportion to the bytes registered.
 * A memory store without a disk tier or pool never reads records on the
 * CPU, so its slots can be split by rank: rank r's share of every slot is
 * one pinned cuMemCreate allocation on the host NUMA node nearest rank r's
 * device (CU_MEM_LOCATION_TYPE_HOST_NUMA, id from
 * CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0 where the system has no NUMA),
 * mapped into one reserved address range and opened by cuMemSetAccess to
 * that device and the host only.
 *
 * Addressing.  The reserved range starts at base and is at least
 * slots * slot_bytes long.  The memory store keeps using slot identities
 * exactly as with the registered pool: slot s's identity is
 *     base + s * slot_bytes,
 * and rank r's share of it would be at identity + share_off[r].  Those
 * identity addresses lie inside the range but do not hold the slot's bytes
 * (they are not CPU-readable as records).  Rank r's share of slot s really
 * is at
 *     part[r].base + s * share[r]
 * where part[r] is rank r's allocation, mapped at base + part offset.
 * sel_cuda_split_pool_translate maps an identity address to that place;
 * sel_cuda_split_pool_parts gives each rank's (base, stride) for
 * sel_xfer_create_parts, whose jobs keep naming slots by number.
 *
 * Use.  store_pool.c builds one for a standalone memory store on this
 * backend at TP>1 (sel_store_pool_open_memory, selene.h sel_split_mode):
 * the slab pool keeps the free list over [base, base + slots * slot_bytes)
 * (sel_slab_create_over) and nothing is host-registered.  Destroy only once
 * every transfer set over the parts has drained; after SEL_ESTOPPED the
 * store leaks the pool instead.
 */
struct sel_cuda_split_part {
	int device;
	int numa;           /* host NUMA node of the allocation */
	uint64_t base;      /* where the part is mapped */
	uint64_t bytes;     /* mapped bytes (a granularity multiple) */
	uint64_t share;     /* rank's share: slot s at base + s * share */
	uint64_t share_off; /* the share's offset in an identity slot */
	sel_cu_mem_handle handle;
	bool created, mapped;
};

typedef struct sel_cuda_split_pool {
	const struct sel_cuda *cu;
	uint32_t ranks;
	uint64_t slots, slot_bytes;
	uint64_t base, bytes; /* the reserved range */
	bool reserved;
	sel_cu_device dev0; /* whose primary context is current for VMM calls */
	sel_cu_ctx ctx0;
	bool ctx_retained;
	struct sel_cuda_split_part *part; /* [ranks] */
} sel_cuda_split_pool;

/* Create the parts for slots slots of layout l, rank r on devices[r].
 * SEL_ECUDA when a device lacks host-NUMA virtual memory support or a
 * driver call fails (the message names the call, rank and device); nothing
 * is left allocated. */
int sel_cuda_split_pool_create(const struct sel_cuda *cu, const int *devices,
			       const sel_slot_layout *l, uint64_t slots, sel_cuda_split_pool **out);
/* Unmap, release and free the range.  The caller guarantees no transfer
 * uses it.  NULL-safe and safe on a half-built pool. */
void sel_cuda_split_pool_destroy(sel_cuda_split_pool *p);
/* parts[ranks] for sel_xfer_create_parts. */
void sel_cuda_split_pool_parts(const sel_cuda_split_pool *p, struct sel_xfer_part *parts);
/* The real address of identity address id as seen by rank r, or 0 when id
 * is not inside rank r's share of a slot of the pool. */
uint64_t sel_cuda_split_pool_translate(const sel_cuda_split_pool *p, uint32_t rank, uint64_t id);

#endif
