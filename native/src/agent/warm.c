/* warm.c: the shim side of the warm worker pool (docs/protocol.md section 6): the request
 * and message codecs, and tsp_warm_exec, the process that stands for a pool-forked worker.
 *
 * The shim's life, as states:
 *   CONNECT  the socket's directory is ours and 0700, connect, the peer is our uid
 *   SEND     header + SCM_RIGHTS(0, 1, 2), then the payload
 *   WAIT     for P or R, until TORCHSPARK_WARM_WAIT seconds after the start
 *   RUN      after P: forward signals as K, until X
 * Any failure in CONNECT, SEND or WAIT (or R) is the fallback: exec the command ourselves.
 * A signal before P ends the shim by that signal (the pool SIGKILLs a worker it forked
 * meanwhile when the connection closes); after P it is forwarded. In RUN, the end of the
 * stream without X means the pool died and took the worker with it: the shim dies by SIGKILL.
 *
 * The signals the shim forwards are blocked for its whole life and read through a signalfd
 * (the mask is restored before the fallback exec, so a signal that came meanwhile still
 * reaches the command). The shim ends with _exit: it owns no stdio buffer worth flushing.
 */
#include "warm.h"
#include "dump.h"
#include "proc.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---- codecs ------------------------------------------------------------------------ */

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static const unsigned char magic[4] = {'T', 'S', 'P', 'W'};

void tsp_warm_header_pack(unsigned char out[TSP_WARM_HEADER_LEN], uint32_t len)
{
    memcpy(out, magic, sizeof magic);
    put32(out + 4, TSP_WARM_VERSION);
    put32(out + 8, len);
    put32(out + 12, TSP_WARM_NFDS);
}

int tsp_warm_header_unpack(const unsigned char in[TSP_WARM_HEADER_LEN], uint32_t *len)
{
    if (memcmp(in, magic, sizeof magic) != 0)
        return -EPROTO;
    if (get32(in + 4) != TSP_WARM_VERSION)
        return -EPROTONOSUPPORT;
    if (get32(in + 8) > TSP_WARM_MAX_PAYLOAD)
        return -EMSGSIZE;
    if (get32(in + 12) != TSP_WARM_NFDS)
        return -EBADMSG;
    *len = get32(in + 8);
    return 0;
}

/* NAME=VALUE with a non-empty NAME. */
static int env_entry_ok(const char *e)
{
    const char *eq = strchr(e, '=');
    return eq && eq > e;
}

int tsp_warm_payload_pack(const char *cwd, char *const argv[], char *const envp[], char **out,
                          size_t *len)
{
    *out = NULL;
    *len = 0;
    if (!argv || !argv[0])
        return -EINVAL;
    size_t argc = 0, total = strlen(cwd) + 1;
    for (; argv[argc]; argc++)
        total += strlen(argv[argc]) + 1;
    for (size_t i = 0; envp && envp[i]; i++) {
        if (!env_entry_ok(envp[i]))
            return -EINVAL;
        total += strlen(envp[i]) + 1;
    }
    char num[24];
    int nlen = snprintf(num, sizeof num, "%zu", argc);
    total += (size_t)nlen + 1;
    if (total > TSP_WARM_MAX_PAYLOAD)
        return -EMSGSIZE;
    char *buf = malloc(total), *w = buf;
    if (!buf)
        return -ENOMEM;
    w = stpcpy(w, cwd) + 1;
    w = stpcpy(w, num) + 1;
    for (size_t i = 0; i < argc; i++)
        w = stpcpy(w, argv[i]) + 1;
    for (size_t i = 0; envp && envp[i]; i++)
        w = stpcpy(w, envp[i]) + 1;
    *out = buf;
    *len = total;
    return 0;
}

/* argc: decimal digits, 1 to max, no sign or leading zero. -1 when malformed. */
static int parse_argc(const char *s, size_t max)
{
    size_t v = 0;
    if (!*s || *s == '0')
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (size_t)(*s - '0');
        if (v > max)
            return -1;
    }
    return (int)v;
}

