/* runcause.c: the root cause of a failed attempt (runcause.h, docs/protocol.md section 11,
 * "Rules"), from the run controller's attempt_failed event: a checkpoint on request, the
 * nodes the log server saw lost, Spark's lost executor (through the outcome table,
 * outcome.c: Spark's text is never read here) or the error's first line. */
#include "runcause.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "torchspark/outcome.h"
#include "util.h"

/* Spark's failure text through the outcome table: its reason and cause (malloc'ed). Spark's
 * own rows only ("carried": false): an executor it lost names the cause even where a task
 * carried another rank's error, a consequence. */
static int spark_outcome(const char *spark, char **reason, char **cause)
{
    char *req = NULL, *reply = NULL;
    size_t rlen = 0, need = 8192;
    FILE *f = open_memstream(&req, &rlen);
    if (!f)
        return -ENOMEM;
    fputs("{\"root\": null, \"spark_error\": ", f);
    tsp_json_write_string(f, spark);
    fputs(", \"carried\": false}", f);
    if (fclose(f) != 0) {
        free(req);
        return -ENOMEM;
    }
    int rc = -ENOSPC, type = 0;
    for (int tries = 0; rc == -ENOSPC && tries < 2; tries++) {
        free(reply);
        rc = (reply = malloc(need)) ? tsp_outcome_classify(req, rlen, reply, need, &need, NULL, 0)
                                    : -ENOMEM;
    }
    if (!rc && !(rc = tsp_json_get(reply, strlen(reply), "reason", reason, &type)))
        rc = tsp_json_get(reply, strlen(reply), "cause", cause, &type);
    free(req);
    free(reply);
    return rc;
}

/* The first non-blank line of the attempt's error, without the runner's own "<who>
 * (distributed) failed: " in front (the glue's exception reads so), at most TSP__CAUSE_MAX bytes.
 */
static void first_line(char *dst, const char *text, const char *who)
{
    const char *p = text ? text : "";
    while (*p && isspace((unsigned char)*p))
        p++;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s (distributed) failed: ", who);
    if (strncmp(p, prefix, strlen(prefix)) == 0)
        p += strlen(prefix);
    size_t n = strcspn(p, "\r\n");
    while (n > 0 && isspace((unsigned char)p[n - 1]))
        n--;
    if (n > TSP__CAUSE_MAX) {
        n = TSP__CAUSE_MAX;
        while (n > 0 && ((unsigned char)p[n] & 0xC0) == 0x80)
            n--;
    }
    if (n == 0)
        snprintf(dst, TSP__CAUSE_MAX + 1, "the attempt failed with no message");
    else
        snprintf(dst, TSP__CAUSE_MAX + 1, "%.*s", (int)n, p);
}

/* What the attempt's report (its exception's document, docs/protocol.md section 8) says
 * where the event does not: the failed node, the step of a checkpoint on request and the
 * reason. The report is read, not checked: a field of another type is no fact. */
static int report_facts(const tsp_jreq_t *r, long long *node, long long *step, char **reason)
{
    char *v = NULL;
    int rc = tsp_jreq_get(r, "event.report", TSP_JSON_OBJECT,
                          "the attempt's report (an object) or null", &v);
    free(v);
    if (rc < 0)
        return rc;
    const char *paths[] = {"event.report.node_rank", "event.report.checkpoint_step"};
    long long *into[] = {node, step};
    for (size_t i = 0; i < 2; i++) {
        if (*into[i] >= 0)
            continue; /* the event's own field */
        if ((rc = tsp_jreq_peek(r, paths[i], TSP_JSON_NUMBER, &v)) < 0)
            return rc;
        char *end = NULL;
        long long x = v ? strtoll(v, &end, 10) : -1;
        if (end && !*end && x >= 0 && x <= 1000000000LL)
            *into[i] = x;
        free(v);
        v = NULL;
    }
    rc = *reason ? 0 : tsp_jreq_peek(r, "event.report.reason", TSP_JSON_STRING, reason);
    return rc < 0 ? rc : 0;
}

/* The event's lost_nodes (the log server's nodes lost, docs/protocol.md 1.7): how many
 * distinct node ranks of the running attempt it names, and the first of them into who
 * ("node 1", "nodes 1, 2"). Ranks at or above the attempt's nodes are no fact. */
typedef struct {
    unsigned char *seen;
    int running, n;
    char *who;
    size_t wlen;
} gone_t;

static int gone_node(void *ctx, const char *key, size_t index, int type, const char *val,
                     size_t len)
{
    gone_t *g = ctx;
    char num[24], *end = NULL;
    (void)key;
    (void)index;
    if (type != TSP_JSON_NUMBER || len >= sizeof num)
        return -EINVAL;
    memcpy(num, val, len);
    num[len] = 0;
    long long x = strtoll(num, &end, 10);
    if (*end || x < 0 || x > 1000000000LL)
        return -EINVAL;
    if (x >= g->running || g->seen[x])
        return 0;
    g->seen[x] = 1;
    size_t at = strlen(g->who);
    if (at + 24 < g->wlen)
        snprintf(g->who + at, g->wlen - at, "%s%lld", g->n ? ", " : "", x);
    g->n++;
    return 0;
}

static int lost_nodes(const tsp_jreq_t *r, int running, char *who, size_t wlen, int *n)
{
    char *v = NULL;
    const char *what = "an array of node ranks (whole numbers from 0) or null";
    int rc = tsp_jreq_get(r, "event.lost_nodes", TSP_JSON_ARRAY, what, &v);
    *n = 0;
    who[0] = 0;
    if (rc <= 0)
        return rc;
    gone_t g = {calloc((size_t)running, 1), running, 0, who, wlen};
    rc = g.seen ? tsp_json_each(v, strlen(v), NULL, gone_node, &g) : -ENOMEM;
    free(g.seen);
    free(v);
    if (rc == -EINVAL)
        return tsp__err(r->err, r->errlen, -EINVAL, "%s's \"event.lost_nodes\" must be %s", r->who,
                        what);
    *n = g.n;
    return rc;
}

