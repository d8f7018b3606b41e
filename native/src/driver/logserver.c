/* logserver.c: the driver's log server: its options and line prefix, server events,
 * accepting agent connections (TCP keepalive), the one epoll thread for every agent
 * connection with its timeouts and the drain on shutdown, setup, and the host-facing
 * tsp_logserver_* API (docs/protocol.md, part 1). A connection's protocol lives in
 * logconn.c, the control channel in logctl.c, the queue in logqueue.c, the output
 * receiver in outrecv.c. */
#include "fdlimit.h"
#include "lines.h"
#include "logconn.h"
#include "logctl.h"
#include "lognodes.h"
#include "logsend.h"
#include "logwatch.h"
#include "reportagg.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The public header repeats the channel's constants without the internal headers. */
_Static_assert(TSP_WIRE_MAX_LINE == TSP_LOG_MAX_LINE, "line cap");
_Static_assert(TSP_STREAM_STDOUT == TSP_LOG_STREAM_STDOUT &&
                   TSP_STREAM_STDERR == TSP_LOG_STREAM_STDERR &&
                   TSP_STREAM_REPORT == TSP_LOG_STREAM_REPORT,
               "streams");
_Static_assert(TSP_LINE_CONTINUED == TSP_LOG_LINE_CONTINUED &&
                   TSP_LINE_NO_EOL == TSP_LOG_LINE_NO_EOL,
               "flags");

void tsp_logserver_opts_init(tsp_logserver_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->tail_lines = 100;
    o->tail_bytes = 64u * 1024u;
    o->queue_bytes = 8u << 20;
    o->sink_fd = -1;
    o->event_fd = 2;
    o->handshake_timeout_ms = 10000;
    o->lost_grace_ms = 1000;
}

size_t tsp_logserver_format_prefix(char *out, size_t outlen, const char *prefix,
                                   const char *stderr_marker, int32_t rank, unsigned stream)
{
    return tsp_lines_prefix(out, outlen, prefix, stderr_marker, rank, stream);
}

/* ---- accepting ------------------------------------------------------------------ */

static void keepalive(int fd)
{
    int one = 1, idle = TSP_WIRE_KEEPIDLE_S, intvl = TSP_WIRE_KEEPINTVL_S, cnt = TSP_WIRE_KEEPCNT;
    unsigned ut = TSP_WIRE_USER_TIMEOUT_MS;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
}

/* The connection before authentication to give up first, of one address (NULL: any): the
 * oldest that has not even sent its HELLO, else the oldest waiting for its AUTH (it knew
 * the run id). New ones are pushed at the head, so the oldest is the last in the list.
 * *count: how many there are. */
static conn_t *oldest_unauth(tsp_logserver_t *s, const char *addr, size_t *count)
{
    conn_t *hello = NULL, *auth = NULL;
    *count = 0;
    for (conn_t *c = s->conns; c; c = c->next) {
        if (c->state >= C_OPEN || (addr && strcmp(c->addr, addr) != 0))
            continue;
        if (c->state <= C_HELLO) /* C_TLS or C_HELLO: it has not shown it knows the run */
            hello = c;
        else
            auth = c;
        (*count)++;
    }
    return hello ? hello : auth;
}

/* Whether c, not authenticated yet, has had UNAUTH_GRACE_MS for its handshake. */
static int past_grace(const tsp_logserver_t *s, const conn_t *c)
{
    return c->deadline - s->o.handshake_timeout_ms + UNAUTH_GRACE_MS <= tsp__now_ms();
}

/* Room for one more unauthenticated connection from addr: the oldest over a cap goes, once
 * past its grace (a storm's handshakes are under way, not idle). */
static void make_room(tsp_logserver_t *s, const char *addr)
{
    size_t n;
    conn_t *old;
    if (s->nunauth >= UNAUTH_PER_ADDR && (old = oldest_unauth(s, addr, &n)) &&
        n >= UNAUTH_PER_ADDR && past_grace(s, old))
        tsp__conn_reject(s, old, "too many connections from its address before authentication");
    if (s->nunauth >= UNAUTH_MAX && (old = oldest_unauth(s, NULL, &n)) && past_grace(s, old))
        tsp__conn_reject(s, old, "too many connections before authentication");
}

