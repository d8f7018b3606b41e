/* logserver.c: the driver's log server: one epoll thread for every agent connection,
 * the authenticated handshake, frame dispatch, acknowledgements, backpressure and the
 * drain on shutdown (docs/protocol.md, part 1). The queue lives in logqueue.c, the
 * output receiver in outrecv.c. */
#include "logserver_int.h"

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

#include "torchspark/json.h"
#include "torchspark/lines.h"

#define CONN_BUF_MIN (64u * 1024u)
#define LINGER_MS 2000 /* after CLOSE: wait for the agent to take the final ACK */
#define SINK_FLUSH (64u * 1024u)
/* TCP keepalive of accepted sockets (protocol 1.7): a silent peer is dead after ~5 s. */
#define KEEPIDLE_S 2
#define KEEPINTVL_S 1
#define KEEPCNT 3
#define USER_TIMEOUT_MS 5000
#define STOP_TEXT_MAX 400

enum { C_HELLO, C_AUTH, C_OPEN, C_LINGER };

typedef struct agent_rec {
    uint64_t id;
    uint64_t seq; /* highest seq delivered */
} agent_rec_t;

typedef struct conn {
    struct conn *next, *prev;
    int fd;
    int state;
    int paused;   /* EPOLLIN off: the queue is full */
    int want_out; /* EPOLLOUT on: wbuf has bytes */
    int registered; /* in the epoll set */
    uint8_t *buf;
    size_t cap, len;
    uint32_t chunk_left; /* OUT_CHUNK payload bytes still to read straight from the socket */
    uint8_t wbuf[2048];
    size_t wlen;
    uint8_t hello[TSP_WIRE_HELLO_MAX];
    size_t hello_len;
    uint8_t nonce_s[TSP_WIRE_NONCE_LEN];
    tsp_wire_hello_t h;
    size_t agent; /* index into agents */
    uint64_t acked;
    int64_t deadline; /* handshake or linger deadline (ms, monotonic) */
    int control;      /* CONTROL granted (protocol 1.7) */
    int stop_sent;
    char peer[80];
} conn_t;

/* A LOGS connection that ended without CLOSE: lost unless its agent is back in time. */
typedef struct lost_rec {
    uint64_t agent_id;
    int node_rank;
    int64_t deadline;
    char host[256];
    char peer[80];
    char why[120];
} lost_rec_t;

struct tsp_logserver {
    tsp_logserver_opts_t o;
    char host[256];
    char prefix[128];
    char marker[64];
    int port;
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    uint8_t run_id[TSP_WIRE_RUNID_LEN];
    int lfd, efd, wake_fd;
    pthread_t thread;
    int started, joined;
    conn_t *conns;
    conn_t *resume_at; /* the paused connection that resume_all serves first */
    agent_rec_t *agents;
    size_t nagents, agents_cap;
    char *sink; /* formatted lines waiting for sink_fd */
    size_t sink_len, sink_cap;
    pthread_mutex_t ctl_mu; /* guards drain_deadline / draining and the control fields */
    int draining;
    int64_t drain_deadline;
    pthread_cond_t fail_cv; /* signalled when root is set or the thread ended */
    char *root;             /* JSON of the run's root cause (protocol 1.7), malloc'ed */
    int ended;
    int lost_pending;       /* copy of nlost for the host */
    int stop_req;           /* the host asked for STOP to everyone */
    char stop_req_text[STOP_TEXT_MAX];
    /* control, thread only */
    int t_draining;
    int t_stopped;
    int stop_reason;
    uint64_t stop_except; /* agent_id not to STOP (the one that failed) */
    char stop_text[STOP_TEXT_MAX];
    lost_rec_t *lost;
    size_t nlost, lost_cap;
    tsp__logq_t q;
    tsp__outrecv_t out;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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
    size_t n = 0;
    char num[16];
    int nl = snprintf(num, sizeof(num), "%d", rank);
    for (const char *p = prefix ? prefix : "[rank {rank}] "; *p; p++) {
        if (strncmp(p, "{rank}", 6) == 0) {
            for (int i = 0; i < nl; i++, n++)
                if (n + 1 < outlen)
                    out[n] = num[i];
            p += 5;
        } else {
            if (n + 1 < outlen)
                out[n] = *p;
            n++;
        }
    }
    if (stream == TSP_STREAM_STDERR)
        for (const char *m = stderr_marker ? stderr_marker : "[stderr] "; *m; m++, n++)
            if (n + 1 < outlen)
                out[n] = *m;
    if (outlen)
        out[n < outlen ? n : outlen - 1] = 0;
    return n;
}

__attribute__((format(printf, 2, 3))) static void event(tsp_logserver_t *s, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(msg) - 2)
        n = (int)sizeof(msg) - 2;
    if (s->o.events_to_queue) {
        pthread_mutex_lock(&s->q.mu);
        tsp__logq_push_locked(&s->q, TSP_LOG_RANK_SERVER, TSP_LOG_STREAM_EVENT, 0, msg,
                              (size_t)n, 1);
        pthread_mutex_unlock(&s->q.mu);
    }
    if (s->o.event_fd >= 0) {
        msg[n++] = '\n';
        ssize_t w = write(s->o.event_fd, msg, (size_t)n);
        (void)w; /* best effort: an event must never stop the server */
    }
}

/* ---- connections ---------------------------------------------------------------- */

/* A paused connection leaves the epoll set altogether: a hang-up would otherwise be
 * reported again and again while we are not reading it. */
