/* test_lines.c: line reassembly: '\n' splits, '\r' stays, long lines split and marked. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "lines.h"
#include "env.h"

static int next(tsp_lines_t *lb, char *out, size_t outlen, unsigned *flags)
{
    const char *d;
    size_t n;
    if (!tsp_lines_peek(lb, &d, &n, flags))
        return -1;
    ck_assert_uint_lt(n, outlen);
    memcpy(out, d, n);
    out[n] = 0;
    tsp_lines_consume(lb);
    return (int)n;
}

START_TEST(test_lines_split_keep_cr)
{
    tsp_lines_t lb;
    char out[64];
    unsigned f;
    ck_assert_int_eq(tsp_lines_init(&lb, 64), 0);
    ck_assert_int_eq(tsp_lines_feed(&lb, "a\n\nbar 10%\rbar 20%\n", 19), 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 1);
    ck_assert_str_eq(out, "a");
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 15);
    ck_assert_str_eq(out, "bar 10%\rbar 20%");
    ck_assert_uint_eq(f, 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), -1);
    tsp_lines_close(&lb);
}
END_TEST

START_TEST(test_lines_partial_then_rest)
{
    tsp_lines_t lb;
    char out[64];
    unsigned f;
    ck_assert_int_eq(tsp_lines_init(&lb, 64), 0);
    ck_assert_int_eq(tsp_lines_feed(&lb, "hel", 3), 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), -1);
    ck_assert_int_eq(tsp_lines_feed(&lb, "lo\nwor", 6), 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 5);
    ck_assert_str_eq(out, "hello");
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), -1);
    tsp_lines_finish(&lb);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 3);
    ck_assert_str_eq(out, "wor");
    ck_assert_uint_eq(f, TSP_LINE_NO_EOL);
    ck_assert_int_eq(tsp_lines_done(&lb), 1);
    tsp_lines_close(&lb);
}
END_TEST

START_TEST(test_lines_long_line_split_not_truncated)
{
    tsp_lines_t lb;
    char out[64];
    unsigned f;
    ck_assert_int_eq(tsp_lines_init(&lb, 16), 0);
    /* 40 bytes and a newline: 16 + 16 + 8, the first two flagged continued */
    char line[42];
    for (int i = 0; i < 40; i++)
        line[i] = (char)('a' + i % 26);
    line[40] = '\n';
    ck_assert_int_eq(tsp_lines_feed(&lb, line, 16), 0);
    ck_assert_int_eq(tsp_lines_feed(&lb, line + 16, 2), -ENOBUFS); /* full: drain first */
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 16);
    ck_assert_uint_eq(f, TSP_LINE_CONTINUED);
    ck_assert_int_eq(tsp_lines_feed(&lb, line + 16, 25), -ENOBUFS);
    ck_assert_int_eq(tsp_lines_feed(&lb, line + 16, 16), 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 16);
    ck_assert_uint_eq(f, TSP_LINE_CONTINUED);
    ck_assert_int_eq(tsp_lines_feed(&lb, line + 32, 9), 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 8);
    ck_assert_uint_eq(f, 0);
    ck_assert_int_eq(memcmp(out, line + 32, 8), 0);
    tsp_lines_close(&lb);
}
END_TEST

START_TEST(test_lines_exact_cap_is_whole)
{
    tsp_lines_t lb;
    char out[64];
    unsigned f;
    ck_assert_int_eq(tsp_lines_init(&lb, 16), 0);
    ck_assert_int_eq(tsp_lines_feed(&lb, "0123456789abcdef\n", 17), 0);
    ck_assert_int_eq(next(&lb, out, sizeof out, &f), 16);
    ck_assert_uint_eq(f, 0);
    tsp_lines_close(&lb);
}
END_TEST

