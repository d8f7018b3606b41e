/* test_tlsconn.c: the log channel's TLS 1.3 (docs/protocol.md 1.10) against the real log
 * server on loopback: a client with another run's key is refused at the TLS handshake (and
 * the driver says "another run"), a byte rewritten on the way kills the connection and
 * nothing after it is delivered, a recording proxy sees no line in clear, and an agent of
 * version 2 (plaintext) gets a plaintext ERROR naming the versions. With encryption off
 * (1.10.1) the lines go in clear and a rewritten, replayed or reordered record is refused;
 * an agent that offers only the other mode gets one sentence at the handshake. A batch of
 * full records that arrives at once gets one ACK or a few, not one per record. */
#include <pthread.h>
#include <stdatomic.h>

#include "logdial.h"
#include "logtest.h"
#include "testutil.h"

static tsp_logserver_t *server_hs(int hs_timeout_ms)
{
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.handshake_timeout_ms = hs_timeout_ms;
    o.event_fd = -1;
    o.events_to_queue = 1; /* the server's own events come as lines of rank < 0 */
    o.lost_grace_ms = 0;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    return s;
}

static tsp_logserver_t *server(void)
{
    return server_hs(0);
}

/* Pulls for up to ms: 1 once an event line contains `want`, and counts data lines of rank
 * 0 that equal "line <k>" in order into *lines (any other text fails). */
static int pull_until(tsp_logserver_t *s, const char *want, int *lines, int ms)
{
    int64_t end = tsp__now_ms() + ms;
    tsp_logline_t l[64];
    while (tsp__now_ms() < end) {
        int n = tsp_logserver_pull(s, l, 64, 100);
        for (int i = 0; i < n; i++) {
            char tmp[600];
            size_t len = l[i].len < sizeof tmp - 1 ? l[i].len : sizeof tmp - 1;
            memcpy(tmp, l[i].data, len);
            tmp[len] = 0;
            if (l[i].rank < 0 && want && strstr(tmp, want))
                return 1;
            if (l[i].rank == 0 && lines) {
                char exp[64];
                snprintf(exp, sizeof exp, "line %d", *lines);
                ck_assert_msg(strcmp(tmp, exp) == 0, "delivered '%s', want '%s'", tmp, exp);
                (*lines)++;
            }
        }
    }
    return 0;
}

START_TEST(test_tlsconn_another_runs_key_is_refused)
{
    tsp_logserver_t *s = server();
    uint8_t wrong[32];
    tsp__random_bytes(wrong, sizeof wrong);
    char err[600];
    tsp__tls_t *t = NULL;
    int rc = tls_relay_dial("127.0.0.1", tsp_logserver_port(s), wrong, &t, err, sizeof err);
    ck_assert_int_eq(rc, -EACCES);
    ck_assert_msg(strstr(err, "the driver refused the TLS handshake"), "%s", err);
    ck_assert_msg(
        pull_until(s, "TLS handshake refused: the client belongs to another run", NULL, 5000),
        "no 'another run' event");
    /* the agent's own dialer says the same */
    rc = tsp__logdial("127.0.0.1", tsp_logserver_port(s), wrong, TSP_WIRE_ROLE_LOGS, 0, 1, 0, "h",
                      5000, &t, NULL, err, sizeof err);
    ck_assert_int_eq(rc, -EACCES);
    tsp_logserver_stats_t st;
    tsp_logserver_stats(s, &st);
    ck_assert_uint_eq(st.authenticated, 0);
    tsp_logserver_free(s);
}
END_TEST

/* An on-path proxy for one connection: records both ways (up to CAP bytes) and flips one
 * bit of the client's byte number `flip` (-1: none). */
#define CAP (1u << 20)
enum { ACT_FLIP, ACT_DUP, ACT_SWAP, ACT_FLIP_TLS, ACT_FLIP_TEXT, ACT_BATCH };
typedef struct proxy {
    int lfd, port, up_port;
    long flip;
    int act; /* at byte `flip`: ACT_FLIP one bit, ACT_DUP send that segment twice, ACT_SWAP
              * hold it and send it after the next one; ACT_FLIP_TLS one bit of the first
              * application-data record's body from there (TLS's record headers are in
              * clear: the attacker reads them, and a header's byte fails otherwise);
              * ACT_FLIP_TEXT one bit of the first "line " in clear from there (encryption
              * off: the attacker rewrites a worker's text, never a record's length, which
              * would only make the driver wait for bytes that never come) */
    uint8_t hdr[5];
    unsigned hdr_have, body_left;
    int flipped;
    uint8_t *cap;
    size_t caplen;
    atomic_int hold; /* ACT_BATCH: the client's bytes are held from now until batch_len are
                      * held, then sent on in one send() */
    size_t batch_len, nbatch;
    uint8_t *batch;
} proxy_t;

