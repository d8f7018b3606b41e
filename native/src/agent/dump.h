/* dump.h (internal): the hang doctor's agent side (docs/protocol.md 1.9): a worker's state
 * from /proc, whether it can answer a stack dump, the marker line that precedes its dump,
 * and the signal that asks for it (faulthandler, registered by the bootstrap, pyboot.c). */
#ifndef TSP_DUMP_H
#define TSP_DUMP_H

#include <stddef.h>
#include <sys/types.h>

/* SIGRTMIN+8: the signal the bootstrap registered faulthandler on. */
int tsp_dump_signal(void);
/* The kernel's state letter of pid (the third field of /proc/PID/stat) in *state and its
 * name in *what ("sleeping", "stopped", ...). 0 or -errno (-ESRCH: gone). */
int tsp_dump_state(pid_t pid, char *state, const char **what);
/* Why a process in this state cannot answer ("stopped (SIGSTOP)", "exited, not yet
 * reaped"), NULL when it can. */
const char *tsp_dump_cannot_answer(char state);
/* 1 when pid catches, blocks or ignores the dump signal (so sending it cannot kill a
 * process without the bootstrap's handler), 0 when not, -errno when unknown. */
int tsp_dump_handled(pid_t pid);
/* SIGRTMIN+9: the signal the bootstrap's flight-recorder thread waits for (sigwait), blocked
 * in every thread of a bootstrapped worker (and in the shim, which forwards it). */
int tsp_dump_recorder_signal(void);
/* 1 when pid blocks the recorder signal (so it waits for it, or forwards it: sending it
 * cannot kill it), 0 when not, -errno when unknown. */
int tsp_dump_recorder_blocked(pid_t pid);
/* The marker line (no newline) into buf, as protocol 1.9 spells it: with rank >= 0 the
 * agent's ("torchspark: stack dump #REQ of rank R (host H, pid P): state S (WHAT)"), with
 * rank < 0 the shim's ("torchspark: stack dump: worker pid P: state S (WHAT)"); then
 * ": cannot answer: WHY" when why is not NULL. Returns the length (truncated to n - 1). */
size_t tsp_dump_marker(char *buf, size_t n, unsigned request, int rank, const char *host, pid_t pid,
                       char state, const char *what, const char *why);

#endif
