/* rdvclient.c: a barrier task's end of the driver's rendezvous (docs/protocol.md 2.1):
 * one request per connection inside TLS 1.3 keyed by the run's secret (tlsconn.c, the
 * rendezvous' label), rank 0's PUT or another rank's GET, and the sentences each glue
 * raises as they are (the UNREACHABLE one that makes the driver fall back to allGather,
 * and the driver's refusal). */
#include "torchspark/rendezvous.h"

#include "logdial.h"
#include "tlsconn.h"
#include "util.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RDV_NO_REPLY_GRACE_MS 60000 /* a GET's wait beyond the driver's own GET timeout */

#define MAC_HEX 64 /* HMAC-SHA256 as hex digits, before the record on the wire */

enum call_kind { CALL_PUT, CALL_GET, CALL_RAW, CALL_LINE /* tsp_rdv_call_line */ };

struct tsp_rdv_call {
    int fd;
    tsp__tls_t *tls;
    enum call_kind kind;
    uint8_t mac_key[TSP__TLS_KEY_LEN];
    int64_t deadline; /* for the whole reply */
    char where[300];  /* HOST:PORT, for messages ([V6]:PORT) */
    size_t len;       /* bytes in buf */
    char buf[TSP_RDV_LINE_MAX + 2];
};

/* The sentence of a task that cannot reach the driver: code, with it in err. A barrier
 * task's names the allGather fallback; a line call's (a gang task's JOIN) has none. */
static int unreachable(const tsp_rdv_call_t *c, int code, const char *why, char *err, size_t errlen)
{
    char host[256] = "?";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    if (c->kind == CALL_LINE)
        return tsp__err(err, errlen, code,
                        "torchspark: this task on host %s cannot reach the driver's rendezvous "
                        "at %s (%s)",
                        host, c->where, why);
    return tsp__err(err, errlen, code,
                    TSP_RDV_UNREACHABLE ": this barrier task on host %s cannot reach the driver's "
                                        "rendezvous at %s (%s); the driver runs the job again "
                                        "through BarrierTaskContext.allGather",
                    host, c->where, why);
}

/* The run's secret (64 hex digits) into raw bytes; -EINVAL with a sentence. */
static int read_secret(const char *hex, uint8_t out[TSP_WIRE_SECRET_LEN], char *err, size_t errlen)
{
    if (!hex || strlen(hex) != 2 * TSP_WIRE_SECRET_LEN ||
        tsp__hex_decode(hex, out, TSP_WIRE_SECRET_LEN))
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the rendezvous needs the run's secret as 64 hex digits");
    return 0;
}

int tsp_rdv_record_mac(const char *secret_hex, const char *record, char *out, size_t outlen)
{
    uint8_t secret[TSP_WIRE_SECRET_LEN], key[TSP__TLS_KEY_LEN];
    if (!record || outlen < MAC_HEX + 1 || read_secret(secret_hex, secret, NULL, 0))
        return -EINVAL;
    int rc = tsp__tls_derive(secret, TSP__RDV_MAC_LABEL, key) ||
                     tsp__tls_mac_hex(key, record, strlen(record), out)
                 ? -EIO
                 : 0;
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(key, sizeof key);
    return rc;
}

static int check_args(const char *host, int port, const char *line, char *err, size_t errlen)
{
    if (!host || !*host || port < 1 || port > 65535)
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the rendezvous needs a host and a port 1..65535 (got %s:%d)",
                        host ? host : "(none)", port);
    if (line && (!*line || strlen(line) > TSP_RDV_RECORD_MAX || strchr(line, '\n')))
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: the election record is empty, too long (over %d bytes) or "
                        "not one line",
                        TSP_RDV_RECORD_MAX);
    return 0;
}

/* HOST:PORT of the call, for messages; the bare host (no brackets) into bare. */
static void where_of(tsp_rdv_call_t *c, const char *host, int port, char *bare, size_t n)
{
    const char *h = host;
    size_t hl = strlen(host);
    if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') { /* "[V6]" -> "V6" */
        h = host + 1;
        hl -= 2;
    }
    snprintf(bare, n, "%.*s", (int)hl, h);
    snprintf(c->where, sizeof c->where, strchr(bare, ':') ? "[%s]:%d" : "%s:%d", bare, port);
}

