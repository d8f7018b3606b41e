/* test_logtail.c: a rank's tail (logtail.c): the last lines in order within both bounds,
 * and entries that grow with the lines kept, not with the bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "logtail.h"
#include "testutil.h"

static char *copy_all(const tsp__tail_t *t, unsigned max_lines)
{
    size_t need = tsp__tail_copy(t, max_lines, 1 << 30, NULL, 0);
    char *buf = calloc(1, need + 1);
    tsp__tail_copy(t, max_lines, 1 << 30, buf, need);
    return buf;
}

START_TEST(test_logtail_keeps_the_last_lines_and_grows_its_entries_with_them)
{
    tsp__tail_t t;
    memset(&t, 0, sizeof t);
    char line[32];
    for (int i = 0; i < 3; i++) {
        int n = snprintf(line, sizeof line, "line %d", i);
        tsp__tail_add(&t, 2000, 1 << 20, line, (size_t)n);
    }
    ck_assert_uint_eq(t.slots, 16); /* not 2,000 entries for a rank that printed 3 lines */
    char *all = copy_all(&t, 2000);
    ck_assert_str_eq(all, "line 0\nline 1\nline 2\n");
    free(all);
    for (int i = 3; i < 5000; i++) {
        int n = snprintf(line, sizeof line, "line %d", i);
        tsp__tail_add(&t, 2000, 1 << 20, line, (size_t)n);
    }
    ck_assert_uint_eq(t.slots, 2000);
    ck_assert_uint_eq(t.count, 2000);
    all = copy_all(&t, 2000);
    char *p = all;
    for (int i = 3000; i < 5000; i++) { /* the last 2,000, oldest first */
        int n = snprintf(line, sizeof line, "line %d\n", i);
        ck_assert_msg(strncmp(p, line, (size_t)n) == 0, "at %d: %.20s", i, p);
        p += n;
    }
    ck_assert_str_eq(p, "");
    free(all);
    tsp__tail_free(&t);
}
END_TEST

START_TEST(test_logtail_the_byte_bound_evicts_across_growth)
{
    tsp__tail_t t;
    memset(&t, 0, sizeof t);
    char line[32];
    for (int i = 0; i < 100; i++) { /* 9 bytes each, 64 bytes kept: the last 7 */
        int n = snprintf(line, sizeof line, "line %04d", i);
        tsp__tail_add(&t, 2000, 64, line, (size_t)n);
    }
    char *all = copy_all(&t, 2000);
    ck_assert_str_eq(
        all, "line 0093\nline 0094\nline 0095\nline 0096\nline 0097\nline 0098\nline 0099\n");
    free(all);
    tsp__tail_free(&t);
}
END_TEST

START_TEST(test_logtail_an_empty_first_line)
{
    /* An empty line into an empty tail (the agent process's tail of a program whose first
     * line is blank) once divided by the ring's size, 0 before any byte. */
    tsp__tail_t t;
    memset(&t, 0, sizeof t);
    tsp__tail_add(&t, 100, 1 << 20, "", 0);
    tsp__tail_add(&t, 100, 1 << 20, "x", 1);
    char *all = copy_all(&t, 100);
    ck_assert_str_eq(all, "\nx\n");
    free(all);
    tsp__tail_free(&t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("logtail");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_logtail_keeps_the_last_lines_and_grows_its_entries_with_them);
    tcase_add_test(tc, test_logtail_the_byte_bound_evicts_across_growth);
    tcase_add_test(tc, test_logtail_an_empty_first_line);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
