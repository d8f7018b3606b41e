/* test_keepalive.c: silent agents (docs/protocol.md 1.7, "Silent agents"): an agent that
 * asked for KEEPALIVE and then sends nothing (a frozen host, whose kernel still answers
 * TCP keepalives) is declared lost by the server, "went silent", within TSP_WIRE_SILENT_MS
 * (no lost grace on top: the grace here is longer than the bound); a real client that has nothing
 * to say keeps its connection alive with PINGs; an agent without KEEPALIVE is never timed out. Real
 * client and server on loopback; raw connections through the agents' own dialer. */
#include <stdatomic.h>

#include "logdial.h"
#include "logtest.h"
#include "testutil.h"

static void on_stop(void *ctx, int reason, const char *text, size_t len)
{
    (void)reason, (void)text, (void)len;
    atomic_fetch_add((atomic_int *)ctx, 1);
}

static int raw_agent(tsp_logserver_t *s, uint64_t agent_id, int node_rank, const char *host,
                     int hflags)
{
    uint8_t secret[32];
    tsp_logserver_secret(s, secret);
    char err[600];
    int flags = -1;
    tsp__tls_t *t = NULL;
    int rc = tsp__logdial("127.0.0.1", tsp_logserver_port(s), secret, TSP_WIRE_ROLE_LOGS, hflags,
                          agent_id, node_rank, host, 5000, &t, &flags, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    int fd = tls_relay_adopt(t, err, sizeof err); /* raw frames from here on */
    ck_assert_msg(fd >= 0, "%s", err);
    ck_assert_int_eq(flags, TSP_WIRE_WELCOME_CONTROL);
    return fd;
}

START_TEST(test_keepalive_silent_agent_is_lost_idle_client_is_not)
{
    tsp_logserver_opts_t so;
    tsp_logserver_opts_init(&so);
    so.event_fd = -1;
    so.lost_grace_ms = 4000; /* not waited for a silent agent */
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&so, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);

    /* node 0: a real client with nothing to print (it PINGs) */
    atomic_int stops = 0;
    tsp_logclient_opts_t o;
    tsp_logclient_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = tsp_logserver_port(s);
    o.node_rank = 0;
    o.hostname = "host-a";
    o.on_stop = on_stop;
    o.on_stop_ctx = &stops;
    tsp_logserver_secret(s, o.secret);
    tsp_logclient_t *a = tsp_logclient_start(&o, err, sizeof err);
    ck_assert_msg(a != NULL, "%s", err);
    /* node 2: CONTROL without KEEPALIVE (an agent before this rule): never timed out */
    int old = raw_agent(s, 99, 2, "host-c", TSP_WIRE_HELLO_CONTROL);
    /* node 1: KEEPALIVE asked, then nothing, as a frozen process */
    int64_t t0 = tsp__now_ms();
    int silent = raw_agent(s, 77, 1, "host-b", TSP_WIRE_HELLO_CONTROL | TSP_WIRE_HELLO_KEEPALIVE);
    char buf[2048];
    ck_assert_int_gt(tsp_logserver_failure(s, buf, sizeof buf, 15000), 0);
    int64_t took = tsp__now_ms() - t0;
    ck_assert_msg(strstr(buf, "lost connection to node 1 (host host-b, address 127.0.0.1): it "
                              "went silent: nothing for 5 s"),
                  "%s", buf);
    ck_assert_ptr_nonnull(strstr(buf, "\"kind\": \"lost\""));
    /* its structured reason, which the glues read instead of this prose (protocol 8) */
    ck_assert_msg(strstr(buf, "\"kind\": \"lost\", \"reason\": \"silent\""), "%s", buf);
    /* the bound: TSP_WIRE_SILENT_MS + a sweep (the lost grace is not waited), and not
     * before the silence */
    ck_assert_msg(took >= TSP_WIRE_SILENT_MS && took < TSP_WIRE_SILENT_MS + 1500,
                  "declared after %lld ms", (long long)took);
    for (int i = 0; i < 200 && atomic_load(&stops) < 1; i++)
        usleep(10 * 1000);
    ck_assert_int_eq(atomic_load(&stops), 1); /* node 0 was stopped, not lost */
    tsp_logclient_stats_t cs;
    tsp_logclient_stats(a, &cs);
    ck_assert_int_eq(cs.connected, 1);
    ck_assert_int_eq(cs.connects, 1);
    /* the old agent's connection is still open: the server closed only the silent one */
    raw_send_frame(old, TSP_WIRE_CLOSE, -1, NULL, 0);
    uint8_t hb[TSP_WIRE_HDR_LEN];
    ck_assert_int_eq(recv(old, hb, sizeof hb, MSG_WAITALL), (ssize_t)sizeof hb);
    ck_assert_int_eq(hb[0], TSP_WIRE_STOP);      /* the run was stopped: STOP first */
    ck_assert_int_eq(recv(silent, hb, 1, 0), 0); /* closed by the server */
    close(old);
    close(silent);
    ck_assert_int_eq(tsp_logclient_close(a, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_keepalive_ping_frame)
{
    uint8_t b[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_t h = {.type = TSP_WIRE_PING, .rank = -1, .length = 0}, o;
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1024, NULL, 0), 0);
    ck_assert_str_eq(tsp_wire_type_name(TSP_WIRE_PING), "PING");
    h.length = 1; /* PING has no payload */
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(tsp_wire_hdr_unpack(&o, b, sizeof b, 1024, NULL, 0), -EMSGSIZE);
}
END_TEST

static Suite *keepalive_suite(void)
{
    Suite *s = suite_create("keepalive");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_keepalive_silent_agent_is_lost_idle_client_is_not);
    tcase_add_test(tc, test_keepalive_ping_frame);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(keepalive_suite());
}
