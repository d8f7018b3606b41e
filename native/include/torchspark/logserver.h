/* torchspark/logserver.h: the driver side of the log channel (docs/protocol.md, part 1).
 *
 * One epoll thread serves any number of agents. Authenticated lines are delivered in
 * order per agent, exactly once, either to a bounded pull queue (the host language pulls
 * batches: Python writes them to sys.stderr, Java to its logger) or straight to an fd in
 * the "[rank N] text" format (the CLI). When the queue is full the thread stops reading
 * sockets, so TCP backpressure slows the agents instead of memory growing. The last lines
 * of each rank are kept for error reports. Rank 0's output file can be received to a file
 * or to memory (any size; SHA-256 checked).
 *
 * Lifecycle of a tsp_logserver_t (opaque, allocated by the library):
 *   tsp_logserver_opts_init(&o)                 defaults into a caller's options struct
 *   s = tsp_logserver_start(&o, err, len)       allocates, binds, listens, starts the thread
 *       (or tsp_logserver_new(host, port, secret_hex, tail_lines, err, len): the same from
 *        plain arguments, for ctypes and JNI; NULL with err on failure, nothing to free)
 *   ... pull / pull_text / tail / expect_output / output_wait / failure / stop_all ...
 *   tsp_logserver_shutdown(s, drain_ms)         stops accepting, drains, joins the thread;
 *                                               idempotent; lines and the output stay
 *                                               readable, the handle stays valid
 *   tsp_logserver_free(s)                       shuts down if needed, frees everything
 * There is no separate init or restart: a stopped server is freed and a new one started.
 *
 * Thread safety: every function may be called from any thread; pull has one consumer at
 * a time (the batch it returns is valid until the next pull or free).
 */
#ifndef TORCHSPARK_LOGSERVER_H
#define TORCHSPARK_LOGSERVER_H

#include <stdint.h>
#include "torchspark/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The streams (TSP_LOG_STREAM_*) and flags (TSP_LOG_LINE_*) of a delivered line are in
 * common.h; server events (dropped connections and why) are also queued as lines of rank
 * TSP_LOG_RANK_SERVER and stream TSP_LOG_STREAM_EVENT when opts.events_to_queue is set. */
#define TSP_LOG_RANK_SERVER (-1)
/* The longest line (or piece of a line) the channel carries, in bytes. */
#define TSP_LOG_MAX_LINE (1u << 20)

typedef struct tsp_logserver_opts {
    const char *host;          /* address to bind; NULL: 127.0.0.1. 0.0.0.0 only if asked */
    int port;                  /* 0: the kernel picks one (see tsp_logserver_port) */
    const uint8_t *secret;     /* TSP_SECRET_LEN bytes; NULL: fresh random secret */
    unsigned tail_lines;       /* lines kept per rank (default 100) */
    size_t tail_bytes;         /* and at most these bytes per rank (default 64 KiB) */
    size_t queue_bytes;        /* pull queue bound (default 8 MiB) */
    int sink_fd;               /* >= 0: formatted lines go to this fd, not the queue */
    int event_fd;              /* reasons for dropped connections (default 2; -1: none) */
    int events_to_queue;       /* 1: events also queued as rank -1, stream 3 lines */
    int handshake_timeout_ms;  /* default 10000 */
    const char *prefix;        /* sink format, {rank} expands (default "[rank {rank}] ") */
    const char *stderr_marker; /* after the prefix for stderr lines (default "[stderr] ") */
    int lost_grace_ms;         /* an agent gone without CLOSE is lost if not back by then (1000) */
} tsp_logserver_opts_t;

/* One delivered line. data points into the batch of the last pull; the data of one
 * batch is contiguous and in order (line i+1 starts right after line i). */
typedef struct tsp_logline {
    const char *data;
    uint32_t len;
    int32_t rank;
    uint8_t stream; /* TSP_LOG_STREAM_* */
    uint8_t flags;  /* TSP_LOG_LINE_* */
    uint16_t reserved;
} tsp_logline_t;

typedef struct tsp_logserver_stats {
    uint64_t accepted;      /* TCP connections accepted */
    uint64_t authenticated; /* completed the handshake */
    uint64_t rejected;      /* dropped with a reason */
    uint64_t lines;         /* lines delivered */
    uint64_t bytes;         /* text bytes delivered */
    uint64_t duplicates;    /* resent lines skipped (already delivered) */
    uint64_t connected;     /* connections open now */
    uint64_t queued_bytes;  /* in the pull queue now */
} tsp_logserver_stats_t;

