/* runcause.h (internal): the root cause of a failed attempt, read from the run controller's
 * attempt_failed event (docs/protocol.md section 11, "Rules"), in runcause.c; and the
 * controller's two readers of a request's whole numbers and strings, which its files share.
 */
#ifndef TSP_RUNCAUSE_H
#define TSP_RUNCAUSE_H

#include <stdio.h>

#include "jreq.h"
#include "json.h"

#define TSP__CAUSE_MAX 500 /* bytes of one attempt's cause */

/* An integer at path from lo up: 0 with *v (dflt when absent or null), or -EINVAL naming it. */
static inline int tsp__ctl_int(const tsp_jreq_t *r, const char *path, long long lo, long long dflt,
                               long long *v)
{
    char what[48];
    (void)snprintf(what, sizeof what, "a whole number from %lld", lo);
    *v = dflt;
    return tsp_jreq_num(r, path, lo, 1000000000LL, what, v);
}

static inline int tsp__ctl_str(const tsp_jreq_t *r, const char *path, char **v)
{
    int rc = tsp_jreq_get(r, path, TSP_JSON_STRING, "a string or null", v);
    return rc < 0 ? rc : 0;
}

/* The attempt_failed event at r of an attempt on running nodes, whose error text is message
 * (NULL: none), of the runner named runner ("<runner> (distributed) failed: " is cut from its
 * first line): one line naming its root cause into cause (TSP__CAUSE_MAX + 1 bytes), its
 * reason into *reason (malloc'ed, or NULL), how many nodes went with their executors into
 * *lost and the failed node (the event's, else its report's; -1: not known) into *node.
 * 0, -EINVAL naming the event's key, -ENOMEM. */
int tsp__runcause_of(const tsp_jreq_t *r, const char *runner, int running, const char *message,
                     char *cause, char **reason, int *lost, long long *node);

#endif
