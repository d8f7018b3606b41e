/* outrecv.c: the driver side of rank 0's output transfer (docs/protocol.md 1.6): one
 * transfer at a time, to a file or to memory, 64-bit lengths, SHA-256 checked. The epoll
 * thread receives the bytes in place; a hashing thread started for the transfer follows
 * it (SHA-256, and the write in file mode); the host language waits for the end. */
#include "outrecv.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

/* File mode: received bytes wait in a ring for the hasher, which hashes and writes them
 * in pieces small enough to stay in the L2 cache between the socket copy, SHA-256 and the
 * write. Memory mode: the bytes are received at their place; reception may run at most
 * WINDOW ahead of hashing, so that the end of a transfer never waits long for the digest
 * (the epoll thread waits then) and the hashed bytes are still in the L3 cache. */
#define RING_SIZE (4u << 20)
#define PIECE (512u * 1024u)
#define WINDOW (8u << 20)

int tsp__outrecv_init(tsp__outrecv_t *o, int wake_fd)
{
    memset(o, 0, sizeof(*o));
    o->wake_fd = wake_fd;
    int rc = tsp__cond_init_mono(&o->cv);
    if (rc)
        return rc;
    pthread_cond_init(&o->work_cv, NULL);
    pthread_cond_init(&o->room_cv, NULL);
    pthread_mutex_init(&o->mu, NULL);
    o->fd = -1;
    return 0;
}

/* Under mu: stops the hasher after the piece it is on and joins it. */
static void stop_hasher_locked(tsp__outrecv_t *o)
{
    if (!o->hasher_on)
        return;
    o->hasher_quit = 1;
    pthread_cond_broadcast(&o->work_cv);
    while (o->hasher_running)
        pthread_cond_wait(&o->room_cv, &o->mu);
    pthread_join(o->hasher, NULL); /* it only returns now: it needs mu no more */
    o->hasher_on = 0;
    o->hasher_quit = 0;
}

static void reset_locked(tsp__outrecv_t *o)
{
    stop_hasher_locked(o);
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
    if (o->tmp)
        unlink(o->tmp); /* never renamed: the output did not arrive whole */
    free(o->tmp);
    o->tmp = NULL;
    if (o->mem)
        munmap(o->mem, (size_t)o->total);
    o->mem = NULL;
    free(o->ring);
    o->ring = NULL;
    EVP_MD_CTX_free(o->md);
    o->md = NULL;
    o->total = o->got = o->hashed = 0;
    o->hasher_err = 0;
    o->owner = NULL;
}

void tsp__outrecv_close(tsp__outrecv_t *o)
{
    pthread_mutex_lock(&o->mu);
    reset_locked(o);
    pthread_mutex_unlock(&o->mu);
    free(o->path);
    pthread_cond_destroy(&o->cv);
    pthread_cond_destroy(&o->work_cv);
    pthread_cond_destroy(&o->room_cv);
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
        o->refused = 0;
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

/* The memory destination: its own mapping, with transparent huge pages where the system
 * allows them, since faulting in a GiB 4 KiB at a time costs as much as copying it. */
static uint8_t *alloc_output(uint64_t total)
{
    if (total > SIZE_MAX)
        return NULL;
    void *p = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, (size_t)total, MADV_HUGEPAGE);
#endif
    return p;
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

/* The hashing thread: takes what was received, a piece at a time, in order. The bytes
 * between hashed and got are the hasher's alone (the receiver writes only past got, and
 * in file mode not further than one ring ahead of hashed), so they are read unlocked. */
static void *hasher_main(void *arg)
{
    tsp__outrecv_t *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->hasher_quit && o->hashed == o->got)
            pthread_cond_wait(&o->work_cv, &o->mu);
        if (o->hasher_quit)
            break;
        uint64_t at = o->hashed;
        size_t n = o->got - at < PIECE ? (size_t)(o->got - at) : PIECE;
        const uint8_t *p;
        if (o->mem) {
            p = o->mem + at;
        } else {
            size_t pos = (size_t)(at % RING_SIZE);
            if (n > RING_SIZE - pos)
                n = RING_SIZE - pos;
            p = o->ring + pos;
        }
        pthread_mutex_unlock(&o->mu);
        int rc = EVP_DigestUpdate(o->md, p, n) ? 0 : -EIO;
        if (!rc && o->fd >= 0)
            rc = write_all(o->fd, p, n);
        pthread_mutex_lock(&o->mu);
        if (rc) {
            o->hasher_err = rc;
            uint64_t one = 1;
            ssize_t w = write(o->wake_fd, &one, sizeof(one));
            (void)w; /* the eventfd cannot be full: it only counts */
            break;
        }
        o->hashed = at + n;
        pthread_cond_broadcast(&o->room_cv);
    }
    o->hasher_running = 0;
    pthread_cond_broadcast(&o->room_cv);
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Under mu: the file mode's new file, "PATH.tsp-XXXXXX" in path's directory, created
 * with O_EXCL (mkostemp): whatever is at path (a link someone planted, the file of an
 * earlier run) is only replaced by the rename once the output is verified. A device or a
 * FIFO at path is written in place (never through a link: O_NOFOLLOW). */
