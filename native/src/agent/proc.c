/* proc.c: fork/exec of one worker, and signalling whole process trees. */
#include "proc.h"
#include "env.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static void proc_close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* The paths to try for file, built before fork (the child may only make
 * async-signal-safe calls: no snprintf, no malloc, whose locks another thread may have held
 * at fork time). file itself when it holds a '/', else each entry of the PATH in the
 * child's environment joined with it, in order (an empty entry is the current directory),
 * as execvp does; execvpe() itself would search the parent's PATH. One allocation, NULL
 * terminated; NULL when out of memory. */
static char **exec_candidates(const char *file, char *const *envp)
{
    const char *path = NULL;
    size_t flen = strlen(file), count = 1, bytes = flen + 1;
    if (!strchr(file, '/')) {
        path = tsp_env_lookup(envp, "PATH");
        if (!path)
            path = "/usr/local/bin:/usr/bin:/bin";
        for (const char *p = path; *p; p++)
            count += *p == ':';
        bytes = strlen(path) + count * (flen + 2);
    }
    char **v = malloc((count + 1) * sizeof *v + bytes);
    if (!v)
        return NULL;
    char *w = (char *)(v + count + 1);
    if (!path) {
        v[0] = memcpy(w, file, flen + 1);
        v[1] = NULL;
        return v;
    }
    size_t k = 0;
    for (const char *p = path;; p++) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        v[k++] = w;
        memcpy(w, p, dlen);
        w += dlen;
        if (dlen)
            *w++ = '/';
        memcpy(w, file, flen + 1);
        w += flen + 1;
        if (!colon)
            break;
        p = colon;
    }
    v[k] = NULL;
    return v;
}

/* In the child: execve each candidate in turn. Returns the errno worth reporting. */
static int child_exec(char *const *candidates, char *const *argv, char *const *envp)
{
    int saved = ENOENT;
    for (size_t i = 0; candidates[i]; i++) {
        execve(candidates[i], argv, envp);
        if (errno == EACCES)
            saved = EACCES; /* like execvp: remember, keep looking */
        else if (errno != ENOENT && errno != ENOTDIR)
            return errno;
    }
    return saved;
}

/* Runs in the child between fork and exec: only async-signal-safe calls. */
static void child_setup(const tsp_proc_opts_t *o, char *const *candidates, int in_r, int out_w,
                        int err_w, int report_fd, pid_t parent)
{
    if (o->fd3 > 0 && report_fd == 3) /* the report pipe must outlive the dup2 onto fd 3 */
        report_fd = fcntl(report_fd, F_DUPFD_CLOEXEC, 4);
    sigset_t none;
    sigemptyset(&none);
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP)
            signal(s, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (o->new_session)
        setsid();
    if (o->pdeathsig) {
        prctl(PR_SET_PDEATHSIG, o->pdeathsig);
        if (getppid() != parent) /* the parent died before prctl took effect */
            _exit(tsp_proc_signal_status(o->pdeathsig));
    }
    if (in_r >= 0 && dup2(in_r, STDIN_FILENO) < 0)
        goto fail;
    if (out_w >= 0 && dup2(out_w, STDOUT_FILENO) < 0)
        goto fail;
    if (err_w >= 0 && dup2(err_w, STDERR_FILENO) < 0)
        goto fail;
    if (o->fd3 == 3 ? fcntl(3, F_SETFD, 0) < 0 : o->fd3 > 0 && dup2(o->fd3, 3) < 0)
        goto fail;
    if (o->cwd && chdir(o->cwd) < 0)
        goto fail;
    errno = child_exec(candidates, o->argv, o->envp ? o->envp : environ);
fail:;
    int e = errno;
    ssize_t w;
    do
        w = write(report_fd, &e, sizeof e);
    while (w < 0 && errno == EINTR);
    _exit(127);
}

int tsp_proc_exec(const char *file, char *const argv[], char *const envp[])
{
    char **candidates = exec_candidates(file, envp ? envp : environ);
    if (!candidates)
        return -ENOMEM;
    int e = child_exec(candidates, argv, envp ? envp : environ);
    free(candidates);
    return -e;
}

int tsp_proc_find(const char *file, char *const envp[])
{
    char **candidates = exec_candidates(file, envp ? envp : environ);
    if (!candidates)
        return -ENOMEM;
    int rc = -ENOENT;
    for (size_t i = 0; candidates[i] && rc; i++) {
        struct stat st;
        if (stat(candidates[i], &st) < 0) {
            if (errno != ENOENT && errno != ENOTDIR)
                rc = -errno;
        } else if (S_ISREG(st.st_mode) && access(candidates[i], X_OK) == 0) {
            rc = 0;
        } else {
            rc = -EACCES; /* like execvp: remember, keep looking */
        }
    }
    free(candidates);
    return rc;
}