typedef struct tsp_logserver tsp_logserver_t;

TSP_EXTERN void tsp_logserver_opts_init(tsp_logserver_opts_t *o);
/* Binds, listens and starts the thread. NULL on failure with err filled. */
TSP_EXTERN tsp_logserver_t *tsp_logserver_start(const tsp_logserver_opts_t *o, char *err,
                                                size_t errlen);
/* ctypes-friendly shorthand: secret_hex NULL for a fresh secret; tail_lines 0: default. */
TSP_EXTERN tsp_logserver_t *tsp_logserver_new(const char *host, int port, const char *secret_hex,
                                              unsigned tail_lines, char *err, size_t errlen);
TSP_EXTERN int tsp_logserver_port(const tsp_logserver_t *s);
TSP_EXTERN const char *tsp_logserver_host(const tsp_logserver_t *s);
TSP_EXTERN void tsp_logserver_secret(const tsp_logserver_t *s, uint8_t out[TSP_SECRET_LEN]);

/* Waits up to timeout_ms (-1: forever) for lines, then moves up to max_lines into out.
 * Returns the count (0 on timeout), or -EPIPE once the server stopped and all was pulled. */
TSP_EXTERN int tsp_logserver_pull(tsp_logserver_t *s, tsp_logline_t *out, int max_lines,
                                  int timeout_ms);
/* Like pull, for the workers' reports (docs/protocol.md 1.8): each one a JSON record as
 * the worker sent it, with its global rank, stream TSP_LOG_STREAM_REPORT, in order per
 * rank, exactly once. Their queue is bounded like the lines' (the server stops reading an
 * agent while it is full): pull them while the run goes on. */
TSP_EXTERN int tsp_logserver_pull_reports(tsp_logserver_t *s, tsp_logline_t *out, int max_reports,
                                          int timeout_ms);
/* Like pull, but the lines come formatted as the fd sink writes them, ready for a text
 * stream: prefix ({rank} expands; NULL: "[rank {rank}] "), then stderr_marker for stderr
 * lines (NULL: "[stderr] "), "[torchspark] " for server events, the text, and '\n'
 * (none after a CONTINUED piece). One call formats a whole batch, so a host language pays
 * nothing per line. buflen must be at least TSP_LOGSERVER_TEXT_MIN (any line fits).
 * Returns the bytes written (0 on timeout), -EPIPE once stopped and all was pulled, or
 * -EINVAL; *nlines (when not NULL) receives the number of lines taken. */
#define TSP_LOGSERVER_TEXT_MIN (TSP_LOG_MAX_LINE + 4096u)
TSP_EXTERN long tsp_logserver_pull_text(tsp_logserver_t *s, char *buf, size_t buflen, int max_lines,
                                        int timeout_ms, const char *prefix,
                                        const char *stderr_marker, int *nlines);
/* The last n lines of rank, oldest first, each followed by '\n', into buf (truncated to
 * buflen). Returns the bytes the whole answer needs. */
TSP_EXTERN long tsp_logserver_tail(tsp_logserver_t *s, int rank, int n, char *buf, size_t buflen);
/* Ranks whose agents dropped lines (drop mode) and how many: fills up to max pairs,
 * returns how many ranks have drops. */
TSP_EXTERN int tsp_logserver_dropped(tsp_logserver_t *s, int32_t *ranks, uint64_t *counts, int max);
TSP_EXTERN void tsp_logserver_stats(tsp_logserver_t *s, tsp_logserver_stats_t *st);
/* The report budget (docs/distributor.md, "Reports at scale"): records a second, job-wide,
 * that pull_reports hands on as they are; beyond it a rank's reports come folded, one record
 * per interval with a "summary" (docs/protocol.md 1.8). Default TSP_REPORT_BUDGET (20,000);
 * <= 0: every record as it is. Set it before the first pull_reports. */
#define TSP_REPORT_BUDGET 20000
/* pull_reports hands out whole records only: a record that came in CONTINUED pieces is
 * rejoined first, up to TSP_REPORT_RECORD_MAX bytes, with at most TSP_REPORT_PIECES_MAX
 * bytes of pieces held job-wide; beyond either, or unfinished at the run's end, it is
 * dropped with one server event (docs/protocol.md 1.8, "Long records"). */
