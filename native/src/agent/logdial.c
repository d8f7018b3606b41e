/* logdial.c: an agent's authenticated connection to the driver's log server (the client
 * half of docs/protocol.md 1.10 and 1.4: TLS 1.3, then the handshake inside it) and I/O
 * bounded by deadlines. */
#include "logdial.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "logwire.h"
#include "util.h"

int tsp__sock_write_all(int fd, const void *buf, size_t n, int64_t deadline)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN)
            return -errno;
        int rc = tsp__wait_fd(fd, POLLOUT, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

int tsp__tls_read_frame(tsp__tls_t *t, struct tsp_wire_hdr *h, uint8_t *p, uint32_t cap,
                        int64_t deadline, char *err, size_t errlen)
{
    uint8_t hb[TSP_WIRE_HDR_LEN];
    int rc = tsp__tls_read_full(t, hb, sizeof(hb), deadline);
    if (rc) {
        return tsp__err(err, errlen, rc, "%s",
                        rc == -ECONNRESET ? "the driver closed the connection"
                        : rc == -EBADMSG  ? tsp__tls_why(t)
                                          : strerror(-rc));
    }
    if ((rc = tsp_wire_hdr_unpack(h, hb, sizeof(hb), cap, err, errlen)))
        return rc;
    if ((rc = tsp__tls_read_full(t, p, h->length, deadline)))
        return tsp__err(err, errlen, rc, "reading a %s frame: %s", tsp_wire_type_name(h->type),
                        rc == -EBADMSG ? tsp__tls_why(t) : strerror(-rc));
    return 0;
}

int tsp__dial_tcp(const char *host, int port, int64_t deadline, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV},
                    *res = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc) {
        return tsp__err(err, errlen, -EHOSTUNREACH, "cannot resolve %s: %s", host,
                        gai_strerror(rc));
    }
    int e = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) {
            int r = tsp__wait_fd(fd, POLLOUT, deadline);
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (!r)
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (!r && !soerr) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                freeaddrinfo(res);
                return fd;
            }
            e = r ? -r : soerr;
        } else {
            e = errno;
        }
        close(fd);
    }
    freeaddrinfo(res);
    snprintf(err, errlen, "cannot connect to %s:%d: %s", host, port, strerror(e));
    return -e;
}

static int handshake(tsp__tls_t *t, const uint8_t *secret, int role, int hflags, uint64_t agent_id,
                     int node_rank, const char *hostname, int64_t deadline, int *welcome_flags,
                     char *err, size_t errlen)
{
    tsp_wire_hello_t h = {.version = TSP_WIRE_VERSION,
                          .role = (uint8_t)role,
                          .hflags = (uint8_t)hflags,
                          .agent_id = agent_id,
                          .node_rank = node_rank};
    snprintf(h.host, sizeof(h.host), "%s", hostname ? hostname : "");
    if (tsp_wire_run_id(secret, h.run_id) || tsp__random_bytes(h.nonce, sizeof(h.nonce)))
        return tsp__err(err, errlen, -EIO, "cannot compute the run id or draw the nonce");
    uint8_t buf[TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_HANDSHAKE];
    int hl = tsp_wire_hello_pack(buf + TSP_WIRE_HDR_LEN, TSP_WIRE_HELLO_MAX, &h);
    if (hl < 0)
        return tsp__err(err, errlen, -EINVAL, "host name too long");
    uint8_t hello[TSP_WIRE_HELLO_MAX];
    memcpy(hello, buf + TSP_WIRE_HDR_LEN, (size_t)hl);
    tsp_wire_hdr_t fh = {.type = TSP_WIRE_HELLO, .rank = node_rank, .length = (uint32_t)hl};
    tsp_wire_hdr_pack(buf, &fh);
    int rc = tsp__tls_write_all(t, buf, TSP_WIRE_HDR_LEN + (size_t)hl, deadline);
    if (rc)
        return tsp__err(err, errlen, rc, "sending HELLO: %s", strerror(-rc));
    /* CHALLENGE, or ERROR with the driver's reason. */
    tsp_wire_hdr_t rh = {0};
    if ((rc = tsp__tls_read_frame(t, &rh, buf, TSP_WIRE_MAX_HANDSHAKE, deadline, err, errlen)))
        return rc;
    if (rh.type == TSP_WIRE_ERROR)
        return tsp__err(err, errlen, -EACCES, "the driver refused: %.*s", (int)rh.length,
                        (char *)buf);
    uint16_t ver;
    uint8_t nonce_s[TSP_WIRE_NONCE_LEN];
    if (rh.type != TSP_WIRE_CHALLENGE || tsp_wire_challenge_unpack(&ver, nonce_s, buf, rh.length))
        return tsp__err(err, errlen, -EPROTO, "the driver sent a bad CHALLENGE");
    uint8_t mac[TSP_WIRE_MAC_LEN];
    if (tsp_wire_mac(secret, 0, hello, (size_t)hl, nonce_s, mac))
        return tsp__err(err, errlen, -EIO, "HMAC failed");
    fh = (tsp_wire_hdr_t){.type = TSP_WIRE_AUTH, .rank = -1, .length = TSP_WIRE_MAC_LEN};
    tsp_wire_hdr_pack(buf, &fh);
    memcpy(buf + TSP_WIRE_HDR_LEN, mac, sizeof(mac));
    if ((rc = tsp__tls_write_all(t, buf, TSP_WIRE_HDR_LEN + sizeof(mac), deadline)))
        return tsp__err(err, errlen, rc, "sending AUTH: %s", strerror(-rc));
    if ((rc = tsp__tls_read_frame(t, &rh, buf, TSP_WIRE_MAX_HANDSHAKE, deadline, err, errlen)))
        return rc;
    if (rh.type == TSP_WIRE_ERROR)
        return tsp__err(err, errlen, -EACCES, "the driver refused: %.*s", (int)rh.length,
                        (char *)buf);
    if (rh.type != TSP_WIRE_WELCOME ||
        tsp_wire_mac_verify(secret, 1, hello, (size_t)hl, nonce_s, buf, rh.length))
        return tsp__err(err, errlen, -EACCES,
                        "the server did not prove that it knows the run's secret");
    /* A driver grants CONTROL only when asked (protocol 1.7): never trust it unasked. */
    if (welcome_flags)
        *welcome_flags = (hflags & TSP_WIRE_HELLO_CONTROL) ? rh.flags : 0;
    return 0;
}

int tsp__logdial(const char *host, int port, const uint8_t *secret, int role, int hflags,
                 uint64_t agent_id, int node_rank, const char *hostname, int timeout_ms,
                 tsp__tls_t **out, int *welcome_flags, char *err, size_t errlen)
{
    int64_t deadline = tsp__now_ms() + (timeout_ms > 0 ? timeout_ms : 5000);
    int fd = tsp__dial_tcp(host, port, deadline, err, errlen);
    if (fd < 0)
        return fd;
    tsp__tls_t *t = NULL;
    int rc = tsp__tls_dial(&t, fd, secret, err, errlen);
    if (rc) {
        close(fd);
        return rc;
    }
    if ((rc = tsp__tls_handshake_by(t, deadline, err, errlen)) ||
        (rc = handshake(t, secret, role, hflags, agent_id, node_rank, hostname, deadline,
                        welcome_flags, err, errlen))) {
        tsp__tls_close(t);
        return rc;
    }
    *out = t;
    return 0;
}
