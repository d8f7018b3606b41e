/* test_logserver.c: the driver's log server over loopback: many agents, every handshake
 * rejection on a real socket, garbage connections, tails, backpressure, output transfer. */
#include <openssl/evp.h>
#include <pthread.h>
#include <sys/stat.h>

#include "logtest.h"
#include "testutil.h"
#include "torchspark/output.h"

static tsp_logserver_t *server(size_t queue_bytes, int hs_timeout_ms)
{
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.event_fd = -1;
    o.events_to_queue = 1;
    if (queue_bytes)
        o.queue_bytes = queue_bytes;
    if (hs_timeout_ms)
        o.handshake_timeout_ms = hs_timeout_ms;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    ck_assert_int_gt(tsp_logserver_port(s), 0);
    ck_assert_str_eq(tsp_logserver_host(s), "127.0.0.1");
    return s;
}

/* Pulls until `want` rank lines arrived, checking per-rank order ("<rank>:<i>"). */
static void pull_ordered(tsp_logserver_t *s, int ranks, long per_rank)
{
    long *next = calloc((size_t)ranks, sizeof(long));
    long got = 0, want = ranks * per_rank;
    tsp_logline_t lines[512];
    while (got < want) {
        int n = tsp_logserver_pull(s, lines, 512, 5000);
        ck_assert_int_gt(n, 0);
        for (int i = 0; i < n; i++) {
            if (lines[i].rank < 0)
                continue; /* a server event */
            int r;
            long k;
            char tmp[64];
            ck_assert_uint_lt(lines[i].len, sizeof tmp);
            memcpy(tmp, lines[i].data, lines[i].len);
            tmp[lines[i].len] = 0;
            ck_assert_int_eq(sscanf(tmp, "%d:%ld", &r, &k), 2);
            ck_assert_int_eq(r, lines[i].rank);
            ck_assert_int_eq(k, next[r]);
            next[r]++;
            got++;
        }
    }
    free(next);
}

typedef struct feeder {
    tsp_logserver_t *srv;
    int rank;
    long lines;
} feeder_t;

static void *feed(void *arg)
{
    feeder_t *f = arg;
    tsp_logclient_t *c = client_for(f->srv, tsp_logserver_port(f->srv), 0);
    char buf[64];
    for (long i = 0; i < f->lines; i++) {
        int n = snprintf(buf, sizeof buf, "%d:%ld", f->rank, i);
        sink_put(tsp_logclient_sink(c), f->rank, 1 + (int)(i & 1), buf, (size_t)n);
    }
    ck_assert_int_eq(tsp_logclient_close(c, 20000), 0);
    return NULL;
}

START_TEST(test_logserver_many_clients_order)
{
    tsp_logserver_t *s = server(256 * 1024, 0); /* small queue: backpressure is exercised */
    enum { N = 16, L = 20000 };
    pthread_t th[N];
    feeder_t f[N];
    for (int i = 0; i < N; i++) {
        f[i] = (feeder_t){s, i, L};
        pthread_create(&th[i], NULL, feed, &f[i]);
    }
    pull_ordered(s, N, L);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    tsp_logserver_stats_t st;
    tsp_logserver_stats(s, &st);
    ck_assert_uint_eq(st.lines, (uint64_t)N * L);
    ck_assert_uint_eq(st.authenticated, N);
    ck_assert_uint_eq(st.rejected, 0);
    char tail[256];
    long need = tsp_logserver_tail(s, 3, 2, tail, sizeof tail);
    ck_assert_int_eq(need, (long)strlen("3:19998\n3:19999\n"));
    ck_assert_int_eq(memcmp(tail, "3:19998\n3:19999\n", (size_t)need), 0);
    tsp_logserver_shutdown(s, 1000);
    tsp_logline_t l;
    ck_assert_int_eq(tsp_logserver_pull(s, &l, 1, 10), -EPIPE);
    tsp_logserver_free(s);
}
END_TEST

/* Expects the server to answer ERROR (containing `why`) and close. */
static void expect_refused(int fd, const char *why)
{
    uint8_t p[2048];
    size_t n = 0;
    int t = raw_read_frame(fd, p, sizeof p, &n);
    ck_assert_int_eq(t, TSP_WIRE_ERROR);
    p[n] = 0;
    ck_assert_msg(strstr((char *)p, why) != NULL, "got '%s', want '%s'", p, why);
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), -1);
    close(fd);
}