static void conn_arm(tsp_logserver_t *s, conn_t *c)
{
    struct epoll_event ev = {.events = EPOLLIN | (c->wlen ? EPOLLOUT : 0u), .data.ptr = c};
    if (c->paused) {
        if (c->registered)
            epoll_ctl(s->efd, EPOLL_CTL_DEL, c->fd, NULL);
        c->registered = 0;
    } else {
        epoll_ctl(s->efd, c->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev);
        c->registered = 1;
    }
    c->want_out = c->wlen > 0;
}

static void conn_free(tsp_logserver_t *s, conn_t *c)
{
    tsp__outrecv_abort(&s->out, c, "the connection closed");
    if (s->resume_at == c)
        s->resume_at = c->next;
    if (c->registered)
        epoll_ctl(s->efd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c->buf);
    free(c);
    pthread_mutex_lock(&s->q.mu);
    s->q.st.connected--;
    pthread_mutex_unlock(&s->q.mu);
}

/* Sends what wbuf holds without blocking. 0, or -errno when the peer is gone. */
static int conn_write(conn_t *c)
{
    ssize_t w;
    do
        w = send(c->fd, c->wbuf, c->wlen, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    if (w > 0) {
        memmove(c->wbuf, c->wbuf + w, c->wlen - (size_t)w);
        c->wlen -= (size_t)w;
    }
    return w < 0 && errno != EAGAIN ? -errno : 0;
}

/* Queues a frame to the peer (control frames are small; the buffer holds many). */
static int conn_send_flags(tsp_logserver_t *s, conn_t *c, unsigned type, unsigned flags,
                           const void *p, size_t n)
{
    if (c->wlen + TSP_WIRE_HDR_LEN + n > sizeof(c->wbuf))
        return -ENOBUFS;
    tsp_wire_hdr_t h = {.type = (uint8_t)type, .flags = (uint8_t)flags, .rank = -1,
                        .length = (uint32_t)n};
    tsp_wire_hdr_pack(c->wbuf + c->wlen, &h);
    if (n)
        memcpy(c->wbuf + c->wlen + TSP_WIRE_HDR_LEN, p, n);
    c->wlen += TSP_WIRE_HDR_LEN + n;
    int rc = conn_write(c);
    if ((c->wlen > 0) != c->want_out && !c->paused)
        conn_arm(s, c);
    return rc;
}

static int conn_send(tsp_logserver_t *s, conn_t *c, unsigned type, const void *p, size_t n)
{
    return conn_send_flags(s, c, type, 0, p, n);
}

static void conn_who(const conn_t *c, char *out, size_t n)
{
    if (c->state >= C_AUTH && c->h.host[0])
        snprintf(out, n, "%s (host %s, node rank %d)", c->peer, c->h.host, c->h.node_rank);
    else
        snprintf(out, n, "%s", c->peer);
}

/* Drops a connection with a reason: logged, told to the peer (best effort), counted. */
static void conn_reject(tsp_logserver_t *s, conn_t *c, const char *why)
{
    char who[400];
    conn_who(c, who, sizeof(who));
    event(s, "torchspark log server: dropped the connection from %s: %s", who, why);
    /* Counted before the peer can read the reason, so that stats agree with what it saw. */
    pthread_mutex_lock(&s->q.mu);
    s->q.st.rejected++;
    pthread_mutex_unlock(&s->q.mu);
    size_t n = strlen(why);
    conn_send(s, c, TSP_WIRE_ERROR, why, n > TSP_WIRE_MAX_TEXT ? TSP_WIRE_MAX_TEXT : n ? n : 1);
    if (c->state == C_OPEN && c->h.role == TSP_WIRE_ROLE_OUTPUT) {
        /* An agent in the middle of its chunks: closing with its data unread would reset
         * the connection and lose the reason. The transfer is given up now (a retry may
         * claim it); what still comes is discarded until the agent, which looks for an
         * answer between chunks, hangs up, or LINGER_MS passed. */
        tsp__outrecv_abort(&s->out, c, NULL);
        shutdown(c->fd, SHUT_WR);
        c->state = C_LINGER;
        c->paused = 0;
        c->len = 0;
        c->chunk_left = 0;
        c->deadline = now_ms() + LINGER_MS;
        conn_arm(s, c);
        return;
    }
    conn_free(s, c);
}

/* ---- control (protocol 1.7) ------------------------------------------------------- */

static void conn_stop(tsp_logserver_t *s, conn_t *c)
{
    uint8_t p[1 + STOP_TEXT_MAX];
    size_t n = strnlen(s->stop_text, sizeof(s->stop_text) - 1);
    p[0] = (uint8_t)s->stop_reason;
    memcpy(p + 1, s->stop_text, n);
    if (conn_send(s, c, TSP_WIRE_STOP, p, 1 + n) == 0)
        c->stop_sent = 1;
}

/* The first stop of the run: every other control agent (and any that connects later) is
 * told to stop its workers at once. */
static void stop_everyone(tsp_logserver_t *s, int reason, uint64_t except, const char *text)
{
    if (s->t_stopped)
        return;
    s->t_stopped = 1;
    s->stop_reason = reason;
    s->stop_except = except;
    snprintf(s->stop_text, sizeof(s->stop_text), "%s", text);
    for (conn_t *c = s->conns; c; c = c->next)
        if (c->state == C_OPEN && c->control && !c->stop_sent && c->h.agent_id != except)
            conn_stop(s, c);
}

static void json_field(FILE *f, const char *key, const char *val, int last)
{
    fprintf(f, "\"%s\": ", key);
    if (val)
        tsp_json_write_string(f, val);
    else
        fputs("null", f);
    fputs(last ? "}" : ", ", f);
}

/* Keeps the first failure as the run's root cause (later ones are consequences). */
static void record_root(tsp_logserver_t *s, const char *kind, int node_rank, const char *host,
                        const char *peer, const char *message, const char *report)
{
    char *doc = NULL;
    size_t dl = 0;
    FILE *f = open_memstream(&doc, &dl);
    if (!f)
        return;
    fputs("{", f);
    json_field(f, "kind", kind, 0);
    fprintf(f, "\"node_rank\": %d, ", node_rank);
    json_field(f, "host", host, 0);
    json_field(f, "peer", peer, 0);
    json_field(f, "message", message, 0);
    json_field(f, "report", report, 1);
    if (fclose(f) != 0) {
        free(doc);
        return;
    }
    pthread_mutex_lock(&s->ctl_mu);
    if (!s->root) {
        s->root = doc;
        doc = NULL;
        pthread_cond_broadcast(&s->fail_cv);
    }
    pthread_mutex_unlock(&s->ctl_mu);
    free(doc);
}

/* The peer's address without the port, for messages ("10.0.0.5", "::1"). */
static void peer_addr(const char *peer, char *out, size_t n)
{
    const char *colon = strrchr(peer, ':');
    size_t len = colon ? (size_t)(colon - peer) : strlen(peer);
    snprintf(out, n, "%.*s", (int)len, peer);
}

/* An EVENT frame: delivered once per (agent, seq) like a line. */
static int on_event(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p)
{
    agent_rec_t *a = &s->agents[c->agent];
    uint64_t seq = tsp_wire_get_u64(p);
    if (seq <= a->seq)
        return 0;
    a->seq = seq;
    if (p[8] != TSP_WIRE_EVENT_FAILURE)
        return 0; /* a newer agent's kind: ignored, not refused */
    size_t n = h->length - 9;
    char *report = malloc(n + 1);
    if (!report)
        return 0;
    memcpy(report, p + 9, n);
    report[n] = 0;
    char *rank = NULL, *code = NULL, *sig = NULL, addr[80];
    int t;
    tsp_json_get(report, n, "torchspark.rank", &rank, &t);
    tsp_json_get(report, n, "torchspark.exitcode", &code, &t);
    tsp_json_get(report, n, "torchspark.signal", &sig, &t);
    peer_addr(c->peer, addr, sizeof(addr));
    char msg[STOP_TEXT_MAX];
    snprintf(msg, sizeof(msg), "node %d (host %s, address %s) failed: rank %s %s %s",
             c->h.node_rank, c->h.host, addr, rank ? rank : "?",
             sig && strcmp(sig, "0") != 0 ? "was killed by signal" : "exited with code",
             sig && strcmp(sig, "0") != 0 ? sig : code ? code : "?");
    free(rank);
    free(code);
    free(sig);
    record_root(s, "failure", c->h.node_rank, c->h.host, c->peer, msg, report);
    free(report);
    if (!s->t_stopped)
        event(s, "torchspark log server: %s; stopping the other nodes", msg);
    stop_everyone(s, TSP_WIRE_STOP_FAILED, c->h.agent_id, msg);
    return 0;
}

static void lost_publish(tsp_logserver_t *s)
{
    pthread_mutex_lock(&s->ctl_mu);
    s->lost_pending = (int)s->nlost;
    pthread_mutex_unlock(&s->ctl_mu);
}

/* A LOGS connection ended without CLOSE: remember it; sweep() declares it lost when its
 * agent has not reconnected within the grace. */
static void lost_add(tsp_logserver_t *s, const conn_t *c, const char *why)
{
    if (s->t_draining || c->state != C_OPEN || c->h.role != TSP_WIRE_ROLE_LOGS)
        return;
    if (s->nlost == s->lost_cap) {
        size_t n = s->lost_cap ? s->lost_cap * 2 : 8;
        lost_rec_t *nl = realloc(s->lost, n * sizeof(*nl));
        if (!nl)
            return;
        s->lost = nl;
        s->lost_cap = n;
    }
    lost_rec_t *l = &s->lost[s->nlost++];
    memset(l, 0, sizeof(*l));
    l->agent_id = c->h.agent_id;
    l->node_rank = c->h.node_rank;
    l->deadline = now_ms() + s->o.lost_grace_ms;
    snprintf(l->host, sizeof(l->host), "%s", c->h.host);
    snprintf(l->peer, sizeof(l->peer), "%s", c->peer);
    snprintf(l->why, sizeof(l->why), "%s", why);
    lost_publish(s);
}

static void lost_forget(tsp_logserver_t *s, uint64_t agent_id)
{
    size_t before = s->nlost;
    for (size_t i = 0; i < s->nlost;)
        if (s->lost[i].agent_id == agent_id)
            s->lost[i] = s->lost[--s->nlost];
        else
            i++;
    if (s->nlost != before)
        lost_publish(s);
}

/* Declares agents lost whose grace is over; returns the next deadline (-1: none). */
static int64_t lost_sweep(tsp_logserver_t *s, int64_t now)
{
    int64_t next = -1;
    size_t before = s->nlost;
    for (size_t i = 0; i < s->nlost;) {
        lost_rec_t *l = &s->lost[i];
        if (s->t_draining) {
            s->lost[i] = s->lost[--s->nlost];
            continue;
        }
        if (now < l->deadline) {
            if (next < 0 || l->deadline < next)
                next = l->deadline;
            i++;
            continue;
        }
        /* Off the pending list (and published) before the root cause is: whoever wakes
         * on the root cause must not still see this node as pending. */
        lost_rec_t gone = *l;
        s->lost[i] = s->lost[--s->nlost];
        lost_publish(s);
        char addr[80], msg[STOP_TEXT_MAX];
        peer_addr(gone.peer, addr, sizeof(addr));
        snprintf(msg, sizeof(msg), "lost connection to node %d (host %s, address %s): %s",
                 gone.node_rank, gone.host, addr, gone.why);
        record_root(s, "lost", gone.node_rank, gone.host, gone.peer, msg, NULL);
        if (!s->t_stopped)
            event(s, "torchspark log server: %s; stopping the other nodes", msg);
        stop_everyone(s, TSP_WIRE_STOP_LOST, gone.agent_id, msg);
    }
    if (s->nlost != before)
        lost_publish(s);
    return next;
}

static void keepalive(int fd)
{
    int one = 1, idle = KEEPIDLE_S, intvl = KEEPINTVL_S, cnt = KEEPCNT;
    unsigned ut = USER_TIMEOUT_MS;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
}

static void do_accept(tsp_logserver_t *s)
{
    for (;;) {
        struct sockaddr_storage ss = {0};
        socklen_t sl = sizeof(ss);
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN)
                event(s, "torchspark log server: accept failed: %s", strerror(errno));
            return;
        }
        conn_t *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->state = C_HELLO;
        c->deadline = now_ms() + s->o.handshake_timeout_ms;
        char addr[INET6_ADDRSTRLEN] = "?";
        int port = 0;
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, addr, sizeof(addr));
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, addr, sizeof(addr));
            port = ntohs(a->sin6_port);
        }
        snprintf(c->peer, sizeof(c->peer), "%s:%d", addr, port);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        keepalive(fd);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->registered = 1;
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_mutex_lock(&s->q.mu);
        s->q.st.accepted++;
        s->q.st.connected++;
        pthread_mutex_unlock(&s->q.mu);
    }
}

