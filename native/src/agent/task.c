/* task.c: the task side (torchspark/task.h, docs/protocol.md section 12), once for both glues:
 * a task's facts -> the agent's command line (through the node plan, plan.c), environment and
 * files; the agent's exit -> the task's result (its failure through reportfinish.c's
 * tsp_failure_report, or the file it returns through collect()). */
#include "torchspark/task.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jreq.h"
#include "json.h"
#include "report.h"
#include "torchspark/elect.h"
#include "torchspark/failure.h"
#include "torchspark/plan.h"
#include "util.h"

#define CARRIER "TORCHSPARK-FAILURE-REPORT-V2:" /* docs/protocol.md section 3 */

typedef int (*json_fn)(const char *, size_t, char *, size_t, size_t *, char *, size_t);

/* A whole number (negative when neg) into *v; dflt when absent. */
static int get_int(const tsp_jreq_t *r, const char *key, int neg, int dflt, int *v)
{
    *v = dflt;
    return tsp_jreq_int(r, key, neg, v);
}

/* fn's reply to in, malloc'ed in *out (NUL-terminated). */
static int call(json_fn fn, const char *in, size_t len, char **out, char *err, size_t errlen)
{
    size_t size = 16384, needed = 0;
    for (int i = 0; i < 2; i++) {
        if (!(*out = malloc(size)))
            return -ENOMEM;
        int rc = fn(in, len, *out, size, &needed, err, errlen);
        if (rc != -ENOSPC || i)
            return rc;
        free(*out);
        size = needed;
    }
    return -ENOSPC;
}

/* A malloc'ed sentence, or NULL when memory ran out. */
__attribute__((format(printf, 1, 2))) static char *fmt(const char *f, ...)
{
    char *p = NULL;
    va_list ap;
    va_start(ap, f);
    int n = vasprintf(&p, f, ap);
    va_end(ap);
    return n < 0 ? NULL : p;
}

static char *in_dir(const char *dir, const char *name)
{
    return fmt("%s/%s", dir, name);
}

static void write_bool(tsp_json_writer_t *w, const char *key, int v)
{
    tsp_json_key(w, key);
    (void)tsp_json_value(w, v ? "true" : "false", v ? 4 : 5);
}

static void put_str(tsp_json_writer_t *w, const char *key, const char *val)
{
    tsp_json_key(w, key);
    tsp_json_str(w, val);
}

/* The request's value at path, written under key as it is, when present. */
static void copy_as(tsp_json_writer_t *w, const tsp_jreq_t *r, const char *path, const char *key)
{
    char *v = NULL;
    int type = 0;
    if (tsp_json_get(r->doc, r->len, path, &v, &type) != 0)
        return;
    tsp_json_key(w, key);
    if (type == TSP_JSON_STRING)
        tsp_json_str(w, v);
    else
        (void)tsp_json_value(w, v, strlen(v));
    free(v);
}

typedef struct {
    char *workdir, *gpu_resource, *gpus, *ifname, *attempt, *endpoint, *record;
    char *error, *output, *fn, *request_file, *packed;
    int standalone, nproc, node_rank, output_wanted, channel, ship, collect;
    tsp_elect_record_t rec; /* read from packed */
} launch_t;

static void launch_free(launch_t *l)
{
    char **s[] = {&l->workdir, &l->gpu_resource, &l->gpus,         &l->ifname,
                  &l->attempt, &l->endpoint,     &l->record,       &l->error,
                  &l->output,  &l->fn,           &l->request_file, &l->packed};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
        free(*s[i]);
}

typedef struct {
    FILE *f;
    size_t n;
    int bad;
} join_t;

/* Each GPU address (a string) appended to a comma-separated list. */
static int join_gpu(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key;
    join_t *j = ctx;
    if (type != TSP_JSON_STRING || memchr(val, ',', len)) {
        j->bad = 1;
        return -EINVAL;
    }
    fprintf(j->f, "%s%s", index ? "," : "", val);
    j->n++;
    return 0;
}

