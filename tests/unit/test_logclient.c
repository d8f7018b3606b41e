/* test_logclient.c: the agent's sender: buffering under backpressure, reconnect to a
 * restarted server without loss or duplicates, local fallback with one warning, drop mode. */
#include <fcntl.h>
#include <pthread.h>

#include "logtest.h"
#include "testutil.h"

static tsp_logserver_t *server_at(int port, const uint8_t *secret, size_t queue_bytes)
{
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.port = port;
    o.secret = secret;
    o.event_fd = -1;
    if (queue_bytes)
        o.queue_bytes = queue_bytes;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    return s;
}

/* A client's options for server s (host "unit"). */
static void opts_for(tsp_logserver_t *s, tsp_logclient_opts_t *o)
{
    tsp_logclient_opts_init(o);
    o->host = "127.0.0.1";
    o->port = tsp_logserver_port(s);
    tsp_logserver_secret(s, o->secret);
    o->hostname = "unit";
}

/* Pulls every line available within wait_ms; checks "<i>" order from *next. */
static long drain(tsp_logserver_t *s, long *next, long want, int wait_ms)
{
    tsp_logline_t l[256];
    long got = 0;
    while (got < want) {
        int n = tsp_logserver_pull(s, l, want - got < 256 ? (int)(want - got) : 256, wait_ms);
        if (n <= 0)
            break;
        for (int i = 0; i < n; i++) {
            char tmp[32];
            memcpy(tmp, l[i].data, l[i].len);
            tmp[l[i].len] = 0;
            ck_assert_int_eq(atol(tmp), *next);
            (*next)++;
            got++;
        }
    }
    return got;
}

START_TEST(test_logclient_reconnect_after_server_restart)
{
    uint8_t secret[32];
    memset(secret, 0x11, sizeof secret);
    tsp_logserver_t *s = server_at(0, secret, 0);
    int port = tsp_logserver_port(s);
    tsp_logclient_t *c = client_for(s, port, 0);
    tsp_line_sink_t *k = tsp_logclient_sink(c);
    long next = 0, i = 0;
    char buf[32];
    for (; i < 5000; i++)
        sink_put(k, 0, 1, buf, (size_t)snprintf(buf, sizeof buf, "%ld", i));
    ck_assert_int_eq(drain(s, &next, 2000, 2000), 2000);
    /* the driver goes away while lines are in flight, then comes back on the same port */
    tsp_logserver_shutdown(s, 50);
    drain(s, &next, 1000000, 0);
    tsp_logserver_free(s);
    for (; i < 8000; i++)
        sink_put(k, 0, 1, buf, (size_t)snprintf(buf, sizeof buf, "%ld", i));
    usleep(300 * 1000);
    s = server_at(port, secret, 0);
    for (; i < 10000; i++)
        sink_put(k, 0, 1, buf, (size_t)snprintf(buf, sizeof buf, "%ld", i));
    drain(s, &next, 10000 - next, 5000);
    ck_assert_int_eq(next, 10000);
    tsp_logclient_stats_t st;
    tsp_logclient_stats(c, &st);
    ck_assert_uint_ge(st.connects, 2);
    ck_assert_uint_eq(st.local, 0);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logclient_local_fallback_one_warning)
{
    /* a port nobody listens on */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    bind(lfd, (struct sockaddr *)&a, sizeof a);
    getsockname(lfd, (struct sockaddr *)&a, &al);
    int port = ntohs(a.sin_port);
    close(lfd);
    int out[2], err[2];
    ck_assert_int_eq(pipe2(out, O_NONBLOCK), 0);
    ck_assert_int_eq(pipe2(err, O_NONBLOCK), 0);
    tsp_logclient_opts_t o;
    tsp_logclient_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = port;
    o.local_out_fd = out[1];
    o.local_err_fd = err[1];
    o.hostname = "unit";
    o.log_prefix = "unit-cli: ";
    char e[256];
    tsp_logclient_t *c = tsp_logclient_start(&o, e, sizeof e);
    ck_assert_ptr_nonnull(c);
    sink_put(tsp_logclient_sink(c), 3, 1, "hello", 5);
    sink_put(tsp_logclient_sink(c), 3, 2, "oops", 4);
    usleep(500 * 1000);
    sink_put(tsp_logclient_sink(c), 4, 1, "later", 5);
    ck_assert_int_eq(tsp_logclient_close(c, 300), -ENOTCONN);
    char b[4096];
    ssize_t n = read(out[0], b, sizeof b - 1);
    ck_assert_int_gt(n, 0);
    b[n] = 0;
    ck_assert_str_eq(b, "[rank 3] hello\n[rank 4] later\n");
    n = read(err[0], b, sizeof b - 1);
    ck_assert_int_gt(n, 0);
    b[n] = 0;
    char *w = strstr(b, "unit-cli: warning: cannot reach the driver's log server");
    ck_assert_ptr_nonnull(w);
    ck_assert_ptr_null(strstr(w + strlen("unit-cli: warning"), "warning"));
    ck_assert_ptr_nonnull(strstr(b, "[rank 3] oops\n"));
    for (int i = 0; i < 2; i++) {
        close(out[i]);
        close(err[i]);
    }
}
END_TEST

