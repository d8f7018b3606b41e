/* macrec.c: the records of the log channel with encryption off (docs/protocol.md 1.10.1):
 *
 *   length (u32 big-endian, 1 .. 256 KiB) || payload || tag[16]
 *   tag = GMAC(key, nonce = 0^32 || seq (u64 big-endian), AAD = length || payload)
 *
 * GMAC is AES-128-GCM with everything as additional data and nothing encrypted; seq counts a
 * direction's records from 0 and is never sent. The payload goes out from the caller's buffer
 * (sendmsg of header, payload, tag: no copy); a received record is verified whole before any
 * byte of it is handed out. */
#include "macrec.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define HDR 4u

struct tsp__macrec {
    EVP_CIPHER_CTX *sc, *rc;
    uint64_t sseq, rseq;
    /* the record being sent: header and tag made, wsent of HDR + wlen + TAG sent */
    int wbusy;
    uint8_t whdr[HDR], wtag[TSP__MACREC_TAG_LEN];
    size_t wlen, wsent;
    /* the record being received: rhave bytes of header, payload and tag so far */
    uint8_t rhdr[HDR];
    size_t rlen, rhave;
    uint8_t *rbuf;       /* TSP__MACREC_MAX + TSP__MACREC_TAG_LEN */
    size_t roff, rready; /* verified payload: rbuf[roff .. rready) not yet read */
    int broken;          /* a record failed: nothing more is read */
};

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static int gmac(EVP_CIPHER_CTX *c, uint64_t seq, const uint8_t hdr[HDR], const void *p, size_t n,
                uint8_t tag[TSP__MACREC_TAG_LEN])
{
    uint8_t iv[12] = {0}, none[16];
    int outl = 0;
    put_be(iv + 4, seq, 8);
    return EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv) &&
                   EVP_EncryptUpdate(c, NULL, &outl, hdr, (int)HDR) &&
                   EVP_EncryptUpdate(c, NULL, &outl, p, (int)n) &&
                   EVP_EncryptFinal_ex(c, none, &outl) &&
                   EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, (int)TSP__MACREC_TAG_LEN, tag)
               ? 0
               : -EIO;
}

static EVP_CIPHER_CTX *keyed(const uint8_t key[TSP__MACREC_KEY_LEN])
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (c && EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, key, NULL))
        return c;
    EVP_CIPHER_CTX_free(c);
    return NULL;
}

int tsp__macrec_new(tsp__macrec_t **out, const uint8_t send_key[TSP__MACREC_KEY_LEN],
                    const uint8_t recv_key[TSP__MACREC_KEY_LEN])
{
    tsp__macrec_t *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->sc = keyed(send_key);
    m->rc = keyed(recv_key);
    m->rbuf = malloc(TSP__MACREC_MAX + TSP__MACREC_TAG_LEN);
    if (!m->sc || !m->rc || !m->rbuf) {
        tsp__macrec_free(m);
        return -ENOMEM;
    }
    *out = m;
    return 0;
}

void tsp__macrec_free(tsp__macrec_t *m)
{
    if (!m)
        return;
    EVP_CIPHER_CTX_free(m->sc);
    EVP_CIPHER_CTX_free(m->rc);
    free(m->rbuf);
    free(m);
}

int tsp__macrec_pending(const tsp__macrec_t *m)
{
    return m && m->roff < m->rready;
}

