/* lines.h (internal): splitting a worker's byte stream into lines, and the sink that
 * the agent hands those lines to (console, log file, the driver's log channel).
 *
 * A line ends at '\n' (not included in the line). A '\r' stays inside the line, so a
 * progress bar's updates travel as one line and render on the driver as they would in a
 * terminal. Nothing is truncated: a line longer than the cap is handed on in pieces of
 * at most cap bytes, each piece but the last flagged TSP_LINE_CONTINUED. The last bytes
 * of a stream without a final '\n' are flagged TSP_LINE_NO_EOL.
 */
#ifndef TSP_LINES_H
#define TSP_LINES_H

#include <stdint.h>
#include "torchspark/common.h"

#define TSP_LINES_DEFAULT_CAP (1u << 20) /* 1 MiB: the documented line cap */
#define TSP_LINES_MIN_CAP 16u

/* The internal names of common.h's streams and flags (their one definition). The log
 * server also queues its own messages as lines of stream TSP_STREAM_EVENT. */
enum {
    TSP_STREAM_STDOUT = TSP_LOG_STREAM_STDOUT,
    TSP_STREAM_STDERR = TSP_LOG_STREAM_STDERR,
    TSP_STREAM_EVENT = TSP_LOG_STREAM_EVENT,
    TSP_STREAM_REPORT = TSP_LOG_STREAM_REPORT /* torchspark.report() records (protocol 1.8) */
};
enum {
    TSP_LINE_CONTINUED = TSP_LOG_LINE_CONTINUED, /* a piece of a longer line; more follows */
    TSP_LINE_NO_EOL = TSP_LOG_LINE_NO_EOL,       /* the stream ended without '\n' after this text */
};

/* One line as handed to a sink. data is not NUL-terminated and may hold any bytes. */
typedef struct tsp_line {
    int32_t rank;       /* global rank of the worker */
    int32_t local_rank; /* local rank on this node */
    uint8_t stream;     /* TSP_STREAM_STDOUT or TSP_STREAM_STDERR */
    uint8_t flags;      /* TSP_LINE_* */
    const char *data;
    size_t len;
} tsp_line_t;

/* A consumer of lines. write_line must not block: it returns 0 when it took the line, or
 * -EAGAIN when it has no room; then the caller keeps the line, stops reading that
 * worker (so the worker's pipe fills and the worker is slowed: no line is lost), and
 * offers the line again once wake_fd is readable (or at once when wake_fd is -1). */
typedef struct tsp_line_sink {
    void *ctx;
    int (*write_line)(void *ctx, const tsp_line_t *line);
    int wake_fd;
} tsp_line_sink_t;

/* The one line prefix users see (docs/architecture.md, "Line prefix"): the template with
 * "{rank}" expanded ("[rank 3] "), then, for a stderr line, the marker that tells the
 * streams apart where both go to one place ("[rank 3] [stderr] "); the log server's own
 * events (TSP_STREAM_EVENT) get "[torchspark] " instead. NULL template or marker: the
 * defaults below; "" marker: none. Used by the driver's log server (pulled text, its fd
 * sink), the agent's local fallback and, through tsp_logserver_format_prefix, Python. */
#define TSP_LINES_PREFIX "[rank {rank}] "
#define TSP_LINES_STDERR_MARKER "[stderr] "
#define TSP_LINES_REPORT_MARKER "[report] "
#define TSP_LINES_EVENT_PREFIX "[torchspark] "
/* Writes the prefix into out (NUL-terminated, truncated to outlen) and returns the length
 * of the whole prefix. */
size_t tsp_lines_prefix(char *out, size_t outlen, const char *tmpl, const char *marker,
                        int32_t rank, unsigned stream);

/* Text that came from the network, made safe to print in one line of a log: every control
 * character (C0, DEL, and C1 written as UTF-8) becomes '?', in place, so that a peer can
 * neither move a terminal's cursor nor start a line that looks like a rank's. */
void tsp_lines_clean(char *text, size_t n);

/* A per-stream reassembly buffer. Caller-owned; grows from a small size up to cap. */
typedef struct tsp_lines {
    char *buf;
    size_t cap;     /* the line cap */
    size_t size;    /* allocated bytes */
    size_t start;   /* first unconsumed byte */
    size_t end;     /* one past the last byte read */
    size_t scan;    /* bytes before this offset hold no '\n' */
    size_t pending; /* bytes that tsp_lines_consume() drops */
    int eof;
} tsp_lines_t;

int tsp_lines_init(tsp_lines_t *lb, size_t cap);
void tsp_lines_close(tsp_lines_t *lb);
/* Reads once from fd (non-blocking fds welcome). Returns bytes read, 0 at EOF (and
 * marks the buffer ended), -EAGAIN, another -errno, or -ENOBUFS when a whole line is
 * pending and there is no room: take lines out first. */
long tsp_lines_read(tsp_lines_t *lb, int fd);
/* Appends bytes (the same as a read that returned them). -ENOBUFS when they do not fit;
 * then nothing was appended. */
int tsp_lines_feed(tsp_lines_t *lb, const void *data, size_t len);
/* Marks the end of the stream: the remaining bytes become a last line. */
void tsp_lines_finish(tsp_lines_t *lb);
/* The next complete line, if any (1 found, 0 none). Points into the buffer until
 * tsp_lines_consume() or the next read. */
int tsp_lines_peek(tsp_lines_t *lb, const char **data, size_t *len, unsigned *flags);
/* Drops the line that the last tsp_lines_peek() returned. */
void tsp_lines_consume(tsp_lines_t *lb);
/* 1 when nothing is buffered and the stream has ended. */
int tsp_lines_done(const tsp_lines_t *lb);

#endif
