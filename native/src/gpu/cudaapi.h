/* cudaapi.h (private): local declarations of the CUDA driver API and NVML symbols that
 * torchspark calls, resolved once per process with dlopen/dlsym (gpu.c). No vendor header
 * is needed to build; when the toolkit's headers are present the build checks these
 * declarations against them (native/abi/abi_check.c: a mismatch fails the build).
 *
 * Versioned names: cuda.h maps cuMemAlloc to cuMemAlloc_v2 and so on, and the libraries
 * export both; a bare dlsym("cuMemAlloc") would silently get the legacy ABI, so the
 * tables name the versioned symbols. */
#ifndef TSP_CUDAAPI_H
#define TSP_CUDAAPI_H

#include <stddef.h>

/* ---- CUDA driver ---- */
typedef unsigned int tsp_cu_result; /* enum cudaError_enum: no negative values */
typedef int tsp_cu_device;
typedef unsigned long long tsp_cu_deviceptr;
/* The opaque handles keep the driver's struct tags, so that function types compare equal
 * to cuda.h's in the build-time check; the structs are never defined here. */
typedef struct CUctx_st *tsp_cu_context;
typedef struct CUstream_st *tsp_cu_stream;
typedef struct {
    char bytes[16];
} tsp_cu_uuid_local;
#ifdef TSP_ABI_CHECK /* abi_check.c: the function types are compared with cuda.h's */
typedef CUuuid tsp_cu_uuid;
#else
typedef tsp_cu_uuid_local tsp_cu_uuid;
#endif

#define TSP_CUDA_SUCCESS 0u
#define TSP_CUDA_ERROR_NOT_INITIALIZED 3u
#define TSP_CUDA_ERROR_STUB_LIBRARY 34u
#define TSP_CUDA_ERROR_INSUFFICIENT_DRIVER 35u
#define TSP_CUDA_ERROR_NO_DEVICE 100u
#define TSP_CUDA_ERROR_INVALID_DEVICE 101u
#define TSP_CUDA_ERROR_NOT_READY 600u
#define TSP_CU_STREAM_NON_BLOCKING 0x1u

/* X(name, symbol, return type, parameters): every driver function used. */
#define TSP_CUDA_FUNCS(X)                                                                          \
    X(init, cuInit, tsp_cu_result, (unsigned int))                                                 \
    X(device_get_count, cuDeviceGetCount, tsp_cu_result, (int *))                                  \
    X(device_get, cuDeviceGet, tsp_cu_result, (tsp_cu_device *, int))                              \
    X(device_get_pci_bus_id, cuDeviceGetPCIBusId, tsp_cu_result, (char *, int, tsp_cu_device))     \
    X(device_get_uuid, cuDeviceGetUuid_v2, tsp_cu_result, (tsp_cu_uuid *, tsp_cu_device))          \
    X(primary_ctx_retain, cuDevicePrimaryCtxRetain, tsp_cu_result,                                 \
      (tsp_cu_context *, tsp_cu_device))                                                           \
    X(primary_ctx_release, cuDevicePrimaryCtxRelease_v2, tsp_cu_result, (tsp_cu_device))           \
    X(ctx_set_current, cuCtxSetCurrent, tsp_cu_result, (tsp_cu_context))                           \
    X(mem_alloc, cuMemAlloc_v2, tsp_cu_result, (tsp_cu_deviceptr *, size_t))                       \
    X(mem_free, cuMemFree_v2, tsp_cu_result, (tsp_cu_deviceptr))                                   \
    X(memset_d32, cuMemsetD32_v2, tsp_cu_result, (tsp_cu_deviceptr, unsigned int, size_t))         \
    X(memcpy_dtoh, cuMemcpyDtoH_v2, tsp_cu_result, (void *, tsp_cu_deviceptr, size_t))             \
    X(stream_create, cuStreamCreate, tsp_cu_result, (tsp_cu_stream *, unsigned int))               \
    X(stream_query, cuStreamQuery, tsp_cu_result, (tsp_cu_stream))                                 \
    X(stream_destroy, cuStreamDestroy_v2, tsp_cu_result, (tsp_cu_stream))                          \
    X(get_error_name, cuGetErrorName, tsp_cu_result, (tsp_cu_result, const char **))

#define TSP_API_TYPEDEF(name, sym, ret, params) typedef ret(*tsp_##sym##_fn) params;
TSP_CUDA_FUNCS(TSP_API_TYPEDEF)

#define TSP_API_MEMBER(name, sym, ret, params) tsp_##sym##_fn name;
typedef struct {
    void *handle;
    char path[512]; /* the file the loader really opened */
    int complete;   /* every symbol resolved */
    TSP_CUDA_FUNCS(TSP_API_MEMBER)
} tsp_cuda_api_t;

/* The driver table, loaded once per process (libcuda.so.1 or TORCHSPARK_LIBCUDA); NULL
 * when the library is absent. Symbols missing from the library stay NULL. */
