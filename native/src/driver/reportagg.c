/* reportagg.c: the driver's report budget (reportagg.h; docs/distributor.md, "Reports at
 * scale"; docs/protocol.md 1.8, "Summaries").
 *
 * One host-language thread pulls reports; at 4,096 ranks reporting 100 times a second that
 * is 409,600 records a second into one callback and one MLflow run, more than a Python
 * callback takes (bench/scale_bench.py: ~55,000 a second, the backlog then grows to
 * seconds of delay). So the records pass here first, on the puller's thread (never the
 * server's epoll thread): each rank has a token bucket filled at its share of the job's
 * budget (the budget over the ranks that reported so far, a second of it as a burst).
 * A record finds a token: it passes as it is. It finds none: it is folded into the rank's
 * summary, which goes out as one record once a token comes (at the next record of the
 * rank, or at a later pull), and at the end of the run. A record that cannot be folded
 * (params, a metric that is not a number) first sends the rank's summary out, then
 * passes: the order per rank holds.
 *
 * Before the budget, a record that came in CONTINUED pieces (a raw sender's record over
 * the channel's line cap) is rejoined per rank, so that the glues only ever see whole
 * records; one over TSP_REPORT_RECORD_MAX, or beyond TSP_REPORT_PIECES_MAX held job-wide,
 * or still unfinished when the run ends, is dropped with one event (protocol 1.8, "Long
 * records").
 */
#include "reportagg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reportfold.h"
#include "torchspark/logserver.h"
#include "util.h"

_Static_assert(2 * TSP_RFOLD_JOB_RATE == TSP_REPORT_BUDGET,
               "the agents' job-wide report rate is half the driver's default budget");

#define RAW_MAX 8192 /* records taken from the queue in one pull */
#define PENDING_WAIT_MS 50

struct tsp__ragg_rank {
    int32_t rank;
    double tokens;
    int64_t refill_ms;
    tsp__rfold_t sum; /* the summary (count 0: none pending) */
    char *piece;      /* the CONTINUED pieces of the rank's record so far */
    size_t piece_len, piece_cap;
    int dropping; /* its record is dropped: the rest of its pieces too, up to its last */
};

tsp__ragg_t *tsp__ragg_new(double budget)
{
    tsp__ragg_t *a = calloc(1, sizeof *a);
    if (a)
        a->budget = budget;
    return a;
}

static void free_out(tsp__ragg_out_t *o, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(o[i].data);
}

void tsp__ragg_free(tsp__ragg_t *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->nranks; i++) {
        tsp__rfold_free(&a->ranks[i].sum);
        free(a->ranks[i].piece);
    }
    free(a->ranks);
    free_out(a->ready + a->ready_head, a->nready - a->ready_head);
    free(a->ready);
    free(a->batch);
    free(a->raw);
    free(a);
}

