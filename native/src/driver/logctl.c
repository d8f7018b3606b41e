/* logctl.c: the log server's control channel (docs/protocol.md 1.7): STOP to every
 * control agent, the run's root-cause record (the first failure or lost node), and the
 * bookkeeping of LOGS connections that ended without CLOSE until their grace is over and
 * the node is declared lost. Runs on the epoll thread (logserver.c); the host reads the
 * results through ctl_mu. */
#include "logctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "lognodes.h"
#include "logsend.h"
#include "util.h"

void tsp__conn_stop(tsp_logserver_t *s, conn_t *c)
{
    uint8_t p[1 + STOP_TEXT_MAX];
    size_t n = strnlen(s->stop_text, sizeof(s->stop_text) - 1);
    p[0] = (uint8_t)s->stop_reason;
    memcpy(p + 1, s->stop_text, n);
    if (tsp__conn_send(s, c, TSP_WIRE_STOP, p, 1 + n) == 0)
        c->stop_sent = 1;
}

/* The first stop of the run: every other control agent (and any that connects later) is
 * told to stop its workers at once. */
void tsp__stop_everyone(tsp_logserver_t *s, int reason, uint64_t except, const char *text)
{
    if (s->t_stopped)
        return;
    s->t_stopped = 1;
    s->stop_reason = reason;
    s->stop_except = except;
    snprintf(s->stop_text, sizeof(s->stop_text), "%s", text);
    for (conn_t *c = s->conns; c; c = c->next)
        if (c->state == C_OPEN && c->control && !c->stop_sent && c->h.agent_id != except)
            tsp__conn_stop(s, c);
}

/* The hang doctor's request (protocol 1.9): never to an agent that was told to stop, nor
 * to a version-1 agent (it would refuse the frame). */
void tsp__dump_everyone(tsp_logserver_t *s, uint32_t request)
{
    uint8_t p[4] = {(uint8_t)(request >> 24), (uint8_t)(request >> 16), (uint8_t)(request >> 8),
                    (uint8_t)request};
    for (conn_t *c = s->conns; c; c = c->next)
        if (c->state == C_OPEN && c->control && !c->stop_sent && c->h.version >= 2)
            tsp__conn_send(s, c, TSP_WIRE_DUMP, p, sizeof p);
}

/* The driver's request to checkpoint now and stop (protocol 1.13), to the same agents. */
void tsp__checkpoint_everyone(tsp_logserver_t *s, uint8_t why)
{
    for (conn_t *c = s->conns; c; c = c->next)
        if (c->state == C_OPEN && c->control && !c->stop_sent && c->h.version >= 2)
            tsp__conn_send(s, c, TSP_WIRE_CHECKPOINT, &why, 1);
}

/* Keeps the first failure as the run's root cause (later ones are consequences). */
static void record_root(tsp_logserver_t *s, const char *kind, int node_rank, const char *host,
                        const char *peer, const char *message, const char *report,
                        const char *detail)
{
    char *doc = NULL;
    size_t dl = 0;
    FILE *f = open_memstream(&doc, &dl);
    if (!f)
        return;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    const char *keys[] = {"kind", "host", "peer", "message", "detail"};
    const char *vals[] = {kind, host, peer, message, detail};
    tsp_json_key(&w, "node_rank");
    tsp_json_int(&w, node_rank);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        tsp_json_key(&w, keys[i]);
        tsp_json_str(&w, vals[i]);
    }
    /* The agent's failure document, embedded as the JSON object it is (both glues read it
     * as one); null when there is none or it is not well formed. */
    tsp_json_key(&w, "report");
    if (!report || tsp_json_value(&w, report, strlen(report)) != 0)
        tsp_json_null(&w);
    tsp_json_end(&w);
    if (fclose(f) != 0) {
        free(doc);
        return;
    }
    pthread_mutex_lock(&s->ctl_mu);
    if (!s->root) {
        s->root = doc;
        doc = NULL;
        pthread_cond_broadcast(&s->fail_cv);
    }
    pthread_mutex_unlock(&s->ctl_mu);
    free(doc);
}

/* The peer's address without the port, for messages ("10.0.0.5", "::1"). */
static void peer_addr(const char *peer, char *out, size_t n)
{
    const char *colon = strrchr(peer, ':');
    size_t len = colon ? (size_t)(colon - peer) : strlen(peer);
    snprintf(out, n, "%.*s", (int)len, peer);
}

/* The nodes lost (protocol 1.7): adds node_rank once (on), or takes it out (off: its
 * agent came back after its channel broke). */
