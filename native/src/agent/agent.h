/* agent.h (internal): the torchrun-equivalent node agent.
 *
 * The agent starts nproc_per_node workers and supervises them, event-driven (signalfd,
 * timerfd, epoll; no polling sleeps): worker output is read line by line and handed to
 * the console, to log files and to an optional sink (the driver's log channel); signals
 * are forwarded to every worker's process group; the first failure stops the others
 * (SIGTERM, a grace period, SIGKILL), orphaned grandchildren included; workers are
 * restarted up to max_restarts times; the root cause is reported in torchrun's
 * ChildFailedError layout and as JSON.
 *
 * Lifecycle of a tsp_agent_t (opaque): tsp_agent_setup_process() once per process, then
 * tsp_agent_init() allocates and validates, tsp_agent_run() starts the workers and blocks
 * until every process is gone (start and wait in one call; an agent runs once),
 * tsp_agent_close() frees. tsp_agent_stop() may be called meanwhile from another thread
 * or a signal handler; it asks the running agent to stop its workers.
 */
#ifndef TSP_AGENT_H
#define TSP_AGENT_H

#include <sys/types.h>
#include "torchspark/common.h"
#include "lines.h"
#include "report.h"
#include "topo.h"
#include "agentopts.h" /* tsp_agent_opts_t, tsp_agent_t */

/* Process-wide state that an agent needs, set in this one place: starts the process's
 * sentinel (native/src/agent/sentinel.h: after this process exits, however it ends, every process
 * of its jobs is killed; workers carry TORCHSPARK_JOB_TOKEN for it), blocks the signals the
 * agent receives through signalfd (CHLD, TERM, INT, HUP, QUIT, USR1, USR2), ignores
 * SIGPIPE, makes the process a child subreaper (orphaned grandchildren come back to us
 * to be killed and reaped), and, when pdeathsig is not 0, asks for that signal when the
 * parent dies. Returns -ESRCH when the parent already died (expected_ppid given). */
int tsp_agent_setup_process(int pdeathsig, pid_t expected_ppid);

/* Blocks, in the calling thread, the signals the agent reads through its signalfd. A
 * process-directed SIGCHLD goes to any thread that does not block it, and a thread that
 * takes it discards it (its disposition is the default): the signalfd never sees it. Every
 * thread inherits its creator's mask, so a program that runs an agent calls this first
 * thing in main, before any library can start a thread (the CUDA driver starts one in
 * cuInit, NCCL several); tsp_agent_setup_process calls it again. 0 or -errno.
 * The agent also watches each worker through a pidfd, so a worker's exit is seen even when
 * a thread started before this call took its SIGCHLD (docs/architecture.md, "Signals"). */
int tsp_agent_block_signals(void);

/* Allocates and validates. 0, or -errno with a sentence in err. */
int tsp_agent_init(tsp_agent_t **agent, const tsp_agent_opts_t *opts, char *err, size_t errlen);
/* Starts the workers and supervises them until every process is gone. Returns the exit
 * status: 0 on success, the root-cause worker's exit code or 128+signal on failure,
 * 128+signal when the agent was stopped by a signal, 127/126 when the program cannot be
 * run; a negative errno when the agent itself failed. */
int tsp_agent_run(tsp_agent_t *agent);
/* Asks a running agent to stop its workers (as if it received sig). Async-signal-safe. */
int tsp_agent_stop(tsp_agent_t *agent, int sig);
/* Asks a running agent for its workers' Python stacks (the hang doctor's DUMP number
 * request, docs/protocol.md 1.9): a marker line per running worker, then SIGRTMIN+8 to each
 * that can answer. From any thread; async-signal-safe. */
int tsp_agent_dump(tsp_agent_t *agent, unsigned request);
/* Asks a running agent's workers to checkpoint now and then stops the node (the driver's
 * CHECKPOINT, docs/protocol.md 1.13; why: TSP_WIRE_CHECKPOINT_GROW): the checkpoint request
 * file says "grow", and once the workers acknowledge, the agent stops them as a SIGTERM
 * would. From any thread; async-signal-safe. */
int tsp_agent_checkpoint(tsp_agent_t *agent, int why);
/* The root cause after a failed run, or NULL. */
const tsp_failure_t *tsp_agent_root_cause(const tsp_agent_t *agent);
/* The signal that stopped the run (received, or asked for with tsp_agent_stop), 0 when
 * none did. */
int tsp_agent_stop_signal(const tsp_agent_t *agent);
void tsp_agent_close(tsp_agent_t *agent);

#endif
