/* run_config.h: what one torchspark-run invocation is asked to do, read once.
 *
 * The command line (torchrun's options, dashes or underscores, unambiguous prefixes), the
 * PET_* variables that stand for options, and every environment variable the CLI reads as
 * configuration are read here, into one run_config_t, as torch's run.py builds its
 * LaunchConfig: the rest of the CLI reads the struct, never argv or getenv. Bad input is a
 * usage error (exit 2, one line naming the problem; docs/cli.md).
 *
 * Three steps, in the order main needs them:
 *   run_config_parse  argv and the environment: pure, nothing started (the mode flags and
 *                     every value are known after it)
 *   run_config_node   the node: GPU assignment (--gpus, in a probe child), the topology
 *                     (the held --standalone port), the master port check
 *   run_config_worker the worker's command line: the interpreter, the bootstrap, the script
 */
#ifndef TSP_RUN_CONFIG_H
#define TSP_RUN_CONFIG_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

#include "topo.h"

typedef struct {
    /* modes */
    int help, version, nccl_check_worker;
    /* the program: argv[script_at...] */
    int script_at, argc;
    char **argv;
    const char *script;
    int module, no_python, finalize; /* finalize: TORCHSPARK_PYTHON_EXIT=finalize */
    const char *python;              /* --python, NULL: found beside this binary */
    /* the node */
    const char *gpus;  /* --gpus: Spark's addresses, NULL when not given */
    int assigned_gpus; /* after run_config_node: the workers' GPUs, -1 without --gpus */
    tsp_topo_t topo;   /* after run_config_node */
    int standalone_port_fd;
    pid_t expected_parent; /* TORCHSPARK_PARENT_PID, 0 when unset */
    /* supervision and output */
    double grace; /* --shutdown-timeout / TORCH_ELASTIC_SHUTDOWN_TIMEOUT */
    const char *log_dir, *error_file, *prefix_template;
    const char *tmp_dir;            /* $TMPDIR: the agent's own temp dir without --log-dir */
    const char *checkpoint_request; /* TORCHSPARK_CHECKPOINT_REQUEST (the plugin's), or NULL */
    unsigned char *redirects, *tee, *show; /* per local rank, after run_config_node */
    const char *warm_socket;               /* NULL: no pool, or this binary's path unknown */
    char self_exe[PATH_MAX];
    /* the driver's channel */
    const char *log_endpoint, *output_file;
    int log_drop;
    int has_secret;       /* TORCHSPARK_LOG_SECRET(_FD) was set (taken out of the environment) */
    char secret_hex[80];  /* its value */
    double stall_timeout; /* TORCHSPARK_LOG_STALL_TIMEOUT seconds, 0: never, -1: default */
    /* the NCCL preflight */
    double nccl_check; /* deadline in seconds, 0: off */
    int nccl_comm_port, nccl_check_bytes;
    const char *nccl_lib, *nccl_ifname;
} run_config_t;

/* Reads argv and the environment into c. Exits 2 on bad input. */
void run_config_parse(run_config_t *c, int argc, char **argv);
/* Assigns the GPUs (--gpus) and builds the topology (a usage error exits 2). 0, or 2 with
 * the message in err when the GPUs are refused (the caller reports the failure). */
int run_config_node(run_config_t *c, char *err, size_t errlen);
/* The worker's program and argv (python -u -c BOOT [-m] SCRIPT ARGS..., or the program
 * itself with --no-python): *file and a calloc'ed argv, NULL-terminated. Exits 2 when the
 * script does not exist, 1 when out of memory. */
char **run_config_worker(const run_config_t *c, const char **file);
void run_config_free(run_config_t *c);

/* One line "torchspark-run: error: ..." and exit 2. */
__attribute__((noreturn, format(printf, 1, 2))) void run_usage_error(const char *fmt, ...);
extern const char *const run_usage_text;

#endif