/* gpus: an array of addresses -> "a,b"; an empty one is refused (the task got none). */
static int read_gpus(const tsp_jreq_t *r, launch_t *l)
{
    char *arr = NULL;
    int rc = tsp_jreq_get(r, "gpus", TSP_JSON_ARRAY, "an array of strings (Spark's GPU addresses)",
                          &arr);
    if (rc <= 0)
        return rc;
    size_t glen = 0;
    join_t j = {open_memstream(&l->gpus, &glen), 0, 0};
    rc = j.f ? tsp_json_each(arr, strlen(arr), NULL, join_gpu, &j) : -ENOMEM;
    if (j.f && fclose(j.f) != 0)
        rc = -ENOMEM;
    free(arr);
    if (j.bad)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the task request's \"gpus\" must be an array "
                        "of strings (Spark's GPU addresses)");
    if (!rc && j.n == 0)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "torchspark: the job uses GPUs but this task "
                        "got no \"%s\" resource: set spark.task.resource.%s.amount",
                        l->gpu_resource ? l->gpu_resource : "gpu",
                        l->gpu_resource ? l->gpu_resource : "gpu");
    l->nproc = (int)j.n;
    return rc;
}

/* "packed": rank 0's record as received, read; without "ifname", the one of this node (the
 * record's on node 0, else the interface of this host's route towards the master). */
static int read_packed(const tsp_jreq_t *r, launch_t *l)
{
    char why[256] = "", addr[TSP_ELECT_ADDR_MAX], ifname[TSP_ELECT_IFNAME_MAX] = "";
    if (!l->packed)
        return 0;
    if (l->record)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the task request has both \"record\" and \"packed\": give one");
    if (tsp_elect_record_unpack(l->packed, strlen(l->packed), &l->rec, why, sizeof why) != 0)
        return tsp__err(r->err, r->errlen, -EINVAL, "torchspark: bad election record: %s", why);
    if (l->ifname)
        return 0;
    if (l->node_rank == 0)
        snprintf(ifname, sizeof ifname, "%s", l->rec.ifname);
    else if (tsp_elect_route_source(l->rec.master_addr, addr, sizeof addr, NULL, 0) != 0 ||
             tsp_elect_ifname_of(addr, ifname, sizeof ifname) != 0)
        ifname[0] = '\0';
    return ifname[0] && !(l->ifname = strdup(ifname)) ? -ENOMEM : 0;
}

static int read_launch(const tsp_jreq_t *r, launch_t *l)
{
    int rc;
    if ((rc = tsp_jreq_str(r, "workdir", 1, &l->workdir)) ||
        (rc = tsp_jreq_bool(r, "standalone", &l->standalone)) ||
        (rc = get_int(r, "nproc_per_node", 0, 1, &l->nproc)) ||
        (rc = get_int(r, "node_rank", 0, 0, &l->node_rank)) ||
        (rc = tsp_jreq_str(r, "gpu_resource", 0, &l->gpu_resource)) || (rc = read_gpus(r, l)) ||
        (rc = tsp_jreq_get(r, "record", TSP_JSON_OBJECT, "an object (the election record)",
                           &l->record)) < 0 ||
        (rc = tsp_jreq_str(r, "ifname", 0, &l->ifname)) ||
        (rc = tsp_jreq_get(r, "task_attempt_id", TSP_JSON_NUMBER, "a whole number", &l->attempt)) <
            0 ||
        (rc = tsp_jreq_str(r, "log_endpoint", 0, &l->endpoint)) ||
        (rc = tsp_jreq_bool(r, "output", &l->output_wanted)) ||
        (rc = tsp_jreq_bool(r, "output_channel", &l->channel)) ||
        (rc = tsp_jreq_str(r, "packed", 0, &l->packed)) || (rc = read_packed(r, l)))
        return rc;
    l->nproc = l->nproc > 0 ? l->nproc : 1;
    l->ship = l->output_wanted && l->channel && l->endpoint && l->node_rank == 0;
    l->collect = l->output_wanted && l->node_rank == 0;
    l->error = in_dir(l->workdir, "error.json");
    l->output = in_dir(l->workdir, "output.bin");
    l->fn = in_dir(l->workdir, "fn.pickle");
    l->request_file = in_dir(l->workdir, "checkpoint-request");
    return l->error && l->output && l->fn && l->request_file ? 0 : -ENOMEM;
}

