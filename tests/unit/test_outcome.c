/* test_outcome.c: the outcome table in C (torchspark/outcome.h), under the sanitizers too:
 * the rows' order, the reply's buffer rule and malformed or oversized requests. Every
 * golden case of tests/contracts/outcome.json is replayed by pytest and JUnit. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "torchspark/failure.h"
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
    ck_assert_int_eq(
        tsp_outcome_classify(req, strlen(req), small, sizeof small, &need, err, sizeof err),
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

/* What a task carried in Spark's text (rows 2 and 4) is text from the executors: broken
 * base64, a document that is not an object, markers at the very end, thousands of markers. */
START_TEST(test_outcome_carried_bytes_are_read_with_care)
{
    static const char *junk[] = {
        "TORCHSPARK-FAILURE-REPORT-V2:",         /* nothing after the marker */
        "TORCHSPARK-FAILURE-REPORT-V2:e30",      /* not a whole group */
        "TORCHSPARK-FAILURE-REPORT-V2:e3=0",     /* padding inside */
        "TORCHSPARK-FAILURE-REPORT-V2:=e30",     /* padding first */
        "TORCHSPARK-FAILURE-REPORT-V2:e30=e30=", /* padding mid-run */
        "TORCHSPARK-FAILURE-REPORT-V2:WzFd",     /* [1]: not an object */
        "TORCHSPARK-FAILURE-REPORT-V2:eyJh",     /* {"a: cut JSON */
        "TORCHSPARK-FAILURE-REPORT-V2:AAAA",     /* NUL bytes */
    };
    char req[256];
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        snprintf(req, sizeof req, "{\"spark_error\": \"%s\"}", junk[i]);
        ck_assert_int_eq(classify(req), 0);
        ck_assert_msg(strstr(out, "\"reason\": \"spark\"") && strstr(out, "\"carried\": null"),
                      "%s: %s", junk[i], out);
    }
    /* {} carried: an object without a time or a reason reads as a rank's exit. */
    ck_assert_int_eq(classify("{\"spark_error\": \"x TORCHSPARK-FAILURE-REPORT-V2:e30=\"}"), 0);
    ck_assert_msg(strstr(out, "\"kind\": \"failure\"") && strstr(out, "\"carried\": {}") &&
                      strstr(out, "\"reason\": \"exit\""),
                  "%s", out);
    /* A set-up marker at the very end: an empty sentence. */
    ck_assert_int_eq(classify("{\"spark_error\": \"TORCHSPARK_SETUP_ERROR: \"}"), 0);
    ck_assert_msg(strstr(out, "\"setup\": \"setup_error\"") && strstr(out, "\"text\": \"\""), "%s",
                  out);
    /* Ten thousand markers, each a small document: the first is kept (no time), no leak. */
    size_t n = 10000, each = strlen("TORCHSPARK-FAILURE-REPORT-V2:e30= ");
    char *big = malloc(n * each + 64);
    ck_assert_ptr_nonnull(big);
    size_t k = (size_t)snprintf(big, 64, "{\"spark_error\": \"");
    for (size_t i = 0; i < n; i++, k += each)
        memcpy(big + k, "TORCHSPARK-FAILURE-REPORT-V2:e30= ", each);
    strcpy(big + k, "\"}");
    ck_assert_int_eq(classify(big), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"carried\": {}"));
    free(big);
}
END_TEST

/* With a product: what the glue raises, written here for Spark's rows (message, report), or
 * the request that finishes a failure document and the ranks whose lines it takes; a
 * root record's huge report and a nproc that is not a count, under the sanitizers. */
