/* runstate.c: the run controller's state (runstate.h, docs/protocol.md section 11, "The
 * state"), read back from the request and written with the reply, and the actions the
 * controller writes: submit (the attempt's environment and prefix), count_slots, warn,
 * raise (the final message with the history of causes) and the next attempt's restart. */
#include "runstate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lines.h"
#include "util.h"

#define ENV_CAUSE_MAX 1000 /* bytes of the cause handed to the next attempt */
#define HOLD_MS 86400000LL /* a held slot's sleep: the attempt's end interrupts it first */

static const tsp__glue_t glues[] = {
    {"python", "TorchDistributor", "max_restarts", "min_nodes"},
    {"java", "TorchSparkRunner", "maxRestarts", "minNodes"},
};

const char *const tsp__ctl_phases[] = {"running", "excluding", "counting", "waiting", "done"};

void tsp__ctl_free(tsp__ctl_t *c)
{
    for (size_t i = 0; i < c->ncauses; i++)
        free(c->causes[i]);
    free(c->causes);
    free(c->last);
    free(c->reason);
    free(c->report);
    free(c->at);
    free(c->exclude_id);
    tsp__runrec_free(&c->recs);
}

int tsp__ctl_add_cause(tsp__ctl_t *c, const char *text)
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

int tsp__ctl_report_of(const tsp_jreq_t *r, const char *path, tsp__ctl_t *c)
{
    char *v = NULL;
    int rc = tsp_jreq_get(r, path, TSP_JSON_OBJECT, "the attempt's report (an object) or null", &v);
    if (rc < 0)
        return rc;
    free(c->report);
    c->report = v;
    return 0;
}

int tsp__ctl_read_glue(const tsp_jreq_t *r, const char *path, tsp__ctl_t *c)
{
    char *name = NULL;
    int rc = tsp__ctl_str(r, path, &name);
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
    tsp__ctl_t *c;
    int rc;
} causes_ctx_t;

static int each_cause(void *ctx, const char *key, size_t index, int type, const char *val,
                      size_t len)
{
    (void)key, (void)index, (void)len;
    causes_ctx_t *x = ctx;
    if (type != TSP_JSON_STRING)
        return x->rc = -EINVAL;
    return x->rc = tsp__ctl_add_cause(x->c, val);
}

int tsp__ctl_read_state(const tsp_jreq_t *r, tsp__ctl_t *c)
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
    int rc = tsp__ctl_read_glue(r, "state.glue", c);
    for (size_t i = 0; !rc && i < NKEYS; i++)
        rc = tsp__ctl_int(r, ikeys[i], 0, -1, &v[i]);
    char *phase = NULL;
    if (!rc && !(rc = tsp_jreq_bool(r, "state.remote", &c->remote)) &&
        !(rc = tsp__ctl_str(r, "state.phase", &phase)) &&
        !(rc = tsp__ctl_str(r, "state.last", &c->last)) &&
        !(rc = tsp__ctl_str(r, "state.reason", &c->reason)) &&
        !(rc = tsp__ctl_str(r, "state.exclude_id", &c->exclude_id)) &&
        !(rc = tsp__ctl_int(r, "state.exclude_node", -1, -1, &c->exclude_node)))
        rc = tsp__ctl_report_of(r, "state.report", c);
    c->phase = -1;
    for (int i = 0; !rc && phase && i <= TSP__CTL_DONE; i++)
        if (strcmp(phase, tsp__ctl_phases[i]) == 0)
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
    if (!rc && c->phase > TSP__CTL_RUNNING && c->phase < TSP__CTL_DONE && c->ncauses == 0)
        rc = -EINVAL;
    if (!rc && (c->phase == TSP__CTL_EXCLUDING) != (c->exclude_id != NULL))
        rc = -EINVAL; /* the executor asked for, while (and only while) its answer is due */
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

void tsp__ctl_key_int(tsp_json_writer_t *w, const char *k, long long v)
{
    tsp_json_key(w, k);
    tsp_json_int(w, v);
}

void tsp__ctl_key_str(tsp_json_writer_t *w, const char *k, const char *v)
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
static void act_hold(tsp_json_writer_t *w, const tsp__ctl_t *c)
{
    tsp_json_key(w, "hold");
    tsp_json_begin_object(w);
    tsp__ctl_key_int(w, "slots", c->nodes - c->running);
    tsp__ctl_key_str(w, "from", c->remote ? "probe" : "go");
    tsp__ctl_key_int(w, "ms", HOLD_MS);
    tsp_json_end(w);
}

/* The attempt's training processes' variables: none in a run without restarts (a plain run). */
static void write_env(tsp_json_writer_t *w, const tsp__ctl_t *c)
{
    char num[24], cause[ENV_CAUSE_MAX + 1];
    tsp_json_begin_object(w);
    if (c->max_restarts > 0) {
        snprintf(num, sizeof num, "%d", c->attempt);
        tsp__ctl_key_str(w, "TORCHSPARK_ATTEMPT", num);
        snprintf(num, sizeof num, "%d", c->max_restarts);
        tsp__ctl_key_str(w, "TORCHSPARK_MAX_RESTARTS", num);
    }
    if (c->max_restarts > 0 && c->min_nodes < c->nodes) { /* elastic: its size and the batch */
        snprintf(num, sizeof num, "%d", c->nodes);
        tsp__ctl_key_str(w, "TORCHSPARK_ELASTIC_BATCH", c->global_batch ? "global" : "per_rank");
        tsp__ctl_key_str(w, "TORCHSPARK_MAX_NODES", num);
    }
    if (c->ncauses > 0 && c->causes[c->ncauses - 1][0]) {
        env_text(cause, c->causes[c->ncauses - 1], ENV_CAUSE_MAX);
        tsp__ctl_key_str(w, "TORCHSPARK_RESTART_CAUSE", cause);
    }
    tsp_json_end(w);
}

