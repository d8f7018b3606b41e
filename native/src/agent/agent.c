/* agent.c: the node agent's supervision loop.
 *
 * States of one run:
 *   RUNNING   workers alive; a non-zero exit is a failure, all zero exits finish the attempt
 *   STOPPING  after a failure or a stop signal: every worker group got SIGTERM and a timer
 *             runs for the grace period; when it fires everything left gets SIGKILL
 *   RESTART   like STOPPING, but a new attempt starts when every process is gone
 *   FINISHING all workers exited 0; leftover descendants are stopped the same way
 * An attempt ends when no worker, no child (orphans come back to us as subreaper) and no
 * unread output remain. Once every worker is gone, remaining descendants are orphans of
 * dead workers and get SIGKILL at once: there is nothing left for them to finish.
 */
#include "agent.h"
#include "dump.h"
#include "logwire.h"
#include "logtail.h"
#include "proc.h"
#include "report.h"
#include "reportsock.h"
#include "sentinel.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <ftw.h>

extern char **environ;

enum { ST_RUNNING, ST_STOPPING, ST_RESTART, ST_FINISHING };
enum { W_IDLE, W_RUNNING, W_EXITED };

/* epoll tags: small integers for the agent's own fds, worker streams above them. */
enum { TAG_SIGNAL = 1, TAG_TIMER, TAG_STOP, TAG_WAKE, TAG_DUMP, TAG_STREAM0 = 16 };
#define TAG_REPORTS (1ull << 32) /* the report socket and its connections (reportsock.h) */
/* A worker's pidfd: TAG_PIDFD0 + local rank, above the reports' tags. */
#define TAG_PIDFD0 ((uint64_t)1 << 40)

typedef struct {
    int fd;      /* pipe read end, -1 when closed or not captured */
    int file_fd; /* redirect file, -1 when none */
    int paused;  /* the sink was full: not in epoll until it wakes us */
    int linger;  /* emptied a moment ago: not in epoll until the linger deadline */
    int in_long; /* the last piece kept for the tail was TSP_LINE_CONTINUED */
    tsp_lines_t lines;
} stream_t;

typedef struct {
    int local_rank;
    int state;
    pid_t pid;
    int wstatus;
    double exit_time;
    int pidfd; /* readable once the worker has exited; -1 when none (or no pidfd_open) */
    stream_t s[2];
    tsp__tail_t tail; /* its last lines, prefixed, for the failure document (report_root) */
    char error_file[512];
} worker_t;

struct tsp_agent {
    tsp_agent_opts_t o;
    int n;
    worker_t *w;
    int epfd, sigfd, timerfd, stopfd;
    int dumpfd;                /* tsp_agent_dump() wakes the loop through it */
    atomic_uint dump_request;  /* the latest DUMP number */
    atomic_int checkpoint_why; /* a CHECKPOINT came (protocol 1.13): its why, once */
    int grow_asked;            /* asked the workers to checkpoint: stop on their acknowledgement */
    int state;
    int capture;
    int restart_count;
    int stop_signal; /* the signal that stopped us, 0 when none */
    /* Stopped after the training acknowledged a checkpoint on request (report.h): the
     * first worker that ends is this node's failure (its decommission), not a consequence. */
    int on_request;
    int killed;      /* SIGKILL already sent in this attempt */
    int exec_status; /* 127/126 when the program could not be started */
    int wake_watched;
    int64_t linger_until;  /* CLOCK_MONOTONIC ms when lingering streams are read again; 0: none */
    int64_t reports_until; /* ms when idle report connections are closed (no worker left); 0 */
    char host[256];
    char log_dir[PATH_MAX];
    int own_log_dir;
    tsp_failure_t *fails;
    int nfails;
    int root;
    int reported; /* the root cause was written and handed to on_failure */
    /* the workers' torchspark.report() socket (reportsock.h); NULL without a sink */
    tsp_reports_t *reports;
};

