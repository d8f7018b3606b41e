/* jreq.c: the one reader of a JSON request (jreq.h): typed getters over json.c's lookup,
 * one sentence per bad value. */
#include "jreq.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "util.h"

int tsp_jreq_init(tsp_jreq_t *r, const char *name, const char *who, const char *request, size_t len,
                  char *err, size_t errlen)
{
    *r = (tsp_jreq_t){request, len, who, err, errlen};
    if (err && errlen)
        err[0] = '\0';
    if (request && tsp_json_check_object(request, len) == 0)
        return 0;
    if (name)
        return tsp__err(err, errlen, -EINVAL, "%s: the request is not a JSON object", name);
    return tsp__err(err, errlen, -EINVAL, "%s is not a JSON object", who);
}

int tsp_jreq_get(const tsp_jreq_t *r, const char *key, int want, const char *what, char **out)
{
    int type = 0;
    *out = NULL;
    int rc = tsp_json_get(r->doc, r->len, key, out, &type);
    if (rc == -ENOENT)
        return 0;
    if (rc == -ENOMEM)
        return rc;
    if (rc) {
        (void)tsp__err(r->err, r->errlen, -EINVAL, "%s is not a JSON object", r->who);
        return -EINVAL;
    }
    if (!*out)
        return -ENOMEM;
    if (type == TSP_JSON_LITERAL && strcmp(*out, "null") == 0) {
        free(*out);
        *out = NULL;
        return 0;
    }
    if (type != want) {
        free(*out);
        *out = NULL;
        (void)tsp__err(r->err, r->errlen, -EINVAL, "%s's \"%s\" must be %s", r->who, key, what);
        return -EINVAL;
    }
    return 1;
}

int tsp_jreq_peek(const tsp_jreq_t *r, const char *key, int want, char **out)
{
    int type = 0;
    *out = NULL;
    int rc = tsp_json_get(r->doc, r->len, key, out, &type);
    if (rc == -ENOMEM || (rc == 0 && !*out))
        return -ENOMEM;
    if (rc == 0 && type == want)
        return 1;
    free(*out);
    *out = NULL;
    return 0;
}

int tsp_jreq_str(const tsp_jreq_t *r, const char *key, int required, char **out)
{
    int rc = tsp_jreq_get(r, key, TSP_JSON_STRING, "a string", out);
    if (rc == 0 && required)
        return tsp__err(r->err, r->errlen, -EINVAL, "%s has no \"%s\" (a string)", r->who, key);
    return rc < 0 ? rc : 0;
}

int tsp_jreq_bool(const tsp_jreq_t *r, const char *key, int *v)
{
    char *s;
    int rc = tsp_jreq_get(r, key, TSP_JSON_LITERAL, "true or false", &s);
    *v = rc > 0 && strcmp(s, "true") == 0;
    if (rc > 0 && !*v && strcmp(s, "false") != 0)
        rc = tsp__err(r->err, r->errlen, -EINVAL, "%s's \"%s\" must be true or false", r->who, key);
    free(s);
    return rc < 0 ? rc : 0;
}

/* The whole number of text s into *x when from lo to hi: 0, or -EINVAL. */
static int whole(const char *s, long long lo, long long hi, long long *x)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -EINVAL;
    *x = v;
    return 0;
}

int tsp_jreq_num(const tsp_jreq_t *r, const char *key, long long lo, long long hi, const char *what,
                 long long *v)
{
    char *s;
    int rc = tsp_jreq_get(r, key, TSP_JSON_NUMBER, what, &s);
    if (rc <= 0)
        return rc;
    rc = whole(s, lo, hi, v);
    free(s);
    return rc ? tsp__err(r->err, r->errlen, -EINVAL, "%s's \"%s\" must be %s", r->who, key, what)
              : 0;
}

int tsp_jreq_int(const tsp_jreq_t *r, const char *key, int neg, int *v)
{
    char *s;
    long long x = 0;
    int rc = tsp_jreq_get(r, key, TSP_JSON_NUMBER, "a whole number", &s);
    if (rc <= 0)
        return rc;
    rc = whole(s, neg ? -INT_MAX : 0, INT_MAX, &x);
    free(s);
    if (rc)
        return tsp__err(r->err, r->errlen, -EINVAL, "%s's \"%s\" must be a whole number%s", r->who,
                        key, neg ? "" : " >= 0");
    *v = (int)x;
    return 0;
}

int tsp_jreq_serve(const char *name, const char *who, const char *request, size_t len,
                   tsp_jreq_op_fn fn, void *ctx, char *out, size_t outlen, size_t *needed,
                   char *err, size_t errlen)
{
    tsp_jreq_t r;
    tsp_json_reply_t rp = {0};
    char *op = NULL;
    int rc = tsp_jreq_init(&r, name, who, request, len, err, errlen), oom = 0;
    if (rc)
        return rc;
    rc = tsp_jreq_str(&r, "op", 1, &op);
    if (rc == 0)
        rc = oom = tsp_json_reply_open(&rp);
    if (rc == 0)
        rc = fn(ctx, op, &r, &rp.w);
    int done = tsp_json_reply_close(&rp, rc, out, outlen, needed);
    if (oom || (rc == 0 && done == -ENOMEM)) /* the stream's own failure */
        done = tsp__err(err, errlen, -ENOMEM, "%s: out of memory", name);
    free(op);
    return done;
}
