/* agentproc.c: the node's agent as a glue starts it (torchspark/agentproc.h, docs/protocol.md
 * 12.1): its environment and secret, its output pumped by poll (no threads) into a tail, an
 * echo and the lines handed to the caller, its exit turned into the task's result
 * (tsp_task_finish), and its orderly stop. */
#include "torchspark/agentproc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "env.h"
#include "jreq.h"
#include "json.h"
#include "lines.h"
#include "logtail.h"
#include "proc.h"
#include "torchspark/task.h"
#include "util.h"

extern char **environ;

#define SLICE_MS 50 /* without a pidfd: how often a wait looks for the agent's exit */

struct tsp_agentproc {
    tsp_proc_t p;           /* pid, and the read ends of stdout and stderr (-1 once ended) */
    int pidfd;              /* readable once the agent exited; -1 without pidfd_open */
    int exited, status;     /* reaped, and its status (the code, or -N for signal N) */
    int64_t drain_deadline; /* after the exit: when the pipes stop counting */
    tsp_lines_t lines[2];   /* stdout, stderr */
    tsp__tail_t tail;       /* both streams' last lines, in the order read */
    int echo, hand;         /* echo to fd 2; streams handed (bit 1: stdout, bit 2: stderr) */
    char *finish, *host;    /* the plan's finish (JSON text), this host's name */
    FILE *hand_f;           /* the lines to hand, as a JSON array being written */
    char *hand_doc;
    size_t hand_len;
    tsp_json_writer_t hw;
    char *scratch; /* a line NUL-terminated for the JSON writer */
    size_t scratch_cap;
    char *reply; /* a reply that did not fit the caller's buffer */
    size_t reply_len;
};

/* ---- start ---- */

/* fn's "KEY": "VALUE" members of the object at path of doc into env (set, or set_default). */
typedef struct {
    tsp_env_t *env;
    int dflt;
} env_walk_t;

static int env_member(void *ctx, const char *key, size_t index, int type, const char *val,
                      size_t len)
{
    (void)index;
    (void)len;
    env_walk_t *w = ctx;
    if (type != TSP_JSON_STRING || !key)
        return -EINVAL;
    return w->dflt ? tsp_env_set_default(w->env, key, val) : tsp_env_set(w->env, key, val);
}

/* The agent's environment: env_default, the caller's (its glue's "environ", else this
 * process's), env; the parent pid; the secret's fd. */
static int build_env(const tsp_jreq_t *r, int secret, tsp_env_t *env)
{
    char pid[24];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    char *base = NULL;
    int given = tsp_jreq_get(r, "environ", TSP_JSON_OBJECT, "an object of strings", &base);
    free(base);
    int rc = given < 0 ? given : tsp_env_init(env, given ? NULL : environ);
    env_walk_t set = {env, 0}, dflt = {env, 1};
    if (!rc && given)
        rc = tsp_json_each(r->doc, r->len, "environ", env_member, &set);
    if (!rc && (rc = tsp_json_each(r->doc, r->len, "plan.env", env_member, &set)) == -ENOENT)
        rc = 0;
    if (!rc &&
        (rc = tsp_json_each(r->doc, r->len, "plan.env_default", env_member, &dflt)) == -ENOENT)
        rc = 0;
    if (rc == -EINVAL)
        return tsp__err(r->err, r->errlen, rc,
                        "the agent request's \"environ\", \"plan.env\" and "
                        "\"plan.env_default\" must be objects of strings");
    /* Lets the agent notice a parent that died before it asked for its death signal. */
    if (!rc)
        rc = tsp_env_set(env, "TORCHSPARK_PARENT_PID", pid);
    /* The secret on a pipe, never here: /proc/PID/environ shows it to every process of this
     * user for the agent's whole life (docs/protocol.md 1.1). */
    if (!rc)
        rc = tsp_env_unset(env, "TORCHSPARK_LOG_SECRET");
    if (!rc && secret)
        rc = tsp_env_set(env, "TORCHSPARK_LOG_SECRET_FD", "0");
    return rc;
}

typedef struct {
    char **v;
    size_t n;
} argv_t;

