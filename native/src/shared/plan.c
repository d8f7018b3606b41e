/* plan.c: the node plan -> the agent's options (torchspark/plan.h, docs/protocol.md §7).
 * Pure: the plan holds every value (the glue resolves the environment: the interpreter,
 * the NCCL library), this file only spells the command line. */
#include "torchspark/plan.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "util.h"

typedef struct {
    const char *doc;
    size_t len;
    char *err;
    size_t errlen;
} plan_t;

/* The value at key: 1 with *out (malloc'ed) when present and not null, 0 when absent or
 * null, -EINVAL (err set) when its kind is not want. */
static int get(const plan_t *p, const char *key, int want, const char *what, char **out)
{
    int type;
    *out = NULL;
    int rc = tsp_json_get(p->doc, p->len, key, out, &type);
    if (rc == -ENOENT)
        return 0;
    if (rc) {
        (void)tsp__err(p->err, p->errlen, rc, "the node plan is not a JSON object");
        return rc < 0 ? rc : -EINVAL;
    }
    if (type == TSP_JSON_LITERAL && strcmp(*out, "null") == 0) {
        free(*out);
        *out = NULL;
        return 0;
    }
    if (type != want) {
        free(*out);
        *out = NULL;
        (void)tsp__err(p->err, p->errlen, -EINVAL, "the node plan's \"%s\" must be %s", key, what);
        return -EINVAL;
    }
    return *out ? 1 : -ENOMEM;
}

static int get_str(const plan_t *p, const char *key, int required, char **out)
{
    int rc = get(p, key, TSP_JSON_STRING, "a string", out);
    if (rc == 0 && required)
        return tsp__err(p->err, p->errlen, -EINVAL, "the node plan has no \"%s\" (a string)", key);
    return rc < 0 ? rc : 0;
}

/* A whole number >= min; dflt when absent. */
static int get_int(const plan_t *p, const char *key, int min, int dflt, int *v)
{
    char *s;
    int rc = get(p, key, TSP_JSON_NUMBER, "a whole number", &s);
    if (rc <= 0) {
        *v = dflt;
        return rc;
    }
    rc = tsp__parse_int(s, v);
    free(s);
    if (rc || *v < min)
        return tsp__err(p->err, p->errlen, -EINVAL,
                        "the node plan's \"%s\" must be a whole number >= %d", key, min);
    return 0;
}

static int get_seconds(const plan_t *p, const char *key, double *v)
{
    char *s;
    int rc = get(p, key, TSP_JSON_NUMBER, "a number of seconds", &s);
    *v = 0;
    if (rc <= 0)
        return rc;
    *v = strtod(s, NULL);
    free(s);
    return *v >= 0 ? 0
                   : tsp__err(p->err, p->errlen, -EINVAL,
                              "the node plan's \"%s\" must be a number of seconds >= 0", key);
}

static int get_bool(const plan_t *p, const char *key, int *v)
{
    char *s;
    int rc = get(p, key, TSP_JSON_LITERAL, "true or false", &s);
    *v = 0;
    if (rc <= 0)
        return rc;
    *v = strcmp(s, "true") == 0;
    rc = *v || strcmp(s, "false") == 0
             ? 0
             : tsp__err(p->err, p->errlen, -EINVAL, "the node plan's \"%s\" must be true or false",
                        key);
    free(s);
    return rc;
}

typedef struct {
    char *agent, *gpus, *nccl_lib, *master_addr, *run_id, *python, *error_file, *log_endpoint,
        *output_file, *warm_socket;
    int standalone, nnodes, node_rank, nproc, master_port, nccl_port, no_python;
    double nccl_check, shutdown_timeout;
} fields_t;

static void fields_free(fields_t *f)
{
    char **s[] = {&f->agent,  &f->gpus,       &f->nccl_lib,     &f->master_addr, &f->run_id,
                  &f->python, &f->error_file, &f->log_endpoint, &f->output_file, &f->warm_socket};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        free(*s[i]);
        *s[i] = NULL;
    }
}

