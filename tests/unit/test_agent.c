/* test_agent.c: the agent's state machine: success, failure and root cause, restarts,
 * forwarded and stopping signals, orphans, and output through a sink with backpressure. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "agent.h"
#include "json.h"
#include "report.h"

static char dir[] = "/tmp/tsp_agent_test_XXXXXX";

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(tsp_agent_setup_process(0, 0), 0);
}

static int run_sh(int nproc, int max_restarts, const char *script, tsp_agent_opts_t *extra,
                  tsp_agent_t **keep)
{
    static char *argv[4];
    argv[0] = "sh";
    argv[1] = "-c";
    argv[2] = (char *)script;
    argv[3] = NULL;
    tsp_agent_opts_t o = extra ? *extra : (tsp_agent_opts_t){0};
    tsp_topo_init(&o.topo);
    o.topo.nproc_per_node = nproc;
    o.topo.max_restarts = max_restarts;
    o.file = "sh";
    o.argv = argv;
    o.name = "script.sh";
    o.shutdown_timeout = o.shutdown_timeout > 0 ? o.shutdown_timeout : 5;
    if (!extra) {
        o.console_out = 1;
        o.console_err = 2;
        o.log_fd = 2;
    }
    tsp_agent_t *a;
    char err[256];
    ck_assert_int_eq(tsp_agent_init(&a, &o, err, sizeof err), 0);
    int st = tsp_agent_run(a);
    if (keep)
        *keep = a;
    else
        tsp_agent_close(a);
    return st;
}

START_TEST(test_agent_success)
{
    setup();
    ck_assert_int_eq(run_sh(3, 0, "exit 0", NULL, NULL), 0);
}
END_TEST

START_TEST(test_agent_failure_root_cause_and_others_stopped)
{
    setup();
    char script[512];
    /* rank 1 fails with 3; the others would sleep for a minute */
    snprintf(script, sizeof script,
             "if [ $LOCAL_RANK = 1 ]; then sleep 0.2; exit 3; fi; echo $$$$ > %s/pid.$LOCAL_RANK; "
             "exec sleep 60",
             dir);
    char ef[600];
    snprintf(ef, sizeof ef, "%s/root.json", dir);
    tsp_agent_opts_t o = {.console_out = 1, .console_err = 2, .log_fd = 2, .error_file = ef};
    tsp_agent_t *a;
    ck_assert_int_eq(run_sh(3, 0, script, &o, &a), 3);
    const tsp_failure_t *f = tsp_agent_root_cause(a);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(f->rank, 1);
    ck_assert_int_eq(f->exitcode, 3);
    tsp_agent_close(a);
    for (int r = 0; r < 3; r += 2) {
        char p[600];
        snprintf(p, sizeof p, "%s/pid.%d", dir, r);
        FILE *pf = fopen(p, "r");
        ck_assert_ptr_nonnull(pf);
        int pid = 0;
        ck_assert_int_eq(fscanf(pf, "%d", &pid), 1);
        fclose(pf);
        ck_assert_msg(tsp_test_gone(pid, 100), "worker %d still alive", r);
    }
    FILE *jf = fopen(ef, "r");
    ck_assert_ptr_nonnull(jf);
    char doc[4096];
    size_t n = fread(doc, 1, sizeof doc, jf);
    fclose(jf);
    char *v = NULL;
    int type;
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.rank", &v, &type), 0);
    ck_assert_str_eq(v, "1");
    free(v);
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.exitcode", &v, &type), 0);
    ck_assert_str_eq(v, "3");
    free(v);
    ck_assert_int_eq(tsp_json_get(doc, n, "message.message", &v, &type), 0);
    free(v);
}
END_TEST

