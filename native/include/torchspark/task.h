/* torchspark/task.h: the task side, written once for both glues.
 *
 * What a barrier or gang task does on the executor once Spark gave it its facts (node rank,
 * hosts, GPUs, attempt id, rank 0's election record): tsp_task_launch turns them into the
 * agent's command line, its environment and the work directory's files; tsp_task_finish
 * turns the agent's exit (its status, its failure document, the output status document) into
 * the task's result: the file it returns through collect(), or its failure. The glues keep
 * what needs Spark and the process plumbing. docs/protocol.md section 12 holds the keys;
 * the golden cases of tests/contracts/task.json hold the contract that pytest and JUnit
 * replay.
 */
#ifndef TORCHSPARK_TASK_H
#define TORCHSPARK_TASK_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The agent's grace for its workers (the plan's shutdown_timeout); whoever stops the agent
 * (tsp_agentproc_stop) waits a second more before its KILL. */
#define TSP_TASK_SHUTDOWN_TIMEOUT_S 5

/* request (len bytes of JSON: the task's facts) -> {"argv", "env", "env_default", "files",
 * "nproc_per_node", "ship", "collect"} written to out (NUL-terminated). 0 on success;
 * -ENOSPC when outlen is too small (*needed, when given, is then the size to retry with);
 * -EINVAL with err naming the key and what it must be; -ENOMEM. Pure: reads no file. */
TSP_EXTERN int tsp_task_launch(const char *request, size_t len, char *out, size_t outlen,
                               size_t *needed, char *err, size_t errlen);

/* request (len bytes of JSON: the agent's exit status, the launch reply's files, ship and
 * collect, where it ran, its output tail) -> {"failure", "result", "missing", "log"} written
 * to out. Reads the work directory's error file and output status document. Errors as
 * tsp_task_launch's. */
TSP_EXTERN int tsp_task_finish(const char *request, size_t len, char *out, size_t outlen,
                               size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
