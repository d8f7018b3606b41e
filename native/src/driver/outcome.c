/* outcome.c: a failed run's outcome, classified once (torchspark/outcome.h, docs/protocol.md
 * section 10). One ordered table: the log server's root record (a failure document, a node
 * lost) first, what a task carried in Spark's text (its set-up error's marker, its failure
 * document) beside it, then Spark's own failure text, the one place where text is matched. */
#include "torchspark/outcome.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "json.h"
#include "reason.h"
#include "util.h"

#define CAUSE_MAX 500   /* the cause is one line of at most this many bytes */
#define NPROC_MAX 65536 /* workers per node, at most (nproc_per_node) */

typedef struct {
    const char *root, *spark; /* the request's root record (JSON) and Spark's text, or NULL */
    size_t root_len;
    const char *went;           /* where every rank's output went (the advice's {went}), or NULL */
    int carried;                /* read what a task carried in Spark's text (rows 2 and 4) */
    const char *product, *mode; /* with a product: what the glue raises (write_raise) */
    int nproc;                  /* workers per node (nproc_per_node), 0 when not known */
} input_t;

typedef struct {
    const char *kind; /* failure, lost, spark */
    const tsp_reason_t *reason;
    int node_rank;             /* -1: not known */
    char executor[128];        /* "" : not known */
    int exclude;               /* take the node's executor out of scheduling */
    char cause[CAUSE_MAX + 1]; /* one line */
    char host[256];
    const char *setup; /* row 2: the set-up error a task named (SETUPS), else NULL */
    char *text;        /* row 2: its sentence (malloc'ed), else NULL */
    char *document;    /* row 4: the failure document a task carried (malloc'ed), else NULL */
} outcome_t;

/* The set-up errors a task names in its exception text, "<marker>: <sentence>" (the PySpark
 * task's boot, task/_boot.py; either glue's task that cannot reach the driver's rendezvous),
 * in the order they are looked for: the glue ships its package for the first, goes on
 * through allGather for the second, raises the sentence of the others. */
static const struct {
    const char *marker, *name;
} SETUPS[] = {
    {"TORCHSPARK_NOT_INSTALLED: ", "not_installed"},
    {"TORCHSPARK_RENDEZVOUS_UNREACHABLE: ", "rendezvous_unreachable"},
    {"TORCHSPARK_SETUP_ERROR: ", "setup_error"},
};

/* A failure document a task carried: this, then the document's JSON in base64 (section 8). */
#define CARRIED_MARKER "TORCHSPARK-FAILURE-REPORT-V2:"

/* The string at path of doc, or NULL (malloc'ed). */
static char *str_at(const char *doc, size_t len, const char *path)
{
    char *v = NULL;
    int type = 0;
    if (tsp_json_get(doc, len, path, &v, &type) != 0 || type != TSP_JSON_STRING) {
        free(v);
        return NULL;
    }
    return v;
}

/* The object at path of doc as JSON text, or NULL (malloc'ed). */
static char *object_at(const char *doc, size_t len, const char *path)
{
    char *v = NULL;
    int type = 0;
    if (!doc || tsp_json_get(doc, len, path, &v, &type) != 0 || type != TSP_JSON_OBJECT) {
        free(v);
        return NULL;
    }
    return v;
}

static int int_at(const char *doc, size_t len, const char *path, int dflt)
{
    char *v = NULL;
    int type = 0, x = dflt;
    if (tsp_json_get(doc, len, path, &v, &type) == 0 && type == TSP_JSON_NUMBER)
        x = atoi(v);
    free(v);
    return x;
}

/* Copies one line of s (up to its first newline, trailing blanks left out, at most CAUSE_MAX
 * bytes) to dst. */
static void one_line(char *dst, const char *s)
{
    size_t n = strcspn(s, "\r\n");
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        n--;
    snprintf(dst, CAUSE_MAX + 1, "%.*s", (int)(n > CAUSE_MAX ? CAUSE_MAX : n), s);
}

/* Rows 1 and 2: the root record, a rank's failure or a node lost, by its document's reason
 * (a document without one: exit or signal; eof for a lost node). */
