/* torchspark/agentproc.h: the node's torchspark-run agent as a glue starts it, written once
 * for both glues (docs/protocol.md 12.1).
 *
 * A barrier or gang task (and local mode's one node on the driver) starts the agent that
 * tsp_task_launch planned, hands it the driver channel's secret on its standard input, drains
 * its stdout and stderr into a tail of TSP_AGENTPROC_TAIL_LINES lines (echoed to this
 * process's stderr, handed to the caller where it asks), waits for it in slices so that the
 * glue can look at Spark's kill flag between them, stops it (TERM, the agent's grace plus a
 * second, KILL) and turns its exit into the task's result through tsp_task_finish.
 *
 * Lifecycle: tsp_agentproc_start() (allocated, the agent running), tsp_agentproc_wait() until
 * its reply's "done" is not null, tsp_agentproc_close() (stops the agent when it still runs,
 * closes, frees). Not thread-safe: one thread drives a handle. The agent is forked from the
 * calling thread (its parent-death signal follows the thread that forked: a JVM's task
 * thread), in the caller's session and process group (a signal to that group reaches it
 * too), with an empty signal mask and default dispositions.
 */
#ifndef TORCHSPARK_AGENTPROC_H
#define TORCHSPARK_AGENTPROC_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSP_AGENTPROC_TAIL_LINES 100        /* the agent's last lines kept for the result */
#define TSP_AGENTPROC_TAIL_BYTES (1u << 20) /* ... and their bytes at most */
#define TSP_AGENTPROC_DRAIN_MS 5000         /* after its exit, how long its pipes may stay open */

typedef struct tsp_agentproc tsp_agentproc_t;

/* request (len bytes of JSON): {"plan": tsp_task_launch's reply (argv, env, env_default,
 * finish), "secret": the channel's secret as hex or null, "host": this host's name for the
 * result (absent or null: gethostname's, "?" when it has none), "echo": bool (default false; true:
 * every line to fd 2), "hand": "none" (default), "stderr" or "all" (the lines wait's replies
 * carry), "environ": the caller's environment as its glue sees it (an object of strings; absent:
 * this process's environ)}. Starts the agent: its environment is env_default, then the caller's,
 * then env, with TORCHSPARK_PARENT_PID, without TORCHSPARK_LOG_SECRET, and with
 * TORCHSPARK_LOG_SECRET_FD=0 when there is a secret (else its stdin is /dev/null). NULL with a
 * sentence in err (a bad request, or the exec's errno: "cannot run '<argv[0]>': ..."). */
TSP_EXTERN tsp_agentproc_t *tsp_agentproc_start(const char *request, size_t len, char *err,
                                                size_t errlen);

/* request {"timeout_ms": N} (default 100; -1: until done) -> {"lines": [...], "status": null
 * or the exit status (the code, or -N for signal N), "done": null, or once the agent exited
 * and its pipes ended (or TSP_AGENTPROC_DRAIN_MS later), tsp_task_finish's reply to the
 * plan's finish with status, host and the tail}. Returns early when a line to hand came.
 * Errors and the buffer rule as tsp_task_finish's; a reply that did not fit is kept and
 * given whole by the next call. */
TSP_EXTERN int tsp_agentproc_wait(tsp_agentproc_t *a, const char *request, size_t len, char *out,
                                  size_t outlen, size_t *needed, char *err, size_t errlen);

/* TERM, then KILL when the agent has not exited TSP_TASK_SHUTDOWN_TIMEOUT_S + 1 s later (its
 * output drained meanwhile); reaps it. A no-op once it exited. */
TSP_EXTERN void tsp_agentproc_stop(tsp_agentproc_t *a);

/* Stops the agent when it still runs, closes the pipes, frees a (NULL: nothing). */
TSP_EXTERN void tsp_agentproc_close(tsp_agentproc_t *a);

#ifdef __cplusplus
}
#endif
#endif
