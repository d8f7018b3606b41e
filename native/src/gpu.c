/* gpu.c: counting CUDA devices through a dlopen'ed driver (no link-time CUDA dependency).
 * The handle and the symbols are resolved once per process behind pthread_once. */
#include "gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>

typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_count_fn)(int *);

static struct {
    pthread_once_t once;
    cu_init_fn init;
    cu_count_fn count;
    int init_rc;
} cuda = {PTHREAD_ONCE_INIT, NULL, NULL, 0};

static void cuda_load(void)
{
    const char *path = getenv("TORCHSPARK_LIBCUDA");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return; /* no driver: a CPU-only host */
    cuda.init = (cu_init_fn)(uintptr_t)dlsym(h, "cuInit");
    cuda.count = (cu_count_fn)(uintptr_t)dlsym(h, "cuDeviceGetCount");
    if (cuda.init && cuda.count)
        cuda.init_rc = cuda.init(0);
}

int tsp_gpu_count(int *count, char *err, size_t errlen)
{
    pthread_once(&cuda.once, cuda_load);
    *count = 0;
    if (!cuda.init || !cuda.count)
        return 0;
    /* CUDA_ERROR_NO_DEVICE (100) is a normal answer on a host with a driver but no GPU. */
    if (cuda.init_rc == 100)
        return 0;
    int rc = cuda.init_rc ? cuda.init_rc : cuda.count(count);
    if (rc != 0) {
        if (err && errlen)
            snprintf(err, errlen,
                     "the CUDA driver failed with error %d; check the driver "
                     "installation (nvidia-smi) or set CUDA_VISIBLE_DEVICES",
                     rc);
        *count = 0;
        return -EIO;
    }
    return 0;
}