/* The node plan (docs/protocol.md section 7) of the task, as JSON text in *doc. */
static int write_plan(const tsp_jreq_t *r, const launch_t *l, char **doc, size_t *dlen)
{
    FILE *f = open_memstream(doc, dlen);
    if (!f)
        return -ENOMEM;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    const char *keys[] = {"agent",     "python",       "no_python", "nnodes",
                          "node_rank", "log_endpoint", "nccl_lib",  "warm_socket"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        copy_as(&w, r, keys[i], keys[i]);
    write_bool(&w, "standalone", l->standalone);
    tsp_json_key(&w, "nproc_per_node");
    tsp_json_int(&w, l->nproc);
    tsp_json_key(&w, "gpus");
    tsp_json_str(&w, l->gpus);
    if (l->gpus) /* the NCCL check only with GPUs */
        copy_as(&w, r, "nccl_check", "nccl_check");
    if (l->packed) {
        put_str(&w, "master_addr", l->rec.master_addr);
        tsp_json_key(&w, "master_port");
        tsp_json_int(&w, l->rec.master_port);
        tsp_json_key(&w, "nccl_port");
        tsp_json_int(&w, l->rec.nccl_port);
        put_str(&w, "run_id", l->rec.run_id);
    } else if (l->record) {
        copy_as(&w, r, "record.master_addr", "master_addr");
        copy_as(&w, r, "record.master_port", "master_port");
        copy_as(&w, r, "record.nccl_port", "nccl_port");
        copy_as(&w, r, "record.run_id", "run_id");
    }
    tsp_json_key(&w, "error_file");
    tsp_json_str(&w, l->error);
    tsp_json_key(&w, "shutdown_timeout");
    tsp_json_int(&w, TSP_TASK_SHUTDOWN_TIMEOUT_S);
    tsp_json_key(&w, "output_file");
    tsp_json_str(&w, l->ship ? l->output : NULL);
    tsp_json_end(&w);
    return fclose(f) == 0 ? 0 : -ENOMEM;
}

typedef struct {
    tsp_json_writer_t *w;
    const launch_t *l;
    int subst; /* the program's entries name the files; the plan's options are as they are */
    int bad;
} emit_t;

/* s with every "{output}" and "{fn}" replaced by that file's path, written as a string. */
static void write_subst(tsp_json_writer_t *w, const launch_t *l, const char *s)
{
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (!f) {
        tsp_json_str(w, s);
        return;
    }
    while (*s) {
        if (strncmp(s, "{output}", 8) == 0) {
            fputs(l->output, f);
            s += 8;
        } else if (strncmp(s, "{fn}", 4) == 0) {
            fputs(l->fn, f);
            s += 4;
        } else {
            fputc(*s++, f);
        }
    }
    tsp_json_str(w, fclose(f) == 0 ? text : "");
    free(text);
}

/* An argv entry (the plan's option, or the program's with its files named). */
static int emit_arg(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key, (void)index, (void)len;
    emit_t *e = ctx;
    if (type != TSP_JSON_STRING) {
        e->bad = 1;
        return -EINVAL;
    }
    if (e->subst)
        write_subst(e->w, e->l, val);
    else
        tsp_json_str(e->w, val);
    return 0;
}

/* A member of the request's env (a string), as it is. */
static int emit_env(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)index, (void)len;
    emit_t *e = ctx;
    if (type != TSP_JSON_STRING) {
        e->bad = 1;
        return -EINVAL;
    }
    tsp_json_key(e->w, key);
    tsp_json_str(e->w, val);
    return 0;
}