int tsp_warm_payload_unpack(const char *buf, size_t len, tsp_warm_request_t *req)
{
    memset(req, 0, sizeof *req);
    if (len == 0 || buf[len - 1] != 0)
        return -EBADMSG;
    size_t nstr = 0;
    for (size_t i = 0; i < len; i++)
        nstr += buf[i] == 0;
    const char *p = buf, *end = buf + len;
    req->cwd = p;
    p += strlen(p) + 1;
    int argc = p < end ? parse_argc(p, nstr) : -1;
    if (argc < 0 || (size_t)argc > nstr - 2)
        return -EBADMSG;
    p += strlen(p) + 1;
    size_t nenv = nstr - 2 - (size_t)argc;
    req->argv = calloc((size_t)argc + 1, sizeof *req->argv);
    req->envp = calloc(nenv + 1, sizeof *req->envp);
    if (!req->argv || !req->envp) {
        tsp_warm_request_free(req);
        return -ENOMEM;
    }
    req->argc = argc;
    for (int i = 0; i < argc; i++, p += strlen(p) + 1)
        req->argv[i] = (char *)p;
    for (size_t i = 0; i < nenv; i++, p += strlen(p) + 1) {
        if (!env_entry_ok(p)) {
            tsp_warm_request_free(req);
            return -EBADMSG;
        }
        req->envp[i] = (char *)p;
    }
    return 0;
}

void tsp_warm_request_free(tsp_warm_request_t *req)
{
    free(req->argv);
    free(req->envp);
    memset(req, 0, sizeof *req);
}

void tsp_warm_msg_pack(unsigned char out[TSP_WARM_MSG_LEN], int tag, int32_t value)
{
    out[0] = (unsigned char)tag;
    put32(out + 1, (uint32_t)value);
}

int tsp_warm_msg_unpack(const unsigned char in[TSP_WARM_MSG_LEN], int *tag, int32_t *value)
{
    int32_t v = (int32_t)get32(in + 1);
    switch (in[0]) {
    case TSP_WARM_PID:
        if (v <= 0)
            return -EBADMSG;
        break;
    case TSP_WARM_REFUSED:
        if (v < 0 || v > TSP_WARM_MAX_REASON)
            return -EBADMSG;
        break;
    case TSP_WARM_KILL:
        if (v < 1 || v > 64)
            return -EBADMSG;
        break;
    case TSP_WARM_EXIT:
        break;
    default:
        return -EBADMSG;
    }
    *tag = in[0];
    *value = v;
    return 0;
}

/* ---- the shim ---------------------------------------------------------------------- */

static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

typedef struct {
    int sock;
    int sigfd;
    sigset_t old_mask;
    int64_t deadline; /* tsp__now_ms() for P or R */
} shim_t;

/* TORCHSPARK_WARM_WAIT in ms: a number of seconds >= 0; anything else is the default. */
static int64_t wait_ms(void)
{
    const char *v = getenv("TORCHSPARK_WARM_WAIT");
    char *end;
    double s = v && *v ? strtod(v, &end) : -1;
    if (!v || !*v || *end || !(s >= 0 && s <= 1e7))
        s = TSP_WARM_DEFAULT_WAIT;
    return (int64_t)(s * 1000);
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/* Ends this process by sig, as the worker ended (or as a worker without a handler would
 * have): default disposition, no core file of the shim, sig unblocked. */
__attribute__((noreturn)) static void die_by_signal(int sig)
{
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, sig);
    sigprocmask(SIG_UNBLOCK, &only, NULL);
    raise(sig);
    _exit(tsp_proc_signal_status(sig));
}

/* The next forwarded signal that arrived, 0 when none. */
static int next_signal(const shim_t *s)
{
    struct signalfd_siginfo si;
    ssize_t n;
    do
        n = read(s->sigfd, &si, sizeof si);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof si ? (int)si.ssi_signo : 0;
}