/* ---- frames ---------------------------------------------------------------------- */

static agent_rec_t *agent_find(tsp_logserver_t *s, uint64_t id, size_t *idx)
{
    for (size_t i = 0; i < s->nagents; i++)
        if (s->agents[i].id == id) {
            *idx = i;
            return &s->agents[i];
        }
    if (s->nagents == s->agents_cap) {
        size_t n = s->agents_cap ? s->agents_cap * 2 : 16;
        agent_rec_t *na = realloc(s->agents, n * sizeof(*na));
        if (!na)
            return NULL;
        s->agents = na;
        s->agents_cap = n;
    }
    *idx = s->nagents;
    s->agents[s->nagents] = (agent_rec_t){.id = id, .seq = 0};
    return &s->agents[s->nagents++];
}

static int on_hello(tsp_logserver_t *s, conn_t *c, const uint8_t *p, size_t n, char *err,
                    size_t errlen)
{
    int rc = tsp_wire_hello_unpack(&c->h, p, n, err, errlen);
    if (rc)
        return rc;
    if (memcmp(c->h.run_id, s->run_id, TSP_WIRE_RUNID_LEN) != 0) {
        snprintf(err, errlen, "the agent belongs to another run (its secret differs); check "
                              "TORCHSPARK_LOG_SECRET");
        return -EACCES;
    }
    if (c->h.role == TSP_WIRE_ROLE_OUTPUT && (rc = tsp__outrecv_claim(&s->out, c, err, errlen)))
        return rc;
    memcpy(c->hello, p, n);
    c->hello_len = n;
    uint8_t ch[TSP_WIRE_CHALLENGE_LEN];
    if (tsp_wire_random(c->nonce_s, sizeof(c->nonce_s))) {
        snprintf(err, errlen, "no random bytes for the challenge");
        return -EIO;
    }
    tsp_wire_challenge_pack(ch, c->nonce_s);
    c->state = C_AUTH;
    return conn_send(s, c, TSP_WIRE_CHALLENGE, ch, sizeof(ch));
}