/* "env" and "env_default" (docs/protocol.md section 12). */
static int write_env(const tsp_jreq_t *r, const launch_t *l, tsp_json_writer_t *w)
{
    emit_t e = {w, l, 0, 0};
    char *obj = NULL;
    int rc = tsp_jreq_get(r, "env", TSP_JSON_OBJECT, "an object of strings", &obj);
    tsp_json_key(w, "env");
    tsp_json_begin_object(w);
    if (rc > 0)
        rc = tsp_json_each(obj, strlen(obj), NULL, emit_env, &e);
    free(obj);
    if (rc == -EINVAL || e.bad)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the task request's \"env\" must be an object of strings");
    if (rc < 0)
        return rc;
    if (!l->standalone) {
        if (l->attempt) /* TorchSparkPlugin finds the task's agent by it */
            put_str(w, "TORCHSPARK_TASK_ATTEMPT_ID", l->attempt);
        /* Created by TorchSparkPlugin on a decommission or preemption notice. */
        put_str(w, "TORCHSPARK_CHECKPOINT_REQUEST", l->request_file);
        if (!l->gpus) /* a CPU job's workers see no GPU of the executor */
            put_str(w, "CUDA_VISIBLE_DEVICES", "");
    }
    if (l->output_wanted)
        put_str(w, "TORCHSPARK_OUTPUT_FILE", l->output);
    tsp_json_end(w);
    tsp_json_key(w, "env_default");
    tsp_json_begin_object(w);
    if (l->ifname && *l->ifname) {
        put_str(w, "GLOO_SOCKET_IFNAME", l->ifname);
        put_str(w, "NCCL_SOCKET_IFNAME", l->ifname);
    }
    tsp_json_end(w);
    return 0;
}

static void write_files(tsp_json_writer_t *w, const launch_t *l)
{
    tsp_json_key(w, "files");
    tsp_json_begin_object(w);
    put_str(w, "error", l->error);
    put_str(w, "output", l->output);
    put_str(w, "fn", l->fn);
    put_str(w, "checkpoint_request", l->request_file);
    tsp_json_end(w);
}

/* "files", "nproc_per_node", "ship" and "collect": what the agent's exit is read with. */
static void write_outcome_keys(tsp_json_writer_t *w, const launch_t *l)
{
    write_files(w, l);
    tsp_json_key(w, "nproc_per_node");
    tsp_json_int(w, l->nproc);
    write_bool(w, "ship", l->ship);
    write_bool(w, "collect", l->collect);
}

/* The launch reply, with the plan's options (argv, a JSON array) first in "argv". */
static int write_launch(const tsp_jreq_t *r, const launch_t *l, const char *argv,
                        tsp_json_writer_t *w)
{
    tsp_json_key(w, "argv");
    tsp_json_begin_array(w);
    emit_t e = {w, l, 0, 0};
    int rc = tsp_json_each(argv, strlen(argv), NULL, emit_arg, &e);
    e.subst = 1;
    if (!rc)
        rc = tsp_json_each(r->doc, r->len, "program", emit_arg, &e);
    if (rc == -ENOENT || rc == -EINVAL || e.bad)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the task request's \"program\" must be an array of strings");
    if (rc)
        return rc;
    tsp_json_end(w);
    if ((rc = write_env(r, l, w)) != 0)
        return rc;
    write_outcome_keys(w, l);
    tsp_json_key(w, "finish"); /* tsp_task_finish's request but the exit, tail and host */
    tsp_json_begin_object(w);
    write_outcome_keys(w, l);
    tsp_json_key(w, "node_rank");
    tsp_json_int(w, l->node_rank);
    tsp_json_end(w);
    return 0;
}

