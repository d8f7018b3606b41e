/* proc.h (internal): starting one worker process and killing whole process trees.
 *
 * A spawned child runs in a new session (its own process group, as torchrun's
 * start_new_session), with an empty signal mask and default dispositions, an optional
 * parent-death signal, and the errno of a failed exec sent back to the parent through
 * a close-on-exec pipe, so spawn fails with that errno instead of a child exiting 127.
 */
#ifndef TSP_PROC_H
#define TSP_PROC_H

#include <sys/types.h>
#include "torchspark/common.h"

enum { TSP_PROC_INHERIT = 0, TSP_PROC_PIPE = 1, TSP_PROC_FD = 2, TSP_PROC_NULL = 3 };

typedef struct tsp_proc_opts {
    const char *file;  /* program; searched in PATH (of envp) when it has no '/' */
    char *const *argv; /* NULL-terminated */
    char *const *envp; /* NULL-terminated; NULL: the caller's environ */
    const char *cwd;   /* NULL: unchanged */
    int stdin_mode;    /* TSP_PROC_INHERIT, TSP_PROC_NULL (/dev/null) or TSP_PROC_FD */
    int stdout_mode;   /* TSP_PROC_* but TSP_PROC_NULL */
    int stderr_mode;
    int stdin_fd;  /* with TSP_PROC_FD (the caller's: never closed here) */
    int stdout_fd; /* with TSP_PROC_FD */
    int stderr_fd;
    int pdeathsig;   /* 0: none */
    int new_session; /* 1: setsid() in the child */
    int fd3;         /* > 0: this fd becomes the child's fd 3, open across exec; 0: none */
} tsp_proc_opts_t;

typedef struct tsp_proc {
    pid_t pid;  /* 0 when not running */
    int out_fd; /* read end of the stdout pipe, or -1 */
    int err_fd; /* read end of the stderr pipe, or -1 */
} tsp_proc_t;

/* Starts a process. 0, or -errno: -ENOENT (not found), -EACCES (not executable) and
 * others from the child's execve; err then holds "cannot run '<file>': <reason>".
 * Pipe read ends are non-blocking and close-on-exec. */
int tsp_proc_spawn(tsp_proc_t *p, const tsp_proc_opts_t *o, char *err, size_t errlen);
/* Replaces this process with file (searched in the PATH of envp as tsp_proc_spawn does;
 * envp NULL: environ). Returns only on failure: -errno (-ENOENT, -EACCES, ...). */
int tsp_proc_exec(const char *file, char *const argv[], char *const envp[]);
/* Whether file (searched as tsp_proc_exec does) names an executable regular file: 0, or
 * the errno exec would most likely fail with (-ENOENT, -EACCES, ...). For a caller that
 * execs it later in another process and must report a failure before (the warm shim). */
int tsp_proc_find(const char *file, char *const envp[]);
/* Closes the pipe ends; does not wait or kill. */
void tsp_proc_close(tsp_proc_t *p);

/* A process's fields of /proc/<pid>/stat: its name (comm, at most 15 bytes), state, parent,
 * flags (the kernel's PF_*: PF_EXITING is 0x4) and start time (clock ticks after boot: with
 * the pid, it names the process even once the pid is reused). */
typedef struct tsp_proc_stat {
    char comm[16];
    char state;
    pid_t ppid;
    unsigned flags;
    unsigned long long start;
} tsp_proc_stat_t;
/* Reads pid's stat into st: 0, -errno of the open (-ENOENT: gone) or -EIO (unparsable). */
int tsp_proc_stat(pid_t pid, tsp_proc_stat_t *st);
/* Sends sig to every process whose parent chain leads to root (root excluded), found by
 * reading /proc. Returns how many were signalled. */
int tsp_proc_signal_descendants(pid_t root, int sig);
/* The same, leaving out the processes of the given process groups (those the caller
 * signalled as groups already: a process signalled twice runs its handler twice). */
int tsp_proc_signal_strays(pid_t root, int sig, const pid_t *groups, int ngroups);
/* The shell's status of a process ended by signal sig: 128 + sig. Async-signal-safe. */
int tsp_proc_signal_status(int sig);
/* The shell's exit status of a wait status: the exit code, or 128 + signal number. */
int tsp_proc_exit_code(int wstatus);
/* The shell's status for an exec errno: 127 for not found, 126 otherwise. */
int tsp_proc_exec_status(int neg_errno);

/* What tsp_proc_isolate runs in its child: fills out (len bytes, zeroed) and returns a
 * status that comes back to the caller. */
typedef int (*tsp_proc_isolated_fn)(void *ctx, void *out, size_t len);
/* Runs fn in a forked child (no exec) and copies its out and status back, so that what fn
 * loads (the NVML or CUDA driver library, with the threads and memory it keeps) never enters
 * this process. Only for a single-threaded caller (the agent before its log channel and
 * sentinel start). 0 with *status set; -ETIMEDOUT when the child does not answer within
 * timeout_ms (it is then SIGKILLed and reaped); -ECHILD when it died without answering
 * (*status is then its wait status); -errno for fork and pipe failures. */
int tsp_proc_isolate(tsp_proc_isolated_fn fn, void *ctx, void *out, size_t len, int timeout_ms,
                     int *status);

#endif
