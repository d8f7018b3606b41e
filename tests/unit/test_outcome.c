/* test_outcome.c: the outcome table in C (torchspark/outcome.h), under the sanitizers too:
 * the rows' order, the reply's buffer rule and malformed or oversized requests. Every
 * golden case of tests/contracts/outcome.json is replayed by pytest and JUnit. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "torchspark/outcome.h"

static char out[8192], err[512];

static int classify(const char *req)
{
    return tsp_outcome_classify(req, strlen(req), out, sizeof out, NULL, err, sizeof err);
}

START_TEST(test_outcome_root_first_then_spark)
{
    /* A silent node outranks Spark's ExecutorLostFailure; its prose is not read. */
    ck_assert_int_eq(classify("{\"root\": {\"kind\": \"lost\", \"node_rank\": 1, \"host\": \"h\", "
                              "\"report\": {\"torchspark\": {\"reason\": \"silent\", \"summary\": "
                              "\"lost connection to node 1\"}}}, \"spark_error\": "
                              "\"ExecutorLostFailure (executor 1 exited)\"}"),
                     0);
    ck_assert_msg(strstr(out, "\"reason\": \"silent\"") && strstr(out, "\"exclude\": true") &&
                      strstr(out, "\"node_rank\": 1") && strstr(out, "check host h "),
                  "%s", out);
    ck_assert_int_eq(classify("{\"root\": {\"kind\": \"lost\", \"message\": \"it went silent\"}}"),
                     0);
    ck_assert_msg(strstr(out, "\"reason\": \"eof\"") && strstr(out, "\"exclude\": false"), "%s",
                  out);
    ck_assert_int_eq(classify("{\"spark_error\": \"x ExecutorLostFailure (executor 7 exited "
                              "caused by one of the running tasks) Reason: OOM \\nmore\"}"),
                     0);
    ck_assert_msg(strstr(out, "\"executor\": \"7\"") &&
                      strstr(out, "\"cause\": \"executor 7 exited caused by one of the running "
                                  "tasks: OOM (ExecutorLostFailure)\""),
                  "%s", out);
    ck_assert_int_eq(classify("{}"), 0);
    ck_assert_msg(strstr(out, "\"reason\": \"spark\"") && strstr(out, "no error text"), "%s", out);
}
END_TEST

START_TEST(test_outcome_buffer_and_refusals)
{
    const char *req = "{\"spark_error\": \"Job 3 cancelled\"}";
    size_t need = 0;
    char small[16];
    ck_assert_int_eq(tsp_outcome_classify(req, strlen(req), small, sizeof small, &need, err,
                                          sizeof err),
                     -ENOSPC);
    ck_assert_uint_gt(need, sizeof small);
    ck_assert_int_eq(tsp_outcome_classify(req, strlen(req), out, need, &need, err, sizeof err), 0);
    ck_assert_uint_eq(strlen(out) + 1, need);
    ck_assert_ptr_nonnull(strstr(out, "\"reason\": \"cancelled\""));
    ck_assert_int_eq(classify("[]"), -EINVAL);
    ck_assert_str_eq(err, "the outcome request is not a JSON object");
    ck_assert_int_eq(classify("{\"root\": 3}"), -EINVAL);
    ck_assert_int_eq(classify("{\"output_went\": true}"), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"output_went\" must be a string or null"));
    /* A long first line and an unclosed marker are cut, not overrun. */
    size_t n = 20000;
    char *big = malloc(n + 64);
    ck_assert_ptr_nonnull(big);
    int k = snprintf(big, n + 64, "{\"spark_error\": \"ExecutorLostFailure (");
    memset(big + k, 'x', n - (size_t)k);
    strcpy(big + n, "\"}");
    ck_assert_int_eq(classify(big), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"reason\": \"executor_lost\""));
    free(big);
}
END_TEST

static Suite *outcome_suite(void)
{
    Suite *s = suite_create("outcome");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_outcome_root_first_then_spark);
    tcase_add_test(tc, test_outcome_buffer_and_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(outcome_suite());
}
