/* torchspark/failure.h: the failure, written once for both glues.
 *
 * The agent writes a failed run's root cause as a failure document (docs/protocol.md §8:
 * torchelastic's error-file layout plus a "torchspark" object with the one-line summary,
 * "rank 1 (node 0, local rank 1) on host h exited with code 1"). A glue finishes that
 * document where it has more to add (the agent's exit status when the agent left no
 * document, the failing rank's last lines) and turns it into its exception's message
 * through tsp_failure_report, so that each sentence of a failure has one writer. The golden
 * cases of tests/contracts/failure.json hold the contract: pytest and JUnit reproduce every
 * one through their binding.
 */
#ifndef TORCHSPARK_FAILURE_H
#define TORCHSPARK_FAILURE_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* request (len bytes of JSON, the keys of docs/protocol.md §8) -> {"document": the finished
 * failure document, "message": the exception's message or null} written to out
 * (NUL-terminated). 0 on success; -ENOSPC when outlen is too small (*needed, when given, is
 * then the size to retry with); -EINVAL with err naming the key and what it must be when the
 * request is malformed; -ENOMEM. */
TSP_EXTERN int tsp_failure_report(const char *request, size_t len, char *out, size_t outlen,
                                  size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
