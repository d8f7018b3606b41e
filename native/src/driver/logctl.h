/* logctl.h (internal): the log server's control channel (logctl.c, docs/protocol.md 1.7),
 * on the epoll thread. */
#ifndef TSP_LOGCTL_H
#define TSP_LOGCTL_H

#include <stdint.h>

#include "logstate.h"

/* Sends STOP (the run's reason and text) to one control connection. */
void tsp__conn_stop(tsp_logserver_t *s, conn_t *c);
/* DUMP number `request` to every control agent of version 2 (protocol 1.9). */
void tsp__dump_everyone(tsp_logserver_t *s, uint32_t request);
/* CHECKPOINT (why: TSP_WIRE_CHECKPOINT_*) to every control agent of version 2 (1.13). */
void tsp__checkpoint_everyone(tsp_logserver_t *s, uint8_t why);
/* The first stop of the run: STOP to every control agent but `except`, now and later. */
void tsp__stop_everyone(tsp_logserver_t *s, int reason, uint64_t except, const char *text);
/* An EVENT frame (a failure report): the root cause, then STOP to the others. */
int tsp__on_event(tsp_logserver_t *s, conn_t *c, const tsp_wire_hdr_t *h, const uint8_t *p);
/* A LOGS connection ended without CLOSE: lost unless its agent is back within the grace. */
void tsp__lost_add(tsp_logserver_t *s, const conn_t *c, const char *why, int64_t grace_ms);
/* The agent authenticated again: no longer pending as lost. */
void tsp__lost_forget(tsp_logserver_t *s, uint64_t agent_id);
/* Declares agents lost whose grace is over; returns the next deadline (-1: none). */
int64_t tsp__lost_sweep(tsp_logserver_t *s, int64_t now);
/* KEEPALIVE connections that read nothing for TSP_WIRE_SILENT_MS are closed and handed to
 * the lost bookkeeping ("went silent"); returns the next deadline (-1: none). */
int64_t tsp__silent_sweep(tsp_logserver_t *s, int64_t now);

#endif
