/* gangclient.c: a gang task's JOIN at the driver's rendezvous (docs/protocol.md 2.2): one
 * connection, one MAC'ed line out, one line back (GO N, or ERR reason), and the sentences a
 * glue raises as they are. */
#include "torchspark/gang.h"
#include "torchspark/rendezvous.h"

#include "logdial.h"
#include "util.h"

#include <errno.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAC_HEX 64

static int unreachable(const char *host, int port, int code, const char *why, char *err,
                       size_t errlen)
{
    char me[256] = "?";
    if (gethostname(me, sizeof me) != 0)
        snprintf(me, sizeof me, "?");
    me[sizeof me - 1] = '\0';
    return tsp__err(err, errlen, code,
                    "torchspark: gang launch: this task on host %s cannot reach the driver's "
                    "rendezvous at %s:%d (%s)",
                    me, host, port, why);
}

/* The request line "TOKEN JOIN MAC NODE TRY HOST\n" into buf; its length, or -errno. */
static int join_line(const char *token, const char *key, int node, int try_no, const char *host,
                     char *buf, size_t len)
{
    uint8_t raw[TSP_RDV_KEY_HEX / 2], mac[EVP_MAX_MD_SIZE];
    char fields[TSP_GANG_HOST_MAX + 64], text[TSP_GANG_HOST_MAX + 80], hex[MAC_HEX + 1];
    unsigned ml = 0;
    if (!key || strlen(key) != TSP_RDV_KEY_HEX || tsp__hex_decode(key, raw, sizeof raw))
        return -EINVAL;
    snprintf(fields, sizeof fields, "%d %d %s", node, try_no, host);
    int tn = snprintf(text, sizeof text, "JOIN %s", fields);
    if (!HMAC(EVP_sha256(), raw, sizeof raw, (const unsigned char *)text, (size_t)tn, mac, &ml) ||
        ml != MAC_HEX / 2)
        return -EIO;
    tsp__hex_encode(mac, ml, hex);
    int n = snprintf(buf, len, "%s JOIN %s %s\n", token, hex, fields);
    return n > 0 && (size_t)n < len ? n : -ENOSPC;
}

/* Reads one reply line into buf before deadline: its length (no newline), or -errno. */
static int read_line(int fd, char *buf, size_t len, int64_t deadline)
{
    size_t got = 0;
    for (;;) {
        char *nl = memchr(buf, '\n', got);
        if (nl)
            return (int)(nl - buf);
        if (got >= len)
            return -EPROTO;
        ssize_t n = recv(fd, buf + got, len - got, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return -errno;
        int64_t left = deadline - tsp__now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR)
            return -errno;
    }
}

int tsp_gang_call(const char *host, int port, const char *token, const char *key, int node_rank,
                  int try_no, const char *task_host, int timeout_ms, int *nnodes, char *err,
                  size_t errlen)
{
    char buf[TSP_RDV_LINE_MAX + 2];
    if (!host || !*host || port < 1 || port > 65535 || !token ||
        strlen(token) != TSP_RDV_TOKEN_HEX || !task_host || !*task_host ||
        strlen(task_host) > TSP_GANG_HOST_MAX || node_rank < 0 || try_no < 0 || timeout_ms <= 0)
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: a gang JOIN needs the rendezvous' host, port 1..65535, "
                        "token and key, a node rank and try >= 0, a host name of 1..%d bytes "
                        "and a positive timeout",
                        TSP_GANG_HOST_MAX);
    int n = join_line(token, key, node_rank, try_no, task_host, buf, sizeof buf);
    if (n < 0)
        return tsp__err(err, errlen, n == -EINVAL ? -EINVAL : n,
                        "torchspark: cannot make the gang JOIN (the rendezvous key must be 64 "
                        "hex digits)");
    int64_t now = tsp__now_ms();
    char why[256] = "";
    int fd = tsp__dial_tcp(host, port, now + TSP_RDV_CONNECT_TIMEOUT_MS, why, sizeof why);
    if (fd < 0)
        return unreachable(host, port, fd, why, err, errlen);
    int rc = tsp__sock_write_all(fd, buf, (size_t)n, now + TSP_RDV_CONNECT_TIMEOUT_MS);
    int len = rc ? rc : read_line(fd, buf, sizeof buf - 1, now + timeout_ms);
    close(fd);
    if (len < 0)
        return unreachable(host, port, len, strerror(-len), err, errlen);
    buf[len] = 0;
    if (len > 4 && memcmp(buf, "ERR ", 4) == 0)
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver refused node %d's task in the gang: %s", node_rank,
                        buf + 4);
    int size = 0;
    char end = 0;
    if (sscanf(buf, "GO %d%c", &size, &end) != 1 || size <= node_rank)
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver's rendezvous answered '%.200s' to a gang JOIN",
                        buf);
    *nnodes = size;
    return 0;
}