static int on_auth(tsp_logserver_t *s, conn_t *c, const uint8_t *p, size_t n, char *err,
                   size_t errlen)
{
    if (tsp_wire_mac_verify(s->secret, 0, c->hello, c->hello_len, c->nonce_s, p, n)) {
        snprintf(err, errlen, "authentication failed (wrong secret or a replayed handshake)");
        return -EACCES;
    }
    uint8_t mac[TSP_WIRE_MAC_LEN];
    if (tsp_wire_mac(s->secret, 1, c->hello, c->hello_len, c->nonce_s, mac)) {
        snprintf(err, errlen, "HMAC failed on the driver");
        return -EIO;
    }
    agent_rec_t *a = agent_find(s, c->h.agent_id, &c->agent);
    if (!a) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    c->acked = a->seq;
    c->state = C_OPEN;
    c->control = c->h.role == TSP_WIRE_ROLE_LOGS && (c->h.hflags & TSP_WIRE_HELLO_CONTROL);
    lost_forget(s, c->h.agent_id); /* it is back */
    pthread_mutex_lock(&s->q.mu);
    s->q.st.authenticated++;
    pthread_mutex_unlock(&s->q.mu);
    int rc = conn_send_flags(s, c, TSP_WIRE_WELCOME, c->control ? TSP_WIRE_WELCOME_CONTROL : 0,
                             mac, sizeof(mac));
    if (!rc && c->control && s->t_stopped && c->h.agent_id != s->stop_except)
        conn_stop(s, c);
    /* Tell a reconnecting agent at once what this server already has. */
    if (!rc && a->seq) {
        uint8_t ack[8];
        tsp_wire_put_u64(ack, a->seq);
        rc = conn_send(s, c, TSP_WIRE_ACK, ack, 8);
    }
    return rc;
}

