/* abi_check.c: built only when CMake finds the vendor headers (cuda.h, and nvml.h through
 * TSP_NVML_INCLUDE): compares torchspark's local declarations (native/src/cudaapi.h) with
 * them, so that a mismatch fails the build. It produces no code that anything uses; the
 * program it links into prints what it checked (ctest abi_headers). */
#include <stddef.h>
#include <stdio.h>

#include <cuda.h>
#ifdef TSP_ABI_CHECK_NVML
#include <nvml.h>
#endif

#define TSP_ABI_CHECK 1
#include "cudaapi.h"

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
    printf("local declarations match cuda.h (CUDA %d)" TSP_ABI_NVML "\n", CUDA_VERSION);
    return 0;
}