/* The document's reason and step of a checkpoint on request (docs/protocol.md section 8). */
static void on_request_doc(const char *script, const char *want_reason, const char *want_step)
{
    char ef[600], req[600];
    snprintf(ef, sizeof ef, "%s/root.json", dir);
    snprintf(req, sizeof req, "%s/req", dir);
    tsp_agent_opts_t o = {.console_out = 1,
                          .console_err = 2,
                          .log_fd = 2,
                          .error_file = ef,
                          .checkpoint_request = req};
    tsp_agent_t *a;
    ck_assert_int_eq(run_sh(1, 0, script, &o, &a), 128 + SIGTERM);
    tsp_agent_close(a);
    FILE *jf = fopen(ef, "r");
    ck_assert_ptr_nonnull(jf);
    char doc[8192];
    size_t n = fread(doc, 1, sizeof doc, jf);
    fclose(jf);
    char *v = NULL;
    int type;
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.reason", &v, &type), 0);
    ck_assert_str_eq(v, want_reason);
    free(v);
    int rc = tsp_json_get(doc, n, "torchspark.checkpoint_step", &v, &type);
    if (want_step) {
        ck_assert_int_eq(rc, 0);
        ck_assert_str_eq(v, want_step);
        free(v);
    } else {
        ck_assert_int_eq(rc, -ENOENT);
    }
}

START_TEST(test_agent_checkpoint_on_request_is_a_decommission)
{
    setup();
    char script[1024];
    /* The training acknowledged the request (torchspark.checkpoint writes the step), then the
     * plugin stopped the node: its failure is the decommission, with the step. */
    snprintf(script, sizeof script, "printf '12\\n' > %s/req.done; kill -TERM $$$$", dir);
    on_request_doc(script, "decommission", "12");
    /* Without an acknowledgement, or with one that is a link or not a step: a signal. */
    snprintf(script, sizeof script, "rm -f %s/req.done; kill -TERM $$$$", dir);
    on_request_doc(script, "signal", NULL);
    snprintf(script, sizeof script,
             "echo 5 > %s/other; ln -sf %s/other %s/req.done; kill -TERM $$$$", dir, dir, dir);
    on_request_doc(script, "signal", NULL);
    snprintf(script, sizeof script, "rm -f %s/req.done; echo x > %s/req.done; kill -TERM $$$$", dir,
             dir);
    on_request_doc(script, "signal", NULL);
}
END_TEST

START_TEST(test_agent_exits_after_stop_are_not_failures)
{
    setup();
    /* rank 0 would exit later but its error file says it failed first; rank 1 exits once
     * that file is written (an order, not a race of sleeps: a loaded host once started rank
     * 1's shell so late that rank 0's 0.3 s sleep ended first) */
    char script[768];
    snprintf(script, sizeof script,
             "if [ $LOCAL_RANK = 0 ]; then "
             "printf '{\"message\": {\"message\": \"ValueError: boom\", \"extraInfo\": "
             "{\"py_callstack\": \"Traceback: boom\", \"timestamp\": \"1000\"}}}' > "
             "$TORCHELASTIC_ERROR_FILE; touch %s/r0; sleep 30; exit 1; fi; "
             "while [ ! -e %s/r0 ]; do sleep 0.01; done; exit 2",
             dir, dir);
    tsp_agent_t *a;
    tsp_agent_opts_t o = {.console_out = 1, .console_err = 2, .log_fd = 2};
    /* rank 1 exits first (code 2) and stops rank 0 with SIGTERM before rank 0's own
     * failure is observed, so only rank 1 is a failure here: root cause rank 1 */
    int st = run_sh(2, 0, script, &o, &a);
    ck_assert_int_eq(st, 2);
    ck_assert_int_eq(tsp_agent_root_cause(a)->rank, 1);
    tsp_agent_close(a);
}
END_TEST

