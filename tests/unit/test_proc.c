/* test_proc.c: spawning (pipes, exec errors, sessions, parent-death) and tree killing. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
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
    tsp_proc_opts_t o = {.file = "sh",
                         .argv = argv,
                         .envp = envp,
                         .stdout_mode = TSP_PROC_PIPE,
                         .stderr_mode = TSP_PROC_PIPE};
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

START_TEST(test_proc_stdin_null_and_fd3)
{
    /* stdin is /dev/null (cat ends at once), stdout and stderr share one fd, and the
     * caller's pipe is the child's fd 3 (the NCCL check worker's result pipe). */
    int res[2], outp[2];
    ck_assert_int_eq(pipe2(res, O_CLOEXEC), 0);
    ck_assert_int_eq(pipe2(outp, O_CLOEXEC), 0);
    char *argv[] = {"sh", "-c", "cat; echo out; echo err >&2; echo result >&3", NULL};
    tsp_proc_opts_t o = {.file = "sh",
                         .argv = argv,
                         .stdin_mode = TSP_PROC_NULL,
                         .stdout_mode = TSP_PROC_FD,
                         .stdout_fd = outp[1],
                         .stderr_mode = TSP_PROC_FD,
                         .stderr_fd = outp[1],
                         .fd3 = res[1]};
    tsp_proc_t p;
    char err[256] = "", out[256], got[256];
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, err, sizeof err), 0);
    close(res[1]);
    close(outp[1]);
    read_all(outp[0], out, sizeof out);
    read_all(res[0], got, sizeof got);
    int st;
    ck_assert_int_eq(waitpid(p.pid, &st, 0), p.pid);
    ck_assert_str_eq(out, "out\nerr\n");
    ck_assert_str_eq(got, "result\n");
    ck_assert_int_eq(tsp_proc_exit_code(st), 0);
    close(res[0]);
    close(outp[0]);
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

/* tsp_proc_stat reads a process's name (spaces and parentheses in it included), parent,
 * state and start time, the same start for the same process; a reaped child is gone. */
START_TEST(test_proc_stat_names_a_process_and_its_parent)
{
    tsp_proc_stat_t st, again;
    ck_assert_int_eq(tsp_proc_stat(getpid(), &st), 0);
    ck_assert_int_eq(st.ppid, getppid());
    ck_assert_int_eq(st.state, 'R');
    ck_assert_int_eq(tsp_proc_stat(getpid(), &again), 0);
    ck_assert(again.start == st.start && st.start > 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        static const char name[] = "a (b) c";
        FILE *f = fopen("/proc/self/comm", "w");
        if (f) {
            fputs(name, f);
            fclose(f);
        }
        pause();
        _exit(0);
    }
    tsp_proc_stat_t cs = {0};
    for (int i = 0; i < 200; i++) { /* until the child renamed itself */
        ck_assert_int_eq(tsp_proc_stat(child, &cs), 0);
        if (strcmp(cs.comm, "a (b) c") == 0)
            break;
        usleep(5000);
    }
    ck_assert_str_eq(cs.comm, "a (b) c");
    ck_assert_int_eq(cs.ppid, getpid());
    ck_assert(cs.start >= st.start);
    kill(child, SIGKILL);
    ck_assert_int_eq(waitpid(child, NULL, 0), child);
    ck_assert_int_eq(tsp_proc_stat(child, &cs), -ENOENT);
}
END_TEST

