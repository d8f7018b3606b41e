/* test_reportagg.c: the driver's report budget (reportagg.c) between a report queue and
 * its puller, and the descriptor limit (fdlimit.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fdlimit.h"
#include "json.h"
#include "logqueue.h"
#include "reportagg.h"
#include "testutil.h"
#include "torchspark/logserver.h"

static tsp__logq_t q;

static void push_piece(int rank, unsigned flags, const char *data, size_t len)
{
    pthread_mutex_lock(&q.mu);
    ck_assert_int_eq(tsp__logq_push_locked(&q, rank, TSP_LOG_STREAM_REPORT, flags, data, len, 1),
                     0);
    pthread_mutex_unlock(&q.mu);
}

static void push(int rank, const char *rec)
{
    push_piece(rank, 0, rec, strlen(rec));
}

static void push_step(int rank, int step)
{
    char rec[160];
    snprintf(rec, sizeof rec, "{\"step\": %d, \"time\": %d.5, \"metrics\": {\"loss\": %d}}", step,
             1000 + step, step);
    push(rank, rec);
}

typedef struct {
    int rank;
    char *text;
} got_t;

/* Every record the budget hands out until the queue ended and all was pulled. */
static got_t *pull_all(tsp__ragg_t *a, int *n)
{
    got_t *all = NULL;
    *n = 0;
    tsp_logline_t out[64];
    for (;;) {
        int k = tsp__ragg_pull(a, &q, out, 64, 10);
        if (k == -EPIPE)
            break;
        ck_assert_int_ge(k, 0);
        all = realloc(all, (size_t)(*n + k) * sizeof *all);
        for (int i = 0; i < k; i++) {
            if (i > 0) /* one contiguous batch, as tsp_logserver_pull promises */
                ck_assert_ptr_eq(out[i].data, out[i - 1].data + out[i - 1].len);
            all[*n + i] = (got_t){out[i].rank, strndup(out[i].data, out[i].len)};
        }
        *n += k;
    }
    return all;
}

static void free_got(got_t *g, int n)
{
    for (int i = 0; i < n; i++)
        free(g[i].text);
    free(g);
}

static double num(const char *doc, const char *path)
{
    char *v = NULL;
    int type;
    ck_assert_msg(tsp_json_get(doc, strlen(doc), path, &v, &type) == 0, "%s in %s", path, doc);
    double d = strtod(v, NULL);
    free(v);
    return d;
}

static int has(const char *doc, const char *path)
{
    char *v = NULL;
    int type;
    int rc = tsp_json_get(doc, strlen(doc), path, &v, &type);
    free(v);
    return rc == 0;
}

static void setup(void)
{
    ck_assert_int_eq(tsp__logq_init(&q, 8u << 20, 0, 0, -1), 0);
}

static void teardown(void)
{
    tsp__logq_close(&q);
}

START_TEST(test_reportagg_within_the_budget_every_record_passes_as_it_is)
{
    tsp__ragg_t *a = tsp__ragg_new(2000);
    for (int s = 0; s < 500; s++)
        for (int r = 0; r < 2; r++)
            push_step(r, s);
    tsp__logq_end(&q);
    int n;
    got_t *g = pull_all(a, &n);
    ck_assert_int_eq(n, 1000); /* a burst within a second of each rank's share */
    int next[2] = {0, 0};
    for (int i = 0; i < n; i++) {
        char want[160];
        snprintf(want, sizeof want, "{\"step\": %d, \"time\": %d.5, \"metrics\": {\"loss\": %d}}",
                 next[g[i].rank], 1000 + next[g[i].rank], next[g[i].rank]);
        ck_assert_str_eq(g[i].text, want);
        next[g[i].rank]++;
        free(g[i].text);
    }
    free(g);
    tsp__ragg_free(a);
}
END_TEST

START_TEST(test_reportagg_beyond_the_budget_a_rank_is_folded_into_summaries)
{
    tsp__ragg_t *a = tsp__ragg_new(10); /* one rank: 10 a second, a burst of 10 */
    for (int s = 0; s < 1000; s++)
        push_step(0, s);
    tsp__logq_end(&q);
    int n;
    got_t *g = pull_all(a, &n);
    ck_assert_int_le(n, 30);
    long calls = 0;
    double last_step = -1;
    for (int i = 0; i < n; i++) {
        double step = num(g[i].text, "step");
        ck_assert(step > last_step); /* in order */
        long count = has(g[i].text, "summary") ? (long)num(g[i].text, "summary.count") : 1;
        if (count > 1) { /* the summary of steps (step - count, step]: loss = step */
            ck_assert(num(g[i].text, "summary.min.loss") == step - (double)count + 1);
            ck_assert(num(g[i].text, "summary.max.loss") == step);
            ck_assert(num(g[i].text, "summary.mean.loss") == step - (double)(count - 1) / 2);
            ck_assert(num(g[i].text, "summary.first_time") == 1000 + step - (double)count + 1.5);
        }
        ck_assert(num(g[i].text, "metrics.loss") == step); /* the last values */
        ck_assert(num(g[i].text, "time") == 1000 + step + 0.5);
        calls += count;
        last_step = step;
        free(g[i].text);
    }
    ck_assert_int_eq(calls, 1000); /* every report() is counted in one record */
    ck_assert(last_step == 999);   /* the last one arrives, at the end of the run */
    free(g);
    tsp__ragg_free(a);
}
END_TEST

