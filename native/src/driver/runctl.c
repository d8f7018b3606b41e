/* runctl.c: the run controller, a pure step function (torchspark/runctl.h, docs/protocol.md
 * section 11): the controller's state + one event a glue observed -> the next state + the
 * actions the glue performs. Restart policy, elastic min_nodes, the replacement wait, attempt
 * numbering, the attempt's environment and the history of causes are decided here only;
 * Spark's failure text is read by the outcome table (outcome.c), never here. */
#include "torchspark/runctl.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jreq.h"
#include "json.h"
#include "runrec.h"
#include "torchspark/outcome.h"
#include "util.h"

#define CAUSE_MAX 500      /* bytes of one attempt's cause */
#define ENV_CAUSE_MAX 1000 /* bytes of the cause handed to the next attempt */
#define REPLACEMENT_KEY "spark.torchspark.job.replacementTimeout"
#define WATCH_MS 3000          /* a shrunk attempt's slot count, every so often */
#define POLL_MS 100            /* a count while waiting for slots or for the attempt's server */
#define GROW_DEADLINE_MS 60000 /* from the request to checkpoint until the attempt stopped */
#define HOLD_MS 86400000LL     /* a held slot's sleep: the attempt's end interrupts it first */

/* What differs between the glues' words: the runner's name and its settings' spelling. */
typedef struct {
    const char *glue, *who, *restarts, *min_nodes;
} glue_t;

static const glue_t glues[] = {
    {"python", "TorchDistributor", "max_restarts", "min_nodes"},
    {"java", "TorchSparkRunner", "maxRestarts", "minNodes"},
};

/* Where the run is: which events it waits for (docs/protocol.md section 11, "Phases"). */
enum { RUNNING, EXCLUDING, COUNTING, WAITING, DONE };
static const char *const phases[] = {"running", "excluding", "counting", "waiting", "done"};

typedef struct {
    const glue_t *g;
    int max_restarts, nodes, min_nodes, remote;
    int global_batch; /* spark.torchspark.elastic.batch=global (else per_rank) */
    int gang;         /* the attempts are gang launches (else barrier stages) */
    int dynamic;      /* spark.dynamicAllocation.enabled: Spark's allocation manager */
    long long timeout_ms;
    int phase, attempt, running; /* the attempt in flight and its nodes */
    int unusable;                /* slots Spark still counts that are not (a silent node's) */
    long long waited_ms;         /* waited for slots since the attempt failed */
    int grows;                   /* attempts that stopped to grow back (not restarts) */
    int grow;                    /* this attempt: 0, 1 asked to checkpoint and stop, 2 too late */
    char *last;                  /* the last attempt's error text (the final message's end) */
    char *reason;                /* the last failure's reason, or NULL */
    char *report;                /* the last attempt's report (a JSON object), or NULL */
    char **causes;               /* one line per attempt, in order (+ "no restart: ...") */
    size_t ncauses;
    tsp__runrec_t recs; /* each attempt's record (runrec.h) */
    char *at;           /* the event's "at": the glue's clock, as it is, or NULL */
    int submitted;      /* this step submits an attempt: its record begins */
} ctl_t;

static void ctl_free(ctl_t *c)
{
    for (size_t i = 0; i < c->ncauses; i++)
        free(c->causes[i]);
    free(c->causes);
    free(c->last);
    free(c->reason);
    free(c->report);
    free(c->at);
    tsp__runrec_free(&c->recs);
}

static int add_cause(ctl_t *c, const char *text)
{
    char **grown = realloc(c->causes, (c->ncauses + 1) * sizeof *grown);
    if (!grown)
        return -ENOMEM;
    c->causes = grown;
    if (!(c->causes[c->ncauses] = strdup(text)))
        return -ENOMEM;
    c->ncauses++;
    return 0;
}

/* ---- reading the request ---- */

/* The attempt's report at path (an object, docs/protocol.md section 8) into c->report, the
 * previous one's replaced; null or absent: none. */
static int report_of(const tsp_jreq_t *r, const char *path, ctl_t *c)
{
    char *v = NULL;
    int rc = tsp_jreq_get(r, path, TSP_JSON_OBJECT, "the attempt's report (an object) or null", &v);
    if (rc < 0)
        return rc;
    free(c->report);
    c->report = v;
    return 0;
}

/* An integer at path from lo up: 0 with *v (dflt when absent or null), or -EINVAL naming it. */
static int get_int(const tsp_jreq_t *r, const char *path, long long lo, long long dflt,
                   long long *v)
{
    char what[48];
    (void)snprintf(what, sizeof what, "a whole number from %lld", lo);
    *v = dflt;
    return tsp_jreq_num(r, path, lo, 1000000000LL, what, v);
}

static int get_str(const tsp_jreq_t *r, const char *path, char **v)
{
    int rc = tsp_jreq_get(r, path, TSP_JSON_STRING, "a string or null", v);
    return rc < 0 ? rc : 0;
}

