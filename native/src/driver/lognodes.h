/* lognodes.h (internal): what the driver's log server learns about each node from its
 * NODE and NCCL_CHECK events (lognodes.c, docs/protocol.md 1.7). Epoll thread only. */
#ifndef TSP_LOGNODES_H
#define TSP_LOGNODES_H

#include <stddef.h>

#include "logstate.h"

/* A NODE or NCCL_CHECK event of connection c (json: its payload, len bytes). A NODE event
 * may print the NCCL environment warning (one per node). */
void tsp__nodes_on_event(tsp_logserver_t *s, const conn_t *c, int kind, const char *json,
                         size_t len);
/* For a FAILURE of node_rank: when that node's NCCL check ended at its deadline, a
 * malloc'ed sentence naming job-wide the nodes whose check never started; else NULL. */
char *tsp__nodes_check_detail(tsp_logserver_t *s, int node_rank);
/* Frees what the server keeps about the nodes. */
void tsp__nodes_free(tsp_logserver_t *s);

#endif