static void sink_line(tsp_logserver_t *s, const tsp_wire_hdr_t *h, const uint8_t *d, size_t n)
{
    char pre[256];
    size_t pl = tsp_logserver_format_prefix(pre, sizeof(pre), s->prefix, s->marker, h->rank,
                                            h->stream);
    if (pl >= sizeof(pre))
        pl = sizeof(pre) - 1;
    size_t need = s->sink_len + pl + n + 1;
    if (need > s->sink_cap) {
        size_t cap = need > 2 * SINK_FLUSH ? need : 2 * SINK_FLUSH;
        char *nb = realloc(s->sink, cap);
        if (!nb)
            return;
        s->sink = nb;
        s->sink_cap = cap;
    }
    memcpy(s->sink + s->sink_len, pre, pl);
    memcpy(s->sink + s->sink_len + pl, d, n);
    s->sink_len += pl + n;
    if (!(h->flags & TSP_LINE_CONTINUED))
        s->sink[s->sink_len++] = '\n';
}

static void sink_flush(tsp_logserver_t *s)
{
    size_t off = 0;
    while (off < s->sink_len) {
        ssize_t w = write(s->o.sink_fd, s->sink + off, s->sink_len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            break; /* the sink is gone: lines still reach the tails */
        off += (size_t)w;
    }
    s->sink_len = 0;
}

/* Under q.mu: a LINE frame delivered once per (agent, seq): into the pull queue, or only
 * the tail in sink mode. 0 delivered, 1 a duplicate, -EAGAIN the queue is full (the frame
 * stays buffered and the connection pauses). */
static int line_locked(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p)
{
    uint64_t seq = tsp_wire_get_u64(p);
    size_t n = h->length - 8;
    agent_rec_t *a = &s->agents[c->agent];
    if (seq <= a->seq) {
        s->q.st.duplicates++;
        return 1;
    }
    int to_queue = s->o.sink_fd < 0;
    if (to_queue && tsp__logq_full_locked(&s->q)) {
        s->q.paused = 1;
        return -EAGAIN;
    }
    if (tsp__logq_push_locked(&s->q, h->rank, h->stream, h->flags, p + 8, n, to_queue))
        return -EAGAIN; /* no memory now: retry when the consumer made room */
    s->q.st.lines++;
    s->q.st.bytes += n;
    a->seq = seq;
    return 0;
}

/* A LINE frame outside a batch (conn_parse batches queue-mode lines under one lock). */
static int on_line(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p)
{
    pthread_mutex_lock(&s->q.mu);
    int rc = line_locked(s, c, h, p);
    pthread_mutex_unlock(&s->q.mu);
    if (rc == 0 && s->o.sink_fd >= 0) {
        sink_line(s, h, p + 8, h->length - 8);
        if (s->sink_len >= SINK_FLUSH)
            sink_flush(s);
    }
    return rc == 1 ? 0 : rc;
}

static int on_output(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p,
                     char *err, size_t errlen)
{
    switch (h->type) {
    case TSP_WIRE_OUT_BEGIN:
        return tsp__outrecv_begin(&s->out, c, tsp_wire_get_u64(p), err, errlen);
    default: {
        int rc = tsp__outrecv_end(&s->out, c, p, err, errlen);
        return rc ? rc : conn_send(s, c, TSP_WIRE_OUT_DONE, p, TSP_WIRE_DIGEST_LEN);
    }
    }
}

/* One whole frame. 0 consumed; -EAGAIN keep it and pause; 1 connection closed normally;
 * other < 0: reject with err. */
static int on_frame(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p,
                    char *err, size_t errlen)
{
    int open_logs = c->state == C_OPEN && c->h.role == TSP_WIRE_ROLE_LOGS;
    int open_out = c->state == C_OPEN && c->h.role == TSP_WIRE_ROLE_OUTPUT;
    switch (h->type) {
    case TSP_WIRE_HELLO:
        if (c->state == C_HELLO)
            return on_hello(s, c, p, h->length, err, errlen);
        break;
    case TSP_WIRE_AUTH:
        if (c->state == C_AUTH)
            return on_auth(s, c, p, h->length, err, errlen);
        break;
    case TSP_WIRE_LINE:
        if (open_logs)
            return on_line(s, c, h, p);
        break;
    case TSP_WIRE_EVENT:
        if (open_logs && c->control)
            return on_event(s, c, h, p);
        break;
    case TSP_WIRE_DROPPED:
        if (open_logs) {
            pthread_mutex_lock(&s->q.mu);
            tsp__logq_set_dropped_locked(&s->q, h->rank, tsp_wire_get_u64(p));
            pthread_mutex_unlock(&s->q.mu);
            return 0;
        }
        break;
    case TSP_WIRE_OUT_BEGIN:
    case TSP_WIRE_OUT_CHUNK:
    case TSP_WIRE_OUT_END:
        if (open_out)
            return on_output(s, c, h, p, err, errlen);
        break;
    case TSP_WIRE_CLOSE:
        if (c->state == C_OPEN) {
            conn_send(s, c, TSP_WIRE_CLOSE, NULL, 0);
            return 1;
        }
        break;
    case TSP_WIRE_ERROR: {
        size_t n = h->length;
        snprintf(err, errlen, "the agent reported: %.*s", (int)n, (const char *)p);
        return -ECONNABORTED;
    }
    default:
        break;
    }
    snprintf(err, errlen, "unexpected %s frame %s", tsp_wire_type_name(h->type),
             c->state == C_OPEN ? "after the handshake" : "during the handshake");
    return -EBADMSG;
}

/* Parses every whole frame in c->buf. 0 continue; -EAGAIN paused; else closed/rejected. */
static int conn_parse(tsp_logserver_t *s, conn_t *c)
{
    size_t off = 0;
    int rc = 0, locked = 0;
    int batch_lines = c->state == C_OPEN && c->h.role == TSP_WIRE_ROLE_LOGS && s->o.sink_fd < 0;
    char err[600];
    while (c->state != C_LINGER) {
        tsp_wire_hdr_t h;
        uint32_t cap = c->state == C_OPEN ? TSP_WIRE_MAX_PAYLOAD : TSP_WIRE_MAX_HANDSHAKE;
        rc = tsp_wire_hdr_unpack(&h, c->buf + off, c->len - off, cap, err, sizeof(err));
        if (rc == -EAGAIN) {
            rc = 0;
            break;
        }
        if (rc)
            break;
        if (h.type == TSP_WIRE_OUT_CHUNK && c->state == C_OPEN &&
            c->h.role == TSP_WIRE_ROLE_OUTPUT) {
            /* Output data does not go through buf: what is buffered is handed over now,
             * the rest is received in place (conn_read_chunk). */
            size_t have = c->len - off - TSP_WIRE_HDR_LEN;
            if (have > h.length)
                have = h.length;
            rc = tsp__outrecv_chunk(&s->out, c, h.length, c->buf + off + TSP_WIRE_HDR_LEN,
                                    have, err, sizeof(err));
            if (rc)
                break;
            c->chunk_left = h.length - (uint32_t)have;
            off += TSP_WIRE_HDR_LEN + have;
            if (c->chunk_left)
                break;
            continue;
        }
        size_t whole = TSP_WIRE_HDR_LEN + h.length;
        if (c->len - off < whole) {
            if (whole > c->cap) { /* grow for this frame; the cap bounds it */
                uint8_t *nb = malloc(whole);
                if (!nb) {
                    rc = -ENOMEM;
                    snprintf(err, sizeof(err), "out of memory for a %zu-byte frame", whole);
                    break;
                }
                memcpy(nb, c->buf + off, c->len - off);
                free(c->buf);
                c->buf = nb;
                c->cap = whole;
                c->len -= off;
                off = 0;
            }
            break;
        }
        const uint8_t *payload = c->buf + off + TSP_WIRE_HDR_LEN;
        if (h.type == TSP_WIRE_LINE && batch_lines) {
            /* Lines to the queue take the queue's lock once per read, not once each. */
            if (!locked)
                pthread_mutex_lock(&s->q.mu);
            locked = 1;
            rc = line_locked(s, c, &h, payload);
            rc = rc == 1 ? 0 : rc;
        } else {
            if (locked)
                pthread_mutex_unlock(&s->q.mu);
            locked = 0;
            rc = on_frame(s, c, &h, payload, err, sizeof(err));
        }
        if (rc == -EAGAIN)
            break;
        off += whole;
        if (rc)
            break;
    }
    if (locked)
        pthread_mutex_unlock(&s->q.mu);
    if (off) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    /* Give a big line's buffer back; an output transfer keeps it (one per chunk would
     * cost a fresh mapping and its page faults for every MiB). */
    if (c->len == 0 && c->cap > 4 * CONN_BUF_MIN && c->h.role != TSP_WIRE_ROLE_OUTPUT) {
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
    if (rc < 0 && rc != -EAGAIN) {
        conn_reject(s, c, err);
        return rc;
    }
    if (rc == 1) {
        conn_free(s, c);
        return 1;
    }
    return rc;
}

static void conn_ack(tsp_logserver_t *s, conn_t *c)
{
    if (c->state != C_OPEN || c->h.role != TSP_WIRE_ROLE_LOGS)
        return;
    uint64_t seq = s->agents[c->agent].seq;
    if (seq <= c->acked || c->wlen + 20 > sizeof(c->wbuf))
        return;
    uint8_t p[8];
    tsp_wire_put_u64(p, seq);
    if (conn_send(s, c, TSP_WIRE_ACK, p, 8) == 0)
        c->acked = seq;
}

static void conn_pause(tsp_logserver_t *s, conn_t *c)
{
    c->paused = 1;
    conn_arm(s, c);
}

/* Receives output chunk data in place. 1 took some and the chunk may have more, 0 the
 * socket is empty, -1 the connection is gone. */
static int conn_read_chunk(tsp_logserver_t *s, conn_t *c)
{
    char err[600] = "";
    ssize_t n = tsp__outrecv_recv(&s->out, c, c->fd, c->chunk_left, err, sizeof(err));
    if (n == -EAGAIN)
        return 0;
    if (n == -EBADMSG) {
        conn_reject(s, c, err);
        return -1;
    }
    if (n < 0) {
        conn_free(s, c);
        return -1;
    }
    c->chunk_left -= (uint32_t)n;
    return 1;
}

/* Reads what the socket has and handles it. Returns 0 while the connection lives. */
static int conn_read(tsp_logserver_t *s, conn_t *c)
{
    for (int round = 0; round < 16; round++) {
        if (c->chunk_left) {
            int rc = conn_read_chunk(s, c);
            if (rc < 0)
                return -1;
            if (rc == 0)
                break;
            continue;
        }
        if (!c->buf) {
            c->buf = malloc(CONN_BUF_MIN);
            if (!c->buf)
                return 0; /* try again on the next readiness */
            c->cap = CONN_BUF_MIN;
        }
        /* Before authentication a peer gets no more than one handshake frame of room. */
        size_t room = c->cap - c->len;
        if (c->state != C_OPEN && c->state != C_LINGER &&
            room > TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_HANDSHAKE)
            room = TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_HANDSHAKE;
        /* An output connection reads a header alone, so that chunk data is received in
         * place rather than through buf. */
        if (c->state == C_OPEN && c->h.role == TSP_WIRE_ROLE_OUTPUT && c->len < TSP_WIRE_HDR_LEN)
            room = TSP_WIRE_HDR_LEN - c->len;
        ssize_t n;
        do
            n = read(c->fd, c->buf + c->len, room);
        while (n < 0 && errno == EINTR);
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0) {
            if (c->state == C_OPEN || c->state == C_LINGER) {
                lost_add(s, c, n == 0 ? "it closed without saying goodbye (the agent or its host "
                                        "died)"
                         : errno == ETIMEDOUT ? "no answer for about 5 s (host down or network cut)"
                                              : strerror(errno));
                conn_free(s, c);
            } else {
                conn_reject(s, c, n == 0 ? "closed during the handshake"
                                         : "read error during the handshake");
            }
            return -1;
        }
        if (c->state == C_LINGER) { /* discarding: lines it sent now are not acked */
            c->len = 0;
            continue;
        }
        c->len += (size_t)n;
        int rc = conn_parse(s, c);
        if (rc == -EAGAIN) {
            conn_ack(s, c);
            conn_pause(s, c);
            return 0;
        }
        if (rc)
            return -1;
        if ((size_t)n < room)
            break;
    }
    conn_ack(s, c);
    return 0;
}

static void conn_flush(tsp_logserver_t *s, conn_t *c)
{
    conn_write(c);
    conn_arm(s, c);
}

/* After the pull queue made room: read paused connections again, buffered frames first.
 * Round robin: when the queue fills again, the next round starts where this one stopped,
 * so that under a slow consumer every agent progresses, not just the first in the list. */
static void resume_all(tsp_logserver_t *s)
{
    size_t n = 0;
    for (conn_t *c = s->conns; c; c = c->next)
        n++;
    conn_t *c = s->resume_at ? s->resume_at : s->conns;
    for (size_t i = 0; i < n && c; i++) {
        conn_t *next = c->next ? c->next : s->conns;
        if (c->paused) {
            pthread_mutex_lock(&s->q.mu);
            int full = tsp__logq_full_locked(&s->q);
            if (full)
                s->q.paused = 1;
            pthread_mutex_unlock(&s->q.mu);
            if (full) {
                s->resume_at = c;
                return;
            }
            int rc = conn_parse(s, c);
            if (rc == -EAGAIN) { /* served until full: the rest of it comes first next time */
                s->resume_at = c;
                return;
            }
            if (rc == 0) {
                c->paused = 0;
                conn_arm(s, c);
                conn_ack(s, c);
            }
        }
        c = next;
    }
    s->resume_at = NULL;
}

/* The output's hashing thread failed (the file could not be written): the agent is told
 * now, not at its next chunk, which may never come. */
static void output_failed(tsp_logserver_t *s)
{
    char why[512];
    void *owner = tsp__outrecv_failed(&s->out, why, sizeof(why));
    for (conn_t *c = s->conns; owner && c; c = c->next)
        if (c == owner) {
            conn_reject(s, c, why);
            break;
        }
}

/* ---- the thread ------------------------------------------------------------------ */

/* Ends a connection during the drain: final ACK and CLOSE, then linger until EOF. */
static void conn_goodbye(tsp_logserver_t *s, conn_t *c)
{
    if (c->state != C_OPEN) {
        conn_free(s, c);
        return;
    }
    conn_ack(s, c);
    conn_send(s, c, TSP_WIRE_CLOSE, NULL, 0);
    shutdown(c->fd, SHUT_WR);
    c->state = C_LINGER;
    c->paused = 0;
    c->len = 0;
    c->deadline = now_ms() + LINGER_MS;
    conn_arm(s, c);
}

/* Timeouts: handshakes, lingering closes, and the drain deadline. Returns the epoll
 * timeout until the next of them (-1: none). */
static int sweep(tsp_logserver_t *s, int draining, int64_t drain_deadline)
{
    int64_t now = now_ms(), next = -1;
    int drain_over = draining && now >= drain_deadline;
    for (conn_t *c = s->conns, *n; c; c = n) {
        n = c->next;
        if (c->state == C_OPEN && drain_over)
            conn_goodbye(s, c);
        if (c->state == C_OPEN)
            continue;
        if (now >= c->deadline) {
            if (c->state == C_LINGER)
                conn_free(s, c);
            else
                conn_reject(s, c, "the handshake did not complete in time");
            continue;
        }
        if (next < 0 || c->deadline < next)
            next = c->deadline;
    }
    if (draining && !drain_over && (next < 0 || drain_deadline < next))
        next = drain_deadline;
    int64_t lost_next = lost_sweep(s, now);
    if (lost_next >= 0 && (next < 0 || lost_next < next))
        next = lost_next;
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
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &s->lfd) {
                do_accept(s);
            } else if (p == &s->wake_fd) {
                uint64_t v;
                ssize_t r = read(s->wake_fd, &v, sizeof(v));
                (void)r; /* only resets the eventfd */
                resume_all(s);
                output_failed(s);
                pthread_mutex_lock(&s->ctl_mu);
                int stop = s->stop_req;
                char text[STOP_TEXT_MAX];
                memcpy(text, s->stop_req_text, sizeof(text));
                s->stop_req = 0;
                pthread_mutex_unlock(&s->ctl_mu);
                if (stop)
                    stop_everyone(s, TSP_WIRE_STOP_ENDED, 0, text);
            } else {
                conn_t *c = p;
                if ((evs[i].events & EPOLLOUT) && c->wlen)
                    conn_flush(s, c);
                if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                    conn_read(s, c);
            }
        }
        if (s->sink_len)
            sink_flush(s);
        pthread_mutex_lock(&s->ctl_mu);
        int draining = s->draining;
        int64_t dl = s->drain_deadline;
        pthread_mutex_unlock(&s->ctl_mu);
        s->t_draining = draining;
        if (draining && s->lfd >= 0) {
            epoll_ctl(s->efd, EPOLL_CTL_DEL, s->lfd, NULL);
            close(s->lfd);
            s->lfd = -1;
        }
        timeout = sweep(s, draining, dl);
        if (draining && !s->conns)
            break;
    }
    if (s->sink_len)
        sink_flush(s);
    while (s->conns)
        conn_free(s, s->conns);
    tsp__logq_end(&s->q);
    pthread_mutex_lock(&s->ctl_mu);
    s->ended = 1;
    pthread_cond_broadcast(&s->fail_cv);
    pthread_mutex_unlock(&s->ctl_mu);
    return NULL;
}

