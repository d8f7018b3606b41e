/* test_warm.c: the warm pool's codecs, and the real shim (torchspark-run --warm-exec) driven
 * by a fake pool written here: a forked process that listens in a 0700 directory, receives
 * the request and the three descriptors, checks cwd/argv/env, forks the requested command
 * with those descriptors, and answers as docs/protocol.md section 6 says. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "agent.h"
#include "proc.h"
#include "warm.h"

/* ---- codecs ------------------------------------------------------------------------ */

START_TEST(test_warm_header_round_trip_and_refusals)
{
    unsigned char h[TSP_WARM_HEADER_LEN];
    uint32_t len = 0;
    tsp_warm_header_pack(h, 1234567);
    ck_assert_int_eq(memcmp(h, "TSPW\0\0\0\1\0\x12\xd6\x87\0\0\0\3", 16), 0);
    ck_assert_int_eq(tsp_warm_header_unpack(h, &len), 0);
    ck_assert_uint_eq(len, 1234567);
    tsp_warm_header_pack(h, TSP_WARM_MAX_PAYLOAD + 1);
    ck_assert_int_eq(tsp_warm_header_unpack(h, &len), -EMSGSIZE);
    tsp_warm_header_pack(h, 10);
    h[15] = 2;
    ck_assert_int_eq(tsp_warm_header_unpack(h, &len), -EBADMSG);
    tsp_warm_header_pack(h, 10);
    h[7] = 2;
    ck_assert_int_eq(tsp_warm_header_unpack(h, &len), -EPROTONOSUPPORT);
    tsp_warm_header_pack(h, 10);
    h[0] = 'X';
    ck_assert_int_eq(tsp_warm_header_unpack(h, &len), -EPROTO);
}
END_TEST

START_TEST(test_warm_payload_round_trip_and_malformed)
{
    char *argv[] = {"/usr/bin/python3", "-u", "", "x y", NULL};
    char *envp[] = {"A=1", "EMPTY=", "B==2", NULL};
    char *buf;
    size_t len;
    ck_assert_int_eq(tsp_warm_payload_pack("/work dir", argv, envp, &buf, &len), 0);
    static const char want[] = "/work dir\0004\0/usr/bin/python3\0-u\0\0x y\0A=1\0EMPTY=\0B==2";
    ck_assert_uint_eq(len, sizeof want);
    ck_assert_int_eq(memcmp(buf, want, len), 0);
    tsp_warm_request_t r;
    ck_assert_int_eq(tsp_warm_payload_unpack(buf, len, &r), 0);
    ck_assert_str_eq(r.cwd, "/work dir");
    ck_assert_int_eq(r.argc, 4);
    for (int i = 0; i < 4; i++)
        ck_assert_str_eq(r.argv[i], argv[i]);
    ck_assert_ptr_null(r.argv[4]);
    for (int i = 0; i < 3; i++)
        ck_assert_str_eq(r.envp[i], envp[i]);
    ck_assert_ptr_null(r.envp[3]);
    tsp_warm_request_free(&r);
    free(buf);
    /* no environment at all */
    ck_assert_int_eq(tsp_warm_payload_pack("/", argv, NULL, &buf, &len), 0);
    ck_assert_int_eq(tsp_warm_payload_unpack(buf, len, &r), 0);
    ck_assert_ptr_null(r.envp[0]);
    tsp_warm_request_free(&r);
    free(buf);
    /* refused on the way out */
    char *bad_env[] = {"NOEQUALS", NULL}, *lead_eq[] = {"=x", NULL}, *no_argv[] = {NULL};
    ck_assert_int_eq(tsp_warm_payload_pack("/", argv, bad_env, &buf, &len), -EINVAL);
    ck_assert_int_eq(tsp_warm_payload_pack("/", argv, lead_eq, &buf, &len), -EINVAL);
    ck_assert_int_eq(tsp_warm_payload_pack("/", no_argv, NULL, &buf, &len), -EINVAL);
    char *big = malloc(TSP_WARM_MAX_PAYLOAD + 2);
    memset(big, 'a', TSP_WARM_MAX_PAYLOAD);
    big[0] = 'A';
    big[1] = '=';
    big[TSP_WARM_MAX_PAYLOAD] = 0;
    char *big_env[] = {big, NULL};
    ck_assert_int_eq(tsp_warm_payload_pack("/", argv, big_env, &buf, &len), -EMSGSIZE);
    free(big);
    /* malformed on the way in */
#define TERMINATED(s)                                                                              \
    {                                                                                              \
        s, sizeof s                                                                                \
    } /* the literal's own final NUL included */
    static const struct {
        const char *p;
        size_t len;
    } bad[] = {
        {"", 0}, /* empty */
        {"/\0"
         "1\0sh",
         6},                    /* not NUL-terminated */
        TERMINATED("/"),        /* no argc */
        TERMINATED("/\0x\0sh"), /* argc not a number */
        TERMINATED("/\0"
                   "0"), /* argc 0 */
        TERMINATED("/\0"
                   "01\0sh"), /* leading zero */
        TERMINATED("/\0"
                   "3\0sh\0-c"), /* fewer arguments than argc */
        TERMINATED("/\0"
                   "1\0sh\0NOEQ"), /* env entry without '=' */
        TERMINATED("/\0"
                   "1\0sh\0=x"), /* env entry without a name */
        TERMINATED("/\0"
                   "99999999999\0sh"), /* absurd argc */
    };
#undef TERMINATED
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(tsp_warm_payload_unpack(bad[i].p, bad[i].len, &r) == -EBADMSG,
                      "malformed payload %zu accepted", i);
}
END_TEST