static void gone_set(tsp_logserver_t *s, int node_rank, int on)
{
    pthread_mutex_lock(&s->ctl_mu);
    size_t i = 0;
    while (i < s->ngone && s->gone[i] != node_rank)
        i++;
    if (!on && i < s->ngone) {
        memmove(s->gone + i, s->gone + i + 1, (s->ngone - i - 1) * sizeof(*s->gone));
        s->ngone--;
    } else if (on && i == s->ngone && node_rank >= 0) {
        if (s->ngone == s->gone_cap) {
            size_t n = s->gone_cap ? s->gone_cap * 2 : 8;
            int *ng = realloc(s->gone, n * sizeof(*ng));
            if (ng) {
                s->gone = ng;
                s->gone_cap = n;
            }
        }
        if (s->ngone < s->gone_cap)
            s->gone[s->ngone++] = node_rank;
    }
    pthread_mutex_unlock(&s->ctl_mu);
}

/* An EVENT frame: delivered once per (agent, seq) like a line. */
int tsp__on_event(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p)
{
    agent_rec_t *a = &s->agents[c->agent];
    uint64_t seq = tsp_wire_get_u64(p);
    if (seq <= a->seq)
        return 0;
    size_t n = h->length - 9;
    if (p[8] != TSP_WIRE_EVENT_FAILURE) {
        a->seq = seq;
        if (p[8] == TSP_WIRE_EVENT_NODE || p[8] == TSP_WIRE_EVENT_NCCL_CHECK)
            tsp__nodes_on_event(s, c, p[8], (const char *)p + 9, n);
        else if (p[8] == TSP_WIRE_EVENT_EXECUTOR_GONE) /* its executor JVM died */
            gone_set(s, c->h.node_rank, 1);
        return 0; /* another kind of a newer agent: ignored, not refused */
    }
    /* A failure that cannot be kept is not acknowledged: the connection is refused and
     * the agent resends the event after it reconnects (protocol 1.7). */
    char *report = malloc(n + 1);
    if (!report)
        return -ENOMEM;
    a->seq = seq;
    memcpy(report, p + 9, n);
    report[n] = 0;
    /* The sentence is the agent's (report.c writes every failure's summary once). */
    char *summary = NULL, addr[80];
    int t = 0;
    if (tsp_json_get(report, n, "torchspark.summary", &summary, &t) != 0 || t != TSP_JSON_STRING) {
        free(summary);
        summary = NULL;
    }
    peer_addr(c->peer, addr, sizeof(addr));
    char msg[STOP_TEXT_MAX];
    if (summary)
        snprintf(msg, sizeof(msg), "%s (address %s)", summary, addr);
    else /* a document without its summary: what the driver knows of the node */
        snprintf(msg, sizeof(msg), "node %d (host %s, address %s) failed", c->h.node_rank,
                 c->h.host, addr);
    free(summary);
    char *detail = tsp__nodes_check_detail(s, c->h.node_rank);
    record_root(s, "failure", c->h.node_rank, c->h.host, c->peer, msg, report, detail);
    free(detail);
    free(report);
    if (!s->t_stopped)
        tsp__event(s, "torchspark log server: %s; stopping the other nodes", msg);
    tsp__stop_everyone(s, TSP_WIRE_STOP_FAILED, c->h.agent_id, msg);
    return 0;
}

static void lost_publish(tsp_logserver_t *s)
{
    pthread_mutex_lock(&s->ctl_mu);
    s->lost_pending = (int)s->nlost;
    pthread_mutex_unlock(&s->ctl_mu);
}

/* A LOGS connection ended without CLOSE: remember it; sweep() declares it lost when its
 * agent has not reconnected within grace_ms. reason: the lost document's (protocol 8). */
static void lost_add(tsp_logserver_t *s, const conn_t *c, const char *why, int64_t grace_ms,
                     const char *reason)
{
    if (s->t_draining || c->state != C_OPEN || c->h.role != TSP_WIRE_ROLE_LOGS)
        return;
    if (s->nlost == s->lost_cap) {
        size_t n = s->lost_cap ? s->lost_cap * 2 : 8;
        lost_rec_t *nl = realloc(s->lost, n * sizeof(*nl));
        if (!nl)
            return;
        s->lost = nl;
        s->lost_cap = n;
    }
    lost_rec_t *l = &s->lost[s->nlost++];
    memset(l, 0, sizeof(*l));
    l->agent_id = c->h.agent_id;
    l->node_rank = c->h.node_rank;
    l->deadline = tsp__now_ms() + grace_ms;
    snprintf(l->host, sizeof(l->host), "%s", c->h.host);
    snprintf(l->peer, sizeof(l->peer), "%s", c->peer);
    snprintf(l->why, sizeof(l->why), "%s", why);
    l->reason = reason;
    /* Before the run was stopped, no agent had a reason to go: the node is lost. After the
     * STOP, an agent killed with its task (the job's cancel) is a consequence. */
    l->gone = !s->t_stopped;
    if (l->gone)
        gone_set(s, l->node_rank, 1);
    lost_publish(s);
}