START_TEST(test_logserver_rejections)
{
    tsp_logserver_t *s = server(0, 400);
    int port = tsp_logserver_port(s);
    uint8_t secret[32], wrong[32], hello[TSP_WIRE_HELLO_MAX], p[256];
    tsp_logserver_secret(s, secret);
    memset(wrong, 7, sizeof wrong);
    size_t hl, n;

    int fd = raw_connect_tls(port, secret); /* bad magic */
    hl = make_hello(hello, secret, 1);
    hello[0] = 'Z';
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    expect_refused(fd, "bad magic");

    fd = raw_connect_tls(port, secret); /* another version */
    hl = make_hello(hello, secret, 4);
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    expect_refused(fd, "version 4 not supported");

    fd = raw_connect_tls(port, secret); /* no secret: another run id */
    hl = make_hello(hello, wrong, 1);
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    expect_refused(fd, "another run");

    fd = raw_connect_tls(port, secret); /* over-cap length before authentication */
    uint8_t big[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_t bh = {.type = TSP_WIRE_HELLO, .length = 5000};
    tsp_wire_hdr_pack(big, &bh);
    ck_assert_int_eq(send(fd, big, sizeof big, 0), (ssize_t)sizeof big);
    expect_refused(fd, "over the cap");

    fd = raw_connect_tls(port, secret); /* a frame other than HELLO first */
    raw_send_frame(fd, TSP_WIRE_CLOSE, -1, NULL, 0);
    expect_refused(fd, "unexpected CLOSE");

    /* wrong HMAC: right run id (a stolen HELLO), no secret to answer the challenge */
    fd = raw_connect_tls(port, secret);
    hl = make_hello(hello, secret, 1);
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_CHALLENGE);
    uint8_t mac[32];
    ck_assert_int_eq(tsp_wire_mac(wrong, 0, hello, hl, p + 2, mac), 0);
    raw_send_frame(fd, TSP_WIRE_AUTH, -1, mac, 32);
    expect_refused(fd, "authentication failed");

    /* a correct handshake, recorded, then replayed on a new connection */
    fd = raw_connect_tls(port, secret);
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_CHALLENGE);
    uint8_t nonce_s[32];
    memcpy(nonce_s, p + 2, 32);
    ck_assert_int_eq(tsp_wire_mac(secret, 0, hello, hl, nonce_s, mac), 0);
    raw_send_frame(fd, TSP_WIRE_AUTH, -1, mac, 32);
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_WELCOME);
    ck_assert_int_eq(tsp_wire_mac_verify(secret, 1, hello, hl, nonce_s, p, n), 0);
    /* an oversize frame after auth is refused too */
    uint8_t ob[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_t oh = {.type = TSP_WIRE_LINE, .stream = 1, .length = TSP_WIRE_MAX_PAYLOAD + 1};
    tsp_wire_hdr_pack(ob, &oh);
    ck_assert_int_eq(send(fd, ob, sizeof ob, 0), (ssize_t)sizeof ob);
    expect_refused(fd, "over the cap");
    fd = raw_connect_tls(port, secret);
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_CHALLENGE);
    raw_send_frame(fd, TSP_WIRE_AUTH, -1, mac, 32); /* the recorded MAC */
    expect_refused(fd, "authentication failed");

    /* a handshake that stalls */
    fd = raw_connect_tls(port, secret);
    expect_refused(fd, "did not complete in time");

    tsp_logserver_stats_t st;
    tsp_logserver_stats(s, &st);
    ck_assert_uint_eq(st.rejected, 9);
    ck_assert_uint_eq(st.authenticated, 1);
    /* and a real agent still gets through */
    tsp_logclient_t *c = client_for(s, port, 0);
    sink_put(tsp_logclient_sink(c), 0, 1, "0:0", 3);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    pull_ordered(s, 1, 1);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logserver_garbage_does_not_stop_lines)
{
    tsp_logserver_t *s = server(0, 2000);
    int port = tsp_logserver_port(s);
    tsp_logclient_t *c = client_for(s, port, 0);
    char junk[300];
    for (int i = 0; i < 1000; i++) {
        int fd = raw_connect(port);
        for (size_t k = 0; k < sizeof junk; k++)
            junk[k] = (char)(rand() & 0xff);
        junk[3] = (char)(i & 1); /* half of them with a zero reserved byte */
        ssize_t w = send(fd, junk, (size_t)(i % 300) + 1, MSG_NOSIGNAL);
        (void)w;
        close(fd);
        char line[32];
        int n = snprintf(line, sizeof line, "0:%d", i);
        sink_put(tsp_logclient_sink(c), 0, 1, line, (size_t)n);
    }
    pull_ordered(s, 1, 1000);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logserver_free(s);
}
END_TEST

static void write_file(const char *path, size_t n)
{
    FILE *f = fopen(path, "wb");
    for (size_t i = 0; i < n; i++)
        fputc((int)((i * 2654435761u) >> 13) & 0xff, f);
    fclose(f);
}

