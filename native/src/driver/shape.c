/* shape.c: the run's shape (docs/protocol.md 11.1): how many tasks a run has and how many
 * training processes each runs, from the user's numbers and Spark's GPU settings, for both
 * glues. Each product keeps its own API's rules and sentences: the PySpark glue's are stock
 * TorchDistributor's (tests compare them word for word), the JVM builder's its own. Pure;
 * golden cases: tests/contracts/shape.json. */
#include "torchspark/shape.h"

#include "jreq.h"
#include "json.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TASK_KEY "spark.task.resource.gpu.amount"
#define DRIVER_KEY "spark.driver.resource.gpu.amount"
#define BIG 1e15 /* an amount beyond this is no number of GPUs (and fits a long long) */

typedef struct {
    int java; /* TorchSparkRunner (else TorchDistributor) */
    long long np, nproc;
    int use_gpu, local_mode, driver_gpu;
    char *task_amount, *driver_amount; /* as the conf holds them, NULL: unset */
    char *driver_gpus;                 /* the driver's GPU addresses (a JSON array), or NULL */
} shape_req_t;

typedef struct {
    long long tasks, processes, per_task;
    char warning[400];
} shape_t;

/* A conf value as a finite number (spaces around it allowed, as float() and
 * Double.parseDouble take it): 0, or -EINVAL. */
static int conf_number(const char *s, double *x)
{
    char *end = NULL;
    errno = 0;
    *x = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(*x) || *x > BIG || *x < -BIG)
        return -EINVAL;
    return end[strspn(end, " \t\n")] == '\0' ? 0 : -EINVAL;
}

/* TorchDistributor with GPUs, distributed: whole GPUs per task (SPARK-41916's rules). */
static int py_tasks_gpu(const shape_req_t *q, shape_t *s, char *err, size_t errlen)
{
    const char *raw = q->task_amount ? q->task_amount : "0";
    double x = 0;
    if (conf_number(raw, &x) != 0)
        return tsp__err(err, errlen, -EINVAL,
                        "'" TASK_KEY "' is '%s', not a number: set it to the whole number of "
                        "GPUs each training task uses",
                        raw);
    if ((x > 0 && x < 1) || x != (double)(long long)x)
        /* PySpark crashes here with a bare int() error; say what is wrong. */
        return tsp__err(err, errlen, -EINVAL,
                        "'" TASK_KEY "' is %s, but TorchDistributor needs whole GPUs per task "
                        "(several tasks sharing one GPU cannot each run a training process on "
                        "it): set '" TASK_KEY "' to 1 or another whole number",
                        raw);
    long long per = (long long)x;
    if (per < 1)
        return tsp__err(err, errlen, -EINVAL,
                        "'" TASK_KEY "' was unset, so gpu usage is unavailable.");
    if (per > 1 && q->np % per != 0)
        return tsp__err(err, errlen, -EINVAL,
                        "TorchDistributor 'num_processes' value (%lld) must be a multiple of "
                        "'" TASK_KEY "' (%lld) value.",
                        q->np, per);
    s->tasks = q->np / per;
    s->per_task = per;
    return 0;
}

/* TorchDistributor with GPUs in local mode: the driver's GPUs bound the processes. */
static int py_local_gpu(const shape_req_t *q, shape_t *s, char *err, size_t errlen)
{
    const char *raw = q->driver_amount ? q->driver_amount : "0";
    char *end = NULL;
    if (!q->driver_gpu)
        return tsp__err(err, errlen, -EINVAL, "GPUs were unable to be found on the driver.");
    errno = 0;
    long long have = strtoll(raw, &end, 10);
    if (end == raw || errno == ERANGE || end[strspn(end, " \t\n")] != '\0')
        return tsp__err(err, errlen, -EINVAL,
                        "'" DRIVER_KEY "' is '%s', not a whole number: set it to the number of "
                        "GPUs of the driver",
                        raw);
    if (have == 0)
        return tsp__err(err, errlen, -EINVAL,
                        "GPU resources were not configured properly on the driver.");
    if (s->processes > have) {
        snprintf(s->warning, sizeof s->warning,
                 "'num_processes' cannot be set to a value greater than the number of "
                 "available GPUs on the driver, which is %lld. 'num_processes' was reset to be "
                 "equal to the number of available GPUs.",
                 have);
        s->processes = have;
    }
    s->tasks = s->processes;
    return 0;
}

