/* rendezvous.c: the driver's end of the rendezvous (docs/protocol.md 2.1): one listening
 * socket and one poll thread for every task's connection. Two layers, apart:
 *  - the transport: each connection is TLS 1.3 with a PSK derived from the run's secret
 *    (tlsconn.c, the rendezvous' own label); a peer that does not complete the handshake
 *    within its deadline is dropped without a word, and only then is a line read;
 *  - the messages (handle_line): one authenticated request line -> one reply line, at once
 *    (OK, ERR) or, for a GET, once rank 0's PUT came, the GET's time ran out or the run
 *    ended. After its reply a connection is closed.
 * The record and the connections belong to the thread; the caller's side only reads the
 * counters and asks it to stop through an eventfd. */
#include "torchspark/rendezvous.h"

#include "tlsconn.h"
#include "torchspark/gang.h"
#include "util.h"

#include <errno.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define DRAIN_MS 1000       /* after close, how long replies may take to leave */
#define ACCEPT_PAUSE_MS 100 /* out of descriptors: the listener rests (it would stay readable) */
#define HANDSHAKES_MAX 256  /* connections not yet authenticated: beyond, the oldest goes */
#define MAC_HEX 64          /* HMAC-SHA256 as hex digits, before the record */

enum conn_state {
    HANDSHAKE,
    READING,
    WAITING,
    WRITING,
    JOINED /* a gang task waiting for GO (2.2) */
};

typedef struct rdv_conn {
    int fd;
    tsp__tls_t *tls;
    enum conn_state state;
    short events;     /* what poll waits for: the state's, or what TLS asked */
    int64_t deadline; /* HANDSHAKE, READING: the request's; WAITING: the GET's; WRITING: the
                         reply's */
    size_t len, off;  /* READING: bytes in buf; WRITING: reply length and bytes sent */
    char buf[TSP_RDV_LINE_MAX + 2];
} rdv_conn_t;

struct tsp_rdv {
    int lfd, wake_fd, port, get_timeout_ms;
    char host[64];
    tsp__tlsctx_t *tls;                /* the server's, keyed by the run's secret */
    uint8_t mac_key[TSP__TLS_KEY_LEN]; /* the record's MAC key, derived from the secret */
    pthread_t thread;
    pthread_mutex_t mu; /* guards closing, puts, gets, gang */
    int closing, puts, gets;
    tsp_gang_t *gang; /* a gang launch's admission (docs/protocol.md 2.2), or NULL */
    /* the thread's own */
    char *record; /* MAC RECORD, as rank 0 sent it */
    size_t record_len;
    size_t handshakes;           /* connections in HANDSHAKE */
    int64_t accept_paused_until; /* out of descriptors: not polled until then */
    rdv_conn_t **conns;
    size_t nconns, cap;
    struct pollfd *pfds;
};

/* ---- connections ------------------------------------------------------------------- */

static void conn_drop(tsp_rdv_t *r, size_t i)
{
    rdv_conn_t *c = r->conns[i];
    if (c->state == HANDSHAKE)
        r->handshakes--;
    tsp__tls_free(c->tls);
    close(c->fd);
    free(c);
    r->conns[i] = r->conns[--r->nconns];
}

/* Queues line + '\n' as the connection's reply. */
static void conn_reply(rdv_conn_t *c, const char *line, size_t n)
{
    if (n > sizeof(c->buf) - 1)
        n = sizeof(c->buf) - 1;
    memmove(c->buf, line, n);
    c->buf[n] = '\n';
    c->len = n + 1;
    c->off = 0;
    c->state = WRITING;
    c->events = POLLOUT;
    c->deadline = tsp__now_ms() + TSP_RDV_CONNECT_TIMEOUT_MS;
}

static void conn_reply_str(rdv_conn_t *c, const char *line)
{
    conn_reply(c, line, strlen(line));
}

static void count(tsp_rdv_t *r, int *counter)
{
    pthread_mutex_lock(&r->mu);
    (*counter)++;
    pthread_mutex_unlock(&r->mu);
}

/* Answers every waiting GET with the record. */
static void answer_waiting(tsp_rdv_t *r)
{
    for (size_t i = 0; i < r->nconns; i++) {
        if (r->conns[i]->state == WAITING) {
            conn_reply(r->conns[i], r->record, r->record_len);
            count(r, &r->gets);
        }
    }
}

