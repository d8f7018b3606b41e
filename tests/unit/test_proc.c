/* test_proc.c: spawning (pipes, exec errors, sessions, parent-death) and tree killing. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "proc.h"

static int read_all(int fd, char *buf, size_t len)
{
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, len - 1 - got);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            usleep(1000);
            continue;
        }
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    buf[got] = 0;
    return (int)got;
}

START_TEST(test_proc_spawn_pipes_and_env)
{
    char *argv[] = {"sh", "-c", "echo out $FOO; echo err >&2; exit 5", NULL};
    char *envp[] = {"FOO=bar", "PATH=/usr/bin:/bin", NULL};
    tsp_proc_opts_t o = {.file = "sh", .argv = argv, .envp = envp,
                         .stdout_mode = TSP_PROC_PIPE, .stderr_mode = TSP_PROC_PIPE};
    tsp_proc_t p;
    char err[256] = "", out[256], errs[256];
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, err, sizeof err), 0);
    read_all(p.out_fd, out, sizeof out);
    read_all(p.err_fd, errs, sizeof errs);
    int st;
    ck_assert_int_eq(waitpid(p.pid, &st, 0), p.pid);
    ck_assert_str_eq(out, "out bar\n");
    ck_assert_str_eq(errs, "err\n");
    ck_assert_int_eq(tsp_proc_exit_code(st), 5);
    tsp_proc_close(&p);
}
END_TEST

START_TEST(test_proc_exec_errors_come_back)
{
    char *argv[] = {"nope", NULL};
    tsp_proc_opts_t o = {.file = "/nonexistent/nope", .argv = argv};
    tsp_proc_t p;
    char err[256] = "";
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, err, sizeof err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/nope"));
    ck_assert_ptr_nonnull(strstr(err, "No such file"));
    ck_assert_int_eq(tsp_proc_exec_status(-ENOENT), 127);
    /* a file that exists but is not executable */
    char path[] = "/tmp/tsp_noexec_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    o.file = path;
    err[0] = 0;
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, err, sizeof err), -EACCES);
    ck_assert_int_eq(tsp_proc_exec_status(-EACCES), 126);
    unlink(path);
    /* PATH search uses the child's PATH */
    char *envp[] = {"PATH=/nonexistent", NULL};
    char *argv2[] = {"sh", NULL};
    tsp_proc_opts_t o2 = {.file = "sh", .argv = argv2, .envp = envp};
    ck_assert_int_eq(tsp_proc_spawn(&p, &o2, err, sizeof err), -ENOENT);
}
END_TEST

START_TEST(test_proc_new_session_and_signal_mask_reset)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL); /* the child must not inherit this */
    char *argv[] = {"sleep", "30", NULL};
    tsp_proc_opts_t o = {.file = "sleep", .argv = argv, .new_session = 1};
    tsp_proc_t p;
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, NULL, 0), 0);
    ck_assert_int_eq(getpgid(p.pid), p.pid);
    ck_assert_int_eq(getsid(p.pid), p.pid);
    ck_assert_int_eq(kill(-p.pid, SIGTERM), 0);
    int st;
    ck_assert_int_eq(waitpid(p.pid, &st, 0), p.pid);
    ck_assert(WIFSIGNALED(st));
    ck_assert_int_eq(tsp_proc_exit_code(st), 128 + SIGTERM);
}
END_TEST

START_TEST(test_proc_pdeathsig_kills_child_with_parent)
{
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t mid = fork();
    if (mid == 0) {
        char *argv[] = {"sleep", "30", NULL};
        tsp_proc_opts_t o = {.file = "sleep", .argv = argv, .pdeathsig = SIGKILL};
        tsp_proc_t p;
        if (tsp_proc_spawn(&p, &o, NULL, 0) != 0)
            _exit(1);
        if (write(fds[1], &p.pid, sizeof p.pid) != (ssize_t)sizeof p.pid)
            _exit(1);
        _exit(0); /* the parent dies; the child must follow */
    }
    pid_t child;
    ck_assert_int_eq(read(fds[0], &child, sizeof child), (ssize_t)sizeof child);
    waitpid(mid, NULL, 0);
    ck_assert_msg(tsp_test_gone(child, 2000), "child still running after its parent died");
}
END_TEST

START_TEST(test_proc_signal_descendants_reaches_grandchildren)
{
    /* a child that starts a grandchild in another session, then both sleep */
    char *argv[] = {"sh", "-c", "setsid sleep 30 & echo $!; sleep 30", NULL};
    tsp_proc_opts_t o = {.file = "sh", .argv = argv, .stdout_mode = TSP_PROC_PIPE,
                         .new_session = 1};
    tsp_proc_t p;
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, NULL, 0), 0);
    char buf[64] = "";
    size_t got = 0;
    for (int i = 0; i < 500 && !strchr(buf, '\n'); i++) {
        ssize_t n = read(p.out_fd, buf + got, sizeof buf - 1 - got);
        if (n > 0) {
            got += (size_t)n;
            buf[got] = 0;
        } else {
            usleep(2000);
        }
    }
    int grandchild = atoi(buf);
    ck_assert_int_gt(grandchild, 0);
    ck_assert_int_ge(tsp_proc_signal_descendants(getpid(), SIGKILL), 2);
    int st;
    ck_assert_int_eq(waitpid(p.pid, &st, 0), p.pid);
    ck_assert(WIFSIGNALED(st));
    ck_assert_msg(tsp_test_gone(grandchild, 2000), "grandchild survived");
    tsp_proc_close(&p);
}
END_TEST

static Suite *proc_suite(void)
{
    Suite *s = suite_create("proc");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_proc_spawn_pipes_and_env);
    tcase_add_test(tc, test_proc_exec_errors_come_back);
    tcase_add_test(tc, test_proc_new_session_and_signal_mask_reset);
    tcase_add_test(tc, test_proc_pdeathsig_kills_child_with_parent);
    tcase_add_test(tc, test_proc_signal_descendants_reaches_grandchildren);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(proc_suite());
}