/* TorchSparkRunner: nprocPerNode, else with GPUs the task's GPUs rounded (unset: 1); local
 * mode with GPUs needs the driver's (null: the glue has no SparkContext to ask). */
static int java_shape(const shape_req_t *q, shape_t *s, char *err, size_t errlen)
{
    long long per = q->nproc;
    if (q->local_mode && q->use_gpu && !q->driver_gpus) /* none known: no SparkContext */
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: local mode with useGpu runs on the driver's GPUs, which come "
                        "from its SparkContext: pass it to run(), with " DRIVER_KEY " and "
                        "spark.driver.resource.gpu.discoveryScript set");
    if (q->local_mode) { /* one node on the driver */
        s->tasks = 1;
        s->per_task = s->processes = per > 0 ? per : q->np;
        return 0;
    }
    if (q->use_gpu && per == 0) {
        const char *raw = q->task_amount ? q->task_amount : "1";
        double x = 0;
        if (conf_number(raw, &x) != 0)
            return tsp__err(err, errlen, -EINVAL,
                            "torchspark: " TASK_KEY " is '%s', not a number: set it to the whole "
                            "number of GPUs each task uses",
                            raw);
        per = (long long)(x + 0.5); /* Math.round (below 1: 1) */
    }
    per = per > 1 ? per : 1;
    if (q->np % per != 0)
        return tsp__err(err, errlen, -EINVAL,
                        "numProcesses (%lld) must be a multiple of the processes per task (%lld)",
                        q->np, per);
    s->tasks = q->np / per;
    s->per_task = per;
    return 0;
}

static int read_req(const tsp_jreq_t *r, shape_req_t *q)
{
    char *product = NULL;
    int nproc = 0;
    int rc = tsp_jreq_str(r, "product", 1, &product);
    if (!rc && strcmp(product, "TorchSparkRunner") != 0 && strcmp(product, "TorchDistributor") != 0)
        rc = tsp__err(r->err, r->errlen, -EINVAL,
                      "the shape request's \"product\" must be TorchDistributor or "
                      "TorchSparkRunner, got %s",
                      product);
    q->java = !rc && strcmp(product, "TorchSparkRunner") == 0;
    free(product);
    if (rc ||
        (rc = tsp_jreq_num(r, "num_processes", -1000000000LL, 1000000000LL, "a whole number",
                           &q->np)) ||
        (rc = tsp_jreq_int(r, "nproc_per_node", 0, &nproc)) ||
        (rc = tsp_jreq_bool(r, "use_gpu", &q->use_gpu)) ||
        (rc = tsp_jreq_bool(r, "local_mode", &q->local_mode)) ||
        (rc = tsp_jreq_bool(r, "driver_gpu", &q->driver_gpu)) ||
        (rc = tsp_jreq_str(r, "task_gpu_amount", 0, &q->task_amount)))
        return rc;
    q->nproc = nproc;
    if ((rc = tsp_jreq_str(r, "driver_gpu_amount", 0, &q->driver_amount)))
        return rc;
    rc = tsp_jreq_get(r, "driver_gpus", TSP_JSON_ARRAY, "an array of strings or null",
                      &q->driver_gpus);
    return rc < 0 ? rc : 0;
}

/* A walk of the driver's GPU addresses: into text as the product's error shows them
 * (Python's list repr '0', '1' or Java's Arrays.toString 0, 1, without brackets), counted
 * (n), and the first take of them written to w (the reply's "gpus") when w is given. */
typedef struct {
    FILE *text;
    tsp_json_writer_t *w;
    int java;
    long long n, take;
} gpus_t;

static int each_gpu(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    gpus_t *g = ctx;
    (void)key;
    if (type != TSP_JSON_STRING)
        return -EINVAL;
    fprintf(g->text, "%s%s%.*s%s", index ? ", " : "", g->java ? "" : "'", (int)len, val,
            g->java ? "" : "'");
    if (g->w && (long long)index < g->take)
        tsp_json_str(g->w, val);
    g->n++;
    return 0;
}

