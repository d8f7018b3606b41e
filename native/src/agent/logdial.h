/* logdial.h: the agent side's connection to the driver (connect + authenticated
 * handshake) and deadline-bounded socket I/O, shared by logclient.c and output.c; the
 * plain connect also serves the rendezvous client (rdvclient.c). */
#ifndef TSP_LOGDIAL_H
#define TSP_LOGDIAL_H

#include <stddef.h>
#include <stdint.h>

#include "tlsconn.h"

/* Connects to host:port, runs TLS 1.3 keyed by the secret (docs/protocol.md 1.10) and the
 * handshake of 1.4 inside it in the given role, for at most timeout_ms. 0 with *out the
 * connection (a non-blocking CLOEXEC TCP_NODELAY socket inside; tsp__tls_close ends both),
 * or -errno with a sentence in err: -EACCES when the driver refused us. welcome_flags (may
 * be NULL) receives the WELCOME header's flags (TSP_WIRE_WELCOME_CONTROL, 1.7). */
int tsp__logdial(const char *host, int port, const uint8_t *secret, int role, int hflags,
                 uint64_t agent_id, int node_rank, const char *hostname, int timeout_ms,
                 tsp__tls_t **out, int *welcome_flags, char *err, size_t errlen);
/* Connects to host:port (a name or numeric address) before deadline (ms on the monotonic
 * clock). A connected non-blocking socket (CLOEXEC, TCP_NODELAY), or -errno with a sentence
 * in err ("cannot connect to HOST:PORT: why", "cannot resolve HOST: why"). */
int tsp__dial_tcp(const char *host, int port, int64_t deadline, char *err, size_t errlen);
/* Sends all n bytes on a plain socket before deadline (ms on the monotonic clock, -1:
 * none). 0, -ETIMEDOUT, or -errno. */
int tsp__sock_write_all(int fd, const void *p, size_t n, int64_t deadline);
/* Reads one whole frame (header checked against cap) into p (room: cap bytes). */
struct tsp_wire_hdr;
int tsp__tls_read_frame(tsp__tls_t *t, struct tsp_wire_hdr *h, uint8_t *p, uint32_t cap,
                        int64_t deadline, char *err, size_t errlen);

#endif