static int argv_member(void *ctx, const char *key, size_t index, int type, const char *val,
                       size_t len)
{
    (void)key;
    (void)len;
    argv_t *a = ctx;
    if (type != TSP_JSON_STRING)
        return -EINVAL;
    char **grown = realloc(a->v, (index + 2) * sizeof *grown);
    if (!grown)
        return -ENOMEM;
    a->v = grown;
    a->v[index + 1] = NULL;
    if (!(a->v[index] = strdup(val)))
        return -ENOMEM;
    a->n = index + 1;
    return 0;
}

static void argv_free(argv_t *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
}

/* A pipe's read end that holds the secret and a '\n' (written now: 65 bytes are within any
 * pipe's buffer), its write end closed, so the agent reads the secret, then EOF. */
static int secret_pipe(const char *secret, int *fd)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0)
        return -errno;
    char buf[160];
    int n = snprintf(buf, sizeof buf, "%s\n", secret);
    ssize_t w;
    do
        w = write(fds[1], buf, (size_t)n);
    while (w < 0 && errno == EINTR);
    int rc = w == n ? 0 : w < 0 ? -errno : -EIO;
    close(fds[1]);
    if (rc)
        close(fds[0]);
    else
        *fd = fds[0];
    return rc;
}

/* The request's keys: the secret (NULL or "": none; else hex of at most 128 digits), the
 * handed streams, the echo, the host and the plan's finish. */
static int read_options(const tsp_jreq_t *r, tsp_agentproc_t *a, char **secret)
{
    char *hand = NULL;
    int rc = tsp_jreq_str(r, "secret", 0, secret);
    if (!rc && *secret && !**secret) { /* "": none, as null */
        free(*secret);
        *secret = NULL;
    }
    if (!rc && *secret &&
        (strlen(*secret) > 128 || strspn(*secret, "0123456789abcdefABCDEF") != strlen(*secret)))
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the agent request's \"secret\" must be hex digits (at most 128)");
    if (!rc)
        rc = tsp_jreq_bool(r, "echo", &a->echo);
    if (!rc)
        rc = tsp_jreq_str(r, "hand", 0, &hand);
    if (!rc && hand) {
        a->hand = !strcmp(hand, "all")      ? 3
                  : !strcmp(hand, "stderr") ? 2
                  : !strcmp(hand, "none")   ? 0
                                            : -1;
        if (a->hand < 0)
            rc = tsp__err(r->err, r->errlen, -EINVAL,
                          "the agent request's \"hand\" must be \"none\", \"stderr\" or \"all\"");
    }
    free(hand);
    if (!rc)
        rc = tsp_jreq_str(r, "host", 0, &a->host);
    if (!rc && !a->host) { /* this host's name, as both glues would ask (gethostname) */
        char name[256] = "";
        if (gethostname(name, sizeof name - 1) != 0 || !name[0])
            snprintf(name, sizeof name, "?");
        rc = (a->host = strdup(name)) ? 0 : -ENOMEM;
    }
    if (!rc && (rc = tsp_jreq_get(r, "plan.finish", TSP_JSON_OBJECT, "an object", &a->finish)) > 0)
        rc = 0;
    if (!rc && !a->finish)
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the agent request has no \"plan.finish\" (tsp_task_launch's)");
    return rc;
}

static int spawn(const tsp_jreq_t *r, tsp_agentproc_t *a, const char *secret)
{
    argv_t argv = {0};
    tsp_env_t env = {0};
    int in_fd = -1;
    int rc = tsp_json_each(r->doc, r->len, "plan.argv", argv_member, &argv);
    if (rc == -EINVAL || rc == -ENOENT || (!rc && !argv.n))
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the agent request's \"plan.argv\" must be a non-empty array of strings");
    if (!rc)
        rc = build_env(r, secret != NULL, &env);
    if (!rc && secret)
        rc = secret_pipe(secret, &in_fd);
    if (!rc) {
        tsp_proc_opts_t o = {
            .file = argv.v[0],
            .argv = argv.v,
            .envp = env.vars,
            .stdin_mode = secret ? TSP_PROC_FD : TSP_PROC_NULL,
            .stdin_fd = in_fd,
            .stdout_mode = TSP_PROC_PIPE,
            .stderr_mode = TSP_PROC_PIPE,
        };
        rc = tsp_proc_spawn(&a->p, &o, r->err, r->errlen);
    }
    if (in_fd >= 0)
        close(in_fd);
    tsp_env_close(&env);
    argv_free(&argv);
    return rc;
}

