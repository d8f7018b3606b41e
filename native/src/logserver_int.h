/* logserver_int.h: the log server's parts shared between logserver.c (the epoll thread),
 * logqueue.c (the bounded pull queue, the per-rank tails and drop counts) and outrecv.c
 * (receiving rank 0's output). Not installed. */
#ifndef TSP_LOGSERVER_INT_H
#define TSP_LOGSERVER_INT_H

#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "torchspark/logserver.h"

struct tsp__qblk;

/* A condition variable on the monotonic clock, and the absolute time timeout_ms ahead
 * (for pthread_cond_timedwait on it). */
int tsp__cond_init_mono(pthread_cond_t *cv);
void tsp__deadline_in(struct timespec *ts, int timeout_ms);

/* What the server keeps per rank: the tail ring and the drop count. */
typedef struct tsp__rank {
    char **tail;       /* ring of tail_lines entries (NULL until the first line) */
    uint32_t *tail_len;
    unsigned tail_head; /* index of the oldest */
    unsigned tail_count;
    size_t tail_bytes;
    uint64_t dropped;
    uint8_t seen;
} tsp__rank_t;

/* The queue, tails and counters: guarded by mu; cv wakes a waiting puller. */
typedef struct tsp__logq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct tsp__qblk *head, *tail;
    size_t bytes, bound;
    int waiters;
    int ended;     /* the server thread has finished */
    int paused;    /* the thread stopped reading for room: pull signals wake_fd */
    int wake_fd;   /* the server thread's eventfd */
    char *batch;   /* the last pull's data */
    size_t batch_cap;
    tsp__rank_t *ranks;
    size_t nranks;
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
long tsp__logq_tail(tsp__logq_t *q, int rank, int n, char *buf, size_t buflen);
int tsp__logq_dropped(tsp__logq_t *q, int32_t *ranks, uint64_t *counts, int max);
void tsp__logq_end(tsp__logq_t *q);

/* The output receiver (outrecv.c): guarded by its own mutex; the thread feeds it. */
enum { TSP__OUT_NONE, TSP__OUT_WAIT, TSP__OUT_RECV, TSP__OUT_OK };
typedef struct tsp__outrecv {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
    char *path; /* NULL: memory */
    int fd;
    uint8_t *mem;
    uint64_t total, got;
    EVP_MD_CTX *md;
    void *owner; /* the connection receiving it */
    char err[512];
    char err_copy[512];
} tsp__outrecv_t;

int tsp__outrecv_init(tsp__outrecv_t *o);
/* Host side: accept one transfer (path NULL: memory); wait for it (0/-ETIMEDOUT/-ENOENT). */
int tsp__outrecv_expect(tsp__outrecv_t *o, const char *path);
int tsp__outrecv_wait(tsp__outrecv_t *o, int timeout_ms);
void tsp__outrecv_close(tsp__outrecv_t *o);
/* Thread side. Each returns 0 or -errno with a reason in err. */
int tsp__outrecv_claim(tsp__outrecv_t *o, void *owner, char *err, size_t errlen);
int tsp__outrecv_begin(tsp__outrecv_t *o, void *owner, uint64_t total, char *err, size_t errlen);
int tsp__outrecv_chunk(tsp__outrecv_t *o, void *owner, const uint8_t *p, size_t n, char *err,
                       size_t errlen);
int tsp__outrecv_end(tsp__outrecv_t *o, void *owner, const uint8_t digest[32], char *err,
                     size_t errlen);
/* The connection went away (or failed): discard a partial transfer, allow a retry. */
void tsp__outrecv_abort(tsp__outrecv_t *o, void *owner, const char *why);

#endif
