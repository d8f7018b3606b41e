/* run_config.c: one torchspark-run invocation's configuration, read once (run_config.h):
 * torchrun's options (dashes or underscores, unambiguous prefixes, PET_* variables), the
 * node from SLURM / Open MPI / PMI when run one per node by srun or mpirun, and every
 * environment variable the CLI takes as configuration. Usage errors exit 2 with one line
 * naming the problem. */
#include "run_config.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl.h"
#include "proc.h"
#include "pyboot.h"
#include "torchspark/common.h"
#include "torchspark/gpu.h"
#include "util.h"

extern char **environ;

enum { ARG_NONE = 0, ARG_REQUIRED = 1, ARG_OPTIONAL = 2 /* only as --name=VALUE */ };

typedef struct {
    const char *name; /* canonical, with dashes */
    char shortname;
    int has_arg;
    const char *value; /* set when given (flags: "1") */
    int from_cli;
} opt_t;

/* torchrun's options, ours, and those accepted as no-ops (documented in docs/cli.md). */
static opt_t opts[] = {
    {"nnodes", 0, 1, NULL, 0},
    {"nproc-per-node", 0, 1, NULL, 0},
    {"node-rank", 0, 1, NULL, 0},
    {"master-addr", 0, 1, NULL, 0},
    {"master-port", 0, 1, NULL, 0},
    {"rdzv-endpoint", 0, 1, NULL, 0},
    {"rdzv-id", 0, 1, NULL, 0},
    {"rdzv-backend", 0, 1, NULL, 0},
    {"rdzv-conf", 0, 1, NULL, 0},
    {"standalone", 0, 0, NULL, 0},
    {"max-restarts", 0, 1, NULL, 0},
    {"monitor-interval", 0, 1, NULL, 0},
    {"start-method", 0, 1, NULL, 0},
    {"role", 0, 1, NULL, 0},
    {"module", 'm', 0, NULL, 0},
    {"no-python", 0, 0, NULL, 0},
    {"run-path", 0, 0, NULL, 0},
    {"log-dir", 0, 1, NULL, 0},
    {"redirects", 'r', 1, NULL, 0},
    {"tee", 't', 1, NULL, 0},
    {"local-ranks-filter", 0, 1, NULL, 0},
    {"local-addr", 0, 1, NULL, 0},
    {"logs-specs", 0, 1, NULL, 0},
    {"signals-to-handle", 0, 1, NULL, 0},
    {"event-log-handler", 0, 1, NULL, 0},
    {"numa-binding", 0, 1, NULL, 0},
    {"virtual-local-rank", 0, 0, NULL, 0},
    {"log-line-prefix-template", 0, 1, NULL, 0},
    {"duplicate-stdout-filters", 0, 1, NULL, 0},
    {"duplicate-stderr-filters", 0, 1, NULL, 0},
    {"print-completion", 0, 1, NULL, 0},
    {"shutdown-timeout", 0, 1, NULL, 0},
    {"error-file", 0, 1, NULL, 0},
    {"python", 0, 1, NULL, 0},
    {"help", 'h', 0, NULL, 0},
    {"version", 0, 0, NULL, 0},
    {"log-endpoint", 0, 1, NULL, 0},
    {"output-file", 0, 1, NULL, 0},
    {"log-drop", 0, 0, NULL, 0},
    {"warm-socket", 0, 1, NULL, 0}, /* the warm worker pool (docs/protocol.md section 6) */
    /* GPUs (docs/gpu.md) */
    {"gpus", 0, 1, NULL, 0},
    {"nccl-check", 0, ARG_OPTIONAL, NULL, 0},
    {"nccl-check-bytes", 0, 1, NULL, 0},
    {"nccl-lib", 0, 1, NULL, 0},
    {"nccl-comm-port", 0, 1, NULL, 0},
    {"nccl-check-worker", 0, 0, NULL, 0}, /* hidden: one preflight check process */
};
#define NOPTS (sizeof opts / sizeof opts[0])

