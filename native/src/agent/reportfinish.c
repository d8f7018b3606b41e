/* reportfinish.c: the glues' finish of the failure document (torchspark/failure.h,
 * docs/protocol.md section 8): a request's document (the agent's, or the log server's for a
 * lost node) finished with the glue's facts, and the exception's message and report in the
 * words both glues show, written once here. The document itself is report.c's. */
#include "jreq.h"
#include "json.h"
#include "lines.h"
#include "reason.h"
#include "report.h"
#include "torchspark/failure.h"
#include "userreport.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the glues' finish (torchspark/failure.h, docs/protocol.md §8) ---- */

/* A whole number, negative ones too (a Popen returncode -9, a node_rank of -1). */
static int parse_signed(const char *s, int *v)
{
    if (!s)
        return -EINVAL;
    int neg = *s == '-';
    int rc = tsp__parse_int(s + neg, v);
    if (!rc && neg)
        *v = -*v;
    return rc;
}

/* A whole number of the document at path, dflt when absent, null or not a whole number. */
static int doc_int(const char *doc, size_t len, const char *path, int dflt)
{
    char *s = NULL;
    int type = 0, v = dflt, got = 0;
    if (tsp_json_get(doc, len, path, &s, &type) == 0 && type == TSP_JSON_NUMBER &&
        parse_signed(s, &got) == 0)
        v = got;
    free(s);
    return v;
}

/* The failure a document describes (the agent's, or one finished before). */
static void from_document(tsp_failure_t *f, const char *doc, size_t len, int *node_rank,
                          char **host)
{
    f->rank = doc_int(doc, len, "torchspark.rank", -1);
    f->local_rank = doc_int(doc, len, "torchspark.local_rank", -1);
    *node_rank = doc_int(doc, len, "torchspark.node_rank", *node_rank);
    f->status = doc_int(doc, len, "torchspark.exitcode", f->status);
    f->signal = doc_int(doc, len, "torchspark.signal", f->signal);
    f->exitcode = f->signal ? -f->signal : f->status;
    f->pid = (pid_t)doc_int(doc, len, "torchspark.pid", 0);
    f->agent_status = doc_int(doc, len, "torchspark.agent_exitcode", f->agent_status);
    char *t = NULL;
    int type = 0;
    if (tsp_json_get(doc, len, "torchspark.time", &t, &type) == 0 && type == TSP_JSON_NUMBER)
        f->time = strtod(t, NULL);
    free(t);
    char *ef = tsp__report_json_string_at(doc, len, "torchspark.error_file");
    if (ef) {
        f->has_error_file = 1;
        snprintf(f->error_file, sizeof f->error_file, "%s", ef);
        free(ef);
    }
    f->message = tsp__report_json_string_at(doc, len, "message.message");
    if (!f->message)
        f->message = tsp__report_json_string_at(doc, len, "message"); /* the old flat layout */
    f->traceback = tsp__report_json_string_at(doc, len, "message.extraInfo.py_callstack");
    if (f->traceback && !*f->traceback) {
        free(f->traceback);
        f->traceback = NULL;
    }
    char *h = tsp__report_json_string_at(doc, len, "torchspark.host");
    if (h && *h) {
        free(*host);
        *host = h;
    } else {
        free(h);
    }
    f->tail = tsp__report_json_string_at(doc, len, "torchspark.tail");
    char *reason = tsp__report_json_string_at(doc, len, "torchspark.reason");
    const tsp_reason_t *r = tsp__reason_find(reason);
    f->reason = r ? r->name : NULL;
    free(reason);
    char *step = NULL;
    int kind = 0;
    if (tsp_json_get(doc, len, "torchspark.checkpoint_step", &step, &kind) == 0 &&
        kind == TSP_JSON_NUMBER && tsp__parse_int(step, &f->checkpoint_step) == 0 &&
        f->checkpoint_step >= 0)
        f->has_checkpoint = 1;
    free(step);
}