static double now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void agent_log(const tsp_agent_t *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void agent_log(const tsp_agent_t *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tsp__log_linev(a->o.log_fd, a->o.log_prefix ? a->o.log_prefix : "torchspark: ", fmt, ap);
    va_end(ap);
}

static int write_all(int fd, const struct iovec *iov, int cnt)
{
    struct iovec v[4];
    memcpy(v, iov, (size_t)cnt * sizeof *iov);
    struct iovec *p = v;
    while (cnt > 0) {
        ssize_t n = writev(fd, p, cnt);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno; /* EPIPE on a closed console: the line is dropped there only */
        }
        while (cnt > 0 && (size_t)n >= p->iov_len) {
            n -= (ssize_t)p->iov_len;
            p++;
            cnt--;
        }
        if (cnt > 0) {
            p->iov_base = (char *)p->iov_base + n;
            p->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* The signals the agent reads through its signalfd. */
static void agent_signals(sigset_t *set)
{
    sigemptyset(set);
    int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaddset(set, sigs[i]);
}

int tsp_agent_block_signals(void)
{
    sigset_t set;
    agent_signals(&set);
    return sigprocmask(SIG_BLOCK, &set, NULL) < 0 ? -errno : 0;
}

int tsp_agent_setup_process(int pdeathsig, pid_t expected_ppid)
{
    /* First, before we are a subreaper: a job without its sentinel still runs (a process
     * left behind by an agent SIGKILL is then possible), so a failure here is not fatal. */
    tsp__sentinel_start();
    int brc = tsp_agent_block_signals();
    if (brc)
        return brc;
    signal(SIGPIPE, SIG_IGN);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
        return -errno;
    if (pdeathsig) {
        if (prctl(PR_SET_PDEATHSIG, pdeathsig) < 0)
            return -errno;
        if (expected_ppid > 0 && getppid() != expected_ppid)
            return -ESRCH;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------------------ */

static void expand_prefix(const tsp_agent_t *a, const worker_t *w, char *out, size_t outlen)
{
    const char *t = a->o.prefix_template ? a->o.prefix_template : "[${role_name}${local_rank}]:";
    size_t o = 0;
    char num[24];
    while (*t && o + 1 < outlen) {
        const char *val = NULL;
        size_t skip = 0;
        if (strncmp(t, "${role_name}", 12) == 0) {
            val = a->o.topo.role;
            skip = 12;
        } else if (strncmp(t, "${local_rank}", 13) == 0) {
            snprintf(num, sizeof num, "%d", w->local_rank);
            val = num;
            skip = 13;
        } else if (strncmp(t, "${hostname}", 11) == 0) {
            val = a->host;
            skip = 11;
        } else if (strncmp(t, "${rank}", 7) == 0) {
            snprintf(num, sizeof num, "%d", tsp_topo_global_rank(&a->o.topo, w->local_rank));
            val = num;
            skip = 7;
        }
        if (val) {
            int n = snprintf(out + o, outlen - o, "%s", val);
            o += n > 0 ? (size_t)n : 0;
            if (o >= outlen)
                o = outlen - 1;
            t += skip;
        } else {
            out[o++] = *t++;
        }
    }
    out[o] = 0;
}

/* Keeps a delivered line in the worker's tail as the glues' console shows it ("[rank R] ",
 * "[stderr] "): a long line's first piece only, cut at TAIL_LINE_MAX bytes. */
#define TAIL_LINE_MAX 2048
static void keep_line(tsp_agent_t *a, worker_t *w, int si, const char *data, size_t len,
                      unsigned flags)
{
    stream_t *s = &w->s[si];
    int skip = s->in_long;
    s->in_long = (flags & TSP_LINE_CONTINUED) != 0;
    if (skip)
        return;
    char buf[128 + TAIL_LINE_MAX];
    size_t n =
        tsp_lines_prefix(buf, 128, NULL, NULL, tsp_topo_global_rank(&a->o.topo, w->local_rank),
                         si == 0 ? TSP_STREAM_STDOUT : TSP_STREAM_STDERR);
    if (n > 127)
        n = 127;
    if (len > TAIL_LINE_MAX)
        len = TAIL_LINE_MAX;
    memcpy(buf + n, data, len);
    tsp__tail_add(&w->tail, TSP_REPORT_TAIL_LINES, TSP_REPORT_TAIL_BYTES, buf, n + len);
}

/* Hands one line to the console, the redirect file and the sink. Returns -EAGAIN when
 * the sink is full (then nothing was written anywhere, so the retry writes it once). */
static int deliver_line(tsp_agent_t *a, worker_t *w, int si, const char *data, size_t len,
                        unsigned flags)
{
    stream_t *s = &w->s[si];
    int mask = si == 0 ? TSP_STD_OUT : TSP_STD_ERR;
    if (a->o.sink) {
        tsp_line_t line = {
            .rank = tsp_topo_global_rank(&a->o.topo, w->local_rank),
            .local_rank = w->local_rank,
            .stream = (uint8_t)(si == 0 ? TSP_STREAM_STDOUT : TSP_STREAM_STDERR),
            .flags = (uint8_t)flags,
            .data = data,
            .len = len,
        };
        int rc = a->o.sink->write_line(a->o.sink->ctx, &line);
        if (rc == -EAGAIN)
            return rc;
    }
    keep_line(a, w, si, data, len, flags);
    int eol = !(flags & (TSP_LINE_CONTINUED | TSP_LINE_NO_EOL));
    struct iovec iov[3] = {{NULL, 0}, {(void *)data, len}, {"\n", (size_t)eol}};
    if (s->file_fd >= 0)
        write_all(s->file_fd, iov + 1, 2); /* the file gets the bytes as they were */
    /* On the console a last line without '\n' still ends its line, or the next rank's
     * line would be joined to it. */
    iov[2].iov_len = !(flags & TSP_LINE_CONTINUED);
    int redirected = a->o.redirects && (a->o.redirects[w->local_rank] & mask);
    int teed = a->o.tee && (a->o.tee[w->local_rank] & mask);
    int shown = !a->o.show || a->o.show[w->local_rank];
    if (shown && (teed || (!redirected && !a->o.sink))) {
        char prefix[256] = "";
        if (teed)
            expand_prefix(a, w, prefix, sizeof prefix);
        iov[0].iov_base = prefix;
        iov[0].iov_len = strlen(prefix);
        write_all(si == 0 ? a->o.console_out : a->o.console_err, iov, 3);
    }
    return 0;
}

static void stream_watch(tsp_agent_t *a, worker_t *w, int si, int on)
{
    stream_t *s = &w->s[si];
    if (s->fd < 0)
        return;
    if (on) {
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u64 = TAG_STREAM0 + (uint64_t)(w->local_rank * 2 + si)};
        epoll_ctl(a->epfd, EPOLL_CTL_ADD, s->fd, &ev);
    } else {
        epoll_ctl(a->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    }
}

static void watch_wake(tsp_agent_t *a, int on)
{
    if (!a->o.sink || a->o.sink->wake_fd < 0 || a->wake_watched == on)
        return;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_WAKE};
    epoll_ctl(a->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, a->o.sink->wake_fd, &ev);
    a->wake_watched = on;
}

/* Delivers every complete line buffered for a stream. 0, or -EAGAIN when paused. */
static int drain_stream(tsp_agent_t *a, worker_t *w, int si)
{
    stream_t *s = &w->s[si];
    const char *d;
    size_t len;
    unsigned flags;
    while (tsp_lines_peek(&s->lines, &d, &len, &flags)) {
        if (deliver_line(a, w, si, d, len, flags) == -EAGAIN) {
            if (!s->paused) {
                s->paused = 1;
                stream_watch(a, w, si, 0);
                watch_wake(a, 1);
            }
            return -EAGAIN;
        }
        tsp_lines_consume(&s->lines);
    }
    if (s->paused) {
        s->paused = 0;
        if (!tsp_lines_done(&s->lines))
            stream_watch(a, w, si, 1);
    }
    if (tsp_lines_done(&s->lines) && s->fd >= 0) {
        stream_watch(a, w, si, 0);
        close(s->fd);
        s->fd = -1;
    }
    return 0;
}

/* After a wake-up that emptied a worker's pipe, the stream leaves epoll for LINGER_MS.
 * Why: a Python worker under -u makes a write() per print() (two: the text, then the
 * newline); reading each as it comes costs the agent a wake-up, a read and the sink's work
 * per line, and a busy worker then waits on its agent (measured: 2 ranks printing 1M lines
 * through TorchDistributor.run() at ~65k lines/s, the loops 10x slower than into a pipe
 * read by cat). With the linger, a busy stream is read in chunks; a lone line is still read
 * at once (the stream is in epoll when it comes), the next ones wait at most LINGER_MS.
 * The pipes are enlarged (PIPE_BYTES) so that a worker does not fill one meanwhile. Order
 * within each stream is kept; across a worker's stdout and stderr, lines written within
 * LINGER_MS of each other may be read in another order than written (two pipes never
 * promised it). */
#define LINGER_MS 2
#define PIPE_BYTES (1 << 20)

static void linger_start(tsp_agent_t *a, stream_t *s, worker_t *w, int si)
{
    s->linger = 1;
    stream_watch(a, w, si, 0);
    if (!a->linger_until)
        a->linger_until = tsp__now_ms() + LINGER_MS;
}

/* The linger deadline passed: every lingering stream goes back into epoll. */
static void linger_end(tsp_agent_t *a)
{
    a->linger_until = 0;
    for (int i = 0; i < a->n; i++)
        for (int si = 0; si < 2; si++) {
            stream_t *s = &a->w[i].s[si];
            if (s->linger) {
                s->linger = 0;
                if (!s->paused)
                    stream_watch(a, &a->w[i], si, 1);
            }
        }
}

/* epoll_wait's timeout: the loop's own, shortened to the linger deadline. */
static int wait_timeout(const tsp_agent_t *a, int timeout)
{
    if (!a->linger_until)
        return timeout;
    int64_t left = a->linger_until - tsp__now_ms();
    int ms = left <= 0 ? 0 : (int)left;
    return timeout < 0 || ms < timeout ? ms : timeout;
}

/* The same, shortened to the end of the report connections' grace (attempt_over); once it
 * passed, the stopping loop's tick looks again (paused connections may stay). */
static int reports_timeout(const tsp_agent_t *a, int timeout)
{
    int64_t left = a->reports_until - tsp__now_ms();
    if (!a->reports_until || left <= 0)
        return timeout;
    int ms = (int)left + 1;
    return timeout < 0 || ms < timeout ? ms : timeout;
}

static void read_stream(tsp_agent_t *a, worker_t *w, int si)
{
    stream_t *s = &w->s[si];
    int emptied = 0;
    /* A few reads per wake-up keep one chatty worker from starving the others. */
    for (int i = 0; i < 8 && s->fd >= 0 && !s->paused; i++) {
        long n = tsp_lines_read(&s->lines, s->fd);
        if (n == -EAGAIN) {
            emptied = 1;
            break;
        }
        if (n < 0 && n != -ENOBUFS)
            tsp_lines_finish(&s->lines); /* a broken pipe ends the stream */
        drain_stream(a, w, si);
        if (n == 0)
            break;
    }
    if (emptied && s->fd >= 0 && !s->paused && !s->linger)
        linger_start(a, s, w, si);
}

static void resume_paused(tsp_agent_t *a)
{
    int still = tsp_reports_resume(a->reports) == -EAGAIN;
    for (int i = 0; i < a->n; i++)
        for (int si = 0; si < 2; si++)
            if (a->w[i].s[si].paused && drain_stream(a, &a->w[i], si) == -EAGAIN)
                still = 1;
    if (!still)
        watch_wake(a, 0);
}

static int output_pending(const tsp_agent_t *a)
{
    for (int i = 0; i < a->n; i++)
        for (int si = 0; si < 2; si++)
            if (a->w[i].s[si].fd >= 0 || a->w[i].s[si].paused)
                return 1;
    return tsp_reports_pending(a->reports);
}

/* ---- spawning ---------------------------------------------------------------------- */

static int mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static void free_argv(char **v);

/* One argument with torchrun's substitution: string.Template(arg).safe_substitute(
 * local_rank=N), so "$local_rank" and "${local_rank}" become N, "$$" becomes "$", and any
 * other "$name" is left as it is. Returns a malloc'ed string. */
static char *substitute_arg(const char *src, const char *num)
{
    static const char key[] = "local_rank";
    size_t klen = sizeof key - 1, nlen = strlen(num), len = 0;
    /* the result is never longer than the source with every '$' replaced by num */
    size_t cap = strlen(src) + 1;
    for (const char *p = src; *p; p++)
        cap += *p == '$' ? nlen : 0;
    char *d = malloc(cap);
    if (!d)
        return NULL;
    for (const char *p = src; *p;) {
        if (p[0] == '$' && p[1] == '$') {
            d[len++] = '$';
            p += 2;
        } else if (p[0] == '$' && p[1] == '{' && strncmp(p + 2, key, klen) == 0 &&
                   p[2 + klen] == '}') {
            memcpy(d + len, num, nlen);
            len += nlen;
            p += klen + 3;
        } else if (p[0] == '$' && strncmp(p + 1, key, klen) == 0 &&
                   !(p[1 + klen] == '_' || (p[1 + klen] >= 'a' && p[1 + klen] <= 'z') ||
                     (p[1 + klen] >= 'A' && p[1 + klen] <= 'Z') ||
                     (p[1 + klen] >= '0' && p[1 + klen] <= '9'))) {
            memcpy(d + len, num, nlen);
            len += nlen;
            p += klen + 1;
        } else {
            d[len++] = *p++;
        }
    }
    d[len] = 0;
    return d;
}

/* The worker's argv with torchrun's substitution; freed with free_argv. */
static char **worker_argv(const tsp_agent_t *a, int local_rank)
{
    size_t n = 0;
    while (a->o.argv[n])
        n++;
    char **v = calloc(n + 1, sizeof(char *));
    if (!v)
        return NULL;
    char num[24];
    snprintf(num, sizeof num, "%d", local_rank);
    /* argv[0] is the program (python or the script itself): never substituted */
    for (size_t i = 0; i < n; i++) {
        v[i] = i == 0 ? strdup(a->o.argv[0]) : substitute_arg(a->o.argv[i], num);
        if (!v[i]) {
            free_argv(v);
            return NULL;
        }
    }
    return v;
}

/* Through the warm pool's shim: [shim, --warm-exec, SOCKET, --, FILE, argv...]. Takes
 * argv's strings (frees only the old array); NULL when out of memory (argv left as is). */
static char **shim_argv(const tsp_agent_t *a, char **argv)
{
    size_t n = 0;
    while (argv[n])
        n++;
    char **v = calloc(n + 6, sizeof(char *));
    if (!v)
        return NULL;
    const char *head[] = {a->o.warm_shim, "--warm-exec", a->o.warm_socket, "--", a->o.file};
    for (size_t i = 0; i < 5; i++)
        if (!(v[i] = strdup(head[i]))) {
            free_argv(v);
            return NULL;
        }
    memcpy(v + 5, argv, n * sizeof(char *));
    free(argv);
    return v;
}

static void free_argv(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

static int open_redirect(const tsp_agent_t *a, const worker_t *w, int si, int *fd)
{
    int mask = si == 0 ? TSP_STD_OUT : TSP_STD_ERR;
    *fd = -1;
    if (!((a->o.redirects && (a->o.redirects[w->local_rank] & mask)) ||
          (a->o.tee && (a->o.tee[w->local_rank] & mask))))
        return 0;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/attempt_%d/%d/%s.log", a->log_dir, a->restart_count,
             w->local_rank, si == 0 ? "stdout" : "stderr");
    *fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return *fd < 0 ? -errno : 0;
}

/* The worker's exit as an event of its own, besides SIGCHLD: a thread that a library
 * started before the agent blocked its signals may take (and discard) the SIGCHLD, but not
 * the pidfd's readiness. Without pidfd_open (Linux < 5.3) SIGCHLD alone remains. */
static void watch_exit(tsp_agent_t *a, worker_t *w)
{
    w->pidfd = (int)syscall(SYS_pidfd_open, w->pid, 0); /* close-on-exec by definition */
    if (w->pidfd < 0)
        return;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_PIDFD0 + (uint64_t)w->local_rank};
    if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, w->pidfd, &ev) < 0) {
        close(w->pidfd);
        w->pidfd = -1;
    }
}

static int spawn_worker(tsp_agent_t *a, worker_t *w, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/attempt_%d/%d", a->log_dir, a->restart_count, w->local_rank);
    int rc = mkdirs(dir);
    if (rc) {
        snprintf(err, errlen, "cannot create %s: %s", dir, strerror(-rc));
        return rc;
    }
    snprintf(w->error_file, sizeof w->error_file, "%s/error.json", dir);
    unlink(w->error_file);
    tsp_env_t env;
    if ((rc = tsp_env_init(&env, a->o.envp ? a->o.envp : environ)) != 0)
        return rc;
    rc = tsp_topo_worker_env(&a->o.topo, w->local_rank, a->restart_count, w->error_file, &env);
    /* The job's token: what the sentinel sweeps after an agent SIGKILL (sentinel.h). */
    if (!rc && tsp__sentinel_token())
        rc = tsp_env_set(&env, TSP_SENTINEL_VAR, tsp__sentinel_token());
    if (!rc && a->reports)
        rc = tsp_env_set(&env, TSP_REPORTS_ENV, tsp_reports_path(a->reports));
    char **argv = rc ? NULL : worker_argv(a, w->local_rank);
    if (!rc && !argv)
        rc = -ENOMEM;
    int warm = !rc && a->o.warm_socket && a->o.warm_shim;
    /* The shim execs the program only later, and perhaps never (the pool forks it): a
     * program that cannot run is refused here, as tsp_proc_spawn would refuse it. */
    if (warm && (rc = tsp_proc_find(a->o.file, env.vars)) != 0)
        snprintf(err, errlen, "cannot run '%s': %s", a->o.file, strerror(-rc));
    if (warm && !rc) {
        char **sv = shim_argv(a, argv);
        if (sv)
            argv = sv;
        else
            rc = -ENOMEM;
    }
    for (int si = 0; si < 2 && !rc; si++)
        rc = open_redirect(a, w, si, &w->s[si].file_fd);
    if (!rc) {
        tsp_proc_opts_t po = {
            .file = warm ? a->o.warm_shim : a->o.file,
            .argv = argv,
            .envp = env.vars,
            .stdout_mode = a->capture ? TSP_PROC_PIPE : TSP_PROC_INHERIT,
            .stderr_mode = a->capture ? TSP_PROC_PIPE : TSP_PROC_INHERIT,
            .pdeathsig = SIGKILL, /* the agent is gone: nobody supervises this worker */
            .new_session = 1,
        };
        tsp_proc_t p;
        tsp__tail_free(&w->tail); /* this attempt's lines only */
        rc = tsp_proc_spawn(&p, &po, err, errlen);
        if (rc == 0) {
            w->pid = p.pid;
            w->state = W_RUNNING;
            watch_exit(a, w);
            for (int si = 0; si < 2; si++) {
                w->s[si].fd = si == 0 ? p.out_fd : p.err_fd;
                w->s[si].paused = 0;
                w->s[si].linger = 0;
                w->s[si].in_long = 0;
                if (w->s[si].fd >= 0) {
                    /* Room for LINGER_MS of a busy worker's output; best effort (the
                     * system's pipe-max-size or the user's pipe quota may refuse). */
                    (void)fcntl(w->s[si].fd, F_SETPIPE_SZ, PIPE_BYTES);
                    tsp_lines_close(&w->s[si].lines);
                    tsp_lines_init(&w->s[si].lines, TSP_LINES_DEFAULT_CAP);
                    stream_watch(a, w, si, 1);
                }
            }
        }
    }
    free_argv(argv);
    tsp_env_close(&env);
    return rc;
}

/* ---- the hang doctor's DUMP (docs/protocol.md 1.9) ---------------------------------- */

/* A marker line on each running worker's stderr, then the dump signal to each that can
 * answer: faulthandler (the bootstrap's) writes its stacks after the marker; then the
 * recorder signal to each that blocks it: the bootstrap's thread writes torch's flight
 * recorder's last collectives. A worker
 * without the bootstrap's handler gets no signal: its default action would end it. */
static void dump_workers(tsp_agent_t *a, unsigned request)
{
    if (a->state != ST_RUNNING)
        return;
    for (int i = 0; i < a->n; i++) {
        worker_t *w = &a->w[i];
        if (w->state != W_RUNNING)
            continue;
        char state = '?';
        const char *what = "unknown";
        const char *why = tsp_dump_state(w->pid, &state, &what) ? "its state cannot be read"
                                                                : tsp_dump_cannot_answer(state);
        if (!why && tsp_dump_handled(w->pid) != 1)
            why = "it has no stack dump handler (not started through torchspark's bootstrap)";
        char line[700];
        size_t len = tsp_dump_marker(line, sizeof line, request,
                                     tsp_topo_global_rank(&a->o.topo, w->local_rank), a->host,
                                     w->pid, state, what, why);
        (void)deliver_line(a, w, 1, line, len, 0); /* a full queue loses it: "no marker" */
        if (why)
            continue;
        kill(w->pid, tsp_dump_signal());
        /* the bootstrap's flight-recorder thread (or the shim, which forwards it) */
        if (tsp_dump_recorder_blocked(w->pid) == 1)
            kill(w->pid, tsp_dump_recorder_signal());
    }
}

/* ---- signals and stopping ---------------------------------------------------------- */

static void signal_workers(tsp_agent_t *a, int sig)
{
    for (int i = 0; i < a->n; i++)
        if (a->w[i].state == W_RUNNING)
            kill(-a->w[i].pid, sig); /* the worker's whole process group */
}

static void arm_timer(tsp_agent_t *a, double seconds)
{
    struct itimerspec its = {{0, 0}, {0, 0}};
    if (seconds > 0) {
        its.it_value.tv_sec = (time_t)seconds;
        its.it_value.tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9);
    }
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1; /* zero would disarm: fire at once */
    timerfd_settime(a->timerfd, 0, &its, NULL);
}

