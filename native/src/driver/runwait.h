/* runwait.h (internal): the run controller's answers to the slots counted (docs/protocol.md
 * section 11, "Rules" and "Growing back"), in runwait.c: the replacement wait after a failed
 * attempt, and a shrunk attempt's grow watch while it runs.
 */
#ifndef TSP_RUNWAIT_H
#define TSP_RUNWAIT_H

#include "runstate.h"

/* The "slots" event after count_slots (phase counting or waiting): the next attempt, a
 * count again, or the raise of no_slots. 0, -EINVAL naming the event's key, -ENOMEM. */
int tsp__runwait_slots(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w);

/* The "slots" event of a running attempt's grow watch: watch_slots again, checkpoint_and_stop,
 * or the warning that it did not stop. 0, -EINVAL naming the event's key. */
int tsp__runwait_watch(const tsp_jreq_t *r, tsp__ctl_t *c, tsp_json_writer_t *w);

#endif