START_TEST(test_reportagg_a_record_it_cannot_fold_follows_the_rank_s_summary)
{
    tsp__ragg_t *a = tsp__ragg_new(1);
    for (int s = 0; s < 5; s++)
        push_step(3, s);
    push(3, "{\"step\": null, \"time\": 2000.0, \"metrics\": {}, \"params\": {\"lr\": \"0.1\"}}");
    push(3, "{\"step\": 9, \"time\": 2001.0, \"metrics\": {\"loss\": NaN}}");
    tsp__logq_end(&q);
    int n;
    got_t *g = pull_all(a, &n);
    ck_assert_int_eq(n, 4);
    ck_assert(num(g[0].text, "step") == 0 && !has(g[0].text, "summary"));
    ck_assert(num(g[1].text, "step") == 4 && num(g[1].text, "summary.count") == 4);
    ck_assert(strstr(g[2].text, "\"params\"") != NULL);
    ck_assert(strstr(g[3].text, "NaN") != NULL);
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(g[i].rank, 3);
    free_got(g, n);
    tsp__ragg_free(a);
}
END_TEST

START_TEST(test_reportagg_no_budget_hands_on_the_queue_s_records)
{
    tsp__ragg_t *a = tsp__ragg_new(0);
    for (int s = 0; s < 300; s++)
        push_step(0, s);
    tsp__logq_end(&q);
    int n;
    got_t *g = pull_all(a, &n);
    ck_assert_int_eq(n, 300);
    free_got(g, n);
    tsp__ragg_free(a);
}
END_TEST

/* The drops the budget told of: "rank: why" each. */
static char drops[8][200];
static int ndrops;

static void on_drop(void *ctx, int32_t rank, const char *why)
{
    (void)ctx;
    if (ndrops < 8)
        snprintf(drops[ndrops++], sizeof drops[0], "%d: %s", (int)rank, why);
}

static tsp__ragg_t *ragg_watched(double budget)
{
    tsp__ragg_t *a = tsp__ragg_new(budget);
    a->on_drop = on_drop;
    ndrops = 0;
    return a;
}

START_TEST(test_reportagg_pieces_interleaved_between_ranks_arrive_as_whole_records)
{
    const char *r0[] = {"{\"step\": 1, \"time\": 5.0, ", "\"metrics\": {\"a\": ", "1}}"};
    const char *r1[] = {"{\"step\": 2, \"time\": 6.0, ", "\"metrics\": {\"b\": 2}}"};
    for (int budget = 0; budget <= 1000; budget += 1000) {
        tsp__ragg_t *a = ragg_watched(budget);
        push_piece(0, TSP_LOG_LINE_CONTINUED, r0[0], strlen(r0[0]));
        push_piece(1, TSP_LOG_LINE_CONTINUED, r1[0], strlen(r1[0]));
        push_piece(0, TSP_LOG_LINE_CONTINUED, r0[1], strlen(r0[1]));
        push_step(2, 7); /* another rank's whole record passes meanwhile */
        push_piece(1, 0, r1[1], strlen(r1[1]));
        push_piece(0, 0, r0[2], strlen(r0[2]));
        push_step(0, 8); /* after its rank's long record: the order per rank holds */
        tsp__logq_end(&q);
        int n;
        got_t *g = pull_all(a, &n);
        ck_assert_int_eq(n, 4);
        ck_assert_int_eq(g[0].rank, 2);
        ck_assert_int_eq(g[1].rank, 1);
        ck_assert_str_eq(g[1].text, "{\"step\": 2, \"time\": 6.0, \"metrics\": {\"b\": 2}}");
        ck_assert_int_eq(g[2].rank, 0);
        ck_assert_str_eq(g[2].text, "{\"step\": 1, \"time\": 5.0, \"metrics\": {\"a\": 1}}");
        ck_assert(g[3].rank == 0 && num(g[3].text, "step") == 8);
        ck_assert_int_eq(ndrops, 0);
        ck_assert_uint_eq(a->held, 0);
        free_got(g, n);
        tsp__ragg_free(a);
        tsp__logq_close(&q);
        setup();
    }
}
END_TEST