START_TEST(test_warm_msg_round_trip_and_malformed)
{
    unsigned char m[TSP_WARM_MSG_LEN];
    int tag;
    int32_t v;
    const struct {
        int tag;
        int32_t v;
    } ok[] = {{'P', 4242}, {'R', 0}, {'R', 17}, {'X', 0x0f00}, {'X', 9}, {'X', -1}, {'K', 15}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        tsp_warm_msg_pack(m, ok[i].tag, ok[i].v);
        ck_assert_int_eq(tsp_warm_msg_unpack(m, &tag, &v), 0);
        ck_assert_int_eq(tag, ok[i].tag);
        ck_assert_int_eq(v, ok[i].v);
    }
    tsp_warm_msg_pack(m, 'P', 0x01020304);
    ck_assert_int_eq(memcmp(m, "P\1\2\3\4", 5), 0);
    const struct {
        int tag;
        int32_t v;
    } bad[] = {{'P', 0}, {'P', -5}, {'R', -1}, {'R', TSP_WARM_MAX_REASON + 1},
               {'K', 0}, {'K', 65}, {'Z', 1},  {0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tsp_warm_msg_pack(m, bad[i].tag, bad[i].v);
        ck_assert_msg(tsp_warm_msg_unpack(m, &tag, &v) == -EBADMSG, "bad message %zu accepted", i);
    }
}
END_TEST

/* ---- a fake pool ------------------------------------------------------------------- */

enum { POOL_OK = 0, POOL_NOBODY = 7, POOL_BAD_REQUEST = 10, POOL_SAW_EOF = 42 };

static char dir[] = "/tmp/tsp_warm_test_XXXXXX";
static char sock_path[256];
/* The shim's environment; the pool checks that the request carries exactly this. */
static char *shim_env[] = {"WARM_MARK=yes", "PATH=/usr/bin:/bin", NULL, NULL};

/* Per test (in its forked process): a fresh 0700 directory for the socket. */
static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(dir)); /* mode 0700 */
    snprintf(sock_path, sizeof sock_path, "%s/pool.sock", dir);
}

