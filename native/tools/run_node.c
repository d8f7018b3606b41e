/* run_node.c: the node's part of one torchspark-run invocation's configuration
 * (run_config_node, run_config.h), split from run_config.c, which reads the options and the
 * environment: the GPU assignment (--gpus) and count in a probe child, the topology (the
 * node from SLURM / Open MPI / PMI when run one per node by srun or mpirun, the held
 * --standalone port, a random run id), the master port check and the -r/-t and
 * --local-ranks-filter masks. Usage errors exit 2 with one line naming the problem. */
#include "run_config.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"
#include "run_config_int.h"
#include "torchspark/common.h"
#include "torchspark/gpu.h"
#include "util.h"

extern char **environ;

/* The GPU libraries (NVML, the CUDA driver) are loaded only in a short-lived child of the
 * agent (tsp_proc_isolate), never in the agent itself: the threads they start would take
 * the SIGCHLD that the agent reads through its signalfd, and they would stay resident
 * (10-22 MiB measured on an H200) for the whole job (docs/architecture.md, "Signals"). */
enum { GPU_PROBE_TIMEOUT_MS = 120000 };

typedef struct {
    int rc;
    tsp_gpu_assignment_t out;
    char err[4096];
} assign_answer_t;

static int assign_in_child(void *ctx, void *out, size_t len)
{
    (void)len;
    assign_answer_t *a = out;
    a->rc = tsp_gpu_assign(ctx, &a->out, a->err, sizeof a->err);
    return 0;
}

typedef struct {
    int rc, count;
    char err[512];
} count_answer_t;

static int count_in_child(void *ctx, void *out, size_t len)
{
    (void)ctx;
    (void)len;
    count_answer_t *a = out;
    a->rc = tsp_gpu_count(&a->count, a->err, sizeof a->err);
    return 0;
}

