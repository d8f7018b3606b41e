/* rdvclient.c: a barrier task's end of the driver's rendezvous (docs/protocol.md 2.1):
 * one request per connection, rank 0's PUT or another rank's GET, and the sentences each
 * glue raises as they are (the UNREACHABLE one that makes the driver fall back to
 * allGather, and the driver's refusal). */
#include "torchspark/rendezvous.h"

#include "logdial.h"
#include "util.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RDV_NO_REPLY_GRACE_MS 60000 /* a GET's wait beyond the driver's own GET timeout */

#define MAC_HEX 64 /* HMAC-SHA256 as hex digits, before the record on the wire */

struct tsp_rdv_call {
    int fd;
    int is_put;
    uint8_t key[TSP_RDV_KEY_HEX / 2];
    int64_t deadline; /* for the whole reply */
    char where[300];  /* HOST:PORT, for messages ([V6]:PORT) */
    size_t len;       /* bytes in buf */
    char buf[TSP_RDV_LINE_MAX + 2];
};

/* The sentence of a task that cannot reach the driver: code, with it in err. */
static int unreachable(const char *where, int code, const char *why, char *err, size_t errlen)
{
    char host[256] = "?";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    return tsp__err(err, errlen, code,
                    TSP_RDV_UNREACHABLE ": this barrier task on host %s cannot reach the driver's "
                                        "rendezvous at %s (%s); the driver runs the job again "
                                        "through BarrierTaskContext.allGather",
                    host, where, why);
}

static int token_valid(const char *token)
{
    if (!token || strlen(token) != TSP_RDV_TOKEN_HEX)
        return 0;
    for (const char *p = token; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return 1;
}

/* The record's MAC (HMAC-SHA256 with the run's record key) as hex into out (MAC_HEX + 1). */
static int record_mac(const uint8_t *key, const char *rec, size_t n, char *out)
{
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned ml = 0;
    if (!HMAC(EVP_sha256(), key, TSP_RDV_KEY_HEX / 2, (const unsigned char *)rec, n, mac, &ml) ||
        ml != MAC_HEX / 2)
        return -EIO;
    tsp__hex_encode(mac, ml, out);
    return 0;
}

static int check_args(const char *host, int port, const char *token, const char *record, char *err,
                      size_t errlen)
{
    if (!host || !*host || port < 1 || port > 65535)
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the rendezvous needs a host and a port 1..65535 (got %s:%d)",
                        host ? host : "(none)", port);
    if (!token_valid(token))
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the rendezvous token must be 64 lowercase hex digits");
    if (record && (!*record || strlen(record) > TSP_RDV_RECORD_MAX || strchr(record, '\n')))
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the election record is empty, too long (over %d bytes) or "
                        "not one line",
                        TSP_RDV_RECORD_MAX);
    return 0;
}

int tsp_rdv_call_start(const char *host, int port, const char *token, const char *key,
                       const char *record, tsp_rdv_call_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_args(host, port, token, record, err, errlen);
    if (rc)
        return rc;
    char mac[MAC_HEX + 1] = "";
    uint8_t rawkey[TSP_RDV_KEY_HEX / 2];
    if (!key || strlen(key) != TSP_RDV_KEY_HEX || tsp__hex_decode(key, rawkey, sizeof rawkey))
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the rendezvous key must be 64 hex digits");
    if (record && record_mac(rawkey, record, strlen(record), mac))
        return tsp__err(err, errlen, -EIO, "torchspark: HMAC failed for the election record");
    tsp_rdv_call_t *c = calloc(1, sizeof(*c));
    if (!c)
        return tsp__err(err, errlen, -ENOMEM, "out of memory");
    memcpy(c->key, rawkey, sizeof c->key);
    const char *h = host;
    size_t hl = strlen(host);
    if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') { /* "[V6]" -> "V6" */
        h = host + 1;
        hl -= 2;
    }
    char bare[256];
    snprintf(bare, sizeof bare, "%.*s", (int)hl, h);
    snprintf(c->where, sizeof c->where, strchr(bare, ':') ? "[%s]:%d" : "%s:%d", bare, port);
    c->is_put = record != NULL;
    int64_t now = tsp__now_ms();
    char why[256] = "";
    c->fd = tsp__dial_tcp(bare, port, now + TSP_RDV_CONNECT_TIMEOUT_MS, why, sizeof why);
    if (c->fd < 0) {
        /* The reason alone ("Connection refused"): the sentence names the endpoint. */
        int resolve = strncmp(why, "cannot resolve", 14) == 0;
        rc = unreachable(c->where, c->fd, resolve ? why : strerror(-c->fd), err, errlen);
        free(c);
        return rc;
    }
    /* The request: TOKEN PUT MAC RECORD\n or TOKEN GET\n (it fits: the record was
     * checked). */
    int n = snprintf(c->buf, sizeof c->buf, "%s %s%s%s%s\n", token, record ? "PUT " : "GET", mac,
                     record ? " " : "", record ? record : "");
    rc = tsp__sock_write_all(c->fd, c->buf, (size_t)n, now + TSP_RDV_CONNECT_TIMEOUT_MS);
    if (rc) {
        close(c->fd);
        rc = unreachable(c->where, rc, strerror(-rc), err, errlen);
        free(c);
        return rc;
    }
    c->deadline = now + (record ? TSP_RDV_CONNECT_TIMEOUT_MS
                                : (int64_t)TSP_RDV_GET_TIMEOUT_MS + RDV_NO_REPLY_GRACE_MS);
    *out = c;
    return 0;
}

