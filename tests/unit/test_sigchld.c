/* test_sigchld.c: no worker's exit is ever lost to a thread that a library started.
 *
 * A process-directed SIGCHLD goes to any thread that does not block it; one that takes it
 * discards it, and the agent's signalfd never sees it. The CUDA driver starts such a thread
 * in cuInit (the stub libraries here start one in cuInit and nvmlInit_v2, with the caller's
 * mask, as the real driver does). On an H200 the agent counting GPUs through cuInit hung for
 * ever after its worker ended (issue 18); these tests reproduce that on CPU:
 *  - torchspark-run counting GPUs (--nproc-per-node gpu, a full-UUID mask, NVML hidden so
 *    that the count goes through cuInit) ends every one of its runs;
 *  - the same with NVML present and --gpus;
 *  - every thread of a running agent blocks SIGCHLD (deterministic: fails whenever the agent
 *    holds a GPU library thread started before its mask);
 *  - an agent whose process has a thread that does NOT block SIGCHLD (as a library loaded
 *    before main may start) still sees every exit, through the workers' pidfds.
 * TSP_TEST_RUN_BIN overrides the torchspark-run under test (to show an older build hang). */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "agent.h"

#define UUID0 "GPU-0a1b2c3d-1111-2222-3333-444455556666"
#define UUID1 "GPU-0a1b2c3d-7777-8888-9999-aaaabbbbcccc"

static const char *run_bin(void)
{
    const char *b = getenv("TSP_TEST_RUN_BIN");
    return b && *b ? b : TSP_RUN_BIN;
}

static void stub_env(int with_nvml)
{
    setenv("TORCHSPARK_LIBCUDA", TSP_STUB_CUDA, 1);
    setenv("TORCHSPARK_LIBNVML", with_nvml ? TSP_STUB_NVML : "/nonexistent/libnvidia-ml.so.1", 1);
    setenv("STUB_CUDA_DEVICES", "0000:01:00.0,0000:02:00.0", 1);
    setenv("STUB_CUDA_UUIDS", UUID0 "," UUID1, 1);
    setenv("STUB_NVML_DEVICES",
           UUID0 "@00000000:01:00.0@Stub GPU@0@0;" UUID1 "@00000000:02:00.0@Stub GPU@0@0", 1);
    unsetenv("STUB_GPU_NO_THREAD");
}

static pid_t start_agent(char *const argv[])
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        execv(run_bin(), argv);
        _exit(127);
    }
    return pid;
}

/* Waits for pid up to timeout_ms: its exit status, or -1 after SIGKILLing it (it hung). */
static int wait_bounded(pid_t pid, int timeout_ms)
{
    for (int waited = 0;; waited += 10) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (waited >= timeout_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The worker closes its streams first, so that the agent sees their end before the exit:
 * after that, only SIGCHLD (or a pidfd) can tell the agent that the worker is gone. */
static char *const closing_worker[] = {"sh", "-c", "exec >&- 2>&-; sleep 0.05", NULL};

static void runs_all_end(const char *mask, const char *gpus, int runs)
{
    char *argv[16];
    int k = 0;
    argv[k++] = (char *)run_bin();
    argv[k++] = "--standalone";
    argv[k++] = "--nproc-per-node";
    argv[k++] = "gpu";
    if (gpus) {
        argv[k++] = "--gpus";
        argv[k++] = (char *)gpus;
    }
    argv[k++] = "--no-python";
    for (int i = 0; closing_worker[i]; i++)
        argv[k++] = closing_worker[i];
    argv[k] = NULL;
    setenv("CUDA_VISIBLE_DEVICES", mask, 1);
    for (int i = 0; i < runs; i++) {
        int st = wait_bounded(start_agent(argv), 10000);
        ck_assert_msg(st != -1,
                      "run %d of %d: torchspark-run (CUDA_VISIBLE_DEVICES=%s%s%s) did not end "
                      "within 10 s after its worker exited: the worker's SIGCHLD was lost",
                      i + 1, runs, mask, gpus ? ", --gpus " : "", gpus ? gpus : "");
        ck_assert_int_eq(st, 0);
    }
}

START_TEST(test_full_uuid_count_through_cuinit_ends)
{
    stub_env(0); /* NVML hidden: the count goes through cuInit and its thread */
    runs_all_end(UUID0, NULL, 20);
}
END_TEST

START_TEST(test_count_and_assign_with_nvml_end)
{
    stub_env(1);
    runs_all_end(UUID0 "," UUID1, NULL, 10);
    runs_all_end("0,1", "0,1", 10);
}
END_TEST

/* The SigBlk line of /proc/PID/task/TID/status has SIGCHLD's bit. */
static int blocks_sigchld(const char *status_path)
{
    FILE *f = fopen(status_path, "r");
    if (!f)
        return -1; /* the thread is gone */
    char line[256];
    unsigned long long mask = 0;
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "SigBlk: %llx", &mask) == 1) {
            found = 1;
            break;
        }
    fclose(f);
    return found ? (int)((mask >> (SIGCHLD - 1)) & 1) : -1;
}

