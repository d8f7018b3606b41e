/* tlsconn.h (internal): the log channel's transport, TLS 1.3 keyed by the run's secret
 * (docs/protocol.md 1.10), for both ends: the driver's epoll thread (non-blocking, one
 * step at a time) and the agent's threads (the same, plus calls bounded by deadlines).
 *
 * A tsp__tls_t is one connection: it does not own its socket (the caller closes it after
 * tsp__tls_free). One thread at a time may use a connection; distinct connections may be
 * used from distinct threads (a context is shared read-only). */
#ifndef TSP_TLSCONN_H
#define TSP_TLSCONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "logwire.h"

typedef struct tsp__tlsctx tsp__tlsctx_t;
typedef struct tsp__tls tsp__tls_t;

/* The HKDF labels (info) of the keys derived from a run's secret: one per use, so that a key
 * of one channel never opens another (docs/protocol.md 1.10, 2.1). */
#define TSP__TLS_LOG_LABEL "torchspark log channel TLS 1.3 PSK v1"
#define TSP__TLS_RDV_LABEL "torchspark rendezvous TLS 1.3 PSK v1"
#define TSP__RDV_MAC_LABEL "torchspark rendezvous record MAC v1"
#define TSP__TLS_KEY_LEN 32u
/* The plaintext of a full TLS record: a read that returns less ended a writer's batch. */
#define TSP__TLS_RECORD 16384u

/* The log channel's modes (docs/protocol.md 1.10.1): TLS records to the end, or the MAC'ed
 * records of macrec after the handshake (spark.torchspark.encryption=false). */
#define TSP__TLS_ENCRYPT 1
#define TSP__TLS_MAC 2

/* HKDF-SHA256(salt "torchspark", the secret, info label): 32 bytes. 0 or -EIO. */
int tsp__tls_derive(const uint8_t secret[TSP_WIRE_SECRET_LEN], const char *label,
                    uint8_t out[TSP__TLS_KEY_LEN]);

/* HMAC-SHA256(key, p[0..n)) as 64 lowercase hex digits and a NUL into out. 0 or -EIO. */
int tsp__tls_mac_hex(const uint8_t key[TSP__TLS_KEY_LEN], const void *p, size_t n, char out[65]);

/* A context for one run's secret: server 1 (the driver), 0 (an agent), the log channel's
 * key. 0 or -errno with a sentence in err. */
int tsp__tlsctx_new(tsp__tlsctx_t **out, int server, const uint8_t secret[TSP_WIRE_SECRET_LEN],
                    char *err, size_t errlen);
/* The same with the PSK derived under label (TSP__TLS_*_LABEL). */
int tsp__tlsctx_new_for(tsp__tlsctx_t **out, int server, const uint8_t secret[TSP_WIRE_SECRET_LEN],
                        const char *label, char *err, size_t errlen);
void tsp__tlsctx_free(tsp__tlsctx_t *x);
/* What the connections made after it offer (a client: one or both modes) or pick (a server:
 * exactly one). Default: a client offers both, a server picks TSP__TLS_ENCRYPT. */
void tsp__tlsctx_set_modes(tsp__tlsctx_t *x, int modes);

/* A connection over the connected socket fd (non-blocking). 0 or -ENOMEM. */
int tsp__tls_new(tsp__tls_t **out, tsp__tlsctx_t *x, int fd);
void tsp__tls_free(tsp__tls_t *t);
/* An agent's connection over fd with a context of its own (freed with it). 0 or -errno
 * with a sentence in err. */
int tsp__tls_dial(tsp__tls_t **out, int fd, const uint8_t secret[TSP_WIRE_SECRET_LEN], char *err,
                  size_t errlen);
/* The same with the PSK derived under label (TSP__TLS_*_LABEL). */
int tsp__tls_dial_for(tsp__tls_t **out, int fd, const uint8_t secret[TSP_WIRE_SECRET_LEN],
                      const char *label, char *err, size_t errlen);
/* tsp__tls_free, then closes the socket (and a context of its own). */
void tsp__tls_close(tsp__tls_t *t);
int tsp__tls_fd(const tsp__tls_t *t);

/* One step of the handshake: 0 done, -EAGAIN (tsp__tls_want says on what to wait),
 * -EACCES refused (wrong key, another run), -ECONNRESET the peer closed, or -errno.
 * tsp__tls_why then holds a sentence. */
int tsp__tls_handshake(tsp__tls_t *t);
/* Like recv/send: a count, 0 (read: the peer closed), -EAGAIN (wait: tsp__tls_want),
 * -EBADMSG (a record failed authentication or TLS broke: tsp__tls_why), or -errno. */
ssize_t tsp__tls_read(tsp__tls_t *t, void *buf, size_t n);
ssize_t tsp__tls_write(tsp__tls_t *t, const void *buf, size_t n);
/* After -EAGAIN: POLLIN or POLLOUT. */
short tsp__tls_want(const tsp__tls_t *t);
/* Plaintext already decrypted and not yet read: epoll does not see it. */
int tsp__tls_pending(const tsp__tls_t *t);
/* Why the last call failed, a sentence (never NULL). */
const char *tsp__tls_why(const tsp__tls_t *t);
/* Sends close_notify (best effort, non-blocking). */
void tsp__tls_close_notify(tsp__tls_t *t);
/* 1 when the kernel encrypts what this connection sends (kTLS): tsp__tls_sendfile works;
 * 0 with encryption off (macrec). */
int tsp__tls_ktls_send(const tsp__tls_t *t);
/* SSL_sendfile: a count, -EAGAIN, -ENOSYS without kTLS, or -errno. */
ssize_t tsp__tls_sendfile(tsp__tls_t *t, int filefd, off_t off, size_t n);

/* Bounded by deadline (ms on the monotonic clock, -1: none): 0, -ETIMEDOUT, -ECONNRESET at
 * the peer's end, or -errno; the handshake fills err with a sentence. */
int tsp__tls_handshake_by(tsp__tls_t *t, int64_t deadline, char *err, size_t errlen);
int tsp__tls_write_all(tsp__tls_t *t, const void *p, size_t n, int64_t deadline);
int tsp__tls_read_full(tsp__tls_t *t, void *p, size_t n, int64_t deadline);

#endif
