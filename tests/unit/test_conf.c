/* test_conf.c: the settings key table (torchspark/conf.h): the grammars at their edges, the
 * reply's shape, the sizes, the walk over an object's members (json.h's tsp_json_each). The
 * golden cases of tests/contracts/conf.json are replayed by pytest and JUnit. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "json.h"
#include "torchspark/conf.h"

static char out[8192];
static char err[512];

static int conf(const char *req)
{
    size_t need = 0;
    return tsp_conf_read(req, strlen(req), out, sizeof out, &need, err, sizeof err);
}

START_TEST(test_conf_defaults_and_durations_in_ms)
{
    ck_assert_int_eq(conf("{}"), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"spark.torchspark.warmWorkers.idleTimeout\": 300000"));
    ck_assert_ptr_nonnull(strstr(out, "\"spark.torchspark.hangTimeout\": null"));
    ck_assert_ptr_nonnull(strstr(out, "\"unknown\": []"));
    ck_assert_int_eq(conf("{\"conf\": {\"spark.torchspark.hangTimeout\": \"1d\"}}"), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"spark.torchspark.hangTimeout\": 86400000"));
    ck_assert_int_eq(conf("{\"conf\": {\"spark.torchspark.hangTimeout\": \"1500us\"}}"), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"spark.torchspark.hangTimeout\": 1,"));
    /* The largest accepted, and one past it. */
    ck_assert_int_eq(conf("{\"conf\": {\"spark.torchspark.hangTimeout\": \"1000000000000ms\"}}"),
                     0);
    ck_assert_int_eq(conf("{\"conf\": {\"spark.torchspark.hangTimeout\": \"1000000000001ms\"}}"),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "is too long"));
    ck_assert_int_eq(conf("{\"conf\": {\"spark.torchspark.hangTimeout\": \""
                          "99999999999999999999999999d\"}}"),
                     -EINVAL);
}
END_TEST

START_TEST(test_conf_one_sentence_per_bad_value)
{
    ck_assert_int_eq(conf("{\"conf\": {\"spark.torchspark.warmWorkers\": \"yes\"}}"), -EINVAL);
    ck_assert_str_eq(err, "spark.torchspark.warmWorkers='yes' is not a boolean: use true or false");
    ck_assert_int_eq(
        conf("{\"args\": {\"spark.torchspark.hangTimeout\": {\"name\": \"hang_timeout\","
             " \"value\": -0.5}}}"),
        -EINVAL);
    ck_assert_str_eq(err, "hang_timeout=-0.5 is negative: use a duration such as 30min");
    ck_assert_int_eq(conf("{\"args\": {\"spark.torchspark.hangAction\": {\"name\": \"hang_action\","
                          " \"value\": [1]}}}"),
                     -EINVAL);
    ck_assert_str_eq(err, "hang_action=[1] is not one of the values: use report or cancel");
    /* An argument without its name would be refused under no name: the request is wrong. */
    ck_assert_int_eq(conf("{\"args\": {\"spark.torchspark.hangTimeout\": {\"value\": 1e308}}}"),
                     -EINVAL);
    ck_assert_str_eq(err,
                     "the settings request's argument spark.torchspark.hangTimeout must have a "
                     "string \"name\"");
    ck_assert_int_eq(conf("{\"args\": {\"spark.torchspark.hangTimeout\": {\"name\": \"t\"}}}"), 0);
    ck_assert_int_eq(conf("[]"), -EINVAL);
    ck_assert_int_eq(conf("{\"conf\": 3}"), -EINVAL);
    ck_assert_str_eq(err, "the settings request's \"conf\" must be an object");
}
END_TEST

START_TEST(test_conf_unknown_keys_are_warnings_with_the_closest)
{
    ck_assert_int_eq(
        conf("{\"conf\": {\"spark.torchspark.hangTimout\": \"x\", \"spark.other\": \"y\"}}"), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"closest\": \"spark.torchspark.hangTimeout\""));
    ck_assert_ptr_null(strstr(out, "spark.other"));
    /* A key longer than the distance table: no closest key, no overflow. */
    char req[1024];
    snprintf(req, sizeof req, "{\"conf\": {\"spark.torchspark.%0400d\": \"1\"}}", 0);
    ck_assert_int_eq(conf(req), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"closest\": null"));
}
END_TEST