static int from_record(const char *root, size_t root_len, outcome_t *o, const char *want)
{
    if (!root)
        return 0;
    char *kind = str_at(root, root_len, "kind");
    int match = kind && strcmp(kind, want) == 0;
    free(kind);
    if (!match)
        return 0;
    int lost = strcmp(want, "lost") == 0;
    char *reason = str_at(root, root_len, "report.torchspark.reason");
    const tsp_reason_t *r = tsp__reason_find(reason);
    free(reason);
    if (!r || (lost && strcmp(r->name, "silent") != 0)) {
        int signal = int_at(root, root_len, "report.torchspark.signal", 0);
        r = tsp__reason_find(lost ? "eof" : signal ? "signal" : "exit");
    }
    o->kind = want;
    o->reason = r;
    /* silent: Spark notices a frozen host only after spark.network.timeout; preempted: the
     * executor is going away, but Spark offers it until its JVM has exited. */
    o->exclude = strcmp(r->name, "silent") == 0 || strcmp(r->name, "preempted") == 0;
    o->node_rank = int_at(root, root_len, "node_rank",
                          int_at(root, root_len, "report.torchspark.node_rank", -1));
    char *said = str_at(root, root_len, "report.torchspark.summary");
    if (!said)
        said = str_at(root, root_len, "message");
    one_line(o->cause, said ? said : lost ? "a node was lost" : "a rank failed");
    free(said);
    char *host = str_at(root, root_len, "host");
    snprintf(o->host, sizeof o->host, "%s", host ? host : "?");
    free(host);
    return 1;
}

static int root_failure(const input_t *in, outcome_t *o)
{
    return from_record(in->root, in->root_len, o, "failure");
}

static int root_lost(const input_t *in, outcome_t *o)
{
    return from_record(in->root, in->root_len, o, "lost");
}

/* Row 2: a task's set-up error in Spark's text, the first marker of SETUPS found: its
 * sentence is the rest of that line, blanks trimmed. */
static int task_setup(const input_t *in, outcome_t *o)
{
    for (size_t i = 0; in->carried && in->spark && i < sizeof SETUPS / sizeof SETUPS[0]; i++) {
        const char *p = strstr(in->spark, SETUPS[i].marker);
        if (!p)
            continue;
        p += strlen(SETUPS[i].marker);
        while (*p && *p != '\n' && isspace((unsigned char)*p))
            p++;
        size_t n = strcspn(p, "\n");
        while (n > 0 && isspace((unsigned char)p[n - 1]))
            n--;
        if (!(o->text = strndup(p, n)))
            return -ENOMEM;
        o->kind = "task";
        o->setup = SETUPS[i].name;
        o->reason = tsp__reason_find("setup");
        one_line(o->cause, o->text);
        return 1;
    }
    return 0;
}

static int b64_value(int c)
{
    const char *digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *at = c ? strchr(digits, c) : NULL;
    return at ? (int)(at - digits) : -1;
}

/* The n bytes of base64 at s, decoded (malloc'ed, NUL-terminated), or NULL when they are
 * not base64 with its padding. */
static char *b64_decode(const char *s, size_t n)
{
    if (n == 0 || n % 4)
        return NULL;
    char *out = malloc(n / 4 * 3 + 1);
    size_t k = 0;
    for (size_t i = 0; out && i < n; i += 4) {
        int v[4], pad = (s[i + 2] == '=') + (s[i + 3] == '=');
        for (int j = 0; j < 4; j++)
            v[j] = j >= 4 - pad ? 0 : b64_value((unsigned char)s[i + j]);
        if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || (pad && i + 4 != n) ||
            (pad == 1 && s[i + 2] == '=')) {
            free(out);
            return NULL;
        }
        unsigned triple = (unsigned)(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
        const char bytes[3] = {(char)(triple >> 16), (char)(triple >> 8), (char)triple};
        memcpy(out + k, bytes, (size_t)(3 - pad));
        k += (size_t)(3 - pad);
    }
    if (out)
        out[k] = 0;
    return out;
}

