/* test_pyboot.c: the Python bootstrap strings survive the agent's argument handling and run.
 * Their behaviour is compared with `python -u SCRIPT` in tests/e2e/test_script_exit.py. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pyboot.h"
#include "testutil.h"

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

START_TEST(test_pyboot_has_no_substitution_macro)
{
    /* every worker argument goes through torchrun's $local_rank substitution ($$ -> $) */
    ck_assert_ptr_null(strchr(tsp__pyboot_script, '$'));
    ck_assert_ptr_null(strchr(tsp__pyboot_module, '$'));
}
END_TEST

START_TEST(test_pyboot_variants_differ_only_in_mode)
{
    ck_assert(ends_with(tsp__pyboot_script, "\n_tsp_boot(0)\n"));
    ck_assert(ends_with(tsp__pyboot_module, "\n_tsp_boot(1)\n"));
    size_t n = strlen(tsp__pyboot_script);
    ck_assert_uint_eq(n, strlen(tsp__pyboot_module));
    ck_assert_int_eq(memcmp(tsp__pyboot_script, tsp__pyboot_module, n - 3), 0);
}
END_TEST

START_TEST(test_pyboot_runs_a_script_and_keeps_its_status)
{
    if (system("command -v python3 >/dev/null 2>&1") != 0)
        return; /* no interpreter on this machine: the e2e suite covers the behaviour */
    char script[] = "/tmp/tsp_pyboot_XXXXXX";
    int fd = mkstemp(script);
    ck_assert_int_ge(fd, 0);
    const char body[] = "import sys\nsys.exit(int(sys.argv[1]) + 1)\n";
    ck_assert_int_eq(write(fd, body, sizeof body - 1), (ssize_t)(sizeof body - 1));
    close(fd);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        execlp("python3", "python3", "-u", "-c", tsp__pyboot_script, script, "41", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    unlink(script);
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), 42);
}
END_TEST

static Suite *pyboot_suite(void)
{
    Suite *s = suite_create("pyboot");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_pyboot_has_no_substitution_macro);
    tcase_add_test(tc, test_pyboot_variants_differ_only_in_mode);
    tcase_add_test(tc, test_pyboot_runs_a_script_and_keeps_its_status);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(pyboot_suite());
}
