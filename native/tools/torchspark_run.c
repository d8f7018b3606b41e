/* torchspark_run.c: the torchspark-run CLI, a drop-in for torchrun's static rendezvous.
 * Parses torchrun's options (dashes or underscores, unambiguous prefixes, PET_* variables),
 * derives the node from SLURM / Open MPI / PMI when run one per node by srun or mpirun,
 * and runs the agent. Usage errors exit 2 with one line naming the problem. */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "torchspark/common.h"
#include "torchspark/gpu.h"
#include "json.h"
#include "logclient.h"
#include "nccl.h"
#include "torchspark/output.h"
#include "proc.h"
#include "pyboot.h"
#include "report.h"
#include "util.h"
#include "warm.h"

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

static const char *usage_text =
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

static __attribute__((noreturn, format(printf, 1, 2))) void usage_error(const char *fmt, ...)
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
        usage_error("option '--%s' is ambiguous", norm);
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
            usage_error("unknown option '%s'", a);
        if (o->has_arg == ARG_OPTIONAL) {
            o->value = inline_val ? inline_val : "";
        } else if (o->has_arg) {
            if (!inline_val) {
                if (i + 1 >= argc)
                    usage_error("option '--%s' needs a value", o->name);
                inline_val = argv[++i];
            }
            o->value = inline_val;
        } else {
            if (inline_val)
                usage_error("option '--%s' takes no value", o->name);
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
        usage_error("--%s must be a whole number >= %d, not '%s'", name, min, v);
    return out;
}

static int gpu_count(void);

/* --gpus: Spark's addresses for this node's task; assigned against the executor's mask
 * (tsp_gpu_assign, rules R0-R8) before anything else starts; -1 when not given. */
static int assigned_gpus = -1;

typedef struct {
    tsp_logclient_t *logc;
    int sent;
    int no_events; /* the driver was not reached in time, or takes no events */
} failure_report_t;

static void send_failure(void *ctx, const tsp_failure_t *f);

/* A failure of the node before any worker ran (GPU assignment, the NCCL preflight): the
 * same failure document as a worker's (report.h), written to --error-file and, with a log
 * channel (fr), sent to the driver. rank < 0: no rank is to blame. */
static void setup_failure(const char *msg, int node_rank, int rank, int local_rank, int status,
                          failure_report_t *fr)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tsp_failure_t f = {.rank = rank,
                       .local_rank = local_rank,
                       .pid = getpid(),
                       .status = status,
                       .exitcode = status,
                       .time = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9,
                       .message = strdup(msg)};
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    if (tsp__report_document(&f, host, node_rank) == 0) {
        if (val("error-file") && tsp__report_write_file(val("error-file"), &f) != 0)
            fprintf(stderr, "torchspark-run: cannot write the error file %s\n", val("error-file"));
        if (fr && fr->logc)
            send_failure(fr, &f);
    }
    tsp__report_clear(&f);
}

static void assign_gpus(void)
{
    const char *g = val("gpus");
    if (!g)
        return;
    int node_rank = 0;
    if (val("node-rank"))
        tsp__parse_int(val("node-rank"), &node_rank);
    char task[32], err[4096] = "";
    snprintf(task, sizeof task, "%d", node_rank);
    tsp_gpu_request_t req = {.addrs = g, .mask = getenv("CUDA_VISIBLE_DEVICES"), .task = task};
    tsp_gpu_assignment_t *out = calloc(1, sizeof *out);
    if (!out)
        exit(1);
    int rc = tsp_gpu_assign(&req, out, err, sizeof err);
    if (rc) {
        if (strncmp(err, "torchspark: ", 12) == 0)
            fprintf(stderr, "%s\n", err);
        else
            fprintf(stderr, "torchspark-run: error: %s\n", err[0] ? err : tsp_strerror(rc));
        setup_failure(err, node_rank, -1, -1, 2, NULL);
        exit(2);
    }
    fputs(out->warnings, stderr);
    /* The workers' mask; integers index the host's GPUs in PCI bus order (as nvidia-smi and
     * Spark's discovery script number them), not CUDA's default fastest-first order. */
    setenv("CUDA_VISIBLE_DEVICES", out->mask, 1);
    if (out->integers)
        setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);
    assigned_gpus = out->count;
    free(out);
}

