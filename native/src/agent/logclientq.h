/* logclientq.h (internal): the log client's state, shared by its two files: logclientq.c
 * (the queue of frames under the mutex, the writers' side) and logclient.c (the sender
 * thread, the local fallback and the lifecycle). See logclient.c's top comment for the
 * design. */
#ifndef TSP_LOGCLIENTQ_H
#define TSP_LOGCLIENTQ_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "agentfold.h"
#include "lines.h"
#include "logclientopts.h"
#include "logwire.h"
#include "tlsconn.h"

#define BLK_SIZE (256u * 1024u)
#define FRAME_OVERHEAD (TSP_WIRE_HDR_LEN + 8u)
#define MAX_IOV 64
#define FOLD_TICK_MS 50 /* the sender's tick while folded reports are held */

typedef struct blk {
    struct blk *next;
    uint64_t base; /* absolute offset of data[0] */
    size_t len, cap;
    uint64_t last_seq; /* seq of the last LINE in this block (or before it) */
    char data[];
} blk_t;

typedef struct drop_rec {
    int32_t rank;
    uint64_t count;
} drop_rec_t;

/* An EVENT queued before the first handshake said whether the driver takes events. It
 * gets its seq and enters the queue when a handshake grants CONTROL (docs/protocol.md
 * 1.7), and is discarded when one refuses it. */
typedef struct early_ev {
    struct early_ev *next;
    int kind;
    int32_t rank;
    size_t len;
    char json[];
} early_ev_t;

struct tsp_logclient {
    tsp_logclient_opts_t o;
    char host[256];
    char hostname[256];
    char who[64]; /* what the client's own messages start with (opts.log_prefix) */
    tsp_line_sink_t sink;
    pthread_t thread;
    pthread_mutex_t mu;
    int notify_fd;      /* wakes the sender */
    tsp__afold_t *fold; /* reports above the rank's rate folded (agentfold.h); NULL: none */
    /* guarded by mu */
    blk_t *head, *tail;
    uint64_t appended, sent; /* absolute byte offsets */
    size_t bytes;
    uint64_t seq, acked;
    int want_wake, sender_idle;
    int fold_ticking;   /* the sender waits at most FOLD_TICK_MS: it holds folded reports */
    int fold_new;       /* a report was folded since the sender's last tick */
    int64_t blocked_at; /* when want_wake was last raised */
    drop_rec_t *drops;
    size_t ndrops;
    int drops_dirty;
    int stopping;
    int close_ms; /* stopping: close's timeout_ms, for the warning */
    int64_t stop_deadline;
    int64_t event_deadline; /* stopping: when to give up reaching the driver for events */
    int control;            /* the last handshake: 1 CONTROL granted, 0 not, -1 never connected */
    early_ev_t *early, **early_tail; /* events waiting for the first handshake */
    tsp_logclient_stats_t st;
    /* sender thread only */
    int fd;          /* the socket inside tls, -1 when not connected */
    tsp__tls_t *tls; /* the connection: TLS 1.3 (docs/protocol.md 1.10) */
    int ping_left;   /* a PING that TLS took in part: it must be retried first, as is */
    int fallback, warned, ever_connected;
    int no_control; /* the driver refused the CONTROL flag: never ask again */
    int stop_seen;
    int64_t lost_at;
    int64_t progress_at; /* the driver last took bytes or acknowledged lines */
    int64_t tx_at;       /* keepalive: when a frame was last written (ms) */
    int warned_stall;
    uint64_t agent_id;
    int result;
};

/* Wakes whoever polls the eventfd fd. */
void tsp__logclient_notify(int fd);
/* Resets the eventfd fd. */
void tsp__logclient_drain_fd(int fd);
/* Under mu: room for need bytes in the tail block (a line's frames land together). */
int tsp__logclient_reserve(tsp_logclient_t *c, size_t need);
/* Under mu: appends one frame into room made by tsp__logclient_reserve. */
void tsp__logclient_append_frame(tsp_logclient_t *c, const tsp_wire_hdr_t *h, const void *extra,
                                 size_t elen, const void *data, size_t dlen);
/* The sink's write_line (lines.h): queues a line, never blocks. */
int tsp__logclient_write_line(void *ctx, const tsp_line_t *line);
/* The sender's put for folded summaries (agentfold.h): -EAGAIN on a full queue, quietly. */
int tsp__logclient_put_sender(void *ctx, const tsp_line_t *line);
/* Under mu: frees what is sent and acknowledged; wakes the agent when room appeared. */
void tsp__logclient_release_locked(tsp_logclient_t *c);
/* Under mu: queues an EVENT frame behind what is queued. */
int tsp__logclient_append_event_locked(tsp_logclient_t *c, int kind, int32_t rank, const char *json,
                                       size_t len);
/* Under mu: holds an event that came before the first handshake. */
int tsp__logclient_hold_early_locked(tsp_logclient_t *c, int kind, int32_t rank, const char *json,
                                     size_t len);
/* Under mu, after a handshake: the held events queued (CONTROL granted) or discarded. */
void tsp__logclient_flush_early_locked(tsp_logclient_t *c);
/* Under mu: frees the held events. */
void tsp__logclient_free_early_locked(tsp_logclient_t *c);

#endif
