/* test_json.c: the strict reader's lookups and refusals, and the writer. The reader is also
 * compared with Python's json on thousands of inputs (tests/unit_py/test_json_differential.py)
 * and fuzzed (tests/fuzz/fuzz_json.c). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "json.h"

static int get(const char *doc, const char *path, char **out, int *type)
{
    return tsp_json_get(doc, strlen(doc), path, out, type);
}

START_TEST(test_json_get_paths_and_types)
{
    const char *doc = "{\"message\": {\"message\": \"ValueError: x\\u00e9\\ud83d\\ude00\","
                      " \"extraInfo\": {\"timestamp\": \"17\", \"n\": -1.5e3, \"ok\": true}},"
                      " \"list\": [1, {\"a\": 2}]}";
    char *v = NULL;
    int type = 0;
    ck_assert_int_eq(get(doc, "message.message", &v, &type), 0);
    ck_assert_int_eq(type, TSP_JSON_STRING);
    ck_assert_str_eq(v, "ValueError: x\xc3\xa9\xf0\x9f\x98\x80");
    free(v);
    ck_assert_int_eq(get(doc, "message.extraInfo.n", &v, &type), 0);
    ck_assert_int_eq(type, TSP_JSON_NUMBER);
    ck_assert_str_eq(v, "-1.5e3");
    free(v);
    ck_assert_int_eq(get(doc, "message.extraInfo.ok", &v, &type), 0);
    ck_assert_int_eq(type, TSP_JSON_LITERAL);
    free(v);
    ck_assert_int_eq(get(doc, "list", &v, &type), 0);
    ck_assert_int_eq(type, TSP_JSON_ARRAY);
    ck_assert_str_eq(v, "[1, {\"a\": 2}]");
    free(v);
    ck_assert_int_eq(get(doc, "message.nope", &v, &type), -ENOENT);
    ck_assert_int_eq(get(doc, "list.a", &v, &type), -ENOENT);
    ck_assert_int_eq(get(doc, "message.message.x", &v, &type), -ENOENT);
}
END_TEST

START_TEST(test_json_last_duplicate_key_wins)
{
    char *v = NULL;
    int type = 0;
    ck_assert_int_eq(get("{\"a\": 1, \"b\": 0, \"a\": 2}", "a", &v, &type), 0);
    ck_assert_str_eq(v, "2");
    free(v);
}
END_TEST

START_TEST(test_json_malformed_documents_refused_whole)
{
    /* the key looked up comes before the fault: the whole document is still refused */
    const char *bad[] = {"{\"a\": 1, \"b\": xyz}",
                         "{\"a\": 1.2.3}",
                         "{\"a\": tru}",
                         "{\"a\": 01}",
                         "{\"a\": 1,}",
                         "{\"a\": \"\\q\"}",
                         "{\"a\": \"\x01\"}",
                         "{\"a\": 1} x",
                         "{\"a\": 1}}",
                         "{\"a\": \"\xc0\x80\"}",
                         "",
                         "{\"a\": NaN}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *v = NULL;
        int type = 0;
        ck_assert_msg(get(bad[i], "a", &v, &type) == -EINVAL, "accepted: %s", bad[i]);
        ck_assert_int_eq(tsp_json_check(bad[i], strlen(bad[i])), -EINVAL);
    }
    char deep[2 * TSP_JSON_MAX_DEPTH + 3];
    memset(deep, '[', TSP_JSON_MAX_DEPTH + 1);
    memset(deep + TSP_JSON_MAX_DEPTH + 1, ']', TSP_JSON_MAX_DEPTH + 1);
    ck_assert_int_eq(tsp_json_check(deep, 2 * TSP_JSON_MAX_DEPTH + 2), -EINVAL);
    ck_assert_int_eq(tsp_json_check(deep + 1, 2 * TSP_JSON_MAX_DEPTH), 0);
    ck_assert_int_eq(tsp_json_check_object("[1]", 3), -EINVAL);
    ck_assert_int_eq(tsp_json_check_object(" {} ", 4), 0);
}
END_TEST

START_TEST(test_json_lone_surrogate_is_replacement_char)
{
    char *v = NULL;
    int type = 0;
    ck_assert_int_eq(get("{\"a\": \"x\\ud800\\u0041\\udc00\"}", "a", &v, &type), 0);
    ck_assert_str_eq(v, "x\xef\xbf\xbd"
                        "A\xef\xbf\xbd");
    free(v);
}
END_TEST

