/* agentfold.c: the agent's report folding (agentfold.h; docs/protocol.md 1.8). */
#include "agentfold.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "reportfold.h"

/* A rank's burst: a tenth of a second of its share (at least one record). A second's, as the
 * driver's, would let every rank of a job that starts at once send a whole second's worth
 * as it is, a backlog of the job's rate at the driver at the start. */
#define BURST_S 0.1
/* A rank quiet this long (no record since; the sender's tick) sends its held summary at once,
 * borrowing its next token (never more than one: the job's rate holds): otherwise its last
 * values waited for that token, up to a second of its interval (4,096 ranks: 0.41 s; 16,384:
 * 1.6 s), at the end of a run or before each pause in its reports. */
#define QUIET_MS 50

typedef struct {
    int32_t rank, local_rank;
    double tokens;
    int64_t refill_ms;
    int64_t last_ms; /* its last record's offer */
    int owed;        /* a token borrowed when it went quiet, repaid from the next one */
    tsp__rfold_t sum;
    char *ready; /* a summary taken out of sum, not handed on yet */
    size_t ready_len;
} frank_t;

struct tsp__afold {
    pthread_mutex_t mu;
    double rate; /* records a second per rank passed as they are */
    frank_t *r;
    size_t n, cap;
    uint64_t folded;
    tsp__rfold_rec_t rec; /* the record being parsed (large: not on the stack) */
};

tsp__afold_t *tsp__afold_new(int world)
{
    if (world <= 0)
        return NULL;
    tsp__afold_t *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    pthread_mutex_init(&f->mu, NULL);
    f->rate = (double)TSP_RFOLD_JOB_RATE / (double)world;
    if (f->rate < 1)
        f->rate = 1;
    return f;
}

void tsp__afold_free(tsp__afold_t *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++) {
        tsp__rfold_free(&f->r[i].sum);
        free(f->r[i].ready);
    }
    free(f->r);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static frank_t *rank_of(tsp__afold_t *f, const tsp_line_t *line)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->r[i].rank == line->rank)
            return &f->r[i];
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        frank_t *nr = realloc(f->r, cap * sizeof *nr);
        if (!nr)
            return NULL;
        f->r = nr;
        f->cap = cap;
    }
    frank_t *r = &f->r[f->n++];
    memset(r, 0, sizeof *r);
    r->rank = line->rank;
    r->local_rank = line->local_rank;
    r->tokens = -1; /* full at its first refill */
    return r;
}

/* The rank's tokens refilled to now, a borrowed one repaid first. */
static void refill(const tsp__afold_t *f, frank_t *r, int64_t now)
{
    tsp__rfold_refill(&r->tokens, &r->refill_ms, f->rate, BURST_S, now);
    if (r->owed && r->tokens >= 1) {
        r->tokens -= 1;
        r->owed = 0;
    }
}

/* Hands the rank's ready summary on: 0 (none left), or -EAGAIN (kept). */
static int put_ready(frank_t *r, tsp__afold_put_fn put, void *ctx)
{
    if (!r->ready)
        return 0;
    tsp_line_t ln = {.rank = r->rank,
                     .local_rank = r->local_rank,
                     .stream = TSP_STREAM_REPORT,
                     .data = r->ready,
                     .len = r->ready_len};
    int rc = put(ctx, &ln);
    if (rc)
        return rc;
    free(r->ready);
    r->ready = NULL;
    return 0;
}

/* The summary taken out (it stays ready until handed on) and offered. */
static int emit(tsp__afold_t *f, frank_t *r, tsp__afold_put_fn put, void *ctx)
{
    uint64_t n = r->sum.count;
    int rc = tsp__rfold_take(&r->sum, &r->ready, &r->ready_len);
    if (rc)
        return rc;
    f->folded += n > 1 ? n : 0;
    return put_ready(r, put, ctx);
}

static int offer_locked(tsp__afold_t *f, const tsp_line_t *line, int64_t now, tsp__afold_put_fn put,
                        void *ctx)
{
    frank_t *r = rank_of(f, line);
    if (!r)
        return -ENOMEM;
    int rc = put_ready(r, put, ctx);
    if (rc)
        return rc;
    r->last_ms = now;
    refill(f, r, now);
    if (!r->sum.count && r->tokens >= 1) {
        rc = put(ctx, line); /* within its rate: as it is */
        if (rc == 0)
            r->tokens -= 1;
        return rc;
    }
    if (line->flags || tsp__rfold_parse(line->data, line->len, &f->rec)) {
        rc = r->sum.count ? emit(f, r, put, ctx) : 0; /* the summary first: order holds */
        return rc ? rc : put(ctx, line);
    }
    rc = tsp__rfold_add(&r->sum, &f->rec);
    if (rc == 0 && r->tokens >= 1) {
        r->tokens -= 1;
        if (emit(f, r, put, ctx) == -ENOMEM)
            return -ENOMEM;
    }
    return rc; /* taken: folded, its summary handed on or ready */
}

int tsp__afold_offer(tsp__afold_t *f, const tsp_line_t *line, int64_t now, tsp__afold_put_fn put,
                     void *ctx)
{
    pthread_mutex_lock(&f->mu);
    int rc = offer_locked(f, line, now, put, ctx);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int tsp__afold_flush(tsp__afold_t *f, int64_t now, int all, tsp__afold_put_fn put, void *ctx)
{
    int still = 0;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n; i++) {
        frank_t *r = &f->r[i];
        if (put_ready(r, put, ctx)) {
            still = 1;
            continue;
        }
        if (!r->sum.count)
            continue;
        refill(f, r, now);
        if (!all && r->tokens < 1 && (r->owed || now - r->last_ms < QUIET_MS))
            continue; /* not due: no token, and it still reports (or owes one already) */
        if (!all && r->tokens >= 1)
            r->tokens -= 1;
        else if (!all)
            r->owed = 1; /* quiet: out now, on its next token */
        if (emit(f, r, put, ctx))
            still = 1;
    }
    pthread_mutex_unlock(&f->mu);
    return still ? -EAGAIN : 0;
}

int tsp__afold_pending(tsp__afold_t *f)
{
    int any = 0;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->n && !any; i++)
        any = f->r[i].ready || f->r[i].sum.count;
    pthread_mutex_unlock(&f->mu);
    return any;
}

uint64_t tsp__afold_folded(tsp__afold_t *f)
{
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->folded;
    pthread_mutex_unlock(&f->mu);
    return n;
}