START_TEST(test_outcome_what_the_glue_raises)
{
    ck_assert_int_eq(classify("{\"spark_error\": \"Job 3 cancelled\", \"product\": \"P\"}"), 0);
    ck_assert_msg(strstr(out, "\"message\": \"P (distributed) failed: the Spark job was "
                              "cancelled: Job 3 cancelled\\nTo fix it: ") &&
                      strstr(out, "\"report\": {\"version\": 2, \"kind\": \"spark\", "
                                  "\"reason\": \"cancelled\"}, \"finish\": null, \"lines_of\": []"),
                  "%s", out);
    ck_assert_int_eq(classify("{\"root\": {\"kind\": \"lost\", \"node_rank\": 3, \"host\": "
                              "\"h\", \"detail\": \"d\"}, \"product\": \"P\", \"mode\": \"local\", "
                              "\"nproc_per_node\": 2}"),
                     0);
    ck_assert_msg(strstr(out, "\"finish\": {\"document\": null, \"node_rank\": 3, \"host\": "
                              "\"h\", \"nproc_per_node\": 2, \"product\": \"P\", \"mode\": "
                              "\"local\", \"output_went\": null, \"detail\": null}, "
                              "\"lines_of\": [6, 7]}") &&
                      strstr(out, "\"message\": null, \"report\": null"),
                  "%s", out);
    /* A node rank near INT_MAX: its ranks past it, not an overflow. */
    ck_assert_int_eq(classify("{\"root\": {\"kind\": \"lost\", \"node_rank\": 2147483647}, "
                              "\"product\": \"P\", \"nproc_per_node\": 2}"),
                     0);
    ck_assert_msg(strstr(out, "\"lines_of\": [4294967294, 4294967295]}"), "%s", out);
    ck_assert_int_eq(classify("{\"product\": \"P\", \"nproc_per_node\": 65537}"), -EINVAL);
    ck_assert_int_eq(classify("{\"product\": \"P\", \"nproc_per_node\": 1.5}"), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"nproc_per_node\" must be a whole number"));
    ck_assert_int_eq(classify("{\"product\": 7}"), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"product\" must be a string or null"));
    /* A report larger than the reply's buffer: -ENOSPC with the size, not an overrun. */
    size_t n = 20000;
    char *big = malloc(n + 200);
    ck_assert_ptr_nonnull(big);
    int k = snprintf(big, n + 200,
                     "{\"product\": \"P\", \"root\": {\"kind\": \"failure\", "
                     "\"report\": {\"torchspark\": {\"rank\": 2}, \"pad\": \"");
    memset(big + k, 'x', n - (size_t)k);
    strcpy(big + n, "\"}}}");
    size_t need = 0;
    ck_assert_int_eq(
        tsp_outcome_classify(big, strlen(big), out, sizeof out, &need, err, sizeof err), -ENOSPC);
    char *room = malloc(need);
    ck_assert_ptr_nonnull(room);
    ck_assert_int_eq(tsp_outcome_classify(big, strlen(big), room, need, &need, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(room, "\"lines_of\": [2]}"));
    free(room);
    free(big);
}
END_TEST

/* The driver's lines that finish a document (tsp_failure_report's "lines", named by the
 * outcome's lines_of): a lost node's all prefixed as its tail, a rank's shown; a member that
 * is not a string is passed over, "lines" that is not an object refused. */
START_TEST(test_outcome_lines_finish_the_document)
{
    const char *lost = "{\"document\": {\"torchspark\": {\"kind\": \"lost\", \"node_rank\": 2, "
                       "\"summary\": \"lost\"}}, \"product\": \"P\", \"lines\": {\"4\": "
                       "\"a\\nb\", \"5\": 7, \"6\": \"\", \"7\": \"c\"}}";
    ck_assert_int_eq(tsp_failure_report(lost, strlen(lost), out, sizeof out, NULL, err, sizeof err),
                     0);
    ck_assert_msg(
        strstr(out, "\"tail\": \"[rank 4] a\\n[rank 4] b\\n[rank 7] c\"") &&
            strstr(out, "\"last_lines\": [\"[rank 4] a\", \"[rank 4] b\", \"[rank 7] c\"]"),
        "%s", out);
    const char *rank = "{\"document\": {\"torchspark\": {\"rank\": 1, \"tail\": \"own\"}}, "
                       "\"product\": \"P\", \"lines\": {\"1\": \"driver's\"}}";
    ck_assert_int_eq(tsp_failure_report(rank, strlen(rank), out, sizeof out, NULL, err, sizeof err),
                     0);
    ck_assert_msg(strstr(out, "  driver's") && strstr(out, "\"tail\": \"own\"") &&
                      strstr(out, "\"last_lines\": [\"driver's\"]"),
                  "%s", out);
    const char *bad = "{\"lines\": [\"x\"]}";
    ck_assert_int_eq(tsp_failure_report(bad, strlen(bad), out, sizeof out, NULL, err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"lines\" must be the driver's lines by rank"));
}
END_TEST

static Suite *outcome_suite(void)
{
    Suite *s = suite_create("outcome");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_outcome_root_first_then_spark);
    tcase_add_test(tc, test_outcome_buffer_and_refusals);
    tcase_add_test(tc, test_outcome_carried_bytes_are_read_with_care);
    tcase_add_test(tc, test_outcome_what_the_glue_raises);
    tcase_add_test(tc, test_outcome_lines_finish_the_document);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(outcome_suite());
}