/* ---- messages: one authenticated request line -> its reply ------------------------- */

/* Whether a PUT's "MAC RECORD" (n bytes) carries the MAC of its record under the run's key:
 * the connection is authenticated already, the MAC makes the record rank 0's end to end. */
static int mac_ok(const tsp_rdv_t *r, const char *p, size_t n)
{
    char want[MAC_HEX + 1];
    return n > MAC_HEX + 1 && p[MAC_HEX] == ' ' &&
           tsp__tls_mac_hex(r->mac_key, p + MAC_HEX + 1, n - MAC_HEX - 1, want) == 0 &&
           CRYPTO_memcmp(want, p, MAC_HEX) == 0;
}

/* ---- gang launch (docs/protocol.md 2.2) -------------------------------------------- */

/* Answers every JOINED connection with line. */
static void gang_answer(tsp_rdv_t *r, const char *line)
{
    for (size_t i = 0; i < r->nconns; i++)
        if (r->conns[i]->state == JOINED)
            conn_reply_str(r->conns[i], line);
}

/* The gang's deadline, from the thread's sweep: a failed gang's waiting JOINs are told. */
static void gang_tick(tsp_rdv_t *r, int64_t now)
{
    pthread_mutex_lock(&r->mu);
    int failed = r->gang && tsp_gang_state(r->gang, now) == TSP_GANG_FAILED;
    char why[600] = "";
    if (failed) /* the same reason a late JOIN gets */
        tsp_gang_reason(r->gang, why, sizeof why);
    pthread_mutex_unlock(&r->mu);
    if (failed) {
        char line[640];
        snprintf(line, sizeof line, "ERR %s", why);
        gang_answer(r, line);
    }
}

/* NODE TRY HOST (n bytes) of a JOIN: 0 when the fields parse. The connection is TLS keyed
 * by the run's secret: only a holder of the secret can send a JOIN, so it carries no MAC of
 * its own (the server itself consumes it; nothing relays it). */
static int gang_parse(const char *s, size_t n, int *node, int *try_no, char *host)
{
    char fields[TSP_GANG_HOST_MAX + 64], end = 0;
    if (n == 0 || n >= sizeof fields)
        return -EINVAL;
    memcpy(fields, s, n);
    fields[n] = 0;
    _Static_assert(TSP_GANG_HOST_MAX == 255, "the width below is TSP_GANG_HOST_MAX");
    if (sscanf(fields, "%d %d %255s%c", node, try_no, host, &end) != 3)
        return -EINVAL;
    return 0;
}

/* A JOIN's rest (after "JOIN "): admitted (waits for GO, or GO now for every one waiting),
 * or refused. */
static void gang_line(tsp_rdv_t *r, rdv_conn_t *c, const char *s, size_t n)
{
    int node = -1, try_no = -1;
    char host[TSP_GANG_HOST_MAX + 1] = "", why[600] = "", line[640];
    if (gang_parse(s, n, &node, &try_no, host)) {
        conn_reply_str(c, "ERR unknown request");
        return;
    }
    int64_t now = tsp__now_ms();
    pthread_mutex_lock(&r->mu);
    int got = r->gang ? tsp_gang_join(r->gang, node, try_no, host, now, why, sizeof why) : -1;
    int size = r->gang ? tsp_gang_size(r->gang) : 0;
    int64_t wait = r->gang ? tsp_gang_wait_ms(r->gang, now) : 0;
    pthread_mutex_unlock(&r->mu);
    if (got < 0) {
        conn_reply_str(c, "ERR this run does not launch as a gang");
    } else if (got == TSP_GANG_WAIT) {
        c->state = JOINED;
        c->deadline = now + (wait > 0 ? wait : 0);
    } else if (got == TSP_GANG_GO) {
        snprintf(line, sizeof line, "GO %d", size);
        gang_answer(r, line);
        conn_reply_str(c, line);
    } else {
        snprintf(line, sizeof line, "ERR %s", why);
        if (got == TSP_GANG_FAILED)
            gang_answer(r, line);
        conn_reply_str(c, line);
    }
}