START_TEST(test_logserver_output_memory_and_file)
{
    tsp_logserver_t *s = server(0, 0);
    char src[] = "/tmp/tsp_out_srcXXXXXX", dst[] = "/tmp/tsp_out_dstXXXXXX";
    close(mkstemp(src));
    close(mkstemp(dst));
    size_t size = 3 * TSP_WIRE_MAX_CHUNK + 12345;
    write_file(src, size);
    tsp_output_opts_t o;
    tsp_output_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = tsp_logserver_port(s);
    tsp_logserver_secret(s, o.secret);
    char err[600];
    /* not expected yet: refused */
    o.attempts = 1;
    ck_assert_int_ne(tsp_output_send(&o, src, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "does not expect"));
    ck_assert_int_eq(tsp_logserver_expect_output(s, NULL), 0);
    ck_assert_int_eq(tsp_output_send(&o, src, err, sizeof err), 0);
    ck_assert_int_eq(tsp_logserver_output_wait(s, 1000), 0);
    const void *data;
    uint64_t len;
    ck_assert_int_eq(tsp_logserver_output_data(s, &data, &len), 0);
    ck_assert_uint_eq(len, size);
    FILE *f = fopen(src, "rb");
    char *want = malloc(size);
    ck_assert_uint_eq(fread(want, 1, size, f), size);
    fclose(f);
    ck_assert_int_eq(memcmp(data, want, size), 0);
    /* a second output is refused */
    ck_assert_int_ne(tsp_output_send(&o, src, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "already received"));
    tsp_logserver_free(s);

    s = server(0, 0); /* to a file, empty output too */
    o.port = tsp_logserver_port(s);
    tsp_logserver_secret(s, o.secret);
    ck_assert_int_eq(tsp_logserver_expect_output(s, dst), 0);
    ck_assert_int_eq(tsp_output_send(&o, src, err, sizeof err), 0);
    ck_assert_int_eq(tsp_logserver_output_wait(s, 1000), 0);
    struct stat sb;
    ck_assert_int_eq(stat(dst, &sb), 0);
    ck_assert_int_eq(sb.st_size, (off_t)size);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    f = fopen(dst, "rb");
    char *got = malloc(size);
    ck_assert_uint_eq(fread(got, 1, size, f), size);
    fclose(f);
    ck_assert_int_eq(memcmp(got, want, size), 0);
    free(got);
    tsp_logserver_free(s);
    free(want);
    unlink(src);
    unlink(dst);
}
END_TEST

START_TEST(test_logserver_output_bad_digest_and_length)
{
    tsp_logserver_t *s = server(0, 0);
    int port = tsp_logserver_port(s);
    uint8_t secret[32], hello[TSP_WIRE_HELLO_MAX], p[256], mac[32];
    tsp_logserver_secret(s, secret);
    ck_assert_int_eq(tsp_logserver_expect_output(s, NULL), 0);
    for (int round = 0; round < 2; round++) {
        tsp_wire_hello_t h = {.version = 1, .role = TSP_WIRE_ROLE_OUTPUT, .agent_id = 9};
        tsp_wire_run_id(secret, h.run_id);
        size_t hl = (size_t)tsp_wire_hello_pack(hello, sizeof hello, &h), n;
        int fd = raw_connect_tls(port, secret);
        raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
        ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_CHALLENGE);
        tsp_wire_mac(secret, 0, hello, hl, p + 2, mac);
        raw_send_frame(fd, TSP_WIRE_AUTH, -1, mac, 32);
        ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_WELCOME);
        uint8_t v[8];
        tsp_wire_put_u64(v, 4);
        raw_send_frame(fd, TSP_WIRE_OUT_BEGIN, -1, v, 8);
        if (round == 0) {
            raw_send_frame(fd, TSP_WIRE_OUT_CHUNK, -1, "abcd", 4);
            unsigned dl = 0; /* the right bytes' plain SHA-256: not keyed (protocol 1.10.1) */
            EVP_Digest("abcd", 4, p, &dl, EVP_sha256(), NULL);
            raw_send_frame(fd, TSP_WIRE_OUT_END, -1, p, 32);
            expect_refused(fd, "digest mismatch");
        } else {
            raw_send_frame(fd, TSP_WIRE_OUT_CHUNK, -1, "abcde", 5);
            expect_refused(fd, "past the announced");
        }
    }
    ck_assert_int_eq(tsp_logserver_output_wait(s, 50), -ETIMEDOUT);
    tsp_logserver_free(s);
}
END_TEST

