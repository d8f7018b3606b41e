/* rdvtask.c: a task's calls to the driver's rendezvous as JSON requests (docs/protocol.md
 * 2.3), so that both glues bind one request for them: rank 0's PUT or another rank's GET of
 * the election record (2.1), a gang task's JOIN (2.2), and for the golden cases a raw request
 * line and a record's MAC. Whole (tsp_rdv_task_call: the PySpark task) or in slices
 * (tsp_rdv_task_start, then waits: the JVM task checks between them whether Spark killed it).
 * The sentences are rdvclient.c's and gangclient.c's, raised by each glue as they are. */
#include "torchspark/gang.h"
#include "torchspark/rendezvous.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jreq.h"
#include "json.h"
#include "util.h"

#define WHO "the rendezvous request"

struct tsp_rdv_task {
    tsp_rdv_call_t *call;
    int join;      /* a gang JOIN (else rank 0's PUT or a GET) */
    int node_rank; /* the task's node */
    char *put;     /* rank 0's record, which it PUTs (NULL: a GET) */
    char *reply;   /* the reply document once it came (a wait after it copies it again) */
    size_t reply_len;
};

/* The reply's members: {"nnodes"} of a JOIN; {"record"}, rank 0's, of an exchange (what a
 * GET got, its MAC checked, or what rank 0 PUT). */
static void write_reply(const tsp_rdv_task_t *t, const char *line, int nnodes, tsp_json_writer_t *w)
{
    tsp_json_key(w, t->join ? "nnodes" : "record");
    if (t->join)
        tsp_json_int(w, nnodes);
    else
        tsp_json_str(w, t->put ? t->put : line);
}

/* Rank 0's exchange PUTs "record" (absent: "", which is refused), another rank's GETs it. */
static int open_exchange(tsp_rdv_task_t *t, const tsp_jreq_t *q, const char *host, int port,
                         const char *secret)
{
    char *record = NULL;
    int rc = tsp_jreq_int(q, "node_rank", 0, &t->node_rank);
    if (rc == 0)
        rc = tsp_jreq_str(q, "record", 0, &record);
    const char *put = t->node_rank == 0 ? (record ? record : "") : NULL;
    if (rc == 0)
        rc = tsp_rdv_call_start(host, port, secret, put, &t->call, q->err, q->errlen);
    if (rc == 0 && put) { /* kept for the reply */
        t->put = record;
        record = NULL;
    }
    free(record);
    return rc;
}

/* A JOIN's members: node_rank, attempt, task_host, timeout_ms; sent on (host, port, secret). */
static int open_join(tsp_rdv_task_t *t, const tsp_jreq_t *q, const char *host, int port,
                     const char *secret)
{
    int try_no = 0, timeout_ms = 0;
    char *task_host = NULL;
    int rc = tsp_jreq_int(q, "node_rank", 0, &t->node_rank);
    if (rc == 0)
        rc = tsp_jreq_int(q, "attempt", 0, &try_no);
    if (rc == 0)
        rc = tsp_jreq_int(q, "timeout_ms", 0, &timeout_ms);
    if (rc == 0)
        rc = tsp_jreq_str(q, "task_host", 0, &task_host);
    if (rc == 0)
        rc = tsp_gang_call_start(host, port, secret, t->node_rank, try_no, task_host, timeout_ms,
                                 &t->call, q->err, q->errlen);
    free(task_host);
    return rc;
}

/* Starts the request's call (op "exchange" or "join") into ctx, a tsp_rdv_task_t: connected,
 * TLS complete, its line sent. */
static int op_open(void *ctx, const char *op, const tsp_jreq_t *q, tsp_json_writer_t *w)
{
    (void)w;
    tsp_rdv_task_t *t = ctx;
    char *host = NULL, *secret = NULL;
    int port = 0, rc = 0;
    t->join = strcmp(op, "join") == 0;
    if (!t->join && strcmp(op, "exchange") != 0)
        return tsp__err(q->err, q->errlen, -EINVAL,
                        "tsp_rdv_task_call: unknown op \"%s\" (exchange, join, request or "
                        "record_mac)",
                        op);
    if ((rc = tsp_jreq_str(q, "host", 1, &host)) == 0 &&
        (rc = tsp_jreq_int(q, "port", 0, &port)) == 0 &&
        (rc = tsp_jreq_str(q, "secret_hex", 1, &secret)) == 0) {
        rc =
            t->join ? open_join(t, q, host, port, secret) : open_exchange(t, q, host, port, secret);
    }
    free(host);
    free(secret);
    return rc;
}