static int parse_nproc(void)
{
    const char *v = val("nproc-per-node");
    if (assigned_gpus >= 0) {
        int n = assigned_gpus;
        if (v && strcmp(v, "gpu") != 0 && strcmp(v, "auto") != 0 &&
            (tsp__parse_int(v, &n) != 0 || n != assigned_gpus))
            usage_error("--nproc-per-node %s does not match the %d GPU(s) of --gpus %s: one "
                        "worker runs per GPU (give --nproc-per-node gpu)",
                        v, assigned_gpus, val("gpus"));
        return assigned_gpus;
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
            usage_error("--nproc-per-node gpu: no CUDA device was found on this host");
        return (int)(cpus > 0 ? cpus : 1);
    }
    int n;
    if (tsp__parse_int(v, &n) != 0 || n < 1)
        usage_error("--nproc-per-node must be a number >= 1, cpu, gpu or auto, not '%s'", v);
    return n;
}

/* CUDA devices this process can use, as torch.cuda.device_count() would say. */
static int gpu_count(void)
{
    int n = 0;
    char err[256] = "";
    if (tsp_gpu_count(&n, err, sizeof err) != 0)
        fprintf(stderr, "torchspark-run: WARNING: %s\n", err);
    return n;
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
            usage_error("--nnodes must be N or MIN:MAX, not '%s'", v);
        if (lo != hi)
            usage_error("--nnodes %s: an elastic range needs a dynamic rendezvous; "
                        "torchspark-run uses the static one: give one number",
                        v);
    } else if (tsp__parse_int(v, &lo) || lo < 1) {
        usage_error("--nnodes must be a number >= 1, not '%s'", v);
    }
    t->nnodes = lo;
}

static void parse_endpoint(tsp_topo_t *t, const char *ep)
{
    /* torchrun's default rendezvous port when the endpoint has none. */
    if (tsp__endpoint_parse(ep, t->master_addr, sizeof t->master_addr, &t->master_port, 29400))
        usage_error("--rdzv-endpoint must be HOST, HOST:PORT or [IPV6]:PORT with a port in "
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
            usage_error("--%s must be 0-3 or local_rank:value,..., not '%s'", name, v);
        memset(m, all, (size_t)n);
        return m;
    }
    char *copy = strdup(v), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        int r, x;
        if (!colon)
            usage_error("--%s must be 0-3 or local_rank:value,..., not '%s'", name, v);
        *colon = 0;
        if (tsp__parse_int(tok, &r) || tsp__parse_int(colon + 1, &x) || x > 3)
            usage_error("--%s must be 0-3 or local_rank:value,..., not '%s'", name, v);
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
            usage_error("--local-ranks-filter must be local ranks like 0,2, not '%s'", v);
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
        usage_error("master port %d on %s is already in use: choose another --master-port, "
                    "or use --standalone to pick a free one",
                    port, host);
}

/* Reserves a free port on 127.0.0.1 for --standalone, held for the whole run (util.h:
 * bound with SO_REUSEADDR, never listening, close-on-exec), so that no other process's
 * connect() or bind() can take it before rank 0's TCPStore binds it. */
static int reserve_port(int *fd_out)
{
    char err[256];
    int port;
    if (tsp__port_reserve("127.0.0.1", 0, fd_out, &port, err, sizeof err) != 0) {
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

static int standalone_port_fd = -1;

static void build_topology(tsp_topo_t *t)
{
    char src[64], err[256];
    tsp_topo_init(t);
    parse_nnodes(t);
    t->nproc_per_node = parse_nproc();
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
            usage_error("%s", err);
        if (rc == 0 && val("nnodes") && launcher_nodes != t->nnodes)
            usage_error("--nnodes %d does not match %s (%d nodes)", t->nnodes, src, launcher_nodes);
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
        t->master_port = reserve_port(&standalone_port_fd);
        random_id(t->run_id, sizeof t->run_id);
        return;
    }
    if (backend && strcmp(backend, "static") != 0 && t->nnodes > 1)
        usage_error("--rdzv-backend %s is not supported: torchspark-run uses the static "
                    "rendezvous; give each node --node-rank (or run it under srun/mpirun)",
                    backend);
    if (val("master-addr"))
        snprintf(t->master_addr, sizeof t->master_addr, "%s", val("master-addr"));
    if (val("master-port") && (tsp__parse_int(val("master-port"), &t->master_port) ||
                               t->master_port < 1 || t->master_port > 65535))
        usage_error("--master-port must be a port number (1-65535), not '%s'", val("master-port"));
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
        usage_error("%s", err);
}

/* STOP from the driver (docs/protocol.md 1.7) arrives on the log client's sender thread,
 * possibly before the agent exists: whoever comes second (the callback or main, once the
 * agent is set) stops it, exactly once (a second stop would escalate to SIGKILL). */
static _Atomic(tsp_agent_t *) stop_agent;
static atomic_int stop_wanted, stop_done;

static void stop_once(void)
{
    tsp_agent_t *a = atomic_load(&stop_agent);
    if (a && atomic_load(&stop_wanted) && !atomic_exchange(&stop_done, 1))
        tsp_agent_stop(a, SIGTERM);
}

static void on_driver_stop(void *ctx, int reason, const char *text, size_t len)
{
    (void)ctx;
    char msg[1200];
    int n = snprintf(msg, sizeof msg, "torchspark-run: the driver stopped this run (%s): %.*s\n",
                     reason == TSP_WIRE_STOP_LOST     ? "a node was lost"
                     : reason == TSP_WIRE_STOP_FAILED ? "another node failed"
                                                      : "the run ended",
                     (int)(len > 1000 ? 1000 : len), text);
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
        (void)w;
    }
    atomic_store(&stop_wanted, 1);
    stop_once();
}