START_TEST(test_every_agent_thread_blocks_sigchld)
{
    stub_env(0);
    setenv("CUDA_VISIBLE_DEVICES", UUID0, 1);
    char *argv[] = {(char *)run_bin(),
                    "--standalone",
                    "--nproc-per-node",
                    "gpu",
                    "--no-python",
                    "sleep",
                    "1",
                    NULL};
    pid_t pid = start_agent(argv);
    /* Once the worker runs, the GPU count is over: look at every thread of the agent. */
    char path[128];
    int seen_worker = 0;
    for (int i = 0; i < 400 && !seen_worker; i++) {
        snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
        FILE *f = fopen(path, "r");
        int c = 0;
        if (f) {
            c = fgetc(f);
            fclose(f);
        }
        seen_worker = c != EOF && c != 0;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(seen_worker, "the agent started no worker");
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    ck_assert_ptr_nonnull(d);
    int threads = 0, unblocked = 0;
    char names[512] = "";
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char sp[300], cp[300], comm[64] = "?";
        snprintf(sp, sizeof sp, "/proc/%d/task/%s/status", (int)pid, e->d_name);
        snprintf(cp, sizeof cp, "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        int b = blocks_sigchld(sp);
        if (b < 0)
            continue;
        threads++;
        if (!b) {
            FILE *c = fopen(cp, "r");
            if (c) {
                if (fgets(comm, sizeof comm, c))
                    comm[strcspn(comm, "\n")] = 0;
                fclose(c);
            }
            unblocked++;
            strncat(names, comm, sizeof names - strlen(names) - 2);
            strcat(names, " ");
        }
    }
    closedir(d);
    int st = wait_bounded(pid, 10000);
    ck_assert_msg(unblocked == 0,
                  "%d of the agent's %d threads do not block SIGCHLD (%s): a worker's exit can "
                  "be delivered there and lost",
                  unblocked, threads, names);
    ck_assert_int_eq(st, 0);
}
END_TEST

/* The GPU libraries are loaded in a short-lived child, never in the agent: its memory stays
 * that of an agent without GPUs (VmHWM at most 8 MiB, docs/gpu.md), in every GPU mode. */
START_TEST(test_agent_never_maps_a_gpu_library)
{
    const char *modes[][2] = {
        {TSP_STUB_NVML, NULL}, {"/nonexistent/libnvidia-ml.so.1", NULL}, {TSP_STUB_NVML, "0"}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        stub_env(1);
        setenv("TORCHSPARK_LIBNVML", modes[m][0], 1);
        setenv("CUDA_VISIBLE_DEVICES", UUID0, 1);
        char *argv[] = {(char *)run_bin(),
                        "--standalone",
                        "--nproc-per-node",
                        "gpu",
                        "--no-python",
                        "sleep",
                        "0.6",
                        NULL,
                        NULL,
                        NULL};
        if (modes[m][1]) {
            memmove(argv + 6, argv + 4, 3 * sizeof *argv);
            argv[4] = "--gpus";
            argv[5] = (char *)modes[m][1];
        }
        pid_t pid = start_agent(argv);
        usleep(400 * 1000); /* the worker sleeps: the probe is over */
        char path[64], line[512];
        snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
        FILE *f = fopen(path, "r");
        ck_assert_ptr_nonnull(f);
        int gpu_lib = 0;
        while (fgets(line, sizeof line, f))
            gpu_lib |= strstr(line, "cuda_stub") || strstr(line, "nvml_stub");
        fclose(f);
        snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
        f = fopen(path, "r");
        ck_assert_ptr_nonnull(f);
        long hwm = -1;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %ld", &hwm) == 1)
                break;
        fclose(f);
        ck_assert_int_eq(wait_bounded(pid, 10000), 0);
        ck_assert_msg(!gpu_lib, "mode %zu: the agent itself maps a GPU library", m);
        ck_assert_msg(hwm > 0 && hwm <= 8 * 1024, "mode %zu: the agent's VmHWM is %ld KiB", m, hwm);
    }
}
END_TEST

static void *stray_thread(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

START_TEST(test_pidfd_sees_exit_taken_by_stray_thread)
{
    /* A thread started before the agent blocked its signals: it does not block SIGCHLD. */
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, stray_thread, NULL), 0);
    pthread_detach(t);
    ck_assert_int_eq(tsp_agent_setup_process(0, 0), 0);
    for (int run = 0; run < 20; run++) {
        tsp_agent_opts_t o = {.console_out = 1, .console_err = 2, .log_fd = 2};
        tsp_topo_init(&o.topo);
        o.topo.nproc_per_node = 2;
        o.file = "sh";
        o.argv = closing_worker;
        o.name = "worker";
        o.shutdown_timeout = 5;
        tsp_agent_t *a;
        char err[256];
        ck_assert_int_eq(tsp_agent_init(&a, &o, err, sizeof err), 0);
        alarm(10); /* a lost exit hangs the run: SIGALRM (default action) fails the test */
        ck_assert_int_eq(tsp_agent_run(a), 0);
        alarm(0);
        tsp_agent_close(a);
    }
}
END_TEST

static Suite *sigchld_suite(void)
{
    Suite *s = suite_create("sigchld");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_full_uuid_count_through_cuinit_ends);
    tcase_add_test(tc, test_count_and_assign_with_nvml_end);
    tcase_add_test(tc, test_every_agent_thread_blocks_sigchld);
    tcase_add_test(tc, test_agent_never_maps_a_gpu_library);
    tcase_add_test(tc, test_pidfd_sees_exit_taken_by_stray_thread);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(sigchld_suite());
}