static void teardown(void)
{
    char path[320];
    snprintf(path, sizeof path, "%s/open/pool.sock", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/open", dir);
    rmdir(path);
    snprintf(path, sizeof path, "%s/received", dir);
    unlink(path);
    unlink(sock_path);
    rmdir(dir);
}

static int full_io(int fd, void *buf, size_t len, int writing)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void send_msg(int fd, int tag, int32_t v)
{
    unsigned char m[TSP_WARM_MSG_LEN];
    tsp_warm_msg_pack(m, tag, v);
    if (full_io(fd, m, sizeof m, 1) != 0)
        _exit(POOL_BAD_REQUEST + 9);
}

/* An entry of a request's environment. */
static int has_env(const tsp_warm_request_t *req, const char *entry)
{
    for (size_t i = 0; req->envp[i]; i++)
        if (strcmp(req->envp[i], entry) == 0)
            return 1;
    return 0;
}

/* Receives the header with its three descriptors and the payload; checks them: cwd and
 * environment exactly the shim's, or (mode "agent") an agent's worker environment. */
static int pool_receive(int conn, int fds[3], char **payload, tsp_warm_request_t *req,
                        const char *mode)
{
    unsigned char h[TSP_WARM_HEADER_LEN];
    union {
        char buf[CMSG_SPACE(sizeof(int) * 3)];
        struct cmsghdr align;
    } cm;
    struct iovec iov = {h, sizeof h};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof cm.buf};
    ssize_t n = recvmsg(conn, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    if (n != (ssize_t)sizeof h || !c || c->cmsg_type != SCM_RIGHTS ||
        c->cmsg_len != CMSG_LEN(sizeof(int) * 3))
        return POOL_BAD_REQUEST + 1;
    memcpy(fds, CMSG_DATA(c), sizeof(int) * 3);
    uint32_t len;
    if (tsp_warm_header_unpack(h, &len) != 0)
        return POOL_BAD_REQUEST + 2;
    *payload = malloc(len);
    if (full_io(conn, *payload, len, 0) != 0 || tsp_warm_payload_unpack(*payload, len, req) != 0)
        return POOL_BAD_REQUEST + 3;
    if (req->argc != 3 || strcmp(req->argv[0], "sh") != 0 || strcmp(req->argv[1], "-c") != 0)
        return POOL_BAD_REQUEST + 4;
    if (strcmp(mode, "agent") == 0)
        return has_env(req, "RANK=0") && has_env(req, "LOCAL_WORLD_SIZE=1") ? 0
                                                                            : POOL_BAD_REQUEST + 12;
    if (strcmp(req->cwd, dir) != 0)
        return POOL_BAD_REQUEST + 13;
    size_t i = 0;
    for (; shim_env[i]; i++)
        if (!req->envp[i] || strcmp(req->envp[i], shim_env[i]) != 0)
            return POOL_BAD_REQUEST + 5;
    return req->envp[i] ? POOL_BAD_REQUEST + 6 : 0;
}

/* The worker: its own session, the shim's descriptors as 0, 1, 2, started once P is sent. */
static pid_t pool_fork(const tsp_warm_request_t *req, const int fds[3], int *go)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        _exit(POOL_BAD_REQUEST + 7);
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        char c;
        if (read(p[0], &c, 1) != 1)
            _exit(99);
        for (int i = 0; i < 3; i++)
            dup2(fds[i], i);
        if (chdir(req->cwd) < 0)
            _exit(98);
        execve("/bin/sh", req->argv, req->envp);
        _exit(127);
    }
    close(p[0]);
    *go = p[1];
    return pid;
}

/* Mode "run": forward K to the group, answer X; on EOF SIGKILL the group. */
static int pool_supervise(int conn, pid_t pid)
{
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            send_msg(conn, TSP_WARM_EXIT, st);
            return POOL_OK;
        }
        struct pollfd p = {conn, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0)
            continue;
        unsigned char m[TSP_WARM_MSG_LEN];
        int tag;
        int32_t sig;
        if (full_io(conn, m, sizeof m, 0) != 0) {
            kill(-pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? POOL_SAW_EOF : POOL_OK;
        }
        if (tsp_warm_msg_unpack(m, &tag, &sig) != 0 || tag != TSP_WARM_KILL)
            return POOL_BAD_REQUEST + 8;
        kill(-pid, sig);
    }
}

