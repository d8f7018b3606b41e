/* logstate.h (internal): the state of the driver's log server and of each agent
 * connection, shared by the files of its epoll thread: logsend.c (sending, events),
 * logctl.c (the control channel), logconn.c (a connection's protocol) and logserver.c
 * (the thread and the API). Types only. */
#ifndef TSP_LOGSTATE_H
#define TSP_LOGSTATE_H

#include <pthread.h>
#include <stdint.h>

#include "logqueue.h"
#include "logwire.h"
#include "outrecv.h"
#include "tlsconn.h"
#include "torchspark/logserver.h"

#define STOP_TEXT_MAX 400

/* Limits before authentication (docs/protocol.md 1.3): anyone who reaches the port can
 * open connections, so those that have not authenticated yet are capped, in total and per
 * peer address; a new one over a cap evicts the oldest (an idle flood cannot keep a real
 * agent out, and a real agent's handshake takes one round trip). Out of descriptors, the
 * listener rests for ACCEPT_PAUSE_MS instead of spinning. Events about connections that
 * never authenticated are printed at most once per PREAUTH_EVENT_MS, with a count. */
#define UNAUTH_MAX 256
#define UNAUTH_PER_ADDR 64
#define ACCEPT_BATCH 16
#define ACCEPT_PAUSE_MS 100
/* A storm of real agents (thousands of nodes starting at once, bench/scale_bench.py) is not
 * a flood: over a cap, a connection younger than UNAUTH_GRACE_MS is still in its handshake
 * and is not given up; at UNAUTH_MAX the listener rests ACCEPT_WAIT_MS instead (the kernel's
 * backlog holds the rest) until the oldest is past its grace. */
#define UNAUTH_GRACE_MS 2000
#define ACCEPT_WAIT_MS 20
#define PREAUTH_EVENT_MS 1000

/* C_TLS: the TLS handshake (docs/protocol.md 1.10), before any frame. */
enum { C_TLS, C_HELLO, C_AUTH, C_OPEN, C_LINGER };

typedef struct agent_rec {
    uint64_t id;
    uint64_t seq; /* highest seq delivered */
} agent_rec_t;

typedef struct conn {
    struct conn *next, *prev;
    int fd;
    tsp__tls_t *tls; /* every byte of the connection goes through it (protocol 1.10) */
    int tls_out;     /* EPOLLOUT on: the TLS handshake waits to write */
    int tls_started; /* the first bytes were looked at (refuse_plaintext) */
    uint8_t pre[TSP_WIRE_HDR_LEN + 6]; /* a plaintext HELLO's header, magic and version */
    size_t prelen;
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
    int keepalive;    /* KEEPALIVE: the agent PINGs when idle (protocol 1.7) */
    int64_t rx_at;    /* keepalive: when a frame last arrived, or reading last resumed (ms) */
    int stop_sent;
    char peer[80];
    char addr[48]; /* the peer's address alone: the per-address cap */
} conn_t;

/* A LOGS connection that ended without CLOSE: lost unless its agent is back in time. */
typedef struct lost_rec {
    uint64_t agent_id;
    int node_rank;
    int64_t deadline;
    char host[256];
    char peer[80];
    char why[120];
    const char *reason; /* the lost document's reason (docs/protocol.md 8): "eof", "silent" */
    int gone;           /* it ended before the run was stopped: in the nodes lost (1.7) */
} lost_rec_t;

/* What the NODE and NCCL_CHECK events of one node said (lognodes.c). */
typedef struct node_rec {
    int seen;       /* its NODE event arrived */
    int compared;   /* its NCCL environment was compared with node 0's */
    int check;      /* NCCL check: 0 never started, 1 started, 2 ended */
    char state[16]; /* how it ended: passed, failed, timeout, stopped */
    char *env;      /* "NAME=value\n..." (malloc'ed) */
    char host[256];
} node_rec_t;

struct tsp_logserver {
    tsp_logserver_opts_t o;
    char host[256];
    char prefix[128];
    char marker[64];
    int port;
    uint8_t secret[TSP_WIRE_SECRET_LEN];
    uint8_t run_id[TSP_WIRE_RUNID_LEN];
    int lfd, efd, wake_fd;
    tsp__tlsctx_t *tls; /* the run's TLS 1.3 key (protocol 1.10) */
    pthread_t thread;
    int started, joined;
    conn_t *conns;
    size_t nunauth;              /* connections in C_HELLO or C_AUTH */
    int64_t accept_paused_until; /* out of descriptors: the listener is out of epoll (0: in) */
    int64_t preauth_event_at;    /* when an event about an unauthenticated peer was printed */
    uint64_t preauth_skipped;    /* such events not printed since */
    conn_t *resume_at;           /* the paused connection that tsp__resume_all serves first */
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
    /* the hang doctor's DUMP (protocol 1.9): the number asked for (0: none), the last given */
    uint32_t dump_req, dump_seq;
    /* the hang watchdog (logwatch.c, protocol 1.12): asked for under ctl_mu, then the
     * thread's own; its events for the glue under ctl_mu (hang_next: the next to hand on) */
    struct tsp__watch *watch_req, *watch;
    char **hang_ev;
    size_t hang_n, hang_next, hang_cap;
    int checkpoint_req; /* tsp_logserver_checkpoint_all(): CHECKPOINT to send (1.13) */
    /* control, thread only */
    int t_draining;
    int t_stopped;
    int stop_reason;
    uint64_t stop_except; /* agent_id not to STOP (the one that failed) */
    char stop_text[STOP_TEXT_MAX];
    lost_rec_t *lost;
    size_t nlost, lost_cap;
    /* The nodes lost (protocol 1.7, "Nodes lost"): node ranks, in order, each once; under
     * ctl_mu (tsp_logserver_nodes_lost reads them) */
    int *gone;
    size_t ngone, gone_cap;
    node_rec_t *nodes; /* by node rank */
    size_t nodes_cap;
    int job_nnodes; /* from NODE events; 0 when none came */
    tsp__logq_t q;
    tsp__logq_t rq;         /* torchspark.report() records (protocol 1.8): never to the sink */
    struct tsp__ragg *ragg; /* the report budget between rq and the puller (reportagg.c) */
    tsp__outrecv_t out;
};

#endif