int tsp_task_launch(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                    char *err, size_t errlen)
{
    tsp_jreq_t r;
    if (tsp_jreq_init(&r, NULL, "the task request", request, len, err, errlen) != 0)
        return -EINVAL;
    launch_t l = {0};
    char *plan = NULL, *argv = NULL;
    size_t plen = 0;
    tsp_json_reply_t rp;
    int rc = read_launch(&r, &l);
    if (!rc)
        rc = write_plan(&r, &l, &plan, &plen);
    if (!rc)
        rc = call(tsp_plan_argv, plan, plen, &argv, err, errlen);
    if (!rc && !(rc = tsp_json_reply_open(&rp)))
        rc = tsp_json_reply_close(&rp, write_launch(&r, &l, argv, &rp.w), out, outlen, needed);
    free(plan);
    free(argv);
    launch_free(&l);
    return rc;
}

/* ---- the agent's exit -> the task's result ---- */

typedef struct {
    char *error, *output, *host, *tail;
    int status, ship, collect, node_rank, nproc;
} finish_t;

static int read_finish(const tsp_jreq_t *r, finish_t *x)
{
    int rc;
    if ((rc = get_int(r, "status", 1, 1, &x->status)) ||
        (rc = tsp_jreq_str(r, "files.error", 1, &x->error)) ||
        (rc = tsp_jreq_str(r, "files.output", 1, &x->output)) ||
        (rc = tsp_jreq_bool(r, "ship", &x->ship)) ||
        (rc = tsp_jreq_bool(r, "collect", &x->collect)) ||
        (rc = get_int(r, "node_rank", 1, -1, &x->node_rank)) ||
        (rc = tsp_jreq_str(r, "host", 0, &x->host)) ||
        (rc = get_int(r, "nproc_per_node", 0, 0, &x->nproc)) ||
        (rc = tsp_jreq_str(r, "tail", 0, &x->tail)))
        return rc;
    return 0;
}

/* The agent's failure document as tsp_failure_report's request (section 8), in *doc. */
static int failure_request(const finish_t *x, char **doc, size_t *dlen)
{
    FILE *f = open_memstream(doc, dlen);
    if (!f)
        return -ENOMEM;
    size_t elen = 0;
    char *error = tsp__report_slurp(x->error, &elen); /* unreadable or not an object: none */
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "document");
    if (!error || tsp_json_check_object(error, elen) != 0 || tsp_json_value(&w, error, elen) != 0)
        tsp_json_null(&w);
    tsp_json_key(&w, "status");
    tsp_json_int(&w, x->status);
    tsp_json_key(&w, "node_rank");
    tsp_json_int(&w, x->node_rank);
    put_str(&w, "host", x->host ? x->host : "?");
    tsp_json_key(&w, "nproc_per_node");
    tsp_json_int(&w, x->nproc);
    put_str(&w, "tail", x->tail);
    tsp_json_end(&w);
    free(error);
    return fclose(f) == 0 ? 0 : -ENOMEM;
}

/* "failure": the finished document and the task's exception text (section 3's carrier). */
static int write_failure(const finish_t *x, tsp_json_writer_t *w, char *err, size_t errlen)
{
    char *req = NULL, *rep = NULL, *doc = NULL, *b64 = NULL, *msg = NULL;
    size_t rlen = 0;
    int type = 0;
    int rc = failure_request(x, &req, &rlen);
    if (!rc)
        rc = call(tsp_failure_report, req, rlen, &rep, err, errlen);
    if (!rc)
        rc = tsp_json_get(rep, strlen(rep), "document", &doc, &type);
    size_t dlen = doc ? strlen(doc) : 0;
    if (!rc && !(b64 = malloc(4 * ((dlen + 2) / 3) + 1)))
        rc = -ENOMEM;
    if (!rc) {
        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)doc, (int)dlen);
        msg = fmt("torchspark node %d on host %s: the agent exited with status %d\n%s%s\n",
                  x->node_rank, x->host ? x->host : "?", x->status, CARRIER, b64);
        rc = msg ? 0 : -ENOMEM;
    }
    if (!rc) {
        tsp_json_key(w, "failure");
        tsp_json_begin_object(w);
        tsp_json_key(w, "document");
        (void)tsp_json_value(w, doc, dlen);
        put_str(w, "message", msg);
        tsp_json_end(w);
    }
    free(req), free(rep), free(doc), free(b64), free(msg);
    return rc;
}