int tsp_rdv_task_start(const char *request, size_t len, tsp_rdv_task_t **out, char *err,
                       size_t errlen)
{
    char none[4]; /* the reply of op_open, written by the shared entry: {} */
    tsp_rdv_task_t *t = calloc(1, sizeof *t);
    if (!out || !t) {
        free(t);
        return tsp__err(err, errlen, out ? -ENOMEM : -EINVAL, "tsp_rdv_task_start: %s",
                        out ? "out of memory" : "no place for the call");
    }
    int rc = tsp_jreq_serve("tsp_rdv_task_start", WHO, request, len, op_open, t, none, sizeof none,
                            NULL, err, errlen);
    *out = rc == 0 ? t : NULL;
    if (rc)
        tsp_rdv_task_free(t);
    return rc;
}

/* The call's reply waited for up to timeout_ms, its members written into w. */
static int task_wait(tsp_rdv_task_t *t, int timeout_ms, tsp_json_writer_t *w, char *err,
                     size_t errlen)
{
    char line[TSP_RDV_LINE_MAX + 2] = "";
    int nnodes = 0;
    int rc = t->join ? tsp_gang_call_wait(t->call, t->node_rank, timeout_ms, &nnodes, err, errlen)
                     : tsp_rdv_call_wait(t->call, timeout_ms, line, sizeof line, err, errlen);
    if (rc == 0)
        write_reply(t, line, nnodes, w);
    return rc;
}

int tsp_rdv_task_wait(tsp_rdv_task_t *t, int timeout_ms, char *out, size_t outlen, size_t *needed,
                      char *err, size_t errlen)
{
    if (!t || !t->call)
        return tsp__err(err, errlen, -EINVAL, "tsp_rdv_task_wait: no call");
    if (!t->reply) {
        FILE *mf = open_memstream(&t->reply, &t->reply_len);
        if (!mf)
            return tsp__err(err, errlen, -ENOMEM, "tsp_rdv_task_wait: out of memory");
        tsp_json_writer_t w;
        tsp_json_writer_init(&w, mf);
        tsp_json_begin_object(&w);
        int rc = task_wait(t, timeout_ms, &w, err, errlen);
        tsp_json_end(&w);
        if (fclose(mf) != 0 && rc == 0)
            rc = tsp__err(err, errlen, -ENOMEM, "tsp_rdv_task_wait: out of memory");
        if (rc) { /* pending, or failed: nothing kept */
            free(t->reply);
            t->reply = NULL;
            return rc;
        }
    }
    return tsp__reply_copy(t->reply, t->reply_len, out, outlen, needed);
}

/* What t holds, freed (t itself is the caller's). */
static void task_clear(tsp_rdv_task_t *t)
{
    tsp_rdv_call_free(t->call);
    free(t->put);
    free(t->reply);
}

void tsp_rdv_task_free(tsp_rdv_task_t *t)
{
    if (!t)
        return;
    task_clear(t);
    free(t);
}

/* The golden cases' two: a raw request line (its reply line, ERR included), a record's MAC. */
static int op_wire(const char *op, const tsp_jreq_t *q, tsp_json_writer_t *w)
{
    char *host = NULL, *secret = NULL, *text = NULL, reply[TSP_RDV_LINE_MAX + 2] = "";
    int port = 0, mac = strcmp(op, "record_mac") == 0;
    int rc = tsp_jreq_str(q, "secret_hex", 1, &secret);
    if (rc == 0)
        rc = tsp_jreq_str(q, mac ? "record" : "line", 1, &text);
    if (rc == 0 && !mac && (rc = tsp_jreq_str(q, "host", 1, &host)) == 0 &&
        (rc = tsp_jreq_int(q, "port", 0, &port)) == 0)
        rc = tsp_rdv_request(host, port, secret, text, reply, sizeof reply, q->err, q->errlen);
    if (rc == 0 && mac && (rc = tsp_rdv_record_mac(secret, text, reply, sizeof reply)) != 0)
        tsp__err(q->err, q->errlen, rc, "torchspark: no MAC of the record: %s", tsp_strerror(rc));
    if (rc == 0) {
        tsp_json_key(w, mac ? "mac" : "reply");
        tsp_json_str(w, reply);
    }
    free(host);
    free(secret);
    free(text);
    return rc;
}

/* One request whole: the golden cases' two, or a call started, waited for until its own
 * deadline and freed. */
static int op_task(void *ctx, const char *op, const tsp_jreq_t *q, tsp_json_writer_t *w)
{
    (void)ctx;
    if (strcmp(op, "request") == 0 || strcmp(op, "record_mac") == 0)
        return op_wire(op, q, w);
    tsp_rdv_task_t t = {0};
    int rc = op_open(&t, op, q, w);
    if (rc == 0)
        rc = task_wait(&t, -1, w, q->err, q->errlen);
    task_clear(&t);
    return rc;
}

int tsp_rdv_task_call(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                      char *err, size_t errlen)
{
    return tsp_jreq_serve("tsp_rdv_task_call", WHO, request, len, op_task, NULL, out, outlen,
                          needed, err, errlen);
}