/* Waits until the socket is ready for events, before the deadline (-1: none). A signal
 * that comes while the socket is not ready (before the pool's P) ends the shim by it.
 * 1 ready, 0 deadline, -errno. */
static int wait_ready(shim_t *s, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline < 0 ? -1 : deadline - tsp__now_ms();
        if (deadline >= 0 && left <= 0)
            return 0;
        struct pollfd p[2] = {{s->sock, events, 0}, {s->sigfd, POLLIN, 0}};
        int n = poll(p, 2, left < 0 ? -1 : left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR)
            return -errno;
        /* The socket first: a P already there makes a signal that came with it one to
         * forward, not one that ends the shim. */
        if (n > 0 && p[0].revents)
            return 1;
        if (n > 0 && (p[1].revents & POLLIN)) {
            int sig = next_signal(s);
            if (sig && sig != tsp_dump_signal() &&
                sig != tsp_dump_recorder_signal()) { /* a dump before P: nothing to dump */
                close_fd(&s->sock);                  /* the pool kills whatever it forked for us */
                die_by_signal(sig);
            }
        }
    }
}

/* The socket's directory must be ours and 0700: nobody else can have put the socket there. */
static int check_dir(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    struct stat st;
    if (lstat(dir, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 0777) != 0700)
        return -EPERM;
    return 0;
}

/* CONNECT: a non-blocking connection to a pool of our own user. A full listen backlog
 * (EAGAIN: a pool busy starting) is retried every 10 ms until the deadline. */
static int shim_connect(shim_t *s, const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int rc = check_dir(path);
    if (rc)
        return rc;
    for (;;) {
        s->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s->sock < 0)
            return -errno;
        while ((rc = connect(s->sock, (struct sockaddr *)&sa, sizeof sa)) < 0 && errno == EINTR)
            ;
        if (rc == 0)
            break;
        rc = -errno;
        close_fd(&s->sock);
        if (rc != -EAGAIN || tsp__now_ms() >= s->deadline)
            return rc;
        struct pollfd p = {s->sigfd, POLLIN, 0};
        if (poll(&p, 1, 10) > 0 && (p.revents & POLLIN)) {
            int sig = next_signal(s);
            if (sig)
                die_by_signal(sig);
        }
    }
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(s->sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0)
        return -errno;
    return cred.uid == geteuid() ? 0 : -EPERM;
}

/* Sends len bytes (the first send carries fds 0, 1, 2 when with_fds), before deadline. */
static int send_all(shim_t *s, const void *data, size_t len, int with_fds, int64_t deadline)
{
    const char *p = data;
    while (len > 0) {
        struct iovec iov = {(void *)p, len};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        union {
            char buf[CMSG_SPACE(sizeof(int) * TSP_WARM_NFDS)];
            struct cmsghdr align;
        } cm;
        if (with_fds) {
            memset(&cm, 0, sizeof cm);
            mh.msg_control = cm.buf;
            mh.msg_controllen = sizeof cm.buf;
            struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * TSP_WARM_NFDS);
            const int fds[TSP_WARM_NFDS] = {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO};
            memcpy(CMSG_DATA(c), fds, sizeof fds);
        }
        ssize_t n = sendmsg(s->sock, &mh, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int rc = wait_ready(s, POLLOUT, deadline);
            if (rc <= 0)
                return rc ? rc : -ETIMEDOUT;
            continue;
        }
        if (n < 0)
            return -errno;
        with_fds = 0; /* the descriptors went with the first byte */
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* SEND: the request. */
static int shim_send(shim_t *s, char *const argv[])
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return -errno;
    char *payload;
    size_t len;
    int rc = tsp_warm_payload_pack(cwd, argv, environ, &payload, &len);
    if (rc)
        return rc;
    unsigned char hdr[TSP_WARM_HEADER_LEN];
    tsp_warm_header_pack(hdr, (uint32_t)len);
    rc = send_all(s, hdr, sizeof hdr, 1, s->deadline);
    if (!rc)
        rc = send_all(s, payload, len, 0, s->deadline);
    free(payload);
    return rc;
}

