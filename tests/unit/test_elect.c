/* test_elect.c: port reservation against later binders, route source and interface
 * lookup, the election record's pack/unpack and its refusals. */
#include <check.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "testutil.h"
#include "torchspark/elect.h"

/* Binds addr:port like a listener would; with_reuse says whether SO_REUSEADDR is set.
 * Returns the fd (listening) or -errno. */
static int bind_listen(const char *addr, int port, int with_reuse)
{
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (with_reuse)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

START_TEST(test_elect_reservation_blocks_plain_bind_but_not_reuse_listener)
{
    tsp_port_reservation_t r;
    char err[256];
    ck_assert_int_eq(tsp_elect_reserve_port(&r, NULL, 0, err, sizeof err), 0);
    ck_assert_int_gt(r.port, 0);
    ck_assert_int_ge(r.fd, 0);
    ck_assert_int_ne(fcntl(r.fd, F_GETFD) & FD_CLOEXEC, 0);
    /* Someone else's plain bind (no SO_REUSEADDR) loses, on the wildcard or loopback. */
    ck_assert_int_eq(bind_listen("0.0.0.0", r.port, 0), -EADDRINUSE);
    ck_assert_int_eq(bind_listen("127.0.0.1", r.port, 0), -EADDRINUSE);
    /* torch's TCPStore sets SO_REUSEADDR and listens: it must win while we hold it. */
    int l = bind_listen("0.0.0.0", r.port, 1);
    ck_assert_int_ge(l, 0);
    /* ...and clients reach the listener, not the reservation. */
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)r.port);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ck_assert_int_eq(connect(c, (struct sockaddr *)&sa, sizeof sa), 0);
    close(c);
    close(l);
    tsp_elect_release_port(&r);
    ck_assert_int_eq(r.fd, -1);
    tsp_elect_release_port(&r); /* idempotent */
}
END_TEST

START_TEST(test_elect_reservation_refuses_bad_input)
{
    tsp_port_reservation_t r;
    char err[256] = "";
    ck_assert_int_eq(tsp_elect_reserve_port(&r, "not-an-address", 0, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "not-an-address"));
    ck_assert_int_eq(tsp_elect_reserve_port(&r, NULL, 70000, err, sizeof err), -EINVAL);
    ck_assert_int_eq(r.fd, -1);
    /* A port someone listens on without reuse cannot be reserved. */
    int l = bind_listen("0.0.0.0", 0, 0);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(l, (struct sockaddr *)&sa, &sl);
    int busy = ntohs(sa.sin_port);
    ck_assert_int_eq(tsp_elect_reserve_port(&r, NULL, busy, err, sizeof err), -EADDRINUSE);
    ck_assert_ptr_nonnull(strstr(err, "in use"));
    close(l);
}
END_TEST

START_TEST(test_elect_route_source_and_ifname)
{
    char addr[TSP_ELECT_ADDR_MAX], ifname[TSP_ELECT_IFNAME_MAX], err[256];
    ck_assert_int_eq(tsp_elect_route_source("127.0.0.1", addr, sizeof addr, err, sizeof err), 0);
    ck_assert_str_eq(addr, "127.0.0.1");
    ck_assert_int_eq(tsp_elect_ifname_of(addr, ifname, sizeof ifname), 0);
    ck_assert_str_eq(ifname, "lo");
    /* A name resolves too ("localhost" is in every /etc/hosts). */
    ck_assert_int_eq(tsp_elect_route_source("localhost", addr, sizeof addr, err, sizeof err), 0);
    ck_assert_int_eq(strncmp(addr, "127.", 4), 0);
    ck_assert_int_eq(tsp_elect_ifname_of("192.0.2.77", ifname, sizeof ifname), -ENOENT);
    ck_assert_int_eq(tsp_elect_ifname_of("bogus", ifname, sizeof ifname), -EINVAL);
    ck_assert_int_ne(
        tsp_elect_route_source("no-such-host.invalid", addr, sizeof addr, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "no-such-host.invalid"));
}
END_TEST