START_TEST(test_logclient_backpressure_lossless)
{
    /* A consumer that does not pull: the server's queue fills, the socket fills, then the
     * client's bound: write_line says -EAGAIN; after pulling, wake_fd fires. */
    tsp_logserver_t *s = server_at(0, NULL, 64 * 1024);
    tsp_logclient_t *c = client_for(s, tsp_logserver_port(s), 0);
    tsp_line_sink_t *k = tsp_logclient_sink(c);
    static char line[8192];
    memset(line, 'x', sizeof line);
    long i = 0;
    int rc = 0;
    for (; i < 100000; i++) {
        int n = snprintf(line, 16, "%ld", i);
        line[n] = ' ';
        tsp_line_t l = {.rank = 0, .stream = 1, .data = line, .len = sizeof line};
        if ((rc = k->write_line(k->ctx, &l)) == -EAGAIN)
            break;
        ck_assert_int_eq(rc, 0);
    }
    ck_assert_int_eq(rc, -EAGAIN);
    ck_assert_int_lt(i, 100000);
    tsp_logserver_stats_t st;
    tsp_logserver_stats(s, &st);
    ck_assert_uint_le(st.queued_bytes, 64 * 1024 + 2 * sizeof line);
    struct pollfd p = {.fd = k->wake_fd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 200), 0); /* no room until someone pulls */
    long next = 0;
    tsp_logline_t l[64];
    while (next < i) {
        int n = tsp_logserver_pull(s, l, 64, 2000);
        ck_assert_int_gt(n, 0);
        for (int j = 0; j < n; j++, next++) {
            ck_assert_uint_eq(l[j].len, sizeof line);
            ck_assert_int_eq(atol(l[j].data), next);
        }
    }
    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Counts the newlines in a file. */
static long count_lines(int fd)
{
    char b[65536];
    long n = 0;
    ssize_t r;
    for (off_t off = 0; (r = pread(fd, b, sizeof b, off)) > 0; off += r)
        for (ssize_t i = 0; i < r; i++)
            n += b[i] == '\n';
    return n;
}

/* The reported hang: a driver that stays connected but never reads again (its process
 * stopped pulling) while a writer waits on a full queue. The client must give the driver
 * up after stall_ms, spill to the local output, and wake the writer: every line is
 * written in bounded time and counted locally or at the driver, none lost. */
