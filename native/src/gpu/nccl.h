/* nccl.h (internal): the NCCL preflight check (docs/gpu.md). Before the first training
 * worker starts, the agent execs one check process per local GPU (torchspark-run
 * --nccl-check-worker); each opens its GPU through the CUDA driver API, joins a
 * communicator of the whole job bootstrapped through NCCL_COMM_ID with a non-blocking init
 * and a deadline, checks one all_reduce and times a few. The training's own libnccl is
 * used, loaded with dlopen. */
#ifndef TSP_NCCL_H
#define TSP_NCCL_H

#include <signal.h>
#include <stdatomic.h>

#include "torchspark/common.h"

#define TSP_NCCL_CHECK_TIMEOUT 180.0     /* seconds */
#define TSP_NCCL_CHECK_BYTES (32u << 20) /* all_reduce size */
#define TSP_NCCL_KILL_GRACE 5.0          /* deadline + this: SIGKILL */

/* One check worker (in its own process). Its result is one line of JSON on result_fd
 * (docs/protocol.md, "NCCL check result"). Returns the process's exit status: 0 when the
 * check passed, 1 otherwise. */
typedef struct {
    const char *lib; /* libnccl path; NULL: libnccl.so.2 through the loader */
    int rank, local_rank, world_size;
    double timeout; /* seconds, from the worker's start */
    size_t bytes;
    int result_fd;
} tsp_nccl_check_opts_t;

int tsp_nccl_check_run(const tsp_nccl_check_opts_t *o);
/* `torchspark-run --nccl-check-worker`: the check process's options from the environment
 * that the preflight wrote for it (TORCHSPARK_NCCL_LIB, _CHECK_TIMEOUT, _CHECK_BYTES,
 * _RESULT_FD, RANK, LOCAL_RANK, WORLD_SIZE), then tsp_nccl_check_run. 2 when started by
 * anything but the agent. */
int tsp_nccl_check_worker(void);

/* The node's side: starts nproc check workers (exe --nccl-check-worker, with RANK,
 * LOCAL_RANK, WORLD_SIZE, NCCL_COMM_ID and NCCL_DEBUG=WARN unless set, added to the
 * caller's environment), prefixes their stderr "[nccl-check rank N]: ", reads their
 * results, kills what is left at deadline + TSP_NCCL_KILL_GRACE (or when *cancel becomes
 * nonzero, or one of stop_signals is pending) and reaps everything. 0 with the node's success line
 * in msg; -ENODEV with one warning in msg when the host has no NVIDIA driver (libcuda cannot
 * be loaded: the check is skipped, training goes on); -EIO with the root cause in msg
 * (messages N1-N5); -ECANCELED when cancelled. */
typedef struct {
    const char *exe;     /* the torchspark-run binary */
    const char *lib;     /* --nccl-lib, or NULL */
    const char *comm_id; /* host:port for NCCL_COMM_ID */
    const char *ifname;  /* for the success line (NULL: NCCL's choice) */
    int nproc, first_rank, world_size;
    double timeout;
    size_t bytes;
    atomic_int *cancel;           /* may be NULL */
    const sigset_t *stop_signals; /* may be NULL: one of these pending (blocked) cancels too */
    int log_fd;                   /* where the workers' prefixed stderr goes */
    int *failed_rank;             /* may be NULL: set to the root cause's global rank, or -1 */
} tsp_nccl_preflight_opts_t;

int tsp_nccl_preflight(const tsp_nccl_preflight_opts_t *o, char *msg, size_t msglen);

/* Internal: sleeps ms milliseconds through EINTR (nccl.c; the worker's and ncclnode.c's polls). */
void tsp__nccl_nap_ms(long ms);

#endif