static int read_glue(const tsp_jreq_t *r, const char *path, ctl_t *c)
{
    char *name = NULL;
    int rc = get_str(r, path, &name);
    for (size_t i = 0; !rc && name && i < sizeof glues / sizeof glues[0]; i++)
        if (strcmp(name, glues[i].glue) == 0)
            c->g = &glues[i];
    free(name);
    if (!rc && !c->g)
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the run controller's \"%s\" must be \"python\" or \"java\"", path);
    return rc;
}

typedef struct {
    ctl_t *c;
    int rc;
} causes_ctx_t;

static int each_cause(void *ctx, const char *key, size_t index, int type, const char *val,
                      size_t len)
{
    (void)key, (void)index, (void)len;
    causes_ctx_t *x = ctx;
    if (type != TSP_JSON_STRING)
        return x->rc = -EINVAL;
    return x->rc = add_cause(x->c, val);
}

/* The state a previous step wrote (the glue hands it back as it got it). */
static int read_state(const tsp_jreq_t *r, ctl_t *c)
{
    static const char *const ikeys[] = {"state.max_restarts", "state.nodes",
                                        "state.min_nodes",    "state.replacement_timeout_ms",
                                        "state.attempt",      "state.running",
                                        "state.unusable",     "state.waited_ms",
                                        "state.grows",        "state.grow_asked",
                                        "state.global_batch", "state.gang",
                                        "state.dynamic"};
    enum { NKEYS = sizeof ikeys / sizeof ikeys[0] };
    long long v[NKEYS] = {0};
    int rc = read_glue(r, "state.glue", c);
    for (size_t i = 0; !rc && i < NKEYS; i++)
        rc = get_int(r, ikeys[i], 0, -1, &v[i]);
    char *phase = NULL;
    if (!rc && !(rc = tsp_jreq_bool(r, "state.remote", &c->remote)) &&
        !(rc = get_str(r, "state.phase", &phase)) && !(rc = get_str(r, "state.last", &c->last)) &&
        !(rc = get_str(r, "state.reason", &c->reason)))
        rc = report_of(r, "state.report", c);
    c->phase = -1;
    for (int i = 0; !rc && phase && i <= DONE; i++)
        if (strcmp(phase, phases[i]) == 0)
            c->phase = i;
    free(phase);
    causes_ctx_t x = {c, 0};
    if (!rc && (rc = tsp_json_each(r->doc, r->len, "state.causes", each_cause, &x)) == -ENOENT)
        rc = 0;
    if (!rc)
        rc = tsp__runrec_read(r, &c->recs);
    for (size_t i = 0; !rc && i < NKEYS; i++)
        if (v[i] < 0)
            rc = -EINVAL;
    /* A failed attempt's cause is recorded before any phase that answers the failure. */
    if (!rc && c->phase > RUNNING && c->phase < DONE && c->ncauses == 0)
        rc = -EINVAL;
    if (rc == -EINVAL || (!rc && c->phase < 0))
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the run controller's \"state\" is not one it wrote: hand back the "
                        "\"state\" of the last reply as it is");
    if (!rc) {
        c->max_restarts = (int)v[0], c->nodes = (int)v[1], c->min_nodes = (int)v[2];
        c->timeout_ms = v[3], c->attempt = (int)v[4], c->running = (int)v[5];
        c->unusable = (int)v[6], c->waited_ms = v[7];
        c->grows = (int)v[8], c->grow = (int)v[9], c->global_batch = (int)v[10];
        c->gang = (int)v[11], c->dynamic = (int)v[12];
    }
    return rc;
}

/* ---- the actions and the state, written ---- */

/* Copies s with every control byte (NUL included) made a space, cut at max bytes on a UTF-8
 * boundary: the one rule for text handed to the training processes' environment. */
static void env_text(char *dst, const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n > max) {
        n = max;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? ' ' : s[i];
    dst[n] = 0;
}

static void key_int(tsp_json_writer_t *w, const char *k, long long v)
{
    tsp_json_key(w, k);
    tsp_json_int(w, v);
}

static void key_str(tsp_json_writer_t *w, const char *k, const char *v)
{
    tsp_json_key(w, k);
    tsp_json_str(w, v);
}

/* Under dynamic allocation a shrunk attempt holds a slot for each node it lacks (ordinary
 * tasks that sleep): Spark's allocation manager keeps asking for the run's executors, and
 * a replacement runs one from its registration, busy, so that the idle timeout does not
 * release it before the run grows back onto it (docs/protocol.md section 11, "hold"). A
 * classic gang holds them from its GO (the attempt's tasks placed first), a Connect client
 * once its probe of ordinary tasks found them; each until the attempt's job ended. */
static void act_hold(tsp_json_writer_t *w, const ctl_t *c)
{
    tsp_json_key(w, "hold");
    tsp_json_begin_object(w);
    key_int(w, "slots", c->nodes - c->running);
    key_str(w, "from", c->remote ? "probe" : "go");
    key_int(w, "ms", HOLD_MS);
    tsp_json_end(w);
}

