/* logcall.c: the glues' one call on a log server (docs/protocol.md 1.14): a JSON request
 * naming an op -> its reply, so that each glue binds one function for the server's queries
 * and settings (the hot pulls, the output's bytes and the handle's life keep their own). */
#include "torchspark/logserver.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jreq.h"
#include "json.h"
#include "logwatch.h"
#include "util.h"

#define WHO "tsp_logserver_call's request"

/* A document the server keeps (the root cause, a hang event; fn copies it when it fits and
 * says its length, 0 when there is none) as the reply itself, or null. */
static int op_document(tsp_logserver_t *s, long (*fn)(tsp_logserver_t *, char *, size_t, int),
                       int timeout_ms, char *out, size_t outlen, size_t *needed)
{
    long n = fn(s, out, outlen, timeout_ms);
    if (n <= 0)
        return tsp__reply_copy("null", 4, out, outlen, needed);
    if (needed)
        *needed = (size_t)n + 1;
    return (size_t)n < outlen ? 0 : -ENOSPC;
}

static void write_stats(tsp_logserver_t *s, tsp_json_writer_t *w)
{
    tsp_logserver_stats_t st;
    tsp_logserver_stats(s, &st);
    const char *keys[] = {"accepted", "authenticated", "rejected",  "lines",
                          "bytes",    "duplicates",    "connected", "queued_bytes"};
    const uint64_t vals[] = {st.accepted, st.authenticated, st.rejected,  st.lines,
                             st.bytes,    st.duplicates,    st.connected, st.queued_bytes};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        tsp_json_key(w, keys[i]);
        tsp_json_int(w, (long long)vals[i]);
    }
}

static void write_info(tsp_logserver_t *s, tsp_json_writer_t *w)
{
    uint8_t secret[TSP_SECRET_LEN];
    char hex[2 * TSP_SECRET_LEN + 1];
    tsp_logserver_secret(s, secret);
    tsp__hex_encode(secret, sizeof secret, hex);
    tsp_json_key(w, "host");
    tsp_json_str(w, tsp_logserver_host(s));
    tsp_json_key(w, "port");
    tsp_json_int(w, tsp_logserver_port(s));
    tsp_json_key(w, "secret");
    tsp_json_str(w, hex);
    memset(secret, 0, sizeof secret);
    memset(hex, 0, sizeof hex);
}

/* The last n lines of rank as an array of strings (n > 0: the glues' check). */
static int write_tail(tsp_logserver_t *s, const tsp_jreq_t *r, tsp_json_writer_t *w)
{
    int rank = 0;
    long long n = 1 << 30;
    int rc = tsp_jreq_int(r, "rank", 1, &rank);
    if (rc == 0)
        rc = tsp_jreq_num(r, "n", 1, INT_MAX, "a whole number > 0", &n);
    long need = rc == 0 ? tsp_logserver_tail(s, rank, (int)n, NULL, 0) : 0;
    need = need > 0 ? need : 0;
    char *text = rc == 0 ? malloc((size_t)need + 1) : NULL;
    if (rc == 0 && !text)
        return -ENOMEM;
    if (text)
        tsp_logserver_tail(s, rank, (int)n, text, (size_t)need + 1);
    tsp_json_key(w, "lines");
    tsp_json_begin_array(w);
    for (char *p = text, *nl;
         p && p < text + need && (nl = memchr(p, '\n', (size_t)(text + need - p))); p = nl + 1) {
        *nl = '\0';
        tsp_json_str(w, p);
    }
    tsp_json_end(w);
    free(text);
    return rc;
}