static void kill_everything(tsp_agent_t *a)
{
    signal_workers(a, SIGKILL);
    tsp_proc_signal_descendants(getpid(), SIGKILL);
    a->killed = 1;
}

/* Enters a stopping state: SIGTERM (or sig) to every worker group and every other
 * descendant, and the grace timer. */
static void begin_stop(tsp_agent_t *a, int state, int sig)
{
    a->state = state;
    signal_workers(a, sig);
    /* The rest of the tree, not the worker groups again: a worker signalled twice ran its
     * handler twice, and one that printed a line from it interleaved the two prints
     * ("LAST 1LAST 1": issue 30's lost newline). */
    pid_t *groups = malloc((size_t)a->n * sizeof *groups); /* NULL: all of them, twice */
    int ng = 0;
    for (int i = 0; groups && i < a->n; i++)
        if (a->w[i].state == W_RUNNING)
            groups[ng++] = a->w[i].pid;
    tsp_proc_signal_strays(getpid(), sig, groups, ng);
    free(groups);
    arm_timer(a, a->o.shutdown_timeout);
}

static int live_workers(const tsp_agent_t *a)
{
    int n = 0;
    for (int i = 0; i < a->n; i++)
        n += a->w[i].state == W_RUNNING;
    return n;
}

static void record_failure(tsp_agent_t *a, worker_t *w)
{
    tsp_failure_t *f = &a->fails[a->nfails++];
    tsp__report_clear(f);
    memset(f, 0, sizeof *f);
    f->local_rank = w->local_rank;
    f->rank = tsp_topo_global_rank(&a->o.topo, w->local_rank);
    f->pid = w->pid;
    tsp__report_set_status(f, w->wstatus);
    f->time = w->exit_time;
    snprintf(f->error_file, sizeof f->error_file, "%s", w->error_file);
    tsp__report_read_error_file(f);
}

