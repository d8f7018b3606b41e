/* runrec.c: each attempt's record in the run controller's state (runrec.h, docs/protocol.md
 * section 11, "attempts"), read back from the state a glue hands in and written with it. */
#include "runrec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Each value's key in the record, its kind, whether it is written when not known (null), and
 * the key of attempt_failed that brings it (NULL: the controller's, or another event's). */
static const struct {
    const char *key;
    int kind, always;
    const char *from;
} fields[TSP__REC_N] = {
    [TSP__REC_STARTED] = {"started", TSP_JSON_NUMBER, 1, NULL},
    [TSP__REC_ENDED] = {"ended", TSP_JSON_NUMBER, 1, NULL},
    [TSP__REC_CAUSE] = {"cause", TSP_JSON_STRING, 1, NULL},
    [TSP__REC_ROOT_AT] = {"root_at", TSP_JSON_NUMBER, 0, "event.root_at"},
    [TSP__REC_ENDED_AT] = {"ended_at", TSP_JSON_NUMBER, 0, "event.ended_at"},
    [TSP__REC_SILENT_NODE] = {"silent_node", TSP_JSON_NUMBER, 0, "event.silent_node"},
    [TSP__REC_SILENT_EXECUTOR] = {"silent_executor", TSP_JSON_STRING, 0, "event.executor"},
    [TSP__REC_LOST_NODES] = {"lost_nodes", TSP_JSON_ARRAY, 0, "event.lost_nodes"},
    [TSP__REC_EXCLUDED] = {"excluded_executor", TSP_JSON_STRING, 0, NULL},
};

static const char *const kinds[] = {
    [TSP_JSON_STRING] = "a string or null",
    [TSP_JSON_NUMBER] = "a number (the glue's clock, or a node rank) or null",
    [TSP_JSON_ARRAY] = "an array of node ranks (whole numbers from 0) or null",
};

static void rec_free(tsp__rec_t *a)
{
    for (int i = 0; i < TSP__REC_N; i++)
        free(a->v[i]);
}

void tsp__runrec_free(tsp__runrec_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        rec_free(&l->recs[i]);
    free(l->recs);
    l->recs = NULL;
    l->n = 0;
}

static tsp__rec_t *rec_add(tsp__runrec_t *l)
{
    tsp__rec_t *grown = realloc(l->recs, (l->n + 1) * sizeof *grown);
    if (!grown)
        return NULL;
    l->recs = grown;
    memset(&grown[l->n], 0, sizeof *grown);
    return &grown[l->n++];
}

/* One record of the state's list: its number and nodes, each value of its kind or null. */
static int each_rec(void *ctx, const char *key, size_t index, int type, const char *val, size_t len)
{
    (void)key, (void)index;
    tsp__runrec_t *l = ctx;
    tsp__rec_t *a = type == TSP_JSON_OBJECT ? rec_add(l) : NULL;
    if (!a)
        return type == TSP_JSON_OBJECT ? -ENOMEM : -EINVAL;
    tsp_jreq_t r = {val, len, "the record", NULL, 0};
    a->attempt = a->nodes = -1;
    int rc = tsp_jreq_num(&r, "attempt", 0, 1000000000LL, "", &a->attempt);
    if (!rc)
        rc = tsp_jreq_num(&r, "nodes", 0, 1000000000LL, "", &a->nodes);
    for (int i = 0; !rc && i < TSP__REC_N; i++)
        rc = tsp_jreq_get(&r, fields[i].key, fields[i].kind, "", &a->v[i]) < 0 ? -EINVAL : 0;
    return rc ? rc : a->attempt < 0 || a->nodes < 0 ? -EINVAL : 0;
}

int tsp__runrec_read(const tsp_jreq_t *r, tsp__runrec_t *l)
{
    char *v = NULL;
    int rc = tsp_jreq_get(r, "state.attempts", TSP_JSON_ARRAY, "", &v);
    if (rc > 0)
        rc = tsp_json_each(v, strlen(v), NULL, each_rec, l);
    free(v);
    return rc == -ENOMEM ? rc : rc ? -EINVAL : 0;
}

int tsp__runrec_begin(tsp__runrec_t *l, int attempt, int nodes, const char *at)
{
    tsp__rec_t *a = rec_add(l);
    if (!a)
        return -ENOMEM;
    a->attempt = attempt;
    a->nodes = nodes;
    return at && !(a->v[TSP__REC_STARTED] = strdup(at)) ? -ENOMEM : 0;
}

/* The value of kind k at path into *into, the one there replaced when present. */
static int set_from(const tsp_jreq_t *r, const char *path, int k, char **into)
{
    char *v = NULL;
    int rc = tsp_jreq_get(r, path, k, kinds[k], &v);
    if (rc <= 0)
        return rc;
    if (k == TSP_JSON_ARRAY && v[1 + strspn(v + 1, " \t\r\n")] == ']') {
        free(v); /* no node lost */
        return 0;
    }
    free(*into);
    *into = v;
    return 0;
}

int tsp__runrec_end(tsp__runrec_t *l, const tsp_jreq_t *r, const char *cause)
{
    if (l->n == 0)
        return 0;
    tsp__rec_t *a = &l->recs[l->n - 1];
    int rc = set_from(r, "event.at", TSP_JSON_NUMBER, &a->v[TSP__REC_ENDED]);
    for (int i = 0; !rc && cause && i < TSP__REC_N; i++)
        if (fields[i].from)
            rc = set_from(r, fields[i].from, fields[i].kind, &a->v[i]);
    if (!rc && cause) {
        free(a->v[TSP__REC_CAUSE]);
        rc = (a->v[TSP__REC_CAUSE] = strdup(cause)) ? 0 : -ENOMEM;
    }
    return rc;
}

int tsp__runrec_excluded(tsp__runrec_t *l, const char *id)
{
    if (l->n == 0 || !id)
        return 0;
    char **v = &l->recs[l->n - 1].v[TSP__REC_EXCLUDED];
    free(*v);
    return (*v = strdup(id)) ? 0 : -ENOMEM;
}

void tsp__runrec_write(tsp_json_writer_t *w, const tsp__runrec_t *l)
{
    tsp_json_begin_array(w);
    for (size_t i = 0; i < l->n; i++) {
        const tsp__rec_t *a = &l->recs[i];
        tsp_json_begin_object(w);
        tsp_json_key(w, "attempt");
        tsp_json_int(w, a->attempt);
        tsp_json_key(w, "nodes");
        tsp_json_int(w, a->nodes);
        for (int k = 0; k < TSP__REC_N; k++) {
            const char *v = a->v[k];
            if (!v && !fields[k].always)
                continue;
            tsp_json_key(w, fields[k].key);
            if (v && fields[k].kind == TSP_JSON_STRING)
                tsp_json_str(w, v);
            else if (!v || tsp_json_value(w, v, strlen(v)) != 0)
                tsp_json_null(w); /* unknown, or a value that is no JSON */
        }
        tsp_json_end(w);
    }
    tsp_json_end(w);
}