static int pool_main(int lfd, const char *mode)
{
    struct pollfd p = {lfd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0)
        return POOL_NOBODY;
    int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0)
        return POOL_NOBODY;
    int fds[3] = {-1, -1, -1};
    char *payload = NULL;
    tsp_warm_request_t req = {0};
    int rc = pool_receive(conn, fds, &payload, &req, mode);
    if (rc)
        return rc;
    if (strcmp(mode, "refuse") == 0) {
        /* One write: the shim may close as soon as it has read the tag. */
        unsigned char m[TSP_WARM_MSG_LEN + 6];
        tsp_warm_msg_pack(m, TSP_WARM_REFUSED, 6);
        memcpy(m + TSP_WARM_MSG_LEN, "differ", 6);
        return full_io(conn, m, sizeof m, 1) == 0 ? POOL_OK : POOL_BAD_REQUEST + 9;
    }
    if (strcmp(mode, "silent") == 0) {
        char mark[300];
        snprintf(mark, sizeof mark, "%s/received", dir);
        close(open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)); /* the test waits for it */
        char c;
        return read(conn, &c, 1) == 0 ? POOL_OK : POOL_BAD_REQUEST + 10; /* the shim left */
    }
    int go;
    pid_t pid = pool_fork(&req, fds, &go);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    send_msg(conn, TSP_WARM_PID, pid);
    if (write(go, "g", 1) != 1)
        return POOL_BAD_REQUEST + 11;
    if (strcmp(mode, "die") == 0) { /* the pool dies, and its worker with it */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return POOL_OK;
    }
    rc = pool_supervise(conn, pid);
    tsp_warm_request_free(&req);
    free(payload);
    return rc;
}

/* Listens at path (before the fork: the socket exists when this returns) and serves one
 * request in a child process. */
static pid_t start_pool(const char *path, const char *mode)
{
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Check's runner handlers, inherited through the test's fork, would kill the test's
         * whole process group on SIGTERM. */
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGALRM, SIG_DFL);
        signal(SIGPIPE, SIG_IGN); /* a shim that left is seen as EPIPE */
        _exit(pool_main(lfd, mode));
    }
    close(lfd);
    return pid;
}

/* ---- the shim ---------------------------------------------------------------------- */

/* Starts torchspark-run --warm-exec SOCKET -- sh sh -c SCRIPT in dir, stdout/stderr piped. */
static void start_shim(tsp_proc_t *p, const char *path, const char *script)
{
    char *argv[] = {TSP_RUN_BIN, "--warm-exec", (char *)path,   "--", "sh",
                    "sh",        "-c",          (char *)script, NULL};
    tsp_proc_opts_t o = {.file = TSP_RUN_BIN,
                         .argv = argv,
                         .envp = shim_env,
                         .cwd = dir,
                         .stdout_mode = TSP_PROC_PIPE,
                         .stderr_mode = TSP_PROC_PIPE,
                         .new_session = 1};
    char err[256] = "";
    ck_assert_msg(tsp_proc_spawn(p, &o, err, sizeof err) == 0, "%s", err);
}

/* Reads fd until needle is in buf (1) or the end / timeout (0). */
static int read_until(int fd, char *buf, size_t cap, size_t *got, const char *needle)
{
    for (int waited = 0; waited < 20000;) {
        buf[*got] = 0;
        if (needle && strstr(buf, needle))
            return 1;
        ssize_t n = read(fd, buf + *got, cap - 1 - *got);
        if (n > 0) {
            *got += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            return 0;
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, 50);
        waited += 50;
    }
    return 0;
}

static int wait_for(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        ck_assert_int_eq(errno, EINTR);
    return st;
}

START_TEST(test_warm_exit_status_and_output_pass_through)
{
    pid_t pool = start_pool(sock_path, "run");
    tsp_proc_t p;
    start_shim(&p, sock_path, "echo out $$; echo err >&2; exit 3");
    char out[256], errs[256];
    size_t no = 0, ne = 0;
    read_until(p.out_fd, out, sizeof out, &no, NULL);
    read_until(p.err_fd, errs, sizeof errs, &ne, NULL);
    int st = wait_for(p.pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "shim status %#x", st);
    int worker = 0;
    ck_assert_int_eq(sscanf(out, "out %d\n", &worker), 1);
    ck_assert_int_ne(worker, p.pid); /* the pool's child wrote it, not the shim */
    ck_assert_str_eq(errs, "err\n");
    st = wait_for(pool);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
    tsp_proc_close(&p);
}
END_TEST

