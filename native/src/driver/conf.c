/* conf.c: the key table of every spark.torchspark.* setting and its grammars
 * (torchspark/conf.h, docs/protocol.md §9). No Spark: the glue hands over the strings it
 * read and gets typed values or one sentence back. The driver's environment switches that
 * stand for keys (TORCHSPARK_NCCL_CHECK, ...) are read here, once per request that asks for
 * them, so that no glue parses them. The grammars and the reading of one value against its
 * key are confvalue.c's; the key table, the request and the reply are here. */
#include "torchspark/conf.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "confvalue.h"
#include "jreq.h"
#include "json.h"
#include "util.h"

#define PREFIX "spark.torchspark."
#define CLOSEST_MAX 3 /* edit distance of a key that is "meant" */

/* The table: docs/distributor.md ("Settings") and docs/jvm.md list it; tests/e2e/test_conf.py
 * checks that they list every key with its default. */
static const conf_key_t KEYS[] = {
    {PREFIX "progress", T_BOOL, 0, "true", 0, 0, "true",
     "one live progress line on the driver's stderr (PySpark; keyword progress=)", NULL},
    {PREFIX "mlflow", T_BOOL, 0, "false", 0, 0, "true",
     "log each torchspark.report() to an MLflow run started for the job (PySpark)", NULL},
    {PREFIX "warmWorkers", T_BOOL, 0, "true", 0, 0, "false",
     "keep a warm worker pool on each executor between function-mode runs (PySpark)",
     "TORCHSPARK_WARM"},
    {PREFIX "warmWorkers.idleTimeout", T_DURATION, 1000, "300s", 0, 0, "300s",
     "how long a warm pool outlives its last run; 0: no pool", "TORCHSPARK_WARM_IDLE_TIMEOUT"},
    {PREFIX "ncclCheck", T_BOOL, 0, NULL, 0, 0, "true",
     "the NCCL preflight before training; unset: on for GPU jobs of more than one node",
     "TORCHSPARK_NCCL_CHECK"},
    {PREFIX "ncclCheck.timeout", T_DURATION, 1000, "180s", 1, 0, "180s",
     "the NCCL preflight's deadline", NULL},
    {PREFIX "hangTimeout", T_DURATION, 1000, NULL, 1, 0, "30min",
     "the hang doctor: no line or report from any rank for this long; unset: off "
     "(keyword hang_timeout=)",
     NULL},
    {PREFIX "hangAction", T_ENUM, 0, "report", 0, 0, "report|cancel",
     "what the hang doctor does after naming the stuck rank: report (go on) or cancel "
     "(keyword hang_action=)",
     NULL},
    {PREFIX "rendezvous", T_BOOL, 0, NULL, 0, 0, "false",
     "the driver's rendezvous for the election; unset: on, but off under Spark Connect unless "
     "the launch is a gang",
     "TORCHSPARK_RENDEZVOUS"},
    {PREFIX "encryption", T_BOOL, 0, "true", 0, 0, "false",
     "TLS 1.3 encryption of torchspark's own channel (lines, control, rank 0's output); false, "
     "for measurements on a trusted network only: the same authenticated handshake, then "
     "every frame MAC'ed and numbered but in clear",
     "TORCHSPARK_ENCRYPTION"},
    {PREFIX "job.maxRestarts", T_INT, 0, "0", 0, INT_MAX, "3",
     "how many times a failed distributed run is submitted again (keyword max_restarts=)", NULL},
    {PREFIX "job.minNodes", T_INT, 0, NULL, 1, INT_MAX, "2",
     "the fewest nodes a restarted attempt may run on; unset: every node (keyword "
     "min_nodes=)",
     NULL},
    {PREFIX "job.replacementTimeout", T_DURATION, 1000, "30s", 0, 0, "30s",
     "how long a restart waits for a replacement executor", NULL},
    {PREFIX "elastic.batch", T_ENUM, 0, "per_rank", 0, 0, "per_rank|global",
     "what an elastic run (min_nodes) keeps when its size changes: per_rank (each rank's "
     "batch) or global (the full size's global batch, split over the ranks there are: "
     "torchspark.checkpoint.batch_size)",
     NULL},
    {PREFIX "launch", T_ENUM, 0, "auto", 0, 0, "auto|barrier|gang",
     "how a distributed attempt starts: barrier (one barrier stage), gang (ordinary tasks "
     "that gang up through the driver; works with dynamic allocation) or auto (gang when "
     "spark.dynamicAllocation.enabled is true, else barrier)",
     NULL},
    {PREFIX "gang.timeout", T_DURATION, 1000, "600s", 1, 0, "120s",
     "gang launch: how long an attempt waits for all of its tasks to run at once before it "
     "fails (Spark's barrier slot check: 15s x 40)",
     NULL},
    {PREFIX "plugin.killGraceMs", T_DURATION, 1, "2000", 0, 0, "2000",
     "TorchSparkPlugin: TERM to KILL of a killed task's process tree (a bare number is "
     "milliseconds)",
     NULL},
    {PREFIX "preemption.grace", T_DURATION, 1000, "10s", 0, 0, "10s",
     "TorchSparkPlugin: how long a SIGTERM'd executor waits for its training processes to "
     "checkpoint on request before it stops; 0: no checkpoint on SIGTERM",
     NULL},
    {PREFIX "gpuResource", T_STRING, 0, "gpu", 0, 0, "gpu",
     "the Spark resource name of the GPUs a task holds", NULL},
};
_Static_assert(sizeof KEYS / sizeof KEYS[0] == NKEYS, "NKEYS (confvalue.h) is KEYS' length");