/* ---- setup and the host-facing API ------------------------------------------------ */

static int bind_listen(tsp_logserver_t *s, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", s->o.port);
    int rc = getaddrinfo(s->host, port, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "cannot resolve the log server address %s: %s", s->host,
                 gai_strerror(rc));
        return -EADDRNOTAVAIL;
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
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
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

static int server_setup(tsp_logserver_t *s, const tsp_logserver_opts_t *o, char *err,
                        size_t errlen)
{
    s->o = *o;
    snprintf(s->host, sizeof(s->host), "%s", o->host && *o->host ? o->host : "127.0.0.1");
    snprintf(s->prefix, sizeof(s->prefix), "%s", o->prefix ? o->prefix : "[rank {rank}] ");
    snprintf(s->marker, sizeof(s->marker), "%s", o->stderr_marker ? o->stderr_marker : "[stderr] ");
    if (s->o.handshake_timeout_ms <= 0)
        s->o.handshake_timeout_ms = 10000;
    if (o->secret)
        memcpy(s->secret, o->secret, TSP_WIRE_SECRET_LEN);
    else if (tsp_wire_random(s->secret, TSP_WIRE_SECRET_LEN))
        return snprintf(err, errlen, "no random bytes for the log secret"), -EIO;
    if (tsp_wire_run_id(s->secret, s->run_id))
        return snprintf(err, errlen, "SHA-256 failed"), -EIO;
    int rc = bind_listen(s, err, errlen);
    if (rc)
        return rc;
    s->efd = epoll_create1(EPOLL_CLOEXEC);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0 || s->wake_fd < 0)
        return snprintf(err, errlen, "epoll/eventfd: %s", strerror(errno)), -errno;
    struct epoll_event e1 = {.events = EPOLLIN, .data.ptr = &s->lfd};
    struct epoll_event e2 = {.events = EPOLLIN, .data.ptr = &s->wake_fd};
    epoll_ctl(s->efd, EPOLL_CTL_ADD, s->lfd, &e1);
    epoll_ctl(s->efd, EPOLL_CTL_ADD, s->wake_fd, &e2);
    size_t qb = o->queue_bytes ? o->queue_bytes : (8u << 20);
    if ((rc = tsp__logq_init(&s->q, qb, o->tail_lines, o->tail_bytes ? o->tail_bytes : 65536,
                             s->wake_fd)) ||
        (rc = tsp__outrecv_init(&s->out, s->wake_fd)))
        return snprintf(err, errlen, "cannot init the log server: %s", tsp_strerror(rc)), rc;
    pthread_mutex_init(&s->ctl_mu, NULL);
    tsp__cond_init_mono(&s->fail_cv);
    if (s->o.lost_grace_ms < 0)
        s->o.lost_grace_ms = 0;
    if ((rc = pthread_create(&s->thread, NULL, server_main, s)))
        return snprintf(err, errlen, "cannot start the log server thread: %s", strerror(rc)), -rc;
    s->started = 1;
    return 0;
}