static void write_lost(tsp_logserver_t *s, tsp_json_writer_t *w)
{
    tsp_json_key(w, "pending");
    tsp_json_int(w, tsp_logserver_lost_pending(s));
    int k = tsp_logserver_nodes_lost(s, NULL, 0);
    int32_t *ranks = k > 0 ? calloc((size_t)k, sizeof *ranks) : NULL;
    k = ranks ? tsp_logserver_nodes_lost(s, ranks, k) : 0;
    tsp_json_key(w, "nodes");
    tsp_json_begin_array(w);
    for (int i = 0; ranks && i < k; i++)
        tsp_json_int(w, ranks[i]);
    tsp_json_end(w);
    free(ranks);
}

/* The output's state: received (verified, after waiting up to timeout_ms), its length, and
 * why the last transfer failed ("" when none did). */
static void write_output(tsp_logserver_t *s, int timeout_ms, tsp_json_writer_t *w)
{
    int received = tsp_logserver_output_wait(s, timeout_ms) == 0;
    const void *data = NULL;
    uint64_t len = 0;
    int have = received && tsp_logserver_output_data(s, &data, &len) == 0;
    tsp_json_key(w, "received");
    tsp_json_raw(w, received ? "true" : "false", received ? 4 : 5);
    tsp_json_key(w, "length");
    tsp_json_int(w, have ? (long long)len : -1);
    tsp_json_key(w, "error");
    tsp_json_str(w, tsp_logserver_output_error(s));
}

/* The ops that only tell the server something: a rc, and err's sentence on a refusal. */
static int op_set(tsp_logserver_t *s, const char *op, const tsp_jreq_t *r, tsp_json_writer_t *w)
{
    char *str = NULL, *action = NULL;
    int rc = 0, on = 0, n = 0, world = 0;
    if (strcmp(op, "encryption") == 0 && !(rc = tsp_jreq_bool(r, "on", &on)))
        return tsp_logserver_encryption(s, on);
    if (strcmp(op, "expect_output") == 0 && !(rc = tsp_jreq_str(r, "path", 0, &str))) {
        rc = tsp_logserver_expect_output(s, str);
        if (rc)
            tsp__err(r->err, r->errlen, rc, "cannot expect an output: %s", tsp_strerror(rc));
    } else if (strcmp(op, "output_limit") == 0 &&
               !(rc = tsp_jreq_str(r, "max_result_size", 0, &str))) {
        rc = tsp_logserver_output_limit(s, str, r->err, r->errlen);
    } else if (strcmp(op, "stop_all") == 0 || strcmp(op, "checkpoint_all") == 0) {
        int stop = op[0] == 's';
        rc = stop ? tsp_jreq_str(r, "text", 0, &str) : tsp_jreq_int(r, "why", 0, &n);
        int sent = rc == 0 && (stop ? tsp_logserver_stop_all(s, str)
                                    : tsp_logserver_checkpoint_all(s, n)) == 0;
        tsp_json_key(w, "sent");
        tsp_json_raw(w, sent ? "true" : "false", sent ? 4 : 5);
    } else if (strcmp(op, "watch") == 0) {
        long long ms = 0;
        if (!(rc = tsp_jreq_num(r, "timeout_ms", 0, 1LL << 40, "a whole number of ms", &ms)) &&
            !(rc = tsp_jreq_str(r, "action", 1, &action)) &&
            !(rc = tsp_jreq_int(r, "world", 0, &world)) &&
            !(rc = tsp_jreq_str(r, "tmpdir", 1, &str)))
            rc = tsp_logserver_watch(s, (long)ms, action, world, str, r->err, r->errlen);
    } else if (strcmp(op, "shutdown") == 0 && !(rc = tsp_jreq_int(r, "drain_ms", 0, &n))) {
        rc = tsp_logserver_shutdown(s, n);
    } else if (rc == 0) {
        rc =
            tsp__err(r->err, r->errlen, -EINVAL,
                     "tsp_logserver_call: unknown op \"%s\" (info, stats, tail, lost, output, "
                     "failure, hang_event, hang_summary, report_budget, encryption, expect_output, "
                     "output_limit, stop_all, checkpoint_all, watch, shutdown, fd_check or stacks)",
                     op);
    }
    free(str);
    free(action);
    return rc;
}

