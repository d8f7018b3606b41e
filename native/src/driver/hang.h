/* hang.h (internal): the watchdog's way into the hang doctor's analysis (hang.c, docs/
 * protocol.md 1.11): the ranks' sections as the watchdog collected them, without a JSON
 * request to write and read back, and the reply's line and the rank-prefixed stacks beside
 * the document, without reading them back out of it. The analysis and the reply are
 * tsp_hang_diagnose's. */
#ifndef TSP_HANG_H
#define TSP_HANG_H

#include <stddef.h>

typedef struct tsp__hang_out {
    char *doc; /* the reply of protocol 1.11, NUL-terminated */
    size_t len;
    char *line;   /* its "line" */
    char *stacks; /* every line, rank-prefixed (the stacks file's and the error's; not in doc) */
    size_t stacks_len;
    int starting; /* its "starting" */
    int report;   /* doc holds "report" (every line: the error's document), asked for */
} tsp__hang_out_t;

/* The diagnosis of ranks 0 to world - 1 (no stdlib, sources read): text[r] is rank r's
 * section, its lines separated by NULs (len[r] bytes, a NUL after them), or NULL; request
 * the DUMP's number; report: the reply with its "report" (else without: the event of a
 * diagnosis that cancels nothing carries no stack). 0 with *out filled (tsp__hang_out_free),
 * -EINVAL (err), -ENOMEM. */
int tsp__hang_diagnose_sections(char *const *text, const size_t *len, int world, unsigned request,
                                int report, tsp__hang_out_t *out, char *err, size_t errlen);
void tsp__hang_out_free(tsp__hang_out_t *out);

#endif