/* How long the agent's end waits for the driver to acknowledge the last lines: a stop
 * signal from outside (the task kill path: TorchSparkPlugin, a cancelled task's Python
 * worker, Ctrl-C) must end the agent at once, even when the driver cannot answer; what is
 * not acknowledged by then goes to the agent's own stdout/stderr with one warning
 * (docs/cli.md). A run that ended by itself or by the driver's STOP flushes for longer. */
#define TSP_RUN_FLUSH_MS 30000
#define TSP_RUN_KILL_FLUSH_MS 100

static int flush_ms(const tsp_agent_t *a)
{
    return tsp_agent_stop_signal(a) && !atomic_load(&stop_wanted) ? TSP_RUN_KILL_FLUSH_MS
                                                                  : TSP_RUN_FLUSH_MS;
}

/* Tells the driver the root cause before anything else happens on this node: the error
 * file's JSON when there is one, else what the agent knows. */
/* The agent's on_failure callback: runs on the agent's loop, once, as soon as this node's
 * run has failed for good and before its workers are stopped, so the driver can stop the
 * other nodes without waiting for this node's grace period. What is sent is the failure
 * document itself (report.h), the same text as --error-file. */
static void send_failure(void *ctx, const tsp_failure_t *f)
{
    failure_report_t *fr = ctx;
    if (!f || !f->document || fr->sent || atomic_load(&stop_wanted))
        return; /* stopped by the driver (or a signal): a consequence, not a root cause */
    fr->sent = 1;
    /* Queued, or held until the first handshake when the driver is not reached yet; the
     * client's close at the agent's end waits for it (docs/protocol.md 1.7). */
    int rc = tsp_logclient_event(fr->logc, TSP_WIRE_EVENT_FAILURE, f->rank, f->document,
                                 strlen(f->document));
    if (rc && rc != -ENOTSUP)
        fprintf(stderr, "torchspark-run: cannot report the failure to the driver: %s\n",
                tsp_strerror(rc));
}

/* The driver's log channel: --log-endpoint HOST:PORT, the run's secret from the
 * environment (64 hex digits), TORCHSPARK_LOG_STALL_TIMEOUT (seconds, 0: never) for the
 * stall rule; the client's defaults otherwise. Exits with a usage error on bad input. */
static tsp_logclient_t *start_log_client(const char *endpoint, const char *secret_hex,
                                         int node_rank, int drop)
{
    tsp_logclient_opts_t o;
    char host[256], err[512];
    tsp_logclient_opts_init(&o);
    const char *stall = getenv("TORCHSPARK_LOG_STALL_TIMEOUT");
    if (stall && *stall) {
        char *end;
        double sec = strtod(stall, &end);
        if (*end || sec < 0 || sec > 86400)
            usage_error("TORCHSPARK_LOG_STALL_TIMEOUT must be seconds (0: never), not '%s'", stall);
        o.stall_ms = sec > 0 ? (int)(sec * 1000) : -1;
    }
    if (tsp__endpoint_parse(endpoint, host, sizeof host, &o.port, -1))
        usage_error("--log-endpoint must be HOST:PORT, not '%s'", endpoint);
    if (tsp__hex_decode(secret_hex, o.secret, sizeof o.secret))
        usage_error("--log-endpoint needs the run's secret in the environment variable "
                    "TORCHSPARK_LOG_SECRET (64 hex digits)%s",
                    secret_hex ? "; the value there is not 64 hex digits" : "; it is not set");
    o.host = host;
    o.node_rank = node_rank;
    o.drop = drop;
    o.on_stop = on_driver_stop;
    o.log_prefix = "torchspark-run: ";
    tsp_logclient_t *c = tsp_logclient_start(&o, err, sizeof err);
    if (!c)
        usage_error("%s", err);
    return c;
}

