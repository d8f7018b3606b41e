/* test_rendezvous.c: the driver's rendezvous (docs/protocol.md 2.1) over real sockets on
 * 127.0.0.1: the server (rendezvous.c) against raw lines inside TLS (tsp_rdv_request), in
 * plaintext, and against the task's client (rdvclient.c): put then get, a peer without the
 * run's secret, a PUT whose MAC is wrong, a request over the line limit, a GET before the
 * PUT, a GET whose time runs out, the run's end while a GET waits, an unreachable driver
 * and a waiting call polled in slices, as the JVM's kill check does. */
#include <check.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "torchspark/gang.h"
#include "torchspark/rendezvous.h"

#define RECORD "{\"version\": 1, \"master_port\": 40123}"
#define SECRET "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define OTHER "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"

/* One raw request in plaintext, no TLS (line as given, newline included by the caller) ->
 * the reply line without its newline, in out ("" when the server only hung up). */
static void raw(int port, const char *line, size_t n, char *out, size_t outlen)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, line + off, n - off, MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the server may answer (and close) before it read everything */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR); /* all of it: a server waiting for more sees the end */
    size_t len = 0;
    out[0] = '\0';
    while (len + 1 < outlen) {
        ssize_t r = recv(fd, out + len, outlen - 1 - len, 0);
        if (r <= 0)
            break;
        len += (size_t)r;
        out[len] = '\0';
        if (memchr(out, '\n', len))
            break;
    }
    char *nl = strchr(out, '\n');
    if (nl)
        *nl = '\0';
    close(fd);
}

/* One request line inside TLS with the run's secret -> the reply line, in out. */
static void req(int port, const char *line, char *out, size_t outlen)
{
    char err[512] = "";
    int rc = tsp_rdv_request("127.0.0.1", port, SECRET, line, out, outlen, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
}

/* "PUT MAC record" with the record's MAC under secret, into line. */
static void put_line(const char *secret, const char *record, char *line, size_t n)
{
    char mac[TSP_RDV_MAC_HEX + 1];
    ck_assert_int_eq(tsp_rdv_record_mac(secret, record, mac, sizeof mac), 0);
    snprintf(line, n, "PUT %s %s", mac, record);
}

typedef struct {
    int port;
    const char *token;
    int rc;
    char reply[TSP_RDV_LINE_MAX + 2];
    char err[1024];
} get_job_t;

static void *get_main(void *arg)
{
    get_job_t *j = arg;
    j->rc = tsp_rdv_exchange("127.0.0.1", j->port, j->token, NULL, j->reply, sizeof j->reply,
                             j->err, sizeof j->err);
    return NULL;
}

static long ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

START_TEST(test_rdv_put_then_get)
{
    char err[512] = "", reply[TSP_RDV_LINE_MAX + 2], line[8192];
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    const char *tok = SECRET;
    ck_assert_str_eq(tsp_rdv_host(r), "127.0.0.1");
    int port = tsp_rdv_port(r);
    ck_assert_int_gt(port, 0);
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, tok, RECORD, reply, sizeof reply, err, sizeof err), 0);
    ck_assert_str_eq(reply, "OK");
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(
            tsp_rdv_exchange("127.0.0.1", port, tok, NULL, reply, sizeof reply, err, sizeof err),
            0);
        ck_assert_str_eq(reply, RECORD);
    }
    req(port, "GET", reply, sizeof reply); /* the raw wire: MAC RECORD */
    char mac[TSP_RDV_MAC_HEX + 1];
    ck_assert_int_eq(tsp_rdv_record_mac(SECRET, RECORD, mac, sizeof mac), 0);
    ck_assert_uint_eq(strlen(reply), 65 + strlen(RECORD));
    ck_assert_int_eq(strncmp(reply, mac, TSP_RDV_MAC_HEX), 0);
    ck_assert_str_eq(reply + 65, RECORD);
    int puts = -1, gets = -1;
    tsp_rdv_counts(r, &puts, &gets);
    ck_assert_int_eq(puts, 1);
    ck_assert_int_eq(gets, 3);
    /* Accepted once: another authenticated record cannot replace it; rank 0 retrying the
     * same record is told OK. */
    put_line(SECRET, "{\"master_addr\": \"10.6.6.6\"}", line, sizeof line);
    req(port, line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR the election record was already sent");
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, tok, RECORD, reply, sizeof reply, err, sizeof err), 0);
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, tok, NULL, reply, sizeof reply, err, sizeof err), 0);
    ck_assert_str_eq(reply, RECORD);
    /* A reply buffer too small for the record. */
    char small[4];
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, tok, NULL, small, sizeof small, err, sizeof err),
        -ENOSPC);
    tsp_rdv_free(r);
}
END_TEST