#define TSP_REPORT_RECORD_MAX (16 << 20)
#define TSP_REPORT_PIECES_MAX (64 << 20)
TSP_EXTERN void tsp_logserver_report_budget(tsp_logserver_t *s, double per_s);
/* Whether the driver's descriptor limit (RLIMIT_NOFILE) holds a job of `nodes` nodes: the
 * soft limit is first raised to the hard one (the log server also does so when it starts).
 * 0; -EMFILE with a sentence in err naming the limit, the node count and what to do. */
TSP_EXTERN int tsp_logserver_fd_check(int nodes, char *err, size_t errlen);

/* Accept one output transfer, written to path or, with NULL, kept in memory. A file is
 * received into a new file beside it (created 0600 with O_EXCL, so never through a link)
 * and renamed over path once verified. 0, -EBUSY when a transfer is under way or done. */
TSP_EXTERN int tsp_logserver_expect_output(tsp_logserver_t *s, const char *path);
/* The largest output received into memory, as Spark writes spark.driver.maxResultSize
 * (bytes, or a number with a unit b, k, kb, m, mb, g, gb, t, tb, p, pb; NULL or "": the
 * 1g default; 0: no limit). A bigger one is refused at OUT_BEGIN, before any memory is
 * taken, with a sentence that says what to do. Until this is called there is no limit.
 * 0, or -EINVAL with err naming the bad value. */
TSP_EXTERN int tsp_logserver_output_limit(tsp_logserver_t *s, const char *max_result_size,
                                          char *err, size_t errlen);
/* spark.torchspark.encryption (docs/protocol.md 1.10.1): 1 (the default) every connection
 * stays TLS 1.3 to its end; 0 connections made from now on keep the TLS 1.3 handshake, then
 * carry MAC'ed, numbered records in clear. An agent that offers only the other mode is
 * refused with a sentence. 0, or -EINVAL for another value. */
TSP_EXTERN int tsp_logserver_encryption(tsp_logserver_t *s, int on);
/* Waits for the output: 0 received and verified; -ETIMEDOUT; -ENOENT none expected; -EFBIG
 * at once when it was refused for its size (output_limit: no retry can bring it). */
TSP_EXTERN int tsp_logserver_output_wait(tsp_logserver_t *s, int timeout_ms);
/* After output_wait returned 0: the data (memory mode; NULL for a file) and its length. */
TSP_EXTERN int tsp_logserver_output_data(tsp_logserver_t *s, const void **data, uint64_t *len);
/* The last output failure as a sentence ("" when none). Valid until the next call. */
TSP_EXTERN const char *tsp_logserver_output_error(tsp_logserver_t *s);

/* The control channel (docs/protocol.md 1.7). The first failure of the run (an agent's
 * FAILURE event, or an agent lost without CLOSE) makes the server send STOP to every
 * other agent that accepted the control channel; its description is the root cause.
 * tsp_logserver_failure waits up to timeout_ms (-1: forever) for it and copies its JSON
 * (NUL-terminated, truncated to buflen): {"kind", "node_rank", "host", "peer", "message",
 * "report"}. Returns the bytes the whole JSON needs (without the NUL), 0 when there is
 * none (timeout, or the server has stopped). */
TSP_EXTERN long tsp_logserver_failure(tsp_logserver_t *s, char *buf, size_t buflen, int timeout_ms);
/* Agents gone without CLOSE whose lost grace is still running: a failure may follow
 * within opts.lost_grace_ms (worth waiting for when, say, Spark reports a lost executor). */
TSP_EXTERN int tsp_logserver_lost_pending(tsp_logserver_t *s);
/* The nodes lost (docs/protocol.md 1.7, "Nodes lost"): node ranks whose agent saw its
 * executor JVM die (EVENT EXECUTOR_GONE), or whose channel ended without CLOSE
 * before the run was stopped and did not come back, in order, each once. Copies up to max
 * into ranks (may be NULL) and returns how many there are. */
TSP_EXTERN int tsp_logserver_nodes_lost(tsp_logserver_t *s, int32_t *ranks, int max);
/* Sends STOP (reason "ended", with text) to every control agent, now and on
 * later connections. No root cause is recorded. 0, or -EPIPE after shutdown. */
