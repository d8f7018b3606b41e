/* test_jreq.c: the one reader of a JSON request (jreq.c): each getter's present, absent,
 * null and wrong-kind cases, and the sentence that names the request, the key and what it
 * must be. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "jreq.h"
#include "json.h"
#include "testutil.h"

static char err[256];

static tsp_jreq_t req(const char *doc)
{
    tsp_jreq_t r = {doc, strlen(doc), "the test request", err, sizeof err};
    err[0] = 0;
    return r;
}

START_TEST(test_jreq_get_present_absent_null_and_wrong_kind)
{
    tsp_jreq_t r = req("{\"a\": {\"b\": \"x\"}, \"n\": null, \"k\": 5}");
    char *v = NULL;
    ck_assert_int_eq(tsp_jreq_get(&r, "a.b", TSP_JSON_STRING, "a string", &v), 1);
    ck_assert_str_eq(v, "x");
    free(v);
    ck_assert_int_eq(tsp_jreq_get(&r, "gone", TSP_JSON_STRING, "a string", &v), 0);
    ck_assert_ptr_null(v);
    ck_assert_int_eq(tsp_jreq_get(&r, "n", TSP_JSON_OBJECT, "an object", &v), 0);
    ck_assert_ptr_null(v);
    ck_assert_str_eq(err, "");
    ck_assert_int_eq(tsp_jreq_get(&r, "k", TSP_JSON_STRING, "a string or null", &v), -EINVAL);
    ck_assert_ptr_null(v);
    ck_assert_str_eq(err, "the test request's \"k\" must be a string or null");
    r = req("{\"a\": ");
    ck_assert_int_eq(tsp_jreq_get(&r, "a", TSP_JSON_STRING, "a string", &v), -EINVAL);
    ck_assert_str_eq(err, "the test request is not a JSON object");
}
END_TEST

START_TEST(test_jreq_peek_reads_without_checking)
{
    tsp_jreq_t r = req("{\"s\": \"x\", \"k\": 5}");
    char *v = NULL;
    ck_assert_int_eq(tsp_jreq_peek(&r, "k", TSP_JSON_NUMBER, &v), 1);
    ck_assert_str_eq(v, "5");
    free(v);
    ck_assert_int_eq(tsp_jreq_peek(&r, "s", TSP_JSON_NUMBER, &v), 0);
    ck_assert_ptr_null(v);
    ck_assert_int_eq(tsp_jreq_peek(&r, "gone", TSP_JSON_NUMBER, &v), 0);
    ck_assert_str_eq(err, "");
}
END_TEST

START_TEST(test_jreq_str_and_bool)
{
    tsp_jreq_t r = req("{\"s\": \"x\", \"t\": true, \"f\": false, \"k\": 1}");
    char *v = NULL;
    ck_assert_int_eq(tsp_jreq_str(&r, "s", 1, &v), 0);
    ck_assert_str_eq(v, "x");
    free(v);
    ck_assert_int_eq(tsp_jreq_str(&r, "gone", 0, &v), 0);
    ck_assert_ptr_null(v);
    ck_assert_int_eq(tsp_jreq_str(&r, "gone", 1, &v), -EINVAL);
    ck_assert_str_eq(err, "the test request has no \"gone\" (a string)");
    ck_assert_int_eq(tsp_jreq_str(&r, "k", 0, &v), -EINVAL);
    ck_assert_str_eq(err, "the test request's \"k\" must be a string");
    int b = 7;
    ck_assert_int_eq(tsp_jreq_bool(&r, "t", &b), 0);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(tsp_jreq_bool(&r, "f", &b), 0);
    ck_assert_int_eq(b, 0);
    b = 7;
    ck_assert_int_eq(tsp_jreq_bool(&r, "gone", &b), 0);
    ck_assert_int_eq(b, 0);
    ck_assert_int_eq(tsp_jreq_bool(&r, "s", &b), -EINVAL);
    ck_assert_str_eq(err, "the test request's \"s\" must be true or false");
}
END_TEST

START_TEST(test_jreq_numbers_in_range)
{
    tsp_jreq_t r = req("{\"a\": 12, \"neg\": -3, \"frac\": 1.5, \"exp\": 1e3, \"big\": "
                       "2147483648, \"s\": \"1\", \"n\": null}");
    long long x = 99;
    ck_assert_int_eq(tsp_jreq_num(&r, "a", 0, 100, "a whole number from 0", &x), 0);
    ck_assert_int_eq(x, 12);
    x = 99;
    ck_assert_int_eq(tsp_jreq_num(&r, "n", 0, 100, "a whole number from 0", &x), 0);
    ck_assert_int_eq(x, 99); /* null: left as it is */
    const char *bad[] = {"neg", "frac", "exp", "s"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(tsp_jreq_num(&r, bad[i], 0, 100, "a whole number from 0", &x), -EINVAL);
        ck_assert_int_eq(x, 99);
    }
    ck_assert_str_eq(err, "the test request's \"s\" must be a whole number from 0");
    int v = 5;
    ck_assert_int_eq(tsp_jreq_int(&r, "neg", 1, &v), 0);
    ck_assert_int_eq(v, -3);
    ck_assert_int_eq(tsp_jreq_int(&r, "neg", 0, &v), -EINVAL);
    ck_assert_str_eq(err, "the test request's \"neg\" must be a whole number >= 0");
    ck_assert_int_eq(tsp_jreq_int(&r, "s", 0, &v), -EINVAL);
    ck_assert_str_eq(err, "the test request's \"s\" must be a whole number");
    ck_assert_int_eq(tsp_jreq_int(&r, "big", 1, &v), -EINVAL);
    ck_assert_str_eq(err, "the test request's \"big\" must be a whole number");
    v = 5;
    ck_assert_int_eq(tsp_jreq_int(&r, "gone", 1, &v), 0);
    ck_assert_int_eq(v, 5);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("jreq");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_jreq_get_present_absent_null_and_wrong_kind);
    tcase_add_test(tc, test_jreq_peek_reads_without_checking);
    tcase_add_test(tc, test_jreq_str_and_bool);
    tcase_add_test(tc, test_jreq_numbers_in_range);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
