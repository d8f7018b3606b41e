/* agent_int.h (internal): what the node agent's files share: the agent's state (struct
 * tsp_agent, its workers and their streams), the epoll tags, the output linger, and the
 * functions one file calls in another. The files: agent.c (the supervision loop: stopping,
 * signals, the driver's DUMP and CHECKPOINT, the run), agentinit.c (process setup, init,
 * close), agentout.c (worker output and the agent's own messages), agentspawn.c (starting a
 * worker). */
#ifndef TSP_AGENT_INT_H
#define TSP_AGENT_INT_H

#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agentopts.h"
#include "lines.h"
#include "logtail.h"
#include "report.h"
#include "reportsock.h"

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

/* ---- agentout.c ---- */

/* One message of the agent's own to its log fd, behind its prefix. */
__attribute__((format(printf, 2, 3))) void tsp__agent_log(const tsp_agent_t *a, const char *fmt,
                                                          ...);
/* One line to the console, the redirect file and the sink: 0, or -EAGAIN (sink full). */
int tsp__agent_deliver_line(tsp_agent_t *a, worker_t *w, int si, const char *data, size_t len,
                            unsigned flags);
/* Puts a worker's stream in the epoll set (on) or takes it out. */
void tsp__agent_stream_watch(tsp_agent_t *a, worker_t *w, int si, int on);
/* Watches the sink's wake fd (on) while output waits for room, or stops watching it. */
void tsp__agent_watch_wake(tsp_agent_t *a, int on);
/* The linger deadline passed: every lingering stream goes back into epoll. */
void tsp__agent_linger_end(tsp_agent_t *a);
/* epoll_wait's timeout: the loop's own, shortened to the linger deadline. */
int tsp__agent_wait_timeout(const tsp_agent_t *a, int timeout);
/* The same, shortened to the end of the report connections' grace. */
int tsp__agent_reports_timeout(const tsp_agent_t *a, int timeout);
/* Reads a worker's readable stream and delivers its complete lines. */
void tsp__agent_read_stream(tsp_agent_t *a, worker_t *w, int si);
/* Delivers paused output again (streams and report connections) once the sink has room. */
void tsp__agent_resume_paused(tsp_agent_t *a);
/* 1 while a stream is open or paused or a report connection has something pending. */
int tsp__agent_output_pending(const tsp_agent_t *a);

/* ---- agentspawn.c ---- */

/* Creates a directory and its parents (mode 0700): 0 or -errno. */
int tsp__agent_mkdirs(const char *path);
/* Starts one worker of this attempt, its streams watched: 0, or -errno with a sentence in
 * err. */
int tsp__agent_spawn_worker(tsp_agent_t *a, worker_t *w, char *err, size_t errlen);

#endif
