/* reportagg.h (internal): the driver's report budget (docs/distributor.md, "Reports at
 * scale"; docs/protocol.md 1.8): between the report queue and the host language, every
 * rank's reports pass as they are while the job stays within a budget of records a second;
 * beyond it a rank's reports are folded into one record per interval (the last values,
 * and a summary: count, first time, min, max, mean of each metric). */
#ifndef TSP_REPORTAGG_H
#define TSP_REPORTAGG_H

#include <stddef.h>
#include <stdint.h>

#include "logqueue.h"

/* The budget (TSP_REPORT_BUDGET by default, torchspark/logserver.h): records a second,
 * job-wide, handed on as they are; each rank's share is the budget divided among the ranks
 * that reported so far, with a second of it as a burst. */

struct tsp__ragg_rank;

typedef struct tsp__ragg_out {
    char *data;
    uint32_t len;
    int32_t rank;
    uint8_t flags;
} tsp__ragg_out_t;

typedef struct tsp__ragg {
    double budget;                /* records a second, job-wide; <= 0: every record as it is */
    struct tsp__ragg_rank *ranks; /* sorted by rank */
    size_t nranks, ranks_cap;
    tsp__ragg_out_t *ready; /* records to hand out, in order */
    size_t nready, ready_cap, ready_head;
    char *batch; /* the last call's records, one after the other */
    size_t batch_cap;
    tsp_logline_t *raw; /* a raw pull from the queue */
    uint64_t folded;    /* records folded into a summary so far */
    size_t held;        /* bytes of CONTINUED pieces held, every rank's */
    uint64_t dropped;   /* records dropped (reportagg.c: over the caps, or unfinished) */
    /* Told of each dropped record (the log server: one event line), or NULL. */
    void (*on_drop)(void *ctx, int32_t rank, const char *why);
    void *ctx;
} tsp__ragg_t;

/* A budget of `budget` records a second (<= 0: every record as it is); NULL without memory. */
tsp__ragg_t *tsp__ragg_new(double budget);
void tsp__ragg_free(tsp__ragg_t *a);
/* tsp__logq_pull of q with CONTINUED pieces rejoined and the budget applied: the same
 * results and ordering per rank, only whole records; the records of out stay valid until
 * the next call. Caller serializes calls. */
int tsp__ragg_pull(tsp__ragg_t *a, tsp__logq_t *q, tsp_logline_t *out, int max, int timeout_ms);

#endif