START_TEST(test_logclient_stalled_driver_falls_back)
{
    tsp_logserver_t *s = server_at(0, NULL, 64 * 1024);
    char outp[] = "/tmp/tsp_stall_outXXXXXX";
    int out = mkstemp(outp), err[2];
    unlink(outp);
    ck_assert_int_eq(pipe2(err, O_NONBLOCK), 0);
    tsp_logclient_opts_t o;
    opts_for(s, &o);
    o.mem_bytes = 1; /* raised to the minimum (about 2.3 MiB) */
    o.stall_ms = 700;
    o.local_out_fd = out;
    o.local_err_fd = err[1];
    char e[256];
    tsp_logclient_t *c = tsp_logclient_start(&o, e, sizeof e);
    ck_assert_ptr_nonnull(c);
    tsp_line_sink_t *k = tsp_logclient_sink(c);
    static char line[4096];
    memset(line, 'y', sizeof line);
    long local = 0, blocked = 0, total = 0;
    int64_t t0 = now_ms();
    /* write until the fallback has taken lines twice over the client's bound */
    while (local * (long)sizeof line < 6L << 20 && now_ms() - t0 < 30000) {
        tsp_line_t l = {.rank = 0, .stream = 1, .data = line, .len = sizeof line};
        int rc = k->write_line(k->ctx, &l);
        if (rc == -EAGAIN) {
            blocked++;
            struct pollfd p = {.fd = k->wake_fd, .events = POLLIN};
            ck_assert_int_eq(poll(&p, 1, 5000), 1); /* the wake-up must come */
            local = count_lines(out);
            continue;
        }
        ck_assert_int_eq(rc, 0);
        total++;
    }
    ck_assert_int_gt(blocked, 0);
    ck_assert_int_lt(now_ms() - t0, 30000);
    ck_assert_int_gt(total, 0);
    tsp_logclient_close(c, 200);
    local = count_lines(out);
    /* the driver reads again: what it had in its queue and socket buffers arrives */
    long at_driver = 0;
    tsp_logline_t l[256];
    for (int n; (n = tsp_logserver_pull(s, l, 256, 500)) > 0;)
        at_driver += n;
    ck_assert_int_gt(local, 0);
    ck_assert_int_ge(local + at_driver, total); /* none lost (a few may arrive twice) */
    char b[4096];
    ssize_t n = read(err[0], b, sizeof b - 1);
    ck_assert_int_gt(n, 0);
    b[n] = 0;
    char *w = strstr(b, "has taken no lines for");
    ck_assert_msg(w != NULL, "%s", b);
    ck_assert_ptr_null(strstr(w + strlen("unit-cli: warning"), "warning")); /* one warning */
    close(out);
    close(err[0]);
    close(err[1]);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logclient_drop_mode_counts)
{
    tsp_logserver_t *s = server_at(0, NULL, 64 * 1024);
    tsp_logclient_t *c = client_for(s, tsp_logserver_port(s), 1);
    tsp_line_sink_t *k = tsp_logclient_sink(c);
    static char line[8192];
    memset(line, 'y', sizeof line);
    for (int i = 0; i < 20000; i++) {
        tsp_line_t l = {.rank = 5, .stream = 1, .data = line, .len = sizeof line};
        ck_assert_int_eq(k->write_line(k->ctx, &l), 0); /* never -EAGAIN */
    }
    tsp_logclient_stats_t cs;
    tsp_logclient_stats(c, &cs);
    ck_assert_uint_gt(cs.dropped, 0);
    ck_assert_uint_eq(cs.lines + cs.dropped, 20000);
    long got = 0;
    tsp_logline_t l[64];
    int32_t ranks[4];
    uint64_t counts[4];
    for (int tries = 0; tries < 200; tries++) {
        int n;
        while ((n = tsp_logserver_pull(s, l, 64, 20)) > 0)
            got += n;
        if (tsp_logserver_dropped(s, ranks, counts, 4) == 1 && counts[0] == cs.dropped &&
            got == (long)cs.lines)
            break;
    }
    ck_assert_int_eq(tsp_logserver_dropped(s, ranks, counts, 4), 1);
    ck_assert_int_eq(ranks[0], 5);
    ck_assert_uint_eq(counts[0], cs.dropped);
    ck_assert_int_eq(got, (long)cs.lines);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logclient_long_line_split)
{
    tsp_logserver_t *s = server_at(0, NULL, 0);
    tsp_logclient_t *c = client_for(s, tsp_logserver_port(s), 0);
    size_t n = 2 * TSP_WIRE_MAX_LINE + 10;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)(i * 31);
    sink_put(tsp_logclient_sink(c), 1, 2, big, n);
    tsp_logline_t l[4];
    size_t off = 0;
    int pieces = 0;
    while (off < n) {
        int k = tsp_logserver_pull(s, l, 4, 2000);
        ck_assert_int_gt(k, 0);
        for (int j = 0; j < k; j++, pieces++) {
            ck_assert_int_eq(memcmp(l[j].data, big + off, l[j].len), 0);
            off += l[j].len;
            ck_assert_uint_eq(l[j].flags, off < n ? TSP_LINE_CONTINUED : 0);
            ck_assert_uint_eq(l[j].stream, 2);
        }
    }
    ck_assert_int_eq(pieces, 3);
    free(big);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

