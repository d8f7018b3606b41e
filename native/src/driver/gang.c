/* gang.c: the driver's decision about the tasks of a gang launch (torchspark/gang.h,
 * docs/protocol.md 2.2): who is admitted, when the gang is complete or failed, and the
 * failed gang's sentence. Pure: the caller passes the time, and holds the lock when threads
 * share a gang (rendezvous.c does). */
#include "torchspark/gang.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "util.h"

#define LIST_MAX 8 /* started tasks named in the sentence; the rest counted */

struct tsp_gang {
    int n, joined, complete, failed;
    int64_t deadline, timeout_ms;
    char why[256]; /* the failure's cause clause, once failed */
    char **hosts;  /* per node: the host of its admitted task, NULL until it joined */
};

tsp_gang_t *tsp_gang_new(int nnodes, int64_t now_ms, int64_t timeout_ms)
{
    if (nnodes < 1 || nnodes > TSP_GANG_MAX_NODES || timeout_ms <= 0)
        return NULL;
    tsp_gang_t *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->hosts = calloc((size_t)nnodes, sizeof(char *));
    if (!g->hosts) {
        free(g);
        return NULL;
    }
    g->n = nnodes;
    g->timeout_ms = timeout_ms;
    g->deadline = now_ms + timeout_ms;
    return g;
}

void tsp_gang_free(tsp_gang_t *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n; i++)
        free(g->hosts[i]);
    free(g->hosts);
    free(g);
}

/* "60 s", or "1.5 s" for a deadline that is not whole seconds. */
static void seconds(int64_t ms, char *buf, size_t len)
{
    if (ms % 1000 == 0)
        snprintf(buf, len, "%lld s", (long long)(ms / 1000));
    else
        snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
}

int tsp_gang_state(tsp_gang_t *g, int64_t now_ms)
{
    if (g->failed)
        return TSP_GANG_FAILED;
    if (g->complete)
        return TSP_GANG_GO;
    if (now_ms >= g->deadline) {
        char s[32];
        seconds(g->timeout_ms, s, sizeof s);
        snprintf(g->why, sizeof g->why, "only %d of the attempt's %d tasks started within %s",
                 g->joined, g->n, s);
        g->failed = 1;
        return TSP_GANG_FAILED;
    }
    return TSP_GANG_WAIT;
}

int tsp_gang_reason(const tsp_gang_t *g, char *err, size_t errlen)
{
    if (!g->failed)
        return -EINVAL;
    return tsp__err(err, errlen, TSP_GANG_FAILED, "the gang of %d tasks failed: %s", g->n, g->why);
}

static int host_ok(const char *host)
{
    size_t n = host ? strlen(host) : 0;
    if (n < 1 || n > TSP_GANG_HOST_MAX)
        return 0;
    for (const char *p = host; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == ':' || *p == '-'))
            return 0;
    return 1;
}

int tsp_gang_join(tsp_gang_t *g, int node_rank, int try_no, const char *host, int64_t now_ms,
                  char *err, size_t errlen)
{
    if (tsp_gang_state(g, now_ms) == TSP_GANG_FAILED)
        return tsp_gang_reason(g, err, errlen);
    if (node_rank < 0 || node_rank >= g->n)
        return tsp__err(err, errlen, TSP_GANG_REFUSED,
                        "node %d is not a node of this attempt (0..%d)", node_rank, g->n - 1);
    if (try_no < 0 || !host_ok(host))
        return tsp__err(err, errlen, TSP_GANG_REFUSED,
                        "a JOIN needs a try >= 0 and a host name of 1..%d bytes of "
                        "[A-Za-z0-9._:-]",
                        TSP_GANG_HOST_MAX);
    if (try_no > 0 && !g->complete) {
        /* Its first run ended before the gang formed: this attempt can no longer form. */
        snprintf(g->why, sizeof g->why,
                 "node %d's task failed before the gang formed and Spark retried it "
                 "(attempt %d), which never joins an attempt",
                 node_rank, try_no);
        g->failed = 1;
        return tsp_gang_reason(g, err, errlen);
    }
    if (try_no > 0)
        return tsp__err(err, errlen, TSP_GANG_REFUSED,
                        "node %d's task is a retry (attempt %d) and never joins a running "
                        "attempt",
                        node_rank, try_no);
    if (g->hosts[node_rank])
        return tsp__err(err, errlen, TSP_GANG_REFUSED, "node %d already joined this attempt",
                        node_rank);
    g->hosts[node_rank] = strdup(host);
    if (!g->hosts[node_rank])
        return tsp__err(err, errlen, TSP_GANG_REFUSED, "out of memory");
    if (++g->joined == g->n)
        g->complete = 1;
    return g->complete ? TSP_GANG_GO : TSP_GANG_WAIT;
}