/* accept() failed (errno e) for want of a resource. Out of descriptors, the oldest
 * unauthenticated connection makes room (1: try again); otherwise the listener rests
 * ACCEPT_PAUSE_MS (sweep() puts it back), since it stays readable and polling it again at
 * once would spin. */
static int accept_failed(tsp_logserver_t *s, int e)
{
    size_t n;
    conn_t *old = e == EMFILE || e == ENFILE ? oldest_unauth(s, NULL, &n) : NULL;
    if (old) {
        tsp__conn_reject(s, old, "the driver is out of file descriptors");
        return 1;
    }
    epoll_ctl(s->efd, EPOLL_CTL_DEL, s->lfd, NULL);
    s->accept_paused_until = tsp__now_ms() + ACCEPT_PAUSE_MS;
    tsp__event_preauth(s,
                       "torchspark log server: cannot accept connections: %s%s; not accepting "
                       "for %d ms",
                       strerror(e),
                       e == EMFILE || e == ENFILE ? " (raise the limit with ulimit -n)" : "",
                       ACCEPT_PAUSE_MS);
    return 0;
}

static void peer_name(conn_t *c, const struct sockaddr_storage *ss)
{
    int port = 0;
    snprintf(c->addr, sizeof(c->addr), "?");
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, c->addr, sizeof(c->addr));
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, c->addr, sizeof(c->addr));
        port = ntohs(a->sin6_port);
    }
    snprintf(c->peer, sizeof(c->peer), "%s:%d", c->addr, port);
}

static void do_accept(tsp_logserver_t *s)
{
    /* A few at a time: the handshakes of those accepted are read between two batches, so
     * that a flood waiting in the backlog does not evict them before their HELLO is read. */
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        size_t n;
        conn_t *old;
        if (s->nunauth >= UNAUTH_MAX &&
            (!(old = oldest_unauth(s, NULL, &n)) || !past_grace(s, old))) {
            /* Every slot in a handshake still in its grace: the backlog waits (sweep()). */
            epoll_ctl(s->efd, EPOLL_CTL_DEL, s->lfd, NULL);
            s->accept_paused_until = tsp__now_ms() + ACCEPT_WAIT_MS;
            return;
        }
        struct sockaddr_storage ss = {0};
        socklen_t sl = sizeof(ss);
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && accept_failed(s, errno))
                continue;
            return;
        }
        conn_t *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        if (tsp__tls_new(&c->tls, s->tls, fd)) {
            close(fd);
            free(c);
            continue;
        }
        c->fd = fd;
        c->state = C_TLS;
        c->deadline = tsp__now_ms() + s->o.handshake_timeout_ms;
        peer_name(c, &ss);
        make_room(s, c->addr);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        keepalive(fd);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            tsp__tls_free(c->tls);
            close(fd);
            free(c);
            continue;
        }
        c->registered = 1;
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->nunauth++;
        pthread_mutex_lock(&s->q.mu);
        s->q.st.accepted++;
        s->q.st.connected++;
        pthread_mutex_unlock(&s->q.mu);
    }
}

/* ---- the thread ------------------------------------------------------------------ */

/* Timeouts: handshakes, lingering closes, and the drain deadline. Returns the epoll
 * timeout until the next of them (-1: none). */
static int sweep(tsp_logserver_t *s, int draining, int64_t drain_deadline)
{
    int64_t now = tsp__now_ms(), next = -1;
    int drain_over = draining && now >= drain_deadline;
    if (s->accept_paused_until && s->lfd >= 0) {
        if (now >= s->accept_paused_until) {
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->lfd};
            epoll_ctl(s->efd, EPOLL_CTL_ADD, s->lfd, &ev);
            s->accept_paused_until = 0;
        } else {
            next = s->accept_paused_until;
        }
    }
    for (conn_t *c = s->conns, *n; c; c = n) {
        n = c->next;
        if (c->state == C_OPEN && drain_over)
            tsp__conn_goodbye(s, c);
        if (c->state == C_OPEN)
            continue;
        if (now >= c->deadline) {
            if (c->state == C_LINGER)
                tsp__conn_free(s, c);
            else
                tsp__conn_reject(s, c, "the handshake did not complete in time");
            continue;
        }
        if (next < 0 || c->deadline < next)
            next = c->deadline;
    }
    if (draining && !drain_over && (next < 0 || drain_deadline < next))
        next = drain_deadline;
    int64_t silent_next = tsp__silent_sweep(s, now);
    if (silent_next >= 0 && (next < 0 || silent_next < next))
        next = silent_next;
    int64_t lost_next = tsp__lost_sweep(s, now);
    if (lost_next >= 0 && (next < 0 || lost_next < next))
        next = lost_next;
    int64_t watch_next = tsp__watch_sweep(s, now);
    if (watch_next >= 0 && (next < 0 || watch_next < next))
        next = watch_next;
    return next < 0 ? -1 : (int)(next - now + 1);
}

