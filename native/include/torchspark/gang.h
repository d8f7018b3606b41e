/* torchspark/gang.h: the gang of a launch without a barrier stage (docs/protocol.md 2.2).
 *
 * With dynamic allocation Spark refuses barrier stages, so an attempt runs as N ordinary
 * tasks that register with the driver before anything trains. This is the driver's decision
 * about them, pure (no sockets, no clock of its own: the caller passes the time): who is
 * admitted, when the gang is complete, when its deadline fails it, and the one sentence of
 * that failure. The rendezvous server (rendezvous.c) holds one for a run; the glues read its
 * state and ask for the sentence with what they saw of Spark's executors.
 *
 * Lifecycle: tsp_gang_new() -> tsp_gang_join()/tsp_gang_state() -> tsp_gang_free().
 */
#ifndef TORCHSPARK_GANG_H
#define TORCHSPARK_GANG_H

#include "torchspark/common.h"
#include "torchspark/rendezvous.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSP_GANG_MAX_NODES 65536
#define TSP_GANG_HOST_MAX 255 /* bytes of a task's host name */

/* tsp_gang_join's results, and tsp_gang_state's. */
#define TSP_GANG_WAIT 0    /* admitted; the gang is not complete yet: wait for GO */
#define TSP_GANG_GO 1      /* complete: every node joined (the join that completed it too) */
#define TSP_GANG_REFUSED 2 /* not admitted (err says why); the gang goes on */
#define TSP_GANG_FAILED 3  /* the gang failed (deadline, or a retry before it formed) */

typedef struct tsp_gang tsp_gang_t;

/* A gang of nnodes (1..TSP_GANG_MAX_NODES) that must be complete by now_ms + timeout_ms
 * (> 0). NULL on a bad argument or out of memory. */
TSP_EXTERN tsp_gang_t *tsp_gang_new(int nnodes, int64_t now_ms, int64_t timeout_ms);
TSP_EXTERN void tsp_gang_free(tsp_gang_t *g);

/* A task of node node_rank (its Spark attemptNumber `try_no`, on host) asks to join at now_ms.
 * TSP_GANG_WAIT or TSP_GANG_GO when admitted; TSP_GANG_REFUSED or TSP_GANG_FAILED (the
 * gang has failed, now or before) with the reply's reason in err (without "ERR "). */
TSP_EXTERN int tsp_gang_join(tsp_gang_t *g, int node_rank, int try_no, const char *host,
                             int64_t now_ms, char *err, size_t errlen);

/* At now_ms: TSP_GANG_WAIT (forming), TSP_GANG_GO (complete) or TSP_GANG_FAILED (sticky:
 * its deadline passed first, or a retry came before it formed). */
TSP_EXTERN int tsp_gang_state(tsp_gang_t *g, int64_t now_ms);
/* A failed gang's short reason, what a waiting or late JOIN is answered ("the gang of N
 * tasks failed: ..."), into err: TSP_GANG_FAILED, or -EINVAL when it has not failed. */
TSP_EXTERN int tsp_gang_reason(const tsp_gang_t *g, char *err, size_t errlen);
/* Nodes admitted so far, and the gang's size. */
TSP_EXTERN int tsp_gang_joined(const tsp_gang_t *g);
TSP_EXTERN int tsp_gang_size(const tsp_gang_t *g);
/* Milliseconds until the deadline from now_ms (0 when passed); -1 once complete or failed. */
TSP_EXTERN int64_t tsp_gang_wait_ms(const tsp_gang_t *g, int64_t now_ms);

/* The failed gang's sentence (docs/protocol.md 2.2) into buf: the tasks that started (node
 * and host), what the glue saw of Spark (executors, cores in all: < 0 unknown) and
 * spark.dynamicAllocation.maxExecutors as the conf says it (NULL or "": unset). Its length,
 * or -EINVAL when the gang has not failed. */
TSP_EXTERN int tsp_gang_failure(const tsp_gang_t *g, int executors, int cores,
                                const char *max_executors, char *buf, size_t len);
