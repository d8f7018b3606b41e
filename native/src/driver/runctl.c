/* runctl.c: the run controller, a pure step function (torchspark/runctl.h, docs/protocol.md
 * section 11): the controller's state + one event a glue observed -> the next state + the
 * actions the glue performs. Restart policy, elastic min_nodes, the replacement wait, attempt
 * numbering, the attempt's environment and the history of causes are decided here only;
 * Spark's failure text is read by the outcome table (outcome.c), never here. This file
 * answers the events; the state and the actions are runstate.c's, the attempt's root cause
 * runcause.c's, the replacement and grow waits runwait.c's, the records runrec.c's. */
#include "torchspark/runctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runwait.h"
#include "util.h"

static int on_start(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w)
{
    long long nodes = 0, limit = 0, least = 0, timeout = 0;
    char *batch = NULL, *launch = NULL;
    int rc = tsp__ctl_read_glue(r, "event.glue", c);
    if (rc || (rc = tsp__ctl_int(r, "event.nodes", 1, -1, &nodes)) ||
        (rc = tsp__ctl_int(r, "event.max_restarts", 0, 0, &limit)) ||
        (rc = tsp__ctl_int(r, "event.min_nodes", 1, 0, &least)) ||
        (rc = tsp__ctl_int(r, "event.replacement_timeout_ms", 0, 30000, &timeout)) ||
        (rc = tsp_jreq_bool(r, "event.remote", &c->remote)) ||
        (rc = tsp__ctl_str(r, "event.batch", &batch)) ||
        (rc = tsp__ctl_str(r, "event.launch", &launch)) ||
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
    c->phase = TSP__CTL_RUNNING;
    tsp__ctl_submit(w, c);
    return 0;
}

static void count_now(tsp_json_writer_t *w, tsp__ctl_t *c)
{
    c->phase = TSP__CTL_COUNTING;
    tsp__ctl_count(w, c, c->nodes + c->unusable, 0);
}

static int on_failed(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w)
{
    char cause[TSP__CAUSE_MAX + 1], *executor = NULL, *reason = NULL;
    long long node = -1;
    free(c->last); /* the previous attempt's */
    c->last = NULL;
    int lost = 0, rc = tsp__ctl_str(r, "event.message", &c->last);
    if (!rc &&
        !(rc = tsp__runcause_of(r, c->g->who, c->running, c->last, cause, &reason, &lost, &node))) {
        free(c->reason); /* the previous failure's */
        c->reason = reason;
    }
    if (rc || (rc = tsp__ctl_add_cause(c, cause)) || (rc = tsp__runrec_end(&c->recs, r, cause)) ||
        (rc = tsp__ctl_str(r, "event.executor", &executor)) ||
        (rc = tsp__ctl_report_of(r, "event.report", c)))
        goto out;
    if (c->reason && strcmp(c->reason, "grow") == 0)
        c->grows++; /* not a restart: it does not count against max_restarts */
    if (c->attempt - c->grows >= c->max_restarts) {
        rc = tsp__ctl_raise(w, c, c->max_restarts == 0 ? "failed" : "exhausted");
    } else if (c->remote) { /* the client cannot count slots: Spark (or the gang) waits */
        tsp__ctl_restart(w, c, c->nodes - lost > c->min_nodes ? c->nodes - lost : c->min_nodes);
    } else if (c->reason &&
               (strcmp(c->reason, "silent") == 0 || strcmp(c->reason, "preempted") == 0)) {
        /* Spark offers a silent node's executor until its heartbeat timeout, and a preempted
         * one until its JVM has exited: its slots are not usable, unless the glue can take it
         * out of scheduling by its id. */
        c->unusable = 1;
        if (executor) {
            c->phase = TSP__CTL_EXCLUDING;
            tsp_json_begin_object(w);
            tsp__ctl_key_str(w, "do", "exclude_executor");
            tsp__ctl_key_str(w, "id", executor);
            tsp__ctl_key_int(w, "node", node);
            tsp_json_end(w);
            c->exclude_id = executor; /* the excluded event answers for it */
            c->exclude_node = node;
            executor = NULL;
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

static int on_excluded(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w)
{
    int ok = 0, rc = tsp_jreq_bool(r, "event.ok", &ok);
    char *id = c->exclude_id; /* what exclude_executor asked for: the event says only ok */
    long long node = c->exclude_node;
    c->exclude_id = NULL;
    c->exclude_node = -1;
    if (rc || (ok && (rc = tsp__runrec_excluded(&c->recs, id))))
        goto out;
    if (ok) { /* its slots no longer count, and a replacement executor may come for it */
        char text[512];
        c->unusable = 0;
        snprintf(text, sizeof text,
                 "%s: executor %s (node %lld, %s) is excluded from the next attempt: "
                 "SparkContext.killAndReplaceExecutor asked the cluster manager to replace it",
                 c->g->who, id ? id : "?", node, c->reason ? c->reason : "silent");
        tsp__ctl_text(w, "warn", "text", text);
    }
    count_now(w, c);
out:
    free(id);
    return rc;
}

static int on_succeeded(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w)
{
    c->phase = TSP__CTL_DONE;
    tsp__ctl_text(w, "return", NULL, NULL);
    return tsp__runrec_end(&c->recs, r, NULL);
}

/* The events and the phase each is expected in (-1: none, the run's first event). */
static const struct {
    const char *name;
    int phase, alt;
    int (*fn)(const tsp_jreq_t *, tsp__ctl_t *, tsp_json_writer_t *);
} events[] = {
    {"start", -1, -1, on_start},
    {"attempt_failed", TSP__CTL_RUNNING, TSP__CTL_RUNNING, on_failed},
    {"attempt_succeeded", TSP__CTL_RUNNING, TSP__CTL_RUNNING, on_succeeded},
    {"excluded", TSP__CTL_EXCLUDING, TSP__CTL_EXCLUDING, on_excluded},
    {"slots", TSP__CTL_COUNTING, TSP__CTL_WAITING, tsp__runwait_slots},
    {"slots", TSP__CTL_RUNNING, TSP__CTL_RUNNING, tsp__runwait_watch},
};

static int find_event(const tsp_jreq_t *r, const tsp__ctl_t *c, int has_state, size_t *which)
{
    char *name = NULL;
    int rc = tsp__ctl_str(r, "event.event", &name);
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
                      has_state && c->phase >= 0 && c->phase <= TSP__CTL_DONE
                          ? tsp__ctl_phases[c->phase]
                          : "it has no state");
    free(name);
    return rc;
}

static int step(const tsp_jreq_t *r, tsp__ctl_t *c, char *out, size_t outlen, size_t *needed)
{
    char *state = NULL;
    int rc =
        tsp_jreq_get(r, "state", TSP_JSON_OBJECT, "an object (the last reply's) or null", &state);
    int has_state = state != NULL;
    free(state);
    rc = rc < 0 ? rc : 0;
    if (!rc && has_state)
        rc = tsp__ctl_read_state(r, c);
    size_t which = 0;
    if (rc || (rc = find_event(r, c, has_state, &which)) ||
        (rc = tsp_jreq_get(r, "event.at", TSP_JSON_NUMBER, "a number (the glue's clock) or null",
                           &c->at)) < 0)
        return rc;
    tsp_json_reply_t rp;
    if ((rc = tsp_json_reply_open(&rp)) != 0)
        return rc;
    tsp_json_key(&rp.w, "actions");
    tsp_json_begin_array(&rp.w);
    rc = events[which].fn(r, c, &rp.w);
    if (!rc && c->submitted && c->max_restarts > 0) /* a run with restarts has records */
        rc = tsp__runrec_begin(&c->recs, c->attempt, c->running, c->at);
    tsp_json_end(&rp.w);
    if (!rc) {
        tsp_json_key(&rp.w, "state");
        tsp__ctl_write_state(&rp.w, c);
    }
    return tsp_json_reply_close(&rp, rc, out, outlen, needed);
}

int tsp_runctl_step(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                    char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    tsp_jreq_t r = {request, len, "the run controller", err, errlen};
    if (tsp_json_check_object(request, len) != 0)
        return tsp__err(err, errlen, -EINVAL, "the run controller's request is not a JSON object");
    tsp__ctl_t c = {.exclude_node = -1};
    int rc = step(&r, &c, out, outlen, needed);
    tsp__ctl_free(&c);
    return rc;
}