/* The whole reply line (n bytes) of c, as the call's result. */
static int finish(tsp_rdv_call_t *c, size_t n, char *reply, size_t len, char *err, size_t errlen)
{
    const char *line = c->buf;
    if (n >= 4 && memcmp(line, "ERR ", 4) == 0)
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver refused the rendezvous: %.*s", (int)(n - 4),
                        line + 4);
    if (c->is_put && !(n == 2 && memcmp(line, "OK", 2) == 0))
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver's rendezvous answered '%.*s' to rank 0's record",
                        (int)n, line);
    if (c->is_put) {
        if (!reply || len <= n)
            return tsp__err(err, errlen, -ENOSPC, "the rendezvous reply needs %zu bytes", n + 1);
        memcpy(reply, line, n);
        reply[n] = '\0';
        return 0;
    }
    /* A GET's reply is MAC RECORD: used only when the MAC is rank 0's (someone who learned
     * the token, a sniffer, cannot make one without the key). */
    char want[MAC_HEX + 1];
    if (n <= MAC_HEX + 1 || line[MAC_HEX] != ' ' ||
        record_mac(c->key, line + MAC_HEX + 1, n - MAC_HEX - 1, want) ||
        CRYPTO_memcmp(want, line, MAC_HEX) != 0)
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the rendezvous reply from %s is not rank 0's election "
                        "record (its MAC does not match the run's key: forged or altered on the "
                        "way); not using it",
                        c->where);
    size_t rn = n - MAC_HEX - 1;
    if (!reply || len <= rn)
        return tsp__err(err, errlen, -ENOSPC, "the rendezvous reply needs %zu bytes", rn + 1);
    memcpy(reply, line + MAC_HEX + 1, rn);
    reply[rn] = '\0';
    return 0;
}

int tsp_rdv_call_wait(tsp_rdv_call_t *c, int timeout_ms, char *reply, size_t len, char *err,
                      size_t errlen)
{
    int64_t until = c->deadline;
    if (timeout_ms >= 0 && tsp__now_ms() + timeout_ms < until)
        until = tsp__now_ms() + timeout_ms;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (nl)
            return finish(c, (size_t)(nl - c->buf), reply, len, err, errlen);
        if (c->len > TSP_RDV_LINE_MAX)
            return unreachable(c->where, -EPROTO, "its reply is too long", err, errlen);
        ssize_t got = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, MSG_DONTWAIT);
        if (got > 0) {
            c->len += (size_t)got;
            continue;
        }
        if (got == 0)
            return unreachable(c->where, -ECONNRESET,
                               "the connection closed before a whole line came", err, errlen);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return unreachable(c->where, -errno, strerror(errno), err, errlen);
        int64_t left = until - tsp__now_ms();
        if (left <= 0) {
            if (until < c->deadline)
                return TSP_RDV_PENDING;
            return unreachable(c->where, -ETIMEDOUT, "no reply in time", err, errlen);
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, left > 60000 ? 60000 : (int)left) < 0 && errno != EINTR)
            return unreachable(c->where, -errno, strerror(errno), err, errlen);
    }
}

void tsp_rdv_call_free(tsp_rdv_call_t *c)
{
    if (!c)
        return;
    close(c->fd);
    free(c);
}

int tsp_rdv_exchange(const char *host, int port, const char *token, const char *key,
                     const char *record, char *reply, size_t len, char *err, size_t errlen)
{
    tsp_rdv_call_t *c = NULL;
    int rc = tsp_rdv_call_start(host, port, token, key, record, &c, err, errlen);
    if (rc || !c)
        return rc;
    rc = tsp_rdv_call_wait(c, -1, reply, len, err, errlen);
    tsp_rdv_call_free(c);
    return rc;
}
