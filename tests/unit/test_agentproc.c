/* test_agentproc.c: the glues' agent process (torchspark/agentproc.h) with real children
 * (/bin/sh -c): both streams pumped into the tail, the echo and the handed lines, the secret
 * read from stdin (never in the environment), the environment's layers, an exit code and a
 * signal in the result, TERM then KILL for a child that ignores TERM, a tail of more than
 * TSP_AGENTPROC_TAIL_LINES lines, a line longer than the line buffer, a wait interrupted by
 * signals (EINTR), the reply kept across -ENOSPC, and the refusals. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "testutil.h"
#include "torchspark/agentproc.h"
#include "torchspark/task.h"
#include "util.h"

#define SECRET "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

static char out[4 << 20], err[512], dir[64];

/* The start request of sh -c script: the plan's finish names files in a fresh directory. */
static const char *host = "\"h1\""; /* the request's "host" member (JSON) */

static tsp_agentproc_t *start(const char *script, const char *secret, const char *extra)
{
    snprintf(dir, sizeof dir, "/tmp/tsp_agentproc_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char *req = NULL;
    int n = asprintf(&req,
                     "{\"plan\": {\"argv\": [\"/bin/sh\", \"-c\", \"%s\"], \"env\": {\"TSP_A\": "
                     "\"set\"}, \"env_default\": {\"TSP_B\": \"dflt\", \"PATH\": \"/nowhere\"}, "
                     "\"finish\": {\"files\": {\"error\": \"%s/error.json\", \"output\": "
                     "\"%s/output.bin\"}, \"nproc_per_node\": 1, \"ship\": false, \"collect\": "
                     "false, \"node_rank\": 3}}, \"secret\": %s%s%s, \"host\": %s%s}",
                     script, dir, dir, secret ? "\"" : "", secret ? secret : "null",
                     secret ? "\"" : "", host, extra ? extra : "");
    ck_assert_int_gt(n, 0);
    tsp_agentproc_t *a = tsp_agentproc_start(req, strlen(req), err, sizeof err);
    ck_assert_msg(a != NULL, "%s", err);
    free(req);
    return a;
}

/* Closes a, and removes its (empty) directory. */
static void done_with(tsp_agentproc_t *a)
{
    tsp_agentproc_close(a);
    rmdir(dir);
}

static int wait_once(tsp_agentproc_t *a, int timeout_ms)
{
    char req[64];
    snprintf(req, sizeof req, "{\"timeout_ms\": %d}", timeout_ms);
    return tsp_agentproc_wait(a, req, strlen(req), out, sizeof out, NULL, err, sizeof err);
}

/* Waits in 100 ms slices until done; the handed lines of every reply appended to handed,
 * each followed by ", " (the same text whichever replies carried them). */
static void wait_done(tsp_agentproc_t *a, char *handed, size_t len)
{
    for (int i = 0; i < 600; i++) {
        ck_assert_msg(wait_once(a, 100) == 0, "%s", err);
        char *lines = strstr(out, "\"lines\": [");
        if (handed && lines && lines[10] != ']') {
            char *end = strstr(lines, "], \"status\"");
            snprintf(handed + strlen(handed), len - strlen(handed), "%.*s, ",
                     (int)(end - lines - 10), lines + 10);
        }
        if (!strstr(out, "\"done\": null"))
            return;
    }
    ck_abort_msg("the agent did not end");
}

START_TEST(test_agentproc_streams_secret_env_and_exit_code)
{
    tsp_agentproc_t *a = start("read s; echo out $s; echo err $TSP_A $TSP_B $PATH "
                               "${TORCHSPARK_LOG_SECRET-none} $TORCHSPARK_LOG_SECRET_FD >&2; "
                               "test $TORCHSPARK_PARENT_PID = $PPID && exit 3",
                               SECRET, ", \"hand\": \"stderr\"");
    char handed[4096] = "";
    wait_done(a, handed, sizeof handed);
    /* The caller's PATH wins over env_default's; the secret came on stdin only. */
    char want[512];
    snprintf(want, sizeof want, "\"err set dflt %s none 0\", ", getenv("PATH"));
    ck_assert_str_eq(handed, want);
    ck_assert_msg(strstr(out, "\"status\": 3") && strstr(out, "exited with status 3") &&
                      strstr(out, "torchspark node 3 on host h1"),
                  "%s", out);
    done_with(a);
}
END_TEST

/* No "host" (neither glue passes one): the result names this host as gethostname does. */
START_TEST(test_agentproc_host_defaults_to_this_hosts_name)
{
    char self[256] = "", want[300];
    ck_assert_int_eq(gethostname(self, sizeof self - 1), 0);
    host = "null";
    tsp_agentproc_t *a = start("exit 3", NULL, NULL);
    host = "\"h1\"";
    wait_done(a, NULL, 0);
    snprintf(want, sizeof want, "torchspark node 3 on host %s", self);
    ck_assert_msg(strstr(out, want), "%s", out);
    done_with(a);
}
END_TEST

START_TEST(test_agentproc_no_secret_stdin_is_null_and_success)
{
    tsp_agentproc_t *a =
        start("cat; echo; echo ${TORCHSPARK_LOG_SECRET_FD-unset}", NULL, ", \"hand\": \"all\"");
    char handed[256] = "";
    wait_done(a, handed, sizeof handed);
    ck_assert_str_eq(handed, "\"\", \"unset\", "); /* an empty first line too */
    ck_assert_msg(strstr(out, "\"status\": 0, \"done\": {\"failure\": null"), "%s", out);
    done_with(a);
}
END_TEST

START_TEST(test_agentproc_the_glues_environ_replaces_this_processs)
{
    /* The PySpark glue's os.environ, not the C environ (which a library may have changed). */
    setenv("TSP_ONLY_IN_C", "1", 1);
    tsp_agentproc_t *a = start("echo ${TSP_ONLY_IN_C-no} $TSP_A $TSP_B $TSP_C $PATH", NULL,
                               ", \"hand\": \"all\", \"environ\": {\"TSP_C\": \"c\", "
                               "\"TSP_A\": \"lost\", \"PATH\": \"/usr/bin:/bin\"}");
    char handed[256] = "";
    wait_done(a, handed, sizeof handed);
    ck_assert_str_eq(handed, "\"no set dflt c /usr/bin:/bin\", ");
    done_with(a);
}
END_TEST

START_TEST(test_agentproc_echo_goes_to_stderr)
{
    char path[] = "/tmp/tsp_agentproc_echo_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    int saved = dup(2);
    dup2(fd, 2);
    tsp_agentproc_t *a = start("echo one; echo two >&2; printf three", NULL, ", \"echo\": true");
    wait_done(a, NULL, 0);
    dup2(saved, 2);
    char buf[256] = "";
    ck_assert_int_gt(pread(fd, buf, sizeof buf - 1, 0), 0);
    /* The two streams' order is the pipes' (each line whole); the last has no newline: added. */
    ck_assert_msg(strstr(buf, "one\n") && strstr(buf, "two\n") && strstr(buf, "three\n"), "%s",
                  buf);
    done_with(a);
    close(fd);
    unlink(path);
}
END_TEST

START_TEST(test_agentproc_signal_and_tail_of_the_last_lines)
{
    tsp_agentproc_t *a = start("i=0; while [ $i -lt 150 ]; do echo L$i.; i=$((i+1)); done; "
                               "kill -9 $$",
                               NULL, NULL);
    wait_done(a, NULL, 0);
    /* -N for signal N. */
    ck_assert_msg(strstr(out, "\"status\": -9") && strstr(out, "L149."), "%s", out);
    /* The tail the document carries: the last TSP_AGENTPROC_TAIL_LINES lines, L50. to L149. */
    ck_assert_msg(strstr(out, "L50.") && !strstr(out, "L49."), "%s", out);
    done_with(a);
}
END_TEST

START_TEST(test_agentproc_term_then_kill)
{
    /* The child ignores TERM: the stop KILLs it after the grace plus a second. */
    tsp_agentproc_t *a = start("trap '' TERM; echo ready; while :; do sleep 0.05; done", NULL,
                               ", \"hand\": \"all\"");
    ck_assert_int_eq(wait_once(a, 5000), 0);
    ck_assert_msg(strstr(out, "\"lines\": [\"ready\"], \"status\": null"), "%s", out);
    int64_t t0 = tsp__now_ms();
    tsp_agentproc_stop(a);
    int64_t took = tsp__now_ms() - t0;
    ck_assert_int_ge(took, (TSP_TASK_SHUTDOWN_TIMEOUT_S + 1) * 1000 - 100);
    wait_done(a, NULL, 0);
    ck_assert_msg(strstr(out, "\"status\": -9"), "%s", out);
    done_with(a);
    /* One that obeys TERM: close stops it at once. */
    tsp_agentproc_t *b = start("echo ready; exec sleep 30", NULL, ", \"hand\": \"all\"");
    ck_assert_int_eq(wait_once(b, 5000), 0);
    t0 = tsp__now_ms();
    done_with(b);
    ck_assert_int_lt(tsp__now_ms() - t0, 3000);
}
END_TEST

START_TEST(test_agentproc_line_longer_than_the_buffer)
{
    /* 1.5 MiB without a newline: handed on in pieces of the line cap (1 MiB), nothing lost. */
    tsp_agentproc_t *a = start("head -c 1572864 /dev/zero | tr '\\\\0' x; echo; echo end", NULL,
                               ", \"hand\": \"all\"");
    size_t xs = 0;
    int ends = 0;
    for (int i = 0; i < 600; i++) {
        ck_assert_msg(wait_once(a, 100) == 0, "%s", err);
        for (char *p = strstr(out, "\"lines\": ["); p && *p && *p != ']'; p++)
            xs += *p == 'x';
        ends += strstr(out, "\"end\"") != NULL;
        if (!strstr(out, "\"done\": null"))
            break;
    }
    ck_assert_uint_eq(xs, 1572864);
    ck_assert_int_eq(ends, 1);
    done_with(a);
}
END_TEST

static void on_alarm(int sig)
{
    (void)sig;
}

START_TEST(test_agentproc_wait_through_eintr)
{
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: poll sees EINTR */
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20000}, {0, 20000}};
    setitimer(ITIMER_REAL, &it, NULL);
    tsp_agentproc_t *a = start("sleep 0.3; echo late; exit 4", NULL, ", \"hand\": \"all\"");
    char handed[256] = "";
    wait_done(a, handed, sizeof handed);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    ck_assert_str_eq(handed, "\"late\", ");
    ck_assert_msg(strstr(out, "\"status\": 4"), "%s", out);
    done_with(a);
}
END_TEST

