/* lognodes.c: what the driver's log server learns about each node from its NODE and
 * NCCL_CHECK events (docs/protocol.md 1.7): the node's NCCL_* environment, compared with
 * rank 0's node (one warning per node whose settings differ), and the NCCL check's
 * progress, from which the root cause of a check that timed out names, job-wide, the
 * nodes whose check never started. Runs on the epoll thread (logserver.c). */
#include "lognodes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "logsend.h"
#include "util.h"

/* Node ranks the server keeps records for (HELLO carries an i32; a job has far fewer). */
#define NODES_MAX 65536
/* Variables compared per node: more are ignored (NCCL has about a hundred in all). */
#define ENV_VARS_MAX 256

static node_rec_t *node_at(tsp_logserver_t *s, int rank)
{
    if (rank < 0 || rank >= NODES_MAX)
        return NULL;
    if ((size_t)rank >= s->nodes_cap) {
        size_t n = s->nodes_cap ? s->nodes_cap : 8;
        while (n <= (size_t)rank)
            n *= 2;
        node_rec_t *nn = realloc(s->nodes, n * sizeof(*nn));
        if (!nn)
            return NULL;
        memset(nn + s->nodes_cap, 0, (n - s->nodes_cap) * sizeof(*nn));
        s->nodes = nn;
        s->nodes_cap = n;
    }
    return &s->nodes[rank];
}

/* "NAME=value" lines split in place: names and values point into buf. */
typedef struct {
    char *buf;
    const char *name[ENV_VARS_MAX], *val[ENV_VARS_MAX];
    int n;
} envlist_t;

static int env_split(const char *text, envlist_t *e)
{
    e->n = 0;
    e->buf = strdup(text ? text : "");
    if (!e->buf)
        return -1;
    for (char *line = e->buf, *next; line && *line && e->n < ENV_VARS_MAX; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = 0;
        e->name[e->n] = line;
        e->val[e->n++] = eq + 1;
    }
    return 0;
}

static const char *env_find(const envlist_t *e, const char *name)
{
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->name[i], name) == 0)
            return e->val[i];
    return NULL;
}

/* One item of the warning: how name differs on the node and on node 0. */
static void diff_item(char *msg, size_t len, int *items, const char *name, const char *here,
                      const char *zero)
{
    char a[200], b[200];
    if (here)
        snprintf(a, sizeof a, "'%.180s'", here);
    else
        snprintf(a, sizeof a, "unset");
    if (zero)
        snprintf(b, sizeof b, "'%.180s'", zero);
    else
        snprintf(b, sizeof b, "unset");
    tsp__err_append(msg, len, "%s%s is %s there and %s on node 0", (*items)++ ? "; " : "", name, a,
                    b);
}

/* Compares node k's NCCL environment with node 0's and warns once when they differ. */
static void compare_env(tsp_logserver_t *s, int k)
{
    node_rec_t *n = &s->nodes[k], *z = &s->nodes[0];
    n->compared = 1;
    envlist_t here, zero;
    if (env_split(n->env, &here) != 0)
        return;
    if (env_split(z->env, &zero) != 0) {
        free(here.buf);
        return;
    }
    char msg[900];
    int items = 0;
    snprintf(msg, sizeof msg,
             "torchspark: WARNING: the NCCL settings of node %d (host %s) differ from rank 0's "
             "node 0 (host %s): ",
             k, n->host, z->host);
    for (int i = 0; i < here.n; i++) {
        const char *v0 = env_find(&zero, here.name[i]);
        if (!v0 || strcmp(v0, here.val[i]) != 0)
            diff_item(msg, sizeof msg, &items, here.name[i], here.val[i], v0);
    }
    for (int i = 0; i < zero.n; i++)
        if (!env_find(&here, zero.name[i]))
            diff_item(msg, sizeof msg, &items, zero.name[i], NULL, zero.val[i]);
    if (items)
        tsp__event(s, "%s", msg);
    free(here.buf);
    free(zero.buf);
}

