/* test_runctl.c: the run controller in C (torchspark/runctl.h), under the sanitizers too: a
 * whole run step by step, the reply's buffer rule, and requests it refuses (malformed, a state
 * it did not write, events out of turn). Every golden case of tests/contracts/runctl.json is
 * replayed by pytest and JUnit. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "torchspark/runctl.h"

static char out[16384], err[512], req[20000];

/* One step: {"state": the last reply's state (or null), "event": ev}. */
static int step(const char *state, const char *ev)
{
    snprintf(req, sizeof req, "{\"state\": %s, \"event\": %s}", state ? state : "null", ev);
    return tsp_runctl_step(req, strlen(req), out, sizeof out, NULL, err, sizeof err);
}

/* The reply's state, copied (the reply is the whole document: its "state" member is last). */
static char *state_of(void)
{
    const char *p = strstr(out, "\"state\": ");
    ck_assert_ptr_nonnull(p);
    char *s = strdup(p + strlen("\"state\": "));
    s[strlen(s) - 1] = 0; /* the reply's closing brace */
    return s;
}

START_TEST(test_runctl_a_run_step_by_step)
{
    ck_assert_int_eq(step(NULL, "{\"event\": \"start\", \"glue\": \"python\", \"nodes\": 3, "
                                "\"max_restarts\": 1, \"min_nodes\": 2}"),
                     0);
    ck_assert_msg(strstr(out, "\"do\": \"submit\", \"attempt\": 0, \"nodes\": 3"), "%s", out);
    char *s = state_of();
    ck_assert_int_eq(step(s, "{\"event\": \"attempt_failed\", \"message\": \"boom\\u0000x\", "
                             "\"reason\": \"silent\", \"node_rank\": 2}"),
                     0);
    /* A silent node whose executor is not known: its slot does not count. */
    ck_assert_msg(strstr(out, "\"do\": \"count_slots\", \"need\": 4, \"least\": 2"), "%s", out);
    free(s);
    s = state_of();
    ck_assert_int_eq(step(s, "{\"event\": \"slots\", \"free\": 3, \"waited_ms\": 5}"), 0);
    ck_assert_msg(strstr(out, "on 2 of 3 nodes (min_nodes=2)") &&
                      strstr(out, "\"TORCHSPARK_RESTART_CAUSE\": \"boom\""),
                  "%s", out);
    free(s);
    s = state_of();
    ck_assert_int_eq(step(s, "{\"event\": \"attempt_failed\", \"message\": \"again\"}"), 0);
    ck_assert_msg(strstr(out, "\"kind\": \"exhausted\"") &&
                      strstr(out, "\"attempts\": [\"boom\", \"again\"]"),
                  "%s", out);
    free(s);
    s = state_of();
    ck_assert_int_eq(step(s, "{\"event\": \"attempt_succeeded\"}"), -EINVAL);
    ck_assert_msg(strstr(err, "got \"attempt_succeeded\" while done"), "%s", err);
    free(s);
}
END_TEST

