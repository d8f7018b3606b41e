/* torchspark/hang.h: the hang doctor's analysis, once for both glues.
 *
 * The glue's watchdog asks every agent for its workers' Python stacks (DUMP, docs/
 * protocol.md 1.9) and collects each rank's lines from its dump marker on; this pure
 * function reads them (cut lines made whole, threads, frames, flight recorders), names the
 * stuck rank(s), groups the others by where they wait, and writes the diagnosis as JSON:
 * the one line to print, the culprits, the groups, and every rank's stacks (docs/
 * protocol.md 1.11 holds both documents). No glue parses the dumps nor the line. The golden
 * cases of tests/contracts/hang.json hold the contract: pytest and JUnit replay them.
 */
#ifndef TORCHSPARK_HANG_H
#define TORCHSPARK_HANG_H

#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* request (len bytes of JSON: {"world", "request", "stdlib", "read_sources", "ranks"}) ->
 * the diagnosis as JSON written to out (NUL-terminated). 0 on success; -ENOSPC when outlen
 * is too small (*needed, when given, is then the size to retry with); -EINVAL with err
 * naming the key and what it must be; -ENOMEM. */
TSP_EXTERN int tsp_hang_diagnose(const char *request, size_t len, char *out, size_t outlen,
                                 size_t *needed, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