/* Authenticates a raw OUTPUT connection (agent id 9) and returns it. */
static int raw_output_conn(tsp_logserver_t *s)
{
    uint8_t secret[32], hello[TSP_WIRE_HELLO_MAX], p[256], mac[32];
    tsp_logserver_secret(s, secret);
    tsp_wire_hello_t h = {.version = 1, .role = TSP_WIRE_ROLE_OUTPUT, .agent_id = 9};
    tsp_wire_run_id(secret, h.run_id);
    size_t hl = (size_t)tsp_wire_hello_pack(hello, sizeof hello, &h), n;
    int fd = raw_connect_tls(tsp_logserver_port(s), secret);
    raw_send_frame(fd, TSP_WIRE_HELLO, 0, hello, hl);
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_CHALLENGE);
    tsp_wire_mac(secret, 0, hello, hl, p + 2, mac);
    raw_send_frame(fd, TSP_WIRE_AUTH, -1, mac, 32);
    ck_assert_int_eq(raw_read_frame(fd, p, sizeof p, &n), TSP_WIRE_WELCOME);
    return fd;
}

/* A raw OUTPUT connection that has announced `total` bytes (OUT_BEGIN). */
static int raw_output_begin(tsp_logserver_t *s, uint64_t total)
{
    int fd = raw_output_conn(s);
    uint8_t v[8];
    tsp_wire_put_u64(v, total);
    raw_send_frame(fd, TSP_WIRE_OUT_BEGIN, -1, v, 8);
    return fd;
}

/* Sends `n` bytes of OUT_CHUNK frames of 1 MiB (the last shorter) with pattern bytes
 * starting at stream offset `at`; adds them to md when given. */
static void raw_send_pattern(int fd, uint64_t at, uint64_t n, EVP_MD_CTX *md)
{
    uint8_t *buf = malloc(TSP_WIRE_MAX_CHUNK);
    while (n > 0) {
        size_t k = n < TSP_WIRE_MAX_CHUNK ? (size_t)n : TSP_WIRE_MAX_CHUNK;
        for (size_t i = 0; i < k; i++)
            buf[i] = (uint8_t)(((at + i) * 2654435761u) >> 11);
        raw_send_frame(fd, TSP_WIRE_OUT_CHUNK, -1, buf, k);
        if (md)
            EVP_DigestUpdate(md, buf, k);
        at += k;
        n -= k;
    }
    free(buf);
}

/* The driver's hashing thread writes the file: a write that fails (a full disk) refuses
 * the transfer with the file's name and the reason, and the agent's connection is told. */
START_TEST(test_logserver_output_write_failure)
{
    tsp_logserver_t *s = server(0, 0);
    ck_assert_int_eq(tsp_logserver_expect_output(s, "/dev/full"), 0);
    int fd = raw_output_begin(s, 6u << 20);
    /* 1 MiB: fits the loopback socket buffers, so this send completes even though the
     * server refuses after the first piece it fails to write */
    raw_send_pattern(fd, 0, 1u << 20, NULL);
    expect_refused(fd, "cannot write the output file /dev/full on the driver: No space left");
    ck_assert_int_eq(tsp_logserver_output_wait(s, 50), -ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(tsp_logserver_output_error(s), "/dev/full"));

    /* the agent's own code, with far more than the socket buffers hold still to send:
     * it sees the refusal between chunks and reports the driver's reason */
    char src[] = "/tmp/tsp_out_fullXXXXXX";
    close(mkstemp(src));
    write_file(src, 48u << 20);
    tsp_output_opts_t o;
    tsp_output_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = tsp_logserver_port(s);
    o.attempts = 1;
    tsp_logserver_secret(s, o.secret);
    char err[600] = "";
    ck_assert_int_eq(tsp_output_send(&o, src, err, sizeof err), -EBADMSG);
    ck_assert_msg(strstr(err, "the driver refused the output: cannot write the output file "
                              "/dev/full on the driver: No space left") != NULL,
                  "got: %s", err);
    unlink(src);
    tsp_logserver_free(s);
}
END_TEST

/* A transfer cut in the middle (the agent died) stops the hashing thread and frees the
 * partial output; a new connection then ships the whole output, to memory and to a file. */