START_TEST(test_proc_signal_descendants_reaches_grandchildren)
{
    /* a child that starts a grandchild in another session, then both sleep */
    char *argv[] = {"sh", "-c", "setsid sleep 30 & echo $!; sleep 30", NULL};
    tsp_proc_opts_t o = {
        .file = "sh", .argv = argv, .stdout_mode = TSP_PROC_PIPE, .new_session = 1};
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

/* Threads that keep taking the malloc and stdio locks while workers are spawned: a child
 * that called into either between fork and exec could inherit a lock held by a thread that
 * does not exist in the child, and hang. Every spawn must exec (PATH search included). */
static atomic_int hammer_stop;

static void *hammer(void *arg)
{
    FILE *sink = arg;
    char *keep[16] = {0};
    for (unsigned i = 0; !atomic_load(&hammer_stop); i++) {
        free(keep[i % 16]);
        keep[i % 16] = malloc(16 + (i * 37) % 240);
        fprintf(sink, "hammer %u %s\n", i, keep[i % 16] ? "x" : "y");
        printf("%s", ""); /* stdout's lock too */
    }
    for (int i = 0; i < 16; i++)
        free(keep[i]);
    return NULL;
}

START_TEST(test_proc_spawn_while_threads_hold_malloc_and_stdio_locks)
{
    FILE *sink = fopen("/dev/null", "we");
    ck_assert_ptr_nonnull(sink);
    pthread_t th[4];
    atomic_store(&hammer_stop, 0);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, hammer, sink), 0);
    char *argv[] = {"true", NULL};
    /* PATH entries before the real one: the search must walk them in the child */
    char *envp[] = {"PATH=/nonexistent/a:/nonexistent/b::/usr/bin:/bin", NULL};
    tsp_proc_opts_t o = {.file = "true",
                         .argv = argv,
                         .envp = envp,
                         .new_session = 1,
                         .stdout_mode = TSP_PROC_PIPE,
                         .stderr_mode = TSP_PROC_PIPE};
    for (int i = 0; i < 150; i++) {
        tsp_proc_t p;
        char err[256] = "";
        ck_assert_msg(tsp_proc_spawn(&p, &o, err, sizeof err) == 0, "spawn %d: %s", i, err);
        int st;
        ck_assert_int_eq(waitpid(p.pid, &st, 0), p.pid);
        ck_assert_int_eq(tsp_proc_exit_code(st), 0);
        tsp_proc_close(&p);
    }
    atomic_store(&hammer_stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    fclose(sink);
}
END_TEST

START_TEST(test_proc_path_search_order_and_errors)
{
    char *argv[] = {"sh", "-c", "exit 7", NULL};
    /* an empty entry and a file that is not a directory come first; both are skipped */
    char *envp[] = {"PATH=:/etc/passwd:/bin:/usr/bin", NULL};
    tsp_proc_opts_t o = {.file = "sh", .argv = argv, .envp = envp};
    tsp_proc_t p;
    char err[256] = "";
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, err, sizeof err), 0);
    int st;
    ck_assert_int_eq(waitpid(p.pid, &st, 0), p.pid);
    ck_assert_int_eq(tsp_proc_exit_code(st), 7);
    char *envp2[] = {"PATH=/nonexistent", NULL};
    o.envp = envp2;
    ck_assert_int_eq(tsp_proc_spawn(&p, &o, err, sizeof err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "cannot run 'sh'"));
}
END_TEST

START_TEST(test_proc_find_as_exec_would)
{
    char *path_env[] = {"PATH=/nonexistent:/usr/bin:/bin", NULL};
    ck_assert_int_eq(tsp_proc_find("sh", path_env), 0);
    ck_assert_int_eq(tsp_proc_find("/bin/sh", NULL), 0);
    ck_assert_int_eq(tsp_proc_find("no-such-prog-xyz", path_env), -ENOENT);
    ck_assert_int_eq(tsp_proc_find("/nonexistent/prog", NULL), -ENOENT);
    ck_assert_int_eq(tsp_proc_find("/etc/passwd", NULL), -EACCES); /* not executable */
    ck_assert_int_eq(tsp_proc_find("/tmp", NULL), -EACCES);        /* a directory */
    char *nopath[] = {"PATH=/nonexistent", NULL};
    ck_assert_int_eq(tsp_proc_find("sh", nopath), -ENOENT); /* the given PATH, not ours */
}
END_TEST

static Suite *proc_suite(void)
{
    Suite *s = suite_create("proc");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_proc_spawn_pipes_and_env);
    tcase_add_test(tc, test_proc_stdin_null_and_fd3);
    tcase_add_test(tc, test_proc_exec_errors_come_back);
    tcase_add_test(tc, test_proc_find_as_exec_would);
    tcase_add_test(tc, test_proc_new_session_and_signal_mask_reset);
    tcase_add_test(tc, test_proc_pdeathsig_kills_child_with_parent);
    tcase_add_test(tc, test_proc_stat_names_a_process_and_its_parent);
    tcase_add_test(tc, test_proc_signal_descendants_reaches_grandchildren);
    tcase_add_test(tc, test_proc_spawn_while_threads_hold_malloc_and_stdio_locks);
    tcase_add_test(tc, test_proc_path_search_order_and_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(proc_suite());
}
