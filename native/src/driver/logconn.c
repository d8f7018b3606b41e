/* logconn.c: one agent connection's life on the driver's log server: the send buffer
 * and epoll arming, rejection with a reason, the frame handlers (handshake, lines, output,
 * dispatch) and the parser, reading with backpressure (pause when the pull queue is full,
 * resume round robin when it has room), acknowledgements, and the goodbye of the drain
 * (docs/protocol.md, part 1). The control channel is logctl.c; the epoll thread that
 * drives all this is logserver.c. */
#include "logconn.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lines.h"
#include "logctl.h"
#include "logsend.h"
#include "util.h"

#define CONN_BUF_MIN (64u * 1024u)
#define LINGER_MS 2000 /* after CLOSE: wait for the agent to take the final ACK */
#define SINK_FLUSH (64u * 1024u)

/* ---- connections ---------------------------------------------------------------- */

static void conn_who(const conn_t *c, char *out, size_t n)
{
    if (c->state >= C_OPEN && c->h.host[0]) /* a host name is only told once authenticated */
        snprintf(out, n, "%s (host %s, node rank %d)", c->peer, c->h.host, c->h.node_rank);
    else
        snprintf(out, n, "%s", c->peer);
}

void tsp__conn_reject(tsp_logserver_t *s, conn_t *c, const char *why)
{
    tsp__conn_reject_flags(s, c, 0, why);
}

/* Drops a connection with a reason: logged, told to the peer (best effort), counted. */
void tsp__conn_reject_flags(tsp_logserver_t *s, conn_t *c, unsigned flags, const char *why)
{
    char who[400];
    conn_who(c, who, sizeof(who));
    if (c->state < C_OPEN)
        tsp__event_preauth(s,
                           "torchspark log server: dropped the connection from %s before it "
                           "authenticated: %s",
                           c->peer, why);
    else
        tsp__event(s, "torchspark log server: dropped the connection from %s: %s", who, why);
    /* Counted before the peer can read the reason, so that stats agree with what it saw. */
    pthread_mutex_lock(&s->q.mu);
    s->q.st.rejected++;
    pthread_mutex_unlock(&s->q.mu);
    size_t n = strlen(why);
    tsp__conn_send_flags(s, c, TSP_WIRE_ERROR, flags, why,
                         n > TSP_WIRE_MAX_TEXT ? TSP_WIRE_MAX_TEXT
                         : n                   ? n
                                               : 1);
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
        c->deadline = tsp__now_ms() + LINGER_MS;
        tsp__conn_arm(s, c);
        return;
    }
    tsp__conn_free(s, c);
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
        snprintf(err, errlen,
                 "the agent belongs to another run (its secret differs); check "
                 "TORCHSPARK_LOG_SECRET");
        return -EACCES;
    }
    memcpy(c->hello, p, n);
    c->hello_len = n;
    uint8_t ch[TSP_WIRE_CHALLENGE_LEN];
    if (tsp__random_bytes(c->nonce_s, sizeof(c->nonce_s))) {
        return tsp__err(err, errlen, -EIO, "no random bytes for the challenge");
    }
    tsp_wire_challenge_pack(ch, c->h.version, c->nonce_s);
    c->state = C_AUTH;
    return tsp__conn_send(s, c, TSP_WIRE_CHALLENGE, ch, sizeof(ch));
}