/* The document's torchspark.time, or a negative number when it has none. */
static double doc_time(const char *doc)
{
    char *v = NULL;
    int type = 0;
    double t = -1;
    if (tsp_json_get(doc, strlen(doc), "torchspark.time", &v, &type) == 0 &&
        type == TSP_JSON_NUMBER)
        t = strtod(v, NULL);
    free(v);
    return t;
}

/* Row 4: the oldest failure document a task carried in Spark's text (the same document
 * may stand twice: the task's message and a chained cause): the first with the smallest
 * torchspark.time, else the first found. Outcome as a root record of kind failure. */
static int task_carried(const input_t *in, outcome_t *o)
{
    const char *p = in->carried && in->spark ? in->spark : "";
    double best_t = -1;
    while ((p = strstr(p, CARRIED_MARKER))) {
        p += strlen(CARRIED_MARKER);
        size_t n = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=");
        char *doc = b64_decode(p, n);
        p += n;
        if (!doc || tsp_json_check_object(doc, strlen(doc)) != 0) {
            free(doc);
            continue;
        }
        double t = doc_time(doc);
        if (!o->document || (t >= 0 && (best_t < 0 || t < best_t))) {
            free(o->document);
            o->document = doc;
            best_t = t;
        } else {
            free(doc);
        }
    }
    if (!o->document)
        return 0;
    char *record = NULL, *host = str_at(o->document, strlen(o->document), "torchspark.host");
    size_t rlen = 0;
    FILE *f = open_memstream(&record, &rlen);
    if (f) {
        fputs("{\"kind\": \"failure\", \"host\": ", f);
        tsp_json_write_string(f, host);
        fprintf(f, ", \"report\": %s}", o->document);
    }
    free(host);
    if (!f || fclose(f) != 0) {
        free(record);
        return -ENOMEM;
    }
    (void)from_record(record, rlen, o, "failure");
    free(record);
    return 1;
}

/* Row 3: Spark says an executor was lost: "ExecutorLostFailure (executor 1 exited caused by
 * one of the running tasks) Reason: ..." (TaskEndReason.scala's toErrorString). */
static int spark_executor_lost(const input_t *in, outcome_t *o)
{
    static const char marker[] = "ExecutorLostFailure (";
    const char *p = in->spark ? strstr(in->spark, marker) : NULL;
    if (!p)
        return 0;
    p += sizeof marker - 1;
    const char *close = strchr(p, ')');
    size_t n = close ? (size_t)(close - p) : strcspn(p, "\n");
    char what[CAUSE_MAX + 1], why[CAUSE_MAX + 1] = "";
    snprintf(what, sizeof what, "%.*s", (int)(n > CAUSE_MAX ? CAUSE_MAX : n), p);
    const char *reason = close ? strstr(close, ") Reason: ") : NULL;
    if (reason && reason == close) /* " Reason: " right after what Spark says of it */
        one_line(why, reason + strlen(") Reason: "));
    if (strncasecmp(what, "executor ", 9) == 0) /* its id: the word after "executor " */
        snprintf(o->executor, sizeof o->executor, "%.*s", (int)strcspn(what + 9, " )"), what + 9);
    o->kind = "spark";
    /* ExecutorDecommission's reason (ExecutorLossReason.scala), or a decommissioned
     * executor named so in what Spark says of it ("Executor 1 is decommissioned"). */
    int decommissioned =
        strncmp(why, "Executor decommission", 21) == 0 || strcasestr(what, "decommission") != NULL;
    o->reason = tsp__reason_find(decommissioned ? "decommission" : "executor_lost");
    snprintf(o->cause, sizeof o->cause, "%s%s%s (ExecutorLostFailure)", what, *why ? ": " : "",
             why);
    return 1;
}

/* Row 4: the job was cancelled (SparkContext.cancelJob/cancelJobGroup/cancelAllJobs: "...
 * cancelled ..."), else row 5: Spark failed the stage with nothing of ours to say. */