START_TEST(test_logserver_output_cut_then_retried)
{
    for (int mode = 0; mode < 2; mode++) {
        tsp_logserver_t *s = server(0, 0);
        char dst[] = "/tmp/tsp_out_cutXXXXXX";
        close(mkstemp(dst));
        ck_assert_int_eq(tsp_logserver_expect_output(s, mode ? dst : NULL), 0);
        uint64_t total = (20u << 20) + 777;
        int fd = raw_output_begin(s, total);
        raw_send_pattern(fd, 0, 9u << 20, NULL);
        close(fd);
        /* The server sees the EOF on its own thread: wait for it (generously, on a loaded
         * machine) rather than for a fixed time. */
        for (int i = 0; i < 500 && !strstr(tsp_logserver_output_error(s), "interrupted"); i++)
            usleep(10000);
        ck_assert_ptr_nonnull(strstr(tsp_logserver_output_error(s), "interrupted"));
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        EVP_DigestInit_ex(md, EVP_sha256(), NULL);
        fd = raw_output_begin(s, total);
        raw_send_pattern(fd, 0, total, md);
        uint8_t d[32], b[64];
        unsigned dl = 0;
        EVP_DigestFinal_ex(md, b, &dl);
        EVP_MD_CTX_free(md);
        uint8_t secret[32];
        tsp_logserver_secret(s, secret);
        tsp_wire_output_digest(secret, b, d);
        raw_send_frame(fd, TSP_WIRE_OUT_END, -1, d, 32);
        size_t n;
        ck_assert_int_eq(raw_read_frame(fd, b, sizeof b, &n), TSP_WIRE_OUT_DONE);
        ck_assert_int_eq(tsp_logserver_output_wait(s, 1000), 0);
        if (mode) {
            struct stat sb;
            ck_assert_int_eq(stat(dst, &sb), 0);
            ck_assert_int_eq(sb.st_size, (off_t)total);
        } else {
            const void *data;
            uint64_t len;
            ck_assert_int_eq(tsp_logserver_output_data(s, &data, &len), 0);
            ck_assert_uint_eq(len, total);
            const uint8_t *q = data;
            for (uint64_t i = 0; i < total; i += 4093)
                ck_assert_uint_eq(q[i], (uint8_t)((i * 2654435761u) >> 11));
        }
        close(fd);
        tsp_logserver_free(s);
        unlink(dst);
    }
}
END_TEST

/* Chunk data arriving in every way TCP may cut it: a header with part of its payload and
 * the next header in one segment, a payload in small pieces, and the rest. The server
 * receives chunk data in place, so each of these paths must add up to the same bytes. */
START_TEST(test_logserver_output_split_chunks)
{
    for (int mode = 0; mode < 2; mode++) {
        tsp_logserver_t *s = server(0, 0);
        char dst[] = "/tmp/tsp_out_splitXXXXXX";
        close(mkstemp(dst));
        ck_assert_int_eq(tsp_logserver_expect_output(s, mode ? dst : NULL), 0);
        int fd = raw_output_begin(s, 26);
        const char *text = "abcdefghijklmnopqrstuvwxyz";
        uint8_t b[128];
        /* chunk 1 (10 bytes) whole, plus the header of chunk 2 (16 bytes) and 3 of its
         * bytes, in one send */
        tsp_wire_hdr_t h = {.type = TSP_WIRE_OUT_CHUNK, .rank = -1, .length = 10};
        tsp_wire_hdr_pack(b, &h);
        memcpy(b + 12, text, 10);
        h.length = 16;
        tsp_wire_hdr_pack(b + 22, &h);
        memcpy(b + 34, text + 10, 3);
        ck_assert_int_eq(send(fd, b, 37, MSG_NOSIGNAL), 37);
        for (int i = 13; i < 26; i += 4) { /* the rest in pieces, with pauses */
            usleep(20000);
            size_t k = 26 - i < 4 ? (size_t)(26 - i) : 4;
            ck_assert_int_eq(send(fd, text + i, k, MSG_NOSIGNAL), (ssize_t)k);
        }
        uint8_t d[32], sha[32], secret[32];
        unsigned dl = 0;
        EVP_Digest(text, 26, sha, &dl, EVP_sha256(), NULL);
        tsp_logserver_secret(s, secret);
        tsp_wire_output_digest(secret, sha, d);
        raw_send_frame(fd, TSP_WIRE_OUT_END, -1, d, 32);
        size_t n;
        ck_assert_int_eq(raw_read_frame(fd, b, sizeof b, &n), TSP_WIRE_OUT_DONE);
        ck_assert_int_eq(memcmp(b, d, 32), 0);
        ck_assert_int_eq(tsp_logserver_output_wait(s, 1000), 0);
        const void *data;
        uint64_t len;
        ck_assert_int_eq(tsp_logserver_output_data(s, &data, &len), 0);
        ck_assert_uint_eq(len, 26);
        if (mode) {
            FILE *f = fopen(dst, "rb");
            char got[32] = "";
            ck_assert_uint_eq(fread(got, 1, sizeof got, f), 26);
            fclose(f);
            ck_assert_int_eq(memcmp(got, text, 26), 0);
        } else {
            ck_assert_int_eq(memcmp(data, text, 26), 0);
        }
        close(fd);
        tsp_logserver_free(s);
        unlink(dst);
    }
}
END_TEST