/* The attempt's training processes' variables: none in a run without restarts (a plain run). */
static void write_env(tsp_json_writer_t *w, const ctl_t *c)
{
    char num[24], cause[ENV_CAUSE_MAX + 1];
    tsp_json_begin_object(w);
    if (c->max_restarts > 0) {
        snprintf(num, sizeof num, "%d", c->attempt);
        key_str(w, "TORCHSPARK_ATTEMPT", num);
        snprintf(num, sizeof num, "%d", c->max_restarts);
        key_str(w, "TORCHSPARK_MAX_RESTARTS", num);
    }
    if (c->max_restarts > 0 && c->min_nodes < c->nodes) { /* elastic: its size and the batch */
        snprintf(num, sizeof num, "%d", c->nodes);
        key_str(w, "TORCHSPARK_ELASTIC_BATCH", c->global_batch ? "global" : "per_rank");
        key_str(w, "TORCHSPARK_MAX_NODES", num);
    }
    if (c->ncauses > 0 && c->causes[c->ncauses - 1][0]) {
        env_text(cause, c->causes[c->ncauses - 1], ENV_CAUSE_MAX);
        key_str(w, "TORCHSPARK_RESTART_CAUSE", cause);
    }
    tsp_json_end(w);
}

static void act_submit(tsp_json_writer_t *w, ctl_t *c)
{
    c->submitted = 1;
    tsp_json_begin_object(w);
    key_str(w, "do", "submit");
    key_int(w, "attempt", c->attempt);
    key_int(w, "nodes", c->running);
    /* A failure of this attempt raises (on_failed's rule): the glue then waits for Spark's
     * own error. The attempt number runs ahead of the restarts once the run grew back. */
    int last = c->attempt - c->grows >= c->max_restarts;
    tsp_json_key(w, "last");
    (void)tsp_json_value(w, last ? "true" : "false", last ? 4 : 5);
    tsp_json_key(w, "env");
    write_env(w, c);
    if (c->max_restarts > 0) { /* its lines name it, before the glue's "[rank r] " */
        char prefix[40];
        snprintf(prefix, sizeof prefix, "[attempt %d] ", c->attempt);
        key_str(w, "prefix", prefix);
    }
    if (c->running < c->nodes) { /* shrunk: watch for executors coming back */
        key_int(w, "watch_ms", WATCH_MS);
        if (c->remote) /* a Connect client counts by a probe of the missing nodes (protocol 11) */
            key_int(w, "probe", c->nodes - c->running);
        if (c->dynamic && (c->gang || c->remote))
            act_hold(w, c);
    }
    tsp_json_end(w);
}

static void act_text(tsp_json_writer_t *w, const char *what, const char *key, const char *text)
{
    tsp_json_begin_object(w);
    key_str(w, "do", what);
    if (key)
        key_str(w, key, text);
    tsp_json_end(w);
}

/* One count of the slots after wait_ms (0: now); need is what the controller waits for. */
static void act_count(tsp_json_writer_t *w, const ctl_t *c, int need, long long wait_ms)
{
    tsp_json_begin_object(w);
    key_str(w, "do", "count_slots");
    key_int(w, "need", need);
    key_int(w, "least", c->min_nodes);
    key_int(w, "wait_ms", wait_ms);
    tsp_json_end(w);
}

static void write_causes(tsp_json_writer_t *w, const ctl_t *c)
{
    tsp_json_begin_array(w);
    for (size_t i = 0; i < c->ncauses; i++)
        tsp_json_str(w, c->causes[i]);
    tsp_json_end(w);
}

/* One member of the last attempt's report into the raise's, but its own "attempts". */
static int report_member(void *ctx, const char *key, size_t index, int type, const char *val,
                         size_t len)
{
    tsp_json_writer_t *w = ctx;
    (void)index;
    if (strcmp(key, "attempts") == 0)
        return 0;
    tsp_json_key(w, key);
    if (type == TSP_JSON_STRING)
        tsp_json_str(w, val);
    else
        (void)tsp_json_value(w, val, len);
    return 0;
}

/* The final exception: "failed" (no restarts: the attempt's own error as it is),
 * "exhausted" (every restart used) or "no_slots" (the replacement wait ran out). */