/* The failed gang's document, the run's error report (TorchDistributorError.report,
 * docs/protocol.md 2.2): {"version": 2, "kind": "gang", "reason": "gang_incomplete",
 * "message": tsp_gang_failure's sentence}, NUL-terminated into buf. Its length; -EINVAL
 * when the gang has not failed; -ENOSPC when buf is too small. */
TSP_EXTERN int tsp_gang_report(const tsp_gang_t *g, int executors, int cores,
                               const char *max_executors, char *buf, size_t len);

/* How many executors the driver asks Spark for (requestTotalExecutors) so that num_tasks
 * (1..TSP_GANG_MAX_NODES) tasks run at once, from Spark's settings as the conf holds them
 * (NULL: unset): spark.executor.cores / spark.task.cpus tasks per executor (1 when the cores
 * are unset or fewer than a task needs), capped by spark.dynamicAllocation.maxExecutors, and
 * never fewer than the have executors registered now (asking for fewer would release some).
 * The total, or -EINVAL. Golden cases: tests/contracts/gang_ask.json. */
TSP_EXTERN int tsp_gang_ask(int num_tasks, const char *executor_cores, const char *task_cpus,
                            const char *max_executors, int have);

/* The golden contract (tests/contracts/gang.json), a JSON transform as tsp_conf_read: a
 * request {"nnodes", "timeout_ms", "events": [{"at": MS, "join": NODE, "try": T, "host": H}
 * or {"at": MS, "state": true}], "seen": {"executors", "cores", "maxExecutors"}, "end": MS} ->
 * {"replies": [one per event: "WAIT", "GO", "REFUSED: why", "FAILED: why" or the state's name],
 * "state", "failure" (the sentence, or null), "report" (tsp_gang_report's document, or null)}, the
 * state and failure read at "end". 0; -ENOSPC with *needed; -EINVAL with err. */
TSP_EXTERN int tsp_gang_replay(const char *request, size_t len, char *out, size_t outlen,
                               size_t *needed, char *err, size_t errlen);

/* ---- a task's end (native/src/agent/gangclient.c) ------------------------------------ */

/* A task's own wait beyond the gang's timeout, for the driver's answer to come. */
#define TSP_GANG_JOIN_GRACE_MS 30000

/* Joins the gang at the driver's rendezvous host:port as node node_rank, Spark's attempt
 * try_no of its task, on task_host (NULL or "": this host's name, gethostname's: the JOIN's
 * HOST is made of it, docs/protocol.md 2.2), inside the rendezvous' TLS keyed by the run's secret
 * (secret_hex, 64 hex digits: 2.1), and waits up to timeout_ms (the gang's timeout, > 0) plus
 * TSP_GANG_JOIN_GRACE_MS for the reply. 0 with *nnodes
 * (GO); TSP_RDV_REFUSED (2) with the sentence "torchspark: the driver refused node K's task
 * in the gang: REASON" in err (or the driver's TLS refusal: another secret); another -errno
 * with the sentence "torchspark: this task on host H cannot reach the driver's rendezvous at
 * HOST:PORT (why)"; -EINVAL for a bad argument. */
TSP_EXTERN int tsp_gang_call(const char *host, int port, const char *secret_hex, int node_rank,
                             int try_no, const char *task_host, int timeout_ms, int *nnodes,
                             char *err, size_t errlen);

/* tsp_gang_call in slices, for a task that checks between them whether it was killed (the
 * JVM's): the JOIN sent (connected, TLS complete; *out to free with tsp_rdv_call_free, the
 * codes and sentences of tsp_gang_call), then waits of up to timeout_ms each (< 0: until the
 * call's own deadline, start's timeout_ms and the grace): TSP_RDV_PENDING (nothing yet, wait
 * again), or tsp_gang_call's result for node node_rank. */
TSP_EXTERN int tsp_gang_call_start(const char *host, int port, const char *secret_hex,
                                   int node_rank, int try_no, const char *task_host, int timeout_ms,
                                   tsp_rdv_call_t **out, char *err, size_t errlen);
TSP_EXTERN int tsp_gang_call_wait(tsp_rdv_call_t *c, int node_rank, int timeout_ms, int *nnodes,
                                  char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