const tsp_cuda_api_t *tsp__cuda_api(void);
/* Why the driver library could not be loaded at all (the loader's words, naming the
 * file), or NULL when it was loaded: no NVIDIA driver on this host (docs/gpu.md). */
const char *tsp__cuda_missing(void);

/* A CUDA error's name: the driver's, else torchspark's own table (the toolkit's stub
 * libcuda names nothing), else "CUDA error N". */
const char *tsp__cuda_error_name(tsp_cu_result rc);

/* ---- NVML ---- */
typedef unsigned int tsp_nvml_return; /* enum nvmlReturn_enum */
typedef struct nvmlDevice_st *tsp_nvml_device;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} tsp_nvml_pci_info_local; /* nvmlPciInfo_t (v3) */
typedef struct {
    unsigned long long total, free, used;
} tsp_nvml_memory_local; /* nvmlMemory_t */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} tsp_nvml_process_info_local; /* nvmlProcessInfo_t (v2 layout, what the _v3 getter fills) */
#ifdef TSP_ABI_CHECK_NVML
typedef nvmlPciInfo_t tsp_nvml_pci_info;
typedef nvmlMemory_t tsp_nvml_memory;
typedef nvmlProcessInfo_t tsp_nvml_process_info;
#else
typedef tsp_nvml_pci_info_local tsp_nvml_pci_info;
typedef tsp_nvml_memory_local tsp_nvml_memory;
typedef tsp_nvml_process_info_local tsp_nvml_process_info;
#endif

#define TSP_NVML_SUCCESS 0u
#define TSP_NVML_ERROR_NO_PERMISSION 4u
#define TSP_NVML_ERROR_NOT_FOUND 6u
#define TSP_NVML_ERROR_INSUFFICIENT_SIZE 7u
#define TSP_NVML_ERROR_DRIVER_NOT_LOADED 9u
#define TSP_NVML_ERROR_LIBRARY_NOT_FOUND 12u
#define TSP_NVML_DEVICE_MIG_ENABLE 1u

#define TSP_NVML_FUNCS(X)                                                                          \
    X(init, nvmlInit_v2, tsp_nvml_return, (void))                                                  \
    X(shutdown, nvmlShutdown, tsp_nvml_return, (void))                                             \
    X(error_string, nvmlErrorString, const char *, (tsp_nvml_return))                              \
    X(get_count, nvmlDeviceGetCount_v2, tsp_nvml_return, (unsigned int *))                         \
    X(handle_by_index, nvmlDeviceGetHandleByIndex_v2, tsp_nvml_return,                             \
      (unsigned int, tsp_nvml_device *))                                                           \
    X(handle_by_uuid, nvmlDeviceGetHandleByUUID, tsp_nvml_return,                                  \
      (const char *, tsp_nvml_device *))                                                           \
    X(get_uuid, nvmlDeviceGetUUID, tsp_nvml_return, (tsp_nvml_device, char *, unsigned int))       \
    X(get_pci_info, nvmlDeviceGetPciInfo_v3, tsp_nvml_return,                                      \
      (tsp_nvml_device, tsp_nvml_pci_info *))                                                      \
    X(get_memory_info, nvmlDeviceGetMemoryInfo, tsp_nvml_return,                                   \
      (tsp_nvml_device, tsp_nvml_memory *))                                                        \
    X(get_name, nvmlDeviceGetName, tsp_nvml_return, (tsp_nvml_device, char *, unsigned int))       \
    X(get_mig_mode, nvmlDeviceGetMigMode, tsp_nvml_return,                                         \
      (tsp_nvml_device, unsigned int *, unsigned int *))                                           \
    X(get_max_mig_count, nvmlDeviceGetMaxMigDeviceCount, tsp_nvml_return,                          \
      (tsp_nvml_device, unsigned int *))                                                           \
    X(get_mig_by_index, nvmlDeviceGetMigDeviceHandleByIndex, tsp_nvml_return,                      \
      (tsp_nvml_device, unsigned int, tsp_nvml_device *))                                          \
    X(get_procs, nvmlDeviceGetComputeRunningProcesses_v3, tsp_nvml_return,                         \
      (tsp_nvml_device, unsigned int *, tsp_nvml_process_info *))                                  \
    X(get_compute_mode, nvmlDeviceGetComputeMode, tsp_nvml_return,                                 \
      (tsp_nvml_device, unsigned int *))

TSP_NVML_FUNCS(TSP_API_TYPEDEF)

typedef struct {
    void *handle;
    char path[512];
    TSP_NVML_FUNCS(TSP_API_MEMBER)
} tsp_nvml_api_t;

/* The NVML table, loaded once per process (libnvidia-ml.so.1 or TORCHSPARK_LIBNVML); NULL
 * when the library or one of its required symbols is absent. */
const tsp_nvml_api_t *tsp__nvml_api(void);

#endif