/* The ops whose reply is an object of their fields. */
static int op_object(tsp_logserver_t *s, const char *op, const tsp_jreq_t *r, tsp_json_writer_t *w)
{
    int timeout_ms = 0;
    if (strcmp(op, "stacks") == 0) { /* s may be NULL */
        char *path = NULL;
        int rc = tsp_jreq_str(r, "file", 1, &path);
        if (rc == 0)
            tsp__watch_stacks(path, w);
        free(path);
        return rc;
    } else if (strcmp(op, "info") == 0)
        write_info(s, w);
    else if (strcmp(op, "stats") == 0)
        write_stats(s, w);
    else if (strcmp(op, "lost") == 0)
        write_lost(s, w);
    else if (strcmp(op, "hang_summary") == 0)
        tsp__watch_summary(s, w);
    else if (strcmp(op, "tail") == 0)
        return write_tail(s, r, w);
    else if (strcmp(op, "output") == 0) {
        int rc = tsp_jreq_int(r, "timeout_ms", 1, &timeout_ms);
        if (rc == 0)
            write_output(s, timeout_ms, w);
        return rc;
    } else if (strcmp(op, "report_budget") == 0) {
        char *v = NULL;
        int rc = tsp_jreq_get(r, "per_s", TSP_JSON_NUMBER, "a number", &v);
        if (rc == 1)
            tsp_logserver_report_budget(s, strtod(v, NULL));
        free(v);
        return rc < 0 ? rc : 0;
    } else
        return op_set(s, op, r, w);
    return 0;
}

/* tsp_logserver_fd_check of the request's nodes: {} or its refusal. */
static int fd_check(const tsp_jreq_t *r, char *out, size_t outlen, size_t *needed)
{
    int nodes = 0;
    int rc = tsp_jreq_int(r, "nodes", 1, &nodes);
    if (rc == 0)
        rc = tsp_logserver_fd_check(nodes, r->err, r->errlen);
    return rc ? rc : tsp__reply_copy("{}", 2, out, outlen, needed);
}

int tsp_logserver_call(tsp_logserver_t *s, const char *request, size_t len, char *out,
                       size_t outlen, size_t *needed, char *err, size_t errlen)
{
    tsp_jreq_t r;
    char *op = NULL;
    int timeout_ms = 0,
        rc = tsp_jreq_init(&r, "tsp_logserver_call", WHO, request, len, err, errlen);
    if (rc)
        return rc;
    rc = tsp_jreq_str(&r, "op", 1, &op);
    if (rc == 0 && strcmp(op, "fd_check") == 0) { /* before a server: no handle */
        free(op);
        return fd_check(&r, out, outlen, needed);
    }
    if (!s && rc == 0 && strcmp(op, "stacks") != 0) /* stacks: a file, no server either */
        rc = tsp__err(err, errlen, -EINVAL, "tsp_logserver_call: no log server");
    int failure = rc == 0 && strcmp(op, "failure") == 0;
    if (rc == 0 && (failure || strcmp(op, "hang_event") == 0)) {
        rc = tsp_jreq_int(&r, "timeout_ms", 1, &timeout_ms);
        if (rc == 0)
            rc = op_document(s, failure ? tsp_logserver_failure : tsp_logserver_hang_event,
                             timeout_ms, out, outlen, needed);
        free(op);
        return rc;
    }
    tsp_json_reply_t rp;
    if (rc == 0 && (rc = tsp_json_reply_open(&rp)) == 0)
        rc = tsp_json_reply_close(&rp, op_object(s, op, &r, &rp.w), out, outlen, needed);
    if (rc < 0 && rc != -ENOSPC && err && errlen && !err[0])
        tsp__err(err, errlen, rc, "tsp_logserver_call: %s failed: %s", op ? op : "?",
                 tsp_strerror(rc));
    free(op);
    return rc;
}