/* One whole request line (n bytes, no newline) of c. */
static void handle_line(tsp_rdv_t *r, rdv_conn_t *c, size_t n)
{
    const char *rest = c->buf;
    size_t restlen = n;
    if (restlen > 4 && memcmp(rest, "PUT ", 4) == 0 && !mac_ok(r, rest + 4, restlen - 4)) {
        conn_reply_str(c, "ERR the election record's MAC does not match the run's key");
    } else if (restlen > 4 && memcmp(rest, "PUT ", 4) == 0 && r->record) {
        /* Accepted once: a later record cannot point the ranks elsewhere. The same record
         * again is rank 0 retrying a PUT whose OK it did not get. */
        int same = restlen - 4 == r->record_len && memcmp(rest + 4, r->record, r->record_len) == 0;
        conn_reply_str(c, same ? "OK" : "ERR the election record was already sent");
    } else if (restlen > 4 && memcmp(rest, "PUT ", 4) == 0) {
        char *rec = malloc(restlen - 4);
        if (!rec) {
            conn_reply_str(c, "ERR out of memory");
            return;
        }
        memcpy(rec, rest + 4, restlen - 4);
        r->record = rec;
        r->record_len = restlen - 4;
        count(r, &r->puts);
        conn_reply_str(c, "OK");
        answer_waiting(r);
    } else if (restlen > 5 && memcmp(rest, "JOIN ", 5) == 0) {
        gang_line(r, c, rest + 5, restlen - 5);
    } else if (restlen == 3 && memcmp(rest, "GET", 3) == 0) {
        if (r->record) {
            conn_reply(c, r->record, r->record_len);
            count(r, &r->gets);
        } else {
            c->state = WAITING;
            c->deadline = tsp__now_ms() + r->get_timeout_ms;
        }
    } else {
        conn_reply_str(c, "ERR unknown request");
    }
}

/* Reads what c has; 0 to keep it, -1 to drop it. */
static int conn_read(tsp_rdv_t *r, rdv_conn_t *c)
{
    for (;;) {
        char scratch[256];
        int reading = c->state == READING;
        char *to = reading ? c->buf + c->len : scratch;
        size_t room = reading ? sizeof(c->buf) - c->len : sizeof(scratch);
        ssize_t got = tsp__tls_read(c->tls, to, room);
        if (got == 0)
            return -1; /* gone: a half-sent request, or a GET that gave up */
        if (got == -EAGAIN) {
            c->events = tsp__tls_want(c->tls);
            return 0;
        }
        if (got < 0)
            return -1; /* a record that failed authentication, or TLS broke */
        if (!reading)
            continue; /* nothing more is expected of a waiting GET: ignored */
        char *nl = memchr(to, '\n', (size_t)got);
        c->len += (size_t)got;
        if (nl) {
            handle_line(r, c, (size_t)(nl - c->buf));
            return 0;
        }
        if (c->len > TSP_RDV_LINE_MAX) {
            conn_reply_str(c, "ERR request too long");
            return 0;
        }
    }
}

/* Sends what is left of c's reply; 0 to keep it, -1 when done or failed. */
static int conn_write(rdv_conn_t *c)
{
    while (c->off < c->len) {
        ssize_t w = tsp__tls_write(c->tls, c->buf + c->off, c->len - c->off);
        if (w == -EAGAIN) {
            c->events = tsp__tls_want(c->tls);
            return 0;
        }
        if (w < 0)
            return -1;
        c->off += (size_t)w;
    }
    tsp__tls_close_notify(c->tls);
    return -1;
}

/* One step of c's TLS handshake; 0 to keep it, -1 to drop it. A peer that does not know
 * the run's key is dropped without a reply: it learns nothing, not even an ERR. */
static int conn_handshake(tsp_rdv_t *r, rdv_conn_t *c)
{
    int rc = tsp__tls_handshake(c->tls);
    if (rc == -EAGAIN) {
        c->events = tsp__tls_want(c->tls);
        return 0;
    }
    if (rc)
        return -1;
    r->handshakes--;
    c->state = READING;
    c->events = POLLIN;
    return conn_read(r, c); /* the request may have come with the handshake's end */
}

