#define _GNU_SOURCE
/* stub_cuda.c: a stand-in for libcuda.so.1 on machines without a GPU.
 * Devices: STUB_CUDA_DEVICES=busid,busid,... (or STUB_CUDA_COUNT=n, buses 0000:0i:00.0),
 * their UUIDs in STUB_CUDA_UUIDS=GPU-...,GPU-... (mask entries may name them, prefixes too);
 * CUDA_VISIBLE_DEVICES applies as the driver applies it (integer entries, stopping at the
 * first invalid one; "" hides everything). cuInit returns STUB_CUDA_INIT_RC when set
 * (34 mimics the toolkit's stub library), else 100 when no device is visible. Primary
 * contexts record their device; device memory is host memory; STUB_CUDA_STREAM_HANG=1 makes
 * cuStreamQuery answer 600 (CUDA_ERROR_NOT_READY) for ever. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stub_thread.h"

#define MAXDEV 16

typedef struct {
    char bytes[16];
} CUuuid;

static char buses[MAXDEV][32];
static int visible[MAXDEV], nvisible, initialised;
static _Thread_local int current = -1;

/* Exported */
unsigned int cuInit(unsigned int flags);
unsigned int cuDeviceGetCount(int *count);
unsigned int cuDeviceGet(int *dev, int ordinal);
unsigned int cuDeviceGetPCIBusId(char *buf, int len, int dev);
unsigned int cuDeviceGetUuid_v2(CUuuid *u, int dev);
unsigned int cuDevicePrimaryCtxRetain(void **ctx, int dev);
unsigned int cuDevicePrimaryCtxRelease_v2(int dev);
unsigned int cuCtxSetCurrent(void *ctx);
unsigned int cuMemAlloc_v2(unsigned long long *p, size_t n);
unsigned int cuMemFree_v2(unsigned long long p);
unsigned int cuMemsetD32_v2(unsigned long long p, unsigned int v, size_t n);
unsigned int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n);
unsigned int cuStreamCreate(void **s, unsigned int flags);
unsigned int cuStreamQuery(void *s);
unsigned int cuStreamDestroy_v2(void *s);
unsigned int cuGetErrorName(unsigned int rc, const char **name);
/* For the stub NCCL: the bus id of the calling thread's current device ("" when none). */
const char *stub_cuda_current_bus(void);

static void discover(void)
{
    int n = 0;
    const char *spec = getenv("STUB_CUDA_DEVICES");
    if (spec) {
        char *copy = strdup(spec), *save = NULL;
        for (char *b = strtok_r(copy, ",", &save); b && n < MAXDEV; b = strtok_r(NULL, ",", &save))
            snprintf(buses[n++], sizeof buses[0], "%s", b);
        free(copy);
    } else if (getenv("STUB_CUDA_COUNT")) {
        int c = atoi(getenv("STUB_CUDA_COUNT"));
        for (; n < c && n < MAXDEV; n++)
            snprintf(buses[n], sizeof buses[0], "0000:%02x:00.0", n + 1);
    }
    const char *mask = getenv("CUDA_VISIBLE_DEVICES");
    nvisible = 0;
    if (!mask) {
        for (int i = 0; i < n; i++)
            visible[nvisible++] = i;
        return;
    }
    char uuids[MAXDEV][96] = {{0}};
    const char *us = getenv("STUB_CUDA_UUIDS");
    if (us) {
        char *c2 = strdup(us), *s2 = NULL;
        int k = 0;
        for (char *u = strtok_r(c2, ",", &s2); u && k < MAXDEV; u = strtok_r(NULL, ",", &s2))
            snprintf(uuids[k++], sizeof uuids[0], "%s", u);
        free(c2);
    }
    char *copy = strdup(mask), *save = NULL;
    for (char *e = strtok_r(copy, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
        char *end;
        long i = strtol(e, &end, 10);
        if (strncmp(e, "GPU-", 4) == 0) {
            i = -1;
            for (int k = 0; k < n && i < 0; k++)
                if (uuids[k][0] && strncmp(uuids[k], e, strlen(e)) == 0)
                    i = k;
            end = "";
        }
        if (*e == 0 || *end || i < 0 || i >= n)
            break; /* the driver stops at the first invalid entry */
        visible[nvisible++] = (int)i;
    }
    free(copy);
}

unsigned int cuInit(unsigned int flags)
{
    stub_thread_start("cuda-stub-drv");
    (void)flags;
    const char *rc = getenv("STUB_CUDA_INIT_RC");
    if (rc && *rc)
        return (unsigned int)atoi(rc);
    discover();
    if (nvisible == 0)
        return 100;
    initialised = 1;
    return 0;
}

unsigned int cuDeviceGetCount(int *count)
{
    if (!initialised)
        return 3;
    *count = nvisible;
    return 0;
}

unsigned int cuDeviceGet(int *dev, int ordinal)
{
    if (!initialised)
        return 3;
    if (ordinal < 0 || ordinal >= nvisible)
        return 101;
    *dev = ordinal;
    return 0;
}

unsigned int cuDeviceGetPCIBusId(char *buf, int len, int dev)
{
    if (dev < 0 || dev >= nvisible)
        return 101;
    snprintf(buf, (size_t)len, "%s", buses[visible[dev]]);
    return 0;
}

unsigned int cuDeviceGetUuid_v2(CUuuid *u, int dev)
{
    if (dev < 0 || dev >= nvisible)
        return 101;
    memset(u, 0, sizeof *u);
    u->bytes[15] = (char)visible[dev];
    return 0;
}

unsigned int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (dev < 0 || dev >= nvisible)
        return 101;
    *ctx = (void *)(uintptr_t)(dev + 1);
    return 0;
}