/* What became of rank 0's output, from its status document: 1 "delivered", 2 "refused"
 * (over spark.driver.maxResultSize: the driver raises its own sentence, and collect() would
 * carry the bytes past the same bound), 0 "failed" or unreadable, whose sentence goes to
 * "log"; -ENOMEM. */
static int delivered(const char *output, tsp_json_writer_t *w)
{
    char *path = NULL, *text = NULL, *outcome = NULL, *why = NULL, *line = NULL;
    size_t tlen = 0;
    int type = 0, ok = 0;
    if (!(path = fmt("%s.status", output)))
        return -ENOMEM;
    errno = 0;
    text = tsp__report_slurp(path, &tlen);
    if (!text || tsp_json_check(text, tlen) != 0) {
        int e = errno;
        line = fmt("torchspark: the output status %s cannot be read (%s): rank 0's result "
                   "counts as not delivered",
                   path,
                   text ? "not JSON"
                   : e  ? strerror(e)
                        : "too large");
    } else if (tsp_json_get(text, tlen, "output", &outcome, &type) == 0 &&
               type == TSP_JSON_STRING && strcmp(outcome, "delivered") == 0) {
        ok = 1;
    } else if (outcome && type == TSP_JSON_STRING && strcmp(outcome, "refused") == 0) {
        ok = 2;
    } else if (outcome && type == TSP_JSON_STRING && strcmp(outcome, "failed") == 0) {
        (void)tsp_json_get(text, tlen, "error", &why, &type);
        line = fmt("torchspark: the output status %s says the transfer failed: %s", path,
                   why ? why : "null");
    } else {
        line = fmt("torchspark: the output status %s holds no outcome (\"output\": \"delivered\", "
                   "\"refused\" or \"failed\"): rank 0's result counts as not delivered",
                   path);
    }
    if (line)
        tsp_json_str(w, line);
    free(path), free(text), free(outcome), free(why), free(line);
    return ok;
}

/* "result", "missing" and "log" of an agent that succeeded. */
static void write_result(const finish_t *x, tsp_json_writer_t *w)
{
    struct stat st;
    int exists = stat(x->output, &st) == 0;
    const char *result = NULL;
    tsp_json_key(w, "log");
    tsp_json_begin_array(w);
    if (x->ship && delivered(x->output, w) <= 0) {
        tsp_json_str(w, "torchspark: rank 0's result did not reach the driver over the output "
                        "channel; sending it through collect() instead");
        result = exists ? x->output : NULL;
    } else if (!x->ship && x->collect) {
        result = exists ? x->output : NULL;
    }
    tsp_json_end(w);
    put_str(w, "result", result);
    write_bool(w, "missing", !x->ship && x->collect && !exists);
}

int tsp_task_finish(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                    char *err, size_t errlen)
{
    tsp_jreq_t r;
    if (tsp_jreq_init(&r, NULL, "the task request", request, len, err, errlen) != 0)
        return -EINVAL;
    finish_t x = {0};
    tsp_json_reply_t rp;
    int rc = read_finish(&r, &x);
    if (!rc && !(rc = tsp_json_reply_open(&rp))) {
        if (x.status != 0) {
            rc = write_failure(&x, &rp.w, err, errlen);
            put_str(&rp.w, "result", NULL);
            write_bool(&rp.w, "missing", 0);
            tsp_json_key(&rp.w, "log");
            tsp_json_begin_array(&rp.w);
            tsp_json_end(&rp.w);
        } else {
            put_str(&rp.w, "failure", NULL);
            write_result(&x, &rp.w);
        }
        rc = tsp_json_reply_close(&rp, rc, out, outlen, needed);
    }
    free(x.error), free(x.output), free(x.host), free(x.tail);
    return rc;
}
