/* fuzz_logserver.c: libFuzzer target for the driver log server's connection state machine
 * (docs/protocol.md, part 1): each input is what one peer sends on one connection to a
 * real server (started once, with an output slot to claim, its epoll thread parsing); the
 * replies are read until the server closes.
 *
 * Since version 3 the channel is TLS 1.3 from its first byte (protocol 1.10), so the target
 * is a client that knows the run's key: it completes TLS first and sends the input inside,
 * where the frame parser sees it. The first byte picks the mode:
 *   'L' or 'O'  inside TLS, the handshake of 1.4 first with the server's secret (role LOGS
 *               with CONTROL, or OUTPUT), then the rest: the states after authentication;
 *   'P'         the rest in plaintext, no TLS: what the server sees before TLS (an older
 *               agent's plaintext HELLO, garbage, a forged ClientHello);
 *   anything    inside TLS, the whole input as it is: the states before authentication. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzzclient.h"
#include "logwire.h"
#include "tlsconn.h"
#include "torchspark/logserver.h"
#include "util.h"

#define REPLY_WAIT_MS 500
/* Only a hung server reaches it: the run script starves the targets beside pytest (nice 19). */
#define TLS_WAIT_MS 30000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the inputs reached, printed at exit: a mode that silently stopped reaching its
 * states (as the plaintext target did when TLS came) shows as zeros here. */
static struct {
    unsigned long plain, tls, authed[3], welcomed[3];
} st;

static void print_stats(void)
{
    fprintf(stderr,
            "fuzz_logserver: %lu inputs inside TLS, %lu in plaintext; handshake welcomed "
            "LOGS %lu/%lu, OUTPUT %lu/%lu\n",
            st.tls, st.plain, st.welcomed[TSP_WIRE_ROLE_LOGS], st.authed[TSP_WIRE_ROLE_LOGS],
            st.welcomed[TSP_WIRE_ROLE_OUTPUT], st.authed[TSP_WIRE_ROLE_OUTPUT]);
}

static void die(const char *what, const char *why)
{
    fuzz_die("fuzz_logserver", what, why);
}

/* The server (started once) and a client TLS context for its secret (made once: one
 * SSL_CTX per input would cost more than the input). Both stay reachable: no leak. */
static tsp_logserver_t *server(uint8_t secret[TSP_WIRE_SECRET_LEN], tsp__tlsctx_t **cx)
{
    static tsp_logserver_t *s;
    static tsp__tlsctx_t *x;
    if (!s) {
        char err[256];
        tsp_logserver_opts_t o;
        tsp_logserver_opts_init(&o);
        o.event_fd = -1;
        o.lost_grace_ms = 0;
        s = tsp_logserver_start(&o, err, sizeof err);
        if (!s)
            die("cannot start the log server", err);
        tsp_logserver_expect_output(s, NULL);
        tsp_logserver_output_limit(s, "1m", err, sizeof err);
    }
    tsp_logserver_secret(s, secret);
    if (!x) {
        char err[256];
        if (tsp__tlsctx_new(&x, 0, secret, err, sizeof err))
            die("cannot make a TLS context", err);
        atexit(print_stats);
    }
    *cx = x;
    /* Keep the pull queue from filling (a full queue pauses reading, by design). */
    tsp_logline_t lines[256];
    while (tsp_logserver_pull(s, lines, 256, 0) > 0)
        ;
    return s;
}

static int send_frame(tsp__tls_t *t, unsigned type, const uint8_t *p, size_t n, int64_t dl)
{
    uint8_t f[TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_HANDSHAKE];
    tsp_wire_hdr_t h = {.type = (uint8_t)type, .rank = -1, .length = (uint32_t)n};
    tsp_wire_hdr_pack(f, &h);
    memcpy(f + TSP_WIRE_HDR_LEN, p, n);
    return tsp__tls_write_all(t, f, TSP_WIRE_HDR_LEN + n, dl);
}

static int read_frame(tsp__tls_t *t, uint8_t *p, size_t cap, tsp_wire_hdr_t *h, int64_t dl)
{
    uint8_t hdr[TSP_WIRE_HDR_LEN];
    if (tsp__tls_read_full(t, hdr, sizeof hdr, dl) ||
        tsp_wire_hdr_unpack(h, hdr, sizeof hdr, TSP_WIRE_MAX_HANDSHAKE, NULL, 0) ||
        h->length > cap || (h->length && tsp__tls_read_full(t, p, h->length, dl)))
        return -1;
    return 0;
}

/* HELLO, CHALLENGE, AUTH, WELCOME inside TLS. 0 when the server welcomed it. */
static int handshake(tsp__tls_t *t, const uint8_t secret[TSP_WIRE_SECRET_LEN], int role, int64_t dl)
{
    tsp_wire_hello_t h = {
        .version = TSP_WIRE_VERSION, .role = (uint8_t)role, .agent_id = 7, .host = "fuzz"};
    if (role == TSP_WIRE_ROLE_LOGS)
        h.hflags = TSP_WIRE_HELLO_CONTROL;
    tsp_wire_run_id(secret, h.run_id);
    uint8_t hello[TSP_WIRE_HELLO_MAX], p[TSP_WIRE_MAX_HANDSHAKE], mac[TSP_WIRE_MAC_LEN];
    int n = tsp_wire_hello_pack(hello, sizeof hello, &h);
    if (n <= 0)
        abort();
    tsp_wire_hdr_t fh;
    uint16_t version;
    uint8_t nonce[TSP_WIRE_NONCE_LEN];
    if (send_frame(t, TSP_WIRE_HELLO, hello, (size_t)n, dl) ||
        read_frame(t, p, sizeof p, &fh, dl) || fh.type != TSP_WIRE_CHALLENGE ||
        tsp_wire_challenge_unpack(&version, nonce, p, fh.length) ||
        tsp_wire_mac(secret, 0, hello, (size_t)n, nonce, mac) ||
        send_frame(t, TSP_WIRE_AUTH, mac, sizeof mac, dl))
        return -1;
    return read_frame(t, p, sizeof p, &fh, dl) || fh.type != TSP_WIRE_WELCOME ? -1 : 0;
}

static void run_tls(int fd, tsp__tlsctx_t *x, const uint8_t *secret, const uint8_t *data,
                    size_t size)
{
    int64_t dl = tsp__now_ms() + TLS_WAIT_MS;
    tsp__tls_t *t = fuzz_tls_open("fuzz_logserver", fd, x, dl);
    st.tls++;
    int ok = 1;
    if (size > 0 && (data[0] == 'L' || data[0] == 'O')) {
        int role = data[0] == 'L' ? TSP_WIRE_ROLE_LOGS : TSP_WIRE_ROLE_OUTPUT;
        st.authed[role]++;
        ok = handshake(t, secret, role, dl) == 0;
        st.welcomed[role] += (unsigned long)ok;
        data++;
        size--;
    }
    if (ok && size)
        (void)tsp__tls_write_all(t, data, size, dl); /* the server may refuse and close first */
    fuzz_tls_finish(t, fd, REPLY_WAIT_MS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    tsp__tlsctx_t *x;
    tsp_logserver_t *s = server(secret, &x);
    int fd = fuzz_connect(tsp_logserver_port(s));
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1; /* small writes: no Nagle wait for the ACK of the previous one */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (size > 0 && data[0] == 'P') {
        st.plain++;
        fuzz_plain(fd, data + 1, size - 1, REPLY_WAIT_MS);
    } else {
        run_tls(fd, x, secret, data, size);
    }
    close(fd);
    return 0;
}