static int open_beside(tsp__outrecv_t *o)
{
    struct stat st;
    if (lstat(o->path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
        /* A device or a FIFO the caller named (/dev/null, a pipe): written in place. */
        o->fd = open(o->path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
        return o->fd >= 0 ? 0 : -errno;
    }
    size_t n = strlen(o->path) + sizeof(".tsp-XXXXXX");
    o->tmp = malloc(n);
    if (!o->tmp)
        return -ENOMEM;
    snprintf(o->tmp, n, "%s.tsp-XXXXXX", o->path);
    o->fd = mkostemp(o->tmp, O_CLOEXEC);
    if (o->fd >= 0)
        return 0;
    int e = errno;
    free(o->tmp);
    o->tmp = NULL;
    return -e;
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
    if (!o->path && o->max_mem && total > o->max_mem) {
        (void)fail_locked(o, err, errlen,
                          "rank 0's output of %llu bytes is over spark.driver.maxResultSize "
                          "(%llu bytes), the most the driver keeps in memory: return less (write "
                          "large results to shared storage and return their paths), raise "
                          "spark.driver.maxResultSize (0: no limit), or, from the JVM, receive "
                          "it into a file (TorchSparkRunner.outputPath)",
                          (unsigned long long)total, (unsigned long long)o->max_mem);
        rc = -EFBIG;
        o->refused = 1;
        pthread_cond_broadcast(&o->cv);
        goto out;
    }
    if (o->path) {
        if ((rc = open_beside(o)) != 0) {
            rc = fail_locked(o, err, errlen, "cannot create the output file %s on the driver: %s",
                             o->tmp ? o->tmp : o->path, strerror(-rc));
            goto out;
        }
        if (!(o->ring = malloc(RING_SIZE))) {
            rc = fail_locked(o, err, errlen, "out of memory on the driver");
            goto out;
        }
    } else if (total > 0) {
        o->mem = alloc_output(total);
        if (!o->mem) {
            rc = fail_locked(o, err, errlen,
                             "the driver has no memory for an output of %llu bytes; "
                             "receive it to a file instead",
                             (unsigned long long)total);
            goto out;
        }
    }
    o->total = total;
    o->got = o->hashed = 0;
    o->hasher_err = 0;
    o->hasher_quit = 0;
    o->hasher_running = 1;
    if ((rc = pthread_create(&o->hasher, NULL, hasher_main, o)) != 0) {
        o->hasher_running = 0;
        rc = fail_locked(o, err, errlen, "cannot start the driver's hashing thread: %s",
                         strerror(rc));
        goto out;
    }
    o->hasher_on = 1;
    o->state = TSP__OUT_RECV;
out:
    pthread_mutex_unlock(&o->mu);
    return rc;
}

/* Under mu: the owner is receiving and the hasher has not failed. */
static int check_locked(tsp__outrecv_t *o, void *owner, uint64_t n, char *err, size_t errlen)
{
    if (o->owner != owner || o->state != TSP__OUT_RECV)
        return fail_locked(o, err, errlen, "OUT_CHUNK out of order");
    if (o->hasher_err == -EIO)
        return fail_locked(o, err, errlen, "SHA-256 failed on the driver");
    if (o->hasher_err)
        return fail_locked(o, err, errlen, "cannot write the output file %s on the driver: %s",
                           o->path, strerror(-o->hasher_err));
    if (n > o->total - o->got)
        return fail_locked(o, err, errlen, "output chunk goes past the announced %llu bytes",
                           (unsigned long long)o->total);
    return 0;
}

/* Under mu: where the next received bytes go and how many fit there (at most want),
 * waiting while the hasher is a whole window (or ring) behind. 0, or a failure. */
static int room_locked(tsp__outrecv_t *o, void *owner, size_t want, uint8_t **dst, size_t *fit,
                       char *err, size_t errlen)
{
    *fit = 0;
    *dst = NULL;
    for (;;) {
        int rc = check_locked(o, owner, want, err, errlen);
        if (rc || want == 0)
            return rc;
        uint64_t ahead = o->got - o->hashed;
        size_t n;
        if (o->mem) {
            n = ahead < WINDOW ? (size_t)(WINDOW - ahead) : 0;
            *dst = o->mem + o->got;
        } else {
            size_t pos = (size_t)(o->got % RING_SIZE);
            n = ahead < RING_SIZE ? (size_t)(RING_SIZE - ahead) : 0;
            if (n > RING_SIZE - pos)
                n = RING_SIZE - pos;
            *dst = o->ring + pos;
        }
        if (n > 0) {
            *fit = n < want ? n : want;
            return 0;
        }
        pthread_cond_wait(&o->room_cv, &o->mu);
    }
}

/* Under mu: n more bytes are at their place for the hasher. */
static void took_locked(tsp__outrecv_t *o, size_t n)
{
    o->got += n;
    pthread_cond_signal(&o->work_cv);
}

int tsp__outrecv_chunk(tsp__outrecv_t *o, void *owner, uint32_t len, const uint8_t *p, size_t have,
                       char *err, size_t errlen)
{
    pthread_mutex_lock(&o->mu);
    int rc = check_locked(o, owner, len, err, errlen);
    while (!rc && have > 0) { /* payload bytes that came with the header */
        uint8_t *dst = NULL;
        size_t fit;
        rc = room_locked(o, owner, have, &dst, &fit, err, errlen);
        if (rc)
            break;
        memcpy(dst, p, fit);
        took_locked(o, fit);
        p += fit;
        have -= fit;
    }
    pthread_mutex_unlock(&o->mu);
    return rc;
}

ssize_t tsp__outrecv_recv(tsp__outrecv_t *o, void *owner, tsp__outrecv_read_fn rd, void *ctx,
                          size_t max, char *err, size_t errlen)
{
    uint8_t *dst = NULL;
    size_t fit;
    pthread_mutex_lock(&o->mu);
    int rc = room_locked(o, owner, max, &dst, &fit, err, errlen);
    pthread_mutex_unlock(&o->mu);
    if (rc)
        return rc;
    if (fit == 0)
        return 0;
    ssize_t r = rd(ctx, dst, fit);
    if (r < 0)
        return r;
    if (r == 0)
        return -ECONNRESET;
    pthread_mutex_lock(&o->mu);
    if (o->owner == owner && o->state == TSP__OUT_RECV)
        took_locked(o, (size_t)r);
    pthread_mutex_unlock(&o->mu);
    return r;
}

/* Under mu: file mode's end, the new file closed and renamed over path (0 in memory
 * mode). 0 or -errno. */
static int finish_file(tsp__outrecv_t *o)
{
    if (o->fd < 0)
        return 0;
    int fd = o->fd;
    o->fd = -1;
    if (close(fd) != 0 || (o->tmp && rename(o->tmp, o->path) != 0))
        return -errno;
    return 0;
}

int tsp__outrecv_end(tsp__outrecv_t *o, void *owner, const uint8_t digest[TSP_WIRE_DIGEST_LEN],
                     char *err, size_t errlen)
{
    pthread_mutex_lock(&o->mu);
    int rc = 0, frc;
    uint8_t d[EVP_MAX_MD_SIZE], keyed[TSP_WIRE_DIGEST_LEN];
    unsigned dl = 0;
    if (o->owner != owner || o->state != TSP__OUT_RECV) {
        rc = fail_locked(o, err, errlen, "OUT_END out of order");
        goto out;
    }
    while (!o->hasher_err && o->hashed < o->got) /* at most a window of hashing */
        pthread_cond_wait(&o->room_cv, &o->mu);
    if ((rc = check_locked(o, owner, 0, err, errlen)) != 0)
        goto out;
    if (o->got != o->total) {
        rc = fail_locked(o, err, errlen, "output ended after %llu of %llu bytes",
                         (unsigned long long)o->got, (unsigned long long)o->total);
        goto out;
    }
    stop_hasher_locked(o); /* idle: everything is hashed; md is ours again */
    if (!EVP_DigestFinal_ex(o->md, d, &dl) || tsp_wire_output_digest(o->secret, d, keyed) ||
        CRYPTO_memcmp(keyed, digest, TSP_WIRE_DIGEST_LEN) != 0)
        rc = fail_locked(o, err, errlen,
                         "output digest mismatch: the %llu bytes received "
                         "differ from what rank 0 sent",
                         (unsigned long long)o->total);
    else if ((frc = finish_file(o)) != 0)
        rc = fail_locked(o, err, errlen, "cannot write the output file %s on the driver: %s",
                         o->path, strerror(-frc));
    if (!rc) {
        free(o->tmp);
        o->tmp = NULL;
        o->fd = -1;
        o->state = TSP__OUT_OK;
        o->owner = NULL;
        pthread_cond_broadcast(&o->cv);
    }
out:
    pthread_mutex_unlock(&o->mu);
    return rc;
}

void *tsp__outrecv_failed(tsp__outrecv_t *o, char *why, size_t whylen)
{
    pthread_mutex_lock(&o->mu);
    void *owner = NULL;
    if (o->state == TSP__OUT_RECV && o->hasher_err) {
        owner = o->owner;
        check_locked(o, owner, 0, why, whylen); /* gives the transfer up with the reason */
    }
    pthread_mutex_unlock(&o->mu);
    return owner;
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

/* Spark's byte strings (JavaUtils.byteStringAs, unit bytes when none is given): digits,
 * then optionally one of b, k, kb, m, mb, g, gb, t, tb, p, pb, any case; no fraction. */
int tsp__outrecv_limit(tsp__outrecv_t *o, const char *size, char *err, size_t errlen)
{
    static const char *const units[] = {"b", "k", "m", "g", "t", "p"};
    const char *p = size && *size ? size : "1g";
    while (*p == ' ')
        p++;
    uint64_t v = 0;
    const char *d = p;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return tsp__err(err, errlen, -EINVAL, "spark.driver.maxResultSize %s is too large",
                            size);
        v = v * 10 + (uint64_t)(*p - '0');
    }
    char unit[4] = "";
    size_t ul = 0;
    for (; *p && *p != ' ' && ul < sizeof(unit) - 1; p++)
        unit[ul++] = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    unit[ul] = 0;
    while (*p == ' ')
        p++;
    int shift = ul ? -1 : 0;
    for (int i = 0; ul && i < 6; i++)
        if (unit[0] == units[i][0] && (ul == 1 || (ul == 2 && i > 0 && unit[1] == 'b')))
            shift = 10 * i;
    if (p == d || *p || shift < 0 || (shift && v > (UINT64_MAX >> shift)))
        return tsp__err(err, errlen, -EINVAL,
                        "spark.driver.maxResultSize \"%s\" is not a size: write bytes or a "
                        "whole number with a unit b, k, m, g, t or p (1g, 512m; 0: no limit)",
                        size);
    pthread_mutex_lock(&o->mu);
    o->max_mem = v << shift;
    pthread_mutex_unlock(&o->mu);
    return 0;
}

int tsp__outrecv_wait(tsp__outrecv_t *o, int timeout_ms)
{
    struct timespec dl;
    tsp__deadline_in(&dl, timeout_ms);
    pthread_mutex_lock(&o->mu);
    int rc = 0;
    while (o->state != TSP__OUT_OK && o->state != TSP__OUT_NONE && !o->refused && rc != ETIMEDOUT)
        rc = timeout_ms < 0 ? pthread_cond_wait(&o->cv, &o->mu)
                            : pthread_cond_timedwait(&o->cv, &o->mu, &dl);
    int out = o->state == TSP__OUT_OK     ? 0
              : o->state == TSP__OUT_NONE ? -ENOENT
              : o->refused                ? -EFBIG
                                          : -ETIMEDOUT;
    pthread_mutex_unlock(&o->mu);
    return out;
}
