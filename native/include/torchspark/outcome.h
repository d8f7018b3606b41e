/* torchspark/outcome.h: a failed run's outcome, classified once for both glues.
 *
 * What a glue observed when a run failed (the log server's root record, Spark's failure
 * text) -> one structured outcome: its kind and reason (docs/protocol.md section 8), whether
 * running again may help, the node lost and its executor when known, whether that executor
 * should be taken out of scheduling, the one-line cause and the reason's advice. One ordered
 * table (docs/protocol.md section 10): structured records first, Spark's own failure text
 * only as the last resort, and nowhere else. The golden cases of tests/contracts/outcome.json
 * hold the contract: pytest and JUnit reproduce every one through their binding.
 */
#ifndef TORCHSPARK_OUTCOME_H
#define TORCHSPARK_OUTCOME_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* request (len bytes of JSON: {"root": the log server's root record or null,
 * "spark_error": Spark's failure text or null}; with "product", "mode" and "nproc_per_node",
 * the reply also says what the glue raises: a message and report, or the tsp_failure_report
 * request that finishes a failure document) -> the outcome (docs/protocol.md section 10)
 * written to out (NUL-terminated). 0 on success; -ENOSPC when outlen is too small (*needed,
 * when given, is then the size to retry with); -EINVAL with err naming the key and what it
 * must be when the request is malformed; -ENOMEM. */
TSP_EXTERN int tsp_outcome_classify(const char *request, size_t len, char *out, size_t outlen,
                                    size_t *needed, char *err, size_t errlen);

/* Where a run succeeded but rank 0's value did not arrive over the output channel: request
 * ({"product", "mode", "error": why the transfer failed, "rows": the job's rows hold it,
 * "quiet"}) -> {"raise": the glue's error or null, "warn": its warning or null}
 * (docs/protocol.md 10.1; golden cases tests/contracts/result.json), with the errors and
 * buffer sizes of tsp_outcome_classify. */
TSP_EXTERN int tsp_result_check(const char *request, size_t len, char *out, size_t outlen,
                                size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