/* After success, node 0 ships rank 0's output file to the driver. A failure is loud but
 * does not change the exit status: training did succeed, and the driver, which sees no
 * output arrive, can fall back to reading the file another way. */
static void ship_output(const char *endpoint, const char *secret_hex, const char *path)
{
    tsp_output_opts_t oo;
    char host[256], err[700];
    tsp_output_opts_init(&oo);
    /* Both were checked when the log client started. */
    tsp__endpoint_parse(endpoint, host, sizeof host, &oo.port, -1);
    tsp__hex_decode(secret_hex, oo.secret, sizeof oo.secret);
    oo.host = host;
    if (tsp_output_send(&oo, path, err, sizeof err) != 0)
        fprintf(stderr,
                "torchspark-run: error: training succeeded, but its output %s did not "
                "reach the driver: %s\n",
                path, err);
    else
        unlink(path); /* delivered: its absence tells the caller so (docs/cli.md) */
}

/* --nccl-check-worker: one check process, configured by the node's agent through the
 * environment (nccl.c). */
static int nccl_check_worker(void)
{
    tsp_nccl_check_opts_t o = {.lib = getenv("TORCHSPARK_NCCL_LIB"), .result_fd = 3};
    const char *v;
    o.timeout =
        (v = getenv("TORCHSPARK_NCCL_CHECK_TIMEOUT")) ? strtod(v, NULL) : TSP_NCCL_CHECK_TIMEOUT;
    o.bytes =
        (v = getenv("TORCHSPARK_NCCL_CHECK_BYTES")) ? strtoull(v, NULL, 10) : TSP_NCCL_CHECK_BYTES;
    if ((v = getenv("TORCHSPARK_NCCL_RESULT_FD")))
        tsp__parse_int(v, &o.result_fd);
    if (tsp__parse_int(getenv("RANK") ? getenv("RANK") : "", &o.rank) ||
        tsp__parse_int(getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "", &o.local_rank) ||
        tsp__parse_int(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "", &o.world_size)) {
        fprintf(stderr, "torchspark-run: --nccl-check-worker is started by the agent only\n");
        return 2;
    }
    return tsp_nccl_check_run(&o);
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
        usage_error("--nccl-check=SECONDS needs a number of seconds > 0, not '%s'", v);
    return t;
}

/* Sends an EVENT about this node to the driver (docs/protocol.md 1.7). Before the log
 * client's first handshake the client holds it and sends it after (protocol 1.7); a
 * driver that refuses events (-ENOTSUP) gets none after the first refusal. */
static void send_event(failure_report_t *fr, int kind, const char *json)
{
    if (!fr || !fr->logc || fr->no_events)
        return;
    int rc = tsp_logclient_event(fr->logc, kind, -1, json, strlen(json));
    fr->no_events = rc == -ENOTSUP;
}

/* Variables that differ between nodes by design, left out of the NODE event's env. */
static int nccl_env_per_node(const char *entry)
{
    static const char *const own[] = {
        "NCCL_SOCKET_IFNAME=", "NCCL_COMM_ID=", "NCCL_HOSTID=", "NCCL_DEBUG_FILE="};
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strncmp(entry, own[i], strlen(own[i])) == 0)
            return 1;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The NODE event: the job's size and this node's NCCL_* environment, which the driver
 * compares with rank 0's node's (one warning per node that differs). */