static void *server_main(void *arg)
{
    tsp_logserver_t *s = arg;
    struct epoll_event evs[64];
    int timeout = -1;
    for (;;) {
        int n = epoll_wait(s->efd, evs, 64, timeout);
        if (n < 0 && errno != EINTR)
            break;
        /* The listener last: accepting may evict (free) an unauthenticated connection
         * whose event is still further on in evs. */
        int accept_now = 0;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &s->lfd) {
                accept_now = 1;
            } else if (p == &s->wake_fd) {
                uint64_t v;
                ssize_t r = read(s->wake_fd, &v, sizeof(v));
                (void)r; /* only resets the eventfd */
                tsp__resume_all(s);
                tsp__conn_kick_pending(s);
                tsp__output_failed(s);
                pthread_mutex_lock(&s->ctl_mu);
                int stop = s->stop_req;
                char text[STOP_TEXT_MAX];
                memcpy(text, s->stop_req_text, sizeof(text));
                s->stop_req = 0;
                uint32_t dump = s->dump_req;
                s->dump_req = 0;
                struct tsp__watch *watch = s->watch_req;
                s->watch_req = NULL;
                int checkpoint = s->checkpoint_req;
                s->checkpoint_req = 0;
                pthread_mutex_unlock(&s->ctl_mu);
                if (watch)
                    tsp__watch_adopt(s, watch);
                if (checkpoint)
                    tsp__checkpoint_everyone(s, (uint8_t)checkpoint);
                if (stop)
                    tsp__stop_everyone(s, TSP_WIRE_STOP_ENDED, 0, text);
                if (dump)
                    tsp__dump_everyone(s, dump);
            } else {
                conn_t *c = p;
                if (c->state == C_TLS) { /* the handshake: one step for either readiness */
                    tsp__conn_read(s, c);
                    continue;
                }
                if ((evs[i].events & EPOLLOUT) && (c->wlen || c->tls_out))
                    tsp__conn_flush(s, c);
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                    tsp__conn_read(s, c);
            }
        }
        if (accept_now && s->lfd >= 0)
            do_accept(s);
        if (s->sink_len)
            tsp__sink_flush(s);
        pthread_mutex_lock(&s->ctl_mu);
        int draining = s->draining;
        int64_t dl = s->drain_deadline;
        pthread_mutex_unlock(&s->ctl_mu);
        s->t_draining = draining;
        if (draining && s->lfd >= 0) {
            if (!s->accept_paused_until)
                epoll_ctl(s->efd, EPOLL_CTL_DEL, s->lfd, NULL);
            close(s->lfd);
            s->lfd = -1;
        }
        timeout = sweep(s, draining, dl);
        if (draining && !s->conns)
            break;
    }
    if (s->sink_len)
        tsp__sink_flush(s);
    while (s->conns)
        tsp__conn_free(s, s->conns);
    tsp__logq_end(&s->q);
    tsp__logq_end(&s->rq);
    pthread_mutex_lock(&s->ctl_mu);
    s->ended = 1;
    pthread_cond_broadcast(&s->fail_cv);
    pthread_mutex_unlock(&s->ctl_mu);
    return NULL;
}

/* ---- setup and the host-facing API ------------------------------------------------ */

