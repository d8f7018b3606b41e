/* agentspawn.c: starting one of the node agent's workers: its attempt's directory and
 * error file, its environment (topology, sentinel token, report socket), its argv with
 * torchrun's "$local_rank" substitution (through the warm pool's shim when there is one),
 * its redirect files, its pipes in the agent's epoll set and its exit watched by a pidfd. */
#include "agent_int.h"
#include "env.h"
#include "proc.h"
#include "sentinel.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

/* ---- spawning ---------------------------------------------------------------------- */

int tsp__agent_mkdirs(const char *path)
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

int tsp__agent_spawn_worker(tsp_agent_t *a, worker_t *w, char *err, size_t errlen)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/attempt_%d/%d", a->log_dir, a->restart_count, w->local_rank);
    int rc = tsp__agent_mkdirs(dir);
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
                    tsp__agent_stream_watch(a, w, si, 1);
                }
            }
        }
    }
    free_argv(argv);
    tsp_env_close(&env);
    return rc;
}