START_TEST(test_conf_sizes)
{
    char small[16];
    size_t need = 0;
    ck_assert_int_eq(tsp_conf_read("{}", 2, small, sizeof small, &need, err, sizeof err), -ENOSPC);
    ck_assert_uint_gt(need, sizeof small);
    char *big = malloc(need);
    ck_assert_int_eq(tsp_conf_read("{}", 2, big, need, &need, err, sizeof err), 0);
    free(big);
    ck_assert_int_eq(tsp_conf_table("", 0, out, sizeof out, &need, NULL, 0), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"key\": \"spark.torchspark.plugin.killGraceMs\""));
}
END_TEST

/* The reply's "encryption" (docs/protocol.md §9, "Where Spark encrypts"): the longest line,
 * every key on and both override keys, is whole; a value that is not a string is off. */
START_TEST(test_conf_encryption_longest_line_and_odd_values)
{
    ck_assert_int_eq(conf("{\"conf\": {\"spark.ssl.enabled\": \"true\", "
                          "\"spark.network.crypto.enabled\": \"true\", \"spark.authenticate\": "
                          "\"true\", \"spark.io.encryption.enabled\": \"true\", "
                          "\"pytorch.spark.distributor.ignoreSsl\": \"true\", "
                          "\"deepspeed.spark.distributor.ignoreSsl\": \"true\"}}"),
                     0);
    ck_assert_ptr_nonnull(strstr(out, "\"level\": \"WARNING\""));
    ck_assert_ptr_nonnull(strstr(out, "spark.io.encryption.enabled=true); torchspark's own"));
    ck_assert_ptr_nonnull(strstr(out, "(deepspeed.spark.distributor.ignoreSsl=true is accepted for "
                                      "compatibility and changes nothing: torchspark sends "
                                      "nothing in clear over its own channel)\""));
    ck_assert_int_eq(conf("{\"conf\": {\"spark.ssl.enabled\": true, \"spark.authenticate\": "
                          "\"  true, of course\"}}"),
                     0);
    ck_assert_ptr_nonnull(strstr(out, "\"spark\": []"));
    ck_assert_ptr_nonnull(strstr(out, "\"level\": \"INFO\""));
}
END_TEST

static int count_members(void *ctx, const char *key, size_t index, int type, const char *value,
                         size_t len)
{
    (void)key;
    (void)index;
    (void)value;
    (void)type;
    (void)len;
    return ++*(int *)ctx == 2 ? 7 : 0;
}

START_TEST(test_json_each_walks_members_and_stops)
{
    int n = 0;
    const char *doc = "{\"a.b\": 1, \"c\": {\"d\": 2}, \"e\": 3}";
    ck_assert_int_eq(tsp_json_each(doc, strlen(doc), NULL, count_members, &n), 7);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(tsp_json_each("{\"a\":", 5, NULL, count_members, &n), -EINVAL);
}
END_TEST

/* "env": true reads the driver's switches from this process's environment, in C: they win
 * over the conf, and a bad one names the variable. */
START_TEST(test_conf_env_true_reads_the_process_switches)
{
    const char *req = "{\"conf\": {\"spark.torchspark.ncclCheck\": \"true\"}, \"env\": true}";
    setenv("TORCHSPARK_NCCL_CHECK", "0", 1);
    setenv("TORCHSPARK_WARM_IDLE_TIMEOUT", "7s", 1);
    ck_assert_int_eq(conf(req), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"spark.torchspark.ncclCheck\": false"));
    ck_assert_ptr_nonnull(strstr(out, "\"spark.torchspark.warmWorkers.idleTimeout\": 7000"));
    ck_assert_int_eq(conf("{\"conf\": {\"spark.torchspark.ncclCheck\": \"true\"}}"), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"spark.torchspark.ncclCheck\": true")); /* not asked */
    setenv("TORCHSPARK_NCCL_CHECK", "maybe", 1);
    ck_assert_int_eq(conf(req), -EINVAL);
    ck_assert_str_eq(err,
                     "TORCHSPARK_NCCL_CHECK='maybe' is not a boolean: use 1, 0, true or false");
    unsetenv("TORCHSPARK_NCCL_CHECK");
    unsetenv("TORCHSPARK_WARM_IDLE_TIMEOUT");
}
END_TEST

static Suite *conf_suite(void)
{
    Suite *s = suite_create("conf");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_conf_defaults_and_durations_in_ms);
    tcase_add_test(tc, test_conf_one_sentence_per_bad_value);
    tcase_add_test(tc, test_conf_unknown_keys_are_warnings_with_the_closest);
    tcase_add_test(tc, test_conf_sizes);
    tcase_add_test(tc, test_conf_encryption_longest_line_and_odd_values);
    tcase_add_test(tc, test_json_each_walks_members_and_stops);
    tcase_add_test(tc, test_conf_env_true_reads_the_process_switches);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(conf_suite());
}