static void record(proxy_t *p, const uint8_t *b, size_t n)
{
    size_t k = n < CAP - p->caplen ? n : CAP - p->caplen;
    memcpy(p->cap + p->caplen, b, k);
    p->caplen += k;
}

/* ACT_FLIP_TLS over the client's bytes buf[0..r), which start at stream offset at. */
static void flip_tls(proxy_t *p, uint8_t *buf, ssize_t r, long at)
{
    for (ssize_t i = 0; i < r; i++) {
        if (p->hdr_have < 5) {
            p->hdr[p->hdr_have++] = buf[i];
            p->body_left = p->hdr_have == 5 ? ((unsigned)p->hdr[3] << 8 | p->hdr[4]) : 0;
            p->hdr_have = p->hdr_have == 5 && p->body_left == 0 ? 0 : p->hdr_have;
            continue;
        }
        if (!p->flipped && p->hdr[0] == 0x17 && at + i >= p->flip) {
            buf[i] ^= 0x01;
            p->flipped = 1;
        }
        if (--p->body_left == 0)
            p->hdr_have = 0;
    }
}

static void *proxy_main(void *arg)
{
    proxy_t *p = arg;
    int a = accept(p->lfd, NULL, NULL);
    int b = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->up_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(b, (struct sockaddr *)&sa, sizeof sa), 0);
    long sent = 0;
    uint8_t buf[65536], held[65536];
    ssize_t nheld = 0;
    for (;;) {
        struct pollfd f[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(f, 2, 10000) <= 0)
            break;
        int from = (f[0].revents & (POLLIN | POLLHUP | POLLERR)) ? a : b;
        ssize_t r = recv(from, buf, sizeof buf, 0);
        if (r <= 0)
            break;
        record(p, buf, (size_t)r);
        if (from == a && p->act == ACT_BATCH && atomic_load(&p->hold)) {
            ck_assert_uint_le(p->nbatch + (size_t)r, p->batch_len);
            memcpy(p->batch + p->nbatch, buf, (size_t)r);
            p->nbatch += (size_t)r;
            if (p->nbatch == p->batch_len) {
                atomic_store(&p->hold, 0);
                if (send(b, p->batch, p->nbatch, MSG_NOSIGNAL) != (ssize_t)p->nbatch)
                    break;
            }
            continue;
        }
        if (from == a && p->act == ACT_FLIP_TLS)
            flip_tls(p, buf, r, sent);
        if (from == a && p->act == ACT_FLIP_TEXT && !p->flipped && sent + r > p->flip) {
            long from_at = p->flip > sent ? p->flip - sent : 0;
            uint8_t *t = memmem(buf + from_at, (size_t)(r - from_at), "line ", 5);
            if (t) {
                *t ^= 0x01;
                p->flipped = 1;
            }
        }
        int hit = from == a && p->flip >= sent && p->flip < sent + r && p->act != ACT_FLIP_TLS &&
                  p->act != ACT_FLIP_TEXT;
        if (from == a)
            sent += r;
        if (hit && p->act == ACT_FLIP)
            buf[p->flip - (sent - r)] ^= 0x01;
        if (hit && p->act == ACT_SWAP) {
            memcpy(held, buf, (size_t)r);
            nheld = r;
            continue;
        }
        if (send(from == a ? b : a, buf, (size_t)r, MSG_NOSIGNAL) != r)
            break;
        if (hit && p->act == ACT_DUP && send(b, buf, (size_t)r, MSG_NOSIGNAL) != r)
            break;
        if (from == a && nheld > 0 && !hit) {
            if (send(b, held, (size_t)nheld, MSG_NOSIGNAL) != nheld)
                break;
            nheld = 0;
        }
    }
    close(a);
    close(b);
    return NULL;
}

static void proxy_start(proxy_t *p, int up_port, long flip, int act, pthread_t *th)
{
    memset(p, 0, sizeof *p);
    p->up_port = up_port;
    p->flip = flip;
    p->act = act; /* before the thread starts: it reads it */
    p->cap = malloc(CAP);
    atomic_init(&p->hold, 0);
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(p->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(p->lfd, 4), 0);
    socklen_t sl = sizeof sa;
    getsockname(p->lfd, (struct sockaddr *)&sa, &sl);
    p->port = ntohs(sa.sin_port);
    pthread_create(th, NULL, proxy_main, p);
}

