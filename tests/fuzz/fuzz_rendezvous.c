/* fuzz_rendezvous.c: libFuzzer target for the driver's rendezvous (docs/protocol.md 2.1):
 * each input is what one peer sends on one connection to a real server (started once, its
 * poll thread parsing), then the reply is read until the server closes. The record is
 * accepted once, so inputs also meet a server that already has one. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "torchspark/rendezvous.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tsp_rdv_t *server(void)
{
    static tsp_rdv_t *r;
    if (!r) {
        char err[256];
        r = tsp_rdv_start("127.0.0.1", 1, err, sizeof err); /* a GET waits 1 ms */
        if (!r) {
            fprintf(stderr, "fuzz_rendezvous: %s\n", err);
            abort();
        }
    }
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsp_rdv_t *r = server();
    /* A leading 'T' stands for the real token, so that inputs reach past authentication. */
    char buf[TSP_RDV_LINE_MAX + 512];
    size_t n = 0;
    if (size > 0 && data[0] == 'T') {
        memcpy(buf, tsp_rdv_token(r), TSP_RDV_TOKEN_HEX);
        n = TSP_RDV_TOKEN_HEX;
        data++;
        size--;
    }
    if (size > sizeof buf - n)
        size = sizeof buf - n;
    memcpy(buf + n, data, size);
    n += size;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)tsp_rdv_port(r))};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        abort();
    ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
    (void)w; /* the server may close first (a line too long) */
    shutdown(fd, SHUT_WR);
    char reply[TSP_RDV_LINE_MAX + 2];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, 200) > 0 && recv(fd, reply, sizeof reply, 0) > 0)
        ;
    close(fd);
    return 0;
}
