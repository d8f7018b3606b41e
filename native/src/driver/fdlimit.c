/* fdlimit.c: the driver's descriptor limit (docs/architecture.md, "Limits and settings for
 * large jobs"). The log server holds one connection per node for the whole run (and rank
 * 0's output connection, and the rendezvous's GETs while the job starts), so the driver's
 * RLIMIT_NOFILE bounds the nodes: a PySpark driver often starts with a soft limit of 1,024.
 * The log server raises the soft limit to the hard one when it starts (any process may);
 * a glue asks tsp_logserver_fd_check() before it submits a job, which says, naming the
 * limit and the node count, when the hard limit is too low as well. */
#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>

#include "fdlimit.h"
#include "torchspark/logserver.h"
#include "util.h"

/* Descriptors a job costs the driver per node (its log connection, and its rendezvous GET
 * or rank 0's output connection), and those the driver process needs besides (Python or
 * the JVM, Spark's own sockets and jars, the listeners). */
#define FDS_PER_NODE 2
#define FDS_RESERVE 256

int tsp__fdlimit_raise(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -errno;
    if (rl.rlim_cur >= rl.rlim_max)
        return 0;
    rl.rlim_cur = rl.rlim_max;
    return setrlimit(RLIMIT_NOFILE, &rl) == 0 ? 1 : -errno;
}

int tsp_logserver_fd_check(int nodes, char *err, size_t errlen)
{
    if (nodes < 0)
        return tsp__err(err, errlen, -EINVAL, "nodes must be >= 0, got %d", nodes);
    tsp__fdlimit_raise();
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -errno;
    unsigned long long need = (unsigned long long)nodes * FDS_PER_NODE + FDS_RESERVE;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
        return 0;
    if (err && errlen)
        snprintf(err, errlen,
                 "the driver may open %llu file descriptors (ulimit -n; hard limit %llu), but "
                 "a job of %d nodes needs about %llu on the driver (%d per node for the log "
                 "channel and the rendezvous, and %d for the driver itself): raise the limit "
                 "of the driver's process (ulimit -n %llu in the shell or script that starts "
                 "it, LimitNOFILE=%llu in its systemd unit, or nofile in "
                 "/etc/security/limits.conf), or run fewer nodes",
                 (unsigned long long)rl.rlim_cur,
                 rl.rlim_max == RLIM_INFINITY ? 0ULL : (unsigned long long)rl.rlim_max, nodes, need,
                 FDS_PER_NODE, FDS_RESERVE, need, need);
    return -EMFILE;
}
