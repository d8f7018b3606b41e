/* test_logwatch.c: the hang doctor's watchdog as an option of the log server (logwatch.c,
 * docs/protocol.md 1.12): its clock starts at the workers' start (the first agent's
 * authentication), not at the first line, and a line restarts it; DUMP is sent once per
 * hang; the answers are collected and named in ONE event; "cancel" STOPs every agent, and
 * "report" lets the run go on. A real server and a real client on loopback; the test
 * answers the DUMP as an agent's dumper would. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "json.h"
#include "logtest.h"
#include "testutil.h"

typedef struct agent_fx {
    atomic_int dumps;
    atomic_uint last;
    atomic_llong dumped_at; /* ms, monotonic */
    atomic_int stops;
    char stop[512];
} agent_fx_t;

static void on_dump(void *ctx, unsigned request)
{
    agent_fx_t *a = ctx;
    atomic_store(&a->last, request);
    atomic_store(&a->dumped_at, (long long)tsp__now_ms());
    atomic_fetch_add(&a->dumps, 1);
}

static void on_stop(void *ctx, int reason, const char *text, size_t len)
{
    agent_fx_t *a = ctx;
    (void)reason;
    snprintf(a->stop, sizeof a->stop, "%.*s", (int)len, text);
    atomic_fetch_add(&a->stops, 1);
}

/* The stacks files go to a directory of each test's own (removed after it), not /tmp. */
static char stacks_dir[] = "/tmp/tsp-logwatch-XXXXXX";

static void stacks_dir_make(void)
{
    memcpy(stacks_dir + sizeof stacks_dir - 7, "XXXXXX", 6); /* CK_FORK=no: a fresh name each */
    ck_assert_ptr_nonnull(mkdtemp(stacks_dir));
}