/* The lines of rank among tail (by their "[rank R] " prefix), else all of them. */
static char *rank_lines(const char *tail, int rank)
{
    char prefix[64];
    if (rank < 0)
        return strdup(tail);
    size_t plen = tsp_lines_prefix(prefix, sizeof prefix, NULL, NULL, rank, TSP_STREAM_STDOUT);
    char *out = NULL;
    size_t olen = 0;
    FILE *m = open_memstream(&out, &olen);
    if (!m)
        return NULL;
    int n = 0;
    for (const char *p = tail; *p;) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        if (l >= plen && strncmp(p, prefix, plen) == 0) {
            fprintf(m, "%s%.*s", n++ ? "\n" : "", (int)l, p);
        }
        p += l + (nl != NULL);
    }
    if (fclose(m) != 0) {
        free(out);
        return NULL;
    }
    if (n)
        return out;
    free(out);
    return strdup(tail);
}

/* Writes text's lines, each behind two spaces; at most the last `last` lines (0: all).
 * Python's splitlines: "\n", "\r\n" and "\r" end a line. Returns the lines written. */
static int indented(FILE *m, const char *text, int last)
{
    size_t len = strlen(text);
    int total = 0;
    for (size_t i = 0; i < len; i++)
        total += text[i] == '\n' || (text[i] == '\r' && text[i + 1] != '\n');
    if (len && text[len - 1] != '\n' && text[len - 1] != '\r')
        total++;
    int skip = last && total > last ? total - last : 0, n = 0;
    for (const char *p = text; *p;) {
        size_t l = strcspn(p, "\r\n");
        if (n++ >= skip)
            fprintf(m, "\n  %.*s", (int)l, p);
        p += l;
        p += *p == '\r' && p[1] == '\n' ? 2 : *p ? 1 : 0;
    }
    return total - skip;
}

typedef struct {
    char *product, *mode, *went, *shown_tail, *detail;
} message_opts_t;

/* who's last lines (the driver's shown ones, else the document's), at most
 * TSP_REPORT_TAIL_IN_MESSAGE, or that who printed nothing. */
static void write_tail(FILE *m, const char *who, const char *shown, const char *own)
{
    const char *tail = shown && *shown ? shown : own ? own : "";
    if (!*tail) {
        fprintf(m, "\n%s printed nothing.", who);
        return;
    }
    char *lines = NULL;
    size_t llen = 0;
    FILE *t = open_memstream(&lines, &llen);
    int n = t ? indented(t, tail, TSP_REPORT_TAIL_IN_MESSAGE) : 0;
    if (t && fclose(t) == 0)
        fprintf(m, "\nLast %d lines of %s's output:%s", n, who, lines);
    free(lines);
}

/* The exception's message (docs/protocol.md §8): the summary, the error, the rank's last
 * lines and what to do, in the words both glues show. */
static void write_message(FILE *m, const tsp_failure_t *f, int node_rank, const char *host,
                          const char *summary, const message_opts_t *o)
{
    fprintf(m, "%s (%s) failed: %s.", o->product, o->mode ? o->mode : "distributed", summary);
    const char *text = f->traceback ? f->traceback : f->message;
    if (text) {
        size_t l = strlen(text);
        while (l > 0 && strchr(" \t\n\r\v\f", text[l - 1]))
            l--;
        char *trimmed = tsp__report_copy_cut(text, l, l);
        if (trimmed && *trimmed) {
            fputs("\nError:", m);
            indented(m, trimmed, 0);
        }
        free(trimmed);
    }
    char who[48];
    if (f->rank >= 0)
        snprintf(who, sizeof who, "rank %d", f->rank);
    else
        snprintf(who, sizeof who, "node %d", node_rank);
    const tsp_reason_t *r = tsp__reason_find(tsp__report_reason(f));
    const char *shown = o->shown_tail && *o->shown_tail ? o->shown_tail : f->tail;
    if (r->shows_tail || (shown && *shown)) /* "printed nothing" only where it tells something */
        write_tail(m, who, o->shown_tail, f->tail);
    fputc('\n', m);
    tsp__reason_advise(m, r, host, o->went);
    if (o->detail) /* the driver's job-wide view (e.g. the nodes whose NCCL check never started) */
        fprintf(m, "\n%s.", o->detail);
}