static int walk_gpus(const shape_req_t *q, gpus_t *g, char **text, size_t *tlen, char *err,
                     size_t errlen)
{
    g->text = open_memstream(text, tlen);
    if (!g->text)
        return -ENOMEM;
    int rc = tsp_json_each(q->driver_gpus, strlen(q->driver_gpus), NULL, each_gpu, g);
    if (fclose(g->text) != 0)
        rc = rc ? rc : -ENOMEM;
    if (rc == -EINVAL)
        tsp__err(err, errlen, rc,
                 "the shape request's \"driver_gpus\" must be an array of strings");
    return rc;
}

/* The driver's GPUs a run on the driver uses: a TorchDistributor's local master job every one
 * (each task takes its own of them; fewer than tasks x per task is an error), its local mode
 * the first of its processes; a TorchSparkRunner's local mode the first of its processes
 * (fewer is an error). */
static int check_gpus(const shape_req_t *q, const shape_t *s, long long *take, char *err,
                      size_t errlen)
{
    gpus_t g = {.java = q->java};
    char *text = NULL;
    size_t tlen = 0;
    int rc = walk_gpus(q, &g, &text, &tlen, err, errlen);
    long long need = q->java || q->local_mode ? s->processes : s->tasks * s->per_task;
    *take = q->local_mode ? (need < g.n ? need : g.n) : g.n;
    if (!rc && q->java && g.n < need)
        rc = tsp__err(err, errlen, -EINVAL,
                      "torchspark: local mode with useGpu runs %lld process(es), one per GPU, but "
                      "the driver has %lld GPU(s): [%s]; lower numProcesses or raise " DRIVER_KEY,
                      need, g.n, text);
    else if (!rc && !q->local_mode && g.n < need)
        rc = tsp__err(
            err, errlen, -EINVAL,
            "torchspark: %lld tasks \xc3\x97 %lld GPU(s) need %lld driver GPUs, but the driver "
            "has %lld: [%s]; lower num_processes or raise " DRIVER_KEY,
            s->tasks, s->per_task, need, g.n, text);
    free(text);
    return rc;
}

static int write_reply(const shape_req_t *q, const shape_t *s, tsp_json_writer_t *w, char *err,
                       size_t errlen)
{
    long long take = 0;
    int rc = q->driver_gpus ? check_gpus(q, s, &take, err, errlen) : 0;
    if (rc)
        return rc;
    tsp_json_key(w, "tasks");
    tsp_json_int(w, s->tasks);
    tsp_json_key(w, "processes");
    tsp_json_int(w, s->processes);
    tsp_json_key(w, "per_task");
    tsp_json_int(w, s->per_task);
    tsp_json_key(w, "warning");
    tsp_json_str(w, s->warning[0] ? s->warning : NULL);
    if (q->driver_gpus) {
        char *ignored = NULL;
        size_t ilen = 0;
        gpus_t g = {.w = w, .java = q->java, .take = take};
        tsp_json_key(w, "gpus");
        tsp_json_begin_array(w);
        rc = walk_gpus(q, &g, &ignored, &ilen, err, errlen);
        free(ignored);
        tsp_json_end(w);
    }
    return rc;
}

int tsp_shape_plan(const char *request, size_t len, char *out, size_t outlen, size_t *needed,
                   char *err, size_t errlen)
{
    tsp_jreq_t r;
    if (tsp_jreq_init(&r, NULL, "the shape request", request, len, err, errlen) != 0)
        return -EINVAL;
    shape_req_t q = {0};
    shape_t s = {0};
    tsp_json_reply_t rp;
    int rc = read_req(&r, &q);
    if (!rc) {
        s.tasks = s.processes = q.np;
        s.per_task = 1;
        if (q.java)
            rc = java_shape(&q, &s, err, errlen);
        else if (q.use_gpu)
            rc = q.local_mode ? py_local_gpu(&q, &s, err, errlen)
                              : py_tasks_gpu(&q, &s, err, errlen);
    }
    if (!rc && !(rc = tsp_json_reply_open(&rp)))
        rc =
            tsp_json_reply_close(&rp, write_reply(&q, &s, &rp.w, err, errlen), out, outlen, needed);
    free(q.task_amount);
    free(q.driver_amount);
    free(q.driver_gpus);
    return rc;
}