int tsp_gang_joined(const tsp_gang_t *g)
{
    return g->joined;
}

int tsp_gang_size(const tsp_gang_t *g)
{
    return g->n;
}

int64_t tsp_gang_wait_ms(const tsp_gang_t *g, int64_t now_ms)
{
    if (g->complete || g->failed)
        return -1;
    return g->deadline > now_ms ? g->deadline - now_ms : 0;
}

/* "node 0 on host a, node 2 on host b" (at most LIST_MAX, then "and K more"), or "none". */
static void started(const tsp_gang_t *g, FILE *f)
{
    int named = 0;
    for (int i = 0; i < g->n; i++) {
        if (!g->hosts[i])
            continue;
        if (named == LIST_MAX) {
            fprintf(f, " and %d more", g->joined - named);
            return;
        }
        fprintf(f, "%snode %d on host %s", named ? ", " : "", i, g->hosts[i]);
        named++;
    }
    if (!named)
        fputs("none", f);
}

int tsp_gang_failure(const tsp_gang_t *g, int executors, int cores, const char *max_executors,
                     char *buf, size_t len)
{
    if (!g->failed || !buf || !len)
        return -EINVAL;
    FILE *f = fmemopen(buf, len, "w");
    if (!f)
        return -ENOMEM;
    fprintf(f, "torchspark: gang launch: %s (tasks started: ", g->why);
    started(g, f);
    fputs("); Spark had ", f);
    if (executors >= 0)
        fprintf(f, "%d executor(s)", executors);
    else
        fputs("an unknown number of executors", f);
    if (cores >= 0)
        fprintf(f, " with %d core(s) in all", cores);
    if (max_executors && *max_executors)
        fprintf(f, ", and spark.dynamicAllocation.maxExecutors is %s", max_executors);
    else
        fputs(", and spark.dynamicAllocation.maxExecutors is unset", f);
    fprintf(f,
            ": every node needs a task slot at the same time, so raise "
            "spark.dynamicAllocation.maxExecutors (or the executors' cores) to fit %d tasks, "
            "lower num_processes, or wait longer with spark.torchspark.gang.timeout",
            g->n);
    long n = ftell(f);
    fclose(f);
    return n < 0 ? -EIO : (int)n;
}

int tsp_gang_report(const tsp_gang_t *g, int executors, int cores, const char *max_executors,
                    char *buf, size_t len)
{
    char sentence[2048];
    int n = tsp_gang_failure(g, executors, cores, max_executors, sentence, sizeof sentence);
    if (n < 0 || !buf || !len)
        return n < 0 ? n : -EINVAL;
    FILE *f = fmemopen(buf, len, "w");
    if (!f)
        return -ENOMEM;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "version");
    tsp_json_int(&w, 2);
    tsp_json_key(&w, "kind");
    tsp_json_str(&w, "gang");
    tsp_json_key(&w, "reason");
    tsp_json_str(&w, "gang_incomplete");
    tsp_json_key(&w, "message");
    tsp_json_str(&w, sentence);
    tsp_json_end(&w);
    long k = ftell(f);
    int full = fflush(f) != 0 || k < 0 || (size_t)k >= len;
    fclose(f);
    return full ? -ENOSPC : (int)k;
}

/* ---- the golden contract: a replay of events (tests/contracts/gang.json) ------------- */

static const char *const names[] = {"WAIT", "GO", "REFUSED", "FAILED"}; /* TSP_GANG_* */

typedef struct {
    tsp_gang_t *g;
    tsp_json_writer_t *w;
    char *err;
    size_t errlen;
} replay_t;

/* The integer at key of the object doc (len bytes), or dflt when absent; -EINVAL with err. */
static int get_int(const char *doc, size_t len, const char *key, long long dflt, long long *v,
                   char *err, size_t errlen)
{
    char *s = NULL;
    int type = 0;
    int rc = tsp_json_get(doc, len, key, &s, &type);
    if (rc == -ENOENT) {
        *v = dflt;
        return 0;
    }
    char *end = NULL;
    if (rc == 0 && type == TSP_JSON_NUMBER)
        *v = strtoll(s, &end, 10);
    int ok = rc == 0 && type == TSP_JSON_NUMBER && end && !*end;
    free(s);
    return ok ? 0
              : tsp__err(err, errlen, -EINVAL, "the gang request's \"%s\" must be an integer", key);
}

