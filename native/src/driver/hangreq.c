/* hangreq.c: the hang doctor's request read (hangdiag.h; docs/protocol.md 1.11): one
 * JSON object, each rank's lines (or null), world, request, read_sources and the driver's
 * stdlib directories, into the diagnosis' input; a wrong member is refused with a sentence
 * that names it, an unknown one ignored. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hangdiag.h"
#include "json.h"
#include "util.h"

/* ---- the request ------------------------------------------------------------------- */

typedef struct {
    input_t *in;
    diag_t *g;
    size_t rank;
    int seen_ranks;
    char *err;
    size_t errlen;
} cb_t;

static int line_cb(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key;
    cb_t *c = ctx;
    input_t *in = c->in;
    (void)len;
    if (type != TSP_JSON_STRING)
        return tsp__err(c->err, c->errlen, -EINVAL,
                        "ranks[%zu][%zu] must be a string (one line of the rank's dump)", c->rank,
                        index);
    if (in->nlines[c->rank] == in->caps[c->rank]) {
        size_t cap = in->caps[c->rank] ? in->caps[c->rank] * 2 : 32;
        char **l = realloc(in->lines[c->rank], cap * sizeof *l);
        if (!l)
            return -ENOMEM;
        in->lines[c->rank] = l;
        in->caps[c->rank] = cap;
    }
    char *s = strdup(val);
    if (!s)
        return -ENOMEM;
    in->lines[c->rank][in->nlines[c->rank]++] = s;
    return 0;
}

static int rank_cb(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key;
    cb_t *c = ctx;
    input_t *in = c->in;
    if (index >= MAX_RANKS)
        return tsp__err(c->err, c->errlen, -EINVAL, "ranks has over %d entries", MAX_RANKS);
    if (index >= in->nranks) { /* grown by doubling: rank_cb sees 0, 1, 2, ... */
        size_t cap = in->nranks ? in->nranks * 2 : 64;
        char ***l = realloc(in->lines, cap * sizeof *l);
        if (l)
            in->lines = l;
        size_t *a = l ? realloc(in->nlines, cap * sizeof *a) : NULL;
        if (a)
            in->nlines = a;
        size_t *b = a ? realloc(in->caps, cap * sizeof *b) : NULL;
        if (!b)
            return -ENOMEM;
        in->caps = b;
        for (size_t i = in->nranks; i < cap; i++)
            in->lines[i] = NULL, in->nlines[i] = in->caps[i] = 0;
        in->nranks = cap;
    }
    c->rank = index;
    in->count = index + 1;
    if (type == TSP_JSON_LITERAL && len == 4 && memcmp(val, "null", 4) == 0)
        return 0;
    if (type != TSP_JSON_ARRAY)
        return tsp__err(c->err, c->errlen, -EINVAL,
                        "ranks[%zu] must be the rank's lines (an array of strings) or null", index);
    return tsp_json_each(val, len, NULL, line_cb, c);
}

static int stdlib_cb(void *ctx, const char *key, size_t index, int type, const char *val,
                     size_t len)
{
    (void)key;
    cb_t *c = ctx;
    input_t *in = c->in;
    if (type != TSP_JSON_STRING || !len)
        return tsp__err(c->err, c->errlen, -EINVAL,
                        "stdlib[%zu] must be a directory of the driver's Python standard library",
                        index);
    char **l = realloc(in->stdlib, (in->nstdlib + 1) * sizeof *l);
    if (!l)
        return -ENOMEM;
    in->stdlib = l;
    while (len > 1 && val[len - 1] == '/')
        len--;
    if (!(l[in->nstdlib] = malloc(len + 2)))
        return -ENOMEM;
    snprintf(l[in->nstdlib++], len + 2, "%.*s/", (int)len, val);
    return 0;
}

/* A member's integer in [min, max] (null: dflt). */
static int int_member(cb_t *c, const char *key, int type, const char *val, size_t len,
                      long long min, long long max, long long dflt, long long *v)
{
    char buf[32];
    if (type == TSP_JSON_LITERAL && len == 4 && memcmp(val, "null", 4) == 0) {
        *v = dflt;
        return 0;
    }
    char *end = NULL;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), val);
    long long x = type == TSP_JSON_NUMBER && len < sizeof buf ? strtoll(buf, &end, 10) : min - 1;
    if (!end || *end || x < min || x > max)
        return tsp__err(c->err, c->errlen, -EINVAL, "%s must be a whole number from %lld to %lld",
                        key, min, max);
    *v = x;
    return 0;
}

/* One member of the request; unknown keys are ignored (a newer glue's). */
static int member_cb(void *ctx, const char *key, size_t index, int type, const char *val,
                     size_t len)
{
    cb_t *c = ctx;
    diag_t *g = c->g;
    (void)index;
    if (strcmp(key, "world") == 0)
        return int_member(c, key, type, val, len, 0, MAX_RANKS, 0, &g->world);
    if (strcmp(key, "request") == 0)
        return int_member(c, key, type, val, len, 1, 0x7fffffff, 0, &g->request);
    if (strcmp(key, "read_sources") == 0) {
        if (type != TSP_JSON_LITERAL || (len == 4 && memcmp(val, "null", 4) == 0))
            return tsp__err(c->err, c->errlen, -EINVAL, "read_sources must be true or false");
        g->read_sources = len == 4;
        return 0;
    }
    int stdlib = strcmp(key, "stdlib") == 0;
    if (!stdlib && strcmp(key, "ranks") != 0)
        return 0;
    if (type != TSP_JSON_ARRAY)
        return tsp__err(c->err, c->errlen, -EINVAL, "%s must be an array", key);
    c->seen_ranks |= !stdlib;
    return tsp_json_each(val, len, NULL, stdlib ? stdlib_cb : rank_cb, c);
}

int tsp__hang_read_request(diag_t *g, const char *doc, size_t len, char *err, size_t errlen)
{
    if (tsp_json_check_object(doc, len) != 0)
        return tsp__err(err, errlen, -EINVAL,
                        "the hang request must be one JSON object (docs/protocol.md 1.11)");
    g->read_sources = 1;
    cb_t c = {&g->in, g, 0, 0, err, errlen};
    int rc = tsp_json_each(doc, len, NULL, member_cb, &c);
    if (!rc && !c.seen_ranks)
        return tsp__err(err, errlen, -EINVAL, "ranks is missing: give each rank's lines");
    return rc;
}