void tsp__ctl_submit(tsp_json_writer_t *w, tsp__ctl_t *c)
{
    c->submitted = 1;
    tsp_json_begin_object(w);
    tsp__ctl_key_str(w, "do", "submit");
    tsp__ctl_key_int(w, "attempt", c->attempt);
    tsp__ctl_key_int(w, "nodes", c->running);
    /* A failure of this attempt raises (on_failed's rule): the glue then waits for Spark's
     * own error. The attempt number runs ahead of the restarts once the run grew back. */
    int last = c->attempt - c->grows >= c->max_restarts;
    tsp_json_key(w, "last");
    (void)tsp_json_value(w, last ? "true" : "false", last ? 4 : 5);
    tsp_json_key(w, "env");
    write_env(w, c);
    /* Its lines' prefix template (the log server's pull_text): with restarts they name it. */
    char prefix[64] = TSP_LINES_PREFIX;
    if (c->max_restarts > 0)
        snprintf(prefix, sizeof prefix, "[attempt %d] %s", c->attempt, TSP_LINES_PREFIX);
    tsp__ctl_key_str(w, "prefix", prefix);
    if (c->running < c->nodes) { /* shrunk: watch for executors coming back */
        tsp__ctl_key_int(w, "watch_ms", TSP__CTL_WATCH_MS);
        if (c->remote) /* a Connect client counts by a probe of the missing nodes (protocol 11) */
            tsp__ctl_key_int(w, "probe", c->nodes - c->running);
        if (c->dynamic && (c->gang || c->remote))
            act_hold(w, c);
    }
    tsp_json_end(w);
}

void tsp__ctl_text(tsp_json_writer_t *w, const char *what, const char *key, const char *text)
{
    tsp_json_begin_object(w);
    tsp__ctl_key_str(w, "do", what);
    if (key)
        tsp__ctl_key_str(w, key, text);
    tsp_json_end(w);
}

/* One count of the slots after wait_ms (0: now); need is what the controller waits for. */
void tsp__ctl_count(tsp_json_writer_t *w, const tsp__ctl_t *c, int need, long long wait_ms)
{
    tsp_json_begin_object(w);
    tsp__ctl_key_str(w, "do", "count_slots");
    tsp__ctl_key_int(w, "need", need);
    tsp__ctl_key_int(w, "least", c->min_nodes);
    tsp__ctl_key_int(w, "wait_ms", wait_ms);
    tsp_json_end(w);
}

static void write_causes(tsp_json_writer_t *w, const tsp__ctl_t *c)
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
int tsp__ctl_raise(tsp_json_writer_t *w, tsp__ctl_t *c, const char *kind)
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
    tsp__ctl_key_str(w, "do", "raise");
    tsp__ctl_key_str(w, "kind", kind);
    tsp__ctl_key_str(w, "reason", c->reason);
    tsp__ctl_key_str(w, "message", msg);
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
    c->phase = TSP__CTL_DONE;
    return 0;
}

void tsp__ctl_write_state(tsp_json_writer_t *w, const tsp__ctl_t *c)
{
    tsp_json_begin_object(w);
    tsp__ctl_key_str(w, "glue", c->g->glue);
    tsp__ctl_key_str(w, "phase", tsp__ctl_phases[c->phase]);
    const char *ikeys[] = {"max_restarts", "nodes",      "min_nodes",    "replacement_timeout_ms",
                           "attempt",      "running",    "unusable",     "waited_ms",
                           "grows",        "grow_asked", "global_batch", "gang",
                           "dynamic"};
    const long long ivals[] = {c->max_restarts, c->nodes,   c->min_nodes,    c->timeout_ms,
                               c->attempt,      c->running, c->unusable,     c->waited_ms,
                               c->grows,        c->grow,    c->global_batch, c->gang,
                               c->dynamic};
    for (size_t i = 0; i < sizeof ikeys / sizeof ikeys[0]; i++)
        tsp__ctl_key_int(w, ikeys[i], ivals[i]);
    tsp_json_key(w, "remote");
    (void)tsp_json_value(w, c->remote ? "true" : "false", 4 + !c->remote);
    tsp__ctl_key_str(w, "reason", c->reason);
    tsp__ctl_key_str(w, "last", c->last);
    tsp__ctl_key_str(w, "exclude_id", c->exclude_id);
    tsp__ctl_key_int(w, "exclude_node", c->exclude_node);
    tsp_json_key(w, "report");
    if (!c->report || tsp_json_value(w, c->report, strlen(c->report)) != 0)
        tsp_json_null(w);
    tsp_json_key(w, "causes");
    write_causes(w, c);
    tsp_json_key(w, "attempts");
    tsp__runrec_write(w, &c->recs);
    tsp_json_end(w);
}

/* The next attempt on nodes, after waiting waited_ms: a warning, then its submission. */
void tsp__ctl_restart(tsp_json_writer_t *w, tsp__ctl_t *c, int nodes)
{
    char seen[128], fewer[160] = "", text[TSP__CAUSE_MAX + 512];
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
    tsp__ctl_text(w, "warn", "text", text);
    c->attempt++;
    c->grow = 0;
    c->running = nodes;
    c->unusable = 0;
    c->waited_ms = 0;
    c->phase = TSP__CTL_RUNNING;
    tsp__ctl_submit(w, c);
}