/* An agent's connection through the proxy, 40 LINE frames of rank 0 "line <k>" (padded
 * to about 100 bytes each), then a wait for the end. */
static int send_lines(tsp_logserver_t *s, int port)
{
    uint8_t secret[32];
    tsp_logserver_secret(s, secret);
    char err[600];
    tsp__tls_t *t = NULL;
    int rc = tsp__logdial("127.0.0.1", port, secret, TSP_WIRE_ROLE_LOGS, 0, 5, 0, "proxied", 5000,
                          &t, NULL, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    int fd = tls_relay_adopt(t, err, sizeof err);
    ck_assert_msg(fd >= 0, "%s", err);
    for (int k = 0; k < 40; k++) {
        uint8_t p[8 + 100];
        tsp_wire_put_u64(p, (uint64_t)k + 1);
        int n = snprintf((char *)p + 8, 100, "line %d", k);
        tsp_wire_hdr_t h = {
            .type = TSP_WIRE_LINE, .stream = 1, .rank = 0, .length = 8u + (unsigned)n};
        uint8_t hb[TSP_WIRE_HDR_LEN];
        tsp_wire_hdr_pack(hb, &h);
        if (send(fd, hb, sizeof hb, MSG_NOSIGNAL) != (ssize_t)sizeof hb ||
            send(fd, p, 8u + (size_t)n, MSG_NOSIGNAL) != 8 + n)
            break;
        usleep(2000); /* one record each */
    }
    return fd;
}

START_TEST(test_tlsconn_rewritten_byte_kills_the_connection)
{
    tsp_logserver_t *s = server();
    proxy_t p;
    pthread_t th;
    /* past the TLS handshake and HELLO/AUTH (about 700 bytes): inside the LINE records */
    proxy_start(&p, tsp_logserver_port(s), 1800, ACT_FLIP_TLS, &th);
    int fd = send_lines(s, p.port);
    int lines = 0;
    ck_assert_msg(
        pull_until(s, "the TLS channel broke: a TLS record failed authentication", &lines, 8000),
        "no event");
    pull_until(s, NULL, &lines, 300);
    ck_assert_int_gt(lines, 0);  /* those before the rewritten record arrived ... */
    ck_assert_int_lt(lines, 40); /* ... and none from it on */
    uint8_t b[4096];             /* the ACKs of the lines before, then the driver's hang-up */
    struct timeval tv = {.tv_sec = 20}; /* a loaded machine */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t r;
    while ((r = recv(fd, b, sizeof b, 0)) > 0)
        ;
    ck_assert_int_eq(r, 0);
    close(fd);
    pthread_join(th, NULL);
    free(p.cap);
    tsp_logserver_free(s);
}
END_TEST

/* Encryption off (docs/protocol.md 1.10.1): the lines go in clear, each record MAC'ed and
 * numbered; a proxy that rewrites, replays or reorders a record is refused, and nothing of
 * that record or after it is delivered. */
static void mac_attack(int act, long at)
{
    tsp_logserver_t *s = server();
    ck_assert_int_eq(tsp_logserver_encryption(s, 0), 0);
    proxy_t p;
    pthread_t th;
    proxy_start(&p, tsp_logserver_port(s), at, act, &th);
    int fd = send_lines(s, p.port);
    int lines = 0;
    if (at < 0) {
        pull_until(s, "never", &lines, 1500);
        ck_assert_int_eq(lines, 40);
    } else {
        /* a tag that fails, or a length that the rewrite or the cut made impossible */
        ck_assert_msg(pull_until(s, "the TLS channel broke: a record ", &lines, 8000), "no event");
        pull_until(s, NULL, &lines, 300);
        ck_assert_int_lt(lines, 40); /* pull_until failed on any line out of order or twice */
    }
    close(fd);
    pthread_join(th, NULL);
    if (at < 0) /* in clear: the switch took effect */
        ck_assert_ptr_nonnull(memmem(p.cap, p.caplen, "line 1", 6));
    free(p.cap);
    tsp_logserver_free(s);
}

START_TEST(test_tlsconn_encryption_off_lines_arrive_in_clear)
{
    mac_attack(ACT_FLIP, -1);
}
END_TEST

START_TEST(test_tlsconn_encryption_off_rewritten_byte_is_refused)
{
    mac_attack(ACT_FLIP_TEXT, 1800);
}
END_TEST

START_TEST(test_tlsconn_encryption_off_replayed_record_is_refused)
{
    mac_attack(ACT_DUP, 1800);
}
END_TEST

START_TEST(test_tlsconn_encryption_off_reordered_records_are_refused)
{
    mac_attack(ACT_SWAP, 1800);
}
END_TEST

/* An agent that offers only encryption against a driver with it off: one sentence each side,
 * at the handshake, not a hang. */
START_TEST(test_tlsconn_encryption_mismatch_is_one_sentence)
{
    tsp_logserver_t *s = server();
    ck_assert_int_eq(tsp_logserver_encryption(s, 0), 0);
    uint8_t secret[32];
    tsp_logserver_secret(s, secret);
    char err[600] = "";
    tsp__tlsctx_t *x = NULL;
    ck_assert_int_eq(tsp__tlsctx_new(&x, 0, secret, err, sizeof err), 0);
    tsp__tlsctx_set_modes(x, TSP__TLS_ENCRYPT);
    int fd = raw_connect(tsp_logserver_port(s));
    tsp__tls_t *t = NULL;
    ck_assert_int_eq(tsp__tls_new(&t, x, fd), 0);
    int64_t t0 = tsp__now_ms();
    ck_assert_int_eq(tsp__tls_handshake_by(t, t0 + 5000, err, sizeof err), -EACCES);
    ck_assert_str_eq(err, "the driver refused the TLS handshake: this driver has "
                          "spark.torchspark.encryption=false and this agent requires encryption "
                          "on: set the same on both");
    ck_assert_msg(pull_until(s,
                             "TLS handshake refused: the agent requires encryption on (it offers "
                             "only ALPN torchspark/3) and this driver has "
                             "spark.torchspark.encryption=false: set the same on both",
                             NULL, 3000),
                  "no event");
    ck_assert_int_lt(tsp__now_ms() - t0, 4000);
    tsp__tls_free(t);
    close(fd);
    tsp__tlsctx_free(x);
    ck_assert_int_eq(tsp_logserver_encryption(s, 2), -EINVAL);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_tlsconn_proxy_sees_no_line_in_clear)
{
    tsp_logserver_t *s = server();
    proxy_t p;
    pthread_t th;
    proxy_start(&p, tsp_logserver_port(s), -1, ACT_FLIP, &th);
    int fd = send_lines(s, p.port);
    int lines = 0;
    pull_until(s, "never", &lines, 1500);
    ck_assert_int_eq(lines, 40); /* untouched: all delivered */
    close(fd);
    pthread_join(th, NULL);
    ck_assert_uint_gt(p.caplen, 40 * 100);
    ck_assert_ptr_null(memmem(p.cap, p.caplen, "line 1", 6));
    ck_assert_ptr_null(memmem(p.cap, p.caplen, "proxied", 7)); /* HELLO's host name */
    ck_assert_ptr_null(memmem(p.cap, p.caplen, "TSPL", 4));    /* HELLO's magic */
    free(p.cap);
    tsp_logserver_free(s);
}
END_TEST

/* An agent's batch of full TLS records (16 KiB of LINE frames each) that reaches the driver
 * at once is read on and answered with one ACK or a few, not one per record (the driver
 * once took each record's short read for an empty socket). */
START_TEST(test_tlsconn_batch_of_full_records_gets_few_acks)
{
    enum { RECORDS = 16, FRAME = 64, LINES = RECORDS * 16384 / FRAME };
    size_t total = (size_t)LINES * FRAME;
    tsp_logserver_t *s = server();
    proxy_t p;
    pthread_t th;
    proxy_start(&p, tsp_logserver_port(s), -1, ACT_BATCH, &th);
    p.batch_len = total + RECORDS * 22u; /* TLS 1.3: header 5, content type 1, tag 16 */
    p.batch = malloc(p.batch_len);
    uint8_t secret[32];
    tsp_logserver_secret(s, secret);
    char err[600];
    tsp__tls_t *t = NULL;
    int rc = tsp__logdial("127.0.0.1", p.port, secret, TSP_WIRE_ROLE_LOGS, 0, 9, 0, "batch", 5000,
                          &t, NULL, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    uint8_t *buf = malloc(total);
    for (int k = 0; k < LINES; k++) {
        uint8_t *f = buf + (size_t)k * FRAME;
        tsp_wire_hdr_t h = {
            .type = TSP_WIRE_LINE, .stream = 1, .rank = 0, .length = FRAME - TSP_WIRE_HDR_LEN};
        tsp_wire_hdr_pack(f, &h);
        tsp_wire_put_u64(f + TSP_WIRE_HDR_LEN, (uint64_t)k + 1);
        memset(f + TSP_WIRE_HDR_LEN + 8, 'x', FRAME - TSP_WIRE_HDR_LEN - 8);
    }
    atomic_store(&p.hold, 1); /* the handshake is through: hold the lines' records */
    ck_assert_int_eq(tsp__tls_write_all(t, buf, total, tsp__now_ms() + 20000), 0);
    int got = 0, acks = 0;
    int64_t end = tsp__now_ms() + 20000; /* a loaded machine */
    tsp_logline_t l[512];
    while (got < LINES && tsp__now_ms() < end) {
        int n = tsp_logserver_pull(s, l, 512, 100);
        for (int i = 0; i < n; i++)
            got += l[i].rank == 0;
    }
    ck_assert_int_eq(got, LINES);
    uint64_t acked = 0;
    uint8_t fb[TSP_WIRE_MAX_TEXT];
    while (acked < LINES) {
        tsp_wire_hdr_t h;
        ck_assert_int_eq(tsp__tls_read_frame(t, &h, fb, sizeof fb, end, err, sizeof err), 0);
        if (h.type == TSP_WIRE_ACK) {
            acks++;
            acked = tsp_wire_get_u64(fb);
        }
    }
    ck_assert_msg(acks <= RECORDS / 2, "%d ACKs for %d records", acks, RECORDS);
    tsp__tls_close(t);
    pthread_join(th, NULL);
    free(buf);
    free(p.batch);
    free(p.cap);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_tlsconn_plaintext_agent_gets_the_versions)
{
    tsp_logserver_t *s = server();
    uint8_t secret[32], hello[TSP_WIRE_HELLO_MAX], p[600];
    tsp_logserver_secret(s, secret);
    int fd = raw_connect(tsp_logserver_port(s));
    size_t hl = make_hello(hello, secret, 2);
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    size_t n = 0;
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p - 1, &n), TSP_WIRE_ERROR);
    p[n] = 0;
    ck_assert_str_eq((char *)p, "protocol version 2 not supported; this driver speaks 3 (TLS 1.3, "
                                "docs/protocol.md 1.10)");
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), -1);
    close(fd);
    tsp_logserver_free(s);
}
END_TEST