START_TEST(test_elect_master_towards_loopback)
{
    tsp_elect_record_t rec;
    tsp_port_reservation_t res, nres;
    char err[256];
    ck_assert_int_eq(tsp_elect_master("127.0.0.1", NULL, &rec, &res, &nres, err, sizeof err), 0);
    ck_assert_str_eq(rec.master_addr, "127.0.0.1");
    ck_assert_str_eq(rec.ifname, "lo");
    ck_assert_int_eq(rec.master_port, res.port);
    /* The NCCL check's port: a second one, held beside MASTER_PORT, and bindable by a
     * listener that sets only SO_REUSEPORT (older NCCL) or only SO_REUSEADDR (ours). */
    ck_assert_int_eq(rec.nccl_port, nres.port);
    ck_assert_int_ne(rec.nccl_port, rec.master_port);
    ck_assert_int_ge(nres.fd, 0);
    static const int opts[] = {SO_REUSEPORT, SO_REUSEADDR};
    for (size_t i = 0; i < 2; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)nres.port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, opts[i], &one, sizeof one), 0);
        ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "option %d: %s", opts[i],
                      strerror(errno));
        ck_assert_int_eq(listen(fd, 1), 0);
        close(fd);
    }
    tsp_elect_release_port(&nres);
    ck_assert_int_eq((int)strlen(rec.run_id), 32);
    ck_assert_int_gt((int)strlen(rec.host), 0);
    tsp_elect_record_t other;
    tsp_port_reservation_t res2;
    ck_assert_int_eq(
        tsp_elect_master("127.0.0.1", "fixed-id", &other, &res2, NULL, err, sizeof err), 0);
    ck_assert_str_eq(other.run_id, "fixed-id");
    ck_assert_int_eq(other.nccl_port, 0); /* not asked for: not in the record */
    ck_assert_int_ne(other.master_port, rec.master_port);
    tsp_elect_release_port(&res);
    tsp_elect_release_port(&res2);
}
END_TEST

