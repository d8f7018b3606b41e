/* hangdump.h (internal): one rank's answer to a DUMP request, read (docs/protocol.md 1.9):
 * its marker, its lines with every line the flight recorder cut in two made whole, its
 * main thread's frames and its flight recorder's collectives. The diagnosis over all
 * ranks is hang.c's. */
#ifndef TSP_HANGDUMP_H
#define TSP_HANGDUMP_H

#include <stddef.h>

#define TSP_HANG_RECORDER_PREFIX "torchspark: flight recorder: "

typedef struct {
    char *path;
    long long line; /* 0 when faulthandler wrote ??? */
    char *func;
} tsp_hangframe_t;

typedef struct {
    char *pg, *op;
    long long seq;
    int completed;
} tsp_hangcoll_t;

typedef struct {
    int rank;
    char *host;
    long long pid;
    char *state;         /* "S (sleeping)" */
    char *cannot_answer; /* why it cannot dump (stopped, zombie), or NULL */
    char **lines;        /* the dump as it came, cut lines made whole */
    size_t nlines;
    size_t nthreads;
    tsp_hangframe_t *main; /* the main thread's frames (the last thread listed), innermost first */
    size_t nmain;
    tsp_hangcoll_t *colls; /* the flight recorder's collectives, oldest first */
    size_t ncolls;
    char *recorder; /* why the recorder has none, or NULL */
} tsp_hangdump_t;

/* The dump of rank in lines[0..n) (its last one, or that of request when request > 0):
 * 0 with *d filled (tsp_hangdump_free it), -ENOENT when no marker of it is there, -ENOMEM. */
int tsp_hangdump_parse(tsp_hangdump_t *d, int rank, char *const *lines, size_t n,
                       long long request);
void tsp_hangdump_free(tsp_hangdump_t *d);

/* The lines with every line that the recorder's write cut in two made whole, followed by
 * the recorder's lines (docs/protocol.md 1.9, "Two writers on one stderr"): a malloc'ed
 * array of malloc'ed lines in *out, their count in *nout. 0 or -ENOMEM. */
int tsp_hangdump_rejoin(char *const *lines, size_t n, char ***out, size_t *nout);

/* The newest collective not seen complete, the newest completed one; NULL when none. */
const tsp_hangcoll_t *tsp_hangdump_pending(const tsp_hangdump_t *d);
const tsp_hangcoll_t *tsp_hangdump_last_done(const tsp_hangdump_t *d);

#endif