ssize_t tsp__macrec_write(tsp__macrec_t *m, int fd, const void *buf, size_t n, short *want,
                          char *why, size_t whylen)
{
    if (!m->wbusy) {
        if (n == 0)
            return 0;
        m->wlen = n < TSP__MACREC_MAX ? n : TSP__MACREC_MAX;
        put_be(m->whdr, m->wlen, HDR);
        if (gmac(m->sc, m->sseq, m->whdr, buf, m->wlen, m->wtag)) {
            snprintf(why, whylen, "cannot compute a record's MAC (OpenSSL)");
            return -EIO;
        }
        m->sseq++;
        m->wsent = 0;
        m->wbusy = 1;
    } else if (n < m->wlen) {
        return -EINVAL; /* not the bytes of the record under way */
    }
    size_t total = HDR + m->wlen + TSP__MACREC_TAG_LEN;
    while (m->wsent < total) {
        struct iovec iov[3];
        int k = 0;
        size_t at = m->wsent;
        if (at < HDR)
            iov[k++] = (struct iovec){m->whdr + at, HDR - at};
        if (at < HDR + m->wlen) {
            size_t o = at > HDR ? at - HDR : 0;
            iov[k++] = (struct iovec){(uint8_t *)(uintptr_t)buf + o, m->wlen - o};
        }
        size_t t = at > HDR + m->wlen ? at - HDR - m->wlen : 0;
        iov[k++] = (struct iovec){m->wtag + t, TSP__MACREC_TAG_LEN - t};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *want = POLLOUT;
            return -EAGAIN;
        }
        if (w < 0) {
            int e = errno;
            snprintf(why, whylen, "%s", strerror(e));
            return -e;
        }
        m->wsent += (size_t)w;
    }
    m->wbusy = 0;
    return (ssize_t)m->wlen;
}

/* Reads into the record under way until it is whole: 1, or what read returns. */
static ssize_t fill(tsp__macrec_t *m, int fd, short *want, char *why, size_t whylen)
{
    for (;;) {
        uint8_t *to;
        size_t room;
        if (m->rhave < HDR) {
            to = m->rhdr + m->rhave;
            room = HDR - m->rhave;
        } else {
            size_t need = m->rlen + TSP__MACREC_TAG_LEN, got = m->rhave - HDR;
            if (got == need)
                return 1;
            to = m->rbuf + got;
            room = need - got;
        }
        ssize_t r = recv(fd, to, room, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *want = POLLIN;
            return -EAGAIN;
        }
        if (r < 0) {
            int e = errno;
            snprintf(why, whylen, "%s", strerror(e));
            return -e;
        }
        if (r == 0) {
            if (m->rhave == 0) {
                snprintf(why, whylen, "the peer closed the connection");
                return 0;
            }
            snprintf(why, whylen,
                     "the connection ended inside a record (%zu bytes of it): cut on the way "
                     "or the peer died",
                     m->rhave);
            return -EBADMSG;
        }
        m->rhave += (size_t)r;
        if (m->rhave == HDR) {
            m->rlen = ((size_t)m->rhdr[0] << 24) | ((size_t)m->rhdr[1] << 16) |
                      ((size_t)m->rhdr[2] << 8) | m->rhdr[3];
            if (m->rlen == 0 || m->rlen > TSP__MACREC_MAX) {
                snprintf(why, whylen,
                         "a record announced %zu bytes (1 to %u allowed): bytes were altered "
                         "between agent and driver, or the peer does not speak "
                         "torchspark/3+mac",
                         m->rlen, TSP__MACREC_MAX);
                return -EBADMSG;
            }
        }
    }
}

ssize_t tsp__macrec_read(tsp__macrec_t *m, int fd, void *buf, size_t n, short *want, char *why,
                         size_t whylen)
{
    if (m->broken)
        return -EBADMSG;
    if (m->roff == m->rready) {
        ssize_t r = fill(m, fd, want, why, whylen);
        m->broken = r < 0 && r != -EAGAIN;
        if (r <= 0)
            return r;
        uint8_t tag[TSP__MACREC_TAG_LEN];
        if (gmac(m->rc, m->rseq, m->rhdr, m->rbuf, m->rlen, tag) ||
            CRYPTO_memcmp(tag, m->rbuf + m->rlen, TSP__MACREC_TAG_LEN) != 0) {
            snprintf(why, whylen,
                     "a record failed authentication: bytes were altered, dropped, reordered "
                     "or replayed between agent and driver (an on-path attacker or a faulty "
                     "network device); nothing of it was used (record %llu of torchspark/3+mac)",
                     (unsigned long long)m->rseq);
            m->broken = 1;
            return -EBADMSG;
        }
        m->rseq++;
        m->roff = 0;
        m->rready = m->rlen;
        m->rhave = 0;
    }
    size_t k = m->rready - m->roff < n ? m->rready - m->roff : n;
    memcpy(buf, m->rbuf + m->roff, k);
    m->roff += k;
    return (ssize_t)k;
}
