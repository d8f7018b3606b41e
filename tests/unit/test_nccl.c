/* test_nccl.c: the NCCL preflight (torchspark-run --nccl-check) on the stub CUDA driver and
 * the stub NCCL: success, a failing rank, two ranks on one GPU, a missing rank, a hung
 * all_reduce, a CUDA step failing, the toolkit's stub libcuda, no libnccl, NCCL < 2.14 and
 * the hard kill. Every scenario runs the real agent binary and asserts its exit status,
 * the whole message, the deadline (deadline + <= 0.5 s), that the training program never
 * ran after a failure, and that no process is left. */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "testutil.h"
#include "torchspark/logserver.h"

#define BUSES "0000:3b:00.0,0000:5e:00.0"

static char mark[64], marker_file[256], out_file[256], host[256];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    bind(fd, (struct sockaddr *)&sa, sizeof sa);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    return ntohs(sa.sin_port);
}

/* Processes (not this one, not zombies) whose environment carries this test's mark. */
static int quiet;

/* Marked processes; with only_checks, those whose command line is a check process. */
static int marked_count(int only_checks)
{
    char needle[128];
    int n = 0, len = snprintf(needle, sizeof needle, "TSP_NCCL_TEST_MARK=%s", mark);
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == (int)getpid() || tsp_test_gone(pid, 0))
            continue;
        char path[64], env[65536];
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        FILE *f = fopen(path, "r");
        size_t got = f ? fread(env, 1, sizeof env, f) : 0;
        if (f)
            fclose(f);
        if (only_checks) {
            char cmd[512] = "";
            snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
            f = fopen(path, "r");
            size_t c = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
            if (f)
                fclose(f);
            int is_check = 0;
            for (size_t i = 0; i < c; i += strlen(cmd + i) + 1)
                is_check |= strcmp(cmd + i, "--nccl-check-worker") == 0;
            if (!is_check)
                continue;
        }
        for (size_t i = 0; i + (size_t)len <= got; i += strlen(env + i) + 1)
            if (strncmp(env + i, needle, (size_t)len) == 0 && env[i + (size_t)len] == 0) {
                if (!quiet)
                    fprintf(stderr, "left running: pid %d\n", pid);
                n++;
                break;
            }
    }
    if (d)
        closedir(d);
    return n;
}

/* What is left running. The agent's sentinel outlives the agent by a few milliseconds (it
 * sees the agent's end, stops the process group, then exits): what is still there after 1 s
 * is left behind. */
static int marked_processes(void)
{
    int loud = !quiet;
    quiet = 1;
    for (int i = 0; i < 50 && marked_count(0) > 0; i++)
        usleep(20000);
    quiet = !loud;
    return marked_count(0);
}

