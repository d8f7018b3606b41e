/* reason.h (internal): why a run failed, and what to do about it: the one table of
 * failure reasons (docs/protocol.md section 8, "reason") and the advice of each, written
 * once. A root record (the failure document's torchspark.reason) names its reason; the
 * exception's "To fix it" sentence comes from here, so that a failure of the NCCL check
 * never blames the training code and a lost node never asks for a code change.
 */
#ifndef TSP_REASON_H
#define TSP_REASON_H

#include <stdio.h>

typedef struct {
    const char *name;   /* the document's torchspark.reason */
    const char *advice; /* "To fix it: ..." without the words; {host}, {went} filled in */
    int shows_tail;     /* whether "X printed nothing." says anything for this reason */
    int restartable;    /* whether running again as it is may help (not a code/setup error) */
} tsp_reason_t;

/* The reason of that name, or NULL when the name is not in the table (an unknown reason
 * from a newer agent: the caller falls back to its own). */
const tsp_reason_t *tsp__reason_find(const char *name);
/* Writes "To fix it: <advice>" for reason r, {host} and {went} replaced (NULL: "?" and
 * "the driver's stderr"). */
void tsp__reason_advise(FILE *out, const tsp_reason_t *r, const char *host, const char *went);

#endif