/* Runs fn in the probe child. 0 with the answer in out, or -errno with err set. */
static int gpu_probe(tsp_proc_isolated_fn fn, void *ctx, void *out, size_t len, char *err,
                     size_t errlen)
{
    int status = 0;
    int rc = tsp_proc_isolate(fn, ctx, out, len, GPU_PROBE_TIMEOUT_MS, &status);
    if (rc == -ETIMEDOUT)
        snprintf(err, errlen,
                 "torchspark: the GPU driver (NVML or libcuda) did not answer within %d s on "
                 "this host; check the driver with nvidia-smi",
                 GPU_PROBE_TIMEOUT_MS / 1000);
    else if (rc == -ECHILD)
        snprintf(err, errlen,
                 "torchspark: the GPU driver (NVML or libcuda) crashed this host's GPU probe "
                 "(%s %d); check the driver with nvidia-smi",
                 WIFSIGNALED(status) ? "signal" : "exit status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    else if (rc)
        snprintf(err, errlen, "torchspark: cannot start the GPU probe: %s", strerror(-rc));
    return rc;
}

/* --gpus: Spark's addresses for this node's task, assigned against the executor's mask
 * (tsp_gpu_assign, rules R0-R8) before anything else starts, in the probe child. 0, or 2
 * with the rule's message in err. */
static int assign_gpus(run_config_t *c, char *err, size_t errlen)
{
    if (!c->gpus)
        return 0;
    int node_rank = 0;
    if (tsp__runcfg_val("node-rank"))
        tsp__parse_int(tsp__runcfg_val("node-rank"), &node_rank);
    char task[32];
    snprintf(task, sizeof task, "%d", node_rank);
    tsp_gpu_request_t req = {
        .addrs = c->gpus, .mask = getenv("CUDA_VISIBLE_DEVICES"), .task = task};
    assign_answer_t *ans = calloc(1, sizeof *ans);
    if (!ans)
        exit(1);
    tsp_gpu_assignment_t *out = &ans->out;
    int rc = gpu_probe(assign_in_child, &req, ans, sizeof *ans, err, errlen);
    if (!rc && (rc = ans->rc) != 0)
        snprintf(err, errlen, "%s", ans->err);
    if (rc) {
        if (!err[0])
            snprintf(err, errlen, "%s", tsp_strerror(rc));
        free(ans);
        c->topo.node_rank = node_rank; /* names the node in the failure document */
        return 2;
    }
    fputs(out->warnings, stderr);
    /* The workers' mask; integers index the host's GPUs in PCI bus order (as nvidia-smi and
     * Spark's discovery script number them), not CUDA's default fastest-first order. */
    setenv("CUDA_VISIBLE_DEVICES", out->mask, 1);
    if (out->integers)
        setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    c->assigned_gpus = out->count;
    free(ans);
    return 0;
}

static int gpu_count(void);

static int parse_nproc(const run_config_t *c)
{
    const char *v = tsp__runcfg_val("nproc-per-node");
    if (c->assigned_gpus >= 0) {
        int n = c->assigned_gpus;
        if (v && strcmp(v, "gpu") != 0 && strcmp(v, "auto") != 0 &&
            (tsp__parse_int(v, &n) != 0 || n != c->assigned_gpus))
            run_usage_error("--nproc-per-node %s does not match the %d GPU(s) of --gpus %s: one "
                            "worker runs per GPU (give --nproc-per-node gpu)",
                            v, c->assigned_gpus, c->gpus);
        return c->assigned_gpus;
    }
    if (!v)
        return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (strcmp(v, "cpu") == 0)
        return (int)(cpus > 0 ? cpus : 1);
    if (strcmp(v, "gpu") == 0 || strcmp(v, "auto") == 0) {
        int g = gpu_count();
        if (g > 0)
            return g;
        if (strcmp(v, "gpu") == 0)
            run_usage_error("--nproc-per-node gpu: no CUDA device was found on this host");
        return (int)(cpus > 0 ? cpus : 1);
    }
    int n;
    if (tsp__parse_int(v, &n) != 0 || n < 1)
        run_usage_error("--nproc-per-node must be a number >= 1, cpu, gpu or auto, not '%s'", v);
    return n;
}

/* CUDA devices this process can use, as torch.cuda.device_count() would say. */
static int gpu_count(void)
{
    count_answer_t ans;
    char err[512] = "";
    if (gpu_probe(count_in_child, NULL, &ans, sizeof ans, err, sizeof err) != 0) {
        fprintf(stderr, "torchspark-run: WARNING: %s\n", err);
        return 0;
    }
    if (ans.rc != 0)
        fprintf(stderr, "torchspark-run: WARNING: %s\n", ans.err);
    return ans.rc == 0 ? ans.count : 0;
}

static void parse_nnodes(tsp_topo_t *t)
{
    const char *v = tsp__runcfg_val("nnodes");
    if (!v)
        return;
    const char *colon = strchr(v, ':');
    int lo, hi;
    if (colon) {
        char a[32];
        snprintf(a, sizeof a, "%.*s", (int)(colon - v), v);
        if (tsp__parse_int(a, &lo) || tsp__parse_int(colon + 1, &hi) || lo < 1 || hi < lo)
            run_usage_error("--nnodes must be N or MIN:MAX, not '%s'", v);
        if (lo != hi)
            run_usage_error("--nnodes %s: an elastic range needs a dynamic rendezvous; "
                            "torchspark-run uses the static one: give one number",
                            v);
    } else if (tsp__parse_int(v, &lo) || lo < 1) {
        run_usage_error("--nnodes must be a number >= 1, not '%s'", v);
    }
    t->nnodes = lo;
}

static void parse_endpoint(tsp_topo_t *t, const char *ep)
{
    /* torchrun's default rendezvous port when the endpoint has none. */
    if (tsp__endpoint_parse(ep, t->master_addr, sizeof t->master_addr, &t->master_port, 29400))
        run_usage_error("--rdzv-endpoint must be HOST, HOST:PORT or [IPV6]:PORT with a port in "
                        "1-65535, not '%s'",
                        ep);
}

/* Masks for -r/-t: "3" for every rank, or "0:1,1:2" per local rank. */
static unsigned char *parse_std(const char *name, int n)
{
    const char *v = tsp__runcfg_val(name);
    if (!v)
        return NULL;
    unsigned char *m = calloc((size_t)n, 1);
    if (!m)
        exit(1);
    int all;
    if (tsp__parse_int(v, &all) == 0) {
        if (all > 3)
            run_usage_error("--%s must be 0-3 or local_rank:value,..., not '%s'", name, v);
        memset(m, all, (size_t)n);
        return m;
    }
    char *copy = strdup(v), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        int r, x;
        if (!colon)
            run_usage_error("--%s must be 0-3 or local_rank:value,..., not '%s'", name, v);
        *colon = 0;
        if (tsp__parse_int(tok, &r) || tsp__parse_int(colon + 1, &x) || x > 3)
            run_usage_error("--%s must be 0-3 or local_rank:value,..., not '%s'", name, v);
        if (r < n)
            m[r] = (unsigned char)x;
    }
    free(copy);
    return m;
}