static int make_pipe(int fds[2])
{
    if (pipe2(fds, O_CLOEXEC) < 0)
        return -errno;
    return 0;
}

int tsp_proc_spawn(tsp_proc_t *p, const tsp_proc_opts_t *o, char *err, size_t errlen)
{
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, rep[2] = {-1, -1}, in_r = -1;
    int rc = 0;
    char **candidates = NULL;
    p->pid = 0;
    p->out_fd = p->err_fd = -1;
    if ((o->stdout_mode == TSP_PROC_PIPE && (rc = make_pipe(outp))) ||
        (o->stderr_mode == TSP_PROC_PIPE && (rc = make_pipe(errp))) || (rc = make_pipe(rep)))
        goto out;
    if (o->stdin_mode == TSP_PROC_NULL && (in_r = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        rc = -errno;
        goto out;
    }
    int out_w = o->stdout_mode == TSP_PROC_PIPE ? outp[1]
                : o->stdout_mode == TSP_PROC_FD ? o->stdout_fd
                                                : -1;
    int err_w = o->stderr_mode == TSP_PROC_PIPE ? errp[1]
                : o->stderr_mode == TSP_PROC_FD ? o->stderr_fd
                                                : -1;
    candidates = exec_candidates(o->file, o->envp ? o->envp : environ);
    if (!candidates) {
        rc = -ENOMEM;
        goto out;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        rc = -errno;
        goto out;
    }
    if (pid == 0)
        child_setup(o, candidates, o->stdin_mode == TSP_PROC_FD ? o->stdin_fd : in_r, out_w, err_w,
                    rep[1], parent);
    proc_close_fd(&rep[1]);
    int child_errno = 0;
    ssize_t n;
    do
        n = read(rep[0], &child_errno, sizeof child_errno);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof child_errno) {
        /* exec failed: collect the child (it has _exit'ed or is about to) */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        rc = -child_errno;
        if (err && errlen)
            snprintf(err, errlen, "cannot run '%s': %s", o->file, strerror(child_errno));
        goto out;
    }
    p->pid = pid;
    if (outp[0] >= 0) {
        fcntl(outp[0], F_SETFL, O_NONBLOCK);
        p->out_fd = outp[0];
        outp[0] = -1;
    }
    if (errp[0] >= 0) {
        fcntl(errp[0], F_SETFL, O_NONBLOCK);
        p->err_fd = errp[0];
        errp[0] = -1;
    }
out:
    free(candidates);
    proc_close_fd(&in_r);
    proc_close_fd(&outp[0]);
    proc_close_fd(&outp[1]);
    proc_close_fd(&errp[0]);
    proc_close_fd(&errp[1]);
    proc_close_fd(&rep[0]);
    proc_close_fd(&rep[1]);
    if (rc && err && errlen && !err[0])
        snprintf(err, errlen, "cannot start '%s': %s", o->file, strerror(-rc));
    return rc;
}

void tsp_proc_close(tsp_proc_t *p)
{
    proc_close_fd(&p->out_fd);
    proc_close_fd(&p->err_fd);
}

/* The name may hold spaces and parentheses: it runs from the first '(' to the last ')'. */
int tsp_proc_stat(pid_t pid, tsp_proc_stat_t *st)
{
    char path[64], buf[1024];
    *st = (tsp_proc_stat_t){0};
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n;
    do
        n = read(fd, buf, sizeof buf - 1);
    while (n < 0 && errno == EINTR);
    close(fd);
    if (n <= 0)
        return -EIO;
    buf[n] = 0;
    char *lp = strchr(buf, '('), *rp = strrchr(buf, ')');
    int ppid = 0;
    if (!lp || !rp || rp < lp ||
        sscanf(rp + 1,
               " %c %d %*d %*d %*d %*d %u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
               &st->state, &ppid, &st->flags, &st->start) != 4)
        return -EIO;
    size_t len = (size_t)(rp - lp - 1);
    if (len >= sizeof st->comm)
        len = sizeof st->comm - 1;
    memcpy(st->comm, lp + 1, len);
    st->comm[len] = 0;
    st->ppid = (pid_t)ppid;
    return 0;
}

typedef struct {
    pid_t pid, ppid;
} proc_pair_t;

static int by_ppid(const void *x, const void *y)
{
    const proc_pair_t *a = x, *b = y;
    return (a->ppid > b->ppid) - (a->ppid < b->ppid);
}

static int in_groups(pid_t pid, const pid_t *groups, int ngroups)
{
    pid_t g = getpgid(pid);
    for (int i = 0; g > 0 && i < ngroups; i++)
        if (groups[i] == g)
            return 1;
    return 0;
}

