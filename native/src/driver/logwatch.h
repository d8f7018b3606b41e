/* logwatch.h (internal): the hang doctor's watchdog, an option of the driver's log server
 * (logwatch.c, docs/protocol.md 1.12), run on its epoll thread. */
#ifndef TSP_LOGWATCH_H
#define TSP_LOGWATCH_H

#include <stdint.h>

#include "json.h"
#include "logstate.h"

/* Validates and allocates a watchdog's settings (tsp_logserver_watch's arguments); NULL
 * with err filled when one is wrong. The epoll thread takes it over (tsp__watch_adopt). */
struct tsp__watch *tsp__watch_new(long timeout_ms, const char *action, int world,
                                  const char *tmpdir, char *err, size_t errlen);
/* On the epoll thread: w replaces the server's watchdog (its clock starts now when an agent
 * has already authenticated). */
void tsp__watch_adopt(tsp_logserver_t *s, struct tsp__watch *w);
/* On the epoll thread, after each batch of events: the clock, the DUMP, the collection, the
 * analysis and the action. Returns the next deadline (ms, monotonic; -1: none). */
int64_t tsp__watch_sweep(tsp_logserver_t *s, int64_t now);
void tsp__watch_free(struct tsp__watch *w);
/* The run's hang doctor in one reply (tsp_logserver_call's op hang_summary, docs/protocol.md
 * 1.14), from every event queued so far, taken or not: "lines" (each diagnosis's line, in
 * order) and "cancel" (the event that cancelled the run, itself, or null). */
void tsp__watch_summary(tsp_logserver_t *s, tsp_json_writer_t *w);
/* A diagnosis's stacks read back from the file the watchdog wrote (the op stacks, protocol
 * 1.14): "lines", the file's lines after its first (the line); none when it cannot be read. */
void tsp__watch_stacks(const char *path, tsp_json_writer_t *w);

#endif
