/* logtest.h: helpers shared by the log channel's Check programs (raw sockets, a sink
 * writer that honours -EAGAIN, a puller). Included by test_logserver.c and
 * test_logclient.c only. */
#ifndef TSP_LOGTEST_H
#define TSP_LOGTEST_H
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "logclient.h"
#include "torchspark/logserver.h"
#include "logwire.h"
#include "tlsrelay.h"
#include "util.h"

static inline int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* A raw connection inside TLS 1.3 keyed by secret (docs/protocol.md 1.10): frames written
 * to the returned socket reach the server's frame layer (a relay thread encrypts). */
static inline int raw_connect_tls(int port, const uint8_t *secret)
{
    char err[600];
    int fd = tls_relay_pipe("127.0.0.1", port, secret, err, sizeof err);
    ck_assert_msg(fd >= 0, "%s", err);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static inline void raw_send_frame(int fd, unsigned type, int rank, const void *p, size_t n)
{
    uint8_t b[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_t h = {.type = (uint8_t)type, .rank = rank, .length = (uint32_t)n};
    tsp_wire_hdr_pack(b, &h);
    ck_assert_int_eq(send(fd, b, sizeof b, MSG_NOSIGNAL), (ssize_t)sizeof b);
    if (n)
        ck_assert_int_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads one frame; returns its type (payload into p), or -1 at EOF/error. */
static inline int raw_read_frame(int fd, uint8_t *p, size_t cap, size_t *len)
{
    uint8_t b[TSP_WIRE_HDR_LEN];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t r = recv(fd, b + got, sizeof b - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    tsp_wire_hdr_t h;
    if (tsp_wire_hdr_unpack(&h, b, sizeof b, (uint32_t)cap, NULL, 0))
        return -1;
    for (got = 0; got < h.length;) {
        ssize_t r = recv(fd, p + got, h.length - got, 0);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    if (len)
        *len = h.length;
    return h.type;
}

/* A HELLO payload for secret (role LOGS); returns its length. */
static inline size_t make_hello(uint8_t *out, const uint8_t *secret, uint16_t version)
{
    tsp_wire_hello_t h = {
        .version = version, .role = TSP_WIRE_ROLE_LOGS, .agent_id = 42, .node_rank = 0};
    strcpy(h.host, "testhost");
    tsp_wire_run_id(secret, h.run_id);
    tsp__random_bytes(h.nonce, sizeof h.nonce);
    int n = tsp_wire_hello_pack(out, TSP_WIRE_HELLO_MAX, &h);
    if (version != TSP_WIRE_VERSION) { /* pack does not check versions: the unpacker does */
        out[4] = (uint8_t)(version >> 8);
        out[5] = (uint8_t)version;
    }
    return (size_t)n;
}

/* Writes a line through a sink, waiting on wake_fd while it says -EAGAIN. */
static inline void sink_put(tsp_line_sink_t *s, int rank, int stream, const char *d, size_t n)
{
    tsp_line_t l = {.rank = rank, .stream = (uint8_t)stream, .data = d, .len = n};
    for (;;) {
        int rc = s->write_line(s->ctx, &l);
        if (rc != -EAGAIN) {
            ck_assert_int_eq(rc, 0);
            return;
        }
        struct pollfd p = {.fd = s->wake_fd, .events = POLLIN};
        ck_assert_int_ge(poll(&p, 1, 20000), 1);
    }
}

static inline tsp_logclient_t *client_for(tsp_logserver_t *srv, int port, int drop)
{
    tsp_logclient_opts_t o;
    tsp_logclient_opts_init(&o);
    o.host = "127.0.0.1";
    o.port = port;
    o.drop = drop;
    o.node_rank = 0;
    o.hostname = "unit";
    o.reconnect_grace_ms = 20000;
    tsp_logserver_secret(srv, o.secret);
    char err[256];
    tsp_logclient_t *c = tsp_logclient_start(&o, err, sizeof err);
    ck_assert_msg(c != NULL, "%s", err);
    return c;
}
#endif
