/* test_logcontrol.c: the log channel as a control channel (docs/protocol.md 1.7): a
 * FAILURE event makes the server STOP every other agent and keep the root cause; an agent
 * gone without CLOSE is "lost" unless it is back within the grace; stop_all; an agent that
 * does not ask for CONTROL neither sends events nor gets STOP; an event queued before the
 * first handshake is sent after it, and the client's close waits for it (bounded). Real
 * clients and server on loopback; raw connections through the agents' own dialer. */
#include <fcntl.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "json.h"
#include "logdial.h"
#include "logtest.h"
#include "testutil.h"

typedef struct stopper {
    atomic_int calls;
    atomic_int reason;
    char text[1100];
} stopper_t;

static void on_stop(void *ctx, int reason, const char *text, size_t len)
{
    stopper_t *st = ctx;
    snprintf(st->text, sizeof st->text, "%.*s", (int)len, text);
    atomic_store(&st->reason, reason);
    atomic_fetch_add(&st->calls, 1);
}

/* The hang doctor's DUMP (protocol 1.9), as a client reports it. */
typedef struct dumper {
    atomic_int calls;
    atomic_uint last;
    atomic_int checkpoints, why; /* the driver's CHECKPOINT (protocol 1.13) */
} dumper_t;

static void on_dump(void *ctx, unsigned request)
{
    dumper_t *d = ctx;
    atomic_store(&d->last, request);
    atomic_fetch_add(&d->calls, 1);
}

static void on_checkpoint(void *ctx, int why)
{
    dumper_t *d = ctx;
    atomic_store(&d->why, why);
    atomic_fetch_add(&d->checkpoints, 1);
}

static dumper_t *next_dumper; /* the next ctl_client's on_dump context, when set */

static tsp_logserver_t *ctl_server(int lost_grace_ms)
{
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.event_fd = -1;
    o.lost_grace_ms = lost_grace_ms;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    return s;
}

static tsp_logclient_t *ctl_client(tsp_logserver_t *srv, int node_rank, const char *host,
                                   stopper_t *st, int no_control)
{
    tsp_logclient_opts_t o;
    tsp_logclient_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = tsp_logserver_port(srv);
    o.node_rank = node_rank;
    o.hostname = host;
    o.on_stop = on_stop;
    o.on_stop_ctx = st;
    o.no_control = no_control;
    if (next_dumper) {
        o.on_dump = on_dump;
        o.on_dump_ctx = next_dumper;
        o.on_checkpoint = on_checkpoint;
        o.on_checkpoint_ctx = next_dumper;
        next_dumper = NULL;
    }
    tsp_logserver_secret(srv, o.secret);
    char err[256];
    tsp_logclient_t *c = tsp_logclient_start(&o, err, sizeof err);
    ck_assert_msg(c != NULL, "%s", err);
    for (int i = 0; i < 500; i++) { /* connected (the handshake is done) within 5 s */
        tsp_logclient_stats_t cs;
        tsp_logclient_stats(c, &cs);
        if (cs.connected)
            return c;
        usleep(10 * 1000);
    }
    ck_abort_msg("the client did not connect");
    return NULL;
}

static void wait_calls(stopper_t *st, int want)
{
    for (int i = 0; i < 500 && atomic_load(&st->calls) < want; i++)
        usleep(10 * 1000);
    ck_assert_int_eq(atomic_load(&st->calls), want);
}

