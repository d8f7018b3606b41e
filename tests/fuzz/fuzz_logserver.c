/* fuzz_logserver.c: libFuzzer target for the driver log server's connection state machine
 * (docs/protocol.md, part 1): each input is what one peer sends on one connection to a
 * real server (started once, with an output slot to claim, its epoll thread parsing); the
 * replies are read until the server closes. A first byte 'L' or 'O' makes the target do
 * the handshake first with the server's secret (role LOGS with CONTROL, or OUTPUT), so the
 * rest reaches the states after authentication; anything else is sent as it is. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "logwire.h"
#include "torchspark/logserver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tsp_logserver_t *server(uint8_t secret[TSP_WIRE_SECRET_LEN])
{
    static tsp_logserver_t *s;
    if (!s) {
        char err[256];
        tsp_logserver_opts_t o;
        tsp_logserver_opts_init(&o);
        o.event_fd = -1;
        o.lost_grace_ms = 0;
        s = tsp_logserver_start(&o, err, sizeof err);
        if (!s) {
            fprintf(stderr, "fuzz_logserver: %s\n", err);
            abort();
        }
        tsp_logserver_expect_output(s, NULL);
        tsp_logserver_output_limit(s, "1m", err, sizeof err);
    }
    tsp_logserver_secret(s, secret);
    /* Keep the pull queue from filling (a full queue pauses reading, by design). */
    tsp_logline_t lines[256];
    while (tsp_logserver_pull(s, lines, 256, 0) > 0)
        ;
    return s;
}

static int read_frame(int fd, uint8_t *p, size_t cap, tsp_wire_hdr_t *h)
{
    uint8_t hdr[TSP_WIRE_HDR_LEN];
    if (recv(fd, hdr, sizeof hdr, MSG_WAITALL) != (ssize_t)sizeof hdr ||
        tsp_wire_hdr_unpack(h, hdr, sizeof hdr, TSP_WIRE_MAX_HANDSHAKE, NULL, 0) ||
        h->length > cap || (h->length && recv(fd, p, h->length, MSG_WAITALL) != (ssize_t)h->length))
        return -1;
    return 0;
}

static void send_frame(int fd, unsigned type, const uint8_t *p, size_t n)
{
    uint8_t hdr[TSP_WIRE_HDR_LEN];
    tsp_wire_hdr_t h = {.type = (uint8_t)type, .rank = -1, .length = (uint32_t)n};
    tsp_wire_hdr_pack(hdr, &h);
    ssize_t w = send(fd, hdr, sizeof hdr, MSG_NOSIGNAL);
    if (n)
        w = send(fd, p, n, MSG_NOSIGNAL);
    (void)w;
}

/* HELLO, CHALLENGE, AUTH, WELCOME. 0 when the server welcomed it. */
static int handshake(int fd, const uint8_t secret[TSP_WIRE_SECRET_LEN], int role)
{
    tsp_wire_hello_t h = {.version = 2, .role = (uint8_t)role, .agent_id = 7, .host = "fuzz"};
    if (role == TSP_WIRE_ROLE_LOGS)
        h.hflags = TSP_WIRE_HELLO_CONTROL;
    tsp_wire_run_id(secret, h.run_id);
    uint8_t hello[TSP_WIRE_HELLO_MAX], p[TSP_WIRE_MAX_HANDSHAKE], mac[TSP_WIRE_MAC_LEN];
    int n = tsp_wire_hello_pack(hello, sizeof hello, &h);
    if (n <= 0)
        abort();
    send_frame(fd, TSP_WIRE_HELLO, hello, (size_t)n);
    tsp_wire_hdr_t fh;
    uint16_t version;
    uint8_t nonce[TSP_WIRE_NONCE_LEN];
    if (read_frame(fd, p, sizeof p, &fh) || fh.type != TSP_WIRE_CHALLENGE ||
        tsp_wire_challenge_unpack(&version, nonce, p, fh.length) ||
        tsp_wire_mac(secret, 0, hello, (size_t)n, nonce, mac))
        return -1;
    send_frame(fd, TSP_WIRE_AUTH, mac, sizeof mac);
    return read_frame(fd, p, sizeof p, &fh) || fh.type != TSP_WIRE_WELCOME ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    tsp_logserver_t *s = server(secret);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)tsp_logserver_port(s))};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        abort();
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1; /* a frame is two sends: no Nagle wait for the ACK of the first */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int ok = 1;
    if (size > 0 && (data[0] == 'L' || data[0] == 'O')) {
        ok = handshake(fd, secret, data[0] == 'L' ? TSP_WIRE_ROLE_LOGS : TSP_WIRE_ROLE_OUTPUT) == 0;
        data++;
        size--;
    }
    if (ok && size) {
        ssize_t w = send(fd, data, size, MSG_NOSIGNAL);
        (void)w; /* the server may refuse and close first */
    }
    shutdown(fd, SHUT_WR);
    uint8_t reply[4096];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, 500) > 0 && recv(fd, reply, sizeof reply, 0) > 0)
        ;
    close(fd);
    return 0;
}