unsigned int cuDevicePrimaryCtxRelease_v2(int dev)
{
    (void)dev;
    return 0;
}

unsigned int cuCtxSetCurrent(void *ctx)
{
    current = ctx ? (int)(uintptr_t)ctx - 1 : -1;
    return 0;
}

const char *stub_cuda_current_bus(void)
{
    return current >= 0 && current < nvisible ? buses[visible[current]] : "";
}

unsigned int cuMemAlloc_v2(unsigned long long *p, size_t n)
{
    void *m = malloc(n ? n : 1);
    if (!m)
        return 2;
    *p = (unsigned long long)(uintptr_t)m;
    return 0;
}

unsigned int cuMemFree_v2(unsigned long long p)
{
    free((void *)(uintptr_t)p);
    return 0;
}

unsigned int cuMemsetD32_v2(unsigned long long p, unsigned int v, size_t n)
{
    unsigned int *a = (unsigned int *)(uintptr_t)p;
    for (size_t i = 0; i < n; i++)
        a[i] = v;
    return 0;
}

unsigned int cuMemcpyDtoH_v2(void *dst, unsigned long long src, size_t n)
{
    memcpy(dst, (void *)(uintptr_t)src, n);
    return 0;
}

unsigned int cuStreamCreate(void **s, unsigned int flags)
{
    (void)flags;
    *s = malloc(1);
    return *s ? 0 : 2;
}

unsigned int cuStreamQuery(void *s)
{
    (void)s;
    const char *h = getenv("STUB_CUDA_STREAM_HANG");
    return h && *h == '1' ? 600 : 0;
}

unsigned int cuStreamDestroy_v2(void *s)
{
    free(s);
    return 0;
}

unsigned int cuGetErrorName(unsigned int rc, const char **name)
{
    switch (rc) {
    case 0:
        *name = "CUDA_SUCCESS";
        return 0;
    case 3:
        *name = "CUDA_ERROR_NOT_INITIALIZED";
        return 0;
    case 100:
        *name = "CUDA_ERROR_NO_DEVICE";
        return 0;
    case 101:
        *name = "CUDA_ERROR_INVALID_DEVICE";
        return 0;
    case 600:
        *name = "CUDA_ERROR_NOT_READY";
        return 0;
    default: /* like the toolkit's stub: no name for 34 */
        *name = NULL;
        return 1;
    }
}
