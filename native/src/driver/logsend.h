/* logsend.h (internal): what every part of the log server's epoll thread uses to talk:
 * a connection's send buffer and epoll arming, freeing a connection, and the server's
 * event messages (logsend.c). */
#ifndef TSP_LOGSEND_H
#define TSP_LOGSEND_H

#include <stddef.h>

#include "logstate.h"

/* A server event (a full sentence) to event_fd and/or the pull queue. */
__attribute__((format(printf, 2, 3))) void tsp__event(tsp_logserver_t *s, const char *fmt, ...);
/* An event that anyone who reaches the port can cause (a peer that did not authenticate,
 * the listener out of descriptors): the server's own words and the peer's address only, at
 * most one per PREAUTH_EVENT_MS; the next one printed counts those left out. */
__attribute__((format(printf, 2, 3))) void tsp__event_preauth(tsp_logserver_t *s, const char *fmt,
                                                              ...);
/* Sets the connection's epoll interest from its state: out of the set while paused (a
 * hang-up would be reported again and again), EPOLLOUT while the send buffer has bytes. */
void tsp__conn_arm(tsp_logserver_t *s, conn_t *c);
/* Queues a frame (header flags given) to the peer and sends what it can without blocking.
 * 0, or -errno (-ENOBUFS: no room in the buffer). */
int tsp__conn_send_flags(tsp_logserver_t *s, conn_t *c, unsigned type, unsigned flags,
                         const void *p, size_t n);
int tsp__conn_send(tsp_logserver_t *s, conn_t *c, unsigned type, const void *p, size_t n);
/* Sends what the buffer holds without blocking. 0, or -errno when the peer is gone. */
int tsp__conn_write(conn_t *c);
/* Closes the connection and frees it (it leaves the list; a transfer it owned is given
 * up). */
void tsp__conn_free(tsp_logserver_t *s, conn_t *c);

#endif
