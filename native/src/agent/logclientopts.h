/* logclientopts.h (internal): the log client's options, counters and handle (logclient.h),
 * types only: beneath the client's files (logclientq.h, logclient.c), which share its state. */
#ifndef TSP_LOGCLIENTOPTS_H
#define TSP_LOGCLIENTOPTS_H

#include <stddef.h>
#include <stdint.h>

#include "logwire.h"

typedef struct tsp_logclient_opts {
    const char *host; /* the driver's log server */
    int port;
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    int node_rank;          /* for the driver's messages */
    const char *hostname;   /* NULL: gethostname() */
    size_t mem_bytes;       /* queue bound (default 16 MiB, at least 2 MiB) */
    int drop;               /* 1: drop lines when full instead of slowing the workers */
    int connect_timeout_ms; /* per attempt, TCP connect + handshake (default 5000) */
    int reconnect_grace_ms; /* lost connection: slow writers at most this long (10000) */
    int backoff_max_ms;     /* reconnect backoff cap (default 5000) */
    int stall_ms;           /* connected, but the driver took nothing for this long while
                               writers wait: local fallback as if it were unreachable, then
                               retry after as long again (default 60000; <= 0: never; the
                               CLI reads TORCHSPARK_LOG_STALL_TIMEOUT, seconds) */
    int event_flush_ms;     /* tsp_logclient_close() with events held for a first handshake
                               and no driver reached yet: keep trying for at most this long
                               (default 5000; <= 0: not at all), within close's own timeout
                               and after a connect attempt already under way ends */
    int report_world;       /* the job's ranks: each rank's reports above its share of the
                               job's report rate are folded (agentfold.h, docs/protocol.md
                               1.8); 0 (the default): every report as it is */
    int local_out_fd;       /* fallback destinations (default 1 and 2) */
    const char *log_prefix; /* the client's own warnings start with it (NULL: "torchspark: ";
                               the CLI says "torchspark-run: ") */
    int local_err_fd;
    /* The control channel (docs/protocol.md 1.7), asked for unless no_control is set.
     * on_stop is called once, from the sender thread, when the driver says STOP (reason
     * TSP_WIRE_STOP_*, text not NUL-terminated): it must be quick and must not call back
     * into this client (tsp_agent_stop() is the intended use). */
    int no_control;
    void (*on_stop)(void *ctx, int reason, const char *text, size_t len);
    void *on_stop_ctx;
    /* on_dump is called from the sender thread for each DUMP (protocol 1.9), with its
     * request number; the same rules as on_stop (tsp_agent_dump() is the intended use). */
    void (*on_dump)(void *ctx, unsigned request);
    void *on_dump_ctx;
    /* on_checkpoint: for each CHECKPOINT (protocol 1.13), with its why; the same rules
     * (tsp_agent_checkpoint() is the intended use). */
    void (*on_checkpoint)(void *ctx, int why);
    void *on_checkpoint_ctx;
} tsp_logclient_opts_t;

typedef struct tsp_logclient_stats {
    uint64_t lines;         /* accepted by write_line */
    uint64_t acked;         /* acknowledged by the driver */
    uint64_t local;         /* written to the local fallback instead */
    uint64_t dropped;       /* dropped (drop mode) */
    uint64_t connects;      /* successful handshakes */
    uint64_t failures;      /* failed connection attempts */
    uint64_t events;        /* accepted by tsp_logclient_event */
    uint64_t events_unsent; /* discarded: the driver refused CONTROL, or none was reached */
    int connected;
} tsp_logclient_stats_t;

/* The client (opaque: its state is logclientq.h's, private to the client's files). */
typedef struct tsp_logclient tsp_logclient_t;

#endif
