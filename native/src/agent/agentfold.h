/* agentfold.h (internal): the agent's report folding (docs/protocol.md 1.8, "Summaries").
 *
 * The log client offers every report record (stream 4) here before it frames it. Each rank
 * passes its records as they are while it stays within its share of the job's report rate
 * (TSP_RFOLD_JOB_RATE over the job's ranks, at least 1 a second; a token bucket holding a
 * second of it); beyond it, its records are folded (reportfold.h) into one summary that
 * goes out once the rank has a token again: at its next record, or at the sender's next
 * tick (tsp__afold_flush; a rank quiet for a tick may borrow its next token there), and
 * every one at the end. So the driver's fan-in is bounded by
 * the job's rate, not by how often the ranks call report(). A record that cannot be folded
 * first sends the rank's summary, then passes: the order per rank holds; nothing is lost,
 * and a full queue (put says -EAGAIN) keeps what was not handed on. Thread-safe. */
#ifndef TSP_AGENTFOLD_H
#define TSP_AGENTFOLD_H

#include <stdint.h>

#include "lines.h"

typedef struct tsp__afold tsp__afold_t;

/* Hands one record on: 0, or -EAGAIN when there is no room (nothing was taken). */
typedef int (*tsp__afold_put_fn)(void *ctx, const tsp_line_t *line);

/* The folding of a job of `world` ranks (<= 0: NULL, nothing folded). NULL also without
 * memory: the caller then passes every record. */
tsp__afold_t *tsp__afold_new(int world);
void tsp__afold_free(tsp__afold_t *f);
/* A report line from a writer: passed (put), folded, or, when put has no room, not taken.
 * 0 (taken) or -EAGAIN (offer it again later), or -ENOMEM. */
int tsp__afold_offer(tsp__afold_t *f, const tsp_line_t *line, int64_t now, tsp__afold_put_fn put,
                     void *ctx);
/* Hands on the summaries that are due (all: every one held, the end of the run). 0, or
 * -EAGAIN when some are still held (put had no room). */
int tsp__afold_flush(tsp__afold_t *f, int64_t now, int all, tsp__afold_put_fn put, void *ctx);
/* 1 while a summary is held. */
int tsp__afold_pending(tsp__afold_t *f);
/* Report records folded into summaries so far. */
uint64_t tsp__afold_folded(tsp__afold_t *f);

#endif
