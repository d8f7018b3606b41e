/* torchspark/shape.h: the run's shape, decided once for both glues (docs/protocol.md 11.1).
 *
 * How many tasks (nodes) a run has and how many training processes each runs, from the
 * user's numbers and Spark's GPU settings as the conf holds them; each product (the PySpark
 * glue's TorchDistributor, the JVM's TorchSparkRunner) keeps its own API's rules and words.
 * Pure: golden cases in tests/contracts/shape.json, replayed by pytest and JUnit.
 */
#ifndef TORCHSPARK_SHAPE_H
#define TORCHSPARK_SHAPE_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* request (len bytes of JSON: product, num_processes, nproc_per_node, use_gpu, local_mode,
 * task_gpu_amount, driver_gpu_amount, driver_gpu) -> {"tasks", "processes", "per_task",
 * "warning"} written to out (NUL-terminated). 0 on success; -ENOSPC when outlen is too small
 * (*needed, when given, is then the size to retry with); -EINVAL with err the sentence the
 * glue raises (a bad setting, processes that do not divide into tasks, no driver GPU);
 * -ENOMEM. */
TSP_EXTERN int tsp_shape_plan(const char *request, size_t len, char *out, size_t outlen,
                              size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
