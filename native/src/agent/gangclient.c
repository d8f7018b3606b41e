/* gangclient.c: a gang task's JOIN at the driver's rendezvous (docs/protocol.md 2.2): one
 * line inside the rendezvous' TLS, keyed by the run's secret (rdvclient.c's line call), one
 * line back (GO N, or ERR reason), and the sentences a glue raises as they are. Whole
 * (tsp_gang_call, the PySpark task) or in slices (start, then waits: the JVM task checks
 * between them whether Spark killed it). */
#include "torchspark/gang.h"
#include "torchspark/rendezvous.h"

#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The task's host as the driver admits it (gang.c: 1..255 bytes of [A-Za-z0-9._:-]): this
 * host's name (gethostname) when NULL or empty, "unknown" without one, cut to
 * TSP_GANG_HOST_MAX bytes, every other byte '-'. */
static void join_host(const char *task_host, char out[TSP_GANG_HOST_MAX + 1])
{
    char self[TSP_GANG_HOST_MAX + 1] = "";
    if (!task_host || !*task_host)
        task_host = gethostname(self, sizeof self - 1) == 0 && self[0] ? self : "unknown";
    snprintf(out, TSP_GANG_HOST_MAX + 1, "%s", task_host);
    for (char *p = out; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("._:-", c)))
            *p = '-';
    }
}

int tsp_gang_call_start(const char *host, int port, const char *secret_hex, int node_rank,
                        int try_no, const char *task_host, int timeout_ms, tsp_rdv_call_t **out,
                        char *err, size_t errlen)
{
    char buf[TSP_RDV_LINE_MAX + 2], name[TSP_GANG_HOST_MAX + 1];
    if (!out || !host || !*host || port < 1 || port > 65535 || !secret_hex || node_rank < 0 ||
        try_no < 0 || timeout_ms <= 0)
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: a gang JOIN needs the rendezvous' host, port 1..65535 and "
                        "the run's secret, a node rank and try >= 0 and the gang's positive "
                        "timeout");
    join_host(task_host, name);
    snprintf(buf, sizeof buf, "JOIN %d %d %s", node_rank, try_no, name);
    int wait_ms = timeout_ms > INT_MAX - TSP_GANG_JOIN_GRACE_MS
                      ? INT_MAX
                      : timeout_ms + TSP_GANG_JOIN_GRACE_MS;
    return tsp_rdv_call_line(host, port, secret_hex, buf, wait_ms, out, err, errlen);
}

int tsp_gang_call_wait(tsp_rdv_call_t *c, int node_rank, int timeout_ms, int *nnodes, char *err,
                       size_t errlen)
{
    char buf[TSP_RDV_LINE_MAX + 2];
    if (!c || !nnodes)
        return tsp__err(err, errlen, -EINVAL, "torchspark: a gang JOIN's wait needs its call");
    int rc = tsp_rdv_call_wait(c, timeout_ms, buf, sizeof buf, err, errlen);
    if (rc)
        return rc;
    if (strncmp(buf, "ERR ", 4) == 0)
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver refused node %d's task in the gang: %s", node_rank,
                        buf + 4);
    int size = 0;
    char end = 0;
    if (sscanf(buf, "GO %d%c", &size, &end) != 1 || size <= node_rank)
        return tsp__err(err, errlen, TSP_RDV_REFUSED,
                        "torchspark: the driver's rendezvous answered '%.200s' to a gang JOIN",
                        buf);
    *nnodes = size;
    return 0;
}

int tsp_gang_call(const char *host, int port, const char *secret_hex, int node_rank, int try_no,
                  const char *task_host, int timeout_ms, int *nnodes, char *err, size_t errlen)
{
    tsp_rdv_call_t *c = NULL;
    int rc = tsp_gang_call_start(host, port, secret_hex, node_rank, try_no, task_host, timeout_ms,
                                 &c, err, errlen);
    if (!rc)
        rc = tsp_gang_call_wait(c, node_rank, -1, nnodes, err, errlen);
    tsp_rdv_call_free(c);
    return rc;
}
