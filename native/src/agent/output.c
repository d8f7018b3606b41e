/* output.c: rank 0's output file to the driver, in chunks with length and SHA-256
 * (docs/protocol.md 1.6), on its own authenticated TLS connection with role OUTPUT (1.10).
 * The bytes go out (SSL_sendfile with kTLS, else read and SSL_write) while a second thread
 * computes the digest. */
#include "torchspark/output.h"
#include "logwire.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "logdial.h"
#include "util.h"

/* What an agent can say when the driver hung up during a transfer (it cannot know why). */
static const char DRIVER_HUNG_UP[] =
    "the driver closed the connection (it stopped, or refused what arrived: a TLS record that "
    "failed authentication is dropped with its connection; the driver's log says which)";

void tsp_output_opts_init(tsp_output_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->node_rank = 0;
    o->timeout_ms = 30000;
    o->attempts = 3;
}

static int send_frame(tsp__tls_t *t, unsigned type, const void *p, size_t n, int timeout_ms)
{
    uint8_t b[TSP_WIRE_HDR_LEN + TSP_WIRE_DIGEST_LEN];
    tsp_wire_hdr_t h = {.type = (uint8_t)type, .rank = -1, .length = (uint32_t)n};
    tsp_wire_hdr_pack(b, &h);
    memcpy(b + TSP_WIRE_HDR_LEN, p, n); /* one TLS record for the whole frame */
    return tsp__tls_write_all(t, b, TSP_WIRE_HDR_LEN + n, tsp__now_ms() + timeout_ms);
}

static ssize_t pread_some(int fd, void *p, size_t n, uint64_t off)
{
    ssize_t r;
    do
        r = pread(fd, p, n, (off_t)off);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

/* Sends one OUT_CHUNK of n bytes of the file from off, through TLS (docs/protocol.md
 * 1.10). Where the kernel encrypts (kTLS), SSL_sendfile keeps the copy out of this
 * process; otherwise the frame is read into copy (TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_CHUNK
 * bytes) and written, header and data in the same records. */
static int send_chunk(tsp__tls_t *t, int file, uint64_t off, size_t n, uint8_t *copy,
                      int64_t deadline)
{
    tsp_wire_hdr_t h = {.type = TSP_WIRE_OUT_CHUNK, .rank = -1, .length = (uint32_t)n};
    tsp_wire_hdr_pack(copy, &h);
    size_t done = 0;
    if (tsp__tls_ktls_send(t)) {
        int rc = tsp__tls_write_all(t, copy, TSP_WIRE_HDR_LEN, deadline);
        while (!rc && done < n) {
            ssize_t w = tsp__tls_sendfile(t, file, (off_t)(off + done), n - done);
            if (w > 0)
                done += (size_t)w;
            else if (w == 0)
                rc = -EIO; /* the file shrank: the caller reports it */
            else if (w != -EAGAIN)
                rc = (int)w;
            else
                rc = tsp__wait_fd(tsp__tls_fd(t), POLLOUT, deadline);
        }
        return rc;
    }
    while (done < n) {
        ssize_t r = pread_some(file, copy + TSP_WIRE_HDR_LEN + done, n - done, off + done);
        if (r <= 0)
            return r == 0 ? -EIO : (int)r;
        done += (size_t)r;
    }
    return tsp__tls_write_all(t, copy, TSP_WIRE_HDR_LEN + n, deadline);
}

/* The digest of the file, computed by a thread of its own while the caller's thread sends
 * the same bytes: the two read the page cache independently, so the
 * transfer is bounded by the slower of SHA-256 and the network, not by their sum. A file
 * that changes meanwhile ends in a digest the driver does not match: refused, retried. */
typedef struct hashjob {
    int file;
    uint64_t total;
    uint8_t *buf; /* PIECE bytes */
    atomic_int stop;
    int rc; /* 0, -EIO (shorter than announced or SHA-256 failed), -errno */
    uint8_t digest[TSP_WIRE_DIGEST_LEN];
} hashjob_t;

/* Pieces small enough to stay in the L2 cache between pread() and SHA-256. */
#define PIECE (256u * 1024u)

static void *hash_main(void *arg)
{
    hashjob_t *j = arg;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) ? 0 : -EIO;
    for (uint64_t at = 0; !rc && at < j->total && !atomic_load(&j->stop);) {
        size_t want = j->total - at < PIECE ? (size_t)(j->total - at) : PIECE;
        ssize_t r = pread_some(j->file, j->buf, want, at);
        if (r <= 0)
            rc = r == 0 ? -EIO : (int)r;
        else if (!EVP_DigestUpdate(md, j->buf, (size_t)r))
            rc = -EIO;
        else
            at += (uint64_t)r;
    }
    unsigned dl = 0;
    if (!rc && !atomic_load(&j->stop) && !EVP_DigestFinal_ex(md, j->digest, &dl))
        rc = -EIO;
    EVP_MD_CTX_free(md);
    j->rc = rc;
    return NULL;
}