START_TEST(test_agent_root_cause_is_earliest_error_file_timestamp)
{
    setup();
    /* Two failures: the one observed first has no error file; the later one's error file
     * says it failed at t=1000, long before: that one is the root cause, as in torchrun. */
    tsp_failure_t f[2];
    memset(f, 0, sizeof f);
    f[0].rank = 1;
    f[0].time = 2000.0;
    snprintf(f[0].error_file, sizeof f[0].error_file, "%s/none.json", dir);
    f[1].rank = 0;
    f[1].time = 2000.5;
    snprintf(f[1].error_file, sizeof f[1].error_file, "%s/err0.json", dir);
    FILE *ef = fopen(f[1].error_file, "w");
    ck_assert_ptr_nonnull(ef);
    fputs("{\"message\": {\"message\": \"ValueError: boom\", \"extraInfo\": "
          "{\"py_callstack\": \"Traceback: boom\", \"timestamp\": \"1000\"}}}",
          ef);
    fclose(ef);
    tsp__report_read_error_file(&f[0]);
    tsp__report_read_error_file(&f[1]);
    ck_assert_int_eq(f[0].has_error_file, 0);
    ck_assert_int_eq(f[1].has_error_file, 1);
    ck_assert(f[1].time == 1000.0);
    ck_assert_int_eq(tsp__report_root(f, 2), 1);
    /* the report shows the traceback of the root cause and lists the other failure */
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    tsp__report_print(m, "train.py", "hostA", f, 2, 1);
    fclose(m);
    ck_assert_ptr_nonnull(strstr(text, "train.py FAILED"));
    ck_assert_ptr_nonnull(strstr(text, "Root Cause (first observed failure):\n[1]:"));
    ck_assert_ptr_nonnull(strstr(text, "traceback : Traceback: boom"));
    ck_assert_ptr_nonnull(strstr(text, "host      : hostA"));
    ck_assert_ptr_null(strstr(text, "<NO_OTHER_FAILURES>"));
    free(text);
    tsp__report_clear(&f[0]);
    tsp__report_clear(&f[1]);
}
END_TEST

/* The failure document: valid JSON whatever the worker's error file held; a malformed one
 * is quoted as text, never pasted; a long traceback keeps both ends. */
START_TEST(test_agent_failure_document_quotes_malformed_and_caps)
{
    setup();
    tsp_failure_t f;
    memset(&f, 0, sizeof f);
    f.rank = 3;
    f.time = 5.0;
    tsp__report_set_status(&f, 9); /* a wait status: killed by SIGKILL */
    ck_assert_int_eq(f.status, 137);
    ck_assert_int_eq(f.signal, 9);
    ck_assert_int_eq(f.exitcode, -9);
    snprintf(f.error_file, sizeof f.error_file, "%s/bad.json", dir);
    FILE *ef = fopen(f.error_file, "w");
    fputs("{\"message\": xyz \"\x01\xff", ef);
    fclose(ef);
    tsp__report_read_error_file(&f);
    ck_assert_int_eq(tsp__report_document(&f, "h\"ost", 2), 0);
    ck_assert_int_eq(tsp_json_check_object(f.document, strlen(f.document)), 0);
    char *v = NULL;
    int type = 0;
    ck_assert_int_eq(
        tsp_json_get(f.document, strlen(f.document), "message.extraInfo.py_callstack", &v, &type),
        0);
    ck_assert_ptr_nonnull(strstr(v, "{\"message\": xyz"));
    free(v);
    ck_assert_int_eq(tsp_json_get(f.document, strlen(f.document), "torchspark.exitcode", &v, &type),
                     0);
    ck_assert_str_eq(v, "137");
    free(v);
    /* the one sentence, written here only (report.c) */
    ck_assert_int_eq(tsp_json_get(f.document, strlen(f.document), "torchspark.summary", &v, &type),
                     0);
    ck_assert_str_eq(v, "rank 3 (node 2, local rank 0) on host h\"ost was killed by SIGKILL (9)");
    free(v);
    /* 500 lines: 200 kept, the first and the last */
    ef = fopen(f.error_file, "w");
    fputs("{\"message\": {\"message\": \"E: x\", \"extraInfo\": {\"py_callstack\": \"", ef);
    for (int i = 0; i < 500; i++)
        fprintf(ef, "line %d\\n", i);
    fputs("\"}}}", ef);
    fclose(ef);
    tsp__report_read_error_file(&f);
    ck_assert_ptr_nonnull(strstr(f.traceback, "line 0\n"));
    ck_assert_ptr_nonnull(strstr(f.traceback, "line 99\n... 300 lines left out"));
    ck_assert_ptr_nonnull(strstr(f.traceback, "line 400\n"));
    ck_assert_ptr_nonnull(strstr(f.traceback, "line 499"));
    ck_assert_ptr_null(strstr(f.traceback, "line 100\n"));
    tsp__report_clear(&f);
}
END_TEST

