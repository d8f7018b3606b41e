/* logserver_int.h: the log server's parts shared between logserver.c (the epoll thread
 * and the API), logconn.c (a connection's protocol), logctl.c (the control channel),
 * logqueue.c (the bounded pull queue, the per-rank tails and drop counts), logtail.c and
 * outrecv.c (receiving rank 0's output). Not installed. */
#ifndef TSP_LOGSERVER_INT_H
#define TSP_LOGSERVER_INT_H

#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "lines.h"
#include "logwire.h"
#include "torchspark/logserver.h"
#include "util.h"

struct tsp__qblk;

/* The last lines of one rank (logtail.c): lines back to back in a circular byte buffer
 * of cap bytes (grown up to the byte bound), entries off/len for at most max_lines lines. */
typedef struct tsp__tail {
    char *ring;
    size_t cap, end, bytes; /* end: where the next line goes; bytes: live bytes */
    uint32_t *off, *len;    /* max_lines entries (NULL until the first line) */
    unsigned head, count;   /* head: the oldest entry */
} tsp__tail_t;

void tsp__tail_add(tsp__tail_t *t, unsigned max_lines, size_t max_bytes, const void *data,
                   size_t len);
/* The last n lines, oldest first, each followed by '\n', into buf (truncated to buflen);
 * returns the bytes the whole answer needs. */
size_t tsp__tail_copy(const tsp__tail_t *t, unsigned max_lines, int n, char *buf, size_t buflen);
void tsp__tail_free(tsp__tail_t *t);

/* What the server keeps per rank: the tail and the drop count. */
typedef struct tsp__rank {
    tsp__tail_t tail;
    uint64_t dropped;
    uint8_t seen;
} tsp__rank_t;

/* The queue, tails and counters: guarded by mu; cv wakes a waiting puller. */
typedef struct tsp__logq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct tsp__qblk *head, *tail;
    size_t bytes, bound;
    int waiters;
    int ended;   /* the server thread has finished */
    int paused;  /* the thread stopped reading for room: pull signals wake_fd */
    int wake_fd; /* the server thread's eventfd */
    char *batch; /* the last pull's data */
    size_t batch_cap;
    tsp__rank_t *ranks;
    size_t nranks;
    unsigned tail_lines;
    size_t tail_max_bytes;
    tsp_logserver_stats_t st;
} tsp__logq_t;

int tsp__logq_init(tsp__logq_t *q, size_t bound, unsigned tail_lines, size_t tail_bytes,
                   int wake_fd);
void tsp__logq_close(tsp__logq_t *q);
/* Under q->mu: 1 when the queue has no room for more lines. */
int tsp__logq_full_locked(const tsp__logq_t *q);
/* Under q->mu: appends one line (queue and/or tail); to_queue 0 keeps only the tail. */
int tsp__logq_push_locked(tsp__logq_t *q, int32_t rank, unsigned stream, unsigned flags,
                          const void *data, size_t len, int to_queue);
void tsp__logq_set_dropped_locked(tsp__logq_t *q, int32_t rank, uint64_t count);
int tsp__logq_pull(tsp__logq_t *q, tsp_logline_t *out, int max_lines, int timeout_ms);
long tsp__logq_pull_text(tsp__logq_t *q, char *buf, size_t cap, int max_lines, int timeout_ms,
                         const char *prefix, const char *marker, int *nlines);
long tsp__logq_tail(tsp__logq_t *q, int rank, int n, char *buf, size_t buflen);
int tsp__logq_dropped(tsp__logq_t *q, int32_t *ranks, uint64_t *counts, int max);
void tsp__logq_end(tsp__logq_t *q);

/* The output receiver (outrecv.c): guarded by its own mutex. The epoll thread receives
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
    char *path; /* NULL: memory */
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
    char err[512];
    char err_copy[512];
} tsp__outrecv_t;

int tsp__outrecv_init(tsp__outrecv_t *o, int wake_fd);
/* Host side: accept one transfer (path NULL: memory); wait for it (0/-ETIMEDOUT/-ENOENT). */
int tsp__outrecv_expect(tsp__outrecv_t *o, const char *path);
int tsp__outrecv_wait(tsp__outrecv_t *o, int timeout_ms);
void tsp__outrecv_close(tsp__outrecv_t *o);
/* Thread side. Each returns 0 or -errno with a reason in err. */
int tsp__outrecv_claim(tsp__outrecv_t *o, void *owner, char *err, size_t errlen);
int tsp__outrecv_begin(tsp__outrecv_t *o, void *owner, uint64_t total, char *err, size_t errlen);
/* An OUT_CHUNK header of len bytes, with the first `have` payload bytes already buffered
 * at p; the rest is read by tsp__outrecv_recv straight into its destination. */
int tsp__outrecv_chunk(tsp__outrecv_t *o, void *owner, uint32_t len, const uint8_t *p, size_t have,
                       char *err, size_t errlen);
/* Receives up to max bytes of the current chunk from fd (non-blocking). Bytes taken, or
 * -EAGAIN (nothing to read), -ECONNRESET (EOF), another -errno (socket), -EBADMSG (the
 * transfer failed: reason in err). */
ssize_t tsp__outrecv_recv(tsp__outrecv_t *o, void *owner, int fd, size_t max, char *err,
                          size_t errlen);
int tsp__outrecv_end(tsp__outrecv_t *o, void *owner, const uint8_t digest[32], char *err,
                     size_t errlen);
/* After a wake-up: when the hasher failed (a write to the file), the transfer is given up
 * and its connection returned, with the reason in why, for the server to refuse it now
 * rather than at the agent's next chunk. NULL otherwise. */
