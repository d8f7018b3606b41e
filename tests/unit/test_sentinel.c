/* test_sentinel.c: the sweep kills exactly the job's processes: those carrying the token
 * (a daemon that left for a session of its own included) and their descendants, and nothing
 * else. The sentinel's own life (outliving a SIGKILLed agent) is tested end to end in
 * tests/e2e/test_orphan_census.py. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sentinel.h"
#include "testutil.h"

static const char *token = "0123456789abcdef0123456789abcdef";

/* A process that sleeps; with_token it carries the job's token in its environment. Its
 * pid goes through the pipe: with daemonize it double-forks into a session of its own and
 * the grandchild's pid is the one reported. */
static pid_t start_sleeper(int with_token, int daemonize, pid_t *child_without_token)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(p[0]);
        if (daemonize) {
            setsid();
            if (fork() != 0)
                _exit(0);
        }
        pid_t me = getpid();
        if (write(p[1], &me, sizeof me) != (ssize_t)sizeof me)
            _exit(1);
        char var[128];
        snprintf(var, sizeof var, "%s=%s", TSP_SENTINEL_VAR, token);
        char *envp[] = {with_token ? var : "X=1", NULL};
        if (child_without_token) { /* a child that clears its environment: a descendant */
            pid_t c = fork();
            if (c == 0) {
                char *none[] = {NULL};
                execle("/bin/sleep", "sleep", "60", (char *)NULL, none);
                _exit(127);
            }
            if (write(p[1], &c, sizeof c) != (ssize_t)sizeof c)
                _exit(1);
        }
        signal(SIGTERM, SIG_IGN);
        execle("/bin/sleep", "sleep", "60", (char *)NULL, envp);
        _exit(127);
    }
    close(p[1]);
    pid_t reported = 0;
    ck_assert_int_eq(read(p[0], &reported, sizeof reported), (ssize_t)sizeof reported);
    if (child_without_token)
        ck_assert_int_eq(read(p[0], child_without_token, sizeof *child_without_token),
                         (ssize_t)sizeof *child_without_token);
    close(p[0]);
    if (daemonize)
        waitpid(pid, NULL, 0); /* the intermediate */
    /* wait until exec has replaced the environment */
    for (int i = 0; i < 500; i++) {
        char path[64], buf[512] = "";
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)reported);
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        if (n >= 5 && strcmp(buf, "sleep") == 0)
            break;
        usleep(10000);
    }
    return reported;
}

START_TEST(test_sentinel_sweep_kills_the_job_and_nothing_else)
{
    pid_t child = 0;
    pid_t job = start_sleeper(1, 0, &child);
    pid_t daemon = start_sleeper(1, 1, NULL);
    pid_t other = start_sleeper(0, 0, NULL);
    for (int i = 0; i < 200 && !tsp_test_alive(child); i++)
        usleep(10000);
    ck_assert(tsp_test_alive(job) && tsp_test_alive(child) && tsp_test_alive(daemon) &&
              tsp_test_alive(other));
    int n = tsp__sentinel_sweep(token);
    ck_assert_int_ge(n, 3); /* the job, its token-less child, the daemon */
    for (int i = 0; i < 200 && (tsp_test_alive(daemon) || tsp_test_alive(child)); i++)
        usleep(10000);
    waitpid(job, NULL, 0);
    ck_assert(!tsp_test_alive(job));
    ck_assert(!tsp_test_alive(child)); /* no token, but a descendant of the job */
    ck_assert(!tsp_test_alive(daemon));
    ck_assert(tsp_test_alive(other));
    kill(other, SIGKILL);
    waitpid(other, NULL, 0);
    ck_assert_int_eq(tsp__sentinel_sweep("short"), -EINVAL);
    ck_assert_int_eq(tsp__sentinel_sweep(token), 0); /* nothing left */
}
END_TEST

static Suite *sentinel_suite(void)
{
    Suite *s = suite_create("sentinel");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_sentinel_sweep_kills_the_job_and_nothing_else);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(sentinel_suite());
}