/* Peers without the run's secret, from outside: one that speaks the old cleartext wire, a
 * replay of it, one with another secret (TLS refuses it), and an authenticated PUT whose
 * MAC is not the record's: none is taken; rank 0's own record then is, and every GET gets
 * it. On the old wire a sniffer who read the token put first and the run failed. */
START_TEST(test_rdv_forged_or_raced_put_is_refused)
{
    char err[512] = "", reply[TSP_RDV_LINE_MAX + 2], line[8192];
    tsp_rdv_t *r = tsp_rdv_start(NULL, SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int port = tsp_rdv_port(r);
    /* Plaintext, as before TLS: dropped without a reply. */
    snprintf(line, sizeof line, "%s PUT %064d {\"master_addr\": \"10.6.6.6\"}\n", SECRET, 0);
    raw(port, line, strlen(line), reply, sizeof reply);
    ck_assert_str_eq(reply, "");
    raw(port, "GET\n", 4, reply, sizeof reply);
    ck_assert_str_eq(reply, "");
    /* Another secret: the TLS handshake fails, the task is told so (not UNREACHABLE). */
    ck_assert_int_eq(tsp_rdv_exchange("127.0.0.1", port, OTHER, "{\"master_addr\": \"10.6.6.6\"}",
                                      reply, sizeof reply, err, sizeof err),
                     TSP_RDV_REFUSED);
    ck_assert_msg(strstr(err, "torchspark: the driver refused the rendezvous: its TLS handshake") ==
                      err,
                  "%s", err);
    /* Inside TLS, a record whose MAC is not made with the run's key. */
    snprintf(line, sizeof line, "PUT %064d {\"master_addr\": \"10.6.6.6\"}", 0);
    req(port, line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR the election record's MAC does not match the run's key");
    put_line(OTHER, "{\"master_addr\": \"10.6.6.6\"}", line, sizeof line);
    req(port, line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR the election record's MAC does not match the run's key");
    req(port, "PUT a", reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR the election record's MAC does not match the run's key");
    int puts = -1;
    tsp_rdv_counts(r, &puts, NULL);
    ck_assert_int_eq(puts, 0);
    /* Rank 0's record is still the one every GET gets. */
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, SECRET, RECORD, reply, sizeof reply, err, sizeof err),
        0);
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, SECRET, NULL, reply, sizeof reply, err, sizeof err), 0);
    ck_assert_str_eq(reply, RECORD);
    /* A bad secret is a bad argument; so is one for the server. */
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, "beef", NULL, reply, sizeof reply, err, sizeof err),
        -EINVAL);
    tsp_rdv_free(r);
    ck_assert_ptr_null(tsp_rdv_start(NULL, "beef", 0, err, sizeof err));
    ck_assert_msg(strstr(err, "secret") != NULL, "%s", err);
}
END_TEST