static void on_worker_exit(tsp_agent_t *a, worker_t *w, int wstatus)
{
    w->state = W_EXITED;
    w->wstatus = wstatus;
    if (w->pidfd >= 0) { /* closing it takes it out of the epoll set */
        close(w->pidfd);
        w->pidfd = -1;
    }
    w->exit_time = now_real();
    int failed = !(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
    /* Exits caused by our own stopping are consequences, not failures; but the node's one
     * document of a stop after a checkpoint on request says so (reason decommission). */
    if (failed && ((a->state == ST_RUNNING && !a->stop_signal) || (a->on_request && !a->nfails)))
        record_failure(a, w);
}

static void reap(tsp_agent_t *a)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            break;
        for (int i = 0; i < a->n; i++)
            if (a->w[i].state == W_RUNNING && a->w[i].pid == pid)
                on_worker_exit(a, &a->w[i], st);
        /* other pids are orphaned descendants that came back to us: reaped, nothing more */
    }
}

static int have_children(void)
{
    siginfo_t si;
    memset(&si, 0, sizeof si);
    /* WNOWAIT: only asks whether a child exists; reap() collects it. */
    return waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) == 0;
}

static void on_signal(tsp_agent_t *a, int sig)
{
    if (sig == SIGUSR1 || sig == SIGUSR2) {
        signal_workers(a, sig); /* what SLURM sends before a time limit: pass it on */
        return;
    }
    if (a->stop_signal || a->state != ST_RUNNING) {
        if (sig == SIGINT || sig == SIGTERM) {
            agent_log(a, "received SIG%s again while stopping: killing all workers now",
                      sigabbrev_np(sig));
            kill_everything(a);
        }
        a->stop_signal = a->stop_signal ? a->stop_signal : sig;
        return;
    }
    a->stop_signal = sig;
    a->on_request = tsp__report_acknowledged(a->o.checkpoint_request, NULL);
    if (!a->on_request && a->o.on_stop_signal)
        a->o.on_stop_signal(a->o.on_stop_signal_ctx, sig);
    agent_log(a, "received SIG%s: stopping %d worker(s) (grace %.1fs before SIGKILL)",
              sigabbrev_np(sig), live_workers(a), a->o.shutdown_timeout);
    begin_stop(a, ST_STOPPING, sig);
}