TSP_EXTERN int tsp_logserver_stop_all(tsp_logserver_t *s, const char *text);
/* The hang doctor (docs/protocol.md 1.9): asks every connected control agent of version 2
 * for its workers' Python stacks, which come back as lines of each rank after a marker
 * line naming the request. Returns the request's number (1, 2, ...), or -EPIPE when the
 * server has already shut down. */
TSP_EXTERN int tsp_logserver_dump_all(tsp_logserver_t *s);
/* The hang doctor's watchdog (docs/protocol.md 1.12), an option of the server: when no rank
 * has printed a line or reported for timeout_ms, counted from the workers' start (the first
 * agent's authentication), the server sends DUMP, collects every rank's answer from its
 * tail (which it raises to TSP_LOGSERVER_HANG_TAIL lines a rank, so that a dump fits), names the
 * culprit (torchspark/hang.h), writes every rank's stacks to a new file (mode 0600) in tmpdir and
 * queues ONE event for tsp_logserver_hang_event; with action "cancel" it also sends STOP to
 * every agent. action: "report" or "cancel"; world: the attempt's ranks. Call it right
 * after start (a second call replaces the first). 0; -EINVAL (err says which argument is
 * wrong) or -EPIPE after shutdown. */
#define TSP_LOGSERVER_HANG_TAIL 2000
TSP_EXTERN int tsp_logserver_watch(tsp_logserver_t *s, long timeout_ms, const char *action,
                                   int world, const char *tmpdir, char *err, size_t errlen);
/* Waits up to timeout_ms (-1: forever) for the watchdog's next event, a NUL-terminated JSON
 * object (docs/protocol.md 1.12), and copies it into buf when it fits: returns its length
 * (without the NUL; when that is >= buflen nothing was taken: retry with a bigger buf), 0
 * on timeout, -EPIPE once the server stopped and every event was taken. */
TSP_EXTERN long tsp_logserver_hang_event(tsp_logserver_t *s, char *buf, size_t buflen,
                                         int timeout_ms);
/* Asks every connected control agent of version 2 to have its workers checkpoint now and
 * then stop its node (docs/protocol.md 1.13; why: 1, the run grows back). 0, -EINVAL for
 * another why, or -EPIPE when the server has already shut down. */
TSP_EXTERN int tsp_logserver_checkpoint_all(tsp_logserver_t *s, int why);

/* The glues' one call on a server (docs/protocol.md 1.14): the JSON request {"op": ...} (info,
 * stats, tail, lost, output, failure, hang_event, report_budget, encryption, expect_output,
 * output_limit, stop_all, checkpoint_all, watch, shutdown: each the function of that name
 * above) -> its reply, written as every JSON transform writes one (out, outlen, *needed;
 * -ENOSPC: call again with *needed bytes, nothing was taken). 0, or -errno with err naming
 * what is wrong. */
TSP_EXTERN int tsp_logserver_call(tsp_logserver_t *s, const char *request, size_t len, char *out,
                                  size_t outlen, size_t *needed, char *err, size_t errlen);

/* Stops accepting, drains every connected agent (until each closed, or drain_timeout_ms
 * passed), acknowledges, closes, and joins the thread. Lines stay pullable. Idempotent. */
TSP_EXTERN int tsp_logserver_shutdown(tsp_logserver_t *s, int drain_timeout_ms);
/* Shuts down (drain 0 ms when not done yet) and frees everything. */
TSP_EXTERN void tsp_logserver_free(tsp_logserver_t *s);

/* The prefix users see before a line, formatted by the one formatter that the driver's
 * queue and fd sink and the agent's local fallback use: prefix with {rank} expanded (NULL:
 * "[rank {rank}] "), then stderr_marker for stream TSP_LOG_STREAM_STDERR (NULL:
 * "[stderr] "; "": none); "[torchspark] " for TSP_LOG_STREAM_EVENT. Into out
 * (NUL-terminated, truncated to outlen); returns the whole prefix's length. */
TSP_EXTERN size_t tsp_logserver_format_prefix(char *out, size_t outlen, const char *prefix,
                                              const char *stderr_marker, int32_t rank,
                                              unsigned stream);

#ifdef __cplusplus
}
#endif
#endif