START_TEST(test_reportagg_a_record_without_its_last_piece_at_the_run_s_end_is_dropped)
{
    tsp__ragg_t *a = ragg_watched(1000);
    push_piece(4, TSP_LOG_LINE_CONTINUED, "{\"step\": 1, ", 12);
    push_step(5, 1);
    tsp__logq_end(&q);
    int n;
    got_t *g = pull_all(a, &n);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(g[0].rank, 5);
    ck_assert_int_eq(ndrops, 1);
    ck_assert_str_eq(drops[0], "4: the run ended before its last piece (12 bytes held)");
    ck_assert_uint_eq(a->dropped, 1);
    free_got(g, n);
    tsp__ragg_free(a);
}
END_TEST

START_TEST(test_reportagg_a_record_over_the_cap_is_dropped_to_its_last_piece)
{
    tsp__ragg_t *a = ragg_watched(0);
    size_t mib = 1u << 20;
    char *big = malloc(mib);
    memset(big, ' ', mib);
    for (int i = 0; i < TSP_REPORT_RECORD_MAX / (int)mib + 2; i++) /* over the cap, then more */
        push_piece(6, TSP_LOG_LINE_CONTINUED, big, mib);
    push_piece(6, 0, "}", 1); /* its last piece: dropped too */
    push_step(6, 3);          /* the rank's next record passes */
    tsp__logq_end(&q);
    int n;
    got_t *g = pull_all(a, &n);
    ck_assert_int_eq(n, 1);
    ck_assert(num(g[0].text, "step") == 3);
    ck_assert_int_eq(ndrops, 1);
    ck_assert_msg(strstr(drops[0], "6: its pieces exceed 16777216 bytes") == drops[0], "%s",
                  drops[0]);
    ck_assert_uint_eq(a->held, 0);
    free_got(g, n);
    free(big);
    tsp__ragg_free(a);
}
END_TEST

START_TEST(test_fdlimit_raised_to_the_hard_limit_else_a_sentence_with_the_nodes)
{
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 600)
        return; /* this host's hard limit is too low to try */
    rl.rlim_cur = 300;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    char err[1024] = "";
    ck_assert_int_eq(tsp_logserver_fd_check(100, err, sizeof err), 0); /* raised */
    struct rlimit now;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &now), 0);
    ck_assert(now.rlim_cur == rl.rlim_max);
    ck_assert_int_eq(tsp__fdlimit_raise(), 0); /* already at the hard limit */
    now.rlim_cur = now.rlim_max = 400;         /* a hard limit of 400 (this forked test only) */
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &now), 0);
    ck_assert_int_eq(tsp_logserver_fd_check(72, err, sizeof err), 0); /* 72 * 2 + 256 */
    ck_assert_int_eq(tsp_logserver_fd_check(2048, err, sizeof err), -EMFILE);
    ck_assert_msg(strstr(err, "the driver may open 400 file descriptors") &&
                      strstr(err, "a job of 2048 nodes needs about 4352") &&
                      strstr(err, "ulimit -n 4352"),
                  "%s", err);
    ck_assert_int_eq(tsp_logserver_fd_check(-1, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "nodes must be >= 0, got -1");
    /* the same through the server's JSON call, the one op without a server (protocol 1.14) */
    char out[64];
    const char *req = "{\"op\": \"fd_check\", \"nodes\": 72}";
    ck_assert_int_eq(
        tsp_logserver_call(NULL, req, strlen(req), out, sizeof out, NULL, err, sizeof err), 0);
    ck_assert_str_eq(out, "{}");
    req = "{\"op\": \"fd_check\", \"nodes\": 2048}";
    ck_assert_int_eq(
        tsp_logserver_call(NULL, req, strlen(req), out, sizeof out, NULL, err, sizeof err),
        -EMFILE);
    ck_assert_msg(strstr(err, "a job of 2048 nodes needs about 4352"), "%s", err);
    req = "{\"op\": \"stats\"}";
    ck_assert_int_eq(
        tsp_logserver_call(NULL, req, strlen(req), out, sizeof out, NULL, err, sizeof err),
        -EINVAL);
    ck_assert_str_eq(err, "tsp_logserver_call: no log server");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reportagg");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_reportagg_within_the_budget_every_record_passes_as_it_is);
    tcase_add_test(tc, test_reportagg_beyond_the_budget_a_rank_is_folded_into_summaries);
    tcase_add_test(tc, test_reportagg_a_record_it_cannot_fold_follows_the_rank_s_summary);
    tcase_add_test(tc, test_reportagg_no_budget_hands_on_the_queue_s_records);
    tcase_add_test(tc, test_reportagg_pieces_interleaved_between_ranks_arrive_as_whole_records);
    tcase_add_test(tc, test_reportagg_a_record_without_its_last_piece_at_the_run_s_end_is_dropped);
    tcase_add_test(tc, test_reportagg_a_record_over_the_cap_is_dropped_to_its_last_piece);
    tcase_add_test(tc, test_fdlimit_raised_to_the_hard_limit_else_a_sentence_with_the_nodes);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
