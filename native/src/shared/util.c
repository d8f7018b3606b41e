/* util.c: the helpers that every module shares (util.h): clock and deadlines, integer and
 * endpoint parsing, error sentences, hex, random bytes, a held TCP port. Depends on no
 * other file of ours. */
#include "util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

int64_t tsp__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double tsp__now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void tsp__deadline_in(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int tsp__cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return -rc;
}

int tsp__parse_int(const char *s, int *out)
{
    if (!s || !*s)
        return -EINVAL;
    long long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        v = v * 10 + (*p - '0');
        if (v > INT_MAX)
            return -ERANGE;
    }
    *out = (int)v;
    return 0;
}

int tsp__endpoint_parse(const char *ep, char *host, size_t hostlen, int *port, int default_port)
{
    if (!ep || !*ep)
        return -EINVAL;
    const char *h = ep, *p = NULL;
    size_t hl;
    if (ep[0] == '[') {
        const char *rb = strchr(ep, ']');
        if (!rb || (rb[1] && rb[1] != ':'))
            return -EINVAL;
        h = ep + 1;
        hl = (size_t)(rb - h);
        p = rb[1] ? rb + 2 : NULL;
    } else {
        const char *colon = strrchr(ep, ':');
        hl = colon ? (size_t)(colon - ep) : strlen(ep);
        p = colon ? colon + 1 : NULL;
    }
    int v = default_port;
    if (p ? tsp__parse_int(p, &v) != 0 || v < 1 || v > 65535 : default_port < 0)
        return -EINVAL;
    if (hl == 0 || hl >= hostlen)
        return -EINVAL;
    memcpy(host, h, hl);
    host[hl] = 0;
    *port = v;
    return 0;
}

int tsp__err(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

void tsp__log_linev(int fd, const char *prefix, const char *fmt, va_list ap)
{
    char buf[2048];
    int off = snprintf(buf, sizeof buf, "%s", prefix);
    if (off < 0)
        off = 0;
    if ((size_t)off > sizeof buf - 2)
        off = (int)(sizeof buf - 2);
    int n = vsnprintf(buf + off, sizeof buf - (size_t)off - 1, fmt, ap);
    size_t len = (size_t)off + (n < 0 ? 0 : (size_t)n);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w;
    do
        w = write(fd, buf, len);
    while (w < 0 && errno == EINTR);
}

void tsp__err_append(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strnlen(buf, len);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

void tsp__hex_encode(const void *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = in;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int tsp__hex_decode(const char *hex, void *out, size_t n)
{
    unsigned char *b = out;
    if (!hex || strlen(hex) != 2 * n)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        b[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

int tsp__random_bytes(void *out, size_t n)
{
    unsigned char *b = out;
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        got += (size_t)r;
    }
    return 0;
}

int tsp__addr_parse(const char *addr, int port, struct sockaddr_storage *ss, socklen_t *sslen)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, addr, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        *sslen = sizeof *in4;
        return 0;
    }
    if (inet_pton(AF_INET6, addr, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        *sslen = sizeof *in6;
        return 0;
    }
    return -EINVAL;
}

int tsp__port_reserve(const char *addr, int port, int *fd_out, int *got_port, char *err,
                      size_t errlen)
{
    return tsp__port_reserve_ex(addr, port, 0, fd_out, got_port, err, errlen);
}

int tsp__port_reserve_ex(const char *addr, int port, int reuseport, int *fd_out, int *got_port,
                         char *err, size_t errlen)
{
    *fd_out = -1;
    *got_port = 0;
    if (port < 0 || port > 65535)
        return tsp__err(err, errlen, -EINVAL, "cannot reserve port %d: not in 0..65535", port);
    const char *where = addr && *addr ? addr : "0.0.0.0";
    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    if (tsp__addr_parse(where, port, &ss, &sslen) != 0)
        return tsp__err(err, errlen, -EINVAL,
                        "cannot reserve a port on '%s': not a numeric address", addr);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        return tsp__err(err, errlen, -e, "cannot reserve a port: socket(): %s", strerror(e));
    }
    /* SO_REUSEADDR on our side is what lets torch's TCPStore (which sets it too) bind and
     * listen while we still hold the port; we never listen, so nothing connects to us. */
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) ||
        bind(fd, (struct sockaddr *)&ss, sslen) != 0) {
        int e = errno;
        close(fd);
        return tsp__err(err, errlen, -e, "cannot reserve port %d on %s: %s", port, where,
                        strerror(e));
    }
    struct sockaddr_storage got = {0};
    socklen_t gotlen = sizeof got;
    if (getsockname(fd, (struct sockaddr *)&got, &gotlen) != 0) {
        int e = errno;
        close(fd);
        return tsp__err(err, errlen, -e, "cannot reserve a port: getsockname(): %s", strerror(e));
    }
    *fd_out = fd;
    /* NOLINTNEXTLINE(clang-analyzer-core.CallAndMessage): getsockname() filled it */
    *got_port = ntohs(got.ss_family == AF_INET ? ((struct sockaddr_in *)&got)->sin_port
                                               : ((struct sockaddr_in6 *)&got)->sin6_port);
    return 0;
}

int tsp__reply_copy(const char *text, size_t len, char *out, size_t outlen, size_t *needed)
{
    if (needed)
        *needed = len + 1;
    if (len + 1 > outlen)
        return -ENOSPC;
    memcpy(out, text, len + 1);
    return 0;
}

int tsp__wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int t = -1;
        if (deadline >= 0) {
            int64_t left = deadline - tsp__now_ms();
            if (left <= 0)
                return -ETIMEDOUT;
            t = left > 60000 ? 60000 : (int)left;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, t);
        if (rc > 0)
            return 0;
        if (rc < 0 && errno != EINTR)
            return -errno;
    }
}

int tsp__edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[TSP__EDIT_MAX + 1];
    if (la >= TSP__EDIT_MAX || lb >= TSP__EDIT_MAX)
        return INT_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
            int best = diag + !same;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}