/* ---- the driver's CHECKPOINT (docs/protocol.md 1.13) ---------------------------------- */

/* Creates the checkpoint request file (first word "grow": the record's reason then, report.h)
 * for torchspark.checkpoint.requested(); one the plugin created first is left as it is. */
static void ask_checkpoint(tsp_agent_t *a)
{
    const char *path = a->o.checkpoint_request;
    if (a->state != ST_RUNNING || a->stop_signal || a->grow_asked)
        return;
    if (!path || !*path) {
        agent_log(a, "the driver asked for a checkpoint now, but this run has no checkpoint "
                     "request file (TORCHSPARK_CHECKPOINT_REQUEST): ignored");
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) {
        agent_log(a, "cannot create the checkpoint request %s: %s", path, strerror(errno));
        return;
    }
    if (fd >= 0) {
        char line[64];
        int n = snprintf(line, sizeof line, "grow %lld\n", (long long)(now_real() * 1000));
        ssize_t w = write(fd, line, (size_t)n);
        close(fd);
        if (w != n) {
            agent_log(a, "cannot write the checkpoint request %s", path);
            return;
        }
    }
    a->grow_asked = 1;
    agent_log(a, "the driver asks for a checkpoint now (the run grows back to more nodes): "
                 "the node stops once its workers acknowledge it");
}