static int bind_listen(tsp_logserver_t *s, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", s->o.port);
    int rc = getaddrinfo(s->host, port, &hints, &res);
    if (rc) {
        return tsp__err(err, errlen, -EADDRNOTAVAIL, "cannot resolve the log server address %s: %s",
                        s->host, gai_strerror(rc));
    }
    int e = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 4096) == 0) {
            struct sockaddr_storage ss = {0};
            socklen_t sl = sizeof(ss);
            getsockname(fd, (struct sockaddr *)&ss, &sl);
            /* NOLINTNEXTLINE(clang-analyzer-core.CallAndMessage): getsockname() filled it */
            s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                    : ((struct sockaddr_in6 *)&ss)->sin6_port);
            s->lfd = fd;
            freeaddrinfo(res);
            return 0;
        }
        e = errno;
        close(fd);
    }
    freeaddrinfo(res);
    snprintf(err, errlen, "cannot listen on %s:%d for the log channel: %s", s->host, s->o.port,
             strerror(e));
    return -e;
}

/* A report record the puller dropped (reportagg.c, docs/protocol.md 1.8): one event. */
static void report_dropped(void *ctx, int32_t rank, const char *why)
{
    tsp__event(ctx, "a torchspark.report() record of rank %d was dropped: %s", (int)rank, why);
}

static int server_setup(tsp_logserver_t *s, const tsp_logserver_opts_t *o, char *err, size_t errlen)
{
    s->o = *o;
    snprintf(s->host, sizeof(s->host), "%s", o->host && *o->host ? o->host : "127.0.0.1");
    snprintf(s->prefix, sizeof(s->prefix), "%s", o->prefix ? o->prefix : TSP_LINES_PREFIX);
    snprintf(s->marker, sizeof(s->marker), "%s",
             o->stderr_marker ? o->stderr_marker : TSP_LINES_STDERR_MARKER);
    if (s->o.handshake_timeout_ms <= 0)
        s->o.handshake_timeout_ms = 10000;
    if (o->secret)
        memcpy(s->secret, o->secret, TSP_WIRE_SECRET_LEN);
    else if (tsp__random_bytes(s->secret, TSP_WIRE_SECRET_LEN))
        return tsp__err(err, errlen, -EIO, "no random bytes for the log secret");
    if (tsp_wire_run_id(s->secret, s->run_id))
        return tsp__err(err, errlen, -EIO, "SHA-256 failed");
    tsp__fdlimit_raise(); /* a connection per node: as many as the process may (fdlimit.c) */
    if (!(s->ragg = tsp__ragg_new(TSP_REPORT_BUDGET)))
        return tsp__err(err, errlen, -ENOMEM, "no memory for the log server");
    s->ragg->on_drop = report_dropped;
    s->ragg->ctx = s;
    int rc = tsp__tlsctx_new(&s->tls, 1, s->secret, err, errlen);
    if (rc || (rc = bind_listen(s, err, errlen)))
        return rc;
    s->efd = epoll_create1(EPOLL_CLOEXEC);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0 || s->wake_fd < 0)
        return tsp__err(err, errlen, -errno, "epoll/eventfd: %s", strerror(errno));
    struct epoll_event e1 = {.events = EPOLLIN, .data.ptr = &s->lfd};
    struct epoll_event e2 = {.events = EPOLLIN, .data.ptr = &s->wake_fd};
    epoll_ctl(s->efd, EPOLL_CTL_ADD, s->lfd, &e1);
    epoll_ctl(s->efd, EPOLL_CTL_ADD, s->wake_fd, &e2);
    size_t qb = o->queue_bytes ? o->queue_bytes : (8u << 20);
    if ((rc = tsp__logq_init(&s->q, qb, o->tail_lines, o->tail_bytes ? o->tail_bytes : 65536,
                             s->wake_fd)) ||
        (rc = tsp__logq_init(&s->rq, qb, 0, 0, s->wake_fd)) ||
        (rc = tsp__outrecv_init(&s->out, s->wake_fd)))
        return tsp__err(err, errlen, rc, "cannot init the log server: %s", tsp_strerror(rc));
    memcpy(s->out.secret, s->secret, TSP_WIRE_SECRET_LEN);
    pthread_mutex_init(&s->ctl_mu, NULL);
    tsp__cond_init_mono(&s->fail_cv);
    if (s->o.lost_grace_ms < 0)
        s->o.lost_grace_ms = 0;
    if ((rc = pthread_create(&s->thread, NULL, server_main, s)))
        return tsp__err(err, errlen, -rc, "cannot start the log server thread: %s", strerror(rc));
    s->started = 1;
    return 0;
}