static void on_node(tsp_logserver_t *s, node_rec_t *n, int rank, const char *json, size_t len)
{
    char *v = NULL;
    int type = 0, nnodes = 0;
    if (tsp_json_get(json, len, "nnodes", &v, &type) == 0 && type == TSP_JSON_NUMBER &&
        tsp__parse_int(v, &nnodes) == 0 && nnodes <= NODES_MAX && nnodes > s->job_nnodes)
        s->job_nnodes = nnodes;
    free(v);
    v = NULL;
    if (n->seen || tsp_json_get(json, len, "env", &v, &type) != 0 || type != TSP_JSON_STRING) {
        free(v);
        return; /* once per node; a NODE without env is not compared */
    }
    n->seen = 1;
    n->env = v;
    if (rank != 0) {
        if (s->nodes_cap > 0 && s->nodes[0].seen)
            compare_env(s, rank);
        return;
    }
    for (size_t k = 1; k < s->nodes_cap; k++) /* those that came before node 0's */
        if (s->nodes[k].seen && !s->nodes[k].compared)
            compare_env(s, (int)k);
}

void tsp__nodes_on_event(tsp_logserver_t *s, const conn_t *c, int kind, const char *json,
                         size_t len)
{
    int rank = c->h.node_rank;
    node_rec_t *n = node_at(s, rank);
    if (!n || tsp_json_check_object(json, len) != 0)
        return;
    snprintf(n->host, sizeof n->host, "%s", c->h.host);
    if (kind == TSP_WIRE_EVENT_NODE) {
        on_node(s, n, rank, json, len);
        return;
    }
    char *state = NULL;
    int type = 0;
    if (tsp_json_get(json, len, "state", &state, &type) == 0 && type == TSP_JSON_STRING) {
        if (strcmp(state, "started") == 0) {
            n->check = n->check ? n->check : 1;
        } else {
            n->check = 2;
            snprintf(n->state, sizeof n->state, "%s", state);
        }
    }
    free(state);
}

/* The host of a node that sent no event: its connected agent's, or NULL. */
static const char *connected_host(tsp_logserver_t *s, int rank)
{
    for (conn_t *c = s->conns; c; c = c->next)
        if (c->state == C_OPEN && c->h.role == TSP_WIRE_ROLE_LOGS && c->h.node_rank == rank)
            return c->h.host;
    return NULL;
}

char *tsp__nodes_check_detail(tsp_logserver_t *s, int node_rank)
{
    if (node_rank < 0 || (size_t)node_rank >= s->nodes_cap || s->job_nnodes <= 0 ||
        strcmp(s->nodes[node_rank].state, "timeout") != 0)
        return NULL;
    char list[1024] = "";
    int missing = 0;
    for (int i = 0; i < s->job_nnodes; i++) {
        const node_rec_t *n = (size_t)i < s->nodes_cap ? &s->nodes[i] : NULL;
        if (n && n->check)
            continue;
        const char *host = n && n->host[0] ? n->host : connected_host(s, i);
        char one[300];
        if (host)
            snprintf(one, sizeof one, "node %d (host %.256s)", i, host);
        else
            snprintf(one, sizeof one, "node %d (no agent connected from it)", i);
        tsp__err_append(list, sizeof list, "%s%s", missing++ ? ", " : "", one);
    }
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return NULL;
    if (missing)
        fprintf(f,
                "NCCL check across the job: %s never reported: %s check never started, so "
                "%s ranks never joined and the other nodes waited until the deadline; see %s "
                "executor's log",
                list, missing > 1 ? "their" : "its", missing > 1 ? "their" : "its",
                missing > 1 ? "those nodes'" : "that node's");
    else
        fprintf(f,
                "NCCL check across the job: all %d nodes started it and none is missing, so "
                "the ranks were stuck inside NCCL (a hang in NCCL or in the network between "
                "the nodes)",
                s->job_nnodes);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

void tsp__nodes_free(tsp_logserver_t *s)
{
    for (size_t i = 0; i < s->nodes_cap; i++)
        free(s->nodes[i].env);
    free(s->nodes);
    s->nodes = NULL;
    s->nodes_cap = 0;
}