int tsp_proc_signal_descendants(pid_t root, int sig)
{
    return tsp_proc_signal_strays(root, sig, NULL, 0);
}

int tsp_proc_signal_strays(pid_t root, int sig, const pid_t *groups, int ngroups)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -errno;
    proc_pair_t *all = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end;
        long v = strtol(de->d_name, &end, 10);
        if (*end || v <= 0)
            continue;
        tsp_proc_stat_t st;
        if (tsp_proc_stat((pid_t)v, &st))
            continue;
        pid_t pp = st.ppid;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            proc_pair_t *na = realloc(all, ncap * sizeof(*na));
            if (!na)
                break;
            all = na;
            cap = ncap;
        }
        all[n++] = (proc_pair_t){(pid_t)v, pp};
    }
    closedir(d);
    /* Breadth-first from root over the pairs sorted by parent: O(n log n) in the number
     * of processes on the machine, so a crowded host does not slow a teardown. */
    if (n == 0) { /* /proc unreadable or empty: nothing to signal */
        free(all);
        return 0;
    }
    qsort(all, n, sizeof *all, by_ppid);
    pid_t *queue = malloc((n + 1) * sizeof *queue);
    if (!queue) {
        free(all);
        return -ENOMEM;
    }
    size_t qlen = 0;
    queue[qlen++] = root;
    for (size_t head = 0; head < qlen; head++) {
        size_t lo = 0, hi = n;
        while (lo < hi) { /* first pair whose parent is queue[head] */
            size_t mid = (lo + hi) / 2;
            if (all[mid].ppid < queue[head])
                lo = mid + 1;
            else
                hi = mid;
        }
        for (; lo < n && all[lo].ppid == queue[head] && qlen <= n; lo++)
            queue[qlen++] = all[lo].pid;
    }
    int count = 0;
    for (size_t i = 1; i < qlen; i++)
        if (!in_groups(queue[i], groups, ngroups) && kill(queue[i], sig) == 0)
            count++;
    free(queue);
    free(all);
    return count;
}

/* The exit-status rule, written once (report.h): every status torchspark reports for a
 * process that a signal ended (a worker, or the agent itself) comes from here. */
int tsp_proc_signal_status(int sig)
{
    return 128 + sig;
}

int tsp_proc_exit_code(int wstatus)
{
    if (WIFEXITED(wstatus))
        return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus))
        return tsp_proc_signal_status(WTERMSIG(wstatus));
    return 1;
}

int tsp_proc_exec_status(int neg_errno)
{
    return neg_errno == -ENOENT || neg_errno == -ENOTDIR ? 127 : 126;
}

/* ---- a call in a child process ------------------------------------------------------ */

/* In the child: the answer is the status, then out, in one write (a pipe takes up to
 * PIPE_BUF atomically; longer answers are written in pieces, read whole by the parent). */
static __attribute__((noreturn)) void isolated_child(tsp_proc_isolated_fn fn, void *ctx, void *out,
                                                     size_t len, int fd)
{
    memset(out, 0, len);
    int st = fn(ctx, out, len);
    const char *parts[2] = {(const char *)&st, out};
    size_t lens[2] = {sizeof st, len};
    for (int i = 0; i < 2; i++)
        for (size_t off = 0; off < lens[i];) {
            ssize_t n = write(fd, parts[i] + off, lens[i] - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                _exit(1);
            off += (size_t)n;
        }
    _exit(0);
}

int tsp_proc_isolate(tsp_proc_isolated_fn fn, void *ctx, void *out, size_t len, int timeout_ms,
                     int *status)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        return -e;
    }
    if (pid == 0) {
        close(p[0]);
        isolated_child(fn, ctx, out, len, p[1]);
    }
    close(p[1]);
    int st = 0, rc = 0;
    size_t want = sizeof st + len, got = 0;
    int64_t deadline = tsp__now_ms() + timeout_ms;
    while (got < want) {
        int64_t left = deadline - tsp__now_ms();
        struct pollfd pf = {p[0], POLLIN, 0};
        int n = left > 0 ? poll(&pf, 1, left > 60000 ? 60000 : (int)left) : 0;
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 && left <= 0) {
            rc = -ETIMEDOUT;
            kill(pid, SIGKILL);
            break;
        }
        if (n <= 0)
            continue;
        char *dst = got < sizeof st ? (char *)&st + got : (char *)out + (got - sizeof st);
        size_t room = got < sizeof st ? sizeof st - got : want - got;
        ssize_t r = read(p[0], dst, room);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = -ECHILD; /* the child ended without its whole answer */
            break;
        }
        got += (size_t)r;
    }
    close(p[0]);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    *status = rc == -ECHILD ? ws : st;
    return rc;
}
