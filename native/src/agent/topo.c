/* topo.c: rank arithmetic and the torchrun worker environment contract. */
#include "topo.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

void tsp_topo_init(tsp_topo_t *t)
{
    memset(t, 0, sizeof(*t));
    t->nnodes = 1;
    t->nproc_per_node = 1;
    snprintf(t->master_addr, sizeof(t->master_addr), "127.0.0.1");
    t->master_port = 29500;
    snprintf(t->run_id, sizeof(t->run_id), "none");
    snprintf(t->role, sizeof(t->role), "default");
}

int tsp_topo_validate(const tsp_topo_t *t, char *err, size_t errlen)
{
    const char *what = NULL;
    if (t->nnodes < 1)
        what = "nnodes must be at least 1";
    else if (t->node_rank < 0 || t->node_rank >= t->nnodes)
        what = "node rank must be between 0 and nnodes-1";
    else if (t->nproc_per_node < 1)
        what = "nproc-per-node must be at least 1";
    else if ((long long)t->nnodes * t->nproc_per_node > INT_MAX)
        what = "nnodes x nproc-per-node is too large";
    else if (t->master_port < 1 || t->master_port > 65535)
        what = "master port must be between 1 and 65535";
    else if (!t->master_addr[0])
        what = "master address is empty";
    else if (t->max_restarts < 0)
        what = "max-restarts must not be negative";
    if (!what)
        return 0;
    if (err && errlen)
        snprintf(err, errlen, "%s (nnodes=%d, node_rank=%d, nproc_per_node=%d, port=%d)", what,
                 t->nnodes, t->node_rank, t->nproc_per_node, t->master_port);
    return -EINVAL;
}

int tsp_topo_world_size(const tsp_topo_t *t)
{
    return t->nnodes * t->nproc_per_node;
}

int tsp_topo_global_rank(const tsp_topo_t *t, int local_rank)
{
    /* Static rendezvous with equal nproc on every node: ranks are contiguous by node. */
    return t->node_rank * t->nproc_per_node + local_rank;
}

int tsp_topo_sets_omp(const tsp_topo_t *t, char *const *launcher_env)
{
    return t->nproc_per_node > 1 && !tsp_env_lookup(launcher_env, "OMP_NUM_THREADS");
}

int tsp_topo_worker_env(const tsp_topo_t *t, int local_rank, int restart_count,
                        const char *error_file, tsp_env_t *env)
{
    char n[16][24];
    int world = tsp_topo_world_size(t), rank = tsp_topo_global_rank(t, local_rank);
    snprintf(n[0], sizeof n[0], "%d", local_rank);
    snprintf(n[1], sizeof n[1], "%d", rank);
    snprintf(n[2], sizeof n[2], "%d", t->node_rank);
    snprintf(n[3], sizeof n[3], "%d", t->nproc_per_node);
    snprintf(n[4], sizeof n[4], "%d", world);
    snprintf(n[5], sizeof n[5], "%d", t->nnodes);
    snprintf(n[6], sizeof n[6], "%d", t->master_port);
    snprintf(n[7], sizeof n[7], "%d", restart_count);
    snprintf(n[8], sizeof n[8], "%d", t->max_restarts);
    /* Every worker has the one role here, so role rank and size equal rank and world. */
    const char *kv[][2] = {
        {"LOCAL_RANK", n[0]},
        {"RANK", n[1]},
        {"GROUP_RANK", n[2]},
        {"ROLE_RANK", n[1]},
        {"ROLE_NAME", t->role},
        {"LOCAL_WORLD_SIZE", n[3]},
        {"WORLD_SIZE", n[4]},
        {"GROUP_WORLD_SIZE", n[5]},
        {"ROLE_WORLD_SIZE", n[4]},
        {"MASTER_ADDR", t->master_addr},
        {"MASTER_PORT", n[6]},
        {"TORCHELASTIC_RESTART_COUNT", n[7]},
        {"TORCHELASTIC_MAX_RESTARTS", n[8]},
        {"TORCHELASTIC_RUN_ID", t->run_id},
        {"TORCHELASTIC_USE_AGENT_STORE", t->use_agent_store ? "True" : "False"},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof kv / sizeof kv[0] && !rc; i++)
        rc = tsp_env_set(env, kv[i][0], kv[i][1]);
    if (!rc)
        rc = tsp_env_set_default(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    /* torchrun tells workers which signals its agent handles; ours handles these and
     * forwards SIGUSR1/SIGUSR2 as well. */
    if (!rc)
        rc = tsp_env_set_default(env, "TORCHELASTIC_SIGNALS_TO_HANDLE",
                                 "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    if (!rc && t->nproc_per_node > 1)
        rc = tsp_env_set_default(env, "OMP_NUM_THREADS", "1");
    if (!rc && error_file)
        rc = tsp_env_set(env, "TORCHELASTIC_ERROR_FILE", error_file);
    return rc;
}

int tsp_topo_from_launcher(char *const *envp, int *node_rank, int *nnodes, char *source,
                           size_t sourcelen, char *err, size_t errlen)
{
    static const char *const pairs[][2] = {
        {"SLURM_NODEID", "SLURM_NNODES"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const char *r = tsp_env_lookup(envp, pairs[i][0]);
        const char *s = tsp_env_lookup(envp, pairs[i][1]);
        if (!r || !s)
            continue;
        int rv, sv;
        if (tsp__parse_int(r, &rv) || tsp__parse_int(s, &sv) || sv < 1 || rv >= sv) {
            if (err && errlen)
                snprintf(err, errlen, "%s=%s and %s=%s do not describe a node of the job",
                         pairs[i][0], r, pairs[i][1], s);
            return -EINVAL;
        }
        *node_rank = rv;
        *nnodes = sv;
        if (source && sourcelen)
            snprintf(source, sourcelen, "%s/%s", pairs[i][0], pairs[i][1]);
        return 0;
    }
    return -ENOENT;
}
