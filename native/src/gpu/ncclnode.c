/* ncclnode.c: the node's side of the NCCL preflight check (docs/gpu.md section 3), split
 * from nccl.c, which holds the check worker. It execs one worker per local GPU through
 * proc.c (torchspark-run --nccl-check-worker, configured through the environment it writes),
 * relays their output, supervises them with a hard kill at deadline + 5 s and turns their
 * result lines into one message for the node. */
#include "nccl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"
#include "json.h"
#include "proc.h"

extern char **environ;

typedef struct {
    pid_t pid;
    int res_fd, err_fd, exited;
    char res[8192];
    size_t res_len;
    char line[4096];
    size_t line_len;
} child_t;

static char **child_env(const tsp_nccl_preflight_opts_t *o, int local, int result_fd)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 12, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    static const char *const ours[] = {"RANK=",
                                       "LOCAL_RANK=",
                                       "WORLD_SIZE=",
                                       "NCCL_COMM_ID=",
                                       "TORCHSPARK_NCCL_RESULT_FD=",
                                       "TORCHSPARK_NCCL_CHECK_TIMEOUT=",
                                       "TORCHSPARK_NCCL_CHECK_BYTES=",
                                       "TORCHSPARK_NCCL_LIB=",
                                       NULL};
    int has_debug = 0;
    for (size_t i = 0; i < n; i++) {
        int skip = 0;
        for (int j = 0; ours[j] && !skip; j++)
            skip = strncmp(environ[i], ours[j], strlen(ours[j])) == 0;
        has_debug |= strncmp(environ[i], "NCCL_DEBUG=", 11) == 0;
        if (!skip)
            env[k++] = strdup(environ[i]);
    }
    char buf[1024];
#define PUT(...) (snprintf(buf, sizeof buf, __VA_ARGS__), env[k++] = strdup(buf))
    PUT("RANK=%d", o->first_rank + local);
    PUT("LOCAL_RANK=%d", local);
    PUT("WORLD_SIZE=%d", o->world_size);
    PUT("NCCL_COMM_ID=%s", o->comm_id);
    PUT("TORCHSPARK_NCCL_RESULT_FD=%d", result_fd);
    PUT("TORCHSPARK_NCCL_CHECK_TIMEOUT=%.3f", o->timeout);
    PUT("TORCHSPARK_NCCL_CHECK_BYTES=%zu", o->bytes);
    if (o->lib && *o->lib)
        PUT("TORCHSPARK_NCCL_LIB=%s", o->lib);
    if (!has_debug) /* NCCL prints its WARN lines only then; they name the cause */
        PUT("NCCL_DEBUG=WARN");
#undef PUT
    env[k] = NULL;
    return env;
}

static void free_env(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

static void drain_err(child_t *c, int rank, int log_fd, int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < c->line_len; i++) {
        if (c->line[i] != '\n')
            continue;
        dprintf(log_fd, "[nccl-check rank %d]: %.*s\n", rank, (int)(i - start), c->line + start);
        start = i + 1;
    }
    memmove(c->line, c->line + start, c->line_len - start);
    c->line_len -= start;
    if (c->line_len == sizeof c->line || (flush && c->line_len)) {
        dprintf(log_fd, "[nccl-check rank %d]: %.*s\n", rank, (int)c->line_len, c->line);
        c->line_len = 0;
    }
}

static char *jget(const char *doc, size_t len, const char *key)
{
    char *out = NULL;
    int type;
    if (tsp_json_get(doc, len, key, &out, &type) != 0)
        return NULL;
    return out;
}

static int jint(const char *doc, size_t len, const char *key)
{
    char *v = jget(doc, len, key);
    int x = v ? atoi(v) : 0;
    free(v);
    return x;
}

static double jdbl(const char *doc, size_t len, const char *key)
{
    char *v = jget(doc, len, key);
    double x = v ? strtod(v, NULL) : 0;
    free(v);
    return x;
}

/* The preflight's state: one child per local rank, the deadline, what was seen. */
typedef struct {
    const tsp_nccl_preflight_opts_t *o;
    child_t *ch;
    char host[256];
    double t0, kill_at;
    int cancelled, started, failed;
} preflight_t;

