/* outrecv.c: the driver side of rank 0's output transfer (docs/protocol.md 1.6): one
 * transfer at a time, to a file or to memory, 64-bit lengths, SHA-256 checked. The epoll
 * thread feeds it; the host language waits for it. */
#include "logserver_int.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int tsp__outrecv_init(tsp__outrecv_t *o)
{
    memset(o, 0, sizeof(*o));
    int rc = tsp__cond_init_mono(&o->cv);
    if (rc)
        return rc;
    pthread_mutex_init(&o->mu, NULL);
    o->fd = -1;
    return 0;
}

static void reset_locked(tsp__outrecv_t *o)
{
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
    free(o->mem);
    o->mem = NULL;
    EVP_MD_CTX_free(o->md);
    o->md = NULL;
    o->total = o->got = 0;
    o->owner = NULL;
}

void tsp__outrecv_close(tsp__outrecv_t *o)
{
    reset_locked(o);
    free(o->path);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
}

__attribute__((format(printf, 4, 5))) static int fail_locked(tsp__outrecv_t *o, char *err,
                                                             size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->err, sizeof(o->err), fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s", o->err);
    if (o->state == TSP__OUT_RECV) {
        reset_locked(o);
        o->state = TSP__OUT_WAIT;
    }
    return -EBADMSG;
}

int tsp__outrecv_expect(tsp__outrecv_t *o, const char *path)
{
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    if (o->state == TSP__OUT_RECV || o->state == TSP__OUT_OK) {
        rc = -EBUSY;
    } else {
        free(o->path);
        o->path = path ? strdup(path) : NULL;
        o->err[0] = 0;
        o->state = (path && !o->path) ? TSP__OUT_NONE : TSP__OUT_WAIT;
        rc = o->state == TSP__OUT_WAIT ? 0 : -ENOMEM;
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

int tsp__outrecv_claim(tsp__outrecv_t *o, void *owner, char *err, size_t errlen)
{
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    const char *why = NULL;
    if (o->state == TSP__OUT_NONE)
        why = "this driver does not expect an output", rc = -EPERM;
    else if (o->state == TSP__OUT_OK)
        why = "the output was already received", rc = -EALREADY;
    else if (o->state == TSP__OUT_RECV || o->owner)
        why = "another output transfer is under way", rc = -EBUSY;
    else
        o->owner = owner;
    if (why)
        snprintf(err, errlen, "%s", why);
    pthread_mutex_unlock(&o->mu);
    return rc;
}

int tsp__outrecv_begin(tsp__outrecv_t *o, void *owner, uint64_t total, char *err, size_t errlen)
{
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    if (o->owner != owner || o->state != TSP__OUT_WAIT) {
        rc = fail_locked(o, err, errlen, "OUT_BEGIN out of order");
        goto out;
    }
    o->md = EVP_MD_CTX_new();
    if (!o->md || !EVP_DigestInit_ex(o->md, EVP_sha256(), NULL)) {
        rc = fail_locked(o, err, errlen, "cannot start SHA-256 on the driver");
        goto out;
    }
    if (o->path) {
        o->fd = open(o->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (o->fd < 0) {
            rc = fail_locked(o, err, errlen, "cannot create the output file %s on the driver: %s",
                             o->path, strerror(errno));
            goto out;
        }
    } else if (total > 0) {
        o->mem = (total <= SIZE_MAX) ? malloc((size_t)total) : NULL;
        if (!o->mem) {
            rc = fail_locked(o, err, errlen,
                             "the driver has no memory for an output of %llu bytes; "
                             "receive it to a file instead",
                             (unsigned long long)total);
            goto out;
        }
    }
    o->total = total;
    o->got = 0;
    o->state = TSP__OUT_RECV;
out:
    pthread_mutex_unlock(&o->mu);
    return rc;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tsp__outrecv_chunk(tsp__outrecv_t *o, void *owner, const uint8_t *p, size_t n, char *err,
                       size_t errlen)
{
    /* The mutex is held only for the state check: hashing and writing a chunk happen
     * outside it, since only the owning connection's thread touches the data. */
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    if (o->owner != owner || o->state != TSP__OUT_RECV)
        rc = fail_locked(o, err, errlen, "OUT_CHUNK out of order");
    else if (n > o->total - o->got)
        rc = fail_locked(o, err, errlen, "output chunk goes past the announced %llu bytes",
                         (unsigned long long)o->total);
    pthread_mutex_unlock(&o->mu);
    if (rc)
        return rc;
    if (!EVP_DigestUpdate(o->md, p, n)) {
        pthread_mutex_lock(&o->mu);
        rc = fail_locked(o, err, errlen, "SHA-256 failed on the driver");
        pthread_mutex_unlock(&o->mu);
        return rc;
    }
    if (o->fd >= 0) {
        int w = write_all(o->fd, p, n);
        if (w) {
            pthread_mutex_lock(&o->mu);
            rc = fail_locked(o, err, errlen, "cannot write the output file %s on the driver: %s",
                             o->path, strerror(-w));
            pthread_mutex_unlock(&o->mu);
            return rc;
        }
    } else {
        memcpy(o->mem + o->got, p, n);
    }
    o->got += n;
    return 0;
}

int tsp__outrecv_end(tsp__outrecv_t *o, void *owner, const uint8_t digest[32], char *err,
                     size_t errlen)
{
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    uint8_t d[EVP_MAX_MD_SIZE];
    unsigned dl = 0;
    if (o->owner != owner || o->state != TSP__OUT_RECV)
        rc = fail_locked(o, err, errlen, "OUT_END out of order");
    else if (o->got != o->total)
        rc = fail_locked(o, err, errlen, "output ended after %llu of %llu bytes",
                         (unsigned long long)o->got, (unsigned long long)o->total);
    else if (!EVP_DigestFinal_ex(o->md, d, &dl) || CRYPTO_memcmp(d, digest, 32) != 0)
        rc = fail_locked(o, err, errlen, "output digest mismatch: the %llu bytes received "
                         "differ from what rank 0 sent", (unsigned long long)o->total);
    else if (o->fd >= 0 && close(o->fd) != 0)
        rc = fail_locked(o, err, errlen, "cannot close the output file %s on the driver",
                         o->path);
    if (!rc) {
        o->fd = -1;
        o->state = TSP__OUT_OK;
        o->owner = NULL;
        pthread_cond_broadcast(&o->cv);
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

void tsp__outrecv_abort(tsp__outrecv_t *o, void *owner, const char *why)
{
    pthread_mutex_lock(&o->mu);
    if (o->owner == owner && o->state != TSP__OUT_OK) {
        if (o->state == TSP__OUT_RECV && why)
            snprintf(o->err, sizeof(o->err), "output transfer interrupted: %s", why);
        reset_locked(o);
        if (o->state == TSP__OUT_RECV)
            o->state = TSP__OUT_WAIT;
    }
    pthread_mutex_unlock(&o->mu);
}

int tsp__outrecv_wait(tsp__outrecv_t *o, int timeout_ms)
{
    struct timespec dl;
    tsp__deadline_in(&dl, timeout_ms);
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    while (o->state != TSP__OUT_OK && o->state != TSP__OUT_NONE && rc != ETIMEDOUT)
        rc = timeout_ms < 0 ? pthread_cond_wait(&o->cv, &o->mu)
                            : pthread_cond_timedwait(&o->cv, &o->mu, &dl);
    int out = o->state == TSP__OUT_OK ? 0 : o->state == TSP__OUT_NONE ? -ENOENT : -ETIMEDOUT;
    pthread_mutex_unlock(&o->mu);
    return out;
}