/* Spark's own security settings and the stock override keys: the request's "conf" may carry
 * them, and the reply's "encryption" says what a run does about them (docs/protocol.md §9,
 * "Where Spark encrypts"). The first NSPARK_SECURE secure Spark's traffic (spark.ssl.rpc.enabled:
 * Spark 4's TLS for RPC, beside the AES-based spark.network.crypto); the last two are
 * TorchDistributor's and DeepspeedTorchDistributor's ignoreSsl. */
static const char *const SPARK_KEYS[] = {
    "spark.ssl.enabled",
    "spark.ssl.rpc.enabled",
    "spark.network.crypto.enabled",
    "spark.authenticate",
    "spark.io.encryption.enabled",
    "pytorch.spark.distributor.ignoreSsl",
    "deepspeed.spark.distributor.ignoreSsl",
};
_Static_assert(sizeof SPARK_KEYS / sizeof SPARK_KEYS[0] == NSPARK,
               "NSPARK (confvalue.h) is SPARK_KEYS' length");
#define NSPARK_SECURE 5
/* Spark's, which resolves launch=auto in the reply (docs/protocol.md §9). */
#define DYNAMIC_KEY "spark.dynamicAllocation.enabled"

static int key_index(const char *key)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].key, key) == 0)
            return (int)i;
    return -1;
}

static const char *type_name(type_t t)
{
    static const char *const names[] = {"bool", "int", "duration", "enum", "string"};
    return names[t];
}

/* ---- one value ----------------------------------------------------------------------- */

static int read_value(reader_t *r, const conf_key_t *k, const char *v, int type)
{
    val_t *out = &r->vals[k - KEYS];
    int rc;
    switch (k->type) {
    case T_BOOL:
        rc = tsp__conf_read_bool(r, k, v, type, out);
        break;
    case T_INT:
        rc = tsp__conf_read_int(r, k, v, type, out);
        break;
    case T_DURATION:
        rc = tsp__conf_read_duration(r, k, v, type, out);
        break;
    case T_ENUM:
        rc = tsp__conf_read_enum(r, k, v, type, out);
        break;
    default:
        rc = tsp__conf_read_string(r, k, v, type, out);
        break;
    }
    if (rc == 0)
        out->set = 1;
    return rc;
}

/* ---- unknown keys -------------------------------------------------------------------- */

static void note_unknown(reader_t *r, const char *key)
{
    const char *closest = NULL;
    int best = CLOSEST_MAX + 1;
    for (size_t i = 0; i < NKEYS; i++) { /* a key too long for a distance is meant as none */
        int d = tsp__edit_distance(key, KEYS[i].key);
        if (d < best) {
            best = d;
            closest = KEYS[i].key;
        }
    }
    if (best > CLOSEST_MAX)
        closest = NULL;
    char msg[512];
    snprintf(msg, sizeof msg, "%.200s is not a torchspark setting and is ignored: %s%s%s", key,
             closest ? "did you mean " : "docs/distributor.md (\"Settings\") lists them",
             closest ? closest : "", closest ? "?" : "");
    tsp_json_begin_object(&r->uw);
    tsp_json_key(&r->uw, "key");
    tsp_json_str(&r->uw, key);
    tsp_json_key(&r->uw, "closest");
    tsp_json_str(&r->uw, closest);
    tsp_json_key(&r->uw, "message");
    tsp_json_str(&r->uw, msg);
    tsp_json_end(&r->uw);
}

