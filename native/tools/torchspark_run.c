/* torchspark_run.c: the torchspark-run CLI, a drop-in for torchrun's static rendezvous.
 * run_config.c reads what this invocation is asked to do (options, PET_* variables, the
 * environment) into one run_config_t; this file runs it: the process's supervision, the
 * driver's log channel (failures, node events, STOP), the NCCL preflight, the agent, and
 * rank 0's output after success. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "json.h"
#include "logclient.h"
#include "nccl.h"
#include "proc.h"
#include "report.h"
#include "run_config.h"
#include "torchspark/common.h"
#include "torchspark/output.h"
#include "util.h"
#include "warm.h"

extern char **environ;

static run_config_t cfg;

typedef struct {
    tsp_logclient_t *logc;
    int sent;
    int no_events; /* the driver was not reached in time, or takes no events */
} failure_report_t;

static void send_failure(void *ctx, const tsp_failure_t *f);

/* A failure of the node before any worker ran (GPU assignment, the NCCL preflight): the
 * same failure document as a worker's (report.h), written to --error-file and, with a log
 * channel (fr), sent to the driver. rank < 0: no rank is to blame. */
static void setup_failure(const char *msg, const char *reason, int node_rank, int rank,
                          int local_rank, int status, failure_report_t *fr)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tsp_failure_t f = {.rank = rank,
                       .local_rank = local_rank,
                       .pid = getpid(),
                       .status = status,
                       .exitcode = status,
                       .time = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9,
                       .message = strdup(msg),
                       .reason = reason};
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    if (tsp__report_document(&f, host, node_rank) == 0) {
        if (cfg.error_file && tsp__report_write_file(cfg.error_file, &f) != 0)
            fprintf(stderr, "torchspark-run: cannot write the error file %s\n", cfg.error_file);
        if (fr && fr->logc)
            send_failure(fr, &f);
    }
    tsp__report_clear(&f);
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

/* DUMP from the driver (docs/protocol.md 1.9): for the agent's workers; none yet, none to
 * dump. */
static void on_driver_dump(void *ctx, unsigned request)
{
    (void)ctx;
    tsp_agent_t *a = atomic_load(&stop_agent);
    if (a)
        tsp_agent_dump(a, request);
}

