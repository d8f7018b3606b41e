/* reportfold.h (internal): one rank's report summary (docs/protocol.md 1.8, "Summaries"),
 * the one fold both ends use: the agent's (agentfold.c, above its per-rank rate) and the
 * driver's (reportagg.c, beyond a rank's share of the report budget). A record of exactly
 * step, time and metrics (finite numbers) is folded: the last values kept, count, first
 * time, min/max/mean of each metric over the interval; written back as one record. */
#ifndef TSP_REPORTFOLD_H
#define TSP_REPORTFOLD_H

#include <stddef.h>
#include <stdint.h>

#define TSP_RFOLD_MAX_METRICS 64 /* a record with more is passed as it is */
#define TSP_RFOLD_NAME_MAX 128   /* and one with a longer metric name */
/* The job-wide report rate the agents keep to (each rank its share), records a second: half
 * the driver's default budget (TSP_REPORT_BUDGET of torchspark/logserver.h), so that the
 * driver's own fold stays idle and the host language's callback keeps up (~30 us a record
 * in Python on a loaded 2-core machine: 0.3 core). */
#define TSP_RFOLD_JOB_RATE 10000

typedef struct {
    char name[TSP_RFOLD_NAME_MAX];
    double last, min, max, sum;
    uint64_t n;
} tsp__rfold_metric_t;

/* One parsed record (large: keep it off hot small stacks only if needed). */
typedef struct {
    char step[32];
    double time;
    int has_time, bad;
    tsp__rfold_metric_t m[TSP_RFOLD_MAX_METRICS];
    size_t nm;
} tsp__rfold_rec_t;

/* One rank's summary; zero-initialized is empty. */
typedef struct {
    uint64_t count; /* records folded (0: none pending) */
    double first_time, last_time;
    char step[32];
    tsp__rfold_metric_t *m;
    size_t nm;
} tsp__rfold_t;

/* 0 when the record (one whole line, flags 0) can be folded, parsed into p; -EINVAL not. */
int tsp__rfold_parse(const char *data, size_t len, tsp__rfold_rec_t *p);
/* Folds p into s. 0 or -ENOMEM. */
int tsp__rfold_add(tsp__rfold_t *s, const tsp__rfold_rec_t *p);
/* s as one record (malloc'd, in out and len; "summary" when it stands for more than one), and
 * s emptied. 0 or -ENOMEM. */
int tsp__rfold_take(tsp__rfold_t *s, char **out, size_t *len);
void tsp__rfold_free(tsp__rfold_t *s);
/* A token bucket of `rate` a second holding burst_s seconds of it (at least 1): *tokens
 * refilled to now (*tokens < 0: full). */
void tsp__rfold_refill(double *tokens, int64_t *refill_ms, double rate, double burst_s,
                       int64_t now);

#endif
