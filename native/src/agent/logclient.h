/* logclient.h (internal): the agent side of the log channel (docs/protocol.md, part 1).
 *
 * A tsp_line_sink_t for the agent: write_line copies the line into a bounded in-memory
 * queue and never blocks. One sender thread per client connects, authenticates, sends,
 * frees what the driver acknowledged, and reconnects with backoff (resending what was
 * not acknowledged; the driver de-duplicates).
 *
 * When the queue is full: in the default (lossless) mode write_line returns -EAGAIN and
 * wake_fd becomes readable once there is room again, so the agent stops reading that
 * worker's pipe and the worker is slowed. In drop mode the line is dropped, counted per
 * rank, and the counts are reported to the driver.
 *
 * An unreachable driver never fails or stalls training: when the first connection fails,
 * or a lost connection is not back within reconnect_grace_ms, lines go to the agent's own
 * stdout/stderr ("[rank N] text") and one warning says so; the client keeps trying in the
 * background and sends to the driver again once it is back. A driver that stays connected
 * but takes nothing for stall_ms while the writers wait is treated the same way (its
 * unacknowledged lines then go to the local output too, and may also reach the driver if
 * it ever reads them).
 *
 * Lifecycle of a tsp_logclient_t (opaque): tsp_logclient_opts_init(&o), then
 * tsp_logclient_start() allocates it and starts the sender thread (it connects in the
 * background); tsp_logclient_close() flushes, stops the thread and frees, in one call.
 */
#ifndef TSP_LOGCLIENT_H
#define TSP_LOGCLIENT_H

#include <stdint.h>
#include "torchspark/common.h"
#include "lines.h"
#include "logclientopts.h"
#include "logwire.h"

void tsp_logclient_opts_init(tsp_logclient_opts_t *o);
/* Starts the sender thread (it connects in the background). NULL with err on failure. */
tsp_logclient_t *tsp_logclient_start(const tsp_logclient_opts_t *o, char *err, size_t errlen);
/* The sink to hand to the agent; valid until tsp_logclient_close(). */
tsp_line_sink_t *tsp_logclient_sink(tsp_logclient_t *c);
void tsp_logclient_stats(tsp_logclient_t *c, tsp_logclient_stats_t *st);
/* Queues an EVENT (kind TSP_WIRE_EVENT_*, JSON of at most TSP_WIRE_MAX_EVENT bytes)
 * behind the lines written so far; tsp_logclient_close() flushes it like a line.
 * Before the first handshake (the driver not reached yet, or a connect under way) the
 * event is held and enters the queue right after a handshake that grants CONTROL
 * (discarded, and counted in events_unsent, when the handshake refuses it); close then
 * waits for it up to event_flush_ms while no driver is reached (docs/protocol.md 1.7).
 * 0 (queued or held); -ENOTSUP when the driver did not accept the control channel (or
 * no_control is set); -EMSGSIZE; -ENOMEM. */
int tsp_logclient_event(tsp_logclient_t *c, int kind, int rank, const char *json, size_t len);
/* Flushes (up to timeout_ms; what is left goes to the local fallback), says CLOSE, stops
 * the thread and frees. Every queued line and event is sent and acknowledged first, or
 * the bound passes: timeout_ms, and for events held for a first handshake with no
 * driver reached, event_flush_ms (an event not sent is named in one warning on the local
 * stderr). 0 when every line and event reached the driver (or was counted dropped),
 * -ETIMEDOUT or -ENOTCONN when some went to the local fallback or were not sent. */
int tsp_logclient_close(tsp_logclient_t *c, int timeout_ms);

#endif
