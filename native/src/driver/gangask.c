/* gangask.c: how many executors a gang launch asks Spark for (docs/protocol.md 2.2), from
 * Spark's settings as the conf holds them: the one rule both glues perform through
 * SparkContext.requestTotalExecutors (golden cases: tests/contracts/gang_ask.json). */
#include "torchspark/gang.h"

#include "util.h"

#include <errno.h>
#include <string.h>

/* A conf value as a whole number >= 0 (spaces around it ignored), or def where it is unset,
 * empty or not one. */
static int conf_int(const char *s, int def)
{
    char buf[32];
    int v = 0;
    if (!s)
        return def;
    s += strspn(s, " \t");
    size_t n = strcspn(s, " \t");
    if (n == 0 || n >= sizeof buf || s[n + strspn(s + n, " \t")] != '\0')
        return def;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return tsp__parse_int(buf, &v) == 0 ? v : def;
}

int tsp_gang_ask(int num_tasks, const char *executor_cores, const char *task_cpus,
                 const char *max_executors, int have)
{
    if (num_tasks < 1 || num_tasks > TSP_GANG_MAX_NODES)
        return -EINVAL;
    int cpus = conf_int(task_cpus, 1);
    int per = conf_int(executor_cores, 0) / (cpus > 0 ? cpus : 1);
    per = per > 0 ? per : 1; /* unset, or fewer cores than a task needs: one task each */
    int need = (num_tasks + per - 1) / per;
    int cap = conf_int(max_executors, -1);
    if (cap >= 0 && need > cap)
        need = cap;
    return have > need ? have : need;
}