tsp_logserver_t *tsp_logserver_start(const tsp_logserver_opts_t *o, char *err, size_t errlen)
{
    if (o->port < 0 || o->port > 65535) { /* else 70000 would bind 4464 */
        snprintf(err, errlen, "port must be 0..65535, got %d", o->port);
        return NULL;
    }
    tsp_logserver_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->lfd = s->efd = s->wake_fd = -1;
    if (server_setup(s, o, err, errlen)) {
        if (s->lfd >= 0)
            close(s->lfd);
        if (s->efd >= 0)
            close(s->efd);
        if (s->wake_fd >= 0)
            close(s->wake_fd);
        tsp__tlsctx_free(s->tls);
        tsp__ragg_free(s->ragg); /* NULL-safe: set up before the bind that may fail */
        free(s);
        return NULL;
    }
    return s;
}

tsp_logserver_t *tsp_logserver_new(const char *host, int port, const char *secret_hex,
                                   unsigned tail_lines, char *err, size_t errlen)
{
    tsp_logserver_opts_t o;
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    tsp_logserver_opts_init(&o);
    o.host = host;
    o.port = port;
    if (tail_lines)
        o.tail_lines = tail_lines;
    if (secret_hex) {
        if (tsp_wire_secret_parse(secret_hex, secret)) {
            snprintf(err, errlen, "the log secret must be 64 hex digits");
            return NULL;
        }
        o.secret = secret;
    }
    return tsp_logserver_start(&o, err, errlen);
}

int tsp_logserver_port(const tsp_logserver_t *s)
{
    return s->port;
}
const char *tsp_logserver_host(const tsp_logserver_t *s)
{
    return s->host;
}
void tsp_logserver_secret(const tsp_logserver_t *s, uint8_t out[TSP_WIRE_SECRET_LEN])
{
    memcpy(out, s->secret, TSP_WIRE_SECRET_LEN);
}

int tsp_logserver_pull_reports(tsp_logserver_t *s, tsp_logline_t *out, int max_reports,
                               int timeout_ms)
{
    return max_reports <= 0 ? -EINVAL
                            : tsp__ragg_pull(s->ragg, &s->rq, out, max_reports, timeout_ms);
}

void tsp_logserver_report_budget(tsp_logserver_t *s, double per_s)
{
    s->ragg->budget = per_s;
}

int tsp_logserver_pull(tsp_logserver_t *s, tsp_logline_t *out, int max_lines, int timeout_ms)
{
    return max_lines <= 0 ? -EINVAL : tsp__logq_pull(&s->q, out, max_lines, timeout_ms);
}

long tsp_logserver_pull_text(tsp_logserver_t *s, char *buf, size_t buflen, int max_lines,
                             int timeout_ms, const char *prefix, const char *stderr_marker,
                             int *nlines)
{
    int dummy;
    *(nlines ? nlines : &dummy) = 0;
    if (max_lines <= 0 || !buf || buflen < TSP_LOGSERVER_TEXT_MIN)
        return -EINVAL;
    return tsp__logq_pull_text(&s->q, buf, buflen, max_lines, timeout_ms, prefix, stderr_marker,
                               nlines ? nlines : &dummy);
}

long tsp_logserver_tail(tsp_logserver_t *s, int rank, int n, char *buf, size_t buflen)
{
    return tsp__logq_tail(&s->q, rank, n, buf, buflen);
}

int tsp_logserver_dropped(tsp_logserver_t *s, int32_t *ranks, uint64_t *counts, int max)
{
    return tsp__logq_dropped(&s->q, ranks, counts, max);
}

void tsp_logserver_stats(tsp_logserver_t *s, tsp_logserver_stats_t *st)
{
    pthread_mutex_lock(&s->q.mu);
    *st = s->q.st;
    st->queued_bytes = s->q.bytes;
    pthread_mutex_unlock(&s->q.mu);
}