START_TEST(test_runctl_buffer_and_refusals)
{
    const char *r = "{\"state\": null, \"event\": {\"event\": \"start\", \"glue\": \"java\", "
                    "\"nodes\": 2}}";
    size_t need = 0;
    char small[16];
    ck_assert_int_eq(tsp_runctl_step(r, strlen(r), small, sizeof small, &need, err, sizeof err),
                     -ENOSPC);
    ck_assert_uint_gt(need, sizeof small);
    ck_assert_int_eq(tsp_runctl_step(r, strlen(r), out, need, &need, err, sizeof err), 0);
    ck_assert_uint_eq(strlen(out) + 1, need);
    ck_assert_int_eq(tsp_runctl_step("[]", 2, out, sizeof out, NULL, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "the run controller's request is not a JSON object");
    ck_assert_int_eq(step("3", "{\"event\": \"slots\"}"), -EINVAL);
    ck_assert_msg(strstr(err, "\"state\" must be an object"), "%s", err);
    /* A state it did not write: a phase it does not know, a negative count, a cause that is
     * not text. */
    ck_assert_int_eq(
        step("{\"glue\": \"python\", \"phase\": \"flying\"}", "{\"event\": \"slots\"}"), -EINVAL);
    ck_assert_msg(strstr(err, "is not one it wrote"), "%s", err);
    ck_assert_int_eq(step(NULL, "{\"event\": \"start\", \"glue\": \"python\", \"nodes\": 2}"), 0);
    char *s = state_of();
    char *bad = strdup(s);
    char *at = strstr(bad, "\"attempt\": 0");
    memcpy(at, "\"attempt\":-1", 12);
    ck_assert_int_eq(step(bad, "{\"event\": \"attempt_succeeded\"}"), -EINVAL);
    free(bad);
    bad = strdup(s);
    at = strstr(bad, "\"causes\": []");
    memcpy(at, "\"causes\": [1", 12);
    ck_assert_int_eq(step(bad, "{\"event\": \"attempt_succeeded\"}"), -EINVAL);
    free(bad);
    ck_assert_int_eq(step(s, "{\"event\": \"attempt_failed\", \"free\": \"x\", \"node_rank\": "
                             "\"one\"}"),
                     -EINVAL);
    ck_assert_msg(strstr(err, "\"event.node_rank\" must be a whole number"), "%s", err);
    ck_assert_int_eq(step(s, "{\"event\": 7}"), -EINVAL);
    ck_assert_msg(strstr(err, "\"event.event\" must be a string or null"), "%s", err);
    /* Each attempt's record (runrec.c): one it did not write is refused like the rest. */
    const char *recs[] = {"\"attempts\": [3]", "\"attempts\": [{\"attempt\": \"0\"}]",
                          "\"attempts\": [{\"attempt\": 0, \"nodes\": 2, \"cause\": 1}]",
                          "\"attempts\": [{\"attempt\": 0, \"nodes\": 2, \"started\": \"t\"}]",
                          "\"attempts\": {}"};
    for (size_t i = 0; i < sizeof recs / sizeof recs[0]; i++) {
        bad = malloc(strlen(s) + 128);
        at = strstr(s, "\"attempts\": [");
        snprintf(bad, strlen(s) + 128, "%.*s%s}", (int)(at - s), s, recs[i]);
        ck_assert_int_eq(step(bad, "{\"event\": \"attempt_succeeded\"}"), -EINVAL);
        ck_assert_msg(strstr(err, "is not one it wrote"), "%zu: %s", i, err);
        free(bad);
    }
    ck_assert_int_eq(step(s, "{\"event\": \"attempt_succeeded\", \"at\": [1]}"), -EINVAL);
    ck_assert_msg(strstr(err, "\"event.at\" must be a number (the glue's clock) or null"), "%s",
                  err);
    free(s);
    /* A state after a failure (counting slots) with its causes cut: refused, never read (the
     * restart's warning names the last cause: it read before the list's start). */
    ck_assert_int_eq(
        step("{\"glue\": \"python\", \"phase\": \"counting\", \"max_restarts\": 2, \"nodes\": 2, "
             "\"min_nodes\": 2, \"replacement_timeout_ms\": 30000, \"attempt\": 0, \"running\": 2, "
             "\"unusable\": 0, \"waited_ms\": 0, \"grows\": 0, \"grow_asked\": 0, "
             "\"global_batch\": 0, \"remote\": false, \"reason\": \"exit\", \"last\": \"boom\"}",
             "{\"event\": \"slots\", \"free\": 2, \"waited_ms\": 0}"),
        -EINVAL);
    ck_assert_msg(strstr(err, "is not one it wrote"), "%s", err);
}
END_TEST

static Suite *runctl_suite(void)
{
    Suite *s = suite_create("runctl");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_runctl_a_run_step_by_step);
    tcase_add_test(tc, test_runctl_buffer_and_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(runctl_suite());
}
