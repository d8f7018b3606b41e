/* run_config.c: one torchspark-run invocation's configuration, read once (run_config.h):
 * torchrun's options (dashes or underscores, unambiguous prefixes, PET_* variables), the
 * node from SLURM / Open MPI / PMI when run one per node by srun or mpirun, and every
 * environment variable the CLI takes as configuration. Usage errors exit 2 with one line
 * naming the problem. The node's part (run_config_node: GPUs, topology, the port check, the
 * output masks) is in run_node.c. */
#include "run_config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nccl.h"
#include "pyboot.h"
#include "run_config_int.h"
#include "util.h"

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

const char *tsp__runcfg_val(const char *name)
{
    return opt(name)->value;
}

int tsp__runcfg_flag(const char *name)
{
    const char *v = tsp__runcfg_val(name);
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

int tsp__runcfg_int(const char *name, int dflt, int min)
{
    const char *v = tsp__runcfg_val(name);
    if (!v)
        return dflt;
    int out;
    if (tsp__parse_int(v, &out) != 0 || out < min)
        run_usage_error("--%s must be a whole number >= %d, not '%s'", name, min, v);
    return out;
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
    if (tsp__runcfg_val("python"))
        return tsp__runcfg_val("python");
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

/* --nccl-check[=SECONDS] (or TORCHSPARK_NCCL_CHECK=1): the deadline, 0 when off. */
static double nccl_check_timeout(void)
{
    const char *v = tsp__runcfg_val("nccl-check");
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
    const char *sock = tsp__runcfg_val("warm-socket");
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
    c->nccl_check_worker = tsp__runcfg_flag("nccl-check-worker");
    c->help = tsp__runcfg_flag("help");
    c->version = tsp__runcfg_flag("version");
    if (c->nccl_check_worker || c->help || c->version)
        return;
    if (c->script_at >= argc)
        run_usage_error("the training script is missing");
    c->script = argv[c->script_at];
    c->module = tsp__runcfg_flag("module");
    c->no_python = tsp__runcfg_flag("no-python");
    if (c->module && c->no_python)
        run_usage_error("-m and --no-python cannot be used together");
    c->python = tsp__runcfg_val("python");
    c->gpus = tsp__runcfg_val("gpus");
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
    c->grace =
        seconds(tsp__runcfg_val("shutdown-timeout") ? tsp__runcfg_val("shutdown-timeout")
                                                    : getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
                "--shutdown-timeout", 30);
    c->log_dir = tsp__runcfg_val("log-dir");
    c->tmp_dir = getenv("TMPDIR");
    c->checkpoint_request = getenv("TORCHSPARK_CHECKPOINT_REQUEST");
    c->error_file = tsp__runcfg_val("error-file");
    c->prefix_template = tsp__runcfg_val("log-line-prefix-template")
                             ? tsp__runcfg_val("log-line-prefix-template")
                             : getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    c->warm_socket = warm_socket_opt(c->self_exe, sizeof c->self_exe);
    take_secret(c);
    c->log_endpoint = tsp__runcfg_val("log-endpoint");
    c->log_drop = tsp__runcfg_flag("log-drop");
    c->output_file = tsp__runcfg_val("output-file");
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
    if (tsp__runcfg_val("nccl-comm-port") &&
        (tsp__parse_int(tsp__runcfg_val("nccl-comm-port"), &c->nccl_comm_port) ||
         c->nccl_comm_port < 1 || c->nccl_comm_port > 65535))
        run_usage_error("--nccl-comm-port must be a port number (1-65535), not '%s'",
                        tsp__runcfg_val("nccl-comm-port"));
    c->nccl_check_bytes = (int)TSP_NCCL_CHECK_BYTES;
    if (tsp__runcfg_val("nccl-check-bytes") &&
        (tsp__parse_int(tsp__runcfg_val("nccl-check-bytes"), &c->nccl_check_bytes) ||
         c->nccl_check_bytes < 4))
        run_usage_error("--nccl-check-bytes must be a number of bytes >= 4, not '%s'",
                        tsp__runcfg_val("nccl-check-bytes"));
    c->nccl_lib =
        tsp__runcfg_val("nccl-lib") ? tsp__runcfg_val("nccl-lib") : getenv("TORCHSPARK_NCCL_LIB");
    c->nccl_ifname = getenv("NCCL_SOCKET_IFNAME");
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