int tsp_logserver_expect_output(tsp_logserver_t *s, const char *path)
{
    return tsp__outrecv_expect(&s->out, path);
}

int tsp_logserver_output_limit(tsp_logserver_t *s, const char *max_result_size, char *err,
                               size_t errlen)
{
    return tsp__outrecv_limit(&s->out, max_result_size, err, errlen);
}

int tsp_logserver_encryption(tsp_logserver_t *s, int on)
{
    if (on != 0 && on != 1)
        return -EINVAL;
    tsp__tlsctx_set_modes(s->tls, on ? TSP__TLS_ENCRYPT : TSP__TLS_MAC);
    return 0;
}

int tsp_logserver_output_wait(tsp_logserver_t *s, int timeout_ms)
{
    return tsp__outrecv_wait(&s->out, timeout_ms);
}

int tsp_logserver_output_data(tsp_logserver_t *s, const void **data, uint64_t *len)
{
    pthread_mutex_lock(&s->out.mu);
    int ok = s->out.state == TSP__OUT_OK;
    *data = ok ? s->out.mem : NULL;
    *len = ok ? s->out.total : 0;
    pthread_mutex_unlock(&s->out.mu);
    return ok ? 0 : -ENOENT;
}

const char *tsp_logserver_output_error(tsp_logserver_t *s)
{
    pthread_mutex_lock(&s->out.mu);
    memcpy(s->out.err_copy, s->out.err, sizeof(s->out.err_copy));
    pthread_mutex_unlock(&s->out.mu);
    return s->out.err_copy;
}

long tsp_logserver_failure(tsp_logserver_t *s, char *buf, size_t buflen, int timeout_ms)
{
    struct timespec dl;
    if (timeout_ms > 0)
        tsp__deadline_in(&dl, timeout_ms);
    pthread_mutex_lock(&s->ctl_mu);
    while (!s->root && !s->ended && s->started && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->fail_cv, &s->ctl_mu);
        else if (pthread_cond_timedwait(&s->fail_cv, &s->ctl_mu, &dl) == ETIMEDOUT)
            break;
    }
    long need = 0;
    if (s->root) {
        size_t n = strlen(s->root);
        need = (long)n;
        if (buf && buflen) {
            size_t k = n < buflen - 1 ? n : buflen - 1;
            memcpy(buf, s->root, k);
            buf[k] = 0;
        }
    } else if (buf && buflen) {
        buf[0] = 0;
    }
    pthread_mutex_unlock(&s->ctl_mu);
    return need;
}

int tsp_logserver_lost_pending(tsp_logserver_t *s)
{
    pthread_mutex_lock(&s->ctl_mu);
    int n = s->ended ? 0 : s->lost_pending;
    pthread_mutex_unlock(&s->ctl_mu);
    return n;
}

int tsp_logserver_nodes_lost(tsp_logserver_t *s, int32_t *ranks, int max)
{
    pthread_mutex_lock(&s->ctl_mu);
    int n = (int)s->ngone;
    for (int i = 0; ranks && i < n && i < max; i++)
        ranks[i] = s->gone[i];
    pthread_mutex_unlock(&s->ctl_mu);
    return n;
}

/* Wakes the epoll thread to look at what a caller changed under ctl_mu. */
static void wake_loop(tsp_logserver_t *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof(one));
    (void)w;
}

int tsp_logserver_stop_all(tsp_logserver_t *s, const char *text)
{
    pthread_mutex_lock(&s->ctl_mu);
    int ended = s->ended || s->joined;
    if (!ended) {
        s->stop_req = 1;
        snprintf(s->stop_req_text, sizeof(s->stop_req_text), "%s",
                 text && *text ? text : "the driver ended the run");
    }
    pthread_mutex_unlock(&s->ctl_mu);
    if (ended)
        return -EPIPE;
    wake_loop(s);
    return 0;
}

int tsp_logserver_dump_all(tsp_logserver_t *s)
{
    pthread_mutex_lock(&s->ctl_mu);
    int ended = s->ended || s->joined;
    uint32_t request = 0;
    if (!ended)
        request = s->dump_req = ++s->dump_seq;
    pthread_mutex_unlock(&s->ctl_mu);
    if (ended)
        return -EPIPE;
    wake_loop(s);
    return (int)request;
}

