/* logtail.h (internal): the last lines of one rank, kept for error reports (logtail.c). */
#ifndef TSP_LOGTAIL_H
#define TSP_LOGTAIL_H

#include <stddef.h>
#include <stdint.h>

/* Lines back to back in a circular byte buffer
 * of cap bytes (grown up to the byte bound), entries off/len for at most max_lines lines. */
typedef struct tsp__tail {
    char *ring;
    size_t cap, end, bytes; /* end: where the next line goes; bytes: live bytes */
    uint32_t *off, *len;    /* slots entries (NULL until the first line) */
    unsigned head, count;   /* head: the oldest entry */
    unsigned slots;         /* entries of off and len: doubled up to max_lines as lines come
                               (16,384 ranks x 2,000 lines allocated at once were 256 MiB) */
} tsp__tail_t;

void tsp__tail_add(tsp__tail_t *t, unsigned max_lines, size_t max_bytes, const void *data,
                   size_t len);
/* The last n lines, oldest first, each followed by '\n', into buf (truncated to buflen);
 * returns the bytes the whole answer needs. */
size_t tsp__tail_copy(const tsp__tail_t *t, unsigned max_lines, int n, char *buf, size_t buflen);
void tsp__tail_free(tsp__tail_t *t);

#endif