tsp_logserver_t *tsp_logserver_start(const tsp_logserver_opts_t *o, char *err, size_t errlen)
{
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

int tsp_logserver_port(const tsp_logserver_t *s) { return s->port; }
const char *tsp_logserver_host(const tsp_logserver_t *s) { return s->host; }
void tsp_logserver_secret(const tsp_logserver_t *s, uint8_t out[TSP_WIRE_SECRET_LEN])
{
    memcpy(out, s->secret, TSP_WIRE_SECRET_LEN);
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
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof(one));
    (void)w;
    return 0;
}

int tsp_logserver_shutdown(tsp_logserver_t *s, int drain_timeout_ms)
{
    if (!s->started || s->joined)
        return 0;
    pthread_mutex_lock(&s->ctl_mu);
    if (!s->draining) {
        s->draining = 1;
        s->drain_deadline = now_ms() + (drain_timeout_ms > 0 ? drain_timeout_ms : 0);
    }
    pthread_mutex_unlock(&s->ctl_mu);
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof(one));
    (void)w;
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
    tsp__outrecv_close(&s->out);
    pthread_mutex_destroy(&s->ctl_mu);
    pthread_cond_destroy(&s->fail_cv);
    free(s->root);
    free(s->lost);
    free(s->agents);
    free(s->sink);
    free(s);
}
