/* agentopts.h (internal): the node agent's options (tsp_agent_opts_t) and its handle's type,
 * for agent.h and for the agent's own files (agent_int.h), which cannot include agent.h:
 * agent.c includes them (tests/check_deps.py: no cycle). */
#ifndef TSP_AGENTOPTS_H
#define TSP_AGENTOPTS_H

#include "lines.h"
#include "report.h"
#include "topo.h"

/* Bits of the per-local-rank redirect / tee masks (torchrun's Std values). */
enum { TSP_STD_OUT = 1, TSP_STD_ERR = 2 };

typedef struct tsp_agent_opts {
    tsp_topo_t topo;
    const char *file; /* program to run (PATH-searched when it has no '/') */
    char *const
        *argv; /* its argv; "$local_rank"/"${local_rank}" substituted per worker as torchrun does */
    char *const *envp;   /* the launcher's environment; NULL: environ */
    const char *name;    /* shown as "<name> FAILED" in the report (the script) */
    const char *log_dir; /* error files and redirected output; NULL: a temp dir removed at close */
    const char *tmp_dir; /* where that temp dir goes (the CLI passes $TMPDIR); NULL: /tmp */
    /* The checkpoint request file (the CLI passes $TORCHSPARK_CHECKPOINT_REQUEST): a failure
     * after its acknowledgement is the node's decommission (report.h). NULL: none. */
    const char *checkpoint_request;
    double shutdown_timeout;        /* seconds between SIGTERM and SIGKILL; < 0: 30 */
    const char *error_file;         /* where the root cause JSON goes; NULL: nowhere */
    const unsigned char *redirects; /* nproc_per_node TSP_STD_* masks; NULL: none */
    const unsigned char *tee;       /* nproc_per_node TSP_STD_* masks; NULL: none */
    const unsigned char *show;      /* nproc_per_node flags: 1 shows on console; NULL: all */
    tsp_line_sink_t *sink;          /* every worker line also goes here; NULL: none */
    int console_out, console_err;   /* fds for worker output on the console (1, 2) */
    int log_fd;                     /* the agent's own messages (2) */
    const char *log_prefix;         /* they start with it (NULL: "torchspark: "; the CLI's:
                                       "torchspark-run: ") */
    const char
        *prefix_template; /* console prefix when tee'd; NULL: "[${role_name}${local_rank}]:" */
    /* Called once, from the agent's loop, when the run has failed for good (no restart
     * left), before the other workers are stopped, with the root cause; error_file has
     * been written by then. Lets a caller tell others (the driver) without waiting for
     * this node's own teardown. NULL: none. */
    void (*on_failure)(void *ctx, const tsp_failure_t *root);
    void *on_failure_ctx;
    /* Called once, from the agent's loop, when a stop signal (SIGTERM, SIGINT, SIGHUP,
     * SIGQUIT, or tsp_agent_stop's) first stops a running attempt that no checkpoint on
     * request stops, before its workers are stopped: the caller tells whoever stopped it
     * apart (the driver's STOP, or its task killed from outside). NULL: none. */
    void (*on_stop_signal)(void *ctx, int sig);
    void *on_stop_signal_ctx;
    /* The warm worker pool (docs/protocol.md section 6). When both are set, each worker is
     * started through the shim (warm.h): `warm_shim --warm-exec warm_socket -- FILE ARGV...`
     * (warm_shim: the torchspark-run executable), which has the pool fork the worker, or,
     * without a pool, execs FILE itself. Everything else about the worker is unchanged.
     * NULL: workers are exec'ed directly. */
    const char *warm_socket;
    const char *warm_shim;
} tsp_agent_opts_t;

typedef struct tsp_agent tsp_agent_t;

#endif