static void setup(void)
{
    snprintf(mark, sizeof mark, "%d-%ld", (int)getpid(), (long)time(NULL));
    snprintf(marker_file, sizeof marker_file, "/tmp/tsp-nccl-test-%s.ran", mark);
    snprintf(out_file, sizeof out_file, "/tmp/tsp-nccl-test-%s.out", mark);
    gethostname(host, sizeof host - 1);
    setenv("TSP_NCCL_TEST_MARK", mark, 1);
    setenv("TORCHSPARK_LIBCUDA", TSP_STUB_CUDA, 1);
    setenv("TORCHSPARK_LIBNVML", "/nonexistent/libnvml.so", 1);
    setenv("STUB_CUDA_DEVICES", BUSES, 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("NCCL_DEBUG");
    unsetenv("NCCL_SOCKET_IFNAME");
    unsetenv("TORCHSPARK_NCCL_CHECK");
    unlink(marker_file);
}

static void teardown(void)
{
    unlink(marker_file);
    unlink(out_file);
}

static char output[65536];

/* Runs torchspark-run with extra arguments before the program, which records that it ran
 * and whether NCCL_COMM_ID leaked into its environment. Returns the exit status. */
static int run_agent(double *wall, const char *const *extra)
{
    char prog[600];
    snprintf(prog, sizeof prog, "echo ran ${NCCL_COMM_ID:-no-comm-id} >> %s", marker_file);
    const char *argv[40];
    int k = 0;
    argv[k++] = TSP_RUN_BIN;
    for (; extra && *extra; extra++)
        argv[k++] = *extra;
    argv[k++] = "--no-python";
    argv[k++] = "sh";
    argv[k++] = "-c";
    argv[k++] = prog;
    argv[k] = NULL;
    double t = now();
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(out_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(TSP_RUN_BIN, (char **)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    *wall = now() - t;
    FILE *f = fopen(out_file, "r");
    size_t n = f ? fread(output, 1, sizeof output - 1, f) : 0;
    output[n] = 0;
    if (f)
        fclose(f);
    fprintf(stderr, "---- agent output (%.3f s, status %d):\n%s", *wall, WEXITSTATUS(st), output);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* What starting the agent and one check process costs here (more under the sanitizers):
 * a check that fails at once, on a missing library. */
static double overhead(void)
{
    double wall;
    const char *args[] = {"--standalone", "--nproc-per-node",          "1", "--nccl-check=10",
                          "--nccl-lib",   "/nonexistent/libnccl.so.2", NULL};
    run_agent(&wall, args);
    return wall;
}

static int ran(void)
{
    return access(marker_file, F_OK) == 0;
}

/* The line of output that begins with prefix (the agent's message), or "". */
static const char *line_with(const char *prefix)
{
    static char line[8192];
    const char *p = strstr(output, prefix);
    line[0] = 0;
    if (p) {
        const char *e = strchr(p, '\n');
        snprintf(line, sizeof line, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
    }
    return line;
}

START_TEST(test_success_then_training)
{
    double wall;
    const char *args[] = {"--standalone",    "--nproc-per-node",   "2",
                          "--nccl-check=10", "--nccl-check-bytes", "65536",
                          "--nccl-lib",      TSP_STUB_NCCL,        NULL};
    ck_assert_int_eq(run_agent(&wall, args), 0);
    const char *l = line_with("torchspark: NCCL check passed in ");
    ck_assert_msg(*l, "no success line");
    char want[1024];
    snprintf(want, sizeof want,
             " s on %s: ranks 0-1 of 2, NCCL 2.30.7 (%s), interface (NCCL's choice); all_reduce "
             "0.0625 MiB float32: ",
             host, TSP_STUB_NCCL);
    ck_assert_msg(strstr(l, want), "%s", l);
    ck_assert_ptr_nonnull(strstr(l, " GB/s, busbw "));
    /* the non-blocking finalize is waited for before the destroy (an H200 showed the WARN) */
    ck_assert_ptr_null(strstr(output, "Attempt to use communicator"));
    ck_assert(ran());
    /* NCCL_COMM_ID is for the check workers only: torch's communicators would use it. */
    FILE *f = fopen(marker_file, "r");
    char got[256] = "";
    ck_assert_ptr_nonnull(fgets(got, sizeof got, f));
    fclose(f);
    ck_assert_str_eq(got, "ran no-comm-id\n");
    ck_assert_int_eq(marked_processes(), 0);
}
END_TEST

START_TEST(test_world_size_one_has_no_busbw)
{
    double wall;
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    const char *args[] = {"--standalone", "--nproc-per-node",   "1",
                          "--nccl-check", "--nccl-check-bytes", "4096",
                          "--nccl-lib",   TSP_STUB_NCCL,        NULL};
    ck_assert_int_eq(run_agent(&wall, args), 0);
    const char *l = line_with("torchspark: NCCL check passed in ");
    ck_assert_msg(strstr(l, "ranks 0-0 of 1, NCCL 2.30.7"), "%s", l);
    ck_assert_msg(strstr(l, "interface lo; all_reduce 0.00390625 MiB float32: "), "%s", l);
    ck_assert_msg(strstr(l, ", busbw n/a (1 rank)"), "%s", l);
    ck_assert(ran());
}
END_TEST

START_TEST(test_env_switch_and_old_nccl_fall_back_to_blocking_init)
{
    double wall;
    setenv("TORCHSPARK_NCCL_CHECK", "1", 1);
    const char *args[] = {"--standalone", "--nproc-per-node", "2", "--nccl-check-bytes", "4096",
                          "--nccl-lib",   TSP_STUB_NCCL_OLD,  NULL};
    ck_assert_int_eq(run_agent(&wall, args), 0);
    ck_assert_msg(*line_with("torchspark: NCCL check passed in "), "no success line");
    ck_assert_ptr_nonnull(strstr(output, "NCCL 2.13.0 ("));
    ck_assert(ran());
}
END_TEST

START_TEST(test_failing_rank_is_the_root_cause_at_once)
{
    double wall;
    setenv("STUB_NCCL_INIT_FAIL", "1:2:NET/Socket : No usable listening interface found", 1);
    setenv("NCCL_SOCKET_IFNAME", "eth9", 1);
    char ef[300];
    snprintf(ef, sizeof ef, "%s.json", out_file);
    const char *args[] = {"--standalone",
                          "--nproc-per-node",
                          "2",
                          "--nccl-check=20",
                          "--nccl-check-bytes",
                          "4096",
                          "--nccl-lib",
                          TSP_STUB_NCCL,
                          "--error-file",
                          ef,
                          NULL};
    ck_assert_int_eq(run_agent(&wall, args), 1);
    char want[2048];
    snprintf(want, sizeof want,
             "torchspark: NCCL check failed before training: rank 1 (host %s, local rank 1, GPU "
             "0000:5e:00.0) could not join the communicator of 2 ranks: ncclCommInitRankConfig "
             "returned 'unhandled system error (run with NCCL_DEBUG=INFO for details)'; NCCL said: "
             "NET/Socket : No usable listening interface found. NCCL found no usable interface on "
             "%s: NCCL_SOCKET_IFNAME=eth9 there; the nodes must share a subnet with localhost for "
             "the check.",
             host, host);
    ck_assert_str_eq(line_with("torchspark: NCCL check failed"), want);
    /* NCCL's WARN line, prefixed: NCCL_DEBUG=WARN was set because it was unset. */
    ck_assert_ptr_nonnull(strstr(output, "[nccl-check rank 1]: "));
    ck_assert_ptr_nonnull(strstr(output, "NCCL WARN NET/Socket : No usable listening interface"));
    ck_assert_msg(wall < 2.0, "rank 0 waited for its deadline: %.3f s", wall); /* not 20 s */
    ck_assert(!ran());
    /* The error file carries the message for the driver's report. */
    FILE *f = fopen(ef, "r");
    ck_assert_ptr_nonnull(f);
    char doc[4096] = "";
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = 0;
    fclose(f);
    unlink(ef);
    ck_assert_ptr_nonnull(strstr(doc, "\"message\": \"torchspark: NCCL check failed before"));
    ck_assert_ptr_nonnull(strstr(doc, "\"rank\": 1, \"local_rank\": 1"));
    /* A structured reason, so that the driver's advice names the check, not the training
     * code (docs/protocol.md section 8). */
    ck_assert_msg(strstr(doc, "\"reason\": \"nccl_check\""), "%s", doc);
    ck_assert_msg(strstr(doc, "\"summary\": \"the NCCL check of rank 1 (node 0, local rank 1) on "
                              "host "),
                  "%s", doc);
    ck_assert_int_eq(marked_processes(), 0);
}
END_TEST

START_TEST(test_user_nccl_debug_is_kept)
{
    double wall;
    setenv("STUB_NCCL_INIT_FAIL", "0:2:boom", 1);
    setenv("NCCL_DEBUG", "VERSION", 1);
    const char *args[] = {"--standalone", "--nproc-per-node", "1", "--nccl-check=5",
                          "--nccl-lib",   TSP_STUB_NCCL,      NULL};
    ck_assert_int_eq(run_agent(&wall, args), 1);
    ck_assert_ptr_null(strstr(output, "NCCL WARN")); /* the stub prints WARN only for WARN/INFO */
    ck_assert_ptr_nonnull(strstr(output, "NCCL said: boom."));
}
END_TEST

START_TEST(test_two_ranks_on_one_gpu)
{
    double wall;
    setenv("CUDA_VISIBLE_DEVICES", "0,0", 1);
    const char *args[] = {"--standalone",    "--nproc-per-node",   "2",
                          "--nccl-check=20", "--nccl-check-bytes", "4096",
                          "--nccl-lib",      TSP_STUB_NCCL,        NULL};
    ck_assert_int_eq(run_agent(&wall, args), 1);
    /* Both ranks fail alike; whichever reports first is the root cause. */
    char want[2][2048];
    for (int r = 0; r < 2; r++)
        snprintf(want[r], sizeof want[r],
                 "torchspark: NCCL check failed before training: rank %d (host %s, local rank %d, "
                 "GPU 0000:3b:00.0) could not join the communicator of 2 ranks: "
                 "ncclCommInitRankConfig returned 'invalid usage (run with NCCL_DEBUG=WARN for "
                 "details)'; NCCL said: Duplicate GPU detected : rank 1 and rank 0 both on CUDA "
                 "device 0000:3b:00.0. Two ranks were given one GPU: check "
                 "spark.task.resource.gpu.amount and CUDA_VISIBLE_DEVICES on %s.",
                 r, host, r, host);
    const char *got = line_with("torchspark: NCCL check failed");
    ck_assert_msg(strcmp(got, want[0]) == 0 || strcmp(got, want[1]) == 0, "%s", got);
    ck_assert(wall < 2.0);
    ck_assert(!ran());
    ck_assert_int_eq(marked_processes(), 0);
}
END_TEST

/* Node 0 of two: node 1 never starts, so ranks 2-3 never join; ranks 0-1 end at the
 * deadline (non-blocking init, then ncclCommAbort). */
START_TEST(test_missing_rank_ends_at_the_deadline)
{
    double wall;
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    const char *args[] = {"--nnodes",
                          "2",
                          "--node-rank",
                          "0",
                          "--nproc-per-node",
                          "2",
                          "--master-addr",
                          "127.0.0.1",
                          "--master-port",
                          port,
                          "--nccl-check=2",
                          "--nccl-check-bytes",
                          "4096",
                          "--nccl-lib",
                          TSP_STUB_NCCL,
                          NULL};
    double base = overhead();
    ck_assert_int_eq(run_agent(&wall, args), 1);
    char want[1024];
    snprintf(want, sizeof want,
             "torchspark: NCCL check timed out after 2 s before training: rank(s) 0,1 on %s were "
             "still initializing the communicator. Rerun with NCCL_DEBUG=INFO "
             "NCCL_DEBUG_SUBSYS=INIT,NET to see the interfaces NCCL chose.",
             host);
    ck_assert_str_eq(line_with("torchspark: NCCL check timed out"), want);
    ck_assert_msg(wall >= 2.0 && wall <= 2.5 + base,
                  "deadline 2 s, ended after %.3f s (start %.3f s)", wall, base);
    ck_assert(!ran());
    ck_assert_int_eq(marked_processes(), 0);
}
END_TEST

/* Job-wide: node 0 of two runs its check against the driver's log server (here, in this
 * process); node 1's agent never starts. Node 0 ends at its deadline and the driver's root
 * cause names node 1 as the one that never reported. */
START_TEST(test_missing_node_is_named_by_the_driver)
{
    tsp_logserver_opts_t so;
    tsp_logserver_opts_init(&so);
    so.host = "127.0.0.1";
    so.event_fd = -1;
    char err[512], endpoint[64], port[16], secret_hex[65];
    tsp_logserver_t *s = tsp_logserver_start(&so, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    uint8_t secret[32];
    tsp_logserver_secret(s, secret);
    for (int i = 0; i < 32; i++)
        snprintf(secret_hex + 2 * i, 3, "%02x", secret[i]);
    setenv("TORCHSPARK_LOG_SECRET", secret_hex, 1);
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", tsp_logserver_port(s));
    snprintf(port, sizeof port, "%d", free_port());
    const char *args[] = {"--nnodes",         "2",           "--node-rank",     "0",
                          "--nproc-per-node", "1",           "--master-addr",   "127.0.0.1",
                          "--master-port",    port,          "--nccl-check=2",  "--nccl-check-bytes",
                          "4096",             "--nccl-lib",  TSP_STUB_NCCL,     "--log-endpoint",
                          endpoint,           NULL};
    double wall, base = overhead();
    ck_assert_int_eq(run_agent(&wall, args), 1);
    unsetenv("TORCHSPARK_LOG_SECRET");
    ck_assert_msg(wall >= 2.0 && wall <= 2.5 + base, "deadline 2 s, ended after %.3f s", wall);
    char buf[16384], *detail = NULL;
    int type = 0;
    ck_assert_int_gt(tsp_logserver_failure(s, buf, sizeof buf, 5000), 0);
    ck_assert_int_eq(tsp_json_get(buf, strlen(buf), "detail", &detail, &type), 0);
    ck_assert_str_eq(detail, "NCCL check across the job: node 1 (no agent connected from it) "
                             "never reported: its check never started, so its ranks never "
                             "joined and the other nodes waited until the deadline; see that "
                             "node's executor's log");
    free(detail);
    ck_assert_msg(strstr(buf, "NCCL check timed out after 2 s before training: rank(s) 0 on "),
                  "%s", buf);
    ck_assert(!ran());
    ck_assert_int_eq(marked_processes(), 0);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_hung_all_reduce_ends_at_the_deadline)
{
    double wall;
    setenv("STUB_NCCL_ALLREDUCE_HANG", "1", 1);
    const char *args[] = {"--standalone",   "--nproc-per-node",   "2",
                          "--nccl-check=2", "--nccl-check-bytes", "4096",
                          "--nccl-lib",     TSP_STUB_NCCL,        NULL};
    double base = overhead();
    ck_assert_int_eq(run_agent(&wall, args), 1);
    char want[1024];
    snprintf(want, sizeof want,
             "torchspark: NCCL check timed out after 2 s before training: rank(s) 0,1 on %s were "
             "still in all_reduce. Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see "
             "the interfaces NCCL chose.",
             host);
    ck_assert_str_eq(line_with("torchspark: NCCL check timed out"), want);
    ck_assert_msg(wall >= 2.0 && wall <= 2.5 + base,
                  "deadline 2 s, ended after %.3f s (start %.3f s)", wall, base);
    ck_assert(!ran());
    ck_assert_int_eq(marked_processes(), 0);
}
END_TEST

/* Blocking init (NCCL < 2.14) cannot be timed out from inside: the agent kills the check
 * workers at deadline + 5 s and names them as never reporting. */
START_TEST(test_blocking_init_is_killed_by_the_agent)
{
    double wall;
    char port[16];
    snprintf(port, sizeof port, "%d", free_port());
    const char *args[] = {"--nnodes",         "2",  "--node-rank",    "0",
                          "--nproc-per-node", "1",  "--master-addr",  "127.0.0.1",
                          "--master-port",    port, "--nccl-check=1", "--nccl-lib",
                          TSP_STUB_NCCL_OLD,  NULL};
    ck_assert_int_eq(run_agent(&wall, args), 1);
    char want[1024];
    snprintf(want, sizeof want,
             "torchspark: NCCL check timed out after 1 s before training: rank(s) 0 on %s never "
             "reported. Rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see the "
             "interfaces NCCL chose.",
             host);
    ck_assert_str_eq(line_with("torchspark: NCCL check timed out"), want);
    ck_assert_msg(wall >= 6.0 && wall <= 6.5 + overhead(), "kill at 1 + 5 s, ended after %.3f s",
                  wall);
    ck_assert(!ran());
    ck_assert_int_eq(marked_processes(), 0);
}
END_TEST

/* The agent killed (SIGKILL) or stopped (SIGTERM) while its check processes wait for a
 * missing rank: nothing is left, training never starts. A SIGTERM (the task kill path) ends
 * the check at once, not at its 30 s deadline, and the agent with the signal's status. */
START_TEST(test_agent_killed_during_the_check)
{
    char port[16], prog[600];
    snprintf(port, sizeof port, "%d", free_port());
    snprintf(prog, sizeof prog, "echo ran >> %s", marker_file);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(TSP_RUN_BIN, TSP_RUN_BIN, "--nnodes", "2", "--node-rank", "0", "--nproc-per-node",
              "2", "--master-addr", "127.0.0.1", "--master-port", port, "--nccl-check=30",
              "--nccl-lib", TSP_STUB_NCCL, "--no-python", "sh", "-c", prog, (char *)NULL);
        _exit(127);
    }
    double t = now();
    quiet = 1;
    while (marked_count(1) < 2 && now() - t < 10) /* both check processes are up */
        usleep(20000);
    ck_assert_int_eq(marked_count(1), 2);
    t = now();
    kill(pid, _i == 0 ? SIGKILL : SIGTERM);
    int st;
    waitpid(pid, &st, 0);
    double ended = now() - t;
    ck_assert_msg(ended < 1.0 + overhead(), "the agent ended %.3f s after the signal", ended);
    if (_i == 1)
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM, "status %#x", st);
    t = now();
    while (marked_processes() > 0 && now() - t < 5)
        usleep(20000);
    quiet = 0;
    ck_assert_int_eq(marked_processes(), 0);
    ck_assert(!ran());
}
END_TEST

START_TEST(test_more_workers_than_visible_gpus)
{
    double wall;
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    const char *args[] = {"--standalone", "--nproc-per-node", "2", "--nccl-check=10",
                          "--nccl-lib",   TSP_STUB_NCCL,      NULL};
    ck_assert_int_eq(run_agent(&wall, args), 1);
    char want[1024];
    snprintf(want, sizeof want,
             "torchspark: NCCL check failed before training: rank 1 (host %s) could not open GPU 1 "
             "of CUDA_VISIBLE_DEVICES='0': cuDeviceGet returned CUDA_ERROR_INVALID_DEVICE",
             host);
    ck_assert_str_eq(line_with("torchspark: NCCL check failed"), want);
    ck_assert(wall < 2.0);
    ck_assert(!ran());
}
END_TEST

START_TEST(test_toolkit_stub_libcuda)
{
    const char *lib = _i == 0 ? TSP_STUB_CUDA : TSP_TOOLKIT_STUB_CUDA;
    if (!*lib)
        return; /* no CUDA toolkit here: our stub's row covers the message */
    double wall;
    setenv("TORCHSPARK_LIBCUDA", lib, 1);
    setenv("STUB_CUDA_INIT_RC", "34", 1);
    const char *args[] = {"--standalone", "--nproc-per-node", "1", "--nccl-check=10",
                          "--nccl-lib",   TSP_STUB_NCCL,      NULL};
    ck_assert_int_eq(run_agent(&wall, args), 1);
    char want[1024];
    snprintf(want, sizeof want,
             "torchspark: %s is the CUDA toolkit's stub libcuda (CUDA_ERROR_STUB_LIBRARY, 34), not "
             "the NVIDIA driver: remove the stubs directory from LD_LIBRARY_PATH on host %s",
             lib, host);
    ck_assert_str_eq(line_with("torchspark: /"), want);
    ck_assert(!ran());
}
END_TEST

/* A host without any NVIDIA driver (a discovery script's GPUs on a CPU machine): the check
 * is skipped with one warning that names the missing library, and training starts, as it
 * does with stock PySpark. */
START_TEST(test_no_driver_skips_the_check_with_one_warning)
{
    double wall;
    setenv("TORCHSPARK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    const char *args[] = {"--standalone", "--nproc-per-node", "2", "--nccl-check=20",
                          "--nccl-lib",   TSP_STUB_NCCL,      NULL};
    ck_assert_int_eq(run_agent(&wall, args), 0);
    char want[1024];
    snprintf(want, sizeof want,
             "torchspark: WARNING: NCCL check skipped on host %s: no NVIDIA driver there "
             "(/nonexistent/libcuda.so.1: cannot open shared object file: No such file or "
             "directory); training starts without the check. Install the NVIDIA driver on the "
             "GPU executors' hosts, or set spark.torchspark.ncclCheck=false to run without the "
             "check and this warning",
             host);
    ck_assert_str_eq(line_with("torchspark: WARNING: NCCL check"), want);
    const char *first = strstr(output, "NCCL check skipped");
    ck_assert_ptr_null(strstr(first + 1, "NCCL check skipped")); /* one warning, not one a rank */
    ck_assert_ptr_null(strstr(output, "NCCL check failed"));
    ck_assert(ran());
    ck_assert_int_eq(marked_processes(), 0);
}
END_TEST

START_TEST(test_missing_libnccl)
{
    double wall;
    const char *args[] = {"--standalone", "--nproc-per-node",          "1", "--nccl-check=10",
                          "--nccl-lib",   "/nonexistent/libnccl.so.2", NULL};
    ck_assert_int_eq(run_agent(&wall, args), 1);
    ck_assert_str_eq(line_with("torchspark: --nccl-check"),
                     "torchspark: --nccl-check needs libnccl.so.2 2.14 or newer: "
                     "/nonexistent/libnccl.so.2: cannot open shared object file: No such file or "
                     "directory (tried /nonexistent/libnccl.so.2)");
    ck_assert(!ran());
}
END_TEST

START_TEST(test_bad_options)
{
    double wall;
    const char *a1[] = {"--standalone", "--nccl-check=soon", NULL};
    ck_assert_int_eq(run_agent(&wall, a1), 2);
    ck_assert_ptr_nonnull(strstr(output, "--nccl-check=SECONDS needs a number of seconds > 0, "
                                         "not 'soon'"));
    const char *a2[] = {"--standalone", "--nccl-check", "--nccl-check-bytes", "2", NULL};
    ck_assert_int_eq(run_agent(&wall, a2), 2);
    ck_assert_ptr_nonnull(strstr(output, "--nccl-check-bytes must be a number of bytes >= 4"));
    ck_assert(!ran());
}
END_TEST

static Suite *nccl_suite(void)
{
    Suite *s = suite_create("nccl");
    TCase *tc = tcase_create("preflight");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_success_then_training);
    tcase_add_test(tc, test_missing_node_is_named_by_the_driver);
    tcase_add_test(tc, test_world_size_one_has_no_busbw);
    tcase_add_test(tc, test_env_switch_and_old_nccl_fall_back_to_blocking_init);
    tcase_add_test(tc, test_failing_rank_is_the_root_cause_at_once);
    tcase_add_test(tc, test_user_nccl_debug_is_kept);
    tcase_add_test(tc, test_two_ranks_on_one_gpu);
    tcase_add_test(tc, test_missing_rank_ends_at_the_deadline);
    tcase_add_test(tc, test_hung_all_reduce_ends_at_the_deadline);
    tcase_add_test(tc, test_blocking_init_is_killed_by_the_agent);
    tcase_add_loop_test(tc, test_agent_killed_during_the_check, 0, 2);
    tcase_add_test(tc, test_more_workers_than_visible_gpus);
    tcase_add_loop_test(tc, test_toolkit_stub_libcuda, 0, 2);
    tcase_add_test(tc, test_missing_libnccl);
    tcase_add_test(tc, test_no_driver_skips_the_check_with_one_warning);
    tcase_add_test(tc, test_bad_options);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(nccl_suite());
}