/* One line naming the attempt's root cause, and whether its node went with its executor:
 * a node stopped after its checkpoint on request (the record's reason decommission, or the
 * checkpoint's step); else Spark's lost or decommissioned executor (the other ranks' errors,
 * such as gloo's "Connection reset by peer", are its consequences); else the error's first
 * line. And the failed node (the event's, else its report's). */
int tsp__runcause_of(const tsp_jreq_t *r, const char *runner, int running, const char *message,
                     char *cause, char **reason_out, int *lost, long long *failed_node)
{
    long long node = -1, step = -1;
    char *reason = NULL, *spark = NULL, *sreason = NULL, *scause = NULL;
    char gone[96];
    long long silent_node = -1;
    int ngone = 0, rc = tsp__ctl_int(r, "event.node_rank", -1, -1, &node);
    if (rc || (rc = tsp__ctl_int(r, "event.checkpoint_step", 0, -1, &step)) ||
        (rc = lost_nodes(r, running, gone, sizeof gone, &ngone)) ||
        (rc = tsp__ctl_str(r, "event.reason", &reason)) ||
        (rc = tsp__ctl_str(r, "event.spark_error", &spark)) ||
        (rc = tsp__ctl_int(r, "event.silent_node", 0, -1, &silent_node)) ||
        (rc = report_facts(r, &node, &step, &reason)))
        goto out;
    if (silent_node >= 0 && !(reason && strcmp(reason, "preempted") == 0)) {
        free(reason); /* the node the outcome excluded: silent, unless its record says why */
        if (!(reason = strdup("silent"))) {
            rc = -ENOMEM;
            goto out;
        }
    }
    if (spark && (rc = spark_outcome(spark, &sreason, &scause)))
        goto out;
    int spark_lost =
        sreason && (strcmp(sreason, "executor_lost") == 0 || strcmp(sreason, "decommission") == 0);
    char who[48] = "an executor";
    if (node >= 0)
        snprintf(who, sizeof who, "node %lld's executor", node);
    int preempted = reason && strcmp(reason, "preempted") == 0;
    /* The root record is a node lost itself (its own message names it), or the nodes lost
     * are every node of the attempt (the job was cancelled or the cluster went): no fact. */
    int root_lost = reason && (strcmp(reason, "silent") == 0 || strcmp(reason, "eof") == 0);
    if (ngone >= running)
        ngone = 0;
    if (reason && strcmp(reason, "grow") == 0) { /* every node stopped on the driver's request */
        if (step >= 0)
            snprintf(cause, TSP__CAUSE_MAX + 1,
                     "the run grows back to more nodes: step %lld was checkpointed on request "
                     "and the attempt stopped",
                     step);
        else
            snprintf(cause, TSP__CAUSE_MAX + 1,
                     "the run grows back to more nodes: the attempt stopped on request");
        *lost = 0;
    } else if (step >= 0 || preempted || (reason && strcmp(reason, "decommission") == 0)) {
        /* The plugin asked the node to checkpoint: a SIGTERM to its executor (preempted) or
         * a decommission notice; the executor is going away either way. */
        const char *what = preempted ? "was preempted (SIGTERM)" : "is being decommissioned";
        if (step >= 0)
            snprintf(cause, TSP__CAUSE_MAX + 1,
                     "%s %s: step %lld was checkpointed on request and the node stopped", who, what,
                     step);
        else
            snprintf(cause, TSP__CAUSE_MAX + 1, "%s %s: the node stopped", who, what);
        free(reason);
        reason = strdup(preempted ? "preempted" : "decommission");
        *lost = 1;
    } else if (ngone && !root_lost && spark_lost) { /* Spark's text names the executor */
        snprintf(cause, TSP__CAUSE_MAX + 1, "%s %s %s lost: %s", ngone > 1 ? "nodes" : "node", gone,
                 ngone > 1 ? "were" : "was", scause);
        free(reason);
        reason = strdup(sreason);
        *lost = ngone;
    } else if (ngone && !root_lost) {
        /* Another node's error came first (gloo's "Connection reset by peer"), but the log
         * server saw these nodes go before the run was stopped: they are the cause. */
        if (ngone > 1)
            snprintf(cause, TSP__CAUSE_MAX + 1,
                     "nodes %s were lost: their executors or hosts went away (their executor "
                     "JVMs died, or their channels to the driver ended without a goodbye); the "
                     "other nodes' errors are their consequences",
                     gone);
        else
            snprintf(cause, TSP__CAUSE_MAX + 1,
                     "node %s was lost: its executor or host went away (its executor JVM died, "
                     "or its channel to the driver ended without a goodbye); the other nodes' "
                     "errors are its consequences",
                     gone);
        free(reason);
        reason = strdup("eof");
        *lost = ngone;
    } else if (spark_lost) {
        snprintf(cause, TSP__CAUSE_MAX + 1, "%s", scause);
        free(reason);
        reason = strdup(sreason);
        *lost = 1;
    } else {
        first_line(cause, message, runner);
        *lost = reason && strcmp(reason, "silent") == 0;
        if (root_lost && ngone > *lost) /* the root's node, and any other lost with it */
            *lost = ngone;
    }
    *reason_out = reason;
    reason = NULL;
    *failed_node = node;
out:
    free(reason);
    free(spark);
    free(sreason);
    free(scause);
    return rc;
}