/* One attempt over a connected socket: BEGIN, chunks, END, then OUT_DONE or ERROR. */
static int ship(tsp__tls_t *sock, const uint8_t *secret, int file, uint64_t total, uint8_t *buf,
                int timeout_ms, uint8_t *digest_out, char *err, size_t errlen)
{
    uint8_t keyed[TSP_WIRE_DIGEST_LEN];
    uint8_t v[8];
    tsp_wire_put_u64(v, total);
    hashjob_t j = {.file = file, .total = total, .buf = buf};
    atomic_init(&j.stop, 0);
    pthread_t th;
    int rc = pthread_create(&th, NULL, hash_main, &j);
    if (rc) {
        return tsp__err(err, errlen, -rc, "cannot start the hashing thread: %s", strerror(rc));
    }
    rc = send_frame(sock, TSP_WIRE_OUT_BEGIN, v, 8, timeout_ms);
    uint64_t sent = 0;
    uint8_t *copy = malloc(TSP_WIRE_HDR_LEN + TSP_WIRE_MAX_CHUNK); /* one frame */
    int early = 0; /* the driver answered before END: it refused the transfer */
    if (!rc && !copy)
        rc = -ENOMEM;
    while (!rc && sent < total) {
        struct pollfd pf = {.fd = tsp__tls_fd(sock), .events = POLLIN};
        if (tsp__tls_pending(sock) || poll(&pf, 1, 0) > 0) {
            early = 1;
            break;
        }
        size_t n = total - sent < TSP_WIRE_MAX_CHUNK ? (size_t)(total - sent) : TSP_WIRE_MAX_CHUNK;
        rc = send_chunk(sock, file, sent, n, copy, tsp__now_ms() + timeout_ms);
        sent += n;
    }
    atomic_store(&j.stop, rc != 0 || early);
    pthread_join(th, NULL);
    free(copy);
    if (!rc && !early && j.rc)
        rc = j.rc;
    if (rc == -EIO)
        snprintf(err, errlen,
                 "the output file changed while it was sent (shorter than "
                 "announced)");
    if (!rc && !early && tsp_wire_output_digest(secret, j.digest, keyed))
        rc = tsp__err(err, errlen, -EIO, "cannot key the output's digest (OpenSSL)");
    if (!rc && !early)
        rc = send_frame(sock, TSP_WIRE_OUT_END, keyed, TSP_WIRE_DIGEST_LEN, timeout_ms);
    if (rc == -EPIPE || rc == -ECONNRESET)
        return *err ? rc : tsp__err(err, errlen, rc, "sending the output: %s", DRIVER_HUNG_UP);
    if (rc)
        return *err ? rc : tsp__err(err, errlen, rc, "sending the output: %s", tsp_strerror(rc));
    tsp_wire_hdr_t h = {0};
    rc = tsp__tls_read_frame(sock, &h, buf, TSP_WIRE_MAX_TEXT, tsp__now_ms() + timeout_ms, err,
                             errlen);
    if (rc == -ECONNRESET) /* no answer at all: the driver dropped the connection */
        return tsp__err(err, errlen, rc, "no confirmation of the output: %s", DRIVER_HUNG_UP);
    if (rc)
        return rc;
    if (h.type == TSP_WIRE_ERROR) { /* OVER_LIMIT: for good, no retry (protocol 1.6) */
        return tsp__err(err, errlen, (h.flags & TSP_WIRE_ERROR_OVER_LIMIT) ? -EFBIG : -EBADMSG,
                        "the driver refused the output: %.*s", (int)h.length, (char *)buf);
    }
    if (early || h.type != TSP_WIRE_OUT_DONE ||
        CRYPTO_memcmp(buf, keyed, TSP_WIRE_DIGEST_LEN) != 0) {
        return tsp__err(err, errlen, -EBADMSG, "the driver did not confirm the output's digest");
    }
    if (digest_out)
        memcpy(digest_out, j.digest, TSP_WIRE_DIGEST_LEN);
    return 0;
}

int tsp_output_send(const tsp_output_opts_t *o, const char *path, char *err, size_t errlen)
{
    char host[256];
    if (o->hostname)
        snprintf(host, sizeof(host), "%s", o->hostname);
    else if (gethostname(host, sizeof(host) - 1))
        snprintf(host, sizeof(host), "?");
    int timeout = o->timeout_ms > 0 ? o->timeout_ms : 30000;
    int attempts = o->attempts > 0 ? o->attempts : 3;
    uint8_t *buf = malloc(TSP_WIRE_MAX_CHUNK);
    if (!buf)
        return tsp__err(err, errlen, -ENOMEM, "out of memory");
    uint64_t agent_id = 0;
    tsp__random_bytes(&agent_id, sizeof(agent_id));
    int rc = -EIO;
    for (int a = 0; a < attempts; a++) {
        if (a)
            usleep((useconds_t)(200000u << a));
        int file = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (file < 0 || fstat(file, &st) != 0) {
            rc = -errno;
            snprintf(err, errlen, "cannot read the output file %s: %s", path, strerror(errno));
            if (file >= 0)
                close(file);
            break;
        }
        char derr[600] = "";
        tsp__tls_t *sock = NULL;
        rc = tsp__logdial(o->host, o->port, o->secret, TSP_WIRE_ROLE_OUTPUT, 0, agent_id,
                          o->node_rank, host, timeout, &sock, NULL, derr, sizeof(derr));
        if (rc) {
            snprintf(err, errlen, "cannot ship the output to the driver at %s:%d: %s", o->host,
                     o->port, derr);
        } else {
            err[0] = 0;
            rc = ship(sock, o->secret, file, (uint64_t)st.st_size, buf, timeout, o->digest_out, err,
                      errlen);
            tsp__tls_close(sock);
        }
        close(file);
        if (rc == 0 || rc == -EACCES || rc == -EFBIG)
            break;
    }
    free(buf);
    return rc;
}