static int replay_event(void *ctx, const char *key, size_t index, int type, const char *val,
                        size_t len)
{
    (void)key;
    replay_t *r = ctx;
    long long at = 0, node = -1, try_no = 0;
    if (type != TSP_JSON_OBJECT)
        return tsp__err(r->err, r->errlen, -EINVAL, "gang event %zu is not an object", index);
    int rc = get_int(val, len, "at", 0, &at, r->err, r->errlen);
    if (!rc)
        rc = get_int(val, len, "join", -1, &node, r->err, r->errlen);
    if (!rc)
        rc = get_int(val, len, "try", 0, &try_no, r->err, r->errlen);
    if (rc)
        return rc;
    char *host = NULL;
    int htype = 0;
    (void)tsp_json_get(val, len, "host", &host, &htype);
    char why[512] = "", line[600];
    int got = node >= 0 ? tsp_gang_join(r->g, (int)node, (int)try_no,
                                        htype == TSP_JSON_STRING ? host : NULL, at, why, sizeof why)
                        : tsp_gang_state(r->g, at);
    free(host);
    snprintf(line, sizeof line, "%s%s%s", names[got], why[0] ? ": " : "", why);
    tsp_json_str(r->w, line);
    return 0;
}

static int replay_write(const char *request, size_t len, tsp_json_writer_t *w, char *err,
                        size_t errlen)
{
    long long n = 0, timeout = 0, ex = -1, cores = -1, last = 0;
    int rc = get_int(request, len, "nnodes", 0, &n, err, errlen);
    if (!rc)
        rc = get_int(request, len, "timeout_ms", 0, &timeout, err, errlen);
    if (!rc)
        rc = get_int(request, len, "seen.executors", -1, &ex, err, errlen);
    if (!rc)
        rc = get_int(request, len, "seen.cores", -1, &cores, err, errlen);
    if (!rc)
        rc = get_int(request, len, "end", 0, &last, err, errlen);
    if (rc)
        return rc;
    tsp_gang_t *g = n > 0 && n <= TSP_GANG_MAX_NODES ? tsp_gang_new((int)n, 0, timeout) : NULL;
    if (!g)
        return tsp__err(err, errlen, -EINVAL,
                        "the gang request needs \"nnodes\" 1..%d and \"timeout_ms\" > 0",
                        TSP_GANG_MAX_NODES);
    tsp_json_key(w, "replies");
    tsp_json_begin_array(w);
    replay_t r = {g, w, err, errlen};
    rc = tsp_json_each(request, len, "events", replay_event, &r);
    tsp_json_end(w);
    tsp_json_key(w, "state");
    tsp_json_str(w, names[tsp_gang_state(g, last)]);
    char *maxex = NULL;
    int type = 0;
    (void)tsp_json_get(request, len, "seen.maxExecutors", &maxex, &type);
    char sentence[2048];
    int sn = tsp_gang_failure(g, (int)ex, (int)cores, type == TSP_JSON_STRING ? maxex : NULL,
                              sentence, sizeof sentence);
    tsp_json_key(w, "failure");
    tsp_json_str(w, sn >= 0 ? sentence : NULL);
    char doc[4096];
    int dn = tsp_gang_report(g, (int)ex, (int)cores, type == TSP_JSON_STRING ? maxex : NULL, doc,
                             sizeof doc);
    tsp_json_key(w, "report");
    if (dn < 0 || tsp_json_value(w, doc, (size_t)dn))
        tsp_json_null(w);
    free(maxex);
    tsp_gang_free(g);
    return rc == -ENOENT ? 0 : rc;
}

int tsp_gang_replay(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                    char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (tsp_json_check_object(request, len) != 0)
        return tsp__err(err, errlen, -EINVAL, "the gang request is not a JSON object");
    tsp_json_reply_t rp;
    int rc = tsp_json_reply_open(&rp);
    if (!rc)
        rc = replay_write(request, len, &rp.w, err, errlen);
    return tsp_json_reply_close(&rp, rc, out, outlen, needed);
}