START_TEST(test_logserver_format_prefix)
{
    char b[64];
    ck_assert_uint_eq(tsp_logserver_format_prefix(b, sizeof b, NULL, NULL, 12, 1), 10);
    ck_assert_str_eq(b, "[rank 12] ");
    tsp_logserver_format_prefix(b, sizeof b, NULL, NULL, 3, 2);
    ck_assert_str_eq(b, "[rank 3] [stderr] ");
    tsp_logserver_format_prefix(b, sizeof b, "<{rank}|{rank}> ", "E ", 5, 2);
    ck_assert_str_eq(b, "<5|5> E ");
    tsp_logserver_format_prefix(b, sizeof b, NULL, NULL, -1, TSP_LOG_STREAM_EVENT);
    ck_assert_str_eq(b, "[torchspark] ");
    ck_assert_uint_eq(tsp_logserver_format_prefix(b, 4, NULL, NULL, 3, 1), 9);
    ck_assert_str_eq(b, "[ra");
}
END_TEST

/* The formatted pull: the sink's format, one batch per call, a line that does not fit
 * waits for the next call, and a buffer too small for the longest line is refused. */
START_TEST(test_logserver_pull_text)
{
    tsp_logserver_t *s = server(0, 0);
    tsp_logclient_t *c = client_for(s, tsp_logserver_port(s), 0);
    tsp_line_sink_t *k = tsp_logclient_sink(c);
    sink_put(k, 3, 1, "out", 3);
    sink_put(k, 3, 2, "err", 3);
    tsp_line_t piece = {
        .rank = 5, .stream = 1, .flags = TSP_LINE_CONTINUED, .data = "ab", .len = 2};
    ck_assert_int_eq(k->write_line(k->ctx, &piece), 0);
    sink_put(k, 5, 1, "cd\r", 3);
    char *big = malloc(TSP_WIRE_MAX_LINE);
    memset(big, 'x', TSP_WIRE_MAX_LINE);
    for (int i = 0; i < 3; i++)
        sink_put(k, 7, 1, big, TSP_WIRE_MAX_LINE);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    size_t cap = TSP_LOGSERVER_TEXT_MIN;
    char *buf = malloc(cap + 1);
    ck_assert_int_eq(tsp_logserver_pull_text(s, buf, cap - 1, 10, 0, NULL, NULL, NULL), -EINVAL);
    ck_assert_int_eq(tsp_logserver_pull_text(s, buf, cap, 2, 2000, "<{rank}> ", "E ", NULL),
                     (long)strlen("<3> out\n<3> E err\n"));
    buf[strlen("<3> out\n<3> E err\n")] = 0;
    ck_assert_str_eq(buf, "<3> out\n<3> E err\n");
    int lines = 0;
    long n = tsp_logserver_pull_text(s, buf, cap, 2, 2000, NULL, NULL, &lines);
    ck_assert_int_eq(n, (long)strlen("[rank 5] ab[rank 5] cd\r\n"));
    ck_assert_int_eq(lines, 2);
    buf[n] = 0;
    ck_assert_str_eq(buf, "[rank 5] ab[rank 5] cd\r\n");
    for (int i = 0; i < 3; i++) { /* one big line per call: the next does not fit */
        n = tsp_logserver_pull_text(s, buf, cap, 100, 2000, NULL, NULL, NULL);
        ck_assert_int_eq(n, (long)(strlen("[rank 7] ") + TSP_WIRE_MAX_LINE + 1));
        ck_assert_int_eq(buf[n - 1], '\n');
        ck_assert_int_eq(memcmp(buf + 9, big, TSP_WIRE_MAX_LINE), 0);
    }
    ck_assert_int_eq(tsp_logserver_pull_text(s, buf, cap, 10, 0, NULL, NULL, NULL), 0);
    tsp_logserver_shutdown(s, 1000);
    ck_assert_int_eq(tsp_logserver_pull_text(s, buf, cap, 10, 10, NULL, NULL, NULL), -EPIPE);
    free(big);
    free(buf);
    tsp_logserver_free(s);
}
END_TEST

