/* outrecv.h (internal): the driver's end of rank 0's output transfer (outrecv.c). */
#ifndef TSP_OUTRECV_H
#define TSP_OUTRECV_H

#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "logwire.h"

/* The output receiver: guarded by its own mutex. The epoll thread receives
 * the bytes in place; a hashing thread of the transfer's own follows behind it, computing
 * SHA-256 (and, to a file, writing), so that the server thread never spends its time on
 * the digest and the two run on separate cores. */
enum { TSP__OUT_NONE, TSP__OUT_WAIT, TSP__OUT_RECV, TSP__OUT_OK };
typedef struct tsp__outrecv {
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* the host waits for the transfer's end */
    pthread_cond_t work_cv; /* the hasher waits for received bytes */
    pthread_cond_t room_cv; /* the receiver waits for the hasher */
    int state;
    char *path;       /* NULL: memory */
    char *tmp;        /* file mode: the new file beside path, renamed over it once verified */
    uint64_t max_mem; /* memory mode: larger outputs are refused at OUT_BEGIN (0: none) */
    int refused;      /* one was refused for its size: the wait ends (-EFBIG) */
    int fd;
    uint8_t *mem;  /* memory mode: mmap'ed, total bytes */
    uint8_t *ring; /* file mode: received bytes not yet hashed and written */
    uint64_t total;
    uint64_t got;    /* received (the epoll thread's) */
    uint64_t hashed; /* hashed, and written in file mode (the hasher's) */
    EVP_MD_CTX *md;  /* the hasher's while it runs */
    pthread_t hasher;
    int hasher_on;      /* started: to be joined */
    int hasher_running; /* not yet past its last use of the transfer */
    int hasher_quit;
    int hasher_err; /* -errno: SHA-256 (-EIO) or the file write failed */
    int wake_fd;    /* the server thread's eventfd: told when the hasher fails */
    void *owner;    /* the connection receiving it */
    uint8_t secret[TSP_WIRE_SECRET_LEN]; /* the run's: keys the digest (protocol 1.10.1) */
    char err[512];
    char err_copy[512];
} tsp__outrecv_t;

int tsp__outrecv_init(tsp__outrecv_t *o, int wake_fd);
/* Host side: accept one transfer (path NULL: memory); wait for it (0/-ETIMEDOUT/-ENOENT, or
 * -EFBIG once one was refused for its size). */
int tsp__outrecv_expect(tsp__outrecv_t *o, const char *path);
int tsp__outrecv_wait(tsp__outrecv_t *o, int timeout_ms);
/* Host side: spark.driver.maxResultSize for memory mode (tsp_logserver_output_limit). */
int tsp__outrecv_limit(tsp__outrecv_t *o, const char *size, char *err, size_t errlen);
void tsp__outrecv_close(tsp__outrecv_t *o);
/* Thread side. Each returns 0 or -errno with a reason in err. */
int tsp__outrecv_claim(tsp__outrecv_t *o, void *owner, char *err, size_t errlen);
/* -EFBIG: total is over the memory limit, a refusal no retry can change (protocol 1.6). */
int tsp__outrecv_begin(tsp__outrecv_t *o, void *owner, uint64_t total, char *err, size_t errlen);
/* An OUT_CHUNK header of len bytes, with the first `have` payload bytes already buffered
 * at p; the rest is read by tsp__outrecv_recv straight into its destination. */
int tsp__outrecv_chunk(tsp__outrecv_t *o, void *owner, uint32_t len, const uint8_t *p, size_t have,
                       char *err, size_t errlen);
/* Reads up to n bytes (non-blocking) from the connection ctx: a count, 0 at EOF, -EAGAIN,
 * or another -errno (never -EBADMSG). The connection's transport (TLS, protocol 1.10). */
typedef ssize_t (*tsp__outrecv_read_fn)(void *ctx, void *buf, size_t n);
/* Receives up to max bytes of the current chunk through rd (non-blocking). Bytes taken, or
 * -EAGAIN (nothing to read), -ECONNRESET (EOF), another -errno (the connection), -EBADMSG
 * (the transfer failed: reason in err). */
ssize_t tsp__outrecv_recv(tsp__outrecv_t *o, void *owner, tsp__outrecv_read_fn rd, void *ctx,
                          size_t max, char *err, size_t errlen);
int tsp__outrecv_end(tsp__outrecv_t *o, void *owner, const uint8_t digest[TSP_WIRE_DIGEST_LEN],
                     char *err, size_t errlen);
/* After a wake-up: when the hasher failed (a write to the file), the transfer is given up
 * and its connection returned, with the reason in why, for the server to refuse it now
 * rather than at the agent's next chunk. NULL otherwise. */
void *tsp__outrecv_failed(tsp__outrecv_t *o, char *why, size_t whylen);
/* The connection went away (or failed): discard a partial transfer, allow a retry. */
void tsp__outrecv_abort(tsp__outrecv_t *o, void *owner, const char *why);

#endif
