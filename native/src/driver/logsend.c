/* logsend.c: how the log server's epoll thread talks: a connection's send buffer and its
 * epoll interest, freeing a connection, and the server's event messages (to event_fd and
 * the pull queue). Below both the protocol (logconn.c) and the control channel (logctl.c),
 * which both send frames and report events. */
#include "logsend.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lines.h"
#include "util.h"

void tsp__event(tsp_logserver_t *s, const char *fmt, ...)
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
    tsp_lines_clean(msg, (size_t)n); /* host names, agents' texts: one printable line */
    if (s->o.events_to_queue) {
        pthread_mutex_lock(&s->q.mu);
        tsp__logq_push_locked(&s->q, TSP_LOG_RANK_SERVER, TSP_LOG_STREAM_EVENT, 0, msg, (size_t)n,
                              1);
        pthread_mutex_unlock(&s->q.mu);
    }
    if (s->o.event_fd >= 0) {
        msg[n++] = '\n';
        ssize_t w = write(s->o.event_fd, msg, (size_t)n);
        (void)w; /* best effort: an event must never stop the server */
    }
}

void tsp__event_preauth(tsp_logserver_t *s, const char *fmt, ...)
{
    int64_t now = tsp__now_ms();
    if (s->preauth_event_at && now - s->preauth_event_at < PREAUTH_EVENT_MS) {
        s->preauth_skipped++;
        return;
    }
    s->preauth_event_at = now;
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (s->preauth_skipped)
        tsp__event(s, "%s (and %llu more such events in the last %d ms, not shown)", msg,
                   (unsigned long long)s->preauth_skipped, PREAUTH_EVENT_MS);
    else
        tsp__event(s, "%s", msg);
    s->preauth_skipped = 0;
}

void tsp__conn_arm(tsp_logserver_t *s, conn_t *c)
{
    struct epoll_event ev = {.events = EPOLLIN | (c->wlen || c->tls_out ? EPOLLOUT : 0u),
                             .data.ptr = c};
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

void tsp__conn_free(tsp_logserver_t *s, conn_t *c)
{
    tsp__outrecv_abort(&s->out, c, "the connection closed");
    if (s->resume_at == c)
        s->resume_at = c->next;
    if (c->registered)
        epoll_ctl(s->efd, EPOLL_CTL_DEL, c->fd, NULL);
    tsp__tls_free(c->tls);
    close(c->fd);
    if (c->state < C_OPEN)
        s->nunauth--;
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

/* Through TLS only (protocol 1.10): before its handshake is done a connection sends no
 * frame (wbuf waits). A record that TLS could not finish writing is retried with the same
 * bytes at the head of wbuf, as SSL_write requires. */
int tsp__conn_write(conn_t *c)
{
    if (c->state == C_TLS || !c->wlen)
        return 0;
    ssize_t w = tsp__tls_write(c->tls, c->wbuf, c->wlen);
    if (w > 0) {
        memmove(c->wbuf, c->wbuf + w, c->wlen - (size_t)w);
        c->wlen -= (size_t)w;
    }
    return w < 0 && w != -EAGAIN ? (int)w : 0;
}

/* Control frames are small: the buffer holds many. */
int tsp__conn_send_flags(tsp_logserver_t *s, conn_t *c, unsigned type, unsigned flags,
                         const void *p, size_t n)
{
    if (c->wlen + TSP_WIRE_HDR_LEN + n > sizeof(c->wbuf))
        return -ENOBUFS;
    tsp_wire_hdr_t h = {
        .type = (uint8_t)type, .flags = (uint8_t)flags, .rank = -1, .length = (uint32_t)n};
    tsp_wire_hdr_pack(c->wbuf + c->wlen, &h);
    if (n)
        memcpy(c->wbuf + c->wlen + TSP_WIRE_HDR_LEN, p, n);
    c->wlen += TSP_WIRE_HDR_LEN + n;
    int rc = tsp__conn_write(c);
    if ((c->wlen > 0) != c->want_out && !c->paused)
        tsp__conn_arm(s, c);
    return rc;
}

int tsp__conn_send(tsp_logserver_t *s, conn_t *c, unsigned type, const void *p, size_t n)
{
    return tsp__conn_send_flags(s, c, type, 0, p, n);
}
