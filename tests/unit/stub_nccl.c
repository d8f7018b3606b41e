#define _GNU_SOURCE
/* stub_nccl.c: a stand-in for libnccl.so.2 for the preflight tests on machines without a
 * GPU. Bootstrap only through NCCL_COMM_ID=host:port: rank 0 listens there (SO_REUSEADDR),
 * the others connect with retries and send {rank, host, bus of their current device (from
 * the stub libcuda)}; rank 0 refuses a repeated host and bus with NCCL's own "Duplicate GPU
 * detected" text and ncclInvalidUsage. all_reduce sums float32 through rank 0. With
 * config.blocking = 0, init and collectives run on a thread that reports through
 * ncclCommGetAsyncError; ncclCommAbort stops and joins it. Knobs:
 * STUB_NCCL_INIT_FAIL=rank:code:text (rank "*": every rank of the process's host, for a
 * test that sets it on one host only), STUB_NCCL_ALLREDUCE_HANG=rank, STUB_NCCL_HOST (the
 * host name sent; "@agent": one per agent, for several agents on one host),
 * STUB_NCCL_FAIL_FILE (holds rank:code:text when a test wants the failure; the failing
 * rank writes the wall-clock time of its failure to FILE.stamp),
 * STUB_NCCL_VERSION. Built twice: the second without
 * ncclCommInitRankConfig and reporting 2.13 (STUB_NCCL_OLD). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXR 64

typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking;
} ncclConfig_prefix;

typedef struct ncclComm {
    int rank, nranks, blocking;
    int fd[MAXR]; /* rank 0: one per peer; others: fd[0] to rank 0 */
    int lfd;
    char addr[96];
    int port;
    pthread_t th;
    int has_thread;
    atomic_int async, aborted;
    /* the pending collective */
    const float *send;
    float *recv;
    size_t count;
    int op;       /* 0 init, 1 all_reduce, 2 finalize */
    char bus[32]; /* the device current to the caller at init (as NCCL reads it) */
} comm_t;

typedef comm_t *ncclComm_t;

static char last[512];
static pthread_mutex_t last_mu = PTHREAD_MUTEX_INITIALIZER;

unsigned int ncclGetVersion(int *v);
unsigned int ncclGetUniqueId(ncclUniqueId *id);
unsigned int ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int rank);
#ifndef STUB_NCCL_OLD
unsigned int ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int rank,
                                    ncclConfig_prefix *cfg);
#endif
unsigned int ncclCommGetAsyncError(ncclComm_t c, unsigned int *e);
unsigned int ncclCommAbort(ncclComm_t c);
unsigned int ncclCommDestroy(ncclComm_t c);
unsigned int ncclCommFinalize(ncclComm_t c);
const char *ncclGetErrorString(unsigned int rc);
const char *ncclGetLastError(ncclComm_t c);
unsigned int ncclAllReduce(const void *s, void *r, size_t n, unsigned int dt, unsigned int op,
                           ncclComm_t c, void *stream);

static void warn(int rank, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&last_mu);
    va_start(ap, fmt);
    vsnprintf(last, sizeof last, fmt, ap);
    va_end(ap);
    const char *dbg = getenv("NCCL_DEBUG");
    if (dbg && (strcasecmp(dbg, "WARN") == 0 || strcasecmp(dbg, "INFO") == 0)) {
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        fprintf(stderr, "%s:%d:%d [%d] stub.cc:1 NCCL WARN %s\n", host, (int)getpid(),
                (int)getpid(), rank, last);
    }
    pthread_mutex_unlock(&last_mu);
}

unsigned int ncclGetVersion(int *v)
{
    const char *e = getenv("STUB_NCCL_VERSION");
#ifdef STUB_NCCL_OLD
    *v = 21300;
#else
    *v = e && *e ? atoi(e) : 23007;
#endif
    return 0;
}

unsigned int ncclGetUniqueId(ncclUniqueId *id)
{
    const char *e = getenv("NCCL_COMM_ID");
    memset(id, 0, sizeof *id);
    if (!e || !strchr(e, ':')) {
        warn(0, "stub: NCCL_COMM_ID=<addr>:<port> is required");
        return 4;
    }
    snprintf(id->internal, sizeof id->internal, "%s", e);
    return 0;
}