START_TEST(test_agent_restart_until_success)
{
    setup();
    /* fails on attempts 0 and 1, succeeds on attempt 2 */
    ck_assert_int_eq(run_sh(2, 2, "[ $TORCHELASTIC_RESTART_COUNT -ge 2 ] || exit 4", NULL, NULL),
                     0);
    /* with one restart only it still fails, with the worker's code */
    ck_assert_int_eq(run_sh(2, 1, "[ $TORCHELASTIC_RESTART_COUNT -ge 2 ] || exit 4", NULL, NULL),
                     4);
}
END_TEST

static void *stop_later(void *arg)
{
    usleep(300000);
    tsp_agent_stop(arg, SIGTERM);
    return NULL;
}

/* An initialised (not yet running) agent of two `sh -c script` workers. */
static tsp_agent_t *init_sh_agent(const char *script)
{
    static char *argv[4];
    argv[0] = "sh";
    argv[1] = "-c";
    argv[2] = (char *)script;
    argv[3] = NULL;
    tsp_agent_opts_t o = {.file = "sh",
                          .argv = argv,
                          .console_out = 1,
                          .console_err = 2,
                          .log_fd = 2,
                          .shutdown_timeout = 5};
    tsp_topo_init(&o.topo);
    o.topo.nproc_per_node = 2;
    tsp_agent_t *a;
    char err[256];
    ck_assert_int_eq(tsp_agent_init(&a, &o, err, sizeof err), 0);
    return a;
}

START_TEST(test_agent_stopped_after_a_checkpoint_on_request_reports_it)
{
    /* The plugin's stop reaches the agent first (TERM to the whole tree): the node still
     * leaves its one document, the decommission with its step. */
    setup();
    static char script[600], *argv[4] = {"sh", "-c", script, NULL};
    char ef[600], req[600], err[256];
    snprintf(script, sizeof script, "printf '7\\n' > %s/req.done; exec sleep 60", dir);
    snprintf(ef, sizeof ef, "%s/root.json", dir);
    snprintf(req, sizeof req, "%s/req", dir);
    tsp_agent_opts_t o = {.file = "sh",
                          .argv = argv,
                          .name = "script.sh",
                          .shutdown_timeout = 5,
                          .console_out = 1,
                          .console_err = 2,
                          .log_fd = 2,
                          .error_file = ef,
                          .checkpoint_request = req};
    tsp_topo_init(&o.topo);
    o.topo.nproc_per_node = 1;
    tsp_agent_t *a;
    ck_assert_int_eq(tsp_agent_init(&a, &o, err, sizeof err), 0);
    pthread_t t;
    pthread_create(&t, NULL, stop_later, a);
    ck_assert_int_eq(tsp_agent_run(a), 128 + SIGTERM);
    pthread_join(t, NULL);
    ck_assert_ptr_nonnull(tsp_agent_root_cause(a));
    tsp_agent_close(a);
    FILE *jf = fopen(ef, "r");
    ck_assert_ptr_nonnull(jf);
    char doc[8192];
    size_t n = fread(doc, 1, sizeof doc, jf);
    fclose(jf);
    char *v = NULL;
    int type;
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.reason", &v, &type), 0);
    ck_assert_str_eq(v, "decommission");
    free(v);
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.checkpoint_step", &v, &type), 0);
    ck_assert_str_eq(v, "7");
    free(v);
}
END_TEST