START_TEST(test_warm_signals_are_forwarded_and_death_passes_through)
{
    pid_t pool = start_pool(sock_path, "run");
    tsp_proc_t p;
    start_shim(&p, sock_path,
               "trap 'echo got-usr1' USR1; echo ready; while :; do sleep 0.05; done");
    char out[256];
    size_t no = 0;
    ck_assert(read_until(p.out_fd, out, sizeof out, &no, "ready\n"));
    kill(p.pid, SIGUSR1); /* forwarded; the shim lives on */
    ck_assert(read_until(p.out_fd, out, sizeof out, &no, "got-usr1\n"));
    kill(p.pid, SIGTERM);
    int st = wait_for(p.pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "shim status %#x", st);
    st = wait_for(pool); /* it answered X: it did not see the shim go first */
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
    tsp_proc_close(&p);
}
END_TEST

/* The command runs in the shim's own process: $$ is the shim's pid. */
static void expect_ran_itself(const char *path)
{
    tsp_proc_t p;
    start_shim(&p, path, "echo pid $$; exit 5");
    char out[256];
    size_t no = 0;
    read_until(p.out_fd, out, sizeof out, &no, NULL);
    int st = wait_for(p.pid), pid = 0;
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 5, "shim status %#x", st);
    ck_assert_int_eq(sscanf(out, "pid %d", &pid), 1);
    ck_assert_int_eq(pid, p.pid);
    tsp_proc_close(&p);
}

START_TEST(test_warm_refused_runs_the_command_itself)
{
    pid_t pool = start_pool(sock_path, "refuse");
    expect_ran_itself(sock_path);
    int st = wait_for(pool);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
}
END_TEST

START_TEST(test_warm_no_pool_or_foreign_dir_runs_the_command_itself)
{
    expect_ran_itself(sock_path);             /* nothing there */
    expect_ran_itself("/nonexistent/x.sock"); /* no such directory */
    /* A listening pool in a directory others can enter is not trusted: never connected. */
    char open_dir[300], path[320];
    snprintf(open_dir, sizeof open_dir, "%s/open", dir);
    ck_assert_int_eq(mkdir(open_dir, 0755), 0);
    snprintf(path, sizeof path, "%s/pool.sock", open_dir);
    pid_t pool = start_pool(path, "run");
    expect_ran_itself(path);
    kill(pool, SIGKILL); /* still waiting for a connection */
    int st = wait_for(pool);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "pool status %#x", st);
}
END_TEST

START_TEST(test_warm_no_answer_in_time_runs_the_command_itself)
{
    shim_env[2] = "TORCHSPARK_WARM_WAIT=0.3"; /* the pool checks the environment too */
    pid_t pool = start_pool(sock_path, "silent");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_ran_itself(sock_path);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    ck_assert_msg(took >= 0.3 && took < 15, "fell back after %.3f s", took);
    int st = wait_for(pool); /* it saw the shim close the connection */
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
}
END_TEST

/* A signal while the shim waits for the pool's answer ends it by that signal (the worker,
 * were it forked meanwhile, dies with the connection). */
START_TEST(test_warm_signal_before_the_answer_ends_the_shim)
{
    shim_env[2] = "TORCHSPARK_WARM_WAIT=30";
    pid_t pool = start_pool(sock_path, "silent");
    tsp_proc_t p;
    start_shim(&p, sock_path, "exit 0");
    char mark[300];
    snprintf(mark, sizeof mark, "%s/received", dir);
    for (int i = 0; i < 2000 && access(mark, F_OK) != 0; i++)
        usleep(5000);
    ck_assert_int_eq(access(mark, F_OK), 0);
    kill(p.pid, SIGTERM);
    int st = wait_for(p.pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "shim status %#x", st);
    st = wait_for(pool);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
    tsp_proc_close(&p);
}
END_TEST

