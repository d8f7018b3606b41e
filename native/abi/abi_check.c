/* abi_check.c: built only when CMake finds the vendor headers (cuda.h, and nvml.h through
 * TSP_NVML_INCLUDE): compares torchspark's local declarations (native/src/gpu/cudaapi.h) with
 * them, so that a mismatch fails the build. It produces no code that anything uses; the
 * program it links into prints what it checked (ctest abi_headers). */
#include <stddef.h>
#include <stdio.h>

#include <cuda.h>
#ifdef TSP_ABI_CHECK_NCCL
#include <nccl.h>
#endif
#ifdef TSP_ABI_CHECK_NVML
#include <nvml.h>
#endif

#define TSP_ABI_CHECK 1
#include "../src/gpu/cudaapi.h" /* by path: native/src/gpu/nccl.h must not shadow <nccl.h> */
#ifdef TSP_ABI_CHECK_NCCL
#include "../src/gpu/ncclapi.h"
#endif

#define SAME_FN(field, sym, ret, params)                                                           \
    _Static_assert(__builtin_types_compatible_p(tsp_##sym##_fn, __typeof__(&sym)),                 \
                   #sym " differs from its declaration in the vendor header");
TSP_CUDA_FUNCS(SAME_FN)

_Static_assert(sizeof(tsp_cu_uuid_local) == sizeof(CUuuid), "CUuuid size");
_Static_assert(sizeof(tsp_cu_deviceptr) == sizeof(CUdeviceptr), "CUdeviceptr size");
_Static_assert(__builtin_types_compatible_p(tsp_cu_device, CUdevice), "CUdevice");
_Static_assert(__builtin_types_compatible_p(tsp_cu_deviceptr, CUdeviceptr), "CUdeviceptr");
_Static_assert(__builtin_types_compatible_p(tsp_cu_stream, CUstream), "CUstream");
_Static_assert(__builtin_types_compatible_p(tsp_cu_context, CUcontext), "CUcontext");
_Static_assert(sizeof(tsp_cu_result) == sizeof(CUresult), "CUresult size");
_Static_assert(TSP_CUDA_ERROR_STUB_LIBRARY == CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY");
_Static_assert(TSP_CUDA_ERROR_NO_DEVICE == CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE");
_Static_assert(TSP_CUDA_ERROR_INVALID_DEVICE == CUDA_ERROR_INVALID_DEVICE, "INVALID_DEVICE");
_Static_assert(TSP_CUDA_ERROR_NOT_READY == CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY");
_Static_assert(TSP_CUDA_ERROR_NOT_INITIALIZED == CUDA_ERROR_NOT_INITIALIZED, "NOT_INITIALIZED");
_Static_assert(TSP_CU_STREAM_NON_BLOCKING == CU_STREAM_NON_BLOCKING, "CU_STREAM_NON_BLOCKING");

#ifdef TSP_ABI_CHECK_NCCL
#define SAME_NCCL_FN(field, sym, ret, params, required)                                            \
    _Static_assert(__builtin_types_compatible_p(tsp_##sym##_fn, __typeof__(&sym)),                 \
                   #sym " differs from its declaration in nccl.h");
TSP_NCCL_FUNCS(SAME_NCCL_FN)
_Static_assert(sizeof(tsp_nccl_unique_id_local) == sizeof(ncclUniqueId), "ncclUniqueId");
#define SAME_FIELD(f)                                                                              \
    _Static_assert(offsetof(tsp_nccl_config_local, f) == offsetof(ncclConfig_t, f) &&              \
                       sizeof(((tsp_nccl_config_local *)0)->f) == sizeof(((ncclConfig_t *)0)->f),  \
                   "ncclConfig_t." #f);
SAME_FIELD(size)
SAME_FIELD(magic)
SAME_FIELD(version)
SAME_FIELD(blocking)
SAME_FIELD(cgaClusterSize)
SAME_FIELD(minCTAs)
SAME_FIELD(maxCTAs)
SAME_FIELD(netName)
SAME_FIELD(splitShare)
_Static_assert(TSP_NCCL_IN_PROGRESS == ncclInProgress, "ncclInProgress");
_Static_assert(TSP_NCCL_INVALID_USAGE == ncclInvalidUsage, "ncclInvalidUsage");
_Static_assert(TSP_NCCL_FLOAT32 == ncclFloat32 && TSP_NCCL_SUM == ncclSum, "ncclFloat32/ncclSum");
_Static_assert(TSP_NCCL_UNDEF_INT == NCCL_CONFIG_UNDEF_INT, "NCCL_CONFIG_UNDEF_INT");
#define TSP_ABI_NCCL " nccl.h (NCCL %d.%d.%d)", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH
#else
#define TSP_ABI_NCCL ""
#endif

#ifdef TSP_ABI_CHECK_NVML
TSP_NVML_FUNCS(SAME_FN)
_Static_assert(sizeof(tsp_nvml_pci_info_local) == sizeof(nvmlPciInfo_t), "nvmlPciInfo_t");
_Static_assert(offsetof(tsp_nvml_pci_info_local, busId) == offsetof(nvmlPciInfo_t, busId), "busId");
_Static_assert(sizeof(tsp_nvml_memory_local) == sizeof(nvmlMemory_t), "nvmlMemory_t");
_Static_assert(sizeof(tsp_nvml_process_info_local) == sizeof(nvmlProcessInfo_t),
               "nvmlProcessInfo_t");
_Static_assert(TSP_NVML_ERROR_DRIVER_NOT_LOADED == NVML_ERROR_DRIVER_NOT_LOADED,
               "DRIVER_NOT_LOADED");
_Static_assert(TSP_NVML_ERROR_NOT_FOUND == NVML_ERROR_NOT_FOUND, "NOT_FOUND");
#define TSP_ABI_NVML " nvml.h"
#else
#define TSP_ABI_NVML ""
#endif

int main(void)
{
    printf("local declarations match cuda.h (CUDA %d)" TSP_ABI_NVML, CUDA_VERSION);
#ifdef TSP_ABI_CHECK_NCCL
    printf(TSP_ABI_NCCL);
#endif
    printf("\n");
    return 0;
}
