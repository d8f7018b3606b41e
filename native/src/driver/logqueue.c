/* logqueue.c: the log server's bounded pull queue, the per-rank tails of the last lines
 * and the per-rank drop counts. The epoll thread pushes; the host language pulls batches.
 *
 * The queue is a list of blocks holding packed records (a small header, then the text),
 * so a push is one memcpy and a pull copies one contiguous batch. Its bound is soft by at
 * most one line: the thread checks tsp__logq_full_locked() before each line and stops
 * reading sockets when it is full (TCP backpressure); a pull that brings the queue under
 * half the bound writes the thread's eventfd so that it reads again. */
#include "logqueue.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lines.h"
#include "logwire.h"
#include "util.h"

#define QBLK_SIZE (256u * 1024u)
#define BATCH_MAX_BYTES (4u << 20)

typedef struct qrec {
    int32_t rank;
    uint32_t len;
    uint8_t stream, flags;
} qrec_t;

struct tsp__qblk {
    struct tsp__qblk *next;
    size_t len, cap, off; /* off: first unread byte */
    char data[];
};

#define REC_SIZE(n) ((sizeof(qrec_t) + (n) + 7u) & ~(size_t)7u)

int tsp__logq_init(tsp__logq_t *q, size_t bound, unsigned tail_lines, size_t tail_bytes,
                   int wake_fd)
{
    memset(q, 0, sizeof(*q));
    int rc = tsp__cond_init_mono(&q->cv);
    if (rc)
        return rc;
    pthread_mutex_init(&q->mu, NULL);
    q->bound = bound;
    q->tail_lines = tail_lines;
    q->tail_max_bytes = tail_bytes;
    q->wake_fd = wake_fd;
    return 0;
}