/* CHECKPOINT from the driver (docs/protocol.md 1.13): the run grows back. */
static void on_driver_checkpoint(void *ctx, int why)
{
    (void)ctx;
    tsp_agent_t *a = atomic_load(&stop_agent);
    if (a)
        tsp_agent_checkpoint(a, why);
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

/* The executor JVM the agent runs under: its first ancestor named "java" (Spark's executor,
 * whose Python worker started the agent), found once at start, and its start time (0: no
 * such ancestor: the CLI on its own). */
static pid_t executor_pid;
static unsigned long long executor_start;

static void find_executor(void)
{
    pid_t pid = getppid();
    for (int depth = 0; depth < 8 && pid > 1; depth++) {
        tsp_proc_stat_t st;
        if (tsp_proc_stat(pid, &st))
            return;
        if (strcmp(st.comm, "java") == 0) {
            executor_pid = pid;
            executor_start = st.start;
            return;
        }
        pid = st.ppid;
    }
}

/* The executor JVM found at start has exited or is exiting: gone, a zombie, its pid reused,
 * or PF_EXITING (0x4) in its flags. Its pipe to the Python daemon, whose end stops the
 * agent, closes in its last thread's exit; its main thread may not be a zombie yet then,
 * but it is exiting. */
static int executor_gone(void)
{
    tsp_proc_stat_t st;
    if (!executor_pid)
        return 0;
    return tsp_proc_stat(executor_pid, &st) || st.state == 'Z' || st.state == 'X' ||
           (st.flags & 0x4u) || st.start != executor_start;
}

/* The agent's on_stop_signal callback: a stop (a signal, or the driver's STOP when it came
 * first) while the executor JVM the agent ran under is gone (SIGKILLed, OOM-killed: its
 * Python worker ends, and the agent gets SIGTERM as its parent dies). The driver is told at
 * once, before the workers stop (EVENT EXECUTOR_GONE, docs/protocol.md 1.7): the other
 * nodes' errors that follow are its consequences. A task killed by Spark or stopped by the
 * driver on a live executor is not told. */
static void send_signal_event(void *ctx, int sig)
{
    failure_report_t *fr = ctx;
    if (!executor_gone())
        return;
    char json[64];
    int n = snprintf(json, sizeof json, "{\"signal\": %d}", sig);
    int rc = tsp_logclient_event(fr->logc, TSP_WIRE_EVENT_EXECUTOR_GONE, -1, json, (size_t)n);
    if (rc && rc != -ENOTSUP)
        fprintf(stderr, "torchspark-run: cannot tell the driver that the executor is gone: %s\n",
                tsp_strerror(rc));
}

/* The driver's log channel: --log-endpoint HOST:PORT, the run's secret from the
 * environment (64 hex digits), TORCHSPARK_LOG_STALL_TIMEOUT (seconds, 0: never) for the
 * stall rule; the client's defaults otherwise. Exits with a usage error on bad input. */
static tsp_logclient_t *start_log_client(const run_config_t *c)
{
    tsp_logclient_opts_t o;
    char host[256], err[512];
    tsp_logclient_opts_init(&o);
    if (c->stall_timeout >= 0)
        o.stall_ms = c->stall_timeout > 0 ? (int)(c->stall_timeout * 1000) : -1;
    if (tsp__endpoint_parse(c->log_endpoint, host, sizeof host, &o.port, -1))
        run_usage_error("--log-endpoint must be HOST:PORT, not '%s'", c->log_endpoint);
    if (tsp__hex_decode(c->has_secret ? c->secret_hex : NULL, o.secret, sizeof o.secret))
        run_usage_error("--log-endpoint needs the run's secret in the environment variable "
                        "TORCHSPARK_LOG_SECRET (64 hex digits)%s",
                        c->has_secret ? "; the value there is not 64 hex digits"
                                      : "; it is not set");
    o.host = host;
    o.node_rank = c->topo.node_rank;
    o.drop = c->log_drop;
    o.report_world = tsp_topo_world_size(&c->topo); /* reports folded above the rank's share */
    o.on_stop = on_driver_stop;
    o.on_dump = on_driver_dump;
    o.on_checkpoint = on_driver_checkpoint;
    o.log_prefix = "torchspark-run: ";
    tsp_logclient_t *logc = tsp_logclient_start(&o, err, sizeof err);
    if (!logc)
        run_usage_error("%s", err);
    return logc;
}

/* PATH.status, where the outcome of shipping PATH is written: -ENAMETOOLONG if it does not fit. */
static int output_status_path(char *dst, size_t n, const char *path)
{
    return snprintf(dst, n, "%s.status", path) >= (int)n ? -ENAMETOOLONG : 0;
}

/* Writes PATH.status (docs/cli.md --output-file): {"output": "delivered"|"failed"|"refused",
 * "bytes": N, "sha256": "<hex>"|null, "error": "..."|null}, atomically (a temporary file, then
 * rename), so that a caller reads the outcome, never half a document. */
static void write_output_status(const char *path, const char *outcome, long long bytes,
                                const char *sha256, const char *error)
{
    char dst[PATH_MAX], tmp[PATH_MAX + 32];
    if (output_status_path(dst, sizeof dst, path) ||
        snprintf(tmp, sizeof tmp, "%s.tmp%d", dst, (int)getpid()) >= (int)sizeof tmp) {
        fprintf(stderr, "torchspark-run: error: the output status path %s.status is too long\n",
                path);
        return;
    }
    FILE *f = fopen(tmp, "we");
    if (f) {
        tsp_json_writer_t w;
        tsp_json_writer_init(&w, f);
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "output");
        tsp_json_str(&w, outcome);
        tsp_json_key(&w, "bytes");
        tsp_json_int(&w, bytes);
        tsp_json_key(&w, "sha256");
        tsp_json_str(&w, sha256);
        tsp_json_key(&w, "error");
        tsp_json_str(&w, error);
        tsp_json_end(&w);
        fputc('\n', f);
    }
    if (!f || fclose(f) != 0 || rename(tmp, dst) != 0) {
        fprintf(stderr, "torchspark-run: error: cannot write the output status %s: %s\n", dst,
                strerror(errno));
        unlink(tmp);
    }
}

/* After success, node 0 ships rank 0's output file to the driver and states the outcome in
 * PATH.status. A failure is loud but does not change the exit status: training did succeed,
 * and the caller, whose status says "failed", sends the file another way (collect()); one
 * the driver refused for its size ("refused": over spark.driver.maxResultSize) goes no
 * other way, the driver raises its own sentence. */
