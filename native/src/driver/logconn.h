/* logconn.h (internal): one agent connection's protocol on the log server's epoll thread
 * (logconn.c). */
#ifndef TSP_LOGCONN_H
#define TSP_LOGCONN_H

#include "logstate.h"

/* Drops the connection with a reason: logged, told to the peer, counted. */
void tsp__conn_reject(tsp_logserver_t *s, conn_t *c, const char *why);
/* The same with the ERROR frame's header flags (TSP_WIRE_ERROR_*). */
void tsp__conn_reject_flags(tsp_logserver_t *s, conn_t *c, unsigned flags, const char *why);
/* Reads what the socket has and handles it. 0 while the connection lives. */
int tsp__conn_read(tsp_logserver_t *s, conn_t *c);
/* Writable again: sends what the buffer holds and re-arms. */
void tsp__conn_flush(tsp_logserver_t *s, conn_t *c);
/* The drain: final ACK and CLOSE, then linger until EOF. */
void tsp__conn_goodbye(tsp_logserver_t *s, conn_t *c);
/* The pull queue made room: read paused connections again, round robin. */
void tsp__resume_all(tsp_logserver_t *s);
/* Reads the connections whose TLS holds decrypted bytes (epoll does not see them). */
void tsp__conn_kick_pending(tsp_logserver_t *s);
/* The output's hashing thread failed: refuse its connection now. */
void tsp__output_failed(tsp_logserver_t *s);
/* Writes the formatted lines of sink mode to sink_fd. */
void tsp__sink_flush(tsp_logserver_t *s);

#endif
