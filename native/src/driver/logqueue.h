/* logqueue.h (internal): the log server's bounded pull queue, per-rank tails and drop
 * counts (logqueue.c), shared by the epoll thread that pushes and the host that pulls. */
#ifndef TSP_LOGQUEUE_H
#define TSP_LOGQUEUE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "logtail.h"
#include "torchspark/logserver.h"

struct tsp__qblk;

/* What the server keeps per rank: the tail and the drop count. */
typedef struct tsp__rank {
    int32_t rank;
    tsp__tail_t tail;
    uint64_t dropped;
    uint64_t added; /* lines added to its tail: the hang watchdog re-reads only what changed */
    uint8_t seen;
} tsp__rank_t;

/* The queue, tails and counters: guarded by mu; cv wakes a waiting puller. */
typedef struct tsp__logq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct tsp__qblk *head, *tail;
    size_t bytes, bound;
    int waiters;
    int ended;   /* the server thread has finished */
    int paused;  /* the thread stopped reading for room: pull signals wake_fd */
    int wake_fd; /* the server thread's eventfd */
    char *batch; /* the last pull's data */
    size_t batch_cap;
    tsp__rank_t *ranks; /* sorted by rank, only those seen: a rank far out costs one entry */
    size_t nranks, ranks_cap, rank_last; /* rank_last: the entry found last */
    unsigned tail_lines;
    size_t tail_max_bytes;
    tsp_logserver_stats_t st;
} tsp__logq_t;

int tsp__logq_init(tsp__logq_t *q, size_t bound, unsigned tail_lines, size_t tail_bytes,
                   int wake_fd);
void tsp__logq_close(tsp__logq_t *q);
/* Under q->mu: 1 when the queue has no room for more lines. */
int tsp__logq_full_locked(const tsp__logq_t *q);
/* Under q->mu: appends one line (queue and/or tail); to_queue 0 keeps only the tail. */
int tsp__logq_push_locked(tsp__logq_t *q, int32_t rank, unsigned stream, unsigned flags,
                          const void *data, size_t len, int to_queue);
void tsp__logq_set_dropped_locked(tsp__logq_t *q, int32_t rank, uint64_t count);
int tsp__logq_pull(tsp__logq_t *q, tsp_logline_t *out, int max_lines, int timeout_ms);
long tsp__logq_pull_text(tsp__logq_t *q, char *buf, size_t cap, int max_lines, int timeout_ms,
                         const char *prefix, const char *marker, int *nlines);
long tsp__logq_tail(tsp__logq_t *q, int rank, int n, char *buf, size_t buflen);
/* Each rank's count of lines added to its tail so far, ranks 0 to n - 1 (0 where none came),
 * under one lock: what changed since the last look. */
void tsp__logq_added(tsp__logq_t *q, uint64_t *added, int n);
int tsp__logq_dropped(tsp__logq_t *q, int32_t *ranks, uint64_t *counts, int max);
void tsp__logq_end(tsp__logq_t *q);

#endif