static int act_raise(tsp_json_writer_t *w, ctl_t *c, const char *kind)
{
    char *msg = NULL;
    size_t mlen = 0;
    FILE *m = open_memstream(&msg, &mlen);
    if (!m)
        return -ENOMEM;
    if (strcmp(kind, "failed") == 0)
        fputs(c->last ? c->last : "", m);
    else
        fprintf(m,
                "%s (distributed) failed after %zu attempt(s) (%s=%d): %s\n"
                "Root cause of each attempt, in order:",
                c->g->who, c->ncauses, c->g->restarts, c->max_restarts, c->last ? c->last : "");
    for (size_t i = 0; strcmp(kind, "failed") != 0 && i < c->ncauses; i++)
        fprintf(m, "\n  attempt %zu: %s", i, c->causes[i]);
    if (fclose(m) != 0) {
        free(msg);
        return -ENOMEM;
    }
    tsp_json_begin_object(w);
    key_str(w, "do", "raise");
    key_str(w, "kind", kind);
    key_str(w, "reason", c->reason);
    key_str(w, "message", msg);
    tsp_json_key(w, "attempts");
    write_causes(w, c);
    if (strcmp(kind, "failed") != 0) { /* the last attempt's report with the history */
        tsp_json_key(w, "report");
        tsp_json_begin_object(w);
        if (c->report)
            (void)tsp_json_each(c->report, strlen(c->report), NULL, report_member, w);
        tsp_json_key(w, "attempts");
        write_causes(w, c);
        tsp_json_end(w);
    }
    tsp_json_end(w);
    free(msg);
    c->phase = DONE;
    return 0;
}

static void write_state(tsp_json_writer_t *w, const ctl_t *c)
{
    tsp_json_begin_object(w);
    key_str(w, "glue", c->g->glue);
    key_str(w, "phase", phases[c->phase]);
    const char *ikeys[] = {"max_restarts", "nodes",      "min_nodes",    "replacement_timeout_ms",
                           "attempt",      "running",    "unusable",     "waited_ms",
                           "grows",        "grow_asked", "global_batch", "gang",
                           "dynamic"};
    const long long ivals[] = {c->max_restarts, c->nodes,   c->min_nodes,    c->timeout_ms,
                               c->attempt,      c->running, c->unusable,     c->waited_ms,
                               c->grows,        c->grow,    c->global_batch, c->gang,
                               c->dynamic};
    for (size_t i = 0; i < sizeof ikeys / sizeof ikeys[0]; i++)
        key_int(w, ikeys[i], ivals[i]);
    tsp_json_key(w, "remote");
    (void)tsp_json_value(w, c->remote ? "true" : "false", 4 + !c->remote);
    key_str(w, "reason", c->reason);
    key_str(w, "last", c->last);
    tsp_json_key(w, "report");
    if (!c->report || tsp_json_value(w, c->report, strlen(c->report)) != 0)
        tsp_json_null(w);
    tsp_json_key(w, "causes");
    write_causes(w, c);
    tsp_json_key(w, "attempts");
    tsp__runrec_write(w, &c->recs);
    tsp_json_end(w);
}

/* ---- the events ---- */

static int on_start(const tsp_jreq_t *r, ctl_t *c, tsp_json_writer_t *w)
{
    long long nodes = 0, limit = 0, least = 0, timeout = 0;
    char *batch = NULL, *launch = NULL;
    int rc = read_glue(r, "event.glue", c);
    if (rc || (rc = get_int(r, "event.nodes", 1, -1, &nodes)) ||
        (rc = get_int(r, "event.max_restarts", 0, 0, &limit)) ||
        (rc = get_int(r, "event.min_nodes", 1, 0, &least)) ||
        (rc = get_int(r, "event.replacement_timeout_ms", 0, 30000, &timeout)) ||
        (rc = tsp_jreq_bool(r, "event.remote", &c->remote)) ||
        (rc = get_str(r, "event.batch", &batch)) || (rc = get_str(r, "event.launch", &launch)) ||
        (rc = tsp_jreq_bool(r, "event.dynamic", &c->dynamic)))
        goto out;
    if (batch && strcmp(batch, "global") != 0 && strcmp(batch, "per_rank") != 0)
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the run controller's \"batch\" must be \"per_rank\", \"global\" or "
                      "null (spark.torchspark.elastic.batch)");
    else if (launch && strcmp(launch, "gang") != 0 && strcmp(launch, "barrier") != 0)
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the run controller's \"launch\" must be \"barrier\", \"gang\" or null "
                      "(spark.torchspark.launch, with auto resolved: got %s)",
                      launch);
    c->global_batch = batch && strcmp(batch, "global") == 0;
    c->gang = launch && strcmp(launch, "gang") == 0;
out:
    free(batch);
    free(launch);
    if (rc)
        return rc;
    if (nodes < 1)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the run controller's \"start\" needs \"nodes\": the run's barrier tasks "
                        "(a whole number from 1)");
    if (least == 0)
        least = nodes; /* not elastic */
    if (least > nodes)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "%s is %lld: give a whole number of nodes (barrier tasks) from 1 to the "
                        "run's %lld",
                        c->g->min_nodes, least, nodes);
    c->nodes = c->running = (int)nodes;
    c->max_restarts = (int)limit;
    c->min_nodes = (int)least;
    c->timeout_ms = timeout;
    c->phase = RUNNING;
    act_submit(w, c);
    return 0;
}

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
 * (distributed) failed: " in front (the glue's exception reads so), at most CAUSE_MAX bytes. */