START_TEST(test_logcontrol_failure_stops_the_others)
{
    tsp_logserver_t *s = ctl_server(1000);
    stopper_t sa = {0}, sb = {0}, sc = {0};
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &sa, 0);
    tsp_logclient_t *b = ctl_client(s, 1, "host-b", &sb, 0);
    char buf[4096];
    ck_assert_int_eq(tsp_logserver_failure(s, buf, sizeof buf, 0), 0);
    const char *rep = "{\"message\": {\"message\": \"boom\"}, \"torchspark\": {\"rank\": 1, "
                      "\"exitcode\": 3, \"signal\": 0, \"summary\": \"rank 1 (node 1, local rank "
                      "0) on host host-b exited with code 3\"}}";
    ck_assert_int_eq(tsp_logclient_event(b, TSP_WIRE_EVENT_FAILURE, 1, rep, strlen(rep)), 0);
    long need = tsp_logserver_failure(s, buf, sizeof buf, 5000);
    ck_assert_int_gt(need, 0);
    ck_assert_int_eq((long)strlen(buf), need);
    ck_assert_ptr_nonnull(strstr(buf, "\"kind\": \"failure\""));
    ck_assert_ptr_nonnull(strstr(buf, "\"node_rank\": 1"));
    ck_assert_ptr_nonnull(strstr(buf, "\"host\": \"host-b\""));
    /* the agent's summary, written once (report.c), with the address the driver saw */
    ck_assert_msg(strstr(buf, "rank 1 (node 1, local rank 0) on host host-b exited with code 3 "
                              "(address 127.0.0.1)"),
                  "%s", buf);
    char *boom = NULL; /* the report, embedded as the JSON object it is */
    int type = 0;
    ck_assert_msg(tsp_json_get(buf, strlen(buf), "report.message.message", &boom, &type) == 0, "%s",
                  buf);
    ck_assert_str_eq(boom, "boom");
    free(boom);
    wait_calls(&sa, 1);
    ck_assert_int_eq(atomic_load(&sa.reason), TSP_WIRE_STOP_FAILED);
    ck_assert_ptr_nonnull(strstr(sa.text, "host-b"));
    /* a node that connects after the stop is stopped at once; the failed one is not */
    tsp_logclient_t *c = ctl_client(s, 2, "host-c", &sc, 0);
    wait_calls(&sc, 1);
    usleep(200 * 1000);
    ck_assert_int_eq(atomic_load(&sb.calls), 0);
    ck_assert_int_eq(tsp_logclient_close(b, 5000), 0); /* the event was acknowledged */
    ck_assert_int_eq(tsp_logclient_close(a, 5000), 0);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

