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
 *
 * The agent's other files: agentinit.c (process setup, init, close), agentout.c (worker
 * output), agentspawn.c (starting a worker); agent_int.h is what they share.
 */
#include "agent.h"
#include "agent_int.h"
#include "dump.h"
#include "logwire.h"
#include "proc.h"
#include "report.h"
#include "reportsock.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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
        (void)tsp__agent_deliver_line(a, w, 1, line, len,
                                      0); /* a full queue loses it: "no marker" */
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
            tsp__agent_log(a, "received SIG%s again while stopping: killing all workers now",
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
    tsp__agent_log(a, "received SIG%s: stopping %d worker(s) (grace %.1fs before SIGKILL)",
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
        tsp__agent_log(a, "the driver asked for a checkpoint now, but this run has no checkpoint "
                          "request file (TORCHSPARK_CHECKPOINT_REQUEST): ignored");
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) {
        tsp__agent_log(a, "cannot create the checkpoint request %s: %s", path, strerror(errno));
        return;
    }
    if (fd >= 0) {
        char line[64];
        int n = snprintf(line, sizeof line, "grow %lld\n", (long long)(now_real() * 1000));
        ssize_t w = write(fd, line, (size_t)n);
        close(fd);
        if (w != n) {
            tsp__agent_log(a, "cannot write the checkpoint request %s", path);
            return;
        }
    }
    a->grow_asked = 1;
    tsp__agent_log(a, "the driver asks for a checkpoint now (the run grows back to more nodes): "
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
    tsp__agent_log(a,
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
        tsp__agent_read_stream(a, &a->w[local], si);
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
            tsp__agent_log(a,
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
        tsp__agent_resume_paused(a);
    } else if (tag >= TAG_PIDFD0) {
        reap(a); /* closes the pidfd of the worker that exited */
    } else if (tsp_reports_owns(a->reports, tag)) {
        if (tsp_reports_event(a->reports, tag) == -EAGAIN)
            tsp__agent_watch_wake(a, 1);
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
                tsp__agent_read_stream(a, w, si_of[i]);
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
        tsp__agent_log(a, "cannot build the failure report: %s", strerror(-rc));
    else if (a->o.error_file) {
        rc = tsp__report_write_file(a->o.error_file, root);
        if (rc)
            tsp__agent_log(a, "cannot write the error file %s: %s", a->o.error_file, strerror(-rc));
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
                tsp__agent_log(a,
                               "worker rank %d (local_rank %d, pid %d) failed with exit code %d; "
                               "restarting all workers (restart %d of %d)",
                               f->rank, f->local_rank, (int)f->pid, f->exitcode,
                               a->restart_count + 1, a->o.topo.max_restarts);
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
    return !tsp__agent_output_pending(a);
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
        int rc = tsp__agent_spawn_worker(a, &a->w[i], err, sizeof err);
        if (rc) {
            tsp__agent_log(a, "%s (local_rank %d)", err, i);
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
        int n = epoll_wait(a->epfd, evs, 32,
                           tsp__agent_reports_timeout(a, tsp__agent_wait_timeout(a, idle)));
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n == 0) {
            reap(a);
            tsp__agent_resume_paused(a);
        }
        for (int i = 0; i < n; i++)
            handle_event(a, evs[i].data.u64);
        if (a->linger_until && tsp__now_ms() >= a->linger_until)
            tsp__agent_linger_end(a);
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