int tsp_logserver_watch(tsp_logserver_t *s, long timeout_ms, const char *action, int world,
                        const char *tmpdir, char *err, size_t errlen)
{
    struct tsp__watch *w = tsp__watch_new(timeout_ms, action, world, tmpdir, err, errlen);
    if (!w)
        return -EINVAL;
    pthread_mutex_lock(&s->ctl_mu);
    int ended = s->ended || s->joined;
    if (!ended) {
        tsp__watch_free(s->watch_req);
        s->watch_req = w;
    }
    pthread_mutex_unlock(&s->ctl_mu);
    if (ended) {
        tsp__watch_free(w);
        return tsp__err(err, errlen, -EPIPE, "the log server has already stopped");
    }
    pthread_mutex_lock(&s->q.mu); /* a dump must fit in each rank's tail (tails grow lazily) */
    if (s->q.tail_lines < TSP_LOGSERVER_HANG_TAIL)
        s->q.tail_lines = TSP_LOGSERVER_HANG_TAIL;
    pthread_mutex_unlock(&s->q.mu);
    wake_loop(s);
    return 0;
}

int tsp_logserver_checkpoint_all(tsp_logserver_t *s, int why)
{
    if (why < 1 || why > 255)
        return -EINVAL;
    pthread_mutex_lock(&s->ctl_mu);
    int ended = s->ended || s->joined;
    if (!ended)
        s->checkpoint_req = why;
    pthread_mutex_unlock(&s->ctl_mu);
    if (ended)
        return -EPIPE;
    wake_loop(s);
    return 0;
}

long tsp_logserver_hang_event(tsp_logserver_t *s, char *buf, size_t buflen, int timeout_ms)
{
    struct timespec dl;
    if (timeout_ms > 0)
        tsp__deadline_in(&dl, timeout_ms);
    pthread_mutex_lock(&s->ctl_mu);
    while (s->hang_next == s->hang_n && !s->ended && s->started && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->fail_cv, &s->ctl_mu);
        else if (pthread_cond_timedwait(&s->fail_cv, &s->ctl_mu, &dl) == ETIMEDOUT)
            break;
    }
    long need = 0;
    if (s->hang_next < s->hang_n) {
        const char *ev = s->hang_ev[s->hang_next];
        need = (long)strlen(ev);
        if (buf && (size_t)need < buflen) {
            memcpy(buf, ev, (size_t)need + 1);
            s->hang_next++;
        }
    } else if (s->ended || !s->started) {
        need = -EPIPE;
    }
    pthread_mutex_unlock(&s->ctl_mu);
    return need;
}

int tsp_logserver_shutdown(tsp_logserver_t *s, int drain_timeout_ms)
{
    if (!s->started || s->joined)
        return 0;
    pthread_mutex_lock(&s->ctl_mu);
    if (!s->draining) {
        s->draining = 1;
        s->drain_deadline = tsp__now_ms() + (drain_timeout_ms > 0 ? drain_timeout_ms : 0);
    }
    pthread_mutex_unlock(&s->ctl_mu);
    wake_loop(s);
    pthread_join(s->thread, NULL);
    s->joined = 1;
    return 0;
}

void tsp_logserver_free(tsp_logserver_t *s)
{
    if (!s)
        return;
    tsp_logserver_shutdown(s, 0);
    if (s->lfd >= 0)
        close(s->lfd);
    close(s->efd);
    close(s->wake_fd);
    tsp__logq_close(&s->q);
    tsp__logq_close(&s->rq);
    tsp__ragg_free(s->ragg);
    tsp__outrecv_close(&s->out);
    tsp__tlsctx_free(s->tls);
    pthread_mutex_destroy(&s->ctl_mu);
    pthread_cond_destroy(&s->fail_cv);
    free(s->root);
    tsp__watch_free(s->watch_req);
    tsp__watch_free(s->watch);
    for (size_t i = 0; i < s->hang_n; i++)
        free(s->hang_ev[i]);
    free(s->hang_ev);
    free(s->lost);
    free(s->gone);
    tsp__nodes_free(s);
    free(s->agents);
    free(s->sink);
    free(s);
}