typedef struct {
    char *document, *host, *tail, *lines;
    int status, node_rank, nproc;
    message_opts_t msg;
} request_fields_t;

static void request_free(request_fields_t *q)
{
    char **s[] = {&q->document, &q->host,           &q->tail,       &q->msg.product, &q->msg.mode,
                  &q->msg.went, &q->msg.shown_tail, &q->msg.detail, &q->lines};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        free(*s[i]);
        *s[i] = NULL;
    }
}

static int read_request(const tsp_jreq_t *r, request_fields_t *q)
{
    int rc;
    q->status = 1;
    q->node_rank = -1;
    const struct {
        const char *key;
        char **out;
    } strs[] = {{"host", &q->host},
                {"tail", &q->tail},
                {"product", &q->msg.product},
                {"mode", &q->msg.mode},
                {"output_went", &q->msg.went},
                {"shown_tail", &q->msg.shown_tail},
                {"detail", &q->msg.detail}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if ((rc = tsp_jreq_str(r, strs[i].key, 0, strs[i].out)) < 0)
            return rc;
    if ((rc = tsp_jreq_get(r, "document", TSP_JSON_OBJECT, "the failure document (an object)",
                           &q->document)) < 0 ||
        (rc = tsp_jreq_get(r, "lines", TSP_JSON_OBJECT,
                           "the driver's lines by rank (an object of strings)", &q->lines)) < 0 ||
        (rc = tsp_jreq_int(r, "status", 1, &q->status)) ||
        (rc = tsp_jreq_int(r, "node_rank", 1, &q->node_rank)) ||
        (rc = tsp_jreq_int(r, "nproc_per_node", 1, &q->nproc)))
        return rc;
    return 0;
}

/* The finished failure of a request: the document's, else the agent's exit status. */
static int finish(request_fields_t *q, tsp_failure_t *f, int *node_rank, char **host)
{
    f->rank = f->local_rank = -1;
    f->agent_status = q->status;
    f->signal = q->status < 0 ? -q->status : 0; /* a Popen returncode -N: killed by signal N */
    f->status = f->signal ? 128 + f->signal : q->status;
    f->exitcode = f->signal ? -f->signal : f->status;
    *node_rank = q->node_rank;
    *host = strdup(q->host ? q->host : "?");
    if (!*host)
        return -ENOMEM;
    if (q->document)
        from_document(f, q->document, strlen(q->document), node_rank, host);
    if (f->rank < 0 && q->nproc == 1) { /* one worker per node: its rank is the node's */
        f->rank = *node_rank;
        f->local_rank = 0;
    }
    f->finished = 1;
    if (q->tail && (!f->tail || !*f->tail)) { /* the agent kept none: the glue's copy */
        free(f->tail);
        f->tail = rank_lines(q->tail, f->rank);
    } else if (!f->tail) {
        f->tail = strdup("");
    }
    return f->tail ? tsp__report_build_document(f, *host, *node_rank) : -ENOMEM;
}

/* A rank's (or a node's own) failure: the finished document and, with a product, its
 * message. */
static int rank_finish(request_fields_t *q, char **doc, char **msg)
{
    tsp_failure_t f = {0};
    char *host = NULL, *summary = NULL;
    int node_rank = -1;
    int rc = finish(q, &f, &node_rank, &host);
    if (!rc && q->lines && q->document && !q->msg.shown_tail && f.rank >= 0) {
        char key[16];
        snprintf(key, sizeof key, "%d", f.rank); /* the driver's lines of the failed rank */
        q->msg.shown_tail = tsp__report_json_string_at(q->lines, strlen(q->lines), key);
    }
    if (!rc &&
        (!(summary = tsp__report_summary(&f, host, node_rank)) || !(*doc = strdup(f.document))))
        rc = -ENOMEM;
    if (!rc && q->msg.product) {
        size_t mlen = 0;
        FILE *mm = open_memstream(msg, &mlen);
        if (mm)
            write_message(mm, &f, node_rank, host, summary, &q->msg);
        if (!mm || fclose(mm) != 0)
            rc = -ENOMEM;
    }
    free(summary);
    free(host);
    tsp__report_clear(&f);
    return rc;
}

/* ---- a node lost: the log server's document (docs/protocol.md 1.7, section 8) ---- */

static int is_lost(const char *doc)
{
    char *kind = tsp__report_json_string_at(doc, strlen(doc), "torchspark.kind");
    int lost = kind && strcmp(kind, "lost") == 0;
    free(kind);
    return lost;
}

/* The log server's lost-node document finished with the node's last lines (the request's
 * tail, else the document's), and its message: the node, what may have failed, what to
 * do, in the words both glues show. */
static int lost_finish(request_fields_t *q, char **doc, char **msg)
{
    size_t len = strlen(q->document), dl = 0, ml = 0;
    int node = doc_int(q->document, len, "torchspark.node_rank", q->node_rank);
    char *host = tsp__report_json_string_at(q->document, len, "torchspark.host");
    char *peer = tsp__report_json_string_at(q->document, len, "torchspark.peer");
    char *summary = tsp__report_json_string_at(q->document, len, "torchspark.summary");
    char *tail =
        q->tail ? strdup(q->tail) : tsp__report_json_string_at(q->document, len, "torchspark.tail");
    char *said = tsp__report_json_string_at(q->document, len, "torchspark.reason");
    const tsp_reason_t *reason =
        tsp__reason_find(said && strcmp(said, "silent") == 0 ? said : "eof");
    free(said);
    const char *h = host ? host : q->host ? q->host : "?";
    int rc = -ENOMEM;
    FILE *m = open_memstream(doc, &dl);
    if (m) {
        tsp_json_writer_t w;
        tsp_json_writer_init(&w, m);
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "message");
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "message");
        tsp_json_str(&w, summary);
        tsp_json_end(&w);
        tsp_json_key(&w, "torchspark");
        tsp_json_begin_object(&w);
        const char *nulls[] = {"rank", "local_rank", "exitcode"};
        for (size_t i = 0; i < sizeof nulls / sizeof nulls[0]; i++) {
            tsp_json_key(&w, nulls[i]);
            tsp_json_null(&w);
        }
        tsp_json_key(&w, "signal");
        tsp_json_int(&w, 0);
        tsp_json_key(&w, "node_rank");
        tsp_json_int(&w, node);
        const char *keys[] = {"kind", "reason", "host", "peer", "summary", "tail"};
        const char *vals[] = {"lost", reason->name, h, peer, summary, tail ? tail : ""};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            tsp_json_key(&w, keys[i]);
            tsp_json_str(&w, vals[i]);
        }
        tsp_json_end(&w);
        tsp_json_end(&w);
        rc = fclose(m) == 0 ? 0 : -ENOMEM;
    }
    FILE *mm = !rc && q->msg.product ? open_memstream(msg, &ml) : NULL;
    if (mm) {
        char who[32];
        snprintf(who, sizeof who, "node %d", node);
        fprintf(mm,
                "%s (%s) failed: %s.\nThe executor of node %d on host %s, that host, or the "
                "network to it failed; the other nodes were stopped.",
                q->msg.product, q->msg.mode ? q->msg.mode : "distributed",
                summary ? summary : "a node was lost", node, h);
        write_tail(mm, who, q->msg.shown_tail, tail);
        fputc('\n', mm);
        tsp__reason_advise(mm, reason, h, q->msg.went);
        if (q->msg.detail)
            fprintf(mm, "\n%s.", q->msg.detail);
        rc = fclose(mm) == 0 ? 0 : -ENOMEM;
    } else if (!rc && q->msg.product) {
        rc = -ENOMEM;
    }
    free(host);
    free(peer);
    free(summary);
    free(tail);
    return rc;
}