static void send_node_event(failure_report_t *fr, const tsp_topo_t *t)
{
    /* Only where NCCL matters: a GPU run (--gpus) or the NCCL check. */
    if (!fr->logc || (assigned_gpus < 0 && nccl_check_timeout() <= 0))
        return;
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    const char **vars = calloc(n + 1, sizeof *vars);
    char *json = NULL, *env = NULL;
    size_t jlen = 0, elen = 0;
    FILE *ef = open_memstream(&env, &elen);
    if (!vars || !ef) {
        free(vars);
        if (ef)
            fclose(ef);
        free(env);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "NCCL_", 5) == 0 && !nccl_env_per_node(environ[i]))
            vars[k++] = environ[i];
    qsort(vars, k, sizeof *vars, cmp_str);
    for (size_t i = 0; i < k; i++)
        fprintf(ef, "%s%s", i ? "\n" : "", vars[i]);
    free(vars);
    FILE *f = fclose(ef) == 0 ? open_memstream(&json, &jlen) : NULL;
    if (f) {
        tsp_json_writer_t w;
        tsp_json_writer_init(&w, f);
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "nnodes");
        tsp_json_int(&w, t->nnodes);
        tsp_json_key(&w, "nproc");
        tsp_json_int(&w, t->nproc_per_node);
        tsp_json_key(&w, "env");
        tsp_json_str(&w, env);
        tsp_json_end(&w);
        if (fclose(f) == 0 && jlen <= TSP_WIRE_MAX_EVENT)
            send_event(fr, TSP_WIRE_EVENT_NODE, json);
    }
    free(json);
    free(env);
}

static void send_check_state(failure_report_t *fr, const char *state)
{
    char json[64];
    snprintf(json, sizeof json, "{\"state\": \"%s\"}", state);
    send_event(fr, TSP_WIRE_EVENT_NCCL_CHECK, json);
}

/* The preflight before the first worker: 0 to go on; else the exit status, the root cause
 * printed, written to the error file and sent to the driver. */
static int nccl_preflight(const tsp_topo_t *t, const char *argv0, failure_report_t *fr)
{
    double timeout = nccl_check_timeout();
    if (timeout <= 0)
        return 0;
    int port = t->master_port, bytes = (int)TSP_NCCL_CHECK_BYTES;
    if (val("nccl-comm-port") &&
        (tsp__parse_int(val("nccl-comm-port"), &port) || port < 1 || port > 65535))
        usage_error("--nccl-comm-port must be a port number (1-65535), not '%s'",
                    val("nccl-comm-port"));
    if (val("nccl-check-bytes") && (tsp__parse_int(val("nccl-check-bytes"), &bytes) || bytes < 4))
        usage_error("--nccl-check-bytes must be a number of bytes >= 4, not '%s'",
                    val("nccl-check-bytes"));
    char comm_id[128], exe[PATH_MAX], msg[4096];
    int failed_rank = -1;
    snprintf(comm_id, sizeof comm_id, strchr(t->master_addr, ':') ? "[%s]:%d" : "%s:%d",
             t->master_addr, port);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        snprintf(exe, sizeof exe, "%s", argv0);
    else
        exe[n] = 0;
    tsp_nccl_preflight_opts_t o = {.exe = exe,
                                   .lib = val("nccl-lib") ? val("nccl-lib")
                                                          : getenv("TORCHSPARK_NCCL_LIB"),
                                   .comm_id = comm_id,
                                   .ifname = getenv("NCCL_SOCKET_IFNAME"),
                                   .nproc = t->nproc_per_node,
                                   .first_rank = t->node_rank * t->nproc_per_node,
                                   .world_size = t->nnodes * t->nproc_per_node,
                                   .timeout = timeout,
                                   .bytes = (size_t)bytes,
                                   .cancel = &stop_wanted,
                                   .log_fd = STDERR_FILENO,
                                   .failed_rank = &failed_rank};
    send_check_state(fr, "started");
    int rc = tsp_nccl_preflight(&o, msg, sizeof msg);
    fprintf(stderr, "%s\n", msg);
    /* Before the failure: the driver reads a timeout's root cause with it (who never
     * reported, job-wide). */
    send_check_state(fr, rc == 0                         ? "passed"
                         : rc == -ECANCELED              ? "stopped"
                         : rc == -EIO && failed_rank < 0 ? "timeout"
                                                         : "failed");
    if (rc == 0 && fr->logc) {
        /* The node's success line also goes to the driver, as a line of its first rank. */
        tsp_line_sink_t *sink = tsp_logclient_sink(fr->logc);
        tsp_line_t line = {.rank = o.first_rank,
                           .local_rank = 0,
                           .stream = TSP_STREAM_STDERR,
                           .data = msg,
                           .len = strlen(msg)};
        for (int tries = 0; tries < 100 && sink->write_line(sink->ctx, &line) == -EAGAIN; tries++)
            usleep(10000);
    }
    if (rc == 0)
        return 0;
    if (rc == -ECANCELED)
        return tsp_proc_signal_status(SIGTERM);
    setup_failure(msg, t->node_rank, failed_rank >= 0 ? failed_rank : o.first_rank,
                  failed_rank >= 0 ? failed_rank - o.first_rank : 0, 1, fr);
    return 1;
}

