/* test_agentfold.c: the agent's report folding (agentfold.c; docs/protocol.md 1.8) and the
 * fold both ends share (reportfold.c): beyond a rank's share of the job's rate, one summary
 * per interval; the last value exact, every report() counted once, the order per rank kept,
 * nothing lost when the queue is full. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agentfold.h"
#include "json.h"
#include "testutil.h"
#include "util.h"

typedef struct {
    int room; /* records put takes before it says -EAGAIN (-1: any number) */
    int n;
    int rank[4096];
    char *text[4096];
} got_t;

static got_t got;

static int put(void *ctx, const tsp_line_t *ln)
{
    got_t *g = ctx;
    if (g->room == 0)
        return -EAGAIN;
    if (g->room > 0)
        g->room--;
    ck_assert_int_lt(g->n, 4096);
    g->rank[g->n] = ln->rank;
    g->text[g->n++] = strndup(ln->data, ln->len);
    return 0;
}

static void setup(void)
{
    memset(&got, 0, sizeof got);
    got.room = -1;
}

static void teardown(void)
{
    for (int i = 0; i < got.n; i++)
        free(got.text[i]);
}

static int offer(tsp__afold_t *f, int rank, const char *rec, int64_t now)
{
    tsp_line_t ln = {.rank = rank, .stream = TSP_STREAM_REPORT, .data = rec, .len = strlen(rec)};
    return tsp__afold_offer(f, &ln, now, put, &got);
}

static int offer_step(tsp__afold_t *f, int rank, int step, int64_t now)
{
    char rec[160];
    snprintf(rec, sizeof rec, "{\"step\": %d, \"time\": %d.5, \"metrics\": {\"loss\": %d}}", step,
             1000 + step, step);
    return offer(f, rank, rec, now);
}

static double num(const char *doc, const char *path)
{
    char *v = NULL;
    int type = 0;
    if (tsp_json_get(doc, strlen(doc), path, &v, &type) != 0)
        return -1;
    double d = strtod(v, NULL);
    free(v);
    return d;
}

/* report() calls the records stand for (a summary's count, else 1). */
static long calls(void)
{
    long n = 0;
    for (int i = 0; i < got.n; i++)
        n += strstr(got.text[i], "\"summary\"") ? (long)num(got.text[i], "summary.count") : 1;
    return n;
}

START_TEST(test_agentfold_within_the_rate_every_record_passes_as_it_is)
{
    tsp__afold_t *f = tsp__afold_new(8); /* 2,500 a second per rank */
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(offer_step(f, i % 8, i, 1000 + i), 0);
    ck_assert_int_eq(got.n, 100);
    ck_assert(strstr(got.text[99], "\"step\": 99") && !strstr(got.text[99], "summary"));
    ck_assert_int_eq(tsp__afold_pending(f), 0);
    tsp__afold_free(f);
    ck_assert_ptr_null(tsp__afold_new(0)); /* no job size: nothing folded */
}
END_TEST

START_TEST(test_agentfold_beyond_the_rate_one_summary_per_interval_the_last_value_exact)
{
    tsp__afold_t *f = tsp__afold_new(40000); /* 0.5 a second: 1 a second, the floor */
    for (int i = 0; i < 100; i++)            /* 100 reports within 1 s, all of rank 3 */
        ck_assert_int_eq(offer_step(f, 3, i, 1000 + 10 * i), 0);
    ck_assert_int_eq(got.n, 1); /* the first passed; 99 held */
    ck_assert_int_eq(tsp__afold_flush(f, 1995, 0, put, &got), 0);
    ck_assert_int_eq(got.n, 1); /* not due yet */
    ck_assert_int_eq(tsp__afold_pending(f), 1);
    ck_assert_int_eq(tsp__afold_flush(f, 2001, 0, put, &got), 0);
    ck_assert_int_eq(got.n, 2);
    const char *s = got.text[1];
    ck_assert_int_eq(got.rank[1], 3);
    ck_assert_double_eq(num(s, "step"), 99);
    ck_assert_double_eq(num(s, "metrics.loss"), 99);
    ck_assert_double_eq(num(s, "summary.count"), 99);
    ck_assert_double_eq(num(s, "summary.first_time"), 1001.5);
    ck_assert_double_eq(num(s, "summary.min.loss"), 1);
    ck_assert_double_eq(num(s, "summary.max.loss"), 99);
    ck_assert_double_eq(num(s, "summary.mean.loss"), 50);
    ck_assert_int_eq(calls(), 100);
    ck_assert_int_eq(tsp__afold_folded(f), 99);
    ck_assert_int_eq(tsp__afold_pending(f), 0);
    tsp__afold_free(f);
}
END_TEST