/* Connects, completes TLS with the rendezvous' key and sends the request (n bytes). */
static int call_connect(tsp_rdv_call_t *c, const char *bare, int port,
                        const uint8_t secret[TSP_WIRE_SECRET_LEN], const char *req, size_t n,
                        char *err, size_t errlen)
{
    int64_t until = tsp__now_ms() + TSP_RDV_CONNECT_TIMEOUT_MS;
    char why[300] = "";
    c->fd = tsp__dial_tcp(bare, port, until, why, sizeof why);
    if (c->fd < 0) {
        /* The reason alone ("Connection refused"): the sentence names the endpoint. */
        int resolve = strncmp(why, "cannot resolve", 14) == 0;
        return unreachable(c, c->fd, resolve ? why : strerror(-c->fd), err, errlen);
    }
    int rc = tsp__tls_dial_for(&c->tls, c->fd, secret, TSP__TLS_RDV_LABEL, why, sizeof why);
    if (rc)
        return tsp__err(err, errlen, rc, "torchspark: %s", why);
    rc = tsp__tls_handshake_by(c->tls, until, why, sizeof why);
    if (rc == -EACCES) /* the driver holds another key: not a network failure */
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver refused the rendezvous: its TLS handshake at %s "
                        "failed (%s): this task does not hold the run's secret, or the driver "
                        "serves another run",
                        c->where, why);
    if (rc)
        return unreachable(c, rc, why, err, errlen);
    rc = tsp__tls_write_all(c->tls, req, n, until);
    if (rc)
        return unreachable(c, rc, strerror(-rc), err, errlen);
    return 0;
}

/* A call of kind (*out, allocated) that sends req (n bytes, its newline included). */
static int call_open(const char *host, int port, const char *secret_hex, enum call_kind kind,
                     const char *req, size_t n, tsp_rdv_call_t **out, char *err, size_t errlen)
{
    tsp_rdv_call_t *c = *out;
    *out = NULL;
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    int rc = read_secret(secret_hex, secret, err, errlen);
    if (!rc && tsp__tls_derive(secret, TSP__RDV_MAC_LABEL, c->mac_key))
        rc = tsp__err(err, errlen, -EIO, "torchspark: cannot derive the rendezvous key");
    c->fd = -1;
    c->kind = kind;
    if (!rc) {
        char bare[256];
        where_of(c, host, port, bare, sizeof bare);
        rc = call_connect(c, bare, port, secret, req, n, err, errlen);
    }
    OPENSSL_cleanse(secret, sizeof secret);
    if (rc) {
        tsp_rdv_call_free(c);
        return rc;
    }
    c->len = 0;
    c->deadline =
        tsp__now_ms() + (kind == CALL_GET ? (int64_t)TSP_RDV_GET_TIMEOUT_MS + RDV_NO_REPLY_GRACE_MS
                                          : TSP_RDV_CONNECT_TIMEOUT_MS);
    *out = c;
    return 0;
}

int tsp_rdv_call_start(const char *host, int port, const char *secret_hex, const char *record,
                       tsp_rdv_call_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = check_args(host, port, record, err, errlen);
    if (rc)
        return rc;
    tsp_rdv_call_t *c = calloc(1, sizeof(*c));
    if (!c)
        return tsp__err(err, errlen, -ENOMEM, "out of memory");
    /* The request: PUT MAC RECORD or GET (it fits: the record was checked). */
    char mac[MAC_HEX + 1] = "";
    if (record && tsp_rdv_record_mac(secret_hex, record, mac, sizeof mac) == -EIO) {
        free(c);
        return tsp__err(err, errlen, -EIO, "torchspark: HMAC failed for the election record");
    }
    char req[TSP_RDV_LINE_MAX + 2];
    int n = snprintf(req, sizeof req, "%s%s%s%s\n", record ? "PUT " : "GET", mac, record ? " " : "",
                     record ? record : "");
    *out = c;
    return call_open(host, port, secret_hex, record ? CALL_PUT : CALL_GET, req, (size_t)n, out, err,
                     errlen);
}

/* A GET's reply "MAC RECORD" (n bytes): used only when the MAC is rank 0's under the run's
 * key (the channel is authenticated; the MAC makes it rank 0's end to end). */