static void *checkpoint_later(void *arg)
{
    usleep(300000);
    tsp_agent_checkpoint(arg, 1);
    return NULL;
}

START_TEST(test_agent_checkpoint_from_the_driver_stops_after_the_acknowledgement)
{
    /* The driver's CHECKPOINT (docs/protocol.md 1.13): the agent creates the request file
     * ("grow ..."), the training acknowledges with its step, and the agent stops the node
     * itself (no plugin): its one document says reason grow, with the step. */
    setup();
    static char script[900], *argv[4] = {"sh", "-c", script, NULL};
    char ef[600], req[600], seen[600], err[256];
    snprintf(ef, sizeof ef, "%s/root.json", dir);
    snprintf(req, sizeof req, "%s/greq", dir);
    snprintf(seen, sizeof seen, "%s/seen", dir);
    snprintf(script, sizeof script,
             "while [ ! -f %s ]; do sleep 0.02; done; head -c 5 %s > %s; "
             "printf '9\\n' > %s.done; exec sleep 60",
             req, req, seen, req);
    tsp_agent_opts_t o = {.file = "sh",
                          .argv = argv,
                          .name = "script.sh",
                          .shutdown_timeout = 5,
                          .console_out = 1,
                          .console_err = 2,
                          .log_fd = 2,
                          .error_file = ef,
                          .checkpoint_request = req};
    tsp_topo_init(&o.topo);
    o.topo.nproc_per_node = 1;
    tsp_agent_t *a;
    ck_assert_int_eq(tsp_agent_init(&a, &o, err, sizeof err), 0);
    pthread_t t;
    pthread_create(&t, NULL, checkpoint_later, a);
    ck_assert_int_eq(tsp_agent_run(a), 128 + SIGTERM);
    pthread_join(t, NULL);
    tsp_agent_close(a);
    char buf[16] = {0};
    FILE *sf = fopen(seen, "r");
    ck_assert_ptr_nonnull(sf);
    ck_assert_uint_eq(fread(buf, 1, 5, sf), 5);
    fclose(sf);
    ck_assert_str_eq(buf, "grow ");
    struct stat st;
    ck_assert_int_eq(stat(req, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    FILE *jf = fopen(ef, "r");
    ck_assert_ptr_nonnull(jf);
    char doc[8192];
    size_t n = fread(doc, 1, sizeof doc, jf);
    fclose(jf);
    char *v = NULL;
    int type;
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.reason", &v, &type), 0);
    ck_assert_str_eq(v, "grow");
    free(v);
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.checkpoint_step", &v, &type), 0);
    ck_assert_str_eq(v, "9");
    free(v);
}
END_TEST

START_TEST(test_agent_stop_signal_stops_workers)
{
    setup();
    tsp_agent_t *a = init_sh_agent("exec sleep 60");
    pthread_t t;
    pthread_create(&t, NULL, stop_later, a);
    ck_assert_int_eq(tsp_agent_run(a), 128 + SIGTERM);
    pthread_join(t, NULL);
    ck_assert_ptr_null(tsp_agent_root_cause(a));
    tsp_agent_close(a);
}
END_TEST

START_TEST(test_agent_forwards_usr1_and_kills_term_ignoring_orphans)
{
    setup();
    char script[512];
    /* each worker records SIGUSR1; rank 0 also leaves an orphan that ignores SIGTERM */
    snprintf(
        script, sizeof script,
        "trap 'echo usr1 > %s/usr1.$LOCAL_RANK; exit 0' USR1; "
        "if [ $LOCAL_RANK = 0 ]; then (trap '' TERM; setsid sleep 60 & echo $! > %s/orphan); fi; "
        "while :; do sleep 0.05; done",
        dir, dir);
    tsp_agent_t *a = init_sh_agent(script);
    /* deliver SIGUSR1 to the agent (this process) shortly after start */
    pid_t killer = fork();
    if (killer == 0) {
        usleep(400000);
        kill(getppid(), SIGUSR1);
        _exit(0);
    }
    ck_assert_int_eq(tsp_agent_run(a), 0);
    tsp_agent_close(a);
    for (int r = 0; r < 2; r++) {
        char p[600];
        snprintf(p, sizeof p, "%s/usr1.%d", dir, r);
        ck_assert_msg(access(p, F_OK) == 0, "worker %d did not get SIGUSR1", r);
    }
    char p[600];
    snprintf(p, sizeof p, "%s/orphan", dir);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    int orphan = 0;
    ck_assert_int_eq(fscanf(f, "%d", &orphan), 1);
    fclose(f);
    ck_assert_msg(tsp_test_gone(orphan, 500), "orphan %d survived the agent", orphan);
}
END_TEST

/* A sink that takes 3 lines, then is full until the test's timer thread makes room. */
typedef struct {
    int efd;
    int taken;
    int full;
    char got[64][64];
    pthread_mutex_t mu;
} test_sink_t;

static int sink_write(void *ctx, const tsp_line_t *line)
{
    test_sink_t *s = ctx;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->full) {
        uint64_t x;
        ssize_t r = read(s->efd, &x, sizeof x); /* clear readiness before saying "full" */
        (void)r;
        rc = -EAGAIN;
    } else if (s->taken < 64) {
        snprintf(s->got[s->taken], sizeof s->got[0], "%d:%d:%.*s", line->rank, line->stream,
                 (int)line->len, line->data);
        if (++s->taken % 3 == 0)
            s->full = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void *unblock(void *arg)
{
    test_sink_t *s = arg;
    for (int i = 0; i < 40; i++) {
        usleep(20000);
        pthread_mutex_lock(&s->mu);
        s->full = 0;
        uint64_t one = 1;
        ssize_t r = write(s->efd, &one, sizeof one);
        (void)r;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

START_TEST(test_agent_sink_backpressure_loses_nothing)
{
    setup();
    test_sink_t s = {.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
    pthread_mutex_init(&s.mu, NULL);
    tsp_line_sink_t sink = {.ctx = &s, .write_line = sink_write, .wake_fd = s.efd};
    pthread_t t;
    pthread_create(&t, NULL, unblock, &s);
    tsp_agent_opts_t o = {.console_out = 1, .console_err = 2, .log_fd = 2, .sink = &sink};
    ck_assert_int_eq(run_sh(2, 0,
                            "for i in 1 2 3 4 5; do echo line$i; done; echo err >&2; "
                            "printf tail",
                            &o, NULL),
                     0);
    pthread_join(t, NULL);
    ck_assert_int_eq(s.taken, 14); /* 2 ranks x (5 + err + tail) */
    int seen[2] = {0, 0};
    for (int i = 0; i < s.taken; i++) {
        int rank = s.got[i][0] - '0';
        char want[32];
        if (s.got[i][2] == '2')
            continue;
        seen[rank]++;
        if (seen[rank] <= 5)
            snprintf(want, sizeof want, "%d:1:line%d", rank, seen[rank]);
        else
            snprintf(want, sizeof want, "%d:1:tail", rank);
        ck_assert_str_eq(s.got[i], want);
    }
    ck_assert_int_eq(seen[0], 6);
    ck_assert_int_eq(seen[1], 6);
    close(s.efd);
}
END_TEST

START_TEST(test_agent_exec_error_status)
{
    setup();
    char *argv[] = {"/nonexistent/prog", NULL};
    tsp_agent_opts_t o = {.file = argv[0],
                          .argv = argv,
                          .console_out = 1,
                          .console_err = 2,
                          .log_fd = 2,
                          .shutdown_timeout = 1};
    tsp_topo_init(&o.topo);
    o.topo.nproc_per_node = 2;
    tsp_agent_t *a;
    char err[256];
    ck_assert_int_eq(tsp_agent_init(&a, &o, err, sizeof err), 0);
    ck_assert_int_eq(tsp_agent_run(a), 127);
    tsp_agent_close(a);
}
END_TEST

/* --warm-socket with no pool there: each worker's shim runs the command itself, with the
 * environment it would have had, and the exit code comes back as without the option. */
START_TEST(test_agent_warm_socket_without_pool_runs_workers)
{
    setup();
    char sock[512];
    snprintf(sock, sizeof sock, "%s/no-pool.sock", dir);
    tsp_agent_opts_t o = {.console_out = 1,
                          .console_err = 2,
                          .log_fd = 2,
                          .warm_socket = sock,
                          .warm_shim = TSP_RUN_BIN};
    ck_assert_int_eq(run_sh(2, 0,
                            "[ \"$WORLD_SIZE/$LOCAL_WORLD_SIZE\" = 2/2 ] || exit 9; "
                            "[ -n \"$TORCHELASTIC_ERROR_FILE\" ] || exit 8; "
                            "if [ $LOCAL_RANK = 1 ]; then exit 3; fi",
                            &o, NULL),
                     3);
    ck_assert_int_eq(run_sh(2, 0, "exit 0", &o, NULL), 0);
    /* a program that cannot run is the agent's refusal, as without the option: no restart */
    char *argv[] = {"/nonexistent/prog", NULL};
    o.file = argv[0];
    o.argv = argv;
    o.shutdown_timeout = 1;
    tsp_topo_init(&o.topo);
    o.topo.nproc_per_node = 2;
    o.topo.max_restarts = 3;
    tsp_agent_t *a;
    char err[256];
    ck_assert_int_eq(tsp_agent_init(&a, &o, err, sizeof err), 0);
    ck_assert_int_eq(tsp_agent_run(a), 127);
    ck_assert_ptr_null(tsp_agent_root_cause(a)); /* no worker ran, so none failed */
    tsp_agent_close(a);
}
END_TEST

/* The document carries the failing rank's last lines, read to the end of its pipes: a line
 * written after the worker was reaped, by a child holding its stdout, still arrives (the agent
 * builds the document the moment the exit is seen), the other ranks' lines do not, and
 * only the last TSP_REPORT_TAIL_LINES are kept. */
START_TEST(test_agent_failure_document_has_the_rank_last_lines)
{
    setup();
    char ef[600];
    snprintf(ef, sizeof ef, "%s/tail.json", dir);
    tsp_agent_opts_t o = {.console_out = -1, .console_err = -1, .log_fd = 2, .error_file = ef};
    const char *script =
        "if [ $LOCAL_RANK = 1 ]; then i=0; while [ $i -lt 150 ]; do echo line $i; i=$((i+1)); "
        "done; sleep 0.3; echo oops >&2; (while kill -0 $$ 2>/dev/null; do :; done; echo late) & "
        "exit 3; "
        "fi; echo other; exec sleep 60";
    ck_assert_int_eq(run_sh(2, 0, script, &o, NULL), 3);
    FILE *jf = fopen(ef, "r");
    ck_assert_ptr_nonnull(jf);
    static char doc[65536];
    size_t n = fread(doc, 1, sizeof doc, jf);
    fclose(jf);
    char *v = NULL;
    int type;
    ck_assert_int_eq(tsp_json_get(doc, n, "torchspark.tail", &v, &type), 0);
    ck_assert_int_eq(type, TSP_JSON_STRING);
    /* stdout and stderr are two pipes, read in no set order: "oops" is among the last lines
     * when the agent read it after most of stdout (the script waits 0.3 s to make that
     * likely), else it fell out of the window with the early lines. */
    if (strstr(v, "[rank 1] [stderr] oops\n"))
        ck_assert_msg(strncmp(v, "[rank 1] line 52\n[rank 1] line 53\n", 34) == 0, "tail: %s", v);
    else
        ck_assert_msg(strncmp(v, "[rank 1] line 51\n[rank 1] line 52\n", 34) == 0, "tail: %s", v);
    ck_assert_ptr_nonnull(strstr(v, "[rank 1] line 149\n"));
    const char *end = "\n[rank 1] late";
    ck_assert_str_eq(v + strlen(v) - strlen(end), end);
    ck_assert_ptr_null(strstr(v, "other"));
    int lines = 1;
    for (const char *p = v; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, TSP_REPORT_TAIL_LINES);
    free(v);
    ck_assert_int_ne(tsp_json_get(doc, n, "torchspark.agent_exitcode", &v, &type), 0);
}
END_TEST

typedef struct {
    int calls, rank;
    struct timespec when;
    int error_file_written;
    const char *error_file;
} failure_seen_t;

static void on_failure(void *ctx, const tsp_failure_t *root)
{
    failure_seen_t *fs = ctx;
    fs->calls++;
    fs->rank = root->rank;
    clock_gettime(CLOCK_MONOTONIC, &fs->when);
    fs->error_file_written = access(fs->error_file, F_OK) == 0;
}

START_TEST(test_agent_on_failure_runs_before_the_grace)
{
    setup();
    char ef[600];
    snprintf(ef, sizeof ef, "%s/root.json", dir);
    failure_seen_t fs = {.error_file = ef};
    /* rank 1 fails at once; rank 0 ignores SIGTERM, so the node's own teardown takes the
     * whole 1 s grace: the callback must come before it, once, with the error file written */
    tsp_agent_opts_t o = {.console_out = 1,
                          .console_err = 2,
                          .log_fd = 2,
                          .error_file = ef,
                          .shutdown_timeout = 1.0,
                          .on_failure = on_failure,
                          .on_failure_ctx = &fs};
    struct timespec t1;
    ck_assert_int_eq(run_sh(2, 0,
                            "if [ $LOCAL_RANK = 1 ]; then sleep 0.2; exit 3; fi; "
                            "trap '' TERM; sleep 30",
                            &o, NULL),
                     3);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_int_eq(fs.calls, 1);
    ck_assert_int_eq(fs.rank, 1);
    ck_assert_int_eq(fs.error_file_written, 1);
    double before_end =
        (double)(t1.tv_sec - fs.when.tv_sec) + (double)(t1.tv_nsec - fs.when.tv_nsec) / 1e9;
    ck_assert_msg(before_end > 0.8, "callback only %.3f s before the end", before_end);
}
END_TEST

static Suite *agent_suite(void)
{
    Suite *s = suite_create("agent");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_agent_success);
    tcase_add_test(tc, test_agent_failure_root_cause_and_others_stopped);
    tcase_add_test(tc, test_agent_exits_after_stop_are_not_failures);
    tcase_add_test(tc, test_agent_checkpoint_on_request_is_a_decommission);
    tcase_add_test(tc, test_agent_checkpoint_from_the_driver_stops_after_the_acknowledgement);
    tcase_add_test(tc, test_agent_stopped_after_a_checkpoint_on_request_reports_it);
    tcase_add_test(tc, test_agent_root_cause_is_earliest_error_file_timestamp);
    tcase_add_test(tc, test_agent_failure_document_quotes_malformed_and_caps);
    tcase_add_test(tc, test_agent_restart_until_success);
    tcase_add_test(tc, test_agent_stop_signal_stops_workers);
    tcase_add_test(tc, test_agent_forwards_usr1_and_kills_term_ignoring_orphans);
    tcase_add_test(tc, test_agent_sink_backpressure_loses_nothing);
    tcase_add_test(tc, test_agent_exec_error_status);
    tcase_add_test(tc, test_agent_on_failure_runs_before_the_grace);
    tcase_add_test(tc, test_agent_failure_document_has_the_rank_last_lines);
    tcase_add_test(tc, test_agent_warm_socket_without_pool_runs_workers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(agent_suite());
}