tsp_agentproc_t *tsp_agentproc_start(const char *request, size_t len, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    tsp_jreq_t r = {request, len, "the agent request", err, errlen};
    tsp_agentproc_t *a = calloc(1, sizeof *a);
    char *secret = NULL;
    if (!a) {
        (void)tsp__err(err, errlen, -ENOMEM, "torchspark: out of memory starting the agent");
        return NULL;
    }
    a->p.pid = 0;
    a->p.out_fd = a->p.err_fd = a->pidfd = -1;
    int rc = tsp_json_check_object(request, len) ? -EINVAL : 0;
    if (rc)
        (void)tsp__err(err, errlen, rc, "the agent request is not a JSON object");
    if (!rc)
        rc = read_options(&r, a, &secret);
    if (!rc)
        rc = tsp_lines_init(&a->lines[0], TSP_LINES_DEFAULT_CAP);
    if (!rc)
        rc = tsp_lines_init(&a->lines[1], TSP_LINES_DEFAULT_CAP);
    if (!rc)
        rc = spawn(&r, a, secret);
    free(secret);
    if (rc) {
        if (err && errlen && !err[0])
            (void)tsp__err(err, errlen, rc, "torchspark: cannot start the agent: %s",
                           tsp_strerror(rc));
        tsp_agentproc_close(a);
        return NULL;
    }
#ifdef SYS_pidfd_open
    a->pidfd = (int)syscall(SYS_pidfd_open, a->p.pid, 0); /* close-on-exec by default */
#endif
    if (a->pidfd < 0)
        a->pidfd = -1;
    return a;
}

/* ---- the pump ---- */

static void echo_line(const char *data, size_t len, int eol)
{
    struct iovec v[2] = {{(void *)(uintptr_t)data, len}, {(void *)(uintptr_t) "\n", eol ? 1u : 0u}};
    while (v[0].iov_len + v[1].iov_len > 0) {
        ssize_t n = writev(STDERR_FILENO, v, 2);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* nowhere else to go */
        for (int i = 0; i < 2; i++) {
            size_t k = (size_t)n < v[i].iov_len ? (size_t)n : v[i].iov_len;
            v[i].iov_base = (char *)v[i].iov_base + k;
            v[i].iov_len -= k;
            n -= (ssize_t)k;
        }
    }
}

/* One line to hand: appended to the array being written (bytes after a NUL are lost). */
static void hand_line(tsp_agentproc_t *a, const char *data, size_t len)
{
    if (!a->hand_f) {
        if (!(a->hand_f = open_memstream(&a->hand_doc, &a->hand_len)))
            return;
        tsp_json_writer_init(&a->hw, a->hand_f);
        tsp_json_begin_array(&a->hw);
    }
    if (a->scratch_cap < len + 1) {
        char *grown = realloc(a->scratch, len + 1);
        if (!grown)
            return;
        a->scratch = grown;
        a->scratch_cap = len + 1;
    }
    memcpy(a->scratch, data, len);
    a->scratch[len] = 0;
    tsp_json_str(&a->hw, a->scratch);
}

/* The complete lines of stream s (0: stdout, 1: stderr) into the tail, the echo and the hand. */
static void take_lines(tsp_agentproc_t *a, int s)
{
    const char *data;
    size_t len;
    unsigned flags;
    while (tsp_lines_peek(&a->lines[s], &data, &len, &flags) == 1) {
        tsp__tail_add(&a->tail, TSP_AGENTPROC_TAIL_LINES, TSP_AGENTPROC_TAIL_BYTES, data, len);
        if (a->echo)
            echo_line(data, len, !(flags & TSP_LINE_CONTINUED));
        if (a->hand & (1 << s))
            hand_line(a, data, len);
        tsp_lines_consume(&a->lines[s]);
    }
}

/* Reads stream s until it would block or ends (then its fd is closed). */
static void drain(tsp_agentproc_t *a, int s, int *fd)
{
    for (;;) {
        long n = tsp_lines_read(&a->lines[s], *fd);
        if (n == -ENOBUFS) {
            take_lines(a, s);
            continue;
        }
        if (n > 0) {
            take_lines(a, s);
            continue;
        }
        if (n == -EAGAIN)
            return;
        tsp_lines_finish(&a->lines[s]); /* the end, or a read error: the rest is a line */
        take_lines(a, s);
        close(*fd);
        *fd = -1;
        return;
    }
}