static struct tsp__ragg_rank *rank_of(tsp__ragg_t *a, int32_t rank)
{
    size_t lo = 0, hi = a->nranks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a->ranks[mid].rank == rank)
            return &a->ranks[mid];
        if (a->ranks[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (a->nranks == a->ranks_cap) {
        size_t cap = a->ranks_cap ? 2 * a->ranks_cap : 64;
        struct tsp__ragg_rank *nr = realloc(a->ranks, cap * sizeof *nr);
        if (!nr)
            return NULL;
        a->ranks = nr;
        a->ranks_cap = cap;
    }
    memmove(&a->ranks[lo + 1], &a->ranks[lo], (a->nranks - lo) * sizeof *a->ranks);
    a->nranks++;
    struct tsp__ragg_rank *r = &a->ranks[lo];
    memset(r, 0, sizeof *r);
    r->rank = rank;
    r->tokens = -1; /* full at its first refill */
    return r;
}

static void refill(tsp__ragg_t *a, struct tsp__ragg_rank *r, int64_t now)
{
    tsp__rfold_refill(&r->tokens, &r->refill_ms, a->budget / (double)(a->nranks ? a->nranks : 1),
                      1.0, now);
}

static int push_ready(tsp__ragg_t *a, int32_t rank, uint8_t flags, char *data, size_t len)
{
    if (a->nready == a->ready_cap) {
        size_t cap = a->ready_cap ? 2 * a->ready_cap : 256;
        tsp__ragg_out_t *nr = realloc(a->ready, cap * sizeof *nr);
        if (!nr) {
            free(data);
            return -ENOMEM;
        }
        a->ready = nr;
        a->ready_cap = cap;
    }
    a->ready[a->nready++] = (tsp__ragg_out_t){data, (uint32_t)len, rank, flags};
    return 0;
}

static int pass(tsp__ragg_t *a, const tsp_logline_t *ln)
{
    char *d = malloc(ln->len ? ln->len : 1);
    if (!d)
        return -ENOMEM;
    memcpy(d, ln->data, ln->len);
    return push_ready(a, ln->rank, ln->flags, d, ln->len);
}

/* The rank's summary as one record (protocol 1.8). */
static int emit_summary(tsp__ragg_t *a, struct tsp__ragg_rank *r)
{
    uint64_t n = r->sum.count;
    char *buf;
    size_t len;
    int rc = tsp__rfold_take(&r->sum, &buf, &len);
    if (rc)
        return rc;
    a->folded += n > 1 ? n : 0;
    return push_ready(a, r->rank, 0, buf, len);
}

static void release(tsp__ragg_t *a, struct tsp__ragg_rank *r)
{
    a->held -= r->piece_len;
    free(r->piece);
    r->piece = NULL;
    r->piece_len = r->piece_cap = 0;
}

static void drop(tsp__ragg_t *a, struct tsp__ragg_rank *r, int ended)
{
    char why[160];
    if (ended)
        snprintf(why, sizeof why, "the run ended before its last piece (%zu bytes held)",
                 r->piece_len);
    else
        snprintf(why, sizeof why, "its pieces exceed %d bytes, or %d held job-wide",
                 TSP_REPORT_RECORD_MAX, TSP_REPORT_PIECES_MAX);
    a->dropped++;
    if (a->on_drop)
        a->on_drop(a->ctx, r->rank, why);
    release(a, r);
    r->dropping = !ended;
}

/* A record's CONTINUED pieces rejoined: 1 with *ln the whole record (in r->piece when it
 * came in pieces: release it once used), 0 while more is to come or when it is dropped. */
static int rejoin(tsp__ragg_t *a, struct tsp__ragg_rank *r, tsp_logline_t *ln)
{
    int more = (ln->flags & TSP_LOG_LINE_CONTINUED) != 0;
    if (!more && !r->piece && !r->dropping)
        return 1;
    size_t total = r->piece_len + ln->len;
    if (!r->dropping &&
        (total > TSP_REPORT_RECORD_MAX || a->held + ln->len > TSP_REPORT_PIECES_MAX))
        drop(a, r, 0);
    if (r->dropping) {
        r->dropping = more;
        return 0;
    }
    if (total > r->piece_cap) {
        size_t cap = total > 2 * r->piece_cap ? total : 2 * r->piece_cap;
        char *p = realloc(r->piece, cap ? cap : 1);
        if (!p)
            return -ENOMEM;
        r->piece = p;
        r->piece_cap = cap;
    }
    memcpy(r->piece + r->piece_len, ln->data, ln->len);
    r->piece_len = total;
    a->held += ln->len;
    if (more)
        return 0;
    *ln = (tsp_logline_t){
        .data = r->piece, .len = (uint32_t)total, .rank = ln->rank, .stream = ln->stream};
    return 1;
}

static int take_whole(tsp__ragg_t *a, struct tsp__ragg_rank *r, const tsp_logline_t *ln,
                      int64_t now)
{
    tsp__rfold_rec_t p;
    if (a->budget <= 0) { /* every record as it is, after what was folded before */
        int rc = r->sum.count ? emit_summary(a, r) : 0;
        return rc ? rc : pass(a, ln);
    }
    int foldable = !ln->flags && tsp__rfold_parse(ln->data, ln->len, &p) == 0;
    refill(a, r, now);
    if (!foldable || (!r->sum.count && r->tokens >= 1)) {
        int rc = r->sum.count ? emit_summary(a, r) : 0;
        if (!r->sum.count && r->tokens >= 1)
            r->tokens -= 1;
        return rc ? rc : pass(a, ln);
    }
    int rc = tsp__rfold_add(&r->sum, &p);
    if (rc == 0 && r->tokens >= 1) {
        r->tokens -= 1;
        rc = emit_summary(a, r);
    }
    return rc;
}

static int take(tsp__ragg_t *a, const tsp_logline_t *raw, int64_t now)
{
    struct tsp__ragg_rank *r = rank_of(a, raw->rank);
    if (!r)
        return -ENOMEM;
    tsp_logline_t ln = *raw;
    int rc = rejoin(a, r, &ln);
    if (rc <= 0)
        return rc;
    rc = take_whole(a, r, &ln, now);
    if (ln.data == r->piece)
        release(a, r);
    return rc;
}

/* At the end of the run: every record still waiting for its last piece, dropped. */
static void drop_unfinished(tsp__ragg_t *a)
{
    for (size_t i = 0; i < a->nranks; i++) {
        if (a->ranks[i].piece)
            drop(a, &a->ranks[i], 1);
        a->ranks[i].dropping = 0;
    }
}

/* The summaries whose rank has a token again; every one when all (the run ended). */
static int flush_due(tsp__ragg_t *a, int64_t now, int all)
{
    for (size_t i = 0; i < a->nranks; i++) {
        struct tsp__ragg_rank *r = &a->ranks[i];
        if (!r->sum.count)
            continue;
        refill(a, r, now);
        if (!all && r->tokens < 1)
            continue;
        r->tokens -= all ? 0 : 1;
        int rc = emit_summary(a, r);
        if (rc)
            return rc;
    }
    return 0;
}

static int pending(const tsp__ragg_t *a)
{
    for (size_t i = 0; i < a->nranks; i++)
        if (a->ranks[i].sum.count)
            return 1;
    return 0;
}

static int refill_ready(tsp__ragg_t *a, tsp__logq_t *q, int timeout_ms)
{
    if (!a->raw && !(a->raw = calloc(RAW_MAX, sizeof *a->raw)))
        return -ENOMEM;
    int wait = timeout_ms;
    if (pending(a) && (wait < 0 || wait > PENDING_WAIT_MS))
        wait = PENDING_WAIT_MS; /* a summary is due within its rank's interval */
    int n = tsp__logq_pull(q, a->raw, RAW_MAX, wait);
    if (n < 0 && n != -EPIPE)
        return n;
    int64_t now = tsp__now_ms();
    for (int i = 0; i < n; i++) {
        int rc = take(a, &a->raw[i], now);
        if (rc)
            return rc;
    }
    if (n == -EPIPE)
        drop_unfinished(a);
    int rc = flush_due(a, now, n == -EPIPE);
    return rc ? rc : n;
}

int tsp__ragg_pull(tsp__ragg_t *a, tsp__logq_t *q, tsp_logline_t *out, int max, int timeout_ms)
{
    if (a->ready_head == a->nready) {
        a->ready_head = a->nready = 0;
        int rc = refill_ready(a, q, timeout_ms);
        if (rc < 0 && (rc != -EPIPE || a->nready == 0))
            return rc;
    }
    /* One contiguous batch, as tsp_logserver_pull promises (logserver.h). */
    size_t n = a->nready - a->ready_head, bytes = 0;
    if (n > (size_t)max)
        n = (size_t)max;
    for (size_t i = 0; i < n; i++)
        bytes += a->ready[a->ready_head + i].len;
    if (bytes > a->batch_cap) {
        char *nb = realloc(a->batch, bytes);
        if (!nb)
            return -ENOMEM;
        a->batch = nb;
        a->batch_cap = bytes;
    }
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        tsp__ragg_out_t *o = &a->ready[a->ready_head + i];
        memcpy(a->batch + pos, o->data, o->len);
        out[i] = (tsp_logline_t){.data = a->batch + pos,
                                 .len = o->len,
                                 .rank = o->rank,
                                 .stream = TSP_LOG_STREAM_REPORT,
                                 .flags = o->flags};
        pos += o->len;
        free(o->data);
    }
    a->ready_head += n;
    return (int)n;
}
