/* macrec.h (internal): the log channel's records when encryption is off
 * (spark.torchspark.encryption=false, docs/protocol.md 1.10.1): length || payload || GMAC tag
 * over a sequence number, on the raw socket after the TLS 1.3 handshake. Not encrypted, never
 * unauthenticated: a record rewritten, dropped, reordered, replayed or taken from another
 * connection fails its tag.
 *
 * One tsp__macrec_t is one connection's two directions; one thread at a time. */
#ifndef TSP_MACREC_H
#define TSP_MACREC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TSP__MACREC_KEY_LEN 16u
#define TSP__MACREC_TAG_LEN 16u
#define TSP__MACREC_MAX (256u * 1024u) /* the largest payload of one record */

typedef struct tsp__macrec tsp__macrec_t;

/* Keys for what this end sends and what it receives. 0, -ENOMEM or -EIO. */
int tsp__macrec_new(tsp__macrec_t **out, const uint8_t send_key[TSP__MACREC_KEY_LEN],
                    const uint8_t recv_key[TSP__MACREC_KEY_LEN]);
void tsp__macrec_free(tsp__macrec_t *m);

/* Like SSL_write with partial writes: at most one record of buf's first bytes; a count once
 * that record is wholly sent, else -EAGAIN (*want POLLOUT), and the caller calls again with
 * the same bytes (they may have moved), or -errno with a sentence in why. */
ssize_t tsp__macrec_write(tsp__macrec_t *m, int fd, const void *buf, size_t n, short *want,
                          char *why, size_t whylen);
/* Like SSL_read: verified payload bytes, 0 at the peer's end on a record boundary, -EAGAIN
 * (*want POLLIN), -EBADMSG (a tag failed, a bad length, an end inside a record: why), or
 * -errno. */
ssize_t tsp__macrec_read(tsp__macrec_t *m, int fd, void *buf, size_t n, short *want, char *why,
                         size_t whylen);
/* Verified bytes not yet read: epoll does not see them. */
int tsp__macrec_pending(const tsp__macrec_t *m);

#endif