static char *written(void (*build)(tsp_json_writer_t *))
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    build(&w);
    fclose(f);
    return text;
}

static void build_nested(tsp_json_writer_t *w)
{
    tsp_json_begin_object(w);
    tsp_json_key(w, "rank");
    tsp_json_int(w, 3);
    tsp_json_key(w, "host \"h\"");
    tsp_json_str(w, "a\nb\x01\xff");
    tsp_json_key(w, "list");
    tsp_json_begin_array(w);
    tsp_json_int(w, 1);
    tsp_json_null(w);
    tsp_json_begin_object(w);
    tsp_json_end(w);
    tsp_json_fixed(w, 1.5, 3);
    tsp_json_end(w);
    tsp_json_key(w, "raw");
    ck_assert_int_eq(tsp_json_value(w, " { \"x\" : [ 1 , 2 ] } ", 21), 0);
    tsp_json_key(w, "quoted");
    ck_assert_int_eq(tsp_json_value(w, "{\"x\": xyz}", 10), -EINVAL);
    tsp_json_str(w, "{\"x\": xyz}"); /* what a caller does with a refused value */
    tsp_json_key(w, "none");
    tsp_json_str(w, NULL);
    tsp_json_end(w);
}

START_TEST(test_json_writer_builds_valid_documents)
{
    char *t = written(build_nested);
    ck_assert_str_eq(t, "{\"rank\": 3, \"host \\\"h\\\"\": \"a\\nb\\u0001\\ufffd\", "
                        "\"list\": [1, null, {}, 1.500], \"raw\": {\"x\": [1, 2]}, "
                        "\"quoted\": \"{\\\"x\\\": xyz}\", \"none\": null}");
    ck_assert_int_eq(tsp_json_check_object(t, strlen(t)), 0);
    free(t);
}
END_TEST

typedef struct {
    char seen[256];
    size_t n;
} each_t;

static int each_cb(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    each_t *e = ctx;
    e->n += (size_t)snprintf(e->seen + e->n, sizeof e->seen - e->n, "%s%zu:%s=%d:%.*s|", "", index,
                             key ? key : "-", type, (int)len, val);
    return index == 9 ? -ECANCELED : 0;
}

START_TEST(test_json_each_walks_arrays_and_objects_once)
{
    const char *doc = "{\"a\": [\"x\\ny\", 2, null, [\"z\"]], \"b\": {\"k\": \"v\"}, \"c\": 1}";
    each_t e = {{0}, 0};
    ck_assert_int_eq(tsp_json_each(doc, strlen(doc), "a", each_cb, &e), 0);
    ck_assert_str_eq(e.seen, "0:-=1:x\ny|1:-=2:2|2:-=5:null|3:-=4:[\"z\"]|");
    e = (each_t){{0}, 0};
    ck_assert_int_eq(tsp_json_each(doc, strlen(doc), NULL, each_cb, &e), 0);
    ck_assert_str_eq(e.seen, "0:a=4:[\"x\\ny\", 2, null, [\"z\"]]|1:b=3:{\"k\": \"v\"}|2:c=2:1|");
    e = (each_t){{0}, 0};
    ck_assert_int_eq(tsp_json_each(doc, strlen(doc), "b", each_cb, &e), 0);
    ck_assert_str_eq(e.seen, "0:k=1:v|");
    ck_assert_int_eq(tsp_json_each(doc, strlen(doc), "c", each_cb, &e), -EINVAL);
    ck_assert_int_eq(tsp_json_each(doc, strlen(doc), "d", each_cb, &e), -ENOENT);
    ck_assert_int_eq(tsp_json_each("[1, 2", 5, NULL, each_cb, &e), -EINVAL);
    const char *ten = "[0,1,2,3,4,5,6,7,8,9,10]";
    e = (each_t){{0}, 0};
    ck_assert_int_eq(tsp_json_each(ten, strlen(ten), NULL, each_cb, &e),
                     -ECANCELED); /* fn stops it */
}
END_TEST

static Suite *json_suite(void)
{
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_json_get_paths_and_types);
    tcase_add_test(tc, test_json_last_duplicate_key_wins);
    tcase_add_test(tc, test_json_malformed_documents_refused_whole);
    tcase_add_test(tc, test_json_lone_surrogate_is_replacement_char);
    tcase_add_test(tc, test_json_writer_builds_valid_documents);
    tcase_add_test(tc, test_json_each_walks_arrays_and_objects_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(json_suite());
}