/* An authenticated LOGS connection of agent_id through the agents' own dialer. */
static int raw_agent(tsp_logserver_t *s, uint64_t agent_id, int node_rank, const char *host)
{
    uint8_t secret[32];
    tsp_logserver_secret(s, secret);
    char err[600];
    int flags = -1;
    tsp__tls_t *t = NULL;
    int rc = tsp__logdial("127.0.0.1", tsp_logserver_port(s), secret, TSP_WIRE_ROLE_LOGS,
                          TSP_WIRE_HELLO_CONTROL, agent_id, node_rank, host, 5000, &t, &flags, err,
                          sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    int fd = tls_relay_adopt(t, err, sizeof err); /* raw frames from here on */
    ck_assert_msg(fd >= 0, "%s", err);
    ck_assert_int_eq(flags, TSP_WIRE_WELCOME_CONTROL);
    return fd;
}

START_TEST(test_logcontrol_lost_agent_names_its_host)
{
    tsp_logserver_t *s = ctl_server(300);
    stopper_t sa = {0};
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &sa, 0);
    /* back within the grace: not lost */
    int fd = raw_agent(s, 77, 1, "host-b");
    close(fd);
    usleep(50 * 1000);
    fd = raw_agent(s, 77, 1, "host-b");
    char buf[2048];
    ck_assert_int_eq(tsp_logserver_failure(s, buf, sizeof buf, 800), 0);
    ck_assert_int_eq(atomic_load(&sa.calls), 0);
    /* gone for good (no CLOSE): lost, named by host and address */
    close(fd);
    for (int i = 0; i < 100 && !tsp_logserver_lost_pending(s); i++)
        usleep(2000);
    ck_assert_int_eq(tsp_logserver_lost_pending(s), 1); /* within the grace */
    ck_assert_int_gt(tsp_logserver_failure(s, buf, sizeof buf, 5000), 0);
    ck_assert_int_eq(tsp_logserver_lost_pending(s), 0);
    ck_assert_ptr_nonnull(strstr(buf, "\"kind\": \"lost\""));
    ck_assert_msg(strstr(buf, "lost connection to node 1 (host host-b, address 127.0.0.1)"), "%s",
                  buf);
    /* the lost node's failure document, built here once for both glues */
    ck_assert_msg(strstr(buf, "\"report\": {\"torchspark\": {\"node_rank\": 1, \"kind\": \"lost\", "
                              "\"reason\": \"eof\", \"host\": \"host-b\", \"peer\": \"127.0.0.1:"),
                  "%s", buf);
    ck_assert_msg(strstr(buf, "\"summary\": \"lost connection to node 1 (host host-b, address "
                              "127.0.0.1)"),
                  "%s", buf);
    wait_calls(&sa, 1);
    ck_assert_int_eq(atomic_load(&sa.reason), TSP_WIRE_STOP_LOST);
    ck_assert_int_eq(tsp_logclient_close(a, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logcontrol_clean_close_and_stop_all)
{
    tsp_logserver_t *s = ctl_server(100);
    stopper_t sa = {0}, sb = {0}, sn = {0};
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &sa, 0);
    tsp_logclient_t *b = ctl_client(s, 1, "host-b", &sb, 0);
    tsp_logclient_t *n = ctl_client(s, 2, "host-old", &sn, 1); /* no CONTROL asked */
    ck_assert_int_eq(tsp_logclient_event(n, TSP_WIRE_EVENT_FAILURE, 2, "{}", 2), -ENOTSUP);
    ck_assert_int_eq(tsp_logclient_close(b, 5000), 0); /* CLOSE: not a failure */
    char buf[1024];
    ck_assert_msg(tsp_logserver_failure(s, buf, sizeof buf, 500) == 0, "%s", buf);
    ck_assert_int_eq(tsp_logserver_stop_all(s, "cancelled by the user"), 0);
    wait_calls(&sa, 1);
    ck_assert_int_eq(atomic_load(&sa.reason), TSP_WIRE_STOP_ENDED);
    ck_assert_str_eq(sa.text, "cancelled by the user");
    usleep(200 * 1000);
    ck_assert_int_eq(atomic_load(&sn.calls), 0);
    ck_assert_int_eq(tsp_logserver_failure(s, buf, sizeof buf, 0), 0);
    ck_assert_int_eq(tsp_logclient_close(a, 5000), 0);
    ck_assert_int_eq(tsp_logclient_close(n, 5000), 0);
    tsp_logserver_shutdown(s, 0);
    ck_assert_int_eq(tsp_logserver_failure(s, buf, sizeof buf, -1), 0); /* ended: no hang */
    ck_assert_int_eq(tsp_logserver_stop_all(s, NULL), -EPIPE);
    tsp_logserver_free(s);
}
END_TEST

static void send_json(tsp_logclient_t *c, int kind, const char *json);

static int nodes_lost(tsp_logserver_t *s, int want, int32_t *ranks)
{
    int n = 0;
    for (int i = 0; i < 500 && (n = tsp_logserver_nodes_lost(s, ranks, 8)) < want; i++)
        usleep(10 * 1000);
    return n;
}

/* The nodes lost (docs/protocol.md 1.7): an agent whose executor JVM died (EVENT
 * EXECUTOR_GONE, then a clean CLOSE) and one whose channel ended without CLOSE before the run was
 * stopped, in order, each once; a CLOSE alone, an agent back within its grace and one gone
 * after the STOP are not. */
START_TEST(test_logcontrol_nodes_lost_before_the_stop)
{
    tsp_logserver_t *s = ctl_server(300);
    stopper_t sa = {0}, sb = {0}, sc = {0};
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &sa, 0);
    tsp_logclient_t *b = ctl_client(s, 2, "host-b", &sb, 0);
    tsp_logclient_t *c = ctl_client(s, 3, "host-c", &sc, 0);
    int32_t ranks[8];
    ck_assert_int_eq(tsp_logserver_nodes_lost(s, NULL, 0), 0);
    send_json(b, TSP_WIRE_EVENT_EXECUTOR_GONE, "{\"signal\": 1}");
    send_json(b, TSP_WIRE_EVENT_EXECUTOR_GONE, "{\"signal\": 15}"); /* once */
    ck_assert_int_eq(tsp_logclient_close(b, 5000), 0);
    ck_assert_int_eq(nodes_lost(s, 1, ranks), 1);
    ck_assert_int_eq(ranks[0], 2);
    int fd = raw_agent(s, 77, 1, "host-d"); /* back within the grace: not lost */
    close(fd);
    usleep(50 * 1000);
    fd = raw_agent(s, 77, 1, "host-d");
    ck_assert_int_eq(tsp_logserver_nodes_lost(s, ranks, 8), 1);
    close(fd); /* gone for good, before any stop: the root cause and a node lost */
    ck_assert_int_eq(nodes_lost(s, 2, ranks), 2);
    ck_assert_int_eq(ranks[0], 2);
    ck_assert_int_eq(ranks[1], 1);
    char buf[2048];
    ck_assert_int_gt(tsp_logserver_failure(s, buf, sizeof buf, 5000), 0);
    wait_calls(&sc, 1); /* the run is stopped: an agent gone now is a consequence */
    fd = raw_agent(s, 78, 4, "host-e");
    close(fd);
    usleep(500 * 1000);
    ck_assert_int_eq(tsp_logserver_nodes_lost(s, ranks, 1), 2); /* the count, one copied */
    ck_assert_int_eq(ranks[0], 2);
    ck_assert_int_eq(tsp_logclient_close(a, 5000), 0);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

/* Each DUMP reaches every control agent once, in order, with its number; an agent
 * without CONTROL gets none, nor one that was told to stop. CHECKPOINT the same, with its
 * why (only 1 to 255 asked). */
START_TEST(test_logcontrol_dump_reaches_the_control_agents)
{
    tsp_logserver_t *s = ctl_server(100);
    stopper_t sa = {0}, sn = {0};
    dumper_t da = {0}, dn = {0};
    next_dumper = &da;
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &sa, 0);
    next_dumper = &dn;
    tsp_logclient_t *n = ctl_client(s, 1, "host-old", &sn, 1); /* no CONTROL asked */
    ck_assert_int_eq(tsp_logserver_dump_all(s), 1);
    for (int i = 0; i < 500 && atomic_load(&da.calls) < 1; i++)
        usleep(10 * 1000);
    ck_assert_int_eq(atomic_load(&da.calls), 1);
    ck_assert_uint_eq(atomic_load(&da.last), 1);
    ck_assert_int_eq(tsp_logserver_dump_all(s), 2);
    for (int i = 0; i < 500 && atomic_load(&da.calls) < 2; i++)
        usleep(10 * 1000);
    ck_assert_uint_eq(atomic_load(&da.last), 2);
    ck_assert_int_eq(tsp_logserver_checkpoint_all(s, 0), -EINVAL);
    ck_assert_int_eq(tsp_logserver_checkpoint_all(s, 256), -EINVAL);
    ck_assert_int_eq(tsp_logserver_checkpoint_all(s, TSP_WIRE_CHECKPOINT_GROW), 0);
    for (int i = 0; i < 500 && atomic_load(&da.checkpoints) < 1; i++)
        usleep(10 * 1000);
    ck_assert_int_eq(atomic_load(&da.why), TSP_WIRE_CHECKPOINT_GROW);
    ck_assert_int_eq(tsp_logserver_stop_all(s, "cancelled"), 0);
    wait_calls(&sa, 1);
    ck_assert_int_eq(tsp_logserver_dump_all(s), 3); /* asked, but nobody is to get it */
    ck_assert_int_eq(tsp_logserver_checkpoint_all(s, 1), 0);
    usleep(200 * 1000);
    ck_assert_int_eq(atomic_load(&da.calls), 2);
    ck_assert_int_eq(atomic_load(&da.checkpoints), 1);
    ck_assert_int_eq(atomic_load(&dn.calls) + atomic_load(&dn.checkpoints), 0);
    ck_assert_int_eq(tsp_logclient_close(a, 5000), 0);
    ck_assert_int_eq(tsp_logclient_close(n, 5000), 0);
    tsp_logserver_shutdown(s, 0);
    ck_assert_int_eq(tsp_logserver_dump_all(s), -EPIPE);
    ck_assert_int_eq(tsp_logserver_checkpoint_all(s, 1), -EPIPE);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logcontrol_wire_rules)
{
    uint8_t b[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_t h = {.type = TSP_WIRE_WELCOME, .flags = 1, .rank = -1, .length = 32}, o;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1024, NULL, 0), 0);
    b[1] = 2; /* an unknown WELCOME flag */
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1024, NULL, 0), -EBADMSG);
    h = (tsp_wire_hdr_t){.type = TSP_WIRE_EVENT, .rank = -1, .length = 8};
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1 << 20, NULL, 0), -EBADMSG);
    h.length = 9 + TSP_WIRE_MAX_EVENT + 1;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1 << 20, NULL, 0), -EMSGSIZE);
    h = (tsp_wire_hdr_t){.type = TSP_WIRE_EVENT, .rank = -2, .length = 9};
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1 << 20, NULL, 0), -EBADMSG);
    h = (tsp_wire_hdr_t){.type = TSP_WIRE_STOP, .rank = -1, .length = 0};
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1 << 20, NULL, 0), -EBADMSG);
    ck_assert_str_eq(tsp_wire_type_name(TSP_WIRE_STOP), "STOP");
}
END_TEST

