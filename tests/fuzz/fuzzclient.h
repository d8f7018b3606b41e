/* fuzzclient.h: the client side shared by the fuzz targets that drive a real server through
 * a real socket (fuzz_rendezvous.c, fuzz_logserver.c): connect, TLS 1.3 with the run's key,
 * send, and read the reply until the server closes or is silent. */
#ifndef TSP_FUZZCLIENT_H
#define TSP_FUZZCLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "tlsconn.h"

/* Prints "<target>: WHAT: WHY" and aborts (a fault of the target or the server, never the
 * input's). */
void fuzz_die(const char *target, const char *what, const char *why);

/* A blocking TCP connection to 127.0.0.1:port; aborts when there is none. */
int fuzz_connect(int port);

/* Makes fd non-blocking and completes the TLS handshake by deadline dl with context x (the
 * client has the run's key: a refusal dies, naming target). */
tsp__tls_t *fuzz_tls_open(const char *target, int fd, tsp__tlsctx_t *x, int64_t dl);

/* close_notify, SHUT_WR, reads what the server sends until it closes or is silent for
 * wait_ms, then frees t. */
void fuzz_tls_finish(tsp__tls_t *t, int fd, int wait_ms);

/* Sends data in plaintext (the server may close first), SHUT_WR, and reads the reply until
 * the server closes or is silent for wait_ms. */
void fuzz_plain(int fd, const uint8_t *data, size_t size, int wait_ms);

#endif