static int spark_other(const input_t *in, outcome_t *o)
{
    const char *t = in->spark ? in->spark : "";
    int cancelled = 0;
    for (const char *p = t; *p && !cancelled; p++)
        cancelled = strncasecmp(p, "cancel", 6) == 0;
    while (*t && isspace((unsigned char)*t))
        t++;
    o->kind = "spark";
    o->reason = tsp__reason_find(cancelled ? "cancelled" : "spark");
    char first[CAUSE_MAX + 1];
    one_line(first, *t ? t : "no error text");
    snprintf(o->cause, sizeof o->cause, "%s: %s",
             cancelled ? "the Spark job was cancelled"
                       : "the barrier stage failed before any training process reported an error",
             first);
    return 1;
}

/* The table, in order: the first row that matches decides. */
static int (*const rows[])(const input_t *, outcome_t *) = {
    root_failure, task_setup, root_lost, task_carried, spark_executor_lost, spark_other,
};

/* The request's string at key: 0 with *out (NULL when absent or null), or -EINVAL. */
static int req_string(const char *request, size_t len, const char *key, char **out, char *err,
                      size_t errlen)
{
    int type = 0;
    int rc = tsp_json_get(request, len, key, out, &type);
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return rc;
    if (type == TSP_JSON_LITERAL && strcmp(*out, "null") == 0) {
        free(*out);
        *out = NULL;
    } else if (type != TSP_JSON_STRING) {
        return tsp__err(err, errlen, -EINVAL,
                        "the outcome request's \"%s\" must be a string or null", key);
    }
    return 0;
}

/* The request's whole number at key into *v (left as it is when absent or null): 0, or -EINVAL. */
static int req_int(const char *request, size_t len, const char *key, int *v, char *err,
                   size_t errlen)
{
    char *s = NULL, *end = NULL;
    int type = 0;
    int rc = tsp_json_get(request, len, key, &s, &type);
    long x = rc == 0 && type == TSP_JSON_NUMBER ? strtol(s, &end, 10) : 0;
    int null = rc == 0 && type == TSP_JSON_LITERAL && strcmp(s, "null") == 0;
    int ok = rc == -ENOENT || null || (end && !*end && x >= 0 && x <= NPROC_MAX);
    free(s);
    if (rc && rc != -ENOENT)
        return rc;
    if (!ok)
        return tsp__err(err, errlen, -EINVAL,
                        "the outcome request's \"%s\" must be a whole number from 0 to %d", key,
                        NPROC_MAX);
    if (rc == 0 && !null)
        *v = (int)x;
    return 0;
}

/* The keys that ask for what the glue raises: product, mode, nproc_per_node. */
static int read_raise(const char *request, size_t len, input_t *in, char **product, char **mode,
                      char *err, size_t errlen)
{
    int rc;
    if ((rc = req_string(request, len, "product", product, err, errlen)) ||
        (rc = req_string(request, len, "mode", mode, err, errlen)) ||
        (rc = req_int(request, len, "nproc_per_node", &in->nproc, err, errlen)))
        return rc;
    in->product = *product;
    in->mode = *mode ? *mode : "distributed";
    return 0;
}

static int read_request(const char *request, size_t len, input_t *in, char **root, char **spark,
                        char **went, char *err, size_t errlen)
{
    if (tsp_json_check_object(request, len) != 0)
        return tsp__err(err, errlen, -EINVAL, "the outcome request is not a JSON object");
    int type = 0;
    int rc = tsp_json_get(request, len, "root", root, &type);
    if (rc == -ENOMEM)
        return rc;
    if (rc == 0 && type == TSP_JSON_LITERAL && strcmp(*root, "null") == 0) {
        free(*root);
        *root = NULL;
    } else if (rc == 0 && type != TSP_JSON_OBJECT) {
        return tsp__err(err, errlen, -EINVAL,
                        "the outcome request's \"root\" must be the log server's root record "
                        "(an object) or null");
    }
    if ((rc = req_string(request, len, "spark_error", spark, err, errlen)) ||
        (rc = req_string(request, len, "output_went", went, err, errlen)))
        return rc;
    char *carried = NULL;
    rc = tsp_json_get(request, len, "carried", &carried, &type);
    in->carried = rc == -ENOENT || (rc == 0 && strcmp(carried, "true") == 0);
    int bad = rc == 0 && (type != TSP_JSON_LITERAL || strcmp(carried, "null") == 0 ||
                          !(in->carried || strcmp(carried, "false") == 0));
    free(carried);
    if (rc && rc != -ENOENT)
        return rc;
    if (bad)
        return tsp__err(err, errlen, -EINVAL,
                        "the outcome request's \"carried\" must be true or false (whether to "
                        "read what a task carried in Spark's text)");
    in->root = *root;
    in->went = *went;
    in->root_len = *root ? strlen(*root) : 0;
    in->spark = *spark;
    return 0;
}