static int on_auth(tsp_logserver_t *s, conn_t *c, const uint8_t *p, size_t n, char *err,
                   size_t errlen)
{
    if (tsp_wire_mac_verify(s->secret, 0, c->hello, c->hello_len, c->nonce_s, p, n)) {
        return tsp__err(err, errlen, -EACCES,
                        "authentication failed (wrong secret or a replayed handshake)");
    }
    uint8_t mac[TSP_WIRE_MAC_LEN];
    if (tsp_wire_mac(s->secret, 1, c->hello, c->hello_len, c->nonce_s, mac)) {
        return tsp__err(err, errlen, -EIO, "HMAC failed on the driver");
    }
    /* The one output slot goes to an authenticated agent only: a stranger cannot hold it. */
    int rc = 0;
    if (c->h.role == TSP_WIRE_ROLE_OUTPUT && (rc = tsp__outrecv_claim(&s->out, c, err, errlen)))
        return rc;
    agent_rec_t *a = agent_find(s, c->h.agent_id, &c->agent);
    if (!a) {
        return tsp__err(err, errlen, -ENOMEM, "out of memory");
    }
    c->acked = a->seq;
    c->state = C_OPEN;
    s->nunauth--;
    c->control = c->h.role == TSP_WIRE_ROLE_LOGS && (c->h.hflags & TSP_WIRE_HELLO_CONTROL);
    c->keepalive = c->control && (c->h.hflags & TSP_WIRE_HELLO_KEEPALIVE);
    c->rx_at = tsp__now_ms();
    tsp__lost_forget(s, c->h.agent_id); /* it is back */
    pthread_mutex_lock(&s->q.mu);
    s->q.st.authenticated++;
    pthread_mutex_unlock(&s->q.mu);
    rc = tsp__conn_send_flags(s, c, TSP_WIRE_WELCOME, c->control ? TSP_WIRE_WELCOME_CONTROL : 0,
                              mac, sizeof(mac));
    if (!rc && c->control && s->t_stopped && c->h.agent_id != s->stop_except)
        tsp__conn_stop(s, c);
    /* Tell a reconnecting agent at once what this server already has. */
    if (!rc && a->seq) {
        uint8_t ack[8];
        tsp_wire_put_u64(ack, a->seq);
        rc = tsp__conn_send(s, c, TSP_WIRE_ACK, ack, 8);
    }
    return rc;
}

