/* ncclapi.h (private): local declarations of the NCCL symbols the preflight check calls,
 * resolved with dlsym from the training's own libnccl.so.2 (nccl.c). Checked against nccl.h
 * at build time when the header is present (native/abi/abi_check.c).
 *
 * ncclConfig_t is versioned and append-only; NCCL copies min(caller size, own size) bytes
 * and resets the fields newer than the caller's version, so this 2.14-shaped prefix is
 * ABI-safe for every libnccl >= 2.14 (docs/gpu.md). */
#ifndef TSP_NCCLAPI_H
#define TSP_NCCLAPI_H

#include <stddef.h>

typedef unsigned int tsp_nccl_result; /* ncclResult_t */
typedef struct ncclComm *tsp_nccl_comm;
typedef struct CUstream_st *tsp_nccl_stream; /* cudaStream_t == CUstream */
typedef struct {
    char internal[128];
} tsp_nccl_unique_id_local;
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
    int splitShare;
} tsp_nccl_config_local; /* the 2.14 prefix of ncclConfig_t */
#ifdef TSP_ABI_CHECK
typedef ncclUniqueId tsp_nccl_unique_id;
typedef ncclConfig_t tsp_nccl_config;
#else
typedef tsp_nccl_unique_id_local tsp_nccl_unique_id;
typedef tsp_nccl_config_local tsp_nccl_config;
#endif

#define TSP_NCCL_CONFIG_MAGIC 0xcafebeefu
#define TSP_NCCL_CONFIG_VERSION 21400u
#define TSP_NCCL_UNDEF_INT (-2147483647 - 1) /* NCCL_CONFIG_UNDEF_INT */
#define TSP_NCCL_SUCCESS 0u
#define TSP_NCCL_INVALID_USAGE 5u
#define TSP_NCCL_IN_PROGRESS 7u
#define TSP_NCCL_FLOAT32 7u
#define TSP_NCCL_SUM 0u

/* X(name, symbol, return type, parameters, required) */
#define TSP_NCCL_FUNCS(X)                                                                          \
    X(get_version, ncclGetVersion, tsp_nccl_result, (int *), 1)                                    \
    X(get_unique_id, ncclGetUniqueId, tsp_nccl_result, (tsp_nccl_unique_id *), 1)                  \
    X(init_rank, ncclCommInitRank, tsp_nccl_result,                                                \
      (tsp_nccl_comm *, int, tsp_nccl_unique_id, int), 1)                                          \
    X(init_rank_config, ncclCommInitRankConfig, tsp_nccl_result,                                   \
      (tsp_nccl_comm *, int, tsp_nccl_unique_id, int, tsp_nccl_config *), 0)                       \
    X(get_async_error, ncclCommGetAsyncError, tsp_nccl_result, (tsp_nccl_comm, tsp_nccl_result *), \
      1)                                                                                           \
    X(abort, ncclCommAbort, tsp_nccl_result, (tsp_nccl_comm), 1)                                   \
    X(destroy, ncclCommDestroy, tsp_nccl_result, (tsp_nccl_comm), 1)                               \
    X(finalize, ncclCommFinalize, tsp_nccl_result, (tsp_nccl_comm), 0)                             \
    X(error_string, ncclGetErrorString, const char *, (tsp_nccl_result), 1)                        \
    X(last_error, ncclGetLastError, const char *, (tsp_nccl_comm), 0)                              \
    X(all_reduce, ncclAllReduce, tsp_nccl_result,                                                  \
      (const void *, void *, size_t, unsigned int, unsigned int, tsp_nccl_comm, tsp_nccl_stream),  \
      1)

#define TSP_NCCL_TYPEDEF(name, sym, ret, params, required) typedef ret(*tsp_##sym##_fn) params;
TSP_NCCL_FUNCS(TSP_NCCL_TYPEDEF)

#endif