/* A rank that stops reporting with a summary held sends it at the first tick it has been
 * quiet (50 ms), borrowing its next token, not when that token comes (here 0.45 s later);
 * it borrows one at most, so the job's rate holds. */
START_TEST(test_agentfold_a_quiet_rank_s_summary_goes_out_at_once_borrowing_one_token)
{
    tsp__afold_t *f = tsp__afold_new(40000); /* 1 a second per rank, the floor */
    for (int i = 0; i < 50; i++)             /* 0.5 s of reports, then a pause */
        ck_assert_int_eq(offer_step(f, 3, i, 1000 + 10 * i), 0);
    ck_assert_int_eq(got.n, 1);
    ck_assert_int_eq(tsp__afold_flush(f, 1500, 0, put, &got), 0);
    ck_assert_int_eq(got.n, 1); /* it reported 10 ms ago: held for its token */
    ck_assert_int_eq(tsp__afold_flush(f, 1545, 0, put, &got), 0);
    ck_assert_int_eq(got.n, 2); /* quiet for 55 ms: out, 0.45 s before its token */
    ck_assert_double_eq(num(got.text[1], "step"), 49);
    ck_assert_double_eq(num(got.text[1], "summary.count"), 49);
    ck_assert_int_eq(offer_step(f, 3, 50, 1550), 0); /* it owes a token: folded */
    ck_assert_int_eq(tsp__afold_flush(f, 1700, 0, put, &got), 0);
    ck_assert_int_eq(got.n, 2); /* quiet, but in debt: held until the token is repaid */
    ck_assert_int_eq(tsp__afold_flush(f, 2010, 0, put, &got), 0);
    ck_assert_int_eq(got.n, 3); /* the debt repaid (0.46 s after the borrowing) */
    ck_assert_int_eq(calls(), 51);
    ck_assert_int_eq(tsp__afold_pending(f), 0);
    tsp__afold_free(f);
}
END_TEST

START_TEST(test_agentfold_a_record_it_cannot_fold_follows_the_rank_s_summary)
{
    tsp__afold_t *f = tsp__afold_new(40000);
    for (int i = 0; i < 5; i++)
        offer_step(f, 0, i, 1000);
    const char *params =
        "{\"step\": null, \"time\": 1.0, \"metrics\": {}, \"params\": {\"a\": \"b\"}}";
    ck_assert_int_eq(offer(f, 0, params, 1000), 0);
    ck_assert_int_eq(got.n, 3); /* step 0 as it is, the summary of 1-4, then the params */
    ck_assert_double_eq(num(got.text[1], "summary.count"), 4);
    ck_assert_str_eq(got.text[2], params);
    tsp__afold_free(f);
}
END_TEST