/* The failure document's request to tsp_failure_report (docs/protocol.md section 10, "What
 * the glue raises"): the document a task carried as it is, else the root record's with where
 * its node ran (and its job-wide detail, for a rank's failure). */
static void write_finish(tsp_json_writer_t *w, const input_t *in, const outcome_t *o,
                         const char *document)
{
    tsp_json_begin_object(w);
    tsp_json_key(w, "document");
    if (!document || tsp_json_value(w, document, strlen(document)) != 0)
        tsp_json_null(w);
    if (!o->document) {
        tsp_json_key(w, "node_rank");
        tsp_json_int(w, int_at(in->root, in->root_len, "node_rank", -1));
        tsp_json_key(w, "host");
        tsp_json_str(w, o->host);
        tsp_json_key(w, "nproc_per_node");
        tsp_json_int(w, in->nproc);
    }
    char *detail = !o->document && document && strcmp(o->kind, "failure") == 0
                       ? str_at(in->root, in->root_len, "detail")
                       : NULL;
    const char *keys[] = {"product", "mode", "output_went", "detail"};
    const char *vals[] = {in->product, in->mode, in->went, detail};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        tsp_json_key(w, keys[i]);
        tsp_json_str(w, vals[i]);
    }
    free(detail);
    tsp_json_end(w);
}

/* The ranks whose driver lines finish the document: its rank's (the node's one worker's
 * when it names none), shown in the message; all the node's ranks for a lost node or a
 * record without a document, its tail. */
static void write_lines_of(tsp_json_writer_t *w, const input_t *in, const outcome_t *o,
                           const char *document)
{
    int shows = document && (o->document || strcmp(o->kind, "failure") == 0);
    long long rank = shows ? int_at(document, strlen(document), "torchspark.rank", -1) : -1;
    long long node = o->node_rank;
    if (shows && rank < 0 && !o->document && in->nproc == 1)
        rank = node;
    tsp_json_key(w, "lines_of");
    tsp_json_begin_array(w);
    if (shows && rank >= 0)
        tsp_json_int(w, rank);
    for (long long r = node * in->nproc; !shows && node >= 0 && r < (node + 1) * in->nproc; r++)
        tsp_json_int(w, r);
    tsp_json_end(w);
}

/* The line a glue logs when a task could not reach the driver's rendezvous and the same job
 * runs again through allGather, as every later run of that process does (docs/protocol.md
 * 10): the task's text inside; NULL when out of memory. */
static char *rendezvous_retry(const input_t *in, const char *text)
{
    char *line = NULL;
    int java = strcmp(in->product, "TorchSparkRunner") == 0;
    if (asprintf(&line,
                 "The executors could not reach torchspark's rendezvous on the driver (%s); "
                 "running the job again through BarrierTaskContext.allGather, as every later run "
                 "of this %s will (about 1 s slower; spark.torchspark.rendezvous=false or "
                 "TORCHSPARK_RENDEZVOUS=0 skips the attempt)",
                 text, java ? "JVM" : "process") < 0)
        return NULL;
    return line;
}

/* With a product: what the glue raises. A failure document (a rank's, a lost node's, one a
 * task carried) is finished by tsp_failure_report ("finish", with the driver's lines of
 * "lines_of"); the rest is written here, its message and its report. */
