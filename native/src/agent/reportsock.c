/* reportsock.c: the agent's report socket (docs/protocol.md 1.8; reportsock.h). */
#include "reportsock.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define HELLO "TSPR1 "

typedef struct rconn {
    int fd;     /* -1: free slot */
    int named;  /* the hello line was read */
    int paused; /* the sink was full: out of epoll until resumed */
    int local_rank;
    tsp_lines_t lines;
} rconn_t;

struct tsp_reports {
    int epfd, lfd, log_fd;
    uint64_t tag;
    tsp_line_sink_t *sink;
    const tsp_topo_t *topo;
    rconn_t *c;
    size_t nc;
    int warned_idle; /* tsp_reports_close_idle said so once */
    char dir[108];
    char path[108];
};

static void say(const tsp_reports_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const tsp_reports_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tsp__log_linev(r->log_fd, "torchspark: report socket: ", fmt, ap);
    va_end(ap);
}

/* A directory of our own: TMP_DIR/tspr-XXXXXX, /tmp when there is none or it would not fit. */
static int make_dir(tsp_reports_t *r, const char *tmp_dir)
{
    const char *base = tmp_dir;
    if (!base || !*base || strlen(base) + sizeof "/tspr-XXXXXX/r.sock" > sizeof r->path)
        base = "/tmp";
    snprintf(r->dir, sizeof r->dir, "%s/tspr-XXXXXX", base);
    if (!mkdtemp(r->dir)) {
        r->dir[0] = 0;
        return -errno;
    }
    snprintf(r->path, sizeof r->path, "%s/r.sock", r->dir);
    return 0;
}

int tsp_reports_open(tsp_reports_t **out, int epfd, uint64_t tag, tsp_line_sink_t *sink,
                     const tsp_topo_t *topo, const char *tmp_dir, int log_fd, char *err,
                     size_t errlen)
{
    *out = NULL;
    tsp_reports_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->epfd = epfd;
    r->tag = tag;
    r->sink = sink;
    r->topo = topo;
    r->log_fd = log_fd;
    r->lfd = -1;
    int rc = make_dir(r, tmp_dir);
    if (rc) {
        snprintf(err, errlen, "cannot create a directory for the report socket: %s", strerror(-rc));
        goto fail;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r->path);
    r->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        listen(r->lfd, 128) < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, r->lfd, &ev) < 0) {
        rc = -errno;
        snprintf(err, errlen, "cannot listen on %s: %s", r->path, strerror(errno));
        goto fail;
    }
    *out = r;
    return 0;
fail:
    tsp_reports_close(r);
    return rc;
}

const char *tsp_reports_path(const tsp_reports_t *r)
{
    return r->path;
}

int tsp_reports_owns(const tsp_reports_t *r, uint64_t tag)
{
    return r && tag >= r->tag && tag <= r->tag + r->nc;
}

