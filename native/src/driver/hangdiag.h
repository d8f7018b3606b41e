/* hangdiag.h (internal): the hang doctor's diagnosis state, shared by the files of its
 * analysis: hangreq.c (the JSON request read into it), hanggroup.c (each rank classified,
 * grouped and the line written) and hang.c (the entry points and the reply). Types and
 * the calls between those files. */
#ifndef TSP_HANGDIAG_H
#define TSP_HANGDIAG_H

#include <stddef.h>
#include <stdio.h>

#include "hangdump.h"

#define MAX_RANKS (1 << 22)

enum { K_UNABLE, K_BUSY, K_NOSTACK, K_SILENT, K_WAIT };

typedef struct {
    char ***lines; /* per rank: its lines (NULL-free arrays) */
    size_t *nlines, *caps;
    size_t nranks; /* allocated */
    size_t count;  /* given: the last index + 1 */
    char **stdlib;
    size_t nstdlib;
    int borrowed; /* the lines are the watchdog's (tsp__hang_diagnose_sections): not freed */
} input_t;

typedef struct {
    int kind;
    int rank;
    char *key; /* the place: ranks with the same kind and key are one group */
} item_t;

typedef struct diag {
    input_t in;
    long long world, request;
    int read_sources;
    size_t n; /* ranks: max(world, the ranks given) */
    tsp_hangdump_t *d;
    char *got;     /* 1 where the rank's marker came */
    char *culprit; /* 1 where the rank is a culprit */
    item_t *items;
    size_t nitems;
    int recorder; /* any rank's flight recorder listed a collective */
} diag_t;

typedef struct {
    int kind;
    int *ranks; /* into diag's rank list, sorted */
    size_t n;
    char *text; /* the group's part of the line */
} group_t;

/* The request (protocol 1.11) read into g (hangreq.c): 0, or -EINVAL (err), -ENOMEM. */
int tsp__hang_read_request(diag_t *g, const char *doc, size_t len, char *err, size_t errlen);
/* Every rank's dump read, classified and grouped (hanggroup.c). */
int tsp__hang_analyse(diag_t *g);
/* The groups of g's sorted items in the line's order, each with its text (hanggroup.c). */
int tsp__hang_make_groups(diag_t *g, int *ranks, group_t **out, size_t *nout);
/* The line that names the groups gs[0..n) to o (hanggroup.c). */
void tsp__hang_write_line(const group_t *gs, size_t n, size_t culprits, FILE *o);

#endif