START_TEST(test_agentfold_a_full_queue_loses_nothing_and_the_end_flushes_all)
{
    tsp__afold_t *f = tsp__afold_new(40000);
    got.room = 0;
    ck_assert_int_eq(offer_step(f, 1, 0, 1000), -EAGAIN); /* not taken: offered again */
    got.room = -1;
    ck_assert_int_eq(offer_step(f, 1, 0, 1000), 0);
    for (int i = 1; i < 10; i++)
        ck_assert_int_eq(offer_step(f, 1, i, 1000), 0); /* folded: taken */
    offer_step(f, 2, 0, 1000);
    offer_step(f, 2, 1, 1000);
    got.room = 0;
    ck_assert_int_eq(tsp__afold_flush(f, 5000, 0, put, &got), -EAGAIN); /* due, no room: held */
    ck_assert_int_eq(tsp__afold_pending(f), 1);
    got.room = -1;
    ck_assert_int_eq(tsp__afold_flush(f, 5000, 1, put, &got), 0);
    ck_assert_int_eq(tsp__afold_pending(f), 0);
    ck_assert_int_eq(calls(), 12);
    tsp__afold_free(f);
}
END_TEST

/* The writer's thread offers while the sender's thread flushes (as in the log client):
 * every report() counted once, each rank's steps in order. */
typedef struct {
    pthread_mutex_t mu;
    long calls;
    int last_step[4];
    int disorder;
} shared_t;

static int put_shared(void *ctx, const tsp_line_t *ln)
{
    shared_t *sh = ctx;
    char *rec = strndup(ln->data, ln->len);
    double step = num(rec, "step");
    long n = strstr(rec, "\"summary\"") ? (long)num(rec, "summary.count") : 1;
    free(rec);
    pthread_mutex_lock(&sh->mu);
    sh->calls += n;
    sh->disorder += (int)step < sh->last_step[ln->rank];
    sh->last_step[ln->rank] = (int)step;
    pthread_mutex_unlock(&sh->mu);
    return 0;
}

typedef struct {
    tsp__afold_t *f;
    shared_t *sh;
    atomic_int stop;
} flusher_t;

static void *flusher(void *arg)
{
    flusher_t *fl = arg;
    while (!atomic_load(&fl->stop)) {
        tsp__afold_flush(fl->f, tsp__now_ms(), 0, put_shared, fl->sh);
        usleep(500);
    }
    return NULL;
}

START_TEST(test_agentfold_a_writer_and_the_sender_s_ticks_count_every_report_once)
{
    tsp__afold_t *f = tsp__afold_new(4000); /* 2.5 a second per rank */
    shared_t sh = {.mu = PTHREAD_MUTEX_INITIALIZER};
    flusher_t fl = {f, &sh, 0};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, flusher, &fl), 0);
    char rec[160];
    for (int i = 0; i < 20000; i++) {
        snprintf(rec, sizeof rec, "{\"step\": %d, \"time\": 1.5, \"metrics\": {\"loss\": 1}}", i);
        tsp_line_t ln = {
            .rank = i % 4, .stream = TSP_STREAM_REPORT, .data = rec, .len = strlen(rec)};
        ck_assert_int_eq(tsp__afold_offer(f, &ln, tsp__now_ms(), put_shared, &sh), 0);
        if (i % 1000 == 0)
            usleep(1000);
    }
    atomic_store(&fl.stop, 1);
    pthread_join(t, NULL);
    ck_assert_int_eq(tsp__afold_flush(f, tsp__now_ms(), 1, put_shared, &sh), 0);
    ck_assert_int_eq(sh.calls, 20000);
    ck_assert_int_eq(sh.disorder, 0);
    tsp__afold_free(f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("agentfold");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_agentfold_within_the_rate_every_record_passes_as_it_is);
    tcase_add_test(tc,
                   test_agentfold_beyond_the_rate_one_summary_per_interval_the_last_value_exact);
    tcase_add_test(tc, test_agentfold_a_quiet_rank_s_summary_goes_out_at_once_borrowing_one_token);
    tcase_add_test(tc, test_agentfold_a_record_it_cannot_fold_follows_the_rank_s_summary);
    tcase_add_test(tc, test_agentfold_a_full_queue_loses_nothing_and_the_end_flushes_all);
    tcase_add_test(tc, test_agentfold_a_writer_and_the_sender_s_ticks_count_every_report_once);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
