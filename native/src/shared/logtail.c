/* logtail.c: the last lines of one rank, kept for error reports: at most max_lines lines
 * and max_bytes bytes (a longer line keeps its first max_bytes bytes).
 *
 * The lines live back to back in one circular byte buffer that grows by doubling up to
 * max_bytes, so that keeping a line costs a copy, not an allocation: the log server calls
 * this for every line it delivers. */
#include "logtail.h"

#include <stdlib.h>
#include <string.h>

#define TAIL_MIN_CAP 4096u

void tsp__tail_free(tsp__tail_t *t)
{
    free(t->ring);
    free(t->off);
    free(t->len);
    memset(t, 0, sizeof(*t));
}

/* Copies n bytes from the ring at offset off (wrapping) to out. */
static void ring_read(const tsp__tail_t *t, size_t off, size_t n, char *out)
{
    size_t first = t->cap - off < n ? t->cap - off : n;
    memcpy(out, t->ring + off, first);
    memcpy(out + first, t->ring, n - first);
}

/* A larger ring with the live lines moved to its start, oldest first. */
static int grow(tsp__tail_t *t, size_t max_bytes, size_t want)
{
    size_t cap = t->cap ? t->cap : TAIL_MIN_CAP;
    while (cap < want)
        cap *= 2;
    if (cap > max_bytes)
        cap = max_bytes; /* >= want */
    char *nr = malloc(cap);
    if (!nr)
        return -1;
    size_t pos = 0;
    for (unsigned j = 0; t->ring && j < t->count; j++) { /* no ring yet: no live line */
        unsigned i = (t->head + j) % t->slots;
        ring_read(t, t->off[i], t->len[i], nr + pos);
        t->off[i] = (uint32_t)pos;
        pos += t->len[i];
    }
    free(t->ring);
    t->ring = nr;
    t->cap = cap;
    t->end = pos;
    return 0;
}

/* More entries (16 at first, then twice as many, at most max_lines), the live ones moved to
 * their start, oldest first. 0, or -1 without memory (the tail is then as it was). */
static int grow_slots(tsp__tail_t *t, unsigned max_lines)
{
    unsigned slots = t->slots ? 2 * t->slots : 16;
    if (slots > max_lines)
        slots = max_lines;
    uint32_t *off = calloc(slots, sizeof(*off)), *len = calloc(slots, sizeof(*len));
    if (!off || !len) {
        free(off);
        free(len);
        return -1;
    }
    for (unsigned j = 0; t->off && t->slots && j < t->count; j++) {
        unsigned i = (t->head + j) % t->slots;
        off[j] = t->off[i];
        len[j] = t->len[i];
    }
    free(t->off);
    free(t->len);
    t->off = off;
    t->len = len;
    t->slots = slots;
    t->head = 0;
    return 0;
}

void tsp__tail_add(tsp__tail_t *t, unsigned max_lines, size_t max_bytes, const void *data,
                   size_t len)
{
    if (!max_lines || !max_bytes)
        return;
    if ((!t->off || (t->count == t->slots && t->slots < max_lines)) && grow_slots(t, max_lines))
        return; /* no memory: this line is not kept */
    if (len > max_bytes)
        len = max_bytes;
    while (t->count > 0 && (t->count == max_lines || t->bytes + len > max_bytes)) {
        t->bytes -= t->len[t->head];
        t->head = (t->head + 1) % t->slots;
        t->count--;
    }
    if (t->bytes + len > t->cap || !t->ring) { /* an empty first line needs a ring too */
        size_t want = t->bytes + len;
        if (grow(t, max_bytes, want))
            return; /* no memory: this line is not kept */
    }
    /* The live bytes end at t->end and there is room for len more before the oldest. */
    size_t first = t->cap - t->end < len ? t->cap - t->end : len;
    memcpy(t->ring + t->end, data, first);
    memcpy(t->ring, (const char *)data + first, len - first);
    unsigned at = (t->head + t->count) % t->slots;
    t->off[at] = (uint32_t)t->end;
    t->len[at] = (uint32_t)len;
    t->end = (t->end + len) % t->cap;
    t->bytes += len;
    t->count++;
}

size_t tsp__tail_copy(const tsp__tail_t *t, unsigned max_lines, int n, char *buf, size_t buflen)
{
    (void)max_lines; /* the entries are t->slots */
    if (n <= 0 || !t->count)
        return 0;
    unsigned k = (unsigned)n < t->count ? (unsigned)n : t->count;
    size_t need = 0;
    char line[4096];
    for (unsigned j = t->count - k; j < t->count; j++) {
        unsigned i = (t->head + j) % t->slots;
        for (size_t done = 0; done < t->len[i];) { /* through a small buffer: wraps */
            size_t c = t->len[i] - done < sizeof(line) ? t->len[i] - done : sizeof(line);
            ring_read(t, (t->off[i] + done) % t->cap, c, line);
            for (size_t x = 0; x < c; x++)
                if (need + x < buflen)
                    buf[need + x] = line[x];
            need += c;
            done += c;
        }
        if (need < buflen)
            buf[need] = '\n';
        need++;
    }
    return need;
}