const char *const run_usage_text =
    "usage: torchspark-run [--nnodes N] [--nproc-per-node N|cpu|gpu|auto] [--node-rank R]\n"
    "                      [--master-addr A] [--master-port P] [--rdzv-endpoint HOST:PORT]\n"
    "                      [--rdzv-id ID] [--standalone] [--max-restarts N] [--role NAME]\n"
    "                      [-m] [--no-python] [--log-dir DIR] [-r SPEC] [-t SPEC]\n"
    "                      [--local-ranks-filter R,...] [--shutdown-timeout SECONDS]\n"
    "                      [--error-file PATH] [--python PATH]\n"
    "                      [--log-endpoint HOST:PORT [--log-drop]] [--output-file PATH]\n"
    "                      [--warm-socket PATH]\n"
    "                      [--gpus ADDRESSES] [--nccl-check[=SECONDS]] [--nccl-check-bytes N]\n"
    "                      [--nccl-lib PATH] [--nccl-comm-port P]\n"
    "                      SCRIPT [ARGS...]\n"
    "A native drop-in for torchrun (static rendezvous). See docs/cli.md.\n";

void run_usage_error(const char *fmt, ...)
{
    va_list ap;
    fputs("torchspark-run: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see torchspark-run --help)\n", stderr);
    exit(2);
}

static opt_t *find_opt(const char *given, size_t len)
{
    char norm[64];
    if (len >= sizeof norm)
        return NULL;
    for (size_t i = 0; i < len; i++)
        norm[i] = given[i] == '_' ? '-' : given[i];
    norm[len] = 0;
    opt_t *match = NULL;
    int nmatch = 0;
    for (size_t i = 0; i < NOPTS; i++) {
        if (strcmp(opts[i].name, norm) == 0)
            return &opts[i];
        if (strncmp(opts[i].name, norm, len) == 0) {
            match = &opts[i];
            nmatch++;
        }
    }
    if (nmatch > 1)
        run_usage_error("option '--%s' is ambiguous", norm);
    return match;
}

static opt_t *opt(const char *name)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (strcmp(opts[i].name, name) == 0)
            return &opts[i];
    return NULL;
}

static const char *val(const char *name)
{
    return opt(name)->value;
}

static int flag(const char *name)
{
    const char *v = val(name);
    return v && (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0);
}

/* Parses options up to the script; returns the index of the script in argv. */
static int parse_cli(int argc, char **argv)
{
    int i = 1;
    for (; i < argc; i++) {
        char *a = argv[i];
        if (strcmp(a, "--") == 0)
            return i + 1;
        if (a[0] != '-' || a[1] == 0)
            break;
        opt_t *o = NULL;
        const char *inline_val = NULL;
        if (a[1] == '-') {
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            o = find_opt(a + 2, len);
            inline_val = eq ? eq + 1 : NULL;
        } else {
            for (size_t k = 0; k < NOPTS && !o; k++)
                if (opts[k].shortname == a[1])
                    o = &opts[k];
            if (o && a[2])
                inline_val = a[2] == '=' ? a + 3 : a + 2;
        }
        if (!o)
            run_usage_error("unknown option '%s'", a);
        if (o->has_arg == ARG_OPTIONAL) {
            o->value = inline_val ? inline_val : "";
        } else if (o->has_arg) {
            if (!inline_val) {
                if (i + 1 >= argc)
                    run_usage_error("option '--%s' needs a value", o->name);
                inline_val = argv[++i];
            }
            o->value = inline_val;
        } else {
            if (inline_val)
                run_usage_error("option '--%s' takes no value", o->name);
            o->value = "1";
        }
        o->from_cli = 1;
    }
    /* PET_<NAME> supplies what the command line did not. */
    for (size_t k = 0; k < NOPTS; k++) {
        if (opts[k].from_cli)
            continue;
        char env[80] = "PET_";
        size_t j = 4;
        for (const char *p = opts[k].name; *p && j < sizeof env - 1; p++)
            env[j++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        env[j] = 0;
        if (getenv(env))
            opts[k].value = getenv(env);
    }
    return i;
}

static int int_opt(const char *name, int dflt, int min)
{
    const char *v = val(name);
    if (!v)
        return dflt;
    int out;
    if (tsp__parse_int(v, &out) != 0 || out < min)
        run_usage_error("--%s must be a whole number >= %d, not '%s'", name, min, v);
    return out;
}

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
    if (val("node-rank"))
        tsp__parse_int(val("node-rank"), &node_rank);
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
    const char *v = val("nproc-per-node");
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
    const char *v = val("nnodes");
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
    const char *v = val(name);
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
    const char *v = val("local-ranks-filter");
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

/* An executable `python` or `python3` in dir (written to buf), or NULL. */
static const char *python_in(const char *dir, int dirlen, char *buf, size_t len)
{
    static const char *const names[] = {"python", "python3"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(buf, len, "%.*s/%s", dirlen, dir, names[i]);
        if (access(buf, X_OK) == 0)
            return buf;
    }
    return NULL;
}

/* The interpreter for workers: --python, else the `python` (or `python3`) beside this
 * binary as invoked, then beside its resolved path (pip installs the command into the
 * environment's bin/, beside its interpreter: a venv, conda, a system prefix; torchrun
 * likewise uses its own sys.executable), else python3 in PATH. */
static const char *find_python(const char *argv0)
{
    if (val("python"))
        return val("python");
    static char buf[PATH_MAX];
    char self[PATH_MAX];
    const char *slash = strrchr(argv0, '/');
    if (slash && python_in(argv0, (int)(slash - argv0), buf, sizeof buf))
        return buf;
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *s = strrchr(self, '/');
        if (s && python_in(self, (int)(s - self), buf, sizeof buf))
            return buf;
    }
    return "python3";
}