/* After ask_checkpoint: the workers acknowledged the checkpoint (request + ".done"), so the
 * node stops as the plugin stops it (its record: reason grow and the step, report.h). */
static void grow_check(tsp_agent_t *a)
{
    int step = -1;
    if (!a->grow_asked || a->state != ST_RUNNING || a->stop_signal ||
        !tsp__report_acknowledged(a->o.checkpoint_request, &step))
        return;
    a->stop_signal = SIGTERM;
    a->on_request = 1;
    agent_log(a,
              "step %d was checkpointed on request (the run grows back): stopping %d "
              "worker(s)",
              step, live_workers(a));
    begin_stop(a, ST_STOPPING, SIGTERM);
}

/* ---- the loop ---------------------------------------------------------------------- */

static void on_stream_event(tsp_agent_t *a, uint64_t tag)
{
    uint64_t idx = tag - TAG_STREAM0;
    int local = (int)(idx / 2), si = (int)(idx % 2);
    if (local < a->n)
        read_stream(a, &a->w[local], si);
}

static void handle_event(tsp_agent_t *a, uint64_t tag)
{
    if (tag == TAG_SIGNAL) {
        struct signalfd_siginfo ssi;
        while (read(a->sigfd, &ssi, sizeof ssi) == (ssize_t)sizeof ssi)
            if (ssi.ssi_signo != SIGCHLD)
                on_signal(a, (int)ssi.ssi_signo);
        reap(a); /* SIGCHLDs coalesce: always reap everything */
    } else if (tag == TAG_TIMER) {
        uint64_t x;
        if (read(a->timerfd, &x, sizeof x) > 0 && (live_workers(a) || have_children())) {
            agent_log(a,
                      "grace period of %.1fs is over: sending SIGKILL to %d worker(s) and "
                      "their descendants",
                      a->o.shutdown_timeout, live_workers(a));
            kill_everything(a);
        }
    } else if (tag == TAG_STOP) {
        uint64_t v;
        if (read(a->stopfd, &v, sizeof v) == (ssize_t)sizeof v)
            on_signal(a, (int)(v & 0xff));
    } else if (tag == TAG_DUMP) {
        uint64_t v;
        unsigned request = atomic_exchange(&a->dump_request, 0);
        if (read(a->dumpfd, &v, sizeof v) == (ssize_t)sizeof v && request)
            dump_workers(a, request);
        if (atomic_exchange(&a->checkpoint_why, 0) == TSP_WIRE_CHECKPOINT_GROW)
            ask_checkpoint(a);
    } else if (tag == TAG_WAKE) {
        resume_paused(a);
    } else if (tag >= TAG_PIDFD0) {
        reap(a); /* closes the pidfd of the worker that exited */
    } else if (tsp_reports_owns(a->reports, tag)) {
        if (tsp_reports_event(a->reports, tag) == -EAGAIN)
            watch_wake(a, 1);
    } else {
        on_stream_event(a, tag);
    }
}

/* Reads a worker's pipes until their end (EOF: the worker and whatever inherited them are
 * gone), the sink pauses them, or ms have passed: a failed worker's last lines are often
 * still in its pipes when its exit is seen. */
static void read_to_end(tsp_agent_t *a, worker_t *w, int ms)
{
    int64_t until = tsp__now_ms() + ms;
    for (;;) {
        struct pollfd p[2];
        int n = 0, si_of[2];
        for (int si = 0; si < 2; si++)
            if (w->s[si].fd >= 0 && !w->s[si].paused) {
                p[n] = (struct pollfd){.fd = w->s[si].fd, .events = POLLIN};
                si_of[n++] = si;
            }
        int64_t left = until - tsp__now_ms();
        if (n == 0 || left <= 0 || poll(p, (nfds_t)n, (int)left) <= 0)
            return;
        for (int i = 0; i < n; i++)
            if (p[i].revents)
                read_stream(a, w, si_of[i]);
    }
}