START_TEST(test_elect_record_roundtrip)
{
    tsp_elect_record_t r, back;
    char buf[TSP_ELECT_RECORD_MAX + 1], err[256];
    tsp_elect_record_init(&r);
    snprintf(r.master_addr, sizeof r.master_addr, "10.1.2.3");
    r.master_port = 40123;
    snprintf(r.run_id, sizeof r.run_id, "abc\"def\\g\n");
    snprintf(r.host, sizeof r.host, "exec-1");
    snprintf(r.ifname, sizeof r.ifname, "eth0");
    int n = tsp_elect_record_pack(&r, buf, sizeof buf);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq((int)strlen(buf), n);
    ck_assert_ptr_nonnull(strstr(buf, "\"version\": 1"));
    ck_assert_ptr_null(strstr(buf, "nccl_port")); /* none: as the first release wrote it */
    ck_assert_int_eq(tsp_elect_record_unpack(buf, (size_t)n, &back, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(&r, &back, sizeof r), 0);
    r.nccl_port = 40124;
    n = tsp_elect_record_pack(&r, buf, sizeof buf);
    ck_assert_ptr_nonnull(strstr(buf, "\"nccl_port\": 40124"));
    ck_assert_int_eq(tsp_elect_record_unpack(buf, (size_t)n, &back, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(&r, &back, sizeof r), 0);
    ck_assert_int_eq(tsp_elect_record_pack(&r, buf, 20), -ENOSPC);
    r.nccl_port = 70000;
    ck_assert_int_eq(tsp_elect_record_pack(&r, buf, sizeof buf), -EINVAL);
    r.nccl_port = 0;
    r.master_port = 0;
    ck_assert_int_eq(tsp_elect_record_pack(&r, buf, sizeof buf), -EINVAL);
}
END_TEST

START_TEST(test_elect_record_unpack_tolerates_unknown_keys_and_whitespace)
{
    tsp_elect_record_t r;
    char err[256];
    const char *s = " { \"run_id\" : \"x\\u0041\" , \"extra\": [1],"
                    "\"master_addr\":\"::1\",\"master_port\":5,\"version\":1 } ";
    /* Unknown keys, nested ones too, are ignored: a later version may add them. */
    ck_assert_int_eq(tsp_elect_record_unpack(s, strlen(s), &r, err, sizeof err), 0);
    s = " { \"run_id\" : \"x\\u0041\" , \"extra\": null, \"n\": -4, \"b\": true,"
        "\"master_addr\":\"::1\",\"master_port\":5,\"version\":1 } ";
    ck_assert_int_eq(tsp_elect_record_unpack(s, strlen(s), &r, err, sizeof err), 0);
    ck_assert_str_eq(r.run_id, "xA");
    ck_assert_str_eq(r.master_addr, "::1");
    ck_assert_int_eq(r.master_port, 5);
}
END_TEST

START_TEST(test_elect_record_unpack_refusals)
{
    tsp_elect_record_t r;
    char err[256], big[TSP_ELECT_RECORD_MAX + 2];
    static const struct {
        const char *in;
        const char *msg;
    } cases[] = {
        {"{\"version\":2,\"master_addr\":\"a\",\"master_port\":1,\"run_id\":\"r\"}", "version 2"},
        {"{\"master_addr\":\"a\",\"master_port\":1,\"run_id\":\"r\"}", "no \"version\""},
        {"{\"version\":1,\"master_port\":1,\"run_id\":\"r\"}", "lacks"},
        {"{\"version\":1,\"master_addr\":\"a\",\"master_port\":70000,\"run_id\":\"r\"}", "70000"},
        {"{\"version\":1,\"master_addr\":\"a\"", "not a JSON object"},
        {"{\"version\":1}x", "not a JSON object"},
        {"[1]", "not a JSON object"},
        {"", "not a JSON object"},
        {"{\"version\":99999999999}", "bad value"},
        {"{\"version\":1,\"master_addr\":\"a\",\"master_port\":\"1\",\"run_id\":\"r\"}",
         "bad value"},
        {"{\"version\":1,\"master_addr\":\"\\u00e9\",\"master_port\":1,\"run_id\":\"r\"}",
         "bad value"},
        {"{\"version\":1,\"master_addr\":[1],\"master_port\":1,\"run_id\":\"r\"}", "bad value"},
        {"{\"version\":1,\"master_addr\":\"a\",\"master_port\":\"1\",\"run_id\":\"r\"}",
         "bad value"},
        {"{\"master_addr\":\"\\q\"}", "not a JSON object"},
        {"{\"version\":1,\"master_addr\":[1],\"master_port\":1,\"run_id\":\"r\"}", "bad value"},
        {"{\"version\":1,\"master_addr\":\"a\",\"master_port\":1,\"run_id\":\"r\",\"nccl_port\":0}",
         "nccl_port 0"},
        {"{\"version\":1,\"master_addr\":\"a\",\"master_port\":1,\"run_id\":\"r\",\"nccl_port\":"
         "70000}",
         "nccl_port 70000"},
        {"{\"version\":1,\"master_addr\":\"a\",\"master_port\":1,\"run_id\":\"r\",\"nccl_port\":"
         "\"5\"}",
         "bad value for \"nccl_port\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = '\0';
        ck_assert_int_eq(
            tsp_elect_record_unpack(cases[i].in, strlen(cases[i].in), &r, err, sizeof err),
            -EINVAL);
        ck_assert_msg(strstr(err, cases[i].msg), "case %zu: '%s' lacks '%s'", i, err, cases[i].msg);
    }
    memset(big, ' ', sizeof big);
    ck_assert_int_eq(tsp_elect_record_unpack(big, sizeof big, &r, err, sizeof err), -E2BIG);
    /* An over-long string is refused, not truncated. */
    char longid[400];
    int n = snprintf(
        longid, sizeof longid,
        "{\"version\":1,\"master_addr\":\"a\",\"master_port\":1,\"run_id\":\"%0200d\"}", 0);
    ck_assert_int_eq(tsp_elect_record_unpack(longid, (size_t)n, &r, err, sizeof err), -EINVAL);
}
END_TEST

/* The PySpark glue's one call (docs/protocol.md 2): each op's reply, its refusals, and a
 * master whose reply does not fit holds nothing afterwards (its fds are closed). */
START_TEST(test_elect_call_json_face)
{
    char out[4096], err[256];
    size_t need = 0;
    const char *unpack = "{\"op\": \"unpack\", \"packed\": \"{\\\"version\\\": 1, "
                         "\\\"master_addr\\\": \\\"10.0.0.5\\\", \\\"master_port\\\": 40123, "
                         "\\\"run_id\\\": \\\"ab\\\"}\"}";
    ck_assert_int_eq(
        tsp_elect_call(unpack, strlen(unpack), out, sizeof out, &need, err, sizeof err), 0);
    ck_assert_str_eq(out, "{\"record\": {\"version\": 1, \"master_port\": 40123, \"nccl_port\": 0, "
                          "\"master_addr\": \"10.0.0.5\", \"run_id\": \"ab\", \"host\": \"\", "
                          "\"ifname\": \"\"}}");
    const char *route = "{\"op\": \"route_source\", \"host\": \"127.0.0.1\"}";
    ck_assert_int_eq(tsp_elect_call(route, strlen(route), out, sizeof out, &need, err, sizeof err),
                     0);
    ck_assert_str_eq(out, "{\"addr\": \"127.0.0.1\"}");
    const char *bad[][2] = {
        {"{\"op\": \"vote\"}", "unknown op \"vote\""},
        {"{\"op\": \"unpack\", \"packed\": 7}", "\"packed\" must be a string"},
        {"{\"op\": \"unpack\", \"packed\": \"{}\"}", "no \"version\""},
        {"[1]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(
            tsp_elect_call(bad[i][0], strlen(bad[i][0]), out, sizeof out, &need, err, sizeof err),
            -EINVAL);
        ck_assert_msg(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
    const char *master = "{\"op\": \"master\", \"peer\": \"127.0.0.1\", \"run_id\": null}";
    int before = dup(0);
    close(before);
    ck_assert_int_eq(tsp_elect_call(master, strlen(master), out, 8, &need, err, sizeof err),
                     -ENOSPC);
    ck_assert_int_gt((int)need, 8);
    int after = dup(0);
    close(after);
    ck_assert_int_eq(after, before); /* nothing held: the lowest free fd is the same */
    ck_assert_int_eq(
        tsp_elect_call(master, strlen(master), out, sizeof out, &need, err, sizeof err), 0);
    char *fds = strstr(out, "\"fds\": [");
    ck_assert_ptr_nonnull(fds);
    /* The JVM's "release" of what master held: every descriptor closed. */
    char release[128];
    snprintf(release, sizeof release, "{\"op\": \"release\", %.*s}",
             (int)(strchr(fds, ']') + 1 - fds), fds);
    ck_assert_int_eq(
        tsp_elect_call(release, strlen(release), out, sizeof out, &need, err, sizeof err), 0);
    ck_assert_str_eq(out, "{}");
    after = dup(0);
    close(after);
    ck_assert_int_eq(after, before);
    const char *bad_fds = "{\"op\": \"release\", \"fds\": [\"3\"]}";
    ck_assert_int_eq(
        tsp_elect_call(bad_fds, strlen(bad_fds), out, sizeof out, &need, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "tsp_elect_call's request's \"fds\" must be an array of descriptors "
                          "(numbers)");
}
END_TEST

/* Closes the held ports' descriptors of a master reply. */
static void close_fds(const char *out)
{
    const char *fds = strstr(out, "\"fds\": [");
    ck_assert_ptr_nonnull(fds);
    for (char *p = (char *)fds + 8; *p && *p != ']';) {
        long fd = strtol(p, &p, 10);
        close((int)fd);
        while (*p == ',' || *p == ' ')
            p++;
    }
}

/* Rank 0's peers (op master with hosts, docs/protocol.md 2; a task's address loses its port):
 * tried in order, each once, and one sentence with every reason when none elects; the first
 * that elects is kept. */
START_TEST(test_elect_call_tries_the_peers_in_order)
{
    char out[4096], err[4096];
    size_t need = 0;
    const char *none =
        "{\"op\": \"master\", \"hosts\": [\"self.invalid:4040\", \"b.invalid\", \"\", "
        "\"[b.invalid]:7077\", \"self.invalid\"], \"driver_host\": \"drv.invalid\"}";
    ck_assert_int_ne(tsp_elect_call(none, strlen(none), out, sizeof out, &need, err, sizeof err),
                     0);
    const char *b = strstr(err, "(cannot resolve host 'b.invalid'");
    const char *drv = strstr(err, "; cannot resolve host 'drv.invalid'");
    const char *self = strstr(err, "; cannot resolve host 'self.invalid'");
    ck_assert_msg(strncmp(err, "torchspark: rank 0's task on host ", 34) == 0, "%s", err);
    ck_assert_msg(b && drv && self && b < drv && drv < self, "%s", err);
    int tried = 0;
    for (const char *p = err; (p = strstr(p, "cannot resolve host")) != NULL; p++)
        tried++;
    ck_assert_msg(tried == 3, "each peer once: %s", err);
    const char *some = "{\"op\": \"master\", \"hosts\": [\"self.invalid\", \"b.invalid\"], "
                       "\"driver_host\": \"127.0.0.1\"}";
    ck_assert_int_eq(tsp_elect_call(some, strlen(some), out, sizeof out, &need, err, sizeof err),
                     0);
    ck_assert_ptr_nonnull(strstr(out, "\"master_addr\": \"127.0.0.1\""));
    close_fds(out);
    const char *bad = "{\"op\": \"master\", \"hosts\": []}";
    ck_assert_int_eq(tsp_elect_call(bad, strlen(bad), out, sizeof out, &need, err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "needs \"peer\" (a host) or \"hosts\""));
}
END_TEST

/* Rank 0's own host unknown (""; a gang task's, which knows only that it runs here): this
 * host's name, tried last (after the driver's), as the glues no longer ask for it. */
START_TEST(test_elect_call_rank0_unknown_host_is_this_host)
{
    char out[4096], err[4096], self[256] = "", want[300];
    size_t need = 0;
    ck_assert_int_eq(gethostname(self, sizeof self - 1), 0);
    const char *req = "{\"op\": \"master\", \"hosts\": [\"\", \"\"], \"driver_host\": "
                      "\"drv.invalid\"}";
    int rc = tsp_elect_call(req, strlen(req), out, sizeof out, &need, err, sizeof err);
    if (rc != 0) { /* this host's name does not resolve here: its reason comes after the driver's */
        snprintf(want, sizeof want, "(cannot resolve host 'drv.invalid'; ");
        ck_assert_msg(strstr(err, want) && strstr(err, self), "%s", err);
        return;
    }
    ck_assert_ptr_nonnull(strstr(out, "\"master_addr\": "));
    close_fds(out);
}
END_TEST

static Suite *elect_suite(void)
{
    Suite *s = suite_create("elect");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_elect_reservation_blocks_plain_bind_but_not_reuse_listener);
    tcase_add_test(tc, test_elect_reservation_refuses_bad_input);
    tcase_add_test(tc, test_elect_route_source_and_ifname);
    tcase_add_test(tc, test_elect_master_towards_loopback);
    tcase_add_test(tc, test_elect_record_roundtrip);
    tcase_add_test(tc, test_elect_record_unpack_tolerates_unknown_keys_and_whitespace);
    tcase_add_test(tc, test_elect_record_unpack_refusals);
    tcase_add_test(tc, test_elect_call_json_face);
    tcase_add_test(tc, test_elect_call_tries_the_peers_in_order);
    tcase_add_test(tc, test_elect_call_rank0_unknown_host_is_this_host);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return tsp_test_main(elect_suite());
}
