/* runstate.h (internal): the run controller's state (docs/protocol.md section 11, "The
 * state"), read from the request and written with the reply, and the actions it writes
 * (runstate.c); runctl.c answers the events, runwait.c the slots counted.
 */
#ifndef TSP_RUNSTATE_H
#define TSP_RUNSTATE_H

#include <stddef.h>

#include "jreq.h"
#include "json.h"
#include "runcause.h"
#include "runrec.h"

#define TSP__CTL_WATCH_MS 3000 /* a shrunk attempt's slot count, every so often */

/* What differs between the glues' words: the runner's name and its settings' spelling. */
typedef struct {
    const char *glue, *who, *restarts, *min_nodes;
} tsp__glue_t;

/* Where the run is: which events it waits for (docs/protocol.md section 11, "Phases"). */
enum { TSP__CTL_RUNNING, TSP__CTL_EXCLUDING, TSP__CTL_COUNTING, TSP__CTL_WAITING, TSP__CTL_DONE };
extern const char *const tsp__ctl_phases[]; /* each phase's name in the state */

typedef struct {
    const tsp__glue_t *g;
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
    char *exclude_id;   /* the executor exclude_executor asked for (the next event's), or NULL */
    long long exclude_node; /* and its node (-1: not known) */
    char *at;               /* the event's "at": the glue's clock, as it is, or NULL */
    int submitted;          /* this step submits an attempt: its record begins */
} tsp__ctl_t;

void tsp__ctl_free(tsp__ctl_t *c);
int tsp__ctl_add_cause(tsp__ctl_t *c, const char *text);

/* The attempt's report at path (an object, docs/protocol.md section 8) into c->report, the
 * previous one's replaced; null or absent: none. */
int tsp__ctl_report_of(const tsp_jreq_t *r, const char *path, tsp__ctl_t *c);

/* The glue at path ("python" or "java") into c->g: 0 or -EINVAL naming path. */
int tsp__ctl_read_glue(const tsp_jreq_t *r, const char *path, tsp__ctl_t *c);

/* The state a previous step wrote (the glue hands it back as it got it): 0, -EINVAL (with
 * the sentence: not one the controller wrote), -ENOMEM. */
int tsp__ctl_read_state(const tsp_jreq_t *r, tsp__ctl_t *c);
void tsp__ctl_write_state(tsp_json_writer_t *w, const tsp__ctl_t *c);

void tsp__ctl_key_int(tsp_json_writer_t *w, const char *k, long long v);
void tsp__ctl_key_str(tsp_json_writer_t *w, const char *k, const char *v);

/* The actions: submit the attempt c->attempt on c->running nodes; {"do": what, key: text}
 * (key NULL: none); one count of the slots after wait_ms, need what the controller waits
 * for; raise (kind "failed", "exhausted" or "no_slots": 0 or -ENOMEM); the next attempt on
 * nodes (a warning, then its submit). */
void tsp__ctl_submit(tsp_json_writer_t *w, tsp__ctl_t *c);
void tsp__ctl_text(tsp_json_writer_t *w, const char *what, const char *key, const char *text);
void tsp__ctl_count(tsp_json_writer_t *w, const tsp__ctl_t *c, int need, long long wait_ms);
int tsp__ctl_raise(tsp_json_writer_t *w, tsp__ctl_t *c, const char *kind);
void tsp__ctl_restart(tsp_json_writer_t *w, tsp__ctl_t *c, int nodes);

#endif