/* The root cause's last lines: its worker's tail, "\n"-separated. */
static char *root_tail(tsp_agent_t *a, const tsp_failure_t *root)
{
    for (int i = 0; i < a->n; i++) {
        worker_t *w = &a->w[i];
        if (w->local_rank != root->local_rank)
            continue;
        read_to_end(a, w, 100);
        size_t need =
            tsp__tail_copy(&w->tail, TSP_REPORT_TAIL_LINES, TSP_REPORT_TAIL_LINES, NULL, 0);
        char *t = malloc(need + 1);
        if (t) {
            tsp__tail_copy(&w->tail, TSP_REPORT_TAIL_LINES, TSP_REPORT_TAIL_LINES, t, need + 1);
            t[need] = 0;
            if (need && t[need - 1] == '\n')
                t[need - 1] = 0;
        }
        return t;
    }
    return NULL;
}

/* The run has failed for good: settle the root cause, write the error file and tell the
 * caller, before this node's own teardown (which may take the whole grace period). */
static void report_root(tsp_agent_t *a)
{
    if (a->reported || a->nfails == 0)
        return;
    a->reported = 1;
    a->root = tsp__report_root(a->fails, a->nfails);
    tsp_failure_t *root = &a->fails[a->root];
    if (a->capture && !root->tail)
        root->tail = root_tail(a, root);
    tsp__report_on_request(root, a->o.checkpoint_request);
    int rc = tsp__report_document(root, a->host, a->o.topo.node_rank);
    if (rc)
        agent_log(a, "cannot build the failure report: %s", strerror(-rc));
    else if (a->o.error_file) {
        rc = tsp__report_write_file(a->o.error_file, root);
        if (rc)
            agent_log(a, "cannot write the error file %s: %s", a->o.error_file, strerror(-rc));
    }
    if (a->o.on_failure)
        a->o.on_failure(a->o.on_failure_ctx, &a->fails[a->root]);
}

static void evaluate(tsp_agent_t *a)
{
    if (a->state == ST_RUNNING) {
        if (a->nfails > 0) {
            const tsp_failure_t *f = &a->fails[0];
            if (a->restart_count < a->o.topo.max_restarts && !a->exec_status) {
                agent_log(a,
                          "worker rank %d (local_rank %d, pid %d) failed with exit code %d; "
                          "restarting all workers (restart %d of %d)",
                          f->rank, f->local_rank, (int)f->pid, f->exitcode, a->restart_count + 1,
                          a->o.topo.max_restarts);
                begin_stop(a, ST_RESTART, SIGTERM);
            } else {
                report_root(a);
                begin_stop(a, ST_STOPPING, SIGTERM);
            }
        } else if (live_workers(a) == 0) {
            a->state = ST_FINISHING;
        }
    }
    /* Every worker is gone: what is left are orphans of dead workers. */
    if (a->state != ST_RUNNING && live_workers(a) == 0 && have_children())
        tsp_proc_signal_descendants(getpid(), SIGKILL);
}

/* How long report connections stay open once no worker is left: a worker's last records
 * are in flight for a moment at most (its own socket closes when it exits); what is still
 * open then is another process that must not keep the agent, and the task, alive. */
#define REPORTS_GRACE_MS 2000

static int attempt_over(tsp_agent_t *a)
{
    if (a->state == ST_RUNNING || live_workers(a) > 0 || have_children()) {
        a->reports_until = 0;
        return 0;
    }
    if (tsp_reports_pending(a->reports)) {
        int64_t now = tsp__now_ms();
        if (!a->reports_until)
            a->reports_until = now + REPORTS_GRACE_MS;
        else if (now >= a->reports_until)
            tsp_reports_close_idle(a->reports, REPORTS_GRACE_MS);
    }
    return !output_pending(a);
}

static int start_workers(tsp_agent_t *a)
{
    a->state = ST_RUNNING;
    a->nfails = 0;
    a->killed = 0;
    arm_timer(a, -1);
    struct itimerspec off = {{0, 0}, {0, 0}};
    timerfd_settime(a->timerfd, 0, &off, NULL);
    for (int i = 0; i < a->n; i++) {
        char err[512] = "";
        a->w[i].state = W_IDLE;
        int rc = spawn_worker(a, &a->w[i], err, sizeof err);
        if (rc) {
            agent_log(a, "%s (local_rank %d)", err, i);
            a->exec_status = rc == -ENOENT || rc == -EACCES || rc == -ENOEXEC || rc == -ENOTDIR
                                 ? tsp_proc_exec_status(rc)
                                 : 1;
            begin_stop(a, ST_STOPPING, SIGTERM);
            return rc;
        }
    }
    return 0;
}

int tsp_agent_run(tsp_agent_t *a)
{
    start_workers(a);
    for (;;) {
        evaluate(a);
        if (attempt_over(a)) {
            if (a->state != ST_RESTART)
                break;
            a->restart_count++;
            start_workers(a);
            continue;
        }
        struct epoll_event evs[32];
        /* Supervision is event-driven. While stopping, a 1 s safety tick also reaps and
         * retries paused output, so that no lost wake-up can keep a dead job's agent
         * alive: shutdown must always end. */
        int idle = a->state != ST_RUNNING ? 1000 : a->grow_asked ? 100 : -1;
        int n = epoll_wait(a->epfd, evs, 32, reports_timeout(a, wait_timeout(a, idle)));
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n == 0) {
            reap(a);
            resume_paused(a);
        }
        for (int i = 0; i < n; i++)
            handle_event(a, evs[i].data.u64);
        if (a->linger_until && tsp__now_ms() >= a->linger_until)
            linger_end(a);
        grow_check(a);
    }
    if (a->exec_status)
        return a->exec_status;
    if (a->nfails > 0) {
        report_root(a); /* normally done when the failure was seen: a no-op then */
        FILE *out = fdopen(dup(a->o.log_fd), "w");
        if (out) {
            tsp__report_print(out, a->o.name ? a->o.name : a->o.file, a->host, a->fails, a->nfails,
                              a->root);
            fclose(out);
        }
        return a->fails[a->root].status;
    }
    return a->stop_signal ? tsp_proc_signal_status(a->stop_signal) : 0;
}

