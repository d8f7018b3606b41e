/* torchspark/runctl.h: the run controller, the driver's decisions written once for both glues.
 *
 * A pure step function (no threads, sockets, clocks or Spark): the controller's state and one
 * event that a glue observed (the run started, an attempt failed or succeeded, an executor
 * was excluded, the free slots were counted) -> the next state and the actions the glue
 * performs (submit an attempt of N nodes with its environment, count the free slots, exclude
 * an executor, warn, raise, return). It owns the restart policy, elastic min_nodes, the
 * replacement wait, attempt numbering, the training processes' TORCHSPARK_ATTEMPT /
 * TORCHSPARK_MAX_RESTARTS / TORCHSPARK_RESTART_CAUSE and the final history of causes. The
 * wire format is docs/protocol.md section 11; tests/contracts/runctl.json holds the contract
 * that pytest and JUnit replay.
 */
#ifndef TORCHSPARK_RUNCTL_H
#define TORCHSPARK_RUNCTL_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* request (len bytes of JSON: {"state": the last reply's state, or null before "start";
 * "event": {"event": name, ...}}) -> {"state": ..., "actions": [{"do": name, ...}]} written
 * to out (NUL-terminated). 0 on success; -ENOSPC when outlen is too small (*needed, when
 * given, is then the size to retry with); -EINVAL with err naming the key or the event and
 * what it must be (bad settings included); -ENOMEM. */
TSP_EXTERN int tsp_runctl_step(const char *request, size_t len, char *out, size_t outlen,
                               size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