/* ---- the request --------------------------------------------------------------------- */

static int conf_member(void *ctx, const char *key, const char *value, int type)
{
    reader_t *r = ctx;
    int i = key_index(key);
    for (size_t j = 0; j < NSPARK && i < 0; j++) {
        char buf[8] = "";
        if (strcmp(key, SPARK_KEYS[j]) == 0 && type == TSP_JSON_STRING &&
            tsp__conf_trim_lower(value, buf, sizeof buf) == 0)
            r->spark_on[j] = strcmp(buf, "true") == 0; /* Spark's getBoolean: else off */
    }
    char on[8] = "";
    if (strcmp(key, DYNAMIC_KEY) == 0 && type == TSP_JSON_STRING &&
        tsp__conf_trim_lower(value, on, sizeof on) == 0)
        r->dynamic = strcmp(on, "true") == 0;
    if (i < 0) {
        if (strncmp(key, PREFIX, strlen(PREFIX)) == 0)
            note_unknown(r, key);
        return 0; /* another key of Spark's: not ours */
    }
    if (type == TSP_JSON_LITERAL && strcmp(value, "null") == 0)
        return 0;
    if (type != TSP_JSON_STRING)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the settings request's conf value of %s must be a string", key);
    if (!*value)
        return 0; /* empty: as if unset */
    r->from_args = 0;
    return read_value(r, &KEYS[i], value, type);
}

static int arg_member(void *ctx, const char *key, const char *value, int type)
{
    reader_t *r = ctx;
    int i = key_index(key);
    if (i < 0 || type != TSP_JSON_OBJECT)
        return tsp__err(r->err, r->errlen, -EINVAL,
                        "the settings request's argument %.200s must be a key of the table "
                        "with an object {\"name\", \"value\"}",
                        key);
    char *name = NULL, *v = NULL;
    int nt = 0, vt = 0;
    size_t len = strlen(value);
    int rc = tsp_json_get(value, len, "name", &name, &nt);
    if (rc == -ENOENT || (rc == 0 && nt != TSP_JSON_STRING))
        rc = -EINVAL; /* the sentence names the argument by its name: it must have one */
    if (rc == 0) {
        rc = tsp_json_get(value, len, "value", &v, &vt);
        if (rc == -ENOENT || (rc == 0 && vt == TSP_JSON_LITERAL && strcmp(v, "null") == 0))
            rc = 1; /* not given */
    }
    if (rc == 1) {
        rc = 0;
    } else if (rc == 0) {
        r->from_args = 1;
        r->name = name;
        rc = read_value(r, &KEYS[i], v, vt);
        r->name = NULL;
    } else if (rc != -ENOMEM) {
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the settings request's argument %.200s must have a string \"name\"", key);
    }
    free(name);
    free(v);
    return rc;
}

/* One environment switch (a key's env): its value read with the key's grammar, as a conf
 * string is (booleans also 1/0, yes/no, on/off); empty or blank is as if unset. A name
 * that no key has is ignored. */
static int env_member(void *ctx, const char *name, const char *value, int type)
{
    reader_t *r = ctx;
    for (size_t i = 0; i < NKEYS; i++) {
        if (!KEYS[i].env || strcmp(KEYS[i].env, name) != 0)
            continue;
        if (type != TSP_JSON_STRING)
            return tsp__err(r->err, r->errlen, -EINVAL,
                            "the settings request's env value of %s must be a string", name);
        if (!value[strspn(value, " \t\r\n")])
            return 0; /* empty or blank: as if unset */
        r->from_args = 0;
        r->env_name = name;
        int rc = read_value(r, &KEYS[i], value, type);
        r->env_name = NULL;
        return rc;
    }
    return 0;
}