void tsp__logq_close(tsp__logq_t *q)
{
    for (struct tsp__qblk *b = q->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    for (size_t i = 0; i < q->nranks; i++)
        tsp__tail_free(&q->ranks[i].tail);
    free(q->ranks);
    free(q->batch);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    memset(q, 0, sizeof(*q));
}

int tsp__logq_full_locked(const tsp__logq_t *q)
{
    return q->bytes >= q->bound;
}

/* The entry of a rank (binary search); create: added when missing. NULL when missing or
 * out of memory. The table is sparse, so that an agent's rank number, whatever it is,
 * costs one entry and not an array that long. */
static tsp__rank_t *rank_get(tsp__logq_t *q, int32_t rank, int create)
{
    if (rank < 0 || rank > TSP_WIRE_MAX_RANK)
        return NULL;
    if (q->rank_last < q->nranks && q->ranks[q->rank_last].rank == rank)
        return &q->ranks[q->rank_last]; /* lines come in runs of one rank */
    size_t lo = 0, hi = q->nranks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (q->ranks[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < q->nranks && q->ranks[lo].rank == rank) {
        q->rank_last = lo;
        return &q->ranks[lo];
    }
    if (!create)
        return NULL;
    if (q->nranks == q->ranks_cap) {
        size_t n = q->ranks_cap ? q->ranks_cap * 2 : 8;
        tsp__rank_t *nr = realloc(q->ranks, n * sizeof(*nr));
        if (!nr)
            return NULL;
        q->ranks = nr;
        q->ranks_cap = n;
    }
    memmove(q->ranks + lo + 1, q->ranks + lo, (q->nranks - lo) * sizeof(*q->ranks));
    memset(&q->ranks[lo], 0, sizeof(q->ranks[lo]));
    q->ranks[lo].rank = rank;
    q->nranks++;
    q->rank_last = lo;
    return &q->ranks[lo];
}

int tsp__logq_push_locked(tsp__logq_t *q, int32_t rank, unsigned stream, unsigned flags,
                          const void *data, size_t len, int to_queue)
{
    if (rank >= 0 && q->tail_lines) { /* the reports' queue keeps no tails */
        tsp__rank_t *r = rank_get(q, rank, 1);
        if (!r)
            return -ENOMEM;
        r->seen = 1;
        r->added++;
        tsp__tail_add(&r->tail, q->tail_lines, q->tail_max_bytes, data, len);
    }
    if (!to_queue)
        return 0;
    size_t need = REC_SIZE(len);
    int was_empty = !q->head;
    struct tsp__qblk *b = q->tail;
    if (!b || b->cap - b->len < need) {
        size_t cap = need > QBLK_SIZE ? need : QBLK_SIZE;
        b = malloc(sizeof(*b) + cap);
        if (!b)
            return -ENOMEM;
        b->next = NULL;
        b->len = b->off = 0;
        b->cap = cap;
        if (q->tail)
            q->tail->next = b;
        else
            q->head = b;
        q->tail = b;
    }
    qrec_t rec = {
        .rank = rank, .len = (uint32_t)len, .stream = (uint8_t)stream, .flags = (uint8_t)flags};
    memcpy(b->data + b->len, &rec, sizeof(rec));
    memcpy(b->data + b->len + sizeof(rec), data, len);
    b->len += need;
    q->bytes += need;
    /* A puller waits only while the queue is empty: waking it once per batch of lines,
     * not once per line, keeps the pushing thread off the futex. */
    if (q->waiters && was_empty)
        pthread_cond_broadcast(&q->cv);
    return 0;
}

void tsp__logq_set_dropped_locked(tsp__logq_t *q, int32_t rank, uint64_t count)
{
    tsp__rank_t *r = rank_get(q, rank, 1);
    if (r && count > r->dropped)
        r->dropped = count;
}

void tsp__logq_end(tsp__logq_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->ended = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

static int wait_lines(tsp__logq_t *q, int timeout_ms)
{
    struct timespec dl;
    tsp__deadline_in(&dl, timeout_ms);
    while (!q->head && !q->ended) {
        q->waiters++;
        int rc = timeout_ms < 0 ? pthread_cond_wait(&q->cv, &q->mu)
                                : pthread_cond_timedwait(&q->cv, &q->mu, &dl);
        q->waiters--;
        if (rc == ETIMEDOUT)
            return 0;
    }
    return 1;
}

/* Frees the head block once it was read entirely. */
static void pop_block_if_done(tsp__logq_t *q)
{
    struct tsp__qblk *b = q->head;
    if (b->off == b->len) {
        q->head = b->next;
        if (!q->head)
            q->tail = NULL;
        free(b);
    }
}

static void wake_reader_locked(tsp__logq_t *q)
{
    if (q->paused && q->bytes <= q->bound / 2) {
        q->paused = 0;
        uint64_t one = 1;
        ssize_t w = write(q->wake_fd, &one, sizeof(one));
        (void)w; /* an eventfd write only fails when the counter is saturated: still awake */
    }
}

/* Locks the queue and waits for lines: 1 with lines and the mutex held; otherwise the
 * mutex is released and 0 (timeout) or -EPIPE (the server ended) comes back. */
static int lock_lines(tsp__logq_t *q, int timeout_ms)
{
    pthread_mutex_lock(&q->mu);
    if (timeout_ms != 0)
        wait_lines(q, timeout_ms);
    if (q->head)
        return 1;
    int rc = q->ended ? -EPIPE : 0;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

int tsp__logq_pull(tsp__logq_t *q, tsp_logline_t *out, int max_lines, int timeout_ms)
{
    int rc = lock_lines(q, timeout_ms);
    if (rc <= 0)
        return rc;
    /* Size the batch: whole records up to max_lines and BATCH_MAX_BYTES (at least one). */
    size_t want = 0;
    int n = 0;
    for (struct tsp__qblk *b = q->head; b && n < max_lines; b = b->next) {
        size_t off = b->off;
        for (; off < b->len && n < max_lines; n++) {
            qrec_t rec;
            memcpy(&rec, b->data + off, sizeof(rec));
            if (n > 0 && want + rec.len > BATCH_MAX_BYTES)
                goto sized;
            want += rec.len;
            off += REC_SIZE(rec.len);
        }
    }
sized:
    if (want > q->batch_cap || (q->batch_cap > 2 * BATCH_MAX_BYTES && want <= BATCH_MAX_BYTES)) {
        size_t cap = want > BATCH_MAX_BYTES ? want : BATCH_MAX_BYTES;
        char *nb = malloc(cap);
        if (!nb) {
            pthread_mutex_unlock(&q->mu);
            return -ENOMEM;
        }
        free(q->batch);
        q->batch = nb;
        q->batch_cap = cap;
    }
    size_t pos = 0;
    for (int i = 0; i < n; i++) {
        struct tsp__qblk *b = q->head;
        if (!b) { /* n was counted from the queue under the same lock: cannot happen */
            n = i;
            break;
        }
        qrec_t rec;
        memcpy(&rec, b->data + b->off, sizeof(rec));
        memcpy(q->batch + pos, b->data + b->off + sizeof(rec), rec.len);
        out[i] = (tsp_logline_t){.data = q->batch + pos,
                                 .len = rec.len,
                                 .rank = rec.rank,
                                 .stream = rec.stream,
                                 .flags = rec.flags};
        pos += rec.len;
        b->off += REC_SIZE(rec.len);
        q->bytes -= REC_SIZE(rec.len);
        pop_block_if_done(q);
    }
    wake_reader_locked(q);
    pthread_mutex_unlock(&q->mu);
    return n;
}

long tsp__logq_pull_text(tsp__logq_t *q, char *buf, size_t cap, int max_lines, int timeout_ms,
                         const char *prefix, const char *marker, int *nlines)
{
    int rc = lock_lines(q, timeout_ms);
    if (rc <= 0)
        return rc;
    /* One prefix per (rank, stream) run: consecutive lines mostly share it. */
    char pre[256];
    size_t pl = 0;
    int32_t pre_rank = INT32_MIN;
    unsigned pre_stream = 0;
    size_t pos = 0;
    int n = 0;
    for (; q->head && n < max_lines; n++) {
        struct tsp__qblk *b = q->head;
        qrec_t rec;
        memcpy(&rec, b->data + b->off, sizeof(rec));
        if (rec.rank != pre_rank || rec.stream != pre_stream) {
            pl = tsp_lines_prefix(pre, sizeof(pre), prefix, marker, rec.rank, rec.stream);
            if (pl >= sizeof(pre))
                pl = sizeof(pre) - 1;
            pre_rank = rec.rank;
            pre_stream = rec.stream;
        }
        size_t need = pl + rec.len + 1;
        if (pos + need > cap)
            break; /* the caller's buffer holds at least one line (see logserver.h) */
        memcpy(buf + pos, pre, pl);
        memcpy(buf + pos + pl, b->data + b->off + sizeof(rec), rec.len);
        pos += pl + rec.len;
        if (!(rec.flags & TSP_LINE_CONTINUED))
            buf[pos++] = '\n';
        b->off += REC_SIZE(rec.len);
        q->bytes -= REC_SIZE(rec.len);
        pop_block_if_done(q);
    }
    wake_reader_locked(q);
    pthread_mutex_unlock(&q->mu);
    *nlines = n;
    return (long)pos;
}

long tsp__logq_tail(tsp__logq_t *q, int rank, int n, char *buf, size_t buflen)
{
    pthread_mutex_lock(&q->mu);
    size_t need = 0;
    const tsp__rank_t *r = rank_get(q, rank, 0);
    if (r)
        need = tsp__tail_copy(&r->tail, q->tail_lines, n, buf, buflen);
    pthread_mutex_unlock(&q->mu);
    return (long)need;
}

void tsp__logq_added(tsp__logq_t *q, uint64_t *added, int n)
{
    memset(added, 0, (size_t)(n > 0 ? n : 0) * sizeof *added);
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < q->nranks; i++) /* sorted by rank: stop past n */
        if (q->ranks[i].rank >= n)
            break;
        else if (q->ranks[i].rank >= 0)
            added[q->ranks[i].rank] = q->ranks[i].added;
    pthread_mutex_unlock(&q->mu);
}

int tsp__logq_dropped(tsp__logq_t *q, int32_t *ranks, uint64_t *counts, int max)
{
    int found = 0;
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < q->nranks; i++) {
        if (!q->ranks[i].dropped)
            continue;
        if (found < max) {
            ranks[found] = q->ranks[i].rank;
            counts[found] = q->ranks[i].dropped;
        }
        found++;
    }
    pthread_mutex_unlock(&q->mu);
    return found;
}