START_TEST(test_warm_pool_death_kills_the_shim)
{
    pid_t pool = start_pool(sock_path, "die");
    tsp_proc_t p;
    start_shim(&p, sock_path, "sleep 30");
    char errs[512];
    size_t ne = 0;
    read_until(p.err_fd, errs, sizeof errs, &ne, NULL);
    int st = wait_for(p.pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "shim status %#x", st);
    ck_assert_msg(strstr(errs, "torchspark: the warm worker pool ended while worker ") &&
                      strstr(errs, " ran; it was killed with it\n"),
                  "stderr: %s", errs);
    st = wait_for(pool);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
    tsp_proc_close(&p);
}
END_TEST

START_TEST(test_warm_shim_sigkill_ends_the_worker)
{
    pid_t pool = start_pool(sock_path, "run");
    tsp_proc_t p;
    start_shim(&p, sock_path, "echo ready; exec sleep 30");
    char out[256];
    size_t no = 0;
    ck_assert(read_until(p.out_fd, out, sizeof out, &no, "ready\n"));
    kill(p.pid, SIGKILL);
    wait_for(p.pid);
    int st = wait_for(pool);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_SAW_EOF, "pool status %#x", st);
    tsp_proc_close(&p);
}
END_TEST

static int run_cli(char **argv, char *errs, size_t cap)
{
    tsp_proc_opts_t o = {.file = TSP_RUN_BIN,
                         .argv = argv,
                         .envp = shim_env,
                         .stdout_mode = TSP_PROC_PIPE,
                         .stderr_mode = TSP_PROC_PIPE};
    tsp_proc_t p;
    char err[256] = "";
    ck_assert_msg(tsp_proc_spawn(&p, &o, err, sizeof err) == 0, "%s", err);
    size_t ne = 0;
    read_until(p.err_fd, errs, cap, &ne, NULL);
    int st = wait_for(p.pid);
    tsp_proc_close(&p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_warm_exec_failure_and_usage)
{
    char errs[512];
    char *missing[] = {TSP_RUN_BIN,         "--warm-exec", sock_path, "--",
                       "/nonexistent/prog", "prog",        NULL};
    ck_assert_int_eq(run_cli(missing, errs, sizeof errs), 127);
    ck_assert_str_eq(errs, "cannot run '/nonexistent/prog': No such file or directory\n");
    char *not_found[] = {TSP_RUN_BIN,        "--warm-exec", sock_path, "--",
                         "no-such-prog-xyz", "x",           NULL};
    ck_assert_int_eq(run_cli(not_found, errs, sizeof errs), 127);
    char *noexec[] = {TSP_RUN_BIN, "--warm-exec", sock_path, "--", "/etc/passwd", "x", NULL};
    ck_assert_int_eq(run_cli(noexec, errs, sizeof errs), 126);
    char *no_dashes[] = {TSP_RUN_BIN, "--warm-exec", sock_path, "sh", "sh", "-c", NULL};
    ck_assert_int_eq(run_cli(no_dashes, errs, sizeof errs), 2);
    ck_assert_ptr_nonnull(strstr(errs, "--warm-exec needs SOCKET -- FILE ARGV0"));
    char *no_argv0[] = {TSP_RUN_BIN, "--warm-exec", sock_path, "--", "sh", NULL};
    ck_assert_int_eq(run_cli(no_argv0, errs, sizeof errs), 2);
}
END_TEST

/* The agent with --warm-socket: its worker is forked by the pool (a sibling of the agent's
 * process here, so that the agent, a subreaper, neither reaps nor kills it), and its output,
 * exit code and the agent's report come out as without a pool. */
START_TEST(test_warm_agent_runs_its_worker_through_the_pool)
{
    pid_t pool = start_pool(sock_path, "agent");
    int out[2];
    ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
    pid_t agent = fork();
    ck_assert_int_ge(agent, 0);
    if (agent == 0) {
        signal(SIGTERM, SIG_DFL);
        if (tsp_agent_setup_process(0, 0) != 0)
            _exit(101);
        char *argv[] = {"sh", "-c", "echo hello from $RANK; exit 3", NULL};
        tsp_agent_opts_t o = {.file = "sh",
                              .argv = argv,
                              .name = "warm.sh",
                              .shutdown_timeout = 5,
                              .console_out = out[1],
                              .console_err = 2,
                              .log_fd = 2,
                              .warm_socket = sock_path,
                              .warm_shim = TSP_RUN_BIN};
        tsp_topo_init(&o.topo);
        tsp_agent_t *a;
        char err[256];
        if (tsp_agent_init(&a, &o, err, sizeof err) != 0)
            _exit(102);
        int st = tsp_agent_run(a);
        tsp_agent_close(a);
        _exit(st);
    }
    close(out[1]);
    char buf[512];
    size_t got = 0;
    read_until(out[0], buf, sizeof buf, &got, NULL);
    close(out[0]);
    int st = wait_for(agent);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "agent status %#x", st);
    ck_assert_str_eq(buf, "hello from 0\n");
    st = wait_for(pool); /* it forked the worker and answered X */
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
}
END_TEST

