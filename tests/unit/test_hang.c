/* test_hang.c: the hang doctor's analysis (tsp_hang_diagnose) in C, where the sanitizer
 * builds see it: the golden cases of tests/contracts/hang.json (their line and starting
 * flag; pytest and JUnit compare every field), every truncation of a request refused
 * without a fault, and the -ENOSPC retry. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "testutil.h"
#include "torchspark/hang.h"

static char *read_contract(size_t *len)
{
    char path[4096];
    const char *slash = strrchr(__FILE__, '/');
    snprintf(path, sizeof path, "%.*s/../contracts/hang.json", (int)(slash - __FILE__), __FILE__);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *doc = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(doc);
    ck_assert_int_eq(fread(doc, 1, (size_t)n, f), n);
    doc[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return doc;
}

/* The diagnosis of request (malloc'ed; NULL with *rc on failure). */
static char *diagnose(const char *request, size_t len, int *rc)
{
    size_t need = 64;
    char err[512];
    char *out = malloc(need);
    *rc = tsp_hang_diagnose(request, len, out, need, &need, err, sizeof err);
    if (*rc == -ENOSPC) {
        out = realloc(out, need);
        *rc = tsp_hang_diagnose(request, len, out, need, &need, err, sizeof err);
    }
    if (*rc) {
        free(out);
        return NULL;
    }
    return out;
}

static int case_cb(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key;
    (void)index;
    ck_assert_int_eq(type, TSP_JSON_OBJECT);
    char *request, *line, *starting, *name, *got_line, *got_starting;
    int t, rc;
    ck_assert_int_eq(tsp_json_get(val, len, "name", &name, &t), 0);
    ck_assert_int_eq(tsp_json_get(val, len, "request", &request, &t), 0);
    ck_assert_int_eq(tsp_json_get(val, len, "expect.line", &line, &t), 0);
    ck_assert_int_eq(tsp_json_get(val, len, "expect.starting", &starting, &t), 0);
    char *reply = diagnose(request, strlen(request), &rc);
    ck_assert_msg(rc == 0, "%s: %d", name, rc);
    ck_assert_int_eq(tsp_json_get(reply, strlen(reply), "line", &got_line, &t), 0);
    ck_assert_int_eq(tsp_json_get(reply, strlen(reply), "starting", &got_starting, &t), 0);
    ck_assert_msg(strcmp(line, got_line) == 0, "%s:\n%s\n%s", name, line, got_line);
    ck_assert_msg(strcmp(starting, got_starting) == 0, "%s: starting", name);
    (*(int *)ctx)++;
    free(request), free(line), free(starting), free(name), free(got_line), free(got_starting);
    free(reply);
    return 0;
}

START_TEST(test_hang_golden_cases)
{
    size_t len;
    char *doc = read_contract(&len);
    int n = 0;
    ck_assert_int_eq(tsp_json_each(doc, len, "cases", case_cb, &n), 0);
    ck_assert_int_ge(n, 20);
    free(doc);
}
END_TEST

START_TEST(test_hang_every_truncation_is_refused_and_enospc_says_the_size)
{
    const char *req =
        "{\"world\": 3, \"request\": 1, \"stdlib\": [\"/usr/lib/python3.11\"], "
        "\"ranks\": [[\"torchspark: stack dump #1 of rank 0 (host h, pid 5): state S "
        "(sleeping)\", \"Current thread 0x1 (most recent call first):\", "
        "\"  File \\\"/x/torch/distributed/distributed_c10d.py\\\", line 9 in "
        "all_rtorchspark: flight recorder: pg 0 (d): all_reduce #2: not completed (s)\", "
        "\"educe\", \"  File \\\"/w/t.py\\\", line 3 in <module>\"], null, "
        "[\"torchspark: stack dump #1 of rank 2 (host h, pid 7): state T (stopped): "
        "cannot answer: stopped (SIGSTOP)\"]]}";
    size_t len = strlen(req);
    int rc;
    char *reply = diagnose(req, len, &rc);
    ck_assert_int_eq(rc, 0);
    char *line;
    int t;
    ck_assert_int_eq(tsp_json_get(reply, strlen(reply), "line", &line, &t), 0);
    ck_assert_str_eq(line,
                     "rank 2 (host h, pid 7) is stopped (SIGSTOP) and cannot answer (nor can "
                     "its flight recorder); rank 1 did not answer the dump (no marker came: is "
                     "its agent alive?); rank 0 waits in all_reduce #2 for them");
    free(line);
    char small[8], err[256];
    size_t need = 0;
    ck_assert_int_eq(tsp_hang_diagnose(req, len, small, sizeof small, &need, err, sizeof err),
                     -ENOSPC);
    ck_assert_int_eq(need, strlen(reply) + 1);
    free(reply);
    for (size_t n = 0; n < len; n++) {
        char *cut = strndup(req, n);
        ck_assert_int_eq(diagnose(cut, n, &rc) == NULL, 1);
        ck_assert_int_eq(rc, -EINVAL);
        free(cut);
    }
}
END_TEST

/* Each line of a dump is in the reply once, in the report's stacks (protocol 1.11): the
 * reply held it three times (dumps, stacks, report), 32 MB at 16,384 ranks. */
START_TEST(test_hang_each_line_is_in_the_reply_once)
{
    const char *req = "{\"world\": 2, \"request\": 1, \"ranks\": [[\"torchspark: stack dump #1 of "
                      "rank 0 (host h, pid 5): state S (sleeping)\", \"Current thread 0x1 (most "
                      "recent call first):\", \"  File \\\"/w/only_once.py\\\", line 3 in "
                      "<module>\", \"torchspark: flight recorder: no collective recorded\"], "
                      "null]}";
    int rc;
    char *reply = diagnose(req, strlen(req), &rc);
    ck_assert_int_eq(rc, 0);
    const char *lines[] = {"stack dump #1 of rank 0", "Current thread 0x1",
                           "\", line 3 in <module>", "flight recorder: no collective"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        int n = 0;
        for (const char *p = reply; (p = strstr(p, lines[i])); p++)
            n++;
        ck_assert_msg(n == 1, "'%s' %d times in %s", lines[i], n, reply);
    }
    char *v;
    int t;
    ck_assert_int_eq(tsp_json_get(reply, strlen(reply), "report.stacks.0", &v, &t), 0);
    ck_assert_msg(strstr(v, "only_once.py") != NULL, "%s", v);
    free(v);
    ck_assert_int_eq(tsp_json_get(reply, strlen(reply), "dumps", &v, &t), 0);
    ck_assert_msg(strstr(v, "\"host\"") && !strstr(v, "\"lines\""), "%s", v);
    free(v);
    ck_assert_int_eq(tsp_json_get(reply, strlen(reply), "stacks", &v, &t), -ENOENT);
    free(reply);
}
END_TEST

static Suite *hang_suite(void)
{
    Suite *s = suite_create("hang");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_hang_golden_cases);
    tcase_add_test(tc, test_hang_every_truncation_is_refused_and_enospc_says_the_size);
    tcase_add_test(tc, test_hang_each_line_is_in_the_reply_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(hang_suite());
}
