/* agentinit.c: the node agent's setup and teardown: the process-wide state an agent needs
 * (the signals it reads through its signalfd blocked, the sentinel, the subreaper, the parent
 * death signal), tsp_agent_init (the event loop's fds, the log directory, the report socket)
 * and tsp_agent_close (every fd, the temporary log directory, the failure records). */
#include "agent.h"
#include "agent_int.h"
#include "sentinel.h"

#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

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
/* ---- init / close ------------------------------------------------------------------ */

static int make_log_dir(tsp_agent_t *a)
{
    const char *base = a->o.log_dir;
    if (!base) {
        base = a->o.tmp_dir && *a->o.tmp_dir ? a->o.tmp_dir : "/tmp";
        a->own_log_dir = 1;
    } else {
        int rc = tsp__agent_mkdirs(base);
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
        tsp__agent_log(a, "%s: torchspark.report() is off in this run", err);
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
