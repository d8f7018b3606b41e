/* rdvcall.c: the glues' one call on a rendezvous (docs/protocol.md 2.3): a JSON request naming
 * an op -> its reply, for the server's queries and the gang launch's driver side, so that each
 * glue binds one function for them (the handle's life keeps its own: tsp_rdv_start,
 * tsp_rdv_free). */
#include "torchspark/gang.h"
#include "torchspark/rendezvous.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "jreq.h"
#include "json.h"
#include "util.h"

#define WHO "tsp_rdv_call's request"

/* Arms the gang: nnodes that must all join within timeout_ms. */
static int op_gang(tsp_rdv_t *r, const tsp_jreq_t *q)
{
    int nnodes = 0, timeout_ms = 0;
    int rc = tsp_jreq_int(q, "nnodes", 0, &nnodes);
    if (rc == 0)
        rc = tsp_jreq_int(q, "timeout_ms", 0, &timeout_ms);
    if (rc == 0 && (rc = tsp_rdv_gang(r, nnodes, timeout_ms)) != 0)
        tsp__err(q->err, q->errlen, rc,
                 "torchspark: cannot arm the gang of %d tasks within %d ms: %s", nnodes, timeout_ms,
                 rc == -EALREADY ? "this run's gang is armed already"
                                 : "a gang has 1..65536 tasks and a timeout > 0");
    return rc;
}

/* The failed gang's document (tsp_rdv_gang_report) with what the glue saw of Spark. */
static int op_gang_failure(tsp_rdv_t *r, const tsp_jreq_t *q, tsp_json_writer_t *w)
{
    int executors = -1, cores = -1;
    char *max = NULL, doc[8192];
    int rc = tsp_jreq_int(q, "executors", 1, &executors);
    if (rc == 0)
        rc = tsp_jreq_int(q, "cores", 1, &cores);
    if (rc == 0)
        rc = tsp_jreq_str(q, "max_executors", 0, &max);
    int n = rc == 0 ? tsp_rdv_gang_report(r, executors, cores, max, doc, sizeof doc) : rc;
    free(max);
    if (rc == 0 && n < 0)
        return tsp__err(q->err, q->errlen, n, "torchspark: the rendezvous' gang has not failed");
    if (rc == 0) {
        tsp_json_key(w, "report");
        tsp_json_raw(w, doc, (size_t)n);
    }
    return rc;
}

static void member(tsp_json_writer_t *w, const char *key, long long v)
{
    tsp_json_key(w, key);
    tsp_json_int(w, v);
}

/* Where the tasks are told the driver listens: the advertised host ("advertise"; null or "":
 * the one it listens on) and its port. */
static int op_endpoint(tsp_rdv_t *r, const tsp_jreq_t *q, tsp_json_writer_t *w)
{
    char *host = NULL;
    int rc = tsp_jreq_str(q, "advertise", 0, &host);
    if (rc == 0) {
        tsp_json_key(w, "host");
        tsp_json_str(w, host && *host ? host : tsp_rdv_host(r));
        member(w, "port", tsp_rdv_port(r));
    }
    free(host);
    return rc;
}

static int op_rdv(void *ctx, const char *op, const tsp_jreq_t *q, tsp_json_writer_t *w)
{
    tsp_rdv_t *r = ctx;
    int a = 0, b = 0;
    if (strcmp(op, "gang") == 0)
        return op_gang(r, q);
    if (strcmp(op, "gang_failure") == 0)
        return op_gang_failure(r, q, w);
    if (strcmp(op, "endpoint") == 0)
        return op_endpoint(r, q, w);
    if (strcmp(op, "counts") == 0) {
        tsp_rdv_counts(r, &a, &b);
        member(w, "puts", a);
        member(w, "gets", b);
    } else if (strcmp(op, "gang_state") == 0) {
        if ((a = tsp_rdv_gang_state(r, &b)) < 0)
            return tsp__err(q->err, q->errlen, a, "torchspark: the rendezvous has no gang armed");
        member(w, "state", a);
        member(w, "joined", b);
    } else {
        return tsp__err(q->err, q->errlen, -EINVAL,
                        "tsp_rdv_call: unknown op \"%s\" (endpoint, counts, gang, gang_state or "
                        "gang_failure)",
                        op);
    }
    return 0;
}

int tsp_rdv_call(tsp_rdv_t *r, const char *request, size_t len, char *out, size_t outlen,
                 size_t *needed, char *err, size_t errlen)
{
    if (!r)
        return tsp__err(err, errlen, -EINVAL, "torchspark: the rendezvous is closed");
    return tsp_jreq_serve("tsp_rdv_call", WHO, request, len, op_rdv, r, out, outlen, needed, err,
                          errlen);
}