/* A report folded while the sender waits with nothing held (its last tick found none, so
 * it waits up to a second) is handed on within the agent's quiet interval, not at that
 * wait's end: the last summary of a burst of reports reached the driver ~1 s late
 * (bench/scale_bench.py, report_stages). */
START_TEST(test_logclient_folded_report_is_not_held_a_second)
{
    tsp_logserver_t *s = server_at(0, NULL, 0);
    tsp_logclient_opts_t o;
    opts_for(s, &o);
    o.report_world = 1000000; /* a report a second per rank: the second one is folded */
    char e[256];
    tsp_logclient_t *c = tsp_logclient_start(&o, e, sizeof e);
    ck_assert_ptr_nonnull(c);
    tsp_line_sink_t *k = tsp_logclient_sink(c);
    char rec[128];
    tsp_logline_t l[4];
    tsp_logclient_stats_t st = {0};
    for (int i = 0; i < 1000 && !st.connected; i++, usleep(10 * 1000))
        tsp_logclient_stats(c, &st); /* connected first: the token refills meanwhile */
    int64_t t1 = now_ms();
    sink_put(k, 0, TSP_STREAM_REPORT, rec,
             (size_t)snprintf(rec, sizeof rec,
                              "{\"step\": 1, \"time\": 1.0, \"metrics\": "
                              "{\"loss\": 1.0}}"));
    ck_assert_int_eq(tsp_logserver_pull_reports(s, l, 4, 5000), 1); /* as it is */
    usleep(150 * 1000); /* the sender has sent it, taken its ACK and waits */
    int64_t t0 = now_ms();
    sink_put(k, 0, TSP_STREAM_REPORT, rec,
             (size_t)snprintf(rec, sizeof rec,
                              "{\"step\": 2, \"time\": 2.0, \"metrics\": "
                              "{\"loss\": 0.5}}"));
    ck_assert_int_eq(tsp_logserver_pull_reports(s, l, 4, 5000), 1);
    int64_t took = now_ms() - t0;
    /* folded: written again by the fold (reportfold.c), "2.0" as the number 2 */
    ck_assert_msg(memmem(l[0].data, l[0].len, "\"time\": 2,", 10) != NULL,
                  "not folded %lld ms after the first: %.*s", (long long)(t0 - t1), (int)l[0].len,
                  l[0].data);
    /* quiet 50 ms, then the sender's next tick (50 ms); before: ~850 ms */
    ck_assert_msg(took < 500, "the folded report took %lld ms", (long long)took);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("logclient");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_logclient_reconnect_after_server_restart);
    tcase_add_test(tc, test_logclient_local_fallback_one_warning);
    tcase_add_test(tc, test_logclient_backpressure_lossless);
    tcase_add_test(tc, test_logclient_stalled_driver_falls_back);
    tcase_add_test(tc, test_logclient_drop_mode_counts);
    tcase_add_test(tc, test_logclient_long_line_split);
    tcase_add_test(tc, test_logclient_folded_report_is_not_held_a_second);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
