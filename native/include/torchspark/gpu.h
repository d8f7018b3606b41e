/* torchspark/gpu.h: the host's GPUs through NVML and the CUDA driver, both loaded with
 * dlopen at run time (no link-time dependency: CPU-only hosts run unchanged), and the
 * assignment of Spark's GPU addresses to the workers' CUDA_VISIBLE_DEVICES (rules R0-R8 of
 * docs/gpu.md, one implementation for PySpark and the JVM, reached through the agent's
 * --gpus option and through the shared library). */
#ifndef TORCHSPARK_GPU_H
#define TORCHSPARK_GPU_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSP_GPU_MAX 64      /* GPUs per host kept in an inventory */
#define TSP_GPU_MAX_MIG 8   /* MIG devices kept per GPU */
#define TSP_GPU_UUID_MAX 96 /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */

/* One GPU as NVML sees it (NVML order, the order of nvidia-smi's index). */
typedef struct {
    int index;
    char uuid[TSP_GPU_UUID_MAX]; /* GPU-... */
    char bus[32];                /* PCI bus id, normalised: "0000:3b:00.0" */
    char name[96];
    unsigned long long mem_total, mem_used; /* bytes */
    int mig_mode;                           /* 1: MIG enabled */
    int nmig;
    char mig[TSP_GPU_MAX_MIG][TSP_GPU_UUID_MAX]; /* the MIG devices' UUIDs (MIG-...) */
    int compute_mode;                            /* NVML: 0 default, 2 prohibited, 3 exclusive */
    int nprocs;                                  /* running compute processes */
    unsigned long long procs_mem;                /* bytes they use */
} tsp_gpu_info_t;

typedef struct {
    int ndev;
    tsp_gpu_info_t dev[TSP_GPU_MAX];
} tsp_gpu_inventory_t;

/* The host's GPUs through NVML (libnvidia-ml.so.1, or the path in TORCHSPARK_LIBNVML).
 * -ENOENT when NVML is absent (no driver, or a container without the "utility"
 * capability); -ENODEV with err (message L2) when the driver is not loaded; -EIO with err
 * for other NVML failures. NVML creates no CUDA context and ignores CUDA_VISIBLE_DEVICES. */
TSP_EXTERN int tsp_gpu_inventory(tsp_gpu_inventory_t *inv, char *err, size_t errlen);

/* The number of CUDA devices this process can use (CUDA_VISIBLE_DEVICES applies, as for
 * torch.cuda.device_count()): NVML plus the mask rules, the CUDA driver (libcuda.so.1 or
 * TORCHSPARK_LIBCUDA) when NVML is absent. 0 when there is no driver at all. -EIO with err
 * when the driver is present but fails (message L1 for the toolkit's stub libcuda; L3 is
 * put in err, with 0 returned, when CUDA sees no device under a mask). */
TSP_EXTERN int tsp_gpu_count(int *count, char *err, size_t errlen);

/* What tsp_gpu_assign works on. */
typedef struct {
    const char *addrs; /* Spark's addresses for the task, comma-separated ("" = none) */
    const char *mask;  /* the executor's CUDA_VISIBLE_DEVICES; NULL when unset */
    const char *task;  /* names the task in messages (e.g. its partition id) */
    const char *host;  /* names the host in messages; NULL: gethostname() */
} tsp_gpu_request_t;

typedef struct {
    char mask[2048];     /* the workers' CUDA_VISIBLE_DEVICES */
    int count;           /* its entries: one worker each */
    int integers;        /* 1 when an entry is an integer: set CUDA_DEVICE_ORDER=PCI_BUS_ID */
    int checked;         /* 1 when NVML resolved every entry (R6) */
    char warnings[2048]; /* zero or more lines, each ending in '\n' (R7, R6 skipped) */
} tsp_gpu_assignment_t;

/* Spark's addresses plus the executor's mask -> the workers' mask, by rules R0-R8
 * (docs/gpu.md). -EINVAL with err set to the rule's message (G1-G8, G10), -ENODEV with
 * L2 when NVML is present but the driver is not loaded. NVML is used when present; the
 * inventory is read once per call. */
TSP_EXTERN int tsp_gpu_assign(const tsp_gpu_request_t *req, tsp_gpu_assignment_t *out, char *err,
                              size_t errlen);

/* tsp_gpu_assign as one JSON transform, for the PySpark glue (docs/protocol.md 5.1):
 * {"addresses": [...], "visible", "task", "host"} -> {"mask", "count", "integers",
 * "checked", "warnings"} in out (outlen bytes; *needed, when given, the size it needs). 0,
 * -ENOSPC when out is too small, or tsp_gpu_assign's refusal with its message in err. */
TSP_EXTERN int tsp_gpu_call(const char *request, size_t len, char *out, size_t outlen,
                            size_t *needed, char *err, size_t errlen);

/* As tsp_gpu_assign, on a given inventory (NULL: as if NVML were absent). */
int tsp__gpu_assign_with(const tsp_gpu_request_t *req, const tsp_gpu_inventory_t *inv,
                         tsp_gpu_assignment_t *out, char *err, size_t errlen);

/* The inventory as messages show it: "0: GPU-8f2a61c3 0000:3b:00.0 NVIDIA H100; 1: ..." */
void tsp__gpu_inventory_text(const tsp_gpu_inventory_t *inv, char *out, size_t len);

#ifdef __cplusplus
}
#endif
#endif