/* A loopback port that nothing listens on (yet). */
static int unused_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &al), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static tsp_logclient_t *early_client(int port, const uint8_t *secret, int err_fd, int flush_ms)
{
    tsp_logclient_opts_t o;
    tsp_logclient_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = port;
    o.node_rank = 1;
    o.hostname = "host-early";
    o.local_out_fd = err_fd; /* the fallback's lines too: the test's own stdout stays clean */
    o.local_err_fd = err_fd;
    o.event_flush_ms = flush_ms;
    memcpy(o.secret, secret, sizeof o.secret);
    char err[256];
    tsp_logclient_t *c = tsp_logclient_start(&o, err, sizeof err);
    ck_assert_msg(c != NULL, "%s", err);
    return c;
}

typedef struct late_server {
    int port, delay_ms;
    const uint8_t *secret;
    tsp_logserver_t *s;
} late_server_t;

static void *start_late(void *arg)
{
    late_server_t *ls = arg;
    usleep((useconds_t)ls->delay_ms * 1000);
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.port = ls->port;
    o.secret = ls->secret;
    o.event_fd = -1;
    char err[256];
    ls->s = tsp_logserver_start(&o, err, sizeof err);
    return NULL;
}

static const char *const EARLY_REPORT =
    "{\"message\": {\"message\": \"early\"}, \"torchspark\": {\"rank\": 3, \"exitcode\": 3, "
    "\"signal\": 0}}";