START_TEST(test_rdv_refusals)
{
    char err[512] = "", reply[TSP_RDV_LINE_MAX + 2], line[8192];
    tsp_rdv_t *r = tsp_rdv_start(NULL, SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int port = tsp_rdv_port(r);
    const char *tok = SECRET;
    req(port, "PUT", reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR unknown request");
    req(port, "POST x", reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR unknown request");
    req(port, "GET now", reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR unknown request");
    req(port, "", reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR unknown request");
    /* Over the line limit. */
    int n = snprintf(line, sizeof line, "PUT ");
    memset(line + n, 'x', 6000);
    line[n + 6000] = '\0';
    req(port, line, reply, sizeof reply);
    ck_assert_str_eq(reply, "ERR request too long");
    int puts = -1;
    tsp_rdv_counts(r, &puts, NULL);
    ck_assert_int_eq(puts, 0); /* nothing of it was taken as a record */
    /* The client refuses what it must not send. */
    char big[TSP_RDV_RECORD_MAX + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, tok, big, reply, sizeof reply, err, sizeof err),
        -EINVAL);
    ck_assert_msg(strstr(err, "too long (over 4096 bytes)") != NULL, "%s", err);
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, tok, "a\nb", reply, sizeof reply, err, sizeof err),
        -EINVAL);
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", port, tok, "", reply, sizeof reply, err, sizeof err),
        -EINVAL);
    ck_assert_int_eq(
        tsp_rdv_exchange("127.0.0.1", 0, tok, NULL, reply, sizeof reply, err, sizeof err), -EINVAL);
    tsp_rdv_free(r);
    /* A host that does not resolve: nothing starts. */
    ck_assert_ptr_null(tsp_rdv_start("no-such-host.invalid", SECRET, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "no-such-host.invalid") != NULL, "%s", err);
}
END_TEST

START_TEST(test_rdv_get_before_put_waits)
{
    char err[512] = "", reply[64];
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    get_job_t a = {.port = tsp_rdv_port(r), .token = SECRET};
    get_job_t b = a;
    pthread_t ta, tb;
    pthread_create(&ta, NULL, get_main, &a);
    pthread_create(&tb, NULL, get_main, &b);
    usleep(300 * 1000);
    int gets = -1;
    tsp_rdv_counts(r, NULL, &gets);
    ck_assert_int_eq(gets, 0); /* both still waiting */
    ck_assert_int_eq(tsp_rdv_exchange("127.0.0.1", a.port, a.token, RECORD, reply, sizeof reply,
                                      err, sizeof err),
                     0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_msg(a.rc == 0, "%s", a.err);
    ck_assert_str_eq(a.reply, RECORD);
    ck_assert_msg(b.rc == 0, "%s", b.err);
    ck_assert_str_eq(b.reply, RECORD);
    tsp_rdv_free(r);
}
END_TEST

START_TEST(test_rdv_close_answers_waiting_gets)
{
    char err[512] = "";
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    get_job_t a = {.port = tsp_rdv_port(r), .token = SECRET};
    pthread_t ta;
    pthread_create(&ta, NULL, get_main, &a);
    usleep(200 * 1000);
    struct timespec t0;
    clock_gettime(CLOCK_REALTIME, &t0);
    tsp_rdv_close(r);
    tsp_rdv_close(r); /* idempotent */
    pthread_join(ta, NULL);
    ck_assert_int_lt(ms_since(&t0), 2000);
    ck_assert_int_eq(a.rc, TSP_RDV_REFUSED);
    ck_assert_str_eq(a.err, "torchspark: the driver refused the rendezvous: the run ended");
    tsp_rdv_free(r);
    /* A GET whose time runs out is told so. */
    r = tsp_rdv_start("127.0.0.1", SECRET, 100, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    a = (get_job_t){.port = tsp_rdv_port(r), .token = SECRET};
    get_main(&a);
    ck_assert_int_eq(a.rc, TSP_RDV_REFUSED);
    ck_assert_str_eq(a.err, "torchspark: the driver refused the rendezvous: rank 0 sent no "
                            "election record within 100 ms");
    tsp_rdv_free(r);
}
END_TEST

START_TEST(test_rdv_call_waits_in_slices)
{
    char err[512] = "", reply[64];
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    tsp_rdv_call_t *c = NULL;
    ck_assert_int_eq(
        tsp_rdv_call_start("127.0.0.1", tsp_rdv_port(r), SECRET, NULL, &c, err, sizeof err), 0);
    for (int i = 0; i < 3; i++) /* what the JVM's kill check does between slices */
        ck_assert_int_eq(tsp_rdv_call_wait(c, 50, reply, sizeof reply, err, sizeof err),
                         TSP_RDV_PENDING);
    ck_assert_int_eq(tsp_rdv_exchange("127.0.0.1", tsp_rdv_port(r), SECRET, RECORD, reply,
                                      sizeof reply, err, sizeof err),
                     0);
    ck_assert_int_eq(tsp_rdv_call_wait(c, 5000, reply, sizeof reply, err, sizeof err), 0);
    ck_assert_str_eq(reply, RECORD);
    tsp_rdv_call_free(c);
    /* A call given up while waiting (the task was killed): the server drops it. */
    ck_assert_int_eq(
        tsp_rdv_call_start("127.0.0.1", tsp_rdv_port(r), SECRET, NULL, &c, err, sizeof err), 0);
    tsp_rdv_call_free(c);
    tsp_rdv_free(r);
}
END_TEST

/* The glues' JSON calls (docs/protocol.md 2.3): the server's ops on its handle (tsp_rdv_call),
 * a task's calls whole (tsp_rdv_task_call) and in slices (tsp_rdv_task_start, _wait, _free),
 * and their refusals. */
static void rdv_json(tsp_rdv_t *r, const char *request, int want, const char *reply)
{
    char out[8192] = "", err[512] = "";
    size_t need = 0;
    int rc = tsp_rdv_call(r, request, strlen(request), out, sizeof out, &need, err, sizeof err);
    ck_assert_msg(rc == want, "%s: %d (%s)", request, rc, err);
    ck_assert_str_eq(rc == 0 ? out : err, reply);
}

/* A task's call started from request and seen pending in its first slice (the JVM's way). */
static tsp_rdv_task_t *started_pending(const char *request)
{
    char out[64], err[512] = "";
    size_t need = 0;
    tsp_rdv_task_t *t = NULL;
    ck_assert_msg(tsp_rdv_task_start(request, strlen(request), &t, err, sizeof err) == 0, "%s",
                  err);
    ck_assert_int_eq(tsp_rdv_task_wait(t, 50, out, sizeof out, &need, err, sizeof err),
                     TSP_RDV_PENDING);
    return t;
}

START_TEST(test_rdv_json_calls)
{
    char err[512] = "", out[8192], req[1024];
    size_t need = 0;
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int port = tsp_rdv_port(r);
    snprintf(out, sizeof out, "{\"host\": \"127.0.0.1\", \"port\": %d}", port);
    rdv_json(r, "{\"op\": \"endpoint\"}", 0, out);
    snprintf(out, sizeof out, "{\"host\": \"10.0.0.1\", \"port\": %d}", port);
    rdv_json(r, "{\"op\": \"endpoint\", \"advertise\": \"10.0.0.1\"}", 0, out);
    rdv_json(r, "{\"op\": \"gang_state\"}", -EINVAL,
             "torchspark: the rendezvous has no gang armed");
    rdv_json(r, "{\"op\": \"gang\", \"nnodes\": 0, \"timeout_ms\": 100}", -EINVAL,
             "torchspark: cannot arm the gang of 0 tasks within 100 ms: a gang has 1..65536 "
             "tasks and a timeout > 0");
    rdv_json(r, "{\"op\": \"gang\", \"nnodes\": 2, \"timeout_ms\": 300}", 0, "{}");
    rdv_json(r, "{\"op\": \"gang\", \"nnodes\": 2, \"timeout_ms\": 300}", -EALREADY,
             "torchspark: cannot arm the gang of 2 tasks within 300 ms: this run's gang is armed "
             "already");
    rdv_json(r, "{\"op\": \"gang_failure\"}", -EINVAL,
             "torchspark: the rendezvous' gang has not failed");
    /* A JOIN in slices (the JVM's), the gang's state while it waits, then its deadline. */
    snprintf(req, sizeof req,
             "{\"op\": \"join\", \"host\": \"127.0.0.1\", \"port\": %d, \"secret_hex\": \"%s\", "
             "\"node_rank\": 0, \"attempt\": 0, \"task_host\": \"h 1\", \"timeout_ms\": 300}",
             port, SECRET);
    tsp_rdv_task_t *t = started_pending(req);
    rdv_json(r, "{\"op\": \"gang_state\"}", 0, "{\"state\": 0, \"joined\": 1}");
    usleep(400 * 1000);
    rdv_json(r, "{\"op\": \"gang_state\"}", 0, "{\"state\": 3, \"joined\": 1}");
    ck_assert_int_eq(tsp_rdv_task_wait(t, 5000, out, sizeof out, &need, err, sizeof err),
                     TSP_RDV_REFUSED);
    ck_assert_msg(strstr(err, "the driver refused node 0's task in the gang: the gang of 2") !=
                      NULL,
                  "%s", err);
    tsp_rdv_task_free(t);
    const char *fail = "{\"op\": \"gang_failure\", \"executors\": 1, \"cores\": -1}";
    int rc = tsp_rdv_call(r, fail, strlen(fail), out, sizeof out, &need, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_msg(strncmp(out, "{\"report\": {\"version\": 2, \"kind\": \"gang\"", 40) == 0, "%s",
                  out);
    ck_assert_msg(strstr(out, "(tasks started: node 0 on host h-1); Spark had 1 executor(s)"), "%s",
                  out);
    rdv_json(r, "{\"op\": \"reset\"}", -EINVAL,
             "tsp_rdv_call: unknown op \"reset\" (endpoint, counts, gang, gang_state or "
             "gang_failure)");
    rdv_json(r, "[]", -EINVAL, "tsp_rdv_call: the request is not a JSON object");
    rdv_json(NULL, "{\"op\": \"counts\"}", -EINVAL, "torchspark: the rendezvous is closed");
    rdv_json(r, "{\"op\": \"counts\"}", 0, "{\"puts\": 0, \"gets\": 0}");
    tsp_rdv_free(r);
}
END_TEST

/* A task's exchange whole and in slices, the golden cases' two, and their refusals. */
static int task_call(const char *request, char *out, size_t outlen, char *err, size_t errlen)
{
    size_t need = 0;
    return tsp_rdv_task_call(request, strlen(request), out, outlen, &need, err, errlen);
}

START_TEST(test_rdv_task_json_calls)
{
    char err[512] = "", out[8192], req[1024], mac[TSP_RDV_MAC_HEX + 1];
    size_t need = 0;
    tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int port = tsp_rdv_port(r);
    /* A GET in slices waits for rank 0's PUT (made whole), then hands its record. */
    snprintf(req, sizeof req,
             "{\"op\": \"exchange\", \"host\": \"127.0.0.1\", \"port\": %d, \"secret_hex\": "
             "\"%s\", \"node_rank\": 1}",
             port, SECRET);
    tsp_rdv_task_t *t = started_pending(req);
    snprintf(req, sizeof req,
             "{\"op\": \"exchange\", \"host\": \"127.0.0.1\", \"port\": %d, \"secret_hex\": "
             "\"%s\", \"node_rank\": 0, \"record\": \"{\\\"v\\\": 1}\"}",
             port, SECRET);
    ck_assert_msg(task_call(req, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out, "{\"record\": \"{\\\"v\\\": 1}\"}");
    ck_assert_int_eq(tsp_rdv_task_wait(t, 5000, out, 4, &need, err, sizeof err), -ENOSPC);
    ck_assert_int_eq(tsp_rdv_task_wait(t, 5000, out, need, &need, err, sizeof err), 0);
    ck_assert_str_eq(out, "{\"record\": \"{\\\"v\\\": 1}\"}");
    tsp_rdv_task_free(t);
    /* The golden cases' raw line and MAC. */
    snprintf(req, sizeof req,
             "{\"op\": \"request\", \"host\": \"127.0.0.1\", \"port\": %d, \"secret_hex\": "
             "\"%s\", \"line\": \"POST x\"}",
             port, SECRET);
    ck_assert_msg(task_call(req, out, sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out, "{\"reply\": \"ERR unknown request\"}");
    ck_assert_int_eq(tsp_rdv_record_mac(SECRET, "r", mac, sizeof mac), 0);
    snprintf(req, sizeof req, "{\"op\": \"record_mac\", \"secret_hex\": \"%s\", \"record\": \"r\"}",
             SECRET);
    ck_assert_msg(task_call(req, out, sizeof out, err, sizeof err) == 0, "%s", err);
    snprintf(req, sizeof req, "{\"mac\": \"%s\"}", mac);
    ck_assert_str_eq(out, req);
    /* Refusals: an endpoint without a port, an unknown op, a request that is no object. */
    ck_assert_int_eq(task_call("{\"op\": \"exchange\", \"host\": \"127.0.0.1\", \"secret_hex\": "
                               "\"x\", \"record\": null}",
                               out, sizeof out, err, sizeof err),
                     -EINVAL);
    ck_assert_str_eq(err, "torchspark: the rendezvous needs a host and a port 1..65535 (got "
                          "127.0.0.1:0)");
    ck_assert_int_eq(task_call("{\"op\": \"put\"}", out, sizeof out, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "tsp_rdv_task_call: unknown op \"put\" (exchange, join, request or "
                          "record_mac)");
    ck_assert_int_eq(tsp_rdv_task_start("1", 1, &t, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "tsp_rdv_task_start: the request is not a JSON object");
    ck_assert_ptr_null(t);
    tsp_rdv_free(r);
}
END_TEST

START_TEST(test_rdv_unreachable_driver_is_marked)
{
    char err[1024] = "", reply[64];
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    int port = ntohs(sa.sin_port);
    close(fd); /* nothing listens there now */
    const char *tok = SECRET;
    char want[128];
    snprintf(want, sizeof want, "the driver's rendezvous at 127.0.0.1:%d (Connection refused); ",
             port);
    for (int put = 0; put < 2; put++) {
        int rc = tsp_rdv_exchange("127.0.0.1", port, tok, put ? RECORD : NULL, reply, sizeof reply,
                                  err, sizeof err);
        ck_assert_int_eq(rc, -ECONNREFUSED);
        const char *begin = TSP_RDV_UNREACHABLE ": this barrier task on host ";
        ck_assert_msg(strncmp(err, begin, strlen(begin)) == 0, "%s", err);
        ck_assert_msg(strstr(err, want) != NULL, "%s", err);
        ck_assert_msg(strstr(err, "; the driver runs the job again through "
                                  "BarrierTaskContext.allGather") != NULL,
                      "%s", err);
    }
    /* An IPv6 endpoint is shown in brackets. */
    tsp_rdv_exchange("[::1]", port, tok, NULL, reply, sizeof reply, err, sizeof err);
    snprintf(want, sizeof want, "rendezvous at [::1]:%d (", port);
    ck_assert_msg(strstr(err, want) != NULL, "%s", err);
}
END_TEST

/* A flood of idle connections that never start TLS, against a driver out of descriptors
 * (the server in a child limited to 32): the oldest of them make room, and a real task's
 * PUT and GET still go through at once, not after the flood's 10 s handshake deadline. */
START_TEST(test_rdv_idle_flood_does_not_keep_a_task_out)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
        struct rlimit rl = {.rlim_cur = 32, .rlim_max = 32};
        setrlimit(RLIMIT_NOFILE, &rl);
        char err[256];
        tsp_rdv_t *r = tsp_rdv_start("127.0.0.1", SECRET, 0, err, sizeof err);
        int port = r ? tsp_rdv_port(r) : 0;
        ssize_t w = write(p[1], &port, sizeof port);
        (void)w;
        pause(); /* until the test kills it */
        _exit(0);
    }
    close(p[1]);
    int port = 0;
    ck_assert_int_eq(read(p[0], &port, sizeof port), (ssize_t)sizeof port);
    close(p[0]);
    ck_assert_int_gt(port, 0);
    int idle[60];
    for (int i = 0; i < 60; i++) {
        idle[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        ck_assert_int_eq(connect(idle[i], (struct sockaddr *)&sa, sizeof sa), 0);
    }
    usleep(300 * 1000); /* the server took what its descriptors allow */
    char err[512] = "", reply[TSP_RDV_LINE_MAX + 2];
    struct timespec t0;
    clock_gettime(CLOCK_REALTIME, &t0);
    int put =
        tsp_rdv_exchange("127.0.0.1", port, SECRET, RECORD, reply, sizeof reply, err, sizeof err);
    int get = put ? put
                  : tsp_rdv_exchange("127.0.0.1", port, SECRET, NULL, reply, sizeof reply, err,
                                     sizeof err);
    long ms = ms_since(&t0);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    for (int i = 0; i < 60; i++)
        close(idle[i]);
    ck_assert_msg(put == 0 && get == 0, "%s", err);
    ck_assert_str_eq(reply, RECORD);
    ck_assert_msg(ms < 5000, "%ld ms", ms);
}
END_TEST

static Suite *rendezvous_suite(void)
{
    Suite *s = suite_create("rendezvous");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_rdv_put_then_get);
    tcase_add_test(tc, test_rdv_refusals);
    tcase_add_test(tc, test_rdv_forged_or_raced_put_is_refused);
    tcase_add_test(tc, test_rdv_get_before_put_waits);
    tcase_add_test(tc, test_rdv_close_answers_waiting_gets);
    tcase_add_test(tc, test_rdv_call_waits_in_slices);
    tcase_add_test(tc, test_rdv_json_calls);
    tcase_add_test(tc, test_rdv_task_json_calls);
    tcase_add_test(tc, test_rdv_unreachable_driver_is_marked);
    tcase_add_test(tc, test_rdv_idle_flood_does_not_keep_a_task_out);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(rendezvous_suite());
}