/* "env": true: the switches of this process's environment (the driver's), read here once. */
static int env_process(reader_t *r)
{
    int rc = 0;
    for (size_t i = 0; i < NKEYS && rc == 0; i++) {
        const char *v = KEYS[i].env ? getenv(KEYS[i].env) : NULL;
        if (v)
            rc = env_member(r, KEYS[i].env, v, TSP_JSON_STRING);
    }
    return rc;
}

/* A member of the request's objects: key, and its value NUL-terminated (a string decoded;
 * any other value as its JSON text). */
typedef int (*member_fn)(void *ctx, const char *key, const char *value, int type);

typedef struct {
    reader_t *r;
    member_fn fn;
} each_ctx_t;

/* tsp_json_each's callback -> member_fn: a value that is not a string comes as JSON text
 * without its NUL; the members read it with tsp_json_get and strcmp, so it gets one. */
static int each_member(void *ctx, const char *key, size_t index, int type, const char *val,
                       size_t len)
{
    each_ctx_t *e = ctx;
    (void)index;
    if (type == TSP_JSON_STRING)
        return e->fn(e->r, key, val, type);
    char *v = strndup(val, len);
    if (!v)
        return -ENOMEM;
    int rc = e->fn(e->r, key, v, type);
    free(v);
    return rc;
}

/* The object at request's member (absent or null: nothing), each member through fn. */
static int each_of(reader_t *r, const char *req, size_t len, const char *member, member_fn fn)
{
    each_ctx_t e = {r, fn};
    char *sub = NULL;
    int type = 0;
    int rc = tsp_json_get(req, len, member, &sub, &type);
    if (rc == -ENOENT)
        return 0;
    if (rc == 0 && type == TSP_JSON_LITERAL && strcmp(sub, "null") == 0)
        rc = 0;
    else if (rc == 0 && type == TSP_JSON_OBJECT)
        rc = tsp_json_each(sub, strlen(sub), NULL, each_member, &e);
    else if (rc != -ENOMEM)
        rc = tsp__err(r->err, r->errlen, -EINVAL, "the settings request's \"%s\" must be an object",
                      member);
    free(sub);
    return rc;
}

/* The request's "env": an object of variables (contracts, tests), or true for this process's
 * own environment (the glues); absent, null or false: none. Last, so a switch wins. */
static int read_env(reader_t *r, const char *req, size_t len)
{
    char *sub = NULL;
    int type = 0;
    int rc = tsp_json_get(req, len, "env", &sub, &type);
    int process = rc == 0 && type == TSP_JSON_LITERAL && strcmp(sub, "true") == 0;
    int none = rc == -ENOENT || (rc == 0 && type == TSP_JSON_LITERAL &&
                                 (!strcmp(sub, "null") || !strcmp(sub, "false")));
    free(sub);
    if (none)
        return 0;
    if (process)
        return env_process(r);
    if (rc == 0 && type == TSP_JSON_OBJECT)
        return each_of(r, req, len, "env", env_member);
    return rc == -ENOMEM ? rc
                         : tsp__err(r->err, r->errlen, -EINVAL,
                                    "the settings request's \"env\" must be an object or true");
}

static void write_values(tsp_json_writer_t *w, reader_t *r)
{
    tsp_json_key(w, "values");
    tsp_json_begin_object(w);
    for (size_t i = 0; i < NKEYS; i++) {
        const val_t *v = &r->vals[i];
        tsp_json_key(w, KEYS[i].key);
        if (!v->set) {
            tsp_json_null(w);
        } else if (KEYS[i].type == T_BOOL) {
            (void)tsp_json_value(w, v->num ? "true" : "false", v->num ? 4 : 5);
        } else if (KEYS[i].type == T_ENUM) {
            char word[32];
            snprintf(word, sizeof word, "%.*s", (int)strcspn(v->word, "|"), v->word);
            if (strcmp(KEYS[i].key, PREFIX "launch") == 0 && strcmp(word, "auto") == 0)
                snprintf(word, sizeof word, "%s", r->dynamic ? "gang" : "barrier");
            tsp_json_str(w, word);
        } else if (KEYS[i].type == T_STRING) {
            tsp_json_str(w, v->str);
        } else {
            tsp_json_int(w, v->num);
        }
    }
    tsp_json_end(w);
}

