/* logserver_int.h: the log server's parts shared between logserver.c (the epoll thread),
 * logqueue.c (the bounded pull queue, the per-rank tails and drop counts) and outrecv.c
 * (receiving rank 0's output). Not installed. */
#ifndef TSP_LOGSERVER_INT_H
#define TSP_LOGSERVER_INT_H

#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "torchspark/logserver.h"

struct tsp__qblk;

/* A condition variable on the monotonic clock, and the absolute time timeout_ms ahead
 * (for pthread_cond_timedwait on it). */
int tsp__cond_init_mono(pthread_cond_t *cv);
void tsp__deadline_in(struct timespec *ts, int timeout_ms);

/* The last lines of one rank (logtail.c): lines back to back in a circular byte buffer
 * of cap bytes (grown up to the byte bound), entries off/len for at most max_lines lines. */
typedef struct tsp__tail {
    char *ring;
    size_t cap, end, bytes; /* end: where the next line goes; bytes: live bytes */
    uint32_t *off, *len;    /* max_lines entries (NULL until the first line) */
    unsigned head, count;   /* head: the oldest entry */
} tsp__tail_t;

void tsp__tail_add(tsp__tail_t *t, unsigned max_lines, size_t max_bytes, const void *data,
                   size_t len);
/* The last n lines, oldest first, each followed by '\n', into buf (truncated to buflen);
 * returns the bytes the whole answer needs. */
size_t tsp__tail_copy(const tsp__tail_t *t, unsigned max_lines, int n, char *buf,
                      size_t buflen);
void tsp__tail_free(tsp__tail_t *t);

/* What the server keeps per rank: the tail and the drop count. */
typedef struct tsp__rank {
    tsp__tail_t tail;
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
long tsp__logq_pull_text(tsp__logq_t *q, char *buf, size_t cap, int max_lines, int timeout_ms,
                         const char *prefix, const char *marker, int *nlines);
long tsp__logq_tail(tsp__logq_t *q, int rank, int n, char *buf, size_t buflen);
int tsp__logq_dropped(tsp__logq_t *q, int32_t *ranks, uint64_t *counts, int max);
void tsp__logq_end(tsp__logq_t *q);

/* The output receiver (outrecv.c): guarded by its own mutex. The epoll thread receives
 * the bytes in place; a hashing thread of the transfer's own follows behind it, computing
 * SHA-256 (and, to a file, writing), so that the server thread never spends its time on
 * the digest and the two run on separate cores. */
enum { TSP__OUT_NONE, TSP__OUT_WAIT, TSP__OUT_RECV, TSP__OUT_OK };
typedef struct tsp__outrecv {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* the host waits for the transfer's end */
    pthread_cond_t work_cv; /* the hasher waits for received bytes */
    pthread_cond_t room_cv; /* the receiver waits for the hasher */
    int state;
    char *path; /* NULL: memory */
    int fd;
    uint8_t *mem;  /* memory mode: mmap'ed, total bytes */
    uint8_t *ring; /* file mode: received bytes not yet hashed and written */
    uint64_t total;
    uint64_t got;    /* received (the epoll thread's) */
    uint64_t hashed; /* hashed, and written in file mode (the hasher's) */
    EVP_MD_CTX *md;  /* the hasher's while it runs */
    pthread_t hasher;
    int hasher_on;      /* started: to be joined */
    int hasher_running; /* not yet past its last use of the transfer */
    int hasher_quit;
    int hasher_err; /* -errno: SHA-256 (-EIO) or the file write failed */
    int wake_fd;    /* the server thread's eventfd: told when the hasher fails */
    void *owner;    /* the connection receiving it */
    char err[512];
    char err_copy[512];
} tsp__outrecv_t;

int tsp__outrecv_init(tsp__outrecv_t *o, int wake_fd);
/* Host side: accept one transfer (path NULL: memory); wait for it (0/-ETIMEDOUT/-ENOENT). */
int tsp__outrecv_expect(tsp__outrecv_t *o, const char *path);
int tsp__outrecv_wait(tsp__outrecv_t *o, int timeout_ms);
void tsp__outrecv_close(tsp__outrecv_t *o);
/* Thread side. Each returns 0 or -errno with a reason in err. */
int tsp__outrecv_claim(tsp__outrecv_t *o, void *owner, char *err, size_t errlen);
int tsp__outrecv_begin(tsp__outrecv_t *o, void *owner, uint64_t total, char *err, size_t errlen);
/* An OUT_CHUNK header of len bytes, with the first `have` payload bytes already buffered
 * at p; the rest is read by tsp__outrecv_recv straight into its destination. */
int tsp__outrecv_chunk(tsp__outrecv_t *o, void *owner, uint32_t len, const uint8_t *p,
                       size_t have, char *err, size_t errlen);
/* Receives up to max bytes of the current chunk from fd (non-blocking). Bytes taken, or
 * -EAGAIN (nothing to read), -ECONNRESET (EOF), another -errno (socket), -EBADMSG (the
 * transfer failed: reason in err). */
ssize_t tsp__outrecv_recv(tsp__outrecv_t *o, void *owner, int fd, size_t max, char *err,
                          size_t errlen);
int tsp__outrecv_end(tsp__outrecv_t *o, void *owner, const uint8_t digest[32], char *err,
                     size_t errlen);
/* After a wake-up: when the hasher failed (a write to the file), the transfer is given up
 * and its connection returned, with the reason in why, for the server to refuse it now
 * rather than at the agent's next chunk. NULL otherwise. */
void *tsp__outrecv_failed(tsp__outrecv_t *o, char *why, size_t whylen);
/* The connection went away (or failed): discard a partial transfer, allow a retry. */
void tsp__outrecv_abort(tsp__outrecv_t *o, void *owner, const char *why);

#endif
