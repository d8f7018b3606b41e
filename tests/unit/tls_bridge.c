/* tls_bridge.c: build/bin/tsp-tls-bridge HOST PORT, test-only. Its fd 0 is a socket (a
 * socketpair end from the test): the bytes on it are relayed, in clear on that side, over
 * TLS 1.3 keyed by TORCHSPARK_LOG_SECRET (docs/protocol.md 1.10) to the driver at
 * HOST:PORT, so that Python tests speak raw frames to the real driver (Python's ssl module
 * cannot do TLS 1.3 with an external PSK). A failed handshake: the reason on stderr, exit 1,
 * and fd 0 closes. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "logwire.h"
#include "tlsrelay.h"

int main(int argc, char **argv)
{
    const char *hex = getenv("TORCHSPARK_LOG_SECRET");
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    if (argc != 3 || !hex || tsp_wire_secret_parse(hex, secret)) {
        fprintf(stderr, "usage: TORCHSPARK_LOG_SECRET=<64 hex> tsp-tls-bridge HOST PORT "
                        "(fd 0: the plaintext socket)\n");
        return 2;
    }
    char err[600];
    tsp__tls_t *t = NULL;
    if (tls_relay_dial(argv[1], atoi(argv[2]), secret, &t, err, sizeof(err))) {
        fprintf(stderr, "tsp-tls-bridge: %s\n", err);
        return 1;
    }
    int big = 1 << 20; /* room for the ACKs of a test that does not read them */
    setsockopt(0, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    int rc = tls_relay_run(0, t, 1);
    tsp__tls_close(t);
    return rc ? 1 : 0;
}