/* `torchspark-run --warm-exec SOCKET -- FILE ARGV0 [ARGS...]`: the warm pool's shim
 * (warm.h), one per worker, started by the agent itself with --warm-socket. Never returns. */
static __attribute__((noreturn)) void warm_exec_main(int argc, char **argv)
{
    if (argc < 6 || !argv[2][0] || strcmp(argv[3], "--") != 0) {
        fputs("torchspark-run: error: --warm-exec needs SOCKET -- FILE ARGV0 [ARGS...] (an "
              "internal mode: the agent starts it for --warm-socket)\n",
              stderr);
        exit(2);
    }
    tsp_warm_exec(argv[2], argv[4], argv + 5);
}

/* The path of this executable, for the shim under --warm-socket: the option is ignored,
 * with one warning, when it cannot be found. */
static const char *warm_socket_opt(char *self, size_t len)
{
    const char *sock = val("warm-socket");
    if (!sock)
        return NULL;
    if (!*sock)
        usage_error("--warm-socket needs the path of the warm pool's socket");
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

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--warm-exec") == 0)
        warm_exec_main(argc, argv); /* before anything else: it is one worker, not an agent */
    pid_t ppid = getppid();
    int script_at = parse_cli(argc, argv);
    if (flag("nccl-check-worker"))
        return nccl_check_worker();
    if (flag("help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (flag("version")) {
        printf("torchspark-run %s\n", tsp_version());
        return 0;
    }
    if (script_at >= argc)
        usage_error("the training script is missing");
    const char *script = argv[script_at];
    int module = flag("module"), no_python = flag("no-python");
    if (module && no_python)
        usage_error("-m and --no-python cannot be used together");

    assign_gpus();
    tsp_topo_t topo;
    build_topology(&topo);
    if (topo.node_rank == 0 && standalone_port_fd < 0)
        check_port_free(topo.master_addr, topo.master_port);

    const char *parent = getenv("TORCHSPARK_PARENT_PID");
    int expected = 0;
    if (parent && tsp__parse_int(parent, &expected) == 0 && expected != (int)ppid)
        return tsp_proc_signal_status(SIGTERM); /* the parent that started us is already gone */
    /* From here on the agent must notice its parent dying. */
    int rc = tsp_agent_setup_process(SIGTERM, ppid);
    if (rc == -ESRCH)
        return tsp_proc_signal_status(SIGTERM);
    if (rc) {
        fprintf(stderr, "torchspark-run: cannot set up process supervision: %s\n",
                tsp_strerror(rc));
        return 1;
    }
    /* The worker command line: python -u -c BOOT [-m] script args... (pyboot.c: ends
     * without interpreter finalization), python -u [-m] script args... when
     * TORCHSPARK_PYTHON_EXIT=finalize, or the program itself. */
    const char *exit_mode = getenv("TORCHSPARK_PYTHON_EXIT");
    int finalize = exit_mode && strcmp(exit_mode, "finalize") == 0;
    if (exit_mode && *exit_mode && !finalize && strcmp(exit_mode, "fast") != 0)
        usage_error("TORCHSPARK_PYTHON_EXIT must be 'fast' (the default) or 'finalize', not '%s'",
                    exit_mode);
    int nargs = argc - script_at;
    char **wargv = calloc((size_t)nargs + 6, sizeof(char *));
    if (!wargv)
        return 1;
    const char *file;
    int k = 0;
    if (no_python) {
        file = script;
    } else {
        file = find_python(argv[0]);
        wargv[k++] = (char *)file;
        wargv[k++] = "-u";
        if (!finalize) {
            wargv[k++] = "-c";
            wargv[k++] = (char *)(module ? tsp__pyboot_module : tsp__pyboot_script);
        }
        if (module)
            wargv[k++] = "-m";
        struct stat st;
        if (!module && stat(script, &st) != 0)
            usage_error("the training script '%s' does not exist", script);
    }
    for (int i = script_at; i < argc; i++)
        wargv[k++] = argv[i];

    double grace = 30;
    const char *gv = val("shutdown-timeout") ? val("shutdown-timeout")
                                             : getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    if (gv) {
        char *end;
        grace = strtod(gv, &end);
        if (!*gv || *end || grace < 0)
            usage_error("--shutdown-timeout must be a number of seconds >= 0, not '%s'", gv);
    }
    if (tsp_topo_sets_omp(&topo, environ))
        fprintf(stderr, "torchspark-run: WARNING: *****************************************\n"
                        "Setting OMP_NUM_THREADS environment variable for each process to be 1 "
                        "in default, to avoid your system being overloaded, please further tune "
                        "the variable for optimal performance in your application as needed.\n"
                        "*****************************************\n");

    tsp_agent_opts_t o = {
        .topo = topo,
        .file = file,
        .argv = wargv,
        .name = script,
        .log_dir = val("log-dir"),
        .shutdown_timeout = grace,
        .error_file = val("error-file"),
        .redirects = parse_std("redirects", topo.nproc_per_node),
        .tee = parse_std("tee", topo.nproc_per_node),
        .show = parse_filter(topo.nproc_per_node),
        .console_out = STDOUT_FILENO,
        .console_err = STDERR_FILENO,
        .log_fd = STDERR_FILENO,
        .log_prefix = "torchspark-run: ",
        .prefix_template = val("log-line-prefix-template")
                               ? val("log-line-prefix-template")
                               : getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
    };
    char self_exe[PATH_MAX];
    o.warm_socket = warm_socket_opt(self_exe, sizeof self_exe);
    o.warm_shim = o.warm_socket ? self_exe : NULL;
    char err[512] = "";
    /* The driver's log channel: the secret comes from the environment only, and is taken
     * out of it so that the workers never see it. */
    tsp_logclient_t *logc = NULL;
    failure_report_t fr = {0};
    char secret_hex[80] = "";
    const char *sv = getenv("TORCHSPARK_LOG_SECRET");
    if (sv)
        snprintf(secret_hex, sizeof secret_hex, "%s", sv);
    unsetenv("TORCHSPARK_LOG_SECRET");
    if (val("log-endpoint")) {
        logc = start_log_client(val("log-endpoint"), sv ? secret_hex : NULL, topo.node_rank,
                                flag("log-drop"));
        o.sink = tsp_logclient_sink(logc);
        fr.logc = logc;
        o.on_failure = send_failure;
        o.on_failure_ctx = &fr;
    } else if (val("output-file")) {
        usage_error("--output-file needs --log-endpoint (the driver to ship it to)");
    }
    send_node_event(&fr, &topo);
    rc = nccl_preflight(&topo, argv[0], &fr);
    if (rc) {
        if (logc)
            tsp_logclient_close(logc, 30000);
        free((void *)o.redirects);
        free((void *)o.tee);
        free((void *)o.show);
        free(wargv);
        return rc;
    }
    tsp_agent_t *agent;
    rc = tsp_agent_init(&agent, &o, err, sizeof err);
    if (rc) {
        fprintf(stderr, "torchspark-run: error: %s\n", err[0] ? err : tsp_strerror(rc));
        return rc == -EINVAL ? 2 : 1;
    }
    atomic_store(&stop_agent, agent);
    stop_once(); /* a STOP that came before the agent existed */
    int status = tsp_agent_run(agent);
    if (standalone_port_fd >= 0)
        close(standalone_port_fd);
    if (logc) {          /* flush what the workers printed last; falls back to our stdout/stderr */
        if (status != 0) /* sent already when the failure was seen; a no-op then */
            send_failure(&fr, tsp_agent_root_cause(agent));
        tsp_logclient_close(logc, flush_ms(agent)); /* no STOP callback runs after this */
    }
    atomic_store(&stop_agent, NULL);
    tsp_agent_close(agent);
    if (status == 0 && val("output-file") && topo.node_rank == 0)
        ship_output(val("log-endpoint"), secret_hex, val("output-file"));
    free((void *)o.redirects);
    free((void *)o.tee);
    free((void *)o.show);
    free(wargv);
    if (status < 0) {
        fprintf(stderr, "torchspark-run: supervision failed: %s\n", tsp_strerror(status));
        return 1;
    }
    return status;
}