static int read_fields(const plan_t *p, fields_t *f)
{
    int rc;
    if ((rc = tsp_json_check_object(p->doc, p->len)) != 0)
        return tsp__err(p->err, p->errlen, rc, "the node plan is not a JSON object");
    if ((rc = get_str(p, "agent", 1, &f->agent)) ||
        (rc = get_bool(p, "standalone", &f->standalone)) ||
        (rc = get_int(p, "nnodes", 1, 1, &f->nnodes)) ||
        (rc = get_int(p, "node_rank", 0, 0, &f->node_rank)) ||
        (rc = get_int(p, "nproc_per_node", 1, 1, &f->nproc)) ||
        (rc = get_str(p, "gpus", 0, &f->gpus)) ||
        (rc = get_seconds(p, "nccl_check", &f->nccl_check)) ||
        (rc = get_str(p, "nccl_lib", 0, &f->nccl_lib)) ||
        (rc = get_int(p, "nccl_port", 0, 0, &f->nccl_port)) ||
        (rc = get_str(p, "master_addr", 0, &f->master_addr)) ||
        (rc = get_int(p, "master_port", 0, 0, &f->master_port)) ||
        (rc = get_str(p, "run_id", 0, &f->run_id)) || (rc = get_str(p, "python", 0, &f->python)) ||
        (rc = get_bool(p, "no_python", &f->no_python)) ||
        (rc = get_str(p, "error_file", 1, &f->error_file)) ||
        (rc = get_seconds(p, "shutdown_timeout", &f->shutdown_timeout)) ||
        (rc = get_str(p, "log_endpoint", 0, &f->log_endpoint)) ||
        (rc = get_str(p, "output_file", 0, &f->output_file)) ||
        (rc = get_str(p, "warm_socket", 0, &f->warm_socket)))
        return rc;
    if (f->master_addr && (f->master_port < 1 || f->master_port > 65535))
        return tsp__err(p->err, p->errlen, -EINVAL,
                        "the node plan's \"master_port\" must be a port (1-65535) with "
                        "\"master_addr\"");
    if (!f->no_python && !f->python)
        return tsp__err(p->err, p->errlen, -EINVAL,
                        "the node plan needs \"python\" (the workers' interpreter) unless "
                        "\"no_python\" is true");
    return 0;
}

/* One option: "--name=value" (value formatted), or "--name" then value as its own entry. */
static void opt(tsp_json_writer_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void opt(tsp_json_writer_t *w, const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    tsp_json_str(w, buf);
}

/* The options in the order docs/protocol.md §7 gives. */
static void write_argv(tsp_json_writer_t *w, const fields_t *f)
{
    tsp_json_begin_array(w);
    tsp_json_str(w, f->agent);
    if (f->standalone)
        tsp_json_str(w, "--standalone");
    opt(w, "--nnodes=%d", f->nnodes);
    opt(w, "--node-rank=%d", f->node_rank);
    if (f->gpus) { /* one worker per GPU of Spark's addresses, assigned by the agent */
        tsp_json_str(w, "--nproc-per-node=gpu");
        opt(w, "--gpus=%s", f->gpus);
    } else {
        opt(w, "--nproc-per-node=%d", f->nproc);
    }
    if (f->nccl_check > 0) {
        opt(w, "--nccl-check=%g", f->nccl_check);
        if (f->nccl_lib)
            opt(w, "--nccl-lib=%s", f->nccl_lib);
    }
    if (f->master_addr) {
        opt(w, "--master-addr=%s", f->master_addr);
        opt(w, "--master-port=%d", f->master_port);
    }
    if (f->nccl_port > 0)
        opt(w, "--nccl-comm-port=%d", f->nccl_port);
    if (f->run_id)
        opt(w, "--rdzv-id=%s", f->run_id);
    if (f->no_python) {
        tsp_json_str(w, "--no-python");
    } else {
        tsp_json_str(w, "--python");
        tsp_json_str(w, f->python);
    }
    tsp_json_str(w, "--error-file");
    tsp_json_str(w, f->error_file);
    opt(w, "--shutdown-timeout=%g", f->shutdown_timeout);
    if (f->log_endpoint) {
        tsp_json_str(w, "--log-endpoint");
        tsp_json_str(w, f->log_endpoint);
    } else { /* the agent's own output carries the lines with the users' one prefix */
        tsp_json_str(w, "--tee=3");
        tsp_json_str(w, "--log-line-prefix-template=[rank ${rank}] ");
    }
    if (f->output_file) {
        tsp_json_str(w, "--output-file");
        tsp_json_str(w, f->output_file);
    }
    if (f->warm_socket) {
        tsp_json_str(w, "--warm-socket");
        tsp_json_str(w, f->warm_socket);
    }
    tsp_json_end(w);
}

int tsp_plan_argv(const char *plan, size_t len, char *out, size_t outlen, size_t *needed, char *err,
                  size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    plan_t p = {plan, len, err, errlen};
    fields_t f = {0};
    int rc = read_fields(&p, &f);
    char *doc = NULL;
    size_t dlen = 0;
    if (!rc) {
        FILE *mf = open_memstream(&doc, &dlen);
        if (!mf) {
            rc = -ENOMEM;
        } else {
            tsp_json_writer_t w;
            tsp_json_writer_init(&w, mf);
            write_argv(&w, &f);
            rc = fclose(mf) == 0 ? 0 : -ENOMEM;
        }
    }
    if (!rc)
        rc = tsp__reply_copy(doc, dlen, out, outlen, needed);
    free(doc);
    fields_free(&f);
    return rc;
}
