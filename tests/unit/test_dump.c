/* test_dump.c: the hang doctor's agent side (dump.c, docs/protocol.md 1.9) on real
 * processes: the state of a running, a sleeping, a stopped and a zombie child from /proc,
 * whether a process handles the dump signal, and the marker lines as the driver parses
 * them (spark-glue/python/torchspark/driver/_hang.py). */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "dump.h"

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The state letter of pid once it is `want` (polled: the kernel takes a moment). */
static char wait_state(pid_t pid, char want)
{
    char st = '?';
    const char *what = NULL;
    for (int i = 0; i < 400; i++) {
        ck_assert_int_eq(tsp_dump_state(pid, &st, &what), 0);
        ck_assert_ptr_nonnull(what);
        if (st == want)
            break;
        nap_ms(5);
    }
    return st;
}

static void on_dump(int sig)
{
    (void)sig;
}

START_TEST(test_dump_state_of_a_sleeping_stopped_and_zombie_child)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        for (;;)
            pause();
    }
    char st;
    const char *what;
    ck_assert_int_eq(wait_state(pid, 'S'), 'S');
    ck_assert_int_eq(tsp_dump_state(pid, &st, &what), 0);
    ck_assert_str_eq(what, "sleeping");
    ck_assert_ptr_null(tsp_dump_cannot_answer(st));
    kill(pid, SIGSTOP);
    ck_assert_int_eq(wait_state(pid, 'T'), 'T');
    ck_assert_str_eq(tsp_dump_cannot_answer('T'), "stopped (SIGSTOP)");
    kill(pid, SIGKILL);
    ck_assert_int_eq(wait_state(pid, 'Z'), 'Z');
    ck_assert_str_eq(tsp_dump_cannot_answer('Z'), "exited, not yet reaped");
    waitpid(pid, NULL, 0);
    ck_assert_int_eq(tsp_dump_state(pid, &st, &what), -ESRCH);
    ck_assert_int_eq(tsp_dump_state(getpid(), &st, &what), 0);
    ck_assert_int_eq(st, 'R');
    ck_assert_str_eq(what, "running");
}
END_TEST

START_TEST(test_dump_handled_only_where_the_signal_is_caught_blocked_or_ignored)
{
    int sig = tsp_dump_signal();
    ck_assert_int_eq(sig, SIGRTMIN + 8);
    signal(sig, SIG_DFL);
    ck_assert_int_eq(tsp_dump_handled(getpid()), 0); /* its default action would end us */
    signal(sig, on_dump);
    ck_assert_int_eq(tsp_dump_handled(getpid()), 1);
    signal(sig, SIG_IGN);
    ck_assert_int_eq(tsp_dump_handled(getpid()), 1);
    signal(sig, SIG_DFL);
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_BLOCK, &set, &old);
    ck_assert_int_eq(tsp_dump_handled(getpid()), 1); /* the shim: blocked, read by signalfd */
    sigprocmask(SIG_SETMASK, &old, NULL);
    ck_assert_int_eq(tsp_dump_handled(999999999), -ESRCH);
}
END_TEST

START_TEST(test_dump_recorder_signal_only_to_a_process_that_blocks_it)
{
    int sig = tsp_dump_recorder_signal();
    ck_assert_int_eq(sig, SIGRTMIN + 9);
    ck_assert_int_eq(tsp_dump_recorder_blocked(getpid()), 0);
    signal(sig, SIG_IGN); /* caught or ignored is not enough: the bootstrap's thread waits */
    ck_assert_int_eq(tsp_dump_recorder_blocked(getpid()), 0);
    signal(sig, SIG_DFL);
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_BLOCK, &set, &old);
    ck_assert_int_eq(tsp_dump_recorder_blocked(getpid()), 1);
    sigprocmask(SIG_SETMASK, &old, NULL);
    ck_assert_int_eq(tsp_dump_recorder_blocked(999999999), -ESRCH);
}
END_TEST

START_TEST(test_dump_marker_lines_as_the_protocol_spells_them)
{
    char b[300];
    size_t n = tsp_dump_marker(b, sizeof b, 3, 5, "h2", 1234, 'S', "sleeping", NULL);
    ck_assert_str_eq(b,
                     "torchspark: stack dump #3 of rank 5 (host h2, pid 1234): state S (sleeping)");
    ck_assert_uint_eq(n, strlen(b));
    tsp_dump_marker(b, sizeof b, 1, 0, "h", 7, 'T', "stopped", "stopped (SIGSTOP)");
    ck_assert_str_eq(b, "torchspark: stack dump #1 of rank 0 (host h, pid 7): state T (stopped): "
                        "cannot answer: stopped (SIGSTOP)");
    tsp_dump_marker(b, sizeof b, 0, -1, NULL, 42, 'Z', "zombie", "exited, not yet reaped");
    ck_assert_str_eq(b, "torchspark: stack dump: worker pid 42: state Z (zombie): cannot answer: "
                        "exited, not yet reaped");
    n = tsp_dump_marker(b, 20, 1, 0, "h", 7, 'S', "sleeping", NULL);
    ck_assert_uint_eq(n, 19);
    ck_assert_uint_eq(strlen(b), 19);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dump");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_dump_state_of_a_sleeping_stopped_and_zombie_child);
    tcase_add_test(tc, test_dump_handled_only_where_the_signal_is_caught_blocked_or_ignored);
    tcase_add_test(tc, test_dump_recorder_signal_only_to_a_process_that_blocks_it);
    tcase_add_test(tc, test_dump_marker_lines_as_the_protocol_spells_them);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