/* The worker failed before the driver was reached (the failure of the e2e test
 * test_logchannel_early_failure.py, where the driver accepts late): the event is held
 * until a handshake grants CONTROL, then sent behind the line printed before it, and the
 * client's close, called while no driver exists yet, waits for the acknowledgement. */
START_TEST(test_logcontrol_event_before_the_handshake_is_sent_after_it)
{
    uint8_t secret[32];
    memset(secret, 0x5a, sizeof secret);
    int errp[2];
    ck_assert_int_eq(pipe2(errp, O_NONBLOCK), 0);
    late_server_t ls = {.port = unused_port(), .delay_ms = 400, .secret = secret};
    tsp_logclient_t *c = early_client(ls.port, secret, errp[1], 5000);
    sink_put(tsp_logclient_sink(c), 3, 1, "last words", 10);
    ck_assert_int_eq(
        tsp_logclient_event(c, TSP_WIRE_EVENT_FAILURE, 3, EARLY_REPORT, strlen(EARLY_REPORT)), 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, start_late, &ls), 0);
    int64_t t0 = tsp__now_ms();
    int rc = tsp_logclient_close(c, 10000); /* the driver does not exist yet */
    pthread_join(th, NULL);
    ck_assert_ptr_nonnull(ls.s);
    ck_assert_int_lt(tsp__now_ms() - t0, 6000);
    char buf[4096];
    long need = tsp_logserver_failure(ls.s, buf, sizeof buf, 2000);
    ck_assert_msg(need > 0, "the held event never reached the driver (close: %d)", rc);
    /* a document without its summary: what the driver itself knows of the node */
    ck_assert_msg(strstr(buf, "node 1 (host host-early, address 127.0.0.1) failed"), "%s", buf);
    /* the line went to the local fallback (the driver was not there when it came) or to
     * the driver; the event, never to the fallback: it is in the driver's report */
    char *early = NULL;
    int type = 0;
    ck_assert_msg(tsp_json_get(buf, strlen(buf), "report.message.message", &early, &type) == 0,
                  "%s", buf);
    ck_assert_str_eq(early, "early");
    free(early);
    tsp_logserver_free(ls.s);
    close(errp[0]);
    close(errp[1]);
}
END_TEST

/* No driver ever: the held event keeps close() no longer than event_flush_ms, and one
 * warning says it was not sent. */