/* Starts one check worker per local rank through proc.c: stdin /dev/null, stdout and
 * stderr into one pipe (its lines are relayed with a prefix), the result pipe as fd 3,
 * and SIGKILL when the agent dies (a check process never outlives its agent, SIGKILLed
 * agent included). Stops at the first that cannot start. */
static void spawn_checks(preflight_t *p)
{
    const tsp_nccl_preflight_opts_t *o = p->o;
    for (int i = 0; i < o->nproc; i++) {
        int rp[2], ep[2];
        if (pipe2(rp, O_CLOEXEC) != 0)
            return;
        if (pipe2(ep, O_CLOEXEC) != 0) {
            close(rp[0]);
            close(rp[1]);
            return;
        }
        char **env = child_env(o, i, 3);
        char *argv[] = {(char *)o->exe, "--nccl-check-worker", NULL};
        tsp_proc_opts_t po = {.file = o->exe,
                              .argv = argv,
                              .envp = env,
                              .stdin_mode = TSP_PROC_NULL,
                              .stdout_mode = TSP_PROC_FD,
                              .stdout_fd = ep[1],
                              .stderr_mode = TSP_PROC_FD,
                              .stderr_fd = ep[1],
                              .pdeathsig = SIGKILL,
                              .fd3 = rp[1]};
        tsp_proc_t proc;
        int rc = env ? tsp_proc_spawn(&proc, &po, NULL, 0) : -ENOMEM;
        free_env(env);
        close(rp[1]);
        close(ep[1]);
        if (rc != 0) {
            close(rp[0]);
            close(ep[0]);
            return;
        }
        p->ch[i].res_fd = rp[0];
        p->ch[i].err_fd = ep[0];
        p->ch[i].pid = proc.pid;
        p->started++;
    }
}

/* Reads what fd j of child c has: its result (JSON) or its output lines. */
static void read_child(preflight_t *p, child_t *c, int rank, int is_err)
{
    int *fd = is_err ? &c->err_fd : &c->res_fd;
    char tmp[4096];
    char *dst = is_err ? c->line + c->line_len : c->res + c->res_len;
    size_t room = is_err ? sizeof c->line - c->line_len : sizeof c->res - 1 - c->res_len;
    ssize_t k = read(*fd, room ? dst : tmp, room ? room : sizeof tmp);
    if (k < 0 && errno == EINTR)
        return;
    if (k <= 0) {
        close(*fd);
        *fd = -1;
        if (is_err)
            drain_err(c, rank, p->o->log_fd, 1);
        return;
    }
    if (!room)
        return;
    if (is_err) {
        c->line_len += (size_t)k;
        drain_err(c, rank, p->o->log_fd, 0);
    } else {
        c->res_len += (size_t)k;
        c->res[c->res_len] = 0;
    }
}

/* A real failure on one rank ends the others at once: they would only wait for it until
 * the deadline (the peers on other nodes are stopped by the driver). A short grace lets
 * the others' results in: a failure caused by a peer's abort at its deadline ("peer
 * closed") must not hide that peer's timeout. Past the deadline or when cancelled, every
 * child still running is killed. */
static void enforce_deadline(preflight_t *p)
{
    const tsp_nccl_preflight_opts_t *o = p->o;
    if (!p->cancelled && o->cancel && atomic_load(o->cancel))
        p->cancelled = 1;
    sigset_t pending;
    if (!p->cancelled && o->stop_signals && sigpending(&pending) == 0)
        for (int s = 1; s < NSIG && !p->cancelled; s++)
            p->cancelled = sigismember(o->stop_signals, s) == 1 && sigismember(&pending, s) == 1;
    for (int i = 0; i < o->nproc && !p->failed; i++) {
        const child_t *c = &p->ch[i];
        if (c->res_len && memchr(c->res, '\n', c->res_len) && !jint(c->res, c->res_len, "ok") &&
            !jint(c->res, c->res_len, "timeout")) {
            p->failed = 1;
            if (tsp__now_s() + 0.25 < p->kill_at)
                p->kill_at = tsp__now_s() + 0.25;
        }
    }
    if (p->cancelled || tsp__now_s() >= p->kill_at)
        for (int i = 0; i < o->nproc; i++)
            if (p->ch[i].pid > 0 && !p->ch[i].exited)
                kill(p->ch[i].pid, SIGKILL);
}

