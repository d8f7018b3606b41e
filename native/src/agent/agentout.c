/* agentout.c: the node agent's worker output: each worker's stdout and stderr pipe read
 * line by line and every line written whole to the console (tee prefix), to its redirect
 * file and to the sink, with its tail kept for the failure report; a stream paused while the
 * sink is full and lingering after a wake-up that emptied it; and the agent's own messages.
 */
#include "agent_int.h"
#include "logwire.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

void tsp__agent_log(const tsp_agent_t *a, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tsp__log_linev(a->o.log_fd, a->o.log_prefix ? a->o.log_prefix : "torchspark: ", fmt, ap);
    va_end(ap);
}

static int write_all(int fd, const struct iovec *iov, int cnt)
{
    struct iovec v[4];
    memcpy(v, iov, (size_t)cnt * sizeof *iov);
    struct iovec *p = v;
    while (cnt > 0) {
        ssize_t n = writev(fd, p, cnt);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno; /* EPIPE on a closed console: the line is dropped there only */
        }
        while (cnt > 0 && (size_t)n >= p->iov_len) {
            n -= (ssize_t)p->iov_len;
            p++;
            cnt--;
        }
        if (cnt > 0) {
            p->iov_base = (char *)p->iov_base + n;
            p->iov_len -= (size_t)n;
        }
    }
    return 0;
}
/* ---- output ------------------------------------------------------------------------ */

static void expand_prefix(const tsp_agent_t *a, const worker_t *w, char *out, size_t outlen)
{
    const char *t = a->o.prefix_template ? a->o.prefix_template : "[${role_name}${local_rank}]:";
    size_t o = 0;
    char num[24];
    while (*t && o + 1 < outlen) {
        const char *val = NULL;
        size_t skip = 0;
        if (strncmp(t, "${role_name}", 12) == 0) {
            val = a->o.topo.role;
            skip = 12;
        } else if (strncmp(t, "${local_rank}", 13) == 0) {
            snprintf(num, sizeof num, "%d", w->local_rank);
            val = num;
            skip = 13;
        } else if (strncmp(t, "${hostname}", 11) == 0) {
            val = a->host;
            skip = 11;
        } else if (strncmp(t, "${rank}", 7) == 0) {
            snprintf(num, sizeof num, "%d", tsp_topo_global_rank(&a->o.topo, w->local_rank));
            val = num;
            skip = 7;
        }
        if (val) {
            int n = snprintf(out + o, outlen - o, "%s", val);
            o += n > 0 ? (size_t)n : 0;
            if (o >= outlen)
                o = outlen - 1;
            t += skip;
        } else {
            out[o++] = *t++;
        }
    }
    out[o] = 0;
}

/* Keeps a delivered line in the worker's tail as the glues' console shows it ("[rank R] ",
 * "[stderr] "): a long line's first piece only, cut at TAIL_LINE_MAX bytes. */
#define TAIL_LINE_MAX 2048
static void keep_line(tsp_agent_t *a, worker_t *w, int si, const char *data, size_t len,
                      unsigned flags)
{
    stream_t *s = &w->s[si];
    int skip = s->in_long;
    s->in_long = (flags & TSP_LINE_CONTINUED) != 0;
    if (skip)
        return;
    char buf[128 + TAIL_LINE_MAX];
    size_t n =
        tsp_lines_prefix(buf, 128, NULL, NULL, tsp_topo_global_rank(&a->o.topo, w->local_rank),
                         si == 0 ? TSP_STREAM_STDOUT : TSP_STREAM_STDERR);
    if (n > 127)
        n = 127;
    if (len > TAIL_LINE_MAX)
        len = TAIL_LINE_MAX;
    memcpy(buf + n, data, len);
    tsp__tail_add(&w->tail, TSP_REPORT_TAIL_LINES, TSP_REPORT_TAIL_BYTES, buf, n + len);
}

/* Hands one line to the console, the redirect file and the sink. Returns -EAGAIN when
 * the sink is full (then nothing was written anywhere, so the retry writes it once). */
int tsp__agent_deliver_line(tsp_agent_t *a, worker_t *w, int si, const char *data, size_t len,
                            unsigned flags)
{
    stream_t *s = &w->s[si];
    int mask = si == 0 ? TSP_STD_OUT : TSP_STD_ERR;
    if (a->o.sink) {
        tsp_line_t line = {
            .rank = tsp_topo_global_rank(&a->o.topo, w->local_rank),
            .local_rank = w->local_rank,
            .stream = (uint8_t)(si == 0 ? TSP_STREAM_STDOUT : TSP_STREAM_STDERR),
            .flags = (uint8_t)flags,
            .data = data,
            .len = len,
        };
        int rc = a->o.sink->write_line(a->o.sink->ctx, &line);
        if (rc == -EAGAIN)
            return rc;
    }
    keep_line(a, w, si, data, len, flags);
    int eol = !(flags & (TSP_LINE_CONTINUED | TSP_LINE_NO_EOL));
    struct iovec iov[3] = {{NULL, 0}, {(void *)data, len}, {"\n", (size_t)eol}};
    if (s->file_fd >= 0)
        write_all(s->file_fd, iov + 1, 2); /* the file gets the bytes as they were */
    /* On the console a last line without '\n' still ends its line, or the next rank's
     * line would be joined to it. */
    iov[2].iov_len = !(flags & TSP_LINE_CONTINUED);
    int redirected = a->o.redirects && (a->o.redirects[w->local_rank] & mask);
    int teed = a->o.tee && (a->o.tee[w->local_rank] & mask);
    int shown = !a->o.show || a->o.show[w->local_rank];
    if (shown && (teed || (!redirected && !a->o.sink))) {
        char prefix[256] = "";
        if (teed)
            expand_prefix(a, w, prefix, sizeof prefix);
        iov[0].iov_base = prefix;
        iov[0].iov_len = strlen(prefix);
        write_all(si == 0 ? a->o.console_out : a->o.console_err, iov, 3);
    }
    return 0;
}

