/* stub_cuda.c: a stand-in for libcuda.so.1 on machines without a GPU: cuInit and
 * cuDeviceGetCount answer from STUB_CUDA_COUNT / STUB_CUDA_INIT_RC. */
#include <stdlib.h>

int cuInit(unsigned int flags);
int cuDeviceGetCount(int *count);

int cuInit(unsigned int flags)
{
    (void)flags;
    const char *rc = getenv("STUB_CUDA_INIT_RC");
    return rc ? atoi(rc) : 0;
}

int cuDeviceGetCount(int *count)
{
    const char *n = getenv("STUB_CUDA_COUNT");
    *count = n ? atoi(n) : 0;
    return 0;
}
