/* reportsock.h (internal): the agent's report socket (docs/protocol.md 1.8).
 *
 * A Unix stream socket in a private directory (mode 0700) where the workers' report()
 * connects: each connection first names its worker ("TSPR1 <local_rank>"), then sends
 * one JSON record per line. Every record is handed, unparsed, to the agent's line sink as
 * a line of the worker's global rank and stream TSP_STREAM_REPORT. A full sink pauses the
 * connection (the worker's send() then waits): nothing is dropped.
 *
 * The agent owns the epoll set: tsp_reports_open registers the listening socket with tag
 * `tag`, and each connection with tag + 1 + slot; tsp_reports_event handles any of them.
 */
#ifndef TSP_REPORTSOCK_H
#define TSP_REPORTSOCK_H

#include <stdint.h>

#include "lines.h"
#include "topo.h"

/* The environment variable that carries the socket's path to the workers. */
#define TSP_REPORTS_ENV "TORCHSPARK_REPORT_SOCKET"

typedef struct tsp_reports tsp_reports_t;

/* Creates the directory (under tmp_dir, the CLI's $TMPDIR; NULL or too long: /tmp) and the
 * listening socket. 0, or -errno with a sentence in err. */
int tsp_reports_open(tsp_reports_t **out, int epfd, uint64_t tag, tsp_line_sink_t *sink,
                     const tsp_topo_t *topo, const char *tmp_dir, int log_fd, char *err,
                     size_t errlen);
/* The socket's path (for TSP_REPORTS_ENV). */
const char *tsp_reports_path(const tsp_reports_t *r);
/* 1 when tag is one of ours. */
int tsp_reports_owns(const tsp_reports_t *r, uint64_t tag);
/* Handles readiness of the listening socket or a connection. 0, or -EAGAIN when a
 * connection paused on a full sink (watch the sink's wake_fd, then tsp_reports_resume). */
int tsp_reports_event(tsp_reports_t *r, uint64_t tag);
/* Offers paused records to the sink again. 0, or -EAGAIN when some are still paused. */
int tsp_reports_resume(tsp_reports_t *r);
/* 1 while a connection is open or holds records not handed on. */
int tsp_reports_pending(const tsp_reports_t *r);
/* Once no worker is left: closes every connection that holds no paused record (the first
 * time with one warning line naming grace_ms, the grace it had), so that a process that
 * connected and stays idle cannot keep the agent alive. The count closed. */
int tsp_reports_close_idle(tsp_reports_t *r, int grace_ms);
/* Closes every connection and the socket, removes the directory. NULL is fine. */
void tsp_reports_close(tsp_reports_t *r);

#endif