static void first_line(char *dst, const char *text, const glue_t *g)
{
    const char *p = text ? text : "";
    while (*p && isspace((unsigned char)*p))
        p++;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s (distributed) failed: ", g->who);
    if (strncmp(p, prefix, strlen(prefix)) == 0)
        p += strlen(prefix);
    size_t n = strcspn(p, "\r\n");
    while (n > 0 && isspace((unsigned char)p[n - 1]))
        n--;
    if (n > CAUSE_MAX) {
        n = CAUSE_MAX;
        while (n > 0 && ((unsigned char)p[n] & 0xC0) == 0x80)
            n--;
    }
    if (n == 0)
        snprintf(dst, CAUSE_MAX + 1, "the attempt failed with no message");
    else
        snprintf(dst, CAUSE_MAX + 1, "%.*s", (int)n, p);
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

static int lost_nodes(const tsp_jreq_t *r, const ctl_t *c, char *who, size_t wlen, int *n)
{
    char *v = NULL;
    const char *what = "an array of node ranks (whole numbers from 0) or null";
    int rc = tsp_jreq_get(r, "event.lost_nodes", TSP_JSON_ARRAY, what, &v);
    *n = 0;
    who[0] = 0;
    if (rc <= 0)
        return rc;
    gone_t g = {calloc((size_t)c->running, 1), c->running, 0, who, wlen};
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
static int root_cause(const tsp_jreq_t *r, ctl_t *c, char *cause, int *lost, long long *failed_node)
{
    long long node = -1, step = -1;
    char *reason = NULL, *spark = NULL, *sreason = NULL, *scause = NULL;
    char gone[96];
    long long silent_node = -1;
    int ngone = 0, rc = get_int(r, "event.node_rank", -1, -1, &node);
    if (rc || (rc = get_int(r, "event.checkpoint_step", 0, -1, &step)) ||
        (rc = lost_nodes(r, c, gone, sizeof gone, &ngone)) ||
        (rc = get_str(r, "event.reason", &reason)) ||
        (rc = get_str(r, "event.spark_error", &spark)) ||
        (rc = get_int(r, "event.silent_node", 0, -1, &silent_node)) ||
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
    if (ngone >= c->running)
        ngone = 0;
    if (reason && strcmp(reason, "grow") == 0) { /* every node stopped on the driver's request */
        if (step >= 0)
            snprintf(cause, CAUSE_MAX + 1,
                     "the run grows back to more nodes: step %lld was checkpointed on request "
                     "and the attempt stopped",
                     step);
        else
            snprintf(cause, CAUSE_MAX + 1,
                     "the run grows back to more nodes: the attempt stopped on request");
        *lost = 0;
    } else if (step >= 0 || preempted || (reason && strcmp(reason, "decommission") == 0)) {
        /* The plugin asked the node to checkpoint: a SIGTERM to its executor (preempted) or
         * a decommission notice; the executor is going away either way. */
        const char *what = preempted ? "was preempted (SIGTERM)" : "is being decommissioned";
        if (step >= 0)
            snprintf(cause, CAUSE_MAX + 1,
                     "%s %s: step %lld was checkpointed on request and the node stopped", who, what,
                     step);
        else
            snprintf(cause, CAUSE_MAX + 1, "%s %s: the node stopped", who, what);
        free(reason);
        reason = strdup(preempted ? "preempted" : "decommission");
        *lost = 1;
    } else if (ngone && !root_lost && spark_lost) { /* Spark's text names the executor */
        snprintf(cause, CAUSE_MAX + 1, "%s %s %s lost: %s", ngone > 1 ? "nodes" : "node", gone,
                 ngone > 1 ? "were" : "was", scause);
        free(reason);
        reason = strdup(sreason);
        *lost = ngone;
    } else if (ngone && !root_lost) {
        /* Another node's error came first (gloo's "Connection reset by peer"), but the log
         * server saw these nodes go before the run was stopped: they are the cause. */
        if (ngone > 1)
            snprintf(cause, CAUSE_MAX + 1,
                     "nodes %s were lost: their executors or hosts went away (their executor "
                     "JVMs died, or their channels to the driver ended without a goodbye); the "
                     "other nodes' errors are their consequences",
                     gone);
        else
            snprintf(cause, CAUSE_MAX + 1,
                     "node %s was lost: its executor or host went away (its executor JVM died, "
                     "or its channel to the driver ended without a goodbye); the other nodes' "
                     "errors are its consequences",
                     gone);
        free(reason);
        reason = strdup("eof");
        *lost = ngone;
    } else if (spark_lost) {
        snprintf(cause, CAUSE_MAX + 1, "%s", scause);
        free(reason);
        reason = strdup(sreason);
        *lost = 1;
    } else {
        first_line(cause, c->last, c->g);
        *lost = reason && strcmp(reason, "silent") == 0;
        if (root_lost && ngone > *lost) /* the root's node, and any other lost with it */
            *lost = ngone;
    }
    free(c->reason);
    c->reason = reason;
    reason = NULL;
    *failed_node = node;
out:
    free(reason);
    free(spark);
    free(sreason);
    free(scause);
    return rc;
}

/* The next attempt on nodes, after waiting waited_ms: a warning, then its submission. */
static void restart(tsp_json_writer_t *w, ctl_t *c, int nodes)
{
    char seen[128], fewer[160] = "", text[CAUSE_MAX + 512];
    if (c->remote && c->gang) /* no barrier stage: the attempt's gang waits for its tasks */
        snprintf(seen, sizeof seen,
                 "Spark Connect: the gang launch waits for the slots "
                 "(spark.torchspark.gang.timeout)");
    else if (c->remote)
        snprintf(seen, sizeof seen,
                 "Spark Connect: Spark's barrier slot check waits for the slots");
    else
        snprintf(seen, sizeof seen, "%d slot(s) available after %.1fs", nodes,
                 (double)c->waited_ms / 1000.0);
    if (nodes < c->nodes)
        snprintf(fewer, sizeof fewer, "; on %d of %d nodes (%s=%d)", nodes, c->nodes,
                 c->g->min_nodes, c->min_nodes);
    int grew = c->reason && strcmp(c->reason, "grow") == 0;
    snprintf(text, sizeof text, "%s attempt %d %s: %s; %s as attempt %d of %d (%s%s)", c->g->who,
             c->attempt, grew ? "stopped" : "failed", c->causes[c->ncauses - 1],
             grew ? "going on" : "restarting", c->attempt + 1, c->max_restarts + 1 + c->grows, seen,
             fewer);
    act_text(w, "warn", "text", text);
    c->attempt++;
    c->grow = 0;
    c->running = nodes;
    c->unusable = 0;
    c->waited_ms = 0;
    c->phase = RUNNING;
    act_submit(w, c);
}

static void count_now(tsp_json_writer_t *w, ctl_t *c)
{
    c->phase = COUNTING;
    act_count(w, c, c->nodes + c->unusable, 0);
}

static int on_failed(const tsp_jreq_t *r, ctl_t *c, tsp_json_writer_t *w)
{
    char cause[CAUSE_MAX + 1], *executor = NULL;
    long long node = -1;
    free(c->last); /* the previous attempt's */
    c->last = NULL;
    int lost = 0, rc = get_str(r, "event.message", &c->last);
    if (rc || (rc = root_cause(r, c, cause, &lost, &node)) || (rc = add_cause(c, cause)) ||
        (rc = tsp__runrec_end(&c->recs, r, cause)) ||
        (rc = get_str(r, "event.executor", &executor)) || (rc = report_of(r, "event.report", c)))
        goto out;
    if (c->reason && strcmp(c->reason, "grow") == 0)
        c->grows++; /* not a restart: it does not count against max_restarts */
    if (c->attempt - c->grows >= c->max_restarts) {
        rc = act_raise(w, c, c->max_restarts == 0 ? "failed" : "exhausted");
    } else if (c->remote) { /* the client cannot count slots: Spark (or the gang) waits */
        restart(w, c, c->nodes - lost > c->min_nodes ? c->nodes - lost : c->min_nodes);
    } else if (c->reason &&
               (strcmp(c->reason, "silent") == 0 || strcmp(c->reason, "preempted") == 0)) {
        /* Spark offers a silent node's executor until its heartbeat timeout, and a preempted
         * one until its JVM has exited: its slots are not usable, unless the glue can take it
         * out of scheduling by its id. */
        c->unusable = 1;
        if (executor) {
            c->phase = EXCLUDING;
            tsp_json_begin_object(w);
            key_str(w, "do", "exclude_executor");
            key_str(w, "id", executor);
            key_int(w, "node", node);
            tsp_json_end(w);
        } else {
            count_now(w, c);
        }
    } else {
        count_now(w, c);
    }
out:
    free(executor);
    return rc;
}

static int on_excluded(const tsp_jreq_t *r, ctl_t *c, tsp_json_writer_t *w)
{
    int ok = 0, rc = tsp_jreq_bool(r, "event.ok", &ok);
    char *id = NULL;
    long long node = -1;
    if (rc || (rc = get_str(r, "event.id", &id)) || (rc = get_int(r, "event.node", -1, -1, &node)))
        goto out;
    if (ok && (rc = tsp__runrec_excluded(&c->recs, id)))
        goto out;
    if (ok) { /* its slots no longer count, and a replacement executor may come for it */
        char text[512];
        c->unusable = 0;
        snprintf(text, sizeof text,
                 "%s: executor %s (node %lld, %s) is excluded from the next attempt: "
                 "SparkContext.killAndReplaceExecutor asked the cluster manager to replace it",
                 c->g->who, id ? id : "?", node, c->reason ? c->reason : "silent");
        act_text(w, "warn", "text", text);
    }
    count_now(w, c);
out:
    free(id);
    return rc;
}

/* The wait before the next count for a replacement: POLL_MS, at most what is left of the
 * replacement timeout (counted from the attempt's failure). */
static long long next_poll(const ctl_t *c)
{
    long long left = c->timeout_ms - c->waited_ms;
    return left < 0 ? 0 : left < POLL_MS ? left : POLL_MS;
}

static int on_slots(const tsp_jreq_t *r, ctl_t *c, tsp_json_writer_t *w)
{
    long long free_now = -1, waited = 0;
    int rc = get_int(r, "event.free", -1, -1, &free_now);
    if (rc || (rc = get_int(r, "event.waited_ms", 0, 0, &waited)))
        return rc;
    c->waited_ms += waited;
    if (free_now < 0) /* Spark cannot tell: its own barrier slot check decides */
        free_now = (c->phase == COUNTING ? c->nodes : c->min_nodes) + c->unusable;
    long long slots = free_now - c->unusable;
    if (c->phase == COUNTING) {
        if (slots >= c->nodes)
            restart(w, c, c->nodes);
        else if (slots >= c->min_nodes) /* elastic: the survivors go on at once */
            restart(w, c, (int)slots);
        else { /* wait for a replacement executor: a count every POLL_MS */
            c->phase = WAITING;
            act_count(w, c, c->min_nodes + c->unusable, next_poll(c));
        }
        return 0;
    }
    if (slots >= c->min_nodes) {
        restart(w, c, slots < c->nodes ? (int)slots : c->nodes);
        return 0;
    }
    if (c->waited_ms < c->timeout_ms) { /* not yet: count again */
        act_count(w, c, c->min_nodes + c->unusable, next_poll(c));
        return 0;
    }
    char want[64], text[CAUSE_MAX + 1];
    if (c->min_nodes == c->nodes)
        snprintf(want, sizeof want, "%d", c->nodes);
    else
        snprintf(want, sizeof want, "at least %d (%s)", c->min_nodes, c->g->min_nodes);
    snprintf(text, sizeof text,
             "no restart: %s task slot(s) needed, %lld available after waiting %gs for a "
             "replacement executor (" REPLACEMENT_KEY ")",
             want, slots, (double)c->timeout_ms / 1000.0);
    return (rc = add_cause(c, text)) ? rc : act_raise(w, c, "no_slots");
}

static void act_watch(tsp_json_writer_t *w, long long wait_ms)
{
    tsp_json_begin_object(w);
    key_str(w, "do", "watch_slots");
    key_int(w, "wait_ms", wait_ms);
    tsp_json_end(w);
}

/* A shrunk attempt's slot count (the submit's watch_ms, then each watch_slots): more slots
 * than it runs on ask it to checkpoint and stop, to go on with more nodes (docs/protocol.md
 * section 11, "Growing back"); a count after the request's deadline means it did not stop. */
static int on_watch(const tsp_jreq_t *r, ctl_t *c, tsp_json_writer_t *w)
{
    long long free_now = -1, waited = 0;
    int pending = 0, rc = get_int(r, "event.free", -1, -1, &free_now);
    if (rc || (rc = get_int(r, "event.waited_ms", 0, 0, &waited)) ||
        (rc = tsp_jreq_bool(r, "event.server_pending", &pending)))
        return rc;
    if (c->grow == 0 && pending && free_now > c->running && c->running < c->nodes) {
        act_watch(w, POLL_MS); /* its agents cannot be asked before its log server is up */
    } else if (c->grow == 1) { /* the deadline passed and the attempt still runs */
        char text[CAUSE_MAX + 512];
        snprintf(text, sizeof text,
                 "%s: attempt %d was asked to checkpoint and stop so that the run grows back to "
                 "more nodes, but it did not stop within %ds: it goes on with %d of %d nodes "
                 "(the training loop must call torchspark.checkpoint.requested() and save when "
                 "it says so: docs/distributor.md, \"Elastic size\")",
                 c->g->who, c->attempt, GROW_DEADLINE_MS / 1000, c->running, c->nodes);
        act_text(w, "warn", "text", text);
        c->grow = 2;
    } else if (c->grow == 0 && free_now > c->running && c->running < c->nodes) {
        char text[512];
        int to = free_now < c->nodes ? (int)free_now : c->nodes;
        snprintf(text, sizeof text,
                 "%s: %lld slot(s) now, attempt %d runs on %d of %d nodes (%s=%d): asking it to "
                 "checkpoint and stop, to go on with %d nodes",
                 c->g->who, free_now, c->attempt, c->running, c->nodes, c->g->min_nodes,
                 c->min_nodes, to);
        act_text(w, "warn", "text", text);
        tsp_json_begin_object(w);
        key_str(w, "do", "checkpoint_and_stop");
        key_str(w, "reason", "grow");
        key_int(w, "nodes", to);
        key_int(w, "deadline_ms", GROW_DEADLINE_MS);
        snprintf(text, sizeof text,
                 "%s: attempt %d could not be asked to checkpoint (its log server is gone): it "
                 "goes on with %d of %d nodes",
                 c->g->who, c->attempt, c->running, c->nodes);
        key_str(w, "unreachable", text);
        tsp_json_end(w);
        act_watch(w, GROW_DEADLINE_MS);
        c->grow = 1;
    } else if (c->grow == 0 && free_now >= 0 && c->running < c->nodes) {
        act_watch(w, WATCH_MS);
    } /* else: nothing more to watch (Spark cannot tell, or too late once) */
    return 0;
}

static int on_succeeded(const tsp_jreq_t *r, ctl_t *c, tsp_json_writer_t *w)
{
    c->phase = DONE;
    act_text(w, "return", NULL, NULL);
    return tsp__runrec_end(&c->recs, r, NULL);
}

/* The events and the phase each is expected in (-1: none, the run's first event). */
static const struct {
    const char *name;
    int phase, alt;
    int (*fn)(const tsp_jreq_t *, ctl_t *, tsp_json_writer_t *);
} events[] = {
    {"start", -1, -1, on_start},
    {"attempt_failed", RUNNING, RUNNING, on_failed},
    {"attempt_succeeded", RUNNING, RUNNING, on_succeeded},
    {"excluded", EXCLUDING, EXCLUDING, on_excluded},
    {"slots", COUNTING, WAITING, on_slots},
    {"slots", RUNNING, RUNNING, on_watch},
};

static int find_event(const tsp_jreq_t *r, const ctl_t *c, int has_state, size_t *which)
{
    char *name = NULL;
    int rc = get_str(r, "event.event", &name);
    if (rc)
        return rc;
    for (*which = 0; name && *which < sizeof events / sizeof events[0]; (*which)++)
        if (strcmp(name, events[*which].name) == 0 &&
            (!has_state || events[*which].phase < 0 || c->phase == events[*which].phase ||
             c->phase == events[*which].alt || *which + 1 == sizeof events / sizeof events[0] ||
             strcmp(name, events[*which + 1].name) != 0))
            break; /* the entry for this phase, else the name's last one (refused below) */
    if (!name || *which == sizeof events / sizeof events[0])
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the run controller's \"event.event\" must be one of start, "
                      "attempt_failed, attempt_succeeded, excluded, slots (got %s)",
                      name ? name : "none");
    else if (events[*which].phase < 0 ? has_state
                                      : !has_state || (c->phase != events[*which].phase &&
                                                       c->phase != events[*which].alt))
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the run controller got \"%s\" while %s: \"start\" comes first, with a "
                      "null \"state\", and each later event answers the last reply's actions",
                      name,
                      has_state && c->phase >= 0 && c->phase <= DONE ? phases[c->phase]
                                                                     : "it has no state");
    free(name);
    return rc;
}

static int step(const tsp_jreq_t *r, ctl_t *c, char **text, size_t *tlen)
{
    char *state = NULL;
    int rc =
        tsp_jreq_get(r, "state", TSP_JSON_OBJECT, "an object (the last reply's) or null", &state);
    int has_state = state != NULL;
    free(state);
    rc = rc < 0 ? rc : 0;
    if (!rc && has_state)
        rc = read_state(r, c);
    size_t which = 0;
    if (rc || (rc = find_event(r, c, has_state, &which)) ||
        (rc = tsp_jreq_get(r, "event.at", TSP_JSON_NUMBER, "a number (the glue's clock) or null",
                           &c->at)) < 0)
        return rc;
    FILE *m = open_memstream(text, tlen);
    if (!m)
        return -ENOMEM;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, m);
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "actions");
    tsp_json_begin_array(&w);
    rc = events[which].fn(r, c, &w);
    if (!rc && c->submitted && c->max_restarts > 0) /* a run with restarts has records */
        rc = tsp__runrec_begin(&c->recs, c->attempt, c->running, c->at);
    tsp_json_end(&w);
    if (!rc) {
        tsp_json_key(&w, "state");
        write_state(&w, c);
    }
    tsp_json_end(&w);
    return fclose(m) == 0 ? rc : -ENOMEM;
}

int tsp_runctl_step(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                    char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    tsp_jreq_t r = {request, len, "the run controller", err, errlen};
    if (tsp_json_check_object(request, len) != 0)
        return tsp__err(err, errlen, -EINVAL, "the run controller's request is not a JSON object");
    ctl_t c = {0};
    char *text = NULL;
    size_t tlen = 0;
    int rc = step(&r, &c, &text, &tlen);
    if (!rc)
        rc = tsp__reply_copy(text, tlen, out, outlen, needed);
    free(text);
    ctl_free(&c);
    return rc;
}
