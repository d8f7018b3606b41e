/* reason.c: the failure reasons and their advice, one row each (reason.h). */
#include "reason.h"

#include <string.h>

/* The order is the documentation's (docs/protocol.md section 8). */
static const tsp_reason_t reasons[] = {
    {"exit",
     "correct the error above in the training code or its inputs and run again; every rank's "
     "full output went to {went}.",
     1, 1},
    {"signal",
     "correct the error above in the training code or its inputs and run again; every rank's "
     "full output went to {went}.",
     1, 1},
    {"nccl_check",
     "the NCCL check failed before training started, so the training code did not run: fix "
     "the NVIDIA driver, NCCL or the network of the executor on host {host} as the error above "
     "says, or set spark.torchspark.ncclCheck=false to train without the check; every rank's "
     "full output went to {went}.",
     0, 0},
    {"setup",
     "correct the setting or the executor's environment that the error above names and run "
     "again; every rank's full output went to {went}.",
     0, 0},
    /* A node lost (the log server's document): its connection ended (EOF, reset), or it
     * went silent (no PING for 5 s, or TCP gave up: a frozen host, a cut network). */
    {"eof", "check host {host} (its executor's log, memory, network) and run again.", 1, 1},
    {"silent", "check host {host} (its executor's log, memory, network) and run again.", 1, 1},
    /* Known only from Spark (outcome.c's last resort): */
    {"executor_lost",
     "check that executor's log and its host (memory, the cluster manager's events) and run "
     "again; Spark's error is the exception's cause.",
     1, 1},
    {"decommission",
     "nothing in the code: the cluster took the executor away (graceful decommission); run "
     "again, or give the run max_restarts so that it resumes from its last checkpoint by itself "
     "(docs/distributor.md, \"Decommission\").",
     1, 1},
    /* A node stopped by TorchSparkPlugin after it checkpointed on request (the agent's own
     * record: torchspark_run.c, docs/protocol.md section 8): the executor is going away. */
    {"preempted",
     "nothing in the code: the cluster is taking the executor away (SIGTERM: a spot "
     "preemption or a pod deletion) and the node checkpointed first; give the run max_restarts "
     "so that it resumes from that checkpoint by itself (docs/distributor.md, \"Preemption\").",
     0, 1},
    /* Every node stopped after its checkpoint on the driver's request (the agent's CHECKPOINT,
     * docs/protocol.md 1.13): the run goes on with more nodes. */
    {"grow",
     "nothing: the run stopped this attempt after its checkpoint on request to go on with more "
     "nodes (docs/distributor.md, \"Elastic size\"); this is not an error unless the run "
     "could not go on.",
     0, 1},
    {"cancelled",
     "nothing, when the job was cancelled on purpose; else find who cancelled it (the Spark "
     "UI's jobs page) and run again.",
     0, 0},
    {"spark",
     "read Spark's error (the exception's cause) and the executors' logs: the barrier stage "
     "failed before any training process reported an error.",
     0, 1},
};

const tsp_reason_t *tsp__reason_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof reasons / sizeof reasons[0]; i++)
        if (strcmp(reasons[i].name, name) == 0)
            return &reasons[i];
    return NULL;
}

void tsp__reason_advise(FILE *out, const tsp_reason_t *r, const char *host, const char *went)
{
    fputs("To fix it: ", out);
    for (const char *p = r->advice; *p;) {
        if (strncmp(p, "{host}", 6) == 0) {
            fputs(host ? host : "?", out);
            p += 6;
        } else if (strncmp(p, "{went}", 6) == 0) {
            fputs(went ? went : "the driver's stderr", out);
            p += 6;
        } else {
            fputc(*p++, out);
        }
    }
}