static void reap(tsp_agentproc_t *a, int flags)
{
    int ws;
    pid_t got;
    do
        got = waitpid(a->p.pid, &ws, flags);
    while (got < 0 && errno == EINTR);
    if (got == a->p.pid || (got < 0 && errno == ECHILD)) {
        a->exited = 1;
        a->status = got < 0 ? 0 : WIFSIGNALED(ws) ? -WTERMSIG(ws) : WEXITSTATUS(ws);
        a->drain_deadline = tsp__now_ms() + TSP_AGENTPROC_DRAIN_MS;
    }
}

/* Polls the pipes (and the pidfd) for at most timeout_ms, pumps what came, reaps an exit. */
static void pump(tsp_agentproc_t *a, int timeout_ms)
{
    struct pollfd pf[3];
    int *fds[2] = {&a->p.out_fd, &a->p.err_fd};
    nfds_t n = 0;
    for (int s = 0; s < 2; s++)
        if (*fds[s] >= 0)
            pf[n++] = (struct pollfd){.fd = *fds[s], .events = POLLIN};
    if (!a->exited && a->pidfd >= 0)
        pf[n++] = (struct pollfd){.fd = a->pidfd, .events = POLLIN};
    else if (!a->exited && timeout_ms > SLICE_MS)
        timeout_ms = SLICE_MS;
    if (a->exited && timeout_ms > a->drain_deadline - tsp__now_ms())
        timeout_ms = (int)(a->drain_deadline - tsp__now_ms());
    (void)poll(pf, n, timeout_ms < 0 ? 0 : timeout_ms); /* EINTR: the caller's loop goes on */
    for (int s = 0; s < 2; s++)
        if (*fds[s] >= 0)
            drain(a, s, fds[s]);
    if (!a->exited)
        reap(a, WNOHANG);
}

static int done(const tsp_agentproc_t *a)
{
    return a->exited &&
           ((a->p.out_fd < 0 && a->p.err_fd < 0) || tsp__now_ms() >= a->drain_deadline);
}

/* ---- the result ---- */

static int copy_member(void *ctx, const char *key, size_t index, int type, const char *val,
                       size_t len)
{
    (void)index;
    tsp_json_writer_t *w = ctx;
    tsp_json_key(w, key);
    if (type == TSP_JSON_STRING)
        tsp_json_str(w, val);
    else
        tsp_json_raw(w, val, len);
    return 0;
}

/* tsp_task_finish's request: the plan's finish, the status, the host and the tail. */
static int finish_request(const tsp_agentproc_t *a, char **doc, size_t *dlen)
{
    size_t need =
        tsp__tail_copy(&a->tail, TSP_AGENTPROC_TAIL_LINES, TSP_AGENTPROC_TAIL_LINES, NULL, 0);
    char *tail = malloc(need + 1);
    FILE *f = tail ? open_memstream(doc, dlen) : NULL;
    if (!f) {
        free(tail);
        return -ENOMEM;
    }
    tsp__tail_copy(&a->tail, TSP_AGENTPROC_TAIL_LINES, TSP_AGENTPROC_TAIL_LINES, tail, need + 1);
    tail[need ? need - 1 : 0] = 0; /* the lines joined by '\n', none after the last */
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    int rc = tsp_json_each(a->finish, strlen(a->finish), NULL, copy_member, &w);
    tsp_json_key(&w, "status");
    tsp_json_int(&w, a->status);
    tsp_json_key(&w, "host");
    tsp_json_str(&w, a->host);
    tsp_json_key(&w, "tail");
    tsp_json_str(&w, tail);
    tsp_json_end(&w);
    free(tail);
    if (fclose(f) != 0 && !rc)
        rc = -ENOMEM;
    return rc;
}

/* tsp_task_finish's reply, malloc'ed in *out. */
static int finish(const tsp_agentproc_t *a, char **out, char *err, size_t errlen)
{
    char *req = NULL;
    size_t rlen = 0, size = 16384, needed = 0;
    int rc = finish_request(a, &req, &rlen);
    for (int i = 0; !rc && i < 2; i++) {
        if (!(*out = malloc(size))) {
            rc = -ENOMEM;
            break;
        }
        rc = tsp_task_finish(req, rlen, *out, size, &needed, err, errlen);
        if (rc != -ENOSPC)
            break;
        free(*out);
        *out = NULL;
        size = needed;
    }
    free(req);
    return rc;
}