/* The same through the CLI: torchspark-run --warm-socket starts its own executable as the
 * shim. */
START_TEST(test_warm_cli_warm_socket_option)
{
    pid_t pool = start_pool(sock_path, "agent");
    char *argv[] = {TSP_RUN_BIN,
                    "--nproc-per-node",
                    "1",
                    "--no-python",
                    "--warm-socket",
                    sock_path,
                    "sh",
                    "-c",
                    "echo hello from $RANK; exit 3",
                    NULL};
    tsp_proc_opts_t o = {.file = TSP_RUN_BIN,
                         .argv = argv,
                         .envp = shim_env,
                         .stdout_mode = TSP_PROC_PIPE,
                         .stderr_mode = TSP_PROC_PIPE};
    tsp_proc_t p;
    char err[256] = "", out[256], errs[4096];
    ck_assert_msg(tsp_proc_spawn(&p, &o, err, sizeof err) == 0, "%s", err);
    size_t no = 0, ne = 0;
    read_until(p.out_fd, out, sizeof out, &no, NULL);
    read_until(p.err_fd, errs, sizeof errs, &ne, NULL);
    int st = wait_for(p.pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "agent status %#x: %s", st, errs);
    ck_assert_str_eq(out, "hello from 0\n");
    st = wait_for(pool);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == POOL_OK, "pool status %#x", st);
    tsp_proc_close(&p);
    /* no pool there: the same run, the shim runs the command itself */
    argv[5] = "/nonexistent/pool.sock";
    ck_assert_msg(tsp_proc_spawn(&p, &o, err, sizeof err) == 0, "%s", err);
    no = ne = 0;
    read_until(p.out_fd, out, sizeof out, &no, NULL);
    read_until(p.err_fd, errs, sizeof errs, &ne, NULL);
    st = wait_for(p.pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "agent status %#x: %s", st, errs);
    ck_assert_str_eq(out, "hello from 0\n");
    tsp_proc_close(&p);
}
END_TEST

static Suite *warm_suite(void)
{
    Suite *s = suite_create("warm");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_warm_header_round_trip_and_refusals);
    tcase_add_test(tc, test_warm_payload_round_trip_and_malformed);
    tcase_add_test(tc, test_warm_msg_round_trip_and_malformed);
    tcase_add_test(tc, test_warm_exit_status_and_output_pass_through);
    tcase_add_test(tc, test_warm_signals_are_forwarded_and_death_passes_through);
    tcase_add_test(tc, test_warm_refused_runs_the_command_itself);
    tcase_add_test(tc, test_warm_no_pool_or_foreign_dir_runs_the_command_itself);
    tcase_add_test(tc, test_warm_no_answer_in_time_runs_the_command_itself);
    tcase_add_test(tc, test_warm_signal_before_the_answer_ends_the_shim);
    tcase_add_test(tc, test_warm_pool_death_kills_the_shim);
    tcase_add_test(tc, test_warm_shim_sigkill_ends_the_worker);
    tcase_add_test(tc, test_warm_exec_failure_and_usage);
    tcase_add_test(tc, test_warm_agent_runs_its_worker_through_the_pool);
    tcase_add_test(tc, test_warm_cli_warm_socket_option);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(warm_suite());
}