static tsp_logserver_t *tail_server(unsigned lines, size_t bytes)
{
    tsp_logserver_opts_t o;
    tsp_logserver_opts_init(&o);
    o.event_fd = -1;
    o.tail_lines = lines;
    o.tail_bytes = bytes;
    char err[256];
    tsp_logserver_t *s = tsp_logserver_start(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    return s;
}

/* Sends lines of rank 0 through a client and waits until the server has them all. */
static void tail_feed(tsp_logserver_t *s, const char **lines, int n)
{
    tsp_logclient_t *c = client_for(s, tsp_logserver_port(s), 0);
    for (int i = 0; i < n; i++)
        sink_put(tsp_logclient_sink(c), 0, 1, lines[i], strlen(lines[i]));
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
}

/* The tail keeps at most tail_lines lines and tail_bytes bytes (an over-long line keeps
 * its start), and stays right while its ring wraps around. */
START_TEST(test_logserver_tail_bounds_and_wrap)
{
    tsp_logserver_t *s = tail_server(3, 10);
    const char *a[] = {"aaaa", "bbbbbb", "cc", "dddddddddddddd", "e", "ffff", "gggg", "h"};
    tail_feed(s, a, 8);
    char buf[16384];
    long n = tsp_logserver_tail(s, 0, 100, buf, sizeof buf);
    ck_assert_int_eq(n, (long)strlen("ffff\ngggg\nh\n"));
    ck_assert_int_eq(memcmp(buf, "ffff\ngggg\nh\n", (size_t)n), 0);
    ck_assert_int_eq(tsp_logserver_tail(s, 0, 1, buf, sizeof buf), 2);
    tsp_logserver_free(s);

    s = tail_server(100, 5000); /* 1000-byte lines: five fit, the ring wraps */
    static char text[20][1001];
    const char *l[20];
    for (int i = 0; i < 20; i++) {
        memset(text[i], 'a' + i, 1000);
        l[i] = text[i];
    }
    tail_feed(s, l, 20);
    n = tsp_logserver_tail(s, 0, 100, buf, sizeof buf);
    ck_assert_int_eq(n, 5 * 1001);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(memcmp(buf + i * 1001, text[15 + i], 1000), 0);
        ck_assert_int_eq(buf[i * 1001 + 1000], '\n');
    }
    ck_assert_int_eq(tsp_logserver_tail(s, 0, 2, buf, 10), 2 * 1001); /* truncated copy */
    ck_assert_int_eq(memcmp(buf, text[18], 10), 0);
    tsp_logserver_free(s);
}
END_TEST

/* Reports (protocol 1.8) go to their own queue, in order, once: not to the lines' queue,
 * the text pull or the tail; lines around them are unaffected. */
START_TEST(test_logserver_reports_have_their_own_queue)
{
    tsp_logserver_t *s = tail_server(100, 65536);
    tsp_logclient_t *c = client_for(s, tsp_logserver_port(s), 0);
    tsp_line_sink_t *k = tsp_logclient_sink(c);
    sink_put(k, 0, TSP_LOG_STREAM_STDOUT, "before", 6);
    char rec[64];
    for (int i = 0; i < 1000; i++) {
        int n = snprintf(rec, sizeof rec, "{\"step\": %d}", i);
        sink_put(k, 3, TSP_LOG_STREAM_REPORT, rec, (size_t)n);
    }
    sink_put(k, 0, TSP_LOG_STREAM_STDOUT, "after", 5);
    ck_assert_int_eq(tsp_logclient_close(c, 5000), 0);
    tsp_logline_t out[4096];
    int got = 0;
    while (got < 1000) {
        int n = tsp_logserver_pull_reports(s, out, 300, 2000);
        ck_assert_int_gt(n, 0);
        for (int i = 0; i < n; i++, got++) {
            int m = snprintf(rec, sizeof rec, "{\"step\": %d}", got);
            ck_assert_int_eq(out[i].rank, 3);
            ck_assert_int_eq(out[i].stream, TSP_LOG_STREAM_REPORT);
            ck_assert_int_eq(out[i].len, m);
            ck_assert_int_eq(memcmp(out[i].data, rec, (size_t)m), 0);
        }
    }
    ck_assert_int_eq(tsp_logserver_pull_reports(s, out, 10, 0), 0);
    int n = tsp_logserver_pull(s, out, 10, 2000);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(memcmp(out[0].data, "before", 6), 0);
    ck_assert_int_eq(memcmp(out[1].data, "after", 5), 0);
    char buf[256];
    ck_assert_int_eq(tsp_logserver_tail(s, 3, 100, buf, sizeof buf), 0);
    tsp_logserver_free(s);
}
END_TEST

START_TEST(test_logserver_bind_refuses_bad_host)
{
    char err[256];
    ck_assert_ptr_null(tsp_logserver_new("203.0.113.1", 0, NULL, 0, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "cannot listen"));
    ck_assert_ptr_null(tsp_logserver_new("127.0.0.1", 0, "xyz", 0, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "64 hex"));
    ck_assert_ptr_null(tsp_logserver_new("127.0.0.1", 70000, NULL, 0, err, sizeof err));
    ck_assert_str_eq(err, "port must be 0..65535, got 70000"); /* not port 4464 */
}
END_TEST