/* Polls the children's pipes until every child has exited and every pipe is closed. */
static void supervise(preflight_t *p)
{
    const tsp_nccl_preflight_opts_t *o = p->o;
    for (;;) {
        struct pollfd pf[128];
        int map[128], np = 0, alive = 0;
        for (int i = 0; i < o->nproc && np < 126; i++) {
            child_t *c = &p->ch[i];
            if (c->res_fd >= 0) {
                pf[np] = (struct pollfd){.fd = c->res_fd, .events = POLLIN};
                map[np++] = i * 2;
            }
            if (c->err_fd >= 0) {
                pf[np] = (struct pollfd){.fd = c->err_fd, .events = POLLIN};
                map[np++] = i * 2 + 1;
            }
            if (c->pid > 0 && !c->exited) {
                int st;
                if (waitpid(c->pid, &st, WNOHANG) == c->pid)
                    c->exited = 1;
                else
                    alive++;
            }
        }
        if (!alive && np == 0)
            return;
        enforce_deadline(p);
        int r = poll(pf, (nfds_t)np, np ? 20 : 0);
        if (np == 0)
            tsp__nccl_nap_ms(5);
        for (int j = 0; r > 0 && j < np; j++)
            if (pf[j].revents)
                read_child(p, &p->ch[map[j] / 2], o->first_rank + map[j] / 2, map[j] % 2);
    }
}

/* The first real failure wins. A failure that came as late as a timeout of another rank
 * (its abort closed the connections) is a consequence of that timeout. -EIO with its
 * message, or 0 when no rank failed so. */
static int first_failure(const preflight_t *p, char *msg, size_t msglen)
{
    const tsp_nccl_preflight_opts_t *o = p->o;
    const child_t *ch = p->ch;
    double first_timeout = 1e300;
    for (int i = 0; i < o->nproc; i++)
        if (ch[i].res_len && jint(ch[i].res, ch[i].res_len, "timeout") &&
            jdbl(ch[i].res, ch[i].res_len, "at") < first_timeout)
            first_timeout = jdbl(ch[i].res, ch[i].res_len, "at");
    for (int i = 0; i < o->nproc; i++) {
        if (!ch[i].res_len || jint(ch[i].res, ch[i].res_len, "ok") ||
            jint(ch[i].res, ch[i].res_len, "timeout") ||
            jdbl(ch[i].res, ch[i].res_len, "at") >= first_timeout)
            continue;
        char *m = jget(ch[i].res, ch[i].res_len, "message");
        snprintf(msg, msglen, "%s", m ? m : "torchspark: NCCL check failed before training");
        free(m);
        if (o->failed_rank)
            *o->failed_rank = o->first_rank + i;
        return -EIO;
    }
    return 0;
}

/* Every local rank found no driver on this host: -ENODEV with the one warning (the first
 * rank's), else 0. */
static int skipped(const preflight_t *p, char *msg, size_t msglen)
{
    const tsp_nccl_preflight_opts_t *o = p->o;
    for (int i = 0; i < o->nproc; i++) {
        char *step = p->ch[i].res_len ? jget(p->ch[i].res, p->ch[i].res_len, "step") : NULL;
        int none = step && strcmp(step, "nodriver") == 0;
        free(step);
        if (!none)
            return 0;
    }
    char *m = o->nproc > 0 ? jget(p->ch[0].res, p->ch[0].res_len, "message") : NULL;
    snprintf(msg, msglen, "%s", m ? m : "torchspark: WARNING: NCCL check skipped: no driver");
    free(m);
    return o->nproc > 0 ? -ENODEV : 0;
}

/* Then timeouts and silent ranks: -EIO with the message naming them, or 0 when every rank
 * reported success. */