void tsp__agent_stream_watch(tsp_agent_t *a, worker_t *w, int si, int on)
{
    stream_t *s = &w->s[si];
    if (s->fd < 0)
        return;
    if (on) {
        struct epoll_event ev = {.events = EPOLLIN,
                                 .data.u64 = TAG_STREAM0 + (uint64_t)(w->local_rank * 2 + si)};
        epoll_ctl(a->epfd, EPOLL_CTL_ADD, s->fd, &ev);
    } else {
        epoll_ctl(a->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    }
}

void tsp__agent_watch_wake(tsp_agent_t *a, int on)
{
    if (!a->o.sink || a->o.sink->wake_fd < 0 || a->wake_watched == on)
        return;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_WAKE};
    epoll_ctl(a->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, a->o.sink->wake_fd, &ev);
    a->wake_watched = on;
}

/* Delivers every complete line buffered for a stream. 0, or -EAGAIN when paused. */
static int drain_stream(tsp_agent_t *a, worker_t *w, int si)
{
    stream_t *s = &w->s[si];
    const char *d;
    size_t len;
    unsigned flags;
    while (tsp_lines_peek(&s->lines, &d, &len, &flags)) {
        if (tsp__agent_deliver_line(a, w, si, d, len, flags) == -EAGAIN) {
            if (!s->paused) {
                s->paused = 1;
                tsp__agent_stream_watch(a, w, si, 0);
                tsp__agent_watch_wake(a, 1);
            }
            return -EAGAIN;
        }
        tsp_lines_consume(&s->lines);
    }
    if (s->paused) {
        s->paused = 0;
        if (!tsp_lines_done(&s->lines))
            tsp__agent_stream_watch(a, w, si, 1);
    }
    if (tsp_lines_done(&s->lines) && s->fd >= 0) {
        tsp__agent_stream_watch(a, w, si, 0);
        close(s->fd);
        s->fd = -1;
    }
    return 0;
}
static void linger_start(tsp_agent_t *a, stream_t *s, worker_t *w, int si)
{
    s->linger = 1;
    tsp__agent_stream_watch(a, w, si, 0);
    if (!a->linger_until)
        a->linger_until = tsp__now_ms() + LINGER_MS;
}

/* The linger deadline passed: every lingering stream goes back into epoll. */
void tsp__agent_linger_end(tsp_agent_t *a)
{
    a->linger_until = 0;
    for (int i = 0; i < a->n; i++)
        for (int si = 0; si < 2; si++) {
            stream_t *s = &a->w[i].s[si];
            if (s->linger) {
                s->linger = 0;
                if (!s->paused)
                    tsp__agent_stream_watch(a, &a->w[i], si, 1);
            }
        }
}

/* epoll_wait's timeout: the loop's own, shortened to the linger deadline. */
int tsp__agent_wait_timeout(const tsp_agent_t *a, int timeout)
{
    if (!a->linger_until)
        return timeout;
    int64_t left = a->linger_until - tsp__now_ms();
    int ms = left <= 0 ? 0 : (int)left;
    return timeout < 0 || ms < timeout ? ms : timeout;
}

/* The same, shortened to the end of the report connections' grace (attempt_over); once it
 * passed, the stopping loop's tick looks again (paused connections may stay). */
int tsp__agent_reports_timeout(const tsp_agent_t *a, int timeout)
{
    int64_t left = a->reports_until - tsp__now_ms();
    if (!a->reports_until || left <= 0)
        return timeout;
    int ms = (int)left + 1;
    return timeout < 0 || ms < timeout ? ms : timeout;
}

void tsp__agent_read_stream(tsp_agent_t *a, worker_t *w, int si)
{
    stream_t *s = &w->s[si];
    int emptied = 0;
    /* A few reads per wake-up keep one chatty worker from starving the others. */
    for (int i = 0; i < 8 && s->fd >= 0 && !s->paused; i++) {
        long n = tsp_lines_read(&s->lines, s->fd);
        if (n == -EAGAIN) {
            emptied = 1;
            break;
        }
        if (n < 0 && n != -ENOBUFS)
            tsp_lines_finish(&s->lines); /* a broken pipe ends the stream */
        drain_stream(a, w, si);
        if (n == 0)
            break;
    }
    if (emptied && s->fd >= 0 && !s->paused && !s->linger)
        linger_start(a, s, w, si);
}

void tsp__agent_resume_paused(tsp_agent_t *a)
{
    int still = tsp_reports_resume(a->reports) == -EAGAIN;
    for (int i = 0; i < a->n; i++)
        for (int si = 0; si < 2; si++)
            if (a->w[i].s[si].paused && drain_stream(a, &a->w[i], si) == -EAGAIN)
                still = 1;
    if (!still)
        tsp__agent_watch_wake(a, 0);
}

int tsp__agent_output_pending(const tsp_agent_t *a)
{
    for (int i = 0; i < a->n; i++)
        for (int si = 0; si < 2; si++)
            if (a->w[i].s[si].fd >= 0 || a->w[i].s[si].paused)
                return 1;
    return tsp_reports_pending(a->reports);
}