/* One rank's driver lines (a member of the request's "lines"), each behind its prefix. */
static int prefixed(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    FILE *m = ctx;
    char prefix[64];
    (void)index;
    if (type != TSP_JSON_STRING || !key || !*val)
        return 0;
    tsp_lines_prefix(prefix, sizeof prefix, NULL, NULL, atoi(key), TSP_STREAM_STDOUT);
    for (const char *p = val; p < val + len;) {
        size_t l = strcspn(p, "\n");
        fprintf(m, "%s%s%.*s", ftell(m) > 0 ? "\n" : "", prefix, (int)l, p);
        p += l + 1;
    }
    return 0;
}

/* A lost node's document, or none: the request's "lines" (the node's ranks, in its order),
 * each behind its rank's prefix, are its tail when the request has no tail. */
static int node_tail(request_fields_t *q)
{
    if (!q->lines || q->tail || (q->document && !is_lost(q->document)))
        return 0;
    size_t tl = 0;
    FILE *m = open_memstream(&q->tail, &tl);
    if (!m)
        return -ENOMEM;
    int rc = tsp_json_each(q->lines, strlen(q->lines), NULL, prefixed, m);
    return fclose(m) == 0 && rc != -ENOMEM ? 0 : -ENOMEM;
}

/* The lines a message showed (the driver's, else the document's tail), at most the last
 * TSP_REPORT_TAIL_IN_MESSAGE, as a list: the JVM glue's TorchSparkException.lastLines(). */