/* Drops the oldest connection still in the handshake; 0 when there is none. */
static int drop_oldest_handshake(tsp_rdv_t *r)
{
    size_t old = r->nconns;
    for (size_t i = 0; i < r->nconns; i++)
        if (r->conns[i]->state == HANDSHAKE &&
            (old == r->nconns || r->conns[i]->deadline < r->conns[old]->deadline))
            old = i;
    if (old == r->nconns)
        return 0;
    conn_drop(r, old);
    return 1;
}

/* ---- the thread -------------------------------------------------------------------- */

static void do_accept(tsp_rdv_t *r)
{
    for (;;) {
        int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            /* Out of descriptors: the oldest peer still in the handshake makes room (an
             * idle flood cannot keep a task out, whose handshake takes one round trip);
             * with none, the listener rests a moment instead of being polled again at
             * once (it stays readable: a spin; connections wait in the backlog). */
            int full = errno == EMFILE || errno == ENFILE;
            if (full && drop_oldest_handshake(r))
                continue;
            if (full)
                r->accept_paused_until = tsp__now_ms() + ACCEPT_PAUSE_MS;
            return; /* EAGAIN: the next round tries again */
        }
        if (r->nconns == r->cap) {
            size_t cap = r->cap ? r->cap * 2 : 16;
            /* NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers */
            rdv_conn_t **cs = realloc(r->conns, cap * sizeof(rdv_conn_t *));
            struct pollfd *ps = cs ? realloc(r->pfds, (cap + 2) * sizeof(*ps)) : NULL;
            if (cs)
                r->conns = cs;
            if (!cs || !ps) {
                close(fd);
                return;
            }
            r->pfds = ps;
            r->cap = cap;
        }
        rdv_conn_t *c = malloc(sizeof(*c));
        if (!c || tsp__tls_new(&c->tls, r->tls, fd)) {
            free(c);
            close(fd);
            return;
        }
        if (r->handshakes >= HANDSHAKES_MAX) /* the oldest in the handshake makes room */
            drop_oldest_handshake(r);
        c->fd = fd;
        c->state = HANDSHAKE;
        c->events = POLLIN;
        c->len = c->off = 0;
        c->deadline = tsp__now_ms() + TSP_RDV_CONNECT_TIMEOUT_MS;
        r->conns[r->nconns++] = c;
        r->handshakes++;
    }
}

/* The run ended: waiting GETs are told so, half-read requests dropped. */
static void end_run(tsp_rdv_t *r)
{
    close(r->lfd);
    r->lfd = -1;
    for (size_t i = r->nconns; i-- > 0;) {
        rdv_conn_t *c = r->conns[i];
        if (c->state == WAITING || c->state == JOINED)
            conn_reply_str(c, "ERR the run ended");
        else if (c->state == READING || c->state == HANDSHAKE)
            conn_drop(r, i);
    }
}

/* Deadlines: a request not sent in time or a reply not taken is dropped; a GET whose
 * time ran out is answered. The poll timeout until the next one. */
static int sweep(tsp_rdv_t *r)
{
    int64_t now = tsp__now_ms(), next = -1;
    gang_tick(r, now);
    for (size_t i = r->nconns; i-- > 0;) {
        rdv_conn_t *c = r->conns[i];
        if (c->deadline <= now) {
            if (c->state == JOINED) {
                c->deadline = now + TSP_RDV_CONNECT_TIMEOUT_MS; /* gang_tick answers it */
            } else if (c->state != WAITING) {
                conn_drop(r, i);
                continue;
            } else {
                char why[96];
                int ms = r->get_timeout_ms;
                snprintf(why, sizeof why, "ERR rank 0 sent no election record within %d %s",
                         ms >= 1000 ? ms / 1000 : ms, ms >= 1000 ? "s" : "ms");
                conn_reply_str(c, why);
            }
        }
        if (next < 0 || c->deadline < next)
            next = c->deadline;
    }
    return next < 0 ? -1 : (int)(next - now + 1);
}