void *tsp__outrecv_failed(tsp__outrecv_t *o, char *why, size_t whylen);
/* The connection went away (or failed): discard a partial transfer, allow a retry. */
void tsp__outrecv_abort(tsp__outrecv_t *o, void *owner, const char *why);

/* The server, its connections and its records (logserver.c, logconn.c, logctl.c). */
#define STOP_TEXT_MAX 400

enum { C_HELLO, C_AUTH, C_OPEN, C_LINGER };

typedef struct agent_rec {
    uint64_t id;
    uint64_t seq; /* highest seq delivered */
} agent_rec_t;

typedef struct conn {
    struct conn *next, *prev;
    int fd;
    int state;
    int paused;     /* EPOLLIN off: the queue is full */
    int want_out;   /* EPOLLOUT on: wbuf has bytes */
    int registered; /* in the epoll set */
    uint8_t *buf;
    size_t cap, len;
    uint32_t chunk_left; /* OUT_CHUNK payload bytes still to read straight from the socket */
    uint8_t wbuf[2048];
    size_t wlen;
    uint8_t hello[TSP_WIRE_HELLO_MAX];
    size_t hello_len;
    uint8_t nonce_s[TSP_WIRE_NONCE_LEN];
    tsp_wire_hello_t h;
    size_t agent; /* index into agents */
    uint64_t acked;
    int64_t deadline; /* handshake or linger deadline (ms, monotonic) */
    int control;      /* CONTROL granted (protocol 1.7) */
    int stop_sent;
    char peer[80];
} conn_t;

/* A LOGS connection that ended without CLOSE: lost unless its agent is back in time. */
typedef struct lost_rec {
    uint64_t agent_id;
    int node_rank;
    int64_t deadline;
    char host[256];
    char peer[80];
    char why[120];
} lost_rec_t;

struct tsp_logserver {
    tsp_logserver_opts_t o;
    char host[256];
    char prefix[128];
    char marker[64];
    int port;
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    uint8_t run_id[TSP_WIRE_RUNID_LEN];
    int lfd, efd, wake_fd;
    pthread_t thread;
    int started, joined;
    conn_t *conns;
    conn_t *resume_at; /* the paused connection that tsp__resume_all serves first */
    agent_rec_t *agents;
    size_t nagents, agents_cap;
    char *sink; /* formatted lines waiting for sink_fd */
    size_t sink_len, sink_cap;
    pthread_mutex_t ctl_mu; /* guards drain_deadline / draining and the control fields */
    int draining;
    int64_t drain_deadline;
    pthread_cond_t fail_cv; /* signalled when root is set or the thread ended */
    char *root;             /* JSON of the run's root cause (protocol 1.7), malloc'ed */
    int ended;
    int lost_pending; /* copy of nlost for the host */
    int stop_req;     /* the host asked for STOP to everyone */
    char stop_req_text[STOP_TEXT_MAX];
    /* control, thread only */
    int t_draining;
    int t_stopped;
    int stop_reason;
    uint64_t stop_except; /* agent_id not to STOP (the one that failed) */
    char stop_text[STOP_TEXT_MAX];
    lost_rec_t *lost;
    size_t nlost, lost_cap;
    tsp__logq_t q;
    tsp__outrecv_t out;
};

/* logserver.c: a server event (a full sentence) to event_fd and/or the pull queue. */
__attribute__((format(printf, 2, 3))) void tsp__event(tsp_logserver_t *s, const char *fmt, ...);

/* logconn.c, on the epoll thread. */
/* Queues a frame to the peer and sends what it can. 0, or -errno (-ENOBUFS: no room). */
int tsp__conn_send(tsp_logserver_t *s, conn_t *c, unsigned type, const void *p, size_t n);
/* Closes the connection and frees it (it leaves the list). */
void tsp__conn_free(tsp_logserver_t *s, conn_t *c);
/* Drops the connection with a reason: logged, told to the peer, counted. */
void tsp__conn_reject(tsp_logserver_t *s, conn_t *c, const char *why);
/* Reads what the socket has and handles it. 0 while the connection lives. */
int tsp__conn_read(tsp_logserver_t *s, conn_t *c);
/* Writable again: sends what the buffer holds and re-arms. */
void tsp__conn_flush(tsp_logserver_t *s, conn_t *c);
/* The drain: final ACK and CLOSE, then linger until EOF. */
void tsp__conn_goodbye(tsp_logserver_t *s, conn_t *c);
/* The pull queue made room: read paused connections again, round robin. */
void tsp__resume_all(tsp_logserver_t *s);
/* The output's hashing thread failed: refuse its connection now. */
void tsp__output_failed(tsp_logserver_t *s);
/* Writes the formatted lines of sink mode to sink_fd. */
void tsp__sink_flush(tsp_logserver_t *s);

/* logctl.c, on the epoll thread (protocol 1.7). */
/* Sends STOP (the run's reason and text) to one control connection. */
void tsp__conn_stop(tsp_logserver_t *s, conn_t *c);
/* The first stop of the run: STOP to every control agent but `except`, now and later. */
void tsp__stop_everyone(tsp_logserver_t *s, int reason, uint64_t except, const char *text);
/* An EVENT frame (a failure report): the root cause, then STOP to the others. */
int tsp__on_event(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p);
/* A LOGS connection ended without CLOSE: lost unless its agent is back within the grace. */
void tsp__lost_add(tsp_logserver_t *s, const conn_t *c, const char *why);
/* The agent authenticated again: no longer pending as lost. */
void tsp__lost_forget(tsp_logserver_t *s, uint64_t agent_id);
/* Declares agents lost whose grace is over; returns the next deadline (-1: none). */
int64_t tsp__lost_sweep(tsp_logserver_t *s, int64_t now);

#endif