/* Reads one whole message before deadline (-1: none). 0, -ETIMEDOUT, -EPIPE at the end of
 * the stream, -EBADMSG, -errno. */
static int read_msg(shim_t *s, int64_t deadline, int *tag, int32_t *value)
{
    unsigned char m[TSP_WARM_MSG_LEN];
    size_t got = 0;
    while (got < sizeof m) {
        ssize_t n = recv(s->sock, m + got, sizeof m - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            int rc = wait_ready(s, POLLIN, deadline);
            if (rc <= 0)
                return rc ? rc : -ETIMEDOUT;
            continue;
        }
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EPIPE;
        got += (size_t)n;
    }
    return tsp_warm_msg_unpack(m, tag, value);
}

/* The exec the shim falls back to: the same process becomes the worker, after one line on
 * its stderr (the worker's, which reaches the driver) saying why the pool did not serve it. */
__attribute__((noreturn)) static void fallback(shim_t *s, const char *file, char *const argv[],
                                               const char *why)
{
    dprintf(STDERR_FILENO,
            "torchspark: the warm worker pool did not start this worker (%s): starting a "
            "fresh process\n",
            why);
    close_fd(&s->sock);
    close_fd(&s->sigfd);
    sigprocmask(SIG_SETMASK, &s->old_mask, NULL);
    int rc = tsp_proc_exec(file, argv, environ);
    dprintf(STDERR_FILENO, "cannot run '%s': %s\n", file, strerror(-rc));
    _exit(tsp_proc_exec_status(rc));
}

/* The pool is gone, and with it the worker (it SIGKILLs its workers' groups). */
__attribute__((noreturn)) static void pool_lost(int32_t pid)
{
    dprintf(STDERR_FILENO,
            "torchspark: the warm worker pool ended while worker %d ran; it was killed with it\n",
            (int)pid);
    raise(SIGKILL);
    _exit(tsp_proc_signal_status(SIGKILL));
}

/* RUN: K + signal. Five bytes fit in any socket buffer that the pool reads; a pool that
 * stopped reading gets 5 s. A failed send means the pool is gone, which the end of the
 * stream then says: nothing to do here. */
static void send_kill(const shim_t *s, int sig)
{
    unsigned char k[TSP_WARM_MSG_LEN];
    tsp_warm_msg_pack(k, TSP_WARM_KILL, sig);
    size_t sent = 0;
    int64_t deadline = tsp__now_ms() + 5000;
    while (sent < sizeof k && tsp__now_ms() < deadline) {
        ssize_t n = send(s->sock, k + sent, sizeof k - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            struct pollfd p = {s->sock, POLLOUT, 0};
            (void)poll(&p, 1, 100);
        } else if (!(n < 0 && errno == EINTR)) {
            return;
        }
    }
}

/* The dump signal (docs/protocol.md 1.9): one line about the forked worker on its
 * stderr (the shim's), then forwarded as K unless the worker cannot answer. */
static void shim_dump(shim_t *s, int32_t pid)
{
    char state = '?', line[300];
    const char *what = "unknown";
    const char *why = tsp_dump_state((pid_t)pid, &state, &what) ? "its state cannot be read"
                                                                : tsp_dump_cannot_answer(state);
    size_t len = tsp_dump_marker(line, sizeof line - 1, 0, -1, NULL, (pid_t)pid, state, what, why);
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
    if (!why)
        send_kill(s, tsp_dump_signal());
}

/* The recorder signal: forwarded as K unless the worker cannot answer (shim_dump said why). */
static void shim_recorder(shim_t *s, int32_t pid)
{
    char state = '?';
    const char *what = "unknown";
    if (!tsp_dump_state((pid_t)pid, &state, &what) && !tsp_dump_cannot_answer(state))
        send_kill(s, tsp_dump_recorder_signal());
}