static void serve_ready(tsp_rdv_t *r, size_t npfds)
{
    /* pfds[2 + i] is conns[i] as it was when polled; a drop moves the last one into i,
     * so walk backwards. */
    for (size_t k = npfds; k-- > 2;) {
        size_t i = k - 2;
        short ev = r->pfds[k].revents;
        if (!ev || i >= r->nconns)
            continue;
        rdv_conn_t *c = r->conns[i];
        int drop = 0;
        if (c->state == HANDSHAKE)
            drop = conn_handshake(r, c);
        else if (c->state != WRITING)
            drop = conn_read(r, c);
        if (!drop && c->state == WRITING)
            drop = conn_write(c);
        if (drop)
            conn_drop(r, i);
    }
}

static void *rdv_main(void *arg)
{
    tsp_rdv_t *r = arg;
    int ending = 0;
    int64_t drain_until = 0;
    for (;;) {
        int timeout = sweep(r);
        if (ending) {
            int64_t left = drain_until - tsp__now_ms();
            if (!r->nconns || left <= 0)
                break;
            if (timeout < 0 || timeout > left)
                timeout = (int)left;
        }
        r->pfds[0] = (struct pollfd){.fd = r->wake_fd, .events = POLLIN};
        int64_t rest = r->accept_paused_until - tsp__now_ms();
        if (rest > 0 && (timeout < 0 || timeout > rest))
            timeout = (int)rest;
        /* -1 (not polled) once ended or while resting */
        r->pfds[1] = (struct pollfd){.fd = rest > 0 ? -1 : r->lfd, .events = POLLIN};
        for (size_t i = 0; i < r->nconns; i++) {
            rdv_conn_t *c = r->conns[i];
            r->pfds[2 + i] = (struct pollfd){.fd = c->fd, .events = c->events};
        }
        size_t npfds = 2 + r->nconns;
        int n = poll(r->pfds, npfds, timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        serve_ready(r, npfds);
        if (r->pfds[0].revents) {
            uint64_t v;
            ssize_t got = read(r->wake_fd, &v, sizeof v);
            (void)got; /* only resets the eventfd */
            pthread_mutex_lock(&r->mu);
            int closing = r->closing;
            pthread_mutex_unlock(&r->mu);
            if (closing && !ending) {
                ending = 1;
                drain_until = tsp__now_ms() + DRAIN_MS;
                end_run(r);
            }
        }
        if (!ending && r->pfds[1].revents)
            do_accept(r);
    }
    while (r->nconns)
        conn_drop(r, r->nconns - 1);
    return NULL;
}

/* ---- setup and the API ------------------------------------------------------------- */

static int bind_listen(tsp_rdv_t *r, const char *host, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    int rc = getaddrinfo(host, "0", &hints, &res);
    if (rc)
        return tsp__err(err, errlen, -EADDRNOTAVAIL, "cannot resolve the rendezvous address %s: %s",
                        host, gai_strerror(rc));
    int e = EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        char port[16];
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&ss, sl, r->host, sizeof r->host, port, sizeof port,
                        NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
            r->lfd = fd;
            r->port = atoi(port);
            freeaddrinfo(res);
            return 0;
        }
        e = errno;
        close(fd);
    }
    freeaddrinfo(res);
    return tsp__err(err, errlen, -e, "cannot listen on %s for the rendezvous: %s", host,
                    strerror(e));
}

static int rdv_setup(tsp_rdv_t *r, const char *host, const char *secret_hex, char *err,
                     size_t errlen)
{
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    if (!secret_hex || strlen(secret_hex) != 2 * TSP_WIRE_SECRET_LEN ||
        tsp__hex_decode(secret_hex, secret, sizeof secret))
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the rendezvous needs the run's secret as 64 hex digits");
    int rc = tsp__tlsctx_new_for(&r->tls, 1, secret, TSP__TLS_RDV_LABEL, err, errlen);
    if (!rc && tsp__tls_derive(secret, TSP__RDV_MAC_LABEL, r->mac_key))
        rc = tsp__err(err, errlen, -EIO, "cannot derive the rendezvous record's key");
    OPENSSL_cleanse(secret, sizeof secret);
    if (rc)
        return rc;
    rc = bind_listen(r, host && *host ? host : "127.0.0.1", err, errlen);
    if (rc)
        return rc;
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->pfds = malloc(2 * sizeof(*r->pfds));
    if (r->wake_fd < 0 || !r->pfds)
        return tsp__err(err, errlen, -ENOMEM, "cannot set up the rendezvous: %s", strerror(errno));
    if ((rc = pthread_create(&r->thread, NULL, rdv_main, r)))
        return tsp__err(err, errlen, -rc, "cannot start the rendezvous thread: %s", strerror(rc));
    return 0;
}