static int finish_get(tsp_rdv_call_t *c, size_t n, char *reply, size_t len, char *err,
                      size_t errlen)
{
    const char *line = c->buf;
    char want[MAC_HEX + 1];
    if (n <= MAC_HEX + 1 || line[MAC_HEX] != ' ' ||
        tsp__tls_mac_hex(c->mac_key, line + MAC_HEX + 1, n - MAC_HEX - 1, want) ||
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

/* The whole reply line (n bytes) of c, as the call's result. */
static int finish(tsp_rdv_call_t *c, size_t n, char *reply, size_t len, char *err, size_t errlen)
{
    const char *line = c->buf;
    if ((c->kind == CALL_PUT || c->kind == CALL_GET) && n >= 4 && memcmp(line, "ERR ", 4) == 0)
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver refused the rendezvous: %.*s", (int)(n - 4),
                        line + 4);
    if (c->kind == CALL_PUT && !(n == 2 && memcmp(line, "OK", 2) == 0))
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver's rendezvous answered '%.*s' to rank 0's record",
                        (int)n, line);
    if (c->kind == CALL_GET)
        return finish_get(c, n, reply, len, err, errlen);
    if (!reply || len <= n)
        return tsp__err(err, errlen, -ENOSPC, "the rendezvous reply needs %zu bytes", n + 1);
    memcpy(reply, line, n);
    reply[n] = '\0';
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
            return unreachable(c, -EPROTO, "its reply is too long", err, errlen);
        ssize_t got = tsp__tls_read(c->tls, c->buf + c->len, sizeof(c->buf) - c->len);
        if (got > 0) {
            c->len += (size_t)got;
            continue;
        }
        if (got == 0)
            return unreachable(c, -ECONNRESET, "the connection closed before a whole line came",
                               err, errlen);
        if (got != -EAGAIN)
            return unreachable(c, (int)got, tsp__tls_why(c->tls), err, errlen);
        int64_t left = until - tsp__now_ms();
        if (left <= 0) {
            if (until < c->deadline)
                return TSP_RDV_PENDING;
            return unreachable(c, -ETIMEDOUT, "no reply in time", err, errlen);
        }
        int rc = tsp__wait_fd(c->fd, tsp__tls_want(c->tls),
                              tsp__now_ms() + (left > 60000 ? 60000 : left));
        if (rc && rc != -ETIMEDOUT)
            return unreachable(c, rc, strerror(-rc), err, errlen);
    }
}

void tsp_rdv_call_free(tsp_rdv_call_t *c)
{
    if (!c)
        return;
    if (c->tls)
        tsp__tls_close(c->tls); /* frees its own context and closes the socket */
    else if (c->fd >= 0)
        close(c->fd);
    OPENSSL_cleanse(c->mac_key, sizeof c->mac_key);
    free(c);
}

/* Starts a call (start), waits until its deadline, frees it. */
static int call_whole(tsp_rdv_call_t *c, int rc, char *reply, size_t len, char *err, size_t errlen)
{
    if (rc || !c)
        return rc;
    rc = tsp_rdv_call_wait(c, -1, reply, len, err, errlen);
    tsp_rdv_call_free(c);
    return rc;
}

int tsp_rdv_exchange(const char *host, int port, const char *secret_hex, const char *record,
                     char *reply, size_t len, char *err, size_t errlen)
{
    tsp_rdv_call_t *c = NULL;
    int rc = tsp_rdv_call_start(host, port, secret_hex, record, &c, err, errlen);
    return call_whole(c, rc, reply, len, err, errlen);
}

/* A call of kind (CALL_RAW or CALL_LINE) that sends line and waits for its reply up to
 * timeout_ms. */
static int line_open(const char *host, int port, const char *secret_hex, const char *line,
                     enum call_kind kind, int timeout_ms, tsp_rdv_call_t **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    if (!line || strchr(line, '\n') || strlen(line) > 4 * TSP_RDV_LINE_MAX || timeout_ms <= 0)
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: a rendezvous request is one line, with a positive timeout");
    int rc = check_args(host, port, NULL, err, errlen);
    if (rc)
        return rc;
    size_t n = strlen(line);
    tsp_rdv_call_t *c = calloc(1, sizeof(*c));
    char *req = malloc(n + 2);
    if (!c || !req) {
        free(c);
        free(req);
        return tsp__err(err, errlen, -ENOMEM, "out of memory");
    }
    snprintf(req, n + 2, "%s\n", line);
    *out = c;
    rc = call_open(host, port, secret_hex, kind, req, n + 1, out, err, errlen);
    free(req);
    if (!rc)
        (*out)->deadline = tsp__now_ms() + timeout_ms;
    return rc;
}

int tsp_rdv_call_line(const char *host, int port, const char *secret_hex, const char *line,
                      int timeout_ms, tsp_rdv_call_t **out, char *err, size_t errlen)
{
    return line_open(host, port, secret_hex, line, CALL_LINE, timeout_ms, out, err, errlen);
}

int tsp_rdv_request(const char *host, int port, const char *secret_hex, const char *line,
                    char *reply, size_t len, char *err, size_t errlen)
{
    tsp_rdv_call_t *c = NULL;
    int rc = line_open(host, port, secret_hex, line, CALL_RAW, TSP_RDV_CONNECT_TIMEOUT_MS, &c, err,
                       errlen);
    return call_whole(c, rc, reply, len, err, errlen);
}
