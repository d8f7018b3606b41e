#define _GNU_SOURCE
/* stub_nvml.c: a stand-in for libnvidia-ml.so.1 on machines without a GPU.
 * Devices come from STUB_NVML_DEVICES="uuid@bus@name@mig@procs[@mode];...", read at each
 * nvmlInit_v2:  mig is 0 (off), 1 (on, no MIG device yet) or MIG-a+MIG-b (on, with those
 * MIG devices); procs is K or K:MiB (running compute processes); mode is the compute mode
 * (0 default, 3 exclusive-process). Knobs: STUB_NVML_INIT_RC (e.g. 9, DRIVER_NOT_LOADED),
 * STUB_NVML_HANDLE_RC (returned by nvmlDeviceGetHandleByIndex_v2, e.g. 4, NO_PERMISSION),
 * STUB_NVML_LOST=i (device i answers GPU_IS_LOST, 15). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stub_thread.h"

#define MAXDEV 16
#define MAXMIG 8

typedef struct dev dev_t_;
struct dev {
    char uuid[96], bus[32], name[96];
    int mig_mode, nmig, nprocs, mode;
    unsigned long long procs_mib;
    dev_t_ *parent;
    dev_t_ *mig[MAXMIG];
};

static dev_t_ devs[MAXDEV], migs[MAXDEV * MAXMIG];
static int ndev, nmigs;

typedef dev_t_ *nvmlDevice_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

/* Exported: every symbol the library resolves. */
unsigned int nvmlInit_v2(void);
unsigned int nvmlShutdown(void);
const char *nvmlErrorString(unsigned int rc);
unsigned int nvmlDeviceGetCount_v2(unsigned int *n);
unsigned int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d);
unsigned int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d);
unsigned int nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len);
unsigned int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p);
unsigned int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m);
unsigned int nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len);
unsigned int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending);
unsigned int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n);
unsigned int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *m);
unsigned int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n,
                                                     nvmlProcessInfo_t *p);
unsigned int nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode);

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static void parse(void)
{
    ndev = nmigs = 0;
    memset(devs, 0, sizeof devs);
    memset(migs, 0, sizeof migs);
    const char *spec = getenv("STUB_NVML_DEVICES");
    if (!spec)
        return;
    char *copy = strdup(spec), *save = NULL;
    for (char *d = strtok_r(copy, ";", &save); d && ndev < MAXDEV; d = strtok_r(NULL, ";", &save)) {
        dev_t_ *g = &devs[ndev++];
        char *f[6] = {0};
        int k = 0;
        for (char *p = d; p && k < 6; k++) {
            f[k] = p;
            p = strchr(p, '@');
            if (p)
                *p++ = 0;
        }
        snprintf(g->uuid, sizeof g->uuid, "%s", f[0] ? f[0] : "GPU-0");
        snprintf(g->bus, sizeof g->bus, "%s", f[1] ? f[1] : "00000000:00:00.0");
        snprintf(g->name, sizeof g->name, "%s", f[2] ? f[2] : "Stub GPU");
        if (f[3] && strncmp(f[3], "MIG-", 4) == 0) {
            g->mig_mode = 1;
            char *s2 = NULL;
            for (char *m = strtok_r(f[3], "+", &s2); m && g->nmig < MAXMIG;
                 m = strtok_r(NULL, "+", &s2)) {
                dev_t_ *c = &migs[nmigs++];
                snprintf(c->uuid, sizeof c->uuid, "%s", m);
                snprintf(c->bus, sizeof c->bus, "%s", g->bus);
                snprintf(c->name, sizeof c->name, "%s MIG", g->name);
                c->parent = g;
                g->mig[g->nmig++] = c;
            }
        } else {
            g->mig_mode = f[3] ? atoi(f[3]) : 0;
        }
        if (f[4]) {
            g->nprocs = atoi(f[4]);
            char *colon = strchr(f[4], ':');
            g->procs_mib = colon ? strtoull(colon + 1, NULL, 10) : 0;
        }
        g->mode = f[5] ? atoi(f[5]) : 0;
    }
    free(copy);
}

static int lost(nvmlDevice_t d)
{
    int i = env_int("STUB_NVML_LOST", -1);
    return i >= 0 && i < ndev && (d == &devs[i] || d->parent == &devs[i]);
}

unsigned int nvmlInit_v2(void)
{
    stub_thread_start("nvml-stub-drv");
    int rc = env_int("STUB_NVML_INIT_RC", 0);
    if (rc)
        return (unsigned int)rc;
    parse();
    return 0;
}

unsigned int nvmlShutdown(void)
{
    return 0;
}

const char *nvmlErrorString(unsigned int rc)
{
    switch (rc) {
    case 4:
        return "Insufficient Permissions";
    case 6:
        return "Not Found";
    case 9:
        return "Driver Not Loaded";
    case 15:
        return "GPU is lost";
    default:
        return "Unknown Error";
    }
}

unsigned int nvmlDeviceGetCount_v2(unsigned int *n)
{
    *n = (unsigned int)ndev;
    return 0;
}

unsigned int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    int rc = env_int("STUB_NVML_HANDLE_RC", 0);
    if (rc)
        return (unsigned int)rc;
    if (i >= (unsigned int)ndev)
        return 2; /* INVALID_ARGUMENT */
    *d = &devs[i];
    return 0;
}

unsigned int nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    for (int i = 0; i < ndev; i++)
        if (strcmp(devs[i].uuid, uuid) == 0)
            return *d = &devs[i], 0;
    for (int i = 0; i < nmigs; i++)
        if (strcmp(migs[i].uuid, uuid) == 0)
            return *d = &migs[i], 0;
    return 6;
}

unsigned int nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len)
{
    if (lost(d))
        return 15;
    snprintf(buf, len, "%s", d->uuid);
    return 0;
}

unsigned int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    if (lost(d))
        return 15;
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", d->bus);
    return 0;
}

unsigned int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    if (lost(d))
        return 15;
    m->total = 80ull << 30;
    m->used = d->procs_mib << 20;
    m->free = m->total - m->used;
    return 0;
}

unsigned int nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len)
{
    if (lost(d))
        return 15;
    snprintf(buf, len, "%s", d->name);
    return 0;
}

unsigned int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending)
{
    *cur = *pending = (unsigned int)d->mig_mode;
    return 0;
}

unsigned int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n)
{
    *n = d->mig_mode ? 7 : 0;
    return 0;
}

unsigned int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *m)
{
    if (i >= (unsigned int)d->nmig)
        return 6;
    *m = d->mig[i];
    return 0;
}

unsigned int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n,
                                                     nvmlProcessInfo_t *p)
{
    unsigned int have = (unsigned int)d->nprocs;
    if (*n < have) {
        *n = have;
        return 7;
    }
    for (unsigned int i = 0; i < have; i++) {
        p[i].pid = 1000 + i;
        p[i].usedGpuMemory = (d->procs_mib << 20) / have;
        p[i].gpuInstanceId = p[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *n = have;
    return 0;
}

unsigned int nvmlDeviceGetComputeMode(nvmlDevice_t d, unsigned int *mode)
{
    *mode = (unsigned int)d->mode;
    return 0;
}