START_TEST(test_logcontrol_held_event_without_driver_is_bounded)
{
    uint8_t secret[32];
    memset(secret, 0x5b, sizeof secret);
    int errp[2];
    ck_assert_int_eq(pipe2(errp, O_NONBLOCK), 0);
    tsp_logclient_t *c = early_client(unused_port(), secret, errp[1], 700);
    ck_assert_int_eq(
        tsp_logclient_event(c, TSP_WIRE_EVENT_FAILURE, 3, EARLY_REPORT, strlen(EARLY_REPORT)), 0);
    int64_t t0 = tsp__now_ms();
    ck_assert_int_eq(tsp_logclient_close(c, 30000), -ENOTCONN);
    int64_t took = tsp__now_ms() - t0;
    ck_assert_msg(took >= 600 && took < 5000, "close took %lld ms", (long long)took);
    char b[4096];
    ssize_t n = read(errp[0], b, sizeof b - 1);
    ck_assert_int_gt(n, 0);
    b[n] = 0;
    ck_assert_msg(strstr(b, "warning: 1 failure report(s) could not be sent to the driver's "
                            "log server"),
                  "%s", b);
    close(errp[0]);
    close(errp[1]);
}
END_TEST

/* A server whose event lines go to a pipe (read end in *rfd). */
static tsp_logserver_t *event_server(int *rfd)
{
    int p[2];
    ck_assert_int_eq(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.event_fd = p[1];
    o.lost_grace_ms = 1000;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    *rfd = p[0];
    return s;
}

static void send_json(tsp_logclient_t *c, int kind, const char *json)
{
    ck_assert_int_eq(tsp_logclient_event(c, kind, -1, json, strlen(json)), 0);
}

START_TEST(test_logcontrol_nccl_env_differs_from_node_zero)
{
    int rfd;
    tsp_logserver_t *s = event_server(&rfd);
    stopper_t st[3] = {{0}};
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &st[0], 0);
    tsp_logclient_t *b = ctl_client(s, 1, "host-b", &st[1], 0);
    tsp_logclient_t *c = ctl_client(s, 2, "host-c", &st[2], 0);
    /* node 1's comes before node 0's: compared once node 0's arrives; node 2 agrees */
    send_json(b, TSP_WIRE_EVENT_NODE,
              "{\"nnodes\": 3, \"nproc\": 1, \"env\": \"NCCL_DEBUG=INFO\\nNCCL_IB_GID_INDEX=5\"}");
    ck_assert_int_eq(tsp_logclient_close(b, 5000), 0);
    const char *same =
        "{\"nnodes\": 3, \"nproc\": 1, \"env\": \"NCCL_IB_GID_INDEX=3\\nNCCL_NET=IB\"}";
    send_json(a, TSP_WIRE_EVENT_NODE, same);
    send_json(a, TSP_WIRE_EVENT_NODE, same); /* a repeated one changes nothing */
    send_json(c, TSP_WIRE_EVENT_NODE, same);
    ck_assert_int_eq(tsp_logclient_close(a, 5000), 0);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_shutdown(s, 1000);
    char out[8192];
    ssize_t n = read(rfd, out, sizeof out - 1);
    out[n > 0 ? n : 0] = 0;
    int warnings = 0;
    for (const char *p = out; (p = strstr(p, "WARNING")); p++)
        warnings++;
    ck_assert_msg(warnings == 1, "%d warnings: %s", warnings, out);
    ck_assert_msg(strstr(out, "torchspark: WARNING: the NCCL settings of node 1 (host host-b) "
                              "differ from rank 0's node 0 (host host-a): NCCL_DEBUG is 'INFO' "
                              "there and unset on node 0; NCCL_IB_GID_INDEX is '5' there and "
                              "'3' on node 0; NCCL_NET is unset there and 'IB' on node 0\n"),
                  "%s", out);
    close(rfd);
    tsp_logserver_free(s);
}
END_TEST

