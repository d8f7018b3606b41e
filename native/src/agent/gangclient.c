/* gangclient.c: a gang task's JOIN at the driver's rendezvous (docs/protocol.md 2.2): one
 * line inside the rendezvous' TLS, keyed by the run's secret (rdvclient.c's line call), one
 * line back (GO N, or ERR reason), and the sentences a glue raises as they are. */
#include "torchspark/gang.h"
#include "torchspark/rendezvous.h"

#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int tsp_gang_call(const char *host, int port, const char *secret_hex, int node_rank, int try_no,
                  const char *task_host, int timeout_ms, int *nnodes, char *err, size_t errlen)
{
    char buf[TSP_RDV_LINE_MAX + 2];
    if (!host || !*host || port < 1 || port > 65535 || !secret_hex || !task_host || !*task_host ||
        strlen(task_host) > TSP_GANG_HOST_MAX || strpbrk(task_host, " \n") || node_rank < 0 ||
        try_no < 0 || timeout_ms <= 0)
        return tsp__err(err, errlen, -EINVAL,
                        "torchspark: a gang JOIN needs the rendezvous' host, port 1..65535 and "
                        "the run's secret, a node rank and try >= 0, a host name of 1..%d bytes "
                        "without spaces and a positive timeout",
                        TSP_GANG_HOST_MAX);
    snprintf(buf, sizeof buf, "JOIN %d %d %s", node_rank, try_no, task_host);
    tsp_rdv_call_t *c = NULL;
    int rc = tsp_rdv_call_line(host, port, secret_hex, buf, timeout_ms, &c, err, errlen);
    if (!rc)
        rc = tsp_rdv_call_wait(c, -1, buf, sizeof buf, err, errlen);
    tsp_rdv_call_free(c);
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