static int timeouts(const preflight_t *p, char *msg, size_t msglen)
{
    const tsp_nccl_preflight_opts_t *o = p->o;
    const child_t *ch = p->ch;
    char late[512] = "", silent[512] = "";
    int nlate = 0, nsilent = 0, in_ar = 0;
    for (int i = 0; i < o->nproc; i++) {
        if (!ch[i].res_len) {
            tsp__err_append(silent, sizeof silent, "%s%d", nsilent++ ? "," : "", o->first_rank + i);
        } else if (!jint(ch[i].res, ch[i].res_len, "ok")) {
            char *step = jget(ch[i].res, ch[i].res_len, "step");
            in_ar |= step && strcmp(step, "allreduce") == 0;
            free(step);
            tsp__err_append(late, sizeof late, "%s%d", nlate++ ? "," : "", o->first_rank + i);
        }
    }
    if (!nlate && !nsilent && p->started == o->nproc)
        return 0;
    snprintf(msg, msglen,
             "torchspark: NCCL check timed out after %.0f s before training: ", o->timeout);
    if (nlate)
        tsp__err_append(msg, msglen, "rank(s) %s on %s were still %s", late, p->host,
                        in_ar ? "in all_reduce" : "initializing the communicator");
    if (nsilent)
        tsp__err_append(msg, msglen, "%srank(s) %s on %s never reported", nlate ? "; " : "", silent,
                        p->host);
    tsp__err_append(msg, msglen,
                    ". Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see the "
                    "interfaces NCCL chose.");
    return -EIO;
}

/* The node's success line: the ranks' mean times and bandwidths. */
static void success(const preflight_t *p, double wall, char *msg, size_t msglen)
{
    const tsp_nccl_preflight_opts_t *o = p->o;
    const child_t *ch = p->ch;
    double us = 0, algbw = 0, busbw = 0;
    for (int i = 0; i < o->nproc; i++) {
        us += jdbl(ch[i].res, ch[i].res_len, "us") / o->nproc;
        algbw += jdbl(ch[i].res, ch[i].res_len, "algbw") / o->nproc;
        busbw += jdbl(ch[i].res, ch[i].res_len, "busbw") / o->nproc;
    }
    int v = jint(ch[0].res, ch[0].res_len, "nccl");
    char *path = jget(ch[0].res, ch[0].res_len, "path");
    snprintf(
        msg, msglen,
        "torchspark: NCCL check passed in %.2f s on %s: ranks %d-%d of %d, NCCL %d.%d.%d (%s), "
        "interface %s; all_reduce %g MiB float32: %.0f us, algbw %.2f GB/s, ",
        wall, p->host, o->first_rank, o->first_rank + o->nproc - 1, o->world_size, v / 10000,
        (v % 10000) / 100, v % 100, path ? path : "?",
        o->ifname && *o->ifname ? o->ifname : "(NCCL's choice)", (double)o->bytes / (1 << 20), us,
        algbw);
    free(path);
    if (o->world_size > 1)
        tsp__err_append(msg, msglen, "busbw %.2f GB/s", busbw);
    else
        tsp__err_append(msg, msglen, "busbw n/a (1 rank)");
}

int tsp_nccl_preflight(const tsp_nccl_preflight_opts_t *o, char *msg, size_t msglen)
{
    preflight_t p = {.o = o, .host = "?"};
    p.t0 = tsp__now_s();
    p.kill_at = p.t0 + o->timeout + TSP_NCCL_KILL_GRACE;
    gethostname(p.host, sizeof p.host - 1);
    msg[0] = 0;
    if (o->failed_rank)
        *o->failed_rank = -1;
    if (!(p.ch = calloc((size_t)o->nproc, sizeof *p.ch)))
        return -ENOMEM;
    for (int i = 0; i < o->nproc; i++) {
        p.ch[i].pid = -1;
        p.ch[i].res_fd = p.ch[i].err_fd = -1;
    }
    spawn_checks(&p);
    supervise(&p);
    int rc = 0;
    if (p.cancelled) {
        snprintf(msg, msglen, "torchspark: NCCL check stopped: the run was stopped");
        rc = -ECANCELED;
    } else if (!(rc = skipped(&p, msg, msglen)) && !(rc = first_failure(&p, msg, msglen)) &&
               !(rc = timeouts(&p, msg, msglen))) {
        success(&p, tsp__now_s() - p.t0, msg, msglen);
    }
    for (int i = 0; i < o->nproc; i++) {
        if (p.ch[i].pid > 0 && !p.ch[i].exited) {
            kill(p.ch[i].pid, SIGKILL);
            waitpid(p.ch[i].pid, NULL, 0);
        }
        if (p.ch[i].res_fd >= 0)
            close(p.ch[i].res_fd);
        if (p.ch[i].err_fd >= 0)
            close(p.ch[i].err_fd);
    }
    free(p.ch);
    return rc;
}
