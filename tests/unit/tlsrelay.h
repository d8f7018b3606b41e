/* tlsrelay.h: test-only plaintext <-> TLS relay for the log channel (docs/protocol.md 1.10),
 * so that tests keep speaking raw frames to the real driver: the Check programs through
 * tls_relay_pipe, Python through build/bin/tsp-tls-bridge (tls_bridge.c). */
#ifndef TSP_TLSRELAY_H
#define TSP_TLSRELAY_H

#include <stddef.h>
#include <stdint.h>

#include "tlsconn.h"

/* Dials host:port and completes TLS with the secret's key (5 s). 0 or -errno, err set. */
int tls_relay_dial(const char *host, int port, const uint8_t *secret, tsp__tls_t **out, char *err,
                   size_t errlen);
/* Relays plain <-> t until both directions ended (an end of plain sends close_notify; an
 * end of t shuts plain's write side). 0, or -1 when TLS broke (why on stderr when loud). */
int tls_relay_run(int plain, tsp__tls_t *t, int loud);
/* A socket whose other end is relayed, by a detached thread, over the connection t (taken:
 * closed when the relay ends). -errno on failure (t closed). */
int tls_relay_adopt(tsp__tls_t *t, char *err, size_t errlen);
/* A socket whose other end is relayed, by a detached thread, over TLS to host:port. */
int tls_relay_pipe(const char *host, int port, const uint8_t *secret, char *err, size_t errlen);

#endif