const tsp_failure_t *tsp_agent_root_cause(const tsp_agent_t *a)
{
    return a->nfails > 0 ? &a->fails[a->root] : NULL;
}

int tsp_agent_stop_signal(const tsp_agent_t *a)
{
    return a->stop_signal;
}

int tsp_agent_dump(tsp_agent_t *a, unsigned request)
{
    atomic_store(&a->dump_request, request);
    uint64_t one = 1;
    return write(a->dumpfd, &one, sizeof one) == (ssize_t)sizeof one ? 0 : -errno;
}

int tsp_agent_checkpoint(tsp_agent_t *a, int why)
{
    atomic_store(&a->checkpoint_why, why);
    uint64_t one = 1;
    return write(a->dumpfd, &one, sizeof one) == (ssize_t)sizeof one ? 0 : -errno;
}

int tsp_agent_stop(tsp_agent_t *a, int sig)
{
    uint64_t v = (uint64_t)(sig & 0xff);
    return write(a->stopfd, &v, sizeof v) == (ssize_t)sizeof v ? 0 : -errno;
}

/* ---- init / close ------------------------------------------------------------------ */

static int make_log_dir(tsp_agent_t *a)
{
    const char *base = a->o.log_dir;
    if (!base) {
        base = a->o.tmp_dir && *a->o.tmp_dir ? a->o.tmp_dir : "/tmp";
        a->own_log_dir = 1;
    } else {
        int rc = mkdirs(base);
        if (rc)
            return rc;
    }
    if (snprintf(a->log_dir, sizeof a->log_dir, "%s/%s_%s_XXXXXX", base,
                 a->own_log_dir ? "torchspark" : a->o.topo.run_id,
                 a->own_log_dir ? a->o.topo.run_id : "run") >= (int)sizeof a->log_dir)
        return -ENAMETOOLONG;
    for (char *p = a->log_dir + strlen(base) + 1; *p; p++)
        if (*p == '/')
            *p = '_';
    return mkdtemp(a->log_dir) ? 0 : -errno;
}

int tsp_agent_init(tsp_agent_t **out, const tsp_agent_opts_t *o, char *err, size_t errlen)
{
    *out = NULL;
    int rc = tsp_topo_validate(&o->topo, err, errlen);
    if (rc)
        return rc;
    if (!o->file || !o->argv || !o->argv[0]) {
        snprintf(err, errlen, "no program to run");
        return -EINVAL;
    }
    tsp_agent_t *a = calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    a->o = *o;
    a->n = o->topo.nproc_per_node;
    a->epfd = a->sigfd = a->timerfd = a->stopfd = a->dumpfd = -1;
    if (a->o.shutdown_timeout < 0)
        a->o.shutdown_timeout = 30;
    a->w = calloc((size_t)a->n, sizeof *a->w);
    a->fails = calloc((size_t)a->n, sizeof *a->fails);
    if (!a->w || !a->fails) {
        rc = -ENOMEM;
        goto fail;
    }
    for (int i = 0; i < a->n; i++) {
        a->w[i].local_rank = i;
        a->w[i].s[0].fd = a->w[i].s[1].fd = -1;
        a->w[i].pidfd = -1;
        a->w[i].s[0].file_fd = a->w[i].s[1].file_fd = -1;
    }
    /* Worker output always goes through the agent: a worker that wrote to the console
     * itself could join its line with another rank's (under python -u one print is two
     * writes). The agent writes each line whole, with one writev. */
    a->capture = 1;
    if (gethostname(a->host, sizeof a->host - 1) < 0)
        snprintf(a->host, sizeof a->host, "localhost");
    sigset_t set;
    agent_signals(&set);
    if ((a->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        (a->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
        (a->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0 ||
        (a->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
        (a->dumpfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(err, errlen, "cannot set up the event loop: %s", strerror(errno));
        goto fail;
    }
    struct {
        int fd;
        uint64_t tag;
    } regs[] = {{a->sigfd, TAG_SIGNAL},
                {a->timerfd, TAG_TIMER},
                {a->stopfd, TAG_STOP},
                {a->dumpfd, TAG_DUMP}};
    for (size_t i = 0; i < sizeof regs / sizeof regs[0]; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = regs[i].tag};
        if (epoll_ctl(a->epfd, EPOLL_CTL_ADD, regs[i].fd, &ev) < 0) {
            rc = -errno;
            goto fail;
        }
    }
    if ((rc = make_log_dir(a)) != 0) {
        snprintf(err, errlen, "cannot create a log directory under %s: %s",
                 o->log_dir ? o->log_dir : "$TMPDIR", strerror(-rc));
        goto fail;
    }
    /* torchspark.report() needs the channel; without its socket training still runs. */
    if (o->sink && tsp_reports_open(&a->reports, a->epfd, TAG_REPORTS, o->sink, &a->o.topo,
                                    o->tmp_dir, o->log_fd, err, errlen) != 0)
        agent_log(a, "%s: torchspark.report() is off in this run", err);
    *out = a;
    return 0;
fail:
    tsp_agent_close(a);
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void tsp_agent_close(tsp_agent_t *a)
{
    if (!a)
        return;
    for (int i = 0; a->w && i < a->n; i++) {
        if (a->w[i].pidfd >= 0)
            close(a->w[i].pidfd);
        for (int si = 0; si < 2; si++) {
            if (a->w[i].s[si].fd >= 0)
                close(a->w[i].s[si].fd);
            if (a->w[i].s[si].file_fd >= 0)
                close(a->w[i].s[si].file_fd);
            tsp_lines_close(&a->w[i].s[si].lines);
        }
        tsp__tail_free(&a->w[i].tail);
    }
    tsp_reports_close(a->reports);
    int fds[] = {a->epfd, a->sigfd, a->timerfd, a->stopfd, a->dumpfd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (a->own_log_dir && a->log_dir[0])
        nftw(a->log_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    for (int i = 0; a->fails && i < a->n; i++)
        tsp__report_clear(&a->fails[i]);
    free(a->w);
    free(a->fails);
    free(a);
}