static void conn_close(tsp_reports_t *r, rconn_t *c)
{
    if (c->fd < 0)
        return;
    if (!c->paused)
        epoll_ctl(r->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    tsp_lines_close(&c->lines);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

static void do_accept(tsp_reports_t *r)
{
    for (;;) {
        int fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            return; /* EAGAIN, or a transient error: the next connection retries */
        size_t i = 0;
        while (i < r->nc && r->c[i].fd >= 0)
            i++;
        if (i == r->nc) {
            size_t n = r->nc ? 2 * r->nc : 8;
            rconn_t *nc = realloc(r->c, n * sizeof *nc);
            if (!nc) {
                close(fd);
                return;
            }
            for (size_t k = r->nc; k < n; k++)
                nc[k] = (rconn_t){.fd = -1};
            r->c = nc;
            r->nc = n;
        }
        rconn_t *c = &r->c[i];
        *c = (rconn_t){.fd = fd, .local_rank = -1};
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = r->tag + 1 + i};
        if (tsp_lines_init(&c->lines, TSP_LINES_DEFAULT_CAP) ||
            epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            tsp_lines_close(&c->lines);
            close(fd);
            *c = (rconn_t){.fd = -1};
        }
    }
}

/* The hello line: "TSPR1 <local_rank>" with a rank of this agent. */
static int take_hello(tsp_reports_t *r, rconn_t *c, const char *d, size_t len)
{
    size_t hl = sizeof HELLO - 1;
    int lr = 0;
    size_t i = hl;
    if (len <= hl || len > hl + 7 || memcmp(d, HELLO, hl) != 0)
        goto bad;
    for (; i < len; i++) {
        if (d[i] < '0' || d[i] > '9')
            goto bad;
        lr = lr * 10 + (d[i] - '0');
    }
    if (lr >= r->topo->nproc_per_node)
        goto bad;
    c->local_rank = lr;
    c->named = 1;
    return 0;
bad:
    say(r,
        "a connection did not name one of this agent's %d workers (first line '%.*s'): "
        "closed",
        r->topo->nproc_per_node, (int)(len > 40 ? 40 : len), d);
    return -EPROTO;
}

/* Hands every complete record on. 0; -EAGAIN paused; -EPROTO closed. */
static int drain(tsp_reports_t *r, rconn_t *c, size_t slot)
{
    const char *d;
    size_t len;
    unsigned flags;
    while (tsp_lines_peek(&c->lines, &d, &len, &flags)) {
        if (!c->named) {
            if (take_hello(r, c, d, len)) {
                conn_close(r, c);
                return -EPROTO;
            }
        } else {
            tsp_line_t line = {.rank = tsp_topo_global_rank(r->topo, c->local_rank),
                               .local_rank = c->local_rank,
                               .stream = TSP_STREAM_REPORT,
                               .flags = (uint8_t)flags,
                               .data = d,
                               .len = len};
            if (r->sink->write_line(r->sink->ctx, &line) == -EAGAIN) {
                if (!c->paused) {
                    c->paused = 1;
                    epoll_ctl(r->epfd, EPOLL_CTL_DEL, c->fd, NULL);
                }
                return -EAGAIN;
            }
        }
        tsp_lines_consume(&c->lines);
    }
    if (c->paused && !tsp_lines_done(&c->lines)) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = r->tag + 1 + slot};
        epoll_ctl(r->epfd, EPOLL_CTL_ADD, c->fd, &ev);
    }
    c->paused = 0;
    if (tsp_lines_done(&c->lines))
        conn_close(r, c);
    return 0;
}

int tsp_reports_event(tsp_reports_t *r, uint64_t tag)
{
    if (tag == r->tag) {
        do_accept(r);
        return 0;
    }
    size_t slot = (size_t)(tag - r->tag - 1);
    if (slot >= r->nc)
        return 0;
    rconn_t *c = &r->c[slot];
    for (int i = 0; i < 8 && c->fd >= 0 && !c->paused; i++) {
        long n = tsp_lines_read(&c->lines, c->fd);
        if (n == -EAGAIN)
            break;
        if (n < 0 && n != -ENOBUFS)
            tsp_lines_finish(&c->lines); /* a reset ends the stream */
        int rc = drain(r, c, slot);
        if (rc)
            return rc == -EAGAIN ? rc : 0;
        if (n == 0)
            break;
    }
    return 0;
}

int tsp_reports_resume(tsp_reports_t *r)
{
    int still = 0;
    for (size_t i = 0; r && i < r->nc; i++)
        if (r->c[i].fd >= 0 && r->c[i].paused && drain(r, &r->c[i], i) == -EAGAIN)
            still = 1;
    return still ? -EAGAIN : 0;
}

int tsp_reports_pending(const tsp_reports_t *r)
{
    for (size_t i = 0; r && i < r->nc; i++)
        if (r->c[i].fd >= 0)
            return 1;
    return 0;
}

int tsp_reports_close_idle(tsp_reports_t *r, int grace_ms)
{
    int n = 0;
    for (size_t i = 0; r && i < r->nc; i++)
        if (r->c[i].fd >= 0 && !r->c[i].paused) {
            conn_close(r, &r->c[i]);
            n++;
        }
    if (n && !r->warned_idle) {
        r->warned_idle = 1;
        say(r,
            "%d connection(s) still open %d ms after this agent's last worker ended (a process "
            "that is not one of its workers, or one that outlived them): closed, so that the "
            "agent can exit",
            n, grace_ms);
    }
    return n;
}

void tsp_reports_close(tsp_reports_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nc; i++)
        conn_close(r, &r->c[i]);
    free(r->c);
    if (r->lfd >= 0)
        close(r->lfd);
    if (r->path[0])
        unlink(r->path);
    if (r->dir[0])
        rmdir(r->dir);
    free(r);
}