START_TEST(test_lines_read_from_pipe_large)
{
    /* 3 MiB through a pipe in a child: every byte arrives, lines intact. */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        char *buf = malloc(1 << 20);
        for (int k = 0; k < 3; k++) {
            memset(buf, 'x', (1 << 20) - 1);
            buf[(1 << 20) - 1] = '\n';
            if (write(fds[1], buf, 1 << 20) != 1 << 20)
                _exit(1);
        }
        _exit(0);
    }
    close(fds[1]);
    tsp_lines_t lb;
    ck_assert_int_eq(tsp_lines_init(&lb, TSP_LINES_DEFAULT_CAP), 0);
    int lines = 0;
    size_t total = 0;
    for (;;) {
        const char *d;
        size_t n;
        unsigned f;
        while (tsp_lines_peek(&lb, &d, &n, &f)) {
            ck_assert_uint_eq(n, (1u << 20) - 1);
            ck_assert_uint_eq(f, 0);
            total += n;
            lines++;
            tsp_lines_consume(&lb);
        }
        if (tsp_lines_done(&lb))
            break;
        long r = tsp_lines_read(&lb, fds[0]);
        ck_assert_int_ge(r, 0);
    }
    ck_assert_int_eq(lines, 3);
    ck_assert_uint_eq(total, 3u * ((1u << 20) - 1));
    tsp_lines_close(&lb);
    close(fds[0]);
}
END_TEST

START_TEST(test_env_set_get_unset)
{
    tsp_env_t env;
    char *base[] = {"A=1", "B=2", "junk", NULL};
    ck_assert_int_eq(tsp_env_init(&env, base), 0);
    ck_assert_uint_eq(env.len, 2);
    ck_assert_str_eq(tsp_env_get(&env, "A"), "1");
    ck_assert_int_eq(tsp_env_set(&env, "A", "x=y"), 0);
    ck_assert_str_eq(tsp_env_get(&env, "A"), "x=y");
    ck_assert_int_eq(tsp_env_set(&env, "", "v"), -EINVAL);
    ck_assert_int_eq(tsp_env_set(&env, "K=", "v"), -EINVAL);
    ck_assert_int_eq(tsp_env_set_default(&env, "B", "9"), 0);
    ck_assert_str_eq(tsp_env_get(&env, "B"), "2");
    ck_assert_int_eq(tsp_env_unset(&env, "A"), 0);
    ck_assert_ptr_null(tsp_env_get(&env, "A"));
    ck_assert_ptr_null(env.vars[env.len]);
    tsp_env_close(&env);
}
END_TEST

/* The one prefix of a line where users read it: driver, fd sink, local fallback. */
START_TEST(test_lines_prefix_one_format)
{
    char b[64];
    ck_assert_uint_eq(tsp_lines_prefix(b, sizeof b, NULL, NULL, 0, TSP_STREAM_STDOUT), 9);
    ck_assert_str_eq(b, "[rank 0] ");
    tsp_lines_prefix(b, sizeof b, NULL, NULL, 7, TSP_STREAM_STDERR);
    ck_assert_str_eq(b, "[rank 7] [stderr] ");
    tsp_lines_prefix(b, sizeof b, NULL, "", 7, TSP_STREAM_STDERR); /* streams kept apart */
    ck_assert_str_eq(b, "[rank 7] ");
    tsp_lines_prefix(b, sizeof b, "<{rank}> ", NULL, -1, TSP_STREAM_EVENT);
    ck_assert_str_eq(b, "[torchspark] ");
    ck_assert_uint_eq(tsp_lines_prefix(b, 5, "r{rank}:", "E", 12345, TSP_STREAM_STDERR), 8);
    ck_assert_str_eq(b, "r123");
    ck_assert_uint_eq(tsp_lines_prefix(NULL, 0, NULL, NULL, 1, TSP_STREAM_STDOUT), 9);
}
END_TEST

static Suite *lines_suite(void)
{
    Suite *s = suite_create("lines");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_lines_split_keep_cr);
    tcase_add_test(tc, test_lines_partial_then_rest);
    tcase_add_test(tc, test_lines_long_line_split_not_truncated);
    tcase_add_test(tc, test_lines_exact_cap_is_whole);
    tcase_add_test(tc, test_lines_read_from_pipe_large);
    tcase_add_test(tc, test_lines_prefix_one_format);
    tcase_add_test(tc, test_env_set_get_unset);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(lines_suite());
}