START_TEST(test_agentproc_reply_kept_across_enospc)
{
    tsp_agentproc_t *a = start("echo hello; exit 0", NULL, ", \"hand\": \"all\"");
    char small[8];
    size_t need = 0;
    const char *r = "{\"timeout_ms\": 5000}";
    ck_assert_int_eq(
        tsp_agentproc_wait(a, r, strlen(r), small, sizeof small, &need, err, sizeof err), -ENOSPC);
    ck_assert_uint_gt(need, sizeof small);
    ck_assert_int_eq(tsp_agentproc_wait(a, r, strlen(r), out, need, NULL, err, sizeof err), 0);
    ck_assert_msg(strstr(out, "\"lines\": [\"hello\"]"), "%s", out);
    done_with(a);
}
END_TEST

START_TEST(test_agentproc_refusals)
{
    const char *bad[][2] = {
        {"[]", "not a JSON object"},
        {"{\"host\": \"h\", \"plan\": {\"argv\": [], \"finish\": {}}}", "\"plan.argv\""},
        {"{\"host\": \"h\", \"plan\": {\"argv\": [\"sh\"]}}", "\"plan.finish\""},
        {"{\"host\": 7, \"plan\": {\"argv\": [\"sh\"], \"finish\": {}}}", "\"host\""},
        {"{\"host\": \"h\", \"secret\": \"zz\", \"plan\": {\"argv\": [\"sh\"], \"finish\": {}}}",
         "\"secret\""},
        {"{\"host\": \"h\", \"hand\": \"some\", \"plan\": {\"argv\": [\"sh\"], \"finish\": {}}}",
         "\"hand\""},
        {"{\"host\": \"h\", \"plan\": {\"argv\": [\"sh\"], \"env\": {\"A\": 1}, \"finish\": {}}}",
         "\"plan.env\""},
        {"{\"host\": \"h\", \"environ\": [], \"plan\": {\"argv\": [\"sh\"], \"finish\": {}}}",
         "\"environ\""},
        {"{\"host\": \"h\", \"plan\": {\"argv\": [\"/nonexistent/agent\"], \"finish\": {}}}",
         "cannot run '/nonexistent/agent'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        ck_assert_ptr_null(tsp_agentproc_start(bad[i][0], strlen(bad[i][0]), err, sizeof err));
        ck_assert_msg(strstr(err, bad[i][1]) != NULL, "%zu: %s", i, err);
    }
    tsp_agentproc_close(NULL);
}
END_TEST

static Suite *agentproc_suite(void)
{
    Suite *s = suite_create("agentproc");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_agentproc_streams_secret_env_and_exit_code);
    tcase_add_test(tc, test_agentproc_no_secret_stdin_is_null_and_success);
    tcase_add_test(tc, test_agentproc_the_glues_environ_replaces_this_processs);
    tcase_add_test(tc, test_agentproc_echo_goes_to_stderr);
    tcase_add_test(tc, test_agentproc_signal_and_tail_of_the_last_lines);
    tcase_add_test(tc, test_agentproc_term_then_kill);
    tcase_add_test(tc, test_agentproc_line_longer_than_the_buffer);
    tcase_add_test(tc, test_agentproc_wait_through_eintr);
    tcase_add_test(tc, test_agentproc_reply_kept_across_enospc);
    tcase_add_test(tc, test_agentproc_refusals);
    tcase_add_test(tc, test_agentproc_host_defaults_to_this_hosts_name);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(agentproc_suite());
}