/* The reply's "encryption": whether the run may go on (always: torchspark's own channel is
 * TLS 1.3 whatever Spark does, so stock's refusal of TLS clusters has no reason here) and the
 * one line a glue logs before a distributed run, at its level. */
static void write_encryption(tsp_json_writer_t *w, const reader_t *r)
{
    static const char ENCRYPTED[] = "torchspark's own channel to the driver (worker lines, "
                                    "control, rank 0's output) is TLS 1.3 keyed by the run's "
                                    "secret";
    static const char CLEAR[] =
        "torchspark's own channel to the driver (worker lines, control, rank 0's output) is "
        "authenticated but NOT encrypted (spark.torchspark.encryption=false: the TLS 1.3 "
        "handshake, then every frame MAC'ed and numbered, in clear): use this on a trusted "
        "network only";
    const val_t *enc = &r->vals[key_index(PREFIX "encryption")];
    int clear = enc->set && !enc->num;
    const char *channel = clear ? CLEAR : ENCRYPTED;
    char on[256] = "", msg[1024];
    size_t at = 0;
    for (size_t j = 0; j < NSPARK_SECURE; j++)
        if (r->spark_on[j])
            at += (size_t)snprintf(on + at, sizeof on - at, "%s%s=true", at ? ", " : "",
                                   SPARK_KEYS[j]);
    if (at)
        at = (size_t)snprintf(msg, sizeof msg,
                              "Spark secures its own traffic here (%s); %s, but torch's own data "
                              "plane (the TCPStore, gloo and NCCL collectives) is encrypted "
                              "neither by torchspark nor by Spark: see docs/security.md, \"What "
                              "torchspark does not encrypt\"",
                              on, channel);
    else
        at = (size_t)snprintf(msg, sizeof msg, "%s", channel);
    for (size_t j = NSPARK_SECURE; j < NSPARK; j++)
        if (r->spark_on[j] && at < sizeof msg)
            at += (size_t)snprintf(msg + at, sizeof msg - at,
                                   " (%s=true is accepted for compatibility and changes nothing%s)",
                                   SPARK_KEYS[j],
                                   clear ? ""
                                         : ": torchspark sends nothing in clear over its "
                                           "own channel");
    tsp_json_key(w, "encryption");
    tsp_json_begin_object(w);
    tsp_json_key(w, "proceed");
    (void)tsp_json_value(w, "true", 4);
    tsp_json_key(w, "spark");
    tsp_json_begin_array(w);
    for (size_t j = 0; j < NSPARK_SECURE; j++)
        if (r->spark_on[j])
            tsp_json_str(w, SPARK_KEYS[j]);
    tsp_json_end(w);
    tsp_json_key(w, "level");
    tsp_json_str(w, on[0] || clear ? "WARNING" : "INFO");
    tsp_json_key(w, "message");
    tsp_json_str(w, msg);
    tsp_json_end(w);
}

/* The request's "run" ({"nodes", "gpu"}: the run the values are read for; absent or null:
 * none, r->nodes stays 0). */
static int read_run(reader_t *r, const char *req, size_t len)
{
    char *run = NULL;
    tsp_jreq_t q = {req, len, "the settings request", r->err, r->errlen};
    int rc =
        tsp_jreq_get(&q, "run", TSP_JSON_OBJECT, "an object {\"nodes\", \"gpu\"} or null", &run);
    if (rc == 1) {
        tsp_jreq_t in = {run, strlen(run), "the settings request's run", r->err, r->errlen};
        r->nodes = 1;
        if ((rc = tsp_jreq_num(&in, "nodes", 1, INT_MAX, "a whole number >= 1", &r->nodes)) == 0)
            rc = tsp_jreq_bool(&in, "gpu", &r->gpu);
    }
    free(run);
    return rc < 0 ? rc : 0;
}

/* The reply's "run": what the values decide for the request's run, so that no glue does
 * (docs/protocol.md section 9, "For a run"): the NCCL preflight's deadline (GPU runs only; on
 * when ncclCheck is true, or unset and the run has more than one node; 0: off) and how long
 * the warm worker pools outlive their last run (0: no pool). */