static unsigned char *parse_filter(int n)
{
    const char *v = tsp__runcfg_val("local-ranks-filter");
    if (!v || !*v)
        return NULL;
    unsigned char *m = calloc((size_t)n, 1);
    char *copy = strdup(v), *save = NULL;
    if (!m || !copy)
        exit(1);
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int r;
        if (tsp__parse_int(tok, &r))
            run_usage_error("--local-ranks-filter must be local ranks like 0,2, not '%s'", v);
        if (r < n)
            m[r] = 1;
    }
    free(copy);
    return m;
}

/* Binds host:port the way torch's store will (SO_REUSEADDR): EADDRINUSE means a listener
 * holds it. An address that is not local cannot be checked here and is skipped. */
static void check_port_free(const char *host, int port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0)
        return;
    int in_use = 0;
    for (struct addrinfo *ai = res; ai && !in_use; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno == EADDRINUSE)
            in_use = 1;
        close(fd);
    }
    freeaddrinfo(res);
    if (in_use)
        run_usage_error("master port %d on %s is already in use: choose another --master-port, "
                        "or use --standalone to pick a free one",
                        port, host);
}

/* Reserves a free port for --standalone, held for the whole run (util.h: bound with
 * SO_REUSEADDR, never listening, close-on-exec), so that no other process's connect() or
 * bind() can take it before rank 0's TCPStore binds it. On the wildcard address, as the
 * election's (elect.c): TCPStore binds the wildcard, and the kernel gives a port 0 bound to
 * 127.0.0.1 even where another address of the host holds that port (a server on the host's
 * own address), which TCPStore's bind then found in use (EADDRINUSE). */
static int reserve_port(int *fd_out)
{
    char err[256];
    int port;
    if (tsp__port_reserve("0.0.0.0", 0, fd_out, &port, err, sizeof err) != 0) {
        fprintf(stderr, "torchspark-run: %s\n", err);
        exit(1);
    }
    return port;
}

