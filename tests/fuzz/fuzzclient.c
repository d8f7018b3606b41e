/* fuzzclient.c: the fuzz targets' client side (fuzzclient.h). */
#include "fuzzclient.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"

void fuzz_die(const char *target, const char *what, const char *why)
{
    fprintf(stderr, "%s: %s: %s\n", target, what, why);
    abort();
}

int fuzz_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        abort();
    return fd;
}

tsp__tls_t *fuzz_tls_open(const char *target, int fd, tsp__tlsctx_t *x, int64_t dl)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        abort();
    tsp__tls_t *t;
    char err[300];
    if (tsp__tls_new(&t, x, fd))
        abort();
    /* The client has the key: a refusal here is the target's fault or the server's, never
     * the input's (it is not sent yet). Stop loudly rather than fuzz nothing. */
    if (tsp__tls_handshake_by(t, dl, err, sizeof err))
        fuzz_die(target, "the server refused TLS with its own key", err);
    return t;
}

void fuzz_tls_finish(tsp__tls_t *t, int fd, int wait_ms)
{
    tsp__tls_close_notify(t);
    shutdown(fd, SHUT_WR);
    uint8_t reply[4096];
    for (;;) {
        ssize_t r = tsp__tls_read(t, reply, sizeof reply);
        if (r > 0)
            continue;
        struct pollfd p = {.fd = fd, .events = tsp__tls_want(t)};
        if (r != -EAGAIN || poll(&p, 1, wait_ms) <= 0)
            break;
    }
    tsp__tls_free(t);
}

void fuzz_plain(int fd, const uint8_t *data, size_t size, int wait_ms)
{
    if (size) {
        ssize_t w = send(fd, data, size, MSG_NOSIGNAL);
        (void)w; /* the server may refuse and close first */
    }
    shutdown(fd, SHUT_WR);
    uint8_t reply[4096];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, wait_ms) > 0 && recv(fd, reply, sizeof reply, 0) > 0)
        ;
}