static void stacks_dir_remove(void)
{
    DIR *d = opendir(stacks_dir);
    struct dirent *e;
    char path[sizeof stacks_dir + 256];
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(path, sizeof path, "%s/%s", stacks_dir, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
    rmdir(stacks_dir);
}

static tsp_logserver_t *watch_server(long timeout_ms, const char *action, int world)
{
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.event_fd = -1;
    o.tail_lines = TSP_LOGSERVER_HANG_TAIL;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    ck_assert_int_eq(tsp_logserver_watch(s, timeout_ms, action, world, stacks_dir, err, sizeof err),
                     0);
    return s;
}

static tsp_logclient_t *agent(tsp_logserver_t *srv, agent_fx_t *a)
{
    tsp_logclient_opts_t o;
    tsp_logclient_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = tsp_logserver_port(srv);
    o.hostname = "h";
    o.on_stop = on_stop;
    o.on_stop_ctx = a;
    o.on_dump = on_dump;
    o.on_dump_ctx = a;
    tsp_logserver_secret(srv, o.secret);
    char err[256];
    tsp_logclient_t *c = tsp_logclient_start(&o, err, sizeof err);
    ck_assert_msg(c != NULL, "%s", err);
    for (int i = 0; i < 1000; i++) {
        tsp_logclient_stats_t cs;
        tsp_logclient_stats(c, &cs);
        if (cs.connected)
            return c;
        usleep(10 * 1000);
    }
    ck_abort_msg("the client did not connect");
    return NULL;
}

static void say(tsp_logclient_t *c, int rank, const char *text)
{
    sink_put(tsp_logclient_sink(c), rank, TSP_STREAM_STDERR, text, strlen(text));
}

static int wait_dumps(agent_fx_t *a, int want, int ms)
{
    for (int i = 0; i < ms / 10 && atomic_load(&a->dumps) < want; i++)
        usleep(10 * 1000);
    return atomic_load(&a->dumps);
}

/* What an agent's dumper writes for rank r: a stack in all_reduce and its flight recorder
 * (waiting), or a stopped process that cannot answer. */
static void answer(tsp_logclient_t *c, unsigned req, int rank, int stopped)
{
    char m[256];
    if (stopped) {
        snprintf(m, sizeof m,
                 "torchspark: stack dump #%u of rank %d (host h, pid 7): state T "
                 "(stopped): cannot answer: stopped (SIGSTOP)",
                 req, rank);
        say(c, rank, m);
        return;
    }
    snprintf(m, sizeof m,
             "torchspark: stack dump #%u of rank %d (host h, pid 5): state S "
             "(sleeping)",
             req, rank);
    say(c, rank, m);
    say(c, rank, "Current thread 0x1 (most recent call first):");
    say(c, rank, "  File \"/x/torch/distributed/distributed_c10d.py\", line 9 in all_reduce");
    say(c, rank, "  File \"/w/t.py\", line 3 in <module>");
    say(c, rank, "torchspark: flight recorder: pg 0 (d): all_reduce #2: not completed (s)");
}

static char *event(tsp_logserver_t *s, int timeout_ms)
{
    static char buf[1 << 16];
    long n = tsp_logserver_hang_event(s, buf, sizeof buf, timeout_ms);
    ck_assert_int_lt(n, (long)sizeof buf);
    return n > 0 ? buf : NULL;
}

static char *field(const char *doc, const char *path)
{
    char *v = NULL;
    int t;
    ck_assert_msg(tsp_json_get(doc, strlen(doc), path, &v, &t) == 0, "%s in %s", path, doc);
    return v;
}

/* The reply of the op hang_summary (tsp_logserver_call, docs/protocol.md 1.14). */
static char *summary(tsp_logserver_t *s)
{
    size_t cap = 1 << 20, need = 0;
    char *out = malloc(cap), err[256];
    const char *req = "{\"op\": \"hang_summary\"}";
    ck_assert_int_eq(tsp_logserver_call(s, req, strlen(req), out, cap, &need, err, sizeof err), 0);
    return out;
}

static int field_is(const char *doc, const char *path, const char *want)
{
    char *v = field(doc, path);
    int same = strcmp(v, want) == 0;
    free(v);
    return same;
}

/* Silent from its start: the clock runs from the agent's authentication (not the server's
 * start, nor a first line that never comes); one DUMP; the stopped rank is named; the event
 * carries the line to print, the stacks file (0600) and the error's text; cancel STOPs. */
START_TEST(test_logwatch_silent_job_is_named_and_cancelled)
{
    tsp_logserver_t *s = watch_server(300, "cancel", 2);
    usleep(500 * 1000); /* past the timeout, but no agent yet: nothing is asked */
    ck_assert_ptr_null(event(s, 0));
    agent_fx_t a = {0};
    int64_t t0 = tsp__now_ms();
    tsp_logclient_t *c = agent(s, &a);
    ck_assert_int_eq(wait_dumps(&a, 1, 10000), 1);
    ck_assert_int_ge(atomic_load(&a.dumped_at) - t0, 250);
    unsigned req = atomic_load(&a.last);
    answer(c, req, 0, 0);
    answer(c, req, 1, 1);
    char *ev = event(s, 15000);
    ck_assert_ptr_nonnull(ev);
    char *action = field(ev, "action"), *line = field(ev, "diagnosis.line");
    char *msg = field(ev, "message"), *file = field(ev, "stacks_file");
    char *culprits = field(ev, "diagnosis.culprits"), *kind = field(ev, "diagnosis.report.kind");
    ck_assert_str_eq(action, "cancel");
    ck_assert_str_eq(culprits, "[1]");
    ck_assert_str_eq(kind, "hang");
    ck_assert_msg(strstr(line, "rank 1 (host h, pid 7) is stopped (SIGSTOP)"), "%s", line);
    ck_assert_msg(strstr(ev, "\"torchspark: hang doctor: no rank printed or reported for 0s; "
                             "rank 1 (host h"),
                  "%s", ev);
    char said[128];
    snprintf(said, sizeof said,
             "\"torchspark: every rank's stacks (hang doctor): %s/torchspark-hang-", stacks_dir);
    ck_assert_msg(strstr(ev, said), "%s", ev);
    const char *want = "was cancelled by the hang doctor: no rank printed or reported for 0.3s "
                       "(spark.torchspark.hangTimeout); rank 1 (host h";
    ck_assert_msg(!strncmp(msg, want, strlen(want)), "%s", msg);
    /* The steps' times after the DUMP (protocol 1.12 "timing"), in order; the collection
     * ends a tick (100 ms) after the tick that found every answer (nothing changed since),
     * not 500 ms: at 16,384 ranks that wait was a quarter of the doctor's time. */
    const char *steps[] = {"timing.answered_s", "timing.collected_s", "timing.diagnosed_s",
                           "timing.stacks_file_s", "timing.event_s"};
    double at[5];
    for (int i = 0; i < 5; i++) {
        char *v = field(ev, steps[i]);
        at[i] = atof(v);
        free(v);
        ck_assert_msg(at[i] >= (i ? at[i - 1] : 0.0), "%s in %s", steps[i], ev);
    }
    ck_assert_msg(at[1] - at[0] >= 0.099 && at[1] - at[0] < 0.495, "%s", ev); /* 500 ms before */
    char *dumped = field(ev, "timing.dumped_at");
    double off = atof(dumped) - (double)atomic_load(&a.dumped_at) / 1000.0;
    ck_assert_msg(off > -1.0 && off < 1.0, "%s", ev); /* the same clock as tsp__now_ms() */
    free(dumped);
    struct stat st;
    ck_assert_int_eq(stat(file, &st), 0);
    ck_assert_int_eq(st.st_mode & 077, 0);
    ck_assert_int_eq(strncmp(file, stacks_dir, strlen(stacks_dir)), 0);
    FILE *f = fopen(file, "r");
    char first[1024] = "";
    ck_assert_ptr_nonnull(fgets(first, sizeof first, f));
    fclose(f);
    ck_assert_int_eq(strncmp(first, line, strlen(line)), 0);
    unlink(file);
    for (int i = 0; i < 1000 && atomic_load(&a.stops) < 1; i++)
        usleep(10 * 1000);
    ck_assert_int_eq(atomic_load(&a.stops), 1);
    ck_assert_msg(strstr(a.stop, "the hang doctor cancelled the run: rank 1 (host h") == a.stop,
                  "%s", a.stop);
    usleep(800 * 1000); /* it cancelled: no second DUMP, no second event */
    ck_assert_int_eq(atomic_load(&a.dumps), 1);
    ck_assert_ptr_null(event(s, 0));
    /* the glues' summary at the run's end (op hang_summary): the line, the cancelling event */
    char *sum = summary(s), *sum_line = field(sum, "lines"),
         *sum_msg = field(sum, "cancel.message");
    ck_assert_str_eq(sum_msg, msg);
    ck_assert_msg(strstr(sum_line, "rank 1 (host h, pid 7) is stopped (SIGSTOP)") &&
                      field_is(sum, "cancel.action", "cancel"),
                  "%s", sum);
    free(sum), free(sum_line), free(sum_msg);
    free(action), free(line), free(msg), free(file), free(culprits), free(kind);
    tsp_logclient_close(c, 5000);
    tsp_logserver_shutdown(s, 0);
    ck_assert_int_eq(tsp_logserver_hang_event(s, NULL, 0, 0), -EPIPE);
    tsp_logserver_free(s);
}
END_TEST

/* A line restarts the clock; "report" names the hang and the run goes on (no STOP); no
 * second DUMP until a rank printed something after the first. */
START_TEST(test_logwatch_line_restarts_the_clock_and_report_goes_on)
{
    tsp_logserver_t *s = watch_server(600, "report", 1);
    agent_fx_t a = {0};
    tsp_logclient_t *c = agent(s, &a);
    usleep(300 * 1000);
    int64_t t_line = tsp__now_ms();
    say(c, 0, "step 1");
    ck_assert_int_eq(wait_dumps(&a, 1, 10000), 1);
    ck_assert_int_ge(atomic_load(&a.dumped_at) - t_line, 550);
    answer(c, atomic_load(&a.last), 0, 0);
    char *ev = event(s, 15000);
    ck_assert_ptr_nonnull(ev);
    char *action = field(ev, "action"), *file = field(ev, "stacks_file");
    ck_assert_str_eq(action, "report");
    char *no = NULL;
    int t;
    /* the error's text and document only where there is an error (protocol 1.12): the
     * stacks are in the file alone, and the event the glue reads is short */
    ck_assert_int_eq(tsp_json_get(ev, strlen(ev), "message", &no, &t), -ENOENT);
    ck_assert_int_eq(tsp_json_get(ev, strlen(ev), "diagnosis.report", &no, &t), -ENOENT);
    ck_assert_msg(!strstr(ev, "torchspark: flight recorder: "), "%s", ev);
    ck_assert_msg(!strstr(ev, "Current thread"), "%s", ev);
    char text[4096] = "";
    FILE *f = fopen(file, "r");
    ck_assert_ptr_nonnull(f);
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = 0;
    fclose(f);
    ck_assert_msg(strstr(text, "\n[rank 0] torchspark: flight recorder: ") != NULL, "%s", text);
    unlink(file);
    usleep(1500 * 1000); /* silent again, but nothing printed since the dump: no DUMP */
    ck_assert_int_eq(atomic_load(&a.dumps), 1);
    ck_assert_int_eq(atomic_load(&a.stops), 0);
    say(c, 0, "step 2"); /* it moved: the next silence is a new hang */
    ck_assert_int_eq(wait_dumps(&a, 2, 10000), 2);
    ck_assert_uint_eq(atomic_load(&a.last), 2);
    free(action), free(file);
    tsp_logclient_close(c, 5000);
    tsp_logserver_free(s);
}
END_TEST

/* Rank 0's dump of the last request: its marker, a stack in all_reduce whose last line is
 * `last` (a frame, or one the flight recorder cut). */
static void stack_answer(tsp_logclient_t *c, agent_fx_t *a, const char *last)
{
    char m[160];
    snprintf(m, sizeof m,
             "torchspark: stack dump #%u of rank 0 (host h, pid 5): state S (sleeping)",
             atomic_load(&a->last));
    say(c, 0, m);
    say(c, 0, "Current thread 0x1 (most recent call first):");
    say(c, 0, last);
}

/* A dump is complete once the rank's flight-recorder line came, even inside a stack line
 * (a cut line) after a frame: then the event follows a quiet tick; without it, only after
 * 5 s. */
START_TEST(test_logwatch_answer_is_the_recorder_line)
{
    tsp_logserver_t *s = watch_server(300, "report", 1);
    agent_fx_t a = {0};
    tsp_logclient_t *c = agent(s, &a);
    ck_assert_int_eq(wait_dumps(&a, 1, 10000), 1);
    stack_answer(c, &a,
                 "  File \"/x/torch/distributed/distributed_c10d.py\", line 9 in all_reduce");
    ck_assert_ptr_nonnull(event(s, 15000));
    ck_assert_int_ge(tsp__now_ms() - atomic_load(&a.dumped_at), 4500); /* not an answer */
    say(c, 0, "step 2");
    ck_assert_int_eq(wait_dumps(&a, 2, 10000), 2);
    stack_answer(c, &a,
                 "  File \"/x/torch/distributed/distributed_c10d.py\", litorchspark: flight "
                 "recorder: not available (x)");
    ck_assert_ptr_nonnull(event(s, 15000));
    ck_assert_int_lt(tsp__now_ms() - atomic_load(&a.dumped_at), 4500); /* an answer */
    /* The recorder's line before faulthandler's first frame (the two writers race): not an
     * answer yet, though the collection would end a tick (100 ms) after one. */
    say(c, 0, "step 3");
    ck_assert_int_eq(wait_dumps(&a, 3, 10000), 3);
    stack_answer(c, &a, "torchspark: flight recorder: not available (x)");
    ck_assert_ptr_null(event(s, 600));
    say(c, 0, "  File \"/x/torch/distributed/distributed_c10d.py\", line 9 in all_reduce");
    ck_assert_ptr_nonnull(event(s, 15000));
    ck_assert_int_lt(tsp__now_ms() - atomic_load(&a.dumped_at), 4500);
    tsp_logclient_close(c, 5000);
    tsp_logserver_free(s);
}
END_TEST

/* Rank 0 importing torch (its workers still start), its innermost frame at line `at`. */
static void importing_answer(tsp_logclient_t *c, agent_fx_t *a, int at)
{
    char m[160];
    snprintf(m, sizeof m, "torchspark: stack dump #%u of rank 0 (host h, pid 5): state R (running)",
             atomic_load(&a->last));
    say(c, 0, m);
    say(c, 0, "Current thread 0x1 (most recent call first):");
    snprintf(m, sizeof m, "  File \"/x/torch/overrides.py\", line %d in decorator", at);
    say(c, 0, m);
    say(c, 0, "  File \"<frozen importlib._bootstrap>\", line 1176 in _find_and_load");
    say(c, 0, "  File \"/job/train.py\", line 3 in <module>");
    say(c, 0, "torchspark: flight recorder: not available (torch.distributed is not initialized)");
}

/* Workers still starting (importing torch takes a minute on a loaded host) are no hang while
 * their stacks move from dump to dump: past the 3 dumps after which the old rule named them
 * (a fresh-clone run's JVM hang test: both ranks still importing at the 4th dump, named
 * together, the exception's rank and host null); once 3 dumps in a row found the stacks of
 * the one before, the stuck import is named. */
START_TEST(test_logwatch_starting_workers_are_named_once_stuck)
{
    tsp_logserver_t *s = watch_server(200, "cancel", 1);
    agent_fx_t a = {0};
    tsp_logclient_t *c = agent(s, &a);
    for (int i = 1; i <= 7; i++) {
        ck_assert_int_eq(wait_dumps(&a, i, 10000), i);
        ck_assert_ptr_null(event(s, 0)); /* the dumps before this one named nothing */
        importing_answer(c, &a, 100 + (i < 4 ? i : 4)); /* it moves, then it is stuck */
    }
    char *ev = event(s, 15000);
    ck_assert_ptr_nonnull(ev);
    char *starting = field(ev, "diagnosis.starting"), *culprits = field(ev, "diagnosis.culprits");
    char *file = field(ev, "stacks_file");
    ck_assert_str_eq(starting, "true");
    ck_assert_str_eq(culprits, "[0]");
    ck_assert_int_eq(atomic_load(&a.dumps), 7);
    unlink(file);
    free(starting), free(culprits), free(file);
    tsp_logclient_close(c, 5000);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logwatch_bad_settings_are_named)
{
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.event_fd = -1;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(tsp_logserver_watch(s, 1000, "later", 2, "/tmp", err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "the hang action is 'later': give report or cancel");
    ck_assert_int_eq(tsp_logserver_watch(s, 0, "report", 2, "/tmp", err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "timeout > 0 ms"), "%s", err);
    char *sum = summary(s); /* no event: nothing to say */
    ck_assert_str_eq(sum, "{\"lines\": [], \"cancel\": null}");
    free(sum);
    tsp_logserver_shutdown(s, 0);
    ck_assert_int_eq(tsp_logserver_watch(s, 1000, "report", 2, "/tmp", err, sizeof err), -EPIPE);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logwatch_stacks_file_read_back_for_the_glues)
{
    char path[] = "/tmp/tsp-stacks-XXXXXX"; /* the line, then the ranks' (one not UTF-8) */
    FILE *f = fdopen(mkstemp(path), "w");
    ck_assert_ptr_nonnull(f);
    fputs("the line\n[rank 0] a\n\n[rank 1] b \xff\n", f);
    fclose(f);
    char req[128], out[256], err[256];
    snprintf(req, sizeof req, "{\"op\": \"stacks\", \"file\": \"%s\"}", path);
    ck_assert_int_eq(
        tsp_logserver_call(NULL, req, strlen(req), out, sizeof out, NULL, err, sizeof err), 0);
    ck_assert_str_eq(out, "{\"lines\": [\"[rank 0] a\", \"\", \"[rank 1] b \\ufffd\"]}");
    unlink(path); /* gone: none, as the glues read a file they cannot */
    ck_assert_int_eq(
        tsp_logserver_call(NULL, req, strlen(req), out, sizeof out, NULL, err, sizeof err), 0);
    ck_assert_str_eq(out, "{\"lines\": []}");
    const char *bad = "{\"op\": \"stacks\", \"file\": 3}";
    ck_assert_int_eq(
        tsp_logserver_call(NULL, bad, strlen(bad), out, sizeof out, NULL, err, sizeof err),
        -EINVAL);
    ck_assert_msg(strstr(err, "file"), "%s", err);
}
END_TEST

static Suite *logwatch_suite(void)
{
    Suite *s = suite_create("logwatch");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, stacks_dir_make, stacks_dir_remove);
    tcase_add_test(tc, test_logwatch_silent_job_is_named_and_cancelled);
    tcase_add_test(tc, test_logwatch_line_restarts_the_clock_and_report_goes_on);
    tcase_add_test(tc, test_logwatch_answer_is_the_recorder_line);
    tcase_add_test(tc, test_logwatch_starting_workers_are_named_once_stuck);
    tcase_add_test(tc, test_logwatch_bad_settings_are_named);
    tcase_add_test(tc, test_logwatch_stacks_file_read_back_for_the_glues);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(logwatch_suite());
}