/* A random run id in the UUID layout that torchrun's --standalone uses. */
static void random_id(char *out, size_t len)
{
    unsigned char b[16];
    char hex[33];
    int rc = tsp__random_bytes(b, sizeof b);
    if (rc != 0) {
        fprintf(stderr, "torchspark-run: no random bytes for the run id: %s\n", tsp_strerror(rc));
        exit(1);
    }
    tsp__hex_encode(b, sizeof b, hex);
    snprintf(out, len, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
}

static void build_topology(run_config_t *c)
{
    tsp_topo_t *t = &c->topo;
    char src[64], err[256];
    tsp_topo_init(t);
    parse_nnodes(t);
    t->nproc_per_node = parse_nproc(c);
    t->max_restarts = tsp__runcfg_int("max-restarts", 0, 0);
    if (tsp__runcfg_val("role"))
        snprintf(t->role, sizeof t->role, "%s", tsp__runcfg_val("role"));
    if (tsp__runcfg_val("rdzv-id"))
        snprintf(t->run_id, sizeof t->run_id, "%s", tsp__runcfg_val("rdzv-id"));
    const char *backend = tsp__runcfg_val("rdzv-backend");
    int have_endpoint = tsp__runcfg_val("rdzv-endpoint") && *tsp__runcfg_val("rdzv-endpoint");
    int launcher_rank = -1, launcher_nodes = 0;
    if (!tsp__runcfg_val("node-rank")) {
        int rc = tsp_topo_from_launcher(environ, &launcher_rank, &launcher_nodes, src, sizeof src,
                                        err, sizeof err);
        if (rc == -EINVAL)
            run_usage_error("%s", err);
        if (rc == 0 && tsp__runcfg_val("nnodes") && launcher_nodes != t->nnodes)
            run_usage_error("--nnodes %d does not match %s (%d nodes)", t->nnodes, src,
                            launcher_nodes);
        if (rc != 0)
            launcher_rank = -1;
    }
    /* --standalone, and (as torchrun 2.15 does) one node with the static backend and no
     * port or endpoint: localhost, a free port held for the run, a random run id. */
    int one_node = launcher_rank < 0 ? t->nnodes == 1 : launcher_nodes == 1;
    if (tsp__runcfg_flag("standalone") ||
        (one_node && !tsp__runcfg_val("master-port") && !have_endpoint &&
         (!backend || strcmp(backend, "static") == 0))) {
        t->nnodes = 1;
        t->node_rank = 0;
        snprintf(t->master_addr, sizeof t->master_addr, "localhost");
        t->master_port = reserve_port(&c->standalone_port_fd);
        random_id(t->run_id, sizeof t->run_id);
        return;
    }
    if (backend && strcmp(backend, "static") != 0 && t->nnodes > 1)
        run_usage_error("--rdzv-backend %s is not supported: torchspark-run uses the static "
                        "rendezvous; give each node --node-rank (or run it under srun/mpirun)",
                        backend);
    if (tsp__runcfg_val("master-addr"))
        snprintf(t->master_addr, sizeof t->master_addr, "%s", tsp__runcfg_val("master-addr"));
    if (tsp__runcfg_val("master-port") &&
        (tsp__parse_int(tsp__runcfg_val("master-port"), &t->master_port) || t->master_port < 1 ||
         t->master_port > 65535))
        run_usage_error("--master-port must be a port number (1-65535), not '%s'",
                        tsp__runcfg_val("master-port"));
    if (tsp__runcfg_val("rdzv-endpoint") && *tsp__runcfg_val("rdzv-endpoint"))
        parse_endpoint(t, tsp__runcfg_val("rdzv-endpoint"));
    if (tsp__runcfg_val("node-rank")) {
        t->node_rank = tsp__runcfg_int("node-rank", 0, 0);
    } else if (launcher_rank >= 0) {
        t->nnodes = launcher_nodes;
        t->node_rank = launcher_rank;
        fprintf(stderr, "torchspark-run: node rank %d of %d nodes from %s\n", launcher_rank,
                launcher_nodes, src);
    }
    if (tsp_topo_validate(t, err, sizeof err))
        run_usage_error("%s", err);
}

int run_config_node(run_config_t *c, char *err, size_t errlen)
{
    err[0] = 0;
    if (assign_gpus(c, err, errlen))
        return 2;
    build_topology(c);
    if (c->topo.node_rank == 0 && c->standalone_port_fd < 0)
        check_port_free(c->topo.master_addr, c->topo.master_port);
    int n = c->topo.nproc_per_node;
    c->redirects = parse_std("redirects", n);
    c->tee = parse_std("tee", n);
    c->show = parse_filter(n);
    return 0;
}