/* A peer that starts a TLS record and stops: closed at the handshake timeout, its few
 * bytes all the driver kept. */
START_TEST(test_tlsconn_stalled_tls_handshake_is_cut_at_the_deadline)
{
    tsp_logserver_t *s = server_hs(400);
    int fd = raw_connect(tsp_logserver_port(s));
    const uint8_t rec[] = {0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00}; /* 16 KiB announced */
    ck_assert_int_eq(send(fd, rec, sizeof rec, 0), (ssize_t)sizeof rec);
    int64_t t0 = tsp__now_ms();
    uint8_t b[64];
    ck_assert_int_le(recv(fd, b, sizeof b, 0), 0); /* closed, nothing in clear */
    int64_t dt = tsp__now_ms() - t0;
    ck_assert_int_ge(dt, 300);
    ck_assert_int_lt(dt, 4000);
    ck_assert_msg(pull_until(s, "the handshake did not complete in time", NULL, 2000), "no event");
    close(fd);
    tsp_logserver_free(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tlsconn");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_tlsconn_another_runs_key_is_refused);
    tcase_add_test(tc, test_tlsconn_rewritten_byte_kills_the_connection);
    tcase_add_test(tc, test_tlsconn_proxy_sees_no_line_in_clear);
    tcase_add_test(tc, test_tlsconn_plaintext_agent_gets_the_versions);
    tcase_add_test(tc, test_tlsconn_stalled_tls_handshake_is_cut_at_the_deadline);
    tcase_add_test(tc, test_tlsconn_encryption_off_lines_arrive_in_clear);
    tcase_add_test(tc, test_tlsconn_encryption_off_rewritten_byte_is_refused);
    tcase_add_test(tc, test_tlsconn_encryption_off_replayed_record_is_refused);
    tcase_add_test(tc, test_tlsconn_encryption_off_reordered_records_are_refused);
    tcase_add_test(tc, test_tlsconn_encryption_mismatch_is_one_sentence);
    tcase_add_test(tc, test_tlsconn_batch_of_full_records_gets_few_acks);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
