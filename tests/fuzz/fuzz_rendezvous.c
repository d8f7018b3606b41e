/* fuzz_rendezvous.c: libFuzzer target for the driver's rendezvous (docs/protocol.md 2.1):
 * each input is what one peer sends on one connection to a real server (started once, its
 * poll thread parsing), then the reply is read until the server closes. The record is
 * accepted once, so inputs also meet a server that already has one.
 *
 * Every connection is TLS 1.3 keyed by the run's secret, so the target is a client that
 * knows it (a context made once). The first byte picks the mode:
 *   'T'       inside TLS, the rest as it is: the request parser after authentication;
 *   'M'       inside TLS, "PUT MAC REST" with the MAC of REST (up to its first newline)
 *             under the run's key: the accepted PUT and what follows it;
 *   anything  the whole input in plaintext: what the server sees before TLS. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzzclient.h"
#include "tlsconn.h"
#include "torchspark/rendezvous.h"
#include "util.h"

#define REPLY_WAIT_MS 200
/* Only a hung server reaches it: the run script starves the targets beside pytest (nice 19). */
#define TLS_WAIT_MS 30000

static const char SECRET[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what, const char *why)
{
    fuzz_die("fuzz_rendezvous", what, why);
}

/* The server and a client context for its secret, made once (both stay reachable). */
static tsp_rdv_t *server(tsp__tlsctx_t **cx)
{
    static tsp_rdv_t *r;
    static tsp__tlsctx_t *x;
    if (!r) {
        char err[256];
        r = tsp_rdv_start("127.0.0.1", SECRET, 1, err, sizeof err); /* a GET waits 1 ms */
        if (!r)
            die("cannot start the rendezvous", err);
        uint8_t secret[TSP_WIRE_SECRET_LEN];
        if (tsp__hex_decode(SECRET, secret, sizeof secret) ||
            tsp__tlsctx_new_for(&x, 0, secret, TSP__TLS_RDV_LABEL, err, sizeof err))
            die("cannot make a TLS context", err);
    }
    *cx = x;
    return r;
}

static void run_tls(int fd, tsp__tlsctx_t *x, const uint8_t *data, size_t size)
{
    int64_t dl = tsp__now_ms() + TLS_WAIT_MS;
    tsp__tls_t *t = fuzz_tls_open("fuzz_rendezvous", fd, x, dl);
    if (data[0] == 'M') {
        char line[TSP_RDV_LINE_MAX + 512];
        size_t n = size - 1 < TSP_RDV_RECORD_MAX ? size - 1 : TSP_RDV_RECORD_MAX;
        memcpy(line, data + 1, n);
        line[n] = '\0';
        char *nl = memchr(line, '\n', n);
        size_t rn = nl ? (size_t)(nl - line) : strlen(line); /* the MAC of the record */
        char rec[TSP_RDV_RECORD_MAX + 1], mac[TSP_RDV_MAC_HEX + 1];
        memcpy(rec, line, rn);
        rec[rn] = '\0';
        if (tsp_rdv_record_mac(SECRET, rec, mac, sizeof mac))
            abort();
        char req[TSP_RDV_LINE_MAX + 600];
        int k = snprintf(req, sizeof req, "PUT %s %.*s", mac, (int)n, line);
        (void)tsp__tls_write_all(t, req, (size_t)k, dl);
    } else if (size > 1) {
        (void)tsp__tls_write_all(t, data + 1, size - 1, dl); /* the server may close first */
    }
    fuzz_tls_finish(t, fd, REPLY_WAIT_MS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tsp__tlsctx_t *x;
    tsp_rdv_t *r = server(&x);
    if (size > TSP_RDV_LINE_MAX + 512)
        size = TSP_RDV_LINE_MAX + 512;
    int fd = fuzz_connect(tsp_rdv_port(r));
    if (size > 0 && (data[0] == 'T' || data[0] == 'M'))
        run_tls(fd, x, data, size);
    else
        fuzz_plain(fd, data, size, REPLY_WAIT_MS);
    close(fd);
    return 0;
}