tsp_rdv_t *tsp_rdv_start(const char *host, const char *secret_hex, int get_timeout_ms, char *err,
                         size_t errlen)
{
    tsp_rdv_t *r = calloc(1, sizeof(*r));
    if (!r) {
        tsp__err(err, errlen, -ENOMEM, "out of memory");
        return NULL;
    }
    r->lfd = r->wake_fd = -1;
    r->get_timeout_ms = get_timeout_ms > 0 ? get_timeout_ms : TSP_RDV_GET_TIMEOUT_MS;
    pthread_mutex_init(&r->mu, NULL);
    if (rdv_setup(r, host, secret_hex, err, errlen)) {
        if (r->lfd >= 0)
            close(r->lfd);
        if (r->wake_fd >= 0)
            close(r->wake_fd);
        tsp__tlsctx_free(r->tls);
        pthread_mutex_destroy(&r->mu);
        free(r->pfds);
        free(r);
        return NULL;
    }
    return r;
}

int tsp_rdv_port(const tsp_rdv_t *r)
{
    return r->port;
}

const char *tsp_rdv_host(const tsp_rdv_t *r)
{
    return r->host;
}

void tsp_rdv_counts(tsp_rdv_t *r, int *puts, int *gets)
{
    pthread_mutex_lock(&r->mu);
    if (puts)
        *puts = r->puts;
    if (gets)
        *gets = r->gets;
    pthread_mutex_unlock(&r->mu);
}

int tsp_rdv_gang(tsp_rdv_t *r, int nnodes, int timeout_ms)
{
    tsp_gang_t *g = tsp_gang_new(nnodes, tsp__now_ms(), timeout_ms);
    if (!g)
        return -EINVAL;
    pthread_mutex_lock(&r->mu);
    tsp_gang_t *old = r->gang;
    r->gang = old ? old : g;
    pthread_mutex_unlock(&r->mu);
    if (old) {
        tsp_gang_free(g);
        return -EALREADY;
    }
    return 0;
}

int tsp_rdv_gang_state(tsp_rdv_t *r, int *joined)
{
    pthread_mutex_lock(&r->mu);
    int state = r->gang ? tsp_gang_state(r->gang, tsp__now_ms()) : -EINVAL;
    if (joined)
        *joined = r->gang ? tsp_gang_joined(r->gang) : 0;
    pthread_mutex_unlock(&r->mu);
    return state;
}

int tsp_rdv_gang_failure(tsp_rdv_t *r, int executors, int cores, const char *max_executors,
                         char *buf, size_t len)
{
    pthread_mutex_lock(&r->mu);
    int n =
        r->gang ? tsp_gang_failure(r->gang, executors, cores, max_executors, buf, len) : -EINVAL;
    pthread_mutex_unlock(&r->mu);
    return n;
}

int tsp_rdv_gang_report(tsp_rdv_t *r, int executors, int cores, const char *max_executors,
                        char *buf, size_t len)
{
    pthread_mutex_lock(&r->mu);
    int n = r->gang ? tsp_gang_report(r->gang, executors, cores, max_executors, buf, len) : -EINVAL;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void tsp_rdv_close(tsp_rdv_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    int was = r->closing;
    r->closing = 1;
    pthread_mutex_unlock(&r->mu);
    if (was)
        return;
    uint64_t one = 1;
    ssize_t w = write(r->wake_fd, &one, sizeof one);
    (void)w; /* an eventfd write only fails when the counter is saturated: still awake */
    pthread_join(r->thread, NULL);
}

void tsp_rdv_free(tsp_rdv_t *r)
{
    if (!r)
        return;
    tsp_rdv_close(r);
    if (r->lfd >= 0)
        close(r->lfd);
    close(r->wake_fd);
    pthread_mutex_destroy(&r->mu);
    tsp__tlsctx_free(r->tls);
    OPENSSL_cleanse(r->mac_key, sizeof r->mac_key);
    free(r->record);
    tsp_gang_free(r->gang);
    free(r->conns);
    free(r->pfds);
    free(r);
}