const char *ncclGetErrorString(unsigned int rc)
{
    switch (rc) {
    case 0:
        return "no error";
    case 1:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case 2:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case 3:
        return "internal error - please report this issue to the NCCL developers";
    case 4:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case 5:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case 6:
        return "remote process exited or there was a network error";
    case 7:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t c)
{
    (void)c;
    return last;
}

static const char *my_bus(void)
{
    const char *lib = getenv("TORCHSPARK_LIBCUDA");
    void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
    const char *(*fn)(void) =
        h ? (const char *(*)(void))(uintptr_t)dlsym(h, "stub_cuda_current_bus") : NULL;
    return fn ? fn() : "";
}

/* Waits for fd to be ready, checking for an abort every 20 ms. */
static int wait_fd(comm_t *c, int fd, short ev)
{
    for (;;) {
        if (atomic_load(&c->aborted))
            return -1;
        struct pollfd p = {.fd = fd, .events = ev};
        int r = poll(&p, 1, 20);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static int io_all(comm_t *c, int fd, void *buf, size_t n, int writing)
{
    char *p = buf;
    while (n) {
        if (wait_fd(c, fd, writing ? POLLOUT : POLLIN))
            return -1;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

typedef struct {
    int32_t rank;
    char host[64], bus[32];
} hello_t;

typedef struct {
    int32_t status;
    char text[256];
} verdict_t;

static int resolve(comm_t *c, struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    if (getaddrinfo(c->addr, port, &hints, &res) != 0 || !res)
        return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static unsigned int do_init(comm_t *c)
{
    const char *fail = getenv("STUB_NCCL_INIT_FAIL");
    static char from_file[256];
    const char *ff = getenv("STUB_NCCL_FAIL_FILE"); /* the same, read from a file if it exists */
    FILE *f = ff ? fopen(ff, "r") : NULL;
    if (f) {
        if (fgets(from_file, sizeof from_file, f)) {
            from_file[strcspn(from_file, "\n")] = 0;
            fail = from_file;
        }
        fclose(f);
    }
    int mine = fail && (fail[0] == '*' || atoi(fail) == c->rank);
    if (mine && ff) { /* when the failure happened: FILE.stamp */
        char stamp[300];
        snprintf(stamp, sizeof stamp, "%s.stamp", ff);
        FILE *s = fopen(stamp, "w");
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (s) {
            fprintf(s, "%.6f\n", (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
            fclose(s);
        }
    }
    if (mine) {
        const char *a = strchr(fail, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        warn(c->rank, "%s", b ? b + 1 : "stub failure");
        return a ? (unsigned int)atoi(a + 1) : 2;
    }
    struct sockaddr_storage ss;
    socklen_t len;
    if (resolve(c, &ss, &len)) {
        warn(c->rank, "Invalid NCCL_COMM_ID [%s:%d], please use format: <ipv4>:<port>", c->addr,
             c->port);
        return 4;
    }
    hello_t me;
    memset(&me, 0, sizeof me);
    me.rank = c->rank;
    const char *h = getenv("STUB_NCCL_HOST");
    if (h && strcmp(h, "@agent") == 0) /* each agent (the check's parent) its own "host" */
        snprintf(me.host, sizeof me.host, "agent-%d", (int)getppid());
    else if (h)
        snprintf(me.host, sizeof me.host, "%s", h);
    else
        gethostname(me.host, sizeof me.host - 1);
    snprintf(me.bus, sizeof me.bus, "%s", c->bus);
    if (c->rank == 0) {
        int one = 1;
        c->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        setsockopt(c->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(c->lfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        if (bind(c->lfd, (struct sockaddr *)&ss, len) || listen(c->lfd, MAXR)) {
            warn(0, "Bootstrap : bind/listen on %s:%d failed: %s", c->addr, c->port,
                 strerror(errno));
            return 2;
        }
        hello_t all[MAXR];
        all[0] = me;
        for (int k = 1; k < c->nranks; k++) {
            if (wait_fd(c, c->lfd, POLLIN))
                return 2;
            int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
            hello_t in;
            if (fd < 0 || io_all(c, fd, &in, sizeof in, 0) || in.rank < 1 || in.rank >= c->nranks) {
                if (fd >= 0)
                    close(fd);
                k--;
                continue;
            }
            c->fd[in.rank] = fd;
            all[in.rank] = in;
        }
        verdict_t v = {0, ""};
        for (int a = 0; a < c->nranks && !v.status; a++)
            for (int b = 0; b < a && !v.status; b++)
                if (strcmp(all[a].host, all[b].host) == 0 && strcmp(all[a].bus, all[b].bus) == 0) {
                    v.status = 5;
                    snprintf(v.text, sizeof v.text,
                             "Duplicate GPU detected : rank %d and rank %d both on CUDA device %s",
                             a, b, all[a].bus);
                }
        for (int k = 1; k < c->nranks; k++)
            if (io_all(c, c->fd[k], &v, sizeof v, 1))
                return 6;
        if (v.status) {
            warn(0, "%s", v.text);
            return (unsigned int)v.status;
        }
        return 0;
    }
    for (;;) {
        if (atomic_load(&c->aborted))
            return 2;
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&ss, len) == 0) {
            c->fd[0] = fd;
            break;
        }
        close(fd);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    verdict_t v;
    if (io_all(c, c->fd[0], &me, sizeof me, 1) || io_all(c, c->fd[0], &v, sizeof v, 0))
        return atomic_load(&c->aborted) ? 2 : 6;
    if (v.status) {
        warn(c->rank, "%s", v.text);
        return (unsigned int)v.status;
    }
    return 0;
}

static unsigned int do_allreduce(comm_t *c)
{
    const char *hang = getenv("STUB_NCCL_ALLREDUCE_HANG");
    if (hang && *hang && atoi(hang) == c->rank) {
        while (!atomic_load(&c->aborted)) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        return 2;
    }
    size_t bytes = c->count * sizeof(float);
    if (c->rank != 0) {
        if (io_all(c, c->fd[0], (void *)c->send, bytes, 1) ||
            io_all(c, c->fd[0], c->recv, bytes, 0))
            return 6;
        return 0;
    }
    float *sum = malloc(bytes ? bytes : 1), *in = malloc(bytes ? bytes : 1);
    memcpy(sum, c->send, bytes);
    unsigned int rc = 0;
    for (int k = 1; k < c->nranks && !rc; k++) {
        if (io_all(c, c->fd[k], in, bytes, 0)) {
            rc = 6;
            break;
        }
        for (size_t i = 0; i < c->count; i++)
            sum[i] += in[i];
    }
    for (int k = 1; k < c->nranks && !rc; k++)
        if (io_all(c, c->fd[k], sum, bytes, 1))
            rc = 6;
    if (!rc)
        memcpy(c->recv, sum, bytes);
    free(sum);
    free(in);
    if (rc)
        warn(0, "NET/Socket : peer closed the connection");
    return rc;
}

/* Finalize flushes the communicator's work; non-blocking, it reports through the async state. */
static unsigned int do_finalize(comm_t *c)
{
    (void)c;
    usleep(2000);
    return 0;
}

static unsigned int run_op(comm_t *c)
{
    return c->op == 0 ? do_init(c) : c->op == 1 ? do_allreduce(c) : do_finalize(c);
}

static void *runner(void *arg)
{
    comm_t *c = arg;
    atomic_store(&c->async, (int)run_op(c));
    return NULL;
}

static void join(comm_t *c)
{
    if (c->has_thread) {
        pthread_join(c->th, NULL);
        c->has_thread = 0;
    }
}

static unsigned int start(comm_t *c, int op)
{
    join(c);
    c->op = op;
    if (c->blocking) {
        unsigned int rc = run_op(c);
        atomic_store(&c->async, (int)rc);
        return rc;
    }
    atomic_store(&c->async, 7);
    pthread_create(&c->th, NULL, runner, c);
    c->has_thread = 1;
    return op == 1 ? 0 : 7; /* init and finalize say ncclInProgress, as NCCL's do */
}

static unsigned int init(ncclComm_t *out, int n, ncclUniqueId id, int rank, int blocking)
{
    if (n < 1 || n > MAXR || rank < 0 || rank >= n)
        return 4;
    comm_t *c = calloc(1, sizeof *c);
    c->rank = rank;
    c->nranks = n;
    c->blocking = blocking;
    c->lfd = -1;
    for (int i = 0; i < MAXR; i++)
        c->fd[i] = -1;
    snprintf(c->bus, sizeof c->bus, "%s", my_bus());
    char *colon = strrchr(id.internal, ':');
    if (colon) {
        snprintf(c->addr, sizeof c->addr, "%.*s", (int)(colon - id.internal), id.internal);
        c->port = atoi(colon + 1);
    }
    *out = c;
    return start(c, 0);
}

unsigned int ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int rank)
{
    return init(c, n, id, rank, 1);
}

#ifndef STUB_NCCL_OLD
unsigned int ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int rank,
                                    ncclConfig_prefix *cfg)
{
    if (!cfg || cfg->magic != 0xcafebeefu)
        return 4;
    return init(c, n, id, rank, cfg->blocking);
}
#endif

unsigned int ncclCommGetAsyncError(ncclComm_t c, unsigned int *e)
{
    *e = (unsigned int)atomic_load(&c->async);
    return 0;
}

static void release(comm_t *c)
{
    join(c);
    for (int i = 0; i < MAXR; i++)
        if (c->fd[i] >= 0)
            close(c->fd[i]);
    if (c->lfd >= 0)
        close(c->lfd);
    free(c);
}

unsigned int ncclCommAbort(ncclComm_t c)
{
    if (!c)
        return 0;
    atomic_store(&c->aborted, 1);
    release(c);
    return 0;
}

/* As NCCL's ncclCommEnsureReady: a communicator whose last operation has not returned
 * ncclSuccess is refused with its WARN line and ncclInvalidArgument, and stays allocated. */
unsigned int ncclCommDestroy(ncclComm_t c)
{
    if (!c)
        return 0;
    if (atomic_load(&c->async) != 0) {
        warn(c->rank, "Attempt to use communicator before the previous operation returned "
                      "ncclSuccess");
        return 4;
    }
    release(c);
    return 0;
}

unsigned int ncclCommFinalize(ncclComm_t c)
{
    return c ? start(c, 2) : 4;
}

unsigned int ncclAllReduce(const void *s, void *r, size_t n, unsigned int dt, unsigned int op,
                           ncclComm_t c, void *stream)
{
    (void)stream;
    if (dt != 7 || op != 0)
        return 4;
    join(c);
    c->send = s;
    c->recv = r;
    c->count = n;
    return start(c, 1);
}
