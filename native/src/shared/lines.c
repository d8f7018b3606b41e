/* lines.c: reassembling lines from a worker's pipe without truncating any of them, and the
 * one prefix a line carries where users read it (tsp_lines_prefix). */
#include "lines.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINES_INITIAL 4096u

int tsp_lines_init(tsp_lines_t *lb, size_t cap)
{
    memset(lb, 0, sizeof(*lb));
    if (cap < TSP_LINES_MIN_CAP)
        return -EINVAL;
    lb->cap = cap;
    return 0;
}

void tsp_lines_close(tsp_lines_t *lb)
{
    free(lb->buf);
    memset(lb, 0, sizeof(*lb));
}

/* Makes room for at least one more byte at the end: compacts first, then grows up to
 * cap + 1 bytes (a line of exactly cap bytes plus its '\n'). */
static int lines_make_room(tsp_lines_t *lb)
{
    if (lb->end < lb->size)
        return 0;
    if (lb->start > 0) {
        memmove(lb->buf, lb->buf + lb->start, lb->end - lb->start);
        lb->end -= lb->start;
        lb->scan -= lb->start;
        lb->start = 0;
        if (lb->end < lb->size)
            return 0;
    }
    size_t limit = lb->cap + 1;
    if (lb->size >= limit)
        return -ENOBUFS;
    size_t nsize = lb->size ? lb->size * 2 : LINES_INITIAL;
    if (nsize > limit)
        nsize = limit;
    char *nb = realloc(lb->buf, nsize);
    if (!nb)
        return -ENOMEM;
    lb->buf = nb;
    lb->size = nsize;
    return 0;
}

long tsp_lines_read(tsp_lines_t *lb, int fd)
{
    if (lb->eof)
        return 0;
    int rc = lines_make_room(lb);
    if (rc)
        return rc;
    ssize_t n;
    do
        n = read(fd, lb->buf + lb->end, lb->size - lb->end);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    if (n == 0)
        lb->eof = 1;
    lb->end += (size_t)n;
    return (long)n;
}

int tsp_lines_feed(tsp_lines_t *lb, const void *data, size_t len)
{
    const char *p = data;
    size_t room_total = (lb->size - lb->end) + lb->start + ((lb->cap + 1) - lb->size);
    if (len > room_total)
        return -ENOBUFS;
    while (len > 0) {
        int rc = lines_make_room(lb);
        if (rc)
            return rc;
        size_t n = lb->size - lb->end;
        if (n > len)
            n = len;
        memcpy(lb->buf + lb->end, p, n);
        lb->end += n;
        p += n;
        len -= n;
    }
    return 0;
}

void tsp_lines_finish(tsp_lines_t *lb)
{
    lb->eof = 1;
}

int tsp_lines_peek(tsp_lines_t *lb, const char **data, size_t *len, unsigned *flags)
{
    size_t from = lb->scan > lb->start ? lb->scan : lb->start;
    size_t avail = lb->end - lb->start;
    const char *nl = from < lb->end ? memchr(lb->buf + from, '\n', lb->end - from) : NULL;
    *data = lb->buf + lb->start;
    if (nl && (size_t)(nl - *data) <= lb->cap) {
        *len = (size_t)(nl - *data);
        *flags = 0;
        lb->pending = *len + 1;
        return 1;
    }
    if (avail >= lb->cap) {
        *len = lb->cap;
        *flags = TSP_LINE_CONTINUED;
        lb->pending = lb->cap;
        return 1;
    }
    if (lb->eof && avail > 0) {
        *len = avail;
        *flags = TSP_LINE_NO_EOL;
        lb->pending = avail;
        return 1;
    }
    lb->scan = lb->end;
    lb->pending = 0;
    return 0;
}

void tsp_lines_consume(tsp_lines_t *lb)
{
    lb->start += lb->pending;
    lb->pending = 0;
    if (lb->start == lb->end) {
        lb->start = lb->end = lb->scan = 0;
    }
}

int tsp_lines_done(const tsp_lines_t *lb)
{
    return lb->eof && lb->start == lb->end;
}

void tsp_lines_clean(char *text, size_t n)
{
    unsigned char *p = (unsigned char *)text;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < 0x20 || p[i] == 0x7f)
            p[i] = '?';
        else if (p[i] == 0xc2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f)
            p[i] = p[i + 1] = '?';
    }
}

size_t tsp_lines_prefix(char *out, size_t outlen, const char *tmpl, const char *marker,
                        int32_t rank, unsigned stream)
{
    size_t n = 0;
    char num[16];
    if (stream == TSP_STREAM_EVENT)
        tmpl = TSP_LINES_EVENT_PREFIX;
    int nl = snprintf(num, sizeof(num), "%d", rank);
    for (const char *p = tmpl ? tmpl : TSP_LINES_PREFIX; *p; p++) {
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
    if (stream == TSP_STREAM_REPORT)
        marker = TSP_LINES_REPORT_MARKER;
    if (stream == TSP_STREAM_STDERR || stream == TSP_STREAM_REPORT)
        for (const char *m = marker ? marker : TSP_LINES_STDERR_MARKER; *m; m++, n++)
            if (n + 1 < outlen)
                out[n] = *m;
    if (outlen)
        out[n < outlen ? n : outlen - 1] = 0;
    return n;
}