static void ship_output(const char *endpoint, const char *secret_hex, const char *path)
{
    tsp_output_opts_t oo;
    char host[256], err[700], hex[2 * 32 + 1];
    uint8_t digest[32];
    struct stat st;
    long long bytes = stat(path, &st) == 0 ? (long long)st.st_size : -1;
    tsp_output_opts_init(&oo);
    /* Both were checked when the log client started. */
    tsp__endpoint_parse(endpoint, host, sizeof host, &oo.port, -1);
    tsp__hex_decode(secret_hex, oo.secret, sizeof oo.secret);
    oo.host = host;
    oo.digest_out = digest;
    int rc = tsp_output_send(&oo, path, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr,
                "torchspark-run: error: training succeeded, but its output %s did not "
                "reach the driver: %s\n",
                path, err);
        write_output_status(path, rc == -EFBIG ? "refused" : "failed", bytes, NULL, err);
    } else {
        tsp__hex_encode(digest, sizeof digest, hex);
        write_output_status(path, "delivered", bytes, hex, NULL);
        unlink(path); /* delivered, as PATH.status says: the driver holds it now */
    }
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
    if (!fr->logc || (cfg.assigned_gpus < 0 && cfg.nccl_check <= 0))
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
    double timeout = cfg.nccl_check;
    if (timeout <= 0)
        return 0;
    int port = cfg.nccl_comm_port ? cfg.nccl_comm_port : t->master_port;
    int bytes = cfg.nccl_check_bytes;
    char comm_id[128], exe[PATH_MAX], msg[4096];
    int failed_rank = -1;
    /* A stop signal from outside (the task kill path) ends the check at once: the agent
     * that would take it from the blocked set does not exist yet. */
    sigset_t stops;
    sigemptyset(&stops);
    const int stop_sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof stop_sigs / sizeof stop_sigs[0]; i++)
        sigaddset(&stops, stop_sigs[i]);
    snprintf(comm_id, sizeof comm_id, strchr(t->master_addr, ':') ? "[%s]:%d" : "%s:%d",
             t->master_addr, port);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        snprintf(exe, sizeof exe, "%s", argv0);
    else
        exe[n] = 0;
    tsp_nccl_preflight_opts_t o = {.exe = exe,
                                   .lib = cfg.nccl_lib,
                                   .comm_id = comm_id,
                                   .ifname = cfg.nccl_ifname,
                                   .nproc = t->nproc_per_node,
                                   .first_rank = t->node_rank * t->nproc_per_node,
                                   .world_size = t->nnodes * t->nproc_per_node,
                                   .timeout = timeout,
                                   .bytes = (size_t)bytes,
                                   .cancel = &stop_wanted,
                                   .stop_signals = &stops,
                                   .log_fd = STDERR_FILENO,
                                   .failed_rank = &failed_rank};
    send_check_state(fr, "started");
    int rc = tsp_nccl_preflight(&o, msg, sizeof msg);
    fprintf(stderr, "%s\n", msg);
    /* Before the failure: the driver reads a timeout's root cause with it (who never
     * reported, job-wide). */
    send_check_state(fr, rc == 0                         ? "passed"
                         : rc == -ENODEV                 ? "skipped"
                         : rc == -ECANCELED              ? "stopped"
                         : rc == -EIO && failed_rank < 0 ? "timeout"
                                                         : "failed");
    if ((rc == 0 || rc == -ENODEV) && fr->logc) {
        /* The node's success line (or its one warning that no driver is there, and the
         * check was skipped) also goes to the driver, as a line of its first rank. */
        tsp_line_sink_t *sink = tsp_logclient_sink(fr->logc);
        tsp_line_t line = {.rank = o.first_rank,
                           .local_rank = 0,
                           .stream = TSP_STREAM_STDERR,
                           .data = msg,
                           .len = strlen(msg)};
        for (int tries = 0; tries < 100 && sink->write_line(sink->ctx, &line) == -EAGAIN; tries++)
            usleep(10000);
    }
    if (rc == 0 || rc == -ENODEV)
        return 0;
    if (rc == -ECANCELED) {
        sigset_t pending;
        int sig = SIGTERM; /* the driver's STOP, or the pending signal's own status */
        if (!atomic_load(&stop_wanted) && sigpending(&pending) == 0)
            for (size_t i = 0; i < sizeof stop_sigs / sizeof stop_sigs[0]; i++)
                if (sigismember(&pending, stop_sigs[i]) == 1) {
                    sig = stop_sigs[i];
                    break;
                }
        return tsp_proc_signal_status(sig);
    }
    setup_failure(msg, "nccl_check", t->node_rank, failed_rank >= 0 ? failed_rank : o.first_rank,
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

/* The node's run after the process is set up: the log channel, the node event, the NCCL
 * preflight, the agent, then rank 0's output. The exit status. */
static int run_node(const char *argv0)
{
    const char *file;
    char **wargv = run_config_worker(&cfg, &file);
    const tsp_topo_t *topo = &cfg.topo;
    if (tsp_topo_sets_omp(topo, environ))
        fprintf(stderr, "torchspark-run: WARNING: *****************************************\n"
                        "Setting OMP_NUM_THREADS environment variable for each process to be 1 "
                        "in default, to avoid your system being overloaded, please further tune "
                        "the variable for optimal performance in your application as needed.\n"
                        "*****************************************\n");
    tsp_agent_opts_t o = {
        .topo = *topo,
        .file = file,
        .argv = wargv,
        .name = cfg.script,
        .log_dir = cfg.log_dir,
        .tmp_dir = cfg.tmp_dir,
        .checkpoint_request = cfg.checkpoint_request,
        .shutdown_timeout = cfg.grace,
        .error_file = cfg.error_file,
        .redirects = cfg.redirects,
        .tee = cfg.tee,
        .show = cfg.show,
        .console_out = STDOUT_FILENO,
        .console_err = STDERR_FILENO,
        .log_fd = STDERR_FILENO,
        .log_prefix = "torchspark-run: ",
        .prefix_template = cfg.prefix_template,
        .warm_socket = cfg.warm_socket,
        .warm_shim = cfg.warm_socket ? cfg.self_exe : NULL,
    };
    failure_report_t fr = {0};
    if (cfg.log_endpoint) {
        fr.logc = start_log_client(&cfg);
        o.sink = tsp_logclient_sink(fr.logc);
        o.on_failure = send_failure;
        o.on_failure_ctx = &fr;
        o.on_stop_signal = send_signal_event;
        o.on_stop_signal_ctx = &fr;
    }
    send_node_event(&fr, topo);
    int rc = nccl_preflight(topo, argv0, &fr);
    if (rc) {
        if (fr.logc)
            tsp_logclient_close(fr.logc, 30000);
        free(wargv);
        return rc;
    }
    tsp_agent_t *agent;
    char err[512] = "";
    rc = tsp_agent_init(&agent, &o, err, sizeof err);
    if (rc) {
        fprintf(stderr, "torchspark-run: error: %s\n", err[0] ? err : tsp_strerror(rc));
        free(wargv);
        return rc == -EINVAL ? 2 : 1;
    }
    char stale[PATH_MAX]; /* an earlier run's outcome must not stand for this one's */
    if (cfg.output_file && topo->node_rank == 0 &&
        output_status_path(stale, sizeof stale, cfg.output_file) == 0)
        unlink(stale);
    atomic_store(&stop_agent, agent);
    stop_once(); /* a STOP that came before the agent existed */
    int status = tsp_agent_run(agent);
    if (fr.logc) {       /* flush what the workers printed last; falls back to our stdout/stderr */
        if (status != 0) /* sent already when the failure was seen; a no-op then */
            send_failure(&fr, tsp_agent_root_cause(agent));
        tsp_logclient_close(fr.logc, flush_ms(agent)); /* no STOP callback runs after this */
    }
    atomic_store(&stop_agent, NULL);
    tsp_agent_close(agent);
    if (status == 0 && cfg.output_file && topo->node_rank == 0)
        ship_output(cfg.log_endpoint, cfg.secret_hex, cfg.output_file);
    free(wargv);
    if (status < 0) {
        fprintf(stderr, "torchspark-run: supervision failed: %s\n", tsp_strerror(status));
        return 1;
    }
    return status;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--warm-exec") == 0)
        warm_exec_main(argc, argv); /* before anything else: it is one worker, not an agent */
    /* Before anything can start a thread: every later thread inherits this mask, and one
     * that did not block SIGCHLD could take a worker's exit away from the agent. */
    if (tsp_agent_block_signals() != 0) {
        fprintf(stderr, "torchspark-run: cannot block signals: %s\n", strerror(errno));
        return 1;
    }
    pid_t ppid = getppid();
    run_config_parse(&cfg, argc, argv);
    if (cfg.nccl_check_worker)
        return tsp_nccl_check_worker();
    if (cfg.help || cfg.version) {
        if (cfg.help)
            fputs(run_usage_text, stdout);
        else
            printf("torchspark-run %s\n", tsp_version());
        return 0;
    }
    char err[4096];
    if (run_config_node(&cfg, err, sizeof err)) {
        if (strncmp(err, "torchspark: ", 12) == 0)
            fprintf(stderr, "%s\n", err);
        else
            fprintf(stderr, "torchspark-run: error: %s\n", err);
        setup_failure(err, "setup", cfg.topo.node_rank, -1, -1, 2, NULL);
        return 2;
    }
    if (cfg.expected_parent && cfg.expected_parent != ppid)
        return tsp_proc_signal_status(SIGTERM); /* the parent that started us is already gone */
    find_executor();
    /* From here on the agent must notice its parent dying. */
    int rc = tsp_agent_setup_process(SIGTERM, ppid);
    if (rc == -ESRCH)
        return tsp_proc_signal_status(SIGTERM);
    if (rc) {
        fprintf(stderr, "torchspark-run: cannot set up process supervision: %s\n",
                tsp_strerror(rc));
        return 1;
    }
    int status = run_node(argv[0]);
    run_config_free(&cfg);
    return status;
}