/* RUN: forwards signals as K until X; never returns. */
__attribute__((noreturn)) static void shim_run(shim_t *s, int32_t pid)
{
    unsigned char m[TSP_WARM_MSG_LEN];
    size_t got = 0;
    for (;;) {
        struct pollfd p[2] = {{s->sock, POLLIN, 0}, {s->sigfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            pool_lost(pid);
        }
        /* The socket first: an X already there is the worker's end, whatever came later. */
        if (p[0].revents) {
            ssize_t n = recv(s->sock, m + got, sizeof m - got, 0);
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
                pool_lost(pid);
            got += n > 0 ? (size_t)n : 0;
            if (got == sizeof m) {
                int tag;
                int32_t status;
                if (tsp_warm_msg_unpack(m, &tag, &status) != 0 || tag != TSP_WARM_EXIT)
                    pool_lost(pid); /* a pool that breaks the protocol is not to be trusted */
                int ws = (int)status;
                if (WIFSIGNALED(ws))
                    die_by_signal(WTERMSIG(ws));
                _exit(tsp_proc_exit_code(ws));
            }
        }
        int sig = (p[1].revents & POLLIN) ? next_signal(s) : 0;
        if (sig == tsp_dump_signal())
            shim_dump(s, pid);
        else if (sig == tsp_dump_recorder_signal())
            shim_recorder(s, pid);
        else if (sig)
            send_kill(s, sig);
    }
}

/* R's reason (len bytes after the message), shortened to fit, within the deadline. */
static void refusal_text(shim_t *s, int32_t len, char *out, size_t outlen)
{
    size_t got = 0, want = (size_t)len < outlen - 16 ? (size_t)len : outlen - 16;
    int n = snprintf(out, outlen, "refused: ");
    char *text = out + n;
    while (got < want) {
        ssize_t r = recv(s->sock, text + got, want - got, 0);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN && wait_ready(s, POLLIN, s->deadline) > 0)
            continue;
        break;
    }
    text[got] = 0;
    if (!got)
        snprintf(text, outlen - (size_t)n, "no reason given");
}

void tsp_warm_exec(const char *socket_path, const char *file, char *const argv[])
{
    shim_t s = {.sock = -1, .sigfd = -1};
    sigemptyset(&s.old_mask);
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaddset(&set, forwarded[i]);
    sigaddset(&set, tsp_dump_signal());
    sigaddset(&set, tsp_dump_recorder_signal());
    char why[512];
    if (sigprocmask(SIG_BLOCK, &set, &s.old_mask) < 0)
        fallback(&s, file, argv, "cannot block signals");
    s.deadline = tsp__now_ms() + wait_ms();
    if ((s.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
        fallback(&s, file, argv, "cannot create a signalfd");
    int rc = shim_connect(&s, socket_path);
    if (rc) {
        snprintf(why, sizeof why, "%s at %s: %s",
                 rc == -EPERM ? "the socket's directory or its owner is not ours"
                              : "no pool answers",
                 socket_path, strerror(-rc));
        fallback(&s, file, argv, why);
    }
    if ((rc = shim_send(&s, argv)) != 0) {
        snprintf(why, sizeof why, "cannot send the request: %s", strerror(-rc));
        fallback(&s, file, argv, why);
    }
    int tag;
    int32_t value;
    rc = read_msg(&s, s.deadline, &tag, &value);
    if (rc == 0 && tag == TSP_WARM_PID)
        shim_run(&s, value);
    if (rc == -ETIMEDOUT)
        snprintf(why, sizeof why, "no answer within TORCHSPARK_WARM_WAIT=%.1f s",
                 (double)wait_ms() / 1000);
    else if (rc == 0 && tag == TSP_WARM_REFUSED)
        refusal_text(&s, value, why, sizeof why);
    else
        snprintf(why, sizeof why, "a broken answer: %s",
                 rc ? strerror(-rc) : "an unexpected message");
    fallback(&s, file, argv, why);
}