/* Node 0 times out in the NCCL check; who never reported, job-wide, is in the root cause. */
static void check_timeout_detail(int started2, int connect2, const char *want)
{
    int rfd;
    tsp_logserver_t *s = event_server(&rfd);
    stopper_t st[3] = {{0}};
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &st[0], 0);
    tsp_logclient_t *b = ctl_client(s, 1, "host-b", &st[1], 0);
    tsp_logclient_t *c = connect2 ? ctl_client(s, 2, "host-c", &st[2], 0) : NULL;
    const char *node = "{\"nnodes\": 3, \"nproc\": 2, \"env\": \"\"}";
    send_json(b, TSP_WIRE_EVENT_NODE, node);
    send_json(b, TSP_WIRE_EVENT_NCCL_CHECK, "{\"state\": \"started\"}");
    if (c && started2) {
        send_json(c, TSP_WIRE_EVENT_NODE, node);
        send_json(c, TSP_WIRE_EVENT_NCCL_CHECK, "{\"state\": \"started\"}");
        /* Processed before node 0's, as b's below: each client has its own connection, so
         * nothing else orders its events before node 0's failure (a slow sender thread,
         * under TSan, lost that race). */
        ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
        c = NULL;
    }
    ck_assert_int_eq(tsp_logclient_close(b, 5000), 0); /* processed before node 0's */
    send_json(a, TSP_WIRE_EVENT_NODE, node);
    send_json(a, TSP_WIRE_EVENT_NCCL_CHECK, "{\"state\": \"started\"}");
    send_json(a, TSP_WIRE_EVENT_NCCL_CHECK, "{\"state\": \"timeout\"}");
    send_json(a, TSP_WIRE_EVENT_FAILURE,
              "{\"message\": {\"message\": \"torchspark: NCCL check timed out\"}, "
              "\"torchspark\": {\"rank\": 0, \"exitcode\": 1, \"signal\": 0}}");
    char buf[8192];
    ck_assert_int_gt(tsp_logserver_failure(s, buf, sizeof buf, 5000), 0);
    char *detail = NULL;
    int type = 0;
    ck_assert_int_eq(tsp_json_get(buf, strlen(buf), "detail", &detail, &type), 0);
    ck_assert_msg(type == TSP_JSON_STRING, "%s", buf);
    ck_assert_str_eq(detail, want);
    free(detail);
    tsp_logclient_close(a, 5000);
    if (c)
        tsp_logclient_close(c, 5000);
    close(rfd);
    tsp_logserver_free(s);
}

START_TEST(test_logcontrol_nccl_check_timeout_names_who_never_reported)
{
    check_timeout_detail(0, 1,
                         "NCCL check across the job: node 2 (host host-c) never reported: its "
                         "check never started, so its ranks never joined and the other nodes "
                         "waited until the deadline; see that node's executor's log");
    check_timeout_detail(0, 0,
                         "NCCL check across the job: node 2 (no agent connected from it) never "
                         "reported: its check never started, so its ranks never joined and the "
                         "other nodes waited until the deadline; see that node's executor's log");
    check_timeout_detail(1, 1,
                         "NCCL check across the job: all 3 nodes started it and none is missing, "
                         "so the ranks were stuck inside NCCL (a hang in NCCL or in the network "
                         "between the nodes)");
}
END_TEST

START_TEST(test_logcontrol_failure_without_check_has_no_detail)
{
    tsp_logserver_t *s = ctl_server(1000);
    stopper_t st = {0};
    tsp_logclient_t *a = ctl_client(s, 0, "host-a", &st, 0);
    send_json(a, TSP_WIRE_EVENT_NODE, "{\"nnodes\": 2, \"nproc\": 1, \"env\": \"\"}");
    send_json(a, TSP_WIRE_EVENT_FAILURE, "{\"torchspark\": {\"rank\": 0}}");
    char buf[4096];
    ck_assert_int_gt(tsp_logserver_failure(s, buf, sizeof buf, 5000), 0);
    ck_assert_msg(strstr(buf, "\"detail\": null"), "%s", buf);
    tsp_logclient_close(a, 5000);
    tsp_logserver_free(s);
}
END_TEST

static Suite *logcontrol_suite(void)
{
    Suite *s = suite_create("logcontrol");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_logcontrol_failure_stops_the_others);
    tcase_add_test(tc, test_logcontrol_lost_agent_names_its_host);
    tcase_add_test(tc, test_logcontrol_clean_close_and_stop_all);
    tcase_add_test(tc, test_logcontrol_nodes_lost_before_the_stop);
    tcase_add_test(tc, test_logcontrol_wire_rules);
    tcase_add_test(tc, test_logcontrol_dump_reaches_the_control_agents);
    tcase_add_test(tc, test_logcontrol_event_before_the_handshake_is_sent_after_it);
    tcase_add_test(tc, test_logcontrol_held_event_without_driver_is_bounded);
    tcase_add_test(tc, test_logcontrol_nccl_env_differs_from_node_zero);
    tcase_add_test(tc, test_logcontrol_nccl_check_timeout_names_who_never_reported);
    tcase_add_test(tc, test_logcontrol_failure_without_check_has_no_detail);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(logcontrol_suite());
}
