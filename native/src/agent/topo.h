/* topo.h (internal): the job's topology (nodes, processes per node, master) and the
 * worker environment that torchrun scripts rely on. */
#ifndef TSP_TOPO_H
#define TSP_TOPO_H

#include "torchspark/common.h"
#include "env.h"

#define TSP_TOPO_ADDR_MAX 256
#define TSP_TOPO_ID_MAX 128
#define TSP_TOPO_ROLE_MAX 64

typedef struct tsp_topo {
    int nnodes;         /* number of nodes (agents), >= 1 */
    int node_rank;      /* this node, 0 .. nnodes-1 */
    int nproc_per_node; /* workers on every node, >= 1 */
    char master_addr[TSP_TOPO_ADDR_MAX];
    int master_port; /* 1 .. 65535 */
    char run_id[TSP_TOPO_ID_MAX];
    char role[TSP_TOPO_ROLE_MAX];
    int max_restarts;
    int use_agent_store; /* 0: rank 0 hosts the TCPStore (TORCHELASTIC_USE_AGENT_STORE=False) */
} tsp_topo_t;

/* torchrun's defaults: 1 node, rank 0, 1 process, 127.0.0.1:29500, run id "none",
 * role "default", no restarts, no agent store. */
void tsp_topo_init(tsp_topo_t *t);
/* 0, or -EINVAL with a sentence in err naming the bad field. */
int tsp_topo_validate(const tsp_topo_t *t, char *err, size_t errlen);
int tsp_topo_world_size(const tsp_topo_t *t);
int tsp_topo_global_rank(const tsp_topo_t *t, int local_rank);

/* Sets, in env (which already holds the launcher's environment), every variable a
 * torchrun worker gets: LOCAL_RANK, RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME,
 * LOCAL_WORLD_SIZE, WORLD_SIZE, GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
 * TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE, TORCH_NCCL_ASYNC_ERROR_HANDLING,
 * TORCHELASTIC_SIGNALS_TO_HANDLE,
 * TORCHELASTIC_ERROR_FILE (when error_file is not NULL) and the OMP_NUM_THREADS rule. */
int tsp_topo_worker_env(const tsp_topo_t *t, int local_rank, int restart_count,
                        const char *error_file, tsp_env_t *env);

/* True (1) when OMP_NUM_THREADS will be set to 1 for the workers (nproc > 1 and unset). */
int tsp_topo_sets_omp(const tsp_topo_t *t, char *const *launcher_env);

/* Node rank and count from a batch launcher's environment, one agent per node:
 * SLURM_NODEID/SLURM_NNODES, OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE
 * (in that order). Fills source with the names used ("SLURM_NODEID/SLURM_NNODES").
 * 0 when found, -ENOENT when none is set, -EINVAL (with err) when set but malformed. */
int tsp_topo_from_launcher(char *const *envp, int *node_rank, int *nnodes, char *source,
                           size_t sourcelen, char *err, size_t errlen);

#endif
