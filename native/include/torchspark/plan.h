/* torchspark/plan.h: the node plan, once for both glues.
 *
 * A node plan is what one node's agent is asked to run, as the Spark glues decide it (the
 * PySpark task, local mode, the JVM's NodeTask): a JSON object whose keys are documented in
 * docs/protocol.md §7. tsp_plan_argv turns it into the agent's options, so that the
 * command line is built in one place; the glue appends the program (["-m", module, ...] or
 * [script, ...]) after them. The golden cases of tests/contracts/plan_argv.json hold the
 * contract: pytest and JUnit reproduce every one through their binding.
 */
#ifndef TORCHSPARK_PLAN_H
#define TORCHSPARK_PLAN_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* plan (len bytes of JSON) -> the agent's argv up to the program, as a JSON array of strings
 * written to out (NUL-terminated). 0 on success; -ENOSPC when outlen is too small (*needed,
 * when given, is then the size to retry with); -EINVAL with err naming the key and what it
 * must be when the plan is malformed; -ENOMEM. */
TSP_EXTERN int tsp_plan_argv(const char *plan, size_t len, char *out, size_t outlen, size_t *needed,
                             char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