static int write_raise(tsp_json_writer_t *w, const input_t *in, const outcome_t *o,
                       const char *advice)
{
    int doc = strcmp(o->kind, "failure") == 0 || strcmp(o->kind, "lost") == 0;
    char *message = NULL;
    const char *text = o->text ? o->text : "";
    if (!doc && o->setup && strcmp(o->setup, "rendezvous_unreachable") == 0)
        message = rendezvous_retry(in, text);
    else if (!doc && strcmp(o->kind, "task") == 0)
        message = strdup(text);
    else if (!doc && asprintf(&message, "%s (%s) failed: %s\n%s", in->product, in->mode, o->cause,
                              advice) < 0)
        message = NULL;
    if (!doc && !message)
        return -ENOMEM;
    tsp_json_key(w, "message");
    tsp_json_str(w, message);
    free(message);
    tsp_json_key(w, "report");
    if (doc) {
        tsp_json_null(w);
    } else {
        tsp_json_begin_object(w);
        tsp_json_key(w, "version");
        tsp_json_int(w, 2);
        const char *keys[] = {"kind", "reason"};
        const char *vals[] = {o->kind, o->reason->name};
        for (size_t i = 0; i < 2; i++) {
            tsp_json_key(w, keys[i]);
            tsp_json_str(w, vals[i]);
        }
        tsp_json_end(w);
    }
    char *report = doc && !o->document ? object_at(in->root, in->root_len, "report") : NULL;
    const char *document = o->document ? o->document : report;
    tsp_json_key(w, "finish");
    if (doc)
        write_finish(w, in, o, document);
    else
        tsp_json_null(w);
    write_lines_of(w, in, o, document);
    free(report);
    return 0;
}

static int write_outcome(const outcome_t *o, const input_t *in, tsp_json_writer_t *w)
{
    const char *went = in->went;
    const char *skeys[] = {"kind", "reason"};
    const char *svals[] = {o->kind, o->reason->name};
    for (size_t i = 0; i < 2; i++) {
        tsp_json_key(w, skeys[i]);
        tsp_json_str(w, svals[i]);
    }
    tsp_json_key(w, "restart");
    (void)tsp_json_value(w, o->reason->restartable ? "true" : "false", 4 + !o->reason->restartable);
    tsp_json_key(w, "node_rank");
    if (o->node_rank >= 0)
        tsp_json_int(w, o->node_rank);
    else
        tsp_json_null(w);
    tsp_json_key(w, "executor");
    tsp_json_str(w, o->executor[0] ? o->executor : NULL);
    tsp_json_key(w, "exclude");
    (void)tsp_json_value(w, o->exclude ? "true" : "false", 4 + !o->exclude);
    tsp_json_key(w, "cause");
    tsp_json_str(w, o->cause);
    tsp_json_key(w, "setup");
    tsp_json_str(w, o->setup);
    tsp_json_key(w, "text");
    tsp_json_str(w, o->text);
    tsp_json_key(w, "carried");
    if (o->document)
        (void)tsp_json_value(w, o->document, strlen(o->document));
    else
        tsp_json_null(w);
    char *advice = NULL;
    size_t alen = 0;
    FILE *a = open_memstream(&advice, &alen);
    if (a) {
        tsp__reason_advise(a, o->reason, o->host[0] ? o->host : NULL, went);
        if (fclose(a) != 0) {
            free(advice);
            advice = NULL;
        }
    }
    tsp_json_key(w, "advice");
    tsp_json_str(w, advice);
    int rc = in->product && advice ? write_raise(w, in, o, advice) : 0;
    free(advice);
    return advice && !rc ? 0 : -ENOMEM;
}

int tsp_outcome_classify(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                         char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    input_t in = {0};
    char *root = NULL, *spark = NULL, *went = NULL, *product = NULL, *mode = NULL;
    int rc = read_request(request, len, &in, &root, &spark, &went, err, errlen);
    if (!rc)
        rc = read_raise(request, len, &in, &product, &mode, err, errlen);
    outcome_t o = {.node_rank = -1};
    int found = 0;
    for (size_t i = 0; !rc && !found && i < sizeof rows / sizeof rows[0]; i++)
        rc = (found = rows[i](&in, &o)) < 0 ? found : 0;
    tsp_json_reply_t rp;
    if (!rc && !(rc = tsp_json_reply_open(&rp)))
        rc = tsp_json_reply_close(&rp, write_outcome(&o, &in, &rp.w), out, outlen, needed);
    free(root);
    free(spark);
    free(went);
    free(product);
    free(mode);
    free(o.text);
    free(o.document);
    return rc;
}
