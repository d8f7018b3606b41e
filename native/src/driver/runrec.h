/* runrec.h (internal): each attempt's record in the run controller's state (docs/protocol.md
 * section 11, "attempts"): its number, nodes and cause, the controller's, with what the glue
 * reported of it (its clock's start and end, when the root cause was named and Spark's job
 * ended, the silent node and its executor, the nodes lost, the executor excluded), kept by
 * runctl.c so that TorchDistributor.attempts and TorchSparkRunner.attempts() are views of
 * the state rather than each glue's bookkeeping.
 */
#ifndef TSP_RUNREC_H
#define TSP_RUNREC_H

#include <stddef.h>

#include "jreq.h"
#include "json.h"

/* A record's values besides its number and nodes, each as its JSON text (a string decoded),
 * or NULL when not known. */
enum {
    TSP__REC_STARTED,
    TSP__REC_ENDED,
    TSP__REC_CAUSE,
    TSP__REC_ROOT_AT,
    TSP__REC_ENDED_AT,
    TSP__REC_SILENT_NODE,
    TSP__REC_SILENT_EXECUTOR,
    TSP__REC_LOST_NODES,
    TSP__REC_EXCLUDED,
    TSP__REC_N
};

typedef struct {
    long long attempt, nodes;
    char *v[TSP__REC_N];
} tsp__rec_t;

typedef struct {
    tsp__rec_t *recs;
    size_t n;
} tsp__runrec_t;

/* The records of the state (its "attempts", absent or null: none): 0, -EINVAL (not a list the
 * controller wrote: the caller names the state), -ENOMEM. */
int tsp__runrec_read(const tsp_jreq_t *r, tsp__runrec_t *l);

/* A new attempt's record, started at the event's "at" (NULL: not known): 0 or -ENOMEM. */
int tsp__runrec_begin(tsp__runrec_t *l, int attempt, int nodes, const char *at);

/* The last record ended by the event at r (attempt_failed, attempt_succeeded): its "at", and
 * for a failure cause with the event's root_at, ended_at, silent_node, executor and a
 * non-empty lost_nodes. 0, -EINVAL naming the event's key of the wrong kind, -ENOMEM. */
int tsp__runrec_end(tsp__runrec_t *l, const tsp_jreq_t *r, const char *cause);

/* The executor id Spark took out of scheduling after the last attempt: 0 or -ENOMEM. */
int tsp__runrec_excluded(tsp__runrec_t *l, const char *id);

void tsp__runrec_write(tsp_json_writer_t *w, const tsp__runrec_t *l);
void tsp__runrec_free(tsp__runrec_t *l);

#endif