/* The wait's reply into a->reply: the handed lines (then reset), the status, the result. */
static int build_reply(tsp_agentproc_t *a, int is_done, char *err, size_t errlen)
{
    char *result = NULL;
    int rc = is_done ? finish(a, &result, err, errlen) : 0;
    FILE *f = rc ? NULL : open_memstream(&a->reply, &a->reply_len);
    if (!rc && !f)
        rc = -ENOMEM;
    if (!rc) {
        tsp_json_writer_t w;
        tsp_json_writer_init(&w, f);
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "lines");
        if (a->hand_f) {
            tsp_json_end(&a->hw);
            rc = fclose(a->hand_f) ? -ENOMEM : 0;
            a->hand_f = NULL;
            tsp_json_raw(&w, a->hand_doc ? a->hand_doc : "[]", a->hand_doc ? a->hand_len : 2);
            free(a->hand_doc);
            a->hand_doc = NULL;
        } else {
            tsp_json_raw(&w, "[]", 2);
        }
        tsp_json_key(&w, "status");
        if (a->exited)
            tsp_json_int(&w, a->status);
        else
            tsp_json_null(&w);
        tsp_json_key(&w, "done");
        if (result)
            tsp_json_raw(&w, result, strlen(result));
        else
            tsp_json_null(&w);
        tsp_json_end(&w);
        if (fclose(f) != 0 && !rc)
            rc = -ENOMEM;
    }
    free(result);
    return rc;
}

int tsp_agentproc_wait(tsp_agentproc_t *a, const char *request, size_t len, char *out,
                       size_t outlen, size_t *needed, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!a->reply) {
        tsp_jreq_t r = {request, len, "the agent's wait request", err, errlen};
        long long timeout = 100;
        int rc =
            tsp_json_check_object(request, len)
                ? tsp__err(err, errlen, -EINVAL, "the agent's wait request is not a JSON object")
                : tsp_jreq_num(&r, "timeout_ms", -1, 86400000,
                               "a whole number of ms (-1: "
                               "until done)",
                               &timeout);
        if (rc)
            return rc;
        int64_t deadline = tsp__now_ms() + timeout;
        for (int first = 1; !done(a) && !a->hand_f; first = 0) {
            int64_t left = deadline - tsp__now_ms();
            if (timeout >= 0 && left <= 0 && !first)
                break; /* a zero timeout still pumps once */
            pump(a, timeout < 0 || left > 60000 ? 60000 : left < 0 ? 0 : (int)left);
        }
        if ((rc = build_reply(a, done(a), err, errlen)) != 0) {
            free(a->reply);
            a->reply = NULL;
            return rc;
        }
    }
    int rc = tsp__reply_copy(a->reply, a->reply_len, out, outlen, needed);
    if (rc != -ENOSPC) {
        free(a->reply);
        a->reply = NULL;
    }
    return rc;
}

/* ---- stop, close ---- */

void tsp_agentproc_stop(tsp_agentproc_t *a)
{
    if (!a || !a->p.pid || a->exited)
        return;
    /* TERM: the agent stops its workers within its grace; a second more, then KILL. */
    kill(a->p.pid, SIGTERM);
    int64_t deadline = tsp__now_ms() + (TSP_TASK_SHUTDOWN_TIMEOUT_S + 1) * 1000;
    for (int64_t left; !a->exited && (left = deadline - tsp__now_ms()) > 0;)
        pump(a, (int)left);
    if (!a->exited) {
        kill(a->p.pid, SIGKILL);
        reap(a, 0);
    }
}

void tsp_agentproc_close(tsp_agentproc_t *a)
{
    if (!a)
        return;
    tsp_agentproc_stop(a);
    tsp_proc_close(&a->p);
    if (a->pidfd >= 0)
        close(a->pidfd);
    for (int s = 0; s < 2; s++)
        tsp_lines_close(&a->lines[s]);
    tsp__tail_free(&a->tail);
    if (a->hand_f)
        fclose(a->hand_f);
    free(a->hand_doc);
    free(a->scratch);
    free(a->reply);
    free(a->finish);
    free(a->host);
    free(a);
}