static void sink_line(tsp_logserver_t *s, const tsp_wire_hdr_t *h, const uint8_t *d, size_t n)
{
    char pre[256];
    size_t pl = tsp_lines_prefix(pre, sizeof(pre), s->prefix, s->marker, h->rank, h->stream);
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

void tsp__sink_flush(tsp_logserver_t *s)
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

/* Under q.mu: a report (protocol 1.8) into its own queue (rq.mu nests inside q.mu; nothing
 * takes q.mu while holding rq.mu). Same rules as a line: 0, or -EAGAIN when full. */
static int report_locked(tsp_logserver_t *s, agent_rec_t *a, const tsp_wire_hdr_t *h,
                         const uint8_t *p, uint64_t seq)
{
    size_t n = h->length - 8;
    pthread_mutex_lock(&s->rq.mu);
    int rc = 0;
    if (tsp__logq_full_locked(&s->rq)) {
        s->rq.paused = 1;
        rc = -EAGAIN;
    } else if (tsp__logq_push_locked(&s->rq, h->rank, h->stream, h->flags, p + 8, n, 1)) {
        rc = -EAGAIN;
    }
    pthread_mutex_unlock(&s->rq.mu);
    if (rc)
        return rc;
    s->q.st.lines++;
    s->q.st.bytes += n;
    a->seq = seq;
    return 0;
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
    if (h->stream == TSP_STREAM_REPORT)
        return report_locked(s, a, h, p, seq);
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
    if (rc == 0 && s->o.sink_fd >= 0 && h->stream != TSP_STREAM_REPORT) {
        sink_line(s, h, p + 8, h->length - 8);
        if (s->sink_len >= SINK_FLUSH)
            tsp__sink_flush(s);
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
        return rc ? rc : tsp__conn_send(s, c, TSP_WIRE_OUT_DONE, p, TSP_WIRE_DIGEST_LEN);
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
        if (open_logs && c->control) {
            int rc = tsp__on_event(s, c, h, p);
            if (rc == -ENOMEM)
                snprintf(err, errlen,
                         "no memory for the agent's failure report (not "
                         "acknowledged: the agent resends it when it reconnects)");
            return rc;
        }
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
    case TSP_WIRE_PING: /* nothing but proof of life: rx_at was updated by the read */
        if (open_logs && c->keepalive)
            return 0;
        break;
    case TSP_WIRE_CLOSE:
        if (c->state == C_OPEN) {
            tsp__conn_send(s, c, TSP_WIRE_CLOSE, NULL, 0);
            return 1;
        }
        break;
    case TSP_WIRE_ERROR: {
        /* A stranger's text is never printed; an agent's is, made printable (tsp__event). */
        if (c->state != C_OPEN)
            return tsp__err(err, errlen, -ECONNABORTED,
                            "it sent an ERROR frame before authenticating");
        size_t n = h->length;
        return tsp__err(err, errlen, -ECONNABORTED, "the agent reported: %.*s", (int)n,
                        (const char *)p);
    }
    default:
        break;
    }
    return tsp__err(err, errlen, -EBADMSG, "unexpected %s frame %s", tsp_wire_type_name(h->type),
                    c->state == C_OPEN ? "after the handshake" : "during the handshake");
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
            rc = tsp__outrecv_chunk(&s->out, c, h.length, c->buf + off + TSP_WIRE_HDR_LEN, have,
                                    err, sizeof(err));
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
        /* Only tsp__outrecv_begin says -EFBIG: the output is over the driver's limit. */
        tsp__conn_reject_flags(s, c, rc == -EFBIG ? TSP_WIRE_ERROR_OVER_LIMIT : 0, err);
        return rc;
    }
    if (rc == 1) {
        tsp__conn_free(s, c);
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
    if (tsp__conn_send(s, c, TSP_WIRE_ACK, p, 8) == 0)
        c->acked = seq;
}

static void conn_pause(tsp_logserver_t *s, conn_t *c)
{
    c->paused = 1;
    tsp__conn_arm(s, c);
}

/* The connection's reader for the output receiver: TLS's failures are the connection's,
 * not the transfer's (-EBADMSG there means "the transfer failed"). */
static ssize_t tls_read_fn(void *ctx, void *buf, size_t n)
{
    ssize_t r = tsp__tls_read(ctx, buf, n);
    return r == -EBADMSG ? -EPROTO : r;
}

/* Receives output chunk data in place. 1 took some and the chunk may have more, 0 the
 * socket is empty, -1 the connection is gone. */
static int conn_read_chunk(tsp_logserver_t *s, conn_t *c)
{
    char err[600] = "";
    ssize_t n = tsp__outrecv_recv(&s->out, c, tls_read_fn, c->tls, c->chunk_left, err, sizeof(err));
    if (n == -EAGAIN)
        return 0;
    if (n == -EBADMSG) {
        tsp__conn_reject(s, c, err);
        return -1;
    }
    if (n == -EPROTO) { /* a record failed authentication: bytes altered on the way */
        char why[400];
        snprintf(why, sizeof(why), "the output transfer broke: %s", tsp__tls_why(c->tls));
        tsp__conn_reject(s, c, why);
        return -1;
    }
    if (n < 0) {
        tsp__conn_free(s, c);
        return -1;
    }
    c->chunk_left -= (uint32_t)n;
    return 1;
}

/* The connection ended or broke (n: 0 at its end, else -errno from TLS): a lost agent
 * once open, a refused handshake before. Frees c. */
static void conn_read_failed(tsp_logserver_t *s, conn_t *c, ssize_t n)
{
    if (n == -EBADMSG) { /* a record failed authentication: bytes altered on the way */
        char why[400];
        snprintf(why, sizeof(why), "the TLS channel broke: %s", tsp__tls_why(c->tls));
        if (c->state == C_OPEN && c->h.role == TSP_WIRE_ROLE_LOGS)
            tsp__lost_add(s, c, why, s->o.lost_grace_ms);
        tsp__conn_reject(s, c, why);
        return;
    }
    if (c->state == C_OPEN || c->state == C_LINGER) {
        /* TCP gave up after 5 s without an answer (TCP_USER_TIMEOUT): like a silent
         * agent (logctl.c), no lost grace on top. */
        int timedout = n == -ETIMEDOUT;
        tsp__lost_add(s, c,
                      n == 0     ? "it closed without saying goodbye (the agent or its host died)"
                      : timedout ? "no answer for about 5 s (host down or network cut)"
                                 : strerror((int)-n),
                      timedout ? 0 : s->o.lost_grace_ms);
        tsp__conn_free(s, c);
    } else {
        tsp__conn_reject(
            s, c, n == 0 ? "closed during the handshake" : "read error during the handshake");
    }
}

/* An agent of version 1 or 2 speaks frames in clear where TLS is expected (protocol
 * 1.10): it gets a plaintext ERROR naming the versions, the only plaintext byte the driver
 * sends. What is not TLS is taken into c->pre as it comes (taken, so that epoll does not
 * report it again), up to a HELLO's header, magic and version. Returns 0 a TLS client (or
 * nothing yet), 2 wait for more, 1 refused (the connection is gone). */
static int refuse_plaintext(tsp_logserver_t *s, conn_t *c)
{
    uint8_t *b = c->pre;
    if (c->prelen == 0) {
        uint8_t first;
        ssize_t n = recv(c->fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n <= 0 || first == 0x16) /* 0x16: a TLS handshake record */
            return 0;
    }
    ssize_t n = recv(c->fd, b + c->prelen, sizeof(c->pre) - c->prelen, MSG_DONTWAIT);
    if (n > 0)
        c->prelen += (size_t)n;
    int alive = n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR));
    if (b[0] == TSP_WIRE_HELLO && c->prelen < sizeof(c->pre) && alive)
        return 2;
    char why[200];
    if (c->prelen == sizeof(c->pre) && b[0] == TSP_WIRE_HELLO &&
        !memcmp(b + TSP_WIRE_HDR_LEN, "TSPL", 4))
        snprintf(why, sizeof(why),
                 "protocol version %u not supported; this driver speaks %d (TLS 1.3, "
                 "docs/protocol.md 1.10)",
                 (unsigned)b[TSP_WIRE_HDR_LEN + 4] << 8 | b[TSP_WIRE_HDR_LEN + 5],
                 TSP_WIRE_VERSION);
    else
        snprintf(why, sizeof(why), "not a torchspark log client (no TLS 1.3 handshake)");
    tsp__event(s, "torchspark log server: dropped the connection from %s: %s", c->peer, why);
    pthread_mutex_lock(&s->q.mu);
    s->q.st.rejected++;
    pthread_mutex_unlock(&s->q.mu);
    uint8_t f[TSP_WIRE_HDR_LEN + sizeof(why)];
    int len = snprintf((char *)f + TSP_WIRE_HDR_LEN, sizeof(why), "%s", why);
    tsp_wire_hdr_t h = {.type = TSP_WIRE_ERROR, .rank = -1, .length = (uint32_t)len};
    tsp_wire_hdr_pack(f, &h);
    ssize_t w = send(c->fd, f, TSP_WIRE_HDR_LEN + (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w; /* best effort */
    tsp__conn_free(s, c);
    return 1;
}

/* One step of the TLS handshake (protocol 1.10). 0 done or waiting, -1 the connection is
 * gone. */
static int conn_tls_step(tsp_logserver_t *s, conn_t *c)
{
    if (!c->tls_started) {
        int p = refuse_plaintext(s, c);
        if (p == 1)
            return -1;
        if (p == 2)
            return 0;
    }
    c->tls_started = 1;
    int rc = tsp__tls_handshake(c->tls);
    int out = rc == -EAGAIN && tsp__tls_want(c->tls) == POLLOUT;
    if (rc == -EAGAIN) {
        if (out != c->tls_out) {
            c->tls_out = out;
            tsp__conn_arm(s, c);
        }
        return 0;
    }
    if (rc) {
        tsp__conn_reject(
            s, c, rc == -ECONNRESET ? "closed during the TLS handshake" : tsp__tls_why(c->tls));
        return -1;
    }
    c->state = C_HELLO;
    if (c->tls_out) {
        c->tls_out = 0;
        tsp__conn_arm(s, c);
    }
    return 0;
}

/* Reads what the connection has and handles it. Returns 0 while the connection lives. */
int tsp__conn_read(tsp_logserver_t *s, conn_t *c)
{
    if (c->state == C_TLS) {
        if (conn_tls_step(s, c))
            return -1;
        if (c->state == C_TLS)
            return 0;
    }
    /* TLS may hold decrypted bytes that epoll does not see: take them before leaving. */
    for (int round = 0; round < 16 || tsp__tls_pending(c->tls); round++) {
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
        ssize_t n = tsp__tls_read(c->tls, c->buf + c->len, room);
        if (n == -EAGAIN)
            break;
        if (n <= 0) {
            conn_read_failed(s, c, n);
            return -1;
        }
        if (c->state == C_LINGER) { /* discarding: lines it sent now are not acked */
            c->len = 0;
            continue;
        }
        c->len += (size_t)n;
        c->rx_at = tsp__now_ms();
        int rc = conn_parse(s, c);
        if (rc == -EAGAIN) {
            conn_ack(s, c);
            conn_pause(s, c);
            return 0;
        }
        if (rc)
            return -1;
        /* Short of room and of a full TLS record (16 KiB): the socket is likely empty.
         * A full record says more may follow (an agent's batch is cut into records): read
         * on, so that one ACK answers the batch, not each record. */
        if ((size_t)n < room && (size_t)n < TSP__TLS_RECORD && !tsp__tls_pending(c->tls))
            break;
    }
    conn_ack(s, c);
    return 0;
}

/* After the pull queue made room or the output's hasher caught up: connections whose TLS
 * holds decrypted bytes are read now, since epoll will not say so. */
void tsp__conn_kick_pending(tsp_logserver_t *s)
{
    for (conn_t *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (!c->paused && c->state != C_TLS && tsp__tls_pending(c->tls))
            tsp__conn_read(s, c);
    }
}

void tsp__conn_flush(tsp_logserver_t *s, conn_t *c)
{
    tsp__conn_write(c);
    tsp__conn_arm(s, c);
}

/* After the pull queue made room: read paused connections again, buffered frames first.
 * Round robin: when the queue fills again, the next round starts where this one stopped,
 * so that under a slow consumer every agent progresses, not just the first in the list. */
void tsp__resume_all(tsp_logserver_t *s)
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
                tsp__conn_arm(s, c);
                conn_ack(s, c);
            }
        }
        c = next;
    }
    s->resume_at = NULL;
}

/* The output's hashing thread failed (the file could not be written): the agent is told
 * now, not at its next chunk, which may never come. */
void tsp__output_failed(tsp_logserver_t *s)
{
    char why[512];
    void *owner = tsp__outrecv_failed(&s->out, why, sizeof(why));
    for (conn_t *c = s->conns; owner && c; c = c->next)
        if (c == owner) {
            tsp__conn_reject(s, c, why);
            break;
        }
}

/* Ends a connection during the drain: final ACK and CLOSE, then linger until EOF. */
void tsp__conn_goodbye(tsp_logserver_t *s, conn_t *c)
{
    if (c->state != C_OPEN) {
        tsp__conn_free(s, c);
        return;
    }
    conn_ack(s, c);
    tsp__conn_send(s, c, TSP_WIRE_CLOSE, NULL, 0);
    shutdown(c->fd, SHUT_WR);
    c->state = C_LINGER;
    c->paused = 0;
    c->len = 0;
    c->deadline = tsp__now_ms() + LINGER_MS;
    tsp__conn_arm(s, c);
}
