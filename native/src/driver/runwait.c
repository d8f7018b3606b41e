/* runwait.c: the run controller's waits (runwait.h, docs/protocol.md section 11): for a
 * replacement executor after a failed attempt (a count every POLL_MS up to
 * spark.torchspark.job.replacementTimeout), and a shrunk attempt's grow watch (a count every
 * TSP__CTL_WATCH_MS, checkpoint_and_stop once more slots are there). */
#include "runwait.h"

#include <stdio.h>

#define REPLACEMENT_KEY "spark.torchspark.job.replacementTimeout"
#define POLL_MS 100            /* a count while waiting for slots or for the attempt's server */
#define GROW_DEADLINE_MS 60000 /* from the request to checkpoint until the attempt stopped */

/* The wait before the next count for a replacement: POLL_MS, at most what is left of the
 * replacement timeout (counted from the attempt's failure). */
static long long next_poll(const tsp__ctl_t *c)
{
    long long left = c->timeout_ms - c->waited_ms;
    return left < 0 ? 0 : left < POLL_MS ? left : POLL_MS;
}

int tsp__runwait_slots(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w)
{
    long long free_now = -1, waited = 0;
    int rc = tsp__ctl_int(r, "event.free", -1, -1, &free_now);
    if (rc || (rc = tsp__ctl_int(r, "event.waited_ms", 0, 0, &waited)))
        return rc;
    c->waited_ms += waited;
    if (free_now < 0) /* Spark cannot tell: its own barrier slot check decides */
        free_now = (c->phase == TSP__CTL_COUNTING ? c->nodes : c->min_nodes) + c->unusable;
    long long slots = free_now - c->unusable;
    if (c->phase == TSP__CTL_COUNTING) {
        if (slots >= c->nodes)
            tsp__ctl_restart(w, c, c->nodes);
        else if (slots >= c->min_nodes) /* elastic: the survivors go on at once */
            tsp__ctl_restart(w, c, (int)slots);
        else { /* wait for a replacement executor: a count every POLL_MS */
            c->phase = TSP__CTL_WAITING;
            tsp__ctl_count(w, c, c->min_nodes + c->unusable, next_poll(c));
        }
        return 0;
    }
    if (slots >= c->min_nodes) {
        tsp__ctl_restart(w, c, slots < c->nodes ? (int)slots : c->nodes);
        return 0;
    }
    if (c->waited_ms < c->timeout_ms) { /* not yet: count again */
        tsp__ctl_count(w, c, c->min_nodes + c->unusable, next_poll(c));
        return 0;
    }
    char want[64], text[TSP__CAUSE_MAX + 1];
    if (c->min_nodes == c->nodes)
        snprintf(want, sizeof want, "%d", c->nodes);
    else
        snprintf(want, sizeof want, "at least %d (%s)", c->min_nodes, c->g->min_nodes);
    snprintf(text, sizeof text,
             "no restart: %s task slot(s) needed, %lld available after waiting %gs for a "
             "replacement executor (" REPLACEMENT_KEY ")",
             want, slots, (double)c->timeout_ms / 1000.0);
    return (rc = tsp__ctl_add_cause(c, text)) ? rc : tsp__ctl_raise(w, c, "no_slots");
}

static void act_watch(tsp_json_writer_t *w, long long wait_ms)
{
    tsp_json_begin_object(w);
    tsp__ctl_key_str(w, "do", "watch_slots");
    tsp__ctl_key_int(w, "wait_ms", wait_ms);
    tsp_json_end(w);
}

/* A shrunk attempt's slot count (the submit's watch_ms, then each watch_slots): more slots
 * than it runs on ask it to checkpoint and stop, to go on with more nodes (docs/protocol.md
 * section 11, "Growing back"); a count after the request's deadline means it did not stop. */
int tsp__runwait_watch(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w)
{
    long long free_now = -1, waited = 0;
    int pending = 0, rc = tsp__ctl_int(r, "event.free", -1, -1, &free_now);
    if (rc || (rc = tsp__ctl_int(r, "event.waited_ms", 0, 0, &waited)) ||
        (rc = tsp_jreq_bool(r, "event.server_pending", &pending)))
        return rc;
    if (c->grow == 0 && pending && free_now > c->running && c->running < c->nodes) {
        act_watch(w, POLL_MS); /* its agents cannot be asked before its log server is up */
    } else if (c->grow == 1) { /* the deadline passed and the attempt still runs */
        char text[TSP__CAUSE_MAX + 512];
        snprintf(text, sizeof text,
                 "%s: attempt %d was asked to checkpoint and stop so that the run grows back to "
                 "more nodes, but it did not stop within %ds: it goes on with %d of %d nodes "
                 "(the training loop must call torchspark.checkpoint.requested() and save when "
                 "it says so: docs/distributor.md, \"Elastic size\")",
                 c->g->who, c->attempt, GROW_DEADLINE_MS / 1000, c->running, c->nodes);
        tsp__ctl_text(w, "warn", "text", text);
        c->grow = 2;
    } else if (c->grow == 0 && free_now > c->running && c->running < c->nodes) {
        char text[512];
        int to = free_now < c->nodes ? (int)free_now : c->nodes;
        snprintf(text, sizeof text,
                 "%s: %lld slot(s) now, attempt %d runs on %d of %d nodes (%s=%d): asking it to "
                 "checkpoint and stop, to go on with %d nodes",
                 c->g->who, free_now, c->attempt, c->running, c->nodes, c->g->min_nodes,
                 c->min_nodes, to);
        tsp__ctl_text(w, "warn", "text", text);
        tsp_json_begin_object(w);
        tsp__ctl_key_str(w, "do", "checkpoint_and_stop");
        tsp__ctl_key_str(w, "reason", "grow");
        tsp__ctl_key_int(w, "nodes", to);
        tsp__ctl_key_int(w, "deadline_ms", GROW_DEADLINE_MS);
        snprintf(text, sizeof text,
                 "%s: attempt %d could not be asked to checkpoint (its log server is gone): it "
                 "goes on with %d of %d nodes",
                 c->g->who, c->attempt, c->running, c->nodes);
        tsp__ctl_key_str(w, "unreachable", text);
        tsp_json_end(w);
        act_watch(w, GROW_DEADLINE_MS);
        c->grow = 1;
    } else if (c->grow == 0 && free_now >= 0 && c->running < c->nodes) {
        act_watch(w, TSP__CTL_WATCH_MS);
    } /* else: nothing more to watch (Spark cannot tell, or too late once) */
    return 0;
}
