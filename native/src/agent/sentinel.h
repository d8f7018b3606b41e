/* sentinel.h (internal): the process that sweeps an agent's job after the agent is gone.
 *
 * An agent killed with SIGKILL cannot stop anything: its workers die of their parent-death
 * signal, but what they started (children that ignore SIGTERM, daemons that left for a
 * session of their own) is adopted by init and lives on. The sentinel is a small process,
 * detached from the agent's tree, that waits on a pipe only the agent holds; when the
 * agent exits (however it ends) it kills, with SIGKILL, every process that carries the
 * job's token in its environment and everything descended from those, until none is left,
 * and exits. Process-wide: one sentinel per agent process (docs/architecture.md).
 */
#ifndef TSP_SENTINEL_H
#define TSP_SENTINEL_H

/* The variable every worker carries ("TORCHSPARK_JOB_TOKEN"), inherited by its children. */
#define TSP_SENTINEL_VAR "TORCHSPARK_JOB_TOKEN"

/* Starts the sentinel once per process (later calls do nothing). Must run before the
 * process makes itself a child subreaper, or the sentinel would come back to it as a
 * child. 0, or -errno (the job then runs without a sentinel). */
int tsp__sentinel_start(void);
/* The token (32 hex digits) to put in every worker's environment under TSP_SENTINEL_VAR,
 * or NULL when no sentinel runs. */
const char *tsp__sentinel_token(void);
/* The sweep itself, used by the sentinel and by tests: SIGKILLs every process (but the
 * caller) whose environment holds TSP_SENTINEL_VAR=token, and their descendants, until a
 * scan of /proc finds none alive. Async-signal-safe (raw system calls, no allocation
 * beyond one mmap). Returns how many processes were signalled, or -errno. */
int tsp__sentinel_sweep(const char *token);

#endif
