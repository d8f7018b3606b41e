/* logclient.c: the agent's half of the log channel: a never-blocking line sink in front
 * of a bounded queue of encoded frames, and one sender thread that owns the connection
 * (connect, handshake, send, acknowledgements, reconnect with backoff, local fallback).
 *
 * Why a thread rather than the agent's epoll: the handshake and reconnects have their own
 * timeouts and backoff, and a slow or unreachable driver must never delay the agent's
 * reaction to a dying worker; the only thing the two share is the queue's mutex.
 *
 * The queue is a list of blocks holding frames back to back; byte offsets are absolute
 * (since the client started), so "sent up to" survives a reconnect as one number. A
 * block is freed once it is wholly sent and the driver acknowledged its last line.
 *
 * This file owns the sender thread (connect, send, acknowledgements, keepalive, reconnect
 * with backoff), the local fallback and the lifecycle; the queue the writers fill, and the
 * state both share, are logclientq.c's and logclientq.h's. */
#include "logclient.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "agentfold.h"
#include "logclientq.h"
#include "logdial.h"
#include "util.h"

void tsp_logclient_opts_init(tsp_logclient_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->node_rank = -1;
    o->mem_bytes = 16u << 20;
    o->connect_timeout_ms = 5000;
    o->reconnect_grace_ms = 10000;
    o->backoff_max_ms = 5000;
    o->stall_ms = 60000;
    o->event_flush_ms = 5000;
    o->local_out_fd = 1;
    o->local_err_fd = 2;
}

/* ---- the local fallback ------------------------------------------------------------- */

static void write_local(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* nowhere left to put it: the agent's stdout is gone */
        p += w;
        n -= (size_t)w;
    }
}

static void spill_block(tsp_logclient_t *c, const blk_t *b, uint64_t *lines)
{
    size_t off = 0;
    while (off + TSP_WIRE_HDR_LEN <= b->len) {
        tsp_wire_hdr_t h;
        if (tsp_wire_hdr_unpack(&h, (const uint8_t *)b->data + off, b->len - off,
                                TSP_WIRE_MAX_PAYLOAD, NULL, 0))
            return;
        const char *p = b->data + off + TSP_WIRE_HDR_LEN;
        if (h.type == TSP_WIRE_LINE) {
            /* Each stream to its own fd: no stderr marker; reports to stderr, marked. */
            char pre[64];
            size_t pl = tsp_lines_prefix(pre, sizeof(pre), NULL, "", h.rank, h.stream);
            int fd = h.stream == TSP_STREAM_STDOUT ? c->o.local_out_fd : c->o.local_err_fd;
            struct iovec iov[3] = {
                {pre, (size_t)pl}, {(void *)(p + 8), h.length - 8}, {(void *)"\n", 1}};
            int cnt = (h.flags & TSP_LINE_CONTINUED) ? 2 : 3;
            size_t total = (size_t)pl + h.length - 8 + (cnt == 3);
            ssize_t w = writev(fd, iov, cnt);
            if (w >= 0 && (size_t)w < total) { /* finish a short write piece by piece */
                char *tmp = malloc(total);
                if (tmp) {
                    memcpy(tmp, pre, (size_t)pl);
                    memcpy(tmp + pl, p + 8, h.length - 8);
                    tmp[total - 1] = cnt == 3 ? '\n' : tmp[total - 1];
                    write_local(fd, tmp + w, total - (size_t)w);
                    free(tmp);
                }
            }
            (*lines)++;
        }
        off += TSP_WIRE_HDR_LEN + h.length;
    }
}

/* Writes everything queued to the agent's own stdout/stderr (no driver to send to). */
static void spill_all(tsp_logclient_t *c)
{
    pthread_mutex_lock(&c->mu);
    blk_t *list = c->head;
    c->head = c->tail = NULL;
    c->sent = c->appended;
    size_t freed = 0;
    for (blk_t *b = list; b; b = b->next)
        freed += b->len;
    pthread_mutex_unlock(&c->mu);
    uint64_t lines = 0;
    for (blk_t *b = list, *n; b; b = n) {
        n = b->next;
        spill_block(c, b, &lines);
        free(b);
    }
    pthread_mutex_lock(&c->mu);
    c->bytes -= freed;
    c->st.local += lines;
    tsp__logclient_release_locked(c);
    pthread_mutex_unlock(&c->mu);
}