static void write_run(tsp_json_writer_t *w, const reader_t *r)
{
    const val_t *check = &r->vals[key_index(PREFIX "ncclCheck")];
    const val_t *warm = &r->vals[key_index(PREFIX "warmWorkers")];
    int on = r->gpu && (check->set ? check->num != 0 : r->nodes > 1);
    tsp_json_key(w, "run");
    if (!r->nodes) {
        tsp_json_null(w);
        return;
    }
    tsp_json_begin_object(w);
    long long check_ms = on ? r->vals[key_index(PREFIX "ncclCheck.timeout")].num : 0;
    long long idle_ms = warm->num ? r->vals[key_index(PREFIX "warmWorkers.idleTimeout")].num : 0;
    tsp_json_key(w, "nccl_check_s"); /* seconds, to the millisecond */
    tsp_json_fixed(w, (double)check_ms / 1000, 3);
    tsp_json_key(w, "warm_idle_s");
    tsp_json_fixed(w, (double)idle_ms / 1000, 3);
    tsp_json_end(w);
}

/* The reply copied into out: the values, then the unknown keys' array as written. */
static int read_request(reader_t *r, const char *req, size_t len, char *out, size_t outlen,
                        size_t *needed)
{
    char *unk = NULL;
    size_t ulen = 0;
    if (!(r->unknown = open_memstream(&unk, &ulen)))
        return -ENOMEM;
    tsp_json_writer_init(&r->uw, r->unknown);
    tsp_json_begin_array(&r->uw);
    int rc = 0;
    for (size_t i = 0; i < NKEYS && rc == 0; i++) { /* the defaults first */
        r->from_args = 0;
        if (KEYS[i].dflt)
            rc = read_value(r, &KEYS[i], KEYS[i].dflt, TSP_JSON_STRING);
    }
    if (rc == 0 && tsp_json_check_object(req, len))
        rc = tsp__err(r->err, r->errlen, -EINVAL, "the settings request is not a JSON object");
    if (rc == 0)
        rc = each_of(r, req, len, "conf", conf_member);
    if (rc == 0)
        rc = each_of(r, req, len, "args", arg_member);
    if (rc == 0)
        rc = read_env(r, req, len);
    if (rc == 0)
        rc = read_run(r, req, len);
    tsp_json_end(&r->uw);
    if (fclose(r->unknown) && rc == 0)
        rc = -ENOMEM;
    tsp_json_reply_t rp;
    if (rc == 0 && (rc = tsp_json_reply_open(&rp)) == 0) {
        write_values(&rp.w, r);
        tsp_json_key(&rp.w, "unknown");
        rc = tsp_json_value(&rp.w, unk, ulen);
        write_encryption(&rp.w, r);
        write_run(&rp.w, r);
        rc = tsp_json_reply_close(&rp, rc, out, outlen, needed);
    }
    free(unk);
    return rc;
}

int tsp_conf_read(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                  char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    reader_t r;
    memset(&r, 0, sizeof r);
    r.err = err;
    r.errlen = errlen;
    int rc = request ? read_request(&r, request, len, out, outlen, needed) : -EINVAL;
    for (size_t i = 0; i < NKEYS; i++)
        free(r.vals[i].str);
    return rc;
}

int tsp_conf_table(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                   char *err, size_t errlen)
{
    (void)request;
    (void)len;
    if (err && errlen)
        err[0] = 0;
    char *doc = NULL;
    size_t dlen = 0;
    FILE *mf = open_memstream(&doc, &dlen);
    if (!mf)
        return -ENOMEM;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, mf);
    tsp_json_begin_array(&w);
    for (size_t i = 0; i < NKEYS; i++) {
        tsp_json_begin_object(&w);
        tsp_json_key(&w, "key");
        tsp_json_str(&w, KEYS[i].key);
        tsp_json_key(&w, "type");
        tsp_json_str(&w, type_name(KEYS[i].type));
        tsp_json_key(&w, "default");
        tsp_json_str(&w, KEYS[i].dflt);
        tsp_json_key(&w, "doc");
        tsp_json_str(&w, KEYS[i].doc);
        tsp_json_key(&w, "env");
        tsp_json_str(&w, KEYS[i].env);
        tsp_json_end(&w);
    }
    tsp_json_end(&w);
    int rc = fclose(mf) == 0 ? 0 : -ENOMEM;
    if (rc == 0)
        rc = tsp__reply_copy(doc, dlen, out, outlen, needed);
    free(doc);
    return rc;
}