/* The glues' one call (docs/protocol.md 1.14): each op's reply, a tail as strings, a
 * document or null, a reply that does not fit (-ENOSPC, nothing taken), and refusals that
 * name what is wrong. */
static int call(tsp_logserver_t *s, const char *req, char *out, size_t outlen, char *err)
{
    size_t need = 0;
    return tsp_logserver_call(s, req, strlen(req), out, outlen, &need, err, 256);
}

START_TEST(test_logserver_call_ops)
{
    tsp_logserver_t *s = tail_server(100, 65536);
    char out[4096], err[256], want[128];
    ck_assert_int_eq(call(s, "{\"op\": \"info\"}", out, sizeof out, err), 0);
    snprintf(want, sizeof want, "\"port\": %d", tsp_logserver_port(s));
    ck_assert_ptr_nonnull(strstr(out, want));
    ck_assert_ptr_nonnull(strstr(out, "\"host\": \"127.0.0.1\""));
    const char *a[] = {"one", "t\xffwo"};
    tail_feed(s, a, 2);
    ck_assert_int_eq(call(s, "{\"op\": \"tail\", \"rank\": 0, \"n\": 5}", out, sizeof out, err), 0);
    ck_assert_str_eq(out, "{\"lines\": [\"one\", \"t\\ufffdwo\"]}");
    ck_assert_int_eq(call(s, "{\"op\": \"tail\", \"rank\": 0, \"n\": 0}", out, sizeof out, err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"n\" must be a whole number > 0"));
    ck_assert_int_eq(call(s, "{\"op\": \"output\", \"timeout_ms\": 0}", out, sizeof out, err), 0);
    ck_assert_str_eq(out, "{\"received\": false, \"length\": -1, \"error\": \"\"}");
    ck_assert_int_eq(call(s, "{\"op\": \"failure\", \"timeout_ms\": 0}", out, sizeof out, err), 0);
    ck_assert_str_eq(out, "null");
    ck_assert_int_eq(call(s, "{\"op\": \"lost\"}", out, sizeof out, err), 0);
    ck_assert_str_eq(out, "{\"pending\": 0, \"nodes\": []}");
    ck_assert_int_eq(call(s, "{\"op\": \"info\"}", out, 8, err), -ENOSPC);
    ck_assert_int_eq(call(s, "{\"op\": \"checkpoint_all\", \"why\": 0}", out, sizeof out, err), 0);
    ck_assert_str_eq(out, "{\"sent\": false}");
    ck_assert_int_eq(call(s, "{\"op\": \"nope\"}", out, sizeof out, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "unknown op \"nope\""));
    ck_assert_int_eq(call(s, "{\"op\": \"encryption\", \"on\": 3}", out, sizeof out, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"on\""));
    ck_assert_int_eq(call(s, "[1]", out, sizeof out, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a JSON object"));
    ck_assert_int_eq(call(s,
                          "{\"op\": \"watch\", \"timeout_ms\": 1000, \"action\": \"x\", "
                          "\"world\": 2, \"tmpdir\": \"/tmp\"}",
                          out, sizeof out, err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "report or cancel"));
    ck_assert_int_eq(call(s, "{\"op\": \"shutdown\", \"drain_ms\": 0}", out, sizeof out, err), 0);
    ck_assert_int_eq(call(s, "{\"op\": \"stop_all\"}", out, sizeof out, err), 0);
    ck_assert_str_eq(out, "{\"sent\": false}");
    ck_assert_int_eq(call(NULL, "{\"op\": \"info\"}", out, sizeof out, err), -EINVAL);
    tsp_logserver_free(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("logserver");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_logserver_many_clients_order);
    tcase_add_test(tc, test_logserver_rejections);
    tcase_add_test(tc, test_logserver_garbage_does_not_stop_lines);
    tcase_add_test(tc, test_logserver_output_memory_and_file);
    tcase_add_test(tc, test_logserver_output_bad_digest_and_length);
    tcase_add_test(tc, test_logserver_output_split_chunks);
    tcase_add_test(tc, test_logserver_output_write_failure);
    tcase_add_test(tc, test_logserver_output_cut_then_retried);
    tcase_add_test(tc, test_logserver_pull_text);
    tcase_add_test(tc, test_logserver_tail_bounds_and_wrap);
    tcase_add_test(tc, test_logserver_format_prefix);
    tcase_add_test(tc, test_logserver_bind_refuses_bad_host);
    tcase_add_test(tc, test_logserver_reports_have_their_own_queue);
    tcase_add_test(tc, test_logserver_call_ops);
    suite_add_tcase(s, tc);
    return tsp_test_main(s);
}