/* One warning on the agent's own stderr, written whole (at most 1 KiB). */
__attribute__((format(printf, 2, 3))) static void warn_local(tsp_logclient_t *c, const char *fmt,
                                                             ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    write_local(c->o.local_err_fd, msg,
                n > 0 && (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
}

static void warn_fallback(tsp_logclient_t *c, const char *why)
{
    if (c->warned)
        return;
    c->warned = 1;
    warn_local(c,
               "%swarning: cannot reach the driver's log server at %s:%d "
               "from host %s (node rank %d): %s. Worker output goes to this executor's "
               "own stdout/stderr instead; training continues. Check that the driver "
               "is reachable from the executors and that TORCHSPARK_LOG_SECRET matches; "
               "retrying in the background.\n",
               c->who, c->host, c->o.port, c->hostname, c->o.node_rank, why);
}

/* close's bound passed with lines the driver, reached before, did not acknowledge: a
 * driver frozen or cut off, or a stop that leaves no time (the task kill path). */
static void warn_unacked(tsp_logclient_t *c)
{
    c->warned = 1;
    warn_local(c,
               "%swarning: the driver's log server at %s:%d did not acknowledge the last "
               "lines of host %s (node rank %d) within %d ms of the agent's end (the "
               "driver is frozen, overloaded or cut off); they follow on this executor's "
               "own stdout/stderr, and may also reach the driver.\n",
               c->who, c->host, c->o.port, c->hostname, c->o.node_rank, c->close_ms);
}

/* ---- the sender thread ------------------------------------------------------------- */

static void conn_lost(tsp_logclient_t *c)
{
    tsp__tls_close(c->tls);
    c->tls = NULL;
    c->fd = -1;
    c->ping_left = 0;
    c->lost_at = tsp__now_ms();
    pthread_mutex_lock(&c->mu);
    c->st.connected = 0;
    pthread_mutex_unlock(&c->mu);
}

/* Under mu: where to resend from after a reconnect: the first LINE not acknowledged.
 * Starting at the head block instead would resend its acknowledged lines, which a new
 * server (a restarted driver) cannot recognise as duplicates. */
static uint64_t resume_offset(tsp_logclient_t *c)
{
    for (blk_t *b = c->head; b; b = b->next) {
        size_t off = 0;
        while (off + TSP_WIRE_HDR_LEN <= b->len) {
            tsp_wire_hdr_t h;
            if (tsp_wire_hdr_unpack(&h, (const uint8_t *)b->data + off, b->len - off,
                                    TSP_WIRE_MAX_PAYLOAD, NULL, 0))
                return b->base + off;
            if ((h.type == TSP_WIRE_LINE || h.type == TSP_WIRE_EVENT) &&
                tsp_wire_get_u64((const uint8_t *)b->data + off + TSP_WIRE_HDR_LEN) > c->acked)
                return b->base + off;
            off += TSP_WIRE_HDR_LEN + h.length;
        }
    }
    return c->appended;
}

static int try_connect(tsp_logclient_t *c, int timeout_ms, char *err, size_t errlen)
{
    int wflags = 0, fd;
    tsp__tls_t *t = NULL;
    for (;;) {
        int hflags = (c->o.drop ? TSP_WIRE_HELLO_DROP : 0) |
                     (c->no_control ? 0 : TSP_WIRE_HELLO_CONTROL | TSP_WIRE_HELLO_KEEPALIVE);
        fd = tsp__logdial(c->host, c->o.port, c->o.secret, TSP_WIRE_ROLE_LOGS, hflags, c->agent_id,
                          c->o.node_rank, c->hostname, timeout_ms, &t, &wflags, err, errlen);
        if (fd == 0)
            fd = tsp__tls_fd(t);
        /* A driver of the first version-1 release refuses the CONTROL flag (1.7), one
         * before KEEPALIVE that flag: go on without the control channel and PINGs. */
        if (fd == -EACCES && !c->no_control && strstr(err, "unknown HELLO flags")) {
            c->no_control = 1;
            continue;
        }
        break;
    }
    pthread_mutex_lock(&c->mu);
    if (fd >= 0) {
        c->control = (wflags & TSP_WIRE_WELCOME_CONTROL) ? 1 : 0;
        c->fd = fd;
        c->tls = t;
        c->progress_at = c->tx_at = tsp__now_ms();
        c->sent = resume_offset(c);           /* resend what is not acked */
        tsp__logclient_flush_early_locked(c); /* events held for this first handshake */
        c->drops_dirty = c->ndrops > 0;
        c->st.connects++;
        c->st.connected = 1;
        c->ever_connected = 1;
        c->fallback = 0;
    } else {
        c->st.failures++;
    }
    pthread_mutex_unlock(&c->mu);
    return fd;
}

static int read_acks_once(tsp_logclient_t *c, uint8_t *rbuf, size_t *rlen, size_t rcap);

/* Reads ACK / CLOSE / ERROR frames: what the connection has, including what TLS holds
 * decrypted (poll does not see it). 0 while the connection lives. */
static int read_acks(tsp_logclient_t *c, uint8_t *rbuf, size_t *rlen, size_t rcap)
{
    int rc;
    do
        rc = read_acks_once(c, rbuf, rlen, rcap);
    while (rc > 0 && tsp__tls_pending(c->tls));
    return rc < 0 ? -1 : 0;
}

/* One read and the frames it completed: 1 read some, 0 nothing to read, -1 gone. */
static int read_acks_once(tsp_logclient_t *c, uint8_t *rbuf, size_t *rlen, size_t rcap)
{
    ssize_t r = tsp__tls_read(c->tls, rbuf + *rlen, rcap - *rlen);
    if (r == -EAGAIN)
        return 0;
    if (r <= 0)
        return -1;
    *rlen += (size_t)r;
    size_t off = 0;
    int rc = 0;
    while (!rc) {
        tsp_wire_hdr_t h;
        int urc = tsp_wire_hdr_unpack(&h, rbuf + off, *rlen - off, TSP_WIRE_MAX_TEXT + 1, NULL, 0);
        if (urc == -EAGAIN)
            break;
        if (urc)
            return -1;
        if (*rlen - off < TSP_WIRE_HDR_LEN + h.length)
            break;
        const uint8_t *p = rbuf + off + TSP_WIRE_HDR_LEN;
        if (h.type == TSP_WIRE_ACK) {
            uint64_t seq = tsp_wire_get_u64(p);
            pthread_mutex_lock(&c->mu);
            if (seq > c->acked && seq <= c->seq) {
                c->st.acked += seq - c->acked;
                c->acked = seq;
                c->progress_at = tsp__now_ms();
            }
            tsp__logclient_release_locked(c);
            pthread_mutex_unlock(&c->mu);
        } else if (h.type == TSP_WIRE_STOP) {
            if (!c->stop_seen && c->o.on_stop) {
                c->stop_seen = 1;
                c->o.on_stop(c->o.on_stop_ctx, p[0], (const char *)p + 1, h.length - 1);
            }
        } else if (h.type == TSP_WIRE_DUMP) {
            if (c->o.on_dump)
                c->o.on_dump(c->o.on_dump_ctx, (unsigned)p[0] << 24 | (unsigned)p[1] << 16 |
                                                   (unsigned)p[2] << 8 | p[3]);
        } else if (h.type == TSP_WIRE_CHECKPOINT) {
            if (c->o.on_checkpoint)
                c->o.on_checkpoint(c->o.on_checkpoint_ctx, p[0]);
        } else if (h.type == TSP_WIRE_ERROR) {
            char msg[TSP_WIRE_MAX_TEXT + 200];
            int n = snprintf(msg, sizeof(msg),
                             "%sthe driver's log server closed "
                             "the channel: %.*s\n",
                             c->who, (int)h.length, (const char *)p);
            write_local(c->o.local_err_fd, msg, n > 0 ? (size_t)n : 0);
            rc = -1;
        } else {
            rc = -1; /* CLOSE: the server is going away; reconnect and resend */
        }
        off += TSP_WIRE_HDR_LEN + h.length;
    }
    memmove(rbuf, rbuf + off, *rlen - off);
    *rlen -= off;
    return rc ? -1 : 1;
}

/* A PING (protocol 1.7) through TLS: once TLS took it in part, it goes again, as is, before
 * any other byte (SSL_write's retry rule). deadline -2: one non-blocking try (ping_left
 * stays set when TLS waits); else wait until deadline. 0 sent or waiting, -1 broken. */
static int ping_flush(tsp_logclient_t *c, int64_t deadline)
{
    if (!c->ping_left)
        return 0;
    uint8_t b[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_t h = {.type = TSP_WIRE_PING, .rank = -1, .length = 0};
    tsp_wire_hdr_pack(b, &h);
    if (deadline == -2) {
        ssize_t w = tsp__tls_write(c->tls, b, sizeof(b));
        if (w == -EAGAIN)
            return 0;
        c->ping_left = 0;
        return w == (ssize_t)sizeof(b) ? 0 : -1; /* one record: all of it or nothing */
    }
    c->ping_left = 0;
    return tsp__tls_write_all(c->tls, b, sizeof(b), deadline) ? -1 : 0;
}

/* Sends what is queued (non-blocking). 0 while the connection lives. */
static int send_some(tsp_logclient_t *c)
{
    if (ping_flush(c, -2))
        return -1;
    if (c->ping_left)
        return 0; /* the PING first */
    struct iovec iov[MAX_IOV];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    tsp__logclient_flush_early_locked(c); /* only when holding some failed for want of memory */
    if (c->drops_dirty) {
        for (size_t i = 0; i < c->ndrops; i++) {
            uint8_t cnt[8];
            tsp_wire_put_u64(cnt, c->drops[i].count);
            tsp_wire_hdr_t h = {.type = TSP_WIRE_DROPPED, .rank = c->drops[i].rank, .length = 8};
            if (tsp__logclient_reserve(c, TSP_WIRE_HDR_LEN + 8) == 0)
                tsp__logclient_append_frame(c, &h, cnt, 8, NULL, 0);
        }
        c->drops_dirty = 0;
    }
    for (blk_t *b = c->head; b && n < MAX_IOV; b = b->next) {
        if (b->base + b->len <= c->sent)
            continue;
        size_t from = c->sent > b->base ? (size_t)(c->sent - b->base) : 0;
        iov[n].iov_base = b->data + from;
        iov[n].iov_len = b->len - from;
        n++;
    }
    pthread_mutex_unlock(&c->mu);
    if (!n)
        return 0;
    /* Through TLS: a record that could not be written whole is retried with the same bytes
     * first (the queue from c->sent), as SSL_write requires. */
    ssize_t w = 0;
    for (int i = 0; i < n; i++) {
        /* One record per call (16 KiB through TLS): on until the socket is full. */
        ssize_t r = 0;
        for (size_t off = 0; off < iov[i].iov_len; off += (size_t)r) {
            r = tsp__tls_write(c->tls, (char *)iov[i].iov_base + off, iov[i].iov_len - off);
            if (r == -EAGAIN)
                break;
            if (r <= 0)
                return -1;
            w += r;
        }
        if (r == -EAGAIN)
            break;
    }
    if (w == 0)
        return 0;
    c->progress_at = c->tx_at = tsp__now_ms();
    pthread_mutex_lock(&c->mu);
    c->sent += (uint64_t)w;
    tsp__logclient_release_locked(c);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* Graceful end: every line is acked; say CLOSE and wait briefly for the answer. */
static void say_goodbye(tsp_logclient_t *c)
{
    uint8_t b[TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_TEXT];
    tsp_wire_hdr_t h = {.type = TSP_WIRE_CLOSE, .rank = -1, .length = 0};
    tsp_wire_hdr_pack(b, &h);
    /* Up to 1 s for the driver's answer, but within close's bound (at least 20 ms to
     * write CLOSE): a frozen driver must not hold an agent told to stop at once. */
    int64_t now = tsp__now_ms(), dl = now + 1000;
    pthread_mutex_lock(&c->mu);
    int64_t stop_dl = c->stopping ? c->stop_deadline : dl;
    pthread_mutex_unlock(&c->mu);
    if (stop_dl < now + 20)
        stop_dl = now + 20;
    if (stop_dl < dl)
        dl = stop_dl;
    if (ping_flush(c, dl) == 0 && tsp__tls_write_all(c->tls, b, TSP_WIRE_HDR_LEN, dl) == 0) {
        char err[64];
        while (tsp__tls_read_frame(c->tls, &h, b, TSP_WIRE_MAX_TEXT, dl, err, sizeof(err)) == 0 &&
               h.type != TSP_WIRE_CLOSE)
            ;
    }
    conn_lost(c);
}

/* A driver that is connected but takes nothing while the workers wait for room (its
 * process hangs, or it stopped reading) is treated like an unreachable one once stall_ms
 * passed: otherwise it would hold up training, and a stopping agent whose last lines
 * cannot be delivered, forever. A stopping agent waits for its last lines whether or not
 * a writer still waits (the workers may be gone already). Returns 1 when the connection
 * was given up. */
static int give_up_stalled(tsp_logclient_t *c, int64_t now)
{
    if (c->o.stall_ms <= 0)
        return 0;
    pthread_mutex_lock(&c->mu);
    int64_t since = c->blocked_at > c->progress_at ? c->blocked_at : c->progress_at;
    int waiting = c->want_wake || (c->stopping && c->head != NULL);
    int stalled = waiting && now - since >= c->o.stall_ms;
    pthread_mutex_unlock(&c->mu);
    if (!stalled)
        return 0;
    if (!c->warned_stall) {
        c->warned_stall = 1;
        warn_local(c,
                   "%swarning: the driver's log server at %s:%d has taken "
                   "no lines for %d s while the workers on host %s (node rank %d) wait "
                   "to print. Their output goes to this executor's own stdout/stderr "
                   "instead, so that training is not held up; check that the driver "
                   "process is responsive. The channel is retried in the background.\n",
                   c->who, c->host, c->o.port, c->o.stall_ms / 1000, c->hostname, c->o.node_rank);
    }
    c->warned = 1; /* the stall warning stands for the fallback warning */
    conn_lost(c);
    c->fallback = 1;
    return 1;
}

/* Events held for a first handshake that never came: the driver learns of this node's
 * failure from Spark instead (the task's failure report, docs/protocol.md 3), later. */
static void warn_unsent(tsp_logclient_t *c, size_t n)
{
    warn_local(c,
               "%swarning: %zu failure report(s) could not be sent to the driver's log "
               "server at %s:%d from host %s (node rank %d): no connection was "
               "established before the agent ended. The driver learns of the failure "
               "from Spark's task failure instead.\n",
               c->who, n, c->host, c->o.port, c->hostname, c->o.node_rank);
}

static int wait_events(tsp_logclient_t *c, int want_out, int timeout_ms)
{
    struct pollfd p[2] = {{.fd = c->notify_fd, .events = POLLIN},
                          {.fd = c->fd, .events = (short)(POLLIN | (want_out ? POLLOUT : 0))}};
    if (c->fd >= 0 && tsp__tls_pending(c->tls))
        timeout_ms = 0; /* TLS holds decrypted bytes: poll would not say so */
    int rc = poll(p, c->fd >= 0 ? 2 : 1, timeout_ms);
    if (rc > 0 && (p[0].revents & POLLIN))
        tsp__logclient_drain_fd(c->notify_fd);
    if (c->fd >= 0 && tsp__tls_pending(c->tls))
        return POLLIN | (rc > 0 ? p[1].revents : 0);
    return rc > 0 ? p[1].revents : 0;
}

static int time_left(int64_t deadline, int cap)
{
    int64_t left = deadline - tsp__now_ms();
    return left < 0 ? 0 : left > cap ? cap : (int)left;
}

/* Keepalive (protocol 1.7, "Silent agents"): with CONTROL granted (the driver took the
 * KEEPALIVE flag with it), a PING whenever nothing was written for TSP_WIRE_PING_MS, so
 * that the driver can tell a frozen host from an idle one. Only between frames (nothing
 * pending); a full socket skips it (the driver then has bytes to read anyway). Returns
 * the wait until the next PING is due, at most cap. */
static int keep_alive(tsp_logclient_t *c, int pending, int cap)
{
    if (c->fd < 0 || c->control != 1)
        return cap;
    int64_t now = tsp__now_ms();
    if (!pending && !c->ping_left && now - c->tx_at >= TSP_WIRE_PING_MS) {
        c->ping_left = 1;
        c->tx_at = now; /* sent, or the socket is full: the next one in TSP_WIRE_PING_MS */
        if (ping_flush(c, -2))
            conn_lost(c);
    }
    return time_left(c->tx_at + TSP_WIRE_PING_MS, cap);
}

/* The folded reports that are due handed on (every one once stopping): 1 while some are
 * held. */
static int fold_tick(tsp_logclient_t *c)
{
    pthread_mutex_lock(&c->mu);
    int stopping = c->stopping;
    pthread_mutex_unlock(&c->mu);
    tsp__afold_flush(c->fold, tsp__now_ms(), stopping, tsp__logclient_put_sender, c);
    return tsp__afold_pending(c->fold);
}

static void *sender_main(void *arg)
{
    tsp_logclient_t *c = arg;
    uint8_t rbuf[4 * (TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_TEXT + 1)];
    size_t rlen = 0;
    int backoff = 100;
    int64_t next_try = 0;
    char err[600];
    for (;;) {
        int folds = c->fold && fold_tick(c);
        pthread_mutex_lock(&c->mu);
        /* A report folded after that tick is held too: tick again within FOLD_TICK_MS. */
        folds |= c->fold_new;
        c->fold_new = 0;
        c->fold_ticking = folds;
        int stopping = c->stopping, lines_left = c->head || c->drops_dirty || folds;
        int empty = !lines_left && !c->early;
        int64_t stop_dl = c->stop_deadline;
        /* Only events held for a first handshake are left and no driver is reached: they
         * are worth event_flush_ms more, not the lines' whole flush timeout. */
        if (!lines_left && c->early && c->fd < 0 && c->event_deadline < stop_dl)
            stop_dl = c->event_deadline;
        int pending = c->sent < c->appended || c->drops_dirty;
        c->sender_idle = !pending;
        pthread_mutex_unlock(&c->mu);
        int64_t now = tsp__now_ms();
        if (stopping && (empty || now >= stop_dl)) {
            /* Everything acknowledged: say goodbye, or the driver takes this agent for
             * lost (protocol 1.7). */
            if (empty && c->fd >= 0)
                say_goodbye(c);
            break;
        }
        if (c->fd < 0 && c->fallback) {
            spill_all(c);
        }
        if (c->fd < 0) {
            if (now >= next_try) {
                int t = c->o.connect_timeout_ms;
                if (stopping)
                    t = time_left(stop_dl, t);
                if (t > 0 && try_connect(c, t, err, sizeof(err)) >= 0) {
                    backoff = 100;
                    rlen = 0;
                    continue;
                }
                next_try = tsp__now_ms() + backoff;
                backoff = backoff * 2 > c->o.backoff_max_ms ? c->o.backoff_max_ms : backoff * 2;
                /* When stopping, keep trying until the flush deadline: the loop's top
                 * then spills what is left. */
                if (!c->ever_connected || tsp__now_ms() - c->lost_at >= c->o.reconnect_grace_ms) {
                    warn_fallback(c, err);
                    c->fallback = 1;
                    continue;
                }
            }
            int t = time_left(next_try, 1000);
            if (stopping)
                t = time_left(stop_dl < next_try ? stop_dl : next_try, 1000);
            wait_events(c, 0, t);
            continue;
        }
        if (stopping && empty) {
            say_goodbye(c);
            break;
        }
        if (give_up_stalled(c, now)) {
            next_try = now + c->o.stall_ms; /* let the workers run before trying again */
            continue;
        }
        int cap = folds ? FOLD_TICK_MS : 1000; /* a summary is due within its rank's interval */
        int wait = keep_alive(c, pending, stopping ? time_left(stop_dl, cap) : cap);
        if (c->fd < 0)
            continue;
        int ev = wait_events(c, pending || c->ping_left, wait);
        if ((ev & (POLLIN | POLLHUP | POLLERR)) && read_acks(c, rbuf, &rlen, sizeof(rbuf))) {
            conn_lost(c);
            continue;
        }
        if ((ev & POLLOUT) && send_some(c)) {
            /* The driver may have said ACK and CLOSE just before: take the ACK, or the
             * next server would get those lines a second time. */
            for (int k = 0; k < 8 && read_acks(c, rbuf, &rlen, sizeof(rbuf)) == 0; k++)
                ;
            conn_lost(c);
        }
    }
    if (c->fd >= 0)
        conn_lost(c);
    pthread_mutex_lock(&c->mu);
    int left = c->head != NULL;
    size_t unsent = 0;
    for (early_ev_t *e = c->early; e; e = e->next)
        unsent++;
    c->st.events_unsent += unsent;
    tsp__logclient_free_early_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (left) {
        c->result = c->ever_connected ? -ETIMEDOUT : -ENOTCONN;
        if (!c->warned && c->ever_connected)
            warn_unacked(c);
        else if (!c->warned)
            warn_fallback(c, "the remaining lines could not be delivered before the agent ended");
        spill_all(c);
    } else if (c->st.local) {
        c->result = -ENOTCONN;
    }
    if (unsent) {
        warn_unsent(c, unsent);
        c->result = c->result ? c->result : -ENOTCONN;
    }
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

tsp_logclient_t *tsp_logclient_start(const tsp_logclient_opts_t *o, char *err, size_t errlen)
{
    tsp_logclient_t *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->o = *o;
    if (c->o.mem_bytes < 2 * (TSP_WIRE_MAX_LINE + FRAME_OVERHEAD) + BLK_SIZE)
        c->o.mem_bytes = 2 * (TSP_WIRE_MAX_LINE + FRAME_OVERHEAD) + BLK_SIZE;
    if (c->o.connect_timeout_ms <= 0)
        c->o.connect_timeout_ms = 5000;
    if (c->o.backoff_max_ms <= 0)
        c->o.backoff_max_ms = 5000;
    snprintf(c->host, sizeof(c->host), "%s", o->host ? o->host : "127.0.0.1");
    snprintf(c->who, sizeof(c->who), "%s", o->log_prefix ? o->log_prefix : "torchspark: ");
    if (o->hostname)
        snprintf(c->hostname, sizeof(c->hostname), "%s", o->hostname);
    else if (gethostname(c->hostname, sizeof(c->hostname) - 1))
        snprintf(c->hostname, sizeof(c->hostname), "?");
    c->fd = -1;
    c->control = -1;
    c->early_tail = &c->early;
    c->no_control = o->no_control;
    c->fold = tsp__afold_new(o->report_world);
    c->sink = (tsp_line_sink_t){.ctx = c, .write_line = tsp__logclient_write_line};
    c->sink.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->sink.wake_fd < 0 || c->notify_fd < 0 || tsp__random_bytes(&c->agent_id, 8)) {
        snprintf(err, errlen, "cannot set up the log client: %s", strerror(errno));
        goto fail;
    }
    pthread_mutex_init(&c->mu, NULL);
    /* The sender thread takes no signals: process-directed signals (SIGCHLD, SIGTERM) must
     * reach the thread that reads them through signalfd, whatever mask the caller has. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&c->thread, NULL, sender_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        snprintf(err, errlen, "cannot start the log sender thread: %s", strerror(rc));
        pthread_mutex_destroy(&c->mu);
        goto fail;
    }
    return c;
fail:
    tsp__afold_free(c->fold);
    if (c->sink.wake_fd >= 0)
        close(c->sink.wake_fd);
    if (c->notify_fd >= 0)
        close(c->notify_fd);
    free(c);
    return NULL;
}

int tsp_logclient_event(tsp_logclient_t *c, int kind, int rank, const char *json, size_t len)
{
    if (len > TSP_WIRE_MAX_EVENT)
        return -EMSGSIZE;
    if (rank < -1 || rank > TSP_WIRE_MAX_RANK)
        rank = -1;
    pthread_mutex_lock(&c->mu);
    int rc;
    if (c->control == 0 || (c->control < 0 && c->o.no_control))
        rc = -ENOTSUP;
    else if (c->control < 0 || c->early) /* held ones first: events keep their order */
        rc = tsp__logclient_hold_early_locked(c, kind, rank, json, len);
    else
        rc = tsp__logclient_append_event_locked(c, kind, rank, json, len);
    if (!rc) {
        c->st.events++;
        c->sender_idle = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (!rc)
        tsp__logclient_notify(c->notify_fd);
    return rc;
}

tsp_line_sink_t *tsp_logclient_sink(tsp_logclient_t *c)
{
    return &c->sink;
}

void tsp_logclient_stats(tsp_logclient_t *c, tsp_logclient_stats_t *st)
{
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    pthread_mutex_unlock(&c->mu);
}

int tsp_logclient_close(tsp_logclient_t *c, int timeout_ms)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    c->close_ms = timeout_ms > 0 ? timeout_ms : 0;
    int64_t now = tsp__now_ms();
    c->stop_deadline = now + (timeout_ms > 0 ? timeout_ms : 0);
    int ev_ms = c->o.event_flush_ms > 0 ? c->o.event_flush_ms : 0;
    c->event_deadline = now + (ev_ms < timeout_ms ? ev_ms : (timeout_ms > 0 ? timeout_ms : 0));
    pthread_mutex_unlock(&c->mu);
    tsp__logclient_notify(c->notify_fd);
    pthread_join(c->thread, NULL);
    int rc = c->result;
    /* a no-op: the sender thread freed what it could not send */
    tsp__logclient_free_early_locked(c);
    for (blk_t *b = c->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(c->drops);
    tsp__afold_free(c->fold);
    close(c->sink.wake_fd);
    close(c->notify_fd);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return rc;
}