static void build_topology(run_config_t *c)
{
    tsp_topo_t *t = &c->topo;
    char src[64], err[256];
    tsp_topo_init(t);
    parse_nnodes(t);
    t->nproc_per_node = parse_nproc(c);
    t->max_restarts = int_opt("max-restarts", 0, 0);
    if (val("role"))
        snprintf(t->role, sizeof t->role, "%s", val("role"));
    if (val("rdzv-id"))
        snprintf(t->run_id, sizeof t->run_id, "%s", val("rdzv-id"));
    const char *backend = val("rdzv-backend");
    int have_endpoint = val("rdzv-endpoint") && *val("rdzv-endpoint");
    int launcher_rank = -1, launcher_nodes = 0;
    if (!val("node-rank")) {
        int rc = tsp_topo_from_launcher(environ, &launcher_rank, &launcher_nodes, src, sizeof src,
                                        err, sizeof err);
        if (rc == -EINVAL)
            run_usage_error("%s", err);
        if (rc == 0 && val("nnodes") && launcher_nodes != t->nnodes)
            run_usage_error("--nnodes %d does not match %s (%d nodes)", t->nnodes, src,
                            launcher_nodes);
        if (rc != 0)
            launcher_rank = -1;
    }
    /* --standalone, and (as torchrun 2.15 does) one node with the static backend and no
     * port or endpoint: localhost, a free port held for the run, a random run id. */
    int one_node = launcher_rank < 0 ? t->nnodes == 1 : launcher_nodes == 1;
    if (flag("standalone") || (one_node && !val("master-port") && !have_endpoint &&
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
    if (val("master-addr"))
        snprintf(t->master_addr, sizeof t->master_addr, "%s", val("master-addr"));
    if (val("master-port") && (tsp__parse_int(val("master-port"), &t->master_port) ||
                               t->master_port < 1 || t->master_port > 65535))
        run_usage_error("--master-port must be a port number (1-65535), not '%s'",
                        val("master-port"));
    if (val("rdzv-endpoint") && *val("rdzv-endpoint"))
        parse_endpoint(t, val("rdzv-endpoint"));
    if (val("node-rank")) {
        t->node_rank = int_opt("node-rank", 0, 0);
    } else if (launcher_rank >= 0) {
        t->nnodes = launcher_nodes;
        t->node_rank = launcher_rank;
        fprintf(stderr, "torchspark-run: node rank %d of %d nodes from %s\n", launcher_rank,
                launcher_nodes, src);
    }
    if (tsp_topo_validate(t, err, sizeof err))
        run_usage_error("%s", err);
}

/* --nccl-check[=SECONDS] (or TORCHSPARK_NCCL_CHECK=1): the deadline, 0 when off. */
static double nccl_check_timeout(void)
{
    const char *v = val("nccl-check");
    const char *env = getenv("TORCHSPARK_NCCL_CHECK");
    if (!v && env && (strcmp(env, "1") == 0 || strcasecmp(env, "true") == 0))
        v = "";
    if (!v || strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0)
        return 0;
    if (!*v || strcasecmp(v, "true") == 0) /* a number is the deadline in seconds */
        return TSP_NCCL_CHECK_TIMEOUT;
    char *end;
    double t = strtod(v, &end);
    if (*end || !(t > 0))
        run_usage_error("--nccl-check=SECONDS needs a number of seconds > 0, not '%s'", v);
    return t;
}

/* The path of this executable, for the shim under --warm-socket: the option is ignored,
 * with one warning, when it cannot be found. */
static const char *warm_socket_opt(char *self, size_t len)
{
    const char *sock = val("warm-socket");
    if (!sock)
        return NULL;
    if (!*sock)
        run_usage_error("--warm-socket needs the path of the warm pool's socket");
    ssize_t n = readlink("/proc/self/exe", self, len);
    if (n <= 0 || (size_t)n >= len) {
        fprintf(stderr,
                "torchspark-run: WARNING: --warm-socket is ignored: this program's own path "
                "cannot be read from /proc/self/exe (%s); workers start without the warm "
                "pool\n",
                n < 0 ? strerror(errno) : "too long");
        return NULL;
    }
    self[n] = 0;
    return sock;
}

/* A number of seconds >= 0 from an option or a variable (what names it), or dflt. */
static double seconds(const char *v, const char *what, double dflt)
{
    if (!v)
        return dflt;
    char *end;
    double s = strtod(v, &end);
    if (!*v || *end || !(s >= 0))
        run_usage_error("%s must be a number of seconds >= 0, not '%s'", what, v);
    return s;
}

/* Reads the secret from fd: at most sizeof c->secret_hex - 1 bytes up to end of file or a
 * newline, waiting 10 s at most for the writer (the glue writes it before anything else). */
static void read_secret_fd(run_config_t *c, int fd)
{
    size_t got = 0, cap = sizeof c->secret_hex - 1;
    while (got < cap && !memchr(c->secret_hex, '\n', got)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, 10000);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0)
            run_usage_error("TORCHSPARK_LOG_SECRET_FD %d: nothing came in 10 s (the process "
                            "that starts the agent writes the secret there, then closes it)",
                            fd);
        ssize_t n = pr < 0 ? -1 : read(fd, c->secret_hex + got, cap - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            run_usage_error("TORCHSPARK_LOG_SECRET_FD %d cannot be read: %s (it must name a "
                            "descriptor open for reading, such as a pipe on standard input)",
                            fd, strerror(errno));
        if (n == 0)
            break;
        got += (size_t)n;
    }
    c->secret_hex[got] = 0;
    c->secret_hex[strcspn(c->secret_hex, "\r\n")] = 0;
}

/* The driver's log channel's secret (docs/protocol.md 1.1), taken so that no other process
 * of this user can read it in /proc/<pid>/environ, which shows the initial environment
 * block whatever unsetenv does: from the descriptor that TORCHSPARK_LOG_SECRET_FD names (the
 * glues: a pipe on standard input, which is then /dev/null for the workers), else from
 * TORCHSPARK_LOG_SECRET (by hand), whose bytes are overwritten in place at once. Both
 * variables leave the environment: the workers never see the secret. This runs first thing
 * in main, before the sentinel is forked (it keeps a copy of this memory) or a worker runs. */
static void take_secret(run_config_t *c)
{
    char *sv = getenv("TORCHSPARK_LOG_SECRET");
    const char *fdv = getenv("TORCHSPARK_LOG_SECRET_FD");
    c->has_secret = sv != NULL || fdv != NULL;
    if (sv) {
        snprintf(c->secret_hex, sizeof c->secret_hex, "%s", sv);
        explicit_bzero(sv, strlen(sv));
    }
    unsetenv("TORCHSPARK_LOG_SECRET");
    if (fdv) {
        int fd = -1;
        if (tsp__parse_int(fdv, &fd) || fd < 0)
            run_usage_error("TORCHSPARK_LOG_SECRET_FD must be a descriptor number, not '%s'", fdv);
        memset(c->secret_hex, 0, sizeof c->secret_hex);
        read_secret_fd(c, fd);
        close(fd);
        if (fd == STDIN_FILENO) {
            /* Not close-on-exec: the workers' standard input (fd 0 is free: it comes back). */
            int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
            if (nul == STDIN_FILENO)
                fcntl(nul, F_SETFD, 0);
            else if (nul > 0) {
                dup2(nul, STDIN_FILENO);
                close(nul);
            }
        }
        unsetenv("TORCHSPARK_LOG_SECRET_FD");
    }
}

void run_config_parse(run_config_t *c, int argc, char **argv)
{
    memset(c, 0, sizeof *c);
    c->argc = argc;
    c->argv = argv;
    c->assigned_gpus = -1;
    c->standalone_port_fd = -1;
    c->stall_timeout = -1;
    c->script_at = parse_cli(argc, argv);
    c->nccl_check_worker = flag("nccl-check-worker");
    c->help = flag("help");
    c->version = flag("version");
    if (c->nccl_check_worker || c->help || c->version)
        return;
    if (c->script_at >= argc)
        run_usage_error("the training script is missing");
    c->script = argv[c->script_at];
    c->module = flag("module");
    c->no_python = flag("no-python");
    if (c->module && c->no_python)
        run_usage_error("-m and --no-python cannot be used together");
    c->python = val("python");
    c->gpus = val("gpus");
    const char *parent = getenv("TORCHSPARK_PARENT_PID");
    int expected = 0;
    if (parent && tsp__parse_int(parent, &expected) == 0)
        c->expected_parent = (pid_t)expected;
    /* The worker command line: python -u -c BOOT [-m] script args... (pyboot.c: ends
     * without interpreter finalization), python -u [-m] script args... when
     * TORCHSPARK_PYTHON_EXIT=finalize, or the program itself. */
    const char *exit_mode = getenv("TORCHSPARK_PYTHON_EXIT");
    c->finalize = exit_mode && strcmp(exit_mode, "finalize") == 0;
    if (exit_mode && *exit_mode && !c->finalize && strcmp(exit_mode, "fast") != 0)
        run_usage_error(
            "TORCHSPARK_PYTHON_EXIT must be 'fast' (the default) or 'finalize', not '%s'",
            exit_mode);
    c->grace = seconds(val("shutdown-timeout") ? val("shutdown-timeout")
                                               : getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
                       "--shutdown-timeout", 30);
    c->log_dir = val("log-dir");
    c->tmp_dir = getenv("TMPDIR");
    c->checkpoint_request = getenv("TORCHSPARK_CHECKPOINT_REQUEST");
    c->error_file = val("error-file");
    c->prefix_template = val("log-line-prefix-template")
                             ? val("log-line-prefix-template")
                             : getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    c->warm_socket = warm_socket_opt(c->self_exe, sizeof c->self_exe);
    take_secret(c);
    c->log_endpoint = val("log-endpoint");
    c->log_drop = flag("log-drop");
    c->output_file = val("output-file");
    if (c->output_file && !c->log_endpoint)
        run_usage_error("--output-file needs --log-endpoint (the driver to ship it to)");
    const char *stall = getenv("TORCHSPARK_LOG_STALL_TIMEOUT");
    if (stall && *stall) {
        char *end;
        c->stall_timeout = strtod(stall, &end);
        if (*end || !(c->stall_timeout >= 0) || c->stall_timeout > 86400)
            run_usage_error("TORCHSPARK_LOG_STALL_TIMEOUT must be seconds (0: never), not '%s'",
                            stall);
    }
    c->nccl_check = nccl_check_timeout();
    c->nccl_comm_port = 0;
    if (val("nccl-comm-port") && (tsp__parse_int(val("nccl-comm-port"), &c->nccl_comm_port) ||
                                  c->nccl_comm_port < 1 || c->nccl_comm_port > 65535))
        run_usage_error("--nccl-comm-port must be a port number (1-65535), not '%s'",
                        val("nccl-comm-port"));
    c->nccl_check_bytes = (int)TSP_NCCL_CHECK_BYTES;
    if (val("nccl-check-bytes") &&
        (tsp__parse_int(val("nccl-check-bytes"), &c->nccl_check_bytes) || c->nccl_check_bytes < 4))
        run_usage_error("--nccl-check-bytes must be a number of bytes >= 4, not '%s'",
                        val("nccl-check-bytes"));
    c->nccl_lib = val("nccl-lib") ? val("nccl-lib") : getenv("TORCHSPARK_NCCL_LIB");
    c->nccl_ifname = getenv("NCCL_SOCKET_IFNAME");
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

char **run_config_worker(const run_config_t *c, const char **file)
{
    int nargs = c->argc - c->script_at;
    char **wargv = calloc((size_t)nargs + 6, sizeof(char *));
    if (!wargv)
        exit(1);
    int k = 0;
    if (c->no_python) {
        *file = c->script;
    } else {
        *file = find_python(c->argv[0]);
        wargv[k++] = (char *)*file;
        wargv[k++] = "-u";
        if (!c->finalize) {
            wargv[k++] = "-c";
            wargv[k++] = (char *)(c->module ? tsp__pyboot_module : tsp__pyboot_script);
        }
        if (c->module)
            wargv[k++] = "-m";
        struct stat st;
        if (!c->module && stat(c->script, &st) != 0)
            run_usage_error("the training script '%s' does not exist", c->script);
    }
    for (int i = c->script_at; i < c->argc; i++)
        wargv[k++] = c->argv[i];
    return wargv;
}

void run_config_free(run_config_t *c)
{
    free(c->redirects);
    free(c->tee);
    free(c->show);
    c->redirects = c->tee = c->show = NULL;
    if (c->standalone_port_fd >= 0)
        close(c->standalone_port_fd);
    c->standalone_port_fd = -1;
}