/* The connection's own end: a node that gets no grace was silent already (TCP gave up
 * after 5 s without an answer, logconn.c), one with grace closed or broke it (EOF). */
void tsp__lost_add(tsp_logserver_t *s, const conn_t *c, const char *why, int64_t grace_ms)
{
    lost_add(s, c, why, grace_ms, grace_ms == 0 && s->o.lost_grace_ms > 0 ? "silent" : "eof");
}

void tsp__lost_forget(tsp_logserver_t *s, uint64_t agent_id)
{
    size_t before = s->nlost;
    for (size_t i = 0; i < s->nlost;)
        if (s->lost[i].agent_id == agent_id) {
            if (s->lost[i].gone) /* back within its grace: not lost */
                gone_set(s, s->lost[i].node_rank, 0);
            s->lost[i] = s->lost[--s->nlost];
        } else
            i++;
    if (s->nlost != before)
        lost_publish(s);
}

/* A lost node's failure document (docs/protocol.md 1.7, section 8), built once here where
 * the node is declared lost: tsp_failure_report finishes it for both glues. */
static char *lost_document(const lost_rec_t *l, const char *msg)
{
    char *doc = NULL;
    size_t dl = 0;
    FILE *f = open_memstream(&doc, &dl);
    if (!f)
        return NULL;
    tsp_json_writer_t w;
    tsp_json_writer_init(&w, f);
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "torchspark");
    tsp_json_begin_object(&w);
    tsp_json_key(&w, "node_rank");
    tsp_json_int(&w, l->node_rank);
    const char *keys[] = {"kind", "reason", "host", "peer", "summary"};
    const char *vals[] = {"lost", l->reason, l->host, l->peer, msg};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        tsp_json_key(&w, keys[i]);
        tsp_json_str(&w, vals[i]);
    }
    tsp_json_end(&w);
    tsp_json_end(&w);
    if (fclose(f) != 0) {
        free(doc);
        return NULL;
    }
    return doc;
}

/* Declares agents lost whose grace is over; returns the next deadline (-1: none). */
int64_t tsp__lost_sweep(tsp_logserver_t *s, int64_t now)
{
    int64_t next = -1;
    size_t before = s->nlost;
    for (size_t i = 0; i < s->nlost;) {
        lost_rec_t *l = &s->lost[i];
        if (s->t_draining) {
            s->lost[i] = s->lost[--s->nlost];
            continue;
        }
        if (now < l->deadline) {
            if (next < 0 || l->deadline < next)
                next = l->deadline;
            i++;
            continue;
        }
        /* Off the pending list (and published) before the root cause is: whoever wakes
         * on the root cause must not still see this node as pending. */
        lost_rec_t gone = *l;
        s->lost[i] = s->lost[--s->nlost];
        lost_publish(s);
        char addr[80], msg[STOP_TEXT_MAX];
        peer_addr(gone.peer, addr, sizeof(addr));
        snprintf(msg, sizeof(msg), "lost connection to node %d (host %s, address %s): %s",
                 gone.node_rank, gone.host, addr, gone.why);
        char *doc = lost_document(&gone, msg);
        record_root(s, "lost", gone.node_rank, gone.host, gone.peer, msg, doc, NULL);
        free(doc);
        if (!s->t_stopped)
            tsp__event(s, "torchspark log server: %s; stopping the other nodes", msg);
        tsp__stop_everyone(s, TSP_WIRE_STOP_LOST, gone.agent_id, msg);
    }
    if (s->nlost != before)
        lost_publish(s);
    return next;
}

/* A frozen host (SIGSTOP, a cgroup freezer) still answers TCP keepalives: only the agent's
 * PINGs tell that it runs (protocol 1.7, "Silent agents"). The clock does not run while
 * the connection is paused (the server holds its reads back, backpressure). A silent agent
 * gets no lost grace on top: it had TSP_WIRE_SILENT_MS, five pings, to show it runs. */
int64_t tsp__silent_sweep(tsp_logserver_t *s, int64_t now)
{
    int64_t next = -1;
    if (s->t_draining)
        return next;
    for (conn_t *c = s->conns, *n; c; c = n) {
        n = c->next;
        if (c->state != C_OPEN || !c->keepalive)
            continue;
        if (c->paused) {
            c->rx_at = now;
            continue;
        }
        int64_t due = c->rx_at + TSP_WIRE_SILENT_MS;
        if (now >= due) {
            lost_add(s, c,
                     "it went silent: nothing for 5 s, keepalives included (its executor, "
                     "host or network is frozen or cut)",
                     0, "silent");
            tsp__conn_free(s, c);
            continue;
        }
        if (next < 0 || due < next)
            next = due;
    }
    return next;
}