static void write_last_lines(tsp_json_writer_t *w, const char *shown, const char *doc)
{
    char *own =
        shown && *shown ? NULL : tsp__report_json_string_at(doc, strlen(doc), "torchspark.tail");
    const char *t = shown && *shown ? shown : own ? own : "";
    int n = *t ? 1 : 0;
    for (const char *p = t; *p; p++)
        n += *p == '\n';
    tsp_json_key(w, "last_lines");
    tsp_json_begin_array(w);
    for (const char *p = *t ? t : NULL; p; n--) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        char *line = n <= TSP_REPORT_TAIL_IN_MESSAGE ? strndup(p, l) : NULL;
        if (line)
            tsp_json_str(w, line);
        free(line);
        p = nl ? nl + 1 : NULL;
    }
    tsp_json_end(w);
    free(own);
}

int tsp_failure_report(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                       char *err, size_t errlen)
{
    tsp_jreq_t r;
    if (tsp_jreq_init(&r, NULL, "the failure request", request, len, err, errlen) != 0)
        return -EINVAL;
    request_fields_t q = {0};
    char *doc = NULL, *msg = NULL;
    tsp_json_reply_t rp;
    int rc = read_request(&r, &q);
    if (!rc)
        rc = node_tail(&q);
    if (!rc)
        rc = q.document && is_lost(q.document) ? lost_finish(&q, &doc, &msg)
                                               : rank_finish(&q, &doc, &msg);
    if (!rc && !(rc = tsp_json_reply_open(&rp))) {
        tsp_json_key(&rp.w, "document");
        (void)tsp_json_value(&rp.w, doc, strlen(doc));
        tsp_json_key(&rp.w, "message");
        tsp_json_str(&rp.w, msg); /* null without a product */
        if (q.msg.product) {      /* the exception's report, one layout for both glues */
            tsp_json_key(&rp.w, "report");
            tsp__userreport_write(&rp.w, doc, strlen(doc), q.msg.detail);
            write_last_lines(&rp.w, q.msg.shown_tail, doc);
        }
        rc = tsp_json_reply_close(&rp, 0, out, outlen, needed);
    }
    free(doc);
    free(msg);
    request_free(&q);
    return rc;
}
