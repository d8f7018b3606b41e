/* dump.c: the hang doctor's agent side (docs/protocol.md 1.9); see dump.h. */
#include "dump.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tsp_dump_signal(void)
{
    return SIGRTMIN + 8;
}

int tsp_dump_recorder_signal(void)
{
    return SIGRTMIN + 9;
}

static ssize_t read_proc(pid_t pid, const char *name, char *buf, size_t n)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -ESRCH : -errno;
    ssize_t got = read(fd, buf, n - 1);
    int e = errno;
    close(fd);
    if (got < 0)
        return -e;
    buf[got] = 0;
    return got;
}

static const char *state_name(char s)
{
    switch (s) {
    case 'R':
        return "running";
    case 'S':
        return "sleeping";
    case 'D':
        return "disk sleep";
    case 'T':
        return "stopped";
    case 't':
        return "tracing stop";
    case 'Z':
        return "zombie";
    case 'X':
    case 'x':
        return "dead";
    case 'I':
        return "idle";
    default:
        return "unknown";
    }
}

int tsp_dump_state(pid_t pid, char *state, const char **what)
{
    char buf[1024];
    ssize_t n = read_proc(pid, "stat", buf, sizeof buf);
    if (n < 0)
        return (int)n;
    /* "PID (COMM) S ...": COMM may hold spaces and parentheses; the state follows the
     * last ')'. */
    const char *close_paren = strrchr(buf, ')');
    if (!close_paren || close_paren[1] != ' ' || !close_paren[2])
        return -EPROTO;
    *state = close_paren[2];
    *what = state_name(*state);
    return 0;
}

const char *tsp_dump_cannot_answer(char state)
{
    switch (state) {
    case 'T':
        return "stopped (SIGSTOP)";
    case 't':
        return "stopped by a tracer";
    case 'Z':
    case 'X':
    case 'x':
        return "exited, not yet reaped";
    default:
        return NULL;
    }
}

/* The bit of signal sig in a /proc/PID/status mask line "Name:\t%016llx". */
static int mask_has(const char *status, const char *name, int sig)
{
    const char *p = strstr(status, name);
    if (!p)
        return -EPROTO;
    unsigned long long m = strtoull(p + strlen(name), NULL, 16);
    return (m >> (sig - 1)) & 1ull ? 1 : 0;
}

int tsp_dump_handled(pid_t pid)
{
    char buf[4096];
    ssize_t n = read_proc(pid, "status", buf, sizeof buf);
    if (n < 0)
        return (int)n;
    static const char *const names[] = {"\nSigCgt:", "\nSigBlk:", "\nSigIgn:"};
    int sig = tsp_dump_signal();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int rc = mask_has(buf, names[i], sig);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int tsp_dump_recorder_blocked(pid_t pid)
{
    char buf[4096];
    ssize_t n = read_proc(pid, "status", buf, sizeof buf);
    if (n < 0)
        return (int)n;
    return mask_has(buf, "\nSigBlk:", tsp_dump_recorder_signal());
}

size_t tsp_dump_marker(char *buf, size_t n, unsigned request, int rank, const char *host, pid_t pid,
                       char state, const char *what, const char *why)
{
    int len;
    if (rank >= 0)
        len = snprintf(buf, n,
                       "torchspark: stack dump #%u of rank %d (host %s, pid %d): state %c (%s)%s%s",
                       request, rank, host, (int)pid, state, what, why ? ": cannot answer: " : "",
                       why ? why : "");
    else
        len = snprintf(buf, n, "torchspark: stack dump: worker pid %d: state %c (%s)%s%s", (int)pid,
                       state, what, why ? ": cannot answer: " : "", why ? why : "");
    if (len < 0)
        return 0;
    return (size_t)len < n ? (size_t)len : n - 1;
}
